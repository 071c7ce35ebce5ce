/*
 * k_cublas_load.cu - cuBLAS loaded on first use (dlopen) instead of linked into the program.
 *
 * Why: loading libcublas.so (and the libcublasLt.so it pulls in) costs ~150 MB of resident
 * memory at program start on x86-64 (relocated data pages: a program linked to -lcublas that does
 * nothing has VmRSS ~155 MB, 95 MB of it anonymous; measured on the dev box with CUDA 13.0).
 * Every qshard command paid it, and `qshard convert` has a peak-RSS bound of 512 MiB (issue 4)
 * that it then met by only 3 MB on the 16-core GPU host. Only the CUDA backend, the GPU tests
 * and the kernel benchmark call cuBLAS, so they alone load it now.
 *
 * The four functions qshard uses are defined here with cuBLAS's own names and signatures
 * (cublas_api.h; cublas_v2.h maps cublasCreate/Destroy/SetStream to the _v2 entry points) and
 * forward to the library's, resolved once with dlopen("libcublas.so.<CUBLAS_VER_MAJOR>") +
 * dlsym (found through the program's RUNPATH, $(CUDA_HOME)/lib64, like a linked library).
 * If the library or a symbol is missing, the error is reported once (qs_log_error) and every
 * call returns CUBLAS_STATUS_NOT_INITIALIZED, which the callers report as a cuBLAS failure.
 * Thread-safe (pthread_once).
 */
#include <cublas_v2.h> /* the declarations these definitions must match */
#include <dlfcn.h>     /* dlopen, dlsym */
#include <pthread.h>

#include "qs_log.h" /* qs_log_error */

#define K_CUBLAS_STR2(x) #x
#define K_CUBLAS_STR(x) K_CUBLAS_STR2(x)

namespace {

struct cublas_fns {
    cublasStatus_t (*create)(cublasHandle_t *);
    cublasStatus_t (*destroy)(cublasHandle_t);
    cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
    cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                              const void *, const void *, cudaDataType, int, const void *,
                              cudaDataType, int, const void *, void *, cudaDataType, int,
                              cublasComputeType_t, cublasGemmAlgo_t);
};

cublas_fns g_fns;
pthread_once_t g_once = PTHREAD_ONCE_INIT;

template <class F> bool resolve(void *lib, const char *name, F *out)
{
    void *p = dlsym(lib, name);
    *out = reinterpret_cast<F>(p);
    return p != nullptr;
}

void load_cublas(void)
{
    const char *soname = "libcublas.so." K_CUBLAS_STR(CUBLAS_VER_MAJOR);
    void *lib = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        qs_log_error("cuBLAS", "cannot load %s (%s); the CUDA backend needs the CUDA Toolkit's "
                     "cuBLAS (set LD_LIBRARY_PATH or install it)", soname, dlerror());
        return;
    }
    cublas_fns f;
    const char *missing = !resolve(lib, "cublasCreate_v2", &f.create) ? "cublasCreate_v2"
                        : !resolve(lib, "cublasDestroy_v2", &f.destroy) ? "cublasDestroy_v2"
                        : !resolve(lib, "cublasSetStream_v2", &f.set_stream) ? "cublasSetStream_v2"
                        : !resolve(lib, "cublasGemmEx", &f.gemm_ex) ? "cublasGemmEx" : nullptr;
    if (missing) {
        qs_log_error("cuBLAS", "%s has no symbol %s", soname, missing);
        return; /* lib stays loaded; g_fns stays empty */
    }
    g_fns = f;
}

const cublas_fns &fns(void)
{
    pthread_once(&g_once, load_cublas);
    return g_fns;
}

} // namespace

extern "C" {

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t *handle)
{
    return fns().create ? fns().create(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle)
{
    return fns().destroy ? fns().destroy(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream)
{
    return fns().set_stream ? fns().set_stream(handle, stream) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const void *alpha, const void *A, cudaDataType Atype,
                                         int lda, const void *B, cudaDataType Btype, int ldb,
                                         const void *beta, void *C, cudaDataType Ctype, int ldc,
                                         cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
    return fns().gemm_ex ? fns().gemm_ex(handle, transa, transb, m, n, k, alpha, A, Atype, lda, B,
                                         Btype, ldb, beta, C, Ctype, ldc, computeType, algo)
                         : CUBLAS_STATUS_NOT_INITIALIZED;
}

} // extern "C"
