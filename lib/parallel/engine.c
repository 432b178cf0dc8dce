/*
 * parallel/engine.c - the DataParallel engine's public calls (dp/engine.h,
 * docs/design.md section 5): create and destroy, step and evaluate,
 * predictions, stats (engine_params.c: parameters and optimizer state).
 *
 * The rooms it calls (state.h lists them): ranks.c joins the ranks,
 * pool.c runs jobs on the worker threads, plan.c plans a batch, step.c
 * runs the step over every rank, optimizer.c owns the slices, and the
 * transport (transport/) carries what crosses between the ranks.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "parallel/call.h"
#include "parallel/comm.h"
#include "parallel/graph.h"
#include "parallel/optimizer.h"
#include "parallel/plan.h"
#include "parallel/pool.h"
#include "parallel/ranks.h"
#include "parallel/rounds.h"
#include "parallel/step.h"

// --- names and defaults -------------------------------------------------------------

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


// --- step and evaluate -------------------------------------------------------------------

static void fill_stats(dp_engine *e, dp_step_stats *st, double seconds, int train)
{
    if (!st) return;
    memset(st, 0, sizeof *st);
    const dp_step_outcome *o = &e->out;
    double loss = 0.0;
    for (size_t i = 0; i < e->L.K; i++) loss += o->gloss[i]; /* device order: reproducible */
    st->loss = loss / (double)e->plan.n_valid;
    st->valid_targets = e->plan.n_valid;
    st->grad_norm = o->grad_norm;
    st->skipped = o->skip;
    st->skipped_device = -1;
    if (o->skip)
        for (size_t i = 0; i < e->L.K; i++)
            if (!isfinite(o->gloss[i])) {
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
        for (size_t i = 0; i < e->L.k; i++)
            if (e->w[i].phase_seconds[p] > st->phase_seconds[p])
                st->phase_seconds[p] = e->w[i].phase_seconds[p];
    /* The exposed communication: from the last backward's end to the update. */
    double bw_end = -1.0, update = -1.0;
    for (size_t i = 0; i < e->L.k; i++) {
        const worker *w = &e->w[i];
        if (w->backward_end > bw_end) bw_end = w->backward_end;
        double u = w->phase_first[DP_PHASE_OPTIMIZER];
        if (u >= 0.0 && (update < 0.0 || u < update)) update = u;
    }
    st->exposed_seconds = bw_end >= 0.0 && update > bw_end ? update - bw_end : 0.0;
    st->overlapped = e->overlapping;
    if (train && e->n_rounds) {
        st->n_exchange_spans = dp_rounds_spans(e, e->step_start, e->xspans);
        st->exchange_spans = st->n_exchange_spans ? e->xspans : NULL;
    }
    st->n_devices = e->L.k;
    size_t n = e->model.n_params;
    for (size_t i = 0; i < e->L.k; i++) {
        worker *w = &e->w[i];
        dp_device_step_stats *d = &st->devices[i];
        dp_memory_stats ms;
        dp_device_memory(w->dev, &ms);
        d->rows = e->plan.dev[i].rows;
        d->valid_targets = e->plan.dev[i].valid;
        d->micro_batches = e->plan.dev[i].n_micro;
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
        d->spans = w->n_spans ? w->spans : NULL;
        d->n_spans = w->n_spans;
        d->replayed = w->replayed;
    }
}

static dp_status check_usable(const dp_engine *e)
{
    if (dp_pool_broken(&e->pool))
        return DP_FAIL(DP_ERR_TIMEOUT, "a worker of this engine did not return after a watchdog "
                       "timeout; destroy the engine and create a new one");
    if (dp_transport_lost(&e->tp))
        return DP_FAIL(DP_ERR_TIMEOUT, "an exchange between the ranks failed or timed out and "
                       "left them out of step; destroy the engine and create a new one");
    return DP_OK;
}

dp_status dp_engine_usable(const dp_engine *e)
{
    if (!dp_engine_live(e))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "engine is NULL or was destroyed");
    return check_usable(e);
}

dp_status dp_engine_sync_replicas(dp_engine *e)
{
    if (!e->needs_sync) return DP_OK;
    /* After a failed update the owners hold the truth: each replica
     * fetches every slice; after a failed set_params, the root (with
     * ranks, every rank's device 0 holds rank 0's values then). With
     * bf16 replicas the truth is the owners' masters: their replicas are
     * rounded from them first. */
    DP_TRY(dp_step_resync(e, e->needs_sync & DP_SYNC_FROM_ROOT));
    e->needs_sync = 0;
    return DP_OK;
}

/* Plans batch, runs a step (train) or evaluation over every rank and
 * fills stats. */
static dp_status run_batch(dp_engine *e, const dp_batch *batch, int train, dp_step_stats *stats)
{
    DP_TRY(check_usable(e));
    /* the count a checkpoint and dp_engine_set_optimizer_state take back */
    if (train && e->t >= DP_MAX_STEP)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "the optimizer has taken %ld steps, DP_MAX_STEP "
                       "(2^62): its step count cannot grow further; set a smaller one "
                       "(dp_engine_set_optimizer_state)", (long)e->t);
    e->step_start = dp_now_seconds();
    DP_TRY(dp_engine_sync_replicas(e));
    DP_TRY(dp_step_agree_plan(e, dp_plan_batch(e, batch, 0, &e->plan)));
    dp_pool_reset_stats(&e->pool, e->step_start);
    dp_status s = dp_step_run(e, train, &e->out);
    e->needs_sync |= e->out.resync;
    /* A failed replica check comes after a step every replica took: it
     * counts, and its stats are filled. */
    if (s != DP_OK && !e->out.counted) return s;
    if (e->out.counted) e->t++;
    fill_stats(e, stats, dp_now_seconds() - e->step_start, train);
    return s;
}

dp_status dp_engine_step(dp_engine *e, const dp_batch *batch, dp_step_stats *stats)
{
    DP_TRY(dp_engine_claim(e, "dp_engine_step"));
    return dp_engine_unclaim(e, run_batch(e, batch, 1, stats));
}

dp_status dp_engine_evaluate(dp_engine *e, const dp_batch *batch, dp_step_stats *stats)
{
    DP_TRY(dp_engine_claim(e, "dp_engine_evaluate"));
    return dp_engine_unclaim(e, run_batch(e, batch, 0, stats));
}

// --- predictions ------------------------------------------------------------------------

static dp_status predict(dp_engine *e, const dp_batch *batch)
{
    e->outputs_rows = 0; /* the last outputs are gone, whatever happens now */
    DP_TRY(check_usable(e));
    e->step_start = dp_now_seconds();
    DP_TRY(dp_engine_sync_replicas(e));
    DP_TRY(dp_step_agree_plan(e, dp_plan_batch(e, batch, 1, &e->plan)));
    dp_pool_reset_stats(&e->pool, e->step_start);
    DP_TRY(dp_step_predict(e));
    e->outputs_rows = batch->rows;
    return DP_OK;
}

dp_status dp_engine_predict(dp_engine *e, const dp_batch *batch)
{
    DP_TRY(dp_engine_claim(e, "dp_engine_predict"));
    return dp_engine_unclaim(e, predict(e, batch));
}

static dp_status need_outputs(const dp_engine *e, const char *call)
{
    if (e->outputs_rows) return DP_OK;
    return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: the engine holds no outputs; call "
                   "dp_engine_predict first (a failed prediction and dp_engine_release_outputs "
                   "leave none)", call);
}

dp_status dp_engine_outputs(dp_engine *e, size_t i, dp_outputs *out)
{
    DP_TRY(dp_engine_claim(e, "dp_engine_outputs"));
    dp_status s = need_outputs(e, "dp_engine_outputs");
    if (s == DP_OK && !out) s = DP_FAIL(DP_ERR_INVALID_ARGUMENT, "out must not be NULL");
    if (s == DP_OK && i >= e->L.k)
        s = DP_FAIL(DP_ERR_INVALID_ARGUMENT, "device %zu; this process's engine has devices 0 "
                    "to %zu (dp_engine_num_devices)", i, e->L.k - 1);
    if (s == DP_OK) {
        const worker *w = &e->w[i];
        out->device = w->dev;
        out->logits = w->out_rows ? w->outputs.ptr : NULL;
        out->row_begin = w->out_begin;
        out->rows = w->out_rows;
    }
    return dp_engine_unclaim(e, s);
}

dp_status dp_engine_outputs_to_host(dp_engine *e, float *host)
{
    DP_TRY(dp_engine_claim(e, "dp_engine_outputs_to_host"));
    dp_status s = need_outputs(e, "dp_engine_outputs_to_host");
    if (s == DP_OK && !host) s = DP_FAIL(DP_ERR_INVALID_ARGUMENT, "host must not be NULL");
    size_t row = e->model.outputs_per_row * e->model.n_classes * sizeof(float);
    for (size_t i = 0; s == DP_OK && i < e->L.k; i++) {
        const worker *w = &e->w[i];
        if (!w->out_rows) continue;
        s = dp_device_bind_thread(w->dev);
        if (s == DP_OK)
            s = dp_copy_d2h(w->dev, (char *)host + w->out_begin * row, w->outputs.ptr,
                            w->out_rows * row);
    }
    return dp_engine_unclaim(e, s);
}

dp_status dp_engine_release_outputs(dp_engine *e)
{
    DP_TRY(dp_engine_claim(e, "dp_engine_release_outputs"));
    e->outputs_rows = 0;
    for (size_t i = 0; i < e->L.k; i++) {
        e->w[i].out_rows = 0;
        dp_dbuf_release(e->w[i].dev, &e->w[i].outputs);
    }
    return dp_engine_unclaim(e, DP_OK);
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
    /* Flags are 0 or 1: ranks compare them, and a typo'd 2 is no setting. */
    if ((cfg->token_balanced | cfg->allow_tf32) & ~1)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "token_balanced %d, allow_tf32 %d; each is 0 "
                       "(off) or 1 (on)", cfg->token_balanced, cfg->allow_tf32);
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
        if (e) free(e->w);
        free(e);
        s = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
        return ranked ? dp_ranks_create_failed(dist, s) : s;
    }
    e->magic = DP_ENGINE_LIVE;
    e->model = *model;
    e->crit = *crit;
    e->cfg = *cfg;
    e->cfg.device_weights = NULL;
    e->bf16 = model->param_dtype == DP_DTYPE_BF16;
    e->psize = e->bf16 ? sizeof(dp_bf16) : sizeof(float);
    size_t bucket = cfg->bucket_bytes ? cfg->bucket_bytes : DP_BUCKET_DEFAULT_BYTES;
    e->bucket_floats = bucket == DP_BUCKET_OFF ? SIZE_MAX
                       : bucket < sizeof(float) ? 1
                                                : bucket / sizeof(float);
    e->lr = cfg->optim.lr;
    e->created = dp_now_seconds();
    atomic_flag_clear(&e->busy);
    for (size_t i = 0; i < k; i++) {
        e->w[i].e = e;
        e->w[i].id = (int)i;
        e->w[i].phase = DP_PHASE_COUNT;
    }
    dp_pool_init(&e->pool, e->w, k, cfg->watchdog_seconds);

    float weights[DP_MAX_DEVICES];
    for (size_t i = 0; i < k; i++) weights[i] = cfg->device_weights ? cfg->device_weights[i] : 1.0f;
    s = dp_ranks_join(e, ranked ? dist : NULL, devices, k, weights, &e->L);
    if (s == DP_OK)
        s = dp_transport_open(&e->tp, ranked ? dist : NULL, &e->L,
                              devices[0].kind == DP_DEVICE_CPU, cfg->watchdog_seconds);
    if (s == DP_OK) s = dp_opt_build_slices(e, &e->s);
    for (size_t i = 0; s == DP_OK && i < k; i++) {
        worker *w = &e->w[i];
        s = dp_device_open(&devices[i], &w->dev);
        /* A queue for the sums beside the backward (DP_CUDA_OVERLAP=1 on
         * GPUs), where the devices' gradients meet: across ranks the
         * transport's rounds run on it too (NCCL), ordered with the sums. */
        if (s == DP_OK && (ranked || k > 1)) s = dp_device_open_comm(w->dev, &w->comm);
        if (s == DP_OK && !w->comm) w->comm = w->dev;
        if (s == DP_OK && cfg->memory_limit) s = dp_device_set_limit(w->dev, cfg->memory_limit);
        if (s == DP_OK && cfg->allow_tf32) s = dp_device_set_allow_tf32(w->dev, 1);
        if (s == DP_OK && cfg->matmul_precision != DP_MATMUL_FP32)
            s = dp_device_set_matmul_precision(w->dev, cfg->matmul_precision);
    }
    if (s == DP_OK) s = dp_pool_start(&e->pool);
    /* With ranks every rank agrees on the outcome so far, whatever it is. */
    s = dp_step_setup(e, ranked ? dist : NULL, s);
    if (s == DP_OK) {
        float *host = calloc(model->n_params, sizeof *host);
        if (!host) s = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation of %zu parameters failed",
                               model->n_params);
        if (s == DP_OK) {
            dp_clear_error();
            s = model->init(model->ctx, host, cfg->seed);
            if (s != DP_OK) s = dp_callback_message(s, "the model's init");
        }
        /* With ranks set_params is collective: a rank that failed still
         * takes part (a NULL host is its failure). */
        if (s == DP_OK) s = dp_engine_set_params(e, host);
        else if (ranked) dp_engine_set_params(e, NULL);
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
    /* NULL, or (best effort) an engine destroyed already: nothing to do. */
    if (!dp_engine_live(e)) return;
    e->magic = DP_ENGINE_DEAD;
    dp_pool_stop(&e->pool);
    /* A transport that gave up on an exchange may still have MPI read or
     * write the buffers it registered (replicas, gradients, staging): the
     * devices holding them are left open, their memory never freed. */
    int pinned = dp_transport_pinned(&e->tp);
    dp_transport_close(&e->tp);
    for (size_t i = 0; !pinned && i < e->L.k; i++) {
        worker *w = &e->w[i];
        if (!w->dev) continue;
        dp_graph_release(w);
        dbuf *bufs[] = {&w->inputs, &w->targets, &w->workspace, &w->logits,
                        &w->dlogits, &w->scratch, &w->gathered, &w->gathered_d,
                        &w->features, &w->dfeatures, &w->outputs, &w->row_losses};
        for (size_t b = 0; b < sizeof bufs / sizeof *bufs; b++) dp_dbuf_release(w->dev, bufs[b]);
        dp_device_free(w->dev, w->params);
        dp_device_free(w->dev, w->grads);
    }
    if (!pinned) {
        dp_comm_teardown(e);
        dp_opt_free_state(e);
        for (size_t i = 0; i < e->L.k; i++) {
            if (e->w[i].comm != e->w[i].dev) dp_device_close_comm(e->w[i].comm);
            dp_device_close(e->w[i].dev);
        }
    }
    for (size_t i = 0; pinned && e->s && i < e->L.K; i++) free(e->s[i].segs);
    for (size_t i = 0; e->w && i < e->L.k; i++) free(e->w[i].row_losses_host);
    free(e->s);
    free(e->xfers);
    free(e->rounds);
    free(e->round_seq);
    free(e->xspans);
    free(e->w);
    free(e);
}
