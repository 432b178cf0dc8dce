/*
 * parallel/compute.c - the compute phases of a step on one worker:
 * forward, criterion and backward over its micro-batches. Balanced mode
 * runs the criterion on every device; gather mode (nn.DataParallel)
 * gathers the logits on the root, which computes the loss and dlogits for
 * the whole micro-batch and scatters each device its slice (comm.h).
 */
#include <math.h>
#include <stdint.h>

#include "parallel/comm.h"

static dp_chunk chunk_of(const worker *w, size_t first, size_t rows)
{
    const dp_model *m = &w->e->model;
    dp_chunk c;
    c.rows = rows;
    c.inputs = (const char *)w->inputs.ptr + first * m->input_row_bytes;
    c.targets = (const char *)w->targets.ptr + first * dp_model_target_row_bytes(m);
    return c;
}

// --- the user's callbacks ---------------------------------------------------------

void dp_callback_message(dp_status s, const char *what)
{
    if (dp_last_error()[0]) return; /* the callback's own dp_set_error message */
    DP_FAIL(s, "%s returned \"%s\" without a message; describe the problem with "
            "dp_set_error (dp/status.h)", what, dp_strerror(s));
}

static dp_status model_forward(worker *w, const dp_chunk *c)
{
    const dp_model *m = &w->e->model;
    dp_clear_error();
    dp_status s = m->forward(m->ctx, w->dev, w->params, c, w->workspace.ptr, w->logits.ptr);
    if (s != DP_OK) dp_callback_message(s, "the model's forward");
    return s;
}

static dp_status model_backward(worker *w, const dp_chunk *c, float *dlogits)
{
    const dp_model *m = &w->e->model;
    dp_clear_error();
    dp_status s = m->backward(m->ctx, w->dev, w->params, w->grads, c, w->workspace.ptr, dlogits);
    if (s != DP_OK) dp_callback_message(s, "the model's backward");
    return s;
}

static size_t scratch_size(const dp_engine *e, size_t n)
{
    return e->crit.scratch_bytes ? e->crit.scratch_bytes(e->crit.ctx, n, e->model.n_classes) : 0;
}

/* Calls the criterion on n output rows whose plan has n_valid valid target
 * elements, and holds it to that count (dp/model.h's contract). */
static dp_status call_criterion(worker *w, double *loss, float *dlogits, const float *logits,
                                const void *targets, size_t n, size_t n_valid, void *scratch)
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
    a.dscale = e->dscale;
    a.scratch = scratch;
    size_t count = SIZE_MAX;
    *loss = 0.0;
    dp_clear_error();
    dp_status s = e->crit.forward_backward(e->crit.ctx, &a, loss, &count);
    if (s != DP_OK) {
        dp_callback_message(s, "the criterion");
        return s;
    }
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
    return DP_OK;
}

static dp_status ensure_compute(worker *w, int need_dlogits)
{
    const dp_model *m = &w->e->model;
    size_t n = w->micro_rows * m->outputs_per_row;
    DP_TRY(dp_dbuf_ensure(w->dev, &w->workspace, m->workspace_bytes(m->ctx, w->micro_rows)));
    DP_TRY(dp_dbuf_ensure(w->dev, &w->logits, n * m->n_classes * sizeof(float)));
    if (need_dlogits) DP_TRY(dp_dbuf_ensure(w->dev, &w->dlogits, n * m->n_classes * sizeof(float)));
    return DP_OK;
}

/* Balanced mode's criterion on micro-batch rows [first, first + rows) of this worker. */
static dp_status criterion(worker *w, double *loss, float *dlogits, const float *logits,
                           const void *targets, size_t first, size_t rows)
{
    dp_engine *e = w->e;
    size_t n = rows * e->model.outputs_per_row, sb = scratch_size(e, n);
    DP_TRY(dp_dbuf_ensure(w->dev, &w->scratch, sb));
    size_t valid = dp_plan_valid_targets(e, e->batch->targets, w->row_begin + first, rows);
    return call_criterion(w, loss, dlogits, logits, targets, n, valid, sb ? w->scratch.ptr : NULL);
}

/* Balanced: each micro-batch runs forward, the local criterion and backward. */
void dp_compute_balanced(worker *w, int train)
{
    if (!w->rows) {
        /* An idle device still passes through the phases (fault hooks, timing). */
        ENTER(w, DP_PHASE_FORWARD);
        ENTER(w, DP_PHASE_CRITERION);
        if (train) ENTER(w, DP_PHASE_BACKWARD);
        return;
    }
    for (size_t j = 0; j < w->n_micro; j++) {
        size_t first, rows = dp_micro_rows(w, j, &first);
        if (!rows) break;
        dp_chunk c = chunk_of(w, first, rows);
        ENTER(w, DP_PHASE_FORWARD);
        CHECK(w, ensure_compute(w, 0));
        CHECK(w, model_forward(w, &c));
        ENTER(w, DP_PHASE_CRITERION);
        double loss = 0.0;
        float *logits = w->logits.ptr;
        /* dlogits overwrite the logits in place: no second V-wide buffer. */
        CHECK(w, criterion(w, &loss, train ? logits : NULL, logits, c.targets, first, rows));
        w->loss_sum += loss;
        if (!train) continue;
        ENTER(w, DP_PHASE_BACKWARD);
        CHECK(w, model_backward(w, &c, logits));
    }
}

/* Valid target elements of device d's rows of micro-batch j. */
static size_t micro_valid(const dp_engine *e, size_t d, size_t j)
{
    size_t f, r = dp_micro_rows(&e->w[d], j, &f);
    return r ? dp_plan_valid_targets(e, e->batch->targets, e->w[d].row_begin + f, r) : 0;
}

/* The root's part of gather mode's criterion for micro-batch j: gather
 * every device's logits and targets, loss and dlogits for all of them. */
static dp_status root_criterion(worker *w, size_t j)
{
    dp_engine *e = w->e;
    size_t V = e->model.n_classes, opr = e->model.outputs_per_row;
    size_t tg_out = dp_model_target_row_bytes(&e->model) / opr; /* target bytes per output row */
    size_t total = dp_comm_gather_rows(e, j);
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
    DP_TRY(dp_comm_gather_logits(w, j, w->gathered.ptr, tg));
    size_t valid = 0;
    for (size_t d = 0; d < e->k; d++) valid += micro_valid(e, d, j);
    double loss = 0.0;
    DP_TRY(call_criterion(w, &loss, w->gathered_d.ptr, w->gathered.ptr, tg, total, valid,
                          scratch));
    if (isfinite(loss)) {
        w->loss_sum += loss;
        return DP_OK;
    }
    /* Rare path: attribute the non-finite loss to the devices whose rows
     * produced it (the others wait at the barrier). */
    size_t off = 0;
    for (size_t d = 0; d < e->k; d++) {
        size_t f, nd = dp_micro_rows(&e->w[d], j, &f) * opr;
        double ld = 0.0;
        if (nd)
            DP_TRY(call_criterion(w, &ld, NULL, (const float *)w->gathered.ptr + off * V,
                                  (const char *)tg + off * tg_out, nd, micro_valid(e, d, j),
                                  scratch));
        e->w[d].loss_sum += ld;
        off += nd;
    }
    return DP_OK;
}

void dp_compute_gather(worker *w)
{
    dp_engine *e = w->e;
    for (size_t j = 0; j < e->gather_steps; j++) {
        size_t first, rows = dp_micro_rows(w, j, &first);
        dp_chunk c = chunk_of(w, first, rows);
        ENTER(w, DP_PHASE_FORWARD);
        if (rows) {
            CHECK(w, ensure_compute(w, 1));
            CHECK(w, model_forward(w, &c));
        }
        SYNC(w);
        ENTER(w, DP_PHASE_CRITERION);
        if (w->id == 0) CHECK(w, root_criterion(w, j));
        SYNC(w);
        if (rows) CHECK(w, dp_comm_scatter_dlogits(w, j, rows));
        ENTER(w, DP_PHASE_BACKWARD);
        if (rows)
            CHECK(w, model_backward(w, &c, w->dlogits.ptr));
    }
}
