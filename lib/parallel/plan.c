/*
 * parallel/plan.c - planning a batch on the caller's thread, before any
 * device work: the split of rows over the devices (equal, weighted or
 * token-balanced), each device's micro-batches, and N, the valid target
 * elements (class ids other than -1, float values other than NaN).
 * Pure functions of the batch and the configuration, and the checks of
 * the configuration and device list they rely on.
 */
#include <math.h>
#include <stdlib.h>

#include "dp/checked.h"
#include "parallel/plan.h"
#include "parallel/state.h"

// --- the user's callbacks -------------------------------------------------------------

dp_status dp_callback_message(dp_status s, const char *what)
{
    const char *own = dp_last_error(); /* the callback's dp_set_error message, if any */
    if ((int)s <= (int)DP_OK || (int)s >= (int)DP_STATUS_COUNT) /* a caller switching on it */
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s returned %d, which is no dp_status; "
                       "return DP_OK or a DP_ERR_ code of dp/status.h%s%s", what, (int)s,
                       own[0] ? "; its message: " : "", own);
    if (own[0]) return s;
    return DP_FAIL(s, "%s returned \"%s\" without a message; describe the problem with "
                   "dp_set_error (dp/status.h)", what, dp_strerror(s));
}

// --- the configuration ---------------------------------------------------------------

static dp_status check_config(const dp_engine_config *c, size_t k)
{
    if ((unsigned)c->mode >= DP_MODE_COUNT)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "unknown mode %d; use balanced or gather", (int)c->mode);
    if ((unsigned)c->optim.kind >= DP_OPTIMIZER_COUNT)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "unknown optimizer %d", (int)c->optim.kind);
    const dp_optim_config *o = &c->optim;
    if (!(o->lr >= 0.0f) || !isfinite(o->lr) || !(o->weight_decay >= 0.0f) ||
        !isfinite(o->weight_decay) || !(o->grad_clip >= 0.0f) || !isfinite(o->grad_clip))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "lr, weight_decay and grad_clip must be finite "
                       "and >= 0 (got %g, %g, %g)", o->lr, o->weight_decay, o->grad_clip);
    if (o->kind == DP_OPTIMIZER_ADAMW &&
        (!(o->beta1 >= 0.0f && o->beta1 < 1.0f) || !(o->beta2 >= 0.0f && o->beta2 < 1.0f) ||
         !(o->eps > 0.0f) || !isfinite(o->eps)))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "AdamW needs 0 <= beta1, beta2 < 1 and eps > 0 "
                       "(got beta1 %g, beta2 %g, eps %g)", o->beta1, o->beta2, o->eps);
    if (o->kind == DP_OPTIMIZER_SGD && !(o->momentum >= 0.0f && o->momentum < 1.0f))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "SGD momentum must be in [0, 1)");
    if (c->grad_accum < 0)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "grad_accum must be >= 1 (got %d)", c->grad_accum);
    if (c->watchdog_seconds != 0.0 && !(c->watchdog_seconds >= DP_WATCHDOG_MIN_SECONDS &&
                                        c->watchdog_seconds <= DP_WATCHDOG_MAX_SECONDS))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "watchdog_seconds is %g; use 0 (off) or %g to %g "
                       "seconds", c->watchdog_seconds, DP_WATCHDOG_MIN_SECONDS,
                       DP_WATCHDOG_MAX_SECONDS);
    if ((unsigned)c->matmul_precision >= DP_MATMUL_PRECISION_COUNT)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "matmul_precision %d; use DP_MATMUL_FP32, "
                       "DP_MATMUL_TF32 or DP_MATMUL_BF16", (int)c->matmul_precision);
    if (c->allow_tf32 && c->matmul_precision != DP_MATMUL_FP32 &&
        c->matmul_precision != DP_MATMUL_TF32)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "allow_tf32 asks for TF32 GEMMs and "
                       "matmul_precision for %s; set one of them",
                       dp_matmul_precision_name(c->matmul_precision));
    if (c->check_replicas_every < 0)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "check_replicas_every is %ld; use 0 (off) or a "
                       "step interval >= 1", c->check_replicas_every);
    if (c->device_weights) {
        double sum = 0.0;
        for (size_t i = 0; i < k; i++) {
            if (!(c->device_weights[i] >= 0.0f) || !isfinite(c->device_weights[i]))
                return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "device weight %zu is %g; weights must be "
                               "finite and >= 0", i, c->device_weights[i]);
            sum += c->device_weights[i];
        }
        /* With ranks a rank may sit out; the job's sum is checked at create (ranks.c). */
        if (sum <= 0.0 && dp_dist_size(c->dist) <= 1)
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "device weights are all zero; give at least "
                           "one device a positive share");
    }
    return DP_OK;
}

/* The device list's rules (dp_device_list_parse): one kind, and a CPU
 * device at most once; a GPU may carry several logical devices. */
static dp_status check_devices(const dp_device_spec *d, size_t k)
{
    for (size_t i = 1; i < k; i++) {
        if (d[i].kind != d[0].kind)
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "devices[0] and devices[%zu] are of different "
                           "kinds (cpu and cuda); use one kind", i);
        for (size_t j = 0; d[i].kind == DP_DEVICE_CPU && j < i; j++)
            if (d[j].kind == DP_DEVICE_CPU && d[j].index == d[i].index)
                return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "devices[%zu] and devices[%zu] are both "
                               "cpu:%d; each CPU device may appear once (cpu:0,cpu:1 for two)",
                               j, i, d[i].index);
    }
    return DP_OK;
}

dp_status dp_plan_check_config(const dp_engine_config *cfg, const dp_device_spec *devices,
                               size_t k)
{
    DP_TRY(check_config(cfg, k));
    return check_devices(devices, k);
}

// --- targets -----------------------------------------------------------------------

/* Whether target element i is valid (not -1 / NaN). */
static int target_valid(const dp_model *m, const void *targets, size_t i)
{
    if (m->target_type == DP_TARGET_F32) return !isnan(((const float *)targets)[i]);
    return ((const int32_t *)targets)[i] >= 0;
}

size_t dp_plan_valid_outputs(const dp_engine *e, const void *targets, size_t first, size_t n)
{
    const dp_model *m = &e->model;
    size_t per = dp_model_target_size(m), v = 0;
    for (size_t i = first * per; i < (first + n) * per; i++) v += target_valid(m, targets, i);
    return v;
}

size_t dp_plan_valid_targets(const dp_engine *e, const void *targets, size_t first, size_t rows)
{
    size_t opr = e->model.outputs_per_row;
    return dp_plan_valid_outputs(e, targets, first * opr, rows * opr);
}

/* The automatic chunk's floor: DP_LOGITS_CHUNK_MIN_ROWS_GPU where any of
 * this process's devices is a GPU, else DP_LOGITS_CHUNK_MIN_ROWS. */
static size_t min_chunk_rows(const dp_engine *e)
{
    for (size_t i = 0; i < e->pool.k; i++)
        if (dp_device_kind_of(e->pool.w[i].dev) == DP_DEVICE_CUDA) return DP_LOGITS_CHUNK_MIN_ROWS_GPU;
    return DP_LOGITS_CHUNK_MIN_ROWS;
}

size_t dp_plan_logits_chunk(const dp_engine *e, size_t n)
{
    size_t c = e->cfg.logits_chunk_rows;
    if (c == 0) {
        /* ceil(n F / V), in double because n F may pass SIZE_MAX. */
        double f = ceil((double)n * (double)e->model.head_features / (double)e->model.n_classes);
        size_t lo = min_chunk_rows(e);
        c = f >= (double)n ? n : f < (double)lo ? lo : (size_t)f;
    }
    return c < n ? c : n;
}

/* Checks every target element of the batch; *valid = the valid ones (N),
 * of which there must be one when some_valid. */
static dp_status check_targets(const dp_model *m, const void *targets, size_t n, int some_valid,
                               size_t *valid)
{
    size_t v = 0;
    if (m->target_type == DP_TARGET_F32) {
        const float *t = targets;
        for (size_t i = 0; i < n; i++) {
            if (isinf(t[i]))
                return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "target %g at element %zu is infinite; "
                               "use a finite value, or NaN to ignore the element", (double)t[i], i);
            v += !isnan(t[i]);
        }
    } else {
        const int32_t *t = targets;
        /* A padded model's classes end before its logits (dp_model.target_classes). */
        size_t classes = m->target_classes ? m->target_classes : m->n_classes;
        for (size_t i = 0; i < n; i++) {
            if (t[i] < -1 || (t[i] >= 0 && (size_t)t[i] >= classes)) {
                if (classes < m->n_classes && t[i] >= 0 && (size_t)t[i] < m->n_classes)
                    return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "target %d at position %zu is in "
                                   "the model's padding: its classes are [0, %zu), its %zu "
                                   "logits per row padded past them; use ids below %zu, or -1 "
                                   "to ignore a position", (int)t[i], i, classes, m->n_classes,
                                   classes);
                return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "target %d at position %zu is outside "
                               "[-1, %zu); use -1 to ignore a position", (int)t[i], i, classes);
            }
            v += t[i] >= 0;
        }
    }
    if (!v && some_valid)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "the batch has no valid target (all %s): its "
                       "mean loss is undefined", m->target_type == DP_TARGET_F32 ? "NaN" : "-1");
    *valid = v;
    return DP_OK;
}

// --- the split ---------------------------------------------------------------------

dp_status dp_engine_plan(const dp_engine *e, size_t rows, const void *targets,
                         size_t *rows_out)
{
    if (!e || !rows_out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "engine and rows_out must not be NULL");
    if (e->magic != DP_ENGINE_LIVE)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "engine is not a live engine: it was destroyed "
                       "(dp_engine_destroy); using an engine after destroying it is undefined "
                       "(dp/engine.h)");
    /* The shares are computed in double: past 2^53 rows they are no longer
     * exact (and a count of rows + 1 could wrap). */
    if ((unsigned long long)rows > 1ULL << 53)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%zu rows: a batch has at most 2^53 rows; split "
                       "it into smaller batches", rows);
    size_t k = e->L.K; /* every device of the job, over every rank */
    const float *weights = e->L.weights;
    double W = 0.0;
    for (size_t i = 0; i < k; i++) W += weights[i];
    if (!e->cfg.token_balanced || !targets) {
        /* floor of each share, then the remainder one row each to the first devices */
        size_t given = 0;
        for (size_t i = 0; i < k; i++) {
            rows_out[i] = (size_t)floor((double)rows * weights[i] / W);
            given += rows_out[i];
        }
        /* A share rounded up to the next integer could make the floors
         * sum past rows: take the excess back from the last devices. */
        for (size_t i = k; given > rows && i-- > 0;) {
            size_t d = rows_out[i] < given - rows ? rows_out[i] : given - rows;
            rows_out[i] -= d;
            given -= d;
        }
        for (size_t i = 0; given < rows; i = (i + 1) % k)
            if (weights[i] > 0.0f) {
                rows_out[i]++;
                given++;
            }
        return DP_OK;
    }
    /* Token-balanced: cut the rows where the running count of valid targets
     * is nearest each device's cumulative share. */
    size_t total = 0;
    size_t *cum = malloc((rows + 1) * sizeof *cum);
    if (!cum) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "plan: host allocation failed");
    cum[0] = 0;
    for (size_t r = 0; r < rows; r++) cum[r + 1] = cum[r] + dp_plan_valid_targets(e, targets, r, 1);
    total = cum[rows];
    size_t prev = 0;
    double acc = 0.0;
    for (size_t i = 0; i < k; i++) {
        acc += weights[i];
        size_t cut = rows;
        if (i + 1 < k) {
            double goal = (double)total * acc / W;
            cut = prev;
            while (cut < rows && fabs((double)cum[cut + 1] - goal) <= fabs((double)cum[cut] - goal))
                cut++;
        }
        rows_out[i] = cut - prev;
        prev = cut;
    }
    free(cum);
    return DP_OK;
}

/* The micro-batches of a device's rows: as many as grad_accum asks, and
 * as the row and token limits need. */
static dp_status plan_micro(const dp_engine *e, dp_plan_device *d)
{
    const dp_model *m = &e->model;
    size_t nm = e->cfg.grad_accum > 1 ? (size_t)e->cfg.grad_accum : 1;
    if (e->cfg.max_rows_per_micro) {
        size_t need = (d->rows + e->cfg.max_rows_per_micro - 1) / e->cfg.max_rows_per_micro;
        if (need > nm) nm = need;
    }
    if (e->cfg.max_tokens_per_micro) {
        size_t per = e->cfg.max_tokens_per_micro / m->outputs_per_row;
        if (per == 0)
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "max_tokens_per_micro %zu is smaller "
                           "than one row (%zu tokens); raise it", e->cfg.max_tokens_per_micro,
                           m->outputs_per_row);
        size_t need = (d->rows + per - 1) / per;
        if (need > nm) nm = need;
    }
    if (d->rows == 0) {
        d->n_micro = 0;
        d->micro_rows = 0;
    } else {
        if (nm > d->rows) nm = d->rows;
        d->micro_rows = (d->rows + nm - 1) / nm;
        d->n_micro = (d->rows + d->micro_rows - 1) / d->micro_rows;
    }
    return DP_OK;
}

dp_status dp_plan_batch(const dp_engine *e, const dp_batch *b, int predict, dp_plan *plan)
{
    const dp_model *m = &e->model;
    if (!b || !b->inputs || (!predict && !b->targets))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "batch, its inputs and targets must not be NULL");
    if (b->rows == 0)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "empty batch (0 rows); pass at least one row");
    size_t n_out;
    if (!dp_size_mul(b->rows, m->outputs_per_row, &n_out))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "batch of %zu rows of %zu outputs overflows size_t",
                       b->rows, m->outputs_per_row);
    size_t valid = 0, n_tg;
    if (!dp_size_mul(n_out, dp_model_target_size(m), &n_tg))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "batch of %zu rows of targets overflows size_t",
                       b->rows);
    if (b->targets) DP_TRY(check_targets(m, b->targets, n_tg, !predict, &valid));
    if (m->validate_inputs) {
        dp_clear_error();
        dp_status s = m->validate_inputs(m->ctx, b->inputs, b->rows);
        if (s != DP_OK) {
            if (dp_last_error()[0]) dp_error_prefix("validate_inputs");
            return dp_callback_message(s, "the model's validate_inputs");
        }
    }
    plan->batch = b;
    plan->n_valid = valid;
    plan->dscale = valid ? (float)(1.0 / (double)valid) : 0.0f;

    DP_TRY(dp_engine_plan(e, b->rows, b->targets, plan->grows));
    size_t begin = 0, gather_steps = 0;
    for (size_t g = 0; g < e->L.g0; g++) begin += plan->grows[g]; /* the other ranks' rows before ours */
    for (size_t i = 0; i < e->L.k; i++) {
        dp_plan_device *d = &plan->dev[i];
        d->row_begin = begin;
        d->rows = plan->grows[e->L.g0 + i];
        begin += d->rows;
        d->valid = b->targets ? dp_plan_valid_targets(e, b->targets, d->row_begin, d->rows) : 0;
        DP_TRY(plan_micro(e, d));
        if (d->n_micro > gather_steps) gather_steps = d->n_micro;
    }
    plan->gather_steps = gather_steps;
    return DP_OK;
}
