/*
 * Causal multi-head self-attention (dp_attention_forward/backward) on the
 * CPU backend: the forward against a float64 naive reference, the cached
 * att against the causal softmax's invariants, dqkv against float64
 * central finite differences of L = sum(out * w), causality in both
 * directions, the backend's permute and softmax kernels on their own, and
 * argument errors.
 *
 * Every device buffer the layer writes starts filled with NaN (bytes 0xFF),
 * so a value the layer forgets to write, or a read of an unwritten scratch
 * entry, shows up as a NaN failure.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/backend.h"
#include "dp_test.h"

typedef struct shape {
    size_t B, T, C, NH;
} shape;

#define MAX_T 64

// --- helpers ----------------------------------------------------------------------------

static float *dev_nan(dp_device *dev, size_t n)
{
    void *p = NULL;
    dp_assert_ok(dp_device_alloc(dev, n * sizeof(float), &p));
    dp_assert_ok(dp_memset(dev, p, 0xFF, n * sizeof(float)));
    return p;
}

static float *host_normal(dp_rng *rng, size_t n, float std)
{
    float *x = malloc(n * sizeof *x);
    cr_assert_not_null(x);
    dp_rng_fill_normal(rng, x, n, 0.0f, std);
    return x;
}

static void download(dp_device *dev, float *host, const float *d, size_t n)
{
    dp_assert_ok(dp_copy_d2h(dev, host, d, n * sizeof(float)));
}

static void close_checked(dp_device *dev)
{
    dp_memory_stats st;
    dp_device_memory(dev, &st);
    cr_assert_eq(st.in_use, 0, "%zu bytes still allocated on %s", st.in_use,
                 dp_device_name(dev));
    cr_assert_eq(st.n_allocs, 0);
    dp_device_close(dev);
}

/* Index in qkv(B,T,3C) of q (part 0), k (1) or v (2) at (b, t, head h, d). */
static size_t qkv_at(shape s, size_t part, size_t b, size_t t, size_t h, size_t d)
{
    size_t hs = s.C / s.NH;
    return (b * s.T + t) * 3 * s.C + part * s.C + h * hs + d;
}

/* float64 naive forward: out(B,T,C) and, when att is not NULL, att(B,NH,T,T). */
static void ref_forward(double *out, double *att, const double *qkv, shape s)
{
    size_t hs = s.C / s.NH;
    double scale = 1.0 / sqrt((double)hs);
    double p[MAX_T];
    cr_assert(s.T <= MAX_T);
    for (size_t b = 0; b < s.B; b++)
        for (size_t h = 0; h < s.NH; h++)
            for (size_t t = 0; t < s.T; t++) {
                double m = -INFINITY;
                for (size_t t2 = 0; t2 <= t; t2++) {
                    double dot = 0.0;
                    for (size_t d = 0; d < hs; d++)
                        dot += qkv[qkv_at(s, 0, b, t, h, d)] * qkv[qkv_at(s, 1, b, t2, h, d)];
                    p[t2] = dot * scale;
                    if (p[t2] > m) m = p[t2];
                }
                double sum = 0.0;
                for (size_t t2 = 0; t2 <= t; t2++) {
                    p[t2] = exp(p[t2] - m);
                    sum += p[t2];
                }
                for (size_t t2 = 0; t2 <= t; t2++) p[t2] /= sum;
                for (size_t d = 0; d < hs; d++) {
                    double acc = 0.0;
                    for (size_t t2 = 0; t2 <= t; t2++)
                        acc += p[t2] * qkv[qkv_at(s, 2, b, t2, h, d)];
                    out[(b * s.T + t) * s.C + h * hs + d] = acc;
                }
                if (att)
                    for (size_t t2 = 0; t2 < s.T; t2++)
                        att[((b * s.NH + h) * s.T + t) * s.T + t2] = t2 <= t ? p[t2] : 0.0;
            }
}

/* L = sum(out * w) with the float64 forward. */
static double ref_loss(const double *qkv, const double *w, double *out_tmp, shape s)
{
    ref_forward(out_tmp, NULL, qkv, s);
    double L = 0.0;
    for (size_t i = 0; i < s.B * s.T * s.C; i++) L += out_tmp[i] * w[i];
    return L;
}

/* fd(B,T,3C) = dL/dqkv by central differences of the float64 forward
 * (x is perturbed and restored; tmp holds n_out doubles). Truncation error
 * ~h^2 |L'''| ~ 1e-8, rounding ~1e-16 |L| / h ~ 1e-12, so the reference
 * is good to ~1e-7. */
static void ref_grad_fd(double *fd, double *x, const double *w, double *tmp, shape s)
{
    const double h = 1e-4;
    for (size_t i = 0; i < s.B * s.T * 3 * s.C; i++) {
        double x0 = x[i];
        x[i] = x0 + h;
        double lp = ref_loss(x, w, tmp, s);
        x[i] = x0 - h;
        double lm = ref_loss(x, w, tmp, s);
        x[i] = x0;
        fd[i] = (lp - lm) / (2.0 * h);
    }
}

/* Device buffers of one attention layer; everything the layer writes starts as NaN. */
typedef struct layer {
    dp_device *dev;
    shape s;
    size_t n_qkv, n_out, n_att;
    float *qkv, *out, *qkvr, *att, *scratch;
    float *dout, *dqkv, *dqkvr, *datt, *dscratch;
} layer;

static void layer_init(layer *L, dp_device *dev, shape s, const float *qkv_host)
{
    L->dev = dev;
    L->s = s;
    L->n_qkv = s.B * s.T * 3 * s.C;
    L->n_out = s.B * s.T * s.C;
    L->n_att = s.B * s.NH * s.T * s.T;
    L->qkv = dp_test_upload(dev, qkv_host, L->n_qkv);
    L->out = dev_nan(dev, L->n_out);
    L->qkvr = dev_nan(dev, L->n_qkv);
    L->att = dev_nan(dev, L->n_att);
    L->scratch = dev_nan(dev, L->n_out);
    L->dout = dev_nan(dev, L->n_out);
    L->dqkv = dev_nan(dev, L->n_qkv);
    L->dqkvr = dev_nan(dev, L->n_qkv);
    L->datt = dev_nan(dev, L->n_att);
    L->dscratch = dev_nan(dev, L->n_out);
}

static void layer_forward(layer *L)
{
    shape s = L->s;
    dp_assert_ok(dp_attention_forward(L->dev, L->out, L->qkvr, L->att, L->scratch, L->qkv, s.B,
                                      s.T, s.C, s.NH));
}

static void layer_backward(layer *L, const float *dout_host)
{
    shape s = L->s;
    dp_assert_ok(dp_copy_h2d(L->dev, L->dout, dout_host, L->n_out * sizeof(float)));
    dp_assert_ok(dp_attention_backward(L->dev, L->dqkv, L->dqkvr, L->datt, L->dscratch, L->dout,
                                       L->qkvr, L->att, s.B, s.T, s.C, s.NH));
}

static void layer_free(layer *L)
{
    float *bufs[] = {L->qkv,  L->out,  L->qkvr,  L->att,  L->scratch,
                     L->dout, L->dqkv, L->dqkvr, L->datt, L->dscratch};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dp_device_free(L->dev, bufs[i]);
}

static double *to_double(const float *x, size_t n)
{
    double *d = malloc(n * sizeof *d);
    cr_assert_not_null(d);
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

// --- forward ------------------------------------------------------------------------------

/* T=1 (the softmax is exactly 1), NH=1, non-square heads (B=2,T=5,C=12,NH=3),
 * odd T, and a longer T with wider heads. */
static const shape fwd_shapes[] = {
    {1, 1, 4, 1}, {2, 5, 12, 3}, {1, 7, 8, 1}, {3, 16, 32, 4}, {2, 33, 48, 2},
};

Test(attention, forward_matches_float64_reference)
{
    dp_device *dev = dp_test_cpu(0);
    for (size_t si = 0; si < sizeof fwd_shapes / sizeof fwd_shapes[0]; si++) {
        shape s = fwd_shapes[si];
        size_t hs = s.C / s.NH;
        dp_rng rng;
        dp_rng_seed(&rng, 1000 + si);
        layer L;
        size_t n_qkv = s.B * s.T * 3 * s.C;
        /* std 2 makes some rows peaked (scores of several units), so the
         * max subtraction and small probabilities are exercised too. */
        float *qkv = host_normal(&rng, n_qkv, 2.0f);
        layer_init(&L, dev, s, qkv);
        layer_forward(&L);

        float *out = malloc(L.n_out * sizeof *out), *att = malloc(L.n_att * sizeof *att);
        float *qkvr = malloc(n_qkv * sizeof *qkvr);
        download(dev, out, L.out, L.n_out);
        download(dev, att, L.att, L.n_att);
        download(dev, qkvr, L.qkvr, n_qkv);

        double *qkv_d = to_double(qkv, n_qkv);
        double *out_ref = malloc(L.n_out * sizeof *out_ref);
        double *att_ref = malloc(L.n_att * sizeof *att_ref);
        ref_forward(out_ref, att_ref, qkv_d, s);
        double *out_d = to_double(out, L.n_out), *att_d = to_double(att, L.n_att);

        cr_log_info("shape B=%zu T=%zu C=%zu NH=%zu", s.B, s.T, s.C, s.NH);
        /* att: float32 dot products over hs <= 24 terms of std-2 inputs
         * (scores up to ~10 after the scale), then expf and a <= 33-term
         * float sum: each step rounds at ~6e-8 relative, and an error e in
         * a score moves a probability p by ~p*e. Measured max |diff|:
         * 4e-7 (T=33); atol 4e-6 is a 10x margin. A wrong scale or mask is
         * off by > 1e-2. */
        dp_assert_allclose(att_d, att_ref, L.n_att, 4e-6, 1e-5);
        /* out: a convex combination of T <= 33 v values (|v| <~ 8) carrying
         * the att errors, plus the float32 GEMM's own rounding. Measured
         * max |diff|: 2.9e-6; atol 3e-5 is a 10x margin. */
        dp_assert_allclose(out_d, out_ref, L.n_out, 3e-5, 1e-5);

        /* qkvr is a pure copy: exact. */
        for (size_t part = 0; part < 3; part++)
            for (size_t b = 0; b < s.B; b++)
                for (size_t h = 0; h < s.NH; h++)
                    for (size_t t = 0; t < s.T; t++)
                        for (size_t d = 0; d < hs; d++) {
                            size_t r = (((part * s.B + b) * s.NH + h) * s.T + t) * hs + d;
                            cr_assert_eq(qkvr[r], qkv[qkv_at(s, part, b, t, h, d)],
                                         "qkvr[%zu] (part %zu b %zu h %zu t %zu d %zu)", r,
                                         part, b, h, t, d);
                        }

        free(out);
        free(att);
        free(qkvr);
        free(qkv);
        free(qkv_d);
        free(out_ref);
        free(att_ref);
        free(out_d);
        free(att_d);
        layer_free(&L);
    }
    close_checked(dev);
}

Test(attention, cached_att_is_causal_and_rows_sum_to_one)
{
    dp_device *dev = dp_test_cpu(0);
    const shape shapes[] = {{2, 9, 12, 3}, {1, 1, 4, 2}};
    for (size_t si = 0; si < 2; si++) {
        shape s = shapes[si];
        dp_rng rng;
        dp_rng_seed(&rng, 77 + si);
        float *qkv = host_normal(&rng, s.B * s.T * 3 * s.C, 3.0f);
        layer L;
        layer_init(&L, dev, s, qkv);
        layer_forward(&L);
        float *att = malloc(L.n_att * sizeof *att);
        download(dev, att, L.att, L.n_att);
        for (size_t bh = 0; bh < s.B * s.NH; bh++)
            for (size_t t = 0; t < s.T; t++) {
                const float *row = att + (bh * s.T + t) * s.T;
                double sum = 0.0;
                for (size_t t2 = 0; t2 < s.T; t2++) {
                    if (t2 > t)
                        /* Masked: exactly zero (the buffer started as NaN and the
                         * score GEMM wrote q.k there). */
                        cr_assert(row[t2] == 0.0f && !signbit(row[t2]),
                                  "att[bh %zu, t %zu, t2 %zu] = %g above the diagonal", bh, t,
                                  t2, row[t2]);
                    else
                        cr_assert(row[t2] >= 0.0f && row[t2] <= 1.0f, "att %g out of [0,1]",
                                  row[t2]);
                    sum += row[t2];
                }
                /* float32 normalisation of <= 9 terms: a few ulps of 1. */
                cr_assert(fabs(sum - 1.0) <= 1e-6, "row bh %zu t %zu sums to %.9g", bh, t, sum);
            }
        /* T = 1: the only key gets weight 1 exactly (exp(0)/exp(0)). */
        if (s.T == 1)
            for (size_t bh = 0; bh < s.B * s.NH; bh++) cr_assert_eq(att[bh], 1.0f);
        free(att);
        free(qkv);
        layer_free(&L);
    }
    close_checked(dev);
}

// --- backward -----------------------------------------------------------------------------

static const shape bwd_shapes[] = {
    {1, 1, 4, 1}, {2, 5, 12, 3}, {1, 6, 8, 1}, {2, 8, 16, 2},
};

Test(attention, backward_matches_finite_differences)
{
    dp_device *dev = dp_test_cpu(0);
    for (size_t si = 0; si < sizeof bwd_shapes / sizeof bwd_shapes[0]; si++) {
        shape s = bwd_shapes[si];
        dp_rng rng;
        dp_rng_seed(&rng, 2000 + si);
        size_t n_qkv = s.B * s.T * 3 * s.C, n_out = s.B * s.T * s.C;
        float *qkv = host_normal(&rng, n_qkv, 1.0f);
        float *w = host_normal(&rng, n_out, 1.0f);
        layer L;
        layer_init(&L, dev, s, qkv);
        layer_forward(&L);
        /* dL/dout = w for L = sum(out * w). */
        layer_backward(&L, w);
        float *dqkv = malloc(n_qkv * sizeof *dqkv);
        download(dev, dqkv, L.dqkv, n_qkv);

        double *x = to_double(qkv, n_qkv), *wd = to_double(w, n_out);
        double *tmp = malloc(n_out * sizeof *tmp), *fd = malloc(n_qkv * sizeof *fd);
        ref_grad_fd(fd, x, wd, tmp, s);
        double *dqkv_d = to_double(dqkv, n_qkv);
        cr_log_info("shape B=%zu T=%zu C=%zu NH=%zu", s.B, s.T, s.C, s.NH);
        /* float32 backward: five GEMMs over <= 8 terms and a softmax
         * backward on gradients of order 1, so float32 rounding gives a few
         * 1e-7 (measured max |diff| 3.4e-7, FD error included). atol 4e-6
         * is a 10x margin; a missing scale (factor 2 or 2.8 here) or a
         * wrong transpose is off by > 1e-1. */
        dp_assert_allclose(dqkv_d, fd, n_qkv, 4e-6, 1e-5);

        if (s.T == 1) {
            /* One key: the softmax is constant 1, so q and k get no gradient
             * at all, exactly. */
            for (size_t i = 0; i < n_qkv; i++)
                if (i % (3 * s.C) < 2 * s.C)
                    cr_assert(dqkv[i] == 0.0f, "T=1: dq/dk[%zu] = %g, expected 0", i, dqkv[i]);
        }

        free(qkv);
        free(w);
        free(dqkv);
        free(x);
        free(wd);
        free(tmp);
        free(fd);
        free(dqkv_d);
        layer_free(&L);
    }
    close_checked(dev);
}

// --- causality ----------------------------------------------------------------------------

Test(attention, future_tokens_do_not_change_past_outputs)
{
    dp_device *dev = dp_test_cpu(0);
    shape s = {2, 8, 16, 2};
    size_t n_qkv = s.B * s.T * 3 * s.C, n_out = s.B * s.T * s.C;
    dp_rng rng;
    dp_rng_seed(&rng, 31);
    float *qkv = host_normal(&rng, n_qkv, 1.0f);
    layer L;
    layer_init(&L, dev, s, qkv);
    layer_forward(&L);
    float *out0 = malloc(n_out * sizeof *out0), *out1 = malloc(n_out * sizeof *out1);
    download(dev, out0, L.out, n_out);

    for (size_t t0 = 1; t0 < s.T; t0++) {
        /* Replace q, k and v at position t0 (every batch row) with new values. */
        float *changed = malloc(n_qkv * sizeof *changed);
        memcpy(changed, qkv, n_qkv * sizeof *changed);
        for (size_t b = 0; b < s.B; b++)
            dp_rng_fill_normal(&rng, changed + (b * s.T + t0) * 3 * s.C, 3 * s.C, 0.0f, 5.0f);
        dp_assert_ok(dp_copy_h2d(dev, L.qkv, changed, n_qkv * sizeof(float)));
        layer_forward(&L);
        download(dev, out1, L.out, n_out);
        size_t n_diff_at_t0 = 0;
        for (size_t b = 0; b < s.B; b++)
            for (size_t t = 0; t < s.T; t++)
                for (size_t c = 0; c < s.C; c++) {
                    size_t i = (b * s.T + t) * s.C + c;
                    /* Masked keys contribute 0 * v exactly, so earlier rows are
                     * bitwise identical, not just close. */
                    if (t < t0)
                        cr_assert(out1[i] == out0[i],
                                  "changing token %zu changed out[b %zu, t %zu, c %zu]: %.9g "
                                  "-> %.9g",
                                  t0, b, t, c, out0[i], out1[i]);
                    else if (t == t0 && out1[i] != out0[i])
                        n_diff_at_t0++;
                }
        /* The change is visible where it should be (the test is not vacuous). */
        cr_assert_eq(n_diff_at_t0, s.B * s.C, "position %zu itself: only %zu of %zu changed",
                     t0, n_diff_at_t0, s.B * s.C);
        free(changed);
    }
    free(qkv);
    free(out0);
    free(out1);
    layer_free(&L);
    close_checked(dev);
}

Test(attention, masked_entries_pass_no_gradient)
{
    dp_device *dev = dp_test_cpu(0);
    shape s = {2, 7, 12, 3};
    size_t n_qkv = s.B * s.T * 3 * s.C, n_out = s.B * s.T * s.C;
    dp_rng rng;
    dp_rng_seed(&rng, 47);
    float *qkv = host_normal(&rng, n_qkv, 1.0f);
    layer L;
    layer_init(&L, dev, s, qkv);
    layer_forward(&L);
    float *dout = calloc(n_out, sizeof *dout), *dqkv = malloc(n_qkv * sizeof *dqkv);
    for (size_t t0 = 0; t0 < s.T; t0++) {
        /* A gradient on output position t0 only. Its datt row holds
         * dy[t0].v[t2] != 0 for future keys t2 > t0 too: only the mask
         * keeps it from reaching k and v there. */
        memset(dout, 0, n_out * sizeof *dout);
        for (size_t b = 0; b < s.B; b++)
            dp_rng_fill_normal(&rng, dout + (b * s.T + t0) * s.C, s.C, 0.0f, 1.0f);
        layer_backward(&L, dout);
        download(dev, dqkv, L.dqkv, n_qkv);
        for (size_t b = 0; b < s.B; b++)
            for (size_t t = 0; t < s.T; t++)
                for (size_t part = 0; part < 3; part++) {
                    const float *g = dqkv + (b * s.T + t) * 3 * s.C + part * s.C;
                    /* q at t only feeds out[t]; k and v at t only feed out[t' >= t]. */
                    int must_be_zero = part == 0 ? t != t0 : t > t0;
                    size_t nz = 0;
                    for (size_t c = 0; c < s.C; c++) nz += g[c] != 0.0f;
                    if (must_be_zero)
                        cr_assert_eq(nz, 0,
                                     "dout at t0=%zu gave %zu non-zero d%c entries at t=%zu "
                                     "(b %zu)",
                                     t0, nz, "qkv"[part], t, b);
                    else if (part == 2)
                        /* v at t <= t0 has weight att[t0,t] > 0: gradient non-zero. */
                        cr_assert_eq(nz, s.C, "dv at t=%zu <= t0=%zu has zeros", t, t0);
                }
    }
    free(qkv);
    free(dout);
    free(dqkv);
    layer_free(&L);
    close_checked(dev);
}

// --- the backend kernels on their own --------------------------------------------------------

/* Scores far apart: the row's maximum must be taken over every valid key,
 * the diagonal (last valid position) included, or exp overflows. Three
 * heads of (T,T) scores, row t valid at keys 0..t:
 *   head 0: +1e4 on the diagonal, -1e4 before it (the maximum is last),
 *   head 1: +1e4 at key 0, -1e4 after it (the maximum is first),
 *   head 2: 200 on the diagonal, 0 before it ([0, 0, 200] for t = 2).
 * Each row's softmax is one-hot at its maximum in float32 (the other
 * terms, exp(-2e4) and exp(-200), underflow to 0), so att must be exactly
 * 0 or 1, and the backward of a one-hot row is exactly 0. */
Test(attention, kernel_softmax_large_scores_max_at_either_end)
{
    dp_device *dev = dp_test_cpu(0);
    const dp_backend_ops *ops = dev->ops;
    const size_t BNH = 3, T = 5, n = BNH * T * T;
    const float scale = 1.0f;
    float s[3 * 5 * 5], g[3 * 5 * 5];
    for (size_t h = 0; h < BNH; h++)
        for (size_t t = 0; t < T; t++)
            for (size_t j = 0; j < T; j++) {
                float v = NAN; /* masked: never read */
                if (j <= t) {
                    if (h == 0) v = j == t ? 1e4f : -1e4f;
                    else if (h == 1) v = j == 0 ? 1e4f : -1e4f;
                    else v = j == t ? 200.0f : 0.0f;
                }
                s[(h * T + t) * T + j] = v;
                g[(h * T + t) * T + j] = j <= t ? (float)(j + 1) * 0.25f : NAN;
            }
    float *d_att = dp_test_upload(dev, s, n), *d_g = dp_test_upload(dev, g, n);
    dp_assert_ok(ops->softmax_causal_forward(dev, d_att, NULL, scale, T, 0, T, BNH * T));
    dp_assert_ok(ops->softmax_causal_backward(dev, d_g, NULL, d_att, scale, T, 0, T, BNH * T));
    float att[3 * 5 * 5], ds[3 * 5 * 5];
    download(dev, att, d_att, n);
    download(dev, ds, d_g, n);
    for (size_t h = 0; h < BNH; h++)
        for (size_t t = 0; t < T; t++) {
            size_t hot = h == 1 ? 0 : t;
            for (size_t j = 0; j < T; j++) {
                float a = att[(h * T + t) * T + j], d = ds[(h * T + t) * T + j];
                float want = j == hot ? 1.0f : 0.0f;
                cr_assert(a == want, "head %zu row %zu key %zu: att = %g, want %g (the row "
                          "maximum must include keys 0..t, diagonal included)", h, t, j, a,
                          want);
                cr_assert(d == 0.0f, "head %zu row %zu key %zu: ds = %g, want 0 (one-hot "
                          "row)", h, t, j, d);
            }
        }
    dp_device_free(dev, d_att);
    dp_device_free(dev, d_g);
    close_checked(dev);
}

/* The same through the layer: one head whose scores are q.k/sqrt(hs) with
 * |q.k| ~ 1e4, the key of the current position winning (the diagonal).
 * out at each t must be v[t] (att one-hot on the diagonal), finite. */
Test(attention, forward_large_scores_diagonal_wins)
{
    dp_device *dev = dp_test_cpu(0);
    const size_t B = 1, T = 4, C = 4, NH = 1, hs = 4;
    /* q_t = k_t = 50 * e_(t mod 4) scaled so that q_t.k_t = 1e4 * 2 (= 2e4
     * after 1/sqrt(hs)), q_t.k_j = 0 for j != t: the diagonal is the
     * maximum by 1e4. v_t = t + 1 in every channel. */
    float qkv[1 * 4 * 12];
    for (size_t t = 0; t < T; t++)
        for (size_t c = 0; c < C; c++) {
            float one = c == t ? 141.42136f : 0.0f; /* 141.42^2 = 2e4 */
            qkv[t * 3 * C + c] = one;                    /* q */
            qkv[t * 3 * C + C + c] = one;                /* k */
            qkv[t * 3 * C + 2 * C + c] = (float)(t + 1); /* v */
        }
    float *d_qkv = dp_test_upload(dev, qkv, B * T * 3 * C);
    float *out = dev_nan(dev, B * T * C), *qkvr = dev_nan(dev, 3 * B * T * C),
          *att = dev_nan(dev, B * NH * T * T), *scratch = dev_nan(dev, B * T * C);
    dp_assert_ok(dp_attention_forward(dev, out, qkvr, att, scratch, d_qkv, B, T, C, NH));
    float h_out[16];
    download(dev, h_out, out, B * T * C);
    for (size_t t = 0; t < T; t++)
        for (size_t c = 0; c < hs; c++)
            cr_assert(h_out[t * C + c] == (float)(t + 1), "out[t=%zu][%zu] = %g, want %g (att "
                      "one-hot on the diagonal)", t, c, h_out[t * C + c], (double)(t + 1));
    dp_device_free(dev, d_qkv);
    dp_device_free(dev, out);
    dp_device_free(dev, qkvr);
    dp_device_free(dev, att);
    dp_device_free(dev, scratch);
    close_checked(dev);
}

Test(attention, kernel_softmax_rows_match_float64)
{
    dp_device *dev = dp_test_cpu(0);
    const dp_backend_ops *ops = dev->ops;
    const size_t BNH = 3, T = 6, n = BNH * T * T;
    const float scale = 0.5f;
    dp_rng rng;
    dp_rng_seed(&rng, 5);
    float *s = host_normal(&rng, n, 2.0f), *g = host_normal(&rng, n, 1.0f);
    /* NaN above the diagonal: the kernels must neither read nor keep it. */
    for (size_t r = 0; r < BNH * T; r++)
        for (size_t j = r % T + 1; j < T; j++) s[r * T + j] = g[r * T + j] = NAN;
    float *d_att = dp_test_upload(dev, s, n), *d_g = dp_test_upload(dev, g, n);
    dp_assert_ok(ops->softmax_causal_forward(dev, d_att, NULL, scale, T, 0, T, BNH * T));
    dp_assert_ok(ops->softmax_causal_backward(dev, d_g, NULL, d_att, scale, T, 0, T, BNH * T));
    float *att = malloc(n * sizeof *att), *ds = malloc(n * sizeof *ds);
    download(dev, att, d_att, n);
    download(dev, ds, d_g, n);

    double *p = malloc(n * sizeof *p), *dref = malloc(n * sizeof *dref);
    for (size_t r = 0; r < BNH * T; r++) {
        size_t t = r % T;
        double m = -INFINITY, sum = 0.0, dot = 0.0;
        for (size_t j = 0; j <= t; j++) m = fmax(m, scale * (double)s[r * T + j]);
        for (size_t j = 0; j <= t; j++) sum += exp(scale * (double)s[r * T + j] - m);
        for (size_t j = 0; j < T; j++)
            p[r * T + j] = j <= t ? exp(scale * (double)s[r * T + j] - m) / sum : 0.0;
        /* Softmax Jacobian: dz_j = p_j (g_j - sum_i p_i g_i), times the scale. */
        for (size_t j = 0; j <= t; j++) dot += p[r * T + j] * g[r * T + j];
        for (size_t j = 0; j < T; j++)
            dref[r * T + j] = j <= t ? scale * p[r * T + j] * (g[r * T + j] - dot) : 0.0;
    }
    double *att_d = to_double(att, n), *ds_d = to_double(ds, n);
    /* float32 expf and <= 6-term sums on values of order 1: a few ulps
     * (measured max |diff| 4.4e-8 for att, 2e-8 for ds); atol 5e-7 is a
     * 10x margin. */
    dp_assert_allclose(att_d, p, n, 5e-7, 1e-6);
    dp_assert_allclose(ds_d, dref, n, 5e-7, 1e-6);
    for (size_t r = 0; r < BNH * T; r++)
        for (size_t j = r % T + 1; j < T; j++) {
            cr_assert(att[r * T + j] == 0.0f, "att row %zu col %zu = %g", r, j, att[r * T + j]);
            cr_assert(ds[r * T + j] == 0.0f, "ds row %zu col %zu = %g", r, j, ds[r * T + j]);
        }
    free(s);
    free(g);
    free(att);
    free(ds);
    free(p);
    free(dref);
    free(att_d);
    free(ds_d);
    dp_device_free(dev, d_att);
    dp_device_free(dev, d_g);
    close_checked(dev);
}

Test(attention, kernel_permutes_are_exact_inverse_pairs)
{
    dp_device *dev = dp_test_cpu(0);
    const dp_backend_ops *ops = dev->ops;
    shape s = {2, 3, 8, 2};
    size_t hs = s.C / s.NH, n3 = s.B * s.T * 3 * s.C, n1 = s.B * s.T * s.C;
    /* Distinct values (the index) so any misplaced element is caught. */
    float *x3 = malloc(n3 * sizeof *x3), *x1 = malloc(n1 * sizeof *x1);
    for (size_t i = 0; i < n3; i++) x3[i] = (float)i;
    for (size_t i = 0; i < n1; i++) x1[i] = (float)i;
    float *d3 = dp_test_upload(dev, x3, n3), *d1 = dp_test_upload(dev, x1, n1);
    float *r3 = dev_nan(dev, n3), *b3 = dev_nan(dev, n3);
    float *r1 = dev_nan(dev, n1), *b1 = dev_nan(dev, n1);
    float *h3 = malloc(n3 * sizeof *h3), *h1 = malloc(n1 * sizeof *h1);

    /* qkv -> qkvr, then back: identity. */
    dp_assert_ok(ops->attention_permute(dev, r3, d3, s.B, s.T, s.NH, hs));
    dp_assert_ok(ops->attention_permute_backward(dev, b3, r3, s.B, s.T, s.NH, hs));
    download(dev, h3, b3, n3);
    for (size_t i = 0; i < n3; i++) cr_assert_eq(h3[i], x3[i], "permute round trip at %zu", i);

    /* y(B,NH,T,hs) -> out(B,T,C): out[b,t,h*hs+d] = y[b,h,t,d]; and back. */
    dp_assert_ok(ops->attention_unpermute(dev, r1, d1, s.B, s.T, s.NH, hs));
    download(dev, h1, r1, n1);
    for (size_t b = 0; b < s.B; b++)
        for (size_t h = 0; h < s.NH; h++)
            for (size_t t = 0; t < s.T; t++)
                for (size_t d = 0; d < hs; d++)
                    cr_assert_eq(h1[(b * s.T + t) * s.C + h * hs + d],
                                 x1[((b * s.NH + h) * s.T + t) * hs + d],
                                 "unpermute b %zu h %zu t %zu d %zu", b, h, t, d);
    dp_assert_ok(ops->attention_unpermute_backward(dev, b1, r1, s.B, s.T, s.NH, hs));
    download(dev, h1, b1, n1);
    for (size_t i = 0; i < n1; i++) cr_assert_eq(h1[i], x1[i], "unpermute round trip at %zu", i);

    free(x3);
    free(x1);
    free(h3);
    free(h1);
    float *bufs[] = {d3, d1, r3, b3, r1, b1};
    for (size_t i = 0; i < 6; i++) dp_device_free(dev, bufs[i]);
    close_checked(dev);
}

// --- bad arguments ------------------------------------------------------------------------

static void expect_invalid(dp_status st, const char *needle)
{
    cr_assert_eq(st, DP_ERR_INVALID_ARGUMENT, "expected invalid argument, got %s (%s)",
                 dp_strerror(st), dp_last_error());
    const char *msg = dp_last_error();
    cr_assert(strstr(msg, needle) != NULL, "message lacks \"%s\": %s", needle, msg);
}

/* The layer the bad-argument tests misuse: B=2, T=5, C=12, NH=3; returns
 * its host qkv (caller frees). */
static float *bad_args_layer(layer *L, dp_device *dev, uint64_t seed)
{
    shape s = {2, 5, 12, 3};
    dp_rng rng;
    dp_rng_seed(&rng, seed);
    float *qkv = host_normal(&rng, s.B * s.T * 3 * s.C, 1.0f);
    layer_init(L, dev, s, qkv);
    return qkv;
}

/* None of the failed calls wrote anything: out is still the NaN fill. */
static void assert_out_unwritten(layer *L)
{
    float *out = malloc(L->n_out * sizeof *out);
    cr_assert_not_null(out);
    download(L->dev, out, L->out, L->n_out);
    for (size_t i = 0; i < L->n_out; i++) cr_assert(isnan(out[i]), "out[%zu] was written", i);
    free(out);
}

Test(attention, bad_arguments)
{
    dp_device *dev = dp_test_cpu(0);
    layer L;
    float *qkv = bad_args_layer(&L, dev, 9);
    const size_t B = L.s.B, T = L.s.T, C = L.s.C, NH = L.s.NH;

#define FWD(dev_, out_, qkvr_, att_, scr_, qkv_, B_, T_, C_, NH_)                               \
    dp_attention_forward(dev_, out_, qkvr_, att_, scr_, qkv_, B_, T_, C_, NH_)
#define BWD(dev_, dqkv_, dqkvr_, datt_, scr_, dout_, qkvr_, att_, B_, T_, C_, NH_)             \
    dp_attention_backward(dev_, dqkv_, dqkvr_, datt_, scr_, dout_, qkvr_, att_, B_, T_, C_, NH_)

    /* NULL device and pointers. */
    expect_invalid(FWD(NULL, L.out, L.qkvr, L.att, L.scratch, L.qkv, B, T, C, NH), "dev");
    expect_invalid(FWD(dev, NULL, L.qkvr, L.att, L.scratch, L.qkv, B, T, C, NH), "cpu:0");
    expect_invalid(FWD(dev, L.out, NULL, L.att, L.scratch, L.qkv, B, T, C, NH), "NULL");
    expect_invalid(FWD(dev, L.out, L.qkvr, NULL, L.scratch, L.qkv, B, T, C, NH), "NULL");
    expect_invalid(FWD(dev, L.out, L.qkvr, L.att, NULL, L.qkv, B, T, C, NH), "NULL");
    expect_invalid(FWD(dev, L.out, L.qkvr, L.att, L.scratch, NULL, B, T, C, NH), "NULL");
    expect_invalid(BWD(NULL, L.dqkv, L.dqkvr, L.datt, L.dscratch, L.dout, L.qkvr, L.att, B, T,
                       C, NH), "dev");
    float *bp[7] = {L.dqkv, L.dqkvr, L.datt, L.dscratch, L.dout, L.qkvr, L.att};
    for (int i = 0; i < 7; i++) {
        float *p[7];
        memcpy(p, bp, sizeof p);
        p[i] = NULL;
        expect_invalid(BWD(dev, p[0], p[1], p[2], p[3], p[4], p[5], p[6], B, T, C, NH), "NULL");
    }

    /* Zero dimensions. */
    expect_invalid(FWD(dev, L.out, L.qkvr, L.att, L.scratch, L.qkv, 0, T, C, NH), "B=0");
    expect_invalid(FWD(dev, L.out, L.qkvr, L.att, L.scratch, L.qkv, B, 0, C, NH), "T=0");
    expect_invalid(FWD(dev, L.out, L.qkvr, L.att, L.scratch, L.qkv, B, T, 0, NH), "C=0");
    expect_invalid(FWD(dev, L.out, L.qkvr, L.att, L.scratch, L.qkv, B, T, C, 0), "NH=0");
    expect_invalid(BWD(dev, L.dqkv, L.dqkvr, L.datt, L.dscratch, L.dout, L.qkvr, L.att, B, 0, C,
                       NH), "T=0");

    /* C not a multiple of NH (12 % 5). */
    expect_invalid(FWD(dev, L.out, L.qkvr, L.att, L.scratch, L.qkv, B, T, C, 5), "multiple");
    expect_invalid(BWD(dev, L.dqkv, L.dqkvr, L.datt, L.dscratch, L.dout, L.qkvr, L.att, B, T, C,
                       5), "multiple");

    /* Size products that overflow size_t: checked before any memory is touched. */
    expect_invalid(FWD(dev, L.out, L.qkvr, L.att, L.scratch, L.qkv, SIZE_MAX / 2, T, C, NH),
                   "overflow");
    expect_invalid(FWD(dev, L.out, L.qkvr, L.att, L.scratch, L.qkv, 1, (size_t)1 << 32, 1, 1),
                   "overflow");
    expect_invalid(BWD(dev, L.dqkv, L.dqkvr, L.datt, L.dscratch, L.dout, L.qkvr, L.att, 1,
                       (size_t)1 << 32, 1, 1), "overflow");
    /* Sizes that fit in size_t but not the GEMM's int batch count. */
    expect_invalid(FWD(dev, L.out, L.qkvr, L.att, L.scratch, L.qkv, (size_t)1 << 31, 1, 1, 1),
                   "2147483647");

    /* The same buffer passed twice. */
    expect_invalid(FWD(dev, L.out, L.qkvr, L.att, L.out, L.qkv, B, T, C, NH), "same buffer");
    expect_invalid(BWD(dev, L.dqkv, L.dqkvr, L.dqkvr, L.dscratch, L.dout, L.qkvr, L.att, B, T, C,
                       NH), "same buffer");

    assert_out_unwritten(&L);

    /* And the valid call still works afterwards. */
    float *out = malloc(L.n_out * sizeof *out);
    cr_assert_not_null(out);
    layer_forward(&L);
    download(dev, out, L.out, L.n_out);
    for (size_t i = 0; i < L.n_out; i++) cr_assert(isfinite(out[i]));
#undef FWD
#undef BWD
    free(out);
    free(qkv);
    layer_free(&L);
    close_checked(dev);
}

// --- query-chunked attention ----------------------------------------------------------------

/* chunked_run's options: q, k and v kept as bfloat16; the probabilities'
 * bfloat16 scratch att16 given. */
enum { RUN_QKVR16 = 1, RUN_ATT16 = 2 };

/* One run of dp_attention_forward_chunked and _backward_chunked with its
 * own buffers, the scratches sized exactly B*NH*min(chunk,T)*T elements
 * (an overrun shows under ASan) and NaN-filled; returns out and dqkv
 * (host, caller frees). With RUN_ATT16 and att16_set, *att16_set = how
 * many of att16's elements the calls wrote (no longer the NaN fill). */
static void chunked_run_ex(dp_device *dev, shape s, const float *qkv_host,
                           const float *dout_host, size_t chunk, int opts, float **out_host,
                           float **dqkv_host, size_t *att16_set)
{
    size_t n_qkv = s.B * s.T * 3 * s.C, n_out = s.B * s.T * s.C;
    size_t rows = chunk < s.T ? chunk : s.T, n_att = s.B * s.NH * rows * s.T;
    int qkvr16 = opts & RUN_QKVR16;
    float *qkv = dp_test_upload(dev, qkv_host, n_qkv), *out = dev_nan(dev, n_out),
          *qkvr = dev_nan(dev, n_qkv),
          *att = dev_nan(dev, n_att), *datt = dev_nan(dev, n_att),
          *scratch = dev_nan(dev, n_out), *dout = dp_test_upload(dev, dout_host, n_out),
          *dqkv = dev_nan(dev, n_qkv), *dqkvr = dev_nan(dev, n_qkv);
    dp_bf16 *att16 = NULL;
    if (opts & RUN_ATT16) {
        void *p = NULL;
        dp_assert_ok(dp_device_alloc(dev, n_att * sizeof(dp_bf16), &p));
        dp_assert_ok(dp_memset(dev, p, 0xFF, n_att * sizeof(dp_bf16)));
        att16 = p;
    }
    dp_dtype t = qkvr16 ? DP_DTYPE_BF16 : DP_DTYPE_F32;
    dp_assert_ok(dp_attention_forward_chunked(dev, out, qkvr, t, att, att16, scratch, qkv, s.B,
                                              s.T, s.C, s.NH, chunk));
    /* The backward needs only qkvr and dout: clobber the forward's scratch. */
    dp_assert_ok(dp_memset(dev, att, 0xFF, n_att * sizeof(float)));
    dp_assert_ok(dp_memset(dev, scratch, 0xFF, n_out * sizeof(float)));
    if (att16) dp_assert_ok(dp_memset(dev, att16, 0xFF, n_att * sizeof(dp_bf16)));
    dp_assert_ok(dp_attention_backward_chunked(dev, dqkv, dqkvr, att, att16, datt, scratch, dout,
                                               qkvr, t, s.B, s.T, s.C, s.NH, chunk));
    *out_host = malloc(n_out * sizeof(float));
    *dqkv_host = malloc(n_qkv * sizeof(float));
    cr_assert(*out_host && *dqkv_host);
    download(dev, *out_host, out, n_out);
    download(dev, *dqkv_host, dqkv, n_qkv);
    if (att16 && att16_set) {
        uint16_t *h = malloc(n_att * sizeof *h);
        cr_assert_not_null(h);
        dp_assert_ok(dp_copy_d2h(dev, h, att16, n_att * sizeof *h));
        *att16_set = 0;
        for (size_t i = 0; i < n_att; i++) *att16_set += h[i] != 0xFFFFu;
        free(h);
    }
    void *bufs[] = {qkv, out, qkvr, att, datt, scratch, dout, dqkv, dqkvr, att16};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) dp_device_free(dev, bufs[i]);
}

static void chunked_run(dp_device *dev, shape s, const float *qkv_host, const float *dout_host,
                        size_t chunk, int qkvr16, float **out_host, float **dqkv_host)
{
    chunked_run_ex(dev, s, qkv_host, dout_host, chunk, qkvr16 ? RUN_QKVR16 : 0, out_host,
                   dqkv_host, NULL);
}

/* Chunks of 1 row, of rows that do not divide T, of T-1, T and past T. */
static const size_t chunk_sizes[] = {1, 2, 3, 5, 7, 8, 64, SIZE_MAX};

/* The forward against the float64 reference and the backward against
 * float64 central differences, for every chunk size: the same bounds as
 * the whole-matrix tests (their comments give the derivation; chunking
 * changes only the order of the key sums). A chunk reading another
 * chunk's keys, a causal offset off by one or a dk/dv contribution lost
 * between chunks is off by > 1e-2. */
Test(attention, chunked_matches_float64_and_finite_differences, .timeout = 120)
{
    dp_device *dev = dp_test_cpu(0);
    const shape shapes[] = {{1, 1, 4, 1}, {2, 5, 12, 3}, {1, 6, 8, 1}, {2, 8, 16, 2}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        shape s = shapes[si];
        size_t n_qkv = s.B * s.T * 3 * s.C, n_out = s.B * s.T * s.C;
        dp_rng rng;
        dp_rng_seed(&rng, 3000 + si);
        float *qkv = host_normal(&rng, n_qkv, 1.5f), *w = host_normal(&rng, n_out, 1.0f);
        double *x = to_double(qkv, n_qkv), *wd = to_double(w, n_out);
        double *ref = malloc(n_out * sizeof *ref), *tmp = malloc(n_out * sizeof *tmp),
               *fd = malloc(n_qkv * sizeof *fd);
        ref_forward(ref, NULL, x, s);
        ref_grad_fd(fd, x, wd, tmp, s);
        for (size_t ci = 0; ci < sizeof chunk_sizes / sizeof chunk_sizes[0]; ci++) {
            float *out, *dqkv;
            chunked_run(dev, s, qkv, w, chunk_sizes[ci], 0, &out, &dqkv);
            cr_log_info("B=%zu T=%zu C=%zu NH=%zu chunk %zu", s.B, s.T, s.C, s.NH,
                        chunk_sizes[ci]);
            double *out_d = to_double(out, n_out), *dqkv_d = to_double(dqkv, n_qkv);
            dp_assert_allclose(out_d, ref, n_out, 3e-5, 1e-5);
            dp_assert_allclose(dqkv_d, fd, n_qkv, 4e-6, 1e-5);
            free(out);
            free(dqkv);
            free(out_d);
            free(dqkv_d);
        }
        free(qkv);
        free(w);
        free(x);
        free(wd);
        free(ref);
        free(tmp);
        free(fd);
    }
    close_checked(dev);
}

/* Against the whole-matrix calls on the same device: chunk >= T is those
 * very calls (bit for bit); smaller chunks split the key sums of the
 * y, dv, dq and dk products, so they differ by float32 rounding only
 * (measured max |diff| ~1e-7 on values of order 1; atol 2e-6). Both with
 * float32 and with bfloat16 qkvr, in FP32 and BF16 matmul precision. */
Test(attention, chunked_tracks_the_whole_matrix, .timeout = 60)
{
    dp_device *dev = dp_test_cpu(0);
    shape s = {2, 33, 48, 3};
    size_t n_qkv = s.B * s.T * 3 * s.C, n_out = s.B * s.T * s.C;
    dp_rng rng;
    dp_rng_seed(&rng, 4242);
    float *qkv = host_normal(&rng, n_qkv, 1.5f), *w = host_normal(&rng, n_out, 1.0f);
    for (int prec = 0; prec < 2; prec++) {
        dp_assert_ok(dp_device_set_matmul_precision(dev, prec ? DP_MATMUL_BF16 : DP_MATMUL_FP32));
        for (int q16 = 0; q16 < 2; q16++) {
            /* The whole-matrix reference. */
            layer L;
            layer_init(&L, dev, s, qkv);
            if (q16)
                dp_assert_ok(dp_attention_forward_bf16_qkv(dev, L.out, (dp_bf16 *)L.qkvr, L.att,
                                                           L.scratch, L.qkv, s.B, s.T, s.C,
                                                           s.NH));
            else
                layer_forward(&L);
            dp_assert_ok(dp_copy_h2d(dev, L.dout, w, n_out * sizeof(float)));
            if (q16)
                dp_assert_ok(dp_attention_backward_bf16_qkv(
                    dev, L.dqkv, L.dqkvr, L.datt, L.dscratch, L.dout, (const dp_bf16 *)L.qkvr,
                    L.att, s.B, s.T, s.C, s.NH));
            else
                dp_assert_ok(dp_attention_backward(dev, L.dqkv, L.dqkvr, L.datt, L.dscratch,
                                                   L.dout, L.qkvr, L.att, s.B, s.T, s.C, s.NH));
            float *out0 = malloc(n_out * sizeof *out0), *dqkv0 = malloc(n_qkv * sizeof *dqkv0);
            download(dev, out0, L.out, n_out);
            download(dev, dqkv0, L.dqkv, n_qkv);
            const size_t chunks[] = {33, 1000, 1, 4, 16, 32};
            for (size_t ci = 0; ci < sizeof chunks / sizeof chunks[0]; ci++) {
                float *out, *dqkv;
                chunked_run(dev, s, qkv, w, chunks[ci], q16, &out, &dqkv);
                cr_log_info("precision %d qkvr16 %d chunk %zu", prec, q16, chunks[ci]);
                if (chunks[ci] >= s.T) {
                    cr_assert(memcmp(out, out0, n_out * sizeof *out) == 0,
                              "chunk %zu >= T: out differs from the whole-matrix call",
                              chunks[ci]);
                    cr_assert(memcmp(dqkv, dqkv0, n_qkv * sizeof *dqkv) == 0,
                              "chunk %zu >= T: dqkv differs from the whole-matrix call",
                              chunks[ci]);
                } else {
                    dp_assert_allclose(out, out0, n_out, 2e-6, 1e-5);
                    dp_assert_allclose(dqkv, dqkv0, n_qkv, 2e-6, 1e-5);
                }
                free(out);
                free(dqkv);
            }
            free(out0);
            free(dqkv0);
            layer_free(&L);
        }
    }
    free(qkv);
    free(w);
    close_checked(dev);
}

/* The bfloat16 copies of the chunks' probabilities and score gradients
 * (att16) are the operands a BF16-precision GEMM would round the float32
 * ones to, so out and dqkv are the same bits with and without att16, for
 * either qkvr type and chunks that do and do not divide T (nothing here
 * is large enough for the GEMM to cut k, gemm_pieces.h). In BF16 the
 * calls do write att16 (the last chunk's score gradients: every element
 * of its rows, the masked tail as 0), so the GEMMs have it to read; in
 * FP32 they leave it alone. */
Test(attention, chunked_att16_gives_the_same_bits, .timeout = 60)
{
    dp_device *dev = dp_test_cpu(0);
    shape s = {2, 21, 24, 3};
    size_t n_qkv = s.B * s.T * 3 * s.C, n_out = s.B * s.T * s.C;
    dp_rng rng;
    dp_rng_seed(&rng, 777);
    float *qkv = host_normal(&rng, n_qkv, 1.5f), *w = host_normal(&rng, n_out, 1.0f);
    const size_t chunks[] = {1, 4, 7, 21, 64};
    for (int prec = 0; prec < 2; prec++) {
        dp_assert_ok(dp_device_set_matmul_precision(dev, prec ? DP_MATMUL_BF16 : DP_MATMUL_FP32));
        for (int q16 = 0; q16 < 2; q16++)
            for (size_t ci = 0; ci < sizeof chunks / sizeof chunks[0]; ci++) {
                float *out0, *dqkv0, *out1, *dqkv1;
                size_t set = 0, rows = chunks[ci] < s.T ? chunks[ci] : s.T;
                int o = q16 ? RUN_QKVR16 : 0;
                chunked_run_ex(dev, s, qkv, w, chunks[ci], o, &out0, &dqkv0, NULL);
                chunked_run_ex(dev, s, qkv, w, chunks[ci], o | RUN_ATT16, &out1, &dqkv1, &set);
                cr_log_info("precision %d qkvr16 %d chunk %zu", prec, q16, chunks[ci]);
                cr_assert(memcmp(out0, out1, n_out * sizeof *out0) == 0,
                          "precision %d qkvr16 %d chunk %zu: out differs with att16", prec, q16,
                          chunks[ci]);
                cr_assert(memcmp(dqkv0, dqkv1, n_qkv * sizeof *dqkv0) == 0,
                          "precision %d qkvr16 %d chunk %zu: dqkv differs with att16", prec,
                          q16, chunks[ci]);
                /* the backward's first chunk is the last one: its nq rows of
                 * T keys per pair are all written */
                size_t last_rows = s.T - (s.T - 1) / rows * rows;
                if (prec)
                    cr_assert_geq(set, s.B * s.NH * last_rows * s.T,
                                  "chunk %zu: att16 has %zu written elements", chunks[ci], set);
                else
                    cr_assert_eq(set, 0, "FP32: att16 was written (%zu elements)", set);
                free(out0);
                free(dqkv0);
                free(out1);
                free(dqkv1);
            }
    }
    free(qkv);
    free(w);
    close_checked(dev);
}

/* The softmax kernels' bfloat16 outputs: the forward's att16 rows are its
 * float32 rows rounded (dp_bf16_round, the masked tail 0) and the float32
 * rows are what they are without att16; the backward with ds16 writes
 * the rounded score gradients there and leaves datt holding d(att). */
Test(attention, kernel_softmax_bf16_outputs_are_the_rounded_rows)
{
    dp_device *dev = dp_test_cpu(0);
    const dp_backend_ops *ops = dev->ops;
    const size_t BNH = 2, q0 = 3, nq = 4, ld = q0 + nq, n = BNH * nq * ld;
    const float scale = 0.35f;
    dp_rng rng;
    dp_rng_seed(&rng, 6161);
    float *s = host_normal(&rng, n, 2.0f), *g = host_normal(&rng, n, 1.0f);
    float *d_s = dp_test_upload(dev, s, n), *d_s16 = dp_test_upload(dev, s, n),
          *d_g = dp_test_upload(dev, g, n), *d_g16 = dp_test_upload(dev, g, n);
    void *p16 = NULL;
    dp_assert_ok(dp_device_alloc(dev, n * sizeof(uint16_t), &p16));
    dp_assert_ok(dp_memset(dev, p16, 0xFF, n * sizeof(uint16_t)));
    dp_assert_ok(ops->softmax_causal_forward(dev, d_s, NULL, scale, ld, q0, nq, BNH * nq));
    dp_assert_ok(ops->softmax_causal_forward(dev, d_s16, p16, scale, ld, q0, nq, BNH * nq));
    float *a = malloc(n * sizeof *a), *a16 = malloc(n * sizeof *a16);
    uint16_t *h16 = malloc(n * sizeof *h16);
    cr_assert(a && a16 && h16);
    download(dev, a, d_s, n);
    download(dev, a16, d_s16, n);
    dp_assert_ok(dp_copy_d2h(dev, h16, p16, n * sizeof *h16));
    cr_assert(memcmp(a, a16, n * sizeof *a) == 0, "the float32 probabilities changed with att16");
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(h16[i], dp_bf16_round(a[i]), "probability %zu: bf16 %#x, %g rounds to %#x",
                     i, h16[i], a[i], dp_bf16_round(a[i]));
    dp_assert_ok(dp_memset(dev, p16, 0xFF, n * sizeof(uint16_t)));
    dp_assert_ok(ops->softmax_causal_backward(dev, d_g, NULL, d_s, scale, ld, q0, nq, BNH * nq));
    dp_assert_ok(ops->softmax_causal_backward(dev, d_g16, p16, d_s, scale, ld, q0, nq, BNH * nq));
    float *ds = malloc(n * sizeof *ds), *kept = malloc(n * sizeof *kept);
    cr_assert(ds && kept);
    download(dev, ds, d_g, n);
    download(dev, kept, d_g16, n);
    dp_assert_ok(dp_copy_d2h(dev, h16, p16, n * sizeof *h16));
    cr_assert(memcmp(kept, g, n * sizeof *g) == 0, "datt changed although ds16 was given");
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(h16[i], dp_bf16_round(ds[i]),
                     "score gradient %zu: bf16 %#x, %g rounds to %#x", i, h16[i], ds[i],
                     dp_bf16_round(ds[i]));
    void *bufs[] = {d_s, d_s16, d_g, d_g16, p16};
    for (size_t i = 0; i < 5; i++) dp_device_free(dev, bufs[i]);
    free(s);
    free(g);
    free(a);
    free(a16);
    free(h16);
    free(ds);
    free(kept);
    close_checked(dev);
}

/* Row chunks of the softmax kernels on their own: queries q0..q0+nq-1
 * over ld = q0 + nq keys equal the same rows of the whole (T,T) matrix
 * bit for bit (the row functions read only keys 0..t), and the masked
 * tail is exactly 0. */
Test(attention, kernel_softmax_chunk_rows_equal_the_whole_rows)
{
    dp_device *dev = dp_test_cpu(0);
    const dp_backend_ops *ops = dev->ops;
    const size_t BNH = 3, T = 11, q0 = 4, nq = 5, ld = q0 + nq;
    const float scale = 0.4f;
    dp_rng rng;
    dp_rng_seed(&rng, 5150);
    float *s = host_normal(&rng, BNH * T * T, 2.0f), *g = host_normal(&rng, BNH * T * T, 1.0f);
    float *sc = malloc(BNH * nq * ld * sizeof *sc), *gc = malloc(BNH * nq * ld * sizeof *gc);
    for (size_t p = 0; p < BNH; p++)
        for (size_t r = 0; r < nq; r++)
            for (size_t j = 0; j < ld; j++) {
                sc[(p * nq + r) * ld + j] = s[(p * T + q0 + r) * T + j];
                gc[(p * nq + r) * ld + j] = g[(p * T + q0 + r) * T + j];
            }
    float *d_s = dp_test_upload(dev, s, BNH * T * T), *d_g = dp_test_upload(dev, g, BNH * T * T);
    float *d_sc = dp_test_upload(dev, sc, BNH * nq * ld),
          *d_gc = dp_test_upload(dev, gc, BNH * nq * ld);
    dp_assert_ok(ops->softmax_causal_forward(dev, d_s, NULL, scale, T, 0, T, BNH * T));
    dp_assert_ok(ops->softmax_causal_backward(dev, d_g, NULL, d_s, scale, T, 0, T, BNH * T));
    dp_assert_ok(ops->softmax_causal_forward(dev, d_sc, NULL, scale, ld, q0, nq, BNH * nq));
    dp_assert_ok(ops->softmax_causal_backward(dev, d_gc, NULL, d_sc, scale, ld, q0, nq, BNH * nq));
    download(dev, s, d_s, BNH * T * T);
    download(dev, g, d_g, BNH * T * T);
    download(dev, sc, d_sc, BNH * nq * ld);
    download(dev, gc, d_gc, BNH * nq * ld);
    for (size_t p = 0; p < BNH; p++)
        for (size_t r = 0; r < nq; r++)
            for (size_t j = 0; j < ld; j++) {
                size_t a = (p * nq + r) * ld + j, b = (p * T + q0 + r) * T + j;
                cr_assert(memcmp(&sc[a], &s[b], sizeof(float)) == 0 &&
                              memcmp(&gc[a], &g[b], sizeof(float)) == 0,
                          "pair %zu query %zu key %zu: chunk row %g/%g, whole row %g/%g", p,
                          q0 + r, j, sc[a], gc[a], s[b], g[b]);
                if (j > q0 + r) cr_assert(sc[a] == 0.0f && gc[a] == 0.0f);
            }
    float *bufs[] = {d_s, d_g, d_sc, d_gc};
    for (size_t i = 0; i < 4; i++) dp_device_free(dev, bufs[i]);
    free(s);
    free(g);
    free(sc);
    free(gc);
    close_checked(dev);
}

Test(attention, chunked_bad_arguments)
{
    dp_device *dev = dp_test_cpu(0);
    layer L;
    float *qkv = bad_args_layer(&L, dev, 19);
    const size_t B = L.s.B, T = L.s.T, C = L.s.C, NH = L.s.NH;
    expect_invalid(dp_attention_forward_chunked(dev, L.out, L.qkvr, DP_DTYPE_F32, L.att, NULL,
                                                L.scratch, L.qkv, B, T, C, NH, 0),
                   "chunk must be >= 1");
    expect_invalid(dp_attention_backward_chunked(dev, L.dqkv, L.dqkvr, L.att, NULL, L.datt,
                                                 L.dscratch, L.dout, L.qkvr, DP_DTYPE_F32, B, T,
                                                 C, NH, 0),
                   "chunk must be >= 1");
    expect_invalid(dp_attention_forward_chunked(dev, L.out, L.qkvr, DP_DTYPE_F16, L.att, NULL,
                                                L.scratch, L.qkv, B, T, C, NH, 2),
                   "neither DP_DTYPE_F32 nor DP_DTYPE_BF16");
    expect_invalid(dp_attention_backward_chunked(dev, L.dqkv, L.dqkvr, L.att, NULL, L.datt,
                                                 L.dscratch, L.dout, L.qkvr, (dp_dtype)99, B,
                                                 T, C, NH, 2),
                   "neither");
    expect_invalid(dp_attention_forward_chunked(NULL, L.out, L.qkvr, DP_DTYPE_F32, L.att, NULL,
                                                L.scratch, L.qkv, B, T, C, NH, 2),
                   "dev");
    /* att16 must not be att (nor any other buffer). */
    expect_invalid(dp_attention_forward_chunked(dev, L.out, L.qkvr, DP_DTYPE_F32, L.att,
                                                (dp_bf16 *)L.att, L.scratch, L.qkv, B, T, C, NH,
                                                2),
                   "att16");
    expect_invalid(dp_attention_backward_chunked(dev, L.dqkv, L.dqkvr, L.att, (dp_bf16 *)L.datt,
                                                 L.datt, L.dscratch, L.dout, L.qkvr,
                                                 DP_DTYPE_F32, B, T, C, NH, 2),
                   "att16");
    /* att and datt must be separate chunk scratches. */
    expect_invalid(dp_attention_backward_chunked(dev, L.dqkv, L.dqkvr, L.att, NULL, L.att, L.dscratch,
                                                 L.dout, L.qkvr, DP_DTYPE_F32, B, T, C, NH, 2),
                   "same buffer");
    expect_invalid(dp_attention_forward_chunked(dev, L.out, L.qkvr, DP_DTYPE_F32, L.att, NULL,
                                                L.scratch, L.qkv, SIZE_MAX / 2, T, C, NH, 2),
                   "overflow");
    assert_out_unwritten(&L);
    free(qkv);
    layer_free(&L);
    close_checked(dev);
}
