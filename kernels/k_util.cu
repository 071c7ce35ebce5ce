/*
 * k_util.cu - small host helpers shared by the kernel launchers: k_err_str(), the cached
 * multiprocessor count, the Programmatic Dependent Launch and launch-trace switches. No kernels
 * here.
 */
#include "k_common.cuh" /* K_CUDA_CHECK, kernels.h */

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

/* Attribute attr of the current device, cached per device in cache (k_per_device). */
static int device_attr(int (&cache)[K_MAX_DEVICES], cudaDeviceAttr attr)
{
    return k_per_device(cache, [attr](int dev) {
        int v = 0;
        K_CUDA_CHECK(cudaDeviceGetAttribute(&v, attr, dev));
        return v;
    });
}

int k_device_sm_count(void)
{
    static int cache[K_MAX_DEVICES];
    return device_attr(cache, cudaDevAttrMultiProcessorCount);
}

/* Process-wide switches (kernels.h): set by the caller (the runtime from its options, the
 * benchmark from its flags), never from the environment. */
static int g_pdl = 1;   /* k_set_pdl */
static int g_trace = 0; /* k_set_trace */

void k_set_pdl(int on) { g_pdl = on != 0; }
int k_get_pdl(void) { return g_pdl; }
void k_set_trace(int on) { g_trace = on != 0; }
int k_get_trace(void) { return g_trace; }

bool k_pdl_usable(void)
{
    static int cache[K_MAX_DEVICES]; /* compute capability major */
    if (!k_get_pdl()) return false;
    return device_attr(cache, cudaDevAttrComputeCapabilityMajor) >= 9;
}
