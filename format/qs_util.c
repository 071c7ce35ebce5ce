/*
 * qs_util.c - see qs_util.h. Tested by tests/test_fmt.c (qs_path_join) and every timing path.
 */
#include "qs_util.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

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
