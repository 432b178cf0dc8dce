/*
 * parallel/comm.c - the in-process collectives (comm.h): peer copies
 * between the engine's devices and adds on the slice owners, in device
 * order.
 */
#include "parallel/comm.h"

#include "dp/nn.h"

static size_t chunk_floats(const worker *owner)
{
    return dp_device_is_host_memory(owner->dev) ? DP_COMM_CHUNK_FLOATS_HOST
                                                : DP_COMM_CHUNK_FLOATS_DEVICE;
}

dp_status dp_comm_setup(worker *owner)
{
    dp_engine *e = owner->e;
    size_t c = chunk_floats(owner);
    /* A single device has no peers. The owner allocates for its slices in
     * order, on its own thread (a limit is met at the same allocation). */
    for (size_t j = 0; e->k > 1 && j < e->k; j++) {
        worker *w = &e->w[j];
        size_t n = w->slice_end - w->slice_begin;
        if (w->owner != owner->id || !n) continue;
        size_t bytes = (n < c ? n : c) * sizeof(float);
        dp_status s = DP_OK;
        /* The running sum of the devices before the owner; device 0 sums in place. */
        if (owner->id != 0) s = dp_dbuf_ensure(owner->dev, &w->reduce_acc, bytes);
        /* Host memory is read in place; other devices' chunks are copied in. */
        if (s == DP_OK && !dp_device_is_host_memory(owner->dev))
            s = dp_dbuf_ensure(owner->dev, &w->reduce_in, bytes);
        if (s != DP_OK) {
            dp_error_prefix("reduce-scatter staging of slice %zu on %s", j, owner->dev->name);
            return s;
        }
    }
    return DP_OK;
}

void dp_comm_teardown(worker *w)
{
    dp_device *dev = w->e->w[w->owner].dev;
    if (!dev) return;
    dp_dbuf_release(dev, &w->reduce_acc);
    dp_dbuf_release(dev, &w->reduce_in);
}

size_t dp_comm_staging_bytes(const dp_engine *e, size_t d)
{
    size_t bytes = 0;
    for (size_t i = 0; i < e->k; i++)
        if ((size_t)e->w[i].owner == d) bytes += e->w[i].reduce_acc.bytes + e->w[i].reduce_in.bytes;
    return bytes;
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

/* One chunk [at, at + n) of the reduce-scatter on owner o: the sum
 * ((c_0 + c_1) + c_2) + ... over the contributing devices in order (device
 * 0, whose zeroed buffer starts the sum even when idle, then every busy
 * device). Float addition commutes, so adding the running sum to the
 * owner's own gradient (own = g_o + sum) gives the bits that adding g_o to
 * the sum would; the owner's buffer takes the sum from its turn on. */
static dp_status reduce_chunk(worker *w, worker *o, size_t at, size_t n)
{
    dp_engine *e = w->e;
    size_t bytes = n * sizeof(float);
    int host = dp_device_is_host_memory(o->dev);
    float *own = o->grads + at, *acc = w->reduce_acc.ptr;
    float *sum = NULL;         /* holds the sum of the contributions so far */
    const float *first = NULL; /* host: the first contribution, read in place, not yet added */
    for (size_t d = 0; d < e->k; d++) {
        worker *wd = &e->w[d];
        if (d > 0 && !wd->rows) continue; /* an idle device's gradient is zero */
        if (wd == o) {
            if (first) DP_TRY(dp_residual_forward(o->dev, own, first, own, n)); /* c_0 + own */
            else if (sum) DP_TRY(dp_accumulate(o->dev, own, sum, n));
            sum = own; /* (device 0 owns: its gradient starts the sum in place) */
            first = NULL;
            continue;
        }
        const float *src = wd->grads + at;
        if (host && !sum && !first) {
            first = src;
            continue;
        }
        if (host && first) { /* the first two contributions in one pass */
            DP_TRY(dp_residual_forward(o->dev, acc, first, src, n));
            sum = acc;
            first = NULL;
            continue;
        }
        if (!sum) { /* non-host: the first contribution, copied into the running sum */
            DP_TRY(dp_copy_peer(o->dev, acc, wd->dev, src, bytes));
            sum = acc;
            continue;
        }
        if (!host) {
            DP_TRY(dp_copy_peer(o->dev, w->reduce_in.ptr, wd->dev, src, bytes));
            src = w->reduce_in.ptr;
        }
        DP_TRY(dp_accumulate(o->dev, sum, src, n));
    }
    /* An idle owner (not device 0) did not contribute: it takes the sum. */
    if (first) DP_TRY(dp_copy_peer(o->dev, own, e->w[0].dev, first, bytes)); /* device 0's */
    else if (sum != own) DP_TRY(dp_copy_peer(o->dev, own, o->dev, sum, bytes));
    return DP_OK;
}

dp_status dp_comm_reduce_scatter(worker *w)
{
    worker *o = dp_slice_owner(w);
    size_t b = w->slice_begin, n = w->slice_end - w->slice_begin, c = chunk_floats(o);
    if (w->e->k < 2) return DP_OK; /* one device: its gradient is the sum */
    for (size_t done = 0; done < n; done += c)
        DP_TRY(reduce_chunk(w, o, b + done, n - done < c ? n - done : c));
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

dp_status dp_comm_allgather_params(worker *w)
{
    dp_engine *e = w->e;
    /* Runs of consecutive slices with one owner move as one copy (root
     * mode: the whole buffer from the root). */
    for (size_t j = 0; j < e->k;) {
        size_t j2 = j + 1;
        while (j2 < e->k && e->w[j2].owner == e->w[j].owner) j2++;
        worker *o = dp_slice_owner(&e->w[j]);
        size_t b = e->w[j].slice_begin, en = e->w[j2 - 1].slice_end;
        if (o != w && en > b)
            DP_TRY(dp_copy_peer(w->dev, w->params + b, o->dev, o->params + b,
                                (en - b) * sizeof(float)));
        j = j2;
    }
    return DP_OK;
}

dp_status dp_comm_broadcast_params(worker *w)
{
    worker *root = &w->e->w[0];
    if (w->id == 0) return DP_OK;
    return dp_copy_peer(w->dev, w->params, root->dev, root->params,
                        w->e->model.n_params * sizeof(float));
}
