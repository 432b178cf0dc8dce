/*
 * parallel/optimizer.c - the optimizer's slices and state.
 *
 * The flat buffer is cut into k slices on DP_PARAM_ALIGN boundaries, one
 * per worker; each worker sums the squares of its slice of the reduced
 * gradient, and after the global norm is known clips and updates its slice
 * of the root's parameters with the root's moments. A slice is split by
 * tensor into segments, since weight decay is a per-tensor setting.
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

dp_status dp_opt_alloc_state(worker *root)
{
    dp_engine *e = root->e;
    size_t bytes = e->model.n_params * sizeof(float);
    DP_TRY(dp_device_alloc(root->dev, bytes, (void **)&e->m));
    DP_TRY(dp_memset(root->dev, e->m, 0, bytes));
    if (e->cfg.optim.kind == DP_OPTIMIZER_ADAMW) {
        DP_TRY(dp_device_alloc(root->dev, bytes, (void **)&e->v));
        DP_TRY(dp_memset(root->dev, e->v, 0, bytes));
    }
    return DP_OK;
}

void dp_opt_free_state(dp_engine *e)
{
    dp_device *root = e->w[0].dev;
    if (root) {
        dp_device_free(root, e->m);
        dp_device_free(root, e->v);
    }
    e->m = e->v = NULL;
    for (size_t i = 0; i < e->k; i++) {
        free(e->w[i].segs);
        e->w[i].segs = NULL;
    }
}

size_t dp_opt_state_bytes(const dp_engine *e)
{
    return (e->v ? 2 : 1) * e->model.n_params * sizeof(float);
}

dp_status dp_opt_slice_sumsq(worker *w)
{
    worker *root = &w->e->w[0];
    size_t b = w->slice_begin, n = w->slice_end - w->slice_begin;
    w->slice_sumsq = 0.0;
    if (!n) return DP_OK;
    return dp_sum_squares(root->dev, &w->slice_sumsq, root->grads + b, n);
}

dp_status dp_opt_update_slice(worker *w, double grad_norm)
{
    dp_engine *e = w->e;
    worker *root = &e->w[0];
    const dp_optim_config *o = &e->cfg.optim;
    float clip = dp_clip_factor(grad_norm, o->grad_clip);
    for (size_t i = 0; i < w->n_segs; i++) {
        size_t b = w->segs[i].begin, n = w->segs[i].end - w->segs[i].begin;
        float wd = w->segs[i].decay ? o->weight_decay : 0.0f;
        if (clip != 1.0f) DP_TRY(dp_scale(root->dev, root->grads + b, clip, n));
        if (o->kind == DP_OPTIMIZER_ADAMW)
            DP_TRY(dp_adamw_update(root->dev, root->params + b, root->grads + b, e->m + b,
                                   e->v + b, n, e->lr, o->beta1, o->beta2, o->eps, wd,
                                   (int)(e->t + 1)));
        else
            DP_TRY(dp_sgd_update(root->dev, root->params + b, root->grads + b, e->m + b, n,
                                 e->lr, o->momentum, wd, (int)(e->t + 1)));
    }
    return DP_OK;
}
