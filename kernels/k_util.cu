/*
 * k_util.cu - small host helpers shared by the kernel launchers: k_err_str(), the cached
 * multiprocessor count, the Programmatic Dependent Launch switch. No kernels here.
 */
#include "k_common.cuh" /* K_CUDA_CHECK, kernels.h */

#include <string.h> /* strcmp */

const char *k_err_str(enum k_err e)
{
    switch (e) {
#define K_X_STR(name, val, msg) \
    case name:                  \
        return msg;
        K_ERR_LIST(K_X_STR)
#undef K_X_STR
    }
    return "unknown k_err";
}

int k_device_sm_count(void)
{
    enum { MAX_DEVICES = 64 };
    static int cache[MAX_DEVICES]; /* 0 = not queried yet; benign race: same value written */
    int dev = 0;
    K_CUDA_CHECK(cudaGetDevice(&dev));
    if (dev >= 0 && dev < MAX_DEVICES && cache[dev] > 0) return cache[dev];
    int n = 0;
    K_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    if (dev >= 0 && dev < MAX_DEVICES) cache[dev] = n;
    return n;
}

static int g_pdl = -1; /* k_set_pdl; -1: not set yet, QSHARD_PDL=0 in the environment turns it off */

void k_set_pdl(int on) { g_pdl = on != 0; }

int k_get_pdl(void)
{
    if (g_pdl < 0) {
        const char *e = getenv("QSHARD_PDL");
        g_pdl = !(e && strcmp(e, "0") == 0);
    }
    return g_pdl;
}

bool k_pdl_usable(void)
{
    enum { MAX_DEVICES = 64 };
    static int cache[MAX_DEVICES]; /* 0 = not queried, 1 = below sm_90, 2 = sm_90+ */
    if (!k_get_pdl()) return false;
    int dev = 0;
    K_CUDA_CHECK(cudaGetDevice(&dev));
    if (dev >= 0 && dev < MAX_DEVICES && cache[dev]) return cache[dev] == 2;
    int major = 0;
    K_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    const int v = major >= 9 ? 2 : 1;
    if (dev >= 0 && dev < MAX_DEVICES) cache[dev] = v;
    return v == 2;
}
