/*
 * The fused causal attention (dp_attention_forward_fused /
 * _backward_fused, kernels/flash.h) on the CPU backend:
 *
 *  - out, lse and dqkv against a float64 reference (the analytic backward,
 *    itself checked against central differences), for T = 1, T that no
 *    tile divides, head sizes 4, 7 (odd), 24, 64 and 128;
 *  - bfloat16 qkvr: the same bounds against float64 on the rounded q, k, v
 *    (the fused calls compute with exactly those values);
 *  - a bfloat16 out in the backward: D from the rounded O, as documented;
 *  - against the chunked calls on the same inputs, float32 and bfloat16 qkvr;
 *  - the same bits twice; T = 1 exactly; causality; bad arguments.
 *
 * Every buffer a call writes starts as NaN (bytes 0xFF) and is sized
 * exactly, so an element left unwritten shows as NaN and an overrun under
 * ASan. The CUDA kernels are compared with these loops in test_cuda_ops.c.
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/backend.h"
#include "dp_test.h"
#include "nn/nn_act16.h"

typedef struct shape {
    size_t B, T, C, NH;
} shape;

// --- helpers ----------------------------------------------------------------------------

static void *dev_nan(dp_device *dev, size_t bytes)
{
    void *p = NULL;
    dp_assert_ok(dp_device_alloc(dev, bytes, &p));
    dp_assert_ok(dp_memset(dev, p, 0xFF, bytes));
    return p;
}

static float *host_normal(uint64_t seed, size_t n, float std)
{
    float *x = malloc(n * sizeof *x);
    cr_assert_not_null(x);
    dp_rng rng;
    dp_rng_seed(&rng, seed);
    dp_rng_fill_normal(&rng, x, n, 0.0f, std);
    return x;
}

static float *download(dp_device *dev, const float *d, size_t n)
{
    float *h = malloc(n * sizeof *h);
    cr_assert_not_null(h);
    dp_assert_ok(dp_copy_d2h(dev, h, d, n * sizeof(float)));
    return h;
}

static double *to_double(const float *x, size_t n)
{
    double *d = malloc(n * sizeof *d);
    cr_assert_not_null(d);
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

/* x rounded to bfloat16 and widened: what a bfloat16 buffer holds. */
static float *rounded(const float *x, size_t n)
{
    float *r = malloc(n * sizeof *r);
    cr_assert_not_null(r);
    for (size_t i = 0; i < n; i++) r[i] = dp_bf16_to_float(dp_bf16_from_float(x[i]));
    return r;
}

static void close_checked(dp_device *dev)
{
    dp_memory_stats st;
    dp_device_memory(dev, &st);
    cr_assert_eq(st.in_use, 0, "%zu bytes still allocated on %s", st.in_use,
                 dp_device_name(dev));
    dp_device_close(dev);
}

static size_t n_qkv(shape s) { return s.B * s.T * 3 * s.C; }
static size_t n_out(shape s) { return s.B * s.T * s.C; }
static size_t n_rows(shape s) { return s.B * s.NH * s.T; }

// --- float64 reference ---------------------------------------------------------------------

/* Element d of head h's q (part 0), k (1) or v (2) at (b, t) in qkv(B,T,3C). */
static size_t qkv_at(shape s, size_t part, size_t b, size_t t, size_t h, size_t d)
{
    size_t hs = s.C / s.NH;
    return (b * s.T + t) * 3 * s.C + part * s.C + h * hs + d;
}

/*
 * The attention in float64 on qkv(B,T,3C): out(B,T,C) and lse(B,NH,T)
 * (either may be NULL), and with w = dout(B,T,C) given, dqkv(B,T,3C) by the
 * analytic backward: dv = P^T dO, dP = dO V^T, ds = P (dP - D), dq =
 * scale ds K, dk = scale ds^T Q, with D_t = sum_j p_tj dP_tj (exact), or
 * with o_given(B,T,C) not NULL, D_t = dO_t . o_given_t (a stored O).
 */
static void ref_attention(double *out, double *lse, double *dqkv, const double *x,
                          const double *w, const double *o_given, shape s)
{
    size_t hs = s.C / s.NH, T = s.T;
    double scale = 1.0 / sqrt((double)hs);
    double *P = calloc(T * T, sizeof *P), *dP = calloc(T * T, sizeof *dP);
    cr_assert(P && dP);
    if (dqkv) memset(dqkv, 0, n_qkv(s) * sizeof *dqkv);
    for (size_t b = 0; b < s.B; b++)
        for (size_t h = 0; h < s.NH; h++) {
            for (size_t t = 0; t < T; t++) {
                double m = -INFINITY, sum = 0.0;
                for (size_t j = 0; j <= t; j++) {
                    double dot = 0.0;
                    for (size_t d = 0; d < hs; d++)
                        dot += x[qkv_at(s, 0, b, t, h, d)] * x[qkv_at(s, 1, b, j, h, d)];
                    P[t * T + j] = dot * scale;
                    if (P[t * T + j] > m) m = P[t * T + j];
                }
                for (size_t j = 0; j <= t; j++) sum += exp(P[t * T + j] - m);
                for (size_t j = 0; j <= t; j++) P[t * T + j] = exp(P[t * T + j] - m) / sum;
                if (lse) lse[(b * s.NH + h) * T + t] = m + log(sum);
                for (size_t d = 0; d < hs; d++) {
                    double acc = 0.0;
                    for (size_t j = 0; j <= t; j++)
                        acc += P[t * T + j] * x[qkv_at(s, 2, b, j, h, d)];
                    if (out) out[(b * T + t) * s.C + h * hs + d] = acc;
                }
            }
            if (!dqkv) continue;
            for (size_t t = 0; t < T; t++) {
                const double *g = w + (b * T + t) * s.C + h * hs;
                double D = 0.0;
                for (size_t j = 0; j <= t; j++) {
                    double dp = 0.0;
                    for (size_t d = 0; d < hs; d++) dp += g[d] * x[qkv_at(s, 2, b, j, h, d)];
                    dP[t * T + j] = dp;
                    D += P[t * T + j] * dp;
                }
                if (o_given) {
                    D = 0.0;
                    const double *o = o_given + (b * T + t) * s.C + h * hs;
                    for (size_t d = 0; d < hs; d++) D += g[d] * o[d];
                }
                for (size_t j = 0; j <= t; j++) {
                    double p = P[t * T + j], ds = p * (dP[t * T + j] - D);
                    for (size_t d = 0; d < hs; d++) {
                        dqkv[qkv_at(s, 0, b, t, h, d)] += scale * ds * x[qkv_at(s, 1, b, j, h, d)];
                        dqkv[qkv_at(s, 1, b, j, h, d)] += scale * ds * x[qkv_at(s, 0, b, t, h, d)];
                        dqkv[qkv_at(s, 2, b, j, h, d)] += p * g[d];
                    }
                }
            }
        }
    free(P);
    free(dP);
}

// --- one run of the fused calls ------------------------------------------------------------

/* What a run gives back (host copies; fused_free releases them). */
typedef struct fused {
    float *out, *lse, *dqkv;
} fused;

enum { F_QKVR16 = 1, F_OUT16 = 2 };

/* dp_attention_forward_fused then _backward_fused on dev with their own
 * NaN-filled buffers of exactly the documented sizes: q, k, v read in
 * place from qkv as float32 or (F_QKVR16) rounded to bfloat16 (qkvr, in
 * qkv's layout), the backward's out float32 or (F_OUT16) the forward's
 * out rounded to bfloat16. */
static fused fused_run(dp_device *dev, shape s, const float *qkv_host, const float *dout_host,
                       int opts)
{
    int q16 = opts & F_QKVR16, o16 = opts & F_OUT16;
    size_t nq = n_qkv(s), no = n_out(s), nr = n_rows(s);
    float *qkv = dp_test_upload(dev, qkv_host, nq), *dout = dp_test_upload(dev, dout_host, no);
    float *out = dev_nan(dev, no * 4), *lse = dev_nan(dev, nr * 4), *delta = dev_nan(dev, nr * 4),
          *dqkv = dev_nan(dev, nq * 4);
    void *qkvr = qkv, *out16 = o16 ? dev_nan(dev, no * 2) : NULL;
    if (q16) {
        qkvr = dev_nan(dev, nq * 2);
        dp_assert_ok(dp_convert(dev, qkvr, DP_DTYPE_BF16, qkv, DP_DTYPE_F32, nq));
    }
    dp_dtype qt = q16 ? DP_DTYPE_BF16 : DP_DTYPE_F32;
    dp_assert_ok(dp_attention_forward_fused(dev, out, lse, qkvr, qt, s.B, s.T, s.C, s.NH));
    fused r = {download(dev, out, no), download(dev, lse, nr), NULL};
    if (q16) { /* dp_attention_forward_fused16 (nn/nn_act16.h) on the same q, k, v: the same
                  lse, and out rounded once */
        dp_bf16 *out16d = dev_nan(dev, no * 2), *b = malloc(no * 2);
        float *lse16 = dev_nan(dev, nr * 4);
        cr_assert(b);
        dp_assert_ok(dp_attention_forward_fused16(dev, out16d, lse16, qkvr, s.B, s.T, s.C, s.NH));
        dp_assert_ok(dp_copy_d2h(dev, b, out16d, no * 2));
        for (size_t i = 0; i < no; i++)
            cr_assert_eq(b[i], dp_bf16_from_float(r.out[i]), "fused16: out[%zu] (T=%zu C=%zu)",
                         i, s.T, s.C);
        float *l16 = download(dev, lse16, nr);
        cr_assert(memcmp(l16, r.lse, nr * 4) == 0, "fused16: lse differs (T=%zu C=%zu)", s.T,
                  s.C);
        free(l16), free(b);
        dp_device_free(dev, out16d), dp_device_free(dev, lse16);
    }
    if (o16) dp_assert_ok(dp_convert(dev, out16, DP_DTYPE_BF16, out, DP_DTYPE_F32, no));
    dp_assert_ok(dp_attention_backward_fused(dev, dqkv, delta, dout, qkvr, qt, lse,
                                             o16 ? out16 : (void *)out,
                                             o16 ? DP_DTYPE_BF16 : DP_DTYPE_F32, s.B, s.T, s.C,
                                             s.NH));
    r.dqkv = download(dev, dqkv, nq);
    /* into a bfloat16 dqkv (nn/nn_act16.h): each element the float32 one
     * rounded once */
    dp_bf16 *dqkv16 = dev_nan(dev, nq * 2), *h16 = malloc(nq * 2);
    cr_assert(h16);
    dp_dtype ot = o16 ? DP_DTYPE_BF16 : DP_DTYPE_F32;
    void *op = o16 ? out16 : (void *)out;
    dp_assert_ok(dp_attention_backward_fused16(dev, dqkv16, delta, dout, DP_DTYPE_F32, qkvr, qt,
                                               lse, op, ot, s.B, s.T, s.C, s.NH));
    dp_assert_ok(dp_copy_d2h(dev, h16, dqkv16, nq * 2));
    for (size_t i = 0; i < nq; i++)
        cr_assert_eq(h16[i], dp_bf16_from_float(r.dqkv[i]), "bf16 dqkv[%zu] (T=%zu C=%zu)", i,
                     s.T, s.C);
    /* ... from a bfloat16 dout: the float32 call's bits on its widened
     * values, rounded */
    float *wide = malloc(no * sizeof *wide);
    dp_bf16 *g16h = malloc(no * sizeof *g16h);
    cr_assert(wide && g16h);
    for (size_t i = 0; i < no; i++) {
        g16h[i] = dp_bf16_from_float(dout_host[i]);
        wide[i] = dp_bf16_to_float(g16h[i]);
    }
    float *dw = dp_test_upload(dev, wide, no), *dqkv_w = dev_nan(dev, nq * 4);
    dp_bf16 *g16 = dev_nan(dev, no * 2);
    dp_assert_ok(dp_copy_h2d(dev, g16, g16h, no * 2));
    dp_assert_ok(dp_attention_backward_fused(dev, dqkv_w, delta, dw, qkvr, qt, lse, op, ot, s.B,
                                             s.T, s.C, s.NH));
    dp_assert_ok(dp_attention_backward_fused16(dev, dqkv16, delta, g16, DP_DTYPE_BF16, qkvr, qt,
                                               lse, op, ot, s.B, s.T, s.C, s.NH));
    float *hw = download(dev, dqkv_w, nq);
    dp_assert_ok(dp_copy_d2h(dev, h16, dqkv16, nq * 2));
    for (size_t i = 0; i < nq; i++)
        cr_assert_eq(h16[i], dp_bf16_from_float(hw[i]), "bf16 dqkv[%zu] from bf16 dout", i);
    free(hw), free(wide), free(g16h), free(h16);
    dp_device_free(dev, dw), dp_device_free(dev, dqkv_w), dp_device_free(dev, g16);
    dp_device_free(dev, dqkv16);
    void *bufs[] = {qkv, dout, out, lse, delta, dqkv, q16 ? qkvr : NULL, out16};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) dp_device_free(dev, bufs[i]);
    return r;
}

static void fused_free(fused *r)
{
    free(r->out);
    free(r->lse);
    free(r->dqkv);
}

/* Largest |a - e| over n elements (for the logs that back the bounds). */
static double max_diff(const float *a, const double *e, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - e[i]));
    return m;
}

// --- against float64 ------------------------------------------------------------------------

/* T = 1 (one key), hs 4 with several heads, hs 7 (odd), hs 24, hs 64 with
 * T = 70 (past one 64-row GPU tile and no multiple of the 32-key tiles),
 * hs 128. */
static const shape shapes[] = {{1, 1, 4, 1},   {2, 5, 12, 3},  {1, 19, 21, 3},
                               {2, 33, 48, 2}, {1, 70, 128, 2}, {1, 40, 128, 1}};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

/*
 * Bounds (inputs of std 1.5, so scores up to ~10 and peaked rows; u =
 * 2^-24). A score is a float32 dot of hs terms in four running sums:
 * error <= ~(hs/4 + 2) u sum |q k| scale, about 1e-6 for hs 128 in the
 * worst case and ~1e-7 typically. lse = m + log(l): the score error plus
 * l's sum of <= T terms (<= T u relative) and logf's rounding: atol 1e-5.
 * out: a convex combination of <= T values |v| <~ 6, each weight off by
 * ~its score error plus dp_expf's 2 ulp and the normalisation, and the
 * accumulator's T roundings (rescaled as the maximum grows, each rescale
 * one more rounding): ~1e-6; atol 3e-5, rtol 1e-5 as the whole-matrix
 * test (tests/test_attention.c), measured max 1.4e-6. dqkv: sums over <=
 * T keys of ds k or p dO with |dO| ~ 1, ds errors of the same origin:
 * measured max 2.7e-6; atol 4e-5, rtol 1e-5. A wrong scale, mask, lse or
 * D is off by > 1e-2.
 */
#define OUT_ATOL 3e-5
#define LSE_ATOL 1e-5
#define GRAD_ATOL 4e-5

/* The float64 reference's dqkv against central differences of its own
 * forward (L = sum out * w): truncation ~h^2 |L'''| ~ 1e-8, rounding
 * ~1e-16 |L| / h ~ 1e-12, so they agree to ~1e-7; atol 1e-6. */
Test(attention_fused, reference_backward_matches_finite_differences)
{
    const shape fd_shapes[] = {{2, 5, 12, 3}, {1, 6, 14, 2}};
    for (size_t si = 0; si < 2; si++) {
        shape s = fd_shapes[si];
        size_t nq = n_qkv(s), no = n_out(s);
        float *qf = host_normal(60 + si, nq, 1.5f), *wf = host_normal(70 + si, no, 1.0f);
        double *x = to_double(qf, nq), *w = to_double(wf, no);
        double *g = malloc(nq * sizeof *g), *fd = malloc(nq * sizeof *fd),
               *o = malloc(no * sizeof *o);
        ref_attention(NULL, NULL, g, x, w, NULL, s);
        const double h = 1e-4;
        for (size_t i = 0; i < nq; i++) {
            double x0 = x[i], lp = 0.0, lm = 0.0;
            x[i] = x0 + h;
            ref_attention(o, NULL, NULL, x, NULL, NULL, s);
            for (size_t k = 0; k < no; k++) lp += o[k] * w[k];
            x[i] = x0 - h;
            ref_attention(o, NULL, NULL, x, NULL, NULL, s);
            for (size_t k = 0; k < no; k++) lm += o[k] * w[k];
            x[i] = x0;
            fd[i] = (lp - lm) / (2 * h);
        }
        dp_assert_allclose(g, fd, nq, 1e-6, 1e-6);
        free(qf);
        free(wf);
        free(x);
        free(w);
        free(g);
        free(fd);
        free(o);
    }
}

/* out, lse and dqkv of float32 qkvr, and of bfloat16 qkvr against the
 * float64 attention of the rounded inputs (the fused calls compute on
 * exactly those): the same bounds. */
Test(attention_fused, matches_float64, .timeout = 120)
{
    dp_device *dev = dp_test_cpu(0);
    for (size_t si = 0; si < N_SHAPES; si++)
        for (int q16 = 0; q16 < 2; q16++) {
            shape s = shapes[si];
            size_t nq = n_qkv(s), no = n_out(s), nr = n_rows(s);
            float *qkv = host_normal(100 + si, nq, 1.5f), *w = host_normal(200 + si, no, 1.0f);
            float *used = q16 ? rounded(qkv, nq) : qkv;
            double *x = to_double(used, nq), *wd = to_double(w, no);
            double *out = malloc(no * sizeof *out), *lse = malloc(nr * sizeof *lse),
                   *dqkv = malloc(nq * sizeof *dqkv);
            ref_attention(out, lse, dqkv, x, wd, NULL, s);
            fused r = fused_run(dev, s, qkv, w, q16 ? F_QKVR16 : 0);
            cr_log_info("B=%zu T=%zu C=%zu NH=%zu qkvr %s: max |diff| out %.3g lse %.3g dqkv "
                        "%.3g",
                        s.B, s.T, s.C, s.NH, q16 ? "bf16" : "f32", max_diff(r.out, out, no),
                        max_diff(r.lse, lse, nr), max_diff(r.dqkv, dqkv, nq));
            double *ro = to_double(r.out, no), *rl = to_double(r.lse, nr),
                   *rg = to_double(r.dqkv, nq);
            dp_assert_allclose(ro, out, no, OUT_ATOL, 1e-5);
            dp_assert_allclose(rl, lse, nr, LSE_ATOL, 1e-6);
            dp_assert_allclose(rg, dqkv, nq, GRAD_ATOL, 1e-5);
            free(ro);
            free(rl);
            free(rg);
            fused_free(&r);
            if (q16) free(used);
            free(qkv);
            free(w);
            free(x);
            free(wd);
            free(out);
            free(lse);
            free(dqkv);
        }
    close_checked(dev);
}

/*
 * A bfloat16 out in the backward: D = dO . bf16(O). Against the float64
 * backward given the same rounded O (o_given): the float32 bounds, so the
 * whole change is D's. Against the exact backward: dv does not read D
 * (float32 bound); dq_i moves by scale (D_i - D'_i) sum_j p_ij k_j, at
 * most scale |delta D_i| max |k| with |delta D_i| <= 2^-9 sum_d |dO||O|
 * (bfloat16 keeps 8 significant bits): that bound per row, plus the
 * float32 one. dk_j gathers the same shifts over the queries i >= j.
 */
Test(attention_fused, bf16_out_gives_d_of_the_rounded_o, .timeout = 60)
{
    dp_device *dev = dp_test_cpu(0);
    shape s = {2, 37, 128, 2};
    size_t nq = n_qkv(s), no = n_out(s), hs = s.C / s.NH;
    float *qkv = host_normal(300, nq, 1.5f), *w = host_normal(301, no, 1.0f);
    fused r = fused_run(dev, s, qkv, w, F_OUT16);
    float *o16 = rounded(r.out, no);
    double *x = to_double(qkv, nq), *wd = to_double(w, no), *og = to_double(o16, no);
    double *g_given = malloc(nq * sizeof *g_given), *g_exact = malloc(nq * sizeof *g_exact);
    ref_attention(NULL, NULL, g_given, x, wd, og, s);
    ref_attention(NULL, NULL, g_exact, x, wd, NULL, s);
    double *rg = to_double(r.dqkv, nq);
    dp_assert_allclose(rg, g_given, nq, GRAD_ATOL, 1e-5);
    double worst = 0.0, dq_moved = 0.0;
    for (size_t b = 0; b < s.B; b++)
        for (size_t h = 0; h < s.NH; h++) {
            double kmax = 0.0;
            for (size_t t = 0; t < s.T; t++)
                for (size_t d = 0; d < hs; d++)
                    kmax = fmax(kmax, fabs(x[qkv_at(s, 1, b, t, h, d)]));
            for (size_t t = 0; t < s.T; t++) {
                size_t o = (b * s.T + t) * s.C + h * hs;
                double a = 0.0;
                for (size_t d = 0; d < hs; d++) a += fabs(wd[o + d]) * fabs(og[o + d]);
                double bound = ldexp(a, -9) * kmax / sqrt((double)hs) + GRAD_ATOL;
                for (size_t d = 0; d < hs; d++) {
                    size_t iq = qkv_at(s, 0, b, t, h, d), iv = qkv_at(s, 2, b, t, h, d);
                    double eq = fabs(rg[iq] - g_exact[iq]), ev = fabs(rg[iv] - g_exact[iv]);
                    cr_assert(eq <= bound, "dq[%zu] off the exact by %.3g > %.3g", iq, eq, bound);
                    cr_assert(ev <= GRAD_ATOL + 1e-5 * fabs(g_exact[iv]),
                              "dv[%zu] off the exact by %.3g", iv, ev);
                    worst = fmax(worst, eq / bound);
                    dq_moved = fmax(dq_moved, eq);
                }
            }
        }
    cr_log_info("bf16 O: dq moved by up to %.3g (%.2f of its bound), dqkv vs the given-O "
                "backward %.3g", dq_moved, worst, max_diff(r.dqkv, g_given, nq));
    free(rg);
    free(o16);
    free(x);
    free(wd);
    free(og);
    free(g_given);
    free(g_exact);
    fused_free(&r);
    free(qkv);
    free(w);
    close_checked(dev);
}

// --- against the chunked calls --------------------------------------------------------------

/* The chunked calls (FP32 matmul precision) on the same inputs: both are
 * within the float64 bounds above of the same exact values (for bfloat16
 * qkvr: of the rounded inputs'), so they agree within twice those. */
Test(attention_fused, matches_the_chunked_calls, .timeout = 60)
{
    dp_device *dev = dp_test_cpu(0);
    const shape cs[] = {{2, 33, 48, 2}, {1, 70, 128, 2}, {2, 19, 21, 3}};
    for (size_t si = 0; si < 3; si++)
        for (int q16 = 0; q16 < 2; q16++) {
            shape s = cs[si];
            size_t nq = n_qkv(s), no = n_out(s), chunk = 16;
            size_t na = s.B * s.NH * chunk * s.T;
            float *qkv = host_normal(400 + si, nq, 1.5f), *w = host_normal(500 + si, no, 1.0f);
            fused r = fused_run(dev, s, qkv, w, q16 ? F_QKVR16 : 0);
            float *dq = dp_test_upload(dev, qkv, nq), *dd = dp_test_upload(dev, w, no);
            float *out = dev_nan(dev, no * 4), *att = dev_nan(dev, na * 4), *datt = dev_nan(dev, na * 4),
                  *scratch = dev_nan(dev, no * 4), *dqkv = dev_nan(dev, nq * 4),
                  *dqkvr = dev_nan(dev, nq * 4);
            void *qkvr = dev_nan(dev, nq * (q16 ? 2 : 4));
            dp_dtype qt = q16 ? DP_DTYPE_BF16 : DP_DTYPE_F32;
            dp_assert_ok(dp_attention_forward_chunked(dev, out, qkvr, qt, att, NULL, scratch, dq,
                                                      s.B, s.T, s.C, s.NH, chunk));
            dp_assert_ok(dp_attention_backward_chunked(dev, dqkv, dqkvr, att, NULL, datt, scratch,
                                                       dd, qkvr, qt, s.B, s.T, s.C, s.NH, chunk));
            float *co = download(dev, out, no), *cg = download(dev, dqkv, nq);
            cr_log_info("B=%zu T=%zu C=%zu NH=%zu qkvr %s vs chunked", s.B, s.T, s.C, s.NH,
                        q16 ? "bf16" : "f32");
            dp_assert_allclose(r.out, co, no, 2 * OUT_ATOL, 2e-5);
            dp_assert_allclose(r.dqkv, cg, nq, 2 * GRAD_ATOL, 2e-5);
            void *bufs[] = {dq, dd, out, att, datt, scratch, dqkv, dqkvr, qkvr};
            for (size_t i = 0; i < 9; i++) dp_device_free(dev, bufs[i]);
            free(co);
            free(cg);
            fused_free(&r);
            free(qkv);
            free(w);
        }
    close_checked(dev);
}

// --- exact properties ----------------------------------------------------------------------

/* Two runs on fresh buffers: the same bits (every sum in a fixed order). */
Test(attention_fused, same_bits_twice, .timeout = 60)
{
    dp_device *dev = dp_test_cpu(0);
    shape s = {2, 45, 128, 2};
    size_t nq = n_qkv(s), no = n_out(s), nr = n_rows(s);
    float *qkv = host_normal(600, nq, 1.5f), *w = host_normal(601, no, 1.0f);
    for (int opts = 0; opts < 4; opts++) {
        fused a = fused_run(dev, s, qkv, w, opts), b = fused_run(dev, s, qkv, w, opts);
        cr_assert(memcmp(a.out, b.out, no * 4) == 0, "opts %d: out differs", opts);
        cr_assert(memcmp(a.lse, b.lse, nr * 4) == 0, "opts %d: lse differs", opts);
        cr_assert(memcmp(a.dqkv, b.dqkv, nq * 4) == 0, "opts %d: dqkv differs", opts);
        fused_free(&a);
        fused_free(&b);
    }
    free(qkv);
    free(w);
    close_checked(dev);
}

/* T = 1: the one key has weight exp(0)/1 = 1 exactly, so out = v and dv =
 * dout bit for bit, lse is the score, and D = dO.v = dp exactly, so dq and
 * dk are exactly 0. */
Test(attention_fused, one_token_is_exact)
{
    dp_device *dev = dp_test_cpu(0);
    shape s = {3, 1, 24, 2};
    size_t nq = n_qkv(s), no = n_out(s), hs = s.C / s.NH;
    float *qkv = host_normal(700, nq, 2.0f), *w = host_normal(701, no, 1.0f);
    fused r = fused_run(dev, s, qkv, w, 0);
    for (size_t b = 0; b < s.B; b++)
        for (size_t h = 0; h < s.NH; h++) {
            double dot = 0.0;
            for (size_t d = 0; d < hs; d++) {
                size_t c = b * s.C + h * hs + d;
                cr_assert_eq(r.out[c], qkv[qkv_at(s, 2, b, 0, h, d)], "out[%zu] is not v", c);
                cr_assert_eq(r.dqkv[qkv_at(s, 0, b, 0, h, d)], 0.0f, "dq[%zu] != 0", c);
                cr_assert_eq(r.dqkv[qkv_at(s, 1, b, 0, h, d)], 0.0f, "dk[%zu] != 0", c);
                cr_assert_eq(r.dqkv[qkv_at(s, 2, b, 0, h, d)], w[c], "dv[%zu] is not dout", c);
                dot += (double)qkv[qkv_at(s, 0, b, 0, h, d)] * qkv[qkv_at(s, 1, b, 0, h, d)];
            }
            double want = dot / sqrt((double)hs), got = r.lse[b * s.NH + h];
            cr_assert(fabs(got - want) <= 1e-5 * (1 + fabs(want)), "lse %.9g, score %.9g", got,
                      want);
        }
    fused_free(&r);
    free(qkv);
    free(w);
    close_checked(dev);
}

/* Changing token t0's q, k and v leaves every earlier output and lse the
 * same bits (masked keys are never read), and changes token t0's. */
Test(attention_fused, future_tokens_do_not_change_past_outputs, .timeout = 60)
{
    dp_device *dev = dp_test_cpu(0);
    shape s = {2, 9, 14, 2};
    size_t nq = n_qkv(s), no = n_out(s);
    float *qkv = host_normal(800, nq, 1.0f), *w = host_normal(801, no, 1.0f);
    fused r0 = fused_run(dev, s, qkv, w, 0);
    float *changed = malloc(nq * sizeof *changed);
    dp_rng rng;
    dp_rng_seed(&rng, 802);
    for (size_t t0 = 1; t0 < s.T; t0++) {
        memcpy(changed, qkv, nq * sizeof *changed);
        for (size_t b = 0; b < s.B; b++)
            dp_rng_fill_normal(&rng, changed + (b * s.T + t0) * 3 * s.C, 3 * s.C, 0.0f, 3.0f);
        fused r1 = fused_run(dev, s, changed, w, 0);
        for (size_t b = 0; b < s.B; b++) {
            size_t before = (b * s.T + t0) * s.C;
            cr_assert(memcmp(r1.out + b * s.T * s.C, r0.out + b * s.T * s.C,
                             (before - b * s.T * s.C) * 4) == 0,
                      "token %zu changed an earlier output (batch %zu)", t0, b);
            cr_assert(memcmp(r1.out + before, r0.out + before, s.C * 4) != 0,
                          "token %zu's own output did not change", t0);
            for (size_t h = 0; h < s.NH; h++)
                cr_assert(memcmp(r1.lse + (b * s.NH + h) * s.T, r0.lse + (b * s.NH + h) * s.T,
                                 t0 * 4) == 0,
                          "token %zu changed an earlier lse", t0);
        }
        fused_free(&r1);
    }
    free(changed);
    fused_free(&r0);
    free(qkv);
    free(w);
    close_checked(dev);
}

// --- bad arguments --------------------------------------------------------------------------

static void expect_invalid(dp_status st, const char *needle)
{
    cr_assert_eq(st, DP_ERR_INVALID_ARGUMENT, "expected invalid argument, got %s (%s)",
                 dp_strerror(st), dp_last_error());
    cr_assert(strstr(dp_last_error(), needle) != NULL, "message lacks \"%s\": %s", needle,
              dp_last_error());
}

Test(attention_fused, bad_arguments)
{
    dp_device *dev = dp_test_cpu(0);
    const size_t B = 2, T = 5, C = 12, NH = 3;
    shape s = {B, T, C, NH};
    size_t nq = n_qkv(s), no = n_out(s), nr = n_rows(s);
    float *qkv_h = host_normal(900, nq, 1.0f);
    float *qkv = dp_test_upload(dev, qkv_h, nq), *out = dev_nan(dev, no * 4),
          *lse = dev_nan(dev, nr * 4),
          *delta = dev_nan(dev, nr * 4), *dqkv = dev_nan(dev, nq * 4), *dout = dev_nan(dev, no * 4);
    const dp_dtype F = DP_DTYPE_F32, H = DP_DTYPE_BF16;
#define FWD(d_, o_, l_, x_, t_, B_, T_, C_, NH_)                                                \
    dp_attention_forward_fused(d_, o_, l_, x_, t_, B_, T_, C_, NH_)
#define BWD(d_, g_, dl_, go_, r_, rt_, l_, o_, ot_, B_, T_, C_, NH_)                            \
    dp_attention_backward_fused(d_, g_, dl_, go_, r_, rt_, l_, o_, ot_, B_, T_, C_, NH_)

    expect_invalid(FWD(NULL, out, lse, qkv, F, B, T, C, NH), "dev");
    expect_invalid(FWD(dev, NULL, lse, qkv, F, B, T, C, NH), "cpu:0");
    expect_invalid(FWD(dev, out, NULL, qkv, F, B, T, C, NH), "NULL");
    expect_invalid(FWD(dev, out, lse, NULL, F, B, T, C, NH), "NULL");
    expect_invalid(FWD(dev, out, lse, qkv, DP_DTYPE_F16, B, T, C, NH),
                   "neither DP_DTYPE_F32 nor DP_DTYPE_BF16");
    expect_invalid(BWD(NULL, dqkv, delta, dout, qkv, F, lse, out, F, B, T, C, NH), "dev");
    void *bp[6] = {dqkv, delta, dout, qkv, lse, out};
    for (int i = 0; i < 6; i++) {
        void *p[6];
        memcpy(p, bp, sizeof p);
        p[i] = NULL;
        expect_invalid(BWD(dev, p[0], p[1], p[2], p[3], F, p[4], p[5], F, B, T, C, NH), "NULL");
    }
    expect_invalid(BWD(dev, dqkv, delta, dout, qkv, F, lse, out, (dp_dtype)99, B, T, C, NH),
                   "out_dtype");
    expect_invalid(BWD(dev, dqkv, delta, dout, qkv, DP_DTYPE_I32, lse, out, F, B, T, C, NH),
                   "qkv_dtype");

    /* Dimensions: zero, C not a multiple of NH, overflow, too many rows. */
    expect_invalid(FWD(dev, out, lse, qkv, F, 0, T, C, NH), "B=0");
    expect_invalid(FWD(dev, out, lse, qkv, F, B, 0, C, NH), "T=0");
    expect_invalid(BWD(dev, dqkv, delta, dout, qkv, F, lse, out, F, B, T, 0, NH), "C=0");
    expect_invalid(BWD(dev, dqkv, delta, dout, qkv, F, lse, out, F, B, T, C, 0), "NH=0");
    expect_invalid(FWD(dev, out, lse, qkv, F, B, T, C, 5), "multiple");
    expect_invalid(BWD(dev, dqkv, delta, dout, qkv, F, lse, out, F, B, T, C, 5), "multiple");
    expect_invalid(FWD(dev, out, lse, qkv, F, SIZE_MAX / 2, T, C, NH), "overflow");
    expect_invalid(BWD(dev, dqkv, delta, dout, qkv, F, lse, out, F, 1, (size_t)1 << 62, 4, 1),
                   "overflow");
    expect_invalid(FWD(dev, out, lse, qkv, F, (size_t)1 << 31, 1, 1, 1), "2147483647");
    expect_invalid(BWD(dev, dqkv, delta, dout, qkv, F, lse, out, F, 1, (size_t)1 << 30, 4, 2),
                   "micro-batches");

    /* A bfloat16 dqkv takes head sizes up to DP_FLASH_HS_MAX16 (its items'
     * local rows). */
    expect_invalid(dp_attention_backward_fused16(dev, (dp_bf16 *)dqkv, delta, dout, F, qkv, F,
                                                 lse, out, F, 1, 1, 257, 1),
                   "head size 257");
    expect_invalid(dp_attention_backward_fused16(dev, NULL, delta, dout, F, qkv, F, lse, out, F,
                                                 B, T, C, NH),
                   "dp_attention_backward_fused16");
    expect_invalid(dp_attention_backward_fused16(dev, (dp_bf16 *)dqkv, delta, dout,
                                                 DP_DTYPE_I32, qkv, F, lse, out, F, B, T, C, NH),
                   "dout_dtype");
    /* ... and a bfloat16 out likewise */
    expect_invalid(dp_attention_forward_fused16(dev, (dp_bf16 *)out, lse, (const dp_bf16 *)qkv,
                                                1, 1, 257, 1),
                   "head size 257");
    expect_invalid(dp_attention_forward_fused16(dev, NULL, lse, (const dp_bf16 *)qkv, B, T, C,
                                                NH),
                   "dp_attention_forward_fused16");
    expect_invalid(dp_attention_forward_fused16(dev, (dp_bf16 *)out, lse, (const dp_bf16 *)out,
                                                B, T, C, NH),
                   "same buffer");

    /* The same buffer twice. */
    expect_invalid(FWD(dev, out, lse, out, F, B, T, C, NH), "same buffer");
    expect_invalid(FWD(dev, out, lse, lse, H, B, T, C, NH), "same buffer");
    expect_invalid(BWD(dev, dqkv, lse, dout, qkv, F, lse, out, F, B, T, C, NH), "same buffer");
    expect_invalid(BWD(dev, dqkv, delta, out, qkv, F, lse, out, F, B, T, C, NH), "same buffer");

    /* Nothing was written by the failed calls; a valid call works after them. */
    float *o = download(dev, out, no);
    for (size_t i = 0; i < no; i++) cr_assert(isnan(o[i]), "out[%zu] was written", i);
    free(o);
    dp_assert_ok(FWD(dev, out, lse, qkv, F, B, T, C, NH));
    dp_assert_ok(BWD(dev, dqkv, delta, dout, qkv, F, lse, out, F, B, T, C, NH));
#undef FWD
#undef BWD
    float *bufs[] = {qkv, out, lse, delta, dqkv, dout};
    for (size_t i = 0; i < 6; i++) dp_device_free(dev, bufs[i]);
    free(qkv_h);
    close_checked(dev);
}
