/*
 * backend/cuda/cuda_lt.c - a linear layer's GEMM with its bias in the
 * epilogue (dp_backend_ops.gemm_bias_out; nn/linear.c, nn/nn_act16.h)
 * through cuBLASLt: float32 compute and scale, the bias added by the
 * epilogue (CUBLASLT_EPILOGUE_BIAS) to the float32 sums, then D stored as
 * float32 or rounded to bfloat16 once. One pass over the output, where the
 * composition writes the broadcast bias, reads it back in the GEMM (beta
 * = 1) and, for a bfloat16 output, writes float32 and converts. Operands
 * are both bfloat16 (BF16 math) or both float32 (FP32, or TF32 with
 * CUBLAS_COMPUTE_32F_FAST_TF32).
 *
 * cuBLASLt's rounding of D is round-to-nearest-even, kernels/bf16.h's; the
 * bias is widened exactly (a bfloat16 replica's) or read as float32, and
 * added in float32 before the rounding, as bias_broadcast + beta = 1 adds
 * it. Its kernel is not the one cublasGemmStridedBatchedEx picks for the
 * float32 layer, so sums may be grouped otherwise (tests/test_cuda_ops.c
 * bounds the difference).
 *
 * A bfloat16 bias with a float32 D (the bfloat16 replica's bias of a
 * layer whose output stays float32: GPT-2's c_attn and both projections)
 * is a combination cuBLASLt does not take, so the bias is first widened
 * (exactly) into the device's column scratch and the epilogue reads that:
 * one launch of OC elements instead of writing and re-reading the N x OC
 * broadcast (0.63 ms of GPT-2 small's step at batch 8 on an H200).
 *
 * It declines (*done = 0, DP_OK) what it does not take, and the caller
 * composes: float32 operands (they would need the GEMM's bounded
 * conversion first, backend/gemm_pieces.h), math other than BF16 (FP32
 * and TF32 are cuBLAS's float32 GEMM, not a bfloat16 tensor-core kernel),
 * and any case cuBLASLt reports unsupported (no heuristic result, or
 * CUBLAS_STATUS_NOT_SUPPORTED: e.g. a float32 bias with a bfloat16 D,
 * which its documentation does not list). Other statuses are errors.
 *
 * The GELU (dp_backend_ops.gemm_gelu, DP_CUDA_LT_GELU=1) is the same call
 * with cuBLASLt's GELU_AUX(_BIAS) epilogue - the pre-activation stored in
 * the auxiliary matrix, its GELU in D, both rounded from the float32 sums
 * - or DGELU for the backward, D = the sums times GELU' of the stored
 * pre-activation, rounded once: llm.c's gelu_fusion. One GEMM where the
 * composition adds a pass over the (N,4C) pre-activation to each
 * direction. Opt-in: timed on an H200 it gained 1-2% of GPT-2 small's
 * step (llm.c keeps its own off by default too).
 */
#include <stdint.h>

#include "backend/cuda/cuda_internal.h"

/* The descriptors of one call (NULL: not created). */
typedef struct lt_call {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulPreference_t pref;
} lt_call;

static void lt_destroy(lt_call *l)
{
    if (l->pref) cublasLtMatmulPreferenceDestroy(l->pref);
    if (l->d) cublasLtMatrixLayoutDestroy(l->d);
    if (l->b) cublasLtMatrixLayoutDestroy(l->b);
    if (l->a) cublasLtMatrixLayoutDestroy(l->a);
    if (l->op) cublasLtMatmulDescDestroy(l->op);
}

/* The largest power of two up to 256 dividing p's address: the heuristic
 * assumes 256-byte aligned matrices unless told, and a kernel picked for
 * that would fault on a pointer into the middle of a buffer. */
static uint32_t alignment(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && a % al) al /= 2;
    return al;
}

/* The epilogue of one call: the bias (bias.p NULL: none) and the GELU's
 * (gelu: 0 none, 1 GELU with pre written to aux, 2 GELU's gradient with
 * pre read from aux; aux shares D's layout). */
typedef struct lt_epi {
    dp_pref bias;
    int gelu;
    const void *aux;
} lt_epi;

static cublasLtEpilogue_t epilogue_of(const lt_epi *e)
{
    if (e->gelu == 2) return CUBLASLT_EPILOGUE_DGELU;
    if (e->gelu == 1)
        return e->bias.p ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    return e->bias.p ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

/* The call's descriptors (column-major, as dp_gemm): A (m,k) after op,
 * B (k,n) after op, D = C (m,n) bfloat16 with ldc; the epilogue e; at
 * most ws workspace bytes. */
static dp_status describe(dp_device *dev, lt_call *l, cublasOperation_t ta, cublasOperation_t tb,
                          int m, int n, int k, const dp_gemm_arg *A, const dp_gemm_arg *B,
                          const lt_epi *e, const void *C, int c_bf16, int ldc, size_t ws)
{
    cublasComputeType_t ct =
        dev->matmul == DP_MATMUL_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cudaDataType_t ab = A->bf16 ? CUDA_R_16BF : CUDA_R_32F, dt = c_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    BLAS_TRY(dev, cublasLtMatmulDescCreate(&l->op, ct, CUDA_R_32F));
    BLAS_TRY(dev, cublasLtMatmulDescSetAttribute(l->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                                 sizeof ta));
    BLAS_TRY(dev, cublasLtMatmulDescSetAttribute(l->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                                 sizeof tb));
    cublasLtEpilogue_t epi = epilogue_of(e);
    BLAS_TRY(dev, cublasLtMatmulDescSetAttribute(l->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                 sizeof epi));
    if (e->bias.p) {
        int32_t type = e->bias.bf16 ? CUDA_R_16BF : CUDA_R_32F;
        BLAS_TRY(dev, cublasLtMatmulDescSetAttribute(l->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                   &e->bias.p, sizeof e->bias.p));
        BLAS_TRY(dev, cublasLtMatmulDescSetAttribute(l->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                   &type, sizeof type));
    }
    if (e->gelu) { /* pre: D's type and layout (bfloat16, ldc) */
        int64_t ld = ldc;
        BLAS_TRY(dev, cublasLtMatmulDescSetAttribute(
                          l->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &e->aux,
                          sizeof e->aux));
        BLAS_TRY(dev, cublasLtMatmulDescSetAttribute(l->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                   &ld, sizeof ld));
    }
    /* Layouts of the matrices as stored (before op). */
    int ra = ta == CUBLAS_OP_N ? m : k, ca = ta == CUBLAS_OP_N ? k : m;
    int rb = tb == CUBLAS_OP_N ? k : n, cb = tb == CUBLAS_OP_N ? n : k;
    BLAS_TRY(dev, cublasLtMatrixLayoutCreate(&l->a, ab, (uint64_t)ra, (uint64_t)ca, A->ld));
    BLAS_TRY(dev, cublasLtMatrixLayoutCreate(&l->b, ab, (uint64_t)rb, (uint64_t)cb, B->ld));
    BLAS_TRY(dev, cublasLtMatrixLayoutCreate(&l->d, dt, (uint64_t)m, (uint64_t)n, ldc));
    BLAS_TRY(dev, cublasLtMatmulPreferenceCreate(&l->pref));
    uint64_t wsb = ws;
    BLAS_TRY(dev, cublasLtMatmulPreferenceSetAttribute(
                    l->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    uint32_t al[3] = {alignment(A->p), alignment(B->p), alignment(C)};
    static const cublasLtMatmulPreferenceAttributes_t which[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        BLAS_TRY(dev, cublasLtMatmulPreferenceSetAttribute(l->pref, which[i], &al[i < 3 ? i : 2],
                                                         sizeof al[0]));
    return DP_OK;
}

static dp_status run(dp_device *dev, cuda_ctx *c, lt_call *l, cublasOperation_t ta,
                     cublasOperation_t tb, int m, int n, int k, const dp_gemm_arg *A,
                     const dp_gemm_arg *B, const lt_epi *e, void *C, int c_bf16, int ldc,
                     int *done)
{
    DP_TRY(describe(dev, l, ta, tb, m, n, k, A, B, e, C, c_bf16, ldc, c->blas_ws_bytes));
    cublasLtMatmulHeuristicResult_t best;
    int found = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(c->lt, l->op, l->a, l->b, l->d, l->d,
                                                      l->pref, 1, &best, &found);
    /* declined, the caller composes: a combination this cuBLASLt does not
     * take (e.g. a bfloat16 bias with a float32 D) is reported as not
     * supported or, by some versions, as an invalid value, before any
     * work is queued */
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE ||
        (s == CUBLAS_STATUS_SUCCESS && found == 0))
        return DP_OK;
    BLAS_TRY(dev, s);
    /* beta = 0: C is not read (it is D, the layout's only matrix). */
    const float one = 1.0f, zero = 0.0f;
    s = cublasLtMatmul(c->lt, l->op, &one, A->p, l->a, B->p, l->b, &zero, C, l->d, C, l->d,
                       &best.algo, c->blas_ws, c->blas_ws_bytes, c->stream);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE) return DP_OK;
    BLAS_TRY(dev, s);
    *done = 1;
    return DP_OK;
}

/* *bias (m bfloat16 elements) widened into c->col (c->mu held), queued
 * on c->stream ahead of the GEMM that reads it; *bias then points there. */
static dp_status widen_bias(dp_device *dev, cuda_ctx *c, dp_pref *bias, int m)
{
    DP_TRY(dp_cuda_grow_scratch(dev, c, (void **)&c->col, &c->col_bytes,
                                (size_t)m * sizeof(float)));
    CU_TRY(dev, dp_cuda_launch_cast_bf16_f32(c->stream, c->col, (const uint16_t *)bias->p,
                                             (size_t)m));
    *bias = dp_pref_f32(c->col);
    return DP_OK;
}

static cublasOperation_t lt_op(dp_op t)
{
    return t == DP_OP_T ? CUBLAS_OP_T : CUBLAS_OP_N;
}

/* One call with epilogue e, c->mu held. The workspace is the cuBLAS
 * handle's: both run on c->stream, so a call never overlaps another's use
 * of it. */
static dp_status gemm_with(dp_device *dev, cuda_ctx *c, dp_op transa, dp_op transb, int m, int n,
                           int k, const dp_gemm_arg *A, const dp_gemm_arg *B, const lt_epi *e,
                           void *C, int c_bf16, int ldc, int *done)
{
    lt_call l = {0};
    dp_status s =
        run(dev, c, &l, lt_op(transa), lt_op(transb), m, n, k, A, B, e, C, c_bf16, ldc, done);
    lt_destroy(&l);
    return s;
}

dp_status dp_cuda_gemm_bias_out(dp_device *dev, dp_op transa, dp_op transb, int m, int n, int k,
                                const dp_gemm_arg *A, const dp_gemm_arg *B, dp_pref bias, void *C,
                                int c_bf16, int ldc, int *done)
{
    *done = 0;
    /* bfloat16 operands in BF16 math, float32 ones in FP32 or TF32; the
     * rest (one of each, or float32 operands BF16 math would round first)
     * is the composition's, with the GEMM's bounded conversion */
    int bf16_ops = A->bf16 && B->bf16, f32_ops = !A->bf16 && !B->bf16;
    if (dev->matmul == DP_MATMUL_BF16 ? !bf16_ops : !f32_ops) return DP_OK;
    if (CTX(dev)->lt_off) return DP_OK; /* DP_CUDA_LT=0 */
    ENTER(dev);
    cuda_ctx *c = CTX(dev);
    pthread_mutex_lock(&c->mu); /* c->col is shared by concurrent callers */
    dp_status s = bias.p && bias.bf16 && !c_bf16 ? widen_bias(dev, c, &bias, m) : DP_OK;
    if (s == DP_OK) {
        lt_epi e = {bias, 0, NULL};
        s = gemm_with(dev, c, transa, transb, m, n, k, A, B, &e, C, c_bf16, ldc, done);
    }
    pthread_mutex_unlock(&c->mu);
    return s;
}

dp_status dp_cuda_gemm_gelu(dp_device *dev, dp_op transa, dp_op transb, int m, int n, int k,
                            const dp_gemm_arg *A, const dp_gemm_arg *B, dp_pref bias, int dgelu,
                            uint16_t *pre, uint16_t *C, int ldc, int *done)
{
    *done = 0;
    cuda_ctx *c = CTX(dev);
    /* opt-in (DP_CUDA_LT_GELU=1: see the file comment); bfloat16
     * operands in BF16 math only; the library asks pre's leading dimension
     * to be a multiple of 8, and its kernels load pre in 16-byte pieces
     * (the alignment the heuristic cannot be told of) */
    if (!c->lt_gelu || c->lt_off || dev->matmul != DP_MATMUL_BF16 || !A->bf16 || !B->bf16 ||
        ldc % 8 || (uintptr_t)pre % 16 || (dgelu && bias.p))
        return DP_OK;
    ENTER(dev);
    pthread_mutex_lock(&c->mu); /* as dp_cuda_gemm_bias_out */
    lt_epi e = {bias, dgelu ? 2 : 1, pre};
    dp_status s = gemm_with(dev, c, transa, transb, m, n, k, A, B, &e, C, 1, ldc, done);
    pthread_mutex_unlock(&c->mu);
    return s;
}
