/*
 * backend/cuda/cuda_rows.cu - the launchers of the CUDA backend's
 * block-per-row kernels, whose device code is cuda_rows.cuh: the
 * ROW_BLOCK ops of kernels/ops.h (LayerNorm, with a bfloat16 output and
 * with the residual's update, causal softmax, cross-entropy over float32
 * or bfloat16 logits, log-softmax, the zeroing of ignored rows, float32
 * or bfloat16), written against the DP_HD item functions' semantics
 * (cuda_kernels.cu has the other kernels; docs/design.md section 3).
 */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_kernels.h" /* and kernels/ops.h with the kernel headers */
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_rows.cuh"

/* Rows per launch are capped like every grid; blocks loop over the rest. */
static unsigned row_blocks(size_t rows)
{
    return (unsigned)(rows < DP_MAX_BLOCKS ? rows : DP_MAX_BLOCKS);
}

/* DP_CUDA_ROW_WARPS=0 runs every LayerNorm row a block per row, where
 * rows of up to LN_VALS * BLOCK_THREADS elements take a warp each (the
 * same bits; for comparison). Read at each launch, so that a test can run
 * both in one process; no caller sets it while kernels launch. */
static bool row_warps_on(void)
{
    const char *e = getenv("DP_CUDA_ROW_WARPS");
    return !(e && strcmp(e, "0") == 0);
}

/* Rows of C elements a warp each, or 0: a block each. */
static size_t row_warp_vals(size_t C)
{
    size_t kv = (C + BLOCK_THREADS - 1) / BLOCK_THREADS;
    return kv <= LN_VALS && row_warps_on() ? kv : 0;
}

/* Warps a block for rows a warp each: the kernels need none together
 * (no barrier, no shared memory), and at 96 registers a thread (C = 768)
 * an SM holds 20 warps in blocks of 4, 16 in blocks of 8. */
const unsigned WARP_ROWS_PER_BLOCK = 4;

/* Blocks of WARP_ROWS_PER_BLOCK warps for rows a warp each, capped like
 * every grid. */
static unsigned warp_row_blocks(size_t rows)
{
    size_t b = (rows + WARP_ROWS_PER_BLOCK - 1) / WARP_ROWS_PER_BLOCK;
    return (unsigned)(b < DP_MAX_BLOCKS ? b : DP_MAX_BLOCKS);
}

/* The LayerNorm forward of every variant: To its output's type; with xw
 * and add the residual's update first. */
template <typename To>
static cudaError_t launch_layernorm_forward(cudaStream_t stream, To *out, float *mean,
                                            float *rstd, const float *inp, dp_pref weight,
                                            dp_pref bias, size_t C, float eps, size_t n,
                                            float *xw, const float *add)
{
    if (n == 0 || C == 0) return cudaSuccess;
    const unsigned g = warp_row_blocks(n), t = BLOCK_THREADS, tw = 32 * WARP_ROWS_PER_BLOCK;
    launch_by_vals(
        row_warp_vals(C),
        [&](auto kv) {
            k_layernorm_forward_warp<decltype(kv)::value, To>
                <<<g, tw, 0, stream>>>(out, mean, rstd, inp, weight, bias, C, eps, n, xw, add);
        },
        [&] {
            k_layernorm_forward_block<To><<<row_blocks(n), t, 0, stream>>>(
                out, mean, rstd, inp, weight, bias, C, eps, n, xw, add);
        });
    return cudaGetLastError();
}

extern "C" cudaError_t dp_cuda_launch_layernorm_forward(cudaStream_t stream, float *out,
                                                        float *mean, float *rstd,
                                                        const float *inp, dp_pref weight,
                                                        dp_pref bias, size_t C, float eps,
                                                        size_t n)
{
    return launch_layernorm_forward(stream, out, mean, rstd, inp, weight, bias, C, eps, n,
                                    (float *)NULL, (const float *)NULL);
}

extern "C" cudaError_t dp_cuda_launch_residual_layernorm_forward(
    cudaStream_t stream, float *out, uint16_t *out16, float *mean, float *rstd, float *x,
    const float *add, dp_pref weight, dp_pref bias, size_t C, float eps, size_t n)
{
    if (out16)
        return launch_layernorm_forward(stream, out16, mean, rstd, x, weight, bias, C, eps, n, x,
                                        add);
    return launch_layernorm_forward(stream, out, mean, rstd, x, weight, bias, C, eps, n, x, add);
}

extern "C" cudaError_t dp_cuda_launch_layernorm_forward_bf16_out(cudaStream_t stream,
                                                                 uint16_t *out, float *mean,
                                                                 float *rstd, const float *inp,
                                                                 dp_pref weight, dp_pref bias,
                                                                 size_t C, float eps, size_t n)
{
    return launch_layernorm_forward(stream, out, mean, rstd, inp, weight, bias, C, eps, n,
                                    (float *)NULL, (const float *)NULL);
}

extern "C" cudaError_t dp_cuda_launch_layernorm_backward_inp(cudaStream_t stream, float *dinp,
                                                             dp_pref dout, const float *inp,
                                                             dp_pref weight, const float *mean,
                                                             const float *rstd, size_t C,
                                                             size_t n)
{
    if (n == 0 || C == 0) return cudaSuccess;
    const unsigned g = warp_row_blocks(n), t = BLOCK_THREADS, tw = 32 * WARP_ROWS_PER_BLOCK;
    launch_by_vals(
        row_warp_vals(C),
        [&](auto kv) {
            k_layernorm_backward_inp_warp<decltype(kv)::value>
                <<<g, tw, 0, stream>>>(dinp, dout, inp, weight, mean, rstd, C, n);
        },
        [&] {
            k_layernorm_backward_inp_block<<<row_blocks(n), t, 0, stream>>>(
                dinp, dout, inp, weight, mean, rstd, C, n);
        });
    return cudaGetLastError();
}

extern "C" cudaError_t dp_cuda_launch_softmax_causal_backward(cudaStream_t stream, float *datt,
                                                              uint16_t *ds16, const float *att,
                                                              float scale, size_t ld, size_t q0,
                                                              size_t nq, size_t n)
{
    if (n == 0 || ld == 0 || nq == 0) return cudaSuccess;
    k_softmax_causal_backward_block<<<row_blocks(n), BLOCK_THREADS, 0, stream>>>(
        datt, ds16, att, scale, ld, q0, nq, n);
    return cudaGetLastError();
}

extern "C" cudaError_t dp_cuda_launch_softmax_causal_forward(cudaStream_t stream, float *att,
                                                             uint16_t *att16, float scale,
                                                             size_t ld, size_t q0, size_t nq,
                                                             size_t n)
{
    if (n == 0 || ld == 0 || nq == 0) return cudaSuccess;
    k_softmax_causal_forward_block<<<row_blocks(n), BLOCK_THREADS, 0, stream>>>(
        att, att16, scale, ld, q0, nq, n);
    return cudaGetLastError();
}

/* The cross-entropy over float rows: long rows get CE_THREADS. */
extern "C" cudaError_t dp_cuda_launch_crossentropy(cudaStream_t stream, float *losses,
                                                   float *dlogits, const float *logits,
                                                   const int32_t *targets, size_t V,
                                                   float dscale, size_t n)
{
    if (n == 0 || V == 0) return cudaSuccess;
    if (V >= CE_LONG_ROW)
        k_crossentropy_block<CE_THREADS><<<row_blocks(n), CE_THREADS, 0, stream>>>(
            losses, dlogits, logits, targets, V, dscale, n);
    else
        k_crossentropy_block<BLOCK_THREADS><<<row_blocks(n), BLOCK_THREADS, 0, stream>>>(
            losses, dlogits, logits, targets, V, dscale, n);
    return cudaGetLastError();
}

/* The cross-entropy over bfloat16 rows: rows of a group a thread or more
 * get CE_THREADS. */
extern "C" cudaError_t dp_cuda_launch_crossentropy_bf16(cudaStream_t stream, float *losses,
                                                        uint16_t *dlogits,
                                                        const uint16_t *logits,
                                                        const int32_t *targets, size_t V,
                                                        float dscale, size_t n)
{
    if (n == 0 || V == 0) return cudaSuccess;
    if (V >= CE16_LONG_ROW)
        k_crossentropy_bf16_block<CE_THREADS><<<row_blocks(n), CE_THREADS, 0, stream>>>(
            losses, dlogits, logits, targets, V, dscale, n);
    else
        k_crossentropy_bf16_block<BLOCK_THREADS><<<row_blocks(n), BLOCK_THREADS, 0, stream>>>(
            losses, dlogits, logits, targets, V, dscale, n);
    return cudaGetLastError();
}

extern "C" cudaError_t dp_cuda_launch_log_softmax_forward(cudaStream_t stream, float *out,
                                                          const float *inp, size_t C, size_t n)
{
    if (n == 0 || C == 0) return cudaSuccess;
    k_log_softmax_forward_block<<<row_blocks(n), BLOCK_THREADS, 0, stream>>>(out, inp, C, n);
    return cudaGetLastError();
}

extern "C" cudaError_t dp_cuda_launch_log_softmax_backward(cudaStream_t stream, float *dinp,
                                                           const float *out, const float *dout,
                                                           size_t C, size_t n)
{
    if (n == 0 || C == 0) return cudaSuccess;
    k_log_softmax_backward_block<<<row_blocks(n), BLOCK_THREADS, 0, stream>>>(dinp, out, dout,
                                                                              C, n);
    return cudaGetLastError();
}

extern "C" cudaError_t dp_cuda_launch_zero_ignored_rows(cudaStream_t stream, float *x,
                                                        const void *targets, int f32, size_t per,
                                                        size_t cols, size_t n)
{
    if (n == 0 || cols == 0 || per == 0) return cudaSuccess;
    k_zero_ignored_rows_block<float><<<row_blocks(n), BLOCK_THREADS, 0, stream>>>(
        x, targets, f32, per, cols, n);
    return cudaGetLastError();
}

extern "C" cudaError_t dp_cuda_launch_zero_ignored_rows_bf16(cudaStream_t stream, uint16_t *x,
                                                             const void *targets, int f32,
                                                             size_t per, size_t cols, size_t n)
{
    if (n == 0 || cols == 0 || per == 0) return cudaSuccess;
    k_zero_ignored_rows_block<uint16_t><<<row_blocks(n), BLOCK_THREADS, 0, stream>>>(
        x, targets, f32, per, cols, n);
    return cudaGetLastError();
}
