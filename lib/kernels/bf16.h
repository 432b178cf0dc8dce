/*
 * kernels/bf16.h - bfloat16 conversions and typed parameter reads, shared
 * by both backends (DP_HD).
 *
 * bfloat16 is the upper half of a float32: sign, the same 8-bit exponent,
 * 7 stored mantissa bits. Widening is exact (append 16 zero bits).
 * Narrowing rounds to nearest, ties to even, on the bits: the rounding of
 * PyTorch's float -> bfloat16 cast, CUDA's __float2bfloat16_rn and Intel's
 * VCVTNEPS2BF16; finite values past the largest bfloat16 round to +-Inf,
 * subnormals stay subnormal, and a NaN stays a NaN (made quiet, its sign
 * kept) rather than rounding into the infinity next to it. Both backends
 * round with this one function, so a bf16 copy made on a GPU equals the
 * one made on the CPU bit for bit.
 */
#ifndef DP_KERNELS_BF16_H
#define DP_KERNELS_BF16_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/dp_hd.h"

static inline DP_HD uint32_t dp_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline DP_HD float dp_f32_of_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* float32 -> bfloat16 bits, round to nearest even (see the file comment). */
static inline DP_HD uint16_t dp_bf16_round(float f)
{
    uint32_t u = dp_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* bfloat16 bits -> float32, exact. */
static inline DP_HD float dp_bf16_widen(uint16_t h) { return dp_f32_of_bits((uint32_t)h << 16); }

/* dst[i] = bf16(src[i]). */
static inline DP_HD void dp_cast_f32_bf16_elem(uint16_t *dst, const float *src, size_t i)
{
    dst[i] = dp_bf16_round(src[i]);
}

/* dst[i] = float(src[i]). */
static inline DP_HD void dp_cast_bf16_f32_elem(float *dst, const uint16_t *src, size_t i)
{
    dst[i] = dp_bf16_widen(src[i]);
}

/* dst[i] = float(bf16(src[i])): src's values as bfloat16 holds them
 * (dst may alias src). */
static inline DP_HD void dp_round_bf16_elem(float *dst, const float *src, size_t i)
{
    dst[i] = dp_bf16_widen(dp_bf16_round(src[i]));
}

/*
 * A block of a column-major operand read densely: matrices of rows x cols
 * elements from element off, leading dimension ld, matrices stride
 * apart. Item i of the dense copy (ld = rows, matrices rows x cols apart)
 * reads element dp_block_src(b, i). A GEMM converting its operands in
 * pieces (backend/gemm_pieces.h) converts such blocks.
 */
typedef struct dp_block {
    size_t off, ld, stride, rows, cols;
} dp_block;

static inline DP_HD size_t dp_block_src(dp_block b, size_t i)
{
    size_t per = b.rows * b.cols, mat = i / per, r = i - mat * per, col = r / b.rows;
    return b.off + mat * b.stride + col * b.ld + (r - col * b.rows);
}

/* dst[i] = bf16 of the block's item i. */
static inline DP_HD void dp_pack_f32_bf16_elem(uint16_t *dst, const float *src, dp_block b,
                                               size_t i)
{
    dst[i] = dp_bf16_round(src[dp_block_src(b, i)]);
}

/* dst[i] = float of the block's item i (exact). */
static inline DP_HD void dp_pack_bf16_f32_elem(float *dst, const uint16_t *src, dp_block b,
                                               size_t i)
{
    dst[i] = dp_bf16_widen(src[dp_block_src(b, i)]);
}

/*
 * A parameter tensor as a kernel reads it: float32 elements, or bfloat16
 * ones (a replica in bf16 precision). Kernels that read parameters take a
 * dp_pref and read element i with dp_pref_at, widened to float32, so one
 * kernel serves both precisions and computes the same float32 arithmetic
 * on the same (widened) values: a layer over bf16 parameters gives the
 * bits of the float32 layer over their widened copy.
 */
typedef struct dp_pref {
    const void *p;
    int bf16; /* 0: p holds floats; 1: bfloat16 bits (uint16_t) */
} dp_pref;

static inline DP_HD dp_pref dp_pref_f32(const float *p)
{
    dp_pref r;
    r.p = p;
    r.bf16 = 0;
    return r;
}

static inline DP_HD dp_pref dp_pref_bf16(const uint16_t *p)
{
    dp_pref r;
    r.p = p;
    r.bf16 = 1;
    return r;
}

static inline DP_HD float dp_pref_at(dp_pref r, size_t i)
{
    return r.bf16 ? dp_bf16_widen(((const uint16_t *)r.p)[i]) : ((const float *)r.p)[i];
}

/* r from its element off on (a row of a tensor of either type). */
static inline DP_HD dp_pref dp_pref_offset(dp_pref r, size_t off)
{
    return r.bf16 ? dp_pref_bf16((const uint16_t *)r.p + off)
                  : dp_pref_f32((const float *)r.p + off);
}

/* An output tensor of float32 or bfloat16 elements, the store side of
 * dp_pref: a kernel computes in float32 and dp_pout_set stores element i
 * as it is, or rounded once (dp_bf16_round), so the bfloat16 output is the
 * float32 one rounded, bit for bit. */
typedef struct dp_pout {
    void *p;
    int bf16; /* 0: p holds floats; 1: bfloat16 bits (uint16_t) */
} dp_pout;

static inline DP_HD dp_pout dp_pout_f32(float *p)
{
    dp_pout r;
    r.p = p;
    r.bf16 = 0;
    return r;
}

static inline DP_HD dp_pout dp_pout_bf16(uint16_t *p)
{
    dp_pout r;
    r.p = p;
    r.bf16 = 1;
    return r;
}

static inline DP_HD void dp_pout_set(dp_pout o, size_t i, float v)
{
    if (o.bf16)
        ((uint16_t *)o.p)[i] = dp_bf16_round(v);
    else
        ((float *)o.p)[i] = v;
}

#endif /* DP_KERNELS_BF16_H */
