/*
 * parallel/compute.c - forward, criterion and backward on one worker
 * (compute.h): the model's and criterion's callbacks, the logits buffers
 * and their chunks, balanced and gather mode.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "dp/checked.h"
#include "dp/ops.h"
#include "nn/nn_act16.h"
#include "parallel/callbacks.h"
#include "parallel/comm.h"
#include "parallel/compute.h"
#include "parallel/graph.h"
#include "parallel/plan.h"
#include "parallel/pool.h"

/* Rows [first, first + rows) of this worker's part of the plan. */
static dp_chunk chunk_of(const worker *w, const dp_plan *plan, size_t first, size_t rows,
                         int train)
{
    const dp_engine *e = w->e;
    const dp_model *m = &e->model;
    dp_chunk c;
    c.rows = rows;
    c.inputs = (const char *)w->inputs.ptr + first * m->input_row_bytes;
    c.targets = plan->batch->targets
                    ? (const char *)w->targets.ptr + first * dp_model_target_row_bytes(m)
                    : NULL;
    c.row_begin = plan->dev[w->id].row_begin + first;
    c.step = (uint64_t)e->t;
    c.seed = e->cfg.seed;
    c.training = train;
    c.ready = NULL; /* model_backward arms it */
    return c;
}

static int has_head(const dp_engine *e) { return e->model.head_forward != NULL; }

/* The chunked criterion in bfloat16 logits: a model with the bfloat16 head
 * and a criterion that takes them (dp/model.h). */
static int logits16(const dp_engine *e)
{
    return e->model.head_forward_bf16 != NULL && e->crit.bf16_logits;
}

/* A logits chunk of `rows` output rows: float32, or (logits16) bfloat16
 * followed by the bfloat16 head's float32 scratch: room for a copy of the
 * chunk's features and at least a row of float32 logits (half the chunk:
 * the buffer is then about the float32 chunk's size). */
static size_t chunk_scratch_floats(const dp_engine *e, size_t rows)
{
    size_t V = e->model.n_classes, half = rows * V / 2;
    return (half > V ? half : V) + rows * e->model.head_features + 64;
}

static size_t chunk16_bytes(const dp_engine *e, size_t rows)
{
    return (rows * e->model.n_classes * sizeof(uint16_t) + 255) / 256 * 256;
}

/* Balanced mode's criterion writes row losses (see row_losses_sum). */
static int defers(const dp_engine *e) { return e->crit.writes_row_losses; }

static size_t scratch_size(const dp_engine *e, size_t n)
{
    return e->crit.scratch_bytes ? e->crit.scratch_bytes(e->crit.ctx, n, e->model.n_classes) : 0;
}

/* Calls the criterion on n output rows whose plan has n_valid valid target
 * elements, and holds it to that count (dp/model.h's contract). */
static dp_status call_criterion(worker *w, const dp_plan *plan, double *loss, float *dlogits,
                                const float *logits, const void *targets, size_t n,
                                size_t n_valid, void *scratch, float *row_losses, int bf16)
{
    dp_engine *e = w->e;
    dp_criterion_args a;
    a.dev = w->dev;
    a.logits = logits;
    a.dlogits = dlogits;
    a.targets = targets;
    a.target_type = e->model.target_type;
    a.target_size = dp_model_target_size(&e->model);
    a.n = n;
    a.V = e->model.n_classes;
    a.n_valid = n_valid;
    a.dscale = plan->dscale;
    a.scratch = scratch;
    a.row_losses = row_losses;
    a.logits_dtype = bf16 ? DP_DTYPE_BF16 : DP_DTYPE_F32;
    size_t count = SIZE_MAX;
    *loss = 0.0;
    dp_clear_error();
    dp_status s = e->crit.forward_backward(e->crit.ctx, &a, loss, &count);
    if (s != DP_OK) return dp_callback_message(s, "the criterion");
    if (row_losses) *loss = 0.0; /* the rows are summed at the step's end; this is not read */
    if (count == SIZE_MAX)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "the criterion did not report how many target "
                       "elements it summed (*count_host unset; the engine counted %zu valid of "
                       "%zu); set it, see dp_criterion in dp/model.h", n_valid,
                       n * a.target_size);
    if (count != n_valid)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "the criterion summed %zu target elements but "
                       "the engine counted %zu valid ones (of %zu) in this chunk; a criterion "
                       "must skip ignored targets (class id -1, NaN value) and report the "
                       "elements it summed in *count_host", count, n_valid, n * a.target_size);
    /* The contract's zero gradient of ignored rows is the engine's to
     * keep: a criterion that leaves them alone (in balanced mode they hold
     * the logits) cannot make the step differ from gather mode's. */
    if (dlogits && n_valid < n * a.target_size)
        return bf16 ? dp_zero_ignored_rows_bf16(w->dev, (uint16_t *)dlogits, targets,
                                                a.target_type, a.target_size, n, a.V)
                    : dp_zero_ignored_rows(w->dev, dlogits, targets, a.target_type,
                                           a.target_size, n, a.V);
    return DP_OK;
}

/* Bytes of a (rows, width) float buffer; SIZE_MAX when that overflows, so
 * the allocation fails with a message instead of wrapping. */
static size_t float_bytes(size_t rows, size_t width)
{
    size_t b;
    return dp_size_mul(rows, width, &b) && dp_size_mul(b, sizeof(float), &b) ? b : SIZE_MAX;
}

/* The buffers of a micro-batch: workspace, the model's output (logits, or
 * features and their gradient for a model with a head) and the logits:
 * whole in gather mode (with a separate dlogits), one chunk in balanced
 * mode with a head. The chunk rule grows with n, so the largest
 * micro-batch sizes the buffers for every shorter one. */
static dp_status ensure_compute(worker *w, const dp_plan_device *d, int gather, int train)
{
    const dp_engine *e = w->e;
    const dp_model *m = &e->model;
    size_t n = d->micro_rows * m->outputs_per_row, V = m->n_classes, logit_rows = n;
    DP_TRY(dp_dbuf_ensure(w->dev, &w->workspace, m->workspace_bytes(m->ctx, d->micro_rows)));
    if (has_head(e)) {
        DP_TRY(dp_dbuf_ensure(w->dev, &w->features, float_bytes(n, m->head_features)));
        if (train) DP_TRY(dp_dbuf_ensure(w->dev, &w->dfeatures, float_bytes(n, m->head_features)));
        if (!gather) logit_rows = dp_plan_logits_chunk(e, n);
    }
    if (!gather && has_head(e) && logits16(e)) {
        size_t b16 = chunk16_bytes(e, logit_rows), sf = chunk_scratch_floats(e, logit_rows);
        size_t bytes = float_bytes(sf, 1);
        DP_TRY(dp_dbuf_ensure(w->dev, &w->logits, bytes > SIZE_MAX - b16 ? SIZE_MAX : b16 + bytes));
    } else {
        DP_TRY(dp_dbuf_ensure(w->dev, &w->logits, float_bytes(logit_rows, V)));
    }
    if (gather) DP_TRY(dp_dbuf_ensure(w->dev, &w->dlogits, float_bytes(n, V)));
    if (!gather && defers(e))
        DP_TRY(dp_dbuf_ensure(w->dev, &w->row_losses,
                              float_bytes(d->rows, m->outputs_per_row)));
    return DP_OK;
}

// --- row losses --------------------------------------------------------------------------
/*
 * Balanced mode with a criterion that writes row losses
 * (dp_criterion.writes_row_losses): each call writes its rows' losses into
 * w->row_losses at the rows' place among the device's output rows of the
 * step, on the device; row_losses_sum reads them all back once, after the
 * last micro-batch, and adds them as the calls would have returned them:
 * each call's rows in order in double, the calls' sums in order. So no
 * logits chunk waits for its device, and the loss has the same bits.
 */
/* The row losses of output rows [o, ...) of the device's step, or NULL. */
static float *row_losses_at(worker *w, size_t o)
{
    return defers(w->e) ? (float *)w->row_losses.ptr + o : NULL;
}

static double sum_rows(const float *x, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)x[i];
    return s;
}

/* w->loss_sum from the row losses of this device's micro-batches, grouped
 * as balanced mode's criterion calls: a whole micro-batch, or its logits
 * chunks for a model with a head. */
static dp_status row_losses_sum(worker *w, const dp_plan *plan)
{
    const dp_engine *e = w->e;
    const dp_plan_device *d = &plan->dev[w->id];
    size_t opr = e->model.outputs_per_row, total = d->rows * opr;
    if (total > w->row_losses_cap) {
        float *h = realloc(w->row_losses_host, total * sizeof(float));
        if (!h)
            return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of host memory "
                           "for the step's row losses", total * sizeof(float));
        w->row_losses_host = h;
        w->row_losses_cap = total;
    }
    DP_TRY(dp_copy_d2h(w->dev, w->row_losses_host, w->row_losses.ptr, total * sizeof(float)));
    for (size_t j = 0; j < d->n_micro; j++) {
        size_t first, rows = dp_plan_micro_rows(d, j, &first);
        if (!rows) break;
        const float *x = w->row_losses_host + first * opr;
        size_t n = rows * opr, c = has_head(e) ? dp_plan_logits_chunk(e, n) : n;
        double loss = 0.0;
        for (size_t o = 0; o < n; o += c) loss += sum_rows(x + o, n - o < c ? n - o : c);
        w->loss_sum += loss;
    }
    return DP_OK;
}

// --- balanced mode -------------------------------------------------------------------------

/* Balanced mode's criterion on micro-batch rows [first, first + rows) of this worker. */
static dp_status criterion(worker *w, const dp_plan *plan, double *loss, float *dlogits,
                           const float *logits, const void *targets, size_t first, size_t rows)
{
    dp_engine *e = w->e;
    size_t n = rows * e->model.outputs_per_row, sb = scratch_size(e, n);
    DP_TRY(dp_dbuf_ensure(w->dev, &w->scratch, sb));
    size_t valid = dp_plan_valid_targets(e, plan->batch->targets,
                                         plan->dev[w->id].row_begin + first, rows);
    return call_criterion(w, plan, loss, dlogits, logits, targets, n, valid,
                          sb ? w->scratch.ptr : NULL,
                          row_losses_at(w, first * e->model.outputs_per_row), 0);
}

/* Balanced mode with a head: head, criterion and (train) head backward
 * over chunks of the micro-batch's output rows, in row order; the chunks'
 * loss sums add in that order. */
static dp_status chunked_criterion(worker *w, const dp_plan *plan, double *loss, int train,
                                   const void *targets, size_t first, size_t rows)
{
    dp_engine *e = w->e;
    size_t opr = e->model.outputs_per_row, n = rows * opr, c = dp_plan_logits_chunk(e, n);
    size_t tg_out = dp_model_target_row_bytes(&e->model) / opr; /* target bytes per output row */
    size_t out0 = (plan->dev[w->id].row_begin + first) * opr; /* the batch's index of output row 0 */
    int b16 = logits16(e);
    float *logits = w->logits.ptr;
    /* bfloat16: the chunk's logits, then the head's float32 scratch */
    float *scratch16 = b16 ? (float *)((char *)w->logits.ptr + chunk16_bytes(e, c)) : NULL;
    size_t scratch16_floats = b16 ? chunk_scratch_floats(e, c) : 0;
    *loss = 0.0;
    for (size_t o = 0; o < n; o += c) {
        size_t m = n - o < c ? n - o : c, sb = scratch_size(e, m);
        if (b16)
            DP_TRY(dp_call_head_forward16(w, o, m, (uint16_t *)logits, scratch16,
                                          scratch16_floats));
        else
            DP_TRY(dp_call_head_forward(w, o, m, logits));
        DP_TRY(dp_dbuf_ensure(w->dev, &w->scratch, sb));
        size_t valid = dp_plan_valid_outputs(e, plan->batch->targets, out0 + o, m);
        double l = 0.0;
        /* dlogits overwrite the chunk's logits in place. */
        DP_TRY(call_criterion(w, plan, &l, train ? logits : NULL, logits,
                              (const char *)targets + o * tg_out, m, valid,
                              sb ? w->scratch.ptr : NULL, row_losses_at(w, first * opr + o), b16));
        *loss += l;
        if (train && b16)
            DP_TRY(dp_call_head_backward16(w, o, m, (const uint16_t *)logits));
        else if (train)
            DP_TRY(dp_call_head_backward(w, o, m, logits));
    }
    return DP_OK;
}

/* Enters phase ph unless recording (graph.h); 1 when the worker has failed. */
static int enter(worker *w, dp_phase ph, int recording)
{
    return !recording && dp_worker_enter_phase(w, ph);
}

/* Balanced: each micro-batch runs forward, the local criterion and
 * backward. With a head the criterion phase runs the head too, chunk by
 * chunk, and backward starts from the features' gradient. A dp_graph_body. */
static dp_status micro_batches(worker *w, const dp_plan *plan, int train, int recording)
{
    const dp_plan_device *d = &plan->dev[w->id];
    int head = has_head(w->e);
    for (size_t j = 0; j < d->n_micro; j++) {
        size_t first, rows = dp_plan_micro_rows(d, j, &first);
        if (!rows) break;
        dp_chunk c = chunk_of(w, plan, first, rows, train);
        if (enter(w, DP_PHASE_FORWARD, recording)) return w->status;
        DP_TRY(ensure_compute(w, d, 0, train));
        DP_TRY(dp_call_forward(w, &c, w->logits.ptr));
        if (enter(w, DP_PHASE_CRITERION, recording)) return w->status;
        double loss = 0.0;
        float *logits = w->logits.ptr;
        if (head) {
            DP_TRY(chunked_criterion(w, plan, &loss, train, c.targets, first, rows));
        } else {
            /* dlogits overwrite the logits in place: no second V-wide buffer. */
            DP_TRY(criterion(w, plan, &loss, train ? logits : NULL, logits, c.targets, first,
                             rows));
        }
        w->loss_sum += loss; /* 0 with row losses: row_losses_sum adds them */
        if (!train) continue;
        if (enter(w, DP_PHASE_BACKWARD, recording)) return w->status;
        DP_TRY(dp_call_backward(w, &c, head ? w->dfeatures.ptr : logits,
                                first + rows == d->rows));
    }
    return DP_OK;
}

/* FNV-1a over the valid target counts of micro_batches' criterion calls,
 * in their order (graph.h: a chunk with ignored targets runs a kernel
 * more). Cheap when every target is valid: the count of the device's. */
static uint64_t valid_key(const worker *w, const dp_plan *plan)
{
    const dp_engine *e = w->e;
    const dp_plan_device *d = &plan->dev[w->id];
    size_t opr = e->model.outputs_per_row;
    uint64_t h = 14695981039346656037ULL;
    size_t all = d->rows * opr * dp_model_target_size(&e->model);
    if (!plan->batch->targets || d->valid == all) return h ^ d->valid;
    for (size_t j = 0; j < d->n_micro; j++) {
        size_t first, rows = dp_plan_micro_rows(d, j, &first);
        if (!rows) break;
        size_t n = rows * opr, c = has_head(e) ? dp_plan_logits_chunk(e, n) : n;
        for (size_t o = 0; o < n; o += c) {
            size_t m = n - o < c ? n - o : c;
            size_t v = has_head(e) ? dp_plan_valid_outputs(e, plan->batch->targets,
                                                           (d->row_begin + first) * opr + o, m)
                                   : dp_plan_valid_targets(e, plan->batch->targets,
                                                           d->row_begin + first, rows);
            h = (h ^ v) * 1099511628211ULL;
        }
    }
    return h;
}

void dp_compute_balanced(worker *w, const dp_plan *plan, int train)
{
    const dp_plan_device *d = &plan->dev[w->id];
    w->loss_sum = 0.0;
    if (!d->rows) {
        /* An idle device still passes through the phases (fault hooks, timing). */
        ENTER(w, DP_PHASE_FORWARD);
        ENTER(w, DP_PHASE_CRITERION);
        if (train) ENTER(w, DP_PHASE_BACKWARD);
        return;
    }
    uint64_t vk = dp_graph_eligible(w) ? valid_key(w, plan) : 0;
    dp_status s = dp_graph_compute(w, plan, train, vk, micro_batches);
    if (s != DP_OK && w->status == DP_OK) dp_worker_fail(w, s);
    if (w->status != DP_OK) return;
    if (defers(w->e)) CHECK(w, row_losses_sum(w, plan));
}

/* Valid target elements of local device d's rows of micro-batch j. */
static size_t micro_valid(const dp_engine *e, const dp_plan *plan, size_t d, size_t j)
{
    size_t f, r = dp_plan_micro_rows(&plan->dev[d], j, &f);
    return r ? dp_plan_valid_targets(e, plan->batch->targets, plan->dev[d].row_begin + f, r) : 0;
}

/* The root's part of gather mode's criterion for micro-batch j: gather
 * every device's logits and targets, loss and dlogits for all of them. */
static dp_status root_criterion(worker *w, const dp_plan *plan, size_t j)
{
    dp_engine *e = w->e;
    size_t V = e->model.n_classes, opr = e->model.outputs_per_row;
    size_t tg_out = dp_model_target_row_bytes(&e->model) / opr; /* target bytes per output row */
    size_t total = dp_comm_gather_rows(e, plan, j);
    if (!total) return DP_OK;
    size_t sb = scratch_size(e, total);
    DP_TRY(dp_dbuf_ensure(w->dev, &w->gathered, total * V * sizeof(float)));
    DP_TRY(dp_dbuf_ensure(w->dev, &w->gathered_d, total * V * sizeof(float)));
    /* dlogits start zeroed (dp/model.h): a criterion may leave ignored rows alone. */
    DP_TRY(dp_memset(w->dev, w->gathered_d.ptr, 0, total * V * sizeof(float)));
    /* The gathered targets ride at the end of the criterion scratch (kept
     * float-aligned). */
    size_t sb_al = (sb + 255) / 256 * 256;
    DP_TRY(dp_dbuf_ensure(w->dev, &w->scratch, sb_al + total * tg_out));
    void *tg = (char *)w->scratch.ptr + sb_al;
    void *scratch = sb ? w->scratch.ptr : NULL;
    DP_TRY(dp_comm_gather_logits(w, plan, j, w->gathered.ptr, tg));
    size_t valid = 0;
    for (size_t d = 0; d < e->L.k; d++) valid += micro_valid(e, plan, d, j);
    double loss = 0.0;
    DP_TRY(call_criterion(w, plan, &loss, w->gathered_d.ptr, w->gathered.ptr, tg, total, valid,
                          scratch, NULL, 0));
    if (isfinite(loss)) {
        w->loss_sum += loss;
        return DP_OK;
    }
    /* Rare path: attribute the non-finite loss to the devices whose rows
     * produced it (the others wait at the barrier). */
    size_t off = 0;
    for (size_t d = 0; d < e->L.k; d++) {
        size_t f, nd = dp_plan_micro_rows(&plan->dev[d], j, &f) * opr;
        double ld = 0.0;
        if (nd)
            DP_TRY(call_criterion(w, plan, &ld, NULL, (const float *)w->gathered.ptr + off * V,
                                  (const char *)tg + off * tg_out, nd,
                                  micro_valid(e, plan, d, j), scratch, NULL, 0));
        e->w[d].loss_sum += ld;
        off += nd;
    }
    return DP_OK;
}

void dp_compute_gather(worker *w, const dp_plan *plan)
{
    dp_engine *e = w->e;
    const dp_plan_device *d = &plan->dev[w->id];
    int head = has_head(e);
    w->loss_sum = 0.0;
    for (size_t j = 0; j < plan->gather_steps; j++) {
        size_t first, rows = dp_plan_micro_rows(d, j, &first);
        dp_chunk c = chunk_of(w, plan, first, rows, 1);
        ENTER(w, DP_PHASE_FORWARD);
        if (rows) {
            CHECK(w, ensure_compute(w, d, 1, 1));
            CHECK(w, dp_call_forward(w, &c, w->logits.ptr));
            /* A head computes the whole micro-batch's logits: they are gathered. */
            if (head)
                CHECK(w, dp_call_head_forward(w, 0, rows * e->model.outputs_per_row,
                                              w->logits.ptr));
        }
        SYNC(w);
        ENTER(w, DP_PHASE_CRITERION);
        if (w->id == 0) CHECK(w, root_criterion(w, plan, j));
        SYNC(w);
        if (rows) CHECK(w, dp_comm_scatter_dlogits(w, plan, j, rows));
        ENTER(w, DP_PHASE_BACKWARD);
        if (rows && head) {
            CHECK(w, dp_call_head_backward(w, 0, rows * e->model.outputs_per_row, w->dlogits.ptr));
            CHECK(w, dp_call_backward(w, &c, w->dfeatures.ptr, first + rows == d->rows));
        } else if (rows) {
            CHECK(w, dp_call_backward(w, &c, w->dlogits.ptr, first + rows == d->rows));
        }
    }
}

// --- predictions -------------------------------------------------------------------------

/* The buffers of a prediction: the workspace (and the features, for a
 * model with a head) of a micro-batch when the device has rows, and the
 * outputs of the `held` rows it keeps. */
static dp_status ensure_predict(worker *w, const dp_plan_device *d, size_t held)
{
    const dp_model *m = &w->e->model;
    size_t opr = m->outputs_per_row;
    if (d->rows) {
        DP_TRY(dp_dbuf_ensure(w->dev, &w->workspace, m->workspace_bytes(m->ctx, d->micro_rows)));
        if (has_head(w->e))
            DP_TRY(dp_dbuf_ensure(w->dev, &w->features,
                                  float_bytes(d->micro_rows * opr, m->head_features)));
    }
    return dp_dbuf_ensure(w->dev, &w->outputs, float_bytes(held * opr, m->n_classes));
}

/* The forward of this worker's rows into w->outputs, micro-batch by
 * micro-batch (with a head: the head over the same chunks of output rows
 * as the criterion's, so the logits are those evaluation sees). */
static dp_status predict_rows(worker *w, const dp_plan *plan)
{
    const dp_engine *e = w->e;
    const dp_model *m = &e->model;
    const dp_plan_device *d = &plan->dev[w->id];
    size_t opr = m->outputs_per_row, V = m->n_classes;
    for (size_t j = 0; j < d->n_micro; j++) {
        size_t first, rows = dp_plan_micro_rows(d, j, &first);
        if (!rows) break;
        dp_chunk c = chunk_of(w, plan, first, rows, 0);
        float *out = (float *)w->outputs.ptr + first * opr * V;
        DP_TRY(dp_call_forward(w, &c, out));
        if (!has_head(e)) continue;
        size_t n = rows * opr, step = dp_plan_logits_chunk(e, n);
        for (size_t o = 0; o < n; o += step)
            DP_TRY(dp_call_head_forward(w, o, n - o < step ? n - o : step, out + o * V));
    }
    return DP_OK;
}

void dp_compute_predict(worker *w, const dp_plan *plan)
{
    dp_engine *e = w->e;
    const dp_plan_device *d = &plan->dev[w->id];
    int gather = e->cfg.mode == DP_MODE_GATHER && e->L.k > 1;
    /* Gather mode's root keeps every local device's rows (theirs first). */
    size_t held = d->rows;
    for (size_t i = 1; gather && w->id == 0 && i < e->L.k; i++) held += plan->dev[i].rows;
    w->out_begin = d->row_begin;
    w->out_rows = 0;
    ENTER(w, DP_PHASE_FORWARD);
    if (held) CHECK(w, ensure_predict(w, d, held));
    CHECK(w, predict_rows(w, plan));
    if (gather) {
        SYNC(w);
        if (w->id == 0) CHECK(w, dp_comm_gather_outputs(w, plan));
    }
    /* The others' rows are the root's now: theirs were its staging. */
    w->out_rows = gather && w->id != 0 ? 0 : held;
}
