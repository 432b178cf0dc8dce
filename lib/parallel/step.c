/*
 * parallel/step.c - the step (step.h), for any number of ranks: the
 * training step's list of stages and the prediction's (stages.h; stages.c
 * runs them). Every decision is taken in an exchange, from numbers every
 * rank has (the gradient norm, the skip, the replica check):
 *
 *   compute    scatter, forward, criterion (and backward;    work
 *              with the overlap, the reduce-scatter too)
 *   losses     every device's loss sum to every rank         exchange
 *   reduce     the adds on the owners, then the sums of      work
 *              squares
 *   norm       every slice's sum of squares to every rank;   exchange
 *              the norm and the skip decision from them
 *   update     clipping and the optimizer on the owners      work, exchange
 *   all-gather the owners' slices to every replica            work, exchange, work
 *   check      every replica's hash against device 0's       exchange
 *
 * A prediction (dp_engine_predict) is a list of its own: scatter and
 * forward into the kept outputs (work), then every rank's outcome
 * (exchange).
 *
 * Global device order is rank-major and every rank plans the whole batch,
 * so every rank knows every device's rows. The reduce-scatter keeps one
 * process's order of additions: each owner receives the chunk of every
 * contributing device of the other ranks (a message per device, never a
 * partial sum) and adds all contributions in global device order (comm.c),
 * so R ranks of k devices give the bits of one process with R x k. With
 * ranks its chunks move in rounds (rounds.h) beside the job that sums
 * them: the compute job when the reduce-scatter overlaps the backward,
 * else the reduce job; an exchange after that job completes every round.
 */
#include <math.h>
#include <stdlib.h>

#include "core/clock.h"
#include "parallel/comm.h"
#include "parallel/compute.h"
#include "parallel/optimizer.h"
#include "parallel/overlap.h"
#include "parallel/pool.h"
#include "parallel/replica.h"
#include "parallel/rounds.h"
#include "parallel/stages.h"
#include "parallel/step.h"

// --- compute and losses --------------------------------------------------------------

static void work_compute(worker *w, step *c, const stage *st)
{
    dp_engine *e = c->e;
    ENTER(w, DP_PHASE_SCATTER);
    CHECK(w, dp_comm_scatter_batch(w, c->plan));
    if (c->train) CHECK(w, dp_memset(w->dev, w->grads, 0, e->model.n_params * sizeof(float)));
    if (!c->train || e->cfg.mode == DP_MODE_BALANCED) dp_compute_balanced(w, c->plan, c->train);
    else dp_compute_gather(w, c->plan);
    if (c->train) w->backward_end = dp_now_seconds();
    if (!e->overlapping) return;
    if (w->status == DP_OK) {
        /* This device's gradient is final: the reducers may sum it, and
         * this worker sums its slices as the others finish. */
        dp_overlap_final(w);
        dp_overlap_drain(w, c->plan);
    }
    /* What it queued, during its backward too, ends with the job. */
    CHECK(w, dp_comm_settle(w));
}

static void exchange_losses(step *c, const stage *st)
{
    double mine[DP_MAX_DEVICES] = {0};
    for (size_t i = 0; i < c->e->L.k; i++) mine[c->e->L.g0 + i] = c->e->w[i].loss_sum;
    dp_status s = dp_stages_agree_per_device(c, mine, c->out->gloss, 0, "the step's losses");
    if (s != DP_OK || !c->train) dp_stages_end(c, s, 0);
}

// --- the reduce-scatter --------------------------------------------------------------------

/* With ranks, after the job the rounds moved beside: every round started
 * and completed, whatever this rank's outcome, so no rank waits. */
static void exchange_rounds(step *c, const stage *st)
{
    double t0 = dp_now_seconds();
    dp_status s = dp_rounds_finish(c->e);
    dp_stages_charge(c, DP_PHASE_REDUCE, t0);
    if (s != DP_OK) dp_stages_end(c, s, 0); /* the ranks are out of step: the engine is unusable */
}

static void work_reduce(worker *w, step *c, const stage *st)
{
    ENTER(w, DP_PHASE_REDUCE);
    if (!dp_stages_across(c)) {
        dp_status s = dp_comm_reduce_scatter(w, c->plan);
        dp_status settled = dp_comm_settle(w); /* before the sums of squares read them */
        CHECK(w, s);
        CHECK(w, settled);
    } else {
        /* The rounds arrive beside this job (or did beside the compute's):
         * this worker's part of them is summed as they come. */
        dp_overlap_final(w);
        if (dp_overlap_drain(w, c->plan)) return;
    }
    CHECK(w, dp_opt_slice_sumsq(w));
}

/* Every rank derives the same norm and decision from the same numbers,
 * added in global device order. !isfinite, not isnan: a +Inf loss or
 * gradient must skip the update too. */
static void exchange_norm(step *c, const stage *st)
{
    dp_engine *e = c->e;
    double mine[DP_MAX_DEVICES] = {0}, sumsq[DP_MAX_DEVICES];
    for (size_t j = 0; j < e->L.K; j++)
        if (e->s[j].reducer >= 0) mine[j] = e->s[j].sumsq;
    dp_status s = dp_stages_agree_per_device(c, mine, sumsq, 1, "the gradient's sums of squares");
    if (s != DP_OK) {
        dp_stages_end(c, s, 0);
        return;
    }
    double loss = 0.0, sq = 0.0;
    for (size_t g = 0; g < e->L.K; g++) {
        sq += sumsq[g];
        loss += c->out->gloss[g];
    }
    c->norm = c->out->grad_norm = sqrt(sq);
    c->skip = c->out->skip = !isfinite(c->norm) || !isfinite(loss);
}

// --- the update ---------------------------------------------------------------------------

static void work_update(worker *w, step *c, const stage *st)
{
    ENTER(w, DP_PHASE_OPTIMIZER);
    /* A skipped step still passes the broadcast phase (its figures show
     * nothing was sent). */
    if (c->skip) ENTER(w, DP_PHASE_BROADCAST);
    else CHECK(w, dp_opt_update_slice(w, c->norm));
}

static void exchange_updated(step *c, const stage *st)
{
    dp_status s = dp_stages_agree(c);
    /* Some owners may have updated their slices: the replicas follow them. */
    if (s != DP_OK) dp_stages_end(c, s, 1);
    else if (c->skip) dp_stages_end(c, DP_OK, 0);
}

// --- the all-gather ---------------------------------------------------------------------

static void enter_broadcast(worker *w, step *c, int *stop)
{
    *stop = 0;
    if (c->quiet) dp_worker_set_phase(w, DP_PHASE_BROADCAST);
    else if (dp_worker_enter_phase(w, DP_PHASE_BROADCAST)) *stop = 1;
}

/* Copies to this worker's replica (other_ranks: the other ranks' slices,
 * from local device 0), then hashes it once every copy is done (a replica
 * that changes then, as the divergence hook's, cannot be copied into
 * another and hide). */
static void gather(worker *w, step *c, int other_ranks, int hash)
{
    int stop;
    enter_broadcast(w, c, &stop);
    if (stop) return;
    CHECK(w, dp_comm_allgather_params(w, other_ranks));
    if (!hash) return;
    SYNC(w);
    CHECK(w, dp_replica_hash(w));
}

/* The slices owned on this rank to every local replica (with one rank:
 * the whole all-gather, and the hashes). */
static void work_gather_local(worker *w, step *c, const stage *st)
{
    gather(w, c, 0, c->hash && !dp_stages_across(c));
}

static void work_gather_remote(worker *w, step *c, const stage *st) { gather(w, c, 1, c->hash); }

static void work_hash(worker *w, step *c, const stage *st)
{
    int stop;
    enter_broadcast(w, c, &stop);
    if (!stop) CHECK(w, dp_replica_hash(w));
}

static void exchange_gathered_local(step *c, const stage *st)
{
    dp_status s = dp_stages_agree(c);
    if (s != DP_OK) dp_stages_end(c, s, 1);
}

/* The other ranks' slices: into every replica, or into local device 0's
 * (then copied to the others by work_gather_remote). */
static void exchange_allgather(step *c, const stage *st)
{
    dp_engine *e = c->e;
    void *bufs[DP_MAX_DEVICES];
    dp_run runs[DP_MAX_DEVICES];
    for (size_t i = 0; i < e->L.k; i++) bufs[i] = e->w[i].params;
    size_t n = dp_opt_runs(e, runs);
    double t0 = dp_now_seconds();
    dp_status s = dp_transport_allgather_replicas(&e->tp, bufs, e->psize, runs, n,
                                                  "all-gather of the parameters");
    dp_stages_charge(c, DP_PHASE_BROADCAST, t0);
    if (s != DP_OK) dp_stages_end(c, s, 1);
}

/* The last stage of an all-gather: every rank's outcome (and with a check
 * every replica's hash); a step then counts, even when the check fails:
 * every replica took its update. */
static void exchange_gathered(step *c, const stage *st)
{
    dp_status s, check = DP_OK;
    if (c->hash) s = dp_replica_compare(c->e, c->local, &check);
    else if (dp_stages_across(c) && !dp_transport_fills_every_replica(&c->e->tp))
        s = dp_stages_agree(c);
    else s = c->local;
    if (s != DP_OK) {
        dp_stages_end(c, s, 1);
        return;
    }
    c->out->counted = c->train;
    dp_stages_end(c, check, check != DP_OK);
}

/* The all-gather's stages (stages.h). */
void dp_step_add_allgather(step *c)
{
    int fills_all = dp_transport_fills_every_replica(&c->e->tp);
    if (!dp_stages_across(c) || !fills_all) dp_stages_add(c, work_gather_local, NULL);
    if (dp_stages_across(c)) {
        if (!fills_all) dp_stages_add(c, NULL, exchange_gathered_local);
        dp_stages_add(c, NULL, exchange_allgather);
        if (!fills_all) dp_stages_add(c, work_gather_remote, NULL);
        else if (c->hash) dp_stages_add(c, work_hash, NULL);
    }
    dp_stages_add(c, NULL, exchange_gathered);
}

// --- the step -------------------------------------------------------------------------------

dp_status dp_step_run(dp_engine *e, int train, dp_step_outcome *out)
{
    step *c = dp_stages_new(e, DP_STEP_FIXED_STAGES, out);
    if (!c) return DP_ERR_OUT_OF_MEMORY;
    c->train = train;
    int across = dp_stages_across(c), overlap = dp_overlap_begin_step(e, train);
    if (train) dp_rounds_begin_step(e);
    /* With ranks the rounds move beside the job that sums them. */
    dp_stages_add_beside(c, work_compute, across && overlap ? dp_rounds_progress : NULL);
    if (across && overlap) dp_stages_add(c, NULL, exchange_rounds);
    dp_stages_add(c, NULL, exchange_losses);
    if (train) {
        dp_stages_add_beside(c, work_reduce, across && !overlap ? dp_rounds_progress : NULL);
        if (across && !overlap) dp_stages_add(c, NULL, exchange_rounds);
        dp_stages_add(c, NULL, exchange_norm);
        dp_stages_add(c, work_update, NULL);
        dp_stages_add(c, NULL, exchange_updated);
        c->hash = dp_replica_check_due(e);
        dp_step_add_allgather(c);
    }
    dp_status s = dp_stages_run(c);
    free(c);
    return s;
}

// --- a prediction ---------------------------------------------------------------------------

static void work_predict(worker *w, step *c, const stage *st)
{
    ENTER(w, DP_PHASE_SCATTER);
    CHECK(w, dp_comm_scatter_batch(w, c->plan));
    dp_compute_predict(w, c->plan);
}

/* Every rank's outcome: a failure anywhere fails the call everywhere. */
static void exchange_predicted(step *c, const stage *st)
{
    dp_stages_end(c, dp_stages_agree(c), 0);
}

dp_status dp_step_predict(dp_engine *e)
{
    dp_step_outcome out;
    step *c = dp_stages_new(e, 2, &out);
    if (!c) return DP_ERR_OUT_OF_MEMORY;
    dp_stages_add(c, work_predict, NULL);
    dp_stages_add(c, NULL, exchange_predicted);
    dp_status s = dp_stages_run(c);
    free(c);
    return s;
}
