/*
 * t_perchan.h - a per-channel AWQ checkpoint made from a grouped one, for the tests that convert
 * one (tests/test_cvt_built.c: bit for bit; tests/test_model_fixtures.c: logits vs fp64).
 */
#ifndef QS_T_PERCHAN_H
#define QS_T_PERCHAN_H

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cvt_src.h"       /* struct cvt_source */
#include "t_safetensors.h" /* struct st_entry */

/* Every tensor of src as safetensors entries (data read into owned buffers), with each 2-D
 * `.scales` / `.qzeros` cut to its first row ([1, N]: group 0's zeros and scales for all K rows,
 * so the same codes become a per-channel checkpoint). *n: entries; *n_cut: tensors cut. NULL
 * when memory or a read fails (nothing to free then). */
static __attribute__((unused)) struct st_entry *perchan_entries(struct cvt_source *src, int *n,
                                                                int *n_cut)
{
    const size_t n_src = cvt_source_n_tensors(src);
    struct st_entry *e = calloc(n_src ? n_src : 1, sizeof(*e));
    *n = *n_cut = 0;
    for (size_t i = 0; e && i < n_src; i++) {
        const struct cvt_src_tensor *t = cvt_source_tensor(src, i);
        struct st_entry *x = &e[(*n)++];
        snprintf(x->name, sizeof(x->name), "%s", t->name);
        x->dtype = cvt_dtype_str(t->dtype);
        x->n_dims = t->n_dims;
        for (int d = 0; d < t->n_dims && d < 2; d++)
            x->shape[d] = t->shape[d];
        x->size = (size_t)t->nbytes;
        x->data = malloc(x->size ? x->size : 1);
        if (!x->data || cvt_source_read(src, t, x->data, x->size) != CVT_ERR_NONE) {
            for (int k = 0; k < *n; k++)
                free(e[k].data);
            free(e);
            return NULL;
        }
        const size_t len = strlen(t->name);
        const bool zs = len > 7 && (!strcmp(t->name + len - 7, ".qzeros") ||
                                    !strcmp(t->name + len - 7, ".scales"));
        if (zs && t->n_dims == 2 && t->shape[0] > 1) { /* keep group 0 only: [1, cols] */
            x->size /= (size_t)t->shape[0];
            x->shape[0] = 1;
            (*n_cut)++;
        }
    }
    return e;
}

#endif /* QS_T_PERCHAN_H */
