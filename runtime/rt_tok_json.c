/*
 * rt_tok_json.c - reading tokenizer.json (HF tokenizers serialisation: model BPE vocab/merges,
 * added_tokens, normalizer, pre_tokenizer, decoder, post_processor), tokenizer_config.json
 * (add_bos_token, add_eos_token, bos_token, eos_token, chat_template) and the special-token map
 * into struct rt_tok. Called by rt_tok_load (rt_tok.c), which finishes the tokenizer.
 * Every input is hostile: types, ranges and references are checked, each failure is reported
 * once with the key and value involved. Test: ./build/test_tok (malformed-file cases too).
 *
 * Sources for the meaning of the fields (facts, not code): huggingface/tokenizers
 * (models/bpe/serialization.rs, normalizers/{prepend,replace,unicode}.rs,
 * pre_tokenizers/{split,byte_level,metaspace,sequence}.rs, decoders/strip.rs,
 * processors/template.rs, tokenizer/added_vocabulary.rs); transformers
 * tokenization_utils_base.py (tokenizer_config.json keys).
 */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h> /* all three files are JSON */

#include "qs_log.h"     /* qs_log_error */
#include "rt_tok_int.h" /* struct rt_tok, maps, arena */

// --- small JSON helpers ---------------------------------------------------------------------

/* An integer-valued JSON number in [lo, hi], else false. */
static bool json_int(const cJSON *v, long lo, long hi, long *out)
{
    if (!cJSON_IsNumber(v))
        return false;
    double d = v->valuedouble;
    if (!(d >= (double)lo && d <= (double)hi) || d != (double)(long)d)
        return false;
    *out = (long)d;
    return true;
}

/* Optional boolean member: absent/null -> dflt; other types -> error. */
static bool json_bool(const cJSON *obj, const char *key, bool dflt, bool *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return true;
    }
    if (!cJSON_IsBool(v))
        return false;
    *out = cJSON_IsTrue(v);
    return true;
}

static const char *json_str(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

// --- tokenizer.json -------------------------------------------------------------------------

static const char RE_LLAMA3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_QWEN2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";


static enum rt_tok_err json_normalizer(struct rt_tok *tok, const cJSON *n)
{
    if (!n || cJSON_IsNull(n))
        return RT_TOK_ERR_NONE;
    const char *type = json_str(n, "type");
    if (!type)
        goto bad;
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        if (!cJSON_IsArray(list))
            goto bad;
        const cJSON *it;
        cJSON_ArrayForEach(it, list) {
            enum rt_tok_err err = json_normalizer(tok, it);
            if (err)
                return err;
        }
        return RT_TOK_ERR_NONE;
    }
    if (strcmp(type, "Prepend") == 0) {
        const char *p = json_str(n, "prepend");
        if (!p || strcmp(p, RT_TOK_SPM_SPACE) != 0)
            goto unsupported;
        tok->dummy_prefix = tok->norm_prepend = true;
        return RT_TOK_ERR_NONE;
    }
    if (strcmp(type, "Replace") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(n, "pattern");
        const char *from = json_str(pat, "String"), *to = json_str(n, "content");
        if (!from || !to || strcmp(from, " ") != 0 || strcmp(to, RT_TOK_SPM_SPACE) != 0)
            goto unsupported;
        tok->escape_spaces = tok->norm_replace = true;
        return RT_TOK_ERR_NONE;
    }
    if (strcmp(type, "NFC") == 0) {
        tok->nfc = true;
        return RT_TOK_ERR_NONE;
    }
unsupported:
    qs_log_error(__func__, "tokenizer.json: normalizer \"%s\" (with these options) is not supported", type);
    return RT_TOK_ERR_UNSUPPORTED;
bad:
    qs_log_error(__func__, "tokenizer.json: normalizer is not an object with a \"type\"");
    return RT_TOK_ERR_JSON;
}

/* One step of Falcon's pre-tokenizer Sequence (tiiuae/falcon-7b's tokenizer.json): Punctuation
 * (behavior Contiguous), ByteLevel (use_regex, no prefix space), Digits (individual_digits
 * false), Split (Regex "[0-9][0-9][0-9]", Isolated), in that order and nothing else; the last
 * makes the tokenizer's pre-tokenization RT_TOK_PRETOK_FALCON (rt_tok_bpe.c). Source:
 * huggingface/tokenizers pre_tokenizers/punctuation.rs, digits.rs, split.rs. */
static enum rt_tok_err json_pretok_falcon(struct rt_tok *tok, const cJSON *p, const char *type,
                                          struct rt_tok_json_opts *o)
{
    const char *beh = json_str(p, "behavior");
    bool b = false;
    if (strcmp(type, "Punctuation") == 0 && o->falcon_stage == 0 &&
        tok->pretok == RT_TOK_PRETOK_NONE && !o->bytelevel && beh &&
        strcmp(beh, "Contiguous") == 0) {
        o->falcon_stage = 1;
        return RT_TOK_ERR_NONE;
    }
    if (strcmp(type, "Digits") == 0 && o->falcon_stage == 2 &&
        json_bool(p, "individual_digits", false, &b) && !b) {
        o->falcon_stage = 3;
        return RT_TOK_ERR_NONE;
    }
    const char *re = json_str(cJSON_GetObjectItemCaseSensitive(p, "pattern"), "Regex");
    if (strcmp(type, "Split") == 0 && o->falcon_stage == 3 && re &&
        strcmp(re, "[0-9][0-9][0-9]") == 0 && beh && strcmp(beh, "Isolated") == 0 &&
        json_bool(p, "invert", false, &b) && !b) {
        o->falcon_stage = 4;
        tok->pretok = RT_TOK_PRETOK_FALCON;
        return RT_TOK_ERR_NONE;
    }
    qs_log_error(__func__, "tokenizer.json: pre_tokenizer \"%s\" (with these options, at this "
                 "place of the Sequence) is not supported: Punctuation and Digits are read only as "
                 "Falcon's Sequence (Punctuation Contiguous, ByteLevel, Digits, Split [0-9]{3})",
                 type);
    return RT_TOK_ERR_UNSUPPORTED;
}

static enum rt_tok_err json_pretok(struct rt_tok *tok, const cJSON *p, struct rt_tok_json_opts *o)
{
    if (!p || cJSON_IsNull(p))
        return RT_TOK_ERR_NONE;
    const char *type = json_str(p, "type");
    if (!type) {
        qs_log_error(__func__, "tokenizer.json: pre_tokenizer is not an object with a \"type\"");
        return RT_TOK_ERR_JSON;
    }
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        if (!cJSON_IsArray(list)) {
            qs_log_error(__func__, "tokenizer.json: pre_tokenizer Sequence without \"pretokenizers\" array");
            return RT_TOK_ERR_JSON;
        }
        const cJSON *it;
        cJSON_ArrayForEach(it, list) {
            enum rt_tok_err err = json_pretok(tok, it, o);
            if (err)
                return err;
        }
        return RT_TOK_ERR_NONE;
    }
    if (strcmp(type, "Punctuation") == 0 || strcmp(type, "Digits") == 0 ||
        o->falcon_stage >= 3) /* Falcon's Sequence (RT_TOK_PRETOK_FALCON), exactly, and then
                               * nothing more */
        return json_pretok_falcon(tok, p, type, o);
    if (strcmp(type, "Split") == 0) {
        const char *re = json_str(cJSON_GetObjectItemCaseSensitive(p, "pattern"), "Regex");
        const char *beh = json_str(p, "behavior");
        bool invert;
        if (!re || !beh || strcmp(beh, "Isolated") != 0 || !json_bool(p, "invert", false, &invert) ||
            invert || tok->pretok != RT_TOK_PRETOK_NONE)
            goto unsupported;
        if (strcmp(re, RE_LLAMA3) == 0)
            tok->pretok = RT_TOK_PRETOK_LLAMA3;
        else if (strcmp(re, RE_QWEN2) == 0)
            tok->pretok = RT_TOK_PRETOK_QWEN2;
        else if (strcmp(re, RE_GPT2) == 0)
            tok->pretok = RT_TOK_PRETOK_GPT2;
        else {
            qs_log_error(__func__, "tokenizer.json: Split regex is not one of the implemented patterns (Llama-3, Qwen2, GPT-2): %.120s", re);
            return RT_TOK_ERR_UNSUPPORTED;
        }
        return RT_TOK_ERR_NONE;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        bool prefix, regex;
        if (o->bytelevel) /* a second mapping of the bytes */
            goto unsupported;
        if (!json_bool(p, "add_prefix_space", false, &prefix) ||
            !json_bool(p, "use_regex", true, &regex) || prefix)
            goto unsupported;
        if (regex) {
            if (tok->pretok != RT_TOK_PRETOK_NONE)
                goto unsupported;
            tok->pretok = RT_TOK_PRETOK_GPT2;
        }
        if (o->falcon_stage == 1) {
            if (!regex)
                goto unsupported;
            o->falcon_stage = 2;
        }
        o->bytelevel = true;
        return RT_TOK_ERR_NONE;
    }
    if (strcmp(type, "Metaspace") == 0) {
        const char *rep = json_str(p, "replacement"), *scheme = json_str(p, "prepend_scheme");
        bool split, add_prefix;
        if (!rep || strcmp(rep, RT_TOK_SPM_SPACE) != 0 || !json_bool(p, "split", true, &split) ||
            !json_bool(p, "add_prefix_space", true, &add_prefix))
            goto unsupported;
        tok->spm_split_all = split; /* MergedWithNext on "▁": "▁▁a" -> "▁", "▁a" */
        tok->escape_spaces = true;
        tok->prefix_unless_space = true; /* pre_tokenizers/metaspace.rs: not if it starts with "▁" */
        if (scheme) {
            tok->dummy_prefix = strcmp(scheme, "never") != 0;
            tok->prefix_first_only = strcmp(scheme, "first") == 0;
        } else {
            tok->dummy_prefix = add_prefix;
        }
        return RT_TOK_ERR_NONE;
    }
unsupported:
    qs_log_error(__func__, "tokenizer.json: pre_tokenizer \"%s\" (with these options) is not supported", type);
    return RT_TOK_ERR_UNSUPPORTED;
}

/* Decoder: whether it strips a leading space (Strip{" ", start>=1} or Metaspace) and whether
 * invalid byte runs follow HF's ByteFallback rule (rt_tok_int.h byte_run_whole). */
static void json_decoder(struct rt_tok *tok, const cJSON *d)
{
    const char *type = json_str(d, "type");
    if (!type)
        return;
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(d, "decoders"))
            json_decoder(tok, it);
    } else if (strcmp(type, "Strip") == 0) {
        const char *c = json_str(d, "content");
        long start;
        if (c && strcmp(c, " ") == 0 &&
            json_int(cJSON_GetObjectItemCaseSensitive(d, "start"), 1, 1 << 20, &start))
            tok->strip_space = true;
    } else if (strcmp(type, "ByteFallback") == 0) {
        tok->byte_run_whole = true;
    } else if (strcmp(type, "Metaspace") == 0) {
        const char *scheme = json_str(d, "prepend_scheme");
        bool add_prefix = true;
        json_bool(d, "add_prefix_space", true, &add_prefix);
        tok->strip_space = scheme ? strcmp(scheme, "never") != 0 : add_prefix;
    }
}

/* TemplateProcessing "single": the special tokens around $A give the default BOS/EOS. */
static enum rt_tok_err json_postproc(const cJSON *p, struct rt_tok_json_opts *o)
{
    const char *type = json_str(p, "type");
    if (!type)
        return RT_TOK_ERR_NONE;
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(p, "processors")) {
            enum rt_tok_err err = json_postproc(it, o);
            if (err)
                return err;
        }
        return RT_TOK_ERR_NONE;
    }
    if (strcmp(type, "TemplateProcessing") != 0)
        return RT_TOK_ERR_NONE;
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(p, "single");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(p, "special_tokens");
    if (!cJSON_IsArray(single))
        goto bad;
    o->have_tmpl = true;
    bool seen_a = false;
    const cJSON *it;
    cJSON_ArrayForEach(it, single) {
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
        if (cJSON_GetObjectItemCaseSensitive(it, "Sequence")) {
            seen_a = true;
            continue;
        }
        const char *name = json_str(st, "id");
        if (!name)
            goto bad;
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(specials, name), "ids");
        long id;
        if (cJSON_GetArraySize(ids) != 1 || !json_int(cJSON_GetArrayItem(ids, 0), 0, RT_TOK_MAX_VOCAB, &id)) {
            qs_log_error(__func__, "tokenizer.json: post_processor special token \"%s\" has no single valid id", name);
            return RT_TOK_ERR_JSON;
        }
        if (seen_a)
            o->tmpl_eos = (int32_t)id;
        else
            o->tmpl_bos = (int32_t)id;
    }
    return RT_TOK_ERR_NONE;
bad:
    qs_log_error(__func__, "tokenizer.json: TemplateProcessing \"single\" is malformed");
    return RT_TOK_ERR_JSON;
}

/* Split a merge "a b" (or ["a", "b"]) into its two pieces. */
static bool merge_parts(const cJSON *m, const char **a, size_t *na, const char **b, size_t *nb)
{
    if (cJSON_IsString(m)) {
        const char *s = m->valuestring, *sp = strchr(s, ' ');
        if (!sp || sp == s || sp[1] == '\0' || strchr(sp + 1, ' '))
            return false;
        *a = s, *na = (size_t)(sp - s), *b = sp + 1, *nb = strlen(sp + 1);
        return true;
    }
    if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2) {
        const cJSON *x = cJSON_GetArrayItem(m, 0), *y = cJSON_GetArrayItem(m, 1);
        if (!cJSON_IsString(x) || !cJSON_IsString(y) || !*x->valuestring || !*y->valuestring)
            return false;
        *a = x->valuestring, *na = strlen(*a), *b = y->valuestring, *nb = strlen(*b);
        return true;
    }
    return false;
}

static enum rt_tok_err json_merges(struct rt_tok *tok, const cJSON *merges)
{
    enum rt_tok_err err = rt_tok_pairmap_init(&tok->merges, (size_t)cJSON_GetArraySize(merges));
    if (err)
        return err;
    char *buf = NULL;
    size_t cap = 0;
    int32_t rank = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges) {
        const char *a, *b;
        size_t na, nb;
        if (!merge_parts(m, &a, &na, &b, &nb)) {
            qs_log_error(__func__, "tokenizer.json: merge %d is not \"a b\" or [\"a\", \"b\"]", (int)rank);
            err = RT_TOK_ERR_JSON;
            goto out;
        }
        if (na + nb > cap) {
            cap = 2 * (na + nb);
            char *nbuf = realloc(buf, cap);
            if (!nbuf) {
                qs_log_error(__func__, "out of memory");
                err = RT_TOK_ERR_NOMEM;
                goto out;
            }
            buf = nbuf;
        }
        memcpy(buf, a, na);
        memcpy(buf + na, b, nb);
        int32_t l = rt_tok_strmap_get(tok, a, na), r = rt_tok_strmap_get(tok, b, nb);
        int32_t res = rt_tok_strmap_get(tok, buf, na + nb);
        if (l < 0 || r < 0 || res < 0) {
            qs_log_error(__func__, "tokenizer.json: merge %d (\"%.*s\" + \"%.*s\") names a piece not in the vocabulary",
                         (int)rank, (int)na, a, (int)nb, b);
            err = RT_TOK_ERR_JSON;
            goto out;
        }
        rt_tok_pairmap_put(&tok->merges, l, r, rank, res);
        rank++;
    }
out:
    free(buf);
    return err;
}

/* Mark an added token: content replaces the piece string; attrs from the HF fields. */
static enum rt_tok_err set_added(struct rt_tok *tok, int32_t id, const char *content, bool special,
                                 bool lstrip, bool rstrip, bool normalized)
{
    struct rt_tok_entry *e = &tok->ent[id];
    size_t n = strlen(content);
    if (!(e->piece_len == n && (e->attr & (RT_TOKA_MODEL | RT_TOKA_ADDED)) &&
          memcmp(tok->arena + e->piece_off, content, n) == 0)) {
        enum rt_tok_err err = rt_tok_arena_put(tok, content, n, &e->piece_off);
        if (err)
            return err;
        e->piece_len = (uint32_t)n;
    }
    e->attr &= ~(uint32_t)(RT_TOKA_SPECIAL | RT_TOKA_LSTRIP | RT_TOKA_RSTRIP | RT_TOKA_NORMALIZED);
    e->attr |= RT_TOKA_ADDED | (special ? RT_TOKA_SPECIAL : 0) | (lstrip ? RT_TOKA_LSTRIP : 0) |
               (rstrip ? RT_TOKA_RSTRIP : 0) | (normalized ? RT_TOKA_NORMALIZED : 0);
    return RT_TOK_ERR_NONE;
}

static enum rt_tok_err json_added(struct rt_tok *tok, const cJSON *added)
{
    const cJSON *a;
    cJSON_ArrayForEach(a, added) {
        long id;
        const char *content = json_str(a, "content");
        bool special, lstrip, rstrip, normalized;
        if (!json_int(cJSON_GetObjectItemCaseSensitive(a, "id"), 0, tok->n_vocab - 1, &id) ||
            !content || !*content || !json_bool(a, "special", false, &special) ||
            !json_bool(a, "lstrip", false, &lstrip) || !json_bool(a, "rstrip", false, &rstrip) ||
            !json_bool(a, "normalized", !special, &normalized)) { /* HF AddedToken default */
            qs_log_error(__func__, "tokenizer.json: added_tokens entry %s is malformed (needs id in [0, %d), non-empty content, boolean flags)",
                         content ? content : "(no content)", (int)tok->n_vocab);
            return RT_TOK_ERR_JSON;
        }
        enum rt_tok_err err = set_added(tok, (int32_t)id, content, special, lstrip, rstrip, normalized);
        if (err)
            return err;
    }
    return RT_TOK_ERR_NONE;
}

/* Largest id in the vocabulary object and added_tokens array (-1 when empty), checking types. */
static enum rt_tok_err json_max_id(const cJSON *vocab, const cJSON *added, long *max_id)
{
    *max_id = -1;
    const cJSON *v;
    cJSON_ArrayForEach(v, vocab) {
        long id;
        if (!json_int(v, 0, RT_TOK_MAX_VOCAB - 1, &id)) {
            qs_log_error(__func__, "tokenizer.json: vocab entry \"%s\" is not an id in [0, %d)", v->string, RT_TOK_MAX_VOCAB);
            return RT_TOK_ERR_JSON;
        }
        if (id > *max_id)
            *max_id = id;
    }
    cJSON_ArrayForEach(v, added) {
        long id;
        if (!json_int(cJSON_GetObjectItemCaseSensitive(v, "id"), 0, RT_TOK_MAX_VOCAB - 1, &id)) {
            qs_log_error(__func__, "tokenizer.json: an added_tokens entry has no id in [0, %d)", RT_TOK_MAX_VOCAB);
            return RT_TOK_ERR_JSON;
        }
        if (id > *max_id)
            *max_id = id;
    }
    return RT_TOK_ERR_NONE;
}

enum rt_tok_err rt_tok_json_load(const char *text, size_t len, struct rt_tok **out,
                                 struct rt_tok_json_opts *o)
{
    enum rt_tok_err err = RT_TOK_ERR_JSON;
    struct rt_tok *tok = NULL;
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!cJSON_IsObject(root)) {
        qs_log_error(__func__, "tokenizer.json: not a JSON object (syntax error or truncated, %zu bytes)", len);
        goto out;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    const char *type = json_str(model, "type");
    if (type && strcmp(type, "BPE") != 0) {
        qs_log_error(__func__, "tokenizer.json: model type \"%s\" is not supported (only BPE)", type);
        err = RT_TOK_ERR_UNSUPPORTED;
        goto out;
    }
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges) || (added && !cJSON_IsNull(added) && !cJSON_IsArray(added))) {
        qs_log_error(__func__, "tokenizer.json: model.vocab must be an object, model.merges and added_tokens arrays");
        goto out;
    }
    long max_id;
    if ((err = json_max_id(vocab, added, &max_id)))
        goto out;
    if (max_id < 0) {
        qs_log_error(__func__, "tokenizer.json: empty vocabulary");
        err = RT_TOK_ERR_JSON;
        goto out;
    }
    tok = rt_tok_alloc((int32_t)max_id + 1);
    if (!tok) {
        qs_log_error(__func__, "out of memory for %ld tokens", max_id + 1);
        err = RT_TOK_ERR_NOMEM;
        goto out;
    }
    const cJSON *v;
    cJSON_ArrayForEach(v, vocab) {
        struct rt_tok_entry *e = &tok->ent[(int32_t)v->valuedouble];
        if (e->attr & RT_TOKA_MODEL) {
            qs_log_error(__func__, "tokenizer.json: vocab id %d is used by \"%s\" and \"%s\"",
                         (int)v->valuedouble, tok->arena + e->model_off, v->string);
            err = RT_TOK_ERR_JSON;
            goto out;
        }
        size_t n = strlen(v->string);
        if ((err = rt_tok_arena_put(tok, v->string, n, &e->model_off)))
            goto out;
        e->model_len = e->piece_len = (uint32_t)n;
        e->piece_off = e->model_off;
        e->attr = RT_TOKA_MODEL;
    }
    if ((err = rt_tok_strmap_build(tok)) || (err = json_merges(tok, merges)))
        goto out;

    bool ok = json_bool(model, "byte_fallback", false, &tok->byte_fallback) &&
              json_bool(model, "fuse_unk", false, &tok->fuse_unk) &&
              json_bool(model, "ignore_merges", false, &tok->ignore_merges);
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    const char *csp = json_str(model, "continuing_subword_prefix");
    const char *eow = json_str(model, "end_of_word_suffix");
    if (!ok) {
        qs_log_error(__func__, "tokenizer.json: model byte_fallback/fuse_unk/ignore_merges must be booleans");
        err = RT_TOK_ERR_JSON;
        goto out;
    }
    if ((dropout && !cJSON_IsNull(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0.0)) ||
        (csp && *csp) || (eow && *eow)) {
        qs_log_error(__func__, "tokenizer.json: BPE dropout / continuing_subword_prefix / end_of_word_suffix are not supported");
        err = RT_TOK_ERR_UNSUPPORTED;
        goto out;
    }
    const char *unk = json_str(model, "unk_token");
    if (unk && (tok->unk_id = rt_tok_strmap_get(tok, unk, strlen(unk))) < 0) {
        qs_log_error(__func__, "tokenizer.json: unk_token \"%s\" is not in the vocabulary", unk);
        err = RT_TOK_ERR_JSON;
        goto out;
    }
    if ((err = json_added(tok, added)) ||
        (err = json_normalizer(tok, cJSON_GetObjectItemCaseSensitive(root, "normalizer"))) ||
        (err = json_pretok(tok, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), o)))
        goto out;
    if (o->falcon_stage != 0 && o->falcon_stage != 4) {
        qs_log_error(__func__, "tokenizer.json: an incomplete Falcon pre-tokenizer Sequence "
                     "(Punctuation, ByteLevel, Digits, Split [0-9]{3} expected, %d of them seen)",
                     o->falcon_stage);
        err = RT_TOK_ERR_UNSUPPORTED;
        goto out;
    }
    json_decoder(tok, cJSON_GetObjectItemCaseSensitive(root, "decoder"));
    if ((err = json_postproc(cJSON_GetObjectItemCaseSensitive(root, "post_processor"), o)))
        goto out;
    tok->kind = o->bytelevel ? RT_TOK_KIND_BYTELEVEL : RT_TOK_KIND_SPM;
    if (tok->kind == RT_TOK_KIND_BYTELEVEL && (tok->dummy_prefix || tok->escape_spaces || tok->byte_fallback)) {
        qs_log_error(__func__, "tokenizer.json: byte-level pre-tokenizer mixed with SentencePiece options");
        err = RT_TOK_ERR_UNSUPPORTED;
        goto out;
    }
    if (tok->kind == RT_TOK_KIND_SPM && tok->pretok != RT_TOK_PRETOK_NONE) {
        qs_log_error(__func__, "tokenizer.json: a Split pre-tokenizer without ByteLevel is not supported");
        err = RT_TOK_ERR_UNSUPPORTED;
        goto out;
    }
    err = RT_TOK_ERR_NONE;
out:
    cJSON_Delete(root);
    if (err) {
        rt_tok_free(tok);
        tok = NULL;
    }
    *out = tok;
    return err;
}

// --- tokenizer_config.json and the special-token map ----------------------------------------

/* bos_token / eos_token: a string, an object with "content", or null (-> *content NULL). */
static bool config_token(const cJSON *v, const char **content)
{
    *content = NULL;
    if (!v || cJSON_IsNull(v))
        return true;
    if (cJSON_IsString(v)) {
        *content = v->valuestring;
        return true;
    }
    *content = json_str(v, "content");
    return *content != NULL;
}

enum rt_tok_err rt_tok_config_apply(struct rt_tok *tok, const char *text, size_t len)
{
    enum rt_tok_err err = RT_TOK_ERR_CONFIG;
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!cJSON_IsObject(root)) {
        qs_log_error(__func__, "tokenizer_config.json: not a JSON object (syntax error or truncated, %zu bytes)", len);
        goto out;
    }
    const cJSON *ab = cJSON_GetObjectItemCaseSensitive(root, "add_bos_token");
    const cJSON *ae = cJSON_GetObjectItemCaseSensitive(root, "add_eos_token");
    if ((ab && !cJSON_IsBool(ab) && !cJSON_IsNull(ab)) || (ae && !cJSON_IsBool(ae) && !cJSON_IsNull(ae))) {
        qs_log_error(__func__, "tokenizer_config.json: add_bos_token/add_eos_token must be booleans");
        goto out;
    }
    if (cJSON_IsBool(ab))
        tok->add_bos = cJSON_IsTrue(ab);
    if (cJSON_IsBool(ae))
        tok->add_eos = cJSON_IsTrue(ae);
    const cJSON *bt = cJSON_GetObjectItemCaseSensitive(root, "bos_token");
    const cJSON *et = cJSON_GetObjectItemCaseSensitive(root, "eos_token");
    const char *bos, *eos;
    if (!config_token(bt, &bos) || !config_token(et, &eos)) {
        qs_log_error(__func__, "tokenizer_config.json: bos_token/eos_token must be a string, {\"content\": ...} or null");
        goto out;
    }
    if (bt) {
        tok->bos_id = bos ? rt_tok_find(tok, bos) : -1;
        if (bos && tok->bos_id < 0) {
            qs_log_error(__func__, "tokenizer_config.json: bos_token \"%s\" is not in the vocabulary", bos);
            goto out;
        }
    }
    if (et) {
        int32_t id = eos ? rt_tok_find(tok, eos) : -1;
        if (eos && id < 0) {
            qs_log_error(__func__, "tokenizer_config.json: eos_token \"%s\" is not in the vocabulary", eos);
            goto out;
        }
        tok->n_eos = 0;
        if (id >= 0)
            tok->eos_ids[tok->n_eos++] = id;
    }
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
    const char *tmpl = NULL;
    if (cJSON_IsString(ct)) {
        tmpl = ct->valuestring;
    } else if (cJSON_IsArray(ct)) { /* [{"name": "default", "template": "..."}, ...] */
        const cJSON *it;
        cJSON_ArrayForEach(it, ct) {
            const char *name = json_str(it, "name"), *t = json_str(it, "template");
            if (t && (!tmpl || (name && strcmp(name, "default") == 0)))
                tmpl = t;
        }
    }
    if (tmpl && !(tok->chat_template = strdup(tmpl))) {
        qs_log_error(__func__, "out of memory");
        err = RT_TOK_ERR_NOMEM;
        goto out;
    }
    err = RT_TOK_ERR_NONE;
out:
    cJSON_Delete(root);
    return err;
}

enum rt_tok_err rt_tok_special_map_apply(struct rt_tok *tok, const char *text, size_t len)
{
    enum rt_tok_err err = RT_TOK_ERR_SPECIAL_MAP;
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!cJSON_IsObject(root)) {
        qs_log_error(__func__, "special-token map: not a JSON object {\"content\": id}");
        goto out;
    }
    const cJSON *v;
    cJSON_ArrayForEach(v, root) {
        long id;
        if (!json_int(v, 0, tok->n_vocab - 1, &id) || !v->string[0]) {
            qs_log_error(__func__, "special-token map: \"%s\" needs an id in [0, %d)", v->string, (int)tok->n_vocab);
            goto out;
        }
        if ((err = set_added(tok, (int32_t)id, v->string, true, false, false, false)))
            goto out;
        err = RT_TOK_ERR_SPECIAL_MAP;
    }
    err = RT_TOK_ERR_NONE;
out:
    cJSON_Delete(root);
    return err;
}

