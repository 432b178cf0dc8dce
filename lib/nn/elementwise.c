/*
 * nn/elementwise.c - dp_accumulate (dp/nn.h): dst += src on a device.
 * (dp_scale and dp_sum_squares, the element-wise helpers of gradient
 * clipping, live in optim/clip.c and dp/optim.h.)
 */
#include "nn/nn_check.h"

#include "dp/nn.h"

dp_status dp_accumulate(dp_device *dev, float *dst, const float *src, size_t n)
{
    DP_NN_REQUIRE_DEV(dev);
    DP_NN_REQUIRE_PTR(dev, dst);
    DP_NN_REQUIRE_PTR(dev, src);
    DP_NN_CHECK_DIMS1(dev, n);
    return dev->ops->accumulate(dev, dst, src, n);
}
