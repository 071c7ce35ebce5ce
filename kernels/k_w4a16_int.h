/*
 * k_w4a16_int.h - module-private part of the W4A16 linear: the constants of the v5 split-K
 * family that both the device code (kernels/k_w4a16_v5.cuh) and the plain-C router
 * (kernels/k_w4a16_route.c) need, and the host arithmetic they share. Not for callers outside
 * kernels/ (they use kernels.h); C11 and C++ alike.
 *
 * Why here: the router decides, before anything is launched, whether v5 can take a group size
 * (its slice of whole groups must fit in shared memory), so the shared-memory budget of a v5
 * block is computed by ONE function (k_w4a16_v5_smem) that the router, the library launcher
 * and the lab programs (kernels/lab/) call.
 */
#ifndef QS_K_W4A16_INT_H
#define QS_K_W4A16_INT_H

#include "kernels.h" /* struct k_w4a16_splitk_plan */

#ifdef __cplusplus
extern "C" {
#endif

/* v5 (kernels/k_w4a16_v5.cuh) */
#define K_V5_DEPTH 8        /* weight tiles in flight per lane; the tile loop is unrolled by it */
#define K_V5_SZ_BYTES 160   /* one group of one n-tile: 128 B scales + 32 B zero words */
#define K_V5_TILE_BYTES 512 /* one packed 16 x 64 tile (DESIGN 4.1) */
/* dynamic shared memory a v5 block may take: 220 KB of the 227 KB a block may use on sm_90,
 * less where the device offers less (k_w4a16_v5_plan) */
#define K_V5_SMEM_CAP (220 * 1024)

/* warps per block of the instance for mb8 token blocks of 8 rows: 8 at M > 16 (eight warps
 * share one activation slice), else 4 */
#define K_V5_WARPS(mb8) ((mb8) >= 4 ? 8 : 4)
/* bytes of the staged activation slice at most, per mb8 (the reasons are at v5::X_BUDGET) */
#define K_V5_X_BUDGET(mb8) ((mb8) == 1 ? 16384 : (mb8) == 2 ? 32768 : (mb8) == 4 ? 131072 : 196608)

/*
 * Dynamic shared memory of one v5 block, bytes: mb8 token blocks (1, 2, 4, 8), GT = G / 16
 * k-tiles per group, slices of kc k-tiles, xs slices staged per block (1; 4 with the block
 * pre-sum), ring = the weights go through a per-warp cp.async ring (v6, kernels/lab) instead of
 * registers. Layout (w4a16_v5_decode_kernel): the activation slice [8*mb8][xs*kc*16] fp16, the
 * ring when there is one, the warps' scale/zero rows, and the flush stage [8*mb8][64] fp32 per
 * warp, which lives in the ring (ring), over the slice (mb8 >= 4) or after the rest.
 */
long long k_w4a16_v5_smem(int mb8, int gt, int kc, int xs, int ring);

/*
 * The v5 plan for M rows and group size G with k-dimension K on a device whose blocks may opt
 * in to smem_optin bytes of shared memory (ring: as k_w4a16_v5_smem): the instance (mb8,
 * scale_after, gtc), the slice unit and the largest slice that fits. Returns 0 and fills *plan,
 * or -1 (plan untouched, nothing logged) when v5 cannot take G: G/16 neither divides nor is a
 * multiple of K_V5_DEPTH, or even one unit of k-tiles needs more shared memory than a block
 * may have (large G: whole groups per slice, e.g. per-channel G = K). Needs 1 <= M <= 64.
 */
int k_w4a16_v5_plan(int M, int K, int G, int smem_optin, int ring,
                    struct k_w4a16_splitk_plan *plan);

/* K_ERR_SHAPE (reported once under `who` with the numbers) unless M, N, K >= 1, K % 16 == 0,
 * N % 64 == 0, G >= 16, G % 16 == 0, K % G == 0 (DESIGN 4) and the tile count fits 32-bit
 * tile indices; K_ERR_NONE otherwise. */
int k_w4a16_check_shape(const char *who, int M, int N, int K, int G);

#ifdef __cplusplus
}
#endif
#endif /* QS_K_W4A16_INT_H */
