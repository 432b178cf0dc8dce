/*
 * parallel/comm.c - the in-process collectives (comm.h): peer copies
 * between the engine's devices and adds on the root, in device order.
 */
#include "parallel/comm.h"

#include "dp/nn.h"

dp_status dp_comm_setup(worker *w)
{
    dp_engine *e = w->e;
    worker *root = &e->w[0];
    /* Staging for the peers' gradient slices; host memory is read in place
     * and a single device has no peers. */
    if (dp_device_is_host_memory(root->dev) || e->k < 2 || w->slice_end <= w->slice_begin)
        return DP_OK;
    size_t sb = (w->slice_end - w->slice_begin) * sizeof(float);
    dp_status s = dp_device_alloc(root->dev, sb, (void **)&w->stage);
    if (s != DP_OK) dp_error_prefix("staging buffer for %s's reduce slice", w->dev->name);
    return s;
}

void dp_comm_teardown(worker *w)
{
    worker *root = &w->e->w[0];
    if (root->dev) dp_device_free(root->dev, w->stage);
    w->stage = NULL;
}

dp_status dp_comm_scatter_batch(worker *w)
{
    dp_engine *e = w->e;
    const dp_model *m = &e->model;
    if (!w->rows) return DP_OK;
    size_t in_bytes = w->rows * m->input_row_bytes;
    size_t tg_row = dp_model_target_row_bytes(m), tg_bytes = w->rows * tg_row;
    DP_TRY(dp_dbuf_ensure(w->dev, &w->inputs, in_bytes));
    DP_TRY(dp_dbuf_ensure(w->dev, &w->targets, tg_bytes));
    const char *src = (const char *)e->batch->inputs + w->row_begin * m->input_row_bytes;
    DP_TRY(dp_copy_h2d(w->dev, w->inputs.ptr, src, in_bytes));
    return dp_copy_h2d(w->dev, w->targets.ptr,
                       (const char *)e->batch->targets + w->row_begin * tg_row, tg_bytes);
}

size_t dp_comm_gather_rows(const dp_engine *e, size_t j)
{
    size_t total = 0;
    for (size_t d = 0; d < e->k; d++) {
        size_t f;
        total += dp_micro_rows(&e->w[d], j, &f) * e->model.outputs_per_row;
    }
    return total;
}

dp_status dp_comm_gather_logits(worker *root, size_t j, float *logits, void *targets)
{
    dp_engine *e = root->e;
    size_t V = e->model.n_classes, opr = e->model.outputs_per_row, off = 0;
    size_t tg_out = dp_model_target_row_bytes(&e->model) / opr; /* target bytes per output row */
    for (size_t d = 0; d < e->k; d++) {
        worker *wd = &e->w[d];
        size_t f, r = dp_micro_rows(wd, j, &f);
        if (!r) continue;
        size_t nd = r * opr;
        DP_TRY(dp_copy_peer(root->dev, logits + off * V, wd->dev, wd->logits.ptr,
                            nd * V * sizeof(float)));
        DP_TRY(dp_copy_peer(root->dev, (char *)targets + off * tg_out, wd->dev,
                            (const char *)wd->targets.ptr + f * opr * tg_out, nd * tg_out));
        off += nd;
    }
    return DP_OK;
}

dp_status dp_comm_scatter_dlogits(worker *w, size_t j, size_t rows)
{
    dp_engine *e = w->e;
    worker *root = &e->w[0];
    size_t V = e->model.n_classes, opr = e->model.outputs_per_row;
    /* Offset of this device's rows in the gathered micro-batch. */
    size_t off = 0;
    for (int d = 0; d < w->id; d++) {
        size_t f;
        off += dp_micro_rows(&e->w[d], j, &f) * opr;
    }
    return dp_copy_peer(w->dev, w->dlogits.ptr, root->dev,
                        (const float *)root->gathered_d.ptr + off * V,
                        rows * opr * V * sizeof(float));
}

dp_status dp_comm_reduce_slice(worker *w)
{
    dp_engine *e = w->e;
    worker *root = &e->w[0];
    size_t b = w->slice_begin, n = w->slice_end - w->slice_begin;
    if (!n) return DP_OK;
    int host = dp_device_is_host_memory(root->dev);
    for (size_t d = 1; d < e->k; d++) {
        worker *wd = &e->w[d];
        if (!wd->rows) continue; /* an idle device's gradient is zero */
        const float *src = wd->grads + b;
        if (!host) {
            DP_TRY(dp_copy_peer(root->dev, w->stage, wd->dev, src, n * sizeof(float)));
            src = w->stage;
        }
        DP_TRY(dp_accumulate(root->dev, root->grads + b, src, n));
    }
    return DP_OK;
}

void dp_comm_allreduce_scalars(const worker *w, double *loss_sum, double *sumsq)
{
    const dp_engine *e = w->e;
    double s = 0.0, l = 0.0;
    for (size_t d = 0; d < e->k; d++) {
        s += e->w[d].slice_sumsq;
        l += e->w[d].loss_sum;
    }
    *sumsq = s;
    *loss_sum = l;
}

dp_status dp_comm_broadcast_params(worker *w)
{
    worker *root = &w->e->w[0];
    if (w->id == 0) return DP_OK;
    return dp_copy_peer(w->dev, w->params, root->dev, root->params,
                        w->e->model.n_params * sizeof(float));
}
