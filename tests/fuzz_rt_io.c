/*
 * fuzz_rt_io.c - libFuzzer target for the runtime's small parsers of hostile input
 * (runtime/rt_io.c): rt_npy_parse_f32 (.npy goldens and logits files) and rt_ids_parse (the
 * --tokens lists of `qshard run/logits/perplexity/tokenize`). The first byte picks the parser
 * (even: .npy, odd: id list, given as a NUL-terminated copy of the rest). On success the
 * results are checked against the input (data size = shape, ids non-negative); on failure the
 * out-parameters must be NULL / 0.
 * Seeds: tests/data/fuzz/fuzz_rt_io/ - the NumPy-written files of tests/data/npy prefixed with
 * one 0x00 byte, and a few id lists prefixed with 0x01 (see tests/data/fuzz/fuzz_rt_io/SEEDS).
 * Build and run: `make fuzz`.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qs_log.h" /* qs_log_set_quiet */
#include "rt_io.h"  /* rt_npy_parse_f32, rt_ids_parse */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    qs_log_set_quiet(true);
    if (size < 1)
        return 0;
    if ((data[0] & 1) == 0) {
        float *x = (float *)1;
        int64_t r = -1, c = -1;
        if (rt_npy_parse_f32(data + 1, size - 1, "fuzz", &x, &r, &c) != RT_IO_ERR_NONE) {
            if (x || r || c)
                abort();
            return 0;
        }
        /* the data bytes exactly match the shape, so rows * cols * 4 < size */
        if (!x || r < 0 || c < 0 || (uint64_t)r * (uint64_t)c * 4 >= size)
            abort();
        volatile float sink = 0;
        for (int64_t i = 0; i < r * c; i++)
            sink += x[i]; /* every element readable (ASan) */
        (void)sink;
        free(x);
        return 0;
    }
    char *text = malloc(size);
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    int32_t *ids = (int32_t *)1;
    size_t n = 7;
    if (rt_ids_parse(text, &ids, &n) != RT_IO_ERR_NONE) {
        if (ids || n)
            abort();
    } else {
        if (!ids || n == 0 || n > size)
            abort();
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0)
                abort();
        free(ids);
    }
    free(text);
    return 0;
}
