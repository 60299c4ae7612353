# SPDX-License-Identifier: MIT
"""test_metrics.py - `tollgate serve --metrics-port`: the Prometheus text
endpoint read with python's http.client (what a scraper does), TG.POLICY
over a real connection, and the limiters' counters in INFO.

usage: run_python.sh test_metrics.py PATH/TO/tollgate
"""
import http.client
import os
import re
import socket
import sys
import time
import unittest

import redis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Server  # noqa: E402

TOLLGATE = None


def metrics_port(srv):
    m = re.search(r"metrics on http://\S+:(\d+)/metrics", srv.banner)
    assert m, srv.banner
    return int(m.group(1))


def get(port, path, method="GET"):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request(method, path)
    r = c.getresponse()
    body = r.read().decode()
    c.close()
    return r.status, r.getheader("Content-Type"), body


def read_to_close(sock):
    """Everything the server sends until it closes the connection."""
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk


def sample(text, name, alg):
    m = re.search(r'^%s\{algorithm="%s"\} (\d+)$' % (name, alg), text, re.M)
    return int(m.group(1)) if m else None


class Metrics(unittest.TestCase):
    def test_counters_over_http(self):
        with Server(TOLLGATE, "--metrics-port", "0") as srv:
            port = metrics_port(srv)
            r = redis.Redis(port=srv.port, socket_timeout=30)
            for _ in range(3):
                r.execute_command("TG.HIT", "k", "fixed_window", 2, 60000)
            status, ctype, body = get(port, "/metrics")
            self.assertEqual(status, 200)
            self.assertTrue(ctype.startswith("text/plain; version=0.0.4"))
            self.assertIn("# TYPE tollgate_allowed_total counter", body)
            self.assertEqual(sample(body, "tollgate_allowed_total",
                                    "fixed_window"), 2)
            self.assertEqual(sample(body, "tollgate_denied_total",
                                    "fixed_window"), 1)
            self.assertEqual(sample(body, "tollgate_keys", "fixed_window"), 1)
            # every sample line is "name{labels} value" or "name value"
            for line in body.splitlines():
                if not line.startswith("#"):
                    self.assertRegex(line, r'^[a-z_]+(\{[^}]*\})? \d+$')
            status, _, body = get(port, "/metrics", "HEAD")
            self.assertEqual((status, body), (200, ""))
            self.assertEqual(get(port, "/")[0], 404)
            self.assertEqual(get(port, "/metrics", "POST")[0], 405)
            # INFO has the same counters
            info = r.info("stats")
            self.assertEqual(info["limiter_fixed_window_allowed"], 2)
            self.assertEqual(info["limiter_fixed_window_denied"], 1)
            r.close()

    def test_refusals_are_http(self):
        # a 405 names the methods allowed (RFC 9110 requires Allow)
        with Server(TOLLGATE, "--metrics-port", "0",
                    "--max-clients", "1") as srv:
            port = metrics_port(srv)
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            c.request("POST", "/metrics")
            r = c.getresponse()
            r.read()
            c.close()
            self.assertEqual(r.status, 405)
            self.assertEqual(r.getheader("Allow"), "GET, HEAD")
            # what is not a request line is 400, whatever it starts with;
            # a request line with another method 405
            for raw, want in ((b"\r\n\r\n", b"400"),
                              (b"GET\r\n\r\n", b"400"),
                              (b"GET /metrics\r\n\r\n", b"400"),
                              (b"GET /metrics HTTP/2\r\n\r\n", b"400"),
                              (b"GET  /metrics HTTP/1.1\r\n\r\n", b"400"),
                              (b"BREW /metrics HTTP/1.1\r\n\r\n", b"405"),
                              # a NUL in the head: answered at once (its
                              # end was once sought as a C string, and the
                              # request timed out unanswered)
                              (b"GET /metrics HTTP/1.1\r\nX: \x00\r\n\r\n",
                               b"400"),
                              (b"GET /metrics HTTP/1.0\r\n\r\n", b"200")):
                s = socket.create_connection(("127.0.0.1", port), timeout=30)
                s.sendall(raw)
                data = read_to_close(s)
                s.close()
                self.assertTrue(data.startswith(b"HTTP/1.1 " + want + b" "),
                                (raw, data[:40]))
            # a scrape turned away by --max-clients is told so in HTTP
            r1 = redis.Redis(port=srv.port, socket_timeout=30)
            self.assertTrue(r1.ping())  # the one client allowed
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            data = read_to_close(s)
            s.close()
            self.assertTrue(data.startswith(
                b"HTTP/1.1 503 Service Unavailable\r\n"), data)
            self.assertIn(b"Content-Length: 0\r\n", data)
            r1.close()

    def test_slow_scraper_does_not_stall_clients(self):
        with Server(TOLLGATE, "--metrics-port", "0") as srv:
            slow = socket.create_connection(("127.0.0.1", metrics_port(srv)))
            slow.sendall(b"GET /metr")  # and nothing more
            r = redis.Redis(port=srv.port, socket_timeout=5)
            t = time.monotonic()
            self.assertEqual(r.execute_command(
                "TG.HIT", "k", "token_bucket", 5, 1000)[0], 1)
            self.assertLess(time.monotonic() - t, 5)
            slow.sendall(b"ics HTTP/1.1\r\nHost: x\r\n\r\n")
            data = read_to_close(slow)
            self.assertTrue(data.startswith(b"HTTP/1.1 200 OK\r\n"))
            slow.close()
            r.close()

    def test_policy(self):
        with Server(TOLLGATE) as srv:
            r = redis.Redis(port=srv.port, socket_timeout=30)
            admitted = 0
            for _ in range(8):
                v = r.execute_command("TG.POLICY", "u", "token_bucket", 5,
                                      1000, "m", "fixed_window", 6, 60000)
                self.assertEqual(len(v), 7)
                admitted += v[0]
                if not v[0]:
                    self.assertIn(v[6], (0, 1))
                else:
                    self.assertEqual(v[6], -1)
            self.assertEqual(admitted, 5)  # the bucket's burst
            # the minute was charged only for the five
            self.assertEqual(r.execute_command(
                "TG.GET", "m", "fixed_window", 6, 60000), 5)
            with self.assertRaises(redis.ResponseError):
                r.execute_command("TG.POLICY", "u", "token_bucket", 5)
            # the most rules a policy takes (TG_RULES_MAX), each with its
            # options: 129 arguments in one request
            args = []
            for i in range(16):
                args += ["x%d" % i, "token_bucket", 10, 1000,
                         "BURST", 10, "COST", 1]
            v = r.execute_command("TG.POLICY", *args)
            self.assertEqual(v[0], 1)
            self.assertEqual(v[6], -1)
            # 17 rules (69 arguments, within a request's bound): refused by
            # the rule count, the connection kept
            plain = []
            for i in range(17):
                plain += ["p%d" % i, "token_bucket", 10, 1000]
            with self.assertRaises(redis.ResponseError):
                r.execute_command("TG.POLICY", *plain)
            self.assertEqual(r.execute_command("PING"), True)
            r.close()


if __name__ == "__main__":
    TOLLGATE = sys.argv.pop(1)
    unittest.main(verbosity=2)
