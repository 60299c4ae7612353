/* SPDX-License-Identifier: MIT */
/*
 * shm.c - the shared-memory store: the concurrent table in a named POSIX
 * shared-memory segment, so unrelated processes on one host share one limit.
 *
 * No master process is needed: the first process to open the name creates
 * it (O_EXCL) and initialises it, later ones attach. Creation and attachment
 * are serialised by flock() on the segment's descriptor, which the kernel
 * drops when a process dies, and the table's magic is written last, so a
 * creator killed half way leaves a segment without its magic (or of size 0),
 * which the next process initialises again. The hot path takes no lock a
 * dead process could leave held for good (windows and buckets are one CAS;
 * sliding logs and structural changes use tollgate's own locks, lock.h).
 *
 * What it trusts: a segment is used only if it is a regular file owned by
 * this process's effective user and opens no wider than shm_mode, so
 * another user cannot plant one (and keep write access to it) before us.
 * Its bytes are checked as they are read (table.c); its header is read with
 * pread() before anything is mapped.
 *
 * Memory: a tmpfs can be full (Docker's /dev/shm is 64 MiB, and any local
 * user can fill /dev/shm), and a write to a page it cannot supply is a
 * SIGBUS. So nothing is touched before it is backed: the header and the
 * slots are fallocated on creation and on every attach (cheap when
 * already there), and the arenas (long-key chunks, log blocks), which would
 * cost their full size up front, a page at a time through the table's
 * backing hook as they are first touched, with the descriptor kept open for
 * it. A failure is TG_ENOMEM for that call, never a signal.
 */
#include "../error.h"
#include "store.h"
#include "table.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Extents of the arenas are a page (so a sliding log with a few entries
 * costs a page, as it would in anonymous memory), or larger when that
 * keeps the bitmap that remembers them within 2^20 bits (128 KiB). */
#define EXTENTS_MAX (UINT64_C(1) << 20)

static int errno_code(int e) {
  switch (e) {
  case EINVAL:
  case ENAMETOOLONG:
  case ENOENT:
    return TG_EINVAL;
  case ENOMEM:
  case ENOSPC:
  case EFBIG:
    return TG_ENOMEM;
  case EACCES:
  case EPERM:
  case ELOOP:
  case EISDIR:
    return TG_EPERM;
  default:
    return TG_ESTORE;
  }
}

/* ---- opening ---- */

/* Opens the name, creating it with exactly `mode` (O_EXCL) if absent. */
static int open_segment(const char *name, unsigned mode, int *fd) {
  for (int tries = 0; tries < 8; tries++) {
    *fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, (mode_t)mode);
    if (*fd >= 0) {
      /* shm_open applies the umask; the caller asked for exactly `mode` */
      if (fchmod(*fd, (mode_t)mode) != 0) {
        tg__error_set("shared segment %s: fchmod: %s", name, strerror(errno));
        close(*fd);
        return TG_ESTORE;
      }
      return TG_OK;
    }
    if (errno != EEXIST)
      break;
    /* glibc's shm_open adds O_NOFOLLOW: a symbolic link is refused; and
     * it turns EISDIR into EINVAL, which for a name that exists (and that
     * O_EXCL took as well formed) can only mean a directory */
    *fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (*fd >= 0)
      return TG_OK;
    if (errno == EINVAL)
      errno = EISDIR;
    if (errno != ENOENT) /* ENOENT: unlinked in between; try again */
      break;
  }
  int e = errno;
  if (e == EACCES || e == EPERM)
    tg__error_set("shared segment %s refused: no permission to open it "
                  "(another user's segment?)",
                  name);
  else if (e == ELOOP || e == EISDIR)
    tg__error_set("shared segment %s refused: not a regular file", name);
  else
    tg__error_set("shared segment %s: cannot open: %s", name,
                  e == EEXIST || e == ENOENT ? "it kept disappearing"
                                             : strerror(e));
  return e == EEXIST || e == ENOENT ? TG_ESTORE : errno_code(e);
}

/* Refuses a segment another user could have planted or can still write:
 * not a regular file, not owned by the effective user, or mode bits beyond
 * the ones this limiter would create it with. */
static int check_owner(int fd, const char *name, unsigned mode) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    tg__error_set("shared segment %s: fstat: %s", name, strerror(errno));
    return TG_ESTORE;
  }
  if (!S_ISREG(st.st_mode)) {
    tg__error_set("shared segment %s refused: not a regular file", name);
    return TG_EPERM;
  }
  if (st.st_uid != geteuid()) {
    tg__error_set("shared segment %s refused: owned by uid %lu, not by this "
                  "process's effective uid %lu",
                  name, (unsigned long)st.st_uid, (unsigned long)geteuid());
    return TG_EPERM;
  }
  unsigned have = (unsigned)st.st_mode & 07777u;
  if (have & ~mode) {
    tg__error_set("shared segment %s refused: its mode %04o allows more "
                  "than shm_mode %04o",
                  name, have, mode);
    return TG_EPERM;
  }
  return TG_OK;
}

static void sleep_ms(unsigned ms) {
  struct timespec ts = {0, (long)ms * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}

/* The creation lock, waited for at most timeout_ms: a process stopped while
 * creating the segment must not hang everyone who opens it. */
static int lock_creation(int fd, const char *name, uint32_t timeout_ms) {
  tg__wait wt = tg__wait_bound(timeout_ms);
  for (unsigned pause = 1;;) {
    if (flock(fd, LOCK_EX | LOCK_NB) == 0)
      return TG_OK;
    if (errno == EINTR)
      continue;
    if (errno != EWOULDBLOCK) {
      tg__error_set("shared segment %s: flock: %s", name, strerror(errno));
      return TG_ESTORE;
    }
    if (tg__wait_over(&wt)) {
      tg__error_set("shared segment %s: another process has been creating "
                    "it for over %u ms (lock_timeout_ms)",
                    name, (unsigned)timeout_ms);
      return TG_EBUSY;
    }
    sleep_ms(pause);
    if (pause < 8)
      pause *= 2;
  }
}

/* Backs the first `core` bytes: what every key touches. */
static int back_core(int fd, const char *name, size_t core) {
  int e = posix_fallocate(fd, 0, (off_t)core);
  if (e == 0)
    return TG_OK;
  tg__error_set("shared segment %s: cannot reserve %zu bytes: %s (is its "
                "file system, usually /dev/shm, full or too small?)",
                name, core, strerror(e));
  return e == ENOSPC || e == ENOMEM || e == EFBIG ? TG_ENOMEM : TG_ESTORE;
}

/* ---- the arenas' backing ---- */

typedef struct shm_backing {
  tg__backing b; /* first: the table sees only this */
  int fd;
  uint64_t size; /* of the region */
} shm_backing;

/* Backs every extent of [off, off + len) this process has not seen backed.
 * posix_fallocate on pages that exist allocates nothing, so this costs one
 * call per extent per process, and is right whoever backed it before (the
 * region's own bytes are never trusted to say so). */
static int shm_back(tg__backing *b, uint64_t off, uint64_t len) {
  shm_backing *s = (shm_backing *)(void *)b;
  if (len == 0 || off + len <= b->lazy_from)
    return TG_OK;
  if (off < b->lazy_from) {
    len -= b->lazy_from - off;
    off = b->lazy_from;
  }
  uint64_t first = (off - b->ext_base) >> b->shift;
  uint64_t last = (off + len - 1 - b->ext_base) >> b->shift;
  for (uint64_t e = first; e <= last && e < b->nextents; e++) {
    uint64_t bit = UINT64_C(1) << (e % 64);
    if (__atomic_load_n(&b->done[e / 64], __ATOMIC_RELAXED) & bit)
      continue;
    uint64_t start = b->ext_base + (e << b->shift);
    uint64_t end = start + (UINT64_C(1) << b->shift);
    if (end > s->size)
      end = s->size;
    if (posix_fallocate(s->fd, (off_t)start, (off_t)(end - start)) != 0)
      return TG_ENOMEM;
    __atomic_fetch_or(&b->done[e / 64], bit, __ATOMIC_RELAXED);
  }
  return TG_OK;
}

static void shm_release(tg__backing *b) {
  shm_backing *s = (shm_backing *)(void *)b;
  close(s->fd);
  free(b->done);
  free(s);
}

/* Takes over fd. */
static int backing_new(int fd, size_t size, size_t core, tg__backing **out) {
  shm_backing *s = calloc(1, sizeof *s);
  long ps = sysconf(_SC_PAGESIZE);
  unsigned shift = 12;
  while (ps > 0 && (UINT64_C(1) << shift) < (uint64_t)ps)
    shift++;
  uint64_t base = core & ~((UINT64_C(1) << shift) - 1), span = size - base;
  while ((span >> shift) >= EXTENTS_MAX) {
    shift++;
    base = core & ~((UINT64_C(1) << shift) - 1);
    span = size - base;
  }
  uint64_t n = (span + (UINT64_C(1) << shift) - 1) >> shift;
  uint64_t *done = calloc((size_t)(n / 64 + 1), sizeof *done);
  if (!s || !done) {
    free(s);
    free(done);
    close(fd);
    tg__error_set("out of memory");
    return TG_ENOMEM;
  }
  s->fd = fd;
  s->size = size;
  s->b.back = shm_back;
  s->b.release = shm_release;
  s->b.lazy_from = core;
  s->b.shift = shift;
  s->b.ext_base = base;
  s->b.nextents = n;
  s->b.done = done;
  *out = &s->b;
  return TG_OK;
}

/* ---- creating and attaching ---- */

/* Sizes a fresh (or abandoned) segment to `bytes` of zeros, backs its core
 * and lays the table out. If the core cannot be backed, the segment is left
 * empty (size 0), which the next process initialises afresh: never half a
 * table, nor memory held for one. */
static int initialise(int fd, const char *name, size_t bytes, size_t core,
                      const tg__table_params *p, tg__table *t, void **mem) {
  if (ftruncate(fd, 0) != 0 || ftruncate(fd, (off_t)bytes) != 0) {
    int e = errno;
    tg__error_set("shared segment %s: cannot size it to %zu bytes: %s", name,
                  bytes, strerror(e));
    return errno_code(e);
  }
  int rc = back_core(fd, name, core);
  if (rc != TG_OK) {
    (void)ftruncate(fd, 0);
    return rc;
  }
  *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (*mem == MAP_FAILED) {
    int e = errno;
    tg__error_set("shared segment %s: mmap: %s", name, strerror(e));
    return errno_code(e);
  }
  rc = tg__table_init(t, *mem, p);
  if (rc != TG_OK) {
    tg__error_set("shared segment %s: cannot initialise the table", name);
    munmap(*mem, bytes);
  }
  return rc;
}

/* Attaches to a segment of `size` bytes, its header read with pread first
 * (reading a page of a full tmpfs through a mapping can fault; pread of a
 * hole reads zeros), checked, its core backed, then mapped and checked
 * again as mapped. */
static int attach(int fd, const char *name, size_t size, size_t bytes,
                  size_t core, const tg__table_params *p, tg__table *t,
                  void **mem) {
  tg__table_hdr h;
  memset(&h, 0, sizeof h);
  ssize_t got = pread(fd, &h, sizeof h, 0);
  if (got < 0) {
    tg__error_set("shared segment %s: read: %s", name, strerror(errno));
    return TG_ESTORE;
  }
  if ((size_t)got == sizeof h && h.magic == 0 && size == bytes)
    /* a creator died before publishing the magic: start again */
    return initialise(fd, name, bytes, core, p, t, mem);
  const char *why;
  int rc = tg__table_check_header(&h, size, p, &why);
  if (rc != TG_OK) {
    tg__error_set("shared segment %s: %s", name, why);
    return rc;
  }
  if ((rc = back_core(fd, name, core)) != TG_OK)
    return rc;
  *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (*mem == MAP_FAILED) {
    int e = errno;
    tg__error_set("shared segment %s: mmap: %s", name, strerror(e));
    return errno_code(e);
  }
  rc = tg__table_attach(t, *mem, size, p);
  if (rc != TG_OK) {
    tg__error_set("shared segment %s: changed while being attached", name);
    munmap(*mem, size);
  }
  return rc;
}

int tg__shm_store_new(tg__store **out, const char *name, unsigned mode,
                      const tg__table_params *params) {
  tg__table_params p = *params;
  p.shared = true;
  size_t bytes = tg__table_bytes(&p), core = tg__table_core_bytes(&p);
  if (bytes == 0) {
    tg__error_set("shared segment %s: table parameters out of range", name);
    return TG_EINVAL;
  }
  int fd;
  int rc = open_segment(name, mode, &fd);
  if (rc != TG_OK)
    return rc;
  if ((rc = check_owner(fd, name, mode)) != TG_OK ||
      (rc = lock_creation(fd, name, p.lock_timeout_ms)) != TG_OK) {
    close(fd);
    return rc;
  }
  struct stat st;
  tg__table t;
  void *mem = MAP_FAILED;
  size_t size = 0;
  if (fstat(fd, &st) != 0) {
    tg__error_set("shared segment %s: fstat: %s", name, strerror(errno));
    rc = TG_ESTORE;
  } else if (st.st_size == 0) {
    size = bytes; /* new, or its creator died before sizing it */
    rc = initialise(fd, name, bytes, core, &p, &t, &mem);
  } else {
    size = (size_t)st.st_size;
    rc = attach(fd, name, size, bytes, core, &p, &t, &mem);
  }
  flock(fd, LOCK_UN);
  if (rc != TG_OK) {
    close(fd);
    return rc;
  }
  if ((rc = backing_new(fd, size, core, &t.bk)) != TG_OK) {
    munmap(mem, size);
    return rc;
  }
  rc = tg__table_store_wrap(out, &t, size);
  if (rc != TG_OK) {
    munmap(mem, size);
    t.bk->release(t.bk);
  }
  return rc;
}
