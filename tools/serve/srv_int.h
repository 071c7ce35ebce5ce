/*
 * srv_int.h - what the files of the server (tools/serve/) share; private to them. The public
 * entry point is tools/serve/serve.h.
 *
 * Threads and ownership:
 *   - libmicrohttpd runs one thread per connection (srv_http.c). A completion request is
 *     parsed there (srv_api.c) into a struct srv_req and handed to the engine thread through
 *     the inbox (srv_submit); the connection thread then waits on the request's condition
 *     variable, polling its socket so a vanished client cancels the request.
 *   - The engine thread (srv_engine.c) owns the rt_engine: it adds the inbox's requests (one
 *     engine request per choice), cancels what was cancelled, and steps. The engine's
 *     callbacks (on the engine thread) append text, tokens and the end of each choice to the
 *     srv_req under its mutex and wake its connection thread.
 *   - A srv_req is reference-counted: one reference for the connection, one per choice
 *     running in the engine. The last srv_req_unref frees it.
 * Locks: struct srv.mu (inbox, metrics, live list) and struct srv_req.mu (a request's output)
 * are never held together except srv.mu -> srv_req.mu in that order.
 */
#ifndef QS_SRV_INT_H
#define QS_SRV_INT_H

#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "rt_engine.h"
#include "rt_session.h"
#include "serve.h"

#define SRV_MAX_N 128        /* choices per prompt (n) */
#define SRV_MAX_PROMPTS 256  /* prompts of one completions request */
#define SRV_MAX_MSGS 256     /* chat messages */
#define SRV_POLL_MS 20       /* how often a waiting connection looks at its socket */
#define SRV_BIG_BODY (1u << 20) /* a body this large waits for one of SRV_BIG_PARSES turns */
#define SRV_BIG_PARSES 4     /* (cJSON takes ~64 bytes per array element while it parses) */

enum srv_kind { SRV_COMPLETION = 0, SRV_CHAT = 1 };

/* One generated token, kept for logprobs. */
struct srv_tok {
    int32_t id;
    float logprob;
    int n_top;
    int32_t top_ids[RT_GEN_MAX_LOGPROBS];
    float top_lp[RT_GEN_MAX_LOGPROBS];
};

/* One choice of a response: one engine request. Fields below `out` are guarded by the
 * request's mu. */
struct srv_choice {
    struct srv_req *r;
    int index;                 /* choices[].index */
    int prompt;                /* which prompt of the request */
    struct rt_gen_params gp;   /* resolved parameters (stops point into r->body) */
    int64_t eng_id;            /* the engine's id once added, else -1 */
    /* out */
    int32_t *ids;              /* every generated id */
    size_t n_ids, cap_ids, sent_ids;
    char *text;                /* generated text so far (NUL-terminated) */
    size_t n_text, cap_text, sent_text; /* sent_text: bytes already streamed */
    struct srv_tok *toks;      /* with logprobs: every generated token */
    size_t n_toks, cap_toks, sent_toks;
    size_t lp_offset;          /* stream: text_offset (characters) of the next logprobs token */
    bool started;              /* chat stream: the role chunk went out */
    bool done, final_sent;
    enum rt_err err;
    enum rt_gen_finish finish;
    size_t n_prompt, n_completion;
    double t_first, t_last;    /* engine thread: first and latest token (seconds) */
    int n_cached;
};

struct srv_req {
    struct srv *srv;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;                  /* guarded by mu */
    enum srv_kind kind;
    char id[48];
    long long created;         /* unix seconds */
    double t_start;
    cJSON *body;               /* the parsed request (owns the stop strings) */
    const char *stops[RT_GEN_MAX_STOPS];
    bool stream, include_usage, echo;
    bool token_ids;            /* choices carry "token_ids" (vLLM's return_token_ids; always for a
                                  model without tokenizer, whose text is empty) */
    int logprobs;              /* top alternatives to return; -1: no logprobs */
    int n_prompts;
    int32_t **prompt_ids;      /* [n_prompts] each [n_prompt_ids[i]] */
    size_t *n_prompt_ids;
    char **prompt_text;        /* [n_prompts] for echo (NULL otherwise) */
    int n_choices;
    struct srv_choice *ch;     /* [n_choices] */
    atomic_bool cancel;        /* set by the connection: the engine cancels every choice */
    int n_done;                /* guarded by mu */
    bool usage_sent, done_sent;
    struct srv_req *next_in;   /* inbox link (srv.mu) */
};

/* Prometheus histogram with fixed bucket bounds. */
#define SRV_MAX_BUCKETS 20
struct srv_hist {
    int n;
    const double *le;
    unsigned long long count[SRV_MAX_BUCKETS + 1]; /* per bucket (not cumulative); last +Inf */
    double sum;
    unsigned long long total;
};

struct srv {
    struct srv_opts o;
    const char *model_name;
    struct rt_session *s;      /* NULL while loading */
    struct rt_engine *eng;
    int n_ctx;
    atomic_bool ready, draining, quit;
    pthread_mutex_t mu;
    pthread_cond_t cv;         /* the engine thread waits on it (inbox, cancel, quit) */
    struct srv_req *inbox, *inbox_tail;
    int n_inbox;               /* choices in the inbox */
    struct srv_req **live;     /* engine thread: requests with choices in the engine */
    int n_live, cap_live;
    atomic_int n_open;         /* requests accepted and not yet answered to the end */
    sem_t big_parse;           /* bodies over SRV_BIG_BODY parsed at once at most SRV_BIG_PARSES */
    pthread_t engine_thread;
    bool engine_started;
    uint64_t rng;              /* request ids and default seeds (mu) */
    /* metrics (mu) */
    struct rt_engine_stats st;
    int waiting;               /* choices waiting: inbox + the engine's queue */
    unsigned long long n_finished[3]; /* stop, length, abort (cancelled or failed) */
    unsigned long long n_http[6];     /* 2xx..5xx by status / 100 (index 2..5) */
    struct srv_hist ttft, tpot, e2e;
    double t_loaded;
};

// --- srv_engine.c ------------------------------------------------------------------------------

/* Start the engine thread over srv->eng. Errors: RT_ERR_NOMEM (thread creation). */
enum rt_err srv_engine_start(struct srv *v);
/* Stop it (pending requests are cancelled and finish) and join it. */
void srv_engine_stop(struct srv *v);
/* Queue a parsed request: 0, or 429 when the queue holds max_queue choices, 503 when the
 * server is draining. Takes one reference per choice on success. */
int srv_submit(struct srv *v, struct srv_req *r);
/* Ask the engine thread to cancel every choice of r (idempotent). */
void srv_cancel(struct srv *v, struct srv_req *r);
/* The Prometheus text of /metrics (malloc'd). */
char *srv_metrics_text(struct srv *v);
/* Count a response by its HTTP status (metrics). */
void srv_count_status(struct srv *v, int status);
/* A fresh 64-bit random number (request ids, default seeds). */
uint64_t srv_random(struct srv *v);

// --- srv_api.c ---------------------------------------------------------------------------------

/* An API error: HTTP status and OpenAI's error fields (strings borrowed or static). */
struct srv_error {
    int status;
    const char *type;
    const char *param;         /* NULL: null */
    const char *code;          /* NULL: null */
    char message[512];
};

/* Parse a completions (kind SRV_COMPLETION) or chat body into a new request (one reference,
 * the caller's). On a bad request returns NULL with *err filled (400 / 404). */
struct srv_req *srv_req_parse(struct srv *v, enum srv_kind kind, const char *body, size_t len,
                              struct srv_error *err);
void srv_req_ref(struct srv_req *r);
void srv_req_unref(struct srv_req *r);
/* The whole (non-streaming) response body once every choice is done (malloc'd); *status set
 * (200, or the error's status when a choice failed). Call with r->mu held. */
char *srv_req_response(struct srv_req *r, int *status);
/* Append what can be streamed now (SSE events) to *buf; returns false when the stream is
 * complete ([DONE] appended). Call with r->mu held. */
bool srv_req_stream(struct srv_req *r, char **buf, size_t *len, size_t *cap);
/* A request body as its JSON object, with the checks every endpoint needs before cJSON: no
 * NUL (raw or \u0000: cJSON's strings would end there), at most max_values values (too_many:
 * why that bound, for the message), then at most SRV_BIG_PARSES parses of big bodies at once,
 * one JSON text and nothing after it, an object. NULL with *err (400) otherwise. */
cJSON *srv_body_json(struct srv *v, const char *body, size_t len, size_t max_values,
                     const char *too_many, struct srv_error *err);
/* The body's "model", when given, names the served model: else false with *err (400 not a
 * string, 404 model_not_found). */
bool srv_check_model(const struct srv *v, const cJSON *o, struct srv_error *err);
/* The last library error of this thread without its "where: " prefix (rt_err_str(e) when
 * none was reported). */
const char *srv_last_msg(enum rt_err e);
/* Room in a growable buffer *buf [*cap] holding len bytes for n more and a NUL (doubling);
 * false when out of memory (the buffer unchanged). */
bool srv_reserve(char **buf, size_t len, size_t n, size_t *cap);
/* Append s[n] to *buf [*len of *cap], NUL after it; false when out of memory. */
bool srv_append(char **buf, size_t *len, size_t *cap, const char *s, size_t n);
/* The error body {"error": {...}} (malloc'd). */
char *srv_error_json(const struct srv_error *e);
/* Fill *e; returns e->status. */
int srv_error_set(struct srv_error *e, int status, const char *type, const char *param,
                  const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* The error of a failed choice (status 500/400 by the engine error). */
void srv_choice_error(const struct srv_choice *c, struct srv_error *e);

/* GET /v1/models, POST /tokenize, POST /detokenize: body (malloc'd) and *status. */
char *srv_models_json(struct srv *v);
char *srv_tokenize_json(struct srv *v, const char *body, size_t len, bool detokenize,
                        struct srv_error *err);

#endif /* QS_SRV_INT_H */
