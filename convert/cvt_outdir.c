/*
 * cvt_outdir.c - the conversion's output directory (cvt_run_int.h): create it, lock it against
 * a concurrent convert, refuse or replace an earlier conversion, stage the new files and commit
 * them, or clean up after a failure (docs/CONVERT.md section 2, steps 2 and 6, and the guarantee
 * for OUT_DIR).
 *
 * Entry points: cvt_outdir_prepare, cvt_outdir_commit, cvt_outdir_cleanup, cvt_outdir_unlock.
 * Test: ./build/test_cvt_outdir (replace, refuse, interrupt, rollback, lock).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h> /* flock */
#include <sys/stat.h>
#include <unistd.h>

#include "cvt_run_int.h"
#include "fmt_write.h" /* fmt_rank_file_name, FMT_MANIFEST_NAME */
#include "qs_log.h"    /* qs_log_error, qs_log_warn */

/*
 * Replacing a conversion (--force) must never wreck the old one: everything is written into a
 * fresh staging directory OUT_DIR/.qshard-convert.XXXXXX (same file system, so renames are
 * atomic), rank files and manifest included. Only when all of it is finished (fsync'd, verified
 * by fmt_manifest_write) does commit_outputs() move it into place: the old manifest and old rank
 * files of the same names are first moved into the staging directory (backups), the new rank
 * files in, the new manifest last; a failed rename undoes the ones done. Then stale rank files of
 * another world size are removed and the staging directory (backups) with them. A failure or
 * signal before that point removes the staging directory and leaves OUT_DIR as it was.
 */

#define CVT_STAGE_PREFIX ".qshard-convert."

static bool path_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

/* mkdir -p out_dir, remembering what did not exist before. */
static enum cvt_err make_dirs(const char *dir, struct cvt_outdir *made)
{
    char buf[4096];
    size_t len = strlen(dir);
    /* room for the staging directory and a file name inside it */
    if (len == 0 || len + 128 >= sizeof(buf)) {
        qs_log_error(__func__, "output directory '%s': expected a path of 1..%zu bytes", dir,
                     sizeof(buf) - 129);
        return CVT_ERR_IO;
    }
    memcpy(buf, dir, len + 1);
    for (size_t i = 1; i <= len; i++) {
        if (buf[i] != '/' && buf[i] != '\0')
            continue;
        char c = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0777) == 0) {
            if (made->n_made < 16)
                snprintf(made->made[made->n_made++], sizeof(made->made[0]), "%s", buf);
        } else if (errno != EEXIST) {
            qs_log_error(__func__, "output directory %s: cannot create %s: %s", dir, buf,
                         strerror(errno));
            buf[i] = c;
            return CVT_ERR_IO;
        }
        buf[i] = c;
    }
    struct stat st;
    if (stat(dir, &st) || !S_ISDIR(st.st_mode)) {
        qs_log_error(__func__, "output path %s: exists and is not a directory", dir);
        return CVT_ERR_IO;
    }
    return CVT_ERR_NONE;
}

/* --- the output lock -------------------------------------------------------------------------
 * Two converts into one OUT_DIR must not both succeed (each would commit over the other). The
 * run holds an exclusive flock(2) on OUT_DIR/.qshard-convert.lock from before it looks at
 * OUT_DIR's content until it has committed or cleaned up; a second run fails at once
 * (CVT_ERR_LOCKED) naming the pid the holder wrote into the file. The lock goes with the process
 * (a killed run leaves a file that locks nothing), and the holder removes the file when done.
 * Removing it opens a race (a waiter may have opened the old file): whoever gets the lock checks
 * that the path still names the file it locked and starts over otherwise.
 */

#define CVT_LOCK_NAME CVT_STAGE_PREFIX "lock"

static enum cvt_err lock_out_dir(const char *dir, struct cvt_outdir *d)
{
    snprintf(d->lock_path, sizeof(d->lock_path), "%s/" CVT_LOCK_NAME, dir);
    for (int attempt = 0; attempt < 100; attempt++) {
        int fd = open(d->lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) {
            qs_log_error(__func__, "output directory %s: cannot create the lock file %s: %s",
                         dir, d->lock_path, strerror(errno));
            return CVT_ERR_IO;
        }
        if (flock(fd, LOCK_EX | LOCK_NB)) {
            int en = errno;
            char pid[32] = "";
            ssize_t n = en == EWOULDBLOCK ? pread(fd, pid, sizeof(pid) - 1, 0) : -1;
            pid[n > 0 ? n : 0] = '\0';
            pid[strcspn(pid, "\n")] = '\0';
            close(fd);
            if (en != EWOULDBLOCK) {
                qs_log_error(__func__, "output directory %s: cannot lock %s: %s", dir,
                             d->lock_path, strerror(en));
                return CVT_ERR_IO;
            }
            qs_log_error(__func__, "output directory %s: another qshard convert (pid %s) is "
                                   "writing it; left as it is",
                         dir, pid[0] ? pid : "unknown");
            return CVT_ERR_LOCKED;
        }
        struct stat a, b;
        if (fstat(fd, &a) == 0 && stat(d->lock_path, &b) == 0 && a.st_dev == b.st_dev &&
            a.st_ino == b.st_ino) {
            char pid[32];
            int n = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
            if (ftruncate(fd, 0) || pwrite(fd, pid, (size_t)n, 0) != n)
                qs_log_warn("output lock %s: cannot record the pid: %s", d->lock_path,
                            strerror(errno));
            d->lock_fd = fd;
            return CVT_ERR_NONE;
        }
        close(fd); /* the holder removed that file after we opened it: take the new one */
    }
    qs_log_error(__func__, "output directory %s: the lock file %s keeps being replaced", dir,
                 d->lock_path);
    return CVT_ERR_LOCKED;
}

void cvt_outdir_unlock(struct cvt_outdir *d)
{
    if (d->lock_fd < 0)
        return;
    if (unlink(d->lock_path))
        qs_log_warn("cannot remove the lock file %s: %s", d->lock_path, strerror(errno));
    close(d->lock_fd); /* releases the flock */
    d->lock_fd = -1;
}

/* Parse a decimal number of 1..9 digits without sign or leading zero at *s; advances *s. */
static bool parse_u32(const char **s, uint32_t *v)
{
    const char *p = *s;
    uint32_t x = 0;
    int n = 0;
    while (*p >= '0' && *p <= '9' && n < 10) {
        x = x * 10 + (uint32_t)(*p++ - '0');
        n++;
    }
    if (n == 0 || n > 9 || (n > 1 && **s == '0'))
        return false;
    *s = p;
    *v = x;
    return true;
}

/* Is `name` a rank file name as fmt_rank_file_name writes it ("rank-K-of-N.qshard", K < N)?
 * *world receives N. */
static bool rank_file_world(const char *name, uint32_t *world)
{
    uint32_t k, n;
    const char *p = name;
    if (strncmp(p, "rank-", 5))
        return false;
    p += 5;
    if (!parse_u32(&p, &k) || strncmp(p, "-of-", 4))
        return false;
    p += 4;
    if (!parse_u32(&p, &n) || strcmp(p, ".qshard") || k >= n)
        return false;
    *world = n;
    return true;
}

/* Name (into found[256]) of the first entry of dir that belongs to a conversion: manifest.json
 * or a rank file of any world size. False if there is none. */
static bool find_old_output(const char *dir, char found[256])
{
    DIR *d = opendir(dir);
    struct dirent *de;
    uint32_t n;
    bool hit = false;
    if (!d)
        return false; /* make_dirs saw a directory; creating the staging directory will fail */
    while (!hit && (de = readdir(d)))
        if (!strcmp(de->d_name, FMT_MANIFEST_NAME) || rank_file_world(de->d_name, &n)) {
            snprintf(found, 256, "%s", de->d_name);
            hit = true;
        }
    closedir(d);
    return hit;
}

/* Remove the staging directory and everything in it (only this run writes there); stage[0] = 0
 * after. Nothing to do when stage is empty. */
static void remove_stage(char *stage)
{
    char path[4096 + 256];
    DIR *d;
    struct dirent *de;
    if (!stage[0])
        return;
    if ((d = opendir(stage))) {
        while ((de = readdir(d)))
            if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
                snprintf(path, sizeof(path), "%s/%s", stage, de->d_name);
                unlink(path);
            }
        closedir(d);
    }
    if (rmdir(stage))
        qs_log_warn("cannot remove the staging directory %s: %s", stage, strerror(errno));
    stage[0] = '\0';
}

enum cvt_err cvt_outdir_prepare(const struct cvt_opts *o, struct cvt_outdir *d, char *stage)
{
    char found[256];
    stage[0] = '\0';
    CVT_TRY(make_dirs(o->out_dir, d));
    CVT_TRY(lock_out_dir(o->out_dir, d));
    if (!o->force && find_old_output(o->out_dir, found)) {
        qs_log_error(__func__, "output directory %s: already holds %s from an earlier "
                               "conversion; left as it is",
                     o->out_dir, found);
        return CVT_ERR_EXISTS;
    }
    snprintf(stage, 4096, "%s/" CVT_STAGE_PREFIX "XXXXXX", o->out_dir);
    if (!mkdtemp(stage)) {
        qs_log_error(__func__, "output directory %s: cannot create a staging directory: %s",
                     o->out_dir, strerror(errno));
        stage[0] = '\0';
        return CVT_ERR_IO;
    }
    return CVT_ERR_NONE;
}

/* One rename of the commit: a backup moves OUT_DIR/name to STAGE/old.name, an install moves
 * STAGE/name to OUT_DIR/name. */
struct commit_mv {
    char name[64];
    bool backup;
};

static int commit_rename(const char *out_dir, const char *stage, const struct commit_mv *m,
                         int step, bool undo, int commit_fail)
{
    char a[4096 + 256], b[4096 + 256];
    /* test hook (tests/test_cvt.c): rename number commit_fail - 1 fails as if with EIO */
    bool fail = !undo && commit_fail == step + 1;
    if (m->backup) {
        snprintf(a, sizeof(a), "%s/%s", out_dir, m->name);
        snprintf(b, sizeof(b), "%s/old.%s", stage, m->name);
    } else {
        snprintf(a, sizeof(a), "%s/%s", stage, m->name);
        snprintf(b, sizeof(b), "%s/%s", out_dir, m->name);
    }
    if (fail || (undo ? rename(b, a) : rename(a, b))) {
        int en = fail ? EIO : errno;
        qs_log_error("commit_outputs", "cannot move %s to %s: %s", undo ? b : a, undo ? a : b,
                     strerror(en));
        return -1;
    }
    return 0;
}

/* Move the finished conversion (STAGE/rank-K-of-N.qshard for K < tp, STAGE/manifest.json) into
 * out_dir, replacing an earlier one, then remove stale rank files of other world sizes and the
 * staging directory. On a failed rename every rename done is undone (the earlier conversion is
 * back in place) and CVT_ERR_IO returned; if undoing fails too, the staging directory is kept
 * (stage[0] = 0) and the error names where the files are. */
enum cvt_err cvt_outdir_commit(const char *out_dir, char *stage, int tp, int commit_fail)
{
    struct commit_mv *mv = calloc(2 * (size_t)tp + 2, sizeof(*mv));
    char path[4096 + 256];
    int n = 0, done = 0;
    if (!mv)
        return CVT_ERR_NOMEM;
    snprintf(path, sizeof(path), "%s/%s", out_dir, FMT_MANIFEST_NAME);
    if (path_exists(path)) { /* first: a half-replaced directory never has a manifest */
        snprintf(mv[n].name, sizeof(mv[n].name), "%s", FMT_MANIFEST_NAME);
        mv[n++].backup = true;
    }
    for (int r = 0; r < tp; r++) {
        char file[64];
        fmt_rank_file_name(file, sizeof(file), (uint32_t)r, (uint32_t)tp);
        snprintf(path, sizeof(path), "%s/%s", out_dir, file);
        if (path_exists(path)) {
            snprintf(mv[n].name, sizeof(mv[n].name), "%s", file);
            mv[n++].backup = true;
        }
        snprintf(mv[n++].name, sizeof(mv[0].name), "%s", file);
    }
    snprintf(mv[n++].name, sizeof(mv[0].name), "%s", FMT_MANIFEST_NAME); /* last: commit point */
    while (done < n && commit_rename(out_dir, stage, &mv[done], done, false, commit_fail) == 0)
        done++;
    if (done < n) {
        bool restored = true;
        for (int i = done - 1; i >= 0; i--)
            restored &= commit_rename(out_dir, stage, &mv[i], i, true, 0) == 0;
        if (!restored) {
            qs_log_error(__func__, "output directory %s: could not restore the earlier "
                                   "conversion; its files are in %s (old.*), the new ones there "
                                   "or in %s",
                         out_dir, stage, out_dir);
            stage[0] = '\0'; /* keep it */
        }
        free(mv);
        return CVT_ERR_IO;
    }
    free(mv);
    int fd = open(out_dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0 || fsync(fd))
        qs_log_warn("output directory %s: fsync: %s", out_dir, strerror(errno));
    if (fd >= 0)
        close(fd);
    /* stale rank files of an earlier conversion with another world size */
    DIR *d = opendir(out_dir);
    struct dirent *de;
    uint32_t world;
    while (d && (de = readdir(d)))
        if (rank_file_world(de->d_name, &world) && world != (uint32_t)tp) {
            snprintf(path, sizeof(path), "%s/%s", out_dir, de->d_name);
            if (unlink(path))
                qs_log_warn("cannot remove the stale rank file %s: %s", path, strerror(errno));
        }
    if (d)
        closedir(d);
    remove_stage(stage); /* the backups */
    return CVT_ERR_NONE;
}

void cvt_outdir_cleanup(char *stage, struct cvt_outdir *d)
{
    remove_stage(stage);
    cvt_outdir_unlock(d);
    for (int i = d->n_made - 1; i >= 0; i--)
        rmdir(d->made[i]);
}
