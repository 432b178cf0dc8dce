/*
 * kernels/encoder.h - token + position embedding (GPT-2's wte + wpe).
 *
 * Forward is one function per output element. Backward is written so that
 * every gradient element receives its additions in a fixed order whatever
 * the launch shape: one function per dwpe element (sum over b in order) and
 * one per (token group, channel) of dwte (rows of a token in order b*T+t),
 * so no two calls ever write the same element and the result is
 * deterministic.
 */
#ifndef DP_KERNELS_ENCODER_H
#define DP_KERNELS_ENCODER_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/bf16.h"
#include "kernels/dp_hd.h"

/* out(B,T,C)[bt, c] = wte[inp[bt], c] + wpe[bt % T, c] for row bt = b*T+t;
 * wte and wpe are float32 or bfloat16 (kernels/bf16.h). */
static inline DP_HD DP_HD_ALWAYS_INLINE void dp_encoder_forward_at(float *out, const int32_t *inp,
                                                                  dp_pref wte, dp_pref wpe,
                                                                  size_t T, size_t C, size_t bt,
                                                                  size_t c)
{
    out[bt * C + c] = dp_pref_at(wte, (size_t)inp[bt] * C + c) + dp_pref_at(wpe, (bt % T) * C + c);
}

/* The same for flat index i in [0, B*T*C) (the GPU's one thread per
 * element; the CPU runs rows, dp_cpu_encoder_forward, without the two
 * divisions per element). */
static inline DP_HD void dp_encoder_forward_elem(float *out, const int32_t *inp, dp_pref wte,
                                                 dp_pref wpe, size_t T, size_t C, size_t i)
{
    dp_encoder_forward_at(out, inp, wte, wpe, T, C, i / C, i % C);
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

/* ---- dwte: rows grouped by token --------------------------------------------
 * dwte(V,C)[v,c] += S[v,c], where S[v,c] is the float sum, from 0, of
 * dout(BT,C)[bt,c] over the rows bt with inp[bt] == v, in increasing bt.
 * The rows are first grouped by token (a stable sort by token id, so each
 * group keeps increasing bt: dp_encoder_group_rows on the host, CUB's
 * radix sort on a GPU), then every (group, channel) pair is one
 * independent sum: the GPU runs one thread per (sorted row, channel), the
 * threads at a group's first row walking its rows (adjacent threads on
 * adjacent channels), the CPU a channel tile per group. No two pairs
 * write the same element, so the result is deterministic, and the order
 * is the same on both backends. */

/* Item i = j*C + c of the GPU: sorted row j, channel c. keys(BT) are the
 * token ids in sorted order (keys[j] = inp[order[j]]), order(BT) the rows
 * sorted stably by token. Only the first row of a group sums: its rows
 * order[j], order[j+1], ... while the key is the same; the others do
 * nothing. The sums of dp_encoder_backward_wte_group for the same groups. */
static inline DP_HD void dp_encoder_backward_wte_sorted_elem(float *dwte, const float *dout,
                                                             const uint32_t *keys,
                                                             const uint32_t *order, size_t BT,
                                                             size_t C, size_t i)
{
    size_t j = i / C, c = i % C;
    uint32_t v = keys[j];
    if (j > 0 && keys[j - 1] == v) return;
    float acc = 0.0f;
    for (size_t k = j; k < BT && keys[k] == v; k++) acc += dout[(size_t)order[k] * C + c];
    dwte[(size_t)v * C + c] += acc;
}

/* Group g, channels [c0, c1) with c1 - c0 <= 64 (the CPU's loop: rows read
 * contiguously); the same sums as dp_encoder_backward_wte_sorted_elem. */
static inline DP_HD DP_HD_ALWAYS_INLINE void
dp_encoder_backward_wte_group(float *dwte, const float *dout, const int32_t *inp,
                              const uint32_t *order, const uint32_t *seg, size_t C, size_t g,
                              size_t c0, size_t c1)
{
    float acc[64];
    size_t w = c1 - c0, v = (size_t)inp[order[seg[g]]];
    for (size_t k = 0; k < w; k++) acc[k] = 0.0f;
    for (uint32_t j = seg[g]; j < seg[g + 1]; j++) {
        const float *row = dout + (size_t)order[j] * C + c0;
        for (size_t k = 0; k < w; k++) acc[k] += row[k];
    }
    for (size_t k = 0; k < w; k++) dwte[v * C + c0 + k] += acc[k];
}

/* Host words of scratch dp_encoder_group_rows needs for BT rows. */
static inline size_t dp_encoder_group_scratch_words(size_t BT) { return 3 * BT + 1 + 65536; }

/* Groups the rows 0..BT-1 (0 < BT <= UINT32_MAX - 1) by token (host code):
 * order(BT) gets the row indices sorted by inp[row], rows of one token in
 * increasing order (an LSD radix sort in two 16-bit passes, which is
 * stable); seg(ngroups + 1) the start of each group in order, then BT.
 * scratch holds dp_encoder_group_scratch_words(BT) words (order and seg
 * point into it). Token ids must be >= 0. Returns the number of groups. */
static inline size_t dp_encoder_group_rows(const int32_t *inp, size_t BT, uint32_t *scratch,
                                           uint32_t **order_out, uint32_t **seg_out)
{
    uint32_t *order = scratch, *tmp = scratch + BT, *seg = scratch + 2 * BT;
    uint32_t *count = scratch + 3 * BT + 1;
    for (int pass = 0; pass < 2; pass++) {
        int shift = 16 * pass;
        for (size_t d = 0; d < 65536; d++) count[d] = 0;
        for (size_t r = 0; r < BT; r++) {
            uint32_t row = pass == 0 ? (uint32_t)r : tmp[r];
            count[((uint32_t)inp[row] >> shift) & 0xFFFFu]++;
        }
        uint32_t sum = 0;
        for (size_t d = 0; d < 65536; d++) {
            uint32_t c = count[d];
            count[d] = sum;
            sum += c;
        }
        for (size_t r = 0; r < BT; r++) {
            uint32_t row = pass == 0 ? (uint32_t)r : tmp[r];
            uint32_t *dst = pass == 0 ? tmp : order;
            dst[count[((uint32_t)inp[row] >> shift) & 0xFFFFu]++] = row;
        }
    }
    size_t ng = 0;
    for (size_t j = 0; j < BT; j++)
        if (j == 0 || inp[order[j]] != inp[order[j - 1]]) seg[ng++] = (uint32_t)j;
    seg[ng] = (uint32_t)BT;
    *order_out = order;
    *seg_out = seg;
    return ng;
}

#endif /* DP_KERNELS_ENCODER_H */
