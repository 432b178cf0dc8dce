/*
 * flash_tc_bound.h - causal attention in float64 and the bound that the
 * tensor core kernels (backend/cuda/cuda_flash_tc.cuh) are held to, for
 * test_flash_tc_emu.cpp (the kernels emulated on the CPU) and
 * test_cuda_ops.c (the kernels on a GPU). C and C++.
 *
 * The kernels round P, dO and dS to bfloat16 for their products, each a
 * relative error of at most u = 2^-9 (bfloat16's unit roundoff) per term;
 * float32 sums add about n 2^-24 of the same magnitudes, far below. So
 * each output is within a few u of the sum of its terms' magnitudes:
 *   out_i   P~ V:         |err| <= 2u sum_j p_ij |v_j|   (l in float32)
 *   dv_j    P~^T dO~:     |err| <= 2u sum_i p_ij |dO_i|
 *   dq_i    scale dS~ K with dS = P (dP - D) and dP from dO~:
 *           |dS~ - dS| <= p u (2 sum_e |dO_e v_e| + |D|), so
 *           |err| <= 2u scale sum_j p_ij (sum_e |dO_ie v_je| + |D_i|) |k_j|
 *   dk_j    the same with q_i for k_j, over i >= j.
 * The check allows twice each (4u) plus 1e-6 absolute, and lse 1e-5
 * relative.
 * cuDNN's fused attention (backend/cuda/cuda_sdpa.c) rounds the same
 * operands, and two things more: its outputs (out, dq, dk, dv) are
 * bfloat16, at most u |ref| <= u times each bound's magnitude sum more;
 * and its D comes from the bfloat16 dO, |dD| <= u sum_e |dO_e O_e|, which
 * enters dq and dk as the |D| term does and is of the order of one dP
 * magnitude (O is a p-weighted mean of v). So it is held to 2u + u + u on
 * the analysis, allowed 6u (slack 6: half again as much, not twice). A wrong mask, a missed tile or a bad rescale moves whole
 * terms (p_ij of order 1/T or more), past these bounds at short T.
 */
#ifndef DP_TEST_FLASH_TC_BOUND_H
#define DP_TEST_FLASH_TC_BOUND_H

#include <math.h>
#include <stdlib.h>

#include "kernels/flash.h"

#define FLASH_TC_U (1.0 / 512.0)

/* One problem: q, k, v in qkv (B, T, 3C) as the kernels read them
 * (bfloat16 values, widened), dout (B, T, C) and delta (B, NH, T) as the
 * backward was given them. */
typedef struct flash_tc_in {
    size_t B, T, NH, hs;
    const float *qkv, *dout, *delta;
    double slack; /* the allowance in units of u; 0: 4 (twice the analysis) */
} flash_tc_in;

/* The worst err / bound of each output (> 1: out of bounds; NaN: a NaN
 * output), and the largest reference gradient (a test whose gradients
 * are all near zero tests nothing). */
typedef struct flash_tc_worst {
    double out, lse, dq, dk, dv, biggest;
} flash_tc_worst;

static inline void flash_tc_take(double *w, double err, double bound)
{
    double r = err / bound;
    if (!(r <= *w)) *w = r; /* NaN wins */
}

static inline double flash_tc_at(const flash_tc_in *in, size_t part, size_t r, size_t d)
{
    return in->qkv[dp_flash_qkv_row(part, r, in->T, in->NH, in->hs) + d];
}

/* Holds out (B,T,C), lse (B,NH,T) and dqkv (B,T,3C) to the reference. */
static inline flash_tc_worst flash_tc_check(const flash_tc_in *in, const float *out,
                                            const float *lse, const float *dqkv)
{
    const size_t T = in->T, NH = in->NH, hs = in->hs, BNH = in->B * NH;
    const double sc = 1.0 / sqrt((double)hs),
                 allow = (in->slack > 0 ? in->slack : 4.0) * FLASH_TC_U;
    flash_tc_worst w = {0, 0, 0, 0, 0, 0};
    double *P = (double *)calloc(T * T, sizeof(double));
    double *dP = (double *)calloc(T * T, sizeof(double));
    double *mag = (double *)calloc(T * T, sizeof(double));
    double *s = (double *)malloc(T * sizeof(double));
    if (!P || !dP || !mag || !s) abort();
    for (size_t pair = 0; pair < BNH; pair++) {
        const size_t r0 = pair * T;
        for (size_t i = 0; i < T; i++) {
            const float *g = in->dout + dp_flash_tok_row(r0 + i, T, NH, hs, 1, 0);
            double mx = -INFINITY, l = 0.0;
            for (size_t j = 0; j <= i; j++) {
                double d = 0.0;
                for (size_t e = 0; e < hs; e++)
                    d += flash_tc_at(in, 0, r0 + i, e) * flash_tc_at(in, 1, r0 + j, e);
                s[j] = sc * d;
                mx = fmax(mx, s[j]);
            }
            for (size_t j = 0; j <= i; j++) l += exp(s[j] - mx);
            for (size_t j = 0; j < T; j++) P[i * T + j] = dP[i * T + j] = mag[i * T + j] = 0.0;
            for (size_t j = 0; j <= i; j++) {
                P[i * T + j] = exp(s[j] - mx) / l;
                for (size_t e = 0; e < hs; e++) {
                    double t = (double)g[e] * flash_tc_at(in, 2, r0 + j, e);
                    dP[i * T + j] += t;
                    mag[i * T + j] += fabs(t);
                }
            }
            flash_tc_take(&w.lse, fabs(lse[r0 + i] - (mx + log(l))),
                          1e-5 * (1.0 + fabs(mx + log(l))));
            const float *o = out + dp_flash_tok_row(r0 + i, T, NH, hs, 1, 0);
            for (size_t d = 0; d < hs; d++) {
                double ref = 0.0, m = 0.0;
                for (size_t j = 0; j <= i; j++) {
                    ref += P[i * T + j] * flash_tc_at(in, 2, r0 + j, d);
                    m += P[i * T + j] * fabs(flash_tc_at(in, 2, r0 + j, d));
                }
                flash_tc_take(&w.out, fabs(o[d] - ref), allow * m + 1e-6);
            }
        }
        for (size_t i = 0; i < T; i++) {
            const double D = in->delta[r0 + i];
            const float *dq = dqkv + dp_flash_tok_row(r0 + i, T, NH, hs, 3, 0);
            for (size_t d = 0; d < hs; d++) {
                double ref = 0.0, m = 0.0;
                for (size_t j = 0; j <= i; j++) {
                    double k = flash_tc_at(in, 1, r0 + j, d);
                    ref += sc * P[i * T + j] * (dP[i * T + j] - D) * k;
                    m += sc * P[i * T + j] * (mag[i * T + j] + fabs(D)) * fabs(k);
                }
                flash_tc_take(&w.dq, fabs(dq[d] - ref), allow * m + 1e-6);
                w.biggest = fmax(w.biggest, fabs(ref));
            }
        }
        for (size_t j = 0; j < T; j++) {
            const float *dk = dqkv + dp_flash_tok_row(r0 + j, T, NH, hs, 3, 1);
            const float *dv = dqkv + dp_flash_tok_row(r0 + j, T, NH, hs, 3, 2);
            for (size_t d = 0; d < hs; d++) {
                double rk = 0.0, mk = 0.0, rv = 0.0, mv = 0.0;
                for (size_t i = j; i < T; i++) {
                    const double D = in->delta[r0 + i], q = flash_tc_at(in, 0, r0 + i, d);
                    const double g = in->dout[dp_flash_tok_row(r0 + i, T, NH, hs, 1, 0) + d];
                    rk += sc * P[i * T + j] * (dP[i * T + j] - D) * q;
                    mk += sc * P[i * T + j] * (mag[i * T + j] + fabs(D)) * fabs(q);
                    rv += P[i * T + j] * g;
                    mv += P[i * T + j] * fabs(g);
                }
                flash_tc_take(&w.dk, fabs(dk[d] - rk), allow * mk + 1e-6);
                flash_tc_take(&w.dv, fabs(dv[d] - rv), allow * mv + 1e-6);
                w.biggest = fmax(w.biggest, fmax(fabs(rk), fabs(rv)));
            }
        }
    }
    free(P);
    free(dP);
    free(mag);
    free(s);
    return w;
}

#endif /* DP_TEST_FLASH_TC_BOUND_H */
