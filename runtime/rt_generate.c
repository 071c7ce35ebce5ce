/*
 * rt_generate.c - the generation loop of runtime/rt_session.h (rt_generate): prefill, one
 * decode step per token, stop on eos ids / stop strings / max tokens / a full context / the
 * cancel flag; text streamed through callbacks with stop-string hold-back; optional per-token
 * logprobs; prefill and decode timings.
 *
 * Model calls go through rt_session_step / rt_session_forward / rt_session_reset only.
 * Tests: ./build/test_cli_run (the qshard binary: stops, eos, streaming, --json, logprobs,
 * Ctrl-C).
 */
#include "rt_gen_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "qs_log.h"  /* qs_log_error, qs_log_warn, qs_log_debug */
#include "qs_util.h" /* qs_now_s */

struct rt_gen_params rt_gen_params_default(void)
{
    struct rt_gen_params p = {
        .sample = rt_sample_params_default(),
        .max_tokens = -1,
        .extra_eos = -1,
        .decode_flags = RT_TOK_DECODE_SKIP_SPECIAL,
    };
    return p;
}

const char *rt_gen_finish_reason(enum rt_gen_finish f)
{
    switch (f) {
    case RT_GEN_FINISH_EOS:
    case RT_GEN_FINISH_STOP_STRING: return "stop";
    case RT_GEN_FINISH_LENGTH:
    case RT_GEN_FINISH_CONTEXT: return "length";
    case RT_GEN_FINISH_CANCELLED: return "cancelled";
    default: return "error";
    }
}

const char *rt_gen_finish_str(enum rt_gen_finish f)
{
    switch (f) {
    case RT_GEN_FINISH_EOS: return "eos";
    case RT_GEN_FINISH_STOP_STRING: return "stop string";
    case RT_GEN_FINISH_LENGTH: return "max tokens";
    case RT_GEN_FINISH_CONTEXT: return "context full";
    case RT_GEN_FINISH_CANCELLED: return "interrupted";
    default: return "error";
    }
}

void rt_gen_result_free(struct rt_gen_result *r)
{
    if (!r)
        return;
    free(r->ids);
    memset(r, 0, sizeof(*r));
    r->stop_index = -1;
}

// --- stop strings --------------------------------------------------------------------------

static enum rt_err emit_text(struct rt_gen *g, const char *t, size_t n)
{
    return n && g->cb && g->cb->on_text ? g->cb->on_text(g->cb->user, t, n) : RT_ERR_NONE;
}

/* Append text; pass on what can no longer be part of a stop string. *stopped: a stop string
 * completed (the text before it has been passed on, the stop string not). */
static enum rt_err hold_push(struct rt_gen *g, const char *t, size_t len, bool *stopped)
{
    *stopped = false;
    if (g->n_pend + len + 1 > g->cap) {
        size_t nc = (g->n_pend + len + 1) * 2;
        char *np = realloc(g->pending, nc);
        if (!np) {
            qs_log_error(__func__, "out of memory for %zu bytes of text", nc);
            return RT_ERR_NOMEM;
        }
        g->pending = np;
        g->cap = nc;
    }
    memcpy(g->pending + g->n_pend, t, len);
    g->n_pend += len;
    size_t cut = g->n_pend; /* earliest complete stop string */
    for (int i = 0; i < g->p->n_stops; i++) {
        /* memmem, not strstr: generated text may hold NUL bytes (<0x00> tokens) */
        const char *hit = memmem(g->pending, g->n_pend, g->p->stops[i], strlen(g->p->stops[i]));
        if (hit && (size_t)(hit - g->pending) < cut) {
            cut = (size_t)(hit - g->pending);
            *stopped = true;
            g->res->stop_index = i;
        }
    }
    if (!*stopped) { /* keep the longest suffix that is a proper prefix of a stop string */
        size_t keep = 0;
        for (int i = 0; i < g->p->n_stops; i++) {
            const size_t sl = strlen(g->p->stops[i]);
            for (size_t k = sl - 1; k > keep; k--)
                if (k <= g->n_pend && !memcmp(g->pending + g->n_pend - k, g->p->stops[i], k)) {
                    keep = k;
                    break;
                }
        }
        cut = g->n_pend - keep;
    }
    enum rt_err e = emit_text(g, g->pending, cut);
    memmove(g->pending, g->pending + cut, g->n_pend - cut);
    g->n_pend -= cut;
    return e;
}

/* The end of generation (not at a stop string): what the stream holds, then every held byte. */
static enum rt_err hold_flush(struct rt_gen *g)
{
    const char *t;
    size_t tl;
    bool stopped = false;
    enum rt_err e = RT_ERR_NONE;
    if (g->have_stream && rt_tok_stream_flush(&g->ts, &t, &tl) == RT_TOK_ERR_NONE)
        e = hold_push(g, t, tl, &stopped);
    if (!e && !stopped)
        e = emit_text(g, g->pending, g->n_pend);
    if (stopped && g->res->finish != RT_GEN_FINISH_CANCELLED)
        g->res->finish = RT_GEN_FINISH_STOP_STRING;
    g->n_pend = 0;
    return e;
}

// --- one generated token -------------------------------------------------------------------

/* log-softmax of the raw logits over the n_pick ids: the chosen id's logprob and the top n. */
static float logprobs(struct rt_gen *g, int32_t id, int n_top)
{
    const float *x = g->logits;
    const int32_t v = rt_session_n_pick(g->s);
    double mx = -INFINITY, sum = 0.0;
    for (int32_t i = 0; i < v; i++)
        mx = x[i] > mx ? x[i] : mx;
    for (int32_t i = 0; i < v; i++)
        sum += exp((double)x[i] - mx);
    const double lse = mx + log(sum);
    int k = 0;
    for (int32_t i = 0; i < v; i++) { /* insertion into the top n, most likely first */
        if (k == n_top && !(x[i] > x[g->top_ids[k - 1]]))
            continue;
        int j = k < n_top ? k++ : k - 1;
        for (; j > 0 && x[i] > x[g->top_ids[j - 1]]; j--)
            g->top_ids[j] = g->top_ids[j - 1];
        g->top_ids[j] = i;
    }
    for (int j = 0; j < k; j++)
        g->top_lp[j] = (float)((double)x[g->top_ids[j]] - lse);
    return (float)((double)x[id] - lse);
}

/* Record id (not an eos), tell on_token, pass its text on; *stopped: a stop string completed. */
static enum rt_err take_token(struct rt_gen *g, int32_t id, bool *stopped)
{
    struct rt_gen_result *r = g->res;
    *stopped = false;
    r->ids[r->n_ids] = id;
    struct rt_gen_token t = {.id = id, .index = (long)r->n_ids};
    r->n_ids++;
    rt_sampler_accept(&g->smp, id);
    rt_sampler_accept_output(&g->smp, id);
    if (g->p->logprobs > 0) {
        t.logprob = logprobs(g, id, g->p->logprobs);
        t.n_top = g->p->logprobs < rt_session_n_pick(g->s) ? g->p->logprobs
                                                             : rt_session_n_pick(g->s);
        t.top_ids = g->top_ids;
        t.top_logprobs = g->top_lp;
    }
    enum rt_err e = g->cb && g->cb->on_token ? g->cb->on_token(g->cb->user, &t) : RT_ERR_NONE;
    if (e || !g->have_stream)
        return e;
    const char *text;
    size_t tl;
    if (rt_tok_stream_push(&g->ts, id, &text, &tl) != RT_TOK_ERR_NONE)
        return RT_ERR_TOKENIZER;
    return hold_push(g, text, tl, stopped);
}

static bool is_eos(const struct rt_gen *g, int32_t id)
{
    int n;
    const int32_t *eos = rt_session_eos(g->s, &n);
    for (int i = 0; i < n; i++)
        if (eos[i] == id)
            return true;
    return id == g->p->extra_eos;
}

static bool cancelled(const struct rt_gen *g)
{
    return g->cb && g->cb->cancel && *g->cb->cancel;
}

// --- the loop ------------------------------------------------------------------------------

/* Parameters, sampler, buffers. */
static enum rt_err gen_setup(struct rt_gen *g, const int32_t *ids, size_t n, long max, bool pick_ok)
{
    const struct rt_gen_params *p = g->p;
    if (p->n_stops < 0 || p->n_stops > RT_GEN_MAX_STOPS || p->logprobs < 0 ||
        p->logprobs > RT_GEN_MAX_LOGPROBS || (p->n_stops && !p->stops)) {
        qs_log_error(__func__, "bad parameters: %d stop strings (at most %d), logprobs %d (0..%d)",
                     p->n_stops, RT_GEN_MAX_STOPS, p->logprobs, RT_GEN_MAX_LOGPROBS);
        return RT_ERR_ARG;
    }
    for (int i = 0; i < p->n_stops; i++)
        if (!p->stops[i] || !p->stops[i][0]) {
            qs_log_error(__func__, "stop string %d is empty", i + 1);
            return RT_ERR_ARG;
        }
    const struct rt_tok *tok = rt_session_tok(g->s);
    if (p->n_stops > 0 && !tok) {
        qs_log_error(__func__, "stop strings need the model's tokenizer, which it lacks");
        return RT_ERR_TOKENIZER;
    }
    enum rt_err e = rt_session_sampler_init(g->s, &p->sample, &g->smp);
    if (e)
        return e;
    for (size_t i = 0; i < n; i++)
        rt_sampler_accept(&g->smp, ids[i]);
    /* the device sampler has no frequency / presence penalty: those rows come to the host */
    const bool pick = pick_ok && max != 0 && rt_session_can_pick(g->s) && p->logprobs == 0 &&
                      p->sample.frequency_penalty == 0.0f && p->sample.presence_penalty == 0.0f;
    g->res->on_device = pick;
    g->res->ids = malloc(((size_t)max + 1) * sizeof(int32_t));
    if (!pick)
        g->logits = malloc((size_t)rt_session_n_vocab(g->s) * sizeof(float));
    if (!g->res->ids || (!pick && !g->logits)) {
        qs_log_error(__func__, "out of memory for %ld ids and a logits row of %d", max,
                     (int)rt_session_n_vocab(g->s));
        return RT_ERR_NOMEM;
    }
    if (tok) {
        rt_tok_stream_init(&g->ts, tok, p->decode_flags);
        g->have_stream = true;
    }
    qs_log_debug("sampling on the %s", pick ? "GPU (k_sample)" : "host (rt_sampler)");
    return RT_ERR_NONE;
}

enum rt_err rt_gen_take(struct rt_gen *g, int32_t next, int pos, bool *done)
{
    struct rt_gen_result *r = g->res;
    *done = true;
    if (!g->p->ignore_eos && is_eos(g, next)) {
        r->finish = RT_GEN_FINISH_EOS;
        return RT_ERR_NONE;
    }
    bool stopped;
    enum rt_err e = take_token(g, next, &stopped);
    if (e)
        return e;
    if (stopped) {
        r->finish = RT_GEN_FINISH_STOP_STRING;
        return RT_ERR_NONE;
    }
    if ((long)r->n_ids == g->max) {
        r->finish = RT_GEN_FINISH_LENGTH;
        return RT_ERR_NONE;
    }
    if (pos >= rt_session_n_ctx(g->s)) {
        qs_log_warn("context full (%d tokens): generation stopped", rt_session_n_ctx(g->s));
        r->finish = RT_GEN_FINISH_CONTEXT;
        return RT_ERR_NONE;
    }
    if (cancelled(g)) {
        r->finish = RT_GEN_FINISH_CANCELLED;
        return RT_ERR_CANCELLED;
    }
    *done = false;
    return RT_ERR_NONE;
}

/* Decode until a stop; next: the id the prefill chose. */
static enum rt_err gen_loop(struct rt_gen *g, int32_t next, int pos)
{
    struct rt_gen_result *r = g->res;
    for (;;) {
        bool done;
        enum rt_err e = rt_gen_take(g, next, pos, &done);
        if (e || done)
            return e;
        const int32_t cur = next;
        const double t1 = qs_now_s();
        e = rt_session_step(g->s, &g->smp, &cur, 1, pos, r->on_device, g->logits, &next);
        if (e)
            return e;
        r->t_decode_s += qs_now_s() - t1;
        r->n_decode++;
        pos++;
    }
}

enum rt_err rt_gen_begin(struct rt_gen *g, struct rt_session *s, const int32_t *ids, size_t n,
                         const struct rt_gen_params *p, const struct rt_gen_callbacks *cb,
                         struct rt_gen_result *res, bool pick_ok)
{
    memset(g, 0, sizeof(*g));
    memset(res, 0, sizeof(*res));
    res->stop_index = -1;
    res->n_prompt = n;
    res->seed = p->sample.seed;
    res->finish = RT_GEN_FINISH_ERROR;
    const int n_ctx = rt_session_n_ctx(s);
    g->s = s;
    g->p = p;
    g->cb = cb;
    g->res = res;
    if (n < 1 || (int64_t)n >= n_ctx) {
        qs_log_error(__func__, "the prompt has %zu tokens, the context holds %d (one position "
                     "must stay free to generate)", n, n_ctx);
        return n < 1 ? RT_ERR_ARG : RT_ERR_CONTEXT;
    }
    g->max = p->max_tokens < 0 || p->max_tokens > n_ctx ? n_ctx : p->max_tokens;
    enum rt_err e = gen_setup(g, ids, n, g->max, pick_ok);
    if (!e && cancelled(g)) {
        res->finish = RT_GEN_FINISH_CANCELLED;
        e = RT_ERR_CANCELLED;
    }
    return e;
}

enum rt_err rt_gen_end(struct rt_gen *g, enum rt_err e)
{
    struct rt_gen_result *res = g->res;
    /* what is held back is real output unless a stop string ended it (or a failure) */
    if ((e == RT_ERR_NONE || e == RT_ERR_CANCELLED) && res->finish != RT_GEN_FINISH_STOP_STRING) {
        enum rt_err fe = hold_flush(g);
        e = e ? e : fe;
    }
    if (e && e != RT_ERR_CANCELLED)
        res->finish = RT_GEN_FINISH_ERROR;
    if (g->have_stream)
        rt_tok_stream_free(&g->ts);
    g->have_stream = false;
    rt_sampler_free(&g->smp);
    free(g->pending);
    free(g->logits);
    g->pending = NULL;
    g->logits = NULL;
    return e;
}

enum rt_err rt_generate(struct rt_session *s, const int32_t *ids, size_t n,
                        const struct rt_gen_params *p, const struct rt_gen_callbacks *cb,
                        struct rt_gen_result *res)
{
    struct rt_gen g;
    enum rt_err e = rt_gen_begin(&g, s, ids, n, p, cb, res, true);
    if (!e) {
        rt_session_reset(s);
        int32_t next = -1;
        const double t0 = qs_now_s();
        e = g.max == 0 ? rt_session_forward(s, ids, (int)n, 0, NULL, false)
                       : rt_session_step(s, &g.smp, ids, (int)n, 0, res->on_device, g.logits,
                                         &next);
        res->t_prefill_s = qs_now_s() - t0;
        if (!e && g.max == 0)
            res->finish = RT_GEN_FINISH_LENGTH;
        else if (!e)
            e = gen_loop(&g, next, (int)n);
    }
    return rt_gen_end(&g, e);
}
