# SPDX-License-Identifier: MIT
"""test_nginx_redis.py - ngx_http_tollgate_module's Redis zones
(store=redis://...) inside Debian's real nginx: a private redis-server on a
free loopback port (and a unix socket) in a temporary directory, and TWO
nginx instances (ngx.py: each its own prefix and port, two workers each)
sharing one limit through it.

Exactness across both hosts for every algorithm, the header fields,
variables, status and dry run of a Redis zone, two lines in one location
as one policy (exact across both hosts, charging nothing when refused,
long tagged keys kept in their slot), a Redis that stops answering
(SIGSTOP: the zone's timeout, then on_error, quickly), a Redis that dies
(SIGKILL: on_error at once) and comes back (decided by Redis again), a
request that ends while Redis decides, `nginx -s reload` (counts kept, no
connection left behind), a unix socket and a password, and the `nginx -t`
messages for what a Redis zone refuses. Every server is stopped however
the test ends (ngx.py's atexit, and Redis.close here).
"""
import atexit
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest

import http.client

import ngx

ALGORITHMS = ["fixed_window", "fixed_window_per_key", "sliding_window",
              "token_bucket", "leaky_bucket"]

_redises = []
# TG_REDIS_MODULE: the path of tollgate's Redis module, loaded by every
# redis-server here (nginx_module_redis_module); else the script path
MODULE = os.environ.get("TG_REDIS_MODULE")


@atexit.register
def _close_all():
    for r in list(_redises):
        r.close()


class Redis:
    """A private redis-server: 127.0.0.1:port and dir/redis.sock, nothing
    persisted; start() again after kill() comes back on the same port."""

    def __init__(self, password=None):
        self.dir = tempfile.mkdtemp(prefix="tg-redis-")
        os.chmod(self.dir, 0o755)  # nginx's workers may run as nobody
        self.sock = os.path.join(self.dir, "redis.sock")
        self.port = ngx.free_port()
        self.password = password
        self.proc = None
        _redises.append(self)
        self.start()

    def start(self):
        args = ["redis-server", "--port", str(self.port),
                "--bind", "127.0.0.1", "--unixsocket", self.sock,
                "--unixsocketperm", "777", "--dir", self.dir,
                "--save", "", "--appendonly", "no",
                "--logfile", os.path.join(self.dir, "redis.log")]
        if self.password:
            args += ["--requirepass", self.password]
        if MODULE:  # tollgate's Redis module: TG.STEP(S) instead of scripts
            args += ["--loadmodule", MODULE]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                if self.cli("PING") == "PONG":
                    return
            except (OSError, subprocess.SubprocessError):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)

    def cli(self, *args):
        cmd = ["redis-cli", "-p", str(self.port)]
        if self.password:
            cmd += ["--no-auth-warning", "-a", self.password]
        return subprocess.run(cmd + list(args), stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, timeout=10,
                              check=True).stdout.decode().strip()

    def clients(self):
        """Connections other than the one asking."""
        lines = self.cli("CLIENT", "LIST").splitlines()
        return len([ln for ln in lines if "cmd=client" not in ln])

    def signal(self, sig):
        self.proc.send_signal(sig)

    def kill(self):
        self.proc.send_signal(signal.SIGCONT)
        self.proc.kill()
        self.proc.wait()

    def close(self):
        if self.proc and self.proc.poll() is None:
            self.kill()
        if self in _redises:
            _redises.remove(self)
        shutil.rmtree(self.dir, ignore_errors=True)


def server(body, zones="", **kw):
    return ngx.Nginx("%s\nserver { listen 127.0.0.1:PORT; %s }"
                     % (zones, body), **kw)


def statuses(n, path, count):
    return [n.request(path)[0] for _ in range(count)]


def timed(n, path):
    t = time.monotonic()
    st, h, _ = n.request(path, timeout=30)
    return st, h, time.monotonic() - t


def hammer(hosts, path, threads, per_thread):
    """threads x per_thread concurrent requests, thread t to hosts[t % 2]:
    (statuses, {host index: worker pids}, connection errors)."""
    results, pids, errors = [], {}, [0]
    lock = threading.Lock()

    def run(t):
        n = hosts[t % len(hosts)]
        for _ in range(per_thread):
            try:
                st, h, _ = n.request(path, timeout=30)
            except OSError:
                with lock:
                    errors[0] += 1
                continue
            with lock:
                results.append(st)
                pids.setdefault(t % len(hosts), set()).add(h.get("x-pid"))
    ts = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return results, pids, errors[0]


class Shared(unittest.TestCase):
    """Two nginx hosts, two workers each, one Redis: one limit."""

    @classmethod
    def setUpClass(cls):
        cls.redis = Redis()
        store = "store=redis://127.0.0.1:%d" % cls.redis.port
        zones = "".join(
            "tollgate_zone $arg_k zone=%s algorithm=%s rate=%s %s;\n"
            % (a, a, "40/1d" if "bucket" not in a else "40r/d burst=40",
               store) for a in ALGORITHMS)
        zones += ("tollgate_zone $arg_k zone=w algorithm=fixed_window_per_key"
                  " rate=3/1d %s;\n" % store)
        zones += ("tollgate_zone $arg_k zone=c algorithm=token_bucket"
                  " rate=10r/d %s;\n" % store)
        zones += ("tollgate_zone $arg_k zone=fw algorithm=fixed_window_per_key"
                  " rate=10/1d %s;\n" % store)
        zones += ("tollgate_zone $arg_k zone=q algorithm=leaky_bucket"
                  " rate=2r/s %s;\n" % store)
        zones += ("tollgate_zone $arg_k zone=q1 algorithm=leaky_bucket"
                  " rate=1r/m %s;\n" % store)
        # two limits in one location: one policy in one command
        zones += ("tollgate_zone $arg_k zone=pa algorithm=fixed_window"
                  " rate=3/1d %s;\n" % store)
        zones += ("tollgate_zone $arg_k zone=pb algorithm=token_bucket"
                  " rate=5r/d burst=5 %s;\n" % store)
        # a sliding log in a policy: its 30 entries (1,221 bytes) come back
        # whole in the reply
        zones += ("tollgate_zone $arg_k zone=ps algorithm=sliding_window"
                  " rate=30/1d %s;\n" % store)
        zones += ("tollgate_zone $arg_k zone=pt algorithm=token_bucket"
                  " rate=40r/d burst=40 %s;\n" % store)
        # a line that queues (zone q) and a window: a policy of
        # reservations
        zones += ("tollgate_zone $arg_k zone=pw algorithm=fixed_window"
                  " rate=10/1d %s;\n" % store)
        zones += ("tollgate_zone t}$arg_k zone=pc algorithm=leaky_bucket"
                  " rate=2r/d burst=2 %s;\n" % store)
        zones += ("tollgate_zone t}$arg_j zone=pd algorithm="
                  "fixed_window_per_key rate=10/1d %s;\n" % store)

        locs = "".join(
            "location /%s { tollgate zone=%s; add_header X-Pid $pid always;"
            " try_files /index.html =404; }\n" % (a, a) for a in ALGORITHMS)
        locs += """
location /vars { tollgate zone=w;
                 add_header X-Status $tollgate_status always;
                 add_header X-Remaining $tollgate_remaining always;
                 add_header X-Retry $tollgate_retry_after always;
                 try_files /index.html =404; }
location /status { tollgate zone=w; tollgate_status 503;
                   try_files /index.html =404; }
location /legacy { tollgate zone=w; tollgate_headers legacy;
                   try_files /index.html =404; }
location /dry { tollgate zone=w; tollgate_dry_run on;
                add_header X-Status $tollgate_status always;
                try_files /index.html =404; }
location /nodelay { tollgate zone=token_bucket burst=2 nodelay;
                    try_files /index.html =404; }
location /queue { tollgate zone=q burst=3 delay=1;
                  add_header X-Status $tollgate_status always;
                  try_files /index.html =404; }
location /slow { tollgate zone=q1 burst=1;
                 add_header X-Status $tollgate_status always;
                 try_files /index.html =404; }
location /qdry { tollgate zone=q burst=3 delay=1; tollgate_dry_run on;
                 add_header X-Status $tollgate_status always;
                 try_files /index.html =404; }
location /wcost { tollgate zone=fw cost=$arg_cost;
                  add_header X-Status $tollgate_status always;
                  add_header X-Remaining $tollgate_remaining always;
                  try_files /index.html =404; }
location /policy { tollgate zone=pa; tollgate zone=pb;
                   add_header X-Status $tollgate_status always;
                   try_files /index.html =404; }
location /slpolicy { tollgate zone=ps; tollgate zone=pt;
                     add_header X-Status $tollgate_status always;
                     try_files /index.html =404; }
location /qpolicy { tollgate zone=q burst=3 delay=1; tollgate zone=pw;
                    add_header X-Status $tollgate_status always;
                    try_files /index.html =404; }
location /qpdry { tollgate zone=q burst=3 delay=1; tollgate zone=pw;
                  tollgate_dry_run on;
                  add_header X-Status $tollgate_status always;
                  try_files /index.html =404; }
location /pw { tollgate zone=pw; add_header X-Remaining $tollgate_remaining
               always; try_files /index.html =404; }
location /pt { tollgate zone=pt; add_header X-Remaining $tollgate_remaining
               always; try_files /index.html =404; }
location /pb { tollgate zone=pb; add_header X-Remaining $tollgate_remaining
               always; try_files /index.html =404; }
location /tagged { tollgate zone=pc; tollgate zone=pd cost=$arg_cost;
                   add_header X-Status $tollgate_status always;
                   try_files /index.html =404; }
location /pd { tollgate zone=pd; add_header X-Remaining $tollgate_remaining
               always; try_files /index.html =404; }
location /cost { tollgate zone=c cost=$arg_cost;
                 add_header X-Status $tollgate_status always;
                 add_header X-Remaining $tollgate_remaining always;
                 add_header X-Retry $tollgate_retry_after always;
                 try_files /index.html =404; }
"""
        cls.hosts = [server(locs, zones), server(locs, zones)]

    @classmethod
    def tearDownClass(cls):
        for n in cls.hosts:
            n.stop()
        cls.redis.close()

    def test_exact_across_two_hosts(self):
        # per algorithm, 2 keys with a limit of 40; 8 threads, half on
        # each host, offer 120 requests per key: exactly 40 are admitted,
        # by all four workers together
        a_host, b_host = self.hosts
        for a in ALGORITHMS:
            for key in ("a", "b"):
                got, pids, errors = hammer(
                    self.hosts, "/%s?k=%s" % (a, key), 8, 15)
                self.assertEqual(errors, 0)
                self.assertEqual(got.count(200), 40, (a, key))
                self.assertEqual(got.count(429), 80, (a, key))
                self.assertEqual(len(pids), 2, pids)
            # and both hosts now refuse the key
            self.assertEqual(a_host.request("/%s?k=a" % a)[0], 429, a)
            self.assertEqual(b_host.request("/%s?k=a" % a)[0], 429, a)
            # in Redis, under the zone's name
            self.assertNotEqual(
                self.redis.cli("KEYS", "tg:ngx:%s:*" % a), "", a)

    def test_variables_headers_across_hosts(self):
        a, b = self.hosts
        got = [(a if i % 2 == 0 else b).request("/vars?k=v")
               for i in range(4)]
        self.assertEqual([g[0] for g in got], [200, 200, 200, 429])
        hs = [g[1] for g in got]
        self.assertEqual([h["x-status"] for h in hs],
                         ["PASSED", "PASSED", "PASSED", "REJECTED"])
        self.assertEqual([h["x-remaining"] for h in hs], ["2", "1", "0", "0"])
        self.assertEqual([h["x-retry"] for h in hs[:3]], ["0"] * 3)
        self.assertTrue(86000 < int(hs[3]["x-retry"]) <= 86400, hs[3])
        self.assertEqual(hs[0]["ratelimit-policy"], '"w";q=3;w=86400')
        self.assertTrue(hs[0]["ratelimit"].startswith('"w";r=2;t='), hs[0])
        self.assertNotIn("retry-after", hs[0])
        self.assertTrue(86000 < int(hs[3]["retry-after"]) <= 86400, hs[3])

    def test_status_and_legacy_headers(self):
        a, b = self.hosts
        self.assertEqual(statuses(a, "/status?k=s", 2) +
                         statuses(b, "/status?k=s", 2), [200, 200, 200, 503])
        st, h, _ = b.request("/legacy?k=l")
        self.assertEqual((st, h["ratelimit-remaining"]), (200, "2"))

    def test_dry_run(self):
        a, b = self.hosts
        got = [(a, b)[i % 2].request("/dry?k=d") for i in range(5)]
        self.assertEqual([g[0] for g in got], [200] * 5)
        self.assertEqual([g[1]["x-status"] for g in got],
                         ["PASSED"] * 3 + ["REJECTED_DRY_RUN"] * 2)
        self.assertNotIn("retry-after", got[4][1])
        self.assertTrue(got[4][1]["ratelimit"].startswith('"w";r=0;'))
        log = a.error_log() + b.error_log()
        self.assertIn('dry run: would reject request by zone "w"', log)

    def test_burst_nodelay_on_a_redis_zone(self):
        # burst=2 nodelay: 3 at once (limit_req's meaning), then refused
        a, b = self.hosts
        self.assertEqual(statuses(a, "/nodelay?k=n", 2) +
                         statuses(b, "/nodelay?k=n", 2), [200, 200, 200, 429])


    def test_delay_queue_across_two_hosts(self):
        # limit_req's queue on a Redis zone (one reservation per request):
        # 2r/s burst=3 delay=1, five requests 20 ms apart, alternating
        # hosts: the first and the first excess one pass at once, the next
        # two wait about 0.5 s and 1 s, the last is refused - what a
        # shared-memory zone (and limit_req) answers on one host
        self.queued_five("/queue?k=d")
        log = self.hosts[0].error_log() + self.hosts[1].error_log()
        self.assertIn('delaying request by zone "q"', log)
        # a dry run: decided and recorded, nobody waits or is refused
        self.queued_five_dry("/qdry?k=e")

    def queued_five(self, path):
        """Five requests 20 ms apart on both hosts through zone q's queue
        (2r/s burst=3 delay=1): two pass at once, two wait about 0.5 and
        1 s, the last is refused."""
        got = ngx.staggered(self.hosts, [path] * 5, gap=0.02)
        self.assertEqual([g[0] for g in got], [200, 200, 200, 200, 429], got)
        self.assertEqual([g[2] for g in got],
                         ["PASSED", "PASSED", "DELAYED", "DELAYED",
                          "REJECTED"], got)
        self.assertGreater(got[2][1], 0.35, got)
        self.assertGreater(got[3][1], 0.85, got)

    def queued_five_dry(self, path):
        """The same in a dry run: decided and recorded, nobody waits or
        is refused."""
        got = ngx.staggered(self.hosts, [path] * 5, gap=0.02)
        self.assertEqual([(g[0], g[2]) for g in got],
                         [(200, "PASSED")] * 2 +
                         [(200, "DELAYED_DRY_RUN")] * 2 +
                         [(200, "REJECTED_DRY_RUN")], got)

    def test_queue_in_a_policy_across_two_hosts(self):
        # a line that queues (2r/s burst=3 delay=1) and a window of 10 a
        # day in one location: one policy of reservations. Five requests
        # 20 ms apart on both hosts: two pass at once, two wait about 0.5
        # and 1 s, the last is refused and charges the window nothing
        a, b = self.hosts
        seen = [len(n.error_log()) for n in self.hosts]

        def new_log():  # what the hosts logged since `seen`
            return "".join(n.error_log()[k:] for n, k in zip(self.hosts,
                                                                seen))
        self.queued_five("/qpolicy?k=qp")
        log = new_log()
        # the line that queues is the one waited for, and refused by
        self.assertIn('delaying request by zone "q"', log)
        self.assertIn('rejecting request by zone "q"', log)
        self.assertNotIn('zone "pw"', log)
        self.assertNotIn("the request is", log)  # no store failure
        if MODULE:  # decided by the module (the waits as TG.STEPS's)
            self.assertIn("cmdstat_tg.steps:",
                          self.redis.cli("INFO", "commandstats"))
        st, h, _ = a.request("/pw?k=qp")
        self.assertEqual((st, h["x-remaining"]), (200, "5"))
        seen = [len(n.error_log()) for n in self.hosts]
        # a dry run: decided and recorded, nobody waits or is refused
        self.queued_five_dry("/qpdry?k=qe")
        st, h, _ = b.request("/pw?k=qe")
        self.assertEqual((st, h["x-remaining"]), (200, "5"))
        log = new_log()
        self.assertIn('would delay request by zone "q"', log)
        self.assertIn('would reject request by zone "q"', log)
        self.assertNotIn("the request is", log)

    def test_client_leaving_a_redis_delay(self):
        # 1r/m burst=1: the first request passes, the second would wait a
        # minute; its client leaves. Its slot is kept (a Redis zone's
        # reservation has no receipt to give back, as limit_req keeps
        # it), so a third is refused at once (a minute and more to wait),
        # and the worker goes on
        a, b = self.hosts
        st, h, _ = a.request("/slow?k=l")
        self.assertEqual((st, h["x-status"]), (200, "PASSED"))
        c = http.client.HTTPConnection("127.0.0.1", b.port, timeout=0.5)
        c.request("GET", "/slow?k=l")
        with self.assertRaises(socket.timeout):
            c.getresponse()
        c.close()
        time.sleep(0.3)
        st, h, _ = a.request("/slow?k=l")
        self.assertEqual((st, h["x-status"]), (429, "REJECTED"))
        self.assertIn('delaying request by zone "q1"', b.error_log())
        for n in self.hosts:
            self.assertEqual(n.request("/index.html")[0], 200)
            self.assertNotIn("[alert]", n.error_log())

    def test_costs_on_a_redis_zone(self):
        # as on a memory zone: a cost from a variable, 0 a peek, a cost
        # above the limit (or beyond 64 bits) "never" and nothing taken,
        # a value that is not a whole number the server's error
        a, b = self.hosts
        st, h, _ = a.request("/cost?k=c&cost=7")
        self.assertEqual((st, h["x-remaining"]), (200, "3"))
        st, h, _ = b.request("/cost?k=c&cost=0")
        self.assertEqual((st, h["x-status"], h["x-remaining"]),
                         (200, "PASSED", "3"))
        for cost in ("11", "99999999999999999999"):
            st, h, _ = b.request("/cost?k=c&cost=" + cost)
            self.assertEqual((st, h["x-status"], h["x-retry"]),
                             (429, "REJECTED", "never"), cost)
            self.assertNotIn("retry-after", h)
        st, h, _ = a.request("/cost?k=c")
        self.assertEqual((st, h["x-remaining"]), (200, "2"))
        self.assertEqual(a.request("/cost?k=c&cost=x")[0], 500)
        self.assertIn('cost "x" is not a whole number', a.error_log())


    def hammer_policy(self, path, admitted, second, remaining):
        """40 requests on a policy's location from 8 threads on both
        hosts: exactly `admitted` pass, and then the location of its second
        zone alone (which charges one more) says `remaining`."""
        got, _, errors = hammer(self.hosts, path, 8, 5)
        self.assertEqual(errors, 0)
        self.assertEqual(got.count(200), admitted, got)
        self.assertEqual(got.count(429), 40 - admitted, got)
        st, h, _ = self.hosts[0].request(second)
        self.assertEqual((st, h["x-remaining"]), (200, remaining))

    def test_two_limits_one_policy_across_two_hosts(self):
        # pa: 3 a day, pb: 5 a day; 40 requests on key h from 8 threads on
        # both hosts admit exactly 3, and pb is charged only for those 3
        self.hammer_policy("/policy?k=h", 3, "/pb?k=h", "1")
        a, b = self.hosts
        self.assertEqual(b.request("/pb?k=h")[0], 200)
        self.assertEqual(a.request("/pb?k=h")[0], 429)
        # the refusal names both limits in the header fields
        st, h, _ = b.request("/policy?k=h")
        self.assertEqual((st, h["x-status"]), (429, "REJECTED"))
        self.assertEqual(h["ratelimit-policy"],
                         '"pa";q=3;w=86400, "pb";q=5;w=86400')
        self.assertIn("retry-after", h)

    def test_sliding_log_in_a_policy_across_two_hosts(self):
        # ps: a sliding log of 30 a day, pt: a bucket of 40; 40 requests on
        # key s from 8 threads on both hosts admit exactly 30, and pt is
        # charged only for those 30
        self.hammer_policy("/slpolicy?k=s", 30, "/pt?k=s", "9")
        st, h, _ = self.hosts[1].request("/slpolicy?k=s")
        self.assertEqual((st, h["x-status"]), (429, "REJECTED"))
        self.assertIn("retry-after", h)
        for n in self.hosts:  # no store failure (a cut log: TG_ESTORE)
            log = n.error_log()
            self.assertNotIn('zone "ps": ', log)
            self.assertNotIn('zone "pt": ', log)

    def test_tagged_keys_and_a_refused_policy(self):
        # pc (leaky bucket, burst 2) first denies: pd (a window) is charged
        # only for what passed, whatever the denied call cost
        a, b = self.hosts
        got = [(a, b)[i % 2].request("/tagged?k=u&j=v&cost=1")[0]
               for i in range(4)]
        self.assertEqual(got, [200, 200, 429, 429])
        st, h, _ = a.request("/pd?j=v")
        self.assertEqual((st, h["x-remaining"]), (200, "7"))
        # a cost pd refuses: nothing charged in pc either (a new pc key)
        st, h, _ = b.request("/tagged?k=w&j=v&cost=9")
        self.assertEqual((st, h["x-status"]), (429, "REJECTED"))
        self.assertEqual(a.request("/tagged?k=w&j=v&cost=1")[0], 200)
        self.assertEqual(a.request("/tagged?k=w&j=v&cost=1")[0], 200)
        self.assertEqual(a.request("/tagged?k=w&j=v&cost=1")[0], 429)
        st, h, _ = a.request("/pd?j=v")
        self.assertEqual((st, h["x-remaining"]), (200, "4"))

    def test_long_tagged_keys_keep_their_slot(self):
        # keys longer than 256 bytes are shortened to a digest that keeps
        # the tag "t}": both lines' keys stay in one slot, one policy
        a = self.hosts[0]
        k, j = "k" * 300, "j" * 300
        got = [a.request("/tagged?k=%s&j=%s&cost=1" % (k, j))[0]
               for _ in range(3)]
        self.assertEqual(got, [200, 200, 429])
        self.assertNotIn("cannot be one policy", a.error_log())

    def test_refused_cost_is_not_counted_on_a_redis_fixed_window(self):
        # README: a Redis zone decides as a shared-memory one (TG_NB_RULE):
        # 8 of 10 taken, a cost of 3 refused and not counted, so a cost of
        # 2 still fits; a cost above the limit uses nothing up either
        a, b = self.hosts
        self.assertEqual(statuses(a, "/wcost?k=f&cost=4", 2), [200, 200])
        st, h, _ = b.request("/wcost?k=f&cost=3")
        self.assertEqual((st, h["x-status"], h["x-remaining"]),
                         (429, "REJECTED", "2"))
        st, h, _ = b.request("/wcost?k=f&cost=2")
        self.assertEqual((st, h["x-status"], h["x-remaining"]),
                         (200, "PASSED", "0"))
        self.assertEqual(a.request("/wcost?k=f&cost=1")[0], 429)
        self.assertEqual(a.request("/wcost?k=g&cost=11")[0], 429)
        self.assertEqual(statuses(b, "/wcost?k=g&cost=5", 2), [200, 200])


class Outage(unittest.TestCase):
    """Redis stopped (SIGSTOP), killed (SIGKILL) and started again."""

    def setUp(self):
        self.redis = Redis()
        store = "store=redis://127.0.0.1:%d timeout=200ms" % self.redis.port
        zones = ("tollgate_zone $arg_k zone=open algorithm=fixed_window_per_key"
                 " rate=1000/1d %s;\n"
                 "tollgate_zone $arg_k zone=closed algorithm=token_bucket"
                 " rate=1000r/d burst=1000 %s on_error=deny;\n"
                 "tollgate_zone $arg_k zone=slow algorithm=fixed_window_per_key"
                 " rate=1000/1d store=redis://127.0.0.1:%d timeout=3s;\n"
                 "tollgate_zone $arg_k zone=dflt algorithm=fixed_window_per_key"
                 " rate=1000/1d store=redis://127.0.0.1:%d;\n"
                 "tollgate_zone $arg_k zone=closedq algorithm=leaky_bucket"
                 " rate=1000r/d %s on_error=deny;\n"
                 % (store, store, self.redis.port, self.redis.port, store))
        locs = """
location /open { tollgate zone=open; add_header X-Status $tollgate_status always;
                 try_files /index.html =404; }
location /closed { tollgate zone=closed; tollgate_status 503;
                   add_header X-Status $tollgate_status always;
                   add_header X-Retry $tollgate_retry_after always;
                   try_files /index.html =404; }
location /dflt { tollgate zone=dflt; add_header X-Status $tollgate_status always;
                 try_files /index.html =404; }
location /slow { tollgate zone=slow; add_header X-Status $tollgate_status always;
                 try_files /index.html =404; }
location /dryq { tollgate zone=closed; tollgate zone=closedq burst=2;
                 tollgate_dry_run on;
                 add_header X-Status $tollgate_status always;
                 try_files /index.html =404; }
"""
        self.n = server(locs, zones, workers=1)

    def tearDown(self):
        self.n.stop()
        self.redis.close()

    def wait_decided(self, path, deadline_s=5):
        """Requests until Redis decides one again (PASSED)."""
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            st, h, _ = self.n.request(path)
            if h.get("x-status") == "PASSED":
                return True
            time.sleep(0.05)
        return False

    def test_stopped_redis_times_out_into_the_policy(self):
        n = self.n
        self.assertEqual(n.request("/open?k=a")[1]["x-status"], "PASSED")
        self.assertEqual(n.request("/closed?k=a")[1]["x-status"], "PASSED")
        self.redis.signal(signal.SIGSTOP)
        try:
            # the first waits the zone's timeout (200 ms), then on_error
            st, h, dt = timed(n, "/open?k=a")
            self.assertEqual((st, h["x-status"]), (200, "FAILED"))
            self.assertTrue(0.15 < dt < 2, dt)
            self.assertNotIn("ratelimit", h)  # no count to report
            # then the server is down: answered at once during the
            # backoff (100 ms, doubling while it stays down)
            st, h, dt = timed(n, "/open?k=b")
            self.assertEqual((st, h["x-status"]), (200, "FAILED"))
            self.assertTrue(dt < 0.15, dt)  # a probe would take 0.2 s
            st, h, dt = timed(n, "/closed?k=a")
            self.assertEqual((st, h["x-status"]), (503, "FAILED"))
            self.assertTrue(0.15 < dt < 2, dt)
            # never a request hanging: ten in a row, each within ~timeout
            t = time.monotonic()
            for _ in range(10):
                self.assertEqual(n.request("/closed?k=c")[0], 503)
            self.assertTrue(time.monotonic() - t < 5)
            self.assertIn("did not answer within 200 ms", n.error_log())
            # timeout= defaults to 100 ms
            st, h, dt = timed(n, "/dflt?k=a")
            self.assertEqual((st, h["x-status"]), (200, "FAILED"))
            self.assertIn('zone "dflt": redis://127.0.0.1:%d did not answer '
                          'within 100 ms' % self.redis.port, n.error_log())
        finally:
            self.redis.signal(signal.SIGCONT)
        # back: decided by Redis again after the backoff (at most 1 s)
        self.assertTrue(self.wait_decided("/open?k=d"))
        self.assertTrue(self.wait_decided("/closed?k=d"))

    def test_killed_redis_then_restarted(self):
        n = self.n
        self.assertEqual(n.request("/open?k=a")[1]["x-status"], "PASSED")
        self.redis.kill()
        for _ in range(3):
            st, h, dt = timed(n, "/open?k=a")
            self.assertEqual((st, h["x-status"]), (200, "FAILED"))
            self.assertTrue(dt < 1, dt)
            st, h, dt = timed(n, "/closed?k=a")
            self.assertEqual((st, h["x-status"]), (503, "FAILED"))
            self.assertTrue(dt < 1, dt)
            # on_error=deny: $tollgate_retry_after is one period (a day
            # here), and no fields (no count to report)
            self.assertEqual(h["x-retry"], "86400")
            for name in ("retry-after", "ratelimit", "ratelimit-policy"):
                self.assertNotIn(name, h)
            # a dry run refuses nothing, a failure denied by on_error=deny
            # included, also in a policy with a line that queues (it used
            # to answer 429 there)
            st, h, dt = timed(n, "/dryq?k=a")
            self.assertEqual((st, h["x-status"]), (200, "FAILED"))
        self.assertIn('zone "closed": cannot reach the store', n.error_log())
        self.redis.start()  # the same port, empty
        self.assertTrue(self.wait_decided("/open?k=b"))
        self.assertTrue(self.wait_decided("/closed?k=b"))
        st, h, _ = n.request("/open?k=b")
        self.assertEqual((st, h["x-status"]), (200, "PASSED"))

    def test_request_ending_while_redis_decides(self):
        # Redis stopped, a 3 s timeout: clients that send a request and
        # leave while it is pending; the worker must survive them and the
        # answers that come later must be dropped, not applied
        n = self.n
        self.assertEqual(n.request("/slow?k=a")[0], 200)
        pids = n.worker_pids()
        self.redis.signal(signal.SIGSTOP)
        try:
            for _ in range(5):
                c = socket.create_connection(("127.0.0.1", n.port))
                c.sendall(b"GET /slow?k=a HTTP/1.1\r\nHost: x\r\n\r\n")
                time.sleep(0.05)
                c.close()
            time.sleep(0.3)  # nginx has seen them go
        finally:
            self.redis.signal(signal.SIGCONT)
        st, h, _ = n.request("/slow?k=a")
        self.assertEqual((st, h["x-status"]), (200, "PASSED"))
        time.sleep(0.2)
        self.assertEqual(n.worker_pids(), pids)
        log = n.error_log()
        self.assertEqual(log.count('zone "slow": an answer for a request '
                                   'that has ended is dropped'), 5, log)
        self.assertNotIn("exited on signal", log)
        self.assertNotIn("[alert]", log)


class Reload(unittest.TestCase):
    def test_reload_keeps_counts_and_leaves_no_connection(self):
        redis = Redis()
        conf = ("tollgate_zone $arg_k zone=r algorithm=fixed_window_per_key "
                "rate=10/1d store=redis://127.0.0.1:%d;\n" % redis.port)
        body = ("location / { tollgate zone=r; %s"
                "add_header X-Remaining $tollgate_remaining always; "
                "try_files /index.html =404; }")
        n = server(body % "", conf)
        try:
            remaining = []
            for i in range(4):
                remaining.append(int(n.request("/?k=a")[1]["x-remaining"]))
                for _ in range(4):  # let both workers connect
                    n.request("/?k=other%d" % i)
                self.assertTrue(n.reload(conf + "server { listen "
                                         "127.0.0.1:PORT; %s }" %
                                         (body % ("tollgate_status %d; "
                                                  % (429 + i % 2)))))
            self.assertEqual(remaining, [9, 8, 7, 6])
            # old workers closed theirs: at most one per live worker
            deadline = time.monotonic() + 10
            while redis.clients() > 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            self.assertLessEqual(redis.clients(), 2)
            self.assertNotIn("open socket", n.error_log())
        finally:
            n.stop()
            redis.close()


class Transports(unittest.TestCase):
    def test_unix_socket_and_password(self):
        redis = Redis(password="s3cret")
        zones = ("tollgate_zone $arg_k zone=u algorithm=sliding_window "
                 "rate=2/1d store=redis+unix:%s password=s3cret;\n"
                 "tollgate_zone $arg_k zone=bad algorithm=sliding_window "
                 "rate=2/1d store=redis://127.0.0.1:%d password=wrong;\n"
                 % (redis.sock, redis.port))
        locs = """
location /u { tollgate zone=u; add_header X-Status $tollgate_status always;
              try_files /index.html =404; }
location /bad { tollgate zone=bad; add_header X-Status $tollgate_status always;
                try_files /index.html =404; }
"""
        n = server(locs, zones, workers=1)
        try:
            self.assertEqual(statuses(n, "/u?k=a", 3), [200, 200, 429])
            self.assertNotEqual(redis.cli("KEYS", "tg:ngx:u:*"), "")
            # a refused AUTH: the policy answers (allow), and it is logged
            st, h, _ = n.request("/bad?k=a")
            self.assertEqual((st, h["x-status"]), (200, "FAILED"))
            self.assertRegex(n.error_log(), r'\[error\] .*tollgate: zone '
                             r'"bad": .*the request is let through')
            # and the log says why (the server's refusal of AUTH)
            self.assertRegex(n.error_log(), r'tollgate: zone "bad": .*'
                             r'AUTH or SELECT was refused: .*')
        finally:
            n.stop()
            redis.close()


    def test_database(self):
        # redis://HOST:PORT/DB: the keys are in that database, not in 0
        redis = Redis()
        zones = ("tollgate_zone $arg_k zone=d3 algorithm=fixed_window_per_key"
                 " rate=2/1d store=redis://127.0.0.1:%d/3;\n" % redis.port)
        n = server("location / { tollgate zone=d3;"
                   " try_files /index.html =404; }", zones, workers=1)
        try:
            self.assertEqual(statuses(n, "/?k=a", 3), [200, 200, 429])
            self.assertNotEqual(redis.cli("-n", "3", "KEYS", "tg:ngx:d3:*"),
                                "")
            self.assertEqual(redis.cli("KEYS", "tg:ngx:d3:*"), "")
        finally:
            n.stop()
            redis.close()

    def closing_server(self, reply):
        # something that accepts, answers `reply` to the first bytes (b"":
        # nothing) and closes, before answering any decision: taken as
        # down (on_error answers, quickly), not connected to again and
        # again while the request waits
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(64)
        accepted = [0]
        stop = threading.Event()

        def serve():
            lsock.settimeout(0.1)
            while not stop.is_set():
                try:
                    c, _ = lsock.accept()
                except OSError:
                    continue
                accepted[0] += 1
                if reply:
                    try:
                        c.settimeout(1)
                        c.recv(65536)
                        c.sendall(reply)
                    except OSError:
                        pass
                c.close()
        t = threading.Thread(target=serve)
        t.start()
        zones = ("tollgate_zone $arg_k zone=c algorithm=fixed_window rate=2/1d"
                 " store=redis://127.0.0.1:%d;\n" % lsock.getsockname()[1])
        locs = ("location / { tollgate zone=c; add_header X-Status "
                "$tollgate_status always; try_files /index.html =404; }")
        n = server(locs, zones, workers=1)
        try:
            for _ in range(5):
                st, h, dt = timed(n, "/?k=a")
                self.assertEqual((st, h["x-status"]), (200, "FAILED"))
                self.assertTrue(dt < 1, dt)
            time.sleep(0.5)
            # one connection per backoff at most (100, 200, 400 ms...)
            self.assertLess(accepted[0], 10, accepted[0])
            self.assertIn("ended before answering a decision", n.error_log())
        finally:
            n.stop()
            stop.set()
            t.join()
            lsock.close()

    def test_server_that_closes_at_once(self):
        self.closing_server(b"")

    def test_server_that_answers_the_handshake_then_closes(self):
        # a valid reply to the first handshake command (COMMAND INFO),
        # then the end: a reply, but no decision answered
        self.closing_server(b"*1\r\n*-1\r\n")


class ConfigErrors(unittest.TestCase):
    def expect(self, http, message):
        rc, out = ngx.check(http)
        self.assertNotEqual(rc, 0, out)
        self.assertIn(message, out)

    def test_messages(self):
        z = ("tollgate_zone $arg_k zone=r algorithm=token_bucket rate=1r/s "
             "store=redis://127.0.0.1:6379;\n"
             "tollgate_zone $arg_k zone=m:1m algorithm=token_bucket "
             "rate=1r/s;\n")
        ok = z + ("server { listen 127.0.0.1:PORT; location / { tollgate "
                  "zone=r burst=5 nodelay; } }")
        rc, out = ngx.check(ok)
        self.assertEqual(rc, 0, out)
        # HOST is resolved when the configuration is read
        rc, out = ngx.check("tollgate_zone $arg_k zone=x algorithm="
                            "token_bucket rate=1r/s store=redis://localhost;")
        self.assertEqual(rc, 0, out)
        self.expect("tollgate_zone $arg_k zone=x algorithm=token_bucket "
                    "rate=1r/s store=redis://no-such-host.invalid;",
                    'invalid "store=redis://no-such-host.invalid": host not '
                    'found')
        # a size on a Redis zone: no shared memory, ignored (even one too
        # small for a shared-memory zone)
        rc, out = ngx.check(z.replace("zone=r ", "zone=r:10m ") + ok[len(z):])
        self.assertEqual(rc, 0, out)
        rc, out = ngx.check(z.replace("zone=r ", "zone=r:1k ") + ok[len(z):])
        self.assertEqual(rc, 0, out)
        # several Redis lines in one location: one policy, on one store
        z += ("tollgate_zone $arg_k zone=r2 algorithm=fixed_window "
              "rate=1/1m store=redis://127.0.0.1:6379;\n"
              "tollgate_zone $arg_k zone=s algorithm=sliding_window "
              "rate=1/1m store=redis://127.0.0.1:6379;\n"
              "tollgate_zone $arg_k zone=o algorithm=fixed_window "
              "rate=1/1m store=redis://127.0.0.1:6380;\n"
              "tollgate_zone $arg_j zone=j algorithm=fixed_window "
              "rate=1/1m store=redis://127.0.0.1:6379;\n"
              "tollgate_zone $arg_k zone=rq algorithm=token_bucket "
              "rate=1r/s store=redis://127.0.0.1:6379;\n"
              "tollgate_zone b}$arg_j zone=tc algorithm=fixed_window "
              "rate=1/1m store=redis://127.0.0.1:6379;\n"
              "tollgate_zone ${arg_k}}x zone=va algorithm=fixed_window "
              "rate=1/1m store=redis://127.0.0.1:6379;\n"
              "tollgate_zone ${arg_j}}x zone=vb algorithm=fixed_window "
              "rate=1/1m store=redis://127.0.0.1:6379;\n"
              "tollgate_zone a}$arg_k zone=ta algorithm=fixed_window "
              "rate=1/1m store=redis://127.0.0.1:6379;\n"
              "tollgate_zone a}$arg_j zone=tb algorithm=token_bucket "
              "rate=1r/s store=redis://127.0.0.1:6379;\n")
        for body in ("tollgate zone=r; tollgate zone=r2 cost=0;",
                     "tollgate zone=s; tollgate zone=r;",
                     "tollgate zone=rq burst=5; tollgate zone=r2;",
                     "tollgate zone=rq burst=5 delay=2; tollgate zone=r;",
                     "tollgate zone=ta; tollgate zone=tb; "
                     "tollgate_dry_run on;"):
            rc, out = ngx.check(z + "server { listen 127.0.0.1:PORT; "
                                "location / { %s } }" % body)
            self.assertEqual(rc, 0, out)
        # the refusals name the zone and the line
        for line, message in (
                ("tollgate zone=m;", "lines on a Redis zone and on a "
                 "shared-memory zone cannot be one policy"),
                ("tollgate zone=o;", "the Redis zones of one location must "
                 "have the same store="),
                ("tollgate zone=j;", "must fall in one Redis Cluster slot")):
            rc, out, where = ngx.check_line(
                z + "server {\n listen 127.0.0.1:PORT;\n location / {\n"
                "  tollgate zone=r;\n  %s # HERE\n }\n}\n" % line,
                "# HERE")
            self.assertNotEqual(rc, 0, out)
            self.assertIn(message, out)
            self.assertIn(where, out)

        def loc(body):
            return z + "server { listen 127.0.0.1:PORT; location / { %s } }" \
                % body
        # tags must be the same literal text: "a}" and "b}" differ, and the
        # "}" of "${arg_k}" is a variable's, not a tag
        for body in ("tollgate zone=ta; tollgate zone=tc;",
                     "tollgate zone=va; tollgate zone=vb;"):
            self.expect(loc(body), "must fall in one Redis Cluster slot")
        self.expect(loc("tollgate zone=m; tollgate zone=r nodelay;"),
                    'tollgate: zone "r": lines on a Redis zone and on a '
                    'shared-memory zone cannot be one policy')
        # limit_req's queue on a Redis zone: one reservation
        for body in ("tollgate zone=r burst=5;",
                     "tollgate zone=r burst=5 delay=2;"):
            rc, out = ngx.check(loc(body))
            self.assertEqual(rc, 0, out)
        cases = [
            ("store=redis:/x", 'tollgate_zone: invalid "store=redis:/x"'),
            ("store=memcached://h", "invalid \"store=memcached://h\""),
            ("store=redis://127.0.0.1:0", 'invalid "store=redis://127.0.0.1:0"'),
            ("store=redis://127.0.0.1:6379/x",
             'tollgate_zone: invalid database in "store=redis://'),
            ("store=redis://127.0.0.1 timeout=0",
             'tollgate_zone: invalid timeout "0"'),
            ("store=redis://127.0.0.1 on_error=maybe",
             'tollgate_zone: invalid "on_error=maybe"'),
        ]
        # a Cluster: seeds HOST:PORT, resolved when read (not connected)
        rc, out = ngx.check("tollgate_zone $arg_k zone=x algorithm="
                            "token_bucket rate=1r/s store=redis-cluster://127.0.0.1:7000,"
                            "localhost:7001 password=p timeout=50ms;")
        self.assertEqual(rc, 0, out)
        cases += [
            ("store=redis-cluster://127.0.0.1",
             'invalid seed "127.0.0.1" in "store=redis-cluster://127.0.0.1"'
             ' (redis-cluster://HOST:PORT[,HOST:PORT...]): a port is needed'),
            ("store=redis-cluster://127.0.0.1:7000,no-such-host.invalid:7001",
             'invalid seed "no-such-host.invalid:7001"'),
            ("store=redis-cluster://127.0.0.1:7000/1",
             'invalid seed "127.0.0.1:7000/1"'),
            ("store=redis-cluster://127.0.0.1:7000,",
             'invalid seed "" in "store=redis-cluster://127.0.0.1:7000,"'
             ' (redis-cluster://HOST:PORT[,HOST:PORT...]): empty'),
            ("store=redis://127.0.0.1 store=redis-cluster://127.0.0.1:7000",
             'tollgate_zone: "store=" is given twice'),
            ("store=redis-cluster://unix:/tmp/r.sock",
             "a Cluster is reached by TCP"),
            ("store=redis-cluster://", 'invalid "store=redis-cluster://"'),
        ]
        cz = ("tollgate_zone $arg_k zone=c algorithm=token_bucket rate=1r/s "
              "store=redis-cluster://127.0.0.1:7000;\n")
        self.expect(cz + z + "server { listen 127.0.0.1:PORT; location / { "
                    "tollgate zone=c; tollgate zone=r; } }",
                    'tollgate: zone "r": the Redis zones of one location '
                    'must have the same store=')
        for args, message in cases:
            self.expect("tollgate_zone $a zone=x algorithm=token_bucket "
                        "rate=1r/s %s;" % args, message)
        # Redis options on a shared-memory zone
        self.expect("tollgate_zone $a zone=x:1m rate=1r/s on_error=deny;",
                    '"on_error=" are for a zone with "store=redis://...')
        # a shared-memory zone still needs its size
        self.expect("tollgate_zone $a zone=x rate=1r/s;",
                    'tollgate_zone: invalid zone size in "zone=x"')


if __name__ == "__main__":
    unittest.main(verbosity=2)
