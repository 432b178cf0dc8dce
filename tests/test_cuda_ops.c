/*
 * The CUDA backend, op by op, against the CPU backend (the idea of ggml's
 * test-backend-ops): every vtable entry runs on each visible CUDA device
 * and on cpu:0 with the same random inputs (fixed seeds), and the outputs
 * are compared with a bound stated per op. Also: GEMM against a float64
 * reference with the float32 (and TF32) error bound, copies across the
 * staging-chunk boundaries, peer copies and their ordering, two logical
 * devices on one GPU driven from two threads, accounting and out of memory.
 *
 * Why some ops must match bit for bit: both backends call the same DP_HD
 * functions, so an op made of copies or of float additions in a fixed
 * order (permutes, encoder, bias sums, add, accumulate, scale) has exactly
 * one correctly rounded answer. Ops with products may differ by nvcc's
 * FMA contraction (one rounding instead of two) and those with exp by the
 * two expf implementations (each within 2 ulp): a few ulp per element.
 *
 * Without a GPU, every GPU test skips with "no CUDA device" (probed in the
 * test body). These run everywhere: the no-GPU behaviour (zero devices, a
 * clear error for cuda:0), the ELF check that dp needs the CUDA runtime and
 * never the driver library, and the TF32 option's argument checks.
 * DP_TEST_CUDA_AS_CPU=1 runs the GPU tests against virtual CPU devices
 * instead (cpu:1, cpu:2 stand in for the GPUs), to check the tests
 * themselves where no GPU exists; the comparisons are then CPU vs CPU.
 */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <elf.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/device_graph.h"
#include "backend/device_testing.h"
#include "core/module.h"
#include "dp/optim.h"
#include "nn/nn_act16.h"
#include "optim/adamw_segments.h"
#include "flash_tc_bound.h"
#include "kernels/gelu.h"
#include "nn_test_util.h"

// --- targets ----------------------------------------------------------------------------

static int as_cpu(void)
{
    const char *e = getenv("DP_TEST_CUDA_AS_CPU");
    return e && strcmp(e, "1") == 0;
}

/* Devices under test: the visible GPUs, or two CPU stand-ins. */
static int n_targets(void) { return as_cpu() ? 2 : dp_cuda_device_count(); }

#define REQUIRE_GPU()                                                   \
    do {                                                                \
        if (n_targets() == 0) cr_skip_test("no CUDA device");           \
    } while (0)

/* A GPU and cuDNN's attention module (libdp-cudnn and libcudnn.so.9). */
#define REQUIRE_CUDNN()                                                              \
    do {                                                                             \
        REQUIRE_GPU();                                                               \
        if (as_cpu()) cr_skip_test("cuDNN runs on GPUs only");                       \
        const void *table_ = NULL;                                                   \
        if (dp_module_load(DP_MODULE_CUDNN, &table_) != DP_OK)                       \
            cr_skip_test("no cuDNN attention here: %s", dp_last_error());            \
    } while (0)

/* Target i: cuda:i (a new logical device each call), or cpu:i+1. */
static dp_device *open_target(int i)
{
    dp_device_spec s = {as_cpu() ? DP_DEVICE_CPU : DP_DEVICE_CUDA, as_cpu() ? i + 1 : i};
    dp_device *d = NULL;
    dp_assert_ok(dp_device_open(&s, &d));
    return d;
}

/* Target i opened with DP_CUDA_CUDNN as mode says (NULL: unset, the
 * default), which the device reads as it opens; then back to "0". */
static dp_device *open_target_cudnn(int i, const char *mode)
{
    if (mode) setenv("DP_CUDA_CUDNN", mode, 1);
    else unsetenv("DP_CUDA_CUDNN");
    dp_device *d = open_target(i);
    setenv("DP_CUDA_CUDNN", "0", 1);
    return d;
}

static void close_checked(dp_device *dev)
{
    dp_memory_stats st;
    dp_device_memory(dev, &st);
    cr_assert_eq(st.in_use, 0, "%zu bytes still allocated on %s", st.in_use, dp_device_name(dev));
    dp_device_close(dev);
}

/* dp's own attention kernels in every test that does not ask for cuDNN's
 * (DP_CUDA_CUDNN is read as a device opens): the default, cuDNN's where
 * it loads, would run cuDNN under the tests of dp's kernels. */
__attribute__((constructor)) static void dp_kernels_unless_asked(void)
{
    setenv("DP_CUDA_CUDNN", "0", 1);
}

// --- host data and comparisons -------------------------------------------------------------

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    cr_assert_not_null(p, "out of host memory");
    return p;
}

static float *rnd(uint64_t seed, size_t n, float lo, float hi)
{
    float *x = xmalloc(n * sizeof *x);
    dp_rng rng;
    dp_rng_seed(&rng, seed);
    dp_rng_fill_uniform(&rng, x, n, lo, hi);
    return x;
}

static float *rnd_normal(uint64_t seed, size_t n, float mean, float std)
{
    float *x = xmalloc(n * sizeof *x);
    dp_rng rng;
    dp_rng_seed(&rng, seed);
    dp_rng_fill_normal(&rng, x, n, mean, std);
    return x;
}

static void *dalloc(dp_device *d, size_t bytes)
{
    void *p = NULL;
    dp_assert_ok(dp_device_alloc(d, bytes ? bytes : 1, &p));
    return p;
}

/* Bitwise equality of n floats, naming the first difference. */
static void assert_same_bits(const char *what, const float *a, const float *e, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &e[i], sizeof(float)) != 0)
            cr_assert_fail("%s: element %zu of %zu differs: %a (%.9g) vs %a (%.9g)", what, i, n,
                           (double)a[i], (double)a[i], (double)e[i], (double)e[i]);
}

/* The two devices of a comparison: [0] = cpu:0 (the reference backend), [1] = target g. */
typedef struct pair {
    dp_device *d[2];
} pair;

static pair pair_open(int g)
{
    pair p;
    p.d[0] = dp_test_cpu(0);
    p.d[1] = open_target(g);
    return p;
}

static void pair_close(pair *p)
{
    close_checked(p->d[1]);
    close_checked(p->d[0]);
}

#define FOR_TARGETS(g) for (int g = 0; g < n_targets(); g++)

// --- runs without a GPU ------------------------------------------------------------------

/* With no GPU: 0 devices, and cuda:0 is a clear error (not a crash, not a
 * hang) from the device list and from dp_device_open. With GPUs: the first
 * index past the last is the same clear error. */
Test(cuda_probe, missing_device_is_a_clear_error)
{
    int n = dp_cuda_device_count();
    cr_assert_geq(n, 0);
    cr_assert_eq(dp_cuda_device_count(), n, "the count must be stable");
    char name[32], list[32];
    snprintf(name, sizeof name, "cuda:%d", n);
    snprintf(list, sizeof list, "cuda:%d", n);
    dp_device_spec specs[4];
    size_t k = 99;
    dp_clear_error();
    cr_assert_eq(dp_device_list_parse(list, specs, 4, &k), DP_ERR_NO_DEVICE);
    cr_assert_eq(k, 0);
    cr_assert(strstr(dp_last_error(), name), "message: %s", dp_last_error());
    dp_device_spec s = {DP_DEVICE_CUDA, n};
    dp_device *dev = (dp_device *)1;
    dp_clear_error();
    cr_assert_eq(dp_device_open(&s, &dev), DP_ERR_NO_DEVICE);
    cr_assert_null(dev);
    cr_assert(strstr(dp_last_error(), name), "message: %s", dp_last_error());
    if (n == 0) {
        cr_assert_eq(dp_device_list_parse("cuda", specs, 4, &k), DP_ERR_NO_DEVICE);
        cr_assert(strstr(dp_last_error(), "none is visible"), "message: %s", dp_last_error());
        /* auto falls back to CPU devices */
        dp_assert_ok(dp_device_list_parse("auto", specs, 4, &k));
        cr_assert(k >= 1 && specs[0].kind == DP_DEVICE_CPU);
    }
}

/* Names in DT_NEEDED of the ELF file at path, '\n'-separated, into buf. */
static void elf_needed(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *img = xmalloc((size_t)size);
    cr_assert_eq(fread(img, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    Elf64_Ehdr eh;
    memcpy(&eh, img, sizeof eh);
    cr_assert(memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 && eh.e_ident[EI_CLASS] == ELFCLASS64,
              "%s is not a 64-bit ELF file", path);
    buf[0] = 0;
    int found_dynamic = 0;
    for (int i = 0; i < eh.e_shnum; i++) {
        Elf64_Shdr sh;
        memcpy(&sh, img + eh.e_shoff + (size_t)i * eh.e_shentsize, sizeof sh);
        if (sh.sh_type != SHT_DYNAMIC) continue;
        found_dynamic = 1;
        Elf64_Shdr strsh;
        memcpy(&strsh, img + eh.e_shoff + (size_t)sh.sh_link * eh.e_shentsize, sizeof strsh);
        const char *strtab = (const char *)img + strsh.sh_offset;
        for (size_t off = 0; off + sizeof(Elf64_Dyn) <= sh.sh_size; off += sizeof(Elf64_Dyn)) {
            Elf64_Dyn dyn;
            memcpy(&dyn, img + sh.sh_offset + off, sizeof dyn);
            if (dyn.d_tag == DT_NULL) break;
            if (dyn.d_tag != DT_NEEDED) continue;
            size_t used = strlen(buf);
            snprintf(buf + used, cap - used, "%s\n", strtab + dyn.d_un.d_val);
        }
    }
    cr_assert(found_dynamic, "%s has no dynamic section", path);
    free(img);
}

/* Asserts the DT_NEEDED names of the ELF file at path hold a libc, never
 * the driver library libcuda.so, and hold the CUDA runtime and cuBLAS
 * when cuda is 1, neither when 0. */
static void check_needed(const char *path, int cuda)
{
    char needed[8192];
    elf_needed(path, needed, sizeof needed);
    cr_assert(strstr(needed, "libc.so") != NULL, "%s: no DT_NEEDED parsed:\n%s", path, needed);
    for (const char *p = needed; *p; p = strchr(p, '\n') + 1)
        cr_assert(strncmp(p, "libcuda.so", 10) != 0, "%s needs the driver library:\n%s", path,
                  needed);
    if (cuda) {
        cr_assert(strstr(needed, "libcudart.so") != NULL, "%s (a CUDA build) does not need "
                  "libcudart:\n%s", path, needed);
        cr_assert(strstr(needed, "libcublas.so") != NULL, "%s does not need libcublas:\n%s",
                  path, needed);
    } else {
        cr_assert(strstr(needed, "libcudart") == NULL, "%s needs libcudart:\n%s", path, needed);
        cr_assert(strstr(needed, "libcublas") == NULL, "%s needs libcublas:\n%s", path, needed);
        cr_assert(strstr(needed, "libnccl") == NULL, "%s needs libnccl:\n%s", path, needed);
    }
}

/* dp must start on a machine without a GPU driver: it may need the CUDA
 * runtime (libcudart) and cuBLAS, never the driver library libcuda.so.
 * A shared libdp needs neither: they are the CUDA module's
 * (libdp-cuda.so.0, next to libdp), so CPU-only programs run without
 * them. A static libdp holds the module: the executable is checked. */
Test(cuda_probe, dp_needs_the_runtime_never_the_driver)
{
    Dl_info info;
    cr_assert(dladdr((void *)dp_device_open, &info) && info.dli_fname, "dladdr failed");
    char path[4096];
    int shared = strchr(info.dli_fname, '/') && strstr(info.dli_fname, "libdp.so");
    if (strchr(info.dli_fname, '/'))
        snprintf(path, sizeof path, "%s", info.dli_fname);
    else
        snprintf(path, sizeof path, "/proc/self/exe");
#ifdef DP_HAVE_CUDA
    const int cuda = 1;
#else
    const int cuda = 0;
#endif
    if (!shared) {
        check_needed(path, cuda);
        return;
    }
    check_needed(path, 0);
    if (cuda) {
        char module[4096 + 32];
        snprintf(module, sizeof module, "%.*s/libdp-cuda.so.0",
                 (int)(strrchr(path, '/') - path), path);
        check_needed(module, 1);
    }
}

Test(cuda_probe, tf32_option_checks_its_arguments)
{
    dp_clear_error();
    cr_assert_eq(dp_device_set_allow_tf32(NULL, 1), DP_ERR_INVALID_ARGUMENT);
    /* named as the call made, not the one it forwards to */
    cr_assert(strstr(dp_last_error(), "dp_device_set_allow_tf32") &&
                  strstr(dp_last_error(), "dev"), "%s", dp_last_error());
    dp_device *cpu = dp_test_cpu(0);
    dp_assert_ok(dp_device_set_allow_tf32(cpu, 1)); /* no effect on a CPU device */
    dp_assert_ok(dp_device_set_allow_tf32(cpu, 0));
    dp_device_close(cpu);
}

// --- GEMM against float64 ------------------------------------------------------------------

typedef struct gemm_case {
    dp_op ta, tb;
    int m, n, k, lda, ldb, ldc, batch;
    long long sa, sb, sc; /* strides in floats (batch > 1) */
    float alpha, beta;
    int a16, b16;  /* dp_gemm_ex with A, B stored as bfloat16 */
    int bf16_math; /* the device's matmul precision DP_MATMUL_BF16 */
} gemm_case;

/* The value a GEMM multiplies: rounded to bfloat16 when stored so or in
 * bf16 math. */
static double gemm_value(float x, int rounded)
{
    return rounded ? (double)dp_bf16_to_float(dp_bf16_from_float(x)) : (double)x;
}

/* n host floats as a device buffer of bfloat16 (bf16) or float32. */
static uint16_t *download_u16(dp_device *d, const uint16_t *p, size_t n)
{
    uint16_t *h = xmalloc(n * sizeof *h);
    dp_assert_ok(dp_copy_d2h(d, h, p, n * sizeof *h));
    return h;
}

static void *upload_typed(dp_device *d, const float *x, size_t n, int bf16)
{
    if (!bf16) return dp_test_upload(d, x, n);
    dp_bf16 *h = xmalloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = dp_bf16_from_float(x[i]);
    void *p = dalloc(d, n * sizeof *h);
    dp_assert_ok(dp_copy_h2d(d, p, h, n * sizeof *h));
    free(h);
    return p;
}

/* Runs c on dev and checks every element of C against float64:
 * |C - ref| <= bound_rel * (|alpha| sum_l |a||b| + |beta| |C0|) + 1e-30,
 * and that the padding rows (ldc > m) and the gaps between batches are
 * untouched. With beta == 0, C starts as NaN: it must not leak. */
static void check_gemm(dp_device *dev, const gemm_case *c, double bound_rel, uint64_t seed)
{
    int rows_a = c->ta == DP_OP_N ? c->m : c->k, cols_a = c->ta == DP_OP_N ? c->k : c->m;
    int rows_b = c->tb == DP_OP_N ? c->k : c->n, cols_b = c->tb == DP_OP_N ? c->n : c->k;
    long long sa = c->batch > 1 ? c->sa : 0, sb = c->batch > 1 ? c->sb : 0,
              sc = c->batch > 1 ? c->sc : 0;
    size_t na = (size_t)(sa * (c->batch - 1)) + (size_t)c->lda * (size_t)(cols_a ? cols_a : 1);
    size_t nb = (size_t)(sb * (c->batch - 1)) + (size_t)c->ldb * (size_t)(cols_b ? cols_b : 1);
    size_t nc = (size_t)(sc * (c->batch - 1)) + (size_t)c->ldc * (size_t)c->n;
    (void)rows_a;
    (void)rows_b;
    float *A = rnd(seed, na, -1, 1), *B = rnd(seed + 1, nb, -1, 1), *C0 = rnd(seed + 2, nc, -1, 1);
    if (c->beta == 0.0f)
        for (size_t i = 0; i < nc; i++) C0[i] = NAN;
    /* Gaps (padding rows, between batches) hold a marker that must survive. */
    char *is_out = calloc(nc, 1);
    for (int b = 0; b < c->batch; b++)
        for (int j = 0; j < c->n; j++)
            for (int i = 0; i < c->m; i++) is_out[(size_t)(b * sc) + (size_t)j * c->ldc + i] = 1;
    for (size_t i = 0; i < nc; i++)
        if (!is_out[i]) C0[i] = 12345.0f;
    void *dA = upload_typed(dev, A, na, c->a16), *dB = upload_typed(dev, B, nb, c->b16);
    float *dC = dp_test_upload(dev, C0, nc);
    int ra = c->a16 || c->bf16_math, rb = c->b16 || c->bf16_math;
    dp_assert_ok(dp_device_set_matmul_precision(dev, c->bf16_math ? DP_MATMUL_BF16 : DP_MATMUL_FP32));
    if (c->a16 || c->b16 || c->bf16_math)
        dp_assert_ok(dp_gemm_ex(dev, c->ta, c->tb, c->m, c->n, c->k, c->alpha, c->k ? dA : NULL,
                                c->a16 ? DP_DTYPE_BF16 : DP_DTYPE_F32, c->lda, sa,
                                c->k ? dB : NULL, c->b16 ? DP_DTYPE_BF16 : DP_DTYPE_F32, c->ldb,
                                sb, c->beta, dC, c->ldc, sc, c->batch));
    else if (c->batch == 1 && !sa && !sb && !sc)
        dp_assert_ok(dp_gemm(dev, c->ta, c->tb, c->m, c->n, c->k, c->alpha, c->k ? dA : NULL,
                             c->lda, c->k ? dB : NULL, c->ldb, c->beta, dC, c->ldc));
    else
        dp_assert_ok(dp_gemm_strided_batched(dev, c->ta, c->tb, c->m, c->n, c->k, c->alpha, dA,
                                             c->lda, sa, dB, c->ldb, sb, c->beta, dC, c->ldc, sc,
                                             c->batch));
    float *got = dp_test_nn_download(dev, dC, nc);
    double worst = 0.0;
    for (int b = 0; b < c->batch; b++)
        for (int j = 0; j < c->n; j++)
            for (int i = 0; i < c->m; i++) {
                double s = 0.0, mag = 0.0;
                for (int l = 0; l < c->k; l++) {
                    double a = gemm_value(c->ta == DP_OP_N
                                              ? A[(size_t)(b * sa) + (size_t)l * c->lda + i]
                                              : A[(size_t)(b * sa) + (size_t)i * c->lda + l], ra);
                    double bb = gemm_value(c->tb == DP_OP_N
                                               ? B[(size_t)(b * sb) + (size_t)j * c->ldb + l]
                                               : B[(size_t)(b * sb) + (size_t)l * c->ldb + j], rb);
                    s += a * bb;
                    mag += fabs(a * bb);
                }
                size_t ci = (size_t)(b * sc) + (size_t)j * c->ldc + i;
                double ref = (double)c->alpha * s, scale = fabs((double)c->alpha) * mag;
                if (c->beta != 0.0f) {
                    ref += (double)c->beta * C0[ci];
                    scale += fabs((double)c->beta * C0[ci]);
                }
                double err = fabs((double)got[ci] - ref);
                cr_assert(err <= bound_rel * scale + 1e-30,
                          "%s gemm(%c%c m=%d n=%d k=%d batch=%d) C[%d](%d,%d) = %.9g, float64 "
                          "%.9g: error %.3g > bound %.3g", dp_device_name(dev),
                          c->ta == DP_OP_N ? 'N' : 'T', c->tb == DP_OP_N ? 'N' : 'T', c->m, c->n,
                          c->k, c->batch, b, i, j, (double)got[ci], ref, err,
                          bound_rel * scale);
                if (scale > 0 && err / scale > worst) worst = err / scale;
            }
    for (size_t i = 0; i < nc; i++)
        if (!is_out[i])
            cr_assert_eq(got[i], 12345.0f, "%s gemm wrote outside C (flat index %zu)",
                         dp_device_name(dev), i);
    cr_log_info("%s gemm %c%c %dx%dx%d batch %d: worst error / bound scale %.3g",
                dp_device_name(dev), c->ta == DP_OP_N ? 'N' : 'T', c->tb == DP_OP_N ? 'N' : 'T',
                c->m, c->n, c->k, c->batch, worst);
    dp_device_free(dev, dA);
    dp_device_free(dev, dB);
    dp_device_free(dev, dC);
    dp_assert_ok(dp_device_set_matmul_precision(dev, DP_MATMUL_FP32));
    free(A);
    free(B);
    free(C0);
    free(got);
    free(is_out);
}

/* float32 bound for a k-term dot product plus the alpha/beta step:
 * gamma_{k+2} = (k+2) u / (1 - (k+2) u), u = 2^-24 (any summation order,
 * with or without FMA; Higham, Accuracy and Stability, ch. 3). */
static double gamma_f32(int k)
{
    double u = ldexp(1.0, -24), nu = (k + 2) * u;
    return nu / (1.0 - nu);
}

static gemm_case gc(dp_op ta, dp_op tb, int m, int n, int k, int pad, float alpha, float beta)
{
    gemm_case c;
    memset(&c, 0, sizeof c);
    c.ta = ta;
    c.tb = tb;
    c.m = m;
    c.n = n;
    c.k = k;
    c.lda = (ta == DP_OP_N ? m : k) + pad;
    c.ldb = (tb == DP_OP_N ? k : n) + pad;
    c.ldc = m + pad;
    if (c.lda < 1) c.lda = 1;
    if (c.ldb < 1) c.ldb = 1;
    c.batch = 1;
    c.alpha = alpha;
    c.beta = beta;
    return c;
}

/* Mode 0-2: bf16 math with A, B float32 / A bf16 / B bf16; mode 3:
 * float32 math with a bf16 A. */
static gemm_case typed(gemm_case c, int mode)
{
    c.bf16_math = mode < 3;
    c.a16 = mode == 1 || mode == 3;
    c.b16 = mode == 2;
    return c;
}

/* c as a batch of n matrices with gaps between them (7, 5 and 11 elements). */
static gemm_case batched(gemm_case c, int n)
{
    c.batch = n;
    c.sa = (long long)c.lda * (c.ta == DP_OP_N ? c.k : c.m) + 7;
    c.sb = (long long)c.ldb * (c.tb == DP_OP_N ? c.n : c.k) + 5;
    c.sc = (long long)c.ldc * c.n + 11;
    return c;
}

Test(cuda_gemm, matches_float64_within_the_float32_bound, .timeout = 60)
{
    REQUIRE_GPU();
    FOR_TARGETS(g)
    {
        dp_device *dev = open_target(g);
        uint64_t seed = 10;
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                /* odd sizes, padded leading dimensions, beta 0 (C = NaN) and beta != 0 */
                gemm_case c = gc((dp_op)ta, (dp_op)tb, 33, 17, 65, 3, 1.5f, 0.0f);
                check_gemm(dev, &c, gamma_f32(c.k), seed++);
                c = gc((dp_op)ta, (dp_op)tb, 7, 40, 9, 0, -1.0f, 0.5f);
                check_gemm(dev, &c, gamma_f32(c.k), seed++);
                /* batched with gaps between the matrices */
                c = batched(gc((dp_op)ta, (dp_op)tb, 12, 5, 8, 1, 1.0f, 1.0f), 3);
                check_gemm(dev, &c, gamma_f32(c.k), seed++);
            }
        /* large enough for cuBLAS's tiled and split-K kernels */
        gemm_case big = gc(DP_OP_T, DP_OP_N, 256, 192, 1024, 0, 1.0f, 0.0f);
        check_gemm(dev, &big, gamma_f32(big.k), seed++);
        big = gc(DP_OP_N, DP_OP_T, 320, 256, 2000, 0, 1.0f, 1.0f);
        check_gemm(dev, &big, gamma_f32(big.k), seed++);
        /* k == 0: C = beta C (beta 0 overwrites NaN with 0), A and B unused */
        gemm_case z = gc(DP_OP_N, DP_OP_N, 5, 4, 0, 2, 1.0f, 0.0f);
        check_gemm(dev, &z, 0.0, seed++);
        z.beta = 2.0f;
        check_gemm(dev, &z, 0.0, seed++);
        z.batch = 2;
        z.sc = (long long)z.ldc * z.n + 3;
        z.sa = z.sb = 0;
        check_gemm(dev, &z, 0.0, seed++);
        close_checked(dev);
    }
}

/* TF32 is opt-in: with it the products carry up to 2^-10 relative error
 * per input (10 explicit mantissa bits, truncation or rounding), so the
 * bound is 2^-9 per product plus float32 accumulation; turning it off
 * again restores the float32 bound. */
Test(cuda_gemm, tf32_is_opt_in_and_bounded, .timeout = 60)
{
    REQUIRE_GPU();
    dp_device *dev = open_target(0);
    gemm_case c = gc(DP_OP_T, DP_OP_N, 128, 96, 512, 0, 1.0f, 0.0f);
    dp_assert_ok(dp_device_set_allow_tf32(dev, 1));
    check_gemm(dev, &c, ldexp(1.0, -9) + gamma_f32(c.k), 70);
    dp_assert_ok(dp_device_set_allow_tf32(dev, 0));
    check_gemm(dev, &c, gamma_f32(c.k), 70);
    close_checked(dev);
}

/* bf16 math and bfloat16 operands (dp_gemm_ex): the products of bfloat16
 * values are exact in float32, so against the float64 product of the
 * rounded operands only the float32 summation bound remains; every
 * operand type, transposes, padding, batches with gaps, sizes for cuBLAS's
 * tensor-core tiles. */
Test(cuda_gemm, bf16_math_and_operands_within_the_float32_bound, .timeout = 60)
{
    REQUIRE_GPU();
    FOR_TARGETS(g)
    {
        dp_device *dev = open_target(g);
        uint64_t seed = 200;
        for (int mode = 0; mode < 4; mode++)
            for (int ta = 0; ta < 2; ta++)
                for (int tb = 0; tb < 2; tb++) {
                    gemm_case c = typed(gc((dp_op)ta, (dp_op)tb, 33, 17, 65, 3, 1.5f, 0.0f), mode);
                    check_gemm(dev, &c, gamma_f32(c.k), seed++);
                    c = batched(typed(gc((dp_op)ta, (dp_op)tb, 12, 5, 8, 1, 1.0f, 1.0f), mode), 3);
                    check_gemm(dev, &c, gamma_f32(c.k), seed++);
                }
        gemm_case big = gc(DP_OP_T, DP_OP_N, 256, 192, 1024, 0, 1.0f, 1.0f);
        big.bf16_math = 1;
        big.a16 = 1;
        check_gemm(dev, &big, gamma_f32(big.k), seed++);
        /* Cut into pieces (backend/gemm_pieces.h): a 1-byte cap gives blocks
         * of 16 rows and columns, one matrix at a time; 6000 bytes groups of
         * the batch. Each piece converts its blocks into the same scratch,
         * so a missing stream order would show as wrong blocks. */
        const size_t caps[] = {1, 6000};
        for (int cap = 0; cap < 2; cap++) {
            dp_device_set_gemm_convert_cap(dev, caps[cap]);
            for (int mode = 0; mode < 4; mode++)
                for (int ta = 0; ta < 2; ta++) {
                    gemm_case c =
                        typed(gc((dp_op)ta, (dp_op)(1 - ta), 40, 37, 65, 3, 1.5f, 0.5f), mode);
                    check_gemm(dev, &c, gamma_f32(c.k), seed++);
                    c = batched(c, 5);
                    check_gemm(dev, &c, gamma_f32(c.k), seed++);
                }
            check_gemm(dev, &big, gamma_f32(big.k), seed++);
        }
        dp_device_set_gemm_convert_cap(dev, 0);
        close_checked(dev);
    }
}

/* The bfloat16 rounding is one DP_HD function on both backends: the same
 * bits, specials and ties included. */
Test(cuda_ops, bf16_conversion_is_bitwise_equal, .timeout = 60)
{
    REQUIRE_GPU();
    enum { N = 4099 };
    float *x = rnd_normal(31, N, 0.0f, 3.0f);
    const float specials[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 3.4e38f, -3.4e38f,
                              1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 0x1p-133f, 0x1p-140f};
    memcpy(x, specials, sizeof specials);
    FOR_TARGETS(g)
    {
        pair p = pair_open(g);
        dp_bf16 h[2][N];
        float *back[2];
        for (int b = 0; b < 2; b++) {
            dp_device *d = p.d[b];
            float *xd = dp_test_upload(d, x, N), *bd = dalloc(d, N * 4);
            void *hd = dalloc(d, N * 2);
            dp_assert_ok(dp_convert(d, hd, DP_DTYPE_BF16, xd, DP_DTYPE_F32, N));
            dp_assert_ok(dp_convert(d, bd, DP_DTYPE_F32, hd, DP_DTYPE_BF16, N));
            dp_assert_ok(dp_copy_d2h(d, h[b], hd, sizeof h[b]));
            back[b] = dp_test_nn_download(d, bd, N);
            dp_device_free(d, xd);
            dp_device_free(d, bd);
            dp_device_free(d, hd);
        }
        cr_assert(memcmp(h[0], h[1], sizeof h[0]) == 0, "bfloat16 bits differ");
        assert_same_bits("widened", back[1], back[0], N);
        for (int i = 0; i < N; i++) cr_assert_eq(h[0][i], dp_bf16_from_float(x[i]), "x[%d]", i);
        free(back[0]);
        free(back[1]);
        pair_close(&p);
    }
    free(x);
}

/* The block packs of a GEMM in pieces (pack_f32_bf16, pack_bf16_f32): the
 * GPU runs a warp per column, the CPU a loop over items, both over the
 * DP_HD conversions, so the bits must match. The padding around each
 * block holds NaN: reading it would show. 3 matrices with a gap between
 * them, columns ld = rows + pad apart from element off. The GPU converts
 * four elements at a time where both the column's start in the operand and
 * in the dense copy allow it, one at a time elsewhere: columns of 7 rows
 * (under a warp), 33 (a warp and one), 1000 and 2500 (three of the GPU's
 * 1024-row segments, the last partial) at odd offsets, scalar; 1024 and
 * 2052 rows at aligned offsets, vectors (2052: across segments, the last
 * one 4 rows); 6 rows 8 apart: vectors from aligned operand columns into
 * a dense copy aligned only at every other column. */
static void check_pack(size_t rows, size_t cols, size_t pad, size_t off, uint64_t seed)
{
    const size_t mats = 3, ld = rows + pad, stride = ld * (cols + 1) + 4 * pad + 4;
    const size_t total = off + stride * mats, n = mats * rows * cols;
    const dp_block blk = {off, ld, stride, rows, cols};
    float *x = rnd_normal(seed, total, 0.0f, 3.0f);
    dp_bf16 *h = xmalloc(total * sizeof *h);
    for (size_t i = 0; i < total; i++) h[i] = dp_bf16_from_float(x[i]);
    for (size_t m = 0; m < mats; m++)
        for (size_t c = 0; c < cols + 1; c++)
            for (size_t r = 0; r < ld; r++) {
                size_t at = off + m * stride + c * ld + r;
                if (r >= rows || c >= cols) x[at] = NAN, h[at] = dp_bf16_from_float(NAN);
            }
    FOR_TARGETS(g)
    {
        pair p = pair_open(g);
        dp_bf16 *r16[2];
        float *w32[2];
        for (int b = 0; b < 2; b++) {
            dp_device *d = p.d[b];
            float *xd = dp_test_upload(d, x, total), *wd = dalloc(d, n * 4);
            void *hd = dalloc(d, total * 2), *rd = dalloc(d, n * 2);
            dp_assert_ok(dp_copy_h2d(d, hd, h, total * 2));
            dp_assert_ok(d->ops->pack_f32_bf16(d, rd, xd, blk, n));
            dp_assert_ok(d->ops->pack_bf16_f32(d, wd, hd, blk, n));
            r16[b] = xmalloc(n * 2);
            dp_assert_ok(dp_copy_d2h(d, r16[b], rd, n * 2));
            w32[b] = dp_test_nn_download(d, wd, n);
            void *bufs[] = {xd, wd, hd, rd};
            for (size_t i = 0; i < 4; i++) dp_device_free(d, bufs[i]);
        }
        cr_assert(memcmp(r16[0], r16[1], n * 2) == 0, "rounded block differs (%zu rows)", rows);
        assert_same_bits("widened block", w32[1], w32[0], n);
        for (size_t i = 0; i < n; i++) cr_assert(!isnan(w32[1][i]), "padding read at item %zu", i);
        for (int b = 0; b < 2; b++) {
            free(r16[b]);
            free(w32[b]);
        }
        pair_close(&p);
    }
    free(x);
    free(h);
}

Test(cuda_ops, block_packs_are_bitwise_equal, .timeout = 60)
{
    REQUIRE_GPU();
    check_pack(7, 5, 3, 2, 41);
    check_pack(33, 4, 3, 2, 42);
    check_pack(1000, 3, 3, 2, 43);
    check_pack(2500, 2, 3, 2, 44);
    check_pack(1024, 3, 4, 4, 45);
    check_pack(2052, 3, 0, 8, 46);
    check_pack(6, 7, 2, 0, 47);
}

// --- kernels vs the CPU backend --------------------------------------------------------------

/* The embedding on (B,T) token ids below V: every output and gradient
 * bit for bit (dwte's rows grouped by token: CUB's radix sort on a GPU,
 * the host's on the CPU, the same stable order). */
static void encoder_case(size_t B, size_t T, size_t C, size_t V, size_t MAXT,
                         const int32_t *tok)
{
    float *wte = rnd(1, V * C, -1, 1), *wpe = rnd(2, MAXT * C, -1, 1);
    float *dout = rnd(3, B * T * C, -1, 1), *dwte0 = rnd(4, V * C, -1, 1),
          *dwpe0 = rnd(5, MAXT * C, -1, 1);
    FOR_TARGETS(g)
    {
        pair p = pair_open(g);
        float *out[2], *dwte[2], *dwpe[2];
        for (int b = 0; b < 2; b++) {
            dp_device *d = p.d[b];
            float *dwte_d = dp_test_upload(d, wte, V * C), *dwpe_d = dp_test_upload(d, wpe, MAXT * C);
            int32_t *dtok = nn_upload_i32(d, tok, B * T);
            float *dout_d = dp_test_upload(d, dout, B * T * C), *o = dalloc(d, B * T * C * 4);
            float *gw = dp_test_upload(d, dwte0, V * C), *gp = dp_test_upload(d, dwpe0, MAXT * C);
            dp_assert_ok(dp_encoder_forward(d, o, dtok, dwte_d, dwpe_d, B, T, C));
            dp_assert_ok(dp_encoder_backward(d, gw, gp, dout_d, dtok, B, T, C));
            out[b] = dp_test_nn_download(d, o, B * T * C);
            dwte[b] = dp_test_nn_download(d, gw, V * C);
            dwpe[b] = dp_test_nn_download(d, gp, MAXT * C);
            void *bufs[] = {dwte_d, dwpe_d, dtok, dout_d, o, gw, gp};
            for (size_t i = 0; i < 7; i++) dp_device_free(d, bufs[i]);
        }
        assert_same_bits("encoder out", out[1], out[0], B * T * C);
        assert_same_bits("dwte", dwte[1], dwte[0], V * C);
        assert_same_bits("dwpe", dwpe[1], dwpe[0], MAXT * C);
        for (int b = 0; b < 2; b++) {
            free(out[b]);
            free(dwte[b]);
            free(dwpe[b]);
        }
        pair_close(&p);
    }
    free(wte);
    free(wpe);
    free(dout);
    free(dwte0);
    free(dwpe0);
}

Test(cuda_ops, encoder_is_bitwise_equal, .timeout = 60)
{
    REQUIRE_GPU();
    enum { B = 3, T = 5, V = 4 };
    int32_t tok[B * T];
    dp_rng rng;
    dp_rng_seed(&rng, 6);
    for (int i = 0; i < B * T; i++) tok[i] = (int32_t)dp_rng_below(&rng, V); /* many repeats */
    encoder_case(B, T, 7, V, 6, tok);
}

/* 39,993 rows (several tiles of the device sort), over 17 bits of
 * ids: half the rows from a pool whose ids share their low or high 16
 * bits (every digit of a radix pass matters, and its stability), half
 * uniform in [0, V). */
Test(cuda_ops, encoder_groups_many_rows_bitwise, .timeout = 60)
{
    REQUIRE_GPU();
    static const int32_t pool[] = {3, 65539, 131075, 0, 65535, 70000, 131079};
    enum { B = 3, T = 13331, V = 131080 };
    int32_t *tok = xmalloc(B * T * sizeof *tok);
    dp_rng rng;
    dp_rng_seed(&rng, 7);
    for (size_t i = 0; i < (size_t)B * T; i++)
        tok[i] = i % 2 ? pool[dp_rng_below(&rng, sizeof pool / sizeof *pool)]
                       : (int32_t)dp_rng_below(&rng, V);
    encoder_case(B, T, 8, V, T, tok);
    free(tok);
}

/* N of one chunk (two batches of rows and a tail) and of three chunks
 * (kernels/colsum.h); the bias gradient that also rounds dout gives the
 * same sums and cast_f32_bf16's bits. */
static void bias_case(size_t N, size_t OC)
{
    float *bias = rnd(1, OC, -1, 1), *dout = rnd(2, N * OC, -1, 1), *db0 = rnd(3, OC, -1, 1);
    FOR_TARGETS(g)
    {
        pair p = pair_open(g);
        float *out[2], *db[2], *db16[2], *dbr[2];
        uint16_t *r16[2];
        for (int b = 0; b < 2; b++) {
            dp_device *d = p.d[b];
            float *bd = dp_test_upload(d, bias, OC), *o = dalloc(d, N * OC * 4);
            float *dd = dp_test_upload(d, dout, N * OC), *gd = dp_test_upload(d, db0, OC);
            float *gd16 = dp_test_upload(d, db0, OC), *gdr = dp_test_upload(d, db0, OC);
            void *dd16 = upload_typed(d, dout, N * OC, 1); /* a bfloat16 gradient */
            uint16_t *rd = (uint16_t *)dalloc(d, N * OC * 2);
            dp_assert_ok(d->ops->bias_broadcast(d, o, dp_pref_f32(bd), N, OC));
            dp_assert_ok(d->ops->bias_backward(d, gd, NULL, dp_pref_f32(dd), N, OC));
            dp_assert_ok(d->ops->bias_backward(d, gd16, NULL, dp_pref_bf16(dd16), N, OC));
            dp_assert_ok(d->ops->bias_backward(d, gdr, rd, dp_pref_f32(dd), N, OC));
            out[b] = dp_test_nn_download(d, o, N * OC);
            db[b] = dp_test_nn_download(d, gd, OC);
            db16[b] = dp_test_nn_download(d, gd16, OC);
            dbr[b] = dp_test_nn_download(d, gdr, OC);
            r16[b] = download_u16(d, rd, N * OC);
            void *bufs[] = {bd, o, dd, gd, gd16, gdr, dd16, rd};
            for (size_t i = 0; i < 8; i++) dp_device_free(d, bufs[i]);
        }
        assert_same_bits("bias_backward", db[1], db[0], OC);
        assert_same_bits("bias_broadcast", out[1], out[0], N * OC);
        assert_same_bits("bias_backward from bf16", db16[1], db16[0], OC);
        for (int b = 0; b < 2; b++) {
            assert_same_bits("bias_backward rounding dout", dbr[b], db[b], OC);
            for (size_t i = 0; i < N * OC; i++)
                cr_assert_eq(r16[b][i], dp_bf16_round(dout[i]),
                             "N=%zu: the rounded dout[%zu] on device %d: %#x, cast %#x", N, i, b,
                             r16[b][i], dp_bf16_round(dout[i]));
        }
        for (int b = 0; b < 2; b++) {
            free(out[b]);
            free(db[b]);
            free(db16[b]);
            free(dbr[b]);
            free(r16[b]);
        }
        pair_close(&p);
    }
    free(bias);
    free(dout);
    free(db0);
}

Test(cuda_ops, bias_broadcast_and_backward_are_bitwise_equal)
{
    REQUIRE_GPU();
    bias_case(33, 70);
    bias_case(600, 70);
}

/*
 * LayerNorm: inputs with a common offset of 3 (the two-pass variance must
 * cope). Forward values are O(1). The GPU sums a row in a block tree
 * (cuda_kernels.cu), the CPU in order: two roundings of a 129-term sum of
 * values ~3, each ~sqrt(129) half-ulps of ~400 (~1e-4), differ by ~1e-6 in
 * the mean after the division by C, plus FMA contraction (~1 ulp per
 * term): mean atol 1e-6 rtol 1e-6, rstd rtol 1e-5, out atol 1e-5 rtol
 * 1e-5 at C = 129. Those rounding differences grow as sqrt(C) (a random
 * walk of C half-ulps; a float32 emulation of both orders gave mean
 * differences of 1.4e-6 at C = 129 and 3.3e-6 at C = 768), so the
 * forward's absolute bounds scale by sqrt(C / 129). The backward gets the
 * CPU's mean and rstd on both backends (identical inputs): its two row
 * means are sums of C terms of magnitude ~1, far inside atol 1e-5 rtol
 * 1e-5; its parameter sums follow one order on both (kernels/colsum.h):
 * dbias bit for bit, dweight within FMA contraction, atol 2e-5, rtol 1e-5.
 */
static void check_layernorm(size_t N, size_t C)
{
    float *x = rnd_normal(1, N * C, 3.0f, 1.0f), *w = rnd(2, C, 0.5f, 1.5f),
          *bias = rnd(3, C, -1, 1), *dout = rnd(4, N * C, -1, 1), *dinp0 = rnd(5, N * C, -1, 1),
          *dw0 = rnd(6, C, -1, 1), *db0 = rnd(7, C, -1, 1);
    FOR_TARGETS(g)
    {
        pair p = pair_open(g);
        float *out[2], *mean[2], *rstd[2], *dinp[2], *dw[2], *db[2];
        for (int b = 0; b < 2; b++) {
            dp_device *d = p.d[b];
            float *xd = dp_test_upload(d, x, N * C), *wd = dp_test_upload(d, w, C),
                  *bd = dp_test_upload(d, bias, C), *od = dalloc(d, N * C * 4),
                  *md = dalloc(d, N * 4), *rd = dalloc(d, N * 4);
            dp_assert_ok(dp_layernorm_forward(d, od, md, rd, xd, wd, bd, N, C));
            out[b] = dp_test_nn_download(d, od, N * C);
            mean[b] = dp_test_nn_download(d, md, N);
            rstd[b] = dp_test_nn_download(d, rd, N);
            dp_device_free(d, md);
            dp_device_free(d, rd);
            /* backward from the CPU's statistics */
            md = dp_test_upload(d, mean[0], N);
            rd = dp_test_upload(d, rstd[0], N);
            float *gd = dp_test_upload(d, dout, N * C), *di = dp_test_upload(d, dinp0, N * C),
                  *dwd = dp_test_upload(d, dw0, C), *dbd = dp_test_upload(d, db0, C);
            dp_assert_ok(dp_layernorm_backward(d, di, dwd, dbd, gd, xd, wd, md, rd, N, C));
            dinp[b] = dp_test_nn_download(d, di, N * C);
            dw[b] = dp_test_nn_download(d, dwd, C);
            db[b] = dp_test_nn_download(d, dbd, C);
            /* from a bfloat16 dout (nn/nn_act16.h): on each device, its
             * float32 backward's bits on the widened values */
            {
                float *wide = xmalloc(N * C * 4), *r[2][3];
                for (size_t i = 0; i < N * C; i++)
                    wide[i] = dp_bf16_to_float(dp_bf16_from_float(dout[i]));
                float *gw = dp_test_upload(d, wide, N * C);
                void *g16 = upload_typed(d, dout, N * C, 1);
                for (int t16 = 0; t16 < 2; t16++) {
                    float *i2 = dp_test_upload(d, dinp0, N * C), *w2 = dp_test_upload(d, dw0, C),
                          *b2 = dp_test_upload(d, db0, C);
                    if (t16)
                        dp_assert_ok(dp_layernorm_backward_dout16(d, i2, w2, b2, g16, xd,
                                                                  dp_pref_f32(wd), md, rd, N, C));
                    else
                        dp_assert_ok(dp_layernorm_backward(d, i2, w2, b2, gw, xd, wd, md, rd, N,
                                                           C));
                    r[t16][0] = dp_test_nn_download(d, i2, N * C);
                    r[t16][1] = dp_test_nn_download(d, w2, C);
                    r[t16][2] = dp_test_nn_download(d, b2, C);
                    dp_device_free(d, i2), dp_device_free(d, w2), dp_device_free(d, b2);
                }
                assert_same_bits("layernorm dinp from bf16 dout", r[1][0], r[0][0], N * C);
                assert_same_bits("layernorm dweight from bf16 dout", r[1][1], r[0][1], C);
                assert_same_bits("layernorm dbias from bf16 dout", r[1][2], r[0][2], C);
                for (int t = 0; t < 2; t++) free(r[t][0]), free(r[t][1]), free(r[t][2]);
                free(wide);
                dp_device_free(d, gw), dp_device_free(d, g16);
            }
            void *bufs[] = {xd, wd, bd, od, md, rd, gd, di, dwd, dbd};
            for (size_t i = 0; i < 10; i++) dp_device_free(d, bufs[i]);
        }
        double k = sqrt((double)C / 129.0);
        dp_assert_allclose(out[1], out[0], N * C, 1e-5 * k, 1e-5);
        dp_assert_allclose(mean[1], mean[0], N, 1e-6 * k, 1e-6);
        dp_assert_allclose(rstd[1], rstd[0], N, 1e-6, 1e-5);
        dp_assert_allclose(dinp[1], dinp[0], N * C, 1e-5, 1e-5);
        dp_assert_allclose(dw[1], dw[0], C, 2e-5, 1e-5);
        assert_same_bits("layernorm dbias (plain sums in row order)", db[1], db[0], C);
        for (int b = 0; b < 2; b++) {
            free(out[b]);
            free(mean[b]);
            free(rstd[b]);
            free(dinp[b]);
            free(dw[b]);
            free(db[b]);
        }
        pair_close(&p);
    }
    free(x);
    free(w);
    free(bias);
    free(dout);
    free(dinp0);
    free(dw0);
    free(db0);
}

/* 129 channels: fewer than a block's threads; 768 (GPT-2's width): three
 * per thread, every warp of the tree holding a partial. */
Test(cuda_ops, layernorm_matches_cpu, .timeout = 60)
{
    REQUIRE_GPU();
    check_layernorm(37, 129);
    check_layernorm(64, 768);
}

/* Every LayerNorm output on d for x(N,C): the forward's output, mean and
 * rstd; its bfloat16 output; the residual update with float32 and with
 * bfloat16 output (the sum and the output); the backward's dinp, dweight
 * and dbias from float32 and from bfloat16 dout. One malloc'd byte array
 * of *bytes bytes. */
static unsigned char *layernorm_outputs(dp_device *d, const float *x, const float *add,
                                        const float *w, const float *bias, const float *dout,
                                        size_t N, size_t C, size_t *bytes)
{
    const size_t NC = N * C, total = 4 * (4 * NC + 2 * N) + 2 * 2 * NC + 2 * 4 * (NC + 2 * C);
    unsigned char *all = xmalloc(total), *at = all;
#define LN_TAKE(src, n, size)                                                                \
    do {                                                                                     \
        void *h_ = (size) == 2 ? (void *)download_u16(d, (const uint16_t *)(src), n)          \
                               : (void *)dp_test_nn_download(d, (const float *)(src), n);     \
        memcpy(at, h_, (n) * (size));                                                        \
        at += (n) * (size);                                                                  \
        free(h_);                                                                            \
    } while (0)
    float *xd = dp_test_upload(d, x, NC), *wd = dp_test_upload(d, w, C),
          *bd = dp_test_upload(d, bias, C), *od = dalloc(d, NC * 4), *md = dalloc(d, N * 4),
          *rd = dalloc(d, N * 4), *ad = dp_test_upload(d, add, NC);
    void *o16 = dalloc(d, NC * 2);
    dp_pref pw = dp_pref_f32(wd), pb = dp_pref_f32(bd);
    dp_assert_ok(dp_layernorm_forward(d, od, md, rd, xd, wd, bd, N, C));
    LN_TAKE(od, NC, 4);
    LN_TAKE(md, N, 4);
    LN_TAKE(rd, N, 4);
    dp_assert_ok(dp_layernorm_forward_out16(d, o16, md, rd, xd, pw, pb, N, C));
    LN_TAKE(o16, NC, 2);
    for (int t16 = 0; t16 < 2; t16++) {
        float *x1 = dp_test_upload(d, x, NC);
        dp_assert_ok(dp_residual_layernorm_forward(d, t16 ? o16 : (void *)od,
                                                   t16 ? DP_DTYPE_BF16 : DP_DTYPE_F32, md, rd,
                                                   x1, ad, pw, pb, N, C));
        LN_TAKE(x1, NC, 4);
        if (t16)
            LN_TAKE(o16, NC, 2);
        else
            LN_TAKE(od, NC, 4);
        dp_device_free(d, x1);
    }
    dp_assert_ok(dp_layernorm_forward(d, od, md, rd, xd, wd, bd, N, C));
    void *g16 = upload_typed(d, dout, NC, 1);
    float *gd = dp_test_upload(d, dout, NC);
    for (int t16 = 0; t16 < 2; t16++) {
        float *di = dp_test_upload(d, add, NC), *dw = dp_test_upload(d, w, C),
              *db = dp_test_upload(d, bias, C);
        if (t16)
            dp_assert_ok(dp_layernorm_backward_dout16(d, di, dw, db, g16, xd, pw, md, rd, N, C));
        else
            dp_assert_ok(dp_layernorm_backward(d, di, dw, db, gd, xd, wd, md, rd, N, C));
        LN_TAKE(di, NC, 4);
        LN_TAKE(dw, C, 4);
        LN_TAKE(db, C, 4);
        dp_device_free(d, di), dp_device_free(d, dw), dp_device_free(d, db);
    }
#undef LN_TAKE
    void *bufs[] = {xd, wd, bd, od, md, rd, ad, o16, g16, gd};
    for (size_t i = 0; i < 10; i++) dp_device_free(d, bufs[i]);
    cr_assert_eq((size_t)(at - all), total, "layernorm_outputs: %zu bytes of %zu",
                 (size_t)(at - all), total);
    *bytes = total;
    return all;
}

/* Rows of up to 1024 channels run a warp per row on a GPU
 * (cuda/cuda_rows.cuh), the block's threads played by its lanes: every
 * output above, bit for bit, the block per row's (DP_CUDA_ROW_WARPS=0),
 * from 13 channels (a partial first pass) to 1024 (four per thread), and
 * 1500 (a block per row either way). */
Test(cuda_ops, layernorm_rows_a_warp_each_keep_the_block_bits, .timeout = 60)
{
    REQUIRE_GPU();
    const size_t N = 37, Cs[] = {13, 300, 768, 1024, 1500};
    for (size_t i = 0; i < sizeof Cs / sizeof *Cs; i++) {
        size_t C = Cs[i];
        float *x = rnd_normal(31, N * C, 2.0f, 1.0f), *add = rnd_normal(32, N * C, 0.0f, 1.0f),
              *w = rnd(33, C, 0.5f, 1.5f), *bias = rnd(34, C, -1, 1),
              *dout = rnd(35, N * C, -1, 1);
        FOR_TARGETS(g)
        {
            pair p = pair_open(g);
            size_t n0, n1;
            unsigned char *warp = layernorm_outputs(p.d[1], x, add, w, bias, dout, N, C, &n0);
            cr_assert_eq(setenv("DP_CUDA_ROW_WARPS", "0", 1), 0);
            unsigned char *block = layernorm_outputs(p.d[1], x, add, w, bias, dout, N, C, &n1);
            cr_assert_eq(unsetenv("DP_CUDA_ROW_WARPS"), 0);
            size_t at = 0;
            while (at < n0 && warp[at] == block[at]) at++;
            cr_assert(n0 == n1 && at == n0, "C %zu on %s: the warp per row differs from the "
                      "block's at byte %zu of %zu", C, dp_device_name(p.d[1]), at, n0);
            free(warp);
            free(block);
            pair_close(&p);
        }
        free(x), free(add), free(w), free(bias), free(dout);
    }
}

/* dweight and dbias += the LayerNorm's parameter sums of g(N,C) (dout's
 * values) in kernels/colsum.h's order, each dweight term dout * xhat
 * added as fmaf(dout, xhat, sum) (contract) or rounded first. */
static void layernorm_params_reference(float *dw, float *db, const float *g, const float *x,
                                       const float *mean, const float *rstd, size_t N, size_t C,
                                       int contract)
{
    for (size_t c = 0; c < C; c++) {
        float tw = 0.0f, tb = 0.0f;
        for (size_t n0 = 0; n0 < N; n0 += DP_COL_CHUNK) {
            float pw = 0.0f, pb = 0.0f;
            for (size_t n = n0; n < N && n < n0 + DP_COL_CHUNK; n++) {
                float gv = g[n * C + c], xhat = dp_layernorm_xhat(x[n * C + c], mean[n], rstd[n]);
                if (contract) pw = fmaf(gv, xhat, pw);
                else pw += gv * xhat;
                pb += gv;
            }
            tw += pw;
            tb += pb;
        }
        dw[c] += tw;
        db[c] += tb;
    }
}

/* The LayerNorm's parameter gradients are exactly kernels/colsum.h's sums
 * (cuda/cuda_colsum.cuh on a GPU): with every dweight term contracted
 * into its sum on a GPU (nvcc contracts `sum += dout * xhat`), and none
 * on the CPU stand-ins (ISO C); dbias plain sums. float32 and bfloat16
 * dout. Shapes: one chunk shorter than a pass of 64 rows; three chunks
 * whose last is short, over a column tile and a half; GPT-2's width. Any
 * other order of the terms, or a term rounded before the GPU's add,
 * changes bits here. */
static void layernorm_params_exact(size_t N, size_t C)
{
    float *g = rnd(31, N * C, -1, 1), *x = rnd_normal(32, N * C, 3.0f, 1.0f),
          *mean = rnd(33, N, 2.5f, 3.5f), *rstd = rnd(34, N, 0.5f, 2.0f), *dw0 = rnd(35, C, -1, 1),
          *db0 = rnd(36, C, -1, 1), *want_w = xmalloc(C * 4), *want_b = xmalloc(C * 4);
    for (int b16 = 0; b16 < 2; b16++) {
        if (b16) /* the values a bfloat16 dout holds */
            for (size_t i = 0; i < N * C; i++) g[i] = dp_bf16_to_float(dp_bf16_from_float(g[i]));
        for (int t = 0; t < n_targets(); t++) {
            dp_device *d = open_target(t);
            int contract = dp_device_kind_of(d) == DP_DEVICE_CUDA;
            memcpy(want_w, dw0, C * 4);
            memcpy(want_b, db0, C * 4);
            layernorm_params_reference(want_w, want_b, g, x, mean, rstd, N, C, contract);
            void *gd = upload_typed(d, g, N * C, b16);
            float *xd = dp_test_upload(d, x, N * C), *md = dp_test_upload(d, mean, N),
                  *rd = dp_test_upload(d, rstd, N), *wd = dp_test_upload(d, dw0, C),
                  *bd = dp_test_upload(d, db0, C);
            dp_pref gp = b16 ? dp_pref_bf16((const uint16_t *)gd) : dp_pref_f32((const float *)gd);
            dp_assert_ok(d->ops->layernorm_backward_params(d, wd, bd, gp, xd, md, rd, N, C));
            float *got_w = dp_test_nn_download(d, wd, C), *got_b = dp_test_nn_download(d, bd, C);
            cr_log_info("%s N=%zu C=%zu dout %s: fma %d", dp_device_name(d), N, C,
                        b16 ? "bf16" : "f32", contract);
            assert_same_bits("layernorm dweight (fixed order, fma per backend)", got_w, want_w,
                             C);
            assert_same_bits("layernorm dbias (fixed order)", got_b, want_b, C);
            free(got_w), free(got_b);
            void *bufs[] = {gd, xd, md, rd, wd, bd};
            for (size_t i = 0; i < 6; i++) dp_device_free(d, bufs[i]);
            close_checked(d);
        }
    }
    free(g), free(x), free(mean), free(rstd), free(dw0), free(db0), free(want_w), free(want_b);
}

Test(cuda_ops, layernorm_parameter_sums_are_exact, .timeout = 60)
{
    REQUIRE_GPU();
    layernorm_params_exact(40, 20);
    layernorm_params_exact(2 * 256 + 37, 48);
    layernorm_params_exact(1024, 768);
}

/* GELU: one exp per element on each side (dp_expf on the CPU, CUDA's
 * expf on the GPU, each within 2 ulp), and FMA contraction may change the
 * exponent 2u by an ulp, which moves exp(2u) by |2u| 2^-24 relative: for
 * outputs above 1e-7 (|2u| < 17) that is < 1.3e-6 in all. rtol 4e-6,
 * atol 1e-7. Saturated inputs (|x| up to 1e4) must give the same limits
 * (x or -0, gradient 1 or 0) and never NaN. */
Test(cuda_ops, gelu_matches_cpu_including_saturation, .timeout = 60)
{
    REQUIRE_GPU();
    enum { N = 4099 };
    float *x = rnd_normal(1, N, 0.0f, 3.0f), *dout = rnd(2, N, -1, 1);
    static const float special[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 5.0f, -5.0f, 20.0f, -20.0f,
                                    100.0f, -100.0f, 1e4f, -1e4f};
    memcpy(x, special, sizeof special);
    FOR_TARGETS(g)
    {
        pair p = pair_open(g);
        float *out[2], *dinp[2], *inplace[2];
        for (int b = 0; b < 2; b++) {
            dp_device *d = p.d[b];
            float *xd = dp_test_upload(d, x, N), *od = dalloc(d, N * 4),
                  *gd = dp_test_upload(d, dout, N), *di = dalloc(d, N * 4);
            dp_assert_ok(dp_gelu_forward(d, od, xd, N));
            dp_assert_ok(dp_gelu_backward(d, di, xd, gd, N));
            out[b] = dp_test_nn_download(d, od, N);
            dinp[b] = dp_test_nn_download(d, di, N);
            dp_assert_ok(dp_gelu_backward(d, gd, xd, gd, N)); /* in place over dout */
            inplace[b] = dp_test_nn_download(d, gd, N);
            dp_device_free(d, xd);
            dp_device_free(d, od);
            dp_device_free(d, gd);
            dp_device_free(d, di);
        }
        for (int i = 0; i < N; i++) cr_assert(!isnan(out[1][i]) && !isnan(dinp[1][i]), "NaN at %d (x=%g)", i, x[i]);
        dp_assert_allclose(out[1], out[0], N, 1e-7, 4e-6);
        dp_assert_allclose(dinp[1], dinp[0], N, 1e-7, 4e-6);
        for (size_t i = 0; i < sizeof special / sizeof *special; i++)
            cr_assert(fabsf(x[i]) < 20.0f || (out[1][i] == out[0][i] && dinp[1][i] == dinp[0][i]),
                      "saturated x = %g: %g/%g vs cpu %g/%g", x[i], out[1][i], dinp[1][i],
                      out[0][i], dinp[0][i]);
        assert_same_bits("gelu backward in place vs not", inplace[1], dinp[1], N);
        /* the pre-activation kept as bfloat16: on each backend, the float32
         * backward on the widened values, bit for bit */
        float *xr = xmalloc(N * sizeof *xr);
        for (int i = 0; i < N; i++) xr[i] = dp_bf16_to_float(dp_bf16_from_float(x[i]));
        for (int b = 0; b < 2; b++) {
            dp_device *d = p.d[b];
            void *x16 = upload_typed(d, x, N, 1);
            float *x32 = dp_test_upload(d, xr, N), *gd = dp_test_upload(d, dout, N),
                  *d16 = dalloc(d, N * 4), *d32 = dalloc(d, N * 4);
            dp_assert_ok(dp_gelu_backward_bf16_inp(d, d16, x16, gd, N));
            dp_assert_ok(dp_gelu_backward(d, d32, x32, gd, N));
            float *h16 = dp_test_nn_download(d, d16, N), *h32 = dp_test_nn_download(d, d32, N);
            assert_same_bits(b ? "gelu backward from bf16 input (gpu)"
                               : "gelu backward from bf16 input (cpu)", h16, h32, N);
            /* the gradients kept as bfloat16 too (dp_gelu_backward_bf16):
             * the backward from the widened bfloat16 dout, rounded once */
            {
                float *dr = xmalloc(N * sizeof *dr);
                for (int i = 0; i < N; i++) dr[i] = dp_bf16_to_float(dp_bf16_from_float(dout[i]));
                float *gr = dp_test_upload(d, dr, N), *g2 = dalloc(d, N * 4);
                void *c16 = upload_typed(d, dout, N, 1);
                dp_assert_ok(dp_gelu_backward_bf16_inp(d, g2, x16, gr, N));
                dp_assert_ok(dp_gelu_backward_bf16(d, c16, x16, c16, N)); /* in place */
                float *hg = dp_test_nn_download(d, g2, N);
                dp_bf16 *hc = xmalloc(N * sizeof *hc);
                dp_assert_ok(dp_copy_d2h(d, hc, c16, N * sizeof *hc));
                for (int i = 0; i < N; i++)
                    cr_assert_eq(hc[i], dp_bf16_from_float(hg[i]), "%s: bf16 gelu backward %d",
                                 b ? "gpu" : "cpu", i);
                free(dr), free(hg), free(hc);
                dp_device_free(d, gr), dp_device_free(d, g2), dp_device_free(d, c16);
            }
            /* and the bf16 forward: bf16 of the float32 forward on the same values */
            dp_assert_ok(dp_gelu_forward(d, d32, x32, N));
            dp_assert_ok(dp_gelu_forward_bf16(d, x16, x16, N)); /* in place */
            float *f32 = dp_test_nn_download(d, d32, N);
            dp_bf16 *o16 = xmalloc(N * sizeof *o16);
            dp_assert_ok(dp_copy_d2h(d, o16, x16, N * sizeof *o16));
            for (int i = 0; i < N; i++)
                cr_assert_eq(o16[i], dp_bf16_from_float(f32[i]), "%s: gelu bf16 forward %d",
                             b ? "gpu" : "cpu", i);
            free(f32), free(o16);
            free(h16), free(h32);
            dp_device_free(d, x16), dp_device_free(d, x32), dp_device_free(d, gd);
            dp_device_free(d, d16), dp_device_free(d, d32);
        }
        free(xr);
        for (int b = 0; b < 2; b++) {
            free(out[b]);
            free(dinp[b]);
            free(inplace[b]);
        }
        pair_close(&p);
    }
    free(x);
    free(dout);
}

/* add, accumulate and scale are one rounding each: bitwise equal. n is
 * past what one grid covers at once (4096 blocks of 256 threads), so the
 * grid-stride loops run more than one lap. */
Test(cuda_ops, elementwise_ops_are_bitwise_equal, .timeout = 60)
{
    REQUIRE_GPU();
    size_t n = (size_t)4096 * 256 * 2 + 77;
    float *a = rnd(1, n, -10, 10), *bb = rnd(2, n, -10, 10);
    FOR_TARGETS(g)
    {
        pair p = pair_open(g);
        float *sum[2], *acc[2], *sc[2], *alias[2];
        for (int b = 0; b < 2; b++) {
            dp_device *d = p.d[b];
            float *ad = dp_test_upload(d, a, n), *bd = dp_test_upload(d, bb, n),
                  *od = dalloc(d, n * 4);
            dp_assert_ok(d->ops->add(d, od, ad, bd, n));
            sum[b] = dp_test_nn_download(d, od, n);
            dp_assert_ok(d->ops->accumulate(d, od, ad, n));
            acc[b] = dp_test_nn_download(d, od, n);
            dp_assert_ok(d->ops->scale(d, od, -0.3f, n));
            sc[b] = dp_test_nn_download(d, od, n);
            dp_assert_ok(d->ops->add(d, ad, ad, bd, n)); /* out aliases a */
            alias[b] = dp_test_nn_download(d, ad, n);
            dp_device_free(d, ad);
            dp_device_free(d, bd);
            dp_device_free(d, od);
        }
        assert_same_bits("add", sum[1], sum[0], n);
        assert_same_bits("accumulate", acc[1], acc[0], n);
        assert_same_bits("scale", sc[1], sc[0], n);
        assert_same_bits("add in place", alias[1], sum[0], n);
        for (int b = 0; b < 2; b++) {
            free(sum[b]);
            free(acc[b]);
            free(sc[b]);
            free(alias[b]);
        }
        pair_close(&p);
    }
    free(a);
    free(bb);
}

/* The CUDA backend's sum of squares in its order (cuda_kernels.cu, whose
 * DP_CUDA_SUMSQ_THREADS and _BLOCKS are 256 and 1024): nb = min(ceil(n /
 * 256), 1024) blocks of 256 threads, thread t of block b adding x[i]^2
 * for i = 256 b + t, then 256 nb further, and so on; each block's 256
 * sums by the halving tree (slot j += slot j + w, w = 128, 64, ..., 1);
 * then one block: thread t adding partials t, t + 256, ..., and the same
 * tree. Squares of floats are exact in double, so a fused multiply-add
 * gives the same bits. */
static double sum_squares_cuda_order(const float *x, size_t n)
{
    enum { T = 256, MAXB = 1024 };
    size_t nb = (n + T - 1) / T;
    nb = nb > MAXB ? MAXB : nb ? nb : 1;
    double *part = xmalloc(nb * sizeof *part), acc[T];
    for (size_t b = 0; b < nb; b++) {
        for (size_t t = 0; t < T; t++) {
            acc[t] = 0.0;
            for (size_t i = b * T + t; i < n; i += nb * T) acc[t] += (double)x[i] * (double)x[i];
        }
        for (size_t w = T / 2; w > 0; w /= 2)
            for (size_t t = 0; t < w; t++) acc[t] += acc[t + w];
        part[b] = acc[0];
    }
    for (size_t t = 0; t < T; t++) {
        acc[t] = 0.0;
        for (size_t i = t; i < nb; i += T) acc[t] += part[i];
    }
    for (size_t w = T / 2; w > 0; w /= 2)
        for (size_t t = 0; t < w; t++) acc[t] += acc[t + w];
    free(part);
    return acc[0];
}

/* Sum of squares in double: squares are exact, each backend's sum is
 * within (n-1) u_double of the exact sum (any order), so the two differ by
 * at most 2 (n-1) 2^-53 relative. The GPU's tree is fixed by n alone:
 * repeated calls, and two logical devices, give identical bits, those of
 * sum_squares_cuda_order (its loads batched, its order kept). */
Test(cuda_ops, sum_squares_is_accurate_and_deterministic, .timeout = 60)
{
    REQUIRE_GPU();
    static const size_t sizes[] = {1, 255, 256, 257, 1000003, (size_t)1024 * 256 * 3 + 1};
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        size_t n = sizes[si];
        float *x = rnd_normal(si + 1, n, 0.0f, 2.0f);
        FOR_TARGETS(g)
        {
            pair p = pair_open(g);
            dp_device *other = open_target(g);
            double r[2], again, r_other;
            for (int b = 0; b < 2; b++) {
                float *xd = dp_test_upload(p.d[b], x, n);
                dp_assert_ok(dp_sum_squares(p.d[b], &r[b], xd, n));
                if (b == 1) dp_assert_ok(dp_sum_squares(p.d[b], &again, xd, n));
                dp_device_free(p.d[b], xd);
            }
            float *xo = dp_test_upload(other, x, n);
            dp_assert_ok(dp_sum_squares(other, &r_other, xo, n));
            dp_device_free(other, xo);
            double tol = 2.0 * (double)(n - 1) * ldexp(1.0, -53) * r[0];
            cr_assert(fabs(r[1] - r[0]) <= tol, "n=%zu: %.17g vs cpu %.17g (tol %.3g)", n, r[1],
                      r[0], tol);
            cr_assert(memcmp(&again, &r[1], sizeof again) == 0, "n=%zu: not deterministic", n);
            cr_assert(memcmp(&r_other, &r[1], sizeof again) == 0,
                      "n=%zu: two logical devices disagree", n);
            if (!as_cpu()) {
                double want = sum_squares_cuda_order(x, n);
                cr_assert(memcmp(&want, &r[1], sizeof want) == 0,
                          "n=%zu: %.17g, not the fixed order's %.17g", n, r[1], want);
            }
            close_checked(other);
            pair_close(&p);
        }
        free(x);
    }
}

/* One shape of the permutes on both devices; the bfloat16 permute against
 * the float32 one rounded on the host too. */
static void permutes_case(pair *p, size_t B, size_t T, size_t NH, size_t HS)
{
    size_t C = NH * HS, NQ = B * T * 3 * C, NY = B * T * C;
    float *qkv = rnd(1, NQ, -1, 1), *y = rnd(2, NY, -1, 1);
    float *res[2][4];
    uint16_t *r16[2];
    for (int b = 0; b < 2; b++) {
        dp_device *d = p->d[b];
        float *qd = dp_test_upload(d, qkv, NQ), *yd = dp_test_upload(d, y, NY);
        float *o1 = dalloc(d, NQ * 4), *o2 = dalloc(d, NQ * 4), *o3 = dalloc(d, NY * 4),
              *o4 = dalloc(d, NY * 4);
        uint16_t *o5 = (uint16_t *)dalloc(d, NQ * 2);
        dp_assert_ok(d->ops->attention_permute(d, o1, qd, B, T, NH, HS));
        dp_assert_ok(d->ops->attention_permute_bf16(d, o5, qd, B, T, NH, HS));
        dp_assert_ok(d->ops->attention_permute_backward(d, o2, o1, B, T, NH, HS));
        dp_assert_ok(d->ops->attention_unpermute(d, o3, yd, B, T, NH, HS));
        dp_assert_ok(d->ops->attention_unpermute_backward(d, o4, o3, B, T, NH, HS));
        res[b][0] = dp_test_nn_download(d, o1, NQ);
        res[b][1] = dp_test_nn_download(d, o2, NQ);
        res[b][2] = dp_test_nn_download(d, o3, NY);
        res[b][3] = dp_test_nn_download(d, o4, NY);
        r16[b] = download_u16(d, o5, NQ);
        void *bufs[] = {qd, yd, o1, o2, o3, o4, o5};
        for (size_t i = 0; i < 7; i++) dp_device_free(d, bufs[i]);
    }
    cr_log_info("permutes B=%zu T=%zu NH=%zu hs=%zu", B, T, NH, HS);
    assert_same_bits("permute", res[1][0], res[0][0], NQ);
    assert_same_bits("permute_backward", res[1][1], res[0][1], NQ);
    assert_same_bits("permute round trip", res[1][1], qkv, NQ);
    assert_same_bits("unpermute", res[1][2], res[0][2], NY);
    assert_same_bits("unpermute_backward", res[1][3], res[0][3], NY);
    assert_same_bits("unpermute round trip", res[1][3], y, NY);
    for (size_t i = 0; i < NQ; i++) {
        cr_assert_eq(r16[1][i], r16[0][i], "permute_bf16 element %zu: %#x vs cpu %#x", i,
                     r16[1][i], r16[0][i]);
        cr_assert_eq(r16[0][i], dp_bf16_round(res[0][0][i]),
                     "permute_bf16 element %zu is not the float32 permute's rounding", i);
    }
    for (int b = 0; b < 2; b++) {
        for (int k = 0; k < 4; k++) free(res[b][k]);
        free(r16[b]);
    }
    free(qkv);
    free(y);
}

/* Head sizes below a warp, and above two warps' width with a partial last
 * pass (the CUDA permutes run a warp per head vector). */
Test(cuda_ops, attention_permutes_are_bitwise_equal)
{
    REQUIRE_GPU();
    FOR_TARGETS(g)
    {
        pair p = pair_open(g);
        permutes_case(&p, 2, 5, 3, 4);
        permutes_case(&p, 2, 7, 2, 72);
        pair_close(&p);
    }
}

/*
 * Causal softmax rows. Masked entries (after t) hold NaN on entry: they
 * must come out exactly 0 on both backends. Forward: one exp per entry
 * (2 ulp each side) and a sum of <= T terms (a block tree on the GPU,
 * in order on the CPU: <= T half-ulps apart): rtol 1e-5, atol 1e-7 on
 * probabilities <= 1. Backward from the CPU's att (identical inputs):
 * a dot of <= T terms of magnitude <= 1 summed in another order (a block
 * tree on the GPU), each ~T half-ulps of 1 at worst, plus FMA
 * contraction: atol 1e-6, rtol 1e-5. A second shape has more rows (BNH*T
 * = 280000) than one grid covers; a third is a chunk of query rows
 * (queries q0..q0+nq-1 over ld = q0 + nq keys, as the chunked attention
 * runs them); the last two have rows longer than a block's 256 threads,
 * whole and chunked, so every warp of the tree holds a partial. On each
 * device the bfloat16 outputs (att16 of the forward, ds16 of the
 * backward) are that device's float32 results rounded, bit for bit, and
 * leave the float32 results as they are without them (check_bf16_rows).
 */

/* The rows of n bfloat16 bits at d16 (on d) are the n floats of want
 * rounded (dp_bf16_round); what names them in the message. */
static void check_bf16_rows(dp_device *d, const uint16_t *d16, const float *want, size_t n,
                            const char *what)
{
    uint16_t *h = xmalloc(n * sizeof *h);
    dp_assert_ok(dp_copy_d2h(d, h, d16, n * sizeof *h));
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(h[i], dp_bf16_round(want[i]), "%s on %s: element %zu is %#x, %g rounds to %#x",
                     what, dp_device_name(d), i, h[i], want[i], dp_bf16_round(want[i]));
    free(h);
}

static void check_softmax(size_t BNH, size_t T, size_t q0, size_t nq, uint64_t seed)
{
    size_t rows = BNH * nq, n = rows * T; /* att(BNH,nq,T), T = ld */
    float scale = 0.35f;
    float *s = rnd_normal(seed, n, 0.0f, 2.0f), *gin = rnd(seed + 1, n, -1, 1);
    for (size_t r = 0; r < rows; r++)
        for (size_t j = q0 + r % nq + 1; j < T; j++) s[r * T + j] = gin[r * T + j] = NAN;
    FOR_TARGETS(g)
    {
        pair p = pair_open(g);
        float *att[2], *ds[2];
        for (int b = 0; b < 2; b++) {
            dp_device *d = p.d[b];
            float *ad = dp_test_upload(d, s, n);
            dp_assert_ok(d->ops->softmax_causal_forward(d, ad, NULL, scale, T, q0, nq, rows));
            att[b] = dp_test_nn_download(d, ad, n);
            /* again with the bfloat16 copy */
            uint16_t *a16 = NULL;
            dp_assert_ok(dp_device_alloc(d, n * sizeof *a16, (void **)&a16));
            dp_assert_ok(dp_copy_h2d(d, ad, s, n * sizeof *s));
            dp_assert_ok(d->ops->softmax_causal_forward(d, ad, a16, scale, T, q0, nq, rows));
            float *again = dp_test_nn_download(d, ad, n);
            cr_assert(memcmp(again, att[b], n * sizeof *again) == 0,
                      "%s: the probabilities changed with att16", dp_device_name(d));
            check_bf16_rows(d, a16, att[b], n, "att16");
            free(again);
            dp_device_free(d, a16);
            dp_device_free(d, ad);
        }
        for (int b = 0; b < 2; b++) {
            dp_device *d = p.d[b];
            float *ad = dp_test_upload(d, att[0], n), *gd = dp_test_upload(d, gin, n);
            dp_assert_ok(d->ops->softmax_causal_backward(d, gd, NULL, ad, scale, T, q0, nq, rows));
            ds[b] = dp_test_nn_download(d, gd, n);
            /* again into a bfloat16 ds16: gd keeps d(att) */
            uint16_t *g16 = NULL;
            dp_assert_ok(dp_device_alloc(d, n * sizeof *g16, (void **)&g16));
            dp_assert_ok(dp_copy_h2d(d, gd, gin, n * sizeof *gin));
            dp_assert_ok(d->ops->softmax_causal_backward(d, gd, g16, ad, scale, T, q0, nq, rows));
            float *kept = dp_test_nn_download(d, gd, n);
            cr_assert(memcmp(kept, gin, n * sizeof *kept) == 0,
                      "%s: datt changed although ds16 was given", dp_device_name(d));
            check_bf16_rows(d, g16, ds[b], n, "ds16");
            free(kept);
            dp_device_free(d, g16);
            dp_device_free(d, ad);
            dp_device_free(d, gd);
        }
        for (size_t r = 0; r < rows; r++)
            for (size_t j = q0 + r % nq + 1; j < T; j++)
                cr_assert(att[1][r * T + j] == 0.0f && ds[1][r * T + j] == 0.0f,
                          "masked entry (%zu,%zu) not zero", r, j);
        dp_assert_allclose(att[1], att[0], n, 1e-7, 1e-5);
        dp_assert_allclose(ds[1], ds[0], n, 1e-6, 1e-5);
        for (int b = 0; b < 2; b++) {
            free(att[b]);
            free(ds[b]);
        }
        pair_close(&p);
    }
    free(s);
    free(gin);
}

Test(cuda_ops, softmax_causal_matches_cpu, .timeout = 60)
{
    REQUIRE_GPU();
    check_softmax(6, 17, 0, 17, 1);
    check_softmax(140000, 2, 0, 2, 3);
    check_softmax(6, 17, 9, 8, 5);
    check_softmax(3, 700, 0, 700, 7);
    check_softmax(2, 600, 300, 300, 9);
}

/*
 * Fused cross-entropy: losses summed on the host in row order, dlogits
 * separate, in place over the logits, and NULL (loss only). Per row: one
 * max (exact), a double sum of V exps (2 ulp each; the GPU's block tree and
 * the CPU's 8 interleaved sums differ only in double rounding), one log:
 * losses rtol 1e-6. dlogits = dscale (p - onehot): p within a few ulp, so rtol 1e-5;
 * p - 1 cancels for the target entry (4 ulp of 1 = 2.4e-7), hence atol
 * 1e-6 * dscale. Ignored
 * rows (-1) give exactly 0, masked entries (-inf) a zero gradient. Shapes:
 * 37 rows of V = 1000, 3 rows of V = 50304 (1024 threads a row on the
 * GPU), and 300000 rows of V = 2 (more rows than one grid covers).
 */
static void check_crossentropy(size_t N, size_t V, uint64_t seed)
{
    float *logits = rnd(seed, N * V, -4, 4);
    int32_t *tg = xmalloc(N * sizeof *tg);
    dp_rng rng;
    dp_rng_seed(&rng, seed + 1);
    for (size_t i = 0; i < N; i++) tg[i] = i % 5 == 2 ? -1 : (int32_t)dp_rng_below(&rng, V);
    /* Masked vocabulary entries (-inf logits) in every third row: the first
     * half of the row but the target, so on the GPU a thread's first
     * elements are all -inf (its running maximum starts at -inf). */
    for (size_t i = 1; i < N; i += 3)
        for (size_t v = 0; v < V / 2; v++)
            if ((int32_t)v != tg[i]) logits[i * V + v] = -INFINITY;
    float dscale = 1.0f / (float)N;
    FOR_TARGETS(g)
    {
        pair p = pair_open(g);
        float *dl[2], *inpl[2];
        double loss[2], loss_in[2], loss_only[2];
        for (int b = 0; b < 2; b++) {
            dp_device *d = p.d[b];
            float *ld = dp_test_upload(d, logits, N * V), *gd = dalloc(d, N * V * 4),
                  *losses = dalloc(d, N * 4);
            int32_t *td = nn_upload_i32(d, tg, N);
            dp_assert_ok(dp_crossentropy_forward_backward(d, &loss[b], gd, losses, ld, td, N, V, dscale));
            dl[b] = dp_test_nn_download(d, gd, N * V);
            dp_assert_ok(dp_crossentropy_forward_backward(d, &loss_only[b], NULL, losses, ld, td, N, V, dscale));
            dp_assert_ok(dp_crossentropy_forward_backward(d, &loss_in[b], ld, losses, ld, td, N, V, dscale));
            inpl[b] = dp_test_nn_download(d, ld, N * V);
            dp_device_free(d, ld);
            dp_device_free(d, gd);
            dp_device_free(d, losses);
            dp_device_free(d, td);
        }
        cr_assert(fabs(loss[1] - loss[0]) <= 1e-6 * fabs(loss[0]) + 1e-9, "loss %.9g vs cpu %.9g",
                  loss[1], loss[0]);
        cr_assert_eq(loss_only[1], loss[1], "loss-only pass differs");
        cr_assert_eq(loss_in[1], loss[1], "in-place pass differs");
        dp_assert_allclose(dl[1], dl[0], N * V, 1e-6 * dscale, 1e-5);
        assert_same_bits("dlogits in place vs separate", inpl[1], dl[1], N * V);
        for (size_t i = 0; i < N; i++)
            for (size_t v = 0; v < V; v++) {
                float x = logits[i * V + v], d = dl[1][i * V + v];
                if (tg[i] < 0) cr_assert(d == 0.0f, "ignored row %zu has dlogits", i);
                if (x == -INFINITY) cr_assert(d == 0.0f, "masked (%zu,%zu): dlogits %g", i, v, d);
                cr_assert(isfinite(d), "dlogits (%zu,%zu) = %g", i, v, d);
            }
        for (int b = 0; b < 2; b++) {
            free(dl[b]);
            free(inpl[b]);
        }
        pair_close(&p);
    }
    free(logits);
    free(tg);
}

/* A NaN logit makes its row's loss NaN on both backends wherever it
 * falls: here after a -inf in the same GPU thread's share of the row (the
 * thread's running maximum is still -inf when the NaN comes), for V = 5000
 * (1024 threads a row) and V = 300 (256). The other row is unaffected. */
static void check_crossentropy_nan(size_t V, size_t threads)
{
    enum { N = 2 };
    float *logits = rnd(7, N * V, -4, 4);
    int32_t tg[N] = {5, 7};
    logits[0] = -INFINITY;
    logits[threads] = NAN;
    FOR_TARGETS(g)
    {
        pair p = pair_open(g);
        float *row[2];
        double loss[2];
        for (int b = 0; b < 2; b++) {
            dp_device *d = p.d[b];
            float *ld = dp_test_upload(d, logits, N * V), *gd = dalloc(d, N * V * 4),
                  *losses = dalloc(d, N * 4);
            int32_t *td = nn_upload_i32(d, tg, N);
            dp_assert_ok(dp_crossentropy_forward_backward(d, &loss[b], gd, losses, ld, td, N, V,
                                                          1.0f));
            row[b] = dp_test_nn_download(d, losses, N);
            void *bufs[] = {ld, gd, losses, td};
            for (size_t i = 0; i < 4; i++) dp_device_free(d, bufs[i]);
        }
        for (int b = 0; b < 2; b++) {
            cr_assert(isnan(row[b][0]), "V %zu backend %d: row with a NaN has loss %g", V, b,
                      (double)row[b][0]);
            cr_assert(isnan(loss[b]), "V %zu backend %d: the sum is %g", V, b, loss[b]);
        }
        cr_assert(fabsf(row[1][1] - row[0][1]) <= 1e-6f * fabsf(row[0][1]),
                  "V %zu: the other row's loss %g vs cpu %g", V, (double)row[1][1],
                  (double)row[0][1]);
        free(row[0]);
        free(row[1]);
        pair_close(&p);
    }
    free(logits);
}

Test(cuda_ops, crossentropy_matches_cpu, .timeout = 60)
{
    REQUIRE_GPU();
    check_crossentropy(37, 1000, 1);
    check_crossentropy(3, 50304, 2);
    check_crossentropy(300000, 2, 3);
    check_crossentropy_nan(5000, 1024);
    check_crossentropy_nan(300, 256);
}

/* ReLU and dropout are a select and at most one product, the dropout
 * mask an integer hash compared exactly as a float: bitwise equal. SiLU is
 * one exp each side, as GELU: rtol 4e-6, atol 1e-7. */
Test(cuda_ops, relu_silu_and_dropout_match_cpu, .timeout = 60)
{
    REQUIRE_GPU();
    enum { N = 4099, DR = 59, DC = 69 }; /* dropout over (DR, DC) <= N elements */
    float *x = rnd_normal(11, N, 0.0f, 3.0f), *dout = rnd(12, N, -1, 1);
    static const float special[] = {0.0f, -0.0f, 30.0f, -30.0f, 1e4f, -1e4f, 1e20f, -1e20f};
    memcpy(x, special, sizeof special);
    FOR_TARGETS(g)
    {
        pair p = pair_open(g);
        float *h[2][6];
        for (int b = 0; b < 2; b++) {
            dp_device *d = p.d[b];
            float *xd = dp_test_upload(d, x, N), *gd = dp_test_upload(d, dout, N),
                  *od = dalloc(d, N * 4);
            dp_assert_ok(dp_relu_forward(d, od, xd, N));
            h[b][0] = dp_test_nn_download(d, od, N);
            dp_assert_ok(dp_relu_backward(d, od, xd, gd, N));
            h[b][1] = dp_test_nn_download(d, od, N);
            dp_assert_ok(dp_silu_forward(d, od, xd, N));
            h[b][2] = dp_test_nn_download(d, od, N);
            dp_assert_ok(dp_silu_backward(d, od, xd, gd, N));
            h[b][3] = dp_test_nn_download(d, od, N);
            dp_assert_ok(dp_dropout_forward(d, od, xd, 0.3f, 17, 5, 1000, DR, DC));
            h[b][4] = dp_test_nn_download(d, od, DR * DC);
            dp_assert_ok(dp_dropout_backward(d, gd, gd, 0.3f, 17, 5, 1000, DR, DC)); /* in place */
            h[b][5] = dp_test_nn_download(d, gd, DR * DC);
            dp_device_free(d, xd), dp_device_free(d, gd), dp_device_free(d, od);
        }
        assert_same_bits("relu forward", h[1][0], h[0][0], N);
        assert_same_bits("relu backward", h[1][1], h[0][1], N);
        dp_assert_allclose(h[1][2], h[0][2], N, 1e-7, 4e-6);
        dp_assert_allclose(h[1][3], h[0][3], N, 1e-7, 4e-6);
        for (size_t i = 0; i < sizeof special / sizeof *special; i++)
            cr_assert(!isnan(h[1][2][i]) && !isnan(h[1][3][i]), "silu NaN at x = %g", x[i]);
        assert_same_bits("dropout forward", h[1][4], h[0][4], DR * DC);
        assert_same_bits("dropout backward", h[1][5], h[0][5], DR * DC);
        for (int b = 0; b < 2; b++)
            for (int k = 0; k < 6; k++) free(h[b][k]);
        pair_close(&p);
    }
    free(x);
    free(dout);
}

/* Softmax and log-softmax rows (block per row on the GPU, a loop on the
 * CPU): the sums are grouped differently, C 2^-24 relative at worst
 * (softmax's float sum), far less for log-softmax's double sums; the exp
 * differs by 2 ulp each side. Rows shifted by +-1e4, a masked class. */
static void check_row_softmax(size_t N, size_t C, uint64_t seed)
{
    float *x = rnd_normal(seed, N * C, 0.0f, 3.0f), *dout = rnd(seed + 1, N * C, -1, 1);
    for (size_t j = 0; j < C && N > 3; j++) x[1 * C + j] += 1e4f, x[2 * C + j] -= 1e4f;
    if (N > 3) x[3 * C + 1] = -INFINITY;
    double rtol = 4e-6 + (double)C * 6e-8;
    FOR_TARGETS(g)
    {
        pair p = pair_open(g);
        float *h[2][4];
        for (int b = 0; b < 2; b++) {
            dp_device *d = p.d[b];
            float *xd = dp_test_upload(d, x, N * C), *gd = dp_test_upload(d, dout, N * C),
                  *od = dalloc(d, N * C * 4), *dd = dalloc(d, N * C * 4);
            dp_assert_ok(dp_softmax_forward(d, od, xd, N, C));
            dp_assert_ok(dp_softmax_backward(d, dd, od, gd, N, C));
            h[b][0] = dp_test_nn_download(d, od, N * C);
            h[b][1] = dp_test_nn_download(d, dd, N * C);
            dp_assert_ok(dp_log_softmax_forward(d, od, xd, N, C));
            dp_assert_ok(dp_log_softmax_backward(d, gd, od, gd, N, C)); /* in place */
            h[b][2] = dp_test_nn_download(d, od, N * C);
            h[b][3] = dp_test_nn_download(d, gd, N * C);
            dp_device_free(d, xd), dp_device_free(d, gd), dp_device_free(d, od);
            dp_device_free(d, dd);
        }
        /* the masked class: exactly 0 probability, -inf log-probability */
        if (N > 3)
            cr_assert(h[1][0][3 * C + 1] == 0.0f && isinf(h[1][2][3 * C + 1]), "masked: %g %g",
                      h[1][0][3 * C + 1], h[1][2][3 * C + 1]);
        for (size_t i = 0; N > 3 && i < 2; i++) h[i][2][3 * C + 1] = 0.0f;
        dp_assert_allclose(h[1][0], h[0][0], N * C, 1e-9, rtol);
        dp_assert_allclose(h[1][1], h[0][1], N * C, 1e-7, rtol);
        dp_assert_allclose(h[1][2], h[0][2], N * C, 1e-6, 1e-6);
        dp_assert_allclose(h[1][3], h[0][3], N * C, 1e-6, 1e-5);
        for (int b = 0; b < 2; b++)
            for (int k = 0; k < 4; k++) free(h[b][k]);
        pair_close(&p);
    }
    free(x);
    free(dout);
}

Test(cuda_ops, softmax_rows_match_cpu, .timeout = 60)
{
    REQUIRE_GPU();
    check_row_softmax(37, 129, 21);
    check_row_softmax(5, 5000, 23);
}

/* Targets with ignored rows for the zeroing tests: class targets ct(R),
 * every third -1; float targets ft(R, per), NaN in every fourth row and in
 * one of the per of every fifth (a row is ignored when all its are NaN). */
static void ignored_targets(int32_t *ct, float *ft, int R, int per)
{
    for (int r = 0; r < R; r++) {
        ct[r] = r % 3 == 1 ? -1 : r % 7;
        for (int t = 0; t < per; t++)
            if (r % 4 == 2 || (r % 5 == 0 && t == 1)) ft[r * per + t] = NAN;
    }
}

/* The criterion contract's zeroing of ignored rows: copies and zeros,
 * bitwise, for class targets and for float targets (a row is ignored only
 * when all its values are NaN). */
Test(cuda_ops, zero_ignored_rows_is_bitwise_equal, .timeout = 60)
{
    REQUIRE_GPU();
    enum { R = 300, C = 1029, PER = 3 };
    float *x = rnd(31, R * C, -1, 1), *ft = rnd(32, R * PER, -1, 1);
    int32_t ct[R];
    ignored_targets(ct, ft, R, PER);
    FOR_TARGETS(g)
    {
        pair p = pair_open(g);
        float *h[2][2];
        for (int b = 0; b < 2; b++) {
            dp_device *d = p.d[b];
            float *xd = dp_test_upload(d, x, R * C), *fd = dp_test_upload(d, ft, R * PER);
            int32_t *cd = nn_upload_i32(d, ct, R);
            dp_assert_ok(dp_zero_ignored_rows(d, xd, cd, DP_TARGET_CLASS, 1, R, C));
            h[b][0] = dp_test_nn_download(d, xd, R * C);
            dp_assert_ok(dp_copy_h2d(d, xd, x, R * C * sizeof(float)));
            dp_assert_ok(dp_zero_ignored_rows(d, xd, fd, DP_TARGET_F32, PER, R, C));
            h[b][1] = dp_test_nn_download(d, xd, R * C);
            dp_device_free(d, xd), dp_device_free(d, fd), dp_device_free(d, cd);
        }
        assert_same_bits("zero ignored rows (class)", h[1][0], h[0][0], R * C);
        assert_same_bits("zero ignored rows (f32)", h[1][1], h[0][1], R * C);
        for (int r = 0; r < R; r++) {
            cr_assert_eq(h[1][0][r * C + 5] == 0.0f, r % 3 == 1, "class row %d", r);
            cr_assert_eq(h[1][1][r * C + 5] == 0.0f, r % 4 == 2, "f32 row %d", r);
        }
        for (int b = 0; b < 2; b++) free(h[b][0]), free(h[b][1]);
        pair_close(&p);
    }
    free(x);
    free(ft);
}

/* A padded vocabulary's logit columns set to -inf (dp_fill_columns):
 * stores only, bitwise; the columns around them untouched. */
Test(cuda_ops, fill_columns_is_bitwise_equal, .timeout = 60)
{
    REQUIRE_GPU();
    enum { R = 300, LD = 1088, C0 = 1029, COLS = LD - C0 };
    float *x = rnd(33, R * LD, -1, 1);
    FOR_TARGETS(g)
    {
        pair p = pair_open(g);
        float *h[2];
        for (int b = 0; b < 2; b++) {
            dp_device *d = p.d[b];
            float *xd = dp_test_upload(d, x, R * LD);
            dp_assert_ok(dp_fill_columns(d, xd, -INFINITY, R, LD, C0, COLS));
            h[b] = dp_test_nn_download(d, xd, R * LD);
            dp_device_free(d, xd);
        }
        assert_same_bits("fill columns", h[1], h[0], R * LD);
        for (int r = 0; r < R; r++) {
            cr_assert(memcmp(h[1] + (size_t)r * LD, x + (size_t)r * LD, C0 * sizeof(float)) == 0,
                      "row %d: a real column changed", r);
            for (int c = C0; c < LD; c++)
                cr_assert(isinf(h[1][r * LD + c]) && h[1][r * LD + c] < 0, "[%d][%d]", r, c);
        }
        for (int b = 0; b < 2; b++) free(h[b]);
        pair_close(&p);
    }
    free(x);
}

// --- bfloat16 logits (nn/nn_act16.h) ------------------------------------------------------

static uint16_t *upload_u16(dp_device *d, const uint16_t *h, size_t n)
{
    uint16_t *p = dalloc(d, n * sizeof *p);
    dp_assert_ok(dp_copy_h2d(d, p, h, n * sizeof *p));
    return p;
}

/* bfloat16 bits on one integer line (-0 and +0 both 0), so that
 * neighbouring values are 1 apart across zero too. */
static long bf16_ordinal(uint16_t h) { return h & 0x8000 ? -(long)(h & 0x7fff) : (long)h; }

/*
 * The cross-entropy over bfloat16 logits (dp_crossentropy_bf16). On the
 * CPU it is the float kernel (dp_crossentropy_forward_backward) on the
 * widened logits: its losses bit for bit, its dlogits each the float
 * kernel's rounded once. The GPU's kernel sums in float
 * (k_crossentropy_bf16_block, cuda_rows.cuh), so against the CPU its
 * losses are within ce16_loss_bound and its dlogits within 1 bfloat16
 * ulp (float values a few float ulp apart can round to neighbouring
 * bfloat16; here p << 1 in every row, so the target's p - 1 does not
 * cancel). On each device in place and loss-only give the bits of
 * separate. Ignored rows and masked (-inf) entries as in
 * check_crossentropy; V = 1000 (256 threads a row on the GPU), 4099 (256,
 * every other row not 16-byte aligned) and 50304 (1024).
 */
/* cuda_rows.cuh's bound on the GPU loss against the CPU's: (16 + 6G)
 * float roundings of the sum S, G the 8-element groups a thread takes
 * (the launcher gives rows from 8 x 1024 elements 1024 threads, others
 * 256), and each side's rounding of the loss. */
static double ce16_loss_bound(size_t V, float loss)
{
    size_t threads = V >= 8 * 1024 ? 1024 : 256, G = ((V + 7) / 8 + threads - 1) / threads;
    return (16.0 + 6.0 * (double)G) * 0x1p-24 + 0x1p-23 * fabs((double)loss);
}

static void check_crossentropy_bf16(size_t N, size_t V, uint64_t seed)
{
    float *f = rnd(seed, N * V, -4, 4);
    uint16_t *x16 = xmalloc(N * V * sizeof *x16);
    int32_t *tg = xmalloc(N * sizeof *tg);
    dp_rng rng;
    dp_rng_seed(&rng, seed + 1);
    for (size_t i = 0; i < N; i++) tg[i] = i % 5 == 2 ? -1 : (int32_t)dp_rng_below(&rng, V);
    for (size_t i = 0; i < N * V; i++) x16[i] = dp_bf16_round(f[i]);
    for (size_t i = 1; i < N; i += 3)
        for (size_t v = 0; v < V / 2; v++)
            if ((int32_t)v != tg[i]) x16[i * V + v] = 0xFF80; /* -inf */
    for (size_t i = 0; i < N * V; i++) f[i] = dp_bf16_widen(x16[i]);
    float dscale = 1.0f / (float)N;
    FOR_TARGETS(g)
    {
        pair p = pair_open(g);
        float *loss16[2], *lossf[2], *loss_only[2], *dlf[2];
        uint16_t *dl16[2], *inpl[2];
        for (int b = 0; b < 2; b++) {
            dp_device *d = p.d[b];
            uint16_t *xd = upload_u16(d, x16, N * V), *gd = dalloc(d, N * V * 2);
            float *wd = dp_test_upload(d, f, N * V), *gf = dalloc(d, N * V * 4),
                  *ls = dalloc(d, N * 4);
            int32_t *td = nn_upload_i32(d, tg, N);
            dp_assert_ok(dp_crossentropy_bf16(d, ls, gd, xd, td, N, V, dscale));
            loss16[b] = dp_test_nn_download(d, ls, N);
            dl16[b] = download_u16(d, gd, N * V);
            dp_assert_ok(dp_crossentropy_bf16(d, ls, NULL, xd, td, N, V, dscale));
            loss_only[b] = dp_test_nn_download(d, ls, N);
            dp_assert_ok(dp_crossentropy_bf16(d, ls, xd, xd, td, N, V, dscale)); /* in place */
            inpl[b] = download_u16(d, xd, N * V);
            double sum;
            dp_assert_ok(dp_crossentropy_forward_backward(d, &sum, gf, ls, wd, td, N, V, dscale));
            lossf[b] = dp_test_nn_download(d, ls, N);
            dlf[b] = dp_test_nn_download(d, gf, N * V);
            void *bufs[] = {xd, gd, wd, gf, ls, td};
            for (size_t i = 0; i < 6; i++) dp_device_free(d, bufs[i]);
        }
        for (int b = 0; b < 2; b++) {
            assert_same_bits("bf16 loss only vs with dlogits", loss_only[b], loss16[b], N);
            cr_assert(memcmp(inpl[b], dl16[b], N * V * sizeof(uint16_t)) == 0,
                      "backend %d: in place differs from separate", b);
        }
        assert_same_bits("cpu: bf16 vs float losses", loss16[0], lossf[0], N);
        for (size_t i = 0; i < N * V; i++)
            cr_assert(dl16[0][i] == dp_bf16_round(dlf[0][i]),
                      "cpu: dlogits %zu is 0x%04x, the float kernel's %a rounds to 0x%04x", i,
                      dl16[0][i], (double)dlf[0][i], dp_bf16_round(dlf[0][i]));
        for (size_t r = 0; r < N; r++)
            cr_assert(fabs((double)loss16[1][r] - (double)loss16[0][r]) <=
                          ce16_loss_bound(V, loss16[0][r]),
                      "V %zu row %zu: loss %.9g vs cpu %.9g", V, r, (double)loss16[1][r],
                      (double)loss16[0][r]);
        for (size_t i = 0; i < N * V; i++) {
            long d = bf16_ordinal(dl16[1][i]) - bf16_ordinal(dl16[0][i]);
            cr_assert(d >= -1 && d <= 1, "dlogits %zu: 0x%04x vs cpu 0x%04x (%ld bfloat16 ulp)",
                      i, dl16[1][i], dl16[0][i], d);
            if (tg[i / V] < 0 || x16[i] == 0xFF80)
                cr_assert(dl16[1][i] == 0, "dlogits %zu of an ignored row or a masked entry: "
                          "0x%04x", i, dl16[1][i]);
        }
        for (int b = 0; b < 2; b++) {
            free(loss16[b]), free(lossf[b]), free(loss_only[b]), free(dlf[b]);
            free(dl16[b]), free(inpl[b]);
        }
        pair_close(&p);
    }
    free(f);
    free(x16);
    free(tg);
}

Test(cuda_ops, crossentropy_bf16_matches_cpu, .timeout = 60)
{
    REQUIRE_GPU();
    check_crossentropy_bf16(37, 1000, 41);
    check_crossentropy_bf16(11, 4099, 42);
    check_crossentropy_bf16(3, 50304, 43);
}

/* The bfloat16 twins of the zeroing of ignored rows and of the column
 * fill (dp_zero_ignored_rows_bf16, dp_fill_columns_bf16): stores of 0 and
 * of -inf's bits (0xFF80), bitwise; the rest untouched. */
Test(cuda_ops, zero_and_fill_bf16_are_bitwise_equal, .timeout = 60)
{
    REQUIRE_GPU();
    enum { R = 300, C = 1029, PER = 3, LD = 1088, C0 = 1029, COLS = LD - C0 };
    float *xf = rnd(34, R * LD, -1, 1), *ft = rnd(35, R * PER, -1, 1);
    uint16_t *x = xmalloc(R * LD * sizeof *x);
    for (size_t i = 0; i < (size_t)R * LD; i++) x[i] = dp_bf16_round(xf[i]);
    int32_t ct[R];
    ignored_targets(ct, ft, R, PER);
    FOR_TARGETS(g)
    {
        pair p = pair_open(g);
        uint16_t *h[2][3];
        for (int b = 0; b < 2; b++) {
            dp_device *d = p.d[b];
            uint16_t *xd = upload_u16(d, x, R * LD);
            float *fd = dp_test_upload(d, ft, R * PER);
            int32_t *cd = nn_upload_i32(d, ct, R);
            dp_assert_ok(dp_zero_ignored_rows_bf16(d, xd, cd, DP_TARGET_CLASS, 1, R, C));
            h[b][0] = download_u16(d, xd, R * C);
            dp_assert_ok(dp_copy_h2d(d, xd, x, R * C * sizeof *x));
            dp_assert_ok(dp_zero_ignored_rows_bf16(d, xd, fd, DP_TARGET_F32, PER, R, C));
            h[b][1] = download_u16(d, xd, R * C);
            dp_assert_ok(dp_copy_h2d(d, xd, x, R * LD * sizeof *x));
            dp_assert_ok(dp_fill_columns_bf16(d, xd, -INFINITY, R, LD, C0, COLS));
            h[b][2] = download_u16(d, xd, R * LD);
            dp_device_free(d, xd), dp_device_free(d, fd), dp_device_free(d, cd);
        }
        static const char *what[3] = {"zero ignored rows bf16 (class)",
                                      "zero ignored rows bf16 (f32)", "fill columns bf16"};
        for (int k = 0; k < 3; k++)
            cr_assert(memcmp(h[1][k], h[0][k], (k < 2 ? R * C : R * LD) * sizeof(uint16_t)) == 0,
                      "%s differs from cpu", what[k]);
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) {
                size_t i = (size_t)r * C + c;
                cr_assert_eq(h[1][0][i], r % 3 == 1 ? 0 : x[i], "class (%d,%d)", r, c);
                cr_assert_eq(h[1][1][i], r % 4 == 2 ? 0 : x[i], "f32 (%d,%d)", r, c);
            }
        for (int r = 0; r < R; r++)
            for (int c = 0; c < LD; c++) {
                size_t i = (size_t)r * LD + c;
                cr_assert_eq(h[1][2][i], c >= C0 ? 0xFF80 : x[i], "fill (%d,%d)", r, c);
            }
        for (int b = 0; b < 2; b++)
            for (int k = 0; k < 3; k++) free(h[b][k]);
        pair_close(&p);
    }
    free(xf);
    free(ft);
    free(x);
}

/* Optimizers: three AdamW steps (decay on) and two SGD steps with and
 * without momentum, from the same state on both backends. A step is a
 * handful of roundings per element (FMA may merge some): rtol 1e-5,
 * atol 1e-7 on O(1) parameters and moments. */
Test(cuda_ops, optimizers_match_cpu, .timeout = 60)
{
    REQUIRE_GPU();
    enum { N = 10007 };
    float *p0 = rnd(1, N, -1, 1), *g = rnd(2, N, -1, 1), *buf0 = rnd(3, N, -1, 1);
    FOR_TARGETS(t)
    {
        pair p = pair_open(t);
        float *pa[2], *ma[2], *va[2], *ps[2], *bs[2], *pp[2];
        for (int b = 0; b < 2; b++) {
            dp_device *d = p.d[b];
            float *pd = dp_test_upload(d, p0, N), *gd = dp_test_upload(d, g, N),
                  *md = dp_test_nn_filled(d, N, 0.0f), *vd = dp_test_nn_filled(d, N, 0.0f);
            for (int s = 1; s <= 3; s++)
                dp_assert_ok(dp_adamw_update(d, pd, gd, md, vd, N, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, s));
            pa[b] = dp_test_nn_download(d, pd, N);
            ma[b] = dp_test_nn_download(d, md, N);
            va[b] = dp_test_nn_download(d, vd, N);
            dp_device_free(d, pd);
            pd = dp_test_upload(d, p0, N);
            float *bd = dp_test_upload(d, buf0, N);
            for (int s = 1; s <= 2; s++)
                dp_assert_ok(dp_sgd_update(d, pd, gd, bd, N, 0.1f, 0.9f, 0.01f, s));
            ps[b] = dp_test_nn_download(d, pd, N);
            bs[b] = dp_test_nn_download(d, bd, N);
            dp_device_free(d, pd);
            pd = dp_test_upload(d, p0, N);
            dp_assert_ok(dp_sgd_update(d, pd, gd, NULL, N, 0.1f, 0.0f, 0.0f, 1));
            pp[b] = dp_test_nn_download(d, pd, N);
            void *bufs[] = {pd, gd, md, vd, bd};
            for (size_t i = 0; i < 5; i++) dp_device_free(d, bufs[i]);
        }
        dp_assert_allclose(pa[1], pa[0], N, 1e-7, 1e-5);
        dp_assert_allclose(ma[1], ma[0], N, 1e-7, 1e-5);
        dp_assert_allclose(va[1], va[0], N, 1e-7, 1e-5);
        dp_assert_allclose(ps[1], ps[0], N, 1e-7, 1e-5);
        dp_assert_allclose(bs[1], bs[0], N, 1e-7, 1e-5);
        dp_assert_allclose(pp[1], pp[0], N, 1e-7, 1e-5);
        for (int b = 0; b < 2; b++) {
            free(pa[b]);
            free(ma[b]);
            free(va[b]);
            free(ps[b]);
            free(bs[b]);
            free(pp[b]);
        }
        pair_close(&p);
    }
    free(p0);
    free(g);
    free(buf0);
}

/*
 * The engine's fused update (optim/adamw_segments.h: clip, AdamW and the
 * bf16 replica over a slice's tensors in one launch) on the GPU against
 * the CPU, as optimizers_match_cpu (rtol 1e-5, atol 1e-7), the replica
 * within one bfloat16 step of the CPU's (2^-7 relative: its parameters
 * may round to neighbours), the scaled gradients bit for bit (one
 * multiplication), and the gap between the two segments untouched (NaN
 * stays NaN).
 */
static double *download_bf16(dp_device *d, const void *p, size_t n); /* below */

Test(cuda_ops, fused_adamw_segments_match_cpu, .timeout = 60)
{
    REQUIRE_GPU();
    enum { N = 10007, GAP0 = 4000, GAP1 = 4100 };
    float *p0 = rnd(11, N, -1, 1), *g = rnd(12, N, -1, 1);
    for (size_t i = GAP0; i < GAP1; i++) p0[i] = g[i] = NAN;
    dp_adamw_segs segs;
    memset(&segs, 0, sizeof segs);
    segs.n = 2;
    segs.begin[0] = 0, segs.end[0] = GAP0, segs.weight_decay[0] = 0.1f;
    segs.begin[1] = GAP1, segs.end[1] = N, segs.weight_decay[1] = 0.0f;
    FOR_TARGETS(t)
    {
        pair p = pair_open(t);
        float *res[2][4];
        double *rep[2];
        for (int b = 0; b < 2; b++) {
            dp_device *d = p.d[b];
            float *pd = dp_test_upload(d, p0, N), *gd = dp_test_upload(d, g, N),
                  *md = dp_test_nn_filled(d, N, 0.0f), *vd = dp_test_nn_filled(d, N, 0.0f);
            uint16_t *r16 = dalloc(d, N * sizeof *r16);
            for (int s = 1; s <= 3; s++)
                dp_assert_ok(dp_adamw_update_segments(d, pd, gd, md, vd, r16, &segs, 1e-2f, 0.9f,
                                                      0.95f, 1e-8f, s, 0.5f));
            float *bufs[] = {pd, gd, md, vd};
            for (int j = 0; j < 4; j++) {
                res[b][j] = dp_test_nn_download(d, bufs[j], N);
                dp_device_free(d, bufs[j]);
            }
            rep[b] = download_bf16(d, r16, N);
            dp_device_free(d, r16);
        }
        for (size_t i = GAP0; i < GAP1; i++)
            cr_assert(isnan(res[1][0][i]) && isnan(res[1][1][i]), "gap element %zu written", i);
        for (int j = 0; j < 4; j++) /* NaN gaps: compare the segments */
            for (uint32_t k = 0; k < 2; k++) {
                size_t o = (size_t)segs.begin[k], n = (size_t)(segs.end[k] - segs.begin[k]);
                if (j == 1)
                    cr_assert(memcmp(res[1][1] + o, res[0][1] + o, n * sizeof(float)) == 0,
                              "scaled gradients differ");
                else
                    dp_assert_allclose(res[1][j] + o, res[0][j] + o, n, 1e-7, 1e-5);
            }
        for (uint32_t k = 0; k < 2; k++)
            for (size_t i = (size_t)segs.begin[k]; i < (size_t)segs.end[k]; i++)
                cr_assert(fabs(rep[1][i] - rep[0][i]) <= 0x1p-7 * fabs(rep[0][i]) + 1e-30,
                          "replica element %zu: %g on the GPU, %g on the CPU", i, rep[1][i],
                          rep[0][i]);
        for (int b = 0; b < 2; b++) {
            for (int j = 0; j < 4; j++) free(res[b][j]);
            free(rep[b]);
        }
        pair_close(&p);
    }
    free(p0);
    free(g);
}

/*
 * Layers made of GEMMs and kernels (linear, attention) through the public
 * API. The GEMMs sum in different orders (OpenBLAS vs cuBLAS tiles), so
 * each output is within gamma_K of float64 on both sides: with K <= 64
 * terms of O(1), differences stay below ~1e-5 absolute; attention chains
 * three products and a softmax. atol 1e-5, rtol 1e-4.
 */
Test(cuda_ops, linear_and_attention_layers_match_cpu, .timeout = 60)
{
    REQUIRE_GPU();
    enum { N = 24, C = 48, OC = 40, B = 2, T = 12, NH = 4, AC = 32 };
    float *x = rnd(1, N * C, -1, 1), *w = rnd(2, OC * C, -0.3f, 0.3f), *bias = rnd(3, OC, -1, 1),
          *dout = rnd(4, N * OC, -1, 1), *qkv = rnd(5, B * T * 3 * AC, -1, 1),
          *adout = rnd(6, B * T * AC, -1, 1);
    FOR_TARGETS(g)
    {
        pair p = pair_open(g);
        float *lo[2], *ldx[2], *ldw[2], *ldb[2], *ao[2], *adq[2], *co[2], *cdq[2];
        for (int b = 0; b < 2; b++) {
            dp_device *d = p.d[b];
            float *xd = dp_test_upload(d, x, N * C), *wd = dp_test_upload(d, w, OC * C),
                  *bd = dp_test_upload(d, bias, OC), *od = dalloc(d, N * OC * 4),
                  *gd = dp_test_upload(d, dout, N * OC), *dxd = dalloc(d, N * C * 4),
                  *dwd = dp_test_nn_filled(d, OC * C, 0.0f), *dbd = dp_test_nn_filled(d, OC, 0.0f);
            dp_assert_ok(dp_linear_forward(d, od, xd, wd, bd, N, C, OC));
            dp_assert_ok(dp_linear_backward(d, dxd, dwd, dbd, gd, xd, wd, N, C, OC));
            lo[b] = dp_test_nn_download(d, od, N * OC);
            ldx[b] = dp_test_nn_download(d, dxd, N * C);
            ldw[b] = dp_test_nn_download(d, dwd, OC * C);
            ldb[b] = dp_test_nn_download(d, dbd, OC);
            void *bufs[] = {xd, wd, bd, od, gd, dxd, dwd, dbd};
            for (size_t i = 0; i < 8; i++) dp_device_free(d, bufs[i]);

            size_t nq = B * T * 3 * AC, ny = B * T * AC, na = (size_t)B * NH * T * T;
            float *qd = dp_test_upload(d, qkv, nq), *out = dalloc(d, ny * 4),
                  *qkvr = dalloc(d, nq * 4), *att = dalloc(d, na * 4),
                  *scratch = dalloc(d, ny * 4), *ad = dp_test_upload(d, adout, ny),
                  *dq = dalloc(d, nq * 4), *dqr = dalloc(d, nq * 4), *datt = dalloc(d, na * 4);
            dp_assert_ok(dp_attention_forward(d, out, qkvr, att, scratch, qd, B, T, AC, NH));
            dp_assert_ok(dp_attention_backward(d, dq, dqr, datt, scratch, ad, qkvr, att, B, T, AC, NH));
            ao[b] = dp_test_nn_download(d, out, ny);
            adq[b] = dp_test_nn_download(d, dq, nq);
            /* Chunks of 5 queries (5, 5, 2): each recomputed in the backward. */
            dp_assert_ok(dp_attention_forward_chunked(d, out, qkvr, DP_DTYPE_F32, att, NULL,
                                                      scratch, qd, B, T, AC, NH, 5));
            dp_assert_ok(dp_attention_backward_chunked(d, dq, dqr, att, NULL, datt, scratch, ad, qkvr,
                                                       DP_DTYPE_F32, B, T, AC, NH, 5));
            co[b] = dp_test_nn_download(d, out, ny);
            cdq[b] = dp_test_nn_download(d, dq, nq);
            void *abufs[] = {qd, out, qkvr, att, scratch, ad, dq, dqr, datt};
            for (size_t i = 0; i < 9; i++) dp_device_free(d, abufs[i]);
        }
        dp_assert_allclose(lo[1], lo[0], N * OC, 1e-5, 1e-4);
        dp_assert_allclose(ldx[1], ldx[0], N * C, 1e-5, 1e-4);
        dp_assert_allclose(ldw[1], ldw[0], OC * C, 1e-5, 1e-4);
        assert_same_bits("linear dbias", ldb[1], ldb[0], OC);
        dp_assert_allclose(ao[1], ao[0], B * T * AC, 1e-5, 1e-4);
        dp_assert_allclose(adq[1], adq[0], B * T * 3 * AC, 1e-5, 1e-4);
        dp_assert_allclose(co[1], co[0], B * T * AC, 1e-5, 1e-4);
        dp_assert_allclose(cdq[1], cdq[0], B * T * 3 * AC, 1e-5, 1e-4);
        dp_assert_allclose(co[1], ao[0], B * T * AC, 1e-5, 1e-4);
        for (int b = 0; b < 2; b++) {
            free(co[b]);
            free(cdq[b]);
            free(lo[b]);
            free(ldx[b]);
            free(ldw[b]);
            free(ldb[b]);
            free(ao[b]);
            free(adq[b]);
        }
        pair_close(&p);
    }
    free(x);
    free(w);
    free(bias);
    free(dout);
    free(qkv);
    free(adout);
}

/*
 * The chunked attention in BF16 precision with the probabilities' and
 * score gradients' bfloat16 copies (att16) against the same calls
 * without them, on each device: the GEMMs get the same bfloat16 operands
 * either way (the softmax rounds them as the GEMM's own conversion would,
 * one rounding, dp_bf16_round), so the results are the same up to the
 * GEMM's choice of algorithm for an operand in another buffer: cuBLAS's
 * float32 accumulation over <= T = 40 products of O(1) terms, a few ulp
 * of the O(1) results: atol 1e-5, rtol 1e-5. The CPU gives the same bits
 * (test_attention's chunked_att16_gives_the_same_bits); the log says
 * whether the GPU did too.
 */
Test(cuda_ops, chunked_attention_att16_matches_converting_gemms, .timeout = 60)
{
    REQUIRE_GPU();
    enum { B = 2, T = 40, NH = 4, AC = 64, CHUNK = 16 };
    size_t nq = (size_t)B * T * 3 * AC, ny = (size_t)B * T * AC,
           na = (size_t)B * NH * (CHUNK < T ? CHUNK : T) * T;
    float *qkv = rnd(21, nq, -1, 1), *adout = rnd(22, ny, -1, 1);
    FOR_TARGETS(g)
    {
        dp_device *d = open_target(g);
        dp_assert_ok(dp_device_set_matmul_precision(d, DP_MATMUL_BF16));
        float *res[2][2];
        for (int with16 = 0; with16 < 2; with16++) {
            float *qd = dp_test_upload(d, qkv, nq), *out = dalloc(d, ny * 4),
                  *qkvr = dalloc(d, nq * 4), *att = dalloc(d, na * 4),
                  *scratch = dalloc(d, ny * 4), *ad = dp_test_upload(d, adout, ny),
                  *dq = dalloc(d, nq * 4), *dqr = dalloc(d, nq * 4), *datt = dalloc(d, na * 4);
            dp_bf16 *a16 = with16 ? (dp_bf16 *)dalloc(d, na * 2) : NULL;
            dp_assert_ok(dp_attention_forward_chunked(d, out, qkvr, DP_DTYPE_BF16, att, a16,
                                                      scratch, qd, B, T, AC, NH, CHUNK));
            dp_assert_ok(dp_attention_backward_chunked(d, dq, dqr, att, a16, datt, scratch, ad,
                                                       qkvr, DP_DTYPE_BF16, B, T, AC, NH, CHUNK));
            res[with16][0] = dp_test_nn_download(d, out, ny);
            res[with16][1] = dp_test_nn_download(d, dq, nq);
            void *bufs[] = {qd, out, qkvr, att, scratch, ad, dq, dqr, datt, a16};
            for (size_t i = 0; i < 10; i++)
                if (bufs[i]) dp_device_free(d, bufs[i]);
        }
        cr_log_info("%s: att16 gives the same bits: out %s, dqkv %s", dp_device_name(d),
                    memcmp(res[0][0], res[1][0], ny * 4) ? "no" : "yes",
                    memcmp(res[0][1], res[1][1], nq * 4) ? "no" : "yes");
        dp_assert_allclose(res[1][0], res[0][0], ny, 1e-5, 1e-5);
        dp_assert_allclose(res[1][1], res[0][1], nq, 1e-5, 1e-5);
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++) free(res[i][j]);
        close_checked(d);
    }
    free(qkv);
    free(adout);
}

/*
 * The fused attention (kernels/flash.h: cuda_flash.cu's tiled kernels for
 * hs 64 and 128, a thread per row otherwise) against the CPU's loops of
 * the same items. Both take one online step per key in the same order,
 * so they differ only where the arithmetic does: the GPU's dots split over
 * G threads per row (partial sums, then a butterfly), nvcc's FMA
 * contraction and expf against dp_expf (2 ulp each). Those are errors of
 * the kind test_attention_fused bounds against float64 for the CPU (std
 * 1.5 inputs: out 3e-5, lse 1e-5, dqkv 4e-5 absolute, rtol 1e-5), so two
 * backends each within them agree within twice those. Shapes: T past one
 * 64-row tile and no multiple of the 32-row tiles, T = 1, hs 64, 128 and 7
 * (odd: the per-row kernels); float32, and bfloat16 qkv with a bfloat16
 * out in the backward: the CPU's out rounded, given to both backwards.
 * (Each device's own rounding would differ where the two outs straddle a
 * bfloat16 rounding boundary: an ulp of 2^-8 |O| in D, which moved dq and
 * dk of such rows by ~2e-4 on an H200, past the float32 bound.) Each
 * device also gives the same bits twice.
 * Bfloat16 at head size 64 runs the tensor core kernels on sm_80 and
 * later (cuda_flash_tc.cuh), which round P, dO and dS to bfloat16 for
 * their products: there the GPU is held to flash_tc_bound.h's float64
 * reference and bounds instead (the float32 kernels, where they run
 * instead, are well within those).
 */
/* off: out, dout and dqkv start that many floats into their buffers (1:
 * only 4-byte aligned, which the tensor core kernels' pair stores and
 * 16-byte loads cannot take, so the launchers must fall back). */
static void fused_attention_run(dp_device *d, size_t B, size_t T, size_t C, size_t NH, int bf16,
                                const float *qkv_h, const float *dout_h, const uint16_t *o16_h,
                                float **res, size_t off)
{
    size_t nq = B * T * 3 * C, no = B * T * C, nr = B * NH * T;
    float *qkv = dp_test_upload(d, qkv_h, nq), *dout_buf = dalloc(d, (no + off) * 4);
    float *out_buf = dalloc(d, (no + off) * 4), *lse = dalloc(d, nr * 4),
          *delta = dalloc(d, nr * 4), *dqkv_buf = dalloc(d, (nq + off) * 4);
    float *dout = dout_buf + off, *out = out_buf + off, *dqkv = dqkv_buf + off;
    dp_assert_ok(dp_copy_h2d(d, dout, dout_h, no * 4));
    /* q, k, v as the fused calls read them in place: qkv, or its rounding */
    void *qkvr = bf16 ? upload_typed(d, qkv_h, nq, 1) : (void *)qkv;
    void *o16 = bf16 ? dalloc(d, no * 2) : NULL;
    void *fill[] = {out, lse, delta, dqkv};
    size_t bytes[] = {no * 4, nr * 4, nr * 4, nq * 4};
    for (int i = 0; i < 4; i++) dp_assert_ok(dp_memset(d, fill[i], 0xFF, bytes[i]));
    dp_dtype t = bf16 ? DP_DTYPE_BF16 : DP_DTYPE_F32;
    dp_assert_ok(dp_attention_forward_fused(d, out, lse, qkvr, t, B, T, C, NH));
    if (bf16 && o16_h) dp_assert_ok(dp_copy_h2d(d, o16, o16_h, no * 2));
    else if (bf16) dp_assert_ok(dp_convert(d, o16, DP_DTYPE_BF16, out, DP_DTYPE_F32, no));
    dp_assert_ok(dp_attention_backward_fused(d, dqkv, delta, dout, qkvr, t, lse,
                                             bf16 ? o16 : (void *)out, t, B, T, C, NH));
    res[0] = dp_test_nn_download(d, out, no);
    res[1] = dp_test_nn_download(d, lse, nr);
    res[2] = dp_test_nn_download(d, dqkv, nq);
    res[3] = dp_test_nn_download(d, delta, nr);
    /* into a bfloat16 dqkv: the same kernels' values, each rounded once */
    dp_bf16 *dqkv16 = dalloc(d, nq * 2), *h16 = xmalloc(nq * 2);
    dp_assert_ok(dp_attention_backward_fused16(d, dqkv16, delta, dout, DP_DTYPE_F32, qkvr, t,
                                               lse, bf16 ? o16 : (void *)out, t, B, T, C, NH));
    dp_assert_ok(dp_copy_d2h(d, h16, dqkv16, nq * 2));
    for (size_t i = 0; i < nq; i++)
        cr_assert_eq(h16[i], dp_bf16_from_float(res[2][i]), "%s: bf16 dqkv[%zu]", d->name, i);
    /* ... from a bfloat16 dout: the float32 call's bits on its widened
     * values (the kernels round dO for their products either way) */
    {
        float *wide = xmalloc(no * 4);
        for (size_t i = 0; i < no; i++) wide[i] = dp_bf16_to_float(dp_bf16_from_float(dout_h[i]));
        float *dw = dp_test_upload(d, wide, no), *dq32 = dalloc(d, nq * 4), *dq_w;
        void *g16 = upload_typed(d, dout_h, no, 1);
        float *dl2 = dalloc(d, nr * 4);
        dp_assert_ok(dp_attention_backward_fused(d, dq32, dl2, dw, qkvr, t, lse,
                                                 bf16 ? o16 : (void *)out, t, B, T, C, NH));
        dp_assert_ok(dp_attention_backward_fused16(d, dqkv16, delta, g16, DP_DTYPE_BF16, qkvr, t,
                                                   lse, bf16 ? o16 : (void *)out, t, B, T, C,
                                                   NH));
        dq_w = dp_test_nn_download(d, dq32, nq);
        dp_assert_ok(dp_copy_d2h(d, h16, dqkv16, nq * 2));
        for (size_t i = 0; i < nq; i++)
            cr_assert_eq(h16[i], dp_bf16_from_float(dq_w[i]), "%s: bf16 dqkv[%zu], bf16 dout",
                         d->name, i);
        free(wide), free(dq_w);
        dp_device_free(d, dw), dp_device_free(d, dq32), dp_device_free(d, g16);
        dp_device_free(d, dl2);
    }
    free(h16);
    dp_device_free(d, dqkv16);
    void *bufs[] = {qkv, dout_buf, out_buf, lse, delta, dqkv_buf, bf16 ? qkvr : NULL, o16};
    for (size_t i = 0; i < 8; i++)
        if (bufs[i]) dp_device_free(d, bufs[i]);
}

/* A bfloat16 run of head size 64 held to flash_tc_bound.h: q, k, v are
 * qkv rounded, D the one the backward computed. */
static void fused_attention_bound_slack(const float *qkv, const float *dout, float **res,
                                        size_t B, size_t T, size_t C, size_t NH,
                                        const char *dev, double slack)
{
    size_t hs = C / NH, nq = B * T * 3 * C;
    float *qkvr = malloc(nq * sizeof(float));
    cr_assert(qkvr);
    for (size_t i = 0; i < nq; i++) qkvr[i] = dp_bf16_widen(dp_bf16_round(qkv[i]));
    flash_tc_in in = {B, T, NH, hs, qkvr, dout, res[3], slack};
    flash_tc_worst w = flash_tc_check(&in, res[0], res[1], res[2]);
    cr_log_info("%s bf16 hs %zu against float64: worst err/bound out %.3f lse %.3f dq %.3f "
                "dk %.3f dv %.3f", dev, hs, w.out, w.lse, w.dq, w.dk, w.dv);
    cr_expect(w.out <= 1.0 && w.lse <= 1.0 && w.dq <= 1.0 && w.dk <= 1.0 && w.dv <= 1.0,
              "%s: the bf16 fused attention is past its bounds (err/bound out %.3g lse %.3g "
              "dq %.3g dk %.3g dv %.3g)", dev, w.out, w.lse, w.dq, w.dk, w.dv);
    cr_expect(w.biggest > 1e-3, "%s: the gradients are all near zero", dev);
    free(qkvr);
}

static void fused_attention_bound(const float *qkv, const float *dout, float **res, size_t B,
                                  size_t T, size_t C, size_t NH, const char *dev)
{
    fused_attention_bound_slack(qkv, dout, res, B, T, C, NH, dev, 0.0);
}

Test(cuda_ops, fused_attention_matches_cpu, .timeout = 120)
{
    REQUIRE_GPU();
    const size_t shapes[][4] = {{2, 100, 128, 2}, {3, 130, 64, 1}, {1, 70, 256, 2},
                                {2, 45, 42, 6},   {1, 1, 128, 2}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        size_t B = shapes[si][0], T = shapes[si][1], C = shapes[si][2], NH = shapes[si][3];
        size_t n[3] = {B * T * C, B * NH * T, B * T * 3 * C};
        const double atol[3] = {2 * 3e-5, 2 * 1e-5, 2 * 4e-5};
        float *qkv = rnd_normal(40 + si, n[2], 0.0f, 1.5f),
              *dout = rnd_normal(50 + si, n[0], 0.0f, 1.0f);
        for (int bf16 = 0; bf16 < 2; bf16++)
            FOR_TARGETS(g)
            {
                pair p = pair_open(g);
                float *res[2][4], *again[4];
                fused_attention_run(p.d[0], B, T, C, NH, bf16, qkv, dout, NULL, res[0], 0);
                uint16_t *o16 = malloc(n[0] * sizeof *o16);
                cr_assert(o16);
                for (size_t e = 0; e < n[0]; e++) o16[e] = dp_bf16_round(res[0][0][e]);
                fused_attention_run(p.d[1], B, T, C, NH, bf16, qkv, dout, o16, res[1], 0);
                fused_attention_run(p.d[1], B, T, C, NH, bf16, qkv, dout, o16, again, 0);
                free(o16);
                cr_log_info("%s B=%zu T=%zu C=%zu NH=%zu %s", dp_device_name(p.d[1]), B, T, C,
                            NH, bf16 ? "bf16" : "f32");
                int tc = bf16 && C / NH == 64;
                if (tc)
                    fused_attention_bound(qkv, dout, res[1], B, T, C, NH,
                                          dp_device_name(p.d[1]));
                static const char *what[3] = {"fused out", "fused lse", "fused dqkv"};
                for (int k = 0; k < 4; k++) {
                    if (k < 3 && !tc) dp_assert_allclose(res[1][k], res[0][k], n[k], atol[k], 2e-5);
                    if (k < 3) assert_same_bits(what[k], again[k], res[1][k], n[k]);
                    free(res[0][k]);
                    free(res[1][k]);
                    free(again[k]);
                }
                pair_close(&p);
            }
        free(qkv);
        free(dout);
    }
}

/*
 * cuDNN's fused attention (DP_CUDA_CUDNN=1: backend/cuda/cuda_sdpa.c)
 * against float64, held to flash_tc_bound.h's bound with the slack its
 * bfloat16 outputs and its own D need (6u, derived there), at head sizes
 * 64 (GPT-2's) and 128, T past cuDNN's 64- and 128-row tiles and not a
 * multiple of them, and T = 1. cuDNN computes D itself (the API's delta
 * is not written), so the reference's D is dO . O from the same out the
 * backward was given. Its backward is the deterministic algorithm: the
 * same bits twice. Skips, naming the reason, where the module or cuDNN
 * is missing (gpu-check finds libcudnn.so.9 in PyTorch's wheel).
 */
Test(cuda_ops, cudnn_attention_matches_float64, .timeout = 120)
{
    REQUIRE_CUDNN();
    const size_t shapes[][4] = {{2, 100, 128, 2}, {3, 130, 64, 1}, {1, 200, 256, 2},
                                {1, 1, 128, 2}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        size_t B = shapes[si][0], T = shapes[si][1], C = shapes[si][2], NH = shapes[si][3];
        size_t no = B * T * C, nr = B * NH * T, nq = 3 * no, hs = C / NH;
        float *qkv = rnd_normal(70 + si, nq, 0.0f, 1.5f), *dout = rnd_normal(80 + si, no, 0.0f, 1.0f);
        FOR_TARGETS(g)
        {
            dp_device *d = open_target_cudnn(g, "1");
            float *res[4], *again[4];
            fused_attention_run(d, B, T, C, NH, 1, qkv, dout, NULL, res, 0);
            uint16_t *o16 = malloc(no * sizeof *o16);
            cr_assert(o16);
            for (size_t e = 0; e < no; e++) {
                o16[e] = dp_bf16_round(res[0][e]);
                cr_assert(dp_bf16_widen(o16[e]) == res[0][e] || res[0][e] != res[0][e],
                          "out[%zu] = %g is not a bfloat16 value: cuDNN did not run", e,
                          res[0][e]);
            }
            fused_attention_run(d, B, T, C, NH, 1, qkv, dout, o16, again, 0);
            for (size_t r = 0; r < nr; r++) { /* D_r = dO_r . O_r, as cuDNN takes them */
                size_t row = dp_flash_tok_row(r, T, NH, hs, 1, 0);
                double D = 0.0;
                for (size_t e = 0; e < hs; e++)
                    D += (double)dout[row + e] * dp_bf16_widen(o16[row + e]);
                res[3][r] = (float)D;
            }
            cr_log_info("%s cuDNN B=%zu T=%zu C=%zu NH=%zu", dp_device_name(d), B, T, C, NH);
            fused_attention_bound_slack(qkv, dout, res, B, T, C, NH, dp_device_name(d), 6.0);
            static const char *what[3] = {"cuDNN out", "cuDNN lse", "cuDNN dqkv"};
            size_t n[3] = {no, nr, nq};
            for (int k = 0; k < 3; k++) assert_same_bits(what[k], again[k], res[k], n[k]);
            for (int k = 0; k < 4; k++) {
                free(res[k]);
                free(again[k]);
            }
            free(o16);
            close_checked(d);
        }
        free(qkv);
        free(dout);
    }
}

/* The fused attention's forward of a bfloat16 qkv(B,T,3C) on a device
 * opened with DP_CUDA_CUDNN as `mode` says (NULL: unset), for each of
 * n_T context lengths T0, T0 + 1, ... in turn (each a new shape): the
 * float32 outs, one malloc'd array per length in outs. */
static void attention_forward_per_length(int g, const char *mode, size_t B, size_t T0,
                                         size_t n_T, size_t C, size_t NH, const float *qkv,
                                         float **outs)
{
    dp_device *d = open_target_cudnn(g, mode);
    for (size_t i = 0; i < n_T; i++) {
        size_t T = T0 + i, no = B * T * C, nr = B * NH * T;
        void *q = upload_typed(d, qkv, B * T * 3 * C, 1);
        float *out = dalloc(d, no * 4), *lse = dalloc(d, nr * 4);
        dp_assert_ok(dp_attention_forward_fused(d, out, lse, q, DP_DTYPE_BF16, B, T, C, NH));
        outs[i] = dp_test_nn_download(d, out, no);
        void *bufs[] = {q, out, lse};
        for (int k = 0; k < 3; k++) dp_device_free(d, bufs[k]);
    }
    close_checked(d);
}

/*
 * The default (DP_CUDA_CUDNN unset) runs cuDNN's attention for the first
 * DP_CUDA_SDPA_AUTO_SHAPES shapes a device sees and dp's kernels after
 * them (sampling's growing context would build a cuDNN plan per length):
 * over 10 context lengths in turn, the first 8 outs are DP_CUDA_CUDNN=1's
 * bits and the last 2 DP_CUDA_CUDNN=0's, and the two differ for every
 * length (cuDNN's out is rounded to bfloat16, dp's float32 out is not),
 * so each comparison tells them apart. Any other value is refused as the
 * device opens, naming it.
 */
Test(cuda_ops, cudnn_is_the_default_for_the_first_shapes, .timeout = 120)
{
    REQUIRE_CUDNN();
    enum { N_T = 10, FIRST = 8 };
    const size_t B = 2, T0 = 65, C = 128, NH = 2;
    float *qkv = rnd_normal(90, B * (T0 + N_T) * 3 * C, 0.0f, 1.5f);
    float *dflt[N_T], *cudnn[N_T], *own[N_T];
    attention_forward_per_length(0, NULL, B, T0, N_T, C, NH, qkv, dflt);
    attention_forward_per_length(0, "1", B, T0, N_T, C, NH, qkv, cudnn);
    attention_forward_per_length(0, "0", B, T0, N_T, C, NH, qkv, own);
    for (size_t i = 0; i < N_T; i++) {
        size_t no = B * (T0 + i) * C;
        cr_assert(memcmp(cudnn[i], own[i], no * 4) != 0,
                  "T=%zu: cuDNN's and dp's outs are the same bits", T0 + i);
        char what[64];
        snprintf(what, sizeof what, "default out, T=%zu (shape %zu)", T0 + i, i + 1);
        assert_same_bits(what, dflt[i], i < FIRST ? cudnn[i] : own[i], no);
        free(dflt[i]);
        free(cudnn[i]);
        free(own[i]);
    }
    free(qkv);
    setenv("DP_CUDA_CUDNN", "yes", 1);
    dp_device_spec spec = {DP_DEVICE_CUDA, 0};
    dp_device *d = NULL;
    cr_assert_eq(dp_device_open(&spec, &d), DP_ERR_INVALID_ARGUMENT);
    cr_assert_null(d);
    cr_assert(strstr(dp_last_error(), "DP_CUDA_CUDNN=yes") && strstr(dp_last_error(), "unset"),
              "%s", dp_last_error());
    setenv("DP_CUDA_CUDNN", "0", 1);
}

/* The default gives way to dp's kernels where cuDNN's scratch and
 * workspace would pass the device's memory limit (dp's need neither):
 * with the limit at what is in use and reserved, the default's forward
 * has DP_CUDA_CUDNN=0's bits, and DP_CUDA_CUDNN=1's fails out of memory.
 * The limit lifted, the shape stays with dp's kernels (remembered). */
Test(cuda_ops, cudnn_default_gives_way_at_the_memory_limit, .timeout = 60)
{
    REQUIRE_CUDNN();
    const size_t B = 2, T = 96, C = 128, NH = 2, no = B * T * C, nr = B * NH * T;
    float *qkv = rnd_normal(91, B * T * 3 * C, 0.0f, 1.5f), *res[3];
    const char *modes[3] = {NULL, "0", "1"};
    for (int m = 0; m < 3; m++) {
        dp_device *d = open_target_cudnn(0, modes[m]);
        void *q = upload_typed(d, qkv, B * T * 3 * C, 1);
        float *out = dalloc(d, no * 4), *lse = dalloc(d, nr * 4);
        dp_memory_stats st;
        dp_device_memory(d, &st);
        dp_assert_ok(dp_device_set_limit(d, st.in_use + st.reserved));
        dp_status s = dp_attention_forward_fused(d, out, lse, q, DP_DTYPE_BF16, B, T, C, NH);
        if (m == 2) {
            cr_assert_eq(s, DP_ERR_OUT_OF_MEMORY, "DP_CUDA_CUDNN=1 past the limit: %s",
                         dp_last_error());
            res[m] = NULL;
        } else {
            cr_assert_eq(s, DP_OK, "DP_CUDA_CUDNN=%s at the limit: %s",
                         modes[m] ? modes[m] : "(unset)", dp_last_error());
            res[m] = dp_test_nn_download(d, out, no);
        }
        if (m == 0) { /* the limit lifted: still dp's kernels for this shape */
            dp_assert_ok(dp_device_set_limit(d, 0));
            dp_assert_ok(dp_attention_forward_fused(d, out, lse, q, DP_DTYPE_BF16, B, T, C, NH));
            float *again = dp_test_nn_download(d, out, no);
            assert_same_bits("the default's out with the limit lifted", again, res[0], no);
            free(again);
        }
        void *bufs[] = {q, out, lse};
        for (int k = 0; k < 3; k++) dp_device_free(d, bufs[k]);
        close_checked(d);
    }
    assert_same_bits("the default's out at the limit", res[0], res[1], no);
    free(res[0]);
    free(res[1]);
    free(qkv);
}

/* bf16 at head size 64 with out, dout and dqkv only 4-byte aligned: the
 * launchers fall back from the tensor core kernels (whose float pair
 * stores and 16-byte loads would fault) to the float32 ones, which still
 * meet the tensor core bound against float64. */
Test(cuda_ops, fused_attention_unaligned_buffers_fall_back, .timeout = 60)
{
    REQUIRE_GPU();
    const size_t B = 1, T = 70, C = 128, NH = 2;
    float *qkv = rnd_normal(60, B * T * 3 * C, 0.0f, 1.5f), *dout = rnd_normal(61, B * T * C, 0.0f, 1.0f);
    FOR_TARGETS(g)
    {
        pair p = pair_open(g);
        float *res[4];
        fused_attention_run(p.d[1], B, T, C, NH, 1, qkv, dout, NULL, res, 1);
        fused_attention_bound(qkv, dout, res, B, T, C, NH, dp_device_name(p.d[1]));
        for (int k = 0; k < 4; k++) free(res[k]);
        pair_close(&p);
    }
    free(qkv);
    free(dout);
}

// --- the bfloat16 producers (nn/nn_act16.h) ------------------------------------------------
/*
 * On one device each producer is held to its own composition: the
 * LayerNorm's bfloat16 output is the float32 kernel's value rounded (one
 * kernel template, the same instructions up to the store), so bit for
 * bit; the backward's dout16 feeds the very cuBLAS call that rounding dout
 * inside the GEMM feeds, so bit for bit; the linear forward through
 * cuBLASLt runs another kernel than cuBLAS's float32 layer, so within the
 * GEMM bound (bit for bit where cuBLASLt declines, e.g. a float32 input).
 *
 * Across backends, bfloat16 outputs of float32 values x, y that differ by
 * d: a = bf16(x), b = bf16(y) are each within half a bfloat16 ulp, at
 * most 2^-8 of the value (8 significant bits), so |a - b| <= d + 2^-8
 * (|x| + |y|) <= 1.004 d + 2^-7 |b| / (1 - 2^-8). With the float32 op's
 * bound d <= atol + rtol |y| that is within atol16 = 1.01 atol and rtol16
 * = 1.01 rtol + 0.0079 of b.
 */
static double bf16v(dp_bf16 h) { return (double)dp_bf16_to_float(h); }

/* n device bfloat16 values as host doubles. */
static double *download_bf16(dp_device *d, const void *p, size_t n)
{
    dp_bf16 *h = xmalloc(n * sizeof *h);
    double *r = xmalloc(n * sizeof *r);
    dp_assert_ok(dp_copy_d2h(d, h, p, n * sizeof *h));
    for (size_t i = 0; i < n; i++) r[i] = bf16v(h[i]);
    free(h);
    return r;
}

static void assert_same_doubles(const char *what, const double *a, const double *e, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &e[i], sizeof a[i]) != 0)
            cr_assert_fail("%s: element %zu of %zu differs: %.9g vs %.9g", what, i, n, a[i], e[i]);
}

static void check_layernorm_out16(size_t N, size_t C)
{
    float *x = rnd_normal(11, N * C, 3.0f, 1.0f), *w = rnd(12, C, 0.5f, 1.5f),
          *bias = rnd(13, C, -1, 1);
    for (int w16 = 0; w16 < 2; w16++)
        FOR_TARGETS(g)
        {
            pair p = pair_open(g);
            double *out[2];
            for (int b = 0; b < 2; b++) {
                dp_device *d = p.d[b];
                void *xd = dp_test_upload(d, x, N * C), *wd = upload_typed(d, w, C, w16),
                     *bd = upload_typed(d, bias, C, w16);
                float *ref = dalloc(d, N * C * 4), *m0 = dalloc(d, N * 4), *r0 = dalloc(d, N * 4),
                      *m1 = dalloc(d, N * 4), *r1 = dalloc(d, N * 4);
                void *ref16 = dalloc(d, N * C * 2), *o16 = dalloc(d, N * C * 2);
                if (w16)
                    dp_assert_ok(dp_layernorm_forward_bf16(d, ref, m0, r0, xd, wd, bd, N, C));
                else
                    dp_assert_ok(dp_layernorm_forward(d, ref, m0, r0, xd, wd, bd, N, C));
                dp_assert_ok(dp_convert(d, ref16, DP_DTYPE_BF16, ref, DP_DTYPE_F32, N * C));
                dp_pref pw = w16 ? dp_pref_bf16(wd) : dp_pref_f32(wd);
                dp_pref pb = w16 ? dp_pref_bf16(bd) : dp_pref_f32(bd);
                dp_assert_ok(dp_layernorm_forward_out16(d, o16, m1, r1, xd, pw, pb, N, C));
                out[b] = download_bf16(d, o16, N * C);
                double *want = download_bf16(d, ref16, N * C);
                assert_same_doubles("layernorm bf16 output vs float32 + conversion", out[b],
                                    want, N * C);
                float *ma = dp_test_nn_download(d, m1, N), *me = dp_test_nn_download(d, m0, N),
                      *ra = dp_test_nn_download(d, r1, N), *re = dp_test_nn_download(d, r0, N);
                assert_same_bits("layernorm bf16 output's mean", ma, me, N);
                assert_same_bits("layernorm bf16 output's rstd", ra, re, N);
                free(want);
                free(ma);
                free(me);
                free(ra);
                free(re);
                void *bufs[] = {xd, wd, bd, ref, m0, r0, m1, r1, ref16, o16};
                for (size_t i = 0; i < 10; i++) dp_device_free(d, bufs[i]);
            }
            /* the float32 forward's bounds (layernorm_matches_cpu), for bfloat16 */
            double k = sqrt((double)C / 129.0);
            dp_assert_allclose(out[1], out[0], N * C, 1.01e-5 * k, 1.01e-5 + 0.0079);
            free(out[0]);
            free(out[1]);
            pair_close(&p);
        }
    free(x);
    free(w);
    free(bias);
}

Test(cuda_ops, layernorm_bf16_output_matches_cpu, .timeout = 60)
{
    REQUIRE_GPU();
    check_layernorm_out16(37, 129);
    check_layernorm_out16(64, 768);
}

/*
 * The residual stream's update fused with the LayerNorm
 * (dp_residual_layernorm_forward), float32 output: on each device bit for
 * bit dp_accumulate then the LayerNorm (the same kernel, the add made by
 * the threads that then read the row); across devices the sum x + add
 * bit for bit (one IEEE addition) and the output within the float32
 * LayerNorm's bounds (layernorm_matches_cpu).
 */
static void check_residual_layernorm(size_t N, size_t C)
{
    float *x = rnd_normal(21, N * C, 1.0f, 1.0f), *add = rnd_normal(22, N * C, -0.5f, 1.0f),
          *w = rnd(23, C, 0.5f, 1.5f), *bias = rnd(24, C, -1, 1);
    FOR_TARGETS(g)
    {
        pair p = pair_open(g);
        float *out[2], *sum[2];
        for (int b = 0; b < 2; b++) {
            dp_device *d = p.d[b];
            float *x0 = dp_test_upload(d, x, N * C), *x1 = dp_test_upload(d, x, N * C),
                  *ad = dp_test_upload(d, add, N * C), *wd = dp_test_upload(d, w, C),
                  *bd = dp_test_upload(d, bias, C), *o0 = dalloc(d, N * C * 4),
                  *o1 = dalloc(d, N * C * 4), *m = dalloc(d, N * 4), *r = dalloc(d, N * 4);
            dp_assert_ok(dp_accumulate(d, x0, ad, N * C));
            dp_assert_ok(dp_layernorm_forward(d, o0, m, r, x0, wd, bd, N, C));
            dp_assert_ok(dp_residual_layernorm_forward(d, o1, DP_DTYPE_F32, m, r, x1, ad,
                                                       dp_pref_f32(wd), dp_pref_f32(bd), N, C));
            out[b] = dp_test_nn_download(d, o1, N * C);
            sum[b] = dp_test_nn_download(d, x1, N * C);
            float *want = dp_test_nn_download(d, o0, N * C), *wsum = dp_test_nn_download(d, x0, N * C);
            assert_same_bits("fused residual LayerNorm vs accumulate + LayerNorm", out[b], want,
                             N * C);
            assert_same_bits("fused residual sum vs dp_accumulate", sum[b], wsum, N * C);
            free(want);
            free(wsum);
            void *bufs[] = {x0, x1, ad, wd, bd, o0, o1, m, r};
            for (size_t i = 0; i < 9; i++) dp_device_free(d, bufs[i]);
        }
        assert_same_bits("the residual sum across devices", sum[1], sum[0], N * C);
        double k = sqrt((double)C / 129.0); /* layernorm_matches_cpu's bounds */
        dp_assert_allclose(out[1], out[0], N * C, 1e-5 * k, 1e-5);
        for (int b = 0; b < 2; b++) {
            free(out[b]);
            free(sum[b]);
        }
        pair_close(&p);
    }
    free(x);
    free(add);
    free(w);
    free(bias);
}

Test(cuda_ops, residual_layernorm_matches_cpu, .timeout = 60)
{
    REQUIRE_GPU();
    check_residual_layernorm(37, 129);
    check_residual_layernorm(64, 768);
}

/*
 * The linear forward with a bfloat16 output and the backward rounding
 * dout once, bfloat16 operands in BF16 math (the GPT's c_fc; cuBLASLt's
 * case), and a float32 input (which cuBLASLt declines: the composition).
 * GEMM sums of K <= 128 products of bfloat16 values (exact in float32) of
 * inputs in [-1, 1) and weights in [-0.3, 0.3): float32 differences
 * between two summation orders stay below ~K 2^-24 sum |terms| ~ 1e-5
 * (typical far less): atol = rtol = 1e-4 for float32 results, and the
 * bfloat16 bound above for the outputs. dbias is the float32 dout's column
 * sums in one order on both: bit for bit.
 */
Test(cuda_ops, linear_bf16_producers_match_cpu, .timeout = 60)
{
    REQUIRE_GPU();
    enum { N = 64, C = 96, OC = 128 };
    float *x = rnd(21, N * C, -1, 1), *w = rnd(22, OC * C, -0.3f, 0.3f), *bias = rnd(23, OC, -1, 1),
          *dout = rnd(24, N * OC, -1, 1);
    for (int x16 = 1; x16 >= 0; x16--)
        FOR_TARGETS(g)
        {
            pair p = pair_open(g);
            double *out[2];
            float *dx[2], *dw[2], *db[2];
            for (int b = 0; b < 2; b++) {
                dp_device *d = p.d[b];
                dp_assert_ok(dp_device_set_matmul_precision(d, DP_MATMUL_BF16));
                void *xd = upload_typed(d, x, N * C, x16), *wd = upload_typed(d, w, OC * C, 1),
                     *bd = upload_typed(d, bias, OC, 1);
                float *gd = dp_test_upload(d, dout, N * OC), *scratch = dalloc(d, N * OC * 4),
                      *ref = dalloc(d, N * OC * 4);
                void *ref16 = dalloc(d, N * OC * 2), *o16 = dalloc(d, N * OC * 2),
                     *g16 = dalloc(d, N * OC * 2);
                dp_dtype xt = x16 ? DP_DTYPE_BF16 : DP_DTYPE_F32;
                dp_assert_ok(dp_linear_forward_out16(d, o16, scratch, N * OC, xd, xt,
                                                     dp_pref_bf16(wd), dp_pref_bf16(bd), N, C,
                                                     OC));
                if (x16)
                    dp_assert_ok(dp_linear_forward_bf16_inp(d, ref, xd, wd, bd, N, C, OC));
                else
                    dp_assert_ok(dp_linear_forward_bf16(d, ref, xd, wd, bd, N, C, OC));
                dp_assert_ok(dp_convert(d, ref16, DP_DTYPE_BF16, ref, DP_DTYPE_F32, N * OC));
                out[b] = download_bf16(d, o16, N * OC);
                double *own = download_bf16(d, ref16, N * OC);
                if (x16) /* cuBLASLt's kernel on a GPU */
                    dp_assert_allclose(out[b], own, N * OC, 1.01e-4, 1.01e-4 + 0.0079);
                else
                    assert_same_doubles("linear bf16 output, declined: the composition", out[b],
                                        own, N * OC);
                free(own);
                /* backward: dout rounded once vs inside each GEMM, on this device */
                float *gx[2], *gw[2], *gb[2];
                for (int once = 0; once < 2; once++) {
                    float *dxd = dalloc(d, N * C * 4), *dwd = dp_test_nn_filled(d, OC * C, 0.0f),
                          *dbd = dp_test_nn_filled(d, OC, 0.0f);
                    if (once)
                        dp_assert_ok(dp_linear_backward_dout16(d, dxd, dwd, dbd, gd, g16, xd, xt,
                                                               dp_pref_bf16(wd), N, C, OC));
                    else if (x16)
                        dp_assert_ok(
                            dp_linear_backward_bf16_inp(d, dxd, dwd, dbd, gd, xd, wd, N, C, OC));
                    else
                        dp_assert_ok(
                            dp_linear_backward_bf16(d, dxd, dwd, dbd, gd, xd, wd, N, C, OC));
                    gx[once] = dp_test_nn_download(d, dxd, N * C);
                    gw[once] = dp_test_nn_download(d, dwd, OC * C);
                    gb[once] = dp_test_nn_download(d, dbd, OC);
                    dp_device_free(d, dxd);
                    dp_device_free(d, dwd);
                    dp_device_free(d, dbd);
                }
                assert_same_bits("linear dinp, dout rounded once", gx[1], gx[0], N * C);
                assert_same_bits("linear dweight, dout rounded once", gw[1], gw[0], OC * C);
                assert_same_bits("linear dbias, dout rounded once", gb[1], gb[0], OC);
                /* dinp written as bfloat16 (dp_linear_backward_to16): the
                 * dinp above rounded; by cuBLASLt's kernel on a GPU (its own
                 * grouping of the sums: the output bound above) */
                {
                    float *dwd = dp_test_nn_filled(d, OC * C, 0.0f), *s32 = dalloc(d, N * C * 4);
                    void *dx16 = dalloc(d, N * C * 2);
                    dp_assert_ok(dp_linear_backward_to16(d, dx16, s32, N * C, dwd, NULL, gd, g16,
                                                         xd, xt, dp_pref_bf16(wd), N, C, OC));
                    double *got = download_bf16(d, dx16, N * C), *want = xmalloc(N * C * 8);
                    for (size_t i = 0; i < (size_t)N * C; i++)
                        want[i] = dp_bf16_to_float(dp_bf16_from_float(gx[1][i]));
                    if (b)
                        dp_assert_allclose(got, want, N * C, 1.01e-4, 1.01e-4 + 0.0079);
                    else
                        assert_same_doubles("linear dinp16 on the cpu", got, want, N * C);
                    float *w2 = dp_test_nn_download(d, dwd, OC * C);
                    assert_same_bits("linear dweight with a bf16 dinp", w2, gw[1], OC * C);
                    free(got), free(want), free(w2);
                    dp_device_free(d, dwd), dp_device_free(d, s32), dp_device_free(d, dx16);
                }
                dx[b] = gx[1];
                dw[b] = gw[1];
                db[b] = gb[1];
                free(gx[0]);
                free(gw[0]);
                free(gb[0]);
                void *bufs[] = {xd, wd, bd, gd, scratch, ref, ref16, o16, g16};
                for (size_t i = 0; i < 9; i++) dp_device_free(d, bufs[i]);
            }
            dp_assert_allclose(out[1], out[0], N * OC, 1.01e-4, 1.01e-4 + 0.0079);
            dp_assert_allclose(dx[1], dx[0], N * C, 1e-4, 1e-4);
            dp_assert_allclose(dw[1], dw[0], OC * C, 1e-4, 1e-4);
            assert_same_bits("linear dbias", db[1], db[0], OC);
            for (int b = 0; b < 2; b++) {
                free(out[b]);
                free(dx[b]);
                free(dw[b]);
                free(db[b]);
            }
            pair_close(&p);
        }
    free(x);
    free(w);
    free(bias);
    free(dout);
}

/*
 * The float32 linear forward with the bias in the GEMM's epilogue
 * (dp_backend_ops.gemm_bias_out, cuBLASLt on GPUs) against the composition
 * it replaces (bias broadcast, then the GEMM with beta = 1; the test
 * hook), on each device: another kernel's grouping of the same sums, so
 * within the GEMM's bound for the precision: FP32 K = 48 terms of O(1)
 * (atol 1e-5, rtol 1e-4, as linear_and_attention_layers_match_cpu);
 * TF32 and BF16 round the operands (2^-11 and 2^-8 relative), two
 * kernels that round alike are not required to, so the bound is that
 * rounding's: rtol 2e-3 (TF32) and 1.6e-2 (BF16), atol 1e-3 and 1e-2 on
 * outputs of O(1). On the CPU (no entry) both are the composition, bit
 * for bit. The log says which way each device went.
 */
Test(cuda_ops, linear_bias_epilogue_matches_composition, .timeout = 60)
{
    REQUIRE_GPU();
    enum { N = 24, C = 48, OC = 40 };
    float *x = rnd(31, N * C, -1, 1), *w = rnd(32, OC * C, -0.3f, 0.3f), *bias = rnd(33, OC, -1, 1);
    static const dp_matmul_precision precs[] = {DP_MATMUL_FP32, DP_MATMUL_TF32, DP_MATMUL_BF16};
    static const double atol[] = {1e-5, 1e-3, 1e-2}, rtol[] = {1e-4, 2e-3, 1.6e-2};
    FOR_TARGETS(g)
    {
        dp_device *d = open_target(g);
        for (int pi = 0; pi < 3; pi++) {
            dp_assert_ok(dp_device_set_matmul_precision(d, precs[pi]));
            int b16 = precs[pi] == DP_MATMUL_BF16; /* bfloat16 weights and input, as act16 */
            void *xd = upload_typed(d, x, N * C, b16), *wd = upload_typed(d, w, OC * C, b16),
                 *bd = upload_typed(d, bias, OC, b16);
            float *o[2];
            for (int hook = 0; hook < 2; hook++) {
                dp_device_set_fused_producers(d, !hook);
                float *od = dalloc(d, N * OC * 4);
                if (b16)
                    dp_assert_ok(dp_linear_forward_bf16_inp(d, od, xd, wd, bd, N, C, OC));
                else
                    dp_assert_ok(dp_linear_forward(d, od, xd, wd, bd, N, C, OC));
                o[hook] = dp_test_nn_download(d, od, N * OC);
                dp_device_free(d, od);
            }
            dp_device_set_fused_producers(d, 1);
            int same = memcmp(o[0], o[1], N * OC * sizeof(float)) == 0;
            cr_log_info("%s %s: the epilogue's output %s the composition's bits",
                        dp_device_name(d), dp_matmul_precision_name(precs[pi]),
                        same ? "has" : "differs from");
            if (as_cpu()) /* no epilogue entry: the composition both times */
                cr_assert(same, "%s: a CPU device's outputs differ", dp_device_name(d));
            else
                dp_assert_allclose(o[0], o[1], N * OC, atol[pi], rtol[pi]);
            free(o[0]);
            free(o[1]);
            void *bufs[] = {xd, wd, bd};
            for (int i = 0; i < 3; i++) dp_device_free(d, bufs[i]);
        }
        close_checked(d);
    }
    free(x);
    free(w);
    free(bias);
}

/* One run of the MLP's GELU producers (nn/nn_act16.h) on a device opened
 * with DP_CUDA_LT_GELU as lt_gelu says: the forward's pre and out, the
 * backward's dinp16, dweight and dbias, downloaded (as doubles; gradients
 * as floats in res[3], res[4]). Shapes: x (N,C) -> pre, out (N,4C) ->
 * c_proj (4C -> C). */
static void gelu_producers_run(int g, int lt_gelu, size_t N, size_t C, const float *x,
                               const float *w1, const float *b1, const float *w2,
                               const float *dout, double *res16[3], float *res[2])
{
    const size_t H = 4 * C;
    if (lt_gelu) setenv("DP_CUDA_LT_GELU", "1", 1); /* read when a device opens */
    else unsetenv("DP_CUDA_LT_GELU");
    dp_device *d = open_target(g);
    unsetenv("DP_CUDA_LT_GELU");
    dp_assert_ok(dp_device_set_matmul_precision(d, DP_MATMUL_BF16));
    void *xd = upload_typed(d, x, N * C, 1), *w1d = upload_typed(d, w1, H * C, 1),
         *b1d = upload_typed(d, b1, H, 1), *w2d = upload_typed(d, w2, C * H, 1);
    float *gd = dp_test_upload(d, dout, N * C), *scratch = dalloc(d, N * H * sizeof(float));
    dp_bf16 *pre = dalloc(d, N * H * 2), *out = dalloc(d, N * H * 2), *dx = dalloc(d, N * H * 2),
            *g16 = dalloc(d, N * C * 2);
    float *dw = dalloc(d, C * H * sizeof(float)), *db = dalloc(d, C * sizeof(float));
    dp_assert_ok(dp_memset(d, dw, 0, C * H * sizeof(float)));
    dp_assert_ok(dp_memset(d, db, 0, C * sizeof(float)));
    dp_assert_ok(dp_linear_gelu_forward_out16(d, out, pre, scratch, N * H, xd, DP_DTYPE_BF16,
                                              dp_pref_bf16(w1d), dp_pref_bf16(b1d), N, C, H));
    dp_assert_ok(dp_linear_backward_to16_dgelu(d, dx, scratch, N * H, dw, db, gd, g16, out,
                                               DP_DTYPE_BF16, dp_pref_bf16(w2d), pre, N, H, C));
    res16[0] = download_bf16(d, pre, N * H);
    res16[1] = download_bf16(d, out, N * H);
    res16[2] = download_bf16(d, dx, N * H);
    res[0] = dp_test_nn_download(d, dw, C * H);
    res[1] = dp_test_nn_download(d, db, C);
    void *bufs[] = {xd, w1d, b1d, w2d, gd, scratch, pre, out, dx, g16, dw, db};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) dp_device_free(d, bufs[i]);
    close_checked(d);
}

/* A c_proj weight gradient dw(C,H) against float64 sums of the products of
 * its operands, bf16(dout)(N,C) and out(N,H) (as stored): a bfloat16
 * product is exact in float32, so float32 sums of N of them are within
 * gamma_N = N 2^-24 of the sum of their magnitudes (Higham, Accuracy and
 * Stability of Numerical Algorithms, 3.1); (N + 2) 2^-23 leaves room for
 * tensor cores' truncating adds and the store. */
static void assert_dweight_of(const char *what, const float *dw, const double *out,
                              const float *dout, size_t N, size_t C, size_t H)
{
    for (size_t c = 0; c < C; c++)
        for (size_t h = 0; h < H; h++) {
            double sum = 0, mag = 0;
            for (size_t n = 0; n < N; n++) {
                double t = (double)dp_bf16_to_float(dp_bf16_from_float(dout[n * C + c])) *
                           out[n * H + h];
                sum += t;
                mag += fabs(t);
            }
            double err = fabs(dw[c * H + h] - sum), bound = (double)(N + 2) * 0x1p-23 * mag;
            cr_assert(err <= bound, "%s[%zu][%zu]: %.9g, float64 %.9g (error %.3g > bound %.3g)",
                      what, c, h, dw[c * H + h], sum, err, bound);
        }
}

/*
 * The GELU in cuBLASLt's epilogue (DP_CUDA_LT_GELU=1: GELU_AUX_BIAS
 * forward, DGELU backward; dp_backend_ops.gemm_gelu) against the
 * compositions it replaces (the bias epilogue, then kernels/gelu.h's GELU
 * and its backward), GPT-2's MLP shape at C = 48, in BF16 math:
 * - pre: another kernel's grouping of the same sums, both rounded to
 *   bfloat16: the bias epilogue's bound (atol 1e-2, rtol 1.6e-2) plus
 *   2^-7 for the two roundings: atol 1.01e-2, rtol 2.4e-2;
 * - out: the GELU of the float32 sums against that of the rounded pre;
 *   GELU is 1.13-Lipschitz, so pre's bound times 1.13 plus one more
 *   rounding: atol 1.2e-2, rtol 3.5e-2;
 * - dinp16 = sums x GELU'(pre): the composition rounds the sums first
 *   (2^-8), then the product (2^-8), against one rounding; with another
 *   grouping and |GELU'| <= 1.13: atol 1.2e-2, rtol 3.5e-2 on O(1) values;
 * - dweight = bf16(dout)^T out: the same GEMM either way, but on each
 *   run's own out, which differs where the epilogue ran; so each run's
 *   against float64 sums of its own out (assert_dweight_of's bound);
 * - dbias, from dout alone: the same bits.
 * Whether the epilogue ran is read from the bits: the composition's out is
 * GELU(pre) rounded for every element (checked on CPU stand-ins, where
 * there is no epilogue); the library's is not, for some, and on a GPU it
 * must have run.
 */
Test(cuda_ops, gelu_epilogue_matches_composition, .timeout = 60)
{
    REQUIRE_GPU();
    enum { N = 40, C = 48, H = 4 * C };
    float *x = rnd(41, N * C, -1, 1), *w1 = rnd(42, H * C, -0.3f, 0.3f), *b1 = rnd(43, H, -1, 1),
          *w2 = rnd(44, C * H, -0.15f, 0.15f), *dout = rnd(45, N * C, -1, 1);
    FOR_TARGETS(g)
    {
        double *a16[3], *e16[3];
        float *a[2], *e[2];
        gelu_producers_run(g, 1, N, C, x, w1, b1, w2, dout, a16, a);
        gelu_producers_run(g, 0, N, C, x, w1, b1, w2, dout, e16, e);
        size_t not_gelu_of_pre = 0;
        for (size_t i = 0; i < (size_t)N * H; i++) {
            dp_bf16 p = dp_bf16_from_float((float)a16[0][i]);
            not_gelu_of_pre += bf16v(dp_gelu_bf16(p)) != a16[1][i];
            cr_assert(bf16v(dp_gelu_bf16(dp_bf16_from_float((float)e16[0][i]))) == e16[1][i],
                      "target %d: the composition's out[%zu] is not GELU(pre)", g, i);
        }
        cr_log_info("target %d: the GELU epilogue %s (%zu of %d outputs not GELU(pre))", g,
                    not_gelu_of_pre ? "ran" : "declined or was not reached", not_gelu_of_pre,
                    N * H);
        /* on a GPU the epilogue must have run: a declined call would
         * pass every bound below as the composition */
        if (!as_cpu())
            cr_assert_gt(not_gelu_of_pre, 0, "target %d: cuBLASLt declined the GELU epilogue "
                         "(DP_CUDA_LT_GELU=1 then changes nothing)", g);
        if (as_cpu()) {
            cr_assert_eq(not_gelu_of_pre, 0, "a CPU device has no GELU epilogue");
            for (int k = 0; k < 3; k++)
                assert_same_doubles("CPU gelu producers", a16[k], e16[k], N * H);
        }
        dp_assert_allclose(a16[0], e16[0], N * H, 1.01e-2, 2.4e-2);
        dp_assert_allclose(a16[1], e16[1], N * H, 1.2e-2, 3.5e-2);
        dp_assert_allclose(a16[2], e16[2], N * H, 1.2e-2, 3.5e-2);
        assert_dweight_of("epilogue's c_proj dweight", a[0], a16[1], dout, N, C, H);
        assert_dweight_of("composition's c_proj dweight", e[0], e16[1], dout, N, C, H);
        assert_same_bits("c_proj dbias", a[1], e[1], C);
        for (int k = 0; k < 3; k++) {
            free(a16[k]);
            free(e16[k]);
        }
        for (int k = 0; k < 2; k++) {
            free(a[k]);
            free(e[k]);
        }
    }
    free(x);
    free(w1);
    free(b1);
    free(w2);
    free(dout);
}

// --- memory and copies -------------------------------------------------------------------------

Test(cuda_memory, accounting_limit_and_driver_figures)
{
    REQUIRE_GPU();
    FOR_TARGETS(g)
    {
        dp_device *d = open_target(g);
        void *a = dalloc(d, 1), *b = dalloc(d, 1000), *c = dalloc(d, 1 << 20);
        cr_assert_eq(((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) % 256, 0, "not 256-byte aligned");
        dp_memory_stats st;
        dp_device_memory(d, &st);
        cr_assert_eq(st.in_use, 1 + 1000 + (1 << 20));
        cr_assert_eq(st.n_allocs, 3);
        if (!as_cpu()) {
            cr_assert_gt(st.device_total, 0, "cudaMemGetInfo gave no total");
            cr_assert(st.device_free > 0 && st.device_free <= st.device_total,
                      "free %zu of %zu", st.device_free, st.device_total);
        }
        dp_device_free(d, a);
        dp_device_free(d, b);
        dp_device_free(d, c);
        dp_device_memory(d, &st);
        cr_assert_eq(st.in_use, 0);
        cr_assert_eq(st.peak, 1 + 1000 + (1 << 20));
        dp_device_set_limit(d, 1 << 20);
        void *x = NULL;
        dp_clear_error();
        cr_assert_eq(dp_device_alloc(d, 2 << 20, &x), DP_ERR_OUT_OF_MEMORY);
        cr_assert(strstr(dp_last_error(), dp_device_name(d)) && strstr(dp_last_error(), "limit"),
                  "%s", dp_last_error());
        cr_assert_null(x);
        /* The backend's own buffers (cuBLAS workspace, scratch, staging)
         * count against the limit: with the limit at reserved + 1 MiB,
         * 1 MiB fits and not a byte more. */
        if (!as_cpu()) cr_assert_gt(st.reserved, 2 * (4 << 20), "staging and workspace not counted");
        dp_device_set_limit(d, st.reserved + (1 << 20));
        x = dalloc(d, 1 << 20);
        void *y = NULL;
        cr_assert_eq(dp_device_alloc(d, 256, &y), DP_ERR_OUT_OF_MEMORY, "%s", dp_last_error());
        cr_assert_null(y);
        dp_device_free(d, x);
        close_checked(d);
    }
}

/* A real cudaMalloc failure is DP_ERR_OUT_OF_MEMORY naming the device, and
 * the device keeps working (the runtime's error is cleared, not sticky). */
Test(cuda_memory, out_of_gpu_memory_is_a_recoverable_error, .timeout = 60)
{
    REQUIRE_GPU();
    if (as_cpu()) cr_skip_test("GPU memory only");
    dp_device *d = open_target(0);
    dp_memory_stats st;
    dp_device_memory(d, &st);
    void *x = NULL;
    dp_clear_error();
    dp_status s = dp_device_alloc(d, st.device_total + ((size_t)1 << 30), &x);
    cr_assert_eq(s, DP_ERR_OUT_OF_MEMORY, "got %s: %s", dp_strerror(s), dp_last_error());
    cr_assert(strstr(dp_last_error(), dp_device_name(d)) && strstr(dp_last_error(), "cudaMalloc"),
              "%s", dp_last_error());
    dp_device_memory(d, &st);
    cr_assert_eq(st.in_use, 0, "a failed allocation was counted");
    float h[1000];
    for (int i = 0; i < 1000; i++) h[i] = (float)i;
    float *y = dp_test_upload(d, h, 1000);
    dp_assert_ok(dp_scale(d, y, 2.0f, 1000));
    float *back = dp_test_nn_download(d, y, 1000);
    for (int i = 0; i < 1000; i++) cr_assert_eq(back[i], 2.0f * (float)i);
    free(back);
    dp_device_free(d, y);
    close_checked(d);
}

/* Host <-> device copies of sizes around the 4 MiB staging chunks (two
 * chunks in flight), at unaligned device offsets; d2d and memset too. */
Test(cuda_memory, copies_round_trip_across_staging_chunks, .timeout = 60)
{
    REQUIRE_GPU();
    const size_t S = (size_t)4 << 20;
    const size_t sizes[] = {1, 3, 4096, S - 1, S, S + 1, 2 * S + 5, 9 * S / 2 + 3};
    size_t maxn = 9 * S / 2 + 3 + 8;
    unsigned char *src = xmalloc(maxn), *dst = xmalloc(maxn);
    dp_rng rng;
    dp_rng_seed(&rng, 9);
    for (size_t i = 0; i < maxn; i++) src[i] = (unsigned char)dp_rng_below(&rng, 256);
    FOR_TARGETS(g)
    {
        dp_device *d = open_target(g);
        unsigned char *a = dalloc(d, maxn), *b = dalloc(d, maxn);
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
            size_t n = sizes[k];
            memset(dst, 0, maxn);
            dp_assert_ok(dp_copy_h2d(d, a + 3, src + 1, n));
            dp_assert_ok(dp_copy_d2h(d, dst, a + 3, n));
            cr_assert(memcmp(dst, src + 1, n) == 0, "%s: h2d/d2h of %zu bytes", dp_device_name(d), n);
            dp_assert_ok(dp_copy_d2d(d, b + 5, a + 3, n));
            memset(dst, 0, maxn);
            dp_assert_ok(dp_copy_d2h(d, dst, b + 5, n));
            cr_assert(memcmp(dst, src + 1, n) == 0, "%s: d2d of %zu bytes", dp_device_name(d), n);
        }
        dp_assert_ok(dp_memset(d, a, 0x5A, maxn));
        dp_assert_ok(dp_copy_d2h(d, dst, a, maxn));
        for (size_t i = 0; i < maxn; i++) cr_assert_eq(dst[i], 0x5A, "memset byte %zu", i);
        dp_assert_ok(dp_device_synchronize(d));
        dp_device_free(d, a);
        dp_device_free(d, b);
        close_checked(d);
    }
    free(src);
    free(dst);
}

/*
 * Peer copies are ordered by construction: queue 40 doublings on the
 * source (a few ms of GPU work), copy to the destination at once without
 * any synchronize, then at once zero the source. The destination must
 * hold 2^40 exactly: not a partial product (the copy ran too early) and
 * not 0 (the source was overwritten before the copy read it). Pairs: two
 * logical devices on one GPU, and the first two GPUs both ways if present.
 */
static void check_peer_order(dp_device *src, dp_device *dst)
{
    size_t n = (size_t)16 << 20; /* 64 MiB */
    float *h = xmalloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = 1.0f;
    float *x = dp_test_upload(src, h, n), *y = dp_test_nn_filled(dst, n, -1.0f);
    dp_assert_ok(dp_device_synchronize(dst));
    for (int i = 0; i < 40; i++) dp_assert_ok(dp_scale(src, x, 2.0f, n));
    dp_assert_ok(dp_copy_peer(dst, y, src, x, n * sizeof(float)));
    dp_assert_ok(dp_scale(src, x, 0.0f, n));
    dp_assert_ok(dp_copy_d2h(dst, h, y, n * sizeof(float)));
    for (size_t i = 0; i < n; i++)
        if (h[i] != 0x1p40f)
            cr_assert_fail("%s -> %s: element %zu is %g, want 2^40", dp_device_name(src),
                           dp_device_name(dst), i, (double)h[i]);
    dp_assert_ok(dp_copy_d2h(src, h, x, n * sizeof(float)));
    cr_assert_eq(h[0], 0.0f);
    cr_assert_eq(h[n - 1], 0.0f);
    dp_device_free(src, x);
    dp_device_free(dst, y);
    free(h);
}

Test(cuda_memory, peer_copies_are_ordered_with_both_devices, .timeout = 60)
{
    REQUIRE_GPU();
    dp_device *a = open_target(0), *b = open_target(0); /* two logical devices, one GPU */
    check_peer_order(a, b);
    check_peer_order(b, a);
    if (n_targets() >= 2) {
        dp_device *c = open_target(1);
        check_peer_order(a, c);
        check_peer_order(c, a);
        close_checked(c);
    }
    close_checked(a);
    close_checked(b);
}

/*
 * A communication queue of a device (backend.h) sums beside the device's
 * own stream, ordered after the device's queued work by dp_device_order
 * and after a peer's by the peer copy: queue 40 doublings on the device
 * (x) and on the peer (p), then at once on the queue: order after the
 * device, copy p in, add x. Every element must be 2^41: not a sum taken
 * before either source was done. The queue is synchronised before the
 * sources are written again (the peer's later work does not wait for
 * the copy: that is the queue's point).
 */
static void check_comm_queue(dp_device *dev, dp_device *peer)
{
    dp_device *q = NULL;
    dp_assert_ok(dp_device_open_comm(dev, &q));
    cr_assert_not_null(q, "%s: no communication queue with DP_CUDA_OVERLAP=1",
                       dp_device_name(dev));
    cr_assert(strstr(dp_device_name(q), "comm"), "queue named %s", dp_device_name(q));
    size_t n = (size_t)16 << 20; /* 64 MiB */
    float *h = xmalloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = 1.0f;
    float *x = dp_test_upload(dev, h, n), *p = dp_test_upload(peer, h, n);
    float *acc = dp_test_nn_filled(dev, n, -1.0f);
    dp_assert_ok(dp_device_synchronize(dev));
    dp_assert_ok(dp_device_synchronize(peer));
    for (int i = 0; i < 40; i++) {
        dp_assert_ok(dp_scale(dev, x, 2.0f, n));
        dp_assert_ok(dp_scale(peer, p, 2.0f, n));
    }
    dp_assert_ok(dp_device_order(dev, q));
    dp_assert_ok(dp_copy_peer(q, acc, peer, p, n * sizeof(float)));
    dp_assert_ok(dp_accumulate(q, acc, x, n));
    dp_assert_ok(dp_device_synchronize(q));
    dp_assert_ok(dp_scale(peer, p, 0.0f, n));
    dp_assert_ok(dp_copy_d2h(dev, h, acc, n * sizeof(float)));
    for (size_t i = 0; i < n; i++)
        if (h[i] != 0x1p41f)
            cr_assert_fail("%s summing %s: element %zu is %g, want 2^41", dp_device_name(q),
                           dp_device_name(peer), i, (double)h[i]);
    dp_device_close_comm(q);
    dp_device_free(dev, x);
    dp_device_free(dev, acc);
    dp_device_free(peer, p);
    free(h);
}

Test(cuda_memory, comm_queue_is_opt_in_and_ordered, .timeout = 60)
{
    REQUIRE_GPU();
    const char *was = getenv("DP_CUDA_OVERLAP");
    char *saved = was ? strdup(was) : NULL;
    dp_device *a = open_target(0), *b = open_target(0); /* two logical devices, one GPU */
    dp_device *q = a;
    unsetenv("DP_CUDA_OVERLAP");
    dp_assert_ok(dp_device_open_comm(a, &q));
    cr_assert_null(q, "a communication queue without DP_CUDA_OVERLAP=1");
    setenv("DP_CUDA_OVERLAP", "1", 1);
    if (as_cpu()) { /* CPU devices need none: their entries complete as called */
        q = a;
        dp_assert_ok(dp_device_open_comm(a, &q));
        cr_assert_null(q);
        dp_assert_ok(dp_device_order(a, b));
    } else {
        check_comm_queue(a, b);
        check_comm_queue(b, a);
        if (n_targets() >= 2) {
            dp_device *c = open_target(1);
            check_comm_queue(a, c);
            check_comm_queue(c, a);
            close_checked(c);
        }
    }
    if (saved) setenv("DP_CUDA_OVERLAP", saved, 1);
    else unsetenv("DP_CUDA_OVERLAP");
    free(saved);
    close_checked(a);
    close_checked(b);
}

/* Two logical devices on one GPU, each driven by its own thread at the
 * same time (own stream, handle, staging buffers): integer-valued data so
 * every result is exact. */
typedef struct thread_job {
    dp_device *dev;
    int id;
    int ok;
    char msg[512];
} thread_job;

static void *thread_main(void *arg)
{
    thread_job *j = arg;
    enum { N = 1 << 20, ITERS = 20 };
    float *h = malloc(N * sizeof *h), *back = malloc(N * sizeof *back);
    float *v = NULL, *acc = NULL;
    j->ok = 0;
    if (!h || !back) {
        snprintf(j->msg, sizeof j->msg, "host allocation failed");
        goto out;
    }
    for (int i = 0; i < N; i++) h[i] = (float)((i + j->id) % 17);
    if (dp_device_bind_thread(j->dev) || dp_device_alloc(j->dev, N * 4, (void **)&v) ||
        dp_device_alloc(j->dev, N * 4, (void **)&acc) || dp_memset(j->dev, acc, 0, N * 4)) {
        snprintf(j->msg, sizeof j->msg, "setup: %s", dp_last_error());
        goto out;
    }
    for (int it = 0; it < ITERS; it++) {
        double ss = 0.0;
        if (dp_copy_h2d(j->dev, v, h, N * 4) || dp_scale(j->dev, v, 2.0f, N) ||
            dp_accumulate(j->dev, acc, v, N) || dp_sum_squares(j->dev, &ss, acc, N)) {
            snprintf(j->msg, sizeof j->msg, "iteration %d: %s", it, dp_last_error());
            goto out;
        }
        double want = 0.0;
        for (int i = 0; i < N; i++) want += (2.0 * (it + 1) * h[i]) * (2.0 * (it + 1) * h[i]);
        if (ss != want) {
            snprintf(j->msg, sizeof j->msg, "iteration %d: sum of squares %.17g, want %.17g", it, ss, want);
            goto out;
        }
    }
    if (dp_copy_d2h(j->dev, back, acc, N * 4)) {
        snprintf(j->msg, sizeof j->msg, "d2h: %s", dp_last_error());
        goto out;
    }
    for (int i = 0; i < N; i++)
        if (back[i] != 2.0f * ITERS * h[i]) {
            snprintf(j->msg, sizeof j->msg, "element %d is %g, want %g", i, back[i], 2.0 * ITERS * h[i]);
            goto out;
        }
    j->ok = 1;
out:
    dp_device_free(j->dev, v);
    dp_device_free(j->dev, acc);
    free(h);
    free(back);
    return NULL;
}

Test(cuda_memory, two_logical_devices_on_one_gpu_from_two_threads, .timeout = 60)
{
    REQUIRE_GPU();
    thread_job jobs[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].dev = open_target(0);
        jobs[i].id = i;
        cr_assert_eq(pthread_create(&th[i], NULL, thread_main, &jobs[i]), 0);
    }
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++) {
        cr_assert(jobs[i].ok, "thread %d: %s", i, jobs[i].msg);
        close_checked(jobs[i].dev);
    }
}

// --- the application's current device ---------------------------------------------------

/* dp must leave the calling thread's current CUDA device as it found it:
 * an application doing its own CUDA work on that thread would otherwise
 * end up on another GPU. Needs 2 GPUs (with one, every device is 0). The
 * runtime's cudaGetDevice/cudaSetDevice are looked up in the libcudart dp
 * already loaded, so the test needs no CUDA headers. */
Test(cuda_memory, current_device_is_restored, .timeout = 60)
{
    if (as_cpu()) cr_skip_test("the current CUDA device exists only on GPUs");
    if (dp_cuda_device_count() < 2) cr_skip_test("needs 2 CUDA devices");
    int (*get_dev)(int *) = (int (*)(int *))dlsym(RTLD_DEFAULT, "cudaGetDevice");
    int (*set_dev)(int) = (int (*)(int))dlsym(RTLD_DEFAULT, "cudaSetDevice");
    cr_assert(get_dev && set_dev, "libcudart is not loaded with dp");
    cr_assert_eq(set_dev(1), 0);
    dp_device_spec s0 = {DP_DEVICE_CUDA, 0}, s1 = {DP_DEVICE_CUDA, 0};
    dp_device *d = NULL, *e = NULL;
    int cur = -1;
#define STILL_ONE(what)                                                              \
    do {                                                                             \
        cr_assert_eq(get_dev(&cur), 0);                                              \
        cr_assert_eq(cur, 1, "current device %d after %s, want 1 (the caller's)", cur, \
                     what);                                                          \
    } while (0)
    dp_assert_ok(dp_device_open(&s0, &d));
    STILL_ONE("dp_device_open");
    dp_assert_ok(dp_device_open(&s1, &e));
    float h[64] = {0}, *x = NULL, *y = NULL;
    dp_assert_ok(dp_device_alloc(d, sizeof h, (void **)&x));
    dp_assert_ok(dp_device_alloc(e, sizeof h, (void **)&y));
    STILL_ONE("dp_device_alloc");
    dp_assert_ok(dp_copy_h2d(d, x, h, sizeof h));
    dp_assert_ok(dp_copy_peer(e, y, d, x, sizeof h));
    dp_assert_ok(dp_scale(d, x, 2.0f, 64));
    double ss = 0.0;
    dp_assert_ok(dp_sum_squares(d, &ss, x, 64));
    STILL_ONE("copies and kernels");
    dp_memory_stats st;
    dp_device_memory(d, &st);
    dp_assert_ok(dp_device_set_allow_tf32(d, 1));
    STILL_ONE("dp_device_memory and dp_device_set_allow_tf32");
    dp_device_free(d, x);
    dp_device_free(e, y);
    dp_device_close(d);
    dp_device_close(e);
    STILL_ONE("dp_device_free and dp_device_close");
#undef STILL_ONE
}

/* Events on each target: record around queued work, another logical device
 * waits for it, the host waits, and the elapsed time is a finite,
 * non-negative number (its size decides nothing). */
Test(cuda_memory, events_record_wait_and_elapsed, .timeout = 60)
{
    REQUIRE_GPU();
    FOR_TARGETS(g)
    {
        dp_device *d = open_target(g), *o = open_target(g);
        const size_t n = (size_t)1 << 20;
        float *h = rnd(5, n, -1, 1), *x = dp_test_upload(d, h, n);
        dp_event *e0 = NULL, *e1 = NULL;
        dp_assert_ok(dp_event_create(d, &e0));
        dp_assert_ok(dp_event_create(d, &e1));
        dp_assert_ok(dp_event_record(e0));
        for (int i = 0; i < 20; i++) dp_assert_ok(dp_scale(d, x, 1.0f, n));
        dp_assert_ok(dp_event_record(e1));
        dp_assert_ok(dp_event_wait(o, e1));
        dp_assert_ok(dp_device_synchronize(o));
        dp_assert_ok(dp_event_synchronize(e1));
        double sec = -1.0;
        dp_assert_ok(dp_event_elapsed(e0, e1, &sec));
        cr_assert(isfinite(sec) && sec >= 0.0, "elapsed %g s", sec);
        float *back = dp_test_nn_download(d, x, n);
        assert_same_bits("x scaled by 1", back, h, n);
        dp_event_destroy(e0);
        dp_event_destroy(e1);
        free(back);
        free(h);
        dp_device_free(d, x);
        close_checked(d);
        close_checked(o);
    }
}

// --- graphs ------------------------------------------------------------------------------------

/* A recording (DP_CUDA_GRAPHS=1, read as the device opens) runs nothing
 * until launched, refuses what it could not replay (the copy from the
 * host) without breaking the capture, and each launch replays its
 * kernels: x * 2 * 3, twice. Without the variable the device records
 * nothing and says how to turn it on; a value other than 0 or 1 fails
 * the device's opening. */
Test(cuda_graph, a_recording_runs_when_launched_and_each_launch_replays)
{
    REQUIRE_GPU();
    if (as_cpu()) cr_skip_test("graphs are recorded on GPUs only");
    cr_assert_eq(unsetenv("DP_CUDA_GRAPHS"), 0);
    dp_device *off = open_target(0);
    cr_assert_eq(dp_device_graph_begin(off), DP_ERR_UNSUPPORTED);
    cr_assert(strstr(dp_last_error(), "DP_CUDA_GRAPHS=1"), "%s", dp_last_error());
    dp_device_close(off);
    cr_assert_eq(setenv("DP_CUDA_GRAPHS", "yes", 1), 0);
    dp_device_spec spec = {DP_DEVICE_CUDA, 0};
    dp_device *bad = NULL;
    cr_assert_eq(dp_device_open(&spec, &bad), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "DP_CUDA_GRAPHS=yes is not 0 or 1"), "%s",
              dp_last_error());
    cr_assert_null(bad);
    cr_assert_eq(setenv("DP_CUDA_GRAPHS", "1", 1), 0);
    dp_device *dev = open_target(0);
    cr_assert_eq(unsetenv("DP_CUDA_GRAPHS"), 0);
    enum { N = 1000 };
    float host[N], back[N];
    for (int i = 0; i < N; i++) host[i] = (float)(i - 500) / 8.0f;
    float *x = NULL;
    dp_assert_ok(dp_device_alloc(dev, sizeof host, (void **)&x));
    dp_assert_ok(dp_copy_h2d(dev, x, host, sizeof host));
    dp_assert_ok(dp_device_graph_begin(dev));
    cr_assert(dp_device_graph_recording(dev));
    dp_assert_ok(dp_scale(dev, x, 2.0f, N));
    cr_assert_eq(dp_copy_h2d(dev, x, host, sizeof host), DP_ERR_UNSUPPORTED);
    dp_assert_ok(dp_scale(dev, x, 3.0f, N));
    dp_device_graph *g = NULL;
    dp_assert_ok(dp_device_graph_end(dev, &g));
    cr_assert_not_null(g);
    dp_assert_ok(dp_copy_d2h(dev, back, x, sizeof back));
    cr_assert(memcmp(back, host, sizeof host) == 0, "the recorded kernels ran while recorded");
    for (int launch = 1; launch <= 2; launch++) {
        dp_assert_ok(dp_device_graph_launch(dev, g));
        dp_assert_ok(dp_copy_d2h(dev, back, x, sizeof back));
        float f = launch == 1 ? 6.0f : 36.0f;
        for (int i = 0; i < N; i++)
            cr_assert(back[i] == host[i] * f, "launch %d: x[%d] = %g, not %g", launch, i,
                      back[i], host[i] * f);
    }
    dp_device_graph_destroy(dev, g);
    dp_device_free(dev, x);
    dp_device_close(dev);
}
