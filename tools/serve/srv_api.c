/*
 * srv_api.c - the OpenAI API of the server (tools/serve/srv_int.h): request bodies of
 * /v1/completions and /v1/chat/completions into struct srv_req (every field checked: type,
 * range, the context), and the responses: whole JSON bodies, SSE chunks, logprobs, errors,
 * /v1/models, /tokenize, /detokenize.
 *
 * Field meanings: OpenAI's API reference (Completions and Chat Completions); where OpenAI is
 * silent or the model needs more, vLLM's protocol (vllm/entrypoints/openai/protocol.py):
 * top_k (-1 off), min_p, repetition_penalty, ignore_eos, skip_special_tokens, /tokenize.
 * Defaults: temperature 1, top_p 1, top_k off, min_p 0, penalties off, then
 * generation_config.json's values for the fields the request leaves out (vLLM's
 * --generation-config auto). max_tokens: 16 for completions (OpenAI), what the context leaves
 * for chat.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <time.h>

#include "cli.h" /* cli_utf8_invalid_at */
#include "qs_log.h"
#include "qs_util.h"
#include "srv_int.h"

int srv_error_set(struct srv_error *e, int status, const char *type, const char *param,
                  const char *code, const char *fmt, ...)
{
    e->status = status;
    e->type = type;
    e->param = param;
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
    return status;
}

char *srv_error_json(const struct srv_error *e)
{
    cJSON *o = cJSON_CreateObject(), *x = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(x, "message", e->message);
    cJSON_AddStringToObject(x, "type", e->type ? e->type : "invalid_request_error");
    if (e->param)
        cJSON_AddStringToObject(x, "param", e->param);
    else
        cJSON_AddNullToObject(x, "param");
    if (e->code)
        cJSON_AddStringToObject(x, "code", e->code);
    else
        cJSON_AddNullToObject(x, "code");
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

const char *srv_last_msg(enum rt_err e)
{
    const char *m = qs_log_last();
    if (!m[0])
        return rt_err_str(e);
    const char *c = strstr(m, ": ");
    return c ? c + 2 : m;
}

void srv_choice_error(const struct srv_choice *c, struct srv_error *e)
{
    if (c->err == RT_ERR_CONTEXT || c->err == RT_ERR_ARG || c->err == RT_ERR_TOKEN ||
        c->err == RT_ERR_KV_FULL)
        srv_error_set(e, 400, "invalid_request_error", NULL, NULL, "%s", rt_err_str(c->err));
    else
        srv_error_set(e, 500, "server_error", NULL, NULL, "the request failed: %s",
                      rt_err_str(c->err));
}

// --- request fields ------------------------------------------------------------------------------

/* A request being parsed. */
struct parse {
    struct srv *v;
    const cJSON *o;
    struct srv_error *err;
    bool bad;
};

static const cJSON *field(const struct parse *p, const char *key)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(p->o, key);
    return x && !cJSON_IsNull(x) ? x : NULL;
}

static void bad(struct parse *p, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void bad(struct parse *p, const char *param, const char *fmt, ...)
{
    if (p->bad)
        return;
    p->bad = true;
    char m[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    srv_error_set(p->err, 400, "invalid_request_error", param, NULL, "%s", m);
}

/* A number field in [lo, hi] (an integer where integer): false when absent or bad. */
static bool num(struct parse *p, const char *key, double lo, double hi, bool integer, double *v)
{
    const cJSON *x = field(p, key);
    if (!x || p->bad)
        return false;
    if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) ||
        (integer && x->valuedouble != floor(x->valuedouble))) {
        bad(p, key, "'%s' must be %s", key, integer ? "an integer" : "a number");
        return false;
    }
    if (x->valuedouble < lo || x->valuedouble > hi) {
        if (integer)
            bad(p, key, "'%s' must be an integer in [%.0f, %.0f], got %.17g", key, lo, hi,
                x->valuedouble);
        else
            bad(p, key, "'%s' must be in [%g, %g], got %.17g", key, lo, hi, x->valuedouble);
        return false;
    }
    *v = x->valuedouble;
    return true;
}

/* A bool field: def when absent. */
static bool flag(struct parse *p, const char *key, bool def)
{
    const cJSON *x = field(p, key);
    if (!x)
        return def;
    if (!cJSON_IsBool(x)) {
        bad(p, key, "'%s' must be true or false", key);
        return def;
    }
    return cJSON_IsTrue(x);
}

/* Fields we do not implement: refused rather than ignored (a silently different result). */
static void unsupported(struct parse *p)
{
    const cJSON *x;
    if ((x = field(p, "logit_bias")) && (!cJSON_IsObject(x) || x->child))
        bad(p, "logit_bias", "'logit_bias' is not supported");
    if ((x = field(p, "suffix")) && (!cJSON_IsString(x) || x->valuestring[0]))
        bad(p, "suffix", "'suffix' is not supported");
    if ((x = field(p, "tools")) && (!cJSON_IsArray(x) || x->child))
        bad(p, "tools", "'tools' (function calling) is not supported");
    if ((x = field(p, "best_of")) && !(cJSON_IsNumber(x) && x->valuedouble == 1))
        bad(p, "best_of", "'best_of' other than 1 is not supported");
    const cJSON *rf = field(p, "response_format"), *t = NULL;
    if (rf && (!cJSON_IsObject(rf) || !cJSON_IsString(t = cJSON_GetObjectItem(rf, "type")) ||
               strcmp(t->valuestring, "text")))
        bad(p, "response_format", "only 'response_format' {\"type\": \"text\"} is supported");
}

/* The sampling fields into gp->sample (defaults, then generation_config.json, then the
 * request). */
static void sampling(struct parse *p, struct rt_gen_params *gp, bool *seeded, uint64_t *seed)
{
    struct rt_sample_params *s = &gp->sample;
    *s = rt_sample_params_default();
    unsigned given = 0;
    double x;
    if (num(p, "temperature", 0, 1e6, false, &x))
        s->temperature = (float)x, given |= RT_GEN_TEMPERATURE;
    if (num(p, "top_p", 0, 1, false, &x)) {
        if (x <= 0)
            bad(p, "top_p", "'top_p' must be in (0, 1], got %g", x);
        s->top_p = (float)x, given |= RT_GEN_TOP_P;
    }
    if (num(p, "top_k", -1, 2147483647.0, true, &x)) {
        if (x == 0)
            bad(p, "top_k", "'top_k' must be -1 (off) or >= 1, got 0");
        s->top_k = x < 0 ? 0 : (int32_t)x, given |= RT_GEN_TOP_K;
    }
    if (num(p, "min_p", 0, 1, false, &x))
        s->min_p = (float)x, given |= RT_GEN_MIN_P;
    if (num(p, "repetition_penalty", 0, 1e6, false, &x)) {
        if (x <= 0)
            bad(p, "repetition_penalty", "'repetition_penalty' must be > 0, got %g", x);
        s->repeat_penalty = (float)x, given |= RT_GEN_REPEAT_PENALTY;
    }
    if (num(p, "frequency_penalty", -2, 2, false, &x))
        s->frequency_penalty = (float)x;
    if (num(p, "presence_penalty", -2, 2, false, &x))
        s->presence_penalty = (float)x;
    *seeded = num(p, "seed", -9007199254740992.0, 9007199254740992.0, true, &x);
    if (*seeded)
        *seed = x < 0 ? (uint64_t)(int64_t)x : (uint64_t)x;
    if (p->v->s)
        rt_session_sampling_defaults(p->v->s, given, s);
    qs_log_clear();
    if (!p->bad && rt_sample_params_check(s) != RT_SAMPLE_ERR_NONE) /* e.g. 1e-300 -> 0.0f */
        bad(p, NULL, "%s", srv_last_msg(RT_ERR_ARG));
}

/* stop: a string or a list of up to RT_GEN_MAX_STOPS non-empty UTF-8 strings. */
static void stops(struct parse *p, struct srv_req *r, struct rt_gen_params *gp)
{
    const cJSON *st = field(p, "stop");
    if (!st)
        return;
    const cJSON *x;
    int n = 0;
    if (cJSON_IsString(st)) {
        r->stops[n++] = st->valuestring;
    } else if (cJSON_IsArray(st) && cJSON_GetArraySize(st) <= RT_GEN_MAX_STOPS) {
        cJSON_ArrayForEach(x, st) {
            if (!cJSON_IsString(x)) {
                bad(p, "stop", "'stop' must be a string or a list of strings");
                return;
            }
            r->stops[n++] = x->valuestring;
        }
    } else {
        bad(p, "stop", "'stop' must be a string or a list of up to %d strings", RT_GEN_MAX_STOPS);
        return;
    }
    for (int i = 0; i < n; i++)
        if (!r->stops[i][0] || cli_utf8_invalid_at(r->stops[i], strlen(r->stops[i])) >= 0) {
            bad(p, "stop", "'stop' strings must be non-empty UTF-8");
            return;
        }
    gp->stops = r->stops;
    gp->n_stops = n;
}

// --- prompts -------------------------------------------------------------------------------------

/* Store prompt k of r from an encoding (takes ids). */
static void set_prompt(struct srv_req *r, int k, int32_t *ids, size_t n)
{
    r->prompt_ids[k] = ids;
    r->n_prompt_ids[k] = n;
}

static bool alloc_prompts(struct parse *p, struct srv_req *r, int n)
{
    r->n_prompts = n;
    r->prompt_ids = calloc((size_t)n, sizeof(*r->prompt_ids));
    r->n_prompt_ids = calloc((size_t)n, sizeof(*r->n_prompt_ids));
    r->prompt_text = calloc((size_t)n, sizeof(*r->prompt_text));
    if (!r->prompt_ids || !r->n_prompt_ids || !r->prompt_text) {
        srv_error_set(p->err, 500, "server_error", NULL, NULL, "out of memory");
        p->bad = true;
        return false;
    }
    return true;
}

/* Encode one prompt through the session; false (error set) when it cannot be. */
static bool encode(struct parse *p, const struct rt_prompt *pr, const char *param, int32_t **ids,
                   size_t *n)
{
    qs_log_clear();
    enum rt_err e = rt_session_encode(p->v->s, pr, ids, n);
    if (e == RT_ERR_NOMEM) {
        srv_error_set(p->err, 500, "server_error", NULL, NULL, "out of memory");
        p->bad = true;
    } else if (e) {
        bad(p, param, "%s", srv_last_msg(e));
    }
    return !e;
}

/* A list of token ids (cJSON array) into a prompt. */
static bool token_prompt(struct parse *p, const cJSON *a, int32_t **ids, size_t *n)
{
    const int k = cJSON_GetArraySize(a);
    const int32_t nv = rt_session_n_vocab(p->v->s);
    if (k < 1) {
        bad(p, "prompt", "a token prompt must hold at least one id");
        return false;
    }
    int32_t *v = malloc((size_t)k * sizeof(int32_t));
    if (!v) {
        srv_error_set(p->err, 500, "server_error", NULL, NULL, "out of memory");
        p->bad = true;
        return false;
    }
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, a) {
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < 0 ||
            x->valuedouble >= nv) {
            free(v);
            bad(p, "prompt", "token ids must be integers in [0, %d)", (int)nv);
            return false;
        }
        v[i++] = (int32_t)x->valuedouble;
    }
    *ids = v;
    *n = (size_t)k;
    return true;
}

/* completions: prompt = string | [string] | [int] | [[int]]. */
static bool completion_prompts(struct parse *p, struct srv_req *r)
{
    const cJSON *pr = field(p, "prompt");
    if (!pr) {
        bad(p, "prompt", "'prompt' is required");
        return false;
    }
    const bool ids = cJSON_IsArray(pr) && pr->child && cJSON_IsNumber(pr->child);
    const int n = cJSON_IsString(pr) || ids ? 1 : cJSON_IsArray(pr) ? cJSON_GetArraySize(pr) : 0;
    if (n < 1 || n > SRV_MAX_PROMPTS) {
        bad(p, "prompt", "'prompt' must be a string, a list of 1..%d strings, a list of token "
            "ids or a list of such lists", SRV_MAX_PROMPTS);
        return false;
    }
    if (!alloc_prompts(p, r, n))
        return false;
    for (int k = 0; k < n; k++) {
        const cJSON *x = cJSON_IsString(pr) || ids ? pr : cJSON_GetArrayItem(pr, k);
        int32_t *v = NULL;
        size_t m = 0;
        if (cJSON_IsString(x)) {
            if (!x->valuestring[0]) {
                bad(p, "prompt", "'prompt' must not be empty");
                return false;
            }
            const struct rt_prompt rp = {.text = x->valuestring};
            if (!encode(p, &rp, "prompt", &v, &m))
                return false;
            if (r->echo && !(r->prompt_text[k] = strdup(x->valuestring))) {
                free(v);
                srv_error_set(p->err, 500, "server_error", NULL, NULL, "out of memory");
                p->bad = true;
                return false;
            }
        } else if (cJSON_IsArray(x)) {
            if (!token_prompt(p, x, &v, &m))
                return false;
            if (r->echo && rt_session_tok(p->v->s)) {
                size_t tl;
                rt_tok_decode(rt_session_tok(p->v->s), v, m, RT_TOK_DECODE_SKIP_SPECIAL,
                              &r->prompt_text[k], &tl);
            }
        } else {
            bad(p, "prompt", "each prompt must be a string or a list of token ids");
            return false;
        }
        set_prompt(r, k, v, m);
    }
    return true;
}

/* The text of a message's content: a string, or a list of {"type": "text", "text"} parts
 * (joined with newlines; held in *own). */
static const char *msg_content(struct parse *p, const cJSON *c, char **own)
{
    if (cJSON_IsString(c))
        return c->valuestring;
    if (!cJSON_IsArray(c)) {
        bad(p, "messages", "a message's 'content' must be a string or a list of text parts");
        return NULL;
    }
    size_t len = 0, cap = 0;
    char *s = NULL;
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(t) || strcmp(t->valuestring, "text") || !cJSON_IsString(x)) {
            free(s);
            bad(p, "messages", "only text content parts ({\"type\": \"text\", \"text\": ...}) "
                "are supported");
            return NULL;
        }
        if ((len && !srv_append(&s, &len, &cap, "\n", 1)) ||
            !srv_append(&s, &len, &cap, x->valuestring, strlen(x->valuestring))) {
            free(s);
            bad(p, NULL, "out of memory");
            return NULL;
        }
    }
    *own = s ? s : strdup("");
    return *own;
}

/* chat: messages [{role, content}] through the chat template. */
static bool chat_prompt(struct parse *p, struct srv_req *r, int32_t *extra_eos)
{
    const cJSON *ms = field(p, "messages");
    const int n = cJSON_IsArray(ms) ? cJSON_GetArraySize(ms) : 0;
    if (n < 1 || n > SRV_MAX_MSGS) {
        bad(p, "messages", "'messages' must be a list of 1..%d messages", SRV_MAX_MSGS);
        return false;
    }
    struct rt_chat_msg msgs[SRV_MAX_MSGS];
    char *own[SRV_MAX_MSGS] = {0};
    int k = 0;
    bool ok = alloc_prompts(p, r, 1);
    const cJSON *m;
    cJSON_ArrayForEach(m, ms) {
        if (!ok)
            break;
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const char *ro = cJSON_IsString(role) ? role->valuestring : "";
        if (!strcmp(ro, "developer"))
            ro = "system"; /* OpenAI's newer name of the system turn */
        if (strcmp(ro, "system") && strcmp(ro, "user") && strcmp(ro, "assistant")) {
            bad(p, "messages", "message %d: 'role' must be \"system\", \"user\" or "
                "\"assistant\"", k);
            ok = false;
            break;
        }
        const char *c = msg_content(p, cJSON_GetObjectItemCaseSensitive(m, "content"), &own[k]);
        if (!c) {
            ok = false;
            break;
        }
        msgs[k++] = (struct rt_chat_msg){ro, c};
    }
    if (ok) {
        const struct rt_prompt rp = {.msgs = msgs, .n_msgs = (size_t)k,
                                     .family = p->v->o.chat_family};
        int32_t *v = NULL;
        size_t len = 0;
        if (p->v->o.chat_family == RT_CHAT_NONE && rt_session_tok(p->v->s) &&
            rt_chat_detect(rt_session_tok(p->v->s)) == RT_CHAT_NONE) {
            srv_error_set(p->err, 400, "invalid_request_error", "messages", NULL,
                          "this model has no chat template the server recognises (its "
                          "tokenizer_config.json); the server must be started with "
                          "--chat-template llama2|llama3|mistral|chatml|qwen|gemma|phi3");
            p->bad = true;
            ok = false;
        }
        ok = ok && encode(p, &rp, "messages", &v, &len);
        if (ok) {
            set_prompt(r, 0, v, len);
            *extra_eos = rt_session_chat_end(p->v->s, &rp);
        }
    }
    for (int i = 0; i < k; i++)
        free(own[i]);
    return ok;
}

// --- the request ------------------------------------------------------------------------------------

void srv_req_ref(struct srv_req *r)
{
    pthread_mutex_lock(&r->mu);
    r->refs++;
    pthread_mutex_unlock(&r->mu);
}

static void req_free(struct srv_req *r)
{
    for (int i = 0; i < r->n_choices; i++) {
        free(r->ch[i].text);
        free(r->ch[i].toks);
        free(r->ch[i].ids);
    }
    for (int k = 0; k < r->n_prompts; k++) {
        free(r->prompt_ids ? r->prompt_ids[k] : NULL);
        free(r->prompt_text ? r->prompt_text[k] : NULL);
    }
    free(r->prompt_ids);
    free(r->n_prompt_ids);
    free(r->prompt_text);
    free(r->ch);
    cJSON_Delete(r->body);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

void srv_req_unref(struct srv_req *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    const int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left == 0)
        req_free(r);
}

/* logprobs / top_logprobs / echo / stream fields. */
static void output_fields(struct parse *p, struct srv_req *r)
{
    double x;
    r->logprobs = -1;
    if (r->kind == SRV_COMPLETION) {
        const cJSON *lp = field(p, "logprobs");
        if (lp && cJSON_IsFalse(lp))
            lp = NULL;
        if (lp && num(p, "logprobs", 0, RT_GEN_MAX_LOGPROBS, true, &x))
            r->logprobs = (int)x;
        r->echo = flag(p, "echo", false);
        if (r->echo && r->logprobs >= 0)
            bad(p, "echo", "'echo' together with 'logprobs' (prompt logprobs) is not supported");
    } else {
        const bool lp = flag(p, "logprobs", false);
        int top = 0;
        if (num(p, "top_logprobs", 0, RT_GEN_MAX_LOGPROBS, true, &x)) {
            top = (int)x;
            if (!lp)
                bad(p, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        }
        r->logprobs = lp ? top : -1;
    }
    r->stream = flag(p, "stream", false);
    const cJSON *so = field(p, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so))
            bad(p, "stream_options", "'stream_options' must be an object");
        else if (!r->stream)
            bad(p, "stream_options", "'stream_options' needs 'stream': true");
        const cJSON *iu = cJSON_GetObjectItemCaseSensitive(so, "include_usage");
        if (iu && !cJSON_IsNull(iu) && !cJSON_IsBool(iu))
            bad(p, "stream_options", "'stream_options.include_usage' must be true or false");
        r->include_usage = cJSON_IsTrue(iu);
    }
}

/* max_tokens against the context, for every prompt. */
static long max_tokens(struct parse *p, struct srv_req *r)
{
    double x;
    long max = -1;
    if (r->kind == SRV_CHAT && num(p, "max_completion_tokens", 1, 16777216, true, &x))
        max = (long)x;
    if (num(p, "max_tokens", 1, 16777216, true, &x)) /* both checked; max_tokens wins */
        max = (long)x;
    if (p->bad)
        return -1;
    const long ctx = p->v->n_ctx;
    for (int k = 0; k < r->n_prompts; k++) {
        const long np = (long)r->n_prompt_ids[k];
        const long want = max > 0 ? max : r->kind == SRV_COMPLETION ? 16 : ctx - np;
        const char *what = r->kind == SRV_CHAT ? "messages" : "prompt";
        if (np >= ctx && max <= 0) {
            srv_error_set(p->err, 400, "invalid_request_error", what, "context_length_exceeded",
                          "This model's maximum context length is %ld tokens. However, your %s "
                          "has %ld tokens (one position must stay free to generate). Please "
                          "reduce the length of the %s.", ctx, what, np, what);
            p->bad = true;
            return -1;
        }
        if (np >= ctx || (max > 0 && np + want > ctx)) {
            srv_error_set(p->err, 400, "invalid_request_error", "max_tokens",
                          "context_length_exceeded",
                          "This model's maximum context length is %ld tokens. However, you "
                          "requested %ld tokens (%ld in the %s, %ld in the completion). Please "
                          "reduce the length of the %s or completion.", ctx, np + want, np,
                          r->kind == SRV_CHAT ? "messages" : "prompt", want,
                          r->kind == SRV_CHAT ? "messages" : "prompt");
            p->bad = true;
            return -1;
        }
    }
    return max; /* <= 0: the default per prompt */
}

/* The choices: n per prompt, each with its parameters and seed. */
static bool make_choices(struct parse *p, struct srv_req *r, const struct rt_gen_params *base,
                         long max, bool seeded, uint64_t seed)
{
    double x = 1;
    num(p, "n", 1, SRV_MAX_N, true, &x);
    const int n = (int)x;
    if (p->bad)
        return false;
    r->n_choices = n * r->n_prompts;
    r->ch = calloc((size_t)r->n_choices, sizeof(*r->ch));
    if (!r->ch) {
        srv_error_set(p->err, 500, "server_error", NULL, NULL, "out of memory");
        p->bad = true;
        return false;
    }
    for (int k = 0; k < r->n_prompts; k++)
        for (int i = 0; i < n; i++) {
            struct srv_choice *c = &r->ch[k * n + i];
            c->r = r;
            c->index = k * n + i;
            c->prompt = k;
            c->eng_id = -1;
            c->gp = *base;
            const long np = (long)r->n_prompt_ids[k];
            c->gp.max_tokens = max > 0 ? max
                               : r->kind == SRV_COMPLETION
                                   ? (p->v->n_ctx - np < 16 ? p->v->n_ctx - np : 16)
                                   : p->v->n_ctx - np;
            c->gp.sample.seed = seeded ? seed + (uint64_t)i : srv_random(p->v);
        }
    return true;
}

/* Whether a JSON text has more than max values in arrays and objects (commas outside
 * strings), counted before cJSON builds them. */
static bool json_too_many(const char *body, size_t len, size_t max)
{
    size_t n = 0;
    bool in_str = false;
    for (size_t i = 0; i < len; i++) {
        const char ch = body[i];
        if (in_str) {
            if (ch == '\\')
                i++;
            else if (ch == '"')
                in_str = false;
        } else if (ch == '"') {
            in_str = true;
        } else if (ch == ',' && ++n > max) {
            return true;
        }
    }
    return false;
}

/* Whether a JSON text holds the escape \u0000 (cJSON would end the string there). */
static bool json_has_nul(const char *body, size_t len)
{
    for (size_t i = 0; i + 1 < len; i++)
        if (body[i] == '\\') {
            if (body[i + 1] == 'u' && i + 5 < len && !memcmp(body + i + 2, "0000", 4))
                return true;
            i++; /* the escaped character */
        }
    return false;
}

/* One JSON text, nothing but whitespace after it, no NUL byte; NULL when malformed (*bad_at:
 * the byte offset of the trouble). */
static cJSON *json_parse(const char *body, size_t len, size_t *bad_at)
{
    const char *nul = memchr(body, 0, len); /* cJSON would end a string there */
    if (nul) {
        *bad_at = (size_t)(nul - body);
        return NULL;
    }
    const char *end = NULL; /* cJSON sets it on failure too (its global error is not ours) */
    cJSON *j = cJSON_ParseWithLengthOpts(body, len, &end, false);
    *bad_at = end ? (size_t)(end - body) : 0;
    if (!j)
        return NULL;
    for (; end < body + len; end++) /* one JSON text and nothing after it (RFC 8259) */
        if (*end != ' ' && *end != '\t' && *end != '\n' && *end != '\r') {
            *bad_at = (size_t)(end - body);
            cJSON_Delete(j);
            return NULL;
        }
    return j;
}

cJSON *srv_body_json(struct srv *v, const char *body, size_t len, size_t max_values,
                     const char *too_many, struct srv_error *err)
{
    if (json_has_nul(body, len)) { /* cJSON's strings end at a NUL: it would cut the text */
        srv_error_set(err, 400, "invalid_request_error", NULL, NULL,
                      "strings with a NUL character (\\u0000) are not supported");
        return NULL;
    }
    if (json_too_many(body, len, max_values)) {
        srv_error_set(err, 400, "invalid_request_error", NULL, NULL,
                      "the body holds more than %zu values: %s", max_values, too_many);
        return NULL;
    }
    size_t bad_at = 0;
    const bool big = len > SRV_BIG_BODY;
    if (big)
        sem_wait(&v->big_parse);
    cJSON *o = json_parse(body, len, &bad_at);
    if (big)
        sem_post(&v->big_parse);
    if (!o) {
        srv_error_set(err, 400, "invalid_request_error", NULL, NULL,
                      "the body is not valid JSON (near byte %zu)", bad_at);
        return NULL;
    }
    if (!cJSON_IsObject(o)) {
        srv_error_set(err, 400, "invalid_request_error", NULL, NULL,
                      "the body must be a JSON object");
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

bool srv_check_model(const struct srv *v, const cJSON *o, struct srv_error *err)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "model");
    if (!m || cJSON_IsNull(m))
        return true;
    if (!cJSON_IsString(m)) {
        srv_error_set(err, 400, "invalid_request_error", "model", NULL, "'model' must be a string");
        return false;
    }
    if (strcmp(m->valuestring, v->model_name)) {
        srv_error_set(err, 404, "invalid_request_error", "model", "model_not_found",
                      "The model `%.200s` does not exist (this server has `%.200s`).",
                      m->valuestring, v->model_name);
        return false;
    }
    return true;
}

struct srv_req *srv_req_parse(struct srv *v, enum srv_kind kind, const char *body, size_t len,
                              struct srv_error *err)
{
    struct srv_req *r = calloc(1, sizeof(*r));
    if (!r) {
        srv_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->refs = 1;
    r->srv = v;
    r->kind = kind;
    r->t_start = qs_now_s();
    r->created = (long long)time(NULL);
    snprintf(r->id, sizeof r->id, "%s-%016llx%08llx", kind == SRV_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)srv_random(v), (unsigned long long)(srv_random(v) >> 32));
    struct parse p = {.v = v, .err = err};
    /* the most values a request can need: every prompt a full context of ids, and slack */
    char why[160];
    snprintf(why, sizeof why, "more token ids than %d prompts of the context (%d tokens) can "
             "hold", SRV_MAX_PROMPTS, v->n_ctx);
    r->body = srv_body_json(v, body, len,
                            (size_t)(SRV_MAX_PROMPTS + 1) * (size_t)(v->n_ctx + 1) + 65536, why,
                            err);
    if (!r->body || !srv_check_model(v, r->body, err))
        goto fail;
    p.o = r->body;
    unsupported(&p);
    struct rt_gen_params gp = rt_gen_params_default();
    bool seeded = false;
    uint64_t seed = 0;
    sampling(&p, &gp, &seeded, &seed);
    stops(&p, r, &gp);
    gp.ignore_eos = flag(&p, "ignore_eos", false);
    const bool skip = flag(&p, "skip_special_tokens", true);
    gp.decode_flags = (skip ? RT_TOK_DECODE_SKIP_SPECIAL : 0) |
                      (kind == SRV_COMPLETION ? RT_TOK_DECODE_KEEP_SPACE : 0);
    output_fields(&p, r);
    r->token_ids = flag(&p, "return_token_ids", false) || !rt_session_tok(v->s);
    if (p.bad)
        goto fail;
    if (gp.n_stops && !rt_session_tok(v->s)) {
        bad(&p, "stop", "stop strings need the model's tokenizer, which it lacks");
        goto fail;
    }
    if (kind == SRV_COMPLETION ? !completion_prompts(&p, r) : !chat_prompt(&p, r, &gp.extra_eos))
        goto fail;
    gp.logprobs = r->logprobs < 0 ? 0 : r->logprobs > 0 ? r->logprobs : 1;
    const long max = max_tokens(&p, r);
    if (p.bad || !make_choices(&p, r, &gp, max, seeded, seed))
        goto fail;
    return r;
fail:
    if (!p.bad && !err->status)
        srv_error_set(err, 400, "invalid_request_error", NULL, NULL, "bad request");
    srv_req_unref(r);
    return NULL;
}
