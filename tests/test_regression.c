/*
 * Float targets through the engine: the regression example's model
 * (examples/regression/linreg.c) with dp_criterion_mse, NaN targets
 * ignored. k devices equal one device in both modes, gather equals
 * balanced, micro-batches and accumulation equal the whole batch, the
 * evaluated loss equals a float64 reference, and bad float targets are
 * refused.
 */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "dp_test.h"

#include <criterion/parameterized.h>

#include "linreg.h"

enum { RD = 5, RO = 3, RROWS = 23, RSTEPS = 4 };

/* Deterministic data; element (i, o) is NaN when (i + 2 o) % 6 == 1, and
 * row 4 is missing entirely. */
static void reg_data(int s, float *x, float *y)
{
    dp_rng rng;
    dp_rng_seed(&rng, 300 + (uint64_t)s);
    dp_rng_fill_normal(&rng, x, RROWS * RD, 0.0f, 1.0f);
    dp_rng_fill_normal(&rng, y, RROWS * RO, 1.0f, 2.0f);
    for (int i = 0; i < RROWS; i++)
        for (int o = 0; o < RO; o++)
            if ((i + 2 * o) % 6 == 1 || i == 4) y[i * RO + o] = NAN;
}

typedef struct reg_run {
    linreg net;
    dp_model model;
    dp_criterion mse;
    dp_engine *e;
    double loss[RSTEPS];
    size_t valid;
    float params[256];
} reg_run;

static dp_engine_config reg_cfg(dp_mode mode)
{
    dp_engine_config c = dp_engine_config_default();
    c.mode = mode;
    c.optim.lr = 0.05f;
    c.optim.weight_decay = 0.0f;
    c.seed = 11;
    return c;
}

static void reg_open(reg_run *r, int k, dp_engine_config cfg)
{
    memset(r, 0, sizeof *r);
    linreg_init_model(&r->net, RD, RO, &r->model);
    cr_assert(r->model.n_params <= 256);
    r->mse = dp_criterion_mse();
    dp_device_spec specs[DP_MAX_DEVICES];
    for (int i = 0; i < k; i++) specs[i] = (dp_device_spec){DP_DEVICE_CPU, i};
    dp_assert_ok(dp_engine_create(specs, (size_t)k, &r->model, &r->mse, &cfg, &r->e));
}

/* RSTEPS training steps on one batch, recording each loss and the final
 * parameters. */
static void reg_train(reg_run *r)
{
    float x[RROWS * RD], y[RROWS * RO];
    reg_data(0, x, y);
    for (int s = 0; s < RSTEPS; s++) {
        dp_batch b = {RROWS, x, y};
        dp_step_stats st;
        dp_assert_ok(dp_engine_step(r->e, &b, &st));
        cr_assert(!st.skipped);
        r->loss[s] = st.loss;
        r->valid = st.valid_targets;
    }
    dp_assert_ok(dp_engine_get_params(r->e, r->params));
    dp_engine_destroy(r->e);
    r->e = NULL;
}

static void assert_same_run(const reg_run *a, const reg_run *b, double tol)
{
    cr_assert_eq(a->valid, b->valid, "N differs: %zu vs %zu", a->valid, b->valid);
    dp_assert_allclose(a->loss, b->loss, RSTEPS, tol, tol);
    dp_assert_allclose(a->params, b->params, a->model.n_params, tol, tol);
}

/* Valid elements of reg_data's batch: N. */
static size_t reg_valid(void)
{
    float x[RROWS * RD], y[RROWS * RO];
    reg_data(0, x, y);
    size_t n = 0;
    for (int i = 0; i < RROWS * RO; i++) n += !isnan(y[i]);
    return n;
}

/* Case: mode * 10 + k. */
ParameterizedTestParameters(regression, k_devices_equal_one_device)
{
    static int cases[] = {2, 3, 4, 12, 13, 14};
    return cr_make_param_array(int, cases, sizeof cases / sizeof *cases);
}

ParameterizedTest(int *c, regression, k_devices_equal_one_device, .timeout = 60)
{
    dp_mode mode = *c / 10 ? DP_MODE_GATHER : DP_MODE_BALANCED;
    static reg_run one, many;
    reg_open(&one, 1, reg_cfg(mode));
    reg_train(&one);
    reg_open(&many, *c % 10, reg_cfg(mode));
    reg_train(&many);
    cr_assert_eq(one.valid, reg_valid(), "N counts the non-NaN target elements");
    cr_assert(one.loss[RSTEPS - 1] < one.loss[0], "the loss must fall: %g -> %g", one.loss[0],
              one.loss[RSTEPS - 1]);
    assert_same_run(&one, &many, 1e-6);
}

Test(regression, gather_equals_balanced)
{
    static reg_run bal, gat;
    reg_open(&bal, 3, reg_cfg(DP_MODE_BALANCED));
    reg_train(&bal);
    reg_open(&gat, 3, reg_cfg(DP_MODE_GATHER));
    reg_train(&gat);
    assert_same_run(&bal, &gat, 1e-6);
}

/* Case: mode * 10 + variant (0: max 2 rows per micro-batch, 1: grad_accum
 * 3, 2: max 4 tokens, i.e. outputs, per micro-batch, 3: token-balanced
 * split by valid elements). */
ParameterizedTestParameters(regression, micro_batches_equal_whole_batch)
{
    static int cases[] = {0, 1, 2, 3, 10, 11, 12, 13};
    return cr_make_param_array(int, cases, sizeof cases / sizeof *cases);
}

ParameterizedTest(int *c, regression, micro_batches_equal_whole_batch, .timeout = 60)
{
    dp_mode mode = *c / 10 ? DP_MODE_GATHER : DP_MODE_BALANCED;
    static reg_run whole, micro;
    reg_open(&whole, 2, reg_cfg(mode));
    reg_train(&whole);
    dp_engine_config cfg = reg_cfg(mode);
    switch (*c % 10) {
    case 0: cfg.max_rows_per_micro = 2; break;
    case 1: cfg.grad_accum = 3; break;
    case 2: cfg.max_tokens_per_micro = 4; break;
    default: cfg.token_balanced = 1; break;
    }
    reg_open(&micro, 2, cfg);
    reg_train(&micro);
    assert_same_run(&whole, &micro, 1e-6);
}

Test(regression, token_balanced_split_counts_valid_elements)
{
    reg_run r;
    dp_engine_config cfg = reg_cfg(DP_MODE_BALANCED);
    cfg.token_balanced = 1;
    reg_open(&r, 2, cfg);
    /* rows 0-5 fully valid (3 each), rows 6-11 all NaN but row 11 (1 valid) */
    float x[12 * RD] = {0}, y[12 * RO];
    for (int i = 0; i < 12 * RO; i++) y[i] = i < 6 * RO ? 1.0f : NAN;
    y[11 * RO] = 2.0f;
    size_t rows[2];
    dp_assert_ok(dp_engine_plan(r.e, 12, y, rows));
    /* 19 valid elements: the first device's share (9.5) is cut after row 3 */
    cr_assert(rows[0] == 3 || rows[0] == 4, "split %zu/%zu", rows[0], rows[1]);
    dp_batch b = {12, x, y};
    dp_step_stats st;
    dp_assert_ok(dp_engine_step(r.e, &b, &st));
    cr_assert_eq(st.valid_targets, 19);
    cr_assert_eq(st.devices[0].valid_targets + st.devices[1].valid_targets, 19);
    dp_engine_destroy(r.e);
}

Test(regression, evaluate_equals_float64_mse)
{
    reg_run r;
    reg_open(&r, 3, reg_cfg(DP_MODE_BALANCED));
    float x[RROWS * RD], y[RROWS * RO];
    reg_data(0, x, y);
    dp_assert_ok(dp_engine_get_params(r.e, r.params));
    /* move the bias off zero so it matters */
    float *bias = r.params + r.net.tensors[1].offset;
    for (int o = 0; o < RO; o++) bias[o] = 0.25f * (float)(o + 1);
    dp_assert_ok(dp_engine_set_params(r.e, r.params));
    const float *w = r.params + r.net.tensors[0].offset;
    double sse = 0.0;
    size_t n = 0;
    for (int i = 0; i < RROWS; i++)
        for (int o = 0; o < RO; o++) {
            if (isnan(y[i * RO + o])) continue;
            double p = bias[o];
            for (int d = 0; d < RD; d++) p += (double)w[o * RD + d] * x[i * RD + d];
            sse += (p - y[i * RO + o]) * (p - y[i * RO + o]);
            n++;
        }
    double want = sse / (double)n;
    dp_batch b = {RROWS, x, y};
    dp_step_stats st;
    dp_assert_ok(dp_engine_evaluate(r.e, &b, &st));
    cr_assert_eq(st.valid_targets, n);
    dp_assert_allclose(&st.loss, &want, 1, 1e-6, 1e-6);
    dp_engine_destroy(r.e);
}

Test(regression, bad_float_targets_are_refused)
{
    reg_run r;
    reg_open(&r, 2, reg_cfg(DP_MODE_BALANCED));
    float x[4 * RD] = {0}, y[4 * RO];
    for (int i = 0; i < 4 * RO; i++) y[i] = NAN;
    dp_batch b = {4, x, y};
    cr_assert_eq(dp_engine_step(r.e, &b, NULL), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "no valid target (all NaN)"), "%s", dp_last_error());
    y[5] = INFINITY;
    cr_assert_eq(dp_engine_step(r.e, &b, NULL), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "element 5 is infinite"), "%s", dp_last_error());
    dp_engine_destroy(r.e);
}

// --- the criterion contract, observed ----------------------------------------------------

typedef struct probe {
    dp_criterion inner;
    pthread_mutex_t mu;
    int calls, scratch_seen, aliased, separate_zeroed, separate_dirty, no_dlogits;
    float dscale;
    size_t n_valid_sum;
} probe;

static dp_status probe_fb(void *ctx, const dp_criterion_args *a, double *loss, size_t *count)
{
    probe *p = ctx;
    /* CPU device pointers are host addresses: the probe may read them. */
    int zeroed = 1;
    if (a->dlogits && a->dlogits != a->logits)
        for (size_t i = 0; i < a->n * a->V; i++) zeroed = zeroed && a->dlogits[i] == 0.0f;
    pthread_mutex_lock(&p->mu);
    p->calls++;
    p->scratch_seen += a->scratch != NULL;
    p->aliased += a->dlogits && a->dlogits == a->logits;
    p->separate_zeroed += a->dlogits && a->dlogits != a->logits && zeroed;
    p->separate_dirty += a->dlogits && a->dlogits != a->logits && !zeroed;
    p->no_dlogits += a->dlogits == NULL;
    p->dscale = a->dscale;
    p->n_valid_sum += a->n_valid;
    pthread_mutex_unlock(&p->mu);
    return p->inner.forward_backward(p->inner.ctx, a, loss, count);
}

/* Case: mode * 10 + train. Three devices, at most 3 rows per micro-batch. */
ParameterizedTestParameters(regression, criterion_contract_holds)
{
    static int cases[] = {0, 1, 11};
    return cr_make_param_array(int, cases, sizeof cases / sizeof *cases);
}

ParameterizedTest(int *c, regression, criterion_contract_holds)
{
    int gather = *c / 10, train = *c % 10;
    probe p;
    memset(&p, 0, sizeof p);
    pthread_mutex_init(&p.mu, NULL);
    p.inner = dp_criterion_mse();
    linreg net;
    dp_model model;
    linreg_init_model(&net, RD, RO, &model);
    /* no scratch_bytes: allowed */
    dp_criterion crit = {&p, NULL, probe_fb, DP_TARGET_F32, 0, 0, 0};
    dp_engine_config cfg = reg_cfg(gather ? DP_MODE_GATHER : DP_MODE_BALANCED);
    cfg.max_rows_per_micro = 3;
    dp_device_spec specs[3] = {{DP_DEVICE_CPU, 0}, {DP_DEVICE_CPU, 1}, {DP_DEVICE_CPU, 2}};
    dp_engine *e = NULL;
    dp_assert_ok(dp_engine_create(specs, 3, &model, &crit, &cfg, &e));
    float x[RROWS * RD], y[RROWS * RO];
    reg_data(0, x, y);
    dp_batch b = {RROWS, x, y};
    dp_step_stats st;
    /* Two training steps: the second finds gather mode's buffer dirty from the first. */
    int steps = train ? 2 : 1;
    for (int s = 0; s < steps; s++) {
        if (train) dp_assert_ok(dp_engine_step(e, &b, &st));
        else dp_assert_ok(dp_engine_evaluate(e, &b, &st));
    }
    size_t micro = 0;
    for (size_t i = 0; i < st.n_devices; i++)
        micro = gather ? (st.devices[i].micro_batches > micro ? st.devices[i].micro_batches : micro)
                       : micro + st.devices[i].micro_batches;
    /* 23 rows over 3 devices (8/8/7), 3 rows per micro-batch: 3 + 3 + 3 */
    cr_assert_eq(micro, gather ? 3 : 9);
    cr_assert_eq(p.calls, steps * (int)micro, "once per micro-batch (%s): %d calls",
                 gather ? "on the root" : "per device", p.calls);
    cr_assert_eq(p.scratch_seen, 0, "scratch is NULL when the criterion asks for none");
    cr_assert_eq(p.dscale, (float)(1.0 / (double)st.valid_targets), "dscale is 1/N global");
    cr_assert_eq(p.n_valid_sum, steps * st.valid_targets, "the chunks' n_valid add up to N");
    if (!train) cr_assert_eq(p.no_dlogits, p.calls, "dlogits is NULL in evaluation");
    else if (!gather) cr_assert_eq(p.aliased, p.calls, "dlogits aliases logits (balanced)");
    else
        cr_assert(p.separate_zeroed == p.calls && p.separate_dirty == 0,
                  "dlogits is a separate zeroed buffer (gather): %d of %d", p.separate_zeroed,
                  p.calls);
    dp_engine_destroy(e);
    pthread_mutex_destroy(&p.mu);
}
