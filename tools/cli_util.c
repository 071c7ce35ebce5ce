/*
 * cli_util.c - small helpers of the qshard commands (tools/cli.h): exit codes, UTF-8 check,
 * text input (file or stdin), stdout checks, the SIGINT/SIGTERM cancel flag.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "rt_io.h" /* rt_file_read, rt_ids_parse */

volatile sig_atomic_t cli_cancel;

int cli_exit_rt(enum rt_err e)
{
    return rt_err_exit_code(e);
}

int cli_exit_io(enum rt_io_err e)
{
    switch (e) {
    case RT_IO_ERR_NONE: return QS_EXIT_OK;
    case RT_IO_ERR_FORMAT:
    case RT_IO_ERR_PARSE:
    case RT_IO_ERR_TOO_BIG: return QS_EXIT_BAD_INPUT;
    case RT_IO_ERR_NOMEM: return QS_EXIT_RUNTIME;
    default: return QS_EXIT_IO;
    }
}

int cli_prompt_ids(const struct rt_session *s, const char *text, const char *tokens,
                   bool no_bos, bool no_parse_special, const char *no_tok_hint, int32_t **ids,
                   size_t *n)
{
    struct rt_prompt p = {.text = text, .no_bos = no_bos, .no_parse_special = no_parse_special};
    int32_t *tok_ids = NULL;
    if (tokens) {
        enum rt_io_err ie = rt_ids_parse(tokens, &tok_ids, &p.n_ids);
        if (ie)
            return cli_exit_io(ie);
        p.ids = tok_ids;
        p.text = NULL;
    }
    enum rt_err e = rt_session_encode(s, &p, ids, n);
    free(tok_ids);
    if (e == RT_ERR_TOKENIZER && !rt_session_tok(s) && no_tok_hint)
        fprintf(stderr, "hint: %s\n", no_tok_hint);
    return e ? cli_exit_rt(e) : QS_EXIT_OK;
}

const char *cli_plural(long long n)
{
    return n == 1 ? "" : "s";
}

long cli_utf8_invalid_at(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        const unsigned c = p[i];
        size_t len;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            len = 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            lo = c == 0xE0 ? 0xA0 : lo;
            hi = c == 0xED ? 0x9F : hi;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            lo = c == 0xF0 ? 0x90 : lo;
            hi = c == 0xF4 ? 0x8F : hi;
        } else {
            return (long)i;
        }
        if (i + len > n || p[i + 1] < lo || p[i + 1] > hi)
            return (long)i;
        for (size_t k = 2; k < len; k++)
            if (p[i + k] < 0x80 || p[i + k] > 0xBF)
                return (long)i;
        i += len;
    }
    return -1;
}

/* All of stdin, at most max bytes. */
static int read_stdin(size_t max, char **buf, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap + 1);
    for (;;) {
        if (!b) {
            qs_log_error(__func__, "out of memory reading standard input");
            return QS_EXIT_RUNTIME;
        }
        ssize_t r = read(0, b + n, cap - n);
        if (r < 0 && errno == EINTR && !cli_cancel)
            continue;
        if (r < 0) {
            qs_log_error(__func__, "reading standard input: %s", strerror(errno));
            free(b);
            return QS_EXIT_IO;
        }
        if (r == 0)
            break;
        n += (size_t)r;
        if (n > max) {
            qs_log_error(__func__, "standard input holds more than %zu bytes", max);
            free(b);
            return QS_EXIT_BAD_INPUT;
        }
        if (n == cap) {
            cap *= 2;
            char *nb = realloc(b, cap + 1);
            if (!nb)
                free(b);
            b = nb;
        }
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    return QS_EXIT_OK;
}

int cli_read_text(const char *path, size_t max, char **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    int rc;
    if (!strcmp(path, "-")) {
        rc = read_stdin(max, buf, len);
    } else {
        rc = cli_exit_io(rt_file_read(path, max, buf, len));
    }
    if (rc == QS_EXIT_OK && strlen(*buf) != *len) {
        qs_log_error(__func__, "%s contains a NUL byte (offset %zu): not a text file",
                     strcmp(path, "-") ? path : "standard input", strlen(*buf));
        free(*buf);
        *buf = NULL;
        rc = QS_EXIT_BAD_INPUT;
    }
    return rc;
}

int cli_flush_stdout(void)
{
    if (fflush(stdout) != 0 || ferror(stdout)) {
        qs_log_error(__func__, "writing the output failed: %s", strerror(errno));
        return QS_EXIT_IO;
    }
    return QS_EXIT_OK;
}

static void on_signal(int sig)
{
    cli_cancel = sig;
}

void cli_catch_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESETHAND; /* a second signal: the default action (end now) */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

void cli_report_cancel(void)
{
    qs_log_error(__func__, "interrupted by signal %d: stopped after the step in progress",
                 (int)cli_cancel);
}

enum rt_device cli_resolve_device(struct rt_opts *o)
{
    if (o->device == RT_DEVICE_AUTO)
        o->device = rt_cuda_available() ? RT_DEVICE_CUDA : RT_DEVICE_CPU;
    return o->device;
}

int cli_cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

void cli_drop_page_cache(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) != 0)
        qs_log_warn("could not drop %s from the page cache", path);
    if (fd >= 0)
        close(fd);
}

int64_t cli_read_through(const char *path, void *buf, size_t size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        qs_log_error(__func__, "file %s: %s", path, strerror(errno));
        return -1;
    }
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    int64_t total = 0;
    for (;;) {
        ssize_t r = read(fd, buf, size);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            qs_log_error(__func__, "file %s: read: %s", path, strerror(errno));
            close(fd);
            return -1;
        }
        if (r == 0)
            break;
        total += r;
    }
    close(fd);
    return total;
}

/* Index of the p-th percentile of n >= 1 sorted values, nearest rank. */
static size_t rank_index(size_t n, unsigned p)
{
    const size_t i = (p * n + 99) / 100; /* ceil(p n / 100) */
    return i ? (i > n ? n - 1 : i - 1) : 0;
}

struct cli_summary cli_summarize(double *v, size_t n, double scale)
{
    struct cli_summary s = {0, 0, 0};
    if (!n)
        return s;
    qsort(v, n, sizeof(double), cli_cmp_double);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    s.mean = scale * sum / (double)n;
    s.p50 = scale * v[rank_index(n, 50)];
    s.p99 = scale * v[rank_index(n, 99)];
    return s;
}
