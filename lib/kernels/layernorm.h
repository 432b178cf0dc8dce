/*
 * kernels/layernorm.h - LayerNorm over the last axis (Ba, Kiros & Hinton
 * 2016; torch.nn.LayerNorm semantics: biased variance, eps inside the
 * square root).
 *
 * Forward and the input gradient are one function per row; the parameter
 * gradients are one function per channel (a sum over rows in order), so
 * no two calls write the same element and the result is deterministic.
 * Backward, with xhat = (x - mean) * rstd and g = dout * weight:
 *   dinp   += rstd * (g - mean(g) - xhat * mean(g * xhat))   (row means)
 *   dweight += sum over rows of dout * xhat,  dbias += sum over rows of dout
 */
#ifndef DP_KERNELS_LAYERNORM_H
#define DP_KERNELS_LAYERNORM_H

#include <math.h>
#include <stddef.h>

#include "kernels/dp_hd.h"

/* One row: out(C) = (inp(C) - mean) * rstd * weight(C) + bias(C); writes
 * *mean and *rstd = 1/sqrt(var + eps). Two passes (mean, then the centred
 * sum of squares) so a large common offset does not cancel the variance. */
static inline DP_HD void dp_layernorm_forward_row(float *out, float *mean, float *rstd,
                                                  const float *inp, const float *weight,
                                                  const float *bias, size_t C, float eps)
{
    float sum = 0.0f;
    for (size_t c = 0; c < C; c++) sum += inp[c];
    float m = sum / (float)C;
    float ss = 0.0f;
    for (size_t c = 0; c < C; c++) {
        float d = inp[c] - m;
        ss += d * d;
    }
    float s = 1.0f / sqrtf(ss / (float)C + eps);
    for (size_t c = 0; c < C; c++) out[c] = (inp[c] - m) * s * weight[c] + bias[c];
    *mean = m;
    *rstd = s;
}

/* One row: dinp(C) += the input gradient (see the file comment). */
static inline DP_HD void dp_layernorm_backward_inp_row(float *dinp, const float *dout,
                                                       const float *inp, const float *weight,
                                                       float mean, float rstd, size_t C)
{
    float g_mean = 0.0f, gx_mean = 0.0f;
    for (size_t c = 0; c < C; c++) {
        float g = dout[c] * weight[c];
        g_mean += g;
        gx_mean += g * (inp[c] - mean) * rstd;
    }
    g_mean /= (float)C;
    gx_mean /= (float)C;
    for (size_t c = 0; c < C; c++) {
        float xhat = (inp[c] - mean) * rstd;
        float g = dout[c] * weight[c];
        dinp[c] += rstd * (g - g_mean - xhat * gx_mean);
    }
}

/* Channel c: dweight[c] += sum_n dout[n,c] * xhat[n,c], dbias[c] += sum_n
 * dout[n,c], rows n = 0..N-1 in order; dout and inp are (N,C). */
static inline DP_HD void dp_layernorm_backward_param_channel(float *dweight, float *dbias,
                                                             const float *dout,
                                                             const float *inp,
                                                             const float *mean,
                                                             const float *rstd, size_t N,
                                                             size_t C, size_t c)
{
    float dw = 0.0f, db = 0.0f;
    for (size_t n = 0; n < N; n++) {
        float d = dout[n * C + c];
        dw += d * (inp[n * C + c] - mean[n]) * rstd[n];
        db += d;
    }
    dweight[c] += dw;
    dbias[c] += db;
}

/* Row r of (N,C): dp_layernorm_forward_row on row r (mean[r], rstd[r]). */
static inline DP_HD void dp_layernorm_forward_item(float *out, float *mean, float *rstd,
                                                   const float *inp, const float *weight,
                                                   const float *bias, size_t C, float eps,
                                                   size_t r)
{
    dp_layernorm_forward_row(out + r * C, mean + r, rstd + r, inp + r * C, weight, bias, C, eps);
}

/* Row r of (N,C): dp_layernorm_backward_inp_row on row r. */
static inline DP_HD void dp_layernorm_backward_inp_item(float *dinp, const float *dout,
                                                        const float *inp, const float *weight,
                                                        const float *mean, const float *rstd,
                                                        size_t C, size_t r)
{
    dp_layernorm_backward_inp_row(dinp + r * C, dout + r * C, inp + r * C, weight, mean[r],
                                  rstd[r], C);
}

#endif /* DP_KERNELS_LAYERNORM_H */
