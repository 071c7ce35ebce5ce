/*
 * cmd_bench_serve.c - `qshard bench serve [--url http://127.0.0.1:8000] [--model NAME]
 * [--concurrency 1,8,16,32,64,128,256] [--input-len 128] [--output-len 128] [--num-prompts N]
 * [-o md|json]`: a load generator for OpenAI-compatible HTTP servers (qshard serve, vllm serve),
 * modeled on vLLM's benchmarks/benchmark_serving.py with --max-concurrency: a closed loop that
 * keeps CONCURRENCY streaming /v1/completions requests in flight until N are done. Each request
 * sends --input-len random token ids (no two prompts share a prefix) and asks for exactly
 * --output-len tokens (greedy, ignore_eos). Per test: requests failed, duration, req/s, output
 * tok/s, total tok/s, TTFT / TPOT / ITL / E2E mean, p50, p99; the rows and JSON keys follow
 * `qshard bench batch` (tools/cmd_bench_batch.c), so the engine in-process and behind HTTP can be
 * compared row by row.
 *
 * HTTP: libcurl's multi interface on this one thread, one easy handle per request slot (reused:
 * its connection stays open); the SSE stream ("data: {...}" events, "data: [DONE]") is framed
 * here from the write callback, one JSON chunk at a time through cJSON. Memory per test: a few
 * numbers per request and one per output token (the inter-token gaps), never the chunks.
 *
 * Entry point: cmd_bench_serve (tools/cmd_bench.c dispatches `qshard bench serve`). Test: by hand,
 * against `qshard serve` (`qshard serve MODEL --port 0`, then --url the address it prints) or a
 * mock server streaming OpenAI's SSE; no test program runs it yet.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h> /* request bodies, SSE chunks, /v1/models, -o json */
#include <curl/curl.h>   /* HTTP: the multi interface */

#include "cli.h"     /* cli_parse, cli_cancel */
#include "cmd.h"     /* QS_EXIT_* */
#include "qs_util.h" /* qs_now_s: CLOCK_MONOTONIC */

static const char k_usage[] =
    "usage: qshard bench serve [--url http://127.0.0.1:8000] [--model NAME] [--api-key KEY]\n"
    "                          [--concurrency 1,8,16,32,64,128,256] [--input-len 128]\n"
    "                          [--output-len 128] [--num-prompts N] [-o md|json]\n"
    "\n"
    "Load on an OpenAI-compatible server (qshard serve, vllm serve), as vLLM's\n"
    "benchmark_serving with --max-concurrency: CONCURRENCY streaming /v1/completions requests\n"
    "kept in flight until N are done, each of --input-len random token ids and exactly\n"
    "--output-len generated tokens (greedy, ignore_eos). One test per concurrency, after one\n"
    "untimed warm-up request. The model is --model or the first of GET /v1/models; the key is\n"
    "--api-key or the environment's QSHARD_API_KEY. A request fails on an HTTP status other\n"
    "than 200, a transfer error, an error chunk, a stream without [DONE] or a token count other\n"
    "than --output-len; failed requests count in no latency or throughput.\n"
    "\n";
static const char k_trailer[] =
    "exit codes: 0 ok, 1 usage, 3 some request failed (the report is still printed), the\n"
    "server refused /v1/models, or interrupted, 4 the server cannot be reached\n";

#define SSE_MAX_LINE (4u << 20)   /* longest SSE line / event accepted (a chunk is ~200 bytes) */
#define ERR_BODY_MAX (64u << 10)  /* bytes of a non-200 answer kept for its error.message */
#define MODELS_MAX (16u << 20)    /* bytes of the /v1/models answer kept */
#define REASON_MAX 320            /* a failure's reason, as printed */
#define POLL_MS 100               /* curl_multi_poll wait: how soon a signal is noticed */
#define CONNECT_TIMEOUT_S 10L
#define IDLE_TIMEOUT_S 600L       /* a request receiving nothing this long fails (serve's
                                     --timeout default) */
#define MODELS_TIMEOUT_S 60L
#define ID_LO 100u                /* prompt token ids in [ID_LO, ID_HI): valid in every */
#define ID_HI 4000u               /* vocabulary we test (the demo model has 4096) */

// --- types ---------------------------------------------------------------------------------

/* A growable byte string, always NUL-terminated once allocated. */
struct bs_buf {
    char *p;
    size_t len, cap;
};

/* What every request of the run shares. */
struct bs_run {
    char *base;              /* --url without trailing '/' */
    char *completions;       /* base + "/v1/completions" */
    char *model;             /* the "model" of each request */
    struct curl_slist *hdr;  /* Content-Type, "Expect:" (none), Authorization */
    CURLM *multi;
    long in_len, out_len;
    uint64_t seed;
    uint64_t next_index;     /* requests sent over the whole run: the prompt's PRNG stream */
    bool curl_up;            /* curl_global_init done */
};

/* The numbers of one test (one concurrency); the arrays are in seconds. */
struct bs_test {
    int conc;
    long n_req;
    long n_ok, n_fail;
    double secs;             /* first request sent to last one finished */
    long long out_tokens;    /* of the successful requests */
    double *ttft, *e2e;      /* [n_ok] */
    double *tpot;            /* [n_tpot]: requests of more than one token */
    long n_tpot;
    double *itl;             /* [n_itl]: gaps between text chunks, every successful request */
    size_t n_itl, cap_itl;
    char first_fail[REASON_MAX];
};

/* One request slot: an easy handle and the state of the request it runs. */
struct bs_slot {
    CURL *h;
    struct bs_test *t;
    long out_len;
    char *body;              /* the JSON request (libcurl reads it in place) */
    bool busy;               /* in the multi handle */
    double t0;               /* request handed to libcurl */
    double t_first, t_last;  /* first and latest chunk with text */
    double t_rx;             /* latest bytes received */
    long n_text;             /* chunks with text */
    long usage_tokens;       /* usage.completion_tokens of the last chunk having it, or -1 */
    long http;               /* status, once the body starts */
    bool done;               /* data: [DONE] seen */
    bool failed;
    bool ev_has;             /* the event being read has a data line */
    char reason[REASON_MAX];
    struct bs_buf line;      /* received bytes not yet ending a line */
    struct bs_buf ev;        /* data of the event being read */
    struct bs_buf errbody;   /* a non-200 answer, first ERR_BODY_MAX bytes */
    double *itl;             /* this request's gaps, [n_itl] of [cap_itl] */
    size_t n_itl, cap_itl;
    char errbuf[CURL_ERROR_SIZE];
};

// --- small helpers -------------------------------------------------------------------------

/* Append n bytes to b (allocating it even for n = 0), keeping a NUL after them; false when out
 * of memory (b unchanged). */
static bool buf_add(struct bs_buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return false;
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return true;
}

/* Empty b, keeping its memory. */
static void buf_clear(struct bs_buf *b)
{
    b->len = 0;
    if (b->p)
        b->p[0] = '\0';
}

/* Free b's memory. */
static void buf_free(struct bs_buf *b)
{
    free(b->p);
    *b = (struct bs_buf){0};
}

/* Append x to the growable array *v of *n elements (capacity *cap); false when out of memory. */
static bool push_d(double **v, size_t *n, size_t *cap, double x)
{
    if (*n == *cap) {
        size_t c = *cap ? 2 * *cap : 64;
        double *p = realloc(*v, c * sizeof(*p));
        if (!p)
            return false;
        *v = p;
        *cap = c;
    }
    (*v)[(*n)++] = x;
    return true;
}

/* splitmix64 (Steele, Lea, Flood 2014): the next value of the stream *x. */
static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The message of an OpenAI-style error object in j ({"error": {"message": M}}, {"error": M},
 * {"object": "error", "message": M}, as vLLM and qshard serve answer) into out[n]; false when j
 * is no error object. */
static bool error_message(const cJSON *j, char *out, size_t n)
{
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    const cJSON *obj = cJSON_GetObjectItemCaseSensitive(j, "object");
    const cJSON *m = NULL;
    if (cJSON_IsString(e))
        m = e;
    else if (cJSON_IsObject(e))
        m = cJSON_GetObjectItemCaseSensitive(e, "message");
    else if (cJSON_IsString(obj) && !strcmp(obj->valuestring, "error"))
        m = cJSON_GetObjectItemCaseSensitive(j, "message");
    else if (!e)
        return false;
    snprintf(out, n, "%s", cJSON_IsString(m) ? m->valuestring : "(no message)");
    return true;
}

/* What a non-200 answer body says: its error message when it is an OpenAI error object, else
 * its first 200 bytes (control characters as spaces), into out[n]. */
static void body_reason(const struct bs_buf *b, char *out, size_t n)
{
    cJSON *j = b->len ? cJSON_ParseWithLength(b->p, b->len) : NULL;
    if (!j || !error_message(j, out, n)) {
        snprintf(out, n, "%.200s", b->len ? b->p : "(empty body)");
        for (char *c = out; *c; c++)
            *c = (unsigned char)*c < 0x20 ? ' ' : *c;
    }
    cJSON_Delete(j);
}

/* Mark s failed with a printf-style reason (the first one stays); returns false, so that a
 * write callback can `return slot_fail(...)` to stop the transfer. */
static bool slot_fail(struct bs_slot *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool slot_fail(struct bs_slot *s, const char *fmt, ...)
{
    if (s->failed)
        return false;
    s->failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->reason, sizeof(s->reason), fmt, ap);
    va_end(ap);
    return false;
}

// --- the SSE stream ------------------------------------------------------------------------

/* One event's data (a JSON chunk or "[DONE]", NUL-terminated, n bytes) received at `now`: the
 * first chunk with text (or token_ids) sets TTFT, the next ones add an inter-token gap; usage
 * gives the token count. False (failure recorded) stops the transfer. */
static bool sse_event(struct bs_slot *s, const char *data, size_t n, double now)
{
    if (s->done)
        return true; /* after [DONE]: nothing more counts */
    if (n == 6 && !memcmp(data, "[DONE]", 6)) {
        s->done = true;
        return true;
    }
    cJSON *j = cJSON_ParseWithLength(data, n);
    if (!j)
        return slot_fail(s, "a chunk that is not JSON: '%.80s'", data);
    char msg[REASON_MAX - 32];
    bool ok = true;
    if (error_message(j, msg, sizeof(msg))) {
        ok = slot_fail(s, "error chunk: %s", msg);
        goto out;
    }
    const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(c0, "text");
    const cJSON *tids = cJSON_GetObjectItemCaseSensitive(c0, "token_ids"); /* vLLM's extension;
                                           qshard serve sends it for a model without tokenizer */
    if ((cJSON_IsString(text) && text->valuestring[0]) ||
        (cJSON_IsArray(tids) && cJSON_GetArraySize(tids) > 0)) {
        if (s->n_text == 0)
            s->t_first = now;
        else if (!push_d(&s->itl, &s->n_itl, &s->cap_itl, now - s->t_last))
            ok = slot_fail(s, "out of memory");
        s->t_last = now;
        s->n_text++;
    }
    const cJSON *usage = cJSON_GetObjectItemCaseSensitive(j, "usage");
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(usage, "completion_tokens");
    if (cJSON_IsNumber(ct))
        s->usage_tokens = (long)ct->valuedouble;
out:
    cJSON_Delete(j);
    return ok;
}

/* One SSE line (without its "\n" or "\r\n", n bytes) received at `now`: a "data:" line adds to
 * the event, an empty line ends it; comments and other fields (event:, id:, retry:) are
 * ignored, as the WHATWG EventSource parser does. False (failure recorded) stops the transfer. */
static bool sse_line(struct bs_slot *s, const char *l, size_t n, double now)
{
    if (n == 0) {
        if (!s->ev_has)
            return true;
        const bool ok = sse_event(s, s->ev.p, s->ev.len, now);
        buf_clear(&s->ev);
        s->ev_has = false;
        return ok;
    }
    if (n < 5 || memcmp(l, "data:", 5))
        return true;
    l += 5, n -= 5;
    if (n && *l == ' ')
        l++, n--;
    if (s->ev.len + n + 1 > SSE_MAX_LINE)
        return slot_fail(s, "an SSE event longer than %u bytes", SSE_MAX_LINE);
    if ((s->ev_has && !buf_add(&s->ev, "\n", 1)) || !buf_add(&s->ev, l, n))
        return slot_fail(s, "out of memory");
    s->ev_has = true;
    return true;
}

/* Consume the complete lines of s->line, received at `now`, keeping a partial last line for
 * the next callback; at the end of the stream (eof) the partial line and a pending event count
 * too (a server that omits the last blank line). False (failure recorded) stops the transfer. */
static bool sse_feed(struct bs_slot *s, double now, bool eof)
{
    size_t at = 0;
    bool ok = true;
    while (ok && at < s->line.len) {
        const char *nl = memchr(s->line.p + at, '\n', s->line.len - at);
        if (!nl && !eof)
            break;
        const size_t end = nl ? (size_t)(nl - s->line.p) : s->line.len;
        size_t n = end - at;
        if (n && s->line.p[at + n - 1] == '\r')
            n--;
        ok = sse_line(s, s->line.p + at, n, now);
        at = nl ? end + 1 : end;
    }
    if (s->line.len) {
        memmove(s->line.p, s->line.p + at, s->line.len - at);
        s->line.len -= at;
        s->line.p[s->line.len] = '\0';
    }
    if (ok && eof)
        ok = sse_line(s, "", 0, now);
    if (ok && s->line.len > SSE_MAX_LINE)
        return slot_fail(s, "an SSE line longer than %u bytes", SSE_MAX_LINE);
    return ok;
}

/* libcurl's write callback of a completion request: the SSE stream of a 200 answer, or the
 * first ERR_BODY_MAX bytes of any other. Hot path: once per received block of every stream.
 * Returning less than size * nmemb stops the transfer (a failure is recorded first). */
static size_t on_stream(char *p, size_t size, size_t nmemb, void *user)
{
    struct bs_slot *s = user;
    const size_t n = size * nmemb;
    const double now = qs_now_s();
    s->t_rx = now;
    if (!s->http)
        curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &s->http);
    if (s->http != 200) {
        const size_t keep = s->errbody.len >= ERR_BODY_MAX ? 0
                          : n < ERR_BODY_MAX - s->errbody.len ? n : ERR_BODY_MAX - s->errbody.len;
        return buf_add(&s->errbody, p, keep) ? n : 0;
    }
    if (s->failed)
        return 0;
    if (!buf_add(&s->line, p, n)) {
        slot_fail(s, "out of memory");
        return 0;
    }
    return sse_feed(s, now, false) ? n : 0;
}

/* libcurl's write callback of GET /v1/models: the first MODELS_MAX bytes into a bs_buf. */
static size_t on_body(char *p, size_t size, size_t nmemb, void *user)
{
    struct bs_buf *b = user;
    const size_t n = size * nmemb;
    const size_t keep = b->len >= MODELS_MAX ? 0 : n < MODELS_MAX - b->len ? n : MODELS_MAX - b->len;
    return buf_add(b, p, keep) ? n : 0;
}

// --- requests ------------------------------------------------------------------------------

/* The JSON body of request number `index` of the run (malloc'd; NULL when out of memory): its
 * prompt is in_len ids uniform in [ID_LO, ID_HI) from the splitmix64 stream of (seed, index),
 * so every prompt differs from the first token on (no prefix-cache hits). */
static char *request_body(const struct bs_run *r, uint64_t index)
{
    char *out = NULL;
    cJSON *j = cJSON_CreateObject();
    int *ids = malloc((size_t)r->in_len * sizeof(int));
    if (!j || !ids)
        goto cleanup;
    uint64_t x = r->seed ^ (index + 1) * 0xd1b54a32d192ed03ull;
    for (long i = 0; i < r->in_len; i++)
        ids[i] = (int)(ID_LO + splitmix64(&x) % (ID_HI - ID_LO));
    cJSON *opts = cJSON_CreateObject();
    if (!cJSON_AddItemToObject(j, "stream_options", opts)) {
        cJSON_Delete(opts);
        goto cleanup;
    }
    cJSON *prompt = cJSON_CreateIntArray(ids, (int)r->in_len);
    if (!cJSON_AddStringToObject(j, "model", r->model) ||
        !cJSON_AddItemToObject(j, "prompt", prompt) ||
        !cJSON_AddNumberToObject(j, "max_tokens", (double)r->out_len) ||
        !cJSON_AddNumberToObject(j, "temperature", 0) ||
        !cJSON_AddTrueToObject(j, "ignore_eos") || !cJSON_AddTrueToObject(j, "stream") ||
        !cJSON_AddTrueToObject(opts, "include_usage")) {
        if (prompt && !cJSON_GetObjectItemCaseSensitive(j, "prompt"))
            cJSON_Delete(prompt);
        goto cleanup;
    }
    out = cJSON_PrintUnformatted(j);
cleanup:
    free(ids);
    cJSON_Delete(j);
    return out;
}

/* Set up slot s of test t: an easy handle posting to r->completions with the run's headers and
 * this file's callbacks. No proxy (as benchmark_serving's aiohttp session: a proxy would be in
 * every number). Reports once; returns an exit code. */
static int slot_init(const struct bs_run *r, struct bs_slot *s, struct bs_test *t)
{
    s->t = t;
    s->out_len = r->out_len;
    s->h = curl_easy_init();
    if (!s->h) {
        qs_log_error(__func__, "curl_easy_init failed");
        return QS_EXIT_RUNTIME;
    }
    CURLcode c = curl_easy_setopt(s->h, CURLOPT_URL, r->completions);
    if (!c)
        c = curl_easy_setopt(s->h, CURLOPT_HTTPHEADER, r->hdr);
    if (!c)
        c = curl_easy_setopt(s->h, CURLOPT_WRITEFUNCTION, on_stream);
    if (!c)
        c = curl_easy_setopt(s->h, CURLOPT_WRITEDATA, s);
    if (!c)
        c = curl_easy_setopt(s->h, CURLOPT_PRIVATE, s);
    if (!c)
        c = curl_easy_setopt(s->h, CURLOPT_ERRORBUFFER, s->errbuf);
    if (!c)
        c = curl_easy_setopt(s->h, CURLOPT_NOSIGNAL, 1L);
    if (!c)
        c = curl_easy_setopt(s->h, CURLOPT_NOPROXY, "*");
    if (!c)
        c = curl_easy_setopt(s->h, CURLOPT_CONNECTTIMEOUT, CONNECT_TIMEOUT_S);
    if (!c)
        c = curl_easy_setopt(s->h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    if (!c)
        c = curl_easy_setopt(s->h, CURLOPT_LOW_SPEED_TIME, IDLE_TIMEOUT_S);
    if (!c)
        c = curl_easy_setopt(s->h, CURLOPT_POST, 1L);
    if (c) {
        qs_log_error(__func__, "curl_easy_setopt: %s", curl_easy_strerror(c));
        return QS_EXIT_RUNTIME;
    }
    return QS_EXIT_OK;
}

/* Send the run's next request on the idle slot s: a new body, the clock started, the handle
 * added to the multi handle. Reports once; returns an exit code. */
static int slot_start(struct bs_run *r, struct bs_slot *s)
{
    free(s->body);
    s->body = request_body(r, r->next_index++);
    if (!s->body) {
        qs_log_error(__func__, "out of memory for a request of %ld tokens", r->in_len);
        return QS_EXIT_RUNTIME;
    }
    s->t_first = s->t_last = s->t_rx = 0;
    s->n_text = 0;
    s->usage_tokens = -1;
    s->http = 0;
    s->done = s->failed = s->ev_has = false;
    s->reason[0] = s->errbuf[0] = '\0';
    s->n_itl = 0;
    buf_clear(&s->line);
    buf_clear(&s->ev);
    buf_clear(&s->errbody);
    CURLcode c = curl_easy_setopt(s->h, CURLOPT_POSTFIELDS, s->body);
    if (!c)
        c = curl_easy_setopt(s->h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(s->body));
    if (c) {
        qs_log_error(__func__, "curl_easy_setopt: %s", curl_easy_strerror(c));
        return QS_EXIT_RUNTIME;
    }
    s->t0 = qs_now_s();
    const CURLMcode mc = curl_multi_add_handle(r->multi, s->h);
    if (mc) {
        qs_log_error(__func__, "curl_multi_add_handle: %s", curl_multi_strerror(mc));
        return QS_EXIT_RUNTIME;
    }
    s->busy = true;
    return QS_EXIT_OK;
}

/* The request of slot s ended with libcurl result `res` at `now`: decide success (status 200,
 * no transfer error, no error chunk, [DONE] seen, exactly out_len tokens) and add its numbers,
 * or its failure, to s->t. */
static void slot_finish(struct bs_slot *s, CURLcode res, double now)
{
    struct bs_test *t = s->t;
    char msg[REASON_MAX - 32];
    long code = 0;
    curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &code);
    if (code && code != 200) {
        body_reason(&s->errbody, msg, sizeof(msg));
        slot_fail(s, "HTTP %ld: %s", code, msg);
    } else if (res != CURLE_OK) {
        slot_fail(s, "%s", s->errbuf[0] ? s->errbuf : curl_easy_strerror(res));
    }
    if (!s->failed)
        sse_feed(s, s->t_rx ? s->t_rx : now, true);
    if (!s->failed && !s->done)
        slot_fail(s, "the stream ended without data: [DONE]");
    const long tokens = s->usage_tokens >= 0 ? s->usage_tokens : s->n_text;
    if (!s->failed && tokens != s->out_len)
        slot_fail(s, "%ld output tokens, expected %ld (ignore_eos was asked)", tokens,
                  s->out_len);
    if (!s->failed && s->n_text == 0)
        slot_fail(s, "no chunk with text or token_ids");
    if (!s->failed)
        for (size_t i = 0; i < s->n_itl; i++)
            if (!push_d(&t->itl, &t->n_itl, &t->cap_itl, s->itl[i])) {
                slot_fail(s, "out of memory for the inter-token gaps");
                break;
            }
    if (s->failed) {
        if (t->n_fail++ == 0)
            snprintf(t->first_fail, sizeof(t->first_fail), "%s", s->reason);
        return;
    }
    const double e2e = (s->t_rx ? s->t_rx : now) - s->t0, ttft = s->t_first - s->t0;
    t->ttft[t->n_ok] = ttft;
    t->e2e[t->n_ok] = e2e;
    if (tokens > 1)
        t->tpot[t->n_tpot++] = (e2e - ttft) / (double)(tokens - 1);
    t->n_ok++;
    t->out_tokens += tokens;
}

/* Free what slot s holds (its handle out of the multi handle first). */
static void slot_free(CURLM *m, struct bs_slot *s)
{
    if (s->busy)
        curl_multi_remove_handle(m, s->h);
    curl_easy_cleanup(s->h);
    free(s->body);
    free(s->itl);
    buf_free(&s->line);
    buf_free(&s->ev);
    buf_free(&s->errbody);
}

/* Free the arrays of test t. */
static void test_free(struct bs_test *t)
{
    free(t->ttft);
    free(t->e2e);
    free(t->tpot);
    free(t->itl);
    *t = (struct bs_test){0};
}

/* One test: n_req requests, conc of them in flight until all are sent (closed loop: a finished
 * request's slot sends the next at once), numbers into *t (test_free frees them). Stops early
 * on a signal (cli_cancel). Reports once; returns an exit code (QS_EXIT_OK when the requests
 * ran, whatever their outcome). */
static int test_run(struct bs_run *r, int conc, long n_req, struct bs_test *t)
{
    *t = (struct bs_test){.conc = conc, .n_req = n_req};
    const long n_slots = conc < n_req ? conc : n_req;
    struct bs_slot *slots = calloc((size_t)n_slots, sizeof(*slots));
    t->ttft = malloc((size_t)n_req * sizeof(double));
    t->e2e = malloc((size_t)n_req * sizeof(double));
    t->tpot = malloc((size_t)n_req * sizeof(double));
    int rc = QS_EXIT_OK;
    long started = 0, done = 0;
    if (!slots || !t->ttft || !t->e2e || !t->tpot) {
        qs_log_error(__func__, "out of memory for %ld requests", n_req);
        rc = QS_EXIT_RUNTIME;
        goto cleanup;
    }
    for (long i = 0; i < n_slots && !rc; i++)
        rc = slot_init(r, &slots[i], t);
    const double t0 = qs_now_s();
    for (long i = 0; i < n_slots && !rc; i++, started++)
        rc = slot_start(r, &slots[i]);
    while (!rc && done < n_req && !cli_cancel) {
        int running = 0, left = 0;
        CURLMcode mc = curl_multi_perform(r->multi, &running);
        for (CURLMsg *m; !mc && !rc && (m = curl_multi_info_read(r->multi, &left));) {
            if (m->msg != CURLMSG_DONE)
                continue;
            const double now = qs_now_s();
            const CURLcode res = m->data.result; /* m is invalid once the handle is removed */
            void *priv = NULL;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, &priv);
            struct bs_slot *s = priv;
            curl_multi_remove_handle(r->multi, s->h);
            s->busy = false;
            slot_finish(s, res, now);
            done++;
            if (started < n_req)
                rc = slot_start(r, s), started++;
        }
        if (!mc && !rc && done < n_req)
            mc = curl_multi_poll(r->multi, NULL, 0, POLL_MS, NULL);
        if (mc) {
            qs_log_error(__func__, "curl_multi: %s", curl_multi_strerror(mc));
            rc = QS_EXIT_RUNTIME;
        }
    }
    t->secs = qs_now_s() - t0;
cleanup:
    for (long i = 0; slots && i < n_slots; i++)
        slot_free(r->multi, &slots[i]);
    free(slots);
    return rc;
}

// --- the run -------------------------------------------------------------------------------

/* Set up *r from the options: --url checked (http or https), the URLs, the headers (the key
 * from --api-key or QSHARD_API_KEY), libcurl and its multi handle. Reports once; returns an
 * exit code (usage for a bad URL). run_close frees *r, also after a failure. */
static int run_open(const struct cli_args *a, struct bs_run *r)
{
    r->in_len = a->input_len;
    r->out_len = a->output_len;
    r->seed = a->seed;
    if (curl_global_init(CURL_GLOBAL_DEFAULT)) {
        qs_log_error(__func__, "curl_global_init failed");
        return QS_EXIT_RUNTIME;
    }
    r->curl_up = true;
    int rc = QS_EXIT_OK;
    char *scheme = NULL;
    CURLU *u = curl_url();
    if (!u || curl_url_set(u, CURLUPART_URL, a->url, 0) ||
        curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) ||
        (strcmp(scheme, "http") && strcmp(scheme, "https"))) {
        rc = cli_usage_error("--url must be an http:// or https:// URL, got '%s'", a->url);
        goto cleanup;
    }
    size_t n = strlen(a->url);
    while (n && a->url[n - 1] == '/')
        n--;
    if (n >= 3 && !memcmp(a->url + n - 3, "/v1", 3)) /* the OpenAI base URL: its server */
        n -= 3;
    while (n && a->url[n - 1] == '/')
        n--;
    const char *key = a->api_key ? a->api_key : getenv("QSHARD_API_KEY");
    char *auth = NULL;
    /* "Expect:" turns off libcurl's 100-continue wait on large bodies (long prompts) */
    const char *lines[3] = {"Content-Type: application/json", "Expect:", NULL};
    rc = QS_EXIT_RUNTIME;
    if (key && *key && asprintf(&auth, "Authorization: Bearer %s", key) < 0) {
        auth = NULL;
        goto nomem;
    }
    lines[2] = auth;
    r->base = strndup(a->url, n);
    if (!r->base || asprintf(&r->completions, "%s/v1/completions", r->base) < 0) {
        r->completions = NULL;
        goto nomem;
    }
    for (size_t i = 0; i < 3 && lines[i]; i++) {
        struct curl_slist *h = curl_slist_append(r->hdr, lines[i]);
        if (!h)
            goto nomem;
        r->hdr = h;
    }
    r->multi = curl_multi_init();
    if (r->multi)
        rc = QS_EXIT_OK;
nomem:
    if (rc)
        qs_log_error(__func__, "out of memory setting up libcurl");
    free(auth);
cleanup:
    curl_free(scheme);
    curl_url_cleanup(u);
    return rc;
}

/* Free what run_open and fetch_models set up in r. */
static void run_close(struct bs_run *r)
{
    if (r->multi)
        curl_multi_cleanup(r->multi);
    curl_slist_free_all(r->hdr);
    free(r->base);
    free(r->completions);
    free(r->model);
    if (r->curl_up)
        curl_global_cleanup();
}

/* GET {url}/v1/models: checks the server answers, and names the model (`want`, else the first
 * data[].id) into r->model. Reports once; returns an exit code: 4 when the server cannot be
 * reached, 3 for an answer other than 200 or without a model. */
static int fetch_models(struct bs_run *r, const char *want)
{
    char err[CURL_ERROR_SIZE] = "", msg[REASON_MAX], *url = NULL;
    struct bs_buf body = {0};
    cJSON *j = NULL;
    int rc = QS_EXIT_RUNTIME;
    CURL *h = curl_easy_init();
    if (!h || asprintf(&url, "%s/v1/models", r->base) < 0) {
        url = NULL;
        qs_log_error(__func__, "out of memory setting up libcurl");
        goto cleanup;
    }
    CURLcode c = curl_easy_setopt(h, CURLOPT_URL, url);
    if (!c)
        c = curl_easy_setopt(h, CURLOPT_HTTPHEADER, r->hdr);
    if (!c)
        c = curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    if (!c)
        c = curl_easy_setopt(h, CURLOPT_WRITEDATA, &body);
    if (!c)
        c = curl_easy_setopt(h, CURLOPT_ERRORBUFFER, err);
    if (!c)
        c = curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    if (!c)
        c = curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
    if (!c)
        c = curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, CONNECT_TIMEOUT_S);
    if (!c)
        c = curl_easy_setopt(h, CURLOPT_TIMEOUT, MODELS_TIMEOUT_S);
    if (c) {
        qs_log_error(__func__, "curl_easy_setopt: %s", curl_easy_strerror(c));
        goto cleanup;
    }
    c = curl_easy_perform(h);
    if (c) {
        qs_log_error(__func__, "cannot reach %s: %s", r->base, err[0] ? err : curl_easy_strerror(c));
        rc = QS_EXIT_IO;
        goto cleanup;
    }
    long code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    if (code != 200) {
        body_reason(&body, msg, sizeof(msg));
        qs_log_error(__func__, "GET %s: HTTP %ld: %s", url, code, msg);
        goto cleanup;
    }
    const cJSON *id = NULL;
    if (!want) {
        j = body.len ? cJSON_ParseWithLength(body.p, body.len) : NULL;
        id = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "data"), 0), "id");
        if (!cJSON_IsString(id)) {
            qs_log_error(__func__, "GET %s: no model in the answer (data[0].id); name one with "
                         "--model NAME", url);
            goto cleanup;
        }
    }
    r->model = strdup(want ? want : id->valuestring);
    if (!r->model) {
        qs_log_error(__func__, "out of memory");
        goto cleanup;
    }
    rc = QS_EXIT_OK;
cleanup:
    cJSON_Delete(j);
    buf_free(&body);
    free(url);
    curl_easy_cleanup(h);
    return rc;
}

// --- the report ----------------------------------------------------------------------------

/* The date now, UTC, as "2025-06-01T12:00:00Z", into out[n]. */
static void date_utc(char *out, size_t n)
{
    const time_t now = time(NULL);
    struct tm tm;
    if (!gmtime_r(&now, &tm) || !strftime(out, n, "%Y-%m-%dT%H:%M:%SZ", &tm))
        snprintf(out, n, "unknown");
}

/* The markdown header: a line naming the server, model, lengths and date, then the table head
 * (the columns of bench batch where they apply). */
static void report_md_head(const struct bs_run *r, const char *date)
{
    printf("qshard bench serve: %s, model %s, input %ld, output %ld tokens, %s\n\n"
           "| concurrency | requests | failed | in | out | seconds | req/s | output tok/s "
           "| total tok/s | TTFT mean / p50 / p99 ms | TPOT mean / p50 / p99 ms "
           "| ITL mean / p50 / p99 ms | E2E mean / p50 / p99 ms |\n"
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
           r->base, r->model, r->in_len, r->out_len, date);
}

/* Add the mean / p50 / p99 of s to o as KEY_mean, KEY_p50, KEY_p99 (ms). */
static void json_sum(cJSON *o, const char *key, struct cli_summary s)
{
    char k[32];
    snprintf(k, sizeof(k), "%s_mean", key);
    cJSON_AddNumberToObject(o, k, s.mean);
    snprintf(k, sizeof(k), "%s_p50", key);
    cJSON_AddNumberToObject(o, k, s.p50);
    snprintf(k, sizeof(k), "%s_p99", key);
    cJSON_AddNumberToObject(o, k, s.p99);
}

/* The numbers of test t (its arrays sorted on the way): a markdown row, or an object added to
 * the JSON array `tests`. Throughputs count the successful requests over the test's time, as
 * benchmark_serving. Returns false when out of memory (JSON). */
static bool report_test(const struct bs_run *r, struct bs_test *t, cJSON *tests)
{
    const double secs = t->secs > 0 ? t->secs : 1e-9;
    const double req_s = (double)t->n_ok / secs, out_tps = (double)t->out_tokens / secs;
    const double tot_tps = (double)(t->out_tokens + t->n_ok * r->in_len) / secs;
    const struct cli_summary ttft = cli_summarize(t->ttft, (size_t)t->n_ok, 1e3);
    const struct cli_summary tpot = cli_summarize(t->tpot, (size_t)t->n_tpot, 1e3);
    const struct cli_summary itl = cli_summarize(t->itl, t->n_itl, 1e3);
    const struct cli_summary e2e = cli_summarize(t->e2e, (size_t)t->n_ok, 1e3);
    if (!tests) {
        printf("| %d | %ld | %ld | %ld | %ld | %.2f | %.2f | %.1f | %.1f | %.1f / %.1f / %.1f "
               "| %.2f / %.2f / %.2f | %.2f / %.2f / %.2f | %.1f / %.1f / %.1f |\n",
               t->conc, t->n_req, t->n_fail, r->in_len, r->out_len, t->secs, req_s, out_tps,
               tot_tps, ttft.mean, ttft.p50, ttft.p99, tpot.mean, tpot.p50, tpot.p99, itl.mean,
               itl.p50, itl.p99, e2e.mean, e2e.p50, e2e.p99);
        fflush(stdout);
        return true;
    }
    cJSON *o = cJSON_CreateObject();
    if (!o || !cJSON_AddItemToArray(tests, o)) {
        cJSON_Delete(o);
        return false;
    }
    cJSON_AddNumberToObject(o, "concurrency", t->conc);
    cJSON_AddNumberToObject(o, "num_prompts", (double)t->n_req);
    cJSON_AddNumberToObject(o, "failed", (double)t->n_fail);
    cJSON_AddNumberToObject(o, "input_len", (double)r->in_len);
    cJSON_AddNumberToObject(o, "output_len", (double)r->out_len);
    cJSON_AddNumberToObject(o, "output_tokens", (double)t->out_tokens);
    cJSON_AddNumberToObject(o, "seconds", t->secs);
    cJSON_AddNumberToObject(o, "req_s", req_s);
    cJSON_AddNumberToObject(o, "output_tok_s", out_tps);
    cJSON_AddNumberToObject(o, "total_tok_s", tot_tps);
    json_sum(o, "ttft_ms", ttft);
    json_sum(o, "tpot_ms", tpot);
    json_sum(o, "itl_ms", itl);
    json_sum(o, "e2e_ms", e2e);
    return true;
}

/* Print the JSON report root on stdout (one line). Returns false when out of memory. */
static bool report_json(const cJSON *root)
{
    char *js = cJSON_PrintUnformatted(root);
    if (!js)
        return false;
    printf("%s\n", js);
    free(js);
    return true;
}

/* The tests of the run: the untimed warm-up request, then one test per --concurrency value,
 * each reported as it ends (md) or into `tests` (json). *failed: whether any request failed.
 * Reports once; returns an exit code. */
static int run_tests(const struct cli_args *a, struct bs_run *r, const char *date, cJSON *tests,
                     bool *failed)
{
    struct bs_test t;
    int rc = test_run(r, 1, 1, &t);
    if (!rc && !cli_cancel && t.n_fail) {
        qs_log_error(__func__, "the warm-up request to %s failed: %s", r->completions,
                     t.first_fail);
        rc = QS_EXIT_RUNTIME;
    }
    test_free(&t);
    if (!rc && !cli_cancel && !tests)
        report_md_head(r, date);
    for (int i = 0; i < a->n_conc && !rc && !cli_cancel; i++) {
        const int conc = (int)a->conc[i];
        const long n_req = a->num_prompts > 0 ? a->num_prompts : (4L * conc > 16 ? 4L * conc : 16);
        rc = test_run(r, conc, n_req, &t);
        if (!rc && !cli_cancel && !report_test(r, &t, tests)) {
            qs_log_error(__func__, "out of memory for the report");
            rc = QS_EXIT_RUNTIME;
        }
        if (!rc && !cli_cancel && t.n_fail) {
            qs_log_error(__func__, "concurrency %d: %ld of %ld request%s failed; the first: %s",
                         conc, t.n_fail, n_req, cli_plural(n_req), t.first_fail);
            *failed = true;
        }
        test_free(&t);
    }
    return rc;
}

/* `qshard bench serve`: parse, reach the server, run the tests, print the report. Returns the
 * exit code: 0 when every request succeeded, 3 when some failed (the report printed anyway), the
 * server refused /v1/models or a signal came, 1 usage, 4 the server cannot be reached. */
int cmd_bench_serve(int argc, char **argv)
{
    struct cli_args a;
    int rc = cli_parse(CLI_BENCH_SERVE, "qshard bench serve", k_usage, k_trailer, argc, argv, &a);
    if (rc)
        return rc == CLI_HELP ? QS_EXIT_OK : rc;
    if (a.n_pos)
        return cli_usage_error("takes no positional argument, got '%s'", a.pos[0]);
    if (a.n_conc == 0) /* the table reads a lone "0" as an empty list */
        return cli_usage_error("--concurrency needs at least one count >= 1");
    struct bs_run r = {0};
    cJSON *root = NULL, *tests = NULL;
    bool failed = false;
    char date[32];
    date_utc(date, sizeof(date));
    rc = run_open(&a, &r);
    if (!rc)
        rc = fetch_models(&r, a.served_model_name);
    const bool json = a.output && !strcmp(a.output, "json");
    if (!rc && json) {
        root = cJSON_CreateObject();
        if (!root || !cJSON_AddStringToObject(root, "url", r.base) ||
            !cJSON_AddStringToObject(root, "model", r.model) ||
            !cJSON_AddNumberToObject(root, "input_len", (double)r.in_len) ||
            !cJSON_AddNumberToObject(root, "output_len", (double)r.out_len) ||
            !cJSON_AddStringToObject(root, "date", date) ||
            !(tests = cJSON_AddArrayToObject(root, "tests"))) {
            qs_log_error(__func__, "out of memory for the report");
            rc = QS_EXIT_RUNTIME;
        }
    }
    if (!rc) {
        cli_catch_signals();
        rc = run_tests(&a, &r, date, tests, &failed);
    }
    if (!rc && json && !report_json(root)) { /* after a signal too: the tests done */
        qs_log_error(__func__, "out of memory for the report");
        rc = QS_EXIT_RUNTIME;
    }
    cJSON_Delete(root);
    run_close(&r);
    if (!rc && cli_cancel) {
        cli_report_cancel();
        rc = QS_EXIT_RUNTIME;
    }
    if (!rc)
        rc = cli_flush_stdout();
    return rc ? rc : failed ? QS_EXIT_RUNTIME : QS_EXIT_OK;
}
