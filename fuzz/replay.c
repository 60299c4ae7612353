/* SPDX-License-Identifier: MIT */
/*
 * replay.c - runs a libFuzzer target without libFuzzer: feeds every file
 * named on the command line (every regular file of a directory, in name
 * order) to LLVMFuzzerTestOneInput once. Built with the normal compiler and
 * run by CTest over the committed corpus, so the seeds and every crash the
 * fuzzer once found stay regression tests on machines without clang.
 *
 * Each input runs in a forked child under an alarm, so one that crashes or
 * hangs is reported by name and the others still run; the exit status is 1
 * if any failed. Environment: TG_REPLAY_TIMEOUT_S (per input, default 30).
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_INPUT (1u << 20) /* bytes; libFuzzer's corpora stay far below */

static unsigned timeout_s = 30;
static long failed;

/* Reads path and feeds it to the target; in the child. */
static int feed(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    perror(path);
    return -1;
  }
  uint8_t *buf = malloc(MAX_INPUT);
  if (!buf) {
    fclose(f);
    return -1;
  }
  size_t n = fread(buf, 1, MAX_INPUT, f);
  int err = ferror(f);
  fclose(f);
  if (err) {
    perror(path);
    free(buf);
    return -1;
  }
  /* an exact-size copy, so ASan catches a read past the input's end */
  uint8_t *in = malloc(n ? n : 1);
  if (!in) {
    free(buf);
    return -1;
  }
  memcpy(in, buf, n);
  free(buf);
  LLVMFuzzerTestOneInput(in, n);
  free(in);
  return 0;
}

/* Runs one input in a child; counts it in `failed` unless it passed.
 * Returns -1 only when no child could be started. */
static int run_file(const char *path) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    return -1;
  }
  if (pid == 0) {
    alarm(timeout_s);
    /* exit, not _exit: LeakSanitizer and coverage profiles run at exit */
    exit(feed(path) == 0 ? 0 : 3);
  }
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
    ;
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
    return 0;
  failed++;
  if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM)
    fprintf(stderr, "replay: FAIL %s: hang (killed after %u s)\n", path,
            timeout_s);
  else if (WIFSIGNALED(st))
    fprintf(stderr, "replay: FAIL %s: signal %d\n", path, WTERMSIG(st));
  else
    fprintf(stderr, "replay: FAIL %s: exit status %d\n", path, WEXITSTATUS(st));
  return 0;
}

static int cmp_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Runs the regular files of dir in name order; returns files run or -1. */
static long run_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) {
    perror(dir);
    return -1;
  }
  char **names = NULL;
  size_t n = 0, cap = 0;
  long ran = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.')
      continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 64;
      char **nn = realloc(names, cap * sizeof *names);
      if (!nn) {
        ran = -1;
        break;
      }
      names = nn;
    }
    size_t len = strlen(dir) + strlen(e->d_name) + 2;
    names[n] = malloc(len);
    if (!names[n]) {
      ran = -1;
      break;
    }
    snprintf(names[n], len, "%s/%s", dir, e->d_name);
    n++;
  }
  closedir(d);
  if (ran == 0 && n)
    qsort(names, n, sizeof *names, cmp_names);
  for (size_t i = 0; i < n; i++) {
    struct stat st;
    if (ran >= 0 && stat(names[i], &st) == 0 && S_ISREG(st.st_mode)) {
      if (run_file(names[i]) != 0)
        ran = -1;
      else
        ran++;
    }
    free(names[i]);
  }
  free(names);
  return ran;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
    return 2;
  }
  const char *t = getenv("TG_REPLAY_TIMEOUT_S");
  if (t && atoi(t) > 0)
    timeout_s = (unsigned)atoi(t);
  long total = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      perror(argv[i]);
      return 1;
    }
    long ran = S_ISDIR(st.st_mode) ? run_dir(argv[i])
                                   : (run_file(argv[i]) == 0 ? 1 : -1);
    if (ran < 0)
      return 1;
    total += ran;
  }
  printf("replay: %ld input(s), %ld failed\n", total, failed);
  return total > 0 && failed == 0 ? 0 : 1;
}
