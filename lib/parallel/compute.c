/*
 * parallel/compute.c - the compute phases of a step on one worker:
 * forward, criterion and backward over its micro-batches. Balanced mode
 * runs the criterion on every device; gather mode (nn.DataParallel)
 * gathers the logits on the root, which computes the loss and dlogits for
 * the whole micro-batch and scatters each device its slice (comm.h).
 */
#include <math.h>

#include "parallel/comm.h"

static dp_chunk chunk_of(const worker *w, size_t first, size_t rows)
{
    const dp_model *m = &w->e->model;
    dp_chunk c;
    c.rows = rows;
    c.inputs = (const char *)w->inputs.ptr + first * m->input_row_bytes;
    c.targets = (const int32_t *)w->targets.ptr + first * m->outputs_per_row;
    return c;
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

static dp_status criterion(worker *w, double *loss, float *dlogits, const float *logits,
                           const int32_t *targets, size_t n, float dscale)
{
    dp_engine *e = w->e;
    size_t sb = e->crit.scratch_bytes(e->crit.ctx, n, e->model.n_classes);
    DP_TRY(dp_dbuf_ensure(w->dev, &w->scratch, sb));
    return e->crit.forward_backward(e->crit.ctx, w->dev, loss, dlogits, logits, targets, n,
                                    e->model.n_classes, dscale, w->scratch.ptr);
}

/* Balanced: each micro-batch runs forward, the local criterion and backward. */
void dp_compute_balanced(worker *w, int train)
{
    dp_engine *e = w->e;
    const dp_model *m = &e->model;
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
        size_t n = rows * m->outputs_per_row;
        ENTER(w, DP_PHASE_FORWARD);
        CHECK(w, ensure_compute(w, 0));
        CHECK(w, m->forward(m->ctx, w->dev, w->params, &c, w->workspace.ptr, w->logits.ptr));
        ENTER(w, DP_PHASE_CRITERION);
        double loss = 0.0;
        float *logits = w->logits.ptr;
        /* dlogits overwrite the logits in place: no second V-wide buffer. */
        CHECK(w, criterion(w, &loss, train ? logits : NULL, logits, c.targets, n, e->dscale));
        w->loss_sum += loss;
        if (!train) continue;
        ENTER(w, DP_PHASE_BACKWARD);
        CHECK(w, m->backward(m->ctx, w->dev, w->params, w->grads, &c, w->workspace.ptr, logits));
    }
}

/* The root's part of gather mode's criterion for micro-batch j: gather
 * every device's logits and targets, loss and dlogits for all of them. */
static dp_status root_criterion(worker *w, size_t j)
{
    dp_engine *e = w->e;
    size_t V = e->model.n_classes, opr = e->model.outputs_per_row;
    size_t total = dp_comm_gather_rows(e, j);
    if (!total) return DP_OK;
    size_t sb = e->crit.scratch_bytes(e->crit.ctx, total, V);
    DP_TRY(dp_dbuf_ensure(w->dev, &w->gathered, total * V * sizeof(float)));
    DP_TRY(dp_dbuf_ensure(w->dev, &w->gathered_d, total * V * sizeof(float)));
    /* The gathered targets ride at the end of the criterion scratch. */
    DP_TRY(dp_dbuf_ensure(w->dev, &w->scratch, sb + total * sizeof(int32_t)));
    int32_t *tg = (int32_t *)((char *)w->scratch.ptr + sb);
    DP_TRY(dp_comm_gather_logits(w, j, w->gathered.ptr, tg));
    double loss = 0.0;
    DP_TRY(e->crit.forward_backward(e->crit.ctx, w->dev, &loss, w->gathered_d.ptr,
                                    w->gathered.ptr, tg, total, V, e->dscale, w->scratch.ptr));
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
            DP_TRY(e->crit.forward_backward(e->crit.ctx, w->dev, &ld, NULL,
                                            (const float *)w->gathered.ptr + off * V, tg + off,
                                            nd, V, e->dscale, w->scratch.ptr));
        e->w[d].loss_sum += ld;
        off += nd;
    }
    return DP_OK;
}

void dp_compute_gather(worker *w)
{
    dp_engine *e = w->e;
    const dp_model *m = &e->model;
    for (size_t j = 0; j < e->gather_steps; j++) {
        size_t first, rows = dp_micro_rows(w, j, &first);
        dp_chunk c = chunk_of(w, first, rows);
        ENTER(w, DP_PHASE_FORWARD);
        if (rows) {
            CHECK(w, ensure_compute(w, 1));
            CHECK(w, m->forward(m->ctx, w->dev, w->params, &c, w->workspace.ptr, w->logits.ptr));
        }
        SYNC(w);
        ENTER(w, DP_PHASE_CRITERION);
        if (w->id == 0) CHECK(w, root_criterion(w, j));
        SYNC(w);
        if (rows) CHECK(w, dp_comm_scatter_dlogits(w, j, rows));
        ENTER(w, DP_PHASE_BACKWARD);
        if (rows)
            CHECK(w, m->backward(m->ctx, w->dev, w->params, w->grads, &c, w->workspace.ptr,
                                 w->dlogits.ptr));
    }
}
