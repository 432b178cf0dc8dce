/*
 * nn/gelu.c - GELU activation, tanh approximation (dp/nn.h): argument
 * checks, then the backend's kernels (kernels/gelu.h holds the math).
 */
#include "nn/nn_check.h"

#include "dp/nn.h"

dp_status dp_gelu_forward(dp_device *dev, float *out, const float *inp, size_t n)
{
    DP_NN_REQUIRE_DEV(dev);
    DP_NN_REQUIRE_PTR(dev, out);
    DP_NN_REQUIRE_PTR(dev, inp);
    DP_NN_CHECK_DIMS1(dev, n);
    return dev->ops->gelu_forward(dev, out, inp, n);
}

dp_status dp_gelu_forward_bf16(dp_device *dev, dp_bf16 *out, const dp_bf16 *inp, size_t n)
{
    DP_NN_REQUIRE_DEV(dev);
    DP_NN_REQUIRE_PTR(dev, out);
    DP_NN_REQUIRE_PTR(dev, inp);
    DP_NN_CHECK_DIMS1(dev, n);
    return dev->ops->gelu_forward_bf16(dev, out, inp, n);
}

dp_status dp_gelu_backward(dp_device *dev, float *dinp, const float *inp, const float *dout,
                           size_t n)
{
    DP_NN_REQUIRE_DEV(dev);
    DP_NN_REQUIRE_PTR(dev, dinp);
    DP_NN_REQUIRE_PTR(dev, inp);
    DP_NN_REQUIRE_PTR(dev, dout);
    DP_NN_CHECK_DIMS1(dev, n);
    return dev->ops->gelu_backward(dev, dinp, inp, dout, n);
}

dp_status dp_gelu_backward_bf16_inp(dp_device *dev, float *dinp, const dp_bf16 *inp,
                                    const float *dout, size_t n)
{
    DP_NN_REQUIRE_DEV(dev);
    DP_NN_REQUIRE_PTR(dev, dinp);
    DP_NN_REQUIRE_PTR(dev, inp);
    DP_NN_REQUIRE_PTR(dev, dout);
    DP_NN_CHECK_DIMS1(dev, n);
    return dev->ops->gelu_backward_bf16_inp(dev, dinp, inp, dout, n);
}
