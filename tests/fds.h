/* SPDX-License-Identifier: MIT */
/*
 * fds.h - how many of the process's sockets a child started by exec would
 * inherit (no FD_CLOEXEC): the stores' own connections must not be among
 * them, or a fork+exec'd program keeps the server's connections open and
 * can write into them. Header-only.
 */
#ifndef TG_TESTS_FDS_H
#define TG_TESTS_FDS_H

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>

static inline int inheritable_sockets(void) {
  DIR *d = opendir("/proc/self/fd");
  if (!d)
    return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (e->d_name[0] == '.')
      continue;
    int fd = atoi(e->d_name);
    struct stat st;
    if (fd == dirfd(d) || fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode))
      continue;
    int fl = fcntl(fd, F_GETFD);
    if (fl >= 0 && !(fl & FD_CLOEXEC))
      n++;
  }
  closedir(d);
  return n;
}

#endif /* TG_TESTS_FDS_H */
