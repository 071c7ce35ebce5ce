/*
 * ref.h - plain C11 references for every qshard kernel, and the packed int4 layout.
 *
 * Who calls it: the converter (packing + its bitwise self-check), the CPU runtime backend (these
 * functions ARE the CPU kernels: they run directly on the mmapped packed weights), and every
 * CUDA kernel test (the oracle). No CUDA includes, no allocation in the math functions except
 * where a comment says so; nothing here prints except the functions that return enum ref_err
 * (they report once through qs_log_error, docs/DESIGN.md section 3).
 *
 * Conventions
 *   - Dimension names: M = rows of activations (tokens), K = in_features, N = out_features,
 *     G = group_size, V = vocab rows, H = hidden size, hd = head_dim.
 *   - The canonical AWQ linear (DESIGN 4): codes q[K][N] uint8 0..15, zeros z[K/G][N] 0..15,
 *     scales s[K/G][N] fp16 (as uint16_t bit patterns), w[k][n] = (q[k][n] - z[k/G][n]) * s.
 *   - Packed buffers are little-endian bytes (uint8_t *), whatever the host; sizes below.
 *   - Index arithmetic is size_t: K * N can exceed 2^31 (lm_head of a 150k-vocab model).
 *   - All activations and results are fp32 row-major.
 *
 * Tests: ./build/test_ref (pack/unpack round trips, nibble positions derived independently from
 * the PTX fragment description, fp16 conversions, every op vs straightforward math).
 */
#ifndef QS_REF_H
#define QS_REF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fmt.h"     /* FMT_W4_TILE_K, FMT_W4_TILE_N, FMT_W4_TILE_BYTES */
#include "qs_rope.h" /* struct qs_rope_scaling (ref_rope_inv_freq) */

#ifdef __cplusplus
extern "C" {
#endif

/* --- errors ------------------------------------------------------------------------------ */

#define REF_ERR_LIST(X)                                                      \
    X(REF_ERR_NONE, 0, "ok")                                                 \
    X(REF_ERR_SHAPE, 1, "shape not supported by the packed layout")          \
    X(REF_ERR_RANGE, 2, "value out of range for its field")                  \
    X(REF_ERR_NOMEM, 3, "out of memory")                                     \
    X(REF_ERR_THREAD, 4, "could not start a worker thread")

enum ref_err {
#define REF_X_ENUM(name, val, msg) name = val,
    REF_ERR_LIST(REF_X_ENUM)
#undef REF_X_ENUM
};

/* Short English text for a ref_err value ("unknown ref_err" for anything else). */
const char *ref_err_str(enum ref_err e);

/* --- fp16 / bf16 <-> fp32 (kernels/ref_pack.c) -------------------------------------------- */

/* IEEE 754 binary16 bits -> fp32, exact for every input (subnormals, +-0, inf; a NaN stays a
 * NaN with its payload shifted into the top mantissa bits and the sign kept). */
float ref_f16_to_f32(uint16_t h);

/* fp32 -> binary16 bits, round to nearest, ties to even (IEEE default, same as CUDA
 * __float2half_rn and numpy astype(float16)). Overflow gives +-inf; results below the smallest
 * subnormal round to +-0; a NaN stays a NaN with the sign and the top 10 payload bits (so every
 * half round-trips through fp32 bit-exactly), or 0x7e00 | sign when those bits are all 0. */
uint16_t ref_f32_to_f16(float f);

/* bfloat16 bits -> fp32 (exact: bf16 is the top half of an fp32). */
float ref_bf16_to_f32(uint16_t b);

/* The 65536-entry table lut[h] = ref_f16_to_f32(h), built once on first use (thread-safe);
 * the hot loops of the CPU references read fp16 weights through it. */
const float *ref_f16_lut(void);

/* --- the packed int4 layout (DESIGN 4.1-4.3; kernels/ref_pack.c) ---------------------------- */

/* Tile constants FMT_W4_TILE_K (16 k rows: mma m16n8k16's k), FMT_W4_TILE_N (64 n columns:
 * 8 n8 sub-tiles) and FMT_W4_TILE_BYTES (512) come from format/fmt.h. */

/* True when (K, N, G) satisfy DESIGN 4's per-rank requirements: K % 16 == 0, N % 64 == 0,
 * K % G == 0, G % 16 == 0, all positive. G may be 0 to check only K and N. */
int ref_w4_shape_ok(int K, int N, int G);

/* Where code q[k][n] lives in a packed [K, N] qweight (DESIGN 4.1): byte offset from the start
 * of qweight and the nibble's bit shift inside that byte (0 or 4). Caller guarantees
 * 0 <= k < K, 0 <= n < N and a valid shape. */
void ref_w4_locate(int K, int N, int k, int n, size_t *byte_off, int *shift);

/* Pack canonical codes q[K][N] (uint8, each 0..15) into the DESIGN 4.1 tiled layout.
 * qweight: K*N/2 bytes, written completely. Errors: REF_ERR_SHAPE (K % 16 or N % 64 nonzero),
 * REF_ERR_RANGE (a code > 15; names k, n and the value). */
enum ref_err ref_pack_w4(const uint8_t *q, int K, int N, uint8_t *qweight);

/* Inverse of ref_pack_w4: packed qweight (K*N/2 bytes) -> q[K][N] uint8 0..15.
 * Errors: REF_ERR_SHAPE. */
enum ref_err ref_unpack_w4(const uint8_t *qweight, int K, int N, uint8_t *q);

/* Pack scales s[n_groups][N] (fp16 bits, n_groups = K/G) into DESIGN 4.2: stored
 * [N/64][n_groups][64] fp16, position p = c*8 + j of a 64-row holds column nt*64 + j*8 + c.
 * out: n_groups*N uint16_t. Errors: REF_ERR_SHAPE (N % 64, n_groups < 1). */
enum ref_err ref_pack_scales(const uint16_t *s, int n_groups, int N, uint16_t *out);
/* Inverse of ref_pack_scales: packed [N/64][n_groups][64] -> s[n_groups][N]. */
enum ref_err ref_unpack_scales(const uint16_t *packed, int n_groups, int N, uint16_t *s);

/* Pack zeros z[n_groups][N] (uint8 0..15) into DESIGN 4.3: [N/64][n_groups][8] little-endian
 * uint32 words, word c nibble j holds z[g][nt*64 + j*8 + c]. out: n_groups*N/2 bytes.
 * Errors: REF_ERR_SHAPE, REF_ERR_RANGE (a zero > 15). */
enum ref_err ref_pack_zeros(const uint8_t *z, int n_groups, int N, uint8_t *out);
/* Inverse of ref_pack_zeros: packed bytes -> z[n_groups][N]. */
enum ref_err ref_unpack_zeros(const uint8_t *packed, int n_groups, int N, uint8_t *z);

/* Dequantise one packed linear: w[K][N] fp32 = (q[k][n] - z[k/G][n]) * s[k/G][n], computed as
 * (float)(q - z) * ref_f16_to_f32(s): one rounding, bit-exact and reproducible.
 * qweight K*N/2 bytes (4.1), qzeros (K/G)*N/2 bytes (4.3), scales (K/G)*N fp16 (4.2).
 * Errors: REF_ERR_SHAPE (ref_w4_shape_ok fails). */
enum ref_err ref_dequant_w4(const uint8_t *qweight, const uint8_t *qzeros,
                            const uint16_t *scales, int K, int N, int G, float *w);

/* ref_dequant_w4 with output rows ldw floats apart (ldw >= N): w[k*ldw + n], so a block of
 * columns can be written straight into a wider matrix (the converter's self-check). Same math
 * and bits. Errors: REF_ERR_SHAPE (ref_w4_shape_ok fails or ldw < N). */
enum ref_err ref_dequant_w4_strided(const uint8_t *qweight, const uint8_t *qzeros,
                                    const uint16_t *scales, int K, int N, int G, float *w,
                                    size_t ldw);

/* --- thread pool for the CPU matmuls (kernels/ref_pool.c) -------------------------------- */

/*
 * A fixed set of worker threads that run `n_tasks` independent tasks of one op and return when
 * all are done (the caller's thread works too). The CPU runtime owns one pool; the heavy refs
 * (ref_w4a16_linear, ref_linear_f16, ref_attention) take it as their last argument, and a NULL
 * pool runs everything on the calling thread. Results never depend on the thread count: every
 * output element is computed by exactly one task in a fixed order. Not reentrant: one op at a
 * time per pool.
 */
struct ref_pool;
typedef void (*ref_task_fn)(void *ctx, int task, int n_tasks);

/* Start n_threads - 1 workers (n_threads <= 0: one per online CPU). REF_ERR_THREAD, NOMEM. */
enum ref_err ref_pool_create(int n_threads, struct ref_pool **out);
/* Stop and join the workers; NULL is fine. */
void ref_pool_free(struct ref_pool *pool);
/* Threads that run tasks, the caller included (1 for a NULL pool). */
int ref_pool_threads(const struct ref_pool *pool);
/* Run fn(ctx, task, n_tasks) for task = 0..n_tasks-1 on the pool; returns when all finished. */
void ref_pool_run(struct ref_pool *pool, ref_task_fn fn, void *ctx, int n_tasks);

/* --- linears (kernels/ref_w4a16_linear.c, kernels/ref_linear_f16.c) ---------------------- */

/*
 * W4A16 linear straight from the packed layout: y[M][N] = x[M][K] . W[K][N] + bias[N], with
 * W = dequant(qweight, qzeros, scales) exactly as ref_dequant_w4 (DESIGN 4.1-4.3). fp32 in and
 * out, fp32 accumulation over k in increasing order (so the result is independent of threads).
 * Packed inputs are read in place (e.g. straight from an mmapped rank file): qweight K*N/2
 * bytes, qzeros (K/G)*N/2 bytes, scales (K/G)*N fp16. bias may be NULL. y must not alias x.
 * Work is split over 64-column n-tiles across the pool.
 * Errors: REF_ERR_SHAPE (ref_w4_shape_ok(K, N, G) fails, or M < 1).
 */
enum ref_err ref_w4a16_linear(const float *x, const uint8_t *qweight, const uint8_t *qzeros,
                              const uint16_t *scales, const float *bias, int M, int K, int N,
                              int G, float *y, struct ref_pool *pool);

/*
 * Linear with fp16 weights in nn.Linear orientation: y[M][N] = x[M][K] . W^T + bias, W fp16
 * [N][K] row-major (lm_head, tied embedding, unquantised linears; DESIGN 5). fp32 accumulation
 * in a fixed order (8 interleaved partial sums per 512-wide k chunk, so independent of the
 * thread count); bias may be NULL; y must not alias x. Split over N on the pool.
 */
void ref_linear_f16(const float *x, const uint16_t *W, const float *bias, int M, int K, int N,
                    float *y, struct ref_pool *pool);

/* Same with fp32 weights W [N][K] (Mixtral router, block_sparse_moe.gate.weight [E, H]). Serial. */
void ref_linear_f32(const float *x, const float *W, const float *bias, int M, int K, int N,
                    float *y);

/* --- elementwise and normalisation -------------------------------------------------------- */

/*
 * RMSNorm (Zhang & Sennrich 2019; transformers LlamaRMSNorm) over rows of H, fp32, with the
 * residual add fused in (same three modes as k_rmsnorm):
 *   residual != NULL, x != NULL: residual[m] += x[m], then out[m] = w * norm(residual[m])
 *   residual != NULL, x == NULL: out[m] = w * norm(residual[m])   (first layer: h = embedding)
 *   residual == NULL:            out[m] = w * norm(x[m])
 * norm(h) = h * rsqrt(mean(h^2) + eps), the mean of squares accumulated in double.
 * x, residual, out: [M][H]; w: [H]. out may alias x (not residual).
 */
void ref_rmsnorm(float *out, float *residual, const float *x, const float *w, int M, int H,
                 float eps);

/*
 * LayerNorm (Ba et al. 2016; torch.nn.LayerNorm as transformers' Falcon and MPT use it) over rows
 * of H with the residual add fused in, the same three modes as ref_rmsnorm:
 *   out[m] = (h - mean(h)) * rsqrt(var(h) + eps) * w + b,  h = residual[m] (after += x[m]) or x[m]
 * mean and the biased variance mean((h - mean)^2) accumulated in double (two passes); b may be
 * NULL (MPT's no_bias LayerNorm). x, residual, out: [M][H]; w, b: [H]. out may alias x.
 */
void ref_layernorm(float *out, float *residual, const float *x, const float *w, const float *b,
                   int M, int H, float eps);

/* residual[i] += x[i] for n values, fp32: the residual add without a norm (a parallel
 * residual's attention output); reference of k_residual_add. */
void ref_residual_add(float *residual, const float *x, size_t n);

/*
 * Per-head RMSNorm of the q and k heads of fused qkv rows, in place (Qwen3: q_norm / k_norm
 * before RoPE; transformers modeling_qwen3.py Qwen3Attention with Qwen3RMSNorm): row m of x
 * (row_stride floats) is [q (n_q heads) | k (n_kv heads) | v]; each q head v[hd] becomes
 * wq * v * rsqrt(mean(v^2) + eps), each k head the same with wk; v is untouched. Mean of
 * squares in double, as ref_rmsnorm. wq, wk: [hd].
 */
void ref_head_rmsnorm(float *x, int M, int n_q, int n_kv, int hd, size_t row_stride,
                      const float *wq, const float *wk, float eps);

/* out[i] = sum over q = 0, 1, .., world-1 of bufs[q][i], added in that order in fp32 starting
 * from 0.0f: the tensor-parallel all-reduce as every rank of k_allreduce_sum computes it (fp16
 * buffers: each value converted to fp32 first, the sum rounded once). bufs: world x [n]. */
void ref_allreduce_sum(float *out, const float *const *bufs, int world, size_t n);

/* out[M][I] = silu(gate) * up with gate_up[M][2*I] = [gate | up] (the fused gate_up_proj
 * output of DESIGN 5); silu(g) = g / (1 + exp(-g)). fp32. */
void ref_silu_mul(float *out, const float *gate_up, int M, int I);

/* out[i] = gelu(x[i]) for n values, the exact form x/2 * (1 + erf(x / sqrt(2))) (Hendrycks &
 * Gimpel 2016; torch.nn.GELU(approximate='none'), transformers ACT2FN["gelu"]: Falcon's and
 * MPT's MLP activation), fp32 (erf in double). out may alias x. */
void ref_gelu(float *out, const float *x, size_t n);

/* out[M][I] = gelu_tanh(gate) * up with gate_up[M][2*I] = [gate | up]: GeGLU with the tanh
 * approximation gelu_tanh(x) = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))) (Hendrycks &
 * Gimpel 2016; torch.nn.functional.gelu(approximate='tanh'), transformers
 * ACT2FN["gelu_pytorch_tanh"]: Gemma 2 / 3's MLP). fp32 out (tanh in double). */
void ref_gelu_tanh_mul(float *out, const float *gate_up, int M, int I);

/* x[i] = cap * tanh(x[i] / cap) for n values, in place (fp32 division and product, tanh in
 * double): soft-capping of attention scores and final logits (Gemma 2, transformers
 * modeling_gemma2.py: logits / cap, tanh, * cap). cap > 0. */
void ref_softcap(float *x, size_t n, float cap);

/* x[m][i] /= d[i] for M rows of I (fp32): AutoAWQ's ScaledActivation (awq/modules/act.py), the
 * activation output divided by the smoothing scales AWQ could not fold into a weight (MPT's
 * ffn.act.scales, docs/FORMATS.md 7.5). */
void ref_div_cols(float *x, const float *d, int M, int I);

/* Numerically stable softmax of each row of x[M][N], in place (fp32, max subtracted). */
void ref_softmax(float *x, int M, int N);

/* Index of the largest logit among ids [0, min(n, vocab_size)): ids >= vocab_size are padding
 * (DESIGN 5) and can never win. Ties go to the lowest id (torch.argmax); NaNs are skipped.
 * Returns -1 if there is no candidate. */
int ref_argmax(const float *logits, int n, int vocab_size);

/* --- act-order gather (kernels/ref_perm.c) ---------------------------------------------------- */

/* dst[m][j] = src[m][perm[j]] for M rows of K (an act-order linear's input, DESIGN 4.5); perm a
 * permutation of 0..K-1 (the runtime checks it when it opens the file). dst != src. */
void ref_gather_cols(float *dst, const float *src, const int32_t *perm, int M, int K);

/* --- embedding ------------------------------------------------------------------------------ */

/*
 * Vocab-parallel embedding lookup: out[m][:] = table[tokens[m] - row_begin][:] (fp16 -> fp32)
 * when row_begin <= tokens[m] < row_begin + V_r, else zeros (that row lives on another rank;
 * the all-reduce sum assembles the full embedding). table: fp16 [V_r][H]; out: [M][H]. The
 * caller has already checked tokens against vocab_size. Each value is multiplied by `scale` in
 * fp32 (1 for most models; Gemma's sqrt(hidden_size), modeling_gemma2.py normalizer).
 */
void ref_embed(float *out, const uint16_t *table, const int32_t *tokens, int M, int64_t row_begin,
               int V_r, int H, float scale);

/* --- rotary position embedding (kernels/ref_rope.c) ------------------------------------------ */

/*
 * Inverse frequencies inv_freq[hd/2], in fp32 as transformers computes them
 * (modeling_rope_utils.py): default inv_freq[i] = 1 / theta^(2i/hd); linear: / factor;
 * llama3 (_compute_llama3_parameters): with L = original_max_position_embeddings and
 * wavelen = 2*pi / inv_freq: wavelen < L/high_freq_factor unchanged, wavelen > L/low_freq_factor
 * divided by factor, else smooth = (L/wavelen - low)/(high - low) and
 * inv_freq = (1 - smooth) * inv_freq / factor + smooth * inv_freq. scaling (format/qs_rope.h:
 * the config's rope_scaling as parsed) may be NULL (default); its values are rounded to fp32
 * where used. hd must be even.
 */
void ref_rope_inv_freq(float *inv_freq, int hd, double rope_theta,
                       const struct qs_rope_scaling *scaling);

/*
 * RoPE in transformers' rotate_half form (pairs i and i + hd/2), in place, on M rows of
 * n_heads heads of hd values: row m starts at x + m*row_stride (floats), head h at + h*hd.
 * With a = pos[m] * inv_freq[i] (fp32 product, as HF's fp32 freqs): for i < hd/2,
 *   x'[i]        = x[i] * cos(a) - x[i + hd/2] * sin(a)
 *   x'[i + hd/2] = x[i + hd/2] * cos(a) + x[i] * sin(a).
 */
void ref_rope(float *x, int M, int n_heads, int hd, size_t row_stride, const int32_t *pos,
              const float *inv_freq);

/* --- attention (kernels/ref_attention.c) ---------------------------------------------------- */

/*
 * Causal multi-head attention with GQA over a KV cache, for prefill (M > 1) and decode (M = 1).
 * Query row m sits at position p = start_pos + m and attends to cached positions
 * [max(0, p - sliding_window + 1), p] (sliding_window <= 0: [0, p]; transformers' mask keeps
 * keys with p - k < sliding_window). Query head h reads kv head h / (n_heads / n_kv_heads).
 *   q:   row m at q + m*q_stride, [n_heads][hd] (already rotated)
 *   k_cache, v_cache: [n_kv_heads][T_cap][hd]; positions 0 .. start_pos + M - 1 filled
 *   out: row m at out + m*out_stride, [n_heads][hd]
 * scores = q.k / sqrt(hd), softmax in fp32 (max subtracted), out = sum softmax * v.
 * Errors: REF_ERR_SHAPE (n_heads % n_kv_heads, start_pos + M > T_cap, M < 1), REF_ERR_NOMEM.
 */
enum ref_err ref_attention(float *out, size_t out_stride, const float *q, size_t q_stride,
                           const float *k_cache, const float *v_cache, int M, int start_pos,
                           int n_heads, int n_kv_heads, int hd, int T_cap, int sliding_window,
                           struct ref_pool *pool);

/* --- paged KV cache (kernels/ref_attention.c) ------------------------------------------------ */

/*
 * How a paged attention forms its scores beyond q.k / sqrt(hd) (transformers eager attention of
 * modeling_gemma2.py / modeling_gemma3.py, modeling_mpt.py), in this order:
 *   s = q.k * scale                       scale 0: 1 / sqrt(hd) (Gemma: query_pre_attn_scalar^-0.5)
 *   s = softcap * tanh(s / softcap)       softcap > 0 only (Gemma 2's attn_logit_softcapping)
 *   s += alibi[h] * (t - p)               alibi non-NULL only (MPT; ref_alibi_slopes), f32 [n_heads]
 * then the causal / window mask and softmax. The CUDA kernels take the same struct with alibi in
 * device memory (kernels.h).
 */
struct ref_att_score {
    float scale;
    float softcap;
    const float *alibi;
};

/*
 * The paged KV cache (docs/DESIGN.md section 7, vLLM's PagedAttention: Kwon et al., "Efficient
 * Memory Management for Large Language Model Serving with PagedAttention", SOSP 2023): per layer
 * one pool of n_blocks blocks of block_size (bs) token rows, [n_blocks][n_kv_heads][bs][hd], so
 * the rows of one kv head in one block are contiguous. A sequence's block table lists its
 * blocks in position order: position t lives in block table[t / bs] at row t % bs. A flat cache
 * row ("slot") s = block * bs + row names one token row of the pool. The contiguous cache
 * [n_kv_heads][T_cap][hd] of ref_attention is the pool of a single block of bs = T_cap rows.
 * Offset in elements of (slot s, kv head h):
 */
static inline size_t ref_kv_offset(int64_t slot, int h, int n_kv_heads, int block_size, int hd)
{
    return (((size_t)(slot / block_size) * (size_t)n_kv_heads + (size_t)h) * (size_t)block_size +
            (size_t)(slot % block_size)) * (size_t)hd;
}

/*
 * Store M rows of keys and values into the pool: for each row m with slots[m] >= 0 and each kv
 * head h < n_kv_heads, pool row (slots[m], h) = k[m*row_stride + h*hd .. + hd] (v likewise);
 * rows with slots[m] < 0 (batch padding) are skipped. The caller keeps slots inside the pool.
 */
void ref_kv_store_paged(float *k_pool, float *v_pool, const float *k, const float *v,
                        size_t row_stride, int M, const int32_t *slots, int n_kv_heads, int hd,
                        int block_size);

/*
 * ref_attention over block tables, each query row with its own sequence and position: row m
 * sits at position pos[m] of the sequence whose block table is tables + row_table[m] *
 * table_stride (row_table NULL: table row m), and attends to that sequence's keys
 * [max(0, pos[m] - sliding_window + 1), pos[m]], key t in pool block table[t / bs]. Same math
 * as ref_attention (fp32 scores, max subtracted, sum of softmax * v in key order), so a row gets
 * the same bits here as in ref_attention over a contiguous copy of its sequence's cache.
 * score: NULL (scores q.k / sqrt(hd)), or the options of struct ref_att_score.
 * Errors: REF_ERR_SHAPE (M < 1, heads, n_heads % n_kv_heads, hd, block_size < 1, a position
 * < 0, a table entry < 0 for a key that is read), REF_ERR_NOMEM.
 */
enum ref_err ref_attention_paged(float *out, size_t out_stride, const float *q, size_t q_stride,
                                 const float *k_pool, const float *v_pool, int M,
                                 const int32_t *pos, const int32_t *tables, int table_stride,
                                 const int32_t *row_table, int n_heads, int n_kv_heads, int hd,
                                 int block_size, int sliding_window,
                                 const struct ref_att_score *score, struct ref_pool *pool);

/* ALiBi slopes of heads [h0, h0 + n) of a model with n_heads heads (Press et al., "Train Short,
 * Test Long", 2022; MPT's form, transformers modeling_mpt.py build_mpt_alibi_tensor): with P the
 * power of two >= n_heads, slope_i = 2^-(i * alibi_bias_max / P) for i = 1..P, in fp32; when
 * P != n_heads the heads take the odd-numbered slopes first, then the even ones. Head h's score
 * with key t at query position p gets slope_h * (t - p) (a per-row constant away from MPT's
 * slope * (t - (T - 1)), which softmax ignores). out[n]. */
void ref_alibi_slopes(float *out, int n_heads, int h0, int n, float alibi_bias_max);

/* --- mixture of experts (kernels/ref_moe_route.c) ------------------------------------------- */

/*
 * Mixtral routing (transformers MixtralSparseMoeBlock): for each of M tokens, softmax over the
 * E router logits (fp32), keep the top_k largest (ties: lower expert id first), and, with renorm,
 * renormalise the kept weights to sum 1 (Mixtral always; Qwen3-MoE when norm_topk_prob, else
 * the kept softmax probabilities as they are). logits [M][E]; ids, weights [M][top_k], in
 * descending weight order.
 */
void ref_moe_route(const float *logits, int M, int E, int top_k, bool renorm, int32_t *ids,
                   float *weights);

#ifdef __cplusplus
}
#endif
#endif /* QS_REF_H */
