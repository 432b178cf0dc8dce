/*
 * parallel/step.c - the step (step.h), for any number of ranks.
 *
 * The caller's thread drives it: a job on the worker pool (pool.h) for
 * each stretch of device work, and between jobs the transport
 * (transport/transport.h) for what crosses between the ranks, from this
 * thread (MPI_THREAD_FUNNELED). One process is the case of one rank: its
 * transport moves nothing and agrees with itself.
 *
 *   compute    scatter, forward, criterion (and backward)   job
 *   losses     every device's loss sum to every rank         agree
 *   reduce     per round: the chunks between ranks, then     exchange, job
 *              the adds on the owners (the last round sums
 *              the squares)
 *   norm       every slice's sum of squares to every rank;   agree
 *              the norm and the skip decision from them
 *   update     clipping and the optimizer on the owners      job, agree
 *   all-gather the owners' slices to every replica            job, all-gather, job
 *   check      every replica's hash against device 0's       agree
 *
 * Global device order is rank-major and every rank plans the whole batch,
 * so every rank knows every device's rows. The reduce-scatter keeps one
 * process's order of additions: each owner receives the chunk of every
 * contributing device of the other ranks (a message per device, never a
 * partial sum) and adds all contributions in global device order (comm.c),
 * so R ranks of k devices give the bits of one process with R x k. A rank
 * whose local adds failed keeps exchanging (its buffers are still there)
 * and reports at the end, so the rounds need no agreement of their own.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "parallel/comm.h"
#include "parallel/compute.h"
#include "parallel/optimizer.h"
#include "parallel/pool.h"
#include "parallel/ranks.h"
#include "parallel/replica.h"
#include "parallel/step.h"

/* What a job's function needs besides its worker. */
typedef struct phase_args {
    dp_engine *e;
    const dp_plan *plan;
    int train;
    size_t at, len;   /* reduce: this round's elements of each slice */
    int last_round;   /* reduce: sum the squares after the adds */
    double norm;      /* update: the global gradient norm */
    int skip;         /* update: skip it (non-finite loss or norm) */
    int other_ranks;  /* all-gather: copy the other ranks' slices from local device 0 */
    int hash;         /* all-gather: hash the replica after every copy */
    int quiet;        /* a re-synchronisation outside a step: no phase entered */
} phase_args;

// --- the jobs, run on every worker's thread -----------------------------------------

static void job_setup(worker *w, void *arg)
{
    size_t n = w->e->model.n_params, bytes = n * sizeof(float);
    dp_worker_set_phase(w, DP_PHASE_COUNT);
    CHECK(w, dp_device_bind_thread(w->dev));
    CHECK(w, dp_device_alloc(w->dev, n * w->e->psize, &w->params));
    CHECK(w, dp_device_alloc(w->dev, bytes, (void **)&w->grads));
    CHECK(w, dp_memset(w->dev, w->grads, 0, bytes));
    CHECK(w, dp_opt_alloc_state(w));
    SYNC(w); /* every device's buffers exist before the collectives' */
    CHECK(w, dp_comm_setup(w));
}

static void job_compute(worker *w, void *arg)
{
    const phase_args *a = arg;
    dp_engine *e = a->e;
    ENTER(w, DP_PHASE_SCATTER);
    CHECK(w, dp_comm_scatter_batch(w, a->plan));
    if (a->train) CHECK(w, dp_memset(w->dev, w->grads, 0, e->model.n_params * sizeof(float)));
    if (!a->train || e->cfg.mode == DP_MODE_BALANCED) dp_compute_balanced(w, a->plan, a->train);
    else dp_compute_gather(w, a->plan);
}

static void job_reduce(worker *w, void *arg)
{
    const phase_args *a = arg;
    ENTER(w, DP_PHASE_REDUCE);
    CHECK(w, dp_comm_reduce_scatter(w, a->plan, a->at, a->len));
    if (a->last_round) CHECK(w, dp_opt_slice_sumsq(w));
}

static void job_update(worker *w, void *arg)
{
    const phase_args *a = arg;
    ENTER(w, DP_PHASE_OPTIMIZER);
    /* A skipped step still passes the broadcast phase (its figures show
     * nothing was sent). */
    if (a->skip) ENTER(w, DP_PHASE_BROADCAST);
    else CHECK(w, dp_opt_update_slice(w, a->norm));
}

static void job_allgather(worker *w, void *arg)
{
    const phase_args *a = arg;
    if (a->quiet) dp_worker_set_phase(w, DP_PHASE_BROADCAST);
    else ENTER(w, DP_PHASE_BROADCAST);
    CHECK(w, dp_comm_allgather_params(w, a->other_ranks));
    if (!a->hash) return;
    /* Every copy is done before any replica is hashed, so a replica that
     * changes now (the divergence hook flips a bit) cannot be copied into
     * another replica and hide. */
    SYNC(w);
    CHECK(w, dp_replica_hash(w));
}

static void job_hash(worker *w, void *arg)
{
    ENTER(w, DP_PHASE_BROADCAST);
    CHECK(w, dp_replica_hash(w));
}

static void job_broadcast(worker *w, void *arg)
{
    dp_worker_set_phase(w, DP_PHASE_BROADCAST);
    CHECK(w, dp_comm_broadcast_params(w));
}

static void job_refresh(worker *w, void *arg)
{
    dp_worker_set_phase(w, DP_PHASE_BROADCAST);
    CHECK(w, dp_opt_refresh_replica(w));
}

// --- the reduce-scatter's rounds ---------------------------------------------------

/* Rounds of the reduce-scatter: one in one process; with ranks, chunks of
 * the transport's round size over the longest slice. */
static size_t rounds(const dp_engine *e, size_t *c)
{
    size_t longest = 0;
    *c = dp_transport_round_floats(&e->tp);
    if (!*c) {
        *c = SIZE_MAX;
        return 1;
    }
    for (size_t j = 0; j < e->L.K; j++)
        if (e->s[j].end - e->s[j].begin > longest) longest = e->s[j].end - e->s[j].begin;
    return longest ? (longest + *c - 1) / *c : 1;
}

/* Round r's messages between the ranks: every contributing local device's
 * chunk of each slice another rank owns goes to that slice's owner; the
 * chunks of the other ranks' devices for the slices owned here arrive in
 * their staging. Both sides list them by (slice, device), so each pair of
 * ranks matches them in order. every: as if every device contributed (the
 * most a round can hold, for the reserve). */
static size_t round_messages(const dp_engine *e, const dp_plan *plan, size_t r, int every,
                             dp_xfer *m)
{
    size_t c, n = 0;
    if (!dp_transport_spans_ranks(&e->tp)) return 0; /* every device is here */
    rounds(e, &c);
    for (size_t j = 0; j < e->L.K; j++) {
        const slice *sl = &e->s[j];
        size_t len = sl->end - sl->begin;
        if (c == SIZE_MAX ? r > 0 : r * c >= len) continue;
        size_t at = r * c;
        if (len - at > c) len = at + c;
        len -= at;
        worker *o = dp_local_worker(e, (size_t)sl->owner);
        for (size_t d = 0; d < e->L.K; d++) {
            if (!every && !dp_plan_contributes(plan, d)) continue;
            worker *wd = dp_local_worker(e, d);
            if (!o && wd)
                m[n++] = (dp_xfer){(size_t)wd->id, (size_t)sl->owner, 1,
                                   wd->grads + sl->begin + at, len * sizeof(float)};
            else if (o && !wd)
                m[n++] = (dp_xfer){(size_t)o->id, d, 0, dp_comm_remote_chunk(e, sl, d),
                                   len * sizeof(float)};
        }
    }
    return n;
}

/* Adds the caller's seconds in an exchange between ranks to every local
 * worker's phase p. */
static void charge(dp_engine *e, dp_phase p, double since)
{
    if (!dp_transport_spans_ranks(&e->tp)) return;
    double t = dp_now_seconds() - since;
    for (size_t i = 0; i < e->L.k; i++) {
        worker *w = &e->w[i];
        if (w->phase_first[p] < 0.0) w->phase_first[p] = since;
        w->phase_seconds[p] += t;
    }
}

static dp_status run(dp_engine *e, dp_pool_fn fn, phase_args *a)
{
    return dp_pool_run(&e->pool, fn, a, NULL);
}

// --- setup --------------------------------------------------------------------------

dp_status dp_step_setup(dp_engine *e, dp_dist *d, dp_status s)
{
    /* Over the bootstrap d: the transport carries the ranks once connected. */
    double timeout = e->cfg.watchdog_seconds;
    if (s == DP_OK) s = dp_pool_run(&e->pool, job_setup, NULL, NULL);
    s = dp_ranks_agree(d, timeout, s);
    if (s != DP_OK) return s;
    /* The largest exchanges: the parameters (all-gather, broadcasts of the
     * parameters and the optimizer state) and the first round of the
     * reduce-scatter with every device contributing. */
    dp_device *devs[DP_MAX_DEVICES];
    for (size_t i = 0; i < e->L.k; i++) devs[i] = e->w[i].dev;
    size_t n = round_messages(e, NULL, 0, 1, e->xfers);
    s = dp_transport_connect(&e->tp, devs, e->xfers, n, e->model.n_params * sizeof(float));
    return dp_ranks_agree(d, timeout, s);
}

// --- the batch ------------------------------------------------------------------------

/* FNV-1a of the batch's bytes: every rank must pass the same batch. */
static uint64_t batch_hash(const dp_engine *e, const dp_batch *b)
{
    uint64_t h = 0xcbf29ce484222325ull;
    const unsigned char *p = b->inputs;
    size_t n = b->rows * e->model.input_row_bytes;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    p = b->targets;
    n = b->rows * dp_model_target_row_bytes(&e->model);
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h ^ (uint64_t)b->rows;
}

dp_status dp_step_agree_plan(dp_engine *e, dp_status planned)
{
    if (!dp_transport_spans_ranks(&e->tp)) return planned; /* nothing to compare */
    uint64_t mine = planned == DP_OK ? batch_hash(e, e->plan.batch) : 0, all[DP_MAX_DEVICES];
    dp_status s = dp_transport_agree(&e->tp, planned, &mine, all, sizeof mine, "the batch");
    for (int r = 1; s == DP_OK && r < e->L.nranks; r++)
        if (all[r] != all[0])
            s = DP_FAIL(DP_ERR_INVALID_ARGUMENT, "rank %d's batch differs from rank 0's; every "
                        "rank passes the same global batch (sample it from the same seed) and "
                        "the engine takes each rank's rows", r);
    return s;
}

// --- the step -------------------------------------------------------------------------

/* Every rank's per-device values (one per global device, local ones
 * filled) to every rank, read back per global device. */
static dp_status agree_per_device(dp_engine *e, dp_status local, double *mine, double *out,
                                  int by_owner, const char *what)
{
    double all[DP_MAX_DEVICES * DP_MAX_DEVICES];
    dp_status s = dp_transport_agree(&e->tp, local, mine, all, DP_MAX_DEVICES * sizeof *mine, what);
    for (size_t g = 0; s == DP_OK && g < e->L.K; g++) {
        size_t from = by_owner ? (size_t)e->s[g].owner : g;
        out[g] = all[(size_t)dp_layout_rank_of(&e->L, from) * DP_MAX_DEVICES + g];
    }
    return s;
}

/* The reduce-scatter, round by round, and every slice's sum of squares. */
static dp_status reduce(dp_engine *e, phase_args *a, double *sumsq)
{
    size_t c, n_rounds = rounds(e, &c);
    dp_status local = DP_OK;
    for (size_t r = 0; r < n_rounds; r++) {
        double t0 = dp_now_seconds();
        size_t n = round_messages(e, a->plan, r, 0, e->xfers);
        dp_status s = dp_transport_exchange(&e->tp, e->xfers, n,
                                            "reduce-scatter between the ranks");
        charge(e, DP_PHASE_REDUCE, t0);
        if (s != DP_OK) return s; /* the ranks are out of step: the engine is unusable */
        a->at = c == SIZE_MAX ? 0 : r * c;
        a->len = c;
        a->last_round = r + 1 == n_rounds;
        if (local == DP_OK) local = run(e, job_reduce, a);
    }
    double mine[DP_MAX_DEVICES] = {0};
    for (size_t j = 0; j < e->L.K; j++)
        if (e->s[j].reducer >= 0) mine[j] = e->s[j].sumsq;
    return agree_per_device(e, local, mine, sumsq, 1, "the gradient's sums of squares");
}

dp_status dp_step_run(dp_engine *e, int train, dp_step_outcome *out)
{
    memset(out, 0, sizeof *out);
    phase_args a = {.e = e, .plan = &e->plan, .train = train};

    /* forward, criterion (and backward): every rank's loss sums to all */
    double mine[DP_MAX_DEVICES] = {0};
    dp_status s = run(e, job_compute, &a);
    for (size_t i = 0; i < e->L.k; i++) mine[e->L.g0 + i] = e->w[i].loss_sum;
    s = agree_per_device(e, s, mine, out->gloss, 0, "the step's losses");
    if (s != DP_OK || !train) return s;

    double sumsq[DP_MAX_DEVICES];
    DP_TRY(reduce(e, &a, sumsq));

    /* Every rank derives the same norm and decision from the same numbers,
     * added in global device order. !isfinite, not isnan: a +Inf loss or
     * gradient must skip the update too. */
    double loss = 0.0, sq = 0.0;
    for (size_t g = 0; g < e->L.K; g++) {
        sq += sumsq[g];
        loss += out->gloss[g];
    }
    out->grad_norm = sqrt(sq);
    out->skip = !isfinite(out->grad_norm) || !isfinite(loss);
    a.norm = out->grad_norm;
    a.skip = out->skip;

    dp_phase failed;
    s = dp_pool_run(&e->pool, job_update, &a, &failed);
    s = dp_transport_agree(&e->tp, s, NULL, NULL, 0, "agreement between the ranks");
    if (s != DP_OK) {
        /* Some owners may have updated their slices: the replicas follow them. */
        out->resync |= DP_SYNC_FROM_OWNERS;
        return s;
    }
    if (out->skip) return DP_OK;
    dp_status check = DP_OK;
    s = dp_step_allgather(e, 1, dp_replica_check_due(e), &check);
    if (s == DP_OK) out->counted = 1; /* every replica has the update */
    if (s == DP_OK) s = check;
    if (s != DP_OK) out->resync |= DP_SYNC_FROM_OWNERS;
    return s;
}

// --- the all-gather and the re-synchronisations ----------------------------------------

dp_status dp_step_allgather(dp_engine *e, int in_step, int hash, dp_status *check)
{
    dp_transport *t = &e->tp;
    int across = dp_transport_spans_ranks(t), fills_all = dp_transport_fills_every_replica(t);
    phase_args a = {.e = e, .quiet = !in_step};
    dp_status s = DP_OK;
    /* the slices owned on this rank, copied to every local replica (a
     * transport that fills every replica does it with the rest) */
    if (!across || !fills_all) {
        a.hash = hash && !across;
        s = run(e, job_allgather, &a);
        if (!a.hash || s != DP_OK)
            s = dp_transport_agree(t, s, NULL, NULL, 0, "agreement between the ranks");
        if (s != DP_OK || !across) return a.hash ? dp_replica_compare(e, s, check) : s;
    }
    /* the other ranks' slices: into every replica, or into device 0's and
     * from there to the others */
    void *bufs[DP_MAX_DEVICES];
    dp_run runs[DP_MAX_DEVICES];
    for (size_t i = 0; i < e->L.k; i++) bufs[i] = e->w[i].params;
    size_t n = dp_opt_runs(e, runs);
    double t0 = dp_now_seconds();
    DP_TRY(dp_transport_allgather_replicas(t, bufs, e->psize, runs, n,
                                           "all-gather of the parameters"));
    charge(e, DP_PHASE_BROADCAST, t0);
    a.hash = hash;
    a.other_ranks = 1;
    if (!fills_all) s = run(e, job_allgather, &a);
    else if (hash) s = run(e, job_hash, &a);
    if (hash) return dp_replica_compare(e, s, check);
    return fills_all ? s : dp_transport_agree(t, s, NULL, NULL, 0, "agreement between the ranks");
}

dp_status dp_step_broadcast(dp_engine *e) { return run(e, job_broadcast, NULL); }

dp_status dp_step_refresh(dp_engine *e) { return run(e, job_refresh, NULL); }
