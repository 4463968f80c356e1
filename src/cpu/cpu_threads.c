/*
 * cpu_threads.c - the CPU backend's parallel-for and the public thread-count setting.
 *
 * Threads are created per call and joined before it returns: no pool outlives a call, so there
 * is nothing to shut down, nothing to break across fork(), and no state shared between calls
 * except the thread count. Items are handed out through an atomic counter; the calling thread
 * works too. Creation costs tens of microseconds, so small problems run on the caller alone
 * (gdn_cpu_threads_for).
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "cpu_common.h"

/* Upper bound on threads per call (and on the settings accepted). */
#define GDN_CPU_MAX_THREADS 256
/* Below this much arithmetic per thread, another thread costs more than it saves. */
#define GDN_CPU_FLOPS_PER_THREAD 2.0e6

static atomic_int num_threads_set;     /* gdn_set_num_threads; 0: default */
static atomic_int num_threads_default; /* 0: not yet computed */

static int clamp_threads(long n) { return n < 1 ? 1 : n > GDN_CPU_MAX_THREADS ? GDN_CPU_MAX_THREADS : (int)n; }

/* $GDN_NUM_THREADS if it is a positive integer, else the online processors. Read once. */
static int default_threads(void)
{
    int n = atomic_load(&num_threads_default);
    if (n > 0)
        return n;
    const char *env = getenv("GDN_NUM_THREADS");
    char *end = NULL;
    long v = env ? strtol(env, &end, 10) : 0;
    if (env && end != env && *end == '\0' && v > 0)
        n = clamp_threads(v);
    else
        n = clamp_threads(sysconf(_SC_NPROCESSORS_ONLN));
    atomic_store(&num_threads_default, n);
    return n;
}

GDN_API void gdn_set_num_threads(int n) { atomic_store(&num_threads_set, n > 0 ? clamp_threads(n) : 0); }

GDN_API int gdn_get_num_threads(void)
{
    int n = atomic_load(&num_threads_set);
    return n > 0 ? n : default_threads();
}

int gdn_cpu_threads_for(int64_t items, double flops)
{
    int64_t n = gdn_get_num_threads();
    if (n > items)
        n = items;
    double useful = flops / GDN_CPU_FLOPS_PER_THREAD;
    if ((double)n > useful)
        n = (int64_t)useful;
    return n < 1 ? 1 : (int)n;
}

typedef struct job {
    gdn_cpu_task_fn fn;
    void *ctx;
    int64_t items;
    atomic_llong next;
} job;

typedef struct worker {
    job *jb;
    int thread;
} worker;

static void run_items(job *jb, int thread)
{
    for (;;) {
        int64_t i = (int64_t)atomic_fetch_add(&jb->next, 1);
        if (i >= jb->items)
            return;
        jb->fn(jb->ctx, i, thread);
    }
}

static void *worker_main(void *arg)
{
    worker *w = (worker *)arg;
    run_items(w->jb, w->thread);
    return NULL;
}

void gdn_cpu_parallel_for(int threads, int64_t items, gdn_cpu_task_fn fn, void *ctx)
{
    if (threads > GDN_CPU_MAX_THREADS)
        threads = GDN_CPU_MAX_THREADS;
    if ((int64_t)threads > items)
        threads = (int)items;
    if (threads <= 1) {
        for (int64_t i = 0; i < items; i++)
            fn(ctx, i, 0);
        return;
    }
    job jb;
    jb.fn = fn;
    jb.ctx = ctx;
    jb.items = items;
    atomic_init(&jb.next, 0);

    pthread_t tids[GDN_CPU_MAX_THREADS];
    worker workers[GDN_CPU_MAX_THREADS];
    int started = 0;
    for (int t = 1; t < threads; t++) {
        workers[started].jb = &jb;
        workers[started].thread = t;
        if (pthread_create(&tids[started], NULL, worker_main, &workers[started]) != 0)
            break; /* the threads already running (and this one) take the remaining items */
        started++;
    }
    run_items(&jb, 0);
    for (int t = 0; t < started; t++)
        pthread_join(tids[t], NULL);
}
