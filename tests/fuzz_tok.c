/*
 * fuzz_tok.c - libFuzzer target for the tokenizer (runtime/rt_tok*.c, rt_chat.c).
 *
 * The first input byte picks what the rest is:
 *   0: tokenizer.json        -> rt_tok_load, then encode/decode/stream a fixed text
 *   1: tokenizer.model       -> the same through the SentencePiece protobuf reader
 *   2: tokenizer_config.json -> loaded with a small built-in byte-level tokenizer.json
 *   3: text                  -> encoded by the built-in SentencePiece and byte-level tokenizers
 *                               (any bytes: invalid UTF-8 must be refused), and its bytes
 *                               reinterpreted as int32 ids for decode and streaming decode
 * Logging is quiet. `make fuzz` runs it on tests/data/fuzz/fuzz_tok/ (seeds made by
 * tests/data/tokenizers/gen_fuzz_seeds.py).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qs_log.h" /* qs_log_set_quiet */
#include "rt_tok.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A byte-level tokenizer: all 256 byte tokens (GPT-2 map), a few merges, two specials. */
static char *bytelevel_json(void)
{
    size_t cap = 1 << 16, k = 0;
    char *j = malloc(cap);
    k += (size_t)snprintf(j + k, cap - k, "{\"model\": {\"type\": \"BPE\", \"ignore_merges\": true, \"vocab\": {");
    /* GPT-2 bytes_to_unicode: printable Latin-1 bytes map to themselves, the rest to 256+i */
    int extra = 0, id = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        unsigned cp = printable ? (unsigned)b : 256u + (unsigned)extra++;
        char u[4];
        int n = 0;
        if (cp < 0x80) {
            u[n++] = (char)cp;
        } else {
            u[n++] = (char)(0xC0 | (cp >> 6));
            u[n++] = (char)(0x80 | (cp & 0x3F));
        }
        if (cp == '"' || cp == '\\')
            k += (size_t)snprintf(j + k, cap - k, "%s\"\\%c\": %d", id ? "," : "", (char)cp, id);
        else
            k += (size_t)snprintf(j + k, cap - k, "%s\"%.*s\": %d", id ? "," : "", n, u, id);
        id++;
    }
    k += (size_t)snprintf(j + k, cap - k, ",\"Ġt\": %d, \"he\": %d, \"Ġthe\": %d}, \"merges\": [\"Ġ t\", \"h e\", \"Ġt he\"]},"
                          "\"added_tokens\": [{\"id\": %d, \"content\": \"<|bos|>\", \"special\": true},"
                          "{\"id\": %d, \"content\": \"<|eot_id|>\", \"special\": true, \"rstrip\": true}],"
                          "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": "
                          "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},"
                          "\"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]},"
                          "\"normalizer\": {\"type\": \"NFC\"}}",
                          id, id + 1, id + 2, id + 3, id + 4);
    return j;
}

static const char SPM_JSON[] =
    "{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"fuse_unk\": true, \"unk_token\": \"<unk>\","
    " \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2, \"<0x41>\": 3, \"<0xE2>\": 4, \"<0x96>\": 5, \"<0x81>\": 6,"
    " \"\xE2\x96\x81\": 7, \"a\": 8, \"b\": 9, \"ab\": 10, \"\xE2\x96\x81" "ab\": 11, \"\xE2\x96\x81\xE2\x96\x81\": 12},"
    " \"merges\": [\"a b\", \"\xE2\x96\x81 ab\", \"\xE2\x96\x81 \xE2\x96\x81\"]},"
    " \"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true}, {\"id\": 1, \"content\": \"<s>\", \"special\": true},"
    " {\"id\": 2, \"content\": \"</s>\", \"special\": true}],"
    " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"\xE2\x96\x81\"},"
    " {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\xE2\x96\x81\"}]},"
    " \"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]}}";

static struct rt_tok *g_spm, *g_bl;
static char *g_bl_json;

static void exercise(const struct rt_tok *tok, const char *text, size_t len)
{
    static const unsigned flag_sets[] = {0, RT_TOK_PARSE_SPECIAL | RT_TOK_DEFAULT_SPECIAL,
                                         RT_TOK_PARSE_SPECIAL | RT_TOK_ADD_BOS};
    for (size_t f = 0; f < sizeof(flag_sets) / sizeof(flag_sets[0]); f++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (rt_tok_encode(tok, text, len, flag_sets[f], &ids, &n) != RT_TOK_ERR_NONE)
            continue;
        char *dec = NULL;
        size_t dl = 0;
        if (rt_tok_decode(tok, ids, n, f ? RT_TOK_DECODE_SKIP_SPECIAL : 0, &dec, &dl) == RT_TOK_ERR_NONE)
            free(dec);
        struct rt_tok_stream s;
        rt_tok_stream_init(&s, tok, 0);
        const char *t;
        size_t tl;
        for (size_t i = 0; i < n; i++)
            rt_tok_stream_push(&s, ids[i], &t, &tl);
        rt_tok_stream_flush(&s, &t, &tl);
        rt_tok_stream_free(&s);
        free(ids);
    }
    struct rt_chat_msg msgs[2] = {{"system", "s"}, {"user", "hi"}};
    char *chat = NULL;
    size_t cl;
    for (int fam = 0; fam <= 3; fam++) {
        if (rt_chat_format(tok, (enum rt_chat_family)fam, msgs, 2, true, &chat, &cl) == RT_TOK_ERR_NONE)
            free(chat);
    }
}

static void init(void)
{
    qs_log_set_quiet(true);
    struct rt_tok_files f = {.json = SPM_JSON, .json_len = sizeof(SPM_JSON) - 1};
    if (rt_tok_load(&f, &g_spm))
        abort();
    g_bl_json = bytelevel_json();
    struct rt_tok_files b = {.json = g_bl_json, .json_len = strlen(g_bl_json)};
    if (rt_tok_load(&b, &g_bl))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char sample[] = "Hello the world's 12345 <s>  \xF0\x9F\xA6\x99 <|eot_id|>\n\n x";
    if (!g_spm)
        init();
    if (size < 1)
        return 0;
    const char *body = (const char *)data + 1;
    size_t n = size - 1;
    struct rt_tok *tok = NULL;
    struct rt_tok_files f = {0};
    switch (data[0] % 4) {
    case 0:
        f.json = body, f.json_len = n;
        break;
    case 1:
        f.model = (const unsigned char *)body, f.model_len = n;
        break;
    case 2:
        f.json = g_bl_json, f.json_len = strlen(g_bl_json);
        f.config = body, f.config_len = n;
        break;
    default: {
        exercise(g_spm, body, n);
        exercise(g_bl, body, n);
        size_t ni = n / 4;
        int32_t *ids = malloc((ni ? ni : 1) * sizeof(int32_t));
        memcpy(ids, body, ni * 4);
        for (size_t i = 0; i < ni; i++) /* mostly in range, some not */
            ids[i] = (int32_t)((uint32_t)ids[i] % 300u) - 10;
        const struct rt_tok *toks[2] = {g_spm, g_bl};
        for (int t = 0; t < 2; t++) {
            char *dec;
            size_t dl;
            if (rt_tok_decode(toks[t], ids, ni, 0, &dec, &dl) == RT_TOK_ERR_NONE)
                free(dec);
            struct rt_tok_stream s;
            rt_tok_stream_init(&s, toks[t], RT_TOK_DECODE_SKIP_SPECIAL);
            const char *tx;
            size_t tl;
            for (size_t i = 0; i < ni; i++)
                rt_tok_stream_push(&s, ids[i], &tx, &tl);
            rt_tok_stream_flush(&s, &tx, &tl);
            rt_tok_stream_free(&s);
        }
        free(ids);
        return 0;
    }
    }
    if (rt_tok_load(&f, &tok) == RT_TOK_ERR_NONE) {
        exercise(tok, sample, sizeof(sample) - 1);
        rt_tok_free(tok);
    }
    return 0;
}
