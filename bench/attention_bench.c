/*
 * bench/attention_bench.c - the fused attention against the chunked one
 * on one device: forward + backward of the causal attention layer
 * (dp_attention_*_fused vs dp_attention_*_chunked) on the same random
 * inputs, a few warm-up steps, then --reps timed ones (each ends in a
 * device synchronize), and prints the median and fastest times of each
 * and their ratio. Both read float32 qkv and dout; --bf16 keeps q, k, v as
 * bfloat16 (the fused calls read qkv rounded, in place; the chunked calls
 * permute it into a bfloat16 qkvr and run in BF16 matmul precision with
 * their att16 scratch, the GPT's --precision bf16; the fused backward then
 * reads a bfloat16 out).
 *
 *   attention_bench [--device cpu:0|cuda:0] [--shape B,T,C,NH] [--chunk N]
 *                   [--reps R] [--warmup W] [--bf16]
 */
#define _GNU_SOURCE /* getopt_long, clock_gettime */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dp/dp.h"
#include "dp_cli.h"

#define CHECK(expr)                                                                          \
    do {                                                                                     \
        dp_status s_ = (expr);                                                               \
        if (s_ != DP_OK) {                                                                   \
            fprintf(stderr, "attention_bench: %s: %s\n", dp_strerror(s_), dp_last_error()); \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

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

static void *alloc(dp_device *dev, size_t bytes)
{
    void *p = NULL;
    CHECK(dp_device_alloc(dev, bytes, &p));
    return p;
}

/* The layer's buffers for both variants (scratch of the chunked calls too). */
typedef struct bufs {
    size_t B, T, C, NH, chunk;
    int bf16;
    float *qkv, *dout, *out, *lse, *delta, *att, *datt, *scratch, *dqkv, *dqkvr;
    void *qkvr, *qkv16, *out16, *att16; /* qkv16: qkv rounded, the fused calls' q, k, v */
} bufs;

static void step_fused(dp_device *dev, bufs *b)
{
    dp_dtype t = b->bf16 ? DP_DTYPE_BF16 : DP_DTYPE_F32;
    /* q, k, v read in place: qkv itself, or its rounding (c_attn's GEMM
     * writes that directly in the GPT, so it is not timed) */
    const void *q = b->bf16 ? b->qkv16 : (const void *)b->qkv;
    CHECK(dp_attention_forward_fused(dev, b->out, b->lse, q, t, b->B, b->T, b->C, b->NH));
    if (b->bf16)
        CHECK(dp_convert(dev, b->out16, DP_DTYPE_BF16, b->out, DP_DTYPE_F32, b->B * b->T * b->C));
    CHECK(dp_attention_backward_fused(dev, b->dqkv, b->delta, b->dout, q, t, b->lse,
                                      b->bf16 ? b->out16 : (void *)b->out, t, b->B, b->T, b->C,
                                      b->NH));
}

static void step_chunked(dp_device *dev, bufs *b)
{
    dp_dtype t = b->bf16 ? DP_DTYPE_BF16 : DP_DTYPE_F32;
    CHECK(dp_attention_forward_chunked(dev, b->out, b->qkvr, t, b->att, b->att16, b->scratch,
                                       b->qkv, b->B, b->T, b->C, b->NH, b->chunk));
    CHECK(dp_attention_backward_chunked(dev, b->dqkv, b->dqkvr, b->att, b->att16, b->datt,
                                        b->scratch, b->dout, b->qkvr, t, b->B, b->T, b->C, b->NH,
                                        b->chunk));
}

/* Median and fastest of reps timed steps after warmup untimed ones. */
static void time_steps(dp_device *dev, bufs *b, void (*step)(dp_device *, bufs *), int warmup,
                       int reps, double *median, double *best)
{
    for (int i = 0; i < warmup; i++) step(dev, b);
    CHECK(dp_device_synchronize(dev));
    double *t = malloc((size_t)reps * sizeof *t);
    if (!t) exit(1);
    for (int i = 0; i < reps; i++) {
        double t0 = now_s();
        step(dev, b);
        CHECK(dp_device_synchronize(dev));
        t[i] = now_s() - t0;
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    *median = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
    *best = t[0];
    free(t);
}

/* --shape B,T,C,NH: four whole numbers, each in [1, 2^20], C a multiple
 * of NH, and B*T*3C elements countable. 0, or 1 after a message. */
static int parse_shape(const char *v, bufs *b)
{
    long x[4];
    const char *at = v;
    for (int i = 0; i < 4; i++) {
        size_t len = strcspn(at, ",");
        char field[32];
        if ((i < 3) != (at[len] == ',') || len >= sizeof field)
            return cli_fail("--shape wants B,T,C,NH (four numbers), got \"%s\"", v);
        memcpy(field, at, len);
        field[len] = '\0';
        if (cli_parse_long("--shape", field, 1, 1L << 20, &x[i])) return 1;
        at += len + 1;
    }
    b->B = (size_t)x[0], b->T = (size_t)x[1], b->C = (size_t)x[2], b->NH = (size_t)x[3];
    if (b->C % b->NH) return cli_fail("--shape: NH %zu does not divide C %zu", b->NH, b->C);
    if ((double)b->B * (double)b->T * 3.0 * (double)b->C > 4e9)
        return cli_fail("--shape %s: B*T*3C passes 4e9 elements; give a smaller shape", v);
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: attention_bench [--device cpu:0|cuda:0] [--shape B,T,C,NH] [--chunk N]\n"
               "                       [--reps R] [--warmup W] [--bf16]\n"
               "  defaults: cpu:0, 4,128,256,4, chunk 64, 10 reps, 2 warm-up, float32\n");
}

int main(int argc, char **argv)
{
    const char *device = "cpu:0";
    bufs b = {.B = 4, .T = 128, .C = 256, .NH = 4, .chunk = 64};
    int reps = 10, warmup = 2;
    static const struct option opts[] = {
        {"device", required_argument, NULL, 'd'}, {"shape", required_argument, NULL, 's'},
        {"chunk", required_argument, NULL, 'c'},  {"reps", required_argument, NULL, 'r'},
        {"warmup", required_argument, NULL, 'w'}, {"bf16", no_argument, NULL, 'b'},
        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0},
    };
    cli_set_program("attention_bench");
    int c;
    long v;
    opterr = 0; /* cli_bad_option names a bad option, by this program's name */
    while ((c = getopt_long(argc, argv, "d:s:c:r:w:bh", opts, NULL)) != -1) {
        switch (c) {
        case 'd': device = optarg; break;
        case 's':
            if (parse_shape(optarg, &b)) return 2;
            break;
        case 'c':
            if (cli_parse_long("--chunk", optarg, 1, 1L << 20, &v)) return 2;
            b.chunk = (size_t)v;
            break;
        case 'r':
            if (cli_parse_int("--reps", optarg, 1, 100000, &reps)) return 2;
            break;
        case 'w':
            if (cli_parse_int("--warmup", optarg, 0, 100000, &warmup)) return 2;
            break;
        case 'b': b.bf16 = 1; break;
        case 'h': usage(stdout); return cli_check_stream(stdout, "the help to standard output");
        default: return cli_bad_option(argv, "d:s:c:r:w:bh");
        }
    }
    if (optind < argc) {
        usage(stderr);
        return 2;
    }
    dp_device_spec spec;
    size_t nspec = 0;
    /* a bad device list is the command line's (status 2), as the other options */
    if (dp_device_list_parse(device, &spec, 1, &nspec) != DP_OK) return cli_dp_fail("--device") + 1;
    dp_device *dev = NULL;
    CHECK(dp_device_open(&spec, &dev));
    if (b.bf16) CHECK(dp_device_set_matmul_precision(dev, DP_MATMUL_BF16));

    size_t nq = b.B * b.T * 3 * b.C, no = b.B * b.T * b.C, nr = b.B * b.NH * b.T;
    size_t rows = b.chunk < b.T ? b.chunk : b.T, na = b.B * b.NH * rows * b.T;
    float *host = malloc(nq * sizeof *host);
    if (!host) return cli_fail("out of host memory for %zu floats of q, k and v", nq);
    dp_rng rng;
    dp_rng_seed(&rng, 1);
    dp_rng_fill_normal(&rng, host, nq, 0.0f, 1.0f);
    b.qkv = alloc(dev, nq * 4);
    CHECK(dp_copy_h2d(dev, b.qkv, host, nq * 4));
    dp_rng_fill_normal(&rng, host, no, 0.0f, 1.0f);
    b.dout = alloc(dev, no * 4);
    CHECK(dp_copy_h2d(dev, b.dout, host, no * 4));
    b.out = alloc(dev, no * 4);
    b.qkvr = alloc(dev, nq * (b.bf16 ? 2 : 4));
    b.qkv16 = b.bf16 ? alloc(dev, nq * 2) : NULL;
    if (b.bf16) CHECK(dp_convert(dev, b.qkv16, DP_DTYPE_BF16, b.qkv, DP_DTYPE_F32, nq));
    b.out16 = b.bf16 ? alloc(dev, no * 2) : NULL;
    b.att16 = b.bf16 ? alloc(dev, na * 2) : NULL;
    b.lse = alloc(dev, nr * 4);
    b.delta = alloc(dev, nr * 4);
    b.att = alloc(dev, na * 4);
    b.datt = alloc(dev, na * 4);
    b.scratch = alloc(dev, no * 4);
    b.dqkv = alloc(dev, nq * 4);
    b.dqkvr = alloc(dev, nq * 4);

    double fm, fb, cm, cb;
    time_steps(dev, &b, step_fused, warmup, reps, &fm, &fb);
    time_steps(dev, &b, step_chunked, warmup, reps, &cm, &cb);
    printf("attention_bench: B=%zu T=%zu C=%zu NH=%zu (hs %zu) on %s, %s, forward + backward, "
           "%d warm-up, %d reps\n",
           b.B, b.T, b.C, b.NH, b.C / b.NH, dp_device_name(dev),
           b.bf16 ? "bf16 qkvr (chunked: BF16 math, att16)" : "float32", warmup, reps);
    printf("  fused            median %9.3f ms  min %9.3f ms\n", 1e3 * fm, 1e3 * fb);
    printf("  chunked (%4zu)   median %9.3f ms  min %9.3f ms\n", b.chunk, 1e3 * cm, 1e3 * cb);
    printf("  fused / chunked  %.2f (median)\n", fm / cm);

    void *all[] = {b.qkv,   b.dout, b.out,  b.qkvr,    b.qkv16, b.out16, b.att16,
                   b.lse,   b.delta, b.att, b.datt,    b.scratch, b.dqkv, b.dqkvr};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]) dp_device_free(dev, all[i]);
    free(host);
    dp_device_close(dev);
    return cli_check_stream(stdout, "the figures to standard output");
}
