/*
 * rt_io.c - .npy float32 writer/reader, whole-file read, token-id list parsing (rt_io.h).
 *
 * Entry points: rt_npy_write_f32, rt_npy_read_f32, rt_file_read, rt_ids_parse.
 * Test: ./build/test_io (round trips, numpy-written files, every malformed-header case).
 */
#include "rt_io.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qs_log.h"  /* qs_log_error */
#include "qs_util.h" /* qs_write_atomic */

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6
#define NPY_ALIGN 64                 /* numpy.lib.format.ARRAY_ALIGN */
#define NPY_HEADER_MAX (1u << 20)    /* our bound on a v2/v3 header; numpy's own default is 10k */

const char *rt_io_err_str(enum rt_io_err e)
{
    switch (e) {
#define RT_IO_X_STR(name, value, msg) \
    case name:                        \
        return msg;
        RT_IO_ERR_LIST(RT_IO_X_STR)
#undef RT_IO_X_STR
    }
    return "unknown error";
}

// --- writing -------------------------------------------------------------------------------

/* float32 to little-endian bytes, whatever the host */
static void f32_to_le(const float *x, size_t n, unsigned char *out)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        out[4 * i + 0] = (unsigned char)u;
        out[4 * i + 1] = (unsigned char)(u >> 8);
        out[4 * i + 2] = (unsigned char)(u >> 16);
        out[4 * i + 3] = (unsigned char)(u >> 24);
    }
}

/* What qs_write_atomic's fill writes: a header (or a whole file) and float32 values. */
struct npy_fill {
    const void *hdr;
    size_t n_hdr;
    const float *data;
    size_t n;
};

static int npy_fill(int fd, void *ctx)
{
    const struct npy_fill *f = ctx;
    int e = qs_write_all(fd, f->hdr, f->n_hdr);
    enum { CHUNK = 16384 };
    unsigned char buf[CHUNK * 4];
    for (size_t i = 0; !e && i < f->n; i += CHUNK) {
        const size_t m = f->n - i < CHUNK ? f->n - i : CHUNK;
        f32_to_le(f->data + i, m, buf);
        e = qs_write_all(fd, buf, m * 4);
    }
    return e;
}

static enum rt_io_err io_err(enum qs_write_err e)
{
    return e == QS_WRITE_OK ? RT_IO_ERR_NONE
           : e == QS_WRITE_NOMEM ? RT_IO_ERR_NOMEM
           : e == QS_WRITE_OPEN ? RT_IO_ERR_OPEN
                                : RT_IO_ERR_WRITE;
}

enum rt_io_err rt_npy_write_f32(const char *path, const float *data, int64_t rows, int64_t cols)
{
    if (rows < 0 || cols < 0 || (cols > 0 && rows > INT64_MAX / 4 / cols)) {
        qs_log_error(__func__, "%s: bad shape (%lld, %lld)", path, (long long)rows,
                     (long long)cols);
        return RT_IO_ERR_TOO_BIG;
    }
    /* header: magic(6) + version(2) + len(2) + dict, padded with spaces, ending '\n' */
    char dict[160];
    int dl = snprintf(dict, sizeof(dict),
                      "{'descr': '<f4', 'fortran_order': False, 'shape': (%lld, %lld), }",
                      (long long)rows, (long long)cols);
    size_t total = (size_t)NPY_MAGIC_LEN + 4 + (size_t)dl + 1;
    total = (total + NPY_ALIGN - 1) / NPY_ALIGN * NPY_ALIGN;
    size_t hlen = total - NPY_MAGIC_LEN - 4;
    unsigned char hdr[256];
    memcpy(hdr, NPY_MAGIC, NPY_MAGIC_LEN);
    hdr[6] = 1;
    hdr[7] = 0;
    hdr[8] = (unsigned char)(hlen & 0xff);
    hdr[9] = (unsigned char)(hlen >> 8);
    memcpy(hdr + 10, dict, (size_t)dl);
    memset(hdr + 10 + dl, ' ', total - 10 - (size_t)dl - 1);
    hdr[total - 1] = '\n';

    const struct npy_fill f = {hdr, total, data, (size_t)rows * (size_t)cols};
    return io_err(qs_write_atomic("rt_npy_write_f32", path, npy_fill, (void *)&f));
}

static int bytes_fill(int fd, void *ctx)
{
    const struct npy_fill *f = ctx;
    return qs_write_all(fd, f->hdr, f->n_hdr);
}

enum rt_io_err rt_file_write(const char *path, const void *data, size_t len)
{
    const struct npy_fill f = {data, len, NULL, 0};
    return io_err(qs_write_atomic("rt_file_write", path, bytes_fill, (void *)&f));
}

// --- reading -------------------------------------------------------------------------------

/* Skip spaces in the dict literal. */
static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n'))
        p++;
    return p;
}

/* Parse a quoted Python string literal ('x' or "x", no escapes) into out[cap]. */
static const char *parse_str(const char *p, const char *end, char *out, size_t cap)
{
    if (p >= end || (*p != '\'' && *p != '"'))
        return NULL;
    char q = *p++;
    size_t n = 0;
    while (p < end && *p != q) {
        if (*p == '\\' || n + 1 >= cap)
            return NULL;
        out[n++] = *p++;
    }
    if (p >= end)
        return NULL;
    out[n] = '\0';
    return p + 1;
}

/* Parse a non-negative decimal integer (Python may write "5L" in old files: accepted). */
static const char *parse_dim(const char *p, const char *end, int64_t *v)
{
    if (p >= end || *p < '0' || *p > '9')
        return NULL;
    int64_t x = 0;
    while (p < end && *p >= '0' && *p <= '9') {
        if (x > (INT64_MAX - 9) / 10)
            return NULL;
        x = x * 10 + (*p++ - '0');
    }
    if (p < end && *p == 'L')
        p++;
    *v = x;
    return p;
}

struct npy_hdr {
    char descr[16];
    int fortran; /* -1 absent */
    int ndim;    /* -1 absent */
    int64_t dims[2];
};

/* Parse {'descr': '<f4', 'fortran_order': False, 'shape': (a, b), } in any key order. */
static bool parse_dict(const char *p, const char *end, struct npy_hdr *h)
{
    h->descr[0] = '\0';
    h->fortran = -1;
    h->ndim = -1;
    p = skip_ws(p, end);
    if (p >= end || *p++ != '{')
        return false;
    for (;;) {
        p = skip_ws(p, end);
        if (p < end && *p == '}')
            return true;
        char key[32];
        if (!(p = parse_str(p, end, key, sizeof(key))))
            return false;
        p = skip_ws(p, end);
        if (p >= end || *p++ != ':')
            return false;
        p = skip_ws(p, end);
        if (!strcmp(key, "descr")) {
            if (h->descr[0] || !(p = parse_str(p, end, h->descr, sizeof(h->descr))))
                return false;
        } else if (!strcmp(key, "fortran_order")) {
            if (h->fortran >= 0)
                return false;
            if ((size_t)(end - p) >= 5 && !strncmp(p, "False", 5)) {
                h->fortran = 0;
                p += 5;
            } else if ((size_t)(end - p) >= 4 && !strncmp(p, "True", 4)) {
                h->fortran = 1;
                p += 4;
            } else {
                return false;
            }
        } else if (!strcmp(key, "shape")) {
            if (h->ndim >= 0 || p >= end || *p++ != '(')
                return false;
            h->ndim = 0;
            for (;;) {
                p = skip_ws(p, end);
                if (p < end && *p == ')') {
                    p++;
                    break;
                }
                int64_t d;
                if (h->ndim >= 2 || !(p = parse_dim(p, end, &d)))
                    return false;
                h->dims[h->ndim++] = d;
                p = skip_ws(p, end);
                if (p < end && *p == ',')
                    p++;
                else if (p >= end || *p != ')')
                    return false;
            }
        } else {
            return false; /* numpy writes exactly these three keys */
        }
        p = skip_ws(p, end);
        if (p < end && *p == ',')
            p++;
        else if (p >= end || *p != '}')
            return false;
    }
}

enum rt_io_err rt_npy_parse_f32(const void *buf, size_t len, const char *name, float **data,
                                int64_t *rows, int64_t *cols)
{
    *data = NULL;
    *rows = *cols = 0;
    const unsigned char *b = buf;
    if (len < 10 || memcmp(b, NPY_MAGIC, NPY_MAGIC_LEN) != 0) {
        qs_log_error(__func__, "%s: not a .npy file (no \\x93NUMPY magic)", name);
        return RT_IO_ERR_FORMAT;
    }
    uint32_t major = b[6], hlen;
    size_t pre;
    if (major == 1) {
        hlen = (uint32_t)b[8] | (uint32_t)b[9] << 8;
        pre = 10;
    } else if (major == 2 || major == 3) {
        if (len < 12) {
            qs_log_error(__func__, "%s: truncated .npy header", name);
            return RT_IO_ERR_FORMAT;
        }
        hlen = (uint32_t)b[8] | (uint32_t)b[9] << 8 | (uint32_t)b[10] << 16 |
               (uint32_t)b[11] << 24;
        pre = 12;
    } else {
        qs_log_error(__func__, "%s: .npy format version %u.%u not supported (1.0-3.0)", name,
                     major, b[7]);
        return RT_IO_ERR_FORMAT;
    }
    if (hlen > NPY_HEADER_MAX) {
        qs_log_error(__func__, "%s: .npy header length %u exceeds %u", name, hlen,
                     NPY_HEADER_MAX);
        return RT_IO_ERR_FORMAT;
    }
    if (len - pre < hlen) {
        qs_log_error(__func__, "%s: truncated .npy header (%u bytes announced, %zu present)", name,
                     hlen, len - pre);
        return RT_IO_ERR_FORMAT;
    }
    const char *hdr = (const char *)b + pre;
    struct npy_hdr h;
    if (!parse_dict(hdr, hdr + hlen, &h) || !h.descr[0] || h.fortran < 0 || h.ndim < 0) {
        qs_log_error(__func__, "%s: malformed .npy header dict: %.*s", name,
                     (int)(hlen < 120 ? hlen : 120), hdr);
        return RT_IO_ERR_FORMAT;
    }
    if (strcmp(h.descr, "<f4") != 0 || h.fortran != 0 || h.ndim < 1) {
        qs_log_error(__func__,
                     "%s: expected float32 little-endian C-order array of 1 or 2 dims, got "
                     "descr '%s', fortran_order %s, %d dims",
                     name, h.descr, h.fortran ? "True" : "False", h.ndim);
        return RT_IO_ERR_FORMAT;
    }
    int64_t r = h.ndim == 2 ? h.dims[0] : 1, c = h.ndim == 2 ? h.dims[1] : h.dims[0];
    if (c > 0 && r > (int64_t)(SIZE_MAX / 8) / c) {
        qs_log_error(__func__, "%s: shape (%lld, %lld) too large", name, (long long)r,
                     (long long)c);
        return RT_IO_ERR_FORMAT;
    }
    /* the data must be exactly rows*cols*4 bytes */
    size_t n = (size_t)r * (size_t)c, have = len - pre - hlen;
    if (have != n * 4) {
        qs_log_error(__func__, "%s: shape (%lld, %lld) needs %zu data bytes, file has %zu", name,
                     (long long)r, (long long)c, n * 4, have);
        return RT_IO_ERR_FORMAT;
    }
    float *out = malloc(n * sizeof(float) + 1);
    if (!out) {
        qs_log_error(__func__, "%s: out of memory for %zu floats", name, n);
        return RT_IO_ERR_NOMEM;
    }
    const unsigned char *raw = b + pre + hlen;
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)raw[4 * i] | (uint32_t)raw[4 * i + 1] << 8 |
                     (uint32_t)raw[4 * i + 2] << 16 | (uint32_t)raw[4 * i + 3] << 24;
        memcpy(&out[i], &u, 4);
    }
    *data = out;
    *rows = r;
    *cols = c;
    return RT_IO_ERR_NONE;
}

enum rt_io_err rt_npy_read_f32(const char *path, float **data, int64_t *rows, int64_t *cols)
{
    *data = NULL;
    *rows = *cols = 0;
    char *buf = NULL;
    size_t len = 0;
    enum rt_io_err err = rt_file_read(path, RT_NPY_READ_MAX, &buf, &len);
    if (err)
        return err == RT_IO_ERR_TOO_BIG ? RT_IO_ERR_FORMAT : err;
    err = rt_npy_parse_f32(buf, len, path, data, rows, cols);
    free(buf);
    return err;
}

// --- plain files and id lists --------------------------------------------------------------

enum rt_io_err rt_file_read(const char *path, size_t max_len, char **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        qs_log_error(__func__, "cannot open %s: %s", path, strerror(errno));
        return RT_IO_ERR_OPEN;
    }
    enum rt_io_err err = RT_IO_ERR_NONE;
    size_t cap = max_len < 4096 ? max_len : 4096, n = 0;
    char *b = malloc(cap + 1);
    if (!b) {
        err = RT_IO_ERR_NOMEM;
        goto out;
    }
    for (;;) {
        if (n == cap) {
            if (cap >= max_len) {
                /* one more byte tells "exactly max_len" from "longer" */
                int ch = fgetc(f);
                if (ch == EOF)
                    break;
                qs_log_error(__func__, "%s: longer than the limit of %zu bytes", path, max_len);
                err = RT_IO_ERR_TOO_BIG;
                goto out;
            }
            size_t nc = cap * 2 > max_len ? max_len : cap * 2;
            char *nb = realloc(b, nc + 1);
            if (!nb) {
                err = RT_IO_ERR_NOMEM;
                goto out;
            }
            b = nb;
            cap = nc;
        }
        size_t want = cap - n;
        if (want == 0)
            continue;
        size_t got = fread(b + n, 1, want, f);
        n += got;
        if (got < want) {
            if (ferror(f)) {
                qs_log_error(__func__, "reading %s: %s", path, strerror(errno));
                err = RT_IO_ERR_READ;
                goto out;
            }
            break;
        }
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    b = NULL;
out:
    if (err == RT_IO_ERR_NOMEM)
        qs_log_error(__func__, "%s: out of memory", path);
    free(b);
    fclose(f);
    return err;
}

enum rt_io_err rt_ids_parse(const char *text, int32_t **ids, size_t *n)
{
    *ids = NULL;
    *n = 0;
    size_t cap = 16, cnt = 0;
    int32_t *v = malloc(cap * sizeof(*v));
    if (!v) {
        qs_log_error(__func__, "out of memory");
        return RT_IO_ERR_NOMEM;
    }
    const char *p = text;
    bool bracket = false, need_sep = false;
    while (*p == ' ' || *p == '\t' || *p == '\n')
        p++;
    if (*p == '[') {
        bracket = true;
        p++;
    }
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
            p++;
        if (*p == ',') {
            if (!need_sep)
                goto bad;
            need_sep = false;
            p++;
            continue;
        }
        if (*p == '\0' || (*p == ']' && bracket))
            break;
        if (*p < '0' || *p > '9')
            goto bad;
        int64_t x = 0;
        const char *start = p;
        while (*p >= '0' && *p <= '9') {
            x = x * 10 + (*p - '0');
            if (x > INT32_MAX) {
                p = start;
                goto bad;
            }
            p++;
        }
        if (cnt == cap) {
            int32_t *nv = realloc(v, cap * 2 * sizeof(*v));
            if (!nv) {
                free(v);
                qs_log_error(__func__, "out of memory");
                return RT_IO_ERR_NOMEM;
            }
            v = nv;
            cap *= 2;
        }
        v[cnt++] = (int32_t)x;
        need_sep = true; /* a comma or whitespace already separates; both are accepted */
        if (*p != ',' && *p != ' ' && *p != '\t' && *p != '\n' && *p != '\r' && *p != '\0' &&
            !(*p == ']' && bracket))
            goto bad;
    }
    if (*p == ']') {
        p++;
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
            p++;
        if (*p != '\0')
            goto bad;
    } else if (bracket) {
        goto bad;
    }
    if (cnt == 0) {
        free(v);
        qs_log_error(__func__, "empty token-id list \"%.60s\"", text);
        return RT_IO_ERR_PARSE;
    }
    *ids = v;
    *n = cnt;
    return RT_IO_ERR_NONE;
bad:
    free(v);
    qs_log_error(__func__,
                 "token-id list \"%.60s\": unexpected '%c' at position %zu (expected "
                 "non-negative decimal ids < 2^31 separated by commas)",
                 text, *p ? *p : '?', (size_t)(p - text));
    return RT_IO_ERR_PARSE;
}
