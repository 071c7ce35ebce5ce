/*
 * test_cli_tok.c - `qshard tokenize` (and the text side of `logits`, `inspect`) end to end on
 * the fixtures with a tokenizer, against references we did not write (tests/t_cli.h runs the
 * binary):
 *   - `tokenize --text` equals HF's ids (the golden's hf_ids_tokenizers), `--decode` gives the
 *     text back, for every fixture with a tokenizer (the trained KJV model's own);
 *   - the real Llama-2 tokenizer vectors (tests/data/tokenizer-test-vectors.json) come out of
 *     `qshard tokenize` on the rank file's embedded tokenizer (a model built here around
 *     tests/data/tokenizers/llama2/tokenizer.json: tests/t_cli.h cli_llama2_model);
 *     `logits --text` encodes as `tokenize`;
 *   - `--decode` of byte-fallback runs that are not valid UTF-8 gives one U+FFFD per byte as HF
 *     tokenizers 0.23.2 decodes them, with and without --skip-special-tokens
 *     (tests/data/tokenizers/decode-vectors.json);
 *   - `tokenize -f -` reads standard input;
 *   - `inspect` summarises the converted model (config, tokenizer, generation config, rank
 *     sizes) and shows the tensor table only with --tensors.
 * Run: ./build/test_cli_tok (from the repository root).
 */
#include "t_cli.h"

static void check_tokenize(const char *model, const char *name, const cJSON *prompt)
{
    /* HF's ids: the golden's "hf_ids_tokenizers" (the HF tokenizers library's encoding of the
     * text, stored by the fixture generator) */
    const char *text = jstr(prompt, "text");
    const cJSON *pids = cJSON_GetObjectItemCaseSensitive(prompt, "hf_ids_tokenizers");
    if (!text)
        return;
    if (!cJSON_IsArray(pids)) {
        printf("cli_tok: note: %s has no HF token ids in the golden: tokenize check skipped\n", name);
        return;
    }
    struct proc p = run("tokenize", model, "--text", text, NULL);
    CHECK_EXIT(p, 0, name);
    int32_t got[512];
    int n = parse_ids(p.out, got, 512), ng = cJSON_GetArraySize(pids), bad = 0;
    for (int i = 0; i < n && i < ng; i++)
        bad += got[i] != cJSON_GetArrayItem(pids, i)->valueint;
    CHECK_MSG(n == ng && bad == 0, "%s: tokenize \"%s\" gives %d ids (%d differ), HF has %d",
              name, text, n, bad, ng);
    proc_free(&p);
    /* decode the ids without the BOS: the text comes back (HF decode, leading space stripped) */
    if (ng > 1) {
        cJSON *rest = cJSON_Duplicate(pids, 1);
        cJSON_DeleteItemFromArray(rest, 0);
        char *csv = ids_csv(rest);
        p = run("tokenize", model, "--decode", csv, NULL);
        CHECK_EXIT(p, 0, name);
        size_t tl = strlen(text);
        CHECK_MSG(p.out_len == tl + 1 && !strncmp(p.out, text, tl),
                  "%s: decode gives \"%s\", expected \"%s\"", name, p.out, text);
        proc_free(&p);
        free(csv);
        cJSON_Delete(rest);
    }
}

/* `qshard tokenize` on the embedded tokenizer vs the real Llama-2 vectors (third-party ids,
 * tests/data/tokenizer-test-vectors.json "llama2_spm"). */
static void check_tokenize_vectors(const char *model)
{
    char *buf = NULL;
    size_t len;
    if (rt_file_read(DATA "tokenizer-test-vectors.json", 1 << 26, &buf, &len)) {
        CHECK_MSG(0, "tests/data/tokenizer-test-vectors.json unreadable");
        return;
    }
    cJSON *root = cJSON_ParseWithLength(buf, len);
    free(buf);
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(root, "llama2_spm"), "cases");
    CHECK(cJSON_GetArraySize(cases) > 0);
    const cJSON *c;
    int n_checked = 0;
    cJSON_ArrayForEach(c, cases)
    {
        const char *text = jstr(c, "text");
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(c, "ids");
        if (!text || !cJSON_IsArray(ids))
            continue; /* "" included: [BOS], as HF tokenizer("") */
        struct proc p = run("tokenize", model, "--text", text, NULL);
        CHECK_EXIT(p, 0, "tokenize vector");
        int32_t got[4096];
        int n = parse_ids(p.out, got, 4096), nw = cJSON_GetArraySize(ids), bad = 0;
        for (int i = 0; i < n && i < nw; i++)
            bad += got[i] != cJSON_GetArrayItem(ids, i)->valueint;
        CHECK_MSG(n == nw && bad == 0, "tokenize \"%.40s\": %d ids (%d differ), vector has %d",
                  text, n, bad, nw);
        proc_free(&p);
        n_checked++;
    }
    printf("cli_tok: %d Llama-2 tokenizer vectors through `qshard tokenize`\n", n_checked);
    /* `logits --text` encodes like `tokenize` (BOS included): same file as with the vector ids */
    const cJSON *c0 = cJSON_GetArrayItem(cases, 0);
    if (c0 && jstr(c0, "text")) {
        char a[512], b[512], *csv = ids_csv(cJSON_GetObjectItemCaseSensitive(c0, "ids"));
        snprintf(a, sizeof(a), "%s/by_text.npy", g_tmp);
        snprintf(b, sizeof(b), "%s/by_ids.npy", g_tmp);
        struct proc p = run("logits", model, "--text", jstr(c0, "text"), "--out", a, NULL);
        CHECK_EXIT(p, 0, "logits --text");
        proc_free(&p);
        p = run("logits", model, "--tokens", csv, "--out", b, NULL);
        CHECK_EXIT(p, 0, "logits --tokens");
        proc_free(&p);
        char *fa = NULL, *fb = NULL;
        size_t la = 0, lb = 0;
        CHECK(!rt_file_read(a, 1 << 26, &fa, &la) && !rt_file_read(b, 1 << 26, &fb, &lb) &&
              la == lb && la > 128 && !memcmp(fa, fb, la));
        free(fa);
        free(fb);
        free(csv);
    }
    cJSON_Delete(root);
}

/* The HF decode vectors through `tokenize --decode [--skip-special-tokens]` (the fixed cases:
 * truncated, invalid, overlong, surrogate, runs broken by pieces and by special tokens). */
static void check_decode_vectors(const char *model)
{
    cJSON *root = cli_read_json("tokenizers/decode-vectors.json");
    CHECK(root != NULL);
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(root, "hf_llama2"), "cases");
    int n = 0;
    for (int i = 0; i < 15 && i < cJSON_GetArraySize(cases); i++) {
        const cJSON *c = cJSON_GetArrayItem(cases, i);
        char *csv = ids_csv(cJSON_GetObjectItemCaseSensitive(c, "ids"));
        for (int skip = 0; skip < 2; skip++, n++) {
            const char *want = jstr(c, skip ? "text_skip_special" : "text");
            struct proc p = skip ? run("tokenize", model, "--decode", csv,
                                       "--skip-special-tokens", NULL)
                                 : run("tokenize", model, "--decode", csv, NULL);
            CHECK_EXIT(p, 0, "tokenize --decode vector");
            size_t wl = want ? strlen(want) : 0;
            CHECK_MSG(want && p.out_len == wl + 1 && !memcmp(p.out, want, wl),
                      "decode %s%s: got \"%s\", HF gives \"%s\"", csv,
                      skip ? " --skip-special-tokens" : "", p.out, want ? want : "");
            proc_free(&p);
        }
        free(csv);
    }
    printf("cli_tok: %d HF decode vectors through `qshard tokenize --decode`\n", n);
    cJSON_Delete(root);
    struct proc p = run("run", model, "-p", "x", "--skip-special-tokens", NULL);
    CHECK_EXIT(p, 1, "--skip-special-tokens is a tokenize option");
    proc_free(&p);
}

/* `tokenize -f -`: standard input, the same ids as --text. */
static void check_stdin(const char *model)
{
    char path[512];
    g_stdin = cli_write_tmp("stdin.txt", "Hello stdin world", path, sizeof(path));
    struct proc a = run("tokenize", model, "-f", "-", NULL);
    g_stdin = NULL;
    struct proc b = run("tokenize", model, "--text", "Hello stdin world", NULL);
    CHECK_EXIT(a, 0, "tokenize -f -");
    CHECK_MSG(a.out_len > 4 && !strcmp(a.out, b.out), "tokenize -f - gives \"%s\", --text \"%s\"",
              a.out, b.out);
    proc_free(&a);
    proc_free(&b);
}

/* `inspect DIR`: the summary, from the fixture's own files; --tensors adds the tensor table. */
static void check_inspect(const char *model, const cJSON *m)
{
    struct proc p = run("inspect", model, NULL);
    CHECK_EXIT(p, 0, "inspect summary");
    const int vocab = cJSON_GetObjectItemCaseSensitive(m, "vocab_size")->valueint;
    char layers[64], vs[64], ids[64];
    snprintf(layers, sizeof(layers), "config: %s, %d layers", jstr(m, "architecture"),
             cJSON_GetObjectItemCaseSensitive(m, "num_layers")->valueint);
    snprintf(vs, sizeof(vs), "vocab %d,", vocab);
    snprintf(ids, sizeof(ids), ": %d ids, bos 1, eos 2", vocab); /* the fixture's config.json */
    CHECK_MSG(strstr(p.out, layers) && strstr(p.out, vs) &&
                  strstr(p.out, "tokenizer: tokenizer.json") && strstr(p.out, ids) &&
                  strstr(p.out, "generation config:") &&
                  strstr(p.out, "rank 0  rank-0-of-1.qshard"),
              "inspect summary (%s, %s, %s): %.800s", layers, vs, ids, p.out);
    CHECK_MSG(!strstr(p.out, "qweight"), "inspect summary shows tensors: %.300s", p.out);
    proc_free(&p);
    p = run("inspect", "--tensors", model, NULL);
    CHECK_EXIT(p, 0, "inspect --tensors");
    CHECK_MSG(strstr(p.out, "model.layers.0.self_attn.qkv_proj.qweight") &&
                  strstr(p.out, "W4_MMA_T16X64"), "inspect --tensors: %.300s", p.out);
    proc_free(&p);
}

int main(void)
{
    T_INIT("cli_tok");
    if (!cli_setup())
        return 1;
    cJSON *index = load_index();
    const cJSON *models = cJSON_GetObjectItemCaseSensitive(index, "models"), *m;
    CHECK_MSG(cJSON_IsArray(models), "tests/data/models/INDEX.json not found");
    int n_models = 0;
    cJSON_ArrayForEach(m, models)
    {
        if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "tokenizer")) || !jstr(m, "path"))
            continue;
        char *dir = convert(m, 1);
        if (!dir)
            continue;
        n_models++;
        const cJSON *pr;
        cJSON_ArrayForEach(pr, cJSON_GetObjectItemCaseSensitive(m, "prompts"))
        {
            char what[256];
            snprintf(what, sizeof(what), "%s/%s", jstr(m, "name"), jstr(pr, "name"));
            check_tokenize(dir, what, pr);
        }
        if (n_models == 1) {
            check_stdin(dir);
            check_inspect(dir, m);
        }
        free(dir);
    }
    CHECK_MSG(n_models > 0, "no fixture with a tokenizer");
    char *l2 = cli_llama2_model();
    if (l2) {
        check_tokenize_vectors(l2);
        check_decode_vectors(l2);
    }
    free(l2);
    cJSON_Delete(index);
    cli_teardown();
    return t_done();
}
