/* SPDX-License-Identifier: MIT */
/*
 * test_redis_engine.c - the Redis protocol pieces without a server: the
 * RESP codec (redis_resp.c), hash slots, redirections and the slot map
 * (redis_slots.c), and the engine (redis_engine.c) driven by hand with
 * scripted replies, so every event of its state machine is reached on
 * purpose and its answer checked: the handshake, pipelining, replies in
 * any split, NOSCRIPT, a vanished module, MOVED, ASK, the redirection
 * budget, a connection lost part way through writing (which calls are sent
 * again, which must not be), corrupt replies, a refused handshake, calls
 * waiting for a slot map, and DEL.
 *
 * The live behaviour (real servers, a real Cluster) is test_nb.c's and
 * test_cluster.c's; this file pins down the machine those tests run.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/core.h"
#include "store/redis_cmd.h"
#include "store/redis_engine.h"
#include "store/redis_resp.h"
#include "store/redis_script.h"
#include "store/redis_slots.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- RESP -----------------------------------------------------------------
 */

/* A value as text, for comparing event streams: "type:depth:n:str:last". */
static void describe(const tg__resp_value *v, char *out, size_t cap) {
  snprintf(out, cap, "%d:%d:%lld:%.*s:%d%s|", (int)v->type, v->depth,
           (long long)v->n, (int)v->len, v->str ? v->str : "", (int)v->last,
           v->truncated ? "T" : "");
}

/* Every value of buf fed in pieces of `step` bytes (0: all at once), as
 * text; returns the reader's final status (1: values, -1: error). */
static int events(const char *buf, size_t len, size_t step, char *out,
                  size_t cap) {
  tg__resp_reader rd;
  tg__resp_reader_init(&rd);
  out[0] = '\0';
  size_t pos = 0;
  while (pos < len) {
    size_t n = step ? step : len - pos;
    if (n > len - pos)
      n = len - pos;
    size_t off = 0;
    while (off < n) {
      size_t used;
      tg__resp_value v;
      int rc = tg__resp_read(&rd, buf + pos + off, n - off, &used, &v);
      off += used;
      if (rc < 0)
        return -1;
      if (rc == 0)
        break;
      char one[700];
      describe(&v, one, sizeof one);
      strncat(out, one, cap - strlen(out) - 1);
    }
    pos += n;
  }
  return rd.state == 0 && rd.depth == 0 ? 1 : 0;
}

static void resp_values_in_any_split(void **state) {
  (void)state;
  static const char wire[] =
      "+OK\r\n-ERR bad thing\r\n:42\r\n:-7\r\n$3\r\nabc\r\n$0\r\n\r\n"
      "$-1\r\n*-1\r\n*0\r\n*3\r\n:1\r\n*2\r\n$1\r\nx\r\n*0\r\n$2\r\nyz\r\n"
      "$4\r\na\r\nb\r\n";
  char whole[4096], piece[4096];
  assert_int_equal(events(wire, sizeof wire - 1, 0, whole, sizeof whole), 1);
  assert_string_equal(
      whole, "1:0:2:OK:1|2:0:13:ERR bad thing:1|3:0:42::1|3:0:-7::1|"
             "4:0:3:abc:1|4:0:0::1|5:0:0::1|5:0:0::1|6:0:0::1|"
             "6:0:3::0|3:1:1::0|6:1:2::0|4:2:1:x:0|6:2:0::0|4:1:2:yz:1|"
             "4:0:4:a\r\nb:1|");
  /* the same values whatever the split */
  for (size_t step = 1; step < sizeof wire; step++) {
    assert_int_equal(events(wire, sizeof wire - 1, step, piece, sizeof piece),
                     1);
    assert_string_equal(piece, whole);
  }
}

static void resp_rejects_what_is_not_resp(void **state) {
  (void)state;
  static const char *const bad[] = {
      "?\r\n",                     /* no such type */
      ":12a\r\n",                  /* a letter in an integer */
      ":\r\n",                     /* no digits */
      ":1\rx",                     /* CR without LF */
      "$-2\r\n",                   /* a negative length other than -1 */
      "*-5\r\n",                   /* idem */
      "$3\r\nabcX\r\n",            /* the payload runs past its length */
      "+O\nK\r\n",                 /* a bare LF inside a line */
      ":99999999999999999999\r\n", /* 20 digits */
      ":-9223372036854775808\r\n", /* below -INT64_MAX */
      "$536870913\r\n",            /* above the bulk limit */
      "*16777217\r\n",             /* above the array limit */
  };
  char out[4096];
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    if (events(bad[i], strlen(bad[i]), 0, out, sizeof out) != -1) {
      print_error("accepted: %s\n", bad[i]);
      fail();
    }
  }
  /* nesting: TG__RESP_DEPTH_MAX arrays deep is fine, one more is not */
  char deep[256] = "";
  for (int i = 0; i < TG__RESP_DEPTH_MAX; i++)
    strcat(deep, "*1\r\n");
  strcat(deep, ":1\r\n");
  assert_int_equal(events(deep, strlen(deep), 0, out, sizeof out), 1);
  char deeper[256] = "*1\r\n";
  strcat(deeper, deep);
  assert_int_equal(events(deeper, strlen(deeper), 0, out, sizeof out), -1);
}

static void resp_long_strings_are_cut_not_kept(void **state) {
  (void)state;
  size_t n = 100000;
  char *wire = malloc(n + 32);
  assert_non_null(wire);
  int h = snprintf(wire, 32, "$%zu\r\n", n);
  memset(wire + h, 'q', n);
  memcpy(wire + h + n, "\r\n", 2);
  tg__resp_reader rd;
  tg__resp_reader_init(&rd);
  size_t used, total = (size_t)h + n + 2;
  tg__resp_value v;
  assert_int_equal(tg__resp_read(&rd, wire, total, &used, &v), 1);
  assert_int_equal(used, total);
  assert_int_equal(v.n, (int64_t)n);
  assert_int_equal(v.len, TG__RESP_STR_MAX);
  assert_true(v.truncated);
  free(wire);
}

/* The consumer's room for long strings: asked with the value's depth and
 * length, for bulk strings above TG__RESP_STR_MAX only; a string it gives
 * room for comes whole (NUL after it) whatever the split, one it refuses is
 * cut as before. */
typedef struct room_log {
  int asked;
  int depth[4];
  int64_t n[4];
  char *given[4];
  bool refuse_second;
} room_log;

static char *give_room(void *ctx, int depth, int64_t n) {
  room_log *lg = ctx;
  int k = lg->asked++;
  if (k >= 4)
    return NULL;
  lg->depth[k] = depth;
  lg->n[k] = n;
  if (k == 1 && lg->refuse_second)
    return NULL;
  lg->given[k] = malloc((size_t)n + 1);
  return lg->given[k];
}

static void resp_long_strings_kept_where_given_room(void **state) {
  (void)state;
  size_t n = 3000;
  char *wire = malloc(2 * n + 64);
  assert_non_null(wire);
  /* [a 3000-byte string, "short", a 3000-byte string] */
  int h = snprintf(wire, 64, "*3\r\n$%zu\r\n", n);
  size_t w = (size_t)h;
  for (size_t i = 0; i < n; i++)
    wire[w++] = (char)('a' + i % 26);
  w += (size_t)snprintf(wire + w, 64, "\r\n$5\r\nshort\r\n$%zu\r\n", n);
  memset(wire + w, 'z', n);
  w += n;
  memcpy(wire + w, "\r\n", 2);
  w += 2;
  for (int refuse = 0; refuse < 2; refuse++) {
    for (size_t step = 1; step <= w; step = step < 8 ? step + 1 : step * 3) {
      room_log lg = {0};
      lg.refuse_second = refuse;
      tg__resp_reader rd;
      tg__resp_reader_init(&rd);
      rd.room = give_room;
      rd.room_ctx = &lg;
      tg__resp_value v[4];
      int got = 0;
      for (size_t pos = 0; pos < w;) {
        size_t len = step < w - pos ? step : w - pos, off = 0;
        while (off < len) {
          size_t used;
          int rc = tg__resp_read(&rd, wire + pos + off, len - off, &used,
                                 &v[got < 3 ? got : 3]);
          assert_int_not_equal(rc, -1);
          off += used;
          if (rc == 1) {
            if (got == 1) { /* check the first string before it is reused */
              assert_int_equal(v[1].len, n);
              assert_false(v[1].truncated);
              assert_ptr_equal(v[1].str, lg.given[0]);
              for (size_t i = 0; i < n; i++)
                assert_int_equal(v[1].str[i], 'a' + i % 26);
              assert_int_equal(v[1].str[n], '\0');
            } else if (got == 2) { /* "short": valid until the next read */
              assert_int_equal(v[2].len, 5);
              assert_memory_equal(v[2].str, "short", 5);
            }
            got++;
          }
        }
        pos += len;
      }
      assert_int_equal(got, 4);
      assert_int_equal(lg.asked, 2); /* not for the array, nor "short" */
      assert_int_equal(lg.depth[0], 1);
      assert_int_equal(lg.n[1], (int64_t)n);
      if (refuse) {
        assert_true(v[3].truncated);
        assert_int_equal(v[3].len, TG__RESP_STR_MAX);
      } else {
        assert_false(v[3].truncated);
        assert_int_equal(v[3].len, n);
        assert_ptr_equal(v[3].str, lg.given[1]);
        assert_int_equal(v[3].str[n - 1], 'z');
      }
      assert_true(v[3].last);
      free(lg.given[0]);
      free(lg.given[1]);
    }
  }
  free(wire);
}

static void resp_commands(void **state) {
  (void)state;
  const char *argv[] = {"SET", "k", ""};
  size_t len[] = {3, 1, 0};
  char out[64];
  size_t n = tg__resp_command_size(3, argv, len);
  assert_int_equal(tg__resp_command(out, 3, argv, len), n);
  assert_int_equal(n, 26);
  assert_memory_equal(out, "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n", n);
}

/* ---- slots and redirections ------------------------------------------------
 */

static void crc16_and_key_slots(void **state) {
  (void)state;
  /* the check value of CRC16/XMODEM, and slots from Redis's specification */
  assert_int_equal(tg__crc16("123456789", 9), 0x31c3);
  assert_int_equal(tg__key_slot("foo", 3), 12182);
  assert_int_equal(tg__key_slot("{user1000}.following", 20),
                   tg__key_slot("{user1000}.followers", 20));
  assert_int_equal(tg__key_slot("{user1000}.following", 20),
                   tg__key_slot("user1000", 8));
  /* an empty tag hashes the whole name; only the first pair counts */
  assert_int_equal(tg__key_slot("foo{}{bar}", 10),
                   tg__crc16("foo{}{bar}", 10) & 16383);
  assert_int_equal(tg__key_slot("foo{{bar}}zap", 13),
                   tg__crc16("{bar", 4) & 16383);
  assert_int_equal(tg__key_slot("foo{bar}{zap}", 13),
                   tg__crc16("bar", 3) & 16383);
  assert_int_equal(tg__key_slot("a{b", 3), tg__crc16("a{b", 3) & 16383);
  /* the library's names: prefix:{key}:alg, the key is the tag */
  assert_int_equal(tg__key_slot("tg:{user:42}:fw", 15),
                   tg__key_slot("user:42", 7));
  /* a key with "}" ends the tag there */
  assert_int_equal(tg__key_slot("tg:{a}b}:fw", 11), tg__key_slot("a", 1));
}

static void redirections_parse(void **state) {
  (void)state;
  tg__redirect r;
  const char *m = "MOVED 3999 127.0.0.1:6381";
  assert_true(tg__parse_redirect(m, strlen(m), &r));
  assert_false(r.ask);
  assert_int_equal(r.slot, 3999);
  assert_int_equal(r.host_len, 9);
  assert_memory_equal(r.host, "127.0.0.1", 9);
  assert_int_equal(r.port, 6381);
  const char *a = "ASK 16383 ::1:7000";
  assert_true(tg__parse_redirect(a, strlen(a), &r));
  assert_true(r.ask);
  assert_int_equal(r.slot, 16383);
  assert_int_equal(r.host_len, 3);
  assert_int_equal(r.port, 7000);
  const char *own = "MOVED 12 :7002";
  assert_true(tg__parse_redirect(own, strlen(own), &r));
  assert_int_equal(r.host_len, 0);
  assert_int_equal(r.port, 7002);
  static const char *const bad[] = {
      "MOVED",        "MOVED 16384 h:1", "MOVED 1 h",
      "MOVED 1 h:0",  "MOVED 1 h:70000", "MOVED x h:1",
      "ASK 1  h:1",   "MOVE 1 h:1",      "NOSCRIPT No matching script",
      "MOVED 1 h:1x", "MOVED 1 [::1:5"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    assert_false(tg__parse_redirect(bad[i], strlen(bad[i]), &r));
  const char *host;
  size_t hl;
  int port;
  assert_true(tg__parse_hostport("[::1]:7000", 10, &host, &hl, &port));
  assert_int_equal(hl, 3);
  assert_memory_equal(host, "::1", 3);
  assert_false(tg__parse_hostport("nohost", 6, &host, &hl, &port));
}

static void slot_map(void **state) {
  (void)state;
  tg__slotmap *m = malloc(sizeof *m);
  assert_non_null(m);
  assert_int_equal(tg__slotmap_init(m), TG_OK);
  assert_int_equal(tg__cluster_seeds(m, "a:1,b:2,[::1]:3"), TG_OK);
  assert_int_equal(tg__slotmap_count(m), 3);
  assert_string_equal(tg__slotmap_addr(m, 2)->host, "::1");
  /* the same address is the same node */
  assert_int_equal(tg__slotmap_node(m, "b", 1, 2), 1);
  assert_int_equal(tg__slotmap_node(m, "b", 1, 3), 3);
  assert_int_equal(tg__slotmap_get(m, 5), TG__NO_NODE);
  tg__slotmap_set(m, 5, 1);
  assert_int_equal(tg__slotmap_get(m, 5), 1);
  uint32_t *ids = malloc(TG__SLOTS * sizeof *ids);
  assert_non_null(ids);
  for (unsigned s = 0; s < TG__SLOTS; s++)
    ids[s] = s < 100 ? 0 : TG__NO_NODE;
  tg__slotmap_replace(m, ids);
  assert_int_equal(tg__slotmap_get(m, 5), 0);
  assert_int_equal(tg__slotmap_get(m, 100), TG__NO_NODE);
  free(ids);
  tg__slotmap_free(m);
  /* bad seed lists */
  static const char *const bad[] = {"",         "a",  "a:1,",   ",a:1",
                                    "a:1,,b:2", ":1", "a:99999"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(tg__slotmap_init(m), TG_OK);
    assert_int_equal(tg__cluster_seeds(m, bad[i]), TG_EINVAL);
    tg__slotmap_free(m);
  }
  free(m);
}

/* ---- the engine, by hand ----------------------------------------------------
 */

typedef struct rig {
  tg__store *codec;
  tg__slotmap *map;
  tg__eng_stats st;
  tg__eng e;
  tg_quota q;
} rig;

/* An engine for one server (cluster false) or a Cluster whose map knows
 * nodes 0 and 1 and nothing else. */
static rig *rig_new(bool cluster, const char *password, int db) {
  rig *r = calloc(1, sizeof *r);
  assert_non_null(r);
  r->map = malloc(sizeof *r->map);
  assert_non_null(r->map);
  assert_int_equal(tg__slotmap_init(r->map), TG_OK);
  assert_int_equal(tg__cluster_seeds(r->map, "n0:7000,n1:7001"), TG_OK);
  assert_int_equal(tg__redis_codec_new(&r->codec, "tg", TG_FIXED_WINDOW, 1024),
                   TG_OK);
  tg__eng_config ec = {
      r->codec, password ? "user" : NULL, password, db, cluster, r->map,
      &r->st};
  assert_int_equal(tg__eng_init(&r->e, &ec), TG_OK);
  r->q = (tg_quota){.limit = 2, .period_ms = 60000};
  return r;
}

static void rig_free(rig *r) {
  tg__eng_free(&r->e);
  tg__slotmap_free(r->map);
  free(r->map);
  r->codec->ops->destroy(r->codec);
  free(r);
}

/* A hit of cost 1 on key k, on the server's clock. */
static void call_init(rig *r, tg__ereq *x, const char *k) {
  memset(x, 0, sizeof *x);
  tg__call *c = &x->call;
  assert_int_equal(
      tg__call_check(TG_FIXED_WINDOW, TG__OP_HIT, strlen(k), &r->q, &c->q),
      TG_OK);
  c->op = TG__OP_HIT;
  c->alg = TG_FIXED_WINDOW;
  c->key = k;
  c->key_len = strlen(k);
  c->arg = 1;
  c->store_time = true;
}

/* What node id has to send, all of it, as a NUL-terminated copy (marked
 * written). */
static char *take(rig *r, uint32_t id) {
  const char *p;
  size_t n;
  tg__eng_output(&r->e, id, &p, &n);
  char *s = malloc(n + 1);
  assert_non_null(s);
  memcpy(s, p, n);
  s[n] = '\0';
  tg__eng_written(&r->e, id, n);
  return s;
}

static int feed(rig *r, uint32_t id, const char *bytes) {
  return tg__eng_input(&r->e, id, bytes, strlen(bytes));
}

/* The engine's command for call x on a link with/without the module. */
static char *wire_of(rig *r, const tg__ereq *x, bool module, const char *sha) {
  tg__redis_args a;
  tg__redis_encode(r->codec, &x->call, module, sha, &a);
  size_t n = tg__resp_command_size(a.n, a.v, a.len);
  char *s = malloc(n + 1);
  assert_non_null(s);
  tg__resp_command(s, a.n, a.v, a.len);
  s[n] = '\0';
  return s;
}

static const char SHA[] = "0123456789abcdef0123456789abcdef01234567";
#define LOAD_REPLY "$40\r\n0123456789abcdef0123456789abcdef01234567\r\n"
/* COMMAND INFO TG.STEP TG.PROTOCOL: no module; the module; a module from
 * before the waits (no TG.PROTOCOL) */
#define NO_MODULE "*2\r\n*-1\r\n*-1\r\n"
#define HAS_MODULE                                                             \
  "*2\r\n*2\r\n$7\r\ntg.step\r\n:-10\r\n*2\r\n$11\r\ntg.protocol\r\n:1\r\n"
#define OLD_MODULE "*2\r\n*2\r\n$7\r\ntg.step\r\n:-10\r\n*-1\r\n"
/* The script's reply to a first hit at now 1700000000000000 us: no old
 * value, and it wrote. */
#define FIRST_HIT "*3\r\n$16\r\n1700000000000000\r\n$0\r\n\r\n:1\r\n"

/* Connects node id and answers its handshake (no AUTH, no SELECT). */
static void open_link_as(rig *r, uint32_t id, const char *info) {
  assert_true(tg__eng_wants(&r->e, id) & TG__WANT_CONNECT);
  assert_int_equal(tg__eng_connected(&r->e, id), TG_OK);
  char *hs = take(r, id);
  assert_non_null(strstr(hs, "$7\r\nCOMMAND\r\n$4\r\nINFO\r\n$7\r\nTG.STEP"
                             "\r\n$11\r\nTG.PROTOCOL\r\n"));
  assert_non_null(strstr(hs, "$6\r\nSCRIPT\r\n$4\r\nLOAD\r\n"));
  free(hs);
  assert_int_equal(feed(r, id, info), TG_OK);
  assert_int_equal(feed(r, id, LOAD_REPLY), TG_OK);
}

static void open_link(rig *r, uint32_t id, bool module) {
  open_link_as(r, id, module ? HAS_MODULE : NO_MODULE);
}

static void engine_handshake_then_pipeline(void **state) {
  (void)state;
  rig *r = rig_new(false, "pw", 3);
  tg__ereq a, b;
  call_init(r, &a, "a");
  call_init(r, &b, "b");
  tg__eng_submit(&r->e, &a);
  tg__eng_submit(&r->e, &b);
  assert_int_equal(tg__eng_wants(&r->e, 0), TG__WANT_CONNECT);
  assert_int_equal(tg__eng_connected(&r->e, 0), TG_OK);
  /* the handshake, in order, and no call before it is answered */
  char *hs = take(r, 0);
  const char *auth = strstr(hs, "AUTH\r\n$4\r\nuser\r\n$2\r\npw\r\n");
  const char *sel = strstr(hs, "SELECT\r\n$1\r\n3\r\n");
  const char *info = strstr(hs, "INFO\r\n");
  const char *load = strstr(hs, "LOAD\r\n");
  assert_true(auth && sel && info && load && auth < sel && sel < info &&
              info < load);
  /* ...and the script is the last thing sent */
  size_t hl = strlen(hs);
  assert_true(hl > tg__redis_script_len + 2);
  assert_memory_equal(hs + hl - 2 - tg__redis_script_len, tg__redis_script,
                      tg__redis_script_len);
  free(hs);
  assert_int_equal(tg__eng_wants(&r->e, 0), TG__WANT_READ);
  assert_int_equal(feed(r, 0, "+OK\r\n+OK\r\n" NO_MODULE), TG_OK);
  assert_int_equal(feed(r, 0, LOAD_REPLY), TG_OK);
  /* ready: both calls pipelined, in order, with the SHA the server gave */
  assert_true(tg__eng_wants(&r->e, 0) & TG__WANT_WRITE);
  char *out = take(r, 0);
  char *wa = wire_of(r, &a, false, SHA), *wb = wire_of(r, &b, false, SHA);
  assert_int_equal(strlen(out), strlen(wa) + strlen(wb));
  assert_memory_equal(out, wa, strlen(wa));
  assert_memory_equal(out + strlen(wa), wb, strlen(wb));
  free(out);
  free(wa);
  free(wb);
  /* the replies, one byte at a time */
  static const char two[] = FIRST_HIT FIRST_HIT;
  for (size_t i = 0; i < sizeof two - 1; i++)
    assert_int_equal(tg__eng_input(&r->e, 0, two + i, 1), TG_OK);
  tg__ereq *d = tg__eng_done(&r->e);
  assert_ptr_equal(d, &a);
  assert_int_equal(a.status, TG_OK);
  assert_true(a.out.r.allowed);
  assert_int_equal(a.out.r.count, 1);
  assert_ptr_equal(tg__eng_done(&r->e), &b);
  assert_null(tg__eng_done(&r->e));
  assert_int_equal(tg__eng_wants(&r->e, 0), 0);
  rig_free(r);
}

/* A password longer than the usual output buffer still goes out whole,
 * with the rest of the handshake. */
static void engine_long_password(void **state) {
  (void)state;
  size_t n = 200000;
  char *pw = malloc(n + 1);
  assert_non_null(pw);
  memset(pw, 'p', n);
  pw[n] = '\0';
  rig *r = rig_new(false, pw, 0);
  tg__ereq a;
  call_init(r, &a, "a");
  tg__eng_submit(&r->e, &a);
  assert_int_equal(tg__eng_connected(&r->e, 0), TG_OK);
  char *hs = take(r, 0);
  assert_true(strlen(hs) > n + tg__redis_script_len);
  assert_non_null(strstr(hs, "$200000\r\npppp"));
  assert_non_null(strstr(hs, "$6\r\nSCRIPT\r\n$4\r\nLOAD\r\n"));
  free(hs);
  assert_int_equal(feed(r, 0, "+OK\r\n" NO_MODULE LOAD_REPLY), TG_OK);
  free(take(r, 0));
  assert_int_equal(feed(r, 0, FIRST_HIT), TG_OK);
  assert_ptr_equal(tg__eng_done(&r->e), &a);
  assert_int_equal(a.status, TG_OK);
  rig_free(r);
  free(pw);
}

static void engine_noscript_and_module_loss_resend(void **state) {
  (void)state;
  rig *r = rig_new(false, NULL, 0);
  tg__ereq a, b;
  call_init(r, &a, "a");
  call_init(r, &b, "b");
  tg__eng_submit(&r->e, &a);
  open_link(r, 0, false);
  free(take(r, 0));
  /* the server lost the script: a did not run; it goes again after a
   * SCRIPT LOAD, and nothing overtakes that load */
  assert_int_equal(feed(r, 0, "-NOSCRIPT No matching script.\r\n"), TG_OK);
  assert_null(tg__eng_done(&r->e));
  tg__eng_submit(&r->e, &b);
  char *out = take(r, 0);
  char *wa = wire_of(r, &a, false, SHA), *wb = wire_of(r, &b, false, SHA);
  const char *load = strstr(out, "$6\r\nSCRIPT\r\n$4\r\nLOAD\r\n");
  const char *pa = strstr(out, wa), *pb = strstr(out, wb);
  assert_true(load && pa && pb && load < pa && pa < pb);
  free(out);
  free(wa);
  free(wb);
  assert_int_equal(feed(r, 0, LOAD_REPLY FIRST_HIT FIRST_HIT), TG_OK);
  assert_ptr_equal(tg__eng_done(&r->e), &a);
  assert_int_equal(a.status, TG_OK);
  assert_ptr_equal(tg__eng_done(&r->e), &b);
  assert_int_equal(r->st.resent, 1);
  rig_free(r);

  /* the module is unloaded under an open connection */
  r = rig_new(false, NULL, 0);
  call_init(r, &a, "a");
  tg__eng_submit(&r->e, &a);
  open_link(r, 0, true);
  out = take(r, 0);
  assert_non_null(strstr(out, "TG.STEP"));
  free(out);
  assert_int_equal(feed(r, 0, "-ERR unknown command 'TG.STEP'\r\n"), TG_OK);
  out = take(r, 0);
  wa = wire_of(r, &a, false, SHA);
  assert_non_null(strstr(out, "LOAD"));
  assert_non_null(strstr(out, wa)); /* the script now */
  free(out);
  free(wa);
  assert_int_equal(feed(r, 0, LOAD_REPLY FIRST_HIT), TG_OK);
  assert_ptr_equal(tg__eng_done(&r->e), &a);
  assert_int_equal(a.status, TG_OK);
  rig_free(r);
}

/* A call that carries a wait (a reservation) goes to the module when it
 * has TG.PROTOCOL, to the script when it is older (which refuses the
 * wait); a plain call to the module either way. */
static void engine_waits_skip_an_old_module(void **state) {
  (void)state;
  for (int old = 0; old < 2; old++) {
    rig *r = rig_new(false, NULL, 0);
    tg__ereq a, b;
    call_init(r, &a, "a");
    call_init(r, &b, "b");
    b.call.op = TG__OP_RESERVE;
    b.call.alg = TG_TOKEN_BUCKET;
    assert_int_equal(
        tg__call_check(TG_TOKEN_BUCKET, TG__OP_RESERVE, 1, &r->q, &b.call.q),
        TG_OK);
    b.call.wait_ns = 5000000;
    tg__eng_submit(&r->e, &a);
    tg__eng_submit(&r->e, &b);
    open_link_as(r, 0, old ? OLD_MODULE : HAS_MODULE);
    char *out = take(r, 0);
    char *wa = wire_of(r, &a, true, SHA), *wb = wire_of(r, &b, !old, SHA);
    const char *pa = strstr(out, wa), *pb = strstr(out, wb);
    assert_true(pa && pb && pa < pb);
    assert_int_equal(b.module, !old);
    free(out);
    free(wa);
    free(wb);
    rig_free(r);
  }
}

/* Calls written in full may have run: answered with the code, never sent
 * again. Calls not written in full cannot have run: sent on the next
 * connection, in order. */
static void engine_lost_connection_resends_only_unwritten(void **state) {
  (void)state;
  rig *r = rig_new(false, NULL, 0);
  tg__ereq x[3];
  call_init(r, &x[0], "a");
  call_init(r, &x[1], "b");
  call_init(r, &x[2], "c");
  for (int i = 0; i < 3; i++)
    tg__eng_submit(&r->e, &x[i]);
  open_link(r, 0, false);
  const char *p;
  size_t n;
  tg__eng_output(&r->e, 0, &p, &n);
  char *w0 = wire_of(r, &x[0], false, SHA);
  size_t first = strlen(w0);
  free(w0);
  /* all of the first, half of the second */
  tg__eng_written(&r->e, 0, first + 5);
  tg__eng_closed(&r->e, 0, TG_ECONNECT);
  assert_ptr_equal(tg__eng_done(&r->e), &x[0]);
  assert_int_equal(x[0].status, TG_ECONNECT);
  assert_null(tg__eng_done(&r->e));
  assert_int_equal(tg__eng_wants(&r->e, 0), TG__WANT_CONNECT);
  open_link(r, 0, false);
  char *out = take(r, 0);
  char *w1 = wire_of(r, &x[1], false, SHA), *w2 = wire_of(r, &x[2], false, SHA);
  assert_int_equal(strlen(out), strlen(w1) + strlen(w2));
  assert_memory_equal(out, w1, strlen(w1));
  free(out);
  free(w1);
  free(w2);
  /* a timeout after everything was written: nothing is sent again */
  tg__eng_closed(&r->e, 0, TG_ETIMEDOUT);
  assert_ptr_equal(tg__eng_done(&r->e), &x[1]);
  assert_int_equal(x[1].status, TG_ETIMEDOUT);
  assert_ptr_equal(tg__eng_done(&r->e), &x[2]);
  assert_int_equal(tg__eng_wants(&r->e, 0), 0);
  rig_free(r);
}

static void engine_corrupt_replies_drop_the_connection(void **state) {
  (void)state;
  rig *r = rig_new(false, NULL, 0);
  tg__ereq a, b;
  call_init(r, &a, "a");
  call_init(r, &b, "b");
  tg__eng_submit(&r->e, &a);
  tg__eng_submit(&r->e, &b);
  open_link(r, 0, false);
  free(take(r, 0));
  assert_int_equal(feed(r, 0, "garbage\r\n"), TG_ESTORE);
  assert_ptr_equal(tg__eng_done(&r->e), &a);
  assert_int_equal(a.status, TG_ESTORE);
  assert_ptr_equal(tg__eng_done(&r->e), &b);
  assert_int_equal(b.status, TG_ESTORE);
  assert_false(tg__eng_open(&r->e, 0));
  /* well-formed RESP that is not a decision's reply: that call fails, the
   * stream stays in step */
  call_init(r, &a, "a");
  call_init(r, &b, "b");
  tg__eng_submit(&r->e, &a);
  tg__eng_submit(&r->e, &b);
  open_link(r, 0, false);
  free(take(r, 0));
  assert_int_equal(feed(r, 0,
                        "*9\r\n:1\r\n:1\r\n:1\r\n:1\r\n:1\r\n:1\r\n:1\r\n"
                        ":1\r\n:1\r\n" FIRST_HIT),
                   TG_OK);
  assert_ptr_equal(tg__eng_done(&r->e), &a);
  assert_int_equal(a.status, TG_ESTORE);
  assert_ptr_equal(tg__eng_done(&r->e), &b);
  assert_int_equal(b.status, TG_OK);
  /* a reply to nothing sent */
  assert_int_equal(feed(r, 0, "+OK\r\n"), TG_ESTORE);
  assert_false(tg__eng_open(&r->e, 0));
  rig_free(r);
}

static void engine_refused_handshake(void **state) {
  (void)state;
  rig *r = rig_new(false, "wrong", 0);
  tg__ereq a;
  call_init(r, &a, "a");
  tg__eng_submit(&r->e, &a);
  assert_int_equal(tg__eng_connected(&r->e, 0), TG_OK);
  free(take(r, 0));
  assert_int_equal(feed(r, 0,
                        "-WRONGPASS invalid username-password pair\r\n"
                        "-NOAUTH Authentication required.\r\n"),
                   TG_OK);
  /* the last handshake reply decides */
  assert_int_equal(feed(r, 0, "-NOAUTH Authentication required.\r\n"),
                   TG_ESTORE);
  assert_false(tg__eng_open(&r->e, 0));
  /* the call was never sent, and will not be on this connection: it fails
   * as on a connect that failed */
  assert_ptr_equal(tg__eng_done(&r->e), &a);
  assert_int_equal(a.status, TG_ESTORE);
  assert_null(tg__eng_done(&r->e));
  rig_free(r);
}

/* A server that refuses the connection in its reply to COMMAND INFO (at
 * maxclients, in protected mode, loading) or closes it before the
 * handshake is answered: the queued calls fail at once, as on a connect
 * that failed. Before, the refusal was taken for a user without COMMAND,
 * the close left the calls queued, and the link wanted CONNECT again for
 * ever (a blocking Cluster call spun reconnecting). A user without
 * COMMAND (NOPERM) or a server without it is no refusal. */
static void engine_refused_connection(void **state) {
  (void)state;
  static const char *const refusals[] = {
      "-ERR max number of clients reached\r\n",
      "-DENIED Redis is running in protected mode\r\n",
      "-LOADING Redis is loading the dataset in memory\r\n"};
  for (size_t i = 0; i < 3; i++) {
    rig *r = rig_new(false, NULL, 0);
    tg__ereq a;
    call_init(r, &a, "a");
    tg__eng_submit(&r->e, &a);
    assert_int_equal(tg__eng_connected(&r->e, 0), TG_OK);
    free(take(r, 0));
    assert_int_equal(feed(r, 0, refusals[i]), TG_ESTORE);
    assert_false(tg__eng_open(&r->e, 0));
    assert_ptr_equal(tg__eng_done(&r->e), &a);
    assert_int_equal(a.status, TG_ESTORE);
    assert_false(tg__eng_wants(&r->e, 0) & TG__WANT_CONNECT);
    rig_free(r);
  }
  /* accepted, then closed before any reply */
  rig *r = rig_new(false, NULL, 0);
  tg__ereq a, b;
  call_init(r, &a, "a");
  tg__eng_submit(&r->e, &a);
  assert_int_equal(tg__eng_connected(&r->e, 0), TG_OK);
  free(take(r, 0));
  tg__eng_closed(&r->e, 0, TG_ECONNECT);
  assert_ptr_equal(tg__eng_done(&r->e), &a);
  assert_int_equal(a.status, TG_ECONNECT);
  assert_false(tg__eng_wants(&r->e, 0) & TG__WANT_CONNECT);
  /* a user without COMMAND: the call goes on as usual */
  call_init(r, &b, "b");
  tg__eng_submit(&r->e, &b);
  assert_true(tg__eng_wants(&r->e, 0) & TG__WANT_CONNECT);
  assert_int_equal(tg__eng_connected(&r->e, 0), TG_OK);
  free(take(r, 0));
  assert_int_equal(feed(r, 0,
                        "-NOPERM this user has no permissions to run the "
                        "'command' command\r\n"),
                   TG_OK);
  assert_true(tg__eng_open(&r->e, 0));
  assert_null(tg__eng_done(&r->e));
  rig_free(r);
}

/* A Cluster whose map is empty: calls wait for CLUSTER SLOTS. */
static void engine_parked_until_the_map_arrives(void **state) {
  (void)state;
  rig *r = rig_new(true, NULL, 0);
  tg__ereq a;
  call_init(r, &a, "a");
  tg__eng_submit(&r->e, &a);
  assert_true(tg__eng_parked(&r->e));
  assert_true(tg__eng_refresh_wanted(&r->e));
  assert_true(tg__eng_refresh(&r->e, 1));
  assert_false(tg__eng_refresh(&r->e, 0)); /* one at a time */
  open_link(r, 1, false);
  char *out = take(r, 1);
  assert_string_equal(out, "*2\r\n$7\r\nCLUSTER\r\n$5\r\nSLOTS\r\n");
  free(out);
  /* 0-8191 on n0:7000, 8192-16383 on "" (the node asked, n1:7001) with a
   * replica and Redis 7's metadata */
  assert_int_equal(
      feed(r, 1,
           "*2\r\n"
           "*3\r\n:0\r\n:8191\r\n*3\r\n$2\r\nn0\r\n:7000\r\n$3\r\nid0\r\n"
           "*4\r\n:8192\r\n:16383\r\n*4\r\n$0\r\n\r\n:7001\r\n$3\r\nid1\r\n"
           "*2\r\n$8\r\nhostname\r\n$1\r\nx\r\n"
           "*3\r\n$2\r\nr1\r\n:7005\r\n$3\r\nid5\r\n"),
      TG_OK);
  assert_int_equal(r->st.refreshes, 1);
  assert_false(tg__eng_parked(&r->e));
  assert_int_equal(tg__slotmap_get(r->map, 0), 0);
  assert_int_equal(tg__slotmap_get(r->map, 16383), 1);
  assert_int_equal(tg__slotmap_count(r->map), 2); /* no replica added */
  unsigned slot = tg__key_slot("a", 1);
  uint32_t node = slot < 8192 ? 0 : 1;
  assert_int_equal(a.node, node);
  if (node == 0)
    open_link(r, 0, false);
  out = take(r, node);
  char *wa = wire_of(r, &a, false, SHA);
  assert_string_equal(out, wa);
  free(out);
  free(wa);
  assert_int_equal(feed(r, node, FIRST_HIT), TG_OK);
  assert_ptr_equal(tg__eng_done(&r->e), &a);
  rig_free(r);
}

/* Both nodes connected, every slot on node 0. */
static void cluster_ready(rig *r) {
  uint32_t *ids = malloc(TG__SLOTS * sizeof *ids);
  assert_non_null(ids);
  for (unsigned s = 0; s < TG__SLOTS; s++)
    ids[s] = 0;
  tg__slotmap_replace(r->map, ids);
  free(ids);
}

static void engine_moved_and_ask(void **state) {
  (void)state;
  rig *r = rig_new(true, NULL, 0);
  cluster_ready(r);
  tg__ereq a;
  call_init(r, &a, "a");
  unsigned slot = tg__key_slot("a", 1);
  tg__eng_submit(&r->e, &a);
  open_link(r, 0, false);
  free(take(r, 0));
  /* MOVED to a node the map has never seen: the map learns it, the call
   * goes there; the rest of the map is probably stale too */
  char moved[64];
  snprintf(moved, sizeof moved, "-MOVED %u 10.0.0.9:7009\r\n", slot);
  assert_int_equal(feed(r, 0, moved), TG_OK);
  assert_int_equal(r->st.moved, 1);
  assert_int_equal(tg__eng_nodes(&r->e), 3);
  assert_int_equal(tg__slotmap_get(r->map, slot), 2);
  assert_string_equal(tg__slotmap_addr(r->map, 2)->host, "10.0.0.9");
  assert_true(tg__eng_refresh_wanted(&r->e));
  assert_int_equal(tg__eng_wants(&r->e, 2), TG__WANT_CONNECT);
  open_link(r, 2, false);
  char *out = take(r, 2);
  char *wa = wire_of(r, &a, false, SHA);
  assert_string_equal(out, wa);
  free(out);
  /* ASK back to node 1 (":7001" with no host would mean node 2's host; a
   * full address here): ASKING first, the map unchanged */
  char ask[64];
  snprintf(ask, sizeof ask, "-ASK %u n1:7001\r\n", slot);
  assert_int_equal(feed(r, 2, ask), TG_OK);
  assert_int_equal(r->st.ask, 1);
  assert_int_equal(tg__slotmap_get(r->map, slot), 2);
  open_link(r, 1, false);
  /* the socket takes ASKING alone, and the server answers it before the
   * rest is written: its +OK is a reply to what was sent (it was taken
   * for a reply to nothing, and the link closed with TG_ESTORE) */
  const char *p;
  size_t n;
  tg__eng_output(&r->e, 1, &p, &n);
  assert_int_equal(n, 16 + strlen(wa));
  assert_memory_equal(p, "*1\r\n$6\r\nASKING\r\n", 16);
  assert_memory_equal(p + 16, wa, strlen(wa));
  tg__eng_written(&r->e, 1, 16);
  assert_int_equal(feed(r, 1, "+OK\r\n"), TG_OK);
  out = take(r, 1);
  assert_string_equal(out, wa);
  free(out);
  free(wa);
  assert_null(tg__eng_done(&r->e)); /* ASKING's reply is not the call's */
  assert_int_equal(feed(r, 1, FIRST_HIT), TG_OK);
  assert_ptr_equal(tg__eng_done(&r->e), &a);
  assert_int_equal(a.status, TG_OK);
  assert_int_equal(a.redirects, 2);
  rig_free(r);
}

static void engine_redirections_are_bounded(void **state) {
  (void)state;
  rig *r = rig_new(true, NULL, 0);
  cluster_ready(r);
  tg__ereq a;
  call_init(r, &a, "a");
  unsigned slot = tg__key_slot("a", 1);
  tg__eng_submit(&r->e, &a);
  open_link(r, 0, false);
  /* two nodes sending the call to each other forever: from the MOVED back
   * to the first one on, the call goes after ASKING (the importing one of
   * a pair that disagrees serves it), and still no more than its
   * redirects */
  for (int i = 0; i <= TG__REDIRECTS_MAX; i++) {
    uint32_t at = (uint32_t)i % 2;
    if (i == 1)
      open_link(r, 1, false);
    char *out = take(r, at);
    assert_true(strlen(out) > 0);
    bool asked = strncmp(out, "*1\r\n$6\r\nASKING\r\n", 16) == 0;
    assert_int_equal(asked, i >= 2);
    free(out);
    char moved[64];
    snprintf(moved, sizeof moved, "%s-MOVED %u n%u:%u\r\n",
             asked ? "+OK\r\n" : "", slot, 1 - at, 7000 + 1 - at);
    assert_int_equal(feed(r, at, moved), TG_OK);
  }
  assert_ptr_equal(tg__eng_done(&r->e), &a);
  assert_int_equal(a.status, TG_ESTORE);
  /* the redirects followed: the last MOVED ended the call instead */
  assert_int_equal(r->st.moved, TG__REDIRECTS_MAX);
  rig_free(r);
}

static void engine_del_and_errors(void **state) {
  (void)state;
  rig *r = rig_new(true, NULL, 0);
  cluster_ready(r);
  tg__ereq d, a;
  call_init(r, &d, "gone");
  d.del = 1;
  call_init(r, &a, "a");
  tg__eng_submit(&r->e, &d);
  tg__eng_submit(&r->e, &a);
  open_link(r, 0, false);
  char *out = take(r, 0);
  assert_memory_equal(out, "*2\r\n$3\r\nDEL\r\n$12\r\ntg:{gone}:fw\r\n", 30);
  free(out);
  /* DEL answers an integer; an error reply is the script's error code */
  assert_int_equal(feed(r, 0, ":1\r\n-OOM command not allowed\r\n"), TG_OK);
  assert_ptr_equal(tg__eng_done(&r->e), &d);
  assert_int_equal(d.status, TG_OK);
  assert_ptr_equal(tg__eng_done(&r->e), &a);
  assert_int_equal(a.status, TG_ESTORE);
  /* CLUSTERDOWN: an error, and the map is probably stale */
  call_init(r, &a, "a");
  tg__eng_submit(&r->e, &a);
  free(take(r, 0));
  assert_int_equal(feed(r, 0, "-CLUSTERDOWN The cluster is down\r\n"), TG_OK);
  assert_ptr_equal(tg__eng_done(&r->e), &a);
  assert_int_equal(a.status, TG_ESTORE);
  assert_true(tg__eng_refresh_wanted(&r->e));
  rig_free(r);
}

/* A script reply decoded here is decoded by the one-server store too: the
 * differential tests against a server cover the decoding itself; here, a
 * denial and the answer to a corrupt value. */
static void engine_decodes_as_the_store(void **state) {
  (void)state;
  rig *r = rig_new(false, NULL, 0);
  tg__ereq a, b;
  call_init(r, &a, "a");
  call_init(r, &b, "b");
  tg__eng_submit(&r->e, &a);
  tg__eng_submit(&r->e, &b);
  open_link(r, 0, false);
  free(take(r, 0));
  /* the minute window ending at 1700000040000000 (a multiple of the
   * period) with 2 in it: denied, counted */
  assert_int_equal(
      feed(r, 0,
           "*3\r\n$16\r\n1700000000000000\r\n$20\r\n0:1700000040000000:2\r\n"
           ":1\r\n-TGCORRUPT the value is not tollgate's\r\n"),
      TG_OK);
  assert_ptr_equal(tg__eng_done(&r->e), &a);
  assert_int_equal(a.status, TG_OK);
  assert_false(a.out.r.allowed);
  assert_int_equal(a.out.r.count, 3);
  assert_int_equal(a.out.r.retry_after_ms, 40000);
  assert_ptr_equal(tg__eng_done(&r->e), &b);
  assert_int_equal(b.status, TG_ECORRUPT);
  rig_free(r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(resp_values_in_any_split),
      cmocka_unit_test(resp_rejects_what_is_not_resp),
      cmocka_unit_test(resp_long_strings_are_cut_not_kept),
      cmocka_unit_test(resp_long_strings_kept_where_given_room),
      cmocka_unit_test(resp_commands),
      cmocka_unit_test(crc16_and_key_slots),
      cmocka_unit_test(redirections_parse),
      cmocka_unit_test(slot_map),
      cmocka_unit_test(engine_handshake_then_pipeline),
      cmocka_unit_test(engine_long_password),
      cmocka_unit_test(engine_noscript_and_module_loss_resend),
      cmocka_unit_test(engine_waits_skip_an_old_module),
      cmocka_unit_test(engine_lost_connection_resends_only_unwritten),
      cmocka_unit_test(engine_corrupt_replies_drop_the_connection),
      cmocka_unit_test(engine_refused_handshake),
      cmocka_unit_test(engine_refused_connection),
      cmocka_unit_test(engine_parked_until_the_map_arrives),
      cmocka_unit_test(engine_moved_and_ask),
      cmocka_unit_test(engine_redirections_are_bounded),
      cmocka_unit_test(engine_del_and_errors),
      cmocka_unit_test(engine_decodes_as_the_store),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
