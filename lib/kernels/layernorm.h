/*
 * kernels/layernorm.h - LayerNorm over the last axis (Ba, Kiros & Hinton
 * 2016; torch.nn.LayerNorm semantics: biased variance, eps inside the
 * square root).
 *
 * Forward (a float32 or a bfloat16 output) and the input gradient are one
 * function per row; the parameter gradients are column reductions in the
 * two-stage order of kernels/colsum.h, so the result is deterministic.
 * Backward, with xhat = (x - mean) * rstd and g = dout * weight:
 *   dinp   += rstd * (g - mean(g) - xhat * mean(g * xhat))   (row means)
 *   dweight += sum over rows of dout * xhat,  dbias += sum over rows of dout
 */
#ifndef DP_KERNELS_LAYERNORM_H
#define DP_KERNELS_LAYERNORM_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/bf16.h"
#include "kernels/colsum.h"
#include "kernels/dp_hd.h"

/* The row's statistics: *mean and *rstd = 1/sqrt(var + eps). Two passes
 * (mean, then the centred sum of squares) so a large common offset does
 * not cancel the variance. */
static inline DP_HD void dp_layernorm_stats(float *mean, float *rstd, const float *inp, size_t C,
                                            float eps)
{
    float sum = 0.0f;
    for (size_t c = 0; c < C; c++) sum += inp[c];
    float m = sum / (float)C;
    float ss = 0.0f;
    for (size_t c = 0; c < C; c++) {
        float d = inp[c] - m;
        ss += d * d;
    }
    *mean = m;
    *rstd = 1.0f / sqrtf(ss / (float)C + eps);
}

/* Output element c of a row whose statistics are m and s: the one
 * expression both outputs (float32, bfloat16) and both backends compute,
 * so the bfloat16 output is the float32 one rounded. */
static inline DP_HD float dp_layernorm_out(float x, float m, float s, dp_pref weight, dp_pref bias,
                                           size_t c)
{
    return (x - m) * s * dp_pref_at(weight, c) + dp_pref_at(bias, c);
}

/* One row: out(C) = (inp(C) - mean) * rstd * weight(C) + bias(C); writes
 * *mean and *rstd. weight and bias are float32 or bfloat16
 * (kernels/bf16.h). */
static inline DP_HD void dp_layernorm_forward_row(float *out, float *mean, float *rstd,
                                                  const float *inp, dp_pref weight,
                                                  dp_pref bias, size_t C, float eps)
{
    float m, s;
    dp_layernorm_stats(&m, &s, inp, C, eps);
    for (size_t c = 0; c < C; c++) out[c] = dp_layernorm_out(inp[c], m, s, weight, bias, c);
    *mean = m;
    *rstd = s;
}

/* The same row with out(C) rounded to bfloat16 once (dp_bf16_round): the
 * float32 row followed by the conversion, bit for bit, without writing
 * the float32 row. mean and rstd stay float32. */
static inline DP_HD void dp_layernorm_forward_row_bf16_out(uint16_t *out, float *mean, float *rstd,
                                                           const float *inp, dp_pref weight,
                                                           dp_pref bias, size_t C, float eps)
{
    float m, s;
    dp_layernorm_stats(&m, &s, inp, C, eps);
    for (size_t c = 0; c < C; c++)
        out[c] = dp_bf16_round(dp_layernorm_out(inp[c], m, s, weight, bias, c));
    *mean = m;
    *rstd = s;
}

/* Element i of a gradient of either type, the type given as a constant
 * (g16) where the call is inlined, so each type's loop is its own. */
static inline DP_HD DP_HD_ALWAYS_INLINE float dp_layernorm_g(const void *g, int g16, size_t i)
{
    return g16 ? dp_bf16_widen(((const uint16_t *)g)[i]) : ((const float *)g)[i];
}

/* dp_layernorm_backward_inp_row with dout's type a constant (g16). */
static inline DP_HD DP_HD_ALWAYS_INLINE void
dp_layernorm_backward_inp_row_t(float *dinp, const void *dout, int g16, const float *inp,
                                dp_pref weight, float mean, float rstd, size_t C)
{
    float g_mean = 0.0f, gx_mean = 0.0f;
    for (size_t c = 0; c < C; c++) {
        float g = dp_layernorm_g(dout, g16, c) * dp_pref_at(weight, c);
        g_mean += g;
        gx_mean += g * (inp[c] - mean) * rstd;
    }
    g_mean /= (float)C;
    gx_mean /= (float)C;
    for (size_t c = 0; c < C; c++) {
        float xhat = (inp[c] - mean) * rstd;
        float g = dp_layernorm_g(dout, g16, c) * dp_pref_at(weight, c);
        dinp[c] += rstd * (g - g_mean - xhat * gx_mean);
    }
}

/* One row: dinp(C) += the input gradient (see the file comment); dout(C)
 * float32 or bfloat16 (a gradient kept as bfloat16, widened exactly: the
 * float32 row's bits on the widened values). */
static inline DP_HD void dp_layernorm_backward_inp_row(float *dinp, dp_pref dout,
                                                       const float *inp, dp_pref weight,
                                                       float mean, float rstd, size_t C)
{
    if (dout.bf16)
        dp_layernorm_backward_inp_row_t(dinp, dout.p, 1, inp, weight, mean, rstd, C);
    else
        dp_layernorm_backward_inp_row_t(dinp, dout.p, 0, inp, weight, mean, rstd, C);
}

/* dweight(C) += sum over rows of dout * xhat, dbias(C) += sum over rows of
 * dout, in the two-stage order of kernels/colsum.h; dout, inp are (N,C),
 * dout float32 or bfloat16. */

/* xhat of one element: (inp - mean) * rstd. */
static inline DP_HD float dp_layernorm_xhat(float inp, float mean, float rstd)
{
    return (inp - mean) * rstd;
}

/* The dweight term of one element, dout * xhat; added to a running sum as
 * `sum += dp_layernorm_dweight_of(...)`, which nvcc contracts to one fma
 * (the CPU's compilers do not contract: ISO C). The GPU's stage 1
 * (cuda/cuda_colsum.cuh) and the CPU's loop below both add it so. */
static inline DP_HD float dp_layernorm_dweight_of(float dout, float xhat) { return dout * xhat; }

/* dp_layernorm_param_cols with dout's type a constant (g16). */
static inline DP_HD DP_HD_ALWAYS_INLINE void
dp_layernorm_param_cols_t(float *dweight, float *dbias, const void *dout, int g16,
                          const float *inp, const float *mean, const float *rstd, size_t N,
                          size_t C, size_t c0, size_t c1)
{
    float pdw[DP_COL_TILE], pdb[DP_COL_TILE], tdw[DP_COL_TILE], tdb[DP_COL_TILE];
    size_t w = c1 - c0;
    for (size_t j = 0; j < w; j++) tdw[j] = tdb[j] = 0.0f;
    for (size_t n0 = 0; n0 < N; n0 += DP_COL_CHUNK) {
        size_t n1 = N - n0 < DP_COL_CHUNK ? N : n0 + DP_COL_CHUNK;
        for (size_t j = 0; j < w; j++) pdw[j] = pdb[j] = 0.0f;
        for (size_t n = n0; n < n1; n++)
            for (size_t j = 0; j < w; j++) {
                float g = dp_layernorm_g(dout, g16, n * C + c0 + j);
                float xhat = dp_layernorm_xhat(inp[n * C + c0 + j], mean[n], rstd[n]);
                pdw[j] += dp_layernorm_dweight_of(g, xhat);
                pdb[j] += g;
            }
        for (size_t j = 0; j < w; j++) {
            tdw[j] += pdw[j];
            tdb[j] += pdb[j];
        }
    }
    for (size_t j = 0; j < w; j++) {
        dweight[c0 + j] += tdw[j];
        dbias[c0 + j] += tdb[j];
    }
}

/* Both stages for the channels c in [c0, c1), c1 - c0 <= DP_COL_TILE (the
 * CPU's loop: rows read contiguously), in the order of the stages above. */
static inline DP_HD DP_HD_ALWAYS_INLINE void
dp_layernorm_param_cols(float *dweight, float *dbias, dp_pref dout, const float *inp,
                        const float *mean, const float *rstd, size_t N, size_t C, size_t c0,
                        size_t c1)
{
    if (dout.bf16)
        dp_layernorm_param_cols_t(dweight, dbias, dout.p, 1, inp, mean, rstd, N, C, c0, c1);
    else
        dp_layernorm_param_cols_t(dweight, dbias, dout.p, 0, inp, mean, rstd, N, C, c0, c1);
}

/* Row r of (N,C): dp_layernorm_forward_row on row r (mean[r], rstd[r]). */
static inline DP_HD void dp_layernorm_forward_item(float *out, float *mean, float *rstd,
                                                   const float *inp, dp_pref weight, dp_pref bias,
                                                   size_t C, float eps, size_t r)
{
    dp_layernorm_forward_row(out + r * C, mean + r, rstd + r, inp + r * C, weight, bias, C, eps);
}

/* Row r of (N,C): dp_layernorm_forward_row_bf16_out on row r. */
static inline DP_HD void dp_layernorm_forward_bf16_out_item(uint16_t *out, float *mean,
                                                            float *rstd, const float *inp,
                                                            dp_pref weight, dp_pref bias,
                                                            size_t C, float eps, size_t r)
{
    dp_layernorm_forward_row_bf16_out(out + r * C, mean + r, rstd + r, inp + r * C, weight, bias,
                                      C, eps);
}

/* Row r of (N,C) of the residual stream's update and the next LayerNorm
 * in one pass: x[r] += add[r] (written back, dp_accumulate's float
 * addition), then the LayerNorm of the sum into out16 (bfloat16) when
 * given, else out (float32). The same bits as dp_accumulate followed by
 * the LayerNorm. */
static inline DP_HD void dp_residual_layernorm_item(float *out, uint16_t *out16, float *mean,
                                                    float *rstd, float *x, const float *add,
                                                    dp_pref weight, dp_pref bias, size_t C,
                                                    float eps, size_t r)
{
    float *xr = x + r * C;
    const float *ar = add + r * C;
    for (size_t c = 0; c < C; c++) xr[c] += ar[c];
    if (out16)
        dp_layernorm_forward_row_bf16_out(out16 + r * C, mean + r, rstd + r, xr, weight, bias, C,
                                          eps);
    else
        dp_layernorm_forward_row(out + r * C, mean + r, rstd + r, xr, weight, bias, C, eps);
}

/* Row r of (N,C): dp_layernorm_backward_inp_row on row r. */
static inline DP_HD void dp_layernorm_backward_inp_item(float *dinp, dp_pref dout,
                                                        const float *inp, dp_pref weight,
                                                        const float *mean, const float *rstd,
                                                        size_t C, size_t r)
{
    dp_layernorm_backward_inp_row(dinp + r * C, dp_pref_offset(dout, r * C), inp + r * C,
                                  weight, mean[r], rstd[r], C);
}

#endif /* DP_KERNELS_LAYERNORM_H */
