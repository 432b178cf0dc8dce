/*
 * parallel/pool.c - the worker pool (pool.h): the threads, the jobs, the
 * phase timing, the watchdog and the test hooks' firing.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "parallel/pool.h"

// --- phases and worker failure ----------------------------------------------------

const char *dp_phase_name(dp_phase phase)
{
    static const char *names[DP_PHASE_COUNT] = {"scatter",  "forward",   "criterion", "backward",
                                                "reduce",   "optimizer", "broadcast"};
    return (unsigned)phase < DP_PHASE_COUNT ? names[phase] : "invalid phase";
}

/* Records this worker's failure and aborts the barrier so nobody waits for it. */
void dp_worker_fail(worker *w, dp_status s)
{
    if (w->status == DP_OK) {
        w->status = s;
        w->fail_phase = w->phase;
        /* Outside the step's phases a worker is setting up its replica. */
        const char *phase = w->phase < DP_PHASE_COUNT ? dp_phase_name(w->phase) : "setup";
        char joined[sizeof w->msg + 128];
        int n = snprintf(joined, sizeof joined, "%s %s: %s", w->dev->name, phase,
                         dp_last_error());
        /* Fitted, not cut: the message's end names the fix. */
        dp_error_fit(w->msg, sizeof w->msg, joined, n > 0 ? strlen(joined) : 0);
    }
    dp_barrier_abort(&w->pool->barrier);
}

// --- phase timing: marks on the device, one synchronise per job ------------------------

/* Marks kept before the older ones are read: a job of many micro-batches
 * waits for its device once per this many phase changes, not once per change. */
#define DP_MAX_MARKS 64

/* Appends a span of phase ph, or lengthens the last one where ph runs on
 * from it (a phase entered again without a change: no new stretch). */
static dp_status add_span(worker *w, int ph, double start, double seconds)
{
    if (w->n_spans) {
        dp_phase_span *last = &w->spans[w->n_spans - 1];
        if ((int)last->phase == ph && last->start + last->seconds == start) {
            last->seconds += seconds;
            return DP_OK;
        }
    }
    if (w->n_spans == w->cap_spans) {
        size_t cap = w->cap_spans ? 2 * w->cap_spans : 32;
        dp_phase_span *sp = realloc(w->spans, cap * sizeof *sp);
        if (!sp) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "%s: cannot allocate phase spans", w->dev->name);
        w->spans = sp;
        w->cap_spans = cap;
    }
    w->spans[w->n_spans++] = (dp_phase_span){(dp_phase)ph, start, seconds};
    return DP_OK;
}

/* Adds the device time between consecutive marks to the phase each opened
 * and to the step's spans, keeping the last mark as the start of what
 * follows. Reading a mark waits for the device to reach it. A job's first
 * mark is placed on the step's timeline at its host time (a job starts on
 * an idle device: the last one ended with a synchronise), each later one
 * by the device's time since the one before. */
static dp_status fold_marks(worker *w)
{
    double origin = w->pool->origin;
    if (w->n_marks && w->marks[0].when < 0.0) w->marks[0].when = w->marks[0].at - origin;
    for (size_t i = 0; i + 1 < w->n_marks; i++) {
        struct phase_mark *m = &w->marks[i], *next = &w->marks[i + 1];
        double t = 0.0;
        if (m->phase >= DP_PHASE_COUNT) { /* after a job's end */
            next->when = next->at - origin;
            continue;
        }
        DP_TRY(dp_event_elapsed(m->ev, next->ev, &t));
        w->phase_seconds[m->phase] += t;
        next->when = m->when + t;
        DP_TRY(add_span(w, m->phase, m->when, t));
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
    m->at = dp_now_seconds();
    m->when = -1.0;
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
    free(w->spans);
    w->spans = NULL;
    w->n_spans = w->cap_spans = 0;
}

/* Makes ph the worker's phase: timing, memory peak, watchdog progress. */
static dp_status switch_phase(worker *w, dp_phase ph)
{
    dp_pool *p = w->pool;
    close_phase(w);
    w->phase = ph;
    w->phase_start = dp_now_seconds();
    if (w->phase_first[ph] < 0.0) w->phase_first[ph] = w->phase_start;
    dp_device_reset_peak(w->dev);
    atomic_store(&w->busy_phase, (int)ph);
    if (p->watchdog_seconds > 0) {
        pthread_mutex_lock(&p->mu);
        p->last_progress = w->phase_start;
        pthread_mutex_unlock(&p->mu);
    }
    return mark(w, (int)ph);
}

dp_status dp_worker_switch_phase(worker *w, dp_phase ph)
{
    return w->phase == ph ? DP_OK : switch_phase(w, ph);
}

/* Enters phase ph; returns nonzero if an injected fault fires here. */
int dp_worker_enter_phase(worker *w, dp_phase ph)
{
    dp_pool *p = w->pool;
    dp_status ms = switch_phase(w, ph);
    if (ms != DP_OK) {
        dp_worker_fail(w, ms);
        return 1;
    }
    if (p->fault_dev == w->id && p->fault_phase == ph) {
        /* Only this worker reads and clears its own fault. */
        dp_status s = p->fault_status;
        p->fault_phase = DP_PHASE_COUNT;
        dp_worker_fail(w, DP_FAIL(s, "injected fault (test hook)"));
        return 1;
    }
    if (p->stall_dev == w->id && p->stall_phase == ph) {
        p->stall_phase = DP_PHASE_COUNT;
        /* An interruptible stand-in for a hung kernel or driver call: the
         * watchdog's abort ends it, and the watchdog reports the error. */
        if (dp_barrier_sleep(&p->barrier, p->stall_seconds) != 0) return 1;
    }
    return 0;
}

int dp_worker_await_progress(worker *w, unsigned long *seen, double seconds)
{
    dp_pool *p = w->pool;
    int saved = atomic_exchange(&w->busy_phase, -1);
    int rc = dp_barrier_await(&p->barrier, seen, seconds);
    if (p->watchdog_seconds > 0) {
        pthread_mutex_lock(&p->mu);
        p->last_progress = dp_now_seconds();
        pthread_mutex_unlock(&p->mu);
    }
    atomic_store(&w->busy_phase, saved);
    return rc;
}

/* Waits at the barrier; the watchdog does not count a waiting worker as stuck. */
int dp_worker_sync(worker *w) { return dp_worker_sync_then(w, NULL, NULL); }

int dp_worker_sync_then(worker *w, void (*fn)(void *), void *arg)
{
    int saved = atomic_exchange(&w->busy_phase, -1);
    int rc = dp_barrier_wait_then(&w->pool->barrier, fn, arg);
    atomic_store(&w->busy_phase, saved);
    return rc;
}

// --- jobs: the workers' loop and the caller's wait -------------------------------------

/* Each worker waits for a job, runs its function and reports back. */
static void *worker_main(void *arg)
{
    worker *w = arg;
    dp_pool *p = w->pool;
    unsigned long seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (p->job_gen == seen && !p->quit) pthread_cond_wait(&p->cv_start, &p->mu);
        if (p->quit) {
            pthread_mutex_unlock(&p->mu);
            break;
        }
        seen = p->job_gen;
        dp_pool_fn fn = p->fn;
        void *fn_arg = p->arg;
        pthread_mutex_unlock(&p->mu);

        fn(w, fn_arg);
        end_job(w);
        atomic_store(&w->busy_phase, -1);

        pthread_mutex_lock(&p->mu);
        int last = --p->running == 0;
        if (last) pthread_cond_signal(&p->cv_done);
        pthread_mutex_unlock(&p->mu);
        /* A caller working beside the job waits on the barrier's progress. */
        if (last) dp_barrier_notify(&p->barrier);
    }
    return NULL;
}

/* The caller's wait with a watchdog, mu held on entry and exit: when no
 * worker has entered a new phase for watchdog_seconds, the step is aborted
 * and the worker still busy is named. The abort wakes workers waiting at
 * the barrier (and the test hook's stall); a worker stuck inside a backend
 * call gets another watchdog period to return, after which the engine is
 * marked broken. */
static dp_status watch(dp_pool *p, dp_phase *failed)
{
    double wd = p->watchdog_seconds;
    while (p->running > 0) {
        struct timespec ts = dp_deadline_at(p->last_progress + wd);
        int rc = pthread_cond_timedwait(&p->cv_done, &p->mu, &ts);
        if (rc != ETIMEDOUT || p->running == 0 || dp_now_seconds() < p->last_progress + wd) continue;
        int stuck = -1, phase = -1;
        for (size_t i = 0; i < p->k && stuck < 0; i++) {
            int ph = atomic_load(&p->w[i].busy_phase);
            if (ph >= 0) stuck = (int)i, phase = ph;
        }
        char who[96];
        if (stuck >= 0)
            snprintf(who, sizeof who, "%s %s", p->w[stuck].dev->name,
                     dp_phase_name((dp_phase)phase));
        else
            snprintf(who, sizeof who, "engine");
        pthread_mutex_unlock(&p->mu);
        dp_barrier_abort(&p->barrier);
        pthread_mutex_lock(&p->mu);
        double grace = dp_now_seconds() + wd;
        while (p->running > 0) {
            struct timespec g = dp_deadline_at(grace);
            if (pthread_cond_timedwait(&p->cv_done, &p->mu, &g) == ETIMEDOUT) break;
        }
        if (p->running > 0) {
            p->broken = 1;
            return DP_FAIL(DP_ERR_TIMEOUT, "%s: no progress for %.3g s (watchdog) and the worker "
                           "has not returned since; this engine is unusable, destroy it", who, wd);
        }
        *failed = (dp_phase)phase;
        return DP_FAIL(DP_ERR_TIMEOUT, "%s: no progress for %.3g s (watchdog); the step was "
                       "aborted and nothing was updated%s", who, wd,
                       phase == DP_PHASE_OPTIMIZER || phase == DP_PHASE_BROADCAST
                           ? " except possibly part of the optimizer step"
                           : "");
    }
    return DP_OK;
}

void dp_pool_reset_stats(dp_pool *p, double origin)
{
    p->origin = origin;
    for (size_t i = 0; i < p->k; i++) {
        worker *w = &p->w[i];
        w->n_spans = 0;
        for (int ph = 0; ph < DP_PHASE_COUNT; ph++) w->phase_first[ph] = -1.0;
        memset(w->phase_seconds, 0, sizeof w->phase_seconds);
        memset(w->phase_peak, 0, sizeof w->phase_peak);
        w->backward_end = -1.0;
        w->replayed = 0;
    }
}

int dp_pool_busy(dp_pool *p)
{
    for (size_t i = 0; i < p->k; i++)
        if (atomic_load(&p->w[i].busy_phase) >= 0) return 1;
    return 0;
}

/* The caller's work beside the job, until beside says it is done, the job
 * ends or is aborted, or the watchdog is due (left to watch): beside runs
 * after each of the workers' progress marks, or after the wait it asked
 * for. Waiting for a transport is not stalling: the watchdog counts only
 * while some worker is busy, and beside bounds its own waits. */
static void work_beside(dp_pool *p, double (*beside)(void *), void *arg)
{
    unsigned long seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        int running = p->running;
        double due = p->last_progress + p->watchdog_seconds;
        pthread_mutex_unlock(&p->mu);
        if (!running) return;
        double wait = beside(arg);
        if (wait < 0) return;
        if (p->watchdog_seconds > 0) {
            /* A worker may turn busy without a progress mark: look again
             * by the deadline whatever beside asked. */
            double left = due - dp_now_seconds();
            if (left <= 0 && dp_pool_busy(p)) return;
            if (left <= 0) left = p->watchdog_seconds;
            if (wait > left) wait = left;
        }
        if (dp_barrier_await(&p->barrier, &seen, wait) != 0) return;
    }
}

dp_status dp_pool_run(dp_pool *p, dp_pool_fn fn, void *arg, dp_phase *failed)
{
    return dp_pool_run_beside(p, fn, arg, failed, NULL, NULL);
}

dp_status dp_pool_run_beside(dp_pool *p, dp_pool_fn fn, void *arg, dp_phase *failed,
                             double (*beside)(void *), void *beside_arg)
{
    dp_phase none;
    if (!failed) failed = &none;
    *failed = DP_PHASE_COUNT;
    dp_barrier_reset(&p->barrier);
    for (size_t i = 0; i < p->k; i++) {
        worker *w = &p->w[i];
        w->status = DP_OK;
        w->msg[0] = '\0';
        w->phase = DP_PHASE_COUNT;
    }
    for (size_t i = 0; i < p->k; i++) atomic_store(&p->w[i].busy_phase, -1);
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->running = (int)p->k;
    p->job_gen++;
    p->last_progress = dp_now_seconds();
    pthread_cond_broadcast(&p->cv_start);
    if (beside) {
        pthread_mutex_unlock(&p->mu);
        work_beside(p, beside, beside_arg);
        pthread_mutex_lock(&p->mu);
    }
    dp_status timeout = DP_OK;
    if (p->watchdog_seconds > 0)
        timeout = watch(p, failed); /* returns with mu held */
    else
        while (p->running > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
    if (timeout != DP_OK) return timeout;
    for (size_t i = 0; i < p->k; i++) {
        worker *w = &p->w[i];
        if (w->status != DP_OK) {
            *failed = w->fail_phase;
            /* Re-raise the worker's message on the caller's thread. */
            return dp_error_raw(w->status, w->msg);
        }
    }
    return DP_OK;
}

// --- the pool --------------------------------------------------------------------------

void dp_pool_init(dp_pool *p, worker *w, size_t k, double watchdog_seconds)
{
    p->k = k;
    p->w = w;
    p->watchdog_seconds = watchdog_seconds;
    p->fault_phase = DP_PHASE_COUNT;
    p->stall_dev = -1;
    p->stall_phase = DP_PHASE_COUNT;
    atomic_init(&p->diverge_dev, -1);
    for (size_t i = 0; i < k; i++) {
        w[i].pool = p;
        atomic_init(&w[i].busy_phase, -1);
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_start, NULL);
    /* CLOCK_MONOTONIC: the watchdog's deadlines ignore wall-clock jumps. */
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cv_done, &ca);
    pthread_condattr_destroy(&ca);
    dp_barrier_init(&p->barrier, (int)k);
}

dp_status dp_pool_start(dp_pool *p)
{
    for (size_t i = 0; i < p->k; i++) {
        int rc = pthread_create(&p->w[i].thread, NULL, worker_main, &p->w[i]);
        /* EAGAIN: out of threads or of memory for a stack, the user's limit */
        if (rc == EAGAIN)
            return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot start worker thread %zu of %zu: %s; "
                           "the process is at its limit of threads (ulimit -u) or memory; "
                           "raise it, or use fewer devices", i, p->k, strerror(rc));
        if (rc != 0)
            return DP_FAIL(DP_ERR_INTERNAL, "cannot start worker thread %zu of %zu: %s", i, p->k,
                           strerror(rc));
        p->w[i].thread_started = 1;
    }
    return DP_OK;
}

void dp_pool_stop(dp_pool *p)
{
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    for (size_t i = 0; i < p->k; i++)
        if (p->w[i].thread_started) pthread_join(p->w[i].thread, NULL);
    for (size_t i = 0; i < p->k; i++) free_marks(&p->w[i]);
    dp_barrier_destroy(&p->barrier);
    pthread_cond_destroy(&p->cv_start);
    pthread_cond_destroy(&p->cv_done);
    pthread_mutex_destroy(&p->mu);
}
