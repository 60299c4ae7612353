/* SPDX-License-Identifier: MIT */
/*
 * error.h - the detail behind a failed tg_limiter_new: a thread-local
 * string (like dlerror) that tg_last_error returns. The code that knows
 * why a step failed writes it; tg_limiter_new clears it first and fills in
 * the code's own message when nothing more precise was written.
 */
#ifndef TG_ERROR_H
#define TG_ERROR_H

/* Replaces the calling thread's detail string (truncated to fit). */
void tg__error_set(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Empties it. */
void tg__error_clear(void);

/* True when a detail has been written since the last clear. */
int tg__error_isset(void);

/* While muted (on != 0), the calling thread's set and clear change
 * nothing: for code shared with tg_nb_input (the Redis engine) when a
 * decision runs it, since a decision leaves tg_last_error as it was.
 * Returns the previous setting, for the caller to restore. */
int tg__error_mute(int on);

#endif /* TG_ERROR_H */
