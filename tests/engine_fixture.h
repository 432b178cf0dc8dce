/*
 * tests/engine_fixture.h - the engine tests' shared fixture: the test MLP
 * (fixtures/mlp_model.h) on k CPU devices, deterministic batches, a base
 * configuration, and a close that checks every device byte was freed.
 */
#ifndef DP_TEST_ENGINE_FIXTURE_H
#define DP_TEST_ENGINE_FIXTURE_H

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

static inline void run_open(run *r, int k, dp_engine_config cfg, const mlp_config *mc)
{
    mlp_config def = {D, H, K};
    r->leaked_before = dp_device_bytes_freed_at_close();
    mlp_init_model(&r->net, mc ? mc : &def, &r->model);
    r->crit = dp_criterion_cross_entropy();
    dp_device_spec specs[DP_MAX_DEVICES];
    for (int i = 0; i < k; i++) specs[i] = (dp_device_spec){DP_DEVICE_CPU, i};
    dp_assert_ok(dp_engine_create(specs, (size_t)k, &r->model, &r->crit, &cfg, &r->e));
}

static inline void run_close(run *r)
{
    dp_engine_destroy(r->e);
    cr_assert_eq(dp_device_bytes_freed_at_close(), r->leaked_before,
                 "engine destroy left %zu bytes allocated on its devices",
                 dp_device_bytes_freed_at_close() - r->leaked_before);
}

/* Deterministic batch for step s: D features, targets in [0,K), with an
 * ignored (-1) target every `ignore_every` rows when > 0. */
static inline void make_batch(int s, int rows, int ignore_every, float *x, int32_t *y)
{
    dp_rng rng;
    dp_rng_seed(&rng, 1000 + (uint64_t)s);
    dp_rng_fill_normal(&rng, x, (size_t)rows * D, 0.0f, 1.0f);
    for (int i = 0; i < rows; i++) {
        y[i] = (int32_t)dp_rng_below(&rng, K);
        if (ignore_every > 0 && i % ignore_every == ignore_every - 1) y[i] = -1;
    }
}

static inline dp_engine_config base_cfg(dp_mode mode)
{
    dp_engine_config c = dp_engine_config_default();
    c.mode = mode;
    c.optim.lr = 1e-2f;
    c.optim.weight_decay = 0.1f;
    c.optim.grad_clip = 1.0f;
    c.seed = 7;
    return c;
}

/* Parameter cases mode * 100 + device * 10 + phase: both modes, devices
 * 0, step, 2 step, ... <= dev_hi, every phase. Returns the count. */
static inline size_t phase_cases(int *cases, int dev_hi, int dev_step)
{
    size_t n = 0;
    for (int m = 0; m < 2; m++)
        for (int d = 0; d <= dev_hi; d += dev_step)
            for (int p = 0; p < DP_PHASE_COUNT; p++) cases[n++] = m * 100 + d * 10 + p;
    return n;
}

#endif /* DP_TEST_ENGINE_FIXTURE_H */
