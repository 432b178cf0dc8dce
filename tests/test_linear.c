/* Linear layer: forward with and without bias, backward (dinp overwritten,
 * dweight and dbias accumulated, NULL dinp / dbias skipped) against float64
 * references, plus bad arguments. Shapes are non-square so a transposed
 * GEMM argument cannot pass. The bfloat16 producers (nn/nn_act16.h): the
 * forward with a bfloat16 output, the backward that rounds dout once and
 * the one that writes a bfloat16 dinp, bit for bit the compositions they
 * replace; their bad arguments. */
#include "backend/backend.h" /* dev->ops */
#include "backend/device_testing.h"
#include "kernels/colsum.h" /* DP_COL_CHUNK */
#include "kernels/gelu.h"
#include "kernels/linear.h"
#include "nn/nn_act16.h"
#include "nn_test_util.h"

typedef struct lin_case {
    size_t N, C, OC;
    float *inp, *weight, *bias, *dout, *dweight0, *dbias0; /* host */
} lin_case;

static lin_case make_case(uint64_t seed, size_t N, size_t C, size_t OC)
{
    lin_case k = {N, C, OC, NULL, NULL, NULL, NULL, NULL, NULL};
    dp_rng rng;
    dp_rng_seed(&rng, seed);
    k.inp = malloc(N * C * sizeof(float));
    k.weight = malloc(OC * C * sizeof(float));
    k.bias = malloc(OC * sizeof(float));
    k.dout = malloc(N * OC * sizeof(float));
    k.dweight0 = malloc(OC * C * sizeof(float));
    k.dbias0 = malloc(OC * sizeof(float));
    cr_assert(k.inp && k.weight && k.bias && k.dout && k.dweight0 && k.dbias0);
    dp_rng_fill_normal(&rng, k.inp, N * C, 0.0f, 1.0f);
    dp_rng_fill_normal(&rng, k.weight, OC * C, 0.0f, 1.0f);
    dp_rng_fill_normal(&rng, k.bias, OC, 0.0f, 1.0f);
    dp_rng_fill_normal(&rng, k.dout, N * OC, 0.0f, 1.0f);
    /* Nonzero initial gradients: the backward must add to them. */
    dp_rng_fill_uniform(&rng, k.dweight0, OC * C, -3.0f, 3.0f);
    dp_rng_fill_uniform(&rng, k.dbias0, OC, -3.0f, 3.0f);
    return k;
}

static void free_case(lin_case *k)
{
    free(k->inp);
    free(k->weight);
    free(k->bias);
    free(k->dout);
    free(k->dweight0);
    free(k->dbias0);
}

static double *to_double(const float *x, size_t n)
{
    double *d = malloc(n * sizeof *d);
    cr_assert_not_null(d);
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

static void check_forward(uint64_t seed, size_t N, size_t C, size_t OC, int with_bias)
{
    dp_device *dev = dp_test_cpu(0);
    lin_case k = make_case(seed, N, C, OC);
    float *d_inp = dp_test_upload(dev, k.inp, N * C);
    float *d_w = dp_test_upload(dev, k.weight, OC * C);
    float *d_b = dp_test_upload(dev, k.bias, OC);
    /* NaN garbage in out: without a bias the GEMM runs with beta = 0 and
     * must overwrite it rather than propagate it. */
    float *d_out = dp_test_nn_filled(dev, N * OC, NAN);
    dp_assert_ok(dp_linear_forward(dev, d_out, d_inp, d_w, with_bias ? d_b : NULL, N, C, OC));

    double *ref = malloc(N * OC * sizeof *ref);
    for (size_t n = 0; n < N; n++)
        for (size_t o = 0; o < OC; o++) {
            double s = with_bias ? (double)k.bias[o] : 0.0;
            for (size_t c = 0; c < C; c++) s += (double)k.inp[n * C + c] * k.weight[o * C + c];
            ref[n * OC + o] = s;
        }
    float *out = dp_test_nn_download(dev, d_out, N * OC);
    double *outd = to_double(out, N * OC);
    /* A float dot product of C terms of size ~1 (sum ~sqrt(C)): error about
     * C * 2^-24 * sqrt(C); 1e-5 * sqrt(C) covers C <= 100 with margin. */
    double tol = 1e-5 * sqrt((double)C);
    dp_assert_allclose(outd, ref, N * OC, tol, 1e-5);

    free(ref);
    free(out);
    free(outd);
    dp_device_free(dev, d_inp);
    dp_device_free(dev, d_w);
    dp_device_free(dev, d_b);
    dp_device_free(dev, d_out);
    dp_test_nn_assert_all_freed(dev);
    free_case(&k);
    dp_device_close(dev);
}

Test(linear, forward_with_bias) { check_forward(11, 6, 9, 5, 1); }
Test(linear, forward_without_bias) { check_forward(12, 6, 9, 5, 0); }
Test(linear, forward_larger_shapes) { check_forward(13, 37, 64, 96, 1); }
Test(linear, forward_single_row_and_column) { check_forward(14, 1, 1, 3, 1); }

/* Runs the backward with the given optional outputs and compares dinp,
 * dweight and dbias with their float64 definitions:
 *   dinp = dout @ W,  dweight = dweight0 + dout^T @ inp,  dbias = dbias0 + sum_n dout. */
static void check_backward(uint64_t seed, size_t N, size_t C, size_t OC, int want_dinp,
                           int want_dbias)
{
    dp_device *dev = dp_test_cpu(0);
    lin_case k = make_case(seed, N, C, OC);
    float *d_inp = dp_test_upload(dev, k.inp, N * C);
    float *d_w = dp_test_upload(dev, k.weight, OC * C);
    float *d_dout = dp_test_upload(dev, k.dout, N * OC);
    float *d_dw = dp_test_upload(dev, k.dweight0, OC * C);
    float *d_db = dp_test_upload(dev, k.dbias0, OC);
    /* dinp is overwritten (beta = 0): NaN garbage must not survive. */
    float *d_dinp = dp_test_nn_filled(dev, N * C, NAN);
    dp_assert_ok(dp_linear_backward(dev, want_dinp ? d_dinp : NULL, d_dw,
                                    want_dbias ? d_db : NULL, d_dout, d_inp, d_w, N, C, OC));

    double *ref_dinp = calloc(N * C, sizeof(double));
    double *ref_dw = to_double(k.dweight0, OC * C);
    double *ref_db = to_double(k.dbias0, OC);
    for (size_t n = 0; n < N; n++)
        for (size_t o = 0; o < OC; o++) {
            double g = k.dout[n * OC + o];
            for (size_t c = 0; c < C; c++) {
                ref_dinp[n * C + c] += g * k.weight[o * C + c];
                ref_dw[o * C + c] += g * k.inp[n * C + c];
            }
            if (want_dbias) ref_db[o] += g;
        }
    /* Float sums of OC (dinp) or N (dweight, dbias) products of size ~1,
     * on top of an initial value up to 3: bounded as in check_forward. */
    size_t K = N > OC ? N : OC;
    double tol = 1e-5 * sqrt((double)K) + 1e-6;
    float *dw = dp_test_nn_download(dev, d_dw, OC * C), *db = dp_test_nn_download(dev, d_db, OC);
    double *dwd = to_double(dw, OC * C), *dbd = to_double(db, OC);
    dp_assert_allclose(dwd, ref_dw, OC * C, tol, 1e-5);
    dp_assert_allclose(dbd, ref_db, OC, tol, 1e-5);
    float *dinp = dp_test_nn_download(dev, d_dinp, N * C);
    if (want_dinp) {
        double *dinpd = to_double(dinp, N * C);
        dp_assert_allclose(dinpd, ref_dinp, N * C, tol, 1e-5);
        free(dinpd);
    } else {
        for (size_t i = 0; i < N * C; i++)
            cr_assert(isnan(dinp[i]), "dinp was written although NULL was passed for it");
    }
    if (!want_dbias)
        cr_assert(memcmp(db, k.dbias0, OC * sizeof(float)) == 0,
                  "the bias buffer changed although NULL was passed for dbias");

    free(ref_dinp);
    free(ref_dw);
    free(ref_db);
    free(dw);
    free(db);
    free(dwd);
    free(dbd);
    free(dinp);
    dp_device_free(dev, d_inp);
    dp_device_free(dev, d_w);
    dp_device_free(dev, d_dout);
    dp_device_free(dev, d_dw);
    dp_device_free(dev, d_db);
    dp_device_free(dev, d_dinp);
    dp_test_nn_assert_all_freed(dev);
    free_case(&k);
    dp_device_close(dev);
}

Test(linear, backward_all_gradients) { check_backward(21, 6, 9, 5, 1, 1); }
Test(linear, backward_null_dinp) { check_backward(22, 6, 9, 5, 0, 1); }
Test(linear, backward_null_dbias) { check_backward(23, 6, 9, 5, 1, 0); }
Test(linear, backward_larger_shapes) { check_backward(24, 37, 64, 96, 1, 1); }

/* L(x, w, b) = sum_{n,o} dout[n,o] * (b[o] + sum_c x[n,c] w[o,c]), float64. */
static double lin_loss(const double *x, const double *w, const double *b, const float *dout,
                       size_t N, size_t C, size_t OC)
{
    double L = 0.0;
    for (size_t n = 0; n < N; n++)
        for (size_t o = 0; o < OC; o++) {
            double s = b[o];
            for (size_t c = 0; c < C; c++) s += x[n * C + c] * w[o * C + c];
            L += dout[n * OC + o] * s;
        }
    return L;
}

/* The analytic gradient above is checked once against central finite
 * differences of L = sum(out * dout), the forward in float64, so that the
 * reference itself (not only the kernel) is tied to the forward. */
Test(linear, backward_matches_finite_differences)
{
    const size_t N = 4, C = 5, OC = 3;
    dp_device *dev = dp_test_cpu(0);
    lin_case k = make_case(31, N, C, OC);
    float *d_inp = dp_test_upload(dev, k.inp, N * C), *d_w = dp_test_upload(dev, k.weight, OC * C);
    float *d_dout = dp_test_upload(dev, k.dout, N * OC);
    float *d_dw = dp_test_nn_filled(dev, OC * C, 0.0f), *d_db = dp_test_nn_filled(dev, OC, 0.0f);
    float *d_dinp = dp_test_nn_filled(dev, N * C, 0.0f);
    dp_assert_ok(dp_linear_backward(dev, d_dinp, d_dw, d_db, d_dout, d_inp, d_w, N, C, OC));
    float *dinp = dp_test_nn_download(dev, d_dinp, N * C), *dw = dp_test_nn_download(dev, d_dw, OC * C);
    float *db = dp_test_nn_download(dev, d_db, OC);

    double x[4 * 5], w[3 * 5], b[3];
    for (size_t i = 0; i < N * C; i++) x[i] = k.inp[i];
    for (size_t i = 0; i < OC * C; i++) w[i] = k.weight[i];
    for (size_t i = 0; i < OC; i++) b[i] = k.bias[i];
    const double h = 1e-4;
    double *ps[3] = {x, w, b};
    const float *got[3] = {dinp, dw, db};
    size_t sizes[3] = {N * C, OC * C, OC};
    for (int p = 0; p < 3; p++) {
        double fd[20], g[20];
        for (size_t i = 0; i < sizes[p]; i++) {
            double keep = ps[p][i];
            ps[p][i] = keep + h;
            double lp = lin_loss(x, w, b, k.dout, N, C, OC);
            ps[p][i] = keep - h;
            double lm = lin_loss(x, w, b, k.dout, N, C, OC);
            ps[p][i] = keep;
            fd[i] = (lp - lm) / (2 * h);
            g[i] = got[p][i];
        }
        /* L is linear in each parameter, so the central difference is exact
         * up to float64 rounding (~1e-12); the kernel's float error is ~1e-6. */
        dp_assert_allclose(g, fd, sizes[p], 1e-5, 1e-5);
    }
    free(dinp);
    free(dw);
    free(db);
    dp_device_free(dev, d_inp);
    dp_device_free(dev, d_w);
    dp_device_free(dev, d_dout);
    dp_device_free(dev, d_dw);
    dp_device_free(dev, d_db);
    dp_device_free(dev, d_dinp);
    free_case(&k);
    dp_device_close(dev);
}

Test(linear, bad_arguments)
{
    dp_device *dev = dp_test_cpu(0);
    float *buf = dp_test_nn_filled(dev, 64, 0.0f);
    dp_test_nn_assert_invalid(dp_linear_forward(NULL, buf, buf, buf, buf, 2, 3, 4), "dev", NULL);
    dp_test_nn_assert_invalid(dp_linear_forward(dev, NULL, buf, buf, buf, 2, 3, 4), "out", "cpu:0");
    dp_test_nn_assert_invalid(dp_linear_forward(dev, buf, NULL, buf, buf, 2, 3, 4), "inp", NULL);
    dp_test_nn_assert_invalid(dp_linear_forward(dev, buf, buf, NULL, buf, 2, 3, 4), "weight", NULL);
    dp_test_nn_assert_invalid(dp_linear_forward(dev, buf, buf, buf, buf, 0, 3, 4), "N=0",
                      "dp_linear_forward");
    dp_test_nn_assert_invalid(dp_linear_forward(dev, buf, buf, buf, buf, 2, 0, 4), "C=0", NULL);
    dp_test_nn_assert_invalid(dp_linear_forward(dev, buf, buf, buf, buf, 2, 3, 0), "OC=0", NULL);
    dp_test_nn_assert_invalid(dp_linear_forward(dev, buf, buf, buf, buf, SIZE_MAX / 2, 3, 4),
                      "overflow", NULL);
    /* Fits size_t but not the GEMM's int sizes. */
    dp_test_nn_assert_invalid(dp_linear_forward(dev, buf, buf, buf, buf, 1, (size_t)1 << 31, 1),
                      "INT_MAX", NULL);
    dp_test_nn_assert_invalid(dp_linear_backward(NULL, buf, buf, buf, buf, buf, buf, 2, 3, 4), "dev",
                      NULL);
    dp_test_nn_assert_invalid(dp_linear_backward(dev, buf, NULL, buf, buf, buf, buf, 2, 3, 4),
                      "dweight", "dp_linear_backward");
    dp_test_nn_assert_invalid(dp_linear_backward(dev, buf, buf, buf, NULL, buf, buf, 2, 3, 4), "dout",
                      NULL);
    dp_test_nn_assert_invalid(dp_linear_backward(dev, buf, buf, buf, buf, NULL, buf, 2, 3, 4), "inp",
                      NULL);
    dp_test_nn_assert_invalid(dp_linear_backward(dev, buf, buf, buf, buf, buf, NULL, 2, 3, 4),
                      "weight", NULL);
    dp_test_nn_assert_invalid(dp_linear_backward(dev, buf, buf, buf, buf, buf, buf, 2, 3, 0), "OC=0",
                      NULL);
    dp_device_free(dev, buf);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

/* dbias is a column reduction over the N rows, summed in the two-stage
 * order of kernels/colsum.h (row chunks of DP_COL_CHUNK, then the chunk
 * partials in order), the order the GPU uses too. N = 2 chunks + 37 rows,
 * OC = 70 (more than one 64-wide CPU tile): bit for bit equal to that
 * order emulated in float, and to float64 within float rounding. */
#define BR (2 * 256 + 37)
#define BOC 70
Test(linear, bias_gradient_chunked_order_and_float64)
{
    cr_assert_eq(DP_COL_CHUNK, 256, "the test's sizes assume 256-row chunks");
    dp_device *dev = dp_test_cpu(0);
    dp_rng rng;
    dp_rng_seed(&rng, 78);
    static float g[BR * BOC], x[BR * 3], w[BOC * 3], db0[BOC];
    dp_rng_fill_normal(&rng, g, BR * BOC, 0.1f, 1.0f);
    dp_rng_fill_normal(&rng, x, BR * 3, 0.0f, 1.0f);
    dp_rng_fill_normal(&rng, w, BOC * 3, 0.0f, 1.0f);
    dp_rng_fill_normal(&rng, db0, BOC, 0.0f, 1.0f);
    float *d_g = dp_test_upload(dev, g, BR * BOC), *d_x = dp_test_upload(dev, x, BR * 3);
    float *d_w = dp_test_upload(dev, w, BOC * 3), *d_db = dp_test_upload(dev, db0, BOC);
    float *d_dw = dp_test_nn_filled(dev, BOC * 3, 0.0f);
    dp_assert_ok(dp_linear_backward(dev, NULL, d_dw, d_db, d_g, d_x, d_w, BR, 3, BOC));
    float *db = dp_test_nn_download(dev, d_db, BOC);
    double ref[BOC], got[BOC];
    for (size_t o = 0; o < BOC; o++) {
        double s = 0.0;
        float total = 0.0f;
        for (size_t n0 = 0; n0 < BR; n0 += 256) {
            float part = 0.0f;
            for (size_t n = n0; n < BR && n < n0 + 256; n++) {
                part += g[n * BOC + o];
                s += g[n * BOC + o];
            }
            total += part;
        }
        cr_assert(db[o] == db0[o] + total, "dbias[%zu] = %.9g, the chunked order gives %.9g", o,
                  (double)db[o], (double)(db0[o] + total));
        ref[o] = db0[o] + s;
        got[o] = db[o];
    }
    dp_assert_allclose(got, ref, BOC, 2e-4, 1e-5);
    free(db);
    void *bufs[] = {d_g, d_x, d_w, d_db, d_dw};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) dp_device_free(dev, bufs[i]);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

/* The bias gradient that also rounds dout (a linear backward in BF16
 * math reads its float32 dout once): the same sums as without, dout16
 * cast_f32_bf16's bits. The same N (three chunks, one partial) and OC
 * (two CPU tiles). The GPU's kernels give both bit for bit:
 * test_cuda_colsum_emu runs them here. */
Test(linear, bias_gradient_rounding_dout_in_the_same_pass)
{
    dp_device *dev = dp_test_cpu(0);
    dp_rng rng;
    dp_rng_seed(&rng, 79);
    static float g[BR * BOC], db0[BOC];
    static dp_bf16 r16[BR * BOC];
    dp_rng_fill_normal(&rng, g, BR * BOC, 0.1f, 1.0f);
    dp_rng_fill_normal(&rng, db0, BOC, 0.0f, 1.0f);
    float *d_g = dp_test_upload(dev, g, BR * BOC), *a = dp_test_upload(dev, db0, BOC),
          *b = dp_test_upload(dev, db0, BOC);
    void *d16 = NULL;
    dp_assert_ok(dp_device_alloc(dev, sizeof r16, &d16));
    dp_assert_ok(dev->ops->bias_backward(dev, a, NULL, dp_pref_f32(d_g), BR, BOC));
    dp_assert_ok(dev->ops->bias_backward(dev, b, d16, dp_pref_f32(d_g), BR, BOC));
    float *ha = dp_test_nn_download(dev, a, BOC), *hb = dp_test_nn_download(dev, b, BOC);
    dp_assert_ok(dp_copy_d2h(dev, r16, d16, sizeof r16));
    cr_assert(memcmp(ha, hb, sizeof(float) * BOC) == 0, "the sums differ when dout is rounded");
    for (size_t i = 0; i < BR * BOC; i++)
        cr_assert_eq(r16[i], dp_bf16_round(g[i]), "dout16[%zu] = %#06x, the cast gives %#06x", i,
                     r16[i], dp_bf16_round(g[i]));
    free(ha), free(hb);
    void *bufs[] = {d_g, a, b, d16};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) dp_device_free(dev, bufs[i]);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

// --- the bfloat16 producers (nn/nn_act16.h) ----------------------------------------------

/* A device copy of n host floats: as float32 (b16 0) or rounded to
 * bfloat16 by dp_convert. */
static void *upload_as(dp_device *dev, const float *h, size_t n, int b16)
{
    float *f = dp_test_upload(dev, h, n);
    if (!b16) return f;
    void *b = NULL;
    dp_assert_ok(dp_device_alloc(dev, n * sizeof(dp_bf16), &b));
    dp_assert_ok(dp_convert(dev, b, DP_DTYPE_BF16, f, DP_DTYPE_F32, n));
    dp_device_free(dev, f);
    return b;
}

/* The typed combinations the public layers have: (input, parameters)
 * float32 and float32, float32 and bfloat16, bfloat16 and bfloat16. */
static const int COMBOS[3][2] = {{0, 0}, {0, 1}, {1, 1}};

static dp_status public_forward(dp_device *d, float *out, const void *x, int x16, const void *w,
                                const void *b, int w16, size_t N, size_t C, size_t OC)
{
    if (x16) return dp_linear_forward_bf16_inp(d, out, x, w, b, N, C, OC);
    return w16 ? dp_linear_forward_bf16(d, out, x, w, b, N, C, OC)
               : dp_linear_forward(d, out, x, w, b, N, C, OC);
}

static dp_status public_backward(dp_device *d, float *dx, float *dw, float *db, const float *g,
                                 const void *x, int x16, const void *w, int w16, size_t N,
                                 size_t C, size_t OC)
{
    if (x16) return dp_linear_backward_bf16_inp(d, dx, dw, db, g, x, w, N, C, OC);
    return w16 ? dp_linear_backward_bf16(d, dx, dw, db, g, x, w, N, C, OC)
               : dp_linear_backward(d, dx, dw, db, g, x, w, N, C, OC);
}

/* dp_linear_forward_out16 against the float32 layer of dp/nn.h followed by
 * dp_convert, bit for bit: every typed combination, with and without
 * bias, in FP32 and BF16 math, through the producer and through the test
 * hook's composition, the scratch holding all N*OC floats (one piece: the
 * same calls). With a scratch of 7 rows (blocks of 7, ..., 2 rows) each
 * block is the float32 layer on its rows, but BLAS kernels group an
 * output's sums by how many columns the call has (OpenBLAS's edge
 * kernels: measured, at most 1 of the 3552 outputs 1 bfloat16 ulp
 * apart), so the blocks are checked deterministic and within one
 * bfloat16 ulp (2^-7 relative; the float32 difference is far less) of
 * the whole. */
Test(linear, bf16_output_is_the_float32_layer_rounded)
{
    enum { N = 37, C = 64, OC = 96 };
    dp_device *dev = dp_test_cpu(0);
    lin_case k = make_case(31, N, C, OC);
    float *scratch = dp_test_nn_filled(dev, N * OC, NAN);
    float *ref = dp_test_nn_filled(dev, N * OC, NAN);
    void *ref16 = NULL, *out16 = NULL;
    dp_assert_ok(dp_device_alloc(dev, N * OC * sizeof(dp_bf16), &ref16));
    dp_assert_ok(dp_device_alloc(dev, N * OC * sizeof(dp_bf16), &out16));
    static dp_bf16 want[N * OC], got[N * OC];
    for (int cb = 0; cb < 3; cb++)
        for (int prec = 0; prec < 2; prec++)
            for (int with_bias = 0; with_bias < 2; with_bias++) {
                int x16 = COMBOS[cb][0], w16 = COMBOS[cb][1];
                dp_assert_ok(dp_device_set_matmul_precision(dev, prec ? DP_MATMUL_BF16
                                                                      : DP_MATMUL_FP32));
                void *x = upload_as(dev, k.inp, N * C, x16);
                void *w = upload_as(dev, k.weight, OC * C, w16);
                void *b = with_bias ? upload_as(dev, k.bias, OC, w16) : NULL;
                dp_assert_ok(public_forward(dev, ref, x, x16, w, b, w16, N, C, OC));
                dp_assert_ok(dp_convert(dev, ref16, DP_DTYPE_BF16, ref, DP_DTYPE_F32, N * OC));
                dp_assert_ok(dp_copy_d2h(dev, want, ref16, sizeof want));
                dp_pref pw = w16 ? dp_pref_bf16(w) : dp_pref_f32(w);
                dp_pref pb = w16 ? dp_pref_bf16(b) : dp_pref_f32(b);
                for (int run = 0; run < 4; run++) { /* producer, hook, blocks twice */
                    dp_device_set_fused_producers(dev, run != 1);
                    size_t sf = run >= 2 ? 7 * OC : N * OC;
                    static dp_bf16 blocks[N * OC];
                    dp_assert_ok(dp_memset(dev, out16, 0xff, sizeof got));
                    dp_assert_ok(dp_linear_forward_out16(dev, out16, scratch, sf, x,
                                                         x16 ? DP_DTYPE_BF16 : DP_DTYPE_F32, pw,
                                                         pb, N, C, OC));
                    dp_assert_ok(dp_copy_d2h(dev, got, out16, sizeof got));
                    if (run == 3) {
                        cr_assert(memcmp(got, blocks, sizeof got) == 0, "blocks: not repeatable");
                        continue;
                    }
                    if (run == 2) {
                        memcpy(blocks, got, sizeof got);
                        static double a[N * OC], e[N * OC];
                        for (size_t i = 0; i < (size_t)N * OC; i++) {
                            a[i] = dp_bf16_to_float(got[i]);
                            e[i] = dp_bf16_to_float(want[i]);
                        }
                        dp_assert_allclose(a, e, (size_t)N * OC, 1e-30, 1.0 / 128);
                        continue;
                    }
                    for (size_t i = 0; i < (size_t)N * OC; i++)
                        cr_assert(got[i] == want[i], "x16 %d w16 %d prec %d bias %d run %d: "
                                  "out[%zu] = %#06x, the rounded float32 layer %#06x", x16, w16,
                                  prec, with_bias, run, i, got[i], want[i]);
                }
                dp_device_set_fused_producers(dev, 1);
                dp_device_free(dev, x);
                dp_device_free(dev, w);
                if (b) dp_device_free(dev, b);
            }
    void *bufs[] = {scratch, ref, ref16, out16};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) dp_device_free(dev, bufs[i]);
    free_case(&k);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

/* The fused forward (the backend's gemm_bias_out: oneDNN's matmul with the
 * bias and a bfloat16 output on CPU devices) on long sums, where the GEMM
 * kernel splits K into blocks: bit for bit the composition (bias
 * broadcast, GEMM with beta = 1, conversion), for float32 and bfloat16
 * outputs, with and without bias; and near the float64 product of the
 * bfloat16 operands (sums in float32 of C terms ~1: |error| about
 * C 2^-24 sqrt(C), under 2e-3 at C = 1536, plus half a bfloat16 ulp of
 * the output when it is rounded). */
Test(linear, bf16_epilogue_on_long_sums_is_the_composition)
{
    enum { N = 67, C = 1536, OC = 200 };
    dp_device *dev = dp_test_cpu(0);
    dp_assert_ok(dp_device_set_matmul_precision(dev, DP_MATMUL_BF16));
    lin_case k = make_case(41, N, C, OC);
    void *x = upload_as(dev, k.inp, N * C, 1), *w = upload_as(dev, k.weight, OC * C, 1),
         *b = upload_as(dev, k.bias, OC, 1);
    /* the float64 reference on the bfloat16 operands' values */
    static dp_bf16 hx[N * C], hw[OC * C], hb[OC];
    dp_assert_ok(dp_copy_d2h(dev, hx, x, sizeof hx));
    dp_assert_ok(dp_copy_d2h(dev, hw, w, sizeof hw));
    dp_assert_ok(dp_copy_d2h(dev, hb, b, sizeof hb));
    static double ref[2][N * OC];
    for (size_t n = 0; n < N; n++)
        for (size_t o = 0; o < OC; o++) {
            double s = 0.0;
            for (size_t c = 0; c < C; c++)
                s += (double)dp_bf16_to_float(hx[n * C + c]) * dp_bf16_to_float(hw[o * C + c]);
            ref[0][n * OC + o] = s;
            ref[1][n * OC + o] = s + dp_bf16_to_float(hb[o]);
        }
    float *out = dp_test_nn_filled(dev, N * OC, NAN), *scratch = dp_test_nn_filled(dev, N * OC, NAN);
    void *out16 = NULL;
    dp_assert_ok(dp_device_alloc(dev, N * OC * sizeof(dp_bf16), &out16));
    static float got[2][N * OC];
    static dp_bf16 got16[2][N * OC];
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        for (int fused = 1; fused >= 0; fused--) {
            dp_device_set_fused_producers(dev, fused);
            dp_assert_ok(dp_linear_forward_bf16_inp(dev, out, x, w, with_bias ? b : NULL, N, C, OC));
            dp_assert_ok(dp_copy_d2h(dev, got[fused], out, sizeof got[fused]));
            dp_assert_ok(dp_linear_forward_out16(dev, out16, scratch, N * OC, x, DP_DTYPE_BF16,
                                                 dp_pref_bf16(w),
                                                 dp_pref_bf16(with_bias ? b : NULL), N, C, OC));
            dp_assert_ok(dp_copy_d2h(dev, got16[fused], out16, sizeof got16[fused]));
        }
        dp_device_set_fused_producers(dev, 1);
        cr_assert(memcmp(got[0], got[1], sizeof got[0]) == 0,
                  "bias %d: the fused float32 output differs from the composition", with_bias);
        cr_assert(memcmp(got16[0], got16[1], sizeof got16[0]) == 0,
                  "bias %d: the fused bfloat16 output differs from the composition", with_bias);
        for (size_t i = 0; i < (size_t)N * OC; i++) {
            double e = ref[with_bias][i];
            cr_assert(fabs(got[1][i] - e) <= 2e-3, "bias %d: out[%zu] = %.9g, float64 %.9g",
                      with_bias, i, (double)got[1][i], e);
            cr_assert(fabs(dp_bf16_to_float(got16[1][i]) - e) <= 2e-3 + fabs(e) / 256,
                      "bias %d: out16[%zu] = %.9g, float64 %.9g", with_bias, i,
                      (double)dp_bf16_to_float(got16[1][i]), e);
        }
    }
    void *bufs[] = {x, w, b, out, scratch, out16};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) dp_device_free(dev, bufs[i]);
    free_case(&k);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

/* dp_linear_backward_dout16 against the backward of dp/nn.h, bit for bit
 * (dinp, dweight and dbias, accumulating onto nonzero gradients; dinp or
 * dbias NULL): every typed combination, in FP32 and BF16 math, with and
 * without oneDNN, and through the test hook. In BF16 math dout16 then
 * holds dout's rounding (the path was taken); in FP32 it is untouched.
 * Nothing is cut into GEMM pieces at these sizes (dout's 37 x 96
 * bfloat16 are far below the 16 MiB conversion cap). */
Test(linear, backward_rounding_dout_once_is_bitwise_the_same)
{
    enum { N = 37, C = 64, OC = 96 };
    dp_device *dev = dp_test_cpu(0);
    lin_case k = make_case(32, N, C, OC);
    float *g = dp_test_upload(dev, k.dout, N * OC);
    void *g16 = NULL, *want16 = NULL;
    dp_assert_ok(dp_device_alloc(dev, N * OC * sizeof(dp_bf16), &g16));
    dp_assert_ok(dp_device_alloc(dev, N * OC * sizeof(dp_bf16), &want16));
    dp_assert_ok(dp_convert(dev, want16, DP_DTYPE_BF16, g, DP_DTYPE_F32, N * OC));
    static dp_bf16 h16[N * OC], hw16[N * OC];
    dp_assert_ok(dp_copy_d2h(dev, hw16, want16, sizeof hw16));
    for (int cb = 0; cb < 3; cb++)
        for (int run = 0; run < 8; run++) {
            int x16 = COMBOS[cb][0], w16 = COMBOS[cb][1], prec = run & 1, dnnl = run >> 1 & 1,
                hook = run >> 2 & 1;
            dp_assert_ok(dp_device_set_matmul_precision(dev, prec ? DP_MATMUL_BF16
                                                                  : DP_MATMUL_FP32));
            dp_device_set_gemm_dnnl(dev, dnnl);
            void *x = upload_as(dev, k.inp, N * C, x16);
            void *w = upload_as(dev, k.weight, OC * C, w16);
            for (int nulls = 0; nulls < 3; nulls++) { /* all; dinp NULL; dbias NULL */
                float *got[3], *want[3];
                for (int pass = 0; pass < 2; pass++) {
                    float *dx = nulls == 1 ? NULL : dp_test_nn_filled(dev, N * C, NAN);
                    float *dw = dp_test_upload(dev, k.dweight0, OC * C);
                    float *db = nulls == 2 ? NULL : dp_test_upload(dev, k.dbias0, OC);
                    if (pass == 0) {
                        dp_assert_ok(public_backward(dev, dx, dw, db, g, x, x16, w, w16, N, C, OC));
                    } else {
                        dp_device_set_fused_producers(dev, !hook);
                        dp_assert_ok(dp_memset(dev, g16, 0xff, sizeof h16));
                        dp_assert_ok(dp_linear_backward_dout16(
                            dev, dx, dw, db, g, g16, x, x16 ? DP_DTYPE_BF16 : DP_DTYPE_F32,
                            w16 ? dp_pref_bf16(w) : dp_pref_f32(w), N, C, OC));
                        dp_device_set_fused_producers(dev, 1);
                        dp_assert_ok(dp_copy_d2h(dev, h16, g16, sizeof h16));
                        for (size_t i = 0; i < (size_t)N * OC; i++)
                            cr_assert(h16[i] == (prec && !hook ? hw16[i] : 0xffff),
                                      "run %d: dout16[%zu] = %#06x", run, i, h16[i]);
                    }
                    float **to = pass ? got : want;
                    to[0] = dx ? dp_test_nn_download(dev, dx, N * C) : NULL;
                    to[1] = dp_test_nn_download(dev, dw, OC * C);
                    to[2] = db ? dp_test_nn_download(dev, db, OC) : NULL;
                    if (dx) dp_device_free(dev, dx);
                    dp_device_free(dev, dw);
                    if (db) dp_device_free(dev, db);
                }
                size_t sizes[3] = {N * C, OC * C, OC};
                static const char *names[3] = {"dinp", "dweight", "dbias"};
                for (int t = 0; t < 3; t++) {
                    cr_assert((got[t] == NULL) == (want[t] == NULL));
                    if (got[t])
                        cr_assert(memcmp(got[t], want[t], sizes[t] * sizeof(float)) == 0,
                                  "x16 %d w16 %d run %d nulls %d: %s differs", x16, w16, run,
                                  nulls, names[t]);
                    free(got[t]);
                    free(want[t]);
                }
            }
            dp_device_free(dev, x);
            dp_device_free(dev, w);
        }
    dp_device_set_gemm_dnnl(dev, 1);
    dp_device_free(dev, g);
    dp_device_free(dev, g16);
    dp_device_free(dev, want16);
    free_case(&k);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

/* dp_linear_backward_to16: dinp16 is dp_linear_backward_dout16's float32
 * dinp rounded once, and dweight, dbias and dout16 are its, bit for bit:
 * every typed combination, in FP32 and BF16 math, with and without oneDNN
 * (which then writes dinp16 itself), and through the test hook. */
Test(linear, backward_to_bf16_dinp_is_the_float32_dinp_rounded)
{
    enum { N = 29, C = 48, OC = 80 };
    dp_device *dev = dp_test_cpu(0);
    lin_case k = make_case(33, N, C, OC);
    float *g = dp_test_upload(dev, k.dout, N * OC);
    float *scratch = dp_test_nn_filled(dev, N * C, NAN);
    void *g16[2] = {NULL, NULL}, *dx16 = NULL;
    for (int r = 0; r < 2; r++)
        dp_assert_ok(dp_device_alloc(dev, N * OC * sizeof(dp_bf16), &g16[r]));
    dp_assert_ok(dp_device_alloc(dev, N * C * sizeof(dp_bf16), &dx16));
    static dp_bf16 h16[2][N * OC], got16[N * C];
    for (int cb = 0; cb < 3; cb++)
        for (int run = 0; run < 8; run++) {
            int x16 = COMBOS[cb][0], w16 = COMBOS[cb][1], prec = run & 1, dnnl = run >> 1 & 1,
                hook = run >> 2 & 1;
            dp_assert_ok(dp_device_set_matmul_precision(dev, prec ? DP_MATMUL_BF16
                                                                  : DP_MATMUL_FP32));
            dp_device_set_gemm_dnnl(dev, dnnl);
            dp_device_set_fused_producers(dev, !hook);
            void *x = upload_as(dev, k.inp, N * C, x16);
            void *w = upload_as(dev, k.weight, OC * C, w16);
            dp_dtype xt = x16 ? DP_DTYPE_BF16 : DP_DTYPE_F32;
            dp_pref wp = w16 ? dp_pref_bf16(w) : dp_pref_f32(w);
            float *res[2][3];
            for (int pass = 0; pass < 2; pass++) {
                float *dx = dp_test_nn_filled(dev, N * C, NAN);
                float *dw = dp_test_upload(dev, k.dweight0, OC * C);
                float *db = dp_test_upload(dev, k.dbias0, OC);
                dp_assert_ok(dp_memset(dev, g16[pass], 0xff, sizeof h16[pass]));
                if (pass == 0) {
                    dp_assert_ok(dp_linear_backward_dout16(dev, dx, dw, db, g, g16[0], x, xt, wp,
                                                           N, C, OC));
                } else { /* a scratch of NaN: dinp16 must not be read from a stale one */
                    dp_assert_ok(dp_memset(dev, scratch, 0xff, N * C * sizeof(float)));
                    dp_assert_ok(dp_linear_backward_to16(dev, dx16, scratch, N * C, dw, db, g,
                                                         g16[1], x, xt, wp, N, C, OC));
                    dp_assert_ok(dp_copy_d2h(dev, got16, dx16, sizeof got16));
                }
                res[pass][0] = dp_test_nn_download(dev, dx, N * C);
                res[pass][1] = dp_test_nn_download(dev, dw, OC * C);
                res[pass][2] = dp_test_nn_download(dev, db, OC);
                dp_assert_ok(dp_copy_d2h(dev, h16[pass], g16[pass], sizeof h16[pass]));
                dp_device_free(dev, dx);
                dp_device_free(dev, dw);
                dp_device_free(dev, db);
            }
            for (size_t i = 0; i < (size_t)N * C; i++)
                cr_assert_eq(got16[i], dp_bf16_from_float(res[0][0][i]),
                             "x16 %d w16 %d run %d: dinp16[%zu]", x16, w16, run, i);
            for (int t = 1; t < 3; t++)
                cr_assert(memcmp(res[0][t], res[1][t], (t == 1 ? OC * C : OC) * sizeof(float)) ==
                              0,
                          "x16 %d w16 %d run %d: gradient %d differs", x16, w16, run, t);
            cr_assert(memcmp(h16[0], h16[1], sizeof h16[0]) == 0, "run %d: dout16 differs", run);
            for (int t = 0; t < 3; t++) {
                free(res[0][t]);
                free(res[1][t]);
            }
            dp_device_free(dev, x);
            dp_device_free(dev, w);
        }
    dp_device_set_fused_producers(dev, 1);
    dp_device_set_gemm_dnnl(dev, 1);
#define TO16(...) dp_linear_backward_to16(__VA_ARGS__)
    dp_pref gp = dp_pref_f32(g);
    float *dw = dp_test_nn_filled(dev, OC * C, 0.0f);
    dp_test_nn_assert_invalid(TO16(dev, NULL, scratch, N * C, dw, NULL, g, g16[0], scratch,
                                   DP_DTYPE_F32, gp, N, C, OC),
                              "dinp16", "dp_linear_backward_to16");
    dp_test_nn_assert_invalid(TO16(dev, dx16, NULL, N * C, dw, NULL, g, g16[0], scratch,
                                   DP_DTYPE_F32, gp, N, C, OC),
                              "scratch", NULL);
    dp_test_nn_assert_invalid(TO16(dev, dx16, scratch, N * C - 1, dw, NULL, g, g16[0], dw,
                                   DP_DTYPE_F32, gp, N, C, OC),
                              "scratch_floats", "N*C");
    dp_test_nn_assert_invalid(TO16(dev, dx16, scratch, N * C, dw, NULL, g, g16[0], scratch,
                                   DP_DTYPE_F32, gp, N, C, OC),
                              "overlap", "scratch");
    dp_test_nn_assert_invalid(TO16(dev, g16[0], scratch, N * C, dw, NULL, g, g16[0], dw,
                                   DP_DTYPE_F32, gp, N, C, OC),
                              "overlap", "dout16");
#undef TO16
    dp_device_free(dev, dw);
    dp_device_free(dev, g);
    dp_device_free(dev, scratch);
    for (int r = 0; r < 2; r++) dp_device_free(dev, g16[r]);
    dp_device_free(dev, dx16);
    free_case(&k);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

/* dp_linear_backward_to16 with dout NULL: dout16 is the gradient (the
 * GELU's bfloat16 d(fch)), so dweight and dbias are
 * dp_linear_backward_from16's and dinp16 its dinp rounded, bit for bit, in
 * FP32 and BF16 math, with and without oneDNN, through the test hook; and
 * dout16 is only read. */
Test(linear, backward_to_bf16_from_a_bf16_gradient)
{
    enum { N = 23, C = 40, OC = 72 };
    dp_device *dev = dp_test_cpu(0);
    lin_case k = make_case(34, N, C, OC);
    float *g = dp_test_upload(dev, k.dout, N * OC), *scratch = dp_test_nn_filled(dev, N * C, NAN);
    void *g16 = NULL, *dx16 = NULL;
    dp_assert_ok(dp_device_alloc(dev, N * OC * sizeof(dp_bf16), &g16));
    dp_assert_ok(dp_device_alloc(dev, N * C * sizeof(dp_bf16), &dx16));
    dp_assert_ok(dp_convert(dev, g16, DP_DTYPE_BF16, g, DP_DTYPE_F32, N * OC));
    static dp_bf16 before[N * OC], after[N * OC], got16[N * C];
    dp_assert_ok(dp_copy_d2h(dev, before, g16, sizeof before));
    for (int run = 0; run < 8; run++) {
        int prec = run & 1, dnnl = run >> 1 & 1, hook = run >> 2 & 1;
        dp_assert_ok(dp_device_set_matmul_precision(dev, prec ? DP_MATMUL_BF16 : DP_MATMUL_FP32));
        dp_device_set_gemm_dnnl(dev, dnnl);
        dp_device_set_fused_producers(dev, !hook);
        void *x = upload_as(dev, k.inp, N * C, 1), *w = upload_as(dev, k.weight, OC * C, 1);
        float *res[2][3];
        for (int pass = 0; pass < 2; pass++) {
            float *dx = dp_test_nn_filled(dev, N * C, NAN);
            float *dw = dp_test_upload(dev, k.dweight0, OC * C);
            float *db = dp_test_upload(dev, k.dbias0, OC);
            if (pass == 0) {
                dp_assert_ok(dp_linear_backward_from16(dev, dx, dw, db, g16, x, DP_DTYPE_BF16,
                                                       dp_pref_bf16(w), N, C, OC));
            } else {
                dp_assert_ok(dp_memset(dev, scratch, 0xff, N * C * sizeof(float)));
                dp_assert_ok(dp_linear_backward_to16(dev, dx16, scratch, N * C, dw, db, NULL, g16,
                                                     x, DP_DTYPE_BF16, dp_pref_bf16(w), N, C,
                                                     OC));
                dp_assert_ok(dp_copy_d2h(dev, got16, dx16, sizeof got16));
            }
            res[pass][0] = dp_test_nn_download(dev, dx, N * C);
            res[pass][1] = dp_test_nn_download(dev, dw, OC * C);
            res[pass][2] = dp_test_nn_download(dev, db, OC);
            dp_device_free(dev, dx);
            dp_device_free(dev, dw);
            dp_device_free(dev, db);
        }
        for (size_t i = 0; i < (size_t)N * C; i++)
            cr_assert_eq(got16[i], dp_bf16_from_float(res[0][0][i]), "run %d: dinp16[%zu]", run,
                         i);
        for (int t = 1; t < 3; t++)
            cr_assert(memcmp(res[0][t], res[1][t], (t == 1 ? OC * C : OC) * sizeof(float)) == 0,
                      "run %d: gradient %d differs", run, t);
        for (int t = 0; t < 3; t++) {
            free(res[0][t]);
            free(res[1][t]);
        }
        dp_device_free(dev, x);
        dp_device_free(dev, w);
    }
    dp_device_set_fused_producers(dev, 1);
    dp_device_set_gemm_dnnl(dev, 1);
    dp_assert_ok(dp_copy_d2h(dev, after, g16, sizeof after));
    cr_assert(memcmp(before, after, sizeof before) == 0, "dout16 was written");
    dp_test_nn_assert_invalid(dp_linear_backward_to16(dev, dx16, scratch, N * C, scratch, NULL,
                                                      NULL, NULL, scratch, DP_DTYPE_F32,
                                                      dp_pref_f32(scratch), N, C, OC),
                              "dout16", "dp_linear_backward_to16");
    dp_device_free(dev, g);
    dp_device_free(dev, scratch);
    dp_device_free(dev, g16);
    dp_device_free(dev, dx16);
    free_case(&k);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

/* The MLP's GELU producers on CPU devices (no GELU epilogue: the
 * compositions they state), bit for bit: dp_linear_gelu_forward_out16's
 * pre is dp_linear_forward_out16's output and its out the bfloat16 GELU of
 * pre (kernels/gelu.h on the host); dp_linear_backward_to16_dgelu's dinp16
 * is dp_linear_backward_to16's times GELU'(pre) rounded once, with its
 * dweight, dbias and dout16. FP32 and BF16 math, with and without oneDNN,
 * through the test hook; float32 and bfloat16 weights. */
Test(linear, gelu_producers_are_the_compositions)
{
    enum { N = 21, C = 40, OC = 56 };
    dp_device *dev = dp_test_cpu(0);
    lin_case k = make_case(35, N, C, OC);
    float *g = dp_test_upload(dev, k.dout, N * C); /* the backward's dout: (N, C) */
    float *scratch = dp_test_nn_filled(dev, N * OC, NAN);
    void *ref16 = NULL, *pre16 = NULL, *out16 = NULL, *g16 = NULL, *dx16 = NULL;
    dp_assert_ok(dp_device_alloc(dev, N * OC * sizeof(dp_bf16), &ref16));
    dp_assert_ok(dp_device_alloc(dev, N * OC * sizeof(dp_bf16), &pre16));
    dp_assert_ok(dp_device_alloc(dev, N * OC * sizeof(dp_bf16), &out16));
    dp_assert_ok(dp_device_alloc(dev, N * C * sizeof(dp_bf16), &g16));
    dp_assert_ok(dp_device_alloc(dev, N * OC * sizeof(dp_bf16), &dx16));
    static dp_bf16 want[N * OC], pre[N * OC], out[N * OC], got[N * OC];
    void *x = upload_as(dev, k.inp, N * C, 1);
    for (int run = 0; run < 16; run++) {
        int prec = run & 1, dnnl = run >> 1 & 1, hook = run >> 2 & 1, w16 = run >> 3 & 1;
        dp_assert_ok(dp_device_set_matmul_precision(dev, prec ? DP_MATMUL_BF16 : DP_MATMUL_FP32));
        dp_device_set_gemm_dnnl(dev, dnnl);
        dp_device_set_fused_producers(dev, !hook);
        void *w = upload_as(dev, k.weight, OC * C, w16), *b = upload_as(dev, k.bias, OC, w16);
        dp_pref wp = w16 ? dp_pref_bf16(w) : dp_pref_f32(w);
        dp_pref bp = w16 ? dp_pref_bf16(b) : dp_pref_f32(b);
        /* forward: (N, C) -> (N, OC) */
        dp_assert_ok(dp_linear_forward_out16(dev, ref16, scratch, N * OC, x, DP_DTYPE_BF16, wp, bp,
                                             N, C, OC));
        dp_assert_ok(dp_copy_d2h(dev, want, ref16, sizeof want));
        dp_assert_ok(dp_memset(dev, pre16, 0xff, sizeof pre));
        dp_assert_ok(dp_memset(dev, out16, 0xff, sizeof out));
        dp_assert_ok(dp_linear_gelu_forward_out16(dev, out16, pre16, scratch, N * OC, x,
                                                  DP_DTYPE_BF16, wp, bp, N, C, OC));
        dp_assert_ok(dp_copy_d2h(dev, pre, pre16, sizeof pre));
        dp_assert_ok(dp_copy_d2h(dev, out, out16, sizeof out));
        for (size_t i = 0; i < (size_t)N * OC; i++) {
            cr_assert_eq(pre[i], want[i], "run %d: pre[%zu]", run, i);
            cr_assert_eq(out[i], dp_gelu_bf16(pre[i]), "run %d: out[%zu] is not GELU(pre)", run,
                         i);
        }
        /* backward of the (OC -> C) layer whose input was GELU(pre):
         * dinp (N, OC), its weight the forward's viewed as (C, OC) */
        float *res[2][2];
        for (int pass = 0; pass < 2; pass++) {
            float *dw = dp_test_upload(dev, k.dweight0, OC * C);
            float *db = dp_test_upload(dev, k.dbias0, C);
            dp_assert_ok(dp_memset(dev, scratch, 0xff, N * OC * sizeof(float)));
            dp_assert_ok(dp_memset(dev, g16, 0xff, N * C * sizeof(dp_bf16)));
            if (pass == 0)
                dp_assert_ok(dp_linear_backward_to16(dev, dx16, scratch, N * OC, dw, db, g, g16,
                                                     out16, DP_DTYPE_BF16, wp, N, OC, C));
            else
                dp_assert_ok(dp_linear_backward_to16_dgelu(dev, dx16, scratch, N * OC, dw, db, g,
                                                           g16, out16, DP_DTYPE_BF16, wp, pre16,
                                                           N, OC, C));
            dp_assert_ok(dp_copy_d2h(dev, pass ? got : want, dx16, sizeof got));
            res[pass][0] = dp_test_nn_download(dev, dw, OC * C);
            res[pass][1] = dp_test_nn_download(dev, db, C);
            dp_device_free(dev, dw);
            dp_device_free(dev, db);
        }
        for (size_t i = 0; i < (size_t)N * OC; i++) {
            dp_bf16 e;
            dp_gelu_backward_bf16_elem(&e, &pre[i], &want[i], 0);
            cr_assert_eq(got[i], e, "run %d: dinp16[%zu] = %#06x, GELU' of the composition "
                         "%#06x", run, i, got[i], e);
        }
        cr_assert(memcmp(res[0][0], res[1][0], OC * C * sizeof(float)) == 0, "run %d: dweight",
                  run);
        cr_assert(memcmp(res[0][1], res[1][1], C * sizeof(float)) == 0, "run %d: dbias", run);
        for (int t = 0; t < 2; t++) {
            free(res[0][t]);
            free(res[1][t]);
        }
        dp_device_free(dev, w);
        dp_device_free(dev, b);
    }
    dp_device_set_fused_producers(dev, 1);
    dp_device_set_gemm_dnnl(dev, 1);
    /* bad arguments: what the compositions would not see */
    dp_pref wp = dp_pref_f32(scratch);
    dp_bf16 *o = out16, *p = pre16;
    dp_test_nn_assert_invalid(dp_linear_gelu_forward_out16(dev, NULL, p, scratch, N * OC, x,
                                                           DP_DTYPE_BF16, wp, wp, N, C, OC),
                              "out", "dp_linear_gelu_forward_out16");
    dp_test_nn_assert_invalid(dp_linear_gelu_forward_out16(dev, o, NULL, scratch, N * OC, x,
                                                           DP_DTYPE_BF16, wp, wp, N, C, OC),
                              "pre", NULL);
    dp_test_nn_assert_invalid(dp_linear_gelu_forward_out16(dev, o, o + 1, scratch, N * OC, x,
                                                           DP_DTYPE_BF16, wp, wp, N, C, OC),
                              "overlap", "pre");
    dp_test_nn_assert_invalid(dp_linear_gelu_forward_out16(dev, (dp_bf16 *)scratch, p, scratch,
                                                           N * OC, x, DP_DTYPE_BF16, wp, wp, N,
                                                           C, OC),
                              "overlap", "scratch");
    float *dw = dp_test_nn_filled(dev, OC * C, 0.0f);
    dp_test_nn_assert_invalid(dp_linear_backward_to16_dgelu(dev, dx16, scratch, N * OC, dw, NULL,
                                                            g, g16, out16, DP_DTYPE_BF16, wp,
                                                            NULL, N, OC, C),
                              "pre", "dp_linear_backward_to16_dgelu");
    dp_test_nn_assert_invalid(dp_linear_backward_to16_dgelu(dev, dx16, scratch, N * OC, dw, NULL,
                                                            g, g16, out16, DP_DTYPE_BF16, wp,
                                                            (dp_bf16 *)dx16 + 3, N, OC, C),
                              "overlap", "pre");
    dp_device_free(dev, dw);
    void *bufs[] = {g, scratch, ref16, pre16, out16, g16, dx16, x};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) dp_device_free(dev, bufs[i]);
    free_case(&k);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

Test(linear, bf16_producers_bad_arguments)
{
    dp_device *dev = dp_test_cpu(0);
    float *f = dp_test_nn_filled(dev, 256, 0.0f);
    float *x = f, *w = f + 64, *s = f + 128; /* x (2,3), w (4,3), scratch: 64 floats each */
    dp_bf16 *o = (dp_bf16 *)(f + 192);       /* 128 bfloat16 */
    dp_pref p = dp_pref_f32(w), none = dp_pref_f32(NULL);
    const dp_dtype F = DP_DTYPE_F32;
#define FWD(...) dp_linear_forward_out16(__VA_ARGS__)
    dp_test_nn_assert_invalid(FWD(NULL, o, s, 64, x, F, p, p, 2, 3, 4), "dev", NULL);
    dp_test_nn_assert_invalid(FWD(dev, NULL, s, 64, x, F, p, p, 2, 3, 4), "out",
                              "dp_linear_forward_out16");
    dp_test_nn_assert_invalid(FWD(dev, o, NULL, 64, x, F, p, p, 2, 3, 4), "scratch", NULL);
    dp_test_nn_assert_invalid(FWD(dev, o, s, 64, NULL, F, p, p, 2, 3, 4), "inp", NULL);
    dp_test_nn_assert_invalid(FWD(dev, o, s, 64, x, F, none, p, 2, 3, 4), "weight", NULL);
    dp_test_nn_assert_invalid(FWD(dev, o, s, 64, x, F, p, p, 0, 3, 4), "N=0", NULL);
    dp_test_nn_assert_invalid(FWD(dev, o, s, 64, x, F, p, p, 2, 3, 0), "OC=0", NULL);
    dp_test_nn_assert_invalid(FWD(dev, o, s, 64, x, F, p, p, 1, (size_t)1 << 31, 1), "INT_MAX",
                              NULL);
    dp_test_nn_assert_invalid(FWD(dev, o, s, 64, x, DP_DTYPE_F16, p, p, 2, 3, 4), "F16",
                              "inp_type");
    dp_test_nn_assert_invalid(FWD(dev, o, s, 3, x, F, p, p, 2, 3, 4), "scratch_floats=3", "OC=4");
    dp_test_nn_assert_invalid(FWD(dev, (dp_bf16 *)x, s, 64, x, F, p, p, 2, 3, 4), "overlap",
                              "inp");
    dp_test_nn_assert_invalid(FWD(dev, (dp_bf16 *)s + 2, s, 64, x, F, p, p, 2, 3, 4), "overlap",
                              "scratch");
    dp_test_nn_assert_invalid(FWD(dev, o, x + 4, 64, x, F, p, p, 2, 3, 4), "overlap", "inp");
    /* Only the part of the scratch used counts (2 rows x 4 = 8 floats of 64):
     * x holds 2 x 3 = 6 floats, and a scratch right after them is fine. */
    dp_assert_ok(FWD(dev, o, x + 6, 64, x, F, p, p, 2, 3, 4));
#undef FWD
#define BWD(...) dp_linear_backward_dout16(__VA_ARGS__)
    float *dx = f + 200, *dw = f + 210, *g = f + 230;
    dp_bf16 *g16 = (dp_bf16 *)(f + 240);
    dp_test_nn_assert_invalid(BWD(NULL, dx, dw, NULL, g, g16, x, F, p, 2, 3, 4), "dev", NULL);
    dp_test_nn_assert_invalid(BWD(dev, dx, NULL, NULL, g, g16, x, F, p, 2, 3, 4), "dweight",
                              "dp_linear_backward_dout16");
    dp_test_nn_assert_invalid(BWD(dev, dx, dw, NULL, NULL, g16, x, F, p, 2, 3, 4), "dout", NULL);
    dp_test_nn_assert_invalid(BWD(dev, dx, dw, NULL, g, g16, NULL, F, p, 2, 3, 4), "inp", NULL);
    dp_test_nn_assert_invalid(BWD(dev, dx, dw, NULL, g, g16, x, F, none, 2, 3, 4), "weight",
                              NULL);
    dp_test_nn_assert_invalid(BWD(dev, dx, dw, NULL, g, g16, x, DP_DTYPE_I32, p, 2, 3, 4), "I32",
                              NULL);
    dp_test_nn_assert_invalid(BWD(dev, dx, dw, NULL, g, (dp_bf16 *)g + 1, x, F, p, 2, 3, 4),
                              "overlap", "dout");
    dp_test_nn_assert_invalid(BWD(dev, dx, dw, NULL, g, (dp_bf16 *)dx, x, F, p, 2, 3, 4),
                              "overlap", "dinp");
    dp_test_nn_assert_invalid(BWD(dev, dx, dw, NULL, g, (dp_bf16 *)dw + 3, x, F, p, 2, 3, 4),
                              "overlap", "dweight");
    dp_test_nn_assert_invalid(BWD(dev, dx, dw, NULL, g, (dp_bf16 *)x, x, F, p, 2, 3, 4),
                              "overlap", "inp");
    dp_test_nn_assert_invalid(BWD(dev, dx, dw, NULL, g, (dp_bf16 *)w, x, F, p, 2, 3, 4),
                              "overlap", "weight");
    /* dout16 NULL: the backward of dp/nn.h */
    dp_assert_ok(BWD(dev, dx, dw, NULL, g, NULL, x, F, p, 2, 3, 4));
#undef BWD
    dp_device_free(dev, f);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}
