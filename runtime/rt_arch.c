/*
 * rt_arch.c - the registry of architecture descriptors (rt.h struct rt_arch): the config's
 * "architecture" string -> what the forward pass does. One line per descriptor; the
 * descriptors live in one file per family (rt_arch_llama.c, rt_arch_mixtral.c,
 * rt_arch_falcon.c, rt_arch_mpt.c, rt_arch_gemma.c).
 * Test: ./build/test_model (every fixture's architecture; an unknown name is refused).
 */
#include <stdio.h>
#include <string.h>

#include "rt.h"

extern const struct rt_arch rt_arch_llama, rt_arch_mistral, rt_arch_qwen2, rt_arch_qwen3,
    rt_arch_phi3;                                                   /* rt_arch_llama.c */
extern const struct rt_arch rt_arch_mixtral, rt_arch_qwen3_moe;          /* rt_arch_mixtral.c */
extern const struct rt_arch rt_arch_falcon;                               /* rt_arch_falcon.c */
extern const struct rt_arch rt_arch_mpt;                                  /* rt_arch_mpt.c */
extern const struct rt_arch rt_arch_gemma2, rt_arch_gemma3;               /* rt_arch_gemma.c */

static const struct rt_arch *const registry[] = {
    &rt_arch_llama,
    &rt_arch_mistral,
    &rt_arch_qwen2,
    &rt_arch_qwen3,
    &rt_arch_phi3,
    &rt_arch_mixtral,
    &rt_arch_qwen3_moe,
    &rt_arch_falcon,
    &rt_arch_mpt,
    &rt_arch_gemma2,
    &rt_arch_gemma3,
};

#define N_ARCH (sizeof(registry) / sizeof(registry[0]))

const struct rt_arch *rt_arch_find(const char *name)
{
    for (size_t i = 0; name && i < N_ARCH; i++)
        if (strcmp(registry[i]->name, name) == 0)
            return registry[i];
    return NULL;
}

const char *rt_arch_names(void)
{
    static char names[256];
    if (!names[0]) { /* the registry is constant: the first call's result is every call's */
        size_t n = 0;
        for (size_t i = 0; i < N_ARCH && n + 32 < sizeof(names); i++)
            n += (size_t)snprintf(names + n, sizeof(names) - n, "%s%s", i ? ", " : "",
                                  registry[i]->name);
    }
    return names;
}
