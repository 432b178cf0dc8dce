/*
 * bench/dp_bench/dp_bench.h - what dp_bench's files share, split the
 * nccl-tests way: harness.c (options, engine creation, timing, main),
 * modes.c (the timed runs, --find-max-batch, --scaling), report.c (the
 * table, the arithmetic, JSON, CSV), plots.c (gnuplot) and outputs.c
 * (output files checked before the first step, written all or none).
 */
#ifndef DP_BENCH_H
#define DP_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include <dp/dp.h>

#include "dp_cli.h"

// --- options and the bench (harness.c) -------------------------------------------------

typedef struct opts {
    long vocab, context, batch, dim, layers, heads, steps, warmup;
    const char *devices, *mode, *memory_limit, *json, *csv, *plot, *trace, *weights_arg;
    int find_max_batch, scaling, tf32, token_balanced, shard_optimizer;
    cli_compute compute; /* --precision, --recompute, --attention(-chunk), --logits-chunk */
    unsigned long long seed;
    double peak_tflops; /* --peak-tflops: the job's peak dense TFLOP/s; 0: no MFU */
    size_t limit_bytes;
    float weights[DP_MAX_DEVICES]; /* --device-weights, n_weights of them (0: equal) */
    size_t n_weights;
} opts;

typedef struct bench {
    opts o;                                /* harness.c */
    dp_gpt *gpt;                           /* harness.c */
    dp_device_spec specs[DP_MAX_DEVICES];  /* harness.c: --devices, k of them */
    size_t k;
    int32_t *inputs, *targets;             /* modes.c: (rows_cap, T) random tokens */
    size_t rows_cap;
    dp_trace *trace;  /* outputs.c: --trace, the steps of the timed modes */
    cli_lock locks[5]; /* outputs.c: rank 0's on --json, --csv, --plot (both) and --trace */
    double t_origin;  /* harness.c: cli_now() once the ranks agreed: the trace's time 0 */
    cli_ranks rk; /* harness.c: the job's ranks under mpirun (one rank, dist NULL, alone) */
    int noted;    /* modes.c: the first engine's matmul note is printed */
} bench;

/* An error every rank meets alike: rank 0 prints it (CLI_AGREED_FAIL). */
#define AGREED_FAIL(b, ...) CLI_AGREED_FAIL(&(b)->rk, __VA_ARGS__)

int engine_fail(bench *b, dp_status s, const char *what);
int agree(bench *b, int failed);
dp_status make_engine(bench *b, dp_mode mode, int shard, size_t k, dp_engine **out);

// --- what the runs measure (modes.c) ---------------------------------------------------------

typedef struct dev_result {
    char name[32];
    size_t rows; /* rows of the global batch this device processed */
    size_t peak, optimizer, logits, params, reserved;
    size_t phase_peak[DP_PHASE_COUNT];
} dev_result;

typedef struct mode_result {
    dp_mode mode;
    int shard; /* optimizer state sharded over the devices */
    int ran;
    size_t k;       /* this rank's devices (dev[0..k)) */
    size_t k_global; /* the job's devices: ranks x k */
    size_t bytes_sent_per_step; /* this rank's bytes to other ranks per timed step */
    double step_ms_median, step_ms_min, step_ms_max, tokens_per_s;
    /* Medians over the timed steps, like the step time: one descheduled
     * step would lift a mean far above what a step takes. */
    double phase_ms[DP_PHASE_COUNT]; /* each phase's (its slowest device) */
    double exposed_ms; /* dp_step_stats.exposed_seconds */
    int overlapped;    /* the timed steps' reduce-scatter overlapped the backward */
    size_t replayed;   /* timed steps whose every device replayed a CUDA graph */
    double loss;
    dev_result dev[DP_MAX_DEVICES];
    size_t rows;    /* global batch of the timed steps */
    long max_batch; /* --find-max-batch; 0 = not searched or nothing fits */
    double imbalance, imbalance_no_opt;
} mode_result;

typedef struct scale_point {
    size_t k;      /* devices per rank */
    size_t global; /* the job's devices: ranks x k */
    double tokens_per_s;
    size_t bytes_sent_per_step;
} scale_point;

/* The runs, in order: each mode --mode and the ranks allow, then with
 * --shard-optimizer each again sharded. */
typedef struct run_plan {
    dp_mode modes[2];
    size_t nmodes;
    int skip_gather; /* --mode both across ranks: gather mode cannot span them */
    dp_mode mode[4];
    int shard[4];
    size_t n;
} run_plan;

/* What the runs measured, for the reports and output files. */
typedef struct results {
    mode_result res[4]; /* the runs that were timed, nres of them */
    size_t nres;
    long max_batch[4];  /* --find-max-batch: each planned run's largest batch */
    char max_why[4][512]; /* and why one more sequence did not fit (the host's RAM, a
                             GPU's memory or the limit: the error's message) */
    dp_mode scale_mode; /* --scaling's mode, and the batch it was timed at */
    size_t scale_rows;
    scale_point sc[DP_MAX_DEVICES]; /* --scaling: 1..k devices per rank */
    size_t nsc;
} run_results;

/* The median of x[0..m), m > 0 (sorted here). */
double median_of(double *x, size_t m);
/* The step times ms[0..m) (sorted here) summarised into *res, with
 * tokens/s for rows sequences of context tokens (harness.c). */
void step_times(mode_result *res, double *ms, size_t m, size_t rows, long context);

run_plan plan_runs(const bench *b);
int time_runs(bench *b, const run_plan *p, run_results *rs);
int run_scaling(bench *b, const run_plan *p, run_results *rs);

// --- reports (report.c) -------------------------------------------------------------------

const char *run_name(dp_mode mode, int shard, char *buf, size_t cap);
const char *spec_name(const dp_device_spec *sp, char *buf, size_t cap);
void print_banner(const bench *b, const run_plan *p);
/* Model FLOPs per token by llm.c's count, 6 N + 6 L C T (N the GPT's
 * parameters without padding: the forward's 2 N per token and the
 * backward's 4 N, plus the attention's scores and weighted sum); a run's
 * model TFLOP/s and, with --peak-tflops, its MFU (model FLOPs utilisation,
 * PaLM's appendix B). */
double model_flops_per_token(const bench *b);
double model_tflops(const bench *b, const mode_result *m);
double mfu(const bench *b, const mode_result *m);
void print_table(const bench *b, const run_results *rs);
void print_arithmetic(const bench *b, const run_results *rs);
void print_max_batches(const bench *b, const run_plan *p, const run_results *rs);
void print_scaling_header(const bench *b, const run_results *rs);
void print_scaling_row(const bench *b, const run_results *rs, size_t i);
json_t *json_results(const bench *b, const run_results *rs);
char *csv_text(const run_results *rs, int ranks);

// --- output files (outputs.c) and plots (plots.c) ---------------------------------------------

/* An output written to its temporary file, renamed into place at the end. */
typedef struct pending {
    const char *flag, *path;
    dp_atomic_file *af; /* its temporary file removed by a fatal signal (cli_guard_signals) */
} pending;

#define MAX_PENDING 5 /* --json, --csv, two plots, --trace */

typedef struct outputs {
    pending p[MAX_PENDING];
    size_t n;
} outputs;

int stage(outputs *out, const char *flag, const char *path, const void *bytes, size_t n);
int check_outputs(bench *b);
int open_trace(bench *b);
int write_outputs(bench *b, const run_results *rs);

char *scaling_path(const char *path);
int check_gnuplot(void);
int plot_memory(const bench *b, outputs *out, const char *path, const run_results *rs);
int plot_scaling(const bench *b, outputs *out, const char *path, const run_results *rs);

#endif /* DP_BENCH_H */
