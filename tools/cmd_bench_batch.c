/*
 * cmd_bench_batch.c - `qshard bench batch MODEL [--concurrency 1,8,16,32,64,128,256]
 * [--input-len 128] [--output-len 128] [--num-prompts N] [-o md|json]`: throughput of the
 * batching engine on random prompt ids, as vLLM's benchmark_throughput and trtllm-bench run it:
 * every request is queued at once, at most `concurrency` run together (--max-num-seqs), each
 * generates exactly --output-len tokens (eos ignored, greedy). Per test: output tok/s, total
 * tok/s (prompt + output), request TTFT and TPOT mean / p50 / p99, the mean decode step time,
 * peak KV blocks used. A warm-up run of `concurrency` short requests comes first (kernels,
 * decode graphs of the batch sizes). Prefix caching is off (random prompts share nothing anyway).
 * Test: ./build/test_cli_batch (rows, counts, -o json).
 */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "cmd.h"
#include "qs_util.h" /* qs_now_s */
#include "rt_engine.h"

static const char k_usage[] =
    "usage: qshard bench batch MODEL [--concurrency 1,8,16,32,64,128,256] [--input-len 128]\n"
    "                          [--output-len 128] [--num-prompts N] [-o md|json]\n"
    "\n"
    "Throughput of the batching engine on random prompt ids (as vLLM's benchmark_throughput):\n"
    "all requests queued at once, at most CONCURRENCY running together, each generating\n"
    "exactly --output-len tokens (greedy, eos ignored). One test per concurrency.\n"
    "\n";
static const char k_trailer[] =
    "exit codes: 0 ok, 1 usage, 2 bad input (model file), 3 runtime failure (GPU, memory)\n"
    "or interrupted, 4 I/O error\n";

struct bstat {
    double *ttft, *tpot;
    long n;
    long gen;
};

static void on_finish(void *user, const struct rt_engine_done *d)
{
    struct bstat *b = user;
    const size_t n = d->res->n_ids;
    b->gen += (long)n;
    b->ttft[b->n] = d->ttft_s;
    b->tpot[b->n] = n > 1 ? (d->t_total_s - d->ttft_s) / (double)(n - 1) : 0.0;
    b->n++;
}

/* One test: n_req requests of in + out tokens, at most conc at once. */
static enum rt_err run_test(struct rt_engine *eng, int V, int in, int out, long n_req,
                            uint64_t *rng, struct bstat *b, double *secs, long *steps)
{
    int32_t *ids = malloc((size_t)in * sizeof(int32_t));
    if (!ids)
        return RT_ERR_NOMEM;
    struct rt_engine_stats st0;
    rt_engine_stats(eng, &st0);
    b->n = 0;
    b->gen = 0;
    const double t0 = qs_now_s();
    enum rt_err e = RT_ERR_NONE;
    for (long r = 0; r < n_req && !e; r++) {
        for (int i = 0; i < in; i++) {
            *rng ^= *rng << 13, *rng ^= *rng >> 7, *rng ^= *rng << 17;
            ids[i] = (int32_t)(*rng % (uint64_t)V);
        }
        struct rt_engine_req q = {.ids = ids, .n_ids = (size_t)in, .gen = rt_gen_params_default(),
                                  .on_finish = on_finish, .user = b};
        q.gen.sample.temperature = 0.0f;
        q.gen.max_tokens = out;
        q.gen.ignore_eos = true;
        q.gen.decode_flags = 0;
        int64_t id;
        e = rt_engine_add(eng, &q, &id);
    }
    free(ids);
    if (!e)
        e = rt_engine_run(eng);
    *secs = qs_now_s() - t0;
    struct rt_engine_stats st1;
    rt_engine_stats(eng, &st1);
    *steps = st1.steps - st0.steps;
    return e;
}

int cmd_bench_batch(int argc, char **argv)
{
    struct cli_args a;
    int rc = cli_parse(CLI_BENCH_BATCH, "qshard bench batch", k_usage, k_trailer, argc, argv, &a);
    if (rc)
        return rc == CLI_HELP ? QS_EXIT_OK : rc;
    if (a.n_pos != 1)
        return cli_usage_error("expected one MODEL argument, got %d", a.n_pos);
    int most = 1;
    for (int i = 0; i < a.n_conc; i++)
        most = a.conc[i] > most ? (int)a.conc[i] : most;
    struct rt_session_opts so = {.path = a.pos[0], .model = cli_model_opts(&a)};
    so.model.n_seqs = most;
    so.model.no_prefix_cache = true;
    if (!(a.kv_cache_gb > 0))
        so.model.kv_mem_fraction = 0.9;
    const int need_ctx = (int)(a.input_len + a.output_len + 1);
    if (a.ctx <= 0)
        so.model.n_ctx = need_ctx;
    else if (a.ctx < need_ctx)
        return cli_usage_error("--ctx %ld is shorter than --input-len + --output-len + 1 = %d",
                               a.ctx, need_ctx);
    struct rt_session *s = NULL;
    enum rt_err e = rt_session_open(&so, &s);
    if (e)
        return cli_exit_rt(e);
    const bool json = a.output && !strcmp(a.output, "json");
    cJSON *root = json ? cJSON_CreateObject() : NULL;
    cJSON *tests = json ? cJSON_AddArrayToObject(root, "tests") : NULL;
    if (!json)
        printf("| concurrency | requests | in | out | output tok/s | total tok/s | TTFT mean / p50 "
               "/ p99 ms | TPOT mean / p50 / p99 ms | step ms | peak KV blocks |\n"
               "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    uint64_t rng = 0x9e3779b97f4a7c15ull ^ (cli_given(&a, "seed") ? a.seed : 0);
    cli_catch_signals();
    for (int t = 0; t < a.n_conc && !rc && !cli_cancel; t++) {
        const int conc = (int)a.conc[t];
        const long n_req = a.num_prompts > 0 ? a.num_prompts : (4L * conc > 16 ? 4L * conc : 16);
        struct rt_engine *eng = NULL;
        /* at most conc at once: an engine over the session whose slots beyond conc stay unused */
        struct rt_engine_opts eo = {.max_batch_tokens = (int)a.max_batch_tokens};
        e = rt_engine_create_limited(s, &eo, conc, &eng);
        struct bstat b = {calloc((size_t)n_req + (size_t)conc, sizeof(double)),
                          calloc((size_t)n_req + (size_t)conc, sizeof(double)), 0, 0};
        if (!e && (!b.ttft || !b.tpot))
            e = RT_ERR_NOMEM;
        double secs = 0;
        long steps = 0;
        if (!e) /* warm-up: the kernels, the decode graphs of the batch sizes this test meets */
            e = run_test(eng, rt_session_n_pick(s), (int)a.input_len, 8, conc, &rng, &b, &secs,
                         &steps);
        if (!e)
            e = run_test(eng, rt_session_n_pick(s), (int)a.input_len, (int)a.output_len, n_req,
                         &rng, &b, &secs, &steps);
        if (!e) {
            struct rt_engine_stats st;
            rt_engine_stats(eng, &st);
            const double out_tps = (double)b.gen / secs;
            const double tot_tps = (double)(b.gen + n_req * a.input_len) / secs;
            const double step_ms = steps ? 1e3 * secs / (double)steps : 0.0;
            const struct cli_summary ttft = cli_summarize(b.ttft, (size_t)b.n, 1e3);
            const struct cli_summary tpot = cli_summarize(b.tpot, (size_t)b.n, 1e3);
            if (json) {
                cJSON *o = cJSON_CreateObject();
                cJSON_AddNumberToObject(o, "concurrency", conc);
                cJSON_AddNumberToObject(o, "num_prompts", (double)n_req);
                cJSON_AddNumberToObject(o, "input_len", (double)a.input_len);
                cJSON_AddNumberToObject(o, "output_len", (double)a.output_len);
                cJSON_AddNumberToObject(o, "output_tokens", (double)b.gen);
                cJSON_AddNumberToObject(o, "seconds", secs);
                cJSON_AddNumberToObject(o, "output_tok_s", out_tps);
                cJSON_AddNumberToObject(o, "total_tok_s", tot_tps);
                cJSON_AddNumberToObject(o, "ttft_ms_mean", ttft.mean);
                cJSON_AddNumberToObject(o, "ttft_ms_p50", ttft.p50);
                cJSON_AddNumberToObject(o, "ttft_ms_p99", ttft.p99);
                cJSON_AddNumberToObject(o, "tpot_ms_mean", tpot.mean);
                cJSON_AddNumberToObject(o, "tpot_ms_p50", tpot.p50);
                cJSON_AddNumberToObject(o, "tpot_ms_p99", tpot.p99);
                cJSON_AddNumberToObject(o, "steps", (double)steps);
                cJSON_AddNumberToObject(o, "step_ms_mean", step_ms);
                cJSON_AddNumberToObject(o, "peak_kv_blocks", st.peak_blocks_used);
                cJSON_AddNumberToObject(o, "kv_blocks", st.blocks_total);
                cJSON_AddNumberToObject(o, "preemptions", (double)st.preemptions);
                cJSON_AddItemToArray(tests, o);
            } else {
                printf("| %d | %ld | %ld | %ld | %.1f | %.1f | %.1f / %.1f / %.1f | %.2f / %.2f / "
                       "%.2f | %.2f | %d of %d |\n", conc, n_req, a.input_len, a.output_len,
                       out_tps, tot_tps, ttft.mean, ttft.p50, ttft.p99, tpot.mean, tpot.p50,
                       tpot.p99, step_ms, st.peak_blocks_used, st.blocks_total);
                fflush(stdout);
            }
        }
        free(b.ttft);
        free(b.tpot);
        rt_engine_free(eng);
        if (e)
            rc = cli_exit_rt(e);
    }
    if (json) {
        char *js = cJSON_PrintUnformatted(root);
        if (js)
            printf("%s\n", js);
        free(js);
        cJSON_Delete(root);
    }
    rt_session_close(s);
    if (!rc && cli_cancel) {
        cli_report_cancel();
        rc = QS_EXIT_RUNTIME;
    }
    return rc ? rc : cli_flush_stdout();
}
