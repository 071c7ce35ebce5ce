/*
 * t_tok_chat.h - the chat-format cases of build/test_tok (rt_chat_detect, rt_chat_format,
 * rt_chat_end_id vs jinja2 renderings of the real templates in chat-golden.json). Included once,
 * by tests/test_tok.c, after its file helpers (read_all, read_json, encode_ok, ids_equal).
 */
#ifndef QS_T_TOK_CHAT_H
#define QS_T_TOK_CHAT_H

/* --- chat ---------------------------------------------------------------------------------- */

static void test_chat(const struct rt_tok *l2, const struct rt_tok *l3, const struct rt_tok *l31,
                      const struct rt_tok *mistral)
{
    struct rt_chat_msg msgs[] = {
        {"system", "You are terse."},
        {"user", "  Hi there!  "},
        {"assistant", "Hello."},
        {"user", "\xF0\x9F\xA6\x99?"},
    };
    CHECK_EQ_INT(rt_chat_detect(l3), RT_CHAT_LLAMA3);
    CHECK_EQ_INT(rt_chat_detect(l31), RT_CHAT_LLAMA3);
    CHECK_EQ_INT(rt_chat_detect(mistral), RT_CHAT_NONE); /* base model: no template */
    CHECK_EQ_INT(rt_chat_family_parse("chatml"), RT_CHAT_CHATML);
    CHECK_EQ_INT(rt_chat_family_parse("mistral"), RT_CHAT_MISTRAL);
    CHECK_EQ_INT(rt_chat_family_parse("nope"), RT_CHAT_NONE);
    CHECK_EQ_INT(rt_chat_end_id(l3, RT_CHAT_NONE), 128009);  /* <|eot_id|> */
    CHECK_EQ_INT(rt_chat_end_id(l2, RT_CHAT_LLAMA2), 2);      /* </s> */
    CHECK_EQ_INT(rt_chat_end_id(l2, RT_CHAT_CHATML), -1);     /* no <|im_end|> */
    CHECK_EQ_INT(rt_chat_end_id(mistral, RT_CHAT_NONE), -1);  /* no template */
    const struct {
        const struct rt_tok *tok;
        enum rt_chat_family fam;
        const char *name;
    } runs[] = {{l3, RT_CHAT_NONE, "llama3"}, {l31, RT_CHAT_NONE, "llama3_1"}, {l2, RT_CHAT_LLAMA2, "llama2"}};
    for (size_t r = 0; r < 3; r++) {
        char *text = NULL;
        size_t tl;
        enum rt_tok_err err = rt_chat_format(runs[r].tok, runs[r].fam, msgs, 4, true, &text, &tl);
        CHECK_MSG(err == RT_TOK_ERR_NONE, "chat %s: %s", runs[r].name, rt_tok_err_str(err));
        if (err)
            continue;
        /* any way of asking for BOS gives exactly one at the start */
        const unsigned flag_sets[] = {RT_TOK_PARSE_SPECIAL, RT_TOK_PARSE_SPECIAL | RT_TOK_ADD_BOS,
                                      RT_TOK_PARSE_SPECIAL | RT_TOK_DEFAULT_SPECIAL};
        int32_t bos = rt_tok_bos_id(runs[r].tok);
        for (size_t k = 0; k < 3; k++) {
            int32_t *ids = NULL;
            size_t n = 0;
            encode_ok(runs[r].tok, text, flag_sets[k], &ids, &n);
            CHECK_MSG(n > 2 && ids[0] == bos && ids[1] != bos, "chat %s flags %u: BOS at start once", runs[r].name, flag_sets[k]);
            /* Llama-2 puts a BOS before every user turn (2 here); the others one in all */
            CHECK_EQ_INT(count_id(ids, n, bos), runs[r].fam == RT_CHAT_LLAMA2 ? 2 : 1);
            /* byte-level: the prompt comes back exactly (SentencePiece adds the dummy-prefix
             * space after each special token, as HF's legacy Llama tokenizer does) */
            char *back = NULL;
            size_t bl;
            CHECK(rt_tok_decode(runs[r].tok, ids, n, 0, &back, &bl) == RT_TOK_ERR_NONE);
            if (runs[r].fam != RT_CHAT_LLAMA2)
                CHECK_MSG(back && strcmp(back, text) == 0, "chat %s: decode(encode(prompt)) != prompt", runs[r].name);
            free(back);
            free(ids);
        }
        free(text);
    }
    /* Mistral (explicit family; no system role): one BOS however encoded */
    {
        char *text = NULL;
        size_t tl;
        CHECK(rt_chat_format(mistral, RT_CHAT_MISTRAL, msgs + 1, 3, true, &text, &tl) == RT_TOK_ERR_NONE);
        const unsigned flag_sets[] = {RT_TOK_PARSE_SPECIAL, RT_TOK_PARSE_SPECIAL | RT_TOK_DEFAULT_SPECIAL};
        for (size_t k = 0; text && k < 2; k++) {
            int32_t *ids = NULL;
            size_t n = 0;
            encode_ok(mistral, text, flag_sets[k], &ids, &n);
            CHECK(n > 2 && ids[0] == 1 && count_id(ids, n, 1) == 1 && count_id(ids, n, 2) == 1);
            free(ids);
        }
        free(text);
    }
    qs_log_set_quiet(true);
    char *text = (char *)msgs;
    size_t tl;
    CHECK_EQ_INT(rt_chat_format(mistral, RT_CHAT_NONE, msgs, 4, true, &text, &tl), RT_TOK_ERR_CHAT);
    CHECK(text == NULL);
    CHECK_EQ_INT(rt_chat_format(l2, RT_CHAT_CHATML, msgs, 4, true, &text, &tl), RT_TOK_ERR_CHAT);
    struct rt_chat_msg bad_order[] = {{"assistant", "x"}, {"user", "y"}};
    CHECK_EQ_INT(rt_chat_format(l2, RT_CHAT_LLAMA2, bad_order, 2, true, &text, &tl), RT_TOK_ERR_CHAT);
    struct rt_chat_msg bad_utf8[] = {{"user", "\xC3"}};
    CHECK_EQ_INT(rt_chat_format(l3, RT_CHAT_LLAMA3, bad_utf8, 1, true, &text, &tl), RT_TOK_ERR_UTF8);
    qs_log_set_quiet(false);
}

/* rt_chat_format vs jinja2 renderings of the real templates (chat-golden.json). */
static void test_chat_golden(const struct rt_tok *l2, const struct rt_tok *l3, const struct rt_tok *l31,
                             const struct rt_tok *chatml)
{
    cJSON *root = read_json(TOKDIR "chat-golden.json");
    /* Mistral and Qwen2: a tokenizer.json with a config holding the case's template, so the
     * family is detected from it (Mistral v0.1 and v0.2 differ in a space after EOS; Qwen2's
     * template has a default system message) */
    size_t mlen, llen;
    char *mjson = read_all(TOKDIR "mistral/tokenizer.json", &mlen);
    char *ljson = read_all(TOKDIR "llama3/tokenizer.json.gz", &llen);
    int n_meta = 0;
    enum { N_TMPL = 6 };
    struct rt_tok *tmpl_tok[N_TMPL] = {NULL, NULL, NULL, NULL, NULL, NULL};
    static const char *const tmpl_name[N_TMPL] = {"mistral_v01", "mistral_v02", "qwen2",
                                                  "gemma2",      "gemma3",      "phi3"};
    /* the families whose special tokens are mapped onto llama3's reserved ids here */
    static const char *const tmpl_map[N_TMPL] = {
        NULL, NULL, "{\"<|im_start|>\": 128011, \"<|im_end|>\": 128012}",
        "{\"<start_of_turn>\": 128013, \"<end_of_turn>\": 128014}",
        "{\"<start_of_turn>\": 128013, \"<end_of_turn>\": 128014}",
        "{\"<|system|>\": 128015, \"<|user|>\": 128016, \"<|assistant|>\": 128017, \"<|end|>\": "
        "128018}"};
    static const enum rt_chat_family tmpl_fam[N_TMPL] = {RT_CHAT_MISTRAL, RT_CHAT_MISTRAL,
                                                         RT_CHAT_CHATML,  RT_CHAT_GEMMA,
                                                         RT_CHAT_GEMMA,   RT_CHAT_PHI3};
    const cJSON *c;
    int n = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
        const char *fam = cJSON_GetObjectItem(c, "family")->valuestring;
        for (int k = 0; k < N_TMPL && mjson && ljson; k++) {
            if (strcmp(fam, tmpl_name[k]) != 0 || tmpl_tok[k])
                continue;
            const bool l3tok = k >= 2, qwen = k == 2;
            cJSON *cfg = cJSON_CreateObject();
            cJSON_AddStringToObject(cfg, "chat_template", cJSON_GetObjectItem(c, "template")->valuestring);
            if (!l3tok) {
                cJSON_AddStringToObject(cfg, "bos_token", "<s>");
                cJSON_AddStringToObject(cfg, "eos_token", "</s>");
            } else if (!qwen) {
                cJSON_AddStringToObject(cfg, "bos_token", "<|begin_of_text|>");
                cJSON_AddStringToObject(cfg, "eos_token", "<|end_of_text|>");
            }
            char *ctext = cJSON_PrintUnformatted(cfg);
            struct rt_tok_files f = {.json = l3tok ? ljson : mjson, .json_len = l3tok ? llen : mlen,
                                     .config = ctext, .config_len = strlen(ctext),
                                     .special_map = tmpl_map[k],
                                     .special_map_len = tmpl_map[k] ? strlen(tmpl_map[k]) : 0};
            CHECK(rt_tok_load(&f, &tmpl_tok[k]) == RT_TOK_ERR_NONE);
            CHECK_MSG(rt_chat_detect(tmpl_tok[k]) == tmpl_fam[k], "%s: detected as %d", fam,
                      (int)rt_chat_detect(tmpl_tok[k]));
            free(ctext);
            cJSON_Delete(cfg);
        }
        const char *want = cJSON_GetObjectItem(c, "text")->valuestring;
        bool gen = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt"));
        const struct rt_tok *tok = strcmp(fam, "llama3") == 0 ? l3 : strcmp(fam, "llama3_1") == 0 ? l31
                                 : strcmp(fam, "llama2") == 0 ? l2 : strcmp(fam, "chatml") == 0 ? chatml
                                 : strcmp(fam, "mistral_v01") == 0 ? tmpl_tok[0]
                                 : strcmp(fam, "mistral_v02") == 0 ? tmpl_tok[1] : strcmp(fam, "qwen2") == 0 ? tmpl_tok[2]
                                 : strcmp(fam, "gemma2") == 0 ? tmpl_tok[3] : strcmp(fam, "gemma3") == 0 ? tmpl_tok[4]
                                 : tmpl_tok[5];
        if (!tok)
            continue;
        enum rt_chat_family f = strcmp(fam, "llama2") == 0 ? RT_CHAT_LLAMA2
                              : strcmp(fam, "chatml") == 0 ? RT_CHAT_CHATML : RT_CHAT_NONE;
        struct rt_chat_msg msgs[8];
        size_t nm = 0;
        const cJSON *m;
        cJSON_ArrayForEach(m, cJSON_GetObjectItem(c, "messages")) {
            if (nm < 8)
                msgs[nm++] = (struct rt_chat_msg){cJSON_GetArrayItem(m, 0)->valuestring,
                                                  cJSON_GetArrayItem(m, 1)->valuestring};
        }
        char *text = NULL;
        size_t tl;
        enum rt_tok_err err = rt_chat_format(tok, f, msgs, nm, gen, &text, &tl);
        CHECK_MSG(err == RT_TOK_ERR_NONE && text && strcmp(text, want) == 0,
                  "chat golden %d (%s, gen %d): got \"%s\"", n, fam, gen, text ? text : rt_tok_err_str(err));
        /* Llama-2: the ids Meta's own chat code builds ([bos] + sentencepiece(turn) + [eos]) */
        const cJSON *meta = cJSON_GetObjectItem(c, "ids_llama2_meta");
        if (meta && text) {
            int32_t *ids = NULL;
            size_t ni = 0;
            encode_ok(tok, text, RT_TOK_PARSE_SPECIAL | RT_TOK_DEFAULT_SPECIAL, &ids, &ni);
            CHECK_MSG(ids && ids_equal(ids, ni, meta), "chat golden %d: Llama-2 ids differ from Meta's", n);
            free(ids);
            n_meta++;
        }
        free(text);
        n++;
    }
    CHECK_EQ_INT(n, 100);
    CHECK_EQ_INT(n_meta, 8);
    /* Gemma 2's template has no system role; Gemma roles alternate; the turn ends */
    if (tmpl_tok[3] && tmpl_tok[4] && tmpl_tok[5]) {
        struct rt_chat_msg sys2[2] = {{"system", "s"}, {"user", "u"}};
        struct rt_chat_msg two_users[2] = {{"user", "a"}, {"user", "b"}}, tool[1] = {{"tool", "x"}};
        char *t2 = NULL;
        size_t n2;
        qs_log_set_quiet(true);
        CHECK_EQ_INT(rt_chat_format(tmpl_tok[3], RT_CHAT_NONE, sys2, 2, true, &t2, &n2), RT_TOK_ERR_CHAT);
        CHECK_EQ_INT(rt_chat_format(tmpl_tok[4], RT_CHAT_NONE, two_users, 2, true, &t2, &n2), RT_TOK_ERR_CHAT);
        CHECK_EQ_INT(rt_chat_format(tmpl_tok[5], RT_CHAT_NONE, tool, 1, true, &t2, &n2), RT_TOK_ERR_CHAT);
        qs_log_set_quiet(false);
        CHECK_EQ_INT(rt_chat_end_id(tmpl_tok[4], RT_CHAT_NONE), 128014);
        CHECK_EQ_INT(rt_chat_end_id(tmpl_tok[5], RT_CHAT_NONE), 128018);
        CHECK_EQ_INT(rt_chat_family_parse("gemma"), RT_CHAT_GEMMA);
        CHECK_EQ_INT(rt_chat_family_parse("phi3"), RT_CHAT_PHI3);
    }
    /* Mistral has no system role */
    struct rt_chat_msg sys[2] = {{"system", "s"}, {"user", "u"}};
    char *text = NULL;
    size_t tl;
    qs_log_set_quiet(true);
    if (tmpl_tok[1])
        CHECK_EQ_INT(rt_chat_format(tmpl_tok[1], RT_CHAT_NONE, sys, 2, true, &text, &tl), RT_TOK_ERR_CHAT);
    qs_log_set_quiet(false);
    for (int k = 0; k < N_TMPL; k++)
        rt_tok_free(tmpl_tok[k]);
    free(mjson);
    free(ljson);
    cJSON_Delete(root);
}

#endif /* QS_T_TOK_CHAT_H */
