/*
 * cvt_run.c - the conversion driver: HF AWQ directory -> OUT_DIR/rank-K-of-N.qshard + manifest.
 *
 * Entry point: cvt_run() (cvt.h), called by `qshard convert` (tools/cmd_convert.c) and the tests.
 *
 * Steps (docs/CONVERT.md section 2; the files named do the work, cvt_run_int.h joins them):
 *   1. open the source (cvt_src.h), check its tokenizer (cvt_tok.c), normalise the config, build
 *      the TP plan (cvt_plan.c); validate every source tensor the plan reads before writing
 *      anything: AWQ linears through cvt_awq_probe, float tensors by catalog shape (cvt_write.c);
 *   2. create and lock OUT_DIR, refuse an earlier conversion without --force, create a fresh
 *      staging directory OUT_DIR/.qshard-convert.XXXXXX (cvt_outdir.c);
 *   3. open one format writer per rank there (config section of DESIGN 6 with that rank's tp
 *      block, tokenizer files, generation config), declare every tensor (cvt_write.c);
 *   4. a pthreads work queue over (output tensor, rank) jobs, largest first (cvt_job.c: packed
 *      linears with the bitwise self-check, float tensors, bounded memory);
 *   5. finish every writer (fsync + rename), then the manifest, in the staging directory;
 *   6. commit: move them into OUT_DIR (an earlier conversion's files are replaced only now;
 *      stale rank files of another world size are removed), unlock (cvt_outdir.c).
 * On any failure or signal before the commit: abort every writer, remove the staging directory,
 * the lock and the output directories this call created; OUT_DIR's earlier content is untouched.
 *
 * Test: ./build/test_cvt (fixtures), ./build/test_cvt_outdir (interrupts, rollbacks, the lock),
 * in process through struct cvt_hooks.
 */
#include "cvt_run_int.h"

#include <dirent.h>
#include <inttypes.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fmt_write.h" /* fmt_writer_finish, fmt_writer_abort, fmt_manifest_write */
#include "qs_log.h"    /* qs_log_error, qs_log_warn, qs_log_info */
#include "qs_util.h"   /* qs_now_s */

/* Set by SIGINT / SIGTERM / SIGHUP while cvt_run writes: workers stop, everything written so far
 * is removed, cvt_run returns CVT_ERR_INTERRUPTED. */
static volatile sig_atomic_t g_signal;

static void on_signal(int sig) { g_signal = sig; }

static const int k_signals[3] = {SIGINT, SIGTERM, SIGHUP};

/* Catch SIGINT / SIGTERM / SIGHUP (old[] receives the previous actions). A signal the caller
 * ignores (SIG_IGN, e.g. under nohup) stays ignored. */
static void signals_catch(struct sigaction old[3])
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    g_signal = 0;
    for (int i = 0; i < 3; i++) {
        sigaction(k_signals[i], NULL, &old[i]);
        if (old[i].sa_handler != SIG_IGN)
            sigaction(k_signals[i], &sa, NULL);
    }
}

static void signals_restore(const struct sigaction old[3])
{
    for (int i = 0; i < 3; i++)
        sigaction(k_signals[i], &old[i], NULL);
}

/* Test hooks (struct cvt_hooks on_stage, signal_at; tests/test_cvt_outdir.c) at `stage`: the
 * callback, then SIGINT when asked for, so the interrupted paths run deterministically. */
static void hook_signal_point(const struct cvt_hooks *h, const char *stage)
{
    if (h->on_stage)
        h->on_stage(stage, h->on_stage_arg);
    if (h->signal_at && !strcmp(h->signal_at, stage))
        raise(SIGINT);
}

/* Did a signal arrive before anything was written? Then say so and set *e. */
static bool interrupted_early(enum cvt_err *e)
{
    if (!g_signal)
        return false;
    qs_log_error("cvt_run", "interrupted by signal %d before anything was written",
                 (int)g_signal);
    *e = CVT_ERR_INTERRUPTED;
    return true;
}

/* Do a and b name the same existing directory (symlinks and `..` resolved)? */
static bool same_dir(const char *a, const char *b)
{
    char *ra = realpath(a, NULL), *rb = realpath(b, NULL);
    struct stat sa, sb;
    bool same = ra && rb && !strcmp(ra, rb);
    if (!same && stat(a, &sa) == 0 && stat(b, &sb) == 0) /* e.g. a bind mount */
        same = sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    free(ra);
    free(rb);
    return same;
}

bool cvt_run_stopped(struct cvt_run_state *R) { return atomic_load(&R->failed) || g_signal; }

void cvt_run_fail(struct cvt_run_state *R, enum cvt_err e)
{
    pthread_mutex_lock(&R->lock);
    if (!atomic_load(&R->failed)) {
        R->err = e;
        atomic_store(&R->failed, 1);
    }
    pthread_mutex_unlock(&R->lock);
}

/* --- progress bar -------------------------------------------------------------------------- */

static void fmt_size(char *buf, size_t n, double b)
{
    if (b >= 1024.0 * 1024 * 1024)
        snprintf(buf, n, "%.2f GiB", b / (1024.0 * 1024 * 1024));
    else
        snprintf(buf, n, "%.1f MiB", b / (1024.0 * 1024));
}

static void progress_draw(struct cvt_run_state *R, bool final)
{
    double t = qs_now_s(), el = t - R->t0;
    uint64_t done = atomic_load(&R->done_bytes);
    double frac = R->total_bytes ? (double)done / (double)R->total_bytes : 1.0;
    double rate = el > 0 ? (double)done / el : 0;
    double eta = rate > 0 ? (double)(R->total_bytes - done) / rate : 0;
    char a[32], b[32], c[32];
    int width = 30, fill = (int)(frac * width);
    char bar[64];
    for (int i = 0; i < width; i++)
        bar[i] = i < fill ? '=' : (i == fill ? '>' : ' ');
    bar[width] = '\0';
    fmt_size(a, sizeof(a), (double)done);
    fmt_size(b, sizeof(b), (double)R->total_bytes);
    fmt_size(c, sizeof(c), rate);
    fprintf(stderr, "\r[%s] %3d%% %s / %s  %s/s  ETA %d:%02d ", bar, (int)(frac * 100), a, b, c,
            (int)eta / 60, (int)eta % 60);
    if (final)
        fputc('\n', stderr);
    fflush(stderr);
}

static void progress_add(struct cvt_run_state *R, uint64_t bytes)
{
    atomic_fetch_add(&R->done_bytes, bytes);
    if (!R->bar || pthread_mutex_trylock(&R->bar_lock))
        return;
    double t = qs_now_s();
    if (t - R->last_draw >= 0.2) {
        R->last_draw = t;
        progress_draw(R, false);
    }
    pthread_mutex_unlock(&R->bar_lock);
}

enum cvt_err cvt_run_put_part(struct cvt_run_state *R, int rank, uint32_t index, uint64_t off,
                              const void *data, size_t n)
{
    enum fmt_err fe = fmt_writer_put_tensor_part(R->w[rank], index, off, data, n);
    if (fe)
        return fe == FMT_ERR_NOMEM ? CVT_ERR_NOMEM : CVT_ERR_IO; /* reported by the writer */
    progress_add(R, n);
    return CVT_ERR_NONE;
}


/* --- jobs ------------------------------------------------------------------------------------ */

static uint64_t job_bytes(const struct cvt_plan *p, const struct cvt_job *j)
{
    return p->ranks[j->rank].outs[j->out].bytes;
}

/* Job order: by output bytes, descending; ties keep their order. An insertion sort (stable,
 * unlike qsort) over at most a few thousand jobs. */
static void sort_jobs(struct cvt_job *jobs, size_t n, const struct cvt_plan *p)
{
    for (size_t i = 1; i < n; i++) {
        struct cvt_job x = jobs[i];
        size_t k = i;
        while (k > 0 && job_bytes(p, &jobs[k - 1]) < job_bytes(p, &x)) {
            jobs[k] = jobs[k - 1];
            k--;
        }
        jobs[k] = x;
    }
}

/* --- entry point --------------------------------------------------------------------------- */

static enum cvt_err names_of(const struct cvt_source *src, const char ***out, int *n)
{
    size_t nt = cvt_source_n_tensors(src);
    const char **v = malloc((nt ? nt : 1) * sizeof(*v));
    if (!v)
        return CVT_ERR_NOMEM;
    for (size_t i = 0; i < nt; i++)
        v[i] = cvt_source_tensor(src, i)->name;
    *out = v;
    *n = (int)nt;
    return CVT_ERR_NONE;
}

/* Whether `name` ends in `sfx`; *len receives the length of the part before it. */
static bool ends_with(const char *name, const char *sfx, size_t *len)
{
    size_t n = strlen(name), m = strlen(sfx);
    *len = n >= m ? n - m : 0;
    return n > m && !strcmp(name + n - m, sfx);
}

/* The quantized linears of the source whose g_idx is act-order (cvt_awq_gidx validates every
 * g_idx here, before planning), and the compressed-tensors "ignore" cross-check: a module the
 * list ignores must not be stored quantized. *out holds module prefixes (free each and the
 * array). */
static enum cvt_err act_order_of(const struct cvt_source *src, const struct cvt_hf_config *cfg,
                                 char ***out, int *n)
{
    size_t nt = cvt_source_n_tensors(src), len;
    char **v = calloc(nt ? nt : 1, sizeof(*v));
    enum cvt_err e = CVT_ERR_NONE;
    int k = 0;
    if (!v)
        return CVT_ERR_NOMEM;
    for (size_t i = 0; i < nt && !e; i++) {
        const struct cvt_src_tensor *t = cvt_source_tensor(src, i);
        char mod[400];
        if (cfg->quant.method == CVT_QM_CT && ends_with(t->name, ".weight_packed", &len) &&
            len < sizeof(mod)) {
            snprintf(mod, sizeof(mod), "%.*s", (int)len, t->name);
            if (cvt_config_ignores_module(cfg, mod)) {
                qs_log_error("cvt_run", "tensor %s: module %s is stored quantized but the "
                             "compressed-tensors \"ignore\" list names it (it should be float): "
                             "metadata and tensors disagree", t->name, mod);
                e = CVT_ERR_CONFIG;
            }
        }
        if (e || cfg->quant.method == CVT_QM_AWQ || len >= sizeof(mod) ||
            !(ends_with(t->name, ".g_idx", &len) || ends_with(t->name, ".weight_g_idx", &len)))
            continue;
        snprintf(mod, sizeof(mod), "%.*s", (int)len, t->name);
        bool act = false;
        if ((e = cvt_awq_gidx(src, cfg, mod, t->n_dims == 1 ? t->shape[0] : 0, &act, NULL)))
            break;
        if (act && !(v[k++] = strdup(mod)))
            e = CVT_ERR_NOMEM;
    }
    if (e) {
        for (int i = 0; i < k; i++)
            free(v[i]);
        free(v);
        return e;
    }
    *out = v;
    *n = k;
    return CVT_ERR_NONE;
}

/* Does dir hold any weight file (*.safetensors, *.bin, *.pt)? */
static bool has_weight_files(const char *dir)
{
    static const char *const sfx[] = {".safetensors", ".bin", ".pt"};
    DIR *d = opendir(dir);
    struct dirent *de;
    bool found = false;
    if (!d)
        return true; /* let cvt_source_open report the problem */
    while (!found && (de = readdir(d))) {
        size_t n = strlen(de->d_name);
        for (size_t i = 0; i < sizeof(sfx) / sizeof(sfx[0]) && !found; i++) {
            size_t m = strlen(sfx[i]);
            found = n > m && !strcmp(de->d_name + n - m, sfx[i]);
        }
    }
    closedir(d);
    return found;
}

/* --dry-run of a directory with config files but no weights (a config checked before a large
 * download, or tests/data/real-configs/): plan from the config alone (every decoder linear
 * quantized unless modules_to_not_convert names it) and print it. */
static enum cvt_err dry_run_config_only(const struct cvt_opts *o)
{
    static const char *const files[4] = {"config.json", "quant_config.json",
                                          "quantize_config.json", "generation_config.json"};
    char *text[4] = {NULL, NULL, NULL, NULL};
    size_t len[4] = {0, 0, 0, 0};
    struct cvt_hf_config cfg;
    struct cvt_dims d;
    struct cvt_plan *plan = NULL;
    enum cvt_err e = CVT_ERR_NONE;
    memset(&cfg, 0, sizeof(cfg));
    for (int i = 0; i < 4; i++) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", o->model_dir, files[i]);
        FILE *f = fopen(path, "rb");
        if (!f)
            continue;
        if (fseek(f, 0, SEEK_END) == 0) {
            long n = ftell(f);
            if (n >= 0 && n < (16 << 20) && fseek(f, 0, SEEK_SET) == 0 &&
                (text[i] = malloc((size_t)n + 1)) && fread(text[i], 1, (size_t)n, f) == (size_t)n)
                len[i] = (size_t)n;
        }
        fclose(f);
    }
    if (!text[0]) {
        qs_log_error(__func__, "%s: no config.json (and no weight files)", o->model_dir);
        e = CVT_ERR_IO;
        goto out;
    }
    if ((e = cvt_config_parse(o->model_dir, text[0], len[0], text[1], len[1], text[2], len[2],
                              text[3], len[3], &cfg)) ||
        (e = cvt_dims_from_hf(&cfg, &d)) || (e = cvt_plan_build(&d, NULL, o->tp, &plan)))
        goto out;
    qs_log_info("%s: no weight files: planning from the config alone (%s, quant config from %s)",
                o->model_dir, cfg.arch->name, cvt_qcfg_file_str(cfg.quant.from));
    cvt_plan_print(plan, stdout);
out:
    cvt_plan_free(plan);
    cvt_config_free(&cfg);
    for (int i = 0; i < 4; i++)
        free(text[i]);
    return e;
}

static void run_free(struct cvt_run_state *R)
{
    if (R->w)
        for (int r = 0; r < (R->plan ? R->plan->tp : 0); r++)
            fmt_writer_abort(R->w[r]);
    free(R->w);
    if (R->idx)
        for (int r = 0; r < (R->plan ? R->plan->tp : 0); r++)
            free(R->idx[r]);
    free(R->idx);
    free(R->src_t);
    free(R->jobs);
    cvt_plan_free(R->plan);
    cvt_source_close(R->src);
}

/* Step 1: open the source, check its tokenizer, plan, validate every source the plan reads. */
static enum cvt_err run_plan(struct cvt_run_state *R)
{
    const struct cvt_opts *o = R->o;
    const char **names = NULL;
    char **act = NULL;
    int n_names = 0, n_act = 0;
    enum cvt_err e;
    if ((e = cvt_source_open(o->model_dir, &R->src)))
        return e;
    hook_signal_point(R->hooks, "opened");
    if (interrupted_early(&e))
        return e;
    R->cfg = cvt_source_config(R->src);
    struct cvt_dims d;
    if ((e = cvt_tok_check(R->src, R->cfg)) || (e = cvt_dims_from_hf(R->cfg, &d)) ||
        (e = names_of(R->src, &names, &n_names)) ||
        (e = act_order_of(R->src, R->cfg, &act, &n_act))) {
        free(names);
        return e;
    }
    struct cvt_name_list nl = {n_names, names, n_act, (const char *const *)act};
    e = cvt_plan_build(&d, &nl, o->tp, &R->plan);
    free(names);
    for (int i = 0; i < n_act; i++)
        free(act[i]);
    free(act);
    if (e || (e = cvt_write_validate_sources(R)))
        return e;
    if (interrupted_early(&e))
        return e;
    qs_log_info("%s: %s%s variant %s, container %s, quant config from %s; %s, %" PRId64
                " layers, tp %d",
                o->model_dir, cvt_qmethod_str(R->cfg->quant.method),
                R->cfg->quant.zero_point ? "" : " symmetric", R->variant,
                cvt_container_str(cvt_source_container(R->src)),
                cvt_qcfg_file_str(R->cfg->quant.from), R->cfg->arch->name,
                R->cfg->num_hidden_layers, o->tp);
    return CVT_ERR_NONE;
}

/* Step 3: one writer per rank in the staging directory; the jobs, largest first. */
static enum cvt_err run_open_writers(struct cvt_run_state *R)
{
    const int tp = R->plan->tp;
    enum cvt_err e;
    R->w = calloc((size_t)tp, sizeof(*R->w));
    R->idx = calloc((size_t)tp, sizeof(*R->idx));
    if (!R->w || !R->idx)
        return CVT_ERR_NOMEM;
    for (int r = 0; r < tp; r++)
        if (!(R->idx[r] = calloc((size_t)R->plan->ranks[r].n_outs + 1, sizeof(uint32_t))))
            return CVT_ERR_NOMEM;
    uint8_t id[16];
    cvt_write_model_id(R, id);
    for (int r = 0; r < tp; r++)
        if ((e = cvt_write_open(R, r, id)))
            return e;
    hook_signal_point(R->hooks, "writing");

    /* jobs: output j of every rank, in plan order (ranks of one source close in time) */
    for (int r = 0; r < tp; r++)
        R->n_jobs += (size_t)R->plan->ranks[r].n_outs;
    if (!(R->jobs = malloc((R->n_jobs ? R->n_jobs : 1) * sizeof(*R->jobs))))
        return CVT_ERR_NOMEM;
    size_t nj = 0;
    for (int j = 0;; j++) {
        bool any = false;
        for (int r = 0; r < tp; r++)
            if (j < R->plan->ranks[r].n_outs) {
                R->jobs[nj].rank = r;
                R->jobs[nj++].out = j;
                any = true;
            }
        if (!any)
            break;
    }
    /* largest outputs first (LPT: a tensor is written in order by one worker, so a large one
     * started last - lm_head is the last output of the plan - would leave the other workers
     * idle at the end); the sort is stable, so the ranks of one output stay together */
    sort_jobs(R->jobs, R->n_jobs, R->plan);
    return CVT_ERR_NONE;
}

/* Step 4: the workers over the jobs, with the progress bar. */
static enum cvt_err run_workers(struct cvt_run_state *R)
{
    const struct cvt_opts *o = R->o;
    int threads = o->threads > 0 ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads < 1)
        threads = 1;
    if ((size_t)threads > R->n_jobs)
        threads = (int)(R->n_jobs ? R->n_jobs : 1);
    R->chunk_bytes =
        (R->hooks->chunk_bytes ? R->hooks->chunk_bytes : CVT_CHUNK_BUDGET) / (uint64_t)threads;
    /* Chunk buffers (ours and the decoder's) are MiB-sized and short-lived. glibc raises its mmap
     * threshold after the first such free and then serves them from per-thread arenas that keep
     * their peak; a fixed threshold sends them back to the kernel on free, so peak RSS stays at
     * what is live (measured: 420 -> see docs/BENCHMARKS.md, 16 threads on a 7B checkpoint). */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    for (int r = 0; r < R->plan->tp; r++)
        R->total_bytes += R->plan->ranks[r].data_bytes;
    R->bar = !o->quiet && isatty(STDERR_FILENO);
    R->t0 = qs_now_s();
    pthread_t *th = calloc((size_t)threads, sizeof(*th));
    int started = 0;
    if (!th)
        return CVT_ERR_NOMEM;
    for (; started < threads; started++)
        if (pthread_create(&th[started], NULL, cvt_job_worker, R)) {
            qs_log_error("cvt_run", "cannot start worker thread %d of %d", started + 1, threads);
            cvt_run_fail(R, CVT_ERR_NOMEM);
            break;
        }
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    free(th);
    if (R->bar)
        progress_draw(R, true);
    if (atomic_load(&R->failed))
        return R->err;
    return g_signal ? CVT_ERR_INTERRUPTED : CVT_ERR_NONE;
}

/* Steps 5 and 6: finish every writer, the manifest, then commit into OUT_DIR. */
static enum cvt_err run_finish(struct cvt_run_state *R)
{
    const int tp = R->plan->tp;
    enum cvt_err e;
    for (int r = 0; r < tp; r++) {
        enum fmt_err fe = fmt_writer_finish(R->w[r]);
        R->w[r] = NULL;
        if (fe)
            return CVT_ERR_IO;
    }
    if (fmt_manifest_write(R->stage, (uint32_t)tp))
        return CVT_ERR_IO;
    hook_signal_point(R->hooks, "written");
    if (g_signal) /* the last point where the user can still get the earlier state back */
        return CVT_ERR_INTERRUPTED;
    if ((e = cvt_outdir_commit(R->o->out_dir, R->stage, tp, R->hooks->commit_fail)))
        return e;
    if (g_signal)
        qs_log_warn("signal %d arrived after the new conversion was in place in %s: kept it",
                    (int)g_signal, R->o->out_dir);
    return CVT_ERR_NONE;
}

enum cvt_err cvt_run(const struct cvt_opts *o)
{
    static const struct cvt_hooks no_hooks;
    struct cvt_run_state R;
    struct cvt_outdir od;
    struct sigaction old_sa[3];
    enum cvt_err e;
    memset(&R, 0, sizeof(R));
    od.n_made = 0;
    od.lock_fd = -1;
    R.o = o;
    R.hooks = o->hooks ? o->hooks : &no_hooks;
    pthread_mutex_init(&R.lock, NULL);
    pthread_mutex_init(&R.bar_lock, NULL);
    /* first, so a signal at any point is reported and answered with CVT_ERR_INTERRUPTED */
    signals_catch(old_sa);

    if (o->out_dir && same_dir(o->model_dir, o->out_dir)) {
        qs_log_error(__func__, "output directory %s: is the model directory %s; the rank files "
                               "go to a directory of their own",
                     o->out_dir, o->model_dir);
        e = CVT_ERR_SAME_DIR;
        goto out;
    }
    if (o->dry_run && !has_weight_files(o->model_dir)) {
        if (!(e = dry_run_config_only(o)))
            interrupted_early(&e);
        goto out;
    }
    if ((e = run_plan(&R)))
        goto out;
    if (o->dry_run) {
        cvt_plan_print(R.plan, stdout);
        interrupted_early(&e);
        goto out;
    }
    /* a failure from here on removes what this run made (cvt_outdir_cleanup) */
    if ((e = cvt_outdir_prepare(o, &od, R.stage)) || (e = run_open_writers(&R)) ||
        (e = run_workers(&R)) || (e = run_finish(&R)))
        goto out_fail;
    cvt_outdir_unlock(&od);
    double el = qs_now_s() - R.t0;
    qs_log_info("wrote %d rank file(s) and %s to %s: %.1f MiB of tensors in %.2f s (%.0f MiB/s "
                "of input)",
                R.plan->tp, FMT_MANIFEST_NAME, o->out_dir, (double)R.total_bytes / (1 << 20), el,
                el > 0 ? (double)cvt_source_total_bytes(R.src) / (1 << 20) / el : 0.0);
    goto out;

out_fail:
    if (e == CVT_ERR_INTERRUPTED)
        qs_log_error(__func__, "interrupted by signal %d: removing the partial output; %s is as "
                               "it was before",
                     (int)g_signal, o->out_dir);
    if (R.w)
        for (int r = 0; r < R.plan->tp; r++) {
            fmt_writer_abort(R.w[r]);
            R.w[r] = NULL;
        }
    cvt_outdir_cleanup(R.stage, &od);
out:
    signals_restore(old_sa);
    run_free(&R);
    pthread_mutex_destroy(&R.lock);
    pthread_mutex_destroy(&R.bar_lock);
    return e;
}
