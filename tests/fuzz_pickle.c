/*
 * fuzz_pickle.c - libFuzzer target for the torch zip reader and the restricted unpickler
 * (convert/cvt_torchbin.c: cvt_torchzip_parse, cvt_pickle_parse_only).
 *
 * An input starting with "PK" is a whole torch.save zip image; anything else is a data.pkl image
 * run through the unpickler alone. Nothing may crash, leak, execute, loop or allocate without
 * bound; on success every tensor of the catalog must lie inside the image (zip mode).
 * Logging is quiet. Build and run: `make fuzz` on the seed corpus tests/data/fuzz/fuzz_pickle/
 * (data.pkl records and small torch zips from the fixture models; see tests/data/fuzz/README.md).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cvt_src.h" /* cvt_torchzip_parse, cvt_pickle_parse_only */
#include "qs_log.h"  /* qs_log_set_quiet */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    qs_log_set_quiet(true);
    struct cvt_tensor_list l;
    bool zip = size >= 2 && data[0] == 'P' && data[1] == 'K';
    enum cvt_err e = zip ? cvt_torchzip_parse("fuzz.bin", data, size, &l)
                         : cvt_pickle_parse_only("fuzz/data.pkl", data, size, &l);
    if (e != CVT_ERR_NONE) {
        if (l.n || l.t)
            abort();
        return 0;
    }
    for (size_t i = 0; i < l.n; i++) {
        const struct cvt_src_tensor *t = &l.t[i];
        if (!t->name || !t->name[0] || t->n_dims > CVT_MAX_DIMS)
            abort();
        if (zip && t->contiguous && (t->offset > size || t->nbytes > size - t->offset))
            abort();
    }
    cvt_tensor_list_free(&l);
    return 0;
}
