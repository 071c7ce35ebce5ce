/*
 * cmd_bench_model.c - `qshard bench model MODEL [-p 512] [-n 128] [-d 0] [-r 5] [-o md|json]`:
 * prompt processing and generation speed of a converted model, measured as llama.cpp's
 * llama-bench does. The loop is here; the model steps are the session's
 * (runtime/rt_session.h: rt_session_step, rt_session_reset), so the next token is chosen where
 * `qshard run` chooses it. Ctrl-C (SIGINT) or SIGTERM stops after the run in progress: the
 * rows of the finished tests are printed, then a summary line, exit 3.
 *
 * Test: ./build/test_cli_model (rows, tg ids equal to `run`'s, -d, usage errors, -o json).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h> /* -o json */

#include "cli.h"
#include "cmd.h"
#include "qs_util.h" /* qs_now_s */

static const char k_usage[] =
    "usage: qshard bench model MODEL [-p 512] [-n 128] [-d 0] [-r 5] [-b 2048]\n"
    "                          [--device cpu|cuda] [-o md|json]\n"
    "\n"
    "Prompt processing and generation speed of a converted model, measured the way\n"
    "llama.cpp's llama-bench does: ppN runs a prompt of N token ids from an empty KV cache\n"
    "(forwards of at most --batch-size positions) up to the first generated token; tgN\n"
    "generates N tokens one at a time from an empty cache (decode steps, the first after\n"
    "BOS). Ids are pseudo-random (fixed seed), the next token greedy, chosen where\n"
    "`qshard run` chooses it (on the GPU when it can). Each test runs once untimed\n"
    "(warm-up: kernels loaded, decode graph recorded), then -r times; prints a table of\n"
    "mean tokens/s +/- the standard deviation over the runs. With a depth d > 0\n"
    "(\"ppN @ dD\", \"tgN @ dD\"), each run first fills the KV cache with d prompt ids\n"
    "(not timed), then runs the test at positions d, d+1, ...\n"
    "\n";
static const char k_trailer[] =
    "exit codes: 0 ok, 1 usage (also a test longer than --ctx), 2 bad input (model\n"
    "file), 3 runtime failure (GPU, memory) or interrupted, 4 I/O error\n";

/* One bench run's state. */
struct bench {
    struct rt_session *s;
    struct rt_sampler smp;
    bool dev_pick;
    float *logits; /* [n_vocab]: host choice */
    int32_t *ids;  /* [need]: the prompt ids */
    double *secs;  /* [reps] */
    int reps;
};

/* The ids of the first timed run, for the debug log (tests compare them with `qshard run`). */
static void log_ids(const char *what, const int32_t *ids, int n, int first)
{
    char buf[256];
    size_t l = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && l + 16 < sizeof(buf); i++)
        l += (size_t)snprintf(buf + l, sizeof(buf) - l, "%s%d", i ? "," : "", (int)ids[i]);
    if (first >= 0)
        qs_log_debug("%s %d: %s%s", what, first, buf, l + 16 >= sizeof(buf) ? ",..." : "");
    else
        qs_log_debug("%s %s%s", what, buf, l + 16 >= sizeof(buf) ? ",..." : "");
}

/*
 * One test, warm-up then reps timed runs from an empty KV cache; b->secs[r]: seconds of run r
 * (>= 1 ns). depth > 0: each run first places ids[0..depth) (one untimed step) and the test
 * continues from position depth. pp: ids[depth..depth+len) in one step up to the first
 * generated id. tg: len decode steps, the first fed ids[depth] (BOS at depth 0), each next fed
 * the id it chose. Stops early (RT_ERR_CANCELLED) when the cancel flag is set.
 */
static enum rt_err bench_test(struct bench *b, int depth, bool pp, int len)
{
    int32_t seen[64];
    for (int r = -1; r < b->reps; r++) { /* r = -1: warm-up */
        if (cli_cancel)
            return RT_ERR_CANCELLED;
        rt_session_reset(b->s);
        rt_sampler_reset(&b->smp);
        int32_t next = b->ids[depth], ignored;
        enum rt_err e = RT_ERR_NONE;
        int ns = 0;
        if (depth > 0)
            e = rt_session_step(b->s, &b->smp, b->ids, depth, 0, b->dev_pick, b->logits,
                                &ignored);
        const double t0 = qs_now_s();
        if (!e && pp)
            e = rt_session_step(b->s, &b->smp, b->ids + depth, len, depth, b->dev_pick,
                                b->logits, &next);
        for (int i = 0; !e && !pp && i < len; i++) {
            const int32_t cur = next;
            e = rt_session_step(b->s, &b->smp, &cur, 1, depth + i, b->dev_pick, b->logits,
                                &next);
            if (!e && ns < 64)
                seen[ns++] = next;
        }
        const double dt = qs_now_s() - t0;
        if (e)
            return e;
        if (r >= 0)
            b->secs[r] = dt > 1e-9 ? dt : 1e-9;
        if (r == 0 && !pp && depth > 0) {
            char what[64];
            snprintf(what, sizeof(what), "bench tg%d @ d%d: prefix ids", len, depth);
            log_ids(what, b->ids, depth, -1);
        }
        if (r == 0 && !pp) {
            char what[64];
            snprintf(what, sizeof(what), "bench tg%d: greedy ids after", len);
            log_ids(what, seen, ns, (int)b->ids[depth]);
        }
    }
    return RT_ERR_NONE;
}

/* The KV cache the longest test fills, and its name for messages. */
static long need_positions(const struct cli_args *a, char *name, size_t n)
{
    long longest = 0, deepest = 0;
    bool longest_pp = false;
    for (int i = 0; i < a->n_pp; i++)
        if (a->pp[i] > longest) {
            longest = a->pp[i];
            longest_pp = true;
        }
    for (int i = 0; i < a->n_tg; i++)
        if (a->tg[i] > longest) {
            longest = a->tg[i];
            longest_pp = false;
        }
    for (int i = 0; i < a->n_dp; i++)
        deepest = a->dp[i] > deepest ? a->dp[i] : deepest;
    snprintf(name, n, "%s%ld%s%.0ld", longest_pp ? "pp" : "tg", longest, deepest ? " @ d" : "",
             deepest);
    return deepest + longest > 2 ? deepest + longest : 2;
}

/* One finished test: a table row, or an entry of the JSON document. */
static int report_test(const struct bench *b, const char *model, bool pp, int len, int depth,
                       cJSON *tests)
{
    const struct rt_session *s = b->s;
    double mean = 0, var = 0, ms = 0;
    for (int r = 0; r < b->reps; r++) {
        mean += len / b->secs[r] / (double)b->reps;
        ms += 1e3 * b->secs[r] / (double)b->reps;
    }
    for (int r = 0; r < b->reps; r++)
        var += (len / b->secs[r] - mean) * (len / b->secs[r] - mean);
    const double sd = b->reps > 1 ? sqrt(var / (double)(b->reps - 1)) : 0.0;
    const char *dev = rt_exec_device(rt_session_model(s)) == RT_DEVICE_CUDA ? "cuda" : "cpu";
    const int tp = rt_exec_world_size(rt_session_model(s));
    char name[48], at[32] = "";
    if (depth > 0)
        snprintf(at, sizeof(at), " @ d%d", depth);
    snprintf(name, sizeof(name), "%s%d%s", pp ? "pp" : "tg", len, at);
    if (!tests) {
        printf("| %s | %s | %d | %s | %.2f ± %.2f | %.3f |\n", model, dev, tp, name, mean, sd, ms);
        return cli_flush_stdout();
    }
    cJSON *t = cJSON_CreateObject();
    cJSON_AddStringToObject(t, "test", name);
    cJSON_AddStringToObject(t, "kind", pp ? "pp" : "tg");
    cJSON_AddNumberToObject(t, "n", len);
    cJSON_AddNumberToObject(t, "depth", depth);
    cJSON_AddNumberToObject(t, "tokens_per_s", mean);
    cJSON_AddNumberToObject(t, "tokens_per_s_sd", sd);
    cJSON_AddNumberToObject(t, "ms_per_run", ms);
    cJSON *runs = cJSON_AddArrayToObject(t, "runs_s");
    for (int r = 0; r < b->reps; r++)
        cJSON_AddItemToArray(runs, cJSON_CreateNumber(b->secs[r]));
    cJSON_AddItemToArray(tests, t);
    return QS_EXIT_OK;
}

/* Every test at every depth; then the JSON document (-o json). */
static int run_tests(struct bench *b, const struct cli_args *a)
{
    const struct rt_config *cfg = rt_exec_config(rt_session_model(b->s));
    const bool json = !strcmp(a->output, "json");
    cJSON *root = json ? cJSON_CreateObject() : NULL, *tests = NULL;
    if (json) {
        cJSON_AddStringToObject(root, "model", a->pos[0]);
        cJSON_AddStringToObject(root, "architecture", cfg->architecture);
        cJSON_AddStringToObject(root, "device", rt_exec_device(rt_session_model(b->s)) ==
                                                        RT_DEVICE_CUDA ? "cuda" : "cpu");
        cJSON_AddNumberToObject(root, "tp", rt_exec_world_size(rt_session_model(b->s)));
        cJSON_AddNumberToObject(root, "kv_cache", rt_session_n_ctx(b->s));
        cJSON_AddNumberToObject(root, "repetitions", b->reps);
        cJSON_AddStringToObject(root, "next_token_on", b->dev_pick ? "gpu" : "host");
        tests = cJSON_AddArrayToObject(root, "tests");
    } else {
        printf("| model | device | tp | test | t/s | ms per run |\n|---|---|--:|---|--:|--:|\n");
    }
    int rc = cli_flush_stdout(), done = 0;
    const int per = a->n_pp + a->n_tg, total = per * a->n_dp;
    for (int t = 0; t < total && !rc; t++, done++) {
        const int ti = t % per, depth = (int)a->dp[t / per];
        const bool pp = ti < a->n_pp;
        const int len = (int)(pp ? a->pp[ti] : a->tg[ti - a->n_pp]);
        enum rt_err e = bench_test(b, depth, pp, len);
        if (e == RT_ERR_CANCELLED)
            break;
        rc = e ? cli_exit_rt(e) : report_test(b, a->pos[0], pp, len, depth, tests);
    }
    if (json && (!rc || cli_cancel)) {
        char *s = cJSON_PrintUnformatted(root);
        if (s)
            printf("%s\n", s);
        free(s);
        rc = rc ? rc : cli_flush_stdout();
    }
    cJSON_Delete(root);
    if (cli_cancel) {
        fprintf(stderr, "%s: interrupted: %d of %d test%s done\n", qs_log_prog(), done, total,
                cli_plural(total));
        cli_report_cancel();
        rc = rc ? rc : QS_EXIT_RUNTIME;
    }
    return rc;
}

/* Buffers, sampler, prompt ids; then the tests. */
static int bench_run(struct rt_session *s, const struct cli_args *a, long need)
{
    struct bench b = {.s = s, .reps = (int)a->reps};
    struct rt_sample_params sp = rt_sample_params_default();
    sp.temperature = 0.0f; /* greedy */
    sp.seed = 1;           /* its PRNG draws the prompt ids: the same every run */
    const int32_t V = rt_session_n_vocab(s);
    b.ids = malloc((size_t)need * sizeof(*b.ids));
    b.logits = malloc((size_t)V * sizeof(float));
    b.secs = malloc((size_t)a->reps * sizeof(double));
    int rc = QS_EXIT_OK;
    enum rt_err e = RT_ERR_NONE;
    if (!b.ids || !b.logits || !b.secs) {
        qs_log_error(__func__, "out of memory for %ld ids and %d logits", need, (int)V);
        rc = QS_EXIT_RUNTIME;
    } else if ((e = rt_session_sampler_init(s, &sp, &b.smp))) {
        rc = cli_exit_rt(e);
    }
    if (!rc) {
        for (long i = 0; i < need; i++) /* uniform in [0, 1) times vocab_size: < vocab_size */
            b.ids[i] = (int32_t)(rt_sampler_uniform(&b.smp) * (double)V);
        if (rt_session_bos(s) >= 0)
            b.ids[0] = rt_session_bos(s);
        b.dev_pick = rt_session_can_pick(s);
        const struct rt_exec *m = rt_session_model(s);
        const struct rt_config *cfg = rt_exec_config(m);
        fprintf(stderr, "%s: %s (%s, %d layers, hidden %d, vocab %d), %s, TP %d, KV cache %d "
                        "tokens; %ld timed run%s per test after one warm-up; next token greedy "
                        "on the %s\n", qs_log_prog(), a->pos[0], cfg->architecture,
                (int)cfg->n_layers, (int)cfg->hidden_size, (int)V,
                rt_exec_device(m) == RT_DEVICE_CUDA ? "cuda" : "cpu", rt_exec_world_size(m),
                rt_session_n_ctx(s), a->reps, cli_plural(a->reps), b.dev_pick ? "GPU" : "host");
        cli_catch_signals();
        rc = run_tests(&b, a);
    }
    rt_sampler_free(&b.smp);
    free(b.secs);
    free(b.logits);
    free(b.ids);
    return rc;
}

int cmd_bench_model(int argc, char **argv)
{
    struct cli_args a;
    int rc = cli_parse(CLI_BENCH_MODEL, "qshard bench model", k_usage, k_trailer, argc, argv, &a);
    if (rc)
        return rc == CLI_HELP ? QS_EXIT_OK : rc;
    if (a.n_pos > 1)
        return cli_usage_error("expected one MODEL argument, got '%s' and '%s'", a.pos[0],
                               a.pos[1]);
    if (a.n_pos != 1 || a.n_pp + a.n_tg == 0)
        return cli_usage_error("need MODEL and at least one test");
    char longest[64];
    const long need = need_positions(&a, longest, sizeof(longest));
    if (a.ctx > 0 && need > a.ctx)
        return cli_usage_error("the longest test (%s) needs %ld positions, --ctx is %ld",
                               longest, need, a.ctx);
    const bool ctx_given = a.ctx > 0;
    if (!ctx_given)
        a.ctx = need;
    struct rt_session_opts so = {.path = a.pos[0], .model = cli_model_opts(&a)};
    struct rt_session *s = NULL;
    enum rt_err e = rt_session_open(&so, &s);
    if (e == RT_ERR_CONTEXT && !ctx_given)
        return cli_usage_error("the longest test (%s) needs %ld positions, more than the "
                               "model's context (max_position_embeddings above): shorten "
                               "-p/-n/-d", longest, need);
    if (e)
        return cli_exit_rt(e);
    rc = bench_run(s, &a, need);
    rt_session_close(s);
    return rc;
}
