/*
 * dp_gemm, dp_gemm_strided_batched and dp_gemm_ex: cuBLAS (column-major)
 * semantics on the CPU backend, against a naive float64 loop, for every
 * transpose combination with leading dimensions and batch strides larger
 * than the minimum, plus the argument checks. dp_gemm_ex runs the same
 * cases with bfloat16 operands and in bf16 matmul precision, against the
 * float64 product of the operands' bfloat16 values.
 *
 * Padding (rows between the matrix and its leading dimension, gaps between
 * batch entries) holds NaN in A and B, so reading it poisons the result,
 * and a sentinel in C, which must come back unchanged.
 */
#include <math.h>
#include <string.h>

#include "dp_test.h"

#include "backend/device_testing.h"
#include "backend/gemm_pieces.h"

#define C_SENTINEL 12345.0f

typedef struct gemm_case {
    dp_op ta, tb;
    int m, n, k;
    int lda, ldb, ldc;
    long long sa, sb, sc; /* batch strides in floats */
    int batch;
    float alpha, beta;
    int nan_c; /* fill C with NaN (only meaningful with beta == 0) */
} gemm_case;

static int rows_a(const gemm_case *g) { return g->ta == DP_OP_N ? g->m : g->k; }
static int cols_a(const gemm_case *g) { return g->ta == DP_OP_N ? g->k : g->m; }
static int rows_b(const gemm_case *g) { return g->tb == DP_OP_N ? g->k : g->n; }
static int cols_b(const gemm_case *g) { return g->tb == DP_OP_N ? g->n : g->k; }

/* Floats spanned by `batch` matrices of ld x cols at stride s (s may be 0). */
static size_t span(int ld, int cols, long long s, int batch)
{
    size_t one = (size_t)ld * (size_t)cols;
    size_t total = (size_t)s * (size_t)(batch - 1) + one;
    return total ? total : 1;
}

/* Column-major element (i, j) of op(X). */
static double op_at(const float *X, int ld, dp_op t, int i, int j)
{
    return t == DP_OP_N ? X[i + (size_t)j * ld] : X[j + (size_t)i * ld];
}

/* Fills the live entries of each matrix with uniform [-1, 1) values and
 * everything else with pad. */
static void fill(dp_rng *rng, float *x, size_t total, int rows, int ld, int cols, long long s,
                 int batch, float pad)
{
    for (size_t i = 0; i < total; i++) x[i] = pad;
    for (int b = 0; b < batch; b++)
        for (int j = 0; j < cols; j++)
            for (int i = 0; i < rows; i++)
                x[(size_t)b * s + (size_t)j * ld + i] = 2.0f * dp_rng_uniform(rng) - 1.0f;
}

/* How a case runs: dp_gemm (0), dp_gemm_strided_batched (1) or dp_gemm_ex
 * (2) with the operand types and the device's matmul precision below. */
typedef struct gemm_mode {
    int call;
    int a16, b16; /* dp_gemm_ex: A, B stored as bfloat16 */
    dp_matmul_precision prec;
} gemm_mode;

/* The value the GEMM computes with: a bfloat16 operand's, or any operand
 * rounded to bfloat16 in BF16 precision. */
static double effective(float x, int bf16) { return bf16 ? dp_test_bf16_value(x) : x; }

/* Uploads n floats as bfloat16 (bf16) or float32. */
static void *upload_as(dp_device *dev, const float *x, size_t n, int bf16)
{
    if (!bf16) return dp_test_upload(dev, x, n);
    dp_bf16 *h = malloc(n * sizeof *h);
    cr_assert(h);
    for (size_t i = 0; i < n; i++) h[i] = dp_bf16_from_float(x[i]);
    void *d = NULL;
    dp_assert_ok(dp_device_alloc(dev, n * sizeof *h, &d));
    dp_assert_ok(dp_copy_h2d(dev, d, h, n * sizeof *h));
    free(h);
    return d;
}

/* The conversion scratch's cap for the runs below (0: the default), and
 * whether bf16 math may run on oneDNN (0: OpenBLAS's emulation). */
static size_t convert_cap;
static int allow_dnnl = 1;

/* Runs g as mode says; returns the largest |C - the float64 product of
 * the unrounded operands| (how far bf16 math moved the result). */
static double run_mode(const gemm_case *g, gemm_mode mode)
{
    int ra = mode.a16 || mode.prec == DP_MATMUL_BF16, rb = mode.b16 || mode.prec == DP_MATMUL_BF16;
    dp_rng rng;
    dp_rng_seed(&rng, 42 + (uint64_t)g->m * 131 + (uint64_t)g->n * 17 + (uint64_t)g->k);
    size_t na = span(g->lda, cols_a(g), g->sa, g->batch);
    size_t nb = span(g->ldb, cols_b(g), g->sb, g->batch);
    size_t nc = span(g->ldc, g->n, g->sc, g->batch);
    float *A = malloc(na * sizeof *A), *B = malloc(nb * sizeof *B), *C = malloc(nc * sizeof *C);
    cr_assert(A && B && C);
    fill(&rng, A, na, rows_a(g), g->lda, cols_a(g), g->sa, g->batch, NAN);
    fill(&rng, B, nb, rows_b(g), g->ldb, cols_b(g), g->sb, g->batch, NAN);
    fill(&rng, C, nc, g->m, g->ldc, g->n, g->sc, g->batch, C_SENTINEL);
    if (g->nan_c)
        for (int b = 0; b < g->batch; b++)
            for (int j = 0; j < g->n; j++)
                for (int i = 0; i < g->m; i++) C[(size_t)b * g->sc + (size_t)j * g->ldc + i] = NAN;

    /* Expected: every float of C's span, padding included. */
    double *want = malloc(nc * sizeof *want), *got = malloc(nc * sizeof *got);
    double *exact = malloc(nc * sizeof *exact);
    cr_assert(want && got && exact);
    for (size_t i = 0; i < nc; i++) want[i] = exact[i] = C[i];
    for (int b = 0; b < g->batch; b++) {
        const float *Ab = A + (size_t)b * g->sa, *Bb = B + (size_t)b * g->sb;
        for (int j = 0; j < g->n; j++)
            for (int i = 0; i < g->m; i++) {
                double acc = 0.0, acc_exact = 0.0;
                for (int l = 0; l < g->k; l++) {
                    double x = op_at(Ab, g->lda, g->ta, i, l), y = op_at(Bb, g->ldb, g->tb, l, j);
                    acc += effective((float)x, ra) * effective((float)y, rb);
                    acc_exact += x * y;
                }
                size_t ci = (size_t)b * g->sc + (size_t)j * g->ldc + i;
                /* beta == 0 means C is not read at all (cuBLAS). */
                double c0 = g->beta == 0.0f ? 0.0 : (double)C[ci];
                want[ci] = (double)g->alpha * acc + (double)g->beta * c0;
                exact[ci] = (double)g->alpha * acc_exact + (double)g->beta * c0;
            }
    }

    dp_device *dev = dp_test_cpu(0);
    dp_device_set_gemm_convert_cap(dev, convert_cap);
    dp_device_set_gemm_dnnl(dev, allow_dnnl);
    dp_assert_ok(dp_device_set_matmul_precision(dev, mode.prec));
    void *dA = upload_as(dev, A, na, mode.a16), *dB = upload_as(dev, B, nb, mode.b16);
    float *dC = dp_test_upload(dev, C, nc);
    if (mode.call == 2)
        dp_assert_ok(dp_gemm_ex(dev, g->ta, g->tb, g->m, g->n, g->k, g->alpha, dA,
                                mode.a16 ? DP_DTYPE_BF16 : DP_DTYPE_F32, g->lda, g->sa, dB,
                                mode.b16 ? DP_DTYPE_BF16 : DP_DTYPE_F32, g->ldb, g->sb, g->beta,
                                dC, g->ldc, g->sc, g->batch));
    else if (mode.call == 1)
        dp_assert_ok(dp_gemm_strided_batched(dev, g->ta, g->tb, g->m, g->n, g->k, g->alpha, dA,
                                             g->lda, g->sa, dB, g->ldb, g->sb, g->beta, dC,
                                             g->ldc, g->sc, g->batch));
    else
        dp_assert_ok(dp_gemm(dev, g->ta, g->tb, g->m, g->n, g->k, g->alpha, dA, g->lda, dB,
                             g->ldb, g->beta, dC, g->ldc));
    dp_assert_ok(dp_copy_d2h(dev, C, dC, nc * sizeof *C));
    for (size_t i = 0; i < nc; i++) got[i] = C[i];
    /* Inputs are uniform in [-1, 1) and k <= 100: a float32 dot product of
     * k such terms is off by ~sqrt(k) * 6e-8 * O(1) ~ 1e-6 in practice, so
     * atol = rtol = 1e-5 has headroom, while a wrong transpose, leading
     * dimension or stride gives O(0.1) errors or NaN. The sentinel padding
     * of C must match exactly (it is far larger than the tolerance). */
    cr_assert(nc > 0);
    cr_log_info("case ta=%d tb=%d m=%d n=%d k=%d batch=%d a16=%d b16=%d prec=%s", g->ta, g->tb,
                g->m, g->n, g->k, g->batch, mode.a16, mode.b16, dp_matmul_precision_name(mode.prec));
    dp_assert_allclose(got, (const double *)want, nc, 1e-5, 1e-5);
    double moved = 0.0;
    for (size_t i = 0; i < nc; i++)
        if (fabs(got[i] - exact[i]) > moved) moved = fabs(got[i] - exact[i]);

    free(A), free(B), free(C), free(want), free(got), free(exact);
    dp_device_free(dev, dA), dp_device_free(dev, dB), dp_device_free(dev, dC);
    dp_memory_stats st;
    dp_device_memory(dev, &st);
    cr_assert_eq(st.in_use, 0);
    dp_device_close(dev);
    return moved;
}

static void run_case(const gemm_case *g, int use_batched)
{
    gemm_mode mode = {use_batched, 0, 0, DP_MATMUL_FP32};
    run_mode(g, mode);
}

/* The case through dp_gemm_ex with every operand type, in float32 and in
 * bf16 precision; returns the largest movement of the bf16-math runs. */
static double run_typed(const gemm_case *g)
{
    double moved = 0.0;
    for (int prec = 0; prec < 2; prec++)
        for (int a16 = 0; a16 < 2; a16++)
            for (int b16 = 0; b16 < 2; b16++) {
                gemm_mode mode = {2, a16, b16, prec ? DP_MATMUL_BF16 : DP_MATMUL_FP32};
                double m = run_mode(g, mode);
                if (prec && m > moved) moved = m;
            }
    return moved;
}

/* One case per transpose combination and shape, single (batch 1, dp_gemm). */
static gemm_case single(dp_op ta, dp_op tb, int m, int n, int k, float alpha, float beta)
{
    gemm_case g;
    memset(&g, 0, sizeof g);
    g.ta = ta, g.tb = tb, g.m = m, g.n = n, g.k = k;
    g.alpha = alpha, g.beta = beta, g.batch = 1;
    /* Leading dimensions 3 more than the minimum. */
    g.lda = (ta == DP_OP_N ? m : k) + 3;
    g.ldb = (tb == DP_OP_N ? k : n) + 3;
    g.ldc = m + 3;
    return g;
}

static const int shapes[][3] = {{5, 7, 4}, {1, 9, 3}, {33, 17, 65}, {64, 48, 100}, {7, 1, 1}};

Test(gemm, all_transposes_with_padded_leading_dimensions)
{
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                gemm_case g = single((dp_op)ta, (dp_op)tb, shapes[s][0], shapes[s][1],
                                     shapes[s][2], 0.7f, 0.3f);
                run_case(&g, 0);
            }
}

Test(gemm, alpha_one_beta_one_accumulates)
{
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            gemm_case g = single((dp_op)ta, (dp_op)tb, 6, 5, 8, 1.0f, 1.0f);
            run_case(&g, 0);
        }
}

/* beta == 0: C may hold garbage (NaN) and it must not reach the result. */
Test(gemm, beta_zero_ignores_nan_in_c)
{
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            gemm_case g = single((dp_op)ta, (dp_op)tb, 9, 6, 11, -1.3f, 0.0f);
            g.nan_c = 1;
            run_case(&g, 0);
            g.batch = 2, g.sa = 200, g.sb = 150, g.sc = 100;
            run_case(&g, 1);
        }
}

/* k == 0: op(A) op(B) is an empty sum, so C = beta C (and 0 for beta 0
 * even over NaN). A and B may be NULL. */
Test(gemm, k_zero_scales_c)
{
    for (int nan_c = 0; nan_c < 2; nan_c++) {
        const int m = 4, n = 3, ldc = 6;
        float C[18];
        for (int i = 0; i < 18; i++) C[i] = (i % ldc) < m ? (nan_c ? NAN : (float)i) : C_SENTINEL;
        float beta = nan_c ? 0.0f : 0.5f;
        dp_device *dev = dp_test_cpu(0);
        float *dC = dp_test_upload(dev, C, 18);
        dp_assert_ok(dp_gemm(dev, DP_OP_N, DP_OP_T, m, n, 0, 2.0f, NULL, m, NULL, n, beta, dC, ldc));
        float h[18];
        dp_assert_ok(dp_copy_d2h(dev, h, dC, sizeof h));
        for (int i = 0; i < 18; i++) {
            float want = (i % ldc) < m ? (nan_c ? 0.0f : 0.5f * (float)i) : C_SENTINEL;
            cr_assert_eq(h[i], want, "C[%d] = %g, want %g (beta %g)", i, h[i], want, beta);
        }
        /* Transposed A with k == 0 needs only lda >= 1. */
        dp_assert_ok(dp_gemm(dev, DP_OP_T, DP_OP_N, m, n, 0, 1.0f, NULL, 1, NULL, 1, 1.0f, dC, ldc));
        dp_device_close(dev);
    }
}

/* m == 0, n == 0 or batch == 0: nothing to do, C untouched, not an error. */
Test(gemm, empty_output_is_a_no_op)
{
    dp_device *dev = dp_test_cpu(0);
    float *dC = dp_test_upload(dev, (float[]){C_SENTINEL}, 1);
    dp_assert_ok(dp_gemm(dev, DP_OP_N, DP_OP_N, 0, 3, 2, 1.0f, NULL, 1, NULL, 2, 0.0f, dC, 1));
    dp_assert_ok(dp_gemm(dev, DP_OP_N, DP_OP_N, 1, 0, 2, 1.0f, NULL, 1, NULL, 2, 0.0f, dC, 1));
    dp_assert_ok(dp_gemm_strided_batched(dev, DP_OP_N, DP_OP_N, 1, 1, 1, 1.0f, NULL, 1, 0, NULL,
                                         1, 0, 0.0f, dC, 1, 0, 0));
    float h;
    dp_assert_ok(dp_copy_d2h(dev, &h, dC, sizeof h));
    cr_assert_eq(h, C_SENTINEL);
    dp_device_close(dev);
}

Test(gemm_batched, strides_larger_than_the_matrices)
{
    for (size_t s = 0; s < 3; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                gemm_case g = single((dp_op)ta, (dp_op)tb, shapes[s][0], shapes[s][1],
                                     shapes[s][2], 0.9f, -0.4f);
                g.batch = 3;
                /* Each stride leaves a gap of 11 floats after its matrix. */
                g.sa = (long long)g.lda * cols_a(&g) + 11;
                g.sb = (long long)g.ldb * cols_b(&g) + 11;
                g.sc = (long long)g.ldc * g.n + 11;
                run_case(&g, 1);
            }
}

/* Stride 0 reuses one matrix for every batch entry (e.g. shared weights). */
Test(gemm_batched, stride_zero_broadcasts_an_input)
{
    gemm_case g = single(DP_OP_T, DP_OP_N, 8, 5, 6, 1.0f, 0.0f);
    g.batch = 4;
    g.sa = (long long)g.lda * cols_a(&g) + 2;
    g.sb = 0;
    g.sc = (long long)g.ldc * g.n;
    run_case(&g, 1);
}

// --- argument errors ---------------------------------------------------------------

static void assert_invalid(dp_status s, const char *what)
{
    cr_assert_eq(s, DP_ERR_INVALID_ARGUMENT, "expected invalid argument, got %s (%s)",
                 dp_strerror(s), dp_last_error());
    cr_assert(strstr(dp_last_error(), what), "message \"%s\" does not mention \"%s\"",
              dp_last_error(), what);
}

Test(gemm, argument_errors)
{
    dp_device *dev = dp_test_cpu(6);
    float *A = dp_test_upload(dev, (float[64]){0}, 64), *B = dp_test_upload(dev, (float[64]){0}, 64);
    float *C = dp_test_upload(dev, (float[64]){0}, 64);
    /* m=4 n=3 k=2 fit: lda >= 4 (N) or 2 (T), ldb >= 2 (N) or 3 (T), ldc >= 4 */
    dp_assert_ok(dp_gemm(dev, DP_OP_N, DP_OP_N, 4, 3, 2, 1, A, 4, B, 2, 0, C, 4));
    dp_assert_ok(dp_gemm(dev, DP_OP_T, DP_OP_T, 4, 3, 2, 1, A, 2, B, 3, 0, C, 4));

    assert_invalid(dp_gemm(dev, DP_OP_N, DP_OP_N, -1, 3, 2, 1, A, 4, B, 2, 0, C, 4), "m=-1");
    assert_invalid(dp_gemm(dev, DP_OP_N, DP_OP_N, 4, -3, 2, 1, A, 4, B, 2, 0, C, 4), "n=-3");
    assert_invalid(dp_gemm(dev, DP_OP_N, DP_OP_N, 4, 3, -2, 1, A, 4, B, 2, 0, C, 4), "k=-2");
    assert_invalid(dp_gemm(dev, DP_OP_N, DP_OP_N, 4, 3, 2, 1, A, 3, B, 2, 0, C, 4), "lda=3");
    assert_invalid(dp_gemm(dev, DP_OP_T, DP_OP_N, 4, 3, 2, 1, A, 1, B, 2, 0, C, 4), "lda=1");
    assert_invalid(dp_gemm(dev, DP_OP_N, DP_OP_N, 4, 3, 2, 1, A, 4, B, 1, 0, C, 4), "ldb=1");
    assert_invalid(dp_gemm(dev, DP_OP_N, DP_OP_T, 4, 3, 2, 1, A, 4, B, 2, 0, C, 4), "ldb=2");
    assert_invalid(dp_gemm(dev, DP_OP_N, DP_OP_N, 4, 3, 2, 1, A, 4, B, 2, 0, C, 3), "ldc=3");
    assert_invalid(dp_gemm(dev, DP_OP_N, DP_OP_N, 4, 3, 2, 1, A, 0, B, 2, 0, C, 4), "cpu:6");
    assert_invalid(dp_gemm(dev, DP_OP_N, DP_OP_N, 4, 3, 2, 1, NULL, 4, B, 2, 0, C, 4), "NULL");
    assert_invalid(dp_gemm(dev, DP_OP_N, DP_OP_N, 4, 3, 2, 1, A, 4, NULL, 2, 0, C, 4), "NULL");
    assert_invalid(dp_gemm(dev, DP_OP_N, DP_OP_N, 4, 3, 2, 1, A, 4, B, 2, 0, NULL, 4), "NULL");
    assert_invalid(dp_gemm(dev, (dp_op)2, DP_OP_N, 4, 3, 2, 1, A, 4, B, 2, 0, C, 4), "DP_OP_T");
    assert_invalid(dp_gemm(NULL, DP_OP_N, DP_OP_N, 4, 3, 2, 1, A, 4, B, 2, 0, C, 4), "dev");
    assert_invalid(dp_gemm_strided_batched(dev, DP_OP_N, DP_OP_N, 4, 3, 2, 1, A, 4, 8, B, 2, 6,
                                           0, C, 4, 12, -1), "batch=-1");
    assert_invalid(dp_gemm_strided_batched(dev, DP_OP_N, DP_OP_N, 4, 3, 2, 1, A, 2, 8, B, 2, 6,
                                           0, C, 4, 12, 2), "lda=2");
    dp_device_close(dev);
}

// --- dp_gemm_ex: bfloat16 operands and bf16 math ---------------------------------------

/* Every transpose, padded leading dimensions, batches with gaps, beta 0
 * over NaN: each with A and B as float32 or bfloat16, in float32 and in
 * bf16 precision. The bf16-math runs must also move the result away from
 * the float32 product (the operands really were rounded). */
static void every_operand_type(void)
{
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                gemm_case g = single((dp_op)ta, (dp_op)tb, shapes[s][0], shapes[s][1],
                                     shapes[s][2], 0.7f, 0.3f);
                double moved = run_typed(&g);
                if (g.k >= 4)
                    cr_assert_gt(moved, 1e-4, "bf16 math left the float32 product unchanged "
                                 "(moved %g): the operands were not rounded", moved);
                g.batch = 3;
                g.sa = (long long)g.lda * cols_a(&g) + 11;
                g.sb = (long long)g.ldb * cols_b(&g) + 11;
                g.sc = (long long)g.ldc * g.n + 11;
                run_typed(&g);
            }
    gemm_case z = single(DP_OP_T, DP_OP_N, 9, 6, 11, -1.3f, 0.0f);
    z.nan_c = 1;
    run_typed(&z);
    gemm_case one = single(DP_OP_N, DP_OP_T, 6, 5, 8, 1.0f, 1.0f);
    run_typed(&one);
    gemm_case bcast = single(DP_OP_T, DP_OP_N, 8, 5, 6, 1.0f, 0.0f);
    bcast.batch = 4;
    bcast.sa = (long long)bcast.lda * cols_a(&bcast) + 2;
    bcast.sc = (long long)bcast.ldc * bcast.n;
    run_typed(&bcast);
}

Test(gemm_ex, every_operand_type_in_both_precisions) { every_operand_type(); }

/* The same on OpenBLAS's emulation of bf16 math, which runs wherever
 * oneDNN has no bf16 matmul (and here even where it has one). */
Test(gemm_ex, every_operand_type_on_the_openblas_emulation)
{
    allow_dnnl = 0;
    every_operand_type();
}

/* A GEMM that converts keeps the copy in scratch counted as reserved
 * memory, against the limit: past it the GEMM fails with a message and C
 * is left alone; a float32 GEMM in float32 precision converts nothing. */
Test(gemm_ex, conversion_scratch_is_reserved_and_limited)
{
    enum { M = 64, N = 64, K = 64 };
    dp_device *dev = dp_test_cpu(2);
    float *A = dp_test_upload(dev, (float[M * K]){0}, M * K);
    float *B = dp_test_upload(dev, (float[K * N]){0}, K * N);
    float *C = dp_test_upload(dev, (float[M * N]){0}, M * N);
    dp_memory_stats st;
    dp_assert_ok(dp_gemm(dev, DP_OP_N, DP_OP_N, M, N, K, 1, A, M, B, K, 0, C, M));
    dp_device_memory(dev, &st);
    cr_assert_eq(st.reserved, 0, "float32 math converted something (%zu bytes)", st.reserved);

    dp_assert_ok(dp_device_set_matmul_precision(dev, DP_MATMUL_BF16));
    cr_assert_eq(dp_device_matmul_precision(dev), DP_MATMUL_BF16);
    dp_assert_ok(dp_gemm(dev, DP_OP_N, DP_OP_N, M, N, K, 1, A, M, B, K, 0, C, M));
    dp_device_memory(dev, &st);
    /* both operands as bfloat16 at least */
    cr_assert_geq(st.reserved, (size_t)(M * K + K * N) * 2, "reserved %zu", st.reserved);

    /* a limit the scratch cannot grow under */
    size_t bigger = 512;
    float *A2 = NULL, *B2 = NULL, *C2 = NULL;
    dp_assert_ok(dp_device_alloc(dev, bigger * bigger * 4, (void **)&A2));
    dp_assert_ok(dp_device_alloc(dev, bigger * bigger * 4, (void **)&B2));
    dp_assert_ok(dp_device_alloc(dev, bigger * bigger * 4, (void **)&C2));
    dp_assert_ok(dp_memset(dev, A2, 0, bigger * bigger * 4));
    dp_assert_ok(dp_memset(dev, B2, 0, bigger * bigger * 4));
    dp_assert_ok(dp_memset(dev, C2, 0x7f, bigger * bigger * 4));
    dp_device_memory(dev, &st);
    dp_assert_ok(dp_device_set_limit(dev, st.in_use + st.reserved + 1024));
    dp_status s = dp_gemm(dev, DP_OP_N, DP_OP_N, (int)bigger, (int)bigger, (int)bigger, 1, A2,
                          (int)bigger, B2, (int)bigger, 0, C2, (int)bigger);
    cr_assert_eq(s, DP_ERR_OUT_OF_MEMORY, "got %s", dp_strerror(s));
    cr_assert(strstr(dp_last_error(), "cpu:2") && strstr(dp_last_error(), "scratch") &&
                  strstr(dp_last_error(), "limit"),
              "message: %s", dp_last_error());
    float h;
    dp_assert_ok(dp_copy_d2h(dev, &h, C2, sizeof h));
    unsigned char want[4] = {0x7f, 0x7f, 0x7f, 0x7f};
    cr_assert(memcmp(&h, want, 4) == 0, "C was written by a GEMM that failed");
    /* with room again it runs */
    dp_assert_ok(dp_device_set_limit(dev, 0));
    dp_assert_ok(dp_gemm(dev, DP_OP_N, DP_OP_N, (int)bigger, (int)bigger, (int)bigger, 1, A2,
                         (int)bigger, B2, (int)bigger, 0, C2, (int)bigger));
    dp_device_close(dev);
}

Test(gemm_ex, argument_errors)
{
    dp_device *dev = dp_test_cpu(0);
    float *A = dp_test_upload(dev, (float[64]){0}, 64), *B = dp_test_upload(dev, (float[64]){0}, 64);
    float *C = dp_test_upload(dev, (float[64]){0}, 64);
    dp_assert_ok(dp_gemm_ex(dev, DP_OP_N, DP_OP_N, 4, 3, 2, 1, A, DP_DTYPE_BF16, 4, 0, B,
                            DP_DTYPE_F32, 2, 0, 0, C, 4, 0, 1));
    assert_invalid(dp_gemm_ex(dev, DP_OP_N, DP_OP_N, 4, 3, 2, 1, A, DP_DTYPE_F16, 4, 0, B,
                              DP_DTYPE_F32, 2, 0, 0, C, 4, 0, 1), "F16");
    assert_invalid(dp_gemm_ex(dev, DP_OP_N, DP_OP_N, 4, 3, 2, 1, A, DP_DTYPE_F32, 4, 0, B,
                              (dp_dtype)99, 2, 0, 0, C, 4, 0, 1), "invalid dtype");
    assert_invalid(dp_gemm_ex(dev, DP_OP_N, DP_OP_N, 4, 3, 2, 1, A, DP_DTYPE_F32, 4, -8, B,
                              DP_DTYPE_F32, 2, 0, 0, C, 4, 0, 2), "strideA=-8");
    assert_invalid(dp_gemm_strided_batched(dev, DP_OP_N, DP_OP_N, 4, 3, 2, 1, A, 4, 0, B, 2, 0,
                                           0, C, 4, -1, 2), "strideC=-1");
    assert_invalid(dp_gemm_ex(dev, DP_OP_N, DP_OP_N, 4, 3, 2, 1, A, DP_DTYPE_F32, 3, 0, B,
                              DP_DTYPE_F32, 2, 0, 0, C, 4, 0, 1), "lda=3");
    assert_invalid(dp_device_set_matmul_precision(dev, DP_MATMUL_PRECISION_COUNT), "matmul");
    assert_invalid(dp_device_set_matmul_precision(NULL, DP_MATMUL_BF16), "dev");
    cr_assert_str_eq(dp_matmul_precision_name(DP_MATMUL_BF16), "bf16");
    cr_assert_str_eq(dp_matmul_precision_name((dp_matmul_precision)7), "invalid matmul precision");
    /* allow_tf32 is the TF32 precision */
    dp_assert_ok(dp_device_set_allow_tf32(dev, 1));
    cr_assert_eq(dp_device_matmul_precision(dev), DP_MATMUL_TF32);
    dp_assert_ok(dp_device_set_allow_tf32(dev, 0));
    cr_assert_eq(dp_device_matmul_precision(dev), DP_MATMUL_FP32);
    dp_device_close(dev);
}

// --- GEMMs cut into pieces (backend/gemm_pieces.h) ---------------------------------------

/* Every typed case again with the conversion scratch capped so that the
 * GEMMs are cut: 1 byte (blocks of 16 rows and columns, one matrix at a
 * time, or blocks of k) and 12000 bytes (groups of the batch). The
 * padding between a strided operand's columns holds NaN, so a block that
 * reads it fails; C's sentinel padding must survive every piece. */
Test(gemm_ex, pieces_under_a_capped_scratch_give_the_same_product)
{
    static const size_t caps[] = {1, 12000};
    /* the last two cut k: C is too narrow to cut within the cap */
    static const int big[][3] = {{40, 37, 33}, {17, 66, 50}, {8, 12, 300}, {20, 5, 90}};
    for (size_t c = 0; c < sizeof caps / sizeof *caps; c++) {
        convert_cap = caps[c];
        for (size_t s = 0; s < sizeof big / sizeof big[0]; s++)
            for (int ta = 0; ta < 2; ta++)
                for (int tb = 0; tb < 2; tb++) {
                    gemm_case g = single((dp_op)ta, (dp_op)tb, big[s][0], big[s][1], big[s][2],
                                         0.7f, 0.3f);
                    run_typed(&g);
                    g.batch = 5;
                    g.sa = (long long)g.lda * cols_a(&g) + 11;
                    g.sb = (long long)g.ldb * cols_b(&g) + 11;
                    g.sc = (long long)g.ldc * g.n + 11;
                    run_typed(&g);
                    g.sa = 0; /* one A for the whole batch */
                    run_typed(&g);
                }
    }
    convert_cap = 0;
}

/* bf16 math on oneDNN adding into a C of more than 2 MiB (the LM head's
 * weight gradient): run in blocks of C's columns (dp_gemm_plan_sum_cut),
 * each block's product and beta * C where the float64 reference puts
 * them, the sentinel padding between C's columns untouched, with and
 * without operands to convert. */
Test(gemm_ex, adding_into_a_large_c_in_blocks_gives_the_same_product)
{
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            /* 259 x 2100 floats of C: 2.2 MB, two blocks of columns */
            gemm_case g = single((dp_op)ta, (dp_op)tb, 256, 2100, 16, 0.7f, 0.3f);
            for (int t16 = 0; t16 < 2; t16++) {
                gemm_mode mode = {2, t16, t16, DP_MATMUL_BF16};
                run_mode(&g, mode);
            }
        }
}

/* The plan itself: below the cap one piece; then groups of the batch; then
 * blocks of C's rows (A converts), columns (B converts) or both, or blocks
 * of k when that moves fewer bytes again; multiples of 16 and never over
 * the cap (unless 16 alone are). */
Test(gemm_ex, piece_plans)
{
    dp_gemm_plan p = dp_gemm_plan_pieces(100, 80, 64, 4, 1, 1, 2, 1 << 20);
    cr_assert(p.g == 4 && p.mb == 100 && p.nb == 80, "whole: %d %d %d", p.g, p.mb, p.nb);
    p = dp_gemm_plan_pieces(100, 80, 64, 4, 1, 1, 2, 2 * (100 * 64 + 64 * 80) * 2);
    cr_assert(p.g == 2 && p.mb == 100 && p.nb == 80, "groups: %d %d %d", p.g, p.mb, p.nb);
    p = dp_gemm_plan_pieces(1000, 80, 64, 1, 1, 0, 2, 64 * 2 * 100);
    cr_assert(p.g == 1 && p.mb == 96 && p.nb == 80, "rows: %d %d %d", p.g, p.mb, p.nb);
    p = dp_gemm_plan_pieces(80, 1000, 64, 3, 0, 1, 4, 64 * 4 * 50);
    cr_assert(p.g == 1 && p.mb == 80 && p.nb == 48, "columns: %d %d %d", p.g, p.mb, p.nb);
    p = dp_gemm_plan_pieces(1000, 1000, 64, 1, 1, 1, 2, 64 * 2 * 200);
    cr_assert(p.mb == 96 && p.nb == 96, "both: %d %d", p.mb, p.nb);
    p = dp_gemm_plan_pieces(10, 1000, 64, 1, 1, 1, 2, 64 * 2 * 200);
    cr_assert(p.mb == 10 && p.nb == 176, "A whole: %d %d", p.mb, p.nb);
    p = dp_gemm_plan_pieces(1000, 1000, 64, 1, 1, 1, 2, 1);
    cr_assert(p.mb == 16 && p.nb == 16, "floor: %d %d", p.mb, p.nb);
    /* The head's backward at V = 40000, C = 256, 256 rows, bf16 math. Its
     * input gradient (the logits' gradient converts): cutting C's columns
     * would read the 20 MB head weight twice, cutting k re-reads 256 KiB of
     * C, so k is cut. */
    const size_t mib16 = (size_t)16 << 20;
    p = dp_gemm_plan_pieces(256, 256, 40000, 1, 0, 1, 2, mib16);
    cr_assert(p.mb == 256 && p.nb == 256 && p.kb == 32768, "k: %d %d %d", p.mb, p.nb, p.kb);
    /* Its weight gradient (both convert, k = 256 rows): C's columns. */
    p = dp_gemm_plan_pieces(256, 40000, 256, 1, 1, 1, 2, mib16);
    cr_assert(p.mb == 256 && p.nb == 32512 && p.kb == 256, "n: %d %d %d", p.mb, p.nb, p.kb);
    /* C too narrow to cut within the cap: k is cut */
    p = dp_gemm_plan_pieces(8, 12, 300, 1, 0, 1, 2, 3000);
    cr_assert(p.mb == 8 && p.nb == 12 && p.kb == 112, "narrow: %d %d %d", p.mb, p.nb, p.kb);
    /* Adding into C on oneDNN: the head's weight gradient at V 8192, C 256
     * in blocks of 2048 columns (2 MiB); a C within the cap as it is; a
     * column over the cap alone in blocks of 16 columns. */
    const size_t mib2 = (size_t)2 << 20;
    dp_gemm_plan whole = {1, 256, 8192, 256};
    p = dp_gemm_plan_sum_cut(whole, mib2);
    cr_assert(p.g == 1 && p.mb == 256 && p.nb == 2048 && p.kb == 256, "sum: %d %d %d %d", p.g,
              p.mb, p.nb, p.kb);
    p = dp_gemm_plan_sum_cut((dp_gemm_plan){4, 256, 2048, 64}, mib2);
    cr_assert(p.g == 4 && p.mb == 256 && p.nb == 2048 && p.kb == 64, "within: %d %d", p.mb, p.nb);
    p = dp_gemm_plan_sum_cut((dp_gemm_plan){1, 600000, 100, 8}, mib2);
    cr_assert(p.mb == 600000 && p.nb == 16, "tall: %d %d", p.mb, p.nb);
    p = dp_gemm_plan_sum_cut((dp_gemm_plan){1, 1000, 600, 8}, mib2);
    cr_assert(p.nb == 512, "columns of 4000 bytes: %d", p.nb);
    p = dp_gemm_plan_pieces(1000, 1000, 64, 7, 0, 0, 2, 1);
    cr_assert(p.g == 7 && p.mb == 1000 && p.nb == 1000, "nothing converts: %d %d %d", p.g, p.mb,
              p.nb);
    for (int m = 1; m < 300; m += 37)
        for (int n = 1; n < 300; n += 41)
            for (int a = 0; a < 2; a++)
                for (int b = 0; b < 2; b++) {
                    size_t cap = 64 * 2 * 40;
                    p = dp_gemm_plan_pieces(m, n, 64, 3, a, b, 2, cap);
                    cr_assert(p.g >= 1 && p.g <= 3 && p.mb >= 1 && p.mb <= m && p.nb >= 1 &&
                              p.nb <= n);
                    cr_assert(p.kb >= 1 && p.kb <= 64 && (p.kb == 64 || (p.mb == m && p.nb == n)),
                              "k is cut only when C is not");
                    size_t bytes = dp_gemm_piece_bytes(a, b, 2, p.mb, p.nb, p.kb, p.g);
                    cr_assert(bytes <= cap ||
                                  (p.g == 1 && (p.mb == 16 || p.nb == 16 || p.kb == 16)),
                              "m %d n %d a %d b %d: %zu bytes over the cap", m, n, a, b, bytes);
                }
}

/* A GEMM that would convert 2 MiB at once stays within a 256 KiB cap: the
 * reserved scratch is bounded, a memory limit that leaves 512 KiB is
 * enough, and the product is still the float64 one of the rounded operands. */
Test(gemm_ex, a_capped_scratch_bounds_reserved_memory)
{
    enum { M = 1024, N = 1024, K = 512 };
    const size_t cap = (size_t)256 << 10;
    dp_device *dev = dp_test_cpu(3);
    dp_device_set_gemm_convert_cap(dev, cap);
    dp_assert_ok(dp_device_set_matmul_precision(dev, DP_MATMUL_BF16));
    float *hA = malloc((size_t)M * K * sizeof *hA), *hB = malloc((size_t)K * N * sizeof *hB);
    float *hC = malloc((size_t)M * N * sizeof *hC);
    cr_assert(hA && hB && hC);
    dp_rng rng;
    dp_rng_seed(&rng, 7);
    for (size_t i = 0; i < (size_t)M * K; i++) hA[i] = 2.0f * dp_rng_uniform(&rng) - 1.0f;
    for (size_t i = 0; i < (size_t)K * N; i++) hB[i] = 2.0f * dp_rng_uniform(&rng) - 1.0f;
    float *A = dp_test_upload(dev, hA, (size_t)M * K), *B = dp_test_upload(dev, hB, (size_t)K * N);
    float *C = NULL;
    dp_assert_ok(dp_device_alloc(dev, (size_t)M * N * sizeof *C, (void **)&C));
    dp_memory_stats st;
    dp_device_memory(dev, &st);
    dp_assert_ok(dp_device_set_limit(dev, st.in_use + st.reserved + ((size_t)512 << 10)));
    dp_assert_ok(dp_gemm(dev, DP_OP_T, DP_OP_N, M, N, K, 1.0f, A, K, B, K, 0.0f, C, M));
    dp_device_memory(dev, &st);
    cr_assert_leq(st.reserved, (size_t)512 << 10, "reserved %zu bytes under a %zu-byte cap",
                  st.reserved, cap);
    cr_assert_gt(st.reserved, 0);
    dp_assert_ok(dp_copy_d2h(dev, hC, C, (size_t)M * N * sizeof *hC));
    /* spot checks against float64 on the rounded operands (k = 512: float32
     * sums are within ~1e-5 of it; a misplaced block is off by O(1)) */
    for (int t = 0; t < 2000; t++) {
        int i = (int)(dp_rng_uniform(&rng) * M), j = (int)(dp_rng_uniform(&rng) * N);
        double want = 0.0;
        for (int l = 0; l < K; l++)
            want += effective(hA[(size_t)i * K + l], 1) * effective(hB[(size_t)j * K + l], 1);
        double got = hC[(size_t)j * M + i];
        cr_assert(fabs(got - want) <= 1e-4 + 1e-4 * fabs(want), "C(%d,%d) = %.9g, want %.9g", i,
                  j, got, want);
    }
    dp_device_free(dev, A), dp_device_free(dev, B), dp_device_free(dev, C);
    free(hA), free(hB), free(hC);
    dp_device_close(dev);
}

// --- dp_device_matmul_native ---------------------------------------------------------------

/* oneDNN 2.x builds a bf16 matmul on x86 CPUs with AVX-512 (avx512_core:
 * F, BW, VL, DQ), with or without AVX512-BF16; DNNL_MAX_CPU_ISA can lower
 * that, so the expectation holds only without it. */
static int dnnl_bf16_expected(void)
{
#if defined(__x86_64__) && DP_TEST_HAVE_DNNL
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
    return 0;
#endif
}

/* FP32 is native, TF32 is not on CPUs (it computes as FP32), BF16 is
 * where oneDNN builds its matmul, and never where the GEMMs are kept off
 * oneDNN (they then emulate it on OpenBLAS); the answer is the same twice
 * (the probe is cached), and bad arguments are refused. */
Test(gemm_ex, matmul_native_says_where_bf16_runs_on_its_own_kernels)
{
    dp_device *dev = dp_test_cpu(0);
    int native = -1;
    dp_assert_ok(dp_device_matmul_native(dev, DP_MATMUL_FP32, &native));
    cr_assert_eq(native, 1);
    dp_assert_ok(dp_device_matmul_native(dev, DP_MATMUL_TF32, &native));
    cr_assert_eq(native, 0);
    int bf16 = -1;
    dp_assert_ok(dp_device_matmul_native(dev, DP_MATMUL_BF16, &bf16));
    if (!getenv("DNNL_MAX_CPU_ISA"))
        cr_assert_eq(bf16, dnnl_bf16_expected(), "bf16 native %d on a CPU where oneDNN 2.x "
                     "%s a bf16 matmul", bf16, dnnl_bf16_expected() ? "has" : "has no");
    dp_assert_ok(dp_device_matmul_native(dev, DP_MATMUL_BF16, &native));
    cr_assert_eq(native, bf16, "a second answer differs");
    dp_device_set_gemm_dnnl(dev, 0);
    dp_assert_ok(dp_device_matmul_native(dev, DP_MATMUL_BF16, &native));
    cr_assert_eq(native, 0, "BF16 native with the GEMMs kept off oneDNN");
    dp_device_set_gemm_dnnl(dev, 1);
    assert_invalid(dp_device_matmul_native(NULL, DP_MATMUL_FP32, &native), "NULL");
    assert_invalid(dp_device_matmul_native(dev, DP_MATMUL_FP32, NULL), "NULL");
    assert_invalid(dp_device_matmul_native(dev, DP_MATMUL_PRECISION_COUNT, &native),
                   "DP_MATMUL_BF16");
    dp_device_close(dev);
}
