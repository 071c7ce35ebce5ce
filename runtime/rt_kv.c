/*
 * rt_kv.c - the KV cache of one rank (rt.h struct rt_kv): n_seqs sequence slots of n_ctx
 * positions, one backend buffer per layer and kind, [n_seqs][n_kv_heads_per_rank][n_ctx][hd]
 * elements of the backend's kv_size (slot s of layer l starts at s * nkv * n_ctx * hd: the
 * contiguous [nkv][T_cap][hd] cache the attention kernels read, T_cap = n_ctx). The host keeps
 * how many positions each slot holds; every rank of a TP set keeps its own, equal because every
 * rank runs the same batches.
 * Test: ./build/test_model (slots in one batch vs one at a time).
 */
#include <stdlib.h>
#include <string.h>

#include "qs_log.h"
#include "rt_model_int.h"

enum rt_err rt_kv_create(struct rt_model *m, int n_seqs, int n_ctx, struct rt_kv **out)
{
    *out = NULL;
    const struct rt_config *c = &m->cfg;
    if (n_seqs < 1 || n_ctx < 1 || n_ctx > m->n_ctx) {
        qs_log_error(__func__, "KV cache of %d slot(s) x %d positions: need >= 1 slot and 1..%d "
                     "positions", n_seqs, n_ctx, m->n_ctx);
        return RT_ERR_ARG;
    }
    struct rt_kv *kv = calloc(1, sizeof(*kv));
    if (!kv) {
        qs_log_error(__func__, "out of memory");
        return RT_ERR_NOMEM;
    }
    kv->m = m;
    kv->n_seqs = n_seqs;
    kv->n_ctx = n_ctx;
    kv->len = calloc((size_t)n_seqs, sizeof(int));
    kv->k = calloc((size_t)c->n_layers, sizeof(void *));
    kv->v = calloc((size_t)c->n_layers, sizeof(void *));
    enum rt_err e = RT_ERR_NONE;
    if (!kv->len || !kv->k || !kv->v) {
        qs_log_error(__func__, "out of memory");
        e = RT_ERR_NOMEM;
    }
    const size_t bytes = (size_t)n_seqs * (size_t)c->kv_heads_per_rank * (size_t)n_ctx *
                         (size_t)c->head_dim * m->be.ops->kv_size;
    for (int l = 0; l < c->n_layers && !e; l++) {
        e = m->be.ops->alloc(m->be.ctx, bytes, &kv->k[l]);
        if (!e)
            e = m->be.ops->alloc(m->be.ctx, bytes, &kv->v[l]);
    }
    if (e) {
        rt_kv_free(kv);
        return e;
    }
    if (m->rank == 0)
        qs_log_info("KV cache: %d slot%s of %d positions, %.1f MiB per rank", n_seqs,
                    n_seqs == 1 ? "" : "s", n_ctx, 2.0 * c->n_layers * (double)bytes / (1 << 20));
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
    free(kv->len);
    free(kv);
}

int rt_kv_n_seqs(const struct rt_kv *kv)
{
    return kv->n_seqs;
}

int rt_kv_n_ctx(const struct rt_kv *kv)
{
    return kv->n_ctx;
}

int rt_kv_len(const struct rt_kv *kv, int seq)
{
    return seq >= 0 && seq < kv->n_seqs ? kv->len[seq] : 0;
}

void rt_kv_clear(struct rt_kv *kv, int seq)
{
    if (seq >= 0 && seq < kv->n_seqs)
        kv->len[seq] = 0;
}

void *rt_kv_slot(const struct rt_kv *kv, int layer, int seq, bool value)
{
    const struct rt_config *c = &kv->m->cfg;
    const size_t slot = (size_t)c->kv_heads_per_rank * (size_t)kv->n_ctx * (size_t)c->head_dim *
                        kv->m->be.ops->kv_size;
    return (char *)(value ? kv->v[layer] : kv->k[layer]) + (size_t)seq * slot;
}
