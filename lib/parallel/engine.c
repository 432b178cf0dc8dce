/*
 * parallel/engine.c - the DataParallel engine (DESIGN.md section 5):
 * create/destroy, the step's phases (job_step), stats and setters.
 *
 * The rooms it calls (engine_internal.h): workers.c runs jobs on the
 * worker threads, plan.c plans a batch, compute.c runs forward, criterion
 * and backward, comm.c moves data between devices, optimizer.c updates
 * the slices, replica.c checks the replicas.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dist/nccl.h"
#include "parallel/comm.h"
#include "parallel/engine_internal.h"

// --- names and defaults -------------------------------------------------------------

const char *dp_phase_name(dp_phase phase)
{
    static const char *names[DP_PHASE_COUNT] = {"scatter",  "forward",   "criterion", "backward",
                                                "reduce",   "optimizer", "broadcast"};
    return (unsigned)phase < DP_PHASE_COUNT ? names[phase] : "invalid phase";
}

const char *dp_mode_name(dp_mode mode)
{
    return mode == DP_MODE_BALANCED ? "balanced" : mode == DP_MODE_GATHER ? "gather" : "invalid mode";
}

dp_engine_config dp_engine_config_default(void)
{
    dp_engine_config c;
    memset(&c, 0, sizeof c);
    c.mode = DP_MODE_BALANCED;
    c.optim.kind = DP_OPTIMIZER_ADAMW;
    c.optim.lr = 1e-3f;
    c.optim.beta1 = 0.9f;
    c.optim.beta2 = 0.95f;
    c.optim.eps = 1e-8f;
    c.optim.weight_decay = 0.1f;
    c.grad_accum = 1;
    c.seed = 1337;
    return c;
}

// --- the thread contract ---------------------------------------------------------------

/* Claims the engine for one public call, or fails at once with
 * DP_ERR_BUSY: a second concurrent call never waits (it would deadlock
 * on the job it cannot join) and never touches the running call's state. */
static dp_status claim(dp_engine *e, const char *call)
{
    if (!e) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: engine must not be NULL", call);
    if (atomic_flag_test_and_set(&e->busy))
        return DP_FAIL(DP_ERR_BUSY, "%s: another call on this engine is running on another "
                       "thread; an engine serves one call at a time (see dp/engine.h), so "
                       "serialise the calls or give each thread its own engine", call);
    return DP_OK;
}

static dp_status unclaim(dp_engine *e, dp_status s)
{
    atomic_flag_clear(&e->busy);
    return s;
}

// --- the jobs, run on every worker's thread ---------------------------------------------

static void job_setup(worker *w)
{
    size_t n = w->e->model.n_params, bytes = n * sizeof(float);
    w->phase = DP_PHASE_COUNT;
    CHECK(w, dp_device_bind_thread(w->dev));
    CHECK(w, dp_device_alloc(w->dev, n * w->e->psize, &w->params));
    CHECK(w, dp_device_alloc(w->dev, bytes, (void **)&w->grads));
    CHECK(w, dp_memset(w->dev, w->grads, 0, bytes));
    CHECK(w, dp_opt_alloc_state(w));
    SYNC(w); /* every device's buffers exist before the collectives' */
    CHECK(w, dp_comm_setup(w));
}

/* One step (train) or evaluation on this worker: the phases in order. */
static void job_step(worker *w, int train)
{
    dp_engine *e = w->e;
    ENTER(w, DP_PHASE_SCATTER);
    CHECK(w, dp_comm_scatter_batch(w));
    if (train) CHECK(w, dp_memset(w->dev, w->grads, 0, e->model.n_params * sizeof(float)));

    /* forward, criterion, backward */
    if (!train || e->cfg.mode == DP_MODE_BALANCED) dp_compute_balanced(w, train);
    else dp_compute_gather(w);
    if (w->status || !train) return;
    SYNC(w); /* every gradient is complete */

    /* reduce-scatter: each slice's sum, in device order, on its owner */
    ENTER(w, DP_PHASE_REDUCE);
    CHECK(w, dp_comm_reduce_scatter(w));
    CHECK(w, dp_opt_slice_sumsq(w));
    SYNC(w);

    ENTER(w, DP_PHASE_OPTIMIZER);
    /* Every worker derives the same norm and decision, in device order. */
    double loss, sumsq;
    dp_comm_allreduce_scalars(e, &loss, &sumsq);
    double norm = sqrt(sumsq);
    /* !isfinite, not isnan: a +Inf loss or gradient must skip the update too. */
    int skip = !isfinite(norm) || !isfinite(loss);
    if (w->id == 0) {
        /* Read by the caller after the job only. */
        e->grad_norm = norm;
        e->skip = skip;
    }
    if (!skip) CHECK(w, dp_opt_update_slice(w, norm));
    SYNC(w);

    /* all-gather: every replica fetches the updated slices from their owners */
    ENTER(w, DP_PHASE_BROADCAST);
    if (skip) return;
    CHECK(w, dp_comm_allgather_params(w, 0));
    if (!dp_replica_check_due(e)) return;
    /* Every copy is done before any replica is hashed, so a replica that
     * changes now (the divergence hook flips a bit) cannot be copied
     * into another replica and hide. */
    SYNC(w);
    CHECK(w, dp_replica_hash(w));
}

/* ranks (ranks.c calls these jobs between its exchanges) */
static void job_compute(worker *w)
{
    ENTER(w, DP_PHASE_SCATTER);
    CHECK(w, dp_comm_scatter_batch(w));
    CHECK(w, dp_memset(w->dev, w->grads, 0, w->e->model.n_params * sizeof(float)));
    dp_compute_balanced(w, 1);
}

static void job_reduce_round(worker *w)
{
    dp_engine *e = w->e;
    ENTER(w, DP_PHASE_REDUCE);
    CHECK(w, dp_comm_reduce_scatter(w));
    if (e->round + 1 == dp_ranks_rounds(e)) CHECK(w, dp_opt_slice_sumsq(w));
}

void dp_engine_job(worker *w, job_kind job)
{
    switch (job) {
    case JOB_SETUP: job_setup(w); break;
    case JOB_STEP: job_step(w, 1); break;
    case JOB_EVAL: job_step(w, 0); break;
    case JOB_BROADCAST:
        w->phase = DP_PHASE_BROADCAST;
        CHECK(w, dp_comm_broadcast_params(w));
        break;
    case JOB_ALLGATHER:
        w->phase = DP_PHASE_BROADCAST;
        CHECK(w, dp_comm_allgather_params(w, 0));
        break;
    case JOB_COMPUTE: job_compute(w); break;
    case JOB_REDUCE_ROUND: job_reduce_round(w); break;
    case JOB_UPDATE:
        ENTER(w, DP_PHASE_OPTIMIZER);
        CHECK(w, dp_opt_update_slice(w, w->e->grad_norm));
        break;
    case JOB_GATHER_LOCAL:
        ENTER(w, DP_PHASE_BROADCAST);
        CHECK(w, dp_comm_allgather_params(w, 0));
        break;
    case JOB_COPY_REMOTE:
        ENTER(w, DP_PHASE_BROADCAST);
        CHECK(w, dp_comm_allgather_params(w, 1));
        if (!w->e->hash_due) break;
        SYNC(w); /* as in job_step: every copy before any hash */
        CHECK(w, dp_replica_hash(w));
        break;
    case JOB_HASH:
        ENTER(w, DP_PHASE_BROADCAST);
        CHECK(w, dp_replica_hash(w));
        break;
    case JOB_REFRESH:
        w->phase = DP_PHASE_BROADCAST;
        CHECK(w, dp_opt_refresh_replica(w));
        break;
    }
}

// --- step and evaluate -------------------------------------------------------------------

static void fill_stats(dp_engine *e, dp_step_stats *st, double seconds)
{
    if (!st) return;
    memset(st, 0, sizeof *st);
    double loss = 0.0;
    if (!dp_ranks_active(e))
        for (size_t i = 0; i < e->k; i++) e->gloss[i] = e->w[i].loss_sum;
    for (size_t i = 0; i < e->K; i++) loss += e->gloss[i]; /* device order: reproducible */
    st->loss = loss / (double)e->n_valid;
    st->valid_targets = e->n_valid;
    st->grad_norm = e->grad_norm;
    st->skipped = e->skip;
    st->skipped_device = -1;
    if (e->skip)
        for (size_t i = 0; i < e->K; i++)
            if (!isfinite(e->gloss[i])) {
                st->skipped_device = (int)i;
                break;
            }
    st->step = e->t;
    st->seconds = seconds;
    st->start_seconds = e->step_start - e->created;
    /* A phase lasts as long as its slowest device: phases that end at a
     * barrier read about the same on every device, and the broadcast, where
     * the root only waits, is timed by the devices that copy. */
    for (int p = 0; p < DP_PHASE_COUNT; p++)
        for (size_t i = 0; i < e->k; i++)
            if (e->w[i].phase_seconds[p] > st->phase_seconds[p])
                st->phase_seconds[p] = e->w[i].phase_seconds[p];
    st->n_devices = e->k;
    size_t n = e->model.n_params;
    for (size_t i = 0; i < e->k; i++) {
        worker *w = &e->w[i];
        dp_device_step_stats *d = &st->devices[i];
        dp_memory_stats ms;
        dp_device_memory(w->dev, &ms);
        d->rows = w->rows;
        d->valid_targets = w->valid;
        d->micro_batches = w->n_micro;
        d->in_use = ms.in_use;
        d->peak = ms.peak;
        for (int p = 0; p < DP_PHASE_COUNT; p++) {
            d->phase_peak[p] = w->phase_peak[p];
            if (w->phase_peak[p] > d->step_peak) d->step_peak = w->phase_peak[p];
            if (w->phase_first[p] >= 0.0) {
                d->phase_start[p] = w->phase_first[p] - e->step_start;
                d->phase_seconds[p] = w->phase_seconds[p];
            }
        }
        d->logits_bytes = w->logits.bytes + w->dlogits.bytes + w->gathered.bytes + w->gathered_d.bytes;
        d->param_bytes = n * e->psize + n * sizeof(float); /* the replica and its gradient */
        d->optimizer_bytes = dp_opt_state_bytes(e, i);
        d->reserved_bytes = ms.reserved;
    }
}

static dp_status check_usable(const dp_engine *e)
{
    if (e->broken)
        return DP_FAIL(DP_ERR_TIMEOUT, "a worker of this engine did not return after a watchdog "
                       "timeout; destroy the engine and create a new one");
    return DP_OK;
}

static dp_status sync_replicas(dp_engine *e)
{
    if (!e->needs_sync) return DP_OK;
    /* After a failed update the owners hold the truth: each replica
     * fetches every slice; after a failed set_params, the root (with
     * ranks, every rank's device 0 holds rank 0's values then). With
     * bf16 replicas the truth is the owners' masters: their replicas are
     * rounded from them first. */
    if (e->bf16 && !(e->needs_sync & DP_SYNC_FROM_ROOT))
        DP_TRY(dp_workers_run(e, JOB_REFRESH));
    if (dp_ranks_active(e) && !(e->needs_sync & DP_SYNC_FROM_ROOT))
        DP_TRY(dp_ranks_allgather_params(e));
    else
        DP_TRY(dp_workers_run(e, (e->needs_sync & DP_SYNC_FROM_ROOT) ? JOB_BROADCAST : JOB_ALLGATHER));
    e->needs_sync = 0;
    return DP_OK;
}

/* Plans batch, runs a step or evaluation job and fills stats. */
static dp_status run_batch(dp_engine *e, const dp_batch *batch, job_kind job, dp_step_stats *stats)
{
    DP_TRY(check_usable(e));
    e->step_start = dp_now_seconds();
    DP_TRY(sync_replicas(e));
    dp_status s = dp_plan_batch(e, batch);
    /* With ranks every rank must have planned the same batch (ranks.c). */
    if (dp_ranks_active(e)) s = dp_ranks_check_batch(e, batch, s);
    DP_TRY(s);
    e->skip = 0;
    e->grad_norm = 0.0;
    int check = job == JOB_STEP && dp_replica_check_due(e);
    dp_workers_reset_stats(e);
    if (dp_ranks_active(e)) DP_TRY(dp_ranks_step(e, job == JOB_STEP));
    else DP_TRY(dp_workers_run(e, job));
    check = check && !e->skip && !dp_ranks_active(e); /* ranks.c checks its own */
    if (job == JOB_STEP && !e->skip) e->t++;
    fill_stats(e, stats, dp_now_seconds() - e->step_start);
    return check ? dp_replica_compare(e) : DP_OK;
}

dp_status dp_engine_step(dp_engine *e, const dp_batch *batch, dp_step_stats *stats)
{
    DP_TRY(claim(e, "dp_engine_step"));
    return unclaim(e, run_batch(e, batch, JOB_STEP, stats));
}

dp_status dp_engine_evaluate(dp_engine *e, const dp_batch *batch, dp_step_stats *stats)
{
    DP_TRY(claim(e, "dp_engine_evaluate"));
    return unclaim(e, run_batch(e, batch, JOB_EVAL, stats));
}

// --- create / destroy ---------------------------------------------------------------

/* The checks of create's arguments, before anything is allocated. */
static dp_status create_checks(const dp_device_spec *devices, size_t k, const dp_model *model,
                               const dp_criterion *crit, const dp_engine_config *cfg)
{
    if (!devices || !model || !crit || !cfg)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "devices, model, criterion and cfg must not be NULL");
    if (k == 0 || k > DP_MAX_DEVICES)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%zu devices; use 1 to %d", k, DP_MAX_DEVICES);
    DP_TRY(dp_model_validate(model));
    DP_TRY(dp_criterion_validate(crit, model));
    DP_TRY(dp_plan_check_config(cfg, devices, k));
    if (cfg->shard_optimizer != 0 && cfg->shard_optimizer != 1)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "shard_optimizer %d; use 0 (the root holds the "
                       "optimizer state) or 1 (each device holds its slice's)",
                       cfg->shard_optimizer);
    return DP_OK;
}

dp_status dp_engine_create(const dp_device_spec *devices, size_t k, const dp_model *model,
                           const dp_criterion *crit, const dp_engine_config *cfg, dp_engine **out)
{
    if (!out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "out must not be NULL");
    *out = NULL;
    dp_status s = create_checks(devices, k, model, crit, cfg);
    /* With ranks every rank learns of any rank's bad arguments, so none
     * waits for the others in the exchanges below. */
    dp_dist *dist = cfg ? (dp_dist *)cfg->dist : NULL;
    int ranked = dp_dist_size(dist) > 1;
    if (ranked) s = dp_dist_agree(dist, s);
    DP_TRY(s);

    dp_engine *e = calloc(1, sizeof *e);
    if (e) e->w = calloc(k, sizeof *e->w);
    if (!e || !e->w) {
        free(e);
        s = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
        return ranked ? dp_ranks_create_failed(dist, s) : s;
    }
    e->k = k;
    e->K = k;
    e->nranks = 1;
    e->dist = ranked ? dist : NULL;
    e->rank_first[1] = k;
    e->model = *model;
    e->crit = *crit;
    e->cfg = *cfg;
    e->bf16 = model->param_dtype == DP_DTYPE_BF16;
    e->psize = e->bf16 ? sizeof(dp_bf16) : sizeof(float);
    e->cfg.device_weights = NULL;
    for (size_t i = 0; i < k; i++) e->weights[i] = cfg->device_weights ? cfg->device_weights[i] : 1.0f;
    e->lr = cfg->optim.lr;
    e->created = dp_now_seconds();
    atomic_flag_clear(&e->busy);
    e->fault_phase = DP_PHASE_COUNT;
    e->stall_dev = -1;
    e->stall_phase = DP_PHASE_COUNT;
    atomic_init(&e->diverge_dev, -1);
    dp_workers_init(e);

    for (size_t i = 0; i < k; i++) {
        e->w[i].e = e;
        e->w[i].id = (int)i;
    }
    if (ranked) s = dp_ranks_init(e, devices, k);
    if (s == DP_OK) s = dp_opt_build_slices(e);
    for (size_t i = 0; s == DP_OK && i < k; i++) {
        worker *w = &e->w[i];
        w->phase = DP_PHASE_COUNT;
        s = dp_device_open(&devices[i], &w->dev);
        if (s == DP_OK && cfg->memory_limit) s = dp_device_set_limit(w->dev, cfg->memory_limit);
        if (s == DP_OK && cfg->allow_tf32) s = dp_device_set_allow_tf32(w->dev, 1);
        if (s == DP_OK && cfg->matmul_precision != DP_MATMUL_FP32)
            s = dp_device_set_matmul_precision(w->dev, cfg->matmul_precision);
    }
    if (s == DP_OK) s = dp_workers_start(e);
    if (s == DP_OK) s = dp_workers_run(e, JOB_SETUP);
    if (s == DP_OK && ranked && e->nranks > 1) s = dp_ranks_reserve(e);
    if (ranked && e->nranks > 1) s = dp_ranks_agree(e, s);
    if (s == DP_OK && ranked && e->nranks > 1 && !dp_device_is_host_memory(e->w[0].dev))
        s = dp_ranks_agree(e, dp_ranks_open_gpus(e));
    if (s == DP_OK) {
        float *host = calloc(model->n_params, sizeof *host);
        if (!host) s = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation of %zu parameters failed",
                               model->n_params);
        if (s == DP_OK) s = model->init(model->ctx, host, cfg->seed);
        /* With ranks set_params is collective: a rank that failed still takes part. */
        if (s == DP_OK) s = dp_engine_set_params(e, host);
        else if (dp_ranks_active(e)) dp_engine_set_params(e, NULL);
        free(host);
    }
    if (s != DP_OK) {
        dp_engine_destroy(e);
        return s;
    }
    *out = e;
    return DP_OK;
}

void dp_engine_destroy(dp_engine *e)
{
    if (!e) return;
    dp_workers_stop(e);
    dp_nccl_close(e->nccl);
    for (size_t i = 0; i < e->k; i++) {
        worker *w = &e->w[i];
        if (!w->dev) continue;
        dbuf *bufs[] = {&w->inputs, &w->targets, &w->workspace, &w->logits,
                        &w->dlogits, &w->scratch, &w->gathered, &w->gathered_d,
                        &w->features, &w->dfeatures};
        for (size_t b = 0; b < sizeof bufs / sizeof *bufs; b++) dp_dbuf_release(w->dev, bufs[b]);
        dp_device_free(w->dev, w->params);
        dp_device_free(w->dev, w->grads);
    }
    dp_comm_teardown(e);
    dp_opt_free_state(e);
    for (size_t i = 0; i < e->k; i++) dp_device_close(e->w[i].dev);
    free(e->s);
    free(e->msgs);
    free(e->w);
    free(e);
}

// --- parameters and state -------------------------------------------------------------

/* Index of the first value that is not finite (or negative, when
 * nonnegative), or n when every value is fine. */
static size_t first_bad(const float *x, size_t n, int nonnegative)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]) || (nonnegative && x[i] < 0.0f)) return i;
    return n;
}

dp_status dp_engine_set_lr(dp_engine *e, float lr)
{
    DP_TRY(claim(e, "dp_engine_set_lr"));
    if (!isfinite(lr) || lr < 0.0f)
        return unclaim(e, DP_FAIL(DP_ERR_INVALID_ARGUMENT, "learning rate %g; use a finite "
                                  "value >= 0", lr));
    e->lr = lr;
    return unclaim(e, DP_OK);
}

dp_status dp_engine_get_params(dp_engine *e, float *host)
{
    DP_TRY(claim(e, "dp_engine_get_params"));
    /* From the slices' owners, which hold the truth even when a failed
     * step left the replicas to re-synchronise; with ranks, each rank's
     * owned range then goes to every rank. */
    dp_status s = DP_OK;
    if (!host) {
        s = DP_FAIL(DP_ERR_INVALID_ARGUMENT, "host must not be NULL");
        /* with ranks the others learn of it rather than wait */
        return unclaim(e, dp_ranks_active(e) ? dp_ranks_agree(e, s) : s);
    }
    /* bf16 replicas: the owners' float32 masters. */
    if (e->bf16) s = dp_opt_move_masters(e, host, NULL);
    for (size_t i = 0; !e->bf16 && s == DP_OK && i < e->K; i++) {
        slice *sl = &e->s[i];
        worker *o = dp_local_worker(e, (size_t)sl->owner);
        size_t b = sl->begin, n = sl->end - b;
        if (!n || !o) continue;
        s = dp_device_bind_thread(o->dev);
        if (s == DP_OK) s = dp_copy_d2h(o->dev, host + b, dp_replica_at(o, b), n * sizeof(float));
    }
    if (dp_ranks_active(e)) {
        s = dp_ranks_agree(e, s);
        if (s == DP_OK) s = dp_ranks_allgather_owned(e, host, sizeof(float), "dp_engine_get_params");
    }
    return unclaim(e, s);
}

/* The root's replica (and with bf16 replicas every owner's master) from
 * the host's float32 parameters. */
static dp_status set_root_replica(dp_engine *e, const float *host)
{
    size_t n = e->model.n_params;
    worker *root = &e->w[0];
    if (!e->bf16) {
        DP_TRY(dp_device_bind_thread(root->dev));
        return dp_copy_h2d(root->dev, root->params, host, n * sizeof(float));
    }
    DP_TRY(dp_opt_move_masters(e, NULL, host));
    dp_bf16 *h = malloc(n * sizeof *h);
    if (!h)
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation of %zu bfloat16 parameters failed", n);
    for (size_t i = 0; i < n; i++) h[i] = dp_bf16_from_float(host[i]);
    dp_status s = dp_device_bind_thread(root->dev);
    if (s == DP_OK) s = dp_copy_h2d(root->dev, root->params, h, n * sizeof *h);
    free(h);
    return s;
}

dp_status dp_engine_set_params(dp_engine *e, const float *host)
{
    DP_TRY(claim(e, "dp_engine_set_params"));
    size_t n = e->model.n_params, bad;
    float *copy = NULL;
    if (!host && !dp_ranks_active(e))
        return unclaim(e, DP_FAIL(DP_ERR_INVALID_ARGUMENT, "host must not be NULL"));
    if (dp_ranks_active(e)) { /* rank 0's values, so the ranks cannot disagree */
        copy = host ? malloc(n * sizeof *copy) : NULL;
        dp_status a = !host ? DP_FAIL(DP_ERR_INVALID_ARGUMENT, "host must not be NULL")
                      : copy ? DP_OK
                             : DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation of %zu parameters "
                                       "failed", n);
        if (copy) memcpy(copy, host, n * sizeof *copy);
        a = dp_ranks_agree(e, a);
        if (a == DP_OK) a = dp_ranks_bcast(e, copy, n * sizeof *copy, "dp_engine_set_params");
        if (a != DP_OK) {
            free(copy);
            return unclaim(e, a);
        }
        host = copy;
    }
    bad = first_bad(host, n, 0);
    if (bad < n) {
        dp_status f = DP_FAIL(DP_ERR_INVALID_ARGUMENT, "parameter %zu of %zu is %g; "
                              "parameters must be finite", bad, n, host[bad]);
        free(copy);
        return unclaim(e, f);
    }
    /* A float32 value past bfloat16's largest would be an infinite replica. */
    for (size_t i = 0; e->bf16 && i < n; i++)
        if (isinf(dp_bf16_to_float(dp_bf16_from_float(host[i])))) {
            dp_status f = DP_FAIL(DP_ERR_INVALID_ARGUMENT, "parameter %zu of %zu is %g, past "
                                  "bfloat16's range (|x| < 3.39e38): the model's replicas are "
                                  "bfloat16 (param_dtype); scale it down or train in float32",
                                  i, n, host[i]);
            free(copy);
            return unclaim(e, f);
        }
    dp_status s = set_root_replica(e, host);
    /* The root's copy to every replica, the owners included (should it
     * fail, the next step retries it). */
    if (s == DP_OK) {
        e->needs_sync |= DP_SYNC_FROM_ROOT;
        s = sync_replicas(e);
    }
    free(copy);
    if (dp_ranks_active(e)) s = dp_ranks_agree(e, s);
    return unclaim(e, s);
}

dp_status dp_engine_get_optimizer_state(dp_engine *e, float *m, float *v, long *t)
{
    DP_TRY(claim(e, "dp_engine_get_optimizer_state"));
    dp_status s = dp_opt_get_state(e, m, v);
    if (dp_ranks_active(e)) {
        s = dp_ranks_agree(e, s);
        if (s == DP_OK && m) s = dp_ranks_allgather_owned(e, m, sizeof(float), "optimizer state (m)");
        if (s == DP_OK && v && e->cfg.optim.kind == DP_OPTIMIZER_ADAMW)
            s = dp_ranks_allgather_owned(e, v, sizeof(float), "optimizer state (v)");
    }
    if (s == DP_OK && t) *t = e->t;
    return unclaim(e, s);
}

static dp_status set_state(dp_engine *e, const float *m, const float *v, long t);
static dp_status set_state_ranks(dp_engine *e, const float *m, const float *v, long t);

dp_status dp_engine_set_optimizer_state(dp_engine *e, const float *m, const float *v, long t)
{
    DP_TRY(claim(e, "dp_engine_set_optimizer_state"));
    if (dp_ranks_active(e)) return unclaim(e, set_state_ranks(e, m, v, t));
    return unclaim(e, set_state(e, m, v, t));
}

/* Rank 0's state to every rank, then each rank's slices from it. */
static dp_status set_state_ranks(dp_engine *e, const float *m, const float *v, long t)
{
    size_t n = e->model.n_params;
    int adamw = e->cfg.optim.kind == DP_OPTIMIZER_ADAMW;
    float *cm = m ? malloc(n * sizeof *cm) : NULL, *cv = v && adamw ? malloc(n * sizeof *cv) : NULL;
    dp_status s = (m && !cm) || (v && adamw && !cv)
                      ? DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation of the optimizer state failed")
                      : DP_OK;
    if (cm) memcpy(cm, m, n * sizeof *cm);
    if (cv) memcpy(cv, v, n * sizeof *cv);
    s = dp_ranks_agree(e, s);
    if (s == DP_OK) s = dp_ranks_bcast(e, &t, sizeof t, "optimizer step count");
    if (s == DP_OK && cm) s = dp_ranks_bcast(e, cm, n * sizeof *cm, "optimizer state (m)");
    if (s == DP_OK && cv) s = dp_ranks_bcast(e, cv, n * sizeof *cv, "optimizer state (v)");
    if (s == DP_OK) s = dp_ranks_agree(e, set_state(e, cm, cv, t));
    free(cm);
    free(cv);
    return s;
}

static dp_status set_state(dp_engine *e, const float *m, const float *v, long t)
{
    size_t n = e->model.n_params, bad;
    if (t < 0)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "step count %ld is negative", t);
    if (m && (bad = first_bad(m, n, 0)) < n)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "first moment %zu of %zu is %g; the optimizer "
                       "state must be finite", bad, n, m[bad]);
    int adamw = e->cfg.optim.kind == DP_OPTIMIZER_ADAMW;
    if (v && adamw && (bad = first_bad(v, n, 1)) < n)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "second moment %zu of %zu is %g; it must be "
                       "finite and >= 0", bad, n, v[bad]);
    dp_status s = dp_opt_set_state(e, m, v);
    if (s == DP_OK) e->t = t;
    return s;
}

size_t dp_engine_num_devices(const dp_engine *e) { return e ? e->k : 0; }
size_t dp_engine_num_global_devices(const dp_engine *e) { return e ? e->K : 0; }
size_t dp_engine_first_global_device(const dp_engine *e) { return e ? e->g0 : 0; }

dp_device *dp_engine_device(dp_engine *e, size_t i) { return e && i < e->k ? e->w[i].dev : NULL; }

const dp_model *dp_engine_model(const dp_engine *e) { return e ? &e->model : NULL; }
