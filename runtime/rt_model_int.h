/*
 * rt_model_int.h - the rank-local model's structs, shared by its files (private to runtime/):
 * rt_model.c (open, bind, buffers), rt_kv.c (the KV cache), rt_forward.c (the forward pass).
 */
#ifndef QS_RT_MODEL_INT_H
#define QS_RT_MODEL_INT_H

#include "rt.h"
#include "rt_backend.h"

/* One linear of this rank: packed W4 (DESIGN 4) or unquantised fp16, plus an optional bias.
 * All pointers are backend addresses borrowed from the weight memory. */
struct rt_linear {
    int K, N, G;                /* in_features, out_features, group size of this tensor on this
                                 * rank: K / rows of its scales (G_r of DESIGN 4, may be below
                                 * the config group_size) */
    const uint8_t *qweight;     /* [K, N] packed 4.1, or NULL when weight_f16 is set */
    const uint8_t *qzeros;      /* [K/G, N] packed 4.3 */
    const uint16_t *scales;     /* [K/G, N] fp16 packed 4.2 */
    const uint16_t *weight_f16; /* [N][K] fp16 row-major (modules_to_not_convert) */
    const float *bias;          /* [N] or NULL */
    const int32_t *perm;        /* act-order [K] or NULL: the linear's input j is x[perm[j]]
                                 * (DESIGN 4.5; validated a permutation of 0..K-1 at open) */
    bool acc_ok;                /* can leave fp32 sums for its consumer (packed, backend says) */
};

struct rt_layer {
    const float *attn_norm;           /* [H] input_layernorm */
    const float *mlp_norm;            /* [H] post_attention_layernorm (NULL: parallel residual) */
    const float *attn_norm_b;         /* [H] LayerNorm biases (RT_NORM_LAYER) or NULL */
    const float *mlp_norm_b;
    const float *q_norm, *k_norm;     /* [hd] per-head norms (qk_norm architectures) or NULL */
    const float *attn_out_norm;       /* [H] norm of the attention output (post_norms) or NULL */
    const float *mlp_out_norm;        /* [H] norm of the MLP output (post_norms) or NULL */
    struct rt_linear qkv;             /* [H] -> [(nq_r + 2 nkv_r) * hd], columns [q | k | v] */
    struct rt_linear o;               /* [nq_r * hd] -> [H], row-parallel */
    struct rt_linear gate_up;         /* dense MLP: [H] -> [2 I_r], columns [gate | up] */
    struct rt_linear down;            /* dense MLP: [I_r] -> [H], row-parallel */
    const float *act_scale;           /* [I_r] activation divisors (MPT's ffn.act.scales) or NULL */
    const float *router;              /* MoE: [E][H] fp32, replicated */
    struct rt_linear *expert_gate_up; /* owned array [E] */
    struct rt_linear *expert_down;    /* owned array [E] */
};


struct rt_model {
    struct fmt_shard *shard;       /* owned: this rank's file */
    char *path;                    /* owned copy of the path given */
    struct rt_config cfg;
    int rank, world;
    struct rt_comm *comm;          /* borrowed; NULL at world size 1 */
    struct rt_backend be;          /* owned (be.ops NULL until created) */
    enum rt_device device;
    struct rt_opts opts;           /* as given (defaults resolved) */
    bool *used;                    /* owned [n_tensors]: bound by the model (unused = error) */
    const uint16_t *embed;         /* [V_r][H] fp16 */
    const uint16_t *lm_head;       /* [V_r][H] fp16 (= embed when tied) */
    const float *final_norm;       /* [H] */
    const float *final_norm_b;     /* [H] LayerNorm bias (RT_NORM_LAYER) or NULL */
    struct rt_layer *layers;       /* owned [n_layers] */
    uint64_t weight_bytes;         /* bytes of all bound tensors */
    int n_ctx;                     /* most positions per sequence slot a KV cache may have */
    int max_batch;                 /* rows of the activation buffers */
    int logit_rows;                /* LB: rows of lm_head output per pass */
    int defer_m;                   /* rows up to which linears leave fp32 sums (0: never) */
    size_t acc_cols;               /* widest linear that may defer: columns of acc */
    /* backend memory, owned; B = max_batch rows; "act" = backend activation type */
    float *h;        /* f32 [B][H] residual stream (replicated across ranks) */
    void *x;         /* act [B][H] normalised input of the current block */
    void *o;         /* act [B][H] block output (partial sum before all_reduce) */
    void *qkv;       /* act [B][(nq_r + 2 nkv_r) hd] */
    void *att;       /* act [B][nq_r hd] */
    void *gu;        /* act [B][2 I_r] */
    void *act;       /* act [B][I_r] */
    void *xe, *ye;   /* act [B][H]: MoE expert input / output; xe also the out rows of x */
    void *xperm;     /* act [B][perm_cols]: an act-order linear's gathered input, or NULL */
    size_t perm_cols;/* widest K of a linear with a perm (0: none) */
    float *acc;      /* f32 [defer_m][acc_cols] deferred split-K sums, zero between uses */
    float *router_logits; /* f32, MoE: [B][E] */
    float *logits;   /* f32 [LB][V_r] this rank's lm_head output */
    float *logits_all; /* rank 0, world > 1: f32 [world][LB][V_r] gathered */
    float *inv_freq; /* f32 [hd/2] (all zero for ALiBi architectures: no rotation) */
    float *inv_freq_local; /* f32 [hd/2] of the windowed layers (rope_local_theta), or NULL */
    void *post;      /* act [B][H]: a block's output after its out norm (post_norms), or NULL */
    float *post_sums;/* f32 [defer_m][H]: a deferred block output's sums for its out norm */
    float *alibi;    /* f32 [nq_r] ALiBi slopes of this rank's heads, or NULL */
    int32_t *tok;    /* i32 [4][B] (one allocation, one upload per chunk): [B] token ids of the chunk */
    int32_t *pos;    /* = tok + B: positions of the chunk */
    int32_t *slots;  /* = tok + 2B: pool rows the chunk's keys and values go to */
    int32_t *row_tab;/* = tok + 3B: block table of each row (row of tabs) */
    int32_t *tabs;   /* i32 [B][tab_stride] block tables of the chunk's sequences */
    int tab_stride;  /* ceil(n_ctx / block_size) */
    int max_keys;    /* the chunk in progress: most keys a row attends to (n_ctx in a graph) */
    int block_size;  /* of the KV cache the buffers were sized for (opts) */
    /* decode-step graphs, one per batch-size bucket (rt_forward.c graph_bucket) */
    bool graphs;               /* allowed: backend has them, dense model, not switched off */
    int graph_failures[RT_MAX_GRAPHS]; /* recordings that failed; that bucket off at 2 */
    const struct rt_kv *graph_kv[RT_MAX_GRAPHS]; /* the pools a recording reads */
    /* host scratch, owned */
    float *h_logits;           /* [world][LB][V_r] */
    float *h_router;           /* [B][E] */
    int32_t *h_ids;            /* [B][top_k] */
    float *h_w;                /* [B][top_k] */
    int32_t *h_rows;           /* [B] MoE: rows routed to an expert */
    int32_t *h_out;            /* [B] out rows of the chunk in progress */
    float *h_roww;             /* [B] */
    struct rt_attn_run *runs;  /* [B] */
    int32_t *h_tok, *h_pos, *h_slots, *h_row_tab; /* host copy of tok.. row_tab (h_tok owns) */
    int32_t *h_tabs;           /* [B][tab_stride] */
};

struct rt_kv {
    struct rt_model *m;        /* borrowed */
    int n_blocks, block_size;
    size_t block_elems;        /* nkv * block_size * hd */
    void **k, **v;             /* owned [n_layers] pools [n_blocks][nkv][block_size][hd] */
};

/* The model's backend table and context (in rt_model.c and rt_forward.c, where `m` is the model). */
#define OPS (m->be.ops)
#define BCTX (m->be.ctx)

/* Backend address of activation element `elems` of buffer p (whole rows or heads only). */
static inline void *rt_act_at(const struct rt_model *m, void *p, size_t elems)
{
    return (char *)p + elems * m->be.ops->act_size;
}


#endif /* QS_RT_MODEL_INT_H */
