/*
 * parallel/rounds.c - the reduce-scatter's rounds between the ranks
 * (rounds.h): cut at setup, moved by the caller beside a job, summed by
 * the reducers as they arrive.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/clock.h"
#include "parallel/comm.h"
#include "parallel/pool.h"
#include "parallel/rounds.h"

/* How often the caller tests the rounds in flight (MPI moves a large
 * message only while a call of this rank's progresses it): from 50 us
 * after anything moved, doubling to 1 ms while nothing does, so a caller
 * waiting for a slower rank leaves the cores to the workers. */
#define DP_ROUNDS_POLL_MIN 50e-6
#define DP_ROUNDS_POLL_MAX 1e-3

static const char *const what = "reduce-scatter between the ranks";

// --- setup ------------------------------------------------------------------------------

/* A forward round's messages (m NULL: only counted): for slice j's piece
 * [b, b + len), every local device's piece when another rank sums the
 * slice, or every other rank's device's piece into staging half `half`
 * when this rank does; listed by device on both sides, so each pair of
 * ranks matches them in order. */
static size_t messages(const dp_engine *e, size_t j, size_t b, size_t len, int half, dp_xfer *m)
{
    const slice *sl = &e->s[j];
    worker *o = dp_local_worker(e, (size_t)sl->summer);
    size_t n = 0;
    for (size_t d = 0; d < e->L.K; d++) {
        worker *wd = dp_local_worker(e, d);
        if (!o && wd) {
            if (m) m[n] = (dp_xfer){(size_t)wd->id, (size_t)sl->summer, 1, wd->grads + b,
                                    len * sizeof(float)};
            n++;
        } else if (o && !wd) {
            if (m) m[n] = (dp_xfer){(size_t)o->id, d, 0, dp_comm_remote_chunk(e, sl, d, half),
                                    len * sizeof(float)};
            n++;
        }
    }
    return n;
}

/* A return round's message: the summed piece [b, b + len) from the
 * summer's gradient to the owner's, where either is on this rank. */
static size_t return_message(const dp_engine *e, size_t j, size_t b, size_t len, dp_xfer *m)
{
    const slice *sl = &e->s[j];
    worker *o = dp_local_worker(e, (size_t)sl->owner), *su = dp_local_worker(e, (size_t)sl->summer);
    if (su && m) *m = (dp_xfer){(size_t)su->id, (size_t)sl->owner, 1, su->grads + b,
                                len * sizeof(float)};
    if (o && m) *m = (dp_xfer){(size_t)o->id, (size_t)sl->summer, 0, o->grads + b,
                               len * sizeof(float)};
    return o || su;
}

/* The forward rounds in order into out (NULL: only counted): slices last
 * to first, each one's pieces of c floats (from its begin) last to first;
 * then, for the pieces summed elsewhere than at their owner, the return
 * rounds in the same order. Returns the count; *n_fwd the forward ones. */
static size_t cut(dp_engine *e, size_t c, dp_round *out, size_t *n_fwd)
{
    size_t r = 0, returns = 0;
    for (size_t j = e->L.K; j-- > 0;) {
        const slice *sl = &e->s[j];
        size_t len = sl->end - sl->begin, pieces = (len + c - 1) / c;
        if (sl->summer != sl->owner) returns += pieces;
        for (size_t i = pieces; i-- > 0; r++) {
            if (!out) continue;
            size_t b = sl->begin + i * c, end = b + c < sl->end ? b + c : sl->end;
            int mine = dp_local_worker(e, (size_t)sl->summer) != NULL;
            out[r] = (dp_round){.slice = j, .begin = b, .end = end, .recvs = mine,
                                .half = (int)(i % 2), .pair = SIZE_MAX,
                                /* piece i + 2 came two rounds earlier */
                                .prev = i + 2 < pieces ? r - 2 : SIZE_MAX};
            atomic_init(&out[r].state, DP_ROUND_IDLE);
        }
    }
    *n_fwd = r;
    if (!out) return r + returns;
    for (size_t f = 0; f < *n_fwd; f++) {
        const slice *sl = &e->s[out[f].slice];
        if (sl->summer == sl->owner) continue;
        out[r] = (dp_round){.slice = out[f].slice, .begin = out[f].begin, .end = out[f].end,
                            .ret = 1, .recvs = dp_local_worker(e, (size_t)sl->owner) != NULL,
                            .pair = f, .prev = SIZE_MAX};
        atomic_init(&out[r].state, DP_ROUND_IDLE);
        out[f].pair = r++;
    }
    return r;
}

/* For a transport whose messages match in the order posted (NCCL): one
 * order of every round, the same on every rank. The forward rounds in
 * order, each piece's return right after the forward round two later,
 * whose receives need that piece summed anyway (its staging half); the
 * last two returns at the end. The forward rounds keep their order among
 * themselves and the returns theirs. */
static dp_status sequence(dp_engine *e)
{
    size_t n = 0, F = e->n_fwd_rounds;
    e->round_seq = malloc((e->n_rounds ? e->n_rounds : 1) * sizeof *e->round_seq);
    if (!e->round_seq)
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation of %zu rounds failed", e->n_rounds);
    for (size_t f = 0; f < F; f++) {
        e->round_seq[n++] = f;
        if (f >= 2 && e->rounds[f - 2].pair != SIZE_MAX) e->round_seq[n++] = e->rounds[f - 2].pair;
    }
    for (size_t f = F >= 2 ? F - 2 : 0; f < F; f++)
        if (e->rounds[f].pair != SIZE_MAX) e->round_seq[n++] = e->rounds[f].pair;
    if (n != e->n_rounds)
        return DP_FAIL(DP_ERR_INTERNAL, "the rounds' order has %zu of %zu rounds", n, e->n_rounds);
    return DP_OK;
}

dp_status dp_rounds_setup(dp_engine *e)
{
    size_t c = dp_transport_round_floats(&e->tp), n_fwd;
    if (!dp_transport_spans_ranks(&e->tp) || !c) return DP_OK; /* nothing crosses */
    size_t n = cut(e, c, NULL, &n_fwd);
    e->rounds = calloc(n ? n : 1, sizeof *e->rounds);
    if (!e->rounds) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation of %zu rounds failed", n);
    e->n_rounds = cut(e, c, e->rounds, &e->n_fwd_rounds);
    size_t total = 0;
    for (int pass = 0; pass < 2; pass++) {
        total = 0;
        for (size_t r = 0; r < e->n_rounds; r++) {
            dp_round *x = &e->rounds[r];
            dp_xfer *m = pass ? e->xfers + total : NULL;
            x->at = total;
            x->n = x->ret ? return_message(e, x->slice, x->begin, x->end - x->begin, m)
                          : messages(e, x->slice, x->begin, x->end - x->begin, x->half, m);
            total += x->n;
        }
        if (pass) break;
        e->xfers = malloc((total ? total : 1) * sizeof *e->xfers);
        if (!e->xfers)
            return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation of %zu messages failed", total);
    }
    if (dp_transport_in_order(&e->tp)) DP_TRY(sequence(e));
    e->xspans = malloc(e->n_rounds * sizeof *e->xspans);
    if (!e->xspans)
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation of %zu spans failed", e->n_rounds);
    return DP_OK;
}

void dp_rounds_begin_step(dp_engine *e)
{
    for (size_t r = 0; r < e->n_rounds; r++) atomic_store(&e->rounds[r].state, DP_ROUND_IDLE);
    e->round_next = e->round_first_out = 0;
    e->ret_next = e->n_fwd_rounds;
    e->seq_next = 0;
    e->round_status = DP_OK;
    e->round_active = dp_now_seconds();
    e->round_seen = dp_barrier_progress(&e->pool.barrier);
    e->round_poll = DP_ROUNDS_POLL_MIN;
}

// --- the caller -------------------------------------------------------------------------

/* Where this rank's final gradient begins: the least advanced local
 * device's watermark (overlap.h). */
static size_t final_from(const dp_engine *e)
{
    size_t from = 0;
    for (size_t i = 0; i < e->L.k; i++) {
        size_t r = atomic_load_explicit(&e->w[i].ready_from, memory_order_acquire);
        if (r > from) from = r;
    }
    return from;
}

static dp_status start(dp_engine *e, dp_round *r)
{
    r->started = dp_now_seconds();
    DP_TRY(dp_transport_start(&e->tp, (size_t)(r - e->rounds), what));
    atomic_store_explicit(&r->state, DP_ROUND_STARTED, memory_order_release);
    return DP_OK;
}

/* Whether forward round r may start: constrained (while the job runs),
 * once this rank's part of it is final (final: final_from) and, where it
 * receives, the staging half is free (the round before it into that half
 * summed); else the job is over and anything may go. Receives wait for
 * this rank's part too: posted early they would keep the caller testing
 * them through the forward. */
static int forward_may(const dp_engine *e, const dp_round *r, int constrained, size_t final)
{
    if (!constrained) return 1;
    if (final > r->begin) return 0;
    return !r->recvs || r->prev == SIZE_MAX ||
           atomic_load_explicit(&e->rounds[r->prev].state, memory_order_acquire) ==
               DP_ROUND_REDUCED;
}

/* Whether return round r may start: a sum leaves once its reducer summed
 * it, unless the job is over; it arrives only once the owner's own piece
 * has left, whose memory it overwrites. */
static int return_may(const dp_engine *e, const dp_round *r, int constrained)
{
    int fwd = atomic_load_explicit(&e->rounds[r->pair].state, memory_order_acquire);
    if (r->recvs) return fwd >= DP_ROUND_ARRIVED;
    return !constrained || !r->n || fwd == DP_ROUND_REDUCED;
}

/* Starts rounds while they may: the forward ones in order, then the
 * returns in order; or, in order (round_seq), the next of the one order
 * every rank follows, until one may not. */
static dp_status start_ready(dp_engine *e, int constrained)
{
    size_t final = constrained ? final_from(e) : 0;
    while (e->round_seq && e->seq_next < e->n_rounds) {
        size_t i = e->round_seq[e->seq_next];
        dp_round *r = &e->rounds[i];
        if (r->ret ? !return_may(e, r, constrained) : !forward_may(e, r, constrained, final))
            return DP_OK;
        DP_TRY(start(e, r));
        e->seq_next++;
        if (r->ret) e->ret_next++;
        else e->round_next++;
    }
    if (e->round_seq) return DP_OK;
    while (e->round_next < e->n_fwd_rounds &&
           forward_may(e, &e->rounds[e->round_next], constrained, final)) {
        DP_TRY(start(e, &e->rounds[e->round_next]));
        e->round_next++;
    }
    while (e->ret_next < e->n_rounds && return_may(e, &e->rounds[e->ret_next], constrained)) {
        DP_TRY(start(e, &e->rounds[e->ret_next]));
        e->ret_next++;
    }
    return DP_OK;
}

size_t dp_rounds_spans(const dp_engine *e, double origin, dp_phase_span *out)
{
    size_t n = 0;
    for (size_t i = 0; i < e->n_rounds; i++) {
        const dp_round *r = &e->rounds[i];
        if (!r->n || atomic_load_explicit(&r->state, memory_order_acquire) < DP_ROUND_ARRIVED)
            continue;
        out[n++] = (dp_phase_span){DP_PHASE_REDUCE, r->started - origin, r->arrived - r->started};
    }
    /* started in order within the forward rounds and within the returns:
     * an insertion sort of two sorted runs */
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && out[j].start < out[j - 1].start; j--) {
            dp_phase_span t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        double end = out[i].start + out[i].seconds;
        if (m && out[i].start <= out[m - 1].start + out[m - 1].seconds) {
            if (end > out[m - 1].start + out[m - 1].seconds)
                out[m - 1].seconds = end - out[m - 1].start;
        } else {
            out[m++] = out[i];
        }
    }
    return m;
}

/* Tests the started rounds not yet arrived; *arrived: some did now,
 * *out: how many are still in flight. The wait for the other ranks is
 * bounded from the last progress here (while this rank's devices work, a
 * peer may take as long as its own work) by twice the transport's
 * timeout, the watchdog: a peer stuck in its own work is named by its
 * own watchdog within one period, and every rank then fails with that
 * message rather than with a wait given up on at the same moment. */
static dp_status test_range(dp_engine *e, size_t from, size_t to, int *arrived, size_t *out)
{
    for (size_t i = from; i < to; i++) {
        dp_round *r = &e->rounds[i];
        if (atomic_load_explicit(&r->state, memory_order_relaxed) != DP_ROUND_STARTED) continue;
        int done = 0;
        DP_TRY(dp_transport_test(&e->tp, i, &done, e->round_active, 2.0 * e->tp.timeout, what));
        if (!done) {
            ++*out;
            continue;
        }
        r->arrived = dp_now_seconds();
        atomic_store_explicit(&r->state, DP_ROUND_ARRIVED, memory_order_release);
        *arrived = 1;
        e->round_active = r->arrived;
    }
    return DP_OK;
}

static dp_status test_started(dp_engine *e, int *arrived, size_t *out)
{
    *arrived = 0;
    *out = 0;
    /* the started forward rounds from the first not yet arrived, then the
     * started returns */
    DP_TRY(test_range(e, e->round_first_out, e->round_next, arrived, out));
    DP_TRY(test_range(e, e->n_fwd_rounds, e->ret_next, arrived, out));
    while (e->round_first_out < e->round_next &&
           atomic_load_explicit(&e->rounds[e->round_first_out].state, memory_order_relaxed) !=
               DP_ROUND_STARTED)
        e->round_first_out++;
    return DP_OK;
}

double dp_rounds_progress(void *engine)
{
    dp_engine *e = engine;
    if (e->round_status != DP_OK) return -1.0;
    unsigned long seen = dp_barrier_progress(&e->pool.barrier);
    int moved = seen != e->round_seen;
    if (moved || dp_pool_busy(&e->pool)) {
        e->round_seen = seen;
        e->round_active = dp_now_seconds();
    }
    int arrived = 0;
    size_t out = 0, next = e->round_next + e->ret_next;
    dp_status s = start_ready(e, 1);
    if (s == DP_OK) s = test_started(e, &arrived, &out);
    size_t tested = e->round_next + e->ret_next;
    if (s == DP_OK && arrived) s = start_ready(e, 1); /* returns whose piece has left */
    /* what that started is in flight too: a worker may wait for it (in
     * order, a forward round may follow a return) */
    out += e->round_next + e->ret_next - tested;
    if (arrived) dp_barrier_notify(&e->pool.barrier);
    if (s != DP_OK) {
        e->round_status = s;
        dp_barrier_abort(&e->pool.barrier); /* no worker waits for a round that will not come */
        return -1.0;
    }
    if (e->round_next == e->n_fwd_rounds && e->ret_next == e->n_rounds && !out) return -1.0;
    if (moved || arrived || e->round_next + e->ret_next != next) e->round_poll = DP_ROUNDS_POLL_MIN;
    else if ((e->round_poll *= 2) > DP_ROUNDS_POLL_MAX) e->round_poll = DP_ROUNDS_POLL_MAX;
    return out ? e->round_poll : INFINITY;
}

dp_status dp_rounds_finish(dp_engine *e)
{
    dp_status s = e->round_status;
    e->round_active = dp_now_seconds(); /* this rank's work is done: it waits from now */
    if (s == DP_OK) s = start_ready(e, 0);
    for (long spins = 1; s == DP_OK; spins++) {
        int arrived;
        size_t out;
        size_t started = e->ret_next;
        s = test_started(e, &arrived, &out);
        if (s == DP_OK && arrived) s = start_ready(e, 0); /* returns whose piece has left */
        if (s != DP_OK || (!out && e->ret_next == e->n_rounds && e->ret_next == started)) break;
        dp_poll_pause(spins); /* as the bootstrap's waits */
    }
    e->round_status = s;
    return s;
}

// --- the reducers -----------------------------------------------------------------------

dp_status dp_rounds_reduce(worker *w, int *left)
{
    dp_engine *e = w->e;
    dp_phase was = w->phase;
    int reduced = 0;
    *left = 0;
    for (size_t i = 0; i < e->n_fwd_rounds; i++) {
        dp_round *r = &e->rounds[i];
        slice *sl = &e->s[r->slice];
        if (sl->reducer != w->id) continue;
        int st = atomic_load_explicit(&r->state, memory_order_acquire);
        if (st == DP_ROUND_REDUCED) continue;
        /* the other ranks' pieces arrived, and this rank's are final */
        if (st != DP_ROUND_ARRIVED || final_from(e) > r->begin) {
            *left = 1;
            continue;
        }
        DP_TRY(dp_worker_switch_phase(w, DP_PHASE_REDUCE));
        DP_TRY(dp_comm_reduce_range(e, &e->plan, sl, r->begin, r->end, r->half));
        atomic_store_explicit(&r->state, DP_ROUND_REDUCED, memory_order_release);
        reduced = 1;
    }
    /* The caller may start the receives that waited for these halves. */
    if (reduced) dp_barrier_notify(&w->pool->barrier);
    return dp_worker_switch_phase(w, was);
}
