# SPDX-License-Identifier: MIT
"""test_nginx.py - ngx_http_tollgate_module inside Debian's real nginx
(ngx.py starts it on a free loopback port in a private prefix and always
stops it).

Every directive and every algorithm, the header fields, the status, the
dry run, costs (fixed and from a variable), several limits in one location,
`nginx -t` messages, exactness with two workers and concurrent clients, a
worker SIGKILLed mid-traffic, counts kept by `nginx -s reload`, and the same
request sequence through limit_req and through tollgate's leaky bucket.
"""
import os
import re
import signal
import subprocess
import socket
import threading
import time
import unittest

import ngx

ALGORITHMS = ["fixed_window", "fixed_window_per_key", "sliding_window",
              "token_bucket", "leaky_bucket"]


def server(body, zones="", **kw):
    return ngx.Nginx("%s\nserver { listen 127.0.0.1:PORT; %s }"
                     % (zones, body), **kw)


def statuses(n, path, count):
    return [n.request(path)[0] for _ in range(count)]


class Algorithms(unittest.TestCase):
    def test_every_algorithm_admits_its_limit_then_429(self):
        # rates slow enough that nothing refills during the test: the
        # windows are per day (fixed windows are aligned to the epoch, a
        # day boundary during the test is the only way this could flake,
        # and it would show as 3 more 200s), the buckets refill one per
        # 8 hours.
        zones = "".join(
            "tollgate_zone $arg_k zone=%s:1m algorithm=%s rate=%s;\n"
            % (a, a, "3/1d" if "bucket" not in a else "3r/d burst=3")
            for a in ALGORITHMS)
        locs = "".join(
            "location /%s { tollgate zone=%s; try_files /index.html =404; }\n"
            % (a, a) for a in ALGORITHMS)
        n = server(locs, zones)
        try:
            for a in ALGORITHMS:
                got = statuses(n, "/%s?k=x" % a, 5)
                self.assertEqual(got, [200, 200, 200, 429, 429], a)
                # another key is limited on its own
                self.assertEqual(n.request("/%s?k=y" % a)[0], 200, a)
                # an empty key is not limited (as limit_req)
                self.assertEqual(statuses(n, "/%s" % a, 5), [200] * 5, a)
        finally:
            n.stop()


class Directives(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        zones = """
tollgate_zone $arg_k zone=w:1m algorithm=fixed_window_per_key rate=3/1d;
tollgate_zone $arg_k zone=big:1m algorithm=fixed_window_per_key rate=5/1d;
tollgate_zone $arg_k zone=tb:1m algorithm=token_bucket rate=10r/d burst=10;
tollgate_zone $arg_k zone=lb:1m algorithm=leaky_bucket rate=1r/d;
tollgate_zone $arg_k zone=tbd:1m algorithm=token_bucket rate=3r/d;
tollgate_zone $arg_k zone=lbd:1m algorithm=leaky_bucket rate=3r/d;
tollgate_zone $arg_k zone=one:1m algorithm=leaky_bucket rate=3r/d;
tollgate_zone $arg_k zone=dl1:1m algorithm=leaky_bucket rate=2r/s;
tollgate_zone $arg_k zone=dl2:1m algorithm=leaky_bucket rate=2r/s;
tollgate_zone $arg_k zone=ten:10m rate=1/1d;
tollgate_zone $arg_k zone=r1:1m rate=10r/s;
tollgate_zone $arg_k zone=r2:1m rate=600r/m;
tollgate_zone $arg_k zone=r3:1m rate=5r/h;
tollgate_zone $arg_k zone=r4:1m rate=100r/d;
tollgate_zone $arg_k zone=r5:1m rate=1000/15m;
tollgate_zone $arg_k zone=r6:1m rate=100/30s;
tollgate_zone $arg_k zone=ek:1m algorithm=fixed_window_per_key rate=3/1d;
tollgate_zone $arg_ip zone=fb:1m algorithm=fixed_window_per_key rate=1/1d;
tollgate_zone $arg_ip zone=fb2:1m algorithm=fixed_window_per_key rate=1/1d;
"""
        locs = """
location /on { tollgate zone=w; try_files /index.html =404; }
location /legacy { tollgate zone=w; tollgate_headers legacy;
                   try_files /index.html =404; }
location /off { tollgate zone=w; tollgate_headers off;
                try_files /index.html =404; }
location /status { tollgate zone=w; tollgate_status 503;
                   try_files /index.html =404; }
location /dry { tollgate zone=w; tollgate_dry_run on;
                add_header X-Status $tollgate_status always;
                try_files /index.html =404; }
location /vars { tollgate zone=w;
                 add_header X-Status $tollgate_status always;
                 add_header X-Remaining $tollgate_remaining always;
                 add_header X-Retry $tollgate_retry_after always;
                 try_files /index.html =404; }
location /cost4 { tollgate zone=tb cost=4; try_files /index.html =404; }
location /costvarw { tollgate zone=big cost=$arg_cost;
                     add_header X-Status $tollgate_status always;
                     add_header X-Remaining $tollgate_remaining always;
                     add_header X-Retry $tollgate_retry_after always;
                     try_files /index.html =404; }
location /costvar { tollgate zone=tb cost=$arg_cost;
                    add_header X-Status $tollgate_status always;
                    add_header X-Remaining $tollgate_remaining always;
                    add_header X-Retry $tollgate_retry_after always;
                    try_files /index.html =404; }
location /two { tollgate zone=w; tollgate zone=big;
                try_files /index.html =404; }
location /twocost { tollgate zone=w; tollgate zone=big cost=$arg_cost;
                    try_files /index.html =404; }
location /big { tollgate zone=big;
                add_header X-Remaining $tollgate_remaining always;
                try_files /index.html =404; }
location /dryq { tollgate zone=lb burst=1; tollgate_dry_run on;
                 add_header X-Status $tollgate_status always;
                 try_files /index.html =404; }
location /dryq2 { tollgate zone=lb burst=1; tollgate zone=w;
                  tollgate_dry_run on;
                  add_header X-Status $tollgate_status always;
                  try_files /index.html =404; }
location /level { tollgate zone=w; tollgate_log_level info;
                  try_files /index.html =404; }
location /redir { tollgate zone=w; try_files /nope @named; }
location @named { tollgate zone=w;
                  add_header X-Remaining $tollgate_remaining always;
                  try_files /index.html =404; }
location /twor { tollgate zone=big; tollgate zone=w;
                 add_header X-Remaining $tollgate_remaining always;
                 try_files /index.html =404; }
location /tbd { tollgate zone=tbd; try_files /index.html =404; }
location /lbd { tollgate zone=lbd; try_files /index.html =404; }
location /tbdn { tollgate zone=tbd nodelay; try_files /index.html =404; }
location /lbdd { tollgate zone=lbd delay=3; try_files /index.html =404; }
location /zero { tollgate zone=one burst=0; try_files /index.html =404; }
location /dlerr { tollgate zone=dl1 burst=1; try_files /index.html =404; }
location /dlwarn { tollgate zone=dl2 burst=1; tollgate_log_level warn;
                   try_files /index.html =404; }
location /ret { tollgate zone=w; return 200 "r\n"; }
location /rate/1 { tollgate zone=r1; try_files /index.html =404; }
location /rate/2 { tollgate zone=r2; try_files /index.html =404; }
location /rate/3 { tollgate zone=r3; try_files /index.html =404; }
location /rate/4 { tollgate zone=r4; try_files /index.html =404; }
location /rate/5 { tollgate zone=r5; try_files /index.html =404; }
location /rate/6 { tollgate zone=r6; try_files /index.html =404; }
location /emptyk { tollgate zone=ek; try_files /nope @fallback; }
location @fallback { tollgate zone=fb; try_files /index.html =404; }
location /badcost { tollgate zone=ek cost=$arg_c;
                    error_page 500 = @fallback2; try_files /index.html =404; }
location @fallback2 { tollgate zone=fb2; try_files /index.html =404; }
location /free { try_files /index.html =404;
                 add_header X-Status "[$tollgate_status]" always; }
"""
        cls.n = server(locs, zones)

    @classmethod
    def tearDownClass(cls):
        cls.n.stop()

    def test_headers_on(self):
        n = self.n
        st, h, _ = n.request("/on?k=h1")
        self.assertEqual(st, 200)
        self.assertEqual(h["ratelimit-policy"], '"w";q=3;w=86400')
        self.assertTrue(h["ratelimit"].startswith('"w";r=2;t='), h)
        self.assertNotIn("retry-after", h)
        n.request("/on?k=h1")
        n.request("/on?k=h1")
        st, h, _ = n.request("/on?k=h1")
        self.assertEqual(st, 429)
        self.assertTrue(h["ratelimit"].startswith('"w";r=0;t='), h)
        retry = int(h["retry-after"])
        self.assertTrue(86000 < retry <= 86400, retry)

    def test_headers_legacy(self):
        st, h, _ = self.n.request("/legacy?k=h2")
        self.assertEqual(st, 200)
        self.assertEqual(h["ratelimit-limit"], "3")
        self.assertEqual(h["ratelimit-remaining"], "2")
        self.assertIn("ratelimit-reset", h)
        self.assertNotIn("ratelimit", h)
        self.assertNotIn("ratelimit-policy", h)
        self.assertNotIn("retry-after", h)
        # a refusal: Retry-After too
        self.n.request("/legacy?k=h2")
        self.n.request("/legacy?k=h2")
        st, h, _ = self.n.request("/legacy?k=h2")
        self.assertEqual((st, h["ratelimit-remaining"]), (429, "0"))
        self.assertTrue(86000 < int(h["retry-after"]) <= 86400, h)
        self.assertTrue(86000 < int(h["ratelimit-reset"]) <= 86400, h)

    def test_headers_off(self):
        for _ in range(4):
            st, h, _ = self.n.request("/off?k=h3")
        self.assertEqual(st, 429)
        for name in ("ratelimit", "ratelimit-policy", "retry-after",
                     "ratelimit-limit"):
            self.assertNotIn(name, h)

    def test_status(self):
        self.assertEqual(statuses(self.n, "/status?k=s", 4),
                         [200, 200, 200, 503])

    def test_dry_run(self):
        got = [self.n.request("/dry?k=d") for _ in range(5)]
        self.assertEqual([g[0] for g in got], [200] * 5)
        self.assertEqual([g[1]["x-status"] for g in got],
                         ["PASSED"] * 3 + ["REJECTED_DRY_RUN"] * 2)
        # headers are still sent; no Retry-After, since nothing is refused
        self.assertTrue(got[4][1]["ratelimit"].startswith('"w";r=0;'))
        self.assertNotIn("retry-after", got[4][1])
        self.assertIn("dry run: would reject request by zone \"w\"",
                      self.n.error_log())

    def test_dry_run_of_a_queue(self):
        # burst=1 at 1 per day: the first passes, the second would wait a
        # day (DELAYED_DRY_RUN, let through at once), the third would be
        # refused; no Retry-After for either
        got = [self.n.request("/dryq?k=q") for _ in range(3)]
        self.assertEqual([g[0] for g in got], [200] * 3)
        self.assertEqual([g[1]["x-status"] for g in got],
                         ["PASSED", "DELAYED_DRY_RUN", "REJECTED_DRY_RUN"])
        for g in got:
            self.assertNotIn("retry-after", g[1])

    def test_dry_run_of_two_lines_one_queue(self):
        # as test_dry_run_of_a_queue, with a window beside the queue: the
        # would-be refusal (by lb) charges w nothing, the would-be delay
        # charges both
        got = [self.n.request("/dryq2?k=q2") for _ in range(3)]
        self.assertEqual([g[0] for g in got], [200] * 3)
        self.assertEqual([g[1]["x-status"] for g in got],
                         ["PASSED", "DELAYED_DRY_RUN", "REJECTED_DRY_RUN"])
        for g in got:
            self.assertNotIn("retry-after", g[1])
        self.assertIn("dry run: would delay request by zone \"lb\"",
                      self.n.error_log())
        self.assertEqual(statuses(self.n, "/on?k=q2", 2), [200, 429])

    def test_variables(self):
        got = [self.n.request("/vars?k=v")[1] for _ in range(4)]
        self.assertEqual([h["x-status"] for h in got],
                         ["PASSED", "PASSED", "PASSED", "REJECTED"])
        self.assertEqual([h["x-remaining"] for h in got],
                         ["2", "1", "0", "0"])
        self.assertEqual([h["x-retry"] for h in got[:3]], ["0"] * 3)
        self.assertTrue(86000 < int(got[3]["x-retry"]) <= 86400)
        # outside any tollgate location the variables are empty
        self.assertEqual(self.n.request("/free")[1]["x-status"], "[]")

    def test_empty_key_is_not_limited(self):
        # no key: passed, unlimited, no fields, and no numbers to report
        for _ in range(5):
            st, h, _ = self.n.request("/vars")
            self.assertEqual((st, h["x-status"]), (200, "PASSED"))
            for name in ("x-remaining", "x-retry", "ratelimit",
                         "ratelimit-policy", "retry-after"):
                self.assertNotIn(name, h)

    def test_long_keys_are_limited_by_their_digest(self):
        # keys over 256 bytes: limited, and by all their bytes (two that
        # differ only past byte 256 are two keys; a digest is not the key
        # of the same 256-byte prefix)
        long_a, long_b, prefix = "x" * 299 + "a", "x" * 299 + "b", "x" * 256
        got = [self.n.request("/vars?k=" + long_a) for _ in range(4)]
        self.assertEqual([g[0] for g in got], [200, 200, 200, 429])
        self.assertEqual([g[1]["x-remaining"] for g in got],
                         ["2", "1", "0", "0"])
        for other in (long_b, prefix):
            st, h, _ = self.n.request("/vars?k=" + other)
            self.assertEqual((st, h["x-remaining"]), (200, "2"), len(other))

    def test_rates_and_the_default_algorithm(self):
        # each spelling of rate= is the quota the RateLimit-Policy reports;
        # a zone without algorithm= is a fixed_window
        for i, policy in [(1, "q=10;w=1"), (2, "q=600;w=60"),
                          (3, "q=5;w=3600"), (4, "q=100;w=86400"),
                          (5, "q=1000;w=900"), (6, "q=100;w=30")]:
            st, h, _ = self.n.request("/rate/%d?k=rt" % i)
            self.assertEqual((st, h["ratelimit-policy"]),
                             (200, '"r%d";%s' % (i, policy)))
        self.assertIn('tollgate_zone "r1": fixed_window, room for',
                      self.n.error_log())

    def test_ten_megabytes_hold_about_86900_keys(self):
        m = re.search(r'tollgate_zone "ten": fixed_window, room for (\d+) '
                      r'keys', self.n.error_log())
        self.assertTrue(m, self.n.error_log()[-2000:])
        self.assertTrue(86000 <= int(m.group(1)) <= 88000, m.group(1))

    def test_bucket_burst_defaults_to_the_limit(self):
        # rate=3r/d and no burst=: a bucket of 3, with nodelay or delay=
        # alone on the line too (they made it a bucket of one)
        for loc in ("tbd", "lbd", "tbdn", "lbdd"):
            self.assertEqual(statuses(self.n, "/%s?k=b%s" % (loc, loc), 5),
                             [200, 200, 200, 429, 429], loc)

    def test_burst_zero_is_limit_reqs_one_per_interval(self):
        # the zone's bucket holds 3, the line's burst=0 makes it one
        # request per interval (limit_req without burst): one, then 429
        self.assertEqual(statuses(self.n, "/zero?k=z", 3), [200, 429, 429])

    def test_return_answers_before_any_limit(self):
        self.assertEqual(statuses(self.n, "/ret?k=ret", 5), [200] * 5)

    def test_default_log_levels_and_delays_one_lower(self):
        # three requests 20 ms apart at 2r/s burst=1: one passes, one
        # waits ~480 ms, one is refused; the refusal is logged at the
        # location's level (error by default, warn here), the delay one
        # level lower (warn, notice)
        for loc, zone, refuse, delay in [("dlerr", "dl1", "error", "warn"),
                                         ("dlwarn", "dl2", "warn",
                                          "notice")]:
            got = ngx.staggered(self.n, ["/%s?k=l" % loc] * 3, gap=0.02)
            self.assertEqual(sorted(g[0] for g in got), [200, 200, 429],
                             (loc, got))
            log = self.n.error_log()
            self.assertRegex(log, r'\[%s\] .*tollgate: rejecting request by '
                             r'zone "%s"' % (refuse, zone))
            self.assertRegex(log, r'\[%s\] .*tollgate: delaying request by '
                             r'zone "%s"' % (delay, zone))

    def test_fixed_cost(self):
        # 10 tokens, 4 per request: 2 pass, the third finds 2
        self.assertEqual(statuses(self.n, "/cost4?k=c", 3), [200, 200, 429])

    def test_cost_from_variable(self):
        n = self.n
        st, h, _ = n.request("/costvar?k=cv&cost=7")
        self.assertEqual((st, h["x-remaining"]), (200, "3"))
        self.assertEqual(n.request("/costvar?k=cv&cost=4")[0], 429)
        st, h, _ = n.request("/costvar?k=cv&cost=3")
        self.assertEqual((st, h["x-remaining"]), (200, "0"))
        # cost 0 is a peek
        self.assertEqual(n.request("/costvar?k=cv&cost=0")[0], 200)
        st, h, _ = n.request("/costvar?k=cv4&cost=2")
        self.assertEqual((st, h["x-remaining"]), (200, "8"))
        st, h, _ = n.request("/costvar?k=cv4&cost=0")
        self.assertEqual((st, h["x-status"], h["x-remaining"]),
                         (200, "PASSED", "8"))
        self.assertEqual(n.request("/costvar?k=cv4")[1]["x-remaining"], "7")
        # an empty value is the default cost, 1
        st, h, _ = n.request("/costvar?k=cv3")
        self.assertEqual((st, h["x-remaining"]), (200, "9"))
        # a cost that is not a number is the server's error, and logged
        self.assertEqual(n.request("/costvar?k=cv2&cost=abc")[0], 500)
        self.assertIn('cost "abc" is not a whole number', n.error_log())
        for bad in ("-1", "3x", "1.5"):
            self.assertEqual(n.request("/costvar?k=cv2&cost=" + bad)[0], 500,
                             bad)
        # a bad cost on the second line: nothing was decided, so the 500
        # carries no RateLimit fields (it used to give the first line's
        # unset numbers: r=0 where none was spent)
        st, h, _ = n.request("/twocost?k=tc&cost=x")
        self.assertEqual(st, 500)
        self.assertNotIn("ratelimit", h)
        self.assertNotIn("ratelimit-policy", h)
        st, h, _ = n.request("/twocost?k=tc&cost=1")
        self.assertEqual(st, 200)
        self.assertIn("ratelimit", h)

    def test_cost_above_the_limit_is_never(self):
        # a cost no wait can admit: refused, $tollgate_retry_after "never",
        # no Retry-After (no wait helps), nothing consumed; so is a cost
        # too large for 64 bits (a whole number, not the server's error)
        n = self.n
        for cost in ("11", "9223372036854775807", "18446744073709551615",
                     "99999999999999999999"):
            st, h, _ = n.request("/costvar?k=never&cost=" + cost)
            self.assertEqual((st, h["x-status"], h["x-retry"]),
                             (429, "REJECTED", "never"), cost)
            self.assertNotIn("retry-after", h)
            self.assertEqual(h["x-remaining"], "10", cost)

    def test_cost_above_the_limit_on_a_counted_window(self):
        # a window that has counted: a cost beyond any limit must still be
        # refused with "never", not overflow the count (a failure, logged)
        n = self.n
        self.assertEqual(n.request("/costvarw?k=cw&cost=1")[0], 200)
        for cost in ("6", "18446744073709551615", "99999999999999999999"):
            st, h, _ = n.request("/costvarw?k=cw&cost=" + cost)
            self.assertEqual((st, h["x-status"], h["x-retry"]),
                             (429, "REJECTED", "never"), cost)
            self.assertEqual(h["x-remaining"], "4", cost)
        self.assertEqual(n.request("/costvarw?k=cw&cost=4")[0], 200)
        self.assertNotIn("TG_EOVERFLOW", n.error_log())

    def test_two_limits_one_policy(self):
        n = self.n
        # w allows 3, big 5: the 4th call is denied by w and consumes
        # nothing in big either
        self.assertEqual(statuses(n, "/two?k=p", 5), [200] * 3 + [429] * 2)
        st, h, _ = n.request("/two?k=p")
        self.assertIn('"w";r=0', h["ratelimit"])
        self.assertIn('"big";r=2', h["ratelimit"])
        st, h, _ = n.request("/big?k=p")
        self.assertEqual((st, h["x-remaining"]), (200, "1"))
        # $tollgate_remaining is the tightest line's, whichever line it is
        # (big, the first here, has 5)
        got = [n.request("/twor?k=t") for _ in range(4)]
        self.assertEqual([g[0] for g in got], [200, 200, 200, 429])
        self.assertEqual([g[1]["x-remaining"] for g in got],
                         ["2", "1", "0", "0"])

    def test_decided_once_across_internal_redirects(self):
        got = [self.n.request("/redir?k=i") for _ in range(4)]
        self.assertEqual([g[0] for g in got], [200, 200, 200, 429])
        self.assertEqual([g[1]["x-remaining"] for g in got[:3]],
                         ["2", "1", "0"])

    def test_a_location_that_decided_nothing_leaves_it_to_the_next(self):
        # every key empty: not limited there, but the location an internal
        # redirect leads to still limits the request (as limit_req's)
        got = [self.n.request("/emptyk?ip=a")[0] for _ in range(3)]
        self.assertEqual(got, [200, 429, 429])
        # a cost that is not a number: a 500 that decided nothing, and the
        # error_page location limits the request
        got = [self.n.request("/badcost?k=b&c=abc&ip=b")[0] for _ in range(3)]
        self.assertEqual(got, [200, 429, 429])

    def test_log_level(self):
        for _ in range(4):
            self.n.request("/level?k=l")
        log = self.n.error_log()
        self.assertIn('[info]', log)
        self.assertIn('tollgate: rejecting request by zone "w"', log)


class KeyForms(unittest.TestCase):
    """A key of exactly one variable is read directly (not through the
    script engine); every other key through it. Both must key alike."""

    @classmethod
    def setUpClass(cls):
        zones = """
tollgate_zone $arg_k zone=plain:1m algorithm=fixed_window_per_key rate=2/1d;
tollgate_zone ${arg_k} zone=braced:1m algorithm=fixed_window_per_key rate=2/1d;
tollgate_zone k:$arg_k zone=text:1m algorithm=fixed_window_per_key rate=2/1d;
tollgate_zone $arg_k$arg_j zone=pair:1m algorithm=fixed_window_per_key rate=2/1d;
tollgate_zone $1 zone=capture:1m algorithm=fixed_window_per_key rate=2/1d;
tollgate_zone $http_x_key zone=header:1m algorithm=token_bucket rate=2r/d;
tollgate_zone $binary_remote_addr zone=addr:1m algorithm=sliding_window rate=2/1d;
tollgate_zone $arg_k zone=lq:1m algorithm=leaky_bucket rate=2r/d;
tollgate_zone $arg_k zone=mixp:1m algorithm=fixed_window_per_key rate=3/1d;
tollgate_zone $arg_k zone=mixq:1m algorithm=leaky_bucket rate=2r/d;
"""
        locs = """
location /plain { tollgate zone=plain; try_files /index.html =404; }
location /braced { tollgate zone=braced; try_files /index.html =404; }
location /text { tollgate zone=text; try_files /index.html =404; }
location /pair { tollgate zone=pair; try_files /index.html =404; }
location ~ ^/capture/(\w+)$ { tollgate zone=capture;
                                try_files /index.html =404; }
location /header { tollgate zone=header; try_files /index.html =404; }
location /addr { tollgate zone=addr; try_files /index.html =404; }
location /lq { tollgate zone=lq; try_files /index.html =404; }
location /queue { tollgate zone=lq burst=0; try_files /index.html =404; }
location /mixed { tollgate zone=mixp; tollgate zone=mixq burst=0;
                  try_files /index.html =404; }
location /mixp { tollgate zone=mixp; try_files /index.html =404; }
"""
        cls.n = server(locs, zones)

    @classmethod
    def tearDownClass(cls):
        cls.n.stop()

    def test_each_form_limits_per_key_and_skips_an_empty_one(self):
        # keys that share a prefix are two keys: all their bytes count
        for path in ("/plain", "/braced", "/text", "/pair"):
            self.assertEqual(statuses(self.n, path + "?k=user-1", 3),
                             [200, 200, 429], path)
            self.assertEqual(statuses(self.n, path + "?k=user-2", 2),
                             [200, 200], path)
        # no k: an empty key is not limited (the text form is never empty)
        for path in ("/plain", "/braced", "/pair"):
            self.assertEqual(statuses(self.n, path, 4), [200] * 4, path)
        self.assertEqual(statuses(self.n, "/text", 3), [200, 200, 429])
        # the pair is the two arguments' bytes side by side
        self.assertEqual(statuses(self.n, "/pair?k=c&j=d", 2), [200, 200])
        self.assertEqual(statuses(self.n, "/pair?k=cd", 1), [429])

    def test_a_regex_capture_is_not_a_variable(self):
        # "$1" is the location's first capture (nginx would not start had
        # it been taken for a variable named "1")
        self.assertEqual(statuses(self.n, "/capture/x", 3), [200, 200, 429])
        self.assertEqual(statuses(self.n, "/capture/y", 2), [200, 200])

    def test_a_header_and_the_client_address(self):
        got = [self.n.request("/header", {"X-Key": "h"})[0] for _ in range(3)]
        self.assertEqual(got, [200, 200, 429])
        self.assertEqual(self.n.request("/header", {"X-Key": "i"})[0], 200)
        self.assertEqual(statuses(self.n, "/header", 3), [200] * 3)
        self.assertEqual(statuses(self.n, "/addr", 3), [200, 200, 429])

    def test_a_line_that_queues_keys_alike(self):
        # a queueing line reads its key through the script engine: the same
        # key as a plain line's on the same zone
        self.assertEqual(statuses(self.n, "/lq?k=q", 2), [200, 200])
        self.assertEqual(statuses(self.n, "/queue?k=q", 1), [429])
        self.assertEqual(statuses(self.n, "/queue?k=r", 1), [200])
        self.assertEqual(statuses(self.n, "/lq?k=r", 2), [200, 429])

    def test_a_plain_line_beside_a_line_that_queues(self):
        # both lines' keys through the script engine (the location queues):
        # each key its own, in both zones; the queueing line (one request
        # per key at once) refuses the second, which charges neither zone
        for key in ("user-1", "user-2"):
            self.assertEqual(statuses(self.n, "/mixed?k=" + key, 2),
                             [200, 429], key)
            self.assertEqual(statuses(self.n, "/mixp?k=" + key, 3),
                             [200, 200, 429], key)


class Inheritance(unittest.TestCase):
    def test_lines_and_settings_are_inherited_where_a_level_has_none(self):
        # http: h (5 a day); the first server: s (2 a day) and status 503,
        # its /inherit has no line (s, 503), its /own has its own (o, 1 a
        # day, 503 still); the second server has nothing: h, 429. Each
        # location is charged to its own lines only.
        n = ngx.Nginx(
            "tollgate_zone $arg_k zone=h:1m algorithm=fixed_window_per_key"
            " rate=5/1d;\n"
            "tollgate_zone $arg_k zone=s:1m algorithm=fixed_window_per_key"
            " rate=2/1d;\n"
            "tollgate_zone $arg_k zone=o:1m algorithm=fixed_window_per_key"
            " rate=1/1d;\n"
            "tollgate zone=h;\n"
            "server { listen 127.0.0.1:PORT; tollgate zone=s;"
            " tollgate_status 503;"
            " location /inherit { try_files /index.html =404; }"
            " location /own { tollgate zone=o; try_files /index.html =404; }"
            " }\n"
            "server { listen 127.0.0.1:PORT; server_name other;"
            " location / { try_files /index.html =404; } }\n")
        try:
            self.assertEqual(statuses(n, "/inherit?k=i", 3), [200, 200, 503])
            self.assertEqual(statuses(n, "/own?k=i", 2), [200, 503])
            got = [n.request("/?k=i", headers={"Host": "other"})
                   for _ in range(6)]
            self.assertEqual([g[0] for g in got], [200] * 5 + [429])
            self.assertEqual(got[0][1]["ratelimit-policy"],
                             '"h";q=5;w=86400')
        finally:
            n.stop()


class Subrequests(unittest.TestCase):
    def test_subrequests_are_not_limited(self):
        # auth_request's subrequest goes to a location limited to 1 a
        # day: were it limited, its 429 would make every request after
        # the first a 500
        out = subprocess.run([ngx.NGINX, "-V"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT).stdout.decode()
        if "http_auth_request_module" not in out:
            self.skipTest("nginx without auth_request")
        n = server("location /main { auth_request /authz;"
                   " try_files /index.html =404; }\n"
                   "location = /authz { tollgate zone=sub;"
                   " try_files /index.html =404; }\n",
                   # a key the subrequest has too (not its arguments)
                   "tollgate_zone $binary_remote_addr zone=sub:1m "
                   "algorithm=fixed_window_per_key rate=1/1d;")
        try:
            self.assertEqual(statuses(n, "/main", 3), [200] * 3)
            # the location itself is limited, as a main request
            self.assertEqual(statuses(n, "/authz", 2), [200, 429])
        finally:
            n.stop()


def small_zone_server():
    """nginx with the smallest zone (64k, some hundreds of keys) on /."""
    return server("location / { tollgate zone=z;"
                  " add_header X-Status $tollgate_status always;"
                  " try_files /index.html =404; }",
                  "tollgate_zone $arg_k zone=z:64k "
                  "algorithm=fixed_window_per_key rate=1/1d;")


class FullZone(unittest.TestCase):
    def test_full_zone_lets_through_and_says_so(self):
        # the smallest zone (64k) holds some hundreds of keys; past that a
        # new key is let through (fail open), FAILED, and logged
        n = small_zone_server()
        try:
            seen = {}
            for i in range(3000):
                st, h, _ = n.request("/?k=key%d" % i)
                self.assertEqual(st, 200)
                seen[h["x-status"]] = seen.get(h["x-status"], 0) + 1
                if h["x-status"] == "FAILED":
                    break
            self.assertIn("FAILED", seen, seen)
            self.assertGreater(seen["PASSED"], 150)
            self.assertIn("store is full (TG_EFULL); the request is let "
                          "through", n.error_log())
            # keys it holds are still limited
            self.assertEqual(n.request("/?k=key0")[0], 429)
        finally:
            n.stop()

    def test_long_keys_take_a_quarter_of_the_zone(self):
        # keys over 24 bytes fit in a quarter of the zone's keys; past
        # that a new long key is let through (FAILED) and logged, while a
        # short key still finds room
        n = small_zone_server()
        try:
            m = re.search(r'tollgate_zone "z": fixed_window_per_key, room '
                          r'for (\d+) keys', n.error_log())
            capacity = int(m.group(1))
            passed = 0
            for i in range(capacity):
                st, h, _ = n.request("/?k=%s%d" % ("L" * 40, i))
                self.assertEqual(st, 200)
                if h["x-status"] == "FAILED":
                    break
                passed += 1
            self.assertLessEqual(abs(passed - capacity // 4), 2,
                                 (passed, capacity))
            self.assertIn("store is full (TG_EFULL); the request is let "
                          "through", n.error_log())
            st, h, _ = n.request("/?k=short")
            self.assertEqual((st, h["x-status"]), (200, "PASSED"))
        finally:
            n.stop()


class ConfigErrors(unittest.TestCase):
    def expect(self, http, message):
        rc, out = ngx.check(http)
        self.assertNotEqual(rc, 0, out)
        self.assertIn(message, out)

    def test_messages(self):
        ok = "tollgate_zone $arg_k zone=a:1m algorithm=token_bucket rate=1r/s;"
        rc, out = ngx.check(ok + "server { listen 127.0.0.1:PORT; "
                            "location / { tollgate zone=a; } }")
        self.assertEqual(rc, 0, out)
        # several lines that delay, beside one that does not, in one place
        rc, out = ngx.check(
            ok + "tollgate_zone $arg_b zone=b:1m algorithm=leaky_bucket "
            "rate=1r/s; tollgate_zone $arg_c zone=c:1m algorithm=fixed_window "
            "rate=1r/s; server { listen 127.0.0.1:PORT; location / { "
            "tollgate zone=a burst=3; tollgate zone=b burst=2 delay=1; "
            "tollgate zone=c; } }")
        self.assertEqual(rc, 0, out)
        cases = [
            ("tollgate_zone $a zone=a:1m algorithm=nope rate=1r/s;",
             'tollgate_zone: unknown algorithm "nope"'),
            ("tollgate_zone $a zone=a:1m rate=1r/x;",
             'tollgate_zone: invalid rate "1r/x"'),
            ("tollgate_zone $a zone=a:1m rate=0r/s;",
             'tollgate_zone: invalid rate "0r/s"'),
            ("tollgate_zone $a zone=a:1m;",
             'tollgate_zone: "rate=" is required'),
            ("tollgate_zone $a rate=1r/s;",
             'tollgate_zone: "zone=NAME:SIZE" is required'),
            ("tollgate_zone $a zone=a rate=1r/s;",
             "tollgate_zone: invalid zone size"),
            # a parameter where the key goes: it was one constant key
            ("tollgate_zone algorithm=sliding_window zone=a:1m rate=2/1m;",
             'tollgate_zone: the first parameter is the key, and '
             '"algorithm=sliding_window" is a parameter'),
            ("tollgate_zone $a zone=a:0 rate=1r/s;",
             'tollgate_zone: invalid zone size in "zone=a:0"'),
            ("tollgate_zone $a zone=a:1k rate=1r/s;",
             'tollgate_zone: zone "a" is too small'),
            ("tollgate_zone $a zone=a/b:1m rate=1r/s;",
             'tollgate_zone: invalid zone name "a/b"'),
            ("tollgate_zone $a zone=a:1m rate=1r/s burst=5;",
             'tollgate_zone: "burst=" needs algorithm=token_bucket'),
            ("tollgate_zone $a zone=a:1m rate=1r/s bogus=1;",
             'tollgate_zone: invalid parameter "bogus=1"'),
            # a second value would silently replace the first
            ("tollgate_zone $a zone=a:1m rate=10r/s zone=b:1m;",
             'tollgate_zone: "zone=" is given twice'),
            ("tollgate_zone $a zone=a:1m rate=10r/s rate=5r/s;",
             'tollgate_zone: "rate=" is given twice'),
            (ok + "server { location / { tollgate zone=a cost=1 cost=2; } }",
             'tollgate: "cost=" is given twice'),
            ("tollgate_zone $a zone=a:1m rate=1r/s;"
             "tollgate_zone $b zone=a:1m rate=1r/s;",
             'tollgate_zone: zone "a" is already defined'),
            ("tollgate_zone $a zone=a:1m algorithm=token_bucket "
             "rate=2000000000/1ms;",
             "tollgate_zone: zone \"a\": invalid quota"),
            (ok + "server { location / { tollgate zone=b; } }",
             'tollgate: unknown zone "b"'),
            (ok + "server { location / { tollgate; } }",
             'invalid number of arguments in "tollgate" directive'),
            (ok + "server { location / { tollgate cost=1; } }",
             'tollgate: "zone=NAME" is required'),
            (ok + "server { location / { tollgate zone=a cost=x; } }",
             'tollgate: invalid cost "x"'),
            (ok + "server { location / { tollgate zone=a burst=x; } }",
             'tollgate: invalid burst "burst=x"'),
            (ok + "server { location / { tollgate zone=a nodelay "
             "delay=2; } }", 'tollgate: "nodelay" and "delay=" exclude'),
            (ok + "server { location / { tollgate zone=a whatever; } }",
             'tollgate: invalid parameter "whatever"'),
            # a fixed cost the line never lets through: refused here, not
            # by a 429 on every request (nginx -t passed it): above a
            # window's limit, a bucket's burst, a queue's D + 1
            ("tollgate_zone $a zone=fw:1m rate=3/1d;"
             "server { location / { tollgate zone=fw cost=5; } }",
             'tollgate: "cost=5" on zone "fw" is above the 3 this line'),
            ("tollgate_zone $a zone=tb:1m algorithm=token_bucket rate=1r/s "
             "burst=4; server { location / { tollgate zone=tb cost=5; } }",
             'tollgate: "cost=5" on zone "tb" is above the 4 this line'),
            ("tollgate_zone $a zone=lq:1m algorithm=leaky_bucket rate=10r/s "
             "burst=20; server { location / { tollgate zone=lq burst=5 "
             "cost=2; } }",
             'tollgate: "cost=2" on zone "lq" is above the 1 this line'),
            (ok + "tollgate_zone $a zone=w:1m rate=1/1s;"
             "server { location / { tollgate zone=w burst=3; } }",
             'tollgate: "burst=", "delay=" and "nodelay" need a zone with '
             'algorithm=token_bucket or leaky_bucket, and zone "w" is '
             'fixed_window'),
            # nodelay alone means nothing on a window either
            (ok + "tollgate_zone $a zone=s:1m algorithm=sliding_window "
             "rate=1/1s; server { location / { tollgate zone=s nodelay; } }",
             'and zone "s" is sliding_window'),
            # a line's own quota (burst + 1) the library refuses: refused
            # here, not by a 429 on every request
            ("tollgate_zone $a zone=day:1m algorithm=token_bucket rate=1r/d;"
             "server { location / { tollgate zone=day burst=50000 nodelay; "
             "} }", 'tollgate: zone "day" with this line\'s "burst=" or '
             '"delay=": invalid quota'),
            # a queue longer than the longest wait there is, and one whose
            # length overflowed 64 bits (it used to wrap to 26 s)
            ("tollgate_zone $a zone=dq:1m algorithm=leaky_bucket rate=1r/d;"
             "server { location / { tollgate zone=dq burst=20000; } }",
             'tollgate: "burst=20000" on zone "dq" queues requests for '
             'longer than'),
            ("tollgate_zone $a zone=mq:1m algorithm=leaky_bucket rate=1r/m;"
             "server { location / { tollgate zone=mq burst=307445735; } }",
             'tollgate: "burst=307445735" on zone "mq" queues requests'),
            (ok + "server { location / { tollgate zone=a; "
             "tollgate zone=a cost=0; } }",
             'tollgate: zone "a" is used twice in one place'),
            (ok + "server { location / { tollgate zone=a; "
             "tollgate_status 200; } }",
             'tollgate_status: invalid status "200" (400 to 599)'),
            (ok + "server { location / { tollgate zone=a; "
             "tollgate_headers maybe; } }",
             'tollgate_headers: invalid value "maybe" (off, on, legacy)'),
            (ok + "server { location / { tollgate zone=a; "
             "tollgate_log_level loud; } }",
             'tollgate_log_level: invalid value "loud" (info, notice, warn, '
             'error)'),
            (ok + "server { location / { tollgate zone=a; "
             "tollgate_dry_run maybe; } }",
             'invalid value "maybe" in "tollgate_dry_run" directive'),
        ]
        for http, message in cases:
            with self.subTest(http=http):
                self.expect(http, message)

    def test_limits_of_the_values(self):
        ok = "tollgate_zone $arg_k zone=a:1m algorithm=token_bucket rate=1r/s;"
        # 16 lines in one place are one policy; a 17th is refused
        zones = "".join("tollgate_zone $arg_k zone=z%d:64k rate=1r/s;" % i
                        for i in range(17))
        lines = "".join("tollgate zone=z%d; " % i for i in range(17))
        rc, out = ngx.check(zones + "server { listen 127.0.0.1:PORT; "
                            "location / { %s} }"
                            % lines.replace("tollgate zone=z16; ", ""))
        self.assertEqual(rc, 0, out)
        self.expect(zones + "server { location / { %s} }" % lines,
                    "tollgate: at most 16 tollgate lines per location")
        # zone names: 1 to 64 of letters, digits, "_", "-", "."
        name = "aZ0_-." + "x" * 58
        rc, out = ngx.check("tollgate_zone $arg_k zone=%s:1m rate=1r/s;"
                            % name)
        self.assertEqual(rc, 0, out)
        self.expect("tollgate_zone $a zone=%sx:1m rate=1r/s;" % name,
                    'tollgate_zone: invalid zone name "%sx"' % name)
        # tollgate_status: 400 to 599
        for code in (400, 599):
            rc, out = ngx.check(ok + "server { listen 127.0.0.1:PORT; "
                                "location / { tollgate zone=a; "
                                "tollgate_status %d; } }" % code)
            self.assertEqual(rc, 0, out)
        for code in (399, 600):
            self.expect(ok + "server { location / { tollgate zone=a; "
                        "tollgate_status %d; } }" % code,
                        'tollgate_status: invalid status "%d"' % code)
        cases = [
            (ok + "server { location / { tollgate zone=a burst=2 "
             "delay=x; } }", 'tollgate: invalid delay "delay=x"'),
            ("tollgate_zone $a zone=b:1m algorithm=token_bucket rate=1r/s "
             "burst=0;", 'tollgate_zone: invalid burst "burst=0"'),
            (ok + "server { location / { tollgate zone=a "
             "cost=99999999999999999999; } }",
             'tollgate: invalid cost "99999999999999999999"'),
            # Redis options on a shared-memory zone
            ("tollgate_zone $a zone=x:1m rate=1r/s password=p;",
             '"password=", "timeout=" and "on_error=" are for a zone with '
             '"store=redis://..."'),
            ("tollgate_zone $a zone=x:1m rate=1r/s timeout=1s;",
             '"password=", "timeout=" and "on_error=" are for a zone'),
            # refused as written, even with the default values
            ("tollgate_zone $a zone=x:1m rate=1r/s timeout=100ms;",
             '"password=", "timeout=" and "on_error=" are for a zone'),
            ("tollgate_zone $a zone=x:1m rate=1r/s on_error=allow;",
             '"password=", "timeout=" and "on_error=" are for a zone'),
        ]
        for http, message in cases:
            with self.subTest(http=http):
                self.expect(http, message)

    def test_messages_name_the_line(self):
        ok = ("tollgate_zone $arg_k zone=a:1m algorithm=token_bucket "
              "rate=1r/s;\ntollgate_zone $arg_k zone=w:1m rate=1r/s;\n")
        cases = [
            # found when the line is read
            ("tollgate_zone $a zone=a:1m algorithm=nope rate=1r/s; # HERE\n",
             'tollgate_zone: unknown algorithm "nope"'),
            (ok + "server {\n location / {\n  tollgate zone=a cost=x; # HERE"
             "\n }\n}\n", 'tollgate: invalid cost "x"'),
            # found when the blocks are merged: the line is named too
            (ok + "server {\n location / {\n  tollgate zone=b; # HERE\n"
             " }\n}\n", 'tollgate: unknown zone "b"'),
            (ok + "server {\n location / {\n  tollgate zone=a;\n"
             "  tollgate zone=a cost=0; # HERE\n }\n}\n",
             'tollgate: zone "a" is used twice in one place'),
            (ok + "server {\n location / {\n  tollgate zone=w burst=2; # HERE"
             "\n }\n}\n", 'and zone "w" is fixed_window'),
        ]
        for http, message in cases:
            with self.subTest(message=message):
                rc, out, where = ngx.check_line(http, "# HERE")
                self.assertNotEqual(rc, 0, out)
                self.assertIn(message, out)
                self.assertIn(where, out)


def hammer(n, path_for, threads, per_thread):
    """Sends threads x per_thread requests concurrently; returns
    (statuses, worker pids that answered, connection errors)."""
    results, pids, errors = [], set(), [0]
    lock = threading.Lock()

    def run(t):
        for i in range(per_thread):
            try:
                st, h, _ = n.request(path_for(t, i), timeout=30)
            except OSError:
                with lock:
                    errors[0] += 1
                continue
            with lock:
                results.append(st)
                pids.add(h.get("x-pid"))
    ts = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return results, pids, errors[0]


class Exactness(unittest.TestCase):
    def test_two_workers_concurrent_clients(self):
        # per algorithm, 3 keys with a limit of 40; 8 threads offer 120
        # requests per key: each key admits exactly 40, whichever of the
        # two workers answered
        zones = "".join(
            "tollgate_zone $arg_k zone=%s:4m algorithm=%s rate=%s;\n"
            % (a, a, "40/1d" if "bucket" not in a else "40r/d burst=40")
            for a in ALGORITHMS)
        locs = "".join(
            "location /%s { tollgate zone=%s; add_header X-Pid $pid always;"
            " try_files /index.html =404; }\n" % (a, a) for a in ALGORITHMS)
        n = server(locs, zones)
        try:
            for a in ALGORITHMS:
                for key in ("a", "b", "c"):
                    got, pids, errors = hammer(
                        n, lambda t, i: "/%s?k=%s" % (a, key), 8, 15)
                    self.assertEqual(errors, 0)
                    self.assertEqual(got.count(200), 40, (a, key))
                    self.assertEqual(got.count(429), 80, (a, key))
                    self.assertEqual(len(pids), 2, (a, key, pids))
        finally:
            n.stop()

    def test_worker_killed_mid_traffic(self):
        zones = ("tollgate_zone $arg_k zone=z:4m "
                 "algorithm=fixed_window_per_key rate=300/1d;\n"
                 "tollgate_zone $arg_k zone=s:4m "
                 "algorithm=sliding_window rate=300/1d;\n")
        locs = ("location /z { tollgate zone=z; add_header X-Pid $pid always;"
                " try_files /index.html =404; }\n"
                "location /s { tollgate zone=s; add_header X-Pid $pid always;"
                " try_files /index.html =404; }\n")
        n = server(locs, zones)
        try:
            for loc in ("z", "s"):
                victim = n.worker_pids()[0]
                done = []
                sent = [0]
                lock = threading.Lock()

                def path(t, i, loc=loc, victim=victim, done=done, sent=sent):
                    # the kill goes out from the traffic itself, at its
                    # 200th request of 600: always mid-traffic
                    with lock:
                        sent[0] += 1
                        if sent[0] == 200:
                            os.kill(victim, signal.SIGKILL)
                            done.append(1)
                    return "/%s?k=kill" % loc
                got, _, errors = hammer(n, path, 6, 100)
                self.assertTrue(done)
                # never more than the limit; requests cut by the kill may
                # have been counted without an answer, nothing else is lost
                self.assertLessEqual(got.count(200), 300, loc)
                self.assertGreaterEqual(got.count(200) + errors, 300, loc)
                # the master replaced the worker; the zone still works and
                # is exact for a fresh key
                # (the kill may land after the traffic: wait for the
                # victim to be gone, not only for two workers)
                deadline = time.monotonic() + 10
                while ((victim in n.worker_pids()
                        or len(n.worker_pids()) != 2)
                       and time.monotonic() < deadline):
                    time.sleep(0.05)
                self.assertNotIn(victim, n.worker_pids())
                self.assertEqual(len(n.worker_pids()), 2)
                got, pids, errors = hammer(
                    n, lambda t, i: "/%s?k=after" % loc, 6, 60)
                self.assertEqual(errors, 0)
                self.assertEqual(got.count(200), 300, loc)
                self.assertEqual(got.count(429), 60, loc)
        finally:
            n.stop()


class Reload(unittest.TestCase):
    def conf(self, alg="fixed_window_per_key", key="$arg_k", extra=""):
        rate = "3/1d" if "bucket" not in alg else "3r/d burst=3"
        return ("tollgate_zone %s zone=r:1m algorithm=%s rate=%s;\n"
                "tollgate_zone $arg_k zone=s:1m algorithm=sliding_window "
                "rate=3/1d;\n%s\n"
                "server { listen 127.0.0.1:PORT;"
                " location /r { tollgate zone=r; try_files /index.html =404; }"
                " location /s { tollgate zone=s; try_files /index.html =404; }"
                " }" % (key, alg, rate, extra))

    def test_reload_keeps_counts_and_refuses_changes(self):
        n = ngx.Nginx(self.conf())
        try:
            self.assertEqual(statuses(n, "/r?k=a", 2), [200, 200])
            self.assertEqual(statuses(n, "/s?k=a", 2), [200, 200])
            old_workers = n.worker_pids()
            # same zones (another directive added): the counts go on
            self.assertTrue(n.reload(self.conf(extra="tollgate_status 503;")))
            self.assertNotEqual(n.worker_pids(), old_workers)
            self.assertEqual(statuses(n, "/r?k=a", 2), [200, 503])
            self.assertEqual(statuses(n, "/s?k=a", 2), [200, 503])
            # another algorithm in the same zone: refused, named, and the
            # running configuration (and its counts) stays
            workers = n.worker_pids()
            self.assertFalse(n.reload(self.conf(alg="token_bucket")))
            self.assertIn('tollgate_zone "r" changed: it holds a table of',
                          n.error_log())
            self.assertIn("for fixed_window_per_key", n.error_log())
            self.assertEqual(n.worker_pids(), workers)
            self.assertEqual(statuses(n, "/r?k=a", 1), [503])
            self.assertEqual(statuses(n, "/r?k=b", 1), [200])
            # another key: refused too
            self.assertFalse(n.reload(self.conf(key="$arg_other")))
            self.assertIn('tollgate_zone "r" uses the key "$arg_other" while '
                          'previously it used "$arg_k"', n.error_log())
            self.assertEqual(n.worker_pids(), workers)
            # a new zone name starts afresh
            self.assertTrue(n.reload(self.conf().replace("zone=r", "zone=r2")))
            self.assertEqual(statuses(n, "/r?k=a", 4), [200] * 3 + [429])
        finally:
            n.stop()


    def test_reload_new_rate_applies_to_kept_counts(self):
        # fixed_window_per_key 3 a day, 2 taken; reloaded with 5 a day: the
        # 2 are kept and 3 remain. A sliding window's limit sets its logs'
        # size: changing it is refused, named. A new size is a new zone,
        # empty.
        def conf(r="r:1m", rate="3/1d", srate="3/1d"):
            return ("tollgate_zone $arg_k zone=%s algorithm="
                    "fixed_window_per_key rate=%s;\n"
                    "tollgate_zone $arg_k zone=s:1m algorithm=sliding_window "
                    "rate=%s;\n"
                    "server { listen 127.0.0.1:PORT; location /r {"
                    " tollgate zone=r;"
                    " add_header X-Remaining $tollgate_remaining always;"
                    " try_files /index.html =404; }"
                    " location /s { tollgate zone=s;"
                    " try_files /index.html =404; } }" % (r, rate, srate))

        def remaining(path, count):
            return [n.request(path)[1]["x-remaining"] for _ in range(count)]
        n = ngx.Nginx(conf())
        try:
            self.assertEqual(remaining("/r?k=a", 2), ["2", "1"])
            self.assertEqual(statuses(n, "/s?k=a", 2), [200, 200])
            self.assertTrue(n.reload(conf(rate="5/1d")))
            self.assertEqual(remaining("/r?k=a", 2), ["2", "1"])
            workers = n.worker_pids()
            self.assertFalse(n.reload(conf(rate="5/1d", srate="4/1d")))
            self.assertIn('tollgate_zone "s" changed:', n.error_log())
            self.assertIn("for sliding_window (3 log entries), the new "
                          "configuration wants", n.error_log())
            self.assertEqual(n.worker_pids(), workers)
            self.assertEqual(statuses(n, "/s?k=a", 2), [200, 429])
            # another size: a new zone, which starts empty
            self.assertTrue(n.reload(conf(r="r:2m", rate="5/1d")))
            self.assertEqual(remaining("/r?k=a", 2), ["4", "3"])
        finally:
            n.stop()


class LimitReq(unittest.TestCase):
    """The same request times through limit_req and through tollgate's
    leaky bucket with the same burst/nodelay give the same answers. The
    times keep 200 ms or more from every moment where a slot frees, so
    scheduling noise cannot flip an answer."""

    def test_nodelay_sequence(self):
        zones = ("limit_req_zone $binary_remote_addr zone=lr:1m rate=1r/s;\n"
                 "tollgate_zone $binary_remote_addr zone=tg:1m "
                 "algorithm=leaky_bucket rate=1r/s;\n")
        locs = ("limit_req_status 429;\n"
                "location /lr { limit_req zone=lr burst=2 nodelay;"
                " try_files /index.html =404; }\n"
                "location /tg { tollgate zone=tg burst=2 nodelay;"
                " try_files /index.html =404; }\n")
        n = server(locs, zones)
        # (seconds after the start, requests at that moment)
        plan = [(0.0, 4), (0.5, 1), (1.5, 2), (2.5, 1), (4.5, 3), (4.7, 1)]
        expect = [200, 200, 200, 429, 429, 200, 429, 200, 200, 200, 429,
                  429]
        try:
            answers = {"lr": [], "tg": []}
            t0 = time.monotonic()
            for at, count in plan:
                while time.monotonic() - t0 < at:
                    time.sleep(0.005)
                for _ in range(count):
                    for loc in ("lr", "tg"):
                        answers[loc].append(n.request("/" + loc)[0])
            self.assertEqual(answers["lr"], expect)
            self.assertEqual(answers["tg"], answers["lr"])
        finally:
            n.stop()

    def test_delay_queue(self):
        # burst=2 without nodelay: of 4 simultaneous requests one passes at
        # once, two wait (at least about 1 s and 2 s: only lower bounds are
        # checked, a loaded machine can only make them longer), one is
        # rejected; both modules, and tollgate says DELAYED for the waiting
        # ones
        zones = ("limit_req_zone $binary_remote_addr zone=lr:1m rate=1r/s;\n"
                 "tollgate_zone $binary_remote_addr zone=tg:1m "
                 "algorithm=leaky_bucket rate=1r/s;\n")
        locs = ("limit_req_status 429;\n"
                "location /lr { limit_req zone=lr burst=2;"
                " try_files /index.html =404; }\n"
                "location /tg { tollgate zone=tg burst=2;"
                " add_header X-Status $tollgate_status always;"
                " try_files /index.html =404; }\n")
        n = server(locs, zones)
        try:
            for loc in ("lr", "tg"):
                out = []
                lock = threading.Lock()

                def one():
                    t = time.monotonic()
                    st, h, _ = n.request("/" + loc)
                    with lock:
                        out.append((st, time.monotonic() - t,
                                    h.get("x-status")))
                ts = [threading.Thread(target=one) for _ in range(4)]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join()
                out.sort(key=lambda o: (o[0], o[1]))
                self.assertEqual([o[0] for o in out], [200, 200, 200, 429],
                                 (loc, out))
                waits = sorted(o[1] for o in out if o[0] == 200)
                self.assertGreater(waits[1], 0.7, (loc, out))
                self.assertGreater(waits[2], 1.7, (loc, out))
                if loc == "tg":
                    self.assertEqual(sorted(o[2] for o in out),
                                     ["DELAYED", "DELAYED", "PASSED",
                                      "REJECTED"])
        finally:
            n.stop()


class CachedTime(unittest.TestCase):
    """A shared-memory zone decides on nginx's cached time (the time its
    worker's event-loop turn began), as limit_req does (limit_req's is the
    monotonic clock's, tollgate's the wall clock's, both cached). With
    `timer_resolution 60s` a worker's cached time stands still for a minute
    from its start, so a request 1.3 s after another is decided at the same
    moment: a second request in a 1 s fixed window, or through a 1r/s
    bucket without burst, is refused, by limit_req and by tollgate alike.
    Without it, time moves and both are admitted (the control: a module
    reading the system clock would admit the second request in both runs).
    That the workers' cached times make one timeline (tg_clock_latest) is
    test_region's and test_concurrency's to show."""

    ZONES = ("limit_req_zone $arg_k zone=lr:1m rate=1r/s;\n"
             "tollgate_zone $arg_k zone=lb:1m algorithm=leaky_bucket "
             "rate=1r/s;\n"
             "tollgate_zone $arg_k zone=fw:1m algorithm=fixed_window "
             "rate=1/1s;\n")
    LOCS = ("limit_req_status 429;\n"
            "location /lr { limit_req zone=lr; try_files /index.html =404; }\n"
            "location /lb { tollgate zone=lb burst=0;"
            " try_files /index.html =404; }\n"
            "location /fw { tollgate zone=fw; try_files /index.html =404; }\n")

    def pairs(self, main):
        n = server(self.LOCS, self.ZONES, workers=1, main=main)
        try:
            first = [n.request(p + "?k=a")[0] for p in ("/lr", "/lb", "/fw")]
            time.sleep(1.3)
            second = [n.request(p + "?k=a")[0] for p in ("/lr", "/lb", "/fw")]
            return first, second
        finally:
            n.stop()

    def test_a_fast_queue_holds_exactly_its_burst(self):
        # 10,000 r/s (T = 100 us), burst=2: B emission intervals are 0.2
        # ms, which a wait in whole ms would round up to 1 ms, queueing
        # ten; tollgate's wait is exact (TG_RULES_WAIT_NS), so the queue
        # holds 2, as limit_req's. 30 requests at once, on one cached time
        # (timer_resolution 1s: the queued ones are released at the next
        # tick); limit_req beside it is the control that the burst met one
        # moment (a tick in the middle lets both admit more: tried again)
        zones = ("limit_req_zone $arg_k zone=lrf:1m rate=10000r/s;\n"
                 "tollgate_zone $arg_k zone=lbf:1m algorithm=leaky_bucket "
                 "rate=10000r/s;\n")
        locs = ("limit_req_status 429;\n"
                "location /lrf { limit_req zone=lrf burst=2;"
                " try_files /index.html =404; }\n"
                "location /lbf { tollgate zone=lbf burst=2;"
                " try_files /index.html =404; }\n")
        n = server(locs, zones, workers=1, main="timer_resolution 1s;")
        try:
            for attempt in range(5):
                paths = ["/lrf?k=%d" % attempt, "/lbf?k=%d" % attempt] * 30
                socks = [socket.create_connection(("127.0.0.1", n.port))
                         for _ in paths]
                for s, p in zip(socks, paths):
                    s.sendall(("GET %s HTTP/1.1\r\nHost: x\r\nConnection: "
                               "close\r\n\r\n" % p).encode())
                admitted = {"/lrf": 0, "/lbf": 0}
                for s, p in zip(socks, paths):
                    s.settimeout(10)
                    d = b""
                    while True:
                        x = s.recv(65536)
                        if not x:
                            break
                        d += x
                    s.close()
                    if d.startswith(b"HTTP/1.1 200"):
                        admitted[p.split("?")[0]] += 1
                if admitted["/lrf"] == 3:
                    break
            self.assertEqual(admitted, {"/lrf": 3, "/lbf": 3})
        finally:
            n.stop()

    def test_zones_read_nginx_cached_time(self):
        first, second = self.pairs("timer_resolution 60s;")
        self.assertEqual(first, [200, 200, 200])
        self.assertEqual(second, [429, 429, 429])
        first, second = self.pairs("")
        self.assertEqual((first, second), ([200] * 3, [200] * 3))


class Delay(unittest.TestCase):
    def test_delay_lets_some_excess_through_at_once(self):
        # 2r/s burst=3 delay=1, five requests 20 ms apart: the first and
        # the first excess one pass at once, the next two wait about 0.5 s
        # and 1 s (burst - delay = 2 queued), the last is refused; the same
        # through limit_req. delay= at least burst is nodelay: a bucket of
        # burst + 1 at once, then refused.
        zones = ("limit_req_zone $arg_k zone=lr:1m rate=2r/s;\n"
                 "tollgate_zone $arg_k zone=tg:1m algorithm=leaky_bucket "
                 "rate=2r/s;\n"
                 "tollgate_zone $arg_k zone=tg2:1m algorithm=leaky_bucket "
                 "rate=1r/d;\n")
        locs = ("limit_req_status 429;\n"
                "location /lr { limit_req zone=lr burst=3 delay=1;"
                " try_files /index.html =404; }\n"
                "location /tg { tollgate zone=tg burst=3 delay=1;"
                " add_header X-Status $tollgate_status always;"
                " try_files /index.html =404; }\n"
                "location /tg2 { tollgate zone=tg2 burst=2 delay=5;"
                " add_header X-Status $tollgate_status always;"
                " try_files /index.html =404; }\n")
        n = server(locs, zones)
        try:
            for loc in ("lr", "tg"):
                got = ngx.staggered(n, ["/%s?k=d" % loc] * 5, gap=0.02)
                self.assertEqual([g[0] for g in got],
                                 [200, 200, 200, 200, 429], (loc, got))
                self.assertGreater(got[2][1], 0.35, (loc, got))
                self.assertGreater(got[3][1], 0.85, (loc, got))
                if loc == "tg":
                    self.assertEqual([g[2] for g in got],
                                     ["PASSED", "PASSED", "DELAYED",
                                      "DELAYED", "REJECTED"])
            got = [n.request("/tg2?k=d") for _ in range(4)]
            self.assertEqual([(g[0], g[1]["x-status"]) for g in got],
                             [(200, "PASSED")] * 3 + [(429, "REJECTED")])
        finally:
            n.stop()


class LimitReqTwoLines(unittest.TestCase):
    """Two lines that delay in one location, through limit_req and through
    tollgate (leaky buckets, one policy of reservations): the same
    admit/delay/reject sequence. limit_req checks every line, rejects
    without charging any line when one rejects, else charges all and
    delays by the longest; so does tg_reserve_rules. Requests go 50 ms
    apart (nginx counts in ms: the slots below are 50 ms or more from any
    boundary); waits are checked from below (a loaded machine can only
    make them longer) and, where a charge that should not be would show,
    from above."""

    ZONES = ("limit_req_zone $arg_k zone=lrk:1m rate=2r/s;\n"
             "limit_req_zone $server_port zone=lrs:1m rate=1r/s;\n"
             "tollgate_zone $arg_k zone=tgk:1m algorithm=leaky_bucket "
             "rate=2r/s;\n"
             "tollgate_zone $server_port zone=tgs:1m algorithm=leaky_bucket "
             "rate=1r/s;\n"
             "limit_req_zone $arg_k zone=lrk1:1m rate=1r/s;\n"
             "limit_req_zone $server_port zone=lrs1:1m rate=1r/s;\n"
             "tollgate_zone $arg_k zone=tgk1:1m algorithm=leaky_bucket "
             "rate=1r/s;\n"
             "tollgate_zone $server_port zone=tgs1:1m algorithm=leaky_bucket "
             "rate=1r/s;\n")
    LOCS = ("limit_req_status 429;\n"
            "location /lr { limit_req zone=lrk burst=3;"
            " limit_req zone=lrs burst=2; try_files /index.html =404; }\n"
            "location /tg { tollgate zone=tgk burst=3;"
            " tollgate zone=tgs burst=2;"
            " add_header X-Status $tollgate_status always;"
            " try_files /index.html =404; }\n"
            "location /lr1 { limit_req zone=lrk1 burst=1;"
            " limit_req zone=lrs1 burst=5; try_files /index.html =404; }\n"
            "location /tg1 { tollgate zone=tgk1 burst=1;"
            " tollgate zone=tgs1 burst=5;"
            " add_header X-Status $tollgate_status always;"
            " try_files /index.html =404; }\n")

    @classmethod
    def setUpClass(cls):
        cls.n = server(cls.LOCS, cls.ZONES)

    @classmethod
    def tearDownClass(cls):
        cls.n.stop()

    def test_the_longest_delay_and_the_server_line_rejects(self):
        # per key 2r/s burst=3 (T 500 ms), per server 1r/s burst=2 (T 1 s),
        # five requests of one key 50 ms apart: the first passes, the next
        # two wait the server line's 950 ms and 1.9 s (the key line's would
        # be 450 ms and 900 ms), the last two overflow the server line's
        # queue and are rejected
        for loc in ("lr", "tg"):
            got = ngx.staggered(self.n, ["/%s?k=a" % loc] * 5)
            self.assertEqual([g[0] for g in got], [200, 200, 200, 429, 429],
                             (loc, got))
            self.assertGreater(got[1][1], 0.85, (loc, got))
            self.assertGreater(got[2][1], 1.8, (loc, got))
            if loc == "tg":
                self.assertEqual([g[2] for g in got],
                                 ["PASSED", "DELAYED", "DELAYED", "REJECTED",
                                  "REJECTED"])

    def test_a_rejecting_line_charges_no_other(self):
        # per key 1r/s burst=1, per server 1r/s burst=5: x1 passes, x2
        # waits 950 ms, x3 and x4 overflow the key's queue and are rejected
        # without being charged to the server line; so y1, 150 ms after x2,
        # waits 1.8 s behind x1 and x2 only (3.8 s if x3 and x4 had been
        # charged: the bound between leaves a loaded machine 1.7 s)
        for loc in ("lr1", "tg1"):
            paths = ["/%s?k=x" % loc] * 4 + ["/%s?k=y" % loc]
            got = ngx.staggered(self.n, paths)
            self.assertEqual([g[0] for g in got], [200, 200, 429, 429, 200],
                             (loc, got))
            self.assertGreater(got[1][1], 0.85, (loc, got))
            self.assertGreater(got[4][1], 1.7, (loc, got))
            self.assertLess(got[4][1], 3.5, (loc, got))
            if loc == "tg1":
                self.assertEqual([g[2] for g in got],
                                 ["PASSED", "DELAYED", "REJECTED", "REJECTED",
                                  "DELAYED"])


class Cancel(unittest.TestCase):
    def test_abandoned_wait_gives_its_slot_back(self):
        # burst=2 at 1r/s: A passes, B waits ~1 s, C ~2 s. C's client goes
        # away: its reservation is cancelled (the last one, so its slot is
        # free again), and D, which would have been rejected, waits ~2 s.
        # (limit_req keeps an abandoned request's slot.)
        zones = ("tollgate_zone $arg_k zone=tg:1m algorithm=leaky_bucket "
                 "rate=1r/s;\n")
        locs = ("location /tg { tollgate zone=tg burst=2;"
                " add_header X-Status $tollgate_status always;"
                " try_files /index.html =404; }\n")
        n = server(locs, zones)
        try:
            out = {}

            def one(name):
                out[name] = n.request("/tg?k=c")
            a = threading.Thread(target=one, args=("a",))
            a.start()
            a.join()
            b = threading.Thread(target=one, args=("b",))
            b.start()
            time.sleep(0.2)
            c = socket.create_connection(("127.0.0.1", n.port))
            c.sendall(b"GET /tg?k=c HTTP/1.1\r\nHost: x\r\n\r\n")
            time.sleep(0.3)  # C is queued
            c.close()
            time.sleep(0.3)  # nginx has seen the close
            d = threading.Thread(target=one, args=("d",))
            d.start()
            b.join()
            d.join()
            self.assertEqual(out["a"][0], 200)
            self.assertEqual((out["b"][0], out["b"][1]["x-status"]),
                             (200, "DELAYED"))
            self.assertEqual((out["d"][0], out["d"][1]["x-status"]),
                             (200, "DELAYED"))
        finally:
            n.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
