/*
 * backend/cuda/cuda_compute.c - the CUDA backend's GEMM through cuBLAS
 * (bf16 operands converted in bounded pieces, backend/gemm_pieces.h) and
 * its kernel entries, each a launcher of cuda_kernels.h on the device's
 * stream (cuda_internal.h).
 */
#include "backend/cuda/cuda_internal.h"

// --- GEMM --------------------------------------------------------------------------------------

/* A piece's block of an operand converted densely into dst on the stream:
 * float32 rounded to bfloat16 (to_bf16), or bfloat16 widened. */
static cudaError_t convert_block(cudaStream_t s, void *dst, const dp_gemm_arg *a,
                                 const dp_gemm_block *b, int to_bf16)
{
    dp_block kb = {b->off, (size_t)a->ld, (size_t)a->stride, (size_t)b->rows, (size_t)b->cols};
    size_t n = (size_t)b->count * (size_t)b->rows * (size_t)b->cols;
    return to_bf16 ? dp_cuda_launch_pack_f32_bf16(s, dst, a->p, kb, n)
                   : dp_cuda_launch_pack_bf16_f32(s, dst, a->p, kb, n);
}

static size_t round256(size_t bytes) { return (bytes + 255) / 256 * 256; }

/* The operands in the math's type (c->mu held): a float32 operand rounded
 * to bfloat16 for BF16 math, a bfloat16 one widened for float32 math, into
 * c->cvt; then cuBLAS with bfloat16 operands and float32 compute
 * (tensor cores), or its float32 GEMM. Past the device's conversion cap
 * the GEMM runs in pieces (backend/gemm_pieces.h), each converting only
 * its blocks; the stream orders each piece's conversion after the last
 * piece's GEMM has read the scratch. */
static dp_status gemm_converted_locked(dp_device *dev, cuda_ctx *c, cublasOperation_t ta,
                                       cublasOperation_t tb, dp_op opa, dp_op opb, int m, int n,
                                       int k, float alpha, const dp_gemm_arg *A,
                                       const dp_gemm_arg *B, float beta, float *C, int ldc,
                                       long long sC, int batch, int bf16)
{
    size_t esize = bf16 ? 2 : 4, ea = A->bf16 ? 2 : 4, eb = B->bf16 ? 2 : 4;
    int conv_a = bf16 ? !A->bf16 : A->bf16, conv_b = bf16 ? !B->bf16 : B->bf16;
    size_t cap = dev->gemm_convert_cap ? dev->gemm_convert_cap : DP_GEMM_CONVERT_CAP;
    dp_gemm_plan p = dp_gemm_plan_pieces(m, n, k, batch, conv_a, conv_b, esize, cap);
    size_t a_bytes = round256(dp_gemm_piece_bytes(conv_a, 0, esize, p.mb, p.nb, p.kb, p.g));
    size_t b_bytes = round256(dp_gemm_piece_bytes(0, conv_b, esize, p.mb, p.nb, p.kb, p.g));
    DP_TRY(dp_cuda_grow_scratch(dev, c, &c->cvt, &c->cvt_bytes, a_bytes + b_bytes));
    unsigned char *sa = c->cvt, *sb = (unsigned char *)c->cvt + a_bytes;
    dp_gemm_piece pc = dp_gemm_piece_first(&p, m, n, k, batch, beta);
    dp_gemm_arg pa = {0};
    do {
        if (pc.new_a) {
            dp_gemm_block ba = dp_gemm_block_a(A, opa, pc.b0, pc.g, pc.i0, pc.mb, pc.l0, pc.kb);
            if (conv_a) CU_TRY(dev, convert_block(c->stream, sa, A, &ba, bf16));
            pa = dp_gemm_block_arg(A, &ba, conv_a ? sa : NULL, bf16, ea);
        }
        dp_gemm_block bb = dp_gemm_block_b(B, opb, pc.b0, pc.g, pc.j0, pc.nb, pc.l0, pc.kb);
        if (conv_b) CU_TRY(dev, convert_block(c->stream, sb, B, &bb, bf16));
        dp_gemm_arg pb = dp_gemm_block_arg(B, &bb, conv_b ? sb : NULL, bf16, eb);
        float *Cp = C + (size_t)pc.b0 * (size_t)sC + (size_t)pc.i0 + (size_t)pc.j0 * (size_t)ldc;
        if (bf16)
            BLAS_TRY(dev, cublasGemmStridedBatchedEx(
                              c->blas, ta, tb, pc.mb, pc.nb, pc.kb, &alpha, pa.p, CUDA_R_16BF,
                              pa.ld, pa.stride, pb.p, CUDA_R_16BF, pb.ld, pb.stride, &pc.beta, Cp,
                              CUDA_R_32F, ldc, sC, pc.g, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        else
            BLAS_TRY(dev, cublasSgemmStridedBatched(c->blas, ta, tb, pc.mb, pc.nb, pc.kb, &alpha,
                                                    pa.p, pa.ld, pa.stride, pb.p, pb.ld, pb.stride,
                                                    &pc.beta, Cp, ldc, sC, pc.g));
    } while (dp_gemm_piece_next(&pc, &p, m, n, k, batch, beta));
    return DP_OK;
}

dp_status dp_cuda_gemm(dp_device *dev, dp_op transa, dp_op transb, int m, int n, int k, float alpha,
                       const dp_gemm_arg *A, const dp_gemm_arg *B, float beta, float *C, int ldc,
                       long long strideC, int batch) {
    ENTER(dev);
    cuda_ctx *c = CTX(dev);
    if (k == 0) {
        /* C = beta C exactly as the CPU backend does (A and B may be NULL). */
        CU_TRY(dev, dp_cuda_launch_gemm_scale_c(c->stream, C, m, n, ldc, strideC, batch, beta));
        return DP_OK;
    }
    cublasOperation_t ta = transa == DP_OP_T ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = transb == DP_OP_T ? CUBLAS_OP_T : CUBLAS_OP_N;
    int bf16 = dev->matmul == DP_MATMUL_BF16;
    if (bf16 || A->bf16 || B->bf16) {
        pthread_mutex_lock(&c->mu);
        dp_status s = gemm_converted_locked(dev, c, ta, tb, transa, transb, m, n, k, alpha, A, B,
                                            beta, C, ldc, strideC, batch, bf16);
        pthread_mutex_unlock(&c->mu);
        return s;
    }
    /* Column-major with host-side alpha and beta: the convention of
     * dp_gemm, so the arguments pass through unchanged. */
    const float *pa = A->p, *pb = B->p;
    if (batch == 1)
        BLAS_TRY(dev, cublasSgemm(c->blas, ta, tb, m, n, k, &alpha, pa, A->ld, pb, B->ld, &beta, C,
                                  ldc));
    else
        BLAS_TRY(dev, cublasSgemmStridedBatched(c->blas, ta, tb, m, n, k, &alpha, pa, A->ld,
                                                A->stride, pb, B->ld, B->stride, &beta, C, ldc,
                                                strideC, batch));
    return DP_OK;
}

// --- kernels -------------------------------------------------------------------------------------

/* Enqueues a launcher (cuda_kernels.h) on dev's stream. */
#define LAUNCH(dev, launcher, ...)                                 \
    do {                                                           \
        ENTER(dev);                                                \
        CU_TRY(dev, launcher(CTX(dev)->stream, __VA_ARGS__));      \
        return DP_OK;                                              \
    } while (0)

/* The element-wise and row-wise ops of kernels/ops.h: one entry each. */
#define CUDA_OP(name, shape, fn, params, args)                                   \
    dp_status dp_cuda_##name(dp_device *dev, DP_UNPAREN params, size_t n)         \
    {                                                                            \
        LAUNCH(dev, dp_cuda_launch_##name, DP_UNPAREN args, n);                  \
    }
DP_KERNEL_OPS(CUDA_OP)
#undef CUDA_OP

/* Device scratch *buf of *cap bytes grown to at least `bytes` (c->mu
 * held): the column reductions' partials, the embedding backward's token
 * groups. Its bytes are reserved memory, so growing it respects the
 * device's limit. */
dp_status dp_cuda_grow_scratch(dp_device *dev, cuda_ctx *c, void **buf, size_t *cap, size_t bytes) {
    if (bytes <= *cap)
        return DP_OK;
    /* A recording names the old buffer (cuda_graph.c). */
    DP_TRY(dp_device_refuse_recording(dev, "a scratch buffer that grows"));
    if (bytes > SIZE_MAX / 2)
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "%s: %zu scratch bytes overflow", dev->name, bytes);
    bytes = (bytes + ((size_t)64 << 10) - 1) / ((size_t)64 << 10) * ((size_t)64 << 10);
    pthread_mutex_lock(&dev->mu);
    size_t grow = bytes - *cap, used = dev->in_use + dev->reserved, limit = dev->limit;
    pthread_mutex_unlock(&dev->mu);
    if (limit && (used > limit || grow > limit - used))
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY,
                       "%s: a kernel's scratch buffer needs %zu more bytes, which would "
                       "pass the memory limit (%zu bytes in use and reserved, limit %zu "
                       "bytes); use a smaller batch or a higher limit (dp_device_set_limit; "
                       "dp_engine_config.memory_limit)",
                       dev->name, grow, used, limit);
    /* Kernels queued on the stream may still read the old buffer. */
    CU_TRY(dev, cudaStreamSynchronize(c->stream));
    if (*buf) CU_TRY(dev, cudaFree(*buf));
    pthread_mutex_lock(&dev->mu);
    dev->reserved -= *cap;
    pthread_mutex_unlock(&dev->mu);
    *buf = NULL;
    *cap = 0;
    c->epoch++; /* graphs recorded before name the freed buffer */
    CU_TRY(dev, cudaMalloc(buf, bytes));
    *cap = bytes;
    pthread_mutex_lock(&dev->mu);
    dev->reserved += bytes;
    pthread_mutex_unlock(&dev->mu);
    return DP_OK;
}

/* The rows grouped by token on the device (cuda_group.cu), into the
 * scratch c->grp, then one thread per (sorted row, channel)
 * (kernels/encoder.h). Nothing waits for the device. */
static dp_status encoder_backward_locked(dp_device *dev, cuda_ctx *c, float *dwte, float *dwpe,
                                         const float *dout, const int32_t *inp, size_t B,
                                         size_t T, size_t C)
{
    size_t BT = B * T, bytes = 0;
    CU_TRY(dev, dp_cuda_encoder_group_bytes(BT, &bytes));
    DP_TRY(dp_cuda_grow_scratch(dev, c, &c->grp, &c->grp_bytes, bytes));
    uint32_t *keys = NULL, *order = NULL;
    CU_TRY(dev,
           dp_cuda_launch_encoder_group(c->stream, c->grp, bytes, inp, BT, &keys, &order));
    CU_TRY(dev, dp_cuda_launch_encoder_backward(c->stream, dwte, dwpe, dout, keys, order, B, T,
                                                C));
    return DP_OK;
}

dp_status dp_cuda_encoder_backward(dp_device *dev, float *dwte, float *dwpe, const float *dout,
                                   const int32_t *inp, size_t B, size_t T, size_t C) {
    ENTER(dev);
    size_t BT = B * T;
    if (BT >= UINT32_MAX / 4)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: B*T = %zu rows; the embedding backward "
                       "takes fewer than 2^30 rows; split the batch", dev->name, BT);
    if (BT == 0 || C == 0) return DP_OK;
    cuda_ctx *c = CTX(dev);
    pthread_mutex_lock(&c->mu); /* the scratch is shared by concurrent callers */
    dp_status s = encoder_backward_locked(dev, c, dwte, dwpe, dout, inp, B, T, C);
    pthread_mutex_unlock(&c->mu);
    return s;
}

dp_status dp_cuda_bias_broadcast(dp_device *dev, float *out, dp_pref bias, size_t N, size_t OC) {
    LAUNCH(dev, dp_cuda_launch_bias_broadcast, out, bias, N, OC);
}

/* The column reductions' scratch: partial_bytes of partials and the
 * tickets of `cols` columns, zeroed when they are (re)allocated (each
 * launch leaves them 0). */
static dp_status col_scratch(dp_device *dev, cuda_ctx *c, size_t partial_bytes, size_t cols,
                             unsigned **tickets)
{
    DP_TRY(dp_cuda_grow_scratch(dev, c, (void **)&c->col, &c->col_bytes, partial_bytes));
    size_t had = c->tickets_bytes;
    DP_TRY(dp_cuda_grow_scratch(dev, c, &c->tickets, &c->tickets_bytes,
                                dp_cuda_col_tiles(cols) * sizeof(unsigned)));
    if (c->tickets_bytes != had)
        CU_TRY(dev, cudaMemsetAsync(c->tickets, 0, c->tickets_bytes, c->stream));
    *tickets = c->tickets;
    return DP_OK;
}

static dp_status bias_backward_locked(dp_device *dev, cuda_ctx *c, float *dbias,
                                      uint16_t *dout16, dp_pref dout, size_t N, size_t OC)
{
    unsigned *tickets = NULL;
    DP_TRY(col_scratch(dev, c, dp_col_chunks(N) * OC * sizeof(float), OC, &tickets));
    CU_TRY(dev, dp_cuda_launch_bias_backward(c->stream, dbias, c->col, tickets, dout16, dout, N,
                                             OC));
    return DP_OK;
}

dp_status dp_cuda_bias_backward(dp_device *dev, float *dbias, uint16_t *dout16, dp_pref dout,
                                size_t N, size_t OC) {
    ENTER(dev);
    cuda_ctx *c = CTX(dev);
    pthread_mutex_lock(&c->mu); /* the scratch is shared by concurrent callers */
    dp_status s = bias_backward_locked(dev, c, dbias, dout16, dout, N, OC);
    pthread_mutex_unlock(&c->mu);
    return s;
}

static dp_status layernorm_params_locked(dp_device *dev, cuda_ctx *c, float *dweight,
                                         float *dbias, dp_pref dout, const float *inp,
                                         const float *mean, const float *rstd, size_t N,
                                         size_t C)
{
    unsigned *tickets = NULL;
    /* Products of sizes the public wrapper has checked to fit (N*C floats). */
    DP_TRY(col_scratch(dev, c, 2 * dp_col_chunks(N) * C * sizeof(float), C, &tickets));
    CU_TRY(dev, dp_cuda_launch_layernorm_backward_params(c->stream, dweight, dbias, c->col,
                                                         tickets, dout, inp, mean, rstd, N, C));
    return DP_OK;
}

dp_status dp_cuda_layernorm_backward_params(dp_device *dev, float *dweight, float *dbias,
                                            dp_pref dout, const float *inp, const float *mean,
                                            const float *rstd, size_t N, size_t C) {
    ENTER(dev);
    cuda_ctx *c = CTX(dev);
    pthread_mutex_lock(&c->mu);
    dp_status s = layernorm_params_locked(dev, c, dweight, dbias, dout, inp, mean, rstd, N, C);
    pthread_mutex_unlock(&c->mu);
    return s;
}

static dp_status sum_squares_locked(dp_device *dev, cuda_ctx *c, double *out_host,
                                    const float *x, size_t n)
{
    double *result = c->sumsq + DP_CUDA_SUMSQ_BLOCKS;
    CU_TRY(dev, dp_cuda_launch_sum_squares(c->stream, result, c->sumsq, x, n));
    CU_TRY(dev, cudaMemcpyAsync(c->result_host, result, sizeof(double), cudaMemcpyDeviceToHost,
                                c->stream));
    CU_TRY(dev, cudaStreamSynchronize(c->stream));
    *out_host = *c->result_host;
    return DP_OK;
}

dp_status dp_cuda_sum_squares(dp_device *dev, double *out_host, const float *x, size_t n) {
    ENTER(dev);
    cuda_ctx *c = CTX(dev);
    pthread_mutex_lock(&c->mu); /* the scratch is shared by concurrent callers */
    dp_status s = sum_squares_locked(dev, c, out_host, x, n);
    pthread_mutex_unlock(&c->mu);
    return s;
}

dp_status dp_cuda_attention_permute(dp_device *dev, float *qkvr, const float *qkv, size_t B,
                                    size_t T, size_t NH, size_t hs) {
    LAUNCH(dev, dp_cuda_launch_attention_permute, qkvr, qkv, B, T, NH, hs);
}

dp_status dp_cuda_attention_permute_bf16(dp_device *dev, uint16_t *qkvr, const float *qkv,
                                         size_t B, size_t T, size_t NH, size_t hs) {
    LAUNCH(dev, dp_cuda_launch_attention_permute_bf16, qkvr, qkv, B, T, NH, hs);
}

dp_status dp_cuda_attention_permute_backward(dp_device *dev, float *dqkv, const float *dqkvr,
                                             size_t B, size_t T, size_t NH, size_t hs) {
    LAUNCH(dev, dp_cuda_launch_attention_permute_backward, dqkv, dqkvr, B, T, NH, hs);
}

dp_status dp_cuda_attention_unpermute(dp_device *dev, float *out, const float *y, size_t B,
                                      size_t T, size_t NH, size_t hs) {
    LAUNCH(dev, dp_cuda_launch_attention_unpermute, out, y, B, T, NH, hs);
}

dp_status dp_cuda_attention_unpermute_backward(dp_device *dev, float *dy, const float *dout,
                                               size_t B, size_t T, size_t NH, size_t hs) {
    LAUNCH(dev, dp_cuda_launch_attention_unpermute_backward, dy, dout, B, T, NH, hs);
}

dp_status dp_cuda_adamw_segments(dp_device *dev, float *params, float *grads, float *m, float *v,
                                 uint16_t *replica, const dp_adamw_segs *segs, float lr,
                                 float beta1, float beta2, float eps, float bias_corr1,
                                 float bias_corr2, float clip) {
    LAUNCH(dev, dp_cuda_launch_adamw_segments, params, grads, m, v, replica, segs, lr, beta1,
           beta2, eps, bias_corr1, bias_corr2, clip);
}
