/*
 * kernels/encoder.h - token + position embedding (GPT-2's wte + wpe).
 *
 * Forward is one function per output element. Backward is written so that
 * every gradient element receives its additions in a fixed order whatever
 * the launch shape: one function per dwpe element (sum over b in order) and
 * one per channel of dwte (tokens visited in order b*T+t), so no two calls
 * ever write the same element and the result is deterministic.
 */
#ifndef DP_KERNELS_ENCODER_H
#define DP_KERNELS_ENCODER_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/dp_hd.h"

/* out(B,T,C)[i] = wte[inp[b,t], c] + wpe[t, c] for flat index i in [0, B*T*C). */
static inline DP_HD void dp_encoder_forward_elem(float *out, const int32_t *inp,
                                                 const float *wte, const float *wpe, size_t T,
                                                 size_t C, size_t i)
{
    size_t bt = i / C, c = i % C, t = bt % T;
    out[i] = wte[(size_t)inp[bt] * C + c] + wpe[t * C + c];
}

/* dwpe(maxT,C)[t,c] += sum over b = 0..B-1 (in order) of dout(B,T,C)[b,t,c],
 * for flat index i = t*C + c in [0, T*C). The batch sum is formed first and
 * then added, so a large accumulated dwpe does not swamp the small terms. */
static inline DP_HD void dp_encoder_backward_wpe_elem(float *dwpe, const float *dout, size_t B,
                                                      size_t T, size_t C, size_t i)
{
    float acc = 0.0f;
    for (size_t b = 0; b < B; b++) acc += dout[b * T * C + i];
    dwpe[i] += acc;
}

/* Channel c of dwte(V,C): for bt = 0..BT-1 in order,
 * dwte[inp[bt], c] += dout(BT,C)[bt, c]. Distinct channels touch distinct
 * elements, so channels may run in parallel and stay deterministic. */
static inline DP_HD void dp_encoder_backward_wte_channel(float *dwte, const float *dout,
                                                         const int32_t *inp, size_t BT, size_t C,
                                                         size_t c)
{
    for (size_t bt = 0; bt < BT; bt++) dwte[(size_t)inp[bt] * C + c] += dout[bt * C + c];
}

#endif /* DP_KERNELS_ENCODER_H */
