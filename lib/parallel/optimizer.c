/*
 * parallel/optimizer.c - the optimizer's slices and state.
 *
 * The flat buffer is cut into K contiguous slices on DP_PARAM_ALIGN
 * boundaries, one per device of the job (K = k without ranks). Each slice
 * has an owner: its own device when the optimizer is sharded (ZeRO stage
 * 1), device 0 otherwise (the reduce-to-root design is sharding with a
 * single owner). The owner holds the slice's moments; the slice's reducer
 * (a worker of the owner's rank) sums the squares of its reduced gradient
 * on the owner and, once the global norm is known, clips and updates the
 * owner's parameters of the slice. The slices and the order of
 * every addition are the same in both modes, so they agree bitwise. A
 * slice is split by tensor into segments, since weight decay is a
 * per-tensor setting.
 *
 * With bf16 replicas (dp_model.param_dtype) the owner also keeps the
 * slice's float32 master weights: the update runs on the master, and the
 * owner's replica gets its rounding (dp_convert), which the all-gather
 * then hands to every replica. The replicas never feed back into the
 * master, so rounding errors do not accumulate over steps (Micikevicius
 * et al. 2018, "Mixed Precision Training"; Megatron's distributed
 * optimizer keeps its main parameters the same way).
 */
#include <stdlib.h>

#include "dp/nn.h"
#include "dp/optim.h"
#include "optim/adamw_segments.h"
#include "optim/clip.h"
#include "parallel/optimizer.h"

dp_status dp_opt_build_slices(const dp_engine *e, slice **out)
{
    const dp_model *m = &e->model;
    size_t n = m->n_params, K = e->L.K;
    slice *s = calloc(K, sizeof *s);
    *out = s;
    if (!s) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    for (size_t i = 0; i < K; i++) {
        slice *sl = &s[i];
        /* Slices on DP_PARAM_ALIGN boundaries; the last one ends at n. */
        size_t b = (n * i / K) / DP_PARAM_ALIGN * DP_PARAM_ALIGN;
        size_t en = i + 1 == K ? n : (n * (i + 1) / K) / DP_PARAM_ALIGN * DP_PARAM_ALIGN;
        sl->begin = b;
        sl->end = en;
        sl->owner = e->cfg.shard_optimizer ? (int)i : 0;
        /* The owner's rank updates it: the owner's worker when sharded;
         * without sharding rank 0's workers take the slices in turn (one
         * process: worker i updates slice i on device 0). */
        sl->updater = -1;
        if (dp_local_worker(e, (size_t)sl->owner))
            sl->updater = e->cfg.shard_optimizer ? (int)(i - e->L.g0) : (int)(i % e->L.k);
        /* The sum is formed where the owner is, or without sharding on the
         * slice's own device when another rank holds it: every rank then
         * sums its share, where rank 0 would receive and add every
         * device's whole gradient. The order of the additions is the same. */
        sl->summer = sl->owner;
        if (dp_layout_rank_of(&e->L, i) != dp_layout_rank_of(&e->L, (size_t)sl->owner))
            sl->summer = (int)i;
        sl->reducer = -1;
        if (sl->summer == sl->owner) sl->reducer = sl->updater;
        else if (dp_local_worker(e, i)) sl->reducer = (int)(i - e->L.g0);
        sl->segs = calloc(m->n_tensors ? m->n_tensors : 1, sizeof *sl->segs);
        if (!sl->segs) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
        sl->n_segs = 0;
        for (size_t t = 0; t < m->n_tensors; t++) {
            size_t tb = m->tensors[t].offset, te = tb + m->tensors[t].numel;
            size_t sb = tb > b ? tb : b, se = te < en ? te : en;
            if (sb >= se) continue;
            sl->segs[sl->n_segs].begin = sb;
            sl->segs[sl->n_segs].end = se;
            sl->segs[sl->n_segs].decay = m->tensors[t].weight_decay;
            sl->n_segs++;
        }
    }
    return DP_OK;
}

static int has_v(const dp_engine *e) { return e->cfg.optim.kind == DP_OPTIMIZER_ADAMW; }

/* The worker of slice sl's owner (the owner is on this rank). */
static worker *owner_of(const dp_engine *e, const slice *sl)
{
    return dp_local_worker(e, (size_t)sl->owner);
}

/* The worker of slice sl's summer (on this rank: sl->reducer >= 0). */
static worker *summer_of(const dp_engine *e, const slice *sl)
{
    return dp_local_worker(e, (size_t)sl->summer);
}

dp_status dp_opt_alloc_state(worker *owner)
{
    dp_engine *e = owner->e;
    dp_device *dev = owner->dev;
    /* The owner allocates for its slices in order, on its own thread, so a
     * limit is always met at the same allocation. */
    for (size_t j = 0; j < e->L.K; j++) {
        slice *sl = &e->s[j];
        size_t bytes = (sl->end - sl->begin) * sizeof(float);
        if (owner_of(e, sl) != owner || !bytes) continue;
        dp_status s = dp_device_alloc(dev, bytes, (void **)&sl->m);
        if (s == DP_OK) s = dp_memset(dev, sl->m, 0, bytes);
        if (s == DP_OK && has_v(e)) s = dp_device_alloc(dev, bytes, (void **)&sl->v);
        if (s == DP_OK && has_v(e)) s = dp_memset(dev, sl->v, 0, bytes);
        /* the master's values come with the parameters (set_params) */
        if (s == DP_OK && e->bf16) s = dp_device_alloc(dev, bytes, (void **)&sl->master);
        if (s != DP_OK) {
            dp_error_prefix("optimizer state of slice %zu on %s", j, dev->name);
            return s;
        }
    }
    return DP_OK;
}

void dp_opt_free_state(dp_engine *e)
{
    for (size_t i = 0; e->s && i < e->L.K; i++) {
        slice *sl = &e->s[i];
        worker *o = owner_of(e, sl);
        if (o && o->dev) {
            dp_device_free(o->dev, sl->m);
            dp_device_free(o->dev, sl->v);
            dp_device_free(o->dev, sl->master);
        }
        sl->m = sl->v = sl->master = NULL;
        free(sl->segs);
        sl->segs = NULL;
    }
}

size_t dp_opt_state_bytes(const dp_engine *e, size_t d)
{
    size_t floats = 0;
    for (size_t i = 0; i < e->L.K; i++)
        if ((size_t)e->s[i].owner == e->L.g0 + d) floats += e->s[i].end - e->s[i].begin;
    return ((has_v(e) ? 2 : 1) + (e->bf16 ? 1 : 0)) * floats * sizeof(float);
}

dp_status dp_opt_slice_sumsq(worker *w)
{
    dp_engine *e = w->e;
    for (size_t j = 0; j < e->L.K; j++) {
        slice *sl = &e->s[j];
        if (sl->reducer != w->id) continue;
        sl->sumsq = 0.0;
        if (sl->end > sl->begin)
            DP_TRY(dp_sum_squares(summer_of(e, sl)->dev, &sl->sumsq,
                                  summer_of(e, sl)->grads + sl->begin, sl->end - sl->begin));
    }
    return DP_OK;
}

/* AdamW on slice sl's segments [first, first + count) (at most
 * DP_ADAMW_SEGS), clipped, with the replica's refresh: one call. */
static dp_status adamw_segments(dp_engine *e, slice *sl, size_t first, size_t count, float clip)
{
    const dp_optim_config *opt = &e->cfg.optim;
    worker *o = owner_of(e, sl);
    size_t b0 = sl->segs[first].begin; /* the call's element 0, in the flat buffer */
    size_t at = b0 - sl->begin;        /* ... and within the slice's moments and master */
    dp_adamw_segs t;
    t.n = (uint32_t)count;
    for (size_t i = 0; i < count; i++) {
        const segment *g = &sl->segs[first + i];
        t.begin[i] = g->begin - b0;
        t.end[i] = g->end - b0;
        t.weight_decay[i] = g->decay ? opt->weight_decay : 0.0f;
    }
    float *p = e->bf16 ? sl->master + at : (float *)o->params + b0;
    uint16_t *replica = e->bf16 ? (uint16_t *)dp_replica_at(o, b0) : NULL;
    return dp_adamw_update_segments(o->dev, p, o->grads + b0, sl->m + at, sl->v + at, replica,
                                    &t, e->lr, opt->beta1, opt->beta2, opt->eps, e->t + 1, clip);
}

dp_status dp_opt_update_slice(worker *w, double grad_norm)
{
    dp_engine *e = w->e;
    const dp_optim_config *opt = &e->cfg.optim;
    float clip = dp_clip_factor(grad_norm, opt->grad_clip);
    for (size_t j = 0; j < e->L.K; j++) {
        slice *sl = &e->s[j];
        worker *o = owner_of(e, sl);
        if (sl->updater != w->id) continue;
        if (opt->kind == DP_OPTIMIZER_ADAMW) {
            /* the slice's tensors DP_ADAMW_SEGS at a time: one launch each */
            for (size_t i = 0; i < sl->n_segs; i += DP_ADAMW_SEGS) {
                size_t count = sl->n_segs - i < DP_ADAMW_SEGS ? sl->n_segs - i : DP_ADAMW_SEGS;
                DP_TRY(adamw_segments(e, sl, i, count, clip));
            }
            continue;
        }
        for (size_t i = 0; i < sl->n_segs; i++) {
            size_t b = sl->segs[i].begin, n = sl->segs[i].end - sl->segs[i].begin;
            size_t at = b - sl->begin; /* within the slice's moments (and master) */
            float wd = sl->segs[i].decay ? opt->weight_decay : 0.0f;
            float *p = e->bf16 ? sl->master + at : (float *)o->params + b;
            if (clip != 1.0f) DP_TRY(dp_scale(o->dev, o->grads + b, clip, n));
            DP_TRY(dp_sgd_update(o->dev, p, o->grads + b, sl->m + at, n, e->lr, opt->momentum, wd,
                                 e->t + 1));
            if (e->bf16)
                DP_TRY(dp_convert(o->dev, dp_replica_at(o, b), DP_DTYPE_BF16, p, DP_DTYPE_F32, n));
        }
    }
    return DP_OK;
}

dp_status dp_opt_refresh_replica(worker *owner)
{
    dp_engine *e = owner->e;
    for (size_t j = 0; e->bf16 && j < e->L.K; j++) {
        slice *sl = &e->s[j];
        size_t n = sl->end - sl->begin;
        if (owner_of(e, sl) != owner || !n) continue;
        DP_TRY(dp_convert(owner->dev, dp_replica_at(owner, sl->begin), DP_DTYPE_BF16, sl->master,
                          DP_DTYPE_F32, n));
    }
    return DP_OK;
}

/* Which per-slice buffer move_state moves. */
enum { MOVE_M, MOVE_V, MOVE_MASTER };

/* Copies one per-slice buffer between the host's flat layout and the
 * owners' slices on this rank (host_out: gather, else scatter). */
static dp_status move_state(dp_engine *e, float *host_out, const float *host_in, int which)
{
    for (size_t i = 0; i < e->L.K; i++) {
        slice *sl = &e->s[i];
        worker *o = owner_of(e, sl);
        size_t b = sl->begin, bytes = (sl->end - b) * sizeof(float);
        float *buf = which == MOVE_V ? sl->v : which == MOVE_M ? sl->m : sl->master;
        if (!o || !bytes) continue;
        DP_TRY(dp_device_bind_thread(o->dev));
        if (host_out) DP_TRY(dp_copy_d2h(o->dev, host_out + b, buf, bytes));
        else DP_TRY(dp_copy_h2d(o->dev, buf, host_in + b, bytes));
    }
    return DP_OK;
}

dp_status dp_opt_get_state(dp_engine *e, float *m, float *v)
{
    if (m) DP_TRY(move_state(e, m, NULL, MOVE_M));
    if (v && has_v(e)) DP_TRY(move_state(e, v, NULL, MOVE_V));
    return DP_OK;
}

dp_status dp_opt_set_state(dp_engine *e, const float *m, const float *v)
{
    if (m) DP_TRY(move_state(e, NULL, m, MOVE_M));
    if (v && has_v(e)) DP_TRY(move_state(e, NULL, v, MOVE_V));
    return DP_OK;
}

dp_status dp_opt_move_masters(dp_engine *e, float *host_out, const float *host_in)
{
    return move_state(e, host_out, host_in, MOVE_MASTER);
}

size_t dp_opt_runs(const dp_engine *e, dp_run *runs)
{
    size_t n = 0;
    for (size_t j = 0; j < e->L.K;) {
        size_t j2 = j + 1;
        while (j2 < e->L.K && e->s[j2].owner == e->s[j].owner) j2++;
        runs[n++] = (dp_run){e->s[j].begin, e->s[j2 - 1].end - e->s[j].begin, (size_t)e->s[j].owner};
        j = j2;
    }
    return n;
}
