/*
 * The DataParallel engine on CPU virtual devices, with the example MLP.
 *
 * The central invariant: k devices == 1 device. For any device count,
 * batch size and mode, with the optimizer state on the root or sharded
 * over the devices, three optimizer steps give the same losses and
 * parameters as the single-device run, within float tolerance.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dp_test.h"

#include <criterion/parameterized.h>
#include "engine_fixture.h"

/* Trains STEPS steps; writes the losses and the final parameters. */
static void train(int k, dp_engine_config cfg, int rows, int ignore_every, double *losses,
                  float *params, size_t *n_params)
{
    run r;
    dp_test_run_open(&r, k, cfg, NULL);
    float x[MAXROWS * D];
    int32_t y[MAXROWS];
    for (int s = 0; s < STEPS; s++) {
        dp_test_make_batch(s, rows, ignore_every, x, y);
        dp_batch b = {(size_t)rows, x, y};
        dp_step_stats st;
        dp_assert_ok(dp_engine_step(r.e, &b, &st));
        cr_assert_eq(st.step, s + 1);
        cr_assert(!st.skipped);
        losses[s] = st.loss;
    }
    *n_params = r.model.n_params;
    dp_assert_ok(dp_engine_get_params(r.e, params));
    dp_test_run_close(&r);
}

#define NP_MAX 4096

// --- k devices == 1 device -----------------------------------------------------------------

typedef struct equiv_case {
    int k, rows;
    dp_mode mode;
    int shard; /* shard_optimizer of the k-device run */
} equiv_case;

ParameterizedTestParameters(engine, k_devices_equal_one_device)
{
    static equiv_case cases[4 * 5 * 2 * 2];
    static const int ks[] = {1, 2, 3, 4}, rows[] = {1, 2, 5, 7, 16};
    size_t n = 0;
    for (int sh = 0; sh < 2; sh++)
        for (int m = 0; m < 2; m++)
            for (int a = 0; a < 4; a++)
                for (int b = 0; b < 5; b++)
                    cases[n++] = (equiv_case){ks[a], rows[b], (dp_mode)m, sh};
    return cr_make_param_array(equiv_case, cases, n);
}

/*
 * Tolerance: the k-device run sums the same per-row gradients in another
 * order (per device, then across devices), so gradients differ by float32
 * rounding (~1e-7 relative). AdamW divides by sqrt(v), which amplifies that
 * only where |g| ~ eps; three steps of lr 1e-2 keep the parameter
 * differences near 1e-7 absolute. 1e-5 relative + 1e-6 absolute bounds them.
 */
ParameterizedTest(equiv_case *c, engine, k_devices_equal_one_device, .timeout = 60)
{
    /* AdamW and clipping are nearly invariant to the gradient's scale, so
     * SGD without clipping runs too: it catches a wrong 1/N. */
    for (int o = 0; o < DP_OPTIMIZER_COUNT; o++) {
        double l1[STEPS], lk[STEPS];
        static float p1[NP_MAX], pk[NP_MAX];
        size_t n1, nk;
        dp_engine_config c1 = dp_test_base_cfg(DP_MODE_BALANCED), ck = dp_test_base_cfg(c->mode);
        ck.shard_optimizer = c->shard;
        c1.optim.kind = ck.optim.kind = (dp_optimizer)o;
        c1.optim.momentum = ck.optim.momentum = 0.9f;
        if (o == DP_OPTIMIZER_SGD) c1.optim.grad_clip = ck.optim.grad_clip = 0.0f;
        train(1, c1, c->rows, 3, l1, p1, &n1);
        train(c->k, ck, c->rows, 3, lk, pk, &nk);
        cr_assert_eq(n1, nk);
        dp_assert_allclose(lk, l1, STEPS, 1e-7, 1e-5);
        dp_assert_allclose(pk, p1, n1, 1e-6, 1e-5);
    }
}

Test(engine, gather_equals_balanced_and_loss_falls)
{
    double lb[STEPS], lg[STEPS];
    static float pb[NP_MAX], pg[NP_MAX];
    size_t nb, ng;
    train(3, dp_test_base_cfg(DP_MODE_BALANCED), 16, 0, lb, pb, &nb);
    train(3, dp_test_base_cfg(DP_MODE_GATHER), 16, 0, lg, pg, &ng);
    dp_assert_allclose(lg, lb, STEPS, 1e-7, 1e-5);
    dp_assert_allclose(pg, pb, nb, 1e-6, 1e-5);
    /* The same fixed batch, trained on: its loss must fall. */
    run r;
    dp_test_run_open(&r, 2, dp_test_base_cfg(DP_MODE_BALANCED), NULL);
    float x[16 * D];
    int32_t y[16];
    dp_test_make_batch(0, 16, 0, x, y);
    dp_batch b = {16, x, y};
    dp_step_stats first, st;
    dp_assert_ok(dp_engine_step(r.e, &b, &first));
    for (int i = 0; i < 30; i++) dp_assert_ok(dp_engine_step(r.e, &b, &st));
    cr_assert_lt(st.loss, 0.5 * first.loss, "loss %g did not fall from %g", st.loss, first.loss);
    dp_test_run_close(&r);
}

Test(engine, micro_batches_equal_whole_batch)
{
    double l0[STEPS], l1[STEPS];
    static float p0[NP_MAX], p1[NP_MAX];
    size_t n;
    train(2, dp_test_base_cfg(DP_MODE_BALANCED), 16, 4, l0, p0, &n);
    dp_engine_config c = dp_test_base_cfg(DP_MODE_BALANCED);
    c.grad_accum = 3;
    train(2, c, 16, 4, l1, p1, &n);
    dp_assert_allclose(l1, l0, STEPS, 1e-7, 1e-5);
    dp_assert_allclose(p1, p0, n, 1e-6, 1e-5);
    c = dp_test_base_cfg(DP_MODE_GATHER);
    c.max_rows_per_micro = 3;
    train(2, c, 16, 4, l1, p1, &n);
    dp_assert_allclose(l1, l0, STEPS, 1e-7, 1e-5);
    dp_assert_allclose(p1, p0, n, 1e-6, 1e-5);
    c = dp_test_base_cfg(DP_MODE_BALANCED);
    c.max_tokens_per_micro = 2;
    train(2, c, 16, 4, l1, p1, &n);
    dp_assert_allclose(l1, l0, STEPS, 1e-7, 1e-5);
    dp_assert_allclose(p1, p0, n, 1e-6, 1e-5);
}

Test(engine, weighted_and_token_balanced_splits_equal_plain_split)
{
    double l0[STEPS], l1[STEPS];
    static float p0[NP_MAX], p1[NP_MAX];
    size_t n;
    train(3, dp_test_base_cfg(DP_MODE_BALANCED), 16, 2, l0, p0, &n);
    static const float w[3] = {0.5f, 1.0f, 1.0f};
    for (int m = 0; m < 2; m++) {
        dp_engine_config c = dp_test_base_cfg((dp_mode)m);
        c.device_weights = w;
        train(3, c, 16, 2, l1, p1, &n);
        dp_assert_allclose(l1, l0, STEPS, 1e-7, 1e-5);
        dp_assert_allclose(p1, p0, n, 1e-6, 1e-5);
        c = dp_test_base_cfg((dp_mode)m);
        c.token_balanced = 1;
        train(3, c, 16, 2, l1, p1, &n);
        dp_assert_allclose(l1, l0, STEPS, 1e-7, 1e-5);
        dp_assert_allclose(p1, p0, n, 1e-6, 1e-5);
    }
}

Test(engine, same_seed_is_bitwise_identical)
{
    for (int m = 0; m < 2; m++) {
        double la[STEPS], lb[STEPS];
        static float pa[NP_MAX], pb[NP_MAX];
        size_t n;
        train(3, dp_test_base_cfg((dp_mode)m), 7, 3, la, pa, &n);
        train(3, dp_test_base_cfg((dp_mode)m), 7, 3, lb, pb, &n);
        cr_assert(memcmp(la, lb, sizeof la) == 0, "losses differ between identical runs");
        cr_assert(memcmp(pa, pb, n * sizeof(float)) == 0, "parameters differ between identical runs");
    }
}

// --- the split -----------------------------------------------------------------------------

Test(engine, plan_splits_rows_as_documented)
{
    run r;
    dp_test_run_open(&r, 3, dp_test_base_cfg(DP_MODE_BALANCED), NULL);
    size_t rows[3];
    dp_assert_ok(dp_engine_plan(r.e, 7, NULL, rows));
    cr_assert(rows[0] == 3 && rows[1] == 2 && rows[2] == 2, "7 rows: %zu/%zu/%zu", rows[0], rows[1], rows[2]);
    dp_assert_ok(dp_engine_plan(r.e, 2, NULL, rows));
    cr_assert(rows[0] == 1 && rows[1] == 1 && rows[2] == 0, "2 rows: %zu/%zu/%zu", rows[0], rows[1], rows[2]);

    /* Huge counts: the shares add up to rows exactly up to 2^53 (they are
     * computed in double), and past it are refused, not looped on. */
    static const size_t huge[] = {(size_t)1 << 53, ((size_t)1 << 53) - 1, ((size_t)1 << 52) + 3};
    for (size_t h = 0; h < sizeof huge / sizeof huge[0]; h++) {
        dp_assert_ok(dp_engine_plan(r.e, huge[h], NULL, rows));
        cr_assert_eq(rows[0] + rows[1] + rows[2], huge[h], "%zu rows: %zu/%zu/%zu", huge[h],
                     rows[0], rows[1], rows[2]);
        cr_assert(rows[0] >= rows[1] && rows[1] >= rows[2] && rows[0] - rows[2] <= 1,
                  "%zu rows: %zu/%zu/%zu", huge[h], rows[0], rows[1], rows[2]);
    }
    cr_assert_eq(dp_engine_usable(NULL), DP_ERR_INVALID_ARGUMENT);
    dp_assert_ok(dp_engine_usable(r.e));
    static const size_t refused[] = {((size_t)1 << 53) + 1, ((size_t)1 << 54) + 3, SIZE_MAX};
    for (size_t h = 0; h < sizeof refused / sizeof refused[0]; h++) {
        cr_assert_eq(dp_engine_plan(r.e, refused[h], NULL, rows), DP_ERR_INVALID_ARGUMENT);
        cr_assert(strstr(dp_last_error(), "at most 2^53 rows"), "%s", dp_last_error());
    }

    /* A batch smaller than the device count leaves a device idle. */
    float x[2 * D];
    int32_t y[2];
    dp_test_make_batch(0, 2, 0, x, y);
    dp_batch b = {2, x, y};
    dp_step_stats st;
    dp_assert_ok(dp_engine_step(r.e, &b, &st));
    cr_assert_eq(st.devices[2].rows, 0);
    cr_assert_eq(st.devices[2].micro_batches, 0);
    dp_test_run_close(&r);

    static const float w[3] = {0.5f, 1.0f, 1.0f};
    dp_engine_config c = dp_test_base_cfg(DP_MODE_BALANCED);
    c.device_weights = w;
    dp_test_run_open(&r, 3, c, NULL);
    dp_assert_ok(dp_engine_plan(r.e, 10, NULL, rows));
    cr_assert(rows[0] == 2 && rows[1] == 4 && rows[2] == 4, "weighted: %zu/%zu/%zu", rows[0], rows[1], rows[2]);
    dp_test_run_close(&r);

    /* Token-balanced: the first 6 rows hold no valid target, the last 6 all
     * of them; a plain split would give device 0 nothing to learn from. */
    c = dp_test_base_cfg(DP_MODE_BALANCED);
    c.token_balanced = 1;
    dp_test_run_open(&r, 2, c, NULL);
    int32_t t[12] = {-1, -1, -1, -1, -1, -1, 0, 1, 2, 3, 4, 0};
    dp_assert_ok(dp_engine_plan(r.e, 12, t, rows));
    cr_assert(rows[0] == 9 && rows[1] == 3, "token-balanced: %zu/%zu", rows[0], rows[1]);
    dp_test_run_close(&r);
}

// --- memory ----------------------------------------------------------------------------------

/* The logits dominate: K = 4096 classes, 16 rows on 4 devices. */
Test(engine, balanced_keeps_logits_local_gather_holds_them_on_root)
{
    enum { ROWS = 16, KK = 4096 };
    mlp_config mc = {D, H, KK, DP_DTYPE_F32};
    static float x[ROWS * D];
    int32_t y[ROWS];
    dp_rng rng;
    dp_rng_seed(&rng, 3);
    dp_rng_fill_normal(&rng, x, ROWS * D, 0, 1);
    for (int i = 0; i < ROWS; i++) y[i] = (int32_t)dp_rng_below(&rng, KK);
    size_t full = (size_t)ROWS * KK * sizeof(float); /* the whole batch's logits */
    for (int m = 0; m < 2; m++) {
        run r;
        dp_test_run_open(&r, 4, dp_test_base_cfg((dp_mode)m), &mc);
        dp_batch b = {ROWS, x, y};
        dp_step_stats st;
        dp_assert_ok(dp_engine_step(r.e, &b, &st));
        for (int d = 0; d < 4; d++) {
            const dp_device_step_stats *ds = &st.devices[d];
            size_t fixed = ds->param_bytes + ds->optimizer_bytes;
            size_t transient = ds->step_peak - fixed; /* activations, logits, scratch */
            if (m == DP_MODE_BALANCED || d > 0)
                cr_assert_lt(transient, full, "%s device %d: %zu transient bytes >= the full batch's "
                             "logits (%zu)", dp_mode_name((dp_mode)m), d, transient, full);
            else
                cr_assert_geq(ds->phase_peak[DP_PHASE_CRITERION] - fixed, 2 * full,
                              "gather root must hold the gathered logits and their gradient");
        }
        dp_test_run_close(&r);
    }
}

// --- failures --------------------------------------------------------------------------------

ParameterizedTestParameters(engine, injected_fault_is_reported_and_recovered)
{
    static int cases[4 * 2 * DP_PHASE_COUNT]; /* see dp_test_phase_cases */
    return cr_make_param_array(int, cases, dp_test_phase_cases(cases, 2, 2));
}

ParameterizedTest(int *c, engine, injected_fault_is_reported_and_recovered, .timeout = 10)
{
    int dev = *c / 10 % 10;
    dp_phase phase = (dp_phase)(*c % 10);
    run r;
    dp_engine_config cfg = dp_test_case_cfg(*c);
    cfg.check_replicas_every = 1; /* the recovered steps check the replicas agree */
    dp_test_run_open(&r, 3, cfg, NULL);
    static float before[NP_MAX], after[NP_MAX];
    float x[7 * D];
    int32_t y[7];
    dp_test_make_batch(0, 7, 0, x, y);
    dp_batch b = {7, x, y};
    dp_step_stats st;
    dp_assert_ok(dp_engine_get_params(r.e, before));
    dp_engine_inject_fault(r.e, dev, phase, DP_ERR_DEVICE);
    dp_status s = dp_engine_step(r.e, &b, &st);
    cr_assert_eq(s, DP_ERR_DEVICE, "step returned %s", dp_strerror(s));
    char want[64];
    snprintf(want, sizeof want, "cpu:%d %s:", dev, dp_phase_name(phase));
    cr_assert(strstr(dp_last_error(), want), "message \"%s\" does not name \"%s\"", dp_last_error(), want);
    if (phase < DP_PHASE_OPTIMIZER) {
        dp_assert_ok(dp_engine_get_params(r.e, after));
        cr_assert(memcmp(before, after, r.model.n_params * sizeof(float)) == 0,
                  "a step that failed before the optimizer changed the parameters");
    }
    /* The engine works again, and replicas agree with the root afterwards. */
    for (int i = 0; i < 2; i++) dp_assert_ok(dp_engine_step(r.e, &b, &st));
    cr_assert(isfinite(st.loss));
    dp_test_run_close(&r);
}

static void out_of_memory_case(int shard)
{
    enum { KK = 1024 };
    mlp_config mc = {D, H, KK, DP_DTYPE_F32};
    run r;
    dp_engine_config cfg = dp_test_base_cfg(DP_MODE_BALANCED);
    cfg.shard_optimizer = shard;
    dp_test_run_open(&r, 2, cfg, &mc);
    dp_device *d1 = dp_engine_device(r.e, 1);
    dp_memory_stats ms;
    dp_device_memory(d1, &ms);
    /* Room for about 6 rows of logits on device 1, beyond what it holds now. */
    dp_device_set_limit(d1, ms.in_use + 6 * KK * sizeof(float) + 64 * 1024);
    static float x[64 * D];
    int32_t y[64];
    dp_rng rng;
    dp_rng_seed(&rng, 5);
    dp_rng_fill_normal(&rng, x, 64 * D, 0, 1);
    for (int i = 0; i < 64; i++) y[i] = (int32_t)dp_rng_below(&rng, KK);
    dp_batch big = {64, x, y}, small = {8, x, y};
    dp_step_stats st;
    dp_status s = dp_engine_step(r.e, &big, &st);
    cr_assert_eq(s, DP_ERR_OUT_OF_MEMORY, "got %s", dp_strerror(s));
    cr_assert(strstr(dp_last_error(), "cpu:1") && strstr(dp_last_error(), "limit"),
              "message: %s", dp_last_error());
    dp_assert_ok(dp_engine_step(r.e, &small, &st));
    dp_assert_ok(dp_engine_step(r.e, &small, &st));
    cr_assert_eq(st.step, 2);
    dp_test_run_close(&r);
}

Test(engine, out_of_memory_on_one_device_is_recoverable) { out_of_memory_case(0); }
Test(engine, out_of_memory_on_one_device_is_recoverable_sharded) { out_of_memory_case(1); }

Test(engine, bad_input_is_rejected_with_a_message)
{
    run r;
    dp_test_run_open(&r, 2, dp_test_base_cfg(DP_MODE_BALANCED), NULL);
    float x[4 * D] = {0};
    int32_t y[4] = {0, 1, 2, 3};
    dp_batch empty = {0, x, y};
    dp_assert_ok(dp_engine_get_params(r.e, (float[NP_MAX]){0}));
    cr_assert_eq(dp_engine_step(r.e, &empty, NULL), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "empty batch"), "%s", dp_last_error());
    int32_t bad[4] = {0, 1, K, 2};
    dp_batch b = {4, x, bad};
    cr_assert_eq(dp_engine_step(r.e, &b, NULL), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "outside"), "%s", dp_last_error());
    int32_t none[4] = {-1, -1, -1, -1};
    b.targets = none;
    cr_assert_eq(dp_engine_step(r.e, &b, NULL), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "no valid target"), "%s", dp_last_error());
    b.targets = y;
    dp_assert_ok(dp_engine_step(r.e, &b, NULL));
    dp_test_run_close(&r);

    /* Bad configurations never start workers. */
    mlp net;
    dp_model model;
    mlp_config mc = {D, H, K, DP_DTYPE_F32};
    mlp_init_model(&net, &mc, &model);
    dp_criterion crit = dp_criterion_cross_entropy();
    dp_device_spec spec = {DP_DEVICE_CPU, 0};
    dp_engine *e = NULL;
    dp_engine_config c = dp_test_base_cfg(DP_MODE_BALANCED);
    c.optim.beta1 = 1.0f;
    cr_assert_eq(dp_engine_create(&spec, 1, &model, &crit, &c, &e), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "beta1"), "%s", dp_last_error());
    cr_assert_null(e);
    c = dp_test_base_cfg(DP_MODE_BALANCED);
    net.tensors[1].offset = 3; /* misaligned */
    cr_assert_eq(dp_engine_create(&spec, 1, &model, &crit, &c, &e), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "fc1.bias"), "%s", dp_last_error());
    cr_assert_eq(dp_engine_create(&spec, 0, &model, &crit, &c, &e), DP_ERR_INVALID_ARGUMENT);
}

Test(engine, params_and_optimizer_state_round_trip)
{
    run r;
    dp_test_run_open(&r, 2, dp_test_base_cfg(DP_MODE_BALANCED), NULL);
    float x[8 * D];
    int32_t y[8];
    dp_test_make_batch(0, 8, 0, x, y);
    dp_batch b = {8, x, y};
    dp_assert_ok(dp_engine_step(r.e, &b, NULL));
    size_t n = r.model.n_params;
    static float p[NP_MAX], m[NP_MAX], v[NP_MAX], p2[NP_MAX];
    long t = 0;
    dp_assert_ok(dp_engine_get_params(r.e, p));
    dp_assert_ok(dp_engine_get_optimizer_state(r.e, m, v, &t));
    cr_assert_eq(t, 1);
    dp_assert_ok(dp_engine_step(r.e, &b, NULL));
    dp_assert_ok(dp_engine_get_params(r.e, p2)); /* the reference second step */

    /* A second engine restored from the state takes the identical step. */
    run r2;
    dp_test_run_open(&r2, 3, dp_test_base_cfg(DP_MODE_BALANCED), NULL);
    dp_assert_ok(dp_engine_set_params(r2.e, p));
    dp_assert_ok(dp_engine_set_optimizer_state(r2.e, m, v, t));
    dp_assert_ok(dp_engine_step(r2.e, &b, NULL));
    static float q[NP_MAX];
    dp_assert_ok(dp_engine_get_params(r2.e, q));
    dp_assert_allclose(q, p2, n, 1e-6, 1e-5);
    dp_test_run_close(&r2);
    dp_test_run_close(&r);
}

// --- setters -------------------------------------------------------------------------------

Test(engine, setters_refuse_non_finite_and_negative_values, .timeout = 30)
{
    run r;
    dp_test_run_open(&r, 2, dp_test_base_cfg(DP_MODE_BALANCED), NULL);
    size_t n = r.model.n_params;
    static float p[NP_MAX], m[NP_MAX], v[NP_MAX], q[NP_MAX];
    float x[8 * D];
    int32_t y[8];
    dp_test_make_batch(0, 8, 0, x, y);
    dp_batch b = {8, x, y};
    dp_assert_ok(dp_engine_step(r.e, &b, NULL));
    dp_assert_ok(dp_engine_get_params(r.e, p));
    long t;
    dp_assert_ok(dp_engine_get_optimizer_state(r.e, m, v, &t));

    const float bad_lr[] = {NAN, INFINITY, -INFINITY, -1e-3f};
    for (size_t i = 0; i < sizeof bad_lr / sizeof *bad_lr; i++) {
        cr_assert_eq(dp_engine_set_lr(r.e, bad_lr[i]), DP_ERR_INVALID_ARGUMENT, "lr %g", bad_lr[i]);
        cr_assert(strstr(dp_last_error(), "learning rate"), "%s", dp_last_error());
    }
    cr_assert_eq(dp_engine_set_lr(NULL, 1e-3f), DP_ERR_INVALID_ARGUMENT);

    /* A refused setter changed nothing: lr 0 keeps the parameters, so a step
     * after the refusals would move them only if a bad lr had been kept. */
    dp_assert_ok(dp_engine_set_lr(r.e, 0.0f));
    static float bad[NP_MAX];
    memcpy(bad, p, n * sizeof(float));
    bad[5] = NAN;
    cr_assert_eq(dp_engine_set_params(r.e, bad), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "parameter 5"), "%s", dp_last_error());
    bad[5] = INFINITY;
    cr_assert_eq(dp_engine_set_params(r.e, bad), DP_ERR_INVALID_ARGUMENT);
    memcpy(bad, m, n * sizeof(float));
    bad[3] = -INFINITY;
    cr_assert_eq(dp_engine_set_optimizer_state(r.e, bad, v, t), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "first moment 3"), "%s", dp_last_error());
    memcpy(bad, v, n * sizeof(float));
    bad[7] = -1.0f;
    cr_assert_eq(dp_engine_set_optimizer_state(r.e, m, bad, t), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "second moment 7"), "%s", dp_last_error());
    /* A count the engine would wrap on, or a checkpoint could not hold. */
    cr_assert_eq(dp_engine_set_optimizer_state(r.e, m, v, LONG_MAX), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "2^62"), "%s", dp_last_error());
    cr_assert_eq(dp_engine_set_optimizer_state(r.e, m, v, DP_MAX_STEP + 1),
                 DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_engine_set_optimizer_state(r.e, m, v, -1), DP_ERR_INVALID_ARGUMENT);
    dp_assert_ok(dp_engine_get_params(r.e, q));
    cr_assert(memcmp(p, q, n * sizeof(float)) == 0, "a refused set_params changed the parameters");
    static float m2[NP_MAX], v2[NP_MAX];
    long t2;
    dp_assert_ok(dp_engine_get_optimizer_state(r.e, m2, v2, &t2));
    cr_assert(memcmp(m, m2, n * sizeof(float)) == 0 && memcmp(v, v2, n * sizeof(float)) == 0 &&
                  t == t2, "a refused set_optimizer_state changed the state");
    /* At DP_MAX_STEP a step is refused: it would make a count that no
     * checkpoint and no setter takes back. */
    dp_assert_ok(dp_engine_set_optimizer_state(r.e, m, v, DP_MAX_STEP));
    cr_assert_eq(dp_engine_step(r.e, &b, NULL), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "DP_MAX_STEP"), "%s", dp_last_error());
    dp_assert_ok(dp_engine_get_optimizer_state(r.e, m2, v2, &t2));
    cr_assert_eq(t2, DP_MAX_STEP);
    dp_assert_ok(dp_engine_get_params(r.e, q));
    cr_assert(memcmp(p, q, n * sizeof(float)) == 0, "a refused step changed the parameters");
    dp_assert_ok(dp_engine_set_optimizer_state(r.e, m, v, DP_MAX_STEP - 1));
    dp_assert_ok(dp_engine_step(r.e, &b, NULL));
    dp_assert_ok(dp_engine_get_optimizer_state(r.e, m2, v2, &t2));
    cr_assert_eq(t2, DP_MAX_STEP);
    dp_test_run_close(&r);
}

// --- devices ------------------------------------------------------------------------------

Test(engine, duplicate_cpu_devices_are_refused_like_the_device_list, .timeout = 30)
{
    mlp net;
    dp_model model;
    mlp_config mc = {D, H, K, DP_DTYPE_F32};
    mlp_init_model(&net, &mc, &model);
    dp_criterion crit = dp_criterion_cross_entropy();
    dp_engine_config c = dp_test_base_cfg(DP_MODE_BALANCED);
    dp_engine *e = NULL;
    /* The parser refuses "cpu:0,cpu:0"; the engine refuses the same list. */
    dp_device_spec parsed[4];
    size_t n = 0;
    cr_assert_eq(dp_device_list_parse("cpu:0,cpu:0", parsed, 4, &n), DP_ERR_INVALID_ARGUMENT);
    dp_device_spec dup[3] = {{DP_DEVICE_CPU, 0}, {DP_DEVICE_CPU, 1}, {DP_DEVICE_CPU, 0}};
    cr_assert_eq(dp_engine_create(dup, 3, &model, &crit, &c, &e), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "devices[0] and devices[2] are both cpu:0"), "%s",
              dp_last_error());
    cr_assert_null(e);
    /* Mixed kinds are refused before any CUDA device is opened. */
    dp_device_spec mixed[2] = {{DP_DEVICE_CPU, 0}, {DP_DEVICE_CUDA, 0}};
    cr_assert_eq(dp_engine_create(mixed, 2, &model, &crit, &c, &e), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "kinds"), "%s", dp_last_error());
    /* Distinct CPU devices are fine. */
    dp_device_spec ok[2] = {{DP_DEVICE_CPU, 3}, {DP_DEVICE_CPU, 1}};
    dp_assert_ok(dp_engine_create(ok, 2, &model, &crit, &c, &e));
    dp_engine_destroy(e);
}

// --- phase timing ---------------------------------------------------------------------------

/* Each device's phases: started in phase order, non-negative, inside the step. */
static void check_phase_times(const dp_step_stats *st, int train)
{
    const double slack = 1e-6; /* float rounding of the clock's differences */
    cr_assert(st->n_exchange_spans == 0 && !st->exchange_spans,
              "one process exchanges nothing between ranks");
    for (size_t i = 0; i < st->n_devices; i++) {
        const dp_device_step_stats *d = &st->devices[i];
        double prev = 0.0;
        for (int p = 0; p < DP_PHASE_COUNT; p++) {
            int ran = train || p <= DP_PHASE_CRITERION;
            cr_assert_geq(d->phase_seconds[p], 0.0);
            cr_assert_geq(d->phase_start[p], 0.0);
            if (!ran) {
                cr_assert(d->phase_start[p] == 0.0 && d->phase_seconds[p] == 0.0,
                          "device %zu: %s did not run but has start %g, seconds %g", i,
                          dp_phase_name((dp_phase)p), d->phase_start[p], d->phase_seconds[p]);
                continue;
            }
            cr_assert_geq(d->phase_start[p], prev, "device %zu: %s starts at %g, before the "
                          "previous phase (%g)", i, dp_phase_name((dp_phase)p), d->phase_start[p],
                          prev);
            cr_assert_leq(d->phase_start[p] + d->phase_seconds[p], st->seconds + slack,
                          "device %zu: %s ends after the step", i, dp_phase_name((dp_phase)p));
            cr_assert_leq(d->phase_seconds[p], st->phase_seconds[p],
                          "the step's phase time is the longest device's");
            prev = d->phase_start[p];
        }
        /* Filled, not left zero: the last phase the device ran starts after
         * its scatter (a forward and barriers lie between them). */
        dp_phase last = train ? DP_PHASE_BROADCAST : DP_PHASE_CRITERION;
        cr_assert_gt(d->phase_start[last], d->phase_start[DP_PHASE_SCATTER],
                     "device %zu: %s does not start after the scatter", i,
                     dp_phase_name(last));
        double sum = 0.0;
        for (int p = 0; p < DP_PHASE_COUNT; p++) sum += d->phase_seconds[p];
        cr_assert_gt(sum, 0.0, "device %zu spent no time in any phase", i);
        /* The spans: in time order, none overlapping the one before, inside
         * the step; per phase they add up to its seconds, and its first one
         * starts as the phase was first entered (the mark is recorded just
         * after the switch: a preempted thread may read the clock later). */
        cr_assert_gt(d->n_spans, 0, "device %zu has no spans", i);
        cr_assert_not_null(d->spans);
        double span_sum[DP_PHASE_COUNT] = {0}, first[DP_PHASE_COUNT], end = 0.0;
        for (int p = 0; p < DP_PHASE_COUNT; p++) first[p] = -1.0;
        for (size_t j = 0; j < d->n_spans; j++) {
            const dp_phase_span *sp = &d->spans[j];
            cr_assert_lt((unsigned)sp->phase, DP_PHASE_COUNT);
            cr_assert_geq(sp->seconds, 0.0);
            cr_assert_geq(sp->start, end - slack, "device %zu span %zu (%s) starts at %g, before "
                          "the one before ends (%g)", i, j, dp_phase_name(sp->phase), sp->start,
                          end);
            end = sp->start + sp->seconds;
            cr_assert_leq(end, st->seconds + slack, "device %zu span %zu ends after the step",
                          i, j);
            span_sum[sp->phase] += sp->seconds;
            if (first[sp->phase] < 0.0) first[sp->phase] = sp->start;
        }
        for (int p = 0; p < DP_PHASE_COUNT; p++) {
            cr_assert_float_eq(span_sum[p], d->phase_seconds[p], 1e-9, "device %zu %s: spans "
                               "sum to %g s, the phase to %g s", i, dp_phase_name((dp_phase)p),
                               span_sum[p], d->phase_seconds[p]);
            if (d->phase_seconds[p] == 0.0) continue;
            cr_assert(first[p] >= d->phase_start[p] - slack && first[p] < d->phase_start[p] + 0.1,
                      "device %zu %s: first span at %g s, first entered at %g s", i,
                      dp_phase_name((dp_phase)p), first[p], d->phase_start[p]);
        }
        cr_assert_leq(sum, st->seconds + slack, "device %zu: phases sum to %g s in a %g s step",
                      i, sum, st->seconds);
    }
}

Test(engine, per_device_phase_times_are_filled_and_consistent, .timeout = 30)
{
    for (int m = 0; m < 2; m++) {
        dp_engine_config c = dp_test_base_cfg((dp_mode)m);
        c.max_rows_per_micro = 2; /* phases repeat per micro-batch */
        run r;
        dp_test_run_open(&r, 3, c, NULL);
        float x[7 * D];
        int32_t y[7];
        dp_test_make_batch(0, 7, 0, x, y);
        dp_batch b = {7, x, y}, tiny = {2, x, y}; /* tiny leaves cpu:2 idle */
        dp_step_stats st, prev;
        memset(&prev, 0, sizeof prev);
        for (int s = 0; s < 4; s++) {
            dp_batch *bb = s == 2 ? &tiny : &b;
            dp_assert_ok(s == 3 ? dp_engine_evaluate(r.e, bb, &st) : dp_engine_step(r.e, bb, &st));
            check_phase_times(&st, s != 3);
            /* Steps start in order, each after the previous one ended. */
            cr_assert_geq(st.start_seconds, prev.start_seconds + prev.seconds - 1e-6,
                          "step %d starts at %g, before the previous one ended (%g + %g)", s,
                          st.start_seconds, prev.start_seconds, prev.seconds);
            cr_assert_gt(st.start_seconds, prev.start_seconds, "start_seconds not filled");
            prev = st;
        }
        dp_test_run_close(&r);
    }
}

// --- the thread contract ----------------------------------------------------------------------

typedef struct stepper {
    dp_engine *e;
    const dp_batch *b;
    int n;
    int ok, busy, other;
    dp_status first_other;
} stepper;

static void *step_thread(void *arg)
{
    stepper *s = arg;
    for (int i = 0; i < s->n; i++) {
        dp_status rc = dp_engine_step(s->e, s->b, NULL);
        if (rc == DP_OK) s->ok++;
        else if (rc == DP_ERR_BUSY) s->busy++;
        else if (!s->other++) s->first_other = rc;
    }
    return NULL;
}

/* A call made while a step is held inside the model's forward returns
 * DP_ERR_BUSY at once (the test would time out if it waited), and does
 * nothing; the held step then completes. */
Test(engine, a_concurrent_call_returns_busy_at_once, .timeout = 30)
{
    hooked h;
    dp_engine *e = dp_test_hooked_open(&h, 2, dp_test_base_cfg(DP_MODE_BALANCED));
    float x[6 * D];
    int32_t y[6];
    dp_test_make_batch(0, 6, 0, x, y);
    dp_batch b = {6, x, y};
    static float before[NP_MAX];
    dp_assert_ok(dp_engine_get_params(e, before));
    h.block = 1;
    stepper s = {e, &b, 1, 0, 0, 0, DP_OK};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, step_thread, &s), 0);
    pthread_mutex_lock(&h.mu);
    while (!h.entered) pthread_cond_wait(&h.cv, &h.mu);
    pthread_mutex_unlock(&h.mu);

    /* The step is in progress on the other thread. */
    static float buf[NP_MAX], m[NP_MAX], v[NP_MAX];
    long t;
    cr_assert_eq(dp_engine_step(e, &b, NULL), DP_ERR_BUSY);
    cr_assert(strstr(dp_last_error(), "another call on this engine"), "%s", dp_last_error());
    cr_assert_eq(dp_engine_evaluate(e, &b, NULL), DP_ERR_BUSY);
    cr_assert_eq(dp_engine_set_lr(e, 0.5f), DP_ERR_BUSY);
    cr_assert_eq(dp_engine_get_params(e, buf), DP_ERR_BUSY);
    cr_assert_eq(dp_engine_set_params(e, before), DP_ERR_BUSY);
    cr_assert_eq(dp_engine_get_optimizer_state(e, m, v, &t), DP_ERR_BUSY);
    cr_assert_eq(dp_engine_set_optimizer_state(e, m, v, 0), DP_ERR_BUSY);
    size_t rows[2];
    dp_assert_ok(dp_engine_plan(e, 6, NULL, rows)); /* read-only: always allowed */

    pthread_mutex_lock(&h.mu);
    h.released = 1;
    pthread_cond_broadcast(&h.cv);
    pthread_mutex_unlock(&h.mu);
    pthread_join(th, NULL);
    cr_assert_eq(s.ok, 1, "the held step failed: %s", dp_strerror(s.first_other));
    dp_assert_ok(dp_engine_get_optimizer_state(e, m, v, &t));
    cr_assert_eq(t, 1, "a refused call took a step (t = %ld)", t);
    dp_test_hooked_close(&h, e);
}

/* Two threads hammer dp_engine_step on one engine: every call returns DP_OK
 * or DP_ERR_BUSY, none hangs, and the engine ends exactly where the same
 * number of sequential steps on that batch ends. */
Test(engine, two_threads_hammering_step_get_ok_or_busy, .timeout = 60)
{
    for (int m = 0; m < 2; m++) {
        run r;
        dp_test_run_open(&r, 3, dp_test_base_cfg((dp_mode)m), NULL);
        float x[7 * D];
        int32_t y[7];
        dp_test_make_batch(0, 7, 0, x, y);
        dp_batch b = {7, x, y};
        stepper s[2] = {{r.e, &b, 150, 0, 0, 0, DP_OK}, {r.e, &b, 150, 0, 0, 0, DP_OK}};
        pthread_t th[2];
        for (int i = 0; i < 2; i++) cr_assert_eq(pthread_create(&th[i], NULL, step_thread, &s[i]), 0);
        for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
        for (int i = 0; i < 2; i++)
            cr_assert_eq(s[i].other, 0, "thread %d got %s", i, dp_strerror(s[i].first_other));
        int ok = s[0].ok + s[1].ok;
        cr_assert_eq(s[0].ok + s[0].busy + s[1].ok + s[1].busy, 300);
        long t;
        static float mm[NP_MAX], vv[NP_MAX], p[NP_MAX], q[NP_MAX];
        dp_assert_ok(dp_engine_get_optimizer_state(r.e, mm, vv, &t));
        cr_assert_eq(t, ok, "%d steps succeeded but the engine counted %ld", ok, t);
        dp_assert_ok(dp_engine_get_params(r.e, p));

        /* The same number of steps from one thread gives the same parameters. */
        run ref;
        dp_test_run_open(&ref, 3, dp_test_base_cfg((dp_mode)m), NULL);
        for (int i = 0; i < ok; i++) dp_assert_ok(dp_engine_step(ref.e, &b, NULL));
        dp_assert_ok(dp_engine_get_params(ref.e, q));
        cr_assert(memcmp(p, q, r.model.n_params * sizeof(float)) == 0,
                  "%s: %d concurrent steps differ from %d sequential ones",
                  dp_mode_name((dp_mode)m), ok, ok);
        /* And it still trains. */
        dp_step_stats st;
        dp_assert_ok(dp_engine_step(r.e, &b, &st));
        cr_assert(isfinite(st.loss) && !st.skipped);
        dp_test_run_close(&ref);
        dp_test_run_close(&r);
    }
}
