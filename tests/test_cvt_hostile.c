/*
 * test_cvt_hostile.c - the converter's container readers on hostile input: safetensors headers
 * (truncation at every byte, huge lengths, offset overflow, holes, overlaps, duplicate names,
 * bad UTF-8), pickles (forbidden GLOBALs, deep nesting, memo out of range, truncation at every
 * byte), torch zip archives (ZIP64, compressed entries, big-endian, CRC). Each input must be
 * refused with its status and a message naming it, never crash (run under ASan by `make check`).
 *
 * Run: ./build/test_cvt_hostile (from the repo root). Builders: tests/t_cvt_src.h.
 */
#include "t_cvt_src.h"

/* --- safetensors hostile inputs ------------------------------------------------------------------- */

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

int main(void)
{
    T_INIT("cvt_hostile");
    if (!t_src_tmp("cvt-hostile"))
        return 1;
    test_safetensors_hostile();
    test_pickle_hostile();
    test_zip_hostile();
    return t_src_done();
}
