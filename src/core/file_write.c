/*
 * file_write.c: files that tpsh writes whole (the --trace file, tp.trace.save/svg, `tpsh test --junit`).
 *
 * A regular file is written to a temporary file beside it (created exclusively, mode 0666 less the umask)
 * and renamed over it: a reader never sees half a file, a write that fails (a full disk) leaves the old
 * file as it was, and a symbolic link at the target's name is replaced, never written through (written
 * in place with fopen, the file would follow whatever link is planted at its name in a shared directory,
 * and a trace path in /tmp would make tpsh rewrite the link's target). A name that is neither absent, a
 * regular file nor a link (a character device such as /dev/null or /dev/full, a FIFO) is written in
 * place: renaming over it would replace the device, and it cannot be half-read.
 */
#define _GNU_SOURCE
#include "core/internal.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Whether path names something to write in place (see above). */
static int in_place(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode);
}

static int write_fd(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* A new temporary beside path (its name in tmp), open for writing, or -1 with errno. */
static int open_temp(const char *path, char *tmp, size_t cap) {
  const char *slash = strrchr(path, '/');
  int dir = slash ? (int)(slash - path + 1) : 0;
  for (int k = 0; k < 100; k++) {
    snprintf(tmp, cap, "%.*s.%s.tpsh-%d-%d.tmp", dir, path, path + dir, (int)getpid(), k);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  return -1;
}

int tpsh_write_whole(const char *path, const void *buf, int64_t n) {
  if (in_place(path)) {
    int fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);
    if (fd < 0) return tpsh_error(TPSH_EINVAL, "%s: %s", path, strerror(errno));
    int bad = write_fd(fd, buf, (size_t)n) != 0 ? errno : 0;
    if (close(fd) != 0 && !bad) bad = errno;
    if (bad) return tpsh_error(TPSH_EINVAL, "%s: %s (what it holds is cut short)", path, strerror(bad));
    return TPSH_OK;
  }
  char tmp[4200];
  int fd = open_temp(path, tmp, sizeof tmp);
  if (fd < 0) return tpsh_error(TPSH_EINVAL, "%s: %s", path, strerror(errno));
  int bad = write_fd(fd, buf, (size_t)n) != 0 ? errno : 0;
  if (close(fd) != 0 && !bad) bad = errno;
  if (!bad && rename(tmp, path) != 0) bad = errno;
  if (bad) {
    unlink(tmp);
    return tpsh_error(TPSH_EINVAL, "%s: %s (the file was not written; what was there is left as it was)", path,
                      strerror(bad));
  }
  return TPSH_OK;
}

int tpsh_check_writable(const char *path) {
  if (in_place(path)) {
    if (access(path, W_OK) != 0) return tpsh_error(TPSH_EINVAL, "%s: %s", path, strerror(errno));
    return TPSH_OK;
  }
  char tmp[4200];
  int fd = open_temp(path, tmp, sizeof tmp);
  if (fd < 0) return tpsh_error(TPSH_EINVAL, "%s: %s", path, strerror(errno));
  close(fd);
  unlink(tmp);
  return TPSH_OK;
}
