#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""make_engine_seeds.py - writes the seed corpus of fuzz_engine
(fuzz/corpus/engine/): a server's byte streams after the engine's handshake
(see fuzz_engine.c: byte 0 the setup, byte 1 the calls, byte 2 the split,
then chunks whose first byte picks a link and a length). Replies of the
script to every algorithm, errors, NOSCRIPT, MOVED and ASK, CLUSTER SLOTS,
nested and truncated replies. It rewrites only the seed-* files."""
import os

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus", "engine")
SHA = b"0123456789abcdef0123456789abcdef01234567"


def bulk(b):
    return b"$%d\r\n%s\r\n" % (len(b), b)


def arr(*items):
    return b"*%d\r\n" % len(items) + b"".join(items)


def num(n):
    return b":%d\r\n" % n


def chunks(stream, link=0):
    """The stream cut in chunks of at most 60 bytes on one link."""
    out = b""
    for i in range(0, len(stream), 60):
        part = stream[i:i + 60]
        out += bytes([((len(part) - 1) << 2 | link) & 0xff]) + part
    return out


NOW = b"1735689600000000"
first_hit = arr(bulk(NOW), bulk(b""), num(1))
window_over = arr(bulk(NOW), bulk(b"0:1735689601000000:3"), num(1))
bucket = arr(bulk(NOW), bulk(b"3:1735689600:500"), num(1))
sliding = arr(bulk(NOW), bulk(b"2"), num(1), num(1), bulk(NOW), bulk(b""))
handshake = arr(arr(b"*-1\r\n")) + bulk(SHA)
slots = arr(arr(num(0), num(8191), arr(bulk(b"127.0.0.1"), num(7000),
                                      bulk(b"id0"))),
            arr(num(8192), num(16383), arr(bulk(b""), num(7001), bulk(b"id1")),
                arr(bulk(b"127.0.0.1"), num(7005), bulk(b"id5"))))

seeds = {}
for alg, reply in [(0, first_hit), (0, window_over), (2, sliding), (3, bucket)]:
    setup = 2 | (alg << 3)
    seeds["ok-%d-%d" % (alg, len(seeds))] = bytes([setup, 6, 7]) + chunks(
        reply * 6)
seeds["hs-raw"] = bytes([0, 3, 1]) + chunks(handshake + first_hit * 3)
seeds["noscript"] = bytes([2, 2, 3]) + chunks(
    b"-NOSCRIPT No matching script.\r\n" * 2 + bulk(SHA) + first_hit * 2)
seeds["module"] = bytes([0, 2, 5]) + chunks(
    arr(arr(bulk(b"tg.step"), num(-10))) + bulk(SHA) +
    b"-ERR unknown command 'TG.STEP'\r\n" + bulk(SHA) + first_hit * 2)
seeds["errors"] = bytes([2, 4, 9]) + chunks(
    b"-TGCORRUPT bad\r\n-OOM no\r\n-BUSY x\r\n" + arr(num(1), num(2)))
seeds["moved"] = bytes([3, 2, 11]) + chunks(
    b"-MOVED 15495 127.0.0.1:7001\r\n-MOVED 1 :7001\r\n") + chunks(
        handshake + first_hit * 2, 1)
seeds["ask"] = bytes([3, 1, 13]) + chunks(
    b"-ASK 15495 127.0.0.1:7002\r\n") + chunks(
        handshake + b"+OK\r\n" + first_hit, 2)
seeds["slots"] = bytes([7, 4, 17]) + chunks(handshake + slots) + chunks(
    handshake + first_hit * 4, 1)
seeds["clusterdown"] = bytes([3, 2, 19]) + chunks(
    b"-CLUSTERDOWN The cluster is down\r\n" + first_hit)
seeds["nested"] = bytes([2, 2, 23]) + chunks(
    arr(arr(arr(num(1)))) + b"*20\r\n" + num(1) * 20)
seeds["garbage"] = bytes([2, 2, 29]) + chunks(b"?what\r\n$-7\r\n")
seeds["long"] = bytes([2, 1, 31]) + chunks(b"$2000\r\n" + b"x" * 2000 + b"\r\n")

os.makedirs(OUT, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(OUT, "seed-" + name), "wb") as f:
        f.write(data)
print("%d seeds in %s" % (len(seeds), OUT))
