/*
 * parallel/engine_params.c - the engine's parameters and optimizer state
 * between steps (dp/engine.h): learning rate, get and set of the
 * parameters and the AdamW moments (from and to the slices' owners, over
 * every rank), and the accessors.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/call.h"
#include "parallel/comm.h"
#include "parallel/optimizer.h"
#include "parallel/pool.h"
#include "parallel/step.h"

// --- parameters and state -------------------------------------------------------------

/* Index of the first value that is not finite (or negative, when
 * nonnegative), or n when every value is fine. */
static size_t first_bad(const float *x, size_t n, int nonnegative)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]) || (nonnegative && x[i] < 0.0f)) return i;
    return n;
}

dp_status dp_engine_set_lr(dp_engine *e, float lr)
{
    DP_TRY(dp_engine_claim(e, "dp_engine_set_lr"));
    if (!isfinite(lr) || lr < 0.0f)
        return dp_engine_unclaim(e, DP_FAIL(DP_ERR_INVALID_ARGUMENT, "learning rate %g; use a finite "
                                  "value >= 0", lr));
    e->lr = lr;
    return dp_engine_unclaim(e, DP_OK);
}

/* The host's flat buffer buf (n_params esize-byte elements) of every rank
 * gets every rank's owned runs (one rank: nothing to do). */
static dp_status allgather_owned(dp_engine *e, void *buf, const char *what)
{
    dp_run runs[DP_MAX_DEVICES];
    size_t n = dp_opt_runs(e, runs);
    return dp_transport_allgather_host(&e->tp, buf, sizeof(float), runs, n, what);
}

dp_status dp_engine_get_params(dp_engine *e, float *host)
{
    DP_TRY(dp_engine_claim(e, "dp_engine_get_params"));
    /* From the slices' owners, which hold the truth even when a failed
     * step left the replicas to re-synchronise; with ranks, each rank's
     * owned range then goes to every rank. */
    dp_status s = DP_OK;
    if (!host) s = DP_FAIL(DP_ERR_INVALID_ARGUMENT, "host must not be NULL");
    /* bf16 replicas: the owners' float32 masters. */
    else if (e->bf16) s = dp_opt_move_masters(e, host, NULL);
    for (size_t i = 0; host && !e->bf16 && s == DP_OK && i < e->L.K; i++) {
        slice *sl = &e->s[i];
        worker *o = dp_local_worker(e, (size_t)sl->owner);
        size_t b = sl->begin, n = sl->end - b;
        if (!n || !o) continue;
        s = dp_device_bind_thread(o->dev);
        if (s == DP_OK) s = dp_copy_d2h(o->dev, host + b, dp_replica_at(o, b), n * sizeof(float));
    }
    /* with ranks the others learn of a failure rather than wait */
    s = dp_transport_agree(&e->tp, s, NULL, NULL, 0, "agreement between the ranks");
    if (s == DP_OK) s = allgather_owned(e, host, "dp_engine_get_params");
    return dp_engine_unclaim(e, s);
}

/* A host buffer of n floats as rank 0 has it, on every rank: src itself
 * with one rank, else *copy (freed by the caller) after the broadcast, so
 * no rank's buffer is written. local: this rank's outcome so far. */
static dp_status from_rank0(dp_engine *e, dp_status local, const float *src, size_t n,
                            float **copy, const char *what)
{
    *copy = NULL;
    if (local == DP_OK && src && dp_transport_spans_ranks(&e->tp)) {
        *copy = malloc(n * sizeof **copy);
        if (*copy) memcpy(*copy, src, n * sizeof **copy);
        else local = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation of %zu floats failed", n);
    }
    dp_status s = dp_transport_agree(&e->tp, local, NULL, NULL, 0, "agreement between the ranks");
    if (s == DP_OK && *copy) s = dp_transport_broadcast(&e->tp, *copy, n * sizeof **copy, what);
    return s;
}

/* The root's replica (and with bf16 replicas every owner's master) from
 * the host's float32 parameters. */
static dp_status set_root_replica(dp_engine *e, const float *host)
{
    size_t n = e->model.n_params;
    worker *root = &e->w[0];
    if (!e->bf16) {
        DP_TRY(dp_device_bind_thread(root->dev));
        return dp_copy_h2d(root->dev, root->params, host, n * sizeof(float));
    }
    DP_TRY(dp_opt_move_masters(e, NULL, host));
    dp_bf16 *h = malloc(n * sizeof *h);
    if (!h)
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation of %zu bfloat16 parameters failed", n);
    for (size_t i = 0; i < n; i++) h[i] = dp_bf16_from_float(host[i]);
    dp_status s = dp_device_bind_thread(root->dev);
    if (s == DP_OK) s = dp_copy_h2d(root->dev, root->params, h, n * sizeof *h);
    free(h);
    return s;
}

dp_status dp_engine_set_params(dp_engine *e, const float *host)
{
    DP_TRY(dp_engine_claim(e, "dp_engine_set_params"));
    size_t n = e->model.n_params, bad;
    float *copy = NULL;
    /* rank 0's values, so the ranks cannot disagree */
    dp_status s = host ? DP_OK : DP_FAIL(DP_ERR_INVALID_ARGUMENT, "host must not be NULL");
    s = from_rank0(e, s, host, n, &copy, "dp_engine_set_params");
    if (s != DP_OK) {
        free(copy);
        return dp_engine_unclaim(e, s);
    }
    if (copy) host = copy;
    bad = first_bad(host, n, 0);
    if (bad < n) {
        dp_status f = DP_FAIL(DP_ERR_INVALID_ARGUMENT, "parameter %zu of %zu is %g; "
                              "parameters must be finite", bad, n, host[bad]);
        free(copy);
        return dp_engine_unclaim(e, f);
    }
    /* A float32 value past bfloat16's largest would be an infinite replica. */
    for (size_t i = 0; e->bf16 && i < n; i++)
        if (isinf(dp_bf16_to_float(dp_bf16_from_float(host[i])))) {
            dp_status f = DP_FAIL(DP_ERR_INVALID_ARGUMENT, "parameter %zu of %zu is %g, past "
                                  "bfloat16's range (|x| < 3.39e38): the model's replicas are "
                                  "bfloat16 (param_dtype); scale it down or train in float32",
                                  i, n, host[i]);
            free(copy);
            return dp_engine_unclaim(e, f);
        }
    s = set_root_replica(e, host);
    /* The root's copy to every replica, the owners included (should it
     * fail, the next step retries it). */
    if (s == DP_OK) {
        e->needs_sync |= DP_SYNC_FROM_ROOT;
        s = dp_engine_sync_replicas(e);
    }
    free(copy);
    return dp_engine_unclaim(e, dp_transport_agree(&e->tp, s, NULL, NULL, 0, "agreement between the ranks"));
}

dp_status dp_engine_get_optimizer_state(dp_engine *e, float *m, float *v, long *t)
{
    DP_TRY(dp_engine_claim(e, "dp_engine_get_optimizer_state"));
    dp_status s = dp_opt_get_state(e, m, v);
    s = dp_transport_agree(&e->tp, s, NULL, NULL, 0, "agreement between the ranks");
    if (s == DP_OK && m) s = allgather_owned(e, m, "optimizer state (m)");
    if (s == DP_OK && v && e->cfg.optim.kind == DP_OPTIMIZER_ADAMW)
        s = allgather_owned(e, v, "optimizer state (v)");
    if (s == DP_OK && t) *t = e->t;
    return dp_engine_unclaim(e, s);
}

static dp_status set_state(dp_engine *e, const float *m, const float *v, long t);

/* Rank 0's state to every rank, then each rank's slices from it. */
dp_status dp_engine_set_optimizer_state(dp_engine *e, const float *m, const float *v, long t)
{
    DP_TRY(dp_engine_claim(e, "dp_engine_set_optimizer_state"));
    size_t n = e->model.n_params;
    if (e->cfg.optim.kind != DP_OPTIMIZER_ADAMW) v = NULL; /* SGD keeps no second moment */
    float *cm = NULL, *cv = NULL;
    dp_status s = from_rank0(e, DP_OK, m, n, &cm, "optimizer state (m)");
    if (s == DP_OK) s = from_rank0(e, DP_OK, v, n, &cv, "optimizer state (v)");
    if (s == DP_OK) s = dp_transport_broadcast(&e->tp, &t, sizeof t, "optimizer step count");
    if (s == DP_OK)
        s = dp_transport_agree(&e->tp, set_state(e, cm ? cm : m, cv ? cv : v, t), NULL, NULL, 0,
                               "agreement between the ranks");
    free(cm);
    free(cv);
    return dp_engine_unclaim(e, s);
}

static dp_status set_state(dp_engine *e, const float *m, const float *v, long t)
{
    size_t n = e->model.n_params, bad;
    if (t < 0 || t > DP_MAX_STEP)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "step count %ld is outside [0, 2^62] "
                       "(DP_MAX_STEP)", t);
    if (m && (bad = first_bad(m, n, 0)) < n)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "first moment %zu of %zu is %g; the optimizer "
                       "state must be finite", bad, n, m[bad]);
    int adamw = e->cfg.optim.kind == DP_OPTIMIZER_ADAMW;
    if (v && adamw && (bad = first_bad(v, n, 1)) < n)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "second moment %zu of %zu is %g; it must be "
                       "finite and >= 0", bad, n, v[bad]);
    dp_status s = dp_opt_set_state(e, m, v);
    if (s == DP_OK) e->t = t;
    return s;
}

size_t dp_engine_num_devices(const dp_engine *e) { return dp_engine_live(e) ? e->L.k : 0; }
size_t dp_engine_num_global_devices(const dp_engine *e) { return dp_engine_live(e) ? e->L.K : 0; }
size_t dp_engine_first_global_device(const dp_engine *e) { return dp_engine_live(e) ? e->L.g0 : 0; }

dp_device *dp_engine_device(dp_engine *e, size_t i)
{
    return dp_engine_live(e) && i < e->L.k ? e->w[i].dev : NULL;
}

const dp_model *dp_engine_model(const dp_engine *e) { return dp_engine_live(e) ? &e->model : NULL; }
