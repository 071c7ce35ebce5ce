/*
 * t_cvt_src.h - builders shared by the converter input-side tests (tests/test_cvt_src.c,
 * test_cvt_hostile.c, test_cvt_config.c): a byte buffer, a safetensors writer, a torch zip +
 * pickle writer, a canonical random AWQ linear and its four on-disk packings written forward
 * from the format facts (AWQ's nibble orders; not the converter's decoder), scratch files.
 * Test-only.
 */
#ifndef QS_T_CVT_SRC_H
#define QS_T_CVT_SRC_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h> /* INDEX.json of the fixtures */
#include <zlib.h>        /* crc32 for hand-built zips */

#include "cvt_src.h"
#include "qs_log.h"
#include "t.h"
#include "t_file.h" /* t_slurp */

/* --- small utilities ------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static inline uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static inline float h2f(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 31, m = h & 0x3ff, bits;
    if (e == 0) {
        float f = (float)m * 0x1p-24f;
        return sign ? -f : f;
    }
    bits = e == 31 ? sign | 0x7f800000u | (m << 13) : sign | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Exact fp16 of a value known representable (power-of-two scaled small mantissa). */
static inline uint16_t f2h_exact(float f)
{
    uint16_t sign = f < 0 ? 0x8000 : 0;
    float a = fabsf(f);
    for (uint32_t h = 0; h < 0x7c00; h++)
        if (h2f((uint16_t)h) == a)
            return (uint16_t)(h | sign);
    return 0x7e00;
}

static char tmp_root[256];

static inline char *mkdir_tmp(const char *name)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmp_root, name);
    mkdir(path, 0700);
    return path;
}

static inline void write_file(const char *dir, const char *name, const void *data, size_t n)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f) {
        fprintf(stderr, "cannot write %s: %s\n", p, strerror(errno));
        exit(1);
    }
    if (n)
        fwrite(data, 1, n, f);
    fclose(f);
}

static inline void rm_file(const char *dir, const char *name)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    unlink(p);
}

/* --- byte buffer ------------------------------------------------------------------------------- */

struct buf {
    uint8_t *p;
    size_t   n, cap;
};

static inline void put(struct buf *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    if (n)
        memcpy(b->p + b->n, d, n);
    b->n += n;
}
static inline void put8(struct buf *b, uint8_t v) { put(b, &v, 1); }
static inline void put16(struct buf *b, uint16_t v) { put(b, &v, 2); }
static inline void put32(struct buf *b, uint32_t v) { put(b, &v, 4); }
static inline void put64(struct buf *b, uint64_t v) { put(b, &v, 8); }
static inline void puts_(struct buf *b, const char *s) { put(b, s, strlen(s)); }

/* --- safetensors builder ------------------------------------------------------------------------ */

struct st_tensor {
    char        name[128];
    const char *dtype;
    int         nd;
    int64_t     shape[4];
    const void *data;
    size_t      nbytes;
};

static bool st_no_pad; /* docs/FORMATS.md P19: data region at an unaligned offset */

/* Header JSON (space-padded to 8 unless st_no_pad) + data, tensors in the given order. */
static inline struct buf st_build(const struct st_tensor *t, int n)
{
    struct buf h = {0}, out = {0};
    char tmp[512];
    puts_(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        snprintf(tmp, sizeof tmp, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t[i].name, t[i].dtype);
        puts_(&h, tmp);
        for (int d = 0; d < t[i].nd; d++) {
            snprintf(tmp, sizeof tmp, d ? ",%lld" : "%lld", (long long)t[i].shape[d]);
            puts_(&h, tmp);
        }
        snprintf(tmp, sizeof tmp, "],\"data_offsets\":[%zu,%zu]}", off, off + t[i].nbytes);
        puts_(&h, tmp);
        off += t[i].nbytes;
    }
    puts_(&h, "}");
    while (!st_no_pad && h.n % 8)
        puts_(&h, " ");
    while (st_no_pad && h.n % 8 != 3)
        puts_(&h, " ");
    put64(&out, h.n);
    put(&out, h.p, h.n);
    for (int i = 0; i < n; i++)
        put(&out, t[i].data, t[i].nbytes);
    free(h.p);
    return out;
}

/* --- torch zip + pickle builder ------------------------------------------------------------------ */

struct pk_tensor {
    const char *name;
    const char *storage_cls; /* "HalfStorage" */
    const char *key;         /* "0" */
    int64_t     storage_numel;
    int64_t     offset;
    int         nd;
    int64_t     size[4], stride[4];
    bool        parameter;
};

static inline void pk_str(struct buf *b, const char *s)
{
    put8(b, 'X');
    put32(b, (uint32_t)strlen(s));
    puts_(b, s);
}
static inline void pk_int(struct buf *b, int64_t v)
{
    put8(b, 'J');
    put32(b, (uint32_t)(int32_t)v);
}

/* Protocol-2 pickle of an OrderedDict name -> tensor, as torch.save writes it. */
static inline struct buf pk_build(const struct pk_tensor *t, int n)
{
    struct buf b = {0};
    put8(&b, 0x80);
    put8(&b, 2);
    puts_(&b, "ccollections\nOrderedDict\n");
    put8(&b, 'q');
    put8(&b, 0);
    put8(&b, ')');
    put8(&b, 'R');
    puts_(&b, "q\x01(");
    for (int i = 0; i < n; i++) {
        pk_str(&b, t[i].name);
        if (t[i].parameter)
            puts_(&b, "ctorch._utils\n_rebuild_parameter\n");
        puts_(&b, "ctorch._utils\n_rebuild_tensor_v2\n");
        put8(&b, '(');
        put8(&b, '(');
        if (i == 0) {
            pk_str(&b, "storage");
            puts_(&b, "q\x02");
        } else {
            puts_(&b, "h\x02"); /* BINGET the memoized 'storage' string */
        }
        char cls[64];
        snprintf(cls, sizeof cls, "ctorch\n%s\n", t[i].storage_cls);
        puts_(&b, cls);
        pk_str(&b, t[i].key);
        pk_str(&b, "cpu");
        pk_int(&b, t[i].storage_numel);
        put8(&b, 't');
        put8(&b, 'Q');
        pk_int(&b, t[i].offset);
        put8(&b, '(');
        for (int d = 0; d < t[i].nd; d++)
            pk_int(&b, t[i].size[d]);
        put8(&b, 't');
        put8(&b, '(');
        for (int d = 0; d < t[i].nd; d++)
            pk_int(&b, t[i].stride[d]);
        put8(&b, 't');
        put8(&b, 0x89);
        puts_(&b, "ccollections\nOrderedDict\n)R");
        put8(&b, 't');
        put8(&b, 'R');
        if (t[i].parameter) {
            put8(&b, 0x88);
            puts_(&b, "ccollections\nOrderedDict\n)R");
            put8(&b, 0x87); /* TUPLE3 */
            put8(&b, 'R');
        }
    }
    put8(&b, 'u');
    puts_(&b, "}q\x03"); /* state: {} (like _metadata) */
    put8(&b, 'b');
    put8(&b, '.');
    return b;
}

struct zip_rec {
    char     name[128];
    uint64_t off;
    uint32_t crc, size;
};

/* Stored zip with 64-byte aligned data, like torch.save. */
struct zipb {
    struct buf     b;
    struct zip_rec r[64];
    int            n;
};

static inline void zip_add(struct zipb *z, const char *name, const void *data, size_t n)
{
    struct zip_rec *r = &z->r[z->n++];
    snprintf(r->name, sizeof r->name, "%s", name);
    r->off = z->b.n;
    r->crc = (uint32_t)crc32(0, data, (uInt)n);
    r->size = (uint32_t)n;
    size_t nl = strlen(name);
    size_t pad = (64 - (z->b.n + 30 + nl + 4) % 64) % 64;
    put32(&z->b, 0x04034b50u);
    put16(&z->b, 20);
    put16(&z->b, 0);
    put16(&z->b, 0); /* stored */
    put16(&z->b, 0);
    put16(&z->b, 0);
    put32(&z->b, r->crc);
    put32(&z->b, (uint32_t)n);
    put32(&z->b, (uint32_t)n);
    put16(&z->b, (uint16_t)nl);
    put16(&z->b, (uint16_t)(pad + 4));
    puts_(&z->b, name);
    put16(&z->b, 0xcafe); /* padding extra field */
    put16(&z->b, (uint16_t)pad);
    for (size_t i = 0; i < pad; i++)
        put8(&z->b, 0);
    put(&z->b, data, n);
}

/* Like zip_finish, but with ZIP64 records: every central entry stores 0xFFFFFFFF sizes and offset
 * with the values in a ZIP64 extra field, and a ZIP64 end record + locator precede the EOCD
 * (as writers do for archives > 4 GB). */
static inline struct buf zip_finish64(struct zipb *z)
{
    uint64_t cd = z->b.n;
    for (int i = 0; i < z->n; i++) {
        struct zip_rec *r = &z->r[i];
        put32(&z->b, 0x02014b50u);
        put16(&z->b, 45);
        put16(&z->b, 45);
        put16(&z->b, 0);
        put16(&z->b, 0);
        put16(&z->b, 0);
        put16(&z->b, 0);
        put32(&z->b, r->crc);
        put32(&z->b, 0xffffffffu);
        put32(&z->b, 0xffffffffu);
        put16(&z->b, (uint16_t)strlen(r->name));
        put16(&z->b, 28);
        put16(&z->b, 0);
        put16(&z->b, 0);
        put16(&z->b, 0);
        put32(&z->b, 0);
        put32(&z->b, 0xffffffffu);
        puts_(&z->b, r->name);
        put16(&z->b, 0x0001);
        put16(&z->b, 24);
        put64(&z->b, r->size);
        put64(&z->b, r->size);
        put64(&z->b, r->off);
    }
    uint64_t cds = z->b.n - cd, z64 = z->b.n;
    put32(&z->b, 0x06064b50u);
    put64(&z->b, 44);
    put16(&z->b, 45);
    put16(&z->b, 45);
    put32(&z->b, 0);
    put32(&z->b, 0);
    put64(&z->b, (uint64_t)z->n);
    put64(&z->b, (uint64_t)z->n);
    put64(&z->b, cds);
    put64(&z->b, cd);
    put32(&z->b, 0x07064b50u);
    put32(&z->b, 0);
    put64(&z->b, z64);
    put32(&z->b, 1);
    put32(&z->b, 0x06054b50u);
    put16(&z->b, 0);
    put16(&z->b, 0);
    put16(&z->b, 0xffff);
    put16(&z->b, 0xffff);
    put32(&z->b, 0xffffffffu);
    put32(&z->b, 0xffffffffu);
    put16(&z->b, 0);
    struct buf out = z->b;
    memset(z, 0, sizeof *z);
    return out;
}

static inline struct buf zip_finish(struct zipb *z)
{
    uint64_t cd = z->b.n;
    for (int i = 0; i < z->n; i++) {
        struct zip_rec *r = &z->r[i];
        put32(&z->b, 0x02014b50u);
        put16(&z->b, 20);
        put16(&z->b, 20);
        put16(&z->b, 0);
        put16(&z->b, 0);
        put16(&z->b, 0);
        put16(&z->b, 0);
        put32(&z->b, r->crc);
        put32(&z->b, r->size);
        put32(&z->b, r->size);
        put16(&z->b, (uint16_t)strlen(r->name));
        put16(&z->b, 0);
        put16(&z->b, 0);
        put16(&z->b, 0);
        put16(&z->b, 0);
        put32(&z->b, 0);
        put32(&z->b, (uint32_t)r->off);
        puts_(&z->b, r->name);
    }
    uint64_t cds = z->b.n - cd;
    put32(&z->b, 0x06054b50u);
    put16(&z->b, 0);
    put16(&z->b, 0);
    put16(&z->b, (uint16_t)z->n);
    put16(&z->b, (uint16_t)z->n);
    put32(&z->b, (uint32_t)cds);
    put32(&z->b, (uint32_t)cd);
    put16(&z->b, 0);
    struct buf out = z->b;
    memset(z, 0, sizeof *z);
    return out;
}

/* --- canonical linear and the four on-disk packings (forward, from docs/FORMATS.md 3-6) ------------- */

struct canon {
    int64_t   K, N, G;
    uint8_t  *q, *z;   /* [K][N], [K/G][N] */
    uint16_t *s;       /* [K/G][N] fp16 bits, values exact in bf16 too */
    uint16_t *bias;    /* [N] fp16 */
};

static inline void canon_rand(struct canon *c, int64_t K, int64_t N, int64_t G)
{
    c->K = K;
    c->N = N;
    c->G = G;
    c->q = malloc((size_t)(K * N));
    c->z = malloc((size_t)(K / G * N));
    c->s = malloc((size_t)(K / G * N) * 2);
    c->bias = malloc((size_t)N * 2);
    for (int64_t i = 0; i < K * N; i++)
        c->q[i] = rnd() & 15;
    for (int64_t i = 0; i < K / G * N; i++) {
        c->z[i] = rnd() & 15;
        /* (1 + m/8) * 2^-e: 3 mantissa bits -> exact in fp16 and bf16 */
        float v = (1.0f + (float)(rnd() % 8) / 8.0f) * ldexpf(1.0f, -(int)(rnd() % 10) - 3);
        c->s[i] = f2h_exact(v);
    }
    for (int64_t n = 0; n < N; n++)
        c->bias[n] = f2h_exact((float)((int)(rnd() % 64) - 32) / 16.0f);
}

static inline void canon_free(struct canon *c)
{
    free(c->q);
    free(c->z);
    free(c->s);
    free(c->bias);
}

static const unsigned REVp[8] = {0, 4, 1, 5, 2, 6, 3, 7};

static inline int64_t zw(int64_t K, int64_t G)
{
    int64_t m = G >= 128 ? 1 : G == 64 ? 2 : 4;
    return (((K / G) + 7) / 8 + m - 1) / m * m;
}

/* Append the tensors of `prefix` in variant v to t[]; returns count. Data buffers malloc'd into
 * keep[] for freeing. */
static inline int pack_variant(const struct canon *c, int v, const char *prefix, bool bias, bool bf16,
                        struct st_tensor *t, void **keep, int *nkeep)
{
    const int64_t K = c->K, N = c->N, G = c->G, KG = K / G;
    int n = 0;
    if (v == CVT_VARIANT_GEMM) {
        uint32_t *qw = calloc((size_t)(K * N / 8), 4), *qz = calloc((size_t)(KG * N / 8), 4);
        for (int64_t k = 0; k < K; k++)
            for (int64_t j = 0; j < N; j++)
                qw[k * (N / 8) + j / 8] |= (uint32_t)c->q[k * N + j] << (4 * REVp[j % 8]);
        for (int64_t g = 0; g < KG; g++)
            for (int64_t j = 0; j < N; j++)
                qz[g * (N / 8) + j / 8] |= (uint32_t)c->z[g * N + j] << (4 * REVp[j % 8]);
        keep[(*nkeep)++] = qw;
        keep[(*nkeep)++] = qz;
        t[n++] = (struct st_tensor){"", "I32", 2, {K, N / 8}, qw, (size_t)(K * N / 8) * 4};
        snprintf(t[n - 1].name, 128, "%s.qweight", prefix);
        t[n++] = (struct st_tensor){"", "I32", 2, {KG, N / 8}, qz, (size_t)(KG * N / 8) * 4};
        snprintf(t[n - 1].name, 128, "%s.qzeros", prefix);
        const void *sdata = c->s;
        if (bf16) { /* same values as BF16 (exact: 3 mantissa bits) */
            uint16_t *sb = malloc((size_t)(KG * N) * 2);
            for (int64_t i = 0; i < KG * N; i++) {
                float f = h2f(c->s[i]);
                uint32_t u;
                memcpy(&u, &f, 4);
                sb[i] = (uint16_t)(u >> 16);
            }
            keep[(*nkeep)++] = sb;
            sdata = sb;
        }
        t[n++] = (struct st_tensor){"", bf16 ? "BF16" : "F16", 2, {KG, N}, sdata, (size_t)(KG * N) * 2};
        snprintf(t[n - 1].name, 128, "%s.scales", prefix);
    } else if (v == CVT_VARIANT_GEMV) {
        const int64_t W = zw(K, G);
        uint32_t *qw = calloc((size_t)(N * K / 8), 4), *qz = calloc((size_t)(N * W), 4);
        uint16_t *sc = calloc((size_t)(N * 8 * W), 2);
        for (int64_t nn = 0; nn < N; nn++) {
            for (int64_t k = 0; k < K; k++)
                qw[nn * (K / 8) + k / 8] |= (uint32_t)c->q[k * N + nn] << (4 * (k % 8));
            for (int64_t g = 0; g < KG; g++) {
                qz[nn * W + g / 8] |= (uint32_t)c->z[g * N + nn] << (4 * (g % 8));
                sc[nn * 8 * W + g] = c->s[g * N + nn];
            }
        }
        keep[(*nkeep)++] = qw;
        keep[(*nkeep)++] = qz;
        keep[(*nkeep)++] = sc;
        t[n++] = (struct st_tensor){"", "I32", 2, {N, K / 8}, qw, (size_t)(N * K / 8) * 4};
        snprintf(t[n - 1].name, 128, "%s.qweight", prefix);
        t[n++] = (struct st_tensor){"", "I32", 2, {N, W}, qz, (size_t)(N * W) * 4};
        snprintf(t[n - 1].name, 128, "%s.qzeros", prefix);
        t[n++] = (struct st_tensor){"", "F16", 2, {N, 8 * W}, sc, (size_t)(N * 8 * W) * 2};
        snprintf(t[n - 1].name, 128, "%s.scales", prefix);
    } else { /* GEMVFast / gen-3 */
        const int64_t W = zw(K, G);
        uint16_t *qw = calloc((size_t)(N / 4 * K), 2), *qz = calloc((size_t)(8 * W * N), 2),
                 *sc = calloc((size_t)(8 * W * N), 2);
        for (int64_t nn = 0; nn < N; nn++)
            for (int64_t k = 0; k < K; k++) {
                int64_t r = nn % 4, tt = k % 32;
                int64_t x = 32 * ((k % 64) / 32) + 8 * ((tt % 8) / 2) + 4 * (tt % 2) + tt / 8;
                qw[(nn / 4) * K + 64 * (k / 64) + 16 * r + x / 4] |= (uint16_t)(c->q[k * N + nn] << (4 * (x % 4)));
            }
        for (int64_t g = 0; g < KG; g++)
            for (int64_t nn = 0; nn < N; nn++) {
                float s = h2f(c->s[g * N + nn]), qzv = -(s * (float)c->z[g * N + nn]);
                if (bf16) {
                    uint32_t bs, bz;
                    memcpy(&bs, &s, 4);
                    memcpy(&bz, &qzv, 4); /* exact: 3+4 mantissa bits */
                    sc[g * N + nn] = (uint16_t)(bs >> 16);
                    qz[g * N + nn] = (uint16_t)(bz >> 16);
                } else {
                    sc[g * N + nn] = c->s[g * N + nn];
                    qz[g * N + nn] = f2h_exact(qzv);
                }
            }
        keep[(*nkeep)++] = qw;
        keep[(*nkeep)++] = qz;
        keep[(*nkeep)++] = sc;
        const char *fd = bf16 ? "BF16" : "F16";
        t[n++] = (struct st_tensor){"", "I16", 2, {N / 4, K}, qw, (size_t)(N / 4 * K) * 2};
        snprintf(t[n - 1].name, 128, "%s.qweight", prefix);
        t[n++] = (struct st_tensor){"", fd, 2, {8 * W, N}, qz, (size_t)(8 * W * N) * 2};
        snprintf(t[n - 1].name, 128, "%s.%s", prefix, v == CVT_VARIANT_GEMV_FAST ? "qzeros" : "scaled_zeros");
        t[n++] = (struct st_tensor){"", fd, 2, {8 * W, N}, sc, (size_t)(8 * W * N) * 2};
        snprintf(t[n - 1].name, 128, "%s.scales", prefix);
    }
    if (bias) {
        t[n++] = (struct st_tensor){"", "F16", 1, {N}, c->bias, (size_t)N * 2};
        snprintf(t[n - 1].name, 128, "%s.bias", prefix);
    }
    return n;
}

/* config.json of a tiny llama whose quantization_config says `version` (and backend). */
static inline void write_config(const char *dir, int64_t G, const char *version, const char *backend)
{
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 256, "
             "\"intermediate_size\": 512, \"num_hidden_layers\": 1, \"num_attention_heads\": 4, "
             "\"num_key_value_heads\": 2, \"vocab_size\": 64, \"rms_norm_eps\": 1e-5, \"bos_token_id\": 1, "
             "\"eos_token_id\": 2, \"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 4, "
             "\"group_size\": %lld, \"zero_point\": true%s%s%s%s%s}}",
             (long long)G, version ? ", \"version\": \"" : "", version ? version : "", version ? "\"" : "",
             backend ? ", \"backend\": \"llm-awq\"" : "", "");
    (void)backend;
    write_file(dir, "config.json", cfg, strlen(cfg));
}


static inline struct buf small_st(void)
{
    static const uint16_t a[6] = {0x3c00, 0x4000, 0x4200, 0x4400, 0x4500, 0x4600};
    static const int32_t b[4] = {1, 2, 3, 4};
    struct st_tensor t[2] = {{"b.qweight", "I32", 2, {2, 2}, b, 16}, {"a.weight", "F16", 2, {2, 3}, a, 12}};
    return st_build(t, 2);
}

static inline struct buf tiny_zip(const char *byteorder, bool legacy_name)
{
    struct pk_tensor pt = {"w", "HalfStorage", "0", 4, 0, 1, {4}, {1}, false};
    struct buf pk = pk_build(&pt, 1);
    uint16_t d[4] = {0x3c00, 0x4000, 0xbc00, 0};
    struct zipb z = {0};
    zip_add(&z, legacy_name ? "m/data.pkl" : "archive/data.pkl", pk.p, pk.n);
    if (byteorder)
        zip_add(&z, legacy_name ? "m/byteorder" : "archive/byteorder", byteorder, strlen(byteorder));
    zip_add(&z, legacy_name ? "m/data/0" : "archive/data/0", d, sizeof d);
    free(pk.p);
    return zip_finish(&z);
}


/* tmp_root[] = a fresh scratch directory for this program ("/tmp/qshard-test-<area>-XXXXXX"). */
static inline bool t_src_tmp(const char *area)
{
    snprintf(tmp_root, sizeof tmp_root, "/tmp/qshard-test-%s-XXXXXX", area);
    if (!mkdtemp(tmp_root)) {
        perror("mkdtemp");
        return false;
    }
    return true;
}

/* Remove tmp_root and return the summary status. */
static inline int t_src_done(void)
{
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmp_root);
    return t_done();
}

#endif /* QS_T_CVT_SRC_H */
