/*
 * cpu_threads.c - the CPU backend's parallel-for and the public thread-count setting.
 *
 * One process-wide pool of helper threads, created on first use and grown on demand up to the
 * thread count n minus one; the calling thread always works too. A call claims the helpers that
 * are idle at that moment, up to what it can use, and a helper works for one call at a time. So
 * concurrent calls from several caller threads share one budget: the library adds at most n - 1
 * threads to the callers' own, however many calls run at once (a call that finds every helper
 * busy runs on its caller alone). The budget is global rather than per call because pools per
 * call would multiply the threads by the number of concurrent callers.
 *
 * Handing a call to a waiting helper costs about a microsecond (a helper spins a little while
 * after its last item before it sleeps on a condition variable), which decode calls of a few
 * tens of microseconds need; creating threads per call costs tens of microseconds. After fork()
 * the child starts with an empty pool.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "cpu_common.h"

/* Upper bound on threads per call (and on the settings accepted). */
#define GDN_CPU_MAX_THREADS 256
/* Below this much arithmetic per thread, another thread costs more than it saves. */
#define GDN_CPU_FLOPS_PER_THREAD 1.0e5
/* Polls of an idle helper before it sleeps (with the pause below, some hundreds of microseconds:
 * longer than the gap between the layers' calls of a decode step on a fast machine), and of a
 * caller waiting for its helpers before it yields the processor. */
#define GDN_CPU_SPIN 20000

/* The spin-wait hint: x86's pause frees the core's resources for its sibling while polling. */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define GDN_CPU_RELAX() __builtin_ia32_pause()
#else
#define GDN_CPU_RELAX() ((void)0)
#endif

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

/* Items are split into one contiguous range per thread, so that repeated calls of one shape give
 * a thread the same items (and their data a chance to stay in its caches); a thread that runs out
 * takes items from the others' ranges. */
typedef struct job {
    gdn_cpu_task_fn fn;
    void *ctx;
    int64_t items;
    int ranges;
    atomic_llong next[GDN_CPU_MAX_THREADS]; /* next item of range r, which ends at range_end(r) */
    atomic_int pending;                     /* helpers still working on it */
} job;

static int64_t range_end(const job *jb, int r) { return jb->items * (r + 1) / jb->ranges; }

static void run_items(job *jb, int thread)
{
    for (int k = 0; k < jb->ranges; k++) {
        const int r = (thread + k) % jb->ranges;
        const int64_t end = range_end(jb, r);
        for (;;) {
            int64_t i = (int64_t)atomic_fetch_add(&jb->next[r], 1);
            if (i >= end)
                break;
            jb->fn(jb->ctx, i, thread);
        }
    }
}

/* A helper thread. claimed: owned by a call (or being started); jb: its work, set by the owner. */
typedef struct helper {
    atomic_int claimed;
    _Atomic(job *) jb;
    int thread;       /* scratch index within the call, set by the owner before jb */
    atomic_int sleeping;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} helper;

static helper helpers[GDN_CPU_MAX_THREADS - 1];
static atomic_int helpers_started;  /* helpers[0 .. helpers_started) exist */
static pthread_mutex_t grow_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void *helper_main(void *arg)
{
    helper *h = (helper *)arg;
    for (;;) {
        job *jb = NULL;
        for (int spin = 0; spin < GDN_CPU_SPIN && !(jb = atomic_load(&h->jb)); spin++)
            GDN_CPU_RELAX();
        if (!jb) {
            pthread_mutex_lock(&h->mu);
            atomic_store(&h->sleeping, 1);
            while (!(jb = atomic_load(&h->jb)))
                pthread_cond_wait(&h->cv, &h->mu);
            atomic_store(&h->sleeping, 0);
            pthread_mutex_unlock(&h->mu);
        }
        run_items(jb, h->thread);
        atomic_store(&h->jb, NULL);
        atomic_fetch_sub(&jb->pending, 1); /* jb may be gone after this */
        atomic_store(&h->claimed, 0);
    }
    return NULL;
}

/* The child of a fork has none of the parent's helper threads: start over. */
static void forget_helpers(void)
{
    atomic_store(&helpers_started, 0);
    pthread_mutex_init(&grow_mu, NULL);
}

static void register_atfork(void) { pthread_atfork(NULL, NULL, forget_helpers); }

/* Starts helpers until `want` exist (or creation fails); returns how many exist. */
static int grow_helpers(int want)
{
    int have = atomic_load(&helpers_started);
    if (have >= want)
        return have;
    pthread_once(&atfork_once, register_atfork);
    pthread_mutex_lock(&grow_mu);
    have = atomic_load(&helpers_started);
    while (have < want) {
        helper *h = &helpers[have];
        atomic_store(&h->claimed, 0);
        atomic_store(&h->jb, NULL);
        atomic_store(&h->sleeping, 0);
        pthread_mutex_init(&h->mu, NULL);
        pthread_cond_init(&h->cv, NULL);
        pthread_attr_t attr;
        pthread_t tid;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&tid, &attr, helper_main, h);
        pthread_attr_destroy(&attr);
        if (rc != 0)
            break; /* run with the helpers that exist */
        atomic_store(&helpers_started, ++have);
    }
    pthread_mutex_unlock(&grow_mu);
    return have;
}

static void hand_over(helper *h, job *jb, int thread)
{
    h->thread = thread;
    atomic_store(&h->jb, jb);
    if (atomic_load(&h->sleeping)) {
        pthread_mutex_lock(&h->mu);
        pthread_cond_signal(&h->cv);
        pthread_mutex_unlock(&h->mu);
    }
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
    jb.ranges = threads;
    for (int r = 0; r < threads; r++)
        atomic_init(&jb.next[r], items * r / threads);
    atomic_init(&jb.pending, 0);

    /* Claim idle helpers (thread indices 1 .. threads - 1), at most the budget allows. */
    const int budget = gdn_get_num_threads() - 1;
    const int have = grow_helpers(budget < threads - 1 ? budget : threads - 1);
    int used = 0;
    const int usable = have < budget ? have : budget; /* helpers beyond a lowered count stay idle */
    for (int i = 0; i < usable && used < threads - 1; i++) {
        int expected = 0;
        if (!atomic_compare_exchange_strong(&helpers[i].claimed, &expected, 1))
            continue;
        atomic_fetch_add(&jb.pending, 1);
        hand_over(&helpers[i], &jb, ++used);
    }
    run_items(&jb, 0);
    for (int spin = 0; atomic_load(&jb.pending) > 0; spin++) {
        if (spin < GDN_CPU_SPIN)
            GDN_CPU_RELAX();
        else
            sched_yield();
    }
}
