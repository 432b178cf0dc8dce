/*
 * parallel/comm.c - the collectives between this process's devices
 * (comm.h): peer copies between the engine's devices and adds on the slice
 * owners, in global device order.
 */
#include "parallel/comm.h"

#include "dp/ops.h"

size_t dp_comm_chunk_floats(const dp_engine *e, const dp_device *owner)
{
    size_t round = dp_transport_round_floats(&e->tp);
    if (round) return round;
    return dp_device_is_host_memory(owner) ? DP_COMM_CHUNK_FLOATS_HOST : DP_COMM_CHUNK_FLOATS_DEVICE;
}

dp_status dp_comm_setup(worker *summer)
{
    dp_engine *e = summer->e;
    size_t c = dp_comm_chunk_floats(e, summer->dev), K = e->L.K, g = e->L.g0 + (size_t)summer->id;
    /* A single device has no peers. The summer allocates for the slices it sums
     * in order, on its own thread (a limit is met at the same allocation). */
    for (size_t j = 0; K > 1 && j < K; j++) {
        slice *sl = &e->s[j];
        size_t n = sl->end - sl->begin, chunk = n < c ? n : c;
        if ((size_t)sl->summer != g || !n) continue;
        size_t bytes = chunk * sizeof(float);
        dp_status s = DP_OK;
        /* The running sum of the devices before the summer; device 0 sums in place. */
        if (g != 0) s = dp_dbuf_ensure(summer->dev, &sl->acc, bytes);
        /* Host memory is read in place; other devices' chunks are copied in. */
        if (s == DP_OK && !dp_device_is_host_memory(summer->dev))
            s = dp_dbuf_ensure(summer->dev, &sl->in, bytes);
        /* The other ranks' devices' chunks arrive here, in two halves when
         * the slice has two rounds or more: one round arrives while the
         * one before it is summed (rounds.h). */
        size_t halves = n > c ? 2 : 1;
        sl->staged = chunk;
        if (s == DP_OK && K > e->L.k)
            s = dp_dbuf_ensure(summer->dev, &sl->remote, halves * (K - e->L.k) * bytes);
        if (s != DP_OK) {
            dp_error_prefix("reduce-scatter staging of slice %zu on %s", j, summer->dev->name);
            return s;
        }
    }
    return DP_OK;
}

void dp_comm_teardown(dp_engine *e)
{
    for (size_t j = 0; e->s && j < e->L.K; j++) {
        slice *sl = &e->s[j];
        worker *o = dp_local_worker(e, (size_t)sl->summer);
        if (!o || !o->dev) continue;
        dp_dbuf_release(o->dev, &sl->acc);
        dp_dbuf_release(o->dev, &sl->in);
        dp_dbuf_release(o->dev, &sl->remote);
    }
}

float *dp_comm_remote_chunk(const dp_engine *e, const slice *sl, size_t d, int half)
{
    size_t others = e->L.K - e->L.k;
    size_t idx = d < e->L.g0 ? d : d - e->L.k; /* among the other ranks' devices */
    return (float *)sl->remote.ptr + ((size_t)half * others + idx) * sl->staged;
}

dp_status dp_comm_scatter_batch(worker *w, const dp_plan *plan)
{
    dp_engine *e = w->e;
    const dp_model *m = &e->model;
    const dp_plan_device *d = &plan->dev[w->id];
    if (!d->rows) return DP_OK;
    size_t in_bytes = d->rows * m->input_row_bytes;
    size_t tg_row = dp_model_target_row_bytes(m), tg_bytes = d->rows * tg_row;
    DP_TRY(dp_dbuf_ensure(w->dev, &w->inputs, in_bytes));
    if (plan->batch->targets) DP_TRY(dp_dbuf_ensure(w->dev, &w->targets, tg_bytes));
    const char *src = (const char *)plan->batch->inputs + d->row_begin * m->input_row_bytes;
    DP_TRY(dp_copy_h2d(w->dev, w->inputs.ptr, src, in_bytes));
    if (!plan->batch->targets) return DP_OK; /* a prediction's batch may have none */
    return dp_copy_h2d(w->dev, w->targets.ptr,
                       (const char *)plan->batch->targets + d->row_begin * tg_row, tg_bytes);
}

dp_status dp_comm_gather_outputs(worker *root, const dp_plan *plan)
{
    dp_engine *e = root->e;
    size_t row = e->model.outputs_per_row * e->model.n_classes * sizeof(float);
    for (size_t d = 1; d < e->L.k; d++) {
        const dp_plan_device *pd = &plan->dev[d];
        if (!pd->rows) continue;
        char *dst = (char *)root->outputs.ptr + (pd->row_begin - plan->dev[0].row_begin) * row;
        DP_TRY(dp_copy_peer(root->dev, dst, e->w[d].dev, e->w[d].outputs.ptr, pd->rows * row));
    }
    return DP_OK;
}

size_t dp_comm_gather_rows(const dp_engine *e, const dp_plan *plan, size_t j)
{
    size_t total = 0;
    for (size_t d = 0; d < e->L.k; d++) {
        size_t f;
        total += dp_plan_micro_rows(&plan->dev[d], j, &f) * e->model.outputs_per_row;
    }
    return total;
}

dp_status dp_comm_gather_logits(worker *root, const dp_plan *plan, size_t j, float *logits,
                                void *targets)
{
    dp_engine *e = root->e;
    size_t V = e->model.n_classes, opr = e->model.outputs_per_row, off = 0;
    size_t tg_out = dp_model_target_row_bytes(&e->model) / opr; /* target bytes per output row */
    for (size_t d = 0; d < e->L.k; d++) {
        worker *wd = &e->w[d];
        size_t f, r = dp_plan_micro_rows(&plan->dev[d], j, &f);
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

dp_status dp_comm_scatter_dlogits(worker *w, const dp_plan *plan, size_t j, size_t rows)
{
    dp_engine *e = w->e;
    worker *root = &e->w[0];
    size_t V = e->model.n_classes, opr = e->model.outputs_per_row;
    /* Offset of this device's rows in the gathered micro-batch. */
    size_t off = 0;
    for (int d = 0; d < w->id; d++) {
        size_t f;
        off += dp_plan_micro_rows(&plan->dev[d], j, &f) * opr;
    }
    return dp_copy_peer(w->dev, w->dlogits.ptr, root->dev,
                        (const float *)root->gathered_d.ptr + off * V,
                        rows * opr * V * sizeof(float));
}

/* One chunk [at, at + n) of slice sl's reduce-scatter on its summer o
 * (state.h: the owner, or in root mode across ranks the slice's device): the
 * sum ((c_0 + c_1) + c_2) + ... over the contributing devices of the job
 * in global order (device 0, whose zeroed buffer starts the sum even when
 * idle, then every busy device), whatever rank they are on: a local
 * device's chunk is read in place (host memory) or copied in, another
 * rank's was received into half `half` of sl->remote (round_at: where
 * that chunk starts).
 * Float addition commutes, so adding the running sum to the owner's own
 * gradient (own = g_o + sum) gives the bits that adding g_o to the sum
 * would; the owner's buffer takes the sum from its turn on. */
static dp_status reduce_chunk(dp_engine *e, const dp_plan *plan, slice *sl, size_t at, size_t n,
                             size_t round_at, int half)
{
    worker *o = dp_local_worker(e, (size_t)sl->summer);
    /* The adds and copies run on the owner's communication queue (its own
     * device where it has none): after the work queued on the owner so far
     * (its zeroed and final gradient, a received chunk), and each copy in
     * after its source's (dp_copy_peer), while the owner's backward goes
     * on; dp_comm_settle waits for them before anything else reads the
     * sum or writes a source. */
    dp_device *q = o->comm;
    DP_TRY(dp_device_order(o->dev, q));
    size_t bytes = n * sizeof(float);
    int host = dp_device_is_host_memory(o->dev);
    float *own = o->grads + at, *acc = sl->acc.ptr;
    float *sum = NULL;         /* holds the sum of the contributions so far */
    const float *first = NULL; /* the first contribution, readable by the owner, not yet added */
    for (size_t d = 0; d < e->L.K; d++) {
        if (!dp_plan_contributes(plan, d)) continue; /* an idle device's gradient is zero */
        worker *wd = dp_local_worker(e, d);
        if (wd == o) {
            if (first) DP_TRY(dp_add(q, own, first, own, n)); /* c_0 + own */
            else if (sum) DP_TRY(dp_accumulate(q, own, sum, n));
            sum = own; /* (device 0 owns: its gradient starts the sum in place) */
            first = NULL;
            continue;
        }
        const float *src = wd ? wd->grads + at : dp_comm_remote_chunk(e, sl, d, half) + (at - round_at);
        int readable = host || !wd; /* received chunks are on the owner already */
        if (!sum && !first) {
            if (readable) {
                first = src;
            } else {
                DP_TRY(dp_copy_peer(q, acc, wd->dev, src, bytes));
                sum = acc;
            }
            continue;
        }
        if (!readable) {
            DP_TRY(dp_copy_peer(q, sl->in.ptr, wd->dev, src, bytes));
            src = sl->in.ptr;
        }
        if (first) { /* the first two contributions in one pass */
            DP_TRY(dp_add(q, acc, first, src, n));
            sum = acc;
            first = NULL;
            continue;
        }
        DP_TRY(dp_accumulate(q, sum, src, n));
    }
    /* An idle owner (not device 0) did not contribute: it takes the sum. */
    if (first) DP_TRY(dp_copy_peer(q, own, q, first, bytes)); /* readable by o */
    else if (sum != own) DP_TRY(dp_copy_peer(q, own, q, sum, bytes));
    return DP_OK;
}

dp_status dp_comm_reduce_range(dp_engine *e, const dp_plan *plan, slice *sl, size_t from,
                               size_t to, int half)
{
    if (e->L.K < 2) return DP_OK; /* one device: its gradient is the sum */
    size_t c = dp_comm_chunk_floats(e, dp_local_worker(e, (size_t)sl->summer)->dev);
    /* Chunks of at most c from `from` (where a received chunk starts too). */
    for (size_t at = from; at < to; at += c)
        DP_TRY(reduce_chunk(e, plan, sl, at, to - at < c ? to - at : c, from, half));
    return DP_OK;
}

dp_status dp_comm_reduce_scatter(worker *w, const dp_plan *plan)
{
    dp_engine *e = w->e;
    for (size_t j = 0; j < e->L.K; j++) {
        slice *sl = &e->s[j];
        if (sl->reducer != w->id) continue;
        /* what the overlap (overlap.h) left */
        DP_TRY(dp_comm_reduce_range(e, plan, sl, sl->begin, sl->reduced_from, 0));
        sl->reduced_from = sl->begin;
    }
    return DP_OK;
}

dp_status dp_comm_settle(worker *w)
{
    dp_engine *e = w->e;
    dp_status first = DP_OK;
    for (size_t j = 0; e->s && j < e->L.K; j++) {
        slice *sl = &e->s[j];
        if (sl->reducer != w->id) continue;
        worker *o = dp_local_worker(e, (size_t)sl->summer);
        if (!o || o->comm == o->dev) continue; /* no queue of its own: nothing runs on */
        /* Every slice's queue, even after a failure: none may run on into
         * the next job (a queue met twice is idle the second time). */
        dp_status s = dp_device_synchronize(o->comm);
        if (first == DP_OK) first = s;
    }
    return first;
}

dp_status dp_comm_allgather_params(worker *w, int from_other_ranks)
{
    dp_engine *e = w->e;
    /* Runs of consecutive slices with one owner move as one copy (root
     * mode: the whole buffer from the root). Another rank's slices come
     * from local device 0, which received them. */
    for (size_t j = 0; j < e->L.K;) {
        size_t j2 = j + 1;
        while (j2 < e->L.K && e->s[j2].owner == e->s[j].owner) j2++;
        worker *o = dp_local_worker(e, (size_t)e->s[j].owner);
        size_t b = e->s[j].begin, en = e->s[j2 - 1].end;
        if (!o && from_other_ranks) o = &e->w[0];
        else if (!o || from_other_ranks) o = NULL;
        if (o && o != w && en > b)
            DP_TRY(dp_copy_peer(w->dev, dp_replica_at(w, b), o->dev, dp_replica_at(o, b),
                                (en - b) * e->psize));
        j = j2;
    }
    return DP_OK;
}

dp_status dp_comm_broadcast_params(worker *w)
{
    worker *root = &w->e->w[0];
    if (w->id == 0) return DP_OK;
    return dp_copy_peer(w->dev, w->params, root->dev, root->params,
                        w->e->model.n_params * w->e->psize);
}
