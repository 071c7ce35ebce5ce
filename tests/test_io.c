/*
 * test_io.c - runtime/rt_io.c: .npy files against NumPy's own writer (tests/data/npy, see its
 * PROVENANCE.md), write/read round trips of fresh random data, every malformed-header case the
 * reader must refuse, whole-file reads, and token-id list parsing.
 * Run: ./build/test_io (from the repository root).
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qs_log.h"
#include "rt_io.h"
#include "t.h"

#define NPY_DIR "tests/data/npy/"

static char g_tmp[256];

static void write_bytes(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return;
    fwrite(b, 1, n, f);
    fclose(f);
}

static void test_numpy_files(void)
{
    /* (arange(12).reshape(3, 4) - 5) * 0.5 as numpy wrote it, versions 1.0 and 2.0 */
    const char *files[] = {NPY_DIR "arange_3x4_v1.npy", NPY_DIR "arange_3x4_v2.npy"};
    for (int f = 0; f < 2; f++) {
        float *x = NULL;
        int64_t r = -1, c = -1;
        CHECK_EQ_INT(rt_npy_read_f32(files[f], &x, &r, &c), RT_IO_ERR_NONE);
        CHECK_EQ_INT(r, 3);
        CHECK_EQ_INT(c, 4);
        int bad = 0;
        for (int i = 0; x && i < 12; i++)
            bad += x[i] != (float)((i - 5) * 0.5);
        CHECK_EQ_INT(bad, 0);
        free(x);
    }
    float *x = NULL;
    int64_t r, c;
    CHECK_EQ_INT(rt_npy_read_f32(NPY_DIR "arange_7_1d.npy", &x, &r, &c), RT_IO_ERR_NONE);
    CHECK(r == 1 && c == 7 && x && x[6] == 6.0f);
    free(x);

    /* our writer produces byte-for-byte what numpy.save wrote for the same array */
    float a[12];
    for (int i = 0; i < 12; i++)
        a[i] = (float)((i - 5) * 0.5);
    CHECK_EQ_INT(rt_npy_write_f32(g_tmp, a, 3, 4), RT_IO_ERR_NONE);
    char *mine = NULL, *theirs = NULL;
    size_t lm = 0, lt = 0;
    CHECK_EQ_INT(rt_file_read(g_tmp, 1 << 20, &mine, &lm), RT_IO_ERR_NONE);
    CHECK_EQ_INT(rt_file_read(NPY_DIR "arange_3x4_v1.npy", 1 << 20, &theirs, &lt),
                 RT_IO_ERR_NONE);
    CHECK(mine && theirs && lm == lt && memcmp(mine, theirs, lm) == 0);
    free(mine);
    free(theirs);

    /* numpy files we must refuse: float64, Fortran order, big-endian */
    qs_log_set_quiet(true);
    const char *refuse[] = {NPY_DIR "f64_2x2.npy", NPY_DIR "fortran_2x3.npy",
                            NPY_DIR "big_endian_2x2.npy"};
    for (int i = 0; i < 3; i++) {
        x = (float *)1;
        CHECK_EQ_INT(rt_npy_read_f32(refuse[i], &x, &r, &c), RT_IO_ERR_FORMAT);
        CHECK(x == NULL);
    }
    CHECK_EQ_INT(rt_npy_read_f32(NPY_DIR "no_such_file.npy", &x, &r, &c), RT_IO_ERR_OPEN);
    qs_log_set_quiet(false);
}

static void test_round_trip(void)
{
    uint64_t st = 99;
    const int64_t shapes[][2] = {{1, 1}, {5, 1000}, {17, 32003}, {0, 7}, {3, 0}};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int64_t rows = shapes[s][0], cols = shapes[s][1];
        size_t n = (size_t)(rows * cols);
        float *a = malloc(n * sizeof(float) + 4);
        for (size_t i = 0; i < n; i++) {
            st = st * 6364136223846793005ULL + 1442695040888963407ULL;
            uint32_t u = (uint32_t)(st >> 32);
            memcpy(&a[i], &u, 4); /* any bit pattern, NaNs included */
        }
        CHECK_EQ_INT(rt_npy_write_f32(g_tmp, a, rows, cols), RT_IO_ERR_NONE);
        float *b = NULL;
        int64_t r = -1, c = -1;
        CHECK_EQ_INT(rt_npy_read_f32(g_tmp, &b, &r, &c), RT_IO_ERR_NONE);
        CHECK(r == rows && c == cols);
        CHECK(b && (n == 0 || memcmp(a, b, n * 4) == 0));
        /* the data starts on a 64-byte boundary (numpy's ARRAY_ALIGN) */
        FILE *f = fopen(g_tmp, "rb");
        unsigned char h[10];
        CHECK(f && fread(h, 1, 10, f) == 10);
        if (f)
            fclose(f);
        CHECK_EQ_INT((10 + h[8] + 256 * h[9]) % 64, 0);
        free(a);
        free(b);
    }
    /* no temp file left behind */
    char tmpname[300];
    snprintf(tmpname, sizeof(tmpname), "%s.tmp.%ld", g_tmp, (long)getpid());
    CHECK(access(tmpname, F_OK) != 0);
    /* unwritable destination */
    qs_log_set_quiet(true);
    float one = 1;
    CHECK_EQ_INT(rt_npy_write_f32("/nonexistent-dir/x.npy", &one, 1, 1), RT_IO_ERR_OPEN);
    qs_log_set_quiet(false);
}

/* Header + data built by hand: each is a way a .npy file can be broken. */
static void test_malformed(void)
{
    struct {
        const char *name;
        const char *dict; /* NULL: raw bytes below */
        int version;
        size_t data_bytes;
    } cases[] = {
        {"good (control)", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 1, 24},
        {"data short", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 1, 20},
        {"data long", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 1, 28},
        {"3 dims", "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 3), }", 1, 24},
        {"0 dims", "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 1, 4},
        {"missing shape", "{'descr': '<f4', 'fortran_order': False, }", 1, 24},
        {"unknown key", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}", 1,
         24},
        {"dup key", "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}",
         1, 24},
        {"negative dim", "{'descr': '<f4', 'fortran_order': False, 'shape': (-2, 3), }", 1, 24},
        {"huge dims",
         "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 8), }", 1, 24},
        {"overflowing dim",
         "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999, 1), }", 1, 24},
        {"unterminated", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3", 1, 24},
        {"int32", "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }", 1, 24},
        {"version 4", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 4, 24},
        {"bad magic", NULL, 1, 24},
    };
    qs_log_set_quiet(true);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        unsigned char buf[512] = {0};
        size_t hl = cases[i].dict ? strlen(cases[i].dict) + 1 : 60;
        size_t pre = cases[i].version >= 2 ? 12 : 10;
        memcpy(buf, cases[i].dict ? "\x93NUMPY" : "\x93NUMPX", 6);
        buf[6] = (unsigned char)cases[i].version;
        buf[8] = (unsigned char)hl;
        if (cases[i].dict)
            memcpy(buf + pre, cases[i].dict, hl - 1);
        buf[pre + hl - 1] = '\n';
        write_bytes(g_tmp, buf, pre + hl + cases[i].data_bytes);
        float *x = (float *)1;
        int64_t r, c;
        enum rt_io_err e = rt_npy_read_f32(g_tmp, &x, &r, &c);
        if (i == 0) {
            CHECK_MSG(e == RT_IO_ERR_NONE && r == 2 && c == 3, "%s", cases[i].name);
        } else {
            CHECK_MSG(e == RT_IO_ERR_FORMAT, "%s: got %d", cases[i].name, (int)e);
            CHECK(x == NULL);
        }
        free(x);
    }
    /* truncated inside the fixed prefix and inside the header */
    unsigned char t[] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 100, 0, '{'};
    for (size_t cut = 3; cut <= sizeof(t); cut += 4) {
        write_bytes(g_tmp, t, cut);
        float *x;
        int64_t r, c;
        CHECK_EQ_INT(rt_npy_read_f32(g_tmp, &x, &r, &c), RT_IO_ERR_FORMAT);
    }
    qs_log_set_quiet(false);
}

static void test_file_read(void)
{
    write_bytes(g_tmp, "hello\0world", 11);
    char *b = NULL;
    size_t n = 0;
    CHECK_EQ_INT(rt_file_read(g_tmp, 11, &b, &n), RT_IO_ERR_NONE);
    CHECK(n == 11 && b && memcmp(b, "hello\0world", 12) == 0); /* NUL appended */
    free(b);
    qs_log_set_quiet(true);
    CHECK_EQ_INT(rt_file_read(g_tmp, 10, &b, &n), RT_IO_ERR_TOO_BIG);
    CHECK(b == NULL);
    CHECK_EQ_INT(rt_file_read("/nonexistent-dir/x", 10, &b, &n), RT_IO_ERR_OPEN);
    qs_log_set_quiet(false);
    write_bytes(g_tmp, "", 0);
    CHECK_EQ_INT(rt_file_read(g_tmp, 100, &b, &n), RT_IO_ERR_NONE);
    CHECK(n == 0 && b && b[0] == 0);
    free(b);
}

static void test_ids(void)
{
    struct {
        const char *text;
        int n;
        int32_t want[4];
    } good[] = {
        {"1,2,3", 3, {1, 2, 3}},
        {" 1, 2 ,3 ", 3, {1, 2, 3}},
        {"[1, 2, 3]", 3, {1, 2, 3}},
        {"7 8\n9", 3, {7, 8, 9}},
        {"0", 1, {0}},
        {"2147483647,", 1, {2147483647}},
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK_EQ_INT(rt_ids_parse(good[i].text, &ids, &n), RT_IO_ERR_NONE);
        CHECK_MSG(n == (size_t)good[i].n && ids && !memcmp(ids, good[i].want, n * 4), "\"%s\"",
                  good[i].text);
        free(ids);
    }
    /* a long list grows the buffer */
    char big[6000] = "";
    for (int i = 0; i < 1000; i++)
        sprintf(big + strlen(big), "%d,", i * 7);
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_EQ_INT(rt_ids_parse(big, &ids, &n), RT_IO_ERR_NONE);
    CHECK(n == 1000 && ids && ids[999] == 999 * 7);
    free(ids);
    const char *bad[] = {"", " ", "[]", "1,,2", ",1", "-1", "+1", "1.5", "2147483648", "1x",
                         "[1,2", "1,2]", "abc", "1 2 ]x"};
    qs_log_set_quiet(true);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ids = (int32_t *)1;
        CHECK_MSG(rt_ids_parse(bad[i], &ids, &n) == RT_IO_ERR_PARSE, "\"%s\" accepted", bad[i]);
        CHECK(ids == NULL);
    }
    qs_log_set_quiet(false);
}

int main(void)
{
    T_INIT("io");
    const char *tmpdir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(g_tmp, sizeof(g_tmp), "%s/qshard_test_io_%ld.npy", tmpdir, (long)getpid());
    test_numpy_files();
    test_round_trip();
    test_malformed();
    test_file_read();
    test_ids();
    unlink(g_tmp);
    return t_done();
}
