/*
 * ref_pool.c - the fixed thread pool the CPU references use for their matmuls (see ref.h).
 *
 * One job at a time: ref_pool_run publishes (fn, ctx, n_tasks) under the mutex, bumps a
 * generation counter and wakes the workers; every thread (caller included) takes task indices
 * from an atomic counter until none are left; the last thread to finish wakes the caller.
 * Test: ./build/test_ref (linears with 1, 2 and 3 threads must agree bit for bit).
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "qs_log.h" /* qs_log_error */
#include "ref.h"

struct ref_pool {
    int n_threads;          /* caller + workers */
    pthread_t *workers;     /* owned; [n_threads - 1] */
    int n_started;          /* workers actually started (for cleanup) */
    pthread_mutex_t mu;
    pthread_cond_t wake;    /* workers wait here for a new generation */
    pthread_cond_t done;    /* the caller waits here for active == 0 */
    unsigned long gen;      /* job generation, under mu */
    int active;             /* threads still in the current job, under mu */
    bool stop;              /* under mu */
    ref_task_fn fn;         /* current job */
    void *ctx;
    int n_tasks;
    atomic_int next;        /* next task index to hand out */
};

static void pool_work(struct ref_pool *p)
{
    for (;;) {
        int t = atomic_fetch_add(&p->next, 1);
        if (t >= p->n_tasks)
            break;
        p->fn(p->ctx, t, p->n_tasks);
    }
}

static void *pool_main(void *arg)
{
    struct ref_pool *p = arg;
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->gen == seen)
            pthread_cond_wait(&p->wake, &p->mu);
        if (p->stop)
            break;
        seen = p->gen;
        pthread_mutex_unlock(&p->mu);
        pool_work(p);
        pthread_mutex_lock(&p->mu);
        if (--p->active == 0)
            pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

enum ref_err ref_pool_create(int n_threads, struct ref_pool **out)
{
    *out = NULL;
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)(n > 1024 ? 1024 : n) : 1;
    }
    struct ref_pool *p = calloc(1, sizeof(*p));
    if (!p)
        return REF_ERR_NOMEM;
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->next, 0);
    if (n_threads > 1) {
        p->workers = calloc((size_t)n_threads - 1, sizeof(*p->workers));
        if (!p->workers) {
            ref_pool_free(p);
            return REF_ERR_NOMEM;
        }
    }
    for (int i = 0; i < n_threads - 1; i++) {
        int rc = pthread_create(&p->workers[i], NULL, pool_main, p);
        if (rc) {
            qs_log_error(__func__, "pthread_create failed for worker %d of %d (error %d)", i + 1,
                         n_threads - 1, rc);
            ref_pool_free(p);
            return REF_ERR_THREAD;
        }
        p->n_started++;
    }
    *out = p;
    return REF_ERR_NONE;
}

void ref_pool_free(struct ref_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_started; i++)
        pthread_join(p->workers[i], NULL);
    pthread_cond_destroy(&p->done);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mu);
    free(p->workers);
    free(p);
}

int ref_pool_threads(const struct ref_pool *p)
{
    return p ? p->n_threads : 1;
}

void ref_pool_run(struct ref_pool *p, ref_task_fn fn, void *ctx, int n_tasks)
{
    if (n_tasks <= 0)
        return;
    if (!p || p->n_started == 0 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++)
            fn(ctx, t, n_tasks);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store(&p->next, 0);
    p->active = p->n_started;
    p->gen++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);

    pool_work(p);

    pthread_mutex_lock(&p->mu);
    while (p->active > 0)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
