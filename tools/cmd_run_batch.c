/*
 * cmd_run_batch.c - `qshard run MODEL --prompts FILE.jsonl [--out FILE.jsonl]`: every request of
 * a JSON-lines file through the batching engine (runtime/rt_engine.h), one JSON line out per
 * request, in input order.
 *
 * A request line: one JSON object with exactly one of
 *   "prompt": "text"                       encoded as HF tokenizer(text)
 *   "messages": [{"role", "content"}, ...] rendered with the model's chat template family
 *   "prompt_token_ids": [1, 2, 3]
 * and optionally max_tokens (>= 0), temperature (>= 0), top_p (0, 1], top_k (>= 0; -1 = off, as
 * vLLM), min_p [0, 1], repetition_penalty (> 0), seed (>= 0 integer), stop (a string or a list of
 * up to 16), ignore_eos (bool). Omitted sampling fields: the command line's options, else
 * generation_config.json, else the defaults (as `qshard run`). Other keys are ignored.
 * Output line: {"index", "text", "token_ids", "finish_reason": "stop"|"length", "usage":
 * {"prompt_tokens", "completion_tokens", "total_tokens"}, "cached_tokens", "timing":
 * {"queue_s", "ttft_s", "per_token_s", "total_s"}}; a request that cannot run (malformed line,
 * wrong types, out of range, prompt longer than the context) gets {"index", "error":
 * {"message", "type"}} on its line and the others still run. Exit 0 when every line ran, 2
 * when some line was refused (the output is complete either way), 3 on a model failure.
 * Test: ./build/test_cli_batch.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "cmd.h"
#include "rt_engine.h"
#include "rt_io.h"

#define MAX_PROMPTS_FILE (1ull << 30)
#define MAX_LINES (1 << 20)

/* One request line and what became of it. */
struct line {
    cJSON *json;             /* the parsed line (owns the stop strings) */
    int32_t *ids;            /* the encoded prompt */
    size_t n_ids;
    struct rt_gen_params gp;
    const char *stops[RT_GEN_MAX_STOPS];
    char *err;               /* why it could not run (malloc'd), or NULL */
    char *text;              /* the generated text */
    size_t n_text, cap;
    char *out;               /* its output line (malloc'd JSON) */
};

static char *dupf(const char *fmt, const char *a, const char *b)
{
    size_t n = strlen(fmt) + strlen(a) + strlen(b) + 1;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, fmt, a, b);
    return s;
}

static enum rt_err on_text(void *user, const char *t, size_t n)
{
    struct line *l = user;
    if (l->n_text + n + 1 > l->cap) {
        size_t cap = 2 * (l->n_text + n + 1);
        char *p = realloc(l->text, cap);
        if (!p)
            return RT_ERR_NOMEM;
        l->text = p;
        l->cap = cap;
    }
    memcpy(l->text + l->n_text, t, n);
    l->n_text += n;
    l->text[l->n_text] = '\0';
    return RT_ERR_NONE;
}

static cJSON *ids_json(const int32_t *ids, size_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    return a;
}

static void on_finish(void *user, const struct rt_engine_done *d)
{
    struct line *l = user;
    const struct rt_gen_result *r = d->res;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "index", 0); /* set when printed */
    if (d->err && d->err != RT_ERR_CANCELLED) {
        cJSON *e = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(e, "message", rt_err_str(d->err));
        cJSON_AddStringToObject(e, "type", "server_error");
    } else {
        cJSON_AddStringToObject(o, "text", l->text ? l->text : "");
        cJSON_AddItemToObject(o, "token_ids", ids_json(r->ids, r->n_ids));
        cJSON_AddStringToObject(o, "finish_reason", rt_gen_finish_reason(r->finish));
        cJSON *u = cJSON_AddObjectToObject(o, "usage");
        cJSON_AddNumberToObject(u, "prompt_tokens", (double)r->n_prompt);
        cJSON_AddNumberToObject(u, "completion_tokens", (double)r->n_ids);
        cJSON_AddNumberToObject(u, "total_tokens", (double)(r->n_prompt + r->n_ids));
        cJSON_AddNumberToObject(o, "cached_tokens", d->n_cached);
        cJSON *t = cJSON_AddObjectToObject(o, "timing");
        cJSON_AddNumberToObject(t, "queue_s", d->t_queue_s);
        cJSON_AddNumberToObject(t, "ttft_s", d->ttft_s);
        cJSON_AddNumberToObject(t, "per_token_s",
                                r->n_ids > 1 ? (d->t_total_s - d->ttft_s) / (double)(r->n_ids - 1)
                                             : 0.0);
        cJSON_AddNumberToObject(t, "total_s", d->t_total_s);
    }
    l->out = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
}

// --- request lines ------------------------------------------------------------------------------

/* A number field: absent (false), or *v set (true); *bad when present but not a number in
 * [lo, hi] (or an integer where `integer`). */
static bool num_field(const cJSON *o, const char *key, double lo, double hi, bool integer,
                      double *v, const char **bad)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!x || cJSON_IsNull(x))
        return false;
    if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) || x->valuedouble < lo ||
        x->valuedouble > hi || (integer && x->valuedouble != floor(x->valuedouble))) {
        *bad = key;
        return false;
    }
    *v = x->valuedouble;
    return true;
}

/* The request of line l (already parsed): prompt ids and parameters, or l->err. */
static void parse_request(struct rt_session *s, const struct cli_args *a,
                          const struct rt_sample_params *base, unsigned base_given, long idx,
                          struct line *l)
{
    const cJSON *o = l->json;
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(o, "prompt");
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(o, "messages");
    const cJSON *pi = cJSON_GetObjectItemCaseSensitive(o, "prompt_token_ids");
    if (!!pr + !!ms + !!pi != 1) {
        l->err = dupf("give exactly one of \"prompt\", \"messages\" and \"prompt_token_ids\"%s%s",
                      "", "");
        return;
    }
    struct rt_gen_params *gp = &l->gp;
    *gp = rt_gen_params_default();
    gp->sample = *base;
    gp->max_tokens = a->n_predict;
    gp->ignore_eos = a->ignore_eos;
    unsigned given = base_given;
    const char *bad = NULL;
    double v;
    if (num_field(o, "max_tokens", 0, 16777216, true, &v, &bad))
        gp->max_tokens = (long)v;
    if (num_field(o, "temperature", 0, 1e6, false, &v, &bad))
        gp->sample.temperature = (float)v, given |= RT_GEN_TEMPERATURE;
    if (num_field(o, "top_p", 1e-9, 1, false, &v, &bad))
        gp->sample.top_p = (float)v, given |= RT_GEN_TOP_P;
    if (num_field(o, "top_k", -1, 1 << 30, true, &v, &bad))
        gp->sample.top_k = v < 0 ? 0 : (int32_t)v, given |= RT_GEN_TOP_K;
    if (num_field(o, "min_p", 0, 1, false, &v, &bad))
        gp->sample.min_p = (float)v, given |= RT_GEN_MIN_P;
    if (num_field(o, "repetition_penalty", 1e-9, 1e6, false, &v, &bad))
        gp->sample.repeat_penalty = (float)v, given |= RT_GEN_REPEAT_PENALTY;
    if (num_field(o, "seed", 0, 9007199254740992.0, true, &v, &bad))
        gp->sample.seed = (uint64_t)v;
    else if (!cli_given(a, "seed"))
        gp->sample.seed = base->seed ^ ((uint64_t)idx * 0x9e3779b97f4a7c15ull);
    if (bad) {
        l->err = dupf("\"%s\" must be a number in its range%s", bad, "");
        return;
    }
    const cJSON *ie = cJSON_GetObjectItemCaseSensitive(o, "ignore_eos");
    if (ie && !cJSON_IsNull(ie)) {
        if (!cJSON_IsBool(ie)) {
            l->err = dupf("\"ignore_eos\" must be true or false%s%s", "", "");
            return;
        }
        gp->ignore_eos = cJSON_IsTrue(ie);
    }
    rt_session_sampling_defaults(s, given, &gp->sample);
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "stop");
    if (st && !cJSON_IsNull(st)) {
        if (cJSON_IsString(st)) {
            l->stops[gp->n_stops++] = st->valuestring;
        } else if (cJSON_IsArray(st) && cJSON_GetArraySize(st) <= RT_GEN_MAX_STOPS) {
            const cJSON *x;
            cJSON_ArrayForEach(x, st) {
                if (!cJSON_IsString(x) || !x->valuestring[0]) {
                    l->err = dupf("\"stop\" entries must be non-empty strings%s%s", "", "");
                    return;
                }
                l->stops[gp->n_stops++] = x->valuestring;
            }
        } else {
            l->err = dupf("\"stop\" must be a string or a list of up to 16 strings%s%s", "", "");
            return;
        }
        if (gp->n_stops && !rt_session_tok(s)) {
            l->err = dupf("stop strings need the model's tokenizer, which it lacks%s%s", "", "");
            return;
        }
        for (int i = 0; i < gp->n_stops; i++)
            if (!l->stops[i][0] || cli_utf8_invalid_at(l->stops[i], strlen(l->stops[i])) >= 0) {
                l->err = dupf("\"stop\" strings must be non-empty UTF-8%s%s", "", "");
                return;
            }
        gp->stops = l->stops;
    }
    struct rt_prompt p = {0};
    struct rt_chat_msg msgs[64];
    int32_t *given_ids = NULL;
    if (pr) {
        if (!cJSON_IsString(pr)) {
            l->err = dupf("\"prompt\" must be a string%s%s", "", "");
            return;
        }
        p.text = pr->valuestring;
        gp->decode_flags = RT_TOK_DECODE_SKIP_SPECIAL | RT_TOK_DECODE_KEEP_SPACE;
    } else if (ms) {
        if (!cJSON_IsArray(ms) || cJSON_GetArraySize(ms) < 1 || cJSON_GetArraySize(ms) > 64) {
            l->err = dupf("\"messages\" must be a list of 1..64 {\"role\", \"content\"}%s%s", "", "");
            return;
        }
        const cJSON *m;
        cJSON_ArrayForEach(m, ms) {
            const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "role");
            const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
            if (!cJSON_IsString(r) || !cJSON_IsString(c) ||
                (strcmp(r->valuestring, "system") && strcmp(r->valuestring, "user") &&
                 strcmp(r->valuestring, "assistant"))) {
                l->err = dupf("each message needs \"role\" (system, user or assistant) and "
                              "\"content\" strings%s%s", "", "");
                return;
            }
            msgs[p.n_msgs++] = (struct rt_chat_msg){r->valuestring, c->valuestring};
        }
        p.msgs = msgs;
        p.family = a->chat_template ? rt_chat_family_parse(a->chat_template) : RT_CHAT_NONE;
    } else {
        const int n = cJSON_IsArray(pi) ? cJSON_GetArraySize(pi) : -1;
        if (n < 1) {
            l->err = dupf("\"prompt_token_ids\" must be a non-empty list of token ids%s%s", "", "");
            return;
        }
        given_ids = malloc((size_t)n * sizeof(int32_t));
        if (!given_ids) {
            l->err = dupf("out of memory%s%s", "", "");
            return;
        }
        int i = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, pi) {
            if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) ||
                x->valuedouble < 0 || x->valuedouble >= rt_session_n_vocab(s)) {
                free(given_ids);
                char num[32];
                snprintf(num, sizeof num, "%d", rt_session_n_vocab(s));
                l->err = dupf("\"prompt_token_ids\" must hold integers in [0, %s)%s", num, "");
                return;
            }
            given_ids[i++] = (int32_t)x->valuedouble;
        }
        p.ids = given_ids;
        p.n_ids = (size_t)n;
    }
    enum rt_err e = rt_session_encode(s, &p, &l->ids, &l->n_ids);
    free(given_ids);
    if (e) {
        l->err = dupf("%s%s", qs_log_last()[0] ? qs_log_last() : rt_err_str(e), "");
        return;
    }
    gp->extra_eos = rt_session_chat_end(s, &p);
    const int n_ctx = rt_session_n_ctx(s);
    if ((long long)l->n_ids >= n_ctx) {
        char m[160];
        snprintf(m, sizeof m, "the prompt has %zu tokens, the context holds %d (one position "
                 "must stay free to generate)", l->n_ids, n_ctx);
        l->err = dupf("%s%s", m, "");
    }
}

/* Split text into lines (in place); returns how many (blank lines skipped), or -1. */
static long split_lines(char *text, size_t len, char ***out)
{
    long n = 0, cap = 0;
    char **v = NULL;
    for (size_t i = 0; i < len;) {
        size_t j = i;
        while (j < len && text[j] != '\n')
            j++;
        text[j < len ? j : len - 0] = '\0';
        const char *p = text + i;
        while (*p == ' ' || *p == '\t' || *p == '\r')
            p++;
        if (*p) {
            if (n == cap) {
                cap = cap ? 2 * cap : 64;
                char **nv = realloc(v, (size_t)cap * sizeof(char *));
                if (!nv || cap > MAX_LINES) {
                    free(nv ? nv : v);
                    return -1;
                }
                v = nv;
            }
            v[n++] = text + i;
        }
        i = j + 1;
    }
    *out = v;
    return n;
}

int cmd_run_prompts(const struct cli_args *a, const struct rt_sample_params *basep,
                    unsigned base_given)
{
    const struct rt_sample_params base = *basep;
    char *text = NULL;
    size_t len = 0;
    int rc = cli_read_text(a->prompts, MAX_PROMPTS_FILE, &text, &len);
    if (rc)
        return rc;
    char *buf = realloc(text, len + 1); /* room for the last line's NUL */
    if (!buf) {
        free(text);
        qs_log_error(__func__, "out of memory");
        return QS_EXIT_RUNTIME;
    }
    text = buf;
    text[len] = '\0';
    char **lines = NULL;
    const long n = split_lines(text, len, &lines);
    if (n < 0) {
        free(text);
        qs_log_error(__func__, "%s: out of memory or more than %d lines", a->prompts, MAX_LINES);
        return QS_EXIT_RUNTIME;
    }
    struct rt_session_opts so = {.path = a->pos[0], .model = cli_model_opts(a)};
    struct rt_session *s = NULL;
    struct rt_engine *eng = NULL;
    struct line *L = calloc((size_t)(n ? n : 1), sizeof(*L));
    enum rt_err e = L ? RT_ERR_NONE : RT_ERR_NOMEM;
    if (!e) {
        const bool cuda = cli_resolve_device(&so.model) == RT_DEVICE_CUDA;
        so.model.n_seqs = a->max_num_seqs > 0 ? (int)a->max_num_seqs : cuda ? 64 : 8;
        if (!(a->kv_cache_gb > 0))
            so.model.kv_mem_fraction = 0.9;
        e = rt_session_open(&so, &s);
    }
    if (!e) {
        const struct rt_engine_opts eo = {.max_batch_tokens = (int)a->max_batch_tokens};
        e = rt_engine_create(s, &eo, &eng);
    }
    if (e) {
        rc = cli_exit_rt(e);
        goto out;
    }
    cli_catch_signals();
    bool refused = false;
    for (long i = 0; i < n; i++) {
        struct line *l = &L[i];
        l->json = cJSON_Parse(lines[i]);
        if (!cJSON_IsObject(l->json)) {
            l->err = dupf("not a JSON object%s%s", "", "");
        } else {
            qs_log_set_quiet(true); /* the message goes to its output line */
            parse_request(s, a, &base, base_given, i, l);
            qs_log_set_quiet(false);
        }
        if (!l->err) {
            const struct rt_engine_req r = {
                .ids = l->ids, .n_ids = l->n_ids, .gen = l->gp,
                .cb = {.on_text = on_text, .user = l},
                .on_finish = on_finish, .user = l};
            int64_t id;
            if ((e = rt_engine_add(eng, &r, &id)))
                l->err = dupf("%s%s", qs_log_last()[0] ? qs_log_last() : rt_err_str(e), "");
            e = RT_ERR_NONE;
        }
        refused |= l->err != NULL;
    }
    int running = 0, waiting = 0;
    do {
        if (cli_cancel) {
            for (long i = 0; i < n; i++)
                rt_engine_cancel(eng, (int64_t)i); /* ids are issued in order from 0 */
        }
        e = rt_engine_step(eng, &running, &waiting);
    } while (!e && running + waiting > 0);
    /* the output, in input order */
    size_t olen = 0, ocap = 4096;
    char *ob = malloc(ocap);
    for (long i = 0; ob && i < n; i++) {
        struct line *l = &L[i];
        cJSON *o = l->out && !l->err ? cJSON_Parse(l->out) : cJSON_CreateObject();
        if (cJSON_GetObjectItemCaseSensitive(o, "index"))
            cJSON_ReplaceItemInObjectCaseSensitive(o, "index", cJSON_CreateNumber((double)i));
        else
            cJSON_AddNumberToObject(o, "index", (double)i);
        if (l->err || !l->out) {
            cJSON *er = cJSON_AddObjectToObject(o, "error");
            cJSON_AddStringToObject(er, "message", l->err ? l->err : "not run (interrupted)");
            cJSON_AddStringToObject(er, "type", l->err ? "invalid_request_error" : "cancelled");
        }
        char *js = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        const size_t jl = js ? strlen(js) : 0;
        if (olen + jl + 2 > ocap) {
            while (olen + jl + 2 > ocap)
                ocap *= 2;
            char *nb = realloc(ob, ocap);
            if (!nb) {
                free(ob);
                ob = NULL;
                free(js);
                break;
            }
            ob = nb;
        }
        memcpy(ob + olen, js, jl);
        olen += jl;
        ob[olen++] = '\n';
        free(js);
    }
    if (!ob) {
        qs_log_error(__func__, "out of memory for the output");
        rc = QS_EXIT_RUNTIME;
    } else if (a->out) {
        rc = rt_file_write(a->out, ob, olen) ? QS_EXIT_IO : QS_EXIT_OK;
    } else {
        fwrite(ob, 1, olen, stdout);
        rc = cli_flush_stdout();
    }
    free(ob);
    struct rt_engine_stats st;
    rt_engine_stats(eng, &st);
    fprintf(stderr, "%s: %ld request%s, %ld prompt tokens computed (%ld from the prefix cache), "
                    "%ld generated, %ld steps, %ld preemption%s, peak KV blocks %d of %d\n",
            qs_log_prog(), n, cli_plural(n), st.prompt_tokens, st.cached_tokens,
            st.generation_tokens, st.steps, st.preemptions, cli_plural(st.preemptions),
            st.peak_blocks_used, st.blocks_total);
    if (e && !rc)
        rc = cli_exit_rt(e);
    if (!rc && cli_cancel) {
        cli_report_cancel();
        rc = QS_EXIT_RUNTIME;
    }
    if (!rc && refused)
        rc = QS_EXIT_BAD_INPUT;
out:
    for (long i = 0; L && i < n; i++) {
        cJSON_Delete(L[i].json);
        free(L[i].ids);
        free(L[i].err);
        free(L[i].text);
        free(L[i].out);
    }
    free(L);
    free(lines);
    free(text);
    rt_engine_free(eng);
    rt_session_close(s);
    return rc;
}
