/* Softmax and log-softmax over rows: forward against float64 (large
 * offsets, masked -inf classes, long rows), backward against central
 * finite differences of the float64 forward, in-place calls, the aliasing
 * rule (dinp must not be out), bad arguments. */
#include <float.h>

#include "nn_test_util.h"

typedef dp_status (*fwd_fn)(dp_device *, float *, const float *, size_t, size_t);
typedef dp_status (*bwd_fn)(dp_device *, float *, const float *, const float *, size_t, size_t);

/* out(C) = softmax(x) (log_ = 0) or log_softmax(x) (log_ = 1), in double. */
static void ref_row(const double *x, size_t C, int log_, double *out)
{
    double m = -INFINITY, s = 0.0;
    for (size_t j = 0; j < C; j++) m = x[j] > m ? x[j] : m;
    for (size_t j = 0; j < C; j++) s += exp(x[j] - m);
    for (size_t j = 0; j < C; j++) out[j] = log_ ? (x[j] - m) - log(s) : exp(x[j] - m) / s;
}

/* Rows of normal(0, 3) logits; row 1 shifted by +1e4 and row 2 by -1e4
 * (a naive exp overflows or underflows), row 3 with two masked (-inf)
 * classes, row 4 with equal logits. */
static float *make_logits(size_t N, size_t C, uint64_t seed)
{
    float *x = malloc(N * C * sizeof *x);
    cr_assert_not_null(x);
    dp_rng rng;
    dp_rng_seed(&rng, seed);
    dp_rng_fill_normal(&rng, x, N * C, 0.0f, 3.0f);
    for (size_t j = 0; j < C && N > 4; j++) {
        x[1 * C + j] += 1e4f;
        x[2 * C + j] -= 1e4f;
        x[4 * C + j] = 0.5f;
    }
    if (N > 4 && C > 3) x[3 * C + 0] = x[3 * C + 2] = -INFINITY;
    return x;
}

/* Runs f over (N,C) on cpu:0 (out of place, and in place: the same bits). */
static float *run_forward(fwd_fn f, const float *x, size_t N, size_t C)
{
    dp_device *dev = dp_test_cpu(0);
    float *d_x = dp_test_upload(dev, x, N * C), *d_out = dp_test_nn_filled(dev, N * C, NAN);
    dp_assert_ok(f(dev, d_out, d_x, N, C));
    float *out = dp_test_nn_download(dev, d_out, N * C);
    dp_assert_ok(f(dev, d_x, d_x, N, C));
    float *inplace = dp_test_nn_download(dev, d_x, N * C);
    cr_assert(memcmp(out, inplace, N * C * sizeof(float)) == 0, "in-place forward differs");
    free(inplace);
    dp_device_free(dev, d_x);
    dp_device_free(dev, d_out);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
    return out;
}

static void check_forward(fwd_fn f, int log_, size_t N, size_t C, double atol, double rtol)
{
    float *x = make_logits(N, C, 80 + C);
    float *out = run_forward(f, x, N, C);
    double *got = malloc(N * C * sizeof *got), *ref = malloc(N * C * sizeof *ref);
    double *xd = malloc(C * sizeof *xd);
    cr_assert(got && ref && xd);
    for (size_t r = 0; r < N; r++) {
        for (size_t j = 0; j < C; j++) xd[j] = x[r * C + j];
        ref_row(xd, C, log_, ref + r * C);
    }
    for (size_t i = 0; i < N * C; i++) {
        got[i] = out[i];
        if (isinf(ref[i])) { /* a masked class: -inf log-probability, as the reference */
            cr_assert(out[i] == (float)ref[i], "element %zu: %g, want %g", i, out[i], ref[i]);
            got[i] = ref[i] = 0.0;
        }
    }
    dp_assert_allclose(got, ref, N * C, atol, rtol);
    if (!log_)
        for (size_t r = 0; r < N; r++) {
            double s = 0.0;
            for (size_t j = 0; j < C; j++) s += out[r * C + j];
            cr_assert(fabs(s - 1.0) < 1e-5 * (C > 100 ? C / 100.0 : 1.0), "row %zu sums to %.9g",
                      r, s);
        }
    free(x), free(out), free(got), free(ref), free(xd);
}

/* Float sums of C terms: ~C 2^-24 relative at worst (softmax); log-softmax
 * rounds once from double. */
Test(softmax, forward_matches_float64)
{
    check_forward(dp_softmax_forward, 0, 7, 13, 1e-8, 2e-6);
    check_forward(dp_softmax_forward, 0, 5, 1000, 1e-9, 2e-5);
}

Test(log_softmax, forward_matches_float64)
{
    check_forward(dp_log_softmax_forward, 1, 7, 13, 1e-6, 1e-6);
    check_forward(dp_log_softmax_forward, 1, 5, 1000, 1e-6, 1e-6);
}

/* Backward against finite differences of L = sum dout * f(x), f in
 * double, row by row (rows are independent), on rows without -inf and
 * without the 1e4 offsets (a step relative to 1e4 cannot resolve O(1)
 * differences). dinp is checked out of place (NaN garbage overwritten)
 * and in place over dout (the same bits); dinp == out is refused. */
static void check_backward(fwd_fn f, bwd_fn b, int log_)
{
    enum { N = 6, C = 11 };
    float *x = make_logits(N, C, 90 + log_), dout[N * C];
    for (size_t j = 0; j < C; j++) x[3 * C + j] = x[1 * C + j] = x[2 * C + j] = 0.1f * j;
    dp_rng rng;
    dp_rng_seed(&rng, 91);
    dp_rng_fill_normal(&rng, dout, N * C, 0.0f, 1.0f);
    dp_device *dev = dp_test_cpu(0);
    float *d_x = dp_test_upload(dev, x, N * C), *d_out = dp_test_nn_filled(dev, N * C, NAN);
    float *d_dout = dp_test_upload(dev, dout, N * C), *d_dinp = dp_test_nn_filled(dev, N * C, NAN);
    dp_assert_ok(f(dev, d_out, d_x, N, C));
    dp_assert_ok(b(dev, d_dinp, d_out, d_dout, N, C));
    float *dinp = dp_test_nn_download(dev, d_dinp, N * C);
    dp_assert_ok(b(dev, d_dout, d_out, d_dout, N, C));
    float *inplace = dp_test_nn_download(dev, d_dout, N * C);
    cr_assert(memcmp(dinp, inplace, sizeof dout) == 0, "in-place backward differs");
    dp_test_nn_assert_invalid(b(dev, d_out, d_out, d_dout, N, C), "must not be out", NULL);
    double got[N * C], want[N * C];
    for (size_t r = 0; r < N; r++)
        for (size_t j = 0; j < C; j++) {
            double xp[C], fp[C], fm[C], h = 1e-6, lp = 0.0, lm = 0.0;
            for (size_t i = 0; i < C; i++) xp[i] = x[r * C + i];
            xp[j] += h;
            ref_row(xp, C, log_, fp);
            xp[j] -= 2 * h;
            ref_row(xp, C, log_, fm);
            for (size_t i = 0; i < C; i++) {
                lp += dout[r * C + i] * fp[i];
                lm += dout[r * C + i] * fm[i];
            }
            want[r * C + j] = (lp - lm) / (2 * h);
            got[r * C + j] = dinp[r * C + j];
        }
    /* the forward's float output and the float sums: 1e-5 of O(1) gradients */
    dp_assert_allclose(got, want, N * C, 1e-5, 1e-4);
    free(x), free(dinp), free(inplace);
    dp_device_free(dev, d_x), dp_device_free(dev, d_out), dp_device_free(dev, d_dout);
    dp_device_free(dev, d_dinp);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

Test(softmax, backward_matches_finite_differences) { check_backward(dp_softmax_forward, dp_softmax_backward, 0); }

Test(log_softmax, backward_matches_finite_differences)
{
    check_backward(dp_log_softmax_forward, dp_log_softmax_backward, 1);
}

/* A masked class passes back dout alone through log-softmax (exp(-inf) =
 * 0) and nothing through softmax; a row of -inf only is NaN (as torch). */
Test(log_softmax, masked_classes)
{
    dp_device *dev = dp_test_cpu(0);
    float x[2 * 3] = {-INFINITY, 1.0f, 2.0f, -INFINITY, -INFINITY, -INFINITY};
    float g[2 * 3] = {0.5f, 1.0f, -1.0f, 1.0f, 1.0f, 1.0f};
    float *d_x = dp_test_upload(dev, x, 6), *d_g = dp_test_upload(dev, g, 6);
    float *d_out = dp_test_nn_filled(dev, 6, 0.0f), *d_dinp = dp_test_nn_filled(dev, 6, 0.0f);
    float out[6], dinp[6];
    dp_assert_ok(dp_log_softmax_forward(dev, d_out, d_x, 2, 3));
    dp_assert_ok(dp_log_softmax_backward(dev, d_dinp, d_out, d_g, 2, 3));
    dp_assert_ok(dp_copy_d2h(dev, out, d_out, sizeof out));
    dp_assert_ok(dp_copy_d2h(dev, dinp, d_dinp, sizeof dinp));
    cr_assert(isinf(out[0]) && out[0] < 0 && dinp[0] == 0.5f, "%g %g", out[0], dinp[0]);
    for (int j = 3; j < 6; j++) cr_assert(isnan(out[j]), "an all -inf row is NaN: %g", out[j]);
    dp_assert_ok(dp_softmax_forward(dev, d_out, d_x, 1, 3));
    dp_assert_ok(dp_softmax_backward(dev, d_dinp, d_out, d_g, 1, 3));
    dp_assert_ok(dp_copy_d2h(dev, out, d_out, 3 * sizeof(float)));
    dp_assert_ok(dp_copy_d2h(dev, dinp, d_dinp, 3 * sizeof(float)));
    cr_assert(out[0] == 0.0f && dinp[0] == 0.0f, "%g %g", out[0], dinp[0]);
    dp_device_free(dev, d_x), dp_device_free(dev, d_g), dp_device_free(dev, d_out);
    dp_device_free(dev, d_dinp);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

Test(softmax, bad_arguments)
{
    dp_device *dev = dp_test_cpu(0);
    float *f = dp_test_nn_filled(dev, 8, 0.0f), *g = dp_test_nn_filled(dev, 8, 0.0f);
    fwd_fn fwd[2] = {dp_softmax_forward, dp_log_softmax_forward};
    bwd_fn bwd[2] = {dp_softmax_backward, dp_log_softmax_backward};
    const char *names[2] = {"dp_softmax_forward", "dp_log_softmax_forward"};
    for (int a = 0; a < 2; a++) {
        dp_test_nn_assert_invalid(fwd[a](NULL, f, f, 2, 4), "dev", NULL);
        dp_test_nn_assert_invalid(fwd[a](dev, NULL, f, 2, 4), "out", names[a]);
        dp_test_nn_assert_invalid(fwd[a](dev, f, NULL, 2, 4), "inp", NULL);
        dp_test_nn_assert_invalid(fwd[a](dev, f, f, 0, 4), "N and C must both be > 0", NULL);
        dp_test_nn_assert_invalid(fwd[a](dev, f, f, 2, 0), "N and C must both be > 0", NULL);
        dp_test_nn_assert_invalid(fwd[a](dev, f, f, SIZE_MAX, 4), "overflow", NULL);
        dp_test_nn_assert_invalid(bwd[a](dev, NULL, f, g, 2, 4), "dinp", NULL);
        dp_test_nn_assert_invalid(bwd[a](dev, g, NULL, g, 2, 4), "out", NULL);
        dp_test_nn_assert_invalid(bwd[a](dev, g, f, NULL, 2, 4), "dout", NULL);
        dp_test_nn_assert_invalid(bwd[a](dev, f, f, g, 2, 4), "dinp must not be out", NULL);
    }
    dp_device_free(dev, f);
    dp_device_free(dev, g);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}
