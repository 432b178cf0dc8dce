/*
 * parallel/overlap.c - the reduce-scatter overlapped with the backward
 * (overlap.h), and dp_grads_ready (dp/model.h).
 *
 * Each worker's watermark says where its final gradient begins: n_params
 * before its last backward, lower after each accepted signal, 0 once its
 * compute is done. [max over the contributing devices' watermarks,
 * n_params) is final everywhere, so its part of a slice can be summed on
 * the slice's owner. The watermarks are atomics (release on the signal,
 * acquire on the reducer): the gradient written before a signal is
 * visible to the reducer that read the watermark, and on a GPU the
 * reducer's copies wait for the work queued on the source so far
 * (dp_copy_peer), which includes it, as its adds wait for the owner's
 * (dp_device_order); they run on the owner's communication queue, beside
 * its backward, and the reducer waits for them before its job ends
 * (dp_comm_settle).
 */
#include <stdarg.h>
#include <stdio.h>

#include "parallel/comm.h"
#include "parallel/overlap.h"
#include "parallel/pool.h"
#include "parallel/rounds.h"

static int decide(const dp_engine *e, int train)
{
    if (!train || e->L.K < 2 || e->bucket_floats == SIZE_MAX) return 0;
    /* A GPU needs a communication queue (worker.comm): on its compute
     * stream the sums would run interleaved with its backward rather than
     * beside it. */
    for (size_t i = 0; i < e->L.k; i++)
        if (!dp_device_is_host_memory(e->w[i].dev) && e->w[i].comm == e->w[i].dev) return 0;
    return 1;
}

int dp_overlap_begin_step(dp_engine *e, int train)
{
    e->overlapping = decide(e, train);
    if (!train) return 0;
    for (size_t i = 0; i < e->L.k; i++) atomic_store(&e->w[i].ready_from, e->model.n_params);
    for (size_t j = 0; e->s && j < e->L.K; j++) e->s[j].reduced_from = e->s[j].end;
    return e->overlapping;
}

// --- the signal -------------------------------------------------------------------------

void dp_overlap_arm(worker *w, dp_chunk *chunk, int last)
{
    struct dp_grads_signal *g = &w->signal;
    g->w = w;
    g->next_end = w->e->model.n_params;
    /* Earlier micro-batches' gradients are not final, and without the
     * overlap nothing is summed early: their signals are only checked. */
    g->publish = last && chunk->training && w->e->overlapping;
    g->refused = DP_OK;
    g->msg[0] = '\0';
    chunk->ready = g;
}

dp_status dp_overlap_disarm(worker *w, int report)
{
    struct dp_grads_signal *g = &w->signal;
    g->w = NULL;
    if (g->refused == DP_OK || !report) return DP_OK;
    return DP_FAIL(g->refused, "the backward returned DP_OK after dp_grads_ready refused a "
                   "signal (return its status): %s", g->msg);
}

static void publish(worker *w, size_t from)
{
    atomic_store_explicit(&w->ready_from, from, memory_order_release);
    dp_barrier_notify(&w->pool->barrier);
}

void dp_overlap_final(worker *w) { publish(w, 0); }

/* Sums what is final of worker w's slices: everything (a drain once every
 * device is done), or the pieces of at least a bucket and the slices'
 * last pieces. *left: whether some of its slices are not summed yet. */
static dp_status reduce_ready(worker *w, int *left)
{
    dp_engine *e = w->e;
    /* With ranks the pieces are the rounds that arrived (rounds.h). */
    if (dp_transport_spans_ranks(&e->tp)) return dp_rounds_reduce(w, left);
    const dp_plan *plan = &e->plan;
    size_t ready = 0; /* the least advanced contributing device's watermark */
    for (size_t g = 0; g < e->L.K; g++) {
        if (!dp_plan_contributes(plan, g)) continue;
        size_t r = atomic_load_explicit(&e->w[g].ready_from, memory_order_acquire);
        if (r > ready) ready = r;
    }
    *left = 0;
    dp_phase was = w->phase;
    for (size_t j = 0; j < e->L.K; j++) {
        slice *sl = &e->s[j];
        if (sl->reducer != w->id || sl->reduced_from == sl->begin) continue;
        size_t lo = ready > sl->begin ? ready : sl->begin;
        if (lo > sl->begin) *left = 1;
        if (lo >= sl->reduced_from) continue;
        if (lo > sl->begin && sl->reduced_from - lo < e->bucket_floats) continue;
        DP_TRY(dp_worker_switch_phase(w, DP_PHASE_REDUCE));
        DP_TRY(dp_comm_reduce_range(e, plan, sl, lo, sl->reduced_from, 0));
        sl->reduced_from = lo;
    }
    return dp_worker_switch_phase(w, was);
}

/* Records a refused signal: the model gets the status, and the engine
 * fails the step with it when the backward returns (dp_overlap_disarm). */
__attribute__((format(printf, 2, 3))) static void refuse(struct dp_grads_signal *g,
                                                         const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->msg, sizeof g->msg, fmt, ap);
    va_end(ap);
    g->refused = DP_ERR_INVALID_ARGUMENT;
}

dp_status dp_grads_ready(const dp_chunk *chunk, size_t begin, size_t end)
{
    if (!chunk) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "chunk must not be NULL");
    struct dp_grads_signal *g = chunk->ready;
    if (!g) return DP_OK; /* a backward called by hand, outside the engine */
    if (!g->w)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "the chunk's backward has returned (chunk->ready is stale); call it "
                       "from the model's backward with the chunk it was given");
    worker *w = g->w;
    /* The sums run on the worker's device, bound to its thread. */
    if (!pthread_equal(pthread_self(), w->thread))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "called from another thread than the backward's; call it from the "
                       "model's backward itself");
    if (g->refused != DP_OK) return DP_FAIL(g->refused, "%s", g->msg);
    size_t n = w->e->model.n_params;
    if (begin > end)
        refuse(g, "range [%zu, %zu) is reversed (begin > end)", begin, end);
    else if (end > n)
        refuse(g, "range [%zu, %zu) ends past the gradient buffer's n_params (%zu)", begin, end,
               n);
    else if (end != g->next_end)
        refuse(g, "range [%zu, %zu) does not end where the previous signal began (%zu): signal "
                  "the final ranges back to front, each once, the first ending at n_params "
                  "(%zu)",
               begin, end, g->next_end, n);
    if (g->refused != DP_OK) return DP_FAIL(g->refused, "%s", g->msg);
    g->next_end = begin;
    if (!g->publish) return DP_OK;
    publish(w, begin);
    int left;
    return reduce_ready(w, &left);
}

// --- the drain -----------------------------------------------------------------------------

int dp_overlap_drain(worker *w, const dp_plan *plan)
{
    (void)plan; /* the running step's, e->plan */
    /* Waiting for the others' backward counts in the backward, as at the
     * barrier that ends it; only the sums count in the reduce (and the
     * reduce stage enters it, with its test hooks, as without overlap). */
    dp_barrier *b = &w->pool->barrier;
    unsigned long seen = 0;
    for (;;) {
        /* Read the progress count before the watermarks: a signal after
         * the read moves the count, and the wait below returns at once. */
        if (dp_barrier_await(b, &seen, 0.0) != 0) return 1;
        int left;
        dp_status s = reduce_ready(w, &left);
        if (s != DP_OK) {
            dp_worker_fail(w, s);
            return 1;
        }
        if (!left) return 0;
        /* Like the barrier's waiters, a waiting worker is not a stuck one. */
        if (dp_worker_await_progress(w, &seen, 1.0) != 0) return 1;
    }
}
