/*
 * nn/dropout.c - inverted dropout with a counter-based mask (dp/nn.h):
 * argument checks, the mask's key for (seed, step) on the host, then the
 * backend's element kernel (kernels/dropout.h). Forward and backward are
 * the same kernel: the backward applies the forward's mask, recomputed,
 * to the gradient.
 */
#include <math.h>

#include "kernels/dropout.h"
#include "nn/nn_check.h"

#include "dp/nn.h"

static dp_status dropout(dp_device *dev, float *out, const float *x, float p, uint64_t seed,
                         uint64_t step, size_t row0, size_t rows, size_t cols, const char *fn)
{
    size_t count, end;
    if (!(p >= 0.0f && p <= 1.0f))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s on %s: p = %g; the drop probability is in "
                       "[0, 1]", fn, dev->name, (double)p);
    DP_NN_CHECK_DIMS2(dev, rows, cols, &count);
    if (!dp_size_add(row0, rows, &end))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s on %s: row0 %zu + rows %zu overflows "
                       "size_t", fn, dev->name, row0, rows);
    /* p = 1: every element is dropped, the scale (inf) is never used. */
    float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    return dev->ops->dropout(dev, out, x, dp_dropout_key(seed, step), row0, cols, p, scale,
                             count);
}

dp_status dp_dropout_forward(dp_device *dev, float *out, const float *inp, float p,
                             uint64_t seed, uint64_t step, size_t row0, size_t rows, size_t cols)
{
    DP_NN_REQUIRE_DEV(dev);
    DP_NN_REQUIRE_PTR(dev, out);
    DP_NN_REQUIRE_PTR(dev, inp);
    return dropout(dev, out, inp, p, seed, step, row0, rows, cols, __func__);
}

dp_status dp_dropout_backward(dp_device *dev, float *dinp, const float *dout, float p,
                              uint64_t seed, uint64_t step, size_t row0, size_t rows,
                              size_t cols)
{
    DP_NN_REQUIRE_DEV(dev);
    DP_NN_REQUIRE_PTR(dev, dinp);
    DP_NN_REQUIRE_PTR(dev, dout);
    return dropout(dev, dinp, dout, p, seed, step, row0, rows, cols, __func__);
}
