/* SPDX-License-Identifier: MIT */
/*
 * redis_check.h - the start-up check of `tollgate serve --redis`.
 *
 * Before it says "ready", the server makes sure the Redis server it was
 * given answers: it connects, sends AUTH when a password is set, SELECT for
 * another database, and PING, over a plain socket of its own. The library's
 * status codes say what kind of failure happened (TG_ECONNECT, TG_ESTORE);
 * this check says which, in the words an operator can act on: "connect to
 * 10.0.0.5:6379: Connection refused", "AUTH: WRONGPASS invalid
 * username-password pair or user is disabled.".
 */
#ifndef TG_TOOLS_REDIS_CHECK_H
#define TG_TOOLS_REDIS_CHECK_H

#include "tollgate.h"

#include <stddef.h>

/* Checks the server *rc names, within its connect and command timeouts.
 * Returns TG_OK; or TG_ECONNECT (cannot connect), TG_ETIMEDOUT (no answer
 * in time) or TG_ESTORE (an error reply) with the reason in why[0..n). */
int redis_check(const tg_redis_config *rc, char *why, size_t n);

#endif
