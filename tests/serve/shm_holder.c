/* SPDX-License-Identifier: MIT */
/*
 * shm_holder.c - a process that stops while holding a shared segment's
 * table lock: the "stuck process" of test_stall.py, for which the tests of
 * `tollgate serve --shm` need a lock that stays held as long as they like.
 *
 *   shm_holder NAME ALGORITHM CAPACITY SLIDING_MAX_ENTRIES
 *
 * attaches to the segment NAME as the shared-memory store does (with the
 * parameters it was created with: capacity, long keys = capacity, log
 * entries), takes its table lock, prints "held" and stops itself
 * (SIGSTOP). Every process that then needs that lock (to create a key)
 * waits for it. After SIGCONT it lets go and exits 0. It reaches into the
 * table's internals (src/store/table.h), as tests/test_shm.c does, because
 * no public call holds a lock while its caller is stopped.
 */
#include "store/lock.h"
#include "store/table.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int fail(const char *what) {
  fprintf(stderr, "shm_holder: %s\n", what);
  return 1;
}

int main(int argc, char **argv) {
  if (argc != 5)
    return fail("usage: shm_holder NAME ALGORITHM CAPACITY SLIDING_MAX");
  int alg = -1;
  for (int a = 0; a < TG_ALGORITHM_COUNT; a++)
    if (strcmp(argv[2], tg_algorithm_name((tg_algorithm)a)) == 0)
      alg = a;
  if (alg < 0)
    return fail("unknown algorithm");
  uint64_t capacity = strtoull(argv[3], NULL, 10);
  tg__table_params p = {(tg_algorithm)alg,
                        capacity,
                        capacity,
                        (uint32_t)strtoul(argv[4], NULL, 10),
                        true,
                        0,
                        false};
  int fd = shm_open(argv[1], O_RDWR, 0);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0)
    return fail("cannot open the segment");
  void *mem =
      mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  tg__table t;
  if (mem == MAP_FAILED ||
      tg__table_attach(&t, mem, (size_t)st.st_size, &p) != TG_OK)
    return fail("cannot attach to the segment");
  tg__wait wt = tg__wait_bound(10000);
  bool died;
  if (tg__lock_take(&t.h->lock, true, &wt, &died) != TG_OK)
    return fail("cannot take the table lock");
  printf("held\n");
  fflush(stdout);
  raise(SIGSTOP);
  tg__lock_release(&t.h->lock, true);
  munmap(mem, (size_t)st.st_size);
  return 0;
}
