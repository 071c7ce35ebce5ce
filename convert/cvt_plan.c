/*
 * cvt_plan.c - the tensor-parallel plan: which source tensor rectangles make up which output
 * tensor of which rank (docs/DESIGN.md section 5), decided once from the config and the names of
 * the tensors in the files.
 *
 * Entry points: cvt_dims_from_hf, cvt_plan_build, cvt_plan_free, cvt_plan_find,
 * cvt_plan_valid_tp (declared in cvt.h); the --dry-run printout is cvt_plan_print.c.
 *
 * The names come from the architecture descriptor (convert/cvt_arch.h): its HF names are the
 * only source names the model may contain (plus the fixed suffixes of a linear: .qweight /
 * .qzeros / .scales / .scaled_zeros, .weight, .bias); a file name that was not generated from it
 * is an error (except the buffers its IGNORE steps name), a generated name the model needs that
 * the files lack is an error. Output names are format/fmt_names.h roles. The descriptor's steps
 * are planned in order, which is the rank file's tensor order: embedding, lm_head, final norm,
 * then per layer the descriptor's steps.
 *
 * Split rules (DESIGN 5; vLLM QKVParallelLinear / MergedColumnParallelLinear / RowParallelLinear,
 * docs/FORMATS.md section 11):
 *   column-parallel (q, k, v, gate, up, w1, w3): output columns; q/k/v fused [q_r | k_r | v_r],
 *     gate/up fused [gate_r | up_r]; kv heads replicated when tp > kv heads.
 *   row-parallel (o, down, w2): input rows; bias on rank 0 only. A rank holding part of a
 *     group gets the local group size G_r = gcd(G, K_r) (DESIGN 4): G_r divides G and every
 *     slice start, so each local group lies inside one source group and repeats its scale/zero
 *     row; dequantization is unchanged. Refused when G_r is not a multiple of 16.
 *   per-channel (group_size -1): G = K of each linear, so the same rule gives G_r = K_r for a
 *     row split at any tp (and gcd(I, I_r) for a padded down_proj).
 *   intermediate: U = lcm(G, 64) (64 per-channel), I_pad = ceil(I / (U*tp)) * U*tp,
 *     I_r = I_pad / tp, rank r holds [r*I_r, min((r+1)*I_r, I)), the rest zero.
 *   vocab: V_r = ceil(V / tp), rows [r*V_r, min((r+1)*V_r, V)), the rest zero.
 *
 * Test: ./build/test_cvt_plan (real configs, tp 1..8, impossible tp values).
 */
#include "cvt.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cvt_arch.h"  /* struct cvt_arch: the family's tensors and splits */
#include "fmt_names.h" /* fmt_name, FMT_SUFFIX_* */
#include "qs_log.h"    /* qs_log_error, qs_log_warn */

/* --- small helpers ------------------------------------------------------------------------ */

/* Bound on outputs over all ranks (~1.4 GB of plan); 70B at tp 8 needs ~6k, a 256-expert MoE
 * with 60 layers at tp 8 ~250k. */
#define CVT_PLAN_MAX_OUTPUTS (4 * 1000 * 1000)

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static int64_t gcd64(int64_t a, int64_t b)
{
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* The source group size of a quantized linear with K input rows: G, or K when per-channel. */
static int64_t src_group(const struct cvt_dims *d, int64_t K)
{
    return d->group_size > 0 ? d->group_size : K;
}

/* Intermediate padding unit U = lcm(G, 64) (DESIGN 5): whole groups and whole n-tiles per rank.
 * Per-channel has no group to keep whole on gate/up (G = H there); 64 keeps the n-tiles. */
static int64_t inter_unit(const struct cvt_dims *d)
{
    int64_t G = d->group_size;
    return G > 0 ? G / gcd64(G, 64) * 64 : 64;
}

/*
 * Local group size G_r of a W4 output with K_out rows whose rows [dst_r0, dst_r0 + n_rows) come
 * from source rows [src_r0, ...) of a linear with source group size Gs (n_rows = 0: all
 * padding). G_r = gcd(Gs, K_out, src_r0, dst_r0, dst_r0 + n_rows) (gcd(x, 0) = x): it divides Gs
 * and the slice start, so every local group of real rows lies inside one source group (and takes
 * that group's scale/zero row), and it divides the real/padding boundary, so no local group mixes
 * real rows with padding (whose scales are 0). For the DESIGN 5 splits this is gcd(G, K_r).
 */
static int64_t local_group(int64_t Gs, int64_t K_out, int64_t src_r0, int64_t dst_r0,
                           int64_t n_rows)
{
    int64_t g = gcd64(gcd64(Gs, K_out), src_r0);
    return gcd64(gcd64(g, dst_r0), n_rows > 0 ? dst_r0 + n_rows : 0);
}

/* --- tp rules ----------------------------------------------------------------------------- */

/* Head / kv-head rules for tp (DESIGN 5). Writes nq_r, nkv_r, replicas; returns false with a
 * reason in why[]. */
static bool tp_heads_ok(const struct cvt_dims *d, int tp, int *nq_r, int *nkv_r, int *replicas,
                        char *why, size_t n_why)
{
    if (tp < 1) {
        snprintf(why, n_why, "--tp must be >= 1, got %d", tp);
        return false;
    }
    if (d->n_heads % tp) {
        snprintf(why, n_why, "num_attention_heads %d is not divisible by tp %d", d->n_heads, tp);
        return false;
    }
    if (tp <= d->n_kv_heads) {
        if (d->n_kv_heads % tp) {
            snprintf(why, n_why, "num_key_value_heads %d is not divisible by tp %d", d->n_kv_heads,
                     tp);
            return false;
        }
        *nkv_r = d->n_kv_heads / tp;
        *replicas = 1;
    } else {
        if (tp % d->n_kv_heads) {
            snprintf(why, n_why,
                     "tp %d > num_key_value_heads %d but is not a multiple of it (kv heads can be "
                     "neither split nor evenly replicated)",
                     tp, d->n_kv_heads);
            return false;
        }
        *nkv_r = 1;
        *replicas = tp / d->n_kv_heads;
    }
    *nq_r = d->n_heads / tp;
    return true;
}

/* Per-rank packed-layout rules of one quantized output (DESIGN 4: K % 16, N % 64, and the local
 * group size G_r = local_group(...) a multiple of 16; G_r divides K by construction), plus the
 * source's own rule: its K_src is whole groups of Gs (AWQ quantizes whole groups). */
static bool w4_shape_ok(int64_t K, int64_t N, int64_t K_src, int64_t Gs, int64_t G_r,
                        const char *what, char *why, size_t n_why)
{
    if (K_src % Gs) {
        snprintf(why, n_why,
                 "%s: the source linear has K=%" PRId64 " input rows, not a multiple of "
                 "group_size %" PRId64 " (AWQ quantizes whole groups)",
                 what, K_src, Gs);
        return false;
    }
    if (K % 16 || N % 64) {
        snprintf(why, n_why,
                 "%s per rank is [K=%" PRId64 ", N=%" PRId64 "] but the packed int4 layout needs "
                 "K %% 16 == 0 and N %% 64 == 0",
                 what, K, N);
        return false;
    }
    if (G_r % 16) {
        snprintf(why, n_why,
                 "%s per rank has K=%" PRId64 " rows; its local group size gcd(group_size %" PRId64
                 ", K_r %" PRId64 ") = %" PRId64 " is not a multiple of 16 (packed int4 layout)",
                 what, K, Gs, K, G_r);
        return false;
    }
    return true;
}

/* Rank r's share of axis a (DESIGN 5) for tp: source range [start, start + count) (count <= 0:
 * all padding) in a per-rank width. */
struct tp_geom {
    const struct cvt_dims *d;
    int tp, nq_r, nkv_r, rep;
    int64_t I_r;
};

static int64_t axis_full(const struct cvt_dims *d, enum cvt_axis a)
{
    switch (a) {
    case CVT_AXIS_HIDDEN: return d->hidden;
    case CVT_AXIS_Q: return (int64_t)d->n_heads * d->head_dim;
    case CVT_AXIS_KV: return (int64_t)d->n_kv_heads * d->head_dim;
    case CVT_AXIS_INTER: return d->intermediate;
    }
    return 0;
}

static void axis_slice(const struct tp_geom *g, enum cvt_axis a, int r, int64_t *start,
                       int64_t *count, int64_t *width)
{
    const int64_t hd = g->d->head_dim;
    switch (a) {
    case CVT_AXIS_Q:
        *width = *count = g->nq_r * hd;
        *start = r * *width;
        return;
    case CVT_AXIS_KV: /* kv head r / replicas when tp > kv heads */
        *width = *count = g->nkv_r * hd;
        *start = (g->tp <= g->d->n_kv_heads ? (int64_t)r * g->nkv_r : r / g->rep) * hd;
        return;
    case CVT_AXIS_INTER:
        *width = g->I_r;
        *start = r * g->I_r;
        *count = min64(g->I_r, g->d->intermediate - *start);
        return;
    case CVT_AXIS_HIDDEN: break;
    }
    *start = 0;
    *width = *count = axis_full(g->d, a);
}

/* The shape rule of linear output `lin` on every rank of tp (DESIGN 4, assuming it is
 * quantized): the same rules emit_column / emit_row apply. */
static bool linear_tp_ok(const struct tp_geom *g, const struct cvt_arch_linear *lin, char *why,
                         size_t n_why)
{
    const struct cvt_dims *d = g->d;
    char what[160];
    if (!fmt_name(what, sizeof(what), lin->role, 0, 0, NULL))
        snprintf(what, sizeof(what), "role %d", (int)lin->role);
    int64_t K = axis_full(d, lin->parts[0].k), Gs = src_group(d, K);
    if (lin->split == FMT_SPLIT_COLUMN) {
        int64_t N = 0, st, cnt, w;
        for (int i = 0; i < lin->n_parts; i++) {
            axis_slice(g, lin->parts[i].n, 0, &st, &cnt, &w);
            N += w;
        }
        return w4_shape_ok(K, N, K, Gs, local_group(Gs, K, 0, 0, K), what, why, n_why);
    }
    int64_t N = axis_full(d, lin->parts[0].n);
    for (int r = 0; r < g->tp; r++) { /* each rank's slice start and real row count */
        int64_t k0, n_k, K_r;
        axis_slice(g, lin->parts[0].k, r, &k0, &n_k, &K_r);
        if (!w4_shape_ok(K_r, N, K, Gs, local_group(Gs, K_r, k0, 0, n_k), what, why, n_why))
            return false;
    }
    return true;
}

/* Every rule for tp assuming all decoder linears are quantized (the config-level view). */
static bool tp_ok(const struct cvt_dims *d, int tp, char *why, size_t n_why)
{
    struct tp_geom g = {d, tp, 0, 0, 0, 0};
    if (!d->arch) {
        snprintf(why, n_why, "no architecture");
        return false;
    }
    if (!tp_heads_ok(d, tp, &g.nq_r, &g.nkv_r, &g.rep, why, n_why))
        return false;
    int64_t U = inter_unit(d);
    g.I_r = ceil_div(d->intermediate, U * tp) * U;
    for (int s = 0; s < d->arch->n_steps; s++) {
        const struct cvt_arch_step *st = &d->arch->steps[s];
        for (int j = 0; st->op == CVT_ARCH_OP_LINEARS && j < st->n_linears; j++)
            if (!linear_tp_ok(&g, &st->linears[j], why, n_why))
                return false;
    }
    return true;
}

int cvt_plan_valid_tp(const struct cvt_dims *d, int max_tp, int *vals, int cap)
{
    char why[256];
    int n = 0;
    for (int t = 1; t <= max_tp && n < cap; t++)
        if (tp_ok(d, t, why, sizeof(why)))
            vals[n++] = t;
    return n;
}

/* "1 2 4 8" into buf: the valid tp values up to the head count. */
static void valid_tp_str(const struct cvt_dims *d, char *buf, size_t n_buf)
{
    int vals[64];
    int n = cvt_plan_valid_tp(d, d->n_heads, vals, 64);
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && at + 12 < n_buf; i++)
        at += (size_t)snprintf(buf + at, n_buf - at, "%s%d", i ? " " : "", vals[i]);
    if (n == 0)
        snprintf(buf, n_buf, "none");
}

/* --- plan construction -------------------------------------------------------------------- */

/* Source-name lookup: sorted copy of the name list + "consumed" marks to find unknown names. */
struct name_set {
    int n;
    const char **names; /* sorted, borrowed strings */
    bool *used;
};

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int set_find(const struct name_set *s, const char *name)
{
    int lo = 0, hi = s->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(s->names[mid], name);
        if (c == 0)
            return mid;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

/* Is `name` in the files? Marks it consumed. */
static bool set_take(struct name_set *s, const char *name)
{
    int i = set_find(s, name);
    if (i < 0)
        return false;
    s->used[i] = true;
    return true;
}

static bool set_has(const struct name_set *s, const char *name) { return set_find(s, name) >= 0; }

struct builder {
    struct cvt_plan *p;
    struct name_set set;    /* n = 0 when planning from the config alone */
    bool have_names;
    int cap_srcs;
    int *cap_outs;          /* [tp] */
    int n_warn_unlisted;    /* float linears not named in modules_to_not_convert */
    int n_warn_listed;      /* quantized linears named in modules_to_not_convert */
    int n_act;              /* act-order linears (cvt_name_list) */
    const char *const *act;
};

static int add_src(struct builder *b, const char *name, enum cvt_src_kind kind, int64_t rows,
                   int64_t cols)
{
    struct cvt_plan *p = b->p;
    if (p->n_srcs == b->cap_srcs) {
        int cap = b->cap_srcs ? 2 * b->cap_srcs : 256;
        struct cvt_plan_src *s = realloc(p->srcs, (size_t)cap * sizeof(*s));
        if (!s)
            return -1;
        p->srcs = s;
        b->cap_srcs = cap;
    }
    struct cvt_plan_src *s = &p->srcs[p->n_srcs];
    memset(s, 0, sizeof(*s));
    snprintf(s->name, sizeof(s->name), "%s", name);
    s->kind = kind;
    s->rows = rows;
    s->cols = cols;
    s->group = kind == CVT_SRC_AWQ ? src_group(&p->d, rows) : 0;
    return p->n_srcs++;
}

static uint64_t out_bytes(const struct cvt_out *o, bool aligned)
{
    uint64_t K = (uint64_t)o->rows, N = (uint64_t)o->cols, a = aligned ? CVT_FILE_ALIGN : 1;
    switch (o->kind) {
    case CVT_OUT_W4:
        return align_up(K * N / 2, a) + align_up(K / (uint64_t)o->group * N * 2, a) +
               align_up(K / (uint64_t)o->group * N / 2, a);
    case CVT_OUT_LINEAR_F16:
    case CVT_OUT_MAT_F16:
        return align_up(K * N * 2, a);
    case CVT_OUT_VEC_F32:
    case CVT_OUT_PERM:
        return align_up(K * N * 4, a);
    }
    return 0;
}

/* Append an output to rank r; returns it (zeroed but for name/kind/shape) or NULL (no memory). */
static struct cvt_out *add_out(struct builder *b, int r, const char *name, enum cvt_out_kind kind,
                               int64_t rows, int64_t cols)
{
    struct cvt_rank_plan *rp = &b->p->ranks[r];
    if (rp->n_outs == b->cap_outs[r]) {
        int cap = b->cap_outs[r] ? 2 * b->cap_outs[r] : 64;
        struct cvt_out *o = realloc(rp->outs, (size_t)cap * sizeof(*o));
        if (!o)
            return NULL;
        rp->outs = o;
        b->cap_outs[r] = cap;
    }
    struct cvt_out *o = &rp->outs[rp->n_outs++];
    memset(o, 0, sizeof(*o));
    snprintf(o->name, sizeof(o->name), "%s", name);
    o->kind = kind;
    o->rows = rows;
    o->cols = cols;
    return o;
}

/* Append a segment to o (nothing when it is empty: all padding on this rank). CVT_ERR_NOMEM. */
static enum cvt_err add_seg(struct cvt_out *o, int src, int64_t src_r0, int64_t src_c0,
                            int64_t n_rows, int64_t n_cols, int64_t dst_r0, int64_t dst_c0)
{
    if (n_rows <= 0 || n_cols <= 0)
        return CVT_ERR_NONE;
    if (o->n_segs == o->cap_segs) {
        const int cap = o->cap_segs ? 2 * o->cap_segs : CVT_MAX_SEGS;
        struct cvt_seg *ns = realloc(o->segs, (size_t)cap * sizeof(*ns));
        if (!ns) {
            qs_log_error("cvt_plan_build", "out of memory for the segments of %s", o->name);
            return CVT_ERR_NOMEM;
        }
        o->segs = ns, o->cap_segs = cap;
    }
    o->segs[o->n_segs++] = (struct cvt_seg){src, src_r0, src_c0, n_rows, n_cols, dst_r0, dst_c0};
    return CVT_ERR_NONE;
}

static bool not_convert_listed(const struct cvt_dims *d, const char *module)
{
    for (int i = 0; i < d->n_not_convert; i++)
        if (d->not_convert[i][0] && strstr(module, d->not_convert[i]))
            return true;
    return false;
}

/* One source linear as found in the files: quantized or float, with or without bias. */
struct lin {
    char module[160];       /* source module prefix */
    bool quantized;
    bool bias;
    int src;                /* plan source index of the weight (AWQ prefix or float .weight) */
    int src_bias;           /* plan source index of .bias, -1 if none */
    int64_t K, N;           /* the source's shape (a fused source: all of its parts) */
    int64_t n_off;          /* first source column of this part (a fused source's later parts) */
    bool act_order;         /* quantized with an act-order g_idx (cvt_name_list.act_order) */
};

/* Decide how the source linear `module` ([K, N]) is stored and mark its tensors consumed.
 * `bias_default` is the config's expectation when planning without names. */
static enum cvt_err lin_resolve(struct builder *b, const char *module, int64_t K, int64_t N,
                                bool bias_default, struct lin *l)
{
    static const char *const q_sfx[] = {"qweight", "qzeros", "scales", "scaled_zeros", "g_idx",
                                        "weight_packed", "weight_scale", "weight_zero_point",
                                        "weight_shape", "weight_g_idx"};
    char nm[200];
    memset(l, 0, sizeof(*l));
    snprintf(l->module, sizeof(l->module), "%s", module);
    l->K = K;
    l->N = N;
    bool listed = not_convert_listed(&b->p->d, module);
    if (!b->have_names) {
        l->quantized = !listed;
        l->bias = bias_default;
    } else {
        bool has_q = false, has_w;
        for (size_t i = 0; i < sizeof(q_sfx) / sizeof(q_sfx[0]); i++) {
            snprintf(nm, sizeof(nm), "%s.%s", module, q_sfx[i]);
            has_q |= set_take(&b->set, nm);
        }
        snprintf(nm, sizeof(nm), "%s.weight", module);
        has_w = set_take(&b->set, nm);
        if (has_q && has_w) {
            qs_log_error(__func__, "tensor %s.weight: linear %s has both a float .weight and "
                                   "quantized qweight/scales/qzeros; expected one of them",
                         module, module);
            return CVT_ERR_UNKNOWN_TENSOR;
        }
        if (!has_q && !has_w) {
            qs_log_error(__func__, "tensor %s.qweight: missing: the model needs linear %s "
                                   "(expected %s.qweight/.scales/.qzeros, or %s.weight when it is "
                                   "listed in modules_to_not_convert), the files have neither",
                         module, module, module, module);
            return CVT_ERR_MISSING_TENSOR;
        }
        l->quantized = has_q;
        if (has_q && listed)
            b->n_warn_listed++;
        if (!has_q && !listed)
            b->n_warn_unlisted++;
        snprintf(nm, sizeof(nm), "%s.bias", module);
        l->bias = set_take(&b->set, nm);
    }
    if (l->quantized) {
        for (int i = 0; i < b->n_act; i++)
            l->act_order |= !strcmp(b->act[i], module);
        l->src = add_src(b, module, CVT_SRC_AWQ, K, N);
    } else {
        snprintf(nm, sizeof(nm), "%s.weight", module);
        l->src = add_src(b, nm, CVT_SRC_FLOAT, K, N);
        if (l->src >= 0)
            b->p->srcs[l->src].file_transposed = true;
    }
    l->src_bias = -1;
    if (l->src >= 0 && l->bias) {
        snprintf(nm, sizeof(nm), "%s.bias", module);
        l->src_bias = add_src(b, nm, CVT_SRC_FLOAT, 1, N);
        if (l->src_bias < 0)
            return CVT_ERR_NOMEM;
    }
    return l->src < 0 ? CVT_ERR_NOMEM : CVT_ERR_NONE;
}

/* A fused group (q/k/v or gate/up) must be stored one way. */
static enum cvt_err lin_group_check(const struct lin *ls, int n, const char *out_name)
{
    for (int i = 1; i < n; i++) {
        if (ls[i].quantized != ls[0].quantized) {
            qs_log_error(__func__, "tensor %s: %s is %s but %s is %s; the fused %s needs all of "
                                   "its parts stored the same way",
                         ls[i].module, ls[0].module, ls[0].quantized ? "quantized" : "float",
                         ls[i].module, ls[i].quantized ? "quantized" : "float", out_name);
            return CVT_ERR_UNSUPPORTED;
        }
        if (ls[i].bias != ls[0].bias) {
            qs_log_error(__func__, "tensor %s.bias: %s %s a bias but %s %s; expected all parts of "
                                   "the fused %s to have one or none",
                         ls[i].module, ls[0].module, ls[0].bias ? "has" : "has no", ls[i].module,
                         ls[i].bias ? "has" : "has no", out_name);
            return CVT_ERR_MISSING_TENSOR;
        }
    }
    return CVT_ERR_NONE;
}

/* Column-parallel piece: source columns [c0, c0 + n) of linear l into output columns at dst. */
struct colpiece {
    const struct lin *l;
    int64_t c0, n, dst;
};

/* Emit a fused column-parallel output (weight + optional bias) for rank r. */
static enum cvt_err emit_column(struct builder *b, int r, const char *out_name, int64_t K,
                                int64_t N_out, const struct colpiece *pc, int n_pc)
{
    const struct lin *l0 = pc[0].l;
    char why[320], nm[200];
    struct cvt_out *o;
    int64_t Gs = src_group(&b->p->d, K), G_r = local_group(Gs, K, 0, 0, K);
    if (l0->quantized) {
        if (!w4_shape_ok(K, N_out, pc[0].l->K, Gs, G_r, out_name, why, sizeof(why))) {
            char valid[256];
            valid_tp_str(&b->p->d, valid, sizeof(valid));
            qs_log_error(__func__, "tensor %s: --tp %d: %s; valid --tp values for this model: %s",
                         out_name, b->p->tp, why, valid);
            return CVT_ERR_TP;
        }
        if ((o = add_out(b, r, out_name, CVT_OUT_W4, K, N_out)))
            o->group = G_r;
    } else {
        snprintf(nm, sizeof(nm), "%s" FMT_SUFFIX_WEIGHT, out_name);
        o = add_out(b, r, nm, CVT_OUT_LINEAR_F16, K, N_out);
    }
    if (!o)
        return CVT_ERR_NOMEM;
    o->split = FMT_SPLIT_COLUMN;
    for (int i = 0; i < n_pc; i++)
        CVT_TRY(add_seg(o, pc[i].l->src, 0, pc[i].c0, K, pc[i].n, 0, pc[i].dst));
    if (l0->bias) {
        snprintf(nm, sizeof(nm), "%s" FMT_SUFFIX_BIAS, out_name);
        if (!(o = add_out(b, r, nm, CVT_OUT_VEC_F32, 1, N_out)))
            return CVT_ERR_NOMEM;
        o->split = FMT_SPLIT_COLUMN;
        for (int i = 0; i < n_pc; i++)
            CVT_TRY(add_seg(o, pc[i].l->src_bias, 0, pc[i].c0, 1, pc[i].n, 0, pc[i].dst));
    }
    return CVT_ERR_NONE;
}

/* Emit a row-parallel output: source rows [k0, k0 + n_k) of l into output rows [0, n_k) of an
 * output with K_out rows (the rest padding); bias on rank 0 only. */
static enum cvt_err emit_row(struct builder *b, int r, const char *out_name, const struct lin *l,
                             int64_t k0, int64_t n_k, int64_t K_out)
{
    char why[320], nm[200];
    struct cvt_out *o;
    int64_t Gs = src_group(&b->p->d, l->K), G_r = local_group(Gs, K_out, k0, 0, n_k);
    if (l->quantized) {
        if (!w4_shape_ok(K_out, l->N, l->K, Gs, G_r, out_name, why, sizeof(why))) {
            char valid[256];
            valid_tp_str(&b->p->d, valid, sizeof(valid));
            qs_log_error(__func__, "tensor %s: --tp %d: %s; valid --tp values for this model: %s",
                         out_name, b->p->tp, why, valid);
            return CVT_ERR_TP;
        }
        if ((o = add_out(b, r, out_name, CVT_OUT_W4, K_out, l->N)))
            o->group = G_r;
    } else {
        snprintf(nm, sizeof(nm), "%s" FMT_SUFFIX_WEIGHT, out_name);
        o = add_out(b, r, nm, CVT_OUT_LINEAR_F16, K_out, l->N);
    }
    if (!o)
        return CVT_ERR_NOMEM;
    o->split = FMT_SPLIT_ROW;
    CVT_TRY(add_seg(o, l->src, k0, 0, n_k, l->N, 0, 0));
    if (l->bias && r == 0) {
        snprintf(nm, sizeof(nm), "%s" FMT_SUFFIX_BIAS, out_name);
        if (!(o = add_out(b, r, nm, CVT_OUT_VEC_F32, 1, l->N)))
            return CVT_ERR_NOMEM;
        CVT_TRY(add_seg(o, l->src_bias, 0, 0, 1, l->N, 0, 0));
    }
    return CVT_ERR_NONE;
}

/* Replicated float tensor (norm weight, router) on every rank: source `src_name` -> output
 * `out_name`. */
static enum cvt_err emit_replicated(struct builder *b, const char *src_name, const char *out_name,
                                    int64_t rows, int64_t cols, float offset)
{
    if (b->have_names && !set_take(&b->set, src_name)) {
        qs_log_error(__func__, "tensor %s: missing: the model needs it (shape [%" PRId64
                               "%s%" PRId64 "]) and the files lack it",
                     src_name, rows > 1 ? rows : cols, rows > 1 ? ", " : "", rows > 1 ? cols : 0);
        return CVT_ERR_MISSING_TENSOR;
    }
    int s = add_src(b, src_name, CVT_SRC_FLOAT, rows, cols);
    if (s < 0)
        return CVT_ERR_NOMEM;
    for (int r = 0; r < b->p->tp; r++) {
        struct cvt_out *o = add_out(b, r, out_name, CVT_OUT_VEC_F32, rows, cols);
        if (!o)
            return CVT_ERR_NOMEM;
        o->offset = offset;
        CVT_TRY(add_seg(o, s, 0, 0, rows, cols, 0, 0));
    }
    return CVT_ERR_NONE;
}

/* Vocab-parallel F16 matrix (embedding or lm_head) from source `src_name`. */
static enum cvt_err emit_vocab(struct builder *b, const char *out_name, const char *src_name)
{
    const struct cvt_plan *p = b->p;
    int64_t V = p->d.vocab, H = p->d.hidden, V_r = p->vocab_per_rank;
    int s = add_src(b, src_name, CVT_SRC_FLOAT, V, H);
    if (s < 0)
        return CVT_ERR_NOMEM;
    for (int r = 0; r < p->tp; r++) {
        struct cvt_out *o = add_out(b, r, out_name, CVT_OUT_MAT_F16, V_r, H);
        if (!o)
            return CVT_ERR_NOMEM;
        o->split = FMT_SPLIT_VOCAB;
        int64_t r0 = (int64_t)r * V_r;
        CVT_TRY(add_seg(o, s, r0, 0, min64(V_r, V - r0), H, 0, 0));
    }
    return CVT_ERR_NONE;
}

/* Act-order linears (DESIGN 4.5): every part of a fused output must share it (the perm job
 * checks they share one permutation); not in MoE experts; a row-parallel one only at tp 1 (its
 * source groups are spread over all input rows, so no rank's row slice holds whole groups). */
static enum cvt_err act_order_check(struct builder *b, const struct cvt_arch_linear *lin,
                                    const struct lin *l, const char *out, int expert)
{
    for (int i = 1; i < lin->n_parts; i++)
        if (l[i].act_order != l[0].act_order) {
            qs_log_error(__func__, "tensor %s: %s is act-order (g_idx out of order) but %s is not; "
                         "the fused %s needs one input order", l[i].module,
                         l[0].act_order ? l[0].module : l[i].module,
                         l[0].act_order ? l[i].module : l[0].module, out);
            return CVT_ERR_UNSUPPORTED;
        }
    if (!l[0].act_order)
        return CVT_ERR_NONE;
    if (expert >= 0) {
        qs_log_error(__func__, "tensor %s.g_idx: act-order (desc_act) in MoE experts is not "
                     "supported", l[0].module);
        return CVT_ERR_UNSUPPORTED;
    }
    if (lin->split == FMT_SPLIT_ROW && b->p->tp > 1) {
        qs_log_error(__func__, "tensor %s.g_idx: --tp %d: %s is act-order (desc_act / actorder "
                     "group) and row-parallel: its quantization groups are spread over all input "
                     "rows, so it cannot be split across ranks; valid --tp values for this "
                     "checkpoint: 1", l[0].module, b->p->tp, l[0].module);
        return CVT_ERR_TP;
    }
    return CVT_ERR_NONE;
}

/* The `<out>.perm` output of an act-order W4 output on every rank: I32 [K], replicated. */
static enum cvt_err emit_perm(struct builder *b, const struct cvt_arch_linear *lin,
                              const struct lin *l, const char *out)
{
    char nm[200];
    snprintf(nm, sizeof(nm), "%s" FMT_SUFFIX_PERM, out);
    for (int r = 0; r < b->p->tp; r++) {
        const struct cvt_out *w = cvt_plan_find(b->p, r, out);
        struct cvt_out *o = w ? add_out(b, r, nm, CVT_OUT_PERM, 1, w->rows) : NULL;
        if (!o)
            return CVT_ERR_NOMEM;
        for (int i = 0; i < lin->n_parts && i < CVT_MAX_SEGS; i++)
            CVT_TRY(add_seg(o, l[i].src, 0, 0, 1, l[i].K, 0, 0));
    }
    return CVT_ERR_NONE;
}

/* The plan's geometry (tp_geom) of its own split. */
static struct tp_geom plan_geom(const struct cvt_plan *p)
{
    struct tp_geom g = {&p->d, p->tp, p->heads_per_rank, p->kv_heads_per_rank,
                        p->kv_head_replicas, p->inter_per_rank};
    return g;
}

/* Rank r's [q_r | k_r | v_r] columns of a kv-grouped fused source l (cvt_arch qkv_grouped): source head slot s of group g at columns ((g (rq + 2) + s) hd, ..), q heads
 * s < rq, then k (s = rq) and v (s = rq + 1); consecutive q heads of one group are one piece. */
static enum cvt_err emit_grouped(struct builder *b, const struct tp_geom *g, int r,
                                 const char *out, const struct cvt_arch_linear *lin,
                                 const struct lin *l)
{
    const struct cvt_dims *d = &b->p->d;
    const int64_t hd = d->head_dim, rq = d->n_heads / d->n_kv_heads;
    int64_t st, cnt, w, kst, kcnt;
    axis_slice(g, CVT_AXIS_Q, r, &st, &cnt, &w);
    axis_slice(g, CVT_AXIS_KV, r, &kst, &kcnt, &w);
    const int64_t h0 = st / hd, nh = cnt / hd, g0 = kst / hd, ng = kcnt / hd;
    struct colpiece *pc = malloc((size_t)(nh + 2 * ng) * sizeof(*pc));
    int n = 0;
    if (!pc) {
        qs_log_error(__func__, "out of memory");
        return CVT_ERR_NOMEM;
    }
    for (int64_t h = h0; h < h0 + nh; h++) { /* q heads, merged within a group */
        const int64_t col = (h / rq * (rq + 2) + h % rq) * hd;
        if (n > 0 && h % rq != 0 && pc[n - 1].c0 + pc[n - 1].n == l[0].n_off + col)
            pc[n - 1].n += hd;
        else
            pc[n++] = (struct colpiece){&l[0], l[0].n_off + col, hd, (h - h0) * hd};
    }
    for (int kv = 0; kv < 2; kv++) /* k of each of the rank's kv heads, then v */
        for (int64_t x = g0; x < g0 + ng; x++)
            pc[n++] = (struct colpiece){&l[0], l[0].n_off + (x * (rq + 2) + rq + kv) * hd, hd,
                                        (nh + kv * ng + (x - g0)) * hd};
    const enum cvt_err e = emit_column(b, r, out, axis_full(d, lin->parts[0].k),
                                       (nh + 2 * ng) * hd, pc, n);
    free(pc);
    return e;
}

/* Output `lin` of layer `layer` (expert `expert`, or -1) for every rank, from its parts l[]
 * (resolved by lin_resolve): column-parallel parts side by side, or one row-parallel part. */
static enum cvt_err emit_linear(struct builder *b, const struct cvt_arch_linear *lin,
                                const struct lin *l, int layer, int expert)
{
    const struct tp_geom g = plan_geom(b->p);
    char out[160];
    enum cvt_err e;
    if (!fmt_name(out, sizeof(out), lin->role, layer, expert, NULL)) {
        qs_log_error(__func__, "layer %d: no canonical name for role %d", layer, (int)lin->role);
        return CVT_ERR_CONFIG;
    }
    if (lin->n_parts > 1 && (e = lin_group_check(l, lin->n_parts, out)))
        return e;
    if ((e = act_order_check(b, lin, l, out, expert)))
        return e;
    if (l[0].bias)
        b->p->bias_roles |= CVT_ROLE_BIT(lin->role);
    for (int r = 0; r < b->p->tp; r++) {
        int64_t st, cnt, w, dst = 0;
        if (lin->split == FMT_SPLIT_ROW) {
            axis_slice(&g, lin->parts[0].k, r, &st, &cnt, &w);
            if ((e = emit_row(b, r, out, &l[0], st, cnt, w)))
                return e;
            continue;
        }
        if (b->p->d.arch->qkv_grouped && lin->role == FMT_N_QKV) {
            if ((e = emit_grouped(b, &g, r, out, lin, l)))
                return e;
            continue;
        }
        struct colpiece pc[CVT_ARCH_MAX_PARTS];
        for (int i = 0; i < lin->n_parts; i++) {
            axis_slice(&g, lin->parts[i].n, r, &st, &cnt, &w);
            pc[i] = (struct colpiece){&l[i], l[i].n_off + st, cnt, dst};
            dst += w;
        }
        if ((e = emit_column(b, r, out, axis_full(&b->p->d, lin->parts[0].k), dst, pc,
                             lin->n_parts)))
            return e;
    }
    return l[0].act_order ? emit_perm(b, lin, l, out) : CVT_ERR_NONE;
}

/* A LINEARS step of layer `layer` (expert `expert`, or -1): every part of every output looked up
 * first (HF module = layer prefix + "." + part), then each output planned. */
static enum cvt_err plan_linears(struct builder *b, const struct cvt_arch_step *st,
                                 const char *prefix, int layer, int expert)
{
    const struct cvt_dims *d = &b->p->d;
    struct lin l[CVT_ARCH_MAX_LINEARS][CVT_ARCH_MAX_PARTS];
    char part[80], mod[160]; /* descriptor names: far below these sizes */
    enum cvt_err e;
    if (st->n_linears > CVT_ARCH_MAX_LINEARS) {
        qs_log_error(__func__, "architecture %s: a step of %d linears (at most %d)",
                     d->arch->name, st->n_linears, CVT_ARCH_MAX_LINEARS);
        return CVT_ERR_CONFIG;
    }
    for (int j = 0; j < st->n_linears; j++) {
        const struct cvt_arch_linear *lin = &st->linears[j];
        bool bias = (d->bias_roles & CVT_ROLE_BIT(lin->role)) != 0;
        for (int i = 0; i < lin->n_parts;) {
            /* parts i..i1-1 with one module name are column ranges of one fused source (Phi-3's
             * qkv_proj, gate_up_proj), in order: resolved once, [K, sum of their widths] */
            const struct cvt_arch_part *pt = &lin->parts[i];
            int i1 = i + 1;
            int64_t n_all = axis_full(d, pt->n);
            for (; i1 < lin->n_parts && !strcmp(lin->parts[i1].hf, pt->hf); i1++)
                n_all += axis_full(d, lin->parts[i1].n);
            snprintf(part, sizeof(part), pt->hf, expert);
            snprintf(mod, sizeof(mod), "%.70s.%.70s", prefix, part);
            if ((e = lin_resolve(b, mod, axis_full(d, pt->k), n_all, bias, &l[j][i])))
                return e;
            for (int x = i + 1; x < i1; x++) {
                l[j][x] = l[j][x - 1];
                l[j][x].n_off += axis_full(d, lin->parts[x - 1].n);
            }
            i = i1;
        }
    }
    for (int j = 0; j < st->n_linears; j++)
        if ((e = emit_linear(b, &st->linears[j], l[j], layer, expert)))
            return e;
    return CVT_ERR_NONE;
}

/* A replicated float output [rows, cols] of layer `layer` from HF tensor `hf` under `prefix`:
 * a norm ([1, H]), a HEAD_NORM step ([1, head_dim]: Qwen3's q_norm / k_norm), a router. */
static enum cvt_err plan_layer_float(struct builder *b, const char *prefix, const char *hf,
                                     enum fmt_name role, int layer, int64_t rows, int64_t cols,
                                     float offset)
{
    char src[200], out[160];
    snprintf(src, sizeof(src), "%s.%s", prefix, hf);
    if (!fmt_name(out, sizeof(out), role, layer, -1, NULL)) {
        qs_log_error(__func__, "layer %d: no canonical name for role %d", layer, (int)role);
        return CVT_ERR_CONFIG;
    }
    return emit_replicated(b, src, out, rows, cols, offset);
}

/* An INTER_VECTOR step: `hf` under the layer, F32 [I], rank r's columns [r I_r, (r + 1) I_r)
 * (the up projection's split). Refused when I_pad > I: the padding would be zero, and this
 * vector is a divisor (MPT's ffn.act.scales). */
static enum cvt_err plan_inter_vector(struct builder *b, const char *prefix, const char *hf,
                                      enum fmt_name role, int layer)
{
    const struct cvt_plan *p = b->p;
    const int64_t I = p->d.intermediate, I_r = p->inter_per_rank;
    char src[200], out[160];
    snprintf(src, sizeof(src), "%s.%s", prefix, hf);
    if (!fmt_name(out, sizeof(out), role, layer, -1, NULL)) {
        qs_log_error(__func__, "layer %d: no canonical name for role %d", layer, (int)role);
        return CVT_ERR_CONFIG;
    }
    if (b->have_names && !set_take(&b->set, src)) {
        qs_log_error(__func__, "tensor %s: missing: the model needs it (shape [%" PRId64 "])",
                     src, I);
        return CVT_ERR_MISSING_TENSOR;
    }
    if ((int64_t)p->inter_padded != I) {
        qs_log_error(__func__, "tensor %s: --tp %d would pad the intermediate size %" PRId64
                     " to %d, and this vector divides the activation (no padding value is "
                     "neutral); use a --tp that divides it into multiples of %d", src, p->tp, I,
                     p->inter_padded, p->inter_unit);
        return CVT_ERR_TP;
    }
    int s = add_src(b, src, CVT_SRC_FLOAT, 1, I);
    if (s < 0)
        return CVT_ERR_NOMEM;
    for (int r = 0; r < p->tp; r++) {
        struct cvt_out *o = add_out(b, r, out, CVT_OUT_VEC_F32, 1, I_r);
        if (!o)
            return CVT_ERR_NOMEM;
        o->split = FMT_SPLIT_COLUMN;
        CVT_TRY(add_seg(o, s, 0, (int64_t)r * I_r, 1, I_r, 0, 0));
    }
    return CVT_ERR_NONE;
}

/* A ROUTER step: `hf`.weight replicated as F32 [E, H]; a quantized router is refused. */
static enum cvt_err plan_router(struct builder *b, const struct cvt_arch_step *st,
                                const char *prefix, int layer)
{
    char nm[200];
    if (b->have_names) {
        snprintf(nm, sizeof(nm), "%s.%s" FMT_SUFFIX_QWEIGHT, prefix, st->hf);
        if (set_has(&b->set, nm)) {
            qs_log_error(__func__, "tensor %s: the MoE router must be float (never quantized, "
                                   "replicated on every rank)",
                         nm);
            return CVT_ERR_UNSUPPORTED;
        }
    }
    snprintf(nm, sizeof(nm), "%s" FMT_SUFFIX_WEIGHT, st->hf);
    return plan_layer_float(b, prefix, nm, st->role, layer, b->p->d.n_experts, b->p->d.hidden, 0);
}

/* One decoder layer: the descriptor's steps in order. */
static enum cvt_err plan_layer(struct builder *b, int i)
{
    const struct cvt_dims *d = &b->p->d;
    char prefix[160], nm[200];
    enum cvt_err e = CVT_ERR_NONE;
    snprintf(prefix, sizeof(prefix), d->arch->hf_layer, i);
    for (int s = 0; s < d->arch->n_steps && !e; s++) {
        const struct cvt_arch_step *st = &d->arch->steps[s];
        switch (st->op) {
        case CVT_ARCH_OP_NORM:
        case CVT_ARCH_OP_HEAD_NORM:
            e = plan_layer_float(b, prefix, st->hf, st->role, i, 1,
                                 st->op == CVT_ARCH_OP_NORM ? d->hidden : d->head_dim,
                                 (float)d->arch->norm_offset);
            break;
        case CVT_ARCH_OP_INTER_VECTOR:
            e = plan_inter_vector(b, prefix, st->hf, st->role, i);
            break;
        case CVT_ARCH_OP_IGNORE:
            snprintf(nm, sizeof(nm), "%s.%s", prefix, st->hf);
            if (b->have_names)
                set_take(&b->set, nm);
            break;
        case CVT_ARCH_OP_ROUTER: e = plan_router(b, st, prefix, i); break;
        case CVT_ARCH_OP_LINEARS:
            if (!st->per_expert) {
                e = plan_linears(b, st, prefix, i, -1);
                break;
            }
            for (int x = 0; x < d->n_experts && !e; x++)
                e = plan_linears(b, st, prefix, i, x);
            break;
        }
    }
    return e;
}

/* Embedding, lm_head and tying (docs/FORMATS.md P08): the HF modules of the descriptor -> FMT_N_EMBED
 * and FMT_N_LM_HEAD. */
static enum cvt_err plan_vocab(struct builder *b)
{
    struct cvt_plan *p = b->p;
    const struct cvt_arch *a = p->d.arch;
    char emb[160], lm[160], emb_out[160], lm_out[160], nm[200];
    static const char *const lmq[] = {FMT_SUFFIX_QWEIGHT, FMT_SUFFIX_QZEROS, FMT_SUFFIX_SCALES,
                                      ".scaled_zeros", FMT_SUFFIX_BIAS, ".g_idx",
                                      ".weight_packed", ".weight_scale", ".weight_zero_point",
                                      ".weight_shape", ".weight_g_idx"};
    snprintf(emb, sizeof(emb), "%s" FMT_SUFFIX_WEIGHT, a->hf_embed);
    snprintf(lm, sizeof(lm), "%s" FMT_SUFFIX_WEIGHT, a->hf_lm_head);
    fmt_name(emb_out, sizeof(emb_out), FMT_N_EMBED, -1, -1, NULL);
    fmt_name(lm_out, sizeof(lm_out), FMT_N_LM_HEAD, -1, -1, NULL);
    bool has_q = false;
    if (b->have_names)
        for (size_t j = 0; j < sizeof(lmq) / sizeof(lmq[0]); j++) {
            snprintf(nm, sizeof(nm), "%s%s", a->hf_lm_head, lmq[j]);
            has_q |= set_take(&b->set, nm);
        }
    if (!b->have_names) {
        p->has_lm_head = !p->d.tie_word_embeddings;
        enum cvt_err e = emit_vocab(b, emb_out, emb);
        return e ? e : p->has_lm_head ? emit_vocab(b, lm_out, lm) : CVT_ERR_NONE;
    }
    bool has_emb = set_take(&b->set, emb), has_lm = set_take(&b->set, lm);
    if (p->d.tie_word_embeddings) {
        if (has_q)
            qs_log_warn("tie_word_embeddings is true: ignoring the quantized lm_head "
                        "(%s.qweight/scales/qzeros) found next to the tied embedding",
                        a->hf_lm_head);
        if (!has_emb && !has_lm) {
            qs_log_error(__func__, "tensor %s: missing: tie_word_embeddings is true and the files "
                                   "have neither %s nor %s",
                         emb, emb, lm);
            return CVT_ERR_MISSING_TENSOR;
        }
        p->has_lm_head = false;
        /* The shared table is stored once, as the embedding; a checkpoint that kept only the
         * lm_head name (AutoAWQ 0.2.7 tied Qwen2.5 exports) provides it under that name. */
        return emit_vocab(b, emb_out, has_emb ? emb : lm);
    }
    if (has_q) {
        qs_log_error(__func__, "tensor %s.qweight: a quantized lm_head is not supported "
                               "(AWQ keeps lm_head in float; DESIGN 5 stores it as F16)",
                     a->hf_lm_head);
        return CVT_ERR_UNSUPPORTED;
    }
    if (!has_emb || !has_lm) {
        qs_log_error(__func__, "tensor %s: missing: tie_word_embeddings is false, so the model "
                               "needs both %s and %s",
                     has_emb ? lm : emb, emb, lm);
        return CVT_ERR_MISSING_TENSOR;
    }
    p->has_lm_head = true;
    enum cvt_err e = emit_vocab(b, emb_out, emb);
    return e ? e : emit_vocab(b, lm_out, lm);
}

static enum cvt_err plan_model(struct builder *b)
{
    const struct cvt_dims *d = &b->p->d;
    char out[160];
    enum cvt_err e;
    if ((e = plan_vocab(b)))
        return e;
    fmt_name(out, sizeof(out), FMT_N_FINAL_NORM, -1, -1, NULL);
    if ((e = emit_replicated(b, d->arch->hf_final_norm, out, 1, d->hidden, (float)d->arch->norm_offset)))
        return e;
    if (d->arch->hf_final_norm_bias) { /* LayerNorm families */
        fmt_name(out, sizeof(out), FMT_N_FINAL_NORM_BIAS, -1, -1, NULL);
        if ((e = emit_replicated(b, d->arch->hf_final_norm_bias, out, 1, d->hidden, 0.0f)))
            return e;
    }
    for (int i = 0; i < d->n_layers; i++)
        if ((e = plan_layer(b, i)))
            return e;
    return CVT_ERR_NONE;
}

static enum cvt_err dims_check(const struct cvt_dims *d)
{
    struct {
        const char *key;
        int v;
    } req[] = {{"hidden_size", d->hidden},
               {"intermediate_size", d->intermediate},
               {"num_hidden_layers", d->n_layers},
               {"num_attention_heads", d->n_heads},
               {"num_key_value_heads", d->n_kv_heads},
               {"head_dim", d->head_dim},
               {"vocab_size", d->vocab}};
    for (size_t i = 0; i < sizeof(req) / sizeof(req[0]); i++)
        if (req[i].v <= 0) {
            qs_log_error(__func__, "config key %s: expected a positive integer, got %d",
                         req[i].key, req[i].v);
            return CVT_ERR_CONFIG;
        }
    if (!d->arch) {
        qs_log_error(__func__, "no architecture descriptor (convert/cvt_arch.h)");
        return CVT_ERR_UNSUPPORTED;
    }
    if (d->group_size == 0 || d->group_size < -1 || (d->group_size > 0 && d->group_size % 16)) {
        qs_log_error(__func__, "group_size: expected a positive multiple of 16 (packed int4 "
                               "layout) or -1 (per-channel), got %d",
                     d->group_size);
        return CVT_ERR_UNSUPPORTED;
    }
    if (d->arch->moe && (d->n_experts <= 0 || d->n_experts_per_tok <= 0 ||
                                        d->n_experts_per_tok > d->n_experts)) {
        qs_log_error(__func__, "config keys num_local_experts / num_experts_per_tok: expected "
                               "0 < per_tok <= experts, got %d / %d",
                     d->n_experts, d->n_experts_per_tok);
        return CVT_ERR_CONFIG;
    }
    return CVT_ERR_NONE;
}

enum cvt_err cvt_plan_build(const struct cvt_dims *d, const struct cvt_name_list *names, int tp,
                            struct cvt_plan **out)
{
    enum cvt_err e;
    struct builder b;
    char why[320];
    memset(&b, 0, sizeof(b));
    *out = NULL;
    if ((e = dims_check(d)))
        return e;
    int nq_r, nkv_r, rep;
    if (!tp_heads_ok(d, tp, &nq_r, &nkv_r, &rep, why, sizeof(why))) {
        char valid[256];
        valid_tp_str(d, valid, sizeof(valid));
        qs_log_error(__func__, "--tp %d: %s; valid --tp values for this model: %s", tp, why,
                     valid);
        return CVT_ERR_TP;
    }
    /* outputs per rank: vocab tables, norm, per layer 2 norms + qkv(+bias) + o(+bias) + router +
     * 2 per MLP/expert; a hostile config (4096 layers x 1024 experts x tp 4096) must not make
     * the plan itself exhaust memory */
    int64_t per_rank = 4 + (int64_t)d->n_layers * (7 + 2 * (d->n_experts > 0 ? d->n_experts : 1));
    if (per_rank * tp > CVT_PLAN_MAX_OUTPUTS) {
        qs_log_error(__func__, "config: %d layers x %d experts at tp %d gives %" PRId64
                               " output tensors; at most %d are supported",
                     d->n_layers, d->n_experts, tp, per_rank * tp, CVT_PLAN_MAX_OUTPUTS);
        return CVT_ERR_UNSUPPORTED;
    }
    struct cvt_plan *p = calloc(1, sizeof(*p));
    if (!p)
        return CVT_ERR_NOMEM;
    b.p = p;
    p->d = *d;
    p->tp = tp;
    p->heads_per_rank = nq_r;
    p->kv_heads_per_rank = nkv_r;
    p->kv_head_replicas = rep;
    p->inter_unit = (int)inter_unit(d);
    p->inter_padded = (int)(ceil_div(d->intermediate, (int64_t)p->inter_unit * tp) *
                            p->inter_unit * tp);
    p->inter_per_rank = p->inter_padded / tp;
    p->vocab_per_rank = (int)ceil_div(d->vocab, tp);
    p->ranks = calloc((size_t)tp, sizeof(*p->ranks));
    b.cap_outs = calloc((size_t)tp, sizeof(*b.cap_outs));
    e = CVT_ERR_NOMEM;
    if (!p->ranks || !b.cap_outs)
        goto out_fail;
    for (int r = 0; r < tp; r++) {
        p->ranks[r].rank = r;
        p->ranks[r].heads = nq_r;
        p->ranks[r].kv_heads = nkv_r;
        p->ranks[r].kv_head_first = tp <= d->n_kv_heads ? r * nkv_r : r / rep;
    }
    if (names) {
        b.have_names = true;
        b.n_act = names->n_act_order;
        b.act = names->act_order;
        b.set.n = names->n;
        b.set.names = malloc((size_t)(names->n ? names->n : 1) * sizeof(*b.set.names));
        b.set.used = calloc((size_t)(names->n ? names->n : 1), sizeof(*b.set.used));
        if (!b.set.names || !b.set.used)
            goto out_fail;
        memcpy(b.set.names, names->names, (size_t)names->n * sizeof(*b.set.names));
        qsort(b.set.names, (size_t)names->n, sizeof(*b.set.names), cmp_str);
        for (int i = 1; i < names->n; i++)
            if (!strcmp(b.set.names[i - 1], b.set.names[i])) {
                qs_log_error(__func__, "tensor %s: appears twice in the checkpoint",
                             b.set.names[i]);
                e = CVT_ERR_UNKNOWN_TENSOR;
                goto out_fail;
            }
    }
    if ((e = plan_model(&b)))
        goto out_fail;
    if (b.have_names) {
        int n_unknown = 0, first = -1;
        for (int i = 0; i < b.set.n; i++)
            if (!b.set.used[i] && n_unknown++ == 0)
                first = i;
        if (n_unknown) {
            qs_log_error(__func__, "tensor %s: not recognised for a %s model with %d layers%s "
                                   "(%d unrecognised tensor%s in total); refusing to drop it",
                         b.set.names[first], d->arch->name, d->n_layers,
                         d->arch->moe ? " and its experts" : "", n_unknown,
                         n_unknown == 1 ? "" : "s");
            e = CVT_ERR_UNKNOWN_TENSOR;
            goto out_fail;
        }
        if (b.n_warn_unlisted)
            qs_log_warn("%d linear layer(s) are stored as float .weight without being listed in "
                        "modules_to_not_convert; converting them unquantized (F16)",
                        b.n_warn_unlisted);
        if (b.n_warn_listed)
            qs_log_warn("%d linear layer(s) listed in modules_to_not_convert are stored "
                        "quantized; the tensors decide: converting them as quantized",
                        b.n_warn_listed);
    }
    for (int r = 0; r < tp; r++) {
        struct cvt_rank_plan *rp = &p->ranks[r];
        for (int j = 0; j < rp->n_outs; j++) {
            struct cvt_out *o = &rp->outs[j];
            o->bytes = out_bytes(o, false);
            rp->data_bytes += o->bytes;
            rp->file_bytes += out_bytes(o, true);
            if (r == 0 && o->kind == CVT_OUT_LINEAR_F16)
                p->n_unquantized++;
        }
    }
    free(b.set.names);
    free(b.set.used);
    free(b.cap_outs);
    *out = p;
    return CVT_ERR_NONE;

out_fail:
    free(b.set.names);
    free(b.set.used);
    free(b.cap_outs);
    cvt_plan_free(p);
    return e;
}

void cvt_plan_free(struct cvt_plan *p)
{
    if (!p)
        return;
    if (p->ranks)
        for (int r = 0; r < p->tp; r++) {
            for (int j = 0; j < p->ranks[r].n_outs; j++)
                free(p->ranks[r].outs[j].segs);
            free(p->ranks[r].outs);
        }
    free(p->ranks);
    free(p->srcs);
    free(p);
}

const struct cvt_out *cvt_plan_find(const struct cvt_plan *p, int rank, const char *name)
{
    if (!p || rank < 0 || rank >= p->tp)
        return NULL;
    const struct cvt_rank_plan *rp = &p->ranks[rank];
    for (int j = 0; j < rp->n_outs; j++)
        if (!strcmp(rp->outs[j].name, name))
            return &rp->outs[j];
    return NULL;
}
