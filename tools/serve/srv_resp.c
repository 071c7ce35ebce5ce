/*
 * srv_resp.c - the server's response bodies (tools/serve/srv_int.h): a whole completion or
 * chat completion, its SSE chunks ("data: {...}\n\n" events, then "data: [DONE]"), logprobs in
 * both of OpenAI's shapes, /v1/models, /tokenize and /detokenize.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qs_log.h"
#include "srv_int.h"

// --- logprobs ----------------------------------------------------------------------------------

/* A token's text as OpenAI shows it (malloc'd): the id decoded alone, leading space kept,
 * special tokens as their content; "" when it has no text. */
static char *tok_str(const struct srv *v, int32_t id)
{
    const struct rt_tok *tok = rt_session_tok(v->s);
    char *t = NULL;
    size_t n;
    if (!tok || rt_tok_decode(tok, &id, 1, RT_TOK_DECODE_KEEP_SPACE, &t, &n) != RT_TOK_ERR_NONE)
        return strdup("");
    return t;
}

static cJSON *bytes_json(const struct srv *v, int32_t id)
{
    cJSON *a = cJSON_CreateArray();
    size_t n = 0;
    const struct rt_tok *tok = rt_session_tok(v->s);
    const char *b = tok ? rt_tok_bytes(tok, id, &n) : NULL;
    for (size_t i = 0; b && i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)b[i]));
    return a;
}

/* Characters (code points) of UTF-8 text: OpenAI's and vLLM's text_offset count characters. */
static size_t n_chars(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"} of toks [a, b);
 * *offset: the text offset of token a, advanced past token b - 1. */
static cJSON *lp_completion(const struct srv *v, const struct srv_choice *c, size_t a, size_t b,
                            size_t *offset)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *tk = cJSON_AddArrayToObject(o, "tokens"), *lp = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *top = cJSON_AddArrayToObject(o, "top_logprobs"), *off = cJSON_AddArrayToObject(o, "text_offset");
    for (size_t i = a; i < b; i++) {
        const struct srv_tok *k = &c->toks[i];
        char *s = tok_str(v, k->id);
        cJSON_AddItemToArray(tk, cJSON_CreateString(s ? s : ""));
        cJSON_AddItemToArray(lp, cJSON_CreateNumber(k->logprob));
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)*offset));
        *offset += s ? n_chars(s) : 0;
        free(s);
        cJSON *t = cJSON_CreateObject();
        for (int j = 0; j < k->n_top; j++) {
            char *ts = tok_str(v, k->top_ids[j]);
            if (ts && !cJSON_GetObjectItemCaseSensitive(t, ts)) /* equal strings: the likelier */
                cJSON_AddNumberToObject(t, ts, k->top_lp[j]);
            free(ts);
        }
        cJSON_AddItemToArray(top, t);
    }
    return o;
}

/* chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]} of toks [a, b). */
static cJSON *lp_chat(const struct srv *v, const struct srv_choice *c, size_t a, size_t b)
{
    cJSON *o = cJSON_CreateObject(), *content = cJSON_AddArrayToObject(o, "content");
    for (size_t i = a; i < b; i++) {
        const struct srv_tok *k = &c->toks[i];
        cJSON *e = cJSON_CreateObject();
        char *s = tok_str(v, k->id);
        cJSON_AddStringToObject(e, "token", s ? s : "");
        free(s);
        cJSON_AddNumberToObject(e, "logprob", k->logprob);
        cJSON_AddItemToObject(e, "bytes", bytes_json(v, k->id));
        cJSON *top = cJSON_AddArrayToObject(e, "top_logprobs");
        for (int j = 0; j < k->n_top; j++) {
            cJSON *t = cJSON_CreateObject();
            char *ts = tok_str(v, k->top_ids[j]);
            cJSON_AddStringToObject(t, "token", ts ? ts : "");
            free(ts);
            cJSON_AddNumberToObject(t, "logprob", k->top_lp[j]);
            cJSON_AddItemToObject(t, "bytes", bytes_json(v, k->top_ids[j]));
            cJSON_AddItemToArray(top, t);
        }
        cJSON_AddItemToArray(content, e);
    }
    return o;
}

// --- whole responses ---------------------------------------------------------------------------

static cJSON *head(const struct srv_req *r, const char *object)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)r->created);
    cJSON_AddStringToObject(o, "model", r->srv->model_name);
    return o;
}

static cJSON *usage(const struct srv_req *r)
{
    size_t np = 0, nc = 0;
    for (int k = 0; k < r->n_prompts; k++)
        np += r->n_prompt_ids[k];
    for (int i = 0; i < r->n_choices; i++)
        nc += r->ch[i].n_completion;
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)np);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)nc);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(np + nc));
    size_t cached = 0; /* per prompt, as prompt_tokens: the most any of its choices found */
    for (int k = 0; k < r->n_prompts; k++) {
        size_t most = 0;
        for (int i = 0; i < r->n_choices; i++)
            if (r->ch[i].prompt == k && (size_t)r->ch[i].n_cached > most)
                most = (size_t)r->ch[i].n_cached;
        cached += most;
    }
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", (double)cached);
    return u;
}

static cJSON *ids_json(const int32_t *ids, size_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    return a;
}

static const char *finish_str(const struct srv_choice *c)
{
    return c->finish == RT_GEN_FINISH_CANCELLED ? "abort" : rt_gen_finish_reason(c->finish);
}

char *srv_req_response(struct srv_req *r, int *status)
{
    for (int i = 0; i < r->n_choices; i++)
        if (r->ch[i].err) {
            struct srv_error e = {0};
            srv_choice_error(&r->ch[i], &e);
            *status = e.status;
            return srv_error_json(&e);
        }
    const bool chat = r->kind == SRV_CHAT;
    cJSON *o = head(r, chat ? "chat.completion" : "text_completion");
    cJSON *chs = cJSON_AddArrayToObject(o, "choices");
    for (int i = 0; i < r->n_choices; i++) {
        const struct srv_choice *c = &r->ch[i];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "index", c->index);
        const char *text = c->text ? c->text : "";
        if (chat) {
            cJSON *m = cJSON_AddObjectToObject(x, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            cJSON_AddStringToObject(m, "content", text);
        } else if (r->echo && r->prompt_text[c->prompt]) {
            const size_t a = strlen(r->prompt_text[c->prompt]), b = strlen(text);
            char *t = malloc(a + b + 1);
            if (t) {
                memcpy(t, r->prompt_text[c->prompt], a);
                memcpy(t + a, text, b + 1);
            }
            cJSON_AddStringToObject(x, "text", t ? t : text);
            free(t);
        } else {
            cJSON_AddStringToObject(x, "text", text);
        }
        size_t off = 0;
        if (r->logprobs >= 0)
            cJSON_AddItemToObject(x, "logprobs", chat ? lp_chat(r->srv, c, 0, c->n_toks)
                                                      : lp_completion(r->srv, c, 0, c->n_toks, &off));
        else
            cJSON_AddNullToObject(x, "logprobs");
        cJSON_AddStringToObject(x, "finish_reason", finish_str(c));
        if (r->token_ids)
            cJSON_AddItemToObject(x, "token_ids", ids_json(c->ids, c->n_ids));
        cJSON_AddItemToArray(chs, x);
    }
    cJSON_AddItemToObject(o, "usage", usage(r));
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    *status = s ? 200 : 500;
    return s;
}

// --- streaming ---------------------------------------------------------------------------------

bool srv_reserve(char **buf, size_t len, size_t n, size_t *cap)
{
    if (len + n + 1 <= *cap)
        return true;
    size_t c = *cap ? *cap : 256;
    while (c < len + n + 1)
        c *= 2;
    char *p = realloc(*buf, c);
    if (!p)
        return false;
    *buf = p;
    *cap = c;
    return true;
}

bool srv_append(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (!srv_reserve(buf, *len, n, cap))
        return false;
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = '\0';
    return true;
}

/* One SSE event "data: <s>\n\n". */
static void event_str(const char *s, char **buf, size_t *len, size_t *cap)
{
    srv_append(buf, len, cap, "data: ", 6);
    srv_append(buf, len, cap, s, strlen(s));
    srv_append(buf, len, cap, "\n\n", 2);
}

/* One SSE event "data: <o>\n\n" (o freed). */
static void event(cJSON *o, char **buf, size_t *len, size_t *cap)
{
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (s)
        event_str(s, buf, len, cap);
    free(s);
}

/* A chunk of choice c: delta text [n] (role when role), logprobs of toks [a, b), finish. */
static cJSON *chunk(struct srv_req *r, struct srv_choice *c, const char *text, size_t n,
                    bool role, size_t a, size_t b, size_t ia, size_t ib, const char *finish)
{
    const bool chat = r->kind == SRV_CHAT;
    cJSON *o = head(r, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *chs = cJSON_AddArrayToObject(o, "choices"), *x = cJSON_CreateObject();
    cJSON_AddNumberToObject(x, "index", c->index);
    char *t = malloc(n + 1);
    if (t) {
        memcpy(t, text, n);
        t[n] = '\0';
    }
    if (chat) {
        cJSON *d = cJSON_AddObjectToObject(x, "delta");
        if (role)
            cJSON_AddStringToObject(d, "role", "assistant");
        if (role || n)
            cJSON_AddStringToObject(d, "content", t ? t : "");
    } else {
        cJSON_AddStringToObject(x, "text", t ? t : "");
    }
    free(t);
    if (r->logprobs >= 0 && b > a)
        cJSON_AddItemToObject(x, "logprobs", chat ? lp_chat(r->srv, c, a, b)
                                                  : lp_completion(r->srv, c, a, b,
                                                                  &c->lp_offset));
    else
        cJSON_AddNullToObject(x, "logprobs");
    if (finish)
        cJSON_AddStringToObject(x, "finish_reason", finish);
    else
        cJSON_AddNullToObject(x, "finish_reason");
    if (r->token_ids)
        cJSON_AddItemToObject(x, "token_ids", ids_json(c->ids + ia, ib - ia));
    cJSON_AddItemToArray(chs, x);
    if (r->include_usage)
        cJSON_AddNullToObject(o, "usage");
    return o;
}

bool srv_req_stream(struct srv_req *r, char **buf, size_t *len, size_t *cap)
{
    bool all = true;
    for (int i = 0; i < r->n_choices; i++) {
        struct srv_choice *c = &r->ch[i];
        if (c->final_sent)
            continue;
        if (!c->started) {
            c->started = true;
            if (r->kind == SRV_CHAT) {
                event(chunk(r, c, "", 0, true, 0, 0, 0, 0, NULL), buf, len, cap);
            } else if (r->echo && r->prompt_text[c->prompt]) {
                const char *p = r->prompt_text[c->prompt];
                event(chunk(r, c, p, strlen(p), false, 0, 0, 0, 0, NULL), buf, len, cap);
            }
        }
        if (c->n_text > c->sent_text || c->n_toks > c->sent_toks ||
            (r->token_ids && c->n_ids > c->sent_ids)) {
            event(chunk(r, c, c->text ? c->text + c->sent_text : "", c->n_text - c->sent_text,
                        false, c->sent_toks, c->n_toks, c->sent_ids, c->n_ids, NULL),
                  buf, len, cap);
            c->sent_text = c->n_text;
            c->sent_toks = c->n_toks;
            c->sent_ids = c->n_ids;
        }
        if (!c->done) {
            all = false;
            continue;
        }
        c->final_sent = true;
        if (c->err) {
            struct srv_error e = {0};
            srv_choice_error(c, &e);
            char *s = srv_error_json(&e);
            if (s)
                event_str(s, buf, len, cap);
            free(s);
        } else {
            event(chunk(r, c, "", 0, false, 0, 0, c->n_ids, c->n_ids, finish_str(c)), buf, len, cap);
        }
    }
    if (!all)
        return true;
    if (r->include_usage && !r->usage_sent) {
        r->usage_sent = true;
        cJSON *o = head(r, r->kind == SRV_CHAT ? "chat.completion.chunk" : "text_completion");
        cJSON_AddArrayToObject(o, "choices");
        cJSON_AddItemToObject(o, "usage", usage(r));
        event(o, buf, len, cap);
    }
    if (!r->done_sent) {
        r->done_sent = true;
        srv_append(buf, len, cap, "data: [DONE]\n\n", 14);
    }
    return false;
}

// --- /v1/models, /tokenize, /detokenize --------------------------------------------------------

char *srv_models_json(struct srv *v)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *d = cJSON_AddArrayToObject(o, "data"), *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", v->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", v->t_loaded);
    cJSON_AddStringToObject(m, "owned_by", "qshard");
    cJSON_AddStringToObject(m, "root", v->o.session.path);
    cJSON_AddNumberToObject(m, "max_model_len", v->n_ctx);
    cJSON_AddItemToArray(d, m);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* The token ids of a /tokenize body: "prompt" text or chat "messages". */
static bool tokenize_ids(struct srv *v, const cJSON *o, struct srv_error *err, int32_t **ids,
                         size_t *n)
{
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(o, "prompt");
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(o, "messages");
    const cJSON *as = cJSON_GetObjectItemCaseSensitive(o, "add_special_tokens");
    if (as && !cJSON_IsNull(as) && !cJSON_IsBool(as)) {
        srv_error_set(err, 400, "invalid_request_error", "add_special_tokens", NULL,
                      "'add_special_tokens' must be true or false");
        return false;
    }
    if (!!cJSON_IsString(pr) + !!cJSON_IsArray(ms) != 1) {
        srv_error_set(err, 400, "invalid_request_error", "prompt", NULL,
                      "give 'prompt' (a string) or 'messages' (a list)");
        return false;
    }
    struct rt_chat_msg msgs[SRV_MAX_MSGS];
    struct rt_prompt p = {.no_bos = cJSON_IsFalse(as), .allow_empty = true,
                          .family = v->o.chat_family};
    if (pr) {
        p.text = pr->valuestring;
    } else {
        const cJSON *m;
        cJSON_ArrayForEach(m, ms) {
            const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "role");
            const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
            if (p.n_msgs == SRV_MAX_MSGS || !cJSON_IsString(r) || !cJSON_IsString(c) ||
                (strcmp(r->valuestring, "system") && strcmp(r->valuestring, "user") &&
                 strcmp(r->valuestring, "assistant"))) {
                srv_error_set(err, 400, "invalid_request_error", "messages", NULL,
                              "each message needs 'role' (system, user or assistant) and "
                              "'content' strings (at most %d messages)", SRV_MAX_MSGS);
                return false;
            }
            msgs[p.n_msgs++] = (struct rt_chat_msg){r->valuestring, c->valuestring};
        }
        p.msgs = msgs;
    }
    qs_log_clear();
    enum rt_err e = rt_session_encode(v->s, &p, ids, n);
    if (e) {
        srv_error_set(err, e == RT_ERR_NOMEM ? 500 : 400,
                      e == RT_ERR_NOMEM ? "server_error" : "invalid_request_error",
                      pr ? "prompt" : "messages", NULL, "%s", srv_last_msg(e));
        return false;
    }
    return true;
}

char *srv_tokenize_json(struct srv *v, const char *body, size_t len, bool detokenize,
                        struct srv_error *err)
{
    cJSON *o = srv_body_json(v, body, len, (size_t)4 * (size_t)v->n_ctx + 65536,
                             "more token ids than four contexts", err),
          *out = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    char *text = NULL;
    if (!o || !srv_check_model(v, o, err))
        goto done;
    if (!rt_session_tok(v->s)) {
        srv_error_set(err, 400, "invalid_request_error", NULL, NULL,
                      "the model has no tokenizer");
        goto done;
    }
    out = cJSON_CreateObject();
    if (!detokenize) {
        if (!tokenize_ids(v, o, err, &ids, &n))
            goto done;
        cJSON *a = cJSON_AddArrayToObject(out, "tokens");
        for (size_t i = 0; i < n; i++)
            cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
        cJSON_AddNumberToObject(out, "count", (double)n);
        cJSON_AddNumberToObject(out, "max_model_len", v->n_ctx);
        goto done;
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "tokens"), *x;
    const cJSON *sk = cJSON_GetObjectItemCaseSensitive(o, "skip_special_tokens");
    const int k = cJSON_IsArray(t) ? cJSON_GetArraySize(t) : -1;
    ids = k > 0 ? malloc((size_t)k * sizeof(int32_t)) : NULL;
    if (k < 0 || (sk && !cJSON_IsNull(sk) && !cJSON_IsBool(sk))) {
        srv_error_set(err, 400, "invalid_request_error", k < 0 ? "tokens" : "skip_special_tokens",
                      NULL, k < 0 ? "'tokens' must be a list of token ids"
                                  : "'skip_special_tokens' must be true or false");
        goto done;
    }
    cJSON_ArrayForEach(x, t) {
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < 0 ||
            x->valuedouble >= rt_tok_n_vocab(rt_session_tok(v->s)) || !ids) {
            srv_error_set(err, 400, "invalid_request_error", "tokens", NULL,
                          "'tokens' must hold integers in [0, %d)",
                          (int)rt_tok_n_vocab(rt_session_tok(v->s)));
            goto done;
        }
        ids[n++] = (int32_t)x->valuedouble;
    }
    size_t tl = 0;
    if (rt_tok_decode(rt_session_tok(v->s), ids, n,
                      cJSON_IsFalse(sk) ? 0 : RT_TOK_DECODE_SKIP_SPECIAL, &text,
                      &tl) != RT_TOK_ERR_NONE) {
        srv_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
        goto done;
    }
    cJSON_AddStringToObject(out, "prompt", text);
done:;
    char *s = err->status ? NULL : cJSON_PrintUnformatted(out);
    cJSON_Delete(o);
    cJSON_Delete(out);
    free(ids);
    free(text);
    return s;
}
