/*
 * error.c - tg_strerror and tg_err_name, generated from TG_ERRNO_MAP so the
 * messages and names can never drift from the codes.
 */
#include "tollgate.h"

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
