/*
 * nn/encoder.c - token + position embedding layer (dp/nn.h): argument
 * checks, then the backend's kernels (kernels/encoder.h).
 */
#include "nn/nn_check.h"

#include "dp/nn.h"

/* The public functions' checks (a macro, so messages name them); sets n. */
#define CHECK_FORWARD()                          \
    do {                                         \
        DP_NN_REQUIRE_DEV(dev);                  \
        DP_NN_REQUIRE_PTR(dev, out);             \
        DP_NN_REQUIRE_PTR(dev, inp);             \
        DP_NN_REQUIRE_PTR(dev, wte);             \
        DP_NN_REQUIRE_PTR(dev, wpe);             \
        DP_NN_CHECK_DIMS3(dev, B, T, C, &n);     \
    } while (0)

/* dp_encoder_forward over embeddings of either type (w16: bfloat16); n =
 * B*T*C. */
static dp_status encoder_forward(dp_device *dev, float *out, const int32_t *inp, const void *wte,
                                 const void *wpe, int w16, size_t T, size_t C, size_t n)
{
    dp_pref e = w16 ? dp_pref_bf16(wte) : dp_pref_f32(wte);
    dp_pref p = w16 ? dp_pref_bf16(wpe) : dp_pref_f32(wpe);
    return dev->ops->encoder_forward(dev, out, inp, e, p, T, C, n);
}

dp_status dp_encoder_forward(dp_device *dev, float *out, const int32_t *inp, const float *wte,
                             const float *wpe, size_t B, size_t T, size_t C)
{
    size_t n;
    CHECK_FORWARD();
    return encoder_forward(dev, out, inp, wte, wpe, 0, T, C, n);
}

dp_status dp_encoder_forward_bf16(dp_device *dev, float *out, const int32_t *inp,
                                  const dp_bf16 *wte, const dp_bf16 *wpe, size_t B, size_t T,
                                  size_t C)
{
    size_t n;
    CHECK_FORWARD();
    return encoder_forward(dev, out, inp, wte, wpe, 1, T, C, n);
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
