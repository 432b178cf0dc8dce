/*
 * parallel/sync.c - what keeps the ranks and the replicas in step outside
 * the step itself (step.h): the setup at create (every worker's buffers on
 * its device, then the reduce-scatter's messages given to the transport),
 * the check that every rank planned the same batch, and the
 * re-synchronisations of the replicas (a list of stages, stages.h).
 */
#include <stdint.h>
#include <stdlib.h>

#include "parallel/comm.h"
#include "parallel/optimizer.h"
#include "parallel/pool.h"
#include "parallel/ranks.h"
#include "parallel/rounds.h"
#include "parallel/stages.h"
#include "parallel/step.h"

// --- setup -----------------------------------------------------------------------------

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

/* Every rank must start the rounds in the order its transport needs: a
 * setting that differs between them (DP_MPI_IN_ORDER) is refused on all,
 * before any round is cut. */
static dp_status agree_order(dp_engine *e)
{
    int32_t mine = dp_transport_in_order(&e->tp), all[DP_MAX_DEVICES];
    if (!dp_transport_spans_ranks(&e->tp)) return DP_OK;
    DP_TRY(dp_transport_agree(&e->tp, DP_OK, &mine, all, sizeof mine, "the rounds' order"));
    for (int r = 1; r < e->L.nranks; r++)
        if (all[r] != all[0])
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "rank %d's %s transport matches the rounds' "
                           "messages %s, rank 0's %s (DP_MPI_IN_ORDER): set it alike on every "
                           "rank", r, e->tp.ops->name, all[r] ? "in order" : "by tag",
                           all[0] ? "in order" : "by tag");
    return DP_OK;
}

static dp_status connect(dp_engine *e)
{
    dp_status s = agree_order(e);
    if (s == DP_OK) s = dp_rounds_setup(e);
    size_t n_rounds = e->n_rounds;
    const dp_xfer **lists = malloc((n_rounds ? n_rounds : 1) * sizeof *lists);
    size_t *counts = malloc((n_rounds ? n_rounds : 1) * sizeof *counts);
    if (s == DP_OK && (!lists || !counts))
        s = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation of %zu rounds failed", n_rounds);
    for (size_t r = 0; s == DP_OK && r < n_rounds; r++) {
        lists[r] = e->xfers + e->rounds[r].at;
        counts[r] = e->rounds[r].n;
    }
    dp_device *devs[DP_MAX_DEVICES], *comms[DP_MAX_DEVICES];
    void *replicas[DP_MAX_DEVICES];
    dp_run runs[DP_MAX_DEVICES];
    for (size_t i = 0; i < e->L.k; i++)
        devs[i] = e->w[i].dev, comms[i] = e->w[i].comm, replicas[i] = e->w[i].params;
    dp_transport_plan tp = {.devs = devs, .comms = comms, .rounds = lists, .round_msgs = counts,
                            .n_rounds = n_rounds, .n_forward = e->n_fwd_rounds,
                            .replicas = replicas, .esize = e->psize,
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

// --- the batch every rank planned ------------------------------------------------------

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
                        "rank passes the same global batch (the same data, sampled with the "
                        "same seed) and the engine takes each rank's rows", r);
    return s;
}

// --- the re-synchronisations -----------------------------------------------------------

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
    step *c = dp_stages_new(e, DP_STEP_FIXED_STAGES, &out);
    if (!c) return DP_ERR_OUT_OF_MEMORY;
    c->quiet = 1;
    if (from_root) {
        dp_stages_add(c, work_broadcast, NULL);
    } else {
        /* bf16 replicas: the owners' replicas are rounded from their masters first */
        if (e->bf16) dp_stages_add(c, work_refresh, NULL);
        dp_step_add_allgather(c);
    }
    dp_status s = dp_stages_run(c);
    free(c);
    return s;
}
