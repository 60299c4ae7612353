# SPDX-License-Identifier: MIT
"""test_store_health.py - `tollgate serve` when its store stops answering.

The server is one thread. A store that does not answer must delay the
clients whose requests do not need it by no more than a bounded wait, and
the clients whose requests do need it must get the failure policy's answer
at once rather than one timeout each:

  - --shm: a process stopped while holding a segment's table lock
    (shm_holder). Requests for new keys of that algorithm need the lock: the
    first waits --lock-timeout-ms, the rest fail fast for --backoff-ms (the
    server counts the waits: INFO store_lock_waits). Another client, on keys
    that exist and on another algorithm, goes on being answered, exactly.
  - --redis: a SIGSTOPped redis-server (the kernel still accepts
    connections; nothing answers). The first request waits
    --redis-timeout-ms, the rest fail fast; the commands that reached the
    stopped server are counted by Redis itself once it resumes (INFO
    commandstats). A client sending PING goes on being answered.
  - start-up: with --redis pointing at a server that refuses the password or
    does not answer, --require-store refuses to start (never printing
    "ready") and says why; without it the server starts, saying it is
    degraded. Every change of health is logged on stderr, once.

Nothing here asserts a speed: the latencies are printed for the record. The
waits counted are what the assertions are about. Where the server must act
by itself (recover once the store is back), the test waits with a generous
deadline that only a server that never acts would miss.

usage: with_redis.sh run_python.sh test_store_health.py TOLLGATE SHM_HOLDER
(the Redis cases need tests/redis/with_redis.sh's environment)
"""
import http.client
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Server, recv_until  # noqa: E402

TOLLGATE = None
HOLDER = None
HOUR = 3600000


def request(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


def replies(data):
    """Splits a stream of RESP2 replies (no nesting below one array of
    integers) into a list of values: ints, strings, lists, or Exception for
    an error. Returns (values, rest)."""
    vals = []
    while True:
        v, n = _one(data)
        if n == 0:
            return vals, data
        vals.append(v)
        data = data[n:]


def _one(d):
    if b"\r\n" not in d:
        return None, 0
    head, _, _ = d.partition(b"\r\n")
    used = len(head) + 2
    t, body = head[:1], head[1:]
    if t == b"+":
        return body.decode(), used
    if t == b"-":
        return Exception(body.decode()), used
    if t == b":":
        return int(body), used
    if t == b"$":
        n = int(body)
        if n < 0:
            return None, used
        if len(d) < used + n + 2:
            return None, 0
        return d[used:used + n], used + n + 2
    if t == b"*":
        items = []
        for _ in range(int(body)):
            v, k = _one(d[used:])
            if k == 0:
                return None, 0
            items.append(v)
            used += k
        return items, used
    raise AssertionError("not RESP: %r" % d[:50])


def call(sock, *args):
    sock.sendall(request(*args))
    data = b""
    while True:
        vals, _ = replies(data)
        if vals:
            return vals[0]
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError("closed")
        data += chunk


def info(server):
    s = server.connect()
    text = call(s, "INFO").decode()
    s.close()
    return dict(line.split(":", 1) for line in text.split("\r\n")
                if ":" in line)


def pipeline(server, reqs):
    """Sends reqs at once on a new connection; returns (replies, seconds)."""
    s = server.connect(timeout=120)
    t0 = time.monotonic()
    s.sendall(b"".join(reqs))
    data = b""
    while True:
        vals, _ = replies(data)
        if len(vals) >= len(reqs):
            break
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    took = time.monotonic() - t0
    s.close()
    return vals, took


class Prober(threading.Thread):
    """Another client asking `args` over and over, timing each answer."""

    def __init__(self, server, *args):
        super().__init__()
        self.sock = server.connect(timeout=120)
        self.args = args
        self.stop = threading.Event()
        self.latencies = []
        self.answers = []
        self.error = None

    def run(self):
        try:
            while not self.stop.is_set():
                t0 = time.monotonic()
                v = call(self.sock, *self.args)
                self.latencies.append(time.monotonic() - t0)
                self.answers.append(v)
        except Exception as e:  # asserted after join
            self.error = repr(e)
        finally:
            self.sock.close()

    def finish(self):
        self.stop.set()
        self.join(120)

    def summary(self):
        lat = sorted(self.latencies)
        return "%d answers, median %.2f ms, max %.2f ms" % (
            len(lat), 1000 * statistics.median(lat), 1000 * lat[-1])


def wait_for(pred, what, deadline_s=60):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError("gave up waiting for " + what)


def log_lines(server, word):
    return [line for line in server.stderr().splitlines() if word in line]


class StuckShmLock(unittest.TestCase):
    def setUp(self):
        self.name = "/tg-stall-%d" % os.getpid()
        self.holder = None

    def tearDown(self):
        if self.holder and self.holder.poll() is None:
            self.holder.send_signal(signal.SIGCONT)
            self.holder.kill()
            self.holder.wait()
        for alg in ("fixed_window", "fixed_window_per_key", "sliding_window",
                    "token_bucket", "leaky_bucket"):
            try:
                os.unlink("/dev/shm" + self.name + "." + alg)
            except FileNotFoundError:
                pass

    def test_other_clients_are_not_stalled(self):
        n = 200
        with Server(TOLLGATE, "--shm", self.name, "--capacity", "1024",
                    "--lock-timeout-ms", "50", "--backoff-ms", "600000",
                    "--metrics-port", "0") as srv:
            s = srv.connect()
            for alg in ("fixed_window", "sliding_window"):
                v = call(s, "TG.HIT", "old", alg, 1000000, HOUR)
                self.assertEqual(v[:4] + v[5:], [1, 1, 999999, 0, 0])
            s.close()
            self.holder = subprocess.Popen(
                [HOLDER, self.name + ".fixed_window", "fixed_window", "1024",
                 "1024"], stdout=subprocess.PIPE)
            self.assertEqual(self.holder.stdout.readline(), b"held\n")
            _, status = os.waitpid(self.holder.pid, os.WUNTRACED)
            self.assertTrue(os.WIFSTOPPED(status))

            # B: a key that exists (no lock needed), and another algorithm
            b = Prober(srv, "TG.HIT", "old", "fixed_window", 1000000, HOUR)
            c = Prober(srv, "TG.HIT", "new-elsewhere", "sliding_window",
                       1000000000, HOUR)
            b.start()
            c.start()
            # A: requests for new keys, each needing the stuck lock
            vals, took = pipeline(srv, [
                request("TG.HIT", "new:%d" % i, "fixed_window", 5, HOUR)
                for i in range(n)])
            time.sleep(0.2)
            b.finish()
            c.finish()
            print("\nshm, lock held by a stopped process: %d requests for "
                  "new keys answered in %.1f ms; meanwhile existing key: "
                  "%s; other algorithm: %s"
                  % (n, 1000 * took, b.summary(), c.summary()),
                  file=sys.stderr)
            self.assertIsNone(b.error)
            self.assertIsNone(c.error)
            # the failure policy (open) answered each, marked degraded
            self.assertEqual(len(vals), n)
            for v in vals:
                self.assertEqual(v, [1, 0, 0, 0, 0, 1])
            # and only the first waited for the lock
            fields = info(srv)
            self.assertEqual(fields["store_lock_waits"], "1")
            self.assertEqual(fields["store_last_error"], "TG_EBUSY")
            # the others were answered exactly, never degraded
            self.assertGreater(len(b.answers), 0)
            self.assertGreater(len(c.answers), 0)
            for i, v in enumerate(b.answers):
                self.assertEqual(v[:3], [1, i + 2, 1000000 - i - 2])
                self.assertEqual(v[5], 0)
            for v in c.answers:
                self.assertEqual(v[0], 1)
                self.assertEqual(v[5], 0)
            # the limiter's counters count every one of these decisions,
            # those answered while the lock was stuck (by the limiter that
            # does not wait) too, in INFO and in /metrics alike
            fields = info(srv)
            self.assertEqual(fields["limiter_fixed_window_allowed"],
                             str(1 + len(b.answers)))
            self.assertEqual(fields["limiter_fixed_window_degraded"], str(n))
            self.assertEqual(fields["limiter_fixed_window_errors"], str(n))
            self.assertEqual(fields["limiter_sliding_window_allowed"],
                             str(1 + len(c.answers)))
            m = re.search(r"metrics on http://\S+:(\d+)/metrics", srv.banner)
            conn = http.client.HTTPConnection("127.0.0.1", int(m.group(1)),
                                              timeout=30)
            conn.request("GET", "/metrics")
            text = conn.getresponse().read().decode()
            conn.close()
            fw = '{algorithm="fixed_window"'
            self.assertIn("tollgate_allowed_total%s} %d\n"
                          % (fw, 1 + len(b.answers)), text)
            self.assertIn("tollgate_degraded_total%s} %d\n" % (fw, n), text)
            self.assertIn('tollgate_errors_total%s,code="TG_EBUSY"} %d\n'
                          % (fw, n), text)

            # the process goes on and lets go: new keys are served again,
            # and the log says so, once each way
            self.holder.send_signal(signal.SIGCONT)
            self.assertEqual(self.holder.wait(60), 0)
            s = srv.connect()
            wait_for(lambda: call(s, "TG.HIT", "after", "fixed_window", 5,
                                  HOUR)[5] == 0, "new keys served again")
            # healthy again after a second without failures: it takes a
            # request to see it
            wait_for(lambda: call(s, "TG.HIT", "after", "fixed_window", 5,
                                  HOUR) and log_lines(srv, "healthy again"),
                     "the recovery logged")
            s.close()
            self.assertEqual(len(log_lines(srv, "degraded: TG_EBUSY")), 1)
            self.assertEqual(len(log_lines(srv, "healthy again")), 1)


def redis_env():
    port = os.environ.get("TG_TEST_REDIS_PORT")
    if not port:
        raise unittest.SkipTest("needs tests/redis/with_redis.sh")
    return int(port)


def redis_pid():
    with open(os.environ["TG_TEST_REDIS_PIDFILE"]) as f:
        return int(f.read())


def redis_cmd(port, *args):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    v = call(s, *args)
    s.close()
    return v


def start_fails(*options, env=None):
    """Runs tollgate serve expecting it not to start; returns (status,
    stdout, stderr)."""
    p = subprocess.run([TOLLGATE, "serve", "--port", "0", *options],
                       capture_output=True, timeout=120,
                       env=dict(os.environ, **(env or {})))
    return p.returncode, p.stdout.decode(), p.stderr.decode()


class StoppedRedis(unittest.TestCase):
    def setUp(self):
        self.port = redis_env()
        self.paused = False

    def tearDown(self):
        if self.paused:
            os.kill(redis_pid(), signal.SIGCONT)

    def pause(self):
        os.kill(redis_pid(), signal.SIGSTOP)
        self.paused = True

    def resume(self):
        os.kill(redis_pid(), signal.SIGCONT)
        self.paused = False
        # the commands left in its buffers run before a new client's
        for _ in range(2):
            wait_for(lambda: redis_cmd(self.port, "PING") == "PONG",
                     "redis to answer")
            time.sleep(0.05)

    def sent_to_redis(self):
        text = redis_cmd(self.port, "INFO", "commandstats").decode()
        n = 0
        for name in ("cmdstat_evalsha:", "cmdstat_script|load:"):
            for line in text.split("\r\n"):
                if line.startswith(name):
                    n += int(line.split("calls=")[1].split(",")[0])
        return n

    def test_ping_is_answered_while_redis_is_stopped(self):
        n = 200
        timeout_ms, backoff_ms = 200, 2000
        with Server(TOLLGATE, "--redis", "127.0.0.1:%d" % self.port,
                    "--redis-prefix", "stall%d" % os.getpid(),
                    "--redis-timeout-ms", str(timeout_ms),
                    "--backoff-ms", str(backoff_ms)) as srv:
            s = srv.connect()
            self.assertEqual(call(s, "TG.HIT", "k", "token_bucket", 5, HOUR),
                             [1, 4, 4, 0, HOUR // 5, 0])
            s.close()
            redis_cmd(self.port, "CONFIG", "RESETSTAT")
            self.pause()
            b = Prober(srv, "PING")
            b.start()
            t0 = time.monotonic()
            vals, took = pipeline(srv, [
                request("TG.HIT", "k%d" % i, "token_bucket", 5, HOUR)
                for i in range(n)])
            fields = info(srv)
            b.finish()
            spell = time.monotonic() - t0
            self.resume()
            sent = self.sent_to_redis()
            print("\nredis stopped: %d requests answered in %.1f ms, %d "
                  "reached redis; meanwhile PING: %s"
                  % (n, 1000 * took, sent, b.summary()), file=sys.stderr)
            self.assertIsNone(b.error)
            self.assertTrue(all(v == "PONG" for v in b.answers))
            self.assertGreater(len(b.answers), 0)
            self.assertEqual(len(vals), n)
            for v in vals:
                self.assertEqual(v, [1, 0, 0, 0, 0, 1])  # open, degraded
            self.assertEqual(fields["store_status"], "degraded")
            self.assertEqual(fields["store_last_error"], "TG_ETIMEDOUT")
            # one wait, and at most one more per backoff + timeout; a wait
            # is one round trip, which carries up to 64 pipelined hits
            # (the server sends what arrives together as one batch)
            self.assertGreaterEqual(sent, 1)
            self.assertLessEqual(
                sent,
                64 * (1 + int(1000 * spell) // (timeout_ms + backoff_ms)))
            # Redis answers again: so does the server, by itself
            s = srv.connect()
            wait_for(lambda: call(s, "TG.HIT", "k", "token_bucket", 5,
                                  HOUR)[5] == 0, "recovery")
            wait_for(lambda: call(s, "PING") and call(
                s, "TG.HIT", "k", "token_bucket", 5, HOUR) and log_lines(
                    srv, "healthy again"), "the recovery logged")
            s.close()
            self.assertEqual(len(log_lines(srv, "degraded: TG_ETIMEDOUT")), 1)
            self.assertEqual(len(log_lines(srv, "healthy again")), 1)

    def test_require_store_refuses_a_stopped_redis(self):
        self.pause()
        rc, out, err = start_fails("--redis", "127.0.0.1:%d" % self.port,
                                   "--redis-timeout-ms", "200",
                                   "--require-store")
        self.resume()
        self.assertEqual(rc, 1)
        self.assertNotIn("ready", out)
        self.assertIn("PING: no answer in time", err)
        self.assertIn("not starting (--require-store)", err)


class DrippingServer(unittest.TestCase):
    def test_require_store_check_is_bounded_by_the_timeout(self):
        # a "server" that answers PING a byte every 50 ms, 400 bytes in
        # all: the start-up check must give up after --redis-timeout-ms
        # (200) for the whole reply, not for each byte, so it closes the
        # connection after a few bytes (before, it read all 400, 20 s)
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(1)
        port = lsock.getsockname()[1]
        sent = [0]

        def drip():
            lsock.settimeout(20)
            try:
                c, _ = lsock.accept()
            except OSError:
                return
            with c:
                for _ in range(400):
                    try:
                        c.sendall(b"+")
                    except OSError:
                        return
                    sent[0] += 1
                    time.sleep(0.05)

        t = threading.Thread(target=drip)
        t.start()
        try:
            rc, out, err = start_fails("--redis", "127.0.0.1:%d" % port,
                                       "--redis-timeout-ms", "200",
                                       "--require-store")
        finally:
            t.join()
            lsock.close()
        self.assertEqual(rc, 1)
        self.assertIn("PING: no answer in time", err)
        self.assertLess(sent[0], 100, err)


class RedisStartup(unittest.TestCase):
    def setUp(self):
        self.port = redis_env()
        redis_cmd(self.port, "CONFIG", "SET", "requirepass", "s3cret")

    def tearDown(self):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        call(s, "AUTH", "s3cret")
        call(s, "CONFIG", "SET", "requirepass", "")
        s.close()

    def test_a_wrong_password_is_named_and_fatal_when_required(self):
        addr = "127.0.0.1:%d" % self.port
        for env, words in ((None, "PING: NOAUTH Authentication required"),
                           ({"TOLLGATE_REDIS_PASSWORD": "nope"},
                            "AUTH: WRONGPASS invalid username-password")):
            with self.subTest(env=env):
                rc, out, err = start_fails("--redis", addr, "--require-store",
                                           env=env)
                self.assertEqual(rc, 1)
                self.assertNotIn("ready", out)
                self.assertIn(words, err)
                self.assertNotIn("nope", err)  # the password is never shown

    def test_without_require_store_it_starts_degraded_and_says_so(self):
        env = os.environ.get("TOLLGATE_REDIS_PASSWORD")
        os.environ["TOLLGATE_REDIS_PASSWORD"] = "nope"
        try:
            srv = Server(TOLLGATE, "--redis", "127.0.0.1:%d" % self.port,
                         "--backoff-ms", "100")
        finally:
            if env is None:
                del os.environ["TOLLGATE_REDIS_PASSWORD"]
            else:
                os.environ["TOLLGATE_REDIS_PASSWORD"] = env
        with srv:
            err = srv.stderr()
            self.assertIn("AUTH: WRONGPASS", err)
            self.assertIn("starting degraded", err)
            s = srv.connect()
            self.assertEqual(call(s, "TG.HIT", "k", "fixed_window", 1, HOUR),
                             [1, 0, 0, 0, 0, 1])
            s.close()
            self.assertEqual(info(srv)["store_status"], "degraded")
            # no line per request: the start-up said it, nothing changed
            time.sleep(1.2)
            self.assertEqual(len(log_lines(srv, "degraded: TG_")), 0)

    def test_the_right_password_starts_healthy(self):
        os.environ["TOLLGATE_REDIS_PASSWORD"] = "s3cret"
        try:
            srv = Server(TOLLGATE, "--redis", "127.0.0.1:%d" % self.port,
                         "--require-store")
        finally:
            del os.environ["TOLLGATE_REDIS_PASSWORD"]
        with srv:
            self.assertEqual(srv.stderr(), "")
            self.assertEqual(info(srv)["store_status"], "ok")


if __name__ == "__main__":
    TOLLGATE = sys.argv.pop(1)
    HOLDER = sys.argv.pop(1)
    unittest.main(verbosity=2)
