/*
 * cmd_perplexity.c - `qshard perplexity MODEL (--file text.txt | --tokens 1,2,3) [--ctx 512]`:
 * perplexity the way llama.cpp's tools/perplexity computes it (perplexity()), through the
 * session API (runtime/rt_session.h). Ctrl-C (SIGINT) or SIGTERM stops after the chunk in
 * progress: the estimate over the chunks done is printed as the final line, exit 3.
 *
 * Test: ./build/test_cli_model (from the golden logits, several chunks from `logits`),
 * ./build/test_cli_run (Ctrl-C).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cmd.h"
#include "qs_util.h" /* qs_now_s */

#define MAX_TEXT_FILE (1ull << 30)

static const char k_usage[] =
    "usage: qshard perplexity MODEL (--file text.txt | --tokens 1,2,3) [--ctx 512]\n"
    "\n"
    "Perplexity of a text file, computed the way llama.cpp's tools/perplexity does\n"
    "(perplexity()): the whole file is tokenized (with BOS when the tokenizer adds one;\n"
    "text such as \"<s>\" in the file is not read as a special token), cut into\n"
    "non-overlapping chunks of ctx tokens (the remainder is dropped); each chunk is\n"
    "evaluated from an empty KV cache with its first token replaced by BOS (if the\n"
    "tokenizer adds one; not with --tokens), and only the second half is scored: the\n"
    "negative log-likelihood of token j+1 from the logits at j, for j = ctx/2 .. ctx-2.\n"
    "Prints the running estimate after each chunk ([i]ppl) and \"Final estimate: PPL = x\n"
    "+/- y\", where y = ppl * stddev(nll) / sqrt(count - 1) as in llama.cpp. llama.cpp\n"
    "asks for at least 2*ctx tokens; one full chunk suffices here. Ctrl-C stops after the\n"
    "current chunk and prints the estimate so far (exit 3).\n"
    "\n";
static const char k_trailer[] =
    "exit codes: 0 ok, 1 usage, 2 bad input (model file, text, token id, fewer tokens\n"
    "than one chunk), 3 runtime failure (GPU, memory) or interrupted, 4 I/O error\n";

/* Running sums of the scored negative log-likelihoods. */
struct nll_sum {
    double nll, nll2;
    long count;
};

/* Score rows first .. ctx-2 of one chunk's logits [ctx][V] against chunk[j + 1]. */
static void score_chunk(const float *logits, const int32_t *chunk, long ctx, int32_t V,
                        struct nll_sum *t)
{
    for (long j = ctx / 2; j < ctx - 1; j++) {
        const float *row = logits + (size_t)j * (size_t)V;
        double mx = -INFINITY, sum = 0;
        for (int32_t v = 0; v < V; v++)
            mx = row[v] > mx ? row[v] : mx;
        for (int32_t v = 0; v < V; v++)
            sum += exp((double)row[v] - mx);
        const double lp = (double)row[chunk[j + 1]] - mx - log(sum);
        t->nll -= lp;
        t->nll2 += lp * lp;
        t->count++;
    }
}

static void print_final(const struct nll_sum *t)
{
    const double mean = t->nll / (double)t->count, ppl = exp(mean);
    const double var = t->nll2 / (double)t->count - mean * mean;
    if (t->count > 1 && var > 0)
        printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl,
               ppl * sqrt(var / (double)(t->count - 1)));
    else
        printf("Final estimate: PPL = %.4f\n", ppl);
}

/* Every chunk: forward from an empty cache, score, running estimate. */
static int run_chunks(struct rt_session *s, const int32_t *ids, long ctx, long n_chunks,
                      bool bos_first, const char *what)
{
    const int32_t V = rt_session_n_vocab(s), bos = rt_session_bos(s);
    float *logits = malloc((size_t)ctx * (size_t)V * sizeof(float));
    int32_t *chunk = malloc((size_t)ctx * sizeof(*chunk));
    int rc = QS_EXIT_OK;
    if (!logits || !chunk) {
        qs_log_error(__func__, "out of memory for %ld x %d logits", ctx, (int)V);
        free(logits);
        free(chunk);
        return QS_EXIT_RUNTIME;
    }
    fprintf(stderr, "%s: %s: %ld chunk%s of %ld, scoring positions %ld..%ld of each\n",
            qs_log_prog(), what, n_chunks, cli_plural(n_chunks), ctx, ctx / 2, ctx - 2);
    struct nll_sum t = {0, 0, 0};
    const double t0 = qs_now_s();
    long k = 0;
    cli_catch_signals();
    for (; k < n_chunks && !rc && !cli_cancel; k++) {
        memcpy(chunk, ids + (size_t)k * (size_t)ctx, (size_t)ctx * sizeof(*chunk));
        if (bos_first)
            chunk[0] = bos; /* llama.cpp: add_bos -> first token of each chunk is BOS */
        rt_session_reset(s);
        enum rt_err e = rt_session_forward(s, chunk, (int)ctx, 0, logits, true);
        if (e) {
            rc = cli_exit_rt(e);
            break;
        }
        score_chunk(logits, chunk, ctx, V, &t);
        printf("[%ld]%.4f,", k + 1, exp(t.nll / (double)t.count));
        fflush(stdout);
    }
    if (t.count > 0 && (!rc || cli_cancel)) {
        printf("\n");
        print_final(&t);
    }
    if (!rc)
        rc = cli_flush_stdout();
    fprintf(stderr, "%s: %ld of %ld chunk%s, %ld scored token%s in %.2f s%s\n", qs_log_prog(), k,
            n_chunks, cli_plural(n_chunks), t.count, cli_plural(t.count), qs_now_s() - t0,
            cli_cancel ? ", interrupted" : "");
    if (!rc && cli_cancel) {
        cli_report_cancel();
        rc = QS_EXIT_RUNTIME;
    }
    free(chunk);
    free(logits);
    return rc;
}

int cmd_perplexity(int argc, char **argv)
{
    struct cli_args a;
    int rc = cli_parse(CLI_PERPLEXITY, "qshard perplexity", k_usage, k_trailer, argc, argv, &a);
    if (rc)
        return rc == CLI_HELP ? QS_EXIT_OK : rc;
    if (a.n_pos != 1 || !!a.file + !!a.tokens != 1)
        return cli_usage_error("need MODEL and one of --file FILE and --tokens");
    char *text = NULL;
    size_t text_len = 0;
    if (a.file && (rc = cli_read_text(a.file, MAX_TEXT_FILE, &text, &text_len)))
        return rc;
    struct rt_session_opts so = {.path = a.pos[0], .model = cli_model_opts(&a)};
    struct rt_session *s = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    enum rt_err e = rt_session_open(&so, &s);
    if (e)
        rc = cli_exit_rt(e);
    /* as llama.cpp: BOS per the tokenizer, special-token text in the file stays plain text */
    if (!rc)
        rc = cli_prompt_ids(s, text, a.tokens, false, true,
                            "give token ids with --tokens 1,2,3 instead of --file", &ids, &n);
    const long ctx = a.ctx;
    long n_chunks = (long)(n / (size_t)ctx);
    const char *what = a.file ? (strcmp(a.file, "-") ? a.file : "standard input") : "--tokens";
    if (!rc && n_chunks == 0) {
        qs_log_error(__func__, "%s has %zu token%s, fewer than one chunk of --ctx %ld", what, n,
                     cli_plural((long long)n), ctx);
        rc = QS_EXIT_BAD_INPUT;
    }
    if (!rc) {
        if (a.chunks > 0 && a.chunks < n_chunks)
            n_chunks = a.chunks;
        const bool bos_first = rt_session_bos(s) >= 0 && text && ids[0] == rt_session_bos(s);
        char label[600];
        snprintf(label, sizeof(label), "%s, %zu tokens", what, n);
        rc = run_chunks(s, ids, ctx, n_chunks, bos_first, label);
    }
    free(ids);
    free(text);
    rt_session_close(s);
    return rc;
}
