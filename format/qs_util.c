/*
 * qs_util.c - see qs_util.h. Tested by tests/test_fmt.c (qs_path_join), tests/test_io.c
 * (qs_write_atomic through the .npy and file writers) and every timing path.
 */
#include "qs_util.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "qs_log.h"

double qs_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

char *qs_path_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p)
        return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

int qs_write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        const ssize_t r = write(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return r < 0 ? errno : EIO;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

enum qs_write_err qs_write_atomic(const char *where, const char *path,
                                  int (*fill)(int fd, void *ctx), void *ctx)
{
    const size_t plen = strlen(path) + 32;
    char *tmp = malloc(plen);
    if (!tmp) {
        qs_log_error(where, "%s: out of memory", path);
        return QS_WRITE_NOMEM;
    }
    snprintf(tmp, plen, "%s.tmp.%ld", path, (long)getpid());
    enum qs_write_err err = QS_WRITE_OK;
    const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        qs_log_error(where, "cannot create %s: %s", tmp, strerror(errno));
        free(tmp);
        return QS_WRITE_OPEN;
    }
    int e = fill(fd, ctx);
    const char *step = "writing";
    if (!e && fsync(fd) != 0)
        e = errno, step = "fsync of";
    if (close(fd) != 0 && !e)
        e = errno, step = "closing";
    bool renaming = false;
    if (!e && rename(tmp, path) != 0)
        e = errno, step = "renaming", renaming = true;
    if (e) {
        qs_log_error(where, "%s %s%s%s: %s", step, tmp, renaming ? " to " : "",
                     renaming ? path : "", strerror(e));
        unlink(tmp);
        err = QS_WRITE_IO;
    }
    free(tmp);
    return err;
}
