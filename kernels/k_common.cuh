/*
 * k_common.cuh - device functions and checks shared by the qshard kernels (kernels/k_*.cu).
 *
 * One device function per PTX idiom, each with why it is used and a link to the PTX ISA /
 * CUDA guide section that defines it. Included only by .cu files (C++17, nvcc).
 */
#ifndef QS_K_COMMON_CUH
#define QS_K_COMMON_CUH

#include <cuda_fp16.h>    /* __half, __half2, __hsub2, __hfma2, __hmul2 */
#include <cuda_runtime.h> /* cudaGetLastError, cudaGetDevice */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels.h"  /* enum k_err */
#include "qs_log.h"   /* qs_log_error */

#ifndef K_DEBUG_SYNC
#define K_DEBUG_SYNC 0
#endif

/* --- checks ------------------------------------------------------------------------------- */

/* Abort with the failing expression, function, file:line and device. CUDA API failures are not
 * recoverable statuses in qshard (docs/DESIGN.md, "Errors"); only shape/argument problems return k_err. */
#define K_CUDA_CHECK(expr)                                                              \
    do {                                                                                \
        cudaError_t k_e_ = (expr);                                                      \
        if (k_e_ != cudaSuccess) {                                                      \
            int k_dev_ = -1;                                                            \
            cudaGetDevice(&k_dev_);                                                     \
            fprintf(stderr, "qshard: CUDA error: %s (%s) in %s at %s:%d on device %d\n", \
                    cudaGetErrorString(k_e_), #expr, __func__, __FILE__, __LINE__, k_dev_); \
            abort();                                                                    \
        }                                                                               \
    } while (0)

/* After every launch: the launch error, and with `make DEBUG_SYNC=1` the execution error. */
#define K_LAUNCH_CHECK()                                        \
    do {                                                        \
        K_CUDA_CHECK(cudaGetLastError());                       \
        if (K_DEBUG_SYNC) K_CUDA_CHECK(cudaDeviceSynchronize()); \
    } while (0)

/* Report a precondition failure once (qs_log_error names the launcher) and return the code. */
#define K_REFUSE(code, ...)                     \
    do {                                        \
        qs_log_error(__func__, __VA_ARGS__);    \
        return (code);                          \
    } while (0)

/* Per-device caches of device attributes and launch set-up (function attributes such as the
 * dynamic shared-memory limit are set per device: cudaFuncSetAttribute acts on the current one).
 * k_per_device returns cache[d] for the current device d, computing it with query(d) the first
 * time; 0 means "not yet", so only values >= 1 are kept, and devices past K_MAX_DEVICES compute
 * every time. Benign race: the same value is written. CUDA errors abort (K_CUDA_CHECK). */
#define K_MAX_DEVICES 64
static inline int k_current_device(void)
{
    int d = 0;
    K_CUDA_CHECK(cudaGetDevice(&d));
    return d;
}
template <class F> static inline int k_per_device(int (&cache)[K_MAX_DEVICES], F &&query)
{
    const int d = k_current_device();
    if (d < K_MAX_DEVICES && cache[d] > 0) return cache[d];
    const int v = query(d);
    if (d < K_MAX_DEVICES) cache[d] = v;
    return v;
}

/* Largest dynamic shared memory one block may opt in to on the current device, bytes
 * (cudaDevAttrMaxSharedMemoryPerBlockOptin: 227 KB on sm_90, 163 KB on sm_80, 99 KB on sm_86 /
 * sm_89); launchers size their tiles below it. CUDA errors abort (K_CUDA_CHECK). */
static inline int k_smem_optin(void)
{
    static int cache[K_MAX_DEVICES];
    return k_per_device(cache, [](int d) {
        int v = 0;
        K_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, d));
        return v > 0 ? v : 1;
    });
}

/* Named constants instead of literals. */
#define K_WARP 32
#define K_SM80 80 /* first arch with mma.sync m16n8k16 fp16->fp32, cp.async, ldmatrix */

/* --- fp16 helpers ----------------------------------------------------------------------- */

/* fp16 bits <-> __half without conversion (the C API passes uint16_t). */
__device__ __forceinline__ __half k_bits_to_half(uint16_t b) { return __ushort_as_half(b); }
__device__ __forceinline__ uint16_t k_half_to_bits(__half h) { return __half_as_ushort(h); }
__device__ __forceinline__ __half2 k_u32_as_half2(uint32_t u)
{
    return *reinterpret_cast<__half2 *>(&u);
}
__device__ __forceinline__ uint32_t k_half2_as_u32(__half2 h)
{
    return *reinterpret_cast<uint32_t *>(&h);
}

/* --- memory idioms ------------------------------------------------------------------------ */

/* 16-byte streaming load of read-only data that is used once (packed weights): .nc uses the
 * non-coherent read-only path, L1::no_allocate keeps it from evicting the activations from L1.
 * PTX ISA "ld": https://docs.nvidia.com/cuda/parallel-thread-execution/#data-movement-and-conversion-instructions-ld */
#define K_LD_STREAM_V4_PTX "ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
__device__ __forceinline__ uint4 k_ld_stream_v4(const void *p)
{
    uint4 r;
    asm volatile(K_LD_STREAM_V4_PTX : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}

/* k_ld_stream_v4 ordered after the instructions that compute `after`: the asm takes those 16
 * registers as (unused) inputs, a fake dependency that keeps the compiler from hoisting the
 * load above them. W4A16 v5 refills a weight register slot this way right after the dequant
 * that read it, so no register rotation has to wait on the load. */
__device__ __forceinline__ uint4 k_ld_stream_v4_after(const void *p, const uint32_t (&after)[4][4])
{
    uint4 r;
    asm volatile(K_LD_STREAM_V4_PTX
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p), "r"(after[0][0]), "r"(after[0][1]), "r"(after[0][2]), "r"(after[0][3]),
                   "r"(after[1][0]), "r"(after[1][1]), "r"(after[1][2]), "r"(after[1][3]),
                   "r"(after[2][0]), "r"(after[2][1]), "r"(after[2][2]), "r"(after[2][3]),
                   "r"(after[3][0]), "r"(after[3][1]), "r"(after[3][2]), "r"(after[3][3]));
    return r;
}

/* Asynchronous 16-byte global->shared copy that bypasses registers (.cg: L2 only), so a
 * multi-stage pipeline can keep several tiles in flight while the tensor cores work.
 * src_bytes < 16 zero-fills the rest (used for rows past M).
 * PTX ISA "cp.async": https://docs.nvidia.com/cuda/parallel-thread-execution/#data-movement-and-conversion-instructions-cp-async */
__device__ __forceinline__ void k_cp_async16(void *smem, const void *gmem, int src_bytes)
{
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
                 "r"(src_bytes));
}
__device__ __forceinline__ void k_cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void k_cp_async_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* Four 8x8 fp16 matrices from shared memory into the A-fragment registers of one m16n8k16 mma
 * (lane l gives the address of row l%16, column block l/16), avoiding per-element shared loads.
 * PTX ISA "ldmatrix": https://docs.nvidia.com/cuda/parallel-thread-execution/#warp-level-matrix-instructions-ldmatrix */
__device__ __forceinline__ void k_ldmatrix_x4(uint32_t r[4], const void *smem)
{
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

/* The same with .trans: each 8x8 matrix transposed on the way (lane l receives column l/4, rows
 * 2(l%4), 2(l%4)+1), which turns row-major [k][n] tiles in shared memory into the B fragments
 * of an mma (PTX ISA "ldmatrix", .trans). */
__device__ __forceinline__ void k_ldmatrix_x4_trans(uint32_t r[4], const void *smem)
{
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/* The inverse of k_ldmatrix_x4 (sm_90+): four 8x8 fp16 matrices from registers to shared
 * memory, lane l giving the address of row l%8 of matrix l/8 and holding row l/4, columns
 * 2(l%4), 2(l%4)+1 of each. PTX ISA "stmatrix":
 * https://docs.nvidia.com/cuda/parallel-thread-execution/#warp-level-matrix-instructions-stmatrix */
__device__ __forceinline__ void k_stmatrix_x4(void *smem, const uint32_t (&r)[4])
{
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(s),
                 "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}
#endif

/* --- split-K reductions in global memory ------------------------------------------------ */

/* p[0..3] += v through one vector reduction (sm_90: red.global.add.v4.f32, PTX ISA
 * "red"); four scalar atomics below sm_90. p: 16-byte aligned. */
static __device__ __forceinline__ void k_red_add_v4(float *p, float4 v)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(v.x), "f"(v.y),
                 "f"(v.z), "f"(v.w)
                 : "memory");
#else
    atomicAdd(p, v.x);
    atomicAdd(p + 1, v.y);
    atomicAdd(p + 2, v.z);
    atomicAdd(p + 3, v.w);
#endif
}

/* *p += v as one atomic with acquire-release semantics at GPU scope (sm_70+: atom.acq_rel.gpu,
 * PTX ISA "atom"); returns the old value. */
static __device__ __forceinline__ unsigned k_atom_add_acq_rel(unsigned *p, unsigned v)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    unsigned old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
#else
    __threadfence();
    const unsigned old = atomicAdd(p, v);
    __threadfence();
    return old;
#endif
}

/* --- Programmatic Dependent Launch (sm_90+) ---------------------------------------------------
 * A kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization may start while the
 * previous kernel in the stream is still running; k_pdl_wait() blocks until that kernel has
 * completed and its memory is visible, so everything before it must read only data no earlier
 * kernel writes (weights, scales, zeros). k_pdl_launch_dependents() lets the next such kernel
 * start early. Both are no-ops without the launch attribute and compile to nothing below sm_90.
 * PTX ISA "griddepcontrol": https://docs.nvidia.com/cuda/parallel-thread-execution/#parallel-synchronization-and-communication-instructions-griddepcontrol */
__device__ __forceinline__ void k_pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void k_pdl_launch_dependents(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/* --- tensor cores ----------------------------------------------------------------------- */

/* D = A . B + D for one m16n8k16 tile, fp16 inputs, fp32 accumulators: the sm80+ warp-level
 * tensor-core instruction (HMMA.16816.F32 in SASS); DESIGN 4.1 lays the weights out as its
 * B fragments. a: 4 regs (A row-major fragment), b: 2 regs (B column-major fragment), c: 4 fp32.
 * PTX ISA "mma.m16n8k16": https://docs.nvidia.com/cuda/parallel-thread-execution/#warp-level-matrix-fragment-mma-16816-float */
__device__ __forceinline__ void k_mma_16816(float c[4], const uint32_t a[4], uint32_t b0,
                                            uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* --- int4 dequantisation (DESIGN 4.1-4.3) --------------------------------------------------- */

/* d = (a & b) | c in one instruction (LOP3.LUT with the truth table 0xEA), so extracting two
 * nibbles and OR-ing in the fp16 exponent costs one ALU op.
 * PTX ISA "lop3": https://docs.nvidia.com/cuda/parallel-thread-execution/#logic-and-shift-instructions-lop3 */
__device__ __forceinline__ uint32_t k_lop3_and_or(uint32_t a, uint32_t b, uint32_t c)
{
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

/* Per-group dequant constants of one thread's 8 columns (sub-tiles j = 0..7):
 *   zl[j] = {1024 + z, 1024 + z}     subtracted from the fp16 1024 + q (low nibbles)
 *   zh[j] = {-(64 + z), -(64 + z)}   added after scaling 1024 + 16q by 1/16 (high nibbles)
 *   s[j]  = {s, s}
 * zword: the thread's qzeros word (DESIGN 4.3: nibble j = column j*8 + lane/4);
 * sc: its 8 fp16 scales (DESIGN 4.2: one 16-byte load at row position (lane/4)*8). */
struct k_w4_group {
    __half2 zl[8], zh[8], s[8];
};

__device__ __forceinline__ void k_w4_group_load(k_w4_group &g, uint32_t zword, uint4 sc)
{
    /* Integer construction of the fp16 constants (no int->float->half conversions on the
     * group boundary): 1024 + z is 0x6400 | z (mantissa step 1 in [1024, 2048)), and
     * -(64 + z) is 0xD400 + 16z (mantissa step 1/16 in [64, 128), sign bit set). */
    const uint32_t sw[4] = {sc.x, sc.y, sc.z, sc.w};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const uint32_t z = (zword >> (4 * j)) & 0xFu;
        const uint32_t zz = z | (z << 16);
        g.zl[j] = k_u32_as_half2(0x64006400u | zz);
        g.zh[j] = k_u32_as_half2(0xD400D400u + (zz << 4));
        const uint32_t s = sw[j / 2];
        g.s[j] = k_u32_as_half2((j % 2) ? __byte_perm(s, s, 0x3232) : __byte_perm(s, s, 0x1010));
    }
}

/*
 * Dequantise one packed word of a thread (DESIGN 4.1 word w: sub-tiles 2w and 2w+1) into the
 * four B-fragment registers {b0,b1} of sub-tile 2w and {b0,b1} of sub-tile 2w+1.
 *
 * Why this way (the FasterTransformer/Marlin trick, arithmetic our own): OR-ing a nibble into
 * the mantissa of fp16 1024.0 (0x6400) gives exactly 1024 + q without an int->float convert;
 * nibbles at bit 4 give 1024 + 16q. Subtracting 1024 + z (resp. scaling by 1/16 and adding
 * -(64 + z) in one fma) gives q - z exactly (small integers are exact in fp16); one multiply by
 * the scale then rounds once, so w = fp16((q - z) * s), the reference value rounded to fp16.
 * The nibble order of the layout puts rows k0, k0+1 (b0) in nibbles 0/4 and rows k0+8, k0+9
 * (b1) in nibbles 1/5, which are the halves of the B fragment (PTX ISA, "Matrix Fragments for
 * mma.m16n8k16 with floating point type", fragment b: row (lane%4)*2 + i (+8), col lane/4):
 * https://docs.nvidia.com/cuda/parallel-thread-execution/#mma-16816-float
 */
__device__ __forceinline__ void k_w4_dequant_word(uint32_t word, const k_w4_group &g, int w,
                                                  uint32_t b[4])
{
    const uint32_t EXP = 0x64006400u; /* fp16 {1024, 1024} */
    const __half2 SIXTEENTH = __float2half2_rn(0.0625f);
    const uint32_t hi = word >> 8;
    const int j0 = 2 * w, j1 = 2 * w + 1;
    __half2 v;
    v = __hsub2(k_u32_as_half2(k_lop3_and_or(word, 0x000F000Fu, EXP)), g.zl[j0]);
    b[0] = k_half2_as_u32(__hmul2(v, g.s[j0]));
    v = __hfma2(k_u32_as_half2(k_lop3_and_or(word, 0x00F000F0u, EXP)), SIXTEENTH, g.zh[j0]);
    b[1] = k_half2_as_u32(__hmul2(v, g.s[j0]));
    v = __hsub2(k_u32_as_half2(k_lop3_and_or(hi, 0x000F000Fu, EXP)), g.zl[j1]);
    b[2] = k_half2_as_u32(__hmul2(v, g.s[j1]));
    v = __hfma2(k_u32_as_half2(k_lop3_and_or(hi, 0x00F000F0u, EXP)), SIXTEENTH, g.zh[j1]);
    b[3] = k_half2_as_u32(__hmul2(v, g.s[j1]));
}

/* Same as k_w4a16_dequant_word without the scale: the exact small integers q - z in fp16
 * (the caller applies the group's scales to fp32 sums afterwards). */
__device__ __forceinline__ void k_w4_dequant_word_int(uint32_t word, const k_w4_group &g, int w,
                                                      uint32_t b[4])
{
    const uint32_t EXP = 0x64006400u; /* fp16 {1024, 1024} */
    const __half2 SIXTEENTH = __float2half2_rn(0.0625f);
    const uint32_t hi = word >> 8;
    const int j0 = 2 * w, j1 = 2 * w + 1;
    b[0] = k_half2_as_u32(__hsub2(k_u32_as_half2(k_lop3_and_or(word, 0x000F000Fu, EXP)), g.zl[j0]));
    b[1] = k_half2_as_u32(__hfma2(k_u32_as_half2(k_lop3_and_or(word, 0x00F000F0u, EXP)), SIXTEENTH, g.zh[j0]));
    b[2] = k_half2_as_u32(__hsub2(k_u32_as_half2(k_lop3_and_or(hi, 0x000F000Fu, EXP)), g.zl[j1]));
    b[3] = k_half2_as_u32(__hfma2(k_u32_as_half2(k_lop3_and_or(hi, 0x00F000F0u, EXP)), SIXTEENTH, g.zh[j1]));
}

/* Plain scalar form of the layout (DESIGN 4.1) for naive kernels: code q[k][n] of a packed
 * [K, N] qweight. Mirrors ref_w4_locate. */
__device__ __forceinline__ int k_w4_code(const uint8_t *qweight, int K, int k, int n)
{
    const int kt = k / 16, nt = n / 64, kk = k % 16, nn = n % 64;
    const int j = nn / 8, t = (nn % 8) * 4 + (kk % 8) / 2;
    const int w = j / 2, a = (j % 2) * 2 + (kk / 8), b = kk % 2;
    const int i = b * 4 + a;
    const size_t off = ((size_t)nt * (K / 16) + kt) * 512 + (size_t)t * 16 + (size_t)w * 4;
    const uint32_t word = *reinterpret_cast<const uint32_t *>(qweight + off);
    return (int)((word >> (4 * i)) & 0xF);
}

/* Zero z[g][n] and scale s[g][n] from the packed DESIGN 4.2/4.3 layouts (n_groups = K/G). */
__device__ __forceinline__ int k_w4_zero(const uint8_t *qzeros, int n_groups, int g, int n)
{
    const int nt = n / 64, nn = n % 64, j = nn / 8, c = nn % 8;
    const uint32_t word = reinterpret_cast<const uint32_t *>(qzeros)[((size_t)nt * n_groups + g) * 8 + c];
    return (int)((word >> (4 * j)) & 0xF);
}
__device__ __forceinline__ float k_w4_scale(const uint16_t *scales, int n_groups, int g, int n)
{
    const int nt = n / 64, nn = n % 64, j = nn / 8, c = nn % 8;
    return __half2float(k_bits_to_half(scales[((size_t)nt * n_groups + g) * 64 + c * 8 + j]));
}

/* --- paged KV cache ------------------------------------------------------------------------ */

/* Element offset of (slot, kv head h) in a pool [n_blocks][n_kv_heads][block_size][hd]: the
 * device twin of ref_kv_offset (kernels/ref.h, "paged KV cache"); slot >= 0. The contiguous
 * cache [n_kv_heads][T_cap][hd] is the pool of one block, block_size = T_cap. */
__device__ __forceinline__ size_t k_kv_offset(int slot, int h, int n_kv_heads, int block_size,
                                              int hd)
{
    const int b = slot / block_size, r = slot - b * block_size;
    return (((size_t)b * n_kv_heads + h) * block_size + r) * hd;
}

/* Number of multiprocessors of the current device (cached per device; at most 64 devices). */
int k_device_sm_count(void);

/* Whether to launch with Programmatic Dependent Launch now: k_get_pdl() and the current device
 * is sm_90+ (cached per device). */
bool k_pdl_usable(void);

/* Launch kern<<<grid, block, smem, stream>>>(args...) through cudaLaunchKernelEx, with the
 * programmatic stream serialization attribute when pdl is true (the kernel must call
 * k_pdl_wait() before touching anything an earlier kernel writes). */
template <typename... KArgs, typename... Args>
static void k_launch_ex(void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem,
                        cudaStream_t stream, bool pdl, Args... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    K_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kern, static_cast<KArgs>(args)...));
}

#endif /* QS_K_COMMON_CUH */
