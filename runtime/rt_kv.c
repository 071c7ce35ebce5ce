/*
 * rt_kv.c - the KV cache of one rank (rt.h struct rt_kv): the paged pools, one backend buffer
 * per layer and kind, [n_blocks][n_kv_heads_per_rank][block_size][hd] elements of the backend's
 * kv_size (kernels/ref.h "paged KV cache"). Which blocks a sequence holds is decided on rank 0
 * (runtime/rt_blocks.c) and sent with every step, so a rank's cache is only memory.
 * Test: ./build/test_model (batches vs one sequence at a time), ./build/test_blocks.
 */
#include <stdlib.h>
#include <string.h>

#include "qs_log.h"
#include "rt_model_int.h"

size_t rt_kv_block_bytes(const struct rt_model *m, int block_size)
{
    const struct rt_config *c = &m->cfg;
    return 2 * (size_t)c->n_layers * (size_t)c->kv_heads_per_rank * (size_t)block_size *
           (size_t)c->head_dim * m->be.ops->kv_size;
}

enum rt_err rt_kv_create(struct rt_model *m, int n_blocks, int block_size, struct rt_kv **out)
{
    *out = NULL;
    const struct rt_config *c = &m->cfg;
    if (n_blocks < 2 || block_size != m->block_size) {
        qs_log_error(__func__, "KV cache of %d blocks of %d tokens: need >= 2 blocks (one is "
                     "reserved) of the %d tokens the model was opened for", n_blocks, block_size,
                     m->block_size);
        return RT_ERR_ARG;
    }
    struct rt_kv *kv = calloc(1, sizeof(*kv));
    if (!kv) {
        qs_log_error(__func__, "out of memory");
        return RT_ERR_NOMEM;
    }
    kv->m = m;
    kv->n_blocks = n_blocks;
    kv->block_size = block_size;
    kv->block_elems = (size_t)c->kv_heads_per_rank * (size_t)block_size * (size_t)c->head_dim;
    kv->k = calloc((size_t)c->n_layers, sizeof(void *));
    kv->v = calloc((size_t)c->n_layers, sizeof(void *));
    enum rt_err e = RT_ERR_NONE;
    if (!kv->k || !kv->v) {
        qs_log_error(__func__, "out of memory");
        e = RT_ERR_NOMEM;
    }
    const size_t bytes = (size_t)n_blocks * kv->block_elems * m->be.ops->kv_size;
    for (int l = 0; l < c->n_layers && !e; l++) {
        e = m->be.ops->alloc(m->be.ctx, bytes, &kv->k[l]);
        if (!e)
            e = m->be.ops->alloc(m->be.ctx, bytes, &kv->v[l]);
    }
    if (e) {
        if (e == RT_ERR_NOMEM)
            qs_log_error(__func__, "the KV cache of %d blocks of %d tokens (%.1f MiB per rank) "
                         "does not fit: ask for less (--kv-cache-gb, --ctx, --max-num-seqs)",
                         n_blocks, block_size, 2.0 * c->n_layers * (double)bytes / (1 << 20));
        rt_kv_free(kv);
        return e;
    }
    *out = kv;
    return RT_ERR_NONE;
}

void rt_kv_free(struct rt_kv *kv)
{
    if (!kv)
        return;
    const struct rt_model *m = kv->m;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        if (kv->k)
            m->be.ops->free(m->be.ctx, kv->k[l]);
        if (kv->v)
            m->be.ops->free(m->be.ctx, kv->v[l]);
    }
    free(kv->k);
    free(kv->v);
    free(kv);
}

int rt_kv_n_blocks(const struct rt_kv *kv)
{
    return kv->n_blocks;
}

int rt_kv_block_size(const struct rt_kv *kv)
{
    return kv->block_size;
}
