/*
 * gpu_test_w4a16.cu - the W4A16 linear by route (k_w4a16_route_pick + k_w4a16_launch): auto and
 * every kernel forced (splitk, wgmma, dq_gemm, fallback) against ref_w4a16_linear on fresh
 * random inputs, outputs poisoned with NaN beforehand, each run twice on one workspace that must
 * come back zeroed (harness: tests/gpu_t.cuh).
 * Areas:
 *   w4a16      odd-M shape sweep with canonical packing (M = 1..257, N = 64..576, K = 16..4096,
 *              G = 16..512); per-channel G = K (4096, 11008); an odd number of k-tiles; wgmma
 *              split-K with a partial last 64-k step; the real Llama-2-7B, Llama-3-8B,
 *              Llama-2-13B, 70B layer shapes after the TP split at tp 1/2/4/8; more than 48 KB
 *              of shared memory on every GPU; a PDL chain of routes; the launcher's refusals;
 *              dequant (bit-exact).
 *   w4a16_acc  the ACC epilogue (fp32 sums left for the consumer): on partial sums, finished
 *              by k_w4a16_acc_finish, on the sweep and the real shapes; a PDL chain of ACC
 *              linears with finish / rmsnorm consumers; and each consumer kernel fed by an ACC
 *              linear (k_rmsnorm_acc, k_silu_mul_acc, k_rope_acc, k_rope_kv_store) against the
 *              references run on ref_w4a16_linear's fp32 output.
 * The routing table itself is tested without a GPU: tests/test_route.c.
 *
 * Run: build/gpu_test_w4a16 [--quick] (tests/run_gpu_tests.sh; --quick = small subset for
 * compute-sanitizer). Seed: QS_TEST_SEED (default from the clock, printed).
 */
#include <cublas_v2.h> /* cublasCreate (the dq_gemm route) */

#include "gpu_t.cuh" /* rng, device buffers, compare, gpu_test_main */

static cublasHandle_t g_cublas;
static struct k_w4a16_caps g_caps; /* this GPU's (k_w4a16_caps_query) */

static const enum k_w4a16_kernel ALL[] = {K_W4A16_KERNEL_AUTO, K_W4A16_KERNEL_SPLITK,
                                          K_W4A16_KERNEL_WGMMA, K_W4A16_KERNEL_DQ_GEMM,
                                          K_W4A16_KERNEL_FALLBACK};
typedef std::vector<enum k_w4a16_kernel> kernels_t;

// --- problems ---------------------------------------------------------------------------------------

struct w4_case {
    std::vector<uint8_t> qweight, qzeros;
    std::vector<uint16_t> scales;
};

/* Canonical codes/zeros/scales packed with ref_pack_* (checks the packers' layout agreement),
 * or (big shapes) random packed bytes directly: every byte pattern is a valid packed tensor. */
static void make_w4(w4_case &c, int N, int K, int G, bool canonical)
{
    const int ng = K / G;
    std::vector<uint16_t> s((size_t)ng * N);
    for (auto &v : s) v = ref_f32_to_f16(rng_uniform(0.002f, 0.02f));
    if (canonical) {
        std::vector<uint8_t> q((size_t)K * N), z((size_t)ng * N);
        for (auto &v : q) v = (uint8_t)(rng_u64() % 16);
        for (auto &v : z) v = (uint8_t)(rng_u64() % 16);
        c.qweight.resize((size_t)K * N / 2);
        c.qzeros.resize((size_t)ng * N / 2);
        c.scales.resize((size_t)ng * N);
        CHECK_EQ_INT(ref_pack_w4(q.data(), K, N, c.qweight.data()), REF_ERR_NONE);
        CHECK_EQ_INT(ref_pack_zeros(z.data(), ng, N, c.qzeros.data()), REF_ERR_NONE);
        CHECK_EQ_INT(ref_pack_scales(s.data(), ng, N, c.scales.data()), REF_ERR_NONE);
    } else {
        rand_bytes(c.qweight, (size_t)K * N / 2);
        rand_bytes(c.qzeros, (size_t)ng * N / 2);
        c.scales = s;
    }
}

/* One random linear problem: packed weights (make_w4), x [M, K] in [-1, 1), bias [N] or none,
 * yref = ref_w4a16_linear of them, and their device copies (freed with it). */
struct w4_problem {
    int M, N, K, G;
    w4_case c;
    std::vector<uint16_t> xh;
    std::vector<float> xf, bias, yref;
    uint16_t *dx = nullptr, *ds = nullptr;
    uint8_t *dq = nullptr, *dz = nullptr;
    float *db = nullptr;
    w4_problem(int M_, int N_, int K_, int G_, bool canonical, bool bias_on)
        : M(M_), N(N_), K(K_), G(G_), yref((size_t)M_ * N_)
    {
        make_w4(c, N, K, G, canonical);
        rand_f16(xh, xf, (size_t)M * K, -1.0f, 1.0f);
        if (bias_on) {
            bias.resize(N);
            for (auto &b : bias) b = rng_uniform(-0.5f, 0.5f);
        }
        CHECK_EQ_INT(ref_w4a16_linear(xf.data(), c.qweight.data(), c.qzeros.data(),
                                      c.scales.data(), bias_on ? bias.data() : nullptr, M, K, N,
                                      G, yref.data(), g_pool),
                     REF_ERR_NONE);
        dx = dev_upload(xh), ds = dev_upload(c.scales);
        dq = dev_upload(c.qweight), dz = dev_upload(c.qzeros);
        db = bias_on ? dev_upload(bias) : nullptr;
    }
    ~w4_problem()
    {
        TCUDA(cudaFree(dx)); TCUDA(cudaFree(ds)); TCUDA(cudaFree(dq)); TCUDA(cudaFree(dz));
        TCUDA(cudaFree(db));
    }
    w4_problem(const w4_problem &) = delete;
    w4_problem &operator=(const w4_problem &) = delete;
    k_w4a16_weight weight() const { return {dq, dz, ds, db}; }
};

/* Device buffers a route asked for: a zeroed workspace and a scratch. */
struct w4_bufs {
    k_w4a16_bufs b = {};
    explicit w4_bufs(const k_w4a16_route &r)
    {
        b.workspace_bytes = r.workspace_bytes;
        b.scratch_bytes = r.scratch_bytes;
        if (b.workspace_bytes) {
            TCUDA(cudaMalloc(&b.workspace, b.workspace_bytes));
            TCUDA(cudaMemset(b.workspace, 0, b.workspace_bytes));
        }
        if (b.scratch_bytes) TCUDA(cudaMalloc(&b.scratch, b.scratch_bytes));
        b.cublas = g_cublas;
    }
    ~w4_bufs()
    {
        TCUDA(cudaFree(b.workspace));
        TCUDA(cudaFree(b.scratch));
    }
    w4_bufs(const w4_bufs &) = delete;
    w4_bufs &operator=(const w4_bufs &) = delete;
};

/* The route of (kernel, epilogue) for pb on this GPU; false (nothing reported) where the router
 * refuses a forced kernel here (the refusals themselves: tests/test_route.c). Auto must always
 * give a route for the fp16 epilogue. */
static bool route_for(const w4_problem &pb, enum k_w4a16_kernel k, enum k_w4a16_epilogue epi,
                      k_w4a16_route *r)
{
    qs_log_set_quiet(true);
    const int rc = k_w4a16_route_pick(r, pb.M, pb.N, pb.K, pb.G, epi, k, &g_caps);
    qs_log_set_quiet(false);
    if (k == K_W4A16_KERNEL_AUTO && epi == K_W4A16_EPI_Y)
        CHECK_MSG(rc == K_ERR_NONE, "auto route M=%d N=%d K=%d G=%d refused (%d)", pb.M, pb.N,
                  pb.K, pb.G, rc);
    return rc == K_ERR_NONE;
}

// --- w4a16: the fp16 epilogue -----------------------------------------------------------------------

/* Every listed kernel on one problem vs ref_w4a16_linear, each run twice on one workspace (the
 * second run proves it came back zeroed; then it is checked to be all zero). */
static void test_w4a16_shape(const char *label, int M, int N, int K, int G, bool canonical,
                             bool bias_on, const kernels_t &kernels)
{
    w4_problem pb(M, N, K, G, canonical, bias_on);
    uint16_t *dy = dev_poisoned<uint16_t>((size_t)M * N);
    const k_w4a16_weight w = pb.weight();
    for (enum k_w4a16_kernel k : kernels) {
        k_w4a16_route r;
        if (!route_for(pb, k, K_W4A16_EPI_Y, &r)) continue;
        w4_bufs bufs(r);
        char what[200];
        for (int run = 0; run < 2; ++run) {
            TCUDA(cudaMemset(dy, 0xFF, (size_t)M * N * 2));
            CHECK_EQ_INT(k_w4a16_launch(&r, pb.dx, &w, dy, nullptr, &bufs.b, nullptr), K_ERR_NONE);
            const std::vector<float> y = f16_to_f32(dev_download(dy, (size_t)M * N));
            snprintf(what, sizeof what, "w4a16 %s (%s) %s M=%d N=%d K=%d G=%d%s run %d",
                     k_w4a16_kernel_name(k), k_w4a16_kernel_name(r.kernel), label, M, N, K, G,
                     bias_on ? " bias" : "", run + 1);
            compare(what, y.data(), pb.yref.data(), y.size(), 4e-3, 4e-3, 2e-3);
        }
        if (bufs.b.workspace) {
            const size_t nz = dev_nonzero(static_cast<const float *>(bufs.b.workspace),
                                          bufs.b.workspace_bytes / sizeof(float));
            CHECK_MSG(nz == 0, "%s: %zu workspace words left non-zero", what, nz);
        }
    }
    TCUDA(cudaFree(dy));
}

/* k_w4a16_dequant vs ref_dequant_w4 rounded to fp16: bit-exact ((q - z) is exact, one rounding). */
static void test_dequant(int N, int K, int G)
{
    w4_case c;
    make_w4(c, N, K, G, true);
    std::vector<float> wref((size_t)K * N);
    CHECK_EQ_INT(ref_dequant_w4(c.qweight.data(), c.qzeros.data(), c.scales.data(), K, N, G,
                                wref.data()), REF_ERR_NONE);
    uint8_t *dq = dev_upload(c.qweight), *dz = dev_upload(c.qzeros);
    uint16_t *ds = dev_upload(c.scales), *dw = dev_poisoned<uint16_t>((size_t)K * N);
    CHECK_EQ_INT(k_w4a16_dequant(dq, dz, ds, dw, N, K, G, nullptr), K_ERR_NONE);
    const std::vector<uint16_t> w = dev_download(dw, (size_t)K * N);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < w.size(); ++i)
        if (w[i] != ref_f32_to_f16(wref[i]) && bad++ == 0) first = i;
    CHECK_MSG(bad == 0, "dequant N=%d K=%d G=%d: %zu of %zu differ, first [%zu] got 0x%04x want 0x%04x",
              N, K, G, bad, w.size(), first, bad ? w[first] : 0,
              bad ? ref_f32_to_f16(wref[first]) : 0);
    TCUDA(cudaFree(dq)); TCUDA(cudaFree(dz)); TCUDA(cudaFree(ds)); TCUDA(cudaFree(dw));
}

/* What the launcher refuses before anything runs (the router's refusals: test_route.c). */
static void test_w4a16_rejects(void)
{
    qs_log_set_quiet(true);
    uint16_t *d16 = dev_poisoned<uint16_t>(1 << 16);
    uint8_t *d8 = reinterpret_cast<uint8_t *>(d16);
    float *f = reinterpret_cast<float *>(d16);
    const k_w4a16_weight w = {d8, d8, d16, nullptr}, w_null = {nullptr, d8, d16, nullptr};
    k_w4a16_route r;
    CHECK_EQ_INT(k_w4a16_route_pick(&r, 16, 128, 64, 64, K_W4A16_EPI_Y, K_W4A16_KERNEL_SPLITK, &g_caps), K_ERR_NONE);
    w4_bufs bufs(r);
    k_w4a16_bufs b = bufs.b;
    CHECK_EQ_INT(k_w4a16_launch(nullptr, d16, &w, d16, nullptr, &b, nullptr), K_ERR_ARG);
    CHECK_EQ_INT(k_w4a16_launch(&r, nullptr, &w, d16, nullptr, &b, nullptr), K_ERR_ARG);
    CHECK_EQ_INT(k_w4a16_launch(&r, d16, &w_null, d16, nullptr, &b, nullptr), K_ERR_ARG);
    CHECK_EQ_INT(k_w4a16_launch(&r, d16, &w, nullptr, nullptr, &b, nullptr), K_ERR_ARG);
    CHECK_EQ_INT(k_w4a16_launch(&r, d16, &w, d16, nullptr, nullptr, nullptr), K_ERR_ARG);
    b.workspace_bytes = 16;
    CHECK_EQ_INT(k_w4a16_launch(&r, d16, &w, d16, nullptr, &b, nullptr), K_ERR_WORKSPACE);
    b = bufs.b;
    b.workspace = nullptr;
    CHECK_EQ_INT(k_w4a16_launch(&r, d16, &w, d16, nullptr, &b, nullptr), K_ERR_WORKSPACE);
    /* a workspace off 16-byte alignment (vector reductions): refused, not a fault */
    b = bufs.b;
    b.workspace = static_cast<char *>(b.workspace) + 4;
    b.workspace_bytes -= 4;
    r.workspace_bytes -= 256; /* (the route asks a little less, so the size check passes) */
    CHECK_EQ_INT(k_w4a16_launch(&r, d16, &w, d16, nullptr, &b, nullptr), K_ERR_ARG);
    r.workspace_bytes += 256;
    /* y off 8-byte alignment: refused before anything runs (the workspace stays zero) */
    CHECK_EQ_INT(k_w4a16_launch(&r, d16, &w, d16 + 1, nullptr, &bufs.b, nullptr), K_ERR_ARG);
    TCUDA(cudaDeviceSynchronize());
    CHECK(dev_nonzero(static_cast<const float *>(bufs.b.workspace), bufs.b.workspace_bytes / 4) == 0);
    /* a route not made by the router for this device (its plan edited) */
    k_w4a16_route forged = r;
    forged.splitk.kc_max += forged.splitk.unit;
    CHECK_EQ_INT(k_w4a16_launch(&forged, d16, &w, d16, nullptr, &bufs.b, nullptr), K_ERR_ARG);
    forged = r;
    forged.splitk.smem_max = g_caps.smem_optin + 1024;
    CHECK_EQ_INT(k_w4a16_launch(&forged, d16, &w, d16, nullptr, &bufs.b, nullptr), K_ERR_ARG);
    forged = r;
    forged.kernel = (enum k_w4a16_kernel)9;
    CHECK_EQ_INT(k_w4a16_launch(&forged, d16, &w, d16, nullptr, &bufs.b, nullptr), K_ERR_ARG);
    forged.kernel = K_W4A16_KERNEL_AUTO;
    CHECK_EQ_INT(k_w4a16_launch(&forged, d16, &w, d16, nullptr, &bufs.b, nullptr), K_ERR_ARG);
    forged = r;
    forged.K = 24; /* not a W4A16 shape */
    CHECK_EQ_INT(k_w4a16_launch(&forged, d16, &w, d16, nullptr, &bufs.b, nullptr), K_ERR_SHAPE);
    /* ACC: acc NULL or off 16-byte alignment; the fp32 epilogue asked of a kernel without it */
    CHECK_EQ_INT(k_w4a16_route_pick(&r, 1, 64, 64, 64, K_W4A16_EPI_ACC, K_W4A16_KERNEL_AUTO, &g_caps), K_ERR_NONE);
    CHECK_EQ_INT(k_w4a16_launch(&r, d16, &w, nullptr, nullptr, &bufs.b, nullptr), K_ERR_ARG);
    CHECK_EQ_INT(k_w4a16_launch(&r, d16, &w, nullptr, f + 1, &bufs.b, nullptr), K_ERR_ARG);
    CHECK_EQ_INT(k_w4a16_route_pick(&r, 1, 64, 64, 64, K_W4A16_EPI_Y, K_W4A16_KERNEL_FALLBACK, &g_caps), K_ERR_NONE);
    r.epilogue = K_W4A16_EPI_ACC;
    CHECK_EQ_INT(k_w4a16_launch(&r, d16, &w, nullptr, f, &bufs.b, nullptr), K_ERR_ARG);
    /* dq_gemm: scratch too small, no cuBLAS handle */
    CHECK_EQ_INT(k_w4a16_route_pick(&r, 4, 128, 64, 64, K_W4A16_EPI_Y, K_W4A16_KERNEL_DQ_GEMM, &g_caps), K_ERR_NONE);
    b = bufs.b;
    b.scratch = d16;
    b.scratch_bytes = 100;
    CHECK_EQ_INT(k_w4a16_launch(&r, d16, &w, d16, nullptr, &b, nullptr), K_ERR_WORKSPACE);
    b.scratch_bytes = r.scratch_bytes;
    b.cublas = nullptr;
    CHECK_EQ_INT(k_w4a16_launch(&r, d16, &w, d16, nullptr, &b, nullptr), K_ERR_ARG);
    /* wgmma where this GPU has none: the route can only be forged */
    if (!g_caps.wgmma) {
        struct k_w4a16_caps fake = g_caps;
        fake.wgmma = 1;
        CHECK_EQ_INT(k_w4a16_route_pick(&r, 100, 128, 64, 64, K_W4A16_EPI_Y, K_W4A16_KERNEL_WGMMA, &fake), K_ERR_NONE);
        w4_bufs wb(r);
        CHECK_EQ_INT(k_w4a16_launch(&r, d16, &w, d16, nullptr, &wb.b, nullptr), K_ERR_UNSUPPORTED);
    }
    CHECK_EQ_INT(k_w4a16_dequant(d8, d8, d16, d16, 96, 64, 64, nullptr), K_ERR_SHAPE);
    CHECK_EQ_INT(k_w4a16_dequant(nullptr, d8, d16, d16, 64, 64, 64, nullptr), K_ERR_ARG);
    CHECK_EQ_INT(k_w4a16_acc_finish(d16, f, 1, 66, nullptr), K_ERR_SHAPE);
    CHECK_EQ_INT(k_w4a16_acc_finish(d16, f + 2, 1, 64, nullptr), K_ERR_ARG);
    CHECK_EQ_INT(k_w4a16_caps_query(nullptr), K_ERR_ARG);
    CHECK(strlen(qs_log_last()) > 0);
    qs_log_set_quiet(false);
    TCUDA(cudaDeviceSynchronize());
    TCUDA(cudaFree(d16));
}

/* Real per-rank layer shapes (DESIGN 5 TP rules, G = 128). */
struct model_dims { const char *name; int H, I, heads, kv, hd; };
static const model_dims MODELS[] = {
    {"llama2-7b", 4096, 11008, 32, 32, 128},
    {"llama3-8b", 4096, 14336, 32, 8, 128},
    {"llama2-13b", 5120, 13824, 40, 40, 128},
    {"llama2-70b", 8192, 28672, 64, 8, 128},
};
struct layer_shape { const char *name; int K, N; };
static int tp_shapes(const model_dims &md, int tp, int G, layer_shape out[4])
{
    if (md.heads % tp) return 0;
    const int nq = md.heads / tp;
    int nkv;
    if (tp <= md.kv) { if (md.kv % tp) return 0; nkv = md.kv / tp; }
    else { if (tp % md.kv) return 0; nkv = 1; }
    int a = G, b = 64;
    while (b) { const int t = a % b; a = b; b = t; }
    const int U = G / a * 64; /* lcm(G, 64) */
    const long up = (long)U * tp;
    const int I_r = (int)((md.I + up - 1) / up * up / tp);
    out[0] = {"qkv", md.H, (nq + 2 * nkv) * md.hd};
    out[1] = {"o", nq * md.hd, md.H};
    out[2] = {"gate_up", md.H, 2 * I_r};
    out[3] = {"down", I_r, md.H};
    return 4;
}

/* The packed tensors of L linears on the device, freed with it (the PDL chains). */
struct dev_linears {
    std::vector<k_w4a16_weight> w;
    dev_linears(const w4_case *c, int L)
    {
        for (int l = 0; l < L; ++l)
            w.push_back({dev_upload(c[l].qweight), dev_upload(c[l].qzeros),
                         dev_upload(c[l].scales), nullptr});
    }
    ~dev_linears()
    {
        for (auto &x : w) {
            TCUDA(cudaFree(const_cast<uint8_t *>(x.qweight)));
            TCUDA(cudaFree(const_cast<uint8_t *>(x.qzeros)));
            TCUDA(cudaFree(const_cast<uint16_t *>(x.scales)));
        }
    }
    dev_linears(const dev_linears &) = delete;
    dev_linears &operator=(const dev_linears &) = delete;
};

/*
 * Programmatic Dependent Launch: the split-K route starts loading weights before the previous
 * kernel in the stream has finished, and must wait for it before reading its output. A chain
 * of square linears on one stream, each reading the previous one's y, auto / splitk / fallback
 * taking turns on one workspace, launched back to back without host synchronisation, vs the C
 * reference run in sequence on the fp16-rounded intermediate results.
 */
static void test_w4a16_pdl_chain(void)
{
    const int N = 2048, K = 2048, G = 128, L = 4;
    const enum k_w4a16_kernel turn[3] = {K_W4A16_KERNEL_AUTO, K_W4A16_KERNEL_SPLITK,
                                         K_W4A16_KERNEL_FALLBACK};
    for (int M : {1, 5, 16, 33, 64}) {
        w4_case c[L];
        for (auto &cc : c) make_w4(cc, N, K, G, true);
        std::vector<uint16_t> xh;
        std::vector<float> xf;
        rand_f16(xh, xf, (size_t)M * K, -1.0f, 1.0f);
        cudaStream_t st;
        TCUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        k_w4a16_route r[L];
        for (int l = 0; l < L; ++l)
            CHECK_EQ_INT(k_w4a16_route_pick(&r[l], M, N, K, G, K_W4A16_EPI_Y, turn[l % 3], &g_caps), K_ERR_NONE);
        w4_bufs bufs(r[0]); /* every route here asks k_w4a16_workspace_bytes(M, N) */
        uint16_t *act[L + 1];
        act[0] = dev_upload(xh);
        for (int l = 1; l <= L; ++l) act[l] = dev_poisoned<uint16_t>((size_t)M * N);
        const dev_linears lin(c, L);
        TCUDA(cudaDeviceSynchronize());
        for (int l = 0; l < L; ++l)
            CHECK_EQ_INT(k_w4a16_launch(&r[l], act[l], &lin.w[l], act[l + 1], nullptr, &bufs.b, st), K_ERR_NONE);
        TCUDA(cudaStreamSynchronize(st));
        std::vector<float> in = xf, yref((size_t)M * N);
        for (int l = 0; l < L; ++l) {
            CHECK_EQ_INT(ref_w4a16_linear(in.data(), c[l].qweight.data(), c[l].qzeros.data(),
                                          c[l].scales.data(), nullptr, M, K, N, G, yref.data(),
                                          g_pool), REF_ERR_NONE);
            const std::vector<float> y = f16_to_f32(dev_download(act[l + 1], (size_t)M * N));
            char what[96];
            snprintf(what, sizeof what, "w4a16 PDL chain M=%d layer %d of %d (%s)", M, l + 1, L,
                     k_w4a16_kernel_name(turn[l % 3]));
            compare(what, y.data(), yref.data(), y.size(), 4e-3, 4e-3, 2e-3);
            in = y; /* the next layer reads what the GPU produced, as the chain did */
        }
        for (auto p : act) TCUDA(cudaFree(p));
        TCUDA(cudaStreamDestroy(st));
    }
}

static void test_w4a16(bool quick)
{
    test_w4a16_rejects();
    const kernels_t all(ALL, ALL + 5);
    test_w4a16_pdl_chain();
    /* odd M and small shapes: canonical packing, every kernel; group sizes 16..512 (v5 unrolls
     * by 8 k-tiles: G/16 = 1, 2, 4 divide it, 8, 16, 32 are multiples, 3 (G = 48) goes to the
     * fallback) */
    struct { int N, K, G; } small[] = {{64, 16, 16}, {128, 128, 128}, {192, 256, 64},
                                      {320, 384, 32}, {576, 1024, 128}, {256, 4096, 128},
                                      {128, 1536, 256}, {64, 2048, 512}};
    const int Ms[] = {1, 2, 3, 7, 16, 17, 33, 64, 65, 127, 255, 257};
    for (auto &s : small)
        for (int M : Ms) {
            if (quick && (M > 33 || s.K > 384)) continue;
            test_w4a16_shape("sweep", M, s.N, s.K, s.G, true, (M % 2) == 1, all);
        }
    /* per-channel quantisation (G = K): the split-K slice of whole groups does not fit in shared
     * memory for the larger K and M, so auto takes the fallback there; both must be right */
    for (int K : {4096, 11008})
        for (int M : {1, 12, 24, 41, 64}) {
            if (quick && (K > 4096 || M > 24)) continue;
            test_w4a16_shape("per-channel", M, 128, K, K, true, (M % 2) == 1,
                             {K_W4A16_KERNEL_AUTO, K_W4A16_KERNEL_SPLITK, K_W4A16_KERNEL_FALLBACK});
        }
    /* a K that gives an odd number of k-tiles and a group larger than one pipeline stage */
    test_w4a16_shape("odd-kt", 129, 128, 48, 48, true, true, all);
    test_w4a16_shape("odd-kt", 33, 128, 48, 48, true, true, all);
    /* wgmma split-K whose last 64-k step is partial (K / 64 = 16.25), one and two row blocks */
    for (int M : {97, 200})
        test_w4a16_shape("partial-k-step", M, 128, 1040, 16, true, true, {K_W4A16_KERNEL_AUTO, K_W4A16_KERNEL_WGMMA});
    for (int g : {16, 32, 128}) test_dequant(192, 256, g);
    test_dequant(4096, 4096, 128);
    if (quick) return;
    /* real layer shapes after the TP split */
    for (const auto &md : MODELS)
        for (int tp : {1, 2, 4, 8}) {
            layer_shape ls[4];
            if (!tp_shapes(md, tp, 128, ls)) continue;
            for (auto &l : ls) {
                char label[64];
                snprintf(label, sizeof label, "%s tp%d %s", md.name, tp, l.name);
                test_w4a16_shape(label, 1, l.N, l.K, 128, false, false,
                                 {K_W4A16_KERNEL_AUTO, K_W4A16_KERNEL_FALLBACK});
                test_w4a16_shape(label, 3, l.N, l.K, 128, false, true,
                                 {K_W4A16_KERNEL_AUTO, K_W4A16_KERNEL_FALLBACK});
                if (tp >= 4) test_w4a16_shape(label, 16, l.N, l.K, 128, false, false, {K_W4A16_KERNEL_AUTO});
                if (tp == 2) /* 32 and 64 token rows (M > 16), on every real shape */
                    test_w4a16_shape(label, 41, l.N, l.K, 128, false, true,
                                     {K_W4A16_KERNEL_AUTO, K_W4A16_KERNEL_FALLBACK});
                if (tp == 2) /* wgmma: split-K (M <= 256) and three row blocks without it */
                    for (int M : {97, 300})
                        test_w4a16_shape(label, M, l.N, l.K, 128, false, M % 2 == 1, {K_W4A16_KERNEL_AUTO, K_W4A16_KERNEL_WGMMA});
                if (tp == 8)
                    test_w4a16_shape(label, 80, l.N, l.K, 128, false, false,
                                     {K_W4A16_KERNEL_AUTO, K_W4A16_KERNEL_DQ_GEMM, K_W4A16_KERNEL_WGMMA});
            }
        }
    /* Llama-3-8B gate_up at G = 16/32: the split-K slice of 64 k-tiles stages 40 KB of scales
     * and zeros, 64 KB of dynamic shared memory in all, past the 48 KB that needs the opt-in
     * attribute, which CUDA sets per device: on this GPU, and on a second one when there is
     * one (TP) */
    int n_dev = 0;
    TCUDA(cudaGetDeviceCount(&n_dev));
    for (int d = 0; d < (n_dev > 1 ? 2 : 1); ++d) {
        TCUDA(cudaSetDevice(d));
        char label[64];
        snprintf(label, sizeof label, "smem>48KB on GPU %d", d);
        test_w4a16_shape(label, 1, 28672, 4096, 16, false, false,
                         {K_W4A16_KERNEL_AUTO, K_W4A16_KERNEL_FALLBACK});
        test_w4a16_shape(label, 3, 28672, 4096, 32, false, true, {K_W4A16_KERNEL_AUTO});
        /* M > 32 at G = 16: 8 warps' scale rows shrink the slice to fit the block's 220 KB */
        test_w4a16_shape(label, 41, 28672, 4096, 16, false, true, {K_W4A16_KERNEL_SPLITK});
    }
    TCUDA(cudaSetDevice(0));
}

// --- w4a16_acc: the fp32-accumulator epilogue and its consumers --------------------------------------

/* Launch the ACC route of pb into acc (device [M, N] fp32) on stream st. */
static int launch_acc(const w4_problem &pb, float *acc, cudaStream_t st)
{
    k_w4a16_route r;
    if (!route_for(pb, K_W4A16_KERNEL_AUTO, K_W4A16_EPI_ACC, &r)) return K_ERR_UNSUPPORTED;
    const k_w4a16_weight w = pb.weight();
    const k_w4a16_bufs none = {};
    return k_w4a16_launch(&r, pb.dx, &w, nullptr, acc, &none, st);
}

/*
 * The ACC route on one shape: acc starts as fresh random partial sums P and must end as
 * P + x.W + bias (ref_w4a16_linear, fp32); then from zero, finished into fp16 by
 * k_w4a16_acc_finish (y poisoned first), which must leave acc all zero.
 */
static void test_w4a16_acc_shape(const char *label, int M, int N, int K, int G, bool canonical,
                                 bool bias_on)
{
    w4_problem pb(M, N, K, G, canonical, bias_on);
    std::vector<float> P((size_t)M * N);
    for (auto &v : P) v = rng_uniform(-1.0f, 1.0f);
    float *dacc = dev_upload(P);
    uint16_t *dy = dev_poisoned<uint16_t>((size_t)M * N);
    char what[200];
    CHECK(k_w4a16_acc_available(M, N, K, G, &g_caps) == 1);
    CHECK_EQ_INT(launch_acc(pb, dacc, nullptr), K_ERR_NONE);
    std::vector<float> got = dev_download(dacc, (size_t)M * N), want(P);
    for (size_t i = 0; i < want.size(); ++i) want[i] += pb.yref[i];
    snprintf(what, sizeof what, "w4a16 acc %s M=%d N=%d K=%d G=%d%s: acc = P + xW", label, M,
             N, K, G, bias_on ? " bias" : "");
    compare(what, got.data(), want.data(), got.size(), 4e-3, 4e-3, 2e-3);
    TCUDA(cudaMemset(dacc, 0, (size_t)M * N * sizeof(float)));
    CHECK_EQ_INT(launch_acc(pb, dacc, nullptr), K_ERR_NONE);
    CHECK_EQ_INT(k_w4a16_acc_finish(dy, dacc, M, N, nullptr), K_ERR_NONE);
    const std::vector<float> y = f16_to_f32(dev_download(dy, (size_t)M * N));
    snprintf(what, sizeof what, "w4a16 acc %s M=%d N=%d K=%d G=%d%s: finished y", label, M,
             N, K, G, bias_on ? " bias" : "");
    compare(what, y.data(), pb.yref.data(), y.size(), 4e-3, 4e-3, 2e-3);
    const size_t nz = dev_nonzero(dacc, (size_t)M * N);
    CHECK_MSG(nz == 0, "%s: %zu acc values not zeroed by acc_finish", what, nz);
    TCUDA(cudaFree(dacc)); TCUDA(cudaFree(dy));
}

/*
 * ACC linears and their consumers as the runtime chains them, on one stream under PDL with one
 * acc buffer and no host synchronisation: odd layers finish with k_w4a16_acc_finish, even ones
 * with k_rmsnorm_acc into an fp32 residual. Each consumer must have zeroed acc before the next
 * linear adds into it. Reference: ref_w4a16_linear, ref_rmsnorm in sequence on what the GPU
 * produced.
 */
static void test_w4a16_acc_chain(void)
{
    const int N = 2048, K = 2048, G = 128, L = 4;
    for (int M : {1, 5, 16}) {
        w4_case c[L];
        for (auto &cc : c) make_w4(cc, N, K, G, true);
        std::vector<uint16_t> xh;
        std::vector<float> xf, res((size_t)M * N), w(N);
        rand_f16(xh, xf, (size_t)M * K, -1.0f, 1.0f);
        for (auto &v : res) v = rng_uniform(-2.0f, 2.0f);
        for (auto &v : w) v = rng_uniform(0.5f, 1.5f);
        cudaStream_t st;
        TCUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        float *acc = nullptr, *dres = dev_upload(res), *dw = dev_upload(w);
        TCUDA(cudaMalloc(&acc, k_w4a16_workspace_bytes(M, N)));
        TCUDA(cudaMemset(acc, 0, k_w4a16_workspace_bytes(M, N)));
        uint16_t *act[L + 1];
        act[0] = dev_upload(xh);
        for (int l = 1; l <= L; ++l) act[l] = dev_poisoned<uint16_t>((size_t)M * N);
        const dev_linears lin(c, L);
        k_w4a16_route r;
        CHECK_EQ_INT(k_w4a16_route_pick(&r, M, N, K, G, K_W4A16_EPI_ACC, K_W4A16_KERNEL_AUTO, &g_caps), K_ERR_NONE);
        const k_w4a16_bufs none = {};
        TCUDA(cudaDeviceSynchronize());
        for (int l = 0; l < L; ++l) {
            CHECK_EQ_INT(k_w4a16_launch(&r, act[l], &lin.w[l], nullptr, acc, &none, st), K_ERR_NONE);
            if (l % 2 == 0)
                CHECK_EQ_INT(k_w4a16_acc_finish(act[l + 1], acc, M, N, st), K_ERR_NONE);
            else
                CHECK_EQ_INT(k_rmsnorm_acc(act[l + 1], dres, acc, dw, M, N, 1e-5f, st), K_ERR_NONE);
        }
        TCUDA(cudaStreamSynchronize(st));
        std::vector<float> in = xf, yref((size_t)M * N), out((size_t)M * N);
        for (int l = 0; l < L; ++l) {
            CHECK_EQ_INT(ref_w4a16_linear(in.data(), c[l].qweight.data(), c[l].qzeros.data(),
                                          c[l].scales.data(), nullptr, M, K, N, G, yref.data(),
                                          g_pool), REF_ERR_NONE);
            const std::vector<float> y = f16_to_f32(dev_download(act[l + 1], (size_t)M * N));
            const float *want = yref.data();
            if (l % 2) {
                ref_rmsnorm(out.data(), res.data(), yref.data(), w.data(), M, N, 1e-5f);
                want = out.data();
            }
            char what[96];
            snprintf(what, sizeof what, "w4a16 acc PDL chain M=%d layer %d of %d (%s)", M,
                     l + 1, L, l % 2 ? "rmsnorm_acc" : "acc_finish");
            compare(what, y.data(), want, y.size(), 4e-3, 4e-3, 2e-3);
            in = y;
        }
        const std::vector<float> r2 = dev_download(dres, (size_t)M * N);
        compare("w4a16 acc PDL chain residual", r2.data(), res.data(), r2.size(), 1e-3, 1e-3, 1e-3);
        const size_t nz = dev_nonzero(acc, (size_t)M * N);
        CHECK_MSG(nz == 0, "acc PDL chain M=%d: %zu acc values left non-zero", M, nz);
        for (auto p : act) TCUDA(cudaFree(p));
        TCUDA(cudaFree(acc)); TCUDA(cudaFree(dres)); TCUDA(cudaFree(dw));
        TCUDA(cudaStreamDestroy(st));
    }
}

/*
 * Each consumer kernel fed by an ACC linear, as the runtime's decode pairs them, against its
 * reference run on ref_w4a16_linear's fp32 output: o / down -> k_rmsnorm_acc (the residual adds
 * the unrounded sums), gate_up -> k_silu_mul_acc, qkv -> k_rope_acc and k_rope_kv_store (the
 * rotated k and the v heads into the KV cache). Every consumer must leave acc zero.
 */
static void test_w4a16_acc_consumers(bool quick)
{
    const int K = 1024, G = 128, H = 1024, I = 704, nq = 8, nkv = 2, hd = 128, T_cap = 64;
    const size_t qkv = (size_t)(nq + 2 * nkv) * hd;
    std::vector<float> inv(hd / 2);
    ref_rope_inv_freq(inv.data(), hd, 500000.0, nullptr);
    float *dinv = dev_upload(inv);
    for (int M : {1, 7, 16}) {
        if (quick && M > 7) continue;
        char what[96];
        { /* rmsnorm after o / down */
            w4_problem pb(M, H, K, G, true, true);
            std::vector<float> res((size_t)M * H), w(H), out((size_t)M * H);
            for (auto &v : res) v = rng_uniform(-2.0f, 2.0f);
            for (auto &v : w) v = rng_uniform(0.5f, 1.5f);
            float *acc = dev_poisoned<float>((size_t)M * H), *dres = dev_upload(res), *dw = dev_upload(w);
            TCUDA(cudaMemset(acc, 0, (size_t)M * H * 4));
            uint16_t *dout = dev_poisoned<uint16_t>((size_t)M * H);
            CHECK_EQ_INT(launch_acc(pb, acc, nullptr), K_ERR_NONE);
            CHECK_EQ_INT(k_rmsnorm_acc(dout, dres, acc, dw, M, H, 1e-5f, nullptr), K_ERR_NONE);
            ref_rmsnorm(out.data(), res.data(), pb.yref.data(), w.data(), M, H, 1e-5f);
            const std::vector<float> got = f16_to_f32(dev_download(dout, (size_t)M * H));
            const std::vector<float> r2 = dev_download(dres, (size_t)M * H);
            snprintf(what, sizeof what, "acc -> rmsnorm_acc M=%d", M);
            compare(what, got.data(), out.data(), got.size(), 4e-3, 4e-3, 2e-3);
            compare(what, r2.data(), res.data(), r2.size(), 1e-3, 1e-3, 1e-3);
            CHECK_MSG(dev_nonzero(acc, (size_t)M * H) == 0, "%s: acc not zeroed", what);
            TCUDA(cudaFree(acc)); TCUDA(cudaFree(dres)); TCUDA(cudaFree(dw)); TCUDA(cudaFree(dout));
        }
        { /* silu_mul after gate_up */
            w4_problem pb(M, 2 * I, K, G, true, false);
            std::vector<float> out((size_t)M * I);
            float *acc = dev_poisoned<float>((size_t)M * 2 * I);
            TCUDA(cudaMemset(acc, 0, (size_t)M * 2 * I * 4));
            uint16_t *dout = dev_poisoned<uint16_t>((size_t)M * I);
            CHECK_EQ_INT(launch_acc(pb, acc, nullptr), K_ERR_NONE);
            CHECK_EQ_INT(k_silu_mul_acc(dout, acc, M, I, nullptr), K_ERR_NONE);
            ref_silu_mul(out.data(), pb.yref.data(), M, I);
            const std::vector<float> got = f16_to_f32(dev_download(dout, (size_t)M * I));
            snprintf(what, sizeof what, "acc -> silu_mul_acc M=%d", M);
            compare(what, got.data(), out.data(), got.size(), 4e-3, 4e-3, 2e-3);
            CHECK_MSG(dev_nonzero(acc, (size_t)M * 2 * I) == 0, "%s: acc not zeroed", what);
            TCUDA(cudaFree(acc)); TCUDA(cudaFree(dout));
        }
        for (int kv = 0; kv < 2; ++kv) { /* rope (0) or rope + KV-cache store (1) after qkv */
            w4_problem pb(M, (int)qkv, K, G, true, true);
            std::vector<int32_t> perm(T_cap), pos(M);
            for (int t = 0; t < T_cap; ++t) perm[t] = t;
            for (int t = T_cap - 1; t > 0; --t) std::swap(perm[t], perm[rng_u64() % (t + 1)]);
            for (int m = 0; m < M; ++m) pos[m] = perm[m]; /* distinct positions */
            std::vector<uint16_t> kh, vh;
            std::vector<float> kf, vf;
            rand_f16(kh, kf, (size_t)nkv * T_cap * hd, -1.0f, 1.0f);
            rand_f16(vh, vf, (size_t)nkv * T_cap * hd, -1.0f, 1.0f);
            float *acc = dev_poisoned<float>(M * qkv);
            TCUDA(cudaMemset(acc, 0, M * qkv * 4));
            uint16_t *dx = dev_poisoned<uint16_t>(M * qkv), *dk = dev_upload(kh), *dv = dev_upload(vh);
            int32_t *dp = dev_upload(pos);
            CHECK_EQ_INT(launch_acc(pb, acc, nullptr), K_ERR_NONE);
            if (kv)
                CHECK_EQ_INT(k_rope_kv_store(dx, acc, M, nq, nkv, hd, qkv, dp, dinv, dk, dv, T_cap, nullptr), K_ERR_NONE);
            else
                CHECK_EQ_INT(k_rope_acc(dx, acc, M, nq + nkv, hd, qkv, dp, dinv, nullptr), K_ERR_NONE);
            std::vector<float> want = pb.yref; /* q and k heads rotated, v as it is */
            ref_rope(want.data(), M, nq + nkv, hd, qkv, pos.data(), inv.data());
            const std::vector<float> got = f16_to_f32(dev_download(dx, M * qkv));
            snprintf(what, sizeof what, "acc -> %s M=%d", kv ? "rope_kv_store" : "rope_acc", M);
            compare(what, got.data(), want.data(), got.size(), 4e-3, 4e-3, 2e-3);
            if (kv) {
                std::vector<float> wk = kf, wv = vf;
                kv_rows_expected(wk, wv, want, pos, M, nq, nkv, hd, qkv, T_cap);
                const std::vector<float> gk = f16_to_f32(dev_download(dk, kf.size()));
                const std::vector<float> gv = f16_to_f32(dev_download(dv, vf.size()));
                compare(what, gk.data(), wk.data(), gk.size(), 4e-3, 4e-3, 2e-3);
                compare(what, gv.data(), wv.data(), gv.size(), 4e-3, 4e-3, 2e-3);
            }
            CHECK_MSG(dev_nonzero(acc, M * qkv) == 0, "%s: acc not zeroed", what);
            TCUDA(cudaFree(acc)); TCUDA(cudaFree(dx)); TCUDA(cudaFree(dk)); TCUDA(cudaFree(dv));
            TCUDA(cudaFree(dp));
        }
    }
    TCUDA(cudaFree(dinv));
}

/* The ACC epilogue: the sweep's shapes at M <= 64, G it cannot take, the PDL chain, each
 * consumer, real shapes at M = 1 and 16. */
static void test_w4a16_acc(bool quick)
{
    struct { int N, K, G; } small[] = {{64, 16, 16}, {128, 128, 128}, {192, 256, 64},
                                      {320, 384, 32}, {576, 1024, 128}, {256, 4096, 128},
                                      {128, 1536, 256}, {64, 2048, 512}};
    for (auto &s : small)
        for (int M : {1, 2, 3, 7, 9, 16, 17, 33, 64}) {
            if (quick && (M > 16 || s.K > 384)) continue;
            test_w4a16_acc_shape("sweep", M, s.N, s.K, s.G, true, M % 2 == 1);
        }
    test_w4a16_acc_chain();
    test_w4a16_acc_consumers(quick);
    /* G = 48: no ACC route on any GPU (the runtime then asks for y and finishes nothing) */
    CHECK_EQ_INT(k_w4a16_acc_available(3, 128, 96, 48, &g_caps), 0);
    if (quick) return;
    for (const auto &md : MODELS)
        for (int tp : {1, 8}) {
            layer_shape ls[4];
            if (!tp_shapes(md, tp, 128, ls)) continue;
            for (auto &l : ls) {
                char label[64];
                snprintf(label, sizeof label, "%s tp%d %s", md.name, tp, l.name);
                test_w4a16_acc_shape(label, 1, l.N, l.K, 128, false, false);
                test_w4a16_acc_shape(label, 16, l.N, l.K, 128, false, true);
            }
        }
}

// --- main -----------------------------------------------------------------------------------------

int main(int argc, char **argv)
{
    if (k_w4a16_caps_query(&g_caps) != K_ERR_NONE) return 2;
    if (cublasCreate(&g_cublas) != CUBLAS_STATUS_SUCCESS) return 2;
    static const gpu_area areas[] = {{"w4a16", test_w4a16}, {"w4a16_acc", test_w4a16_acc}};
    const int rc = gpu_test_main(argc, argv, "gpu_test_w4a16",
                                 g_caps.wgmma ? ", wgmma route on" : ", wgmma route off (not tested)",
                                 areas, 2);
    cublasDestroy(g_cublas);
    return rc;
}
