/* SPDX-License-Identifier: MIT */
/*
 * shm_cmd.c - `tollgate shm ls` and `tollgate shm rm NAME`: see and remove
 * the shared-memory segments that hold tollgate tables, without reaching for
 * `ls /dev/shm` and `rm`.
 *
 * On Linux a POSIX shared-memory name "/x" is the file /dev/shm/x. `ls` opens
 * each file there read-only, maps it read-only and reports those whose header
 * says "tollgate table": the algorithm, capacity and live keys from the
 * header, the size, owner and mode from the file. A segment is only ever
 * read, never locked, so listing cannot disturb (or wait for) the processes
 * using it, and whatever else lives in /dev/shm (other programs' segments,
 * truncated or garbage files, names we may not open) is skipped without
 * trusting a byte of it. This is the one command that looks inside the
 * library's structures: it reads the table header through src/store/table.h
 * and asks tg__table_attach, which only reads, whether the layout is sound.
 * The program is built with the library, so the two always agree on it.
 *
 * `rm` is tg_shm_unlink, after checking that the name holds a tollgate table
 * (--force removes another program's segment too).
 */
#include "cli.h"
#include "store/table.h"
#include "tollgate.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Where Linux keeps the names shm_open creates. */
#define SHM_DIR "/dev/shm"

static void usage(FILE *f) {
  fprintf(f, "usage: tollgate shm ls\n"
             "       tollgate shm rm [--force] NAME\n"
             "\n"
             "ls  lists the shared-memory segments (" SHM_DIR
             ") that hold tollgate\n"
             "    tables: name, algorithm, capacity, live keys, bytes, owner "
             "and mode.\n"
             "    Segments are only read; other files are skipped, and so are\n"
             "    segments you may not read.\n"
             "rm  removes a segment's name (tg_shm_unlink): limiters attached "
             "keep\n"
             "    working until they close; the next one to open the name "
             "starts an\n"
             "    empty table. NAME is as ls prints it (\"/myapp\"; the "
             "leading '/'\n"
             "    may be left out). Refuses a segment that is not a tollgate "
             "table\n"
             "    unless --force is given.\n");
}

/* What one segment holds, as far as a read-only look can tell. */
typedef enum seg_kind {
  SEG_OTHER,   /* not a tollgate table (or too short to tell) */
  SEG_TABLE,   /* a sound tollgate table of this version */
  SEG_VERSION, /* a tollgate table of another format version */
  SEG_CORRUPT  /* tollgate's magic, but a header that does not add up */
} seg_kind;

typedef struct seg_info {
  seg_kind kind;
  uint32_t version;
  tg_algorithm alg;
  uint64_t capacity, live;
  struct stat st;
} seg_info;

/* Opens /name read-only and looks at its header. Returns 0, or an errno
 * value when the name cannot be opened or examined. */
static int examine(const char *name, seg_info *si) {
  memset(si, 0, sizeof *si);
  int fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0)
    return errno;
  int err = 0;
  if (fstat(fd, &si->st) != 0)
    err = errno;
  if (err != 0 || !S_ISREG(si->st.st_mode) ||
      (uint64_t)si->st.st_size < sizeof(tg__table_hdr)) {
    close(fd);
    return err;
  }
  size_t size = (size_t)si->st.st_size;
  void *mem = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (mem == MAP_FAILED)
    return errno;
  const tg__table_hdr *h = mem;
  if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == TG__TABLE_MAGIC) {
    si->version = h->version;
    if (si->version != TG__TABLE_VERSION) {
      si->kind = SEG_VERSION;
    } else {
      /* attach compares the header with its own parameters and the size;
       * it reads the region and writes only into t */
      tg__table_params p = {(tg_algorithm)h->algorithm,
                            h->capacity,
                            h->nchunks,
                            h->log_entries,
                            true,
                            0,
                            false};
      tg__table t;
      if (tg__table_attach(&t, mem, size, &p) == TG_OK) {
        si->kind = SEG_TABLE;
        si->alg = (tg_algorithm)t.g.algorithm;
        si->capacity = t.g.capacity;
        si->live = __atomic_load_n(&h->live, __ATOMIC_RELAXED);
      } else {
        si->kind = SEG_CORRUPT;
      }
    }
  }
  munmap(mem, size);
  return 0;
}

static void owner_name(uid_t uid, char *buf, size_t cap) {
  struct passwd pw, *res = NULL;
  char tmp[1024];
  if (getpwuid_r(uid, &pw, tmp, sizeof tmp, &res) == 0 && res)
    snprintf(buf, cap, "%s", res->pw_name);
  else
    snprintf(buf, cap, "%lu", (unsigned long)uid);
}

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int shm_ls(void) {
  DIR *d = opendir(SHM_DIR);
  if (!d) {
    fprintf(stderr, "tollgate shm ls: cannot read %s: %s\n", SHM_DIR,
            strerror(errno));
    return 1;
  }
  char **names = NULL;
  size_t n = 0, cap = 0;
  int status = 0;
  const struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (de->d_name[0] == '.')
      continue;
    if (n == cap) {
      size_t ncap = cap ? cap * 2 : 64;
      char **grown = realloc(names, ncap * sizeof *grown);
      if (!grown) {
        status = 1;
        break;
      }
      names = grown;
      cap = ncap;
    }
    size_t len = strlen(de->d_name);
    names[n] = malloc(len + 2);
    if (!names[n]) {
      status = 1;
      break;
    }
    names[n][0] = '/';
    memcpy(names[n] + 1, de->d_name, len + 1);
    n++;
  }
  closedir(d);
  if (status != 0) {
    fprintf(stderr, "tollgate shm ls: out of memory\n");
  } else {
    qsort(names, n, sizeof *names, by_name);
    printf("%-32s  %-20s  %10s  %10s  %12s  %-10s  %4s  %s\n", "NAME",
           "ALGORITHM", "CAPACITY", "LIVE", "BYTES", "OWNER", "MODE", "STATE");
    for (size_t i = 0; i < n; i++) {
      seg_info si;
      if (examine(names[i], &si) != 0 || si.kind == SEG_OTHER)
        continue;
      char owner[64];
      owner_name(si.st.st_uid, owner, sizeof owner);
      unsigned mode = (unsigned)si.st.st_mode & 0777u;
      if (si.kind == SEG_TABLE) {
        printf("%-32s  %-20s  %10" PRIu64 "  %10" PRIu64 "  %12jd  %-10s  "
               "%04o  ok\n",
               names[i], tg_algorithm_name(si.alg), si.capacity, si.live,
               (intmax_t)si.st.st_size, owner, mode);
      } else {
        char state[48];
        if (si.kind == SEG_VERSION)
          snprintf(state, sizeof state, "format version %" PRIu32, si.version);
        else
          snprintf(state, sizeof state, "corrupt header");
        printf("%-32s  %-20s  %10s  %10s  %12jd  %-10s  %04o  %s\n", names[i],
               "?", "?", "?", (intmax_t)si.st.st_size, owner, mode, state);
      }
    }
  }
  for (size_t i = 0; i < n; i++)
    free(names[i]);
  free(names);
  return status;
}

static int shm_rm(int argc, char **argv) {
  bool force = false;
  const char *arg = NULL;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--force") == 0) {
      force = true;
    } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
      fprintf(stderr, "tollgate shm rm: unknown option '%s'\n", argv[i]);
      return 2;
    } else if (arg) {
      fprintf(stderr, "tollgate shm rm: one NAME at a time\n");
      return 2;
    } else {
      arg = argv[i];
    }
  }
  if (!arg) {
    usage(stderr);
    return 2;
  }
  char name[300];
  int len = snprintf(name, sizeof name, "%s%s", arg[0] == '/' ? "" : "/", arg);
  if (len < 0 || len > 255 || name[1] == '\0' || strchr(name + 1, '/')) {
    fprintf(stderr,
            "tollgate shm rm: '%s' is not a segment name ('/' then 1..254 "
            "bytes without '/')\n",
            arg);
    return 2;
  }
  seg_info si;
  int err = examine(name, &si);
  if (err == ENOENT) {
    fprintf(stderr, "tollgate shm rm: %s: no such segment\n", name);
    return 1;
  }
  if (err != 0 && err != EACCES) {
    fprintf(stderr, "tollgate shm rm: %s: %s\n", name, strerror(err));
    return 1;
  }
  if (si.kind == SEG_OTHER && !force) {
    fprintf(stderr, "tollgate shm rm: %s %s; --force removes it anyway\n", name,
            err == EACCES ? "cannot be read to check that it is a tollgate "
                            "table"
                          : "is not a tollgate table");
    return 1;
  }
  int rc = tg_shm_unlink(name);
  if (rc != TG_OK) {
    fprintf(stderr, "tollgate shm rm: %s: %s (%s)\n", name, tg_strerror(rc),
            tg_err_name(rc));
    return rc == TG_EINVAL ? 2 : 1;
  }
  return 0;
}

int cmd_shm(int argc, char **argv) {
  if (argc < 1) {
    usage(stderr);
    return 2;
  }
  if (strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "-h") == 0 ||
      strcmp(argv[0], "help") == 0) {
    usage(stdout);
    return 0;
  }
  if (strcmp(argv[0], "ls") == 0) {
    if (argc > 1) {
      if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(stdout);
        return 0;
      }
      fprintf(stderr, "tollgate shm ls: unexpected argument '%s'\n", argv[1]);
      return 2;
    }
    return shm_ls();
  }
  if (strcmp(argv[0], "rm") == 0) {
    if (argc > 1 &&
        (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
      usage(stdout);
      return 0;
    }
    return shm_rm(argc - 1, argv + 1);
  }
  fprintf(stderr, "tollgate shm: unknown subcommand '%s'\n", argv[0]);
  usage(stderr);
  return 2;
}
