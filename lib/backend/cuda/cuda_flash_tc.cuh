/*
 * backend/cuda/cuda_flash_tc.cuh - the fused causal attention on tensor
 * cores: FlashAttention-2 (Dao 2023) for head size 64 with bfloat16 q, k,
 * v (qkvr in bf16, what the GPT's bf16 activations give), on WMMA tiles
 * of 16x16x16 bfloat16 products with float32 accumulation (sm_80 and
 * later). The same three passes as the float32 kernels of cuda_flash.cu
 * and the same math as kernels/flash.h, regrouped by tiles:
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
 *            query tile from the diagonal on: S^T = K Q^T, dP^T = V dO^T,
 *            P^T, dV += P^T dO, dS^T = P^T (dP^T - D), dK += dS^T Q;
 *            dk = scale dK.
 *
 * Precision: q, k, v are bfloat16 already; P, dS and dO are rounded to
 * bfloat16 for the products (as FlashAttention-2 and the chunked
 * attention's bf16 GEMMs do); every sum, the softmax state, l, lse and
 * D stay float32. So against the float32 kernels each output moves by at
 * most a few bfloat16 roundings (2^-9 relative) of its terms' magnitudes:
 * tests/flash_tc_bound.h derives the bound the tests hold them to.
 *
 * Determinism: each output element is written once by one lane; the key
 * (or query) tiles are visited in ascending order and each product's
 * accumulation order is fixed by the hardware for a given shape; no
 * atomics. The same inputs give the same bits.
 *
 * Layout of a warp's element-wise work: lane l takes row l % 16 of its
 * warp's 16 and the columns 2c + l / 16 (c = 0..31) of a 64-wide tile,
 * so the two lanes of a row read interleaved words: with the float
 * tiles' row stride of 68 words, a warp's 32 reads fall in 16 banks
 * (2-way), where contiguous halves would give 4-way conflicts.
 *
 * This header is device code only. cuda_flash.cu includes it under nvcc;
 * tests/test_flash_tc_emu.cpp compiles it with g++ against
 * tests/cuda_emu.hpp, which emulates the CUDA subset used here (threads,
 * barriers, shuffles, WMMA fragments as whole matrices), so the kernels'
 * logic is tested on machines without a GPU.
 */
#ifndef DP_CUDA_FLASH_TC_CUH
#define DP_CUDA_FLASH_TC_CUH

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/bf16.h"
#include "kernels/expf.h"
#include "kernels/flash.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <mma.h>

/* The block's dynamic shared memory (the launch's third parameter). */
__device__ __forceinline__ unsigned char *tc_shared()
{
    extern __shared__ __align__(128) unsigned char dp_tc_smem[];
    return dp_tc_smem;
}
#endif

/* WMMA's bfloat16 fragments exist from sm_80 on: under nvcc the helpers
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
const unsigned LDH = HS + 8;  /* bf16 tile row stride: a multiple of 8, rows 16 B aligned */
const unsigned LDF = BC + 4;  /* float tile row stride: a multiple of 4 */

/* Shared memory of a block: two bf16 tiles of 64 rows (K and V, or Q and
 * dO), then per warp two float tiles of 16 x 64 and one bf16 one, then
 * two rows of 64 floats (lse and D of a query tile). Offsets in bytes,
 * each a multiple of 128. */
const size_t TILE_H = (size_t)BR * LDH * 2;   /* 9216 */
const size_t WARP_F = (size_t)16 * LDF * 4;   /* 4352 */
const size_t WARP_H = (size_t)16 * LDH * 2;   /* 2304 */
const size_t OFF_T1 = TILE_H;
const size_t OFF_W = 2 * TILE_H;
const size_t WARP_BYTES = 2 * WARP_F + WARP_H;
const size_t OFF_ROWS = OFF_W + WARPS * WARP_BYTES;
/* 62976 bytes: past the 48 KiB default, so the launcher raises the limit */
const size_t SMEM_BYTES = OFF_ROWS + 2 * BC * 4;

#if DP_TC_BODY
namespace wmma = nvcuda::wmma;

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> frag_a;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> frag_b_row;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> frag_b_col;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;

struct smem_view {
    uint16_t *t0, *t1; /* (64, LDH) bf16 tiles */
    float *sf, *df;    /* this warp's (16, LDF) float tiles */
    uint16_t *ph;      /* this warp's (16, LDH) bf16 tile */
    float *rows0, *rows1;
};

__device__ __forceinline__ smem_view view_of(unsigned char *s, unsigned warp)
{
    smem_view v;
    v.t0 = (uint16_t *)s;
    v.t1 = (uint16_t *)(s + OFF_T1);
    unsigned char *w = s + OFF_W + warp * WARP_BYTES;
    v.sf = (float *)w;
    v.df = (float *)(w + WARP_F);
    v.ph = (uint16_t *)(w + 2 * WARP_F);
    v.rows0 = (float *)(s + OFF_ROWS);
    v.rows1 = v.rows0 + BC;
    return v;
}

__device__ __forceinline__ const __nv_bfloat16 *bf(const uint16_t *p)
{
    return (const __nv_bfloat16 *)p;
}

/* Rows [first, first + 64) of a head's (T, 64) bfloat16 rows starting at
 * src (row r at src + r * 64) into a (64, LDH) tile, zeros past T: the
 * whole block, 8 bytes per thread and step. */
__device__ __forceinline__ void load_bf16_rows(uint16_t *tile, const uint16_t *src, size_t first,
                                               size_t T)
{
    for (unsigned e = threadIdx.x; e < BR * HS / 4; e += THREADS) {
        unsigned r = e / (HS / 4), c = e % (HS / 4) * 4;
        uint2 w = make_uint2(0u, 0u);
        if (first + r < T) w = *(const uint2 *)(src + (first + r) * HS + c);
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
        uint16_t *d = tile + r * LDH + c;
        d[0] = dp_bf16_round(f.x);
        d[1] = dp_bf16_round(f.y);
        d[2] = dp_bf16_round(f.z);
        d[3] = dp_bf16_round(f.w);
    }
}

/* A warp's 16 rows of a (64, LDH) tile as four matrix_a fragments (16 x 64). */
__device__ __forceinline__ void load_rows_a(frag_a f[4], const uint16_t *tile, unsigned row0)
{
    DP_UNROLL
    for (unsigned kk = 0; kk < 4; kk++)
        wmma::load_matrix_sync(f[kk], bf(tile + row0 * LDH + kk * 16), LDH);
}

/* out(16, 64) float = a(16, 64) . tile^T, tile (64 rows, LDH): the
 * product of the warp's rows with every row of the tile (S = Q K^T and
 * its kin), stored into a (16, LDF) float tile. */
__device__ __forceinline__ void rows_dot_tile(float *out, const frag_a a[4], const uint16_t *tile)
{
    DP_UNROLL
    for (unsigned n = 0; n < 4; n++) {
        frag_c c;
        wmma::fill_fragment(c, 0.0f);
        DP_UNROLL
        for (unsigned kk = 0; kk < 4; kk++) {
            frag_b_col b; /* element (d, j) = tile[16n + j][16kk + d] */
            wmma::load_matrix_sync(b, bf(tile + (n * 16) * LDH + kk * 16), LDH);
            wmma::mma_sync(c, a[kk], b, c);
        }
        wmma::store_matrix_sync(out + n * 16, c, LDF, wmma::mem_row_major);
    }
}

/* acc[n] += p(16, 64) . tile(64, 64): the warp's bf16 weights over the
 * tile's rows (O += P V, dQ += dS K, dV += P^T dO, dK += dS^T Q). */
__device__ __forceinline__ void weights_times_tile(frag_c acc[4], const uint16_t *p,
                                                   const uint16_t *tile)
{
    DP_UNROLL
    for (unsigned kk = 0; kk < 4; kk++) {
        frag_a a;
        wmma::load_matrix_sync(a, bf(p + kk * 16), LDH);
        DP_UNROLL
        for (unsigned n = 0; n < 4; n++) {
            frag_b_row b; /* element (j, d) = tile[16kk + j][16n + d] */
            wmma::load_matrix_sync(b, bf(tile + (kk * 16) * LDH + n * 16), LDH);
            wmma::mma_sync(acc[n], a, b, acc[n]);
        }
    }
}

/* The lane's row of its warp's 16, and its column c's place in a 64-wide tile. */
__device__ __forceinline__ unsigned lane_row() { return threadIdx.x % 16; }
__device__ __forceinline__ unsigned lane_col(unsigned c) { return 2 * c + threadIdx.x % 32 / 16; }

/* Stores four accumulators (16 x 64) into the warp's float tile, then
 * writes the lane's half of its row, times `mul`, to dst (64 floats). */
__device__ __forceinline__ void write_row(float *stage, const frag_c acc[4], float *dst,
                                          bool live, float mul)
{
    DP_UNROLL
    for (unsigned n = 0; n < 4; n++)
        wmma::store_matrix_sync(stage + n * 16, acc[n], LDF, wmma::mem_row_major);
    __syncwarp();
    const unsigned r = lane_row();
    if (!live) return;
    DP_UNROLL
    for (unsigned c = 0; c < 32; c++) dst[lane_col(c)] = stage[r * LDF + lane_col(c)] * mul;
}

#endif /* DP_TC_BODY */
} // namespace dp_tc

// --- forward --------------------------------------------------------------------------------

/* out(B,T,C) and lse(B,NH,T) from qkvr(3,B,NH,T,64) bfloat16 bits; a block
 * per (pair, query tile), last tiles first. */
__global__ void __launch_bounds__(dp_tc::THREADS)
    k_flash_tc_forward(float *out, float *lse, const uint16_t *qkvr, size_t B, size_t T,
                       size_t NH, float scale, size_t ntiles)
{
#if DP_TC_BODY
    using namespace dp_tc;
    const size_t BNH = B * NH, tile = ntiles - 1 - blockIdx.x / BNH, pair = blockIdx.x % BNH;
    const unsigned warp = threadIdx.x / 32, r = lane_row();
    const smem_view sv = view_of(tc_shared(), warp);
    const size_t r0 = pair * T, i0 = tile * BR, i = i0 + warp * 16 + r;
    const uint16_t *q = qkvr + dp_flash_qkvr_row(0, r0, BNH, T, HS);
    const uint16_t *k = qkvr + dp_flash_qkvr_row(1, r0, BNH, T, HS);
    const uint16_t *v = qkvr + dp_flash_qkvr_row(2, r0, BNH, T, HS);

    frag_a qf[4];
    load_bf16_rows(sv.t0, q, i0, T);
    __syncthreads();
    load_rows_a(qf, sv.t0, warp * 16);

    float o[32], m = -INFINITY, l = 0.0f;
    DP_UNROLL
    for (unsigned c = 0; c < 32; c++) o[c] = 0.0f;
    for (size_t kt = 0; kt <= tile; kt++) {
        const size_t j0 = kt * BC;
        __syncthreads(); /* every warp is done with the last K, V (and Q) */
        load_bf16_rows(sv.t0, k, j0, T);
        load_bf16_rows(sv.t1, v, j0, T);
        __syncthreads();
        rows_dot_tile(sv.sf, qf, sv.t0);
        __syncwarp();
        /* the online softmax of row i over this tile's keys (j > i masked) */
        float s[32], mx = -INFINITY;
        DP_UNROLL
        for (unsigned c = 0; c < 32; c++) {
            const unsigned jj = lane_col(c);
            s[c] = (kt == tile && j0 + jj > i) ? -INFINITY : scale * sv.sf[r * LDF + jj];
            mx = fmaxf(mx, s[c]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
        const float mnew = fmaxf(m, mx), alpha = dp_expf(m - mnew);
        float sum = 0.0f;
        DP_UNROLL
        for (unsigned c = 0; c < 32; c++) {
            const float p = s[c] == -INFINITY ? 0.0f : dp_expf(s[c] - mnew);
            sum += p;
            sv.ph[r * LDH + lane_col(c)] = dp_bf16_round(p);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 16);
        l = l * alpha + sum;
        m = mnew;
        __syncwarp();
        frag_c pv[4];
        DP_UNROLL
        for (unsigned n = 0; n < 4; n++) wmma::fill_fragment(pv[n], 0.0f);
        weights_times_tile(pv, sv.ph, sv.t1);
        DP_UNROLL
        for (unsigned n = 0; n < 4; n++)
            wmma::store_matrix_sync(sv.sf + n * 16, pv[n], LDF, wmma::mem_row_major);
        __syncwarp();
        DP_UNROLL
        for (unsigned c = 0; c < 32; c++) o[c] = o[c] * alpha + sv.sf[r * LDF + lane_col(c)];
        __syncwarp(); /* before the next tile's S overwrites sf */
    }
    if (i >= T) return;
    float *dst = out + dp_flash_tok_row(r0 + i, T, NH, HS, 1, 0);
    const float inv = 1.0f / l;
    DP_UNROLL
    for (unsigned c = 0; c < 32; c++) dst[lane_col(c)] = o[c] * inv;
    if (threadIdx.x % 32 < 16) lse[r0 + i] = dp_flash_lse(m, l);
#endif
}

// --- dq: query-major ---------------------------------------------------------------------------

__global__ void __launch_bounds__(dp_tc::THREADS)
    k_flash_tc_dq(float *dqkv, const float *dout, const uint16_t *qkvr, const float *lse,
                  const float *delta, size_t B, size_t T, size_t NH, float scale, size_t ntiles)
{
#if DP_TC_BODY
    using namespace dp_tc;
    const size_t BNH = B * NH, tile = ntiles - 1 - blockIdx.x / BNH, pair = blockIdx.x % BNH;
    const unsigned warp = threadIdx.x / 32, r = lane_row();
    const smem_view sv = view_of(tc_shared(), warp);
    const size_t r0 = pair * T, i0 = tile * BR, i = i0 + warp * 16 + r, C = NH * HS;
    const bool live = i < T;
    const uint16_t *q = qkvr + dp_flash_qkvr_row(0, r0, BNH, T, HS);
    const uint16_t *k = qkvr + dp_flash_qkvr_row(1, r0, BNH, T, HS);
    const uint16_t *v = qkvr + dp_flash_qkvr_row(2, r0, BNH, T, HS);

    frag_a qf[4], gf[4];
    load_bf16_rows(sv.t0, q, i0, T);
    load_f32_rows(sv.t1, dout + dp_flash_tok_row(r0, T, NH, HS, 1, 0), C, i0, T);
    __syncthreads();
    load_rows_a(qf, sv.t0, warp * 16);
    load_rows_a(gf, sv.t1, warp * 16);
    const float lse_i = live ? lse[r0 + i] : 0.0f, d_i = live ? delta[r0 + i] : 0.0f;

    frag_c dq[4];
    DP_UNROLL
    for (unsigned n = 0; n < 4; n++) wmma::fill_fragment(dq[n], 0.0f);
    for (size_t kt = 0; kt <= tile; kt++) {
        const size_t j0 = kt * BC;
        __syncthreads();
        load_bf16_rows(sv.t0, k, j0, T);
        load_bf16_rows(sv.t1, v, j0, T);
        __syncthreads();
        rows_dot_tile(sv.sf, qf, sv.t0); /* S */
        rows_dot_tile(sv.df, gf, sv.t1); /* dP */
        __syncwarp();
        DP_UNROLL
        for (unsigned c = 0; c < 32; c++) {
            const unsigned jj = lane_col(c);
            const bool seen = live && !(kt == tile && j0 + jj > i);
            const float p = seen ? dp_flash_prob(scale * sv.sf[r * LDF + jj], lse_i) : 0.0f;
            sv.ph[r * LDH + jj] = dp_bf16_round(dp_flash_dscore(p, sv.df[r * LDF + jj], d_i));
        }
        __syncwarp();
        weights_times_tile(dq, sv.ph, sv.t0);
    }
    write_row(sv.sf, dq, dqkv + dp_flash_tok_row(r0 + (live ? i : 0), T, NH, HS, 3, 0), live,
              scale);
#endif
}

// --- dk, dv: key-major -------------------------------------------------------------------------

__global__ void __launch_bounds__(dp_tc::THREADS)
    k_flash_tc_dkdv(float *dqkv, const float *dout, const uint16_t *qkvr, const float *lse,
                    const float *delta, size_t B, size_t T, size_t NH, float scale,
                    size_t ntiles)
{
#if DP_TC_BODY
    using namespace dp_tc;
    const size_t BNH = B * NH, tile = blockIdx.x / BNH, pair = blockIdx.x % BNH;
    const unsigned warp = threadIdx.x / 32, r = lane_row();
    const smem_view sv = view_of(tc_shared(), warp);
    const size_t r0 = pair * T, j0 = tile * BR, j = j0 + warp * 16 + r, C = NH * HS;
    const bool live = j < T;
    const uint16_t *q = qkvr + dp_flash_qkvr_row(0, r0, BNH, T, HS);
    const uint16_t *k = qkvr + dp_flash_qkvr_row(1, r0, BNH, T, HS);
    const uint16_t *v = qkvr + dp_flash_qkvr_row(2, r0, BNH, T, HS);
    const float *g = dout + dp_flash_tok_row(r0, T, NH, HS, 1, 0);

    frag_a kf[4], vf[4];
    load_bf16_rows(sv.t0, k, j0, T);
    load_bf16_rows(sv.t1, v, j0, T);
    __syncthreads();
    load_rows_a(kf, sv.t0, warp * 16);
    load_rows_a(vf, sv.t1, warp * 16);

    frag_c dk[4], dv[4];
    DP_UNROLL
    for (unsigned n = 0; n < 4; n++) {
        wmma::fill_fragment(dk[n], 0.0f);
        wmma::fill_fragment(dv[n], 0.0f);
    }
    for (size_t qt = tile; qt < ntiles; qt++) {
        const size_t i0 = qt * BC;
        __syncthreads();
        load_bf16_rows(sv.t0, q, i0, T);
        load_f32_rows(sv.t1, g, C, i0, T);
        for (unsigned e = threadIdx.x; e < BC; e += THREADS) {
            sv.rows0[e] = i0 + e < T ? lse[r0 + i0 + e] : 0.0f;
            sv.rows1[e] = i0 + e < T ? delta[r0 + i0 + e] : 0.0f;
        }
        __syncthreads();
        rows_dot_tile(sv.sf, kf, sv.t0); /* S^T */
        rows_dot_tile(sv.df, vf, sv.t1); /* dP^T */
        __syncwarp();
        DP_UNROLL
        for (unsigned c = 0; c < 32; c++) {
            const unsigned ii = lane_col(c);
            const bool seen = live && i0 + ii < T && i0 + ii >= j;
            const float p = seen ? dp_flash_prob(scale * sv.sf[r * LDF + ii], sv.rows0[ii]) : 0.0f;
            sv.sf[r * LDF + ii] = p;
            sv.ph[r * LDH + ii] = dp_bf16_round(p);
        }
        __syncwarp();
        weights_times_tile(dv, sv.ph, sv.t1);
        __syncwarp(); /* the P^T loads are done before dS^T overwrites ph */
        DP_UNROLL
        for (unsigned c = 0; c < 32; c++) {
            const unsigned ii = lane_col(c);
            sv.ph[r * LDH + ii] = dp_bf16_round(
                dp_flash_dscore(sv.sf[r * LDF + ii], sv.df[r * LDF + ii], sv.rows1[ii]));
        }
        __syncwarp();
        weights_times_tile(dk, sv.ph, sv.t0);
    }
    const size_t rj = r0 + (live ? j : 0);
    write_row(sv.sf, dk, dqkv + dp_flash_tok_row(rj, T, NH, HS, 3, 1), live, scale);
    __syncwarp();
    write_row(sv.sf, dv, dqkv + dp_flash_tok_row(rj, T, NH, HS, 3, 2), live, 1.0f);
#endif
}

#endif /* DP_CUDA_FLASH_TC_CUH */
