/*
 * parallel/step.c - the step (step.h), for any number of ranks.
 *
 * A step is a list of stages, written once: work, which every worker runs
 * on its device, and exchanges, which run once and are where the ranks
 * meet (agree on an outcome, move gradient chunks, all-gather slices) and
 * where every decision is taken from numbers every rank has (the gradient
 * norm, the skip, the replica check):
 *
 *   compute    scatter, forward, criterion (and backward)   work
 *   losses     every device's loss sum to every rank         exchange
 *   reduce     per round: the chunks between ranks, then     exchange, work
 *              the adds on the owners (the last round sums
 *              the squares)
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
 * How the list runs depends only on where exchanges may run. With ranks
 * they cross processes from the caller's thread (MPI_THREAD_FUNNELED):
 * each stretch of work is a job on the worker pool (pool.h) and the caller
 * makes the exchanges between jobs. With one rank the transport moves
 * nothing, so the whole step is one job and each exchange runs at the
 * barrier between the work around it, on the last worker to arrive
 * (dp_worker_sync_then): one wake-up of the workers per step.
 *
 * Global device order is rank-major and every rank plans the whole batch,
 * so every rank knows every device's rows. The reduce-scatter keeps one
 * process's order of additions: each owner receives the chunk of every
 * contributing device of the other ranks (a message per device, never a
 * partial sum) and adds all contributions in global device order (comm.c),
 * so R ranks of k devices give the bits of one process with R x k. A rank
 * whose local work failed keeps making the exchanges that only move data
 * and reports its failure at the next agreement, so every rank leaves the
 * step at the same stage.
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

typedef struct step step;

/* One stage: work (every worker) or an exchange (once). */
typedef struct stage {
    void (*work)(worker *w, step *c, const struct stage *st);
    void (*exchange)(step *c, const struct stage *st);
    size_t round; /* reduce: its round */
} stage;

/* With one rank, the exchanges [from, to) a barrier runs. */
typedef struct xrun {
    step *c;
    size_t from, to;
} xrun;

/* Stages besides the reduce-scatter's two per round: compute, losses,
 * norm, update, updated and at most 5 for the all-gather. */
#define FIXED_STAGES 10

struct step {
    dp_engine *e;
    const dp_plan *plan;
    dp_step_outcome *out;
    int train;
    size_t round_floats, n_rounds; /* reduce: SIZE_MAX, 1 with one rank */
    double norm;     /* update: the global gradient norm */
    int skip;        /* update: skip it (non-finite loss or norm) */
    int hash;        /* all-gather: hash the replicas after every copy */
    int quiet;       /* a re-synchronisation outside a step: no phase entered */
    dp_status local; /* this rank's outcome since the last agreement */
    dp_status status; /* the step's, once an exchange decided it */
    int stop;        /* the step ends after this stage */
    size_t job_from, job_to; /* the stages the running job covers */
    xrun xruns[DP_MAX_DEVICES]; /* one rank: each worker's view of the next exchanges */
    size_t n;
    stage st[]; /* n of them */
};

static void add(step *c, void (*work)(worker *, step *, const stage *),
                void (*exchange)(step *, const stage *), size_t round)
{
    c->st[c->n++] = (stage){work, exchange, round};
}

/* Ends the step with s (and, after the update began, re-synchronises the
 * replicas from the owners before the next). */
static void end(step *c, dp_status s, int resync)
{
    c->status = s;
    c->stop = 1;
    if (resync) c->out->resync |= DP_SYNC_FROM_OWNERS;
}

static int across(const step *c) { return dp_transport_spans_ranks(&c->e->tp); }

/* Adds the caller's seconds in an exchange between ranks to every local
 * worker's phase p. */
static void charge(step *c, dp_phase p, double since)
{
    if (!across(c)) return;
    double t = dp_now_seconds() - since;
    for (size_t i = 0; i < c->e->L.k; i++) {
        worker *w = &c->e->w[i];
        if (w->phase_first[p] < 0.0) w->phase_first[p] = since;
        w->phase_seconds[p] += t;
    }
}

/* The agreement of an exchange: this rank's outcome and, per global
 * device, its values (local ones filled), read back per global device
 * (by_owner: the value of slice g comes from its owner's rank). */
static dp_status agree_per_device(step *c, double *mine, double *out, int by_owner,
                                  const char *what)
{
    dp_engine *e = c->e;
    double all[DP_MAX_DEVICES * DP_MAX_DEVICES];
    dp_status s = dp_transport_agree(&e->tp, c->local, mine, all, DP_MAX_DEVICES * sizeof *mine,
                                     what);
    for (size_t g = 0; s == DP_OK && g < e->L.K; g++) {
        size_t from = by_owner ? (size_t)e->s[g].owner : g;
        out[g] = all[(size_t)dp_layout_rank_of(&e->L, from) * DP_MAX_DEVICES + g];
    }
    return s;
}

static dp_status agree(step *c)
{
    return dp_transport_agree(&c->e->tp, c->local, NULL, NULL, 0, "agreement between the ranks");
}

// --- compute and losses --------------------------------------------------------------

static void work_compute(worker *w, step *c, const stage *st)
{
    dp_engine *e = c->e;
    ENTER(w, DP_PHASE_SCATTER);
    CHECK(w, dp_comm_scatter_batch(w, c->plan));
    if (c->train) CHECK(w, dp_memset(w->dev, w->grads, 0, e->model.n_params * sizeof(float)));
    if (!c->train || e->cfg.mode == DP_MODE_BALANCED) dp_compute_balanced(w, c->plan, c->train);
    else dp_compute_gather(w, c->plan);
}

static void exchange_losses(step *c, const stage *st)
{
    double mine[DP_MAX_DEVICES] = {0};
    for (size_t i = 0; i < c->e->L.k; i++) mine[c->e->L.g0 + i] = c->e->w[i].loss_sum;
    dp_status s = agree_per_device(c, mine, c->out->gloss, 0, "the step's losses");
    if (s != DP_OK || !c->train) end(c, s, 0);
}

// --- the reduce-scatter's rounds ---------------------------------------------------------

/* Round r's messages between the ranks: every contributing local device's
 * chunk of each slice another rank owns goes to that slice's owner; the
 * chunks of the other ranks' devices for the slices owned here arrive in
 * their staging. Both sides list them by (slice, device), so each pair of
 * ranks matches them in order. every: as if every device contributed
 * (what the transport registers at setup: an idle device sends its zeroed
 * gradient, which the owner does not add). m NULL: only counts them. */
static size_t round_messages(const dp_engine *e, const dp_plan *plan, size_t r, size_t c,
                             int every, dp_xfer *m)
{
    size_t n = 0;
    if (!dp_transport_spans_ranks(&e->tp)) return 0; /* every device is here */
    for (size_t j = 0; j < e->L.K; j++) {
        const slice *sl = &e->s[j];
        size_t len = sl->end - sl->begin, at = r * c;
        if (at >= len) continue;
        if (len - at > c) len = at + c;
        len -= at;
        worker *o = dp_local_worker(e, (size_t)sl->owner);
        for (size_t d = 0; d < e->L.K; d++) {
            if (!every && !dp_plan_contributes(plan, d)) continue;
            worker *wd = dp_local_worker(e, d);
            if (!o && wd) {
                if (m) m[n] = (dp_xfer){(size_t)wd->id, (size_t)sl->owner, 1,
                                        wd->grads + sl->begin + at, len * sizeof(float)};
                n++;
            } else if (o && !wd) {
                if (m) m[n] = (dp_xfer){(size_t)o->id, d, 0, dp_comm_remote_chunk(e, sl, d),
                                        len * sizeof(float)};
                n++;
            }
        }
    }
    return n;
}

/* Moves data only: made whatever this rank's outcome, so no rank waits. */
static void exchange_round(step *c, const stage *st)
{
    dp_engine *e = c->e;
    double t0 = dp_now_seconds();
    size_t r = st->round, at = e->round_at[r];
    dp_status s = dp_transport_exchange(&e->tp, r, e->xfers + at, e->round_at[r + 1] - at,
                                        "reduce-scatter between the ranks");
    charge(c, DP_PHASE_REDUCE, t0);
    if (s != DP_OK) end(c, s, 0); /* the ranks are out of step: the engine is unusable */
}

static void work_reduce(worker *w, step *c, const stage *st)
{
    ENTER(w, DP_PHASE_REDUCE);
    size_t at = c->round_floats == SIZE_MAX ? 0 : st->round * c->round_floats;
    CHECK(w, dp_comm_reduce_scatter(w, c->plan, at, c->round_floats));
    if (st->round + 1 == c->n_rounds) CHECK(w, dp_opt_slice_sumsq(w));
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
    dp_status s = agree_per_device(c, mine, sumsq, 1, "the gradient's sums of squares");
    if (s != DP_OK) {
        end(c, s, 0);
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
    dp_status s = agree(c);
    /* Some owners may have updated their slices: the replicas follow them. */
    if (s != DP_OK) end(c, s, 1);
    else if (c->skip) end(c, DP_OK, 0);
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
    gather(w, c, 0, c->hash && !across(c));
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
    dp_status s = agree(c);
    if (s != DP_OK) end(c, s, 1);
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
    charge(c, DP_PHASE_BROADCAST, t0);
    if (s != DP_OK) end(c, s, 1);
}

/* The last stage of an all-gather: every rank's outcome (and with a check
 * every replica's hash); a step then counts, even when the check fails:
 * every replica took its update. */
static void exchange_gathered(step *c, const stage *st)
{
    dp_status s, check = DP_OK;
    if (c->hash) s = dp_replica_compare(c->e, c->local, &check);
    else if (across(c) && !dp_transport_fills_every_replica(&c->e->tp)) s = agree(c);
    else s = c->local;
    if (s != DP_OK) {
        end(c, s, 1);
        return;
    }
    c->out->counted = c->train;
    end(c, check, check != DP_OK);
}

/* The all-gather's stages. */
static void add_allgather(step *c)
{
    int fills_all = dp_transport_fills_every_replica(&c->e->tp);
    if (!across(c) || !fills_all) add(c, work_gather_local, NULL, 0);
    if (across(c)) {
        if (!fills_all) add(c, NULL, exchange_gathered_local, 0);
        add(c, NULL, exchange_allgather, 0);
        if (!fills_all) add(c, work_gather_remote, NULL, 0);
        else if (c->hash) add(c, work_hash, NULL, 0);
    }
    add(c, NULL, exchange_gathered, 0);
}

// --- running the stages --------------------------------------------------------------

/* With one rank: exchanges run by the last worker at a barrier. */
static void run_exchanges(void *arg)
{
    const xrun *x = arg;
    for (size_t i = x->from; i < x->to && !x->c->stop; i++) x->c->st[i].exchange(x->c, &x->c->st[i]);
}

/* A job: the stages [job_from, job_to) on every worker (with one rank,
 * the exchanges among them at the barriers between the work; with ranks,
 * only work). A worker that fails aborts the barrier, so the others leave
 * at their next one. */
static void job_stages(worker *w, void *arg)
{
    step *c = arg;
    for (size_t i = c->job_from; i < c->job_to;) {
        const stage *st = &c->st[i];
        if (st->work) {
            if (i > c->job_from && c->st[i - 1].work) SYNC(w);
            st->work(w, c, st);
            if (w->status != DP_OK) return;
            i++;
            continue;
        }
        size_t to = i;
        while (to < c->job_to && c->st[to].exchange) to++;
        xrun *x = &c->xruns[w->id]; /* every worker's says the same; the last one's runs */
        *x = (xrun){c, i, to};
        if (dp_worker_sync_then(w, run_exchanges, x) != 0 || c->stop) return;
        i = to;
    }
}

static dp_status run_stages(step *c)
{
    int one_job = !across(c); /* nothing crosses: the exchanges may run on the workers */
    for (size_t at = 0; at < c->n && !c->stop;) {
        const stage *st = &c->st[at];
        if (st->exchange) { /* on the caller */
            st->exchange(c, st);
            at++;
            continue;
        }
        size_t to = at + 1;
        for (size_t j = at + 1; j < c->n && (one_job || c->st[j].work); j++)
            if (c->st[j].work) to = j + 1;
            else if (!one_job) break;
        if (c->local != DP_OK) { /* a rank that failed keeps exchanging */
            at = to;
            continue;
        }
        c->job_from = at;
        c->job_to = to;
        dp_phase failed;
        dp_status s = dp_pool_run(&c->e->pool, job_stages, c, &failed);
        if (c->stop) break;
        if (s != DP_OK) {
            c->local = s;
            /* After the update began, the owners hold the truth. */
            int resync = failed == DP_PHASE_OPTIMIZER || failed == DP_PHASE_BROADCAST;
            if (resync) c->out->resync |= DP_SYNC_FROM_OWNERS;
            if (one_job) end(c, s, resync); /* nothing else crosses: it is the step's */
        }
        at = to;
    }
    return c->stop ? c->status : c->local;
}

/* A step of room for n stages, its outcome into out (zeroed). */
static step *new_step(dp_engine *e, size_t n, dp_step_outcome *out)
{
    step *c = calloc(1, sizeof *c + n * sizeof(stage));
    if (!c) {
        DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation of a step of %zu stages failed", n);
        return NULL;
    }
    c->e = e;
    c->plan = &e->plan;
    c->out = out;
    memset(out, 0, sizeof *out);
    return c;
}

// --- the step -------------------------------------------------------------------------------

/* Rounds of the reduce-scatter: one in one process; with ranks, chunks of
 * the transport's round size over the longest slice. *c: floats per round
 * (SIZE_MAX: the whole slice). */
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

dp_status dp_step_run(dp_engine *e, int train, dp_step_outcome *out)
{
    size_t round_floats = 0, n_rounds = train ? rounds(e, &round_floats) : 0;
    step *c = new_step(e, FIXED_STAGES + 2 * n_rounds, out);
    if (!c) return DP_ERR_OUT_OF_MEMORY;
    c->train = train;
    add(c, work_compute, NULL, 0);
    add(c, NULL, exchange_losses, 0);
    if (train) {
        c->round_floats = round_floats;
        c->n_rounds = n_rounds;
        for (size_t r = 0; r < n_rounds; r++) {
            add(c, NULL, exchange_round, r);
            add(c, work_reduce, NULL, r);
        }
        add(c, NULL, exchange_norm, 0);
        add(c, work_update, NULL, 0);
        add(c, NULL, exchange_updated, 0);
        c->hash = dp_replica_check_due(e);
        add_allgather(c);
    }
    dp_status s = run_stages(c);
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
static void exchange_predicted(step *c, const stage *st) { end(c, agree(c), 0); }

dp_status dp_step_predict(dp_engine *e)
{
    dp_step_outcome out;
    step *c = new_step(e, 2, &out);
    if (!c) return DP_ERR_OUT_OF_MEMORY;
    add(c, work_predict, NULL, 0);
    add(c, NULL, exchange_predicted, 0);
    dp_status s = run_stages(c);
    free(c);
    return s;
}

// --- setup and the re-synchronisations ------------------------------------------------

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

/* Every round's messages (every device contributing), listed once, and
 * the transport given what each step moves, to register. */
static dp_status connect(dp_engine *e)
{
    size_t c, n_rounds = rounds(e, &c), total = 0;
    e->round_at = malloc((n_rounds + 1) * sizeof *e->round_at);
    if (!e->round_at) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    for (size_t r = 0; r < n_rounds; r++) {
        e->round_at[r] = total;
        total += round_messages(e, NULL, r, c, 1, NULL);
    }
    e->round_at[n_rounds] = total;
    e->n_rounds = n_rounds;
    e->xfers = malloc((total ? total : 1) * sizeof *e->xfers);
    const dp_xfer **lists = malloc(n_rounds * sizeof *lists);
    size_t *counts = malloc(n_rounds * sizeof *counts);
    dp_status s = e->xfers && lists && counts ? DP_OK
                  : DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation of %zu messages failed", total);
    for (size_t r = 0; s == DP_OK && r < n_rounds; r++) {
        round_messages(e, NULL, r, c, 1, e->xfers + e->round_at[r]);
        lists[r] = e->xfers + e->round_at[r];
        counts[r] = e->round_at[r + 1] - e->round_at[r];
    }
    dp_device *devs[DP_MAX_DEVICES];
    void *replicas[DP_MAX_DEVICES];
    dp_run runs[DP_MAX_DEVICES];
    for (size_t i = 0; i < e->L.k; i++) devs[i] = e->w[i].dev, replicas[i] = e->w[i].params;
    dp_transport_plan tp = {.devs = devs, .rounds = lists, .round_msgs = counts,
                            .n_rounds = n_rounds, .replicas = replicas, .esize = e->psize,
                            .runs = runs, .n_runs = dp_opt_runs(e, runs),
                            /* the parameters: broadcasts of them and of the optimizer state */
                            .max_bytes = e->model.n_params * sizeof(float)};
    if (s == DP_OK) s = dp_transport_connect(&e->tp, &tp);
    free(lists);
    free(counts);
    return s;
}

dp_status dp_step_setup(dp_engine *e, dp_dist *d, dp_status s)
{
    /* Over the bootstrap d: the transport carries the ranks once connected. */
    double timeout = e->cfg.watchdog_seconds;
    if (s == DP_OK) s = dp_pool_run(&e->pool, job_setup, NULL, NULL);
    s = dp_ranks_agree(d, timeout, s);
    if (s != DP_OK) return s;
    s = connect(e);
    return dp_ranks_agree(d, timeout, s);
}

/* FNV-1a of the batch's bytes: every rank must pass the same batch. */
static uint64_t batch_hash(const dp_engine *e, const dp_batch *b)
{
    uint64_t h = 0xcbf29ce484222325ull;
    const unsigned char *p = b->inputs;
    size_t n = b->rows * e->model.input_row_bytes;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    p = b->targets; /* a prediction's batch may have none */
    n = p ? b->rows * dp_model_target_row_bytes(&e->model) : 0;
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

static void work_broadcast(worker *w, step *c, const stage *st)
{
    dp_worker_set_phase(w, DP_PHASE_BROADCAST);
    CHECK(w, dp_comm_broadcast_params(w));
}

static void work_refresh(worker *w, step *c, const stage *st)
{
    dp_worker_set_phase(w, DP_PHASE_BROADCAST);
    CHECK(w, dp_opt_refresh_replica(w));
}

dp_status dp_step_resync(dp_engine *e, int from_root)
{
    dp_step_outcome out;
    step *c = new_step(e, FIXED_STAGES, &out);
    if (!c) return DP_ERR_OUT_OF_MEMORY;
    c->quiet = 1;
    if (from_root) {
        add(c, work_broadcast, NULL, 0);
    } else {
        /* bf16 replicas: the owners' replicas are rounded from their masters first */
        if (e->bf16) add(c, work_refresh, NULL, 0);
        add_allgather(c);
    }
    dp_status s = run_stages(c);
    free(c);
    return s;
}
