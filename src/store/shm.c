/*
 * shm.c - the shared-memory store: the concurrent table in a named POSIX
 * shared-memory segment, so unrelated processes on one host share one limit.
 *
 * No master process is needed: the first process to open the name creates
 * and initialises the segment, later ones attach. Creation and attachment are
 * serialised by flock() on the segment's descriptor, which the kernel drops
 * when a process dies, so a creator killed half way leaves a segment without
 * its magic, which the next process initialises again. The hot path takes
 * no lock a dead process could leave held (windows and buckets are one CAS;
 * sliding logs and structural changes use robust mutexes with repairs, see
 * table.c).
 */
#include "store.h"
#include "table.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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
  default:
    return TG_ESTORE;
  }
}

/* Opens the name, creating it with `mode` if absent. */
static int open_segment(const char *name, unsigned mode, int *fd) {
  for (int tries = 0; tries < 8; tries++) {
    *fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, (mode_t)mode);
    if (*fd >= 0) {
      /* shm_open applies the umask; the caller asked for exactly `mode` */
      if (fchmod(*fd, (mode_t)mode) != 0) {
        close(*fd);
        return TG_ESTORE;
      }
      return TG_OK;
    }
    if (errno != EEXIST)
      return errno_code(errno);
    *fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (*fd >= 0)
      return TG_OK;
    if (errno != ENOENT) /* ENOENT: unlinked in between; try again */
      return errno_code(errno);
  }
  return TG_ESTORE;
}

/* Sizes a fresh (or abandoned) segment to `bytes` of zeros and lays the
 * table out. The header, ctrl words and slots are allocated now, so the
 * table proper never faults for want of memory; long-key chunks and log
 * blocks are backed as they are used. */
static int initialise(int fd, size_t bytes, const tg__table_params *p,
                      tg__table *t, void **mem) {
  if (ftruncate(fd, 0) != 0 || ftruncate(fd, (off_t)bytes) != 0)
    return errno_code(errno);
  tg__table_params core = *p;
  core.long_keys = 0;
  tg__table_params none = core;
  none.algorithm = TG_FIXED_WINDOW; /* no log arena */
  size_t core_bytes = tg__table_bytes(&none);
  int e =
      posix_fallocate(fd, 0, (off_t)(core_bytes < bytes ? core_bytes : bytes));
  if (e != 0 && e != EOPNOTSUPP && e != EINVAL)
    return errno_code(e);
  *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (*mem == MAP_FAILED)
    return errno_code(errno);
  int rc = tg__table_init(t, *mem, p);
  if (rc != TG_OK)
    munmap(*mem, bytes);
  return rc;
}

int tg__shm_store_new(tg__store **out, const char *name, unsigned mode,
                      const tg__table_params *params) {
  tg__table_params p = *params;
  p.shared = true;
  size_t bytes = tg__table_bytes(&p);
  if (bytes == 0)
    return TG_EINVAL;
  int fd;
  int rc = open_segment(name, mode, &fd);
  if (rc != TG_OK)
    return rc;
  if (flock(fd, LOCK_EX) != 0) {
    close(fd);
    return TG_ESTORE;
  }
  struct stat st;
  tg__table t;
  void *mem = MAP_FAILED;
  size_t size = 0;
  if (fstat(fd, &st) != 0) {
    rc = TG_ESTORE;
  } else if (st.st_size == 0) {
    rc = initialise(fd, bytes, &p, &t, &mem); /* new, or creator died early */
    size = bytes;
  } else {
    size = (size_t)st.st_size;
    mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mem == MAP_FAILED) {
      rc = errno_code(errno);
    } else {
      const tg__table_hdr *h = mem;
      if (size >= sizeof *h && h->magic == 0 && size == bytes) {
        /* a creator died before publishing the magic: start again */
        munmap(mem, size);
        mem = MAP_FAILED;
        rc = initialise(fd, bytes, &p, &t, &mem);
      } else {
        rc = tg__table_attach(&t, mem, size, &p);
        if (rc != TG_OK) {
          munmap(mem, size);
          mem = MAP_FAILED;
        }
      }
    }
  }
  flock(fd, LOCK_UN);
  close(fd); /* the mapping stays valid */
  if (rc != TG_OK)
    return rc;
  rc = tg__table_store_wrap(out, &t, size, false);
  if (rc != TG_OK)
    munmap(mem, size);
  return rc;
}
