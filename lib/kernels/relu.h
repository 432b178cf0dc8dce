/*
 * kernels/relu.h - the rectified linear unit (Nair & Hinton 2010):
 *   relu(x)  = max(x, 0)
 *   relu'(x) = 1 for x > 0, else 0 (0 at x = 0, as PyTorch's)
 * A NaN input stays NaN in the forward (NaN < 0 is false) and passes no
 * gradient back (NaN > 0 is false), as torch.relu and its backward do.
 */
#ifndef DP_KERNELS_RELU_H
#define DP_KERNELS_RELU_H

#include <stddef.h>

#include "kernels/dp_hd.h"

/* out[i] = relu(inp[i]); out may alias inp. */
static inline DP_HD void dp_relu_forward_elem(float *out, const float *inp, size_t i)
{
    float x = inp[i];
    out[i] = x < 0.0f ? 0.0f : x;
}

/* dinp[i] = dout[i] * relu'(inp[i]); dinp may alias dout. */
static inline DP_HD void dp_relu_backward_elem(float *dinp, const float *inp, const float *dout,
                                               size_t i)
{
    dinp[i] = inp[i] > 0.0f ? dout[i] : 0.0f;
}

#endif /* DP_KERNELS_RELU_H */
