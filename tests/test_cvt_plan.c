/*
 * test_cvt_plan.c - the converter's tensor-parallel plan (convert/cvt_plan.c) at real shapes.
 *
 * Real configs (tests/data/real-configs/, provenance there) are parsed with the input side's
 * cvt_config_parse() and planned for the tp values users run: Llama-2-7B tp 1/2/4/8 (11008 =
 * 86 groups: padded at tp 4 and 8), Llama-3.1-70B tp 8, Qwen2.5-72B tp 1/2/4/8 (29568 = 231
 * groups), MAmmoTH-7B (vocab 32001) tp 2, Mistral-7B tp 16 (kv heads replicated), and
 * impossible tp values. Every expected number is computed here from the DESIGN 5 rules by
 * separate code (plain loops, not the plan's formulas), or written out by hand where the brief
 * fixes it (I_r 2816 / 1408, 29696).
 * Synthetic name lists cover the tensor ledger: unknown / missing tensors, rotary inv_freq,
 * tied embeddings in every on-disk form (docs/FORMATS.md P08), modules_to_not_convert (P09), the
 * Mixtral router (P10), Qwen2 biases (P11), kv replication and its refusals (P05).
 *
 * Run: ./build/test_cvt_plan (from the repository root).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cvt.h"
#include "fmt_names.h"
#include "qs_log.h"
#include "t.h"
#include "t_file.h" /* t_slurp */

/* q/k/v biases by config (cvt_dims.bias_roles) */
#define QKV_BIAS(d) (((d)->bias_roles & CVT_ROLE_BIT(FMT_N_QKV)) != 0)

#define CFG_DIR "tests/data/real-configs/"

/* --- helpers ----------------------------------------------------------------------------- */

/* Parse tests/data/real-configs/<dir>/config.json into dims. */
static bool load_dims(const char *dir, struct cvt_dims *d)
{
    char path[512];
    size_t len = 0;
    snprintf(path, sizeof(path), CFG_DIR "%s/config.json", dir);
    char *json = t_slurp(path, &len);
    if (!json) {
        fprintf(stderr, "cannot read %s\n", path);
        return false;
    }
    struct cvt_hf_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    enum cvt_err e = cvt_config_parse(path, json, len, NULL, 0, NULL, 0, NULL, 0, &cfg);
    free(json);
    if (e) {
        fprintf(stderr, "%s: %s\n", path, cvt_err_str(e));
        return false;
    }
    e = cvt_dims_from_hf(&cfg, d);
    cvt_config_free(&cfg);
    return e == CVT_ERR_NONE;
}

/* Smallest multiple of both a and b, by counting up (independent of the plan's gcd). */
static long lcm_slow(long a, long b)
{
    long m = a;
    while (m % b)
        m += a;
    return m;
}

/* Largest common divisor of a and b, by counting down (independent of the plan's gcd). */
static long gcd_slow(long a, long b)
{
    long g = a < b ? a : b;
    while (a % g || b % g)
        g--;
    return g;
}

/* Smallest multiple of `unit` that is >= x, by counting up. */
static long round_up_slow(long x, long unit)
{
    long m = 0;
    while (m < x)
        m += unit;
    return m;
}

/* Bytes of one packed W4 linear [K, N] with group G: codes K*N/2, fp16 scales, 4-bit zeros. */
static long long w4_bytes(long long K, long long N, long long G)
{
    return K * N / 2 + (K / G) * N * 2 + (K / G) * N / 2;
}

/* Expected per-rank numbers, derived in this file from the DESIGN 5 rules. */
struct expect {
    long nq_r, nkv_r, I_r, I_pad, V_r;
    long qkv_n;
};

static struct expect expect_for(const struct cvt_dims *d, int tp)
{
    struct expect x;
    x.nq_r = d->n_heads / tp;
    x.nkv_r = tp <= d->n_kv_heads ? d->n_kv_heads / tp : 1;
    long U = d->group_size > 0 ? lcm_slow(d->group_size, 64) : 64;
    x.I_pad = round_up_slow(d->intermediate, U * tp);
    x.I_r = x.I_pad / tp;
    x.V_r = round_up_slow(d->vocab, tp) / tp;
    x.qkv_n = (x.nq_r + 2 * x.nkv_r) * d->head_dim;
    return x;
}

/* Check one dense (llama/mistral/qwen2) plan against independently computed expectations. */
static void check_dense_plan(const char *what, const struct cvt_dims *d, int tp)
{
    struct cvt_plan *p = NULL;
    enum cvt_err e = cvt_plan_build(d, NULL, tp, &p);
    CHECK_MSG(e == CVT_ERR_NONE && p, "%s tp %d: %s", what, tp, qs_log_last());
    if (!p)
        return;
    struct expect x = expect_for(d, tp);
    long long H = d->hidden, G = d->group_size, I = d->intermediate, V = d->vocab;
    long long hd = d->head_dim;
    CHECK_EQ_INT(p->heads_per_rank, x.nq_r);
    CHECK_EQ_INT(p->kv_heads_per_rank, x.nkv_r);
    CHECK_EQ_INT(p->inter_per_rank, x.I_r);
    CHECK_EQ_INT(p->inter_padded, x.I_pad);
    CHECK_EQ_INT(p->vocab_per_rank, x.V_r);
    long long sum_codes = 0;
    for (int r = 0; r < tp; r++) {
        const struct cvt_out *o;
        char nm[160];
        /* fused qkv: [H, (nq_r + 2 nkv_r) hd], columns [q_r | k_r | v_r] */
        o = cvt_plan_find(p, r, "model.layers.0.self_attn.qkv_proj");
        CHECK(o && o->kind == CVT_OUT_W4);
        if (o) {
            CHECK_EQ_INT(o->rows, H);
            CHECK_EQ_INT(o->cols, x.qkv_n);
            CHECK_EQ_INT(o->n_segs, 3);
            long kv_head = tp <= d->n_kv_heads ? r * x.nkv_r : r / (tp / d->n_kv_heads);
            CHECK_EQ_INT(o->segs[0].src_c0, r * x.nq_r * hd);
            CHECK_EQ_INT(o->segs[0].n_cols, x.nq_r * hd);
            CHECK_EQ_INT(o->segs[1].src_c0, kv_head * hd);
            CHECK_EQ_INT(o->segs[1].dst_c0, x.nq_r * hd);
            CHECK_EQ_INT(o->segs[2].src_c0, kv_head * hd);
            CHECK_EQ_INT(o->segs[2].dst_c0, (x.nq_r + x.nkv_r) * hd);
            CHECK(!strcmp(p->srcs[o->segs[1].src].name, "model.layers.0.self_attn.k_proj"));
            CHECK(!strcmp(p->srcs[o->segs[2].src].name, "model.layers.0.self_attn.v_proj"));
        }
        /* row-parallel o_proj: [nq_r hd, H] */
        o = cvt_plan_find(p, r, "model.layers.0.self_attn.o_proj");
        CHECK(o && o->rows == x.nq_r * hd && o->cols == H && o->segs[0].src_r0 == r * x.nq_r * hd);
        /* its local group size: the largest common divisor of G and K_r (DESIGN 4) */
        long long G_o = gcd_slow(G, x.nq_r * hd);
        if (o)
            CHECK_MSG(o->group == G_o, "%s tp %d: o_proj group %lld, want %lld", what, tp,
                      (long long)o->group, G_o);
        /* gate_up [H, 2 I_r]; down [I_r, H]; rank r holds [r I_r, min((r+1) I_r, I)) */
        long long lo = r * x.I_r, hi = (r + 1) * x.I_r < I ? (r + 1) * x.I_r : I;
        long long held = hi > lo ? hi - lo : 0;
        snprintf(nm, sizeof(nm), "model.layers.%d.mlp.gate_up_proj", d->n_layers - 1);
        o = cvt_plan_find(p, r, nm);
        CHECK(o && o->rows == H && o->cols == 2 * x.I_r);
        if (o && held) {
            CHECK_EQ_INT(o->n_segs, 2);
            CHECK_EQ_INT(o->segs[0].src_c0, lo);
            CHECK_EQ_INT(o->segs[0].n_cols, held);
            CHECK_EQ_INT(o->segs[1].dst_c0, x.I_r);
            CHECK_EQ_INT(o->segs[1].n_cols, held);
        }
        o = cvt_plan_find(p, r, "model.layers.0.mlp.down_proj");
        CHECK(o && o->rows == x.I_r && o->cols == H);
        if (o && held) {
            CHECK_EQ_INT(o->segs[0].src_r0, lo);
            CHECK_EQ_INT(o->segs[0].n_rows, held);
            sum_codes += o->segs[0].n_rows;
        }
        /* vocab-parallel embedding and lm_head */
        long long vlo = r * x.V_r, vhi = (r + 1) * x.V_r < V ? (r + 1) * x.V_r : V;
        o = cvt_plan_find(p, r, "model.embed_tokens.weight");
        CHECK(o && o->kind == CVT_OUT_MAT_F16 && o->rows == x.V_r && o->cols == H);
        if (o)
            CHECK(o->n_segs == 1 && o->segs[0].src_r0 == vlo && o->segs[0].n_rows == vhi - vlo);
        o = cvt_plan_find(p, r, "lm_head.weight");
        CHECK(d->tie_word_embeddings ? o == NULL : o != NULL);
        /* biases: Qwen2 q/k/v bias fused with the columns; none on o_proj */
        o = cvt_plan_find(p, r, "model.layers.0.self_attn.qkv_proj.bias");
        CHECK(QKV_BIAS(d) ? (o && o->cols == x.qkv_n && o->n_segs == 3) : o == NULL);
        CHECK(cvt_plan_find(p, r, "model.layers.0.self_attn.o_proj.bias") == NULL);
        /* per-rank data bytes, summed here from the DESIGN 5 table */
        long long bytes = x.V_r * H * 2 * (d->tie_word_embeddings ? 1 : 2) + H * 4;
        long long layer = 2 * H * 4 + w4_bytes(H, x.qkv_n, G) + w4_bytes(x.nq_r * hd, H, G_o) +
                          w4_bytes(H, 2 * x.I_r, G) + w4_bytes(x.I_r, H, G) +
                          (QKV_BIAS(d) ? x.qkv_n * 4 : 0);
        bytes += layer * d->n_layers;
        CHECK_MSG((long long)p->ranks[r].data_bytes == bytes, "%s tp %d rank %d: %llu vs %lld",
                  what, tp, r, (unsigned long long)p->ranks[r].data_bytes, bytes);
        CHECK(p->ranks[r].file_bytes >= p->ranks[r].data_bytes);
    }
    CHECK_EQ_INT(sum_codes, I); /* every intermediate row lands on exactly one rank */
    cvt_plan_free(p);
}

/* --- real configs ------------------------------------------------------------------------ */

static void test_llama2_7b(void)
{
    struct cvt_dims d;
    CHECK(load_dims("twhoool02--Llama-2-7b-chat-hf-AWQ", &d));
    CHECK_EQ_INT(d.intermediate, 11008);
    CHECK_EQ_INT(d.group_size, 128);
    for (int tp = 1; tp <= 8; tp *= 2)
        check_dense_plan("Llama-2-7B", &d, tp);
    /* The brief's numbers, by hand: 11008 = 86 groups; tp 4 -> 88 groups = 11264, 22 per rank. */
    struct cvt_plan *p = NULL;
    CHECK(cvt_plan_build(&d, NULL, 4, &p) == CVT_ERR_NONE);
    if (p) {
        CHECK_EQ_INT(p->inter_padded, 11264);
        CHECK_EQ_INT(p->inter_per_rank, 2816);
        /* rank 3 holds [8448, 11008): 2560 rows + 256 zero rows */
        const struct cvt_out *o = cvt_plan_find(p, 3, "model.layers.31.mlp.down_proj");
        CHECK(o && o->segs[0].src_r0 == 8448 && o->segs[0].n_rows == 2560 && o->rows == 2816);
        char *txt = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&txt, &len);
        cvt_plan_print(p, f);
        fclose(f);
        CHECK(txt && strstr(txt, "I_pad = 11264"));
        CHECK(txt && strstr(txt, "rank 3 holds intermediate [8448, 11008) + 256 zero padding"));
        free(txt);
        cvt_plan_free(p);
    }
    CHECK(cvt_plan_build(&d, NULL, 8, &p) == CVT_ERR_NONE);
    if (p) {
        CHECK_EQ_INT(p->inter_padded, 11264);
        CHECK_EQ_INT(p->inter_per_rank, 1408);
        cvt_plan_free(p);
    }
    CHECK(cvt_plan_build(&d, NULL, 2, &p) == CVT_ERR_NONE);
    if (p) {
        CHECK_EQ_INT(p->inter_padded, 11008); /* 43 groups per rank: no padding at tp 2 */
        cvt_plan_free(p);
    }
    /* Impossible tp: 32 heads. The valid list is derived here: t | 32 (MHA: kv too), o_proj
     * K = (32/t)*128 is a multiple of 128, qkv N = 3*(32/t)*128 a multiple of 64. */
    char valid[128] = "";
    for (int t = 1; t <= 32; t++)
        if (32 % t == 0)
            snprintf(valid + strlen(valid), sizeof(valid) - strlen(valid), "%s%d",
                     valid[0] ? " " : "", t);
    int bad_tp[] = {3, 5, 6, 12, 64, 0};
    for (size_t i = 0; i < sizeof(bad_tp) / sizeof(bad_tp[0]); i++) {
        qs_log_clear();
        p = NULL;
        CHECK_EQ_INT(cvt_plan_build(&d, NULL, bad_tp[i], &p), CVT_ERR_TP);
        CHECK(p == NULL);
        if (bad_tp[i] > 0)
            CHECK_MSG(strstr(qs_log_last(), valid) != NULL, "tp %d: %s (want list '%s')",
                      bad_tp[i], qs_log_last(), valid);
    }
    int vals[64];
    int n = cvt_plan_valid_tp(&d, 64, vals, 64);
    CHECK_EQ_INT(n, 6);
    CHECK(n == 6 && vals[0] == 1 && vals[5] == 32);
}

static void test_llama31_70b(void)
{
    struct cvt_dims d;
    CHECK(load_dims("PatronusAI--Llama-3.1-70B-Instruct-AWQ-INT4", &d));
    CHECK_EQ_INT(d.n_kv_heads, 8);
    CHECK_EQ_INT(d.vocab, 128256);
    check_dense_plan("Llama-3.1-70B", &d, 8);
    struct cvt_plan *p = NULL;
    CHECK(cvt_plan_build(&d, NULL, 8, &p) == CVT_ERR_NONE);
    if (p) {
        /* 28672 = 224 groups = 28 per rank: no padding; 8 query + 1 kv head per rank */
        CHECK_EQ_INT(p->inter_per_rank, 3584);
        CHECK_EQ_INT(p->inter_padded, 28672);
        CHECK_EQ_INT(p->ranks[5].kv_head_first, 5);
        const struct cvt_out *o = cvt_plan_find(p, 7, "model.layers.79.self_attn.qkv_proj");
        CHECK(o && o->cols == (8 + 2) * 128);
        cvt_plan_free(p);
    }
}

static void test_qwen25_72b(void)
{
    struct cvt_dims d;
    CHECK(load_dims("LDCC--Qwen2.5-72B-Instruct-ko-AWQ", &d));
    CHECK(QKV_BIAS(&d));
    CHECK_EQ_INT(d.intermediate, 29568);
    int tps[] = {1, 2, 4, 8};
    /* 29568 = 231 groups of 128, odd: every tp > 1 pads to 232 groups = 29696. */
    long want_pad[] = {29568, 29696, 29696, 29696};
    long want_r[] = {29568, 14848, 7424, 3712};
    for (int i = 0; i < 4; i++) {
        check_dense_plan("Qwen2.5-72B", &d, tps[i]);
        struct cvt_plan *p = NULL;
        CHECK(cvt_plan_build(&d, NULL, tps[i], &p) == CVT_ERR_NONE);
        if (!p)
            continue;
        CHECK_EQ_INT(p->inter_padded, want_pad[i]);
        CHECK_EQ_INT(p->inter_per_rank, want_r[i]);
        /* the last rank carries all the padding: 128 zero rows of down_proj */
        const struct cvt_out *o =
            cvt_plan_find(p, tps[i] - 1, "model.layers.0.mlp.down_proj");
        CHECK(o && o->rows - o->segs[0].n_rows == want_pad[i] - 29568);
        cvt_plan_free(p);
    }
}

static void test_mammoth_vocab(void)
{
    struct cvt_dims d;
    CHECK(load_dims("TheBloke--MAmmoTH-7B-AWQ", &d));
    CHECK_EQ_INT(d.vocab, 32001);
    check_dense_plan("MAmmoTH-7B", &d, 2);
    struct cvt_plan *p = NULL;
    CHECK(cvt_plan_build(&d, NULL, 2, &p) == CVT_ERR_NONE);
    if (p) {
        CHECK_EQ_INT(p->vocab_per_rank, 16001);
        const struct cvt_out *o0 = cvt_plan_find(p, 0, "lm_head.weight");
        const struct cvt_out *o1 = cvt_plan_find(p, 1, "lm_head.weight");
        CHECK(o0 && o0->rows == 16001 && o0->segs[0].n_rows == 16001);
        CHECK(o1 && o1->rows == 16001 && o1->segs[0].src_r0 == 16001 &&
              o1->segs[0].n_rows == 16000); /* one zero pad row */
        cvt_plan_free(p);
    }
}

static void test_mistral_kv_replication(void)
{
    struct cvt_dims d;
    CHECK(load_dims("TheBloke--Mistral-7B-v0.1-AWQ", &d));
    check_dense_plan("Mistral-7B", &d, 8);
    check_dense_plan("Mistral-7B", &d, 16);
    struct cvt_plan *p = NULL;
    CHECK(cvt_plan_build(&d, NULL, 16, &p) == CVT_ERR_NONE);
    if (p) {
        CHECK_EQ_INT(p->kv_head_replicas, 2);
        for (int r = 0; r < 16; r++)
            CHECK_EQ_INT(p->ranks[r].kv_head_first, r / 2);
        cvt_plan_free(p);
    }
    /* tp 12: 32 % 12 != 0 -> refused */
    CHECK_EQ_INT(cvt_plan_build(&d, NULL, 12, &p), CVT_ERR_TP);
}

/* --- synthetic models: the tensor ledger ------------------------------------------------- */

static struct cvt_dims tiny(void)
{
    struct cvt_dims d;
    memset(&d, 0, sizeof(d));
    d.arch = cvt_arch_find("llama");
    d.hidden = 256;
    d.intermediate = 1280;
    d.n_layers = 2;
    d.n_heads = 4;
    d.n_kv_heads = 4;
    d.head_dim = 64;
    d.vocab = 1000;
    d.group_size = 128;
    return d;
}

/* A growable list of tensor names. */
struct names {
    int n;
    char *v[512];
};

static void add(struct names *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(struct names *l, const char *fmt, ...)
{
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (l->n < 512)
        l->v[l->n++] = strdup(buf);
}

static void del(struct names *l, const char *name)
{
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->v[i], name)) {
            free(l->v[i]);
            l->v[i] = l->v[--l->n];
            return;
        }
}

static void names_free(struct names *l)
{
    for (int i = 0; i < l->n; i++)
        free(l->v[i]);
    l->n = 0;
}

static void add_awq(struct names *l, const char *module)
{
    add(l, "%s.qweight", module);
    add(l, "%s.qzeros", module);
    add(l, "%s.scales", module);
}

/* Names of an AutoAWQ checkpoint of d (llama / qwen2 / mixtral). */
static void model_names(const struct cvt_dims *d, struct names *l, bool emb, bool lm)
{
    static const char *const attn[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
    char m[200];
    if (emb)
        add(l, "model.embed_tokens.weight");
    if (lm)
        add(l, "lm_head.weight");
    add(l, "model.norm.weight");
    for (int i = 0; i < d->n_layers; i++) {
        add(l, "model.layers.%d.input_layernorm.weight", i);
        add(l, "model.layers.%d.post_attention_layernorm.weight", i);
        for (int j = 0; j < 4; j++) {
            snprintf(m, sizeof(m), "model.layers.%d.self_attn.%s", i, attn[j]);
            add_awq(l, m);
            if (QKV_BIAS(d) && j < 3)
                add(l, "%s.bias", m);
        }
        if (d->arch == cvt_arch_find("mixtral")) {
            add(l, "model.layers.%d.block_sparse_moe.gate.weight", i);
            for (int x = 0; x < d->n_experts; x++)
                for (int w = 1; w <= 3; w++) {
                    snprintf(m, sizeof(m), "model.layers.%d.block_sparse_moe.experts.%d.w%d", i,
                             x, w);
                    add_awq(l, m);
                }
        } else {
            static const char *const mlp[] = {"gate_proj", "up_proj", "down_proj"};
            for (int j = 0; j < 3; j++) {
                snprintf(m, sizeof(m), "model.layers.%d.mlp.%s", i, mlp[j]);
                add_awq(l, m);
            }
        }
    }
}

static enum cvt_err plan_names(const struct cvt_dims *d, const struct names *l, int tp,
                               struct cvt_plan **p)
{
    struct cvt_name_list nl = {.n = l->n, .names = (const char *const *)l->v};
    qs_log_clear();
    return cvt_plan_build(d, &nl, tp, p);
}

/* --- the architecture registry and a family defined here -------------------------------- */

/* A family the converter does not ship, written the way docs/CONVERT.md section 4 says a new one
 * is added: other HF names (GPT-style "transformer.h.%d", fused attention split into separate
 * q/k/v modules called "attn.wq" ...), the same canonical outputs. */
static const struct cvt_arch_linear toy_attn[2] = {
    {FMT_N_QKV, FMT_SPLIT_COLUMN, 3,
     {{"attn.wq", CVT_AXIS_HIDDEN, CVT_AXIS_Q},
      {"attn.wk", CVT_AXIS_HIDDEN, CVT_AXIS_KV},
      {"attn.wv", CVT_AXIS_HIDDEN, CVT_AXIS_KV}}},
    {FMT_N_O, FMT_SPLIT_ROW, 1, {{"attn.wo", CVT_AXIS_Q, CVT_AXIS_HIDDEN}}},
};
static const struct cvt_arch_linear toy_mlp[2] = {
    {FMT_N_GATE_UP, FMT_SPLIT_COLUMN, 2,
     {{"ffn.w_in", CVT_AXIS_HIDDEN, CVT_AXIS_INTER}, {"ffn.w_gate", CVT_AXIS_HIDDEN,
                                                       CVT_AXIS_INTER}}},
    {FMT_N_DOWN, FMT_SPLIT_ROW, 1, {{"ffn.w_out", CVT_AXIS_INTER, CVT_AXIS_HIDDEN}}},
};
static const struct cvt_arch_step toy_layer[] = {
    {CVT_ARCH_OP_NORM, FMT_N_ATTN_NORM, "ln_1.weight", false, 0, NULL},
    {CVT_ARCH_OP_LINEARS, FMT_N_COUNT, NULL, false, 2, toy_attn},
    {CVT_ARCH_OP_NORM, FMT_N_MLP_NORM, "ln_2.weight", false, 0, NULL},
    {CVT_ARCH_OP_LINEARS, FMT_N_COUNT, NULL, false, 2, toy_mlp},
};
static const struct cvt_arch toy = {
    .name = "toy", .hf_class = "ToyForCausalLM", .model_type = "toy", .rope_theta = 10000.0,
    .max_position_embeddings = 2048, .rms_norm_eps = 1e-6, .hidden_act = "silu",
    .hf_embed = "transformer.wte", .hf_lm_head = "lm_head",
    .hf_final_norm = "transformer.ln_f.weight", .hf_layer = "transformer.h.%d", .n_steps = 4,
    .steps = toy_layer,
};

static void test_registry(void)
{
    /* every descriptor is found by each of its three names; the lists name them in order */
    char cls[512], mt[512], want_cls[512] = "", want_mt[512] = "";
    CHECK_EQ_INT(cvt_arch_count(), 13);
    for (int i = 0; i < cvt_arch_count(); i++) {
        const struct cvt_arch *a = cvt_arch_at(i);
        /* by name: the first descriptor of that name (Falcon has two spellings of one model,
         * FalconForCausalLM and RWForCausalLM, that write the same runtime architecture) */
        const struct cvt_arch *byname = a ? cvt_arch_find(a->name) : NULL;
        const struct cvt_arch *bymt = a ? cvt_arch_by_model_type(a->model_type) : NULL;
        /* ... and by model_type too (MPT's two classes share "mpt") */
        CHECK(a && byname && strcmp(byname->name, a->name) == 0 &&
              cvt_arch_by_hf_class(a->hf_class) == a && bymt &&
              strcmp(bymt->name, a->name) == 0);
        snprintf(want_cls + strlen(want_cls), sizeof(want_cls) - strlen(want_cls), "%s%s",
                 i ? ", " : "", a->hf_class);
        if (bymt == a) /* a shared model_type is listed once, by its first descriptor */
            snprintf(want_mt + strlen(want_mt), sizeof(want_mt) - strlen(want_mt), "%s%s",
                     i ? ", " : "", a->model_type);
        /* the descriptor's steps are well-formed: linear roles for linears, one row part */
        for (int s = 0; s < a->n_steps; s++) {
            const struct cvt_arch_step *st = &a->steps[s];
            CHECK(st->hf || st->op == CVT_ARCH_OP_LINEARS);
            if (st->op == CVT_ARCH_OP_NORM || st->op == CVT_ARCH_OP_ROUTER ||
                st->op == CVT_ARCH_OP_HEAD_NORM)
                CHECK(!fmt_name_is_linear(st->role));
            for (int j = 0; st->op == CVT_ARCH_OP_LINEARS && j < st->n_linears; j++) {
                const struct cvt_arch_linear *l = &st->linears[j];
                CHECK(fmt_name_is_linear(l->role));
                CHECK(l->split == FMT_SPLIT_COLUMN || (l->split == FMT_SPLIT_ROW &&
                                                       l->n_parts == 1));
                CHECK(l->n_parts >= 1 && l->n_parts <= CVT_ARCH_MAX_PARTS);
            }
        }
    }
    CHECK(cvt_arch_at(-1) == NULL && cvt_arch_at(13) == NULL && cvt_arch_find("gemma") == NULL);
    CHECK(cvt_arch_by_hf_class("llama") == NULL && cvt_arch_by_model_type(NULL) == NULL);
    cvt_arch_list(true, cls, sizeof(cls));
    cvt_arch_list(false, mt, sizeof(mt));
    CHECK_EQ_STR(cls, want_cls);
    CHECK_EQ_STR(mt, want_mt);
    CHECK_EQ_STR(mt, "llama, mistral, qwen2, qwen3, phi3, mixtral, qwen3_moe, falcon, RefinedWebModel, "
                     "mpt, gemma2, gemma3_text");

    /* the toy family: HF names of its own in, the canonical outputs of the llama family out */
    struct cvt_dims d = tiny();
    d.arch = &toy;
    struct names l = {0};
    add(&l, "transformer.wte.weight");
    add(&l, "lm_head.weight");
    add(&l, "transformer.ln_f.weight");
    static const char *const lin[] = {"attn.wq", "attn.wk", "attn.wv", "attn.wo",
                                      "ffn.w_in", "ffn.w_gate", "ffn.w_out"};
    for (int i = 0; i < d.n_layers; i++) {
        add(&l, "transformer.h.%d.ln_1.weight", i);
        add(&l, "transformer.h.%d.ln_2.weight", i);
        for (int j = 0; j < 7; j++) {
            char m[96];
            snprintf(m, sizeof(m), "transformer.h.%d.%s", i, lin[j]);
            add_awq(&l, m);
        }
    }
    struct cvt_plan *p = NULL, *q = NULL;
    CHECK_EQ_INT(plan_names(&d, &l, 2, &p), CVT_ERR_NONE);
    struct cvt_dims dl = tiny();
    struct names ll = {0};
    model_names(&dl, &ll, true, true);
    CHECK_EQ_INT(plan_names(&dl, &ll, 2, &q), CVT_ERR_NONE);
    for (int r = 0; p && q && r < 2; r++) {
        /* the same outputs as the llama plan, but for the order of the norms in a layer */
        CHECK_EQ_INT(p->ranks[r].n_outs, q->ranks[r].n_outs);
        for (int j = 0; j < p->ranks[r].n_outs; j++) {
            const struct cvt_out *o = &p->ranks[r].outs[j];
            const struct cvt_out *x = cvt_plan_find(q, r, o->name);
            CHECK_MSG(x && x->kind == o->kind && x->split == o->split && x->rows == o->rows &&
                          x->cols == o->cols && x->group == o->group && x->n_segs == o->n_segs,
                      "toy output %s differs from the llama plan's", o->name);
            CHECK_MSG(fmt_name_parse(o->name, NULL, NULL, NULL, NULL), "%s not canonical",
                      o->name);
            for (int k = 0; x && k < o->n_segs; k++)
                CHECK(!memcmp(&o->segs[k].src_r0, &x->segs[k].src_r0, 6 * sizeof(int64_t)));
        }
        /* the gate part is "ffn.w_gate" here: it lands second in gate_up_proj */
        const struct cvt_out *gu = cvt_plan_find(p, r, "model.layers.1.mlp.gate_up_proj");
        CHECK(gu && gu->n_segs == 2 &&
              !strcmp(p->srcs[gu->segs[1].src].name, "transformer.h.1.ffn.w_gate"));
    }
    cvt_plan_free(p);
    cvt_plan_free(q);
    p = NULL;
    /* its own names are required: a llama checkpoint is unknown to it */
    CHECK_EQ_INT(plan_names(&d, &ll, 1, &p), CVT_ERR_MISSING_TENSOR);
    CHECK(strstr(qs_log_last(), "transformer.wte.weight") != NULL);
    names_free(&l);
    names_free(&ll);
}

static void test_ledger(void)
{
    struct cvt_dims d = tiny();
    struct names l = {0};
    struct cvt_plan *p = NULL;
    model_names(&d, &l, true, true);
    CHECK_EQ_INT(plan_names(&d, &l, 2, &p), CVT_ERR_NONE);
    CHECK(p && p->n_unquantized == 0 && p->has_lm_head);
    cvt_plan_free(p);
    p = NULL;

    /* old rotary buffers are ignored by name */
    add(&l, "model.layers.1.self_attn.rotary_emb.inv_freq");
    CHECK_EQ_INT(plan_names(&d, &l, 1, &p), CVT_ERR_NONE);
    cvt_plan_free(p);
    p = NULL;

    /* an unknown tensor is an error naming it (P17) */
    add(&l, "model.layers.0.mlp.act.scales");
    CHECK_EQ_INT(plan_names(&d, &l, 1, &p), CVT_ERR_UNKNOWN_TENSOR);
    CHECK(strstr(qs_log_last(), "model.layers.0.mlp.act.scales") != NULL);
    CHECK(p == NULL);
    del(&l, "model.layers.0.mlp.act.scales");
    /* a layer index past num_hidden_layers is unknown too */
    add(&l, "model.layers.2.input_layernorm.weight");
    CHECK_EQ_INT(plan_names(&d, &l, 1, &p), CVT_ERR_UNKNOWN_TENSOR);
    del(&l, "model.layers.2.input_layernorm.weight");

    /* a missing tensor is an error naming it */
    del(&l, "model.layers.1.post_attention_layernorm.weight");
    CHECK_EQ_INT(plan_names(&d, &l, 1, &p), CVT_ERR_MISSING_TENSOR);
    CHECK(strstr(qs_log_last(), "model.layers.1.post_attention_layernorm.weight") != NULL);
    add(&l, "model.layers.1.post_attention_layernorm.weight");
    del(&l, "model.layers.0.self_attn.v_proj.qweight");
    del(&l, "model.layers.0.self_attn.v_proj.qzeros");
    del(&l, "model.layers.0.self_attn.v_proj.scales");
    CHECK_EQ_INT(plan_names(&d, &l, 1, &p), CVT_ERR_MISSING_TENSOR);
    CHECK(strstr(qs_log_last(), "model.layers.0.self_attn.v_proj") != NULL);
    /* ... and a float v_proj next to quantized q/k cannot be fused */
    add(&l, "model.layers.0.self_attn.v_proj.weight");
    CHECK_EQ_INT(plan_names(&d, &l, 1, &p), CVT_ERR_UNSUPPORTED);
    names_free(&l);

    /* P09 (a): layer 0 MLP float, listed in modules_to_not_convert -> F16 .weight outputs */
    snprintf(d.not_convert[0], sizeof(d.not_convert[0]), "layers.0.mlp");
    d.n_not_convert = 1;
    model_names(&d, &l, true, true);
    for (int j = 0; j < 3; j++) {
        static const char *const mlp[] = {"gate_proj", "up_proj", "down_proj"};
        char m[128];
        snprintf(m, sizeof(m), "model.layers.0.mlp.%s", mlp[j]);
        char nm[160];
        snprintf(nm, sizeof(nm), "%s.qweight", m), del(&l, nm);
        snprintf(nm, sizeof(nm), "%s.qzeros", m), del(&l, nm);
        snprintf(nm, sizeof(nm), "%s.scales", m), del(&l, nm);
        add(&l, "%s.weight", m);
    }
    CHECK_EQ_INT(plan_names(&d, &l, 2, &p), CVT_ERR_NONE);
    if (p) {
        CHECK_EQ_INT(p->n_unquantized, 2); /* gate_up and down of layer 0 */
        const struct cvt_out *o = cvt_plan_find(p, 1, "model.layers.0.mlp.gate_up_proj.weight");
        CHECK(o && o->kind == CVT_OUT_LINEAR_F16 && o->rows == 256 && o->cols == 2 * 640);
        o = cvt_plan_find(p, 1, "model.layers.0.mlp.down_proj.weight");
        CHECK(o && o->kind == CVT_OUT_LINEAR_F16 && o->rows == 640 && o->cols == 256 &&
              o->segs[0].src_r0 == 640);
        CHECK(cvt_plan_find(p, 1, "model.layers.1.mlp.gate_up_proj") != NULL);
        cvt_plan_free(p);
        p = NULL;
    }
    /* P09 (b): the float tensors deleted -> missing, never zero-initialised */
    del(&l, "model.layers.0.mlp.down_proj.weight");
    CHECK_EQ_INT(plan_names(&d, &l, 2, &p), CVT_ERR_MISSING_TENSOR);
    CHECK(strstr(qs_log_last(), "model.layers.0.mlp.down_proj") != NULL);
    names_free(&l);
}

static void test_tied(void)
{
    struct cvt_dims d = tiny();
    struct cvt_plan *p = NULL;
    struct names l = {0};
    d.tie_word_embeddings = true;
    /* (a) only embed_tokens, (b) both, (c) only lm_head: one table, stored as the embedding */
    for (int v = 0; v < 3; v++) {
        model_names(&d, &l, v != 2, v != 0);
        CHECK_EQ_INT(plan_names(&d, &l, 2, &p), CVT_ERR_NONE);
        if (p) {
            CHECK(!p->has_lm_head);
            CHECK(cvt_plan_find(p, 0, "lm_head.weight") == NULL);
            const struct cvt_out *o = cvt_plan_find(p, 1, "model.embed_tokens.weight");
            CHECK(o && o->rows == 500 && o->n_segs == 1);
            if (o)
                CHECK_EQ_STR(p->srcs[o->segs[0].src].name,
                             v == 2 ? "lm_head.weight" : "model.embed_tokens.weight");
            cvt_plan_free(p);
            p = NULL;
        }
        if (v == 0) {
            /* stray quantized lm_head next to tie=true: ignored with a warning */
            add_awq(&l, "lm_head");
            CHECK_EQ_INT(plan_names(&d, &l, 1, &p), CVT_ERR_NONE);
            cvt_plan_free(p);
            p = NULL;
        }
        names_free(&l);
    }
    /* neither table: missing */
    model_names(&d, &l, false, false);
    CHECK_EQ_INT(plan_names(&d, &l, 1, &p), CVT_ERR_MISSING_TENSOR);
    names_free(&l);
    /* (d) untied: both needed; a quantized lm_head is refused clearly */
    d.tie_word_embeddings = false;
    model_names(&d, &l, true, false);
    CHECK_EQ_INT(plan_names(&d, &l, 1, &p), CVT_ERR_MISSING_TENSOR);
    CHECK(strstr(qs_log_last(), "lm_head.weight") != NULL);
    add_awq(&l, "lm_head");
    CHECK_EQ_INT(plan_names(&d, &l, 1, &p), CVT_ERR_UNSUPPORTED);
    names_free(&l);
    /* P07: vocab 1001 at tp 4 -> V_r 251, last rank 248 real rows + 3 zero rows (hidden 512,
     * 8 heads, so that o_proj keeps a whole group of 128 per rank) */
    d.vocab = 1001;
    d.hidden = 512;
    d.n_heads = d.n_kv_heads = 8;
    model_names(&d, &l, true, true);
    CHECK_EQ_INT(plan_names(&d, &l, 4, &p), CVT_ERR_NONE);
    if (p) {
        const struct cvt_out *o = cvt_plan_find(p, 3, "lm_head.weight");
        CHECK(o && o->rows == 251 && o->segs[0].src_r0 == 753 && o->segs[0].n_rows == 248);
        cvt_plan_free(p);
        p = NULL;
    }
    names_free(&l);
}

static void test_qwen2_bias_and_gqa(void)
{
    /* P11 + P05: Qwen2-style, hidden 512, 8 heads, 2 kv heads, biases; tp 4 replicates kv. */
    struct cvt_dims d = tiny();
    struct cvt_plan *p = NULL;
    struct names l = {0};
    d.arch = cvt_arch_find("qwen2");
    d.bias_roles = CVT_ROLE_BIT(FMT_N_QKV);
    d.hidden = 512;
    d.n_heads = 8;
    d.n_kv_heads = 2;
    model_names(&d, &l, true, true);
    CHECK_EQ_INT(plan_names(&d, &l, 4, &p), CVT_ERR_NONE);
    if (p) {
        for (int r = 0; r < 4; r++) {
            const struct cvt_out *o = cvt_plan_find(p, r, "model.layers.1.self_attn.qkv_proj.bias");
            CHECK(o && o->cols == (2 + 2) * 64 && o->n_segs == 3);
            if (o) {
                CHECK_EQ_STR(p->srcs[o->segs[1].src].name, "model.layers.1.self_attn.k_proj.bias");
                CHECK_EQ_INT(o->segs[1].src_c0, (r / 2) * 64); /* kv head r / (4/2) */
                CHECK_EQ_INT(o->segs[0].src_c0, r * 2 * 64);
            }
        }
        cvt_plan_free(p);
        p = NULL;
    }
    /* a bias on q and k but not v is inconsistent */
    del(&l, "model.layers.0.self_attn.v_proj.bias");
    CHECK_EQ_INT(plan_names(&d, &l, 1, &p), CVT_ERR_MISSING_TENSOR);
    names_free(&l);
    /* tp 8: 1 q head + 2 kv of 32 = 96 columns, not a multiple of 64 -> refused, naming qkv */
    d.hidden = 256;
    d.head_dim = 32;
    model_names(&d, &l, true, true);
    CHECK_EQ_INT(plan_names(&d, &l, 8, &p), CVT_ERR_TP);
    CHECK(strstr(qs_log_last(), "qkv_proj") != NULL);
    names_free(&l);
    /* P05 negative: hidden 384, 6 heads, 3 kv heads: tp 2 and 4 impossible; tp 6 holds one head
     * per rank, o_proj K_r = 64 < group 128: local group size gcd(128, 64) = 64 (DESIGN 4) */
    d = tiny();
    d.hidden = 384;
    d.n_heads = 6;
    d.n_kv_heads = 3;
    d.head_dim = 64;
    CHECK_EQ_INT(cvt_plan_build(&d, NULL, 2, &p), CVT_ERR_TP);
    CHECK(strstr(qs_log_last(), "valid --tp values for this model: 1 3 6") != NULL);
    CHECK_EQ_INT(cvt_plan_build(&d, NULL, 4, &p), CVT_ERR_TP);
    CHECK_EQ_INT(cvt_plan_build(&d, NULL, 3, &p), CVT_ERR_NONE);
    cvt_plan_free(p);
    CHECK_EQ_INT(cvt_plan_build(&d, NULL, 6, &p), CVT_ERR_NONE);
    if (p) {
        const struct cvt_out *o = cvt_plan_find(p, 5, "model.layers.0.self_attn.o_proj");
        CHECK(o && o->rows == 64 && o->group == 64 && o->segs[0].src_r0 == 5 * 64);
    }
    cvt_plan_free(p);
}

static void test_mixtral(void)
{
    /* P10: 4 experts, expert intermediate 512 (4 groups); router replicated F32 */
    struct cvt_dims d = tiny();
    struct cvt_plan *p = NULL;
    struct names l = {0};
    d.arch = cvt_arch_find("mixtral");
    d.intermediate = 512;
    d.n_experts = 4;
    d.n_experts_per_tok = 2;
    model_names(&d, &l, true, true);
    CHECK_EQ_INT(plan_names(&d, &l, 2, &p), CVT_ERR_NONE);
    if (p) {
        for (int r = 0; r < 2; r++) {
            const struct cvt_out *o =
                cvt_plan_find(p, r, "model.layers.1.block_sparse_moe.gate.weight");
            CHECK(o && o->kind == CVT_OUT_VEC_F32 && o->rows == 4 && o->cols == 256);
            o = cvt_plan_find(p, r, "model.layers.1.block_sparse_moe.experts.3.gate_up_proj");
            CHECK(o && o->cols == 2 * 256 && o->n_segs == 2);
            if (o) {
                CHECK_EQ_STR(p->srcs[o->segs[0].src].name,
                             "model.layers.1.block_sparse_moe.experts.3.w1");
                CHECK_EQ_STR(p->srcs[o->segs[1].src].name,
                             "model.layers.1.block_sparse_moe.experts.3.w3");
            }
            o = cvt_plan_find(p, r, "model.layers.1.block_sparse_moe.experts.3.down_proj");
            CHECK(o && o->rows == 256 && o->segs[0].src_r0 == r * 256);
        }
        CHECK(cvt_plan_find(p, 0, "model.layers.0.mlp.gate_up_proj") == NULL);
        cvt_plan_free(p);
        p = NULL;
    }
    /* a quantized router is refused */
    del(&l, "model.layers.0.block_sparse_moe.gate.weight");
    add_awq(&l, "model.layers.0.block_sparse_moe.gate");
    CHECK_EQ_INT(plan_names(&d, &l, 1, &p), CVT_ERR_UNSUPPORTED);
    names_free(&l);
    /* a dense mlp name in a Mixtral checkpoint is unknown */
    model_names(&d, &l, true, true);
    add_awq(&l, "model.layers.0.mlp.gate_proj");
    CHECK_EQ_INT(plan_names(&d, &l, 1, &p), CVT_ERR_UNKNOWN_TENSOR);
    names_free(&l);
}

static void test_pitfall_groups(void)
{
    /* P01: intermediate 1280 = 10 groups: tp 2 exact, tp 4 padded (rank 3 holds 128 rows).
     * Hidden 512 / 8 heads here; 4 heads of 64 (o_proj holding half a group per rank at tp 4)
     * is test_local_groups. */
    struct cvt_dims d = tiny();
    d.hidden = 512;
    d.n_heads = d.n_kv_heads = 8;
    struct cvt_plan *p = NULL;
    CHECK_EQ_INT(cvt_plan_build(&d, NULL, 2, &p), CVT_ERR_NONE);
    if (p)
        CHECK_EQ_INT(p->inter_padded, 1280);
    cvt_plan_free(p);
    check_dense_plan("T-LLAMA I=1280", &d, 4);
    /* P02: intermediate 1152 = 9 groups at tp 2 -> 1280; tp 1 unchanged */
    d.intermediate = 1152;
    check_dense_plan("T-LLAMA I=1152", &d, 2);
    CHECK_EQ_INT(cvt_plan_build(&d, NULL, 1, &p), CVT_ERR_NONE);
    if (p)
        CHECK_EQ_INT(p->inter_padded, 1152);
    cvt_plan_free(p);
    /* group 32: U = 64 */
    d.group_size = 32;
    d.intermediate = 1120; /* 35 groups of 32, not a multiple of 64 even at tp 1 */
    check_dense_plan("T-LLAMA g32", &d, 1);
    check_dense_plan("T-LLAMA g32", &d, 4);
    /* a hostile config cannot make the plan itself exhaust memory */
    d = tiny();
    d.arch = cvt_arch_find("mixtral");
    d.n_layers = 4096;
    d.n_experts = 1024;
    d.n_experts_per_tok = 2;
    d.n_heads = d.n_kv_heads = 4;
    CHECK_EQ_INT(cvt_plan_build(&d, NULL, 2, &p), CVT_ERR_UNSUPPORTED);
    CHECK(p == NULL);
}

/* DESIGN 4 local group sizes: a rank holding part of a group gets G_r = gcd(G, K_r). */
static void test_local_groups(void)
{
    /* the fixtures' shape: hidden 256, 4 heads of 64, G 128. tp 4: o_proj K_r = 64, G_r = 64;
     * every other linear keeps G = 128. Byte counts by hand: K*N/2 codes + K/G_r rows of N fp16
     * scales + N/2 bytes of zeros per row. */
    struct cvt_dims d = tiny();
    struct cvt_plan *p = NULL;
    int vals[16];
    int n = cvt_plan_valid_tp(&d, 16, vals, 16);
    CHECK(n == 3 && vals[0] == 1 && vals[1] == 2 && vals[2] == 4);
    CHECK_EQ_INT(cvt_plan_build(&d, NULL, 4, &p), CVT_ERR_NONE);
    if (p) {
        for (int r = 0; r < 4; r++) {
            const struct cvt_out *o = cvt_plan_find(p, r, "model.layers.1.self_attn.o_proj");
            CHECK(o && o->kind == CVT_OUT_W4 && o->rows == 64 && o->cols == 256);
            if (!o)
                continue;
            CHECK_EQ_INT(o->group, 64);
            CHECK_EQ_INT(o->bytes, 64 * 256 / 2 + 1 * 256 * 2 + 1 * 256 / 2);
            CHECK(o->n_segs == 1 && o->segs[0].src_r0 == r * 64 && o->segs[0].n_rows == 64);
            CHECK_EQ_INT(p->srcs[o->segs[0].src].group, 128);
            o = cvt_plan_find(p, r, "model.layers.1.self_attn.qkv_proj");
            CHECK(o && o->group == 128);
            o = cvt_plan_find(p, r, "model.layers.1.mlp.down_proj");
            CHECK(o && o->group == 128 && o->rows == 384); /* 1280 -> 1536 = 4 x 384 */
        }
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        if (f) {
            cvt_plan_print(p, f);
            fclose(f);
            CHECK(buf && strstr(buf, "self_attn.o_proj [K_r=64, N_r=256]: G_r = 64 < source "
                                     "group 128"));
            CHECK(buf && strstr(buf, "mlp.down_proj [K_r=384, N_r=256]: G_r = 128,"));
        }
        free(buf);
    }
    cvt_plan_free(p);
    /* tp 3 is still impossible (heads), with the hint naming 4 as valid */
    CHECK_EQ_INT(cvt_plan_build(&d, NULL, 3, &p), CVT_ERR_TP);
    CHECK(strstr(qs_log_last(), "valid --tp values for this model: 1 2 4") != NULL);
    /* hidden 512, 8 heads of 64, G 256 at tp 8: o_proj K_r = 64, G_r = gcd(256, 64) = 64 */
    d.hidden = 512;
    d.n_heads = d.n_kv_heads = 8;
    d.group_size = 256;
    d.intermediate = 2048;
    CHECK_EQ_INT(cvt_plan_build(&d, NULL, 8, &p), CVT_ERR_NONE);
    if (p) {
        const struct cvt_out *o = cvt_plan_find(p, 7, "model.layers.0.self_attn.o_proj");
        CHECK(o && o->rows == 64 && o->group == 64 && o->segs[0].src_r0 == 7 * 64);
    }
    cvt_plan_free(p);

    /* per-channel (group_size -1, G = K of each linear) split by rows at tp 2: o_proj K = 256,
     * K_r = 128, G_r = 128 (one source group, its row on both ranks); down K = 1280, I_r = 640,
     * G_r = 640; qkv / gate_up keep G = H = 256 */
    d = tiny();
    d.group_size = -1;
    CHECK_EQ_INT(cvt_plan_build(&d, NULL, 2, &p), CVT_ERR_NONE);
    if (p) {
        CHECK_EQ_INT(p->inter_unit, 64);
        CHECK_EQ_INT(p->inter_per_rank, 640);
        for (int r = 0; r < 2; r++) {
            const struct cvt_out *o = cvt_plan_find(p, r, "model.layers.0.self_attn.o_proj");
            CHECK(o && o->group == 128 && p->srcs[o->segs[0].src].group == 256);
            o = cvt_plan_find(p, r, "model.layers.0.self_attn.qkv_proj");
            CHECK(o && o->group == 256);
            o = cvt_plan_find(p, r, "model.layers.0.mlp.down_proj");
            CHECK(o && o->group == 640 && p->srcs[o->segs[0].src].group == 1280);
            o = cvt_plan_find(p, r, "model.layers.0.mlp.gate_up_proj");
            CHECK(o && o->group == 256);
        }
    }
    cvt_plan_free(p);
    /* per-channel, intermediate 1000 (a source of 1000 rows is one group of 1000, fine), but
     * any split leaves local groups of gcd(1000, ...) = 8 rows: refused at every tp with the
     * local-group reason */
    d.intermediate = 1000;
    CHECK_EQ_INT(cvt_plan_build(&d, NULL, 2, &p), CVT_ERR_TP);
    CHECK(strstr(qs_log_last(), "down_proj") && strstr(qs_log_last(), "local group size") &&
          strstr(qs_log_last(), "= 8 is not a multiple of 16"));
    CHECK(strstr(qs_log_last(), "valid --tp values for this model: none") != NULL);
    /* a config whose hidden size is not whole groups cannot be an AWQ checkpoint */
    d = tiny();
    d.hidden = 192;
    d.head_dim = 48;
    CHECK_EQ_INT(cvt_plan_build(&d, NULL, 1, &p), CVT_ERR_TP);
    CHECK(strstr(qs_log_last(), "not a multiple of group_size 128") != NULL);
}

/* Property test: random small models and tp values. Either the plan is refused with a tp /
 * config error, or every segment lies inside its source and its output, W4 outputs satisfy the
 * packed-layout rules, segments of one output do not overlap, and every source element lands in
 * exactly one rank (kv heads: exactly kv_head_replicas ranks). */
static uint32_t prop_rng = 2463534242u;
static int prop_rand(int n)
{
    prop_rng ^= prop_rng << 13;
    prop_rng ^= prop_rng >> 17;
    prop_rng ^= prop_rng << 5;
    return (int)(prop_rng % (uint32_t)n);
}

static void test_random_plans(void)
{
    static const int Gs[] = {16, 32, 64, 128, 256};
    static const int hds[] = {16, 32, 64, 128};
    int n_ok = 0, n_refused = 0;
    long n_local = 0;
    for (int it = 0; it < 3000; it++) {
        struct cvt_dims d = tiny();
        d.arch = prop_rand(4) == 0 ? cvt_arch_find("mixtral") : cvt_arch_find("llama");
        d.group_size = prop_rand(8) ? Gs[prop_rand(5)] : -1; /* some per-channel */
        d.head_dim = hds[prop_rand(4)];
        d.n_heads = 1 + prop_rand(16);
        int kv_div[16], n_div = 0;
        for (int k = 1; k <= d.n_heads; k++)
            if (d.n_heads % k == 0)
                kv_div[n_div++] = k;
        d.n_kv_heads = kv_div[prop_rand(n_div)];
        /* mostly whole groups (an AWQ source is), sometimes not (refused) */
        long gu = d.group_size > 0 ? lcm_slow(d.group_size, 64) : 64;
        d.hidden = prop_rand(6) ? (int)gu * (1 + prop_rand(1024 / (int)gu))
                                : 64 * (1 + prop_rand(16));
        d.intermediate = prop_rand(6) && d.group_size > 0
                             ? d.group_size * (1 + prop_rand(3000 / d.group_size))
                             : 1 + prop_rand(3000);
        d.vocab = 1 + prop_rand(3000);
        d.n_layers = 1 + prop_rand(3);
        d.tie_word_embeddings = prop_rand(2);
        d.bias_roles = prop_rand(3) == 0 ? CVT_ROLE_BIT(FMT_N_QKV) : 0;
        if (d.arch == cvt_arch_find("mixtral")) {
            d.n_experts = 1 + prop_rand(4);
            d.n_experts_per_tok = 1;
        }
        int tp = 1 + prop_rand(16), vals[16];
        int n_valid = cvt_plan_valid_tp(&d, 16, vals, 16);
        bool listed = false;
        if (n_valid && prop_rand(4))
            tp = vals[prop_rand(n_valid)]; /* mostly values the rules allow */
        for (int v = 0; v < n_valid; v++)
            listed |= vals[v] == tp;
        struct cvt_plan *p = NULL;
        enum cvt_err e = cvt_plan_build(&d, NULL, tp, &p);
        /* the hint's list and the plan agree */
        CHECK_MSG(listed == (e == CVT_ERR_NONE), "iteration %d: tp %d listed %d, build %d", it, tp,
                  listed, (int)e);
        if (e) {
            CHECK_MSG(e == CVT_ERR_TP && p == NULL, "iteration %d: error %d", it, (int)e);
            n_refused++;
            continue;
        }
        n_ok++;
        long long *cover = calloc((size_t)p->n_srcs, sizeof(*cover));
        bool ok = cover != NULL;
        for (int r = 0; ok && r < tp; r++)
            for (int j = 0; ok && j < p->ranks[r].n_outs; j++) {
                const struct cvt_out *o = &p->ranks[r].outs[j];
                /* W4: packed-layout rules with the local group size, which divides the source
                 * group and every segment's start and end rows (so each local group of real rows
                 * lies inside one source group and none mixes real rows with padding) */
                if (o->kind == CVT_OUT_W4) {
                    long long g = o->group;
                    ok = g >= 16 && g % 16 == 0 && o->rows % 16 == 0 && o->cols % 64 == 0 &&
                         o->rows % g == 0;
                    for (int a = 0; ok && a < o->n_segs; a++) {
                        const struct cvt_seg *s = &o->segs[a];
                        long long Gsrc = p->srcs[s->src].group;
                        ok = Gsrc % g == 0 && s->src_r0 % g == 0 && s->dst_r0 % g == 0 &&
                             s->n_rows % g == 0 &&
                             Gsrc == (d.group_size > 0 ? d.group_size : p->srcs[s->src].rows);
                        n_local += g < Gsrc;
                    }
                }
                for (int a = 0; ok && a < o->n_segs; a++) {
                    const struct cvt_seg *s = &o->segs[a];
                    const struct cvt_plan_src *ps = &p->srcs[s->src];
                    ok = s->n_rows > 0 && s->n_cols > 0 && s->src_r0 >= 0 && s->src_c0 >= 0 &&
                         s->src_r0 + s->n_rows <= ps->rows && s->src_c0 + s->n_cols <= ps->cols &&
                         s->dst_r0 >= 0 && s->dst_c0 >= 0 && s->dst_r0 + s->n_rows <= o->rows &&
                         s->dst_c0 + s->n_cols <= o->cols;
                    cover[s->src] += (long long)s->n_rows * s->n_cols;
                    for (int b2 = 0; ok && b2 < a; b2++) {
                        const struct cvt_seg *t = &o->segs[b2];
                        bool disjoint = s->dst_c0 + s->n_cols <= t->dst_c0 ||
                                        t->dst_c0 + t->n_cols <= s->dst_c0 ||
                                        s->dst_r0 + s->n_rows <= t->dst_r0 ||
                                        t->dst_r0 + t->n_rows <= s->dst_r0;
                        ok = disjoint;
                    }
                }
            }
        for (int i = 0; ok && i < p->n_srcs; i++) {
            const struct cvt_plan_src *ps = &p->srcs[i];
            bool kv = strstr(ps->name, "k_proj") || strstr(ps->name, "v_proj");
            bool repl = strstr(ps->name, "norm") || strstr(ps->name, "block_sparse_moe.gate.");
            long long want = ps->rows * ps->cols * (kv ? p->kv_head_replicas : repl ? tp : 1);
            ok = cover[i] == want;
            if (!ok)
                fprintf(stderr, "source %s covered %lld times, want %lld\n", ps->name, cover[i],
                        want);
        }
        CHECK_MSG(ok, "iteration %d: arch %s H %d heads %d/%d hd %d I %d V %d G %d tp %d", it,
                  d.arch->name, d.hidden, d.n_heads, d.n_kv_heads, d.head_dim, d.intermediate,
                  d.vocab, d.group_size, tp);
        free(cover);
        cvt_plan_free(p);
    }
    CHECK(n_ok > 300 && n_refused > 300 && n_local > 100);
    printf("random plans: %d built and checked (%ld segments with a local group size below the "
           "source's), %d refused\n", n_ok, n_local, n_refused);
}

int main(void)
{
    T_INIT("cvt_plan");
    qs_log_set_quiet(true);
    test_llama2_7b();
    test_llama31_70b();
    test_qwen25_72b();
    test_mammoth_vocab();
    test_mistral_kv_replication();
    test_registry();
    test_ledger();
    test_tied();
    test_qwen2_bias_and_gqa();
    test_mixtral();
    test_pitfall_groups();
    test_local_groups();
    test_random_plans();
    return t_done();
}
