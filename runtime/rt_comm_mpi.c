/*
 * rt_comm_mpi.c - one process per tensor-parallel rank over MPI (rt_mpi.h): the process's MPI
 * world, bounded host messages, and the communicator of its one rank ("mpi-cpu" / "mpi-nccl").
 *
 * Every collective is started non-blocking (MPI_Ibcast, MPI_Iallgather, MPI_Igather) and waited
 * for by polling MPI_Test, yielding the core between polls (the CI runs 4 processes on 2 cores),
 * until it completes or the deadline passes; then the rank reports which collective and ends the
 * job (MPI_Abort). The CPU all-reduce gathers every rank's buffer to every rank and adds them in
 * rank order in fp32 (as ref_allreduce_sum and rt_comm.c): the same bits on every rank, never
 * MPI_Allreduce's order.
 *
 * Test: tests/test_mpi.sh.
 */
#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qs_log.h"
#include "rt_comm_cuda.h" /* rt_nccl_rank_* */
#include "rt_mpi.h"

static struct {
    bool up;
    int world, rank, local_rank, local_size;
    double timeout_s;
} g_mpi = {false, 0, 0, 0, 1, RT_MPI_DEFAULT_TIMEOUT_S};

bool rt_mpi_built(void)
{
    return true;
}

bool rt_mpi_launched(void)
{
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}

enum rt_err rt_mpi_init(int *argc, char ***argv)
{
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
        qs_log_error(__func__, "MPI_Init_thread failed");
        return RT_ERR_THREAD;
    }
    g_mpi.up = true;
    MPI_Comm_size(MPI_COMM_WORLD, &g_mpi.world);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_mpi.rank);
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_mpi.rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &g_mpi.local_rank);
    MPI_Comm_size(node, &g_mpi.local_size);
    MPI_Comm_free(&node);
    if (provided < MPI_THREAD_SERIALIZED) {
        qs_log_error(__func__, "the MPI library gives thread level %d, qshard needs "
                     "MPI_THREAD_SERIALIZED (%d)", provided, MPI_THREAD_SERIALIZED);
        return RT_ERR_THREAD;
    }
    return RT_ERR_NONE;
}

void rt_mpi_finalize(void)
{
    if (g_mpi.up)
        MPI_Finalize();
    g_mpi.up = false;
}

int rt_mpi_world(void) { return g_mpi.up ? g_mpi.world : 0; }
int rt_mpi_rank(void) { return g_mpi.rank; }
int rt_mpi_local_rank(void) { return g_mpi.local_rank; }
int rt_mpi_local_size(void) { return g_mpi.local_size; }

void rt_mpi_set_timeout(double seconds)
{
    if (seconds > 0)
        g_mpi.timeout_s = seconds;
}

void rt_mpi_abort(const char *why)
{
    fprintf(stderr, "%s: rank %d of %d: giving up (%s): ending every rank\n", qs_log_prog(),
            g_mpi.rank, g_mpi.world, why);
    fflush(stderr);
    if (g_mpi.up)
        MPI_Abort(MPI_COMM_WORLD, QS_EXIT_RUNTIME);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Poll *rq until done; bounded: at most the timeout, then the job ends (reporting `what`). */
static enum rt_err wait_req(MPI_Request *rq, bool bounded, const char *what)
{
    const double t0 = now_s();
    for (unsigned spin = 0;; spin++) {
        int done = 0;
        MPI_Test(rq, &done, MPI_STATUS_IGNORE);
        if (done)
            return RT_ERR_NONE;
        if (spin < 64)
            continue;
        if (spin < 4096) {
            sched_yield();
        } else {
            const struct timespec nap = {0, spin < 100000 ? 50000 : 1000000};
            nanosleep(&nap, NULL);
        }
        if (bounded && (spin & 63) == 0 && now_s() - t0 > g_mpi.timeout_s) {
            char why[192];
            snprintf(why, sizeof why, "%s: no answer from the other ranks within %.0f s (a rank "
                     "hung, stopped or never joined)", what, g_mpi.timeout_s);
            rt_mpi_abort(why);
            return RT_ERR_PEER;
        }
    }
}

static enum rt_err check_count(size_t bytes, const char *what)
{
    if (bytes > INT_MAX) {
        qs_log_error(__func__, "%s: %zu bytes in one MPI message (at most %d)", what, bytes,
                     INT_MAX);
        return RT_ERR_ARG;
    }
    return RT_ERR_NONE;
}

enum rt_err rt_mpi_bcast(void *buf, size_t bytes, bool bounded, const char *what)
{
    RT_TRY(check_count(bytes, what));
    MPI_Request rq;
    MPI_Ibcast(buf, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD, &rq);
    return wait_req(&rq, bounded, what);
}

enum rt_err rt_mpi_gather(const void *send, size_t bytes, void *recv, const char *what)
{
    RT_TRY(check_count(bytes, what));
    MPI_Request rq;
    MPI_Igather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD, &rq);
    return wait_req(&rq, true, what);
}

// --- the communicator ----------------------------------------------------------------------------

struct mpi_ep {
    struct rt_comm c;
    float *tmp; /* CPU all-reduce: every rank's buffer [world][n] */
    size_t tmp_cap;
    struct rt_nccl_rank *nccl; /* mpi-nccl */
};

static struct mpi_ep *EP(struct rt_comm *c)
{
    return c->impl;
}

static enum rt_err ep_fail(struct rt_comm *c, enum rt_err e)
{
    c->ops->abort(c);
    return e;
}

static enum rt_err cpu_all_reduce(struct rt_comm *c, void *buf, size_t n, enum rt_dtype t,
                                  void *stream)
{
    (void)stream;
    struct mpi_ep *p = EP(c);
    if (t != RT_DTYPE_F32) {
        qs_log_error(__func__, "the CPU communicator sums fp32 buffers only (got type %d)", (int)t);
        return ep_fail(c, RT_ERR_ARG);
    }
    const size_t all = n * (size_t)c->world;
    if (check_count(n * sizeof(float), "all-reduce"))
        return ep_fail(c, RT_ERR_ARG);
    if (p->tmp_cap < all) {
        float *q = realloc(p->tmp, all * sizeof(float));
        if (!q) {
            qs_log_error(__func__, "rank %d: out of memory for a %zu-value all-reduce", c->rank, n);
            return ep_fail(c, RT_ERR_NOMEM);
        }
        p->tmp = q;
        p->tmp_cap = all;
    }
    MPI_Request rq;
    MPI_Iallgather(buf, (int)(n * sizeof(float)), MPI_BYTE, p->tmp, (int)(n * sizeof(float)),
                   MPI_BYTE, MPI_COMM_WORLD, &rq);
    RT_TRY(wait_req(&rq, true, "all-reduce"));
    float *sum = buf; /* rank order, fp32: the bits of ref_allreduce_sum on every rank */
    memcpy(sum, p->tmp, n * sizeof(float));
    for (int r = 1; r < c->world; r++) {
        const float *b = p->tmp + (size_t)r * n;
        for (size_t i = 0; i < n; i++)
            sum[i] += b[i];
    }
    return RT_ERR_NONE;
}

static bool no_capture(struct rt_comm *c, const void *buf, size_t n, enum rt_dtype t)
{
    (void)c, (void)buf, (void)n, (void)t;
    return false; /* nothing recorded: MPI and NCCL calls stay outside graphs */
}

static enum rt_err cpu_gather(struct rt_comm *c, const void *send, size_t bytes, void *recv,
                              void *stream)
{
    (void)stream;
    enum rt_err e = rt_mpi_gather(send, bytes, recv, "gather");
    return e ? ep_fail(c, e) : RT_ERR_NONE;
}

static enum rt_err ep_broadcast(struct rt_comm *c, void *buf, size_t bytes)
{
    (void)c;
    return rt_mpi_bcast(buf, bytes, true, "broadcast of a step");
}

static enum rt_err ep_broadcast_wait(struct rt_comm *c, void *buf, size_t bytes)
{
    (void)c;
    return rt_mpi_bcast(buf, bytes, false, "the next step");
}

static void ep_abort(struct rt_comm *c)
{
    rt_nccl_rank_abort(EP(c)->nccl);
    rt_mpi_abort("this rank failed (the error above)");
}

static void ep_destroy(struct rt_comm *c)
{
    if (!c)
        return;
    struct mpi_ep *p = EP(c);
    rt_nccl_rank_destroy(p->nccl);
    free(p->tmp);
    free(p);
}

static const struct rt_comm_ops mpi_cpu_ops = {
    .name = "mpi-cpu",
    .all_reduce = cpu_all_reduce,
    .can_capture = no_capture,
    .gather = cpu_gather,
    .broadcast = ep_broadcast,
    .broadcast_wait = ep_broadcast_wait,
    .abort = ep_abort,
    .destroy = ep_destroy,
};

static enum rt_err nccl_all_reduce(struct rt_comm *c, void *buf, size_t n, enum rt_dtype t,
                                   void *stream)
{
    enum rt_err e = rt_nccl_rank_all_reduce(EP(c)->nccl, buf, n, t, stream);
    return e ? ep_fail(c, e) : RT_ERR_NONE;
}

static enum rt_err nccl_gather(struct rt_comm *c, const void *send, size_t bytes, void *recv,
                               void *stream)
{
    enum rt_err e = rt_nccl_rank_gather(EP(c)->nccl, send, bytes, recv, stream, g_mpi.timeout_s);
    return e ? ep_fail(c, e) : RT_ERR_NONE;
}

static const struct rt_comm_ops mpi_nccl_ops = {
    .name = "mpi-nccl",
    .all_reduce = nccl_all_reduce,
    .can_capture = no_capture,
    .gather = nccl_gather,
    .broadcast = ep_broadcast,
    .broadcast_wait = ep_broadcast_wait,
    .abort = ep_abort,
    .destroy = ep_destroy,
};

/* rank 0 makes the NCCL id (or says it could not: the first byte of a flag) and sends it */
static enum rt_err nccl_join(struct mpi_ep *p, int gpu)
{
    unsigned char msg[1 + RT_NCCL_ID_BYTES] = {0};
    if (g_mpi.rank == 0)
        msg[0] = rt_nccl_rank_id(msg + 1) == RT_ERR_NONE;
    RT_TRY(rt_mpi_bcast(msg, sizeof msg, true, "the NCCL id"));
    if (!msg[0]) {
        qs_log_error(__func__, "rank %d: rank 0 could not make an NCCL id", g_mpi.rank);
        return RT_ERR_DEVICE;
    }
    return rt_nccl_rank_create(g_mpi.world, g_mpi.rank, msg + 1, gpu, &p->nccl);
}

enum rt_err rt_comm_mpi_create(enum rt_device device, int gpu, struct rt_comm **out)
{
    *out = NULL;
    if (!g_mpi.up) {
        qs_log_error(__func__, "MPI is not initialised (not started by mpirun)");
        return RT_ERR_ARG;
    }
    struct mpi_ep *p = calloc(1, sizeof(*p));
    if (!p) {
        qs_log_error(__func__, "out of memory");
        return RT_ERR_NOMEM;
    }
    const bool cuda = device == RT_DEVICE_CUDA;
    p->c = (struct rt_comm){cuda ? &mpi_nccl_ops : &mpi_cpu_ops, g_mpi.rank, g_mpi.world, p};
    if (cuda) {
        enum rt_err e = nccl_join(p, gpu);
        if (e) {
            free(p);
            return e;
        }
    }
    char dev[32] = "";
    if (cuda)
        snprintf(dev, sizeof dev, ", GPU %d", gpu);
    qs_log_debug("communicator %s: rank %d of %d, local rank %d of %d on this node%s",
                 p->c.ops->name, g_mpi.rank, g_mpi.world, g_mpi.local_rank, g_mpi.local_size, dev);
    *out = &p->c;
    return RT_ERR_NONE;
}
