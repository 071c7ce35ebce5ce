/*
 * rt_exec.c - the executor (rt.h): every tensor-parallel rank of this process, rank 0 on the
 * caller's thread and rank r > 0 on a thread of its own, each a rank-local rt_model with its KV
 * cache, joined by one communicator (rt_backend.h, rt_comm_local_create).
 *
 * Rank 0 leads: it checks each batch, broadcasts it to the other ranks (a fixed header, then the
 * token ids, positions, slots and out rows), and runs its own part; the followers loop on the
 * broadcasts and run theirs. The ranks meet in the collectives of the forward pass, so the
 * followers never run ahead by more than a step. A rank that fails aborts the communicator: the
 * others return RT_ERR_PEER from their next collective and the executor is dead (every later
 * call fails; rt_exec_free still releases everything).
 *
 * One process per rank (mpirun, rt_mpi.h; docs/DESIGN.md section 12): the same executor drives
 * only this process's rank through the MPI communicator. Rank 0's rt_exec_open sends the path
 * and its options to the other processes, which wait in rt_exec_follow: every rank checks its
 * own file against rank 0's manifest and config before loading, then opens its rank; rank 0
 * collects every verdict and broadcasts go or quit; then the followers loop on the steps as the
 * threads do. rt_exec_mpi_end (main, rank 0) ends the followers' wait with rank 0's exit code.
 *
 * Test: ./build/test_model (TP-N equal to TP-1, batches vs sequences one at a time).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qs_log.h"
#include "rt_blocks.h"
#include "rt_model_int.h"
#include "rt_mpi.h"

enum cmd_kind { CMD_FORWARD = 1, CMD_NOOP = 2, CMD_QUIT = 3 };

/* What rank 0 broadcasts before each step (then, for CMD_FORWARD, the arrays: tokens, positions,
 * slots when has_seq, out rows, the block tables [n_tab][tab_stride], the copies [2 n_copy]). */
struct cmd_hdr {
    int32_t kind;
    int32_t n_tokens, n_out, out_mode, has_seq;
    int32_t n_tab, tab_stride, n_copy;
};

/* Words of a step's payload after the header. */
static size_t payload_words(const struct cmd_hdr *h)
{
    return (size_t)h->n_tokens * (h->has_seq ? 3 : 2) + (size_t)h->n_out +
           (size_t)h->n_tab * (size_t)h->tab_stride + 2 * (size_t)h->n_copy;
}

struct rank_slot {
    struct rt_exec *e;
    int rank;
    pthread_t th;
    bool started;
    struct rt_model *m;
    struct rt_kv *kv;
    enum rt_err open_err;
    int32_t *buf; /* followers: the payload of the step */
    size_t buf_cap;
};

struct rt_exec {
    int world;
    char *path;
    struct rt_opts opts;          /* resolved defaults; n_threads per rank */
    rt_backend_factory factory;   /* NULL: from opts */
    void *user;
    struct rt_comm *comm[FMT_MAX_WORLD_SIZE]; /* endpoints; NULL at world size 1 */
    struct rank_slot *slots;      /* [world]; [1] in MPI mode */
    bool mpi;                     /* one rank per process: slots[0] is rank `me` */
    int me;
    bool joined;                  /* MPI: every rank opened (the followers follow the steps) */
    bool dead;                    /* a step failed after it was broadcast */
    int32_t *scratch;             /* rank 0: the payload of one step */
    size_t scratch_cap;
    int32_t *seqbuf;              /* rank 0: positions, slots, out rows of a one-sequence batch */
    size_t seqbuf_cap;
    struct rt_blocks *blocks;     /* rank 0: the block tables of the paged KV cache */
    int *lens;                    /* rank 0: [n_seqs] positions each slot holds (check_batch) */
    int n_seqs, n_ctx, block_size;
    int32_t *copy;                /* rank 0: copies-on-write of one step */
    size_t copy_cap;
};

/* Grow a host int32 buffer to n entries (no shrink). */
static enum rt_err grow_i32(int32_t **buf, size_t *cap, size_t n)
{
    if (*cap >= n)
        return RT_ERR_NONE;
    size_t want = n < 256 ? 256 : n + n / 2;
    int32_t *p = realloc(*buf, want * sizeof(int32_t));
    if (!p) {
        qs_log_error(__func__, "out of host memory for %zu values", n);
        return RT_ERR_NOMEM;
    }
    *buf = p;
    *cap = want;
    return RT_ERR_NONE;
}

// --- one rank's life -------------------------------------------------------------------------------

/* Blocks of this rank's pool (rt_opts: kv_blocks, kv_cache_bytes, kv_mem_fraction of the free
 * device memory, else every slot at n_ctx), plus the reserved block 0. */
static int pool_blocks(const struct rt_exec *e, const struct rt_model *m)
{
    const struct rt_opts *o = &e->opts;
    const int bs = m->block_size, per_seq = (m->n_ctx + bs - 1) / bs;
    const double block = (double)rt_kv_block_bytes(m, bs);
    double n = (double)o->n_seqs * per_seq + 1;
    const char *why = "--max-num-seqs x the context";
    size_t free_b = 0, total_b = 0;
    if (o->kv_blocks > 0) {
        n = o->kv_blocks;
        why = "as asked";
    } else if (o->kv_cache_bytes > 0) {
        n = o->kv_cache_bytes / block;
        why = "--kv-cache-gb";
    } else if (o->kv_mem_fraction > 0 && m->be.ops->mem_info &&
               m->be.ops->mem_info(m->be.ctx, &free_b, &total_b) == RT_ERR_NONE) {
        n = o->kv_mem_fraction * (double)free_b / block;
        why = "share of the free GPU memory";
    }
    if (n > 1 << 30)
        n = 1 << 30;
    if (m->rank == 0)
        qs_log_info("KV cache: %d blocks of %d tokens (%.0f tokens, %.2f GiB per rank; %s)",
                    (int)n, bs, n * bs, n * block / (1 << 30), why);
    return (int)n;
}

static enum rt_err open_rank(struct rank_slot *s)
{
    struct rt_exec *e = s->e;
    /* world size 1 under mpirun: the model runs as in one process (no collective is needed, and
     * a communicator would change where the fp32 sums are rounded); the job's handshake and its
     * end still go through MPI */
    struct rt_comm *comm = e->world == 1 ? NULL : e->mpi ? e->comm[0] : e->comm[s->rank];
    struct rt_backend be = {NULL, NULL};
    if (e->factory)
        RT_TRY(e->factory(e->user, s->rank, e->world, comm, &be));
    RT_TRY(rt_model_open(e->path, s->rank, &e->opts, comm, be.ops ? &be : NULL, &s->m));
    return rt_kv_create(s->m, pool_blocks(e, s->m), s->m->block_size, &s->kv);
}

/* Receive one step from rank 0 and run it; false when the loop ends (quit or failure). */
static bool follow_step(struct rank_slot *s, struct rt_comm *comm)
{
    struct cmd_hdr h; /* the wait for the next step has no deadline (rt_backend.h) */
    if ((comm->ops->broadcast_wait ? comm->ops->broadcast_wait : comm->ops->broadcast)(
            comm, &h, sizeof(h)))
        return false;
    if (h.kind == CMD_QUIT)
        return false;
    if (h.kind == CMD_NOOP)
        return true;
    const size_t n = payload_words(&h);
    if (grow_i32(&s->buf, &s->buf_cap, n) ||
        comm->ops->broadcast(comm, s->buf, n * sizeof(int32_t))) {
        comm->ops->abort(comm);
        return false;
    }
    const int32_t *p = s->buf;
    const size_t nb = (size_t)h.n_tokens * (h.has_seq ? 3 : 2);
    const struct rt_batch b = {h.n_tokens, p, p + h.n_tokens, h.has_seq ? p + 2 * h.n_tokens : NULL,
                               h.n_out, p + nb};
    const int32_t *tab = p + nb + h.n_out;
    const struct rt_kv_step ks = {tab, h.tab_stride, h.n_copy,
                                  tab + (size_t)h.n_tab * (size_t)h.tab_stride};
    if (rt_model_forward(s->m, s->kv, &b, &ks, (enum rt_out)h.out_mode, NULL, NULL, NULL)) {
        comm->ops->abort(comm);
        return false;
    }
    return true;
}

static void *follower_main(void *arg)
{
    struct rank_slot *s = arg;
    struct rt_exec *e = s->e;
    struct rt_comm *comm = e->comm[s->rank];
    s->open_err = open_rank(s);
    /* meet rank 0 once every rank has tried to open; then its verdict (CMD_QUIT when any rank
     * failed) is the first step */
    struct cmd_hdr sync;
    if (!comm->ops->broadcast(comm, &sync, sizeof(sync)))
        while (follow_step(s, comm))
            ;
    rt_kv_free(s->kv);
    rt_model_free(s->m);
    s->kv = NULL;
    s->m = NULL;
    free(s->buf);
    return NULL;
}

// --- open / free -----------------------------------------------------------------------------------

/* World size of the model at `path` (a directory's manifest, or 1 for a rank file: its own
 * header is checked by rt_model_open). */
static enum rt_err peek_world(const char *path, int *world)
{
    struct stat st;
    *world = 1;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return RT_ERR_NONE; /* rt_model_open reports it */
    struct fmt_manifest *mf = NULL;
    enum fmt_err fe = fmt_manifest_load(path, &mf);
    if (fe != FMT_ERR_NONE)
        return fe == FMT_ERR_NOMEM ? RT_ERR_NOMEM : fe == FMT_ERR_IO ? RT_ERR_IO : RT_ERR_FORMAT;
    *world = (int)mf->world_size;
    fmt_manifest_free(mf);
    if (*world < 1 || *world > FMT_MAX_WORLD_SIZE) {
        qs_log_error(__func__, "%s: world size %d", path, *world);
        return RT_ERR_FORMAT;
    }
    return RT_ERR_NONE;
}

static struct rt_opts resolve_opts(const struct rt_opts *opts, int world)
{
    struct rt_opts o = opts ? *opts : rt_opts_default();
    if (world > 1) { /* the ranks share the cores */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int total = o.n_threads > 0 ? o.n_threads : (int)(cores > 0 ? cores : 1);
        o.n_threads = total / world > 0 ? total / world : 1;
    }
    if (o.n_seqs < 1)
        o.n_seqs = 1;
    return o;
}

/* Every rank's open result and config agreement, decided by rank 0 once all have tried. */
static enum rt_err open_verdict(struct rt_exec *e)
{
    for (int r = 0; r < e->world; r++)
        if (e->slots[r].open_err)
            return e->slots[r].open_err;
    const struct rt_model *m0 = e->slots[0].m;
    for (int r = 1; r < e->world; r++) {
        const struct rt_model *mr = e->slots[r].m;
        if (!rt_config_same(&m0->cfg, fmt_shard_path(m0->shard), &mr->cfg,
                            fmt_shard_path(mr->shard)))
            return RT_ERR_RANK_MISMATCH;
    }
    return RT_ERR_NONE;
}

static enum rt_err start_followers(struct rt_exec *e)
{
    RT_TRY(rt_comm_local_create(e->world, e->opts.device == RT_DEVICE_AUTO
                                           ? (rt_cuda_available() ? RT_DEVICE_CUDA : RT_DEVICE_CPU)
                                           : e->opts.device,
                             e->opts.cuda_device, e->opts.p2p_allreduce != 0, e->comm));
    for (int r = 1; r < e->world; r++) {
        struct rank_slot *s = &e->slots[r];
        if (pthread_create(&s->th, NULL, follower_main, s) != 0) {
            qs_log_error(__func__, "cannot start the thread of rank %d", r);
            return RT_ERR_THREAD;
        }
        s->started = true;
    }
    return RT_ERR_NONE;
}

/* The smallest pool of this process's ranks (all open). */
static int min_blocks(const struct rt_exec *e)
{
    int n_blocks = rt_kv_n_blocks(e->slots[0].kv);
    for (int r = 1; r < e->world && !e->mpi; r++)
        if (rt_kv_n_blocks(e->slots[r].kv) < n_blocks)
            n_blocks = rt_kv_n_blocks(e->slots[r].kv);
    return n_blocks;
}

/* Rank 0's block manager over n_blocks blocks (the smallest pool of the ranks). */
static enum rt_err open_blocks(struct rt_exec *e, int n_blocks)
{
    const struct rt_model *m0 = e->slots[0].m;
    e->n_seqs = e->opts.n_seqs;
    e->n_ctx = m0->n_ctx;
    e->block_size = m0->block_size;
    const int per_seq = m0->tab_stride;
    if (n_blocks - 1 < per_seq) {
        qs_log_error(__func__, "the KV cache holds %d blocks of %d tokens (%d tokens), less than "
                     "one sequence of the context of %d tokens: give it more memory "
                     "(--kv-cache-gb) or ask for a shorter context (--ctx)", n_blocks - 1,
                     e->block_size, (n_blocks - 1) * e->block_size, e->n_ctx);
        return RT_ERR_ARG;
    }
    e->lens = calloc((size_t)e->n_seqs, sizeof(int));
    if (!e->lens) {
        qs_log_error(__func__, "out of memory");
        return RT_ERR_NOMEM;
    }
    return rt_blocks_create(n_blocks, e->block_size, e->n_seqs, per_seq,
                            !e->opts.no_prefix_cache, &e->blocks);
}

static enum rt_err exec_open(struct rt_exec *e)
{
    if (e->world == 1) {
        RT_TRY(open_rank(&e->slots[0]));
        return open_blocks(e, min_blocks(e));
    }
    enum rt_err err = start_followers(e);
    if (err) { /* the threads started so far leave through the failed communicator */
        e->dead = true;
        if (e->comm[0])
            e->comm[0]->ops->abort(e->comm[0]);
        return err;
    }
    struct rt_comm *c = e->comm[0];
    e->slots[0].open_err = open_rank(&e->slots[0]);
    struct cmd_hdr h = {0};
    err = c->ops->broadcast(c, &h, sizeof(h)); /* every rank has tried to open */
    if (!err)
        err = open_verdict(e);
    if (!err)
        err = open_blocks(e, min_blocks(e));
    /* the verdict: quit, or a no-op step after which the followers wait for the first batch */
    h = (struct cmd_hdr){.kind = err ? CMD_QUIT : CMD_NOOP};
    if (c->ops->broadcast(c, &h, sizeof(h)) && !err)
        err = RT_ERR_PEER;
    if (err)
        e->dead = true;
    return err;
}

// --- one process per rank (MPI, rt_mpi.h) ------------------------------------------------------

enum { HELLO_OPEN = 1, HELLO_END = 2 };

/* What rank 0 sends the waiting followers: a model to open (then path_len bytes of path and
 * opts_size bytes of struct rt_opts), or the end of the job with rank 0's exit code. */
struct hello {
    int32_t kind, code, log_level;
    uint32_t path_len, opts_size;
};

/* Rank 0's conversion, sent before any rank loads (then [world][2] sizes and digests of the
 * manifest's ranks and cfg_len bytes of rank 0's config JSON, when ok). */
struct ident {
    int32_t ok; /* rank 0 could read its manifest and its own file */
    uint8_t model_id[16];
    uint32_t world, cfg_len;
};

/* One rank's answer in a phase of the handshake, gathered on rank 0. */
struct answer {
    int32_t err;      /* enum rt_err */
    int32_t n_blocks; /* its KV-cache pool (open phase) */
    char file[248];   /* the rank file it checked or opened */
};

static enum rt_err rt_of_fmt(enum fmt_err fe)
{
    return fe == FMT_ERR_NONE    ? RT_ERR_NONE
           : fe == FMT_ERR_IO    ? RT_ERR_IO
           : fe == FMT_ERR_NOMEM ? RT_ERR_NOMEM
           : fe == FMT_ERR_RANK_MISMATCH || fe == FMT_ERR_MISSING_RANK || fe == FMT_ERR_DIGEST ||
                   fe == FMT_ERR_RANK
               ? RT_ERR_RANK_MISMATCH
               : RT_ERR_FORMAT;
}

/* This rank's file in dir checked against rank 0's conversion (id, sd [world][2] sizes and
 * digests, cfg0 its config JSON [cfg0_len]) without loading it: the node's manifest is rank 0's,
 * the file is the manifest's (fmt_manifest_open_rank: size, digest, model id, rank, world) and
 * its config is rank 0's (rt_config_same). */
static enum rt_err check_own_file(const char *dir, int me, const struct ident *id,
                                  const uint64_t *sd, const char *cfg0, const char *file)
{
    struct fmt_manifest *mf = NULL;
    struct fmt_shard *sh = NULL;
    enum rt_err err = rt_of_fmt(fmt_manifest_load(dir, &mf));
    if (!err && (memcmp(mf->model_id, id->model_id, 16) || mf->world_size != id->world ||
                 mf->ranks[me].size != sd[2 * me] || mf->ranks[me].digest != sd[2 * me + 1])) {
        qs_log_error(__func__, "rank %d: %s/manifest.json on this node does not describe rank 0's "
                     "conversion (another model, conversion or TP size): copy rank 0's "
                     "manifest.json and this rank's file here", me, dir);
        err = RT_ERR_RANK_MISMATCH;
    }
    if (!err)
        err = rt_of_fmt(fmt_manifest_open_rank(dir, (uint32_t)me, &sh));
    const char *json = NULL;
    size_t len = 0;
    struct rt_config c0, cr;
    if (!err)
        err = rt_of_fmt(fmt_shard_config_json(sh, &json, &len));
    if (!err)
        err = rt_config_parse(cfg0, id->cfg_len, "rank 0's config", &c0);
    if (!err)
        err = rt_config_parse(json, len, file, &cr);
    if (!err && (!rt_config_same(&c0, "rank 0's file", &cr, file) || cr.rank != me)) {
        qs_log_error(__func__, "rank %d: %s is not rank %d of rank 0's model", me, file, me);
        err = RT_ERR_RANK_MISMATCH;
    }
    fmt_shard_close(sh);
    fmt_manifest_free(mf);
    return err;
}

/* Rank 0: its conversion's identity into *id, sd and *cfg0 (malloc'd); id->ok = 0 when its own
 * manifest or file cannot be read (reported). */
static void own_ident(const char *dir, struct ident *id, uint64_t *sd, char **cfg0)
{
    struct fmt_manifest *mf = NULL;
    struct fmt_shard *sh = NULL;
    const char *json = NULL;
    size_t len = 0;
    *cfg0 = NULL;
    if (rt_of_fmt(fmt_manifest_load(dir, &mf)) || (int)mf->world_size != rt_mpi_world() ||
        rt_of_fmt(fmt_manifest_open_rank(dir, 0, &sh)) ||
        rt_of_fmt(fmt_shard_config_json(sh, &json, &len)) || !(*cfg0 = malloc(len + 1))) {
        id->ok = 0;
    } else {
        id->ok = 1;
        memcpy(id->model_id, mf->model_id, 16);
        id->world = mf->world_size;
        id->cfg_len = (uint32_t)len;
        memcpy(*cfg0, json, len);
        for (uint32_t r = 0; r < mf->world_size; r++) {
            sd[2 * r] = mf->ranks[r].size;
            sd[2 * r + 1] = mf->ranks[r].digest;
        }
    }
    fmt_shard_close(sh);
    fmt_manifest_free(mf);
}

/* Every rank's answer gathered on rank 0, which reports each failure (naming the rank and its
 * file) and broadcasts the verdict: the first failure, or (open phase) its block manager's. */
static enum rt_err mpi_verdict(struct rt_exec *e, const struct answer *mine, const char *phase,
                               bool open_phase)
{
    struct answer *all = NULL;
    if (e->me == 0 && !(all = calloc((size_t)e->world, sizeof(*all))))
        rt_mpi_abort("out of memory for the ranks' answers");
    int32_t v = RT_ERR_NONE;
    enum rt_err err = rt_mpi_gather(mine, sizeof(*mine), all, phase);
    if (!err && e->me == 0) {
        int n_blocks = INT32_MAX;
        for (int r = 0; r < e->world; r++) {
            if (all[r].err) {
                qs_log_error(__func__, "rank %d cannot %s %s: %s", r, phase, all[r].file,
                             rt_err_str((enum rt_err)all[r].err));
                if (!v)
                    v = all[r].err;
            }
            if (all[r].n_blocks < n_blocks)
                n_blocks = all[r].n_blocks;
        }
        if (!v && open_phase)
            v = open_blocks(e, n_blocks);
    }
    free(all);
    if (!err)
        err = rt_mpi_bcast(&v, sizeof(v), true, phase);
    return err ? err : (enum rt_err)v;
}

/* Both sides: the communicator, then the checks of every rank's file, then the open. */
static enum rt_err mpi_join(struct rt_exec *e)
{
    const int gpu = e->opts.cuda_device + rt_mpi_local_rank();
    if (rt_comm_mpi_create(e->opts.device, gpu, &e->comm[0])) {
        rt_mpi_abort("cannot join the communicator (the error above)");
        return RT_ERR_PEER;
    }
    e->opts.cuda_device = gpu - e->me; /* the backend takes GPU cuda_device + rank */
    struct ident id = {0};
    uint64_t *sd = calloc(2 * (size_t)e->world, sizeof(uint64_t));
    char *cfg0 = NULL;
    if (!sd)
        rt_mpi_abort("out of memory");
    if (e->me == 0)
        own_ident(e->path, &id, sd, &cfg0);
    enum rt_err err = rt_mpi_bcast(&id, sizeof(id), true, "the conversion's identity");
    if (!err && id.ok && e->me != 0 && !(cfg0 = malloc(id.cfg_len + 1)))
        rt_mpi_abort("out of memory");
    if (!err && id.ok)
        err = rt_mpi_bcast(sd, 2 * (size_t)e->world * sizeof(uint64_t), true, "the digests");
    if (!err && id.ok)
        err = rt_mpi_bcast(cfg0, id.cfg_len, true, "rank 0's config");
    struct answer a = {0};
    char name[64];
    fmt_rank_file_name(name, sizeof name, (uint32_t)e->me, (uint32_t)e->world);
    snprintf(a.file, sizeof a.file, "%s/%s", e->path, name);
    if (!err && (id.ok || e->me == 0))
        a.err = id.ok ? check_own_file(e->path, e->me, &id, sd, cfg0, a.file) : RT_ERR_IO;
    free(sd);
    free(cfg0);
    if (!err)
        err = mpi_verdict(e, &a, "use", false);
    if (!err) {
        a.err = open_rank(&e->slots[0]);
        a.n_blocks = a.err ? 0 : rt_kv_n_blocks(e->slots[0].kv);
        err = mpi_verdict(e, &a, "open", true);
    }
    e->joined = !err;
    return err;
}

/* Both sides: this process's rank of the model at path, opened with rank 0's options. */
static enum rt_err mpi_open(const char *path, const struct rt_opts *o, struct rt_exec **out)
{
    *out = NULL;
    struct rt_exec *e = calloc(1, sizeof(*e));
    if (!e || !(e->slots = calloc(1, sizeof(*e->slots))) || !(e->path = strdup(path))) {
        rt_mpi_abort("out of memory");
        rt_exec_free(e);
        return RT_ERR_NOMEM;
    }
    e->mpi = true;
    e->world = rt_mpi_world();
    e->me = rt_mpi_rank();
    e->opts = *o;
    const long cores = sysconf(_SC_NPROCESSORS_ONLN); /* the node's cores, shared by its ranks */
    e->opts.n_threads = o->n_threads > 0 ? o->n_threads / e->world
                                         : (int)(cores > 0 ? cores : 1) / rt_mpi_local_size();
    if (e->opts.n_threads < 1)
        e->opts.n_threads = 1;
    if (e->opts.n_seqs < 1)
        e->opts.n_seqs = 1;
    e->slots[0] = (struct rank_slot){.e = e, .rank = e->me};
    enum rt_err err = mpi_join(e);
    if (err) {
        rt_exec_free(e);
        return err;
    }
    *out = e;
    return RT_ERR_NONE;
}

/* Rank 0: tell the followers what to open, then open rank 0. */
static enum rt_err open_exec_mpi(const char *path, const struct rt_opts *opts, int world,
                                 struct rt_exec **out)
{
    if (world != rt_mpi_world()) {
        qs_log_error(__func__, "%s has %d rank%s (manifest.json) but mpirun started %d processes: "
                     "run it with mpirun -np %d", path, world, world == 1 ? "" : "s",
                     rt_mpi_world(), world);
        return RT_ERR_ARG;
    }
    struct rt_opts o = opts ? *opts : rt_opts_default();
    if (o.device == RT_DEVICE_AUTO) /* every rank runs on rank 0's kind of device */
        o.device = rt_cuda_available() ? RT_DEVICE_CUDA : RT_DEVICE_CPU;
    struct hello h = {HELLO_OPEN, 0, (int32_t)qs_log_get_level(), (uint32_t)strlen(path),
                      (uint32_t)sizeof(o)};
    RT_TRY(rt_mpi_bcast(&h, sizeof(h), true, "the model to open"));
    RT_TRY(rt_mpi_bcast((void *)path, h.path_len, true, "the model path"));
    RT_TRY(rt_mpi_bcast(&o, sizeof(o), true, "the options"));
    return mpi_open(path, &o, out);
}

enum rt_err rt_exec_follow(int *code)
{
    *code = QS_EXIT_OK;
    for (;;) {
        struct hello h;
        RT_TRY(rt_mpi_bcast(&h, sizeof(h), false, "rank 0's next command"));
        if (h.kind == HELLO_END) {
            *code = h.code;
            return RT_ERR_NONE;
        }
        char *path = h.path_len < 1 << 16 ? calloc(h.path_len + 1, 1) : NULL;
        struct rt_opts o;
        if (h.kind != HELLO_OPEN || h.opts_size != sizeof(o) || !path) {
            rt_mpi_abort("rank 0 sent a message this build does not know (another qshard?)");
            free(path);
            return RT_ERR_ARG;
        }
        enum rt_err err = rt_mpi_bcast(path, h.path_len, true, "the model path");
        if (!err)
            err = rt_mpi_bcast(&o, sizeof(o), true, "the options");
        qs_log_set_level((enum qs_log_level)h.log_level);
        struct rt_exec *e = NULL;
        if (!err && !mpi_open(path, &o, &e)) {
            while (follow_step(&e->slots[0], e->comm[0]))
                ;
            rt_exec_free(e);
        }
        free(path);
    }
}

void rt_exec_mpi_end(int code)
{
    if (rt_mpi_world() <= 1 || rt_mpi_rank() != 0)
        return;
    struct hello h = {HELLO_END, code, 0, 0, 0};
    (void)rt_mpi_bcast(&h, sizeof(h), true, "the end of the job");
}

static enum rt_err open_exec(const char *path, const struct rt_opts *opts,
                             rt_backend_factory factory, void *user, struct rt_exec **out)
{
    *out = NULL;
    int world = 1;
    RT_TRY(peek_world(path, &world));
    /* under mpirun: one rank per process (also at -np 1 with a TP-1 model, so that path runs
     * at world size 1); a TP-N model under -np 1 runs all its ranks here, as without mpirun */
    if (!factory && (rt_mpi_world() > 1 || (rt_mpi_world() == 1 && world == 1)))
        return open_exec_mpi(path, opts, world, out);
    struct rt_exec *e = calloc(1, sizeof(*e));
    if (!e || !(e->slots = calloc((size_t)world, sizeof(*e->slots))) || !(e->path = strdup(path))) {
        qs_log_error(__func__, "out of memory");
        rt_exec_free(e);
        return RT_ERR_NOMEM;
    }
    e->world = world;
    e->opts = resolve_opts(opts, world);
    e->factory = factory;
    e->user = user;
    for (int r = 0; r < world; r++)
        e->slots[r] = (struct rank_slot){.e = e, .rank = r};
    enum rt_err err = exec_open(e);
    if (err) {
        rt_exec_free(e);
        return err;
    }
    *out = e;
    return RT_ERR_NONE;
}

enum rt_err rt_exec_open(const char *path_or_dir, const struct rt_opts *opts,
                         struct rt_exec **out)
{
    return open_exec(path_or_dir, opts, NULL, NULL, out);
}

enum rt_err rt_exec_open_with(const char *path_or_dir, const struct rt_opts *opts,
                              rt_backend_factory factory, void *user, struct rt_exec **out)
{
    if (!factory) {
        *out = NULL;
        qs_log_error(__func__, "no backend factory given");
        return RT_ERR_ARG;
    }
    return open_exec(path_or_dir, opts, factory, user, out);
}

void rt_exec_free(struct rt_exec *e)
{
    if (!e)
        return;
    if (e->world > 1 && e->comm[0] && e->me == 0 && (!e->mpi || e->joined)) {
        if (!e->dead) {
            struct cmd_hdr h = {.kind = CMD_QUIT};
            if (e->comm[0]->ops->broadcast(e->comm[0], &h, sizeof(h)))
                e->comm[0]->ops->abort(e->comm[0]);
        } else {
            e->comm[0]->ops->abort(e->comm[0]);
        }
    }
    for (int r = 1; r < e->world && e->slots && !e->mpi; r++)
        if (e->slots[r].started)
            pthread_join(e->slots[r].th, NULL);
    if (e->slots) {
        rt_kv_free(e->slots[0].kv);
        rt_model_free(e->slots[0].m);
    }
    for (int r = 0; r < e->world; r++)
        if (e->comm[r])
            e->comm[r]->ops->destroy(e->comm[r]);
    if (e->slots)
        free(e->slots[0].buf);
    free(e->slots);
    free(e->scratch);
    free(e->seqbuf);
    free(e->copy);
    free(e->lens);
    rt_blocks_free(e->blocks);
    free(e->path);
    free(e);
}

// --- steps ------------------------------------------------------------------------------------------

static int seq_at(const struct rt_batch *b, int i)
{
    return b->seq ? b->seq[i] : 0;
}

/* Rank 0: the blocks of every sequence of b made writable (rt_blocks_prepare: nothing changes
 * when the pool is short), their tables into scratch after the batch words; *n_tab, the copies
 * in e->copy. */
static enum rt_err prepare_blocks(struct rt_exec *e, const struct rt_batch *b, size_t at,
                                  int *n_tab, int *n_copy)
{
    const int st = e->slots[0].m->tab_stride;
    int need = 0, n = 0;
    for (int i = 0; i < b->n_tokens; n++) { /* first the whole step's need */
        int j = i + 1;
        while (j < b->n_tokens && seq_at(b, j) == seq_at(b, i))
            j++;
        need += rt_blocks_needed(e->blocks, seq_at(b, i), b->pos[i], j - i);
        i = j;
    }
    if (need > rt_blocks_available(e->blocks)) {
        qs_log_error(__func__, "the batch needs %d more KV-cache blocks, %d are free (%d in all): "
                     "run fewer sequences at once or give the cache more memory", need,
                     rt_blocks_available(e->blocks), rt_blocks_total(e->blocks));
        return RT_ERR_KV_FULL;
    }
    RT_TRY(grow_i32(&e->scratch, &e->scratch_cap, at + (size_t)n * st));
    RT_TRY(grow_i32(&e->copy, &e->copy_cap, 2 * ((size_t)b->n_tokens / e->block_size + 2 * (size_t)n)));
    *n_copy = 0;
    *n_tab = 0;
    for (int i = 0; i < b->n_tokens; (*n_tab)++) {
        const int s = seq_at(b, i);
        int j = i + 1, nc = 0;
        while (j < b->n_tokens && seq_at(b, j) == s)
            j++;
        RT_TRY(rt_blocks_prepare(e->blocks, s, b->pos[i], j - i, e->copy + 2 * *n_copy, &nc));
        *n_copy += nc;
        e->lens[s] = rt_blocks_len(e->blocks, s);
        memcpy(e->scratch + at + (size_t)*n_tab * st, rt_blocks_table(e->blocks, s),
               (size_t)st * sizeof(int32_t));
        i = j;
    }
    return RT_ERR_NONE;
}

/* Rank 0: check the batch, prepare its blocks, broadcast it to the followers, run rank 0's
 * part, then register the blocks it filled. */
static enum rt_err run_step(struct rt_exec *e, const struct rt_batch *b, enum rt_out out,
                            float *logits, const struct rt_pick *picks, int32_t *ids)
{
    struct rank_slot *s0 = &e->slots[0];
    if (e->dead) {
        qs_log_error(__func__, "an earlier step failed: the model must be opened again");
        return RT_ERR_PEER;
    }
    RT_TRY(rt_model_check_batch(s0->m, e->lens, e->n_seqs, e->n_ctx, b));
    const int n = b->n_tokens, has_seq = b->seq != NULL;
    const size_t words = (size_t)n * (has_seq ? 3 : 2) + (size_t)b->n_out;
    RT_TRY(grow_i32(&e->scratch, &e->scratch_cap, words));
    int n_tab = 0, n_copy = 0;
    RT_TRY(prepare_blocks(e, b, words, &n_tab, &n_copy));
    const int st = s0->m->tab_stride;
    if (e->world > 1) {
        struct rt_comm *c = e->comm[0];
        struct cmd_hdr h = {CMD_FORWARD, n, b->n_out, (int32_t)out, has_seq, n_tab, st, n_copy};
        const size_t all = payload_words(&h);
        RT_TRY(grow_i32(&e->scratch, &e->scratch_cap, all));
        memcpy(e->scratch, b->tokens, (size_t)n * sizeof(int32_t));
        memcpy(e->scratch + n, b->pos, (size_t)n * sizeof(int32_t));
        if (has_seq)
            memcpy(e->scratch + 2 * n, b->seq, (size_t)n * sizeof(int32_t));
        if (b->n_out)
            memcpy(e->scratch + (size_t)n * (has_seq ? 3 : 2), b->out,
                   (size_t)b->n_out * sizeof(int32_t));
        memcpy(e->scratch + words + (size_t)n_tab * st, e->copy, 2 * (size_t)n_copy * sizeof(int32_t));
        enum rt_err err = c->ops->broadcast(c, &h, sizeof(h));
        if (!err)
            err = c->ops->broadcast(c, e->scratch, all * sizeof(int32_t));
        if (err) {
            e->dead = true;
            return err;
        }
    }
    const struct rt_kv_step ks = {e->scratch + words, st, n_copy, e->copy};
    enum rt_err err = rt_model_forward(s0->m, s0->kv, b, &ks, out, logits, picks, ids);
    if (err && err != RT_ERR_NUMERIC) {
        e->dead = true;
        if (e->world > 1)
            e->comm[0]->ops->abort(e->comm[0]);
        return err;
    }
    for (int i = 0; i < n;) { /* the keys and values are in the cache: remember the tokens */
        int j = i + 1;
        while (j < n && seq_at(b, j) == seq_at(b, i))
            j++;
        rt_blocks_commit(e->blocks, seq_at(b, i), b->tokens + i, b->pos[i], j - i);
        i = j;
    }
    return err;
}

enum rt_err rt_exec_forward(struct rt_exec *e, const struct rt_batch *b, float *logits)
{
    return run_step(e, b, logits ? RT_OUT_LOGITS : RT_OUT_NONE, logits, NULL, NULL);
}

bool rt_exec_can_pick(const struct rt_exec *e)
{
    return rt_model_can_pick(e->slots[0].m);
}

/* The checks of a pick, before anything runs (a refusal by the kernel would come after the
 * forward pass had already written the KV cache). */
static enum rt_err check_pick(const struct rt_exec *e, const struct rt_pick *p)
{
    if (rt_sample_params_check(&p->p) != RT_SAMPLE_ERR_NONE) /* reports the field */
        return RT_ERR_ARG;
    (void)e;
    if ((p->p.temperature > 0.0f && !(p->u >= 0.0 && p->u < 1.0)) ||
        (p->p.repeat_penalty != 1.0f && !p->seen)) {
        qs_log_error(__func__, "bad sampling request: draw u %g (must be in [0, 1) when "
                     "sampling), history %s with repetition penalty %g", p->u,
                     p->seen ? "given" : "NULL", (double)p->p.repeat_penalty);
        return RT_ERR_ARG;
    }
    return RT_ERR_NONE;
}

enum rt_err rt_exec_forward_pick(struct rt_exec *e, const struct rt_batch *b,
                                 const struct rt_pick *picks, int32_t *ids)
{
    if (!b || !picks || !ids || b->n_out < 1) {
        qs_log_error(__func__, "picks and ids must not be NULL and n_out >= 1");
        return RT_ERR_ARG;
    }
    for (int i = 0; i < b->n_out; i++)
        RT_TRY(check_pick(e, &picks[i]));
    if (!rt_exec_can_pick(e)) {
        qs_log_error(__func__, "the %s backend cannot sample on the device",
                     e->slots[0].m->be.ops->name);
        return RT_ERR_UNSUPPORTED;
    }
    return run_step(e, b, RT_OUT_PICK, NULL, picks, ids);
}

/* A one-sequence batch of tokens[n] at start_pos.. in slot seq, out rows all or the last. */
static enum rt_err seq_batch(struct rt_exec *e, int seq, const int32_t *tokens, int n,
                             int start_pos, bool all_rows, struct rt_batch *b)
{
    if (n < 1 || !tokens) {
        qs_log_error(__func__, "no tokens to run (n_tokens = %d)", n);
        return RT_ERR_ARG;
    }
    RT_TRY(grow_i32(&e->seqbuf, &e->seqbuf_cap, 3 * (size_t)n));
    int32_t *pos = e->seqbuf, *sq = pos + n, *out = sq + n;
    for (int i = 0; i < n; i++) {
        pos[i] = start_pos + i;
        sq[i] = seq;
        out[i] = i;
    }
    *b = (struct rt_batch){n, tokens, pos, sq, all_rows ? n : 1, all_rows ? out : out + n - 1};
    return RT_ERR_NONE;
}

enum rt_err rt_exec_forward_seq(struct rt_exec *e, int seq, const int32_t *tokens, int n,
                                int start_pos, float *logits, bool all_logits)
{
    struct rt_batch b;
    RT_TRY(seq_batch(e, seq, tokens, n, start_pos, all_logits, &b));
    if (!logits)
        b.n_out = 0;
    return rt_exec_forward(e, &b, logits);
}

enum rt_err rt_exec_forward_seq_pick(struct rt_exec *e, int seq, const int32_t *tokens, int n,
                                     int start_pos, const struct rt_pick *pick, int32_t *id)
{
    struct rt_batch b;
    RT_TRY(seq_batch(e, seq, tokens, n, start_pos, false, &b));
    return rt_exec_forward_pick(e, &b, pick, id);
}

int rt_exec_seq_len(const struct rt_exec *e, int seq)
{
    return rt_blocks_len(e->blocks, seq);
}

void rt_exec_seq_clear(struct rt_exec *e, int seq)
{
    rt_blocks_clear(e->blocks, seq);
    if (seq >= 0 && seq < e->n_seqs)
        e->lens[seq] = 0;
}

int rt_exec_seq_match_prefix(struct rt_exec *e, int seq, const int32_t *tokens, int n)
{
    const int hit = rt_blocks_match(e->blocks, seq, tokens, n);
    if (seq >= 0 && seq < e->n_seqs)
        e->lens[seq] = rt_blocks_len(e->blocks, seq);
    return hit;
}

int rt_exec_block_size(const struct rt_exec *e)
{
    return e->block_size;
}

int rt_exec_blocks_total(const struct rt_exec *e)
{
    return rt_blocks_total(e->blocks);
}

int rt_exec_blocks_available(const struct rt_exec *e)
{
    return rt_blocks_available(e->blocks);
}

int rt_exec_blocks_used(const struct rt_exec *e)
{
    return rt_blocks_used(e->blocks);
}

int rt_exec_blocks_needed(const struct rt_exec *e, int seq, int p0, int n)
{
    return rt_blocks_needed(e->blocks, seq, p0, n);
}

const struct rt_config *rt_exec_config(const struct rt_exec *e)
{
    return rt_model_config(e->slots[0].m);
}

int rt_exec_world_size(const struct rt_exec *e)
{
    return e->world;
}

int rt_exec_n_ctx(const struct rt_exec *e)
{
    return e->n_ctx;
}

int rt_exec_n_seqs(const struct rt_exec *e)
{
    return e->n_seqs;
}

int rt_exec_max_batch(const struct rt_exec *e)
{
    return e->slots[0].m->max_batch;
}

enum rt_device rt_exec_device(const struct rt_exec *e)
{
    return rt_model_device(e->slots[0].m);
}

const struct fmt_shard *rt_exec_shard(const struct rt_exec *e)
{
    return rt_model_shard(e->slots[0].m);
}
