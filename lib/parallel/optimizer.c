/*
 * parallel/optimizer.c - the optimizer's slices and state.
 *
 * The flat buffer is cut into k contiguous slices on DP_PARAM_ALIGN
 * boundaries, one per worker. Each slice has an owner: the worker itself
 * when the optimizer is sharded (ZeRO stage 1), device 0 otherwise (the
 * reduce-to-root design is sharding with a single owner). The owner holds
 * the slice's moments; the slice's worker sums the squares of its reduced
 * gradient on the owner and, once the global norm is known, clips and
 * updates the owner's parameters of the slice. The slices and the order of
 * every addition are the same in both modes, so they agree bitwise. A
 * slice is split by tensor into segments, since weight decay is a
 * per-tensor setting.
 */
#include <stdlib.h>

#include "dp/nn.h"
#include "dp/optim.h"
#include "optim/clip.h"
#include "parallel/engine_internal.h"

dp_status dp_opt_build_slices(dp_engine *e)
{
    const dp_model *m = &e->model;
    size_t n = m->n_params, k = e->k;
    for (size_t i = 0; i < k; i++) {
        worker *w = &e->w[i];
        /* Slices on DP_PARAM_ALIGN boundaries; the last one ends at n. */
        size_t b = (n * i / k) / DP_PARAM_ALIGN * DP_PARAM_ALIGN;
        size_t en = i + 1 == k ? n : (n * (i + 1) / k) / DP_PARAM_ALIGN * DP_PARAM_ALIGN;
        w->slice_begin = b;
        w->slice_end = en;
        w->owner = e->cfg.shard_optimizer ? (int)i : 0;
        w->segs = calloc(m->n_tensors ? m->n_tensors : 1, sizeof *w->segs);
        if (!w->segs) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
        w->n_segs = 0;
        for (size_t t = 0; t < m->n_tensors; t++) {
            size_t tb = m->tensors[t].offset, te = tb + m->tensors[t].numel;
            size_t sb = tb > b ? tb : b, se = te < en ? te : en;
            if (sb >= se) continue;
            w->segs[w->n_segs].begin = sb;
            w->segs[w->n_segs].end = se;
            w->segs[w->n_segs].decay = m->tensors[t].weight_decay;
            w->n_segs++;
        }
    }
    return DP_OK;
}

static int has_v(const dp_engine *e) { return e->cfg.optim.kind == DP_OPTIMIZER_ADAMW; }

dp_status dp_opt_alloc_state(worker *owner)
{
    dp_engine *e = owner->e;
    dp_device *dev = owner->dev;
    /* The owner allocates for its slices in order, on its own thread, so a
     * limit is always met at the same allocation. */
    for (size_t j = 0; j < e->k; j++) {
        worker *w = &e->w[j];
        size_t bytes = (w->slice_end - w->slice_begin) * sizeof(float);
        if (w->owner != owner->id || !bytes) continue;
        dp_status s = dp_device_alloc(dev, bytes, (void **)&w->m);
        if (s == DP_OK) s = dp_memset(dev, w->m, 0, bytes);
        if (s == DP_OK && has_v(e)) s = dp_device_alloc(dev, bytes, (void **)&w->v);
        if (s == DP_OK && has_v(e)) s = dp_memset(dev, w->v, 0, bytes);
        if (s != DP_OK) {
            dp_error_prefix("optimizer state of slice %zu on %s", j, dev->name);
            return s;
        }
    }
    return DP_OK;
}

void dp_opt_free_state(dp_engine *e)
{
    for (size_t i = 0; i < e->k; i++) {
        worker *w = &e->w[i];
        dp_device *dev = e->w[w->owner].dev; /* w->e may be unset after a failed create */
        if (dev) {
            dp_device_free(dev, w->m);
            dp_device_free(dev, w->v);
        }
        w->m = w->v = NULL;
        free(w->segs);
        w->segs = NULL;
    }
}

size_t dp_opt_state_bytes(const dp_engine *e, size_t d)
{
    size_t floats = 0;
    for (size_t i = 0; i < e->k; i++)
        if ((size_t)e->w[i].owner == d) floats += e->w[i].slice_end - e->w[i].slice_begin;
    return (has_v(e) ? 2 : 1) * floats * sizeof(float);
}

dp_status dp_opt_slice_sumsq(worker *w)
{
    worker *o = dp_slice_owner(w);
    size_t b = w->slice_begin, n = w->slice_end - w->slice_begin;
    w->slice_sumsq = 0.0;
    if (!n) return DP_OK;
    return dp_sum_squares(o->dev, &w->slice_sumsq, o->grads + b, n);
}

dp_status dp_opt_update_slice(worker *w, double grad_norm)
{
    dp_engine *e = w->e;
    worker *o = dp_slice_owner(w);
    const dp_optim_config *opt = &e->cfg.optim;
    float clip = dp_clip_factor(grad_norm, opt->grad_clip);
    for (size_t i = 0; i < w->n_segs; i++) {
        size_t b = w->segs[i].begin, n = w->segs[i].end - w->segs[i].begin;
        size_t at = b - w->slice_begin; /* within the slice's moments */
        float wd = w->segs[i].decay ? opt->weight_decay : 0.0f;
        if (clip != 1.0f) DP_TRY(dp_scale(o->dev, o->grads + b, clip, n));
        if (opt->kind == DP_OPTIMIZER_ADAMW)
            DP_TRY(dp_adamw_update(o->dev, o->params + b, o->grads + b, w->m + at, w->v + at, n,
                                   e->lr, opt->beta1, opt->beta2, opt->eps, wd, (int)(e->t + 1)));
        else
            DP_TRY(dp_sgd_update(o->dev, o->params + b, o->grads + b, w->m + at, n, e->lr,
                                 opt->momentum, wd, (int)(e->t + 1)));
    }
    return DP_OK;
}

/* Copies one moment buffer between the host's flat layout and the owners'
 * slices (to_host: gather, else scatter). */
static dp_status move_state(dp_engine *e, float *host_out, const float *host_in, int second)
{
    for (size_t i = 0; i < e->k; i++) {
        worker *w = &e->w[i];
        dp_device *dev = dp_slice_owner(w)->dev;
        size_t b = w->slice_begin, bytes = (w->slice_end - b) * sizeof(float);
        float *slice = second ? w->v : w->m;
        if (!bytes) continue;
        DP_TRY(dp_device_bind_thread(dev));
        if (host_out) DP_TRY(dp_copy_d2h(dev, host_out + b, slice, bytes));
        else DP_TRY(dp_copy_h2d(dev, slice, host_in + b, bytes));
    }
    return DP_OK;
}

dp_status dp_opt_get_state(dp_engine *e, float *m, float *v)
{
    if (m) DP_TRY(move_state(e, m, NULL, 0));
    if (v && has_v(e)) DP_TRY(move_state(e, v, NULL, 1));
    return DP_OK;
}

dp_status dp_opt_set_state(dp_engine *e, const float *m, const float *v)
{
    if (m) DP_TRY(move_state(e, NULL, m, 0));
    if (v && has_v(e)) DP_TRY(move_state(e, NULL, v, 1));
    return DP_OK;
}
