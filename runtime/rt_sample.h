/*
 * rt_sample.h - next-token selection from one row of fp32 logits: greedy, temperature, top-k,
 * top-p (nucleus), min-p, repetition penalty, with a seeded PRNG of our own so that `--seed`
 * makes runs repeatable on every machine.
 *
 * Who calls it: runtime/rt_generate.c (the generation loop of runtime/rt_session.h), once per
 * generated token, on the logits row of the last position. The CUDA sampling kernel copies these semantics; tests/test_sample.c is
 * the contract.
 *
 * Semantics (HuggingFace transformers' generation, src/transformers/generation/utils.py
 * `_get_logits_processor` and logits_process.py; the order of the processors is part of the
 * contract):
 *   0. Only ids [0, n) are candidates, n = min(vocab_size, vocab_limit) (vocab_limit 0: n =
 *      vocab_size). Entries past vocab_size in a padded logits row (DESIGN 5: V_r * world_size
 *      >= vocab_size) are never read; vocab_limit keeps out the rows of lm_head past the
 *      tokenizer's vocabulary (Qwen2: config vocab_size 151936, 151646 tokenizer ids), which
 *      have no text (the session passes min(model vocab, tokenizer vocab)). A NaN logit counts
 *      as -inf.
 *   1. repetition penalty r (RepetitionPenaltyLogitsProcessor, after Keskar et al. 2019, "CTRL",
 *      arXiv:1909.05858 section 4.1): for every distinct id in the history (prompt + generated,
 *      as HF's input_ids), x = x > 0 ? x / r : x * r (x == 0 stays 0). Applied once per id, no
 *      matter how often it occurred. r = 1 is off.
 *   1b. frequency and presence penalties (OpenAI's API; vLLM applies them after the repetition
 *      penalty, on the generated tokens only): x -= f * c + p * (c > 0), c = the times the id
 *      was generated (rt_sampler_accept_output). 0 is off.
 *   2. greedy when temperature == 0: argmax of the penalised logits; ties go to the lowest id
 *      (torch.argmax returns the first maximum). Steps 3-6 are skipped.
 *   3. temperature T (TemperatureLogitsWarper): x = x / T.
 *   4. top-k (TopKLogitsWarper): keep every id whose logit is >= the k-th largest logit (ties at
 *      the boundary are all kept, as HF's `scores < topk(scores, k)[-1]` removal does); 0 = off.
 *   5. top-p (TopPLogitsWarper): softmax over the survivors, sorted by logit descending (ties:
 *      lower id first; torch.sort leaves tie order unspecified); an id is kept iff the
 *      probability mass of the ids before it is < p (HF: removed iff ascending cumsum <= 1 - p);
 *      at least one id is kept. p >= 1 is off.
 *   6. min-p (MinPLogitsWarper, after top-p as in HF): with the survivors' renormalised
 *      probabilities, remove ids whose probability is < min_p * max probability; 0 = off.
 *   Weights: the softmax of steps 5-7 uses e = exp(x - mx), mx the largest survivor; e = 1
 *   for x == mx, so a +inf logit (an overflowing x / T or x / r) does not give NaN: the ids at
 *   +inf share the mass equally and every other id gets 0.
 *   7. draw: one uniform u in [0, 1) from the PRNG; walk the survivors in ascending id order
 *      and return the first id whose cumulative renormalised probability exceeds u (the last
 *      survivor absorbs rounding). Softmax and sums are in double. (Ascending id order needs
 *      no sort: a CUDA kernel can do it as a prefix sum over the vocabulary.)
 *
 * PRNG: xoshiro256** 1.0 seeded through splitmix64 (D. Blackman, S. Vigna, "Scrambled linear
 * pseudorandom number generators", ACM TOMS 2021; reference description at
 * https://prng.di.unimi.it/). u = (next() >> 11) * 2^-53. The PRNG stream is the same on every
 * platform; the same seed, parameters and logits give the same ids wherever exp() rounds the
 * same (a draw that lands within an ulp of a cumulative boundary may differ across libm or
 * between CPU and GPU). One draw per sampled token; greedy draws nothing.
 *
 * Ownership: struct rt_sampler owns its scratch arrays ([vocab_size] each) and the history
 * bitmap; rt_sampler_free releases them. Not thread-safe (one sampler per sequence).
 *
 * Test: ./build/test_sample
 */
#ifndef QS_RT_SAMPLE_H
#define QS_RT_SAMPLE_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RT_SAMPLE_ERR_LIST(X)                                                    \
    X(RT_SAMPLE_ERR_NONE, 0, "ok")                                               \
    X(RT_SAMPLE_ERR_PARAM, 1, "invalid sampling parameter")                      \
    X(RT_SAMPLE_ERR_NO_CANDIDATE, 2, "no finite logit among the real vocabulary") \
    X(RT_SAMPLE_ERR_TOKEN, 3, "token id outside the vocabulary")                 \
    X(RT_SAMPLE_ERR_NOMEM, 4, "out of memory")

enum rt_sample_err {
#define RT_SAMPLE_X_ENUM(name, value, msg) name = value,
    RT_SAMPLE_ERR_LIST(RT_SAMPLE_X_ENUM)
#undef RT_SAMPLE_X_ENUM
};

/* Stable message for a status ("unknown error" for values not in the list). */
const char *rt_sample_err_str(enum rt_sample_err e);

/* Sampling parameters; rt_sample_params_default() gives HF's generate() defaults except that
 * temperature 0 means greedy (HF: do_sample=False). */
struct rt_sample_params {
    float temperature;    /* 0: greedy; else > 0, logits divided by it */
    int32_t top_k;        /* 0: off; else >= 1 */
    float top_p;          /* (0, 1]; 1: off */
    float min_p;          /* [0, 1]; 0: off */
    float repeat_penalty; /* > 0; 1: off; > 1 discourages repeats */
    float frequency_penalty; /* [-2, 2]; 0: off; minus f x (times the id was generated) */
    float presence_penalty;  /* [-2, 2]; 0: off; minus p for every id generated at least once */
    uint64_t seed;        /* PRNG seed */
    int32_t vocab_limit;  /* >= 0; 0: off; else only ids < vocab_limit are candidates (step 0) */
};

struct rt_sample_params rt_sample_params_default(void);

/* Checks ranges (above); reports the offending field through qs_log_error. */
enum rt_sample_err rt_sample_params_check(const struct rt_sample_params *p);

struct rt_sample_pair; /* rt_sample.c: (logit, id) for sorting */

struct rt_sampler {
    struct rt_sample_params p; /* copied at init, read-only */
    int32_t vocab_size;        /* real vocabulary size (candidates are [0, vocab_size)) */
    uint64_t rng[4];           /* xoshiro256** state */
    uint8_t *seen;             /* owned: [ceil(vocab_size/8)] history bitmap, bit id%8 */
    uint32_t *out_count;       /* owned: [vocab_size] times each id was generated (only with a
                                  frequency or presence penalty; else NULL) */
    float *work;               /* owned: [vocab_size] processed logits */
    int32_t *cand;             /* owned: [vocab_size] surviving ids, ascending */
    double *prob;              /* owned: [vocab_size] probabilities of cand[] */
    struct rt_sample_pair *pairs; /* owned: [vocab_size] sort scratch */
};

/* Sets up `s` for a vocabulary of `vocab_size` ids (>= 1) with parameters `p` (checked) and seeds
 * the PRNG from p->seed. Errors: RT_SAMPLE_ERR_PARAM, RT_SAMPLE_ERR_NOMEM; on error `s` holds
 * nothing to free (rt_sampler_free is still safe). */
enum rt_sample_err rt_sampler_init(struct rt_sampler *s, const struct rt_sample_params *p,
                                   int32_t vocab_size);

/* Releases the scratch arrays; accepts a zeroed or half-built sampler; idempotent. */
void rt_sampler_free(struct rt_sampler *s);

/* Forgets the history and reseeds the PRNG from the parameters' seed (a fresh sequence). */
void rt_sampler_reset(struct rt_sampler *s);

/* Adds token `id` to the history the repetition penalty looks at (call for every prompt token
 * and every generated token). Errors: RT_SAMPLE_ERR_TOKEN when id is outside [0, vocab_size). */
enum rt_sample_err rt_sampler_accept(struct rt_sampler *s, int32_t id);

/* Counts a generated id for the frequency / presence penalties (rt_sampler_accept adds it to
 * the history as well: call both for each generated token). A no-op when both penalties are 0.
 * Errors: RT_SAMPLE_ERR_TOKEN when id is outside [0, vocab_size). */
enum rt_sample_err rt_sampler_accept_output(struct rt_sampler *s, int32_t id);
/* Picks the next token from `logits` [n_logits] (n_logits >= vocab_size; only the first
 * min(vocab_size, vocab_limit) entries are read) following the steps in the header comment; writes it to *out_id.
 * Does not add it to the history (call rt_sampler_accept). Errors: RT_SAMPLE_ERR_PARAM
 * (n_logits < vocab_size), RT_SAMPLE_ERR_NO_CANDIDATE (every logit is -inf or NaN). */
enum rt_sample_err rt_sampler_next(struct rt_sampler *s, const float *logits, int64_t n_logits,
                                   int32_t *out_id);

/* The survivors after steps 1-6 and their renormalised probabilities, for tests and for
 * printing candidates: returns the count n and fills cand[0..n) (ascending ids) / prob[0..n)
 * inside `s` (valid until the next call). Greedy gives n = 1 with probability 1. Returns -1 on the errors of
 * rt_sampler_next. */
int32_t rt_sampler_candidates(struct rt_sampler *s, const float *logits, int64_t n_logits);

/* Step 7 with a given draw u in [0, 1): the id among cand[0..n) (ascending ids with
 * probabilities prob[0..n), as rt_sampler_candidates leaves them in the sampler) whose cumulative
 * interval holds u; the last one absorbs rounding (the sum may be 1 - eps). n >= 1.
 * rt_sampler_next is rt_sampler_candidates, one draw from the PRNG, then this; device samplers
 * and tests that bring their own u call it directly. */
int32_t rt_sample_pick(const int32_t *cand, const double *prob, int32_t n, double u);

/* Uniform double in [0, 1) from the sampler's PRNG (exposed for tests). */
double rt_sampler_uniform(struct rt_sampler *s);

#ifdef __cplusplus
}
#endif
#endif /* QS_RT_SAMPLE_H */
