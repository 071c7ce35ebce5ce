/*
 * rt_forward.c - the forward pass of one rank (rt.h rt_model_forward, rt_model_check_batch):
 * a batch of tokens of one or more sequences, run in chunks of at most max_batch rows.
 *
 * Per chunk: the token ids and positions go to backend memory once; embed (vocab-parallel rows,
 * summed over the ranks); per layer the architecture's block (struct rt_arch): norm -> qkv ->
 * RoPE + KV-cache store and attention per run of one sequence's rows -> o_proj -> all-reduce ->
 * norm -> MLP (dense, or the MoE routed on the host) -> all-reduce; the final norm; then the
 * lm_head on the rows whose logits are wanted, gathered on rank 0 (vocab-parallel columns).
 *
 * Deferred split-K is an explicit epilogue chosen here: a linear whose consumer is local and
 * that the backend can defer (rt_linear.acc_ok, M <= defer_m) adds its sums into the model's
 * accumulator `acc`, and the next op is told to read them (rope_kv_store's x_acc after qkv,
 * act_mul's gate_up_acc after gate_up, norm's x_acc after o and down at world size 1). Each
 * pair computes what the plain ops compute, without the fp16 rounding of the linear's output.
 *
 * A decode step (one row wanted of one token) may run as the backend's recorded graph: the
 * recording holds the body and the lm_head of that row and reads the token and position from
 * the buffers uploaded before each step.
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

/* The runs of rows [c0, c0 + M) of b (rows relative to c0) into m->runs; returns how many. */
static int make_runs(struct rt_model *m, const struct rt_batch *b, int c0, int M)
{
    int n = 0;
    for (int i = 0; i < M; i++) {
        const int s = seq_of(b, c0 + i);
        if (n == 0 || m->runs[n - 1].seq != s)
            m->runs[n++] = (struct rt_run){i, 0, s, b->pos[c0 + i]};
        m->runs[n - 1].n++;
    }
    return n;
}

enum rt_err rt_model_check_batch(const struct rt_model *m, const struct rt_kv *kv,
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
        if (s < 0 || s >= kv->n_seqs) {
            qs_log_error(__func__, "token %d: sequence slot %d outside [0, %d)", i, s, kv->n_seqs);
            return RT_ERR_ARG;
        }
        for (int j = 0; j < i; j++)
            if (seq_of(b, j) == s) {
                qs_log_error(__func__, "token %d: sequence slot %d appears twice in the batch "
                             "(its tokens must be consecutive)", i, s);
                return RT_ERR_ARG;
            }
        if (p0 < 0 || p0 > kv->len[s]) {
            qs_log_error(__func__, "start_pos %d: only positions [0, %d) are in the KV cache%s",
                         p0, kv->len[s], kv->n_seqs > 1 ? " of that sequence" : "");
            return RT_ERR_ARG;
        }
        int j = i + 1;
        for (; j < b->n_tokens && seq_of(b, j) == s; j++)
            if (b->pos[j] != b->pos[j - 1] + 1) {
                qs_log_error(__func__, "token %d: position %d after %d (the positions of a "
                             "sequence must follow each other)", j, b->pos[j], b->pos[j - 1]);
                return RT_ERR_ARG;
            }
        if ((int64_t)p0 + (j - i) > kv->n_ctx) {
            qs_log_error(__func__, "context overflow: positions %d..%lld do not fit the KV cache "
                         "of %d tokens (n_ctx; the model allows up to %d)", p0,
                         (long long)p0 + (j - i) - 1, kv->n_ctx, c->max_position_embeddings);
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

// --- ops of one chunk ----------------------------------------------------------------------------

/* Whether linear L may leave its sums in acc at M rows. */
static bool use_acc(const struct rt_model *m, const struct rt_linear *L, int M)
{
    return L->acc_ok && M <= m->defer_m && m->acc;
}

static enum rt_err linear(struct rt_model *m, const struct rt_linear *L, const void *x, int M,
                          void *y, float *acc)
{
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
    for (int j = 0; j < n_runs; j++) {
        const struct rt_run *r = &m->runs[j];
        RT_TRY(OPS->rope_kv_store(BCTX, rt_act_at(m, m->qkv, (size_t)r->row0 * stride),
                               qacc ? qacc + (size_t)r->row0 * stride : NULL, r->n, nq, nkv, hd,
                               stride, m->pos + r->row0, m->inv_freq, rt_kv_slot(kv, l, r->seq, false),
                               rt_kv_slot(kv, l, r->seq, true), kv->n_ctx));
    }
    for (int j = 0; j < n_runs; j++) {
        const struct rt_run *r = &m->runs[j];
        RT_TRY(OPS->attention(BCTX, rt_act_at(m, m->att, (size_t)r->row0 * nq * hd),
                           (size_t)nq * hd, rt_act_at(m, m->qkv, (size_t)r->row0 * stride),
                           stride, rt_kv_slot(kv, l, r->seq, false),
                           rt_kv_slot(kv, l, r->seq, true), r->n, r->p0, m->pos + r->row0, nq,
                           nkv, hd, kv->n_ctx, c->sliding_window));
    }
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
    RT_TRY(OPS->act_mul(BCTX, m->cfg.arch->act, m->act, m->gu, gacc, M,
                     m->cfg.intermediate_per_rank));
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
    ref_moe_route(m->h_router, M, E, k, m->h_ids, m->h_w);
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
        RT_TRY(OPS->act_mul(BCTX, c->arch->act, m->act, m->gu, NULL, n, c->intermediate_per_rank));
        RT_TRY(linear(m, &ly->expert_down[e], m->act, n, m->ye, NULL));
        RT_TRY(OPS->scatter_add_rows(BCTX, m->o, m->ye, m->h_rows, m->h_roww, n, H));
    }
    return RT_ERR_NONE;
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

    RT_TRY(OPS->embed(BCTX, m->h, m->embed, m->tok, M, (int64_t)m->rank * c->vocab_size_per_rank,
                   c->vocab_size_per_rank, H));
    RT_TRY(OPS->all_reduce(BCTX, m->h, MH, RT_BUF_F32));
    bool prev_acc = false; /* whether the previous block's output is in acc (else in o) */
    for (int l = 0; l < c->n_layers; l++) {
        const struct rt_layer *ly = &m->layers[l];
        bool d;
        if (l == 0) /* h is the embedding: normalise it as it is */
            RT_TRY(OPS->norm(BCTX, nk, m->x, m->h, NULL, NULL, ly->attn_norm, M, H, eps));
        else /* h += previous MLP output, then normalise */
            RT_TRY(OPS->norm(BCTX, nk, m->x, m->h, prev_acc ? NULL : m->o, prev_acc ? m->acc : NULL,
                          ly->attn_norm, M, H, eps));
        RT_TRY(attn_block(m, kv, l, M, n_runs, &d));
        if (!d)
            RT_TRY(OPS->all_reduce(BCTX, m->o, MH, RT_BUF_ACT));
        RT_TRY(OPS->norm(BCTX, nk, m->x, m->h, d ? NULL : m->o, d ? m->acc : NULL, ly->mlp_norm, M,
                      H, eps));
        if (c->arch->moe) {
            RT_TRY(moe(m, l, M));
            d = false;
        } else {
            RT_TRY(dense_mlp(m, l, M, &d));
        }
        if (!d)
            RT_TRY(OPS->all_reduce(BCTX, m->o, MH, RT_BUF_ACT));
        prev_acc = d;
    }
    return OPS->norm(BCTX, nk, m->x, m->h, prev_acc ? NULL : m->o, prev_acc ? m->acc : NULL,
                     m->final_norm, M, H, eps);
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
    return OPS->lm_head(BCTX, src, m->lm_head, n, H, c->vocab_size_per_rank, m->logits);
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

/* Rank 0: the next token of one gathered row [world * V_r] (contiguous: vocab order). */
static enum rt_err pick_row(struct rt_model *m, const float *row, const struct rt_pick *pick,
                            int32_t *id)
{
    const struct rt_config *c = &m->cfg;
    const int limit = pick->p.vocab_limit; /* rt_sample.h step 0: ids [0, limit) only */
    const int nv = limit > 0 && limit < c->vocab_size ? limit : c->vocab_size;
    RT_TRY(OPS->sample(BCTX, row, nv, pick, id));
    if (*id < 0 || *id >= nv) {
        qs_log_error(__func__, "no finite logit among the %d ids: the model computed NaN or "
                     "-inf everywhere", nv);
        return RT_ERR_NUMERIC;
    }
    return RT_ERR_NONE;
}

/* The outputs of rows rows[0..n-1] of the chunk (their logits or picks, entries [0, n) of
 * logits / picks / ids); with `head_done` row rows[0]'s lm_head already ran (a graph). */
static enum rt_err outputs(struct rt_model *m, const int32_t *rows, int n, enum rt_out out,
                           bool head_done, float *logits, const struct rt_pick *picks,
                           int32_t *ids)
{
    const int V = m->cfg.vocab_size;
    const int per = out == RT_OUT_PICK ? 1 : m->logit_rows; /* a pick reads one whole row */
    for (int i = 0; i < n; i += per) {
        const int k = n - i < per ? n - i : per;
        if (!(head_done && i == 0))
            RT_TRY(lm_head_rows(m, rows + i, k));
        const float *all;
        RT_TRY(gather_logits(m, k, &all));
        if (m->rank != 0)
            continue;
        if (out == RT_OUT_PICK)
            RT_TRY(pick_row(m, all, &picks[i], &ids[i]));
        else
            RT_TRY(download_logits(m, all, k, logits + (size_t)i * V));
    }
    return RT_ERR_NONE;
}

// --- decode-step graph --------------------------------------------------------------------------

/* Record body + lm_head of a decode step (one row, run runs[0]) as the backend's graph.
 * Nothing runs. false when the recording failed (logged at debug level). */
static bool record_graph(struct rt_model *m, struct rt_kv *kv)
{
    enum rt_err e = OPS->graph_begin(BCTX);
    if (e) {
        qs_log_debug("decode graph: cannot begin a recording (%s)", rt_err_str(e));
        return false;
    }
    const int32_t row0 = 0;
    e = body(m, kv, 1, 1);
    if (!e)
        e = lm_head_rows(m, &row0, 1);
    const enum rt_err e2 = OPS->graph_end(BCTX, e == RT_ERR_NONE);
    if (e || e2 || !OPS->graph_ready(BCTX)) {
        qs_log_debug("decode graph: recording failed (%s); this step runs op by op",
                     rt_err_str(e ? e : e2 ? e2 : RT_ERR_DEVICE));
        return false;
    }
    m->graph_kv = kv;
    m->graph_seq = m->runs[0].seq;
    return true;
}

/* One decode step through the graph: replay the recording, or record it first. *done = false
 * when no graph could be made (the caller runs the step op by op; a failed recording ran
 * nothing). */
static enum rt_err step_graph(struct rt_model *m, struct rt_kv *kv, bool *done)
{
    *done = false;
    const bool ready = OPS->graph_ready(BCTX) && m->graph_kv == kv &&
                       m->graph_seq == m->runs[0].seq;
    if (!ready && !record_graph(m, kv)) {
        m->graph_failures++;
        return RT_ERR_NONE;
    }
    bool ran = false;
    RT_TRY(OPS->graph_replay(BCTX, &ran));
    if (!ran) { /* ready was checked just before: cannot happen */
        qs_log_error(__func__, "rank %d's decode graph went stale during the step", m->rank);
        return RT_ERR_DEVICE;
    }
    *done = true;
    return RT_ERR_NONE;
}

// --- forward --------------------------------------------------------------------------------------

/* Rows [c0, c0 + M) of the batch; out rows rows[0..n_rows-1] relative to c0 (results at
 * logits / picks / ids of those entries). */
static enum rt_err chunk(struct rt_model *m, struct rt_kv *kv, const struct rt_batch *b, int c0,
                         int M, const int32_t *rows, int n_rows, enum rt_out out, float *logits,
                         const struct rt_pick *picks, int32_t *ids)
{
    const int n_runs = make_runs(m, b, c0, M);
    RT_TRY(OPS->upload(BCTX, m->tok, b->tokens + c0, (size_t)M * sizeof(int32_t)));
    RT_TRY(OPS->upload(BCTX, m->pos, b->pos + c0, (size_t)M * sizeof(int32_t)));
    bool head_done = false;
    if (M == 1 && n_rows == 1 && out != RT_OUT_NONE && m->graphs && m->graph_failures < 2)
        RT_TRY(step_graph(m, kv, &head_done));
    if (!head_done)
        RT_TRY(body(m, kv, M, n_runs));
    for (int j = 0; j < n_runs; j++)
        kv->len[m->runs[j].seq] = m->runs[j].p0 + m->runs[j].n;
    if (out == RT_OUT_NONE || n_rows == 0)
        return RT_ERR_NONE;
    return outputs(m, rows, n_rows, out, head_done, logits, picks, ids);
}

enum rt_err rt_model_forward(struct rt_model *m, struct rt_kv *kv, const struct rt_batch *b,
                             enum rt_out out, float *logits, const struct rt_pick *picks,
                             int32_t *ids)
{
    const int V = m->cfg.vocab_size;
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
                  r0 && ids ? ids + j : NULL));
        j += n_rows;
        c0 += M;
    }
    return RT_ERR_NONE;
}
