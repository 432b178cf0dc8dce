/*
 * nn/linear.c - fully connected layer (dp/nn.h), weight stored [out, in]
 * as torch.nn.Linear; its bfloat16 producers (nn/nn_act16.h) at the end.
 *
 * The products go through the backend's column-major GEMM (cuBLAS
 * convention), in the device's matmul precision; the _bf16 variants take
 * bfloat16 weight and bias (a bf16 replica) and compute as the float32
 * layer would on their widened values, and the _bf16_inp ones take the
 * input activation in bfloat16 too. A row-major (R,K) matrix read column-major is its transpose
 * (K,R) with leading dimension K, so each row-major product is written as
 * the column-major product of the transposes:
 *   forward  out(N,OC)  = inp @ W^T    <=>  out^T = op_T(W^T) inp^T
 *            gemm(T, N, m=OC, n=N, k=C, A=W lda=C, B=inp ldb=C, C=out ldc=OC)
 *   dinp(N,C)           = dout @ W     <=>  dinp^T = W^T dout^T
 *            gemm(N, N, m=C, n=N, k=OC, A=W lda=C, B=dout ldb=OC, C=dinp ldc=C)
 *   dweight(OC,C)      += dout^T @ inp <=>  dweight^T += inp^T op_T(dout^T)
 *            gemm(N, T, m=C, n=OC, k=N, A=inp lda=C, B=dout ldb=OC, C=dW ldc=C)
 */
#include <limits.h>

#include "dp/checked.h"
#include "nn/nn_check.h"

#include "dp/nn.h"
#include "nn/nn_act16.h"

/* N, C, OC > 0, their products fit, and each fits the GEMM's int sizes. */
#define CHECK_LINEAR_DIMS(dev, N, C, OC)                                                  \
    do {                                                                                  \
        size_t n_;                                                                        \
        DP_NN_CHECK_DIMS2(dev, N, C, &n_);                                                \
        DP_NN_CHECK_DIMS2(dev, N, OC, &n_);                                               \
        DP_NN_CHECK_DIMS2(dev, OC, C, &n_);                                               \
        if ((N) > (size_t)INT_MAX || (C) > (size_t)INT_MAX || (OC) > (size_t)INT_MAX)     \
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: N=%zu, C=%zu and OC=%zu must "   \
                           "each be <= INT_MAX (the GEMM takes int sizes); split the "    \
                           "batch", (dev)->name, (size_t)(N), (size_t)(C), (size_t)(OC));  \
    } while (0)

/* One product of the layer: A is the weight or an activation, B an
 * activation (each float32, or bfloat16 when a16 / b16); C float32. */
static dp_status gemm(dp_device *dev, dp_op ta, dp_op tb, size_t m, size_t n, size_t k,
                      const void *A, int a16, size_t lda, const void *B, int b16, size_t ldb,
                      float beta, float *C, size_t ldc)
{
    dp_gemm_arg a = {A, a16, (int)lda, 0}, b = {B, b16, (int)ldb, 0};
    return dev->ops->gemm(dev, ta, tb, (int)m, (int)n, (int)k, 1.0f, &a, &b, beta, C, (int)ldc, 0,
                          1);
}

/* The public functions' checks (a macro, so messages name them). */
#define CHECK_FORWARD()                    \
    do {                                   \
        DP_NN_REQUIRE_DEV(dev);            \
        DP_NN_REQUIRE_PTR(dev, out);       \
        DP_NN_REQUIRE_PTR(dev, inp);       \
        DP_NN_REQUIRE_PTR(dev, weight);    \
        CHECK_LINEAR_DIMS(dev, N, C, OC);  \
    } while (0)
#define CHECK_BACKWARD()                   \
    do {                                   \
        DP_NN_REQUIRE_DEV(dev);            \
        DP_NN_REQUIRE_PTR(dev, dweight);   \
        DP_NN_REQUIRE_PTR(dev, dout);      \
        DP_NN_REQUIRE_PTR(dev, inp);       \
        DP_NN_REQUIRE_PTR(dev, weight);    \
        CHECK_LINEAR_DIMS(dev, N, C, OC);  \
    } while (0)

/* dp_linear_forward over weight and bias of either type (w16: bfloat16)
 * and an input of either type (x16) whose rows start ld elements apart. */
static dp_status linear_forward(dp_device *dev, float *out, const void *inp, int x16, size_t ld,
                                const void *weight, const void *bias, int w16, size_t N, size_t C,
                                size_t OC)
{
    /* A backend with the bias in its GEMM's epilogue (cuBLASLt, oneDNN) adds it
     * there; it may decline (operand types, precision). */
    if (bias && !dev->no_fused_producers && dev->ops->gemm_bias_out) {
        dp_gemm_arg a = {weight, w16, (int)C, 0}, b = {inp, x16, (int)ld, 0};
        dp_pref bp = w16 ? dp_pref_bf16(bias) : dp_pref_f32(bias);
        int done = 0;
        DP_TRY(dev->ops->gemm_bias_out(dev, DP_OP_T, DP_OP_N, (int)OC, (int)N, (int)C, &a, &b, bp,
                                       out, 0, (int)OC, &done));
        if (done) return DP_OK;
    }
    /* With a bias, out starts as the broadcast bias and the GEMM adds to it
     * (beta = 1); without, the GEMM overwrites out (beta = 0). */
    if (bias) {
        dp_pref b = w16 ? dp_pref_bf16(bias) : dp_pref_f32(bias);
        DP_TRY(dev->ops->bias_broadcast(dev, out, b, N, OC));
    }
    return gemm(dev, DP_OP_T, DP_OP_N, OC, N, C, weight, w16, C, inp, x16, ld,
                bias ? 1.0f : 0.0f, out, OC);
}

/* The backward with the GEMMs' dout operand g (float32, or bfloat16 when
 * g16: dout rounded by the caller) and the float32 dout for the bias. */
static dp_status linear_backward_g(dp_device *dev, float *dinp, float *dweight, float *dbias,
                                   const float *dout, const void *g, int g16, const void *inp,
                                   int x16, size_t ld, const void *weight, int w16, size_t N,
                                   size_t C, size_t OC)
{
    if (dinp)
        DP_TRY(gemm(dev, DP_OP_N, DP_OP_N, C, N, OC, weight, w16, C, g, g16, OC, 0.0f, dinp, ld));
    DP_TRY(gemm(dev, DP_OP_N, DP_OP_T, C, OC, N, inp, x16, ld, g, g16, OC, 1.0f, dweight, C));
    if (dbias) DP_TRY(dev->ops->bias_backward(dev, dbias, NULL, dp_pref_f32(dout), N, OC));
    return DP_OK;
}

static dp_status linear_backward(dp_device *dev, float *dinp, float *dweight, float *dbias,
                                 const float *dout, const void *inp, int x16, size_t ld,
                                 const void *weight, int w16, size_t N, size_t C, size_t OC)
{
    return linear_backward_g(dev, dinp, dweight, dbias, dout, dout, 0, inp, x16, ld, weight, w16,
                             N, C, OC);
}

dp_status dp_linear_forward(dp_device *dev, float *out, const float *inp, const float *weight,
                            const float *bias, size_t N, size_t C, size_t OC)
{
    CHECK_FORWARD();
    return linear_forward(dev, out, inp, 0, C, weight, bias, 0, N, C, OC);
}

dp_status dp_linear_forward_bf16(dp_device *dev, float *out, const float *inp,
                                 const dp_bf16 *weight, const dp_bf16 *bias, size_t N, size_t C,
                                 size_t OC)
{
    CHECK_FORWARD();
    return linear_forward(dev, out, inp, 0, C, weight, bias, 1, N, C, OC);
}

dp_status dp_linear_backward(dp_device *dev, float *dinp, float *dweight, float *dbias,
                             const float *dout, const float *inp, const float *weight, size_t N,
                             size_t C, size_t OC)
{
    CHECK_BACKWARD();
    return linear_backward(dev, dinp, dweight, dbias, dout, inp, 0, C, weight, 0, N, C, OC);
}

dp_status dp_linear_backward_bf16(dp_device *dev, float *dinp, float *dweight, float *dbias,
                                  const float *dout, const float *inp, const dp_bf16 *weight,
                                  size_t N, size_t C, size_t OC)
{
    CHECK_BACKWARD();
    return linear_backward(dev, dinp, dweight, dbias, dout, inp, 0, C, weight, 1, N, C, OC);
}

dp_status dp_linear_forward_bf16_inp(dp_device *dev, float *out, const dp_bf16 *inp,
                                     const dp_bf16 *weight, const dp_bf16 *bias, size_t N,
                                     size_t C, size_t OC)
{
    CHECK_FORWARD();
    return linear_forward(dev, out, inp, 1, C, weight, bias, 1, N, C, OC);
}

dp_status dp_linear_backward_bf16_inp(dp_device *dev, float *dinp, float *dweight, float *dbias,
                                      const float *dout, const dp_bf16 *inp,
                                      const dp_bf16 *weight, size_t N, size_t C, size_t OC)
{
    CHECK_BACKWARD();
    return linear_backward(dev, dinp, dweight, dbias, dout, inp, 1, C, weight, 1, N, C, OC);
}

// --- strided input rows ----------------------------------------------------------------
// The same products with the input's leading dimension ld_inp instead of C
// (a row-major row stride is a column-major leading dimension).

static dp_status check_linear_ld(dp_device *dev, size_t ld, size_t N, size_t C, size_t OC)
{
    size_t n;
    if (!N || !C || !OC || !dp_size_mul(N, ld, &n) || !dp_size_mul(N, OC, &n) ||
        !dp_size_mul(OC, C, &n))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: N=%zu, C=%zu and OC=%zu must be > 0 and "
                       "their products fit size_t", dev->name, N, C, OC);
    if (ld < C)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: ld_inp=%zu is smaller than C=%zu; rows of "
                       "the input must not overlap (ld_inp == C for contiguous rows)", dev->name,
                       ld, C);
    if (N > (size_t)INT_MAX || ld > (size_t)INT_MAX || OC > (size_t)INT_MAX)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: N=%zu, ld_inp=%zu and OC=%zu must each be "
                       "<= INT_MAX (the GEMM takes int sizes); split the batch", dev->name, N, ld,
                       OC);
    return DP_OK;
}

dp_status dp_linear_forward_ld(dp_device *dev, float *out, const float *inp, size_t ld_inp,
                               const float *weight, const float *bias, size_t N, size_t C,
                               size_t OC)
{
    DP_NN_REQUIRE_DEV(dev);
    DP_NN_REQUIRE_PTR(dev, out);
    DP_NN_REQUIRE_PTR(dev, inp);
    DP_NN_REQUIRE_PTR(dev, weight);
    DP_TRY(check_linear_ld(dev, ld_inp, N, C, OC));
    return linear_forward(dev, out, inp, 0, ld_inp, weight, bias, 0, N, C, OC);
}

dp_status dp_linear_backward_ld(dp_device *dev, float *dinp, float *dweight, float *dbias,
                                const float *dout, const float *inp, size_t ld_inp,
                                const float *weight, size_t N, size_t C, size_t OC)
{
    DP_NN_REQUIRE_DEV(dev);
    DP_NN_REQUIRE_PTR(dev, dweight);
    DP_NN_REQUIRE_PTR(dev, dout);
    DP_NN_REQUIRE_PTR(dev, inp);
    DP_NN_REQUIRE_PTR(dev, weight);
    DP_TRY(check_linear_ld(dev, ld_inp, N, C, OC));
    return linear_backward(dev, dinp, dweight, dbias, dout, inp, 0, ld_inp, weight, 0, N, C, OC);
}

// --- bfloat16 producers (nn/nn_act16.h) --------------------------------------------------

static dp_status check_act_type(dp_device *dev, dp_dtype t)
{
    int bf16;
    return dp_nn_check_dtype("the linear layer", dev, "inp_type", t, &bf16);
}

/* The checks of the bfloat16-output forwards on their GEMM's output o
 * (dp_linear_forward_out16's out, dp_linear_gelu_forward_out16's pre;
 * a macro, so messages name the public function; z: fwd16_of's sizes):
 * only the part of the scratch a block of rows uses counts. */
#define CHECK_FORWARD16(o)                                                                  \
    do {                                                                                    \
        DP_NN_REQUIRE_DEV(dev);                                                             \
        DP_NN_REQUIRE_PTR(dev, o);                                                          \
        DP_NN_REQUIRE_PTR(dev, scratch);                                                    \
        DP_NN_REQUIRE_PTR(dev, inp);                                                        \
        DP_NN_REQUIRE_PTR(dev, weight.p);                                                   \
        CHECK_LINEAR_DIMS(dev, N, C, OC);                                                   \
        DP_TRY(check_act_type(dev, inp_type));                                              \
        if (scratch_floats < OC)                                                            \
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT,                                         \
                           "%s: scratch_floats=%zu is less than one output row (OC=%zu "    \
                           "floats); give at least OC, or N*OC=%zu to convert in one piece", \
                           dev->name, scratch_floats, OC, N * OC);                          \
        DP_NN_REQUIRE_DISJOINT(dev, o, z.out_bytes, inp, z.inp_bytes);                      \
        DP_NN_REQUIRE_DISJOINT(dev, o, z.out_bytes, scratch, z.scratch_bytes);              \
        DP_NN_REQUIRE_DISJOINT(dev, scratch, z.scratch_bytes, inp, z.inp_bytes);            \
    } while (0)

/* The sizes CHECK_FORWARD16 compares: an output's and the input's bytes,
 * the scratch's rows (at most N) and the bytes they use. */
typedef struct fwd16 {
    int x16;
    size_t rows, out_bytes, inp_bytes, scratch_bytes;
} fwd16;

static fwd16 fwd16_of(dp_dtype inp_type, size_t scratch_floats, size_t N, size_t C, size_t OC)
{
    fwd16 z = {inp_type == DP_DTYPE_BF16, 0, 0, 0, 0};
    z.rows = OC && scratch_floats / OC < N ? scratch_floats / OC : N;
    z.out_bytes = N * OC * sizeof(dp_bf16);
    z.inp_bytes = N * C * (z.x16 ? 2 : 4);
    z.scratch_bytes = z.rows * OC * sizeof(float);
    return z;
}

dp_status dp_linear_forward_out16(dp_device *dev, dp_bf16 *out, float *scratch,
                                  size_t scratch_floats, const void *inp, dp_dtype inp_type,
                                  dp_pref weight, dp_pref bias, size_t N, size_t C, size_t OC)
{
    const fwd16 z = fwd16_of(inp_type, scratch_floats, N, C, OC);
    CHECK_FORWARD16(out);
    int x16 = z.x16;
    size_t rows = z.rows;
    if (!dev->no_fused_producers && dev->ops->gemm_bias_out) {
        /* out^T(OC,N) = op_T(W^T) inp^T + bias, as the float32 forward */
        dp_gemm_arg a = {weight.p, weight.bf16, (int)C, 0}, b = {inp, x16, (int)C, 0};
        int done = 0;
        DP_TRY(dev->ops->gemm_bias_out(dev, DP_OP_T, DP_OP_N, (int)OC, (int)N, (int)C, &a, &b,
                                       bias, out, 1, (int)OC, &done));
        if (done) return DP_OK;
    }
    /* The float32 layer on blocks of rows (one block when the scratch holds
     * them all: then the very calls of linear_forward), each converted. */
    for (size_t r0 = 0; r0 < N; r0 += rows) {
        size_t nr = N - r0 < rows ? N - r0 : rows;
        const char *x = (const char *)inp + r0 * C * (x16 ? 2 : 4);
        if (bias.p) DP_TRY(dev->ops->bias_broadcast(dev, scratch, bias, nr, OC));
        DP_TRY(gemm(dev, DP_OP_T, DP_OP_N, OC, nr, C, weight.p, weight.bf16, C, x, x16, C,
                    bias.p ? 1.0f : 0.0f, scratch, OC));
        DP_TRY(dev->ops->cast_f32_bf16(dev, out + r0 * OC, scratch, nr * OC));
    }
    return DP_OK;
}

dp_status dp_linear_gelu_forward_out16(dp_device *dev, dp_bf16 *out, dp_bf16 *pre,
                                       float *scratch, size_t scratch_floats, const void *inp,
                                       dp_dtype inp_type, dp_pref weight, dp_pref bias, size_t N,
                                       size_t C, size_t OC)
{
    const fwd16 z = fwd16_of(inp_type, scratch_floats, N, C, OC);
    DP_NN_REQUIRE_DEV(dev);
    DP_NN_REQUIRE_PTR(dev, out);
    CHECK_FORWARD16(pre); /* pre is the GEMM's output, as the composition writes it */
    DP_NN_REQUIRE_DISJOINT(dev, out, z.out_bytes, pre, z.out_bytes);
    DP_NN_REQUIRE_DISJOINT(dev, out, z.out_bytes, inp, z.inp_bytes);
    DP_NN_REQUIRE_DISJOINT(dev, out, z.out_bytes, scratch, z.scratch_bytes);
    if (!dev->no_fused_producers && dev->ops->gemm_gelu) {
        /* out^T(OC,N) = GELU(op_T(W^T) inp^T + bias), pre^T beside it */
        dp_gemm_arg a = {weight.p, weight.bf16, (int)C, 0}, b = {inp, z.x16, (int)C, 0};
        int done = 0;
        DP_TRY(dev->ops->gemm_gelu(dev, DP_OP_T, DP_OP_N, (int)OC, (int)N, (int)C, &a, &b, bias, 0,
                                   pre, out, (int)OC, &done));
        if (done) return DP_OK;
    }
    DP_TRY(dp_linear_forward_out16(dev, pre, scratch, scratch_floats, inp, inp_type, weight, bias,
                                   N, C, OC));
    return dp_gelu_forward_bf16(dev, out, pre, N * OC);
}

/* The checks both backwards with a bfloat16 dout share (a macro, so
 * messages name the public function). */
/* g: the gradient the GEMMs read (dout, or dout16 for
 * dp_linear_backward_from16), named in the message when NULL. */
#define CHECK_BACKWARD16(g)                         \
    do {                                            \
        DP_NN_REQUIRE_DEV(dev);                     \
        DP_NN_REQUIRE_PTR(dev, dweight);            \
        DP_NN_REQUIRE_PTR(dev, g);                  \
        DP_NN_REQUIRE_PTR(dev, inp);                \
        DP_NN_REQUIRE_PTR(dev, weight.p);           \
        CHECK_LINEAR_DIMS(dev, N, C, OC);           \
        DP_TRY(check_act_type(dev, inp_type));      \
    } while (0)

/* Whether dp_linear_backward_dout16 rounds dout into dout16 for both GEMMs:
 * BF16 math with the fused producers on (not the test hook), dout16 given. */
static int rounds_dout(const dp_device *dev, const dp_bf16 *dout16)
{
    return dout16 && dev->matmul == DP_MATMUL_BF16 && !dev->no_fused_producers;
}

dp_status dp_linear_backward_dout16(dp_device *dev, float *dinp, float *dweight, float *dbias,
                                    const float *dout, dp_bf16 *dout16, const void *inp,
                                    dp_dtype inp_type, dp_pref weight, size_t N, size_t C,
                                    size_t OC)
{
    CHECK_BACKWARD16(dout);
    int x16 = inp_type == DP_DTYPE_BF16;
    if (dout16) { /* written before the GEMMs read everything else */
        size_t n16 = N * OC * sizeof(dp_bf16);
        DP_NN_REQUIRE_DISJOINT(dev, dout16, n16, dout, N * OC * sizeof(float));
        DP_NN_REQUIRE_DISJOINT(dev, dout16, n16, inp, N * C * (x16 ? 2 : 4));
        DP_NN_REQUIRE_DISJOINT(dev, dout16, n16, weight.p, OC * C * (weight.bf16 ? 2 : 4));
        DP_NN_REQUIRE_DISJOINT(dev, dout16, n16, dinp, N * C * sizeof(float));
        DP_NN_REQUIRE_DISJOINT(dev, dout16, n16, dweight, OC * C * sizeof(float));
        DP_NN_REQUIRE_DISJOINT(dev, dout16, n16, dbias, OC * sizeof(float));
    }
    /* Only BF16 math rounds dout (and not under the test hook): in FP32 and
     * TF32 each GEMM reads it as is. */
    if (!rounds_dout(dev, dout16))
        return linear_backward(dev, dinp, dweight, dbias, dout, inp, x16, C, weight.p,
                               weight.bf16, N, C, OC);
    /* dout read once for both: its rounding and the bias gradient of its
     * float32 values (the cast's and the column sums' bits) */
    if (dbias)
        DP_TRY(dev->ops->bias_backward(dev, dbias, dout16, dp_pref_f32(dout), N, OC));
    else
        DP_TRY(dev->ops->cast_f32_bf16(dev, dout16, dout, N * OC));
    return linear_backward_g(dev, dinp, dweight, NULL, dout, dout16, 1, inp, x16, C, weight.p,
                             weight.bf16, N, C, OC);
}

dp_status dp_linear_backward_from16(dp_device *dev, float *dinp, float *dweight, float *dbias,
                                    const dp_bf16 *dout16, const void *inp, dp_dtype inp_type,
                                    dp_pref weight, size_t N, size_t C, size_t OC)
{
    CHECK_BACKWARD16(dout16);
    size_t n16 = N * OC * sizeof(dp_bf16);
    DP_NN_REQUIRE_DISJOINT(dev, dout16, n16, dinp, N * C * sizeof(float));
    DP_NN_REQUIRE_DISJOINT(dev, dout16, n16, dweight, OC * C * sizeof(float));
    DP_NN_REQUIRE_DISJOINT(dev, dout16, n16, dbias, OC * sizeof(float));
    DP_TRY(linear_backward_g(dev, dinp, dweight, NULL, NULL, dout16, 1, inp,
                             inp_type == DP_DTYPE_BF16, C, weight.p, weight.bf16, N, C, OC));
    if (dbias) DP_TRY(dev->ops->bias_backward(dev, dbias, NULL, dp_pref_bf16(dout16), N, OC));
    return DP_OK;
}

/* The checks of dp_linear_backward_to16 and _dgelu (pre NULL in the first;
 * a macro, so messages name the public function). */
#define CHECK_TO16()                                                                              \
    do {                                                                                          \
        if (dout) /* else dout16 is the gradient, read as it is */                                \
            CHECK_BACKWARD16(dout);                                                               \
        else                                                                                      \
            CHECK_BACKWARD16(dout16);                                                             \
        DP_NN_REQUIRE_PTR(dev, dinp16);                                                           \
        DP_NN_REQUIRE_PTR(dev, scratch);                                                          \
        if (scratch_floats < N * C)                                                               \
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: scratch_floats=%zu is less than dinp's " \
                           "N*C=%zu floats; give the scratch the float32 dinp fits in", dev->name,\
                           scratch_floats, N * C);                                                \
        int x16 = inp_type == DP_DTYPE_BF16;                                                      \
        size_t d16 = N * C * sizeof(dp_bf16), s32 = N * C * sizeof(float);                        \
        DP_NN_REQUIRE_DISJOINT(dev, dinp16, d16, dout, N * OC * sizeof(float));                   \
        DP_NN_REQUIRE_DISJOINT(dev, dinp16, d16, inp, N * C * (x16 ? 2 : 4));                     \
        DP_NN_REQUIRE_DISJOINT(dev, dinp16, d16, scratch, s32);                                   \
        DP_NN_REQUIRE_DISJOINT(dev, scratch, s32, dout, N * OC * sizeof(float));                  \
        DP_NN_REQUIRE_DISJOINT(dev, scratch, s32, inp, N * C * (x16 ? 2 : 4));                    \
        if (dout16) {                                                                             \
            DP_NN_REQUIRE_DISJOINT(dev, dinp16, d16, dout16, N * OC * sizeof(dp_bf16));           \
            DP_NN_REQUIRE_DISJOINT(dev, scratch, s32, dout16, N * OC * sizeof(dp_bf16));          \
        }                                                                                         \
        if (pre) {                                                                                \
            DP_NN_REQUIRE_DISJOINT(dev, dinp16, d16, pre, d16);                                   \
            DP_NN_REQUIRE_DISJOINT(dev, scratch, s32, pre, d16);                                  \
        }                                                                                         \
    } while (0)

/* dp_linear_backward_to16's work after its checks, and with pre (not
 * NULL) its input gradient times GELU'(pre) (dp_linear_backward_to16_dgelu). */
static dp_status backward_to16(dp_device *dev, dp_bf16 *dinp16, float *scratch, float *dweight,
                               float *dbias, const float *dout, dp_bf16 *dout16, const void *inp,
                               dp_dtype inp_type, dp_pref weight, const dp_bf16 *pre, size_t N,
                               size_t C, size_t OC)
{
    /* The weight and bias gradients and dout16 (when rounded) as
     * dp_linear_backward_dout16 (or _from16) makes them, without dinp. */
    if (dout)
        DP_TRY(dp_linear_backward_dout16(dev, NULL, dweight, dbias, dout, dout16, inp, inp_type,
                                         weight, N, C, OC));
    else
        DP_TRY(dp_linear_backward_from16(dev, NULL, dweight, dbias, dout16, inp, inp_type, weight,
                                         N, C, OC));
    int rounded = !dout || rounds_dout(dev, dout16); /* the GEMMs read dout16 */
    /* dinp^T(C,N) = W^T dout^T, as linear_backward_g's, stored as bfloat16 */
    dp_gemm_arg a = {weight.p, weight.bf16, (int)C, 0}, b = {dout16, 1, (int)OC, 0};
    dp_pref none = {NULL, 0};
    int done = 0;
    if (rounded && pre && dev->ops->gemm_gelu) /* GELU' in the epilogue */
        DP_TRY(dev->ops->gemm_gelu(dev, DP_OP_N, DP_OP_N, (int)C, (int)N, (int)OC, &a, &b, none, 1,
                                   (uint16_t *)pre, dinp16, (int)C, &done));
    if (done) return DP_OK;
    if (rounded && dev->ops->gemm_bias_out)
        DP_TRY(dev->ops->gemm_bias_out(dev, DP_OP_N, DP_OP_N, (int)C, (int)N, (int)OC, &a, &b,
                                       none, dinp16, 1, (int)C, &done));
    if (!done) { /* the composition: dp_linear_backward_dout16's float32 dinp, converted */
        DP_TRY(gemm(dev, DP_OP_N, DP_OP_N, C, N, OC, weight.p, weight.bf16, C,
                    rounded ? (const void *)dout16 : dout, rounded, OC, 0.0f, scratch, C));
        DP_TRY(dev->ops->cast_f32_bf16(dev, dinp16, scratch, N * C));
    }
    return pre ? dp_gelu_backward_bf16(dev, dinp16, pre, dinp16, N * C) : DP_OK;
}

dp_status dp_linear_backward_to16(dp_device *dev, dp_bf16 *dinp16, float *scratch,
                                  size_t scratch_floats, float *dweight, float *dbias,
                                  const float *dout, dp_bf16 *dout16, const void *inp,
                                  dp_dtype inp_type, dp_pref weight, size_t N, size_t C,
                                  size_t OC)
{
    const dp_bf16 *pre = NULL;
    CHECK_TO16();
    return backward_to16(dev, dinp16, scratch, dweight, dbias, dout, dout16, inp, inp_type,
                         weight, NULL, N, C, OC);
}

dp_status dp_linear_backward_to16_dgelu(dp_device *dev, dp_bf16 *dinp16, float *scratch,
                                        size_t scratch_floats, float *dweight, float *dbias,
                                        const float *dout, dp_bf16 *dout16, const void *inp,
                                        dp_dtype inp_type, dp_pref weight, const dp_bf16 *pre,
                                        size_t N, size_t C, size_t OC)
{
    DP_NN_REQUIRE_DEV(dev);
    DP_NN_REQUIRE_PTR(dev, pre);
    CHECK_TO16();
    return backward_to16(dev, dinp16, scratch, dweight, dbias, dout, dout16, inp, inp_type,
                         weight, pre, N, C, OC);
}
