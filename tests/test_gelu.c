/* GELU (tanh approximation): forward against float64, backward against
 * central finite differences of the float64 forward, in-place backward,
 * saturated inputs, bad arguments; and dp_expf, the vectorisable exp the
 * CPU kernels use, against exp in double. */
#include <float.h>

#include "kernels/expf.h"
#include "nn_test_util.h"

#define NX 400

static double gelu_ref(double x)
{
    const double k = sqrt(2.0 / 3.14159265358979323846);
    return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
}

/* Random x in [-6, 6] plus values where tanh saturates or x is 0; at
 * |x| = 1e20 the float x*x overflows (gelu' must still be finite). */
static void make_inputs(float *x, uint64_t seed)
{
    dp_rng rng;
    dp_rng_seed(&rng, seed);
    dp_rng_fill_uniform(&rng, x, NX, -6.0f, 6.0f);
    const float special[] = {0.0f, -0.0f, 1e-3f, -1e-3f, 10.0f, -10.0f, 30.0f, -30.0f,
                             1e4f,  -1e4f, 1e20f, -1e20f};
    memcpy(x, special, sizeof special);
}

Test(gelu, forward_matches_float64)
{
    dp_device *dev = dp_test_cpu(0);
    float x[NX];
    make_inputs(x, 51);
    float *d_x = dp_test_upload(dev, x, NX), *d_out = dp_test_nn_filled(dev, NX, NAN);
    dp_assert_ok(dp_gelu_forward(dev, d_out, d_x, NX));
    float *out = dp_test_nn_download(dev, d_out, NX);
    double got[NX], ref[NX];
    for (size_t i = 0; i < NX; i++) got[i] = out[i], ref[i] = gelu_ref(x[i]);
    /* A few float roundings of values ~x: rtol 1e-5. For x << 0, 1 + tanh(u)
     * cancels: float tanh's absolute error ~6e-8 times 0.5|x| <= 3 gives
     * ~2e-7 absolute, hence atol 1e-6. */
    dp_assert_allclose(got, ref, NX, 1e-6, 1e-5);
    /* in place (out == inp), as the GPT's bf16 activations run it */
    dp_assert_ok(dp_gelu_forward(dev, d_x, d_x, NX));
    float *inplace = dp_test_nn_download(dev, d_x, NX);
    cr_assert(memcmp(inplace, out, sizeof(float) * NX) == 0, "in-place forward differs");
    free(inplace);
    free(out);
    dp_device_free(dev, d_x);
    dp_device_free(dev, d_out);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

Test(gelu, backward_matches_finite_differences)
{
    dp_device *dev = dp_test_cpu(0);
    float x[NX], dout[NX];
    make_inputs(x, 52);
    dp_rng rng;
    dp_rng_seed(&rng, 53);
    dp_rng_fill_normal(&rng, dout, NX, 0.0f, 1.0f);
    float *d_x = dp_test_upload(dev, x, NX), *d_dout = dp_test_upload(dev, dout, NX);
    /* dinp is overwritten: NaN garbage must not survive. */
    float *d_dinp = dp_test_nn_filled(dev, NX, NAN);
    dp_assert_ok(dp_gelu_backward(dev, d_dinp, d_x, d_dout, NX));
    float *dinp = dp_test_nn_download(dev, d_dinp, NX);
    double got[NX], ref[NX];
    for (size_t i = 0; i < NX; i++) {
        /* Central difference of the float64 forward with a step relative to
         * |x|: truncation h^2 |gelu'''| / 6 ~ 1e-12, rounding ~1e-16/h. */
        double xi = x[i], h = 1e-5 * (fabs(xi) > 1.0 ? fabs(xi) : 1.0);
        ref[i] = dout[i] * (gelu_ref(xi + h) - gelu_ref(xi - h)) / (2 * h);
        got[i] = dinp[i];
    }
    /* gelu' is O(1); float roundings plus the 1 + tanh cancellation (~1e-6
     * relative to the O(1) terms) and the difference's error: 1e-5, 1e-4. */
    dp_assert_allclose(got, ref, NX, 1e-5, 1e-4);
    free(dinp);
    dp_device_free(dev, d_x);
    dp_device_free(dev, d_dout);
    dp_device_free(dev, d_dinp);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

Test(gelu, backward_in_place_equals_out_of_place)
{
    dp_device *dev = dp_test_cpu(0);
    float x[NX], dout[NX];
    make_inputs(x, 54);
    dp_rng rng;
    dp_rng_seed(&rng, 55);
    dp_rng_fill_normal(&rng, dout, NX, 0.0f, 1.0f);
    float *d_x = dp_test_upload(dev, x, NX), *d_dout = dp_test_upload(dev, dout, NX);
    float *d_sep = dp_test_nn_filled(dev, NX, NAN);
    dp_assert_ok(dp_gelu_backward(dev, d_sep, d_x, d_dout, NX));
    dp_assert_ok(dp_gelu_backward(dev, d_dout, d_x, d_dout, NX)); /* dinp == dout */
    float *sep = dp_test_nn_download(dev, d_sep, NX), *inplace = dp_test_nn_download(dev, d_dout, NX);
    cr_assert(memcmp(sep, inplace, sizeof x) == 0, "in-place backward differs");
    /* And it did change: a no-op would leave dout in place. */
    cr_assert(memcmp(inplace, dout, sizeof x) != 0, "in-place backward wrote nothing");
    free(sep);
    free(inplace);
    dp_device_free(dev, d_x);
    dp_device_free(dev, d_dout);
    dp_device_free(dev, d_sep);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

Test(gelu, bad_arguments)
{
    dp_device *dev = dp_test_cpu(0);
    float *f = dp_test_nn_filled(dev, 8, 0.0f);
    dp_test_nn_assert_invalid(dp_gelu_forward(NULL, f, f, 8), "dev", NULL);
    dp_test_nn_assert_invalid(dp_gelu_forward(dev, NULL, f, 8), "out", "cpu:0");
    dp_test_nn_assert_invalid(dp_gelu_forward(dev, f, NULL, 8), "inp", NULL);
    dp_test_nn_assert_invalid(dp_gelu_forward(dev, f, f, 0), "n must be > 0", "dp_gelu_forward");
    dp_test_nn_assert_invalid(dp_gelu_forward(dev, f, f, SIZE_MAX), "overflow", NULL);
    dp_test_nn_assert_invalid(dp_gelu_backward(NULL, f, f, f, 8), "dev", NULL);
    dp_test_nn_assert_invalid(dp_gelu_backward(dev, NULL, f, f, 8), "dinp", "dp_gelu_backward");
    dp_test_nn_assert_invalid(dp_gelu_backward(dev, f, NULL, f, 8), "inp", NULL);
    dp_test_nn_assert_invalid(dp_gelu_backward(dev, f, f, NULL, 8), "dout", NULL);
    dp_test_nn_assert_invalid(dp_gelu_backward(dev, f, f, f, 0), "n must be > 0", NULL);
    dp_device_free(dev, f);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

/* |dp_expf(x) - exp(x)| in units of the float spacing at exp(x). */
static double expf_ulps(float x)
{
    double ref = exp((double)x);
    float rf = (float)ref;
    double ulp = (double)nextafterf(rf, INFINITY) - (double)rf;
    return fabs((double)dp_expf(x) - ref) / ulp;
}

/* 2^21 evenly spaced points of the documented range, every float of its
 * last 0.05 at both ends, and x = +-2^-k near 0: within 2 ulp
 * (kernels/expf.h; Taylor truncation is < 6e-9 relative, the rest is float
 * rounding in Horner and the reduction). */
static void expf_check(float x, double *worst, float *at)
{
    double e = expf_ulps(x);
    if (e > *worst) {
        *worst = e;
        *at = x;
    }
}

Test(expf, within_two_ulp_over_the_range)
{
    double worst = 0.0;
    float at = 0.0f;
    const size_t n = (size_t)1 << 21;
    for (size_t k = 0; k <= n; k++)
        expf_check((float)(DP_EXPF_LO + (DP_EXPF_HI - DP_EXPF_LO) * ((double)k / (double)n)),
                   &worst, &at);
    for (float x = DP_EXPF_HI - 0.05f; x <= DP_EXPF_HI; x = nextafterf(x, INFINITY))
        expf_check(x, &worst, &at);
    for (float x = DP_EXPF_LO; x <= DP_EXPF_LO + 0.05f; x = nextafterf(x, INFINITY))
        expf_check(x, &worst, &at);
    for (int k = 1; k < 149; k++) {
        expf_check(ldexpf(1.0f, -k), &worst, &at);
        expf_check(-ldexpf(1.0f, -k), &worst, &at);
    }
    cr_assert(worst <= 2.0, "dp_expf is %.3f ulp off at x = %.9g", worst, (double)at);
}

Test(expf, edges)
{
    cr_assert(isinf(dp_expf(88.8f)) && dp_expf(88.8f) > 0, "overflow must give +inf");
    cr_assert(isinf(dp_expf(INFINITY)));
    cr_assert(dp_expf(-INFINITY) == 0.0f);
    cr_assert(dp_expf(-87.0f) == 0.0f, "below 2^-125 flushes to +0 as documented");
    cr_assert(isnan(dp_expf(NAN)));
    cr_assert(dp_expf(0.0f) == 1.0f && dp_expf(-0.0f) == 1.0f);
    cr_assert(dp_expf(DP_EXPF_HI) <= FLT_MAX && dp_expf(DP_EXPF_HI) > 3.4e38f);
    cr_assert(dp_expf(DP_EXPF_LO) >= FLT_MIN);
}
