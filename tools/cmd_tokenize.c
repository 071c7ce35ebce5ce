/*
 * cmd_tokenize.c - `qshard tokenize MODEL (--text "..." | --file FILE | --decode 1,2,3)`: the
 * tokenizer embedded in the model (rank 0) only, through the session API opened with
 * tokenizer_only (runtime/rt_session.h); no weights are loaded.
 *
 * Test: ./build/test_cli_tok (HF ids, the real Llama-2 vectors, decode, skip special tokens,
 * invalid byte runs).
 */
#include <stdlib.h>

#include "cli.h"
#include "cmd.h"
#include "rt_io.h" /* rt_ids_parse */

#define MAX_TEXT_FILE (1ull << 30)

static const char k_usage[] =
    "usage: qshard tokenize MODEL (--text \"...\" | --file FILE | --decode 1,2,3)\n"
    "\n"
    "Encode text with the tokenizer embedded in the model and print the token ids one per\n"
    "line (like llama.cpp's llama-tokenize), as HF tokenizer(text) does: BOS per the\n"
    "tokenizer files, special tokens in the text recognised. --decode prints the text of\n"
    "a list of ids as HF tokenizer.decode does (byte tokens that are not valid UTF-8: one\n"
    "U+FFFD per byte, as HF's ByteFallback decoder and sentencepiece).\n"
    "\n";
static const char k_trailer[] =
    "exit codes: 0 ok, 1 usage, 2 bad input (model file, no tokenizer, invalid UTF-8,\n"
    "token id), 3 out of memory, 4 I/O error\n";

static int decode(const struct rt_session *s, const struct cli_args *a)
{
    int32_t *ids = NULL;
    size_t n = 0, len = 0;
    char *out = NULL;
    int rc = cli_exit_io(rt_ids_parse(a->decode, &ids, &n));
    for (size_t i = 0; !rc && i < n; i++)
        if (ids[i] < 0 || ids[i] >= rt_session_n_vocab(s)) {
            qs_log_error(__func__, "token id %d at position %zu is outside the vocabulary "
                         "[0, %d)", (int)ids[i], i, (int)rt_session_n_vocab(s));
            rc = QS_EXIT_BAD_INPUT;
        }
    unsigned flags = a->skip_special ? RT_TOK_DECODE_SKIP_SPECIAL : 0;
    if (!rc && rt_tok_decode(rt_session_tok(s), ids, n, flags, &out, &len) != RT_TOK_ERR_NONE)
        rc = QS_EXIT_RUNTIME; /* ids were checked: only memory is left */
    if (!rc) {
        fwrite(out, 1, len, stdout);
        putchar('\n');
    }
    free(out);
    free(ids);
    return rc;
}

static int encode(const struct rt_session *s, const struct cli_args *a, const char *text)
{
    struct rt_prompt p = {.text = text, .no_bos = a->no_bos,
                          .no_parse_special = a->no_parse_special,
                          .allow_empty = true}; /* HF tokenizer("") is [BOS] (or []) */
    int32_t *ids = NULL;
    size_t n = 0;
    enum rt_err e = rt_session_encode(s, &p, &ids, &n);
    if (e)
        return cli_exit_rt(e);
    if (a->ids_list) {
        putchar('[');
        for (size_t i = 0; i < n; i++)
            printf("%s%d", i ? ", " : "", (int)ids[i]);
        printf("]\n");
    } else {
        for (size_t i = 0; i < n; i++)
            printf("%d\n", (int)ids[i]);
    }
    free(ids);
    return QS_EXIT_OK;
}

int cmd_tokenize(int argc, char **argv)
{
    struct cli_args a;
    int rc = cli_parse(CLI_TOKENIZE, "qshard tokenize", k_usage, k_trailer, argc, argv, &a);
    if (rc)
        return rc == CLI_HELP ? QS_EXIT_OK : rc;
    if (a.n_pos != 1 || !!a.text + !!a.file + !!a.decode != 1)
        return cli_usage_error("need MODEL and one of --text, --file, --decode");
    if (a.skip_special && !a.decode)
        return cli_usage_error("--skip-special-tokens goes with --decode");
    char *text = NULL;
    size_t len = 0;
    if (a.file && (rc = cli_read_text(a.file, MAX_TEXT_FILE, &text, &len)))
        return rc;
    struct rt_session_opts so = {.path = a.pos[0], .model = rt_opts_default(),
                                 .tokenizer_only = true};
    struct rt_session *s = NULL;
    enum rt_err e = rt_session_open(&so, &s);
    if (e)
        rc = cli_exit_rt(e);
    else
        rc = a.decode ? decode(s, &a) : encode(s, &a, a.file ? text : a.text);
    if (!rc)
        rc = cli_flush_stdout();
    free(text);
    rt_session_close(s);
    return rc;
}
