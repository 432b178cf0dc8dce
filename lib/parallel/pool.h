/*
 * parallel/pool.h - the worker pool: k persistent threads, one per local
 * device, created once. The caller's thread posts a job (a function and
 * its argument) and waits for every worker to finish it; inside a job the
 * workers meet between phases at an abortable barrier. A failing worker
 * records its device, phase and message in its own slot and aborts the
 * barrier, so every worker returns and the caller gets the first failure
 * by device index. The caller's wait carries the watchdog; the test hooks
 * (engine_testing.h) fire as a worker enters a phase. The pool knows
 * nothing of what a job does.
 */
#ifndef DP_PARALLEL_POOL_H
#define DP_PARALLEL_POOL_H

#include "parallel/state.h"

/* Initialises the pool of the k workers w (their dev set later), its
 * locks and barrier; no thread yet. */
void dp_pool_init(dp_pool *p, worker *w, size_t k, double watchdog_seconds);
/* Starts one thread per worker (the devices are open). */
dp_status dp_pool_start(dp_pool *p);
/* Stops and joins the threads and destroys the locks; safe after a partial start. */
void dp_pool_stop(dp_pool *p);

/* Runs fn(w, arg) on every worker and waits (with the watchdog). Returns
 * the first failure by device index, with its message as this thread's
 * last error; *failed (may be NULL) gets the phase it failed in
 * (DP_PHASE_COUNT: none, or outside the step's phases). */
dp_status dp_pool_run(dp_pool *p, dp_pool_fn fn, void *arg, dp_phase *failed);
/* The same, and while the job runs the caller calls beside(beside_arg)
 * (parallel/rounds.c: moving data between the ranks): again after the
 * seconds it returns (INFINITY: after the workers' next progress mark,
 * dp_barrier_notify), until it returns a negative value or the job ends or
 * is aborted. */
dp_status dp_pool_run_beside(dp_pool *p, dp_pool_fn fn, void *arg, dp_phase *failed,
                             double (*beside)(void *), void *beside_arg);
/* Whether some worker is inside a phase now (not waiting at the barrier
 * or for other workers' progress, nor done). */
int dp_pool_busy(dp_pool *p);
/* Clears the step's phase figures (times, peaks, spans); a step made of
 * several jobs clears them once, before the first. origin: the step's
 * start (host monotonic seconds), from which its spans count. */
void dp_pool_reset_stats(dp_pool *p, double origin);
/* Whether a worker never came back after a watchdog abort (the engine is
 * then unusable). */
static inline int dp_pool_broken(const dp_pool *p) { return p->broken; }

/* Records this worker's failure (device, phase, last error) and aborts the
 * barrier so nobody waits for it. */
void dp_worker_fail(worker *w, dp_status s);
/* Enters phase p (timing, memory peaks, watchdog progress, test hooks);
 * nonzero when the job must end here (an injected fault or an abort). */
int dp_worker_enter_phase(worker *w, dp_phase p);
/* Makes p the worker's phase for the timing (not a test hook's entry):
 * the overlap's reduce inside the backward, and back. */
dp_status dp_worker_switch_phase(worker *w, dp_phase p);
/* Names phase p as the worker's current one without entering it (no
 * timing, no test hooks): the re-synchronisations outside a step. */
static inline void dp_worker_set_phase(worker *w, dp_phase p) { w->phase = p; }
/* Waits at most `seconds` for the other workers' progress
 * (dp_barrier_await: 0, or nonzero when the job was aborted), as a
 * waiting worker, not a stuck one; the watchdog counts again from its
 * return. */
int dp_worker_await_progress(worker *w, unsigned long *seen, double seconds);
/* Waits for every worker at the barrier; nonzero when the job was aborted. */
int dp_worker_sync(worker *w);
/* The same, and the last worker to arrive runs fn(arg) before any goes on
 * (short work on every worker's results: dp_barrier_wait_then). */
int dp_worker_sync_then(worker *w, void (*fn)(void *), void *arg);

/* Inside a job function (void): leave it when the phase hook, the barrier
 * or a call says so; CHECK records the failure first. */
#define ENTER(w, p)                                \
    do {                                           \
        if (dp_worker_enter_phase((w), (p))) return; \
    } while (0)
#define SYNC(w)                                \
    do {                                       \
        if (dp_worker_sync(w) != 0) return;    \
    } while (0)
#define CHECK(w, expr)                   \
    do {                                 \
        dp_status chk_s_ = (expr);       \
        if (chk_s_ != DP_OK) {           \
            dp_worker_fail((w), chk_s_); \
            return;                      \
        }                                \
    } while (0)

#endif /* DP_PARALLEL_POOL_H */
