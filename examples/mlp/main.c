/*
 * examples/mlp/main.c - embedding dp in a C application.
 *
 * Trains a 2-layer MLP classifier (ReLU, dropout 0.1) on generated data
 * (Gaussian blobs, one per class) with the balanced DataParallel engine on
 * two CPU devices and prints the loss falling, then predicts a held-out
 * batch (dp_engine_predict: each device keeps its rows' logits) and prints
 * the accuracy; --bf16 trains in mixed precision (bf16 replicas and GEMMs,
 * float32 masters). Exits non-zero unless the loss fell below half its
 * first value and the accuracy reached 90%. Usage: mlp_classifier
 * [--devices LIST] [--steps N] [--bf16]
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include <dp/dp.h>

#include "dp_cli.h"

#include "mlp.h"

enum { D = 16, H = 64, K = 8, ROWS = 256, TEST_ROWS = 512 };

/* Each row belongs to a random class: its centre plus unit noise. */
static void make_batch(dp_rng *rng, const float *centres, int rows, float *x, int32_t *y)
{
    for (int i = 0; i < rows; i++) {
        int k = (int)dp_rng_below(rng, K);
        y[i] = k;
        for (int d = 0; d < D; d++) x[i * D + d] = centres[k * D + d] + (float)dp_rng_normal(rng);
    }
}

static int die(const char *what)
{
    fprintf(stderr, "mlp_classifier: %s: %s\n", what, dp_last_error());
    return 1;
}

/* The share of rows whose largest logit is their class. */
static double accuracy(const float *logits, const int32_t *y, int rows)
{
    int right = 0;
    for (int i = 0; i < rows; i++) {
        int best = 0;
        for (int k = 1; k < K; k++)
            if (logits[i * K + k] > logits[i * K + best]) best = k;
        right += best == y[i];
    }
    return (double)right / rows;
}

/* Predictions of a held-out batch: where they are, then their accuracy. */
static int evaluate_accuracy(dp_engine *engine, dp_rng *rng, const float *centres, double *acc)
{
    static float x[TEST_ROWS * D], logits[TEST_ROWS * K];
    static int32_t y[TEST_ROWS];
    make_batch(rng, centres, TEST_ROWS, x, y);
    dp_batch batch = {TEST_ROWS, x, NULL}; /* no targets: predictions need none */
    if (dp_engine_predict(engine, &batch) != DP_OK) return die("predict");
    for (size_t i = 0; i < dp_engine_num_devices(engine); i++) {
        dp_outputs out;
        if (dp_engine_outputs(engine, i, &out) != DP_OK) return die("outputs");
        printf("  %s holds the logits of rows %zu..%zu\n", dp_device_name(out.device),
               out.row_begin, out.row_begin + out.rows - 1);
    }
    if (dp_engine_outputs_to_host(engine, logits) != DP_OK) return die("outputs to host");
    *acc = accuracy(logits, y, TEST_ROWS);
    return 0;
}

int main(int argc, char **argv)
{
    const char *devices = "cpu:2";
    long steps = 200;
    int bf16 = 0;
    static const struct option opts[] = {{"devices", required_argument, 0, 'd'},
                                         {"steps", required_argument, 0, 's'},
                                         {"bf16", no_argument, 0, 'b'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    cli_set_program("mlp_classifier");
    static const char usage[] = "usage: mlp_classifier [--devices LIST (default cpu:2)] "
                                "[--steps N (default 200)] [--bf16]\n";
    opterr = 0; /* cli_bad_option names a bad option, by this program's name */
    for (int c; (c = getopt_long(argc, argv, "d:s:bh", opts, NULL)) != -1;) {
        if (c == 'd') devices = optarg;
        else if (c == 's' && cli_parse_long("--steps", optarg, 1, 1000000, &steps)) return 2;
        else if (c == 'b') bf16 = 1;
        else if (c == 'h')
            return fputs(usage, stdout), cli_check_stream(stdout, "the help to standard output");
        else if (c != 's') return cli_bad_option(argv, "d:s:bh");
    }
    if (optind < argc)
        return cli_fail("unexpected argument \"%s\" (see --help)", argv[optind]) + 1;

    dp_device_spec specs[DP_MAX_DEVICES];
    size_t k = 0;
    /* a refused command line, as the other options: 2 */
    if (dp_device_list_parse(devices, specs, DP_MAX_DEVICES, &k) != DP_OK) return die("--devices") + 1;

    mlp net;
    dp_model model;
    /* Mixed precision: the model's replicas in bfloat16 (its callbacks
     * read params.bf16), every GEMM in bf16; the engine keeps float32
     * masters and moments. */
    mlp_init_model(&net, &(mlp_config){D, H, K, bf16 ? DP_DTYPE_BF16 : DP_DTYPE_F32}, &model);
    net.activation = MLP_RELU;
    net.dropout = 0.1f; /* in training steps; predictions run without */
    dp_criterion loss = dp_criterion_cross_entropy();
    dp_engine_config cfg = dp_engine_config_default();
    cfg.matmul_precision = bf16 ? DP_MATMUL_BF16 : DP_MATMUL_FP32;
    cfg.optim.lr = 3e-3f;
    cfg.optim.weight_decay = 0.01f;
    dp_engine *engine = NULL;
    if (dp_engine_create(specs, k, &model, &loss, &cfg, &engine) != DP_OK) return die("engine");

    dp_rng rng;
    dp_rng_seed(&rng, 42);
    float centres[K * D], x[ROWS * D];
    int32_t y[ROWS];
    dp_rng_fill_normal(&rng, centres, K * D, 0.0f, 1.0f);
    printf("training a %dx%dx%d ReLU MLP on %zu device(s) (%s), %d rows per step, %s\n", D, H, K, k,
           devices, ROWS, bf16 ? "bf16 replicas and GEMMs" : "float32");
    double first = 0.0, last = 0.0;
    for (long step = 1; step <= steps; step++) {
        make_batch(&rng, centres, ROWS, x, y);
        dp_batch batch = {ROWS, x, y};
        dp_step_stats st;
        if (dp_engine_step(engine, &batch, &st) != DP_OK) {
            dp_engine_destroy(engine);
            return die("step");
        }
        if (step == 1) first = st.loss;
        last = st.loss;
        if (step == 1 || step % 20 == 0 || step == steps)
            printf("step %4ld  loss %.4f  grad_norm %.3f  %.2f ms\n", step, st.loss, st.grad_norm,
                   1e3 * st.seconds);
    }
    double acc = 0.0;
    int failed = evaluate_accuracy(engine, &rng, centres, &acc);
    dp_engine_destroy(engine);
    if (failed) return 1;
    printf("accuracy %.1f%% on %d held-out rows\n", 100.0 * acc, TEST_ROWS);
    if (!(last < 0.5 * first)) {
        fprintf(stderr, "mlp_classifier: the loss went from %.4f to %.4f, not below half in "
                "%ld steps; give it more --steps (the default 200 gets there)\n",
                first, last, steps);
        return 1;
    }
    if (acc < 0.9) {
        fprintf(stderr, "mlp_classifier: accuracy %.3f is below 0.9\n", acc);
        return 1;
    }
    return cli_check_stream(stdout, "standard output");
}
