/*
 * kernels/ops.h - the element-wise and row-wise ops, one line each.
 *
 * An op of this list is a DP_HD function fn(args..., i) that computes item
 * i (an element, or a row) of its outputs and writes nothing another item
 * writes. From the one line below:
 *   - backend/backend.h declares its dp_backend_ops entry
 *         dp_status (*name)(dp_device *dev, params..., size_t n);
 *   - the CPU backend (cpu/cpu_ops.c) fills it with a loop i = 0..n-1;
 *   - the CUDA backend (cuda/cuda_kernels.cu, cuda/cuda_backend.c) fills it
 *     with a kernel of the op's shape (below) on the device's stream: for
 *     ELEM, a grid-stride kernel with one thread per item.
 * So a new op is: its DP_HD function in a kernels/ header (included here),
 * one X(...) line here, and the public wrapper in lib/nn (or lib/optim)
 * that checks the arguments and calls dev->ops->name(..., n).
 *
 * X(name, shape, fn, params, args):
 *   name    the entry's name;
 *   shape   ELEM (cheap items: 256-thread blocks on the GPU), VEC (an ELEM op
 *           over the bf16 step's largest tensors, every pointer indexed by
 *           the item: the CUDA backend runs its own kernel of 16-byte
 *           accesses, cuda/cuda_vec.cuh, where the pointers are aligned, and
 *           the ELEM kernel otherwise), ROW_BLOCK (an
 *           item is a row with reductions over it: the CUDA backend runs its
 *           own kernel with one block per row, coalesced reads and a fixed
 *           warp-shuffle reduction tree, written in cuda_rows.cu against
 *           fn's semantics) or COLUMNS (items are the elements of a block of
 *           columns, a column's rows contiguous: the CUDA backend runs a warp
 *           per segment of a column) or TILED (an item is a query or key row
 *           of the fused attention, kernels/flash.h: the CUDA backend runs its
 *           own kernels, cuda/cuda_flash.cu, tiled or vectorised, built from
 *           fn's pieces);
 *           the CPU loops over fn whatever the shape;
 *   fn      the DP_HD item function;
 *   params  the entry's parameters between dev and n, in parentheses;
 *   args    their names, in the same order, as passed to fn before i.
 * The item count n is always the last parameter and is > 0 (the public
 * wrappers refuse empty tensors); shapes are as in dp/nn.h.
 */
#ifndef DP_KERNELS_OPS_H
#define DP_KERNELS_OPS_H

#include "kernels/attention.h"
#include "kernels/bf16.h"
#include "kernels/crossentropy.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/encoder.h"
#include "kernels/flash.h"
#include "kernels/gelu.h"
#include "kernels/ignored.h"
#include "kernels/layernorm.h"
#include "kernels/optim.h"
#include "kernels/relu.h"
#include "kernels/silu.h"
#include "kernels/softmax.h"

/* Removes one pair of parentheses: DP_UNPAREN (a, b) is a, b. */
#define DP_UNPAREN(...) __VA_ARGS__

#define DP_KERNEL_OPS(X)                                                                   \
    /* out(B,T,C) = wte[inp] + wpe[t]; n = B*T*C */                                        \
    X(encoder_forward, ELEM, dp_encoder_forward_elem,                                      \
      (float *out, const int32_t *inp, dp_pref wte, dp_pref wpe, size_t T, size_t C),      \
      (out, inp, wte, wpe, T, C))                                                          \
    /* bfloat16 <-> float32 (kernels/bf16.h) */                                            \
    X(cast_f32_bf16, VEC, dp_cast_f32_bf16_elem, (uint16_t *dst, const float *src),        \
      (dst, src))                                                                          \
    X(cast_bf16_f32, ELEM, dp_cast_bf16_f32_elem, (float *dst, const uint16_t *src),       \
      (dst, src))                                                                          \
    X(round_bf16, ELEM, dp_round_bf16_elem, (float *dst, const float *src), (dst, src))    \
    /* a block of an operand, densely; n = matrices * rows * cols (kernels/bf16.h) */      \
    X(pack_f32_bf16, COLUMNS, dp_pack_f32_bf16_elem,                                          \
      (uint16_t *dst, const float *src, dp_block blk), (dst, src, blk))                    \
    X(pack_bf16_f32, COLUMNS, dp_pack_bf16_f32_elem,                                          \
      (float *dst, const uint16_t *src, dp_block blk), (dst, src, blk))                    \
    X(gelu_forward, ELEM, dp_gelu_forward_elem, (float *out, const float *inp), (out, inp)) \
    X(gelu_forward_bf16, VEC, dp_gelu_forward_bf16_elem,                                   \
      (uint16_t *out, const uint16_t *inp), (out, inp))                                    \
    X(gelu_backward, ELEM, dp_gelu_backward_elem,                                          \
      (float *dinp, const float *inp, const float *dout), (dinp, inp, dout))               \
    X(gelu_backward_bf16_inp, ELEM, dp_gelu_backward_bf16_inp_elem,                        \
      (float *dinp, const uint16_t *inp, const float *dout), (dinp, inp, dout))            \
    /* the same from a bfloat16 dout into a bfloat16 dinp (may be dout) */                  \
    X(gelu_backward_bf16, VEC, dp_gelu_backward_bf16_elem,                                 \
      (uint16_t *dinp, const uint16_t *inp, const uint16_t *dout), (dinp, inp, dout))      \
    X(relu_forward, ELEM, dp_relu_forward_elem, (float *out, const float *inp), (out, inp)) \
    X(relu_backward, ELEM, dp_relu_backward_elem,                                          \
      (float *dinp, const float *inp, const float *dout), (dinp, inp, dout))               \
    X(silu_forward, ELEM, dp_silu_forward_elem, (float *out, const float *inp), (out, inp)) \
    X(silu_backward, ELEM, dp_silu_backward_elem,                                          \
      (float *dinp, const float *inp, const float *dout), (dinp, inp, dout))               \
    /* n = rows * cols of a block whose first row is global row row0 (kernels/dropout.h) */ \
    X(dropout, ELEM, dp_dropout_elem,                                                      \
      (float *out, const float *x, uint64_t key, size_t row0, size_t cols, float p,        \
       float scale),                                                                       \
      (out, x, key, row0, cols, p, scale))                                                 \
    /* out = a + b */                                                                      \
    X(add, ELEM, dp_add_elem, (float *out, const float *a, const float *b), (out, a, b))   \
    /* dst += src */                                                                       \
    X(accumulate, ELEM, dp_accumulate_elem, (float *dst, const float *src), (dst, src))    \
    /* x *= s */                                                                           \
    X(scale, ELEM, dp_scale_elem, (float *x, float s), (x, s))                             \
    X(adamw, ELEM, dp_adamw_elem,                                                          \
      (float *params, const float *grads, float *m, float *v, float lr, float beta1,       \
       float beta2, float eps, float weight_decay, float bias_corr1, float bias_corr2),    \
      (params, grads, m, v, lr, beta1, beta2, eps, weight_decay, bias_corr1, bias_corr2))  \
    X(sgd, ELEM, dp_sgd_elem,                                                              \
      (float *params, const float *grads, float *momentum_buf, float lr, float momentum,   \
       float weight_decay, int first_step),                                                \
      (params, grads, momentum_buf, lr, momentum, weight_decay, first_step))               \
    /* rows of (N,C); caches mean(N), rstd(N); n = N */                                    \
    X(layernorm_forward, ROW_BLOCK, dp_layernorm_forward_item,                                   \
      (float *out, float *mean, float *rstd, const float *inp, dp_pref weight,             \
       dp_pref bias, size_t C, float eps),                                                 \
      (out, mean, rstd, inp, weight, bias, C, eps))                                        \
    /* dinp(N,C) += the input gradient (dout float32 or bfloat16); n = N */               \
    X(layernorm_backward_inp, ROW_BLOCK, dp_layernorm_backward_inp_item,                         \
      (float *dinp, dp_pref dout, const float *inp, dp_pref weight,                        \
       const float *mean, const float *rstd, size_t C),                                    \
      (dinp, dout, inp, weight, mean, rstd, C))                                            \
    /* att(rows,ld) in place, row r is query t = q0 + r % nq: softmax(scale * att[r, 0..t]), \
     * zeros after t (kernels/attention.h); att16 NULL or (rows,ld): also rounded to bf16; \
     * n = rows */                                                                         \
    X(softmax_causal_forward, ROW_BLOCK, dp_softmax_causal_forward_item,                   \
      (float *att, uint16_t *att16, float scale, size_t ld, size_t q0, size_t nq),        \
      (att, att16, scale, ld, q0, nq))                                                     \
    /* datt(rows,ld): d(att) -> d(pre-softmax scores), scale included, in place, or with  \
     * ds16 (rows,ld) rounded to bf16 into ds16 only */                                    \
    X(softmax_causal_backward, ROW_BLOCK, dp_softmax_causal_backward_item,                       \
      (float *datt, uint16_t *ds16, const float *att, float scale, size_t ld, size_t q0,  \
       size_t nq),                                                                         \
      (datt, ds16, att, scale, ld, q0, nq))                                                \
    /* losses(N) per row (0 for ignored), dlogits(N,V) as dp_crossentropy_forward_backward \
     * (may be NULL or alias logits); n = N */                                             \
    X(crossentropy, ROW_BLOCK, dp_crossentropy_item,                                             \
      (float *losses, float *dlogits, const float *logits, const int32_t *targets,         \
       size_t V, float dscale),                                                            \
      (losses, dlogits, logits, targets, V, dscale))                                      \
    /* crossentropy over bfloat16 logits(N,V): losses float32, dlogits (NULL, or bfloat16,  \
     * may alias logits) the float values rounded once (kernels/crossentropy.h); n = N */   \
    X(crossentropy_bf16, ROW_BLOCK, dp_crossentropy_bf16_item,                             \
      (float *losses, uint16_t *dlogits, const uint16_t *logits, const int32_t *targets,   \
       size_t V, float dscale),                                                            \
      (losses, dlogits, logits, targets, V, dscale))                                      \
    /* rows of (N,C): out = log_softmax(inp) (may alias); n = N */                          \
    X(log_softmax_forward, ROW_BLOCK, dp_log_softmax_forward_item,                         \
      (float *out, const float *inp, size_t C), (out, inp, C))                             \
    /* dinp(N,C) = dout - softmax * row sums of dout (dinp may alias dout); n = N */        \
    X(log_softmax_backward, ROW_BLOCK, dp_log_softmax_backward_item,                       \
      (float *dinp, const float *out, const float *dout, size_t C), (dinp, out, dout, C))  \
    /* x(N,C): rows whose per targets are all ignored set to 0 (kernels/ignored.h); n = N */ \
    X(zero_ignored_rows, ROW_BLOCK, dp_zero_ignored_rows_item,                             \
      (float *x, const void *targets, int f32, size_t per, size_t cols),                   \
      (x, targets, f32, per, cols))                                                        \
    /* ... for a bfloat16 x(N,C) */                                                        \
    X(zero_ignored_rows_bf16, ROW_BLOCK, dp_zero_ignored_rows_bf16_item,                   \
      (uint16_t *x, const void *targets, int f32, size_t per, size_t cols),                \
      (x, targets, f32, per, cols))                                                        \
    /* fused causal attention (kernels/flash.h); item r = (b*NH + h)*T + t, n = B*NH*T:    \
     * out(B,T,C) row (float32 or bfloat16) and lse(B,NH,T) of query r from                \
     * qkv(B,T,3C), read in place */                                                       \
    X(attention_fused_forward, TILED, dp_flash_forward_item,                               \
      (dp_pout out, float *lse, dp_pref qkv, size_t B, size_t T, size_t NH, size_t hs,     \
       float scale),                                                                       \
      (out, lse, qkv, B, T, NH, hs, scale))                                               \
    /* delta(B,NH,T) = dout . out per head row (each float32 or bfloat16) */             \
    X(attention_fused_delta, TILED, dp_flash_delta_item,                                  \
      (float *delta, dp_pref dout, dp_pref out, size_t T, size_t NH, size_t hs),           \
      (delta, dout, out, T, NH, hs))                                                       \
    /* dqkv(B,T,3C) (float32 or bfloat16): dq of query row r (query-major) */              \
    X(attention_fused_dq, TILED, dp_flash_dq_item,                                         \
      (dp_pout dqkv, dp_pref dout, dp_pref qkv, const float *lse,                          \
       const float *delta, size_t B, size_t T, size_t NH, size_t hs, float scale),         \
      (dqkv, dout, qkv, lse, delta, B, T, NH, hs, scale))                                 \
    /* dqkv(B,T,3C): dk and dv of key row r (the key-major pass) */                        \
    X(attention_fused_dkdv, TILED, dp_flash_dkdv_item,                                     \
      (dp_pout dqkv, dp_pref dout, dp_pref qkv, const float *lse,                          \
       const float *delta, size_t B, size_t T, size_t NH, size_t hs, float scale),         \
      (dqkv, dout, qkv, lse, delta, B, T, NH, hs, scale))                                 \
    /* x[r * ld + c0 + c] = value for the rows * cols items (kernels/elementwise.h); the    \
     * padded vocabulary's logit columns set to -inf */                                   \
    X(fill_columns, ELEM, dp_fill_columns_elem,                                            \
      (float *x, size_t ld, size_t c0, size_t cols, float value), (x, ld, c0, cols, value))\
    /* ... for a bfloat16 x, value rounded to bfloat16 */                                  \
    X(fill_columns_bf16, ELEM, dp_fill_columns_bf16_elem,                                  \
      (uint16_t *x, size_t ld, size_t c0, size_t cols, float value),                       \
      (x, ld, c0, cols, value))                                                            \
    /* layernorm_forward with out(N,C) rounded to bfloat16 once; mean, rstd float32; n = N */ \
    X(layernorm_forward_bf16_out, ROW_BLOCK, dp_layernorm_forward_bf16_out_item,           \
      (uint16_t *out, float *mean, float *rstd, const float *inp, dp_pref weight,          \
       dp_pref bias, size_t C, float eps),                                                 \
      (out, mean, rstd, inp, weight, bias, C, eps))                                        \
    /* x(N,C) += add, then its LayerNorm into out16 (bf16) or out (f32): the residual stream's \
     * update fused with the next LayerNorm (kernels/layernorm.h); n = N */                  \
    X(residual_layernorm_forward, ROW_BLOCK, dp_residual_layernorm_item,                     \
      (float *out, uint16_t *out16, float *mean, float *rstd, float *x, const float *add,   \
       dp_pref weight, dp_pref bias, size_t C, float eps),                                   \
      (out, out16, mean, rstd, x, add, weight, bias, C, eps))

#endif /* DP_KERNELS_OPS_H */
