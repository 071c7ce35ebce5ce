/*
 * test_route.c - the W4A16 router (kernels/k_w4a16_route.c) without a GPU: the table of
 * kernels.h ("W4A16 linear") over M = 1..4096 on three device profiles, the group sizes the
 * split-K kernel cannot take, per-channel quantisation (G = K) against the shared-memory limits
 * of each profile, the ACC epilogue's availability, forced kernels and their refusals, and the
 * workspace / scratch each route asks for.
 *
 * Where the expected numbers come from: the routing bands are the specification in kernels.h;
 * the shared-memory sizes are the layout of the v5 block (kernels/k_w4a16_v5.cuh: activation
 * slice [8*mb8][kc*16] fp16, 160 bytes of scales and zeros per group and warp, a [8*mb8][64]
 * fp32 flush stage per warp), written out here term by term; the device limits are NVIDIA's
 * (CUDA programming guide, "Compute Capabilities": 227 KB of shared memory per block on
 * sm_90, 163 KB on sm_80, 99 KB on sm_89).
 * Run: ./build/test_route
 */
#include <string.h>

#include "k_w4a16_int.h" /* k_w4a16_v5_plan, k_w4a16_v5_smem, kernels.h */
#include "qs_log.h"
#include "t.h"

static const struct k_w4a16_caps H200 = {1, 1, 227 * 1024};
static const struct k_w4a16_caps A100 = {0, 1, 163 * 1024};
static const struct k_w4a16_caps L40S = {0, 1, 99 * 1024};

/* The kernel auto picks for the fp16 epilogue, or -1 where the router refuses. */
static int auto_y(int M, int N, int K, int G, const struct k_w4a16_caps *caps)
{
    struct k_w4a16_route r;
    if (k_w4a16_route_pick(&r, M, N, K, G, K_W4A16_EPI_Y, K_W4A16_KERNEL_AUTO, caps)) return -1;
    return (int)r.kernel;
}

/* The v5 block's shared memory, from its layout (see the top comment), for mb8 token blocks,
 * slices of kc k-tiles of a group of gt k-tiles, one slice per block, weights in registers. */
static long long v5_layout_bytes(int mb8, int gt, int kc)
{
    const long long rows = 8LL * mb8, warps = mb8 >= 4 ? 8 : 4;
    const long long slice = rows * kc * 16 * 2;       /* fp16 activations */
    const long long groups = warps * (kc / gt) * 160; /* 128 B scales + 32 B zeros per group */
    const long long stage = warps * rows * 64 * 4;    /* fp32 flush stage per warp */
    return mb8 >= 4 ? (slice + groups > stage ? slice + groups : stage) : slice + groups + stage;
}

/* The bands of kernels.h for every M = 1..4096, with and without wgmma. */
static void test_bands(void)
{
    const struct k_w4a16_caps no_wgmma = {1, 0, H200.smem_optin}; /* wgmma there, not allowed */
    int bad = 0, bad_off = 0, bad_a100 = 0;
    for (int M = 1; M <= 4096; ++M) {
        const int want = M <= 64 ? K_W4A16_KERNEL_SPLITK
                         : M <= 128 ? K_W4A16_KERNEL_WGMMA : K_W4A16_KERNEL_DQ_GEMM;
        const int want_off = M <= 64 ? K_W4A16_KERNEL_SPLITK : K_W4A16_KERNEL_DQ_GEMM;
        bad += auto_y(M, 4096, 4096, 128, &H200) != want;
        bad_off += auto_y(M, 4096, 4096, 128, &no_wgmma) != want_off;
        bad_a100 += auto_y(M, 11008, 4096, 128, &A100) != want_off;
    }
    CHECK_MSG(bad == 0, "%d of 4096 M on the H200 profile off the table", bad);
    CHECK_MSG(bad_off == 0, "%d of 4096 M with wgmma not allowed off the table", bad_off);
    CHECK_MSG(bad_a100 == 0, "%d of 4096 M on the A100 profile off the table", bad_a100);
    /* the band edges the header names */
    CHECK_EQ_INT(auto_y(K_W4A16_SPLITK_MAX_M, 4096, 4096, 128, &H200), K_W4A16_KERNEL_SPLITK);
    CHECK_EQ_INT(auto_y(K_W4A16_SPLITK_MAX_M + 1, 4096, 4096, 128, &H200), K_W4A16_KERNEL_WGMMA);
    CHECK_EQ_INT(auto_y(K_W4A16_DQ_GEMM_MIN_M - 1, 4096, 4096, 128, &H200), K_W4A16_KERNEL_WGMMA);
    CHECK_EQ_INT(auto_y(K_W4A16_DQ_GEMM_MIN_M, 4096, 4096, 128, &H200), K_W4A16_KERNEL_DQ_GEMM);
    /* the caps' wgmma flag alone (a GPU that is not sm_90a) */
    const struct k_w4a16_caps no_hw = {0, 1, H200.smem_optin};
    CHECK_EQ_INT(auto_y(100, 4096, 4096, 128, &no_hw), K_W4A16_KERNEL_DQ_GEMM);
}

/* Group sizes: the split-K kernel unrolls by 8 k-tiles, so G/16 must divide 8 or be a multiple
 * of it; every other G at M <= 64 goes to the fallback, and every G has a route at every M. */
static void test_groups(void)
{
    int no_route = 0;
    for (int G = 16; G <= 1024; G += 16) {
        const int K = G * 12; /* a multiple of every G tried */
        const int gt = G / 16;
        const int splitk_ok = gt == 1 || gt == 2 || gt == 4 || gt % 8 == 0;
        for (int M = 1; M <= 200; M += 7) {
            const int k = auto_y(M, 256, K, G, &H200);
            no_route += k < 0;
            if (M <= 64) {
                CHECK_MSG(k == (splitk_ok ? K_W4A16_KERNEL_SPLITK : K_W4A16_KERNEL_FALLBACK),
                          "G=%d M=%d: kernel %d", G, M, k);
            }
        }
        CHECK_EQ_INT(k_w4a16_acc_available(16, 256, K, G, &H200), splitk_ok);
    }
    CHECK_EQ_INT(no_route, 0);
    /* G = 48: no ACC route (refused, reported), the fallback for y */
    struct k_w4a16_route r;
    qs_log_set_quiet(true);
    CHECK_EQ_INT(k_w4a16_route_pick(&r, 3, 128, 96, 48, K_W4A16_EPI_ACC, K_W4A16_KERNEL_AUTO, &H200),
                 K_ERR_UNSUPPORTED);
    CHECK(strstr(qs_log_last(), "G=48") != NULL);
    qs_log_set_quiet(false);
    CHECK_EQ_INT(auto_y(3, 128, 96, 48, &H200), K_W4A16_KERNEL_FALLBACK);
}

/* The split-K plan: instance by M, shared memory by the block layout, within each profile. */
static void test_plan(void)
{
    const struct k_w4a16_caps *profiles[] = {&H200, &A100, &L40S};
    /* the v5 instances: 8 / 16 / 32 / 64 token rows */
    for (int M = 1; M <= 64; ++M) {
        struct k_w4a16_splitk_plan p;
        CHECK_EQ_INT(k_w4a16_v5_plan(M, 4096, 128, H200.smem_optin, 0, &p), 0);
        const int mb8 = M <= 8 ? 1 : M <= 16 ? 2 : M <= 32 ? 4 : 8;
        CHECK_MSG(p.mb8 == mb8 && p.scale_after == (mb8 <= 2) && p.gtc == 0 && p.unit == 8,
                  "M=%d: mb8 %d scale_after %d gtc %d unit %d", M, p.mb8, p.scale_after, p.gtc, p.unit);
    }
    /* a documented size: Llama-3-8B gate_up at G = 16 and M = 1 stages a slice of 64 k-tiles,
     * 40 KB of scales and zeros, 64 KB in all (past the default 48 KB: the opt-in attribute) */
    CHECK_EQ_INT(k_w4a16_v5_smem(1, 1, 64, 1, 0), 64 * 1024);
    CHECK_EQ_INT(v5_layout_bytes(1, 1, 64), 64 * 1024);
    for (int g = 0; g < 3; ++g)
        for (int G = 16; G <= 8192; G *= 2)
            for (int M = 1; M <= 64; M += 3) {
                struct k_w4a16_splitk_plan p;
                if (k_w4a16_v5_plan(M, 16 * G, G, profiles[g]->smem_optin, 0, &p)) {
                    /* refused: even one unit of whole groups is past the limit */
                    const int mb8 = M <= 8 ? 1 : M <= 16 ? 2 : M <= 32 ? 4 : 8, gt = G / 16;
                    const int unit = gt > 8 ? gt : 8;
                    const long long lim = profiles[g]->smem_optin < 220 * 1024 ? profiles[g]->smem_optin : 220 * 1024;
                    CHECK_MSG(v5_layout_bytes(mb8, gt, unit) > lim, "G=%d M=%d refused below the limit", G, M);
                    continue;
                }
                const long long b = v5_layout_bytes(p.mb8, G / 16, p.kc_max);
                CHECK_MSG(p.kc_max % p.unit == 0 && p.kc_max >= p.unit && b <= p.smem_max &&
                              p.smem_max <= profiles[g]->smem_optin &&
                              b == k_w4a16_v5_smem(p.mb8, G / 16, p.kc_max, 1, 0),
                          "G=%d M=%d profile %d: kc_max %d unit %d, %lld bytes of %d", G, M, g,
                          p.kc_max, p.unit, b, p.smem_max);
            }
}

/* Per-channel quantisation (G = K): one group is the whole K, so a slice is K/16 k-tiles. */
static void test_per_channel(void)
{
    /* K = 4096: 8 rows fit everywhere; 64 rows (8 warps, 64-row slice of 256 k-tiles = 512 KB)
     * nowhere, so y goes to the fallback there and ACC does not exist at 64 rows */
    const struct k_w4a16_caps *profiles[] = {&H200, &A100, &L40S};
    for (int i = 0; i < 3; ++i) {
        CHECK_EQ_INT(auto_y(1, 128, 4096, 4096, profiles[i]), K_W4A16_KERNEL_SPLITK);
        CHECK_EQ_INT(auto_y(64, 128, 4096, 4096, profiles[i]), K_W4A16_KERNEL_FALLBACK);
        CHECK_EQ_INT(k_w4a16_acc_available(64, 128, 4096, 4096, profiles[i]), 0);
    }
    /* M = 1, K = 8192: 8 x 512 x 32 B = 128 KB of activations + 8.6 KB, between the L40S's
     * 99 KB and the A100's 163 KB; K = 11008: 172 KB + 8.6 KB, between the A100's and the
     * H200's 220 KB cap */
    CHECK(v5_layout_bytes(1, 512, 512) > 99 * 1024 && v5_layout_bytes(1, 512, 512) < 163 * 1024);
    CHECK(v5_layout_bytes(1, 688, 688) > 163 * 1024 && v5_layout_bytes(1, 688, 688) < 220 * 1024);
    CHECK_EQ_INT(auto_y(1, 128, 8192, 8192, &A100), K_W4A16_KERNEL_SPLITK);
    CHECK_EQ_INT(auto_y(1, 128, 8192, 8192, &L40S), K_W4A16_KERNEL_FALLBACK);
    CHECK_EQ_INT(auto_y(1, 128, 11008, 11008, &H200), K_W4A16_KERNEL_SPLITK);
    CHECK_EQ_INT(auto_y(1, 128, 11008, 11008, &A100), K_W4A16_KERNEL_FALLBACK);
    CHECK_EQ_INT(k_w4a16_acc_available(8, 128, 11008, 11008, &H200), 1);
    CHECK_EQ_INT(k_w4a16_acc_available(16, 128, 11008, 11008, &H200), 0);
    CHECK_EQ_INT(k_w4a16_acc_available(1, 128, 11008, 11008, &A100), 0);
    CHECK_EQ_INT(k_w4a16_acc_available(1, 128, 8192, 8192, &A100), 1);
}

/* What each route asks for. */
static void test_buffers(void)
{
    struct k_w4a16_route r;
    const int N = 4096, K = 11008;
    const size_t ws1 = ((size_t)1 * N * 4 + N / 64 * 4 + 255) / 256 * 256;
    CHECK_EQ_INT(k_w4a16_workspace_bytes(1, N), ws1);
    CHECK_EQ_INT(k_w4a16_workspace_bytes(0, N), 0);
    CHECK_EQ_INT(k_w4a16_workspace_bytes(3, 32), 0);
    CHECK_EQ_INT(k_w4a16_route_pick(&r, 1, N, K, 128, K_W4A16_EPI_Y, K_W4A16_KERNEL_AUTO, &H200), 0);
    CHECK(r.kernel == K_W4A16_KERNEL_SPLITK && r.epilogue == K_W4A16_EPI_Y && r.M == 1 &&
          r.N == N && r.K == K && r.G == 128 && r.workspace_bytes == ws1 && r.scratch_bytes == 0);
    /* ACC: the caller's accumulator is the output, no workspace */
    CHECK_EQ_INT(k_w4a16_route_pick(&r, 16, N, K, 128, K_W4A16_EPI_ACC, K_W4A16_KERNEL_AUTO, &H200), 0);
    CHECK(r.kernel == K_W4A16_KERNEL_SPLITK && r.epilogue == K_W4A16_EPI_ACC &&
          r.workspace_bytes == 0 && r.scratch_bytes == 0);
    /* wgmma: its split-K workspace sized for the whole band, so prompt chunks of 65..128 rows
     * share one buffer */
    for (int M = 65; M <= 128; ++M) {
        CHECK_EQ_INT(k_w4a16_route_pick(&r, M, N, K, 128, K_W4A16_EPI_Y, K_W4A16_KERNEL_AUTO, &H200), 0);
        CHECK(r.kernel == K_W4A16_KERNEL_WGMMA && r.workspace_bytes == k_w4a16_workspace_bytes(128, N));
    }
    /* forced wgmma above the band: sized for M up to two row blocks, none above (no split) */
    CHECK_EQ_INT(k_w4a16_route_pick(&r, 200, N, K, 128, K_W4A16_EPI_Y, K_W4A16_KERNEL_WGMMA, &H200), 0);
    CHECK_EQ_INT(r.workspace_bytes, k_w4a16_workspace_bytes(200, N));
    CHECK_EQ_INT(k_w4a16_route_pick(&r, 300, N, K, 128, K_W4A16_EPI_Y, K_W4A16_KERNEL_WGMMA, &H200), 0);
    CHECK_EQ_INT(r.workspace_bytes, 0);
    /* dequant + cuBLAS: the fp16 weight as scratch */
    CHECK_EQ_INT(k_w4a16_route_pick(&r, 4096, N, K, 128, K_W4A16_EPI_Y, K_W4A16_KERNEL_AUTO, &H200), 0);
    CHECK(r.kernel == K_W4A16_KERNEL_DQ_GEMM && r.workspace_bytes == 0 &&
          r.scratch_bytes == (size_t)K * N * 2);
    /* the fallback: sums and counters */
    CHECK_EQ_INT(k_w4a16_route_pick(&r, 33, N, 96, 48, K_W4A16_EPI_Y, K_W4A16_KERNEL_AUTO, &H200), 0);
    CHECK(r.kernel == K_W4A16_KERNEL_FALLBACK && r.workspace_bytes == k_w4a16_workspace_bytes(33, N));
}

/* Forced kernels and every refusal. */
static void test_forced(void)
{
    struct k_w4a16_route r;
    memset(&r, 0x5A, sizeof(r));
    const struct k_w4a16_route before = r;
    qs_log_set_quiet(true);
    struct { int M, N, K, G, epi, kernel; const struct k_w4a16_caps *caps; int want; const char *why; } cases[] = {
        {1, 64, 16, 16, K_W4A16_EPI_Y, K_W4A16_KERNEL_SPLITK, &H200, K_ERR_NONE, "smallest shape"},
        {64, 64, 16, 16, K_W4A16_EPI_Y, K_W4A16_KERNEL_FALLBACK, &H200, K_ERR_NONE, "fallback at 64"},
        {1, 64, 16, 16, K_W4A16_EPI_Y, K_W4A16_KERNEL_WGMMA, &H200, K_ERR_NONE, "wgmma at M = 1"},
        {1, 64, 16, 16, K_W4A16_EPI_Y, K_W4A16_KERNEL_DQ_GEMM, &L40S, K_ERR_NONE, "dq_gemm anywhere"},
        {65, 64, 64, 64, K_W4A16_EPI_Y, K_W4A16_KERNEL_SPLITK, &H200, K_ERR_SHAPE, "splitk M > 64"},
        {65, 64, 64, 64, K_W4A16_EPI_Y, K_W4A16_KERNEL_FALLBACK, &H200, K_ERR_SHAPE, "fallback M > 64"},
        {65, 64, 64, 64, K_W4A16_EPI_ACC, K_W4A16_KERNEL_AUTO, &H200, K_ERR_UNSUPPORTED, "ACC M > 64"},
        {1, 64, 64, 64, K_W4A16_EPI_Y, K_W4A16_KERNEL_WGMMA, &A100, K_ERR_UNSUPPORTED, "wgmma off sm_90a"},
        {1, 64, 64, 64, K_W4A16_EPI_ACC, K_W4A16_KERNEL_FALLBACK, &H200, K_ERR_UNSUPPORTED, "fallback ACC"},
        {1, 64, 64, 64, K_W4A16_EPI_ACC, K_W4A16_KERNEL_DQ_GEMM, &H200, K_ERR_UNSUPPORTED, "dq_gemm ACC"},
        {1, 64, 96, 48, K_W4A16_EPI_Y, K_W4A16_KERNEL_SPLITK, &H200, K_ERR_UNSUPPORTED, "splitk G = 48"},
        {1, 64, 24, 8, K_W4A16_EPI_Y, K_W4A16_KERNEL_AUTO, &H200, K_ERR_SHAPE, "K % 16"},
        {1, 96, 32, 16, K_W4A16_EPI_Y, K_W4A16_KERNEL_AUTO, &H200, K_ERR_SHAPE, "N % 64"},
        {1, 64, 64, 24, K_W4A16_EPI_Y, K_W4A16_KERNEL_AUTO, &H200, K_ERR_SHAPE, "G % 16"},
        {1, 64, 96, 64, K_W4A16_EPI_Y, K_W4A16_KERNEL_AUTO, &H200, K_ERR_SHAPE, "K % G"},
        {0, 64, 64, 64, K_W4A16_EPI_Y, K_W4A16_KERNEL_AUTO, &H200, K_ERR_SHAPE, "M = 0"},
        {1, 64, 64, 0, K_W4A16_EPI_Y, K_W4A16_KERNEL_AUTO, &H200, K_ERR_SHAPE, "G = 0"},
        {1, 0, 64, 64, K_W4A16_EPI_Y, K_W4A16_KERNEL_AUTO, &H200, K_ERR_SHAPE, "N = 0"},
        {1, 1 << 20, 1 << 20, 64, K_W4A16_EPI_Y, K_W4A16_KERNEL_AUTO, &H200, K_ERR_SHAPE, "tile count"},
        {1, 64, 64, 64, 2, K_W4A16_KERNEL_AUTO, &H200, K_ERR_ARG, "unknown epilogue"},
        {1, 64, 64, 64, K_W4A16_EPI_Y, 5, &H200, K_ERR_ARG, "unknown kernel"},
        {1, 64, 64, 64, K_W4A16_EPI_Y, -1, &H200, K_ERR_ARG, "negative kernel"},
        {1, 64, 64, 64, K_W4A16_EPI_Y, K_W4A16_KERNEL_AUTO, NULL, K_ERR_ARG, "NULL caps"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        const int rc = k_w4a16_route_pick(&r, cases[i].M, cases[i].N, cases[i].K, cases[i].G,
                                          (enum k_w4a16_epilogue)cases[i].epi,
                                          (enum k_w4a16_kernel)cases[i].kernel, cases[i].caps);
        CHECK_MSG(rc == cases[i].want, "%s: got %d want %d", cases[i].why, rc, cases[i].want);
        if (rc == K_ERR_NONE) {
            CHECK_EQ_INT(r.kernel, cases[i].kernel);
            memset(&r, 0x5A, sizeof(r));
        } else {
            CHECK(memcmp(&r, &before, sizeof(r)) == 0); /* a refusal leaves *out untouched */
            CHECK(strlen(qs_log_last()) > 0);
        }
        qs_log_clear();
    }
    CHECK_EQ_INT(k_w4a16_route_pick(NULL, 1, 64, 64, 64, K_W4A16_EPI_Y, K_W4A16_KERNEL_AUTO, &H200),
                 K_ERR_ARG);
    qs_log_set_quiet(false);
    /* the availability probe logs nothing */
    qs_log_clear();
    CHECK_EQ_INT(k_w4a16_acc_available(65, 64, 64, 64, &H200), 0);
    CHECK_EQ_INT(k_w4a16_acc_available(0, 64, 64, 64, &H200), 0);
    CHECK_EQ_INT(k_w4a16_acc_available(16, 96, 64, 64, &H200), 0);
    CHECK_EQ_INT(k_w4a16_acc_available(16, 64, 64, 64, NULL), 0);
    CHECK_EQ_INT(k_w4a16_acc_available(64, 4096, 4096, 128, &H200), 1);
    CHECK_EQ_STR(qs_log_last(), "");
}

static void test_names(void)
{
    static const char *names[] = {"auto", "splitk", "wgmma", "dq_gemm", "fallback"};
    for (int k = 0; k < 5; ++k) {
        CHECK_EQ_STR(k_w4a16_kernel_name((enum k_w4a16_kernel)k), names[k]);
        CHECK_EQ_INT(k_w4a16_kernel_parse(names[k]), k);
    }
    CHECK(k_w4a16_kernel_name((enum k_w4a16_kernel)5) == NULL);
    CHECK(k_w4a16_kernel_name((enum k_w4a16_kernel)-1) == NULL);
    CHECK_EQ_INT(k_w4a16_kernel_parse("v5"), -1);
    CHECK_EQ_INT(k_w4a16_kernel_parse(""), -1);
    CHECK_EQ_INT(k_w4a16_kernel_parse(NULL), -1);
}

int main(void)
{
    T_INIT("route");
    test_bands();
    test_groups();
    test_plan();
    test_per_channel();
    test_buffers();
    test_forced();
    test_names();
    return t_done();
}
