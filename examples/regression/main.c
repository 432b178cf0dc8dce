/*
 * examples/regression/main.c - embedding dp with a loss other than
 * cross-entropy: a linear regression (linreg.c) trained with the bundled
 * MSE criterion on generated data, some of whose targets are missing
 * (NaN, ignored by the loss). The example also solves the least-squares
 * problem exactly (normal equations in double) and checks that training
 * converged to it: it prints both and exits with 1 when they differ.
 * Usage: regression [--devices LIST (cpu:2)] [--mode balanced|gather] [--steps N]
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dp/dp.h>

#include "dp_cli.h"

#include "linreg.h"

enum { D = 8, O = 2, ROWS = 512 };

/* y = x @ W^T + b + noise; every 7th row misses output 1 (NaN). */
static void make_data(float *x, float *y)
{
    dp_rng rng;
    dp_rng_seed(&rng, 2024);
    float w[O * D], b[O] = {0.5f, -1.25f};
    dp_rng_fill_normal(&rng, w, O * D, 0.0f, 1.0f);
    dp_rng_fill_normal(&rng, x, ROWS * D, 0.0f, 1.0f);
    for (int i = 0; i < ROWS; i++)
        for (int o = 0; o < O; o++) {
            double v = b[o] + 0.3 * dp_rng_normal(&rng);
            for (int d = 0; d < D; d++) v += (double)w[o * D + d] * x[i * D + d];
            y[i * O + o] = (o == 1 && i % 7 == 3) ? NAN : (float)v;
        }
}

/* Least squares per output over its valid rows: (A^T A) beta = A^T y with
 * A = [x 1], by Gaussian elimination with partial pivoting, in double.
 * beta[o] = (w_o0..w_o(D-1), b_o). Returns the mean squared error at the
 * optimum over every valid target (the loss training should reach). */
static double least_squares(const float *x, const float *y, double beta[O][D + 1])
{
    enum { P = D + 1 };
    double sse = 0.0;
    size_t n = 0;
    for (int o = 0; o < O; o++) {
        double M[P][P + 1];
        memset(M, 0, sizeof M);
        for (int i = 0; i < ROWS; i++) {
            double t = y[i * O + o], a[P];
            if (isnan(t)) continue;
            for (int d = 0; d < D; d++) a[d] = x[i * D + d];
            a[D] = 1.0;
            for (int r = 0; r < P; r++) {
                for (int c = 0; c < P; c++) M[r][c] += a[r] * a[c];
                M[r][P] += a[r] * t;
            }
        }
        for (int c = 0; c < P; c++) {
            int piv = c;
            for (int r = c + 1; r < P; r++)
                if (fabs(M[r][c]) > fabs(M[piv][c])) piv = r;
            for (int k = 0; k <= P; k++) {
                double tmp = M[c][k];
                M[c][k] = M[piv][k];
                M[piv][k] = tmp;
            }
            for (int r = c + 1; r < P; r++) {
                double f = M[r][c] / M[c][c];
                for (int k = c; k <= P; k++) M[r][k] -= f * M[c][k];
            }
        }
        for (int r = P - 1; r >= 0; r--) {
            double s = M[r][P];
            for (int k = r + 1; k < P; k++) s -= M[r][k] * beta[o][k];
            beta[o][r] = s / M[r][r];
        }
        for (int i = 0; i < ROWS; i++) {
            double t = y[i * O + o];
            if (isnan(t)) continue;
            double p = beta[o][D];
            for (int d = 0; d < D; d++) p += beta[o][d] * x[i * D + d];
            sse += (p - t) * (p - t);
            n++;
        }
    }
    return sse / (double)n;
}

static int die(const char *what)
{
    fprintf(stderr, "regression: %s: %s\n", what, dp_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    const char *devices = "cpu:2";
    dp_mode mode = DP_MODE_BALANCED;
    long steps = 300;
    static const struct option opts[] = {{"devices", required_argument, 0, 'd'},
                                         {"mode", required_argument, 0, 'm'},
                                         {"steps", required_argument, 0, 's'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    cli_set_program("regression");
    static const char usage[] = "usage: regression [--devices LIST (default cpu:2)] "
                                "[--mode balanced|gather] [--steps N (default 300)]\n";
    opterr = 0; /* cli_bad_option names a bad option, by this program's name */
    for (int c; (c = getopt_long(argc, argv, "d:m:s:h", opts, NULL)) != -1;) {
        if (c == 'd') devices = optarg;
        else if (c == 'm' && strcmp(optarg, "balanced") == 0) mode = DP_MODE_BALANCED;
        else if (c == 'm' && strcmp(optarg, "gather") == 0) mode = DP_MODE_GATHER;
        else if (c == 'm')
            return cli_fail("--mode: \"%s\" is not balanced or gather", optarg) + 1;
        else if (c == 's' && cli_parse_long("--steps", optarg, 1, 1000000, &steps)) return 2;
        else if (c == 'h')
            return fputs(usage, stdout), cli_check_stream(stdout, "the help to standard output");
        else if (c != 's') return cli_bad_option(argv, "d:m:s:h");
    }
    if (optind < argc)
        return cli_fail("unexpected argument \"%s\" (see --help)", argv[optind]) + 1;
    dp_device_spec specs[DP_MAX_DEVICES];
    size_t k = 0;
    /* a refused command line, as the other options: 2 */
    if (dp_device_list_parse(devices, specs, DP_MAX_DEVICES, &k) != DP_OK) return die("--devices") + 1;

    static float x[ROWS * D], y[ROWS * O];
    make_data(x, y);
    double beta[O][D + 1];
    double best = least_squares(x, y, beta);

    linreg net;
    dp_model model;
    linreg_init_model(&net, D, O, &model);
    dp_criterion mse = dp_criterion_mse();
    dp_engine_config cfg = dp_engine_config_default();
    cfg.mode = mode;
    cfg.optim.kind = DP_OPTIMIZER_SGD;
    cfg.optim.lr = 0.1f;
    cfg.optim.momentum = 0.9f;
    cfg.optim.weight_decay = 0.0f;
    dp_engine *engine = NULL;
    if (dp_engine_create(specs, k, &model, &mse, &cfg, &engine) != DP_OK) return die("engine");

    printf("linear regression %d -> %d on %zu device(s) (%s, %s mode), %d rows, MSE\n", D, O, k,
           devices, dp_mode_name(mode), ROWS);
    dp_batch batch = {ROWS, x, y};
    dp_step_stats st;
    for (long step = 1; step <= steps; step++) {
        if (dp_engine_step(engine, &batch, &st) != DP_OK) {
            dp_engine_destroy(engine);
            return die("step");
        }
        if (step == 1 || step % 50 == 0 || step == steps)
            printf("step %4ld  mse %.6f  (%zu valid targets)\n", step, st.loss, st.valid_targets);
    }
    float params[2 * DP_PARAM_ALIGN];
    if (model.n_params > sizeof params / sizeof *params) return die("model too large");
    if (dp_engine_evaluate(engine, &batch, &st) != DP_OK || dp_engine_get_params(engine, params) != DP_OK) {
        dp_engine_destroy(engine);
        return die("evaluate");
    }
    dp_engine_destroy(engine);

    double worst = 0.0;
    for (int o = 0; o < O; o++)
        for (int c = 0; c <= D; c++) {
            float p = c < D ? params[net.tensors[0].offset + (size_t)o * D + c]
                            : params[net.tensors[1].offset + (size_t)o];
            double diff = fabs((double)p - beta[o][c]);
            if (diff > worst) worst = diff;
        }
    printf("least squares: mse %.6f   trained: mse %.6f   max |param - optimum| %.2e\n", best,
           st.loss, worst);
    if (!(worst < 1e-3) || !(fabs(st.loss - best) <= 1e-4 * best)) {
        fprintf(stderr, "regression: %ld steps did not reach the least-squares optimum; give it "
                "more --steps (the default 300 gets there)\n", steps);
        return 1;
    }
    printf("converged to the least-squares optimum\n");
    return cli_check_stream(stdout, "standard output");
}
