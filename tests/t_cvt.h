/*
 * t_cvt.h - helpers of the converter's end-to-end tests (tests/test_cvt.c, test_cvt_built.c,
 * test_cvt_outdir.c): run the qshard binary (QSHARD, default build/qshard) or cvt_run in process
 * with test hooks (struct cvt_hooks), scratch directory, small file utilities. Test-only.
 */
#ifndef QS_T_CVT_H
#define QS_T_CVT_H

#include <cjson/cJSON.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cvt.h"    /* cvt_run, struct cvt_opts, struct cvt_hooks */
#include "qs_log.h"
#include "t.h"
#include "t_file.h" /* t_slurp */

#define DATA "tests/data/"

static char g_tmp[256];      /* the program's scratch root */
static const char *g_bin;    /* the qshard binary */

static inline cJSON *load_json(const char *path)
{
    char *s = t_slurp(path, NULL);
    cJSON *j = s ? cJSON_Parse(s) : NULL;
    free(s);
    return j;
}

/* Run `qshard <args>`; stdout and stderr go to files under g_tmp; returns the exit status and
 * a malloc'ed copy of stderr (and stdout if out != NULL). */
static inline int run(char **err, char **out, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline int run(char **err, char **out, const char *fmt, ...)
{
    char args[2048], cmd[4096], ep[300], op[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof(args), fmt, ap);
    va_end(ap);
    snprintf(ep, sizeof(ep), "%s/stderr.txt", g_tmp);
    snprintf(op, sizeof(op), "%s/stdout.txt", g_tmp);
    snprintf(cmd, sizeof(cmd), "%s %s >%s 2>%s", g_bin, args, op, ep);
    int st = system(cmd);
    if (err)
        *err = t_slurp(ep, NULL);
    if (out)
        *out = t_slurp(op, NULL);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static inline bool exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

/* Number of entries in a directory other than . and .. (-1 if it cannot be opened). */
static inline int dir_entries(const char *p)
{
    DIR *d = opendir(p);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

static inline long lcm_slow(long a, long b)
{
    long m = a;
    while (m % b)
        m += a;
    return m;
}

static inline long round_up_slow(long x, long unit)
{
    long m = 0;
    while (m < x)
        m += unit;
    return m;
}

/* Byte-identical files (the whole rank file and the manifest). */
static inline bool files_equal(const char *a, const char *b)
{
    size_t la = 0, lb = 0;
    char *x = t_slurp(a, &la), *y = t_slurp(b, &lb);
    bool eq = x && y && la == lb && !memcmp(x, y, la);
    free(x);
    free(y);
    return eq;
}

/* Copy file a to b (small files). */
static inline bool copy_file(const char *a, const char *b)
{
    size_t len = 0;
    char *d = t_slurp(a, &len);
    FILE *f = d ? fopen(b, "wb") : NULL;
    bool ok = f && fwrite(d, 1, len, f) == len;
    if (f)
        ok = fclose(f) == 0 && ok;
    free(d);
    return ok;
}

static inline bool write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    bool ok = f && fputs(text, f) >= 0;
    if (f)
        ok = fclose(f) == 0 && ok;
    return ok;
}

/* Names in directory p, sorted, joined with ',' (malloc'ed; "" when empty, NULL if unreadable). */
static inline char *dir_list(const char *p)
{
    struct dirent **v;
    int n = scandir(p, &v, NULL, alphasort);
    if (n < 0)
        return NULL;
    size_t cap = 1, len = 0;
    for (int i = 0; i < n; i++)
        cap += strlen(v[i]->d_name) + 1;
    char *s = malloc(cap);
    if (s)
        s[0] = '\0';
    for (int i = 0; i < n; i++) {
        const char *nm = v[i]->d_name;
        if (s && strcmp(nm, ".") && strcmp(nm, ".."))
            len += (size_t)sprintf(s + len, "%s%s", len ? "," : "", nm);
        free(v[i]);
    }
    free(v);
    return s;
}

static inline int count_str(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; p && (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* cvt_run in this process (messages: qs_log_last()), quiet, with hooks h (NULL: none). */
static inline enum cvt_err cvt_inproc(const struct cvt_hooks *h, const char *model,
                                      const char *out, int tp, bool force, bool no_fast)
{
    struct cvt_opts o;
    memset(&o, 0, sizeof(o));
    o.model_dir = model;
    o.out_dir = out;
    o.tp = tp;
    o.quiet = true;
    o.force = force;
    o.no_fast_path = no_fast;
    o.hooks = h;
    qs_log_clear();
    return cvt_run(&o);
}

/* cvt_inproc with its stderr captured into *err (malloc'ed; messages from worker threads too,
 * which qs_log_last() of this thread does not see). */
static inline enum cvt_err cvt_inproc_err(const struct cvt_hooks *h, const char *model,
                                          const char *out, int tp, bool force, bool no_fast,
                                          char **err)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/inproc-stderr.txt", g_tmp);
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (saved < 0 || fd < 0 || dup2(fd, 2) < 0) {
        perror("cvt_inproc_err: redirect stderr");
        exit(1);
    }
    close(fd);
    qs_log_set_quiet(false);
    enum cvt_err e = cvt_inproc(h, model, out, tp, force, no_fast);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    qs_log_set_quiet(true);
    *err = t_slurp(path, NULL);
    return e;
}

/* Start of a test program: its area name, the binary, a fresh scratch directory. Returns false
 * (after a message) when the scratch directory cannot be made. */
static inline bool t_cvt_init(const char *area)
{
    T_INIT(area);
    /* the SIGINT cases need the signals caught in the converter, which keeps a signal its
     * parent ignores ignored: a shell starts background jobs (`make test &`) with SIGINT and
     * SIGQUIT ignored, and the converter inherits that from us */
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    g_bin = getenv("QSHARD") ? getenv("QSHARD") : "build/qshard";
    snprintf(g_tmp, sizeof(g_tmp), "/tmp/qshard-test-%s-XXXXXX", area);
    if (!mkdtemp(g_tmp)) {
        perror("mkdtemp");
        return false;
    }
    qs_log_set_quiet(true);
    return true;
}

/* End of a test program: remove the scratch directory, print the summary, return the status. */
static inline int t_cvt_done(void)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_tmp);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_tmp);
    return t_done();
}

#endif /* QS_T_CVT_H */
