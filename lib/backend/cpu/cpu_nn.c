/*
 * backend/cpu/cpu_nn.c - the CPU backend's hand-written layer kernels:
 * the token embedding by rows, the reductions and scatters (encoder
 * backward, bias and LayerNorm
 * parameter gradients, sum of squares) and the bias broadcast. The
 * element-wise and row-wise ops are generated in cpu_backend.c from
 * kernels/ops.h; the attention permutes are in cpu_attention.c.
 *
 * Each entry loops, on the calling thread, over the DP_HD functions of
 * lib/kernels/ that define the math for every backend. Arguments were
 * validated by the public wrappers in lib/nn. Loops that accumulate into
 * one element run in a fixed order, so results are bitwise reproducible.
 */
#include <stdint.h>
#include <stdlib.h>

#include "backend/cpu/cpu_kernels.h"
#include "core/error.h"
#include "kernels/encoder.h"
#include "kernels/layernorm.h"
#include "kernels/linear.h"
#include "kernels/optim.h"

// --- encoder ---------------------------------------------------------------------

/* The ops.h entry encoder_forward (n = B*T*C elements) by rows: the
 * generated loop over elements divided each index by C and T (3.6 ns an
 * element, 1.2% of a small bf16 GPT step); the same additions. */
DP_CPU_SIMD dp_status dp_cpu_encoder_forward(dp_device *dev, float *out, const int32_t *inp,
                                             dp_pref wte, dp_pref wpe, size_t T, size_t C,
                                             size_t n)
{
    (void)dev;
    for (size_t bt = 0; bt < n / C; bt++)
        for (size_t c = 0; c < C; c++) dp_encoder_forward_at(out, inp, wte, wpe, T, C, bt, c);
    return DP_OK;
}

DP_CPU_SIMD dp_status dp_cpu_encoder_backward(dp_device *dev, float *dwte, float *dwpe,
                                              const float *dout, const int32_t *inp, size_t B,
                                              size_t T, size_t C)
{
    size_t BT = B * T;
    if (BT >= UINT32_MAX)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: B*T = %zu rows; the embedding backward "
                       "takes fewer than 2^32 rows; split the batch", dev->name, BT);
    uint32_t *scratch = malloc(dp_encoder_group_scratch_words(BT) * sizeof *scratch);
    if (!scratch)
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "%s: no host memory to group %zu rows by token",
                       dev->name, BT);
    for (size_t i = 0; i < T * C; i++) dp_encoder_backward_wpe_elem(dwpe, dout, B, T, C, i);
    uint32_t *order, *seg;
    size_t ng = dp_encoder_group_rows(inp, BT, scratch, &order, &seg);
    for (size_t g = 0; g < ng; g++)
        for (size_t c0 = 0; c0 < C; c0 += 64) {
            size_t c1 = C - c0 < 64 ? C : c0 + 64;
            dp_encoder_backward_wte_group(dwte, dout, inp, order, seg, C, g, c0, c1);
        }
    free(scratch);
    return DP_OK;
}

// --- linear (bias parts; the GEMM is the backend's) --------------------------------

DP_CPU_SIMD dp_status dp_cpu_bias_broadcast(dp_device *dev, float *out, dp_pref bias, size_t N,
                                            size_t OC)
{
    for (size_t r = 0; r < N; r++) dp_bias_broadcast_row(out, bias, OC, r);
    return DP_OK;
}

DP_CPU_SIMD dp_status dp_cpu_bias_backward(dp_device *dev, float *dbias, uint16_t *dout16,
                                           dp_pref dout, size_t N, size_t OC)
{
    for (size_t o0 = 0; o0 < OC; o0 += DP_COL_TILE) {
        size_t o1 = OC - o0 < DP_COL_TILE ? OC : o0 + DP_COL_TILE;
        dp_bias_backward_cols(dbias, dout16, dout, N, OC, o0, o1);
    }
    return DP_OK;
}

// --- LayerNorm parameter gradients -------------------------------------------------

DP_CPU_SIMD dp_status dp_cpu_layernorm_backward_params(dp_device *dev, float *dweight,
                                                       float *dbias, dp_pref dout,
                                                       const float *inp, const float *mean,
                                                       const float *rstd, size_t N, size_t C)
{
    for (size_t c0 = 0; c0 < C; c0 += DP_COL_TILE) {
        size_t c1 = C - c0 < DP_COL_TILE ? C : c0 + DP_COL_TILE;
        dp_layernorm_param_cols(dweight, dbias, dout, inp, mean, rstd, N, C, c0, c1);
    }
    return DP_OK;
}

// --- sum of squares (gradient norm) --------------------------------------------------

DP_CPU_SIMD dp_status dp_cpu_sum_squares(dp_device *dev, double *out_host, const float *x,
                                         size_t n)
{
    /* Index order, one double accumulator: reproducible bit for bit. */
    double acc = 0.0;
    for (size_t i = 0; i < n; i++) acc += dp_square_element(x[i]);
    *out_host = acc;
    return DP_OK;
}

// --- AdamW over an optimizer slice's tensors ----------------------------------------------

DP_CPU_SIMD dp_status dp_cpu_adamw_segments(dp_device *dev, float *params, float *grads,
                                            float *m, float *v, uint16_t *replica,
                                            const dp_adamw_segs *segs, float lr, float beta1,
                                            float beta2, float eps, float bias_corr1,
                                            float bias_corr2, float clip)
{
    (void)dev;
    /* Segment by segment, each in three plain loops (scale, AdamW, round)
     * that vectorise, where one loop with dp_adamw_clip_element's branches
     * would not: per element the same operations in the same order. */
    for (uint32_t s = 0; s < segs->n; s++) {
        float wd = segs->weight_decay[s];
        size_t b = (size_t)segs->begin[s], e = (size_t)segs->end[s];
        if (clip != 1.0f)
            for (size_t i = b; i < e; i++) grads[i] = dp_scale_element(grads[i], clip);
        for (size_t i = b; i < e; i++)
            dp_adamw_element(&params[i], &m[i], &v[i], grads[i], lr, beta1, beta2, eps, wd,
                             bias_corr1, bias_corr2);
        if (replica)
            for (size_t i = b; i < e; i++) replica[i] = dp_bf16_round(params[i]);
    }
    return DP_OK;
}
