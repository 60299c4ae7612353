# SPDX-License-Identifier: MIT
"""test_python_client.py - `tollgate serve` from a client library nobody
here wrote: Debian's python3-redis. Correct decisions for every algorithm,
pipelining, concurrent clients, errors as exceptions, INFO, the unix
socket, thousands of connections at once and the connection limit.

usage: run_python.sh test_python_client.py PATH/TO/tollgate
"""
import os
import sys
import threading
import unittest

import redis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Server, raise_fd_limit, recv_until  # noqa: E402

TOLLGATE = None
HOUR = 3600000
# fixed windows are aligned to the epoch: 10^12 ms ones end in 2033, so no
# window ends during the test
LONG = 1000000000000
srv = None


def setUpModule():
    global srv
    srv = Server(TOLLGATE, "--unix", "/tmp/tg-pytest-%d.sock" % os.getpid())


def tearDownModule():
    srv.stop()


def client(**kw):
    return redis.Redis(port=srv.port, socket_timeout=30, **kw)


class Decisions(unittest.TestCase):
    def test_every_algorithm_admits_its_limit(self):
        r = client()
        # (algorithm, period, count after each of 7 hits of cost 1)
        cases = [
            ("fixed_window", LONG, [1, 2, 3, 4, 5, 6, 7]),
            ("fixed_window_per_key", HOUR, [1, 2, 3, 4, 5, 6, 7]),
            ("sliding_window", HOUR, [1, 2, 3, 4, 5, 5, 5]),
            ("token_bucket", HOUR, [4, 3, 2, 1, 0, 0, 0]),
            ("leaky_bucket", HOUR, [1, 2, 3, 4, 5, 5, 5]),
        ]
        for alg, period, counts in cases:
            with self.subTest(alg=alg):
                for i, want_count in enumerate(counts):
                    allowed, count, remaining, retry, reset, degraded = \
                        r.execute_command("TG.HIT", "py:" + alg, alg, 5,
                                          period)
                    self.assertEqual(allowed, 1 if i < 5 else 0)
                    self.assertEqual(count, want_count)
                    self.assertEqual(remaining, max(0, 4 - i))
                    self.assertEqual(degraded, 0)
                    if i < 5:
                        self.assertEqual(retry, 0)
                    else:
                        self.assertGreater(retry, 0)
                        self.assertLessEqual(retry, period)
                    self.assertGreater(reset, 0)

    def test_cost_burst_and_peek(self):
        r = client()
        res = r.execute_command("TG.HIT", "py:cost", "token_bucket", 1, HOUR,
                                "BURST", 10, "COST", 4)
        self.assertEqual(res[:4], [1, 6, 6, 0])
        peek = r.execute_command("TG.HIT", "py:cost", "token_bucket", 1, HOUR,
                                 "BURST", 10, "COST", 0)
        self.assertEqual(peek[:3], [1, 6, 6])
        never = r.execute_command("TG.HIT", "py:cost", "token_bucket", 1,
                                  HOUR, "BURST", 10, "COST", 11)
        self.assertEqual(never[0], 0)
        self.assertEqual(never[3], -1)  # can never pass

    def test_other_operations(self):
        r = client()
        self.assertEqual(r.execute_command("TG.INC", "py:op", "fixed_window",
                                           10, LONG, "COST", 3), 3)
        self.assertEqual(r.execute_command("TG.SET", "py:op", "fixed_window",
                                           10, LONG, 8), b"OK")
        self.assertEqual(r.execute_command("TG.GET", "py:op", "fixed_window",
                                           10, LONG), 8)
        at = r.execute_command("TG.EXPIRESAT", "py:op", "fixed_window", 10,
                               LONG)
        self.assertEqual(at, 2 * LONG)  # the end of the current window
        self.assertEqual(r.execute_command("TG.RESET", "py:op"), b"OK")
        self.assertEqual(r.execute_command("TG.GET", "py:op", "fixed_window",
                                           10, LONG), 0)

    def test_errors_are_response_errors(self):
        r = client()
        with self.assertRaisesRegex(redis.ResponseError, "^TG_EQUOTA "):
            r.execute_command("TG.HIT", "k", "fixed_window", 0, 1000)
        with self.assertRaisesRegex(redis.ResponseError, "^TG_ERANGE "):
            r.execute_command("TG.SET", "k", "token_bucket", 5, 1000, 6)
        with self.assertRaisesRegex(redis.ResponseError,
                                    "unknown algorithm 'gcra'"):
            r.execute_command("TG.HIT", "k", "gcra", 5, 1000)
        with self.assertRaisesRegex(redis.ResponseError, "unknown command"):
            r.get("k")
        self.assertTrue(r.ping())  # the connection is still good

    def test_binary_keys(self):
        r = client()
        key = b"\x00\r\n\xff key"
        self.assertEqual(r.execute_command("TG.HIT", key, "sliding_window",
                                           1, HOUR)[0], 1)
        self.assertEqual(r.execute_command("TG.HIT", key, "sliding_window",
                                           1, HOUR)[0], 0)
        self.assertEqual(r.execute_command("TG.HIT", key[:-1],
                                           "sliding_window", 1, HOUR)[0], 1)


class Pipelining(unittest.TestCase):
    def test_a_pipeline_of_1000_hits(self):
        r = client()
        p = r.pipeline(transaction=False)
        for _ in range(1000):
            p.execute_command("TG.HIT", "py:pipe", "sliding_window", 600, HOUR)
        res = p.execute()
        self.assertEqual(len(res), 1000)
        self.assertEqual([x[0] for x in res], [1] * 600 + [0] * 400)
        self.assertEqual([x[1] for x in res[:600]], list(range(1, 601)))

    def test_concurrent_clients_share_one_limit(self):
        # 8 threads, each with its own connection, 250 hits each on a bucket
        # of 1000 tokens that refills one an hour: exactly 1000 admitted
        results = [None] * 8
        errors = []

        def worker(i):
            try:
                r = client()
                p = r.pipeline(transaction=False)
                for _ in range(250):
                    p.execute_command("TG.HIT", "py:conc", "token_bucket", 1,
                                      HOUR, "BURST", 1000)
                results[i] = [x[0] for x in p.execute()]
            except Exception as e:  # recorded, asserted after join
                errors.append(repr(e))

        threads = [threading.Thread(target=worker, args=(i,))
                   for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        self.assertEqual(errors, [])
        self.assertEqual(sum(sum(x) for x in results), 1000)


class Server_(unittest.TestCase):
    def test_info_and_dbsize(self):
        r = client()
        r.execute_command("TG.HIT", "py:info", "fixed_window", 1, LONG)
        r.execute_command("TG.HIT", "py:info", "fixed_window", 1, LONG)
        info = r.info()
        self.assertGreaterEqual(info["decisions_allowed"], 1)
        self.assertGreaterEqual(info["decisions_denied"], 1)
        self.assertEqual(info["decisions_degraded"], 0)
        self.assertGreaterEqual(info["keys"], 1)
        self.assertGreater(info["store_bytes"], 0)
        self.assertGreaterEqual(info["connected_clients"], 1)
        self.assertEqual(info["tcp_port"], srv.port)
        self.assertGreaterEqual(r.dbsize(), 1)
        self.assertEqual(r.echo("hi"), b"hi")

    def test_unix_socket(self):
        r = redis.Redis(unix_socket_path="/tmp/tg-pytest-%d.sock"
                        % os.getpid(), socket_timeout=30)
        self.assertTrue(r.ping())
        self.assertEqual(r.execute_command("TG.HIT", "py:unix",
                                           "leaky_bucket", 1, HOUR)[0], 1)

    def test_thousands_of_connections(self):
        n = min(2000, raise_fd_limit(2100) - 100)
        self.assertGreaterEqual(n, 1000, "the descriptor limit is too low")
        socks = []
        try:
            for _ in range(n):
                socks.append(srv.connect())
            for s in socks:
                s.sendall(b"PING\r\n")
            for s in socks:
                self.assertEqual(recv_until(s, lambda d: b"\r\n" in d),
                                 b"+PONG\r\n")
            self.assertGreaterEqual(client().info()["connected_clients"], n)
        finally:
            for s in socks:
                s.close()

    def test_the_connection_limit(self):
        with Server(TOLLGATE, "--max-clients", "3") as small:
            socks = [small.connect() for _ in range(3)]
            for s in socks:  # the three are served...
                s.sendall(b"PING\r\n")
                self.assertEqual(recv_until(s, lambda d: b"\r\n" in d),
                                 b"+PONG\r\n")
            extra = small.connect()  # ...the fourth is refused
            self.assertEqual(recv_until(extra, lambda d: False),
                             b"-ERR max number of clients reached\r\n")
            socks[0].close()
            extra.close()
            for s in socks[1:]:
                s.close()


if __name__ == "__main__":
    TOLLGATE = sys.argv.pop(1)
    unittest.main(verbosity=2)
