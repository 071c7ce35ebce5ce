/*
 * cmd_run.c - `qshard run MODEL (-p TEXT | -f FILE | --tokens 1,2,3) [options]`: generate text
 * through the session API (runtime/rt_session.h: rt_session_open, rt_session_encode,
 * rt_generate); this file only turns options into parameters and prints.
 *
 * Policies (also in --help):
 *   - Context: the limit is --ctx (default min(max_position_embeddings, 4096)). A prompt that
 *     does not fit (prompt tokens >= ctx: one position must stay free) is refused with exit 2
 *     naming both numbers; --truncate keeps its last ctx-1 tokens instead. Generation that
 *     reaches the limit stops with a note.
 *   - Stops: every eos id of the session, the chat family's end token with --chat, --stop
 *     strings (on the generated text only); the stop token or string is not printed. With
 *     --print-ids the id that completed a stop string is the last one printed.
 *   - Sampling: the options given, else generation_config.json's values (as vLLM), else the
 *     table's defaults; -v says where each came from.
 *   - Output: the text streams to stdout (the prompt echoed first unless --chat, --no-echo);
 *     --print-ids prints the ids; --json one JSON object at the end. The speed line goes to
 *     stderr. Ctrl-C (SIGINT) or SIGTERM: generation stops after the step in progress, the
 *     text so far is flushed, the speed line says "stopped: interrupted", exit 3 (as convert).
 *
 * Test: ./build/test_cli_run.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h> /* --json */

#include "cli.h"
#include "cmd.h"

#define MAX_TEXT_FILE (1ull << 30)

static const char k_usage[] =
    "usage: qshard run MODEL (-p \"text\" | -f FILE | --tokens 1,2,3) [options]\n"
    "       qshard run MODEL --prompts FILE.jsonl [--out FILE.jsonl] [--max-num-seqs N]\n"
    "\n"
    "Generate from a converted model (a directory written by `qshard convert`, or a TP-1\n"
    "rank file). Text streams to stdout; speed (prefill and decode tokens/s) goes to\n"
    "stderr. Without --chat the prompt is echoed first. Ctrl-C stops after the current\n"
    "token: the text so far and the speed line are printed, exit 3.\n"
    "\n";
static const char k_trailer[] =
    "exit codes: 0 ok, 1 usage, 2 bad input (model file, prompt, token id), 3 runtime\n"
    "failure (GPU, memory) or interrupted, 4 I/O error\n";

/* Where the output goes: the stream, --print-ids, or --json (text collected). */
struct run_out {
    bool print_text; /* stream text to stdout */
    bool json;
    char *text;      /* --json: the generated text */
    size_t n_text, cap;
    cJSON *logprobs; /* --json --logprobs: [{id, token, logprob, top}] */
    const struct rt_tok *tok;
};

static enum rt_err on_text(void *user, const char *t, size_t n)
{
    struct run_out *o = user;
    if (o->print_text) {
        fwrite(t, 1, n, stdout);
        return fflush(stdout) == 0 && !ferror(stdout) ? RT_ERR_NONE : RT_ERR_IO;
    }
    if (!o->json)
        return RT_ERR_NONE;
    if (o->n_text + n + 1 > o->cap) {
        size_t cap = 2 * (o->n_text + n + 1);
        char *nt = realloc(o->text, cap);
        if (!nt)
            return RT_ERR_NOMEM;
        o->text = nt;
        o->cap = cap;
    }
    memcpy(o->text + o->n_text, t, n);
    o->n_text += n;
    o->text[o->n_text] = '\0';
    return RT_ERR_NONE;
}

static cJSON *token_json(const struct rt_tok *tok, int32_t id, float lp)
{
    cJSON *o = cJSON_CreateObject();
    const char *piece = tok ? rt_tok_piece(tok, id) : NULL;
    cJSON_AddNumberToObject(o, "id", id);
    if (piece)
        cJSON_AddStringToObject(o, "token", piece);
    cJSON_AddNumberToObject(o, "logprob", lp);
    return o;
}

static enum rt_err on_token(void *user, const struct rt_gen_token *t)
{
    struct run_out *o = user;
    if (!o->logprobs)
        return RT_ERR_NONE;
    cJSON *e = token_json(o->tok, t->id, t->logprob);
    cJSON *top = cJSON_AddArrayToObject(e, "top");
    for (int i = 0; i < t->n_top; i++)
        cJSON_AddItemToArray(top, token_json(o->tok, t->top_ids[i], t->top_logprobs[i]));
    cJSON_AddItemToArray(o->logprobs, e);
    return RT_ERR_NONE;
}

static cJSON *ids_json(const int32_t *ids, size_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    return a;
}

/* The --json document. */
static void print_json(struct run_out *o, const int32_t *prompt, size_t n_prompt,
                       const struct rt_gen_result *r)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "text", o->text ? o->text : "");
    cJSON_AddItemToObject(root, "prompt_ids", ids_json(prompt, n_prompt));
    cJSON_AddItemToObject(root, "ids", ids_json(r->ids, r->n_ids));
    cJSON_AddStringToObject(root, "finish_reason", rt_gen_finish_reason(r->finish));
    cJSON_AddStringToObject(root, "stopped", rt_gen_finish_str(r->finish));
    cJSON *u = cJSON_AddObjectToObject(root, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)r->n_ids);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(n_prompt + r->n_ids));
    cJSON *t = cJSON_AddObjectToObject(root, "timings");
    cJSON_AddNumberToObject(t, "prefill_s", r->t_prefill_s);
    cJSON_AddNumberToObject(t, "prefill_tokens_per_s",
                            r->t_prefill_s > 0 ? (double)n_prompt / r->t_prefill_s : 0.0);
    cJSON_AddNumberToObject(t, "decode_s", r->t_decode_s);
    cJSON_AddNumberToObject(t, "decode_steps", (double)r->n_decode);
    cJSON_AddNumberToObject(t, "decode_tokens_per_s",
                            r->t_decode_s > 0 ? (double)r->n_decode / r->t_decode_s : 0.0);
    cJSON_AddNumberToObject(root, "seed", (double)r->seed);
    if (o->logprobs) {
        cJSON_AddItemToObject(root, "logprobs", o->logprobs);
        o->logprobs = NULL;
    }
    char *s = cJSON_PrintUnformatted(root);
    if (s)
        printf("%s\n", s);
    free(s);
    cJSON_Delete(root);
}

/* Combinations of options, all checked before the model loads. */
static int check_args(const struct cli_args *a)
{
    if (a->n_pos != 1)
        return cli_usage_error("expected one MODEL argument, got %d", a->n_pos);
    if (a->prompts && (a->prompt || a->tokens || a->file || a->json || a->print_ids ||
                       a->logprobs || a->truncate || a->system))
        return cli_usage_error("--prompts reads every request from its file: leave out -p, -f, "
                               "--tokens, --system, --json, --print-ids, --logprobs, --truncate");
    if (!a->prompts && (a->out || a->max_num_seqs || a->max_batch_tokens || a->kv_cache_gb > 0))
        return cli_usage_error("--out, --max-num-seqs, --max-batch-tokens and --kv-cache-gb "
                               "go with --prompts");
    if (a->prompts) {
        for (int i = 0; i < a->n_stops; i++)
            if (cli_utf8_invalid_at(a->stops[i], strlen(a->stops[i])) >= 0) {
                qs_log_error(__func__, "--stop string %d is not valid UTF-8", i + 1);
                return QS_EXIT_BAD_INPUT;
            }
        return QS_EXIT_OK;
    }
    if (!!a->prompt + !!a->tokens + !!a->file != 1)
        return cli_usage_error("give exactly one of -p \"text\", -f FILE and --tokens 1,2,3");
    if (a->tokens && (a->chat || a->chat_template))
        return cli_usage_error("--chat formats text; it cannot be used with --tokens");
    if (a->system && !(a->chat || a->chat_template))
        return cli_usage_error("--system needs --chat");
    if (a->logprobs && !a->json)
        return cli_usage_error("--logprobs needs --json");
    if (a->json && a->print_ids)
        return cli_usage_error("--json already holds the ids: leave out --print-ids");
    for (int i = 0; i < a->n_stops; i++)
        if (cli_utf8_invalid_at(a->stops[i], strlen(a->stops[i])) >= 0) {
            qs_log_error(__func__, "--stop string %d is not valid UTF-8", i + 1);
            return QS_EXIT_BAD_INPUT;
        }
    return QS_EXIT_OK;
}

/* The sampling parameters: options given, else generation_config.json, else the defaults;
 * -v says which. */
static struct rt_sample_params sampling(const struct rt_session *s, const struct cli_args *a)
{
    static const char *const names[5] = {"temp", "top-k", "top-p", "min-p", "repeat-penalty"};
    static const unsigned bits[5] = {RT_GEN_TEMPERATURE, RT_GEN_TOP_K, RT_GEN_TOP_P,
                                     RT_GEN_MIN_P, RT_GEN_REPEAT_PENALTY};
    struct rt_sample_params p = rt_sample_params_default();
    p.temperature = a->temp;
    p.top_k = (int32_t)a->top_k;
    p.top_p = a->top_p;
    p.min_p = a->min_p;
    p.repeat_penalty = a->repeat_penalty;
    unsigned given = 0;
    for (int i = 0; i < 5; i++)
        given |= cli_given(a, names[i]) ? bits[i] : 0;
    const bool seed_given = cli_given(a, "seed");
    p.seed = seed_given ? a->seed : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    const unsigned from_gc = rt_session_sampling_defaults(s, given, &p);
    const char *src[5];
    for (int i = 0; i < 5; i++)
        src[i] = (given & bits[i]) ? "option" : (from_gc & bits[i]) ? "generation_config.json"
                                                                   : "default";
    qs_log_debug("sampling: temp %g (%s), top-k %d (%s), top-p %g (%s), min-p %g (%s), "
                 "repeat-penalty %g (%s), seed %llu (%s)", (double)p.temperature, src[0],
                 (int)p.top_k, src[1], (double)p.top_p, src[2], (double)p.min_p, src[3],
                 (double)p.repeat_penalty, src[4], (unsigned long long)p.seed,
                 seed_given ? "option" : "clock");
    return p;
}

/* The prompt as ids (*ids malloc'd), truncated with --truncate; *end: the chat end token. */
static int prompt(const struct rt_session *s, const struct cli_args *a, const char *text,
                  int32_t **ids, size_t *n, int32_t *end)
{
    *end = -1;
    if (a->chat || a->chat_template) {
        struct rt_chat_msg msgs[2];
        struct rt_prompt p = {.no_bos = a->no_bos, .msgs = msgs};
        if (a->system)
            msgs[p.n_msgs++] = (struct rt_chat_msg){"system", a->system};
        msgs[p.n_msgs++] = (struct rt_chat_msg){"user", text};
        p.family = a->chat_template ? rt_chat_family_parse(a->chat_template) : RT_CHAT_NONE;
        enum rt_err e = rt_session_encode(s, &p, ids, n);
        *end = rt_session_chat_end(s, &p);
        if (e == RT_ERR_TOKENIZER && rt_session_tok(s) && p.family == RT_CHAT_NONE &&
            rt_chat_detect(rt_session_tok(s)) == RT_CHAT_NONE)
            fprintf(stderr, "hint: name the family with --chat-template "
                            "llama2|llama3|mistral|chatml|gemma|phi3\n");
        if (e)
            return cli_exit_rt(e);
    } else {
        int rc = cli_prompt_ids(s, a->tokens ? NULL : text, a->tokens, a->no_bos,
                                a->no_parse_special, "give token ids with --tokens 1,2,3 (the "
                                "generated ids are printed then)", ids, n);
        if (rc)
            return rc;
    }
    const long long ctx = rt_session_n_ctx(s);
    if ((long long)*n >= ctx && a->truncate) {
        const size_t keep = (size_t)ctx - 1;
        qs_log_warn("prompt truncated from %zu to its last %zu token%s (--ctx %lld)", *n, keep,
                    cli_plural((long long)keep), ctx);
        memmove(*ids, *ids + (*n - keep), keep * sizeof(**ids));
        *n = keep;
    } else if ((long long)*n >= ctx) {
        qs_log_error(__func__, "the prompt has %zu tokens, the context holds %lld (one position "
                     "must stay free to generate)", *n, ctx);
        fprintf(stderr, "hint: shorten the prompt, raise --ctx, or pass --truncate to keep the "
                        "last %lld token%s\n", ctx - 1, cli_plural(ctx - 1));
        return QS_EXIT_BAD_INPUT;
    }
    if (qs_log_get_level() >= QS_LOG_DEBUG) {
        char buf[512];
        size_t bl = 0;
        for (size_t i = 0; i < *n && i < 48 && bl + 16 < sizeof(buf); i++)
            bl += (size_t)snprintf(buf + bl, sizeof(buf) - bl, "%s%d", i ? "," : "", (int)(*ids)[i]);
        qs_log_debug("prompt ids: %s%s", buf, *n > 48 ? ",..." : "");
        qs_log_debug("prompt: %zu token(s)", *n);
    }
    return QS_EXIT_OK;
}

/* Generate and print; returns the exit code. */
static int generate(struct rt_session *s, const struct cli_args *a, const int32_t *ids, size_t n,
                    int32_t chat_end, const char *echo)
{
    struct rt_gen_params gp = rt_gen_params_default();
    gp.sample = sampling(s, a);
    gp.max_tokens = a->n_predict;
    gp.stops = a->stops;
    gp.n_stops = a->n_stops;
    gp.ignore_eos = a->ignore_eos;
    gp.extra_eos = chat_end;
    gp.logprobs = (int)a->logprobs;
    /* a continuation keeps its leading space; a chat reply is decoded alone */
    const bool chat = a->chat || a->chat_template;
    gp.decode_flags = RT_TOK_DECODE_SKIP_SPECIAL | (chat ? 0 : RT_TOK_DECODE_KEEP_SPACE);
    bool print_ids = a->print_ids;
    if (!rt_session_tok(s) && !print_ids && !a->json) {
        print_ids = true; /* no text to print: the ids are the output */
        fprintf(stderr, "%s: the model carries no tokenizer: printing the generated token ids "
                        "(as --print-ids)\n", qs_log_prog());
    }
    struct run_out out = {.print_text = !print_ids && !a->json, .json = a->json,
                          .tok = rt_session_tok(s),
                          .logprobs = a->logprobs ? cJSON_CreateArray() : NULL};
    struct rt_gen_callbacks cb = {.on_text = on_text, .on_token = on_token, .user = &out,
                                  .cancel = &cli_cancel};
    if (out.print_text && echo && !a->no_echo && !chat) {
        fputs(echo, stdout);
        fflush(stdout);
    }
    struct rt_gen_result r;
    cli_catch_signals();
    enum rt_err e = rt_generate(s, ids, n, &gp, &cb, &r);
    if (!e || e == RT_ERR_CANCELLED) {
        if (print_ids)
            for (size_t i = 0; i < r.n_ids; i++)
                printf("%s%d", i ? "," : "", (int)r.ids[i]);
        if (a->json)
            print_json(&out, ids, n, &r);
        else if (print_ids || !chat || r.n_ids)
            putchar('\n');
    }
    int rc = e && e != RT_ERR_CANCELLED ? cli_exit_rt(e) : cli_flush_stdout();
    if (!e || e == RT_ERR_CANCELLED)
        fprintf(stderr, "%s: prefill %zu token%s in %.3f s (%.2f tok/s), decode %ld token%s in "
                        "%.3f s (%.2f tok/s), %zu generated, stopped: %s\n", qs_log_prog(), n,
                cli_plural((long long)n), r.t_prefill_s,
                r.t_prefill_s > 0 ? (double)n / r.t_prefill_s : 0.0, r.n_decode,
                cli_plural(r.n_decode), r.t_decode_s,
                r.t_decode_s > 0 ? (double)r.n_decode / r.t_decode_s : 0.0, r.n_ids,
                rt_gen_finish_str(r.finish));
    if (e == RT_ERR_CANCELLED) {
        cli_report_cancel();
        rc = rc ? rc : QS_EXIT_RUNTIME;
    }
    rt_gen_result_free(&r);
    free(out.text);
    cJSON_Delete(out.logprobs);
    return rc;
}

int cmd_run(int argc, char **argv)
{
    struct cli_args a;
    int rc = cli_parse(CLI_RUN, "qshard run", k_usage, k_trailer, argc, argv, &a);
    if (rc)
        return rc == CLI_HELP ? QS_EXIT_OK : rc;
    if ((rc = check_args(&a)))
        return rc;
    if (a.prompts) { /* the batching engine: sampling options as each request's fallback */
        static const char *const names[5] = {"temp", "top-k", "top-p", "min-p", "repeat-penalty"};
        static const unsigned bits[5] = {RT_GEN_TEMPERATURE, RT_GEN_TOP_K, RT_GEN_TOP_P,
                                         RT_GEN_MIN_P, RT_GEN_REPEAT_PENALTY};
        struct rt_sample_params p = rt_sample_params_default();
        p.temperature = a.temp;
        p.top_k = (int32_t)a.top_k;
        p.top_p = a.top_p;
        p.min_p = a.min_p;
        p.repeat_penalty = a.repeat_penalty;
        p.seed = cli_given(&a, "seed") ? a.seed : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
        unsigned given = 0;
        for (int i = 0; i < 5; i++)
            given |= cli_given(&a, names[i]) ? bits[i] : 0;
        return cmd_run_prompts(&a, &p, given);
    }
    char *file_text = NULL;
    size_t fl = 0;
    if (a.file && (rc = cli_read_text(a.file, MAX_TEXT_FILE, &file_text, &fl)))
        return rc;
    const char *text = a.file ? file_text : a.prompt;
    struct rt_session_opts so = {.path = a.pos[0], .model = cli_model_opts(&a)};
    struct rt_session *s = NULL;
    int32_t *ids = NULL, chat_end = -1;
    size_t n = 0;
    enum rt_err e = rt_session_open(&so, &s);
    if (e)
        rc = cli_exit_rt(e);
    if (!rc && a.n_stops > 0 && !rt_session_tok(s)) {
        qs_log_error(__func__, "--stop strings need the model's tokenizer, which it lacks");
        rc = QS_EXIT_BAD_INPUT;
    }
    if (!rc)
        rc = prompt(s, &a, text, &ids, &n, &chat_end);
    if (!rc)
        rc = generate(s, &a, ids, n, chat_end, text);
    free(ids);
    free(file_text);
    rt_session_close(s);
    return rc;
}
