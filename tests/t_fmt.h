/*
 * t_fmt.h - what the format tests share (tests/test_fmt.c, tests/test_fmt_cli.c): random bytes
 * with a printed seed, files, an independent encoder written from format/SPEC.md (encode(): the
 * writer's bytes must equal it), the three-tensor base model of the corrupt-file cases and a
 * multi-rank model directory. Test-only.
 */
#ifndef QS_T_FMT_H
#define QS_T_FMT_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h> /* parse `inspect --json` output */
#include <xxhash.h>      /* XXH3_64bits: the test's own encoder */
#include <zlib.h>        /* compress2: the test's own tokenizer archive */

#include "fmt.h"       /* reader, manifest */
#include "fmt_write.h" /* writer */
#include "qs_log.h"    /* qs_log_last, qs_log_set_quiet */
#include "t.h"
#include "t_file.h" /* t_slurp */

static char g_dir[256]; /* scratch directory, removed at the end */

/* --- small utilities ----------------------------------------------------------------------- */

static uint64_t g_rng;
static inline uint64_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}
static inline void fill_random(uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(rnd() >> 24);
}

static inline void path_in(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", g_dir, name);
}

/* The bytes of `path` (t_slurp), NULL when unreadable. */
#define read_file(path, n) ((uint8_t *)t_slurp((path), (n)))

static inline void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "cannot write %s: %s\n", path, strerror(errno));
        return;
    }
    fwrite(data, 1, n, f);
    fclose(f);
}

static inline bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static inline void st32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i); }
static inline void st64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> 8 * i); }
static inline uint32_t ld32(const uint8_t *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }
static inline uint64_t ld64(const uint8_t *p) { return ld32(p) | (uint64_t)ld32(p + 4) << 32; }

/* --- an independent encoder, written from SPEC.md ------------------------------------------ */

struct tt {
    const char *name;
    uint32_t dtype, layout, n_dims, split, axis;
    uint64_t shape[4];
    const uint8_t *data;
    uint64_t size;
};

struct encopts {
    uint16_t minor;
    uint32_t sec_entry, tensor_entry; /* 32 / 96 in 1.0; bigger ones get 0xEE filler */
    uint32_t extra_kind;              /* 0: none; else an extra section of this kind, last */
    uint32_t rank, world;
    uint8_t id[16];
};

static const struct encopts ENC_DEFAULT = {0, 32, 96, 0, 0, 1, {0}};

/* SPEC.md 5.2 archive of n files, zlib level 6, prefixed with its u64 raw size. */
static inline uint8_t *tok_section(const char *const *names, const char *const *datas, int n, size_t *out)
{
    size_t raw = 8;
    for (int i = 0; i < n; i++)
        raw += 16 + strlen(names[i]) + strlen(datas[i]);
    uint8_t *a = calloc(1, raw), *p = a + 8;
    st32(a, (uint32_t)n);
    for (int i = 0; i < n; i++) {
        size_t nl = strlen(names[i]), dl = strlen(datas[i]);
        st32(p, (uint32_t)nl);
        st64(p + 8, dl);
        memcpy(p + 16, names[i], nl);
        memcpy(p + 16 + nl, datas[i], dl);
        p += 16 + nl + dl;
    }
    uLongf zl = compressBound(raw);
    uint8_t *s = malloc(8 + zl);
    compress2(s + 8, &zl, a, raw, 6);
    st64(s, raw);
    free(a);
    *out = 8 + zl;
    return s;
}

static inline uint8_t *encode(const struct encopts *o, const char *config, const char *gen,
                       const uint8_t *tok, size_t tok_n, const struct tt *ts, uint32_t n,
                       size_t *out_n)
{
    uint32_t nsec = o->extra_kind ? 5 : 4;
    uint64_t names = 0;
    for (uint32_t i = 0; i < n; i++)
        names += strlen(ts[i].name) + 1;
    uint64_t tsize = 16 + (uint64_t)n * o->tensor_entry + names;
    const uint8_t *sdata[5] = {(const uint8_t *)config, (const uint8_t *)gen, tok, NULL,
                               (const uint8_t *)"future!"};
    uint64_t ssize[5] = {strlen(config), strlen(gen), tok_n, tsize, 7};
    uint32_t kinds[5] = {1, 3, 2, 4, o->extra_kind};
    uint64_t soff[5], pos = 256 + (uint64_t)nsec * o->sec_entry;
    for (uint32_t i = 0; i < nsec; i++) {
        pos = (pos + 7) / 8 * 8;
        soff[i] = pos;
        pos += ssize[i];
    }
    uint64_t meta = pos, toff[64];
    for (uint32_t i = 0; i < n; i++) {
        toff[i] = (pos + 4095) / 4096 * 4096;
        pos = toff[i] + ts[i].size;
    }
    uint8_t *b = calloc(1, pos);
    memcpy(b, "QSHARD\r\n", 8);
    b[8] = 1;
    b[10] = (uint8_t)o->minor;
    st32(b + 12, 0x01020304);
    st32(b + 16, 256);
    st32(b + 24, o->rank);
    st32(b + 28, o->world);
    st64(b + 32, pos);
    memcpy(b + 40, o->id, 16);
    st64(b + 56, 256);
    st32(b + 64, nsec);
    st32(b + 68, o->sec_entry);
    st64(b + 72, meta);
    st32(b + 80, 1);
    if (o->minor > 0)
        b[100] = 0x5A; /* a field this reader does not know */
    /* tensor table */
    uint8_t *t = b + soff[3];
    st32(t, n);
    st32(t + 4, o->tensor_entry);
    st64(t + 8, names);
    uint8_t *pool = t + 16 + (uint64_t)n * o->tensor_entry;
    uint32_t noff = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint8_t *e = t + 16 + (uint64_t)i * o->tensor_entry;
        const struct tt *x = &ts[i];
        uint32_t nl = (uint32_t)strlen(x->name);
        st32(e, noff);
        st32(e + 4, nl);
        st32(e + 8, x->dtype);
        st32(e + 12, x->layout);
        st32(e + 16, x->n_dims);
        st32(e + 20, x->split);
        st32(e + 24, x->axis);
        for (int d = 0; d < 4; d++)
            st64(e + 32 + 8 * d, x->shape[d]);
        st64(e + 64, toff[i]);
        st64(e + 72, x->size);
        st64(e + 80, XXH3_64bits(x->data, x->size));
        memset(e + 96, 0xEE, o->tensor_entry - 96);
        memcpy(pool + noff, x->name, nl + 1);
        noff += nl + 1;
        memcpy(b + toff[i], x->data, x->size);
    }
    for (uint32_t i = 0; i < nsec; i++) {
        if (i != 3)
            memcpy(b + soff[i], sdata[i], ssize[i]);
        uint8_t *e = b + 256 + (uint64_t)i * o->sec_entry;
        st32(e, kinds[i]);
        st64(e + 8, soff[i]);
        st64(e + 16, ssize[i]);
        st64(e + 24, XXH3_64bits(b + soff[i], ssize[i]));
        memset(e + 32, 0xEE, o->sec_entry - 32);
    }
    st64(b + 248, XXH3_64bits(b, 256)); /* field is still zero here */
    *out_n = pos;
    return b;
}

/* Recompute every section hash and the header hash of an encoded buffer after a mutation, so
 * the mutation reaches the check it targets instead of the checksum. */
static inline void rehash(uint8_t *b, size_t n)
{
    uint32_t cnt = ld32(b + 64), es = ld32(b + 68);
    for (uint32_t i = 0; i < cnt && 256 + (uint64_t)(i + 1) * es <= n; i++) {
        uint8_t *e = b + 256 + (uint64_t)i * es;
        uint64_t off = ld64(e + 8), sz = ld64(e + 16);
        if (off <= n && sz <= n - off)
            st64(e + 24, XXH3_64bits(b + off, sz));
    }
    memset(b + 248, 0, 8);
    st64(b + 248, XXH3_64bits(b, 256));
}

/* Offset of the section of `kind` in an encoded buffer (section table at 256, 32-byte entries). */
static inline uint64_t sec_off(const uint8_t *b, uint32_t kind, uint64_t *size)
{
    if (size)
        *size = 0;
    for (uint32_t i = 0; i < ld32(b + 64); i++) {
        const uint8_t *e = b + 256 + i * 32;
        if (ld32(e) == kind) {
            if (size)
                *size = ld64(e + 16);
            return ld64(e + 8);
        }
    }
    return 0;
}

/* Pointer to tensor entry i. */
static inline uint8_t *tentry(uint8_t *b, uint32_t i) { return b + sec_off(b, 4, NULL) + 16 + 96 * i; }

/* --- the base model used by the corrupt-file cases ----------------------------------------- */

static uint8_t base_a[4 * 8 * 4], base_b[3 * 5 * 2], base_c[16 * 64 / 2];
static struct tt base_t[3];
static const char *TOK_NAMES[] = {"tokenizer.json", "tokenizer_config.json"};
static const char *TOK_DATAS[] = {"{\"model\":{\"type\":\"BPE\"}}", "{\"bos_token\":\"<s>\"}"};
static const char *BASE_CONFIG = "{\"qshard_config_version\":1,\"architecture\":\"llama\"}";
static const char *BASE_GEN = "{\"temperature\":0.7}";

static inline void base_init(void)
{
    fill_random(base_a, sizeof(base_a));
    fill_random(base_b, sizeof(base_b));
    fill_random(base_c, sizeof(base_c));
    base_t[0] = (struct tt){"a.weight", FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR, 2, FMT_SPLIT_COLUMN, 0,
                            {4, 8}, base_a, sizeof(base_a)};
    base_t[1] = (struct tt){"b.weight", FMT_DTYPE_F16, FMT_LAYOUT_ROW_MAJOR, 2, FMT_SPLIT_NONE, 0,
                            {3, 5}, base_b, sizeof(base_b)};
    base_t[2] = (struct tt){"c.qweight", FMT_DTYPE_Q4, FMT_LAYOUT_W4_MMA_T16X64, 2, FMT_SPLIT_ROW,
                            0, {16, 64}, base_c, sizeof(base_c)};
}

static inline uint8_t *base_encode(const struct encopts *o, size_t *n)
{
    size_t tn;
    uint8_t *tok = tok_section(TOK_NAMES, TOK_DATAS, 2, &tn);
    uint8_t *b = encode(o, BASE_CONFIG, BASE_GEN, tok, tn, base_t, 3, n);
    free(tok);
    return b;
}

/* Write the base model with the library writer, whole puts. */
static inline enum fmt_err base_write(const char *path, uint32_t rank, uint32_t world, const uint8_t id[16])
{
    struct fmt_writer *w;
    struct fmt_writer_opts o = {rank, world, {0}};
    memcpy(o.model_id, id, 16);
    FMT_TRY(fmt_writer_open(path, &o, &w));
    size_t sizes[2] = {strlen(TOK_DATAS[0]), strlen(TOK_DATAS[1])};
    enum fmt_err err = fmt_writer_set_section(w, FMT_SECTION_CONFIG, BASE_CONFIG, strlen(BASE_CONFIG));
    if (!err)
        err = fmt_writer_set_section(w, FMT_SECTION_GENERATION_CONFIG, BASE_GEN, strlen(BASE_GEN));
    if (!err)
        err = fmt_writer_set_tokenizer_files(w, TOK_NAMES, (const void *const *)TOK_DATAS, sizes, 2);
    for (int i = 0; i < 3 && !err; i++)
        err = fmt_writer_add_tensor(w, base_t[i].name, base_t[i].dtype, base_t[i].layout,
                                    base_t[i].n_dims, base_t[i].shape, base_t[i].split,
                                    base_t[i].axis, NULL);
    if (!err)
        err = fmt_writer_begin_data(w);
    for (uint32_t i = 0; i < 3 && !err; i++)
        err = fmt_writer_put_tensor(w, 2 - i, base_t[2 - i].data, base_t[2 - i].size);
    if (err) {
        fmt_writer_abort(w);
        return err;
    }
    return fmt_writer_finish(w);
}


static inline void make_model_dir(const char *dir, uint32_t world, const uint8_t id[16])
{
    mkdir(dir, 0755);
    char p[600], name[64];
    for (uint32_t k = 0; k < world; k++) {
        fmt_rank_file_name(name, sizeof(name), k, world);
        snprintf(p, sizeof(p), "%s/%s", dir, name);
        CHECK_EQ_INT(base_write(p, k, world, id), FMT_ERR_NONE);
    }
}

static inline enum fmt_err model_open_err(const char *dir)
{
    struct fmt_model *m = NULL;
    qs_log_clear();
    enum fmt_err err = fmt_model_open(dir, &m);
    fmt_model_close(m);
    return err;
}


static inline void rm_rf(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

/* Start of a format test program: its area, the random seed (QSHARD_TEST_SEED repeats a run),
 * the base model, a scratch directory g_dir. Returns false when g_dir cannot be made. */
static inline bool t_fmt_init(const char *area, bool scratch)
{
    T_INIT(area);
    const char *seed_env = getenv("QSHARD_TEST_SEED");
    g_rng = seed_env ? strtoull(seed_env, NULL, 0) : ((uint64_t)time(NULL) ^ (uint64_t)getpid() << 32);
    if (!g_rng)
        g_rng = 1;
    uint64_t seed = g_rng;
    base_init();
    if (!scratch)
        return true;
    printf("test_%s: seed %" PRIu64 " (QSHARD_TEST_SEED=%" PRIu64 " to repeat)\n", area, seed, seed);
    snprintf(g_dir, sizeof(g_dir), "%s/qshard-test-%s-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             area);
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return false;
    }
    return true;
}

#endif /* QS_T_FMT_H */
