/*
 * kernels/expf.h - dp_expf, an exp(x) the CPU compiler can vectorise.
 *
 * glibc's expf is an out-of-line call, so a loop over it stays scalar; in
 * GELU that call was about a quarter of a GPT training step on the CPU.
 * dp_expf is branch-free float arithmetic (selects, no calls, no
 * float->int conversion), so GCC turns element loops into SIMD code.
 *
 * Method (Cody & Waite 1980; Muller, "Elementary Functions", ch. 11):
 *   n = round(x / ln 2), r = x - n ln 2 (ln 2 split into a high part exact
 *   in float and a low correction), exp(x) = 2^n * P(r), |r| <= ln(2)/2,
 *   P the degree-7 Taylor polynomial of exp (truncation < 6e-9 relative).
 *   Rounding uses the 1.5 * 2^23 shifter, whose low mantissa bits then hold
 *   n; 2^n is assembled in the exponent field, as 2^(n-1) * 2 so that
 *   n = 128 (x up to ln FLT_MAX) does not overflow the field.
 * Accuracy: within 2 ulp of the correctly rounded result for
 *   -86.64 <= x <= 88.72 (tests/test_gelu.c checks it against exp in double).
 * Edges: x > ln(FLT_MAX) gives +inf, x < -86.64 (results below 2^-125,
 *   near FLT_MIN) gives +0 instead of a subnormal, NaN gives NaN.
 * On the GPU the hardware expf is already fast, so device code uses it.
 */
#ifndef DP_KERNELS_EXPF_H
#define DP_KERNELS_EXPF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/dp_hd.h"

#define DP_EXPF_HI 88.72283172607421875f /* largest float x with exp(x) <= FLT_MAX */
#define DP_EXPF_LO -86.64f            /* keeps n >= -125: 2^(n-1) stays normal */

static inline DP_HD float dp_expf(float x)
{
#if defined(__CUDA_ARCH__)
    return expf(x);
#else
    const float log2e = 1.44269504088896341f;
    const float ln2_hi = 0.693145751953125f; /* 11 significant bits: n * ln2_hi is exact */
    const float ln2_lo = 1.428606765330187e-06f;
    const float shifter = 12582912.0f; /* 1.5 * 2^23 */
    float xc = x < DP_EXPF_LO ? DP_EXPF_LO : x;
    xc = xc > DP_EXPF_HI ? DP_EXPF_HI : xc; /* NaN passes through both */
    float t = xc * log2e + shifter;
    float n = t - shifter; /* round(xc / ln 2) as a float */
    uint32_t tb;
    memcpy(&tb, &t, sizeof tb);
    uint32_t nbits = tb - 0x4B400000u; /* n as a two's-complement int32 */
    float r = (xc - n * ln2_hi) - n * ln2_lo;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    uint32_t sb = (nbits + 126u) << 23; /* 2^(n-1) */
    float s;
    memcpy(&s, &sb, sizeof s);
    float y = p * s * 2.0f;
    y = x > DP_EXPF_HI ? INFINITY : y;
    y = x < DP_EXPF_LO ? 0.0f : y;
    return y;
#endif
}

#endif /* DP_KERNELS_EXPF_H */
