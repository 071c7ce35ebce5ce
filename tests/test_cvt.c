/*
 * test_cvt.c - `qshard convert` end to end on every fixture of tests/data/models/INDEX.json and
 * every bad input of tests/data/bad/INDEX.json.
 *
 * For each model and tp in {1, 2, 3, 4} the binary converts the fixture; a tp the model's shapes
 * cannot take (rules restated from DESIGN 4-5 in tests/t_cvt_check.h, not taken from the
 * converter; for the fixtures' 4 heads that is tp 3) must be refused with exit 2, the valid values
 * listed and no output left. At tp 4 the fixtures' o_proj holds K_r = 64 rows of 128-row groups:
 * its scales must have K_r / gcd(G, K_r) rows (DESIGN 4 local group size), and it must still
 * dequantize to the source rows bit for bit. Each converted model is opened with the format
 * reader (manifest, sizes, digests) and every tensor of every rank is checked against the
 * ORIGINAL checkpoint (tests/t_cvt_check.h). Twins (same weights, other variant, container or
 * config spelling: docs/FORMATS.md section 12, P03 and P21) must give identical tensors, generation config, tokenizer
 * and config (except quant.source_variant / quant.source_container).
 * Also: --threads 1, --no-check and a 64 KiB chunk budget give identical files; the GEMM fast
 * path and the generic path (--debug-no-fast-path) give identical files on every fixture; every
 * bad input exits as INDEX.json says, names what it promises, and leaves no file behind, also
 * inside a pre-existing directory; a NaN / Inf in an F16 tensor is named with its element; a
 * fixture config in transformers 5's spelling (rope_parameters) converts as the original.
 *
 * Pitfalls of docs/FORMATS.md section 12 covered: P01/P02 (intermediate padding: llama3-gqa-i640 640 = 5 groups and qwen2 384 =
 * 3 groups at tp 2, mixtral 1 group at tp 2; llama3-gqa-i640 at tp 4: 5 groups on 4 ranks, and
 * half a group of o_proj rows per rank), P03 (GEMM/GEMV/GEMVFast twins), P05 (kv replication:
 * llama3 kv 1 at tp 2, mistral kv 2 at tp 4), P07 (vocab 509 at tp 2), P08 (tied embeddings, no
 * lm_head), P09/P10 (mixtral router listed in modules_to_not_convert, replicated F32), P11 (qwen2
 * q/k/v biases split with their heads), P13 (w-bit-8), P14 (zero-point-false, unknown version),
 * P17 (unknown / missing tensor), P19/P20 via bad inputs, P21 (quant_config.json /
 * quantize_config.json twins).
 *
 * Run from the repository root: ./build/test_cvt (QSHARD names the binary, default build/qshard).
 */
#include "t_cvt_check.h" /* model_ck, ck_model, tp_possible; t_cvt.h */

/* --- tests ------------------------------------------------------------------------------- */

static void test_models(void)
{
    cJSON *idx = load_json(DATA "models/INDEX.json");
    CHECK_MSG(idx != NULL, "cannot read " DATA "models/INDEX.json");
    if (!idx)
        return;
    cJSON *models = cJSON_GetObjectItem(idx, "models"), *it;
    int n_models = 0, n_converted = 0, n_refused = 0, n_local_total = 0;
    cJSON_ArrayForEach(it, models)
    {
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(it, "name"));
        const char *path = cJSON_GetStringValue(cJSON_GetObjectItem(it, "path"));
        char dir[512], out[512];
        if (!name || !path)
            continue;
        snprintf(dir, sizeof(dir), DATA "%s", path);
        struct model_ck m;
        memset(&m, 0, sizeof(m));
        m.name = name;
        enum cvt_err e = cvt_source_open(dir, &m.src);
        CHECK_MSG(e == CVT_ERR_NONE, "%s: cvt_source_open: %s", name, cvt_err_str(e));
        if (e)
            continue;
        n_models++;
        m.cfg = cvt_source_config(m.src);
        m.H = m.cfg->hidden_size;
        m.I = m.cfg->intermediate_size;
        m.V = m.cfg->vocab_size;
        m.nq = m.cfg->num_attention_heads;
        m.nkv = m.cfg->num_key_value_heads;
        m.hd = m.cfg->head_dim;
        m.G = m.cfg->quant.group_size;
        m.L = m.cfg->num_hidden_layers;
        m.E = m.cfg->num_local_experts;
        const cJSON *mt = cJSON_GetObjectItem(it, "max_tp");
        m.max_tp = cJSON_IsNumber(mt) ? mt->valueint : 0;
        /* INDEX.json agrees with the config the converter reads */
        CHECK_EQ_INT(m.H, cJSON_GetNumberValue(cJSON_GetObjectItem(it, "hidden_size")));
        CHECK_EQ_INT(m.G, cJSON_GetNumberValue(cJSON_GetObjectItem(it, "group_size")));
        for (int tp = 1; tp <= 4; tp++) {
            char *err = NULL;
            snprintf(out, sizeof(out), "%s/models/%s/tp%d", g_tmp, name, tp);
            int rc = run(&err, NULL, "convert %s %s --tp %d --quiet", dir, out, tp);
            if (tp_possible(&m, tp)) {
                CHECK_MSG(rc == 0, "%s tp %d: exit %d: %s", name, tp, rc, err ? err : "");
                if (rc == 0) {
                    ck_setup_tp(&m, tp);
                    ck_model(&m, out);
                    n_converted++;
                    n_local_total += m.n_local;
                    m.n_local = 0;
                }
            } else {
                /* head split impossible: refused before writing anything, valid values named */
                CHECK_MSG(rc == 2, "%s tp %d: expected exit 2, got %d", name, tp, rc);
                CHECK_MSG(err && strstr(err, "valid --tp values"), "%s tp %d: %s", name, tp,
                          err ? err : "");
                CHECK_MSG(!exists(out), "%s tp %d: refused conversion left %s", name, tp, out);
                n_refused++;
            }
            free(err);
        }
        cvt_source_close(m.src);
    }
    CHECK(n_models >= 6);
    CHECK(n_converted >= 2 * n_models); /* tp 1 and 2 always possible for the fixtures */
    CHECK(n_refused >= 1);              /* tp 3: the fixtures have 4 heads */
    CHECK(n_local_total > 0);           /* some tp-4 o_proj held part of a group */
    printf("models: %d fixtures, %d conversions checked (%d packed linears with a local group "
           "size below G), %d impossible tp refused\n",
           n_models, n_converted, n_local_total, n_refused);

    /* twins: identical tensors for every member of a group, at every tp both converted; the
     * first member of each group against all later ones */
    cJSON *a;
    int n_groups = 0;
    cJSON_ArrayForEach(a, models)
    {
        const char *ga = cJSON_GetStringValue(cJSON_GetObjectItem(a, "twin_group"));
        const char *na = cJSON_GetStringValue(cJSON_GetObjectItem(a, "name"));
        bool first = ga && na;
        for (const cJSON *e = models->child; first && e != a; e = e->next) {
            const char *ge = cJSON_GetStringValue(cJSON_GetObjectItem(e, "twin_group"));
            first = !ge || strcmp(ge, ga) != 0;
        }
        if (!first)
            continue;
        cJSON *b;
        bool after = false;
        int n_twins = 0;
        cJSON_ArrayForEach(b, models)
        {
            const char *gb = cJSON_GetStringValue(cJSON_GetObjectItem(b, "twin_group"));
            const char *nb = cJSON_GetStringValue(cJSON_GetObjectItem(b, "name"));
            if (b == a) {
                after = true;
                continue;
            }
            if (!after || !gb || !nb || strcmp(ga, gb))
                continue;
            for (int tp = 1; tp <= 4; tp *= 2) {
                char da[512], db[512], what[300];
                snprintf(da, sizeof(da), "%s/models/%s/tp%d", g_tmp, na, tp);
                snprintf(db, sizeof(db), "%s/models/%s/tp%d", g_tmp, nb, tp);
                if (!exists(da) || !exists(db))
                    continue;
                snprintf(what, sizeof(what), "twins %s / %s tp %d", na, nb, tp);
                ck_twins(da, db, what);
                n_twins++;
            }
        }
        if (n_twins)
            printf("twins: %s checked against %d conversions of its twins\n", na, n_twins);
        n_groups += n_twins > 0;
    }
    CHECK(n_groups >= 2); /* llama-gqa (six forms) and kjv-llama (GEMM + GEMV) */
    cJSON_Delete(idx);
}
static void test_determinism(void)
{
    /* --threads 1, --no-check and the default give byte-identical rank files */
    const char *dir = DATA "models/llama3-gqa-i640";
    char a[512], b[512], c[512], fa[600], fb[600], fc[600];
    snprintf(a, sizeof(a), "%s/det/a", g_tmp);
    snprintf(b, sizeof(b), "%s/det/b", g_tmp);
    snprintf(c, sizeof(c), "%s/det/c", g_tmp);
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s --tp 2 -q", dir, a), 0);
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s --tp 2 -q --threads 1", dir, b), 0);
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s --tp 2 -q --threads 3 --no-check", dir, c), 0);
    /* tiny chunk budget: every packed output goes through many 64-column load chunks */
    char d[512], fd[600];
    snprintf(d, sizeof(d), "%s/det/d", g_tmp);
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s --tp 1 -q", dir, d), 0);
    snprintf(c, sizeof(c), "%s/det/e", g_tmp);
    const struct cvt_hooks small = {.chunk_bytes = 64 << 10};
    CHECK_EQ_INT(cvt_inproc(&small, dir, c, 1, false, false), CVT_ERR_NONE);
    snprintf(fd, sizeof(fd), "%s/rank-0-of-1.qshard", d);
    snprintf(fc, sizeof(fc), "%s/rank-0-of-1.qshard", c);
    CHECK_MSG(files_equal(fd, fc), "64 KiB chunk budget: output differs");
    snprintf(c, sizeof(c), "%s/det/c", g_tmp);
    for (int r = 0; r < 2; r++) {
        snprintf(fa, sizeof(fa), "%s/rank-%d-of-2.qshard", a, r);
        snprintf(fb, sizeof(fb), "%s/rank-%d-of-2.qshard", b, r);
        snprintf(fc, sizeof(fc), "%s/rank-%d-of-2.qshard", c, r);
        CHECK_MSG(files_equal(fa, fb), "rank %d: --threads 1 output differs", r);
        CHECK_MSG(files_equal(fa, fc), "rank %d: --no-check output differs", r);
    }
}
/* The AutoAWQ GEMM fast path (convert/cvt_fast.c) against the generic path (cvt_awq_load +
 * ref_pack_*; --debug-no-fast-path): every fixture, every tp test_models converted, and at tp 2
 * a 64 KiB chunk budget (64-column chunks), give byte-identical rank files and manifests. */
static void test_fast_vs_generic(void)
{
    cJSON *idx = load_json(DATA "models/INDEX.json"), *it;
    if (!idx)
        return;
    int n_cmp = 0;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(idx, "models"))
    {
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(it, "name"));
        const char *path = cJSON_GetStringValue(cJSON_GetObjectItem(it, "path"));
        if (!name || !path)
            continue;
        for (int tp = 1; tp <= 4; tp++) {
            char fast[512], gen[512], fa[600], fb[600];
            snprintf(fast, sizeof(fast), "%s/models/%s/tp%d", g_tmp, name, tp);
            if (!exists(fast))
                continue;
            snprintf(gen, sizeof(gen), "%s/generic/%s/tp%d", g_tmp, name, tp);
            int rc;
            if (tp == 2) { /* in process: a 64 KiB budget (test hook) */
                char model[512];
                const struct cvt_hooks small = {.chunk_bytes = 64 << 10};
                snprintf(model, sizeof(model), DATA "%s", path);
                rc = cvt_inproc(&small, model, gen, tp, false, true) == CVT_ERR_NONE ? 0 : 1;
            } else {
                rc = run(NULL, NULL, "convert " DATA "%s %s --tp %d -q --debug-no-fast-path",
                         path, gen, tp);
            }
            CHECK_MSG(rc == 0, "%s tp %d: generic path: exit %d", name, tp, rc);
            for (int r = 0; r < tp && rc == 0; r++) {
                snprintf(fa, sizeof(fa), "%s/rank-%d-of-%d.qshard", fast, r, tp);
                snprintf(fb, sizeof(fb), "%s/rank-%d-of-%d.qshard", gen, r, tp);
                CHECK_MSG(files_equal(fa, fb), "%s tp %d rank %d: fast and generic paths differ",
                          name, tp, r);
                n_cmp++;
            }
            snprintf(fa, sizeof(fa), "%s/manifest.json", fast);
            snprintf(fb, sizeof(fb), "%s/manifest.json", gen);
            CHECK_MSG(rc || files_equal(fa, fb), "%s tp %d: manifests differ", name, tp);
        }
    }
    CHECK(n_cmp >= 20);
    printf("fast vs generic path: %d rank files identical\n", n_cmp);
    cJSON_Delete(idx);
}
static void test_bad_inputs(void)
{
    cJSON *idx = load_json(DATA "bad/INDEX.json");
    CHECK_MSG(idx != NULL, "cannot read " DATA "bad/INDEX.json");
    if (!idx)
        return;
    int n = 0;
    cJSON *ctl = cJSON_GetObjectItem(idx, "control"), *it;
    char out[512], dir[512];
    snprintf(dir, sizeof(dir), DATA "%s", cJSON_GetStringValue(cJSON_GetObjectItem(ctl, "path")));
    snprintf(out, sizeof(out), "%s/bad/control", g_tmp);
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s --tp 1 -q", dir, out), 0);
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(idx, "cases"))
    {
        const char *cs = cJSON_GetStringValue(cJSON_GetObjectItem(it, "case"));
        const char *path = cJSON_GetStringValue(cJSON_GetObjectItem(it, "path"));
        int want = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(it, "expect_exit"));
        if (!cs || !path)
            continue;
        snprintf(dir, sizeof(dir), DATA "%s", path);
        snprintf(out, sizeof(out), "%s/bad/%s/out", g_tmp, cs);
        char *err = NULL;
        int rc = run(&err, NULL, "convert %s %s --tp 1", dir, out);
        CHECK_MSG(rc == want && rc != 0, "bad case %s: exit %d, expected %d", cs, rc, want);
        cJSON *s;
        cJSON_ArrayForEach(s, cJSON_GetObjectItem(it, "message_should_name"))
        {
            const char *needle = cJSON_GetStringValue(s);
            CHECK_MSG(err && needle && strstr(err, needle), "bad case %s: stderr lacks '%s': %s",
                      cs, needle ? needle : "?", err ? err : "");
        }
        CHECK_MSG(err && strstr(err, "error"), "bad case %s: no error message", cs);
        char parent[512];
        snprintf(parent, sizeof(parent), "%s/bad/%s", g_tmp, cs);
        CHECK_MSG(!exists(out) && !exists(parent), "bad case %s: output left behind", cs);
        free(err);
        /* into a directory that already exists: it stays, and stays empty */
        CHECK(mkdir(parent, 0777) == 0);
        rc = run(NULL, NULL, "convert %s %s --tp 1 -q", dir, parent);
        CHECK_MSG(rc != 0 && dir_entries(parent) == 0, "bad case %s: exit %d, %d entries left",
                  cs, rc, dir_entries(parent));
        n++;
    }
    CHECK(n >= 10);
    printf("bad inputs: %d cases\n", n);
    cJSON_Delete(idx);
}
/* A NaN or Inf in an F16 float tensor (the embedding: cvt_source_read_f16's copy-then-scan
 * path) is refused with exit 2, naming the tensor and the element: the first element, one
 * inside, the last. The fixture's model.safetensors is patched in a copy. */
static void test_f16_nonfinite(void)
{
    const char *fx = DATA "models/llama-gqa-gemm";
    char dir[512], f[600], g[600], out[600];
    size_t len = 0;
    snprintf(f, sizeof(f), "%s/model.safetensors", fx);
    uint8_t *st = (uint8_t *)t_slurp(f, &len);
    CHECK(st && len > 8);
    if (!st || len <= 8)
        return;
    uint64_t hl;
    memcpy(&hl, st, 8);
    cJSON *h = hl < len - 8 ? cJSON_ParseWithLength((const char *)st + 8, (size_t)hl) : NULL;
    cJSON *e = cJSON_GetObjectItem(h, "model.embed_tokens.weight");
    cJSON *offs = cJSON_GetObjectItem(e, "data_offsets");
    CHECK(e && offs && !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(e, "dtype")), "F16"));
    if (!offs) {
        cJSON_Delete(h);
        free(st);
        return;
    }
    size_t b0 = 8 + (size_t)hl + (size_t)cJSON_GetNumberValue(cJSON_GetArrayItem(offs, 0));
    size_t n = ((size_t)cJSON_GetNumberValue(cJSON_GetArrayItem(offs, 1)) - (b0 - 8 - hl)) / 2;
    const struct { size_t at; uint16_t bits; const char *what; } cases[3] = {
        {0, 0x7c00, "Inf"}, {n / 2 + 3, 0x7e00, "NaN"}, {n - 1, 0xfc00, "Inf"}};
    for (int i = 0; i < 3; i++) {
        snprintf(dir, sizeof(dir), "%s/f16bad%d", g_tmp, i);
        CHECK(mkdir(dir, 0777) == 0);
        uint8_t save[2];
        memcpy(save, st + b0 + 2 * cases[i].at, 2);
        memcpy(st + b0 + 2 * cases[i].at, &cases[i].bits, 2);
        snprintf(g, sizeof(g), "%s/model.safetensors", dir);
        FILE *w = fopen(g, "wb");
        CHECK(w && fwrite(st, 1, len, w) == len);
        if (w)
            fclose(w);
        memcpy(st + b0 + 2 * cases[i].at, save, 2);
        snprintf(f, sizeof(f), "%s/config.json", fx);
        snprintf(g, sizeof(g), "%s/config.json", dir);
        CHECK(copy_file(f, g));
        snprintf(out, sizeof(out), "%s/out", dir);
        char *err = NULL, want[96];
        snprintf(want, sizeof(want), "element %zu is %s", cases[i].at, cases[i].what);
        CHECK_EQ_INT(run(&err, NULL, "convert %s %s --tp 2", dir, out), 2);
        CHECK_MSG(err && strstr(err, "model.embed_tokens.weight") && strstr(err, want),
                  "f16 case %d: stderr: %s", i, err ? err : "");
        CHECK(!exists(out));
        free(err);
    }
    cJSON_Delete(h);
    free(st);
}
/* The "files" of `qshard inspect --json DIR` (NULL after a failed check). */
static cJSON *inspect_files(const char *dir)
{
    char *out = NULL;
    int rc = run(NULL, &out, "inspect --json %s", dir);
    cJSON *j = rc == 0 && out ? cJSON_Parse(out) : NULL;
    CHECK_MSG(j != NULL, "inspect --json %s: exit %d", dir, rc);
    free(out);
    return j;
}

/* transformers 5's config spelling end to end: llama3-gqa-i640 (rope_theta 500000, llama3
 * scaling) with its config.json re-spelled as transformers 5 saves it (rope_theta and
 * rope_scaling folded into rope_parameters, dtype for torch_dtype; docs/FORMATS.md 10.1)
 * converts at tp 2 to the same config sections and the same tensors (names, layouts, data
 * hashes) as the original, whose logits tests/test_model_fixtures.c holds to the transformers
 * golden. (The rank files differ in the model id: a hash of the config text.) */
static void test_t5_spelling(void)
{
    static const char *const files[] = {"config.json", "generation_config.json",
                                        "model-00001-of-00002.safetensors",
                                        "model-00002-of-00002.safetensors",
                                        "model.safetensors.index.json"};
    char dir[300], src[512], dst[512], o4[300], o5[300];
    snprintf(dir, sizeof(dir), "%s/t5-llama3", g_tmp);
    CHECK(mkdir(dir, 0777) == 0);
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        snprintf(src, sizeof(src), DATA "models/llama3-gqa-i640/%s", files[i]);
        snprintf(dst, sizeof(dst), "%s/%s", dir, files[i]);
        CHECK_MSG(copy_file(src, dst), "copy %s", src);
    }
    snprintf(dst, sizeof(dst), "%s/config.json", dir);
    cJSON *c = load_json(dst);
    CHECK(c != NULL);
    if (!c)
        return;
    cJSON *rs = cJSON_DetachItemFromObject(c, "rope_scaling");
    cJSON *th = cJSON_DetachItemFromObject(c, "rope_theta");
    CHECK(cJSON_IsObject(rs) && cJSON_IsNumber(th));
    cJSON_AddItemToObject(rs, "rope_theta", th);
    cJSON_AddItemToObject(c, "rope_parameters", rs);
    cJSON *dt = cJSON_DetachItemFromObject(c, "torch_dtype");
    if (dt)
        cJSON_AddItemToObject(c, "dtype", dt);
    char *text = cJSON_Print(c);
    CHECK(text && write_text(dst, text));
    free(text);
    cJSON_Delete(c);
    snprintf(o4, sizeof(o4), "%s/t5-out-t4", g_tmp);
    snprintf(o5, sizeof(o5), "%s/t5-out-t5", g_tmp);
    CHECK_EQ_INT(run(NULL, NULL, "convert " DATA "models/llama3-gqa-i640 %s --tp 2 -q", o4), 0);
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s --tp 2 -q", dir, o5), 0);
    cJSON *j4 = inspect_files(o4), *j5 = inspect_files(o5);
    cJSON *f4 = cJSON_GetObjectItem(j4, "files"), *f5 = cJSON_GetObjectItem(j5, "files");
    CHECK(cJSON_GetArraySize(f4) == 2 && cJSON_GetArraySize(f5) == 2);
    for (int r = 0; r < cJSON_GetArraySize(f4) && r < cJSON_GetArraySize(f5); r++) {
        const cJSON *a = cJSON_GetArrayItem(f4, r), *b = cJSON_GetArrayItem(f5, r);
        const cJSON *ca = cJSON_GetObjectItem(a, "config"), *cb = cJSON_GetObjectItem(b, "config");
        CHECK_MSG(ca && cJSON_Compare(ca, cb, true), "rank %d: config sections differ", r);
        CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(ca, "rope_theta")) == 500000.0);
        CHECK_MSG(cJSON_Compare(cJSON_GetObjectItem(a, "tensors"), cJSON_GetObjectItem(b, "tensors"),
                                true),
                  "rank %d: tensor tables differ", r);
    }
    cJSON_Delete(j4);
    cJSON_Delete(j5);
}

int main(void)
{
    if (!t_cvt_init("cvt"))
        return 1;
    test_models();
    test_fast_vs_generic();
    test_determinism();
    test_bad_inputs();
    test_f16_nonfinite();
    test_t5_spelling();
    return t_cvt_done();
}
