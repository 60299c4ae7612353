#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""make_seeds.py - writes the seed corpus of fuzz_table (fuzz/corpus/table/).

Seeds are hand-aimed at each part of the region (header, ctrl words, slots,
long-key chunks, sliding-log blocks) so the fuzzer starts from inputs that
reach every kind of corruption, each followed by the same sweep of
operations. The input format is documented at the top of fuzz_table.c; the
offsets below are those of its table (capacity 16, 4 long keys, 4 log
entries, fixed SipHash key), where keys 0-7 land in these slots:

    key   0  1  2  3  4  5  6  7     (lengths 1 7 8 23 24 25 100 256)
    slot 14  0  5 17 15 11  6  3     (keys 5-7 use chunks 0-2)

(their slots under SipHash-1-3, the tables' hash since format 4: key 4's
home is 14, taken by key 0, so it probes on to 15)

A slot is 48 bytes: the state pair (w0, w1) at 0, the ctrl word at 16,
the key words from 24.

Run it from anywhere; it rewrites only the seed-* files (regression inputs
the fuzzer found are kept beside them under their own names).
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus", "table")

# region layout (see fuzz_table.c; sliding tables add the log blocks), of
# table format version 4: CTRL is slot 0's ctrl word
SLOT, CTRL, CHUNK, LOG = 256, 272, 1216, 2240
BLOCK = 128  # bytes per log block: lock 0, n 8, head 12, sum 16,
#              period 24, next_free 32, last_us 40, entries 48
HDR = {"magic": 0, "version": 8, "hdr_bytes": 12, "algorithm": 16,
       "slot_bytes": 20, "log_entries": 24, "log_block_bytes": 28,
       "shared": 32, "capacity": 40, "nslots": 48, "nchunks": 56,
       "nlogs": 64, "ctrl_off": 88, "total_bytes": 120, "pidns": 128,
       "live": 136, "chunk_bump": 144, "chunk_free": 152, "log_bump": 160,
       "log_free": 168, "cursor": 176, "horizon": 184, "reach": 192,
       "lock": 200, "clean_lock": 208}
KEY_SLOT = [14, 0, 5, 17, 15, 11, 6, 3]
FIXED, PER_KEY, SLIDING, TOKEN, LEAKY = range(5)
HIT, INC, GET, SET, EXPIRES, RESET, CLEAN, POKE = range(8)


def op(kind, key=0, arg=1, quota=0, time=1):
    return bytes([kind, key, (quota << 5) | arg, time])


def poke(off, xor):
    return bytes([POKE, off & 0xff, (off >> 8) & 0xff, xor])


def sweep(resets=True):
    """Every operation on every key, cleaning, resets, time jumps."""
    b = b""
    for k in range(16):
        b += op(HIT, k) + op(GET, k) + op(EXPIRES, k) + op(SET, k, 2)
        b += op(INC, k) + op(HIT, k, 31)  # cost 2^64 - 1
    b += op(CLEAN, 0, 0, time=250)  # 51 hours later
    for k in range(0, 16, 3) if resets else ():
        b += op(RESET, k)
    for k in range(16):
        b += op(HIT, k, 1, quota=k % 8, time=0)
    b += op(CLEAN, 0, 31, time=255)  # older_than 0, 5 ms back
    return b


def seed(alg, corruptions=(), ops=None):
    """corruptions: (offset, xor) pairs applied before attach."""
    b = bytes([alg, len(corruptions)])
    for off, x in corruptions:
        b += struct.pack("<HB", off, x)
    return b + (sweep() if ops is None else ops)


def main():
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        if f.startswith("seed-"):
            os.remove(os.path.join(OUT, f))
    seeds = {}
    names = ["fixed", "per-key", "sliding", "token", "leaky"]
    for a in range(5):
        n = names[a]
        full = a in (FIXED, SLIDING, TOKEN)  # the other two: a few only
        s = KEY_SLOT[a + 1]
        # (a sliding w0 is a log block index: another key's block here; out
        # of range it is regress-reset-hang-sliding-block-index)
        w0 = (SLOT + 48 * s, 0x01) if a == SLIDING else (SLOT + 48 * s + 7, 0x40)
        seeds[f"{n}-clean"] = seed(a)
        seeds[f"{n}-ctrl-gen"] = seed(a, [(CTRL + 48 * s + 4, 0x01)])
        seeds[f"{n}-slot-w0"] = seed(a, [w0])
        seeds[f"{n}-slot-w1"] = seed(a, [(SLOT + 48 * s + 8, 0x01)])
        if not full:
            continue
        # header: fields attach checks (refused) and counters it does not
        if a != TOKEN:
            for fld in ("magic", "version", "algorithm", "nslots",
                        "total_bytes", "shared", "pidns"):
                seeds[f"{n}-hdr-{fld}"] = seed(a, [(HDR[fld], 0x01)])
        seeds[f"{n}-hdr-live"] = seed(a, [(HDR["live"], 0x10)])
        seeds[f"{n}-hdr-live-max"] = seed(a, [(HDR["live"] + 7, 0xff)])
        seeds[f"{n}-hdr-horizon"] = seed(a, [(HDR["horizon"] + 6, 0x20)])
        seeds[f"{n}-hdr-cursor"] = seed(a, [(HDR["cursor"] + 7, 0x80)])
        seeds[f"{n}-hdr-reach"] = seed(a, [(HDR["reach"] + 7, 0x80)])
        # lock words: a garbage owner (bit 31), a live one (pid 1, start
        # unknown: held), a reaped one (pid 4000000, most likely free)
        for lk in ("lock", "clean_lock"):
            seeds[f"{n}-hdr-{lk}-garbage"] = seed(a, [(HDR[lk] + 3, 0x80)])
            seeds[f"{n}-hdr-{lk}-pid-1"] = seed(a, [(HDR[lk], 0x01)])
            seeds[f"{n}-hdr-{lk}-pid-4000000"] = seed(
                a, [(HDR[lk], 0x00), (HDR[lk] + 1, 0x09), (HDR[lk] + 2, 0x3d)])
        # ctrl words: status, length (bits 2-10), tag; an EMPTY made LIVE
        seeds[f"{n}-ctrl-status"] = seed(a, [(CTRL + 48 * s, 0x03)])
        seeds[f"{n}-ctrl-len"] = seed(a, [(CTRL + 48 * s + 1, 0x01)])
        seeds[f"{n}-ctrl-tag"] = seed(a, [(CTRL + 48 * s + 2, 0x01)])
        seeds[f"{n}-ctrl-empty-live"] = seed(a, [(CTRL + 48 * 3, 0x81)])
        # slot key words; long keys: the chunk index and the chunk's bytes
        seeds[f"{n}-slot-key"] = seed(a, [(SLOT + 48 * s + 24, 0x01)])
        seeds[f"{n}-slot-chunk-index"] = seed(
            a, [(SLOT + 48 * KEY_SLOT[6] + 24, 0x07)])
        seeds[f"{n}-chunk-byte"] = seed(a, [(CHUNK + 256 + 5, 0x01)])
        seeds[f"{n}-chunk-free"] = seed(
            a, [(HDR["chunk_free"], 0x02), (CHUNK + 2 * 256, 0x05)])
    # numbers tollgate never writes: a window ending after TG_NOW_MAX_US +
    # TG_PERIOD_MAX_MS (bit 53 of the end), a TAT past its bound (bits 62-63)
    s = KEY_SLOT[2]
    seeds["fixed-slot-implausible"] = seed(FIXED, [(SLOT + 48 * s + 6, 0x20)])
    seeds["token-slot-implausible"] = seed(TOKEN, [(SLOT + 48 * s + 7, 0xc0)])
    # a log block index out of range, without the resets that hang on it
    seeds["sliding-slot-w0-out-of-range"] = seed(
        SLIDING, [(SLOT + 48 * s + 7, 0x40)], sweep(resets=False))
    # free-list heads out of range: dropped when next needed
    seeds["fixed-hdr-chunk-free-out-of-range"] = seed(
        FIXED, [(HDR["chunk_free"] + 7, 0x80)])
    seeds["sliding-hdr-log-free-out-of-range"] = seed(
        SLIDING, [(HDR["log_free"] + 7, 0x80)])
    # sliding-log blocks: lock, n, head, sum, period, next_free, last_us,
    # entries
    blk = LOG + BLOCK * 3  # key 3's log (block index 3 + 1 - 1)
    for fld, off, x in (("lock-garbage", 3, 0x80), ("lock-pid-1", 0, 0x01),
                        ("lock-waiters", 3, 0x40),
                        ("n", 8, 0x07), ("head", 12, 0x02),
                        ("sum", 16, 0x01), ("period", 31, 0x80),
                        ("next-free", 32, 0x09),
                        ("last-us", 40 + 6, 0x40),
                        ("entry-time", 48 + 16 + 3, 0x10),
                        ("entry-cost", 48 + 8 + 7, 0xff)):
        seeds[f"sliding-log-{fld}"] = seed(SLIDING, [(blk + off, x)])
    seeds["sliding-log-free"] = seed(
        SLIDING, [(HDR["log_free"], 0x03), (LOG + 2 * BLOCK + 32, 0x03)])
    seeds["sliding-log-bump"] = seed(SLIDING, [(HDR["log_bump"], 0x1f)])
    # corruption between operations, as a concurrent writer would do it
    mid = b""
    for k in range(8):
        mid += op(HIT, k) + poke(CTRL + 48 * KEY_SLOT[k], 1 << (k % 8))
        mid += op(GET, k) + poke(SLOT + 48 * KEY_SLOT[k] + k, 0x11)
        mid += op(HIT, k + 8) + op(EXPIRES, k)
    for a, n in ((FIXED, "fixed"), (SLIDING, "sliding"), (TOKEN, "token")):
        seeds[f"{n}-poke-between-ops"] = seed(a, ops=mid + sweep())
    for name, data in seeds.items():
        with open(os.path.join(OUT, "seed-" + name), "wb") as f:
            f.write(data)
    print(f"{len(seeds)} seeds in {OUT}")


if __name__ == "__main__":
    main()
