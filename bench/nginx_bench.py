#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""nginx_bench.py [--rounds N] [--seconds S] MODULE - the nginx module
beside no limiting and limit_req, with wrk, on one nginx (one worker) that
tests/nginx/ngx.py starts on a free loopback port in a private prefix and
always stops. Figures and how to read them: BENCHMARKS.md, "nginx".

Every location limits in the preaccess phase, then answers 204 from a named
location (try_files to @ok, whose `return 204` runs after the limiters:
`return` in the limited location itself would answer in the rewrite phase,
before any limiter). The key is $arg_k: one hot key, or 100,000 keys that
wrk's script cycles through. Every quota admits every request (1,000,000
per second; the sliding window, whose log per key grows with its limit,
64 per second, which no key of the 100,000 reaches, and 1,000,000 per
second on the hot key), so every request is a decision that consumes.

Every location's path has the same length (five bytes: /none, /lreq,
/tb_h, /tb_m...): nginx parses the request line and finds the location by
the path, at about 13 instructions a byte, so a longer path would charge
its case for work that is not the limiter's (the names were the cases'
own until 2026-11-28, which cost tollgate's hot cases about 90 of some
9,600 instructions a request beside /limit_req).

Each case has a server of its own, on its own loopback port, holding
only its location and @ok. nginx finds a prefix location by walking a
binary tree of the server's locations, about 47 instructions a level
(callgrind): in one server of 13 locations (until 2026-11-29) /lreq was
the tree's root and the tollgate cases one to three levels down, which
charged them 47-141 instructions a request that were not the limiter's.

Tollgate's locations write no header (`tollgate_headers off`), as limit_req
writes none; one more case shows what the RateLimit fields cost on the hot
token bucket. Rounds are interleaved: each round runs every case but
limit_req once (limit_req runs beside each of them, see below), each round
starting one case later (a load that drifts during a round then favours no
case); wrk runs on CPU 1 and nginx's worker on CPU 0. Each
case's ratio to limit_req comes from pairs: in every round, each case
other than limit_req runs right beside a run of limit_req on the same keys
(before it in even rounds, after it in odd ones: an odd --rounds has one
more of the first), and the ratio is the
median of those pairs' own ratios (with their range). On this shared
machine the load moves within seconds (a case's figure moved by a third
between rounds); two runs a few seconds apart see nearly the same load,
two cases half a round apart often do not. Requests/s and latencies are
the medians of every run of the case (limit_req: of all its pair runs).
The machine's load average is printed before and after.

--redis adds a token bucket zone kept in Redis (store=redis://, a private
redis-server on a free loopback port that the script starts and stops, as
tests/nginx/test_nginx_redis.py does): one round trip per request, decided
without blocking the worker; its ratio to limit_req shows what sharing a
limit between hosts costs on one host.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "tests", "nginx"))

ALGS = ["fixed_window", "fixed_window_per_key", "sliding_window",
        "token_bucket", "leaky_bucket"]
# each case's location: every path five bytes long (see above)
CODE = {"fixed_window": "fw", "fixed_window_per_key": "fk",
        "sliding_window": "sw", "token_bucket": "tb", "leaky_bucket": "lb"}


def path(alg, keys):
    return "/%s_%s" % (CODE[alg], keys[0])


def config(ports, redis_port=None):
    """The http block: one server per case, each on its own port (ports:
    path -> port; the first path's server listens on PORT, the port ngx.py
    chose and waits for), with the case's location and @ok."""
    import ngx  # after main() has set TG_NGINX_MODULE, which ngx.py reads
    zones = ["limit_req_zone $arg_k zone=lr:32m rate=1000000r/s;"]
    locs = ["location /none { try_files /nope @ok; }",
            "location /lreq { limit_req zone=lr burst=1000000 nodelay;"
            " try_files /nope @ok; }"]
    for a in ALGS:
        for keys in ("hot", "many"):
            if a == "sliding_window":
                rate = "1000000r/s" if keys == "hot" else "64r/s"
                size = "4m" if keys == "hot" else "256m"
            else:
                rate, size = "1000000r/s", "32m"
            burst = " burst=1000000" if "bucket" in a else ""
            zones.append("tollgate_zone $arg_k zone=%s_%s:%s algorithm=%s "
                         "rate=%s%s;" % (a, keys, size, a, rate, burst))
            # limit_req writes no header: compared on the same terms
            locs.append("location %s { tollgate zone=%s_%s;"
                        " tollgate_headers off;"
                        " try_files /nope @ok; }" % (path(a, keys), a, keys))
    # what the RateLimit fields and Retry-After cost on top
    locs.append("location /tbhd { tollgate "
                "zone=token_bucket_hot; try_files /nope @ok; }")
    if redis_port:
        zones.append("tollgate_zone $arg_k zone=redis algorithm=token_bucket "
                     "rate=1000000r/s burst=1000000 "
                     "store=redis://127.0.0.1:%d;" % redis_port)
        locs.append("location /rdis { tollgate zone=redis;"
                    " tollgate_headers off; try_files /nope @ok; }")
    servers = []
    for i, loc in enumerate(locs):
        where = loc.split()[1]
        port = None
        while i > 0 and (port is None or port in ports.values()):
            port = ngx.free_port()
        ports[where] = port
        servers.append("server { listen 127.0.0.1:%s; %s\n"
                       "  location @ok { return 204; } }"
                       % ("PORT" if i == 0 else ports[where], loc))
    return "\n".join(zones) + "\n" + "\n".join(servers)


def wrk(port, path, many, seconds, script_dir):
    # wrk on CPU 1, nginx's worker on CPU 0 (worker_cpu_affinity): on two
    # vCPUs, the scheduler putting both on one CPU now and then moved a
    # case's figure by a third between rounds
    cmd = ["taskset", "-c", "1", "wrk", "-t1", "-c32", "-d%ds" % seconds,
           "--latency"]
    if many:
        script = os.path.join(script_dir, path.strip("/") + ".lua")
        with open(script, "w") as f:
            f.write('local n = 0\nrequest = function()\n  n = n + 1\n'
                    '  return wrk.format("GET", "%s?k=" .. (n %% 100000))\n'
                    'end\n' % path)
        cmd += ["-s", script]
        url = "http://127.0.0.1:%d%s" % (port, path)
    else:
        url = "http://127.0.0.1:%d%s?k=hot" % (port, path)
    out = subprocess.run(cmd + [url], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, check=True).stdout.decode()
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    if re.search(r"Non-2xx or 3xx responses", out):
        raise RuntimeError("a case was limited:\n" + out)

    def ms(label):
        m = re.search(r"\s%s%%\s+([\d.]+)(us|ms|s)" % label, out)
        v = float(m.group(1))
        return v / 1000 if m.group(2) == "us" else (
            v * 1000 if m.group(2) == "s" else v)
    return rps, ms("50"), ms("99")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--redis", action="store_true",
                    help="add a token bucket zone kept in Redis")
    ap.add_argument("module")
    args = ap.parse_args()
    os.environ["TG_NGINX_MODULE"] = os.path.abspath(args.module)
    import ngx
    cases = [("none", "/none", False), ("none", "/none", True),
             ("limit_req", "/lreq", False),
             ("limit_req", "/lreq", True)]
    for a in ALGS:
        cases.append(("tollgate " + a, path(a, "hot"), False))
        cases.append(("tollgate " + a, path(a, "many"), True))
    cases.append(("tollgate token_bucket +headers",
                  "/tbhd", False))
    redis = None
    if args.redis:
        import test_nginx_redis
        redis = test_nginx_redis.Redis()
        cases.append(("tollgate token_bucket redis", "/rdis", False))
        cases.append(("tollgate token_bucket redis", "/rdis", True))
    print("load average before: %.2f %.2f %.2f" % os.getloadavg())
    try:
        while True:
            ports = {}
            n = ngx.Nginx(config(ports, redis.port if redis else None),
                          workers=1, main="worker_cpu_affinity 01;",
                          start=False)
            if n.port not in ports.values():
                break  # else ngx.py's own port is a case's: choose again
            shutil.rmtree(n.prefix, ignore_errors=True)  # never started
        n.start()
    except Exception:
        if redis:
            redis.close()
        raise
    ports = {k: v or n.port for k, v in ports.items()}
    results = {c: [] for c in cases}
    pairs = {c: [] for c in cases}  # each pair's ratio to limit_req
    try:
        with tempfile.TemporaryDirectory() as d:
            for c in cases:  # warm-up: the keys exist before the rounds
                wrk(ports[c[1]], c[1], c[2], 1, d)
            others = [c for c in cases if c[0] != "limit_req"]
            for r in range(args.rounds):
                # each round starts one case later, so a load that rises or
                # falls during a round does not always favour the same cases
                k = r % len(others)
                for c in others[k:] + others[:k]:
                    base = ("limit_req", "/lreq", c[2])
                    order = [base, c] if r % 2 == 0 else [c, base]
                    got = {}
                    for x in order:
                        got[x] = wrk(ports[x[1]], x[1], x[2], args.seconds,
                                     d)
                        results[x].append(got[x])
                    pairs[c].append(got[c][0] / got[base][0])
                print("round %d done, load %.2f" % (r + 1, os.getloadavg()[0]),
                      file=sys.stderr)
    finally:
        n.stop()
        if redis:
            redis.close()
    print("load average after: %.2f %.2f %.2f" % os.getloadavg())
    print("%-36s %10s %8s %8s %9s %s" % ("case", "req/s", "p50 ms", "p99 ms",
                                         "vs limit_req",
                                         "(median of the adjacent pairs' ratios,"
                                         " range)"))
    for c in cases:
        rps = statistics.median(x[0] for x in results[c])
        p50 = statistics.median(x[1] for x in results[c])
        p99 = statistics.median(x[2] for x in results[c])
        ratio = "-"
        if c[0] != "none" and pairs[c]:
            rr = sorted(pairs[c])
            ratio = "%.3f (%.3f-%.3f)" % (statistics.median(rr), rr[0], rr[-1])
        elif c[0] == "limit_req":
            ratio = "1.000 (%d pair runs)" % len(results[c])
        print("%-36s %10.0f %8.3f %8.3f %s" % (
            c[0] + (" 100k keys" if c[2] else " hot key"), rps, p50, p99,
            ratio))


if __name__ == "__main__":
    main()
