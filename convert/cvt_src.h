/*
 * cvt_src.h - the input side of `qshard convert`: read a HuggingFace AWQ model directory as
 * downloaded and yield validated, canonical per-linear data.
 *
 * Who calls it: the converter core (TP plan, split, repack, rank-file writer; cvt_run.c and
 * friends), the fuzz targets (tests/fuzz_*.c) and tests/test_cvt_src.c.
 *
 * What it does:
 *   - cvt_source_open(): find the weights in a directory (single or sharded safetensors with
 *     `model.safetensors.index.json`, `pytorch_model.bin` single or sharded, one llm-awq `*.pt`),
 *     validate every container against the hostile-input rules of docs/FORMATS.md section 9, build one
 *     tensor catalog (name -> dtype, shape, file location), read and validate config.json + the
 *     quant config + generation_config.json into `struct cvt_hf_config`, and load the tokenizer
 *     files. Weight files are mmap'd read-only; nothing is read until asked.
 *   - cvt_source_read*(): copy a tensor's bytes, or convert a float tensor to fp32/fp16.
 *   - cvt_awq_load(): detect the AWQ variant of one quantized linear from its tensors (GEMM,
 *     GEMV, GEMVFast, llm-awq gen-3; gen-1 == GEMM), cross-check it with the config, check every
 *     shape against the K, N the caller expects, and decode it (or a row/column slice of it) into
 *     the canonical form of docs/DESIGN.md section 4: q[K][N], z[K/G][N], s[K/G][N] (fp16 bits).
 *   - cvt_awq_dequant_source(): an independent fp32 dequantization straight from the source
 *     tensors (AWQ's own nibble orders, written separately from the decoder) for the converter's
 *     mandatory self-check.
 *
 * Ownership: a `struct cvt_source` owns its mappings, the catalog (names are NUL-terminated
 * strings owned by the source), the config and the tokenizer blobs; everything returned by a
 * getter is borrowed and valid until cvt_source_close(). `struct cvt_awq_linear` owns its arrays;
 * release with cvt_awq_linear_free(). Errors: every failing check reports once through
 * qs_log_error() (format/qs_log.h) naming file, tensor, expected and actual values, and returns an
 * `enum cvt_err`; callers forward the code without printing again.
 *
 * Threads: after cvt_source_open() returns, every function taking a `const struct cvt_source *`
 * may be called concurrently from any number of threads (reads only; no shared mutable state).
 *
 * Memory: weights are never copied wholesale. A read maps pages of the input files in, copies or
 * decodes, then drops those pages from this process again (madvise MADV_DONTNEED; they stay in the
 * page cache): cvt_source_read*() drop the pages lying entirely inside the range read (edge pages
 * are likely read next), cvt_awq_load()/cvt_awq_dequant_source() and cvt_source_release() drop
 * every page of the tensors concerned. So RSS stays bounded by what the caller allocates.
 * cvt_awq_load() allocates only the requested (slice of the) linear.
 *
 * Tested by tests/test_cvt_src.c (`make BUILD=build-x build-x/test_cvt_src && build-x/test_cvt_src`)
 * and fuzzed by tests/fuzz_safetensors.c, tests/fuzz_pickle.c, tests/fuzz_config.c (`make fuzz`).
 */
#ifndef CVT_SRC_H
#define CVT_SRC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qs_rope.h" /* struct qs_rope_scaling */

#ifdef __cplusplus
extern "C" {
#endif

/* --- errors -------------------------------------------------------------------------------- */

/*
 * X(name, value, description). Values are stable: never renumber, never reuse; a retired code
 * stays as a comment. 0..63 belong to the input side (this file's owner).
 */
#define CVT_ERR_LIST_SRC(X)                                                                  \
    X(CVT_ERR_NONE,           0,  "no error")                                                \
    X(CVT_ERR_IO,             1,  "I/O error")                                               \
    X(CVT_ERR_NOMEM,          2,  "out of memory")                                           \
    X(CVT_ERR_JSON,           3,  "malformed JSON")                                          \
    X(CVT_ERR_CONFIG,         4,  "invalid or inconsistent model/quant config")              \
    X(CVT_ERR_UNSUPPORTED,    5,  "unsupported model, quantization or container")            \
    X(CVT_ERR_SAFETENSORS,    6,  "malformed safetensors file")                              \
    X(CVT_ERR_ZIP,            7,  "malformed torch zip archive")                             \
    X(CVT_ERR_PICKLE,         8,  "pickle rejected")                                         \
    X(CVT_ERR_INDEX,          9,  "shard index inconsistent with the files")                 \
    X(CVT_ERR_MISSING_TENSOR, 10, "missing tensor")                                          \
    X(CVT_ERR_UNKNOWN_TENSOR, 11, "unknown tensor")                                          \
    X(CVT_ERR_SHAPE,          12, "tensor shape mismatch")                                   \
    X(CVT_ERR_DTYPE,          13, "wrong or unknown dtype")                                  \
    X(CVT_ERR_NAN,            14, "NaN/Inf or non-positive value")                           \
    X(CVT_ERR_VARIANT,        15, "AWQ variant mismatch")                                    \
    X(CVT_ERR_TP,             16, "impossible tensor-parallel split")                        \
    X(CVT_ERR_RANGE,          17, "value out of range")                                      \
    X(CVT_ERR_ARG,            18, "invalid argument (API misuse)")

/*
 * Converter-core codes go here, values 64 and up (owner: converter core), e.g.
 *   X(CVT_ERR_SELF_CHECK, 64, "self-check failed: packed dequant != source dequant")
 */
#define CVT_ERR_LIST_CORE(X)                                                                 \
    X(CVT_ERR_SELF_CHECK,     64, "self-check failed: packed dequant != source dequant")     \
    X(CVT_ERR_EXISTS,         65, "output already exists (use --force)")                     \
    X(CVT_ERR_INTERRUPTED,    66, "interrupted by a signal")                                 \
    X(CVT_ERR_SAME_DIR,       67, "output directory is the model directory")            \
    X(CVT_ERR_LOCKED,         68, "output directory is being written by another convert")    \
    X(CVT_ERR_TOKENIZER,      69, "tokenizer files incomplete, unloadable or too large")

#define CVT_ERR_LIST(X) CVT_ERR_LIST_SRC(X) CVT_ERR_LIST_CORE(X)

#define CVT_ERR_ENUM_(name, value, desc) name = value,
enum cvt_err { CVT_ERR_LIST(CVT_ERR_ENUM_) };
#undef CVT_ERR_ENUM_

/* "CVT_ERR_SHAPE: tensor shape mismatch"-style text ("CVT_ERR_?: unknown" for other values). */
const char *cvt_err_str(enum cvt_err e);
/* DESIGN.md section 2 exit code for a status: NONE 0, IO 4, NOMEM 3, ARG 1, everything else 2. */
int cvt_err_exit_code(enum cvt_err e);

/* Forward a non-zero status (the check that failed already reported it). */
#define CVT_TRY(expr)                             \
    do {                                          \
        enum cvt_err cvt_try_e_ = (expr);         \
        if (cvt_try_e_ != CVT_ERR_NONE)           \
            return cvt_try_e_;                    \
    } while (0)

/* --- tensors ------------------------------------------------------------------------------- */

/* Element types of source tensors (safetensors dtype strings / torch storage classes). */
enum cvt_dtype {
    CVT_DT_UNKNOWN = 0,
    CVT_DT_F16 = 1, CVT_DT_BF16 = 2, CVT_DT_F32 = 3, CVT_DT_F64 = 4,
    CVT_DT_I8 = 5, CVT_DT_U8 = 6, CVT_DT_I16 = 7, CVT_DT_U16 = 8, CVT_DT_I32 = 9, CVT_DT_U32 = 10,
    CVT_DT_I64 = 11, CVT_DT_U64 = 12, CVT_DT_BOOL = 13,
    CVT_DT_F8_E4M3 = 14, CVT_DT_F8_E5M2 = 15, CVT_DT_F8_E8M0 = 16, CVT_DT_F8_E4M3FNUZ = 17,
    CVT_DT_F8_E5M2FNUZ = 18, CVT_DT_C64 = 19,
};
const char *cvt_dtype_str(enum cvt_dtype dt);   /* safetensors spelling: "F16", "I32", ... */
size_t cvt_dtype_size(enum cvt_dtype dt);       /* bytes per element; 0 for UNKNOWN */

#define CVT_MAX_DIMS 8

/* One tensor of the catalog. Everything is validated at open: n_dims <= CVT_MAX_DIMS, numel and
 * nbytes fit (no overflow), [offset, offset + storage extent) lies inside its file. */
struct cvt_src_tensor {
    const char    *name;                 /* owned by the source; valid UTF-8, unique */
    enum cvt_dtype dtype;
    int            n_dims;               /* 0 = scalar */
    int64_t        shape[CVT_MAX_DIMS];  /* elements per dim, row-major (C order) */
    int64_t        numel;                /* product of shape (1 for a scalar) */
    uint64_t       nbytes;               /* numel * cvt_dtype_size(dtype) */
    uint32_t       file;                 /* index into cvt_source_file() */
    uint64_t       offset;               /* absolute byte offset of element 0 in that file */
    bool           contiguous;           /* false only for torch views with other strides:
                                            reading such a tensor fails with CVT_ERR_SHAPE */
};

/* --- config -------------------------------------------------------------------------------- */

struct cvt_arch; /* an architecture descriptor: convert/cvt_arch.h */


/* Where the quantization parameters came from (docs/FORMATS.md section 8.1). */
enum cvt_qcfg_file {
    CVT_QCFG_NONE = 0,
    CVT_QCFG_CONFIG_JSON = 1,          /* config.json "quantization_config" (AutoAWQ >= 0.1.6) */
    CVT_QCFG_QUANT_CONFIG_JSON = 2,    /* quant_config.json (AutoAWQ < 0.2.0) */
    CVT_QCFG_QUANTIZE_CONFIG_JSON = 3, /* quantize_config.json (llm-awq gen-1 exports) */
};
const char *cvt_qcfg_file_str(enum cvt_qcfg_file f);    /* the file name, "none" */

/* AWQ on-disk variants (docs/FORMATS.md section 2.2 table). */
enum cvt_variant {
    CVT_VARIANT_UNKNOWN = 0,
    CVT_VARIANT_GEMM = 1,       /* AutoAWQ GEMM, llm-awq gen-1: I32 [K, N/8] AWQ nibble order */
    CVT_VARIANT_GEMV = 2,       /* AutoAWQ GEMV, llm-awq gen-2: I32 [N, K/8] sequential */
    CVT_VARIANT_GEMV_FAST = 3,  /* AutoAWQ GEMVFast: I16 [N/4, K], qzeros F16 = -s*z */
    CVT_VARIANT_LLMAWQ_V3 = 4,  /* llm-awq gen-3 "-v2.pt": I16 [N/4, K], scaled_zeros = -s*z */
    CVT_VARIANT_GPTQ = 5,       /* GPTQ (AutoGPTQ, GPTQModel): qweight I32 [K/8, N] sequential
                                 * along K, qzeros I32 [K/G, N/8] (v1: stored z - 1), g_idx */
    CVT_VARIANT_CT_PACKED = 6,  /* compressed-tensors pack-quantized: weight_packed I32 [N, K/8],
                                 * weight_scale [N, K/G], weight_zero_point, weight_g_idx */
};
const char *cvt_variant_str(enum cvt_variant v);        /* "gemm", "gemv", "gemv_fast", "llm-awq-v3",
                                                           "gptq", "compressed-tensors" */

/* Which quantizer wrote the checkpoint (quant_method; docs/FORMATS.md sections 14-16). */
enum cvt_qmethod {
    CVT_QM_AWQ = 0,             /* AutoAWQ / llm-awq ("awq") */
    CVT_QM_GPTQ = 1,            /* AutoGPTQ / GPTQModel ("gptq") */
    CVT_QM_CT = 2,              /* llm-compressor ("compressed-tensors", format pack-quantized) */
};
const char *cvt_qmethod_str(enum cvt_qmethod m);        /* "awq", "gptq", "compressed-tensors" */
#define CVT_VARIANT_BIT(v) (1u << (unsigned)(v))

#define CVT_MAX_EOS      16
#define CVT_MAX_SKIP_MOD 64

/* The validated model + quant config (read once at open, then read-only). Integer sizes are
 * > 0 and fit the ranges checked by cvt_config_parse(); absent optional keys get the
 * transformers default of the architecture. */
struct cvt_hf_config {
    const struct cvt_arch *arch;      /* the family's descriptor (registry: cvt_arch.h) */
    char          architectures0[64]; /* architectures[0] as written (or "" if absent) */
    int64_t hidden_size;              /* H */
    int64_t intermediate_size;        /* I (per expert for Mixtral) */
    int64_t num_hidden_layers;
    int64_t num_attention_heads;      /* nq */
    int64_t num_key_value_heads;      /* nkv; default nq; nq % nkv == 0 */
    int64_t head_dim;                 /* hd; default H / nq */
    int64_t vocab_size;               /* V */
    double  rms_norm_eps;
    double  rope_theta;
    struct qs_rope_scaling rope_scaling; /* QS_ROPE_DEFAULT when null / "default" */
    int64_t max_position_embeddings;
    bool    tie_word_embeddings;
    int64_t sliding_window;           /* 0 = none (null, or Qwen2 use_sliding_window false) */
    int64_t num_local_experts;        /* Mixtral E; 0 otherwise */
    int64_t num_experts_per_tok;      /* Mixtral top-k; 0 otherwise */
    bool no_topk_renorm;              /* Qwen3-MoE norm_topk_prob false: the kept router weights
                                       * are not renormalised (Mixtral: false) */
    double  alibi_bias_max;           /* MPT: ALiBi instead of rotary (attn_config); 0 = none */
    /* Gemma 2 / 3 (their read_keys; 0 = the plain value of every other family) */
    double  embed_scale;              /* embeddings * sqrt(hidden_size) */
    double  attn_scale;               /* query_pre_attn_scalar^-0.5 */
    double  attn_softcap;             /* attn_logit_softcapping; 0 = none */
    double  final_softcap;            /* final_logit_softcapping; 0 = none */
    int64_t sliding_window_pattern;   /* layer l windowed iff (l + 1) % P != 0; 0 = every layer */
    double  rope_local_theta;         /* Gemma 3's rope_local_base_freq (windowed layers) */
    unsigned bias_roles;              /* CVT_ROLE_BIT()s of the outputs whose linears carry a
                                       * bias by config (Qwen2 qkv_proj; llama attention_bias:
                                       * qkv_proj and o_proj) */
    bool    has_bos;
    int64_t bos_token_id;             /* generation_config.json wins over config.json */
    int     n_eos;                    /* union of config.json and generation_config.json ids */
    int     eos_token_id[CVT_MAX_EOS]; /* each in [0, vocab_size) */
    char    torch_dtype[16];          /* "float16", "bfloat16", "float32" or "" */

    struct {
        enum cvt_qcfg_file from;      /* which file the parameters came from */
        int      w_bit;               /* always 4 (others refused) */
        int64_t  group_size;          /* G as written; -1 = one group per layer (G = K) */
        bool     zero_point;          /* false: symmetric (no stored zeros, z = 8) */
        enum cvt_qmethod method;      /* quant_method */
        bool     act_order;           /* GPTQ desc_act / compressed-tensors actorder "group":
                                       * g_idx may assign rows to groups out of order */
        bool     gptq_v1;             /* GPTQ checkpoint_format "gptq": qzeros hold z - 1 */
        int      n_ignore;            /* compressed-tensors "ignore" entries */
        char    *ignore[CVT_MAX_SKIP_MOD]; /* owned; exact module names or "re:" + a regex */
        char     version[32];         /* lower-cased "gemm", "gemv", ... or "" if absent */
        char     format[32];          /* transformers v5 "format" or "" */
        char     backend[32];         /* "autoawq", "llm-awq", ... or "" */
        unsigned variant_mask;        /* CVT_VARIANT_BIT()s the config allows */
        int      n_modules_to_not_convert;
        char    *modules_to_not_convert[CVT_MAX_SKIP_MOD]; /* owned; substrings of module names */
    } quant;

    /* Raw bytes (owned; embedded verbatim in every rank file). */
    char   *config_json;              /* config.json, NUL-terminated */
    size_t  config_json_size;
    char   *generation_config_json;   /* NULL if the directory has none */
    size_t  generation_config_json_size;
};

/* True when module `name` (e.g. "model.layers.0.mlp.gate_proj") matches an entry of
 * modules_to_not_convert (substring test, as AutoAWQ, transformers and vLLM do). */
bool cvt_config_skips_module(const struct cvt_hf_config *cfg, const char *name);

/* True when module `name` matches an entry of a compressed-tensors "ignore" list: an exact
 * module name, or "re:" + a regex that matches at the start of the name (Python re.match, as
 * compressed-tensors `is_match` does; the regex was checked and translated to POSIX ERE by
 * cvt_config_parse, docs/FORMATS.md section 15.4). False for other quantizers. */
bool cvt_config_ignores_module(const struct cvt_hf_config *cfg, const char *name);

/*
 * Parse config JSON texts into `cfg` (exposed for tests and the config fuzzer; cvt_source_open
 * calls it). `config_json` is required; the others may be NULL. Each text is (ptr, size), need
 * not be NUL-terminated. Copies the raw config.json / generation_config.json bytes into cfg.
 * Errors: CVT_ERR_JSON (not a JSON object), CVT_ERR_CONFIG (missing/ill-typed/out-of-range key,
 * quant configs disagreeing, quantized tensors without a quant config is the source's check),
 * CVT_ERR_UNSUPPORTED (architecture, rope_scaling type, w_bit != 4, zero_point false, non-awq
 * quant_method, unknown version), CVT_ERR_NOMEM. On error cfg is left zeroed (nothing to free).
 * `where` names the directory in messages.
 */
enum cvt_err cvt_config_parse(const char *where,
                              const char *config_json, size_t config_size,
                              const char *quant_config_json, size_t quant_config_size,
                              const char *quantize_config_json, size_t quantize_config_size,
                              const char *generation_config_json, size_t generation_config_size,
                              struct cvt_hf_config *cfg);
/* Free what cfg owns; zeroes it. Accepts a zeroed cfg. */
void cvt_config_free(struct cvt_hf_config *cfg);

/* --- source directory ---------------------------------------------------------------------- */

enum cvt_container {
    CVT_CONTAINER_SAFETENSORS = 1,          /* model.safetensors (or the one *.safetensors) */
    CVT_CONTAINER_SAFETENSORS_SHARDED = 2,  /* model.safetensors.index.json + shards */
    CVT_CONTAINER_TORCH_BIN = 3,            /* pytorch_model.bin, or .bin.index.json + shards */
    CVT_CONTAINER_TORCH_PT = 4,             /* one *.pt (llm-awq dump, AutoAWQ <= 0.0.2) */
};
const char *cvt_container_str(enum cvt_container c); /* "safetensors", "safetensors-sharded", "torch-bin", "torch-pt" */

/* One input weight file. */
struct cvt_src_file {
    const char *path;     /* owned; dir + "/" + name */
    const char *name;     /* points into path: the file name */
    uint64_t    size;     /* bytes */
};

/* A small file copied into memory (tokenizer files). */
struct cvt_src_blob {
    const char    *name;  /* "tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                             "special_tokens_map.json", "added_tokens.json" */
    const uint8_t *data;  /* owned by the source */
    size_t         size;
};

struct cvt_source;  /* opaque */

/*
 * Open the model directory `dir`: config, quant config, generation config, tokenizer files,
 * weights (see the top comment). Decisions (documented in cvt_source.c):
 *   - safetensors win over .bin when both are present (info message);
 *   - a shard file of the chosen kind that the index does not name is an error (CVT_ERR_INDEX):
 *     a mixed or half-updated download must not convert;
 *   - a tensor present in a shard but not in the index, listed under another shard, or present
 *     twice is CVT_ERR_INDEX;
 *   - `.qweight` tensors without any quant config, or a quant config without any `.qweight`,
 *     is CVT_ERR_CONFIG;
 *   - a directory without tokenizer files opens with a warning.
 * On success *out is the source; on error *out is NULL and nothing leaks.
 */
enum cvt_err cvt_source_open(const char *dir, struct cvt_source **out);
/* Unmap and free everything. Accepts NULL. */
void cvt_source_close(struct cvt_source *src);

const struct cvt_hf_config *cvt_source_config(const struct cvt_source *src);
enum cvt_container cvt_source_container(const struct cvt_source *src);
const char *cvt_source_dir(const struct cvt_source *src);
/* Sum of the sizes of all weight files, bytes (for progress and throughput). */
uint64_t cvt_source_total_bytes(const struct cvt_source *src);

size_t cvt_source_n_files(const struct cvt_source *src);
const struct cvt_src_file *cvt_source_file(const struct cvt_source *src, size_t i);

/* Tensor catalog, in file order (shard by shard, then offset order). */
size_t cvt_source_n_tensors(const struct cvt_source *src);
const struct cvt_src_tensor *cvt_source_tensor(const struct cvt_source *src, size_t i);
/* Hash lookup by exact name; NULL if absent (no message: absence is the caller's to judge). */
const struct cvt_src_tensor *cvt_source_find(const struct cvt_source *src, const char *name);

/* Tokenizer files present in the directory (0 when none). */
size_t cvt_source_n_tokenizer_files(const struct cvt_source *src);
const struct cvt_src_blob *cvt_source_tokenizer_file(const struct cvt_source *src, size_t i);

/*
 * Copy all bytes of tensor t (contiguous, row-major, little-endian) into dst.
 * dst_size must be >= t->nbytes (else CVT_ERR_ARG). Errors: CVT_ERR_SHAPE (non-contiguous torch
 * view), CVT_ERR_ARG.
 */
enum cvt_err cvt_source_read(const struct cvt_source *src, const struct cvt_src_tensor *t,
                             void *dst, size_t dst_size);
/* Copy bytes [byte_off, byte_off + nbytes) of tensor t into dst (range checked: CVT_ERR_ARG). */
enum cvt_err cvt_source_read_range(const struct cvt_source *src, const struct cvt_src_tensor *t,
                                   uint64_t byte_off, uint64_t nbytes, void *dst);
/*
 * Pointer to element 0 of tensor t inside the read-only mapping, or NULL for a non-contiguous
 * tensor. NOT necessarily aligned to the element size (safetensors does not require it,
 * docs/FORMATS.md P19): read through memcpy. Call cvt_source_release() when done to drop the pages.
 */
const void *cvt_source_data(const struct cvt_source *src, const struct cvt_src_tensor *t);
/* Advise the kernel that t's pages are no longer needed by this process (RSS stays bounded;
 * the page cache keeps them). Safe while other threads read other tensors. */
void cvt_source_release(const struct cvt_source *src, const struct cvt_src_tensor *t);
/* The same for bytes [byte_off, byte_off + nbytes) of t (clamped to the tensor; every page the
 * range touches). */
void cvt_source_release_range(const struct cvt_source *src, const struct cvt_src_tensor *t,
                              uint64_t byte_off, uint64_t nbytes);

/*
 * Convert elements [first, first + count) of the flattened float tensor t (F16, BF16, F32, F64)
 * to fp32 / fp16 bits. Errors: CVT_ERR_DTYPE (not a float tensor), CVT_ERR_NAN (NaN/Inf value,
 * naming tensor and flat index), CVT_ERR_RANGE (f16: |value| rounds above 65504, naming tensor,
 * index and value; f32 from F64 likewise), CVT_ERR_ARG (range outside the tensor),
 * CVT_ERR_SHAPE (non-contiguous). fp16 rounding is round-to-nearest-even; F16 -> F16 is a copy.
 */
enum cvt_err cvt_source_read_f32(const struct cvt_source *src, const struct cvt_src_tensor *t,
                                 uint64_t first, uint64_t count, float *dst);
enum cvt_err cvt_source_read_f16(const struct cvt_source *src, const struct cvt_src_tensor *t,
                                 uint64_t first, uint64_t count, uint16_t *dst);

/* --- AWQ linears --------------------------------------------------------------------------- */

/* What one quantized linear looks like on disk (cvt_awq_probe). */
struct cvt_awq_info {
    enum cvt_variant variant;             /* found from the tensors */
    int64_t K, N, G;                      /* full sizes; G resolved (-1 -> K) */
    const struct cvt_src_tensor *qweight; /* borrowed from the catalog */
    const struct cvt_src_tensor *zeros;   /* qzeros or scaled_zeros */
    const struct cvt_src_tensor *scales;
    const struct cvt_src_tensor *bias;    /* NULL when absent */
    const struct cvt_src_tensor *g_idx;   /* GPTQ g_idx / compressed-tensors weight_g_idx, or NULL */
    const struct cvt_src_tensor *shape;   /* compressed-tensors weight_shape, or NULL */
};

/*
 * Find `<prefix>.qweight`, `.qzeros` / `.scaled_zeros`, `.scales`, `.bias`; detect the variant
 * from dtypes and shapes (never from the config alone); check every shape against the expected
 * full in_features K and out_features N (from the config, computed by the caller) and the
 * config's group size. Errors: CVT_ERR_MISSING_TENSOR (qweight, scales or zeros absent),
 * CVT_ERR_DTYPE, CVT_ERR_SHAPE (no variant matches: message gives actual and expected shapes),
 * CVT_ERR_VARIANT (the tensors are variant X but the config's version/backend says Y),
 * CVT_ERR_UNSUPPORTED (G not usable with the variant). No data is read.
 */
enum cvt_err cvt_awq_probe(const struct cvt_source *src, const struct cvt_hf_config *cfg,
                           const char *prefix, int64_t K, int64_t N, struct cvt_awq_info *info);

/* Canonical form of one AWQ linear or of a slice of it (DESIGN.md section 4):
 * w[k][n] = (q[k][n] - z[k/G][n]) * s[k/G][n], k, n relative to the slice. */
struct cvt_awq_linear {
    enum cvt_variant variant;   /* source variant it was decoded from */
    int64_t K, N, G;            /* slice sizes (K = k1 - k0, N = n1 - n0), group size */
    int64_t k0, n0;             /* slice origin in the full [K_full, N_full] matrix */
    uint8_t  *q;                /* owned; [K][N] codes 0..15 */
    uint8_t  *z;                /* owned; [K/G][N] zero points 0..15 */
    uint16_t *s;                /* owned; [K/G][N] fp16 bits, finite and > 0 */
    float    *bias;             /* owned; [N] source values (exact in fp32) or NULL */
};

/*
 * Act-order (GPTQ desc_act, compressed-tensors actorder "group"): g_idx[k] names the group of
 * source input row k in any order. The canonical rows of such a linear are then in GROUP ORDER:
 * canonical row j is source row perm[j], where perm lists the rows of group 0 in ascending row
 * order, then group 1, ... (a stable sort of the rows by g_idx), so canonical row j is in group
 * j / G like every other linear. Row ranges [k0, k1) given to cvt_awq_load and
 * cvt_awq_dequant_source are canonical rows. The runtime gathers x[perm[j]] for input j
 * (docs/DESIGN.md section 4.5). Without act-order (no g_idx, or g_idx[k] == k / G) perm is the
 * identity and nothing changes.
 */

/*
 * Read and validate the g_idx of quantized linear `prefix` (K input rows): every value in
 * [0, K/G) and every group exactly G rows (docs/FORMATS.md 14.3). *act_order = the assignment
 * is not k / G. A linear without g_idx: *act_order = false. Errors: CVT_ERR_SHAPE (g_idx not
 * I32/I64 [K]), CVT_ERR_RANGE (a value outside the groups or a group of the wrong size, naming
 * the tensor, the row and the group), CVT_ERR_CONFIG (a non-trivial g_idx while the config
 * says no act-order: names the tensor and desc_act / actorder). When perm is not NULL it
 * receives the K canonical-to-source rows (identity without act-order).
 */
enum cvt_err cvt_awq_gidx(const struct cvt_source *src, const struct cvt_hf_config *cfg,
                          const char *prefix, int64_t K, bool *act_order, int32_t *perm);

/*
 * Decode rows [k0, k1) and columns [n0, n1) of the linear `prefix` (full sizes K x N expected)
 * into `out` (allocates only the slice). k0 and k1 must be multiples of G (k1 may be K);
 * 0 <= n0 < n1 <= N. Pass k0 = 0, k1 = K, n0 = 0, n1 = N for the whole linear.
 * Runs cvt_awq_probe() first (same errors), then checks values: every scale of the slice finite
 * and > 0 (CVT_ERR_NAN naming the scales tensor and [row, col]); BF16 scales must convert to
 * fp16 exactly (CVT_ERR_RANGE); GEMVFast / gen-3 zeros qz must be -(s*z) for an integer z in
 * 0..15 up to the rounding of the stored value, |-qz/s - z| <= 0.1 (CVT_ERR_RANGE otherwise);
 * the canonical z is that integer, so w = (q - z) * s, as the fixtures' goldens define it.
 * Bias: F16/BF16/F32 `[N]`, finite. On error `out` is zeroed.
 */
enum cvt_err cvt_awq_load(const struct cvt_source *src, const struct cvt_hf_config *cfg,
                          const char *prefix, int64_t K, int64_t N,
                          int64_t k0, int64_t k1, int64_t n0, int64_t n1,
                          struct cvt_awq_linear *out);
/* Free the arrays and zero *lin. Accepts NULL and zeroed structs. */
void cvt_awq_linear_free(struct cvt_awq_linear *lin);

/*
 * Independent dequantization for the self-check: out[k - k0][n - n0] = (q - z) * s in fp32
 * computed straight from the source tensors for rows [k0, k1), columns [n0, n1) (same range
 * rules as cvt_awq_load). Written separately from the decoder: GEMM via the packing order
 * ORDER = [0,2,4,6,1,3,5,7] (nibble i -> column 8c + ORDER[i]), GEMV sequential, GEMVFast /
 * gen-3 by inverting the docs/FORMATS.md 5.2 interleave word by word, z = round(-qz/s).
 * `out` holds (k1-k0)*(n1-n0) floats. Errors as cvt_awq_load.
 */
enum cvt_err cvt_awq_dequant_source(const struct cvt_source *src, const struct cvt_hf_config *cfg,
                                    const char *prefix, int64_t K, int64_t N,
                                    int64_t k0, int64_t k1, int64_t n0, int64_t n1, float *out);

/* --- container parsers (exposed for the fuzz targets and tests) ---------------------------- */

/* Parsed tensor entry of one container, before it joins a catalog. name is owned by the caller
 * of the parser (free with cvt_tensor_list_free). offset is absolute within the parsed buffer. */
struct cvt_tensor_list {
    size_t n;
    struct cvt_src_tensor *t;   /* owned, t[i].name owned */
};
void cvt_tensor_list_free(struct cvt_tensor_list *l);

/*
 * Parse and validate a whole safetensors file image (docs/FORMATS.md 9.1): header length <= 100 MB
 * and inside the file, UTF-8 JSON object, unique non-empty UTF-8 names, known dtypes, integral
 * shapes and offsets, end - begin == nbytes, offsets tiling the data region exactly (no holes, no
 * overlaps, nothing after the last tensor). `file_size` is the full file size; only the first
 * `avail` bytes (>= header) need be in `buf`. `fname` names the file in messages.
 * Errors: CVT_ERR_SAFETENSORS, CVT_ERR_DTYPE, CVT_ERR_NOMEM.
 */
enum cvt_err cvt_safetensors_parse(const char *fname, const uint8_t *buf, size_t avail,
                                   uint64_t file_size, struct cvt_tensor_list *out);

/*
 * Parse a torch.save zip image held entirely in memory (docs/FORMATS.md 9.3): stored entries only,
 * ZIP64, local headers, `byteorder` little, restricted unpickler over data.pkl. Offsets in the
 * result are absolute in `buf`. Errors: CVT_ERR_ZIP, CVT_ERR_PICKLE, CVT_ERR_DTYPE,
 * CVT_ERR_SHAPE, CVT_ERR_UNSUPPORTED (legacy non-zip torch file), CVT_ERR_NOMEM.
 */
enum cvt_err cvt_torchzip_parse(const char *fname, const uint8_t *buf, uint64_t size,
                                struct cvt_tensor_list *out);

/*
 * Run only the restricted unpickler over a data.pkl image (for the fuzzer): storages are
 * resolved through no archive, so each BINPERSID gets its own synthetic location (two
 * references to one key do not share it here, unlike cvt_torchzip_parse).
 * Errors: CVT_ERR_PICKLE, CVT_ERR_SHAPE, CVT_ERR_DTYPE, CVT_ERR_NOMEM.
 */
enum cvt_err cvt_pickle_parse_only(const char *fname, const uint8_t *pkl, size_t size,
                                   struct cvt_tensor_list *out);

#ifdef __cplusplus
}
#endif
#endif /* CVT_SRC_H */
