/*
 * test_model_fixtures.c - the runtime model on the CPU backend with checkpoints made by the real
 * converter.
 *
 * Part 1, fixtures: every model of tests/data/models/INDEX.json is converted with the real
 * converter (`$QSHARD convert`) at TP 1, 2 and 4 into a temp dir and its logits compared with
 * the goldens (tests/data/golden/<group>/: transformers fp32, or for groups whose golden.json
 * says "reference": "numpy float64 ..." the float64 forward of tools/fixtures/ref_forward.py;
 * relative L2 <= 1e-5 for prompt and decode logits, greedy 16-token continuation identical;
 * the fp16-activation emulation within 1e-2) and TP-N with TP-1
 * (relative L2 <= 1e-5). TP-3 of a 4-head model must be refused (exit 2). Later members of a
 * twin group run at TP 1 only: test_cvt.c checks that their conversions equal the first
 * member's tensor for tensor at every TP.
 *
 * Part 2, per-channel AWQ (group_size -1): llama-gqa-gemm rewritten here with one group per
 * linear (group 0's zeros/scales for all K rows), converted at TP 1..4 (TP-3 must be refused with
 * exit 2 and the valid --tp hint); TP-N vs TP-1 (relative L2 <= 1e-5) and TP-1 vs the fp64
 * forward of the dequantized per-channel weights, unpacked here from the written GEMM tensors
 * (relative L2 <= 1e-5, greedy 16-token continuation identical).
 *
 * Run: ./build/test_model_fixtures (from the repository root; QSHARD names the binary).
 */
#include <sys/wait.h>

#include <cjson/cJSON.h>

#include "cvt_src.h" /* reading the llama-gqa-gemm fixture for the per-channel test */
#include "rt_io.h"   /* rt_npy_read_f32, rt_file_read */
#include "t_model.h"
#include "t_safetensors.h" /* st_entry, write_safetensors (per-channel test) */

// --- part 2: fixtures through the real converter vs transformers goldens -------------------------

static const char *data_dir = "tests/data";

static int run_cmd(const char *cmd)
{
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int json_int(const cJSON *o, const char *key, int def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? (int)v->valuedouble : def;
}

static int json_ids(const cJSON *arr, int32_t *out, int max)
{
    int n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        if (n < max && cJSON_IsNumber(it))
            out[n++] = (int32_t)it->valuedouble;
    }
    return n;
}

static float *read_npy(const char *rel, int64_t rows, int64_t cols)
{
    char path[512];
    float *d = NULL;
    int64_t r, c;
    snprintf(path, sizeof(path), "%s/%s", data_dir, rel);
    if (rt_npy_read_f32(path, &d, &r, &c) != RT_IO_ERR_NONE)
        return NULL;
    if (r != rows || c != cols) {
        fprintf(stderr, "%s: shape [%lld, %lld], INDEX says [%lld, %lld]\n", path, (long long)r,
                (long long)c, (long long)rows, (long long)cols);
        free(d);
        return NULL;
    }
    return d;
}

/* Logits of one prompt on one converted model: all prompt rows, then 16 greedy steps; returns
 * the prompt logits [T][V] and fills greedy[16] and seq [T + 15][V] (prompt rows + decode rows). */
static float *fixture_run(const char *dir, const int32_t *ids, int T, int V, int32_t *greedy,
                          float *seq)
{
    struct rt_exec *rm = NULL;
    struct rt_opts o = cpu_opts(T + 16, 0, 0);
    enum rt_err e = rt_exec_open(dir, &o, &rm);
    CHECK_MSG(e == RT_ERR_NONE, "open %s: %s: %s", dir, rt_err_str(e), qs_log_last());
    if (e)
        return NULL;
    float *lg = xcalloc((size_t)T * V, 4);
    e = rt_exec_forward_seq(rm, 0, ids, T, 0, lg, true);
    CHECK_MSG(e == RT_ERR_NONE, "forward %s: %s", dir, rt_err_str(e));
    if (!e && seq)
        memcpy(seq, lg, (size_t)T * V * 4);
    int32_t tok = ref_argmax(lg + (size_t)(T - 1) * V, V, V);
    float *row = xcalloc((size_t)V, 4);
    for (int i = 0; !e && i < 16; i++) {
        greedy[i] = tok;
        if (i == 15)
            break;
        e = rt_exec_forward_seq(rm, 0, &tok, 1, T + i, row, false);
        CHECK_MSG(e == RT_ERR_NONE, "decode %s step %d: %s", dir, i, rt_err_str(e));
        if (seq)
            memcpy(seq + (size_t)(T + i) * V, row, (size_t)V * 4);
        tok = ref_argmax(row, V, V);
    }
    free(row);
    rt_exec_free(rm);
    if (e) {
        free(lg);
        return NULL;
    }
    return lg;
}

/* Whether DESIGN 4/5 allow a TP-tp split of these shapes: heads divide, the kv rule, o_proj's
 * per-rank K a multiple of 16 and G, and qkv's per-rank N a multiple of 64. */
static bool tp_possible(int nh, int nkv, int hd, int G, int tp)
{
    if (nh % tp || hd <= 0)
        return false;
    if (G <= 0) /* per channel (group_size -1): o_proj's one group is its K = nh * hd */
        G = nh * hd;
    if (tp <= nkv ? nkv % tp != 0 : tp % nkv != 0)
        return false;
    /* o_proj's local group size gcd(G, K_r) must be a multiple of 16 (DESIGN 4) */
    int kr = nh / tp * hd, nkv_r = tp <= nkv ? nkv / tp : 1;
    return kr % 16 == 0 && gcd_i(G, kr) % 16 == 0 && (nh / tp + 2 * nkv_r) * hd % 64 == 0;
}

/* One fixture at TP 1, 2, 3, 4; a later twin (tp_all false) at TP 1 only: its conversions are
 * the first twin's files (test_cvt.c compares them at every TP). */
static void test_fixture(const cJSON *model, const char *qshard, bool tp_all)
{
    const cJSON *jn = cJSON_GetObjectItemCaseSensitive(model, "name");
    const cJSON *jp = cJSON_GetObjectItemCaseSensitive(model, "path");
    const cJSON *prompts = cJSON_GetObjectItemCaseSensitive(model, "prompts");
    if (!cJSON_IsString(jn) || !cJSON_IsString(jp) || !cJSON_IsArray(prompts)) {
        CHECK_MSG(0, "INDEX.json: model entry without name/path/prompts");
        return;
    }
    const char *name = jn->valuestring;
    int V = json_int(model, "vocab_size", 0), nh = json_int(model, "num_heads", 1);
    int nkv = json_int(model, "num_kv_heads", nh), hd = json_int(model, "head_dim", 0);
    int G = json_int(model, "group_size", 0);
    char src[512], out[640], cmd[4096];
    snprintf(src, sizeof(src), "%s/%s", data_dir, jp->valuestring);
    struct stat st;
    CHECK_MSG(stat(src, &st) == 0, "fixture %s listed in INDEX.json is missing (%s)", name, src);
    if (stat(src, &st) != 0)
        return;

    static const int tps[] = {1, 2, 3, 4}; /* 3: refused for 4 heads */
    float *tp1[8] = {0};
    int n_prompts = cJSON_GetArraySize(prompts);
    if (n_prompts > 8)
        n_prompts = 8;
    for (size_t ti = 0; ti < (tp_all ? sizeof(tps) / sizeof(tps[0]) : 1); ti++) {
        int tp = tps[ti];
        snprintf(out, sizeof(out), "%s/fx-%s-tp%d", tmp_root, name, tp);
        snprintf(cmd, sizeof(cmd), "'%s' convert '%s' '%s' --tp %d -q 2>'%s.log'", qshard, src,
                 out, tp, out);
        int rc = run_cmd(cmd);
        int max_tp = json_int(model, "max_tp", 0); /* act-order fixtures: 1 */
        if (!tp_possible(nh, nkv, hd, G, tp) || (max_tp > 0 && tp > max_tp)) {
            /* DESIGN 4/5 rules (4.5: act-order row-parallel linears at tp 1 only): refused */
            printf("  %-24s TP-%d: impossible split (%d heads), converter exit %d\n", name, tp, nh,
                   rc);
            CHECK_MSG(rc == 2, "%s: convert --tp %d should be refused with exit 2, got %d", name,
                      tp, rc);
            rm_rf(out);
            continue;
        }
        CHECK_MSG(rc == 0, "%s: qshard convert --tp %d exited %d (log %s.log)", name, tp, rc, out);
        if (rc)
            continue;
        for (int pi = 0; pi < n_prompts; pi++) {
            const cJSON *p = cJSON_GetArrayItem(prompts, pi);
            int32_t ids[256], greedy[16], want_greedy[16];
            int T = json_ids(cJSON_GetObjectItemCaseSensitive(p, "ids"), ids, 256);
            int ng = json_ids(cJSON_GetObjectItemCaseSensitive(p, "greedy_ids"), want_greedy, 16);
            const cJSON *jl = cJSON_GetObjectItemCaseSensitive(p, "logits");
            const cJSON *js = cJSON_GetObjectItemCaseSensitive(p, "seq_logits");
            const char *pname = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(p, "name"))
                                    ? cJSON_GetObjectItemCaseSensitive(p, "name")->valuestring
                                    : "?";
            if (T < 1 || !cJSON_IsString(jl) || ng != 16) {
                CHECK_MSG(0, "%s: INDEX prompt %d lacks ids, logits or 16 greedy_ids", name, pi);
                continue;
            }
            float *gold = read_npy(jl->valuestring, T, V);
            CHECK_MSG(gold != NULL, "%s: cannot read golden %s", name, jl->valuestring);
            float *seq = xcalloc((size_t)(T + 15) * V, 4);
            float *lg = fixture_run(out, ids, T, V, greedy, seq);
            if (lg && gold) {
                double e = rel_l2_f(lg, gold, (size_t)T * V);
                printf("  %-24s %-7s TP-%d vs golden: rel L2 %.2e", name, pname, tp, e);
                CHECK_MSG(e <= 1e-5, "%s %s TP-%d: rel L2 %g vs golden", name, pname, tp, e);
                int same = memcmp(greedy, want_greedy, sizeof(greedy)) == 0;
                printf(", greedy %s", same ? "identical" : "DIFFERS");
                CHECK_MSG(same, "%s %s TP-%d: greedy continuation differs from the golden", name,
                          pname, tp);
                if (cJSON_IsString(js) && same) {
                    float *gs = read_npy(js->valuestring, T + 15, V);
                    if (gs) {
                        double es = rel_l2_f(seq, gs, (size_t)(T + 15) * V);
                        printf(", decode rows rel L2 %.2e", es);
                        CHECK_MSG(es <= 1e-5, "%s %s TP-%d: decode logits rel L2 %g", name, pname,
                                  tp, es);
                        free(gs);
                    }
                }
                float *el = emu_logits(out, ids, T, V, 0);
                if (el) { /* what fp16 activations (the CUDA backend's choice) cost */
                    double ee = rel_l2_f(el, gold, (size_t)T * V);
                    printf(", fp16-act %.2e", ee);
                    CHECK_MSG(ee <= 1e-2, "%s %s TP-%d fp16 emulation: rel L2 %g", name, pname,
                              tp, ee);
                    free(el);
                }
                if (tp == 1) {
                    tp1[pi] = lg;
                    lg = NULL;
                } else if (tp1[pi]) {
                    double d = rel_l2_f(lg, tp1[pi], (size_t)T * V);
                    printf(", vs TP-1 %.2e", d);
                    CHECK_MSG(d <= 1e-5, "%s %s TP-%d vs TP-1: rel L2 %g", name, pname, tp, d);
                }
                printf("\n");
            }
            free(lg), free(gold), free(seq);
        }
        if (tp > 1)
            rm_rf(out);
    }
    for (int i = 0; i < 8; i++)
        free(tp1[i]);
}

static void test_fixtures(void)
{
    const char *qshard = getenv("QSHARD") ? getenv("QSHARD") : "build/qshard";
    char path[512], *buf = NULL;
    size_t len;
    snprintf(path, sizeof(path), "%s/models/INDEX.json", data_dir);
    CHECK_MSG(access(qshard, X_OK) == 0, "converter %s not found (set QSHARD)", qshard);
    if (access(qshard, X_OK) != 0)
        return;
    CHECK_MSG(rt_file_read(path, 1 << 24, &buf, &len) == RT_IO_ERR_NONE, "cannot read %s", path);
    if (!buf)
        return;
    cJSON *root = cJSON_ParseWithLength(buf, len);
    const cJSON *models = cJSON_GetObjectItemCaseSensitive(root, "models");
    CHECK_MSG(cJSON_IsArray(models) && cJSON_GetArraySize(models) > 0, "%s: no models", path);
    const cJSON *m;
    cJSON_ArrayForEach(m, models)
    {
        const cJSON *g = cJSON_GetObjectItemCaseSensitive(m, "twin_group");
        bool first = true; /* of its twin group */
        for (const cJSON *e = models->child; cJSON_IsString(g) && e != m; e = e->next)
            first = first && !cJSON_Compare(g, cJSON_GetObjectItemCaseSensitive(e, "twin_group"), 1);
        test_fixture(m, qshard, first);
    }
    cJSON_Delete(root);
    free(buf);
}

// --- part 3: a per-channel AWQ checkpoint (group_size -1) through the real converter -------------

static const struct st_entry *pc_find(const struct st_entry *e, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(e[i].name, name))
            return &e[i];
    return NULL;
}

/* AutoAWQ GEMM packing (awq/modules/linear/gemm.py, pack): int32 word c of a row holds columns
 * 8c + order[j] at bits 4j, order = {0, 2, 4, 6, 1, 3, 5, 7}; for qweight [K, N/8] and qzeros
 * [K/G, N/8] alike. Unpacked here, independently of the converter's decoder, to codes [rows][N]. */
static bool pc_unpack_gemm(const struct st_entry *t, int rows, int N, uint8_t *out)
{
    static const int order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    if (!t || strcmp(t->dtype, "I32") || t->n_dims != 2 || t->shape[0] != rows ||
        t->shape[1] * 8 != N)
        return false;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < N / 8; c++) {
            uint32_t w;
            memcpy(&w, (const uint8_t *)t->data + ((size_t)r * (N / 8) + c) * 4, 4);
            for (int j = 0; j < 8; j++)
                out[(size_t)r * N + 8 * c + order[j]] = (w >> (4 * j)) & 15;
        }
    return true;
}

/* One per-channel linear of the written checkpoint as a canonical qlin with G = K. */
static bool pc_qlin(struct qlin *l, const struct st_entry *e, int n, const char *prefix, int K,
                    int N)
{
    char nm[256];
    l->K = K, l->N = N;
    l->q = xcalloc((size_t)K * N, 1);
    l->z = xcalloc((size_t)N, 1);
    l->s = xcalloc((size_t)N, 2);
    snprintf(nm, sizeof(nm), "%s.qweight", prefix);
    bool ok = pc_unpack_gemm(pc_find(e, n, nm), K, N, l->q);
    snprintf(nm, sizeof(nm), "%s.qzeros", prefix);
    ok = ok && pc_unpack_gemm(pc_find(e, n, nm), 1, N, l->z);
    snprintf(nm, sizeof(nm), "%s.scales", prefix);
    const struct st_entry *s = pc_find(e, n, nm);
    ok = ok && s && !strcmp(s->dtype, "F16") && s->n_dims == 2 && s->shape[0] == 1 &&
         s->shape[1] == N;
    if (ok)
        memcpy(l->s, s->data, (size_t)N * 2);
    CHECK_MSG(ok, "per-channel: linear %s [%d, %d] not as built", prefix, K, N);
    return ok;
}

/* A float tensor of the written checkpoint as fp32 (F16 or F32 sources). */
static float *pc_floats(const struct st_entry *e, int n, const char *name, size_t count)
{
    const struct st_entry *t = pc_find(e, n, name);
    float *v = xcalloc(count, 4);
    bool f16 = t && !strcmp(t->dtype, "F16"), f32 = t && !strcmp(t->dtype, "F32");
    bool ok = (f16 && t->size == count * 2) || (f32 && t->size == count * 4);
    CHECK_MSG(ok, "per-channel: %s missing or not F16/F32 of %zu elements", name, count);
    for (size_t i = 0; ok && i < count; i++) {
        uint16_t hbits;
        if (f16) {
            memcpy(&hbits, (const uint8_t *)t->data + 2 * i, 2);
            v[i] = ref_f16_to_f32(hbits);
        } else {
            memcpy(&v[i], (const uint8_t *)t->data + 4 * i, 4);
        }
    }
    return v;
}

/*
 * Per-channel AWQ end to end: llama-gqa-gemm rewritten as a group_size -1 checkpoint (every
 * quantized linear keeps its codes and takes its group 0 zeros and scales for all K rows, so
 * scales/qzeros are [1, N]); converted with the real converter at TP 1..4 (3 must be refused:
 * 4 heads); logits of a fixed prompt from rt_exec_open/rt_exec_forward_seq compared TP-N vs TP-1
 * and TP-1 vs d_forward (fp64) over the dequantized per-channel weights, unpacked here from the
 * written GEMM tensors; greedy 16-token continuations compared too.
 */
/* Dimensions of the per-channel checkpoint (from the source config). */
struct pc_dims {
    int H, I, V, L, nh, nkv, hd;
    double theta;
    bool tie;
};

/* llama-gqa-gemm's tensors with every scales / qzeros cut to group 0 ([1, N]) into *e[*n], and
 * dir/model.safetensors + dir/config.json (group_size -1) written from them. */
static bool pc_write_checkpoint(const char *base, const char *dir, struct st_entry **out, int *n_out,
                                struct pc_dims *d)
{
    char path[700];
    struct cvt_source *src = NULL;
    qs_log_set_level(QS_LOG_ERROR); /* the fixture has no tokenizer: expected, not news */
    CHECK(cvt_source_open(base, &src) == CVT_ERR_NONE);
    struct st_entry *e = NULL;
    int n = 0, n_q;
    CHECK(st_read_model(base, &e, &n));
    qs_log_set_level(QS_LOG_WARN);
    if (!src || !e) {
        cvt_source_close(src);
        st_free(e, n);
        return false;
    }
    const struct cvt_hf_config *cfg = cvt_source_config(src);
    *d = (struct pc_dims){(int)cfg->hidden_size, (int)cfg->intermediate_size,
                          (int)cfg->vocab_size, (int)cfg->num_hidden_layers,
                          (int)cfg->num_attention_heads, (int)cfg->num_key_value_heads,
                          (int)cfg->head_dim, cfg->rope_theta, false};
    cvt_source_close(src);
    n_q = st_per_channel(e, n);
    *out = e, *n_out = n;
    CHECK_MSG(n_q == 2 * 7 * d->L, "per-channel: %d grouped scales/qzeros, want %d", n_q, 14 * d->L);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    CHECK(write_safetensors(path, e, n));
    snprintf(path, sizeof(path), "%s/config.json", base);
    char *cbuf = NULL;
    size_t clen = 0;
    CHECK(rt_file_read(path, 1 << 20, &cbuf, &clen) == RT_IO_ERR_NONE);
    cJSON *cj = cbuf ? cJSON_ParseWithLength(cbuf, clen) : NULL;
    free(cbuf);
    cJSON *qc = cJSON_GetObjectItemCaseSensitive(cj, "quantization_config");
    CHECK(qc && cJSON_ReplaceItemInObject(qc, "group_size", cJSON_CreateNumber(-1)));
    d->tie = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cj, "tie_word_embeddings"));
    char *cjs = cJSON_Print(cj);
    cJSON_Delete(cj);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    CHECK(f && cjs && fputs(cjs, f) >= 0);
    if (f)
        fclose(f);
    free(cjs);
    return true;
}

/* The reference model of the written tensors: G = K for every linear (d_forward takes one G,
 * so every K must agree). Frees e. false when the shapes do not allow it. */
static bool pc_reference(struct st_entry *e, int n, const struct pc_dims *d, struct syn_model *m)
{
    const int H = d->H, I = d->I, V = d->V, L = d->L, qd = d->nh * d->hd, kvd = d->nkv * d->hd;
    CHECK_MSG(H == qd && H == I, "per-channel: H %d, heads x head_dim %d, I %d differ", H, qd, I);
    struct syn_spec sp = {"llama", H, I, L, d->nh, d->nkv, d->hd, V, H, 0, 0, 0,
                          d->tie, false, false, false, false, d->theta};
    memset(m, 0, sizeof(*m));
    m->sp = sp;
    m->layers = xcalloc((size_t)L, sizeof(*m->layers));
    bool ok = H == qd && H == I;
    char nm[200];
    for (int l = 0; ok && l < L; l++) {
        struct syn_layer *y = &m->layers[l];
        static const char *lin[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                     "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                     "mlp.down_proj"};
        struct qlin *ql[7] = {&y->q, &y->k, &y->v, &y->o, &y->gate, &y->up, &y->down};
        int kn[7][2] = {{H, qd}, {H, kvd}, {H, kvd}, {qd, H}, {H, I}, {H, I}, {I, H}};
        for (int j = 0; j < 7; j++) {
            snprintf(nm, sizeof(nm), "model.layers.%d.%s", l, lin[j]);
            ok = pc_qlin(ql[j], e, n, nm, kn[j][0], kn[j][1]) && ok;
        }
        snprintf(nm, sizeof(nm), "model.layers.%d.input_layernorm.weight", l);
        y->attn_norm = pc_floats(e, n, nm, (size_t)H);
        snprintf(nm, sizeof(nm), "model.layers.%d.post_attention_layernorm.weight", l);
        y->mlp_norm = pc_floats(e, n, nm, (size_t)H);
    }
    m->final_norm = pc_floats(e, n, "model.norm.weight", (size_t)H);
    float *emb = pc_floats(e, n, "model.embed_tokens.weight", (size_t)V * H);
    m->embed = xcalloc((size_t)V * H, 2);
    for (size_t i = 0; i < (size_t)V * H; i++) /* the fp16 fixture: exact */
        m->embed[i] = ref_f32_to_f16(emb[i]);
    free(emb);
    if (!d->tie) {
        float *hd32 = pc_floats(e, n, "lm_head.weight", (size_t)V * H);
        m->lm_head = xcalloc((size_t)V * H, 2);
        for (size_t i = 0; i < (size_t)V * H; i++)
            m->lm_head[i] = ref_f32_to_f16(hd32[i]);
        free(hd32);
    }
    st_free(e, n);
    return ok;
}

enum { PC_T = 10, PC_NG = 16 };
static const int32_t pc_ids[PC_T] = {1, 17, 42, 99, 5, 63, 120, 8, 77, 31};

/* Convert dir at TP 1..4 and compare each with the fp64 reference (dlg [PC_T][V], greedy). */
static void pc_check_tps(const char *qshard, const char *dir, const struct pc_dims *d,
                         const double *dlg, const int32_t *ref_greedy)
{
    const int V = d->V;
    char out[600], cmd[2048], path[700];
    float *tp1 = NULL;
    int n_ok = 0;
    for (int tp = 1; tp <= 4; tp++) {
        snprintf(out, sizeof(out), "%s/perchan-tp%d", tmp_root, tp);
        snprintf(cmd, sizeof(cmd), "'%s' convert '%s' '%s' --tp %d -q 2>'%s.log'", qshard, dir,
                 out, tp, out);
        int rc = run_cmd(cmd);
        if (!tp_possible(d->nh, d->nkv, d->hd, d->H, tp)) {
            char *log = NULL;
            size_t ll = 0;
            snprintf(path, sizeof(path), "%s.log", out);
            rt_file_read(path, 1 << 20, &log, &ll);
            bool hint = log && strstr(log, "valid --tp values for this model: 1 2 4");
            printf("  per-channel TP-%d: refused, exit %d, hint %s\n", tp, rc,
                   hint ? "names 1 2 4" : "MISSING");
            CHECK_MSG(rc == 2, "per-channel: convert --tp %d should exit 2, got %d", tp, rc);
            CHECK_MSG(hint, "per-channel: --tp %d refusal lacks the valid-tp hint: %s", tp,
                      log ? log : "(no log)");
            free(log);
            rm_rf(out);
            continue;
        }
        CHECK_MSG(rc == 0, "per-channel: convert --tp %d exited %d (log %s.log)", tp, rc, out);
        if (rc)
            continue;
        int32_t greedy[PC_NG];
        float *lg = fixture_run(out, pc_ids, PC_T, V, greedy, NULL);
        if (!lg)
            continue;
        n_ok++;
        int same = memcmp(greedy, ref_greedy, sizeof(greedy)) == 0;
        double er = rel_l2(lg, dlg, (size_t)PC_T * V);
        printf("  per-channel TP-%d vs fp64 of the dequantized source: rel L2 %.2e, greedy %s", tp,
               er, same ? "identical" : "DIFFERS");
        CHECK_MSG(er <= 1e-5, "per-channel TP-%d vs fp64 reference: rel L2 %g", tp, er);
        CHECK_MSG(same, "per-channel TP-%d: greedy continuation differs from the fp64 one", tp);
        if (tp == 1) {
            tp1 = lg;
            lg = NULL;
        } else if (tp1) {
            double dd = rel_l2_f(lg, tp1, (size_t)PC_T * V);
            printf(", vs TP-1 %.2e", dd);
            CHECK_MSG(dd <= 1e-5, "per-channel TP-%d vs TP-1: rel L2 %g", tp, dd);
        }
        printf("\n");
        free(lg);
        if (tp > 1)
            rm_rf(out);
    }
    CHECK_MSG(n_ok == 3, "per-channel: %d of TP 1, 2, 4 ran", n_ok);
    free(tp1);
}

static void test_per_channel(const char *qshard)
{
    const char *base = "tests/data/models/llama-gqa-gemm";
    char dir[512], path[700];
    struct stat st;
    snprintf(path, sizeof(path), "%s/config.json", base);
    if (stat(path, &st) != 0) {
        printf("  per-channel: %s absent, skipped\n", base);
        return;
    }
    snprintf(dir, sizeof(dir), "%s/perchan", tmp_root);
    mkdir(dir, 0777);
    struct st_entry *e = NULL;
    int n = 0;
    struct pc_dims d;
    if (!pc_write_checkpoint(base, dir, &e, &n, &d))
        return;
    struct syn_model m;
    const bool ok = pc_reference(e, n, &d, &m);
    /* fp64 reference: prompt logits and a 16-token greedy continuation */
    const int V = d.V;
    int32_t seq[PC_T + PC_NG], ref_greedy[PC_NG];
    memcpy(seq, pc_ids, sizeof(pc_ids));
    double *dref = xcalloc((size_t)(PC_T + PC_NG) * V, 8), *dlg = xcalloc((size_t)PC_T * V, 8);
    float *row = xcalloc((size_t)V, 4);
    for (int i = 0; ok && i < PC_NG; i++) {
        d_forward(&m, seq, PC_T + i, dref);
        if (i == 0)
            memcpy(dlg, dref, (size_t)PC_T * V * 8);
        for (int v = 0; v < V; v++)
            row[v] = (float)dref[(size_t)(PC_T + i - 1) * V + v];
        ref_greedy[i] = seq[PC_T + i] = ref_argmax(row, V, V);
    }
    free(row), free(dref);
    if (ok)
        pc_check_tps(qshard, dir, &d, dlg, ref_greedy);
    free(dlg);
    syn_free(&m);
}

int main(void)
{
    T_INIT("model_fixtures");
    qs_log_set_level(QS_LOG_WARN); /* no start-up info lines between the results */
    if (!t_tmp_root("test-model-fixtures"))
        return 1;
    test_fixtures();
    test_per_channel(getenv("QSHARD") ? getenv("QSHARD") : "build/qshard");
    rm_rf(tmp_root);
    return t_done();
}
