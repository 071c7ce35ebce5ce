/*
 * cmd_logits.c - `qshard logits MODEL (--tokens 1,2,3 | --text "...") --out logits.npy`: the
 * float32 logits [T, vocab_size] of every prompt position as .npy (runtime/rt_io.h), through
 * the session API (runtime/rt_session.h).
 *
 * Test: ./build/test_cli_model (against the transformers goldens, TP-1/2/4).
 */
#include <stdlib.h>

#include "cli.h"
#include "cmd.h"
#include "qs_util.h" /* qs_now_s */
#include "rt_io.h"   /* rt_npy_write_f32 */

static const char k_usage[] =
    "usage: qshard logits MODEL (--tokens 1,2,3 | --text \"...\") --out logits.npy\n"
    "\n"
    "Run the prompt through the model and write the logits of every position as a float32\n"
    ".npy array [T, vocab_size] (NumPy format 1.0, C order; padded vocabulary columns are\n"
    "left out). --text is encoded as HF tokenizer(text) does (BOS per the tokenizer).\n"
    "\n";
static const char k_trailer[] =
    "exit codes: 0 ok, 1 usage, 2 bad input (model file, prompt, token id), 3 runtime\n"
    "failure (GPU, memory), 4 I/O error (cannot read the model or write the .npy)\n";

int cmd_logits(int argc, char **argv)
{
    struct cli_args a;
    int rc = cli_parse(CLI_LOGITS, "qshard logits", k_usage, k_trailer, argc, argv, &a);
    if (rc)
        return rc == CLI_HELP ? QS_EXIT_OK : rc;
    if (a.n_pos != 1 || !a.out || !!a.text + !!a.tokens != 1)
        return cli_usage_error("need MODEL, one of --tokens/--text, and --out FILE");
    struct rt_session_opts so = {.path = a.pos[0], .model = cli_model_opts(&a)};
    struct rt_session *s = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    float *all = NULL;
    enum rt_err e = rt_session_open(&so, &s);
    if (e)
        return cli_exit_rt(e);
    rc = cli_prompt_ids(s, a.text, a.tokens, a.no_bos, false,
                        "give token ids with --tokens 1,2,3 instead of --text", &ids, &n);
    const int32_t V = rt_session_n_vocab(s);
    if (!rc && (long long)n > rt_session_n_ctx(s)) {
        qs_log_error(__func__, "the prompt has %zu tokens, the context holds %d", n,
                     rt_session_n_ctx(s));
        rc = QS_EXIT_BAD_INPUT;
    }
    if (!rc && !(all = malloc(n * (size_t)V * sizeof(float)))) {
        qs_log_error(__func__, "out of memory for %zu x %d logits", n, (int)V);
        rc = QS_EXIT_RUNTIME;
    }
    double t0 = qs_now_s();
    if (!rc && (e = rt_session_forward(s, ids, (int)n, 0, all, true)))
        rc = cli_exit_rt(e);
    const double dt = qs_now_s() - t0;
    if (!rc) {
        rc = cli_exit_io(rt_npy_write_f32(a.out, all, (int64_t)n, V));
    }
    if (!rc)
        fprintf(stderr, "%s: %zu position%s x %d logits written to %s (forward %.3f s)\n",
                qs_log_prog(), n, cli_plural((long long)n), (int)V, a.out, dt);
    free(all);
    free(ids);
    rt_session_close(s);
    return rc;
}
