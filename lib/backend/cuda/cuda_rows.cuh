/*
 * backend/cuda/cuda_rows.cuh - the device code of the CUDA backend's
 * block-per-row kernels (the ROW_BLOCK ops of kernels/ops.h; their
 * launchers are cuda_rows.cu). Device code only, so that
 * tests/test_cuda_rows_emu.cpp can also compile it with the host's C++
 * compiler against tests/cuda_emu.hpp and run it on the CPU.
 */
#ifndef DP_CUDA_ROWS_CUH
#define DP_CUDA_ROWS_CUH

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h" /* the kernel headers: bf16, ignored targets */

// --- block-per-row kernels (the ROW_BLOCK ops of kernels/ops.h) ---------------------------
/*
 * One block of THREADS threads per row (grid-stride over rows): thread j
 * handles the row's elements j, j + THREADS, ... (adjacent threads read
 * adjacent addresses), and every row-wide sum or maximum is a fixed tree:
 * each thread's partial in element order, then __shfl_down within each
 * warp (offsets 16, 8, 4, 2, 1), then the warps' results in warp order by
 * warp 0, broadcast through shared memory. THREADS is BLOCK_THREADS, or
 * CE_THREADS for long cross-entropy rows (more loads in flight when a chunk
 * of logits is only a few hundred rows). The tree depends only on the row
 * length and THREADS (itself a function of the row length), so results are
 * bitwise reproducible run to run. They are not bitwise equal to the CPU's loops over the kernels/
 * functions, which sum in another order: sums of C terms differ by about
 * C * 2^-24 relative at worst (float sums: LayerNorm's mean and variance,
 * softmax's denominator) and far less for the double sums of
 * cross-entropy; the exp differs by the expf implementations (2 ulp each).
 * tests/test_cuda_ops.c states the resulting bounds per op.
 */

const unsigned BLOCK_THREADS = 256;
const unsigned CE_THREADS = 1024;
/* Cross-entropy rows at least this long get CE_THREADS threads. */
const size_t CE_LONG_ROW = 4096;

/* Shared memory of a block reduction: one slot per warp and the result. */
template <unsigned THREADS, typename Tv> struct block_scratch {
    Tv slot[THREADS / 32 + 1];
};

/* Row-wide reduction of each thread's v by op (fixed tree); every thread
 * gets the result. */
template <unsigned THREADS, typename Tv, typename Op>
__device__ Tv block_reduce(Tv v, Tv identity, block_scratch<THREADS, Tv> &sh, Op op)
{
    const unsigned warps = THREADS / 32;
    for (int off = 16; off > 0; off /= 2) v = op(v, __shfl_down_sync(0xffffffffu, v, off));
    unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) sh.slot[warp] = v;
    __syncthreads();
    if (warp == 0) {
        Tv w = lane < warps ? sh.slot[lane] : identity;
        for (int off = 16; off > 0; off /= 2) w = op(w, __shfl_down_sync(0xffffffffu, w, off));
        if (lane == 0) sh.slot[warps] = w;
    }
    __syncthreads();
    Tv total = sh.slot[warps];
    __syncthreads(); /* the scratch may be reused by the next reduction */
    return total;
}

struct add_op {
    template <typename Tv> __device__ Tv operator()(Tv a, Tv b) const { return a + b; }
};
struct max_op {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <unsigned THREADS, typename Tv>
__device__ Tv block_sum(Tv v, block_scratch<THREADS, Tv> &sh)
{
    return block_reduce<THREADS>(v, (Tv)0, sh, add_op());
}

/* Row-wide maximum (NaN-free inputs give the true maximum in any order). */
template <unsigned THREADS> __device__ float block_max(float v, block_scratch<THREADS, float> &sh)
{
    return block_reduce<THREADS>(v, -INFINITY, sh, max_op());
}

#define BLOCK_ROW_LOOP(r, rows) for (size_t r = blockIdx.x; r < (rows); r += gridDim.x)
#define ROW_ELEMS(j, len) for (size_t j = threadIdx.x; j < (len); j += blockDim.x)

/* Elements of a LayerNorm row a thread keeps in registers (rows up to
 * LN_VALS * BLOCK_THREADS = 1024 wide; longer ones read memory at each
 * pass): its elements j, j + BLOCK_THREADS, ..., loaded together, then
 * the passes in the same order as the loops over memory, so the same
 * bits. Each pass re-read the row from L1 or L2, one dependent 4-byte
 * load after another. */
const unsigned LN_VALS = 4;

/* One LayerNorm output element: float32, or rounded to bfloat16 once
 * (the float32 value's rounding, so both outputs agree bit for bit). */
__device__ __forceinline__ void ln_store(float *out, size_t i, float v) { out[i] = v; }
__device__ __forceinline__ void ln_store(uint16_t *out, size_t i, float v)
{
    out[i] = dp_bf16_round(v);
}

/* dp_layernorm_forward_item (To = float) and _bf16_out_item (To =
 * uint16_t), one block per row: mean, then the centred sum of squares
 * (two passes, as the CPU), then the output; the same instructions up to
 * the store. With add (dp_residual_layernorm_item) the row of xw (the
 * same memory as inp) first becomes inp + add, each element by the thread
 * that reads it below, and the barrier makes the row whole for all. */
template <typename To>
__global__ void k_layernorm_forward_block(To *out, float *mean, float *rstd, const float *inp,
                                          dp_pref weight, dp_pref bias, size_t C, float eps,
                                          size_t N, float *xw, const float *add)
{
    __shared__ block_scratch<BLOCK_THREADS, float> sh;
    if (C <= LN_VALS * BLOCK_THREADS) { /* the row in registers */
        BLOCK_ROW_LOOP(r, N)
        {
            const float *x = inp + r * C;
            float v[LN_VALS];
            DP_UNROLL
            for (unsigned k = 0; k < LN_VALS; k++) {
                const size_t c = threadIdx.x + k * BLOCK_THREADS;
                v[k] = c < C ? (add ? xw[r * C + c] + add[r * C + c] : x[c]) : 0.0f;
            }
            if (add) {
                DP_UNROLL
                for (unsigned k = 0; k < LN_VALS; k++) {
                    const size_t c = threadIdx.x + k * BLOCK_THREADS;
                    if (c < C) xw[r * C + c] = v[k];
                }
            }
            float a = 0.0f;
            DP_UNROLL
            for (unsigned k = 0; k < LN_VALS; k++)
                if (threadIdx.x + k * BLOCK_THREADS < C) a += v[k];
            float m = block_sum<BLOCK_THREADS>(a, sh) / (float)C;
            float q = 0.0f;
            DP_UNROLL
            for (unsigned k = 0; k < LN_VALS; k++)
                if (threadIdx.x + k * BLOCK_THREADS < C) {
                    float d = v[k] - m;
                    q += d * d;
                }
            float s = 1.0f / sqrtf(block_sum<BLOCK_THREADS>(q, sh) / (float)C + eps);
            DP_UNROLL
            for (unsigned k = 0; k < LN_VALS; k++) {
                const size_t c = threadIdx.x + k * BLOCK_THREADS;
                if (c < C) ln_store(out, r * C + c, dp_layernorm_out(v[k], m, s, weight, bias, c));
            }
            if (threadIdx.x == 0) {
                mean[r] = m;
                rstd[r] = s;
            }
        }
        return;
    }
    BLOCK_ROW_LOOP(r, N)
    {
        const float *x = inp + r * C;
        if (add) {
            ROW_ELEMS(c, C) xw[r * C + c] += add[r * C + c];
            __syncthreads();
        }
        float a = 0.0f;
        ROW_ELEMS(c, C) a += x[c];
        float m = block_sum<BLOCK_THREADS>(a, sh) / (float)C;
        float q = 0.0f;
        ROW_ELEMS(c, C)
        {
            float d = x[c] - m;
            q += d * d;
        }
        float s = 1.0f / sqrtf(block_sum<BLOCK_THREADS>(q, sh) / (float)C + eps);
        ROW_ELEMS(c, C) ln_store(out, r * C + c, dp_layernorm_out(x[c], m, s, weight, bias, c));
        if (threadIdx.x == 0) {
            mean[r] = m;
            rstd[r] = s;
        }
    }
}

/* dp_softmax_causal_forward_item, one block per row r (query t = q0 + r % nq,
 * ld keys); with att16 the row rounded to bfloat16 there too. */
__global__ void k_softmax_causal_forward_block(float *att, uint16_t *att16, float scale,
                                               size_t ld, size_t q0, size_t nq, size_t rows)
{
    __shared__ block_scratch<BLOCK_THREADS, float> sh;
    BLOCK_ROW_LOOP(r, rows)
    {
        float *row = att + r * ld;
        size_t t = q0 + r % nq;
        float mx = -INFINITY;
        ROW_ELEMS(j, t + 1) mx = fmaxf(mx, scale * row[j]);
        mx = block_max<BLOCK_THREADS>(mx, sh);
        float a = 0.0f;
        ROW_ELEMS(j, t + 1)
        {
            float e = expf(scale * row[j] - mx);
            row[j] = e;
            a += e;
        }
        float inv = 1.0f / block_sum<BLOCK_THREADS>(a, sh); /* >= 1: the maximum's term is exp(0) */
        uint16_t *row16 = att16 ? att16 + r * ld : NULL;
        ROW_ELEMS(j, ld)
        {
            float p = j <= t ? row[j] * inv : 0.0f;
            row[j] = p;
            if (row16) row16[j] = dp_bf16_round(p);
        }
    }
}

/* dp_layernorm_backward_inp_item, one block per row: the two row means
 * (of g = dout * weight and of g * xhat), then dinp += the gradient; dout
 * float32 or bfloat16 (widened as it is read). */
__global__ void k_layernorm_backward_inp_block(float *dinp, dp_pref dout, const float *inp,
                                               dp_pref weight, const float *mean,
                                               const float *rstd, size_t C, size_t N)
{
    __shared__ block_scratch<BLOCK_THREADS, float> sh;
    if (C <= LN_VALS * BLOCK_THREADS) { /* the rows of dout and inp in registers */
        BLOCK_ROW_LOOP(r, N)
        {
            const dp_pref g = dp_pref_offset(dout, r * C);
            const float *x = inp + r * C;
            float gv[LN_VALS], xv[LN_VALS], dv[LN_VALS];
            DP_UNROLL
            for (unsigned k = 0; k < LN_VALS; k++) {
                const size_t c = threadIdx.x + k * BLOCK_THREADS;
                gv[k] = c < C ? dp_pref_at(g, c) : 0.0f;
                xv[k] = c < C ? x[c] : 0.0f;
                dv[k] = c < C ? dinp[r * C + c] : 0.0f;
            }
            float m = mean[r], s = rstd[r], a = 0.0f, b = 0.0f;
            DP_UNROLL
            for (unsigned k = 0; k < LN_VALS; k++) {
                const size_t c = threadIdx.x + k * BLOCK_THREADS;
                if (c < C) {
                    float gw = gv[k] * dp_pref_at(weight, c);
                    a += gw;
                    b += gw * (xv[k] - m) * s;
                }
            }
            float g_mean = block_sum<BLOCK_THREADS>(a, sh) / (float)C;
            float gx_mean = block_sum<BLOCK_THREADS>(b, sh) / (float)C;
            DP_UNROLL
            for (unsigned k = 0; k < LN_VALS; k++) {
                const size_t c = threadIdx.x + k * BLOCK_THREADS;
                if (c < C) {
                    float xhat = (xv[k] - m) * s, gw = gv[k] * dp_pref_at(weight, c);
                    dinp[r * C + c] = dv[k] + s * (gw - g_mean - xhat * gx_mean);
                }
            }
        }
        return;
    }
    BLOCK_ROW_LOOP(r, N)
    {
        const dp_pref g = dp_pref_offset(dout, r * C);
        const float *x = inp + r * C;
        float m = mean[r], s = rstd[r], a = 0.0f, b = 0.0f;
        ROW_ELEMS(c, C)
        {
            float gw = dp_pref_at(g, c) * dp_pref_at(weight, c);
            a += gw;
            b += gw * (x[c] - m) * s;
        }
        float g_mean = block_sum<BLOCK_THREADS>(a, sh) / (float)C;
        float gx_mean = block_sum<BLOCK_THREADS>(b, sh) / (float)C;
        ROW_ELEMS(c, C)
        {
            float xhat = (x[c] - m) * s, gw = dp_pref_at(g, c) * dp_pref_at(weight, c);
            dinp[r * C + c] += s * (gw - g_mean - xhat * gx_mean);
        }
    }
}

/* dp_softmax_causal_backward_item, one block per row r (query t = q0 + r %
 * nq, ld keys): the dot of att and datt over keys 0..t, then datt in
 * place, or with ds16 rounded to bfloat16 into ds16 only; keys after t
 * become 0 whatever they held. */
__global__ void k_softmax_causal_backward_block(float *datt, uint16_t *ds16, const float *att,
                                                float scale, size_t ld, size_t q0, size_t nq,
                                                size_t rows)
{
    __shared__ block_scratch<BLOCK_THREADS, float> sh;
    BLOCK_ROW_LOOP(r, rows)
    {
        float *drow = datt + r * ld;
        const float *arow = att + r * ld;
        size_t t = q0 + r % nq;
        float dot = 0.0f;
        ROW_ELEMS(j, t + 1) dot += arow[j] * drow[j];
        dot = block_sum<BLOCK_THREADS>(dot, sh);
        if (ds16) {
            uint16_t *row16 = ds16 + r * ld;
            ROW_ELEMS(j, ld) row16[j] = j <= t ? dp_bf16_round(scale * arow[j] * (drow[j] - dot)) : 0;
        } else {
            ROW_ELEMS(j, ld) drow[j] = j <= t ? scale * arow[j] * (drow[j] - dot) : 0.0f;
        }
    }
}

/* A cross-entropy row's element as float (bfloat16 widened, exactly), and
 * a float stored to one (bfloat16 rounded once, kernels/bf16.h); for float
 * rows plain loads and stores, so the float kernel is the code it was. */
__device__ __forceinline__ float ce_load(const float *x, size_t v) { return x[v]; }
__device__ __forceinline__ float ce_load(const uint16_t *x, size_t v)
{
    return dp_bf16_widen(x[v]);
}
__device__ __forceinline__ void ce_store(float *x, size_t v, float f) { x[v] = f; }
__device__ __forceinline__ void ce_store(uint16_t *x, size_t v, float f)
{
    x[v] = dp_bf16_round(f);
}

/* Elements of a cross-entropy row that a thread loads before it uses
 * any: its elements v0, v0 + THREADS, ... in the order a one-at-a-time
 * loop takes them, so the sums are the same, but eight loads in flight
 * instead of one. One 2-byte load at a time per thread keeps about 4 KiB
 * in flight per SM, which at HBM's latency is a third of its bandwidth
 * (Little's law); the bfloat16 kernel ran at 28% of it on an H200. */
const unsigned CE_BATCH = 8;

/* xb[k] = row element v0 + k*THREADS widened, k < CE_BATCH; past V: 0 (unused). */
template <unsigned THREADS, typename T>
__device__ __forceinline__ void ce_load_batch(float *xb, const T *x, size_t v0, size_t V)
{
    DP_UNROLL
    for (unsigned k = 0; k < CE_BATCH; k++) {
        size_t v = v0 + k * THREADS;
        xb[k] = v < V ? ce_load(x, v) : 0.0f;
    }
}

/* dp_crossentropy_item, one block per row, in two sweeps over the row
 * instead of three: first each thread's running maximum m_t and its sum
 * s_t of exp(x - m_t) in double, rescaled by exp(m_old - m_new) when the
 * maximum grows (the online softmax normaliser of Milakov & Gimelshein,
 * "Online normalizer calculation for softmax", 2018); the block's maximum
 * M, and the sum of the s_t exp(m_t - M), in fixed trees; then the loss
 * and, in a second sweep, dlogits = dscale (exp(x - M) / S - onehot). The
 * terms are the CPU's exp(x - M) up to the rescale's double rounding, so
 * the loss matches the CPU to its double sum's rounding. With dlogits ==
 * logits (in place) every element is read by the thread that writes it,
 * and x[target] is read by all before any write (the reductions' barriers
 * come between). The first sweep is the same with or without dlogits, so
 * the loss does not depend on whether dlogits is asked for.
 * T = float is dp_crossentropy_item; T = uint16_t (bfloat16 bits) is
 * dp_crossentropy_bf16_item: the same float arithmetic on the widened
 * logits, each dlogits value rounded to bfloat16 once at its store (its
 * in-place safety as above: a thread writes only what it read). */
template <unsigned THREADS, typename T>
__global__ void k_crossentropy_block(float *losses, T *dlogits, const T *logits,
                                     const int32_t *targets, size_t V, float dscale, size_t N)
{
    __shared__ block_scratch<THREADS, float> shf;
    __shared__ block_scratch<THREADS, double> shd;
    BLOCK_ROW_LOOP(r, N)
    {
        const T *x = logits + r * V;
        T *dl = dlogits ? dlogits + r * V : NULL;
        int32_t target = targets[r];
        if (target < 0) {
            if (threadIdx.x == 0) losses[r] = 0.0f;
            if (dl) ROW_ELEMS(v, V) ce_store(dl, v, 0.0f);
            continue;
        }
        float xy = ce_load(x, target);
        float mt = -INFINITY;
        double st = 0.0;
        for (size_t v0 = threadIdx.x; v0 < V; v0 += CE_BATCH * THREADS) {
            float xb[CE_BATCH];
            ce_load_batch<THREADS>(xb, x, v0, V);
            DP_UNROLL
            for (unsigned k = 0; k < CE_BATCH; k++) {
                if (v0 + k * THREADS >= V) break;
                float xv = xb[k];
                if (xv > mt) {
                    st *= exp((double)mt - (double)xv); /* 0 on the first element */
                    mt = xv;
                }
                /* mt is -inf only while every element so far is -inf (or
                 * NaN): a -inf then adds 0, a NaN adds NaN, as on the CPU */
                if (mt != -INFINITY || xv != -INFINITY) st += (double)expf(xv - mt);
            }
        }
        float mx = block_max<THREADS>(mt, shf); /* its barriers order the read of xy before any write */
        /* a thread with only -inf (0) or NaN (NaN) terms passes st as it is */
        double s =
            block_sum<THREADS>(mt == -INFINITY ? st : st * exp((double)mt - (double)mx), shd);
        if (threadIdx.x == 0) losses[r] = (float)(((double)mx - (double)xy) + log(s));
        if (!dl) continue;
        double inv_s = 1.0 / s;
        for (size_t v0 = threadIdx.x; v0 < V; v0 += CE_BATCH * THREADS) {
            float xb[CE_BATCH];
            ce_load_batch<THREADS>(xb, x, v0, V);
            DP_UNROLL
            for (unsigned k = 0; k < CE_BATCH; k++) {
                size_t v = v0 + k * THREADS;
                if (v >= V) break;
                float p = (float)((double)expf(xb[k] - mx) * inv_s);
                ce_store(dl, v, dscale * ((size_t)target == v ? p - 1.0f : p));
            }
        }
    }
}

/* dp_log_softmax_forward_item, one block per row: the maximum, the sum
 * of exp(x - m) in double (fixed trees), then out = (x - m) - log(s) in
 * double, rounded once. In place is safe: each thread writes only the
 * elements it read, after both reductions. */
__global__ void k_log_softmax_forward_block(float *out, const float *inp, size_t C, size_t N)
{
    __shared__ block_scratch<BLOCK_THREADS, float> shf;
    __shared__ block_scratch<BLOCK_THREADS, double> shd;
    BLOCK_ROW_LOOP(r, N)
    {
        const float *x = inp + r * C;
        float mt = -INFINITY;
        ROW_ELEMS(j, C) mt = fmaxf(mt, x[j]);
        float m = block_max<BLOCK_THREADS>(mt, shf);
        double a = 0.0;
        ROW_ELEMS(j, C) a += (double)expf(x[j] - m);
        double ls = log(block_sum<BLOCK_THREADS>(a, shd));
        ROW_ELEMS(j, C) out[r * C + j] = (float)(((double)x[j] - (double)m) - ls);
    }
}

/* dp_log_softmax_backward_item, one block per row: the row sum of dout in
 * double (fixed tree), then dinp = dout - exp(out) * sum. */
__global__ void k_log_softmax_backward_block(float *dinp, const float *out, const float *dout,
                                             size_t C, size_t N)
{
    __shared__ block_scratch<BLOCK_THREADS, double> shd;
    BLOCK_ROW_LOOP(r, N)
    {
        const float *g = dout + r * C, *o = out + r * C;
        double a = 0.0;
        ROW_ELEMS(j, C) a += (double)g[j];
        double sum = block_sum<BLOCK_THREADS>(a, shd);
        ROW_ELEMS(j, C) dinp[r * C + j] = (float)((double)g[j] - (double)expf(o[j]) * sum);
    }
}

/* dp_zero_ignored_rows_item (T = float) and _bf16_item (T = uint16_t,
 * bfloat16 +0 is 0), one block per row: the row's valid target elements
 * counted (a fixed tree), then the row zeroed when there are none. */
template <typename T>
__global__ void k_zero_ignored_rows_block(T *x, const void *targets, int f32, size_t per,
                                          size_t cols, size_t N)
{
    __shared__ block_scratch<BLOCK_THREADS, unsigned> sh;
    BLOCK_ROW_LOOP(r, N)
    {
        unsigned valid = 0;
        ROW_ELEMS(t, per) valid += dp_target_is_valid(targets, f32, r * per + t) ? 1u : 0u;
        if (block_sum<BLOCK_THREADS>(valid, sh)) continue;
        ROW_ELEMS(c, cols) x[r * cols + c] = (T)0;
    }
}

#endif /* DP_CUDA_ROWS_CUH */
