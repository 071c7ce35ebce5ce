/*
 * test_model.c - the runtime model (runtime/rt.h) on the CPU backend, synthetic models.
 *
 * Random canonical AWQ weights (codes, zeros, fp16 scales) for small llama / mistral / qwen2 /
 * mixtral shapes are split by DESIGN 5's TP rules and written as rank files with the format
 * writer (tests/t_model.h); the runtime's logits are compared with an independent forward pass
 * written in double precision from the unpacked weights (relative L2 <= 1e-4), TP-2 / TP-4
 * with TP-1 (relative L2 <= 1e-5; every rank in its own thread, joined by the communicator),
 * chunked prefill and token-by-token decode with one full prefill, and every error path (bad
 * token, context overflow, missing tensor, wrong or unknown layout, shape disagreement, unused
 * tensor, rank file from another set, bad configs).
 * The fp16 emulation, device picks and graph fallbacks: test_model_emu.c; batches of several
 * sequences: test_model_batch.c; the fixtures through the converter: test_model_fixtures.c.
 *
 * Run: ./build/test_model (from the repository root).
 */
#include <time.h>

#include <xxhash.h>

#include "t_model.h"

static void test_synthetic(const char *label, const struct syn_spec *sp, const int *tps, int n_tp)
{
    struct syn_model m;
    syn_build(&m, sp);
    enum { T = 12 };
    int32_t tok[T];
    for (int t = 0; t < T; t++)
        tok[t] = (int32_t)(rnd_u32() % (uint32_t)sp->V);
    double *want = xcalloc((size_t)T * sp->V, 8);
    d_forward(&m, tok, T, want);

    char dir[512];
    float *tp1 = NULL;
    for (int i = 0; i < n_tp; i++) {
        int ws = tps[i];
        snprintf(dir, sizeof(dir), "%s/%s-tp%d", tmp_root, label, ws);
        int wrc = write_set(&m, dir, ws, CORRUPT_NONE);
        CHECK_MSG(wrc == 0, "%s: writing TP-%d set failed: %s", label, ws, qs_log_last());
        if (wrc)
            continue;
        float *lg = run_logits(dir, tok, T, ws == 1 ? 5 : 64, sp->V);
        if (!lg)
            continue;
        double e = rel_l2(lg, want, (size_t)T * sp->V);
        printf("  %-12s TP-%d vs double reference: rel L2 %.2e\n", label, ws, e);
        CHECK_MSG(e <= 1e-4, "%s TP-%d: rel L2 %g vs reference", label, ws, e);
        if (ws == 1) {
            tp1 = lg;
            continue;
        }
        if (tp1) {
            double d = rel_l2_f(lg, tp1, (size_t)T * sp->V);
            printf("  %-12s TP-%d vs TP-1: rel L2 %.2e\n", label, ws, d);
            CHECK_MSG(d <= 1e-5, "%s TP-%d vs TP-1: rel L2 %g", label, ws, d);
        }
        free(lg);
    }


    /* decode token by token after a 5-token prefill == the all-at-once logits */
    snprintf(dir, sizeof(dir), "%s/%s-tp1", tmp_root, label);
    struct rt_exec *rm = NULL;
    struct rt_opts o = cpu_opts(T, 0, 1);
    if (tp1 && rt_exec_open(dir, &o, &rm) == RT_ERR_NONE) {
        float *row = xcalloc((size_t)sp->V, 4);
        CHECK_EQ_INT(rt_exec_forward_seq(rm, 0, tok, 5, 0, row, false), RT_ERR_NONE);
        double d = rel_l2_f(row, tp1 + (size_t)4 * sp->V, (size_t)sp->V);
        CHECK_MSG(d <= 1e-6, "%s: last-row prefill logits differ: %g", label, d);
        for (int t = 5; t < T; t++) {
            CHECK_EQ_INT(rt_exec_forward_seq(rm, 0, tok + t, 1, t, row, false), RT_ERR_NONE);
            d = rel_l2_f(row, tp1 + (size_t)t * sp->V, (size_t)sp->V);
            CHECK_MSG(d <= 1e-5, "%s: decode step %d differs from prefill: %g", label, t, d);
        }
        CHECK_EQ_INT(rt_exec_seq_len(rm, 0), T);
        /* rewind: re-running position 7 gives the same logits again */
        CHECK_EQ_INT(rt_exec_forward_seq(rm, 0, tok + 7, 1, 7, row, false), RT_ERR_NONE);
        CHECK(rel_l2_f(row, tp1 + (size_t)7 * sp->V, (size_t)sp->V) <= 1e-5);
        /* context overflow, bad tokens, bad start_pos: reported, nothing run */
        qs_log_set_quiet(true);
        CHECK_EQ_INT(rt_exec_forward_seq(rm, 0, tok, 1, T, row, false), RT_ERR_ARG);
        rt_exec_seq_clear(rm, 0);
        CHECK_EQ_INT(rt_exec_forward_seq(rm, 0, tok, T, 0, NULL, false), RT_ERR_NONE);
        CHECK_EQ_INT(rt_exec_forward_seq(rm, 0, tok, 1, T, row, false), RT_ERR_CONTEXT);
        CHECK(strstr(qs_log_last(), "context overflow") != NULL);
        int32_t bad[2] = {3, sp->V};
        rt_exec_seq_clear(rm, 0);
        CHECK_EQ_INT(rt_exec_forward_seq(rm, 0, bad, 2, 0, row, false), RT_ERR_TOKEN);
        CHECK(strstr(qs_log_last(), "index 1") != NULL);
        bad[1] = -1;
        CHECK_EQ_INT(rt_exec_forward_seq(rm, 0, bad, 2, 0, row, false), RT_ERR_TOKEN);
        CHECK_EQ_INT(rt_exec_forward_seq(rm, 0, bad, 0, 0, row, false), RT_ERR_ARG);
        qs_log_set_quiet(false);
        free(row);
        rt_exec_free(rm);
    } else {
        CHECK_MSG(0, "%s: cannot reopen TP-1 model", label);
    }
    free(tp1);
    free(want);
    syn_free(&m);
}

static int patch_layout(const char *path, const char *name, uint32_t layout)
{
    FILE *f = fopen(path, "r+b");
    if (!f)
        return -1;
    uint8_t hdr[256];
    int rc = -1;
    if (fread(hdr, 1, 256, f) != 256)
        goto out;
    uint64_t sto;
    uint32_t cnt, esz;
    memcpy(&sto, hdr + 56, 8), memcpy(&cnt, hdr + 64, 4), memcpy(&esz, hdr + 68, 4);
    for (uint32_t i = 0; i < cnt; i++) {
        uint8_t e[32];
        if (fseek(f, (long)(sto + (uint64_t)i * esz), SEEK_SET) || fread(e, 1, 32, f) != 32)
            goto out;
        uint32_t kind;
        uint64_t off, size;
        memcpy(&kind, e, 4), memcpy(&off, e + 8, 8), memcpy(&size, e + 16, 8);
        if (kind != FMT_SECTION_TENSOR_TABLE)
            continue;
        uint8_t *sec = malloc(size);
        if (!sec || fseek(f, (long)off, SEEK_SET) || fread(sec, 1, size, f) != size) {
            free(sec);
            goto out;
        }
        uint32_t n, entsz;
        memcpy(&n, sec, 4), memcpy(&entsz, sec + 4, 4);
        const char *pool = (const char *)sec + 16 + (size_t)n * entsz;
        for (uint32_t t = 0; t < n; t++) {
            uint8_t *ent = sec + 16 + (size_t)t * entsz;
            uint32_t no, nl;
            memcpy(&no, ent, 4), memcpy(&nl, ent + 4, 4);
            if (nl == strlen(name) && memcmp(pool + no, name, nl) == 0) {
                memcpy(ent + 12, &layout, 4);
                rc = 0;
            }
        }
        uint64_t h = XXH3_64bits(sec, size);
        if (fseek(f, (long)off, SEEK_SET) || fwrite(sec, 1, size, f) != size ||
            fseek(f, (long)(sto + (uint64_t)i * esz + 24), SEEK_SET) || fwrite(&h, 8, 1, f) != 1)
            rc = -1;
        free(sec);
    }
out:
    fclose(f);
    return rc;
}

static void expect_open_error(const char *path, enum rt_err want, const char *needle)
{
    struct rt_exec *rm = (struct rt_exec *)&rm; /* poisoned: must come back NULL */
    struct rt_opts o = cpu_opts(16, 0, 1);
    qs_log_set_quiet(true);
    enum rt_err e = rt_exec_open(path, &o, &rm);
    qs_log_set_quiet(false);
    CHECK_MSG(e == want, "open %s: expected %s, got %s (%s)", path, rt_err_str(want),
              rt_err_str(e), qs_log_last());
    CHECK(rm == NULL);
    CHECK_MSG(!needle || strstr(qs_log_last(), needle), "message \"%s\" lacks \"%s\"",
              qs_log_last(), needle);
    if (e == RT_ERR_NONE)
        rt_exec_free(rm);
}

static void test_errors(void)
{
    struct syn_spec sp = {"llama", 64, 64, 2, 2, 2, 64, 50, 32, 0, 0, 0,
                          false, false, false, false, false, 10000.0};
    struct syn_model m, m2;
    syn_build(&m, &sp);
    syn_build(&m2, &sp);
    char dir[512], path[600];
    static const struct {
        enum corrupt c;
        enum rt_err want;
        const char *needle;
    } cases[] = {
        {CORRUPT_MISSING, RT_ERR_MISSING_TENSOR, "model.layers.1.post_attention_layernorm.weight"},
        {CORRUPT_WRONG_LAYOUT, RT_ERR_LAYOUT, "model.layers.0.self_attn.o_proj.scales"},
        {CORRUPT_SHAPE, RT_ERR_SHAPE, "model.norm.weight"},
        {CORRUPT_EXTRA, RT_ERR_UNSUPPORTED, "q_norm"},
        {CORRUPT_TOKEN_CONFIG, RT_ERR_CONFIG, "vocab_size_per_rank"},
        {CORRUPT_GROUP, RT_ERR_SHAPE, "model.layers.0.self_attn.o_proj.scales"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(dir, sizeof(dir), "%s/err%zu", tmp_root, i);
        CHECK_EQ_INT(write_set(&m, dir, 1, cases[i].c), 0);
        expect_open_error(dir, cases[i].want, cases[i].needle);
    }

    /* unknown layout tag (a newer converter): the reader opens it, the runtime refuses */
    snprintf(dir, sizeof(dir), "%s/err-layout", tmp_root);
    CHECK_EQ_INT(write_set(&m, dir, 1, CORRUPT_NONE), 0);
    snprintf(path, sizeof(path), "%s/rank-0-of-1.qshard", dir);
    CHECK_EQ_INT(patch_layout(path, "model.layers.1.mlp.down_proj.qweight", 77), 0);
    expect_open_error(path, RT_ERR_LAYOUT, "unknown layout tag 77");

    /* a single rank file of a TP-2 set, and a set mixing two conversions */
    snprintf(dir, sizeof(dir), "%s/err-tp2", tmp_root);
    CHECK_EQ_INT(write_set(&m, dir, 2, CORRUPT_NONE), 0);
    snprintf(path, sizeof(path), "%s/rank-1-of-2.qshard", dir);
    expect_open_error(path, RT_ERR_RANK_MISMATCH, "rank 1 of a TP-2 set");
    CHECK_EQ_INT(write_rank(&m2, path, 2, 1, CORRUPT_NONE, NULL), 0);
    expect_open_error(dir, RT_ERR_RANK_MISMATCH, NULL);
    /* same model_id but a different model's weights: the manifest digest catches it */
    CHECK_EQ_INT(write_rank(&m2, path, 2, 1, CORRUPT_NONE, m.model_id), 0);
    expect_open_error(dir, RT_ERR_RANK_MISMATCH, NULL);

    snprintf(path, sizeof(path), "%s/no-such-model", tmp_root);
    expect_open_error(path, RT_ERR_IO, "no-such-model");

    /* n_ctx beyond max_position_embeddings (64) */
    snprintf(dir, sizeof(dir), "%s/err0", tmp_root);
    CHECK_EQ_INT(write_set(&m, dir, 1, CORRUPT_NONE), 0);
    struct rt_exec *rm = NULL;
    struct rt_opts o = cpu_opts(65, 0, 1);
    qs_log_set_quiet(true);
    CHECK_EQ_INT(rt_exec_open(dir, &o, &rm), RT_ERR_CONTEXT);
    o.device = RT_DEVICE_CUDA; /* CPU-only build: a clear refusal */
    o.n_ctx = 16;
    enum rt_err ce = rt_exec_open(dir, &o, &rm);
    qs_log_set_quiet(false);
    if (!rt_cuda_available()) {
        CHECK_EQ_INT(ce, RT_ERR_NO_DEVICE);
        CHECK(strstr(qs_log_last(), "without CUDA") || strstr(qs_log_last(), "GPU"));
    }
    if (ce == RT_ERR_NONE)
        rt_exec_free(rm);
    syn_free(&m);
    syn_free(&m2);
}

// --- config parsing -----------------------------------------------------------------------------

static void test_config(void)
{
    struct syn_spec sp = {"llama", 128, 160, 2, 4, 2, 64, 101, 32, 0, 0, 0,
                          false, false, false, false, true, 10000.0};
    char base[4096];
    config_json(base, sizeof(base), &sp, 2, 1, 0);
    struct rt_config c;
    CHECK_EQ_INT(rt_config_parse(base, strlen(base), "base", &c), RT_ERR_NONE);
    CHECK(c.arch == rt_arch_find("llama"));
    CHECK_EQ_STR(c.arch->name, "llama");
    CHECK_EQ_INT(c.intermediate_size_padded, 256);
    CHECK_EQ_INT(c.intermediate_per_rank, 128);
    CHECK_EQ_INT(c.vocab_size_per_rank, 51);
    CHECK_EQ_INT(c.rank, 1);
    CHECK_EQ_INT(c.rope_scaling.type, QS_ROPE_LLAMA3);
    CHECK(c.rope_scaling.original_max_position_embeddings == 32.0f);
    CHECK_EQ_INT(c.n_eos, 1);
    CHECK_EQ_INT(c.eos_token_ids[0], 2);
    CHECK_EQ_INT(c.sliding_window, 0);

    /* one mutation per line: (find, replace, expected error, message fragment) */
    static const struct {
        const char *find, *repl;
        enum rt_err want;
        const char *needle;
    } muts[] = {
        {"\"qshard_config_version\": 1", "\"qshard_config_version\": 2", RT_ERR_UNSUPPORTED,
         "qshard_config_version"},
        {"\"architecture\": \"llama\"", "\"architecture\": \"gemma4\"", RT_ERR_UNSUPPORTED,
         "gemma4"},
        /* Gemma's keys on a LLaMA file would be silently ignored: refused */
        {"\"architecture\": \"llama\"", "\"architecture\": \"llama\", \"attn_softcap\": 50",
         RT_ERR_CONFIG, "attn_softcap is not used"},
        {"\"architecture\": \"llama\"", "\"architecture\": \"gemma2\"", RT_ERR_CONFIG,
         "embed_scale"},
        {"\"hidden_size\": 128", "\"hidden_size\": -128", RT_ERR_CONFIG, "hidden_size"},
        {"\"hidden_size\": 128", "\"hidden_size\": 12.5", RT_ERR_CONFIG, "hidden_size"},
        {"\"hidden_size\": 128", "\"hidden_size\": \"128\"", RT_ERR_CONFIG, "hidden_size"},
        {"\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3", RT_ERR_CONFIG,
         "num_key_value_heads"},
        {"\"head_dim\": 64", "\"head_dim\": 63", RT_ERR_CONFIG, "head_dim"},
        {"\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 64",
         "\"num_attention_heads\": 4096, \"num_key_value_heads\": 4096, \"head_dim\": 16384",
         RT_ERR_CONFIG, "2^24"},
        {"\"intermediate_size_padded\": 256", "\"intermediate_size_padded\": 192", RT_ERR_CONFIG,
         "intermediate"},
        {"\"heads_per_rank\": 2", "\"heads_per_rank\": 4", RT_ERR_CONFIG, "heads_per_rank"},
        {"\"kv_heads_per_rank\": 1", "\"kv_heads_per_rank\": 2", RT_ERR_CONFIG,
         "kv_heads_per_rank"},
        {"\"rank\": 1", "\"rank\": 2", RT_ERR_CONFIG, "rank"},
        {"\"w_bit\": 4", "\"w_bit\": 8", RT_ERR_UNSUPPORTED, "w_bit"},
        {"\"group_size\": 32", "\"group_size\": 40", RT_ERR_CONFIG, "group_size"},
        {"\"group_size\": 32", "\"group_size\": 0", RT_ERR_CONFIG, "group_size"},
        {"\"group_size\": 32", "\"group_size\": -2", RT_ERR_CONFIG, "group_size"},
        {"\"rope_type\": \"llama3\"", "\"rope_type\": \"yarn\"", RT_ERR_UNSUPPORTED, "yarn"},
        {"\"high_freq_factor\": 4.0", "\"high_freq_factor\": 0.5", RT_ERR_CONFIG,
         "high_freq_factor"},
        {"\"rms_norm_eps\": 1e-5", "\"rms_norm_eps\": 0", RT_ERR_CONFIG, "rms_norm_eps"},
        {"\"rms_norm_eps\": 1e-5", "\"rms_norm_eps\": 1e-50", RT_ERR_CONFIG, "rms_norm_eps"},
        {"\"eos_token_id\": [2]", "\"eos_token_id\": [2, 101]", RT_ERR_CONFIG, "eos_token_id"},
        {"\"bos_token_id\": 1, \"eos_token_id\": [2]", "\"bos_token_id\": 101", RT_ERR_CONFIG,
         "bos_token_id"}, /* found by fuzz_rt_config: bos unchecked without eos */
        {"\"num_local_experts\": 0", "\"num_local_experts\": 4", RT_ERR_CONFIG,
         "num_local_experts"},
        {"\"tp\": {", "\"tq\": {", RT_ERR_CONFIG, "\"tp\""},
        {"\"tie_word_embeddings\": false", "\"tie_word_embeddings\": 0", RT_ERR_CONFIG,
         "tie_word_embeddings"},
        {"{\"qshard", "[\"qshard", RT_ERR_CONFIG, "JSON object"},
    };
    qs_log_set_quiet(true);
    for (size_t i = 0; i < sizeof(muts) / sizeof(muts[0]); i++) {
        char buf[4200];
        const char *p = strstr(base, muts[i].find);
        CHECK_MSG(p != NULL, "mutation %zu: \"%s\" not in the base config", i, muts[i].find);
        if (!p)
            continue;
        snprintf(buf, sizeof(buf), "%.*s%s%s", (int)(p - base), base, muts[i].repl,
                 p + strlen(muts[i].find));
        enum rt_err e = rt_config_parse(buf, strlen(buf), "mut", &c);
        CHECK_MSG(e == muts[i].want, "mutation %zu (%s): expected %s, got %s (%s)", i,
                  muts[i].repl, rt_err_str(muts[i].want), rt_err_str(e), qs_log_last());
        CHECK_MSG(strstr(qs_log_last(), muts[i].needle) != NULL, "mutation %zu: \"%s\" lacks %s",
                  i, qs_log_last(), muts[i].needle);
    }
    /* truncated JSON at every length: never accepted, never a crash */
    int accepted = 0;
    for (size_t n = 0; n < strlen(base); n++)
        accepted += rt_config_parse(base, n, "trunc", &c) == RT_ERR_NONE;
    CHECK_EQ_INT(accepted, 0);
    qs_log_set_quiet(false);
    CHECK_EQ_INT(rt_err_exit_code(RT_ERR_TOKEN), 2);
    CHECK_EQ_INT(rt_err_exit_code(RT_ERR_IO), 4);
    CHECK_EQ_INT(rt_err_exit_code(RT_ERR_NO_DEVICE), 3);
}

// --- throughput on a synthetic model ------------------------------------------------------------

static void bench_cpu(void)
{
#ifdef __SANITIZE_ADDRESS__ /* timings under ASan mean nothing and cost a minute */
    if (getenv("QSHARD_BENCH_UNDER_ASAN") == NULL)
        return;
#endif
    /* a 7B-shaped layer is too slow for CI; this is a small model: H 512, 4 layers, I 1408 */
    struct syn_spec sp = {"llama", 512, 1408, 4, 8, 8, 64, 2000, 128, 0, 0, 0,
                          false, false, false, false, false, 10000.0};
    struct syn_model m;
    syn_build(&m, &sp);
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/bench", tmp_root);
    if (write_set(&m, dir, 1, CORRUPT_NONE) == 0) {
        struct rt_exec *rm = NULL;
        struct rt_opts o = cpu_opts(64, 0, 0);
        if (rt_exec_open(dir, &o, &rm) == RT_ERR_NONE) {
            int32_t tok[33];
            for (int i = 0; i < 33; i++)
                tok[i] = (int32_t)(rnd_u32() % 2000);
            float *row = xcalloc(2000, 4);
            struct timespec a, b, c2;
            clock_gettime(CLOCK_MONOTONIC, &a);
            CHECK_EQ_INT(rt_exec_forward_seq(rm, 0, tok, 32, 0, row, false), RT_ERR_NONE);
            clock_gettime(CLOCK_MONOTONIC, &b);
            for (int i = 0; i < 16; i++)
                CHECK_EQ_INT(rt_exec_forward_seq(rm, 0, tok + 32, 1, 32 + i, row, false), RT_ERR_NONE);
            clock_gettime(CLOCK_MONOTONIC, &c2);
            double tp = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
            double td = (c2.tv_sec - b.tv_sec) + (c2.tv_nsec - b.tv_nsec) * 1e-9;
            printf("  cpu bench (H 512, I 1408, 4 layers, V 2000, G 128, %ld threads): prefill "
                   "%.1f tok/s, decode %.1f tok/s\n", sysconf(_SC_NPROCESSORS_ONLN), 32 / tp,
                   16 / td);
            free(row);
            rt_exec_free(rm);
        }
    }
    syn_free(&m);
}

int main(void)
{
    int n;
    const struct t_case *cs;
    if (!t_model_begin("model", "test-model", &cs, &n))
        return 1;
    test_config();
    for (int i = 0; i < n; i++)
        test_synthetic(cs[i].label, &cs[i].sp, cs[i].tps, cs[i].n_tp);
    test_errors();
    bench_cpu();
    rm_rf(tmp_root);
    return t_done();
}
