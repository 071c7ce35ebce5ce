/*
 * test_fmt.c - the .qshard format library (format/fmt.h, fmt_write.h) and `qshard inspect/verify`.
 *
 *   1. round trip: writer -> reader for every dtype and layout tag, random data (seed printed;
 *      QSHARD_TEST_SEED=N repeats a run), whole and chunked puts from several threads;
 *   2. an independent encoder written from format/SPEC.md (encode() below) must produce the
 *      writer's bytes exactly, and format/SPEC.md's hex dump must open and match the writer;
 *   3. a numbered list of corrupt files, each expecting its own fmt_err and a message naming the
 *      file (qs_log_last);
 *   4. manifest / multi-rank directories; 5. writer failure paths leave no files;
 *   6. canonical tensor names (format/fmt_names.h) and paths (format/qs_util.h).
 * The qshard binary's inspect / verify are tests/test_fmt_cli.c; shared helpers tests/t_fmt.h.
 *
 * Run from the repository root: ./build/test_fmt (QSHARD_TEST_VERBOSE=1 prints the message of
 * every corrupt case). Extra modes (used to make committed data):
 *   ./build/test_fmt --write-spec-example FILE   the tiny file whose hex dump is in SPEC.md
 *   ./build/test_fmt --write-corpus DIR          seed corpus for tests/fuzz_fmt.c
 */
#include "fmt_names.h" /* fmt_name, fmt_name_parse, fmt_name_in_layer */
#include "qs_util.h"   /* qs_path_join */
#include "t_fmt.h"

/* --- 1. round trip ------------------------------------------------------------------------- */

struct rt_tensor {
    const char *name;
    enum fmt_dtype dtype;
    enum fmt_layout layout;
    uint32_t n_dims;
    uint64_t shape[4];
    enum fmt_split split;
    uint32_t axis;
    uint8_t *data;
    size_t size;
    uint32_t index;
};

struct rt_job {
    struct fmt_writer *w;
    struct rt_tensor *ts;
    uint32_t n, first, step;
    enum fmt_err err;
};

/* Writes tensors first, first+step, ...: even ones whole, odd ones in 3 uneven chunks. */
static void *rt_worker(void *arg)
{
    struct rt_job *j = arg;
    for (uint32_t i = j->first; i < j->n && !j->err; i += j->step) {
        struct rt_tensor *t = &j->ts[i];
        if (i % 2 == 0) {
            j->err = fmt_writer_put_tensor(j->w, t->index, t->data, t->size);
        } else {
            size_t a = t->size / 3, b = t->size / 2;
            j->err = fmt_writer_put_tensor_part(j->w, t->index, 0, t->data, a);
            if (!j->err)
                j->err = fmt_writer_put_tensor_part(j->w, t->index, a, t->data + a, b - a);
            if (!j->err)
                j->err = fmt_writer_put_tensor_part(j->w, t->index, b, t->data + b, t->size - b);
        }
    }
    return NULL;
}

static void test_round_trip(void)
{
    struct rt_tensor ts[] = {
        {"model.norm.weight", FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR, 1, {4096}, 0, 0, 0, 0, 0},
        {"t.f16", FMT_DTYPE_F16, FMT_LAYOUT_ROW_MAJOR, 2, {7, 3}, FMT_SPLIT_VOCAB, 0, 0, 0, 0},
        {"t.bf16", FMT_DTYPE_BF16, FMT_LAYOUT_ROW_MAJOR, 3, {2, 3, 5}, FMT_SPLIT_ROW, 2, 0, 0, 0},
        {"t.i32", FMT_DTYPE_I32, FMT_LAYOUT_ROW_MAJOR, 4, {2, 1, 3, 2}, 0, 0, 0, 0, 0},
        {"t.i16", FMT_DTYPE_I16, FMT_LAYOUT_ROW_MAJOR, 1, {1}, 0, 0, 0, 0, 0},
        {"t.u8 scalar", FMT_DTYPE_U8, FMT_LAYOUT_ROW_MAJOR, 0, {0}, 0, 0, 0, 0, 0},
        {"t.u32", FMT_DTYPE_U32, FMT_LAYOUT_ROW_MAJOR, 2, {1025, 3}, 0, 0, 0, 0, 0},
        {"t.q4 row-major", FMT_DTYPE_Q4, FMT_LAYOUT_ROW_MAJOR, 2, {3, 6}, 0, 0, 0, 0, 0},
        {"model.layers.0.mlp.down_proj.qweight", FMT_DTYPE_Q4, FMT_LAYOUT_W4_MMA_T16X64, 2,
         {128, 192}, FMT_SPLIT_ROW, 0, 0, 0, 0},
        {"model.layers.0.mlp.down_proj.scales", FMT_DTYPE_F16, FMT_LAYOUT_S_T64, 2, {1, 192},
         FMT_SPLIT_ROW, 0, 0, 0, 0},
        {"model.layers.0.mlp.down_proj.qzeros", FMT_DTYPE_Q4, FMT_LAYOUT_Z4_T64, 2, {1, 192},
         FMT_SPLIT_ROW, 0, 0, 0, 0},
        {"unicodé.名前", FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR, 1, {3}, 0, 0, 0, 0, 0},
    };
    const uint32_t n = sizeof(ts) / sizeof(ts[0]);
    char path[512];
    path_in(path, sizeof(path), "rt.qshard");
    struct fmt_writer_opts o = {1, 2, {0}};
    fill_random(o.model_id, 16);
    struct fmt_writer *w;
    CHECK_EQ_INT(fmt_writer_open(path, &o, &w), FMT_ERR_NONE);
    const char *cfg = "{\"qshard_config_version\":1,\"hidden_size\":64}";
    CHECK_EQ_INT(fmt_writer_set_section(w, FMT_SECTION_CONFIG, cfg, strlen(cfg)), FMT_ERR_NONE);
    /* a tokenizer file with every byte value, and an empty one */
    static uint8_t model_bin[3000];
    fill_random(model_bin, sizeof(model_bin));
    const char *tn[] = {"tokenizer.model", "special_tokens_map.json"};
    const void *td[] = {model_bin, ""};
    size_t tsz[] = {sizeof(model_bin), 0};
    CHECK_EQ_INT(fmt_writer_set_tokenizer_files(w, tn, td, tsz, 2), FMT_ERR_NONE);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t numel = 1;
        for (uint32_t d = 0; d < ts[i].n_dims; d++)
            numel *= ts[i].shape[d];
        ts[i].size = fmt_dtype_size_bytes(ts[i].dtype, numel);
        CHECK(ts[i].size > 0);
        ts[i].data = malloc(ts[i].size);
        fill_random(ts[i].data, ts[i].size);
        CHECK_EQ_INT(fmt_writer_add_tensor(w, ts[i].name, ts[i].dtype, ts[i].layout, ts[i].n_dims,
                                           ts[i].shape, ts[i].split, ts[i].axis, &ts[i].index),
                     FMT_ERR_NONE);
        CHECK_EQ_INT(ts[i].index, i);
    }
    CHECK_EQ_INT(fmt_writer_begin_data(w), FMT_ERR_NONE);
    for (uint32_t i = 0; i < n; i++)
        CHECK_EQ_INT(fmt_writer_tensor_size(w, i), ts[i].size);
    pthread_t th[3];
    struct rt_job jobs[3];
    for (uint32_t k = 0; k < 3; k++) {
        jobs[k] = (struct rt_job){w, ts, n, k, 3, FMT_ERR_NONE};
        pthread_create(&th[k], NULL, rt_worker, &jobs[k]);
    }
    for (uint32_t k = 0; k < 3; k++) {
        pthread_join(th[k], NULL);
        CHECK_EQ_INT(jobs[k].err, FMT_ERR_NONE);
    }
    CHECK_EQ_INT(fmt_writer_finish(w), FMT_ERR_NONE);
    char tmp[600];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    CHECK(!exists(tmp));

    struct fmt_shard *s;
    CHECK_EQ_INT(fmt_shard_open(path, &s), FMT_ERR_NONE);
    if (!s)
        goto out;
    const struct fmt_header *h = fmt_shard_header(s);
    CHECK_EQ_INT(h->tp_rank, 1);
    CHECK_EQ_INT(h->world_size, 2);
    CHECK(memcmp(h->model_id, o.model_id, 16) == 0);
    CHECK_EQ_INT(fmt_shard_n_tensors(s), n);
    for (uint32_t i = 0; i < n; i++) {
        const struct fmt_tensor *t = fmt_shard_tensor(s, i);
        CHECK_EQ_STR(t->name, ts[i].name);
        CHECK(fmt_shard_find(s, ts[i].name) == t);
        CHECK_EQ_INT(t->dtype, ts[i].dtype);
        CHECK_EQ_INT(t->layout, ts[i].layout);
        CHECK(t->layout_known);
        CHECK_EQ_INT(t->n_dims, ts[i].n_dims);
        for (uint32_t d = 0; d < 4; d++)
            CHECK_EQ_INT(t->shape[d], d < ts[i].n_dims ? ts[i].shape[d] : 0);
        CHECK_EQ_INT(t->split, ts[i].split);
        CHECK_EQ_INT(t->split_axis, ts[i].axis);
        CHECK_EQ_INT(t->size, ts[i].size);
        CHECK_EQ_INT(t->offset % FMT_ALIGN, 0);
        CHECK_EQ_INT((uintptr_t)t->data % FMT_ALIGN, 0);
        CHECK(t->xxh3 == XXH3_64bits(ts[i].data, ts[i].size));
        CHECK_MSG(memcmp(t->data, ts[i].data, ts[i].size) == 0, "tensor %s data differs", t->name);
        CHECK_EQ_INT(fmt_shard_verify_tensor(s, i), FMT_ERR_NONE);
    }
    CHECK(fmt_shard_find(s, "absent") == NULL);
    CHECK(fmt_shard_tensor(s, n) == NULL);
    CHECK_EQ_INT(fmt_shard_verify_all(s, NULL, NULL), FMT_ERR_NONE);
    const char *js;
    size_t jl;
    CHECK_EQ_INT(fmt_shard_config_json(s, &js, &jl), FMT_ERR_NONE);
    CHECK(jl == strlen(cfg) && memcmp(js, cfg, jl) == 0);
    CHECK_EQ_INT(fmt_shard_generation_config_json(s, &js, &jl), FMT_ERR_NONE);
    CHECK(jl == 2 && memcmp(js, "{}", 2) == 0);
    void *buf;
    size_t bl;
    CHECK_EQ_INT(fmt_shard_tokenizer_file(s, "tokenizer.model", &buf, &bl), FMT_ERR_NONE);
    CHECK(bl == sizeof(model_bin) && buf && memcmp(buf, model_bin, bl) == 0);
    free(buf);
    CHECK_EQ_INT(fmt_shard_tokenizer_file(s, "special_tokens_map.json", &buf, &bl), FMT_ERR_NONE);
    CHECK(bl == 0 && buf && ((char *)buf)[0] == '\0');
    free(buf);
    CHECK_EQ_INT(fmt_shard_tokenizer_file(s, "tokenizer.json", &buf, &bl), FMT_ERR_NOT_FOUND);
    CHECK(buf == NULL);
    fmt_shard_close(s);
out:
    for (uint32_t i = 0; i < n; i++)
        free(ts[i].data);
    unlink(path);
}

static void test_dtype_sizes(void)
{
    CHECK_EQ_INT(fmt_dtype_size_bytes(FMT_DTYPE_F32, 3), 12);
    CHECK_EQ_INT(fmt_dtype_size_bytes(FMT_DTYPE_BF16, 3), 6);
    CHECK_EQ_INT(fmt_dtype_size_bytes(FMT_DTYPE_U8, 3), 3);
    CHECK_EQ_INT(fmt_dtype_size_bytes(FMT_DTYPE_Q4, 4), 2);
    CHECK_EQ_INT(fmt_dtype_size_bytes(FMT_DTYPE_Q4, 3), 0);
    CHECK_EQ_INT(fmt_dtype_size_bytes((enum fmt_dtype)9, 3), 0);
    CHECK_EQ_INT(fmt_dtype_size_bytes(FMT_DTYPE_F32, UINT64_MAX / 2), 0);
    CHECK(fmt_layout_name((enum fmt_layout)99) == NULL);
    CHECK_EQ_STR(fmt_layout_name(FMT_LAYOUT_W4_MMA_T16X64), "W4_MMA_T16X64");
    CHECK(strstr(fmt_err_str(FMT_ERR_CHECKSUM), "CHECKSUM") != NULL);
    CHECK_EQ_STR(fmt_err_name(FMT_ERR_DUP_NAME), "DUP_NAME");
}

/* --- 2. independent encoder and SPEC.md hex dump ------------------------------------------- */

static void test_encoder_matches_writer(void)
{
    char path[512];
    path_in(path, sizeof(path), "base.qshard");
    struct encopts o = ENC_DEFAULT;
    o.rank = 0;
    o.world = 1;
    fill_random(o.id, 16);
    CHECK_EQ_INT(base_write(path, 0, 1, o.id), FMT_ERR_NONE);
    size_t n1, n2;
    uint8_t *a = read_file(path, &n1), *b = base_encode(&o, &n2);
    CHECK_EQ_INT(n1, n2);
    CHECK_MSG(a && n1 == n2 && memcmp(a, b, n1) == 0, "writer output differs from the SPEC encoder");
    free(a);
    free(b);
    unlink(path);
}

/* The example of SPEC.md section 10: fixed inputs, so its bytes never change. */
static const uint8_t SPEC_ID[16] = {0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77,
                                    0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff};
static const char *SPEC_CONFIG = "{\"architecture\":\"llama\"}";
static const float SPEC_DATA[4] = {1.0f, -2.0f, 0.5f, 3.0f};

static enum fmt_err write_spec_example(const char *path)
{
    struct fmt_writer *w;
    struct fmt_writer_opts o = {0, 1, {0}};
    memcpy(o.model_id, SPEC_ID, 16);
    FMT_TRY(fmt_writer_open(path, &o, &w));
    const char *names[] = {"tokenizer_config.json"};
    const void *datas[] = {"{}"};
    size_t sizes[] = {2};
    uint64_t shape[1] = {4};
    uint8_t le[16];
    for (int i = 0; i < 4; i++) {
        uint32_t u;
        memcpy(&u, &SPEC_DATA[i], 4);
        st32(le + 4 * i, u);
    }
    enum fmt_err err = fmt_writer_set_section(w, FMT_SECTION_CONFIG, SPEC_CONFIG,
                                              strlen(SPEC_CONFIG));
    if (!err)
        err = fmt_writer_set_tokenizer_files(w, names, datas, sizes, 1);
    if (!err)
        err = fmt_writer_add_tensor(w, "model.norm.weight", FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR, 1,
                                    shape, FMT_SPLIT_NONE, 0, NULL);
    if (!err)
        err = fmt_writer_begin_data(w);
    if (!err)
        err = fmt_writer_put_tensor(w, 0, le, sizeof(le));
    if (err) {
        fmt_writer_abort(w);
        return err;
    }
    return fmt_writer_finish(w);
}

/* Parse the ```hexdump block of SPEC.md (hexdump -C format, '*' = repeat previous line). */
static uint8_t *parse_spec_dump(const char *spec, size_t *out_n)
{
    const char *p = strstr(spec, "```hexdump\n");
    if (!p)
        return NULL;
    p += strlen("```hexdump\n");
    const char *end = strstr(p, "```");
    if (!end)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    uint8_t *b = calloc(1, cap), prev[16] = {0};
    bool star = false;
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol)
            eol = end;
        if (*p == '*') {
            star = true;
        } else {
            unsigned long off = strtoul(p, NULL, 16);
            if (off > cap - 16) {
                free(b);
                return NULL;
            }
            if (star) {
                for (; n < off; n += 16)
                    memcpy(b + n, prev, 16);
                star = false;
            }
            n = off;
            const char *q = p + 8;
            int k = 0;
            while (q < eol && k < 16) {
                while (q < eol && *q == ' ')
                    q++;
                if (q + 1 >= eol || *q == '|')
                    break;
                char hx[3] = {q[0], q[1], 0};
                b[n + k] = (uint8_t)strtoul(hx, NULL, 16);
                prev[k] = b[n + k];
                k++;
                q += 2;
            }
            n += (size_t)k;
        }
        p = eol + 1;
    }
    *out_n = n;
    return b;
}

static void test_spec_hexdump(void)
{
    size_t sn;
    uint8_t *spec = read_file("format/SPEC.md", &sn);
    CHECK_MSG(spec != NULL, "run from the repository root: format/SPEC.md not found");
    if (!spec)
        return;
    spec = realloc(spec, sn + 1);
    spec[sn] = 0;
    size_t n = 0;
    uint8_t *dump = parse_spec_dump((const char *)spec, &n);
    CHECK_MSG(dump != NULL && n > 4096, "no ```hexdump block in SPEC.md (parsed %zu bytes)", n);
    free(spec);
    if (!dump)
        return;
    char path[512], path2[512];
    path_in(path, sizeof(path), "spec.qshard");
    write_file(path, dump, n);
    struct fmt_shard *s;
    CHECK_EQ_INT(fmt_shard_open(path, &s), FMT_ERR_NONE);
    if (s) {
        CHECK_EQ_INT(fmt_shard_n_tensors(s), 1);
        const struct fmt_tensor *t = fmt_shard_find(s, "model.norm.weight");
        CHECK(t && t->dtype == FMT_DTYPE_F32 && t->n_dims == 1 && t->shape[0] == 4);
        if (t)
            for (int i = 0; i < 4; i++) {
                float f;
                uint32_t u = ld32((const uint8_t *)t->data + 4 * i);
                memcpy(&f, &u, 4);
                CHECK(f == SPEC_DATA[i]);
            }
        CHECK_EQ_INT(fmt_shard_verify_all(s, NULL, NULL), FMT_ERR_NONE);
        void *buf;
        size_t bl;
        CHECK_EQ_INT(fmt_shard_tokenizer_file(s, "tokenizer_config.json", &buf, &bl), FMT_ERR_NONE);
        CHECK(bl == 2 && memcmp(buf, "{}", 2) == 0);
        free(buf);
        fmt_shard_close(s);
    }
    /* The writer, given the same inputs, produces exactly the documented bytes. */
    path_in(path2, sizeof(path2), "spec2.qshard");
    CHECK_EQ_INT(write_spec_example(path2), FMT_ERR_NONE);
    size_t n2;
    uint8_t *b2 = read_file(path2, &n2);
    CHECK_MSG(b2 && n2 == n && memcmp(b2, dump, n) == 0,
              "SPEC.md hex dump differs from the writer's output (%zu vs %zu bytes): regenerate it "
              "with ./build/test_fmt --write-spec-example", n, n2);
    free(b2);
    free(dump);
    unlink(path);
    unlink(path2);
}

/* --- 3. corrupt files ---------------------------------------------------------------------- */

enum corrupt {
    CORRUPT_TRUNC_HEADER = 1,
    CORRUPT_TRUNC_SECTION_TABLE,
    CORRUPT_TRUNC_CONFIG,
    CORRUPT_TRUNC_GENERATION_CONFIG,
    CORRUPT_TRUNC_TOKENIZER,
    CORRUPT_TRUNC_TENSOR_TABLE,
    CORRUPT_TRUNC_DATA,
    CORRUPT_BAD_MAGIC,
    CORRUPT_VERSION_FUTURE,
    CORRUPT_ENDIAN,
    CORRUPT_HEADER_CHECKSUM,
    CORRUPT_HEADER_FLAGS,
    CORRUPT_RANK_GE_WORLD,
    CORRUPT_WORLD_ZERO,
    CORRUPT_SECTION_CHECKSUM,
    CORRUPT_SECTION_DUP,
    CORRUPT_SECTION_UNKNOWN_SAME_MINOR,
    CORRUPT_SECTION_OVERLAP,
    CORRUPT_SECTION_ALIGN,
    CORRUPT_SECTION_PAST_META,
    CORRUPT_OFFSET_PAST_END,
    CORRUPT_OFFSET_OVERLAP,
    CORRUPT_OFFSET_HOLE,
    CORRUPT_SIZE_OVERFLOW,
    CORRUPT_SHAPE_OVERFLOW,
    CORRUPT_ALIGN,
    CORRUPT_DUP_NAME,
    CORRUPT_UNKNOWN_DTYPE,
    CORRUPT_ZERO_LEN_NAME,
    CORRUPT_NAME_NUL,
    CORRUPT_NAME_UTF8,
    CORRUPT_NAME_OUT_OF_POOL,
    CORRUPT_NDIMS,
    CORRUPT_SIZE_MISMATCH,
    CORRUPT_LAYOUT_MISMATCH,
    CORRUPT_BAD_SPLIT,
    CORRUPT_TABLE_COUNT,
    CORRUPT_TRAILING_BYTES,
    CORRUPT_EMPTY_FILE,
    CORRUPT_ENDIAN_GARBAGE,
    CORRUPT_HEADER_SIZE,
    CORRUPT_CHECKSUM_ALGO,
    CORRUPT_HEADER_RESERVED,
    CORRUPT_META_PAST_END,
    CORRUPT_SECTION_ENTRY_SIZE,
    CORRUPT_SECTION_COUNT_ZERO,
    CORRUPT_SECTION_TABLE_ALIGN,
    CORRUPT_SECTION_TABLE_OVERFLOW,
    CORRUPT_SECTION_TABLE_PAST_META,
    CORRUPT_SECTION_SIZE_OVERFLOW,
    CORRUPT_SECTION_FLAGS,
    CORRUPT_SECTION_MISSING,
    CORRUPT_CONFIG_NUL,
    CORRUPT_TOKENIZER_TOO_SMALL,
    CORRUPT_TABLE_TOO_SMALL,
    CORRUPT_TABLE_ENTRY_SIZE,
    CORRUPT_TABLE_NAMES_OVERFLOW,
    CORRUPT_SHAPE_UNUSED_DIM,
    CORRUPT_SHAPE_ZERO_DIM,
    CORRUPT_BYTES_OVERFLOW,
    CORRUPT_LAYOUT_DIVISIBILITY,
    CORRUPT_ENTRY_FLAGS,
    CORRUPT_Q4_ODD,
    /* open succeeds, a later check fails */
    CORRUPT_TENSOR_CHECKSUM,
    CORRUPT_PADDING,
    CORRUPT_TOKENIZER_ZLIB,
    CORRUPT_TOKENIZER_BOMB,
    CORRUPT_TOKARC_TOO_MANY_FILES,
    CORRUPT_TOKARC_TRUNCATED_ENTRY,
    CORRUPT_TOKARC_BAD_NAME,
    CORRUPT_TOKARC_SIZE_PAST_END,
    CORRUPT_TOKARC_TRAILING,
    /* must open */
    CORRUPT_NEWER_MINOR,
    CORRUPT_UNKNOWN_LAYOUT,
    CORRUPT_N_CASES
};

struct case_result {
    enum fmt_err open_err;  /* what fmt_shard_open must return */
    enum fmt_err later_err; /* verify_all (or tokenizer) result when open succeeds */
};

/* Apply case c to the encoded base file b (size *n, capacity for +8192 bytes). */
static struct case_result mutate(int c, uint8_t *b, size_t *n)
{
    uint64_t cfg_off = sec_off(b, 1, NULL), gen_off = sec_off(b, 3, NULL), tok_sz;
    uint64_t tok_off = sec_off(b, 2, &tok_sz), tab_off = sec_off(b, 4, NULL);
    uint8_t *e0 = tentry(b, 0), *e1 = tentry(b, 1), *e2 = tentry(b, 2);
    uint8_t *pool = b + tab_off + 16 + 3 * 96;
    switch (c) {
    case CORRUPT_TRUNC_HEADER: *n = 100; return (struct case_result){FMT_ERR_TRUNCATED, 0};
    case CORRUPT_TRUNC_SECTION_TABLE: *n = 300; return (struct case_result){FMT_ERR_TRUNCATED, 0};
    case CORRUPT_TRUNC_CONFIG: *n = cfg_off + 3; return (struct case_result){FMT_ERR_TRUNCATED, 0};
    case CORRUPT_TRUNC_GENERATION_CONFIG: *n = gen_off + 2; return (struct case_result){FMT_ERR_TRUNCATED, 0};
    case CORRUPT_TRUNC_TOKENIZER: *n = tok_off + 9; return (struct case_result){FMT_ERR_TRUNCATED, 0};
    case CORRUPT_TRUNC_TENSOR_TABLE: *n = tab_off + 40; return (struct case_result){FMT_ERR_TRUNCATED, 0};
    case CORRUPT_TRUNC_DATA: *n -= 100; return (struct case_result){FMT_ERR_TRUNCATED, 0};
    case CORRUPT_BAD_MAGIC: b[0] = 'G'; return (struct case_result){FMT_ERR_MAGIC, 0};
    case CORRUPT_VERSION_FUTURE: b[8] = 2; rehash(b, *n); return (struct case_result){FMT_ERR_VERSION, 0};
    case CORRUPT_ENDIAN: st32(b + 12, 0x04030201); rehash(b, *n); return (struct case_result){FMT_ERR_ENDIAN, 0};
    case CORRUPT_HEADER_CHECKSUM: b[45] ^= 1; return (struct case_result){FMT_ERR_META_CHECKSUM, 0};
    case CORRUPT_HEADER_FLAGS: st32(b + 20, 1); rehash(b, *n); return (struct case_result){FMT_ERR_HEADER, 0};
    case CORRUPT_RANK_GE_WORLD: st32(b + 24, 2); st32(b + 28, 2); rehash(b, *n); return (struct case_result){FMT_ERR_RANK, 0};
    case CORRUPT_WORLD_ZERO: st32(b + 28, 0); rehash(b, *n); return (struct case_result){FMT_ERR_RANK, 0};
    case CORRUPT_SECTION_CHECKSUM: b[cfg_off + 2] ^= 0x20; return (struct case_result){FMT_ERR_META_CHECKSUM, 0};
    case CORRUPT_SECTION_DUP: st32(b + 256 + 32, 1); rehash(b, *n); return (struct case_result){FMT_ERR_SECTION, 0};
    case CORRUPT_SECTION_UNKNOWN_SAME_MINOR: st32(b + 256 + 32, 77); rehash(b, *n); return (struct case_result){FMT_ERR_SECTION, 0};
    case CORRUPT_SECTION_OVERLAP: st64(b + 256 + 32 + 8, cfg_off + 8); rehash(b, *n); return (struct case_result){FMT_ERR_OVERLAP, 0};
    case CORRUPT_SECTION_ALIGN: st64(b + 256 + 8, cfg_off + 1); rehash(b, *n); return (struct case_result){FMT_ERR_ALIGN, 0};
    case CORRUPT_SECTION_PAST_META: st64(b + 256 + 3 * 32 + 16, 1 << 20); rehash(b, *n); return (struct case_result){FMT_ERR_OFFSET, 0};
    case CORRUPT_OFFSET_PAST_END: st64(e2 + 64, ld64(e2 + 64) + (1 << 20)); rehash(b, *n); return (struct case_result){FMT_ERR_OFFSET, 0};
    case CORRUPT_OFFSET_OVERLAP: st64(e1 + 64, ld64(e0 + 64)); rehash(b, *n); return (struct case_result){FMT_ERR_OVERLAP, 0};
    case CORRUPT_OFFSET_HOLE:
        /* move the last tensor one page later and grow the file accordingly */
        memmove(b + ld64(e2 + 64) + 4096, b + ld64(e2 + 64), ld64(e2 + 72));
        memset(b + ld64(e2 + 64), 0, 4096);
        st64(e2 + 64, ld64(e2 + 64) + 4096);
        *n += 4096;
        st64(b + 32, *n);
        rehash(b, *n);
        return (struct case_result){FMT_ERR_OFFSET, 0};
    case CORRUPT_SIZE_OVERFLOW: st64(e1 + 72, UINT64_MAX - 100); rehash(b, *n); return (struct case_result){FMT_ERR_OVERFLOW, 0};
    case CORRUPT_SHAPE_OVERFLOW: st64(e0 + 32, 1ull << 40); st64(e0 + 40, 1ull << 40); rehash(b, *n); return (struct case_result){FMT_ERR_OVERFLOW, 0};
    case CORRUPT_ALIGN: st64(e0 + 64, ld64(e0 + 64) + 8); rehash(b, *n); return (struct case_result){FMT_ERR_ALIGN, 0};
    case CORRUPT_DUP_NAME: pool[ld32(e1)] = 'a'; rehash(b, *n); return (struct case_result){FMT_ERR_DUP_NAME, 0};
    case CORRUPT_UNKNOWN_DTYPE: st32(e1 + 8, 9); rehash(b, *n); return (struct case_result){FMT_ERR_DTYPE, 0};
    case CORRUPT_ZERO_LEN_NAME: st32(e1 + 4, 0); rehash(b, *n); return (struct case_result){FMT_ERR_NAME, 0};
    case CORRUPT_NAME_NUL: pool[ld32(e1) + 1] = 0; rehash(b, *n); return (struct case_result){FMT_ERR_NAME, 0};
    case CORRUPT_NAME_UTF8: pool[ld32(e1) + 1] = 0xC0; rehash(b, *n); return (struct case_result){FMT_ERR_NAME, 0};
    case CORRUPT_NAME_OUT_OF_POOL: st32(e2, 0xFFFFFFF0u); rehash(b, *n); return (struct case_result){FMT_ERR_NAME, 0};
    case CORRUPT_NDIMS: st32(e0 + 16, 5); rehash(b, *n); return (struct case_result){FMT_ERR_SHAPE, 0};
    case CORRUPT_SIZE_MISMATCH: st64(e1 + 72, ld64(e1 + 72) - 2); rehash(b, *n); return (struct case_result){FMT_ERR_SHAPE, 0};
    case CORRUPT_LAYOUT_MISMATCH: st32(e0 + 12, FMT_LAYOUT_W4_MMA_T16X64); rehash(b, *n); return (struct case_result){FMT_ERR_LAYOUT, 0};
    case CORRUPT_BAD_SPLIT: st32(e0 + 24, 2); rehash(b, *n); return (struct case_result){FMT_ERR_SPLIT, 0};
    case CORRUPT_TABLE_COUNT: st32(b + tab_off, 4); rehash(b, *n); return (struct case_result){FMT_ERR_SECTION, 0};
    case CORRUPT_TRAILING_BYTES: memset(b + *n, 0, 64); *n += 64; st64(b + 32, *n); rehash(b, *n); return (struct case_result){FMT_ERR_OFFSET, 0};
    case CORRUPT_EMPTY_FILE: *n = 0; return (struct case_result){FMT_ERR_TRUNCATED, 0};
    case CORRUPT_ENDIAN_GARBAGE: st32(b + 12, 0x11111111); rehash(b, *n); return (struct case_result){FMT_ERR_ENDIAN, 0};
    case CORRUPT_HEADER_SIZE: st32(b + 16, 512); rehash(b, *n); return (struct case_result){FMT_ERR_HEADER, 0};
    case CORRUPT_CHECKSUM_ALGO: st32(b + 80, 2); rehash(b, *n); return (struct case_result){FMT_ERR_HEADER, 0};
    case CORRUPT_HEADER_RESERVED: b[100] = 1; rehash(b, *n); return (struct case_result){FMT_ERR_HEADER, 0};
    case CORRUPT_META_PAST_END: st64(b + 72, 1ull << 40); rehash(b, *n); return (struct case_result){FMT_ERR_OFFSET, 0};
    case CORRUPT_SECTION_ENTRY_SIZE: st32(b + 68, 36); rehash(b, *n); return (struct case_result){FMT_ERR_SECTION, 0};
    case CORRUPT_SECTION_COUNT_ZERO: st32(b + 64, 0); rehash(b, *n); return (struct case_result){FMT_ERR_SECTION, 0};
    case CORRUPT_SECTION_TABLE_ALIGN: st64(b + 56, 260); rehash(b, *n); return (struct case_result){FMT_ERR_ALIGN, 0};
    case CORRUPT_SECTION_TABLE_OVERFLOW: st64(b + 56, UINT64_MAX - 7); rehash(b, *n); return (struct case_result){FMT_ERR_OVERFLOW, 0};
    case CORRUPT_SECTION_TABLE_PAST_META: st32(b + 64, 200); rehash(b, *n); return (struct case_result){FMT_ERR_OFFSET, 0};
    case CORRUPT_SECTION_SIZE_OVERFLOW: st64(b + 256 + 16, UINT64_MAX - 3); rehash(b, *n); return (struct case_result){FMT_ERR_OVERFLOW, 0};
    case CORRUPT_SECTION_FLAGS: st32(b + 256 + 4, 1); rehash(b, *n); return (struct case_result){FMT_ERR_SECTION, 0};
    case CORRUPT_SECTION_MISSING: st32(b + 64, 3); rehash(b, *n); return (struct case_result){FMT_ERR_SECTION, 0};
    case CORRUPT_CONFIG_NUL: b[cfg_off + 5] = 0; rehash(b, *n); return (struct case_result){FMT_ERR_SECTION, 0};
    case CORRUPT_TOKENIZER_TOO_SMALL: st64(b + 256 + 2 * 32 + 16, 4); rehash(b, *n); return (struct case_result){FMT_ERR_SECTION, 0};
    case CORRUPT_TABLE_TOO_SMALL: st64(b + 256 + 3 * 32 + 16, 8); rehash(b, *n); return (struct case_result){FMT_ERR_SECTION, 0};
    case CORRUPT_TABLE_ENTRY_SIZE: st32(b + tab_off + 4, 100); rehash(b, *n); return (struct case_result){FMT_ERR_SECTION, 0};
    case CORRUPT_TABLE_NAMES_OVERFLOW: st64(b + tab_off + 8, UINT64_MAX - 10); rehash(b, *n); return (struct case_result){FMT_ERR_OVERFLOW, 0};
    case CORRUPT_SHAPE_UNUSED_DIM: st64(e0 + 32 + 16, 5); rehash(b, *n); return (struct case_result){FMT_ERR_SHAPE, 0};
    case CORRUPT_SHAPE_ZERO_DIM: st64(e0 + 32, 0); rehash(b, *n); return (struct case_result){FMT_ERR_SHAPE, 0};
    case CORRUPT_BYTES_OVERFLOW: st64(e0 + 32, 1ull << 62); st64(e0 + 40, 2); rehash(b, *n); return (struct case_result){FMT_ERR_OVERFLOW, 0};
    case CORRUPT_LAYOUT_DIVISIBILITY: st64(e2 + 32, 8); st64(e2 + 40, 128); rehash(b, *n); return (struct case_result){FMT_ERR_LAYOUT, 0};
    case CORRUPT_ENTRY_FLAGS: st32(e0 + 28, 1); rehash(b, *n); return (struct case_result){FMT_ERR_SECTION, 0};
    case CORRUPT_Q4_ODD: st32(e2 + 12, FMT_LAYOUT_ROW_MAJOR); st64(e2 + 32, 1023); st64(e2 + 40, 1); rehash(b, *n); return (struct case_result){FMT_ERR_SHAPE, 0};
    case CORRUPT_TOKENIZER_BOMB: st64(b + tok_off, 1ull << 29); rehash(b, *n); return (struct case_result){0, FMT_ERR_ZLIB};
    case CORRUPT_TENSOR_CHECKSUM: b[ld64(e1 + 64) + 3] ^= 4; return (struct case_result){0, FMT_ERR_CHECKSUM};
    case CORRUPT_PADDING: b[ld64(e0 + 64) - 1] = 1; return (struct case_result){0, FMT_ERR_PADDING};
    case CORRUPT_TOKENIZER_ZLIB: b[tok_off + tok_sz - 3] ^= 0xFF; rehash(b, *n); return (struct case_result){0, FMT_ERR_ZLIB};
    case CORRUPT_UNKNOWN_LAYOUT: st32(e1 + 12, 99); rehash(b, *n); return (struct case_result){0, 0};
    }
    return (struct case_result){0, 0};
}

static void test_corrupt(void)
{
    size_t base_n;
    uint8_t *base = base_encode(&ENC_DEFAULT, &base_n);
    char path[512];
    qs_log_set_quiet(true);
    for (int c = 1; c < CORRUPT_N_CASES; c++) {
        uint8_t *b;
        size_t n = base_n;
        struct case_result want;
        if (c >= CORRUPT_TOKARC_TOO_MANY_FILES && c <= CORRUPT_TOKARC_TRAILING) {
            /* well-compressed archives whose structure is wrong (SPEC.md 5.1) */
            uint8_t raw[64] = {0};
            size_t rn = 8;
            if (c == CORRUPT_TOKARC_TOO_MANY_FILES) {
                st32(raw, 65);
            } else if (c == CORRUPT_TOKARC_TRUNCATED_ENTRY) {
                st32(raw, 1);
                rn = 20;
            } else if (c == CORRUPT_TOKARC_SIZE_PAST_END) {
                st32(raw, 1);
                st32(raw + 8, 1);
                st64(raw + 16, 1000); /* content runs past the archive */
                raw[24] = 'x';
                rn = 30;
            } else if (c == CORRUPT_TOKARC_BAD_NAME) {
                st32(raw, 1);
                st32(raw + 8, 3);
                memcpy(raw + 24, "a/b", 3);
                rn = 27;
            } else {
                rn = 11; /* zero files, 3 trailing bytes */
            }
            uLongf zl = compressBound(rn);
            uint8_t *tok = malloc(8 + zl);
            compress2(tok + 8, &zl, raw, rn, 6);
            st64(tok, rn);
            b = encode(&ENC_DEFAULT, BASE_CONFIG, BASE_GEN, tok, 8 + zl, base_t, 3, &n);
            free(tok);
            want = (struct case_result){0, FMT_ERR_ZLIB};
        } else if (c == CORRUPT_NEWER_MINOR) {
            /* minor 1: bigger entries with unknown trailing fields, an unknown section kind and
             * a non-zero reserved header byte: all ignored */
            struct encopts o = ENC_DEFAULT;
            o.minor = 1;
            o.sec_entry = 48;
            o.tensor_entry = 128;
            o.extra_kind = 99;
            b = base_encode(&o, &n);
            want = (struct case_result){0, 0};
        } else {
            b = calloc(1, base_n + 8192);
            memcpy(b, base, base_n);
            want = mutate(c, b, &n);
        }
        snprintf(path, sizeof(path), "%s/corrupt-%02d.qshard", g_dir, c);
        write_file(path, b, n);
        free(b);
        qs_log_clear();
        struct fmt_shard *s = (struct fmt_shard *)&s; /* must come back NULL on error */
        enum fmt_err got = fmt_shard_open(path, &s);
        CHECK_MSG(got == want.open_err, "case %d: open: expected %s, got %s (%s)", c,
                  fmt_err_name(want.open_err), fmt_err_name(got), qs_log_last());
        if (getenv("QSHARD_TEST_VERBOSE"))
            printf("case %2d: %-13s %s\n", c, fmt_err_name(got), qs_log_last());
        if (want.open_err) {
            CHECK_MSG(s == NULL, "case %d: *out not NULL after a failed open", c);
            CHECK_MSG(strstr(qs_log_last(), path) != NULL, "case %d: message does not name the "
                      "file: %s", c, qs_log_last());
        }
        if (!s || got)
            continue;
        if (c == CORRUPT_NEWER_MINOR) {
            CHECK_EQ_INT(fmt_shard_header(s)->version_minor, 1);
            CHECK_EQ_INT(fmt_shard_n_tensors(s), 3);
            for (uint32_t i = 0; i < 3 && i < fmt_shard_n_tensors(s); i++) {
                const struct fmt_tensor *t = fmt_shard_tensor(s, i);
                CHECK_EQ_STR(t->name, base_t[i].name);
                CHECK(memcmp(t->data, base_t[i].data, base_t[i].size) == 0);
            }
        }
        if (c == CORRUPT_UNKNOWN_LAYOUT) {
            const struct fmt_tensor *t = fmt_shard_find(s, "b.weight");
            CHECK(t && !t->layout_known && t->layout == 99);
        }
        qs_log_clear();
        enum fmt_err later = fmt_shard_verify_all(s, NULL, NULL);
        if (getenv("QSHARD_TEST_VERBOSE"))
            printf("case %2d: verify %-6s %s\n", c, fmt_err_name(later), qs_log_last());
        CHECK_MSG(later == want.later_err, "case %d: verify_all: expected %s, got %s (%s)", c,
                  fmt_err_name(want.later_err), fmt_err_name(later), qs_log_last());
        if (want.later_err)
            CHECK_MSG(strstr(qs_log_last(), path) != NULL, "case %d: message: %s", c, qs_log_last());
        if (c == CORRUPT_TENSOR_CHECKSUM) {
            CHECK_EQ_INT(fmt_shard_verify_tensor(s, 0), FMT_ERR_NONE);
            CHECK_EQ_INT(fmt_shard_verify_tensor(s, 1), FMT_ERR_CHECKSUM);
            CHECK(strstr(qs_log_last(), "b.weight") != NULL);
        }
        if (c == CORRUPT_TOKENIZER_ZLIB) {
            void *buf = NULL;
            size_t bl;
            CHECK_EQ_INT(fmt_shard_tokenizer_file(s, "tokenizer.json", &buf, &bl), FMT_ERR_ZLIB);
            CHECK(buf == NULL);
        }
        fmt_shard_close(s);
    }
    /* not a file at all */
    struct fmt_shard *s = NULL;
    CHECK_EQ_INT(fmt_shard_open(g_dir, &s), FMT_ERR_IO);
    CHECK(strstr(qs_log_last(), "not a regular file") != NULL);
    snprintf(path, sizeof(path), "%s/no-such-file.qshard", g_dir);
    CHECK_EQ_INT(fmt_shard_open(path, &s), FMT_ERR_IO);
    CHECK(s == NULL && strstr(qs_log_last(), path) != NULL);
    qs_log_set_quiet(false);
    printf("corrupt files: %d cases\n", CORRUPT_N_CASES - 1);
    free(base);
}

/* --- 4. manifest and multi-rank directories ------------------------------------------------ */

static void test_manifest(void)
{
    char dir[400], p[600], p2[600];
    uint8_t id[16], id2[16];
    fill_random(id, 16);
    fill_random(id2, 16);
    snprintf(dir, sizeof(dir), "%s/model", g_dir);
    make_model_dir(dir, 2, id);
    CHECK_EQ_INT(fmt_manifest_write(dir, 2), FMT_ERR_NONE);
    struct fmt_manifest *m;
    CHECK_EQ_INT(fmt_manifest_load(dir, &m), FMT_ERR_NONE);
    if (m) {
        CHECK_EQ_INT(m->world_size, 2);
        CHECK(memcmp(m->model_id, id, 16) == 0);
        CHECK_EQ_STR(m->ranks[1].file, "rank-1-of-2.qshard");
        fmt_manifest_free(m);
    }
    struct fmt_model *mod;
    CHECK_EQ_INT(fmt_model_open(dir, &mod), FMT_ERR_NONE);
    if (mod) {
        CHECK_EQ_INT(fmt_model_world_size(mod), 2);
        CHECK_EQ_INT(fmt_shard_header(fmt_model_shard(mod, 1))->tp_rank, 1);
        fmt_model_close(mod);
    }
    struct fmt_shard *s;
    CHECK_EQ_INT(fmt_manifest_open_rank(dir, 1, &s), FMT_ERR_NONE);
    fmt_shard_close(s);

    qs_log_set_quiet(true);
    /* M1: a rank from another conversion (different model_id) */
    snprintf(p, sizeof(p), "%s/rank-1-of-2.qshard", dir);
    snprintf(p2, sizeof(p2), "%s/rank-1-of-2.keep", dir);
    rename(p, p2);
    CHECK_EQ_INT(base_write(p, 1, 2, id2), FMT_ERR_NONE);
    CHECK_EQ_INT(model_open_err(dir), FMT_ERR_RANK_MISMATCH);
    CHECK(strstr(qs_log_last(), "rank-1-of-2") != NULL);
    CHECK_EQ_INT(fmt_manifest_write(dir, 2), FMT_ERR_RANK_MISMATCH);
    /* M2: digest mismatch: same model_id, different contents (re-encoded with other data) */
    base_a[0] ^= 1;
    CHECK_EQ_INT(base_write(p, 1, 2, id), FMT_ERR_NONE);
    base_a[0] ^= 1;
    CHECK_EQ_INT(model_open_err(dir), FMT_ERR_DIGEST);
    CHECK_EQ_INT(fmt_manifest_open_rank(dir, 1, &s), FMT_ERR_DIGEST);
    CHECK(s == NULL);
    /* M3: the manifest names a rank whose file is missing */
    unlink(p);
    CHECK_EQ_INT(model_open_err(dir), FMT_ERR_MISSING_RANK);
    CHECK(strstr(qs_log_last(), "rank-1-of-2.qshard") != NULL);
    CHECK_EQ_INT(fmt_manifest_write(dir, 2), FMT_ERR_MISSING_RANK);
    rename(p2, p);
    CHECK_EQ_INT(model_open_err(dir), FMT_ERR_NONE);
    /* M4: rank file of the wrong rank under the right name */
    char p0[600];
    snprintf(p0, sizeof(p0), "%s/rank-0-of-2.qshard", dir);
    rename(p0, p2);
    CHECK_EQ_INT(base_write(p0, 1, 2, id), FMT_ERR_NONE);
    CHECK_EQ_INT(model_open_err(dir), FMT_ERR_RANK_MISMATCH);
    rename(p2, p0);
    /* M5..M9: malformed manifests */
    char mp[600];
    snprintf(mp, sizeof(mp), "%s/manifest.json", dir);
    size_t mn;
    char *good = (char *)read_file(mp, &mn);
    good = realloc(good, mn + 1);
    good[mn] = 0;
    struct {
        const char *what, *from, *to;
        enum fmt_err want;
    } mcases[] = {
        {"not JSON", "{", "[", FMT_ERR_MANIFEST},
        {"wrong format", "qshard-manifest", "qshard-manifesto", FMT_ERR_MANIFEST},
        {"path in file name", "\"rank-1-of-2.qshard\"", "\"../rank-1-of-2.qshard\"", FMT_ERR_MANIFEST},
        {"rank listed twice", "\"rank\":\t1", "\"rank\":\t0", FMT_ERR_MANIFEST},
        {"world_size 3: rank 2 has no entry", "\"world_size\":\t2", "\"world_size\":\t3",
         FMT_ERR_MISSING_RANK},
        {"bad digest", "\"digest\":\t\"", "\"digest\":\t\"x", FMT_ERR_MANIFEST},
        {"version 2", "\"version\":\t1", "\"version\":\t2", FMT_ERR_MANIFEST},
        {"ranks not an array", "\"ranks\":\t[", "\"ranks\":\t7, \"x\": [", FMT_ERR_MANIFEST},
        {"rank out of range", "\"rank\":\t1", "\"rank\":\t2", FMT_ERR_MANIFEST},
        {"negative size", "\"size\":\t", "\"size\":\t-", FMT_ERR_MANIFEST},
        {"model_id short", "\"model_id\":\t\"", "\"model_id\":\t\"0", FMT_ERR_MANIFEST},
        {"world_size 0", "\"world_size\":\t2", "\"world_size\":\t0", FMT_ERR_MANIFEST},
    };
    for (size_t i = 0; i < sizeof(mcases) / sizeof(mcases[0]); i++) {
        const char *at = strstr(good, mcases[i].from);
        CHECK_MSG(at != NULL, "manifest case %zu: pattern %s not in manifest", i, mcases[i].from);
        if (!at)
            continue;
        char *bad = malloc(mn + 64);
        size_t pre = (size_t)(at - good);
        memcpy(bad, good, pre);
        strcpy(bad + pre, mcases[i].to);
        strcat(bad, at + strlen(mcases[i].from));
        write_file(mp, bad, strlen(bad));
        free(bad);
        enum fmt_err got = model_open_err(dir);
        CHECK_MSG(got == mcases[i].want, "manifest case %s: expected %s, got %s (%s)",
                  mcases[i].what, fmt_err_name(mcases[i].want), fmt_err_name(got), qs_log_last());
        CHECK(strstr(qs_log_last(), "manifest.json") != NULL);
    }
    CHECK_EQ_INT(fmt_manifest_write(dir, 0), FMT_ERR_RANK);
    unlink(mp);
    CHECK_EQ_INT(model_open_err(dir), FMT_ERR_MANIFEST);
    write_file(mp, good, mn);
    free(good);
    CHECK_EQ_INT(fmt_manifest_open_rank(dir, 2, &s), FMT_ERR_RANK);
    qs_log_set_quiet(false);
}

/* --- 5. writer failure paths --------------------------------------------------------------- */

static int count_files(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    if (!d)
        return -1;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

static void test_writer_failures(void)
{
    char dir[400], p[600];
    snprintf(dir, sizeof(dir), "%s/wfail", g_dir);
    mkdir(dir, 0755);
    snprintf(p, sizeof(p), "%s/x.qshard", dir);
    struct fmt_writer_opts o = {0, 1, {0}};
    struct fmt_writer *w;
    uint64_t shape[2] = {16, 64};
    uint8_t data[512] = {0};
    qs_log_set_quiet(true);

    /* W1: abort after some data */
    CHECK_EQ_INT(fmt_writer_open(p, &o, &w), FMT_ERR_NONE);
    CHECK_EQ_INT(fmt_writer_set_section(w, FMT_SECTION_CONFIG, "{}", 2), FMT_ERR_NONE);
    CHECK_EQ_INT(fmt_writer_add_tensor(w, "q", FMT_DTYPE_Q4, FMT_LAYOUT_W4_MMA_T16X64, 2, shape,
                                       FMT_SPLIT_NONE, 0, NULL), FMT_ERR_NONE);
    CHECK_EQ_INT(fmt_writer_add_tensor(w, "r", FMT_DTYPE_U8, FMT_LAYOUT_ROW_MAJOR, 1, shape,
                                       FMT_SPLIT_NONE, 0, NULL), FMT_ERR_NONE);
    /* declaration errors, each with its code */
    CHECK_EQ_INT(fmt_writer_add_tensor(w, "q", FMT_DTYPE_U8, FMT_LAYOUT_ROW_MAJOR, 1, shape,
                                       FMT_SPLIT_NONE, 0, NULL), FMT_ERR_DUP_NAME);
    CHECK_EQ_INT(fmt_writer_add_tensor(w, "s", FMT_DTYPE_F32, FMT_LAYOUT_S_T64, 2, shape,
                                       FMT_SPLIT_NONE, 0, NULL), FMT_ERR_LAYOUT);
    CHECK_EQ_INT(fmt_writer_add_tensor(w, "s", (enum fmt_dtype)8, FMT_LAYOUT_ROW_MAJOR, 2, shape,
                                       FMT_SPLIT_NONE, 0, NULL), FMT_ERR_DTYPE);
    CHECK_EQ_INT(fmt_writer_add_tensor(w, "", FMT_DTYPE_U8, FMT_LAYOUT_ROW_MAJOR, 1, shape,
                                       FMT_SPLIT_NONE, 0, NULL), FMT_ERR_NAME);
    CHECK_EQ_INT(fmt_writer_add_tensor(w, "s", FMT_DTYPE_U8, FMT_LAYOUT_ROW_MAJOR, 5, shape,
                                       FMT_SPLIT_NONE, 0, NULL), FMT_ERR_SHAPE);
    CHECK_EQ_INT(fmt_writer_add_tensor(w, "s", FMT_DTYPE_U8, FMT_LAYOUT_ROW_MAJOR, 1, shape,
                                       FMT_SPLIT_COLUMN, 1, NULL), FMT_ERR_SPLIT);
    uint64_t zero[2] = {4, 0}, huge[2] = {1ull << 40, 1ull << 40}, odd[1] = {3};
    CHECK_EQ_INT(fmt_writer_add_tensor(w, "s", FMT_DTYPE_U8, (enum fmt_layout)99, 1, shape,
                                       FMT_SPLIT_NONE, 0, NULL), FMT_ERR_LAYOUT);
    CHECK_EQ_INT(fmt_writer_add_tensor(w, "s", FMT_DTYPE_U8, FMT_LAYOUT_ROW_MAJOR, 2, zero,
                                       FMT_SPLIT_NONE, 0, NULL), FMT_ERR_SHAPE);
    CHECK_EQ_INT(fmt_writer_add_tensor(w, "s", FMT_DTYPE_U8, FMT_LAYOUT_ROW_MAJOR, 2, huge,
                                       FMT_SPLIT_NONE, 0, NULL), FMT_ERR_OVERFLOW);
    CHECK_EQ_INT(fmt_writer_add_tensor(w, "s", FMT_DTYPE_Q4, FMT_LAYOUT_ROW_MAJOR, 1, odd,
                                       FMT_SPLIT_NONE, 0, NULL), FMT_ERR_SHAPE);
    CHECK_EQ_INT(fmt_writer_add_tensor(w, "s", FMT_DTYPE_Q4, FMT_LAYOUT_W4_MMA_T16X64, 2, zero,
                                       FMT_SPLIT_NONE, 0, NULL), FMT_ERR_SHAPE);
    uint64_t k8[2] = {8, 64};
    CHECK_EQ_INT(fmt_writer_add_tensor(w, "s", FMT_DTYPE_Q4, FMT_LAYOUT_W4_MMA_T16X64, 2, k8,
                                       FMT_SPLIT_NONE, 0, NULL), FMT_ERR_LAYOUT);
    CHECK_EQ_INT(fmt_writer_set_section(w, FMT_SECTION_TENSOR_TABLE, "{}", 2), FMT_ERR_ARG);
    CHECK_EQ_INT(fmt_writer_set_section(w, FMT_SECTION_CONFIG, "{\0}", 3), FMT_ERR_ARG);
    CHECK_EQ_INT(fmt_writer_set_section(w, FMT_SECTION_CONFIG, "\xff", 1), FMT_ERR_ARG);
    const char *tn_bad[] = {"a/b"}, *tn_dup[] = {"t.json", "t.json"};
    const void *td[] = {"x", "y"};
    size_t tsz[] = {1, 1};
    CHECK_EQ_INT(fmt_writer_set_tokenizer_files(w, tn_bad, td, tsz, 1), FMT_ERR_ARG);
    CHECK_EQ_INT(fmt_writer_set_tokenizer_files(w, tn_dup, td, tsz, 2), FMT_ERR_ARG);
    CHECK_EQ_INT(fmt_writer_set_tokenizer_files(w, tn_dup, td, tsz, 65), FMT_ERR_ARG);
    CHECK_EQ_INT(fmt_writer_put_tensor(w, 0, data, 512), FMT_ERR_STATE); /* before begin_data */
    CHECK_EQ_INT(fmt_writer_begin_data(w), FMT_ERR_NONE);
    CHECK_EQ_INT(fmt_writer_begin_data(w), FMT_ERR_STATE);
    CHECK_EQ_INT(fmt_writer_set_section(w, FMT_SECTION_CONFIG, "{}", 2), FMT_ERR_STATE);
    CHECK_EQ_INT(fmt_writer_set_tokenizer_files(w, NULL, NULL, NULL, 0), FMT_ERR_STATE);
    CHECK_EQ_INT(fmt_writer_add_tensor(w, "late", FMT_DTYPE_U8, FMT_LAYOUT_ROW_MAJOR, 1, shape,
                                       FMT_SPLIT_NONE, 0, NULL), FMT_ERR_STATE);
    CHECK_EQ_INT(fmt_writer_put_tensor(w, 7, data, 512), FMT_ERR_ARG);
    CHECK_EQ_INT(fmt_writer_tensor_size(w, 0), 512);
    CHECK_EQ_INT(fmt_writer_tensor_size(w, 7), 0);
    CHECK_EQ_INT(fmt_writer_put_tensor(w, 0, data, 512), FMT_ERR_NONE);
    fmt_writer_abort(w);
    CHECK_EQ_INT(count_files(dir), 0);

    /* W2: finish with a tensor not (fully) written */
    CHECK_EQ_INT(fmt_writer_open(p, &o, &w), FMT_ERR_NONE);
    CHECK_EQ_INT(fmt_writer_set_section(w, FMT_SECTION_CONFIG, "{}", 2), FMT_ERR_NONE);
    CHECK_EQ_INT(fmt_writer_add_tensor(w, "q", FMT_DTYPE_Q4, FMT_LAYOUT_W4_MMA_T16X64, 2, shape,
                                       FMT_SPLIT_NONE, 0, NULL), FMT_ERR_NONE);
    CHECK_EQ_INT(fmt_writer_begin_data(w), FMT_ERR_NONE);
    CHECK_EQ_INT(fmt_writer_put_tensor_part(w, 0, 0, data, 100), FMT_ERR_NONE);
    CHECK_EQ_INT(fmt_writer_finish(w), FMT_ERR_INCOMPLETE);
    CHECK(strstr(qs_log_last(), "100 of 512") != NULL);
    CHECK_EQ_INT(count_files(dir), 0);

    /* W3: a bad put (wrong size, out-of-order chunk) fails the writer */
    CHECK_EQ_INT(fmt_writer_open(p, &o, &w), FMT_ERR_NONE);
    CHECK_EQ_INT(fmt_writer_set_section(w, FMT_SECTION_CONFIG, "{}", 2), FMT_ERR_NONE);
    CHECK_EQ_INT(fmt_writer_add_tensor(w, "q", FMT_DTYPE_Q4, FMT_LAYOUT_W4_MMA_T16X64, 2, shape,
                                       FMT_SPLIT_NONE, 0, NULL), FMT_ERR_NONE);
    CHECK_EQ_INT(fmt_writer_begin_data(w), FMT_ERR_NONE);
    CHECK_EQ_INT(fmt_writer_put_tensor_part(w, 0, 8, data, 100), FMT_ERR_ARG);
    CHECK_EQ_INT(fmt_writer_put_tensor(w, 0, data, 511), FMT_ERR_ARG);
    CHECK_EQ_INT(fmt_writer_put_tensor(w, 0, data, 512), FMT_ERR_NONE);
    CHECK_EQ_INT(fmt_writer_put_tensor(w, 0, data, 512), FMT_ERR_STATE); /* twice */
    CHECK_EQ_INT(fmt_writer_finish(w), FMT_ERR_ARG); /* the first failure */
    CHECK_EQ_INT(count_files(dir), 0);

    /* W4: no CONFIG section; finish before begin_data */
    CHECK_EQ_INT(fmt_writer_open(p, &o, &w), FMT_ERR_NONE);
    CHECK_EQ_INT(fmt_writer_begin_data(w), FMT_ERR_SECTION);
    fmt_writer_abort(w);
    CHECK_EQ_INT(fmt_writer_open(p, &o, &w), FMT_ERR_NONE);
    CHECK_EQ_INT(fmt_writer_finish(w), FMT_ERR_STATE);
    CHECK_EQ_INT(count_files(dir), 0);
    CHECK_EQ_INT(fmt_writer_open(NULL, &o, &w), FMT_ERR_ARG);
    fmt_writer_abort(NULL);
    CHECK_EQ_INT(count_files(dir), 0);

    /* W5: unwritable directory (root ignores mode bits: use /proc, where nobody may create) */
    char ro[400], rp[600];
    snprintf(ro, sizeof(ro), "%s/ro", g_dir);
    mkdir(ro, 0555);
    chmod(ro, 0555);
    if (geteuid() == 0)
        snprintf(rp, sizeof(rp), "/proc/qshard-test-%d.qshard", (int)getpid());
    else
        snprintf(rp, sizeof(rp), "%s/x.qshard", ro);
    w = (struct fmt_writer *)&w;
    CHECK_EQ_INT(fmt_writer_open(rp, &o, &w), FMT_ERR_IO);
    CHECK(w == NULL);
    CHECK(strstr(qs_log_last(), "qshard.tmp") != NULL);
    CHECK_EQ_INT(count_files(ro), 0);
    CHECK(!exists(rp));
    /* W6: the file does not fit (RLIMIT_FSIZE stands in for a full disk): begin_data fails,
     * before any tensor is converted, and nothing is left behind */
    struct rlimit old_lim, lim;
    getrlimit(RLIMIT_FSIZE, &old_lim);
    lim.rlim_cur = 1 << 20;
    lim.rlim_max = old_lim.rlim_max;
    signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &lim);
    uint64_t big[1] = {8u << 20};
    CHECK_EQ_INT(fmt_writer_open(p, &o, &w), FMT_ERR_NONE);
    CHECK_EQ_INT(fmt_writer_set_section(w, FMT_SECTION_CONFIG, "{}", 2), FMT_ERR_NONE);
    CHECK_EQ_INT(fmt_writer_add_tensor(w, "big", FMT_DTYPE_U8, FMT_LAYOUT_ROW_MAJOR, 1, big,
                                       FMT_SPLIT_NONE, 0, NULL), FMT_ERR_NONE);
    CHECK_EQ_INT(fmt_writer_begin_data(w), FMT_ERR_IO);
    CHECK(strstr(qs_log_last(), "x.qshard.tmp") != NULL);
    fmt_writer_abort(w);
    setrlimit(RLIMIT_FSIZE, &old_lim);
    signal(SIGXFSZ, SIG_DFL);
    CHECK_EQ_INT(count_files(dir), 0);
    /* W7: bad rank/world */
    struct fmt_writer_opts bad = {3, 2, {0}};
    CHECK_EQ_INT(fmt_writer_open(p, &bad, &w), FMT_ERR_RANK);
    CHECK_EQ_INT(count_files(dir), 0);
    chmod(ro, 0755);
    rmdir(ro);
    rmdir(dir);
    qs_log_set_quiet(false);
}

/* --- 6. canonical names and paths ---------------------------------------------------------- */

/* Every role round-trips through fmt_name / fmt_name_parse with every suffix its kind takes; the
 * patterns of DESIGN 5 as written there; malformed names are refused. */
static void test_names(void)
{
    static const char *const sfx[] = {FMT_SUFFIX_QWEIGHT, FMT_SUFFIX_SCALES, FMT_SUFFIX_QZEROS,
                                      FMT_SUFFIX_WEIGHT, FMT_SUFFIX_BIAS};
    char buf[160];
    for (int role = 0; role < FMT_N_COUNT; role++)
        for (int layer = 0; layer < 12; layer += 11)
            for (size_t k = 0; k <= 5; k++) {
                const char *sf = k < 5 ? sfx[k] : NULL;
                bool lin = fmt_name_is_linear((enum fmt_name)role);
                if (sf && !lin)
                    continue;
                enum fmt_name r;
                int l, e;
                const char *rest;
                CHECK(fmt_name(buf, sizeof(buf), (enum fmt_name)role, layer, 3, sf) == buf);
                CHECK_MSG(fmt_name_parse(buf, &r, &l, &e, &rest), "%s does not parse", buf);
                CHECK_EQ_INT(r, role);
                CHECK(!strcmp(rest, sf ? sf : ""));
                const char *in = fmt_name_in_layer(buf);
                CHECK((l >= 0) == (in != NULL));
                if (in) {
                    char pre[32];
                    snprintf(pre, sizeof(pre), "model.layers.%d.", layer);
                    CHECK_EQ_INT(l, layer);
                    CHECK(in == buf + strlen(pre) && !strncmp(buf, pre, strlen(pre)));
                }
            }
    /* DESIGN 5, written out */
    CHECK_EQ_STR(fmt_name(buf, sizeof(buf), FMT_N_QKV, 7, -1, FMT_SUFFIX_QWEIGHT),
                 "model.layers.7.self_attn.qkv_proj.qweight");
    CHECK_EQ_STR(fmt_name(buf, sizeof(buf), FMT_N_EXPERT_DOWN, 2, 5, NULL),
                 "model.layers.2.block_sparse_moe.experts.5.down_proj");
    CHECK_EQ_STR(fmt_name(buf, sizeof(buf), FMT_N_EMBED, -1, -1, NULL), "model.embed_tokens.weight");
    CHECK_EQ_STR(fmt_name_in_layer("model.layers.10.mlp.gate_up_proj.scales"), "mlp.gate_up_proj.scales");
    /* refused: negative index, too small a buffer, unknown role, malformed names */
    CHECK(fmt_name(buf, sizeof(buf), FMT_N_O, -1, -1, NULL) == NULL);
    CHECK(fmt_name(buf, 10, FMT_N_O, 1, -1, NULL) == NULL);
    CHECK(fmt_name(buf, sizeof(buf), FMT_N_COUNT, 1, -1, NULL) == NULL);
    static const char *const bad[] = {"model.layers.01.self_attn.o_proj", "model.layers.x.mlp.down_proj",
                                      "model.layers.3.self_attn.o_proj.bogus", "lm_head.weight.bias",
                                      "model.layers.3.mlp.up_proj", "", "model.layers.", NULL};
    for (int i = 0; bad[i]; i++)
        CHECK_MSG(!fmt_name_parse(bad[i], NULL, NULL, NULL, NULL), "%s parsed", bad[i]);
    CHECK(fmt_name_in_layer("lm_head.weight") == NULL && fmt_name_in_layer(NULL) == NULL);
    /* qs_path_join */
    char *p = qs_path_join("a/b", "c.json");
    CHECK_EQ_STR(p, "a/b/c.json");
    free(p);
}

/* --- extra modes and main ------------------------------------------------------------------ */

static int write_corpus(const char *dir)
{
    char p[600];
    mkdir(dir, 0755);
    uint8_t id[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    snprintf(p, sizeof(p), "%s/spec-example.qshard", dir);
    if (write_spec_example(p))
        return 1;
    snprintf(p, sizeof(p), "%s/three-tensors.qshard", dir);
    if (base_write(p, 1, 2, id))
        return 1;
    struct encopts o = ENC_DEFAULT;
    o.minor = 1;
    o.sec_entry = 48;
    o.tensor_entry = 128;
    o.extra_kind = 99;
    size_t n;
    uint8_t *b = base_encode(&o, &n);
    snprintf(p, sizeof(p), "%s/newer-minor.qshard", dir);
    write_file(p, b, n);
    free(b);
    size_t tn;
    uint8_t *tok = tok_section(NULL, NULL, 0, &tn);
    b = encode(&ENC_DEFAULT, "{}", "{}", tok, tn, NULL, 0, &n);
    free(tok);
    snprintf(p, sizeof(p), "%s/no-tensors.qshard", dir);
    write_file(p, b, n);
    free(b);
    return 0;
}


int main(int argc, char **argv)
{
    bool mode = argc == 3 && (!strcmp(argv[1], "--write-spec-example") ||
                              !strcmp(argv[1], "--write-corpus"));
    if (!t_fmt_init("fmt", !mode))
        return 1;
    if (argc == 3 && !strcmp(argv[1], "--write-spec-example"))
        return write_spec_example(argv[2]) ? 1 : 0;
    if (argc == 3 && !strcmp(argv[1], "--write-corpus")) {
        g_rng = 42; /* deterministic corpus */
        base_init();
        return write_corpus(argv[2]);
    }
    test_dtype_sizes();
    test_round_trip();
    test_encoder_matches_writer();
    test_spec_hexdump();
    test_corrupt();
    test_manifest();
    test_writer_failures();
    test_names();
    rm_rf(g_dir);
    return t_done();
}
