/*
 * qs_util.h - the few small helpers every qshard module needs (clock, paths), kept once here
 * beside qs_log so that no module repeats them.
 *
 * Who calls it: every module (format, convert, kernels' host code, runtime, tools, tests).
 */
#ifndef QS_UTIL_H
#define QS_UTIL_H

#ifdef __cplusplus
extern "C" {
#endif

/* Seconds on CLOCK_MONOTONIC (an arbitrary origin): for durations only. */
double qs_now_s(void);

/* "dir/name", malloc'd (the caller frees it); NULL when out of memory (nothing reported). */
char *qs_path_join(const char *dir, const char *name);

#ifdef __cplusplus
}
#endif
#endif /* QS_UTIL_H */
