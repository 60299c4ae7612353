/* SPDX-License-Identifier: MIT */
/*
 * bench.c - `tollgate bench`: runs the benchmark suite, the tollgate_bench
 * program (bench/tollgate_bench.c; BENCHMARKS.md explains its output), with
 * the arguments given, e.g. `tollgate bench --quick`.
 *
 * The benchmark is a separate program so that the library's benchmarks stay
 * one binary with one output format; this command only finds it: --bench
 * PATH, else $TOLLGATE_BENCH, else beside this program, else where the
 * install puts it (libexec/tollgate/, relative to this program's bin/), else
 * in the build tree's bench/ next to tools/, else on PATH.
 */
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef PATH_MAX
#define PATH_MAX 4096
#endif
/* tollgate_bench relative to an installed tollgate's directory (CMake sets
 * it from the install's bindir and libexecdir). */
#ifndef TG_BENCH_INSTALLED
#define TG_BENCH_INSTALLED "../libexec/tollgate/tollgate_bench"
#endif

/* Runs path with args (argv[0] replaced); returns only on failure. */
static void run(const char *path, int argc, char **argv) {
  char **args = calloc((size_t)argc + 2, sizeof *args);
  if (!args)
    return;
  args[0] = (char *)path;
  for (int i = 0; i < argc; i++)
    args[i + 1] = argv[i];
  if (strchr(path, '/'))
    execv(path, args);
  else
    execvp(path, args);
  free(args);
}

/* The directory of the running program, from /proc (Linux) or argv0. */
static int self_dir(const char *argv0, char *dir, size_t cap) {
  ssize_t n = readlink("/proc/self/exe", dir, cap - 1);
  if (n > 0) {
    dir[n] = '\0';
  } else if (strchr(argv0, '/') && strlen(argv0) < cap) {
    memcpy(dir, argv0, strlen(argv0) + 1);
  } else {
    return -1;
  }
  char *slash = strrchr(dir, '/');
  if (!slash)
    return -1;
  *slash = '\0';
  return 0;
}

int cmd_bench(const char *argv0, int argc, char **argv) {
  const char *explicit_path = NULL;
  if (argc >= 1 &&
      (strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "-h") == 0)) {
    printf("usage: tollgate bench [--bench PATH] [tollgate_bench options]\n"
           "Runs the benchmark suite; `tollgate bench --help-bench` shows "
           "its options\n(--quick, --filter TEXT, --reps N, --min-time S).\n");
    return 0;
  }
  /* --bench PATH (or --bench=PATH) anywhere; the rest, in order, is the
   * benchmark's (argv is rewritten in place, shorter) */
  int kept = 0;
  for (int i = 0; i < argc; i++) {
    int r = opt_value("bench", argc, argv, &i, "--bench", &explicit_path);
    if (r < 0)
      return 2;
    if (r == 0)
      argv[kept++] = argv[i];
  }
  argc = kept;
  /* --help-bench: the benchmark's own --help */
  char help[] = "--help";
  char *help_args[] = {help};
  if (argc >= 1 && strcmp(argv[0], "--help-bench") == 0) {
    argc = 1;
    argv = help_args;
  }
  const char *env = getenv("TOLLGATE_BENCH");
  if (explicit_path || (env && *env)) {
    const char *p = explicit_path ? explicit_path : env;
    run(p, argc, argv);
    fprintf(stderr, "tollgate bench: cannot run %s: %s\n", p, strerror(errno));
    return 1;
  }
  char dir[PATH_MAX], path[PATH_MAX + 64];
  if (self_dir(argv0, dir, sizeof dir) == 0) {
    const char *rel[] = {"/tollgate_bench", ("/" TG_BENCH_INSTALLED),
                         "/../bench/tollgate_bench"};
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
      snprintf(path, sizeof path, "%s%s", dir, rel[i]);
      if (access(path, X_OK) == 0)
        run(path, argc, argv);
    }
  }
  run("tollgate_bench", argc, argv);
  fprintf(stderr,
          "tollgate bench: tollgate_bench not found beside this program, in "
          "%s, in ../bench/ or on PATH.\nBuild it (it is built and installed "
          "with the project unless -DTG_BUILD_BENCH=OFF) or pass --bench "
          "PATH.\n",
          TG_BENCH_INSTALLED);
  return 1;
}
