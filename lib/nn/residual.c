/*
 * nn/residual.c - residual connection out = a + b (dp/nn.h). Its backward
 * sends dout to both branches; both accumulate, as gradients on the
 * residual stream arrive from several layers.
 */
#include "nn/nn_check.h"

#include "dp/nn.h"

dp_status dp_residual_forward(dp_device *dev, float *out, const float *a, const float *b,
                              size_t n)
{
    DP_NN_REQUIRE_DEV(dev);
    DP_NN_REQUIRE_PTR(dev, out);
    DP_NN_REQUIRE_PTR(dev, a);
    DP_NN_REQUIRE_PTR(dev, b);
    DP_NN_CHECK_DIMS1(dev, n);
    return dev->ops->add(dev, out, a, b, n);
}

dp_status dp_residual_backward(dp_device *dev, float *da, float *db, const float *dout,
                               size_t n)
{
    DP_NN_REQUIRE_DEV(dev);
    DP_NN_REQUIRE_PTR(dev, dout);
    DP_NN_CHECK_DIMS1(dev, n);
    if (da) DP_TRY(dev->ops->accumulate(dev, da, dout, n));
    if (db) DP_TRY(dev->ops->accumulate(dev, db, dout, n));
    return DP_OK;
}
