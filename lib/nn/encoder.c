/*
 * nn/encoder.c - token + position embedding layer (dp/nn.h): argument
 * checks, then the backend's kernels (kernels/encoder.h).
 */
#include "nn/nn_check.h"

#include "dp/nn.h"

dp_status dp_encoder_forward(dp_device *dev, float *out, const int32_t *inp, const float *wte,
                             const float *wpe, size_t B, size_t T, size_t C)
{
    size_t n;
    DP_NN_REQUIRE_DEV(dev);
    DP_NN_REQUIRE_PTR(dev, out);
    DP_NN_REQUIRE_PTR(dev, inp);
    DP_NN_REQUIRE_PTR(dev, wte);
    DP_NN_REQUIRE_PTR(dev, wpe);
    DP_NN_CHECK_DIMS3(dev, B, T, C, &n);
    return dev->ops->encoder_forward(dev, out, inp, wte, wpe, T, C, n);
}

dp_status dp_encoder_backward(dp_device *dev, float *dwte, float *dwpe, const float *dout,
                              const int32_t *inp, size_t B, size_t T, size_t C)
{
    size_t n;
    DP_NN_REQUIRE_DEV(dev);
    DP_NN_REQUIRE_PTR(dev, dwte);
    DP_NN_REQUIRE_PTR(dev, dwpe);
    DP_NN_REQUIRE_PTR(dev, dout);
    DP_NN_REQUIRE_PTR(dev, inp);
    DP_NN_CHECK_DIMS3(dev, B, T, C, &n);
    return dev->ops->encoder_backward(dev, dwte, dwpe, dout, inp, B, T, C);
}
