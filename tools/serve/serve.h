/*
 * serve.h - `qshard serve`: an OpenAI-compatible HTTP server over the batching engine
 * (runtime/rt_engine.h). HTTP through libmicrohttpd (one thread per connection), JSON through
 * cJSON; every connection's requests go to one engine thread that batches them all.
 *
 * Endpoints (docs/SERVE.md has the fields): POST /v1/completions, POST /v1/chat/completions,
 * GET /v1/models, GET /health, GET /metrics (Prometheus text), POST /tokenize, POST
 * /detokenize. Errors in OpenAI's shape {"error": {"message", "type", "param", "code"}}.
 * The API follows OpenAI's reference (platform.openai.com/docs/api-reference) and vLLM's
 * server (vllm/entrypoints/openai/) where OpenAI is silent: defaults from
 * generation_config.json, `ignore_eos`, `skip_special_tokens`, /tokenize.
 *
 * Life: srv_run binds the socket and answers /health with 503 while it opens the model, then
 * 200; on SIGINT or SIGTERM it stops accepting, lets running requests finish for up to
 * shutdown_timeout_s, cancels the rest, and returns 0.
 * Tests: tests/serve/test_serve.sh (the OpenAI Node SDK, raw HTTP, load).
 */
#ifndef QS_SERVE_H
#define QS_SERVE_H

#include "rt_session.h"

struct srv_opts {
    struct rt_session_opts session; /* the model (n_seqs = max_num_seqs) */
    const char *host;               /* IPv4 or IPv6 literal */
    int port;                       /* 0: any free port */
    const char *api_key;            /* NULL: none */
    const char *model_name;         /* the name in the API */
    int max_queue;                  /* choices waiting at most (429 beyond) */
    int max_batch_tokens;           /* engine step budget (0: the model's batch) */
    int timeout_s;                  /* idle connection timeout */
    size_t max_body;                /* bytes */
    int shutdown_timeout_s;
    enum rt_chat_family chat_family; /* RT_CHAT_NONE: the tokenizer's */
    uint64_t seed;                  /* base of default seeds (0: from the clock) */
    int load_delay_ms;              /* tests: wait before opening the model */
};

/* Serve until SIGINT / SIGTERM (both blocked in the calling thread and the threads it
 * starts). Returns a qshard exit code: 0 after a clean shutdown, 1 when the address cannot be
 * bound, or the exit code of the model's load failure. */
int srv_run(const struct srv_opts *o);

#endif /* QS_SERVE_H */
