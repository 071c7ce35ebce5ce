/*
 * qs_log.c - see qs_log.h. Tested by every test that asserts on qs_log_last(), and for the
 * printed form by tests/test_cli_errors.c (the "qshard CMD: error:" prefix, `where` with -v).
 */
#include "qs_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static bool g_quiet;
static _Thread_local bool t_quiet; /* this thread only (the server's connection threads) */
static enum qs_log_level g_level = QS_LOG_INFO;
static const char *g_prog = "qshard";
static _Thread_local char t_last[1024];

void qs_log_set_prog(const char *prog) { g_prog = prog ? prog : "qshard"; }
const char *qs_log_prog(void) { return g_prog; }
void qs_log_set_quiet(bool quiet) { g_quiet = quiet; }
void qs_log_set_thread_quiet(bool quiet) { t_quiet = quiet; }
void qs_log_set_level(enum qs_log_level l) { g_level = l; }
enum qs_log_level qs_log_get_level(void) { return g_level; }
const char *qs_log_last(void) { return t_last; }
void qs_log_clear(void) { t_last[0] = '\0'; }

void qs_log_error(const char *where, const char *fmt, ...)
{
    char msg[sizeof(t_last) - 256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    snprintf(t_last, sizeof(t_last), "%.200s: %s", where ? where : "?", msg);
    if (g_quiet || t_quiet)
        return;
    if (g_level >= QS_LOG_DEBUG)
        fprintf(stderr, "%s: error: %s\n", g_prog, t_last);
    else
        fprintf(stderr, "%s: error: %s\n", g_prog, msg);
}

static void vlog(enum qs_log_level l, const char *kind, const char *fmt, va_list ap)
{
    if (g_quiet || t_quiet || l > g_level)
        return;
    fprintf(stderr, "%s: %s", g_prog, kind);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

void qs_log_warn(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(QS_LOG_WARN, "warning: ", fmt, ap);
    va_end(ap);
}

void qs_log_info(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(QS_LOG_INFO, "", fmt, ap);
    va_end(ap);
}

void qs_log_debug(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(QS_LOG_DEBUG, "debug: ", fmt, ap);
    va_end(ap);
}
