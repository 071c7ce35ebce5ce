/*
 * fuzz_manifest.c - libFuzzer target for the manifest reader (format/fmt_manifest.c).
 *
 * Each input becomes manifest.json in a private temp directory that also holds two valid rank
 * files (rank-0-of-2.qshard, rank-1-of-2.qshard, written once with the library writer), then
 * fmt_manifest_load and fmt_model_open run on it: hostile JSON, names, sizes, digests, ranks.
 * Logging is quiet. `make fuzz` runs it on tests/data/fuzz/fuzz_manifest/.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fmt.h"       /* fmt_manifest_load, fmt_model_open */
#include "fmt_write.h" /* the two rank files */
#include "qs_log.h"    /* qs_log_set_quiet */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_dir[64], g_manifest[128];

static void write_rank(uint32_t rank)
{
    char path[128];
    struct fmt_writer *w;
    struct fmt_writer_opts o = {rank, 2, {7, 7, 7}};
    uint64_t shape[1] = {8};
    float v[8] = {0};
    snprintf(path, sizeof(path), "%s/rank-%u-of-2.qshard", g_dir, rank);
    if (fmt_writer_open(path, &o, &w) || fmt_writer_set_section(w, FMT_SECTION_CONFIG, "{}", 2) ||
        fmt_writer_add_tensor(w, "model.norm.weight", FMT_DTYPE_F32, FMT_LAYOUT_ROW_MAJOR, 1,
                              shape, FMT_SPLIT_NONE, 0, NULL) ||
        fmt_writer_begin_data(w) || fmt_writer_put_tensor(w, 0, v, sizeof(v)) ||
        fmt_writer_finish(w))
        abort();
}

static void cleanup(void)
{
    char path[160];
    for (uint32_t k = 0; k < 2; k++) {
        snprintf(path, sizeof(path), "%s/rank-%u-of-2.qshard", g_dir, k);
        unlink(path);
    }
    unlink(g_manifest);
    rmdir(g_dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_dir[0]) {
        qs_log_set_quiet(true);
        /* tmpfs when there is one: ext4 flushes a file rewritten after truncation on close */
        snprintf(g_dir, sizeof(g_dir), "%s/qshard-fuzz-manifest-XXXXXX",
                 access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
        if (!mkdtemp(g_dir))
            abort();
        write_rank(0);
        write_rank(1);
        snprintf(g_manifest, sizeof(g_manifest), "%s/%s", g_dir, FMT_MANIFEST_NAME);
        atexit(cleanup);
    }
    FILE *f = fopen(g_manifest, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0)
        abort();
    struct fmt_manifest *m = NULL;
    if (fmt_manifest_load(g_dir, &m) == FMT_ERR_NONE) {
        for (uint32_t k = 0; k < m->world_size; k++)
            if (m->ranks[k].rank != k || !m->ranks[k].file || strchr(m->ranks[k].file, '/'))
                abort();
        fmt_manifest_free(m);
    } else if (m) {
        abort();
    }
    struct fmt_model *mod = NULL;
    if (fmt_model_open(g_dir, &mod) == FMT_ERR_NONE) {
        if (fmt_model_world_size(mod) != 2)
            abort(); /* only the two real rank files can pass the digest check */
        fmt_model_close(mod);
    } else if (mod) {
        abort();
    }
    return 0;
}
