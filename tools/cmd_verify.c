/*
 * cmd_verify.c - `qshard verify [-v] [--tensor NAME] FILE|DIR...`: structure + header/section
 * checksums + every tensor checksum (or only one: --tensor NAME) + zero padding + tokenizer
 * archive, and for a DIR the manifest: every rank present, same model, file sizes and
 * metadata digests as recorded. A DIR without a manifest: every *.qshard in it is verified,
 * then it fails (the set's completeness cannot be checked). One status line per file
 * (ok/FAILED) and a summary on stdout.
 *
 * Exit codes (docs/DESIGN.md section 2): 0 ok, 1 usage, 4 I/O error, 2 when a file cannot be
 * parsed (format/SPEC.md section 8 structure checks, malformed manifest), 5 when a check fails
 * on a parsed file: any checksum (header, section, tensor), manifest size/digest, padding,
 * tokenizer archive, missing or foreign rank, no manifest. The error itself is reported once,
 * where format/ detects it (qs_log_error); this file prints it only when the library returned
 * an error without logging one.
 *
 * Test: ./build/test_fmt (section 6, "the qshard binary").
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "cmd.h"
#include "fmt.h"     /* fmt_shard_*, fmt_manifest_* */
#include "qs_util.h" /* qs_now_s, qs_path_join */

/* verify: 5 for a check that fails on a file that parses (every checksum, the manifest's size
 * and digest, padding, tokenizer archive, rank set); 2 for one that does not parse (including a
 * malformed manifest.json: FMT_ERR_MANIFEST); 4 for I/O. */
static int exit_verify(enum fmt_err e)
{
    switch (e) {
    case FMT_ERR_CHECKSUM: case FMT_ERR_META_CHECKSUM: case FMT_ERR_DIGEST:
    case FMT_ERR_PADDING: case FMT_ERR_ZLIB: case FMT_ERR_MISSING_RANK:
    case FMT_ERR_RANK_MISMATCH:
        return QS_EXIT_VERIFY;
    default:
        return cli_exit_fmt(e);
    }
}

struct verify_opts {
    bool verbose;       /* progress on stderr */
    const char *tensor; /* --tensor NAME, or NULL: every tensor */
};

/* Counts over one `verify` run, for the summary line. */
struct tally {
    int files, files_bad; /* rank files looked at, and those that failed any check */
    int dirs, dirs_bad;   /* directories, and those whose manifest check failed */
};

struct progress {
    bool on;
    double t0, last;
};

static void progress_fn(void *ctx, uint32_t done, uint32_t n, uint64_t bytes, uint64_t total)
{
    struct progress *p = ctx;
    double t = qs_now_s();
    if (!p->on || (t - p->last < 0.5 && done != n))
        return;
    p->last = t;
    fprintf(stderr, "\r  %u/%u tensors, %.2f/%.2f GiB", done, n, (double)bytes / (1 << 30),
            (double)total / (1 << 30));
    if (done == n)
        fputc('\n', stderr);
}

/* Mark one rank file failed: the error itself was reported where it was detected. */
static int file_failed(struct tally *t, const char *path, enum fmt_err e)
{
    t->files++;
    t->files_bad++;
    cli_status_line("FAILED: %s\n", path);
    return exit_verify(e);
}

/* Verify one open shard (every tensor, or o->tensor); prints its status line; returns the exit
 * code. */
static int verify_shard(const struct fmt_shard *s, const struct verify_opts *o, struct tally *t)
{
    const char *path = fmt_shard_path(s);
    enum fmt_err e;
    double t0 = qs_now_s();
    qs_log_clear();
    if (o->tensor) {
        const struct fmt_tensor *ft = fmt_shard_find(s, o->tensor);
        if (!ft) {
            qs_log_error(__func__, "file %s: no tensor named %s", path, o->tensor);
            file_failed(t, path, FMT_ERR_NOT_FOUND);
            return QS_EXIT_BAD_INPUT;
        }
        if (!(e = fmt_shard_verify_tensor(s, fmt_shard_tensor_index(s, ft)))) {
            t->files++;
            cli_status_line("ok: %s: tensor %s (%" PRIu64 " bytes, xxh3 %016" PRIx64 ")\n", path,
                        o->tensor, ft->size, ft->xxh3);
            return QS_EXIT_OK;
        }
    } else {
        struct progress p = {o->verbose, t0, 0};
        if (!(e = fmt_shard_verify_all(s, progress_fn, &p))) {
            uint64_t bytes = fmt_shard_header(s)->file_size;
            double dt = qs_now_s() - t0, mib = (double)bytes / (1 << 20);
            t->files++;
            cli_status_line("ok: %s: %u tensor%s, %" PRIu64 " bytes (%.1f MiB) in %.3f s, %.0f MiB/s\n",
                        path, fmt_shard_n_tensors(s), fmt_shard_n_tensors(s) == 1 ? "" : "s",
                        bytes, mib, dt, dt > 0 ? mib / dt : 0.0);
            return QS_EXIT_OK;
        }
    }
    cli_report_unlogged(e, path);
    return file_failed(t, path, e);
}

/* Open (structure, header and section checksums) and verify one file. */
static int verify_file(const char *path, const struct verify_opts *o, struct tally *t)
{
    struct fmt_shard *s;
    qs_log_clear();
    enum fmt_err e = fmt_shard_open(path, &s);
    if (e) {
        cli_report_unlogged(e, path);
        return file_failed(t, path, e);
    }
    int rc = verify_shard(s, o, t);
    fmt_shard_close(s);
    return rc;
}

/* A DIR without manifest.json: verify every *.qshard in it, then fail (exit 5): without the
 * manifest nobody can tell whether a rank is missing or belongs to another conversion. */
static int verify_dir_no_manifest(const char *dir, const struct verify_opts *o, struct tally *t)
{
    char **v;
    int n = cli_list_qshard(dir, &v);
    t->dirs_bad++;
    if (n < 0) {
        qs_log_error(__func__, "directory %s: cannot list: %s", dir, strerror(errno));
        return QS_EXIT_IO;
    }
    if (n == 0) {
        qs_log_error(__func__, "directory %s: no %s and no .qshard files", dir, FMT_MANIFEST_NAME);
        cli_free_list(v, n);
        return QS_EXIT_BAD_INPUT;
    }
    int rc = QS_EXIT_OK;
    for (int i = 0; i < n; i++)
        rc = cli_worse(rc, verify_file(v[i], o, t));
    cli_free_list(v, n);
    qs_log_error(__func__, "directory %s: no %s: the set cannot be checked for completeness "
                 "(missing ranks, files of another conversion); its %d .qshard file(s) were "
                 "verified one by one. `qshard convert` writes the manifest last", dir,
                 FMT_MANIFEST_NAME, n);
    return cli_worse(rc, QS_EXIT_VERIFY);
}

/* A DIR with manifest.json: every rank against the manifest, then each rank's data. A rank that
 * fails to open does not stop the others from being checked. */
static int verify_dir(const char *dir, const struct verify_opts *o, struct tally *t)
{
    char path[4096];
    struct stat st;
    t->dirs++;
    snprintf(path, sizeof(path), "%s/%s", dir, FMT_MANIFEST_NAME);
    if (stat(path, &st) != 0) {
        if (errno == ENOENT)
            return verify_dir_no_manifest(dir, o, t);
        qs_log_error(__func__, "file %s: %s", path, strerror(errno));
        t->dirs_bad++;
        return QS_EXIT_IO;
    }
    struct fmt_manifest *man;
    qs_log_clear();
    enum fmt_err e = fmt_manifest_load(dir, &man);
    if (e) {
        cli_report_unlogged(e, path);
        t->dirs_bad++;
        cli_status_line("FAILED: %s\n", path);
        return exit_verify(e);
    }
    uint32_t world = man->world_size;
    struct fmt_shard **sh = calloc(world, sizeof(*sh));
    if (!sh) {
        qs_log_error(__func__, "directory %s: out of memory", dir);
        fmt_manifest_free(man);
        t->dirs_bad++;
        return QS_EXIT_IO;
    }
    int rc = QS_EXIT_OK;
    for (uint32_t k = 0; k < world; k++) {
        qs_log_clear();
        if ((e = fmt_manifest_open_rank(dir, k, &sh[k]))) {
            char rp[4096];
            snprintf(rp, sizeof(rp), "%s/%s", dir, man->ranks[k].file);
            cli_report_unlogged(e, rp);
            rc = cli_worse(rc, file_failed(t, rp, e));
        }
    }
    if (rc == QS_EXIT_OK) /* the digest covers [0, meta_size): not the tensor bytes */
        cli_status_line("ok: %s: %s: %u ranks present, same model, file sizes and metadata digests "
                    "match (tensor data: see each file)\n", dir, FMT_MANIFEST_NAME, world);
    for (uint32_t k = 0; k < world; k++) {
        if (sh[k])
            rc = cli_worse(rc, verify_shard(sh[k], o, t));
        fmt_shard_close(sh[k]);
    }
    free(sh);
    fmt_manifest_free(man);
    return rc;
}

static const char k_usage[] =
    "usage: qshard verify [-v] [--tensor NAME] FILE|DIR...\n"
    "  Check the structure, header and section checksums, every tensor checksum (XXH3-64),\n"
    "  zero padding and the tokenizer archive of .qshard files. A DIR must hold a\n"
    "  manifest.json: every rank present, same model_id and world_size, file sizes and\n"
    "  metadata digests as recorded (the digest covers the header, sections and tensor\n"
    "  table with every tensor hash, not the tensor bytes: those are checked per file).\n"
    "  A DIR without manifest.json: every *.qshard in it is verified, then verify fails\n"
    "  (exit 5) because the set cannot be checked for completeness.\n"
    "  Prints one line per file (ok/FAILED; the error itself is on stderr) and a summary.\n"
    "\n";
static const char k_trailer[] =
    "exit (the worst over all inputs):\n"
    "  0 ok\n"
    "  1 usage\n"
    "  2 a file cannot be parsed: bad magic, version or header field, truncated, offset,\n"
    "    size or shape out of range, malformed manifest.json, --tensor NAME not in a file\n"
    "  4 I/O error (missing or unreadable path)\n"
    "  5 verification failed: a checksum does not match (header, section, tensor), the\n"
    "    manifest's size or digest does not match, non-zero padding, corrupt tokenizer\n"
    "    archive, a rank missing or of another conversion, or no manifest.json\n"
    "  A file fails at the first check in format/SPEC.md section 8 order, so a flipped\n"
    "  byte in an offset field can give 2 where one in the data gives 5.\n";

int cmd_verify(int argc, char **argv)
{
    struct cli_args a;
    int rc = cli_parse(CLI_VERIFY, "qshard verify", k_usage, k_trailer, argc, argv, &a);
    if (rc)
        return rc == CLI_HELP ? QS_EXIT_OK : rc;
    if (a.n_pos == 0)
        return cli_usage_error("give at least one FILE or DIR");
    const struct verify_opts o = {a.verbose, a.tensor};
    struct tally t = {0, 0, 0, 0};
    for (int i = 0; i < a.n_pos; i++)
        rc = cli_worse(rc, cli_is_dir(a.pos[i]) ? verify_dir(a.pos[i], &o, &t)
                                                : verify_file(a.pos[i], &o, &t));
    const char *fs = t.files == 1 ? "" : "s";
    if (rc == QS_EXIT_OK) {
        cli_status_line("ok: all %d file%s verified (structure + %s%s%s)%s\n", t.files, fs,
                    o.tensor ? "checksum of tensor " : "every tensor checksum",
                    o.tensor ? o.tensor : "", o.tensor ? "" : ", padding, tokenizer archive",
                    t.dirs ? "; every manifest matches" : "");
    } else if (t.dirs_bad) {
        char files[96];
        if (t.files_bad)
            snprintf(files, sizeof(files), "%d of %d file%s failed", t.files_bad, t.files, fs);
        else if (!t.files)
            snprintf(files, sizeof(files), "no rank file checked");
        else
            snprintf(files, sizeof(files), "all %d file%s passed", t.files, fs);
        cli_status_line("FAILED: %s; %d of %d director%s without a usable %s (the set is not "
                    "checked for completeness)\n", files, t.dirs_bad, t.dirs,
                    t.dirs == 1 ? "y" : "ies", FMT_MANIFEST_NAME);
    } else {
        cli_status_line("FAILED: %d of %d file%s\n", t.files_bad, t.files, fs);
    }
    return rc;
}
