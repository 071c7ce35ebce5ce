/*
 * test_model.c - the runtime model (runtime/rt.h) on the CPU backend.
 *
 * Part 1, synthetic models: random canonical AWQ weights (codes, zeros, fp16 scales) for small
 * llama / mistral / qwen2 / mixtral shapes are split by DESIGN 5's TP rules and written as rank
 * files with the format writer; the runtime's logits are compared with an independent forward
 * pass written here in double precision from the unpacked weights (relative L2 <= 1e-4), TP-2 /
 * TP-4 with TP-1 (relative L2 <= 1e-5), chunked prefill and token-by-token decode with one
 * full prefill, and every error path (bad token, context overflow, missing tensor, wrong or
 * unknown layout, shape disagreement, unused tensor, rank file from another set, bad configs).
 *
 * Part 2, fixtures: every model of tests/data/models/INDEX.json is converted with the real
 * converter (`$QSHARD convert`) at TP 1, 2 and 4 into a temp dir and its logits compared with
 * the transformers goldens (tests/data/golden/<group>/, relative L2 <= 5e-3, greedy 16-token
 * continuation identical) and TP-N with TP-1 (relative L2 <= 1e-5). Skipped, with a message,
 * when the fixtures or the converter are absent.
 *
 * Part 3, per-channel AWQ (group_size -1): llama-gqa-gemm rewritten here with one group per
 * linear (group 0's zeros/scales for all K rows), converted at TP 1..4 (TP-3 must be refused with
 * exit 2 and the valid --tp hint); TP-N vs TP-1 (relative L2 <= 1e-5) and TP-1 vs the fp64
 * forward of the dequantized per-channel weights, unpacked here from the written GEMM tensors
 * (relative L2 <= 1e-5, greedy 16-token continuation identical).
 *
 * Run: ./build/test_model (from the repository root; QSHARD names the binary).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <xxhash.h>

#include "cvt_src.h" /* reading the llama-gqa-gemm fixture for the per-channel test */
#include "fmt.h"
#include "fmt_write.h"
#include "qs_log.h"
#include "ref.h"
#include "rt.h"
#include "rt_io.h" /* rt_npy_read_f32, rt_file_read */
#include "rt_sample.h" /* the host sampler rt_model_forward_pick is checked against */
#include "t.h"
#include "t_safetensors.h" /* st_entry, write_safetensors (per-channel test) */

// --- random numbers ---------------------------------------------------------------------------

static uint64_t rng = 0x243f6a8885a308d3ull;

static uint32_t rnd_u32(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (uint32_t)((rng * 0x2545f4914f6cdd1dull) >> 32);
}

static float rnd_uniform(float lo, float hi)
{
    return lo + (hi - lo) * (float)(rnd_u32() >> 8) / 16777216.0f;
}

static void *xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) {
        fprintf(stderr, "test_model: out of memory\n");
        abort();
    }
    return p;
}

static double rel_l2(const float *a, const double *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : INFINITY;
}

static double rel_l2_f(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : INFINITY;
}

// --- synthetic model: canonical weights --------------------------------------------------------

/* One AWQ linear in canonical form (DESIGN 4): codes [K][N], zeros and fp16 scales [K/G][N]. */
struct qlin {
    int K, N;
    uint8_t *q, *z;
    uint16_t *s;
    float *bias; /* [N] or NULL */
    bool f16;    /* store unquantised (fp16 [N][K] of the dequantised values) */
};

struct syn_spec {
    const char *arch;
    int H, I, L, nh, nkv, hd, V, G, E, topk, window;
    bool tie, qkv_bias, o_bias, f16_down1; /* f16_down1: layer 1 down_proj unquantised */
    bool llama3;                             /* llama3 rope scaling with L = 32 */
    double theta;
};

struct syn_layer {
    struct qlin q, k, v, o, gate, up, down;
    float *attn_norm, *mlp_norm;
    float *router;                  /* [E][H] */
    struct qlin *eg, *eu, *ed;      /* experts w1 (gate), w3 (up), w2 (down) */
};

struct syn_model {
    struct syn_spec sp;
    uint16_t *embed, *lm_head;      /* [V][H] fp16 */
    float *final_norm;
    struct syn_layer *layers;
    uint8_t model_id[16];
};

static void qlin_init(struct qlin *l, int K, int N, int G, float smax)
{
    l->K = K, l->N = N;
    l->q = xcalloc((size_t)K * N, 1);
    l->z = xcalloc((size_t)(K / G) * N, 1);
    l->s = xcalloc((size_t)(K / G) * N, 2);
    for (size_t i = 0; i < (size_t)K * N; i++)
        l->q[i] = rnd_u32() & 15;
    for (size_t i = 0; i < (size_t)(K / G) * N; i++) {
        l->z[i] = rnd_u32() & 15;
        l->s[i] = ref_f32_to_f16(rnd_uniform(0.3f, 1.0f) * smax);
    }
}

static void qlin_free(struct qlin *l)
{
    free(l->q), free(l->z), free(l->s), free(l->bias);
}

static double qlin_w(const struct qlin *l, int G, int k, int n)
{
    size_t gi = (size_t)(k / G) * l->N + n;
    return ((int)l->q[(size_t)k * l->N + n] - (int)l->z[gi]) * (double)ref_f16_to_f32(l->s[gi]);
}

static float *rand_vec(int n, float lo, float hi)
{
    float *v = xcalloc((size_t)n, sizeof(float));
    for (int i = 0; i < n; i++)
        v[i] = rnd_uniform(lo, hi);
    return v;
}

static uint16_t *rand_f16(size_t n, float lo, float hi)
{
    uint16_t *v = xcalloc(n, 2);
    for (size_t i = 0; i < n; i++)
        v[i] = ref_f32_to_f16(rnd_uniform(lo, hi));
    return v;
}

static void syn_build(struct syn_model *m, const struct syn_spec *sp)
{
    memset(m, 0, sizeof(*m));
    m->sp = *sp;
    int H = sp->H, G = sp->G, qd = sp->nh * sp->hd, kvd = sp->nkv * sp->hd;
    /* scale sizes chosen so activations stay O(1): |w| ~ 8 * smax */
    float sH = 0.5f / (8 * sqrtf((float)H)), sQ = 0.5f / (8 * sqrtf((float)qd));
    float sI = 0.5f / (8 * sqrtf((float)sp->I));
    m->embed = rand_f16((size_t)sp->V * H, -1, 1);
    m->lm_head = sp->tie ? NULL : rand_f16((size_t)sp->V * H, -0.2f, 0.2f);
    m->final_norm = rand_vec(H, 0.8f, 1.2f);
    m->layers = xcalloc((size_t)sp->L, sizeof(*m->layers));
    for (int l = 0; l < sp->L; l++) {
        struct syn_layer *y = &m->layers[l];
        y->attn_norm = rand_vec(H, 0.8f, 1.2f);
        y->mlp_norm = rand_vec(H, 0.8f, 1.2f);
        qlin_init(&y->q, H, qd, G, sH * 4);
        qlin_init(&y->k, H, kvd, G, sH * 4);
        qlin_init(&y->v, H, kvd, G, sH);
        qlin_init(&y->o, qd, H, G, sQ);
        if (sp->qkv_bias) {
            y->q.bias = rand_vec(qd, -0.5f, 0.5f);
            y->k.bias = rand_vec(kvd, -0.5f, 0.5f);
            y->v.bias = rand_vec(kvd, -0.5f, 0.5f);
        }
        if (sp->o_bias)
            y->o.bias = rand_vec(H, -0.2f, 0.2f);
        if (sp->E == 0) {
            qlin_init(&y->gate, H, sp->I, G, sH);
            qlin_init(&y->up, H, sp->I, G, sH);
            qlin_init(&y->down, sp->I, H, G, sI);
            y->down.f16 = sp->f16_down1 && l == 1;
            continue;
        }
        y->router = rand_vec(sp->E * H, -0.3f, 0.3f);
        y->eg = xcalloc((size_t)sp->E, sizeof(struct qlin));
        y->eu = xcalloc((size_t)sp->E, sizeof(struct qlin));
        y->ed = xcalloc((size_t)sp->E, sizeof(struct qlin));
        for (int e = 0; e < sp->E; e++) {
            qlin_init(&y->eg[e], H, sp->I, G, sH);
            qlin_init(&y->eu[e], H, sp->I, G, sH);
            qlin_init(&y->ed[e], sp->I, H, G, sI);
        }
    }
    for (int i = 0; i < 16; i++)
        m->model_id[i] = (uint8_t)rnd_u32();
}

static void syn_free(struct syn_model *m)
{
    for (int l = 0; l < m->sp.L; l++) {
        struct syn_layer *y = &m->layers[l];
        free(y->attn_norm), free(y->mlp_norm), free(y->router);
        qlin_free(&y->q), qlin_free(&y->k), qlin_free(&y->v), qlin_free(&y->o);
        if (m->sp.E == 0) {
            qlin_free(&y->gate), qlin_free(&y->up), qlin_free(&y->down);
            continue;
        }
        for (int e = 0; e < m->sp.E; e++)
            qlin_free(&y->eg[e]), qlin_free(&y->eu[e]), qlin_free(&y->ed[e]);
        free(y->eg), free(y->eu), free(y->ed);
    }
    free(m->layers), free(m->embed), free(m->lm_head), free(m->final_norm);
}

// --- independent reference forward (double precision) ----------------------------------------

static void d_rmsnorm(double *out, const double *h, const float *w, int H, double eps)
{
    double ss = 0;
    for (int i = 0; i < H; i++)
        ss += h[i] * h[i];
    double r = 1 / sqrt(ss / H + eps);
    for (int i = 0; i < H; i++)
        out[i] = w[i] * h[i] * r;
}

/* y[N] = x[K] . W + bias with W dequantised from canonical codes. */
static void d_linear(double *y, const double *x, const struct qlin *l, int G)
{
    for (int n = 0; n < l->N; n++)
        y[n] = l->bias ? l->bias[n] : 0;
    for (int k = 0; k < l->K; k++)
        for (int n = 0; n < l->N; n++) {
            double w = qlin_w(l, G, k, n);
            if (l->f16) /* stored as fp16: the runtime sees the rounded value */
                w = ref_f16_to_f32(ref_f32_to_f16((float)w));
            y[n] += x[k] * w;
        }
}

static void d_inv_freq(double *f, const struct syn_spec *sp)
{
    for (int i = 0; i < sp->hd / 2; i++) {
        double v = 1 / pow(sp->theta, 2.0 * i / sp->hd);
        if (sp->llama3) { /* factor 4, low 1, high 4, original 32 */
            double wl = 2 * M_PI / v, L = 32;
            if (wl > L / 1)
                v = v / 4;
            else if (wl >= L / 4) {
                double sm = (L / wl - 1) / (4 - 1);
                v = (1 - sm) * v / 4 + sm * v;
            }
        }
        f[i] = v;
    }
}

static void d_rope(double *x, int n_heads, int hd, int pos, const double *inv)
{
    for (int h = 0; h < n_heads; h++)
        for (int i = 0; i < hd / 2; i++) {
            double a = pos * inv[i], c = cos(a), s = sin(a);
            double *v = x + h * hd, x1 = v[i], x2 = v[i + hd / 2];
            v[i] = x1 * c - x2 * s;
            v[i + hd / 2] = x2 * c + x1 * s;
        }
}

static void d_mlp(double *out, const double *x, const struct qlin *g, const struct qlin *u,
                  const struct qlin *d, int G, int I)
{
    double *gv = xcalloc((size_t)I, 8), *uv = xcalloc((size_t)I, 8);
    d_linear(gv, x, g, G);
    d_linear(uv, x, u, G);
    for (int i = 0; i < I; i++)
        gv[i] = gv[i] / (1 + exp(-gv[i])) * uv[i];
    d_linear(out, gv, d, G);
    free(gv), free(uv);
}

/* logits [T][V] of tokens[0..T) from position 0. */
static void d_forward(const struct syn_model *m, const int32_t *tok, int T, double *logits)
{
    const struct syn_spec *sp = &m->sp;
    int H = sp->H, hd = sp->hd, nh = sp->nh, nkv = sp->nkv, G = sp->G;
    double eps = 1e-5;
    double *h = xcalloc((size_t)T * H, 8), *x = xcalloc(H, 8), *o = xcalloc(H, 8);
    double *q = xcalloc((size_t)T * nh * hd, 8), *k = xcalloc((size_t)T * nkv * hd, 8);
    double *v = xcalloc((size_t)T * nkv * hd, 8), *att = xcalloc((size_t)nh * hd, 8);
    double *inv = xcalloc((size_t)hd / 2, 8), *sc = xcalloc((size_t)T, 8), *tmp = xcalloc(H, 8);
    d_inv_freq(inv, sp);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < H; i++)
            h[(size_t)t * H + i] = ref_f16_to_f32(m->embed[(size_t)tok[t] * H + i]);
    for (int l = 0; l < sp->L; l++) {
        const struct syn_layer *y = &m->layers[l];
        for (int t = 0; t < T; t++) {
            d_rmsnorm(x, h + (size_t)t * H, y->attn_norm, H, eps);
            d_linear(q + (size_t)t * nh * hd, x, &y->q, G);
            d_linear(k + (size_t)t * nkv * hd, x, &y->k, G);
            d_linear(v + (size_t)t * nkv * hd, x, &y->v, G);
            d_rope(q + (size_t)t * nh * hd, nh, hd, t, inv);
            d_rope(k + (size_t)t * nkv * hd, nkv, hd, t, inv);
        }
        for (int t = 0; t < T; t++) {
            for (int hh = 0; hh < nh; hh++) {
                int kh = hh / (nh / nkv), lo = 0;
                if (sp->window > 0 && t - sp->window + 1 > 0)
                    lo = t - sp->window + 1;
                double mx = -INFINITY, sum = 0;
                for (int j = lo; j <= t; j++) {
                    double d = 0;
                    for (int i = 0; i < hd; i++)
                        d += q[((size_t)t * nh + hh) * hd + i] * k[((size_t)j * nkv + kh) * hd + i];
                    sc[j] = d / sqrt(hd);
                    mx = fmax(mx, sc[j]);
                }
                for (int j = lo; j <= t; j++)
                    sum += (sc[j] = exp(sc[j] - mx));
                for (int i = 0; i < hd; i++) {
                    double a = 0;
                    for (int j = lo; j <= t; j++)
                        a += sc[j] / sum * v[((size_t)j * nkv + kh) * hd + i];
                    att[hh * hd + i] = a;
                }
            }
            d_linear(o, att, &y->o, G);
            for (int i = 0; i < H; i++)
                h[(size_t)t * H + i] += o[i];
        }
        for (int t = 0; t < T; t++) {
            d_rmsnorm(x, h + (size_t)t * H, y->mlp_norm, H, eps);
            if (sp->E == 0) {
                d_mlp(o, x, &y->gate, &y->up, &y->down, G, sp->I);
            } else {
                double p[16], mx = -INFINITY, sum = 0;
                int chosen[16] = {0};
                for (int e = 0; e < sp->E; e++) {
                    double d = 0;
                    for (int i = 0; i < H; i++)
                        d += x[i] * (double)y->router[e * H + i];
                    p[e] = d;
                    mx = fmax(mx, d);
                }
                for (int e = 0; e < sp->E; e++)
                    sum += (p[e] = exp(p[e] - mx));
                double kept = 0;
                for (int j = 0; j < sp->topk; j++) {
                    int best = -1;
                    for (int e = 0; e < sp->E; e++)
                        if (!chosen[e] && (best < 0 || p[e] > p[best]))
                            best = e;
                    chosen[best] = 1;
                    kept += p[best] / sum;
                }
                memset(o, 0, (size_t)H * 8);
                for (int e = 0; e < sp->E; e++) {
                    if (!chosen[e])
                        continue;
                    d_mlp(tmp, x, &y->eg[e], &y->eu[e], &y->ed[e], G, sp->I);
                    for (int i = 0; i < H; i++)
                        o[i] += p[e] / sum / kept * tmp[i];
                }
            }
            for (int i = 0; i < H; i++)
                h[(size_t)t * H + i] += o[i];
        }
    }
    const uint16_t *head = sp->tie ? m->embed : m->lm_head;
    for (int t = 0; t < T; t++) {
        d_rmsnorm(x, h + (size_t)t * H, m->final_norm, H, eps);
        for (int n = 0; n < sp->V; n++) {
            double a = 0;
            for (int i = 0; i < H; i++)
                a += x[i] * ref_f16_to_f32(head[(size_t)n * H + i]);
            logits[(size_t)t * sp->V + n] = a;
        }
    }
    free(h), free(x), free(o), free(q), free(k), free(v), free(att), free(inv), free(sc);
    free(tmp);
}

// --- writing rank files (DESIGN 5 split rules) --------------------------------------------------

struct tbuf {
    char name[256];
    enum fmt_dtype dt;
    enum fmt_layout lay;
    uint32_t nd;
    uint64_t shape[2];
    void *data; /* owned */
    size_t size;
};

struct tlist {
    struct tbuf t[512];
    int n;
};

static void tl_add(struct tlist *l, const char *name, enum fmt_dtype dt, enum fmt_layout lay,
                   uint32_t nd, uint64_t d0, uint64_t d1, void *data, size_t size)
{
    if (l->n == 512)
        abort();
    struct tbuf *t = &l->t[l->n++];
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->dt = dt, t->lay = lay, t->nd = nd, t->shape[0] = d0, t->shape[1] = d1;
    t->data = data, t->size = size;
}

static void tl_free(struct tlist *l)
{
    for (int i = 0; i < l->n; i++)
        free(l->t[i].data);
    l->n = 0;
}

/* Which ways to break a rank file. */
enum corrupt {
    CORRUPT_NONE,
    CORRUPT_MISSING,       /* drop model.layers.1.post_attention_layernorm.weight */
    CORRUPT_WRONG_LAYOUT,  /* layer 0 o_proj.scales written ROW_MAJOR */
    CORRUPT_SHAPE,         /* model.norm.weight one element too long */
    CORRUPT_EXTRA,         /* an unused q_norm tensor (a Qwen3 feature) */
    CORRUPT_TOKEN_CONFIG,  /* config with vocab_size_per_rank off by one */
    CORRUPT_GROUP,         /* layer 0 o_proj with one group over all its rows (> group_size) */
};

static int gcd_i(int a, int b)
{
    while (b) {
        int t = a % b;
        a = b, b = t;
    }
    return a;
}

/* Slice of a canonical linear: columns cols[0..nc) (-1 = zero padding), rows [r0, r0 + nr_real)
 * padded with zero rows to nr; then packed (or fp16) and added under `prefix`. The slice's
 * group size is Gl = gcd(G, nr, r0) (DESIGN 4 local group size: a rank holding part of a group
 * of G rows gets groups of Gl rows, each repeating its source group's scale and zero row);
 * nr_real must be a multiple of Gl or nr. */
static void add_linear(struct tlist *tl, const char *prefix, const struct qlin *l, int G,
                       const int *cols, int nc, int r0, int nr_real, int nr, bool with_bias)
{
    char name[200];
    int Gl = gcd_i(gcd_i(G, nr), r0), ng = nr / Gl;
    uint8_t *q = xcalloc((size_t)nr * nc, 1), *z = xcalloc((size_t)ng * nc, 1);
    uint16_t *s = xcalloc((size_t)ng * nc, 2);
    for (int c = 0; c < nc; c++) {
        if (cols[c] < 0)
            continue;
        for (int r = 0; r < nr_real; r++)
            q[(size_t)r * nc + c] = l->q[(size_t)(r0 + r) * l->N + cols[c]];
        for (int g = 0; g < (nr_real + Gl - 1) / Gl; g++) {
            z[(size_t)g * nc + c] = l->z[(size_t)((r0 + g * Gl) / G) * l->N + cols[c]];
            s[(size_t)g * nc + c] = l->s[(size_t)((r0 + g * Gl) / G) * l->N + cols[c]];
        }
    }
    if (l->f16) {
        uint16_t *w = xcalloc((size_t)nr * nc, 2);
        for (int c = 0; c < nc; c++)
            for (int r = 0; r < nr_real; r++)
                if (cols[c] >= 0)
                    w[(size_t)c * nr + r] = ref_f32_to_f16((float)qlin_w(l, G, r0 + r, cols[c]));
        snprintf(name, sizeof(name), "%s.weight", prefix);
        tl_add(tl, name, FMT_DTYPE_F16, FMT_LAYOUT_ROW_MAJOR, 2, nc, nr, w, (size_t)nr * nc * 2);
    } else {
        uint8_t *qp = xcalloc((size_t)nr * nc / 2, 1), *zp = xcalloc((size_t)ng * nc / 2, 1);
        uint16_t *sp = xcalloc((size_t)ng * nc, 2);
        if (ref_pack_w4(q, nr, nc, qp) || ref_pack_zeros(z, ng, nc, zp) ||
            ref_pack_scales(s, ng, nc, sp))
            abort();
        snprintf(name, sizeof(name), "%s.qweight", prefix);
        tl_add(tl, name, FMT_DTYPE_Q4, FMT_LAYOUT_W4_MMA_T16X64, 2, nr, nc, qp, (size_t)nr * nc / 2);
        snprintf(name, sizeof(name), "%s.qzeros", prefix);
        tl_add(tl, name, FMT_DTYPE_Q4, FMT_LAYOUT_Z4_T64, 2, ng, nc, zp, (size_t)ng * nc / 2);
        snprintf(name, sizeof(name), "%s.scales", prefix);
        tl_add(tl, name, FMT_DTYPE_F16, FMT_LAYOUT_S_T64, 2, ng, nc, sp, (size_t)ng * nc * 2);
    }
    if (with_bias && l->bias) {
        float *b = xcalloc((size_t)nc, 4);
        for (int c = 0; c < nc; c++)
            b[c] = cols[c] >= 0 ? l->bias[cols[c]] : 0;
        snprintf(name, sizeof(name), "%s.bias", prefix);
        tl_add(tl, name, FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR, 1, nc, 0, b, (size_t)nc * 4);
    }
    free(q), free(z), free(s);
}

/* A fused per-rank linear from several canonical linears' column ranges: parts[i] gives the
 * source and its [c0, c0 + n) columns, padded with zero columns to width[i]. Biases are fused
 * the same way when any part has one. */
struct part {
    const struct qlin *l;
    int c0, n, width;
};

static void add_fused(struct tlist *tl, const char *prefix, const struct part *parts, int np,
                      int G)
{
    int nc = 0;
    for (int i = 0; i < np; i++)
        nc += parts[i].width;
    /* build a temporary canonical linear holding the concatenated columns */
    struct qlin f = {0};
    int K = parts[0].l->K;
    f.K = K, f.N = nc, f.f16 = parts[0].l->f16;
    f.q = xcalloc((size_t)K * nc, 1);
    f.z = xcalloc((size_t)(K / G) * nc, 1);
    f.s = xcalloc((size_t)(K / G) * nc, 2);
    bool any_bias = false;
    for (int i = 0; i < np; i++)
        any_bias |= parts[i].l->bias != NULL;
    if (any_bias)
        f.bias = xcalloc((size_t)nc, 4);
    int c = 0;
    for (int i = 0; i < np; i++) {
        const struct qlin *l = parts[i].l;
        for (int j = 0; j < parts[i].n; j++, c++) {
            int sc = parts[i].c0 + j;
            for (int k = 0; k < K; k++)
                f.q[(size_t)k * nc + c] = l->q[(size_t)k * l->N + sc];
            for (int g = 0; g < K / G; g++) {
                f.z[(size_t)g * nc + c] = l->z[(size_t)g * l->N + sc];
                f.s[(size_t)g * nc + c] = l->s[(size_t)g * l->N + sc];
            }
            if (l->bias)
                f.bias[c] = l->bias[sc];
        }
        c += parts[i].width - parts[i].n; /* zero padding columns */
    }
    int *cols = xcalloc((size_t)nc, sizeof(int));
    for (int j = 0; j < nc; j++)
        cols[j] = j;
    add_linear(tl, prefix, &f, G, cols, nc, 0, K, K, true);
    free(cols);
    qlin_free(&f);
}

static int lcm(int a, int b)
{
    int x = a, y = b;
    while (y) {
        int t = x % y;
        x = y, y = t;
    }
    return a / x * b;
}

static void config_json(char *buf, size_t n, const struct syn_spec *sp, int ws, int rank,
                        int vr_delta)
{
    int U = lcm(sp->G, 64);
    int Ipad = (sp->I + U * ws - 1) / (U * ws) * U * ws;
    int kvr = ws <= sp->nkv ? sp->nkv / ws : 1, rep = ws <= sp->nkv ? 1 : ws / sp->nkv;
    char rope[200] = "null", win[32] = "null";
    if (sp->llama3)
        snprintf(rope, sizeof(rope), "{\"rope_type\": \"llama3\", \"factor\": 4.0, "
                 "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                 "\"original_max_position_embeddings\": 32}");
    if (sp->window)
        snprintf(win, sizeof(win), "%d", sp->window);
    snprintf(buf, n,
             "{\"qshard_config_version\": 1, \"architecture\": \"%s\", \"hidden_size\": %d, "
             "\"intermediate_size\": %d, \"intermediate_size_padded\": %d, "
             "\"num_hidden_layers\": %d, \"num_attention_heads\": %d, "
             "\"num_key_value_heads\": %d, \"head_dim\": %d, \"vocab_size\": %d, "
             "\"vocab_size_per_rank\": %d, \"rms_norm_eps\": 1e-5, \"rope_theta\": %g, "
             "\"rope_scaling\": %s, \"max_position_embeddings\": 64, "
             "\"tie_word_embeddings\": %s, \"sliding_window\": %s, \"attention_bias\": %s, "
             "\"num_local_experts\": %d, \"num_experts_per_tok\": %d, "
             "\"quant\": {\"w_bit\": 4, \"group_size\": %d, \"zero_point\": true, "
             "\"source_variant\": \"gemm\", \"source_container\": \"safetensors\", "
             "\"modules_to_not_convert\": []}, \"bos_token_id\": 1, \"eos_token_id\": [2], "
             "\"tp\": {\"world_size\": %d, \"rank\": %d, \"heads_per_rank\": %d, "
             "\"kv_heads_per_rank\": %d, \"kv_head_replicas\": %d, "
             "\"intermediate_per_rank\": %d}}",
             sp->arch, sp->H, sp->I, Ipad, sp->L, sp->nh, sp->nkv, sp->hd, sp->V,
             (sp->V + ws - 1) / ws + vr_delta, sp->theta, rope, sp->tie ? "true" : "false", win,
             sp->qkv_bias ? "true" : "false", sp->E, sp->topk, sp->G, ws, rank, sp->nh / ws,
             kvr, rep, Ipad / ws);
}

/* Tensors of rank `rank` of a TP-ws split of m (DESIGN 5). */
static void rank_tensors(struct tlist *tl, const struct syn_model *m, int ws, int rank,
                         enum corrupt cor)
{
    const struct syn_spec *sp = &m->sp;
    int H = sp->H, hd = sp->hd, G = sp->G;
    int Vr = (sp->V + ws - 1) / ws;
    int U = lcm(G, 64), Ipad = (sp->I + U * ws - 1) / (U * ws) * U * ws, Ir = Ipad / ws;
    int nq = sp->nh / ws, nkv = ws <= sp->nkv ? sp->nkv / ws : 1;
    int kv0 = ws <= sp->nkv ? rank * nkv : rank / (ws / sp->nkv);
    char name[240];

    uint16_t *emb = xcalloc((size_t)Vr * H, 2), *head = NULL;
    for (int v = 0; v < Vr && rank * Vr + v < sp->V; v++)
        memcpy(emb + (size_t)v * H, m->embed + (size_t)(rank * Vr + v) * H, (size_t)H * 2);
    tl_add(tl, "model.embed_tokens.weight", FMT_DTYPE_F16, FMT_LAYOUT_ROW_MAJOR, 2, Vr, H, emb,
           (size_t)Vr * H * 2);
    if (!sp->tie) {
        head = xcalloc((size_t)Vr * H, 2);
        for (int v = 0; v < Vr && rank * Vr + v < sp->V; v++)
            memcpy(head + (size_t)v * H, m->lm_head + (size_t)(rank * Vr + v) * H, (size_t)H * 2);
        tl_add(tl, "lm_head.weight", FMT_DTYPE_F16, FMT_LAYOUT_ROW_MAJOR, 2, Vr, H, head,
               (size_t)Vr * H * 2);
    }
    int nlen = cor == CORRUPT_SHAPE ? H + 1 : H;
    float *fn = xcalloc((size_t)nlen, 4);
    memcpy(fn, m->final_norm, (size_t)H * 4);
    tl_add(tl, "model.norm.weight", FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR, 1, nlen, 0, fn,
           (size_t)nlen * 4);
    if (cor == CORRUPT_EXTRA)
        tl_add(tl, "model.layers.0.self_attn.q_norm.weight", FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR,
               1, hd, 0, rand_vec(hd, 0.9f, 1.1f), (size_t)hd * 4);

    for (int l = 0; l < sp->L; l++) {
        const struct syn_layer *y = &m->layers[l];
        float *an = xcalloc((size_t)H, 4), *mn = xcalloc((size_t)H, 4);
        memcpy(an, y->attn_norm, (size_t)H * 4);
        memcpy(mn, y->mlp_norm, (size_t)H * 4);
        snprintf(name, sizeof(name), "model.layers.%d.input_layernorm.weight", l);
        tl_add(tl, name, FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR, 1, H, 0, an, (size_t)H * 4);
        snprintf(name, sizeof(name), "model.layers.%d.post_attention_layernorm.weight", l);
        if (cor == CORRUPT_MISSING && l == 1)
            free(mn);
        else
            tl_add(tl, name, FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR, 1, H, 0, mn, (size_t)H * 4);

        struct part qkv[3] = {{&y->q, rank * nq * hd, nq * hd, nq * hd},
                              {&y->k, kv0 * hd, nkv * hd, nkv * hd},
                              {&y->v, kv0 * hd, nkv * hd, nkv * hd}};
        snprintf(name, sizeof(name), "model.layers.%d.self_attn.qkv_proj", l);
        add_fused(tl, name, qkv, 3, G);

        int *cols = xcalloc((size_t)(H > 2 * Ir ? H : 2 * Ir), sizeof(int));
        for (int c = 0; c < H; c++)
            cols[c] = c;
        snprintf(name, sizeof(name), "model.layers.%d.self_attn.o_proj", l);
        if (cor == CORRUPT_GROUP && l == 0) { /* G' = K_r: one group, larger than group_size */
            struct qlin o1 = y->o;
            o1.z = xcalloc((size_t)o1.N, 1);
            o1.s = xcalloc((size_t)o1.N, 2);
            memcpy(o1.z, y->o.z, (size_t)o1.N);
            memcpy(o1.s, y->o.s, (size_t)o1.N * 2);
            add_linear(tl, name, &o1, o1.K, cols, H, 0, o1.K, o1.K, rank == 0);
            free(o1.z), free(o1.s);
        } else {
            add_linear(tl, name, &y->o, G, cols, H, rank * nq * hd, nq * hd, nq * hd, rank == 0);
        }
        if (cor == CORRUPT_WRONG_LAYOUT && l == 0)
            for (int i = 0; i < tl->n; i++)
                if (strcmp(tl->t[i].name, "model.layers.0.self_attn.o_proj.scales") == 0)
                    tl->t[i].lay = FMT_LAYOUT_ROW_MAJOR;

        int i0 = rank * Ir, ireal = sp->I - i0 < Ir ? (sp->I - i0 > 0 ? sp->I - i0 : 0) : Ir;
        int E = sp->E ? sp->E : 1;
        for (int e = 0; e < E; e++) {
            const struct qlin *g = sp->E ? &y->eg[e] : &y->gate, *u = sp->E ? &y->eu[e] : &y->up;
            const struct qlin *d = sp->E ? &y->ed[e] : &y->down;
            char pre[128];
            if (sp->E)
                snprintf(pre, sizeof(pre), "model.layers.%d.block_sparse_moe.experts.%d", l, e);
            else
                snprintf(pre, sizeof(pre), "model.layers.%d.mlp", l);
            struct part gu[2] = {{g, i0, ireal, Ir}, {u, i0, ireal, Ir}};
            snprintf(name, sizeof(name), "%s.gate_up_proj", pre);
            add_fused(tl, name, gu, 2, G);
            snprintf(name, sizeof(name), "%s.down_proj", pre);
            add_linear(tl, name, d, G, cols, H, i0, ireal, Ir, rank == 0);
        }
        if (sp->E) {
            float *rt = xcalloc((size_t)sp->E * H, 4);
            memcpy(rt, y->router, (size_t)sp->E * H * 4);
            snprintf(name, sizeof(name), "model.layers.%d.block_sparse_moe.gate.weight", l);
            tl_add(tl, name, FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR, 2, sp->E, H, rt,
                   (size_t)sp->E * H * 4);
        }
        free(cols);
    }
}

static int write_rank(const struct syn_model *m, const char *path, int ws, int rank,
                      enum corrupt cor, const uint8_t *model_id)
{
    struct tlist *tl = xcalloc(1, sizeof(*tl));
    char cfg[4096];
    config_json(cfg, sizeof(cfg), &m->sp, ws, rank, cor == CORRUPT_TOKEN_CONFIG ? 1 : 0);
    rank_tensors(tl, m, ws, rank, cor);
    struct fmt_writer_opts o = {(uint32_t)rank, (uint32_t)ws, {0}};
    memcpy(o.model_id, model_id ? model_id : m->model_id, 16);
    struct fmt_writer *w;
    int rc = -1;
    if (fmt_writer_open(path, &o, &w))
        goto out;
    if (fmt_writer_set_section(w, FMT_SECTION_CONFIG, cfg, strlen(cfg)))
        goto abort;
    uint32_t idx[512];
    for (int i = 0; i < tl->n; i++)
        if (fmt_writer_add_tensor(w, tl->t[i].name, tl->t[i].dt, tl->t[i].lay, tl->t[i].nd,
                                  tl->t[i].shape, FMT_SPLIT_NONE, 0, &idx[i]))
            goto abort;
    if (fmt_writer_begin_data(w))
        goto abort;
    for (int i = 0; i < tl->n; i++)
        if (fmt_writer_put_tensor(w, idx[i], tl->t[i].data, tl->t[i].size))
            goto abort;
    rc = fmt_writer_finish(w) ? -1 : 0;
    goto out;
abort:
    fmt_writer_abort(w);
out:
    tl_free(tl);
    free(tl);
    return rc;
}

/* Write a TP-ws set into dir (created) with its manifest. */
static int write_set(const struct syn_model *m, const char *dir, int ws, enum corrupt cor)
{
    char path[640];
    mkdir(dir, 0755);
    for (int r = 0; r < ws; r++) {
        char fname[64];
        fmt_rank_file_name(fname, sizeof(fname), (uint32_t)r, (uint32_t)ws);
        snprintf(path, sizeof(path), "%s/%s", dir, fname);
        if (write_rank(m, path, ws, r, cor, NULL))
            return -1;
    }
    return fmt_manifest_write(dir, (uint32_t)ws) ? -1 : 0;
}

static void rm_rf(const char *dir)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "test_model: could not remove %s\n", dir);
}

// --- part 1: synthetic models -------------------------------------------------------------------

static char tmp_root[256];

static struct rt_opts cpu_opts(int n_ctx, int max_batch, int threads)
{
    struct rt_opts o = rt_opts_default();
    o.device = RT_DEVICE_CPU;
    o.n_ctx = n_ctx;
    o.max_batch = max_batch;
    o.n_threads = threads;
    return o;
}

/* Run all-position logits of tok[0..T) on the model in path; NULL on failure. */
static float *run_logits(const char *path, const int32_t *tok, int T, int max_batch, int V)
{
    struct rt_model *rm = NULL;
    struct rt_opts o = cpu_opts(64, max_batch, 2);
    enum rt_err e = rt_model_open(path, &o, &rm);
    CHECK_MSG(e == RT_ERR_NONE, "open %s: %s (%s)", path, rt_err_str(e), qs_log_last());
    if (e)
        return NULL;
    float *lg = xcalloc((size_t)T * V, 4);
    e = rt_model_forward(rm, tok, T, 0, lg, true);
    CHECK_MSG(e == RT_ERR_NONE, "forward %s: %s", path, rt_err_str(e));
    rt_model_free(rm);
    if (e) {
        free(lg);
        return NULL;
    }
    return lg;
}

static float *emu_logits(const char *dir, const int32_t *tok, int T, int V, int max_batch);
static void test_pick(const char *dir, const char *dir_tp2, const int32_t *tok, int T, int V);
static void test_graph_fallback(const char *dir, const int32_t *tok, int T, int V, bool moe);

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

    /* the same sets through the fp16-activation emulation (act_size 2), in chunks of 5 rows */
    for (int i = 0; i < n_tp; i++) {
        snprintf(dir, sizeof(dir), "%s/%s-tp%d", tmp_root, label, tps[i]);
        float *lg = emu_logits(dir, tok, T, sp->V, 5);
        if (!lg)
            continue;
        double e = rel_l2(lg, want, (size_t)T * sp->V);
        printf("  %-12s TP-%d fp16 activations vs double reference: rel L2 %.2e\n", label,
               tps[i], e);
        CHECK_MSG(e <= 2e-3 && e > 1e-6, "%s TP-%d fp16 emulation: rel L2 %g", label, tps[i], e);
        free(lg);
    }

    /* device-side sampling plumbing (rt_model_forward_pick) on the TP-1 set */
    char dir2[512];
    snprintf(dir, sizeof(dir), "%s/%s-tp1", tmp_root, label);
    snprintf(dir2, sizeof(dir2), "%s/%s-tp%d", tmp_root, label, tps[n_tp - 1]);
    test_pick(dir, tps[n_tp - 1] > 1 ? dir2 : NULL, tok, T, sp->V);
    test_graph_fallback(dir, tok, T, sp->V, sp->E > 0);
    if (tps[n_tp - 1] > 1)
        test_graph_fallback(dir2, tok, T, sp->V, sp->E > 0);

    /* decode token by token after a 5-token prefill == the all-at-once logits */
    snprintf(dir, sizeof(dir), "%s/%s-tp1", tmp_root, label);
    struct rt_model *rm = NULL;
    struct rt_opts o = cpu_opts(T, 0, 1);
    if (tp1 && rt_model_open(dir, &o, &rm) == RT_ERR_NONE) {
        float *row = xcalloc((size_t)sp->V, 4);
        CHECK_EQ_INT(rt_model_forward(rm, tok, 5, 0, row, false), RT_ERR_NONE);
        double d = rel_l2_f(row, tp1 + (size_t)4 * sp->V, (size_t)sp->V);
        CHECK_MSG(d <= 1e-6, "%s: last-row prefill logits differ: %g", label, d);
        for (int t = 5; t < T; t++) {
            CHECK_EQ_INT(rt_model_forward(rm, tok + t, 1, t, row, false), RT_ERR_NONE);
            d = rel_l2_f(row, tp1 + (size_t)t * sp->V, (size_t)sp->V);
            CHECK_MSG(d <= 1e-5, "%s: decode step %d differs from prefill: %g", label, t, d);
        }
        CHECK_EQ_INT(rt_model_n_past(rm), T);
        /* rewind: re-running position 7 gives the same logits again */
        CHECK_EQ_INT(rt_model_forward(rm, tok + 7, 1, 7, row, false), RT_ERR_NONE);
        CHECK(rel_l2_f(row, tp1 + (size_t)7 * sp->V, (size_t)sp->V) <= 1e-5);
        /* context overflow, bad tokens, bad start_pos: reported, nothing run */
        qs_log_set_quiet(true);
        CHECK_EQ_INT(rt_model_forward(rm, tok, 1, T, row, false), RT_ERR_ARG);
        rt_model_reset(rm);
        CHECK_EQ_INT(rt_model_forward(rm, tok, T, 0, NULL, false), RT_ERR_NONE);
        CHECK_EQ_INT(rt_model_forward(rm, tok, 1, T, row, false), RT_ERR_CONTEXT);
        CHECK(strstr(qs_log_last(), "context overflow") != NULL);
        int32_t bad[2] = {3, sp->V};
        rt_model_reset(rm);
        CHECK_EQ_INT(rt_model_forward(rm, bad, 2, 0, row, false), RT_ERR_TOKEN);
        CHECK(strstr(qs_log_last(), "index 1") != NULL);
        bad[1] = -1;
        CHECK_EQ_INT(rt_model_forward(rm, bad, 2, 0, row, false), RT_ERR_TOKEN);
        CHECK_EQ_INT(rt_model_forward(rm, bad, 0, 0, row, false), RT_ERR_ARG);
        qs_log_set_quiet(false);
        free(row);
        rt_model_free(rm);
    } else {
        CHECK_MSG(0, "%s: cannot reopen TP-1 model", label);
    }
    free(tp1);
    free(want);
    syn_free(&m);
}

// --- an fp16-activation backend emulated on the CPU ---------------------------------------------

/*
 * The CUDA backend keeps activations and the KV cache in fp16 (act_size = kv_size = 2) and only
 * the residual stream and logits in fp32. This backend does the same on the CPU (each op:
 * fp16 -> fp32, the ref_* function, round back to fp16), so the model code's handling of
 * act_size (row and head offsets, buffer sizes, the rmsnorm modes, all_reduce types) is tested
 * here, and the fp16 numerics can be compared with the goldens before any GPU runs.
 */
static float *h2f(const void *src, size_t n)
{
    const uint16_t *s = src;
    float *d = xcalloc(n, 4);
    for (size_t i = 0; i < n; i++)
        d[i] = ref_f16_to_f32(s[i]);
    return d;
}

static void f2h(void *dst, const float *src, size_t n)
{
    uint16_t *d = dst;
    for (size_t i = 0; i < n; i++)
        d[i] = ref_f32_to_f16(src[i]);
}

static void emu_destroy(void *ctx)
{
    (void)ctx;
}

static enum rt_err emu_load(void *ctx, int rank, const struct fmt_shard *s)
{
    (void)ctx, (void)rank, (void)s;
    return RT_ERR_NONE;
}

static const void *emu_tensor(void *ctx, int rank, const struct fmt_tensor *t)
{
    (void)ctx, (void)rank;
    return t->data;
}

static enum rt_err emu_alloc(void *ctx, int rank, size_t bytes, void **out)
{
    (void)ctx, (void)rank;
    *out = xcalloc(bytes, 1);
    return RT_ERR_NONE;
}

static void emu_free(void *ctx, int rank, void *p)
{
    (void)ctx, (void)rank;
    free(p);
}

static enum rt_err emu_copy(void *ctx, int rank, void *dst, const void *src, size_t bytes)
{
    (void)ctx, (void)rank;
    memmove(dst, src, bytes);
    return RT_ERR_NONE;
}

static enum rt_err emu_zero(void *ctx, int rank, void *dst, size_t bytes)
{
    (void)ctx, (void)rank;
    memset(dst, 0, bytes);
    return RT_ERR_NONE;
}

static enum rt_err emu_embed(void *ctx, int rank, float *out, const uint16_t *table,
                             const int32_t *tokens, int M, int64_t row_begin, int V_r, int H)
{
    (void)ctx, (void)rank;
    ref_embed(out, table, tokens, M, row_begin, V_r, H);
    return RT_ERR_NONE;
}

static enum rt_err emu_rmsnorm(void *ctx, int rank, void *out, float *residual, const void *x,
                               const float *w, int M, int H, float eps)
{
    (void)ctx, (void)rank;
    size_t n = (size_t)M * H;
    float *xf = x ? h2f(x, n) : NULL, *of = xcalloc(n, 4);
    ref_rmsnorm(of, residual, xf, w, M, H, eps);
    f2h(out, of, n);
    free(xf), free(of);
    return RT_ERR_NONE;
}

static enum rt_err emu_linear_w4(void *ctx, int rank, const void *x, const uint8_t *qweight,
                                 const uint8_t *qzeros, const uint16_t *scales, const float *bias,
                                 int M, int K, int N, int G, void *y)
{
    (void)ctx, (void)rank;
    float *xf = h2f(x, (size_t)M * K), *yf = xcalloc((size_t)M * N, 4);
    enum ref_err e = ref_w4a16_linear(xf, qweight, qzeros, scales, bias, M, K, N, G, yf, NULL);
    f2h(y, yf, (size_t)M * N);
    free(xf), free(yf);
    return e ? RT_ERR_SHAPE : RT_ERR_NONE;
}

static enum rt_err emu_linear_f16(void *ctx, int rank, const void *x, const uint16_t *W,
                                  const float *bias, int M, int K, int N, void *y)
{
    (void)ctx, (void)rank;
    float *xf = h2f(x, (size_t)M * K), *yf = xcalloc((size_t)M * N, 4);
    ref_linear_f16(xf, W, bias, M, K, N, yf, NULL);
    f2h(y, yf, (size_t)M * N);
    free(xf), free(yf);
    return RT_ERR_NONE;
}

static enum rt_err emu_lm_head(void *ctx, int rank, const void *x, const uint16_t *W, int M,
                               int K, int N, float *logits)
{
    (void)ctx, (void)rank;
    float *xf = h2f(x, (size_t)M * K);
    ref_linear_f16(xf, W, NULL, M, K, N, logits, NULL);
    free(xf);
    return RT_ERR_NONE;
}

static enum rt_err emu_router(void *ctx, int rank, const void *x, const float *W, int M, int K,
                              int N, float *y)
{
    (void)ctx, (void)rank;
    float *xf = h2f(x, (size_t)M * K);
    ref_linear_f32(xf, W, NULL, M, K, N, y);
    free(xf);
    return RT_ERR_NONE;
}

static enum rt_err emu_rope(void *ctx, int rank, void *x, int M, int n_heads, int hd,
                            size_t row_stride, int start_pos, const float *inv_freq)
{
    (void)ctx, (void)rank;
    size_t n = (size_t)(M - 1) * row_stride + (size_t)n_heads * hd;
    float *xf = h2f(x, n);
    int32_t *pos = xcalloc((size_t)M, 4);
    for (int m = 0; m < M; m++)
        pos[m] = start_pos + m;
    ref_rope(xf, M, n_heads, hd, row_stride, pos, inv_freq);
    f2h(x, xf, n);
    free(xf), free(pos);
    return RT_ERR_NONE;
}

static enum rt_err emu_kv_store(void *ctx, int rank, void *k_cache, void *v_cache, const void *k,
                                const void *v, size_t row_stride, int M, int start_pos,
                                int n_kv_heads, int hd, int T_cap)
{
    (void)ctx, (void)rank;
    for (int m = 0; m < M; m++)
        for (int h = 0; h < n_kv_heads; h++) {
            size_t dst = ((size_t)h * T_cap + (size_t)(start_pos + m)) * hd;
            size_t src = (size_t)m * row_stride + (size_t)h * hd;
            memcpy((uint16_t *)k_cache + dst, (const uint16_t *)k + src, (size_t)hd * 2);
            memcpy((uint16_t *)v_cache + dst, (const uint16_t *)v + src, (size_t)hd * 2);
        }
    return RT_ERR_NONE;
}

static enum rt_err emu_attention(void *ctx, int rank, void *out, size_t out_stride, const void *q,
                                 size_t q_stride, const void *k_cache, const void *v_cache, int M,
                                 int start_pos, int n_heads, int n_kv_heads, int hd, int T_cap,
                                 int sliding_window)
{
    (void)ctx, (void)rank;
    size_t nq = (size_t)(M - 1) * q_stride + (size_t)n_heads * hd;
    size_t no = (size_t)(M - 1) * out_stride + (size_t)n_heads * hd;
    size_t nkv = (size_t)n_kv_heads * T_cap * hd;
    float *qf = h2f(q, nq), *of = h2f(out, no), *kf = h2f(k_cache, nkv), *vf = h2f(v_cache, nkv);
    enum ref_err e = ref_attention(of, out_stride, qf, q_stride, kf, vf, M, start_pos, n_heads,
                                   n_kv_heads, hd, T_cap, sliding_window, NULL);
    f2h(out, of, no);
    free(qf), free(of), free(kf), free(vf);
    return e ? RT_ERR_SHAPE : RT_ERR_NONE;
}

static enum rt_err emu_silu_mul(void *ctx, int rank, void *out, const void *gate_up, int M, int I)
{
    (void)ctx, (void)rank;
    float *gf = h2f(gate_up, (size_t)M * 2 * I), *of = xcalloc((size_t)M * I, 4);
    ref_silu_mul(of, gf, M, I);
    f2h(out, of, (size_t)M * I);
    free(gf), free(of);
    return RT_ERR_NONE;
}

static enum rt_err emu_gather(void *ctx, int rank, void *dst, const void *src,
                              const int32_t *rows, int n, int width)
{
    (void)ctx, (void)rank;
    for (int i = 0; i < n; i++)
        memcpy((uint16_t *)dst + (size_t)i * width, (const uint16_t *)src + (size_t)rows[i] * width,
               (size_t)width * 2);
    return RT_ERR_NONE;
}

static enum rt_err emu_scatter_add(void *ctx, int rank, void *y, const void *src,
                                   const int32_t *rows, const float *weights, int n, int width)
{
    (void)ctx, (void)rank;
    for (int i = 0; i < n; i++) {
        uint16_t *yr = (uint16_t *)y + (size_t)rows[i] * width;
        const uint16_t *sr = (const uint16_t *)src + (size_t)i * width;
        for (int j = 0; j < width; j++)
            yr[j] = ref_f32_to_f16(ref_f16_to_f32(yr[j]) + weights[i] * ref_f16_to_f32(sr[j]));
    }
    return RT_ERR_NONE;
}

static enum rt_err emu_all_reduce(void *ctx, void *const *bufs, int world, size_t n,
                                  enum rt_buf_type type)
{
    (void)ctx;
    for (size_t i = 0; i < n; i++) {
        float sum = 0;
        for (int r = 0; r < world; r++)
            sum += type == RT_BUF_F32 ? ((float *)bufs[r])[i] : ref_f16_to_f32(((uint16_t *)bufs[r])[i]);
        for (int r = 0; r < world; r++) {
            if (type == RT_BUF_F32)
                ((float *)bufs[r])[i] = sum;
            else
                ((uint16_t *)bufs[r])[i] = ref_f32_to_f16(sum);
        }
    }
    return RT_ERR_NONE;
}

static const struct rt_backend_ops emu_ops = {
    .name = "cpu-fp16-emulation",
    .act_size = 2,
    .kv_size = 2,
    .destroy = emu_destroy,
    .load_weights = emu_load,
    .tensor_ptr = emu_tensor,
    .alloc = emu_alloc,
    .free = emu_free,
    .upload = emu_copy,
    .download = emu_copy,
    .zero = emu_zero,
    .embed = emu_embed,
    .rmsnorm = emu_rmsnorm,
    .linear_w4 = emu_linear_w4,
    .linear_f16 = emu_linear_f16,
    .lm_head = emu_lm_head,
    .router = emu_router,
    .rope = emu_rope,
    .kv_store = emu_kv_store,
    .attention = emu_attention,
    .silu_mul = emu_silu_mul,
    .gather_rows = emu_gather,
    .scatter_add_rows = emu_scatter_add,
    .all_reduce = emu_all_reduce,
};

/*
 * rt.h's optional sample op, on the host: the survivors and probabilities of rt_sampler (the
 * reference) for the parameters and history in `pk`, then rt_sample_pick (step 7) with the
 * caller's draw pk->u. With it the emulated backend can run rt_model_forward_pick, whose model
 * plumbing (which row reaches the sampler, chunked prefill, the draw and the history passed
 * through) is what test_pick checks; the CUDA kernel itself is checked in gpu_test_kernels.
 */
/* rt.h's copy_ranks on the emulated backend: every rank's memory is host memory. */
static enum rt_err emu_copy_ranks(void *ctx, int dst_rank, void *dst, int src_rank,
                                  const void *src, size_t bytes)
{
    (void)ctx, (void)dst_rank, (void)src_rank;
    memmove(dst, src, bytes);
    return RT_ERR_NONE;
}

static enum rt_err emu_sample(void *ctx, int rank, const float *logits, int V,
                              const struct rt_pick *pk, int32_t *id)
{
    (void)ctx;
    (void)rank;
    struct rt_sampler s = {0};
    if (rt_sampler_init(&s, &pk->p, V) != RT_SAMPLE_ERR_NONE)
        return RT_ERR_ARG;
    if (pk->seen) /* may be NULL without a repetition penalty (rt.h) */
        memcpy(s.seen, pk->seen, ((size_t)V + 7) / 8);
    int32_t n = rt_sampler_candidates(&s, logits, V);
    *id = n < 1                      ? -1
          : pk->p.temperature > 0.0f ? rt_sample_pick(s.cand, s.prob, n, pk->u)
                                     : s.cand[0];
    rt_sampler_free(&s);
    return RT_ERR_NONE;
}

/*
 * The model's side of the decode-step graphs (rt.h graph_begin / graph_end / graph_ready /
 * graph_replay) at any world size, with graph ops that record nothing: the emulated backend's
 * ops run as they are called, so a "recording" runs the step once and the model, when the
 * recording fails, runs it again op by op (same inputs, same KV rows: the same numbers). What
 * is checked is the orchestration rt_model.c must get right with several ranks: every rank
 * begins before the step's ops, only ranks that began are ended, the ranks after a failure are
 * ended with ok = false (discarded), a failed recording leaves the step's logits exactly as
 * without graphs, and after two failed recordings no more are tried.
 */
static struct {
    int fail_begin, fail_end;     /* rank whose graph_begin / graph_end fails; -1: none */
    int begins, ends, ends_ok, replays, world;
    bool capturing[8], bad_order; /* bad_order: an end without a begin, or a begin twice */
} g_graph;

static enum rt_err mock_graph_begin(void *ctx, int rank)
{
    (void)ctx;
    g_graph.begins++;
    if (rank < 0 || rank >= g_graph.world || g_graph.capturing[rank])
        g_graph.bad_order = true;
    for (int r = 0; r < rank && r < 8; r++) /* ranks begin in order, all before the ops */
        if (!g_graph.capturing[r])
            g_graph.bad_order = true;
    if (rank == g_graph.fail_begin)
        return RT_ERR_DEVICE;
    if (rank >= 0 && rank < 8)
        g_graph.capturing[rank] = true;
    return RT_ERR_NONE;
}
static enum rt_err mock_graph_end(void *ctx, int rank, bool ok)
{
    (void)ctx;
    g_graph.ends++;
    g_graph.ends_ok += ok;
    if (rank < 0 || rank >= 8 || !g_graph.capturing[rank])
        g_graph.bad_order = true;
    else
        g_graph.capturing[rank] = false;
    return ok && rank == g_graph.fail_end ? RT_ERR_DEVICE : RT_ERR_NONE;
}
static bool mock_graph_ready(void *ctx, int rank)
{
    (void)ctx;
    (void)rank;
    return false; /* nothing is ever recorded: every attempt ends as a failed recording */
}
static enum rt_err mock_graph_replay(void *ctx, int rank, int32_t token, int pos, bool *done)
{
    (void)ctx, (void)rank, (void)token, (void)pos;
    g_graph.replays++;
    *done = false;
    return RT_ERR_NONE;
}

static void test_graph_fallback(const char *dir, const int32_t *tok, int T, int V, bool moe)
{
    struct rt_backend_ops gops = emu_ops;
    gops.graph_begin = mock_graph_begin;
    gops.graph_end = mock_graph_end;
    gops.graph_ready = mock_graph_ready;
    gops.graph_replay = mock_graph_replay;
    struct rt_opts o = cpu_opts(T + 8, 0, 1);
    enum { STEPS = 4 };
    float *want = xcalloc((size_t)STEPS * V, 4), *got = xcalloc((size_t)STEPS * V, 4);
    /* scenarios: no failure, rank 0's / the last rank's begin fails, rank 0's end fails */
    for (int sc = -1; sc < 4; sc++) {
        struct rt_backend be = {sc < 0 ? &emu_ops : &gops, NULL};
        struct rt_model *rm = NULL;
        if (rt_model_open_backend(dir, &o, &be, &rm) != RT_ERR_NONE) {
            CHECK_MSG(0, "%s: graph test set-up failed: %s", dir, qs_log_last());
            break;
        }
        const int world = rt_model_world_size(rm);
        memset(&g_graph, 0, sizeof g_graph);
        g_graph.world = world;
        g_graph.fail_begin = sc == 1 ? 0 : sc == 2 ? world - 1 : -1;
        g_graph.fail_end = sc == 3 ? 0 : -1;
        float *lg = xcalloc((size_t)V, 4);
        CHECK_EQ_INT(rt_model_forward(rm, tok, T, 0, lg, false), RT_ERR_NONE);
        int32_t next = tok[T - 1];
        for (int st = 0; st < STEPS; st++) {
            float *row = (sc < 0 ? want : got) + (size_t)st * V;
            CHECK_EQ_INT(rt_model_forward(rm, &next, 1, T + st, row, false), RT_ERR_NONE);
            next = (int32_t)(((unsigned)next * 7u + 3u) % (unsigned)V); /* any valid id */
        }
        free(lg);
        rt_model_free(rm);
        if (sc < 0)
            continue;
        CHECK_MSG(memcmp(want, got, (size_t)STEPS * V * 4) == 0,
                  "%s: scenario %d: decode logits after failed graph recordings differ from "
                  "the run without graphs", dir, sc);
        CHECK_MSG(!g_graph.bad_order, "%s: scenario %d: graph_begin / graph_end out of order",
                  dir, sc);
        CHECK_EQ_INT(g_graph.replays, 0); /* never ready: never replayed */
        const int tries = moe ? 0 : 2;    /* two failed recordings, then op by op */
        const int begun = sc == 1 ? 0 : sc == 2 ? world - 1 : world; /* ranks ended per try */
        CHECK_MSG(g_graph.begins == tries * (sc == 1 ? 1 : world) && g_graph.ends == tries * begun,
                  "%s: scenario %d (world %d): %d begins, %d ends, want %d and %d", dir, sc,
                  world, g_graph.begins, g_graph.ends, tries * (sc == 1 ? 1 : world),
                  tries * begun);
        /* ok = true reaches every begun rank when nothing failed; after a failed begin none;
         * after rank 0's failed end only rank 0 (the ranks after it are discarded) */
        const int ok_per_try = sc == 0 ? world : sc == 3 ? 1 : 0;
        CHECK_MSG(g_graph.ends_ok == tries * ok_per_try,
                  "%s: scenario %d: %d ends with ok, want %d", dir, sc, g_graph.ends_ok,
                  tries * ok_per_try);
    }
    free(want);
    free(got);
}

/*
 * rt_model_forward_pick (the emulated backend with emu_sample, prefill in chunks of 5) gives
 * the ids of rt_model_forward + rt_sampler_next on the same backend without it, over a T-token
 * prompt and 8 decode steps, greedy and sampled with a repetition penalty, on the TP-1 set and
 * (dir_tp2) a TP-N set, whose vocab slices the model gathers on rank 0 with copy_ranks first;
 * backends without a sample op, or at TP > 1 without copy_ranks, are refused with
 * RT_ERR_UNSUPPORTED.
 */
static void test_pick(const char *dir, const char *dir_tp2, const int32_t *tok, int T, int V)
{
    struct rt_backend_ops pick_ops = emu_ops;
    pick_ops.sample = emu_sample;
    pick_ops.copy_ranks = emu_copy_ranks; /* several ranks: logits gathered on rank 0 */
    struct rt_opts o = cpu_opts(T + 8, 5, 1);
    struct rt_sample_params ps[2] = {rt_sample_params_default(), rt_sample_params_default()};
    ps[0].temperature = 0.0f;
    ps[0].repeat_penalty = 1.5f;
    ps[1].temperature = 0.9f;
    ps[1].top_k = 12;
    ps[1].top_p = 0.9f;
    ps[1].repeat_penalty = 1.3f;
    ps[1].seed = 42;
    /* the TP-1 set, then (dir_tp2) the TP-N set: its vocab-parallel slices gathered on rank 0
     * (copy_ranks), padding columns past V dropped */
    for (int c = 0; c < 2 * (dir_tp2 ? 2 : 1); c++) {
        const char *dd = c < 2 ? dir : dir_tp2;
        int32_t want[9], got[9];
        for (int mode = 0; mode < 2; mode++) {
            struct rt_backend be = {mode ? &pick_ops : &emu_ops, NULL};
            struct rt_model *rm = NULL;
            struct rt_sampler smp = {0};
            int32_t *out = mode ? got : want;
            if (rt_model_open_backend(dd, &o, &be, &rm) != RT_ERR_NONE ||
                rt_sampler_init(&smp, &ps[c % 2], V) != RT_SAMPLE_ERR_NONE) {
                CHECK_MSG(0, "%s: pick test set-up failed: %s", dd, qs_log_last());
                rt_model_free(rm);
                return;
            }
            CHECK(rt_model_can_pick(rm) == (mode == 1));
            for (int t = 0; t < T; t++)
                rt_sampler_accept(&smp, tok[t]);
            float *row = xcalloc((size_t)V, 4);
            for (int step = 0; step < 9; step++) {
                const int32_t *in = step ? &out[step - 1] : tok;
                int n = step ? 1 : T, pos = step ? T + step - 1 : 0;
                if (mode) {
                    struct rt_pick pk = {smp.p,
                                         smp.p.temperature > 0 ? rt_sampler_uniform(&smp) : 0.0,
                                         smp.seen};
                    CHECK_EQ_INT(rt_model_forward_pick(rm, in, n, pos, &pk, &out[step]),
                                 RT_ERR_NONE);
                } else {
                    CHECK_EQ_INT(rt_model_forward(rm, in, n, pos, row, false), RT_ERR_NONE);
                    CHECK_EQ_INT(rt_sampler_next(&smp, row, V, &out[step]), RT_SAMPLE_ERR_NONE);
                }
                CHECK(out[step] >= 0 && out[step] < V);
                rt_sampler_accept(&smp, out[step] >= 0 && out[step] < V ? out[step] : 0);
            }
            free(row);
            rt_sampler_free(&smp);
            rt_model_free(rm);
        }
        CHECK_MSG(memcmp(want, got, sizeof(want)) == 0,
                  "%s: ids picked through rt_model_forward_pick differ from the host sampler's "
                  "(setting %d)", dd, c % 2);
    }
    /* refusals: the plain CPU backend has no sample op; several ranks without copy_ranks */
    qs_log_set_quiet(true);
    struct rt_model *rm = NULL;
    struct rt_pick pk = {rt_sample_params_default(), 0.0, NULL};
    pk.p.temperature = 0.0f; /* greedy, no penalty: no draw, no history */
    int32_t id = 0;
    if (rt_model_open(dir, &o, &rm) == RT_ERR_NONE) {
        CHECK(!rt_model_can_pick(rm));
        CHECK_EQ_INT(rt_model_forward_pick(rm, tok, 1, 0, &pk, &id), RT_ERR_UNSUPPORTED);
        CHECK_EQ_INT(rt_model_forward_pick(rm, tok, 1, 0, NULL, &id), RT_ERR_ARG);
        rt_model_free(rm);
    }
    /* bad requests are refused before anything runs (n_past stays) */
    if (rt_model_open_backend(dir, &o, &(struct rt_backend){&pick_ops, NULL}, &rm) ==
        RT_ERR_NONE) {
        CHECK_EQ_INT(rt_model_forward_pick(rm, tok, 3, 0, &pk, &id), RT_ERR_NONE);
        struct rt_pick bad[5] = {pk, pk, pk, pk, pk};
        bad[0].p.repeat_penalty = 1.2f; /* no history */
        bad[1].p.temperature = 0.7f;
        bad[1].u = 1.0;
        bad[2].p.top_p = 0.0f;
        bad[3].p.temperature = NAN;
        bad[4].p.min_p = 1.5f;
        for (int b = 0; b < 5; b++) {
            CHECK_EQ_INT(rt_model_forward_pick(rm, tok + 3, 1, 3, &bad[b], &id), RT_ERR_ARG);
            CHECK_EQ_INT(rt_model_n_past(rm), 3);
        }
        rt_model_free(rm);
    }
    rm = NULL;
    struct rt_backend_ops no_copy = pick_ops;
    no_copy.copy_ranks = NULL;
    struct rt_backend be = {&no_copy, NULL};
    if (dir_tp2 && rt_model_open_backend(dir_tp2, &o, &be, &rm) == RT_ERR_NONE) {
        CHECK(!rt_model_can_pick(rm));
        CHECK_EQ_INT(rt_model_forward_pick(rm, tok, 1, 0, &pk, &id), RT_ERR_UNSUPPORTED);
        rt_model_free(rm);
    }
    qs_log_set_quiet(false);
}

/* fp16-activation logits of tok[0..T) (all rows) on the model in dir; NULL on failure. */
static float *emu_logits(const char *dir, const int32_t *tok, int T, int V, int max_batch)
{
    struct rt_backend be = {&emu_ops, NULL};
    struct rt_opts o = cpu_opts(T, max_batch, 1);
    struct rt_model *rm = NULL;
    enum rt_err e = rt_model_open_backend(dir, &o, &be, &rm);
    CHECK_MSG(e == RT_ERR_NONE, "fp16 emulation: open %s: %s (%s)", dir, rt_err_str(e),
              qs_log_last());
    if (e)
        return NULL;
    float *lg = xcalloc((size_t)T * V, 4);
    e = rt_model_forward(rm, tok, T, 0, lg, true);
    CHECK_MSG(e == RT_ERR_NONE, "fp16 emulation: forward %s: %s", dir, rt_err_str(e));
    rt_model_free(rm);
    if (e) {
        free(lg);
        return NULL;
    }
    return lg;
}

/* Overwrite the layout tag of tensor `name` in a rank file and fix the tensor-table checksum,
 * producing a file that is valid except for an unknown layout. */
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
    struct rt_model *rm = (struct rt_model *)&rm; /* poisoned: must come back NULL */
    struct rt_opts o = cpu_opts(16, 0, 1);
    qs_log_set_quiet(true);
    enum rt_err e = rt_model_open(path, &o, &rm);
    qs_log_set_quiet(false);
    CHECK_MSG(e == want, "open %s: expected %s, got %s (%s)", path, rt_err_str(want),
              rt_err_str(e), qs_log_last());
    CHECK(rm == NULL);
    CHECK_MSG(!needle || strstr(qs_log_last(), needle), "message \"%s\" lacks \"%s\"",
              qs_log_last(), needle);
    if (e == RT_ERR_NONE)
        rt_model_free(rm);
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
    struct rt_model *rm = NULL;
    struct rt_opts o = cpu_opts(65, 0, 1);
    qs_log_set_quiet(true);
    CHECK_EQ_INT(rt_model_open(dir, &o, &rm), RT_ERR_CONTEXT);
    o.device = RT_DEVICE_CUDA; /* CPU-only build: a clear refusal */
    o.n_ctx = 16;
    enum rt_err ce = rt_model_open(dir, &o, &rm);
    qs_log_set_quiet(false);
    if (!rt_cuda_available()) {
        CHECK_EQ_INT(ce, RT_ERR_NO_DEVICE);
        CHECK(strstr(qs_log_last(), "without CUDA") || strstr(qs_log_last(), "GPU"));
    }
    if (ce == RT_ERR_NONE)
        rt_model_free(rm);
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
    CHECK_EQ_INT(c.arch, RT_ARCH_LLAMA);
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
        {"\"architecture\": \"llama\"", "\"architecture\": \"falcon\"", RT_ERR_UNSUPPORTED,
         "falcon"},
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
        struct rt_model *rm = NULL;
        struct rt_opts o = cpu_opts(64, 0, 0);
        if (rt_model_open(dir, &o, &rm) == RT_ERR_NONE) {
            int32_t tok[33];
            for (int i = 0; i < 33; i++)
                tok[i] = (int32_t)(rnd_u32() % 2000);
            float *row = xcalloc(2000, 4);
            struct timespec a, b, c2;
            clock_gettime(CLOCK_MONOTONIC, &a);
            CHECK_EQ_INT(rt_model_forward(rm, tok, 32, 0, row, false), RT_ERR_NONE);
            clock_gettime(CLOCK_MONOTONIC, &b);
            for (int i = 0; i < 16; i++)
                CHECK_EQ_INT(rt_model_forward(rm, tok + 32, 1, 32 + i, row, false), RT_ERR_NONE);
            clock_gettime(CLOCK_MONOTONIC, &c2);
            double tp = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
            double td = (c2.tv_sec - b.tv_sec) + (c2.tv_nsec - b.tv_nsec) * 1e-9;
            printf("  cpu bench (H 512, I 1408, 4 layers, V 2000, G 128, %ld threads): prefill "
                   "%.1f tok/s, decode %.1f tok/s\n", sysconf(_SC_NPROCESSORS_ONLN), 32 / tp,
                   16 / td);
            free(row);
            rt_model_free(rm);
        }
    }
    syn_free(&m);
}

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
    struct rt_model *rm = NULL;
    struct rt_opts o = cpu_opts(T + 16, 0, 0);
    enum rt_err e = rt_model_open(dir, &o, &rm);
    CHECK_MSG(e == RT_ERR_NONE, "open %s: %s: %s", dir, rt_err_str(e), qs_log_last());
    if (e)
        return NULL;
    float *lg = xcalloc((size_t)T * V, 4);
    e = rt_model_forward(rm, ids, T, 0, lg, true);
    CHECK_MSG(e == RT_ERR_NONE, "forward %s: %s", dir, rt_err_str(e));
    if (!e && seq)
        memcpy(seq, lg, (size_t)T * V * 4);
    int32_t tok = ref_argmax(lg + (size_t)(T - 1) * V, V, V);
    float *row = xcalloc((size_t)V, 4);
    for (int i = 0; !e && i < 16; i++) {
        greedy[i] = tok;
        if (i == 15)
            break;
        e = rt_model_forward(rm, &tok, 1, T + i, row, false);
        CHECK_MSG(e == RT_ERR_NONE, "decode %s step %d: %s", dir, i, rt_err_str(e));
        if (seq)
            memcpy(seq + (size_t)(T + i) * V, row, (size_t)V * 4);
        tok = ref_argmax(row, V, V);
    }
    free(row);
    rt_model_free(rm);
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
    if (nh % tp || G <= 0 || hd <= 0)
        return false;
    if (tp <= nkv ? nkv % tp != 0 : tp % nkv != 0)
        return false;
    /* o_proj's local group size gcd(G, K_r) must be a multiple of 16 (DESIGN 4) */
    int kr = nh / tp * hd, nkv_r = tp <= nkv ? nkv / tp : 1;
    return kr % 16 == 0 && gcd_i(G, kr) % 16 == 0 && (nh / tp + 2 * nkv_r) * hd % 64 == 0;
}

static void test_fixture(const cJSON *model, const char *qshard)
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
    for (size_t ti = 0; ti < sizeof(tps) / sizeof(tps[0]); ti++) {
        int tp = tps[ti];
        snprintf(out, sizeof(out), "%s/fx-%s-tp%d", tmp_root, name, tp);
        snprintf(cmd, sizeof(cmd), "'%s' convert '%s' '%s' --tp %d -q 2>'%s.log'", qshard, src,
                 out, tp, out);
        int rc = run_cmd(cmd);
        if (!tp_possible(nh, nkv, hd, G, tp)) { /* DESIGN 4/5 rules: must be refused */
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
                printf("  %-24s %-7s TP-%d vs transformers: rel L2 %.2e", name, pname, tp, e);
                CHECK_MSG(e <= 5e-3, "%s %s TP-%d: rel L2 %g vs golden", name, pname, tp, e);
                int same = memcmp(greedy, want_greedy, sizeof(greedy)) == 0;
                printf(", greedy %s", same ? "identical" : "DIFFERS");
                CHECK_MSG(same, "%s %s TP-%d: greedy continuation differs from the golden", name,
                          pname, tp);
                if (cJSON_IsString(js) && same) {
                    float *gs = read_npy(js->valuestring, T + 15, V);
                    if (gs) {
                        double es = rel_l2_f(seq, gs, (size_t)(T + 15) * V);
                        printf(", decode rows rel L2 %.2e", es);
                        CHECK_MSG(es <= 5e-3, "%s %s TP-%d: decode logits rel L2 %g", name, pname,
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
        test_fixture(m, qshard);
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
 * 4 heads); logits of a fixed prompt from rt_model_open/rt_model_forward compared TP-N vs TP-1
 * and TP-1 vs d_forward (fp64) over the dequantized per-channel weights, unpacked here from the
 * written GEMM tensors; greedy 16-token continuations compared too.
 */
static void test_per_channel(const char *qshard)
{
    const char *base = "tests/data/models/llama-gqa-gemm";
    char dir[512], path[700], out[600], cmd[2048];
    struct cvt_source *src = NULL;
    struct stat st;
    snprintf(path, sizeof(path), "%s/config.json", base);
    if (stat(path, &st) != 0) {
        printf("  per-channel: %s absent, skipped\n", base);
        return;
    }
    snprintf(dir, sizeof(dir), "%s/perchan", tmp_root);
    mkdir(dir, 0777);
    qs_log_set_level(QS_LOG_ERROR); /* the fixture has no tokenizer: expected, not news */
    CHECK(cvt_source_open(base, &src) == CVT_ERR_NONE);
    qs_log_set_level(QS_LOG_WARN);
    if (!src)
        return;
    const struct cvt_hf_config *cfg = cvt_source_config(src);
    int H = (int)cfg->hidden_size, I = (int)cfg->intermediate_size, V = (int)cfg->vocab_size;
    int L = (int)cfg->num_hidden_layers, nh = (int)cfg->num_attention_heads;
    int nkv = (int)cfg->num_key_value_heads, hd = (int)cfg->head_dim;
    double theta = cfg->rope_theta;
    size_t n_src = cvt_source_n_tensors(src);
    int n = 0, n_q = 0;
    struct st_entry *e = xcalloc(n_src, sizeof(*e));
    for (size_t i = 0; i < n_src; i++) {
        const struct cvt_src_tensor *t = cvt_source_tensor(src, i);
        struct st_entry *x = &e[n++];
        snprintf(x->name, sizeof(x->name), "%s", t->name);
        x->dtype = cvt_dtype_str(t->dtype);
        x->n_dims = t->n_dims;
        for (int d = 0; d < t->n_dims && d < 2; d++)
            x->shape[d] = t->shape[d];
        x->size = (size_t)t->nbytes;
        x->data = xcalloc(x->size, 1);
        CHECK(cvt_source_read(src, t, x->data, x->size) == CVT_ERR_NONE);
        size_t len = strlen(t->name);
        bool zs = len > 7 && (!strcmp(t->name + len - 7, ".qzeros") ||
                              !strcmp(t->name + len - 7, ".scales"));
        if (zs && t->n_dims == 2 && t->shape[0] > 1) { /* keep group 0 only: [1, cols] */
            x->size /= (size_t)t->shape[0];
            x->shape[0] = 1;
            n_q++;
        }
    }
    cvt_source_close(src);
    CHECK_MSG(n_q == 2 * 7 * L, "per-channel: %d grouped scales/qzeros, want %d", n_q, 14 * L);
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
    bool tie = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cj, "tie_word_embeddings"));
    char *cjs = cJSON_Print(cj);
    cJSON_Delete(cj);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    CHECK(f && cjs && fputs(cjs, f) >= 0);
    if (f)
        fclose(f);
    free(cjs);

    /* the reference model: G = K for every linear; d_forward takes one G, so all K must agree */
    int qd = nh * hd, kvd = nkv * hd;
    CHECK_MSG(H == qd && H == I, "per-channel: H %d, heads x head_dim %d, I %d differ", H, qd, I);
    struct syn_spec sp = {"llama", H, I, L, nh, nkv, hd, V, H, 0, 0, 0,
                          tie, false, false, false, false, theta};
    struct syn_model m;
    memset(&m, 0, sizeof(m));
    m.sp = sp;
    m.layers = xcalloc((size_t)L, sizeof(*m.layers));
    bool ok = H == qd && H == I;
    char nm[200];
    for (int l = 0; ok && l < L; l++) {
        struct syn_layer *y = &m.layers[l];
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
    m.final_norm = pc_floats(e, n, "model.norm.weight", (size_t)H);
    float *emb = pc_floats(e, n, "model.embed_tokens.weight", (size_t)V * H);
    m.embed = xcalloc((size_t)V * H, 2);
    for (size_t i = 0; i < (size_t)V * H; i++) /* the fp16 fixture: exact */
        m.embed[i] = ref_f32_to_f16(emb[i]);
    free(emb);
    if (!tie) {
        float *hd32 = pc_floats(e, n, "lm_head.weight", (size_t)V * H);
        m.lm_head = xcalloc((size_t)V * H, 2);
        for (size_t i = 0; i < (size_t)V * H; i++)
            m.lm_head[i] = ref_f32_to_f16(hd32[i]);
        free(hd32);
    }
    for (int i = 0; i < n; i++)
        free(e[i].data);
    free(e);

    /* fp64 reference: prompt logits and a 16-token greedy continuation */
    static const int32_t ids[] = {1, 17, 42, 99, 5, 63, 120, 8, 77, 31};
    enum { T = sizeof(ids) / sizeof(ids[0]), NG = 16 };
    int32_t seq[T + NG], ref_greedy[NG];
    memcpy(seq, ids, sizeof(ids));
    double *dref = xcalloc((size_t)(T + NG) * V, 8), *dlg = xcalloc((size_t)T * V, 8);
    float *row = xcalloc((size_t)V, 4);
    for (int i = 0; ok && i < NG; i++) {
        d_forward(&m, seq, T + i, dref);
        if (i == 0)
            memcpy(dlg, dref, (size_t)T * V * 8);
        for (int v = 0; v < V; v++)
            row[v] = (float)dref[(size_t)(T + i - 1) * V + v];
        ref_greedy[i] = seq[T + i] = ref_argmax(row, V, V);
    }
    free(row), free(dref);

    float *tp1 = NULL;
    int n_ok = 0;
    for (int tp = 1; ok && tp <= 4; tp++) {
        snprintf(out, sizeof(out), "%s/perchan-tp%d", tmp_root, tp);
        snprintf(cmd, sizeof(cmd), "'%s' convert '%s' '%s' --tp %d -q 2>'%s.log'", qshard, dir,
                 out, tp, out);
        int rc = run_cmd(cmd);
        if (!tp_possible(nh, nkv, hd, H, tp)) {
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
        int32_t greedy[NG];
        float *lg = fixture_run(out, ids, T, V, greedy, NULL);
        if (!lg)
            continue;
        n_ok++;
        int same = memcmp(greedy, ref_greedy, sizeof(greedy)) == 0;
        double er = rel_l2(lg, dlg, (size_t)T * V);
        printf("  per-channel TP-%d vs fp64 of the dequantized source: rel L2 %.2e, greedy %s", tp,
               er, same ? "identical" : "DIFFERS");
        CHECK_MSG(er <= 1e-5, "per-channel TP-%d vs fp64 reference: rel L2 %g", tp, er);
        CHECK_MSG(same, "per-channel TP-%d: greedy continuation differs from the fp64 one", tp);
        if (tp == 1) {
            tp1 = lg;
            lg = NULL;
        } else if (tp1) {
            double d = rel_l2_f(lg, tp1, (size_t)T * V);
            printf(", vs TP-1 %.2e", d);
            CHECK_MSG(d <= 1e-5, "per-channel TP-%d vs TP-1: rel L2 %g", tp, d);
        }
        printf("\n");
        free(lg);
        if (tp > 1)
            rm_rf(out);
    }
    CHECK_MSG(!ok || n_ok == 3, "per-channel: %d of TP 1, 2, 4 ran", n_ok);
    free(tp1), free(dlg);
    syn_free(&m);
}

int main(void)
{
    T_INIT("model");
    qs_log_set_level(QS_LOG_WARN); /* no start-up info lines between the results */
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(tmp_root, sizeof(tmp_root), "%s/qshard-test-model-XXXXXX", tmp);
    if (!mkdtemp(tmp_root)) {
        fprintf(stderr, "test_model: mkdtemp %s: %s\n", tmp_root, strerror(errno));
        return 1;
    }
    test_config();

    /* llama: GQA 4/2, head_dim 64 != H/heads, llama3 rope, odd vocab, padded I, f16 linear */
    struct syn_spec llama = {"llama", 128, 160, 2, 4, 2, 64, 101, 32, 0, 0, 0,
                             false, false, false, true, true, 10000.0};
    static const int tps124[] = {1, 2, 4};
    test_synthetic("llama", &llama, tps124, 3);
    /* qwen2: qkv biases, tied embeddings, o_proj bias (rank 0 only), MHA */
    struct syn_spec qwen = {"qwen2", 128, 256, 2, 2, 2, 64, 77, 64, 0, 0, 0,
                            true, true, true, false, false, 1000000.0};
    static const int tps12[] = {1, 2};
    test_synthetic("qwen2", &qwen, tps12, 2);
    /* mistral: sliding window 5 over 12 tokens */
    struct syn_spec mis = {"mistral", 128, 128, 2, 4, 1, 32 * 2, 64, 32, 0, 0, 5,
                           false, false, false, false, false, 10000.0};
    test_synthetic("mistral", &mis, tps124, 3);
    /* llama, the fixtures' shape: 4 heads of 64, group 128: at TP-4 o_proj holds 64 rows of
     * each 128-row group, stored with local group size 64 (DESIGN 4) */
    struct syn_spec g128 = {"llama", 256, 256, 2, 4, 2, 64, 101, 128, 0, 0, 0,
                            false, false, false, false, false, 10000.0};
    test_synthetic("llama-g128", &g128, tps124, 3);
    /* mixtral: 4 experts, top-2 */
    struct syn_spec mix = {"mixtral", 128, 128, 2, 4, 2, 64, 90, 32, 4, 2, 0,
                           false, false, false, false, false, 1000000.0};
    test_synthetic("mixtral", &mix, tps12, 2);
    test_errors();
    test_fixtures();
    test_per_channel(getenv("QSHARD") ? getenv("QSHARD") : "build/qshard");
    bench_cpu();
    rm_rf(tmp_root);
    return t_done();
}
