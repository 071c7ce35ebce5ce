/*
 * rt_engine.h - the batching engine: many generation requests at once on one session's model
 * (continuous batching with chunked prefill over the paged KV cache; `qshard run --prompts`,
 * `qshard bench batch`, and the server's engine thread).
 *
 * Scheduling, once per step (rt_engine_step; vLLM's v1 scheduler is the model: Kwon et al.,
 * SOSP 2023, and vLLM's chunked prefill):
 *   1. every running sequence gets its next token (decode) or its next prompt chunk, in the
 *      order they were admitted, within the step's token budget (max_batch_tokens);
 *   2. then waiting requests are admitted first come first served while a slot is free
 *      (max_num_seqs), the budget lasts and blocks are free; a new sequence first takes the
 *      cached blocks of its prompt's longest cached prefix (prefix caching);
 *   3. when a running sequence needs a block and none is free, the most recently admitted
 *      running sequence is preempted: its blocks are freed and it waits at the head of the
 *      queue to be recomputed (prompt and the tokens generated so far), its sampler state kept,
 *      so its output is the one it would have had without the preemption.
 * Each sequence has its own sampling parameters and PRNG stream (seed), stops, max tokens and
 * eos (runtime/rt_gen_int.h: the same code as rt_generate), so its ids are those it gets alone.
 * The next tokens are chosen on the device when the backend can (every sequence of the step
 * without logprobs), else on the host from the downloaded rows.
 *
 * One thread drives an engine. Errors: enum rt_err; a request that cannot run (too long for the
 * context) fails alone at rt_engine_add; a model failure ends every running request with it.
 * Tests: ./build/test_engine (batched = one at a time on the fixtures: ids, logits through the
 * model API, preemption, prefix sharing, TP 2/4), ./build/test_cli_batch (qshard run --prompts).
 */
#ifndef QS_RT_ENGINE_H
#define QS_RT_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "rt_session.h"

#ifdef __cplusplus
extern "C" {
#endif

struct rt_engine;

struct rt_engine_opts {
    int max_batch_tokens; /* tokens per step (decode tokens + prompt chunks); <= 0: the model's
                             forward rows (rt_opts.max_batch as resolved) */
};

/* One finished (or failed) request, for rt_engine_req.on_finish; borrowed for the call. */
struct rt_engine_done {
    int64_t id;
    enum rt_err err;                  /* RT_ERR_NONE, or why it failed */
    const struct rt_gen_result *res;  /* ids, finish, n_prompt */
    double t_queue_s;                 /* from rt_engine_add to admission */
    double ttft_s;                    /* from rt_engine_add to the first generated token */
    double t_total_s;                 /* from rt_engine_add to the end */
    int n_cached;                     /* prompt tokens served from the prefix cache */
    int n_preempted;                  /* times it was preempted and recomputed */
};

struct rt_engine_req {
    const int32_t *ids;               /* the prompt [n_ids], copied */
    size_t n_ids;
    struct rt_gen_params gen;         /* as for rt_generate (stop strings borrowed until the end) */
    struct rt_gen_callbacks cb;       /* per-request streaming (cancel flag ignored: rt_engine_cancel) */
    void (*on_finish)(void *user, const struct rt_engine_done *d);
    void *user;
};

/* An engine over session s (its model must have rt_opts.n_seqs slots; they are the most
 * sequences at once). Errors: RT_ERR_ARG (no model), RT_ERR_NOMEM. */
enum rt_err rt_engine_create(struct rt_session *s, const struct rt_engine_opts *o,
                             struct rt_engine **out);
/* rt_engine_create running at most max_seqs (<= the model's slots) sequences at once. */
enum rt_err rt_engine_create_limited(struct rt_session *s, const struct rt_engine_opts *o,
                                     int max_seqs, struct rt_engine **out);
void rt_engine_free(struct rt_engine *e); /* requests still queued or running are dropped */

/* Queue a request (first come first served); *id names it. Errors (the request is not queued,
 * on_finish is not called): RT_ERR_CONTEXT (prompt of n_ctx tokens or more: one position must
 * stay free), RT_ERR_ARG (empty prompt, bad parameters: rt_generate's checks), RT_ERR_TOKEN (an
 * id outside the vocabulary), RT_ERR_NOMEM. */
enum rt_err rt_engine_add(struct rt_engine *e, const struct rt_engine_req *r, int64_t *id);

/* Cancel a queued or running request: it ends at the next step with finish CANCELLED (its
 * blocks are freed then). false when no such request is pending. */
bool rt_engine_cancel(struct rt_engine *e, int64_t id);

/* One scheduling step and one forward (nothing when idle). *n_running / *n_waiting after it
 * (may be NULL). Errors: a model failure (every pending request has then finished with it). */
enum rt_err rt_engine_step(struct rt_engine *e, int *n_running, int *n_waiting);

/* Steps until no request is pending. */
enum rt_err rt_engine_run(struct rt_engine *e);

struct rt_engine_stats {
    int running, waiting;
    long finished;
    long prompt_tokens, generation_tokens; /* computed prompt tokens, generated tokens */
    long cached_tokens;                    /* prompt tokens served from the prefix cache */
    long preemptions, steps;
    int blocks_used, blocks_total, peak_blocks_used;
    int max_batch_tokens;
};
void rt_engine_stats(const struct rt_engine *e, struct rt_engine_stats *st);

#ifdef __cplusplus
}
#endif
#endif /* QS_RT_ENGINE_H */
