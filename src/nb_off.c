/* SPDX-License-Identifier: MIT */
/*
 * nb_off.c - the non-blocking API in a build without hiredis: tg_nb_new is
 * TG_ENOTSUP (as a Redis limiter is), so nothing else can be reached; the
 * rest refuse a handle they can never have been given.
 */
#include "tollgate.h"

int tg_nb_new(tg_nb **out, const tg_config *cfg) {
  if (out)
    *out = NULL;
  /* what the header calls invalid stays so: only a call that would work
   * with hiredis is told this build lacks it */
  return out && cfg && cfg->redis ? TG_ENOTSUP : TG_EINVAL;
}

void tg_nb_destroy(tg_nb *nb) { (void)nb; }

int tg_nb_submit(tg_nb *nb, tg_nb_req *req) {
  (void)nb;
  (void)req;
  return TG_EINVAL;
}

int tg_nb_submit_at(tg_nb *nb, uint64_t now_us, tg_nb_req *req) {
  (void)now_us;
  return tg_nb_submit(nb, req);
}

int tg_nb_submit_rules(tg_nb *nb, tg_nb_req *req, tg_nb_rule *rules, size_t n,
                       unsigned flags) {
  (void)nb;
  (void)req;
  (void)rules;
  (void)n;
  (void)flags;
  return TG_EINVAL;
}

int tg_nb_submit_rules_at(tg_nb *nb, uint64_t now_us, tg_nb_req *req,
                          tg_nb_rule *rules, size_t n, unsigned flags) {
  (void)now_us;
  return tg_nb_submit_rules(nb, req, rules, n, flags);
}

tg_nb_req *tg_nb_done(tg_nb *nb) {
  (void)nb;
  return NULL;
}

size_t tg_nb_pending(const tg_nb *nb) {
  (void)nb;
  return 0;
}

long tg_nb_timeout(const tg_nb *nb) {
  (void)nb;
  return -1;
}

int tg_nb_tick(tg_nb *nb) {
  (void)nb;
  return TG_EINVAL;
}

unsigned tg_nb_links(const tg_nb *nb) {
  (void)nb;
  return 0;
}

unsigned tg_nb_wants(const tg_nb *nb, unsigned link) {
  (void)nb;
  (void)link;
  return 0;
}

int tg_nb_address(const tg_nb *nb, unsigned link, const char **host,
                  int *port) {
  (void)nb;
  (void)link;
  (void)host;
  (void)port;
  return TG_EINVAL;
}

int tg_nb_connected(tg_nb *nb, unsigned link) {
  (void)nb;
  (void)link;
  return TG_EINVAL;
}

int tg_nb_output(tg_nb *nb, unsigned link, const void **data, size_t *len) {
  (void)nb;
  (void)link;
  (void)data;
  (void)len;
  return TG_EINVAL;
}

int tg_nb_written(tg_nb *nb, unsigned link, size_t n) {
  (void)nb;
  (void)link;
  (void)n;
  return TG_EINVAL;
}

int tg_nb_input(tg_nb *nb, unsigned link, const void *data, size_t len) {
  (void)nb;
  (void)link;
  (void)data;
  (void)len;
  return TG_EINVAL;
}

int tg_nb_closed(tg_nb *nb, unsigned link, int code) {
  (void)nb;
  (void)link;
  (void)code;
  return TG_EINVAL;
}

int tg_nb_down(tg_nb *nb, unsigned link, int code) {
  return tg_nb_closed(nb, link, code);
}

int tg_nb_up(tg_nb *nb, unsigned link) {
  (void)nb;
  (void)link;
  return TG_EINVAL;
}

int tg_nb_stats(const tg_nb *nb, tg_stats *out, size_t size) {
  (void)nb;
  (void)out;
  (void)size;
  return TG_EINVAL;
}
