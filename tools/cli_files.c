/*
 * cli_files.c - what `qshard inspect` and `qshard verify` share (tools/cli.h): exit codes of
 * format errors, status lines, the *.qshard files of a directory.
 */
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "qs_util.h" /* qs_path_join */

int cli_exit_fmt(enum fmt_err e)
{
    switch (e) {
    case FMT_ERR_NONE: return QS_EXIT_OK;
    case FMT_ERR_IO: case FMT_ERR_NOMEM: return QS_EXIT_IO;
    default: return QS_EXIT_BAD_INPUT;
    }
}

int cli_worse(int a, int b) { return a > b ? a : b; }

/* A status line on stdout, flushed so that it stays in order with the errors on stderr. */
void cli_status_line(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

/* `e` came from a format/ call made after qs_log_clear(), which reports its errors itself
 * (DESIGN section 3: once); report here only if it returned an error without a message. */
void cli_report_unlogged(enum fmt_err e, const char *path)
{
    if (e && !qs_log_last()[0])
        qs_log_error(__func__, "%s: %s", path, fmt_err_str(e));
}

bool cli_is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

void cli_hex_id(const uint8_t id[16], char out[33])
{
    for (int i = 0; i < 16; i++)
        snprintf(out + 2 * i, 3, "%02x", id[i]);
}

/* Files to look at for a DIR without manifest: every *.qshard, sorted. -1 (errno set, *out
 * NULL) if the directory cannot be read or memory runs out: never a partial list. */
int cli_list_qshard(const char *dir, char ***out)
{
    DIR *d = opendir(dir);
    int n = 0, cap = 0;
    char **v = NULL;
    *out = NULL;
    if (!d)
        return -1;
    errno = 0;
    for (struct dirent *e; (e = readdir(d)); errno = 0) {
        size_t l = strlen(e->d_name);
        if (l < 8 || strcmp(e->d_name + l - 7, ".qshard") != 0)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            char **nv = realloc(v, (size_t)cap * sizeof(*v));
            if (!nv)
                goto fail;
            v = nv;
        }
        if (!(v[n] = qs_path_join(dir, e->d_name)))
            goto fail;
        n++;
    }
    if (errno) /* readdir failed */
        goto fail;
    closedir(d);
    for (int i = 1; i < n; i++) /* insertion sort: a handful of files */
        for (int j = i; j > 0 && strcmp(v[j - 1], v[j]) > 0; j--) {
            char *t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    *out = v;
    return n;
fail:;
    int saved = errno ? errno : ENOMEM;
    closedir(d);
    cli_free_list(v, n);
    errno = saved;
    return -1;
}

void cli_free_list(char **v, int n)
{
    for (int i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

