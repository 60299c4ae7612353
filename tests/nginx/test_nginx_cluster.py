# SPDX-License-Identifier: MIT
"""test_nginx_cluster.py - ngx_http_tollgate_module's Redis Cluster zones
(store=redis-cluster://...) inside Debian's real nginx, beside the private
Cluster tests/redis/with_cluster.sh starts (three masters, three replicas;
it kills every node however this ends).

Run inside with_cluster.sh --module, every node has tollgate's Redis
module and the decisions go through TG.STEP (checked), else through the
script. Two nginx hosts (two workers each) name ONE seed: each worker's client must
read the slot map and open a connection to every master its keys live on.
Exactness per key for every algorithm with keys on all three masters, a
two-line location (one policy, one command) on a key of each master, then
`nginx -s reload` (counts kept), and a master killed (SIGKILL): its keys are answered by on_error, quickly,
while the other masters' keys are still decided by Redis, until its replica
is promoted and they are decided by Redis again, with no reload.
"""
import os
import signal
import subprocess
import threading
import time
import unittest

import ngx

ALGORITHMS = ["fixed_window", "fixed_window_per_key", "sliding_window",
              "token_bucket", "leaky_bucket"]
PORTS = [int(p) for p in os.environ["TG_TEST_CLUSTER_PORTS"].split(",")]
DIR = os.environ["TG_TEST_CLUSTER_DIR"]
LIMIT = 10


def cli(port, *args):
    return subprocess.run(["redis-cli", "-p", str(port)] + list(args),
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          timeout=10, check=True).stdout.decode().strip()


def masters():
    """{port: [(first slot, last slot)...]} of the masters, as a live node
    sees the cluster now."""
    out = {}
    for port in PORTS:
        try:
            lines = cli(port, "CLUSTER", "NODES").splitlines()
        except (OSError, subprocess.SubprocessError):
            continue
        for ln in lines:
            f = ln.split()
            if "master" not in f[2] or "fail" in f[2]:
                continue
            p = int(f[1].split("@")[0].rsplit(":", 1)[1])
            ranges = []
            for r in f[8:]:
                if r.startswith("["):
                    continue  # a slot being migrated
                a, _, b = r.partition("-")
                ranges.append((int(a), int(b or a)))
            out[p] = ranges
        return out
    return out


def owner(key, ms):
    """The master port serving key's slot. The store names keys
    ":{KEY}:", so the slot is KEY's own."""
    slot = int(cli(PORTS[0], "CLUSTER", "KEYSLOT", key))
    for p, ranges in ms.items():
        if any(a <= slot <= b for a, b in ranges):
            return p
    return None


def settled_masters(timeout=30):
    """masters() once every one of the three holds slots and together they
    cover all 16384: a node may still show another master without its
    slots just after the Cluster formed (then no key could be found for
    that master)."""
    deadline = time.monotonic() + timeout
    while True:
        ms = masters()
        covered = sum(b - a + 1 for rs in ms.values() for a, b in rs)
        if len(ms) == 3 and all(ms.values()) and covered == 16384:
            return ms
        if time.monotonic() > deadline:
            raise AssertionError("the Cluster's masters did not settle: %r"
                                 % ms)
        time.sleep(0.1)


def keys_per_master(count):
    """count keys on each master: {port: [keys]}."""
    ms = settled_masters()
    got = {p: [] for p in ms}
    for i in range(100000):
        if all(len(v) >= count for v in got.values()):
            return got
        k = "k%d" % i
        p = owner(k, ms)
        if p in got and len(got[p]) < count:
            got[p].append(k)
    raise AssertionError("no %d keys per master in 100000: %r" % (count, got))


class Cluster(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        seed = "store=redis-cluster://127.0.0.1:%d" % PORTS[0]
        zones = "".join(
            "tollgate_zone $arg_k zone=%s algorithm=%s rate=%s %s;\n"
            % (a, a, "%d/1d" % LIMIT if "bucket" not in a
               else "%dr/d burst=%d" % (LIMIT, LIMIT), seed)
            for a in ALGORITHMS)
        zones += ("tollgate_zone $arg_k zone=many algorithm="
                  "fixed_window_per_key rate=100000/1d %s timeout=200ms;\n"
                  % seed)
        # two limits in one location: one policy, one command to the
        # master of the key's slot
        zones += ("tollgate_zone $arg_k zone=pa algorithm=fixed_window "
                  "rate=3/1d %s;\n" % seed)
        zones += ("tollgate_zone $arg_k zone=pb algorithm=token_bucket "
                  "rate=5r/d burst=5 %s;\n" % seed)
        locs = """
location /policy { tollgate zone=pa; tollgate zone=pb;
                   add_header X-Status $tollgate_status always;
                   try_files /index.html =404; }
location /pb { tollgate zone=pb; add_header X-Remaining $tollgate_remaining
               always; try_files /index.html =404; }
"""
        locs += "".join(
            "location /%s { tollgate zone=%s; add_header X-Status "
            "$tollgate_status always; add_header X-Pid $pid always;"
            " try_files /index.html =404; }\n"
            % (a, a) for a in ALGORITHMS + ["many"])
        body = "%s\nserver { listen 127.0.0.1:PORT; %s }" % (zones, locs)
        cls.body = body
        cls.hosts = [ngx.Nginx(body), ngx.Nginx(body)]

    @classmethod
    def tearDownClass(cls):
        for n in cls.hosts:
            n.stop()

    def test_1_exact_on_every_master(self):
        keys = keys_per_master(2)
        self.assertEqual(len(keys), 3, keys)
        allk = [k for v in keys.values() for k in v]
        tries = LIMIT + 6
        got, lock = {}, threading.Lock()

        def run(t):
            n = self.hosts[t % 2]
            for a in ALGORITHMS:
                for k in allk:
                    for _ in range(tries // 2):
                        st, h, _ = n.request("/%s?k=%s" % (a, k))
                        with lock:
                            got.setdefault((a, k), []).append(
                                (st, h.get("x-status")))
        ts = [threading.Thread(target=run, args=(t,)) for t in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        for (a, k), res in sorted(got.items()):
            self.assertEqual(len(res), tries)
            # decided by Redis every time (never on_error's answer)
            self.assertEqual({s for _, s in res} - {"PASSED", "REJECTED"},
                             set(), (a, k, res))
            admitted = sum(1 for st, _ in res if st == 200)
            self.assertEqual(admitted, LIMIT, (a, k, res))
        # every master holds the keys of its slots: each worker found the
        # nodes from one seed; and decided with tollgate's Redis module
        # where the nodes have it (TG.STEP), else with the script
        cmd = ("cmdstat_tg.step:" if os.environ.get("TG_TEST_REDIS_MODULE")
               else "cmdstat_evalsha:")
        for port, ks in keys.items():
            n = int(cli(port, "DBSIZE"))
            self.assertGreaterEqual(n, len(ks) * len(ALGORITHMS), port)
            self.assertIn(cmd, cli(port, "INFO", "commandstats"), port)
        # a reload closes every node's connection and starts new clients:
        # the counts are Redis's, kept
        self.hosts[0].reload(self.body)
        for a in ALGORITHMS:
            st, h, _ = self.hosts[0].request("/%s?k=%s" % (a, allk[0]))
            self.assertEqual((st, h.get("x-status")), (429, "REJECTED"), a)
        for n in self.hosts:
            self.assertNotIn("[alert]", n.error_log())
            self.assertNotIn("exited on signal", n.error_log())

    def test_1b_policy_on_every_master(self):
        # a key on each master, 12 requests from both hosts at once: the
        # policy admits exactly 3 (pa), decided by Redis each time, and
        # pb is charged only for those
        keys = keys_per_master(1)
        got, lock = {}, threading.Lock()

        def run(t):
            n = self.hosts[t % 2]
            for ks in keys.values():
                for _ in range(6):
                    st, h, _ = n.request("/policy?k=" + ks[0])
                    with lock:
                        got.setdefault(ks[0], []).append(
                            (st, h.get("x-status")))
        ts = [threading.Thread(target=run, args=(t,)) for t in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        for k, res in sorted(got.items()):
            self.assertEqual({s for _, s in res} - {"PASSED", "REJECTED"},
                             set(), (k, res))
            self.assertEqual(sum(1 for st, _ in res if st == 200), 3,
                             (k, res))
            st, h, _ = self.hosts[1].request("/pb?k=" + k)
            self.assertEqual((st, h.get("x-remaining")), (200, "1"), k)

    def test_1c_policy_waits_out_a_split_slot(self):
        # the policy's two names (zones pa and pb, one key) split between
        # the two nodes of a migrating slot: Redis answers TRYAGAIN, and
        # the request waits on the client's timer until the slot has
        # moved, then is decided by Redis (not by on_error)
        ms = settled_masters()
        k = "split%d" % os.getpid()
        n = self.hosts[0]
        self.assertEqual(n.request("/policy?k=" + k)[1]["x-status"],
                         "PASSED")
        slot = cli(PORTS[0], "CLUSTER", "KEYSLOT", k)
        src = owner(k, ms)
        dst = next(p for p in ms if p != src)
        src_id = cli(src, "CLUSTER", "MYID")
        dst_id = cli(dst, "CLUSTER", "MYID")
        names = cli(src, "CLUSTER", "GETKEYSINSLOT", slot, "10").split()
        self.assertEqual(len(names), 2, names)
        cli(dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        cli(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)

        def migrate(name):
            cli(src, "MIGRATE", "127.0.0.1", str(dst), "", "0", "5000",
                "KEYS", name)
        migrate(names[0])
        res = {}

        def run():
            t = time.monotonic()
            st, h, _ = n.request("/policy?k=" + k)
            res["got"] = (st, h.get("x-status"), time.monotonic() - t)
        th = threading.Thread(target=run)
        th.start()
        time.sleep(0.4)  # it meets TRYAGAIN and waits
        self.assertTrue(th.is_alive(), res)
        migrate(names[1])
        # the new owner first, as redis-cli --cluster does: a source that
        # already points at a destination still importing would send the
        # request back and forth (MOVED) until its redirects run out
        for p in [dst, src] + [p for p in ms if p not in (dst, src)]:
            cli(p, "CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        th.join(10)
        self.assertIn("got", res, "the waiting request never finished")
        st, status, took = res["got"]
        self.assertEqual((st, status), (200, "PASSED"))
        self.assertGreaterEqual(took, 0.4)
        # counted once: pa (3) has one left, taken through the new owner
        for want in ("PASSED", "REJECTED"):
            self.assertEqual(n.request("/policy?k=" + k)[1]["x-status"],
                             want)
        self.assertNotIn("[alert]", n.error_log())

    def test_2_master_killed_then_replica_promoted(self):
        keys = keys_per_master(1)
        victim = next(p for p in keys if p != PORTS[0])  # not the seed
        dead_key = keys[victim][0]
        live_keys = [v[0] for p, v in keys.items() if p != victim]
        n = self.hosts[0]
        for k in [dead_key] + live_keys:
            self.assertEqual(n.request("/many?k=" + k)[1]["x-status"],
                             "PASSED")
        with open(os.path.join(DIR, "node-%d.pid" % victim)) as f:
            os.kill(int(f.read().strip()), signal.SIGKILL)
        # the dead master's key: on_error's answer (allowed), within about
        # the zone's timeout; the others: still Redis's
        saw_failed = False
        streak = 0
        deadline = time.monotonic() + 60
        recovered = False
        while time.monotonic() < deadline:
            t = time.monotonic()
            st, h, _ = n.request("/many?k=" + dead_key)
            dt = time.monotonic() - t
            self.assertEqual(st, 200)
            self.assertLess(dt, 2.5, "a request waited on a dead node")
            if h["x-status"] == "FAILED":
                saw_failed = True
                streak = 0
            elif saw_failed:
                # decided by the promoted replica, in both workers (each
                # has its own client, which finds the new map on its own)
                streak += 1
                if streak == 10:
                    recovered = True
                    break
            for k in live_keys:
                self.assertEqual(n.request("/many?k=" + k)[1]["x-status"],
                                 "PASSED", k)
            time.sleep(0.05)
        self.assertTrue(saw_failed, "the dead master's key never failed")
        self.assertTrue(recovered, "never decided by Redis again: "
                        + n.error_log()[-2000:])
        self.assertEqual(n.request("/many?k=" + dead_key)[1]["x-status"],
                         "PASSED")
        self.assertIn("tollgate: zone \"many\"", n.error_log())
        self.assertNotIn("exited on signal", n.error_log())


if __name__ == "__main__":
    unittest.main(verbosity=2)
