/*
 * backend/cpu/cpu_nn.c - the CPU backend's layer kernels (everything but
 * attention, and scale / sum_squares which live with the optimizer).
 *
 * Each entry loops, on the calling thread, over the DP_HD functions of
 * lib/kernels/ that define the math for every backend. Arguments were
 * validated by the public wrappers in lib/nn. Loops that accumulate into
 * one element run in a fixed order, so results are bitwise reproducible.
 */
#include "backend/cpu/cpu_kernels.h"
#include "kernels/crossentropy.h"
#include "kernels/elementwise.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/linear.h"

#include "dp/nn.h"

// --- encoder ---------------------------------------------------------------------

DP_CPU_SIMD dp_status dp_cpu_encoder_forward(dp_device *dev, float *out, const int32_t *inp,
                                 const float *wte, const float *wpe, size_t B, size_t T,
                                 size_t C)
{
    size_t n = B * T * C;
    for (size_t i = 0; i < n; i++) dp_encoder_forward_elem(out, inp, wte, wpe, T, C, i);
    return DP_OK;
}

DP_CPU_SIMD dp_status dp_cpu_encoder_backward(dp_device *dev, float *dwte, float *dwpe, const float *dout,
                                  const int32_t *inp, size_t B, size_t T, size_t C)
{
    for (size_t i = 0; i < T * C; i++) dp_encoder_backward_wpe_elem(dwpe, dout, B, T, C, i);
    for (size_t c = 0; c < C; c++) dp_encoder_backward_wte_channel(dwte, dout, inp, B * T, C, c);
    return DP_OK;
}

// --- linear (bias parts; the GEMM is the backend's) --------------------------------

DP_CPU_SIMD dp_status dp_cpu_bias_broadcast(dp_device *dev, float *out, const float *bias, size_t N,
                                size_t OC)
{
    for (size_t r = 0; r < N; r++) dp_bias_broadcast_row(out, bias, OC, r);
    return DP_OK;
}

DP_CPU_SIMD dp_status dp_cpu_bias_backward(dp_device *dev, float *dbias, const float *dout, size_t N,
                               size_t OC)
{
    for (size_t o0 = 0; o0 < OC; o0 += DP_BIAS_BACKWARD_TILE) {
        size_t o1 = OC - o0 < DP_BIAS_BACKWARD_TILE ? OC : o0 + DP_BIAS_BACKWARD_TILE;
        dp_bias_backward_cols(dbias, dout, N, OC, o0, o1);
    }
    return DP_OK;
}

// --- LayerNorm ---------------------------------------------------------------------

DP_CPU_SIMD dp_status dp_cpu_layernorm_forward(dp_device *dev, float *out, float *mean, float *rstd,
                                   const float *inp, const float *weight, const float *bias,
                                   size_t N, size_t C)
{
    for (size_t n = 0; n < N; n++)
        dp_layernorm_forward_row(out + n * C, mean + n, rstd + n, inp + n * C, weight, bias, C,
                                 DP_LAYERNORM_EPS);
    return DP_OK;
}

DP_CPU_SIMD dp_status dp_cpu_layernorm_backward(dp_device *dev, float *dinp, float *dweight, float *dbias,
                                    const float *dout, const float *inp, const float *weight,
                                    const float *mean, const float *rstd, size_t N, size_t C)
{
    for (size_t n = 0; n < N; n++)
        dp_layernorm_backward_inp_row(dinp + n * C, dout + n * C, inp + n * C, weight, mean[n],
                                      rstd[n], C);
    for (size_t c = 0; c < C; c++)
        dp_layernorm_backward_param_channel(dweight, dbias, dout, inp, mean, rstd, N, C, c);
    return DP_OK;
}

// --- GELU --------------------------------------------------------------------------

DP_CPU_SIMD dp_status dp_cpu_gelu_forward(dp_device *dev, float *out, const float *inp, size_t n)
{
    for (size_t i = 0; i < n; i++) dp_gelu_forward_elem(out, inp, i);
    return DP_OK;
}

DP_CPU_SIMD dp_status dp_cpu_gelu_backward(dp_device *dev, float *dinp, const float *inp,
                               const float *dout, size_t n)
{
    for (size_t i = 0; i < n; i++) dp_gelu_backward_elem(dinp, inp, dout, i);
    return DP_OK;
}

// --- element-wise ------------------------------------------------------------------

DP_CPU_SIMD dp_status dp_cpu_add(dp_device *dev, float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++) dp_add_elem(out, a, b, i);
    return DP_OK;
}

DP_CPU_SIMD dp_status dp_cpu_accumulate(dp_device *dev, float *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) dp_accumulate_elem(dst, src, i);
    return DP_OK;
}

// --- cross-entropy -----------------------------------------------------------------

DP_CPU_SIMD dp_status dp_cpu_crossentropy(dp_device *dev, float *losses, float *dlogits,
                              const float *logits, const int32_t *targets, size_t N, size_t V,
                              float dscale)
{
    for (size_t n = 0; n < N; n++)
        dp_crossentropy_row(losses + n, dlogits ? dlogits + n * V : NULL, logits + n * V,
                            targets[n], V, dscale);
    return DP_OK;
}
