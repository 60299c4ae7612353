# SPDX-License-Identifier: MIT
"""test_hostile.py - `tollgate serve` against hostile and broken clients,
over raw sockets: oversized requests, garbage framing, a slow loris, a
client that pipelines without reading, idle connections, half-closes,
requests arriving byte by byte. A malformed request gets an error reply and
the connection lives on; a hostile one gets an error and the connection is
closed; and after each, another client is still served.

No assertion is about speed. Where the server must act by itself (closing a
slow loris or an idle connection), the test waits for it with a generous
deadline (60 s) that only a server that never acts would miss.

usage: run_python.sh test_hostile.py PATH/TO/tollgate
"""
import os
import signal
import socket
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Server, read_to_eof, recv_until  # noqa: E402

TOLLGATE = None
srv = None


def setUpModule():
    global srv
    srv = Server(TOLLGATE)


def tearDownModule():
    srv.stop()


def info(server):
    """INFO's fields as a dict."""
    s = server.connect()
    s.sendall(b"INFO\r\n")

    def whole(d):  # "$N\r\n" + N bytes + "\r\n"
        if b"\r\n" not in d:
            return False
        head = d.index(b"\r\n") + 2
        return len(d) >= head + int(d[1:head - 2]) + 2

    data = recv_until(s, whole)
    s.close()
    fields = {}
    for line in data.decode().split("\r\n"):
        if ":" in line:
            k, v = line.split(":", 1)
            fields[k] = v
    return fields


def healthy(tc, server):
    """Another client is still served."""
    s = server.connect()
    s.sendall(b"*1\r\n$4\r\nPING\r\n")
    tc.assertEqual(recv_until(s, lambda d: b"\r\n" in d), b"+PONG\r\n")
    s.close()


class Hostile(unittest.TestCase):
    def healthy(self):
        healthy(self, srv)

    def closed_with(self, payload, error):
        """Sends payload; expects `error` then the server closing."""
        s = srv.connect()
        s.sendall(payload)
        data = read_to_eof(s)
        s.close()
        self.assertTrue(data.startswith(b"-ERR Protocol error: " + error),
                        data[:200])
        self.healthy()

    def test_a_malformed_request_keeps_the_connection(self):
        s = srv.connect()
        s.sendall(b"TG.HIT k nope 1 1000\r\nTG.HIT k fixed_window x 1\r\n"
                  b"BOGUS\r\nPING\r\n")
        data = recv_until(s, lambda d: d.endswith(b"+PONG\r\n"))
        self.assertEqual(data.count(b"-ERR "), 3)
        self.assertTrue(data.endswith(b"+PONG\r\n"))
        s.close()

    def test_an_oversized_argument_is_refused_at_its_header(self):
        # a gigabyte announced: refused before any of it is sent
        self.closed_with(b"*1\r\n$1000000000\r\n", b"argument too long")

    def test_too_many_arguments(self):
        self.closed_with(b"*1000000\r\n", b"too many arguments")

    def test_a_request_over_the_size_limit(self):
        # three arguments of the largest size, then the header of a fourth
        # that would take the request past 64 KiB: refused at that header
        arg = b"$16384\r\n" + b"x" * 16384 + b"\r\n"
        self.closed_with(b"*64\r\n" + arg * 3 + b"$16384\r\n",
                         b"request too long")

    def test_an_endless_inline_line(self):
        s = srv.connect()
        try:
            s.sendall(b"a" * 200000)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server closed before taking it all: fine
        data = read_to_eof(s)
        s.close()
        if data:  # the reply may be lost to a reset; the close may not
            self.assertTrue(data.startswith(
                b"-ERR Protocol error: too big inline request"), data[:100])
        self.healthy()

    def test_garbage_framing(self):
        for payload, error in [
                (b"*x\r\n", b"invalid multibulk length"),
                (b"*1\r\n+PING\r\n", b"expected '$'"),
                (b"*1\r\n$-1\r\n", b"invalid bulk length"),
                (b"*1\r\n$4\r\nPINGPONG\r\n", b"bulk not followed by CRLF"),
                (b"*1" + b"1" * 40, b"invalid multibulk length"),
                # bare LF framing: answered at once, not after the request
                # timeout (the old behaviour: close without a word)
                (b"*1\n$4\nPING\n", b"header line ends in LF without CR"),
                (b"*1\r\n$4\nPING\r\n",
                 b"header line ends in LF without CR"),
                (b"*1\r\n$4\r\nPING\n", b"bulk not followed by CRLF"),
                (b"*2\r\n$4\r\nECHO\r\n$1x", b"invalid bulk length")]:
            with self.subTest(payload=payload):
                self.closed_with(payload, error)

    def test_replies_before_the_garbage_are_kept(self):
        s = srv.connect()
        s.sendall(b"PING\r\n*1\r\n:1\r\n")
        data = read_to_eof(s)
        self.assertTrue(data.startswith(b"+PONG\r\n-ERR Protocol error"), data)
        s.close()

    def test_byte_by_byte(self):
        s = srv.connect()
        req = (b"*5\r\n$6\r\nTG.HIT\r\n$3\r\nbbb\r\n$14\r\nsliding_window\r\n"
               b"$1\r\n1\r\n$7\r\n3600000\r\nPING\r\n")
        for i in range(len(req)):
            s.sendall(req[i:i + 1])
        data = recv_until(s, lambda d: d.endswith(b"+PONG\r\n"))
        self.assertTrue(data.startswith(b"*6\r\n:1\r\n:1\r\n:0\r\n:0\r\n"),
                        data)
        s.close()

    def test_quit_answers_then_closes(self):
        s = srv.connect()
        s.sendall(b"PING\r\nQUIT\r\nPING\r\n")
        self.assertEqual(read_to_eof(s), b"+PONG\r\n+OK\r\n")
        s.close()

    def test_a_half_closed_client_still_gets_its_replies(self):
        s = srv.connect()
        s.sendall(b"PING\r\nECHO bye\r\n")
        s.shutdown(socket.SHUT_WR)
        self.assertEqual(read_to_eof(s), b"+PONG\r\n$3\r\nbye\r\n")
        s.close()

    def test_pipelining_without_reading_is_bounded(self):
        # 300000 requests (4.2 MB) sent without reading a reply: the server
        # stops reading once its replies back up, so the sender blocks;
        # meanwhile others are served and the buffers stay bounded; then
        # every reply arrives, in order
        n = 300000
        s = srv.connect(timeout=120)
        errors = []

        def send():
            try:
                s.sendall(b"*1\r\n$4\r\nPING\r\n" * n)
            except Exception as e:  # asserted after join
                errors.append(repr(e))

        t = threading.Thread(target=send)
        t.start()
        time.sleep(1.5)  # the sender is blocked by now; a sweep has run
        self.healthy()
        self.assertLess(int(info(srv)["client_buffer_bytes"]), 1 << 20)
        got = recv_until(s, lambda d: len(d) >= 7 * n)
        t.join(120)
        self.assertEqual(errors, [])
        self.assertEqual(len(got), 7 * n)
        self.assertEqual(got, b"+PONG\r\n" * n)
        s.close()


class Timeouts(unittest.TestCase):
    def test_a_slow_loris_is_cut_off(self):
        # an incomplete request trickling in a byte every 100 ms keeps the
        # connection active, so only the request deadline can end it
        with Server(TOLLGATE, "--request-timeout-ms", "1000",
                    "--idle-timeout-ms", "0") as server:
            s = server.connect()
            partial = b"*3\r\n$6\r\nTG.HIT\r\n$10000\r\n" + b"x" * 9000
            closed = False
            deadline = time.monotonic() + 60
            i = 0
            while time.monotonic() < deadline:
                try:
                    s.sendall(partial[i % len(partial):][:1])
                    i += 1
                    s.settimeout(0.1)
                    if s.recv(100) == b"":
                        closed = True
                        break
                except socket.timeout:
                    pass
                except (BrokenPipeError, ConnectionResetError):
                    closed = True
                    break
                healthy(self, server)
            self.assertTrue(closed, "the slow loris was never cut off")
            self.assertGreaterEqual(int(info(server)["dropped_connections"]),
                                    1)
            healthy(self, server)
            s.close()

    def test_an_idle_connection_is_closed(self):
        with Server(TOLLGATE, "--idle-timeout-ms", "500") as server:
            s = server.connect(timeout=60)
            s.sendall(b"PING\r\n")
            self.assertEqual(recv_until(s, lambda d: b"\r\n" in d),
                             b"+PONG\r\n")
            self.assertEqual(read_to_eof(s), b"")  # closed, within 60 s
            s.close()

    def test_sigterm_lets_a_client_finish(self):
        server = Server(TOLLGATE)
        s = server.connect()
        s.sendall(b"PING\r\n")
        self.assertEqual(recv_until(s, lambda d: b"\r\n" in d), b"+PONG\r\n")
        self.assertEqual(server.stop(), 0)
        self.assertEqual(read_to_eof(s), b"")
        s.close()

    def test_sigterm_amid_busy_clients(self):
        # the signal arrives between requests of 400 clients, so loop turns
        # see both: the server must still stop cleanly (exit status 0; under
        # ASan, no use of a connection it has already closed)
        server = Server(TOLLGATE)
        socks = [server.connect() for _ in range(400)]
        for i, s in enumerate(socks):
            if i == 200:
                server.proc.send_signal(signal.SIGTERM)
            try:
                s.sendall(b"PING\r\n")
            except OSError:
                pass  # already closed by the shutdown: fine
        self.assertEqual(server.stop(), 0)
        for s in socks:
            data = read_to_eof(s)  # a reply or none, then the close
            self.assertIn(data, (b"", b"+PONG\r\n"))
            s.close()

    def test_sigterm_repeated_during_shutdown(self):
        # a supervisor that repeats SIGTERM until the process is gone: the
        # repeats that land while the server winds down must not turn its
        # clean stop into death by signal (status -15)
        server = Server(TOLLGATE)
        socks = [server.connect() for _ in range(50)]
        server.proc.send_signal(signal.SIGTERM)
        while server.proc.poll() is None:
            try:
                server.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                break
            time.sleep(0.0002)
        self.assertEqual(server.stop(), 0)
        for s in socks:
            s.close()

if __name__ == "__main__":
    TOLLGATE = sys.argv.pop(1)
    unittest.main(verbosity=2)
