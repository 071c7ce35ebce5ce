/*
 * rt_forward.c - the forward pass of one rank (rt.h rt_model_forward, rt_model_check_batch):
 * a batch of tokens of one or more sequences, run in chunks of at most max_batch rows.
 *
 * Per chunk: the token ids and positions go to backend memory once; embed (vocab-parallel rows,
 * summed over the ranks); per layer the architecture's block (struct rt_arch): norm -> qkv ->
 * RoPE + KV-cache store and attention per run of one sequence's rows -> o_proj -> all-reduce ->
 * norm -> MLP (dense, or the MoE routed on the host) -> all-reduce (parallel residual: the MLP
 * reads the attention's input, both outputs added to h; Gemma: each block's output through its
 * out norm before the add); the final norm; then the
 * lm_head on the rows whose logits are wanted, gathered on rank 0 (vocab-parallel columns).
 *
 * Deferred split-K is an explicit epilogue chosen here: a linear whose consumer is local and
 * that the backend can defer (rt_linear.acc_ok, M <= defer_m) adds its sums into the model's
 * accumulator `acc`, and the next op is told to read them (rope_kv_store's x_acc after qkv,
 * act_mul's gate_up_acc after gate_up, norm's x_acc after o and down at world size 1). Each
 * pair computes what the plain ops compute, without the fp16 rounding of the linear's output.
 *
 * The KV cache is paged (kernels/ref.h): each chunk uploads, with its token ids and positions,
 * the pool row ("slot") each token's key and value go to, the block table of each of its
 * sequences and which table each row reads (computed here on the host from the step's tables,
 * struct rt_kv_step). A decode step (every sequence one token, every row's output wanted) may
 * run as the backend's recorded graph of its batch-size bucket (1, 2, 4, .. 256 rows, padded
 * with rows that write to the reserved block 0 and whose outputs are dropped): the recording
 * holds the body and the lm_head of those rows and reads everything from the uploaded buffers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qs_log.h"
#include "ref.h" /* ref_moe_route */
#include "rt_model_int.h"

// --- the batch ---------------------------------------------------------------------------------

static int seq_of(const struct rt_batch *b, int i)
{
    return b->seq ? b->seq[i] : 0;
}

enum rt_err rt_model_check_batch(const struct rt_model *m, const int *len, int n_seqs, int n_ctx,
                                 const struct rt_batch *b)
{
    const struct rt_config *c = &m->cfg;
    if (!b || b->n_tokens < 1 || !b->tokens || !b->pos) {
        qs_log_error(__func__, "no tokens to run (n_tokens = %d)", b ? b->n_tokens : 0);
        return RT_ERR_ARG;
    }
    for (int i = 0; i < b->n_tokens; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= c->vocab_size) {
            qs_log_error(__func__, "token %d (at index %d) is outside the vocabulary [0, %d)",
                         b->tokens[i], i, c->vocab_size);
            return RT_ERR_TOKEN;
        }
    for (int i = 0; i < b->n_tokens;) {
        const int s = seq_of(b, i), p0 = b->pos[i];
        if (s < 0 || s >= n_seqs) {
            qs_log_error(__func__, "token %d: sequence slot %d outside [0, %d)", i, s, n_seqs);
            return RT_ERR_ARG;
        }
        for (int j = 0; j < i; j++)
            if (seq_of(b, j) == s) {
                qs_log_error(__func__, "token %d: sequence slot %d appears twice in the batch "
                             "(its tokens must be consecutive)", i, s);
                return RT_ERR_ARG;
            }
        if (p0 < 0 || p0 > len[s]) {
            qs_log_error(__func__, "start_pos %d: only positions [0, %d) are in the KV cache%s",
                         p0, len[s], n_seqs > 1 ? " of that sequence" : "");
            return RT_ERR_ARG;
        }
        int j = i + 1;
        for (; j < b->n_tokens && seq_of(b, j) == s; j++)
            if (b->pos[j] != b->pos[j - 1] + 1) {
                qs_log_error(__func__, "token %d: position %d after %d (the positions of a "
                             "sequence must follow each other)", j, b->pos[j], b->pos[j - 1]);
                return RT_ERR_ARG;
            }
        if ((int64_t)p0 + (j - i) > n_ctx) {
            qs_log_error(__func__, "context overflow: positions %d..%lld do not fit the KV cache "
                         "of %d tokens (n_ctx; the model allows up to %d)", p0,
                         (long long)p0 + (j - i) - 1, n_ctx, c->max_position_embeddings);
            return RT_ERR_CONTEXT;
        }
        i = j;
    }
    if (b->n_out < 0 || (b->n_out > 0 && !b->out)) {
        qs_log_error(__func__, "n_out %d with out rows %p", b->n_out, (const void *)b->out);
        return RT_ERR_ARG;
    }
    for (int i = 0; i < b->n_out; i++)
        if (b->out[i] < 0 || b->out[i] >= b->n_tokens || (i && b->out[i] <= b->out[i - 1])) {
            qs_log_error(__func__, "out row %d is %d: rows must be in [0, %d) and increasing", i,
                         b->out[i], b->n_tokens);
            return RT_ERR_ARG;
        }
    return RT_ERR_NONE;
}

/* Where the chunks' sequences are in the step's tables (rt_model_forward walks the chunks). */
struct walk {
    const struct rt_kv_step *ks;
    int g; /* table row (in ks) of the sequence of the last token walked, -1 before the first */
};

/*
 * Rows [c0, c0 + M) of b into m->runs (returns how many) and the host arrays of the chunk:
 * token ids, positions, pool slots, the table row of each row; the tables of the chunk's
 * sequences into m->h_tabs rows 0.. (run j reads row j). Padding rows up to `rows` (a graph
 * bucket): token 0 at position 0, stored nowhere, reading a zero table (block 0).
 */
static int make_runs(struct rt_model *m, const struct rt_batch *b, int c0, int M, int rows,
                     struct walk *w)
{
    const int bs = m->block_size, st = m->tab_stride;
    const int cp = w->ks->table_stride < st ? w->ks->table_stride : st;
    int n = 0;
    for (int i = 0; i < M; i++) {
        const int s = seq_of(b, c0 + i), p = b->pos[c0 + i];
        if (i == 0 || s != seq_of(b, c0 + i - 1)) {
            if (!(i == 0 && c0 > 0 && s == seq_of(b, c0 - 1))) /* else continued from the last chunk */
                w->g++;
            m->runs[n] = (struct rt_attn_run){i, 0, p, n};
            int32_t *dst = m->h_tabs + (size_t)n * st;
            memcpy(dst, w->ks->tables + (size_t)w->g * w->ks->table_stride, (size_t)cp * sizeof(int32_t));
            if (cp < st)
                memset(dst + cp, 0, (size_t)(st - cp) * sizeof(int32_t));
            n++;
        }
        m->runs[n - 1].n++;
        const int32_t *tab = m->h_tabs + (size_t)(n - 1) * st;
        m->h_tok[i] = b->tokens[c0 + i];
        m->h_pos[i] = p;
        m->h_slots[i] = tab[p / bs] * bs + p % bs;
        m->h_row_tab[i] = n - 1;
    }
    for (int i = M; i < rows; i++) { /* graph padding */
        m->h_tok[i] = 0;
        m->h_pos[i] = 0;
        m->h_slots[i] = -1;
        m->h_row_tab[i] = i;
        memset(m->h_tabs + (size_t)i * st, 0, (size_t)st * sizeof(int32_t));
    }
    return n;
}

/* The chunk's host arrays (make_runs) to backend memory: rows token rows, n_tab table rows. */
static enum rt_err upload_chunk(struct rt_model *m, int rows, int n_tab)
{
    /* the four arrays are one buffer of stride max_batch: up to row `rows` of the last */
    const size_t words = 3 * (size_t)m->max_batch + (size_t)rows;
    RT_TRY(OPS->upload(BCTX, m->tok, m->h_tok, words * sizeof(int32_t)));
    return OPS->upload(BCTX, m->tabs, m->h_tabs,
                       (size_t)n_tab * (size_t)m->tab_stride * sizeof(int32_t));
}

// --- ops of one chunk ----------------------------------------------------------------------------

/* Whether linear L may leave its sums in acc at M rows. */
static bool use_acc(const struct rt_model *m, const struct rt_linear *L, int M)
{
    return L->acc_ok && M <= m->defer_m && m->acc;
}

static enum rt_err linear(struct rt_model *m, const struct rt_linear *L, const void *x, int M,
                          void *y, float *acc)
{
    if (L->perm) { /* act-order: the input columns in the order the rows were stored */
        RT_TRY(OPS->gather_cols(BCTX, m->xperm, x, L->perm, M, L->K));
        x = m->xperm;
    }
    if (L->qweight)
        return OPS->linear_w4(BCTX, x, L->qweight, L->qzeros, L->scales, L->bias, M, L->K, L->N,
                              L->G, y, acc);
    return OPS->linear_f16(BCTX, x, L->weight_f16, L->bias, M, L->K, L->N, y);
}

/* Attention block of layer l: x -> o, or the o_proj sums in acc (return *deferred). */
static enum rt_err attn_block(struct rt_model *m, struct rt_kv *kv, int l, int M, int n_runs,
                              bool *deferred)
{
    const struct rt_config *c = &m->cfg;
    const struct rt_layer *ly = &m->layers[l];
    const int hd = c->head_dim, nq = c->heads_per_rank, nkv = c->kv_heads_per_rank;
    const size_t stride = (size_t)(nq + 2 * nkv) * (size_t)hd;
    float *qacc = use_acc(m, &ly->qkv, M) ? m->acc : NULL;

    RT_TRY(linear(m, &ly->qkv, m->x, M, m->qkv, qacc));
    if (ly->q_norm) /* Qwen3: q_norm / k_norm per head before RoPE */
        RT_TRY(OPS->head_norm(BCTX, m->qkv, qacc, M, nq, nkv, hd, stride, ly->q_norm, ly->k_norm,
                              c->rms_norm_eps));
    /* Gemma 2 / 3: the window on the local layers only, Gemma 3's local rope theta there */
    const bool local = rt_layer_local(c, l);
    const float *inv_freq = local && m->inv_freq_local ? m->inv_freq_local : m->inv_freq;
    RT_TRY(OPS->rope_kv_store(BCTX, m->qkv, qacc, M, nq, nkv, hd, stride, m->pos, inv_freq,
                              kv->k[l], kv->v[l], m->slots, kv->block_size));
    const struct rt_attn_rows a = {m->pos,      m->row_tab, m->tabs, m->tab_stride,
                                   kv->block_size, m->max_keys, m->runs, n_runs,
                                   m->alibi,    c->attn_scale, c->attn_softcap};
    RT_TRY(OPS->attention(BCTX, m->att, (size_t)nq * hd, m->qkv, stride, kv->k[l], kv->v[l], M,
                          &a, nq, nkv, hd, local ? c->sliding_window : 0));
    float *oacc = use_acc(m, &ly->o, M) ? m->acc : NULL;
    *deferred = oacc != NULL;
    return linear(m, &ly->o, m->att, M, m->o, oacc);
}

/* Dense MLP of layer l: x -> o, or the down_proj sums in acc (return *deferred). */
static enum rt_err dense_mlp(struct rt_model *m, int l, int M, bool *deferred)
{
    const struct rt_layer *ly = &m->layers[l];
    float *gacc = use_acc(m, &ly->gate_up, M) ? m->acc : NULL;
    RT_TRY(linear(m, &ly->gate_up, m->x, M, m->gu, gacc));
    RT_TRY(OPS->act_mul(BCTX, m->cfg.arch->act, m->act, m->gu, gacc, ly->act_scale, M,
                        m->cfg.intermediate_per_rank)); /* gated or plain (rt_act_gated) */
    float *dacc = use_acc(m, &ly->down, M) ? m->acc : NULL;
    *deferred = dacc != NULL;
    return linear(m, &ly->down, m->act, M, m->o, dacc);
}

/* Mixtral sparse MoE of layer l: route on the host with this rank's router logits (the router
 * is replicated and x is the same on every rank, so every rank routes alike), then run each
 * selected expert on the tokens routed to it and add its weighted output (experts in id order,
 * as transformers' index_add_ loop). Leaves this rank's partial sums in o. */
static enum rt_err moe(struct rt_model *m, int l, int M)
{
    const struct rt_config *c = &m->cfg;
    const int E = c->n_experts, k = c->n_experts_per_tok, H = c->hidden_size;
    const struct rt_layer *ly = &m->layers[l];

    RT_TRY(OPS->router(BCTX, m->x, ly->router, M, H, E, m->router_logits));
    RT_TRY(OPS->download(BCTX, m->h_router, m->router_logits, (size_t)M * E * sizeof(float)));
    ref_moe_route(m->h_router, M, E, k, c->norm_topk_prob, m->h_ids, m->h_w);
    RT_TRY(OPS->zero(BCTX, m->o, (size_t)M * H * OPS->act_size));
    for (int e = 0; e < E; e++) {
        int n = 0;
        for (int t = 0; t < M; t++)
            for (int j = 0; j < k; j++)
                if (m->h_ids[t * k + j] == e) {
                    m->h_rows[n] = t;
                    m->h_roww[n++] = m->h_w[t * k + j];
                }
        if (n == 0)
            continue;
        RT_TRY(OPS->gather_rows(BCTX, m->xe, m->x, m->h_rows, n, H));
        RT_TRY(linear(m, &ly->expert_gate_up[e], m->xe, n, m->gu, NULL));
        RT_TRY(OPS->act_mul(BCTX, c->arch->act, m->act, m->gu, NULL, NULL, n,
                            c->intermediate_per_rank));
        RT_TRY(linear(m, &ly->expert_down[e], m->act, n, m->ye, NULL));
        RT_TRY(OPS->scatter_add_rows(BCTX, m->o, m->ye, m->h_rows, m->h_roww, n, H));
    }
    return RT_ERR_NONE;
}

/* A block's output after its out norm (Gemma's post_attention / post_feedforward norms, applied
 * to the all-reduced output before the residual add) into m->post: from o, or, when the block's
 * last linear deferred (`deferred`), from its fp32 sums in acc, moved into the zeroed f32
 * post_sums first (the norm's residual operand), so a large output is never rounded to fp16. */
static enum rt_err block_out(struct rt_model *m, const float *out_norm, int M, bool deferred)
{
    const struct rt_config *c = &m->cfg;
    const size_t MH = (size_t)M * (size_t)c->hidden_size;
    if (!deferred)
        return OPS->norm(BCTX, c->arch->norm, m->post, NULL, m->o, NULL, out_norm, NULL, M,
                         c->hidden_size, c->rms_norm_eps);
    RT_TRY(OPS->zero(BCTX, m->post_sums, MH * sizeof(float)));
    return OPS->norm(BCTX, c->arch->norm, m->post, m->post_sums, NULL, m->acc, out_norm, NULL, M,
                     c->hidden_size, c->rms_norm_eps);
}

/* embed .. final norm of one chunk of M rows (runs in m->runs, token ids and positions already
 * in m->tok / m->pos): x then holds the normalised hidden states of every row. */
static enum rt_err body(struct rt_model *m, struct rt_kv *kv, int M, int n_runs)
{
    const struct rt_config *c = &m->cfg;
    const size_t MH = (size_t)M * (size_t)c->hidden_size;
    const enum rt_norm nk = c->arch->norm;
    const int H = c->hidden_size;
    const float eps = c->rms_norm_eps;
    const bool par = c->arch->parallel_residual;

    RT_TRY(OPS->embed(BCTX, m->h, m->embed, m->tok, M, (int64_t)m->rank * c->vocab_size_per_rank,
                      c->vocab_size_per_rank, H, c->embed_scale));
    RT_TRY(OPS->all_reduce(BCTX, m->h, MH, RT_BUF_F32));
    bool prev_acc = false;      /* whether the previous block's output is in acc */
    const void *prev = NULL;    /* else where it is (o, or post after an out norm) */
    for (int l = 0; l < c->n_layers; l++) {
        const struct rt_layer *ly = &m->layers[l];
        bool d;
        if (l == 0) /* h is the embedding: normalise it as it is */
            RT_TRY(OPS->norm(BCTX, nk, m->x, m->h, NULL, NULL, ly->attn_norm, ly->attn_norm_b, M, H,
                             eps));
        else /* h += previous MLP output, then normalise */
            RT_TRY(OPS->norm(BCTX, nk, m->x, m->h, prev_acc ? NULL : prev, prev_acc ? m->acc : NULL,
                          ly->attn_norm, ly->attn_norm_b, M, H, eps));
        RT_TRY(attn_block(m, kv, l, M, n_runs, &d));
        if (!d)
            RT_TRY(OPS->all_reduce(BCTX, m->o, MH, RT_BUF_ACT));
        if (ly->attn_out_norm) {
            RT_TRY(block_out(m, ly->attn_out_norm, M, d));
            d = false;
        }
        const void *ao = d ? NULL : ly->attn_out_norm ? m->post : m->o;
        /* parallel (Falcon): h += attention output, the MLP reads the same x as attention
         * (h + attn + mlp, transformers modeling_falcon.py FalconDecoderLayer), or with an MLP
         * norm of its own (Falcon-40B's ln_mlp) that norm of h before the add; else h += o and
         * the MLP reads its own norm of h */
        if (par && ly->mlp_norm)
            RT_TRY(OPS->norm(BCTX, nk, m->x, m->h, NULL, NULL, ly->mlp_norm, ly->mlp_norm_b, M, H,
                             eps));
        RT_TRY(OPS->norm(BCTX, nk, par ? NULL : m->x, m->h, ao, d ? m->acc : NULL,
                         par ? NULL : ly->mlp_norm, par ? NULL : ly->mlp_norm_b, M, H, eps));
        if (c->arch->moe) {
            RT_TRY(moe(m, l, M));
            d = false;
        } else {
            RT_TRY(dense_mlp(m, l, M, &d));
        }
        if (!d)
            RT_TRY(OPS->all_reduce(BCTX, m->o, MH, RT_BUF_ACT));
        if (ly->mlp_out_norm) {
            RT_TRY(block_out(m, ly->mlp_out_norm, M, d));
            d = false;
        }
        prev = d ? NULL : ly->mlp_out_norm ? m->post : m->o;
        prev_acc = d;
    }
    return OPS->norm(BCTX, nk, m->x, m->h, prev_acc ? NULL : prev, prev_acc ? m->acc : NULL,
                     m->final_norm, m->final_norm_b, M, H, eps);
}

// --- outputs --------------------------------------------------------------------------------------

/* lm_head of rows rows[0..n-1] of x (relative to the chunk; n <= logit_rows) into logits. */
static enum rt_err lm_head_rows(struct rt_model *m, const int32_t *rows, int n)
{
    const struct rt_config *c = &m->cfg;
    const int H = c->hidden_size;
    bool contiguous = true;
    for (int i = 1; i < n && contiguous; i++)
        contiguous = rows[i] == rows[0] + i;
    const void *src = rt_act_at(m, m->x, (size_t)rows[0] * H);
    if (!contiguous) {
        RT_TRY(OPS->gather_rows(BCTX, m->xe, m->x, rows, n, H));
        src = m->xe;
    }
    RT_TRY(OPS->lm_head(BCTX, src, m->lm_head, n, H, c->vocab_size_per_rank, m->logits));
    if (c->final_softcap > 0.0f) /* Gemma 2: cap * tanh(logits / cap), per rank's columns */
        RT_TRY(OPS->softcap(BCTX, m->logits, (size_t)n * (size_t)c->vocab_size_per_rank,
                            c->final_softcap));
    return RT_ERR_NONE;
}

/* The [n][V_r] lm_head rows of every rank on rank 0, in backend memory: [world][n][V_r]
 * (logits_all) at world > 1, else this rank's logits. NULL on the other ranks. */
static enum rt_err gather_logits(struct rt_model *m, int n, const float **out)
{
    const size_t bytes = (size_t)n * (size_t)m->cfg.vocab_size_per_rank * sizeof(float);
    *out = NULL;
    if (m->world == 1) {
        *out = m->logits;
        return RT_ERR_NONE;
    }
    RT_TRY(OPS->gather(BCTX, m->logits, bytes, m->logits_all));
    if (m->rank == 0)
        *out = m->logits_all;
    return RT_ERR_NONE;
}

/* Rank 0: the gathered [world][n][V_r] rows into out[n][vocab_size] (padding columns past
 * vocab_size dropped). */
static enum rt_err download_logits(struct rt_model *m, const float *all, int n, float *out)
{
    const struct rt_config *c = &m->cfg;
    const int64_t Vr = c->vocab_size_per_rank, V = c->vocab_size;
    RT_TRY(OPS->download(BCTX, m->h_logits, all, (size_t)m->world * n * Vr * sizeof(float)));
    for (int r = 0; r < m->world; r++) {
        const int64_t col0 = (int64_t)r * Vr, cols = V - col0 < Vr ? V - col0 : Vr;
        for (int i = 0; cols > 0 && i < n; i++)
            memcpy(out + (size_t)i * V + col0, m->h_logits + ((size_t)r * n + i) * Vr,
                   (size_t)cols * sizeof(float));
    }
    return RT_ERR_NONE;
}

/* Rank 0: the next tokens of n gathered rows (row i at rows + i * stride, vocab order). */
static enum rt_err pick_rows(struct rt_model *m, const float *rows, size_t stride, int n,
                             const struct rt_pick *picks, int32_t *ids)
{
    const struct rt_config *c = &m->cfg;
    const int limit = picks[0].p.vocab_limit; /* rt_sample.h step 0: ids [0, limit) only */
    const int nv = limit > 0 && limit < c->vocab_size ? limit : c->vocab_size;
    RT_TRY(OPS->sample(BCTX, rows, stride, n, nv, picks, ids));
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= nv) {
            qs_log_error(__func__, "no finite logit among the %d ids of output row %d: the model "
                         "computed NaN or -inf everywhere", nv, i);
            return RT_ERR_NUMERIC;
        }
    return RT_ERR_NONE;
}

/* Picks of k rows whose lm_head rows are in m->logits: at world size 1 straight from there;
 * else each row gathered on its own (row r of logits_all = [world][V_r], vocab order). */
static enum rt_err pick_out(struct rt_model *m, int k, const struct rt_pick *picks, int32_t *ids)
{
    const size_t Vr = (size_t)m->cfg.vocab_size_per_rank;
    if (m->world == 1)
        return m->rank == 0 ? pick_rows(m, m->logits, Vr, k, picks, ids) : RT_ERR_NONE;
    for (int r = 0; r < k; r++)
        RT_TRY(OPS->gather(BCTX, m->logits + (size_t)r * Vr, Vr * sizeof(float),
                           m->logits_all + (size_t)r * m->world * Vr));
    return m->rank == 0 ? pick_rows(m, m->logits_all, (size_t)m->world * Vr, k, picks, ids)
                        : RT_ERR_NONE;
}

/* The outputs of rows rows[0..n-1] of the chunk (their logits or picks, entries [0, n) of
 * logits / picks / ids); with `head_done` the lm_head of rows[0..n-1] already ran (a graph). */
static enum rt_err outputs(struct rt_model *m, const int32_t *rows, int n, enum rt_out out,
                           bool head_done, float *logits, const struct rt_pick *picks,
                           int32_t *ids)
{
    const int V = m->cfg.vocab_size, per = m->logit_rows;
    for (int i = 0; i < n; i += per) {
        const int k = n - i < per ? n - i : per;
        if (!head_done)
            RT_TRY(lm_head_rows(m, rows + i, k));
        if (out == RT_OUT_PICK) {
            RT_TRY(pick_out(m, k, picks ? picks + i : NULL, ids ? ids + i : NULL));
            continue;
        }
        const float *all;
        RT_TRY(gather_logits(m, k, &all));
        if (m->rank == 0)
            RT_TRY(download_logits(m, all, k, logits + (size_t)i * V));
    }
    return RT_ERR_NONE;
}

// --- decode-step graphs -------------------------------------------------------------------------

/* The graph bucket of a decode step of M rows: the smallest power of two >= M (its key is the
 * exponent), or -1 when the step cannot be a graph (too many rows for the buffers). */
static int graph_bucket(const struct rt_model *m, int M, int *rows)
{
    int key = 0, r = 1;
    while (r < M) {
        r *= 2;
        key++;
    }
    if (r > m->max_batch || r > m->logit_rows || key >= RT_MAX_GRAPHS)
        return -1;
    *rows = r;
    return key;
}

/* Record body + lm_head of a decode step of `rows` rows (runs of one row each) as the graph of
 * `key`. Nothing runs. false when the recording failed (logged at debug level). */
static bool record_graph(struct rt_model *m, struct rt_kv *kv, int key, int rows)
{
    enum rt_err e = OPS->graph_begin(BCTX, key);
    if (e) {
        qs_log_debug("decode graph: cannot begin a recording (%s)", rt_err_str(e));
        return false;
    }
    for (int i = 0; i < rows; i++) /* the recording's runs: one row each */
        m->runs[i] = (struct rt_attn_run){i, 1, 0, i};
    e = body(m, kv, rows, rows);
    if (!e)
        e = lm_head_rows(m, m->h_out, rows);
    const enum rt_err e2 = OPS->graph_end(BCTX, key, e == RT_ERR_NONE);
    if (e || e2 || !OPS->graph_ready(BCTX, key)) {
        qs_log_debug("decode graph of %d rows: recording failed (%s); this step runs op by op",
                     rows, rt_err_str(e ? e : e2 ? e2 : RT_ERR_DEVICE));
        return false;
    }
    m->graph_kv[key] = kv;
    return true;
}

/* One decode step through the graph of its bucket: replay the recording, or record it first.
 * *done = false when no graph could be made (the caller runs the step op by op; a failed
 * recording ran nothing). */
static enum rt_err step_graph(struct rt_model *m, struct rt_kv *kv, int key, int rows, bool *done)
{
    *done = false;
    const bool ready = OPS->graph_ready(BCTX, key) && m->graph_kv[key] == kv;
    if (!ready && !record_graph(m, kv, key, rows)) {
        m->graph_failures[key]++;
        return RT_ERR_NONE;
    }
    bool ran = false;
    RT_TRY(OPS->graph_replay(BCTX, key, &ran));
    if (!ran) { /* ready was checked just before: cannot happen */
        qs_log_error(__func__, "rank %d's decode graph went stale during the step", m->rank);
        return RT_ERR_DEVICE;
    }
    *done = true;
    return RT_ERR_NONE;
}

// --- forward --------------------------------------------------------------------------------------

/* Whether rows [c0, c0 + M) with out rows rows[0..n_rows-1] are a decode step: one token per
 * sequence, every row wanted. */
static bool is_decode_step(const struct rt_batch *b, int c0, int M, const int32_t *rows,
                           int n_rows)
{
    if (n_rows != M)
        return false;
    for (int i = 0; i < M; i++)
        if (rows[i] != i || (i > 0 && seq_of(b, c0 + i) == seq_of(b, c0 + i - 1)))
            return false;
    return true;
}

/* Rows [c0, c0 + M) of the batch; out rows rows[0..n_rows-1] relative to c0 (results at
 * logits / picks / ids of those entries). */
static enum rt_err chunk(struct rt_model *m, struct rt_kv *kv, const struct rt_batch *b, int c0,
                         int M, const int32_t *rows, int n_rows, enum rt_out out, float *logits,
                         const struct rt_pick *picks, int32_t *ids, struct walk *w)
{
    int key = -1, grows = M;
    if (m->graphs && out != RT_OUT_NONE && is_decode_step(b, c0, M, rows, n_rows)) {
        key = graph_bucket(m, M, &grows);
        if (key >= 0 && m->graph_failures[key] >= 2)
            key = -1;
        if (key < 0)
            grows = M;
    }
    const int n_runs = make_runs(m, b, c0, M, grows, w);
    m->max_keys = 1;
    for (int j = 0; j < n_runs; j++)
        if (m->runs[j].p0 + m->runs[j].n > m->max_keys)
            m->max_keys = m->runs[j].p0 + m->runs[j].n;
    RT_TRY(upload_chunk(m, grows, key >= 0 ? grows : n_runs));
    bool head_done = false;
    if (key >= 0) {
        for (int i = 0; i < grows; i++) /* the recording's lm_head rows (rows[i] == i below M) */
            m->h_out[i] = i;
        const int saved = m->max_keys;
        m->max_keys = kv->m->n_ctx;
        RT_TRY(step_graph(m, kv, key, grows, &head_done));
        m->max_keys = saved;
        if (!head_done) /* the recording changed m->runs */
            make_runs(m, b, c0, M, M, &(struct walk){w->ks, w->g - n_runs});
    }
    if (!head_done)
        RT_TRY(body(m, kv, M, n_runs));
    if (out == RT_OUT_NONE || n_rows == 0)
        return RT_ERR_NONE;
    return outputs(m, rows, n_rows, out, head_done, logits, picks, ids);
}

enum rt_err rt_model_forward(struct rt_model *m, struct rt_kv *kv, const struct rt_batch *b,
                             const struct rt_kv_step *ks, enum rt_out out, float *logits,
                             const struct rt_pick *picks, int32_t *ids)
{
    const int V = m->cfg.vocab_size;
    for (int i = 0; i < ks->n_copy; i++) /* copy-on-write before anything reads or writes */
        for (int l = 0; l < m->cfg.n_layers; l++)
            RT_TRY(OPS->kv_copy_block(BCTX, kv->k[l], kv->v[l], ks->copy[2 * i],
                                      ks->copy[2 * i + 1], kv->block_elems));
    struct walk w = {ks, -1};
    int j = 0; /* next out row */
    for (int c0 = 0; c0 < b->n_tokens;) {
        const int M = b->n_tokens - c0 < m->max_batch ? b->n_tokens - c0 : m->max_batch;
        int n_rows = 0;
        while (j + n_rows < b->n_out && b->out[j + n_rows] < c0 + M)
            n_rows++;
        for (int i = 0; i < n_rows; i++) /* relative to the chunk */
            m->h_out[i] = b->out[j + i] - c0;
        const bool r0 = m->rank == 0;
        RT_TRY(chunk(m, kv, b, c0, M, m->h_out, n_rows, out,
                     r0 && logits ? logits + (size_t)j * V : NULL, r0 && picks ? picks + j : NULL,
                     r0 && ids ? ids + j : NULL, &w));
        j += n_rows;
        c0 += M;
    }
    return RT_ERR_NONE;
}
