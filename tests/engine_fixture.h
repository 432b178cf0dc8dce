/*
 * tests/engine_fixture.h - the engine tests' shared fixture: the test MLP
 * (fixtures/mlp_model.h) on k CPU devices, deterministic batches, a base
 * configuration, and a close that checks every device byte was freed.
 */
#ifndef DP_TEST_ENGINE_FIXTURE_H
#define DP_TEST_ENGINE_FIXTURE_H

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "dp_test.h"
#include "mlp_model.h"
#include "parallel/engine_testing.h"

// --- fixtures ---------------------------------------------------------------------------

enum { D = 6, H = 12, K = 5, MAXROWS = 32, STEPS = 3 };

typedef struct run {
    mlp net;
    dp_model model;
    dp_criterion crit;
    dp_engine *e;
    size_t leaked_before;
} run;

static inline void dp_test_run_open(run *r, int k, dp_engine_config cfg, const mlp_config *mc)
{
    mlp_config def = {D, H, K, DP_DTYPE_F32};
    r->leaked_before = dp_device_bytes_freed_at_close();
    mlp_init_model(&r->net, mc ? mc : &def, &r->model);
    r->crit = dp_criterion_cross_entropy();
    dp_device_spec specs[DP_MAX_DEVICES];
    for (int i = 0; i < k; i++) specs[i] = (dp_device_spec){DP_DEVICE_CPU, i};
    dp_assert_ok(dp_engine_create(specs, (size_t)k, &r->model, &r->crit, &cfg, &r->e));
}

static inline void dp_test_run_close(run *r)
{
    dp_engine_destroy(r->e);
    cr_assert_eq(dp_device_bytes_freed_at_close(), r->leaked_before,
                 "engine destroy left %zu bytes allocated on its devices",
                 dp_device_bytes_freed_at_close() - r->leaked_before);
}

/* Deterministic batch for step s: D features, targets in [0,K), with an
 * ignored (-1) target every `ignore_every` rows when > 0. */
static inline void dp_test_make_batch(int s, int rows, int ignore_every, float *x, int32_t *y)
{
    dp_rng rng;
    dp_rng_seed(&rng, 1000 + (uint64_t)s);
    dp_rng_fill_normal(&rng, x, (size_t)rows * D, 0.0f, 1.0f);
    for (int i = 0; i < rows; i++) {
        y[i] = (int32_t)dp_rng_below(&rng, K);
        if (ignore_every > 0 && i % ignore_every == ignore_every - 1) y[i] = -1;
    }
}

static inline dp_engine_config dp_test_base_cfg(dp_mode mode)
{
    dp_engine_config c = dp_engine_config_default();
    c.mode = mode;
    c.optim.lr = 1e-2f;
    c.optim.weight_decay = 0.1f;
    c.optim.grad_clip = 1.0f;
    c.seed = 7;
    return c;
}

/* Parameter cases (mode + 2 * shard) * 100 + device * 10 + phase: both
 * modes, root and sharded optimizer (dp_test_case_cfg), devices 0, step, 2 step,
 * ... <= dev_hi, every phase. Returns the count. */
static inline size_t dp_test_phase_cases(int *cases, int dev_hi, int dev_step)
{
    size_t n = 0;
    for (int m = 0; m < 4; m++)
        for (int d = 0; d <= dev_hi; d += dev_step)
            for (int p = 0; p < DP_PHASE_COUNT; p++) cases[n++] = m * 100 + d * 10 + p;
    return n;
}

/* The configuration of a dp_test_phase_cases case. */
static inline dp_engine_config dp_test_case_cfg(int c)
{
    dp_engine_config cfg = dp_test_base_cfg((dp_mode)(c / 100 % 2));
    cfg.shard_optimizer = c / 200;
    return cfg;
}

// --- a model and criterion with hooks --------------------------------------------------

/* The test MLP and cross-entropy, wrapped: between steps a test may make
 * one device's criterion report a +Inf loss sum (its dlogits stay finite),
 * make one device's backward write +Inf into its first gradient element
 * (its loss stays finite), or make device 0's forward block until the test
 * releases it (a step held in progress). -1 = off. */
typedef struct hooked {
    mlp net;
    dp_model inner, model;
    dp_criterion inner_crit, crit;
    int inf_loss_dev, inf_grad_dev;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int block, entered, released;
} hooked;

static inline int dp_test_hooked_is(const dp_device *dev, int index)
{
    char want[16];
    snprintf(want, sizeof want, "cpu:%d", index);
    return index >= 0 && strcmp(dp_device_name(dev), want) == 0;
}

static inline dp_status dp_test_hooked_forward(void *ctx, dp_device *dev, dp_params params,
                                       const dp_chunk *c, void *ws, float *logits)
{
    hooked *h = ctx;
    pthread_mutex_lock(&h->mu);
    if (h->block && dp_test_hooked_is(dev, 0)) {
        h->entered = 1;
        pthread_cond_broadcast(&h->cv);
        while (!h->released) pthread_cond_wait(&h->cv, &h->mu);
        h->block = 0;
    }
    pthread_mutex_unlock(&h->mu);
    return h->inner.forward(h->inner.ctx, dev, params, c, ws, logits);
}

static inline dp_status dp_test_hooked_backward(void *ctx, dp_device *dev, dp_params params, float *g,
                                        const dp_chunk *c, void *ws, float *dlogits)
{
    hooked *h = ctx;
    /* The +Inf is written after the inner backward: its gradient-ready
     * signals (dp_grads_ready) are withheld, so nothing is final early. */
    dp_chunk quiet = *c;
    quiet.ready = NULL;
    int poison = dp_test_hooked_is(dev, h->inf_grad_dev);
    dp_status s = h->inner.backward(h->inner.ctx, dev, params, g, poison ? &quiet : c, ws, dlogits);
    if (s == DP_OK && poison) {
        float inf = INFINITY;
        s = dp_copy_h2d(dev, g, &inf, sizeof inf);
    }
    return s;
}

static inline dp_status dp_test_hooked_criterion(void *ctx, const dp_criterion_args *a,
                                         double *loss_sum, size_t *count)
{
    hooked *h = ctx;
    dp_status s = h->inner_crit.forward_backward(h->inner_crit.ctx, a, loss_sum, count);
    if (s == DP_OK && dp_test_hooked_is(a->dev, h->inf_loss_dev)) *loss_sum = INFINITY;
    return s;
}

static inline size_t dp_test_hooked_scratch(void *ctx, size_t n, size_t V)
{
    hooked *h = ctx;
    return h->inner_crit.scratch_bytes(h->inner_crit.ctx, n, V);
}

/* Opens the hooked MLP on k CPU devices (h must stay put while open). */
static inline dp_engine *dp_test_hooked_open(hooked *h, int k, dp_engine_config cfg)
{
    mlp_config mc = {D, H, K, DP_DTYPE_F32};
    memset(h, 0, sizeof *h);
    mlp_init_model(&h->net, &mc, &h->inner);
    h->model = h->inner;
    h->model.ctx = h;
    h->model.forward = dp_test_hooked_forward;
    h->model.backward = dp_test_hooked_backward;
    h->inner_crit = dp_criterion_cross_entropy();
    h->crit.ctx = h;
    h->crit.scratch_bytes = dp_test_hooked_scratch;
    h->crit.forward_backward = dp_test_hooked_criterion;
    h->inf_loss_dev = h->inf_grad_dev = -1;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    dp_device_spec specs[DP_MAX_DEVICES];
    for (int i = 0; i < k; i++) specs[i] = (dp_device_spec){DP_DEVICE_CPU, i};
    dp_engine *e = NULL;
    dp_assert_ok(dp_engine_create(specs, (size_t)k, &h->model, &h->crit, &cfg, &e));
    return e;
}

static inline void dp_test_hooked_close(hooked *h, dp_engine *e)
{
    dp_engine_destroy(e);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
}

#endif /* DP_TEST_ENGINE_FIXTURE_H */
