/*
 * qs_util.h - the few small helpers every qshard module needs (clock, paths), kept once here
 * beside qs_log so that no module repeats them.
 *
 * Who calls it: every module (format, convert, kernels' host code, runtime, tools, tests).
 */
#ifndef QS_UTIL_H
#define QS_UTIL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Seconds on CLOCK_MONOTONIC (an arbitrary origin): for durations only. */
double qs_now_s(void);

/* "dir/name", malloc'd (the caller frees it); NULL when out of memory (nothing reported). */
char *qs_path_join(const char *dir, const char *name);

/* write(2) all n bytes of buf to fd (EINTR retried): 0, or an errno value (EIO for a write
 * that wrote nothing). Reports nothing. */
int qs_write_all(int fd, const void *buf, size_t n);

/* How qs_write_atomic failed. */
enum qs_write_err {
    QS_WRITE_OK = 0,
    QS_WRITE_NOMEM = 1, /* the temp name */
    QS_WRITE_OPEN = 2,  /* the temp file cannot be created (no such directory, permissions) */
    QS_WRITE_IO = 3,    /* writing, fsync, close or rename failed */
};

/* Write a file whole or not at all: fill(fd, ctx) writes the content into a temp file
 * "PATH.tmp.PID" beside path (same file system), which is then fsync'd, closed and renamed over
 * path. fill returns 0 or an errno value. On any failure the temp file is removed and path is
 * left as it was; the failing step is reported once through qs_log_error with `where`, the file
 * and strerror. Used by every writer of a small result file (manifest.json, .npy, --out). */
enum qs_write_err qs_write_atomic(const char *where, const char *path,
                                  int (*fill)(int fd, void *ctx), void *ctx);

#ifdef __cplusplus
}
#endif
#endif /* QS_UTIL_H */
