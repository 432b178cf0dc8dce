/* Residual add and dp_accumulate: forward (including out aliasing an
 * input), backward accumulating into both branches with either one NULL,
 * dp_accumulate's +=, bad arguments. These are single float additions, so
 * results are compared with the float64 sum to half an ulp. */
#include "nn_test_util.h"

#define NE 257

/* |got - (a + b)| within half an ulp of the float64 sum: one rounding. */
static void assert_sum(const float *got, const float *a, const float *b, size_t n)
{
    double g[NE], ref[NE];
    for (size_t i = 0; i < n; i++) g[i] = got[i], ref[i] = (double)a[i] + (double)b[i];
    dp_assert_allclose(g, ref, n, 0.0, 6e-8);
}

Test(residual, forward_and_aliasing)
{
    dp_device *dev = dp_test_cpu(0);
    dp_rng rng;
    dp_rng_seed(&rng, 61);
    float a[NE], b[NE];
    dp_rng_fill_normal(&rng, a, NE, 0.0f, 1.0f);
    dp_rng_fill_normal(&rng, b, NE, 0.0f, 100.0f);
    float *d_a = dp_test_upload(dev, a, NE), *d_b = dp_test_upload(dev, b, NE);
    float *d_out = dp_test_nn_filled(dev, NE, NAN);
    dp_assert_ok(dp_residual_forward(dev, d_out, d_a, d_b, NE));
    float *out = dp_test_nn_download(dev, d_out, NE);
    assert_sum(out, a, b, NE);
    /* out aliasing a, then b: same values. */
    dp_assert_ok(dp_residual_forward(dev, d_a, d_a, d_b, NE));
    float *got_a = dp_test_nn_download(dev, d_a, NE);
    cr_assert(memcmp(got_a, out, sizeof a) == 0, "out == a gives a different result");
    float *d_a2 = dp_test_upload(dev, a, NE);
    dp_assert_ok(dp_residual_forward(dev, d_b, d_a2, d_b, NE));
    float *got_b = dp_test_nn_download(dev, d_b, NE);
    cr_assert(memcmp(got_b, out, sizeof a) == 0, "out == b gives a different result");
    free(out);
    free(got_a);
    free(got_b);
    dp_device_free(dev, d_a);
    dp_device_free(dev, d_a2);
    dp_device_free(dev, d_b);
    dp_device_free(dev, d_out);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

/* Backward with da and/or db given; both start nonzero and must gain dout. */
static void check_backward(int with_da, int with_db)
{
    dp_device *dev = dp_test_cpu(0);
    dp_rng rng;
    dp_rng_seed(&rng, 62);
    float da0[NE], db0[NE], dout[NE];
    dp_rng_fill_uniform(&rng, da0, NE, -5.0f, 5.0f);
    dp_rng_fill_uniform(&rng, db0, NE, -5.0f, 5.0f);
    dp_rng_fill_normal(&rng, dout, NE, 0.0f, 1.0f);
    float *d_da = dp_test_upload(dev, da0, NE), *d_db = dp_test_upload(dev, db0, NE);
    float *d_dout = dp_test_upload(dev, dout, NE);
    dp_assert_ok(dp_residual_backward(dev, with_da ? d_da : NULL, with_db ? d_db : NULL, d_dout,
                                      NE));
    float *da = dp_test_nn_download(dev, d_da, NE), *db = dp_test_nn_download(dev, d_db, NE);
    if (with_da)
        assert_sum(da, da0, dout, NE);
    else
        cr_assert(memcmp(da, da0, sizeof da0) == 0, "da changed although NULL was passed");
    if (with_db)
        assert_sum(db, db0, dout, NE);
    else
        cr_assert(memcmp(db, db0, sizeof db0) == 0, "db changed although NULL was passed");
    float *dout_after = dp_test_nn_download(dev, d_dout, NE);
    cr_assert(memcmp(dout_after, dout, sizeof dout) == 0, "dout was modified");
    free(da);
    free(db);
    free(dout_after);
    dp_device_free(dev, d_da);
    dp_device_free(dev, d_db);
    dp_device_free(dev, d_dout);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

Test(residual, backward_accumulates_into_both) { check_backward(1, 1); }
Test(residual, backward_null_da) { check_backward(0, 1); }
Test(residual, backward_null_db) { check_backward(1, 0); }
Test(residual, backward_both_null_is_a_no_op) { check_backward(0, 0); }

Test(accumulate, adds_src_to_dst)
{
    dp_device *dev = dp_test_cpu(0);
    dp_rng rng;
    dp_rng_seed(&rng, 63);
    float dst0[NE], src[NE];
    dp_rng_fill_uniform(&rng, dst0, NE, -5.0f, 5.0f);
    dp_rng_fill_normal(&rng, src, NE, 0.0f, 1.0f);
    float *d_dst = dp_test_upload(dev, dst0, NE), *d_src = dp_test_upload(dev, src, NE);
    dp_assert_ok(dp_accumulate(dev, d_dst, d_src, NE));
    float *dst = dp_test_nn_download(dev, d_dst, NE);
    assert_sum(dst, dst0, src, NE);
    /* A second call adds again (no reset between calls). */
    dp_assert_ok(dp_accumulate(dev, d_dst, d_src, NE));
    float *dst2 = dp_test_nn_download(dev, d_dst, NE);
    assert_sum(dst2, dst, src, NE);
    free(dst);
    free(dst2);
    dp_device_free(dev, d_dst);
    dp_device_free(dev, d_src);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

Test(residual, bad_arguments)
{
    dp_device *dev = dp_test_cpu(0);
    float *f = dp_test_nn_filled(dev, 8, 0.0f);
    dp_test_nn_assert_invalid(dp_residual_forward(NULL, f, f, f, 8), "dev", NULL);
    dp_test_nn_assert_invalid(dp_residual_forward(dev, NULL, f, f, 8), "out", "cpu:0");
    dp_test_nn_assert_invalid(dp_residual_forward(dev, f, NULL, f, 8), "a must", NULL);
    dp_test_nn_assert_invalid(dp_residual_forward(dev, f, f, NULL, 8), "b must", NULL);
    dp_test_nn_assert_invalid(dp_residual_forward(dev, f, f, f, 0), "n must be > 0",
                      "dp_residual_forward");
    dp_test_nn_assert_invalid(dp_residual_backward(NULL, f, f, f, 8), "dev", NULL);
    dp_test_nn_assert_invalid(dp_residual_backward(dev, f, f, NULL, 8), "dout", "dp_residual_backward");
    dp_test_nn_assert_invalid(dp_residual_backward(dev, f, f, f, 0), "n must be > 0", NULL);
    dp_test_nn_assert_invalid(dp_accumulate(NULL, f, f, 8), "dev", NULL);
    dp_test_nn_assert_invalid(dp_accumulate(dev, NULL, f, 8), "dst", "dp_accumulate");
    dp_test_nn_assert_invalid(dp_accumulate(dev, f, NULL, 8), "src", "cpu:0");
    dp_test_nn_assert_invalid(dp_accumulate(dev, f, f, 0), "n must be > 0", NULL);
    dp_test_nn_assert_invalid(dp_accumulate(dev, f, f, SIZE_MAX / 2), "overflow", NULL);
    dp_device_free(dev, f);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}
