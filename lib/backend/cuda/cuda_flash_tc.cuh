/*
 * backend/cuda/cuda_flash_tc.cuh - the fused causal attention on tensor
 * cores: FlashAttention-2 (Dao 2023) for head size 64 with bfloat16 q, k,
 * v (qkv in bf16, what the GPT's bf16 activations give, read in place
 * in c_attn's (B,T,3C) output), on the
 * m16n8k16 bfloat16 MMA with float32 accumulation (sm_80 and later;
 * cuda_mma.cuh). The same three passes as the float32 kernels of
 * cuda_flash.cu and the same math as kernels/flash.h, regrouped by tiles:
 *
 *   forward  a block per (pair, 64 query rows), a warp per 16 of them;
 *            for each tile of 64 keys up to the diagonal: S = Q K^T,
 *            then the online softmax per row once per tile (the running
 *            maximum m and sum l, FlashAttention-2's rescale of the
 *            accumulator by exp(m_old - m_new)), then O += P V with P
 *            rounded to bfloat16; finally out = O / l, lse = m + log l.
 *   dq       the same blocks; per key tile: S = Q K^T, dP = dO V^T,
 *            P = exp(scale S - lse), dS = P (dP - D) rounded to bfloat16,
 *            dQ += dS K; dq = scale dQ.
 *   dk, dv   a block per (pair, 64 key rows), a warp per 16 of them; per
 *            query tile from the diagonal on: S^T = K Q^T, P^T,
 *            dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - D),
 *            dK += dS^T Q; dk = scale dK.
 *
 * Registers, not shared memory, hold a warp's work (FlashAttention-2's
 * layout): its Q (or K and V) rows as A fragments, loaded once; a tile's
 * scores as eight 16x8 accumulators, so each row's 64 scores sit in the
 * four lanes of a quad (two rows per lane), its maximum and sum one
 * shuffle pair away; the probabilities, rounded, are the next product's
 * A fragments as they lie (an accumulator pair's layout is an A
 * fragment's); O (dQ, dK, dV) accumulates in eight more accumulators and
 * is rescaled in place. Shared memory holds only the 64-row tiles the
 * block's warps share (K and V, or Q and dO, with lse and D), read by
 * ldmatrix (.trans where the tile is the product's B as stored), two of
 * each: the next step's tiles are copied by cp.async (global to shared
 * memory, no registers) while the block computes on this step's, and a
 * barrier at each step's end keeps a buffer until every warp is done.
 * A first version on WMMA tiles stored every S, P and partial O to shared
 * memory: on an H200 it issued ~28 instructions per tensor core
 * instruction and ran at ~55 TFLOP/s.
 *
 * Precision: q, k, v are bfloat16 already; P, dS and dO are rounded to
 * bfloat16 for the products (as FlashAttention-2 and the chunked
 * attention's bf16 GEMMs do: cvt.rn.bf16x2, dp_bf16_round's bits); every
 * sum, the softmax state, l, lse and D stay float32. The softmax runs in
 * base 2 as FlashAttention-2's does: the scores scaled by scale log2(e)
 * once, each probability one fma and one ex2.approx (a few ulp, far
 * below the bfloat16 rounding that follows), lse stored in natural
 * units; a first version spent most of its issue slots on expf and on
 * rounding bit by bit, more than on the MMAs. So against the float32 kernels each output moves by at
 * most a few bfloat16 roundings (2^-9 relative) of its terms' magnitudes:
 * tests/flash_tc_bound.h derives the bound the tests hold them to.
 *
 * Determinism: each output element is written once by one lane; the key
 * (or query) tiles are visited in ascending order, a row's partial sums
 * meet in a fixed shuffle tree and each product's accumulation order is
 * fixed by the hardware for a given shape; no atomics. The same inputs
 * give the same bits.
 *
 * This header is device code only. cuda_flash.cu includes it under nvcc;
 * tests/test_flash_tc_emu.cpp compiles it with g++ against
 * tests/cuda_emu.hpp, which emulates the CUDA subset used here (threads,
 * barriers, shuffles, mma.sync and ldmatrix as warp collectives over the
 * ISA's layouts), so the kernels' logic is tested on machines without a
 * GPU.
 */
#ifndef DP_CUDA_FLASH_TC_CUH
#define DP_CUDA_FLASH_TC_CUH

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/bf16.h"
#include "kernels/flash.h"

#if defined(__CUDACC__)
#include "backend/cuda/cuda_mma.cuh"

/* The block's dynamic shared memory (the launch's third parameter). */
__device__ __forceinline__ unsigned char *tc_shared()
{
    extern __shared__ __align__(128) unsigned char dp_tc_smem[];
    return dp_tc_smem;
}
#endif

/* The MMA's bfloat16 shape exists from sm_80 on: under nvcc the helpers
 * and the kernels' bodies compile only in the device passes for those
 * targets (the launcher never picks these kernels elsewhere; nvcc's host
 * pass sees empty kernels). The emulator (g++, no nvcc) takes them all. */
#if (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800) || !defined(__CUDACC__)
#define DP_TC_BODY 1
#else
#define DP_TC_BODY 0
#endif

namespace dp_tc {

const unsigned HS = 64;       /* head size: every GPT-2 size has 64 */
const unsigned BR = 64;       /* rows per block (queries, or keys for dk/dv) */
const unsigned BC = 64;       /* columns per tile (keys, or queries) */
const unsigned WARPS = 4;     /* 16 rows each */
const unsigned THREADS = WARPS * 32;
/* bf16 tile row stride: 144 bytes, so a row is 16-byte aligned (ldmatrix)
 * and eight rows' 16-byte pieces fall in eight distinct 4-bank groups */
const unsigned LDH = HS + 8;

/* float32 staging tile row stride (dO as copied, before its rounding):
 * 272 bytes, 16-byte aligned rows */
const unsigned LDF = HS + 4;

/* Shared memory, offsets in bytes, each a multiple of 128. The next tile
 * is copied (cp.async) while the block computes on this one, so tiles come
 * in pairs of buffers:
 *   forward, dq  K[2], V[2]: four bf16 tiles (Q, and dO for dq, pass
 *                through the first two once, for their fragments);
 *   dk, dv       Q[2] bf16; dO[2] float32 as copied; dO rounded to bf16
 *                (one tile: rounded at each step); lse[2] and D[2] rows
 *                of 64 floats (K and V pass through Q[2] once). */
const size_t TILE_H = (size_t)BR * LDH * 2;  /* 9216 */
const size_t TILE_F = (size_t)BR * LDF * 4;  /* 17408 */
const size_t ROW_F = (size_t)BC * 4;         /* 256 */
const size_t SMEM_QUERY = 4 * TILE_H;        /* 36864: forward, dq */
const size_t OFF_KEY_F = 2 * TILE_H;
const size_t OFF_KEY_H = OFF_KEY_F + 2 * TILE_F;
const size_t OFF_KEY_ROWS = OFF_KEY_H + TILE_H;
const size_t SMEM_KEY = OFF_KEY_ROWS + 4 * ROW_F; /* 63488: dk, dv */
static_assert(THREADS == 2 * BC, "dk/dv: a thread copies one lse or D and scales its own lse");
static_assert(TILE_H <= TILE_F, "dk/dv: a bfloat16 dO tile fits in its float32 buffer");

#if DP_TC_BODY

/* The forward's and dq's buffers: K[b] (which 0) and V[b] (1) of step b % 2. */
__device__ __forceinline__ uint16_t *kv_tile(unsigned char *s, unsigned which, unsigned b)
{
    return (uint16_t *)(s + (2 * b + which) * TILE_H);
}

/* dk/dv's: Q[b], dO[b] as copied, dO rounded, lse[b] and D[b]. */
__device__ __forceinline__ uint16_t *key_q(unsigned char *s, unsigned b)
{
    return (uint16_t *)(s + b * TILE_H);
}
__device__ __forceinline__ float *key_f(unsigned char *s, unsigned b)
{
    return (float *)(s + OFF_KEY_F + b * TILE_F);
}
__device__ __forceinline__ uint16_t *key_h(unsigned char *s) { return (uint16_t *)(s + OFF_KEY_H); }
/* dO[b] when it comes as bfloat16: a (64, LDH) tile in dO[b]'s float32
 * buffer (TILE_H <= TILE_F), used as copied. */
__device__ __forceinline__ uint16_t *key_g16(unsigned char *s, unsigned b)
{
    return (uint16_t *)key_f(s, b);
}
__device__ __forceinline__ float *key_lse(unsigned char *s, unsigned b)
{
    return (float *)(s + OFF_KEY_ROWS + b * ROW_F);
}
__device__ __forceinline__ float *key_d(unsigned char *s, unsigned b)
{
    return (float *)(s + OFF_KEY_ROWS + (2 + b) * ROW_F);
}

/* Rows [first, first + 64) of bfloat16 rows `stride` elements apart (a
 * head's q, k or v rows in qkv(B,T,3C): 3C; dO in (B,T,C): C) into a
 * (64, LDH) tile, zeros past T: the whole block, 8 bytes per thread and
 * step. */
__device__ __forceinline__ void load_bf16_rows(uint16_t *tile, const uint16_t *src, unsigned stride,
                                               size_t first, size_t T)
{
    for (unsigned e = threadIdx.x; e < BR * HS / 4; e += THREADS) {
        unsigned r = e / (HS / 4), c = e % (HS / 4) * 4;
        uint2 w = make_uint2(0u, 0u);
        if (first + r < T) w = *(const uint2 *)(src + (first + r) * stride + c);
        *(uint2 *)(tile + r * LDH + c) = w;
    }
}

/* Rows [first, first + 64) of a head's float32 rows `stride` floats apart
 * (dO in (B,T,C)) into a bfloat16 tile, rounded, zeros past T. */
__device__ __forceinline__ void load_f32_rows(uint16_t *tile, const float *src, size_t stride,
                                              size_t first, size_t T)
{
    for (unsigned e = threadIdx.x; e < BR * HS / 4; e += THREADS) {
        unsigned r = e / (HS / 4), c = e % (HS / 4) * 4;
        float4 f = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (first + r < T) f = *(const float4 *)(src + (first + r) * stride + c);
        *(uint2 *)(tile + r * LDH + c) = make_uint2(dp_cvt_bf16x2(f.x, f.y), dp_cvt_bf16x2(f.z, f.w));
    }
}

/* load_bf16_rows by cp.async: 16-byte pieces, each thread its own; the
 * bytes land at the thread's next dp_cp_async_wait that retires them. */
__device__ __forceinline__ void async_bf16_rows(uint16_t *tile, const uint16_t *src,
                                                unsigned stride, size_t first, size_t T)
{
    for (unsigned e = threadIdx.x; e < BR * HS / 8; e += THREADS) {
        const unsigned r = e / (HS / 8), c = e % (HS / 8) * 8;
        const bool live = first + r < T;
        dp_cp_async16(tile + r * LDH + c, live ? src + (first + r) * stride + c : src, live);
    }
}

/* Rows [first, first + 64) of float32 rows `stride` floats apart into a
 * (64, LDF) float32 tile by cp.async, zeros past T. */
__device__ __forceinline__ void async_f32_rows(float *tile, const float *src, size_t stride,
                                               size_t first, size_t T)
{
    for (unsigned e = threadIdx.x; e < BR * HS / 4; e += THREADS) {
        const unsigned r = e / (HS / 4), c = e % (HS / 4) * 4;
        const bool live = first + r < T;
        dp_cp_async16(tile + r * LDF + c, live ? src + (first + r) * stride + c : src, live);
    }
}

/* The pieces of a float32 tile this thread copied (async_f32_rows's),
 * rounded into a bf16 tile: its own copies are visible to it after its
 * wait, so no barrier comes between. */
__device__ __forceinline__ void round_own_rows(uint16_t *dst, const float *tile)
{
    for (unsigned e = threadIdx.x; e < BR * HS / 4; e += THREADS) {
        const unsigned r = e / (HS / 4), c = e % (HS / 4) * 4;
        const float4 f = *(const float4 *)(tile + r * LDF + c);
        *(uint2 *)(dst + r * LDH + c) = make_uint2(dp_cvt_bf16x2(f.x, f.y), dp_cvt_bf16x2(f.z, f.w));
    }
}

/* dk/dv's copies for the query tile from i0 into buffer b, one group:
 * Q, dO as float32 (rounded after the wait, round_own_rows) or, when it
 * is bfloat16 already, as it is into the same buffer as a bfloat16 tile
 * (key_g16), and lse and D of its rows (thread e < 64 copies lse[e],
 * thread 64 + e D[e]: 4 bytes each, since a head's rows need not be
 * 16-byte aligned); zeros past T. */
__device__ __forceinline__ void key_step_issue(unsigned char *sm, unsigned b, const uint16_t *q,
                                               dp_pref g, size_t C, const float *lse,
                                               const float *delta, size_t r0, size_t i0,
                                               size_t T)
{
    async_bf16_rows(key_q(sm, b), q, 3 * C, i0, T);
    if (g.bf16)
        async_bf16_rows(key_g16(sm, b), (const uint16_t *)g.p, C, i0, T);
    else
        async_f32_rows(key_f(sm, b), (const float *)g.p, C, i0, T);
    for (unsigned e = threadIdx.x; e < 2 * BC; e += THREADS) {
        const unsigned c = e % BC;
        const bool live = i0 + c < T;
        const float *src = (e < BC ? lse : delta) + r0 + (live ? i0 + c : 0);
        dp_cp_async4((e < BC ? key_lse(sm, b) : key_d(sm, b)) + c, src, live);
    }
    dp_cp_async_commit();
}

/* The forward's and dq's copies of K and V of the key tile from row j0
 * into buffer b, one group. In qkv(B,T,3C) a head's v rows are its k rows
 * plus C, and rows are 3C apart: one pointer and C are all the loop keeps
 * (a second pointer and the stride cost the forward spills at its 128
 * registers). */
__device__ __forceinline__ void kv_issue(unsigned char *sm, const uint16_t *k, unsigned C,
                                         unsigned b, size_t j0, size_t T)
{
    async_bf16_rows(kv_tile(sm, 0, b), k, 3 * C, j0, T);
    async_bf16_rows(kv_tile(sm, 1, b), k + C, 3 * C, j0, T);
    dp_cp_async_commit();
}

/* Their step on the key tile from row j0 in buffer b: the next tile's
 * copies issued into the other buffer (if `more`), then the wait for this
 * tile's and the barrier that makes it the whole block's. */
__device__ __forceinline__ void kv_step(unsigned char *sm, const uint16_t *k, unsigned C,
                                        unsigned b, size_t j0, bool more, size_t T)
{
    if (more) {
        kv_issue(sm, k, C, 1 - b, j0 + BC, T);
        dp_cp_async_wait<1>();
    } else {
        dp_cp_async_wait<0>();
    }
    __syncthreads();
}

/* Part `part` (0 q, 1 k, 2 v) of the head whose rows start at row r0
 * (a pair's first) of qkv(B, T, 3 NH 64): its rows are 3C apart. */
__device__ __forceinline__ const uint16_t *head_rows(const uint16_t *qkv, unsigned part,
                                                    size_t r0, size_t NH, size_t T)
{
    return qkv + dp_flash_qkv_row(part, r0, T, NH, HS);
}

__device__ __forceinline__ unsigned lane_id() { return threadIdx.x % 32; }
/* The lane's quad (its rows g and g + 8 of the warp's 16) and its place
 * in the quad (columns 2t, 2t + 1 of each 8-wide accumulator). */
__device__ __forceinline__ unsigned lane_quad() { return lane_id() / 4; }
__device__ __forceinline__ unsigned lane_in_quad() { return lane_id() % 4; }

/* Accumulator element e's row (0 or 8 past g) and column (in its 8). */
__device__ __forceinline__ unsigned acc_row(unsigned e) { return lane_quad() + (e / 2) * 8; }
__device__ __forceinline__ unsigned acc_col(unsigned e) { return 2 * lane_in_quad() + e % 2; }

/* A warp's 16 rows (from row0) of a (64, LDH) tile as four A fragments
 * (16 x 64: k chunks of 16). */
__device__ __forceinline__ void load_rows_a(uint32_t f[4][4], const uint16_t *tile, unsigned row0)
{
    const unsigned l = lane_id();
    const uint16_t *p = tile + (row0 + (l / 8 % 2) * 8 + l % 8) * LDH + (l / 16) * 8;
    DP_UNROLL
    for (unsigned kc = 0; kc < 4; kc++) dp_ldmatrix_x4(f[kc], p + kc * 16);
}

/* s(16 x 64, eight 16x8 accumulators) = a(16 x 64) . tile^T: the warp's
 * rows against every row of the tile (S = Q K^T and its kin); the tile
 * as stored is B's columns, so plain ldmatrix. */
__device__ __forceinline__ void rows_dot_tile(float s[8][4], const uint32_t a[4][4],
                                              const uint16_t *tile)
{
    const unsigned l = lane_id();
    const uint16_t *p = tile + ((l / 16) * 8 + l % 8) * LDH + (l / 8 % 2) * 8;
    DP_UNROLL
    for (unsigned n = 0; n < 8; n++)
        DP_UNROLL
        for (unsigned e = 0; e < 4; e++) s[n][e] = 0.0f;
    DP_UNROLL
    for (unsigned np = 0; np < 4; np++)     /* tile rows 16np .. 16np + 15 */
        DP_UNROLL
        for (unsigned kc = 0; kc < 4; kc++) { /* dimensions 16kc .. */
            uint32_t b[4];
            dp_ldmatrix_x4(b, p + np * 16 * LDH + kc * 16);
            dp_mma_bf16_16816(s[2 * np], a[kc], b);
            dp_mma_bf16_16816(s[2 * np + 1], a[kc], b + 2);
        }
}

/* The bf16 A fragments of a (16 x 64) float accumulator set, rounded:
 * accumulators 2kc and 2kc + 1 are k chunk kc's left and right halves. */
__device__ __forceinline__ void acc_to_a(uint32_t a[4][4], const float s[8][4])
{
    DP_UNROLL
    for (unsigned kc = 0; kc < 4; kc++) {
        a[kc][0] = dp_cvt_bf16x2(s[2 * kc][0], s[2 * kc][1]);
        a[kc][1] = dp_cvt_bf16x2(s[2 * kc][2], s[2 * kc][3]);
        a[kc][2] = dp_cvt_bf16x2(s[2 * kc + 1][0], s[2 * kc + 1][1]);
        a[kc][3] = dp_cvt_bf16x2(s[2 * kc + 1][2], s[2 * kc + 1][3]);
    }
}

/* log2(e) and ln(2): the softmax runs in base 2 (one dp_ex2 a score), with
 * the scores scaled by scale * log2(e) and lse kept in natural units. */
const float LOG2E = 1.44269504088896341f, LN2 = 0.693147180559945309f;

/* p = exp(scale s - lse) = 2^(s sl2 - lse2), with sl2 = scale log2(e)
 * and lse2 = lse log2(e): one fma and one dp_ex2. */
__device__ __forceinline__ float prob2(float s, float sl2, float lse2)
{
    return dp_ex2(fmaf(s, sl2, -lse2));
}

/* acc(16 x 64) += w(16 x 64, bf16 A fragments) . tile(64 x 64): the
 * warp's weights over the tile's rows (O += P V, dQ += dS K,
 * dV += P^T dO, dK += dS^T Q); the tile is B as stored (k = its rows),
 * so ldmatrix.trans. */
__device__ __forceinline__ void weights_times_tile(float acc[8][4], const uint32_t w[4][4],
                                                   const uint16_t *tile)
{
    const unsigned l = lane_id();
    const uint16_t *p = tile + ((l / 8 % 2) * 8 + l % 8) * LDH + (l / 16) * 8;
    DP_UNROLL
    for (unsigned kc = 0; kc < 4; kc++)     /* tile rows 16kc .. */
        DP_UNROLL
        for (unsigned dp = 0; dp < 4; dp++) { /* columns 16dp .. */
            uint32_t b[4];
            dp_ldmatrix_x4_trans(b, p + kc * 16 * LDH + dp * 16);
            dp_mma_bf16_16816(acc[2 * dp], w[kc], b);
            dp_mma_bf16_16816(acc[2 * dp + 1], w[kc], b + 2);
        }
}

/* A row's value over its quad: the four lanes' partials added in a fixed
 * tree (xor 1, then 2), the same bits in all four. */
__device__ __forceinline__ float quad_sum(float v)
{
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ __forceinline__ float quad_max(float v)
{
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

/* Two adjacent outputs in one store: a float pair, or a bfloat16 pair in
 * 32 bits, each value rounded once (dp_bf16_round's bits: the float32
 * store's values rounded). */
__device__ __forceinline__ void store_pair(float *p, float lo, float hi)
{
    *(float2 *)p = make_float2(lo, hi);
}
__device__ __forceinline__ void store_pair(uint16_t *p, float lo, float hi)
{
    *(uint32_t *)p = (uint32_t)dp_bf16_round(lo) | (uint32_t)dp_bf16_round(hi) << 16;
}

/* Writes a (16 x 64) accumulator set, times mul, to the rows of dst
 * (row r of the warp's 16 at dst + r * stride; float32 or bfloat16) that
 * are live. */
template <typename T>
__device__ __forceinline__ void write_acc(T *dst, size_t stride, const float acc[8][4],
                                          bool live_g, bool live_g8, float mul)
{
    DP_UNROLL
    for (unsigned n = 0; n < 8; n++)
        DP_UNROLL
        for (unsigned h = 0; h < 2; h++) {
            if (!(h ? live_g8 : live_g)) continue;
            store_pair(dst + (lane_quad() + 8 * h) * stride + n * 8 + 2 * lane_in_quad(),
                       acc[n][2 * h] * mul, acc[n][2 * h + 1] * mul);
        }
}

/* write_acc at element `at` of o, float32 or bfloat16. */
__device__ __forceinline__ void write_acc_at(dp_pout o, size_t at, size_t stride,
                                             const float acc[8][4], bool live_g, bool live_g8,
                                             float mul)
{
    if (o.bf16)
        write_acc((uint16_t *)o.p + at, stride, acc, live_g, live_g8, mul);
    else
        write_acc((float *)o.p + at, stride, acc, live_g, live_g8, mul);
}

#endif /* DP_TC_BODY */
} // namespace dp_tc

// --- forward --------------------------------------------------------------------------------
/* Blocks an SM (__launch_bounds__' second argument): the forward fits 128
 * registers with no spill, so four blocks (sixteen warps) share an SM
 * instead of three; dk/dv fits 168 with 32 bytes spilled, three blocks
 * instead of two. Each block's tile loads are synchronous, so more
 * resident warps are what hides them. (ptxas, sm_90.) */

/* out(B,T,C) (float32 or bfloat16) and lse(B,NH,T) from qkv(B,T,3C)
 * bfloat16 bits, head size 64; a block per (pair, query tile), last tiles first. */
__global__ void __launch_bounds__(dp_tc::THREADS, 4)
    k_flash_tc_forward(dp_pout out, float *lse, const uint16_t *qkv, size_t B, size_t T,
                       size_t NH, float scale, size_t ntiles)
{
#if DP_TC_BODY
    using namespace dp_tc;
    const size_t BNH = B * NH, tile = ntiles - 1 - blockIdx.x / BNH, pair = blockIdx.x % BNH;
    const unsigned warp = threadIdx.x / 32;
    unsigned char *const sm = tc_shared();
    const size_t r0 = pair * T, i0 = tile * BR, iw = i0 + warp * 16;
    const unsigned C = (unsigned)(NH * HS); /* q, k, v rows are 3C apart */
    /* the lane's first row within the block: on the diagonal tile (j0 =
     * i0, BC = BR) key j0 + c is masked for it where c > drow (+ 8 for its
     * second row); 32-bit, so the loop keeps no 64-bit row indices */
    const unsigned drow = warp * 16 + lane_quad();
    const uint16_t *q = head_rows(qkv, 0, r0, NH, T), *k = head_rows(qkv, 1, r0, NH, T);

    uint32_t qf[4][4];
    load_bf16_rows(kv_tile(sm, 0, 0), q, 3 * C, i0, T);
    __syncthreads();
    load_rows_a(qf, kv_tile(sm, 0, 0), warp * 16);
    __syncthreads(); /* every warp has its Q before K(0) lands over it */
    kv_issue(sm, k, C, 0, 0, T);

    /* m: the running maximum of the scores in base-2 units (s sl2) */
    const float sl2 = scale * LOG2E;
    float o[8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    DP_UNROLL
    for (unsigned n = 0; n < 8; n++)
        DP_UNROLL
        for (unsigned e = 0; e < 4; e++) o[n][e] = 0.0f;
    for (size_t kt = 0; kt <= tile; kt++) {
        const size_t j0 = kt * BC;
        const unsigned b = kt % 2;
        kv_step(sm, k, C, b, j0, kt < tile, T); /* the next tile's copies out, this one's in */
        const uint16_t *kt_s = kv_tile(sm, 0, b), *vt_s = kv_tile(sm, 1, b);
        float s[8][4];
        rows_dot_tile(s, qf, kt_s);
        /* the online softmax of rows g and g + 8 over this tile's keys (j > i masked) */
        float mx[2] = {-INFINITY, -INFINITY};
        DP_UNROLL
        for (unsigned n = 0; n < 8; n++)
            DP_UNROLL
            for (unsigned e = 0; e < 4; e++) {
                const bool masked = kt == tile && n * 8 + acc_col(e) > drow + 8 * (e / 2);
                s[n][e] = masked ? -INFINITY : sl2 * s[n][e];
                mx[e / 2] = fmaxf(mx[e / 2], s[n][e]);
            }
        float alpha[2], sum[2] = {0.0f, 0.0f};
        DP_UNROLL
        for (unsigned h = 0; h < 2; h++) {
            /* finite from the first tile on (key 0 is every row's), so
             * -inf - mnew is -inf and 2^-inf is 0 */
            const float mnew = fmaxf(m[h], quad_max(mx[h]));
            alpha[h] = dp_ex2(m[h] - mnew);
            m[h] = mnew;
        }
        DP_UNROLL
        for (unsigned n = 0; n < 8; n++)
            DP_UNROLL
            for (unsigned e = 0; e < 4; e++) {
                const float p = dp_ex2(s[n][e] - m[e / 2]); /* masked: 2^-inf = 0 */
                sum[e / 2] += p;
                s[n][e] = p;
                o[n][e] *= alpha[e / 2];
            }
        DP_UNROLL
        for (unsigned h = 0; h < 2; h++) l[h] = l[h] * alpha[h] + quad_sum(sum[h]);
        uint32_t pf[4][4];
        acc_to_a(pf, s);
        weights_times_tile(o, pf, vt_s);
        __syncthreads(); /* every warp is done with buffer b before it is refilled */
    }
    const size_t row[2] = {iw + lane_quad(), iw + lane_quad() + 8};
    const bool live[2] = {row[0] < T, row[1] < T};
    const size_t at = dp_flash_tok_row(r0 + (live[0] ? iw : 0), T, NH, HS, 1, 0);
    DP_UNROLL
    for (unsigned h = 0; h < 2; h++) {
        const float inv = 1.0f / l[h];
        DP_UNROLL
        for (unsigned n = 0; n < 8; n++) {
            o[n][2 * h] *= inv;
            o[n][2 * h + 1] *= inv;
        }
        if (live[h] && lane_in_quad() == 0) lse[r0 + row[h]] = m[h] * LN2 + logf(l[h]);
    }
    write_acc_at(out, at, C, o, live[0], live[1], 1.0f);
#endif
}

// --- dq: query-major ---------------------------------------------------------------------------

__global__ void __launch_bounds__(dp_tc::THREADS)
    k_flash_tc_dq(dp_pout dqkv, dp_pref dout, const uint16_t *qkv, const float *lse,
                  const float *delta, size_t B, size_t T, size_t NH, float scale, size_t ntiles)
{
#if DP_TC_BODY
    using namespace dp_tc;
    const size_t BNH = B * NH, tile = ntiles - 1 - blockIdx.x / BNH, pair = blockIdx.x % BNH;
    const unsigned warp = threadIdx.x / 32;
    unsigned char *const sm = tc_shared();
    const size_t r0 = pair * T, i0 = tile * BR, iw = i0 + warp * 16, C = NH * HS;
    const unsigned C32 = (unsigned)C; /* q, k, v rows are 3C apart */
    const size_t row[2] = {iw + lane_quad(), iw + lane_quad() + 8};
    const bool live[2] = {row[0] < T, row[1] < T};
    const uint16_t *q = head_rows(qkv, 0, r0, NH, T), *k = head_rows(qkv, 1, r0, NH, T);

    uint32_t qf[4][4], gf[4][4];
    load_bf16_rows(kv_tile(sm, 0, 0), q, 3 * C32, i0, T);
    const size_t go = dp_flash_tok_row(r0, T, NH, HS, 1, 0);
    if (dout.bf16)
        load_bf16_rows(kv_tile(sm, 1, 0), (const uint16_t *)dout.p + go, C, i0, T);
    else
        load_f32_rows(kv_tile(sm, 1, 0), (const float *)dout.p + go, C, i0, T);
    __syncthreads();
    load_rows_a(qf, kv_tile(sm, 0, 0), warp * 16);
    load_rows_a(gf, kv_tile(sm, 1, 0), warp * 16);
    __syncthreads(); /* every warp has its Q and dO before K(0), V(0) land over them */
    kv_issue(sm, k, C32, 0, 0, T);
    const float sl2 = scale * LOG2E;
    float lse2[2], d_r[2];
    DP_UNROLL
    for (unsigned h = 0; h < 2; h++) {
        lse2[h] = live[h] ? lse[r0 + row[h]] * LOG2E : 0.0f;
        d_r[h] = live[h] ? delta[r0 + row[h]] : 0.0f;
    }

    float dq[8][4];
    DP_UNROLL
    for (unsigned n = 0; n < 8; n++)
        DP_UNROLL
        for (unsigned e = 0; e < 4; e++) dq[n][e] = 0.0f;
    for (size_t kt = 0; kt <= tile; kt++) {
        const size_t j0 = kt * BC;
        const unsigned b = kt % 2;
        kv_step(sm, k, C32, b, j0, kt < tile, T);
        const uint16_t *kt_s = kv_tile(sm, 0, b), *vt_s = kv_tile(sm, 1, b);
        float s[8][4], dp[8][4];
        rows_dot_tile(s, qf, kt_s);  /* S */
        rows_dot_tile(dp, gf, vt_s); /* dP */
        DP_UNROLL
        for (unsigned n = 0; n < 8; n++)
            DP_UNROLL
            for (unsigned e = 0; e < 4; e++) {
                const size_t j = j0 + n * 8 + acc_col(e);
                const unsigned h = e / 2;
                const bool seen = live[h] && !(kt == tile && j > row[h]);
                const float p = seen ? prob2(s[n][e], sl2, lse2[h]) : 0.0f;
                s[n][e] = dp_flash_dscore(p, dp[n][e], d_r[h]);
            }
        uint32_t wf[4][4];
        acc_to_a(wf, s);
        weights_times_tile(dq, wf, kt_s);
        __syncthreads(); /* every warp is done with buffer b before it is refilled */
    }
    write_acc_at(dqkv, dp_flash_tok_row(r0 + (live[0] ? iw : 0), T, NH, HS, 3, 0), 3 * C, dq,
                 live[0], live[1], scale);
#endif
}

// --- dk, dv: key-major -------------------------------------------------------------------------

__global__ void __launch_bounds__(dp_tc::THREADS, 3)
    k_flash_tc_dkdv(dp_pout dqkv, dp_pref dout, const uint16_t *qkv, const float *lse,
                    const float *delta, size_t B, size_t T, size_t NH, float scale,
                    size_t ntiles)
{
#if DP_TC_BODY
    using namespace dp_tc;
    const size_t BNH = B * NH, tile = blockIdx.x / BNH, pair = blockIdx.x % BNH;
    const unsigned warp = threadIdx.x / 32;
    unsigned char *const sm = tc_shared();
    const size_t r0 = pair * T, j0 = tile * BR, jw = j0 + warp * 16, C = NH * HS;
    const size_t key[2] = {jw + lane_quad(), jw + lane_quad() + 8};
    const bool live[2] = {key[0] < T, key[1] < T};
    const uint16_t *q = head_rows(qkv, 0, r0, NH, T), *k = head_rows(qkv, 1, r0, NH, T),
                   *v = head_rows(qkv, 2, r0, NH, T);
    const size_t go = dp_flash_tok_row(r0, T, NH, HS, 1, 0);
    const dp_pref g = dp_pref_offset(dout, go);

    uint32_t kf[4][4], vf[4][4];
    load_bf16_rows(key_q(sm, 0), k, 3 * C, j0, T);
    load_bf16_rows(key_q(sm, 1), v, 3 * C, j0, T);
    __syncthreads();
    load_rows_a(kf, key_q(sm, 0), warp * 16);
    load_rows_a(vf, key_q(sm, 1), warp * 16);
    __syncthreads(); /* every warp has its K and V before the first Q lands over them */
    key_step_issue(sm, 0, q, g, C, lse, delta, r0, tile * BC, T);

    const float sl2 = scale * LOG2E;
    float dk[8][4], dv[8][4];
    DP_UNROLL
    for (unsigned n = 0; n < 8; n++)
        DP_UNROLL
        for (unsigned e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.0f;
    for (size_t qt = tile; qt < ntiles; qt++) {
        const size_t i0 = qt * BC;
        const unsigned b = (unsigned)((qt - tile) % 2);
        if (qt + 1 < ntiles) { /* the next step's copies, as this one runs */
            key_step_issue(sm, 1 - b, q, g, C, lse, delta, r0, i0 + BC, T);
            dp_cp_async_wait<1>();
        } else {
            dp_cp_async_wait<0>();
        }
        if (!g.bf16) round_own_rows(key_h(sm), key_f(sm, b));
        if (threadIdx.x < BC) key_lse(sm, b)[threadIdx.x] *= LOG2E; /* its own copy: lse2 */
        __syncthreads();
        const uint16_t *qt_s = key_q(sm, b), *gt_s = g.bf16 ? key_g16(sm, b) : key_h(sm);
        const float *lse2 = key_lse(sm, b), *drow = key_d(sm, b);
        float p[8][4], ds[8][4];
        rows_dot_tile(p, kf, qt_s); /* S^T */
        DP_UNROLL
        for (unsigned n = 0; n < 8; n++)
            DP_UNROLL
            for (unsigned e = 0; e < 4; e++) {
                const unsigned ii = n * 8 + acc_col(e);
                const bool seen = live[e / 2] && i0 + ii < T && i0 + ii >= key[e / 2];
                p[n][e] = seen ? prob2(p[n][e], sl2, lse2[ii]) : 0.0f;
            }
        uint32_t wf[4][4];
        acc_to_a(wf, p);
        weights_times_tile(dv, wf, gt_s); /* dV += P^T dO */
        rows_dot_tile(ds, vf, gt_s);      /* dP^T */
        DP_UNROLL
        for (unsigned n = 0; n < 8; n++)
            DP_UNROLL
            for (unsigned e = 0; e < 4; e++)
                ds[n][e] = dp_flash_dscore(p[n][e], ds[n][e], drow[n * 8 + acc_col(e)]);
        acc_to_a(wf, ds);
        weights_times_tile(dk, wf, qt_s); /* dK += dS^T Q */
        __syncthreads(); /* every warp is done with step b's buffers and dO before reuse */
    }
    const size_t rj = r0 + (live[0] ? jw : 0);
    write_acc_at(dqkv, dp_flash_tok_row(rj, T, NH, HS, 3, 1), 3 * C, dk, live[0], live[1], scale);
    write_acc_at(dqkv, dp_flash_tok_row(rj, T, NH, HS, 3, 2), 3 * C, dv, live[0], live[1], 1.0f);
#endif
}

#endif /* DP_CUDA_FLASH_TC_CUH */
