#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""make_resp_seeds.py - writes the seed corpus of fuzz_resp
(fuzz/corpus/resp/).

Each seed is the byte stream of one client connection (see fuzz_resp.c):
every command the server answers, with good and bad arguments, pipelined
batches, inline requests, binary keys, and framing at and past every bound,
so the fuzzer starts from inputs that reach every branch of the parser and
of the commands. Run it from anywhere; it rewrites only the seed-* files
(inputs the fuzzer found are kept beside them under their own names).
"""
import os

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus", "resp")
ALGS = ["fixed_window", "fixed_window_per_key", "sliding_window",
        "token_bucket", "leaky_bucket"]


def cmd(*args):
    """One multibulk request."""
    parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    out = b"*%d\r\n" % len(parts)
    for p in parts:
        out += b"$%d\r\n%s\r\n" % (len(p), p)
    return out


seeds = {}
for alg in ALGS:
    seeds["hit-" + alg] = b"".join(
        cmd("TG.HIT", "k", alg, 3, 1000) for _ in range(5))
    seeds["ops-" + alg] = (
        cmd("TG.HIT", "k", alg, 5, 100, "BURST", 8, "COST", 2) +
        cmd("TG.INC", "k", alg, 5, 100, "COST", 3) +
        cmd("TG.GET", "k", alg, 5, 100, "BURST", 8) +
        cmd("TG.SET", "k", alg, 5, 100, 4, "BURST", 8) +
        cmd("TG.EXPIRESAT", "k", alg, 5, 100) +
        cmd("TG.RESET", "k", alg) +
        cmd("TG.HIT", "k", alg, 5, 100, "COST", 0))
seeds["errors"] = b"".join([
    cmd("TG.HIT", "k", "nope", 1, 1), cmd("TG.HIT", "k", "fixed_window", 0, 1),
    cmd("TG.HIT", "k", "fixed_window", 1, 0),
    cmd("TG.HIT", "k", "fixed_window", "-1", 1),
    cmd("TG.HIT", "k", "fixed_window", "9223372036854775808", 1),
    cmd("TG.HIT", "k", "fixed_window", 1, 1, "BURST"),
    cmd("TG.HIT", "k", "fixed_window", 1, 1, "FOO", 1),
    cmd("TG.HIT", "", "fixed_window", 1, 1),
    cmd("TG.HIT", b"x" * 257, "fixed_window", 1, 1),
    cmd("TG.HIT"), cmd("TG.SET", "k", "token_bucket", 3, 1, 9),
    cmd("TG.INC", "k", "sliding_window", 3, 1), cmd("NOPE", "a"),
    cmd("TG.HIT", "k", "token_bucket", 2, 1000, "COST", 3)])
seeds["binary-keys"] = b"".join(
    cmd("TG.HIT", bytes([i, 0, 13, 10, 255]), ALGS[i % 5], 2, 50)
    for i in range(20))
seeds["many-keys"] = b"".join(
    cmd("TG.HIT", "key:%d" % i, ALGS[i % 5], 1, 1000000) for i in range(200))
seeds["handshake"] = (cmd("HELLO") + cmd("HELLO", 2, "SETNAME", "x") +
                      cmd("HELLO", 3) + cmd("CLIENT", "SETNAME", "a") +
                      cmd("CLIENT", "GETNAME") + cmd("CLIENT", "ID") +
                      cmd("COMMAND") + cmd("COMMAND", "COUNT") +
                      cmd("COMMAND", "INFO", "tg.hit", "nope") +
                      cmd("COMMAND", "DOCS") + cmd("SELECT", 0) +
                      cmd("SELECT", 1) + cmd("CONFIG", "GET", "save") +
                      cmd("CONFIG", "GET", "appendonly") + cmd("DBSIZE") +
                      cmd("INFO") + cmd("INFO", "stats", "keyspace") +
                      cmd("PING") + cmd("PING", "hi") + cmd("ECHO", "e") +
                      cmd("QUIT") + cmd("PING"))
# the fuzz target's second context wants the password "pw", refuses
# periods over 100000 ms and lets a client create 5 keys a second
seeds["auth"] = (cmd("PING") + cmd("AUTH", "nope") + cmd("AUTH", "bob", "pw") +
                 cmd("HELLO", 2) + cmd("HELLO", 2, "AUTH", "default", "p") +
                 cmd("AUTH", "pw") + cmd("PING") + cmd("AUTH", "default", "pw") +
                 cmd("HELLO", 2, "AUTH", "default", "pw", "SETNAME", "n") +
                 cmd("INFO", "stats"))
seeds["limits"] = (cmd("AUTH", "pw") +
                   cmd("TG.HIT", "p", "fixed_window", 1, 100001) +
                   cmd("TG.HIT", "p", "token_bucket", 1, 100000, "BURST", 2) +
                   cmd("TG.HIT", "p", "leaky_bucket", 1, 1000, "BURST",
                       "9223372036854775807") +
                   b"".join(cmd("TG.HIT", "n%d" % i, ALGS[i % 5], 3, 1000)
                            for i in range(8)) +
                   cmd("TG.INC", "n9", "fixed_window", 3, 1000) +
                   cmd("TG.SET", "n10", "token_bucket", 3, 1000, 1) +
                   cmd("TG.HIT", "n0", "fixed_window", 3, 1000, "COST", 0))
seeds["inline"] = (b"PING\r\nTG.HIT k fixed_window 3 1000\r\n"
                   b"  tg.hit\tk  SLIDING_WINDOW 3 1000 cost 2\n\r\n\n"
                   b"INFO keyspace\r\nECHO a b\r\n")
seeds["empty"] = b"*0\r\n*-1\r\n\r\n\n*1\r\n$4\r\nPING\r\n"
seeds["incomplete"] = cmd("TG.HIT", "k", "fixed_window", 3, 1000)[:-7]
seeds["garbage-star"] = b"*x\r\n"
seeds["garbage-type"] = b"*1\r\n:1\r\n"
seeds["garbage-nullbulk"] = b"*1\r\n$-1\r\n"
seeds["garbage-crlf"] = b"*1\r\n$4\r\nPINGPONG\r\n"
seeds["garbage-longheader"] = b"*" + b"1" * 40 + b"\r\n"
seeds["garbage-bare-lf"] = b"*1\n$4\nPING\n"
seeds["garbage-bare-lf-bulk"] = b"*1\r\n$4\nPING\r\n"
seeds["garbage-bulk-lf"] = b"PING\r\n*1\r\n$4\r\nPING\n\r\n"
seeds["garbage-midcount"] = b"*2\r\n$4\r\nECHO\r\n$1x"
seeds["too-many-args"] = b"*65\r\n" + b"$1\r\na\r\n" * 65
seeds["max-args"] = cmd("PING", *(["a"] * 63))
seeds["bulk-too-long"] = b"*1\r\n$16385\r\n"
seeds["bulk-max"] = cmd("ECHO", b"z" * 16384)
seeds["request-too-long"] = b"*8\r\n" + (b"$16384\r\n" + b"y" * 16384 +
                                         b"\r\n") * 4
seeds["inline-too-long"] = b"a" * 65536
seeds["inline-too-many"] = b"a " * 70 + b"\r\n"

os.makedirs(OUT, exist_ok=True)
for name in os.listdir(OUT):
    if name.startswith("seed-"):
        os.remove(os.path.join(OUT, name))
for name, data in seeds.items():
    with open(os.path.join(OUT, "seed-" + name), "wb") as f:
        f.write(data)
print("wrote %d seeds to %s" % (len(seeds), OUT))
