/*
 * t_tok_falcon.h - Falcon's pre-tokenizer Sequence (Punctuation Contiguous, ByteLevel, Digits,
 * Split [0-9]{3}; tiiuae/falcon-7b's tokenizer.json) in build/test_tok: llama3's byte-level BPE
 * with that pre_tokenizer put in its place encodes falcon-pretok-vectors.json's texts to the ids
 * Hugging Face's tokenizers library (Rust, through its Node binding) gave (gen_falcon_vectors.mjs);
 * an incomplete, reordered or extended Sequence is refused. Included once, by tests/test_tok.c, after its file helpers.
 */
#ifndef QS_T_TOK_FALCON_H
#define QS_T_TOK_FALCON_H

/* llama3's tokenizer.json text with pre_tokenizer replaced by `pretok` (a copy); NULL on error */
static char *falcon_json(const cJSON *pretok, size_t *len)
{
    size_t n;
    char *js = read_all(TOKDIR "llama3/tokenizer.json.gz", &n);
    cJSON *root = js ? cJSON_ParseWithLength(js, n) : NULL;
    free(js);
    if (!root)
        return NULL;
    cJSON_ReplaceItemInObjectCaseSensitive(root, "pre_tokenizer", cJSON_Duplicate(pretok, true));
    char *out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    *len = out ? strlen(out) : 0;
    return out;
}

static void test_falcon_pretok(void)
{
    cJSON *root = read_json(TOKDIR "falcon-pretok-vectors.json");
    const cJSON *pre = cJSON_GetObjectItem(root, "pre_tokenizer"), *c;
    size_t len = 0;
    char *js = pre ? falcon_json(pre, &len) : NULL;
    struct rt_tok *tok = NULL;
    struct rt_tok_files f = {.json = js, .json_len = len};
    CHECK_MSG(js && rt_tok_load(&f, &tok) == RT_TOK_ERR_NONE, "Falcon pre-tokenizer: load failed");
    int n = 0, bad = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        int32_t *ids = NULL;
        size_t ni = 0;
        if (!tok)
            break;
        encode_ok(tok, text, 0, &ids, &ni);
        const bool ok = ids_equal(ids, ni, cJSON_GetObjectItem(c, "ids"));
        CHECK_MSG(ok, "Falcon pre-tokenizer: \"%s\" encodes differently from HF tokenizers", text);
        bad += !ok;
        free(ids);
        n++;
    }
    CHECK_EQ_INT(n, 167);
    printf("  falcon pre-tokenizer: %d vectors, %d differ\n", n, bad);
    rt_tok_free(tok);
    /* the Sequence is read only whole and in order */
    static const char *const wrong[] = {
        "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Punctuation\", \"behavior\": "
        "\"Contiguous\"}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}]}",
        "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"ByteLevel\", \"add_prefix_space\": "
        "false, \"use_regex\": true}, {\"type\": \"Digits\", \"individual_digits\": false}]}",
        "{\"type\": \"Punctuation\", \"behavior\": \"Isolated\"}",
        "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Punctuation\", \"behavior\": "
        "\"Contiguous\"}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}, "
        "{\"type\": \"Digits\", \"individual_digits\": true}]}",
        /* the whole Sequence, then a second byte mapping */
        "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Punctuation\", \"behavior\": "
        "\"Contiguous\"}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}, "
        "{\"type\": \"Digits\", \"individual_digits\": false}, {\"type\": \"Split\", \"pattern\": "
        "{\"Regex\": \"[0-9][0-9][0-9]\"}, \"behavior\": \"Isolated\", \"invert\": false}, "
        "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]}",
    };
    qs_log_set_quiet(true);
    for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
        cJSON *w = cJSON_Parse(wrong[i]);
        size_t wl = 0;
        char *wj = w ? falcon_json(w, &wl) : NULL;
        struct rt_tok *t2 = NULL;
        struct rt_tok_files f2 = {.json = wj, .json_len = wl};
        CHECK_MSG(wj && rt_tok_load(&f2, &t2) == RT_TOK_ERR_UNSUPPORTED, "wrong Sequence %zu loaded", i);
        rt_tok_free(t2);
        free(wj);
        cJSON_Delete(w);
    }
    qs_log_set_quiet(false);
    free(js);
    cJSON_Delete(root);
}

#endif /* QS_T_TOK_FALCON_H */
