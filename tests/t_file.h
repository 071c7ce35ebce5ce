/*
 * t_file.h - reading a whole file, for the tests that compare or parse files they or the
 * converter wrote (tests/t_cvt.h, t_cvt_src.h, t_fmt.h, test_cvt_plan.c). Test-only.
 */
#ifndef QS_T_FILE_H
#define QS_T_FILE_H

#include <stdio.h>
#include <stdlib.h>

/* The bytes of `path`, malloc'ed and NUL-terminated (the NUL not counted in *len; len may be
 * NULL); NULL when the file cannot be read. */
static inline char *t_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1)) &&
        fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        if (len)
            *len = (size_t)n;
    }
    return buf;
}

#endif /* QS_T_FILE_H */
