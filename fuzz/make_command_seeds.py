#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""make_command_seeds.py - writes the seed corpus of fuzz_command
(fuzz/corpus/command/): requests of every TG.* command, good and bad (the
first byte picks the command, NUL separates the arguments, see
fuzz_command.c), and stored values of every algorithm, good and bad. It
rewrites only the seed-* files."""
import os

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus", "command")
ALGS = ["fixed_window", "fixed_window_per_key", "sliding_window",
        "token_bucket", "leaky_bucket"]
HIT, INC, GET, SET, EXPIRESAT, RESET = range(6)


def req(cmd, *args):
    return bytes([cmd]) + b"\0".join(str(a).encode() for a in args)


seeds = {}
for i, alg in enumerate(ALGS):
    seeds["hit-%d" % i] = req(HIT, "k", alg, 3, 1000, "BURST", 5, "COST", 2)
    seeds["inc-%d" % i] = req(INC, "k", alg, 3, 1000, "COST", 9)
    seeds["get-%d" % i] = req(GET, "k", alg.upper(), 3, 1000)
    seeds["set-%d" % i] = req(SET, "k", alg, 3, 1000, 2, "burst", 4)
    seeds["exp-%d" % i] = req(EXPIRESAT, "k", alg, 3, 1000)
    seeds["reset-%d" % i] = req(RESET, "k", alg)
    seeds["edge-%d" % i] = req(HIT, "k" * 256, alg, 9223372036854775807,
                               1000000000000, "COST", 9223372036854775807)
seeds["reset-all"] = req(RESET, "k")
seeds["bad-alg"] = req(HIT, "k", "nope", 3, 1000)
seeds["bad-num"] = req(HIT, "k", "token_bucket", "-1", "1e3")
seeds["bad-opt"] = req(HIT, "k", "token_bucket", 3, 1000, "BURST")
seeds["bad-arity"] = req(SET, "k", "token_bucket", 3)
seeds["overflow"] = req(HIT, "k", "token_bucket", 3, "9223372036854775808")
seeds["value-fw"] = b"0:1795489881000000:3"
seeds["value-tb"] = b"3:1795489881000:999"
seeds["value-sw"] = (b"2" + b"%020d" % 3 + b"%020d%020d" % (1795489881000000, 1)
                     + b"%020d%020d" % (1795489881000001, 2))
seeds["value-bad"] = b"0:000000001795489881000000:3"

os.makedirs(OUT, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(OUT, "seed-" + name), "wb") as f:
        f.write(data)
print("wrote %d seeds to %s" % (len(seeds), OUT))
