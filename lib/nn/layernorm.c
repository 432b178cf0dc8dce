/*
 * nn/layernorm.c - LayerNorm layer (dp/nn.h): argument checks, then the
 * backend's kernels (kernels/layernorm.h holds the math).
 */
#include "nn/nn_check.h"

#include "dp/nn.h"

dp_status dp_layernorm_forward(dp_device *dev, float *out, float *mean, float *rstd,
                               const float *inp, const float *weight, const float *bias,
                               size_t N, size_t C)
{
    size_t n;
    DP_NN_REQUIRE_DEV(dev);
    DP_NN_REQUIRE_PTR(dev, out);
    DP_NN_REQUIRE_PTR(dev, mean);
    DP_NN_REQUIRE_PTR(dev, rstd);
    DP_NN_REQUIRE_PTR(dev, inp);
    DP_NN_REQUIRE_PTR(dev, weight);
    DP_NN_REQUIRE_PTR(dev, bias);
    DP_NN_CHECK_DIMS2(dev, N, C, &n);
    return dev->ops->layernorm_forward(dev, out, mean, rstd, inp, weight, bias, C,
                                       DP_LAYERNORM_EPS, N);
}

dp_status dp_layernorm_backward(dp_device *dev, float *dinp, float *dweight, float *dbias,
                                const float *dout, const float *inp, const float *weight,
                                const float *mean, const float *rstd, size_t N, size_t C)
{
    size_t n;
    DP_NN_REQUIRE_DEV(dev);
    DP_NN_REQUIRE_PTR(dev, dinp);
    DP_NN_REQUIRE_PTR(dev, dweight);
    DP_NN_REQUIRE_PTR(dev, dbias);
    DP_NN_REQUIRE_PTR(dev, dout);
    DP_NN_REQUIRE_PTR(dev, inp);
    DP_NN_REQUIRE_PTR(dev, weight);
    DP_NN_REQUIRE_PTR(dev, mean);
    DP_NN_REQUIRE_PTR(dev, rstd);
    DP_NN_CHECK_DIMS2(dev, N, C, &n);
    DP_TRY(dev->ops->layernorm_backward_inp(dev, dinp, dout, inp, weight, mean, rstd, C, N));
    return dev->ops->layernorm_backward_params(dev, dweight, dbias, dout, inp, mean, rstd, N, C);
}
