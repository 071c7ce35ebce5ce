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

#include <stddef.h>
#include <stdint.h>

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

/* --- the packed int4 layout (DESIGN 4.1-4.3; kernels/ref_pack.c) ---------------------------- */

#define REF_W4_TILE_K 16   /* k rows per packed tile (mma m16n8k16 k) */
#define REF_W4_TILE_N 64   /* n columns per packed tile (8 n8 sub-tiles) */
#define REF_W4_TILE_BYTES 512

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

#ifdef __cplusplus
}
#endif
#endif /* QS_REF_H */
