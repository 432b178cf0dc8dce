/* LayerNorm: forward (out, cached mean and rstd) against float64, backward
 * against central finite differences of a float64 forward, with the
 * accumulate semantics of dinp, dweight and dbias; bad arguments. The
 * forward with a bfloat16 output (nn/nn_act16.h): bit for bit the float32
 * output rounded; the backward from a bfloat16 dout: bit for bit the
 * float32 backward of its values; their bad arguments. */
#include "backend/device_testing.h"
#include "kernels/colsum.h" /* DP_COL_CHUNK */
#include "nn/nn_act16.h"
#include "nn_test_util.h"

#define N 6
#define C 32

/* float64 LayerNorm of one row (eps as the library's). */
static void ln_row_ref(double *out, double *mean, double *rstd, const double *x,
                       const double *w, const double *b)
{
    double m = 0.0, v = 0.0;
    for (size_t c = 0; c < C; c++) m += x[c];
    m /= C;
    for (size_t c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    v /= C; /* biased variance, as torch.nn.LayerNorm */
    double s = 1.0 / sqrt(v + (double)DP_LAYERNORM_EPS);
    for (size_t c = 0; c < C; c++) out[c] = (x[c] - m) * s * w[c] + b[c];
    if (mean) *mean = m;
    if (rstd) *rstd = s;
}

/* L = sum_{n,c} dout[n,c] * layernorm(x)[n,c] in float64. */
static double ln_loss(const double *x, const double *w, const double *b, const double *dout)
{
    double L = 0.0, out[C];
    for (size_t n = 0; n < N; n++) {
        ln_row_ref(out, NULL, NULL, x + n * C, w, b);
        for (size_t c = 0; c < C; c++) L += dout[n * C + c] * out[c];
    }
    return L;
}

typedef struct ln_data {
    float x[N * C], w[C], b[C], dout[N * C];
} ln_data;

static void make_data(ln_data *d, uint64_t seed)
{
    dp_rng rng;
    dp_rng_seed(&rng, seed);
    /* Rows with an offset and different spreads, so the mean matters and
     * rstd varies by row. */
    for (size_t n = 0; n < N; n++)
        dp_rng_fill_normal(&rng, d->x + n * C, C, (float)n - 2.5f, 0.5f + 0.5f * (float)n);
    dp_rng_fill_normal(&rng, d->w, C, 1.0f, 0.3f);
    dp_rng_fill_normal(&rng, d->b, C, 0.0f, 0.3f);
    dp_rng_fill_normal(&rng, d->dout, N * C, 0.0f, 1.0f);
}

Test(layernorm, forward_matches_float64)
{
    dp_device *dev = dp_test_cpu(0);
    ln_data d;
    make_data(&d, 41);
    float *d_x = dp_test_upload(dev, d.x, N * C), *d_w = dp_test_upload(dev, d.w, C);
    float *d_b = dp_test_upload(dev, d.b, C);
    float *d_out = dp_test_nn_filled(dev, N * C, NAN), *d_mean = dp_test_nn_filled(dev, N, NAN);
    float *d_rstd = dp_test_nn_filled(dev, N, NAN);
    dp_assert_ok(dp_layernorm_forward(dev, d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C));

    double x[N * C], w[C], b[C], ref[N * C], ref_mean[N], ref_rstd[N];
    for (size_t i = 0; i < N * C; i++) x[i] = d.x[i];
    for (size_t i = 0; i < C; i++) w[i] = d.w[i], b[i] = d.b[i];
    for (size_t n = 0; n < N; n++)
        ln_row_ref(ref + n * C, ref_mean + n, ref_rstd + n, x + n * C, w, b);
    float *out = dp_test_nn_download(dev, d_out, N * C), *mean = dp_test_nn_download(dev, d_mean, N);
    float *rstd = dp_test_nn_download(dev, d_rstd, N);
    double outd[N * C], meand[N], rstdd[N];
    for (size_t i = 0; i < N * C; i++) outd[i] = out[i];
    for (size_t i = 0; i < N; i++) meand[i] = mean[i], rstdd[i] = rstd[i];
    /* Float sums over C = 32 terms: relative error ~C * 2^-24 = 2e-6 on the
     * mean and variance; out is O(1-3), so 1e-5 absolute and relative. */
    dp_assert_allclose(meand, ref_mean, N, 1e-5, 1e-5);
    dp_assert_allclose(rstdd, ref_rstd, N, 1e-6, 1e-5);
    dp_assert_allclose(outd, ref, N * C, 1e-5, 1e-5);

    free(out);
    free(mean);
    free(rstd);
    dp_device_free(dev, d_x);
    dp_device_free(dev, d_w);
    dp_device_free(dev, d_b);
    dp_device_free(dev, d_out);
    dp_device_free(dev, d_mean);
    dp_device_free(dev, d_rstd);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

Test(layernorm, forward_constant_row_is_finite)
{
    /* Zero variance: rstd = 1/sqrt(eps), out = bias exactly. */
    dp_device *dev = dp_test_cpu(0);
    float x[C], w[C], b[C];
    for (size_t c = 0; c < C; c++) x[c] = 7.25f, w[c] = 2.0f, b[c] = (float)c * 0.125f;
    float *d_x = dp_test_upload(dev, x, C), *d_w = dp_test_upload(dev, w, C);
    float *d_b = dp_test_upload(dev, b, C), *d_out = dp_test_nn_filled(dev, C, NAN);
    float *d_mean = dp_test_nn_filled(dev, 1, NAN), *d_rstd = dp_test_nn_filled(dev, 1, NAN);
    dp_assert_ok(dp_layernorm_forward(dev, d_out, d_mean, d_rstd, d_x, d_w, d_b, 1, C));
    float *out = dp_test_nn_download(dev, d_out, C), *rstd = dp_test_nn_download(dev, d_rstd, 1);
    dp_assert_allclose(out, b, C, 0.0, 0.0);
    float want = 1.0f / sqrtf(DP_LAYERNORM_EPS);
    dp_assert_allclose(rstd, &want, 1, 0.0, 1e-6);
    free(out);
    free(rstd);
    dp_device_close(dev);
}

Test(layernorm, backward_matches_finite_differences_and_accumulates)
{
    dp_device *dev = dp_test_cpu(0);
    ln_data d;
    make_data(&d, 42);
    dp_rng rng;
    dp_rng_seed(&rng, 43);
    /* Nonzero initial gradients: the backward must add to every one. */
    float dinp0[N * C], dw0[C], db0[C];
    dp_rng_fill_uniform(&rng, dinp0, N * C, -1.0f, 1.0f);
    dp_rng_fill_uniform(&rng, dw0, C, -1.0f, 1.0f);
    dp_rng_fill_uniform(&rng, db0, C, -1.0f, 1.0f);

    float *d_x = dp_test_upload(dev, d.x, N * C), *d_w = dp_test_upload(dev, d.w, C);
    float *d_b = dp_test_upload(dev, d.b, C), *d_dout = dp_test_upload(dev, d.dout, N * C);
    float *d_out = dp_test_nn_filled(dev, N * C, 0.0f), *d_mean = dp_test_nn_filled(dev, N, 0.0f);
    float *d_rstd = dp_test_nn_filled(dev, N, 0.0f);
    float *d_dinp = dp_test_upload(dev, dinp0, N * C), *d_dw = dp_test_upload(dev, dw0, C);
    float *d_db = dp_test_upload(dev, db0, C);
    /* The backward uses the mean and rstd cached by the forward. */
    dp_assert_ok(dp_layernorm_forward(dev, d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C));
    dp_assert_ok(dp_layernorm_backward(dev, d_dinp, d_dw, d_db, d_dout, d_x, d_w, d_mean,
                                       d_rstd, N, C));
    float *dinp = dp_test_nn_download(dev, d_dinp, N * C), *dw = dp_test_nn_download(dev, d_dw, C);
    float *db = dp_test_nn_download(dev, d_db, C);

    /* Central differences of the float64 loss. Truncation error h^2 f'''/6
     * with f''' = O(rstd^3) <= O(10) is ~1e-11 for h = 1e-6; rounding is
     * ~1e-16 * |L| / h ~ 1e-9. */
    double x[N * C], w[C], b[C], dout[N * C];
    for (size_t i = 0; i < N * C; i++) x[i] = d.x[i], dout[i] = d.dout[i];
    for (size_t i = 0; i < C; i++) w[i] = d.w[i], b[i] = d.b[i];
    const double h = 1e-6;
    double fd_x[N * C], fd_w[C], fd_b[C], got_x[N * C], got_w[C], got_b[C];
    double *ps[3] = {x, w, b}, *fds[3] = {fd_x, fd_w, fd_b};
    size_t sizes[3] = {N * C, C, C};
    for (int p = 0; p < 3; p++)
        for (size_t i = 0; i < sizes[p]; i++) {
            double keep = ps[p][i];
            ps[p][i] = keep + h;
            double lp = ln_loss(x, w, b, dout);
            ps[p][i] = keep - h;
            double lm = ln_loss(x, w, b, dout);
            ps[p][i] = keep;
            fds[p][i] = (lp - lm) / (2 * h);
        }
    /* Expected = initial value + gradient. */
    for (size_t i = 0; i < N * C; i++) fd_x[i] += dinp0[i], got_x[i] = dinp[i];
    for (size_t i = 0; i < C; i++) {
        fd_w[i] += dw0[i], got_w[i] = dw[i];
        fd_b[i] += db0[i], got_b[i] = db[i];
    }
    /* dinp: float row sums over C = 32 terms, scaled by rstd (up to ~2 here)
     * and partly cancelling: ~1e-5 absolute. dweight, dbias: float sums of
     * N = 6 terms of size ~1-3. */
    dp_assert_allclose(got_x, fd_x, N * C, 2e-5, 1e-4);
    dp_assert_allclose(got_w, fd_w, C, 2e-5, 1e-4);
    dp_assert_allclose(got_b, fd_b, C, 2e-5, 1e-4);

    free(dinp);
    free(dw);
    free(db);
    float *bufs[] = {d_x, d_w, d_b, d_dout, d_out, d_mean, d_rstd, d_dinp, d_dw, d_db};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dp_device_free(dev, bufs[i]);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

Test(layernorm, bad_arguments)
{
    dp_device *dev = dp_test_cpu(0);
    float *f = dp_test_nn_filled(dev, 16, 0.0f);
    dp_test_nn_assert_invalid(dp_layernorm_forward(NULL, f, f, f, f, f, f, 2, 4), "dev", NULL);
    dp_test_nn_assert_invalid(dp_layernorm_forward(dev, NULL, f, f, f, f, f, 2, 4), "out", "cpu:0");
    dp_test_nn_assert_invalid(dp_layernorm_forward(dev, f, NULL, f, f, f, f, 2, 4), "mean", NULL);
    dp_test_nn_assert_invalid(dp_layernorm_forward(dev, f, f, NULL, f, f, f, 2, 4), "rstd", NULL);
    dp_test_nn_assert_invalid(dp_layernorm_forward(dev, f, f, f, NULL, f, f, 2, 4), "inp", NULL);
    dp_test_nn_assert_invalid(dp_layernorm_forward(dev, f, f, f, f, NULL, f, 2, 4), "weight", NULL);
    dp_test_nn_assert_invalid(dp_layernorm_forward(dev, f, f, f, f, f, NULL, 2, 4), "bias", NULL);
    dp_test_nn_assert_invalid(dp_layernorm_forward(dev, f, f, f, f, f, f, 0, 4), "N=0",
                      "dp_layernorm_forward");
    dp_test_nn_assert_invalid(dp_layernorm_forward(dev, f, f, f, f, f, f, 2, 0), "C=0", NULL);
    dp_test_nn_assert_invalid(dp_layernorm_forward(dev, f, f, f, f, f, f, SIZE_MAX, 2), "overflow",
                      NULL);
    dp_test_nn_assert_invalid(dp_layernorm_backward(NULL, f, f, f, f, f, f, f, f, 2, 4), "dev", NULL);
    dp_test_nn_assert_invalid(dp_layernorm_backward(dev, NULL, f, f, f, f, f, f, f, 2, 4), "dinp",
                      "dp_layernorm_backward");
    dp_test_nn_assert_invalid(dp_layernorm_backward(dev, f, NULL, f, f, f, f, f, f, 2, 4), "dweight",
                      NULL);
    dp_test_nn_assert_invalid(dp_layernorm_backward(dev, f, f, NULL, f, f, f, f, f, 2, 4), "dbias",
                      NULL);
    dp_test_nn_assert_invalid(dp_layernorm_backward(dev, f, f, f, NULL, f, f, f, f, 2, 4), "dout",
                      NULL);
    dp_test_nn_assert_invalid(dp_layernorm_backward(dev, f, f, f, f, f, f, f, NULL, 2, 4), "rstd",
                      NULL);
    dp_test_nn_assert_invalid(dp_layernorm_backward(dev, f, f, f, f, f, f, f, f, 2, 0), "C=0", NULL);
    dp_device_free(dev, f);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

/* The parameter gradients are column reductions over the N rows, summed in
 * the two-stage order of kernels/colsum.h (row chunks of DP_COL_CHUNK,
 * then the chunk partials in order), the order the GPU uses too. With
 * N = 2 chunks + 37 rows and 70 channels (more than one 64-wide CPU tile,
 * not a multiple of it): equal to float64 within float rounding, and bit
 * for bit equal to that order emulated here in float. */
#define PR (2 * 256 + 37)
#define PC 70
Test(layernorm, param_gradients_chunked_order_and_float64)
{
    cr_assert_eq(DP_COL_CHUNK, 256, "the test's sizes assume 256-row chunks");
    dp_device *dev = dp_test_cpu(0);
    dp_rng rng;
    dp_rng_seed(&rng, 77);
    static float x[PR * PC], g[PR * PC], mean[PR], rstd[PR], w[PC], dw0[PC], db0[PC];
    dp_rng_fill_normal(&rng, x, PR * PC, 0.3f, 1.0f);
    dp_rng_fill_normal(&rng, g, PR * PC, 0.0f, 1.0f);
    dp_rng_fill_normal(&rng, mean, PR, 0.3f, 0.1f);
    dp_rng_fill_uniform(&rng, rstd, PR, 0.5f, 2.0f);
    dp_rng_fill_normal(&rng, w, PC, 1.0f, 0.2f);
    dp_rng_fill_normal(&rng, dw0, PC, 0.0f, 1.0f);
    dp_rng_fill_normal(&rng, db0, PC, 0.0f, 1.0f);
    float *d_x = dp_test_upload(dev, x, PR * PC), *d_g = dp_test_upload(dev, g, PR * PC);
    float *d_m = dp_test_upload(dev, mean, PR), *d_r = dp_test_upload(dev, rstd, PR);
    float *d_w = dp_test_upload(dev, w, PC), *d_dw = dp_test_upload(dev, dw0, PC);
    float *d_db = dp_test_upload(dev, db0, PC), *d_dinp = dp_test_nn_filled(dev, PR * PC, 0.0f);
    dp_assert_ok(dp_layernorm_backward(dev, d_dinp, d_dw, d_db, d_g, d_x, d_w, d_m, d_r, PR, PC));
    float *dw = dp_test_nn_download(dev, d_dw, PC), *db = dp_test_nn_download(dev, d_db, PC);

    double ref_w[PC], ref_b[PC], got_w[PC], got_b[PC];
    for (size_t c = 0; c < PC; c++) {
        double sw = 0.0, sb = 0.0;
        float tw = 0.0f, tb = 0.0f; /* the chunked order in float */
        for (size_t n0 = 0; n0 < PR; n0 += 256) {
            float pw = 0.0f, pb = 0.0f;
            for (size_t n = n0; n < PR && n < n0 + 256; n++) {
                float d = g[n * PC + c];
                pw += d * ((x[n * PC + c] - mean[n]) * rstd[n]);
                pb += d;
                sw += (double)d * ((double)x[n * PC + c] - mean[n]) * rstd[n];
                sb += d;
            }
            tw += pw;
            tb += pb;
        }
        cr_assert(dw[c] == dw0[c] + tw, "dweight[%zu] = %.9g, the chunked order gives %.9g", c,
                  (double)dw[c], (double)(dw0[c] + tw));
        cr_assert(db[c] == db0[c] + tb, "dbias[%zu] = %.9g, the chunked order gives %.9g", c,
                  (double)db[c], (double)(db0[c] + tb));
        ref_w[c] = dw0[c] + sw;
        ref_b[c] = db0[c] + sb;
        got_w[c] = dw[c];
        got_b[c] = db[c];
    }
    /* 549 float terms of order 1: rounding ~ 549 * 6e-8 relative to the
     * terms' magnitudes (sum |terms| ~ 500): atol 2e-4 bounds it. */
    dp_assert_allclose(got_w, ref_w, PC, 2e-4, 1e-5);
    dp_assert_allclose(got_b, ref_b, PC, 2e-4, 1e-5);
    free(dw);
    free(db);
    void *bufs[] = {d_x, d_g, d_m, d_r, d_w, d_dw, d_db, d_dinp};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) dp_device_free(dev, bufs[i]);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

// --- the bfloat16 output (nn/nn_act16.h) -------------------------------------------------

/* Device copy of n host floats rounded to bfloat16 (by dp_convert). */
static dp_bf16 *upload_bf16(dp_device *dev, const float *h, size_t n)
{
    float *f = dp_test_upload(dev, h, n);
    void *b = NULL;
    dp_assert_ok(dp_device_alloc(dev, n * sizeof(dp_bf16), &b));
    dp_assert_ok(dp_convert(dev, b, DP_DTYPE_BF16, f, DP_DTYPE_F32, n));
    dp_device_free(dev, f);
    return b;
}

/* dp_layernorm_forward_out16 on rows x ch against the float32 layer (its
 * _bf16 variant for bfloat16 parameters) followed by dp_convert: out bit
 * for bit the rounding of the float32 output, mean and rstd bit for bit
 * the float32 layer's; both as the producer and as the test hook's
 * composition. Rows have offsets and spreads, as above. */
static void check_out16(uint64_t seed, size_t rows, size_t ch, int w16)
{
    dp_device *dev = dp_test_cpu(0);
    size_t n = rows * ch;
    float *x = malloc(n * sizeof *x), *w = malloc(ch * sizeof *w), *b = malloc(ch * sizeof *b);
    cr_assert(x && w && b);
    dp_rng rng;
    dp_rng_seed(&rng, seed);
    for (size_t r = 0; r < rows; r++)
        dp_rng_fill_normal(&rng, x + r * ch, ch, (float)(r % 5) - 2.0f,
                           0.5f + 0.25f * (float)(r % 4));
    dp_rng_fill_normal(&rng, w, ch, 1.0f, 0.3f);
    dp_rng_fill_normal(&rng, b, ch, 0.0f, 0.3f);
    float *xd = dp_test_upload(dev, x, n);
    void *wd = w16 ? (void *)upload_bf16(dev, w, ch) : (void *)dp_test_upload(dev, w, ch);
    void *bd = w16 ? (void *)upload_bf16(dev, b, ch) : (void *)dp_test_upload(dev, b, ch);
    dp_pref pw = w16 ? dp_pref_bf16(wd) : dp_pref_f32(wd);
    dp_pref pb = w16 ? dp_pref_bf16(bd) : dp_pref_f32(bd);

    float *ref = dp_test_nn_filled(dev, n, NAN), *m0 = dp_test_nn_filled(dev, rows, NAN),
          *r0 = dp_test_nn_filled(dev, rows, NAN);
    if (w16)
        dp_assert_ok(dp_layernorm_forward_bf16(dev, ref, m0, r0, xd, wd, bd, rows, ch));
    else
        dp_assert_ok(dp_layernorm_forward(dev, ref, m0, r0, xd, wd, bd, rows, ch));
    void *ref16 = NULL, *out16 = NULL;
    dp_assert_ok(dp_device_alloc(dev, n * sizeof(dp_bf16), &ref16));
    dp_assert_ok(dp_device_alloc(dev, n * sizeof(dp_bf16), &out16));
    dp_assert_ok(dp_convert(dev, ref16, DP_DTYPE_BF16, ref, DP_DTYPE_F32, n));
    dp_bf16 *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
    cr_assert(want && got);
    dp_assert_ok(dp_copy_d2h(dev, want, ref16, n * sizeof *want));
    float *want_m = dp_test_nn_download(dev, m0, rows);
    float *want_r = dp_test_nn_download(dev, r0, rows);
    for (int hook = 0; hook < 2; hook++) {
        dp_device_set_fused_producers(dev, !hook);
        float *md = dp_test_nn_filled(dev, rows, NAN), *rd = dp_test_nn_filled(dev, rows, NAN);
        dp_assert_ok(dp_memset(dev, out16, 0xff, n * sizeof(dp_bf16))); /* NaN everywhere */
        dp_assert_ok(dp_layernorm_forward_out16(dev, out16, md, rd, xd, pw, pb, rows, ch));
        dp_assert_ok(dp_copy_d2h(dev, got, out16, n * sizeof *got));
        for (size_t i = 0; i < n; i++)
            cr_assert(got[i] == want[i], "w16 %d hook %d: out[%zu] = %#06x, the rounded float32 "
                      "output %#06x", w16, hook, i, got[i], want[i]);
        float *gm = dp_test_nn_download(dev, md, rows), *gr = dp_test_nn_download(dev, rd, rows);
        cr_assert(memcmp(gm, want_m, rows * sizeof *gm) == 0, "w16 %d hook %d: mean", w16, hook);
        cr_assert(memcmp(gr, want_r, rows * sizeof *gr) == 0, "w16 %d hook %d: rstd", w16, hook);
        free(gm);
        free(gr);
        dp_device_free(dev, md);
        dp_device_free(dev, rd);
    }
    dp_device_set_fused_producers(dev, 1);
    void *bufs[] = {xd, wd, bd, ref, m0, r0, ref16, out16};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dp_device_free(dev, bufs[i]);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
    free(x);
    free(w);
    free(b);
    free(want);
    free(got);
    free(want_m);
    free(want_r);
}

/* 129 channels (no vector width divides them) and 768 (GPT-2's); both
 * parameter types. */
Test(layernorm, bf16_output_is_the_float32_output_rounded)
{
    for (int w16 = 0; w16 < 2; w16++) {
        check_out16(51, 37, 129, w16);
        check_out16(52, 9, 768, w16);
    }
}

Test(layernorm, bf16_output_bad_arguments)
{
    dp_device *dev = dp_test_cpu(0);
    float *f = dp_test_nn_filled(dev, 64, 0.0f);
    dp_bf16 *o = (dp_bf16 *)dp_test_nn_filled(dev, 64, 0.0f); /* 128 bfloat16 */
    dp_pref p = dp_pref_f32(f), none = dp_pref_f32(NULL);
    dp_test_nn_assert_invalid(dp_layernorm_forward_out16(NULL, o, f, f, f, p, p, 2, 4), "dev",
                              NULL);
    dp_test_nn_assert_invalid(dp_layernorm_forward_out16(dev, NULL, f, f, f, p, p, 2, 4), "out",
                              "dp_layernorm_forward_out16");
    dp_test_nn_assert_invalid(dp_layernorm_forward_out16(dev, o, NULL, f, f, p, p, 2, 4), "mean",
                              NULL);
    dp_test_nn_assert_invalid(dp_layernorm_forward_out16(dev, o, f, NULL, f, p, p, 2, 4), "rstd",
                              NULL);
    dp_test_nn_assert_invalid(dp_layernorm_forward_out16(dev, o, f, f, NULL, p, p, 2, 4), "inp",
                              NULL);
    dp_test_nn_assert_invalid(dp_layernorm_forward_out16(dev, o, f, f, f, none, p, 2, 4),
                              "weight", NULL);
    dp_test_nn_assert_invalid(dp_layernorm_forward_out16(dev, o, f, f, f, p, none, 2, 4), "bias",
                              NULL);
    dp_test_nn_assert_invalid(dp_layernorm_forward_out16(dev, o, f, f, f, p, p, 0, 4), "N=0", NULL);
    dp_test_nn_assert_invalid(dp_layernorm_forward_out16(dev, o, f, f, f, p, p, 2, 0), "C=0", NULL);
    dp_test_nn_assert_invalid(dp_layernorm_forward_out16(dev, o, f, f, f, p, p, SIZE_MAX, 2),
                              "overflow", NULL);
    /* out written over what the rows read: the input, the statistics */
    float *x = f + 16, *m = f + 48, *r = f + 56;
    dp_test_nn_assert_invalid(dp_layernorm_forward_out16(dev, (dp_bf16 *)x, m, r, x, p, p, 2, 4),
                              "overlap", "inp");
    dp_test_nn_assert_invalid(dp_layernorm_forward_out16(dev, (dp_bf16 *)x + 8, m, r, x, p, p, 2,
                                                         4), "overlap", "inp");
    dp_test_nn_assert_invalid(dp_layernorm_forward_out16(dev, (dp_bf16 *)m - 4, m, r, x, p, p, 2,
                                                         4), "overlap", "mean");
    dp_test_nn_assert_invalid(dp_layernorm_forward_out16(dev, (dp_bf16 *)r - 1, m, r, x, p, p, 2,
                                                         4), "overlap", "rstd");
    /* adjacent is not overlapping: out ends where the input starts */
    dp_assert_ok(dp_layernorm_forward_out16(dev, (dp_bf16 *)x - 8, m, r, x, p, p, 2, 4));
    dp_device_free(dev, f);
    dp_device_free(dev, o);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

// --- the residual stream's update fused with the LayerNorm ---------------------------------

/* dp_residual_layernorm_forward on rows x ch against dp_accumulate then
 * the LayerNorm (float32 output, or dp_layernorm_forward_out16 for the
 * bfloat16 one): x afterwards, out, mean and rstd bit for bit, for
 * float32 and bfloat16 parameters, as the fused op and as the test
 * hook's composition. */
static void check_residual(uint64_t seed, size_t rows, size_t ch, int w16, int out16)
{
    dp_device *dev = dp_test_cpu(0);
    size_t n = rows * ch, es = out16 ? sizeof(dp_bf16) : sizeof(float);
    float *x = malloc(n * sizeof *x), *add = malloc(n * sizeof *add), *w = malloc(ch * sizeof *w),
          *b = malloc(ch * sizeof *b);
    cr_assert(x && add && w && b);
    dp_rng rng;
    dp_rng_seed(&rng, seed);
    dp_rng_fill_normal(&rng, x, n, 0.5f, 1.0f);
    dp_rng_fill_normal(&rng, add, n, -0.25f, 0.7f);
    dp_rng_fill_normal(&rng, w, ch, 1.0f, 0.3f);
    dp_rng_fill_normal(&rng, b, ch, 0.0f, 0.3f);
    void *wd = w16 ? (void *)upload_bf16(dev, w, ch) : (void *)dp_test_upload(dev, w, ch);
    void *bd = w16 ? (void *)upload_bf16(dev, b, ch) : (void *)dp_test_upload(dev, b, ch);
    dp_pref pw = w16 ? dp_pref_bf16(wd) : dp_pref_f32(wd);
    dp_pref pb = w16 ? dp_pref_bf16(bd) : dp_pref_f32(bd);
    float *addd = dp_test_upload(dev, add, n);
    /* the reference: the two calls */
    float *x0 = dp_test_upload(dev, x, n), *m0 = dp_test_nn_filled(dev, rows, NAN),
          *r0 = dp_test_nn_filled(dev, rows, NAN);
    void *o0 = NULL, *o1 = NULL;
    dp_assert_ok(dp_device_alloc(dev, n * es, &o0));
    dp_assert_ok(dp_device_alloc(dev, n * es, &o1));
    dp_assert_ok(dp_accumulate(dev, x0, addd, n));
    if (out16)
        dp_assert_ok(dp_layernorm_forward_out16(dev, o0, m0, r0, x0, pw, pb, rows, ch));
    else if (w16)
        dp_assert_ok(dp_layernorm_forward_bf16(dev, o0, m0, r0, x0, wd, bd, rows, ch));
    else
        dp_assert_ok(dp_layernorm_forward(dev, o0, m0, r0, x0, wd, bd, rows, ch));
    unsigned char *want_o = malloc(n * es), *got_o = malloc(n * es);
    cr_assert(want_o && got_o);
    dp_assert_ok(dp_copy_d2h(dev, want_o, o0, n * es));
    float *want_x = dp_test_nn_download(dev, x0, n), *want_m = dp_test_nn_download(dev, m0, rows),
          *want_r = dp_test_nn_download(dev, r0, rows);
    for (int hook = 0; hook < 2; hook++) {
        dp_device_set_fused_producers(dev, !hook);
        float *x1 = dp_test_upload(dev, x, n), *m1 = dp_test_nn_filled(dev, rows, NAN),
              *r1 = dp_test_nn_filled(dev, rows, NAN);
        dp_assert_ok(dp_memset(dev, o1, 0xff, n * es));
        dp_assert_ok(dp_residual_layernorm_forward(dev, o1, out16 ? DP_DTYPE_BF16 : DP_DTYPE_F32,
                                                   m1, r1, x1, addd, pw, pb, rows, ch));
        dp_assert_ok(dp_copy_d2h(dev, got_o, o1, n * es));
        float *gx = dp_test_nn_download(dev, x1, n), *gm = dp_test_nn_download(dev, m1, rows),
              *gr = dp_test_nn_download(dev, r1, rows);
        cr_assert(memcmp(gx, want_x, n * sizeof *gx) == 0, "w16 %d out16 %d hook %d: x", w16,
                  out16, hook);
        cr_assert(memcmp(got_o, want_o, n * es) == 0, "w16 %d out16 %d hook %d: out", w16, out16,
                  hook);
        cr_assert(memcmp(gm, want_m, rows * sizeof *gm) == 0 &&
                      memcmp(gr, want_r, rows * sizeof *gr) == 0,
                  "w16 %d out16 %d hook %d: mean, rstd", w16, out16, hook);
        free(gx);
        free(gm);
        free(gr);
        float *bufs[] = {x1, m1, r1};
        for (int i = 0; i < 3; i++) dp_device_free(dev, bufs[i]);
    }
    dp_device_set_fused_producers(dev, 1);
    void *bufs[] = {wd, bd, addd, x0, m0, r0, o0, o1};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dp_device_free(dev, bufs[i]);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
    free(x);
    free(add);
    free(w);
    free(b);
    free(want_o);
    free(got_o);
    free(want_x);
    free(want_m);
    free(want_r);
}

Test(layernorm, residual_fused_is_accumulate_then_layernorm)
{
    for (int w16 = 0; w16 < 2; w16++)
        for (int out16 = 0; out16 < 2; out16++) {
            check_residual(61, 37, 129, w16, out16);
            check_residual(62, 5, 768, w16, out16);
        }
}

Test(layernorm, residual_fused_bad_arguments)
{
    dp_device *dev = dp_test_cpu(0);
    float *f = dp_test_nn_filled(dev, 128, 0.0f);
    dp_pref p = dp_pref_f32(f);
    float *x = f + 16, *a = f + 32, *o = f + 64, *m = f + 96, *r = f + 104;
    dp_test_nn_assert_invalid(dp_residual_layernorm_forward(dev, o, DP_DTYPE_F32, m, r, x, NULL,
                                                            p, p, 2, 4),
                              "add", "dp_residual_layernorm_forward");
    dp_test_nn_assert_invalid(dp_residual_layernorm_forward(dev, o, DP_DTYPE_F32, m, r, NULL, a,
                                                            p, p, 2, 4),
                              "x", NULL);
    dp_test_nn_assert_invalid(dp_residual_layernorm_forward(dev, o, DP_DTYPE_F16, m, r, x, a, p,
                                                            p, 2, 4),
                              "out_type", NULL);
    dp_test_nn_assert_invalid(dp_residual_layernorm_forward(dev, x, DP_DTYPE_F32, m, r, x, a, p,
                                                            p, 2, 4),
                              "overlap", NULL);
    dp_test_nn_assert_invalid(dp_residual_layernorm_forward(dev, o, DP_DTYPE_F32, m, r, x, x + 4,
                                                            p, p, 2, 4),
                              "overlap", NULL);
    dp_test_nn_assert_invalid(dp_residual_layernorm_forward(dev, o, DP_DTYPE_F32, m, r, x, a, p,
                                                            p, 0, 4),
                              "N=0", NULL);
    dp_assert_ok(dp_residual_layernorm_forward(dev, o, DP_DTYPE_F32, m, r, x, a, p, p, 2, 4));
    dp_device_free(dev, f);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

/* dp_layernorm_backward_dout16 (nn/nn_act16.h) on rows x ch against the
 * float32 backward given dout's widened values: dinp (added to nonzero
 * values), dweight and dbias bit for bit, over more rows than a column
 * chunk (the parameter sums' two stages), float32 and bfloat16 weights. */
static void check_dout16(uint64_t seed, size_t rows, size_t ch, int w16)
{
    dp_device *dev = dp_test_cpu(0);
    size_t n = rows * ch;
    dp_rng rng;
    dp_rng_seed(&rng, seed);
    float *x = malloc(n * sizeof *x), *g = malloc(n * sizeof *g), *w = malloc(ch * sizeof *w),
          *b = malloc(ch * sizeof *b), *d0 = malloc(n * sizeof *d0);
    dp_bf16 *g16 = malloc(n * sizeof *g16);
    cr_assert(x && g && w && b && d0 && g16);
    dp_rng_fill_normal(&rng, x, n, 0.5f, 2.0f);
    dp_rng_fill_normal(&rng, g, n, 0.0f, 1.0f);
    dp_rng_fill_normal(&rng, w, ch, 1.0f, 0.3f);
    dp_rng_fill_normal(&rng, b, ch, 0.0f, 0.3f);
    dp_rng_fill_normal(&rng, d0, n, 0.0f, 1.0f);
    for (size_t i = 0; i < n; i++) {
        g16[i] = dp_bf16_from_float(g[i]);
        g[i] = dp_bf16_to_float(g16[i]); /* dout is its rounding: the same values */
    }
    if (w16)
        for (size_t c = 0; c < ch; c++) w[c] = dp_bf16_to_float(dp_bf16_from_float(w[c]));
    float *xd = dp_test_upload(dev, x, n), *gd = dp_test_upload(dev, g, n);
    dp_bf16 *gd16 = upload_bf16(dev, g, n);
    float *wd = dp_test_upload(dev, w, ch), *bd = dp_test_upload(dev, b, ch);
    dp_bf16 *w16d = upload_bf16(dev, w, ch), *b16d = upload_bf16(dev, b, ch);
    float *md = dp_test_nn_filled(dev, rows, 0.0f), *rd = dp_test_nn_filled(dev, rows, 0.0f);
    float *yd = dp_test_nn_filled(dev, n, 0.0f);
    dp_assert_ok(dp_layernorm_forward(dev, yd, md, rd, xd, wd, bd, rows, ch));
    float *res[2][3];
    for (int pass = 0; pass < 2; pass++) {
        float *di = dp_test_upload(dev, d0, n), *dw = dp_test_nn_filled(dev, ch, 0.25f),
              *db = dp_test_nn_filled(dev, ch, -0.5f);
        if (pass == 0 && w16)
            dp_assert_ok(dp_layernorm_backward_bf16(dev, di, dw, db, gd, xd, w16d, md, rd, rows,
                                                    ch));
        else if (pass == 0)
            dp_assert_ok(dp_layernorm_backward(dev, di, dw, db, gd, xd, wd, md, rd, rows, ch));
        else
            dp_assert_ok(dp_layernorm_backward_dout16(dev, di, dw, db, gd16, xd,
                                                      w16 ? dp_pref_bf16(w16d) : dp_pref_f32(wd),
                                                      md, rd, rows, ch));
        res[pass][0] = dp_test_nn_download(dev, di, n);
        res[pass][1] = dp_test_nn_download(dev, dw, ch);
        res[pass][2] = dp_test_nn_download(dev, db, ch);
        dp_device_free(dev, di);
        dp_device_free(dev, dw);
        dp_device_free(dev, db);
    }
    static const char *names[3] = {"dinp", "dweight", "dbias"};
    for (int t = 0; t < 3; t++) {
        cr_assert(memcmp(res[0][t], res[1][t], (t ? ch : n) * sizeof(float)) == 0,
                  "w16 %d: %s differs", w16, names[t]);
        free(res[0][t]);
        free(res[1][t]);
    }
    dp_test_nn_assert_invalid(dp_layernorm_backward_dout16(dev, (float *)gd16, wd, bd, gd16, xd,
                                                           dp_pref_f32(wd), md, rd, rows, ch),
                              "overlap", "dp_layernorm_backward_dout16");
    dp_test_nn_assert_invalid(dp_layernorm_backward_dout16(dev, yd, wd, bd, NULL, xd,
                                                           dp_pref_f32(wd), md, rd, rows, ch),
                              "dout", NULL);
    void *bufs[] = {xd, gd, gd16, wd, bd, w16d, b16d, md, rd, yd};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dp_device_free(dev, bufs[i]);
    free(x), free(g), free(w), free(b), free(d0), free(g16);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

Test(layernorm, backward_from_bf16_dout_is_the_float32_backward_of_its_values)
{
    cr_assert_eq(DP_COL_CHUNK, 256, "the sizes assume 256-row chunks");
    for (int w16 = 0; w16 < 2; w16++) check_dout16(61, 2 * 256 + 37, 129, w16);
}
