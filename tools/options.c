/* SPDX-License-Identifier: MIT */
/*
 * options.c - command-line option helpers shared by the subcommands (see
 * cli.h). Options are long only ("--name VALUE" or "--name=VALUE"): the
 * program has few of them, and long names document themselves in scripts.
 */
#include "cli.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int opt_value(const char *cmd, int argc, char **argv, int *i, const char *name,
              const char **value) {
  const char *a = argv[*i];
  size_t n = strlen(name);
  if (strncmp(a, name, n) != 0)
    return 0;
  if (a[n] == '=') {
    *value = a + n + 1;
    return 1;
  }
  if (a[n] != '\0')
    return 0;
  if (*i + 1 >= argc) {
    fprintf(stderr, "tollgate %s: %s needs a value\n", cmd, name);
    return -1;
  }
  *value = argv[++*i];
  return 1;
}

int opt_u64(const char *cmd, const char *opt, const char *text, uint64_t min,
            uint64_t max, uint64_t *out) {
  char *end = NULL;
  errno = 0;
  unsigned long long v = strtoull(text, &end, 10);
  if (text[0] < '0' || text[0] > '9' || errno != 0 || *end != '\0' || v < min ||
      v > max) {
    fprintf(stderr,
            "tollgate %s: %s wants a whole number from %" PRIu64 " to %" PRIu64
            ", not '%s'\n",
            cmd, opt, min, max, text);
    return -1;
  }
  *out = (uint64_t)v;
  return 0;
}

uint64_t cli_mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}
