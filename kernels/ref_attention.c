/*
 * ref_attention.c - causal GQA attention over a KV cache for prefill and decode, with an
 * optional sliding window (transformers eager attention: softmax(q k^T * hd^-0.5 + mask) v,
 * softmax in fp32). Reference of k_attn_prefill / k_attn_decode; the CPU backend's attention.
 * One task per query head, each over all M query rows. Test: ./build/test_ref
 */
#include <math.h>
#include <stdlib.h>

#include "qs_log.h" /* qs_log_error */
#include "ref.h"

struct attn_ctx {
    float *out;
    size_t out_stride;
    const float *q;
    size_t q_stride;
    const float *k_cache, *v_cache;
    int M, start_pos, n_heads, n_kv_heads, hd, T_cap, window;
    float *scratch; /* [n_heads][start_pos + M] */
};

static void attn_task(void *vctx, int h, int n_tasks)
{
    const struct attn_ctx *c = vctx;
    (void)n_tasks;
    int T = c->start_pos + c->M, hd = c->hd;
    int kvh = h / (c->n_heads / c->n_kv_heads);
    const float *kc = c->k_cache + (size_t)kvh * (size_t)c->T_cap * (size_t)hd;
    const float *vc = c->v_cache + (size_t)kvh * (size_t)c->T_cap * (size_t)hd;
    float *sc = c->scratch + (size_t)h * (size_t)T;
    float scale = 1.0f / sqrtf((float)hd);

    for (int m = 0; m < c->M; m++) {
        int p = c->start_pos + m;
        int lo = c->window > 0 && p - c->window + 1 > 0 ? p - c->window + 1 : 0;
        const float *qv = c->q + (size_t)m * c->q_stride + (size_t)h * (size_t)hd;
        float mx = -INFINITY;
        for (int j = lo; j <= p; j++) {
            const float *kv = kc + (size_t)j * (size_t)hd;
            float dot = 0.0f;
            for (int d = 0; d < hd; d++)
                dot += qv[d] * kv[d];
            sc[j] = dot * scale;
            mx = sc[j] > mx ? sc[j] : mx;
        }
        float sum = 0.0f;
        for (int j = lo; j <= p; j++) {
            sc[j] = expf(sc[j] - mx);
            sum += sc[j];
        }
        float *o = c->out + (size_t)m * c->out_stride + (size_t)h * (size_t)hd;
        for (int d = 0; d < hd; d++)
            o[d] = 0.0f;
        for (int j = lo; j <= p; j++) {
            float pj = sc[j] / sum;
            const float *vv = vc + (size_t)j * (size_t)hd;
            for (int d = 0; d < hd; d++)
                o[d] += pj * vv[d];
        }
    }
}

enum ref_err ref_attention(float *out, size_t out_stride, const float *q, size_t q_stride,
                           const float *k_cache, const float *v_cache, int M, int start_pos,
                           int n_heads, int n_kv_heads, int hd, int T_cap, int sliding_window,
                           struct ref_pool *pool)
{
    if (M < 1 || start_pos < 0 || n_heads < 1 || n_kv_heads < 1 || hd < 1 ||
        n_heads % n_kv_heads || (int64_t)start_pos + M > T_cap) {
        qs_log_error(__func__, "M=%d start_pos=%d heads=%d kv_heads=%d head_dim=%d T_cap=%d: "
                     "need M >= 1, heads %% kv_heads == 0, start_pos + M <= T_cap",
                     M, start_pos, n_heads, n_kv_heads, hd, T_cap);
        return REF_ERR_SHAPE;
    }
    float *scratch = malloc((size_t)n_heads * ((size_t)start_pos + (size_t)M) * sizeof(float));
    if (!scratch) {
        qs_log_error(__func__, "no memory for %d x %d attention scores", n_heads, start_pos + M);
        return REF_ERR_NOMEM;
    }
    struct attn_ctx c = {out, out_stride, q, q_stride, k_cache, v_cache, M, start_pos,
                         n_heads, n_kv_heads, hd, T_cap, sliding_window, scratch};
    ref_pool_run(pool, attn_task, &c, n_heads);
    free(scratch);
    return REF_ERR_NONE;
}
