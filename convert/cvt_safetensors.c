/*
 * cvt_safetensors.c - safetensors header parser and validator (hostile input).
 *
 * Entry points: cvt_safetensors_parse() (cvt_src.h), dtype tables cvt_dtype_str(),
 * cvt_dtype_size(), cvt_dtype_from_str(), cvt_tensor_list_free().
 *
 * Format (docs/FORMATS.md 9.1; huggingface/safetensors safetensors/src/tensor.rs): u64 LE header
 * length N, N bytes of UTF-8 JSON object {name: {"dtype", "shape", "data_offsets": [b, e]}, ...,
 * "__metadata__": {str: str}}, then the data region; offsets relative to its start, end
 * exclusive; valid files tile the region exactly. We check all of it and report the first
 * violation with file, tensor and numbers.
 *
 * Tested by tests/test_cvt_src.c (truncation at every byte, hostile headers) and fuzzed by
 * tests/fuzz_safetensors.c.
 */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>   /* cJSON_ParseWithLengthOpts: header JSON */

#include "cvt_src_int.h"
#include "qs_log.h"        /* qs_log_error */

#define ST_MAX_HEADER 100000000ull   /* safetensors library limit (docs/FORMATS.md 9.1) */
#define ST_MAX_INT    9007199254740992.0 /* 2^53: larger JSON numbers are not exact doubles */

static const struct {
    const char    *name;
    enum cvt_dtype dt;
    size_t         size;
} dtype_table[] = {
    {"F16", CVT_DT_F16, 2},         {"BF16", CVT_DT_BF16, 2},     {"F32", CVT_DT_F32, 4},
    {"F64", CVT_DT_F64, 8},         {"I8", CVT_DT_I8, 1},         {"U8", CVT_DT_U8, 1},
    {"I16", CVT_DT_I16, 2},         {"U16", CVT_DT_U16, 2},       {"I32", CVT_DT_I32, 4},
    {"U32", CVT_DT_U32, 4},         {"I64", CVT_DT_I64, 8},       {"U64", CVT_DT_U64, 8},
    {"BOOL", CVT_DT_BOOL, 1},       {"F8_E4M3", CVT_DT_F8_E4M3, 1},
    {"F8_E5M2", CVT_DT_F8_E5M2, 1}, {"F8_E8M0", CVT_DT_F8_E8M0, 1},
    {"F8_E4M3FNUZ", CVT_DT_F8_E4M3FNUZ, 1}, {"F8_E5M2FNUZ", CVT_DT_F8_E5M2FNUZ, 1},
    {"C64", CVT_DT_C64, 8},
};
#define N_DTYPES (sizeof dtype_table / sizeof dtype_table[0])

const char *cvt_dtype_str(enum cvt_dtype dt)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if (dtype_table[i].dt == dt)
            return dtype_table[i].name;
    return "UNKNOWN";
}

size_t cvt_dtype_size(enum cvt_dtype dt)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if (dtype_table[i].dt == dt)
            return dtype_table[i].size;
    return 0;
}

enum cvt_dtype cvt_dtype_from_str(const char *s)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if (strcmp(dtype_table[i].name, s) == 0)
            return dtype_table[i].dt;
    return CVT_DT_UNKNOWN;
}

bool cvt_grow(void **ptr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t ncap = *cap ? *cap : 16;
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2 / elem)
            return false;
        ncap *= 2;
    }
    void *p = realloc(*ptr, ncap * elem);
    if (!p)
        return false;
    *ptr = p;
    *cap = ncap;
    return true;
}

void cvt_tensor_list_free(struct cvt_tensor_list *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->n; i++)
        free((char *)l->t[i].name);
    free(l->t);
    l->t = NULL;
    l->n = 0;
}

/* JSON number -> exact non-negative integer < 2^53. */
static bool json_uint(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v))
        return false;
    double d = v->valuedouble;
    if (!(d >= 0.0) || d >= ST_MAX_INT || d != floor(d))
        return false;
    *out = (uint64_t)d;
    return true;
}

static int cmp_by_offset(const void *a, const void *b)
{
    const struct cvt_src_tensor *x = a, *y = b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes)
        return x->nbytes < y->nbytes ? -1 : 1;
    return 0;
}

/* Duplicate-name check: sort a copy of the name pointers. */
static int cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The 8-byte length and the JSON header of a safetensors image: bounded, inside the file and the
 * bytes available, an object of valid UTF-8 followed by whitespace only. *root receives the parse
 * tree (the caller deletes it), *hlen the header length. */
static enum cvt_err parse_header(const char *fname, const uint8_t *buf, size_t avail,
                                 uint64_t file_size, cJSON **root, uint64_t *hlen_out)
{
    *root = NULL;
    if (file_size < 8 || avail < 8) {
        qs_log_error("cvt_safetensors_parse", "file %s: %llu bytes, too short for the 8-byte safetensors header length",
                     fname, (unsigned long long)file_size);
        return CVT_ERR_SAFETENSORS;
    }
    uint64_t hlen = cvt_ld64(buf);
    if (hlen > ST_MAX_HEADER) {
        qs_log_error("cvt_safetensors_parse", "file %s: header length %llu exceeds the %llu-byte limit",
                     fname, (unsigned long long)hlen, ST_MAX_HEADER);
        return CVT_ERR_SAFETENSORS;
    }
    if (hlen < 2 || 8 + hlen > file_size) {
        qs_log_error("cvt_safetensors_parse", "file %s: header length %llu does not fit the file (%llu bytes): truncated or corrupt",
                     fname, (unsigned long long)hlen, (unsigned long long)file_size);
        return CVT_ERR_SAFETENSORS;
    }
    if (8 + hlen > avail) {
        qs_log_error("cvt_safetensors_parse", "file %s: header of %llu bytes not readable (%zu bytes available)",
                     fname, (unsigned long long)hlen, avail);
        return CVT_ERR_SAFETENSORS;
    }
    const uint8_t *hdr = buf + 8;
    if (hdr[0] != '{') {
        qs_log_error("cvt_safetensors_parse", "file %s: header does not start with '{' (byte 0x%02x)", fname, hdr[0]);
        return CVT_ERR_SAFETENSORS;
    }
    if (!cvt_utf8_valid(hdr, hlen)) {
        qs_log_error("cvt_safetensors_parse", "file %s: header is not valid UTF-8 (or contains NUL)", fname);
        return CVT_ERR_SAFETENSORS;
    }
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts((const char *)hdr, (size_t)hlen, &end, false);
    if (!j || !cJSON_IsObject(j)) {
        size_t at = end ? (size_t)(end - (const char *)hdr) : 0;
        qs_log_error("cvt_safetensors_parse", "file %s: header is not a JSON object (parse error near byte %zu of %llu)",
                     fname, at, (unsigned long long)hlen);
        cJSON_Delete(j);
        return CVT_ERR_SAFETENSORS;
    }
    /* Only padding spaces (or other JSON whitespace) may follow the object. */
    for (const char *p = end; p < (const char *)hdr + hlen; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            qs_log_error("cvt_safetensors_parse", "file %s: trailing garbage after the header JSON at byte %zu",
                         fname, (size_t)(p - (const char *)hdr));
            cJSON_Delete(j);
            return CVT_ERR_SAFETENSORS;
        }
    }
    *root = j;
    *hlen_out = hlen;
    return CVT_ERR_NONE;
}

/* "__metadata__": an object of strings. */
static enum cvt_err check_metadata(const char *fname, const cJSON *e)
{
    char pb[96];
    if (!cJSON_IsObject(e)) {
        qs_log_error("cvt_safetensors_parse", "file %s: __metadata__ is not an object", fname);
        return CVT_ERR_SAFETENSORS;
    }
    for (const cJSON *m = e->child; m; m = m->next)
        if (!cJSON_IsString(m)) {
            qs_log_error("cvt_safetensors_parse", "file %s: __metadata__ value of '%s' is not a string",
                         fname, cvt_printable(m->string, strlen(m->string), pb, sizeof pb));
            return CVT_ERR_SAFETENSORS;
        }
    return CVT_ERR_NONE;
}

/* Tensor entry e (named `name`) into t (t->name already set): dtype, shape, data_offsets inside
 * the data region [data_start, data_start + data_size) and matching dtype x shape. */
static enum cvt_err parse_entry(const char *fname, const char *name, const cJSON *e,
                                uint64_t data_start, uint64_t data_size, struct cvt_src_tensor *t)
{
    char pb[96];
    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    t->dtype = cvt_dtype_from_str(jd->valuestring);
    if (t->dtype == CVT_DT_UNKNOWN) {
        const char *d = jd->valuestring;
        bool subbyte = strcmp(d, "F4") == 0 || strcmp(d, "F6_E2M3") == 0 || strcmp(d, "F6_E3M2") == 0;
        qs_log_error("cvt_safetensors_parse", "file %s: tensor %s: %s dtype \"%s\"", fname, name,
                     subbyte ? "unsupported sub-byte" : "unknown",
                     cvt_printable(d, strlen(d), pb, sizeof pb));
        return CVT_ERR_DTYPE;
    }
    int nd = cJSON_GetArraySize(js);
    if (nd > CVT_MAX_DIMS) {
        qs_log_error("cvt_safetensors_parse", "file %s: tensor %s: %d dims, at most %d supported", fname, name,
                     nd, CVT_MAX_DIMS);
        return CVT_ERR_SAFETENSORS;
    }
    t->n_dims = nd;
    t->numel = 1;
    int d = 0;
    for (const cJSON *x = js->child; x; x = x->next, d++) {
        uint64_t v;
        if (!json_uint(x, &v) || !cvt_mul_ok(t->numel, (int64_t)v, &t->numel) ||
            t->numel > (INT64_MAX >> 4)) {
            qs_log_error("cvt_safetensors_parse", "file %s: tensor %s: shape[%d] is not a non-negative integer or the element count overflows",
                         fname, name, d);
            return CVT_ERR_SAFETENSORS;
        }
        t->shape[d] = (int64_t)v;
    }
    t->nbytes = (uint64_t)t->numel * cvt_dtype_size(t->dtype);
    uint64_t b, en;
    if (cJSON_GetArraySize(jo) != 2 || !json_uint(jo->child, &b) || !json_uint(jo->child->next, &en)) {
        qs_log_error("cvt_safetensors_parse", "file %s: tensor %s: data_offsets must be two non-negative integers",
                     fname, name);
        return CVT_ERR_SAFETENSORS;
    }
    if (en < b || en > data_size) {
        qs_log_error("cvt_safetensors_parse", "file %s: tensor %s: data_offsets [%llu, %llu] out of range (data region is %llu bytes)",
                     fname, name, (unsigned long long)b, (unsigned long long)en,
                     (unsigned long long)data_size);
        return CVT_ERR_SAFETENSORS;
    }
    if (en - b != t->nbytes) {
        qs_log_error("cvt_safetensors_parse", "file %s: tensor %s: data_offsets span %llu bytes, dtype %s x %lld elements needs %llu",
                     fname, name, (unsigned long long)(en - b), jd->valuestring,
                     (long long)t->numel, (unsigned long long)t->nbytes);
        return CVT_ERR_SAFETENSORS;
    }
    t->offset = data_start + b;
    t->contiguous = true;
    return CVT_ERR_NONE;
}

/* Every member of the header object: the metadata, or one tensor appended to *l. */
static enum cvt_err parse_entries(const char *fname, const cJSON *root, uint64_t data_start,
                                  uint64_t data_size, struct cvt_tensor_list *l)
{
    char pb[96];
    size_t cap = 0;
    for (const cJSON *e = root->child; e; e = e->next) {
        const char *name = e->string;
        if (!name || !name[0]) {
            qs_log_error("cvt_safetensors_parse", "file %s: empty tensor name", fname);
            return CVT_ERR_SAFETENSORS;
        }
        size_t nlen = strlen(name);
        if (!cvt_utf8_valid((const uint8_t *)name, nlen)) {
            qs_log_error("cvt_safetensors_parse", "file %s: tensor name '%s' is not valid UTF-8", fname,
                         cvt_printable(name, nlen, pb, sizeof pb));
            return CVT_ERR_SAFETENSORS;
        }
        if (strcmp(name, "__metadata__") == 0) {
            CVT_TRY(check_metadata(fname, e));
            continue;
        }
        if (!cJSON_IsObject(e)) {
            qs_log_error("cvt_safetensors_parse", "file %s: tensor %s: entry is not an object", fname, name);
            return CVT_ERR_SAFETENSORS;
        }
        if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(e, "dtype")) ||
            !cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(e, "shape")) ||
            !cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(e, "data_offsets"))) {
            qs_log_error("cvt_safetensors_parse", "file %s: tensor %s: needs string \"dtype\", array \"shape\" and array \"data_offsets\"",
                         fname, name);
            return CVT_ERR_SAFETENSORS;
        }
        if (!cvt_grow((void **)&l->t, &cap, l->n + 1, sizeof *l->t)) {
            qs_log_error("cvt_safetensors_parse", "file %s: out of memory for %zu tensors", fname, l->n + 1);
            return CVT_ERR_NOMEM;
        }
        struct cvt_src_tensor *t = &l->t[l->n];
        memset(t, 0, sizeof *t);
        t->name = strdup(name);
        if (!t->name) {
            qs_log_error("cvt_safetensors_parse", "file %s: out of memory", fname);
            return CVT_ERR_NOMEM;
        }
        l->n++;
        CVT_TRY(parse_entry(fname, name, e, data_start, data_size, t));
    }
    return CVT_ERR_NONE;
}

/* No name twice (cJSON keeps every member of an object, duplicates included). */
static enum cvt_err check_unique(const char *fname, const struct cvt_tensor_list *l)
{
    if (l->n < 2)
        return CVT_ERR_NONE;
    const char **names = malloc(l->n * sizeof *names);
    enum cvt_err err = CVT_ERR_NONE;
    if (!names) {
        qs_log_error("cvt_safetensors_parse", "file %s: out of memory", fname);
        return CVT_ERR_NOMEM;
    }
    for (size_t i = 0; i < l->n; i++)
        names[i] = l->t[i].name;
    qsort(names, l->n, sizeof *names, cmp_str_ptr);
    for (size_t i = 1; i < l->n && !err; i++)
        if (strcmp(names[i - 1], names[i]) == 0) {
            qs_log_error("cvt_safetensors_parse", "file %s: tensor %s appears twice in the header", fname, names[i]);
            err = CVT_ERR_SAFETENSORS;
        }
    free(names);
    return err;
}

/* Offsets must tile the data region exactly: sorted by begin, each starts where the previous
 * ended, the last ends at the end of the file. Sorts l by offset. */
static enum cvt_err check_tiling(const char *fname, struct cvt_tensor_list *l, uint64_t data_start,
                                 uint64_t file_size)
{
    qsort(l->t, l->n, sizeof *l->t, cmp_by_offset);
    uint64_t expect = data_start;
    for (size_t i = 0; i < l->n; i++) {
        const struct cvt_src_tensor *t = &l->t[i];
        if (t->offset != expect) {
            qs_log_error("cvt_safetensors_parse", "file %s: tensor %s: data begins at %llu, expected %llu (%s previous tensor)",
                         fname, t->name, (unsigned long long)(t->offset - data_start),
                         (unsigned long long)(expect - data_start),
                         t->offset < expect ? "overlaps the" : "hole after the");
            return CVT_ERR_SAFETENSORS;
        }
        expect += t->nbytes;
    }
    if (expect != file_size) {
        qs_log_error("cvt_safetensors_parse", "file %s: tensor data ends at byte %llu but the file has %llu bytes (%s)",
                     fname, (unsigned long long)expect, (unsigned long long)file_size,
                     expect < file_size ? "trailing bytes" : "truncated");
        return CVT_ERR_SAFETENSORS;
    }
    return CVT_ERR_NONE;
}

enum cvt_err cvt_safetensors_parse(const char *fname, const uint8_t *buf, size_t avail,
                                   uint64_t file_size, struct cvt_tensor_list *out)
{
    cJSON *root = NULL;
    struct cvt_tensor_list l = {0, NULL};
    uint64_t hlen = 0;
    out->n = 0;
    out->t = NULL;
    enum cvt_err err = parse_header(fname, buf, avail, file_size, &root, &hlen);
    if (err)
        return err;
    const uint64_t data_start = 8 + hlen;
    if (!(err = parse_entries(fname, root, data_start, file_size - data_start, &l)) &&
        !(err = check_unique(fname, &l)))
        err = check_tiling(fname, &l, data_start, file_size);
    cJSON_Delete(root);
    if (err) {
        cvt_tensor_list_free(&l);
        return err;
    }
    *out = l;
    return CVT_ERR_NONE;
}
