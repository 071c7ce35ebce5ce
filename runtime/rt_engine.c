/*
 * rt_engine.c - the batching engine of runtime/rt_engine.h: the request queue, the scheduler
 * (running sequences first, then FCFS admission; chunked prefill within a token budget;
 * preemption by recompute of the most recently admitted sequence), one rt_exec_forward(_pick)
 * per step, and each sequence's generation state (runtime/rt_gen_int.h).
 */
#include "rt_engine.h"

#include <stdlib.h>
#include <string.h>

#include "qs_log.h"
#include "qs_util.h" /* qs_now_s */
#include "rt_backend.h" /* RT_TRY */
#include "rt_gen_int.h"


enum seq_state { SEQ_FREE = 0, SEQ_WAITING, SEQ_RUNNING };

struct seq {
    enum seq_state state;
    int64_t id;
    struct rt_engine_req req;     /* ids points into toks */
    int32_t *toks;                /* owned: prompt, then every generated id (recompute) */
    size_t n_prompt, n_toks, cap;
    struct rt_gen g;
    struct rt_gen_result res;
    bool gen_open;                /* g set up (rt_gen_end due) */
    int slot;                     /* KV slot while running, -1 */
    int n_computed;               /* positions of toks in the cache */
    int32_t next;                 /* the chosen id not yet fed (decode), -1 */
    bool cancel;
    long admit_order;             /* when it was (last) admitted: the preemption victim is the latest */
    double t_add, t_admit, t_first;
    int n_cached, n_preempted;
    int chunk;                    /* this step: tokens it runs, 0 when not in the batch */
    int out_row;                  /* this step: its out row, -1 */
    bool fed;                     /* this step: its rows are in the batch */
};

struct rt_engine {
    struct rt_session *s;
    struct rt_exec *x;
    int n_slots, budget, n_vocab;
    bool *slot_used;              /* [n_slots] */
    struct seq *seqs;             /* [cap] */
    int n_seqs_cap;
    int64_t next_id;
    long admit_clock;
    int *queue;                   /* waiting seq indices, FCFS (head first) */
    int n_queue, queue_cap;
    /* step buffers */
    int32_t *b_tok, *b_pos, *b_seq, *b_out;
    int *b_who;                   /* [n_out] seq index of each out row */
    struct rt_pick *picks;
    int32_t *ids;
    float *logits;                /* [n_slots][n_vocab] host rows when sampling on the host */
    struct rt_engine_stats st;
};

static void *xgrow(void *p, size_t n, size_t size, size_t *cap)
{
    if (n <= *cap)
        return p;
    size_t c = *cap ? *cap : 16;
    while (c < n)
        c *= 2;
    void *q = realloc(p, c * size);
    if (!q) {
        qs_log_error("rt_engine", "out of host memory for %zu entries", n);
        return NULL;
    }
    *cap = c;
    return q;
}

enum rt_err rt_engine_create(struct rt_session *s, const struct rt_engine_opts *o,
                             struct rt_engine **out)
{
    return rt_engine_create_limited(s, o, 0, out);
}

enum rt_err rt_engine_create_limited(struct rt_session *s, const struct rt_engine_opts *o,
                                     int max_seqs, struct rt_engine **out)
{
    *out = NULL;
    struct rt_exec *x = rt_session_model(s);
    if (!x) {
        qs_log_error(__func__, "the session has no model (tokenizer only)");
        return RT_ERR_ARG;
    }
    struct rt_engine *e = calloc(1, sizeof(*e));
    if (!e)
        goto nomem;
    e->s = s;
    e->x = x;
    e->n_slots = rt_exec_n_seqs(x);
    if (max_seqs > 0 && max_seqs < e->n_slots)
        e->n_slots = max_seqs;
    e->n_vocab = rt_session_n_vocab(s);
    e->budget = o && o->max_batch_tokens > 0 ? o->max_batch_tokens : rt_exec_max_batch(x);
    if (e->budget < e->n_slots)
        e->budget = e->n_slots; /* every running sequence gets its decode token */
    const size_t B = (size_t)e->budget + (size_t)e->n_slots;
    e->slot_used = calloc((size_t)e->n_slots, sizeof(bool));
    e->b_tok = malloc(B * sizeof(int32_t));
    e->b_pos = malloc(B * sizeof(int32_t));
    e->b_seq = malloc(B * sizeof(int32_t));
    e->b_out = malloc((size_t)e->n_slots * sizeof(int32_t));
    e->b_who = malloc((size_t)e->n_slots * sizeof(int));
    e->picks = calloc((size_t)e->n_slots, sizeof(*e->picks));
    e->ids = malloc((size_t)e->n_slots * sizeof(int32_t));
    e->logits = malloc((size_t)e->n_slots * (size_t)e->n_vocab * sizeof(float));
    if (!e->slot_used || !e->b_tok || !e->b_pos || !e->b_seq || !e->b_out || !e->b_who ||
        !e->picks || !e->ids || !e->logits)
        goto nomem;
    e->st.max_batch_tokens = e->budget;
    e->st.blocks_total = rt_exec_blocks_total(x);
    qs_log_info("engine: up to %d sequences at once, %d tokens per step, %d KV blocks of %d "
                "tokens", e->n_slots, e->budget, e->st.blocks_total, rt_exec_block_size(x));
    *out = e;
    return RT_ERR_NONE;
nomem:
    qs_log_error(__func__, "out of host memory");
    rt_engine_free(e);
    return RT_ERR_NOMEM;
}

static void seq_release(struct rt_engine *e, struct seq *q)
{
    if (q->gen_open)
        rt_gen_end(&q->g, RT_ERR_CANCELLED);
    q->gen_open = false;
    rt_gen_result_free(&q->res);
    if (q->slot >= 0) {
        rt_exec_seq_clear(e->x, q->slot);
        e->slot_used[q->slot] = false;
    }
    free(q->toks);
    memset(q, 0, sizeof(*q));
    q->slot = -1;
}

void rt_engine_free(struct rt_engine *e)
{
    if (!e)
        return;
    for (int i = 0; i < e->n_seqs_cap; i++)
        if (e->seqs[i].state != SEQ_FREE)
            seq_release(e, &e->seqs[i]);
    free(e->seqs);
    free(e->queue);
    free(e->slot_used);
    free(e->b_tok);
    free(e->b_pos);
    free(e->b_seq);
    free(e->b_out);
    free(e->b_who);
    free(e->picks);
    free(e->ids);
    free(e->logits);
    free(e);
}

// --- requests ---------------------------------------------------------------------------------

static struct seq *new_seq(struct rt_engine *e, int *index)
{
    for (int i = 0; i < e->n_seqs_cap; i++)
        if (e->seqs[i].state == SEQ_FREE) {
            *index = i;
            return &e->seqs[i];
        }
    const int old = e->n_seqs_cap, want = old ? 2 * old : 64;
    struct seq *p = realloc(e->seqs, (size_t)want * sizeof(*p));
    if (!p) {
        qs_log_error("rt_engine", "out of host memory for %d requests", want);
        return NULL;
    }
    memset(p + old, 0, (size_t)(want - old) * sizeof(*p));
    for (int i = old; i < want; i++)
        p[i].slot = -1;
    for (int i = 0; i < old; i++) /* the generation state points into its own entry */
        if (p[i].state != SEQ_FREE) {
            p[i].g.res = &p[i].res;
            p[i].g.p = &p[i].req.gen;
            p[i].g.cb = &p[i].req.cb;
        }
    e->seqs = p;
    e->n_seqs_cap = want;
    *index = old;
    return &e->seqs[old];
}

static enum rt_err queue_put(struct rt_engine *e, int idx, bool front)
{
    size_t cap = (size_t)e->queue_cap;
    int *q = xgrow(e->queue, (size_t)e->n_queue + 1, sizeof(int), &cap);
    if (!q)
        return RT_ERR_NOMEM;
    e->queue = q;
    e->queue_cap = (int)cap;
    if (front) {
        memmove(q + 1, q, (size_t)e->n_queue * sizeof(int));
        q[0] = idx;
    } else {
        q[e->n_queue] = idx;
    }
    e->n_queue++;
    return RT_ERR_NONE;
}

enum rt_err rt_engine_add(struct rt_engine *e, const struct rt_engine_req *r, int64_t *id)
{
    *id = -1;
    const int n_ctx = rt_exec_n_ctx(e->x);
    if (!r->ids || r->n_ids < 1) {
        qs_log_error(__func__, "empty prompt");
        return RT_ERR_ARG;
    }
    if ((int64_t)r->n_ids >= n_ctx) {
        qs_log_error(__func__, "the prompt has %zu tokens, the context holds %d (one position "
                     "must stay free to generate)", r->n_ids, n_ctx);
        return RT_ERR_CONTEXT;
    }
    for (size_t i = 0; i < r->n_ids; i++)
        if (r->ids[i] < 0 || r->ids[i] >= e->n_vocab) {
            qs_log_error(__func__, "token %d at position %zu is outside the vocabulary [0, %d)",
                         r->ids[i], i, e->n_vocab);
            return RT_ERR_TOKEN;
        }
    int idx;
    struct seq *q = new_seq(e, &idx);
    if (!q)
        return RT_ERR_NOMEM;
    q->cap = r->n_ids + 16;
    q->toks = malloc(q->cap * sizeof(int32_t));
    if (!q->toks) {
        qs_log_error(__func__, "out of host memory");
        return RT_ERR_NOMEM;
    }
    memcpy(q->toks, r->ids, r->n_ids * sizeof(int32_t));
    q->n_prompt = q->n_toks = r->n_ids;
    q->req = *r;
    q->req.ids = q->toks;
    q->req.cb.cancel = NULL;
    q->slot = -1;
    q->next = -1;
    q->out_row = -1;
    enum rt_err err = rt_gen_begin(&q->g, e->s, q->toks, q->n_prompt, &q->req.gen, &q->req.cb,
                                   &q->res, true);
    q->gen_open = true;
    if (err) {
        rt_gen_end(&q->g, err);
        q->gen_open = false;
        rt_gen_result_free(&q->res);
        free(q->toks);
        memset(q, 0, sizeof(*q));
        q->slot = -1;
        return err;
    }
    err = queue_put(e, idx, false);
    if (err) {
        seq_release(e, q);
        return err;
    }
    q->state = SEQ_WAITING;
    q->id = e->next_id++;
    q->t_add = qs_now_s();
    *id = q->id;
    e->st.waiting++;
    return RT_ERR_NONE;
}

bool rt_engine_cancel(struct rt_engine *e, int64_t id)
{
    for (int i = 0; i < e->n_seqs_cap; i++)
        if (e->seqs[i].state != SEQ_FREE && e->seqs[i].id == id) {
            e->seqs[i].cancel = true;
            return true;
        }
    return false;
}

// --- the end of a request ----------------------------------------------------------------------

static void queue_remove(struct rt_engine *e, int idx)
{
    for (int i = 0; i < e->n_queue; i++)
        if (e->queue[i] == idx) {
            memmove(e->queue + i, e->queue + i + 1, (size_t)(e->n_queue - i - 1) * sizeof(int));
            e->n_queue--;
            return;
        }
}

static void finish(struct rt_engine *e, int idx, enum rt_err err)
{
    struct seq *q = &e->seqs[idx];
    if (q->state == SEQ_WAITING) {
        queue_remove(e, idx);
        e->st.waiting--;
    } else {
        e->st.running--;
    }
    err = rt_gen_end(&q->g, err);
    q->gen_open = false;
    const double now = qs_now_s();
    const struct rt_engine_done d = {
        .id = q->id, .err = err, .res = &q->res,
        .t_queue_s = q->t_admit > 0 ? q->t_admit - q->t_add : now - q->t_add,
        .ttft_s = q->t_first > 0 ? q->t_first - q->t_add : 0.0,
        .t_total_s = now - q->t_add,
        .n_cached = q->n_cached, .n_preempted = q->n_preempted,
    };
    e->st.finished++;
    if (q->req.on_finish)
        q->req.on_finish(q->req.user, &d);
    seq_release(e, q);
}

// --- scheduling -------------------------------------------------------------------------------

/* The chosen id q->next appended to the sequence's tokens. */
static enum rt_err take_next(struct seq *q)
{
    size_t cap = q->cap;
    int32_t *t = xgrow(q->toks, q->n_toks + 1, sizeof(int32_t), &cap);
    if (!t)
        return RT_ERR_NOMEM;
    q->toks = t;
    q->cap = cap;
    q->req.ids = t;
    q->toks[q->n_toks++] = q->next;
    q->next = -1;
    return RT_ERR_NONE;
}

/* Free the blocks of running sequence idx and put it back at the head of the queue: it is
 * recomputed from its tokens (prompt and generated) when admitted again. */
static enum rt_err preempt(struct rt_engine *e, int idx)
{
    struct seq *q = &e->seqs[idx];
    if (q->next >= 0) /* the chosen id joins the tokens to recompute */
        RT_TRY(take_next(q));
    rt_exec_seq_clear(e->x, q->slot);
    e->slot_used[q->slot] = false;
    q->slot = -1;
    q->n_computed = 0;
    q->state = SEQ_WAITING;
    q->n_preempted++;
    e->st.preemptions++;
    e->st.running--;
    e->st.waiting++;
    qs_log_debug("engine: request %lld preempted (%zu tokens to recompute)", (long long)q->id,
                 q->n_toks);
    return queue_put(e, idx, true);
}

/* The running sequence admitted last, other than `not`, or -1. */
static int latest_running(const struct rt_engine *e, int not)
{
    int best = -1;
    for (int i = 0; i < e->n_seqs_cap; i++)
        if (i != not && e->seqs[i].state == SEQ_RUNNING && e->seqs[i].chunk == 0 &&
            (best < 0 || e->seqs[i].admit_order > e->seqs[best].admit_order))
            best = i;
    return best;
}

/* Tokens this sequence still has to feed before its next pick: the rest of its prompt (and of
 * its generated tokens after a preemption), or the one chosen id. */
static int pending_tokens(const struct seq *q)
{
    if ((size_t)q->n_computed < q->n_toks)
        return (int)(q->n_toks - (size_t)q->n_computed);
    return q->next >= 0 ? 1 : 0;
}

/* The ids a sequence feeds this step: from toks, or its chosen id (appended to toks). */
static enum rt_err feed(struct rt_engine *e, struct seq *q, int n, int *at)
{
    if ((size_t)q->n_computed == q->n_toks) /* a decode step: the chosen id goes in */
        RT_TRY(take_next(q));
    for (int i = 0; i < n; i++) {
        e->b_tok[*at + i] = q->toks[q->n_computed + i];
        e->b_pos[*at + i] = q->n_computed + i;
        e->b_seq[*at + i] = q->slot;
    }
    *at += n;
    return RT_ERR_NONE;
}

static int free_slot(const struct rt_engine *e)
{
    for (int i = 0; i < e->n_slots; i++)
        if (!e->slot_used[i])
            return i;
    return -1;
}

/* Build this step's batch: *n_tok rows, *n_out out rows (b_who). */
static enum rt_err schedule(struct rt_engine *e, int *n_tok, int *n_out)
{
    int at = 0, budget = e->budget, reserved = 0;
    *n_out = 0;
    for (int i = 0; i < e->n_seqs_cap; i++) {
        e->seqs[i].chunk = 0;
        e->seqs[i].out_row = -1;
        e->seqs[i].fed = false;
    }
    /* 1. running sequences, in admission order */
    for (;;) {
        int idx = -1;
        for (int i = 0; i < e->n_seqs_cap; i++) {
            const struct seq *q = &e->seqs[i];
            if (q->state == SEQ_RUNNING && q->chunk == 0 && pending_tokens(q) > 0 &&
                (idx < 0 || q->admit_order < e->seqs[idx].admit_order))
                idx = i;
        }
        if (idx < 0 || budget == 0)
            break;
        struct seq *q = &e->seqs[idx];
        int n = pending_tokens(q);
        n = n < budget ? n : budget;
        int need = rt_exec_blocks_needed(e->x, q->slot, q->n_computed, n);
        while (need > rt_exec_blocks_available(e->x) - reserved) {
            const int victim = latest_running(e, -1);
            if (victim < 0)
                break;
            RT_TRY(preempt(e, victim));
            if (victim == idx)
                break;
            need = rt_exec_blocks_needed(e->x, q->slot, q->n_computed, n);
        }
        if (q->state != SEQ_RUNNING)
            continue; /* it was the victim */
        if (need > rt_exec_blocks_available(e->x) - reserved) {
            q->chunk = -1; /* cannot run this step (nothing left to preempt) */
            continue;
        }
        reserved += need;
        q->chunk = n;
        budget -= n;
    }
    /* 2. admissions, first come first served */
    while (e->n_queue > 0 && budget > 0) {
        const int idx = e->queue[0];
        struct seq *q = &e->seqs[idx];
        const int slot = free_slot(e);
        if (slot < 0)
            break;
        const int hit = rt_exec_seq_match_prefix(e->x, slot, q->toks, (int)q->n_toks);
        int n = (int)q->n_toks - hit;
        n = n < budget ? n : budget;
        const int need = rt_exec_blocks_needed(e->x, slot, hit, n);
        if (need > rt_exec_blocks_available(e->x) - reserved) {
            rt_exec_seq_clear(e->x, slot); /* the matched blocks go back to the cache */
            break;
        }
        reserved += need;
        memmove(e->queue, e->queue + 1, (size_t)(e->n_queue - 1) * sizeof(int));
        e->n_queue--;
        e->slot_used[slot] = true;
        q->slot = slot;
        q->n_computed = hit;
        if (q->n_preempted == 0)
            q->n_cached = hit;
        e->st.cached_tokens += hit;
        q->state = SEQ_RUNNING;
        q->admit_order = e->admit_clock++;
        if (q->t_admit == 0)
            q->t_admit = qs_now_s();
        e->st.waiting--;
        e->st.running++;
        q->chunk = n;
        budget -= n;
    }
    /* the batch: decode rows first (one per sequence), then the prompt chunks */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < e->n_seqs_cap; i++) {
            struct seq *q = &e->seqs[i];
            if (q->state != SEQ_RUNNING || q->chunk <= 0 || q->fed)
                continue;
            const bool decode = (size_t)q->n_computed == q->n_toks;
            if (decode != (pass == 0))
                continue;
            q->fed = true;
            RT_TRY(feed(e, q, q->chunk, &at));
            if ((size_t)(q->n_computed + q->chunk) == q->n_toks) { /* its next token comes out */
                q->out_row = *n_out;
                e->b_out[*n_out] = at - 1;
                e->b_who[(*n_out)++] = i;
            }
        }
    *n_tok = at;
    return RT_ERR_NONE;
}

// --- a step -----------------------------------------------------------------------------------

static void mark_first(struct seq *q)
{
    if (q->t_first == 0)
        q->t_first = qs_now_s();
}

enum rt_err rt_engine_step(struct rt_engine *e, int *n_running, int *n_waiting)
{
    /* cancellations and requests that asked for no token first */
    for (int i = 0; i < e->n_seqs_cap; i++) {
        struct seq *q = &e->seqs[i];
        if (q->state == SEQ_FREE)
            continue;
        if (q->cancel) {
            q->res.finish = RT_GEN_FINISH_CANCELLED;
            finish(e, i, RT_ERR_CANCELLED);
        }
    }
    int n_tok = 0, n_out = 0;
    enum rt_err err = schedule(e, &n_tok, &n_out);
    if (!err && n_tok > 0) {
        const struct rt_batch b = {n_tok, e->b_tok, e->b_pos, e->b_seq, n_out, e->b_out};
        bool dev = rt_session_can_pick(e->s) && n_out > 0;
        for (int j = 0; j < n_out && dev; j++)
            dev = e->seqs[e->b_who[j]].res.on_device;
        if (dev) {
            for (int j = 0; j < n_out; j++) {
                struct rt_sampler *smp = &e->seqs[e->b_who[j]].g.smp;
                e->picks[j] = (struct rt_pick){smp->p,
                                               smp->p.temperature > 0.0f ? rt_sampler_uniform(smp)
                                                                         : 0.0,
                                               smp->seen};
            }
            err = rt_exec_forward_pick(e->x, &b, e->picks, e->ids);
        } else {
            err = rt_exec_forward(e->x, &b, n_out ? e->logits : NULL);
            for (int j = 0; j < n_out && !err; j++) {
                struct seq *q = &e->seqs[e->b_who[j]];
                const float *row = e->logits + (size_t)j * e->n_vocab;
                if (q->g.logits)
                    memcpy(q->g.logits, row, (size_t)e->n_vocab * sizeof(float));
                if (rt_sampler_next(&q->g.smp, row, e->n_vocab, &e->ids[j]) != RT_SAMPLE_ERR_NONE)
                    e->ids[j] = -1; /* no finite logit: this sequence fails alone */
            }
        }
        e->st.steps++;
        if (err == RT_ERR_NUMERIC) { /* some row had no finite logit: its sequences fail */
            for (int j = 0; j < n_out; j++)
                e->ids[j] = e->ids[j] >= 0 && e->ids[j] < e->n_vocab ? e->ids[j] : -1;
            err = RT_ERR_NONE;
        }
    }
    if (err) { /* the model failed: every pending request ends with the error */
        for (int i = 0; i < e->n_seqs_cap; i++)
            if (e->seqs[i].state != SEQ_FREE)
                finish(e, i, err);
        return err;
    }
    for (int i = 0; i < e->n_seqs_cap; i++) {
        struct seq *q = &e->seqs[i];
        if (q->state != SEQ_RUNNING || q->chunk <= 0)
            continue;
        const bool prompt = (size_t)q->n_computed < q->n_prompt;
        q->n_computed += q->chunk;
        if (prompt)
            e->st.prompt_tokens += q->chunk;
        if (q->out_row < 0)
            continue;
        const int32_t id = e->ids[q->out_row];
        if (q->g.max == 0) { /* prefill only */
            q->res.finish = RT_GEN_FINISH_LENGTH;
            finish(e, i, RT_ERR_NONE);
            continue;
        }
        if (id < 0) {
            qs_log_error("rt_engine", "request %lld: no finite logit (the model computed NaN or "
                         "-inf everywhere)", (long long)q->id);
            finish(e, i, RT_ERR_NUMERIC);
            continue;
        }
        mark_first(q);
        if (!prompt)
            q->res.n_decode++;
        e->st.generation_tokens++;
        bool done = false;
        enum rt_err ge = rt_gen_take(&q->g, id, q->n_computed, &done);
        if (ge || done) {
            finish(e, i, ge);
            continue;
        }
        q->next = id;
    }
    const int used = rt_exec_blocks_used(e->x);
    e->st.peak_blocks_used = used > e->st.peak_blocks_used ? used : e->st.peak_blocks_used;
    if (n_running)
        *n_running = e->st.running;
    if (n_waiting)
        *n_waiting = e->st.waiting;
    if (n_tok == 0 && e->st.running + e->st.waiting > 0 && e->st.running == 0) {
        /* nothing could run: a waiting request larger than the whole pool */
        const int idx = e->queue[0];
        qs_log_error("rt_engine", "request %lld needs more KV-cache blocks than the pool has "
                     "(%d of %d tokens)", (long long)e->seqs[idx].id, rt_exec_blocks_total(e->x),
                     rt_exec_block_size(e->x));
        finish(e, idx, RT_ERR_KV_FULL);
    }
    return RT_ERR_NONE;
}

enum rt_err rt_engine_run(struct rt_engine *e)
{
    int running = 0, waiting = 0;
    do {
        RT_TRY(rt_engine_step(e, &running, &waiting));
    } while (running + waiting > 0);
    return RT_ERR_NONE;
}

void rt_engine_stats(const struct rt_engine *e, struct rt_engine_stats *st)
{
    *st = e->st;
    st->blocks_used = rt_exec_blocks_used(e->x);
}
