/*
 * bfloat16: the host and device conversions against an independent
 * float64 reference, and the _bf16 layers (dp/nn.h), which must compute
 * exactly what their float32 twins compute on the widened parameters.
 */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/device_testing.h"
#include "nn/nn_act16.h"
#include "nn_test_util.h"

#ifdef DP_TEST_HAVE_OMP
#include <omp.h>
#endif

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The nearest bfloat16 value of x (finite, not NaN), ties to even, by
 * arithmetic rather than bits: bfloat16 keeps 8 significant bits, so the
 * quantum at x's binade 2^e (x = m 2^e, 0.5 <= |m| < 1) is 2^(e - 8), but
 * never below the subnormal step 2^-133; rint rounds ties to even. Past
 * the largest bfloat16 (2^128 - 2^120) the value overflows to Inf. */
static float reference_bf16(float x)
{
    if (x == 0.0f) return x; /* keeps the sign of zero */
    int e;
    frexp((double)x, &e);
    int qe = e - 8 < -133 ? -133 : e - 8;
    double q = ldexp(1.0, qe);
    double r = rint((double)x / q) * q;
    double max = ldexp(1.0, 128) - ldexp(1.0, 120);
    if (fabs(r) > max) return r > 0 ? INFINITY : -INFINITY;
    return (float)r;
}

Test(bf16, known_values)
{
    cr_assert_eq(dp_bf16_from_float(1.0f), 0x3f80);
    cr_assert_eq(dp_bf16_from_float(-2.0f), 0xc000);
    /* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even 1 */
    cr_assert_eq(dp_bf16_from_float(1.0f + 0x1p-8f), 0x3f80);
    /* 1 + 3 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up */
    cr_assert_eq(dp_bf16_from_float(1.0f + 3 * 0x1p-8f), 0x3f82);
    cr_assert_eq(dp_bf16_from_float(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81); /* past half: up */
    cr_assert_eq(dp_bf16_from_float(INFINITY), 0x7f80);
    cr_assert_eq(dp_bf16_from_float(-INFINITY), 0xff80);
    cr_assert_eq(dp_bf16_from_float(FLT_MAX), 0x7f80, "FLT_MAX overflows to +Inf");
    cr_assert_eq(dp_bf16_from_float(-0.0f), 0x8000);
    cr_assert_eq(dp_bf16_from_float(0x1p-133f), 0x0001, "the smallest subnormal stays");
    cr_assert_eq(dp_bf16_to_float(0x3f80), 1.0f);
    cr_assert_eq(dp_bf16_to_float(0x0001), 0x1p-133f);
    /* NaNs stay NaNs, also the ones whose low bits would carry into Inf */
    uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0x7fffffffu, 0xffffffffu, 0xff800001u};
    for (size_t i = 0; i < sizeof nans / sizeof *nans; i++) {
        dp_bf16 h = dp_bf16_from_float(float_of(nans[i]));
        cr_assert(isnan(dp_bf16_to_float(h)), "NaN %08x became %04x", nans[i], h);
        cr_assert_eq(h >> 15, nans[i] >> 31, "NaN %08x lost its sign", nans[i]);
    }
}

/* Every bfloat16 upper half with the lower halves where rounding turns:
 * just below, at and above the tie, the extremes, and a few others. */
Test(bf16, rounding_matches_the_float64_reference)
{
    static const uint32_t lows[] = {0x0000, 0x0001, 0x3fff, 0x7ffe, 0x7fff, 0x8000,
                                    0x8001, 0xbfff, 0xc000, 0xfffe, 0xffff, 0x1234};
    size_t checked = 0;
    for (uint32_t hi = 0; hi < 0x10000u; hi++)
        for (size_t j = 0; j < sizeof lows / sizeof *lows; j++) {
            float x = float_of(hi << 16 | lows[j]);
            if (isnan(x)) continue;
            uint16_t got = dp_bf16_from_float(x);
            uint16_t want = (uint16_t)(bits_of(reference_bf16(x)) >> 16);
            if (got != want)
                cr_assert_fail("bf16(%a) (bits %08x) = %04x, reference %04x", (double)x,
                               bits_of(x), got, want);
            checked++;
        }
    cr_assert_gt(checked, 700000);
}

Test(bf16, widening_is_exact_and_round_trips)
{
    for (uint32_t h = 0; h < 0x10000u; h++) {
        float f = dp_bf16_to_float((dp_bf16)h);
        cr_assert_eq(bits_of(f), h << 16);
        if (!isnan(f)) cr_assert_eq(dp_bf16_from_float(f), h);
    }
}

// --- dp_convert on a device ------------------------------------------------------------

/* The block conversions a GEMM in pieces uses on a GPU (kernels/bf16.h,
 * backend ops pack_f32_bf16 / pack_bf16_f32), run by the CPU backend's
 * loop over the same DP_HD function: item i of the dense copy is element
 * (row, col) of matrix mat of the block, read at off + mat*stride +
 * col*ld + row; the padding around the block is never read. */
Test(bf16, block_conversions_read_exactly_the_block)
{
    enum { LD = 13, COLS = 9, STRIDE = LD * COLS + 5, MATS = 3, TOTAL = STRIDE * MATS };
    const dp_block blk = {LD + 2, LD, STRIDE, 7, 6}; /* rows 2..8 of columns 1..6 */
    const size_t n = MATS * 7 * 6;
    float x[TOTAL];
    dp_bf16 h[TOTAL];
    for (int i = 0; i < TOTAL; i++) {
        x[i] = NAN; /* padding: reading it shows */
        h[i] = dp_bf16_from_float(NAN);
    }
    dp_rng rng;
    dp_rng_seed(&rng, 11);
    for (int mat = 0; mat < MATS; mat++)
        for (int col = 0; col < 6; col++)
            for (int row = 0; row < 7; row++) {
                size_t at = blk.off + (size_t)mat * STRIDE + (size_t)col * LD + (size_t)row;
                x[at] = 4.0f * dp_rng_uniform(&rng) - 2.0f;
                h[at] = dp_bf16_from_float(x[at]);
            }
    dp_device *dev = dp_test_cpu(0);
    float *dx = dp_test_upload(dev, x, TOTAL), *dw = NULL;
    dp_bf16 *dh = NULL, *dr = NULL;
    dp_assert_ok(dp_device_alloc(dev, sizeof h, (void **)&dh));
    dp_assert_ok(dp_copy_h2d(dev, dh, h, sizeof h));
    dp_assert_ok(dp_device_alloc(dev, n * sizeof *dr, (void **)&dr));
    dp_assert_ok(dp_device_alloc(dev, n * sizeof *dw, (void **)&dw));
    dp_assert_ok(dev->ops->pack_f32_bf16(dev, (uint16_t *)dr, dx, blk, n));
    dp_assert_ok(dev->ops->pack_bf16_f32(dev, dw, (const uint16_t *)dh, blk, n));
    dp_bf16 r[MATS * 7 * 6];
    dp_assert_ok(dp_copy_d2h(dev, r, dr, sizeof r));
    float *w = dp_test_nn_download(dev, dw, n);
    size_t i = 0;
    for (int mat = 0; mat < MATS; mat++)
        for (int col = 0; col < 6; col++)
            for (int row = 0; row < 7; row++, i++) {
                size_t at = blk.off + (size_t)mat * STRIDE + (size_t)col * LD + (size_t)row;
                cr_assert_eq(r[i], dp_bf16_from_float(x[at]), "rounded item %zu", i);
                cr_assert_eq(bits_of(w[i]), (uint32_t)h[at] << 16, "widened item %zu", i);
            }
    free(w);
    dp_device_free(dev, dx), dp_device_free(dev, dw), dp_device_free(dev, dh),
        dp_device_free(dev, dr);
    dp_device_close(dev);
}

Test(bf16, convert_on_a_device_matches_the_host)
{
    enum { N = 1000 };
    dp_device *dev = dp_test_cpu(0);
    float x[N];
    dp_rng rng;
    dp_rng_seed(&rng, 7);
    for (int i = 0; i < N; i++) x[i] = (dp_rng_uniform(&rng) - 0.5f) * powf(2.0f, (float)(i % 60 - 30));
    x[0] = NAN, x[1] = INFINITY, x[2] = -0.0f, x[3] = FLT_MAX;
    float *d32 = dp_test_upload(dev, x, N), *back = NULL;
    dp_bf16 *d16 = NULL, h16[N];
    dp_assert_ok(dp_device_alloc(dev, N * sizeof *h16, (void **)&d16));
    dp_assert_ok(dp_device_alloc(dev, N * sizeof(float), (void **)&back));
    dp_assert_ok(dp_convert(dev, d16, DP_DTYPE_BF16, d32, DP_DTYPE_F32, N));
    dp_assert_ok(dp_copy_d2h(dev, h16, d16, sizeof h16));
    for (int i = 0; i < N; i++)
        cr_assert_eq(h16[i], dp_bf16_from_float(x[i]), "element %d", i);
    dp_assert_ok(dp_convert(dev, back, DP_DTYPE_F32, d16, DP_DTYPE_BF16, N));
    float *hb = dp_test_nn_download(dev, back, N);
    for (int i = 0; i < N; i++) cr_assert_eq(bits_of(hb[i]), (uint32_t)h16[i] << 16);
    free(hb);
    /* equal types copy; the same pointer is a no-op */
    dp_assert_ok(dp_convert(dev, back, DP_DTYPE_F32, d32, DP_DTYPE_F32, N));
    dp_assert_ok(dp_convert(dev, d16, DP_DTYPE_BF16, d16, DP_DTYPE_BF16, N));
    hb = dp_test_nn_download(dev, back, N);
    cr_assert(memcmp(hb, x, sizeof x) == 0);
    free(hb);

    dp_test_nn_assert_invalid(dp_convert(dev, d16, DP_DTYPE_F16, d32, DP_DTYPE_F32, N), "F16", "cpu:0");
    dp_test_nn_assert_invalid(dp_convert(dev, d16, DP_DTYPE_BF16, d32, DP_DTYPE_I32, N), "I32", NULL);
    dp_test_nn_assert_invalid(dp_convert(dev, d16, DP_DTYPE_BF16, d32, DP_DTYPE_F32, 0), "0 elements", NULL);
    dp_test_nn_assert_invalid(dp_convert(dev, d16, DP_DTYPE_BF16, d32, DP_DTYPE_F32, SIZE_MAX), "elements", NULL);
    dp_test_nn_assert_invalid(dp_convert(dev, NULL, DP_DTYPE_BF16, d32, DP_DTYPE_F32, N), "NULL", NULL);
    dp_test_nn_assert_invalid(dp_convert(NULL, d16, DP_DTYPE_BF16, d32, DP_DTYPE_F32, N), "NULL", NULL);
    dp_device_free(dev, d32);
    dp_device_free(dev, d16);
    dp_device_free(dev, back);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

// --- the _bf16 layers: their float32 twin on the widened parameters ----------------------

/* n random bfloat16 values and their widened floats. */
static void random_params(uint64_t seed, dp_bf16 *h16, float *h32, size_t n, float scale)
{
    dp_rng rng;
    dp_rng_seed(&rng, seed);
    for (size_t i = 0; i < n; i++) {
        h16[i] = dp_bf16_from_float(scale * (2.0f * dp_rng_uniform(&rng) - 1.0f));
        h32[i] = dp_bf16_to_float(h16[i]);
    }
}

static float *random_floats(uint64_t seed, size_t n)
{
    float *x = malloc(n * sizeof *x);
    cr_assert(x);
    dp_rng rng;
    dp_rng_seed(&rng, seed);
    for (size_t i = 0; i < n; i++) x[i] = 2.0f * dp_rng_uniform(&rng) - 1.0f;
    return x;
}

static dp_bf16 *upload16(dp_device *dev, const dp_bf16 *h, size_t n)
{
    void *d = NULL;
    dp_assert_ok(dp_device_alloc(dev, n * sizeof *h, &d));
    dp_assert_ok(dp_copy_h2d(dev, d, h, n * sizeof *h));
    return d;
}

static void assert_same_floats(const char *what, dp_device *dev, const float *a, const float *b,
                               size_t n)
{
    float *ha = dp_test_nn_download(dev, a, n), *hb = dp_test_nn_download(dev, b, n);
    for (size_t i = 0; i < n; i++)
        if (bits_of(ha[i]) != bits_of(hb[i]))
            cr_assert_fail("%s: element %zu differs: bf16 layer %.9g, float32 twin %.9g", what, i,
                           (double)ha[i], (double)hb[i]);
    free(ha);
    free(hb);
}

/* Each _bf16 layer against its twin, in float32 and in bf16 precision. */
Test(bf16_layers, equal_their_float32_twin_on_widened_parameters)
{
    enum { B = 2, T = 5, C = 24, V = 11, OC = 40, N = B * T };
    for (int prec = 0; prec < 2; prec++) {
        dp_device *dev = dp_test_cpu(1);
        dp_assert_ok(dp_device_set_matmul_precision(dev, prec ? DP_MATMUL_BF16 : DP_MATMUL_FP32));
        /* encoder */
        dp_bf16 wte16[V * C], wpe16[T * C];
        float wte32[V * C], wpe32[T * C];
        random_params(1, wte16, wte32, V * C, 0.5f);
        random_params(2, wpe16, wpe32, T * C, 0.5f);
        int32_t tok[N];
        for (int i = 0; i < N; i++) tok[i] = (i * 7 + 3) % V;
        int32_t *dtok = nn_upload_i32(dev, tok, N);
        dp_bf16 *dwte16 = upload16(dev, wte16, V * C), *dwpe16 = upload16(dev, wpe16, T * C);
        float *dwte32 = dp_test_upload(dev, wte32, V * C), *dwpe32 = dp_test_upload(dev, wpe32, T * C);
        float *o1 = dp_test_nn_filled(dev, N * OC, 0), *o2 = dp_test_nn_filled(dev, N * OC, 0);
        dp_assert_ok(dp_encoder_forward_bf16(dev, o1, dtok, dwte16, dwpe16, B, T, C));
        dp_assert_ok(dp_encoder_forward(dev, o2, dtok, dwte32, dwpe32, B, T, C));
        assert_same_floats("encoder forward", dev, o1, o2, N * C);

        /* LayerNorm forward and backward */
        dp_bf16 g16[C], b16[C];
        float g32[C], b32[C];
        random_params(3, g16, g32, C, 2.0f);
        random_params(4, b16, b32, C, 1.0f);
        float *x = random_floats(5, N * C), *dy = random_floats(6, N * C);
        float *dx = dp_test_upload(dev, x, N * C), *ddy = dp_test_upload(dev, dy, N * C);
        dp_bf16 *dg16 = upload16(dev, g16, C), *db16 = upload16(dev, b16, C);
        float *dg32 = dp_test_upload(dev, g32, C), *db32 = dp_test_upload(dev, b32, C);
        float *m1 = dp_test_nn_filled(dev, N, 0), *r1 = dp_test_nn_filled(dev, N, 0), *m2 = dp_test_nn_filled(dev, N, 0),
              *r2 = dp_test_nn_filled(dev, N, 0);
        dp_assert_ok(dp_layernorm_forward_bf16(dev, o1, m1, r1, dx, dg16, db16, N, C));
        dp_assert_ok(dp_layernorm_forward(dev, o2, m2, r2, dx, dg32, db32, N, C));
        assert_same_floats("layernorm forward", dev, o1, o2, N * C);
        float *gi1 = dp_test_nn_filled(dev, N * C, 0.25f), *gi2 = dp_test_nn_filled(dev, N * C, 0.25f);
        float *gw1 = dp_test_nn_filled(dev, C, 0.5f), *gw2 = dp_test_nn_filled(dev, C, 0.5f);
        float *gb1 = dp_test_nn_filled(dev, C, 0.5f), *gb2 = dp_test_nn_filled(dev, C, 0.5f);
        dp_assert_ok(dp_layernorm_backward_bf16(dev, gi1, gw1, gb1, ddy, dx, dg16, m1, r1, N, C));
        dp_assert_ok(dp_layernorm_backward(dev, gi2, gw2, gb2, ddy, dx, dg32, m2, r2, N, C));
        assert_same_floats("layernorm dinp", dev, gi1, gi2, N * C);
        assert_same_floats("layernorm dweight", dev, gw1, gw2, C);
        assert_same_floats("layernorm dbias", dev, gb1, gb2, C);

        /* linear, with and without bias */
        dp_bf16 w16[OC * C], bias16[OC];
        float w32[OC * C], bias32[OC];
        random_params(7, w16, w32, OC * C, 0.3f);
        random_params(8, bias16, bias32, OC, 0.3f);
        dp_bf16 *dw16 = upload16(dev, w16, OC * C), *dbias16 = upload16(dev, bias16, OC);
        float *dw32 = dp_test_upload(dev, w32, OC * C), *dbias32 = dp_test_upload(dev, bias32, OC);
        float *go = random_floats(9, N * OC);
        float *dgo = dp_test_upload(dev, go, N * OC);
        /* in16: the input in bfloat16 too (_bf16_inp), against the float32
         * layer on the rounded input, bit for bit (in BF16 math both GEMMs
         * round dout alike) */
        static dp_bf16 x16[N * C];
        static float xr[N * C];
        for (int i = 0; i < N * C; i++) {
            x16[i] = dp_bf16_from_float(x[i]);
            xr[i] = dp_bf16_to_float(x16[i]);
        }
        dp_bf16 *dx16 = upload16(dev, x16, N * C);
        float *dxr = dp_test_upload(dev, xr, N * C);
        for (int in16 = 0; in16 < 2; in16++)
            for (int with_bias = 0; with_bias < 2; with_bias++) {
                const float *xin = in16 ? dxr : dx; /* the reference's input */
                const char *how = in16 ? ", bf16 input" : "";
                char what[64];
                const dp_bf16 *b16 = with_bias ? dbias16 : NULL;
                if (in16)
                    dp_assert_ok(dp_linear_forward_bf16_inp(dev, o1, dx16, dw16, b16, N, C, OC));
                else
                    dp_assert_ok(dp_linear_forward_bf16(dev, o1, dx, dw16, b16, N, C, OC));
                dp_assert_ok(dp_linear_forward(dev, o2, xin, dw32, with_bias ? dbias32 : NULL, N,
                                               C, OC));
                snprintf(what, sizeof what, "linear forward%s", how);
                assert_same_floats(what, dev, o1, o2, N * OC);
                float *wg1 = dp_test_nn_filled(dev, OC * C, 0.125f), *wg2 = dp_test_nn_filled(dev, OC * C, 0.125f);
                float *bg1 = dp_test_nn_filled(dev, OC, 0), *bg2 = dp_test_nn_filled(dev, OC, 0);
                float *bgrad = with_bias ? bg1 : NULL;
                if (in16)
                    dp_assert_ok(dp_linear_backward_bf16_inp(dev, gi1, wg1, bgrad, dgo, dx16, dw16,
                                                             N, C, OC));
                else
                    dp_assert_ok(dp_linear_backward_bf16(dev, gi1, wg1, bgrad, dgo, dx, dw16, N, C,
                                                         OC));
                dp_assert_ok(dp_linear_backward(dev, gi2, wg2, with_bias ? bg2 : NULL, dgo, xin,
                                                dw32, N, C, OC));
                snprintf(what, sizeof what, "linear dinp%s", how);
                assert_same_floats(what, dev, gi1, gi2, N * C);
                snprintf(what, sizeof what, "linear dweight%s", how);
                assert_same_floats(what, dev, wg1, wg2, OC * C);
                snprintf(what, sizeof what, "linear dbias%s", how);
                assert_same_floats(what, dev, bg1, bg2, OC);
                dp_device_free(dev, wg1), dp_device_free(dev, wg2);
                dp_device_free(dev, bg1), dp_device_free(dev, bg2);
            }
        dp_test_nn_assert_invalid(dp_linear_forward_bf16_inp(dev, o1, NULL, dw16, NULL, N, C, OC), "inp",
                          "dp_linear_forward_bf16_inp");
        /* bf16 math must not equal float32 math on these activations */
        if (prec) {
            dp_device *f32 = dp_test_cpu(2);
            float *fx = dp_test_upload(f32, x, N * C), *fw = dp_test_upload(f32, w32, OC * C);
            float *fo = dp_test_nn_filled(f32, N * OC, 0);
            dp_assert_ok(dp_linear_forward(f32, fo, fx, fw, NULL, N, C, OC));
            dp_assert_ok(dp_linear_forward_bf16(dev, o1, dx, dw16, NULL, N, C, OC));
            float *a = dp_test_nn_download(dev, o1, N * OC), *b = dp_test_nn_download(f32, fo, N * OC);
            cr_assert(memcmp(a, b, N * OC * sizeof *a) != 0,
                      "bf16 precision computed the float32 product");
            free(a), free(b);
            dp_device_close(f32);
        }
        free(x), free(dy), free(go);
        dp_device_close(dev);
    }
}

/* Attention with q, k, v kept as bfloat16 (dp_attention_*_bf16_qkv) is
 * the float32 attention on the rounded qkv, bit for bit, in both
 * precisions: the permutes copy, and the GEMMs see the same values. */
Test(bf16_layers, attention_with_bf16_qkv_is_attention_on_the_rounded_qkv)
{
    enum { B = 2, T = 6, C = 16, NH = 4, BTC = B * T * C, ATT = B * NH * T * T };
    for (int prec = 0; prec < 2; prec++) {
        dp_device *dev = dp_test_cpu(1);
        dp_assert_ok(dp_device_set_matmul_precision(dev, prec ? DP_MATMUL_BF16 : DP_MATMUL_FP32));
        float *qkv = random_floats(21, 3 * BTC), *dout = random_floats(22, BTC);
        static float rounded[3 * BTC];
        for (int i = 0; i < 3 * BTC; i++) rounded[i] = dp_bf16_to_float(dp_bf16_from_float(qkv[i]));
        float *dq = dp_test_upload(dev, qkv, 3 * BTC), *dr = dp_test_upload(dev, rounded, 3 * BTC);
        float *ddo = dp_test_upload(dev, dout, BTC);
        float *o1 = dp_test_nn_filled(dev, BTC, 0), *o2 = dp_test_nn_filled(dev, BTC, 0);
        float *a1 = dp_test_nn_filled(dev, ATT, 0), *a2 = dp_test_nn_filled(dev, ATT, 0);
        float *s1 = dp_test_nn_filled(dev, BTC, 0), *s2 = dp_test_nn_filled(dev, BTC, 0);
        float *r32 = dp_test_nn_filled(dev, 3 * BTC, 0), *w16 = dp_test_nn_filled(dev, 3 * BTC, 0);
        dp_bf16 *r16 = NULL;
        dp_assert_ok(dp_device_alloc(dev, 3 * BTC * sizeof *r16, (void **)&r16));
        dp_assert_ok(dp_attention_forward_bf16_qkv(dev, o1, r16, a1, s1, dq, B, T, C, NH));
        dp_assert_ok(dp_attention_forward(dev, o2, r32, a2, s2, dr, B, T, C, NH));
        /* the permute rounds as it writes: q, k, v are the rounded ones permuted */
        dp_assert_ok(dp_convert(dev, w16, DP_DTYPE_F32, r16, DP_DTYPE_BF16, 3 * BTC));
        assert_same_floats("attention qkvr", dev, w16, r32, 3 * BTC);
        assert_same_floats("attention out", dev, o1, o2, BTC);
        assert_same_floats("attention probabilities", dev, a1, a2, ATT);
        float *g1 = dp_test_nn_filled(dev, 3 * BTC, 0), *g2 = dp_test_nn_filled(dev, 3 * BTC, 0);
        float *gr1 = dp_test_nn_filled(dev, 3 * BTC, 0), *gr2 = dp_test_nn_filled(dev, 3 * BTC, 0);
        float *ga1 = dp_test_nn_filled(dev, ATT, 0), *ga2 = dp_test_nn_filled(dev, ATT, 0);
        dp_assert_ok(dp_attention_backward_bf16_qkv(dev, g1, gr1, ga1, s1, ddo, r16, a1, B, T, C,
                                                    NH));
        dp_assert_ok(dp_attention_backward(dev, g2, gr2, ga2, s2, ddo, r32, a2, B, T, C, NH));
        assert_same_floats("attention dqkv", dev, g1, g2, 3 * BTC);
        dp_test_nn_assert_invalid(dp_attention_forward_bf16_qkv(dev, o1, NULL, a1, s1, dq, B, T, C,
                                                                NH),
                                  "qkvr", "dp_attention_forward_bf16_qkv");
        free(qkv), free(dout);
        dp_device_close(dev);
    }
}

/* dp_attention_probs recomputes the forward's probabilities bit for bit,
 * from float32 and from bfloat16 q, k and v, in both precisions. */
Test(bf16_layers, recomputed_attention_probabilities_are_the_forwards)
{
    enum { B = 2, T = 7, C = 16, NH = 4, BTC = B * T * C, ATT = B * NH * T * T };
    for (int prec = 0; prec < 2; prec++) {
        dp_device *dev = dp_test_cpu(1);
        dp_assert_ok(dp_device_set_matmul_precision(dev, prec ? DP_MATMUL_BF16 : DP_MATMUL_FP32));
        float *qkv = random_floats(23, 3 * BTC);
        float *dq = dp_test_upload(dev, qkv, 3 * BTC), *o = dp_test_nn_filled(dev, BTC, 0);
        float *s = dp_test_nn_filled(dev, BTC, 0), *r32 = dp_test_nn_filled(dev, 3 * BTC, 0);
        float *att = dp_test_nn_filled(dev, ATT, 0), *again = dp_test_nn_filled(dev, ATT, NAN);
        dp_bf16 *r16 = NULL;
        dp_assert_ok(dp_device_alloc(dev, 3 * BTC * sizeof *r16, (void **)&r16));
        dp_assert_ok(dp_attention_forward(dev, o, r32, att, s, dq, B, T, C, NH));
        dp_assert_ok(dp_attention_probs(dev, again, r32, B, T, C, NH));
        assert_same_floats("probabilities from float32 qkvr", dev, again, att, ATT);
        dp_assert_ok(dp_attention_forward_bf16_qkv(dev, o, r16, att, s, dq, B, T, C, NH));
        dp_assert_ok(dp_memset(dev, again, 0xff, ATT * sizeof(float)));
        dp_assert_ok(dp_attention_probs_bf16_qkv(dev, again, r16, B, T, C, NH));
        assert_same_floats("probabilities from bfloat16 qkvr", dev, again, att, ATT);
        dp_test_nn_assert_invalid(dp_attention_probs(dev, NULL, r32, B, T, C, NH), "att",
                          "dp_attention_probs");
        dp_test_nn_assert_invalid(dp_attention_probs_bf16_qkv(dev, again, r16, B, T, 15, NH), "C=15",
                          "dp_attention_probs_bf16_qkv");
        dp_test_nn_assert_invalid(dp_attention_probs(dev, att, att, B, T, C, NH), "same buffer",
                          "dp_attention_probs");
        free(qkv);
        dp_device_close(dev);
    }
}

/* GELU over a bfloat16 pre-activation: the forward (bfloat16 out) is the
 * float32 forward on the widened values rounded once, the backward the
 * float32 backward on them, bit for bit (in place too), and the backward
 * is gelu' at the rounded input against a float64 reference; with its
 * gradients bfloat16 too, the float32 backward of the widened dout rounded
 * once. */
Test(bf16_layers, gelu_backward_over_bf16_input_is_gelu_backward_on_the_rounded_input)
{
    enum { N = 4099 };
    dp_device *dev = dp_test_cpu(1);
    static dp_bf16 x16[N];
    static float x32[N], ref[N];
    random_params(31, x16, x32, N, 6.0f);
    x16[0] = dp_bf16_from_float(1e30f), x32[0] = dp_bf16_to_float(x16[0]); /* saturated */
    x16[1] = dp_bf16_from_float(-1e30f), x32[1] = dp_bf16_to_float(x16[1]);
    float *dout = random_floats(32, N);
    for (int i = 0; i < N; i++) {
        double x = x32[i], k = sqrt(2.0 / 3.14159265358979323846), u = k * (x + 0.044715 * x * x * x);
        double t = fabs(x) > 1e10 ? (x > 0 ? 1.0 : -1.0) : tanh(u);
        double du = k * (1.0 + 3.0 * 0.044715 * x * x);
        double g = fabs(x) > 1e10 ? (x > 0 ? 1.0 : 0.0) : 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du;
        ref[i] = (float)(dout[i] * g);
    }
    dp_bf16 *d16 = upload16(dev, x16, N);
    float *d32 = dp_test_upload(dev, x32, N), *dd = dp_test_upload(dev, dout, N);
    float *g1 = dp_test_nn_filled(dev, N, 0), *g2 = dp_test_nn_filled(dev, N, 0);
    dp_assert_ok(dp_gelu_backward_bf16_inp(dev, g1, d16, dd, N));
    dp_assert_ok(dp_gelu_backward(dev, g2, d32, dd, N));
    assert_same_floats("gelu backward", dev, g1, g2, N);
    dp_assert_ok(dp_gelu_backward_bf16_inp(dev, dd, d16, dd, N)); /* in place */
    assert_same_floats("gelu backward in place", dev, dd, g2, N);
    /* the forward: bf16(gelu(x)) */
    dp_assert_ok(dp_gelu_forward(dev, g2, d32, N));
    float *f32 = dp_test_nn_download(dev, g2, N);
    dp_bf16 *o16 = upload16(dev, x16, N), h16[N];
    dp_assert_ok(dp_gelu_forward_bf16(dev, o16, d16, N));
    dp_assert_ok(dp_copy_d2h(dev, h16, o16, sizeof h16));
    for (int i = 0; i < N; i++)
        cr_assert_eq(h16[i], dp_bf16_from_float(f32[i]), "gelu forward %d: x %g", i,
                     (double)x32[i]);
    dp_assert_ok(dp_gelu_forward_bf16(dev, d16, d16, N)); /* in place */
    dp_bf16 in_place[N];
    dp_assert_ok(dp_copy_d2h(dev, in_place, d16, sizeof in_place));
    cr_assert(memcmp(in_place, h16, sizeof h16) == 0, "gelu forward in place differs");
    dp_test_nn_assert_invalid(dp_gelu_forward_bf16(dev, NULL, d16, N), "out", "dp_gelu_forward_bf16");
    free(f32);
    float *h = dp_test_nn_download(dev, g1, N);
    dp_assert_allclose(h, ref, N, 1e-6, 1e-5);
    free(h);
    dp_test_nn_assert_invalid(dp_gelu_backward_bf16_inp(dev, g1, NULL, g2, N), "inp",
                      "dp_gelu_backward_bf16_inp");
    dp_test_nn_assert_invalid(dp_gelu_backward_bf16_inp(dev, g1, d16, g2, 0), "n",
                      "dp_gelu_backward_bf16_inp");
    /* the gradients kept as bfloat16 too (nn/nn_act16.h): the float32
     * backward from the widened bfloat16 dout, rounded once, separate and
     * in place */
    static dp_bf16 dout16[N], got16[N];
    static float dwide[N];
    for (int i = 0; i < N; i++) {
        dout16[i] = dp_bf16_from_float(dout[i]);
        dwide[i] = dp_bf16_to_float(dout16[i]);
    }
    dp_bf16 *o = upload16(dev, dout16, N), *xi = upload16(dev, x16, N);
    float *in = dp_test_upload(dev, dwide, N), *want = dp_test_nn_filled(dev, N, 0);
    dp_assert_ok(dp_gelu_backward_bf16_inp(dev, want, xi, in, N));
    float *w32 = dp_test_nn_download(dev, want, N);
    for (int in_place = 0; in_place < 2; in_place++) {
        dp_bf16 *gi = upload16(dev, dout16, N), *go = in_place ? gi : o;
        dp_assert_ok(dp_gelu_backward_bf16(dev, go, xi, gi, N));
        dp_assert_ok(dp_copy_d2h(dev, got16, go, sizeof got16));
        for (int i = 0; i < N; i++)
            cr_assert_eq(got16[i], dp_bf16_from_float(w32[i]), "in place %d: %d", in_place, i);
        dp_device_free(dev, gi);
    }
    free(w32);
    dp_test_nn_assert_invalid(dp_gelu_backward_bf16(dev, NULL, xi, o, N), "dinp",
                              "dp_gelu_backward_bf16");
    dp_test_nn_assert_invalid(dp_gelu_backward_bf16(dev, o, xi, o, 0), "n", NULL);
    dp_test_nn_assert_invalid(dp_gelu_backward_bf16(dev, xi + 1, xi, o, N), "overlap", NULL);
    dp_device_free(dev, o);
    dp_device_free(dev, xi);
    dp_device_free(dev, in);
    dp_device_free(dev, want);
    free(dout);
    dp_device_close(dev);
}

Test(bf16_layers, argument_errors_name_the_bf16_function)
{
    dp_device *dev = dp_test_cpu(0);
    float *f = dp_test_nn_filled(dev, 64, 0);
    dp_bf16 *h = upload16(dev, (dp_bf16[64]){0}, 64);
    int32_t *t = nn_upload_i32(dev, (int32_t[4]){0}, 4);
    dp_test_nn_assert_invalid(dp_encoder_forward_bf16(dev, f, t, NULL, h, 1, 2, 2), "wte",
                      "dp_encoder_forward_bf16");
    dp_test_nn_assert_invalid(dp_linear_forward_bf16(dev, f, f, h, NULL, 0, 2, 2), "N",
                      "dp_linear_forward_bf16");
    dp_test_nn_assert_invalid(dp_linear_backward_bf16(dev, f, NULL, NULL, f, f, h, 2, 2, 2), "dweight",
                      "dp_linear_backward_bf16");
    dp_test_nn_assert_invalid(dp_layernorm_forward_bf16(dev, f, f, f, f, h, NULL, 2, 2), "bias",
                      "dp_layernorm_forward_bf16");
    dp_test_nn_assert_invalid(dp_layernorm_backward_bf16(dev, f, f, f, f, f, h, f, f, 2, 0), "C",
                      "dp_layernorm_backward_bf16");
    dp_device_close(dev);
}

// --- threads -----------------------------------------------------------------------------

typedef struct gemm_job {
    dp_device *dev;
    const float *A, *B;
    float *C;
    int n;
} gemm_job;

static void *run_gemms(void *arg)
{
    gemm_job *j = arg;
    for (int r = 0; r < 20; r++)
        if (dp_gemm(j->dev, DP_OP_N, DP_OP_N, j->n, j->n, j->n, 1, j->A, j->n, j->B, j->n, 0,
                    j->C, j->n) != DP_OK)
            return (void *)1;
    return NULL;
}

/* Two threads' bf16 GEMMs on one device share its conversion scratch: each
 * still gets its own product (the device serialises them). */
Test(bf16_threads, concurrent_gemms_on_one_device_get_their_own_results)
{
    enum { N = 96 };
    dp_device *dev = dp_test_cpu(0);
    dp_assert_ok(dp_device_set_matmul_precision(dev, DP_MATMUL_BF16));
    float *x = random_floats(11, N * N), *y = random_floats(12, N * N);
    float *A[2] = {dp_test_upload(dev, x, N * N), dp_test_upload(dev, y, N * N)};
    float *C[2] = {dp_test_nn_filled(dev, N * N, 0), dp_test_nn_filled(dev, N * N, 0)};
    float *want[2];
    for (int i = 0; i < 2; i++) {
        dp_assert_ok(dp_gemm(dev, DP_OP_N, DP_OP_N, N, N, N, 1, A[i], N, A[i], N, 0, C[i], N));
        want[i] = dp_test_nn_download(dev, C[i], N * N);
        dp_assert_ok(dp_memset(dev, C[i], 0, N * N * sizeof(float)));
    }
    pthread_t th[2];
    gemm_job jobs[2] = {{dev, A[0], A[0], C[0], N}, {dev, A[1], A[1], C[1], N}};
    for (int i = 0; i < 2; i++) cr_assert_eq(pthread_create(&th[i], NULL, run_gemms, &jobs[i]), 0);
    for (int i = 0; i < 2; i++) {
        void *r;
        pthread_join(th[i], &r);
        cr_assert_null(r, "a GEMM failed on thread %d", i);
        float *got = dp_test_nn_download(dev, C[i], N * N);
        cr_assert(memcmp(got, want[i], N * N * sizeof(float)) == 0, "thread %d's product", i);
        free(got);
        free(want[i]);
    }
    free(x), free(y);
    dp_device_close(dev);
}

#ifdef DP_TEST_HAVE_OMP
/* oneDNN runs one OpenMP thread per call; the calling thread's own
 * setting is back afterwards. */
Test(bf16_threads, the_callers_openmp_setting_is_restored)
{
    dp_device *dev = dp_test_cpu(0);
    dp_assert_ok(dp_device_set_matmul_precision(dev, DP_MATMUL_BF16));
    float *a = dp_test_nn_filled(dev, 64, 1.0f), *c = dp_test_nn_filled(dev, 64, 0);
    omp_set_num_threads(3);
    dp_assert_ok(dp_gemm(dev, DP_OP_N, DP_OP_N, 8, 8, 8, 1, a, 8, a, 8, 0, c, 8));
    cr_assert_eq(omp_get_max_threads(), 3);
    float *h = dp_test_nn_download(dev, c, 64);
    cr_assert_eq(h[0], 8.0f);
    free(h);
    dp_device_close(dev);
}
#endif
