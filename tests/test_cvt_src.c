/*
 * test_cvt_src.c - tests of the converter input side (convert/cvt_src.h): AWQ variant decoding
 * and the independent source dequantization, the fixtures, concurrency and memory. The hostile
 * containers are tests/test_cvt_hostile.c, configs and directories tests/test_cvt_config.c; the
 * builders they share are tests/t_cvt_src.h.
 *
 * Run: ./build/test_cvt_src (from the repo root)
 *
 * References we did not write: the worked example of docs/FORMATS.md 3.2 (GEMM word 0x75316420 for codes
 * 0..7), the fixture models under tests/data/models (packed by tools/fixtures from AutoAWQ's
 * formulas, with a separate unpacker check there) whose twins must decode to identical canonical
 * data, the bad-input fixtures under tests/data/bad (expected error and the strings the message
 * must name come from their INDEX.json), and real config files from HuggingFace repos
 * (tests/data/fuzz/fuzz_config/, provenance in tests/data/fuzz/README.md).
 * Hand-built inputs: every variant packed here from the format facts with random codes (whole
 * linears and slices, F16/BF16 scales, safetensors and torch zip, misaligned data), hostile
 * safetensors headers (truncation at every byte, huge lengths, offset overflow), hostile pickles
 * (forbidden GLOBALs, deep nesting, memo out of range, truncation at every byte), zips (ZIP64,
 * compressed entries, big-endian, CRC), sharded-index inconsistencies. Also: 4 threads decoding
 * one source concurrently, and file-backed RSS staying flat while a 16 MiB linear is decoded.
 *
 * `test_cvt_src --write-corpus DIR` writes the hand-built fuzz seeds (tests/data/fuzz/README.md).
 */
#include <pthread.h>

#include "t_cvt_src.h"

static void test_err_strings(void)
{
    CHECK(strstr(cvt_err_str(CVT_ERR_NONE), "CVT_ERR_NONE") != NULL);
    CHECK(strstr(cvt_err_str(CVT_ERR_PICKLE), "pickle") != NULL);
    CHECK(strstr(cvt_err_str((enum cvt_err)999), "unknown") != NULL);
    CHECK_EQ_INT(cvt_err_exit_code(CVT_ERR_NONE), 0);
    CHECK_EQ_INT(cvt_err_exit_code(CVT_ERR_IO), 4);
    CHECK_EQ_INT(cvt_err_exit_code(CVT_ERR_SHAPE), 2);
    CHECK_EQ_INT(cvt_err_exit_code(CVT_ERR_ARG), 1);
    CHECK_EQ_INT(cvt_err_exit_code(CVT_ERR_NOMEM), 3);
    CHECK_EQ_STR(cvt_dtype_str(CVT_DT_BF16), "BF16");
    CHECK_EQ_INT(cvt_dtype_size(CVT_DT_I16), 2);
}

/* The worked example of docs/FORMATS.md 3.2: codes 0..7 in columns 0..7 -> GEMM word 0x75316420. */
static void test_gemm_worked_example(void)
{
    char *dir = mkdir_tmp("kat");
    write_config(dir, 64, "gemm", NULL);
    /* K = 64, N = 64, G = 64: row 0 words hold 0x75316420, other codes 0; zeros 0; scale 1. */
    uint32_t qw[64 * 8] = {0}, qz[8] = {0};
    uint16_t sc[64];
    for (int c = 0; c < 8; c++)
        qw[c] = 0x75316420u;
    for (int n = 0; n < 64; n++)
        sc[n] = 0x3c00;
    struct st_tensor t[3] = {
        {"model.layers.0.self_attn.o_proj.qweight", "I32", 2, {64, 8}, qw, sizeof qw},
        {"model.layers.0.self_attn.o_proj.qzeros", "I32", 2, {1, 8}, qz, sizeof qz},
        {"model.layers.0.self_attn.o_proj.scales", "F16", 2, {1, 64}, sc, sizeof sc},
    };
    struct buf b = st_build(t, 3);
    write_file(dir, "model.safetensors", b.p, b.n);
    free(b.p);
    struct cvt_source *src = NULL;
    CHECK_EQ_INT(cvt_source_open(dir, &src), CVT_ERR_NONE);
    if (!src)
        return;
    struct cvt_awq_linear lin;
    CHECK_EQ_INT(cvt_awq_load(src, cvt_source_config(src), "model.layers.0.self_attn.o_proj", 64, 64, 0, 64, 0, 64, &lin),
                 CVT_ERR_NONE);
    CHECK_EQ_INT(lin.variant, CVT_VARIANT_GEMM);
    int ok = 1;
    for (int n = 0; n < 64; n++)
        ok &= lin.q[n] == n % 8;
    CHECK(ok);
    float w[64 * 64];
    CHECK_EQ_INT(cvt_awq_dequant_source(src, cvt_source_config(src), "model.layers.0.self_attn.o_proj", 64, 64, 0, 64, 0,
                                        64, w),
                 CVT_ERR_NONE);
    ok = 1;
    for (int n = 0; n < 64; n++)
        ok &= w[n] == (float)(n % 8) && w[64 + n] == 0.0f;
    CHECK(ok);
    cvt_awq_linear_free(&lin);
    cvt_source_close(src);
}

/* Every variant built from one canonical linear decodes back to it (whole and sliced), and the
 * independent dequant equals (q - z) * s. */
static void check_variant(const struct canon *c, int v, bool bf16, const char *container)
{
    char name[64];
    snprintf(name, sizeof name, "var-%d-%d-%s-%lld", v, bf16, container, (long long)c->G);
    char *dir = mkdir_tmp(name);
    const char *ver = v == CVT_VARIANT_GEMM ? "gemm" : v == CVT_VARIANT_GEMV ? "gemv" : v == CVT_VARIANT_GEMV_FAST ? "gemv_fast" : "gemv";
    write_config(dir, c->G, ver, v == CVT_VARIANT_LLMAWQ_V3 ? "llm-awq" : NULL);
    if (v == CVT_VARIANT_LLMAWQ_V3) { /* backend llm-awq */
        char cfg[1024];
        snprintf(cfg, sizeof cfg,
                 "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 256, \"intermediate_size\": 512, "
                 "\"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 64, "
                 "\"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": %lld, "
                 "\"zero_point\": true, \"version\": \"gemv\", \"backend\": \"llm-awq\"}}",
                 (long long)c->G);
        write_file(dir, "config.json", cfg, strlen(cfg));
    }
    struct st_tensor t[8];
    void *keep[8];
    int nkeep = 0;
    int nt = pack_variant(c, v, "model.layers.0.self_attn.q_proj", true, bf16, t, keep, &nkeep);
    if (strcmp(container, "bin") == 0) {
        struct zipb z = {0};
        struct pk_tensor pt[8] = {{0}};
        char keys[8][16];
        for (int i = 0; i < nt; i++) {
            snprintf(keys[i], sizeof keys[i], "%d", i);
            const char *cls = strcmp(t[i].dtype, "I32") == 0 ? "IntStorage" : strcmp(t[i].dtype, "I16") == 0 ? "ShortStorage"
                              : strcmp(t[i].dtype, "BF16") == 0 ? "BFloat16Storage" : "HalfStorage";
            int64_t es = strcmp(t[i].dtype, "I32") == 0 ? 4 : 2;
            pt[i] = (struct pk_tensor){t[i].name, cls, keys[i], (int64_t)t[i].nbytes / es, 0, t[i].nd,
                                       {t[i].shape[0], t[i].shape[1]}, {t[i].nd == 2 ? t[i].shape[1] : 1, 1}, i == 1};
        }
        struct buf pk = pk_build(pt, nt);
        zip_add(&z, "archive/data.pkl", pk.p, pk.n);
        zip_add(&z, "archive/byteorder", "little", 6);
        for (int i = 0; i < nt; i++) {
            char rec[64];
            snprintf(rec, sizeof rec, "archive/data/%d", i);
            zip_add(&z, rec, t[i].data, t[i].nbytes);
        }
        zip_add(&z, "archive/version", "3\n", 2);
        struct buf zb = zip_finish(&z);
        write_file(dir, "pytorch_model.bin", zb.p, zb.n);
        free(zb.p);
        free(pk.p);
    } else {
        struct buf b = st_build(t, nt);
        write_file(dir, "model.safetensors", b.p, b.n);
        free(b.p);
    }
    for (int i = 0; i < nkeep; i++)
        free(keep[i]);

    struct cvt_source *src = NULL;
    CHECK_MSG(cvt_source_open(dir, &src) == CVT_ERR_NONE, "%s: %s", name, qs_log_last());
    if (!src)
        return;
    const struct cvt_hf_config *cfg = cvt_source_config(src);
    const int64_t K = c->K, N = c->N, G = c->G;
    struct cvt_awq_info info;
    CHECK_EQ_INT(cvt_awq_probe(src, cfg, "model.layers.0.self_attn.q_proj", K, N, &info), CVT_ERR_NONE);
    CHECK_EQ_INT(info.variant, v);
    /* whole, then a few slices at group boundaries and odd column ranges */
    const int64_t kmid = G < K ? G : 0;
    const int64_t sl[][4] = {{0, K, 0, N}, {kmid, K, 0, N}, {0, G, 8, N - 8}, {0, K, 3, 17}, {K - G, K, N - 5, N}};
    float *w = malloc((size_t)(K * N) * sizeof *w);
    for (size_t si = 0; si < sizeof sl / sizeof sl[0]; si++) {
        const int64_t k0 = sl[si][0], k1 = sl[si][1], n0 = sl[si][2], n1 = sl[si][3], Ns = n1 - n0;
        struct cvt_awq_linear lin;
        enum cvt_err e = cvt_awq_load(src, cfg, "model.layers.0.self_attn.q_proj", K, N, k0, k1, n0, n1, &lin);
        CHECK_MSG(e == CVT_ERR_NONE, "%s slice %zu: %s", name, si, qs_log_last());
        if (e)
            continue;
        int okq = 1, okz = 1, oks = 1, okb = 1, okd = 1;
        for (int64_t k = k0; k < k1; k++)
            for (int64_t n = n0; n < n1; n++)
                okq &= lin.q[(k - k0) * Ns + n - n0] == c->q[k * N + n];
        for (int64_t g = k0 / G; g < k1 / G; g++)
            for (int64_t n = n0; n < n1; n++) {
                okz &= lin.z[(g - k0 / G) * Ns + n - n0] == c->z[g * N + n];
                oks &= lin.s[(g - k0 / G) * Ns + n - n0] == c->s[g * N + n];
            }
        for (int64_t n = n0; n < n1; n++)
            okb &= lin.bias && lin.bias[n - n0] == h2f(c->bias[n]);
        CHECK_MSG(okq && okz && oks && okb, "%s slice %zu: q %d z %d s %d bias %d", name, si, okq, okz, oks, okb);
        e = cvt_awq_dequant_source(src, cfg, "model.layers.0.self_attn.q_proj", K, N, k0, k1, n0, n1, w);
        CHECK_EQ_INT(e, CVT_ERR_NONE);
        for (int64_t k = k0; k < k1 && !e; k++)
            for (int64_t n = n0; n < n1; n++) {
                int64_t g = k / G;
                float ref = (float)((int)c->q[k * N + n] - (int)c->z[g * N + n]) * h2f(c->s[g * N + n]);
                okd &= memcmp(&w[(k - k0) * Ns + n - n0], &ref, 4) == 0;
            }
        CHECK_MSG(okd, "%s slice %zu: source dequant differs from (q - z) * s", name, si);
        CHECK_EQ_INT(lin.K, k1 - k0);
        CHECK_EQ_INT(lin.N, Ns);
        cvt_awq_linear_free(&lin);
    }
    /* bad slices */
    struct cvt_awq_linear lin;
    qs_log_set_quiet(true);
    CHECK_EQ_INT(cvt_awq_load(src, cfg, "model.layers.0.self_attn.q_proj", K, N, 1, K, 0, N, &lin), CVT_ERR_ARG);
    CHECK(lin.q == NULL);
    CHECK_EQ_INT(cvt_awq_load(src, cfg, "model.layers.0.self_attn.q_proj", K, N, 0, K, 0, N + 1, &lin), CVT_ERR_ARG);
    /* expected shapes that disagree with the tensors (config vs tensors) */
    CHECK_EQ_INT(cvt_awq_load(src, cfg, "model.layers.0.self_attn.q_proj", K, N + 64, 0, K, 0, N, &lin), CVT_ERR_SHAPE);
    CHECK(strstr(qs_log_last(), "model.layers.0.self_attn.q_proj") != NULL);
    CHECK_EQ_INT(cvt_awq_probe(src, cfg, "model.layers.0.self_attn.k_proj", K, N, &info), CVT_ERR_MISSING_TENSOR);
    qs_log_set_quiet(false);
    free(w);
    cvt_source_close(src);
}

/* docs/FORMATS.md P19: data region starting at an offset = 3 (mod 8) and an odd-length F16 tensor in
 * front of the I32 qweight: every tensor is misaligned; decoding (under UBSan) must not care. */
static void test_unaligned(void)
{
    struct canon c;
    canon_rand(&c, 128, 64, 64);
    struct st_tensor t[8];
    void *keep[8];
    int nkeep = 0;
    static const uint16_t odd[3] = {0x3c00, 0x4000, 0x4200};
    t[0] = (struct st_tensor){"model.norm.weight", "F16", 1, {3}, odd, sizeof odd};
    int nt = 1 + pack_variant(&c, CVT_VARIANT_GEMM, "model.layers.0.mlp.down_proj", true, false, t + 1, keep, &nkeep);
    char dir[512];
    snprintf(dir, sizeof dir, "%s", mkdir_tmp("unaligned"));
    write_config(dir, 64, "gemm", NULL);
    st_no_pad = true;
    struct buf b = st_build(t, nt);
    st_no_pad = false;
    write_file(dir, "model.safetensors", b.p, b.n);
    free(b.p);
    struct cvt_source *src = NULL;
    CHECK_EQ_INT(cvt_source_open(dir, &src), CVT_ERR_NONE);
    if (src) {
        const struct cvt_src_tensor *qw = cvt_source_find(src, "model.layers.0.mlp.down_proj.qweight");
        CHECK(qw && qw->offset % 4 != 0);
        struct cvt_awq_linear lin;
        CHECK_EQ_INT(cvt_awq_load(src, cvt_source_config(src), "model.layers.0.mlp.down_proj", 128, 64, 0, 128, 0, 64, &lin),
                     CVT_ERR_NONE);
        CHECK(lin.q && memcmp(lin.q, c.q, 128 * 64) == 0 && memcmp(lin.s, c.s, 2 * 64 * 2) == 0);
        cvt_awq_linear_free(&lin);
        float f[3];
        CHECK_EQ_INT(cvt_source_read_f32(src, cvt_source_find(src, "model.norm.weight"), 0, 3, f), CVT_ERR_NONE);
        CHECK(f[0] == 1.0f && f[2] == 3.0f);
        cvt_source_close(src);
    }
    for (int i = 0; i < nkeep; i++)
        free(keep[i]);
    canon_free(&c);
}

static void test_variants(void)
{
    const int64_t shapes[][3] = {{256, 128, 64}, {384, 64, 128}, {128, 128, 32}, {256, 256, 256}, {1152, 136, 128}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        struct canon c;
        canon_rand(&c, shapes[si][0], shapes[si][1], shapes[si][2]);
        check_variant(&c, CVT_VARIANT_GEMM, false, "st");
        check_variant(&c, CVT_VARIANT_GEMV, false, "st");
        check_variant(&c, CVT_VARIANT_GEMV_FAST, false, "st");
        check_variant(&c, CVT_VARIANT_LLMAWQ_V3, false, "st");
        check_variant(&c, CVT_VARIANT_LLMAWQ_V3, true, "st");
        check_variant(&c, CVT_VARIANT_GEMM, false, "bin");
        check_variant(&c, CVT_VARIANT_GEMM, true, "st");
        check_variant(&c, CVT_VARIANT_LLMAWQ_V3, true, "bin");
        canon_free(&c);
    }
}

/* Variant / config disagreement, missing tensors, bad scales. */
static void test_awq_errors(void)
{
    struct canon c;
    canon_rand(&c, 128, 128, 64);
    char *dir = mkdir_tmp("awq-err");
    char d2[512];
    snprintf(d2, sizeof d2, "%s", dir);
    struct st_tensor t[8];
    void *keep[8];
    int nkeep = 0;
    /* GEMV tensors (square layer: qweight shapes identical to GEMM) under a gemm config. */
    write_config(d2, 64, "gemm", NULL);
    int nt = pack_variant(&c, CVT_VARIANT_GEMV, "model.layers.0.self_attn.q_proj", false, false, t, keep, &nkeep);
    struct buf b = st_build(t, nt);
    write_file(d2, "model.safetensors", b.p, b.n);
    free(b.p);
    struct cvt_source *src = NULL;
    CHECK_EQ_INT(cvt_source_open(d2, &src), CVT_ERR_NONE);
    struct cvt_awq_linear lin;
    qs_log_set_quiet(true);
    if (src) {
        CHECK_EQ_INT(cvt_awq_load(src, cvt_source_config(src), "model.layers.0.self_attn.q_proj", 128, 128, 0, 128, 0, 128, &lin),
                     CVT_ERR_VARIANT);
        CHECK(strstr(qs_log_last(), "gemv") && strstr(qs_log_last(), "gemm"));
        cvt_source_close(src);
    }
    /* NaN scale at [1][5]: GEMV scales are [N][8Wz] -> element [5][1]. */
    write_config(d2, 64, "gemv", NULL);
    const int64_t sw = 8 * zw(128, 64); /* GEMV scales are [N, 8 Wz] */
    ((uint16_t *)(uintptr_t)t[2].data)[5 * sw + 1] = 0x7e00;
    b = st_build(t, nt);
    write_file(d2, "model.safetensors", b.p, b.n);
    free(b.p);
    CHECK_EQ_INT(cvt_source_open(d2, &src), CVT_ERR_NONE);
    if (src) {
        CHECK_EQ_INT(cvt_awq_load(src, cvt_source_config(src), "model.layers.0.self_attn.q_proj", 128, 128, 0, 128, 0, 128, &lin),
                     CVT_ERR_NAN);
        CHECK(strstr(qs_log_last(), "model.layers.0.self_attn.q_proj.scales") && strstr(qs_log_last(), "[5, 1]"));
        /* the slice that does not touch it decodes */
        CHECK_EQ_INT(cvt_awq_load(src, cvt_source_config(src), "model.layers.0.self_attn.q_proj", 128, 128, 0, 64, 0, 128, &lin),
                     CVT_ERR_NONE);
        cvt_awq_linear_free(&lin);
        cvt_source_close(src);
    }
    /* scale 0 (non-positive) */
    ((uint16_t *)(uintptr_t)t[2].data)[5 * sw + 1] = 0x0000;
    b = st_build(t, nt);
    write_file(d2, "model.safetensors", b.p, b.n);
    free(b.p);
    CHECK_EQ_INT(cvt_source_open(d2, &src), CVT_ERR_NONE);
    if (src) {
        CHECK_EQ_INT(cvt_awq_dequant_source(src, cvt_source_config(src), "model.layers.0.self_attn.q_proj", 128, 128, 0, 128,
                                            0, 128, (float[128 * 128]){0}),
                     CVT_ERR_NAN);
        cvt_source_close(src);
    }
    /* missing qzeros / scales */
    struct st_tensor t2[2] = {t[0], t[2]};
    b = st_build(t2, 2);
    write_file(d2, "model.safetensors", b.p, b.n);
    free(b.p);
    CHECK_EQ_INT(cvt_source_open(d2, &src), CVT_ERR_NONE);
    if (src) {
        CHECK_EQ_INT(cvt_awq_load(src, cvt_source_config(src), "model.layers.0.self_attn.q_proj", 128, 128, 0, 128, 0, 128, &lin),
                     CVT_ERR_MISSING_TENSOR);
        CHECK(strstr(qs_log_last(), "model.layers.0.self_attn.q_proj.qzeros") != NULL);
        cvt_source_close(src);
    }
    t2[1] = t[1];
    b = st_build(t2, 2);
    write_file(d2, "model.safetensors", b.p, b.n);
    free(b.p);
    CHECK_EQ_INT(cvt_source_open(d2, &src), CVT_ERR_NONE);
    if (src) {
        CHECK_EQ_INT(cvt_awq_probe(src, cvt_source_config(src), "model.layers.0.self_attn.q_proj", 128, 128,
                                   &(struct cvt_awq_info){0}),
                     CVT_ERR_MISSING_TENSOR);
        CHECK(strstr(qs_log_last(), "model.layers.0.self_attn.q_proj.scales") != NULL);
        cvt_source_close(src);
    }
    /* group size that does not divide K */
    write_config(d2, 96, "gemv", NULL);
    b = st_build(t, nt);
    write_file(d2, "model.safetensors", b.p, b.n);
    free(b.p);
    CHECK_EQ_INT(cvt_source_open(d2, &src), CVT_ERR_NONE);
    if (src) {
        CHECK_EQ_INT(cvt_awq_probe(src, cvt_source_config(src), "model.layers.0.self_attn.q_proj", 128, 128,
                                   &(struct cvt_awq_info){0}),
                     CVT_ERR_SHAPE);
        cvt_source_close(src);
    }
    for (int i = 0; i < nkeep; i++)
        free(keep[i]);
    nkeep = 0;
    /* GEMVFast zeros that are not -(s*z) for an integer z */
    write_config(d2, 64, "gemv_fast", NULL);
    nt = pack_variant(&c, CVT_VARIANT_GEMV_FAST, "model.layers.0.self_attn.q_proj", false, false, t, keep, &nkeep);
    ((uint16_t *)(uintptr_t)t[1].data)[3] = f2h_exact(-h2f(c.s[3]) * 2.5f);
    b = st_build(t, nt);
    write_file(d2, "model.safetensors", b.p, b.n);
    free(b.p);
    CHECK_EQ_INT(cvt_source_open(d2, &src), CVT_ERR_NONE);
    if (src) {
        CHECK_EQ_INT(cvt_awq_load(src, cvt_source_config(src), "model.layers.0.self_attn.q_proj", 128, 128, 0, 128, 0, 128, &lin),
                     CVT_ERR_RANGE);
        CHECK(strstr(qs_log_last(), "model.layers.0.self_attn.q_proj.qzeros") != NULL);
        cvt_source_close(src);
    }
    for (int i = 0; i < nkeep; i++)
        free(keep[i]);
    nkeep = 0;
    /* GEMM with BF16 scales: one of them (7.0e4) has no fp16 value (docs/FORMATS.md P15) */
    write_config(d2, 64, "gemm", NULL);
    nt = pack_variant(&c, CVT_VARIANT_GEMM, "model.layers.0.self_attn.q_proj", false, true, t, keep, &nkeep);
    ((uint16_t *)(uintptr_t)t[2].data)[130] = 0x4789; /* bf16 70144 */
    b = st_build(t, nt);
    write_file(d2, "model.safetensors", b.p, b.n);
    free(b.p);
    CHECK_EQ_INT(cvt_source_open(d2, &src), CVT_ERR_NONE);
    if (src) {
        CHECK_EQ_INT(cvt_awq_load(src, cvt_source_config(src), "model.layers.0.self_attn.q_proj", 128, 128, 0, 128, 0, 128, &lin),
                     CVT_ERR_RANGE);
        CHECK(strstr(qs_log_last(), "[1, 2]") != NULL); /* element 130 of [2, 128] */
        cvt_source_close(src);
    }
    qs_log_set_quiet(false);
    for (int i = 0; i < nkeep; i++)
        free(keep[i]);
    canon_free(&c);
}

/* GEMV with a group size that does not start groups on packed words: refused by name. */
static void test_awq_gemv_odd_group(void)
{
    char *dir = mkdir_tmp("awq-err-g132");
    struct st_tensor t[8];
    void *keep[8];
    int nkeep = 0, nt;
    struct buf b;
    struct cvt_source *src = NULL;
    struct cvt_awq_linear lin;
    struct canon c2;
    canon_rand(&c2, 1056, 64, 132);
    write_config(dir, 132, "gemv", NULL);
    nt = pack_variant(&c2, CVT_VARIANT_GEMV, "model.layers.0.self_attn.q_proj", false, false, t, keep, &nkeep);
    b = st_build(t, nt);
    write_file(dir, "model.safetensors", b.p, b.n);
    free(b.p);
    qs_log_set_quiet(true);
    CHECK_EQ_INT(cvt_source_open(dir, &src), CVT_ERR_NONE);
    if (src) {
        CHECK_EQ_INT(cvt_awq_load(src, cvt_source_config(src), "model.layers.0.self_attn.q_proj", 1056, 64, 132, 1056, 0,
                                  64, &lin),
                     CVT_ERR_UNSUPPORTED);
        CHECK(strstr(qs_log_last(), "q_proj") != NULL);
        cvt_source_close(src);
    }
    qs_log_set_quiet(false);
    for (int i = 0; i < nkeep; i++)
        free(keep[i]);
    canon_free(&c2);
}

/* --- fixtures ----------------------------------------------------------------------------------------- */

/* Expected (K, N) of a linear from its name and the config (DESIGN.md section 5 / docs/FORMATS.md section 10). */
static bool linear_dims(const struct cvt_hf_config *c, const char *prefix, int64_t *K, int64_t *N)
{
    const int64_t H = c->hidden_size, I = c->intermediate_size, q = c->num_attention_heads * c->head_dim,
                  kv = c->num_key_value_heads * c->head_dim;
    static const struct {
        const char *suf;
        int k, n; /* 0 H, 1 I, 2 q, 3 kv, 4 q + 2 kv (fused qkv), 5 2 I (fused gate_up) */
    } map[] = {{".q_proj", 0, 2}, {".k_proj", 0, 3}, {".v_proj", 0, 3}, {".o_proj", 2, 0}, {".gate_proj", 0, 1},
               {".up_proj", 0, 1}, {".down_proj", 1, 0}, {".w1", 0, 1}, {".w3", 0, 1}, {".w2", 1, 0},
               {".qkv_proj", 0, 4}, {".gate_up_proj", 0, 5},                        /* Phi-3 */
               {".query_key_value", 0, 4}, {".dense", 2, 0}, {".dense_h_to_4h", 0, 1}, /* Falcon */
               {".dense_4h_to_h", 1, 0}, {".Wqkv", 0, 4}, {".out_proj", 2, 0}};         /* MPT */
    const int64_t v[6] = {H, I, q, kv, q + 2 * kv, 2 * I};
    size_t pl = strlen(prefix);
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        size_t sl = strlen(map[i].suf);
        if (pl > sl && strcmp(prefix + pl - sl, map[i].suf) == 0) {
            *K = v[map[i].k];
            *N = v[map[i].n];
            return true;
        }
    }
    return false;
}

/* Decode every quantized linear and read every float tensor; returns the first error (all
 * messages appended to msgs). With `out`, the decoded linears are kept for twin comparison. */
struct decoded {
    char                  name[128];
    struct cvt_awq_linear lin;
};

static enum cvt_err decode_all(const char *dir, char *msgs, size_t cap, struct decoded *out, int *n_out, int max_out,
                               int *n_checked)
{
    struct cvt_source *src = NULL;
    enum cvt_err first = cvt_source_open(dir, &src);
    size_t ml = 0;
    if (first) {
        snprintf(msgs, cap, "%s", qs_log_last());
        return first;
    }
    const struct cvt_hf_config *cfg = cvt_source_config(src);
    if (n_out)
        *n_out = 0;
    for (size_t i = 0; i < cvt_source_n_tensors(src); i++) {
        const struct cvt_src_tensor *t = cvt_source_tensor(src, i);
        enum cvt_err e = CVT_ERR_NONE;
        size_t nl = strlen(t->name);
        /* AWQ / GPTQ `.qweight`, compressed-tensors `.weight_packed` (docs/FORMATS.md 15.2) */
        size_t sl = nl > 8 && strcmp(t->name + nl - 8, ".qweight") == 0          ? 8
                    : nl > 14 && strcmp(t->name + nl - 14, ".weight_packed") == 0 ? 14
                                                                                  : 0;
        if (sl) {
            char prefix[128];
            snprintf(prefix, sizeof prefix, "%.*s", (int)(nl - sl), t->name);
            int64_t K, N;
            if (!linear_dims(cfg, prefix, &K, &N))
                continue;
            struct cvt_awq_linear lin;
            e = cvt_awq_load(src, cfg, prefix, K, N, 0, K, 0, N, &lin);
            if (!e) {
                /* decode == independent source dequant, bitwise */
                float *w = malloc((size_t)(K * N) * sizeof *w);
                e = cvt_awq_dequant_source(src, cfg, prefix, K, N, 0, K, 0, N, w);
                int okd = 1;
                for (int64_t k = 0; k < K && !e; k++)
                    for (int64_t n = 0; n < N; n++) {
                        int64_t g = k / lin.G;
                        float r = (float)((int)lin.q[k * N + n] - (int)lin.z[g * N + n]) * h2f(lin.s[g * N + n]);
                        okd &= memcmp(&r, &w[k * N + n], 4) == 0;
                    }
                CHECK_MSG(okd, "%s: %s: decode and source dequant differ", dir, prefix);
                free(w);
                (*n_checked)++;
                if (out && *n_out < max_out) {
                    snprintf(out[*n_out].name, sizeof out[*n_out].name, "%s", prefix);
                    out[(*n_out)++].lin = lin;
                } else {
                    cvt_awq_linear_free(&lin);
                }
            }
        } else if (t->dtype == CVT_DT_F16 || t->dtype == CVT_DT_BF16 || t->dtype == CVT_DT_F32) {
            if ((nl > 7 && strcmp(t->name + nl - 7, ".scales") == 0) || (nl > 5 && strcmp(t->name + nl - 5, ".bias") == 0) ||
                strstr(t->name, "zeros") || (nl > 13 && strcmp(t->name + nl - 13, ".weight_scale") == 0))
                continue; /* part of a linear */
            float *f = malloc((size_t)t->numel * sizeof *f + 4);
            e = cvt_source_read_f32(src, t, 0, (uint64_t)t->numel, f);
            free(f);
        }
        if (e) {
            if (!first)
                first = e;
            ml += (size_t)snprintf(msgs + ml, ml < cap ? cap - ml : 0, "%s\n", qs_log_last());
            if (ml >= cap)
                ml = cap - 1;
        }
    }
    cvt_source_close(src);
    return first;
}

static enum cvt_err category_err(const char *cat)
{
    static const struct {
        const char  *cat;
        enum cvt_err e;
    } m[] = {{"missing_shard", CVT_ERR_INDEX},     {"index_mismatch", CVT_ERR_INDEX},     {"truncated", CVT_ERR_SAFETENSORS},
             {"bad_header", CVT_ERR_SAFETENSORS},  {"bad_offsets", CVT_ERR_SAFETENSORS},  {"shape_mismatch", CVT_ERR_SHAPE},
             {"missing_tensor", CVT_ERR_MISSING_TENSOR}, {"unsupported_quant", CVT_ERR_UNSUPPORTED},
             {"bad_scale", CVT_ERR_NAN},           {"wrong_dtype", CVT_ERR_DTYPE},        {"bad_name", CVT_ERR_SAFETENSORS},
             {"forbidden_pickle", CVT_ERR_PICKLE}, {"config_mismatch", CVT_ERR_CONFIG},
             {"out_of_range", CVT_ERR_RANGE},      {"unsupported_config", CVT_ERR_UNSUPPORTED}};
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
        if (strcmp(m[i].cat, cat) == 0)
            return m[i].e;
    return CVT_ERR_NONE;
}

static void test_bad_fixtures(void)
{
    size_t n;
    char *text = t_slurp("tests/data/bad/INDEX.json", &n);
    if (!text) {
        printf("test_cvt_src: tests/data/bad/INDEX.json absent, bad fixtures skipped\n");
        return;
    }
    cJSON *root = cJSON_Parse(text);
    CHECK(root != NULL);
    const cJSON *cases = cJSON_GetObjectItem(root, "cases"), *ctl = cJSON_GetObjectItem(root, "control");
    char *msgs = malloc(65536);
    int checked = 0, n_cases = 0;
    qs_log_set_quiet(true);
    if (ctl) {
        char dir[512];
        snprintf(dir, sizeof dir, "tests/data/%s", cJSON_GetObjectItem(ctl, "path")->valuestring);
        CHECK_MSG(decode_all(dir, msgs, 65536, NULL, NULL, 0, &checked) == CVT_ERR_NONE, "control %s: %s", dir, msgs);
    }
    for (const cJSON *c = cases ? cases->child : NULL; c; c = c->next) {
        const char *cat = cJSON_GetObjectItem(c, "category")->valuestring;
        const char *name = cJSON_GetObjectItem(c, "case")->valuestring;
        char dir[512];
        snprintf(dir, sizeof dir, "tests/data/%s", cJSON_GetObjectItem(c, "path")->valuestring);
        enum cvt_err want = category_err(cat);
        /* A missing non-quantized tensor and unknown tensors are the converter core's ledger. */
        const cJSON *should = cJSON_GetObjectItem(c, "message_should_name");
        /* So is a compressed-tensors "ignore" entry naming a quantized module (cvt_run.c). */
        bool names_ignore = false;
        for (const cJSON *s = should ? should->child : NULL; s; s = s->next)
            names_ignore |= cJSON_IsString(s) && strcmp(s->valuestring, "ignore") == 0;
        /* and a float tensor of the wrong shape (Qwen3's q_norm): the plan knows its shape */
        bool ledger = strcmp(cat, "unknown_tensor") == 0 ||
                      ((strcmp(cat, "missing_tensor") == 0 || strcmp(cat, "shape_mismatch") == 0) &&
                       should && should->child && !strstr(should->child->valuestring, "proj")) ||
                      (strcmp(cat, "config_mismatch") == 0 && names_ignore);
        msgs[0] = 0;
        enum cvt_err got = decode_all(dir, msgs, 65536, NULL, NULL, 0, &checked);
        n_cases++;
        if (ledger) {
            CHECK_MSG(got == CVT_ERR_NONE, "bad case %s (core ledger's): input side says %s", name, msgs);
            continue;
        }
        CHECK_MSG(want != CVT_ERR_NONE && got == want, "bad case %s (%s): got %s, want %s: %s", name, cat, cvt_err_str(got),
                  cvt_err_str(want), msgs);
        for (const cJSON *s = should ? should->child : NULL; s; s = s->next)
            CHECK_MSG(strstr(msgs, s->valuestring) != NULL, "bad case %s: message lacks '%s': %s", name, s->valuestring, msgs);
        CHECK_EQ_INT(cvt_err_exit_code(got), cJSON_GetObjectItem(c, "expect_exit")->valueint);
    }
    qs_log_set_quiet(false);
    CHECK(n_cases >= 10);
    free(msgs);
    cJSON_Delete(root);
    free(text);
}

static void test_model_fixtures(void)
{
    size_t n;
    char *text = t_slurp("tests/data/models/INDEX.json", &n);
    if (!text) {
        printf("test_cvt_src: tests/data/models/INDEX.json absent, fixture models skipped\n");
        return;
    }
    cJSON *root = cJSON_Parse(text);
    const cJSON *models = cJSON_GetObjectItem(root, "models");
    enum { MAXL = 512 };
    struct decoded *ref = calloc(MAXL, sizeof *ref), *cur = calloc(MAXL, sizeof *cur);
    int n_ref = 0, checked = 0, twins = 0;
    char ref_group[64] = "", ref_name[64] = "";
    char *msgs = malloc(65536);
    qs_log_set_quiet(true);
    for (const cJSON *m = models ? models->child : NULL; m; m = m->next) {
        char dir[512];
        const char *name = cJSON_GetObjectItem(m, "name")->valuestring;
        snprintf(dir, sizeof dir, "tests/data/%s", cJSON_GetObjectItem(m, "path")->valuestring);
        const cJSON *tg = cJSON_GetObjectItem(m, "twin_group");
        int n_cur = 0;
        msgs[0] = 0;
        enum cvt_err e = decode_all(dir, msgs, 65536, cur, &n_cur, MAXL, &checked);
        CHECK_MSG(e == CVT_ERR_NONE, "fixture %s: %s", name, msgs);
        /* container and variant as INDEX.json says */
        struct cvt_source *src = NULL;
        if (cvt_source_open(dir, &src) == CVT_ERR_NONE) {
            const char *want_c = cJSON_GetObjectItem(m, "container")->valuestring;
            const char *got_c = cvt_container_str(cvt_source_container(src));
            CHECK_MSG(strncmp(want_c, got_c, strlen(got_c)) == 0, "fixture %s: container %s, INDEX says %s", name, got_c, want_c);
            const char *want_v = cJSON_GetObjectItem(m, "variant")->valuestring;
            enum cvt_variant wv = strcmp(want_v, "gemv") == 0        ? CVT_VARIANT_GEMV
                                  : strcmp(want_v, "gemv_fast") == 0 ? CVT_VARIANT_GEMV_FAST
                                  : strcmp(want_v, "llmawq-gen3") == 0 ? CVT_VARIANT_LLMAWQ_V3
                                  : strncmp(want_v, "gptq", 4) == 0    ? CVT_VARIANT_GPTQ /* gptq, gptq_v2 */
                                  : strcmp(want_v, "compressed-tensors") == 0 ? CVT_VARIANT_CT_PACKED
                                                                       : CVT_VARIANT_GEMM; /* gemm, awq-sym */
            for (int i = 0; i < n_cur; i++)
                CHECK_MSG(cur[i].lin.variant == wv, "fixture %s: %s decoded as %s, INDEX says %s", name, cur[i].name,
                          cvt_variant_str(cur[i].lin.variant), want_v);
            CHECK_EQ_INT(cvt_source_config(src)->quant.group_size, cJSON_GetObjectItem(m, "group_size")->valueint);
            cvt_source_close(src);
        }
        CHECK_MSG(n_cur > 0, "fixture %s: no quantized linears decoded", name);
        if (cJSON_IsString(tg)) {
            if (strcmp(tg->valuestring, ref_group) != 0) { /* first of its group: the reference */
                for (int i = 0; i < n_ref; i++)
                    cvt_awq_linear_free(&ref[i].lin);
                memcpy(ref, cur, sizeof *cur * (size_t)n_cur);
                n_ref = n_cur;
                n_cur = 0;
                snprintf(ref_group, sizeof ref_group, "%s", tg->valuestring);
                snprintf(ref_name, sizeof ref_name, "%s", name);
            } else {
                twins++;
                CHECK_MSG(n_cur == n_ref, "twin %s: %d linears, %s has %d", name, n_cur, ref_name, n_ref);
                for (int i = 0; i < n_cur; i++) {
                    const struct decoded *r = NULL;
                    for (int j = 0; j < n_ref && !r; j++)
                        if (strcmp(ref[j].name, cur[i].name) == 0)
                            r = &ref[j];
                    const struct cvt_awq_linear *a = &cur[i].lin;
                    bool same = r && a->K == r->lin.K && a->N == r->lin.N && a->G == r->lin.G &&
                                memcmp(a->q, r->lin.q, (size_t)(a->K * a->N)) == 0 &&
                                memcmp(a->z, r->lin.z, (size_t)(a->K / a->G * a->N)) == 0 &&
                                memcmp(a->s, r->lin.s, (size_t)(a->K / a->G * a->N) * 2) == 0 &&
                                (!a->bias) == (!r->lin.bias) &&
                                (!a->bias || memcmp(a->bias, r->lin.bias, (size_t)a->N * 4) == 0);
                    CHECK_MSG(same, "twin %s: linear %s differs from %s", name, cur[i].name, ref_name);
                }
            }
        }
        for (int i = 0; i < n_cur; i++)
            cvt_awq_linear_free(&cur[i].lin);
    }
    qs_log_set_quiet(false);
    CHECK(twins >= 3);
    CHECK(checked >= 50);
    for (int i = 0; i < n_ref; i++)
        cvt_awq_linear_free(&ref[i].lin);
    free(ref);
    free(cur);
    free(msgs);
    cJSON_Delete(root);
    free(text);
}

/* Concurrent reads: 4 threads decode every linear of one source (different start points) and
 * read every float tensor; each result must equal the single-threaded decode. */
struct thr_arg {
    const struct cvt_source *src;
    int                      id, bad;
    const struct decoded    *ref;
    int                      n_ref;
};

static void *thr_main(void *p)
{
    struct thr_arg *a = p;
    const struct cvt_hf_config *cfg = cvt_source_config(a->src);
    for (int r = 0; r < 3; r++)
        for (int j = 0; j < a->n_ref; j++) {
            const struct decoded *d = &a->ref[(j + a->id * 5) % a->n_ref];
            struct cvt_awq_linear lin;
            int64_t K, N;
            if (!linear_dims(cfg, d->name, &K, &N) || cvt_awq_load(a->src, cfg, d->name, K, N, 0, K, 0, N, &lin)) {
                a->bad++;
                continue;
            }
            a->bad += memcmp(lin.q, d->lin.q, (size_t)(K * N)) != 0 || memcmp(lin.s, d->lin.s, (size_t)(K / lin.G * N) * 2) != 0;
            cvt_awq_linear_free(&lin);
        }
    return NULL;
}

static void test_threads(void)
{
    const char *dir = "tests/data/models/llama-gqa-gemm";
    struct cvt_source *src = NULL;
    qs_log_set_quiet(true);
    if (cvt_source_open(dir, &src) != CVT_ERR_NONE) {
        qs_log_set_quiet(false);
        printf("test_cvt_src: %s absent, thread test skipped\n", dir);
        return;
    }
    enum { MAXL = 64 };
    struct decoded *ref = calloc(MAXL, sizeof *ref);
    int n_ref = 0, checked = 0;
    char msgs[4096];
    CHECK_EQ_INT(decode_all(dir, msgs, sizeof msgs, ref, &n_ref, MAXL, &checked), CVT_ERR_NONE);
    qs_log_set_quiet(false);
    pthread_t th[4];
    struct thr_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (struct thr_arg){src, i, 0, ref, n_ref};
        pthread_create(&th[i], NULL, thr_main, &args[i]);
    }
    int bad = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        bad += args[i].bad;
    }
    CHECK(n_ref > 10);
    CHECK_EQ_INT(bad, 0);
    for (int i = 0; i < n_ref; i++)
        cvt_awq_linear_free(&ref[i].lin);
    free(ref);
    cvt_source_close(src);
}

/* Bounded RSS (issue 4: peak RSS <= 512 MiB for any model): decoding must not leave the mapped
 * input pages resident. A 16 MiB GEMM linear is decoded in 8 k-blocks; the file-backed RSS may
 * not grow by more than 2 MiB. */
static long rss_file_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "RssFile:", 8) == 0)
            v = atol(line + 8);
    if (f)
        fclose(f);
    return v;
}

static void test_rss(void)
{
    struct canon c;
    canon_rand(&c, 4096, 8192, 128);
    struct st_tensor t[8];
    void *keep[8];
    int nkeep = 0;
    int nt = pack_variant(&c, CVT_VARIANT_GEMM, "model.layers.0.mlp.up_proj", false, false, t, keep, &nkeep);
    char dir[512];
    snprintf(dir, sizeof dir, "%s", mkdir_tmp("rss"));
    write_config(dir, 128, "gemm", NULL);
    struct buf b = st_build(t, nt);
    write_file(dir, "model.safetensors", b.p, b.n);
    free(b.p);
    for (int i = 0; i < nkeep; i++)
        free(keep[i]);
    struct cvt_source *src = NULL;
    qs_log_set_quiet(true);
    CHECK_EQ_INT(cvt_source_open(dir, &src), CVT_ERR_NONE);
    qs_log_set_quiet(false);
    if (src) {
        long before = rss_file_kb(), worst = 0;
        int ok = 1;
        for (int64_t k0 = 0; k0 < 4096; k0 += 512) {
            struct cvt_awq_linear lin;
            CHECK_EQ_INT(cvt_awq_load(src, cvt_source_config(src), "model.layers.0.mlp.up_proj", 4096, 8192, k0, k0 + 512, 0,
                                      8192, &lin),
                         CVT_ERR_NONE);
            if (lin.q)
                ok &= memcmp(lin.q, c.q + k0 * 8192, (size_t)512 * 8192) == 0;
            cvt_awq_linear_free(&lin);
            long now = rss_file_kb() - before;
            worst = now > worst ? now : worst;
        }
        CHECK(ok);
        CHECK_MSG(before >= 0 && worst < 2048, "file-backed RSS grew by %ld kB while decoding a %d kB tensor", worst,
                  (int)(cvt_source_total_bytes(src) / 1024));
        cvt_source_close(src);
    }
    canon_free(&c);
}

/* --write-corpus DIR: seed inputs for tests/fuzz_{safetensors,pickle}.c built by the helpers above. */
static int write_corpus(const char *dir)
{
    char d[512];
    snprintf(d, sizeof d, "%s/fuzz_safetensors", dir);
    mkdir(d, 0755);
    struct buf b = small_st();
    write_file(d, "small-two-tensors.safetensors", b.p, b.n);
    free(b.p);
    struct canon c;
    canon_rand(&c, 128, 64, 64);
    struct st_tensor t[8];
    void *keep[8];
    int nkeep = 0;
    int nt = pack_variant(&c, CVT_VARIANT_GEMV_FAST, "model.layers.0.mlp.down_proj", true, false, t, keep, &nkeep);
    b = st_build(t, nt);
    write_file(d, "gemv-fast-linear.safetensors", b.p, b.n);
    free(b.p);
    snprintf(d, sizeof d, "%s/fuzz_pickle", dir);
    mkdir(d, 0755);
    b = tiny_zip("little", false);
    write_file(d, "tiny-archive.bin", b.p, b.n);
    free(b.p);
    struct pk_tensor pt[8] = {{0}};
    char keys[8][16];
    for (int i = 0; i < nt; i++) {
        snprintf(keys[i], sizeof keys[i], "%d", i);
        int64_t es = strcmp(t[i].dtype, "I32") == 0 ? 4 : 2;
        pt[i] = (struct pk_tensor){t[i].name, strcmp(t[i].dtype, "I16") == 0 ? "ShortStorage" : "HalfStorage", keys[i],
                                   (int64_t)t[i].nbytes / es, 0, t[i].nd, {t[i].shape[0], t[i].shape[1]},
                                   {t[i].nd == 2 ? t[i].shape[1] : 1, 1}, i == 2};
    }
    struct buf pk = pk_build(pt, nt);
    write_file(d, "gemv-fast-linear.data.pkl", pk.p, pk.n);
    struct zipb z = {0};
    zip_add(&z, "m/data.pkl", pk.p, pk.n);
    zip_add(&z, "m/byteorder", "little", 6);
    for (int i = 0; i < nt; i++) {
        char rec[64];
        snprintf(rec, sizeof rec, "m/data/%d", i);
        zip_add(&z, rec, t[i].data, t[i].nbytes);
    }
    b = zip_finish(&z);
    write_file(d, "gemv-fast-linear.bin", b.p, b.n);
    free(b.p);
    free(pk.p);
    for (int i = 0; i < nkeep; i++)
        free(keep[i]);
    canon_free(&c);
    printf("seed corpus written under %s\n", dir);
    return 0;
}

int main(int argc, char **argv)
{
    T_INIT("cvt_src");
    if (argc == 3 && strcmp(argv[1], "--write-corpus") == 0)
        return write_corpus(argv[2]);
    if (!t_src_tmp("cvt-src"))
        return 1;
    test_err_strings();
    test_gemm_worked_example();
    test_variants();
    test_unaligned();
    test_awq_errors();
    test_awq_gemv_odd_group();
    test_bad_fixtures();
    test_model_fixtures();
    test_threads();
    test_rss();
    return t_src_done();
}
