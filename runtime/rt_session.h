/*
 * rt_session.h - a converted model ready for text: the session (model + tokenizer + eos set +
 * generation defaults), prompt encoding, and the generation loop (stops, streaming, logprobs,
 * timings, cancellation). `qshard run / logits / perplexity / tokenize / bench model` call it;
 * a server calls the same functions from its engine thread.
 *
 * The session (rt_session_open):
 *   - the model: rt_model_open of a `qshard convert` directory or a TP-1 rank file. A directory
 *     without manifest.json and without any *.qshard file is refused with the convert command
 *     to run (RT_ERR_FORMAT; "looks like a HuggingFace model directory" when it has
 *     config.json);
 *   - the tokenizer embedded in rank 0 (fmt_shard_tokenizer_file: tokenizer.json,
 *     tokenizer.model, tokenizer_config.json); none is fine until text is needed;
 *   - the eos set: the config's eos_token_id list, generation_config.json's eos_token_id (an int
 *     or a list), the tokenizer's eos; the chat family's end token is added per request
 *     (struct rt_gen_params.extra_eos, from rt_session_chat_end);
 *   - generation defaults from generation_config.json (temperature, top_p, top_k, min_p,
 *     repetition_penalty), used only for what the caller does not set (vLLM's
 *     generation_config "auto": model defaults under request values);
 *   - n_pick = min(model vocab_size, tokenizer ids): ids that may be generated (padded lm_head
 *     rows, e.g. Qwen2's 151936 vs 151646, are never sampled: rt_sample.h vocab_limit).
 *
 * The generation loop (rt_generate): prefill the prompt, then decode one token per step until
 * an eos id, a stop string, max_tokens, a full context or the cancel flag. Text is streamed
 * through callbacks (the loop never prints): whole UTF-8 characters only, and never a partial
 * match of a stop string that may still complete (it is held back; the stop string itself is
 * not passed on). Where the next token is chosen: on the device when the backend can
 * (rt_model_can_pick) and neither logprobs nor rt_opts.host_sample ask for the logits row,
 * else on the host (rt_sampler) from the downloaded row.
 *
 * Ownership: a session owns its model and tokenizer; everything returned through an
 * out-parameter that is malloc'd is the caller's (free(), or rt_gen_result_free). One thread
 * uses a session at a time.
 * Errors: enum rt_err (rt.h). The check that fails reports once through qs_log_error; the
 * functions here forward the code. Tokenizer failures are RT_ERR_TOKENIZER (RT_ERR_NOMEM for
 * memory), I/O of the path RT_ERR_IO, the cancel flag RT_ERR_CANCELLED.
 * Tests: ./build/test_cli_run (through the qshard binary: goldens, stops, eos, streaming,
 * vocab limit, generation defaults, --json, Ctrl-C), ./build/test_cli_tok.
 */
#ifndef QS_RT_SESSION_H
#define QS_RT_SESSION_H

#include <signal.h> /* sig_atomic_t */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rt.h"        /* struct rt_opts, enum rt_err, struct rt_exec */
#include "rt_sample.h" /* struct rt_sample_params, struct rt_sampler */
#include "rt_tok.h"    /* struct rt_tok, enum rt_chat_family, struct rt_chat_msg */

#ifdef __cplusplus
extern "C" {
#endif

/* --- the session ----------------------------------------------------------------------------- */

struct rt_session;

struct rt_session_opts {
    const char *path;     /* converted model: output directory of `qshard convert`, or a TP-1
                             rank file (borrowed for the call) */
    struct rt_opts model; /* device, threads, n_ctx, max_batch, debug switches (rt_opts_default) */
    bool tokenizer_only;  /* open rank 0 for its tokenizer only: no weights, no backend */
};

/*
 * Open the model and its tokenizer, collect the eos set and the generation defaults. With
 * tokenizer_only the model is not opened (rt_session_model is NULL) and a missing tokenizer is
 * RT_ERR_TOKENIZER. Errors: those of rt_model_open; RT_ERR_IO (the path cannot be read),
 * RT_ERR_FORMAT (not a converted model: the message says to convert it first, with the
 * command), RT_ERR_TOKENIZER (the embedded tokenizer is malformed, or has more ids than the
 * model's vocab_size), RT_ERR_NOMEM. On failure *out is NULL and nothing leaks.
 */
enum rt_err rt_session_open(const struct rt_session_opts *o, struct rt_session **out);

/* Free the session (model, tokenizer); NULL is fine. */
void rt_session_close(struct rt_session *s);

struct rt_exec *rt_session_model(const struct rt_session *s);    /* NULL when tokenizer_only */
const struct rt_tok *rt_session_tok(const struct rt_session *s); /* NULL: no tokenizer */
/* Ids the model accepts: [0, n_vocab) (config vocab_size; the tokenizer's with tokenizer_only). */
int32_t rt_session_n_vocab(const struct rt_session *s);
/* Ids that may be generated: min(n_vocab, tokenizer ids) (n_vocab without a tokenizer). */
int32_t rt_session_n_pick(const struct rt_session *s);
int rt_session_n_ctx(const struct rt_session *s);     /* KV cache length in tokens (0: no model) */
int32_t rt_session_bos(const struct rt_session *s);   /* BOS id or -1 */
/* The eos set [*n] (borrowed; every id in [0, n_vocab)). */
const int32_t *rt_session_eos(const struct rt_session *s, int *n);

/* --- generation defaults (generation_config.json) ------------------------------------------- */

/* Sampling fields, as bits of `given` and of the return value below. */
enum {
    RT_GEN_TEMPERATURE = 1u << 0,
    RT_GEN_TOP_K = 1u << 1,
    RT_GEN_TOP_P = 1u << 2,
    RT_GEN_MIN_P = 1u << 3,
    RT_GEN_REPEAT_PENALTY = 1u << 4,
};

/*
 * The model's sampling defaults applied under the caller's values: every field of *p whose bit
 * is not in `given` is replaced by generation_config.json's value when the file sets it (keys
 * temperature, top_k, top_p, min_p, repetition_penalty; values out of range are ignored with a
 * warning at open), else left as the caller's fallback. Returns the bits of the fields taken
 * from generation_config.json (for "-v: where each value came from").
 */
unsigned rt_session_sampling_defaults(const struct rt_session *s, unsigned given,
                                      struct rt_sample_params *p);

/* --- prompts --------------------------------------------------------------------------------- */

/* One prompt: exactly one of ids, msgs and text. */
struct rt_prompt {
    const char *text;               /* UTF-8, NUL-terminated: encoded as HF tokenizer(text) */
    const int32_t *ids;             /* token ids [n_ids], each in [0, n_vocab) */
    size_t n_ids;
    const struct rt_chat_msg *msgs; /* chat messages [n_msgs], rendered with the family's
                                       template (rt_chat_format), assistant header appended */
    size_t n_msgs;
    enum rt_chat_family family;     /* RT_CHAT_NONE: detected from tokenizer_config.json */
    bool no_bos;                    /* HF add_special_tokens=False */
    bool no_parse_special;          /* "<s>", "<|eot_id|>" in the text stay plain text */
    bool allow_empty;               /* "" encodes to [BOS] or [] (tokenize) instead of an error */
};

/*
 * Encode a prompt into *ids (malloc'd [*n]). Text: BOS per the tokenizer files (unless no_bos),
 * special tokens recognised (unless no_parse_special); chat: the template's own special tokens
 * always, never a double BOS. Errors: RT_ERR_ARG (not exactly one of text/ids/msgs),
 * RT_ERR_TOKEN (an id outside [0, n_vocab): names it and its position), RT_ERR_TOKENIZER (no
 * tokenizer for text, invalid UTF-8 (the byte offset is named), empty text or no tokens unless
 * allow_empty, no chat family), RT_ERR_NOMEM.
 */
enum rt_err rt_session_encode(const struct rt_session *s, const struct rt_prompt *p,
                              int32_t **ids, size_t *n);

/* The token that ends an assistant turn of the prompt's chat family (rt_chat_end_id), to stop
 * on even where generation_config.json does not list it; -1 for a prompt without msgs. */
int32_t rt_session_chat_end(const struct rt_session *s, const struct rt_prompt *p);

/* --- model steps (every model call of the commands goes through these) ----------------------- */

/* Forget the KV cache. */
void rt_session_reset(struct rt_session *s);

/* rt_exec_forward_seq (slot 0): ids[n] at positions pos .. pos+n-1; logits fp32 [n][n_vocab] when all_rows,
 * else the last row [n_vocab]; logits may be NULL. Errors: those of rt_model_forward. */
enum rt_err rt_session_forward(struct rt_session *s, const int32_t *ids, int n, int pos,
                               float *logits, bool all_rows);

/* Whether rt_session_step can choose on the device: rt_exec_can_pick and not
 * rt_opts.host_sample. */
bool rt_session_can_pick(const struct rt_session *s);

/* A sampler for this session: rt_sampler_init over n_vocab ids with p, vocab_limit set to
 * n_pick. Errors: RT_ERR_ARG (parameters rt_sample_params_check refuses), RT_ERR_NOMEM. */
enum rt_err rt_session_sampler_init(const struct rt_session *s, const struct rt_sample_params *p,
                                    struct rt_sampler *smp);

/*
 * One step: run ids[n] at positions pos.. and choose the next id with smp (not added to its
 * history). dev_pick (requires rt_session_can_pick): on the device, one PRNG draw per sampled
 * token, as rt_sampler_next; else rt_sampler_next on the last logits row, written to logits
 * (caller's [n_vocab] floats, required then). Errors: those of rt_model_forward(_pick);
 * RT_ERR_NUMERIC (no finite logit).
 */
enum rt_err rt_session_step(struct rt_session *s, struct rt_sampler *smp, const int32_t *ids,
                            int n, int pos, bool dev_pick, float *logits, int32_t *next);

/* --- generation ------------------------------------------------------------------------------ */

#define RT_GEN_MAX_STOPS 16
#define RT_GEN_MAX_LOGPROBS 20 /* top alternatives per token (OpenAI's limit) */

struct rt_gen_params {
    struct rt_sample_params sample; /* resolved parameters (rt_session_sampling_defaults) */
    long max_tokens;                /* tokens to generate; < 0: until eos, a stop string or a
                                       full context; 0: prefill only */
    const char *const *stops;       /* stop strings [n_stops] (non-empty UTF-8), matched on the
                                       generated text only */
    int n_stops;                    /* <= RT_GEN_MAX_STOPS */
    bool ignore_eos;                /* keep generating past eos ids */
    int32_t extra_eos;              /* one more eos id (rt_session_chat_end), -1: none */
    int logprobs;                   /* 0: none; N >= 1: the chosen token's logprob and the top N
                                       (<= RT_GEN_MAX_LOGPROBS) of each step, from the raw
                                       logits (log-softmax over the n_pick ids) */
    unsigned decode_flags;          /* RT_TOK_DECODE_* of the streamed text */
};

/* rt_gen_params with max_tokens -1, no stops, extra_eos -1, no logprobs, decode_flags
 * RT_TOK_DECODE_SKIP_SPECIAL, sample = rt_sample_params_default(). */
struct rt_gen_params rt_gen_params_default(void);

/* One generated token, for rt_gen_callbacks.on_token. */
struct rt_gen_token {
    int32_t id;
    long index;                  /* 0-based among the generated tokens */
    float logprob;               /* log P(id) (natural log); 0 when logprobs is off */
    int n_top;                   /* alternatives in top_ids / top_logprobs (0 when off) */
    const int32_t *top_ids;      /* borrowed for the call: [n_top], most likely first */
    const float *top_logprobs;   /* [n_top] */
};

/* Streaming. Each callback returns RT_ERR_NONE to go on, or an error (e.g. RT_ERR_IO: the
 * caller could not write) that rt_generate stops with and returns. Either may be NULL. */
struct rt_gen_callbacks {
    /* generated text that can no longer be part of a stop string; whole UTF-8 characters;
     * borrowed for the call; may hold NUL bytes (<0x00> tokens) */
    enum rt_err (*on_text)(void *user, const char *text, size_t len);
    /* each generated token (before its text), an eos or stop token excluded */
    enum rt_err (*on_token)(void *user, const struct rt_gen_token *tok);
    void *user;
    /* set (non-zero) by the caller, e.g. from a SIGINT handler: generation stops before the
     * next forward pass; NULL: never */
    const volatile sig_atomic_t *cancel;
};

enum rt_gen_finish {
    RT_GEN_FINISH_EOS = 0,         /* an eos id (not passed on) */
    RT_GEN_FINISH_STOP_STRING = 1, /* a stop string completed (not passed on) */
    RT_GEN_FINISH_LENGTH = 2,      /* max_tokens generated (also max_tokens 0) */
    RT_GEN_FINISH_CONTEXT = 3,     /* the KV cache is full */
    RT_GEN_FINISH_CANCELLED = 4,   /* the cancel flag */
    RT_GEN_FINISH_ERROR = 5,       /* a failure (the returned error) */
};

/* OpenAI's finish_reason: "stop" (eos, stop string), "length" (max tokens, context),
 * "cancelled", "error". */
const char *rt_gen_finish_reason(enum rt_gen_finish f);
/* Our detail: "eos", "stop string", "max tokens", "context full", "interrupted", "error". */
const char *rt_gen_finish_str(enum rt_gen_finish f);

struct rt_gen_result {
    enum rt_gen_finish finish;
    int32_t *ids;       /* owned: generated ids [n_ids] (an eos id excluded; the id that
                           completed a stop string included) */
    size_t n_ids;
    size_t n_prompt;    /* prompt tokens prefilled */
    long n_decode;      /* decode steps run (forward passes after the prefill) */
    double t_prefill_s; /* prefill up to the first chosen id, seconds */
    double t_decode_s;  /* every decode step and its choice, seconds */
    int stop_index;     /* which stop string matched, -1 */
    uint64_t seed;      /* the PRNG seed used */
    bool on_device;     /* the next token was chosen on the device */
};

/*
 * Generate from prompt ids[n] (each in [0, n_vocab); n >= 1) on a fresh KV cache: see the
 * header comment. The result is filled also on failure and on cancellation (what was done so
 * far; free it with rt_gen_result_free). Errors: RT_ERR_CONTEXT (the prompt leaves no position
 * to generate: n >= n_ctx; names both numbers), RT_ERR_ARG (bad parameters: stops, logprobs,
 * sampling), RT_ERR_CANCELLED (the cancel flag), those of the model steps and callbacks,
 * RT_ERR_TOKENIZER (stop strings without a tokenizer), RT_ERR_NOMEM.
 */
enum rt_err rt_generate(struct rt_session *s, const int32_t *ids, size_t n,
                        const struct rt_gen_params *p, const struct rt_gen_callbacks *cb,
                        struct rt_gen_result *res);

/* Free what rt_generate put in *r and zero it; a zeroed result is fine. */
void rt_gen_result_free(struct rt_gen_result *r);

#ifdef __cplusplus
}
#endif
#endif /* QS_RT_SESSION_H */
