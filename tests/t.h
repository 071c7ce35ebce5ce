/*
 * t.h - the whole test "framework": check macros that print file:line and the expression, count
 * failures and continue. Each tests/test_<area>.c includes this once, calls T_INIT("area") and
 * ends main with `return t_done();`, which prints "<area>: N passed, N failed" and returns the
 * failure count (clamped to 1 for the exit status). tests/run_tests.sh sums those lines.
 */
#ifndef QS_T_H
#define QS_T_H

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static int t_pass, t_fail;
static const char *t_area = "test";

#define T_INIT(area) (t_area = (area))

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (cond) {                                                              \
            t_pass++;                                                            \
        } else {                                                                 \
            t_fail++;                                                            \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                        \
    } while (0)

#define CHECK_MSG(cond, ...)                                                     \
    do {                                                                         \
        if (cond) {                                                              \
            t_pass++;                                                            \
        } else {                                                                 \
            t_fail++;                                                            \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                        \
            fputc('\n', stderr);                                                 \
        }                                                                        \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                       \
    do {                                                                         \
        long long t_a_ = (long long)(a), t_b_ = (long long)(b);                  \
        if (t_a_ == t_b_) {                                                      \
            t_pass++;                                                            \
        } else {                                                                 \
            t_fail++;                                                            \
            fprintf(stderr, "%s:%d: CHECK_EQ_INT failed: %s == %s (%lld vs %lld)\n", \
                    __FILE__, __LINE__, #a, #b, t_a_, t_b_);                     \
        }                                                                        \
    } while (0)

#define CHECK_EQ_STR(a, b)                                                       \
    do {                                                                         \
        const char *t_a_ = (a), *t_b_ = (b);                                     \
        if (t_a_ && t_b_ && strcmp(t_a_, t_b_) == 0) {                           \
            t_pass++;                                                            \
        } else {                                                                 \
            t_fail++;                                                            \
            fprintf(stderr, "%s:%d: CHECK_EQ_STR failed: %s == %s (\"%s\" vs \"%s\")\n", \
                    __FILE__, __LINE__, #a, #b, t_a_ ? t_a_ : "(null)",          \
                    t_b_ ? t_b_ : "(null)");                                     \
        }                                                                        \
    } while (0)

static inline int t_done(void)
{
    printf("%s: %d passed, %d failed\n", t_area, t_pass, t_fail);
    return t_fail ? 1 : 0;
}

#endif /* QS_T_H */
