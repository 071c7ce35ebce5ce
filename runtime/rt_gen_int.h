/*
 * rt_gen_int.h - one sequence's generation state (private to runtime/): the parts of the loop of
 * rt_generate (runtime/rt_generate.c) that do not call the model - eos, stop strings with
 * hold-back, streaming text, logprobs, max tokens, a full context - so the single-sequence loop
 * and the batching engine (runtime/rt_engine.c) share one implementation.
 */
#ifndef QS_RT_GEN_INT_H
#define QS_RT_GEN_INT_H

#include "rt_session.h"

/* The state of one rt_generate call. */
struct rt_gen {
    struct rt_session *s;
    const struct rt_gen_params *p;
    const struct rt_gen_callbacks *cb;
    struct rt_gen_result *res;
    struct rt_sampler smp;
    struct rt_tok_stream ts;
    bool have_stream;
    char *pending; /* generated text not passed on yet (could still become a stop string) */
    size_t n_pend, cap;
    float *logits; /* [n_vocab]: the host row (host sampling or logprobs), else NULL */
    long max;      /* tokens to generate at most */
    int32_t top_ids[RT_GEN_MAX_LOGPROBS];
    float top_lp[RT_GEN_MAX_LOGPROBS];
};

/*
 * Set up g for prompt ids[n] (see rt_generate): res zeroed then filled as it goes; the prompt's
 * ids enter the sampler's history. pick_ok: the next token may be chosen on the device (else
 * g->logits is allocated for host sampling). Errors: those of rt_generate's set-up. Call
 * rt_gen_end in every case.
 */
enum rt_err rt_gen_begin(struct rt_gen *g, struct rt_session *s, const int32_t *ids, size_t n,
                         const struct rt_gen_params *p, const struct rt_gen_callbacks *cb,
                         struct rt_gen_result *res, bool pick_ok);

/* The id chosen after position pos - 1 (pos = positions in the cache): an eos ends it, else it
 * is taken (callbacks, text, stop strings), then max tokens, a full context or the cancel flag
 * may end it. *done: generation is over (res->finish says why). */
enum rt_err rt_gen_take(struct rt_gen *g, int32_t next, int pos, bool *done);

/* Flush held text (unless a stop string ended it), set finish on error, free the state.
 * Returns e, or the flush's error. */
enum rt_err rt_gen_end(struct rt_gen *g, enum rt_err e);

#endif /* QS_RT_GEN_INT_H */
