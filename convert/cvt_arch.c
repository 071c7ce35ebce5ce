/*
 * cvt_arch.c - the registry of the converter's architecture descriptors (convert/cvt_arch.h) and
 * its lookups. A new family is one file in convert/arch/ defining `const struct cvt_arch
 * cvt_arch_<family>` and one X(cvt_arch_<family>) line below (docs/CONVERT.md section 4).
 * Test: ./build/test_cvt_plan (registry round trips), ./build/test_cvt_src (config lookups).
 */
#include "cvt_arch.h"

#include <stdio.h>
#include <string.h>

/* Every descriptor, in the order "supported: ..." messages list them. */
#define CVT_ARCH_REGISTRY(X) \
    X(cvt_arch_llama)        \
    X(cvt_arch_mistral)      \
    X(cvt_arch_qwen2)        \
    X(cvt_arch_qwen3)        \
    X(cvt_arch_phi3)         \
    X(cvt_arch_mixtral)      \
    X(cvt_arch_qwen3_moe)    \
    X(cvt_arch_falcon)       \
    X(cvt_arch_falcon_rw)    \
    X(cvt_arch_mpt)          \
    X(cvt_arch_mpt_remote)   \
    X(cvt_arch_gemma2)       \
    X(cvt_arch_gemma3)

#define CVT_X_EXTERN(d) extern const struct cvt_arch d;
CVT_ARCH_REGISTRY(CVT_X_EXTERN)
#undef CVT_X_EXTERN

static const struct cvt_arch *const registry[] = {
#define CVT_X_ENTRY(d) &d,
    CVT_ARCH_REGISTRY(CVT_X_ENTRY)
#undef CVT_X_ENTRY
};

#define N_REGISTRY ((int)(sizeof(registry) / sizeof(registry[0])))

int cvt_arch_count(void) { return N_REGISTRY; }

const struct cvt_arch *cvt_arch_at(int i)
{
    return i >= 0 && i < N_REGISTRY ? registry[i] : NULL;
}

/* The descriptor whose string field at byte offset `off` equals s. */
static const struct cvt_arch *find_by(size_t off, const char *s)
{
    for (int i = 0; s && i < N_REGISTRY; i++) {
        const char *v;
        memcpy(&v, (const char *)registry[i] + off, sizeof(v)); /* the field, without a cast */
        if (strcmp(v, s) == 0)
            return registry[i];
    }
    return NULL;
}

const struct cvt_arch *cvt_arch_find(const char *name)
{
    return find_by(offsetof(struct cvt_arch, name), name);
}

const struct cvt_arch *cvt_arch_by_hf_class(const char *hf_class)
{
    return find_by(offsetof(struct cvt_arch, hf_class), hf_class);
}

const struct cvt_arch *cvt_arch_by_model_type(const char *model_type)
{
    return find_by(offsetof(struct cvt_arch, model_type), model_type);
}

void cvt_arch_list(bool hf_class, char *buf, size_t cap)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < N_REGISTRY && at < cap; i++) {
        bool seen = false; /* a model_type two classes share is listed once (MPT) */
        for (int j = 0; j < i && !hf_class; j++)
            seen |= strcmp(registry[j]->model_type, registry[i]->model_type) == 0;
        if (seen)
            continue;
        int n = snprintf(buf + at, cap - at, "%s%s", i ? ", " : "",
                         hf_class ? registry[i]->hf_class : registry[i]->model_type);
        if (n < 0)
            break;
        at += (size_t)n;
    }
}
