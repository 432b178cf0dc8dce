/*
 * nn/activation.c - the element-wise activations of dp/nn.h (GELU, ReLU,
 * SiLU): argument checks, then the backend's kernels (the math is in
 * kernels/gelu.h, kernels/relu.h and kernels/silu.h).
 */
#include "nn/nn_check.h"

#include "dp/nn.h"
#include "nn/nn_act16.h"

/* dp_<name>_forward(dev, out, inp, n) and dp_<name>_backward(dev, dinp,
 * inp, dout, n) for an activation whose float32 kernels are the backend's
 * <name>_forward and <name>_backward entries. */
#define DP_ACTIVATION(name)                                                                 \
    dp_status dp_##name##_forward(dp_device *dev, float *out, const float *inp, size_t n)   \
    {                                                                                       \
        DP_NN_REQUIRE_DEV(dev);                                                             \
        DP_NN_REQUIRE_PTR(dev, out);                                                        \
        DP_NN_REQUIRE_PTR(dev, inp);                                                        \
        DP_NN_CHECK_DIMS1(dev, n);                                                          \
        return dev->ops->name##_forward(dev, out, inp, n);                                  \
    }                                                                                       \
    dp_status dp_##name##_backward(dp_device *dev, float *dinp, const float *inp,            \
                                   const float *dout, size_t n)                             \
    {                                                                                       \
        DP_NN_REQUIRE_DEV(dev);                                                             \
        DP_NN_REQUIRE_PTR(dev, dinp);                                                       \
        DP_NN_REQUIRE_PTR(dev, inp);                                                        \
        DP_NN_REQUIRE_PTR(dev, dout);                                                       \
        DP_NN_CHECK_DIMS1(dev, n);                                                          \
        return dev->ops->name##_backward(dev, dinp, inp, dout, n);                          \
    }

DP_ACTIVATION(gelu)
DP_ACTIVATION(relu)
DP_ACTIVATION(silu)

// --- GELU over bfloat16 ----------------------------------------------------------------

dp_status dp_gelu_forward_bf16(dp_device *dev, dp_bf16 *out, const dp_bf16 *inp, size_t n)
{
    DP_NN_REQUIRE_DEV(dev);
    DP_NN_REQUIRE_PTR(dev, out);
    DP_NN_REQUIRE_PTR(dev, inp);
    DP_NN_CHECK_DIMS1(dev, n);
    return dev->ops->gelu_forward_bf16(dev, out, inp, n);
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

dp_status dp_gelu_backward_bf16(dp_device *dev, dp_bf16 *dinp, const dp_bf16 *inp,
                                const dp_bf16 *dout, size_t n)
{
    DP_NN_REQUIRE_DEV(dev);
    DP_NN_REQUIRE_PTR(dev, dinp);
    DP_NN_REQUIRE_PTR(dev, inp);
    DP_NN_REQUIRE_PTR(dev, dout);
    DP_NN_CHECK_DIMS1(dev, n);
    DP_NN_REQUIRE_DISJOINT(dev, dinp, n * sizeof(dp_bf16), inp, n * sizeof(dp_bf16));
    return dev->ops->gelu_backward_bf16(dev, dinp, inp, dout, n);
}
