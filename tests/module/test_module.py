# SPDX-License-Identifier: MIT
"""test_module.py MODULE [TOLLGATE] - the Redis module (tollgate.so) inside
real redis-servers that this script starts on free loopback ports, in
temporary directories, and always kills (atexit), however it ends.

What it checks, beyond what test_redis runs through the library:
  - the protocol: the replies `tollgate serve` gives (when TOLLGATE, the
    program, is given: both are asked the same requests), errors included;
    every bad argument answers an error; key positions for Cluster;
  - replication: decisions on a master reach a replica WITHOUT the module as
    plain SET/DEL, byte for byte, with the same absolute expiry, and no TG.*
    command reaches the replica;
  - persistence: restart from the AOF (before and after a rewrite) and from
    an RDB gives the same values, expiry times and answers; the AOF never
    holds a TG.* command; a server without the module still loads the RDB;
  - MULTI/EXEC and Lua's redis.call('TG.HIT', ...); OOM with maxmemory
    (deny-oom: writes refused, reads answered); MODULE UNLOAD and LOAD;
    values that are not tollgate's answer TG_ECORRUPT and stay as they were;
    the load argument SLIDING-MAX-ENTRIES.
"""
import atexit
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import redis

MODULE = os.path.abspath(sys.argv[1])
TOLLGATE = sys.argv[2] if len(sys.argv) > 2 else None
_procs = []
_dirs = []


@atexit.register
def _cleanup():
    for p in _procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    for d in _dirs:
        shutil.rmtree(d, ignore_errors=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    """A redis-server in its own directory; restart() keeps the directory
    (and so its RDB and AOF)."""

    def __init__(self, module=True, conf=(), module_args=()):
        self.dir = tempfile.mkdtemp(prefix="tg-module.")
        _dirs.append(self.dir)
        self.module = module
        self.module_args = list(module_args)
        self.conf = list(conf)
        self.port = free_port()
        self.proc = None
        self.start()

    def start(self, module=None, retries=3):
        if module is not None:
            self.module = module
        lines = ["bind 127.0.0.1", "port %d" % self.port, "dir " + self.dir,
                 "logfile " + os.path.join(self.dir, "log"), 'save ""',
                 "enable-module-command local"] + self.conf
        if self.module:
            lines.append(" ".join(["loadmodule", MODULE] + self.module_args))
        path = os.path.join(self.dir, "redis.conf")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        self.proc = subprocess.Popen(["redis-server", path],
                                     stdout=subprocess.DEVNULL)
        _procs.append(self.proc)
        self.r = redis.Redis(port=self.port, socket_timeout=10)
        for _ in range(200):
            try:
                # ours, not a server another test started on the port
                # while this one was stopped (ctest runs tests side by side)
                # (PING answers -LOADING until the data is loaded)
                if (self.r.ping() and self.r.info("server")["process_id"]
                        == self.proc.pid):
                    return
            except (redis.ConnectionError, redis.TimeoutError):
                pass
            if self.proc.poll() is not None:
                break  # could not listen: the port was taken
            time.sleep(0.05)
        if self.proc.poll() is not None and retries > 0:
            self.port = free_port()  # the data is in self.dir, not the port
            return self.start(module, retries - 1)
        raise RuntimeError("redis-server did not start: " + self.log())

    def log(self):
        try:
            with open(os.path.join(self.dir, "log")) as f:
                return f.read()
        except OSError:
            return ""

    def stop(self):
        """SHUTDOWN (which saves when persistence is on), then wait."""
        try:
            self.r.shutdown()
        except redis.ConnectionError:
            pass
        self.proc.wait(timeout=60)

    def restart(self, module=None):
        self.stop()
        self.start(module)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# newer redis-py raise -OOM as its own class, without the word
_OOM = getattr(redis.exceptions, "OutOfMemoryError", ())


def expect_error(r, *args, starts=None):
    try:
        got = r.execute_command(*args)
    except _OOM as e:
        # redis-py names -OOM by its class and keeps only the text after it
        assert starts in (None, "OOM"), (args, str(e))
        return "OOM " + str(e)
    except redis.ResponseError as e:
        if starts is not None:
            assert str(e).startswith(starts), (args, str(e))
        return str(e)
    raise AssertionError("no error for %r: %r" % (args, got))


def snapshot(r):
    """Every key's value and absolute expiry (ms)."""
    out = {}
    for k in r.keys("*"):
        out[k] = (r.get(k), r.execute_command("PEXPIRETIME", k))
    return out


def decisions(r, tag):
    """Calls of every algorithm and operation that write state."""
    for i in range(3):
        r.execute_command("TG.HIT", tag + ":fw", "fixed_window", 5, 3600000)
        r.execute_command("TG.HIT", tag + ":pk", "fixed_window_per_key", 5,
                          3600000, "COST", 2)
        r.execute_command("TG.HIT", tag + ":sw", "sliding_window", 5,
                          3600000)
        r.execute_command("TG.HIT", tag + ":tb", "token_bucket", 5, 3600000,
                          "BURST", 10)
        r.execute_command("TG.HIT", tag + ":lb", "leaky_bucket", 5, 3600000)
    r.execute_command("TG.INC", tag + ":fw", "fixed_window", 5, 3600000,
                      "COST", 4)
    r.execute_command("TG.SET", tag + ":tb", "token_bucket", 5, 3600000, 1,
                      "BURST", 10)
    r.execute_command("TG.HIT", tag + ":gone", "fixed_window", 5, 3600000)
    r.execute_command("TG.RESET", tag + ":gone")
    r.execute_command("TG.HIT", tag + ":short", "sliding_window", 5, 1)
    time.sleep(0.01)
    # the log's only entry has expired: the hit replaces the log (a write)
    r.execute_command("TG.HIT", tag + ":short", "sliding_window", 5, 1,
                      "COST", 0)


# ---- the protocol --------------------------------------------------------

BAD = [
    ("TG.HIT",), ("TG.HIT", "k"), ("TG.HIT", "k", "fixed_window", 3),
    ("TG.HIT", "k", "nope", 3, 1000), ("TG.HIT", "k", "fixed_window", -1, 1),
    ("TG.HIT", "k", "fixed_window", "+1", 1),
    ("TG.HIT", "k", "fixed_window", "1x", 1),
    ("TG.HIT", "k", "fixed_window", 3, "9223372036854775808"),
    ("TG.HIT", "k", "fixed_window", 3, 1000, "BURST"),
    ("TG.HIT", "k", "fixed_window", 3, 1000, "FOO", 1),
    ("TG.HIT", "k", "fixed_window", 3, 1000, "COST", 1, "BURST", 1, "X"),
    ("TG.HIT", "k", "fixed_window", 0, 1000),
    ("TG.HIT", "k", "fixed_window", 3, 0),
    ("TG.HIT", "k", "fixed_window", 3, 1000000000001),
    ("TG.HIT", "", "fixed_window", 3, 1000), ("TG.HIT", "x" * 257,
                                               "fixed_window", 3, 1000),
    ("TG.HIT", "k", "token_bucket", 2000000, 1),
    ("TG.INC", "k", "token_bucket", 3, 1000),
    ("TG.INC", "k", "fixed_window", 3, 1000, "BURST", 1),
    ("TG.GET", "k", "fixed_window", 3, 1000, "COST", 1),
    ("TG.SET", "k", "fixed_window", 3, 1000),
    ("TG.SET", "k", "token_bucket", 3, 1000, "x"),
    ("TG.SET", "k", "token_bucket", 3, 1000, 4),
    ("TG.SET", "k", "sliding_window", 3, 1000, 1),
    ("TG.EXPIRESAT", "k", "leaky_bucket", 3), ("TG.RESET",),
    ("TG.RESET", "k", "nope"), ("TG.RESET", "k", "fixed_window", "x"),
    ("TG.STEP", "k"), ("TG.STEP", "k", 9, 0, "", 1, 1, 0, 1, 1),
    ("TG.STEP", "k", 0, 7, "", 1, 1, 0, 1, 1),
    ("TG.STEP", "k", 0, 0, "x", 1, 1, 0, 1, 1),
    ("TG.STEP", "k", 0, 0, "", 1, 1, 0, 1, 0),
    ("TG.STEP", "k", 0, 0, "", 0, 1, 0, 1, 1),
    ("TG.STEP", "k", 2, 3, "", 1, 1, 0, 1, 1),
    ("TG.STEP", "k", 0, 0, "99999999999999999999", 1, 1, 0, 1, 1),
    # 2^64 - 1 is a time out of range, not "no time given" (that is "")
    ("TG.STEP", "k", 0, 0, "18446744073709551615", 10, 1000, 0, 1, 1),
    ("TG.STEPS", 1, "k", "18446744073709551615", 0, 10, 1000, 0, 1, 1, 0),
    ("TG.STEP_RO", "k", 0, 0, "", 1, 1, 0, 1),
]


def test_bad_arguments(r):
    for args in BAD:
        expect_error(r, *args)
    assert r.ping()
    assert r.keys("*") == []  # no bad request wrote anything


def ask(r, args):
    try:
        return ("ok", r.execute_command(*args))
    except redis.ResponseError as e:
        return ("err", str(e))


def close(a, b):
    """Replies equal, but for times (ms) a few ms apart."""
    if a[0] != b[0] or type(a[1]) != type(b[1]):
        return False
    if a[0] == "err" or not isinstance(a[1], list):
        return a == b
    if len(a[1]) != 6 or len(b[1]) != 6:
        return a == b
    same = [a[1][i] == b[1][i] for i in (0, 1, 2, 5)]
    near = [abs(a[1][i] - b[1][i]) <= 50 for i in (3, 4)]
    return all(same) and all(near)


def test_same_protocol_as_serve(r):
    """The same requests, in the same order, to the module and to `tollgate
    serve`: the same replies (times within a few ms: two clocks)."""
    if not TOLLGATE:
        print("  (no tollgate program given: protocol compared with errors only)")
        return
    proc = subprocess.Popen([TOLLGATE, "serve", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    _procs.append(proc)
    port = None
    while port is None:
        line = proc.stdout.readline().decode()
        assert line, "tollgate serve did not start"
        if "port" in line:
            port = int(line.rsplit("port", 1)[1].split()[0])
    s = redis.Redis(port=port, socket_timeout=10)
    for _ in range(100):
        try:
            s.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    reqs = list(BAD[:27])  # not TG.STEP: the library's, not in serve
    for alg in ("fixed_window_per_key", "sliding_window", "token_bucket",
                "leaky_bucket"):
        key = "p:" + alg
        for cost in (1, 2, 0, 5, 1, 100):
            reqs.append(("TG.HIT", key, alg, 4, 60000, "COST", cost))
        reqs.append(("TG.GET", key, alg, 4, 60000))
        reqs.append(("TG.HIT", key, alg.upper(), 4, 60000, "BURST", 6))
        reqs.append(("TG.RESET", key, alg))
        reqs.append(("TG.GET", key, alg, 4, 60000))
    reqs += [("TG.INC", "p:inc", "fixed_window_per_key", 3, 60000,
              "COST", 9223372036854775807),
             ("TG.INC", "p:inc", "fixed_window_per_key", 3, 60000,
              "COST", 1),
             ("TG.SET", "p:set", "leaky_bucket", 3, 60000, 2),
             ("TG.GET", "p:set", "leaky_bucket", 3, 60000),
             ("TG.SET", "p:set", "leaky_bucket", 3, 60000, 4)]
    for args in reqs:
        a, b = ask(r, args), ask(s, args)
        assert close(a, b), "%r: module %r, serve %r" % (args, a, b)
    proc.terminate()
    proc.wait(timeout=60)


def test_key_positions(r):
    for cmd in ("TG.HIT", "TG.INC", "TG.GET", "TG.SET", "TG.EXPIRESAT",
                "TG.RESET", "TG.STEP", "TG.STEP_RO"):
        info = r.execute_command("COMMAND", "INFO", cmd)[cmd.lower()]
        flags = set(f.decode() if isinstance(f, bytes) else f
                    for f in info["flags"])
        assert (info["first_key_pos"], info["last_key_pos"],
                info["step_count"]) == (1, 1, 1), (cmd, info)
        # Redis derives the key spec (one key, at 1) from the triple
        assert len(info["key_specifications"]) == 1, (cmd, info)
        assert "fast" in flags, (cmd, flags)
        if cmd in ("TG.GET", "TG.EXPIRESAT", "TG.STEP_RO"):
            assert "readonly" in flags and "write" not in flags, (cmd, flags)
        elif cmd == "TG.STEP":
            # the library's command checks maxmemory itself, on a write
            # only (test_redis over_maxmemory_reads_answer)
            assert "write" in flags and "denyoom" not in flags, (cmd, flags)
        else:
            assert {"write", "denyoom"} <= flags, (cmd, flags)
    keys = r.command_getkeys("TG.HIT", "user:{42}", "token_bucket", 1, 1)
    assert keys in ([b"user:{42}"], ["user:{42}"]), keys
    # the library's policy command: its keys found by parsing, as TG.POLICY's
    keys = r.command_getkeys("TG.STEPS", 2, "a", "b", "",
                             0, 1, 1000, 1, 1, 1024, 0,
                             3, 1, 1000, 1, 1, 1024, 0)
    assert [k.decode() if isinstance(k, bytes) else k for k in keys] == \
        ["a", "b"], keys
    # the keys of a policy of reservations (an eighth argument per rule)
    keys = r.command_getkeys("TG.STEPS", 2, "a", "b", "",
                             3, 1, 1000, 1, 1, 1024, 0, 5000000,
                             0, 1, 1000, 1, 1, 1024, 0, 0)
    assert [k.decode() if isinstance(k, bytes) else k for k in keys] == \
        ["a", "b"], keys
    # what the non-blocking client asks when it connects: the protocol
    # level, 2 (the waits); it names no key and never writes
    assert r.execute_command("TG.PROTOCOL") == 2
    info = r.execute_command("COMMAND", "INFO", "TG.PROTOCOL")["tg.protocol"]
    assert info["first_key_pos"] == 0, info
    try:
        r.execute_command("TG.PROTOCOL", "x")
        raise AssertionError("TG.PROTOCOL x was accepted")
    except redis.ResponseError as e:
        assert "TGARG" in str(e), e


def test_policy(r):
    """TG.POLICY: all rules or none, the same reply shape as serve's."""
    admitted = 0
    for i in range(8):
        v = r.execute_command("TG.POLICY", "pol:b", "token_bucket", 5, 60000,
                              "pol:m", "fixed_window", 6, 60000)
        assert len(v) == 7, v
        admitted += v[0]
        assert v[6] == (-1 if v[0] else 0), (i, v)
    assert admitted == 5, admitted
    # the minute was charged only for the five admitted
    assert r.execute_command("TG.GET", "pol:m", "fixed_window", 6,
                             60000) == 5
    keys = r.command_getkeys("TG.POLICY", "a", "token_bucket", 1, 1,
                             "BURST", 2, "b", "fixed_window", 1, 1)
    assert [k.decode() if isinstance(k, bytes) else k for k in keys] == \
        ["a", "b"], keys
    expect_error(r, "TG.POLICY", "x", "fixed_window", 1, 1000, "x",
                 "token_bucket", 1, 1000, starts="TG_EINVAL")
    expect_error(r, "TG.POLICY", "x", "fixed_window", 1)
    # a rule that can never pass leaves the other untouched
    v = r.execute_command("TG.POLICY", "pol:n", "fixed_window", 3, 60000,
                          "pol:o", "fixed_window", 1, 60000, "COST", 2)
    assert v[0] == 0 and v[6] == 1 and v[3] == -1, v
    assert r.execute_command("TG.GET", "pol:n", "fixed_window", 3,
                             60000) == 0


def test_values_not_ours(r):
    r.set("junk", "garbage")
    expect_error(r, "TG.HIT", "junk", "fixed_window", 3, 1000,
                 starts="TG_ECORRUPT")
    expect_error(r, "TG.RESET", "junk", starts="TG_ECORRUPT")
    expect_error(r, "TG.STEP", "junk", 0, 0, "", 3, 1000, 0, 1, 8,
                 starts="TGCORRUPT")
    assert r.get("junk") == b"garbage"
    r.rpush("list", "x")
    expect_error(r, "TG.HIT", "list", "sliding_window", 3, 1000,
                 starts="TG_ECORRUPT")
    # one key, two algorithms: the second is told whose state it is
    r.execute_command("TG.HIT", "mixed", "token_bucket", 3, 1000)
    e = expect_error(r, "TG.HIT", "mixed", "leaky_bucket", 3, 1000,
                     starts="TG_ECORRUPT")
    assert "token_bucket" in e
    # a value that is no algorithm's names none, whatever its first digit,
    # even with a log's length
    for v in ("12345", "2" + "x" * 20, "2" + "0" * 20 + "y" * 40):
        r.set("digits", v)
        e = expect_error(r, "TG.HIT", "digits", "token_bucket", 3, 1000,
                         starts="TG_ECORRUPT")
        assert "holds" not in e, (v, e)
    r.delete("digits")
    # TG.RESET naming another algorithm leaves the key alone
    assert r.execute_command("TG.RESET", "mixed", "leaky_bucket") == b"OK"
    assert r.exists("mixed")
    assert r.execute_command("TG.RESET", "mixed") == b"OK"
    assert not r.exists("mixed")
    for v in ["0:1:2:3", "0:10000000000000001:1", "3:1:1000", "2" + "0" * 19,
              "2" + "0" * 19 + "1" + "0" * 20 + "1" * 20]:
        r.set("bad", v)
        for alg in ("fixed_window", "sliding_window", "token_bucket"):
            expect_error(r, "TG.HIT", "bad", alg, 3, 1000,
                         starts="TG_ECORRUPT")
        assert r.get("bad") == v.encode()
    assert r.ping()
    r.delete("junk", "list", "bad")


def test_clock_in_us(r):
    # the module stores the server's time in us, as the script's TIME gives
    # it: Redis 7.0 has no module call for it (RedisModule_Microseconds is
    # 7.2's), and a time in whole ms made answers up to 1 ms apart
    seen = []
    for i in range(20):
        v = r.execute_command("TG.STEP", "clk%d" % i, 3, 2, "", 3, 60000, 4,
                              0, 1024)
        sec, usec = r.time()
        now = int(v[0])
        seen.append(now)
        assert abs(now - (sec * 1000000 + usec)) < 1000000, (v, sec, usec)
    assert any(v % 1000 != 0 for v in seen), seen
    r.delete(*["clk%d" % i for i in range(20)])


def test_multi_and_lua(r):
    p = r.pipeline(transaction=True)
    for _ in range(4):
        p.execute_command("TG.HIT", "tx", "fixed_window_per_key", 3, 60000)
    got = p.execute()
    assert [g[0] for g in got] == [1, 1, 1, 0], got
    assert [g[1] for g in got] == [1, 2, 3, 4], got
    lua = "return redis.call('TG.HIT', KEYS[1], 'sliding_window', 2, 60000)"
    got = [r.eval(lua, 1, "lua")[0] for _ in range(3)]
    assert got == [1, 1, 0], got
    assert r.execute_command("TG.GET", "lua", "sliding_window", 2, 60000) == 2


def test_oom(r):
    r.set("before", "x")
    r.execute_command("TG.HIT", "oom", "token_bucket", 3, 60000)
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", 1)
    try:
        expect_error(r, "TG.HIT", "oom", "token_bucket", 3, 60000,
                     starts="OOM")
        expect_error(r, "TG.STEP", "oom", 3, 0, "", 3, 60000, 3, 1, 8,
                     starts="OOM")
        # reads still answer
        assert r.execute_command("TG.GET", "oom", "token_bucket", 3,
                                 60000) == 2
        assert r.execute_command("TG.STEP_RO", "oom", 3, 2, "", 3, 60000, 3,
                                 0, 8)[2] == 0
    finally:
        r.config_set("maxmemory", 0)
    assert r.execute_command("TG.HIT", "oom", "token_bucket", 3,
                             60000)[2] == 1


def test_unload_and_load(r):
    r.execute_command("TG.HIT", "stay", "fixed_window", 3, 3600000)
    assert r.execute_command("MODULE", "UNLOAD", "tollgate") == b"OK"
    expect_error(r, "TG.HIT", "stay", "fixed_window", 3, 3600000,
                 starts="unknown command")  # redis-py drops "ERR "
    assert r.get("stay").startswith(b"0:")  # the state stays, a string
    assert r.execute_command("MODULE", "LOAD", MODULE) == b"OK"
    assert r.execute_command("TG.GET", "stay", "fixed_window", 3,
                             3600000) in (1, 0)  # 0 if the hour turned
    expect_error(r, "MODULE", "LOAD", MODULE)  # already loaded
    r.execute_command("MODULE", "UNLOAD", "tollgate")
    expect_error(r, "MODULE", "LOAD", MODULE, "SLIDING-MAX-ENTRIES", 0)
    expect_error(r, "MODULE", "LOAD", MODULE, "NOPE", 1)
    # SLIDING-MAX-ENTRIES 2: a third entry merges into the newest
    r.execute_command("MODULE", "LOAD", MODULE, "SLIDING-MAX-ENTRIES", 2)
    for _ in range(3):
        r.execute_command("TG.HIT", "cap", "sliding_window", 10, 60000)
        time.sleep(0.002)
    assert len(r.get("cap")) == 21 + 2 * 40
    r.execute_command("MODULE", "UNLOAD", "tollgate")
    r.execute_command("MODULE", "LOAD", MODULE)
    assert r.memory_usage("cap") > 0


# ---- replication and persistence -----------------------------------------

def wait_replica(master, replica):
    replica.execute_command("REPLICAOF", "127.0.0.1",
                            master.connection_pool.connection_kwargs["port"])
    for _ in range(400):
        if replica.info("replication").get("master_link_status") == "up":
            return
        time.sleep(0.05)
    raise AssertionError("replica did not sync")


def test_replication():
    master = Server()
    replica = Server(module=False)  # the replica needs no module
    wait_replica(master.r, replica.r)
    decisions(master.r, "rep")
    p = master.r.pipeline(transaction=True)
    p.execute_command("TG.HIT", "rep:tx", "leaky_bucket", 3, 60000)
    p.execute_command("TG.HIT", "rep:tx", "leaky_bucket", 3, 60000)
    p.execute()
    master.r.eval("return redis.call('TG.HIT', KEYS[1], 'token_bucket', 3, "
                  "60000)", 1, "rep:lua")
    # the library's policy command writes two keys in one command
    v = master.r.execute_command("TG.STEPS", 2, "rep:{p}tb", "rep:{p}fw", "",
                                 3, 5, 60000, 5, 1, 1024, 0,
                                 0, 6, 60000, 6, 1, 1024, 0)
    assert len(v) == 4 and v[3] == 1, v
    assert master.r.execute_command("WAIT", 1, 5000) == 1
    a, b = snapshot(master.r), snapshot(replica.r)
    assert a == b, (a, b)
    # five algorithms, MULTI, Lua, a policy; reset and an emptied log are
    # deleted
    assert len(a) == 9 and b"rep:gone" not in a and b"rep:short" not in a
    assert all(exp > 0 for _, exp in a.values()), a  # every key has a TTL
    stats = replica.r.info("commandstats")
    assert not [c for c in stats if "tg." in c], stats
    assert "cmdstat_set" in stats
    replica.kill()
    master.kill()


def test_aof_and_rdb():
    s = Server(conf=["appendonly yes", "appendfsync always"])
    decisions(s.r, "aof")
    before = snapshot(s.r)
    count = s.r.execute_command("TG.GET", "aof:sw", "sliding_window", 5,
                                3600000)
    assert count == 3
    for f in glob.glob(os.path.join(s.dir, "appendonlydir", "*")):
        with open(f, "rb") as fh:
            assert b"TG." not in fh.read().upper(), f  # states, not commands
    s.restart()
    after = snapshot(s.r)
    assert after == before, (after, before, s.port, s.log()[-2000:])
    assert s.r.execute_command("TG.GET", "aof:sw", "sliding_window", 5,
                               3600000) == count
    s.r.bgrewriteaof()
    for _ in range(200):
        if s.r.info("persistence")["aof_rewrite_in_progress"] == 0:
            break
        time.sleep(0.05)
    s.restart()
    after = snapshot(s.r)
    assert after == before, (after, before, s.port, s.log()[-2000:])
    # RDB: saved, loaded with the module, and loaded without it (strings)
    s.r.config_set("appendonly", "no")
    s.r.save()
    s.conf = [c for c in s.conf if not c.startswith("append")]
    s.restart()
    after = snapshot(s.r)
    assert after == before, (after, before, s.port, s.log()[-2000:])
    assert s.r.execute_command("TG.GET", "aof:sw", "sliding_window", 5,
                               3600000) == count
    s.restart(module=False)
    after = snapshot(s.r)
    assert after == before, (after, before, s.port, s.log()[-2000:])
    s.kill()


def main():
    one = Server()
    for t in (test_bad_arguments, test_same_protocol_as_serve,
              test_key_positions, test_policy, test_values_not_ours,
              test_clock_in_us, test_multi_and_lua,
              test_oom, test_unload_and_load):
        t(one.r)
        print("ok", t.__name__)
    one.kill()
    for t in (test_replication, test_aof_and_rdb):
        t()
        print("ok", t.__name__)
    print("test_module: all passed")


if __name__ == "__main__":
    main()
