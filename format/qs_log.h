/*
 * qs_log.h - error and message reporting shared by every qshard module.
 *
 * The check that detects a failure reports it once, with context (function, file, tensor,
 * expected and actual values), then returns its module's status code; callers forward the code
 * without printing again (docs/DESIGN.md section 3). Only `main` exits.
 *
 * Messages go to stderr prefixed "qshard: error: " (or "warning: ", "info: ").
 * qs_log_set_quiet(true) silences stderr (fuzzers, corrupt-file tests); the last error message
 * is always kept and returned by qs_log_last() so tests can assert on it.
 * Thread-safe: the last-message buffer is thread-local.
 */
#ifndef QS_LOG_H
#define QS_LOG_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

enum qs_log_level { QS_LOG_ERROR = 0, QS_LOG_WARN = 1, QS_LOG_INFO = 2, QS_LOG_DEBUG = 3 };

/* Report an error detected in function `where` (pass __func__); printf-style message. */
void qs_log_error(const char *where, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Warning: something odd but survivable (advisory call failed, missing optional file). */
void qs_log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Informational message, printed only when the verbosity is >= QS_LOG_INFO (the default). */
void qs_log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Debug message, printed only with verbosity QS_LOG_DEBUG (-v on most subcommands). */
void qs_log_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

void qs_log_set_quiet(bool quiet);          /* silence stderr; last message still recorded */
void qs_log_set_level(enum qs_log_level l); /* max level printed (errors always, unless quiet) */
enum qs_log_level qs_log_get_level(void);
const char *qs_log_last(void);              /* last error message of this thread ("" if none) */
void qs_log_clear(void);                    /* forget the last error message */

#ifdef __cplusplus
}
#endif
#endif /* QS_LOG_H */
