/*
 * backend/cuda/cuda_flash_f32.cuh - the fused causal attention's float32
 * kernels (device code; cuda_flash.cu launches them): the
 * TILED ops of kernels/ops.h (attention_fused_forward, _dq, _dkdv), whose
 * math is kernels/flash.h (FlashAttention-2, Dao 2023). The CPU backend
 * loops the same items; the kernels here call the same pieces
 * (dp_flash_dot, _online_step, _rescale_add, _axpy, _prob, _dscore,
 * _normalise, _lse) in the same order, on registers and shared memory.
 *
 * Launch shapes, head sizes 64 and 128 (templates, HS = D * G):
 *   forward   a block per (pair, tile of ROWS = 64 query rows), G threads
 *             per row (G = 1 for hs 64, 2 for hs 128: 64 dimensions each),
 *             q and the accumulator of its D dimensions in registers;
 *             the keys 0..last row of the tile stream through shared
 *             memory TILE = 32 at a time (K and V widened to float, 16 KiB
 *             or 34 KiB), every thread taking one online step per key.
 *   dq        the same blocks, G = 2 (hs 64) or 4 (hs 128), D = 32: q,
 *             dO and dq in registers (3 x 32), K and V tiles shared.
 *   dk, dv    a block per (pair, tile of 64 key rows), G and D as dq: k,
 *             v, dk and dv in registers (4 x 32); the queries from the
 *             tile's first key to T - 1 stream through shared memory 32 at
 *             a time (Q and dO rows, their lse and D).
 * Why: one (or a few) threads per row keeps the whole softmax state of a
 * row in one thread's registers, so nothing but the K/V (Q/dO) tiles is
 * shared and no score is ever written (FlashAttention-2's split: the
 * forward and dq parallel over queries, dk/dv over keys, with no atomics).
 * The dimensions are split over G threads where a row's registers would
 * pass ~200 (3 or 4 arrays of hs floats); a row's G partial dots are
 * added by a butterfly of shuffles, which gives the G threads the same
 * bits. The G threads of a row sit 32/G lanes apart, so a warp's shared
 * load reads G addresses, each broadcast to its lanes; a tile row keeps
 * its G slices 4 floats (16 bytes) apart beyond their D, so those
 * addresses fall in different banks (no conflict, 32- or 128-bit loads).
 * Causal work is uneven: the forward and dq launch their last query
 * tiles first, dk/dv their first key tiles, so the longest blocks start
 * first; a warp stops at the last key (first query) any of its rows sees.
 * ptxas (CUDA 13, sm_75/80/90): no spills, no stack; up to 207 registers
 * per thread for the forward, 200 for dq, 230 for dk/dv (sm_90), so 8 to 12
 * warps per SM: each thread's D independent FMAs per key (and the dots'
 * four running sums) are the latency hiding, not the occupancy.
 * No tensor cores here: the products are float32 FMAs. With bfloat16 q,
 * k, v at head size 64 on sm_80 and later, the launchers run the tensor
 * core kernels of cuda_flash_tc.cuh instead (DP_CUDA_FLASH_TC=0 keeps
 * these, for comparison).
 *
 * Other head sizes: one thread per item, the items of kernels/flash.h
 * themselves, reading qkv from global memory (the L1 and L2 caches
 * serve the K/V rows every row of a warp reads alike).
 *
 * Determinism: every output element is written by one thread, each sum
 * runs in a fixed order (keys, or queries, ascending; a row's partial dots
 * in a fixed tree), no atomics; results are the same bits run to run.
 * Against the CPU's loops they differ by the split dots (G > 1), nvcc's
 * FMA contraction and expf (tests/test_cuda_ops.c bounds the effect).
 */
#ifndef DP_CUDA_FLASH_F32_CUH
#define DP_CUDA_FLASH_F32_CUH

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/bf16.h"
#include "kernels/flash.h"

namespace {

const unsigned ROWS = 64; /* query rows (forward, dq) or key rows (dk, dv) per block */
const unsigned TILE = 32; /* keys (forward, dq) or queries (dk, dv) per shared tile */
const unsigned ROW_THREADS = 128; /* the one-thread-per-item kernels */
const size_t MAX_BLOCKS = 4096;

/* v summed over the G threads of a row (lanes 32/G apart): at each level a
 * lane adds its partner's value to its own, and float addition is
 * commutative, so all G lanes end with the same bits. */
template <int G> __device__ __forceinline__ float row_sum(float v)
{
DP_UNROLL
    for (int off = 32 / G; off < 32; off *= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/* A thread's place: row `row` of the block's ROWS, dimensions
 * [g*D, g*D + D) of it; its warp holds rows [wrow, wrow + 32/G). */
struct slot {
    unsigned row, g, wrow;
};

template <int G> __device__ __forceinline__ slot slot_of()
{
    const unsigned rpw = 32 / G, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    slot s = {warp * rpw + lane % rpw, lane / rpw, warp * rpw};
    return s;
}

/* A shared tile row: G slices of D = HS/G floats, each SLICE apart (4
 * floats of padding between slices, see the file comment). Dimension c
 * of tile row r is at r * row_stride + (c / D) * SLICE + c % D. */
template <int HS, int G> struct tile_layout {
    static constexpr unsigned D = HS / G, SLICE = D + (G > 1 ? 4 : 0), ROW = G * SLICE;
};

/* Rows first, first + stride, ... (n of them) of src widened to float
 * into a tile, by the whole block (consecutive threads, consecutive
 * elements of src). */
template <int HS, int G>
__device__ __forceinline__ void load_rows(float *tile, dp_pref src, size_t first, size_t stride,
                                          unsigned n)
{
    typedef tile_layout<HS, G> L;
    for (unsigned e = threadIdx.x; e < n * HS; e += blockDim.x) {
        unsigned r = e / HS, c = e % HS;
        tile[r * L::ROW + c / L::D * L::SLICE + c % L::D] =
            dp_pref_at(src, first + (size_t)r * stride + c);
    }
}

/* The forward's and dq's step on key rows j0 .. j0 + nk - 1: once every
 * thread is done with the last tile, K and V of these rows (kb, vb: the
 * head's first K and V rows in qkv, rows ld apart) into ks and vs, then
 * the barrier that makes them the block's. */
template <int HS, int G>
__device__ __forceinline__ void load_kv(float *ks, float *vs, dp_pref qkv, size_t kb, size_t vb,
                                        size_t ld, size_t j0, unsigned nk)
{
    __syncthreads();
    load_rows<HS, G>(ks, qkv, kb + j0 * ld, ld, nk);
    load_rows<HS, G>(vs, qkv, vb + j0 * ld, ld, nk);
    __syncthreads();
}

__device__ __forceinline__ size_t dmin(size_t a, size_t b) { return a < b ? a : b; }

} // namespace

// --- forward -------------------------------------------------------------------------------

template <int HS, int G>
__global__ void __launch_bounds__(ROWS *G)
    k_flash_forward(dp_pout out, float *lse, dp_pref qkv, size_t B, size_t T, size_t NH,
                    float scale, size_t ntiles)
{
    typedef tile_layout<HS, G> L;
    constexpr unsigned D = L::D;
    __shared__ __align__(16) float ks[TILE * L::ROW];
    __shared__ __align__(16) float vs[TILE * L::ROW];
    const size_t BNH = B * NH, tile = ntiles - 1 - blockIdx.x / BNH, pair = blockIdx.x % BNH;
    const slot sl = slot_of<G>();
    const size_t r0 = pair * T, i = tile * ROWS + sl.row;
    const bool live = i < T;
    /* the block's rows see keys 0..nkeys-1; the warp's, 0..wlast */
    const size_t nkeys = dmin(T, (tile + 1) * ROWS), wlast = tile * ROWS + sl.wrow + 32 / G - 1;
    const size_t kb = dp_flash_qkv_row(1, r0, T, NH, HS), vb = dp_flash_qkv_row(2, r0, T, NH, HS),
                 ld = dp_flash_qkv_ld(NH, HS);
    const size_t qo = dp_flash_qkv_row(0, r0 + (live ? i : 0), T, NH, HS) + sl.g * D;
    float q[D], acc[D];
DP_UNROLL
    for (unsigned d = 0; d < D; d++) {
        q[d] = live ? dp_pref_at(qkv, qo + d) : 0.0f;
        acc[d] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (size_t j0 = 0; j0 < nkeys; j0 += TILE) {
        const unsigned nk = (unsigned)dmin(TILE, nkeys - j0);
        load_kv<HS, G>(ks, vs, qkv, kb, vb, ld, j0, nk);
        /* warp-uniform bound, so the G lanes of every row meet at the shuffles */
        const unsigned lim = wlast >= j0 ? (unsigned)dmin(nk, wlast + 1 - j0) : 0;
        for (unsigned jj = 0; jj < lim; jj++) {
            const unsigned o = jj * L::ROW + sl.g * L::SLICE;
            float s = scale * row_sum<G>(dp_flash_dot(dp_pref_f32(q), 0, dp_pref_f32(ks), o, D));
            if (live && j0 + jj <= i) {
                float alpha, w = dp_flash_online_step(&m, &l, s, &alpha);
                dp_flash_rescale_add(acc, alpha, w, dp_pref_f32(vs), o, D);
            }
        }
    }
    if (!live) return;
    dp_flash_normalise(acc, acc, l, D);
    const size_t at = dp_flash_tok_row(r0 + i, T, NH, HS, 1, 0) + sl.g * D;
DP_UNROLL
    for (unsigned d = 0; d < D; d++) dp_pout_set(out, at + d, acc[d]);
    if (sl.g == 0) lse[r0 + i] = dp_flash_lse(m, l);
}

// --- dq: query-major ------------------------------------------------------------------------

template <int HS, int G>
__global__ void __launch_bounds__(ROWS *G)
    k_flash_dq(dp_pout dqkv, dp_pref dout, dp_pref qkv, const float *lse,
               const float *delta, size_t B, size_t T, size_t NH, float scale, size_t ntiles)
{
    typedef tile_layout<HS, G> L;
    constexpr unsigned D = L::D;
    __shared__ __align__(16) float ks[TILE * L::ROW];
    __shared__ __align__(16) float vs[TILE * L::ROW];
    const size_t BNH = B * NH, tile = ntiles - 1 - blockIdx.x / BNH, pair = blockIdx.x % BNH;
    const slot sl = slot_of<G>();
    const size_t r0 = pair * T, i = tile * ROWS + sl.row, ri = r0 + (i < T ? i : 0);
    const bool live = i < T;
    const size_t nkeys = dmin(T, (tile + 1) * ROWS), wlast = tile * ROWS + sl.wrow + 32 / G - 1;
    const size_t kb = dp_flash_qkv_row(1, r0, T, NH, HS), vb = dp_flash_qkv_row(2, r0, T, NH, HS),
                 ld = dp_flash_qkv_ld(NH, HS);
    const size_t qo = dp_flash_qkv_row(0, ri, T, NH, HS) + sl.g * D;
    const size_t go = dp_flash_tok_row(ri, T, NH, HS, 1, 0) + sl.g * D;
    float q[D], g[D], dq[D];
DP_UNROLL
    for (unsigned d = 0; d < D; d++) {
        q[d] = live ? dp_pref_at(qkv, qo + d) : 0.0f;
        g[d] = live ? dp_pref_at(dout, go + d) : 0.0f;
        dq[d] = 0.0f;
    }
    const float lse_r = live ? lse[ri] : 0.0f, delta_r = live ? delta[ri] : 0.0f;
    for (size_t j0 = 0; j0 < nkeys; j0 += TILE) {
        const unsigned nk = (unsigned)dmin(TILE, nkeys - j0);
        load_kv<HS, G>(ks, vs, qkv, kb, vb, ld, j0, nk);
        const unsigned lim = wlast >= j0 ? (unsigned)dmin(nk, wlast + 1 - j0) : 0;
        for (unsigned jj = 0; jj < lim; jj++) {
            const unsigned o = jj * L::ROW + sl.g * L::SLICE;
            float s = scale * row_sum<G>(dp_flash_dot(dp_pref_f32(q), 0, dp_pref_f32(ks), o, D));
            float dp = row_sum<G>(dp_flash_dot(dp_pref_f32(g), 0, dp_pref_f32(vs), o, D));
            if (live && j0 + jj <= i)
                dp_flash_axpy(dq, dp_flash_dscore(dp_flash_prob(s, lse_r), dp, delta_r), dp_pref_f32(ks),
                              o, D);
        }
    }
    if (!live) return;
    dp_flash_scale(dq, scale, D);
    const size_t dst = dp_flash_tok_row(ri, T, NH, HS, 3, 0) + sl.g * D;
DP_UNROLL
    for (unsigned d = 0; d < D; d++) dp_pout_set(dqkv, dst + d, dq[d]);
}

// --- dk, dv: key-major --------------------------------------------------------------------

template <int HS, int G>
__global__ void __launch_bounds__(ROWS *G)
    k_flash_dkdv(dp_pout dqkv, dp_pref dout, dp_pref qkv, const float *lse,
                 const float *delta, size_t B, size_t T, size_t NH, float scale)
{
    typedef tile_layout<HS, G> L;
    constexpr unsigned D = L::D;
    __shared__ __align__(16) float qs[TILE * L::ROW];
    __shared__ __align__(16) float gs[TILE * L::ROW];
    __shared__ float ls[TILE], dls[TILE];
    const size_t BNH = B * NH, tile = blockIdx.x / BNH, pair = blockIdx.x % BNH;
    const slot sl = slot_of<G>();
    const size_t r0 = pair * T, j = tile * ROWS + sl.row, rj = r0 + (j < T ? j : 0);
    const bool live = j < T;
    /* queries before the block's (warp's) first key see none of its keys */
    const size_t first = tile * ROWS, wfirst = first + sl.wrow, C = NH * HS;
    const size_t qb = dp_flash_qkv_row(0, r0, T, NH, HS), ld = dp_flash_qkv_ld(NH, HS),
                 gb = dp_flash_tok_row(r0, T, NH, HS, 1, 0);
    const size_t ko = dp_flash_qkv_row(1, rj, T, NH, HS) + sl.g * D,
                 vo = dp_flash_qkv_row(2, rj, T, NH, HS) + sl.g * D;
    float k[D], v[D], dk[D], dv[D];
DP_UNROLL
    for (unsigned d = 0; d < D; d++) {
        k[d] = live ? dp_pref_at(qkv, ko + d) : 0.0f;
        v[d] = live ? dp_pref_at(qkv, vo + d) : 0.0f;
        dk[d] = dv[d] = 0.0f;
    }
    for (size_t i0 = first; i0 < T; i0 += TILE) {
        const unsigned ni = (unsigned)dmin(TILE, T - i0);
        __syncthreads();
        load_rows<HS, G>(qs, qkv, qb + i0 * ld, ld, ni);
        /* dO rows of one pair's head are C apart in dout(B,T,C) */
        load_rows<HS, G>(gs, dout, gb + i0 * C, C, ni);
        for (unsigned e = threadIdx.x; e < ni; e += blockDim.x) {
            ls[e] = lse[r0 + i0 + e];
            dls[e] = delta[r0 + i0 + e];
        }
        __syncthreads();
        const unsigned start = wfirst > i0 ? (unsigned)dmin(ni, wfirst - i0) : 0;
        for (unsigned ii = start; ii < ni; ii++) {
            const unsigned o = ii * L::ROW + sl.g * L::SLICE;
            float s = scale * row_sum<G>(dp_flash_dot(dp_pref_f32(qs), o, dp_pref_f32(k), 0, D));
            float dp = row_sum<G>(dp_flash_dot(dp_pref_f32(gs), o, dp_pref_f32(v), 0, D));
            if (live && i0 + ii >= j) {
                float p = dp_flash_prob(s, ls[ii]);
                dp_flash_axpy(dv, p, dp_pref_f32(gs), o, D);
                dp_flash_axpy(dk, dp_flash_dscore(p, dp, dls[ii]), dp_pref_f32(qs), o, D);
            }
        }
    }
    if (!live) return;
    dp_flash_scale(dk, scale, D);
    const size_t dst_k = dp_flash_tok_row(rj, T, NH, HS, 3, 1) + sl.g * D;
    const size_t dst_v = dp_flash_tok_row(rj, T, NH, HS, 3, 2) + sl.g * D;
DP_UNROLL
    for (unsigned d = 0; d < D; d++) {
        dp_pout_set(dqkv, dst_k + d, dk[d]);
        dp_pout_set(dqkv, dst_v + d, dv[d]);
    }
}

// --- other head sizes: one thread per item ------------------------------------------------

#define ITEM_LOOP(r, n)                                                                      \
    for (size_t r = (size_t)blockIdx.x * blockDim.x + threadIdx.x; r < (n);                  \
         r += (size_t)gridDim.x * blockDim.x)

/* The items for a bfloat16 out or dqkv: each row's float32 sums in a
 * local array of MAXHS >= hs floats, rounded as they are stored (the
 * CPU's items' values: kernels/flash.h). The array's index is the
 * runtime hs, so it lives in local memory: MAXHS * 4 bytes of stack a
 * thread (twice that for dk and dv), which the driver reserves for every
 * thread the GPU can hold (2048 an SM). The launchers take the smallest
 * of 32, 64, 128 and DP_FLASH_HS_MAX16 (items16_cap) that holds hs, so a
 * small head reserves little: 128 bytes a thread at hs 24, not the 1 KB
 * (2 KB) of DP_FLASH_HS_MAX16. */
template <unsigned MAXHS>
__global__ void k_flash_forward_items16(uint16_t *out, float *lse, dp_pref qkv, size_t T,
                                        size_t NH, size_t hs, float scale, size_t n)
{
    ITEM_LOOP(r, n)
    {
        float acc[MAXHS];
        dp_flash_forward_acc(acc, lse, qkv, T, NH, hs, scale, r);
        dp_flash_store_row(dp_pout_bf16(out), dp_flash_tok_row(r, T, NH, hs, 1, 0), acc, hs);
    }
}

template <unsigned MAXHS>
__global__ void k_flash_dq_items16(uint16_t *dqkv, dp_pref dout, dp_pref qkv, const float *lse,
                                   const float *delta, size_t T, size_t NH, size_t hs,
                                   float scale, size_t n)
{
    ITEM_LOOP(r, n)
    {
        float dq[MAXHS];
        dp_flash_dq_acc(dq, dout, qkv, lse, delta, T, NH, hs, scale, r);
        dp_flash_store_row(dp_pout_bf16(dqkv), dp_flash_tok_row(r, T, NH, hs, 3, 0), dq, hs);
    }
}

template <unsigned MAXHS>
__global__ void k_flash_dkdv_items16(uint16_t *dqkv, dp_pref dout, dp_pref qkv, const float *lse,
                                     const float *delta, size_t T, size_t NH, size_t hs,
                                     float scale, size_t n)
{
    ITEM_LOOP(r, n)
    {
        float dk[MAXHS], dv[MAXHS];
        dp_flash_dkdv_acc(dk, dv, dout, qkv, lse, delta, T, NH, hs, scale, r);
        dp_flash_store_row(dp_pout_bf16(dqkv), dp_flash_tok_row(r, T, NH, hs, 3, 1), dk, hs);
        dp_flash_store_row(dp_pout_bf16(dqkv), dp_flash_tok_row(r, T, NH, hs, 3, 2), dv, hs);
    }
}

/* The local rows' size the bfloat16 items take for head size hs (<=
 * DP_FLASH_HS_MAX16: the public calls refuse larger ones). */
inline unsigned items16_cap(size_t hs)
{
    return hs <= 32 ? 32u : hs <= 64 ? 64u : hs <= 128 ? 128u : (unsigned)DP_FLASH_HS_MAX16;
}

/* The forward items for a float32 out, accumulating in its rows (no
 * local row). */
__global__ void k_flash_forward_items_f32(float *out, float *lse, dp_pref qkv, size_t B,
                                          size_t T, size_t NH, size_t hs, float scale, size_t n)
{
    ITEM_LOOP(r, n)
    dp_flash_forward_acc(out + dp_flash_tok_row(r, T, NH, hs, 1, 0), lse, qkv, T, NH, hs, scale,
                         r);
}

/* The items for a float32 dqkv, accumulating in its rows: no local
 * arrays, no stack (see above). */
__global__ void k_flash_dq_items_f32(float *dqkv, dp_pref dout, dp_pref qkv, const float *lse,
                                     const float *delta, size_t B, size_t T, size_t NH,
                                     size_t hs, float scale, size_t n)
{
    ITEM_LOOP(r, n)
    dp_flash_dq_acc(dqkv + dp_flash_tok_row(r, T, NH, hs, 3, 0), dout, qkv, lse, delta, T, NH,
                    hs, scale, r);
}

__global__ void k_flash_dkdv_items_f32(float *dqkv, dp_pref dout, dp_pref qkv,
                                       const float *lse, const float *delta, size_t B, size_t T,
                                       size_t NH, size_t hs, float scale, size_t n)
{
    ITEM_LOOP(r, n)
    dp_flash_dkdv_acc(dqkv + dp_flash_tok_row(r, T, NH, hs, 3, 1),
                      dqkv + dp_flash_tok_row(r, T, NH, hs, 3, 2), dout, qkv, lse, delta, T, NH,
                      hs, scale, r);
}

// --- D = dO . O per row ----------------------------------------------------------------------

/* Four elements of a float32 or bfloat16 row from element 4q, in one
 * 16- or 8-byte load. */
__device__ __forceinline__ float4 load4(dp_pref x, size_t o, size_t q)
{
    if (!x.bf16) return ((const float4 *)((const float *)x.p + o))[q];
    const uint2 w = ((const uint2 *)((const uint16_t *)x.p + o))[q];
    return make_float4(dp_bf16_widen((uint16_t)(w.x & 0xffffu)), dp_bf16_widen((uint16_t)(w.x >> 16)),
                       dp_bf16_widen((uint16_t)(w.y & 0xffffu)), dp_bf16_widen((uint16_t)(w.y >> 16)));
}

/* dp_flash_delta_item for each row, the row's elements four at a time:
 * dout and out each as float4 or (bfloat16) four elements in 8 bytes,
 * each group's four products into dp_flash_dot's four partials in its
 * order, so the same sums. A thread reads its row's 64 elements as 16
 * loads in flight instead of 64: the rows of adjacent threads are C
 * elements apart, so one element at a time was a scattered load each.
 * Needs hs % 4 == 0, dout and out 16-byte (float32) or 8-byte (bfloat16)
 * aligned, C % 4 == 0 (the launcher checks). */
__global__ void k_flash_delta_vec(float *delta, dp_pref dout, dp_pref out, size_t T, size_t NH,
                                  size_t hs, size_t n)
{
    ITEM_LOOP(r, n)
    {
        const size_t o = dp_flash_tok_row(r, T, NH, hs, 1, 0);
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        for (size_t q = 0; q < hs / 4; q++) {
            const float4 a = load4(dout, o, q), b = load4(out, o, q);
            s0 += a.x * b.x;
            s1 += a.y * b.y;
            s2 += a.z * b.z;
            s3 += a.w * b.w;
        }
        delta[r] = (s0 + s1) + (s2 + s3);
    }
}

__global__ void k_flash_delta_items(float *delta, dp_pref dout, dp_pref out, size_t T,
                                    size_t NH, size_t hs, size_t n)
{
    ITEM_LOOP(r, n) dp_flash_delta_item(delta, dout, out, T, NH, hs, r);
}

#endif /* DP_CUDA_FLASH_F32_CUH */
