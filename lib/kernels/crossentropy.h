/*
 * kernels/crossentropy.h - fused softmax + cross-entropy, one row at a time.
 *
 * For a row x(V) with target y:
 *   m = max_v x[v],  s = sum_v exp(x[v] - m)
 *   loss = (m - x[y]) + log(s)                   (= logsumexp(x) - x[y])
 *   dlogits[v] = dscale * (exp(x[v] - m) / s - [v == y])
 * Subtracting the max keeps every exp in (0, 1], so |x| ~ 1e4 neither
 * overflows nor loses the loss: s is summed in double (it can hold V terms
 * of very different size) and m - x[y], a difference of two floats, is exact
 * in double, so the only rounding left is the final cast to float.
 */
#ifndef DP_KERNELS_CROSSENTROPY_H
#define DP_KERNELS_CROSSENTROPY_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/dp_hd.h"

/* One row: *loss and, when dlogits is not NULL, dlogits(V). dlogits may be
 * the same row as logits (in place): x[y] is read before any write and each
 * x[v] is read before dlogits[v] is written. A negative target (-1) marks
 * an ignored row: loss 0 and a zero dlogits row. */
static inline DP_HD void dp_crossentropy_row(float *loss, float *dlogits, const float *logits,
                                             int32_t target, size_t V, float dscale)
{
    if (target < 0) {
        *loss = 0.0f;
        if (dlogits)
            for (size_t v = 0; v < V; v++) dlogits[v] = 0.0f;
        return;
    }
    float m = logits[0];
    for (size_t v = 1; v < V; v++) m = fmaxf(m, logits[v]);
    double s = 0.0;
    for (size_t v = 0; v < V; v++) s += (double)expf(logits[v] - m);
    float xy = logits[target];
    *loss = (float)(((double)m - (double)xy) + log(s));
    if (!dlogits) return;
    double inv_s = 1.0 / s;
    for (size_t v = 0; v < V; v++) {
        float p = (float)((double)expf(logits[v] - m) * inv_s);
        dlogits[v] = dscale * (p - ((size_t)target == v ? 1.0f : 0.0f));
    }
}

#endif /* DP_KERNELS_CROSSENTROPY_H */
