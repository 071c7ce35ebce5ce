/*
 * test_cli_batch.c - `qshard run --prompts FILE.jsonl` and `qshard bench batch` end to end on the
 * KJV demo model (tests/data/models/kjv-llama-awq-gemm, converted into a temp directory), CPU:
 *   - 9 requests (text prompts, four sharing a 40-token prefix, token-id prompts, greedy and
 *     seeded sampling, stop strings, different max_tokens) run at most 3 at once in a KV cache
 *     of 6 blocks of 16 tokens (so sequences are preempted and recomputed) and again with a big
 *     cache (prefix-cache hits): every request's token_ids and text equal `qshard run -p TEXT`
 *     (or --tokens) with the same parameters run alone; also at TP 2;
 *   - the same batch op by op (--debug-no-graph: on CUDA no decode graph of any batch size)
 *     gives the same ids;
 *   - the same batch op by op (--debug-no-graph: on CUDA no decode graph of any batch size)
 *     gives the same ids; TP 2 runs where QSHARD_DEVICE_TP2 says (default cpu), compared with
 *     the requests alone there;
 *   - bad lines (not JSON, a wrong type, both prompt and messages, an out-of-range value, a
 *     prompt longer than the context) get an error object on their own line, in input order,
 *     the others still run, exit 2; --out writes the same lines to a file;
 *   - --max-num-seqs 0 and a --kv-cache-gb too small for one sequence are refused with clear
 *     messages;
 *   - bench batch -o json: one test per concurrency with the request and token counts asked for.
 * Run: ./build/test_cli_batch (from the repository root).
 */
#include "t_cli.h"

enum { NREQ = 9 };

static const char *prefix =
    "And it came to pass after these things, that God did tempt Abraham, and said unto him, "
    "Abraham: and he said, Behold, here I am.";

struct rq {
    char text[512];
    const char *ids;  /* token-id prompt instead of text, or NULL */
    int max_tokens;
    double temp;      /* 0: greedy */
    int seed;
    const char *stop; /* or NULL */
};

static struct rq reqs[NREQ];

static void make_reqs(void)
{
    static const char *const tails[] = {" And he said", " Then", " In the beginning", " Who",
                                        " And Moses", " The LORD", " Blessed", " Now", " Lo"};
    for (int i = 0; i < NREQ; i++) {
        struct rq *r = &reqs[i];
        memset(r, 0, sizeof(*r));
        snprintf(r->text, sizeof r->text, "%s%s", i % 2 == 0 ? prefix : "", tails[i]);
        r->max_tokens = 20 + (i * 7) % 19;
        r->temp = i % 3 == 1 ? 0.9 : 0.0;
        r->seed = 100 + i;
        r->stop = i == 4 ? " the" : NULL;
    }
    reqs[7].ids = "1,450,3786,310";
}

/* The request line of r. */
static void req_line(const struct rq *r, char *buf, size_t n)
{
    char stop[64] = "";
    if (r->stop)
        snprintf(stop, sizeof stop, ", \"stop\": [\"%s\"]", r->stop);
    if (r->ids)
        snprintf(buf, n, "{\"prompt_token_ids\": [%s], \"max_tokens\": %d, \"temperature\": %g, "
                 "\"seed\": %d%s}", r->ids, r->max_tokens, r->temp, r->seed, stop);
    else
        snprintf(buf, n, "{\"prompt\": \"%s\", \"max_tokens\": %d, \"temperature\": %g, "
                 "\"seed\": %d%s}", r->text, r->max_tokens, r->temp, r->seed, stop);
}

/* Each request alone through `qshard run --json`: its ids (csv) and text. */
static void run_alone(const char *dir, const char *device, char **want_ids, char **want_text)
{
    for (int i = 0; i < NREQ; i++) {
        const struct rq *r = &reqs[i];
        char nt[16], tp[32], sd[16];
        snprintf(nt, sizeof nt, "%d", r->max_tokens);
        snprintf(tp, sizeof tp, "%g", r->temp);
        snprintf(sd, sizeof sd, "%d", r->seed);
        const char *args[32] = {"run", dir, r->ids ? "--tokens" : "-p", r->ids ? r->ids : r->text,
                                "-n", nt, "--temp", tp, "--seed", sd, "--json", "--device", device,
                                "--top-k", "40", "--top-p", "0.95"};
        int na = 17;
        if (r->stop) {
            args[na++] = "--stop";
            args[na++] = r->stop;
        }
        args[na] = NULL;
        struct proc p = run_v(args);
        CHECK_EXIT(p, 0, "run alone");
        cJSON *o = cJSON_Parse(p.out);
        want_ids[i] = ids_csv(cJSON_GetObjectItemCaseSensitive(o, "ids"));
        want_text[i] = strdup(jstr(o, "text") ? jstr(o, "text") : "?");
        cJSON_Delete(o);
        proc_free(&p);
    }
}

/* The prompts file: the requests with bad lines among them; *bad_at[] their line numbers. */
static const char *write_prompts(char *path, size_t n)
{
    char *buf = malloc(1 << 16);
    size_t l = 0;
    for (int i = 0; i < NREQ; i++) {
        char line[8192];
        req_line(&reqs[i], line, sizeof line);
        l += (size_t)snprintf(buf + l, (1 << 16) - l, "%s\n", line);
        if (i == 2)
            l += (size_t)snprintf(buf + l, (1 << 16) - l, "this is not json\n\n");
        if (i == 5)
            l += (size_t)snprintf(buf + l, (1 << 16) - l,
                                  "{\"prompt\": 12}\n{\"prompt\": \"a\", \"messages\": []}\n"
                                  "{\"prompt\": \"a\", \"top_p\": 2}\n");
    }
    /* longer than --ctx 96 and 128 */
    l += (size_t)snprintf(buf + l, (1 << 16) - l, "{\"prompt_token_ids\": [");
    for (int i = 0; i < 130; i++)
        l += (size_t)snprintf(buf + l, (1 << 16) - l, "%s%d", i ? "," : "", 300 + i);
    l += (size_t)snprintf(buf + l, (1 << 16) - l, "]}\n");
    cli_write_tmp("prompts.jsonl", buf, path, n);
    free(buf);
    return path;
}

/* Line numbers (0-based, blank line skipped) of the requests and the bad lines. */
static const int req_at[NREQ] = {0, 1, 2, 4, 5, 6, 10, 11, 12};
static const int bad_at[5] = {3, 7, 8, 9, 13};
enum { NLINES = 14 };

static void check_out(const char *label, const char *out, char **want_ids, char **want_text)
{
    cJSON *lines[NLINES + 1] = {0};
    int n = 0;
    char *copy = strdup(out), *save = NULL;
    for (char *t = strtok_r(copy, "\n", &save); t && n <= NLINES; t = strtok_r(NULL, "\n", &save))
        lines[n++] = cJSON_Parse(t);
    free(copy);
    CHECK_MSG(n == NLINES, "%s: %d output lines, want %d", label, n, NLINES);
    for (int i = 0; i < n; i++) {
        const cJSON *ix = cJSON_GetObjectItemCaseSensitive(lines[i], "index");
        CHECK_MSG(cJSON_IsNumber(ix) && ix->valueint == i, "%s: line %d has index %d", label, i,
                  cJSON_IsNumber(ix) ? ix->valueint : -1);
    }
    for (int k = 0; k < 5 && n == NLINES; k++) {
        const cJSON *er = cJSON_GetObjectItemCaseSensitive(lines[bad_at[k]], "error");
        CHECK_MSG(er && jstr(er, "message") && strlen(jstr(er, "message")) > 5,
                  "%s: bad line %d has no error message", label, bad_at[k]);
    }
    const cJSON *er = cJSON_GetObjectItemCaseSensitive(lines[13], "error");
    CHECK_MSG(er && strstr(jstr(er, "message") ? jstr(er, "message") : "", "context"),
              "%s: the long prompt's error does not name the context", label);
    for (int i = 0; i < NREQ && n == NLINES; i++) {
        const cJSON *o = lines[req_at[i]];
        char *got = ids_csv(cJSON_GetObjectItemCaseSensitive(o, "token_ids"));
        CHECK_MSG(got && want_ids[i] && !strcmp(got, want_ids[i]),
                  "%s: request %d (%s): batched ids %s, alone %s", label, i,
                  reqs[i].temp > 0 ? "sampled" : "greedy", got ? got : "-",
                  want_ids[i] ? want_ids[i] : "-");
        const char *txt = jstr(o, "text");
        CHECK_MSG(txt && !strcmp(txt, want_text[i]), "%s: request %d text '%s', alone '%s'",
                  label, i, txt ? txt : "-", want_text[i]);
        const char *fr = jstr(o, "finish_reason");
        CHECK(fr && (!strcmp(fr, "stop") || !strcmp(fr, "length")));
        const cJSON *u = cJSON_GetObjectItemCaseSensitive(o, "usage");
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
        CHECK(cJSON_IsNumber(ct) && ct->valueint <= reqs[i].max_tokens);
        free(got);
    }
    for (int i = 0; i < n; i++)
        cJSON_Delete(lines[i]);
}

static long stat_of(const char *err, const char *key)
{
    const char *p = strstr(err ? err : "", key);
    if (!p)
        return -1;
    while (p > err && p[-1] == ' ')
        p--;
    while (p > err && p[-1] >= '0' && p[-1] <= '9')
        p--;
    return strtol(p, NULL, 10);
}

int main(void)
{
    T_INIT("cli_batch");
    if (!cli_setup())
        return 1;
    cJSON *index = load_index();
    const cJSON *models = cJSON_GetObjectItemCaseSensitive(index, "models"), *m, *kjv = NULL;
    cJSON_ArrayForEach(m, models)
        if (jstr(m, "name") && !strcmp(jstr(m, "name"), "kjv-llama-awq-gemm"))
            kjv = m;
    CHECK_MSG(kjv != NULL, "the KJV demo model is not in tests/data/models/INDEX.json");
    char *dir = kjv ? convert(kjv, 1) : NULL, *dir2 = kjv ? convert(kjv, 2) : NULL;
    if (dir && dir2) {
        make_reqs();
        char *want_ids[NREQ], *want_text[NREQ];
        run_alone(dir, g_device, want_ids, want_text);
        char pf[512], of[512];
        write_prompts(pf, sizeof pf);
        snprintf(of, sizeof of, "%s/out.jsonl", g_tmp);
        /* 6 blocks of 16 tokens (block 0 reserved) for 3 sequences of up to 96: preemption */
        /* blocks of 5 layers x 4 kv heads x 16 x 64 x 2 (k, v): fp32 on the CPU, fp16 on cuda */
        const bool f16 = !strcmp(g_device, "cuda");
        struct proc p = run("run", dir, "--prompts", pf, "--max-num-seqs", "3", "--ctx", "96",
                            "--kv-cache-gb", f16 ? "0.000575" : "0.00115", "--device", g_device, "--top-k", "40",
                            "--top-p", "0.95", NULL);
        CHECK_EXIT(p, 2, "run --prompts (small cache)");
        check_out("small cache", p.out, want_ids, want_text);
        CHECK_MSG(stat_of(p.err, "preemption") > 0, "small cache: no preemption: %s", p.err);
        proc_free(&p);
        /* 4 at once: the later requests find the earlier ones' prefix blocks */
        p = run("run", dir, "--prompts", pf, "--ctx", "128", "--out", of, "--max-num-seqs", "4",
                "--device", g_device,
                "--top-k", "40", "--top-p", "0.95", NULL);
        CHECK_EXIT(p, 2, "run --prompts --out");
        CHECK_MSG(p.out_len == 0, "--out: stdout not empty");
        CHECK_MSG(stat_of(p.err, "from the prefix cache") > 0, "no prefix-cache hit: %s", p.err);
        FILE *f = fopen(of, "rb");
        char *fo = calloc(1, 1 << 20);
        if (f) {
            size_t got = fread(fo, 1, (1 << 20) - 1, f);
            fo[got] = '\0';
            fclose(f);
        }
        CHECK_MSG(f != NULL, "--out file missing");
        check_out("big cache --out", fo, want_ids, want_text);
        free(fo);
        proc_free(&p);
        /* op by op (no decode graphs of the batch sizes): the same ids */
        p = run("run", dir, "--prompts", pf, "--ctx", "128", "--max-num-seqs", "4",
                "--debug-no-graph", "--device", g_device, "--top-k", "40", "--top-p", "0.95", NULL);
        CHECK_EXIT(p, 2, "run --prompts --debug-no-graph");
        check_out("no graphs", p.out, want_ids, want_text);
        proc_free(&p);
        if (strcmp(g_device_tp2, g_device)) { /* TP-2 elsewhere: its own requests alone there */
            for (int i = 0; i < NREQ; i++)
                free(want_ids[i]), free(want_text[i]);
            run_alone(dir, g_device_tp2, want_ids, want_text);
        }
        p = run("run", dir2, "--prompts", pf, "--ctx", "128", "--max-num-seqs", "4", "--device",
                g_device_tp2, "--top-k", "40", "--top-p", "0.95", NULL);
        CHECK_EXIT(p, 2, "run --prompts TP-2");
        check_out("TP-2", p.out, want_ids, want_text);
        proc_free(&p);
        for (int i = 0; i < NREQ; i++)
            free(want_ids[i]), free(want_text[i]);
        /* refusals */
        p = run("run", dir, "--prompts", pf, "--max-num-seqs", "0", NULL);
        CHECK_EXIT(p, 1, "--max-num-seqs 0");
        CHECK(strstr(p.err, "--max-num-seqs") != NULL);
        proc_free(&p);
        p = run("run", dir, "--prompts", pf, "--ctx", "128", "--kv-cache-gb", "0.0005",
                "--device", g_device, NULL);
        CHECK_MSG(p.code == 1 && strstr(p.err, "less than one sequence"),
                  "--kv-cache-gb too small: exit %d, %s", p.code, p.err);
        proc_free(&p);
        p = run("run", dir, "-p", "x", "--max-num-seqs", "4", NULL);
        CHECK_EXIT(p, 1, "--max-num-seqs without --prompts");
        proc_free(&p);
        /* bench batch */
        p = run("bench", "batch", dir, "--concurrency", "1,4", "--input-len", "16",
                "--output-len", "8", "--num-prompts", "6", "-o", "json", "--device", g_device, NULL);
        CHECK_EXIT(p, 0, "bench batch");
        cJSON *bj = cJSON_Parse(p.out);
        const cJSON *tests = cJSON_GetObjectItemCaseSensitive(bj, "tests"), *t;
        CHECK(cJSON_GetArraySize(tests) == 2);
        int k = 0;
        cJSON_ArrayForEach(t, tests) {
            const cJSON *c = cJSON_GetObjectItemCaseSensitive(t, "concurrency");
            const cJSON *ot = cJSON_GetObjectItemCaseSensitive(t, "output_tokens");
            const cJSON *tps = cJSON_GetObjectItemCaseSensitive(t, "output_tok_s");
            const cJSON *pk = cJSON_GetObjectItemCaseSensitive(t, "peak_kv_blocks");
            CHECK(cJSON_IsNumber(c) && c->valueint == (k ? 4 : 1));
            CHECK(cJSON_IsNumber(ot) && ot->valueint == 6 * 8);
            CHECK(cJSON_IsNumber(tps) && tps->valuedouble > 0);
            /* at most concurrency sequences of 24 tokens: 2 blocks each */
            CHECK(cJSON_IsNumber(pk) && pk->valueint >= 1 && pk->valueint <= 2 * (k ? 4 : 1));
            k++;
        }
        cJSON_Delete(bj);
        proc_free(&p);
    }
    free(dir);
    free(dir2);
    cJSON_Delete(index);
    cli_teardown();
    return t_done();
}
