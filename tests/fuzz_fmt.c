/*
 * fuzz_fmt.c - libFuzzer target for the .qshard reader (format/fmt.c).
 *
 * Each input is written to a memfd and opened by path (/proc/self/fd/N) with fmt_shard_open,
 * exactly as a file on disk would be; when it opens, every accessor runs on it (tensor lookup by
 * index and by name, sections, tokenizer archive, digest, verify_all). Each input is tried twice:
 * as is, and "repaired": file_size set to the input's size and every section hash and the header
 * hash recomputed, so mutations get past the checksums and reach the structural checks behind
 * them. Logging is quiet. Build and run: `make fuzz` (FUZZ_SECONDS=60 per target) on the seed
 * corpus tests/data/fuzz/fuzz_fmt/ (made by ./build/test_fmt --write-corpus DIR).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <xxhash.h> /* XXH3_64bits: repairing checksums */

#include "fmt.h"    /* fmt_shard_* */
#include "qs_log.h" /* qs_log_set_quiet */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int g_fd = -1;
static char g_path[64];

static void tok_cb(void *ctx, const char *name, uint64_t size)
{
    (void)size;
    *(size_t *)ctx += strlen(name);
}

static void exercise(const uint8_t *data, size_t size)
{
    if (ftruncate(g_fd, 0) != 0 || (size && pwrite(g_fd, data, size, 0) != (ssize_t)size))
        abort();
    struct fmt_shard *s = NULL;
    if (fmt_shard_open(g_path, &s) != FMT_ERR_NONE) {
        if (s)
            abort(); /* a failed open must leave *out NULL */
        return;
    }
    const struct fmt_header *h = fmt_shard_header(s);
    if (h->tp_rank >= h->world_size)
        abort();
    uint64_t sum = fmt_shard_digest(s);
    for (uint32_t i = 0; i < fmt_shard_n_tensors(s); i++) {
        const struct fmt_tensor *t = fmt_shard_tensor(s, i);
        if (fmt_shard_find(s, t->name) != t || t->offset % FMT_ALIGN ||
            t->offset + t->size > h->file_size)
            abort();
        if (t->size)
            sum += ((const uint8_t *)t->data)[t->size - 1];
        fmt_shard_verify_tensor(s, i);
    }
    const char *json;
    size_t len;
    if (fmt_shard_config_json(s, &json, &len) == FMT_ERR_NONE && len)
        sum += (uint8_t)json[len - 1];
    void *buf;
    if (fmt_shard_tokenizer_file(s, "tokenizer.json", &buf, &len) == FMT_ERR_NONE)
        free(buf);
    size_t names = 0;
    fmt_shard_tokenizer_list(s, tok_cb, &names);
    fmt_shard_verify_all(s, NULL, NULL);
    fmt_shard_close(s);
    if (sum == 42)
        fputc(' ', stderr); /* keep the reads observable */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (g_fd < 0) {
        qs_log_set_quiet(true);
        g_fd = memfd_create("qshard-fuzz", MFD_CLOEXEC);
        if (g_fd < 0)
            abort();
        snprintf(g_path, sizeof(g_path), "/proc/self/fd/%d", g_fd);
    }
    exercise(data, size);
    if (size < 256)
        return 0;
    uint8_t *b = malloc(size);
    memcpy(b, data, size);
    for (int i = 0; i < 8; i++)
        b[32 + i] = (uint8_t)((uint64_t)size >> (8 * i)); /* file_size */
    uint32_t cnt = b[64] | b[65] << 8 | b[66] << 16 | (uint32_t)b[67] << 24;
    uint32_t es = b[68] | b[69] << 8 | b[70] << 16 | (uint32_t)b[71] << 24;
    uint64_t tab = 0;
    for (int i = 7; i >= 0; i--)
        tab = tab << 8 | b[56 + i];
    for (uint32_t i = 0; es >= 32 && i < cnt && i < 256; i++) {
        uint64_t e = tab + (uint64_t)i * es;
        if (tab > size || e > size - 32)
            break;
        uint64_t off = 0, sz = 0;
        for (int k = 7; k >= 0; k--) {
            off = off << 8 | b[e + 8 + k];
            sz = sz << 8 | b[e + 16 + k];
        }
        if (off > size || sz > size - off)
            continue;
        uint64_t hsh = XXH3_64bits(b + off, sz);
        for (int k = 0; k < 8; k++)
            b[e + 24 + k] = (uint8_t)(hsh >> (8 * k));
    }
    memset(b + 248, 0, 8);
    uint64_t hh = XXH3_64bits(b, 256);
    for (int k = 0; k < 8; k++)
        b[248 + k] = (uint8_t)(hh >> (8 * k));
    exercise(b, size);
    free(b);
    return 0;
}
