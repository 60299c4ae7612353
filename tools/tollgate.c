/* SPDX-License-Identifier: MIT */
/*
 * tollgate.c - the `tollgate` command-line program: main() and the list of
 * subcommands. Each subcommand lives in its own file (cli.h lists them) and
 * uses only the public API, as any other caller would.
 */
#include "tollgate.h"
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static void usage(FILE *f) {
  fprintf(
      f, "usage: tollgate <command> [options]\n"
         "\n"
         "commands:\n"
         "  serve     answer rate-limit decisions over the Redis protocol\n"
         "            (redis-cli -p 6380 TG.HIT user:42 sliding_window 10 "
         "60000)\n"
         "  simulate  replay a traffic pattern through every algorithm on a\n"
         "            simulated clock; print a table, draw an SVG timeline\n"
         "  demo      replay photo uploads (3 per minute per user) through\n"
         "            every algorithm, printing each decision\n"
         "  bench     run the benchmark suite (tollgate_bench)\n"
         "  shm       list (shm ls) or remove (shm rm NAME) the shared-memory\n"
         "            segments that hold tollgate tables\n"
         "  version   print the version (also -V, --version)\n"
         "  help      print this message (also -h, --help)\n"
         "\n"
         "'tollgate COMMAND --help' describes a command's options.\n");
}

static int dispatch(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "serve") == 0)
    return cmd_serve(argc - 2, argv + 2);
  if (strcmp(cmd, "simulate") == 0)
    return cmd_simulate(argc - 2, argv + 2);
  if (strcmp(cmd, "demo") == 0)
    return cmd_demo(argc - 2, argv + 2);
  if (strcmp(cmd, "bench") == 0)
    return cmd_bench(argv[0], argc - 2, argv + 2);
  if (strcmp(cmd, "shm") == 0)
    return cmd_shm(argc - 2, argv + 2);
  if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0 ||
      strcmp(cmd, "-V") == 0) {
    printf("tollgate %s\n", tg_version_string());
    return 0;
  }
  if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 ||
      strcmp(cmd, "-h") == 0) {
    usage(stdout);
    return 0;
  }
  fprintf(stderr, "tollgate: unknown command '%s'\n", cmd);
  usage(stderr);
  return 2;
}

int main(int argc, char **argv) {
  int rc = dispatch(argc, argv);
  /* output that could not be written (a full disk, a closed pipe's EPIPE
   * once SIGPIPE is ignored) is a failure, not a silent 0 */
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "tollgate: writing the standard output: %s\n",
            strerror(errno ? errno : EIO));
    return rc == 0 ? 1 : rc;
  }
  return rc;
}
