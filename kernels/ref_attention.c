/*
 * ref_attention.c - causal GQA attention over a KV cache for prefill and decode, with an
 * optional sliding window (transformers eager attention: softmax(q k^T * hd^-0.5 + mask) v,
 * softmax in fp32) and, in the paged entry point, the score options of struct ref_att_score
 * (Gemma's scale and soft-capping, MPT's ALiBi biases), over the contiguous cache (ref_attention) or the paged one
 * (ref_attention_paged, ref_kv_store_paged: ref.h "paged KV cache"). Reference of
 * k_attention / k_attention_paged; the CPU backend's attention. One task per query head, each
 * over all M query rows; both entry points run the same row loop, so a row gets the same bits
 * from either. Test: ./build/test_ref
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
    const float *k_pool, *v_pool;
    int M, n_heads, n_kv_heads, hd, block_size, window;
    struct ref_att_score score; /* scale (0: 1/sqrt(hd)), softcap, alibi (ref.h) */
    const int32_t *pos;       /* [M]; NULL: start_pos + m */
    int start_pos;
    const int32_t *tables;    /* [.][table_stride] */
    int table_stride;
    const int32_t *row_table; /* [M] or NULL: row m -> table row m (or 0 when one_table) */
    int one_table;
    int max_T;                /* most keys of any row: scratch per head */
    float *scratch;           /* [n_heads][max_T] */
};

static int row_pos(const struct attn_ctx *c, int m)
{
    return c->pos ? c->pos[m] : c->start_pos + m;
}

static const int32_t *row_tab(const struct attn_ctx *c, int m)
{
    const int r = c->one_table ? 0 : c->row_table ? c->row_table[m] : m;
    return c->tables + (size_t)r * (size_t)c->table_stride;
}

/* element offset of key t of kv head kvh in the sequence with block table tab */
static size_t key_off(const struct attn_ctx *c, const int32_t *tab, int kvh, int t)
{
    const int bs = c->block_size;
    return ref_kv_offset((int64_t)tab[t / bs] * bs + t % bs, kvh, c->n_kv_heads, bs, c->hd);
}

static void attn_task(void *vctx, int h, int n_tasks)
{
    const struct attn_ctx *c = vctx;
    (void)n_tasks;
    const int hd = c->hd, kvh = h / (c->n_heads / c->n_kv_heads);
    float *sc = c->scratch + (size_t)h * (size_t)c->max_T;
    const float scale = c->score.scale > 0.0f ? c->score.scale : 1.0f / sqrtf((float)hd);
    const float cap = c->score.softcap;
    const float *alibi = c->score.alibi;

    for (int m = 0; m < c->M; m++) {
        const int p = row_pos(c, m);
        const int32_t *tab = row_tab(c, m);
        const int lo = c->window > 0 && p - c->window + 1 > 0 ? p - c->window + 1 : 0;
        const float *qv = c->q + (size_t)m * c->q_stride + (size_t)h * (size_t)hd;
        float mx = -INFINITY;
        for (int j = lo; j <= p; j++) {
            const float *kv = c->k_pool + key_off(c, tab, kvh, j);
            float dot = 0.0f;
            for (int d = 0; d < hd; d++)
                dot += qv[d] * kv[d];
            sc[j] = dot * scale;
            if (cap > 0.0f) /* Gemma 2: cap * tanh(s / cap) */
                sc[j] = (float)tanh((double)(sc[j] / cap)) * cap;
            if (alibi) /* ALiBi (MPT): slope * (key position - query position) */
                sc[j] += alibi[h] * (float)(j - p);
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
            const float pj = sc[j] / sum;
            const float *vv = c->v_pool + key_off(c, tab, kvh, j);
            for (int d = 0; d < hd; d++)
                o[d] += pj * vv[d];
        }
    }
}

static enum ref_err run(struct attn_ctx *c, struct ref_pool *pool)
{
    c->scratch = malloc((size_t)c->n_heads * (size_t)c->max_T * sizeof(float));
    if (!c->scratch) {
        qs_log_error("ref_attention", "no memory for %d x %d attention scores", c->n_heads,
                     c->max_T);
        return REF_ERR_NOMEM;
    }
    ref_pool_run(pool, attn_task, c, c->n_heads);
    free(c->scratch);
    return REF_ERR_NONE;
}

static int heads_ok(int n_heads, int n_kv_heads, int hd)
{
    return n_heads >= 1 && n_kv_heads >= 1 && hd >= 1 && n_heads % n_kv_heads == 0;
}

enum ref_err ref_attention(float *out, size_t out_stride, const float *q, size_t q_stride,
                           const float *k_cache, const float *v_cache, int M, int start_pos,
                           int n_heads, int n_kv_heads, int hd, int T_cap, int sliding_window,
                           struct ref_pool *pool)
{
    if (M < 1 || start_pos < 0 || !heads_ok(n_heads, n_kv_heads, hd) ||
        (int64_t)start_pos + M > T_cap) {
        qs_log_error(__func__, "M=%d start_pos=%d heads=%d kv_heads=%d head_dim=%d T_cap=%d: "
                     "need M >= 1, heads %% kv_heads == 0, start_pos + M <= T_cap",
                     M, start_pos, n_heads, n_kv_heads, hd, T_cap);
        return REF_ERR_SHAPE;
    }
    static const int32_t table0[1] = {0}; /* the contiguous cache: one block of T_cap rows */
    struct attn_ctx c = {.out = out, .out_stride = out_stride, .q = q, .q_stride = q_stride,
                         .k_pool = k_cache, .v_pool = v_cache, .M = M, .n_heads = n_heads,
                         .n_kv_heads = n_kv_heads, .hd = hd, .block_size = T_cap,
                         .window = sliding_window, .start_pos = start_pos, .tables = table0,
                         .one_table = 1, .max_T = start_pos + M};
    return run(&c, pool);
}

enum ref_err ref_attention_paged(float *out, size_t out_stride, const float *q, size_t q_stride,
                                 const float *k_pool, const float *v_pool, int M,
                                 const int32_t *pos, const int32_t *tables, int table_stride,
                                 const int32_t *row_table, int n_heads, int n_kv_heads, int hd,
                                 int block_size, int sliding_window,
                                 const struct ref_att_score *score, struct ref_pool *pool)
{
    if (M < 1 || !heads_ok(n_heads, n_kv_heads, hd) || block_size < 1 || table_stride < 1 ||
        !pos || !tables) {
        qs_log_error(__func__, "M=%d heads=%d kv_heads=%d head_dim=%d block_size=%d "
                     "table_stride=%d: need M >= 1, heads %% kv_heads == 0, block_size >= 1",
                     M, n_heads, n_kv_heads, hd, block_size, table_stride);
        return REF_ERR_SHAPE;
    }
    struct attn_ctx c = {.out = out, .out_stride = out_stride, .q = q, .q_stride = q_stride,
                         .k_pool = k_pool, .v_pool = v_pool, .M = M, .n_heads = n_heads,
                         .n_kv_heads = n_kv_heads, .hd = hd, .block_size = block_size,
                         .window = sliding_window, .pos = pos, .tables = tables,
                         .table_stride = table_stride, .row_table = row_table, .max_T = 1};
    if (score)
        c.score = *score;
    for (int m = 0; m < M; m++) {
        const int p = pos[m];
        const int32_t *tab = row_tab(&c, m);
        if (p < 0 || (int64_t)p / block_size >= table_stride) {
            qs_log_error(__func__, "row %d: position %d outside a block table of %d blocks of %d",
                         m, p, table_stride, block_size);
            return REF_ERR_SHAPE;
        }
        for (int b = 0; b <= p / block_size; b++)
            if (tab[b] < 0) {
                qs_log_error(__func__, "row %d (position %d): block %d of its table is %d", m, p,
                             b, tab[b]);
                return REF_ERR_SHAPE;
            }
        c.max_T = p + 1 > c.max_T ? p + 1 : c.max_T;
    }
    return run(&c, pool);
}

void ref_kv_store_paged(float *k_pool, float *v_pool, const float *k, const float *v,
                        size_t row_stride, int M, const int32_t *slots, int n_kv_heads, int hd,
                        int block_size)
{
    for (int m = 0; m < M; m++) {
        if (slots[m] < 0)
            continue;
        for (int h = 0; h < n_kv_heads; h++) {
            const size_t dst = ref_kv_offset(slots[m], h, n_kv_heads, block_size, hd);
            const size_t src = (size_t)m * row_stride + (size_t)h * (size_t)hd;
            for (int d = 0; d < hd; d++) {
                k_pool[dst + d] = k[src + d];
                v_pool[dst + d] = v[src + d];
            }
        }
    }
}

void ref_alibi_slopes(float *out, int n_heads, int h0, int n, float alibi_bias_max)
{
    int P = 1;
    while (P < n_heads)
        P *= 2;
    for (int j = 0; j < n; j++) {
        const int h = h0 + j;
        /* index i (1-based) of head h among the P slopes: with P != n_heads, heads take the
         * slopes of odd positions (i = 2, 4, ..) first, then those of even ones (i = 1, 3, ..) */
        int i = h + 1;
        if (P != n_heads)
            i = h < P / 2 ? 2 * h + 2 : 2 * (h - P / 2) + 1;
        const float base = (float)i * (alibi_bias_max / (float)P);
        out[j] = 1.0f / powf(2.0f, base);
    }
}
