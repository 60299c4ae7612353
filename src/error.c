/* SPDX-License-Identifier: MIT */
/*
 * error.c - tg_strerror and tg_err_name, generated from TG_ERRNO_MAP so the
 * messages and names can never drift from the codes; and tg_last_error, the
 * thread-local detail of the last failed tg_limiter_new.
 */
#include "error.h"
#include "tollgate.h"

#include <stdarg.h>
#include <stdio.h>

const char *tg_strerror(int err) {
  switch (err) {
  case TG_OK:
    return "success";
#define TG__ERR_MSG(name, val, msg)                                            \
  case TG_##name:                                                              \
    return msg;
    TG_ERRNO_MAP(TG__ERR_MSG)
#undef TG__ERR_MSG
  default:
    return "unknown error";
  }
}

const char *tg_err_name(int err) {
  switch (err) {
  case TG_OK:
    return "TG_OK";
#define TG__ERR_NAME(name, val, msg)                                           \
  case TG_##name:                                                              \
    return "TG_" #name;
    TG_ERRNO_MAP(TG__ERR_NAME)
#undef TG__ERR_NAME
  default:
    return "TG_UNKNOWN";
  }
}

/* One per thread, so concurrent tg_limiter_new calls never mix details. */
static _Thread_local char detail[256];

static _Thread_local int muted;

int tg__error_mute(int on) {
  int was = muted;
  muted = on;
  return was;
}

void tg__error_set(const char *fmt, ...) {
  if (muted)
    return;
  va_list ap;
  va_start(ap, fmt);
  /* clang-analyzer 14 reports ap uninitialised here although va_start just
   * set it: a false positive */
  // NOLINTNEXTLINE(clang-analyzer-valist.Uninitialized)
  (void)vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
}

void tg__error_clear(void) {
  if (!muted)
    detail[0] = '\0';
}

int tg__error_isset(void) { return detail[0] != '\0'; }

const char *tg_last_error(void) { return detail; }
