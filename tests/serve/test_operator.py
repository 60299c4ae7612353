# SPDX-License-Identifier: MIT
"""test_operator.py - what an operator configures on `tollgate serve`, as a
client sees it: the unix socket (a live one is never taken over, a stale one
is replaced, its mode is the one asked for whatever the umask, only the
server's own is removed), --bind (names resolve, an exposed address warns),
a password (python3-redis with and without it, the environment variable, the
command line blotted out), --max-period-ms, the new-key budget per client
(TCP by address, unix socket by uid), --sliding-max-entries and --on-full.

usage: run_python.sh test_operator.py PATH/TO/tollgate
"""
import os
import socket
import stat
import subprocess
import sys
import tempfile
import time
import unittest

import redis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Server  # noqa: E402

TOLLGATE = None
HOUR = 3600000


def run(*options, env=None, timeout=60):
    """Runs `tollgate serve OPTIONS` expecting it to stop by itself."""
    return subprocess.run([TOLLGATE, "serve", *options], capture_output=True,
                          timeout=timeout, env=env)


def with_umask(mask):
    """A preexec_fn for Popen: the child starts with this umask."""
    return lambda: os.umask(mask)


def remove_if_there(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def stale_socket(path):
    """A socket file nobody listens on: what a server that died leaves."""
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.close()


class UnixSocket(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tg-unix-")
        self.path = os.path.join(self.dir, "tg.sock")

    def tearDown(self):
        for name in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, name))
        os.rmdir(self.dir)

    def ping(self, path=None):
        r = redis.Redis(unix_socket_path=path or self.path, socket_timeout=30)
        try:
            return r.ping()
        finally:
            r.close()

    def test_a_live_socket_is_never_taken_over(self):
        with Server(TOLLGATE, "--unix", self.path) as first:
            p = run("--port", "0", "--unix", self.path)
            self.assertEqual(p.returncode, 1)
            self.assertNotIn(b"ready", p.stdout)
            self.assertIn(b"address in use (a server answers there)",
                          p.stderr)
            # the first still has its socket, and answers on it
            self.assertTrue(self.ping())
            r = redis.Redis(port=first.port, socket_timeout=30)
            self.assertEqual(r.info("server")["unix_socket"], self.path)
            r.close()
        self.assertFalse(os.path.exists(self.path))  # removed on exit

    def test_a_stale_socket_is_replaced(self):
        stale_socket(self.path)
        with Server(TOLLGATE, "--unix", self.path):
            self.assertTrue(self.ping())

    def test_a_file_that_is_not_a_socket_is_left_alone(self):
        with open(self.path, "w") as f:
            f.write("precious")
        p = run("--port", "0", "--unix", self.path)
        self.assertEqual(p.returncode, 1)
        self.assertIn(b"exists and is not a socket", p.stderr)
        with open(self.path) as f:
            self.assertEqual(f.read(), "precious")

    def test_mode_is_the_one_asked_for_whatever_the_umask(self):
        for umask, option, mode in ((0o000, (), 0o600), (0o077, (), 0o600),
                                    (0o000, ("--unix-mode", "0660"), 0o660),
                                    (0o077, ("--unix-mode", "660"), 0o660)):
            with self.subTest(umask=oct(umask), option=option):
                srv = Server(TOLLGATE, "--unix", self.path, *option,
                             preexec_fn=with_umask(umask))
                with srv:
                    st = os.lstat(self.path)
                    self.assertTrue(stat.S_ISSOCK(st.st_mode))
                    self.assertEqual(stat.S_IMODE(st.st_mode), mode)
        for bad in ("0400", "1777", "9", "rw", ""):
            with self.subTest(bad=bad):
                p = run("--unix", self.path, "--unix-mode", bad)
                self.assertEqual(p.returncode, 2)

    def test_only_its_own_socket_is_removed(self):
        srv = Server(TOLLGATE, "--unix", self.path)
        with srv:
            self.assertTrue(self.ping())
            # the name is moved away and another socket takes it
            moved = self.path + ".moved"
            os.rename(self.path, moved)
            stale_socket(self.path)
            before = os.lstat(self.path).st_ino
        # the server stopped: the socket at the name is not its own
        self.assertTrue(os.path.exists(self.path))
        self.assertEqual(os.lstat(self.path).st_ino, before)


class Bind(unittest.TestCase):
    def test_a_host_name_resolves(self):
        with Server(TOLLGATE, "--bind", "localhost") as srv:
            self.assertIsNotNone(srv.port)
            r = redis.Redis(host="localhost", port=srv.port,
                            socket_timeout=30)
            self.assertTrue(r.ping())
            r.close()
            self.assertNotIn("warning", srv.stderr())

    def test_a_name_that_does_not_resolve_says_it_wants_an_address(self):
        p = run("--port", "0", "--bind", "no-such-host.invalid")
        self.assertEqual(p.returncode, 1)
        self.assertIn(b"it wants an address", p.stderr)

    def test_an_address_other_hosts_reach_is_warned_about(self):
        for addr in ("0.0.0.0", "::"):
            with self.subTest(addr=addr):
                try:
                    srv = Server(TOLLGATE, "--bind", addr)
                except RuntimeError as e:
                    if addr == "::" and "Address family" in str(e):
                        continue  # no IPv6 on this host
                    raise
                with srv:
                    self.assertIn("warning: --bind %s is reachable from "
                                  "other hosts" % addr, srv.stderr())
                    self.assertIn("set a password", srv.stderr())
        env = dict(os.environ, TOLLGATE_REQUIREPASS="pw")
        with Server(TOLLGATE, "--bind", "0.0.0.0", env=env) as srv:
            self.assertIn("Clients must AUTH", srv.stderr())

    def test_loopback_is_not_warned_about(self):
        for addr in ("127.0.0.1", "127.1.2.3"):
            with Server(TOLLGATE, "--bind", addr) as srv:
                self.assertEqual(srv.stderr(), "")


class Password(unittest.TestCase):
    def test_a_client_must_authenticate(self):
        env = dict(os.environ, TOLLGATE_REQUIREPASS="correct horse")
        with Server(TOLLGATE, env=env) as srv:
            anon = redis.Redis(port=srv.port, socket_timeout=30)
            with self.assertRaises(redis.exceptions.AuthenticationError):
                anon.ping()
            with self.assertRaises(redis.exceptions.AuthenticationError):
                anon.execute_command("TG.HIT", "k", "fixed_window", 1, HOUR)
            anon.close()
            # redis-py raises for WRONGPASS what it raises against Redis
            wrong = redis.Redis(port=srv.port, password="battery",
                                socket_timeout=30)
            with self.assertRaises(redis.exceptions.ResponseError) as e:
                wrong.ping()
            self.assertIn("WRONGPASS", str(e.exception))
            wrong.close()
            for user in (None, "default"):
                r = redis.Redis(port=srv.port, username=user,
                                password="correct horse", socket_timeout=30)
                self.assertTrue(r.ping())
                self.assertEqual(r.execute_command(
                    "TG.HIT", "k", "fixed_window", 5, HOUR)[0], 1)
                r.close()
            other = redis.Redis(port=srv.port, username="bob",
                                password="correct horse", socket_timeout=30)
            with self.assertRaises(redis.exceptions.ResponseError) as e:
                other.ping()
            self.assertIn("WRONGPASS", str(e.exception))
            other.close()

    def test_the_command_line_password_is_blotted_out(self):
        with Server(TOLLGATE, "--requirepass", "hunter2") as srv:
            with open("/proc/%d/cmdline" % srv.proc.pid, "rb") as f:
                cmdline = f.read()
            self.assertNotIn(b"hunter2", cmdline)
            self.assertIn(b"--requirepass", cmdline)
            r = redis.Redis(port=srv.port, password="hunter2",
                            socket_timeout=30)
            self.assertTrue(r.ping())
            r.close()

    def test_a_password_too_long_is_bad_usage(self):
        p = run("--requirepass", "x" * 513)
        self.assertEqual(p.returncode, 2)
        p = run("--requirepass=")  # empty: not the option's own text
        self.assertEqual(p.returncode, 2)

    def test_the_password_given_with_equals_is_its_value(self):
        with Server(TOLLGATE, "--requirepass=hunter2") as srv:
            with open("/proc/%d/cmdline" % srv.proc.pid, "rb") as f:
                cmdline = f.read()
            self.assertNotIn(b"hunter2", cmdline)
            self.assertIn(b"--requirepass=", cmdline)
            r = redis.Redis(port=srv.port, password="hunter2",
                            socket_timeout=30)
            self.assertTrue(r.ping())
            r.close()


class Limits(unittest.TestCase):
    def test_max_period(self):
        with Server(TOLLGATE, "--max-period-ms", "86400000") as srv:
            r = redis.Redis(port=srv.port, socket_timeout=30)
            self.assertEqual(r.execute_command(
                "TG.HIT", "day", "sliding_window", 5, 86400000)[0], 1)
            with self.assertRaises(redis.exceptions.ResponseError) as e:
                r.execute_command("TG.HIT", "year", "sliding_window", 5,
                                  365 * 86400000)
            self.assertIn("above this server's limit of 86400000",
                          str(e.exception))
            self.assertEqual(r.dbsize(), 1)
            r.close()

    def test_new_keys_per_client(self):
        sock = tempfile.mktemp(prefix="tg-budget-", suffix=".sock")
        self.addCleanup(remove_if_there, sock)  # a failed test kills it
        with Server(TOLLGATE, "--unix", sock,
                    "--max-new-keys-per-client", "3/3600000") as srv:
            tcp = redis.Redis(port=srv.port, socket_timeout=30)
            tcp2 = redis.Redis(port=srv.port, socket_timeout=30)
            for i in range(3):  # two connections, one address, one budget
                c = tcp if i % 2 else tcp2
                self.assertEqual(c.execute_command(
                    "TG.HIT", "t%d" % i, "token_bucket", 5, HOUR)[0], 1)
            with self.assertRaises(redis.exceptions.ResponseError) as e:
                tcp.execute_command("TG.HIT", "t3", "token_bucket", 5, HOUR)
            self.assertIn("this client may create 3 new keys per 3600000 ms",
                          str(e.exception))
            # keys it has are not new
            self.assertEqual(tcp.execute_command(
                "TG.HIT", "t0", "token_bucket", 5, HOUR)[1], 3)
            # the unix socket's clients are counted by uid: their own budget
            ux = redis.Redis(unix_socket_path=sock, socket_timeout=30)
            ux2 = redis.Redis(unix_socket_path=sock, socket_timeout=30)
            for i in range(3):
                c = ux if i % 2 else ux2
                self.assertEqual(c.execute_command(
                    "TG.HIT", "u%d" % i, "fixed_window", 5, HOUR)[0], 1)
            with self.assertRaises(redis.exceptions.ResponseError):
                ux2.execute_command("TG.HIT", "u3", "fixed_window", 5, HOUR)
            self.assertEqual(tcp.dbsize(), 6)
            self.assertEqual(tcp.info("stats")["requests_over_new_key_budget"],
                             2)
            for c in (tcp, tcp2, ux, ux2):
                c.close()

    def test_a_refused_policy_spends_no_new_key_tokens(self):
        with Server(TOLLGATE, "--max-new-keys-per-client", "2/3600000") as srv:
            r = redis.Redis(port=srv.port, socket_timeout=30)
            # three new keys at once are more than the budget: refused,
            # and the two tokens are still there
            with self.assertRaises(redis.exceptions.ResponseError) as e:
                r.execute_command("TG.POLICY", "p1", "token_bucket", 5, HOUR,
                                  "p2", "token_bucket", 5, HOUR,
                                  "p3", "token_bucket", 5, HOUR)
            self.assertIn("would create 3", str(e.exception))
            self.assertEqual(r.dbsize(), 0)
            v = r.execute_command("TG.POLICY", "p1", "token_bucket", 5, HOUR,
                                  "p2", "token_bucket", 5, HOUR)
            self.assertEqual(v[0], 1)
            self.assertEqual(r.dbsize(), 2)
            # spent: a third key is refused, one it has is not new
            with self.assertRaises(redis.exceptions.ResponseError) as e:
                r.execute_command("TG.HIT", "q1", "token_bucket", 5, HOUR)
            self.assertIn("retry in", str(e.exception))
            self.assertEqual(r.execute_command(
                "TG.HIT", "p1", "token_bucket", 5, HOUR)[0], 1)
            r.close()

    def test_unix_clients_of_another_uid_have_their_own_budget(self):
        if os.geteuid() != 0:
            self.skipTest("needs root, to connect as another uid")
        sock = tempfile.mktemp(prefix="tg-budget-", suffix=".sock")
        self.addCleanup(remove_if_there, sock)  # a failed test kills it
        with Server(TOLLGATE, "--unix", sock, "--unix-mode", "0666",
                    "--max-new-keys-per-client", "2/3600000") as srv:
            mine = redis.Redis(unix_socket_path=sock, socket_timeout=30)
            for i in range(2):
                mine.execute_command("TG.HIT", "m%d" % i, "fixed_window", 5,
                                     HOUR)
            with self.assertRaises(redis.exceptions.ResponseError):
                mine.execute_command("TG.HIT", "m2", "fixed_window", 5, HOUR)
            mine.close()
            # a child as uid 65534 (nobody) creates two keys of its own
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    os.setgid(65534)
                    os.setuid(65534)
                    r = redis.Redis(unix_socket_path=sock, socket_timeout=30)
                    ok = [r.execute_command("TG.HIT", "n%d" % i,
                                            "fixed_window", 5, HOUR)[0]
                          for i in range(2)]
                    code = 0 if ok == [1, 1] else 2
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
            self.assertEqual(os.waitstatus_to_exitcode(status), 0)
            r = redis.Redis(port=srv.port, socket_timeout=30)
            self.assertEqual(r.dbsize(), 4)
            r.close()

    def test_sliding_logs_are_reserved_as_keys_use_them(self):
        def store_bytes(*opts):
            with Server(TOLLGATE, "--capacity", "1024", *opts) as srv:
                r = redis.Redis(port=srv.port, socket_timeout=30)
                sizes = [r.info("memory")["store_bytes"]]
                for i in range(4):
                    r.execute_command("TG.HIT", "s%d" % i, "sliding_window",
                                      1000, HOUR)
                sizes.append(r.info("memory")["store_bytes"])
                for _ in range(200):  # one log of many entries
                    r.execute_command("TG.HIT", "s0", "sliding_window",
                                      1000, HOUR)
                sizes.append(r.info("memory")["store_bytes"])
                r.close()
                return sizes
        big = store_bytes()
        small = store_bytes("--sliding-max-entries", "16")
        # nothing is set aside for logs before a sliding key holds one
        self.assertEqual(big[0], small[0])
        # a log of one entry is a 64-byte block, whatever the cap
        self.assertGreater(big[1], big[0])
        self.assertEqual(big[1] - big[0], small[1] - small[0])
        # a log that grows takes larger blocks, up to the cap's
        self.assertGreater(big[2], big[1])
        self.assertGreater(big[2] - big[1], small[2] - small[1])
        p = run("--sliding-max-entries", "0")
        self.assertEqual(p.returncode, 2)
        p = run("--sliding-max-entries", str((1 << 24) + 1))
        self.assertEqual(p.returncode, 2)

    def test_on_full(self):
        def degraded(*opts):
            with Server(TOLLGATE, "--capacity", "8", *opts) as srv:
                r = redis.Redis(port=srv.port, socket_timeout=30)
                out = [r.execute_command("TG.HIT", "f%d" % i, "token_bucket",
                                         5, HOUR)[5] for i in range(64)]
                r.close()
                return sum(out)
        # refused: the keys past the capacity get the failure policy's
        # (degraded) answer; evicted: every new key gets a slot
        self.assertGreater(degraded(), 0)
        self.assertGreater(degraded("--on-full", "refuse"), 0)
        self.assertEqual(degraded("--on-full", "evict"), 0)
        p = run("--on-full", "sometimes")
        self.assertEqual(p.returncode, 2)
        self.assertIn(b"--on-full", p.stderr)


if __name__ == "__main__":
    TOLLGATE = sys.argv.pop(1)
    unittest.main(verbosity=2)
