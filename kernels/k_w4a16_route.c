/*
 * k_w4a16_route.c - the W4A16 router: which kernel runs a linear of shape (M, N, K, G) with a
 * given epilogue on a device with given capabilities, and which buffers it needs
 * (kernels.h, "W4A16 linear"). Plain C, no CUDA: the choice is host arithmetic on two tables,
 * so CI tests it without a GPU (tests/test_route.c) and kernels/k_w4a16.cu's launcher runs a
 * route exactly as chosen.
 *
 *   KERNELS  what each kernel can take: row limit, epilogues, requirement;
 *   ROUTES   which kernel auto prefers per epilogue and M band, first row that fits wins.
 *
 * The bands are the H200 measurements of docs/BENCHMARKS.md ("GPU kernels (H200)"): SPLITK
 * (deferred split-K + finish, v9) fastest of all decode kernels at M = 1..64; WGMMA (v7)
 * 1.0-1.9x faster than dequant + cuBLAS at M = 65..128 and slower above (section "Prompts of
 * 65-128 rows"); DQ_GEMM from 129 rows; FALLBACK (v4 stream-K) only where SPLITK cannot take G.
 * SPLITK's requirement is the shared-memory arithmetic of its slices (k_w4a16_v5_plan), the
 * same function its launcher sizes the blocks with.
 */
#include <limits.h> /* INT_MAX */
#include <string.h> /* strcmp */

#include "k_w4a16_int.h" /* k_w4a16_v5_plan, K_V5_*, kernels.h */
#include "qs_log.h"      /* qs_log_error */

/* --- shared arithmetic (k_w4a16_int.h) ------------------------------------------------------ */

int k_w4a16_check_shape(const char *who, int M, int N, int K, int G)
{
    if (M < 1 || N < 1 || K < 1 || G < 16 || K % 16 || N % 64 || G % 16 || K % G) {
        qs_log_error(who, "W4A16 shape M=%d N=%d K=%d G=%d: need M,N,K >= 1, K %% 16 == 0, "
                     "N %% 64 == 0, G %% 16 == 0 (G >= 16), K %% G == 0 (DESIGN 4)", M, N, K, G);
        return K_ERR_SHAPE;
    }
    if ((long long)(K / 16) * (N / 64) > 0x7fffffffLL / 64) {
        qs_log_error(who, "W4A16 shape N=%d K=%d: too many tiles for 32-bit tile indices", N, K);
        return K_ERR_SHAPE;
    }
    return K_ERR_NONE;
}

long long k_w4a16_v5_smem(int mb8, int gt, int kc, int xs, int ring)
{
    const long long rows = 8LL * mb8, warps = K_V5_WARPS(mb8);
    const long long loop = rows * xs * kc * 32 + (ring ? warps * K_V5_DEPTH * K_V5_TILE_BYTES : 0) +
                           warps * (kc / gt) * K_V5_SZ_BYTES;
    const long long stage = warps * rows * 64 * 4;
    if (ring) return loop;                            /* the stage lives in the ring */
    if (mb8 >= 4) return loop > stage ? loop : stage; /* the stage lies over the slice */
    return loop + stage;
}

int k_w4a16_v5_plan(int M, int K, int G, int smem_optin, int ring,
                    struct k_w4a16_splitk_plan *plan)
{
    (void)K; /* the slice count depends on K and the occupancy: the launcher's part */
    const int gt = G / 16;
    struct k_w4a16_splitk_plan p;
    /* instances (w4a16_v5_decode_kernel<MB8, SCALE_AFTER, GTC, ...>); the ring (v6) has no
     * instance above 16 rows */
    p.mb8 = M <= 8 ? 1 : (M <= 16 || ring) ? 2 : M <= 32 ? 4 : 8;
    p.scale_after = p.mb8 <= 2;
    if (gt == 1 || gt == 2 || gt == 4) p.gtc = gt; /* GT divides the unroll of 8 */
    else if (gt % K_V5_DEPTH == 0) p.gtc = 0;      /* GT a multiple of it */
    else return -1;                                /* e.g. G = 48 */
    p.unit = gt > K_V5_DEPTH ? gt : K_V5_DEPTH;
    const int rows = 8 * p.mb8;
    int kc = K_V5_X_BUDGET(p.mb8) / (rows * 32) / p.unit * p.unit;
    if (kc < p.unit) kc = p.unit;
    p.smem_max = smem_optin < K_V5_SMEM_CAP ? smem_optin : K_V5_SMEM_CAP;
    /* small G: many scale rows per slice; shrink the slice until it fits */
    while (kc > p.unit && k_w4a16_v5_smem(p.mb8, gt, kc, 1, ring) > p.smem_max) kc -= p.unit;
    if (k_w4a16_v5_smem(p.mb8, gt, kc, 1, ring) > p.smem_max) return -1; /* large G */
    p.kc_max = kc;
    *plan = p;
    return 0;
}

/* --- the tables ----------------------------------------------------------------------------- */

enum need {
    NEED_NONE = 0,
    NEED_V5_G,  /* SPLITK's slices of whole groups fit (k_w4a16_v5_plan) */
    NEED_WGMMA, /* caps->wgmma && caps->allow_wgmma */
};

/* What each kernel can take. */
static const struct kernel_row {
    const char *name;
    int max_m;     /* rows at most */
    int epilogues; /* bit e: epilogue e */
    enum need need;
} KERNELS[] = {
    [K_W4A16_KERNEL_AUTO] = {"auto", 0, 0, NEED_NONE},
    [K_W4A16_KERNEL_SPLITK] = {"splitk", K_W4A16_SPLITK_MAX_M,
                               1 << K_W4A16_EPI_Y | 1 << K_W4A16_EPI_ACC, NEED_V5_G},
    /* grid rows of 128 tokens: ceil(M / 128) <= 65535 */
    [K_W4A16_KERNEL_WGMMA] = {"wgmma", 65535 * 128, 1 << K_W4A16_EPI_Y, NEED_WGMMA},
    [K_W4A16_KERNEL_DQ_GEMM] = {"dq_gemm", INT_MAX, 1 << K_W4A16_EPI_Y, NEED_NONE},
    [K_W4A16_KERNEL_FALLBACK] = {"fallback", K_W4A16_SPLITK_MAX_M, 1 << K_W4A16_EPI_Y, NEED_NONE},
};
#define N_KERNELS ((int)(sizeof(KERNELS) / sizeof(KERNELS[0])))

/* Auto: per epilogue, the first row whose band holds M and whose kernel fits. */
static const struct route_row {
    enum k_w4a16_epilogue epilogue;
    int m_lo, m_hi;
    enum k_w4a16_kernel kernel;
    int ws_rows; /* workspace sized for this many rows (0: M), so one buffer serves the band */
} ROUTES[] = {
    {K_W4A16_EPI_ACC, 1, K_W4A16_SPLITK_MAX_M, K_W4A16_KERNEL_SPLITK, 0},
    {K_W4A16_EPI_Y, 1, K_W4A16_SPLITK_MAX_M, K_W4A16_KERNEL_SPLITK, 0},
    {K_W4A16_EPI_Y, 1, K_W4A16_SPLITK_MAX_M, K_W4A16_KERNEL_FALLBACK, 0},
    {K_W4A16_EPI_Y, K_W4A16_SPLITK_MAX_M + 1, K_W4A16_DQ_GEMM_MIN_M - 1, K_W4A16_KERNEL_WGMMA,
     K_W4A16_DQ_GEMM_MIN_M - 1},
    {K_W4A16_EPI_Y, K_W4A16_SPLITK_MAX_M + 1, INT_MAX, K_W4A16_KERNEL_DQ_GEMM, 0},
};

const char *k_w4a16_kernel_name(enum k_w4a16_kernel k)
{
    return (int)k >= 0 && (int)k < N_KERNELS ? KERNELS[k].name : NULL;
}

int k_w4a16_kernel_parse(const char *name)
{
    for (int k = 0; name && k < N_KERNELS; ++k)
        if (strcmp(name, KERNELS[k].name) == 0) return k;
    return -1;
}

/* Whether kernel k runs (M, G, epilogue) on caps; fills the SPLITK plan. No report. */
static int kernel_fits(enum k_w4a16_kernel k, int M, int K, int G, enum k_w4a16_epilogue epi,
                       const struct k_w4a16_caps *caps, struct k_w4a16_splitk_plan *plan)
{
    const struct kernel_row *kr = &KERNELS[k];
    if (M > kr->max_m || !(kr->epilogues & (1 << epi))) return 0;
    switch (kr->need) {
    case NEED_V5_G: return k_w4a16_v5_plan(M, K, G, caps->smem_optin, 0, plan) == 0;
    case NEED_WGMMA: return caps->wgmma && caps->allow_wgmma;
    case NEED_NONE: return 1;
    }
    return 0;
}

/* Workspace and scratch of kernel k for (M, N, K) with the workspace sized for ws_rows rows. */
static void route_buffers(struct k_w4a16_route *r, int ws_rows)
{
    const int M = ws_rows > r->M ? ws_rows : r->M;
    r->workspace_bytes = 0;
    r->scratch_bytes = 0;
    switch (r->kernel) {
    case K_W4A16_KERNEL_SPLITK: /* ACC: the caller's acc is the output */
        if (r->epilogue == K_W4A16_EPI_Y) r->workspace_bytes = k_w4a16_workspace_bytes(M, r->N);
        break;
    case K_W4A16_KERNEL_FALLBACK: r->workspace_bytes = k_w4a16_workspace_bytes(M, r->N); break;
    case K_W4A16_KERNEL_WGMMA: /* split-K at up to two row blocks (k_w4a16.cu, v7::SPLIT_MAX_M) */
        if (r->M <= 256) r->workspace_bytes = k_w4a16_workspace_bytes(M, r->N);
        break;
    case K_W4A16_KERNEL_DQ_GEMM: r->scratch_bytes = (size_t)r->K * r->N * 2; break;
    case K_W4A16_KERNEL_AUTO: break;
    }
}

int k_w4a16_route_pick(struct k_w4a16_route *out, int M, int N, int K, int G,
                  enum k_w4a16_epilogue epilogue, enum k_w4a16_kernel kernel,
                  const struct k_w4a16_caps *caps)
{
    if (!out || !caps) {
        qs_log_error(__func__, "NULL route (%p) or caps (%p)", (void *)out, (const void *)caps);
        return K_ERR_ARG;
    }
    if ((int)kernel < 0 || (int)kernel >= N_KERNELS ||
        (epilogue != K_W4A16_EPI_Y && epilogue != K_W4A16_EPI_ACC)) {
        qs_log_error(__func__, "unknown W4A16 kernel %d or epilogue %d", (int)kernel, (int)epilogue);
        return K_ERR_ARG;
    }
    int rc = k_w4a16_check_shape(__func__, M, N, K, G);
    if (rc) return rc;
    struct k_w4a16_route r = {.epilogue = epilogue, .M = M, .N = N, .K = K, .G = G};
    int ws_rows = 0;
    if (kernel == K_W4A16_KERNEL_AUTO) {
        const int n = (int)(sizeof(ROUTES) / sizeof(ROUTES[0]));
        int i = 0;
        for (; i < n; ++i)
            if (ROUTES[i].epilogue == epilogue && M >= ROUTES[i].m_lo && M <= ROUTES[i].m_hi &&
                kernel_fits(ROUTES[i].kernel, M, K, G, epilogue, caps, &r.splitk))
                break;
        if (i == n) {
            qs_log_error(__func__, "W4A16 M=%d N=%d K=%d G=%d: no route gives the %s epilogue "
                         "(the split-K kernel cannot take G=%d with %d bytes of shared memory "
                         "per block, or M > %d)", M, N, K, G,
                         epilogue == K_W4A16_EPI_ACC ? "fp32 accumulator" : "fp16", G,
                         caps->smem_optin, K_W4A16_SPLITK_MAX_M);
            return K_ERR_UNSUPPORTED;
        }
        r.kernel = ROUTES[i].kernel;
        ws_rows = ROUTES[i].ws_rows;
    } else {
        const struct kernel_row *kr = &KERNELS[kernel];
        if (M > kr->max_m) {
            qs_log_error(__func__, "W4A16 %s: M=%d > %d", kr->name, M, kr->max_m);
            return K_ERR_SHAPE;
        }
        if (!kernel_fits(kernel, M, K, G, epilogue, caps, &r.splitk)) {
            qs_log_error(__func__, "W4A16 %s M=%d N=%d K=%d G=%d: not here (%s)", kr->name, M, N,
                         K, G, !(kr->epilogues & (1 << epilogue)) ? "no fp32-accumulator epilogue"
                         : kr->need == NEED_WGMMA ? "wgmma needs compute capability 9.0, a build "
                                                    "with sm_90a, and the caller's consent"
                                                  : "G needs a slice larger than shared memory "
                                                    "allows, or G/16 neither divides nor is a "
                                                    "multiple of 8");
            return K_ERR_UNSUPPORTED;
        }
        r.kernel = kernel;
    }
    route_buffers(&r, ws_rows);
    *out = r;
    return K_ERR_NONE;
}

int k_w4a16_acc_available(int max_m, int N, int K, int G, const struct k_w4a16_caps *caps)
{
    if (!caps || max_m < 1 || max_m > K_W4A16_SPLITK_MAX_M || N < 1 || K < 1 || G < 16 ||
        K % 16 || N % 64 || G % 16 || K % G)
        return 0;
    struct k_w4a16_splitk_plan p;
    for (int m = 1; m <= max_m; ++m) /* SPLITK's fit changes with M only at its instances */
        if (k_w4a16_v5_plan(m, K, G, caps->smem_optin, 0, &p)) return 0;
    return 1;
}

size_t k_w4a16_workspace_bytes(int M, int N)
{
    if (M < 1 || N < 64) return 0;
    const size_t b = (size_t)M * N * sizeof(float) + (size_t)(N / 64) * sizeof(unsigned);
    return (b + 255) / 256 * 256;
}
