/* ReLU and SiLU: forward against float64, backward against central
 * finite differences of the float64 forward (away from ReLU's kink),
 * in-place calls, saturated and special inputs, bad arguments. The GELU
 * has its own file (test_gelu.c). */
#include <float.h>

#include "nn_test_util.h"

#define NX 400

typedef dp_status (*fwd_fn)(dp_device *, float *, const float *, size_t);
typedef dp_status (*bwd_fn)(dp_device *, float *, const float *, const float *, size_t);

static double relu_ref(double x) { return x > 0.0 ? x : 0.0; }
static double silu_ref(double x) { return x / (1.0 + exp(-x)); }

/* Random x in [-6, 6] plus zeros, values where the sigmoid saturates and
 * huge ones (the gradient must stay finite). */
static void make_inputs(float *x, uint64_t seed)
{
    dp_rng rng;
    dp_rng_seed(&rng, seed);
    dp_rng_fill_uniform(&rng, x, NX, -6.0f, 6.0f);
    const float special[] = {0.0f, -0.0f, 1e-3f, -1e-3f, 30.0f, -30.0f, 1e4f, -1e4f, 1e20f, -1e20f};
    memcpy(x, special, sizeof special);
}

/* On cpu:0, out = fw(x), or (bw given) dinp = bw(x, dout): into a buffer
 * of NaNs (every element must be written), then in place over x (the
 * forward) or dout (the backward), which must give the same bits. */
static float *apply(fwd_fn fw, bwd_fn bw, const float *x, const float *dout)
{
    dp_device *dev = dp_test_cpu(0);
    float *d_x = dp_test_upload(dev, x, NX), *d_out = dp_test_nn_filled(dev, NX, NAN);
    float *d_g = bw ? dp_test_upload(dev, dout, NX) : NULL, *over = bw ? d_g : d_x;
    dp_assert_ok(bw ? bw(dev, d_out, d_x, d_g, NX) : fw(dev, d_out, d_x, NX));
    float *out = dp_test_nn_download(dev, d_out, NX);
    dp_assert_ok(bw ? bw(dev, over, d_x, d_g, NX) : fw(dev, over, over, NX));
    float *inplace = dp_test_nn_download(dev, over, NX);
    cr_assert(memcmp(inplace, out, sizeof(float) * NX) == 0, "in place differs");
    free(inplace);
    dp_device_free(dev, d_x);
    dp_device_free(dev, d_out);
    dp_device_free(dev, d_g);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
    return out;
}

/* Central difference of the float64 forward, dout-weighted, with a step
 * relative to |x| (truncation ~h^2, rounding ~1e-16/h). */
static double fd(double (*ref)(double), double x, double dout)
{
    double h = 1e-5 * (fabs(x) > 1.0 ? fabs(x) : 1.0);
    return dout * (ref(x + h) - ref(x - h)) / (2 * h);
}

/* The inputs and, for a backward, normal(0, 1) output gradients. */
static void make_grad_inputs(float *x, float *dout, uint64_t seed)
{
    make_inputs(x, seed);
    dp_rng rng;
    dp_rng_seed(&rng, seed + 1);
    dp_rng_fill_normal(&rng, dout, NX, 0.0f, 1.0f);
}

// --- ReLU -----------------------------------------------------------------------------

Test(relu, forward_is_max_with_zero)
{
    float x[NX];
    make_inputs(x, 61);
    float *out = apply(dp_relu_forward, NULL, x, NULL);
    for (size_t i = 0; i < NX; i++)
        cr_assert_eq(out[i], (float)relu_ref(x[i]), "relu(%g) = %g", x[i], out[i]);
    free(out);
    /* NaN stays NaN, as torch.relu */
    float nan_in[NX];
    for (size_t i = 0; i < NX; i++) nan_in[i] = i == 7 ? NAN : 1.0f;
    out = apply(dp_relu_forward, NULL, nan_in, NULL);
    cr_assert(isnan(out[7]) && out[6] == 1.0f);
    free(out);
}

Test(relu, backward_matches_finite_differences)
{
    float x[NX], dout[NX];
    make_grad_inputs(x, dout, 62);
    float *dinp = apply(NULL, dp_relu_backward, x, dout);
    for (size_t i = 0; i < NX; i++) {
        if (x[i] == 0.0f) {
            cr_assert_eq(dinp[i], 0.0f, "the gradient at 0 is 0 (PyTorch's), got %g", dinp[i]);
            continue;
        }
        if (fabsf(x[i]) < 1e-2f) continue; /* the kink is inside the difference's step */
        double want = fd(relu_ref, x[i], dout[i]);
        cr_assert(fabs(dinp[i] - want) <= 1e-9 + 1e-9 * fabs(want), "x=%g: %g vs %g", x[i],
                  dinp[i], want);
    }
    free(dinp);
}

// --- SiLU -----------------------------------------------------------------------------

Test(silu, forward_matches_float64)
{
    float x[NX];
    make_inputs(x, 71);
    float *out = apply(dp_silu_forward, NULL, x, NULL);
    double got[NX], ref[NX];
    for (size_t i = 0; i < NX; i++) got[i] = out[i], ref[i] = silu_ref(x[i]);
    /* one dp_expf (2 ulp) and two roundings: rtol 1e-6; near -x's
     * saturation the output is tiny, atol 1e-7 */
    dp_assert_allclose(got, ref, NX, 1e-7, 1e-6);
    cr_assert(out[8] == 1e20f && out[9] == 0.0f, "saturation: silu(1e20) = %g, silu(-1e20) = %g",
              out[8], out[9]);
    free(out);
}

Test(silu, backward_matches_finite_differences)
{
    float x[NX], dout[NX];
    make_grad_inputs(x, dout, 72);
    float *dinp = apply(NULL, dp_silu_backward, x, dout);
    double got[NX], ref[NX];
    for (size_t i = 0; i < NX; i++) {
        cr_assert(isfinite(dinp[i]), "x=%g: gradient %g", x[i], dinp[i]);
        got[i] = dinp[i];
        ref[i] = fd(silu_ref, x[i], dout[i]);
    }
    /* silu' is O(1): float roundings and the difference's error */
    dp_assert_allclose(got, ref, NX, 1e-6, 1e-5);
    free(dinp);
}

// --- arguments -----------------------------------------------------------------------

Test(activations, bad_arguments)
{
    dp_device *dev = dp_test_cpu(0);
    float *f = dp_test_nn_filled(dev, 8, 0.0f);
    fwd_fn fwd[2] = {dp_relu_forward, dp_silu_forward};
    bwd_fn bwd[2] = {dp_relu_backward, dp_silu_backward};
    const char *names[2][2] = {{"dp_relu_forward", "dp_relu_backward"},
                               {"dp_silu_forward", "dp_silu_backward"}};
    for (int a = 0; a < 2; a++) {
        dp_test_nn_assert_invalid(fwd[a](NULL, f, f, 8), "dev", NULL);
        dp_test_nn_assert_invalid(fwd[a](dev, NULL, f, 8), "out", names[a][0]);
        dp_test_nn_assert_invalid(fwd[a](dev, f, NULL, 8), "inp", NULL);
        dp_test_nn_assert_invalid(fwd[a](dev, f, f, 0), "n must be > 0", names[a][0]);
        dp_test_nn_assert_invalid(fwd[a](dev, f, f, SIZE_MAX), "overflow", NULL);
        dp_test_nn_assert_invalid(bwd[a](dev, NULL, f, f, 8), "dinp", names[a][1]);
        dp_test_nn_assert_invalid(bwd[a](dev, f, NULL, f, 8), "inp", NULL);
        dp_test_nn_assert_invalid(bwd[a](dev, f, f, NULL, 8), "dout", NULL);
        dp_test_nn_assert_invalid(bwd[a](dev, f, f, f, 0), "n must be > 0", NULL);
    }
    dp_device_free(dev, f);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}
