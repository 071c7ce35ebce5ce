/*
 * test_cvt_built.c - `qshard convert` on checkpoints this test builds from the fixtures, each
 * converted with the binary and checked tensor by tensor against its source (tests/t_cvt_check.h):
 *   - mixed precision (docs/FORMATS.md section 12, P09): layer 0's MLP as F32 .weight listed in
 *     modules_to_not_convert must give F16 [N_r, K_r] linears equal to the source rounded to fp16;
 *     an o_proj bias must land on rank 0 only (row-parallel);
 *   - per-channel AWQ (group_size -1) at tp 1, 2, 4;
 *   - config pitfalls end to end: P21 (d) disagreeing quant configs, (e) no quant config at all,
 *     P09 (b) listed float tensors missing: each exits 2, names the problem, leaves nothing.
 *
 * Run from the repository root: ./build/test_cvt_built (QSHARD names the binary).
 */
#include "t_cvt_check.h"    /* model_ck, ck_model; t_cvt.h */
#include "t_safetensors.h" /* st_read_model, st_per_channel, write_safetensors */

/* --- a mixed-precision model built here (docs/FORMATS.md P09, row-parallel bias) ----------------- */

static uint32_t rng_state = 12345u;
static float rnd(void) /* uniform in [-0.5, 0.5), xorshift32 */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return (float)(rng_state >> 8) / 16777216.0f - 0.5f;
}

/* llama-gqa-gemm with layer 0's MLP stored as F32 .weight (listed in modules_to_not_convert) and
 * an F16 o_proj.bias in layer 1; converted at tp 1 and 2 and checked element by element. */
static void test_mixed_precision(void)
{
    const char *base = DATA "models/llama-gqa-gemm";
    char dir[512], path[600], out[512];
    struct cvt_source *src = NULL;
    snprintf(dir, sizeof(dir), "%s/mixed/model", g_tmp);
    snprintf(path, sizeof(path), "%s/mixed", g_tmp);
    mkdir(path, 0777);
    mkdir(dir, 0777);
    CHECK(cvt_source_open(base, &src) == CVT_ERR_NONE);
    if (!src)
        return;
    const struct cvt_hf_config *cfg = cvt_source_config(src);
    int64_t H = cfg->hidden_size, I = cfg->intermediate_size;
    struct st_entry *e = NULL;
    int n = 0;
    CHECK(st_read_model(base, &e, &n));
    n = st_drop(e, n, "model.layers.0.mlp."); /* replaced below */
    struct st_entry *grown = e ? realloc(e, (size_t)(n + 4) * sizeof(*e)) : NULL;
    if (!grown)
        st_free(e, n);
    else
        memset(grown + n, 0, 4 * sizeof(*grown));
    e = grown;
    static const char *const mlp[3] = {"gate_proj", "up_proj", "down_proj"};
    float *w32[3] = {NULL, NULL, NULL};
    uint16_t *obias = NULL;
    for (int j = 0; e && j < 3; j++) {
        struct st_entry *x = &e[n++];
        int64_t N = j < 2 ? I : H, K = j < 2 ? H : I; /* nn.Linear weight [N, K] */
        snprintf(x->name, sizeof(x->name), "model.layers.0.mlp.%s.weight", mlp[j]);
        x->dtype = "F32";
        x->n_dims = 2;
        x->shape[0] = N;
        x->shape[1] = K;
        x->size = (size_t)(N * K) * 4;
        x->data = w32[j] = malloc(x->size);
        for (int64_t i = 0; w32[j] && i < N * K; i++)
            w32[j][i] = rnd() * 0.1f;
    }
    if (e) {
        struct st_entry *x = &e[n++];
        snprintf(x->name, sizeof(x->name), "model.layers.1.self_attn.o_proj.bias");
        x->dtype = "F16";
        x->n_dims = 1;
        x->shape[0] = H;
        x->size = (size_t)H * 2;
        x->data = obias = malloc(x->size);
        for (int64_t i = 0; obias && i < H; i++)
            obias[i] = ref_f32_to_f16(1.0f + rnd());
    }
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    CHECK(e && write_safetensors(path, e, n));
    /* config: the fixture's, with modules_to_not_convert = ["layers.0.mlp"] */
    snprintf(path, sizeof(path), "%s/config.json", base);
    cJSON *cj = load_json(path);
    cJSON *qc = cJSON_GetObjectItem(cj, "quantization_config");
    cJSON_DeleteItemFromObject(qc, "modules_to_not_convert");
    cJSON *lst = cJSON_AddArrayToObject(qc, "modules_to_not_convert");
    cJSON_AddItemToArray(lst, cJSON_CreateString("layers.0.mlp"));
    char *cjs = cJSON_Print(cj);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    CHECK(f && cjs && fputs(cjs, f) >= 0);
    if (f)
        fclose(f);
    free(cjs);
    cJSON_Delete(cj);

    for (int tp = 1; tp <= 2; tp++) {
        char *err = NULL;
        snprintf(out, sizeof(out), "%s/mixed/tp%d", g_tmp, tp);
        int rc = run(&err, NULL, "convert %s %s --tp %d -q", dir, out, tp);
        CHECK_MSG(rc == 0, "mixed tp %d: exit %d: %s", tp, rc, err ? err : "");
        free(err);
        struct fmt_model *fm = NULL;
        if (rc || fmt_model_open(out, &fm))
            continue;
        int64_t I_r = I / tp; /* I = 256 = 2 groups: no padding at tp 1, 2 */
        for (int r = 0; r < tp; r++) {
            const struct fmt_shard *sh = fmt_model_shard(fm, (uint32_t)r);
            const struct fmt_tensor *gu =
                fmt_shard_find(sh, "model.layers.0.mlp.gate_up_proj.weight");
            const struct fmt_tensor *dn = fmt_shard_find(sh, "model.layers.0.mlp.down_proj.weight");
            CHECK(fmt_shard_find(sh, "model.layers.0.mlp.gate_up_proj.qweight") == NULL);
            CHECK(fmt_shard_find(sh, "model.layers.1.mlp.gate_up_proj.qweight") != NULL);
            CHECK(gu && gu->dtype == FMT_DTYPE_F16 && gu->shape[0] == (uint64_t)(2 * I_r) &&
                  gu->shape[1] == (uint64_t)H);
            CHECK(dn && dn->dtype == FMT_DTYPE_F16 && dn->shape[0] == (uint64_t)H &&
                  dn->shape[1] == (uint64_t)I_r);
            bool ok = gu && dn && w32[0] && w32[1] && w32[2];
            /* gate_up row n < I_r: gate row r*I_r + n; row I_r + n: up row r*I_r + n */
            for (int64_t row = 0; ok && row < 2 * I_r; row++)
                for (int64_t k = 0; ok && k < H; k++) {
                    const float *srcw = w32[row < I_r ? 0 : 1];
                    float v = srcw[(r * I_r + row % I_r) * H + k];
                    ok = ((const uint16_t *)gu->data)[row * H + k] == ref_f32_to_f16(v);
                }
            /* down [H, I_r]: column c = source column r*I_r + c */
            for (int64_t h = 0; ok && h < H; h++)
                for (int64_t c = 0; ok && c < I_r; c++)
                    ok = ((const uint16_t *)dn->data)[h * I_r + c] ==
                         ref_f32_to_f16(w32[2][h * I + r * I_r + c]);
            CHECK_MSG(ok, "mixed tp %d rank %d: unquantized MLP differs from the source", tp, r);
            /* row-parallel bias: rank 0 only, as F32 of the F16 values */
            const struct fmt_tensor *ob =
                fmt_shard_find(sh, "model.layers.1.self_attn.o_proj.bias");
            if (r == 0) {
                bool bok = ob && ob->dtype == FMT_DTYPE_F32 && ob->numel == (uint64_t)H && obias;
                for (int64_t i = 0; bok && i < H; i++)
                    bok = ((const float *)ob->data)[i] == ref_f16_to_f32(obias[i]);
                CHECK_MSG(bok, "mixed tp %d: o_proj.bias on rank 0 wrong", tp);
            } else {
                CHECK_MSG(ob == NULL, "mixed tp %d: o_proj.bias on rank %d (added twice)", tp, r);
            }
        }
        fmt_model_close(fm);
    }
    st_free(e, n);
    cvt_source_close(src);
}

/* Per-channel AWQ (group_size -1: one group per linear, scales [1, N]) built here from
 * llama-gqa-gemm (GEMM): every quantized linear keeps its codes and takes its first group's zeros
 * and scales for all rows. Converted at tp 1, 2 and 4 and checked by ck_model like the fixtures:
 * the row-parallel o_proj / down_proj get the local group size gcd(K, K_r) (DESIGN 4) and
 * dequantize to the per-channel source bit for bit; the config says group_size -1. */
static void test_per_channel(void)
{
    const char *base = DATA "models/llama-gqa-gemm";
    char dir[512], path[600], out[512];
    snprintf(path, sizeof(path), "%s/perchan", g_tmp);
    snprintf(dir, sizeof(dir), "%s/perchan/model", g_tmp);
    mkdir(path, 0777);
    mkdir(dir, 0777);
    struct st_entry *e = NULL;
    int n = 0;
    CHECK(st_read_model(base, &e, &n));
    int n_q = st_per_channel(e, n);
    CHECK(n_q >= 2 * 7 * 2); /* 7 linears x 2 layers, scales and qzeros each */
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    CHECK(e && write_safetensors(path, e, n));
    snprintf(path, sizeof(path), "%s/config.json", base);
    cJSON *cj = load_json(path);
    cJSON *qc = cJSON_GetObjectItem(cj, "quantization_config");
    cJSON_ReplaceItemInObject(qc, "group_size", cJSON_CreateNumber(-1));
    char *cjs = cJSON_Print(cj);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    CHECK(f && cjs && fputs(cjs, f) >= 0);
    if (f)
        fclose(f);
    free(cjs);
    cJSON_Delete(cj);
    st_free(e, n);

    struct model_ck m;
    memset(&m, 0, sizeof(m));
    m.name = "per-channel llama-gqa-gemm";
    CHECK(cvt_source_open(dir, &m.src) == CVT_ERR_NONE);
    if (!m.src)
        return;
    m.cfg = cvt_source_config(m.src);
    m.H = m.cfg->hidden_size, m.I = m.cfg->intermediate_size, m.V = m.cfg->vocab_size;
    m.nq = m.cfg->num_attention_heads, m.nkv = m.cfg->num_key_value_heads;
    m.hd = m.cfg->head_dim, m.G = m.cfg->quant.group_size, m.L = m.cfg->num_hidden_layers;
    m.E = m.cfg->num_local_experts;
    CHECK_EQ_INT(m.G, -1);
    int n_conv = 0;
    for (int tp = 1; tp <= 4; tp *= 2) {
        char *err = NULL;
        snprintf(out, sizeof(out), "%s/perchan/tp%d", g_tmp, tp);
        int rc = run(&err, NULL, "convert %s %s --tp %d -q", dir, out, tp);
        CHECK_MSG(tp_possible(&m, tp) && rc == 0, "per-channel tp %d: exit %d: %s", tp, rc,
                  err ? err : "");
        free(err);
        if (rc)
            continue;
        ck_setup_tp(&m, tp);
        ck_model(&m, out);
        n_conv++;
    }
    CHECK_EQ_INT(n_conv, 3);
    CHECK(m.n_local > 0); /* tp 2 and 4: o_proj and down_proj hold part of their one group */
    printf("per-channel: %d conversions checked, %d packed linears with a local group size\n",
           n_conv, m.n_local);
    cvt_source_close(m.src);
}
/* docs/FORMATS.md P21 (d), (e) and P09 (b), end to end: each must exit 2, name the problem, leave
 * nothing. Built from llama-gqa-gemm (config.json:quantization_config, group 128). */
static void test_config_pitfalls(void)
{
    const char *base = DATA "models/llama-gqa-gemm";
    char dir[512], a[600], b[600], out[600], *err = NULL;
    snprintf(dir, sizeof(dir), "%s/p21", g_tmp);
    mkdir(dir, 0777);
    snprintf(a, sizeof(a), "%s/model.safetensors", base);
    snprintf(b, sizeof(b), "%s/model.safetensors", dir);
    CHECK(copy_file(a, b));
    snprintf(a, sizeof(a), "%s/generation_config.json", base);
    snprintf(b, sizeof(b), "%s/generation_config.json", dir);
    CHECK(copy_file(a, b));
    snprintf(a, sizeof(a), "%s/config.json", base);
    cJSON *cj = load_json(a);
    snprintf(out, sizeof(out), "%s/p21-out", g_tmp);

    /* (e) quantized tensors but no quant config anywhere */
    cJSON *qc = cJSON_DetachItemFromObject(cj, "quantization_config");
    char *txt = cJSON_Print(cj);
    snprintf(b, sizeof(b), "%s/config.json", dir);
    CHECK(txt && write_text(b, txt));
    free(txt);
    CHECK_EQ_INT(run(&err, NULL, "convert %s %s --tp 1", dir, out), 2);
    CHECK_MSG(err && strstr(err, "error"), "P21 (e): %s", err ? err : "");
    CHECK(!exists(out));
    free(err);
    err = NULL;

    /* (d) config.json says group 128, quant_config.json says 64 */
    cJSON_AddItemToObject(cj, "quantization_config", qc);
    txt = cJSON_Print(cj);
    CHECK(txt && write_text(b, txt));
    free(txt);
    snprintf(b, sizeof(b), "%s/quant_config.json", dir);
    CHECK(write_text(b, "{\"zero_point\": true, \"q_group_size\": 64, \"w_bit\": 4, "
                        "\"version\": \"GEMM\"}\n"));
    CHECK_EQ_INT(run(&err, NULL, "convert %s %s --tp 1", dir, out), 2);
    CHECK_MSG(err && strstr(err, "error"), "P21 (d): %s", err ? err : "");
    CHECK(!exists(out));
    free(err);
    err = NULL;
    /* the same quant_config.json agreeing (group 128): converts, identical to the fixture's */
    CHECK(write_text(b, "{\"zero_point\": true, \"q_group_size\": 128, \"w_bit\": 4, "
                        "\"version\": \"GEMM\"}\n"));
    CHECK_EQ_INT(run(&err, NULL, "convert %s %s --tp 1 -q", dir, out), 0);
    free(err);
    err = NULL;
    snprintf(a, sizeof(a), "%s/fixture-tp1", g_tmp);
    CHECK_EQ_INT(run(NULL, NULL, "convert " DATA "models/llama-gqa-gemm %s --tp 1 -q", a), 0);
    ck_twins(a, out, "P21 agreeing quant configs");

    /* P09 (b): modules_to_not_convert names layer 0's MLP, whose float tensors are absent */
    snprintf(b, sizeof(b), "%s/mixed/model/model.safetensors", g_tmp);
    if (exists(b)) {
        char d2[600], e2[700];
        snprintf(d2, sizeof(d2), "%s/p09b", g_tmp);
        mkdir(d2, 0777);
        /* rewrite the mixed model without layer 0's down_proj.weight */
        struct st_entry *e = NULL;
        int n = 0;
        snprintf(e2, sizeof(e2), "%s/mixed/model", g_tmp);
        CHECK(st_read_model(e2, &e, &n));
        n = st_drop(e, n, "model.layers.0.mlp.down_proj.weight");
        snprintf(e2, sizeof(e2), "%s/model.safetensors", d2);
        CHECK(e && write_safetensors(e2, e, n));
        snprintf(a, sizeof(a), "%s/mixed/model/config.json", g_tmp);
        snprintf(e2, sizeof(e2), "%s/config.json", d2);
        CHECK(copy_file(a, e2));
        CHECK_EQ_INT(run(&err, NULL, "convert %s %s --tp 1", d2, out), 2);
        CHECK_MSG(err && strstr(err, "model.layers.0.mlp.down_proj"), "P09 (b): %s",
                  err ? err : "");
        free(err);
        st_free(e, n);
    }
    cJSON_Delete(cj);
}
int main(void)
{
    if (!t_cvt_init("cvt_built"))
        return 1;
    test_mixed_precision();
    test_per_channel();
    test_config_pitfalls();
    return t_cvt_done();
}
