/*
 * nn/layernorm.c - LayerNorm layer (dp/nn.h), and its forward with a
 * bfloat16 output and backward from a bfloat16 gradient (nn/nn_act16.h):
 * argument checks, then the backend's kernels (kernels/layernorm.h holds
 * the math).
 */
#include "nn/nn_check.h"

#include "dp/nn.h"
#include "dp/ops.h"
#include "nn/nn_act16.h"

/* The public functions' checks (a macro, so messages name them). */
#define CHECK_FORWARD()                      \
    do {                                     \
        size_t n_;                           \
        DP_NN_REQUIRE_DEV(dev);              \
        DP_NN_REQUIRE_PTR(dev, out);         \
        DP_NN_REQUIRE_PTR(dev, mean);        \
        DP_NN_REQUIRE_PTR(dev, rstd);        \
        DP_NN_REQUIRE_PTR(dev, inp);         \
        DP_NN_REQUIRE_PTR(dev, weight);      \
        DP_NN_REQUIRE_PTR(dev, bias);        \
        DP_NN_CHECK_DIMS2(dev, N, C, &n_);   \
    } while (0)
#define CHECK_BACKWARD()                     \
    do {                                     \
        size_t n_;                           \
        DP_NN_REQUIRE_DEV(dev);              \
        DP_NN_REQUIRE_PTR(dev, dinp);        \
        DP_NN_REQUIRE_PTR(dev, dweight);     \
        DP_NN_REQUIRE_PTR(dev, dbias);       \
        DP_NN_REQUIRE_PTR(dev, dout);        \
        DP_NN_REQUIRE_PTR(dev, inp);         \
        DP_NN_REQUIRE_PTR(dev, weight);      \
        DP_NN_REQUIRE_PTR(dev, mean);        \
        DP_NN_REQUIRE_PTR(dev, rstd);        \
        DP_NN_CHECK_DIMS2(dev, N, C, &n_);   \
    } while (0)

static dp_pref pref(const void *p, int w16)
{
    return w16 ? dp_pref_bf16(p) : dp_pref_f32(p);
}

/* The layer over weight and bias of either type (w16: bfloat16). */
static dp_status layernorm_forward(dp_device *dev, float *out, float *mean, float *rstd,
                                   const float *inp, const void *weight, const void *bias,
                                   int w16, size_t N, size_t C)
{
    return dev->ops->layernorm_forward(dev, out, mean, rstd, inp, pref(weight, w16),
                                       pref(bias, w16), C, DP_LAYERNORM_EPS, N);
}

static dp_status layernorm_backward(dp_device *dev, float *dinp, float *dweight, float *dbias,
                                    dp_pref dout, const float *inp, const void *weight,
                                    int w16, const float *mean, const float *rstd, size_t N,
                                    size_t C)
{
    DP_TRY(dev->ops->layernorm_backward_inp(dev, dinp, dout, inp, pref(weight, w16), mean, rstd,
                                            C, N));
    return dev->ops->layernorm_backward_params(dev, dweight, dbias, dout, inp, mean, rstd, N, C);
}

dp_status dp_layernorm_forward(dp_device *dev, float *out, float *mean, float *rstd,
                               const float *inp, const float *weight, const float *bias,
                               size_t N, size_t C)
{
    CHECK_FORWARD();
    return layernorm_forward(dev, out, mean, rstd, inp, weight, bias, 0, N, C);
}

dp_status dp_layernorm_forward_bf16(dp_device *dev, float *out, float *mean, float *rstd,
                                    const float *inp, const dp_bf16 *weight, const dp_bf16 *bias,
                                    size_t N, size_t C)
{
    CHECK_FORWARD();
    return layernorm_forward(dev, out, mean, rstd, inp, weight, bias, 1, N, C);
}

dp_status dp_layernorm_backward(dp_device *dev, float *dinp, float *dweight, float *dbias,
                                const float *dout, const float *inp, const float *weight,
                                const float *mean, const float *rstd, size_t N, size_t C)
{
    CHECK_BACKWARD();
    return layernorm_backward(dev, dinp, dweight, dbias, dp_pref_f32(dout), inp, weight, 0, mean,
                              rstd, N, C);
}

dp_status dp_layernorm_backward_bf16(dp_device *dev, float *dinp, float *dweight, float *dbias,
                                     const float *dout, const float *inp, const dp_bf16 *weight,
                                     const float *mean, const float *rstd, size_t N, size_t C)
{
    CHECK_BACKWARD();
    return layernorm_backward(dev, dinp, dweight, dbias, dp_pref_f32(dout), inp, weight, 1, mean,
                              rstd, N, C);
}

// --- the bfloat16 output (nn/nn_act16.h) ------------------------------------------------

/* The composition the producer replaces (the test hook's path): the
 * float32 layer into a temporary buffer, then the conversion. */
static dp_status layernorm_forward_then_convert(dp_device *dev, dp_bf16 *out, float *mean,
                                                float *rstd, const float *inp, dp_pref weight,
                                                dp_pref bias, size_t N, size_t C)
{
    void *tmp = NULL;
    DP_TRY(dp_device_alloc(dev, N * C * sizeof(float), &tmp));
    dp_status s = dev->ops->layernorm_forward(dev, tmp, mean, rstd, inp, weight, bias, C,
                                              DP_LAYERNORM_EPS, N);
    if (s == DP_OK) s = dp_convert(dev, out, DP_DTYPE_BF16, tmp, DP_DTYPE_F32, N * C);
    dp_device_free(dev, tmp);
    return s;
}

dp_status dp_layernorm_forward_out16(dp_device *dev, dp_bf16 *out, float *mean, float *rstd,
                                     const float *inp, dp_pref weight, dp_pref bias, size_t N,
                                     size_t C)
{
    size_t n;
    DP_NN_REQUIRE_DEV(dev);
    DP_NN_REQUIRE_PTR(dev, out);
    DP_NN_REQUIRE_PTR(dev, mean);
    DP_NN_REQUIRE_PTR(dev, rstd);
    DP_NN_REQUIRE_PTR(dev, inp);
    DP_NN_REQUIRE_PTR(dev, weight.p);
    DP_NN_REQUIRE_PTR(dev, bias.p);
    DP_NN_CHECK_DIMS2(dev, N, C, &n);
    /* Rows are read while others' outputs are written (GPU blocks). */
    DP_NN_REQUIRE_DISJOINT(dev, out, n * sizeof(dp_bf16), inp, n * sizeof(float));
    DP_NN_REQUIRE_DISJOINT(dev, out, n * sizeof(dp_bf16), mean, N * sizeof(float));
    DP_NN_REQUIRE_DISJOINT(dev, out, n * sizeof(dp_bf16), rstd, N * sizeof(float));
    if (dev->no_fused_producers)
        return layernorm_forward_then_convert(dev, out, mean, rstd, inp, weight, bias, N, C);
    return dev->ops->layernorm_forward_bf16_out(dev, out, mean, rstd, inp, weight, bias, C,
                                                DP_LAYERNORM_EPS, N);
}

// --- the residual stream's update with the next LayerNorm (nn/nn_act16.h) -----------------

dp_status dp_residual_layernorm_forward(dp_device *dev, void *out, dp_dtype out_type, float *mean,
                                        float *rstd, float *x, const float *add, dp_pref weight,
                                        dp_pref bias, size_t N, size_t C)
{
    size_t n;
    DP_NN_REQUIRE_DEV(dev);
    DP_NN_REQUIRE_PTR(dev, out);
    DP_NN_REQUIRE_PTR(dev, mean);
    DP_NN_REQUIRE_PTR(dev, rstd);
    DP_NN_REQUIRE_PTR(dev, x);
    DP_NN_REQUIRE_PTR(dev, add);
    DP_NN_REQUIRE_PTR(dev, weight.p);
    DP_NN_REQUIRE_PTR(dev, bias.p);
    int out16;
    DP_TRY(dp_nn_check_dtype("dp_residual_layernorm_forward", dev, "out_type", out_type,
                             &out16));
    DP_NN_CHECK_DIMS2(dev, N, C, &n);
    size_t ob = n * (out16 ? sizeof(dp_bf16) : sizeof(float));
    /* x is written while out is, and read whole per row before: apart. */
    DP_NN_REQUIRE_DISJOINT(dev, out, ob, x, n * sizeof(float));
    DP_NN_REQUIRE_DISJOINT(dev, out, ob, add, n * sizeof(float));
    DP_NN_REQUIRE_DISJOINT(dev, x, n * sizeof(float), add, n * sizeof(float));
    DP_NN_REQUIRE_DISJOINT(dev, out, ob, mean, N * sizeof(float));
    DP_NN_REQUIRE_DISJOINT(dev, out, ob, rstd, N * sizeof(float));
    if (dev->no_fused_producers) { /* the composition it stands for */
        DP_TRY(dp_accumulate(dev, x, add, n));
        if (out16) return dp_layernorm_forward_out16(dev, out, mean, rstd, x, weight, bias, N, C);
        return layernorm_forward(dev, out, mean, rstd, x, weight.p, bias.p, weight.bf16, N, C);
    }
    return dev->ops->residual_layernorm_forward(dev, out16 ? NULL : out, out16 ? out : NULL, mean,
                                                rstd, x, add, weight, bias, C,
                                                DP_LAYERNORM_EPS, N);
}

// --- the backward from a bfloat16 gradient (nn/nn_act16.h) --------------------------------

dp_status dp_layernorm_backward_dout16(dp_device *dev, float *dinp, float *dweight,
                                       float *dbias, const dp_bf16 *dout, const float *inp,
                                       dp_pref weight, const float *mean, const float *rstd,
                                       size_t N, size_t C)
{
    size_t n;
    DP_NN_REQUIRE_DEV(dev);
    DP_NN_REQUIRE_PTR(dev, dinp);
    DP_NN_REQUIRE_PTR(dev, dweight);
    DP_NN_REQUIRE_PTR(dev, dbias);
    DP_NN_REQUIRE_PTR(dev, dout);
    DP_NN_REQUIRE_PTR(dev, inp);
    DP_NN_REQUIRE_PTR(dev, weight.p);
    DP_NN_REQUIRE_PTR(dev, mean);
    DP_NN_REQUIRE_PTR(dev, rstd);
    DP_NN_CHECK_DIMS2(dev, N, C, &n);
    /* dinp is added to while other rows of dout are read (GPU blocks). */
    DP_NN_REQUIRE_DISJOINT(dev, dinp, n * sizeof(float), dout, n * sizeof(dp_bf16));
    return layernorm_backward(dev, dinp, dweight, dbias, dp_pref_bf16(dout), inp, weight.p,
                              weight.bf16, mean, rstd, N, C);
}
