/* SPDX-License-Identifier: MIT */
/*
 * redis_engine.c - the Redis protocol state machine without I/O (see
 * redis_engine.h for what it does and what it leaves to its drivers).
 *
 * Each link keeps three lists of calls: `queue` (submitted, not encoded),
 * `retry` (to send again: they did not run; they go before the queue so a
 * batch keeps its order where it can) and `flight` (encoded, in send order,
 * calls and the engine's own commands alike: replies arrive in that order).
 * Encoded bytes sit in the link's output buffer, addressed by offsets in
 * the link's byte stream, so "written in full" is one comparison: an item
 * whose last byte is at or before the written offset may have reached the
 * server; no other item can have run.
 */
#include "redis_engine.h"

#include "redis_script.h"
#include "redis_value.h"

#include "../atomic.h"
#include "../error.h"

#include <stdlib.h>
#include <string.h>

/* An output buffer holds the handshake (SCRIPT LOAD carries the script)
 * and then as many calls as fit: a pipeline's depth in bytes. */
#define OUT_MIN ((size_t)64 * 1024)
/* A decision's reply is an array of at most 6 short fields; a policy's,
 * of its time, each key's value and its verdict. A value is short but a
 * sliding log, which is kept whole in a block of its own (room_for); short
 * logs that together pass the text get blocks too (view_fill). */
#define VIEW_ELEMS (TG_RULES_MAX + 2)
#define VIEW_TEXT 2048

/* ASKING, as it goes on the wire. */
static const char ASKING[] = "*1\r\n$6\r\nASKING\r\n";
#define ASKING_LEN (sizeof ASKING - 1)

enum { L_CLOSED = 0, L_HANDSHAKE, L_READY };

typedef struct list {
  tg__eitem *head, *tail;
} list;

/* The reply being read, as the decoding reads a hiredis reply. */
typedef struct view {
  redisReply top;
  redisReply el[VIEW_ELEMS];
  redisReply *ptr[VIEW_ELEMS];
  char text[VIEW_TEXT];
  size_t used;             /* bytes of text used */
  size_t count;            /* elements seen */
  bool bad;                /* not the shape of a decision's reply */
  char *spill[VIEW_ELEMS]; /* the long strings' blocks (room_for) */
  size_t spills;
} view;

/* Where a CLUSTER SLOTS reply is being read. */
typedef struct slots_reader {
  bool ok;         /* well formed so far */
  int64_t start;   /* of the current range, -1 until read */
  int64_t end;     /* idem */
  unsigned e2;     /* index of the next element of the range */
  unsigned e3;     /* index of the next element of the master's entry */
  bool in_master;  /* inside the range's first node entry */
  size_t host_len; /* the master's host, once read */
  char host[TG__HOST_MAX + 1];
  bool have_host;
} slots_reader;

struct tg__elink {
  uint32_t id;
  int state;
  bool module;        /* calls are TG.STEP (the server has the module) */
  bool module_waits;  /* and it takes waits (TG.PROTOCOL exists): else the
                         calls that carry one go to the script */
  bool need_reload;   /* a SCRIPT LOAD must precede the next call */
  bool reloading;     /* one is in flight */
  bool slots_pending; /* a CLUSTER SLOTS waits to be encoded */
  int hs_left;        /* handshake replies still due */
  int hs_rc;          /* the first refusal among them */
  char sha[41];       /* the script's SHA1 (40 NUL bytes until known) */
  list queue, retry, flight;
  char *out;     /* output buffer, allocated at the first connect */
  size_t cap;    /* its size */
  size_t len;    /* bytes encoded */
  size_t sent;   /* of those, bytes written */
  uint64_t base; /* stream offset of out[0] */
  tg__resp_reader rd;
  view v;
  slots_reader sl;
  tg__eitem auth, select, info, load, reload, slots;
};

/* ---- lists ---- */

static void push(list *l, tg__eitem *it) {
  it->next = NULL;
  if (l->tail)
    l->tail->next = it;
  else
    l->head = it;
  l->tail = it;
}

static tg__eitem *pop(list *l) {
  tg__eitem *it = l->head;
  if (it) {
    l->head = it->next;
    if (!l->head)
      l->tail = NULL;
    it->next = NULL;
  }
  return it;
}

/* l2 appended to l (l2 emptied). */
static void join(list *l, list *l2) {
  if (!l2->head)
    return;
  if (l->tail)
    l->tail->next = l2->head;
  else
    l->head = l2->head;
  l->tail = l2->tail;
  l2->head = l2->tail = NULL;
}

static tg__ereq *as_call(tg__eitem *it) { return (tg__ereq *)(void *)it; }

static bool starts(const char *s, const char *prefix) {
  return s && strncmp(s, prefix, strlen(prefix)) == 0;
}

static void count(const tg__eng *e, uint64_t *field) {
  (void)e;
  tg__fetch_add(field, 1);
}

/* ---- engine ---- */

int tg__eng_init(tg__eng *e, const tg__eng_config *cfg) {
  memset(e, 0, sizeof *e);
  e->cfg = *cfg;
  e->refresh_node = TG__NO_NODE;
  e->links = calloc(TG__NODES_MAX, sizeof *e->links);
  if (cfg->cluster)
    e->ids = malloc(TG__SLOTS * sizeof *e->ids);
  if (!e->links || (cfg->cluster && !e->ids)) {
    tg__eng_free(e);
    return TG_ENOMEM;
  }
  return TG_OK;
}

static void view_reset(view *v);

void tg__eng_free(tg__eng *e) {
  if (e->links) {
    for (uint32_t i = 0; i < TG__NODES_MAX; i++) {
      if (e->links[i]) {
        view_reset(&e->links[i]->v);
        free(e->links[i]->out);
        free(e->links[i]);
      }
    }
  }
  free(e->links);
  free(e->ids);
  e->links = NULL;
  e->ids = NULL;
}

static char *room_for(void *ctx, int depth, int64_t n);

/* The link's reader at the start of a stream, with room_for as its room. */
static void reader_start(tg__elink *L) {
  tg__resp_reader_init(&L->rd);
  L->rd.room = room_for;
  L->rd.room_ctx = L;
}

static tg__elink *link_get(tg__eng *e, uint32_t id) {
  if (id >= TG__NODES_MAX)
    return NULL;
  tg__elink *L = e->links[id];
  if (!L) {
    L = calloc(1, sizeof *L);
    if (!L)
      return NULL;
    L->id = id;
    L->auth.kind = TG__EK_AUTH;
    L->select.kind = TG__EK_SELECT;
    L->info.kind = TG__EK_INFO;
    L->load.kind = TG__EK_LOAD;
    L->reload.kind = TG__EK_RELOAD;
    L->slots.kind = TG__EK_SLOTS;
    reader_start(L);
    e->links[id] = L;
  }
  return L;
}

static const tg__elink *link_at(const tg__eng *e, uint32_t id) {
  return id < TG__NODES_MAX ? e->links[id] : NULL;
}

/* Call r is answered. */
static void complete(tg__eng *e, tg__ereq *r, int status) {
  r->status = status;
  r->parked = 0;
  tg__eitem *it = &r->it;
  it->next = NULL;
  if (e->done_tail)
    e->done_tail->next = it;
  else
    e->done_head = it;
  e->done_tail = it;
}

tg__ereq *tg__eng_done(tg__eng *e) {
  tg__eitem *it = e->done_head;
  if (!it)
    return NULL;
  e->done_head = it->next;
  if (!e->done_head)
    e->done_tail = NULL;
  it->next = NULL;
  e->pending--;
  return as_call(it);
}

static void park(tg__eng *e, tg__ereq *r) {
  r->parked = 1;
  r->it.next = NULL;
  if (e->parked_tail)
    e->parked_tail->it.next = &r->it;
  else
    e->parked_head = r;
  e->parked_tail = r;
  e->want_refresh = true;
}

/* Queues r on its node's link: new calls at the queue's end, calls sent
 * again in the retry list. */
static void enqueue(tg__eng *e, tg__ereq *r, uint32_t node, bool again) {
  tg__elink *L = link_get(e, node);
  if (!L) {
    complete(e, r, TG_ENOMEM);
    return;
  }
  r->node = node;
  r->asked = 0;
  push(again ? &L->retry : &L->queue, &r->it);
}

/* Where a call goes by the map, or parked when the map does not say. */
static void route(tg__eng *e, tg__ereq *r) {
  uint32_t node = tg__slotmap_get(e->cfg.map, r->slot);
  if (node == TG__NO_NODE)
    park(e, r);
  else
    enqueue(e, r, node, false);
}

void tg__eng_submit(tg__eng *e, tg__ereq *r) {
  r->status = TG_OK;
  r->asking = r->asked = r->redirects = r->parked = r->cut = 0;
  r->moved_by = TG__NO_NODE;
  e->pending++;
  if (!e->cfg.cluster) {
    enqueue(e, r, 0, false);
    return;
  }
  if (r->rules) {
    r->slot = (uint16_t)tg__redis_rules_slot(r->rules, 0);
  } else {
    char name[TG__REDIS_NAME_MAX];
    size_t n = tg__redis_key_name(e->cfg.codec, &r->call, name);
    r->slot = (uint16_t)tg__key_slot(name, n);
  }
  route(e, r);
}

uint32_t tg__eng_nodes(const tg__eng *e) {
  return tg__slotmap_count(e->cfg.map);
}

/* ---- encoding ---- */

/* Whether size more bytes fit the output buffer, moving what is still to
 * be written to its start if that makes room. */
static bool room(tg__elink *L, size_t size) {
  if (L->cap - L->len >= size)
    return true;
  if (L->sent == 0)
    return false;
  memmove(L->out, L->out + L->sent, L->len - L->sent);
  L->base += L->sent;
  L->len -= L->sent;
  L->sent = 0;
  return L->cap - L->len >= size;
}

/* One of the engine's own commands, in the send order. */
static bool put_cmd(tg__elink *L, tg__eitem *it, int argc,
                    const char *const *argv, const size_t *len) {
  size_t size = tg__resp_command_size(argc, argv, len);
  if (!room(L, size))
    return false;
  L->len += tg__resp_command(L->out + L->len, argc, argv, len);
  it->end = L->base + L->len;
  push(&L->flight, it);
  return true;
}

static bool put_load(tg__elink *L, tg__eitem *it) {
  const char *argv[] = {"SCRIPT", "LOAD", tg__redis_script};
  size_t len[] = {6, 4, tg__redis_script_len};
  return put_cmd(L, it, 3, argv, len);
}

/* Call r's command (ASKING first when an ASK sent it here), taken from
 * the list `from`: false when it does not fit now. */
static bool put_call(tg__eng *e, tg__elink *L, tg__ereq *r, list *from,
                     int argc, const char *const *argv, const size_t *len) {
  size_t size = tg__resp_command_size(argc, argv, len);
  if (!room(L, size + (r->asking ? ASKING_LEN : 0)))
    return false;
  pop(from);
  if (r->cut) { /* cut while written before: sent again now */
    r->cut = 0;
    count(e, &e->cfg.stats->resent);
  }
  if (r->asking) {
    memcpy(L->out + L->len, ASKING, ASKING_LEN);
    L->len += ASKING_LEN;
    r->ask_end = L->base + L->len;
  }
  r->asked = r->asking;
  L->len += tg__resp_command(L->out + L->len, argc, argv, len);
  r->it.end = L->base + L->len;
  push(&L->flight, &r->it);
  return true;
}

/* Encodes what the link may send now, in order, while it fits. */
static void fill(tg__eng *e, tg__elink *L) {
  if (L->state != L_READY)
    return;
  if (L->need_reload) {
    if (!put_load(L, &L->reload))
      return; /* nothing may overtake it */
    L->need_reload = false;
    L->reloading = true;
  }
  if (L->slots_pending) {
    const char *argv[] = {"CLUSTER", "SLOTS"};
    size_t len[] = {7, 5};
    if (!put_cmd(L, &L->slots, 2, argv, len))
      return;
    L->slots_pending = false;
  }
  for (;;) {
    list *from = L->retry.head ? &L->retry : &L->queue;
    if (!from->head)
      return;
    tg__ereq *r = as_call(from->head);
    /* a call that carries a wait (a reservation, a policy of them) goes to
     * the script when the module predates the waits: both are atomic and
     * answer alike (the script needs no change for a wait) */
    bool waits = r->rules ? tg__redis_rules_wait(r->rules)
                          : r->call.op == TG__OP_RESERVE;
    r->module = L->module && (L->module_waits || !waits);
    if (r->rules) {
      const tg__redis_rules_args *ra =
          tg__redis_rules_encode(r->rules, r->module, L->sha);
      if (!put_call(e, L, r, from, ra->n, ra->v, ra->len))
        return;
      continue;
    }
    tg__redis_args a;
    if (r->del) {
      a.n = 2;
      a.v[0] = "DEL";
      a.len[0] = 3;
      a.v[1] = a.name;
      a.len[1] = tg__redis_key_name(e->cfg.codec, &r->call, a.name);
    } else {
      tg__redis_encode(e->cfg.codec, &r->call, r->module, L->sha, &a);
    }
    if (!put_call(e, L, r, from, a.n, a.v, a.len))
      return;
  }
}

/* ---- the driver's side ---- */

unsigned tg__eng_wants(const tg__eng *e, uint32_t id) {
  const tg__elink *L = link_at(e, id);
  if (!L)
    return 0;
  bool more =
      L->queue.head || L->retry.head || L->slots_pending || L->need_reload;
  if (L->state == L_CLOSED)
    return more ? TG__WANT_CONNECT : 0;
  unsigned w = 0;
  if (L->len > L->sent || (L->state == L_READY && more))
    w |= TG__WANT_WRITE;
  if (L->flight.head)
    w |= TG__WANT_READ;
  return w;
}

bool tg__eng_open(const tg__eng *e, uint32_t id) {
  const tg__elink *L = link_at(e, id);
  return L && L->state != L_CLOSED;
}

bool tg__eng_busy(const tg__eng *e, uint32_t id) {
  const tg__elink *L = link_at(e, id);
  return L && (L->queue.head || L->retry.head || L->flight.head ||
               L->slots_pending || L->len > L->sent);
}

int tg__eng_connected(tg__eng *e, uint32_t id) {
  tg__elink *L = link_get(e, id);
  if (!L)
    return TG_ENOMEM;
  const tg__eng_config *c = &e->cfg;
  if (!L->out) {
    /* room for the whole handshake at once (the script, and a password
     * of any length), and twice that for calls behind it */
    size_t hs = tg__redis_script_len + 256 +
                (c->username ? strlen(c->username) : 0) +
                (c->password ? strlen(c->password) : 0);
    L->cap = hs > OUT_MIN / 2 ? 2 * hs : OUT_MIN;
    L->out = malloc(L->cap);
    if (!L->out)
      return TG_ENOMEM;
  }
  L->state = L_HANDSHAKE;
  L->len = L->sent = 0;
  reader_start(L);
  L->module = L->module_waits = L->need_reload = L->reloading = false;
  memset(L->sha, 0, sizeof L->sha);
  L->hs_left = 0;
  L->hs_rc = TG_OK;
  if (c->password) {
    const char *argv[3] = {"AUTH"};
    size_t len[3] = {4};
    int n = 1;
    if (c->username) {
      argv[n] = c->username;
      len[n++] = strlen(c->username);
    }
    argv[n] = c->password;
    len[n++] = strlen(c->password);
    put_cmd(L, &L->auth, n, argv, len);
    L->hs_left++;
  }
  if (c->db != 0) {
    char db[24];
    size_t dn = tg__u64_dec(db, (uint64_t)c->db);
    const char *argv[] = {"SELECT", db};
    size_t len[] = {6, dn};
    put_cmd(L, &L->select, 2, argv, len);
    L->hs_left++;
  }
  const char *argv[] = {"COMMAND", "INFO", "TG.STEP", "TG.PROTOCOL"};
  size_t len[] = {7, 4, 7, 11};
  put_cmd(L, &L->info, 4, argv, len);
  put_load(L, &L->load);
  L->hs_left += 2;
  return TG_OK;
}

void tg__eng_output(tg__eng *e, uint32_t id, const char **data, size_t *len) {
  tg__elink *L = e->links && id < TG__NODES_MAX ? e->links[id] : NULL;
  if (!L || L->state == L_CLOSED) {
    *data = NULL;
    *len = 0;
    return;
  }
  fill(e, L);
  *data = L->out + L->sent;
  *len = L->len - L->sent;
}

void tg__eng_written(tg__eng *e, uint32_t id, size_t n) {
  tg__elink *L = id < TG__NODES_MAX ? e->links[id] : NULL;
  if (!L || L->state == L_CLOSED)
    return;
  if (n > L->len - L->sent)
    n = L->len - L->sent;
  L->sent += n;
  if (L->sent == L->len) {
    L->base += L->len;
    L->len = L->sent = 0;
  }
}

/* Sends the calls of list l again on their link (they did not run). */
static void requeue_front(tg__elink *L, list *l) {
  join(l, &L->retry);
  L->retry = *l;
  l->head = l->tail = NULL;
}

void tg__eng_closed(tg__eng *e, uint32_t id, int code) {
  tg__elink *L = id < TG__NODES_MAX ? e->links[id] : NULL;
  if (!L || L->state == L_CLOSED)
    return;
  /* closed before its handshake was answered: a connect that failed (a
   * server that accepts and closes at once, as one at maxclients does
   * after its refusal); reconnecting for the queued calls would go on as
   * long as the server does that */
  bool refused = L->state == L_HANDSHAKE;
  uint64_t written = L->base + L->sent;
  list again = {NULL, NULL};
  tg__eitem *it;
  while ((it = pop(&L->flight)) != NULL) {
    bool full = it->end <= written;
    switch (it->kind) {
    case TG__EK_CALL:
      if (full) {
        complete(e, as_call(it), code); /* it may have run: never resent */
      } else {
        /* not written in full: it did not run, and goes again (counted
         * in resent when it does: it may fail here first) */
        as_call(it)->asked = 0;
        as_call(it)->cut = 1;
        push(&again, it);
      }
      break;
    case TG__EK_SLOTS:
      if (e->refresh_node == id) {
        e->refresh_node = TG__NO_NODE;
        e->want_refresh = true;
      }
      break;
    default:
      break; /* the handshake and reloads are redone on connecting */
    }
  }
  requeue_front(L, &again);
  if (L->slots_pending && e->refresh_node == id) {
    /* not sent: let the driver choose where to ask now */
    L->slots_pending = false;
    e->refresh_node = TG__NO_NODE;
    e->want_refresh = true;
  }
  L->state = L_CLOSED;
  L->len = L->sent = 0;
  L->hs_left = 0;
  L->module = L->module_waits = L->need_reload = L->reloading = false;
  reader_start(L);
  view_reset(&L->v); /* a reply cut short: its blocks */
  if (refused) { /* none of its calls was sent: they fail, as on a connect */
    tg__eng_fail_queued(e, id, code);
    e->want_refresh = e->cfg.cluster;
  }
}

void tg__eng_fail_queued(tg__eng *e, uint32_t id, int code) {
  tg__elink *L = id < TG__NODES_MAX ? e->links[id] : NULL;
  if (!L)
    return;
  tg__eitem *it;
  while ((it = pop(&L->retry)) != NULL)
    complete(e, as_call(it), code);
  while ((it = pop(&L->queue)) != NULL)
    complete(e, as_call(it), code);
  if (L->slots_pending) {
    L->slots_pending = false;
    if (e->refresh_node == id) {
      e->refresh_node = TG__NO_NODE;
      e->want_refresh = true;
    }
  }
}

void tg__eng_fail_parked(tg__eng *e, int code) {
  while (e->parked_head) {
    tg__ereq *r = e->parked_head;
    e->parked_head = r->it.next ? as_call(r->it.next) : NULL;
    complete(e, r, code);
  }
  e->parked_tail = NULL;
}

bool tg__eng_parked(const tg__eng *e) { return e->parked_head != NULL; }

bool tg__eng_refresh_wanted(const tg__eng *e) {
  return e->cfg.cluster && e->want_refresh && e->refresh_node == TG__NO_NODE;
}

uint32_t tg__eng_refreshing(const tg__eng *e) { return e->refresh_node; }

bool tg__eng_refresh(tg__eng *e, uint32_t id) {
  if (!e->cfg.cluster || e->refresh_node != TG__NO_NODE ||
      id >= tg__eng_nodes(e))
    return false;
  tg__elink *L = link_get(e, id);
  if (!L)
    return false;
  L->slots_pending = true;
  e->refresh_node = id;
  e->want_refresh = false;
  return true;
}

void tg__eng_reset(tg__eng *e) {
  for (uint32_t i = 0; i < TG__NODES_MAX; i++) {
    tg__elink *L = e->links[i];
    if (!L)
      continue;
    L->flight.head = L->flight.tail = NULL;
    L->state = L_CLOSED;
    L->len = L->sent = 0;
    L->slots_pending = L->need_reload = L->reloading = false;
    reader_start(L);
  }
  e->refresh_node = TG__NO_NODE;
}

/* ---- replies ---- */

static int reply_type(tg__resp_type t) {
  switch (t) {
  case TG__RESP_STATUS:
    return REDIS_REPLY_STATUS;
  case TG__RESP_ERROR:
    return REDIS_REPLY_ERROR;
  case TG__RESP_INTEGER:
    return REDIS_REPLY_INTEGER;
  case TG__RESP_BULK:
    return REDIS_REPLY_STRING;
  case TG__RESP_NIL:
    return REDIS_REPLY_NIL;
  default:
    return REDIS_REPLY_ARRAY;
  }
}

static void view_reset(view *v) {
  memset(&v->top, 0, sizeof v->top);
  v->used = 0;
  v->count = 0;
  v->bad = false;
  while (v->spills > 0)
    free(v->spill[--v->spills]);
}

/* The reader's room (redis_resp.h) for a string too long for the view: a
 * block of its own, for a policy's sliding log only (the value read of a
 * sliding rule, element 1 + i of the reply to rule i); anything else long
 * is not a decision's reply, and is cut. The block is the view's until
 * the reply is decoded (or the link closes or is freed). */
static char *room_for(void *ctx, int depth, int64_t n) {
  tg__elink *L = ctx;
  view *v = &L->v;
  tg__eitem *h = L->flight.head;
  if (depth != 1 || !h || h->kind != TG__EK_CALL || !as_call(h)->rules ||
      v->count == 0 || v->count > TG_RULES_MAX || v->spills == VIEW_ELEMS ||
      !tg__redis_rules_long_value(as_call(h)->rules, v->count - 1))
    return NULL;
  char *p = malloc((size_t)n + 1);
  if (p)
    v->spill[v->spills++] = p;
  return p;
}

/* One value into a reply node. */
static void view_fill(view *v, redisReply *r, const tg__resp_value *x) {
  memset(r, 0, sizeof *r);
  r->type = reply_type(x->type);
  switch (x->type) {
  case TG__RESP_INTEGER:
    r->integer = x->n;
    break;
  case TG__RESP_ARRAY:
    r->elements = (size_t)x->n;
    break;
  case TG__RESP_NIL:
    break;
  default:
    if (x->truncated && x->type != TG__RESP_ERROR)
      v->bad = true;                 /* longer than any field of a decision */
    if (x->len > TG__RESP_STR_MAX) { /* kept whole in a block (room_for) */
      r->str = (char *)x->str;
      r->len = x->len;
      break;
    }
    char *to = NULL;
    if (VIEW_TEXT - v->used >= x->len + 1) {
      to = v->text + v->used;
      v->used += x->len + 1;
    } else if (v->spills < VIEW_ELEMS && (to = malloc(x->len + 1)) != NULL) {
      /* short values that together pass the text (a policy's sliding
       * logs of up to TG__RESP_STR_MAX bytes each): a block of its own */
      v->spill[v->spills++] = to;
    }
    if (!to) {
      v->bad = true;
      r->str = v->text + VIEW_TEXT - 1; /* "" */
      v->text[VIEW_TEXT - 1] = '\0';
      break;
    }
    r->str = to;
    memcpy(r->str, x->str, x->len);
    r->str[x->len] = '\0';
    r->len = x->len;
  }
}

static void view_value(view *v, const tg__resp_value *x) {
  if (x->depth == 0) {
    view_fill(v, &v->top, x);
    if (x->type == TG__RESP_ARRAY) {
      if (x->n > VIEW_ELEMS)
        v->bad = true;
      v->top.element = v->ptr;
    }
    return;
  }
  if (x->depth > 1)
    return; /* inside an element: not a decision's reply (flagged below) */
  size_t k = v->count++;
  if (k >= VIEW_ELEMS)
    return;
  view_fill(v, &v->el[k], x);
  v->ptr[k] = &v->el[k];
  if (x->type == TG__RESP_ARRAY)
    v->bad = true; /* a nested array */
}

/* ---- CLUSTER SLOTS ---- */

static void slots_value(tg__eng *e, tg__elink *L, const tg__resp_value *x) {
  slots_reader *s = &L->sl;
  switch (x->depth) {
  case 0:
    s->ok = x->type == TG__RESP_ARRAY || x->type == TG__RESP_NIL;
    for (unsigned i = 0; i < TG__SLOTS; i++)
      e->ids[i] = TG__NO_NODE;
    break;
  case 1: /* a range: [start, end, master, replicas...] */
    if (x->type != TG__RESP_ARRAY)
      s->ok = false;
    s->start = s->end = -1;
    s->e2 = 0;
    s->in_master = false;
    s->have_host = false;
    break;
  case 2: {
    unsigned i = s->e2++;
    s->in_master = i == 2 && x->type == TG__RESP_ARRAY;
    s->e3 = 0;
    if (i < 2 && x->type != TG__RESP_INTEGER)
      s->ok = false;
    else if (i == 0)
      s->start = x->n;
    else if (i == 1)
      s->end = x->n;
    break;
  }
  case 3: {
    if (!s->in_master)
      break;
    unsigned i = s->e3++;
    if (i == 0) {
      s->have_host =
          x->type == TG__RESP_BULK && !x->truncated && x->len <= TG__HOST_MAX;
      if (s->have_host) {
        memcpy(s->host, x->str, x->len);
        s->host_len = x->len;
      }
    } else if (i == 1) {
      if (!s->have_host || x->type != TG__RESP_INTEGER || x->n < 1 ||
          x->n > 65535 || s->start < 0 || s->end < s->start ||
          s->end >= (int64_t)TG__SLOTS) {
        s->ok = false;
        break;
      }
      const char *host = s->host;
      size_t hl = s->host_len;
      if (hl == 0 || (hl == 1 && host[0] == '?')) {
        /* the node does not know its address: the one we reach it at */
        const tg__node *me = tg__slotmap_addr(e->cfg.map, L->id);
        host = me->host;
        hl = strlen(host);
      }
      uint32_t node = tg__slotmap_node(e->cfg.map, host, hl, (int)x->n);
      if (node == TG__NO_NODE) {
        s->ok = false;
        break;
      }
      for (int64_t k = s->start; k <= s->end; k++)
        e->ids[k] = node;
    }
    break;
  }
  default:
    break;
  }
}

static void slots_done(tg__eng *e, tg__elink *L) {
  if (e->refresh_node == L->id)
    e->refresh_node = TG__NO_NODE;
  bool ok = L->sl.ok && L->v.top.type == REDIS_REPLY_ARRAY;
  if (ok) {
    tg__slotmap_replace(e->cfg.map, e->ids);
    count(e, &e->cfg.stats->refreshes);
  }
  /* the calls that waited for a map go where it says, or are refused */
  tg__ereq *r = e->parked_head;
  e->parked_head = e->parked_tail = NULL;
  while (r) {
    tg__ereq *next = r->it.next ? as_call(r->it.next) : NULL;
    r->parked = 0;
    uint32_t node = ok ? tg__slotmap_get(e->cfg.map, r->slot) : TG__NO_NODE;
    if (node == TG__NO_NODE)
      complete(e, r, TG_ESTORE);
    else
      enqueue(e, r, node, false);
    r = next;
  }
}

/* ---- calls' replies ---- */

/* Sends r again to node (it did not run), within its budget, counted in
 * *why (moved, ask, resent) only when it is sent: a call out of redirects
 * is answered TG_ESTORE instead. */
static void resend(tg__eng *e, tg__ereq *r, uint32_t node, uint64_t *why) {
  if (++r->redirects > TG__REDIRECTS_MAX) {
    complete(e, r, TG_ESTORE);
    return;
  }
  count(e, why);
  enqueue(e, r, node, true);
}

static void call_done(tg__eng *e, tg__elink *L, tg__ereq *r) {
  view *v = &L->v;
  const redisReply *top = &v->top;
  if (top->type == REDIS_REPLY_ERROR) {
    const char *t = top->str;
    if (!r->del && (r->module ? starts(t, "ERR unknown command")
                              : starts(t, "NOSCRIPT"))) {
      /* it did not run: the server lost the script, or the module went
       * away (this connection turns to the script until it reconnects) */
      L->module = false;
      if (!L->reloading)
        L->need_reload = true;
      resend(e, r, L->id, &e->cfg.stats->resent);
      return;
    }
    tg__redirect rd;
    if (e->cfg.cluster && tg__parse_redirect(t, top->len, &rd)) {
      const char *host = rd.host;
      size_t hl = rd.host_len;
      if (hl == 0) {
        host = tg__slotmap_addr(e->cfg.map, L->id)->host;
        hl = strlen(host);
      }
      uint32_t node = tg__slotmap_node(e->cfg.map, host, hl, rd.port);
      if (node == TG__NO_NODE) {
        complete(e, r, TG_ESTORE);
        return;
      }
      uint64_t *why = &e->cfg.stats->moved;
      if (rd.ask) {
        why = &e->cfg.stats->ask;
        r->asking = 1;
        r->moved_by = TG__NO_NODE; /* a MOVED after it is not a way back */
      } else if (node == r->moved_by) {
        /* MOVED back where a MOVED sent it from: the two nodes disagree
         * about the slot. That is a migration's end told to the source
         * first: it names the destination, which, importing until it is
         * told, names the source. The keys are all at the destination
         * then (a node refuses to give a slot away while it holds keys
         * of it), and it serves a call sent after ASKING, as an ASK's;
         * which of the two it is cannot be told from here, so each is
         * asked in turn (the source answers MOVED again), within the
         * call's redirects. The map is left for the refresh. */
        e->want_refresh = true;
        r->asking = 1;
        r->moved_by = L->id;
      } else {
        tg__slotmap_set(e->cfg.map, rd.slot, node);
        e->want_refresh = true;
        r->asking = 0;
        r->moved_by = L->id;
      }
      resend(e, r, node, why);
      return;
    }
    if (e->cfg.cluster && starts(t, "CLUSTERDOWN"))
      e->want_refresh = true;
    if (e->cfg.cluster && r->rules && starts(t, "TRYAGAIN")) {
      /* a policy's keys are split between the two nodes of a migrating
       * slot: nothing ran; the driver waits and submits it again */
      count(e, &e->cfg.stats->ask);
      complete(e, r, TG__ETRYAGAIN);
      return;
    }
  }
  if (r->del && top->type == REDIS_REPLY_INTEGER)
    complete(e, r, TG_OK);
  else if (r->del && top->type != REDIS_REPLY_ERROR)
    complete(e, r, TG_ESTORE);
  else if (r->rules)
    complete(e, r, v->bad ? TG_ESTORE : tg__redis_rules_decode(r->rules, top));
  else
    complete(e, r,
             v->bad ? TG_ESTORE : tg__redis_decode(&r->call, top, &r->out));
}

/* An error reply by which a server refuses a connection rather than one
 * command: no calls will run on it. */
static bool refusal(const char *s, size_t n) {
  static const char *const refused[] = {"ERR max number of clients reached",
                                        "DENIED",
                                        "LOADING",
                                        "NOAUTH",
                                        "MASTERDOWN",
                                        "BUSY "};
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    size_t k = strlen(refused[i]);
    if (n >= k && memcmp(s, refused[i], k) == 0)
      return true;
  }
  return false;
}

static int item_done(tg__eng *e, tg__elink *L, tg__eitem *it) {
  const redisReply *top = &L->v.top;
  switch (it->kind) {
  case TG__EK_CALL:
    call_done(e, L, as_call(it));
    return TG_OK;
  case TG__EK_SLOTS:
    slots_done(e, L);
    return TG_OK;
  case TG__EK_RELOAD:
    L->reloading = false;
    if (top->type == REDIS_REPLY_STRING && top->len == 40)
      memcpy(L->sha, top->str, 40);
    return TG_OK;
  case TG__EK_INFO:
    /* a nil entry: no such command; an error: a user without COMMAND
     * (NOPERM), a server or proxy without it, or the server's refusal of
     * the connection (refusal()), which otherwise went unseen until the
     * server closed the link.
     * TG.PROTOCOL: a module that takes waits (TG.STEP's RESERVE, and
     * TG.STEPS's, which a module from before them refuses) */
    if (top->type == REDIS_REPLY_ERROR && L->hs_rc == TG_OK &&
        refusal(top->str, top->len)) {
      L->hs_rc = TG_ESTORE;
      tg__error_set("the server refused the connection: %.*s",
                    (int)(top->len < 200 ? top->len : 200), top->str);
      return TG_ESTORE; /* at once: it closes the connection after it */
    }
    L->module = top->type == REDIS_REPLY_ARRAY && top->elements == 2 &&
                L->v.count >= 1 && L->v.el[0].type == REDIS_REPLY_ARRAY;
    L->module_waits =
        L->module && L->v.count >= 2 && L->v.el[1].type == REDIS_REPLY_ARRAY;
    break;
  case TG__EK_LOAD:
    if (top->type == REDIS_REPLY_STRING && top->len == 40)
      memcpy(L->sha, top->str, 40);
    else if (!L->module && L->hs_rc == TG_OK) {
      L->hs_rc = TG_ESTORE; /* no script and no module: nothing to run */
      tg__error_set("SCRIPT LOAD was refused and the server has no "
                    "tollgate module: nothing to decide with");
    }
    break;
  default: /* AUTH, SELECT */
    if (top->type == REDIS_REPLY_ERROR && L->hs_rc == TG_OK) {
      L->hs_rc = TG_ESTORE;
      tg__error_set("the connection's AUTH or SELECT was refused: %.*s",
                    (int)(top->len < 200 ? top->len : 200), top->str);
    }
    break;
  }
  if (--L->hs_left > 0)
    return TG_OK;
  if (L->hs_rc != TG_OK)
    return L->hs_rc;
  L->state = L_READY;
  return TG_OK;
}

int tg__eng_input(tg__eng *e, uint32_t id, const char *data, size_t len) {
  tg__elink *L = id < TG__NODES_MAX ? e->links[id] : NULL;
  if (!L || L->state == L_CLOSED)
    return TG_EINVAL; /* no connection to have read from: the caller's
                         mistake, which changes nothing */
  tg__error_clear();  /* a failure below says why */
  size_t pos = 0;
  while (pos < len) {
    size_t used;
    tg__resp_value x;
    int rc = tg__resp_read(&L->rd, data + pos, len - pos, &used, &x);
    pos += used;
    if (rc == 0)
      break;
    tg__eitem *h = L->flight.head;
    /* a reply is due once its command is written: for a call sent after
     * ASKING, ASKING's +OK once ASKING is (a socket may take it alone) */
    uint64_t due = !h ? 0
                   : h->kind == TG__EK_CALL && as_call(h)->asked
                       ? as_call(h)->ask_end
                       : h->end;
    if (rc < 0 || !h || due > L->base + L->sent) {
      /* not RESP, or a reply to nothing sent: the stream is lost */
      tg__error_set(rc < 0 ? "the server's bytes are not RESP"
                           : "a reply to nothing sent");
      tg__eng_closed(e, id, TG_ESTORE);
      return TG_ESTORE;
    }
    if (h->kind == TG__EK_CALL && as_call(h)->asked) {
      /* ASKING's +OK; were it refused, the call's own reply says where
       * the slot is */
      as_call(h)->asked = 0;
      if (!x.last) {
        tg__eng_closed(e, id, TG_ESTORE);
        return TG_ESTORE;
      }
      continue;
    }
    if (x.depth == 0)
      view_reset(&L->v);
    view_value(&L->v, &x);
    if (h->kind == TG__EK_SLOTS)
      slots_value(e, L, &x);
    if (!x.last)
      continue;
    pop(&L->flight);
    rc = item_done(e, L, h);
    view_reset(&L->v); /* its blocks, if any, freed at once */
    if (rc != TG_OK) {
      tg__eng_closed(e, id, rc);
      return rc;
    }
  }
  return TG_OK;
}
