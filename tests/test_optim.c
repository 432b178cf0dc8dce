/*
 * Optimizer updates (AdamW, SGD with momentum), global-norm clipping, the
 * element-wise helpers behind it (dp_scale, dp_sum_squares) and the LR
 * schedule, each against a float64 re-implementation of the documented
 * formula written out here.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dp_test.h"

// --- helpers -------------------------------------------------------------------

static float *download(dp_device *dev, const float *d, size_t n)
{
    float *h = malloc(n * sizeof *h);
    cr_assert_not_null(h);
    dp_assert_ok(dp_copy_d2h(dev, h, d, n * sizeof *h));
    return h;
}

static double *to_double(const float *x, size_t n)
{
    double *d = malloc(n * sizeof *d);
    cr_assert_not_null(d);
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

static void assert_no_leak(dp_device *dev)
{
    dp_memory_stats st;
    dp_device_memory(dev, &st);
    cr_assert_eq(st.in_use, 0, "%zu bytes still allocated on %s", st.in_use, dp_device_name(dev));
    cr_assert_eq(st.n_allocs, 0);
}

/* The failed call's message must name the device and mention `what`. */
static void assert_error(dp_status got, dp_status want, const char *what)
{
    cr_assert_eq(got, want, "expected %s, got %s (%s)", dp_strerror(want), dp_strerror(got),
                 dp_last_error());
    cr_assert(strstr(dp_last_error(), what), "message \"%s\" does not mention \"%s\"",
              dp_last_error(), what);
}

/* float64 AdamW exactly as documented in dp/optim.h. */
static void adamw_ref(double *p, const double *g, double *m, double *v, size_t n, double lr,
                      double b1, double b2, double eps, double wd, int t)
{
    for (size_t i = 0; i < n; i++) {
        m[i] = b1 * m[i] + (1 - b1) * g[i];
        v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
        double mhat = m[i] / (1 - pow(b1, t));
        double vhat = v[i] / (1 - pow(b2, t));
        p[i] = p[i] - lr * (mhat / (sqrt(vhat) + eps) + wd * p[i]);
    }
}

/* float64 SGD as torch.optim.SGD (dampening 0, not Nesterov). */
static void sgd_ref(double *p, const double *g, double *buf, size_t n, double lr, double mom,
                    double wd, int t)
{
    for (size_t i = 0; i < n; i++) {
        double gi = g[i] + wd * p[i];
        if (mom != 0.0) {
            buf[i] = t == 1 ? gi : mom * buf[i] + gi;
            gi = buf[i];
        }
        p[i] -= lr * gi;
    }
}

// --- AdamW ---------------------------------------------------------------------

/* Two AdamW steps on n random parameters; returns nothing, asserts inside. */
static void check_adamw_two_steps(float wd)
{
    enum { N = 1000 };
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f;
    dp_rng rng;
    dp_rng_seed(&rng, 1234);
    float p[N], g1[N], g2[N], zeros[N] = {0};
    dp_rng_fill_normal(&rng, p, N, 0.0f, 1.0f);
    dp_rng_fill_normal(&rng, g1, N, 0.0f, 0.5f);
    dp_rng_fill_normal(&rng, g2, N, 0.0f, 0.5f);

    /* Reference in double, from the same float inputs. */
    double rp[N], rm[N] = {0}, rv[N] = {0}, rg1[N], rg2[N];
    for (size_t i = 0; i < N; i++) {
        rp[i] = p[i];
        rg1[i] = g1[i];
        rg2[i] = g2[i];
    }
    adamw_ref(rp, rg1, rm, rv, N, lr, b1, b2, eps, wd, 1);
    adamw_ref(rp, rg2, rm, rv, N, lr, b1, b2, eps, wd, 2);

    dp_device *dev = dp_test_cpu(0);
    float *dparams = dp_test_upload(dev, p, N), *dg1 = dp_test_upload(dev, g1, N);
    float *dg2 = dp_test_upload(dev, g2, N), *dm = dp_test_upload(dev, zeros, N);
    float *dv = dp_test_upload(dev, zeros, N);
    dp_assert_ok(dp_adamw_update(dev, dparams, dg1, dm, dv, N, lr, b1, b2, eps, wd, 1));
    dp_assert_ok(dp_adamw_update(dev, dparams, dg2, dm, dv, N, lr, b1, b2, eps, wd, 2));
    float *hp = download(dev, dparams, N), *hm = download(dev, dm, N), *hv = download(dev, dv, N);
    double *dhp = to_double(hp, N), *dhm = to_double(hm, N), *dhv = to_double(hv, N);

    /* Each value goes through a handful of float32 operations (relative
     * rounding ~6e-8 each), and the parameters are O(1) while each step
     * moves them by ~lr = 1e-2: rtol 1e-5 with atol 1e-6 allows ~100 ulps,
     * far below lr * wd * p = 1e-3 * p (the decay term) or lr itself.
     * v is O(1e-2 * g^2): atol 1e-10 keeps its relative check meaningful. */
    dp_assert_allclose(dhp, (const double *)rp, N, 1e-6, 1e-5);
    dp_assert_allclose(dhm, (const double *)rm, N, 1e-7, 1e-5);
    dp_assert_allclose(dhv, (const double *)rv, N, 1e-10, 1e-5);

    free(hp), free(hm), free(hv), free(dhp), free(dhm), free(dhv);
    dp_device_free(dev, dparams), dp_device_free(dev, dg1), dp_device_free(dev, dg2);
    dp_device_free(dev, dm), dp_device_free(dev, dv);
    assert_no_leak(dev);
    dp_device_close(dev);
}

Test(adamw, two_steps_without_weight_decay) { check_adamw_two_steps(0.0f); }

Test(adamw, two_steps_with_weight_decay) { check_adamw_two_steps(0.1f); }

/* Decoupled weight decay: with g = 0 the moments stay 0 and the Adam term
 * is 0 / (0 + eps) = 0, so each step is exactly p *= (1 - lr wd). Coupled
 * L2 (g += wd p) would instead move every p by about lr * sign(p). */
Test(adamw, weight_decay_is_decoupled)
{
    enum { N = 4 };
    const float lr = 0.1f, wd = 0.05f;
    float p[N] = {1.0f, -2.0f, 0.5f, 3.0f}, zeros[N] = {0};
    dp_device *dev = dp_test_cpu(1);
    float *dparams = dp_test_upload(dev, p, N), *dg = dp_test_upload(dev, zeros, N);
    float *dm = dp_test_upload(dev, zeros, N), *dv = dp_test_upload(dev, zeros, N);
    for (int t = 1; t <= 2; t++)
        dp_assert_ok(dp_adamw_update(dev, dparams, dg, dm, dv, N, lr, 0.9f, 0.999f, 1e-8f, wd, t));
    float *hp = download(dev, dparams, N), *hm = download(dev, dm, N), *hv = download(dev, dv, N);
    double got[N], want[N];
    for (int i = 0; i < N; i++) {
        got[i] = hp[i];
        want[i] = p[i] * (1.0 - (double)lr * wd) * (1.0 - (double)lr * wd);
        cr_assert_eq(hm[i], 0.0f, "m[%d] = %g, want 0", i, hm[i]);
        cr_assert_eq(hv[i], 0.0f, "v[%d] = %g, want 0", i, hv[i]);
    }
    /* Two float32 multiply-subtracts per step: a few ulps of |p| <= 3. */
    dp_assert_allclose(got, (const double *)want, N, 1e-7, 1e-6);
    free(hp), free(hm), free(hv);
    dp_device_close(dev); /* frees the four buffers */
}

/* Step counts are long, as the engine's and the checkpoints' are: past
 * INT_MAX the bias corrections are exactly 1 (beta^t underflows), so the
 * first update from zero moments is p - lr ((1-b1) g / (sqrt((1-b2) g^2)
 * + eps) + wd p). An int would have wrapped 3000000001 to a negative step
 * and refused it. */
Test(adamw, step_counts_past_int_max)
{
    enum { N = 3 };
    const float lr = 0.01f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    float p[N] = {0.5f, -1.0f, 2.0f}, g[N] = {0.25f, -3.0f, 1e-3f}, zeros[N] = {0};
    dp_device *dev = dp_test_cpu(1);
    float *dparams = dp_test_upload(dev, p, N), *dg = dp_test_upload(dev, g, N);
    float *dm = dp_test_upload(dev, zeros, N), *dv = dp_test_upload(dev, zeros, N);
    dp_assert_ok(dp_adamw_update(dev, dparams, dg, dm, dv, N, lr, b1, b2, eps, wd, 3000000001L));
    float *hp = download(dev, dparams, N);
    double got[N], want[N];
    for (int i = 0; i < N; i++) {
        double m = (1.0 - b1) * g[i], v = (1.0 - b2) * (double)g[i] * g[i];
        want[i] = p[i] - lr * (m / (sqrt(v) + eps) + wd * p[i]);
        got[i] = hp[i];
    }
    dp_assert_allclose(got, (const double *)want, N, 1e-6, 1e-5);
    assert_error(dp_adamw_update(dev, dparams, dg, dm, dv, N, lr, b1, b2, eps, wd, -3000000001L),
                 DP_ERR_INVALID_ARGUMENT, "t = -3000000001");
    free(hp);
    dp_device_close(dev);
}

/* Callers update one range of a flat buffer at a time: nothing outside the
 * range may change. */
Test(adamw, updates_only_the_given_range)
{
    enum { N = 16, OFF = 5, LEN = 7 };
    float p[N], g[N], zeros[N] = {0};
    for (int i = 0; i < N; i++) {
        p[i] = 0.25f * (float)i - 1.0f;
        g[i] = 0.5f;
    }
    dp_device *dev = dp_test_cpu(0);
    float *dparams = dp_test_upload(dev, p, N), *dg = dp_test_upload(dev, g, N);
    float *dm = dp_test_upload(dev, zeros, N), *dv = dp_test_upload(dev, zeros, N);
    dp_assert_ok(dp_adamw_update(dev, dparams + OFF, dg + OFF, dm + OFF, dv + OFF, LEN, 1e-3f, 0.9f,
                                 0.999f, 1e-8f, 0.0f, 1));
    float *hp = download(dev, dparams, N), *hm = download(dev, dm, N);
    for (int i = 0; i < N; i++) {
        int inside = i >= OFF && i < OFF + LEN;
        if (inside) {
            /* Step 1 with constant g: mhat/sqrt(vhat) = 1, so p moves by lr. */
            cr_assert_float_eq(hp[i], p[i] - 1e-3f, 1e-6f, "p[%d] = %g", i, hp[i]);
        } else {
            cr_assert_eq(hp[i], p[i], "p[%d] outside the range changed", i);
            cr_assert_eq(hm[i], 0.0f, "m[%d] outside the range changed", i);
        }
    }
    free(hp), free(hm);
    dp_device_close(dev);
}

Test(adamw, bad_arguments)
{
    dp_device *dev = dp_test_cpu(2);
    float *p = dp_test_upload(dev, (float[]){1, 2}, 2), *g = dp_test_upload(dev, (float[]){1, 1}, 2);
    float *m = dp_test_upload(dev, (float[]){0, 0}, 2), *v = dp_test_upload(dev, (float[]){0, 0}, 2);
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    assert_error(dp_adamw_update(NULL, p, g, m, v, 2, lr, b1, b2, eps, 0, 1),
                 DP_ERR_INVALID_ARGUMENT, "dev");
    assert_error(dp_adamw_update(dev, p, g, m, v, 2, lr, b1, b2, eps, 0, 0),
                 DP_ERR_INVALID_ARGUMENT, "t = 0");
    assert_error(dp_adamw_update(dev, p, g, m, v, 2, lr, b1, b2, eps, 0, -3),
                 DP_ERR_INVALID_ARGUMENT, "cpu:2");
    assert_error(dp_adamw_update(dev, NULL, g, m, v, 2, lr, b1, b2, eps, 0, 1),
                 DP_ERR_INVALID_ARGUMENT, "params");
    assert_error(dp_adamw_update(dev, p, NULL, m, v, 2, lr, b1, b2, eps, 0, 1),
                 DP_ERR_INVALID_ARGUMENT, "grads");
    assert_error(dp_adamw_update(dev, p, g, NULL, v, 2, lr, b1, b2, eps, 0, 1),
                 DP_ERR_INVALID_ARGUMENT, "moments");
    assert_error(dp_adamw_update(dev, p, g, m, NULL, 2, lr, b1, b2, eps, 0, 1),
                 DP_ERR_INVALID_ARGUMENT, "moments");
    assert_error(dp_adamw_update(dev, p, g, m, v, 0, lr, b1, b2, eps, 0, 1),
                 DP_ERR_INVALID_ARGUMENT, "n must be > 0");
    /* beta = 1 would divide by 1 - 1^t = 0. */
    assert_error(dp_adamw_update(dev, p, g, m, v, 2, lr, 1.0f, b2, eps, 0, 1),
                 DP_ERR_INVALID_ARGUMENT, "betas");
    assert_error(dp_adamw_update(dev, p, g, m, v, 2, lr, b1, -0.1f, eps, 0, 1),
                 DP_ERR_INVALID_ARGUMENT, "betas");
    assert_error(dp_adamw_update(dev, p, g, m, v, 2, NAN, b1, b2, eps, 0, 1),
                 DP_ERR_INVALID_ARGUMENT, "lr");
    assert_error(dp_adamw_update(dev, p, g, m, v, 2, -1e-3f, b1, b2, eps, 0, 1),
                 DP_ERR_INVALID_ARGUMENT, "lr");
    assert_error(dp_adamw_update(dev, p, g, m, v, 2, lr, b1, b2, -1.0f, 0, 1),
                 DP_ERR_INVALID_ARGUMENT, "eps");
    assert_error(dp_adamw_update(dev, p, g, m, v, 2, lr, b1, b2, eps, -0.1f, 1),
                 DP_ERR_INVALID_ARGUMENT, "weight_decay");
    /* None of the failed calls touched the buffers. */
    float hp[2], hm[2];
    dp_assert_ok(dp_copy_d2h(dev, hp, p, sizeof hp));
    dp_assert_ok(dp_copy_d2h(dev, hm, m, sizeof hm));
    cr_assert(hp[0] == 1 && hp[1] == 2 && hm[0] == 0 && hm[1] == 0);
    dp_device_close(dev);
}

// --- SGD -----------------------------------------------------------------------

static void check_sgd_two_steps(float momentum, float wd, int pass_buf)
{
    enum { N = 257 };
    const float lr = 0.05f;
    dp_rng rng;
    dp_rng_seed(&rng, 99);
    float p[N], g1[N], g2[N], garbage[N];
    dp_rng_fill_normal(&rng, p, N, 0.0f, 1.0f);
    dp_rng_fill_normal(&rng, g1, N, 0.0f, 1.0f);
    dp_rng_fill_normal(&rng, g2, N, 0.0f, 1.0f);
    /* The buffer's content before step 1 must not matter (torch starts it
     * as the gradient). */
    for (int i = 0; i < N; i++) garbage[i] = NAN;
    double rp[N], rg1[N], rg2[N], rbuf[N] = {0};
    for (int i = 0; i < N; i++) rp[i] = p[i], rg1[i] = g1[i], rg2[i] = g2[i];
    sgd_ref(rp, rg1, rbuf, N, lr, momentum, wd, 1);
    sgd_ref(rp, rg2, rbuf, N, lr, momentum, wd, 2);

    dp_device *dev = dp_test_cpu(0);
    float *dparams = dp_test_upload(dev, p, N), *dg1 = dp_test_upload(dev, g1, N);
    float *dg2 = dp_test_upload(dev, g2, N);
    float *dbuf = pass_buf ? dp_test_upload(dev, garbage, N) : NULL;
    dp_assert_ok(dp_sgd_update(dev, dparams, dg1, dbuf, N, lr, momentum, wd, 1));
    dp_assert_ok(dp_sgd_update(dev, dparams, dg2, dbuf, N, lr, momentum, wd, 2));
    float *hp = download(dev, dparams, N);
    double *dhp = to_double(hp, N);
    /* A few float32 fused steps on O(1) values: rtol 1e-5 / atol 1e-6 is
     * ~100 ulps, while one step moves p by ~lr = 0.05. */
    dp_assert_allclose(dhp, (const double *)rp, N, 1e-6, 1e-5);
    if (pass_buf && momentum != 0.0f) {
        float *hb = download(dev, dbuf, N);
        double *dhb = to_double(hb, N);
        dp_assert_allclose(dhb, (const double *)rbuf, N, 1e-6, 1e-5);
        free(hb), free(dhb);
    }
    free(hp), free(dhp);
    dp_device_free(dev, dparams), dp_device_free(dev, dg1), dp_device_free(dev, dg2);
    dp_device_free(dev, dbuf);
    assert_no_leak(dev);
    dp_device_close(dev);
}

Test(sgd, two_steps_with_momentum) { check_sgd_two_steps(0.9f, 0.0f, 1); }

Test(sgd, two_steps_with_momentum_and_weight_decay) { check_sgd_two_steps(0.9f, 0.01f, 1); }

Test(sgd, plain_sgd_without_buffer) { check_sgd_two_steps(0.0f, 0.01f, 0); }

Test(sgd, bad_arguments)
{
    dp_device *dev = dp_test_cpu(3);
    float *p = dp_test_upload(dev, (float[]){1, 2}, 2), *g = dp_test_upload(dev, (float[]){1, 1}, 2);
    assert_error(dp_sgd_update(dev, p, g, NULL, 2, 0.1f, 0.9f, 0, 1), DP_ERR_INVALID_ARGUMENT,
                 "momentum buffer");
    assert_error(dp_sgd_update(dev, p, g, NULL, 2, 0.1f, 0, 0, 0), DP_ERR_INVALID_ARGUMENT,
                 "cpu:3");
    assert_error(dp_sgd_update(dev, NULL, g, NULL, 2, 0.1f, 0, 0, 1), DP_ERR_INVALID_ARGUMENT,
                 "params");
    assert_error(dp_sgd_update(dev, p, g, NULL, 0, 0.1f, 0, 0, 1), DP_ERR_INVALID_ARGUMENT,
                 "n must be > 0");
    assert_error(dp_sgd_update(dev, p, g, NULL, 2, NAN, 0, 0, 1), DP_ERR_INVALID_ARGUMENT, "lr");
    assert_error(dp_sgd_update(dev, p, g, NULL, 2, 0.1f, -0.5f, 0, 1), DP_ERR_INVALID_ARGUMENT,
                 "momentum");
    dp_device_close(dev);
}

// --- sum of squares, scale, clipping ---------------------------------------------

/* One large value then many ones: in float32, 1e8 + 1 == 1e8 and the ones
 * vanish (norm 10000); in double the norm is sqrt(1e8 + 1e5) = 10004.999. */
enum { BIG_N = 100001 };

static float *big_then_ones(void)
{
    float *x = malloc(BIG_N * sizeof *x);
    cr_assert_not_null(x);
    x[0] = 1e4f;
    for (size_t i = 1; i < BIG_N; i++) x[i] = 1.0f;
    return x;
}

Test(clip, sum_squares_accumulates_in_double)
{
    float *x = big_then_ones();
    dp_device *dev = dp_test_cpu(0);
    float *dx = dp_test_upload(dev, x, BIG_N);
    double s = 0.0;
    dp_assert_ok(dp_sum_squares(dev, &s, dx, BIG_N));
    /* Every term is an integer below 2^53: the double sum is exact. */
    cr_assert_eq(s, 1e8 + 100000.0, "sum of squares %.17g, want %.17g", s, 1e8 + 100000.0);
    assert_error(dp_sum_squares(dev, NULL, dx, BIG_N), DP_ERR_INVALID_ARGUMENT, "out_host");
    assert_error(dp_sum_squares(dev, &s, dx, 0), DP_ERR_INVALID_ARGUMENT, "n must be > 0");
    free(x);
    dp_device_close(dev);
}

Test(clip, norm_in_double_and_no_clip_below_max)
{
    float *x = big_then_ones();
    dp_device *dev = dp_test_cpu(0);
    float *dx = dp_test_upload(dev, x, BIG_N);
    double norm = 0.0;
    dp_assert_ok(dp_clip_grad_norm(dev, dx, BIG_N, 2e4f, &norm));
    /* The double sum is exact (see above); only the sqrt rounds. */
    cr_assert(fabs(norm - sqrt(1e8 + 1e5)) <= 1e-9, "norm %.17g, want %.17g", norm,
              sqrt(1e8 + 1e5));
    /* norm < max_norm: gradients untouched, bit for bit. */
    float *h = download(dev, dx, BIG_N);
    cr_assert(memcmp(h, x, BIG_N * sizeof *x) == 0, "gradients changed although norm < max_norm");
    free(h), free(x);
    dp_device_close(dev);
}

Test(clip, norm_equal_to_max_is_not_clipped)
{
    float g[2] = {3.0f, 4.0f};
    dp_device *dev = dp_test_cpu(0);
    float *dg = dp_test_upload(dev, g, 2);
    double norm = 0.0;
    dp_assert_ok(dp_clip_grad_norm(dev, dg, 2, 5.0f, &norm));
    cr_assert_eq(norm, 5.0);
    float h[2];
    dp_assert_ok(dp_copy_d2h(dev, h, dg, sizeof h));
    cr_assert(h[0] == 3.0f && h[1] == 4.0f, "clipped at norm == max_norm: %g %g", h[0], h[1]);
    dp_device_close(dev);
}

/* Clipping multiplies by max_norm / (norm + 1e-6). With norm = 1e-3 the
 * 1e-6 changes the factor by 0.1%, so a factor of max_norm / norm fails. */
Test(clip, clips_by_max_norm_over_norm_plus_eps)
{
    enum { N = 64 };
    dp_rng rng;
    dp_rng_seed(&rng, 7);
    float g[N];
    dp_rng_fill_normal(&rng, g, N, 0.0f, 1.0f);
    double ss = 0.0;
    for (int i = 0; i < N; i++) ss += (double)g[i] * g[i];
    /* Rescale so the norm is about 1e-3. */
    for (int i = 0; i < N; i++) g[i] = (float)(g[i] * 1e-3 / sqrt(ss));
    ss = 0.0;
    for (int i = 0; i < N; i++) ss += (double)g[i] * g[i];
    double want_norm = sqrt(ss);
    const float max_norm = 1e-4f;

    dp_device *dev = dp_test_cpu(0);
    float *dg = dp_test_upload(dev, g, N);
    double norm = 0.0;
    dp_assert_ok(dp_clip_grad_norm(dev, dg, N, max_norm, &norm));
    /* Same squares, summed in the same order in double. */
    cr_assert(fabs(norm - want_norm) <= 1e-12 * want_norm, "norm %.17g want %.17g", norm,
              want_norm);
    float *h = download(dev, dg, N);
    double got[N], want[N], factor = max_norm / (want_norm + 1e-6);
    for (int i = 0; i < N; i++) got[i] = h[i], want[i] = g[i] * factor;
    /* One float32 multiply by a float32-rounded factor: 2 roundings, rtol
     * 1e-6; the wrong factor max_norm/norm is off by 1e-3 relative. */
    dp_assert_allclose(got, (const double *)want, N, 0.0, 1e-6);
    /* Clipped norm just under max_norm. */
    double after = 0.0;
    dp_assert_ok(dp_sum_squares(dev, &after, dg, N));
    cr_assert(sqrt(after) < max_norm && sqrt(after) > 0.99 * max_norm, "clipped norm %g",
              sqrt(after));
    free(h);
    dp_device_close(dev);
}

Test(clip, max_norm_zero_only_measures)
{
    float g[3] = {30.0f, 40.0f, 0.0f};
    dp_device *dev = dp_test_cpu(0);
    float *dg = dp_test_upload(dev, g, 3);
    double norm = 0.0;
    dp_assert_ok(dp_clip_grad_norm(dev, dg, 3, 0.0f, &norm));
    cr_assert_eq(norm, 50.0);
    dp_assert_ok(dp_clip_grad_norm(dev, dg, 3, -1.0f, NULL)); /* norm_out may be NULL */
    float h[3];
    dp_assert_ok(dp_copy_d2h(dev, h, dg, sizeof h));
    cr_assert(memcmp(h, g, sizeof h) == 0, "gradients changed with max_norm <= 0");
    /* NULL norm_out while clipping. */
    dp_assert_ok(dp_clip_grad_norm(dev, dg, 3, 5.0f, NULL));
    dp_assert_ok(dp_copy_d2h(dev, h, dg, sizeof h));
    cr_assert_float_eq(h[0], 3.0f, 1e-5f);
    cr_assert_float_eq(h[1], 4.0f, 1e-5f);
    dp_device_close(dev);
}

static void check_non_finite(float bad)
{
    enum { N = 10 };
    float g[N];
    for (int i = 0; i < N; i++) g[i] = 100.0f + (float)i;
    g[6] = bad;
    dp_device *dev = dp_test_cpu(5);
    float *dg = dp_test_upload(dev, g, N);
    double norm = 0.0;
    assert_error(dp_clip_grad_norm(dev, dg, N, 1.0f, &norm), DP_ERR_NON_FINITE, "cpu:5");
    cr_assert(strstr(dp_last_error(), "NaN or Inf"), "message: %s", dp_last_error());
    cr_assert(!isfinite(norm), "norm_out %g should report the non-finite norm", norm);
    float h[N];
    dp_assert_ok(dp_copy_d2h(dev, h, dg, sizeof h));
    /* memcmp: NaN != NaN, and the bits must be unchanged anyway. */
    cr_assert(memcmp(h, g, sizeof h) == 0, "gradients changed although the norm is not finite");
    dp_device_close(dev);
}

Test(clip, nan_gradient_is_an_error) { check_non_finite(NAN); }

Test(clip, inf_gradient_is_an_error) { check_non_finite(-INFINITY); }

Test(clip, scale_and_bad_arguments)
{
    float x[3] = {1.0f, -2.0f, 0.5f};
    dp_device *dev = dp_test_cpu(4);
    float *dx = dp_test_upload(dev, x, 3);
    dp_assert_ok(dp_scale(dev, dx, -3.0f, 3));
    float h[3];
    dp_assert_ok(dp_copy_d2h(dev, h, dx, sizeof h));
    cr_assert(h[0] == -3.0f && h[1] == 6.0f && h[2] == -1.5f, "scale: %g %g %g", h[0], h[1], h[2]);
    assert_error(dp_scale(dev, NULL, 2.0f, 3), DP_ERR_INVALID_ARGUMENT, "cpu:4");
    assert_error(dp_scale(dev, dx, 2.0f, 0), DP_ERR_INVALID_ARGUMENT, "n must be > 0");
    assert_error(dp_scale(NULL, dx, 2.0f, 3), DP_ERR_INVALID_ARGUMENT, "dev");
    assert_error(dp_clip_grad_norm(dev, NULL, 3, 1.0f, NULL), DP_ERR_INVALID_ARGUMENT, "grads");
    assert_error(dp_clip_grad_norm(dev, dx, 0, 1.0f, NULL), DP_ERR_INVALID_ARGUMENT, "n must");
    assert_error(dp_clip_grad_norm(dev, dx, 3, NAN, NULL), DP_ERR_INVALID_ARGUMENT, "max_norm");
    assert_error(dp_clip_grad_norm(NULL, dx, 3, 1.0f, NULL), DP_ERR_INVALID_ARGUMENT, "dev");
    dp_device_close(dev);
}

// --- LR schedule -----------------------------------------------------------------

/* float64 nanoGPT/llm.c schedule as documented in dp/optim.h. */
static double lr_ref(long step, long warmup, long max_steps, double lr, double min_lr)
{
    if (step < warmup) return lr * (double)(step + 1) / (double)warmup;
    if (step >= max_steps) return min_lr;
    double ratio = (double)(step - warmup) / (double)(max_steps - warmup);
    return min_lr + 0.5 * (1.0 + cos(3.14159265358979323846 * ratio)) * (lr - min_lr);
}

/* The schedule returns float: compare within float rounding (rtol 1e-6). */
#define assert_lr(got, want)                                                              \
    do {                                                                                  \
        double g_ = (got), w_ = (want);                                                   \
        cr_assert(fabs(g_ - w_) <= 1e-6 * fabs(w_) + 1e-12, "%s = %.9g, want %.9g", #got, \
                  g_, w_);                                                                \
    } while (0)

Test(schedule, warmup_is_linear_from_lr_over_warmup)
{
    const float lr = 6e-4f, min_lr = 6e-5f;
    assert_lr(dp_lr_schedule(0, 10, 110, lr, min_lr), 6e-5);
    assert_lr(dp_lr_schedule(4, 10, 110, lr, min_lr), 3e-4);
    assert_lr(dp_lr_schedule(9, 10, 110, lr, min_lr), 6e-4); /* last warmup step: full lr */
    for (long s = 0; s < 10; s++) assert_lr(dp_lr_schedule(s, 10, 110, lr, min_lr), lr_ref(s, 10, 110, lr, min_lr));
}

Test(schedule, cosine_decay_and_min_lr_after_max_steps)
{
    const float lr = 6e-4f, min_lr = 6e-5f;
    /* First decay step is the full lr (cos 0 = 1). */
    assert_lr(dp_lr_schedule(10, 10, 110, lr, min_lr), 6e-4);
    /* Midpoint of the decay: cos(pi/2) = 0, halfway between lr and min_lr. */
    assert_lr(dp_lr_schedule(60, 10, 110, lr, min_lr), 0.5 * ((double)lr + min_lr));
    /* Quarter point: min + (1 + cos(pi/4))/2 (lr - min). */
    assert_lr(dp_lr_schedule(35, 10, 110, lr, min_lr), lr_ref(35, 10, 110, lr, min_lr));
    assert_lr(dp_lr_schedule(110, 10, 110, lr, min_lr), min_lr);
    assert_lr(dp_lr_schedule(111, 10, 110, lr, min_lr), min_lr);
    assert_lr(dp_lr_schedule(1000000, 10, 110, lr, min_lr), min_lr);
    /* Strictly decreasing over the decay. */
    float prev = dp_lr_schedule(10, 10, 110, lr, min_lr);
    for (long s = 11; s <= 110; s++) {
        float cur = dp_lr_schedule(s, 10, 110, lr, min_lr);
        cr_assert(cur < prev, "lr not decreasing at step %ld: %g >= %g", s, cur, prev);
        assert_lr(cur, lr_ref(s, 10, 110, lr, min_lr));
        prev = cur;
    }
}

Test(schedule, no_warmup_starts_at_the_cosine)
{
    assert_lr(dp_lr_schedule(0, 0, 100, 1e-3f, 0.0f), 1e-3);
    assert_lr(dp_lr_schedule(50, 0, 100, 1e-3f, 0.0f), 5e-4);
    assert_lr(dp_lr_schedule(100, 0, 100, 1e-3f, 0.0f), 0.0);
    /* No decay phase at all (max_steps <= warmup): warmup, then min_lr. */
    assert_lr(dp_lr_schedule(4, 5, 5, 1e-3f, 1e-4f), 1e-3);
    assert_lr(dp_lr_schedule(5, 5, 5, 1e-3f, 1e-4f), 1e-4);
    assert_lr(dp_lr_schedule(0, 0, 0, 1e-3f, 1e-4f), 1e-4);
}

Test(schedule, bad_arguments_give_nan_and_a_message)
{
    dp_clear_error();
    cr_assert(isnan(dp_lr_schedule(-1, 10, 100, 1e-3f, 0.0f)));
    cr_assert(strstr(dp_last_error(), "step (-1)"), "message: %s", dp_last_error());
    cr_assert(isnan(dp_lr_schedule(0, -10, 100, 1e-3f, 0.0f)));
    cr_assert(strstr(dp_last_error(), "warmup (-10)"), "message: %s", dp_last_error());
    cr_assert(isnan(dp_lr_schedule(0, 10, -100, 1e-3f, 0.0f)));
    cr_assert(isnan(dp_lr_schedule(0, 10, 100, NAN, 0.0f)));
    cr_assert(strstr(dp_last_error(), "lr"), "message: %s", dp_last_error());
    cr_assert(isnan(dp_lr_schedule(0, 10, 100, 1e-3f, INFINITY)));
    /* A NaN lr is then refused by the update instead of poisoning weights. */
    dp_device *dev = dp_test_cpu(0);
    float *p = dp_test_upload(dev, (float[]){1}, 1), *g = dp_test_upload(dev, (float[]){1}, 1);
    float *m = dp_test_upload(dev, (float[]){0}, 1), *v = dp_test_upload(dev, (float[]){0}, 1);
    float lr = dp_lr_schedule(-1, 10, 100, 1e-3f, 0.0f);
    assert_error(dp_adamw_update(dev, p, g, m, v, 1, lr, 0.9f, 0.999f, 1e-8f, 0.0f, 1),
                 DP_ERR_INVALID_ARGUMENT, "lr");
    dp_device_close(dev);
}
