/* SPDX-License-Identifier: MIT */
/*
 * redis_script.h - the text of redis.lua, which the build embeds in the
 * library (cmake/embed.cmake writes redis_script.c from it), so the script
 * the Redis store loads is always the one it was built and tested with.
 */
#ifndef TG_REDIS_SCRIPT_H
#define TG_REDIS_SCRIPT_H

#include <stddef.h>

extern const char tg__redis_script[];     /* NUL-terminated */
extern const size_t tg__redis_script_len; /* bytes, without the NUL */

#endif /* TG_REDIS_SCRIPT_H */
