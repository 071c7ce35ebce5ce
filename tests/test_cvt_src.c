/*
 * test_cvt_src.c - tests of the converter input side (convert/cvt_src.h): safetensors and torch
 * zip/pickle readers, config reader, directory/index validation, AWQ variant decoding and the
 * independent source dequantization.
 *
 * Run: make BUILD=build-x build-x/test_cvt_src && build-x/test_cvt_src   (from the repo root)
 *
 * References we did not write: the AWQ-FORMATS worked example (GEMM word 0x75316420 for codes
 * 0..7), the fixture models under tests/data/models (packed by tools/fixtures from AutoAWQ's
 * formulas, with a separate unpacker check there) whose twins must decode to identical canonical
 * data, the bad-input fixtures under tests/data/bad (expected error and the strings the message
 * must name come from their INDEX.json), and real config files from HuggingFace repos
 * (tests/data/fuzz/fuzz_config/, provenance in tests/data/fuzz/README.md).
 * Hand-built inputs: every variant packed here from the format facts with random codes (whole
 * linears and slices, F16/BF16 scales, safetensors and torch zip, misaligned data), hostile
 * safetensors headers (truncation at every byte, huge lengths, offset overflow), hostile pickles
 * (forbidden GLOBALs, deep nesting, memo out of range, truncation at every byte), zips (ZIP64,
 * compressed entries, big-endian, CRC), sharded-index inconsistencies. Also: 4 threads decoding
 * one source concurrently, and file-backed RSS staying flat while a 16 MiB linear is decoded.
 *
 * `test_cvt_src --write-corpus DIR` writes the hand-built fuzz seeds (tests/data/fuzz/README.md).
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>   /* INDEX.json of the fixtures */
#include <zlib.h>          /* crc32 for hand-built zips */

#include "cvt_arch.h" /* cvt_arch_find, CVT_ROLE_BIT */
#include "cvt_src.h"
#include "qs_log.h"
#include "t.h"

/* --- small utilities ------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static float h2f(uint16_t h)
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
static uint16_t f2h_exact(float f)
{
    uint16_t sign = f < 0 ? 0x8000 : 0;
    float a = fabsf(f);
    for (uint32_t h = 0; h < 0x7c00; h++)
        if (h2f((uint16_t)h) == a)
            return (uint16_t)(h | sign);
    return 0x7e00;
}

static char tmp_root[256];

static char *mkdir_tmp(const char *name)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmp_root, name);
    mkdir(path, 0700);
    return path;
}

static void write_file(const char *dir, const char *name, const void *data, size_t n)
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

static void rm_file(const char *dir, const char *name)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    unlink(p);
}

static char *read_text(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)sz + 1);
    if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) {
        free(b);
        b = NULL;
    }
    if (b)
        b[sz] = 0;
    fclose(f);
    *n = (size_t)sz;
    return b;
}

/* --- byte buffer ------------------------------------------------------------------------------- */

struct buf {
    uint8_t *p;
    size_t   n, cap;
};

static void put(struct buf *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    if (n)
        memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void put8(struct buf *b, uint8_t v) { put(b, &v, 1); }
static void put16(struct buf *b, uint16_t v) { put(b, &v, 2); }
static void put32(struct buf *b, uint32_t v) { put(b, &v, 4); }
static void put64(struct buf *b, uint64_t v) { put(b, &v, 8); }
static void puts_(struct buf *b, const char *s) { put(b, s, strlen(s)); }

/* --- safetensors builder ------------------------------------------------------------------------ */

struct st_tensor {
    char        name[128];
    const char *dtype;
    int         nd;
    int64_t     shape[4];
    const void *data;
    size_t      nbytes;
};

static bool st_no_pad; /* PITFALLS P19: data region at an unaligned offset */

/* Header JSON (space-padded to 8 unless st_no_pad) + data, tensors in the given order. */
static struct buf st_build(const struct st_tensor *t, int n)
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

static void pk_str(struct buf *b, const char *s)
{
    put8(b, 'X');
    put32(b, (uint32_t)strlen(s));
    puts_(b, s);
}
static void pk_int(struct buf *b, int64_t v)
{
    put8(b, 'J');
    put32(b, (uint32_t)(int32_t)v);
}

/* Protocol-2 pickle of an OrderedDict name -> tensor, as torch.save writes it. */
static struct buf pk_build(const struct pk_tensor *t, int n)
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

static void zip_add(struct zipb *z, const char *name, const void *data, size_t n)
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
static struct buf zip_finish64(struct zipb *z)
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

static struct buf zip_finish(struct zipb *z)
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

/* --- canonical linear and the four on-disk packings (forward, from AWQ-FORMATS) ------------- */

struct canon {
    int64_t   K, N, G;
    uint8_t  *q, *z;   /* [K][N], [K/G][N] */
    uint16_t *s;       /* [K/G][N] fp16 bits, values exact in bf16 too */
    uint16_t *bias;    /* [N] fp16 */
};

static void canon_rand(struct canon *c, int64_t K, int64_t N, int64_t G)
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

static void canon_free(struct canon *c)
{
    free(c->q);
    free(c->z);
    free(c->s);
    free(c->bias);
}

static const unsigned REVp[8] = {0, 4, 1, 5, 2, 6, 3, 7};

static int64_t zw(int64_t K, int64_t G)
{
    int64_t m = G >= 128 ? 1 : G == 64 ? 2 : 4;
    return (((K / G) + 7) / 8 + m - 1) / m * m;
}

/* Append the tensors of `prefix` in variant v to t[]; returns count. Data buffers malloc'd into
 * keep[] for freeing. */
static int pack_variant(const struct canon *c, int v, const char *prefix, bool bias, bool bf16,
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
static void write_config(const char *dir, int64_t G, const char *version, const char *backend)
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

/* --- tests ----------------------------------------------------------------------------------------- */

static void test_err_strings(void)
{
    CHECK(strstr(cvt_err_str(CVT_ERR_NONE), "CVT_ERR_NONE") != NULL);
    CHECK(strstr(cvt_err_str(CVT_ERR_PICKLE), "pickle") != NULL);
    CHECK(strstr(cvt_err_str((enum cvt_err)999), "unknown") != NULL);
    CHECK_EQ_INT(cvt_err_exit_code(CVT_ERR_NONE), 0);
    CHECK_EQ_INT(cvt_err_exit_code(CVT_ERR_IO), 4);
    CHECK_EQ_INT(cvt_err_exit_code(CVT_ERR_SHAPE), 2);
    CHECK_EQ_INT(cvt_err_exit_code(CVT_ERR_ARG), 1);
    CHECK_EQ_INT(cvt_err_exit_code(CVT_ERR_NOMEM), 3);
    CHECK_EQ_STR(cvt_dtype_str(CVT_DT_BF16), "BF16");
    CHECK_EQ_INT(cvt_dtype_size(CVT_DT_I16), 2);
}

/* The AWQ-FORMATS worked example: codes 0..7 in columns 0..7 -> GEMM word 0x75316420. */
static void test_gemm_worked_example(void)
{
    char *dir = mkdir_tmp("kat");
    write_config(dir, 64, "gemm", NULL);
    /* K = 64, N = 64, G = 64: row 0 words hold 0x75316420, other codes 0; zeros 0; scale 1. */
    uint32_t qw[64 * 8] = {0}, qz[8] = {0};
    uint16_t sc[64];
    for (int c = 0; c < 8; c++)
        qw[c] = 0x75316420u;
    for (int n = 0; n < 64; n++)
        sc[n] = 0x3c00;
    struct st_tensor t[3] = {
        {"model.layers.0.self_attn.o_proj.qweight", "I32", 2, {64, 8}, qw, sizeof qw},
        {"model.layers.0.self_attn.o_proj.qzeros", "I32", 2, {1, 8}, qz, sizeof qz},
        {"model.layers.0.self_attn.o_proj.scales", "F16", 2, {1, 64}, sc, sizeof sc},
    };
    struct buf b = st_build(t, 3);
    write_file(dir, "model.safetensors", b.p, b.n);
    free(b.p);
    struct cvt_source *src = NULL;
    CHECK_EQ_INT(cvt_source_open(dir, &src), CVT_ERR_NONE);
    if (!src)
        return;
    struct cvt_awq_linear lin;
    CHECK_EQ_INT(cvt_awq_load(src, cvt_source_config(src), "model.layers.0.self_attn.o_proj", 64, 64, 0, 64, 0, 64, &lin),
                 CVT_ERR_NONE);
    CHECK_EQ_INT(lin.variant, CVT_VARIANT_GEMM);
    int ok = 1;
    for (int n = 0; n < 64; n++)
        ok &= lin.q[n] == n % 8;
    CHECK(ok);
    float w[64 * 64];
    CHECK_EQ_INT(cvt_awq_dequant_source(src, cvt_source_config(src), "model.layers.0.self_attn.o_proj", 64, 64, 0, 64, 0,
                                        64, w),
                 CVT_ERR_NONE);
    ok = 1;
    for (int n = 0; n < 64; n++)
        ok &= w[n] == (float)(n % 8) && w[64 + n] == 0.0f;
    CHECK(ok);
    cvt_awq_linear_free(&lin);
    cvt_source_close(src);
}

/* Every variant built from one canonical linear decodes back to it (whole and sliced), and the
 * independent dequant equals (q - z) * s. */
static void check_variant(const struct canon *c, int v, bool bf16, const char *container)
{
    char name[64];
    snprintf(name, sizeof name, "var-%d-%d-%s-%lld", v, bf16, container, (long long)c->G);
    char *dir = mkdir_tmp(name);
    const char *ver = v == CVT_VARIANT_GEMM ? "gemm" : v == CVT_VARIANT_GEMV ? "gemv" : v == CVT_VARIANT_GEMV_FAST ? "gemv_fast" : "gemv";
    write_config(dir, c->G, ver, v == CVT_VARIANT_LLMAWQ_V3 ? "llm-awq" : NULL);
    if (v == CVT_VARIANT_LLMAWQ_V3) { /* backend llm-awq */
        char cfg[1024];
        snprintf(cfg, sizeof cfg,
                 "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 256, \"intermediate_size\": 512, "
                 "\"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 64, "
                 "\"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": %lld, "
                 "\"zero_point\": true, \"version\": \"gemv\", \"backend\": \"llm-awq\"}}",
                 (long long)c->G);
        write_file(dir, "config.json", cfg, strlen(cfg));
    }
    struct st_tensor t[8];
    void *keep[8];
    int nkeep = 0;
    int nt = pack_variant(c, v, "model.layers.0.self_attn.q_proj", true, bf16, t, keep, &nkeep);
    if (strcmp(container, "bin") == 0) {
        struct zipb z = {0};
        struct pk_tensor pt[8] = {{0}};
        char keys[8][16];
        for (int i = 0; i < nt; i++) {
            snprintf(keys[i], sizeof keys[i], "%d", i);
            const char *cls = strcmp(t[i].dtype, "I32") == 0 ? "IntStorage" : strcmp(t[i].dtype, "I16") == 0 ? "ShortStorage"
                              : strcmp(t[i].dtype, "BF16") == 0 ? "BFloat16Storage" : "HalfStorage";
            int64_t es = strcmp(t[i].dtype, "I32") == 0 ? 4 : 2;
            pt[i] = (struct pk_tensor){t[i].name, cls, keys[i], (int64_t)t[i].nbytes / es, 0, t[i].nd,
                                       {t[i].shape[0], t[i].shape[1]}, {t[i].nd == 2 ? t[i].shape[1] : 1, 1}, i == 1};
        }
        struct buf pk = pk_build(pt, nt);
        zip_add(&z, "archive/data.pkl", pk.p, pk.n);
        zip_add(&z, "archive/byteorder", "little", 6);
        for (int i = 0; i < nt; i++) {
            char rec[64];
            snprintf(rec, sizeof rec, "archive/data/%d", i);
            zip_add(&z, rec, t[i].data, t[i].nbytes);
        }
        zip_add(&z, "archive/version", "3\n", 2);
        struct buf zb = zip_finish(&z);
        write_file(dir, "pytorch_model.bin", zb.p, zb.n);
        free(zb.p);
        free(pk.p);
    } else {
        struct buf b = st_build(t, nt);
        write_file(dir, "model.safetensors", b.p, b.n);
        free(b.p);
    }
    for (int i = 0; i < nkeep; i++)
        free(keep[i]);

    struct cvt_source *src = NULL;
    CHECK_MSG(cvt_source_open(dir, &src) == CVT_ERR_NONE, "%s: %s", name, qs_log_last());
    if (!src)
        return;
    const struct cvt_hf_config *cfg = cvt_source_config(src);
    const int64_t K = c->K, N = c->N, G = c->G;
    struct cvt_awq_info info;
    CHECK_EQ_INT(cvt_awq_probe(src, cfg, "model.layers.0.self_attn.q_proj", K, N, &info), CVT_ERR_NONE);
    CHECK_EQ_INT(info.variant, v);
    /* whole, then a few slices at group boundaries and odd column ranges */
    const int64_t kmid = G < K ? G : 0;
    const int64_t sl[][4] = {{0, K, 0, N}, {kmid, K, 0, N}, {0, G, 8, N - 8}, {0, K, 3, 17}, {K - G, K, N - 5, N}};
    float *w = malloc((size_t)(K * N) * sizeof *w);
    for (size_t si = 0; si < sizeof sl / sizeof sl[0]; si++) {
        const int64_t k0 = sl[si][0], k1 = sl[si][1], n0 = sl[si][2], n1 = sl[si][3], Ns = n1 - n0;
        struct cvt_awq_linear lin;
        enum cvt_err e = cvt_awq_load(src, cfg, "model.layers.0.self_attn.q_proj", K, N, k0, k1, n0, n1, &lin);
        CHECK_MSG(e == CVT_ERR_NONE, "%s slice %zu: %s", name, si, qs_log_last());
        if (e)
            continue;
        int okq = 1, okz = 1, oks = 1, okb = 1, okd = 1;
        for (int64_t k = k0; k < k1; k++)
            for (int64_t n = n0; n < n1; n++)
                okq &= lin.q[(k - k0) * Ns + n - n0] == c->q[k * N + n];
        for (int64_t g = k0 / G; g < k1 / G; g++)
            for (int64_t n = n0; n < n1; n++) {
                okz &= lin.z[(g - k0 / G) * Ns + n - n0] == c->z[g * N + n];
                oks &= lin.s[(g - k0 / G) * Ns + n - n0] == c->s[g * N + n];
            }
        for (int64_t n = n0; n < n1; n++)
            okb &= lin.bias && lin.bias[n - n0] == h2f(c->bias[n]);
        CHECK_MSG(okq && okz && oks && okb, "%s slice %zu: q %d z %d s %d bias %d", name, si, okq, okz, oks, okb);
        e = cvt_awq_dequant_source(src, cfg, "model.layers.0.self_attn.q_proj", K, N, k0, k1, n0, n1, w);
        CHECK_EQ_INT(e, CVT_ERR_NONE);
        for (int64_t k = k0; k < k1 && !e; k++)
            for (int64_t n = n0; n < n1; n++) {
                int64_t g = k / G;
                float ref = (float)((int)c->q[k * N + n] - (int)c->z[g * N + n]) * h2f(c->s[g * N + n]);
                okd &= memcmp(&w[(k - k0) * Ns + n - n0], &ref, 4) == 0;
            }
        CHECK_MSG(okd, "%s slice %zu: source dequant differs from (q - z) * s", name, si);
        CHECK_EQ_INT(lin.K, k1 - k0);
        CHECK_EQ_INT(lin.N, Ns);
        cvt_awq_linear_free(&lin);
    }
    /* bad slices */
    struct cvt_awq_linear lin;
    qs_log_set_quiet(true);
    CHECK_EQ_INT(cvt_awq_load(src, cfg, "model.layers.0.self_attn.q_proj", K, N, 1, K, 0, N, &lin), CVT_ERR_ARG);
    CHECK(lin.q == NULL);
    CHECK_EQ_INT(cvt_awq_load(src, cfg, "model.layers.0.self_attn.q_proj", K, N, 0, K, 0, N + 1, &lin), CVT_ERR_ARG);
    /* expected shapes that disagree with the tensors (config vs tensors) */
    CHECK_EQ_INT(cvt_awq_load(src, cfg, "model.layers.0.self_attn.q_proj", K, N + 64, 0, K, 0, N, &lin), CVT_ERR_SHAPE);
    CHECK(strstr(qs_log_last(), "model.layers.0.self_attn.q_proj") != NULL);
    CHECK_EQ_INT(cvt_awq_probe(src, cfg, "model.layers.0.self_attn.k_proj", K, N, &info), CVT_ERR_MISSING_TENSOR);
    qs_log_set_quiet(false);
    free(w);
    cvt_source_close(src);
}

/* PITFALLS P19: data region starting at an offset = 3 (mod 8) and an odd-length F16 tensor in
 * front of the I32 qweight: every tensor is misaligned; decoding (under UBSan) must not care. */
static void test_unaligned(void)
{
    struct canon c;
    canon_rand(&c, 128, 64, 64);
    struct st_tensor t[8];
    void *keep[8];
    int nkeep = 0;
    static const uint16_t odd[3] = {0x3c00, 0x4000, 0x4200};
    t[0] = (struct st_tensor){"model.norm.weight", "F16", 1, {3}, odd, sizeof odd};
    int nt = 1 + pack_variant(&c, CVT_VARIANT_GEMM, "model.layers.0.mlp.down_proj", true, false, t + 1, keep, &nkeep);
    char dir[512];
    snprintf(dir, sizeof dir, "%s", mkdir_tmp("unaligned"));
    write_config(dir, 64, "gemm", NULL);
    st_no_pad = true;
    struct buf b = st_build(t, nt);
    st_no_pad = false;
    write_file(dir, "model.safetensors", b.p, b.n);
    free(b.p);
    struct cvt_source *src = NULL;
    CHECK_EQ_INT(cvt_source_open(dir, &src), CVT_ERR_NONE);
    if (src) {
        const struct cvt_src_tensor *qw = cvt_source_find(src, "model.layers.0.mlp.down_proj.qweight");
        CHECK(qw && qw->offset % 4 != 0);
        struct cvt_awq_linear lin;
        CHECK_EQ_INT(cvt_awq_load(src, cvt_source_config(src), "model.layers.0.mlp.down_proj", 128, 64, 0, 128, 0, 64, &lin),
                     CVT_ERR_NONE);
        CHECK(lin.q && memcmp(lin.q, c.q, 128 * 64) == 0 && memcmp(lin.s, c.s, 2 * 64 * 2) == 0);
        cvt_awq_linear_free(&lin);
        float f[3];
        CHECK_EQ_INT(cvt_source_read_f32(src, cvt_source_find(src, "model.norm.weight"), 0, 3, f), CVT_ERR_NONE);
        CHECK(f[0] == 1.0f && f[2] == 3.0f);
        cvt_source_close(src);
    }
    for (int i = 0; i < nkeep; i++)
        free(keep[i]);
    canon_free(&c);
}

static void test_variants(void)
{
    const int64_t shapes[][3] = {{256, 128, 64}, {384, 64, 128}, {128, 128, 32}, {256, 256, 256}, {1152, 136, 128}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        struct canon c;
        canon_rand(&c, shapes[si][0], shapes[si][1], shapes[si][2]);
        check_variant(&c, CVT_VARIANT_GEMM, false, "st");
        check_variant(&c, CVT_VARIANT_GEMV, false, "st");
        check_variant(&c, CVT_VARIANT_GEMV_FAST, false, "st");
        check_variant(&c, CVT_VARIANT_LLMAWQ_V3, false, "st");
        check_variant(&c, CVT_VARIANT_LLMAWQ_V3, true, "st");
        check_variant(&c, CVT_VARIANT_GEMM, false, "bin");
        check_variant(&c, CVT_VARIANT_GEMM, true, "st");
        check_variant(&c, CVT_VARIANT_LLMAWQ_V3, true, "bin");
        canon_free(&c);
    }
}

/* Variant / config disagreement, missing tensors, bad scales. */
static void test_awq_errors(void)
{
    struct canon c;
    canon_rand(&c, 128, 128, 64);
    char *dir = mkdir_tmp("awq-err");
    char d2[512];
    snprintf(d2, sizeof d2, "%s", dir);
    struct st_tensor t[8];
    void *keep[8];
    int nkeep = 0;
    /* GEMV tensors (square layer: qweight shapes identical to GEMM) under a gemm config. */
    write_config(d2, 64, "gemm", NULL);
    int nt = pack_variant(&c, CVT_VARIANT_GEMV, "model.layers.0.self_attn.q_proj", false, false, t, keep, &nkeep);
    struct buf b = st_build(t, nt);
    write_file(d2, "model.safetensors", b.p, b.n);
    free(b.p);
    struct cvt_source *src = NULL;
    CHECK_EQ_INT(cvt_source_open(d2, &src), CVT_ERR_NONE);
    struct cvt_awq_linear lin;
    qs_log_set_quiet(true);
    if (src) {
        CHECK_EQ_INT(cvt_awq_load(src, cvt_source_config(src), "model.layers.0.self_attn.q_proj", 128, 128, 0, 128, 0, 128, &lin),
                     CVT_ERR_VARIANT);
        CHECK(strstr(qs_log_last(), "gemv") && strstr(qs_log_last(), "gemm"));
        cvt_source_close(src);
    }
    /* NaN scale at [1][5]: GEMV scales are [N][8Wz] -> element [5][1]. */
    write_config(d2, 64, "gemv", NULL);
    const int64_t sw = 8 * zw(128, 64); /* GEMV scales are [N, 8 Wz] */
    ((uint16_t *)(uintptr_t)t[2].data)[5 * sw + 1] = 0x7e00;
    b = st_build(t, nt);
    write_file(d2, "model.safetensors", b.p, b.n);
    free(b.p);
    CHECK_EQ_INT(cvt_source_open(d2, &src), CVT_ERR_NONE);
    if (src) {
        CHECK_EQ_INT(cvt_awq_load(src, cvt_source_config(src), "model.layers.0.self_attn.q_proj", 128, 128, 0, 128, 0, 128, &lin),
                     CVT_ERR_NAN);
        CHECK(strstr(qs_log_last(), "model.layers.0.self_attn.q_proj.scales") && strstr(qs_log_last(), "[5, 1]"));
        /* the slice that does not touch it decodes */
        CHECK_EQ_INT(cvt_awq_load(src, cvt_source_config(src), "model.layers.0.self_attn.q_proj", 128, 128, 0, 64, 0, 128, &lin),
                     CVT_ERR_NONE);
        cvt_awq_linear_free(&lin);
        cvt_source_close(src);
    }
    /* scale 0 (non-positive) */
    ((uint16_t *)(uintptr_t)t[2].data)[5 * sw + 1] = 0x0000;
    b = st_build(t, nt);
    write_file(d2, "model.safetensors", b.p, b.n);
    free(b.p);
    CHECK_EQ_INT(cvt_source_open(d2, &src), CVT_ERR_NONE);
    if (src) {
        CHECK_EQ_INT(cvt_awq_dequant_source(src, cvt_source_config(src), "model.layers.0.self_attn.q_proj", 128, 128, 0, 128,
                                            0, 128, (float[128 * 128]){0}),
                     CVT_ERR_NAN);
        cvt_source_close(src);
    }
    /* missing qzeros / scales */
    struct st_tensor t2[2] = {t[0], t[2]};
    b = st_build(t2, 2);
    write_file(d2, "model.safetensors", b.p, b.n);
    free(b.p);
    CHECK_EQ_INT(cvt_source_open(d2, &src), CVT_ERR_NONE);
    if (src) {
        CHECK_EQ_INT(cvt_awq_load(src, cvt_source_config(src), "model.layers.0.self_attn.q_proj", 128, 128, 0, 128, 0, 128, &lin),
                     CVT_ERR_MISSING_TENSOR);
        CHECK(strstr(qs_log_last(), "model.layers.0.self_attn.q_proj.qzeros") != NULL);
        cvt_source_close(src);
    }
    t2[1] = t[1];
    b = st_build(t2, 2);
    write_file(d2, "model.safetensors", b.p, b.n);
    free(b.p);
    CHECK_EQ_INT(cvt_source_open(d2, &src), CVT_ERR_NONE);
    if (src) {
        CHECK_EQ_INT(cvt_awq_probe(src, cvt_source_config(src), "model.layers.0.self_attn.q_proj", 128, 128,
                                   &(struct cvt_awq_info){0}),
                     CVT_ERR_MISSING_TENSOR);
        CHECK(strstr(qs_log_last(), "model.layers.0.self_attn.q_proj.scales") != NULL);
        cvt_source_close(src);
    }
    /* group size that does not divide K */
    write_config(d2, 96, "gemv", NULL);
    b = st_build(t, nt);
    write_file(d2, "model.safetensors", b.p, b.n);
    free(b.p);
    CHECK_EQ_INT(cvt_source_open(d2, &src), CVT_ERR_NONE);
    if (src) {
        CHECK_EQ_INT(cvt_awq_probe(src, cvt_source_config(src), "model.layers.0.self_attn.q_proj", 128, 128,
                                   &(struct cvt_awq_info){0}),
                     CVT_ERR_SHAPE);
        cvt_source_close(src);
    }
    for (int i = 0; i < nkeep; i++)
        free(keep[i]);
    nkeep = 0;
    /* GEMVFast zeros that are not -(s*z) for an integer z */
    write_config(d2, 64, "gemv_fast", NULL);
    nt = pack_variant(&c, CVT_VARIANT_GEMV_FAST, "model.layers.0.self_attn.q_proj", false, false, t, keep, &nkeep);
    ((uint16_t *)(uintptr_t)t[1].data)[3] = f2h_exact(-h2f(c.s[3]) * 2.5f);
    b = st_build(t, nt);
    write_file(d2, "model.safetensors", b.p, b.n);
    free(b.p);
    CHECK_EQ_INT(cvt_source_open(d2, &src), CVT_ERR_NONE);
    if (src) {
        CHECK_EQ_INT(cvt_awq_load(src, cvt_source_config(src), "model.layers.0.self_attn.q_proj", 128, 128, 0, 128, 0, 128, &lin),
                     CVT_ERR_RANGE);
        CHECK(strstr(qs_log_last(), "model.layers.0.self_attn.q_proj.qzeros") != NULL);
        cvt_source_close(src);
    }
    for (int i = 0; i < nkeep; i++)
        free(keep[i]);
    nkeep = 0;
    /* GEMV with a group size that does not start groups on packed words */
    {
        struct canon c2;
        canon_rand(&c2, 1056, 64, 132);
        write_config(d2, 132, "gemv", NULL);
        nt = pack_variant(&c2, CVT_VARIANT_GEMV, "model.layers.0.self_attn.q_proj", false, false, t, keep, &nkeep);
        b = st_build(t, nt);
        write_file(d2, "model.safetensors", b.p, b.n);
        free(b.p);
        CHECK_EQ_INT(cvt_source_open(d2, &src), CVT_ERR_NONE);
        if (src) {
            CHECK_EQ_INT(cvt_awq_load(src, cvt_source_config(src), "model.layers.0.self_attn.q_proj", 1056, 64, 132, 1056, 0,
                                      64, &lin),
                         CVT_ERR_UNSUPPORTED);
            cvt_source_close(src);
        }
        for (int i = 0; i < nkeep; i++)
            free(keep[i]);
        nkeep = 0;
        canon_free(&c2);
    }
    /* GEMM with BF16 scales: one of them (7.0e4) has no fp16 value (PITFALLS P15) */
    write_config(d2, 64, "gemm", NULL);
    nt = pack_variant(&c, CVT_VARIANT_GEMM, "model.layers.0.self_attn.q_proj", false, true, t, keep, &nkeep);
    ((uint16_t *)(uintptr_t)t[2].data)[130] = 0x4789; /* bf16 70144 */
    b = st_build(t, nt);
    write_file(d2, "model.safetensors", b.p, b.n);
    free(b.p);
    CHECK_EQ_INT(cvt_source_open(d2, &src), CVT_ERR_NONE);
    if (src) {
        CHECK_EQ_INT(cvt_awq_load(src, cvt_source_config(src), "model.layers.0.self_attn.q_proj", 128, 128, 0, 128, 0, 128, &lin),
                     CVT_ERR_RANGE);
        CHECK(strstr(qs_log_last(), "[1, 2]") != NULL); /* element 130 of [2, 128] */
        cvt_source_close(src);
    }
    qs_log_set_quiet(false);
    for (int i = 0; i < nkeep; i++)
        free(keep[i]);
    canon_free(&c);
}

/* --- safetensors hostile inputs ------------------------------------------------------------------- */

static struct buf small_st(void)
{
    static const uint16_t a[6] = {0x3c00, 0x4000, 0x4200, 0x4400, 0x4500, 0x4600};
    static const int32_t b[4] = {1, 2, 3, 4};
    struct st_tensor t[2] = {{"b.qweight", "I32", 2, {2, 2}, b, 16}, {"a.weight", "F16", 2, {2, 3}, a, 12}};
    return st_build(t, 2);
}

static enum cvt_err st_parse_text(const char *hdr, size_t data_bytes)
{
    struct buf b = {0};
    put64(&b, strlen(hdr));
    puts_(&b, hdr);
    for (size_t i = 0; i < data_bytes; i++)
        put8(&b, 0);
    struct cvt_tensor_list l;
    enum cvt_err e = cvt_safetensors_parse("t.safetensors", b.p, b.n, b.n, &l);
    cvt_tensor_list_free(&l);
    free(b.p);
    return e;
}

static void test_safetensors_hostile(void)
{
    struct buf b = small_st();
    struct cvt_tensor_list l;
    CHECK_EQ_INT(cvt_safetensors_parse("t.safetensors", b.p, b.n, b.n, &l), CVT_ERR_NONE);
    CHECK_EQ_INT(l.n, 2);
    if (l.n == 2) { /* sorted by offset: I32 first */
        CHECK_EQ_STR(l.t[0].name, "b.qweight");
        CHECK_EQ_INT(l.t[1].offset, b.n - 12);
        CHECK_EQ_INT(l.t[1].shape[1], 3);
    }
    cvt_tensor_list_free(&l);
    qs_log_set_quiet(true);
    /* truncation at every byte: each prefix is a complete (shorter) file */
    int bad = 0;
    for (size_t n = 0; n < b.n; n++) {
        uint8_t *copy = malloc(n ? n : 1);
        memcpy(copy, b.p, n);
        enum cvt_err e = cvt_safetensors_parse("t.safetensors", copy, n, n, &l);
        bad += e == CVT_ERR_NONE;
        cvt_tensor_list_free(&l);
        free(copy);
    }
    CHECK_EQ_INT(bad, 0);
    /* trailing bytes after the data */
    put8(&b, 0);
    CHECK_EQ_INT(cvt_safetensors_parse("t.safetensors", b.p, b.n, b.n, &l), CVT_ERR_SAFETENSORS);
    /* huge header length / wrap-around */
    uint64_t huge = 0xfffffffffffffffaull;
    memcpy(b.p, &huge, 8);
    CHECK_EQ_INT(cvt_safetensors_parse("t.safetensors", b.p, b.n, b.n, &l), CVT_ERR_SAFETENSORS);
    huge = 100000001;
    memcpy(b.p, &huge, 8);
    CHECK_EQ_INT(cvt_safetensors_parse("t.safetensors", b.p, b.n, b.n, &l), CVT_ERR_SAFETENSORS);
    CHECK(strstr(qs_log_last(), "t.safetensors") != NULL);
    free(b.p);
    /* hand-written headers */
    CHECK_EQ_INT(st_parse_text("{\"x\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4), CVT_ERR_NONE);
    CHECK_EQ_INT(st_parse_text("[1,2]", 0), CVT_ERR_SAFETENSORS);
    CHECK_EQ_INT(st_parse_text("{\"x\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,18446744073709551620]}}", 4),
                 CVT_ERR_SAFETENSORS);
    CHECK_EQ_INT(st_parse_text("{\"x\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,1e400]}}", 4), CVT_ERR_SAFETENSORS);
    CHECK_EQ_INT(st_parse_text("{\"x\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[4,0]}}", 4), CVT_ERR_SAFETENSORS);
    CHECK_EQ_INT(st_parse_text("{\"x\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,-4]}}", 4), CVT_ERR_SAFETENSORS);
    CHECK_EQ_INT(st_parse_text("{\"x\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,4]}}", 4), CVT_ERR_SAFETENSORS);
    CHECK_EQ_INT(st_parse_text("{\"x\":{\"dtype\":\"F16\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,4]}}", 4),
                 CVT_ERR_SAFETENSORS);
    CHECK_EQ_INT(st_parse_text("{\"x\":{\"dtype\":\"F16\",\"shape\":[2.5],\"data_offsets\":[0,4]}}", 4), CVT_ERR_SAFETENSORS);
    CHECK_EQ_INT(st_parse_text("{\"x\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4), CVT_ERR_DTYPE);
    CHECK(strstr(qs_log_last(), "Q4") != NULL);
    CHECK_EQ_INT(st_parse_text("{\"x\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[0,2]},"
                               "\"y\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[4,6]}}", 6),
                 CVT_ERR_SAFETENSORS); /* hole */
    CHECK(strstr(qs_log_last(), "hole") != NULL);
    CHECK_EQ_INT(st_parse_text("{\"x\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]},"
                               "\"y\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[2,6]}}", 6),
                 CVT_ERR_SAFETENSORS); /* overlap */
    CHECK(strstr(qs_log_last(), "overlaps") != NULL);
    CHECK_EQ_INT(st_parse_text("{\"x\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[0,2]},"
                               "\"x\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[2,4]}}", 4),
                 CVT_ERR_SAFETENSORS); /* duplicate */
    CHECK(strstr(qs_log_last(), "twice") != NULL);
    CHECK_EQ_INT(st_parse_text("{\"a\xff\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[0,2]}}", 2), CVT_ERR_SAFETENSORS);
    CHECK_EQ_INT(st_parse_text("{\"x\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[0,2]}} garbage", 2),
                 CVT_ERR_SAFETENSORS);
    CHECK_EQ_INT(st_parse_text("{\"x\":{\"dtype\":\"F16\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,2]}}", 2),
                 CVT_ERR_SAFETENSORS);
    CHECK_EQ_INT(st_parse_text("{\"__metadata__\":{\"format\":1}}", 0), CVT_ERR_SAFETENSORS);
    CHECK_EQ_INT(st_parse_text("{\"x\":{\"dtype\":\"F16\",\"shape\":[],\"data_offsets\":[0,2]}}", 2), CVT_ERR_NONE);
    CHECK_EQ_INT(st_parse_text("{\"x\":{\"dtype\":\"F16\",\"shape\":[0,5],\"data_offsets\":[0,0]}}", 0), CVT_ERR_NONE);
    /* nesting deeper than cJSON's limit */
    char deep[3000];
    size_t k = 0;
    k += (size_t)snprintf(deep, sizeof deep, "{\"x\":");
    for (int i = 0; i < 1200; i++)
        deep[k++] = '[';
    deep[k] = 0;
    CHECK_EQ_INT(st_parse_text(deep, 0), CVT_ERR_SAFETENSORS);
    qs_log_set_quiet(false);
}

/* --- pickle / zip hostile inputs -------------------------------------------------------------------- */

static enum cvt_err pickle_bytes(const void *p, size_t n)
{
    struct cvt_tensor_list l;
    enum cvt_err e = cvt_pickle_parse_only("data.pkl", p, n, &l);
    cvt_tensor_list_free(&l);
    return e;
}

static void test_pickle_hostile(void)
{
    qs_log_set_quiet(true);
    /* a valid state dict pickle, and truncation at every byte */
    struct pk_tensor pt[2] = {
        {"w", "HalfStorage", "0", 6, 0, 2, {2, 3}, {3, 1}, false},
        {"v", "HalfStorage", "0", 6, 2, 2, {2, 2}, {2, 1}, true}, /* view into the same storage */
    };
    struct buf pk = pk_build(pt, 2);
    struct cvt_tensor_list l;
    CHECK_EQ_INT(cvt_pickle_parse_only("data.pkl", pk.p, pk.n, &l), CVT_ERR_NONE);
    CHECK_EQ_INT(l.n, 2);
    cvt_tensor_list_free(&l);
    /* the same in a zip: both tensors resolve into one storage record */
    struct zipb zb = {0};
    uint16_t d6[6] = {1, 2, 3, 4, 5, 6};
    zip_add(&zb, "archive/data.pkl", pk.p, pk.n);
    zip_add(&zb, "archive/data/0", d6, sizeof d6);
    struct buf z = zip_finish(&zb);
    CHECK_EQ_INT(cvt_torchzip_parse("m.bin", z.p, z.n, &l), CVT_ERR_NONE);
    CHECK_EQ_INT(l.n, 2);
    if (l.n == 2) {
        CHECK_EQ_STR(l.t[1].name, "v");
        CHECK_EQ_INT(l.t[1].offset - l.t[0].offset, 4); /* storage_offset 2 elements of F16 */
        CHECK(l.t[1].contiguous && l.t[1].nbytes == 8);
    }
    cvt_tensor_list_free(&l);
    free(z.p);
    int bad = 0;
    for (size_t n = 0; n < pk.n; n++)
        bad += pickle_bytes(pk.p, n) == CVT_ERR_NONE;
    CHECK_EQ_INT(bad, 0);
    free(pk.p);
    /* non-contiguous view is cataloged as such; out-of-storage view is refused */
    struct pk_tensor nc = {"t", "FloatStorage", "0", 6, 0, 2, {3, 2}, {1, 3}, false};
    pk = pk_build(&nc, 1);
    CHECK_EQ_INT(cvt_pickle_parse_only("data.pkl", pk.p, pk.n, &l), CVT_ERR_NONE);
    CHECK(l.n == 1 && !l.t[0].contiguous);
    cvt_tensor_list_free(&l);
    free(pk.p);
    struct pk_tensor oob = {"t", "FloatStorage", "0", 6, 1, 2, {2, 3}, {3, 1}, false};
    pk = pk_build(&oob, 1);
    CHECK_EQ_INT(pickle_bytes(pk.p, pk.n), CVT_ERR_SHAPE);
    free(pk.p);

    /* forbidden GLOBALs */
    static const char os_system[] = "\x80\x02" "cos\nsystem\n" "X\x02\x00\x00\x00ls" "\x85R.";
    CHECK_EQ_INT(pickle_bytes(os_system, sizeof os_system - 1), CVT_ERR_PICKLE);
    CHECK(strstr(qs_log_last(), "os system") != NULL);
    static const char eval[] = "\x80\x02" "cbuiltins\neval\n" "X\x01\x00\x00\x001" "\x85R.";
    CHECK_EQ_INT(pickle_bytes(eval, sizeof eval - 1), CVT_ERR_PICKLE);
    CHECK(strstr(qs_log_last(), "builtins eval") != NULL);
    static const char torch_other[] = "\x80\x02" "ctorch\nload\n.";
    CHECK_EQ_INT(pickle_bytes(torch_other, sizeof torch_other - 1), CVT_ERR_PICKLE);
    static const char stack_global[] = "\x80\x04" "\x8c\x02os\x8c\x06system\x93.";
    CHECK_EQ_INT(pickle_bytes(stack_global, sizeof stack_global - 1), CVT_ERR_PICKLE);
    CHECK(strstr(qs_log_last(), "os system") != NULL);
    /* other opcodes that build objects: INST, OBJ, NEWOBJ */
    static const char inst[] = "\x80\x02(ios\nsystem\n.";
    CHECK_EQ_INT(pickle_bytes(inst, sizeof inst - 1), CVT_ERR_PICKLE);
    static const char newobj[] = "\x80\x02" "ccollections\nOrderedDict\n)\x81.";
    CHECK_EQ_INT(pickle_bytes(newobj, sizeof newobj - 1), CVT_ERR_PICKLE);
    /* calling a storage class, or an allowed callable with junk */
    static const char call_storage[] = "\x80\x02" "ctorch\nFloatStorage\n)R.";
    CHECK_EQ_INT(pickle_bytes(call_storage, sizeof call_storage - 1), CVT_ERR_PICKLE);
    static const char bad_rebuild[] = "\x80\x02" "ctorch._utils\n_rebuild_tensor_v2\nK\x01\x85R.";
    CHECK_EQ_INT(pickle_bytes(bad_rebuild, sizeof bad_rebuild - 1), CVT_ERR_PICKLE);
    /* memo index never stored; huge memo index */
    static const char memo_oob[] = "\x80\x02}q\x00h\x05.";
    CHECK_EQ_INT(pickle_bytes(memo_oob, sizeof memo_oob - 1), CVT_ERR_PICKLE);
    CHECK(strstr(qs_log_last(), "memo") != NULL);
    static const char memo_huge[] = "\x80\x02}r\xff\xff\xff\x7f.";
    CHECK_EQ_INT(pickle_bytes(memo_huge, sizeof memo_huge - 1), CVT_ERR_PICKLE);
    static const char lbinget[] = "\x80\x02j\xff\xff\xff\xff.";
    CHECK_EQ_INT(pickle_bytes(lbinget, sizeof lbinget - 1), CVT_ERR_PICKLE);
    /* stack underflow, STOP with junk, no STOP, SETITEMS on a list, odd SETITEMS */
    CHECK_EQ_INT(pickle_bytes("\x80\x02R.", 4), CVT_ERR_PICKLE);
    CHECK_EQ_INT(pickle_bytes("\x80\x02}}.", 5), CVT_ERR_PICKLE);
    CHECK_EQ_INT(pickle_bytes("\x80\x02}", 3), CVT_ERR_PICKLE);
    CHECK_EQ_INT(pickle_bytes("\x80\x02](K\x01K\x02u.", 11), CVT_ERR_PICKLE);
    CHECK_EQ_INT(pickle_bytes("\x80\x02}(K\x01u.", 8), CVT_ERR_PICKLE);
    CHECK_EQ_INT(pickle_bytes("\x80\x02}(.", 5), CVT_ERR_PICKLE);       /* open MARK at STOP */
    CHECK_EQ_INT(pickle_bytes("\x80\x02K\x01.", 5), CVT_ERR_PICKLE);    /* not a dict */
    CHECK_EQ_INT(pickle_bytes("\x80\x02}X\x01\x00\x00\x00aK\x01s.", 13), CVT_ERR_PICKLE); /* value not a tensor */
    CHECK_EQ_INT(pickle_bytes("\x80\x02X\xff\xff\xff\x7f.", 8), CVT_ERR_PICKLE); /* string past the end */
    CHECK_EQ_INT(pickle_bytes("\x80\x09}.", 4), CVT_ERR_PICKLE);        /* protocol 9 */
    /* deeply nested: 100000 MARKs; 1e6 nested TUPLE1 (no recursion anywhere) */
    size_t n = 100000;
    char *deep = malloc(n + 4);
    deep[0] = (char)0x80;
    deep[1] = 2;
    memset(deep + 2, '(', n);
    deep[n + 2] = '.';
    CHECK_EQ_INT(pickle_bytes(deep, n + 3), CVT_ERR_PICKLE);
    free(deep);
    n = 1000000;
    deep = malloc(n + 8);
    deep[0] = (char)0x80;
    deep[1] = 2;
    deep[2] = ')';
    memset(deep + 3, 0x85, n);
    deep[n + 3] = '.';
    CHECK_EQ_INT(pickle_bytes(deep, n + 4), CVT_ERR_PICKLE); /* parses, then: a tuple, not a dict */
    CHECK(strstr(qs_log_last(), "tuple") != NULL);
    free(deep);
    /* a list nested 1e6 deep through APPEND of fresh lists and memo cycles */
    static const char cycle[] = "\x80\x02]q\x00h\x00" "a.";
    CHECK_EQ_INT(pickle_bytes(cycle, sizeof cycle - 1), CVT_ERR_PICKLE);
    /* many objects: 2M EMPTY_DICT pushes hit the stack limit cleanly */
    n = 2000000;
    deep = malloc(n + 4);
    deep[0] = (char)0x80;
    deep[1] = 2;
    memset(deep + 2, '}', n);
    deep[n + 2] = '.';
    CHECK_EQ_INT(pickle_bytes(deep, n + 3), CVT_ERR_PICKLE);
    free(deep);
    qs_log_set_quiet(false);
}

static struct buf tiny_zip(const char *byteorder, bool legacy_name)
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

static void test_zip_hostile(void)
{
    struct cvt_tensor_list l;
    struct buf z = tiny_zip("little", false);
    CHECK_EQ_INT(cvt_torchzip_parse("m.bin", z.p, z.n, &l), CVT_ERR_NONE);
    CHECK(l.n == 1 && l.t[0].offset % 64 == 0 && l.t[0].nbytes == 8);
    if (l.n == 1)
        CHECK(memcmp(z.p + l.t[0].offset, (uint16_t[]){0x3c00, 0x4000, 0xbc00, 0}, 8) == 0);
    cvt_tensor_list_free(&l);
    qs_log_set_quiet(true);
    int bad = 0;
    for (size_t n = 0; n < z.n; n++)
        bad += cvt_torchzip_parse("m.bin", z.p, n, &l) == CVT_ERR_NONE;
    CHECK_EQ_INT(bad, 0);
    /* one flipped byte in data.pkl: CRC */
    z.p[64 + 10] ^= 0x40;
    CHECK_EQ_INT(cvt_torchzip_parse("m.bin", z.p, z.n, &l), CVT_ERR_ZIP);
    free(z.p);
    z = tiny_zip("big", true);
    CHECK_EQ_INT(cvt_torchzip_parse("m.bin", z.p, z.n, &l), CVT_ERR_UNSUPPORTED);
    CHECK(strstr(qs_log_last(), "big") != NULL);
    free(z.p);
    z = tiny_zip(NULL, true); /* no byteorder record (older writers): little assumed */
    CHECK_EQ_INT(cvt_torchzip_parse("m.bin", z.p, z.n, &l), CVT_ERR_NONE);
    cvt_tensor_list_free(&l);
    /* compressed entry: set method 8 in the central directory of the data.pkl entry */
    uint64_t cd;
    memcpy(&cd, z.p + z.n - 22 + 16, 4);
    cd &= 0xffffffffu;
    z.p[cd + 10] = 8;
    CHECK_EQ_INT(cvt_torchzip_parse("m.bin", z.p, z.n, &l), CVT_ERR_ZIP);
    CHECK(strstr(qs_log_last(), "compressed") != NULL);
    free(z.p);
    /* ZIP64 records (archives > 4 GB) */
    {
        struct pk_tensor zt = {"w", "HalfStorage", "0", 4, 0, 1, {4}, {1}, false};
        struct buf zpk = pk_build(&zt, 1);
        uint16_t d4[4] = {0x3c00, 0x4000, 0xbc00, 0};
        struct zipb zz = {0};
        zip_add(&zz, "archive/data.pkl", zpk.p, zpk.n);
        zip_add(&zz, "archive/data/0", d4, sizeof d4);
        struct buf z64 = zip_finish64(&zz);
        CHECK_EQ_INT(cvt_torchzip_parse("m64.bin", z64.p, z64.n, &l), CVT_ERR_NONE);
        CHECK(l.n == 1 && l.t[0].nbytes == 8 && memcmp(z64.p + l.t[0].offset, d4, 8) == 0);
        cvt_tensor_list_free(&l);
        /* ZIP64 sizes announced but the locator missing */
        size_t eocd = z64.n - 22;
        memset(z64.p + eocd - 20, 0, 4);
        CHECK_EQ_INT(cvt_torchzip_parse("m64.bin", z64.p, z64.n, &l), CVT_ERR_ZIP);
        free(z64.p);
        free(zpk.p);
    }
    /* legacy torch file */
    static const uint8_t legacy[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, '.'};
    CHECK_EQ_INT(cvt_torchzip_parse("old.bin", legacy, sizeof legacy, &l), CVT_ERR_UNSUPPORTED);
    CHECK_EQ_INT(cvt_torchzip_parse("x.bin", (const uint8_t *)"hello world, not a zip at all.....................................", 60, &l),
                 CVT_ERR_ZIP);
    /* storage whose record is missing / the wrong size */
    struct pk_tensor pt = {"w", "HalfStorage", "7", 4, 0, 1, {4}, {1}, false};
    struct buf pk = pk_build(&pt, 1);
    struct zipb zb = {0};
    zip_add(&zb, "archive/data.pkl", pk.p, pk.n);
    zip_add(&zb, "archive/data/0", "12345678", 8);
    z = zip_finish(&zb);
    CHECK_EQ_INT(cvt_torchzip_parse("m.bin", z.p, z.n, &l), CVT_ERR_PICKLE);
    CHECK(strstr(qs_log_last(), "archive/data/7") != NULL);
    free(z.p);
    free(pk.p);
    qs_log_set_quiet(false);
}

/* --- configs ---------------------------------------------------------------------------------------- */

static enum cvt_err cfg_parse(const char *c, const char *q, const char *z, const char *g, struct cvt_hf_config *cfg)
{
    return cvt_config_parse("test", c, c ? strlen(c) : 0, q, q ? strlen(q) : 0, z, z ? strlen(z) : 0, g, g ? strlen(g) : 0,
                            cfg);
}

static char *corpus_file(const char *name, size_t *n)
{
    char p[512];
    snprintf(p, sizeof p, "tests/data/fuzz/fuzz_config/%s", name);
    return read_text(p, n);
}

#define BASE_CFG "\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 4096, \"intermediate_size\": 11008, " \
                 "\"num_hidden_layers\": 32, \"num_attention_heads\": 32, \"vocab_size\": 32000"

static void test_configs(void)
{
    struct cvt_hf_config cfg;
    size_t n;
    /* Real configs (HuggingFace repos; see tests/data/fuzz/README.md). */
    char *t = corpus_file("Llama-3.1-70B-Instruct-AWQ-INT4.config.json", &n);
    CHECK(t != NULL);
    if (t) {
        CHECK_EQ_INT(cvt_config_parse("real", t, n, NULL, 0, NULL, 0, NULL, 0, &cfg), CVT_ERR_NONE);
        CHECK_EQ_INT(cfg.arch, cvt_arch_find("llama"));
        CHECK_EQ_INT(cfg.hidden_size, 8192);
        CHECK_EQ_INT(cfg.num_key_value_heads, 8);
        CHECK_EQ_INT(cfg.head_dim, 128);
        CHECK_EQ_INT(cfg.rope_scaling.type, QS_ROPE_LLAMA3);
        CHECK(cfg.rope_scaling.factor == 8.0 && cfg.rope_scaling.high_freq_factor == 4.0);
        CHECK_EQ_INT(cfg.rope_scaling.original_max_position_embeddings, 8192);
        CHECK(cfg.rope_theta == 500000.0);
        CHECK_EQ_INT(cfg.n_eos, 3);
        CHECK_EQ_INT(cfg.eos_token_id[2], 128009);
        CHECK_EQ_INT(cfg.quant.from, CVT_QCFG_CONFIG_JSON);
        CHECK_EQ_INT(cfg.quant.group_size, 128);
        CHECK_EQ_INT(cfg.quant.variant_mask, CVT_VARIANT_BIT(CVT_VARIANT_GEMM));
        CHECK(cfg.config_json_size == n && memcmp(cfg.config_json, t, n) == 0);
        cvt_config_free(&cfg);
        /* + generation_config with an eos list (casperhansen/llama-3-70b-instruct-awq) */
        size_t gn;
        char *g = corpus_file("llama-3-70b-instruct-awq.generation_config.json", &gn);
        CHECK(g != NULL);
        if (g) {
            CHECK_EQ_INT(cvt_config_parse("real", t, n, NULL, 0, NULL, 0, g, gn, &cfg), CVT_ERR_NONE);
            CHECK_EQ_INT(cfg.n_eos, 3); /* {128001, 128008, 128009} U {128001, 128009} */
            CHECK_EQ_INT(cfg.bos_token_id, 128000);
            CHECK(cfg.generation_config_json && cfg.generation_config_json_size == gn);
            cvt_config_free(&cfg);
            free(g);
        }
        free(t);
    }
    t = corpus_file("Qwen2.5-72B-Instruct-ko-AWQ.config.json", &n);
    if (t) {
        CHECK_EQ_INT(cvt_config_parse("real", t, n, NULL, 0, NULL, 0, NULL, 0, &cfg), CVT_ERR_NONE);
        CHECK_EQ_INT(cfg.arch, cvt_arch_find("qwen2"));
        CHECK(cfg.bias_roles == CVT_ROLE_BIT(FMT_N_QKV)); /* q/k/v, not o */
        CHECK_EQ_INT(cfg.intermediate_size, 29568);
        CHECK_EQ_INT(cfg.vocab_size, 152064);
        CHECK_EQ_INT(cfg.sliding_window, 0);
        cvt_config_free(&cfg);
        free(t);
    }
    t = corpus_file("Mistral-7B-v0.1-AWQ.config.json", &n);
    if (t) {
        CHECK_EQ_INT(cvt_config_parse("real", t, n, NULL, 0, NULL, 0, NULL, 0, &cfg), CVT_ERR_NONE);
        CHECK_EQ_INT(cfg.arch, cvt_arch_find("mistral"));
        CHECK_EQ_INT(cfg.sliding_window, 4096);
        CHECK_EQ_STR(cfg.torch_dtype, "bfloat16");
        cvt_config_free(&cfg);
        free(t);
    }
    t = corpus_file("mistral-7b-instruct-awq-gemv.config.json", &n);
    if (t) {
        CHECK_EQ_INT(cvt_config_parse("real", t, n, NULL, 0, NULL, 0, NULL, 0, &cfg), CVT_ERR_NONE);
        CHECK_EQ_INT(cfg.quant.variant_mask, CVT_VARIANT_BIT(CVT_VARIANT_GEMV));
        cvt_config_free(&cfg);
        free(t);
    }
    t = corpus_file("LLaMA-30b-AWQ.quant_config.json", &n);
    if (t) {
        CHECK_EQ_INT(cfg_parse("{" BASE_CFG "}", t, NULL, NULL, &cfg), CVT_ERR_NONE);
        CHECK_EQ_INT(cfg.quant.from, CVT_QCFG_QUANT_CONFIG_JSON);
        CHECK_EQ_STR(cfg.quant.version, "gemm");
        CHECK_EQ_INT(cfg.num_key_value_heads, 32);
        CHECK_EQ_INT(cfg.head_dim, 128);
        cvt_config_free(&cfg);
        free(t);
    }
    t = corpus_file("Llama-2-7b-chat-hf-w4-g128-awq.quantize_config.json", &n);
    if (t) {
        CHECK_EQ_INT(cfg_parse("{" BASE_CFG "}", NULL, t, NULL, &cfg), CVT_ERR_NONE);
        CHECK_EQ_INT(cfg.quant.from, CVT_QCFG_QUANTIZE_CONFIG_JSON);
        CHECK_EQ_INT(cfg.quant.variant_mask, CVT_VARIANT_BIT(CVT_VARIANT_GEMM));
        cvt_config_free(&cfg);
        free(t);
    }
    /* Bad ones: each refused with its own code and a message naming the cause. */
    qs_log_set_quiet(true);
    static const struct {
        const char *cfg, *qcfg, *want_msg;
        enum cvt_err want;
    } bad[] = {
        {"{" BASE_CFG ", \"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 8, \"group_size\": 128}}", NULL, "bits", CVT_ERR_UNSUPPORTED},
        {"{" BASE_CFG ", \"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"zero_point\": false}}", NULL, "zero_point", CVT_ERR_UNSUPPORTED},
        {"{" BASE_CFG ", \"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128}}", NULL, "gptq", CVT_ERR_UNSUPPORTED},
        {"{" BASE_CFG ", \"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"version\": \"marlin\"}}", NULL, "marlin", CVT_ERR_UNSUPPORTED},
        {"{" BASE_CFG ", \"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"version\": \"gemm_v9\"}}", NULL, "gemm_v9", CVT_ERR_UNSUPPORTED},
        {"{" BASE_CFG ", \"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128}}",
         "{\"zero_point\": true, \"q_group_size\": 64, \"w_bit\": 4, \"version\": \"GEMM\"}", "disagree", CVT_ERR_CONFIG},
        {"{" BASE_CFG ", \"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2.0}}", NULL, "dynamic", CVT_ERR_UNSUPPORTED},
        {"{" BASE_CFG ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 2.0}}", NULL, "yarn", CVT_ERR_UNSUPPORTED},
        {"{\"architectures\": [\"FalconForCausalLM\"], \"hidden_size\": 4544}", NULL, "FalconForCausalLM", CVT_ERR_UNSUPPORTED},
        {"{\"model_type\": \"mpt\"}", NULL, "mpt", CVT_ERR_UNSUPPORTED},
        {"{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"mistral\", \"hidden_size\": 8}", NULL, "disagree", CVT_ERR_CONFIG},
        {"[1, 2, 3]", NULL, "JSON object", CVT_ERR_JSON},
        {"{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 4096", NULL, "JSON object", CVT_ERR_JSON},
        {"{\"architectures\": [\"LlamaForCausalLM\"], \"intermediate_size\": 11008}", NULL, "hidden_size", CVT_ERR_CONFIG},
        {"{" BASE_CFG ", \"num_key_value_heads\": 5}", NULL, "num_key_value_heads", CVT_ERR_CONFIG},
        {"{" BASE_CFG ", \"rms_norm_eps\": -1}", NULL, "rms_norm_eps", CVT_ERR_CONFIG},
        {"{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 4096, \"intermediate_size\": 11008, "
         "\"num_hidden_layers\": 32, \"num_attention_heads\": 32, \"vocab_size\": 1e30}", NULL, "vocab_size", CVT_ERR_CONFIG},
        {"{" BASE_CFG ", \"vocab_size\": 64}", NULL, "vocab_size", CVT_ERR_JSON}, /* duplicate key */
        {"{" BASE_CFG ", \"eos_token_id\": [2, \"x\"]}", NULL, "eos_token_id", CVT_ERR_CONFIG},
        {"{" BASE_CFG ", \"eos_token_id\": 99999}", NULL, "eos_token_id", CVT_ERR_CONFIG},
        {"{" BASE_CFG ", \"hidden_act\": \"gelu\"}", NULL, "gelu", CVT_ERR_UNSUPPORTED},
        {"{\"architectures\": [\"Qwen2ForCausalLM\"], \"hidden_size\": 64, \"intermediate_size\": 64, \"num_hidden_layers\": 4, "
         "\"num_attention_heads\": 1, \"vocab_size\": 64, \"use_sliding_window\": true, \"max_window_layers\": 2}", NULL, "max_window_layers",
         CVT_ERR_UNSUPPORTED},
        {"{" BASE_CFG ", \"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 4}}", NULL, "group", CVT_ERR_CONFIG},
        {"{" BASE_CFG ", \"tie_word_embeddings\": \"yes\"}", NULL, "tie_word_embeddings", CVT_ERR_CONFIG},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        enum cvt_err e = cfg_parse(bad[i].cfg, bad[i].qcfg, NULL, NULL, &cfg);
        CHECK_MSG(e == bad[i].want, "bad config %zu: got %s, want %s (%s)", i, cvt_err_str(e), cvt_err_str(bad[i].want),
                  qs_log_last());
        CHECK_MSG(strstr(qs_log_last(), bad[i].want_msg) != NULL, "bad config %zu: message '%s' lacks '%s'", i,
                  qs_log_last(), bad[i].want_msg);
        CHECK(cfg.config_json == NULL);
    }
    qs_log_set_quiet(false);
    /* quant config nested under text_config (VLM-style wrapper, PITFALLS P21 c) */
    CHECK_EQ_INT(cfg_parse("{" BASE_CFG ", \"text_config\": {\"quantization_config\": {\"quant_method\": \"awq\", "
                           "\"bits\": 4, \"group_size\": 64, \"version\": \"gemv\"}}}", NULL, NULL, NULL, &cfg),
                 CVT_ERR_NONE);
    CHECK_EQ_INT(cfg.quant.group_size, 64);
    CHECK_EQ_INT(cfg.quant.variant_mask, CVT_VARIANT_BIT(CVT_VARIANT_GEMV));
    cvt_config_free(&cfg);
    /* quantize_config.json that is really GPTQ */
    qs_log_set_quiet(true);
    CHECK_EQ_INT(cfg_parse("{" BASE_CFG "}", NULL, "{\"bits\": 4, \"group_size\": 128, \"desc_act\": false, \"sym\": true}", NULL, &cfg),
                 CVT_ERR_UNSUPPORTED);
    qs_log_set_quiet(false);
    /* defaults and two agreeing quant configs (AutoAWQ 0.1.6-0.1.8 wrote both) */
    CHECK_EQ_INT(cfg_parse("{" BASE_CFG ", \"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, "
                           "\"version\": \"gemm\", \"modules_to_not_convert\": [\"gate\"]}}",
                           "{\"zero_point\": true, \"q_group_size\": 128, \"w_bit\": 4, \"version\": \"GEMM\"}", NULL, NULL, &cfg),
                 CVT_ERR_NONE);
    CHECK_EQ_INT(cfg.quant.n_modules_to_not_convert, 1);
    CHECK(cvt_config_skips_module(&cfg, "model.layers.0.block_sparse_moe.gate"));
    CHECK(!cvt_config_skips_module(&cfg, "model.layers.0.self_attn.q_proj"));
    CHECK(cfg.rms_norm_eps == 1e-6 && cfg.rope_theta == 10000.0);
    CHECK_EQ_INT(cfg.max_position_embeddings, 2048);
    cvt_config_free(&cfg);
}

/* --- directory level ------------------------------------------------------------------------------- */

static void test_directory(void)
{
    struct canon c;
    canon_rand(&c, 256, 128, 128);
    struct st_tensor t[16];
    void *keep[8];
    int nkeep = 0;
    int nt = pack_variant(&c, CVT_VARIANT_GEMM, "model.layers.0.self_attn.q_proj", false, false, t, keep, &nkeep);
    float emb[64 * 4];
    for (int i = 0; i < 64 * 4; i++)
        emb[i] = (float)i - 100.0f;
    uint16_t bf[4] = {0x3f80, 0x4780, 0x4790, 0x7fc0}; /* 1, 65536, 73728, NaN (bf16) */
    t[nt++] = (struct st_tensor){"model.embed_tokens.weight", "F32", 2, {64, 4}, emb, sizeof emb};
    t[nt++] = (struct st_tensor){"model.norm.weight", "BF16", 1, {4}, bf, sizeof bf};
    char *d = mkdir_tmp("dir-single");
    char dir[512];
    snprintf(dir, sizeof dir, "%s", d);
    write_config(dir, 128, "gemm", NULL);
    struct buf b = st_build(t, nt);
    write_file(dir, "model.safetensors", b.p, b.n);
    free(b.p);
    write_file(dir, "tokenizer.json", "{\"model\": {}}", 13);
    struct cvt_source *src = NULL;
    CHECK_EQ_INT(cvt_source_open(dir, &src), CVT_ERR_NONE);
    if (src) {
        CHECK_EQ_INT(cvt_source_container(src), CVT_CONTAINER_SAFETENSORS);
        CHECK_EQ_INT(cvt_source_n_tensors(src), nt);
        CHECK_EQ_INT(cvt_source_n_tokenizer_files(src), 1);
        CHECK_EQ_STR(cvt_source_tokenizer_file(src, 0)->name, "tokenizer.json");
        CHECK_EQ_INT(cvt_source_total_bytes(src), cvt_source_file(src, 0)->size);
        const struct cvt_src_tensor *e = cvt_source_find(src, "model.embed_tokens.weight");
        CHECK(e && e->dtype == CVT_DT_F32 && e->numel == 256);
        CHECK(cvt_source_find(src, "model.embed_tokens") == NULL);
        uint16_t h[256];
        float f[256];
        if (e) {
            CHECK_EQ_INT(cvt_source_read_f16(src, e, 4, 8, h), CVT_ERR_NONE);
            CHECK(h2f(h[0]) == -96.0f && h2f(h[7]) == -89.0f);
            CHECK_EQ_INT(cvt_source_read_f32(src, e, 0, 256, f), CVT_ERR_NONE);
            CHECK(f[255] == 155.0f);
            CHECK_EQ_INT(cvt_source_read(src, e, f, sizeof f), CVT_ERR_NONE);
            CHECK(memcmp(f, emb, sizeof emb) == 0);
            qs_log_set_quiet(true);
            CHECK_EQ_INT(cvt_source_read(src, e, f, 16), CVT_ERR_ARG);
            CHECK_EQ_INT(cvt_source_read_f32(src, e, 250, 7, f), CVT_ERR_ARG);
            qs_log_set_quiet(false);
        }
        const struct cvt_src_tensor *nw = cvt_source_find(src, "model.norm.weight");
        if (nw) {
            qs_log_set_quiet(true);
            CHECK_EQ_INT(cvt_source_read_f16(src, nw, 0, 1, h), CVT_ERR_NONE);
            CHECK_EQ_INT(h[0], 0x3c00);
            CHECK_EQ_INT(cvt_source_read_f16(src, nw, 1, 1, h), CVT_ERR_RANGE); /* 65536 */
            CHECK(strstr(qs_log_last(), "model.norm.weight") && strstr(qs_log_last(), "element 1"));
            CHECK_EQ_INT(cvt_source_read_f32(src, nw, 0, 4, f), CVT_ERR_NAN);
            CHECK(strstr(qs_log_last(), "element 3") != NULL);
            const struct cvt_src_tensor *qw = cvt_source_find(src, "model.layers.0.self_attn.q_proj.qweight");
            CHECK(qw && cvt_source_read_f32(src, qw, 0, 1, f) == CVT_ERR_DTYPE);
            qs_log_set_quiet(false);
        }
        cvt_source_close(src);
    }
    qs_log_set_quiet(true);
    /* qweight but no quant config */
    static const char plain_cfg[] = "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 256, \"intermediate_size\": 512, "
                                    "\"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"vocab_size\": 64}";
    write_file(dir, "config.json", plain_cfg, strlen(plain_cfg));
    CHECK_EQ_INT(cvt_source_open(dir, &src), CVT_ERR_CONFIG);
    CHECK(src == NULL);
    CHECK(strstr(qs_log_last(), "quant config") != NULL);
    /* ... fixed by a quant_config.json */
    static const char qc[] = "{\"zero_point\": true, \"q_group_size\": 128, \"w_bit\": 4, \"version\": \"GEMM\"}";
    write_file(dir, "quant_config.json", qc, strlen(qc));
    CHECK_EQ_INT(cvt_source_open(dir, &src), CVT_ERR_NONE);
    cvt_source_close(src);
    /* a second unindexed .safetensors */
    write_file(dir, "extra.safetensors", "x", 1);
    CHECK_EQ_INT(cvt_source_open(dir, &src), CVT_ERR_INDEX);
    rm_file(dir, "extra.safetensors");
    /* broken tokenizer JSON */
    write_file(dir, "tokenizer_config.json", "{oops", 5);
    CHECK_EQ_INT(cvt_source_open(dir, &src), CVT_ERR_JSON);
    CHECK(strstr(qs_log_last(), "tokenizer_config.json") != NULL);
    rm_file(dir, "tokenizer_config.json");
    /* no weights at all; no config; not a directory */
    rm_file(dir, "model.safetensors");
    CHECK_EQ_INT(cvt_source_open(dir, &src), CVT_ERR_MISSING_TENSOR);
    rm_file(dir, "config.json");
    CHECK_EQ_INT(cvt_source_open(dir, &src), CVT_ERR_CONFIG);
    CHECK_EQ_INT(cvt_source_open("/nonexistent/qshard-test", &src), CVT_ERR_IO);

    /* sharded: index naming two shards; then break it in each way */
    char sd[512];
    snprintf(sd, sizeof sd, "%s", mkdir_tmp("dir-sharded"));
    write_config(sd, 128, "gemm", NULL);
    struct buf s1 = st_build(t, 3), s2 = st_build(t + 3, nt - 3);
    write_file(sd, "model-00001-of-00002.safetensors", s1.p, s1.n);
    write_file(sd, "model-00002-of-00002.safetensors", s2.p, s2.n);
    char idx[2048];
#define IDX_FMT "{\"metadata\": {\"total_size\": 1}, \"weight_map\": {\"%s\": \"%s\", \"%s\": \"%s\", \"%s\": \"%s\", " \
                "\"%s\": \"%s\", \"%s\": \"%s\"%s}}"
    const char *f1 = "model-00001-of-00002.safetensors", *f2 = "model-00002-of-00002.safetensors";
    snprintf(idx, sizeof idx, IDX_FMT, t[0].name, f1, t[1].name, f1, t[2].name, f1, t[3].name, f2, t[4].name, f2, "");
    write_file(sd, "model.safetensors.index.json", idx, strlen(idx));
    CHECK_EQ_INT(cvt_source_open(sd, &src), CVT_ERR_NONE);
    if (src) {
        CHECK_EQ_INT(cvt_source_container(src), CVT_CONTAINER_SAFETENSORS_SHARDED);
        CHECK_EQ_INT(cvt_source_n_files(src), 2);
        CHECK_EQ_INT(cvt_source_total_bytes(src), s1.n + s2.n);
        struct cvt_awq_linear lin;
        CHECK_EQ_INT(cvt_awq_load(src, cvt_source_config(src), "model.layers.0.self_attn.q_proj", 256, 128, 0, 256, 0, 128, &lin),
                     CVT_ERR_NONE);
        CHECK(lin.q && memcmp(lin.q, c.q, 256 * 128) == 0);
        cvt_awq_linear_free(&lin);
        cvt_source_close(src);
    }
    /* wrong shard */
    snprintf(idx, sizeof idx, IDX_FMT, t[0].name, f1, t[1].name, f2, t[2].name, f1, t[3].name, f2, t[4].name, f2, "");
    write_file(sd, "model.safetensors.index.json", idx, strlen(idx));
    CHECK_EQ_INT(cvt_source_open(sd, &src), CVT_ERR_INDEX);
    CHECK(strstr(qs_log_last(), t[1].name) != NULL);
    /* tensor not listed */
    snprintf(idx, sizeof idx, "{\"weight_map\": {\"%s\": \"%s\", \"%s\": \"%s\", \"%s\": \"%s\", \"%s\": \"%s\"}}", t[0].name, f1,
             t[1].name, f1, t[2].name, f1, t[3].name, f2);
    write_file(sd, "model.safetensors.index.json", idx, strlen(idx));
    CHECK_EQ_INT(cvt_source_open(sd, &src), CVT_ERR_INDEX);
    CHECK(strstr(qs_log_last(), t[4].name) != NULL);
    /* listed but absent */
    snprintf(idx, sizeof idx, IDX_FMT, t[0].name, f1, t[1].name, f1, t[2].name, f1, t[3].name, f2, t[4].name, f2,
             ", \"ghost.weight\": \"model-00002-of-00002.safetensors\"");
    write_file(sd, "model.safetensors.index.json", idx, strlen(idx));
    CHECK_EQ_INT(cvt_source_open(sd, &src), CVT_ERR_INDEX);
    CHECK(strstr(qs_log_last(), "ghost.weight") != NULL);
    /* path traversal in a shard name */
    snprintf(idx, sizeof idx, IDX_FMT, t[0].name, "../x.safetensors", t[1].name, f1, t[2].name, f1, t[3].name, f2, t[4].name, f2, "");
    write_file(sd, "model.safetensors.index.json", idx, strlen(idx));
    CHECK_EQ_INT(cvt_source_open(sd, &src), CVT_ERR_INDEX);
    /* a shard the index does not name */
    snprintf(idx, sizeof idx, IDX_FMT, t[0].name, f1, t[1].name, f1, t[2].name, f1, t[3].name, f2, t[4].name, f2, "");
    write_file(sd, "model.safetensors.index.json", idx, strlen(idx));
    write_file(sd, "model-00003-of-00002.safetensors", s2.p, s2.n);
    CHECK_EQ_INT(cvt_source_open(sd, &src), CVT_ERR_INDEX);
    CHECK(strstr(qs_log_last(), "model-00003-of-00002.safetensors") != NULL);
    rm_file(sd, "model-00003-of-00002.safetensors");
    /* missing shard */
    rm_file(sd, f2);
    CHECK_EQ_INT(cvt_source_open(sd, &src), CVT_ERR_INDEX);
    CHECK(strstr(qs_log_last(), f2) != NULL);
    /* index not JSON */
    write_file(sd, "model.safetensors.index.json", "[]", 2);
    CHECK_EQ_INT(cvt_source_open(sd, &src), CVT_ERR_JSON);
    qs_log_set_quiet(false);
    free(s1.p);
    free(s2.p);
    for (int i = 0; i < nkeep; i++)
        free(keep[i]);
    canon_free(&c);
}

/* --- fixtures ----------------------------------------------------------------------------------------- */

/* Expected (K, N) of a linear from its name and the config (DESIGN.md section 5 / AWQ-FORMATS 8). */
static bool linear_dims(const struct cvt_hf_config *c, const char *prefix, int64_t *K, int64_t *N)
{
    const int64_t H = c->hidden_size, I = c->intermediate_size, q = c->num_attention_heads * c->head_dim,
                  kv = c->num_key_value_heads * c->head_dim;
    static const struct {
        const char *suf;
        int k, n; /* 0 H, 1 I, 2 q, 3 kv */
    } map[] = {{".q_proj", 0, 2}, {".k_proj", 0, 3}, {".v_proj", 0, 3}, {".o_proj", 2, 0}, {".gate_proj", 0, 1},
               {".up_proj", 0, 1}, {".down_proj", 1, 0}, {".w1", 0, 1}, {".w3", 0, 1}, {".w2", 1, 0}};
    const int64_t v[4] = {H, I, q, kv};
    size_t pl = strlen(prefix);
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        size_t sl = strlen(map[i].suf);
        if (pl > sl && strcmp(prefix + pl - sl, map[i].suf) == 0) {
            *K = v[map[i].k];
            *N = v[map[i].n];
            return true;
        }
    }
    return false;
}

/* Decode every quantized linear and read every float tensor; returns the first error (all
 * messages appended to msgs). With `out`, the decoded linears are kept for twin comparison. */
struct decoded {
    char                  name[128];
    struct cvt_awq_linear lin;
};

static enum cvt_err decode_all(const char *dir, char *msgs, size_t cap, struct decoded *out, int *n_out, int max_out,
                               int *n_checked)
{
    struct cvt_source *src = NULL;
    enum cvt_err first = cvt_source_open(dir, &src);
    size_t ml = 0;
    if (first) {
        snprintf(msgs, cap, "%s", qs_log_last());
        return first;
    }
    const struct cvt_hf_config *cfg = cvt_source_config(src);
    if (n_out)
        *n_out = 0;
    for (size_t i = 0; i < cvt_source_n_tensors(src); i++) {
        const struct cvt_src_tensor *t = cvt_source_tensor(src, i);
        enum cvt_err e = CVT_ERR_NONE;
        size_t nl = strlen(t->name);
        if (nl > 8 && strcmp(t->name + nl - 8, ".qweight") == 0) {
            char prefix[128];
            snprintf(prefix, sizeof prefix, "%.*s", (int)(nl - 8), t->name);
            int64_t K, N;
            if (!linear_dims(cfg, prefix, &K, &N))
                continue;
            struct cvt_awq_linear lin;
            e = cvt_awq_load(src, cfg, prefix, K, N, 0, K, 0, N, &lin);
            if (!e) {
                /* decode == independent source dequant, bitwise */
                float *w = malloc((size_t)(K * N) * sizeof *w);
                e = cvt_awq_dequant_source(src, cfg, prefix, K, N, 0, K, 0, N, w);
                int okd = 1;
                for (int64_t k = 0; k < K && !e; k++)
                    for (int64_t n = 0; n < N; n++) {
                        int64_t g = k / lin.G;
                        float r = (float)((int)lin.q[k * N + n] - (int)lin.z[g * N + n]) * h2f(lin.s[g * N + n]);
                        okd &= memcmp(&r, &w[k * N + n], 4) == 0;
                    }
                CHECK_MSG(okd, "%s: %s: decode and source dequant differ", dir, prefix);
                free(w);
                (*n_checked)++;
                if (out && *n_out < max_out) {
                    snprintf(out[*n_out].name, sizeof out[*n_out].name, "%s", prefix);
                    out[(*n_out)++].lin = lin;
                } else {
                    cvt_awq_linear_free(&lin);
                }
            }
        } else if (t->dtype == CVT_DT_F16 || t->dtype == CVT_DT_BF16 || t->dtype == CVT_DT_F32) {
            if ((nl > 7 && strcmp(t->name + nl - 7, ".scales") == 0) || (nl > 5 && strcmp(t->name + nl - 5, ".bias") == 0) ||
                strstr(t->name, "zeros"))
                continue; /* part of a linear */
            float *f = malloc((size_t)t->numel * sizeof *f + 4);
            e = cvt_source_read_f32(src, t, 0, (uint64_t)t->numel, f);
            free(f);
        }
        if (e) {
            if (!first)
                first = e;
            ml += (size_t)snprintf(msgs + ml, ml < cap ? cap - ml : 0, "%s\n", qs_log_last());
            if (ml >= cap)
                ml = cap - 1;
        }
    }
    cvt_source_close(src);
    return first;
}

static enum cvt_err category_err(const char *cat)
{
    static const struct {
        const char  *cat;
        enum cvt_err e;
    } m[] = {{"missing_shard", CVT_ERR_INDEX},     {"index_mismatch", CVT_ERR_INDEX},     {"truncated", CVT_ERR_SAFETENSORS},
             {"bad_header", CVT_ERR_SAFETENSORS},  {"bad_offsets", CVT_ERR_SAFETENSORS},  {"shape_mismatch", CVT_ERR_SHAPE},
             {"missing_tensor", CVT_ERR_MISSING_TENSOR}, {"unsupported_quant", CVT_ERR_UNSUPPORTED},
             {"bad_scale", CVT_ERR_NAN},           {"wrong_dtype", CVT_ERR_DTYPE},        {"bad_name", CVT_ERR_SAFETENSORS},
             {"forbidden_pickle", CVT_ERR_PICKLE}};
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
        if (strcmp(m[i].cat, cat) == 0)
            return m[i].e;
    return CVT_ERR_NONE;
}

static void test_bad_fixtures(void)
{
    size_t n;
    char *text = read_text("tests/data/bad/INDEX.json", &n);
    if (!text) {
        printf("test_cvt_src: tests/data/bad/INDEX.json absent, bad fixtures skipped\n");
        return;
    }
    cJSON *root = cJSON_Parse(text);
    CHECK(root != NULL);
    const cJSON *cases = cJSON_GetObjectItem(root, "cases"), *ctl = cJSON_GetObjectItem(root, "control");
    char *msgs = malloc(65536);
    int checked = 0, n_cases = 0;
    qs_log_set_quiet(true);
    if (ctl) {
        char dir[512];
        snprintf(dir, sizeof dir, "tests/data/%s", cJSON_GetObjectItem(ctl, "path")->valuestring);
        CHECK_MSG(decode_all(dir, msgs, 65536, NULL, NULL, 0, &checked) == CVT_ERR_NONE, "control %s: %s", dir, msgs);
    }
    for (const cJSON *c = cases ? cases->child : NULL; c; c = c->next) {
        const char *cat = cJSON_GetObjectItem(c, "category")->valuestring;
        const char *name = cJSON_GetObjectItem(c, "case")->valuestring;
        char dir[512];
        snprintf(dir, sizeof dir, "tests/data/%s", cJSON_GetObjectItem(c, "path")->valuestring);
        enum cvt_err want = category_err(cat);
        /* A missing non-quantized tensor and unknown tensors are the converter core's ledger. */
        const cJSON *should = cJSON_GetObjectItem(c, "message_should_name");
        bool ledger = strcmp(cat, "unknown_tensor") == 0 ||
                      (strcmp(cat, "missing_tensor") == 0 && should && should->child &&
                       !strstr(should->child->valuestring, "proj"));
        msgs[0] = 0;
        enum cvt_err got = decode_all(dir, msgs, 65536, NULL, NULL, 0, &checked);
        n_cases++;
        if (ledger) {
            CHECK_MSG(got == CVT_ERR_NONE, "bad case %s (core ledger's): input side says %s", name, msgs);
            continue;
        }
        CHECK_MSG(want != CVT_ERR_NONE && got == want, "bad case %s (%s): got %s, want %s: %s", name, cat, cvt_err_str(got),
                  cvt_err_str(want), msgs);
        for (const cJSON *s = should ? should->child : NULL; s; s = s->next)
            CHECK_MSG(strstr(msgs, s->valuestring) != NULL, "bad case %s: message lacks '%s': %s", name, s->valuestring, msgs);
        CHECK_EQ_INT(cvt_err_exit_code(got), cJSON_GetObjectItem(c, "expect_exit")->valueint);
    }
    qs_log_set_quiet(false);
    CHECK(n_cases >= 10);
    free(msgs);
    cJSON_Delete(root);
    free(text);
}

static void test_model_fixtures(void)
{
    size_t n;
    char *text = read_text("tests/data/models/INDEX.json", &n);
    if (!text) {
        printf("test_cvt_src: tests/data/models/INDEX.json absent, fixture models skipped\n");
        return;
    }
    cJSON *root = cJSON_Parse(text);
    const cJSON *models = cJSON_GetObjectItem(root, "models");
    enum { MAXL = 512 };
    struct decoded *ref = calloc(MAXL, sizeof *ref), *cur = calloc(MAXL, sizeof *cur);
    int n_ref = 0, checked = 0, twins = 0;
    char ref_group[64] = "", ref_name[64] = "";
    char *msgs = malloc(65536);
    qs_log_set_quiet(true);
    for (const cJSON *m = models ? models->child : NULL; m; m = m->next) {
        char dir[512];
        const char *name = cJSON_GetObjectItem(m, "name")->valuestring;
        snprintf(dir, sizeof dir, "tests/data/%s", cJSON_GetObjectItem(m, "path")->valuestring);
        const cJSON *tg = cJSON_GetObjectItem(m, "twin_group");
        int n_cur = 0;
        msgs[0] = 0;
        enum cvt_err e = decode_all(dir, msgs, 65536, cur, &n_cur, MAXL, &checked);
        CHECK_MSG(e == CVT_ERR_NONE, "fixture %s: %s", name, msgs);
        /* container and variant as INDEX.json says */
        struct cvt_source *src = NULL;
        if (cvt_source_open(dir, &src) == CVT_ERR_NONE) {
            const char *want_c = cJSON_GetObjectItem(m, "container")->valuestring;
            const char *got_c = cvt_container_str(cvt_source_container(src));
            CHECK_MSG(strncmp(want_c, got_c, strlen(got_c)) == 0, "fixture %s: container %s, INDEX says %s", name, got_c, want_c);
            const char *want_v = cJSON_GetObjectItem(m, "variant")->valuestring;
            enum cvt_variant wv = strcmp(want_v, "gemv") == 0        ? CVT_VARIANT_GEMV
                                  : strcmp(want_v, "gemv_fast") == 0 ? CVT_VARIANT_GEMV_FAST
                                  : strcmp(want_v, "llmawq-gen3") == 0 ? CVT_VARIANT_LLMAWQ_V3
                                                                       : CVT_VARIANT_GEMM;
            for (int i = 0; i < n_cur; i++)
                CHECK_MSG(cur[i].lin.variant == wv, "fixture %s: %s decoded as %s, INDEX says %s", name, cur[i].name,
                          cvt_variant_str(cur[i].lin.variant), want_v);
            CHECK_EQ_INT(cvt_source_config(src)->quant.group_size, cJSON_GetObjectItem(m, "group_size")->valueint);
            cvt_source_close(src);
        }
        CHECK_MSG(n_cur > 0, "fixture %s: no quantized linears decoded", name);
        if (cJSON_IsString(tg)) {
            if (strcmp(tg->valuestring, ref_group) != 0) { /* first of its group: the reference */
                for (int i = 0; i < n_ref; i++)
                    cvt_awq_linear_free(&ref[i].lin);
                memcpy(ref, cur, sizeof *cur * (size_t)n_cur);
                n_ref = n_cur;
                n_cur = 0;
                snprintf(ref_group, sizeof ref_group, "%s", tg->valuestring);
                snprintf(ref_name, sizeof ref_name, "%s", name);
            } else {
                twins++;
                CHECK_MSG(n_cur == n_ref, "twin %s: %d linears, %s has %d", name, n_cur, ref_name, n_ref);
                for (int i = 0; i < n_cur; i++) {
                    const struct decoded *r = NULL;
                    for (int j = 0; j < n_ref && !r; j++)
                        if (strcmp(ref[j].name, cur[i].name) == 0)
                            r = &ref[j];
                    const struct cvt_awq_linear *a = &cur[i].lin;
                    bool same = r && a->K == r->lin.K && a->N == r->lin.N && a->G == r->lin.G &&
                                memcmp(a->q, r->lin.q, (size_t)(a->K * a->N)) == 0 &&
                                memcmp(a->z, r->lin.z, (size_t)(a->K / a->G * a->N)) == 0 &&
                                memcmp(a->s, r->lin.s, (size_t)(a->K / a->G * a->N) * 2) == 0 &&
                                (!a->bias) == (!r->lin.bias) &&
                                (!a->bias || memcmp(a->bias, r->lin.bias, (size_t)a->N * 4) == 0);
                    CHECK_MSG(same, "twin %s: linear %s differs from %s", name, cur[i].name, ref_name);
                }
            }
        }
        for (int i = 0; i < n_cur; i++)
            cvt_awq_linear_free(&cur[i].lin);
    }
    qs_log_set_quiet(false);
    CHECK(twins >= 3);
    CHECK(checked >= 50);
    for (int i = 0; i < n_ref; i++)
        cvt_awq_linear_free(&ref[i].lin);
    free(ref);
    free(cur);
    free(msgs);
    cJSON_Delete(root);
    free(text);
}

/* Concurrent reads: 4 threads decode every linear of one source (different start points) and
 * read every float tensor; each result must equal the single-threaded decode. */
struct thr_arg {
    const struct cvt_source *src;
    int                      id, bad;
    const struct decoded    *ref;
    int                      n_ref;
};

static void *thr_main(void *p)
{
    struct thr_arg *a = p;
    const struct cvt_hf_config *cfg = cvt_source_config(a->src);
    for (int r = 0; r < 3; r++)
        for (int j = 0; j < a->n_ref; j++) {
            const struct decoded *d = &a->ref[(j + a->id * 5) % a->n_ref];
            struct cvt_awq_linear lin;
            int64_t K, N;
            if (!linear_dims(cfg, d->name, &K, &N) || cvt_awq_load(a->src, cfg, d->name, K, N, 0, K, 0, N, &lin)) {
                a->bad++;
                continue;
            }
            a->bad += memcmp(lin.q, d->lin.q, (size_t)(K * N)) != 0 || memcmp(lin.s, d->lin.s, (size_t)(K / lin.G * N) * 2) != 0;
            cvt_awq_linear_free(&lin);
        }
    return NULL;
}

static void test_threads(void)
{
    const char *dir = "tests/data/models/llama-gqa-gemm";
    struct cvt_source *src = NULL;
    qs_log_set_quiet(true);
    if (cvt_source_open(dir, &src) != CVT_ERR_NONE) {
        qs_log_set_quiet(false);
        printf("test_cvt_src: %s absent, thread test skipped\n", dir);
        return;
    }
    enum { MAXL = 64 };
    struct decoded *ref = calloc(MAXL, sizeof *ref);
    int n_ref = 0, checked = 0;
    char msgs[4096];
    CHECK_EQ_INT(decode_all(dir, msgs, sizeof msgs, ref, &n_ref, MAXL, &checked), CVT_ERR_NONE);
    qs_log_set_quiet(false);
    pthread_t th[4];
    struct thr_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (struct thr_arg){src, i, 0, ref, n_ref};
        pthread_create(&th[i], NULL, thr_main, &args[i]);
    }
    int bad = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        bad += args[i].bad;
    }
    CHECK(n_ref > 10);
    CHECK_EQ_INT(bad, 0);
    for (int i = 0; i < n_ref; i++)
        cvt_awq_linear_free(&ref[i].lin);
    free(ref);
    cvt_source_close(src);
}

/* Bounded RSS (issue 4: peak RSS <= 512 MiB for any model): decoding must not leave the mapped
 * input pages resident. A 16 MiB GEMM linear is decoded in 8 k-blocks; the file-backed RSS may
 * not grow by more than 2 MiB. */
static long rss_file_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "RssFile:", 8) == 0)
            v = atol(line + 8);
    if (f)
        fclose(f);
    return v;
}

static void test_rss(void)
{
    struct canon c;
    canon_rand(&c, 4096, 8192, 128);
    struct st_tensor t[8];
    void *keep[8];
    int nkeep = 0;
    int nt = pack_variant(&c, CVT_VARIANT_GEMM, "model.layers.0.mlp.up_proj", false, false, t, keep, &nkeep);
    char dir[512];
    snprintf(dir, sizeof dir, "%s", mkdir_tmp("rss"));
    write_config(dir, 128, "gemm", NULL);
    struct buf b = st_build(t, nt);
    write_file(dir, "model.safetensors", b.p, b.n);
    free(b.p);
    for (int i = 0; i < nkeep; i++)
        free(keep[i]);
    struct cvt_source *src = NULL;
    qs_log_set_quiet(true);
    CHECK_EQ_INT(cvt_source_open(dir, &src), CVT_ERR_NONE);
    qs_log_set_quiet(false);
    if (src) {
        long before = rss_file_kb(), worst = 0;
        int ok = 1;
        for (int64_t k0 = 0; k0 < 4096; k0 += 512) {
            struct cvt_awq_linear lin;
            CHECK_EQ_INT(cvt_awq_load(src, cvt_source_config(src), "model.layers.0.mlp.up_proj", 4096, 8192, k0, k0 + 512, 0,
                                      8192, &lin),
                         CVT_ERR_NONE);
            if (lin.q)
                ok &= memcmp(lin.q, c.q + k0 * 8192, (size_t)512 * 8192) == 0;
            cvt_awq_linear_free(&lin);
            long now = rss_file_kb() - before;
            worst = now > worst ? now : worst;
        }
        CHECK(ok);
        CHECK_MSG(before >= 0 && worst < 2048, "file-backed RSS grew by %ld kB while decoding a %d kB tensor", worst,
                  (int)(cvt_source_total_bytes(src) / 1024));
        cvt_source_close(src);
    }
    canon_free(&c);
}

/* --write-corpus DIR: seed inputs for tests/fuzz_{safetensors,pickle}.c built by the helpers above. */
static int write_corpus(const char *dir)
{
    char d[512];
    snprintf(d, sizeof d, "%s/fuzz_safetensors", dir);
    mkdir(d, 0755);
    struct buf b = small_st();
    write_file(d, "small-two-tensors.safetensors", b.p, b.n);
    free(b.p);
    struct canon c;
    canon_rand(&c, 128, 64, 64);
    struct st_tensor t[8];
    void *keep[8];
    int nkeep = 0;
    int nt = pack_variant(&c, CVT_VARIANT_GEMV_FAST, "model.layers.0.mlp.down_proj", true, false, t, keep, &nkeep);
    b = st_build(t, nt);
    write_file(d, "gemv-fast-linear.safetensors", b.p, b.n);
    free(b.p);
    snprintf(d, sizeof d, "%s/fuzz_pickle", dir);
    mkdir(d, 0755);
    b = tiny_zip("little", false);
    write_file(d, "tiny-archive.bin", b.p, b.n);
    free(b.p);
    struct pk_tensor pt[8] = {{0}};
    char keys[8][16];
    for (int i = 0; i < nt; i++) {
        snprintf(keys[i], sizeof keys[i], "%d", i);
        int64_t es = strcmp(t[i].dtype, "I32") == 0 ? 4 : 2;
        pt[i] = (struct pk_tensor){t[i].name, strcmp(t[i].dtype, "I16") == 0 ? "ShortStorage" : "HalfStorage", keys[i],
                                   (int64_t)t[i].nbytes / es, 0, t[i].nd, {t[i].shape[0], t[i].shape[1]},
                                   {t[i].nd == 2 ? t[i].shape[1] : 1, 1}, i == 2};
    }
    struct buf pk = pk_build(pt, nt);
    write_file(d, "gemv-fast-linear.data.pkl", pk.p, pk.n);
    struct zipb z = {0};
    zip_add(&z, "m/data.pkl", pk.p, pk.n);
    zip_add(&z, "m/byteorder", "little", 6);
    for (int i = 0; i < nt; i++) {
        char rec[64];
        snprintf(rec, sizeof rec, "m/data/%d", i);
        zip_add(&z, rec, t[i].data, t[i].nbytes);
    }
    b = zip_finish(&z);
    write_file(d, "gemv-fast-linear.bin", b.p, b.n);
    free(b.p);
    free(pk.p);
    for (int i = 0; i < nkeep; i++)
        free(keep[i]);
    canon_free(&c);
    printf("seed corpus written under %s\n", dir);
    return 0;
}

int main(int argc, char **argv)
{
    T_INIT("cvt_src");
    if (argc == 3 && strcmp(argv[1], "--write-corpus") == 0)
        return write_corpus(argv[2]);
    snprintf(tmp_root, sizeof tmp_root, "/tmp/qshard-test-cvt-src-XXXXXX");
    if (!mkdtemp(tmp_root)) {
        perror("mkdtemp");
        return 1;
    }
    test_err_strings();
    test_gemm_worked_example();
    test_variants();
    test_unaligned();
    test_awq_errors();
    test_safetensors_hostile();
    test_pickle_hostile();
    test_zip_hostile();
    test_configs();
    test_directory();
    test_bad_fixtures();
    test_model_fixtures();
    test_threads();
    test_rss();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmp_root);
    return t_done();
}
