/*
 * cvt_torchbin.c - read PyTorch `torch.save` zip files (`pytorch_model*.bin`, llm-awq `*.pt`)
 * without Python: a ZIP reader for stored entries and a restricted unpickler that understands
 * only a state dict of tensors and never executes anything.
 *
 * Entry points: cvt_torchzip_parse(), cvt_pickle_parse_only() (cvt_src.h).
 *
 * Facts (docs/FORMATS.md 9.3, observed with torch 2.11; reading recipe as llama.cpp's legacy
 * convert.py `lazy_load_torch_file`): a plain ZIP (PKWARE APPNOTE 6.3: local header 0x04034b50,
 * central directory 0x02014b50, end record 0x06054b50, ZIP64 end record 0x06064b50 + locator
 * 0x07064b50, ZIP64 extra field id 0x0001) whose entries are all stored (method 0) under one top
 * folder; `<prefix>/data.pkl` is a protocol-2 pickle of a (Ordered)dict name -> tensor, tensors
 * are `torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad,
 * hooks[, metadata])` and storages are persistent ids ('storage', torch.<Kind>Storage, key,
 * location, numel) whose bytes are entry `<prefix>/data/<key>`.
 *
 * Unpickler rules: only the opcodes needed for that (plus the protocol 4/5 framing ones) are
 * accepted; GLOBAL must be collections.OrderedDict, torch._utils._rebuild_tensor_v2,
 * torch._utils._rebuild_parameter or a torch.*Storage class - anything else is CVT_ERR_PICKLE
 * naming it. Stack, mark stack, memo and object counts are bounded; every index is checked; no
 * recursion anywhere (so nesting depth cannot exhaust the C stack).
 *
 * Tested by tests/test_cvt_src.c (hand-built zips and hostile pickles) and fuzzed by
 * tests/fuzz_pickle.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>          /* crc32: data.pkl integrity */

#include "cvt_src_int.h"
#include "qs_log.h"        /* qs_log_error */

/* --- limits ---------------------------------------------------------------------------------- */
#define PKL_MAX_SIZE     (256u << 20)  /* data.pkl bytes (a 70B state dict pickle is < 1 MB) */
#define PKL_MAX_STACK    (1u << 20)
#define PKL_MAX_MARKS    (1u << 12)
#define PKL_MAX_MEMO     (1u << 22)
#define PKL_MAX_OBJECTS  (1u << 24)
#define ZIP_MAX_ENTRIES  (1u << 20)

/* --- ZIP ------------------------------------------------------------------------------------- */

struct zip_entry {
    const char *name;   /* into the buffer, not NUL-terminated */
    size_t      nlen;
    uint64_t    data;   /* absolute offset of the first data byte */
    uint64_t    size;
    uint32_t    crc;
};

struct zip {
    const char       *fname;
    const uint8_t    *buf;
    uint64_t          size;
    struct zip_entry *e;
    size_t            n;
    const struct zip_entry **sorted; /* entries sorted by name */
};

static int zip_name_cmp(const char *a, size_t an, const char *b, size_t bn)
{
    size_t m = an < bn ? an : bn;
    int c = memcmp(a, b, m);
    if (c)
        return c;
    return an < bn ? -1 : an > bn ? 1 : 0;
}

static int zip_sort_cmp(const void *x, const void *y)
{
    const struct zip_entry *a = *(const struct zip_entry *const *)x;
    const struct zip_entry *b = *(const struct zip_entry *const *)y;
    return zip_name_cmp(a->name, a->nlen, b->name, b->nlen);
}

static const struct zip_entry *zip_find(const struct zip *z, const char *name, size_t nlen)
{
    size_t lo = 0, hi = z->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const struct zip_entry *e = z->sorted[mid];
        int c = zip_name_cmp(e->name, e->nlen, name, nlen);
        if (c == 0)
            return e;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static void zip_close(struct zip *z)
{
    free(z->e);
    free(z->sorted);
    z->e = NULL;
    z->sorted = NULL;
    z->n = 0;
}

/* Read a ZIP64 extra field (id 0x0001) for the values that were 0xFFFFFFFF in the record. */
static bool zip64_extra(const uint8_t *ex, size_t exlen, bool need_usize, bool need_csize,
                        bool need_off, uint64_t *usize, uint64_t *csize, uint64_t *off)
{
    size_t p = 0;
    while (p + 4 <= exlen) {
        uint16_t id = cvt_ld16(ex + p), len = cvt_ld16(ex + p + 2);
        if (p + 4 + len > exlen)
            return false;
        if (id == 0x0001) {
            size_t q = p + 4, qend = p + 4 + len;
            if (need_usize) { if (q + 8 > qend) return false; *usize = cvt_ld64(ex + q); q += 8; }
            if (need_csize) { if (q + 8 > qend) return false; *csize = cvt_ld64(ex + q); q += 8; }
            if (need_off)   { if (q + 8 > qend) return false; *off = cvt_ld64(ex + q); }
            return true;
        }
        p += 4 + (size_t)len;
    }
    return !need_usize && !need_csize && !need_off;
}

static enum cvt_err zip_open(const char *fname, const uint8_t *buf, uint64_t size, struct zip *z)
{
    memset(z, 0, sizeof *z);
    z->fname = fname;
    z->buf = buf;
    z->size = size;
    if (size >= 2 && buf[0] == 0x80 && buf[1] <= 5) {
        qs_log_error(__func__, "file %s: legacy (pre-1.6, non-zip) torch file: re-save it with torch >= 1.6 or convert it to safetensors",
                     fname);
        return CVT_ERR_UNSUPPORTED;
    }
    if (size < 22 + 30 || cvt_ld32(buf) != 0x04034b50u) {
        qs_log_error(__func__, "file %s: not a zip archive (no local file header signature at byte 0)", fname);
        return CVT_ERR_ZIP;
    }
    /* End of central directory: last 22..22+65535 bytes. */
    uint64_t eocd = UINT64_MAX;
    uint64_t lo = size > 22 + 65535 ? size - 22 - 65535 : 0;
    for (uint64_t p = size - 22 + 1; p-- > lo;) {
        if (cvt_ld32(buf + p) == 0x06054b50u && p + 22 + cvt_ld16(buf + p + 20) <= size) {
            eocd = p;
            break;
        }
    }
    if (eocd == UINT64_MAX) {
        qs_log_error(__func__, "file %s: zip end-of-central-directory record not found (truncated?)", fname);
        return CVT_ERR_ZIP;
    }
    const uint8_t *E = buf + eocd;
    uint64_t n_entries = cvt_ld16(E + 10), cd_size = cvt_ld32(E + 12), cd_off = cvt_ld32(E + 16);
    if (cvt_ld16(E + 4) != 0 || cvt_ld16(E + 6) != 0) {
        qs_log_error(__func__, "file %s: multi-disk zip archives are not supported", fname);
        return CVT_ERR_ZIP;
    }
    if (n_entries == 0xffff || cd_size == 0xffffffffu || cd_off == 0xffffffffu) {
        /* ZIP64: locator 20 bytes before the EOCD points at the ZIP64 end record. */
        if (eocd < 20 || cvt_ld32(buf + eocd - 20) != 0x07064b50u) {
            qs_log_error(__func__, "file %s: zip64 sizes used but the zip64 locator is missing", fname);
            return CVT_ERR_ZIP;
        }
        uint64_t z64 = cvt_ld64(buf + eocd - 20 + 8);
        if (z64 > eocd - 20 || eocd - 20 - z64 < 56 || cvt_ld32(buf + z64) != 0x06064b50u) {
            qs_log_error(__func__, "file %s: zip64 end record at %llu is invalid", fname,
                         (unsigned long long)z64);
            return CVT_ERR_ZIP;
        }
        n_entries = cvt_ld64(buf + z64 + 32);
        cd_size = cvt_ld64(buf + z64 + 40);
        cd_off = cvt_ld64(buf + z64 + 48);
    }
    if (cd_off > size || cd_size > size - cd_off || cd_off + cd_size > eocd) {
        qs_log_error(__func__, "file %s: central directory [%llu, +%llu) outside the file (%llu bytes)",
                     fname, (unsigned long long)cd_off, (unsigned long long)cd_size,
                     (unsigned long long)size);
        return CVT_ERR_ZIP;
    }
    if (n_entries == 0 || n_entries > ZIP_MAX_ENTRIES || n_entries > cd_size / 46) {
        qs_log_error(__func__, "file %s: implausible zip entry count %llu (central directory %llu bytes)",
                     fname, (unsigned long long)n_entries, (unsigned long long)cd_size);
        return CVT_ERR_ZIP;
    }
    z->e = calloc((size_t)n_entries, sizeof *z->e);
    z->sorted = malloc((size_t)n_entries * sizeof *z->sorted);
    if (!z->e || !z->sorted) {
        zip_close(z);
        qs_log_error(__func__, "file %s: out of memory for %llu zip entries", fname,
                     (unsigned long long)n_entries);
        return CVT_ERR_NOMEM;
    }
    uint64_t p = cd_off;
    const uint64_t cd_end = cd_off + cd_size;
    char pb[96];
    for (uint64_t i = 0; i < n_entries; i++) {
        if (cd_end - p < 46 || cvt_ld32(buf + p) != 0x02014b50u) {
            qs_log_error(__func__, "file %s: central directory entry %llu at %llu is corrupt",
                         fname, (unsigned long long)i, (unsigned long long)p);
            goto out_err;
        }
        const uint8_t *C = buf + p;
        uint16_t flags = cvt_ld16(C + 8), method = cvt_ld16(C + 10);
        uint32_t crc = cvt_ld32(C + 16);
        uint64_t csize = cvt_ld32(C + 20), usize = cvt_ld32(C + 24);
        size_t nlen = cvt_ld16(C + 28), exlen = cvt_ld16(C + 30), cmlen = cvt_ld16(C + 32);
        uint64_t loff = cvt_ld32(C + 42);
        if (cd_end - p - 46 < (uint64_t)nlen + exlen + cmlen) {
            qs_log_error(__func__, "file %s: central directory entry %llu runs past the directory",
                         fname, (unsigned long long)i);
            goto out_err;
        }
        const char *name = (const char *)C + 46;
        if (!zip64_extra(C + 46 + nlen, exlen, usize == 0xffffffffu, csize == 0xffffffffu,
                         loff == 0xffffffffu, &usize, &csize, &loff)) {
            qs_log_error(__func__, "file %s: entry %s: zip64 extra field missing or short", fname,
                         cvt_printable(name, nlen, pb, sizeof pb));
            goto out_err;
        }
        if (flags & 0x1u) {
            qs_log_error(__func__, "file %s: entry %s is encrypted", fname, cvt_printable(name, nlen, pb, sizeof pb));
            goto out_err;
        }
        if (method != 0 || csize != usize) {
            qs_log_error(__func__, "file %s: entry %s is compressed (method %u): torch.save writes stored entries only",
                         fname, cvt_printable(name, nlen, pb, sizeof pb), method);
            goto out_err;
        }
        /* Data start from the LOCAL header (its extra field pads data to 64 bytes and differs
         * from the central one). */
        if (loff > size || size - loff < 30 || cvt_ld32(buf + loff) != 0x04034b50u) {
            qs_log_error(__func__, "file %s: entry %s: local header at %llu is missing or corrupt",
                         fname, cvt_printable(name, nlen, pb, sizeof pb), (unsigned long long)loff);
            goto out_err;
        }
        size_t lnlen = cvt_ld16(buf + loff + 26), lexlen = cvt_ld16(buf + loff + 28);
        uint64_t data = loff + 30 + lnlen + lexlen;
        if (data > size || lnlen != nlen || memcmp(buf + loff + 30, name, nlen) != 0) {
            qs_log_error(__func__, "file %s: entry %s: local header name disagrees with the central directory",
                         fname, cvt_printable(name, nlen, pb, sizeof pb));
            goto out_err;
        }
        if (usize > size - data || data + usize > cd_off) {
            qs_log_error(__func__, "file %s: entry %s: data [%llu, +%llu) runs past the file or into the directory (file %llu bytes)",
                         fname, cvt_printable(name, nlen, pb, sizeof pb), (unsigned long long)data,
                         (unsigned long long)usize, (unsigned long long)size);
            goto out_err;
        }
        z->e[i] = (struct zip_entry){name, nlen, data, usize, crc};
        z->sorted[i] = &z->e[i];
        p += 46 + nlen + exlen + cmlen;
    }
    z->n = (size_t)n_entries;
    qsort(z->sorted, z->n, sizeof *z->sorted, zip_sort_cmp);
    for (size_t i = 1; i < z->n; i++) {
        const struct zip_entry *a = z->sorted[i - 1], *b = z->sorted[i];
        if (zip_name_cmp(a->name, a->nlen, b->name, b->nlen) == 0) {
            qs_log_error(__func__, "file %s: zip entry %s appears twice", fname,
                         cvt_printable(b->name, b->nlen, pb, sizeof pb));
            goto out_err;
        }
    }
    return CVT_ERR_NONE;
out_err:
    zip_close(z);
    return CVT_ERR_ZIP;
}

/* --- unpickler ------------------------------------------------------------------------------- */

enum pv_kind {
    PV_NONE, PV_BOOL, PV_INT, PV_FLOAT, PV_STR, PV_TUPLE, PV_LIST, PV_DICT, PV_GLOBAL,
    PV_STORAGE, PV_TENSOR,
};

enum pv_global {
    G_ORDERED_DICT = 1, G_REBUILD_TENSOR_V2, G_REBUILD_PARAMETER, G_STORAGE,
};

struct pv {
    enum pv_kind kind;
    int64_t      i;            /* INT, BOOL */
    const char  *s;            /* STR: into the pickle buffer; GLOBAL: "module.name" of storages */
    size_t       slen;
    struct pv  **items;        /* TUPLE, LIST; DICT: key, value pairs */
    size_t       n, cap;
    enum pv_global g;          /* GLOBAL */
    enum cvt_dtype dt;         /* GLOBAL storage class, STORAGE, TENSOR */
    uint64_t     data, bytes, numel; /* STORAGE: location and size */
    struct pv   *storage;      /* TENSOR */
    int64_t      soff;
    int          nd;
    int64_t      shape[CVT_MAX_DIMS], stride[CVT_MAX_DIMS];
};

/* Resolves a storage key to (absolute data offset, byte size); NULL zip = synthetic. */
struct pkl {
    const char     *fname;
    const uint8_t  *p;
    size_t          size, pos;
    const struct zip *zip;
    const char     *prefix;   /* "<top>/" */
    size_t          prefix_len;
    struct pv     **objs;     /* every object, for freeing */
    size_t          n_objs, cap_objs;
    struct pv     **stack;
    size_t          sp, cap_stack;
    size_t         *marks;
    size_t          n_marks, cap_marks;
    struct pv     **memo;
    size_t          memo_cap;
    uint64_t        synth_off; /* parse-only mode: running fake offset */
};

static const struct {
    const char    *cls;
    enum cvt_dtype dt;
} storage_classes[] = {
    {"HalfStorage", CVT_DT_F16},  {"BFloat16Storage", CVT_DT_BF16}, {"FloatStorage", CVT_DT_F32},
    {"DoubleStorage", CVT_DT_F64}, {"IntStorage", CVT_DT_I32},      {"ShortStorage", CVT_DT_I16},
    {"LongStorage", CVT_DT_I64},  {"CharStorage", CVT_DT_I8},       {"ByteStorage", CVT_DT_U8},
    {"BoolStorage", CVT_DT_BOOL},
};

static const char *pv_kind_str(enum pv_kind k)
{
    static const char *const s[] = {"None", "bool", "int", "float", "str", "tuple", "list", "dict",
                                    "global", "storage", "tensor"};
    return (unsigned)k < sizeof s / sizeof s[0] ? s[k] : "?";
}

static struct pv *pv_new(struct pkl *P, enum pv_kind k)
{
    if (P->n_objs >= PKL_MAX_OBJECTS) {
        qs_log_error("cvt_unpickle", "file %s: pickle creates more than %u objects", P->fname, PKL_MAX_OBJECTS);
        return NULL;
    }
    if (!cvt_grow((void **)&P->objs, &P->cap_objs, P->n_objs + 1, sizeof *P->objs)) {
        qs_log_error("cvt_unpickle", "file %s: out of memory", P->fname);
        return NULL;
    }
    struct pv *v = calloc(1, sizeof *v);
    if (!v) {
        qs_log_error("cvt_unpickle", "file %s: out of memory", P->fname);
        return NULL;
    }
    v->kind = k;
    P->objs[P->n_objs++] = v;
    return v;
}

static void pkl_free(struct pkl *P)
{
    for (size_t i = 0; i < P->n_objs; i++) {
        free(P->objs[i]->items);
        free(P->objs[i]);
    }
    free(P->objs);
    free(P->stack);
    free(P->marks);
    free(P->memo);
    P->objs = NULL;
    P->stack = NULL;
    P->marks = NULL;
    P->memo = NULL;
}

static bool pv_append(struct pkl *P, struct pv *c, struct pv *item)
{
    if (!cvt_grow((void **)&c->items, &c->cap, c->n + 1, sizeof *c->items)) {
        qs_log_error("cvt_unpickle", "file %s: out of memory", P->fname);
        return false;
    }
    c->items[c->n++] = item;
    return true;
}

#define PKL_FAIL(P, ...)                               \
    do {                                               \
        qs_log_error("cvt_unpickle", __VA_ARGS__);     \
        return CVT_ERR_PICKLE;                         \
    } while (0)

static enum cvt_err push(struct pkl *P, struct pv *v)
{
    if (!v)
        return CVT_ERR_NOMEM;
    if (P->sp >= PKL_MAX_STACK)
        PKL_FAIL(P, "file %s: pickle stack deeper than %u at byte %zu", P->fname, PKL_MAX_STACK, P->pos);
    if (!cvt_grow((void **)&P->stack, &P->cap_stack, P->sp + 1, sizeof *P->stack)) {
        qs_log_error("cvt_unpickle", "file %s: out of memory", P->fname);
        return CVT_ERR_NOMEM;
    }
    P->stack[P->sp++] = v;
    return CVT_ERR_NONE;
}

/* Floor of the current frame: objects above the last MARK only. */
static size_t frame_floor(const struct pkl *P)
{
    return P->n_marks ? P->marks[P->n_marks - 1] : 0;
}

static enum cvt_err pop(struct pkl *P, struct pv **v)
{
    if (P->sp <= frame_floor(P))
        PKL_FAIL(P, "file %s: pickle stack underflow at byte %zu", P->fname, P->pos);
    *v = P->stack[--P->sp];
    return CVT_ERR_NONE;
}

static enum cvt_err top(struct pkl *P, struct pv **v)
{
    if (P->sp <= frame_floor(P))
        PKL_FAIL(P, "file %s: pickle stack underflow at byte %zu", P->fname, P->pos);
    *v = P->stack[P->sp - 1];
    return CVT_ERR_NONE;
}

/* Pop everything above the last MARK into a new container of kind k (TUPLE or LIST items). */
static enum cvt_err pop_mark(struct pkl *P, size_t *first)
{
    if (!P->n_marks)
        PKL_FAIL(P, "file %s: pickle opcode at byte %zu needs a MARK but none is open", P->fname, P->pos);
    *first = P->marks[--P->n_marks];
    return CVT_ERR_NONE;
}

static bool need(struct pkl *P, size_t n)
{
    if (P->size - P->pos < n) {
        qs_log_error("cvt_unpickle", "file %s: pickle truncated at byte %zu (opcode argument needs %zu bytes)",
                     P->fname, P->pos, n);
        return false;
    }
    return true;
}

static enum cvt_err memo_put(struct pkl *P, uint64_t idx)
{
    struct pv *v;
    CVT_TRY(top(P, &v));
    if (idx >= PKL_MAX_MEMO)
        PKL_FAIL(P, "file %s: pickle memo index %llu too large (limit %u)", P->fname,
                 (unsigned long long)idx, PKL_MAX_MEMO);
    if (idx >= P->memo_cap) {
        size_t ncap = P->memo_cap ? P->memo_cap : 64;
        while (ncap <= idx)
            ncap *= 2;
        struct pv **m = realloc(P->memo, ncap * sizeof *m);
        if (!m) {
            qs_log_error("cvt_unpickle", "file %s: out of memory", P->fname);
            return CVT_ERR_NOMEM;
        }
        memset(m + P->memo_cap, 0, (ncap - P->memo_cap) * sizeof *m);
        P->memo = m;
        P->memo_cap = ncap;
    }
    P->memo[idx] = v;
    return CVT_ERR_NONE;
}

static enum cvt_err memo_get(struct pkl *P, uint64_t idx)
{
    if (idx >= P->memo_cap || !P->memo[idx])
        PKL_FAIL(P, "file %s: pickle memo index %llu out of range (never stored) at byte %zu",
                 P->fname, (unsigned long long)idx, P->pos);
    return push(P, P->memo[idx]);
}

static enum cvt_err do_global(struct pkl *P, const char *mod, size_t mlen, const char *name, size_t nlen)
{
    char pm[80], pn[80];
    struct pv *g = NULL;
    bool allowed = true;
#define IS(s, l, lit) ((l) == sizeof(lit) - 1 && memcmp((s), (lit), (l)) == 0)
    if (IS(mod, mlen, "collections") && IS(name, nlen, "OrderedDict")) {
        g = pv_new(P, PV_GLOBAL);
        if (g) g->g = G_ORDERED_DICT;
    } else if (IS(mod, mlen, "torch._utils") && IS(name, nlen, "_rebuild_tensor_v2")) {
        g = pv_new(P, PV_GLOBAL);
        if (g) g->g = G_REBUILD_TENSOR_V2;
    } else if (IS(mod, mlen, "torch._utils") && IS(name, nlen, "_rebuild_parameter")) {
        g = pv_new(P, PV_GLOBAL);
        if (g) g->g = G_REBUILD_PARAMETER;
    } else if (IS(mod, mlen, "torch")) {
        allowed = false;
        for (size_t i = 0; i < sizeof storage_classes / sizeof storage_classes[0]; i++)
            if (nlen == strlen(storage_classes[i].cls) && memcmp(name, storage_classes[i].cls, nlen) == 0) {
                allowed = true;
                g = pv_new(P, PV_GLOBAL);
                if (g) {
                    g->g = G_STORAGE;
                    g->dt = storage_classes[i].dt;
                }
                break;
            }
        if (!allowed)
            goto forbidden;
    } else {
        goto forbidden;
    }
#undef IS
    return push(P, g);
forbidden:
    PKL_FAIL(P, "file %s: pickle asks for GLOBAL '%s %s' at byte %zu: only torch tensor rebuilds and storages are allowed (refusing to run code)",
             P->fname, cvt_printable(mod, mlen, pm, sizeof pm), cvt_printable(name, nlen, pn, sizeof pn), P->pos);
}

/* Tuple of ints -> dims. */
static enum cvt_err int_tuple(struct pkl *P, const struct pv *t, const char *what, int64_t *out, int *n)
{
    if (t->kind != PV_TUPLE)
        PKL_FAIL(P, "file %s: tensor %s is a %s, expected a tuple", P->fname, what, pv_kind_str(t->kind));
    if (t->n > CVT_MAX_DIMS)
        PKL_FAIL(P, "file %s: tensor %s has %zu dims, at most %d supported", P->fname, what, t->n, CVT_MAX_DIMS);
    for (size_t i = 0; i < t->n; i++) {
        if (t->items[i]->kind != PV_INT || t->items[i]->i < 0)
            PKL_FAIL(P, "file %s: tensor %s[%zu] is not a non-negative int", P->fname, what, i);
        out[i] = t->items[i]->i;
    }
    *n = (int)t->n;
    return CVT_ERR_NONE;
}

static enum cvt_err do_persid(struct pkl *P)
{
    struct pv *pid;
    char pb[80];
    CVT_TRY(pop(P, &pid));
    if (pid->kind != PV_TUPLE || pid->n != 5 || pid->items[0]->kind != PV_STR ||
        !(pid->items[0]->slen == 7 && memcmp(pid->items[0]->s, "storage", 7) == 0) ||
        pid->items[1]->kind != PV_GLOBAL || pid->items[1]->g != G_STORAGE ||
        pid->items[2]->kind != PV_STR || pid->items[3]->kind != PV_STR ||
        pid->items[4]->kind != PV_INT || pid->items[4]->i < 0)
        PKL_FAIL(P, "file %s: persistent id at byte %zu is not ('storage', torch.<Kind>Storage, key, location, numel)",
                 P->fname, P->pos);
    struct pv *s = pv_new(P, PV_STORAGE);
    if (!s)
        return CVT_ERR_NOMEM;
    s->dt = pid->items[1]->dt;
    s->numel = (uint64_t)pid->items[4]->i;
    const char *key = pid->items[2]->s;
    size_t klen = pid->items[2]->slen;
    size_t esz = cvt_dtype_size(s->dt);
    if (s->numel > (UINT64_MAX >> 4) / esz)
        PKL_FAIL(P, "file %s: storage %s: numel %llu too large", P->fname, cvt_printable(key, klen, pb, sizeof pb),
                 (unsigned long long)s->numel);
    s->bytes = s->numel * esz;
    if (!P->zip) { /* parse-only: synthetic, non-overlapping locations */
        s->data = P->synth_off;
        P->synth_off += s->bytes;
        if (P->synth_off > (UINT64_MAX >> 2))
            PKL_FAIL(P, "file %s: storages too large", P->fname);
        return push(P, s);
    }
    /* Entry "<prefix>data/<key>". */
    char ename[512];
    if (klen == 0 || klen > 200 || memchr(key, '/', klen))
        PKL_FAIL(P, "file %s: storage key '%s' is not a plain record name", P->fname, cvt_printable(key, klen, pb, sizeof pb));
    int en = snprintf(ename, sizeof ename, "%.*sdata/%.*s", (int)P->prefix_len, P->prefix, (int)klen, key);
    const struct zip_entry *e = (en > 0 && (size_t)en < sizeof ename) ? zip_find(P->zip, ename, (size_t)en) : NULL;
    if (!e)
        PKL_FAIL(P, "file %s: storage key '%s' has no archive record %s", P->fname,
                 cvt_printable(key, klen, pb, sizeof pb), en > 0 ? ename : "?");
    if (e->size != s->bytes)
        PKL_FAIL(P, "file %s: record %s holds %llu bytes, storage of %llu x %s needs %llu", P->fname, ename,
                 (unsigned long long)e->size, (unsigned long long)s->numel, cvt_dtype_str(s->dt),
                 (unsigned long long)s->bytes);
    s->data = e->data;
    return push(P, s);
}

static enum cvt_err do_reduce(struct pkl *P)
{
    struct pv *args, *fn;
    CVT_TRY(pop(P, &args));
    CVT_TRY(pop(P, &fn));
    if (fn->kind != PV_GLOBAL || args->kind != PV_TUPLE)
        PKL_FAIL(P, "file %s: REDUCE at byte %zu applies a %s to a %s: only allowed GLOBALs may be called",
                 P->fname, P->pos, pv_kind_str(fn->kind), pv_kind_str(args->kind));
    switch (fn->g) {
    case G_ORDERED_DICT:
        if (args->n != 0)
            PKL_FAIL(P, "file %s: OrderedDict called with %zu arguments at byte %zu", P->fname, args->n, P->pos);
        return push(P, pv_new(P, PV_DICT));
    case G_REBUILD_PARAMETER:
        if (args->n != 3 || args->items[0]->kind != PV_TENSOR)
            PKL_FAIL(P, "file %s: _rebuild_parameter at byte %zu needs (tensor, requires_grad, hooks)", P->fname, P->pos);
        return push(P, args->items[0]);
    case G_REBUILD_TENSOR_V2: {
        if ((args->n != 6 && args->n != 7) || args->items[0]->kind != PV_STORAGE ||
            args->items[1]->kind != PV_INT || args->items[1]->i < 0)
            PKL_FAIL(P, "file %s: _rebuild_tensor_v2 at byte %zu needs (storage, offset, size, stride, requires_grad, hooks[, metadata])",
                     P->fname, P->pos);
        struct pv *t = pv_new(P, PV_TENSOR);
        if (!t)
            return CVT_ERR_NOMEM;
        int nst = 0;
        t->storage = args->items[0];
        t->dt = t->storage->dt;
        t->soff = args->items[1]->i;
        CVT_TRY(int_tuple(P, args->items[2], "size", t->shape, &t->nd));
        CVT_TRY(int_tuple(P, args->items[3], "stride", t->stride, &nst));
        if (nst != t->nd)
            PKL_FAIL(P, "file %s: tensor at byte %zu has %d sizes but %d strides", P->fname, P->pos, t->nd, nst);
        return push(P, t);
    }
    case G_STORAGE:
    default:
        PKL_FAIL(P, "file %s: REDUCE at byte %zu calls a storage class: not allowed", P->fname, P->pos);
    }
}

/* BINPUT, LONG_BINPUT, MEMOIZE, BINGET, LONG_BINGET: the memo. */
static enum cvt_err op_memo(struct pkl *P, uint8_t op)
{
    uint64_t u;
    switch (op) {
    case 'q': /* BINPUT */
        if (!need(P, 1)) return CVT_ERR_PICKLE;
        CVT_TRY(memo_put(P, P->p[P->pos]));
        P->pos += 1;
        break;
    case 'r': /* LONG_BINPUT */
        if (!need(P, 4)) return CVT_ERR_PICKLE;
        CVT_TRY(memo_put(P, cvt_ld32(P->p + P->pos)));
        P->pos += 4;
        break;
    case 0x94: { /* MEMOIZE: next free index = number stored so far (protocol 4) */
        size_t cnt = 0;
        while (cnt < P->memo_cap && P->memo[cnt])
            cnt++;
        CVT_TRY(memo_put(P, cnt));
        break;
    }
    case 'h': /* BINGET */
        if (!need(P, 1)) return CVT_ERR_PICKLE;
        u = P->p[P->pos];
        P->pos += 1;
        CVT_TRY(memo_get(P, u));
        break;
    case 'j': /* LONG_BINGET */
        if (!need(P, 4)) return CVT_ERR_PICKLE;
        u = cvt_ld32(P->p + P->pos);
        P->pos += 4;
        CVT_TRY(memo_get(P, u));
        break;
    }
    return CVT_ERR_NONE;
}

/* MARK and the opcodes that build or fill tuples, lists and dicts. */
static enum cvt_err op_container(struct pkl *P, uint8_t op, size_t at)
{
    struct pv *v, *k, *c;
    size_t first;
    switch (op) {
    case '(': /* MARK */
        if (P->n_marks >= PKL_MAX_MARKS)
            PKL_FAIL(P, "file %s: more than %u nested MARKs at byte %zu", P->fname, PKL_MAX_MARKS, at);
        if (!cvt_grow((void **)&P->marks, &P->cap_marks, P->n_marks + 1, sizeof *P->marks))
            return CVT_ERR_NOMEM;
        P->marks[P->n_marks++] = P->sp;
        break;
    case 't': /* TUPLE */
    case 'l': /* LIST */
        CVT_TRY(pop_mark(P, &first));
        c = pv_new(P, op == 't' ? PV_TUPLE : PV_LIST);
        if (!c) return CVT_ERR_NOMEM;
        for (size_t i = first; i < P->sp; i++)
            if (!pv_append(P, c, P->stack[i])) return CVT_ERR_NOMEM;
        P->sp = first;
        CVT_TRY(push(P, c));
        break;
    case ')': /* EMPTY_TUPLE */
        CVT_TRY(push(P, pv_new(P, PV_TUPLE)));
        break;
    case 0x85: case 0x86: case 0x87: { /* TUPLE1..3 */
        size_t cnt = (size_t)(op - 0x84);
        if (P->sp < frame_floor(P) + cnt)
            PKL_FAIL(P, "file %s: TUPLE%zu at byte %zu: stack underflow", P->fname, cnt, at);
        c = pv_new(P, PV_TUPLE);
        if (!c) return CVT_ERR_NOMEM;
        for (size_t i = P->sp - cnt; i < P->sp; i++)
            if (!pv_append(P, c, P->stack[i])) return CVT_ERR_NOMEM;
        P->sp -= cnt;
        CVT_TRY(push(P, c));
        break;
    }
    case '}': /* EMPTY_DICT */
        CVT_TRY(push(P, pv_new(P, PV_DICT)));
        break;
    case ']': /* EMPTY_LIST */
        CVT_TRY(push(P, pv_new(P, PV_LIST)));
        break;
    case 'a': /* APPEND */
        CVT_TRY(pop(P, &v));
        CVT_TRY(top(P, &c));
        if (c->kind != PV_LIST)
            PKL_FAIL(P, "file %s: APPEND at byte %zu to a %s", P->fname, at, pv_kind_str(c->kind));
        if (!pv_append(P, c, v)) return CVT_ERR_NOMEM;
        break;
    case 'e': /* APPENDS */
    case 'u': /* SETITEMS */
        CVT_TRY(pop_mark(P, &first));
        if (P->sp <= frame_floor(P) || first == 0)
            PKL_FAIL(P, "file %s: %s at byte %zu without a container", P->fname, op == 'e' ? "APPENDS" : "SETITEMS", at);
        c = P->stack[first - 1];
        if ((op == 'e' && c->kind != PV_LIST) || (op == 'u' && c->kind != PV_DICT))
            PKL_FAIL(P, "file %s: %s at byte %zu on a %s", P->fname, op == 'e' ? "APPENDS" : "SETITEMS", at,
                     pv_kind_str(c->kind));
        if (op == 'u' && (P->sp - first) % 2)
            PKL_FAIL(P, "file %s: SETITEMS at byte %zu with an odd number of items", P->fname, at);
        for (size_t i = first; i < P->sp; i++)
            if (!pv_append(P, c, P->stack[i])) return CVT_ERR_NOMEM;
        P->sp = first;
        break;
    case 's': /* SETITEM */
        CVT_TRY(pop(P, &v));
        CVT_TRY(pop(P, &k));
        CVT_TRY(top(P, &c));
        if (c->kind != PV_DICT)
            PKL_FAIL(P, "file %s: SETITEM at byte %zu on a %s", P->fname, at, pv_kind_str(c->kind));
        if (!pv_append(P, c, k) || !pv_append(P, c, v)) return CVT_ERR_NOMEM;
        break;
    }
    return CVT_ERR_NONE;
}

/* Strings, integers, floats, booleans and None. */
static enum cvt_err op_scalar(struct pkl *P, uint8_t op, size_t at)
{
    struct pv *v;
    uint64_t u;
    switch (op) {
    case 'X': case 0x8c: case 0x8d: { /* BINUNICODE, SHORT_BINUNICODE, BINUNICODE8 */
        size_t lb = op == 'X' ? 4 : op == 0x8c ? 1 : 8;
        if (!need(P, lb)) return CVT_ERR_PICKLE;
        u = lb == 4 ? cvt_ld32(P->p + P->pos) : lb == 1 ? P->p[P->pos] : cvt_ld64(P->p + P->pos);
        P->pos += lb;
        if (u > P->size - P->pos)
            PKL_FAIL(P, "file %s: string of %llu bytes at byte %zu runs past the pickle", P->fname,
                     (unsigned long long)u, at);
        v = pv_new(P, PV_STR);
        if (!v) return CVT_ERR_NOMEM;
        v->s = (const char *)P->p + P->pos;
        v->slen = (size_t)u;
        P->pos += (size_t)u;
        CVT_TRY(push(P, v));
        break;
    }
    case 'K': case 'M': case 'J': { /* BININT1, BININT2, BININT */
        size_t lb = op == 'K' ? 1 : op == 'M' ? 2 : 4;
        if (!need(P, lb)) return CVT_ERR_PICKLE;
        v = pv_new(P, PV_INT);
        if (!v) return CVT_ERR_NOMEM;
        v->i = lb == 1 ? P->p[P->pos] : lb == 2 ? cvt_ld16(P->p + P->pos) : (int32_t)cvt_ld32(P->p + P->pos);
        P->pos += lb;
        CVT_TRY(push(P, v));
        break;
    }
    case 0x8a: { /* LONG1 */
        if (!need(P, 1)) return CVT_ERR_PICKLE;
        size_t nb = P->p[P->pos++];
        if (nb > 8)
            PKL_FAIL(P, "file %s: LONG1 of %zu bytes at byte %zu: integers beyond 64 bits not supported", P->fname, nb, at);
        if (!need(P, nb)) return CVT_ERR_PICKLE;
        uint64_t x = 0;
        for (size_t i = 0; i < nb; i++)
            x |= (uint64_t)P->p[P->pos + i] << (8 * i);
        if (nb > 0 && nb < 8 && (P->p[P->pos + nb - 1] & 0x80)) /* sign-extend */
            x |= ~0ull << (8 * nb);
        P->pos += nb;
        v = pv_new(P, PV_INT);
        if (!v) return CVT_ERR_NOMEM;
        memcpy(&v->i, &x, 8);
        CVT_TRY(push(P, v));
        break;
    }
    case 'G': { /* BINFLOAT (big-endian double) */
        if (!need(P, 8)) return CVT_ERR_PICKLE;
        v = pv_new(P, PV_FLOAT);
        if (!v) return CVT_ERR_NOMEM;
        P->pos += 8;
        CVT_TRY(push(P, v));
        break;
    }
    case 0x88: case 0x89: /* NEWTRUE, NEWFALSE */
        v = pv_new(P, PV_BOOL);
        if (!v) return CVT_ERR_NOMEM;
        v->i = op == 0x88;
        CVT_TRY(push(P, v));
        break;
    case 'N': /* NONE */
        CVT_TRY(push(P, pv_new(P, PV_NONE)));
        break;
    }
    return CVT_ERR_NONE;
}

/* Run the VM until STOP; *result = the single object left. */
static enum cvt_err pkl_run(struct pkl *P, struct pv **result)
{
    *result = NULL;
    while (P->pos < P->size) {
        size_t at = P->pos;
        uint8_t op = P->p[P->pos++];
        struct pv *v, *k, *c;
        switch (op) {
        case 0x80: /* PROTO */
            if (!need(P, 1)) return CVT_ERR_PICKLE;
            if (P->p[P->pos] > 5)
                PKL_FAIL(P, "file %s: pickle protocol %u not supported", P->fname, P->p[P->pos]);
            P->pos += 1;
            break;
        case 0x95: /* FRAME */
            if (!need(P, 8)) return CVT_ERR_PICKLE;
            P->pos += 8;
            break;
        case '.': /* STOP */
            if (P->n_marks || P->sp != 1)
                PKL_FAIL(P, "file %s: pickle STOP at byte %zu with %zu objects and %zu open MARKs on the stack",
                         P->fname, at, P->sp, P->n_marks);
            *result = P->stack[0];
            return CVT_ERR_NONE;
        case 'c': { /* GLOBAL module\nname\n */
            const char *m = (const char *)P->p + P->pos;
            size_t lim = P->size - P->pos < 512 ? P->size - P->pos : 512;
            const char *nl1 = memchr(m, '\n', lim);
            if (!nl1)
                PKL_FAIL(P, "file %s: GLOBAL at byte %zu: unterminated module name", P->fname, at);
            const char *n = nl1 + 1;
            size_t lim2 = lim - (size_t)(n - m);
            const char *nl2 = memchr(n, '\n', lim2);
            if (!nl2)
                PKL_FAIL(P, "file %s: GLOBAL at byte %zu: unterminated name", P->fname, at);
            P->pos += (size_t)(nl2 + 1 - m);
            CVT_TRY(do_global(P, m, (size_t)(nl1 - m), n, (size_t)(nl2 - n)));
            break;
        }
        case 0x93: /* STACK_GLOBAL */
            CVT_TRY(pop(P, &v));
            CVT_TRY(pop(P, &k));
            if (k->kind != PV_STR || v->kind != PV_STR)
                PKL_FAIL(P, "file %s: STACK_GLOBAL at byte %zu needs two strings", P->fname, at);
            CVT_TRY(do_global(P, k->s, k->slen, v->s, v->slen));
            break;
        case 'q': case 'r': case 0x94: case 'h': case 'j':
            CVT_TRY(op_memo(P, op));
            break;
        case '(': case 't': case 'l': case ')': case 0x85: case 0x86: case 0x87: case '}':
        case ']': case 'a': case 'e': case 'u': case 's':
            CVT_TRY(op_container(P, op, at));
            break;
        case 'X': case 0x8c: case 0x8d: case 'K': case 'M': case 'J': case 0x8a: case 'G':
        case 0x88: case 0x89: case 'N':
            CVT_TRY(op_scalar(P, op, at));
            break;
        case 'Q': /* BINPERSID */
            CVT_TRY(do_persid(P));
            break;
        case 'R': /* REDUCE */
            CVT_TRY(do_reduce(P));
            break;
        case 'b': /* BUILD: only the state-dict _metadata on a dict is accepted (and ignored) */
            CVT_TRY(pop(P, &v));
            CVT_TRY(top(P, &c));
            if (c->kind != PV_DICT)
                PKL_FAIL(P, "file %s: BUILD at byte %zu on a %s: only dict state is accepted", P->fname, at,
                         pv_kind_str(c->kind));
            break;
        default:
            PKL_FAIL(P, "file %s: pickle opcode 0x%02x ('%c') at byte %zu is not allowed", P->fname, op,
                     op >= 0x20 && op < 0x7f ? op : '?', at);
        }
    }
    PKL_FAIL(P, "file %s: pickle ends without STOP (%zu bytes)", P->fname, P->size);
}

/* Turn the result dict into catalog entries. */
static enum cvt_err pkl_collect(struct pkl *P, const struct pv *root, struct cvt_tensor_list *out)
{
    char pb[96];
    if (root->kind != PV_DICT)
        PKL_FAIL(P, "file %s: pickle holds a %s, expected a state dict", P->fname, pv_kind_str(root->kind));
    size_t n = root->n / 2;
    struct cvt_tensor_list l = {0, NULL};
    if (n) {
        l.t = calloc(n, sizeof *l.t);
        if (!l.t) {
            qs_log_error("cvt_unpickle", "file %s: out of memory", P->fname);
            return CVT_ERR_NOMEM;
        }
    }
    enum cvt_err err = CVT_ERR_PICKLE;
    for (size_t i = 0; i < n; i++) {
        const struct pv *k = root->items[2 * i], *v = root->items[2 * i + 1];
        if (k->kind != PV_STR || k->slen == 0 || !cvt_utf8_valid((const uint8_t *)k->s, k->slen)) {
            qs_log_error("cvt_unpickle", "file %s: state dict key %zu is not a non-empty UTF-8 string", P->fname, i);
            goto out_err;
        }
        if (v->kind != PV_TENSOR) {
            qs_log_error("cvt_unpickle", "file %s: state dict entry '%s' is a %s, expected a tensor", P->fname,
                         cvt_printable(k->s, k->slen, pb, sizeof pb), pv_kind_str(v->kind));
            goto out_err;
        }
        struct cvt_src_tensor *t = &l.t[l.n];
        char *name = malloc(k->slen + 1);
        if (!name) {
            err = CVT_ERR_NOMEM;
            qs_log_error("cvt_unpickle", "file %s: out of memory", P->fname);
            goto out_err;
        }
        memcpy(name, k->s, k->slen);
        name[k->slen] = 0;
        t->name = name;
        l.n++;
        t->dtype = v->dt;
        t->n_dims = v->nd;
        memcpy(t->shape, v->shape, sizeof t->shape);
        size_t esz = cvt_dtype_size(v->dt);
        /* numel, contiguity and the highest element index touched, all overflow-checked. */
        int64_t numel = 1, expect_stride = 1, maxidx = v->soff;
        bool contig = true, ok = true;
        for (int d = v->nd - 1; d >= 0; d--) {
            ok = ok && cvt_mul_ok(numel, v->shape[d], &numel) && numel <= (INT64_MAX >> 4);
            if (v->shape[d] != 1 && v->stride[d] != expect_stride)
                contig = false;
            int64_t span;
            ok = ok && cvt_mul_ok(v->shape[d] ? v->shape[d] - 1 : 0, v->stride[d], &span) &&
                 !__builtin_add_overflow(maxidx, span, &maxidx);
            if (ok)
                ok = cvt_mul_ok(expect_stride, v->shape[d], &expect_stride);
        }
        if (!ok) {
            err = CVT_ERR_SHAPE;
            qs_log_error("cvt_unpickle", "file %s: tensor %s: size/stride arithmetic overflows", P->fname, name);
            goto out_err;
        }
        if (numel > 0 && (uint64_t)maxidx >= v->storage->numel) {
            err = CVT_ERR_SHAPE;
            qs_log_error("cvt_unpickle", "file %s: tensor %s: view reaches element %lld of a storage of %llu elements",
                         P->fname, name, (long long)maxidx, (unsigned long long)v->storage->numel);
            goto out_err;
        }
        t->numel = numel;
        t->nbytes = (uint64_t)numel * esz;
        t->offset = v->storage->data + (uint64_t)v->soff * esz;
        t->contiguous = contig;
        t->file = 0;
    }
    *out = l;
    return CVT_ERR_NONE;
out_err:
    cvt_tensor_list_free(&l);
    return err;
}

static enum cvt_err pkl_parse(const char *fname, const uint8_t *pkl, size_t size, const struct zip *zip,
                              const char *prefix, size_t prefix_len, struct cvt_tensor_list *out)
{
    struct pkl P;
    memset(&P, 0, sizeof P);
    P.fname = fname;
    P.p = pkl;
    P.size = size;
    P.zip = zip;
    P.prefix = prefix;
    P.prefix_len = prefix_len;
    out->n = 0;
    out->t = NULL;
    if (size > PKL_MAX_SIZE) {
        qs_log_error("cvt_unpickle", "file %s: data.pkl of %zu bytes exceeds the %u-byte limit", fname, size, PKL_MAX_SIZE);
        return CVT_ERR_PICKLE;
    }
    struct pv *root;
    enum cvt_err err = pkl_run(&P, &root);
    if (err == CVT_ERR_NONE)
        err = pkl_collect(&P, root, out);
    pkl_free(&P);
    return err;
}

enum cvt_err cvt_pickle_parse_only(const char *fname, const uint8_t *pkl, size_t size,
                                   struct cvt_tensor_list *out)
{
    return pkl_parse(fname, pkl, size, NULL, "", 0, out);
}

enum cvt_err cvt_torchzip_parse(const char *fname, const uint8_t *buf, uint64_t size,
                                struct cvt_tensor_list *out)
{
    struct zip z;
    char pb[96];
    out->n = 0;
    out->t = NULL;
    CVT_TRY(zip_open(fname, buf, size, &z));
    enum cvt_err err = CVT_ERR_ZIP;
    /* The one "<top>/data.pkl" record names the prefix (its top folder varies). */
    const struct zip_entry *pk = NULL;
    for (size_t i = 0; i < z.n; i++) {
        const struct zip_entry *e = &z.e[i];
        if (e->nlen >= 9 && memcmp(e->name + e->nlen - 9, "/data.pkl", 9) == 0 &&
            memchr(e->name, '/', e->nlen - 9) == NULL) {
            if (pk) {
                qs_log_error(__func__, "file %s: more than one data.pkl record (%s and %s)", fname,
                             cvt_printable(pk->name, pk->nlen, pb, sizeof pb), "another");
                goto out;
            }
            pk = e;
        }
    }
    if (!pk) {
        qs_log_error(__func__, "file %s: no <folder>/data.pkl record: not a torch.save archive", fname);
        goto out;
    }
    size_t plen = pk->nlen - 8; /* keep the '/' */
    char rec[600];
    if (plen > 400) {
        qs_log_error(__func__, "file %s: archive folder name too long", fname);
        goto out;
    }
    int rn = snprintf(rec, sizeof rec, "%.*sbyteorder", (int)plen, pk->name);
    const struct zip_entry *bo = zip_find(&z, rec, (size_t)rn);
    if (bo) {
        size_t bl = (size_t)bo->size;
        const char *b = (const char *)buf + bo->data;
        while (bl && (b[bl - 1] == '\n' || b[bl - 1] == '\r' || b[bl - 1] == ' '))
            bl--;
        if (!(bl == 6 && memcmp(b, "little", 6) == 0)) {
            qs_log_error(__func__, "file %s: byteorder record says '%s', only little-endian archives are supported",
                         fname, cvt_printable(b, bl, pb, sizeof pb));
            err = CVT_ERR_UNSUPPORTED;
            goto out;
        }
    }
    if (pk->size > PKL_MAX_SIZE) {
        qs_log_error(__func__, "file %s: data.pkl of %llu bytes exceeds the %u-byte limit", fname,
                     (unsigned long long)pk->size, PKL_MAX_SIZE);
        err = CVT_ERR_PICKLE;
        goto out;
    }
    uint32_t crc = (uint32_t)crc32(0L, buf + pk->data, (uInt)pk->size);
    if (crc != pk->crc) {
        qs_log_error(__func__, "file %s: data.pkl CRC-32 is %08x, the directory says %08x (corrupt download?)",
                     fname, crc, pk->crc);
        goto out;
    }
    err = pkl_parse(fname, buf + pk->data, (size_t)pk->size, &z, pk->name, plen, out);
out:
    zip_close(&z);
    return err;
}
