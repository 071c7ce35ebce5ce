/*
 * rt_comm.c - the communicator of the tensor-parallel ranks of one process (rt_backend.h,
 * rt_comm_local_create): one endpoint per rank, each used by the thread that runs the rank.
 *
 * Host side: a group with a mutex, a condition variable and a generation-counting barrier;
 * every collective publishes each rank's pointer in the group, meets at the barrier, copies,
 * and meets again, so no rank returns while another still reads its memory. abort() marks the
 * group dead and wakes every waiter (they return RT_ERR_PEER), so a rank that fails never
 * leaves the others waiting.
 * Data collectives: with a CPU backend they work on host memory here (the all-reduce adds the
 * ranks' buffers in rank order in fp32, as ref_allreduce_sum: every rank gets the same bits,
 * the bits TP-1 sums would give for two ranks); with CUDA they go to rt_comm_cuda.cu (our
 * peer-to-peer kernel, NCCL, peer copies).
 *
 * Test: ./build/test_model (TP-N on the CPU equals TP-1; a rank that fails aborts the others).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "qs_log.h"
#include "rt_backend.h"
#include "rt_comm_cuda.h"

#define RT_COMM_MAX_WORLD 64

struct group {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int world;
    int arrived;               /* ranks at the barrier of generation gen */
    unsigned gen;
    bool aborted;
    int refs;                  /* endpoints not yet destroyed */
    const void *ptr[RT_COMM_MAX_WORLD]; /* each rank's buffer of the collective in progress */
    size_t bytes;              /* broadcast size published by rank 0 */
    struct rt_comm_cuda *dev;  /* device collectives (CUDA), else NULL */
    struct rt_comm eps[RT_COMM_MAX_WORLD];
    float *tmp[RT_COMM_MAX_WORLD]; /* per rank: its private sum of the CPU all-reduce */
    size_t tmp_cap[RT_COMM_MAX_WORLD];
};

static struct group *G(struct rt_comm *c)
{
    return c->impl;
}

/* Every rank of the group arrives before any leaves; RT_ERR_PEER if the group is (or gets)
 * aborted before this barrier completes. */
static enum rt_err barrier(struct group *g)
{
    pthread_mutex_lock(&g->mu);
    if (g->aborted) {
        pthread_mutex_unlock(&g->mu);
        return RT_ERR_PEER;
    }
    const unsigned gen = g->gen;
    if (++g->arrived == g->world) {
        g->arrived = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
    } else {
        while (gen == g->gen && !g->aborted)
            pthread_cond_wait(&g->cv, &g->mu);
    }
    const bool failed = gen == g->gen; /* woken by an abort, not by the last arrival */
    pthread_mutex_unlock(&g->mu);
    if (failed) {
        qs_log_debug("communicator: another rank gave up while this one waited");
        return RT_ERR_PEER;
    }
    return RT_ERR_NONE;
}

/* --- host collectives (every backend) ---------------------------------------------------------- */

static enum rt_err local_broadcast(struct rt_comm *c, void *buf, size_t bytes)
{
    struct group *g = G(c);
    if (c->rank == 0) {
        g->ptr[0] = buf;
        g->bytes = bytes;
    }
    RT_TRY(barrier(g));
    if (c->rank != 0) {
        if (g->bytes != bytes) {
            qs_log_error(__func__, "rank %d expected a broadcast of %zu bytes, rank 0 sent %zu",
                         c->rank, bytes, g->bytes);
            c->ops->abort(c);
            return RT_ERR_ARG;
        }
        memcpy(buf, g->ptr[0], bytes);
    }
    return barrier(g);
}

static void local_abort(struct rt_comm *c)
{
    struct group *g = G(c);
    pthread_mutex_lock(&g->mu);
    const bool first = !g->aborted;
    g->aborted = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    if (first) {
        qs_log_debug("communicator: rank %d aborted the group of %d", c->rank, c->world);
        if (g->dev)
            rt_comm_cuda_abort(g->dev);
    }
}

static void group_free(struct group *g)
{
    for (int r = 0; r < g->world; r++)
        free(g->tmp[r]);
    rt_comm_cuda_destroy(g->dev);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

static void local_destroy(struct rt_comm *c)
{
    if (!c)
        return;
    struct group *g = G(c);
    pthread_mutex_lock(&g->mu);
    const bool last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    if (last)
        group_free(g);
}

/* --- CPU data collectives ---------------------------------------------------------------------- */

static enum rt_err cpu_all_reduce(struct rt_comm *c, void *buf, size_t n, enum rt_dtype t,
                                  void *stream)
{
    (void)stream;
    struct group *g = G(c);
    if (t != RT_DTYPE_F32) {
        qs_log_error(__func__, "the CPU communicator sums fp32 buffers only (got type %d)", (int)t);
        c->ops->abort(c);
        return RT_ERR_ARG;
    }
    if (g->tmp_cap[c->rank] < n) {
        float *p = realloc(g->tmp[c->rank], n * sizeof(float));
        if (!p) {
            qs_log_error(__func__, "rank %d: out of memory for a %zu-value all-reduce", c->rank, n);
            c->ops->abort(c);
            return RT_ERR_NOMEM;
        }
        g->tmp[c->rank] = p;
        g->tmp_cap[c->rank] = n;
    }
    g->ptr[c->rank] = buf;
    RT_TRY(barrier(g));
    /* every rank adds all buffers in rank order: the same bits everywhere */
    float *sum = g->tmp[c->rank];
    memcpy(sum, g->ptr[0], n * sizeof(float));
    for (int r = 1; r < g->world; r++) {
        const float *b = g->ptr[r];
        for (size_t i = 0; i < n; i++)
            sum[i] += b[i];
    }
    RT_TRY(barrier(g)); /* nobody writes its buffer while another rank still reads it */
    memcpy(buf, sum, n * sizeof(float));
    return RT_ERR_NONE;
}

static bool cpu_can_capture(struct rt_comm *c, const void *buf, size_t n, enum rt_dtype t)
{
    (void)c, (void)buf, (void)n, (void)t;
    return false; /* nothing to record on the CPU */
}

static enum rt_err cpu_gather(struct rt_comm *c, const void *send, size_t bytes, void *recv,
                              void *stream)
{
    (void)stream;
    struct group *g = G(c);
    g->ptr[c->rank] = send;
    RT_TRY(barrier(g));
    if (c->rank == 0)
        for (int r = 0; r < g->world; r++)
            memcpy((char *)recv + (size_t)r * bytes, g->ptr[r], bytes);
    return barrier(g);
}

static const struct rt_comm_ops cpu_comm_ops = {
    .name = "local-cpu",
    .all_reduce = cpu_all_reduce,
    .can_capture = cpu_can_capture,
    .gather = cpu_gather,
    .broadcast = local_broadcast,
    .abort = local_abort,
    .destroy = local_destroy,
};

/* --- CUDA data collectives (rt_comm_cuda.cu) --------------------------------------------------- */

static enum rt_err cuda_all_reduce(struct rt_comm *c, void *buf, size_t n, enum rt_dtype t,
                                   void *stream)
{
    struct group *g = G(c);
    pthread_mutex_lock(&g->mu);
    const bool dead = g->aborted;
    pthread_mutex_unlock(&g->mu);
    if (dead)
        return RT_ERR_PEER;
    enum rt_err e = rt_comm_cuda_all_reduce(g->dev, c->rank, buf, n, t, stream);
    if (e)
        c->ops->abort(c);
    return e;
}

static bool cuda_can_capture(struct rt_comm *c, const void *buf, size_t n, enum rt_dtype t)
{
    return rt_comm_cuda_can_capture(G(c)->dev, buf, n, t);
}

/* Each rank's send is complete on its stream (synchronised) before the barrier; rank 0 then
 * copies every slice into recv on its stream and waits for the copies before the second
 * barrier, so no rank overwrites its send while rank 0 still reads it. */
static enum rt_err cuda_gather(struct rt_comm *c, const void *send, size_t bytes, void *recv,
                               void *stream)
{
    struct group *g = G(c);
    enum rt_err e = rt_comm_cuda_sync(g->dev, c->rank, stream);
    if (e) {
        c->ops->abort(c);
        return e;
    }
    g->ptr[c->rank] = send;
    RT_TRY(barrier(g));
    if (c->rank == 0) {
        for (int r = 0; r < g->world && !e; r++)
            e = rt_comm_cuda_copy_from(g->dev, (char *)recv + (size_t)r * bytes, g->ptr[r], r,
                                       bytes, stream);
        if (!e)
            e = rt_comm_cuda_sync(g->dev, 0, stream);
        if (e) {
            c->ops->abort(c);
            return e;
        }
    }
    return barrier(g);
}

static const struct rt_comm_ops cuda_comm_ops = {
    .name = "local-cuda",
    .all_reduce = cuda_all_reduce,
    .can_capture = cuda_can_capture,
    .gather = cuda_gather,
    .broadcast = local_broadcast,
    .abort = local_abort,
    .destroy = local_destroy,
};

/* --- creation ---------------------------------------------------------------------------------- */

enum rt_err rt_comm_local_create(int world, enum rt_device device, int first_gpu, bool p2p,
                                 struct rt_comm **eps)
{
    for (int r = 0; r < world && r < RT_COMM_MAX_WORLD; r++)
        eps[r] = NULL;
    if (world < 1 || world > RT_COMM_MAX_WORLD) {
        qs_log_error(__func__, "world size %d outside [1, %d]", world, RT_COMM_MAX_WORLD);
        return RT_ERR_ARG;
    }
    struct group *g = calloc(1, sizeof(*g));
    if (!g) {
        qs_log_error(__func__, "out of memory");
        return RT_ERR_NOMEM;
    }
    if (pthread_mutex_init(&g->mu, NULL) != 0) {
        free(g);
        qs_log_error(__func__, "cannot create a mutex");
        return RT_ERR_THREAD;
    }
    if (pthread_cond_init(&g->cv, NULL) != 0) {
        pthread_mutex_destroy(&g->mu);
        free(g);
        qs_log_error(__func__, "cannot create a condition variable");
        return RT_ERR_THREAD;
    }
    g->world = world;
    g->refs = world;
    if (device == RT_DEVICE_CUDA) {
        enum rt_err e = rt_comm_cuda_create(world, first_gpu, p2p, &g->dev);
        if (e) {
            group_free(g);
            return e;
        }
    }
    for (int r = 0; r < world; r++) {
        g->eps[r] = (struct rt_comm){g->dev ? &cuda_comm_ops : &cpu_comm_ops, r, world, g};
        eps[r] = &g->eps[r];
    }
    return RT_ERR_NONE;
}
