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

/*
 * A warp per row for the LayerNorm rows of up to LN_VALS * BLOCK_THREADS
 * elements: the warp plays the block of BLOCK_THREADS threads, lane l
 * being its threads l, 32 + l, ..., 32 (VWARPS - 1) + l, each with the
 * elements and the partial sums that thread had, and warp_block_reduce
 * repeats block_reduce's tree shuffle for shuffle. So the sums, and every
 * bit, are the block kernels', without a barrier or shared memory: a block
 * per row waited on four barriers between its loads and its stores, with
 * 8 rows an SM in flight (on an H200 GPT-2 small's LayerNorm forward ran
 * at about a quarter of HBM's bandwidth), where a warp per row lets 64.
 */
const unsigned LN_VALS = 4;
const unsigned VWARPS = BLOCK_THREADS / 32;

/* launch(vals<KV>()) for kv = KV in 1..LN_VALS, else block(): a warp
 * kernel's instance for rows of up to kv elements a block thread (host
 * code, the launchers' and the emulator tests'). */
template <unsigned KV> struct vals {
    static const unsigned value = KV;
};
template <typename W, typename B> void launch_by_vals(size_t kv, W launch, B block)
{
    static_assert(LN_VALS == 4, "a case per LN_VALS");
    switch (kv) {
    case 1: launch(vals<1>()); break;
    case 2: launch(vals<2>()); break;
    case 3: launch(vals<3>()); break;
    case 4: launch(vals<4>()); break;
    default: block();
    }
}

/* block_reduce<BLOCK_THREADS>'s result, p[w] being this lane's partial as
 * thread 32 w + lane: each warp's shuffle-down tree, then warp 0's over
 * the warps' sums (lanes from VWARPS on the identity); every lane gets it. */
template <typename Tv, typename Op>
__device__ Tv warp_block_reduce(Tv p[VWARPS], Tv identity, Op op)
{
    const unsigned lane = threadIdx.x % 32;
    DP_UNROLL
    for (unsigned w = 0; w < VWARPS; w++)
        for (int off = 16; off > 0; off /= 2)
            p[w] = op(p[w], __shfl_down_sync(0xffffffffu, p[w], off));
    Tv v = identity;
    DP_UNROLL
    for (unsigned w = 0; w < VWARPS; w++) {
        Tv t = __shfl_sync(0xffffffffu, p[w], 0);
        if (lane == w) v = t;
    }
    for (int off = 16; off > 0; off /= 2) v = op(v, __shfl_down_sync(0xffffffffu, v, off));
    return __shfl_sync(0xffffffffu, v, 0);
}

/* Warp-per-row loops: row r for each warp of the grid. */
#define WARP_ROW_LOOP(r, rows)                                                                 \
    for (size_t r = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; r < (rows);    \
         r += (size_t)gridDim.x * (blockDim.x / 32))
/* The column of element k of the block thread 32 w + lane. */
#define WARP_ROW_COL(w, k) ((size_t)(w) * 32 + threadIdx.x % 32 + (size_t)(k) * BLOCK_THREADS)

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
 * that reads it below, and the barrier makes the row whole for all. Rows
 * of up to LN_VALS * BLOCK_THREADS elements run k_layernorm_forward_warp
 * instead, with the same bits. */
template <typename To>
__global__ void k_layernorm_forward_block(To *out, float *mean, float *rstd, const float *inp,
                                          dp_pref weight, dp_pref bias, size_t C, float eps,
                                          size_t N, float *xw, const float *add)
{
    __shared__ block_scratch<BLOCK_THREADS, float> sh;
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

/* k_layernorm_forward_block for rows of C <= KV * BLOCK_THREADS, a warp
 * per row (KV <= LN_VALS): the row in registers, the block's sums. */
template <unsigned KV, typename To>
__global__ void k_layernorm_forward_warp(To *out, float *mean, float *rstd, const float *inp,
                                         dp_pref weight, dp_pref bias, size_t C, float eps,
                                         size_t N, float *xw, const float *add)
{
    WARP_ROW_LOOP(r, N)
    {
        const float *x = inp + r * C;
        float v[VWARPS][KV];
        DP_UNROLL
        for (unsigned w = 0; w < VWARPS; w++)
            DP_UNROLL
            for (unsigned k = 0; k < KV; k++) {
                const size_t c = WARP_ROW_COL(w, k);
                v[w][k] = c < C ? (add ? xw[r * C + c] + add[r * C + c] : x[c]) : 0.0f;
            }
        float p[VWARPS];
        DP_UNROLL
        for (unsigned w = 0; w < VWARPS; w++) {
            p[w] = 0.0f;
            DP_UNROLL
            for (unsigned k = 0; k < KV; k++) {
                const size_t c = WARP_ROW_COL(w, k);
                if (c >= C) continue;
                if (add) xw[r * C + c] = v[w][k];
                p[w] += v[w][k];
            }
        }
        float m = warp_block_reduce(p, 0.0f, add_op()) / (float)C;
        DP_UNROLL
        for (unsigned w = 0; w < VWARPS; w++) {
            p[w] = 0.0f;
            DP_UNROLL
            for (unsigned k = 0; k < KV; k++)
                if (WARP_ROW_COL(w, k) < C) {
                    float d = v[w][k] - m;
                    p[w] += d * d;
                }
        }
        float s = 1.0f / sqrtf(warp_block_reduce(p, 0.0f, add_op()) / (float)C + eps);
        DP_UNROLL
        for (unsigned w = 0; w < VWARPS; w++)
            DP_UNROLL
            for (unsigned k = 0; k < KV; k++) {
                const size_t c = WARP_ROW_COL(w, k);
                if (c < C)
                    ln_store(out, r * C + c, dp_layernorm_out(v[w][k], m, s, weight, bias, c));
            }
        if (threadIdx.x % 32 == 0) {
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
 * float32 or bfloat16 (widened as it is read). Rows of up to LN_VALS *
 * BLOCK_THREADS elements run k_layernorm_backward_inp_warp instead, with
 * the same bits. */
__global__ void k_layernorm_backward_inp_block(float *dinp, dp_pref dout, const float *inp,
                                               dp_pref weight, const float *mean,
                                               const float *rstd, size_t C, size_t N)
{
    __shared__ block_scratch<BLOCK_THREADS, float> sh;
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

/* k_layernorm_backward_inp_block for rows of C <= KV * BLOCK_THREADS, a
 * warp per row (KV <= LN_VALS): g * weight and inp in registers, the
 * block's sums; dinp read when it is written. */
template <unsigned KV>
__global__ void k_layernorm_backward_inp_warp(float *dinp, dp_pref dout, const float *inp,
                                              dp_pref weight, const float *mean,
                                              const float *rstd, size_t C, size_t N)
{
    WARP_ROW_LOOP(r, N)
    {
        const dp_pref g = dp_pref_offset(dout, r * C);
        const float *x = inp + r * C;
        float gw[VWARPS][KV], xv[VWARPS][KV];
        DP_UNROLL
        for (unsigned w = 0; w < VWARPS; w++)
            DP_UNROLL
            for (unsigned k = 0; k < KV; k++) {
                const size_t c = WARP_ROW_COL(w, k);
                gw[w][k] = c < C ? dp_pref_at(g, c) * dp_pref_at(weight, c) : 0.0f;
                xv[w][k] = c < C ? x[c] : 0.0f;
            }
        const float m = mean[r], s = rstd[r];
        float a[VWARPS], b[VWARPS];
        DP_UNROLL
        for (unsigned w = 0; w < VWARPS; w++) {
            a[w] = 0.0f, b[w] = 0.0f;
            DP_UNROLL
            for (unsigned k = 0; k < KV; k++)
                if (WARP_ROW_COL(w, k) < C) {
                    a[w] += gw[w][k];
                    b[w] += gw[w][k] * (xv[w][k] - m) * s;
                }
        }
        float g_mean = warp_block_reduce(a, 0.0f, add_op()) / (float)C;
        float gx_mean = warp_block_reduce(b, 0.0f, add_op()) / (float)C;
        DP_UNROLL
        for (unsigned w = 0; w < VWARPS; w++)
            DP_UNROLL
            for (unsigned k = 0; k < KV; k++) {
                const size_t c = WARP_ROW_COL(w, k);
                if (c >= C) continue;
                float xhat = (xv[w][k] - m) * s;
                dinp[r * C + c] += s * (gw[w][k] - g_mean - xhat * gx_mean);
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

/* Elements of a cross-entropy row that a thread loads before it uses
 * any: its elements v0, v0 + THREADS, ... in the order a one-at-a-time
 * loop takes them, so the sums are the same, but eight loads in flight
 * instead of one. One 2-byte load at a time per thread keeps about 4 KiB
 * in flight per SM, which at HBM's latency is a third of its bandwidth
 * (Little's law); the bfloat16 kernel ran at 28% of it on an H200. */
const unsigned CE_BATCH = 8;

/* xb[k] = row element v0 + k*THREADS, k < CE_BATCH; past V: 0 (unused). */
template <unsigned THREADS>
__device__ __forceinline__ void ce_load_batch(float *xb, const float *x, size_t v0, size_t V)
{
    DP_UNROLL
    for (unsigned k = 0; k < CE_BATCH; k++) {
        size_t v = v0 + k * THREADS;
        xb[k] = v < V ? x[v] : 0.0f;
    }
}

/* A cross-entropy row with an ignored target (-1): loss 0 and, unless dl
 * is NULL, a zero dlogits row (0 is bfloat16 +0 too). */
template <typename T> __device__ void ce_ignored_row(float *losses, T *dl, size_t r, size_t V)
{
    if (threadIdx.x == 0) losses[r] = 0.0f;
    if (dl) ROW_ELEMS(v, V) dl[v] = (T)0;
}

/* A row's loss from its maximum mx, its target's logit xy and its sum s
 * of exp(x - mx): (mx - xy) + log s in double, rounded once. */
__device__ __forceinline__ float ce_loss(float mx, float xy, double s)
{
    return (float)(((double)mx - (double)xy) + log(s));
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
 * the loss does not depend on whether dlogits is asked for. Its double
 * arithmetic (a double exp in every rescale, three conversions an
 * element) costs more than the row's memory traffic on GPUs whose
 * double throughput is a fraction of float's; the bfloat16 step's
 * criterion is k_crossentropy_bf16_block below. */
template <unsigned THREADS>
__global__ void k_crossentropy_block(float *losses, float *dlogits, const float *logits,
                                     const int32_t *targets, size_t V, float dscale, size_t N)
{
    __shared__ block_scratch<THREADS, float> shf;
    __shared__ block_scratch<THREADS, double> shd;
    BLOCK_ROW_LOOP(r, N)
    {
        const float *x = logits + r * V;
        float *dl = dlogits ? dlogits + r * V : NULL;
        int32_t target = targets[r];
        if (target < 0) {
            ce_ignored_row(losses, dl, r, V);
            continue;
        }
        float xy = x[target];
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
        if (threadIdx.x == 0) losses[r] = ce_loss(mx, xy, s);
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
                dl[v] = dscale * ((size_t)target == v ? p - 1.0f : p);
            }
        }
    }
}

/*
 * The cross-entropy over bfloat16 logits (dp_crossentropy_bf16_item's
 * contract: float32 losses, bfloat16 dlogits that may overwrite the
 * logits), one block per row in float arithmetic, as llm.c's fused
 * classifier. A thread takes the row's groups of CE16_GROUP consecutive
 * elements g, g + THREADS, ... (16-byte loads where the row is 16-byte
 * aligned; the same values one at a time where it is not, so the bits do
 * not depend on the address), CE16_BATCH groups loaded before it uses
 * any. Its running maximum m_t and float sum s_t of exp(x - m_t) take a
 * group at a time: s_t *= exp(m_old - m_new) when the group's maximum is
 * new, then the group's eight terms added in a fixed pairwise tree (the
 * online softmax normaliser of Milakov & Gimelshein, 2018). The block's
 * maximum M (fixed tree), S = sum of s_t exp(m_t - M) in double (fixed
 * tree), the loss (M - x[y]) + log S in double rounded once, then in a
 * second sweep dlogits = dscale (exp(x - M) (1/S) - onehot) rounded to
 * bfloat16 once. The float kernel above keeps every term in double and
 * spends a double exp on each rescale: on an H200 it took 475 us for a
 * 2048-row chunk of GPT-2's bfloat16 logits, about 3.6x their traffic.
 *
 * The loss is the CPU item's to (16 + 6G) float roundings of S relative,
 * G the groups a thread takes (G = 7 at V = 50304): expf's 2 ulp on
 * each side, a term's rescales (at most G - 1, and the final exp(m_t -
 * M), each an expf and a product), the group tree's 3 and the thread
 * sum's G roundings. tests/test_cuda_ops.c and test_cuda_rows_emu.cpp
 * hold it to that. In place, ignored rows (-1), masked (-inf) and NaN
 * logits as the float kernel: a thread writes only the groups it read,
 * x[y] is read before the first barrier, a -inf term adds 0 (also while
 * m_t is -inf), a NaN makes the loss NaN.
 */
const unsigned CE16_GROUP = 8;
const unsigned CE16_BATCH = 2;
/* Rows from this many elements get CE_THREADS threads (a group each at least). */
const size_t CE16_LONG_ROW = (size_t)CE16_GROUP * CE_THREADS;

/* A group: eight bfloat16 in four words, element 2k in the low half of
 * word k (a 16-byte load's layout on a little-endian GPU). */
struct ce16_group {
    uint32_t w[CE16_GROUP / 2];
};

/* Element k of g widened to float (exact). */
__device__ __forceinline__ float ce16_at(const ce16_group &g, unsigned k)
{
    uint32_t u = g.w[k / 2];
    return dp_f32_of_bits(k % 2 ? u & 0xffff0000u : u << 16);
}

/* The row's elements e0 .. e0 + 7; past V: -inf (0xFF80). */
__device__ __forceinline__ ce16_group ce16_load(const uint16_t *row, size_t e0, size_t V,
                                                bool vec)
{
    ce16_group g;
    if (vec && e0 + CE16_GROUP <= V) {
        const uint4 q = *(const uint4 *)(row + e0);
        g.w[0] = q.x, g.w[1] = q.y, g.w[2] = q.z, g.w[3] = q.w;
        return g;
    }
    DP_UNROLL
    for (unsigned k = 0; k < CE16_GROUP; k += 2) {
        uint32_t lo = e0 + k < V ? row[e0 + k] : 0xFF80u;
        uint32_t hi = e0 + k + 1 < V ? row[e0 + k + 1] : 0xFF80u;
        g.w[k / 2] = lo | hi << 16;
    }
    return g;
}

/* Group g to the row's elements e0 .. (past V: not stored). */
__device__ __forceinline__ void ce16_store(uint16_t *row, const ce16_group &g, size_t e0,
                                           size_t V, bool vec)
{
    if (vec && e0 + CE16_GROUP <= V) {
        *(uint4 *)(row + e0) = make_uint4(g.w[0], g.w[1], g.w[2], g.w[3]);
        return;
    }
    DP_UNROLL
    for (unsigned k = 0; k < CE16_GROUP; k++)
        if (e0 + k < V) row[e0 + k] = (uint16_t)(k % 2 ? g.w[k / 2] >> 16 : g.w[k / 2]);
}

/* A thread's running maximum mt and sum st of exp(x - mt), with group g. */
__device__ __forceinline__ void ce16_accumulate(float &mt, float &st, const ce16_group &g)
{
    float x[CE16_GROUP];
    DP_UNROLL
    for (unsigned k = 0; k < CE16_GROUP; k++) x[k] = ce16_at(g, k);
    /* fmaxf skips a NaN; the NaN still reaches st through its term */
    float gm = fmaxf(fmaxf(fmaxf(x[0], x[1]), fmaxf(x[2], x[3])),
                     fmaxf(fmaxf(x[4], x[5]), fmaxf(x[6], x[7])));
    if (gm > mt) {
        st *= expf(mt - gm); /* while mt is -inf st is 0 (or NaN), and stays so */
        mt = gm;
    }
    float e[CE16_GROUP];
    DP_UNROLL /* -inf - -inf would be NaN: a -inf term is 0 */
    for (unsigned k = 0; k < CE16_GROUP; k++) e[k] = x[k] == -INFINITY ? 0.0f : expf(x[k] - mt);
    st += ((e[0] + e[1]) + (e[2] + e[3])) + ((e[4] + e[5]) + (e[6] + e[7]));
}

/* Group g's dlogits, in place: dscale (exp(x - mx) inv - [v == target]). */
__device__ __forceinline__ void ce16_dlogits(ce16_group &g, size_t e0, size_t target, float mx,
                                             float inv, float dscale)
{
    DP_UNROLL
    for (unsigned k = 0; k < CE16_GROUP; k += 2) {
        float p0 = expf(ce16_at(g, k) - mx) * inv, p1 = expf(ce16_at(g, k + 1) - mx) * inv;
        uint32_t lo = dp_bf16_round_nb(dscale * (e0 + k == target ? p0 - 1.0f : p0));
        uint32_t hi = dp_bf16_round_nb(dscale * (e0 + k + 1 == target ? p1 - 1.0f : p1));
        g.w[k / 2] = lo | hi << 16;
    }
}

/* A thread's batches over the row: g0 the batch's first group; group
 * g0 + b * THREADS (b < CE16_BATCH) starts at element CE16_FIRST, in the
 * row while that is below V. */
#define CE16_BATCHES(g0, V)                                                                 \
    for (size_t g0 = threadIdx.x; g0 * CE16_GROUP < (V); g0 += (size_t)CE16_BATCH * THREADS)
#define CE16_FIRST(g0, b) (((g0) + (size_t)(b) * THREADS) * CE16_GROUP)

/* The batch's groups of the row, all loads issued before any is used
 * (groups past the row: unset, never used). */
template <unsigned THREADS>
__device__ __forceinline__ void ce16_load_batch(ce16_group h[CE16_BATCH], const uint16_t *x,
                                                size_t g0, size_t V, bool vec)
{
    DP_UNROLL
    for (unsigned b = 0; b < CE16_BATCH; b++)
        if (CE16_FIRST(g0, b) < V) h[b] = ce16_load(x, CE16_FIRST(g0, b), V, vec);
}

template <unsigned THREADS>
__global__ void __launch_bounds__(THREADS)
    k_crossentropy_bf16_block(float *losses, uint16_t *dlogits, const uint16_t *logits,
                              const int32_t *targets, size_t V, float dscale, size_t N)
{
    __shared__ block_scratch<THREADS, float> shf;
    __shared__ block_scratch<THREADS, double> shd;
    BLOCK_ROW_LOOP(r, N)
    {
        const uint16_t *x = logits + r * V;
        uint16_t *dl = dlogits ? dlogits + r * V : NULL;
        const bool vec = (uintptr_t)x % 16 == 0 && (!dl || (uintptr_t)dl % 16 == 0);
        int32_t target = targets[r];
        if (target < 0) {
            ce_ignored_row(losses, dl, r, V);
            continue;
        }
        float xy = dp_bf16_widen(x[target]);
        float mt = -INFINITY, st = 0.0f;
        CE16_BATCHES(g0, V)
        {
            ce16_group h[CE16_BATCH] = {};
            ce16_load_batch<THREADS>(h, x, g0, V, vec);
            DP_UNROLL
            for (unsigned b = 0; b < CE16_BATCH; b++)
                if (CE16_FIRST(g0, b) < V) ce16_accumulate(mt, st, h[b]);
        }
        /* block_max's barriers order the read of xy before any write */
        float mx = block_max<THREADS>(mt, shf);
        /* a thread with only -inf (0) or NaN (NaN) terms passes st as it is */
        double s = block_sum<THREADS>(mt == -INFINITY ? (double)st : (double)(st * expf(mt - mx)),
                                      shd);
        if (threadIdx.x == 0) losses[r] = ce_loss(mx, xy, s);
        if (!dl) continue;
        const float inv = (float)(1.0 / s);
        CE16_BATCHES(g0, V)
        {
            ce16_group h[CE16_BATCH] = {};
            ce16_load_batch<THREADS>(h, x, g0, V, vec);
            DP_UNROLL
            for (unsigned b = 0; b < CE16_BATCH; b++) {
                const size_t e0 = CE16_FIRST(g0, b);
                if (e0 >= V) break;
                ce16_dlogits(h[b], e0, (size_t)target, mx, inv, dscale);
                ce16_store(dl, h[b], e0, V, vec);
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
