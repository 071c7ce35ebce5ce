/*
 * qs_log.h - error and message reporting shared by every qshard module, and the process exit
 * codes every module's *_err_exit_code() maps its errors into.
 *
 * The check that detects a failure reports it once, with context (file, tensor, expected and
 * actual values), then returns its module's status code; callers forward the code without
 * printing again (docs/DESIGN.md section 3). Only `main` exits.
 *
 * Messages go to stderr prefixed with the program name the dispatcher set
 * (qs_log_set_prog("qshard run"); "qshard" until then): "qshard run: error: ...",
 * "qshard run: warning: ...", "qshard run: ..." (info), "qshard run: debug: ...". The `where`
 * of qs_log_error (the function that detected the failure) is printed only at debug level
 * (-v), as "qshard run: error: rt_model_open: ...": users read what went wrong, developers also
 * where. qs_log_set_quiet(true) silences stderr (fuzzers, corrupt-file tests); the last error
 * message is always kept, as "where: message", and returned by qs_log_last() so tests can
 * assert on it. Thread-safe: the last-message buffer is thread-local; the program name and the
 * level are set once by main before any thread starts.
 */
#ifndef QS_LOG_H
#define QS_LOG_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Process exit codes (docs/DESIGN.md section 2). */
enum qs_exit {
    QS_EXIT_OK = 0,
    QS_EXIT_USAGE = 1,     /* bad flags, missing arguments */
    QS_EXIT_BAD_INPUT = 2, /* corrupt or unsupported file/checkpoint, bad prompt */
    QS_EXIT_RUNTIME = 3,   /* GPU, CUDA, NCCL, out of memory, interrupted by a signal */
    QS_EXIT_IO = 4,        /* cannot read/write a path, disk full */
    QS_EXIT_VERIFY = 5,    /* verification failed */
};

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

/* The prefix of every message: "qshard run" (borrowed: a string that outlives the program's
 * messages, normally a literal). NULL restores "qshard". */
void qs_log_set_prog(const char *prog);
const char *qs_log_prog(void);              /* the current prefix */
void qs_log_set_quiet(bool quiet);          /* silence stderr; last message still recorded */
void qs_log_set_thread_quiet(bool quiet);   /* the same for the calling thread only */
void qs_log_set_level(enum qs_log_level l); /* max level printed (errors always, unless quiet) */
enum qs_log_level qs_log_get_level(void);
const char *qs_log_last(void);              /* last error of this thread, "where: message" */
void qs_log_clear(void);                    /* forget the last error message */

#ifdef __cplusplus
}
#endif
#endif /* QS_LOG_H */
