/* Dropout with a counter-based mask: the mask is a pure function of
 * (seed, step, global row, column), so one device, two devices and
 * micro-batches drop the same elements; kept elements scale by 1/(1 - p);
 * the drop rate is p; the backward applies the forward's mask; p = 0 and
 * p = 1; bad arguments. And through the engine: an MLP with dropout
 * trains to the same parameters on 1 and 3 devices, in both modes. */
#include "engine_fixture.h"
#include "nn_test_util.h"

#include <criterion/parameterized.h>

enum { ROWS = 48, COLS = 37 };

/* out = dropout(x) over rows [row0, row0 + rows) of a (ROWS, COLS) host
 * matrix, on device dev; returned as a host copy of those rows. */
static float *drop_rows(dp_device *dev, const float *x, float p, uint64_t seed, uint64_t step,
                        size_t row0, size_t rows)
{
    size_t n = rows * COLS;
    float *d_x = dp_test_upload(dev, x + row0 * COLS, n), *d_out = dp_test_nn_filled(dev, n, NAN);
    dp_assert_ok(dp_dropout_forward(dev, d_out, d_x, p, seed, step, row0, rows, COLS));
    float *out = dp_test_nn_download(dev, d_out, n);
    dp_device_free(dev, d_x);
    dp_device_free(dev, d_out);
    return out;
}

static void ones(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = 1.0f;
}

/* One device over all rows, against two devices (rows 0..16 on cpu:0,
 * 17..47 on cpu:1) and against micro-batches of 5 rows: the same bits. */
Test(dropout, mask_does_not_depend_on_the_split)
{
    float x[ROWS * COLS];
    dp_rng rng;
    dp_rng_seed(&rng, 5);
    dp_rng_fill_normal(&rng, x, ROWS * COLS, 0.0f, 1.0f);
    dp_device *d0 = dp_test_cpu(0), *d1 = dp_test_cpu(1);
    float *whole = drop_rows(d0, x, 0.4f, 11, 3, 0, ROWS);
    float *a = drop_rows(d0, x, 0.4f, 11, 3, 0, 17), *b = drop_rows(d1, x, 0.4f, 11, 3, 17, 31);
    cr_assert(memcmp(whole, a, 17 * COLS * sizeof(float)) == 0, "device 0's rows differ");
    cr_assert(memcmp(whole + 17 * COLS, b, 31 * COLS * sizeof(float)) == 0,
              "device 1's rows differ from the same global rows on one device");
    for (size_t r0 = 0; r0 < ROWS; r0 += 5) {
        size_t rows = ROWS - r0 < 5 ? ROWS - r0 : 5;
        float *m = drop_rows(d1, x, 0.4f, 11, 3, r0, rows);
        cr_assert(memcmp(whole + r0 * COLS, m, rows * COLS * sizeof(float)) == 0,
                  "micro-batch at row %zu differs", r0);
        free(m);
    }
    free(whole), free(a), free(b);
    dp_test_nn_assert_all_freed(d0);
    dp_test_nn_assert_all_freed(d1);
    dp_device_close(d0);
    dp_device_close(d1);
}

/* Kept elements are x / (1 - p) exactly, dropped ones 0; over 48 x 37 x
 * 50 draws the drop rate is p within 5 standard deviations; a new step,
 * a new seed or another row gives another mask. */
Test(dropout, rate_scale_and_fresh_masks)
{
    float x[ROWS * COLS];
    ones(x, ROWS * COLS);
    dp_device *dev = dp_test_cpu(0);
    const float p = 0.3f, scale = 1.0f / (1.0f - p);
    size_t dropped = 0, total = 0;
    float *first = drop_rows(dev, x, p, 7, 0, 0, ROWS);
    for (uint64_t step = 0; step < 50; step++) {
        float *out = drop_rows(dev, x, p, 7, step, 0, ROWS);
        for (size_t i = 0; i < ROWS * COLS; i++) {
            cr_assert(out[i] == 0.0f || out[i] == scale, "element %zu is %g", i, out[i]);
            dropped += out[i] == 0.0f;
        }
        total += ROWS * COLS;
        if (step > 0)
            cr_assert(memcmp(out, first, sizeof x) != 0, "step %d repeats step 0's mask",
                      (int)step);
        free(out);
    }
    double rate = (double)dropped / (double)total, sd = sqrt(p * (1 - p) / (double)total);
    cr_assert(fabs(rate - p) < 5 * sd, "drop rate %.4f, want %.2f +- %.4f", rate, p, 5 * sd);
    float *other_seed = drop_rows(dev, x, p, 8, 0, 0, ROWS);
    cr_assert(memcmp(other_seed, first, sizeof x) != 0, "another seed gives the same mask");
    cr_assert(memcmp(first, first + COLS, COLS * sizeof(float)) != 0, "rows 0 and 1 share a mask");
    free(other_seed), free(first);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

/* The backward applies the forward's mask and scale to dout (dinp
 * overwritten, and in place over dout): dropout is linear, so this is its
 * exact gradient. p = 0 copies; p = 1 zeroes. */
Test(dropout, backward_uses_the_forward_mask)
{
    float x[ROWS * COLS], g[ROWS * COLS];
    ones(x, ROWS * COLS);
    dp_rng rng;
    dp_rng_seed(&rng, 6);
    dp_rng_fill_normal(&rng, g, ROWS * COLS, 0.0f, 1.0f);
    dp_device *dev = dp_test_cpu(0);
    const float p = 0.5f;
    size_t n = ROWS * COLS;
    /* the block is rows 100.. of a larger batch */
    float *d_g = dp_test_upload(dev, g, n), *d_dinp = dp_test_nn_filled(dev, n, NAN);
    float *d_one = dp_test_upload(dev, x, n), *d_m = dp_test_nn_filled(dev, n, NAN);
    dp_assert_ok(dp_dropout_forward(dev, d_m, d_one, p, 3, 9, 100, ROWS, COLS));
    dp_assert_ok(dp_dropout_backward(dev, d_dinp, d_g, p, 3, 9, 100, ROWS, COLS));
    float *m = dp_test_nn_download(dev, d_m, n), *dinp = dp_test_nn_download(dev, d_dinp, n);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(dinp[i], m[i] == 0.0f ? 0.0f : g[i] * 2.0f, "element %zu: %g (mask %g)", i,
                     dinp[i], m[i]);
    dp_assert_ok(dp_dropout_backward(dev, d_g, d_g, p, 3, 9, 100, ROWS, COLS));
    float *inplace = dp_test_nn_download(dev, d_g, n);
    cr_assert(memcmp(inplace, dinp, n * sizeof(float)) == 0, "in place differs");
    /* p = 0: a copy; p = 1: zeros */
    dp_assert_ok(dp_dropout_forward(dev, d_m, d_dinp, 0.0f, 3, 9, 0, ROWS, COLS));
    float *copy = dp_test_nn_download(dev, d_m, n);
    cr_assert(memcmp(copy, dinp, n * sizeof(float)) == 0, "p = 0 must copy");
    dp_assert_ok(dp_dropout_forward(dev, d_m, d_dinp, 1.0f, 3, 9, 0, ROWS, COLS));
    float *zero = dp_test_nn_download(dev, d_m, n);
    for (size_t i = 0; i < n; i++) cr_assert(zero[i] == 0.0f && !signbit(zero[i]), "p = 1: %g", zero[i]);
    free(m), free(dinp), free(inplace), free(copy), free(zero);
    dp_device_free(dev, d_g), dp_device_free(dev, d_dinp), dp_device_free(dev, d_one);
    dp_device_free(dev, d_m);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

Test(dropout, bad_arguments)
{
    dp_device *dev = dp_test_cpu(0);
    float *f = dp_test_nn_filled(dev, 8, 0.0f);
    dp_test_nn_assert_invalid(dp_dropout_forward(NULL, f, f, 0.1f, 0, 0, 0, 2, 4), "dev", NULL);
    dp_test_nn_assert_invalid(dp_dropout_forward(dev, NULL, f, 0.1f, 0, 0, 0, 2, 4), "out",
                              "dp_dropout_forward");
    dp_test_nn_assert_invalid(dp_dropout_backward(dev, f, NULL, 0.1f, 0, 0, 0, 2, 4), "dout",
                              "dp_dropout_backward");
    dp_test_nn_assert_invalid(dp_dropout_forward(dev, f, f, -0.1f, 0, 0, 0, 2, 4), "p = -0.1",
                              "[0, 1]");
    dp_test_nn_assert_invalid(dp_dropout_forward(dev, f, f, 1.5f, 0, 0, 0, 2, 4), "p = 1.5", NULL);
    dp_test_nn_assert_invalid(dp_dropout_forward(dev, f, f, NAN, 0, 0, 0, 2, 4), "p = nan", NULL);
    dp_test_nn_assert_invalid(dp_dropout_forward(dev, f, f, 0.1f, 0, 0, 0, 0, 4), "must both be > 0",
                              NULL);
    dp_test_nn_assert_invalid(dp_dropout_forward(dev, f, f, 0.1f, 0, 0, SIZE_MAX, 2, 4),
                              "overflows", NULL);
    dp_device_free(dev, f);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

// --- through the engine: k devices drop as 1 device ---------------------------------------

/* Case: mode * 10 + micro (0: none, 1: 4 rows per micro-batch). */
ParameterizedTestParameters(dropout, engine_k_devices_train_as_one)
{
    static int cases[] = {0, 1, 10, 11};
    return cr_make_param_array(int, cases, 4);
}

/* Three steps of a ReLU MLP with dropout 0.5 on 1 and on 3 devices from
 * the same start: the parameters agree to float rounding (a mask that
 * depended on the local row would differ by whole dropped units). */
ParameterizedTest(int *c, dropout, engine_k_devices_train_as_one)
{
    float p[2][512], p0[512];
    size_t np = 0;
    for (int t = 0; t < 2; t++) {
        run r;
        mlp_config mc = {D, H, K, DP_DTYPE_F32};
        r.leaked_before = dp_device_bytes_freed_at_close();
        mlp_init_model(&r.net, &mc, &r.model);
        r.net.activation = MLP_RELU;
        r.net.dropout = 0.5f;
        r.crit = dp_criterion_cross_entropy();
        dp_engine_config cfg = dp_test_base_cfg(*c / 10 ? DP_MODE_GATHER : DP_MODE_BALANCED);
        cfg.optim.kind = DP_OPTIMIZER_SGD; /* no AdamW sign flips: rounding stays rounding */
        cfg.optim.momentum = 0.9f;
        cfg.max_rows_per_micro = *c % 10 ? 4 : 0;
        int k = t ? 3 : 1;
        dp_device_spec specs[3] = {{DP_DEVICE_CPU, 0}, {DP_DEVICE_CPU, 1}, {DP_DEVICE_CPU, 2}};
        dp_assert_ok(dp_engine_create(specs, (size_t)k, &r.model, &r.crit, &cfg, &r.e));
        np = r.model.n_params;
        cr_assert(np <= 512);
        if (t == 0) dp_assert_ok(dp_engine_get_params(r.e, p0));
        for (int s = 0; s < STEPS; s++) {
            float x[23 * D];
            int32_t y[23];
            dp_test_make_batch(s, 23, 6, x, y);
            dp_batch b = {23, x, y};
            dp_assert_ok(dp_engine_step(r.e, &b, NULL));
        }
        dp_assert_ok(dp_engine_get_params(r.e, p[t]));
        dp_test_run_close(&r);
    }
    size_t n = 0;
    double diff = 0.0, moved = 0.0;
    for (size_t i = 0; i < np; i++) n += p0[i] != p[0][i];
    cr_assert(n > 0, "training did not move the parameters");
    dp_test_param_drift(p[0], p[1], p0, np, &diff, &moved);
    cr_assert(diff < 1e-5 * moved, "1 vs 3 devices: sum |diff| %.3g vs sum |moved| %.3g", diff,
              moved);
}
