/*
 * parallel/workers.c - the worker pool: k persistent threads, one per
 * device, created once. The caller's thread posts a job (setup, step,
 * evaluate, broadcast) and waits for all workers to finish it; inside a job
 * the workers meet between phases at an abortable barrier. A failing
 * worker records its device, phase and message in its own slot and aborts
 * the barrier, so every worker returns and the caller reports the first
 * failure by device index. The caller's wait carries the watchdog; the
 * test hooks (engine_testing.h) fire as a worker enters a phase.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/engine_internal.h"
#include "parallel/engine_testing.h"

// --- buffers -------------------------------------------------------------------------

dp_status dp_dbuf_ensure(dp_device *dev, dbuf *b, size_t bytes)
{
    if (b->bytes >= bytes) return DP_OK;
    /* Free first: the old buffer must not count against the limit twice. */
    dp_device_free(dev, b->ptr);
    b->ptr = NULL;
    b->bytes = 0;
    if (bytes == 0) return DP_OK;
    DP_TRY(dp_device_alloc(dev, bytes, &b->ptr));
    b->bytes = bytes;
    return DP_OK;
}

void dp_dbuf_release(dp_device *dev, dbuf *b)
{
    dp_device_free(dev, b->ptr);
    b->ptr = NULL;
    b->bytes = 0;
}

// --- worker failure and phases ----------------------------------------------------

/* Records this worker's failure and aborts the barrier so nobody waits for it. */
void dp_worker_fail(worker *w, dp_status s)
{
    if (w->status == DP_OK) {
        w->status = s;
        w->fail_phase = w->phase;
        /* Outside the step's phases a worker is setting up its replica. */
        const char *phase = w->phase < DP_PHASE_COUNT ? dp_phase_name(w->phase) : "setup";
        snprintf(w->msg, sizeof w->msg, "%s %s: %s", w->dev->name, phase, dp_last_error());
    }
    dp_barrier_abort(&w->e->barrier);
}

// --- phase timing: marks on the device, one synchronise per job ------------------------

/* Marks kept before the older ones are read: a job of many micro-batches
 * waits for its device once per this many phase changes, not once per change. */
#define DP_MAX_MARKS 64

/* Adds the device time between consecutive marks to the phase each opened,
 * keeping the last mark as the start of what follows. Reading a mark waits
 * for the device to reach it. */
static dp_status fold_marks(worker *w)
{
    for (size_t i = 0; i + 1 < w->n_marks; i++) {
        double t = 0.0;
        if (w->marks[i].phase >= DP_PHASE_COUNT) continue; /* after a job's end */
        DP_TRY(dp_event_elapsed(w->marks[i].ev, w->marks[i + 1].ev, &t));
        w->phase_seconds[w->marks[i].phase] += t;
    }
    if (w->n_marks > 1) {
        struct phase_mark last = w->marks[w->n_marks - 1];
        w->marks[w->n_marks - 1] = w->marks[0];
        w->marks[0] = last;
        w->n_marks = 1;
    }
    return DP_OK;
}

/* Records an event on the worker's device as it enters phase p, or ends
 * the job (p = DP_PHASE_COUNT). A GPU queues the record behind the phase's
 * work and the host goes on: phase times come from the device without a
 * synchronise between phases (on a CPU device the record reads the clock). */
static dp_status mark(worker *w, int p)
{
    if (w->n_marks == DP_MAX_MARKS) DP_TRY(fold_marks(w));
    if (w->n_marks == w->cap_marks) {
        size_t cap = w->cap_marks ? 2 * w->cap_marks : 8;
        struct phase_mark *m = realloc(w->marks, cap * sizeof *m);
        if (!m) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "%s: cannot allocate phase marks", w->dev->name);
        memset(m + w->cap_marks, 0, (cap - w->cap_marks) * sizeof *m);
        w->marks = m;
        w->cap_marks = cap;
    }
    struct phase_mark *m = &w->marks[w->n_marks];
    if (!m->ev) DP_TRY(dp_event_create(w->dev, &m->ev));
    DP_TRY(dp_event_record(m->ev));
    m->phase = p;
    w->n_marks++;
    return DP_OK;
}

/* The memory peak of the phase being left (host-side accounting). */
static void close_phase(worker *w)
{
    if ((unsigned)w->phase >= DP_PHASE_COUNT) return;
    dp_memory_stats ms;
    dp_device_memory(w->dev, &ms);
    if (ms.peak_since_reset > w->phase_peak[w->phase]) w->phase_peak[w->phase] = ms.peak_since_reset;
}

/* Ends the job on this worker: the one wait for its device (a GPU's
 * asynchronous failure is reported by the job that caused it, and the
 * caller reads finished results), then the phase times from the marks. */
static void end_job(worker *w)
{
    close_phase(w);
    dp_status s = DP_OK;
    if (w->n_marks > 0 && w->status == DP_OK) s = mark(w, DP_PHASE_COUNT);
    if (s == DP_OK && w->status == DP_OK && !dp_device_is_host_memory(w->dev))
        s = dp_device_synchronize(w->dev);
    if (s == DP_OK && w->status == DP_OK) s = fold_marks(w);
    if (s != DP_OK) dp_worker_fail(w, s);
    w->n_marks = 0;
}

/* Destroys the marks' events (the threads have stopped, the devices are open). */
static void free_marks(worker *w)
{
    for (size_t i = 0; i < w->cap_marks; i++) dp_event_destroy(w->marks[i].ev);
    free(w->marks);
    w->marks = NULL;
    w->n_marks = w->cap_marks = 0;
}

/* Enters phase p; returns nonzero if an injected fault fires here. */
int dp_worker_enter_phase(worker *w, dp_phase p)
{
    close_phase(w);
    w->phase = p;
    w->phase_start = dp_now_seconds();
    if (w->phase_first[p] < 0.0) w->phase_first[p] = w->phase_start;
    dp_device_reset_peak(w->dev);
    dp_engine *e = w->e;
    atomic_store(&w->busy_phase, (int)p);
    if (e->cfg.watchdog_seconds > 0) {
        pthread_mutex_lock(&e->mu);
        e->last_progress = w->phase_start;
        pthread_mutex_unlock(&e->mu);
    }
    dp_status ms = mark(w, (int)p);
    if (ms != DP_OK) {
        dp_worker_fail(w, ms);
        return 1;
    }
    if (e->fault_dev == w->id && e->fault_phase == p) {
        /* Only this worker reads and clears its own fault. */
        dp_status s = e->fault_status;
        e->fault_phase = DP_PHASE_COUNT;
        dp_worker_fail(w, DP_FAIL(s, "injected fault (test hook)"));
        return 1;
    }
    if (e->stall_dev == w->id && e->stall_phase == p) {
        e->stall_phase = DP_PHASE_COUNT;
        /* An interruptible stand-in for a hung kernel or driver call: the
         * watchdog's abort ends it, and the watchdog reports the error. */
        if (dp_barrier_sleep(&e->barrier, e->stall_seconds) != 0) return 1;
    }
    return 0;
}

/* Waits at the barrier; the watchdog does not count a waiting worker as stuck. */
int dp_worker_sync(worker *w)
{
    int saved = atomic_exchange(&w->busy_phase, -1);
    int rc = dp_barrier_wait(&w->e->barrier);
    atomic_store(&w->busy_phase, saved);
    return rc;
}

// --- jobs: the workers' loop and the caller's wait -------------------------------------

/* Each worker waits for a job, runs it (engine.c) and reports back. */
static void *worker_main(void *arg)
{
    worker *w = arg;
    dp_engine *e = w->e;
    unsigned long seen = 0;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (e->job_gen == seen && !e->quit) pthread_cond_wait(&e->cv_start, &e->mu);
        if (e->quit) {
            pthread_mutex_unlock(&e->mu);
            break;
        }
        seen = e->job_gen;
        job_kind job = e->job;
        pthread_mutex_unlock(&e->mu);

        dp_engine_job(w, job);
        end_job(w);
        atomic_store(&w->busy_phase, -1);

        pthread_mutex_lock(&e->mu);
        if (--e->running == 0) pthread_cond_signal(&e->cv_done);
        pthread_mutex_unlock(&e->mu);
    }
    return NULL;
}

/* The caller's wait with a watchdog, mu held on entry and exit: when no
 * worker has entered a new phase for watchdog_seconds, the step is aborted
 * and the worker still busy is named. The abort wakes workers waiting at
 * the barrier (and the test hook's stall); a worker stuck inside a backend
 * call gets another watchdog period to return, after which the engine is
 * marked broken. */
static dp_status watch(dp_engine *e)
{
    double wd = e->cfg.watchdog_seconds;
    while (e->running > 0) {
        struct timespec ts = dp_deadline_at(e->last_progress + wd);
        int rc = pthread_cond_timedwait(&e->cv_done, &e->mu, &ts);
        if (rc != ETIMEDOUT || e->running == 0 || dp_now_seconds() < e->last_progress + wd) continue;
        int stuck = -1, phase = -1;
        for (size_t i = 0; i < e->k && stuck < 0; i++) {
            int p = atomic_load(&e->w[i].busy_phase);
            if (p >= 0) stuck = (int)i, phase = p;
        }
        char who[96];
        if (stuck >= 0)
            snprintf(who, sizeof who, "%s %s", e->w[stuck].dev->name,
                     dp_phase_name((dp_phase)phase));
        else
            snprintf(who, sizeof who, "engine");
        pthread_mutex_unlock(&e->mu);
        dp_barrier_abort(&e->barrier);
        pthread_mutex_lock(&e->mu);
        double grace = dp_now_seconds() + wd;
        while (e->running > 0) {
            struct timespec g = dp_deadline_at(grace);
            if (pthread_cond_timedwait(&e->cv_done, &e->mu, &g) == ETIMEDOUT) break;
        }
        if (e->running > 0) {
            e->broken = 1;
            return DP_FAIL(DP_ERR_TIMEOUT, "%s: no progress for %.3g s (watchdog) and the worker "
                           "has not returned since; this engine is unusable, destroy it", who, wd);
        }
        if (phase == DP_PHASE_OPTIMIZER || phase == DP_PHASE_BROADCAST)
            e->needs_sync |= DP_SYNC_FROM_OWNERS;
        return DP_FAIL(DP_ERR_TIMEOUT, "%s: no progress for %.3g s (watchdog); the step was "
                       "aborted and nothing was updated%s", who, wd,
                       phase == DP_PHASE_OPTIMIZER || phase == DP_PHASE_BROADCAST
                           ? " except possibly part of the optimizer step"
                           : "");
    }
    return DP_OK;
}

/* Runs a job on every worker and waits. Returns the first failure by device
 * index, with its message as this thread's last error. */
void dp_workers_reset_stats(dp_engine *e)
{
    for (size_t i = 0; i < e->k; i++) {
        worker *w = &e->w[i];
        w->loss_sum = 0.0;
        for (int p = 0; p < DP_PHASE_COUNT; p++) w->phase_first[p] = -1.0;
        memset(w->phase_seconds, 0, sizeof w->phase_seconds);
        memset(w->phase_peak, 0, sizeof w->phase_peak);
    }
    for (size_t j = 0; e->s && j < e->K; j++) e->s[j].sumsq = 0.0;
}

dp_status dp_workers_run(dp_engine *e, job_kind job)
{
    dp_barrier_reset(&e->barrier);
    for (size_t i = 0; i < e->k; i++) {
        worker *w = &e->w[i];
        w->status = DP_OK;
        w->msg[0] = '\0';
        w->phase = DP_PHASE_COUNT;
    }
    for (size_t i = 0; i < e->k; i++) atomic_store(&e->w[i].busy_phase, -1);
    pthread_mutex_lock(&e->mu);
    e->job = job;
    e->running = (int)e->k;
    e->job_gen++;
    e->last_progress = dp_now_seconds();
    pthread_cond_broadcast(&e->cv_start);
    dp_status timeout = DP_OK;
    if (e->cfg.watchdog_seconds > 0)
        timeout = watch(e); /* returns with mu held */
    else
        while (e->running > 0) pthread_cond_wait(&e->cv_done, &e->mu);
    pthread_mutex_unlock(&e->mu);
    if (timeout != DP_OK) return timeout;
    for (size_t i = 0; i < e->k; i++) {
        worker *w = &e->w[i];
        if (w->status != DP_OK) {
            if (w->fail_phase == DP_PHASE_OPTIMIZER || w->fail_phase == DP_PHASE_BROADCAST)
                e->needs_sync |= DP_SYNC_FROM_OWNERS;
            /* Re-raise the worker's message on the caller's thread. */
            return dp_error_raw(w->status, w->msg);
        }
    }
    return DP_OK;
}

// --- the pool --------------------------------------------------------------------------

void dp_workers_init(dp_engine *e)
{
    for (size_t i = 0; i < e->k; i++) atomic_init(&e->w[i].busy_phase, -1);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv_start, NULL);
    /* CLOCK_MONOTONIC: the watchdog's deadlines ignore wall-clock jumps. */
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&e->cv_done, &ca);
    pthread_condattr_destroy(&ca);
    dp_barrier_init(&e->barrier, (int)e->k);
}

dp_status dp_workers_start(dp_engine *e)
{
    for (size_t i = 0; i < e->k; i++) {
        if (pthread_create(&e->w[i].thread, NULL, worker_main, &e->w[i]) != 0)
            return DP_FAIL(DP_ERR_INTERNAL, "cannot start worker thread %zu", i);
        e->w[i].thread_started = 1;
    }
    return DP_OK;
}

void dp_workers_stop(dp_engine *e)
{
    pthread_mutex_lock(&e->mu);
    e->quit = 1;
    pthread_cond_broadcast(&e->cv_start);
    pthread_mutex_unlock(&e->mu);
    for (size_t i = 0; i < e->k; i++)
        if (e->w[i].thread_started) pthread_join(e->w[i].thread, NULL);
    for (size_t i = 0; i < e->k; i++) free_marks(&e->w[i]);
    dp_barrier_destroy(&e->barrier);
    pthread_cond_destroy(&e->cv_start);
    pthread_cond_destroy(&e->cv_done);
    pthread_mutex_destroy(&e->mu);
}

// --- test hooks ------------------------------------------------------------------------

void dp_engine_inject_fault(dp_engine *e, int device, dp_phase phase, dp_status status)
{
    if (!e) return;
    e->fault_dev = device;
    e->fault_status = status;
    e->fault_phase = phase;
}

void dp_engine_inject_stall(dp_engine *e, int device, dp_phase phase, double seconds)
{
    if (!e) return;
    e->stall_dev = device;
    e->stall_seconds = seconds;
    e->stall_phase = phase;
}

void dp_engine_inject_divergence(dp_engine *e, int device)
{
    if (e) atomic_store(&e->diverge_dev, device);
}

dp_status dp_engine_read_replica(dp_engine *e, size_t device, int grads, void *host)
{
    if (!e || device >= e->k || !host)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "no such device, or host NULL");
    worker *w = &e->w[device];
    size_t n = e->model.n_params;
    DP_TRY(dp_device_bind_thread(w->dev));
    if (grads) return dp_copy_d2h(w->dev, host, w->grads, n * sizeof(float));
    return dp_copy_d2h(w->dev, host, w->params, n * e->psize);
}
