/* SPDX-License-Identifier: MIT */
/*
 * cli.h - the subcommands of the `tollgate` program and the option-parsing
 * helpers they share. main() in tollgate.c dispatches to one cmd_* function
 * with the arguments after the subcommand's name; each returns the exit
 * status (0 success, 1 failure, 2 bad usage).
 */
#ifndef TG_TOOLS_CLI_H
#define TG_TOOLS_CLI_H

#include <stdbool.h>
#include <stdint.h>

int cmd_demo(int argc, char **argv);     /* demo.c */
int cmd_serve(int argc, char **argv);    /* serve.c */
int cmd_simulate(int argc, char **argv); /* simulate_cmd.c */
int cmd_shm(int argc, char **argv);      /* shm_cmd.c */
/* bench.c; argv0 is the program's own argv[0], to find the benchmark */
int cmd_bench(const char *argv0, int argc, char **argv);

/* If argv[*i] is the option `name` ("--port"), as "--port VALUE" or
 * "--port=VALUE", stores VALUE in *value, advances *i past it and returns
 * 1. Returns 0 if argv[*i] is another option, -1 (after a message naming
 * `cmd`) if the value is missing. */
int opt_value(const char *cmd, int argc, char **argv, int *i, const char *name,
              const char **value);

/* Parses a whole decimal number in [min, max]; prints a message naming cmd
 * and opt and returns -1 if it is not one. */
int opt_u64(const char *cmd, const char *opt, const char *text, uint64_t min,
            uint64_t max, uint64_t *out);

/* CLOCK_MONOTONIC in milliseconds (options.c). */
uint64_t cli_mono_ms(void);

#endif
