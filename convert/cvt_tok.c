/*
 * cvt_tok.c - the converter's tokenizer check (cvt_run_int.h): the tokenizer files of the source
 * are embedded in every rank file, and `qshard run` loads them with runtime/rt_tok.h and refuses
 * a tokenizer with more ids than the model's vocab_size. A checkpoint that would fail there is
 * caught here, before anything is written (docs/CONVERT.md section 2, step 1):
 *   - no tokenizer file at all: converts, with the warning cvt_source_open gives (token ids only);
 *   - tokenizer_config.json, special_tokens_map.json or added_tokens.json without tokenizer.json
 *     or tokenizer.model (an incomplete download): error;
 *   - tokenizer.json / tokenizer.model that the runtime's loader refuses (malformed, unsupported
 *     model type): error, with the loader's message;
 *   - more tokenizer ids than vocab_size: error (ids >= vocab_size have no embedding row); fewer
 *     is normal (Qwen2 pads vocab_size) and passes.
 * Errors are CVT_ERR_TOKENIZER (exit 2), CVT_ERR_NOMEM.
 *
 * Entry point: cvt_tok_check. Test: ./build/test_cvt_outdir (tokenizer cases).
 */
#include <string.h>

#include "cvt_run_int.h"
#include "qs_log.h" /* qs_log_error */
#include "rt_tok.h" /* rt_tok_load, rt_tok_n_vocab: the loader `qshard run` uses */

/* The tokenizer file `name` of the source, or NULL. */
static const struct cvt_src_blob *blob(const struct cvt_source *src, const char *name)
{
    for (size_t i = 0; i < cvt_source_n_tokenizer_files(src); i++) {
        const struct cvt_src_blob *b = cvt_source_tokenizer_file(src, i);
        if (!strcmp(b->name, name))
            return b;
    }
    return NULL;
}

enum cvt_err cvt_tok_check(const struct cvt_source *src, const struct cvt_hf_config *cfg)
{
    const char *dir = cvt_source_dir(src);
    size_t n_files = cvt_source_n_tokenizer_files(src);
    const struct cvt_src_blob *js = blob(src, "tokenizer.json"), *sp = blob(src, "tokenizer.model");
    const struct cvt_src_blob *tc = blob(src, "tokenizer_config.json");
    if (n_files == 0)
        return CVT_ERR_NONE;
    if (!js && !sp) {
        qs_log_error(__func__, "%s: incomplete tokenizer: %s is present but neither "
                               "tokenizer.json nor tokenizer.model; copy the missing file (or "
                               "remove the tokenizer files to convert for token ids only)",
                     dir, cvt_source_tokenizer_file(src, 0)->name);
        return CVT_ERR_TOKENIZER;
    }
    struct rt_tok_files files = {
        .json = js ? (const char *)js->data : NULL, .json_len = js ? js->size : 0,
        .model = sp ? sp->data : NULL, .model_len = sp ? sp->size : 0,
        .config = tc ? (const char *)tc->data : NULL, .config_len = tc ? tc->size : 0,
    };
    struct rt_tok *tok = NULL;
    enum rt_tok_err te = rt_tok_load(&files, &tok); /* reports what it refuses */
    if (te != RT_TOK_ERR_NONE)
        return te == RT_TOK_ERR_NOMEM ? CVT_ERR_NOMEM : CVT_ERR_TOKENIZER;
    int64_t n_vocab = rt_tok_n_vocab(tok);
    rt_tok_free(tok);
    if (n_vocab > cfg->vocab_size) {
        qs_log_error(__func__, "%s: the tokenizer has %lld ids but config.json's vocab_size is "
                               "%lld: ids from %lld on would have no embedding row",
                     dir, (long long)n_vocab, (long long)cfg->vocab_size,
                     (long long)cfg->vocab_size);
        return CVT_ERR_TOKENIZER;
    }
    return CVT_ERR_NONE;
}
