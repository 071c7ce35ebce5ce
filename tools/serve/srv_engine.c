/*
 * srv_engine.c - the server's engine thread (tools/serve/srv_int.h): the inbox of parsed
 * requests, one rt_engine request per choice, cancellation, the engine's callbacks into each
 * request's output, and the metrics of /metrics (Prometheus text exposition format 0.0.4,
 * prometheus.io/docs/instrumenting/exposition_formats; names after vLLM's vllm:* metrics).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qs_log.h"
#include "qs_util.h" /* qs_now_s */
#include "srv_int.h"

// --- the engine's callbacks (engine thread) ----------------------------------------------------

static void hist_observe(struct srv_hist *h, double x)
{
    int i = 0;
    while (i < h->n && x > h->le[i])
        i++;
    h->count[i]++;
    h->sum += x;
    h->total++;
}

static enum rt_err on_text(void *user, const char *t, size_t n)
{
    struct srv_choice *c = user;
    struct srv_req *r = c->r;
    pthread_mutex_lock(&r->mu);
    const bool ok = srv_append(&c->text, &c->n_text, &c->cap_text, t, n);
    if (ok)
        pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return ok ? RT_ERR_NONE : RT_ERR_NOMEM;
}

static enum rt_err on_token(void *user, const struct rt_gen_token *t)
{
    struct srv_choice *c = user;
    struct srv_req *r = c->r;
    struct srv *v = r->srv;
    const double now = qs_now_s();
    if (c->t_last > 0) { /* t_last: engine thread only */
        pthread_mutex_lock(&v->mu);
        hist_observe(&v->tpot, now - c->t_last);
        pthread_mutex_unlock(&v->mu);
    }
    enum rt_err e = RT_ERR_NONE;
    pthread_mutex_lock(&r->mu);
    if (c->t_first == 0)
        c->t_first = now; /* read by the connection's log line: under mu */
    c->t_last = now;
    if (c->n_ids == c->cap_ids) {
        size_t cap = c->cap_ids ? 2 * c->cap_ids : 64;
        int32_t *p = realloc(c->ids, cap * sizeof(*p));
        if (p) {
            c->ids = p;
            c->cap_ids = cap;
        } else {
            e = RT_ERR_NOMEM;
        }
    }
    if (!e)
        c->ids[c->n_ids++] = t->id;
    if (!e)
        pthread_cond_broadcast(&r->cv);
    if (r->logprobs < 0 || e) {
        pthread_mutex_unlock(&r->mu);
        return e;
    }
    if (c->n_toks == c->cap_toks) {
        size_t cap = c->cap_toks ? 2 * c->cap_toks : 16;
        struct srv_tok *p = realloc(c->toks, cap * sizeof(*p));
        if (p) {
            c->toks = p;
            c->cap_toks = cap;
        } else {
            e = RT_ERR_NOMEM;
        }
    }
    if (!e) {
        struct srv_tok *k = &c->toks[c->n_toks++];
        k->id = t->id;
        k->logprob = t->logprob;
        k->n_top = t->n_top < r->logprobs ? t->n_top : r->logprobs;
        for (int i = 0; i < k->n_top; i++) {
            k->top_ids[i] = t->top_ids[i];
            k->top_lp[i] = t->top_logprobs[i];
        }
    }
    pthread_mutex_unlock(&r->mu);
    return e;
}

static void on_finish(void *user, const struct rt_engine_done *d)
{
    struct srv_choice *c = user;
    struct srv_req *r = c->r;
    struct srv *v = r->srv;
    const double now = qs_now_s();
    pthread_mutex_lock(&r->mu);
    c->done = true;
    c->err = d->err == RT_ERR_CANCELLED ? RT_ERR_NONE : d->err;
    c->finish = d->res ? d->res->finish : RT_GEN_FINISH_ERROR;
    if (d->err == RT_ERR_CANCELLED)
        c->finish = RT_GEN_FINISH_CANCELLED;
    c->n_prompt = d->res ? d->res->n_prompt : 0;
    c->n_completion = d->res ? d->res->n_ids : 0;
    c->n_cached = d->n_cached;
    r->n_done++;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_lock(&v->mu);
    const int k = c->finish == RT_GEN_FINISH_CANCELLED || c->err ? 2
                  : c->finish == RT_GEN_FINISH_LENGTH || c->finish == RT_GEN_FINISH_CONTEXT ? 1
                                                                                        : 0;
    v->n_finished[k]++;
    if (c->t_first > 0) /* written by this thread only */
        hist_observe(&v->ttft, c->t_first - r->t_start);
    hist_observe(&v->e2e, now - r->t_start);
    pthread_mutex_unlock(&v->mu);
}

// --- the engine thread -------------------------------------------------------------------------

/* Fail choice c without running it (the engine refused it). */
static void choice_fail(struct srv_choice *c, enum rt_err e, enum rt_gen_finish finish)
{
    struct srv_req *r = c->r;
    pthread_mutex_lock(&r->mu);
    c->done = true;
    c->err = e;
    c->finish = finish;
    r->n_done++;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* Every choice of r into the engine; r joins the live list (its reference moves there). */
static void add_request(struct srv *v, struct srv_req *r)
{
    if (v->n_live == v->cap_live) {
        int cap = v->cap_live ? 2 * v->cap_live : 64;
        struct srv_req **p = realloc(v->live, (size_t)cap * sizeof(*p));
        if (!p) {
            for (int i = 0; i < r->n_choices; i++)
                choice_fail(&r->ch[i], RT_ERR_NOMEM, RT_GEN_FINISH_ERROR);
            srv_req_unref(r);
            return;
        }
        v->live = p;
        v->cap_live = cap;
    }
    v->live[v->n_live++] = r;
    for (int i = 0; i < r->n_choices; i++) {
        struct srv_choice *c = &r->ch[i];
        const struct rt_engine_req er = {
            .ids = r->prompt_ids[c->prompt], .n_ids = r->n_prompt_ids[c->prompt], .gen = c->gp,
            .cb = {.on_text = on_text, .on_token = on_token, .user = c},
            .on_finish = on_finish, .user = c};
        enum rt_err e = atomic_load(&r->cancel) ? RT_ERR_CANCELLED
                                                : rt_engine_add(v->eng, &er, &c->eng_id);
        if (e) {
            c->eng_id = -1;
            if (e == RT_ERR_CANCELLED)
                choice_fail(c, RT_ERR_NONE, RT_GEN_FINISH_CANCELLED);
            else
                choice_fail(c, e, RT_GEN_FINISH_ERROR);
        }
    }
}

/* Cancel what was cancelled (or everything when quitting); drop finished requests. */
static void sweep(struct srv *v, bool cancel_all)
{
    int w = 0;
    for (int i = 0; i < v->n_live; i++) {
        struct srv_req *r = v->live[i];
        if (cancel_all || atomic_load(&r->cancel))
            for (int j = 0; j < r->n_choices; j++) {
                pthread_mutex_lock(&r->mu);
                const bool run = !r->ch[j].done && r->ch[j].eng_id >= 0;
                pthread_mutex_unlock(&r->mu);
                if (run)
                    rt_engine_cancel(v->eng, r->ch[j].eng_id);
            }
        pthread_mutex_lock(&r->mu);
        const bool over = r->n_done == r->n_choices;
        pthread_mutex_unlock(&r->mu);
        if (over)
            srv_req_unref(r);
        else
            v->live[w++] = r;
    }
    v->n_live = w;
}

static void update_stats(struct srv *v)
{
    struct rt_engine_stats st;
    rt_engine_stats(v->eng, &st);
    pthread_mutex_lock(&v->mu);
    v->st = st;
    v->waiting = st.waiting;
    pthread_mutex_unlock(&v->mu);
}

static void *engine_main(void *arg)
{
    struct srv *v = arg;
    for (;;) {
        pthread_mutex_lock(&v->mu);
        while (!v->inbox && v->n_live == 0 && !atomic_load(&v->quit))
            pthread_cond_wait(&v->cv, &v->mu);
        struct srv_req *in = v->inbox;
        v->inbox = v->inbox_tail = NULL;
        v->n_inbox = 0;
        const bool quit = atomic_load(&v->quit);
        pthread_mutex_unlock(&v->mu);
        while (in) {
            struct srv_req *next = in->next_in;
            in->next_in = NULL;
            if (quit)
                atomic_store(&in->cancel, true);
            add_request(v, in);
            in = next;
        }
        sweep(v, quit);
        update_stats(v);
        if (quit && v->n_live == 0)
            break;
        int running = 0, waiting = 0;
        enum rt_err e = rt_engine_step(v->eng, &running, &waiting);
        if (e)
            qs_log_error("serve", "the model failed (%s): the requests running have ended "
                         "with it", rt_err_str(e));
        sweep(v, quit);
        update_stats(v);
    }
    return NULL;
}

enum rt_err srv_engine_start(struct srv *v)
{
    if (pthread_create(&v->engine_thread, NULL, engine_main, v)) {
        qs_log_error("serve", "cannot start the engine thread");
        return RT_ERR_NOMEM;
    }
    v->engine_started = true;
    return RT_ERR_NONE;
}

void srv_engine_stop(struct srv *v)
{
    if (!v->engine_started)
        return;
    pthread_mutex_lock(&v->mu);
    atomic_store(&v->quit, true);
    pthread_cond_broadcast(&v->cv);
    pthread_mutex_unlock(&v->mu);
    pthread_join(v->engine_thread, NULL);
    pthread_mutex_lock(&v->mu);
    v->engine_started = false;
    pthread_mutex_unlock(&v->mu);
    free(v->live);
    v->live = NULL;
    v->n_live = v->cap_live = 0;
}

int srv_submit(struct srv *v, struct srv_req *r)
{
    pthread_mutex_lock(&v->mu);
    int status = 0;
    if (atomic_load(&v->draining) || atomic_load(&v->quit) || !v->engine_started)
        status = 503;
    else if (v->waiting + v->n_inbox + r->n_choices > v->o.max_queue)
        status = 429;
    if (!status) {
        srv_req_ref(r); /* the engine's */
        if (v->inbox_tail)
            v->inbox_tail->next_in = r;
        else
            v->inbox = r;
        v->inbox_tail = r;
        v->n_inbox += r->n_choices;
        pthread_cond_broadcast(&v->cv);
    }
    pthread_mutex_unlock(&v->mu);
    return status;
}

void srv_cancel(struct srv *v, struct srv_req *r)
{
    atomic_store(&r->cancel, true);
    pthread_mutex_lock(&v->mu);
    pthread_cond_broadcast(&v->cv);
    pthread_mutex_unlock(&v->mu);
}

uint64_t srv_random(struct srv *v)
{
    pthread_mutex_lock(&v->mu);
    uint64_t z = (v->rng += 0x9e3779b97f4a7c15ull); /* splitmix64 (Steele et al., 2014) */
    pthread_mutex_unlock(&v->mu);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void srv_count_status(struct srv *v, int status)
{
    const int k = status / 100;
    if (k < 2 || k > 5)
        return;
    pthread_mutex_lock(&v->mu);
    v->n_http[k]++;
    pthread_mutex_unlock(&v->mu);
}

// --- /metrics -----------------------------------------------------------------------------------

struct sbuf {
    char *p;
    size_t n, cap;
    bool bad;
};

static void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
    if (b->bad)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        const size_t room = b->cap - b->n;
        const int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? room : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->bad = true;
            return;
        }
        if (b->p && (size_t)k < room) {
            b->n += (size_t)k;
            return;
        }
        if (!srv_reserve(&b->p, b->n, (size_t)k + 256, &b->cap)) {
            b->bad = true;
            return;
        }
    }
}

static void metric(struct sbuf *b, const char *name, const char *type, const char *help,
                   double value)
{
    sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, value);
}

static void histogram(struct sbuf *b, const char *name, const char *help,
                      const struct srv_hist *h)
{
    sb_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    unsigned long long cum = 0;
    for (int i = 0; i < h->n; i++) {
        cum += h->count[i];
        sb_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->le[i], cum);
    }
    sb_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.17g\n%s_count %llu\n", name, h->total,
              name, h->sum, name, h->total);
}

char *srv_metrics_text(struct srv *v)
{
    struct sbuf b = {0};
    pthread_mutex_lock(&v->mu);
    const struct rt_engine_stats st = v->st;
    metric(&b, "qshard:num_requests_running", "gauge", "Sequences in the engine's batch.",
           st.running);
    metric(&b, "qshard:num_requests_waiting", "gauge", "Sequences waiting for a slot.",
           v->waiting + v->n_inbox);
    sb_printf(&b, "# HELP qshard:request_success_total Finished sequences by finish reason.\n"
                  "# TYPE qshard:request_success_total counter\n"
                  "qshard:request_success_total{finished_reason=\"stop\"} %llu\n"
                  "qshard:request_success_total{finished_reason=\"length\"} %llu\n"
                  "qshard:request_success_total{finished_reason=\"abort\"} %llu\n",
              v->n_finished[0], v->n_finished[1], v->n_finished[2]);
    sb_printf(&b, "# HELP qshard:http_responses_total HTTP responses by status class.\n"
                  "# TYPE qshard:http_responses_total counter\n");
    for (int k = 2; k <= 5; k++)
        sb_printf(&b, "qshard:http_responses_total{status=\"%dxx\"} %llu\n", k, v->n_http[k]);
    metric(&b, "qshard:prompt_tokens_total", "counter",
           "Prompt tokens processed (computed and served from the prefix cache).",
           (double)(st.prompt_tokens + st.cached_tokens));
    metric(&b, "qshard:prefix_cache_hit_tokens_total", "counter",
           "Prompt tokens served from the prefix cache.", (double)st.cached_tokens);
    metric(&b, "qshard:generation_tokens_total", "counter", "Generated tokens.",
           (double)st.generation_tokens);
    metric(&b, "qshard:num_preemptions_total", "counter",
           "Sequences preempted (blocks freed, recomputed later).", (double)st.preemptions);
    metric(&b, "qshard:kv_cache_blocks_used", "gauge", "KV-cache blocks in use.",
           st.blocks_used);
    metric(&b, "qshard:kv_cache_blocks_total", "gauge", "KV-cache blocks in the pool.",
           st.blocks_total);
    metric(&b, "qshard:kv_cache_usage_perc", "gauge", "Fraction of the KV-cache blocks in use.",
           st.blocks_total ? (double)st.blocks_used / st.blocks_total : 0.0);
    histogram(&b, "qshard:time_to_first_token_seconds",
              "Time from receiving a request to its first generated token.", &v->ttft);
    histogram(&b, "qshard:time_per_output_token_seconds",
              "Time between consecutive generated tokens of a sequence.", &v->tpot);
    histogram(&b, "qshard:e2e_request_latency_seconds",
              "Time from receiving a request to its end.", &v->e2e);
    pthread_mutex_unlock(&v->mu);
    if (b.bad) {
        free(b.p);
        return NULL;
    }
    return b.p;
}
