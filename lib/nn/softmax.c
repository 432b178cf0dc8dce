/*
 * nn/softmax.c - softmax and log-softmax over the rows of a matrix
 * (dp/nn.h): argument checks, then the backend's row kernels. The softmax
 * is the attention's causal softmax with every key visible (a row of C
 * keys is query C - 1 of itself: kernels/attention.h), run in place; the
 * log-softmax has its own rows (kernels/softmax.h).
 */
#include "nn/nn_check.h"

#include "dp/nn.h"

/* dst = src unless they are the same buffer (the causal softmax runs in place). */
static dp_status copy_unless_same(dp_device *dev, float *dst, const float *src, size_t count)
{
    return dst == src ? DP_OK : dp_copy_d2d(dev, dst, src, count * sizeof(float));
}

/* The checks of a forward's (out, inp) or a backward's (dinp, out, dout)
 * arguments; *count = N * C. A backward's dinp must not alias out: out is
 * read after dinp is written. */
static dp_status check_args(const char *fn, dp_device *dev, int backward, const float *a,
                            const float *b, const float *c, size_t N, size_t C, size_t *count)
{
    static const char *names[2][3] = {{"out", "inp", ""}, {"dinp", "out", "dout"}};
    DP_NN_REQUIRE_DEV(dev);
    const float *p[3] = {a, b, c};
    for (int i = 0; i < 2 + backward; i++)
        if (!p[i])
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s on %s: %s must not be NULL; pass a "
                           "buffer allocated on this device", fn, dev->name, names[backward][i]);
    DP_NN_CHECK_DIMS2(dev, N, C, count);
    if (backward && a == b)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s on %s: dinp must not be out (the forward's "
                       "output is read while dinp is written); dinp may be dout", fn,
                       dev->name);
    return DP_OK;
}

dp_status dp_softmax_forward(dp_device *dev, float *out, const float *inp, size_t N, size_t C)
{
    size_t count = 0;
    DP_TRY(check_args(__func__, dev, 0, out, inp, NULL, N, C, &count));
    DP_TRY(copy_unless_same(dev, out, inp, count));
    return dev->ops->softmax_causal_forward(dev, out, NULL, 1.0f, C, C - 1, 1, N);
}

dp_status dp_softmax_backward(dp_device *dev, float *dinp, const float *out, const float *dout,
                              size_t N, size_t C)
{
    size_t count = 0;
    DP_TRY(check_args(__func__, dev, 1, dinp, out, dout, N, C, &count));
    DP_TRY(copy_unless_same(dev, dinp, dout, count));
    return dev->ops->softmax_causal_backward(dev, dinp, NULL, out, 1.0f, C, C - 1, 1, N);
}

dp_status dp_log_softmax_forward(dp_device *dev, float *out, const float *inp, size_t N,
                                 size_t C)
{
    size_t count = 0;
    DP_TRY(check_args(__func__, dev, 0, out, inp, NULL, N, C, &count));
    return dev->ops->log_softmax_forward(dev, out, inp, C, N);
}

dp_status dp_log_softmax_backward(dp_device *dev, float *dinp, const float *out,
                                  const float *dout, size_t N, size_t C)
{
    size_t count = 0;
    DP_TRY(check_args(__func__, dev, 1, dinp, out, dout, N, C, &count));
    return dev->ops->log_softmax_backward(dev, dinp, out, dout, C, N);
}
