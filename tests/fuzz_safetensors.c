/*
 * fuzz_safetensors.c - libFuzzer target for the safetensors header parser
 * (convert/cvt_safetensors.c, cvt_safetensors_parse).
 *
 * Each input is a whole safetensors file image. It is parsed twice: as is, and "repaired" (the
 * 8-byte header length set to where the JSON object appears to end, and the data region padded or
 * cut so the last data_offsets end matches), so that mutations of the JSON get past the length
 * checks and reach the tensor checks behind them. On success the catalog's invariants are asserted
 * (offsets and sizes inside the file, tiles without overlap). Logging is quiet.
 * Build and run: `make fuzz` on the seed corpus tests/data/fuzz/fuzz_safetensors/ (small real
 * safetensors files; see tests/data/fuzz/README.md).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cvt_src.h" /* cvt_safetensors_parse, cvt_dtype_size */
#include "qs_log.h"  /* qs_log_set_quiet */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const uint8_t *data, size_t size)
{
    struct cvt_tensor_list l;
    if (cvt_safetensors_parse("fuzz.safetensors", data, size, size, &l) != CVT_ERR_NONE) {
        if (l.n || l.t)
            abort(); /* a failed parse leaves nothing behind */
        return;
    }
    uint64_t prev_end = 0;
    for (size_t i = 0; i < l.n; i++) {
        const struct cvt_src_tensor *t = &l.t[i];
        if (!t->name || !t->name[0] || t->n_dims < 0 || t->n_dims > CVT_MAX_DIMS)
            abort();
        if (t->nbytes != (uint64_t)t->numel * cvt_dtype_size(t->dtype) || t->offset > size ||
            t->nbytes > size - t->offset || t->offset < prev_end)
            abort();
        prev_end = t->offset + t->nbytes;
        volatile uint8_t sink = 0;
        if (t->nbytes)
            sink ^= data[t->offset] ^ data[t->offset + t->nbytes - 1]; /* touch both ends */
        (void)sink;
    }
    cvt_tensor_list_free(&l);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    qs_log_set_quiet(true);
    check(data, size);
    /* repaired copy: header length = bytes up to the last '}' of the JSON part */
    if (size > 9 && size < (1u << 20)) {
        size_t hend = 0;
        for (size_t i = 8; i < size; i++)
            if (data[i] == '}')
                hend = i + 1;
        if (hend > 8) {
            uint8_t *copy = malloc(size);
            if (!copy)
                return 0;
            memcpy(copy, data, size);
            uint64_t h = hend - 8;
            memcpy(copy, &h, 8);
            check(copy, size);
            free(copy);
        }
    }
    return 0;
}
