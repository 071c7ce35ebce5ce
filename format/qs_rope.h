/*
 * qs_rope.h - the rotary-embedding scaling of a model config ("rope_scaling", docs/DESIGN.md
 * section 6), defined once for everyone who handles it: the config readers (format/qs_json.h,
 * qs_json_rope_scaling: the converter reading config.json, the runtime reading a rank file's
 * config section), the converter writing it back (convert/cvt_write.c) and the rotary reference
 * that turns it into inverse frequencies (kernels/ref.h, ref_rope_inv_freq).
 *
 * The values are kept as parsed (double, an integer context length) so that the converter writes
 * them back unchanged; the reference rounds them to fp32 where it uses them, as transformers
 * does (modeling_rope_utils.py computes in fp32).
 * Plain C, no dependencies; also compiled as C++ (kernels' tests include ref.h from .cu files).
 */
#ifndef QS_ROPE_H
#define QS_ROPE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Stable values (written nowhere, but kept so that a retired type keeps its number). */
enum qs_rope_type {
    QS_ROPE_DEFAULT = 0, /* "rope_scaling": null, or rope_type "default": plain RoPE */
    QS_ROPE_LINEAR = 1,  /* position interpolation: inv_freq / factor */
    QS_ROPE_LLAMA3 = 2,  /* Llama 3.1 frequency-dependent scaling (_compute_llama3_parameters) */
};

struct qs_rope_scaling {
    enum qs_rope_type type;
    double factor;                            /* linear, llama3: > 0 */
    double low_freq_factor;                   /* llama3: > 0 */
    double high_freq_factor;                  /* llama3: > low_freq_factor */
    int64_t original_max_position_embeddings; /* llama3 ("L"), >= 1 */
};

#ifdef __cplusplus
}
#endif
#endif /* QS_ROPE_H */
