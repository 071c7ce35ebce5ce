/*
 * test_cvt.c - `qshard convert` end to end on every fixture of tests/data/models/INDEX.json and
 * every bad input of tests/data/bad/INDEX.json.
 *
 * For each model and tp in {1, 2, 3, 4} the binary converts the fixture; a tp the model's shapes
 * cannot take (rules restated below from DESIGN 4-5, not taken from the converter; for the
 * fixtures' 4 heads that is tp 3) must be refused with exit 2, the valid values listed and no
 * output left. At tp 4 the fixtures' o_proj holds K_r = 64 rows of 128-row groups: its scales
 * must have K_r / gcd(G, K_r) rows (DESIGN 4 local group size), and it must still dequantize to
 * the source rows bit for bit. Each converted model is opened
 * with the format reader (manifest, sizes, digests) and every tensor of every rank is checked
 * against the ORIGINAL checkpoint: packed linears are unpacked with ref_dequant_w4 and compared
 * bit for bit with cvt_awq_dequant_source (AWQ's own nibble orders) of the source slice this test
 * computes for that rank (column / row / kv-replication / intermediate-padding / vocab-padding
 * rules); padding must be exactly +0.0; float tensors must equal the source converted to F16 /
 * F32; every tensor of the rank must be accounted for. Twins (same weights, other variant,
 * container or config spelling: PITFALLS P03, P21) must give identical tensors, generation config,
 * tokenizer and config (except quant.source_variant / quant.source_container).
 * A mixed-precision model built here from a fixture (layer 0's MLP as F32 .weight listed in
 * modules_to_not_convert, PITFALLS P09; an o_proj bias) must give F16 [N_r, K_r] linears equal to
 * the source rounded to fp16 and the row-parallel bias on rank 0 only.
 * Also: --threads 1 and --no-check give identical files; every bad input exits as INDEX.json says,
 * names what it promises, and leaves no file behind, including a failure after the writers were
 * opened (NaN scale found while repacking) into a pre-existing directory; CLI usage errors;
 * --force; --dry-run writes nothing.
 *
 * PITFALLS covered: P01/P02 (intermediate padding: llama3-gqa-i640 640 = 5 groups and qwen2 384 =
 * 3 groups at tp 2, mixtral 1 group at tp 2; llama3-gqa-i640 at tp 4: 5 groups on 4 ranks, and half
 * a group of o_proj rows per rank), P03 (GEMM/GEMV/GEMVFast
 * twins), P05 (kv replication: llama3 kv 1 at tp 2, mistral kv 2 at tp 4), P07 (vocab 509 at tp 2),
 * P08 (tied embeddings, no lm_head), P09/P10 (mixtral router listed in modules_to_not_convert,
 * replicated F32), P11 (qwen2 q/k/v biases split with their heads), P13 (w-bit-8), P14
 * (zero-point-false, unknown version), P17 (unknown / missing tensor), P19/P20 via bad inputs,
 * P21 (quant_config.json / quantize_config.json twins; (d) disagreeing quant configs, (e) no quant
 * config at all, built here), P09 (b) (listed float tensors missing, built here).
 *
 * Run from the repository root: ./build/test_cvt (QSHARD names the binary, default build/qshard).
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cvt_src.h"
#include "fmt.h"
#include "qs_log.h"
#include "ref.h"
#include "t.h"
#include "t_safetensors.h" /* st_entry, write_safetensors */

#define DATA "tests/data/"

static char g_tmp[256];      /* our scratch root */
static const char *g_bin;    /* the qshard binary */

/* --- helpers ----------------------------------------------------------------------------- */

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        if (len)
            *len = (size_t)n;
    }
    return buf;
}

static cJSON *load_json(const char *path)
{
    char *s = slurp(path, NULL);
    cJSON *j = s ? cJSON_Parse(s) : NULL;
    free(s);
    return j;
}

/* Run `qshard <args>`; stdout and stderr go to files under g_tmp; returns the exit status and
 * a malloc'ed copy of stderr (and stdout if out != NULL). */
static int run(char **err, char **out, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int run(char **err, char **out, const char *fmt, ...)
{
    char args[2048], cmd[4096], ep[300], op[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof(args), fmt, ap);
    va_end(ap);
    snprintf(ep, sizeof(ep), "%s/stderr.txt", g_tmp);
    snprintf(op, sizeof(op), "%s/stdout.txt", g_tmp);
    snprintf(cmd, sizeof(cmd), "%s %s >%s 2>%s", g_bin, args, op, ep);
    int st = system(cmd);
    if (err)
        *err = slurp(ep, NULL);
    if (out)
        *out = slurp(op, NULL);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static bool exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

/* Number of entries in a directory other than . and .. (-1 if it cannot be opened). */
static int dir_entries(const char *p)
{
    DIR *d = opendir(p);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

static long lcm_slow(long a, long b)
{
    long m = a;
    while (m % b)
        m += a;
    return m;
}

static long round_up_slow(long x, long unit)
{
    long m = 0;
    while (m < x)
        m += unit;
    return m;
}

/* --- the checker: one converted model against its source --------------------------------- */

struct model_ck {
    const char *name;
    struct cvt_source *src;
    const struct cvt_hf_config *cfg;
    long H, I, V, nq, nkv, hd, G, L, E;
    int tp;
    /* per-tp derived numbers (DESIGN 5, restated) */
    long nq_r, nkv_r, rep, I_r, I_pad, V_r;
    int n_checked;              /* tensors checked on the current rank */
    int n_local;                /* packed linears seen with a local group size below G */
};

/* Largest common divisor of a and b, by counting down (not the converter's gcd). */
static long gcd_slow(long a, long b)
{
    long g = a < b ? a : b;
    while (a % g || b % g)
        g--;
    return g;
}

/* Can tp split this model (DESIGN 4 + 5, assuming every decoder linear is quantized)? The
 * row-parallel o_proj's local group size gcd(G, K_r) must be a multiple of 16. */
static bool tp_possible(const struct model_ck *m, int tp)
{
    if (m->nq % tp)
        return false;
    if (tp <= m->nkv ? m->nkv % tp : tp % m->nkv)
        return false;
    long nq_r = m->nq / tp, nkv_r = tp <= m->nkv ? m->nkv / tp : 1;
    long o_K = nq_r * m->hd, qkv_N = (nq_r + 2 * nkv_r) * m->hd;
    long G_o = m->G > 0 ? m->G : m->nq * m->hd; /* per-channel: G = K */
    return gcd_slow(G_o, o_K) % 16 == 0 && o_K % 16 == 0 && qkv_N % 64 == 0 && m->H % 64 == 0;
}

static void ck_setup_tp(struct model_ck *m, int tp)
{
    m->tp = tp;
    m->nq_r = m->nq / tp;
    m->nkv_r = tp <= m->nkv ? m->nkv / tp : 1;
    m->rep = tp <= m->nkv ? 1 : tp / m->nkv;
    long U = m->G > 0 ? lcm_slow(m->G, 64) : 64;
    m->I_pad = round_up_slow(m->I, U * tp);
    m->I_r = m->I_pad / tp;
    m->V_r = round_up_slow(m->V, tp) / tp;
}

static const struct fmt_tensor *find(const struct fmt_shard *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static const struct fmt_tensor *find(const struct fmt_shard *s, const char *fmt, ...)
{
    char nm[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(nm, sizeof(nm), fmt, ap);
    va_end(ap);
    const struct fmt_tensor *t = fmt_shard_find(s, nm);
    CHECK_MSG(t != NULL, "tensor %s missing", nm);
    return t;
}

/* Dequantize packed linear `prefix` of a shard (its source has K_src input rows): returns [K][N]
 * fp32 (malloc'ed) or NULL. Its scales / qzeros must have K / G_r rows, G_r = gcd(G, K) (DESIGN 4
 * local group size; = G unless a row split leaves part of a group on a rank; per-channel
 * G = K_src). */
static float *deq_rank(struct model_ck *m, const struct fmt_shard *s, const char *prefix,
                       long K_src, long *K_out, long *N_out)
{
    const struct fmt_tensor *q = find(s, "%s.qweight", prefix);
    const struct fmt_tensor *sc = find(s, "%s.scales", prefix);
    const struct fmt_tensor *z = find(s, "%s.qzeros", prefix);
    if (!q || !sc || !z)
        return NULL;
    m->n_checked += 3;
    long K = (long)q->shape[0], N = (long)q->shape[1];
    CHECK(q->layout == FMT_LAYOUT_W4_MMA_T16X64 && sc->layout == FMT_LAYOUT_S_T64 &&
          z->layout == FMT_LAYOUT_Z4_T64);
    long G_src = m->G > 0 ? m->G : K_src, G_r = gcd_slow(G_src, K);
    CHECK_MSG(sc->shape[0] == (uint64_t)(K / G_r) && sc->shape[1] == (uint64_t)N &&
              z->shape[0] == sc->shape[0] && z->shape[1] == sc->shape[1],
              "%s: scales [%llu, %llu], want [%ld, %ld]", prefix,
              (unsigned long long)sc->shape[0], (unsigned long long)sc->shape[1], K / G_r, N);
    m->n_local += G_r < G_src;
    float *w = malloc((size_t)(K * N) * sizeof(float));
    if (!w || ref_dequant_w4(q->data, z->data, sc->data, (int)K, (int)N, (int)G_r, w)) {
        CHECK_MSG(0, "%s: ref_dequant_w4 failed", prefix);
        free(w);
        return NULL;
    }
    *K_out = K;
    *N_out = N;
    return w;
}

/* Full-source dequantization of linear `prefix` [K][N] (AWQ's own orders). */
static float *deq_src(struct model_ck *m, const char *prefix, long K, long N)
{
    float *w = malloc((size_t)(K * N) * sizeof(float));
    if (!w)
        return NULL;
    enum cvt_err e = cvt_awq_dequant_source(m->src, m->cfg, prefix, K, N, 0, K, 0, N, w);
    CHECK_MSG(e == CVT_ERR_NONE, "%s: cvt_awq_dequant_source: %s", prefix, cvt_err_str(e));
    if (e) {
        free(w);
        return NULL;
    }
    return w;
}

/* ours[r][dc + c] == src[src_r0 + r][src_c0 + c] bitwise for r < n_rows, c < n_cols. */
static bool block_eq(const float *ours, long ours_N, long dr, long dc, const float *src,
                     long src_N, long src_r0, long src_c0, long n_rows, long n_cols)
{
    for (long r = 0; r < n_rows; r++)
        if (memcmp(ours + (dr + r) * ours_N + dc, src + (src_r0 + r) * src_N + src_c0,
                   (size_t)n_cols * sizeof(float)))
            return false;
    return true;
}

/* ours[r][c] is +0.0 for every r in [r0, r1), c in [c0, c1). */
static bool block_zero(const float *ours, long N, long r0, long r1, long c0, long c1)
{
    for (long r = r0; r < r1; r++)
        for (long c = c0; c < c1; c++) {
            uint32_t b;
            memcpy(&b, &ours[r * N + c], 4);
            if (b)
                return false;
        }
    return true;
}

/* Source float tensor as fp32 (all elements), or NULL. */
static float *src_f32(struct model_ck *m, const char *name, long *n)
{
    const struct cvt_src_tensor *t = cvt_source_find(m->src, name);
    CHECK_MSG(t != NULL, "source tensor %s missing", name);
    if (!t)
        return NULL;
    float *v = malloc((size_t)t->numel * sizeof(float));
    if (v && cvt_source_read_f32(m->src, t, 0, (uint64_t)t->numel, v)) {
        free(v);
        v = NULL;
    }
    *n = (long)t->numel;
    return v;
}

static uint16_t *src_f16(struct model_ck *m, const char *name, long *n)
{
    const struct cvt_src_tensor *t = cvt_source_find(m->src, name);
    CHECK_MSG(t != NULL, "source tensor %s missing", name);
    if (!t)
        return NULL;
    uint16_t *v = malloc((size_t)t->numel * sizeof(uint16_t));
    if (v && cvt_source_read_f16(m->src, t, 0, (uint64_t)t->numel, v)) {
        free(v);
        v = NULL;
    }
    *n = (long)t->numel;
    return v;
}

/* Replicated F32 tensor `name` equals the source converted to fp32. */
static void ck_replicated(struct model_ck *m, const struct fmt_shard *s, const char *name)
{
    const struct fmt_tensor *t = find(s, "%s", name);
    long n = 0;
    float *v = src_f32(m, name, &n);
    if (t && v) {
        CHECK(t->dtype == FMT_DTYPE_F32 && t->numel == (uint64_t)n);
        CHECK_MSG(t->numel == (uint64_t)n && !memcmp(t->data, v, (size_t)n * 4), "%s differs",
                  name);
        m->n_checked++;
    }
    free(v);
}

/* Vocab-parallel F16 table `out_name` of rank r vs source `src_name`. */
static void ck_vocab(struct model_ck *m, const struct fmt_shard *s, int r, const char *out_name,
                     const char *src_name)
{
    const struct fmt_tensor *t = find(s, "%s", out_name);
    long n = 0;
    uint16_t *v = src_f16(m, src_name, &n);
    if (t && v) {
        long lo = r * m->V_r, hi = (r + 1) * m->V_r < m->V ? (r + 1) * m->V_r : m->V;
        long held = hi > lo ? hi - lo : 0;
        CHECK(t->dtype == FMT_DTYPE_F16 && t->shape[0] == (uint64_t)m->V_r &&
              t->shape[1] == (uint64_t)m->H);
        const uint16_t *d = t->data;
        CHECK_MSG(!memcmp(d, v + lo * m->H, (size_t)(held * m->H) * 2), "%s rank %d rows", out_name,
                  r);
        bool zero = true;
        for (long i = held * m->H; i < m->V_r * m->H; i++)
            zero &= d[i] == 0;
        CHECK_MSG(zero, "%s rank %d: padding rows not zero", out_name, r);
        m->n_checked++;
    }
    free(v);
}

/* Fused column-parallel q/k/v (+ bias) of layer i on rank r. */
static void ck_attention(struct model_ck *m, const struct fmt_shard *s, int r, int i)
{
    char p[160];
    long K, N, hd = m->hd, kv_head = m->tp <= m->nkv ? r * m->nkv_r : r / m->rep;
    snprintf(p, sizeof(p), "model.layers.%d.self_attn.qkv_proj", i);
    float *w = deq_rank(m, s, p, m->H, &K, &N);
    static const char *const part[3] = {"q_proj", "k_proj", "v_proj"};
    if (w) {
        CHECK(K == m->H && N == (m->nq_r + 2 * m->nkv_r) * hd);
        for (int j = 0; j < 3; j++) {
            char sp[160];
            snprintf(sp, sizeof(sp), "model.layers.%d.self_attn.%s", i, part[j]);
            long Ns = (j == 0 ? m->nq : m->nkv) * hd;
            float *src = deq_src(m, sp, m->H, Ns);
            long c0 = j == 0 ? r * m->nq_r * hd : kv_head * hd;
            long n = (j == 0 ? m->nq_r : m->nkv_r) * hd;
            long dc = j == 0 ? 0 : (m->nq_r + (j - 1) * m->nkv_r) * hd;
            if (src)
                CHECK_MSG(block_eq(w, N, 0, dc, src, Ns, 0, c0, m->H, n),
                          "%s rank %d: %s slice differs from the source", p, r, part[j]);
            free(src);
            /* bias (Qwen2): same columns */
            char bn[200];
            snprintf(bn, sizeof(bn), "%s.bias", sp);
            if (cvt_source_find(m->src, bn)) {
                long nb = 0;
                float *b = src_f32(m, bn, &nb);
                const struct fmt_tensor *t = find(s, "%s.bias", p);
                if (b && t)
                    CHECK_MSG(!memcmp((const float *)t->data + dc, b + c0, (size_t)n * 4),
                              "%s.bias rank %d: %s part differs", p, r, part[j]);
                if (j == 0 && t)
                    m->n_checked++;
                free(b);
            }
        }
        free(w);
    }
    snprintf(p, sizeof(p), "model.layers.%d.self_attn.o_proj", i);
    w = deq_rank(m, s, p, m->nq * hd, &K, &N);
    if (w) {
        float *src = deq_src(m, p, m->nq * hd, m->H);
        CHECK(K == m->nq_r * hd && N == m->H);
        if (src)
            CHECK_MSG(block_eq(w, N, 0, 0, src, m->H, r * m->nq_r * hd, 0, K, N),
                      "%s rank %d differs from the source rows", p, r);
        free(src);
        free(w);
    }
}

/* Gated MLP (dense or one expert) on rank r: gate_up [H, 2 I_r], down [I_r, H]. */
static void ck_mlp(struct model_ck *m, const struct fmt_shard *s, int r, const char *base,
                   const char *gate, const char *up, const char *down)
{
    char p[200], sp[200];
    long K, N, lo = r * m->I_r, hi = (r + 1) * m->I_r < m->I ? (r + 1) * m->I_r : m->I;
    long held = hi > lo ? hi - lo : 0;
    snprintf(p, sizeof(p), "%s.gate_up_proj", base);
    float *w = deq_rank(m, s, p, m->H, &K, &N);
    if (w) {
        CHECK(K == m->H && N == 2 * m->I_r);
        const char *parts[2] = {gate, up};
        for (int j = 0; j < 2; j++) {
            snprintf(sp, sizeof(sp), "%s.%s", base, parts[j]);
            float *src = deq_src(m, sp, m->H, m->I);
            if (src && held)
                CHECK_MSG(block_eq(w, N, 0, j * m->I_r, src, m->I, 0, lo, m->H, held),
                          "%s rank %d: %s columns differ", p, r, parts[j]);
            CHECK_MSG(block_zero(w, N, 0, K, j * m->I_r + held, (j + 1) * m->I_r),
                      "%s rank %d: padding columns of %s not zero", p, r, parts[j]);
            free(src);
        }
        free(w);
    }
    snprintf(p, sizeof(p), "%s.down_proj", base);
    w = deq_rank(m, s, p, m->I, &K, &N);
    if (w) {
        CHECK(K == m->I_r && N == m->H);
        snprintf(sp, sizeof(sp), "%s.%s", base, down);
        float *src = deq_src(m, sp, m->I, m->H);
        if (src && held)
            CHECK_MSG(block_eq(w, N, 0, 0, src, m->H, lo, 0, held, m->H),
                      "%s rank %d: rows differ", p, r);
        CHECK_MSG(block_zero(w, N, held, K, 0, N), "%s rank %d: padding rows not zero", p, r);
        free(src);
        free(w);
    }
}

/* Config JSON of rank r: the tp block and padded sizes as DESIGN 6 / 5 say. */
static void ck_config(struct model_ck *m, const struct fmt_shard *s, int r)
{
    const char *js;
    size_t len;
    CHECK(fmt_shard_config_json(s, &js, &len) == FMT_ERR_NONE);
    cJSON *j = cJSON_ParseWithLength(js, len);
    CHECK(j != NULL);
    if (!j)
        return;
    cJSON *tp = cJSON_GetObjectItem(j, "tp");
#define NUM(o, k) cJSON_GetNumberValue(cJSON_GetObjectItem((o), (k)))
    CHECK_EQ_INT(NUM(tp, "world_size"), m->tp);
    CHECK_EQ_INT(NUM(tp, "rank"), r);
    CHECK_EQ_INT(NUM(tp, "heads_per_rank"), m->nq_r);
    CHECK_EQ_INT(NUM(tp, "kv_heads_per_rank"), m->nkv_r);
    CHECK_EQ_INT(NUM(tp, "kv_head_replicas"), m->rep);
    CHECK_EQ_INT(NUM(tp, "intermediate_per_rank"), m->I_r);
    CHECK_EQ_INT(NUM(j, "intermediate_size_padded"), m->I_pad);
    CHECK_EQ_INT(NUM(j, "vocab_size_per_rank"), m->V_r);
    CHECK_EQ_INT(NUM(j, "vocab_size"), m->V);
    CHECK_EQ_INT(NUM(j, "hidden_size"), m->H);
    CHECK_EQ_INT(NUM(cJSON_GetObjectItem(j, "quant"), "group_size"), m->G);
    CHECK(cJSON_IsBool(cJSON_GetObjectItem(j, "tie_word_embeddings")));
#undef NUM
    cJSON_Delete(j);
}

/* Every tensor of every rank of out_dir vs the source. */
static void ck_model(struct model_ck *m, const char *out_dir)
{
    struct fmt_model *fm = NULL;
    enum fmt_err fe = fmt_model_open(out_dir, &fm);
    CHECK_MSG(fe == FMT_ERR_NONE, "%s tp %d: fmt_model_open: %s", m->name, m->tp, qs_log_last());
    if (!fm)
        return;
    CHECK_EQ_INT(fmt_model_world_size(fm), m->tp);
    for (int r = 0; r < m->tp; r++) {
        const struct fmt_shard *s = fmt_model_shard(fm, (uint32_t)r);
        char base[160], nm[200];
        m->n_checked = 0;
        ck_config(m, s, r);
        bool tie = m->cfg->tie_word_embeddings;
        const char *emb = "model.embed_tokens.weight";
        ck_vocab(m, s, r, emb, cvt_source_find(m->src, emb) ? emb : "lm_head.weight");
        if (tie)
            CHECK_MSG(fmt_shard_find(s, "lm_head.weight") == NULL, "%s: tied model has lm_head",
                      m->name);
        else
            ck_vocab(m, s, r, "lm_head.weight", "lm_head.weight");
        ck_replicated(m, s, "model.norm.weight");
        for (int i = 0; i < m->L; i++) {
            snprintf(nm, sizeof(nm), "model.layers.%d.input_layernorm.weight", i);
            ck_replicated(m, s, nm);
            snprintf(nm, sizeof(nm), "model.layers.%d.post_attention_layernorm.weight", i);
            ck_replicated(m, s, nm);
            ck_attention(m, s, r, i);
            if (m->E) {
                snprintf(nm, sizeof(nm), "model.layers.%d.block_sparse_moe.gate.weight", i);
                ck_replicated(m, s, nm);
                for (int e = 0; e < m->E; e++) {
                    snprintf(base, sizeof(base), "model.layers.%d.block_sparse_moe.experts.%d", i,
                             e);
                    ck_mlp(m, s, r, base, "w1", "w3", "w2");
                }
            } else {
                snprintf(base, sizeof(base), "model.layers.%d.mlp", i);
                ck_mlp(m, s, r, base, "gate_proj", "up_proj", "down_proj");
            }
        }
        /* nothing in the rank file that this test did not check */
        CHECK_MSG(m->n_checked == (int)fmt_shard_n_tensors(s), "%s tp %d rank %d: %d tensors "
                  "checked, file has %u", m->name, m->tp, r, m->n_checked,
                  fmt_shard_n_tensors(s));
    }
    fmt_model_close(fm);
}

/* --- twins ------------------------------------------------------------------------------- */

/* Config JSON without the two fields that name the source format. */
static cJSON *config_sans_source(const struct fmt_shard *s)
{
    const char *js;
    size_t len;
    if (fmt_shard_config_json(s, &js, &len))
        return NULL;
    cJSON *j = cJSON_ParseWithLength(js, len);
    cJSON *q = cJSON_GetObjectItem(j, "quant");
    cJSON_DeleteItemFromObject(q, "source_variant");
    cJSON_DeleteItemFromObject(q, "source_container");
    return j;
}

struct tok_list {
    int n;
    char names[16][64];
    uint64_t sizes[16];
};

static void tok_cb(void *ctx, const char *name, uint64_t size)
{
    struct tok_list *l = ctx;
    if (l->n < 16) {
        snprintf(l->names[l->n], sizeof(l->names[0]), "%s", name);
        l->sizes[l->n++] = size;
    }
}

static void ck_twins(const char *dir_a, const char *dir_b, const char *what)
{
    struct fmt_model *a = NULL, *b = NULL;
    CHECK(fmt_model_open(dir_a, &a) == FMT_ERR_NONE);
    CHECK(fmt_model_open(dir_b, &b) == FMT_ERR_NONE);
    if (!a || !b)
        goto out;
    CHECK_EQ_INT(fmt_model_world_size(a), fmt_model_world_size(b));
    for (uint32_t r = 0; r < fmt_model_world_size(a) && r < fmt_model_world_size(b); r++) {
        const struct fmt_shard *sa = fmt_model_shard(a, r), *sb = fmt_model_shard(b, r);
        uint32_t n = fmt_shard_n_tensors(sa);
        CHECK_MSG(n == fmt_shard_n_tensors(sb), "%s rank %u: tensor counts differ", what, r);
        for (uint32_t i = 0; i < n && i < fmt_shard_n_tensors(sb); i++) {
            const struct fmt_tensor *ta = fmt_shard_tensor(sa, i), *tb = fmt_shard_tensor(sb, i);
            bool same = !strcmp(ta->name, tb->name) && ta->dtype == tb->dtype &&
                        ta->layout == tb->layout && ta->n_dims == tb->n_dims &&
                        !memcmp(ta->shape, tb->shape, sizeof(ta->shape)) &&
                        ta->split == tb->split && ta->size == tb->size && ta->xxh3 == tb->xxh3 &&
                        !memcmp(ta->data, tb->data, ta->size);
            CHECK_MSG(same, "%s rank %u: tensor %u (%s vs %s) differs", what, r, i, ta->name,
                      tb->name);
        }
        cJSON *ca = config_sans_source(sa), *cb = config_sans_source(sb);
        CHECK_MSG(ca && cb && cJSON_Compare(ca, cb, true), "%s rank %u: configs differ", what, r);
        cJSON_Delete(ca);
        cJSON_Delete(cb);
        const char *ga, *gb;
        size_t la, lb;
        CHECK(!fmt_shard_generation_config_json(sa, &ga, &la) &&
              !fmt_shard_generation_config_json(sb, &gb, &lb) && la == lb && !memcmp(ga, gb, la));
        struct tok_list xa = {0}, xb = {0};
        CHECK(!fmt_shard_tokenizer_list(sa, tok_cb, &xa) && !fmt_shard_tokenizer_list(sb, tok_cb, &xb));
        CHECK(xa.n == xb.n && !memcmp(xa.sizes, xb.sizes, sizeof(xa.sizes)));
    }
out:
    fmt_model_close(a);
    fmt_model_close(b);
}

/* Byte-identical files (the whole rank file and the manifest). */
static bool files_equal(const char *a, const char *b)
{
    size_t la = 0, lb = 0;
    char *x = slurp(a, &la), *y = slurp(b, &lb);
    bool eq = x && y && la == lb && !memcmp(x, y, la);
    free(x);
    free(y);
    return eq;
}

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

    /* twins: identical tensors for every member of a group, at every tp both converted */
    cJSON *a;
    cJSON_ArrayForEach(a, models)
    {
        const char *ga = cJSON_GetStringValue(cJSON_GetObjectItem(a, "twin_group"));
        const char *na = cJSON_GetStringValue(cJSON_GetObjectItem(a, "name"));
        if (!ga || !na)
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
        break; /* the first member of each group against all others is enough for one group */
    }
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
    setenv("QSHARD_CVT_CHUNK_KB", "64", 1);
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s --tp 1 -q", dir, c), 0);
    unsetenv("QSHARD_CVT_CHUNK_KB");
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
 * ref_pack_*; QSHARD_CVT_NO_FAST=1): every fixture, every tp test_models converted, and a
 * 64 KiB chunk budget (64-column chunks), give byte-identical rank files and manifests. */
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
            setenv("QSHARD_CVT_NO_FAST", "1", 1);
            if (tp == 2)
                setenv("QSHARD_CVT_CHUNK_KB", "64", 1);
            int rc = run(NULL, NULL, "convert " DATA "%s %s --tp %d -q", path, gen, tp);
            unsetenv("QSHARD_CVT_NO_FAST");
            unsetenv("QSHARD_CVT_CHUNK_KB");
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

/* --- a mixed-precision model built here (PITFALLS P09, row-parallel bias) ----------------- */

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
    size_t n_src = cvt_source_n_tensors(src), n = 0;
    struct st_entry *e = calloc(n_src + 8, sizeof(*e));
    static const char *const mlp[3] = {"gate_proj", "up_proj", "down_proj"};
    float *w32[3] = {NULL, NULL, NULL};
    uint16_t *obias = NULL;
    for (size_t i = 0; e && i < n_src; i++) {
        const struct cvt_src_tensor *t = cvt_source_tensor(src, i);
        if (!strncmp(t->name, "model.layers.0.mlp.", 19))
            continue; /* replaced below */
        struct st_entry *x = &e[n++];
        snprintf(x->name, sizeof(x->name), "%s", t->name);
        x->dtype = cvt_dtype_str(t->dtype);
        x->n_dims = t->n_dims;
        for (int d = 0; d < t->n_dims && d < 2; d++)
            x->shape[d] = t->shape[d];
        x->size = (size_t)t->nbytes;
        x->data = malloc(x->size);
        CHECK(x->data && cvt_source_read(src, t, x->data, x->size) == CVT_ERR_NONE);
    }
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
    CHECK(e && write_safetensors(path, e, (int)n));
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
    for (size_t i = 0; e && i < n; i++)
        free(e[i].data);
    free(e);
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
    struct cvt_source *src = NULL;
    snprintf(path, sizeof(path), "%s/perchan", g_tmp);
    snprintf(dir, sizeof(dir), "%s/perchan/model", g_tmp);
    mkdir(path, 0777);
    mkdir(dir, 0777);
    CHECK(cvt_source_open(base, &src) == CVT_ERR_NONE);
    if (!src)
        return;
    size_t n_src = cvt_source_n_tensors(src), n = 0;
    struct st_entry *e = calloc(n_src, sizeof(*e));
    int n_q = 0;
    for (size_t i = 0; e && i < n_src; i++) {
        const struct cvt_src_tensor *t = cvt_source_tensor(src, i);
        struct st_entry *x = &e[n++];
        snprintf(x->name, sizeof(x->name), "%s", t->name);
        x->dtype = cvt_dtype_str(t->dtype);
        x->n_dims = t->n_dims;
        for (int d = 0; d < t->n_dims && d < 2; d++)
            x->shape[d] = t->shape[d];
        x->size = (size_t)t->nbytes;
        x->data = malloc(x->size);
        CHECK(x->data && cvt_source_read(src, t, x->data, x->size) == CVT_ERR_NONE);
        size_t L = strlen(t->name);
        bool zs = (L > 7 && !strcmp(t->name + L - 7, ".qzeros")) ||
                  (L > 7 && !strcmp(t->name + L - 7, ".scales"));
        if (zs && t->n_dims == 2) { /* keep row 0 (group 0) only: [1, cols] */
            x->size = x->size / (size_t)t->shape[0];
            x->shape[0] = 1;
            n_q++;
        }
    }
    CHECK(n_q >= 2 * 7 * 2); /* 7 linears x 2 layers, scales and qzeros each */
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    CHECK(e && write_safetensors(path, e, (int)n));
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
    for (size_t i = 0; e && i < n; i++)
        free(e[i].data);
    free(e);
    cvt_source_close(src);

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

/* Copy file a to b (small files). */
static bool copy_file(const char *a, const char *b)
{
    size_t len = 0;
    char *d = slurp(a, &len);
    FILE *f = d ? fopen(b, "wb") : NULL;
    bool ok = f && fwrite(d, 1, len, f) == len;
    if (f)
        ok = fclose(f) == 0 && ok;
    free(d);
    return ok;
}

static bool write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    bool ok = f && fputs(text, f) >= 0;
    if (f)
        ok = fclose(f) == 0 && ok;
    return ok;
}

/* PITFALLS P21 (d), (e) and P09 (b), end to end: each must exit 2, name the problem, leave
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
    snprintf(a, sizeof(a), "%s/models/llama-gqa-gemm/tp1", g_tmp);
    if (exists(a))
        ck_twins(a, out, "P21 agreeing quant configs");

    /* P09 (b): modules_to_not_convert names layer 0's MLP, whose float tensors are absent */
    snprintf(b, sizeof(b), "%s/mixed/model/model.safetensors", g_tmp);
    if (exists(b)) {
        char d2[600], e2[700];
        snprintf(d2, sizeof(d2), "%s/p09b", g_tmp);
        mkdir(d2, 0777);
        /* rewrite the mixed model without layer 0's down_proj.weight */
        struct cvt_source *src = NULL;
        snprintf(e2, sizeof(e2), "%s/mixed/model", g_tmp);
        CHECK(cvt_source_open(e2, &src) == CVT_ERR_NONE);
        size_t n_src = src ? cvt_source_n_tensors(src) : 0, n = 0;
        struct st_entry *e = calloc(n_src + 1, sizeof(*e));
        for (size_t i = 0; e && i < n_src; i++) {
            const struct cvt_src_tensor *t = cvt_source_tensor(src, i);
            if (!strcmp(t->name, "model.layers.0.mlp.down_proj.weight"))
                continue;
            struct st_entry *x = &e[n++];
            snprintf(x->name, sizeof(x->name), "%s", t->name);
            x->dtype = cvt_dtype_str(t->dtype);
            x->n_dims = t->n_dims;
            for (int d = 0; d < t->n_dims && d < 2; d++)
                x->shape[d] = t->shape[d];
            x->size = (size_t)t->nbytes;
            x->data = malloc(x->size);
            CHECK(x->data && cvt_source_read(src, t, x->data, x->size) == CVT_ERR_NONE);
        }
        snprintf(e2, sizeof(e2), "%s/model.safetensors", d2);
        CHECK(e && write_safetensors(e2, e, (int)n));
        snprintf(a, sizeof(a), "%s/mixed/model/config.json", g_tmp);
        snprintf(e2, sizeof(e2), "%s/config.json", d2);
        CHECK(copy_file(a, e2));
        CHECK_EQ_INT(run(&err, NULL, "convert %s %s --tp 1", d2, out), 2);
        CHECK_MSG(err && strstr(err, "model.layers.0.mlp.down_proj"), "P09 (b): %s",
                  err ? err : "");
        free(err);
        for (size_t i = 0; e && i < n; i++)
            free(e[i].data);
        free(e);
        cvt_source_close(src);
    }
    cJSON_Delete(cj);
}

/* --- the output directory: replacing, refusing, interrupting -------------------------------- */

/* Names in directory p, sorted, joined with ',' (malloc'ed; "" when empty, NULL if unreadable). */
static char *dir_list(const char *p)
{
    struct dirent **v;
    int n = scandir(p, &v, NULL, alphasort);
    if (n < 0)
        return NULL;
    size_t cap = 1, len = 0;
    for (int i = 0; i < n; i++)
        cap += strlen(v[i]->d_name) + 1;
    char *s = malloc(cap);
    if (s)
        s[0] = '\0';
    for (int i = 0; i < n; i++) {
        const char *nm = v[i]->d_name;
        if (s && strcmp(nm, ".") && strcmp(nm, ".."))
            len += (size_t)sprintf(s + len, "%s%s", len ? "," : "", nm);
        free(v[i]);
    }
    free(v);
    return s;
}

static int count_str(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; p && (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* out_dir still holds exactly `want` (names), its manifest and rank file are byte-identical to
 * the snapshots, and `qshard verify` accepts it. */
static void ck_intact(const char *out_dir, const char *want, const char *rank_file,
                      const char *rank_bytes, size_t rank_len, const char *man_bytes,
                      size_t man_len, const char *what)
{
    char f[700], *names = dir_list(out_dir), *b;
    size_t len = 0;
    CHECK_MSG(names && !strcmp(names, want), "%s: %s holds '%s', expected '%s'", what, out_dir,
              names ? names : "(unreadable)", want);
    free(names);
    snprintf(f, sizeof(f), "%s/%s", out_dir, rank_file);
    b = slurp(f, &len);
    CHECK_MSG(b && rank_bytes && len == rank_len && !memcmp(b, rank_bytes, len),
              "%s: %s changed", what, f);
    free(b);
    snprintf(f, sizeof(f), "%s/manifest.json", out_dir);
    b = slurp(f, &len);
    CHECK_MSG(b && man_bytes && len == man_len && !memcmp(b, man_bytes, len),
              "%s: %s changed", what, f);
    free(b);
    CHECK_MSG(run(NULL, NULL, "verify %s", out_dir) == 0, "%s: verify %s fails", what, out_dir);
}

/* A failed or interrupted `convert --force` leaves the earlier conversion as it was; a
 * successful one leaves exactly the new rank files + manifest (stale ranks of another tp gone,
 * other files kept); an early signal is reported with exit 3 and leaves nothing. */
/* A NaN or Inf in an F16 float tensor (the embedding: cvt_source_read_f16's copy-then-scan
 * path) is refused with exit 2, naming the tensor and the element: the first element, one
 * inside, the last. The fixture's model.safetensors is patched in a copy. */
static void test_f16_nonfinite(void)
{
    const char *fx = DATA "models/llama-gqa-gemm";
    char dir[512], f[600], g[600], out[600];
    size_t len = 0;
    snprintf(f, sizeof(f), "%s/model.safetensors", fx);
    uint8_t *st = (uint8_t *)slurp(f, &len);
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

static void test_replace(void)
{
    const char *model = DATA "models/llama2-tok-demo";
    char out[512], fresh[512], f[700], g[700], *err = NULL;
    snprintf(out, sizeof(out), "%s/replace/out", g_tmp);
    snprintf(fresh, sizeof(fresh), "%s/replace/fresh", g_tmp);
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s --tp 1 -q", model, out), 0);
    snprintf(f, sizeof(f), "%s/notes.txt", out);
    CHECK(write_text(f, "the user's own file\n"));
    size_t rank_len = 0, man_len = 0;
    snprintf(f, sizeof(f), "%s/rank-0-of-1.qshard", out);
    char *rank0 = slurp(f, &rank_len);
    snprintf(f, sizeof(f), "%s/manifest.json", out);
    char *man0 = slurp(f, &man_len);
    const char *old = "manifest.json,notes.txt,rank-0-of-1.qshard";

    /* a --force run that fails after its writers were opened (NaN scale found while repacking) */
    CHECK_EQ_INT(run(&err, NULL, "convert " DATA "bad/nan-scale %s --tp 1 --force", out), 2);
    CHECK(err && strstr(err, "NaN"));
    free(err);
    err = NULL;
    ck_intact(out, old, "rank-0-of-1.qshard", rank0, rank_len, man0, man_len, "failed --force");

    /* SIGINT during a --force run (other tp): after opening the source, with the writers open,
     * and with every new file written but not yet in place */
    static const char *const stages[] = {"opened", "writing", "written"};
    for (int i = 0; i < 3; i++) {
        setenv("QSHARD_CVT_TEST_SIGNAL", stages[i], 1);
        int rc = run(&err, NULL, "convert %s %s --tp 2 --force", model, out);
        unsetenv("QSHARD_CVT_TEST_SIGNAL");
        CHECK_MSG(rc == 3, "SIGINT at %s: exit %d, expected 3", stages[i], rc);
        CHECK_MSG(err && strstr(err, "interrupted by signal 2"), "SIGINT at %s: stderr: %s",
                  stages[i], err ? err : "");
        free(err);
        err = NULL;
        ck_intact(out, old, "rank-0-of-1.qshard", rank0, rank_len, man0, man_len, stages[i]);
    }
    /* an early signal into a new directory: reported, exit 3, nothing created */
    setenv("QSHARD_CVT_TEST_SIGNAL", "opened", 1);
    CHECK_EQ_INT(run(&err, NULL, "convert %s %s --tp 2", model, fresh), 3);
    unsetenv("QSHARD_CVT_TEST_SIGNAL");
    CHECK(err && strstr(err, "interrupted by signal 2 before anything was written"));
    CHECK(!exists(fresh));
    free(err);
    err = NULL;

    /* a failed rename while moving a new conversion (another model, same tp) into place: every
     * rename done is undone (renames: old manifest and old rank file out, new rank file and new
     * manifest in; number k fails) */
    for (int k = 0; k < 4; k++) {
        char kn[16];
        snprintf(kn, sizeof(kn), "%d", k);
        setenv("QSHARD_CVT_TEST_COMMIT_FAIL", kn, 1);
        int rc = run(&err, NULL, "convert " DATA "models/llama3-gqa-i640 %s --tp 1 --force", out);
        unsetenv("QSHARD_CVT_TEST_COMMIT_FAIL");
        CHECK_MSG(rc == 4 && err && strstr(err, "cannot move"), "commit rename %d fails: exit %d: "
                  "%s", k, rc, err ? err : "");
        free(err);
        err = NULL;
        snprintf(g, sizeof(g), "commit rename %d fails", k);
        ck_intact(out, old, "rank-0-of-1.qshard", rank0, rank_len, man0, man_len, g);
    }

    /* --force with another tp: exactly the new files (as a fresh conversion) + the user's file */
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s --tp 2 -q --force", model, out), 0);
    char *names = dir_list(out);
    CHECK_MSG(names && !strcmp(names, "manifest.json,notes.txt,rank-0-of-2.qshard,"
                                      "rank-1-of-2.qshard"),
              "after --force --tp 2: %s", names ? names : "(unreadable)");
    free(names);
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s --tp 2 -q", model, fresh), 0);
    static const char *const files[] = {"rank-0-of-2.qshard", "rank-1-of-2.qshard",
                                        "manifest.json"};
    for (int i = 0; i < 3; i++) {
        snprintf(f, sizeof(f), "%s/%s", out, files[i]);
        snprintf(g, sizeof(g), "%s/%s", fresh, files[i]);
        CHECK_MSG(files_equal(f, g), "after --force --tp 2: %s differs from a fresh conversion",
                  files[i]);
    }
    snprintf(f, sizeof(f), "%s/notes.txt", out);
    char *notes = slurp(f, NULL);
    CHECK(notes && !strcmp(notes, "the user's own file\n"));
    free(notes);
    CHECK_EQ_INT(run(NULL, NULL, "verify %s", out), 0);
    free(rank0);
    free(man0);

    /* without --force a rank file of any world size is an earlier conversion: refused, "--force"
     * said once, nothing touched; with --force it is replaced */
    char stray[512];
    snprintf(stray, sizeof(stray), "%s/replace/stray", g_tmp);
    CHECK(mkdir(stray, 0777) == 0);
    snprintf(f, sizeof(f), "%s/rank-0-of-2.qshard", fresh);
    snprintf(g, sizeof(g), "%s/rank-0-of-3.qshard", stray);
    CHECK(copy_file(f, g));
    CHECK_EQ_INT(run(&err, NULL, "convert %s %s --tp 1", model, stray), 1);
    CHECK_MSG(count_str(err, "--force") == 1, "'--force' said %d times: %s",
              count_str(err, "--force"), err ? err : "");
    free(err);
    err = NULL;
    names = dir_list(stray);
    CHECK(names && !strcmp(names, "rank-0-of-3.qshard"));
    free(names);
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s --tp 1 -q --force", model, stray), 0);
    names = dir_list(stray);
    CHECK_MSG(names && !strcmp(names, "manifest.json,rank-0-of-1.qshard"), "stray: %s",
              names ? names : "(unreadable)");
    free(names);
}

/* OUT_DIR resolving to MODEL_DIR (same path, a trailing '.', a symlink) is refused with exit 1
 * and a message, and nothing is written into the model's folder. */
static void test_same_dir(void)
{
    char m[512], link[512], cmd[1200], *err = NULL;
    snprintf(m, sizeof(m), "%s/samedir/model", g_tmp);
    snprintf(link, sizeof(link), "%s/samedir/link", g_tmp);
    snprintf(cmd, sizeof(cmd), "mkdir -p '%s/samedir' && cp -r " DATA "models/llama2-tok-demo '%s'",
             g_tmp, m);
    CHECK_EQ_INT(system(cmd), 0);
    CHECK(symlink("model", link) == 0);
    char *before = dir_list(m);
    const char *outs[3] = {m, NULL, link};
    char dot[600];
    snprintf(dot, sizeof(dot), "%s/./", m);
    outs[1] = dot;
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(run(&err, NULL, "convert %s %s --tp 1", m, outs[i]), 1);
        CHECK_MSG(err && strstr(err, "is the model directory"), "OUT_DIR %s: stderr: %s",
                  outs[i], err ? err : "");
        free(err);
        err = NULL;
        char *after = dir_list(m);
        CHECK_MSG(before && after && !strcmp(before, after), "OUT_DIR %s: model folder now %s",
                  outs[i], after ? after : "(unreadable)");
        free(after);
    }
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s --tp 1 --force -q", m, link), 1);
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s --tp 1 --dry-run -q", m, m), 1);
    char *after = dir_list(m);
    CHECK(before && after && !strcmp(before, after));
    free(after);
    free(before);
}

/* The bitwise self-check catches a packing error: one flipped code bit in one output (the
 * QSHARD_CVT_TEST_CORRUPT knob of cvt_run.c) fails the conversion with exit 5, names the tensor
 * and the element, and leaves no output; with --no-check the same corruption goes through. */
static void test_self_check(void)
{
    const char *t = "model.layers.1.mlp.down_proj";
    char out[512], *err = NULL;
    snprintf(out, sizeof(out), "%s/selfcheck", g_tmp);
    setenv("QSHARD_CVT_TEST_CORRUPT", t, 1);
    CHECK_EQ_INT(run(&err, NULL, "convert " DATA "models/llama-gqa-gemm %s --tp 2 -q", out), 5);
    CHECK_MSG(err && strstr(err, "self-check failed") && strstr(err, t) && strstr(err, "[k=0, n=0]"),
              "stderr: %s", err ? err : "");
    CHECK(!exists(out));
    free(err);
    err = NULL;
    CHECK_EQ_INT(run(&err, NULL, "convert " DATA "models/llama-gqa-gemm %s --tp 2 -q --no-check",
                     out), 0);
    CHECK(exists(out));
    unsetenv("QSHARD_CVT_TEST_CORRUPT");
    free(err);
}

static void test_cli(void)
{
    const char *dir = DATA "models/qwen2-bias-tied-v509";
    char out[512], *err = NULL, *sout = NULL, f[600];
    snprintf(out, sizeof(out), "%s/cli/out", g_tmp);
    CHECK_EQ_INT(run(NULL, NULL, "convert --help"), 0);
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s", dir, out), 1);             /* no --tp */
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s --tp abc", dir, out), 1);
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s --tp 0", dir, out), 1);
    CHECK_EQ_INT(run(NULL, NULL, "convert %s --tp 1", dir), 1);               /* no OUT_DIR */
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s --tp 1 --bogus", dir, out), 1);
    CHECK_EQ_INT(run(NULL, NULL, "convert %s/nonexistent %s --tp 1", g_tmp, out), 4);
    CHECK(!exists(out));
    /* impossible tp: 4 heads at tp 3; 4 is valid (o_proj local group size 64, DESIGN 4) */
    CHECK_EQ_INT(run(&err, NULL, "convert %s %s --tp 3", dir, out), 2);
    CHECK(err && strstr(err, "valid --tp values for this model: 1 2 4"));
    free(err);
    err = NULL;
    /* --dry-run: the plan on stdout, nothing written */
    CHECK_EQ_INT(run(NULL, &sout, "convert %s %s --tp 2 --dry-run", dir, out), 0);
    CHECK(sout && strstr(sout, "V_r = ceil(509 / 2) = 255") && strstr(sout, "I_pad = 512"));
    CHECK(!exists(out));
    free(sout);
    /* --dry-run at tp 4 names the local group size decision of o_proj (K_r = 64, G = 128) */
    CHECK_EQ_INT(run(NULL, &sout, "convert %s %s --tp 4 --dry-run", dir, out), 0);
    CHECK(sout && strstr(sout, "self_attn.o_proj [K_r=64, N_r=256]: G_r = 64 < source group 128"));
    CHECK(!exists(out));
    free(sout);
    /* --dry-run names every rank's share of the intermediate (DESIGN 5, restated: U = lcm(G,
     * 64), I_pad = I rounded up to U tp, rank r holds [r I_r, min((r + 1) I_r, I))) */
    {
        const char *mi = DATA "models/llama3-gqa-i640";
        cJSON *cj = load_json(DATA "models/llama3-gqa-i640/config.json");
        long I = (long)cJSON_GetNumberValue(cJSON_GetObjectItem(cj, "intermediate_size"));
        long G = (long)cJSON_GetNumberValue(cJSON_GetObjectItem(
            cJSON_GetObjectItem(cj, "quantization_config"), "group_size"));
        cJSON_Delete(cj);
        CHECK(I > 0 && G > 0);
        for (int tp = 2; tp <= 4 && I > 0 && G > 0; tp += 2) {
            CHECK_EQ_INT(run(NULL, &sout, "convert %s --tp %d --dry-run -q", mi, tp), 0);
            long I_r = round_up_slow(I, lcm_slow(G, 64) * tp) / tp;
            for (int r = 0; r < tp; r++) {
                long lo = r * I_r < I ? r * I_r : I, hi = (r + 1) * I_r < I ? (r + 1) * I_r : I;
                char want[160];
                if (hi == lo)
                    snprintf(want, sizeof(want), "rank %d holds no intermediate rows, only %ld "
                             "zero padding\n", r, I_r);
                else if (hi - lo < I_r)
                    snprintf(want, sizeof(want), "rank %d holds intermediate [%ld, %ld) + %ld zero "
                             "padding\n", r, lo, hi, I_r - (hi - lo));
                else
                    snprintf(want, sizeof(want), "rank %d holds intermediate [%ld, %ld)\n", r, lo,
                             hi);
                CHECK_MSG(sout && strstr(sout, want), "tp %d dry-run lacks '%s'", tp, want);
            }
            free(sout);
            sout = NULL;
        }
    }
    /* --dry-run of a directory holding only a real config.json (no weights) */
    CHECK_EQ_INT(run(NULL, &sout, "convert " DATA "real-configs/twhoool02--Llama-2-7b-chat-hf-AWQ "
                                  "--tp 4 --dry-run"), 0);
    CHECK(sout && strstr(sout, "I_pad = 11264") && strstr(sout, "I_r = 2816"));
    free(sout);
    CHECK_EQ_INT(run(&err, NULL, "convert " DATA "real-configs/twhoool02--Llama-2-7b-chat-hf-AWQ "
                                 "--tp 3 --dry-run"), 2);
    CHECK(err && strstr(err, "valid --tp values for this model: 1 2 4 8 16 32"));
    free(err);
    err = NULL;
    /* second conversion into the same place: refused without --force, files untouched */
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s --tp 2 -q", dir, out), 0);
    snprintf(f, sizeof(f), "%s/rank-1-of-2.qshard", out);
    size_t len0 = 0;
    char *before = slurp(f, &len0);
    CHECK_EQ_INT(run(&err, NULL, "convert %s %s --tp 2 -q", dir, out), 1);
    CHECK(err && strstr(err, "--force"));
    free(err);
    size_t len1 = 0;
    char *after = slurp(f, &len1);
    CHECK(before && after && len0 == len1 && !memcmp(before, after, len0));
    free(after);
    CHECK_EQ_INT(run(NULL, NULL, "convert %s %s --tp 2 -q --force", dir, out), 0);
    after = slurp(f, &len1);
    CHECK(before && after && len0 == len1 && !memcmp(before, after, len0)); /* deterministic */
    free(after);
    free(before);
    CHECK_EQ_INT(run(NULL, NULL, "verify %s", out), 0);
}

int main(void)
{
    T_INIT("cvt");
    /* the SIGINT cases (test_replace) need the signals caught in the converter, which keeps a
     * signal its parent ignores ignored: a shell starts background jobs (`make test &`) with
     * SIGINT and SIGQUIT ignored, and the converter inherits that from us */
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    g_bin = getenv("QSHARD") ? getenv("QSHARD") : "build/qshard";
    snprintf(g_tmp, sizeof(g_tmp), "/tmp/qshard-test-cvt-XXXXXX");
    if (!mkdtemp(g_tmp)) {
        perror("mkdtemp");
        return 1;
    }
    qs_log_set_quiet(true);
    test_models();
    test_fast_vs_generic();
    test_determinism();
    test_mixed_precision();
    test_per_channel();
    test_config_pitfalls();
    test_bad_inputs();
    test_f16_nonfinite();
    test_cli();
    test_replace();
    test_same_dir();
    test_self_check();
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_tmp);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_tmp);
    return t_done();
}
