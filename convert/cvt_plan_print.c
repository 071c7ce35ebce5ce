/*
 * cvt_plan_print.c - `qshard convert --dry-run`: the plan (cvt_plan.c) in words: dims, per-rank
 * heads / kv heads / sizes, every padding decision, the local group size of each packed linear.
 *
 * Entry point: cvt_plan_print (cvt.h). Test: ./build/test_cvt_outdir (dry-run lines),
 * tools/check_convert_identical.sh (the same plans before and after a change).
 */
#include <inttypes.h>
#include <string.h>

#include "cvt.h"
#include "fmt_names.h" /* fmt_name_parse, fmt_name_in_layer */

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static void print_bytes(FILE *f, uint64_t b)
{
    if (b >= (1ull << 30))
        fprintf(f, "%.2f GiB", (double)b / (double)(1ull << 30));
    else
        fprintf(f, "%.1f MiB", (double)b / (double)(1ull << 20));
    fprintf(f, " (%" PRIu64 " bytes)", b);
}

/* One line per quantized output of layer 0 (first expert only): its source group size and the
 * local group size G_r on each rank, and what a G_r below G means. Every layer has the same
 * shapes, so layer 0 stands for all. */
static void print_local_groups(const struct cvt_plan *p, FILE *f)
{
    const struct cvt_rank_plan *rp0 = &p->ranks[0];
    for (int j = 0; j < rp0->n_outs; j++) {
        const struct cvt_out *o = &rp0->outs[j];
        int layer, expert;
        if (o->kind != CVT_OUT_W4 || !fmt_name_parse(o->name, NULL, &layer, &expert, NULL) ||
            layer != 0 || expert > 0)
            continue;
        int64_t Gs = o->n_segs ? p->srcs[o->segs[0].src].group : 0, lo = o->group, hi = o->group;
        for (int r = 1; r < p->tp; r++) {
            const struct cvt_out *x = cvt_plan_find(p, r, o->name);
            lo = x && x->group < lo ? x->group : lo;
            hi = x && x->group > hi ? x->group : hi;
        }
        fprintf(f, "plan: local group size: %s [K_r=%" PRId64 ", N_r=%" PRId64 "]: ",
                fmt_name_in_layer(o->name),
                o->rows, o->cols);
        if (lo != hi)
            fprintf(f, "G_r %" PRId64 "..%" PRId64 " over the ranks", lo, hi);
        else
            fprintf(f, "G_r = %" PRId64, lo);
        if (Gs > lo)
            fprintf(f, " < source group %" PRId64 ": each source scale/zero row is repeated for "
                       "its %" PRId64 " local groups (dequantization unchanged)",
                    Gs, Gs / lo);
        fprintf(f, ", %" PRId64 " scale row(s)\n", o->rows / lo);
    }
}

void cvt_plan_print(const struct cvt_plan *p, FILE *f)
{
    const struct cvt_dims *d = &p->d;
    int64_t I = d->intermediate, I_r = p->inter_per_rank, V = d->vocab, V_r = p->vocab_per_rank;
    int tp = p->tp;
    fprintf(f, "plan: %s, %d layers, hidden %d, heads %d, kv heads %d, head_dim %d, "
               "intermediate %d, vocab %d, group_size %d%s",
            d->arch->name, d->n_layers, d->hidden, d->n_heads, d->n_kv_heads,
            d->head_dim, d->intermediate, d->vocab, d->group_size,
            d->group_size > 0 ? "" : " (per-channel: G = K of each linear)");
    if (d->n_experts)
        fprintf(f, ", %d experts (top %d)", d->n_experts, d->n_experts_per_tok);
    fprintf(f, "\nplan: tp %d: %d query heads and %d kv heads per rank", tp, p->heads_per_rank,
            p->kv_heads_per_rank);
    if (p->kv_head_replicas > 1)
        fprintf(f, "; kv heads replicated: each of the %d kv heads is held by %d ranks "
                   "(rank r holds kv head r/%d)",
                d->n_kv_heads, p->kv_head_replicas, p->kv_head_replicas);
    fprintf(f, "\n");
    if (d->group_size > 0)
        fprintf(f, "plan: intermediate: U = lcm(group_size %d, 64) = %d; %" PRId64,
                d->group_size, p->inter_unit, I);
    else
        fprintf(f, "plan: intermediate: U = %d (per-channel); %" PRId64, p->inter_unit, I);
    if (d->group_size < 0)
        fprintf(f, "; ");
    else if (I % d->group_size == 0)
        fprintf(f, " = %" PRId64 " groups (%.2f per rank); ", I / d->group_size,
                (double)I / d->group_size / tp);
    else
        fprintf(f, " = %.2f groups; ", (double)I / d->group_size);
    if (p->inter_padded == I)
        fprintf(f, "no padding, I_r = %" PRId64 " per rank\n", I_r);
    else
        fprintf(f, "padded to I_pad = %d (+%" PRId64 " zero columns of gate/up, zero rows of "
                   "down, with zero scales and zeros), I_r = %" PRId64 " per rank\n",
                p->inter_padded, p->inter_padded - I, I_r);
    for (int r = 0; r < tp; r++) { /* every rank's share, padded or not */
        int64_t lo = min64(r * I_r, I), hi = min64((r + 1) * I_r, I);
        if (hi == lo)
            fprintf(f, "plan:   rank %d holds no intermediate rows, only %" PRId64 " zero "
                       "padding\n",
                    r, I_r);
        else if (hi - lo < I_r)
            fprintf(f, "plan:   rank %d holds intermediate [%" PRId64 ", %" PRId64 ") + %" PRId64
                       " zero padding\n",
                    r, lo, hi, I_r - (hi - lo));
        else
            fprintf(f, "plan:   rank %d holds intermediate [%" PRId64 ", %" PRId64 ")\n", r, lo,
                    hi);
    }
    fprintf(f, "plan: vocab: V_r = ceil(%" PRId64 " / %d) = %" PRId64, V, tp, V_r);
    if (V_r * tp == V)
        fprintf(f, ", no padding\n");
    else
        fprintf(f, "; %" PRId64 " zero row(s) on the last rank(s) (ids >= %" PRId64
                   " are masked to -inf at run time)\n",
                V_r * tp - V, V);
    fprintf(f, "plan: lm_head: %s; %d linear(s) stored unquantized (F16)\n",
            p->has_lm_head ? "separate" : "tied to the embedding (stored once)",
            p->n_unquantized);
    print_local_groups(p, f);
    uint64_t total = 0;
    for (int r = 0; r < tp; r++) {
        const struct cvt_rank_plan *rp = &p->ranks[r];
        int n_tensors = 0;
        for (int j = 0; j < rp->n_outs; j++)
            n_tensors += rp->outs[j].kind == CVT_OUT_W4 ? 3 : 1;
        fprintf(f, "plan: rank %d: %d tensors, heads [%d, %d), kv heads [%d, %d), ",
                r, n_tensors, r * rp->heads, (r + 1) * rp->heads, rp->kv_head_first,
                rp->kv_head_first + rp->kv_heads);
        print_bytes(f, rp->file_bytes);
        fprintf(f, " of aligned tensor data\n");
        total += rp->file_bytes;
    }
    fprintf(f, "plan: all ranks: ");
    print_bytes(f, total);
    fprintf(f, "\n");
}
