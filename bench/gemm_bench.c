/*
 * bench/gemm_bench.c - GEMM throughput through dp_gemm on one cpu device.
 *
 * Times C = A B for square size x size float32 matrices (column-major, no
 * transposes, beta = 0): a few warm-up calls, then --reps timed calls, and
 * prints the median and best GFLOP/s (2 size^3 flops per call). The CPU
 * backend runs OpenBLAS single-threaded, so this is one core's figure: the
 * ceiling for one virtual CPU device in the DataParallel engine. With
 * --precision bf16 the device's matmul precision is DP_MATMUL_BF16 (both
 * operands rounded to bfloat16 each call, oneDNN's bf16 kernels), the
 * figure a bf16 run's GEMMs reach.
 *
 *   gemm_bench [--size N] [--reps R] [--warmup W] [--precision fp32|bf16]
 */
#define _GNU_SOURCE /* getopt_long, clock_gettime */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dp/dp.h"
#include "dp_cli.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: gemm_bench [--size N] [--reps R] [--warmup W] [--precision fp32|bf16]\n"
               "  --size N    m = n = k = N (default 1024)\n"
               "  --reps R    timed repetitions (default 10)\n"
               "  --warmup W  untimed calls first (default 2)\n"
               "  --precision fp32|bf16  the device's matmul precision (default fp32)\n");
}

#define CHECK(expr)                                                                          \
    do {                                                                                     \
        dp_status s_ = (expr);                                                               \
        if (s_ != DP_OK) {                                                                   \
            fprintf(stderr, "gemm_bench: %s: %s\n", dp_strerror(s_), dp_last_error());       \
            return 1;                                                                        \
        }                                                                                    \
    } while (0)

int main(int argc, char **argv)
{
    int size = 1024, reps = 10, warmup = 2;
    dp_matmul_precision prec = DP_MATMUL_FP32;
    static const struct option opts[] = {
        {"size", required_argument, NULL, 's'},
        {"reps", required_argument, NULL, 'r'},
        {"warmup", required_argument, NULL, 'w'},
        {"precision", required_argument, NULL, 'p'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    cli_set_program("gemm_bench");
    int c;
    opterr = 0; /* cli_bad_option names a bad option, by this program's name */
    while ((c = getopt_long(argc, argv, "s:r:w:p:h", opts, NULL)) != -1) {
        switch (c) {
        case 'p':
            if (strcmp(optarg, "fp32") && strcmp(optarg, "bf16")) {
                fprintf(stderr, "gemm_bench: --precision: \"%s\" is not fp32 or bf16\n", optarg);
                return 2;
            }
            prec = optarg[0] == 'b' ? DP_MATMUL_BF16 : DP_MATMUL_FP32;
            break;
        /* --size at most 16384 (three 1 GiB matrices); --warmup may be 0 */
        case 's':
            if (cli_parse_int("--size", optarg, 1, 16384, &size)) return 2;
            break;
        case 'r':
            if (cli_parse_int("--reps", optarg, 1, 100000, &reps)) return 2;
            break;
        case 'w':
            if (cli_parse_int("--warmup", optarg, 0, 100000, &warmup)) return 2;
            break;
        case 'h': usage(stdout); return cli_check_stream(stdout, "the help to standard output");
        default: return cli_bad_option(argv, "s:r:w:p:h");
        }
    }
    if (optind < argc) {
        fprintf(stderr, "gemm_bench: unexpected argument \"%s\"\n", argv[optind]);
        usage(stderr);
        return 2;
    }

    dp_device_spec spec = {DP_DEVICE_CPU, 0};
    dp_device *dev = NULL;
    CHECK(dp_device_open(&spec, &dev));
    CHECK(dp_device_set_matmul_precision(dev, prec));
    size_t count = (size_t)size * (size_t)size;
    float *host = malloc(count * sizeof *host);
    if (!host) {
        fprintf(stderr, "gemm_bench: out of host memory for %zu floats\n", count);
        return 1;
    }
    dp_rng rng;
    dp_rng_seed(&rng, 1);
    void *A = NULL, *B = NULL, *C = NULL;
    CHECK(dp_device_alloc(dev, count * sizeof(float), &A));
    CHECK(dp_device_alloc(dev, count * sizeof(float), &B));
    CHECK(dp_device_alloc(dev, count * sizeof(float), &C));
    dp_rng_fill_uniform(&rng, host, count, -1.0f, 1.0f);
    CHECK(dp_copy_h2d(dev, A, host, count * sizeof(float)));
    dp_rng_fill_uniform(&rng, host, count, -1.0f, 1.0f);
    CHECK(dp_copy_h2d(dev, B, host, count * sizeof(float)));

    for (int i = 0; i < warmup; i++)
        CHECK(dp_gemm(dev, DP_OP_N, DP_OP_N, size, size, size, 1.0f, A, size, B, size, 0.0f, C,
                      size));
    CHECK(dp_device_synchronize(dev));

    double *t = malloc((size_t)reps * sizeof *t);
    if (!t) return 1;
    for (int i = 0; i < reps; i++) {
        double t0 = now_s();
        CHECK(dp_gemm(dev, DP_OP_N, DP_OP_N, size, size, size, 1.0f, A, size, B, size, 0.0f, C,
                      size));
        CHECK(dp_device_synchronize(dev));
        t[i] = now_s() - t0;
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    double median = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
    double flops = 2.0 * (double)size * (double)size * (double)size;
    int native = 1;
    CHECK(dp_device_matmul_native(dev, prec, &native));
    printf("gemm_bench: GEMM %dx%dx%d on %s, %s math%s (column-major NN, beta 0), %d warm-up, "
           "%d reps\n", size, size, size, dp_device_name(dev), dp_matmul_precision_name(prec),
           native ? "" : " emulated on float32 kernels (no bf16 matmul in oneDNN on this CPU)",
           warmup, reps);
    printf("  median %.3f ms  %.2f GFLOP/s\n", 1e3 * median, flops / median * 1e-9);
    printf("  min    %.3f ms  %.2f GFLOP/s (fastest rep)\n", 1e3 * t[0], flops / t[0] * 1e-9);

    free(t);
    free(host);
    dp_device_free(dev, A);
    dp_device_free(dev, B);
    dp_device_free(dev, C);
    dp_device_close(dev);
    return cli_check_stream(stdout, "the figures to standard output");
}
