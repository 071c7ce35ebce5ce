/*
 * qs_json.h - typed, range-checked readers of JSON config objects (cJSON trees), shared by the
 * converter (convert/cvt_config.c: config.json, quant configs, generation_config.json), the
 * runtime (runtime/rt_config.c: a rank file's config section, docs/DESIGN.md section 6) and the
 * runtime's session (generation_config.json's eos ids).
 *
 * Every input is hostile: each reader checks type and range and, on failure, reports once through
 * qs_log_error() naming the file, the key and the value found, then returns a status; callers map
 * the status to their own module's error code and forward it. The caller owns every cJSON tree
 * (qs_json_parse_object hands it one to cJSON_Delete); readers only borrow.
 *
 * Absent keys and JSON null are the same thing ("not given") for every reader; qs_json_is_null()
 * tells them apart for the few keys whose transformers default differs between the two (an
 * absent key takes the configuration class's default, an explicit null is Python's None).
 * Test: ./build/test_json. Fuzzed through tests/fuzz_config.c and tests/fuzz_rt_config.c.
 */
#ifndef QS_JSON_H
#define QS_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qs_rope.h" /* struct qs_rope_scaling */

#ifdef __cplusplus
extern "C" {
#endif

struct cJSON;

/* X(name, value, description). Values are stable. */
#define QS_JSON_ERR_LIST(X)                                                                     \
    X(QS_JSON_OK, 0, "ok")                                                                      \
    X(QS_JSON_ERR_SYNTAX, 1, "not a JSON object, a duplicate key or trailing garbage")         \
    X(QS_JSON_ERR_VALUE, 2, "a key is missing, of the wrong type or out of range")             \
    X(QS_JSON_ERR_UNSUPPORTED, 3, "a well-formed value this code does not support")            \
    X(QS_JSON_ERR_NOMEM, 4, "out of memory")

#define QS_JSON_X_ENUM(name, value, desc) name = value,
enum qs_json_err { QS_JSON_ERR_LIST(QS_JSON_X_ENUM) };
#undef QS_JSON_X_ENUM

/* "QS_JSON_ERR_VALUE: a key is missing..." ("QS_JSON_ERR_?: unknown" for other values). */
const char *qs_json_err_str(enum qs_json_err e);

/* Who reads what, for messages: "<where>/<file>: ..." (file NULL: "<where>: ..."), reported as
 * detected in function `fn` (qs_log_error's first argument). All three are borrowed. */
struct qs_json_ctx {
    const char *fn;
    const char *where;
    const char *file;
};

/*
 * Parse text[0, size) (need not be NUL-terminated) as one JSON object into *out (the caller
 * deletes it). Refused (QS_JSON_ERR_SYNTAX, *out NULL): not JSON or not an object (the message
 * gives the byte where parsing stopped), a top-level key that appears twice (Python's json keeps
 * the last, cJSON the first: the ambiguity is refused), anything but whitespace or NUL bytes
 * after the object. QS_JSON_ERR_NOMEM is reported as a parse failure by cJSON and cannot be told
 * apart.
 */
enum qs_json_err qs_json_parse_object(const struct qs_json_ctx *c, const char *text, size_t size,
                                      struct cJSON **out);

/* Integer key: an integral JSON number in [lo, hi] into *out. Not given: QS_JSON_ERR_VALUE when
 * `required`, else *out = def. */
enum qs_json_err qs_json_int(const struct qs_json_ctx *c, const struct cJSON *o, const char *key,
                             bool required, int64_t def, int64_t lo, int64_t hi, int64_t *out);

/* Number key: a finite JSON number in (lo, hi] (lo exclusive) into *out. Not given:
 * QS_JSON_ERR_VALUE when `required`, else *out = def. (A value used as fp32 and required to stay
 * positive there passes lo = 0x1p-150, hi = FLT_MAX.) */
enum qs_json_err qs_json_number(const struct qs_json_ctx *c, const struct cJSON *o,
                                const char *key, bool required, double def, double lo, double hi,
                                double *out);

/* Boolean key: JSON true/false into *out; not given: *out = def. */
enum qs_json_err qs_json_bool(const struct qs_json_ctx *c, const struct cJSON *o, const char *key,
                              bool def, bool *out);

/* Whether key is in object o with a value other than JSON null (what every reader here treats
 * as "given"). */
bool qs_json_given(const struct cJSON *o, const char *key);

/* Whether key is in object o with the value JSON null (absent or any other value: false).
 * MistralConfig's sliding_window is one such key: absent = 4096, null = no window. */
bool qs_json_is_null(const struct cJSON *o, const char *key);

/* String key copied into buf[cap] (lower-cased ASCII when `lower`); not given: "". Refused: not a
 * string, or cap bytes or longer. */
enum qs_json_err qs_json_string(const struct qs_json_ctx *c, const struct cJSON *o,
                                const char *key, bool lower, char *buf, size_t cap);

/*
 * The "eos_token_id" key of object o (config.json, generation_config.json, a rank file's config):
 * one token id or a list of them, each an integer in [0, max_id). The ids are merged into
 * ids[0, *n) in order of appearance, skipping ids already there (so two files can be merged by
 * two calls); more than `cap` distinct ids is refused. Not given: nothing changes. Errors:
 * QS_JSON_ERR_VALUE (an element not an integer id in range, too many ids); *n and ids[0, *n) are
 * then unchanged.
 */
enum qs_json_err qs_json_eos_ids(const struct qs_json_ctx *c, const struct cJSON *o,
                                 int64_t max_id, int *ids, int cap, int *n);

/* One RoPE object of a config, as written and before any default: transformers 4's and the rank
 * file's "rope_scaling", transformers 5's "rope_parameters" (docs/FORMATS.md 10.1). */
struct qs_rope_object {
    bool given;                     /* false: the key is absent, null or {} (transformers 5
                                     * treats an empty dict as none); all below zero then */
    struct qs_rope_scaling scaling; /* type and factors; original_max_position_embeddings 0 when
                                     * the object does not give it */
    double rope_theta;              /* "rope_theta" inside the object (transformers 5); 0: absent */
    double partial_rotary_factor;   /* "partial_rotary_factor" inside it; 0: absent */
};

/*
 * The object under `key` of object o read as one flat RoPE dict: the type ("rope_type" or the
 * older "type", compared case-insensitively; both given must agree; absent = "default"), the
 * factors of that type as qs_json_rope_scaling reads them except that
 * original_max_position_embeddings may be absent (left 0: the caller applies its default), and
 * the two keys transformers 5 also keeps there: rope_theta, a number in (0, 1e12], and
 * partial_rotary_factor, in (0, 1]. A member that is itself an object, as in
 * {"full_attention": {...}, "sliding_attention": {...}} (per-layer-type parameters,
 * transformers 5 modeling_rope_utils.py standardize_rope_params), is QS_JSON_ERR_UNSUPPORTED,
 * as is a type other than default, linear and llama3. Keys inside are reported as
 * "<where>/<file> <key>: ...". Errors: QS_JSON_ERR_VALUE (not null or an object, a bad value),
 * QS_JSON_ERR_UNSUPPORTED. *out is zeroed (not given, DEFAULT) first and on every error.
 */
enum qs_json_err qs_json_rope_object(const struct qs_json_ctx *c, const struct cJSON *o,
                                     const char *key, struct qs_rope_object *out);

/*
 * The "rope_scaling" key of object o (transformers' spelling, docs/DESIGN.md section 6):
 *   null / absent / {"rope_type": "default"}          -> QS_ROPE_DEFAULT
 *   {"rope_type" or "type": "linear", "factor": f}    -> QS_ROPE_LINEAR
 *   {"rope_type" or "type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
 *    "original_max_position_embeddings"}              -> QS_ROPE_LLAMA3
 * The type is compared case-insensitively; when both "rope_type" and "type" are given they must
 * agree. Factors are finite, in (FLT_MIN, 1e6]; llama3 needs high_freq_factor > low_freq_factor
 * and an integer original_max_position_embeddings in [1, 2^30] (required here). Keys other
 * types use are ignored. This is qs_json_rope_object(c, o, "rope_scaling") keeping the scaling:
 * its per-layer refusal and its checks of rope_theta / partial_rotary_factor apply too.
 * Errors: QS_JSON_ERR_VALUE (not an object, missing or bad factor, disagreeing type keys),
 * QS_JSON_ERR_UNSUPPORTED (another type: "dynamic", "yarn", ...). *out is zeroed (DEFAULT) first.
 */
enum qs_json_err qs_json_rope_scaling(const struct qs_json_ctx *c, const struct cJSON *o,
                                      struct qs_rope_scaling *out);

/* "linear", "llama3", "default" ("?" for other values): the rope_type a config writer emits. */
const char *qs_rope_type_name(enum qs_rope_type t);

#ifdef __cplusplus
}
#endif
#endif /* QS_JSON_H */
