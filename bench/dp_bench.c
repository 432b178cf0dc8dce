/*
 * bench/dp_bench.c - gathered vs balanced DataParallel, side by side.
 *
 * Trains the GPT of dp/gpt.h on random tokens with the same devices and the
 * same global batch in gather mode (classic nn.DataParallel: every logit is
 * copied to device 0, which computes the loss) and in balanced mode (the
 * parallel criterion: logits and loss stay on their own devices). For each
 * mode: warm-up steps, then --steps timed steps; per device the peak bytes
 * (overall and within each phase), the bytes of logits and their gradient,
 * the optimizer state; step time (median, min, max), tokens/s, the time in
 * each phase, and the imbalance max/min of peak bytes over devices.
 * --shard-optimizer times each mode a second time with the optimizer state
 * sharded over the devices (ZeRO stage 1), next to the root runs.
 *
 * --find-max-batch searches the largest global batch that completes a step
 * under --memory-limit in each mode; --scaling times 1..k devices. Output:
 * an aligned table on stdout, and on request JSON, CSV, gnuplot plots and a
 * Chrome trace of the steps. Every output path is checked before the first
 * step, and the outputs are written all or none (each to a temporary file,
 * renamed into place only when all were written).
 * Memory accounting is exact on CPU devices, so the memory figures of a
 * cpu:k run are those k GPUs would show for dp's own allocations.
 *
 * Under an MPI launcher (mpirun -np R dp_bench --devices cpu:K ...) the R
 * ranks time one engine over R x K devices (dp/dist.h): every rank makes
 * the same engine calls with the same global batch, and runs the same
 * --find-max-batch search (each trial's outcome is agreed by the engine).
 * Gather mode cannot span ranks and is skipped; --scaling times R x 1..K
 * devices. Rank 0 alone prints and writes the outputs, and the per-device
 * figures are its own devices'; work only rank 0 does, and failures one
 * rank alone can meet, are followed by an agreement (dp_dist_agree).
 */
#define _GNU_SOURCE /* getopt_long, clock_gettime, mkdtemp */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dp/dp.h"
#include "dp/trace.h"

#include "dp/atomic_file.h"
#include "dp/checked.h"

#include "dp_cli.h"

// --- options ------------------------------------------------------------------------

typedef struct opts {
    long vocab, context, batch, dim, layers, heads, steps, warmup;
    const char *devices, *mode, *memory_limit, *json, *csv, *plot, *trace, *weights_arg;
    int find_max_batch, scaling, tf32, token_balanced, shard_optimizer;
    cli_compute compute; /* --precision, --recompute, --attention(-chunk), --logits-chunk */
    unsigned long long seed;
    size_t limit_bytes;
    float weights[DP_MAX_DEVICES]; /* --device-weights, n_weights of them (0: equal) */
    size_t n_weights;
} opts;

static void usage(FILE *f)
{
    fputs("usage: dp_bench [options]\n"
          "Trains a GPT on random tokens in gather and balanced mode and compares\n"
          "per-device peak memory and speed. Defaults: the seed article's case.\n"
          "  --vocab-size N       vocabulary size (default 40000; --vocab N is the same)\n"
          "  --context N          tokens per sequence (default 250)\n"
          "  --batch-size N       global sequences per step (default 32; with\n"
          "                       --find-max-batch also where the search starts)\n"
          "  --dim N              embedding width (default 256)\n"
          "  --layers N           transformer blocks (default 2)\n"
          "  --heads N            attention heads, must divide --dim (default 4)\n"
          "  --devices LIST       e.g. cpu:4, cuda:0,1 (default: every GPU, else cpu:4)\n"
          "  --steps N            timed steps per mode (default 3)\n"
          "  --warmup N           untimed steps before them (default 1)\n"
          "  --mode M             both, gather or balanced (default both)\n"
          "  --shard-optimizer    also time each mode with the optimizer state sharded\n"
          "                       over the devices (ZeRO-1: each device holds the AdamW\n"
          "                       moments of its slice), shown as MODE+shard\n"
          "  --memory-limit SIZE  per-device allocation limit, e.g. 2GiB (default none)\n"
          "  --logits-chunk ROWS  output rows of logits per criterion call in balanced mode;\n"
          "                       auto (default) keeps a chunk's logits about the size of\n"
          "                       the features; whole = unchunked\n"
          "  --find-max-batch     largest global batch that fits --memory-limit, per mode;\n"
          "                       each mode is then timed at the smaller of that and\n"
          "                       --batch-size (0: not even 1 sequence fits, not timed)\n"
          "  --device-weights W   relative rows per device, one weight per device,\n"
          "                       e.g. 1,2,2,2 gives the root a smaller chunk\n"
          "  --token-balanced     split rows so devices get equal valid targets (by weight;\n"
          "                       the random tokens have no ignored targets, so the split\n"
          "                       is that of the rows)\n"
          "  --scaling            tokens/s on the first 1..k devices of the list (equal\n"
          "                       shares)\n"
          "  --seed N             seed for the model and the tokens (default 1337)\n"
          "  --tf32               let cuBLAS use TF32 tensor cores on GPUs (default off)\n"
          "  --precision fp32|bf16  bf16: bfloat16 parameter replicas and GEMMs, float32\n"
          "                       master weights, gradients and AdamW state (default fp32)\n"
          "  --recompute none|attention|gelu|all  keep no attention probabilities, GELU\n"
          "                       output or both: the backward recomputes them (same\n"
          "                       results; default none)\n"
          "  --attention whole|chunked  chunked: the attention " CLI_STR(DP_GPT_ATTENTION_CHUNK)
          " queries at a time, no\n"
          "                       (T,T) probabilities (default whole)\n"
          "  --attention-chunk N  queries per chunk with --attention chunked (default "
          CLI_STR(DP_GPT_ATTENTION_CHUNK) "):\n"
          "                       larger chunks, larger GEMMs (GPUs) and a larger scratch\n"
          "  --json PATH          write the results as JSON\n"
          "  --csv PATH           write one row per mode and device as CSV\n"
          "  --plot PATH          per-device peak memory plot (.png or .svg, gnuplot);\n"
          "                       with --scaling also PATH-scaling.EXT\n"
          "  --trace PATH         Chrome trace-event JSON of every step of the timed modes,\n"
          "                       one track per device (open in ui.perfetto.dev)\n"
          "  --help               this text\n"
          "Under mpirun -np R, the R ranks time one engine over R x the --devices of each\n"
          "rank (CPU devices): gather mode is skipped (it cannot span ranks), --scaling\n"
          "times R x 1..k devices, rank 0 alone prints and writes the outputs, and its\n"
          "devices are the ones shown; JSON rows carry ranks, devices_per_rank and\n"
          "bytes_sent_per_step (rank 0's bytes to the other ranks per timed step).\n",
          f);
}

/* getopt_long's codes of this program's own options and their table (the
 * shared ones: CLI_COMPUTE_LONGOPTS). */
enum {
    O_VOCAB = 256, O_CTX, O_BATCH, O_DIM, O_LAYERS, O_HEADS, O_DEV, O_STEPS, O_WARM, O_MODE,
    O_MEM, O_FIND, O_SCALE, O_SEED, O_JSON, O_CSV, O_PLOT, O_TF32, O_WEIGHTS, O_TOKBAL,
    O_TRACE, O_SHARD, O_HELP
};

static const struct option longopts[] = {
    {"vocab", 1, 0, O_VOCAB},        {"vocab-size", 1, 0, O_VOCAB},
    {"context", 1, 0, O_CTX},
    {"batch-size", 1, 0, O_BATCH},   {"dim", 1, 0, O_DIM},
    {"layers", 1, 0, O_LAYERS},      {"heads", 1, 0, O_HEADS},
    {"devices", 1, 0, O_DEV},        {"steps", 1, 0, O_STEPS},
    {"warmup", 1, 0, O_WARM},        {"mode", 1, 0, O_MODE},
    {"memory-limit", 1, 0, O_MEM},   {"find-max-batch", 0, 0, O_FIND},
    {"scaling", 0, 0, O_SCALE},      {"seed", 1, 0, O_SEED},
    {"json", 1, 0, O_JSON},          {"csv", 1, 0, O_CSV},
    {"plot", 1, 0, O_PLOT},          {"tf32", 0, 0, O_TF32},
    {"device-weights", 1, 0, O_WEIGHTS}, {"token-balanced", 0, 0, O_TOKBAL},
    {"trace", 1, 0, O_TRACE},        {"shard-optimizer", 0, 0, O_SHARD},
    {"help", 0, 0, O_HELP},          CLI_COMPUTE_LONGOPTS,
    {0, 0, 0, 0}};

/* One option of ours into *ctx (an opts): 0, 1 after a message, -1 after
 * --help, or CLI_NOT_MINE (cli_parse_options). */
static int option(void *ctx, int c, const char *v)
{
    opts *o = ctx;
    const long big = 1L << 30;
    int bad = 0;
    long seed = 0;
    switch (c) {
    case O_VOCAB: bad = cli_parse_long("--vocab-size", v, 2, big, &o->vocab); break;
    case O_CTX: bad = cli_parse_long("--context", v, 1, big, &o->context); break;
    case O_BATCH: bad = cli_parse_long("--batch-size", v, 1, big, &o->batch); break;
    /* 4 * dim is a GEMM size (an int). */
    case O_DIM: bad = cli_parse_long("--dim", v, 1, INT_MAX / 4, &o->dim); break;
    case O_LAYERS: bad = cli_parse_long("--layers", v, 1, 4096, &o->layers); break;
    case O_HEADS: bad = cli_parse_long("--heads", v, 1, big, &o->heads); break;
    case O_DEV: o->devices = v; break;
    case O_STEPS: bad = cli_parse_long("--steps", v, 1, big, &o->steps); break;
    case O_WARM: bad = cli_parse_long("--warmup", v, 0, big, &o->warmup); break;
    case O_MODE: o->mode = v; break;
    case O_MEM: o->memory_limit = v; break;
    case O_FIND: o->find_max_batch = 1; break;
    case O_SCALE: o->scaling = 1; break;
    case O_SEED: bad = cli_parse_long("--seed", v, 0, LONG_MAX, &seed); o->seed = (unsigned long long)seed; break;
    case O_JSON: o->json = v; break;
    case O_CSV: o->csv = v; break;
    case O_PLOT: o->plot = v; break;
    case O_TF32: o->tf32 = 1; break;
    case O_WEIGHTS: o->weights_arg = v; break;
    case O_TOKBAL: o->token_balanced = 1; break;
    case O_TRACE: o->trace = v; break;
    case O_SHARD: o->shard_optimizer = 1; break;
    case O_HELP: usage(stdout); return -1;
    default: return CLI_NOT_MINE;
    }
    return bad;
}

static int parse_args(int argc, char **argv, opts *o)
{
    int rc = cli_parse_options(argc, argv, longopts, 0, &o->compute, option, o);
    if (rc) return rc;
    if (cli_check_tf32(&o->compute, o->tf32) || cli_check_attention_chunk(&o->compute)) return 1;
    if (strcmp(o->mode, "both") && strcmp(o->mode, "gather") && strcmp(o->mode, "balanced"))
        return cli_fail("--mode: \"%s\" is not both, gather or balanced", o->mode);
    if (o->dim % o->heads)
        return cli_fail("--heads %ld does not divide --dim %ld; pick heads that divide dim", o->heads,
                    o->dim);
    if (o->memory_limit && dp_parse_bytes(o->memory_limit, &o->limit_bytes) != DP_OK)
        return cli_dp_fail("--memory-limit");
    if (o->find_max_batch && !o->memory_limit)
        return cli_fail("--find-max-batch needs --memory-limit (e.g. --memory-limit 2GiB)");
    /* 0 means no limit: every batch would fit and the search would double
     * until the host runs out of memory. */
    if (o->find_max_batch && o->limit_bytes == 0)
        return cli_fail("--find-max-batch needs a --memory-limit above 0 (0 means no limit, so "
                        "there is no largest batch); e.g. --memory-limit 2GiB");
    if (o->plot) {
        const char *dot = strrchr(o->plot, '.');
        if (!dot || (strcmp(dot, ".png") && strcmp(dot, ".svg")))
            return cli_fail("--plot: \"%s\" must end in .png or .svg", o->plot);
    }
    return 0;
}

// --- one mode ----------------------------------------------------------------------

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
    double phase_ms[DP_PHASE_COUNT]; /* mean over timed steps (slowest device) */
    double loss;
    dev_result dev[DP_MAX_DEVICES];
    size_t rows;    /* global batch of the timed steps */
    long max_batch; /* --find-max-batch; 0 = not searched or nothing fits */
    double imbalance, imbalance_no_opt;
} mode_result;

typedef struct bench {
    opts o;
    dp_gpt *gpt;
    dp_device_spec specs[DP_MAX_DEVICES];
    size_t k;
    int32_t *inputs, *targets; /* (rows_cap, T) */
    size_t rows_cap;
    dp_trace *trace;  /* --trace: the steps of the timed modes */
    double t_origin;  /* cli_now() at start: the trace's time 0 */
    size_t scale_rows; /* --scaling's global batch */
    cli_ranks rk; /* the job's ranks under mpirun (one rank, dist NULL, alone) */
} bench;

// --- ranks ----------------------------------------------------------------------------

/* An error every rank meets alike: rank 0 prints it (CLI_AGREED_FAIL). */
#define AGREED_FAIL(b, ...) CLI_AGREED_FAIL(&(b)->rk, __VA_ARGS__)

/* A failed engine call (cli_ranks_engine_fail). */
static int engine_fail(bench *b, dp_status s, const char *what)
{
    return cli_ranks_engine_fail(&b->rk, s, what);
}

/* Agreement on this rank's outcome (cli_ranks_agree). */
static int agree(bench *b, int failed) { return cli_ranks_agree(&b->rk, failed); }

/* Joins the ranks under a launcher (cli_ranks_join). */
static int join_ranks(bench *b, int *argc, char ***argv)
{
    return cli_ranks_join(&b->rk, argc, argv);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Random tokens for `rows` sequences; row r's tokens depend on the seed and
 * r only, so a batch of any size starts with the same sequences. */
static int ensure_tokens(bench *b, size_t rows)
{
    if (rows <= b->rows_cap) return 0;
    size_t T = (size_t)b->o.context, V = (size_t)b->o.vocab, bytes;
    if (!dp_size_mul(rows, T * sizeof(int32_t), &bytes))
        return cli_fail("a batch of %zu sequences of %zu tokens does not fit in memory", rows, T);
    int32_t *in = realloc(b->inputs, bytes);
    if (in) b->inputs = in;
    int32_t *tg = in ? realloc(b->targets, bytes) : NULL;
    if (tg) b->targets = tg;
    if (!in || !tg) return cli_fail("out of host memory for a batch of %zu sequences", rows);
    for (size_t r = b->rows_cap; r < rows; r++) {
        dp_rng rng;
        dp_rng_seed(&rng, b->o.seed * 1000003u + r);
        int32_t prev = (int32_t)dp_rng_below(&rng, V);
        for (size_t t = 0; t < T; t++) {
            int32_t next = (int32_t)dp_rng_below(&rng, V);
            b->inputs[r * T + t] = prev;
            b->targets[r * T + t] = next;
            prev = next;
        }
    }
    b->rows_cap = rows;
    return 0;
}

/* "balanced", "gather+shard": a run's name in the table, CSV and plot. */
static const char *run_name(dp_mode mode, int shard, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s%s", dp_mode_name(mode), shard ? "+shard" : "");
    return buf;
}

static dp_status make_engine(bench *b, dp_mode mode, int shard, size_t k, dp_engine **out)
{
    dp_engine_config ec = dp_engine_config_default();
    ec.mode = mode;
    ec.shard_optimizer = shard;
    ec.seed = b->o.seed;
    ec.optim.grad_clip = 1.0f;
    ec.memory_limit = b->o.limit_bytes;
    ec.allow_tf32 = b->o.tf32;
    ec.matmul_precision = b->o.compute.bf16 ? DP_MATMUL_BF16 : DP_MATMUL_FP32;
    ec.token_balanced = b->o.token_balanced;
    /* Every run gets it; gather mode ignores it (its root gathers whole logits). */
    ec.logits_chunk_rows = b->o.compute.logits_chunk;
    ec.dist = b->rk.dist;
    /* The weights are per device of the full list; --scaling's shorter
     * lists use equal shares. */
    if (b->o.n_weights && k == b->k) ec.device_weights = b->o.weights;
    dp_criterion ce = dp_criterion_cross_entropy();
    /* bf16: replicas and the activations off the residual stream (dp_gpt_model_bf16_act) */
    const dp_model *m = dp_gpt_model_ex(b->gpt, cli_gpt_flags(&b->o.compute));
    return dp_engine_create(b->specs, k, m, &ce, &ec, out);
}

/* Warm-up and timed steps of `rows` sequences on the first k devices;
 * with `trace`, every step goes to b->trace. */
static int run_mode(bench *b, dp_mode mode, int shard, size_t k, size_t rows, int trace,
                    mode_result *res)
{
    memset(res, 0, sizeof *res);
    res->mode = mode;
    res->shard = shard;
    res->k = k;
    res->k_global = k * (size_t)b->rk.ranks;
    res->rows = rows;
    char name[32];
    run_name(mode, shard, name, sizeof name);
    double *ms = NULL;
    int rc = ensure_tokens(b, rows);
    if (!rc && !(ms = calloc((size_t)b->o.steps, sizeof *ms))) rc = cli_fail("out of host memory");
    if (agree(b, rc)) {
        free(ms);
        return 1;
    }
    dp_engine *e = NULL;
    dp_status es = make_engine(b, mode, shard, k, &e);
    if (es != DP_OK) {
        free(ms);
        return engine_fail(b, es, name);
    }
    dp_batch batch = {rows, b->inputs, b->targets};
    long n = b->o.warmup + b->o.steps;
    dp_step_stats st;
    size_t sent0 = 0;
    int trace_failed = 0; /* rank 0's --trace failed: agreed after the steps */
    for (long s = 0; s < n && !rc; s++) {
        if (s == b->o.warmup) sent0 = dp_dist_bytes_sent(b->rk.dist);
        double t0 = cli_now();
        if ((es = dp_engine_step(e, &batch, &st)) != DP_OK) {
            char what[96];
            snprintf(what, sizeof what, "%s step %ld of %zu sequences", name, s + 1, rows);
            rc = engine_fail(b, es, what);
            break;
        }
        double dt = cli_now() - t0;
        if (trace && b->trace && !trace_failed) {
            /* One timeline for every engine: place the step by our clock. */
            st.start_seconds = t0 - b->t_origin;
            if (dp_trace_add_step(b->trace, &st) != DP_OK) {
                trace_failed = cli_dp_fail("--trace");
                /* With ranks the others are on their way into the next step. */
                if (b->rk.ranks == 1) rc = 1;
            }
        }
        for (size_t i = 0; i < k; i++) {
            dev_result *d = &res->dev[i];
            for (int p = 0; p < DP_PHASE_COUNT; p++)
                if (st.devices[i].phase_peak[p] > d->phase_peak[p])
                    d->phase_peak[p] = st.devices[i].phase_peak[p];
        }
        if (s < b->o.warmup) continue;
        ms[s - b->o.warmup] = 1e3 * dt;
        for (int p = 0; p < DP_PHASE_COUNT; p++)
            res->phase_ms[p] += 1e3 * st.phase_seconds[p] / (double)b->o.steps;
        res->loss = st.loss;
    }
    if (!rc) res->bytes_sent_per_step = (dp_dist_bytes_sent(b->rk.dist) - sent0) / (size_t)b->o.steps;
    if (!rc && b->rk.ranks > 1) rc = agree(b, trace_failed);
    if (!rc) {
        qsort(ms, (size_t)b->o.steps, sizeof *ms, cmp_double);
        size_t m = (size_t)b->o.steps;
        res->step_ms_median = m % 2 ? ms[m / 2] : 0.5 * (ms[m / 2 - 1] + ms[m / 2]);
        res->step_ms_min = ms[0];
        res->step_ms_max = ms[m - 1];
        res->tokens_per_s = (double)rows * (double)b->o.context / (1e-3 * res->step_ms_median);
        double hi = 0, lo = INFINITY, hi2 = 0, lo2 = INFINITY;
        for (size_t i = 0; i < k; i++) {
            dev_result *d = &res->dev[i];
            snprintf(d->name, sizeof d->name, "%s", dp_device_name(dp_engine_device(e, i)));
            d->rows = st.devices[i].rows;
            d->peak = st.devices[i].peak;
            d->optimizer = st.devices[i].optimizer_bytes;
            d->logits = st.devices[i].logits_bytes;
            d->params = st.devices[i].param_bytes;
            d->reserved = st.devices[i].reserved_bytes;
            double p = (double)d->peak, q = (double)(d->peak - d->optimizer);
            hi = fmax(hi, p), lo = fmin(lo, p), hi2 = fmax(hi2, q), lo2 = fmin(lo2, q);
        }
        res->imbalance = hi / lo;
        res->imbalance_no_opt = hi2 / lo2;
        res->ran = 1;
    }
    free(ms);
    dp_engine_destroy(e);
    return rc;
}

/* 1: a fresh engine completes one step of `rows` sequences, 0: out of
 * memory on some device (the reason copied to why), -1: another error
 * (reported). */
static int fits(bench *b, dp_mode mode, int shard, size_t rows, char *why, size_t why_cap)
{
    if (agree(b, ensure_tokens(b, rows))) return -1;
    dp_engine *e = NULL;
    dp_status s = make_engine(b, mode, shard, b->k, &e);
    if (s == DP_OK) {
        dp_batch batch = {rows, b->inputs, b->targets};
        s = dp_engine_step(e, &batch, NULL);
    }
    if (s == DP_ERR_OUT_OF_MEMORY) snprintf(why, why_cap, "%s", dp_last_error());
    dp_engine_destroy(e);
    if (s == DP_OK) return 1;
    if (s == DP_ERR_OUT_OF_MEMORY) return 0;
    char name[32], what[96];
    snprintf(what, sizeof what, "%s with %zu sequences", run_name(mode, shard, name, sizeof name),
             rows);
    engine_fail(b, s, what);
    return -1;
}

/* The largest global batch that completes a step under the limit, from
 * `start` whether or not it fits: doubling up while it fits, else halving
 * down to 1 while it does not, then bisection between the largest batch
 * that fit and the smallest that did not. *out = 0 when not even one
 * sequence fits; why then holds the reason. */
static int find_max_batch(bench *b, dp_mode mode, int shard, size_t start, long *out, char *why,
                          size_t why_cap)
{
    /* Each device holds its rows' tokens (inputs and targets, 8 bytes a
     * token) at least, so no batch above this fits: the doubling stops. */
    size_t per_row = (size_t)b->o.context * 8, cap = ((size_t)1 << 30);
    size_t bound = b->o.limit_bytes / per_row + 1;
    if (dp_size_mul(bound, b->k * (size_t)b->rk.ranks, &bound) && bound < cap) cap = bound;
    size_t lo = 0, hi = 0; /* lo fits (0 trivially); hi does not fit (0: none found yet) */
    size_t x = start < cap ? start : cap;
    int f = fits(b, mode, shard, x, why, why_cap);
    if (f < 0) return 1;
    if (f) {
        lo = x;
        while (!hi) {
            if (lo >= cap) return cli_fail("--find-max-batch: %zu sequences still fit; the "
                                           "search stops there", lo);
            x = lo > cap / 2 ? cap : 2 * lo;
            if ((f = fits(b, mode, shard, x, why, why_cap)) < 0) return 1;
            if (f) lo = x;
            else hi = x;
        }
    } else {
        hi = x;
        while (!lo && hi > 1) {
            x = hi / 2;
            if ((f = fits(b, mode, shard, x, why, why_cap)) < 0) return 1;
            if (f) lo = x;
            else hi = x;
        }
        if (!lo) { /* not even one sequence */
            *out = 0;
            return 0;
        }
    }
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if ((f = fits(b, mode, shard, mid, why, why_cap)) < 0) return 1;
        if (f) lo = mid;
        else hi = mid;
    }
    *out = (long)lo;
    return 0;
}

// --- output -------------------------------------------------------------------------

static const char *human(size_t bytes, char *buf, size_t cap)
{
    double b = (double)bytes;
    if (b >= 1e9) snprintf(buf, cap, "%.2f GB", b / 1e9);
    else if (b >= 1e6) snprintf(buf, cap, "%.1f MB", b / 1e6);
    else snprintf(buf, cap, "%.1f kB", b / 1e3);
    return buf;
}

static void print_table(const bench *b, const mode_result *res, size_t nres)
{
    char h[6][24], name[32];
    printf("\n%-14s %-8s %11s %11s %11s %11s %11s %11s\n", "mode", "device", "peak", "w/o optim",
           "params+grad", "optimizer", "logits", "reserved");
    for (size_t r = 0; r < nres; r++) {
        const mode_result *m = &res[r];
        run_name(m->mode, m->shard, name, sizeof name);
        for (size_t i = 0; i < m->k; i++) {
            const dev_result *d = &m->dev[i];
            printf("%-14s %-8s %11s %11s %11s %11s %11s %11s\n", i ? "" : name,
                   d->name, human(d->peak, h[0], 24), human(d->peak - d->optimizer, h[1], 24),
                   human(d->params, h[2], 24), human(d->optimizer, h[3], 24),
                   human(d->logits, h[4], 24), human(d->reserved, h[5], 24));
        }
    }
    printf("(peak: high-water mark of bytes allocated since the engine was created; logits:\n"
           " bytes held for logits and their gradient; reserved: the backend's own buffers\n"
           " (cuBLAS workspace, staging, bf16 GEMM conversion scratch), outside peak but\n"
           " counted by --memory-limit. Per-phase peaks: --json, --csv)\n");
    if (b->rk.ranks > 1)
        printf("(devices: rank 0's %zu of the job's %zu over %d ranks; the other ranks' are not\n"
               " shown)\n",
               res[0].k, res[0].k_global, b->rk.ranks);
    printf("\n");
    printf("%-14s %10s %10s %10s %12s %10s %12s\n", "mode", "step ms", "min", "max", "tokens/s",
           "imbalance", "w/o optim");
    for (size_t r = 0; r < nres; r++) {
        const mode_result *m = &res[r];
        printf("%-14s %10.1f %10.1f %10.1f %12.0f %10.3f %12.3f\n",
               run_name(m->mode, m->shard, name, sizeof name),
               m->step_ms_median, m->step_ms_min, m->step_ms_max, m->tokens_per_s, m->imbalance,
               m->imbalance_no_opt);
    }
    printf("(step ms: median of %ld timed steps; imbalance: max/min of peak bytes over devices,\n"
           " w/o optim: the same with the optimizer state taken out; +shard: the optimizer\n"
           " state sharded over the devices)\n\n",
           b->o.steps);
    printf("%-14s", "phase ms");
    for (int p = 0; p < DP_PHASE_COUNT; p++) printf(" %9.9s", dp_phase_name((dp_phase)p));
    printf(" %9s\n", "outside");
    for (size_t r = 0; r < nres; r++) {
        const mode_result *m = &res[r];
        double tot = 0, out = 0;
        printf("%-14s", run_name(m->mode, m->shard, name, sizeof name));
        for (int p = 0; p < DP_PHASE_COUNT; p++) {
            printf(" %9.2f", m->phase_ms[p]);
            tot += m->phase_ms[p];
            if (p != DP_PHASE_FORWARD && p != DP_PHASE_CRITERION && p != DP_PHASE_BACKWARD)
                out += m->phase_ms[p];
        }
        printf(" %8.1f%%\n", tot > 0 ? 100.0 * out / tot : 0.0);
    }
    printf("(mean per timed step, each phase as long as its slowest device; outside: the\n"
           " share of scatter, reduce,"
           " optimizer and broadcast)\n");
}

static void print_arithmetic(const bench *b, const mode_result *res, size_t nres)
{
    const mode_result *g = NULL, *bal = NULL; /* the root runs */
    for (size_t r = 0; r < nres; r++) {
        if (res[r].mode == DP_MODE_GATHER && !res[r].shard) g = &res[r];
        if (res[r].mode == DP_MODE_BALANCED && !res[r].shard) bal = &res[r];
    }
    char h[4][24], name[32];
    /* Under --find-max-batch the runs may have been timed at different batches. */
    int differ = 0;
    for (size_t r = 1; r < nres; r++) differ |= res[r].rows != res[0].rows;
    for (size_t r = 0; r < (differ ? nres : 1); r++) {
        double lb = (double)res[r].rows * (double)b->o.context * (double)b->o.vocab * 4.0;
        printf("%slogits of the global batch%s%s: %zu x %ld x %ld x 4 bytes = %s (%s with their "
               "gradient)\n",
               r ? "" : "\n", differ ? " in " : "",
               differ ? run_name(res[r].mode, res[r].shard, name, sizeof name) : "",
               res[r].rows, b->o.context, b->o.vocab, human((size_t)lb, h[0], 24),
               human((size_t)(2 * lb), h[1], 24));
    }
    if (g)
        printf("gather:   root holds %s of logits buffers (the gathered batch and its gradient\n"
               "          plus its own rows'), root peak %s\n",
               human(g->dev[0].logits, h[2], 24), human(g->dev[0].peak, h[3], 24));
    if (bal)
        printf("balanced: each device holds one --logits-chunk of its logits at a time\n"
               "          (gradient in place): root %s, root peak %s\n",
               human(bal->dev[0].logits, h[2], 24), human(bal->dev[0].peak, h[3], 24));
    /* A ratio of peaks only means something for the same batch. */
    if (g && bal && g->rows == bal->rows)
        printf("root peak gather / balanced = %.2f\n",
               (double)g->dev[0].peak / (double)bal->dev[0].peak);
}

typedef struct scale_point {
    size_t k;      /* devices per rank */
    size_t global; /* the job's devices: ranks x k */
    double tokens_per_s;
    size_t bytes_sent_per_step;
} scale_point;

/* "cpu:0", "cuda:1": the name of a device of the list before it is opened. */
static const char *spec_name(const dp_device_spec *sp, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s:%d", sp->kind == DP_DEVICE_CUDA ? "cuda" : "cpu", sp->index);
    return buf;
}

static json_t *json_results(const bench *b, const mode_result *res, size_t nres,
                            const scale_point *sc, size_t nsc, dp_mode scale_mode)
{
    const opts *o = &b->o;
    json_t *devs = json_array();
    for (size_t i = 0; i < b->k; i++) {
        char name[32];
        json_array_append_new(devs, json_string(spec_name(&b->specs[i], name, sizeof name)));
    }
    json_t *cfg = json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:o,s:I,s:I,s:I,s:b,s:I,s:s}", "vocab",
                            (json_int_t)o->vocab, "context", (json_int_t)o->context,
                            "batch_size", (json_int_t)o->batch, "dim", (json_int_t)o->dim,
                            "layers", (json_int_t)o->layers, "heads", (json_int_t)o->heads,
                            "devices", devs, "steps", (json_int_t)o->steps, "warmup",
                            (json_int_t)o->warmup, "memory_limit", (json_int_t)o->limit_bytes, "tf32", o->tf32,
                            "n_params", (json_int_t)dp_gpt_model(b->gpt)->n_params, "optimizer",
                            "adamw");
    json_t *results = json_array();
    for (size_t r = 0; r < nres; r++) {
        const mode_result *m = &res[r];
        json_t *jd = json_array();
        for (size_t i = 0; i < m->k; i++) {
            const dev_result *d = &m->dev[i];
            json_t *pp = json_object();
            for (int p = 0; p < DP_PHASE_COUNT; p++)
                json_object_set_new(pp, dp_phase_name((dp_phase)p),
                                    json_integer((json_int_t)d->phase_peak[p]));
            json_array_append_new(
                jd, json_pack("{s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:o}", "device", d->name, "rows",
                              (json_int_t)d->rows, "peak_bytes",
                              (json_int_t)d->peak, "optimizer_bytes", (json_int_t)d->optimizer,
                              "logits_bytes", (json_int_t)d->logits, "reserved_bytes",
                              (json_int_t)d->reserved, "param_bytes",
                              (json_int_t)d->params, "phase_peak_bytes", pp));
        }
        json_t *ph = json_object();
        for (int p = 0; p < DP_PHASE_COUNT; p++)
            json_object_set_new(ph, dp_phase_name((dp_phase)p), json_real(m->phase_ms[p]));
        json_t *jr = json_pack("{s:s,s:f,s:{s:f,s:f,s:f},s:o,s:f,s:f,s:f,s:o}", "mode",
                               dp_mode_name(m->mode), "tokens_per_s", m->tokens_per_s, "step_ms",
                               "median", m->step_ms_median, "min", m->step_ms_min, "max",
                               m->step_ms_max, "phase_ms", ph, "loss", m->loss, "imbalance",
                               m->imbalance, "imbalance_without_optimizer", m->imbalance_no_opt,
                               "devices", jd);
        json_object_set_new(jr, "shard_optimizer", json_boolean(m->shard));
        json_object_set_new(jr, "batch_size", json_integer((json_int_t)m->rows));
        json_object_set_new(jr, "ranks", json_integer(b->rk.ranks));
        json_object_set_new(jr, "devices_per_rank", json_integer((json_int_t)m->k));
        json_object_set_new(jr, "bytes_sent_per_step",
                            json_integer((json_int_t)m->bytes_sent_per_step));
        if (o->find_max_batch) json_object_set_new(jr, "max_batch", json_integer(m->max_batch));
        json_array_append_new(results, jr);
    }
    json_object_set_new(cfg, "token_balanced", json_boolean(o->token_balanced));
    if (o->n_weights) {
        json_t *w = json_array();
        for (size_t i = 0; i < o->n_weights; i++)
            json_array_append_new(w, json_real(o->weights[i]));
        json_object_set_new(cfg, "device_weights", w);
    }
    json_object_set_new(cfg, "shard_optimizer", json_boolean(o->shard_optimizer));
    const cli_compute *cp = &o->compute;
    json_object_set_new(cfg, "precision", json_string(cp->bf16 ? "bf16" : "fp32"));
    json_object_set_new(cfg, "recompute", json_string(cli_recompute_name(cp->recompute)));
    json_object_set_new(cfg, "attention", json_string(cp->chunked_att ? "chunked" : "whole"));
    /* Queries per chunk of the chunked attention; null for the whole matrix. */
    json_object_set_new(cfg, "attention_chunk",
                        cp->chunked_att ? json_integer(cli_attention_chunk(cp)) : json_null());
    /* As given: a row count, or "auto" / "whole" (the count auto picks
     * depends on each run's rows; the devices' logits_bytes show it). */
    json_t *chunk = cp->logits_chunk == 0                 ? json_string("auto")
                    : cp->logits_chunk == DP_LOGITS_WHOLE ? json_string("whole")
                                                          : json_integer((json_int_t)cp->logits_chunk);
    json_object_set_new(cfg, "logits_chunk_rows", chunk);
    json_object_set_new(cfg, "ranks", json_integer(b->rk.ranks));
    json_t *root = json_pack("{s:o,s:o}", "config", cfg, "results", results);
    const mode_result *g = NULL, *bal = NULL; /* the root runs */
    for (size_t r = 0; r < nres; r++) {
        if (res[r].mode == DP_MODE_GATHER && !res[r].shard) g = &res[r];
        if (res[r].mode == DP_MODE_BALANCED && !res[r].shard) bal = &res[r];
    }
    if (g && bal && g->rows == bal->rows)
        json_object_set_new(root, "root_peak_ratio",
                            json_real((double)g->dev[0].peak / (double)bal->dev[0].peak));
    if (nsc) {
        json_t *js = json_array();
        for (size_t i = 0; i < nsc; i++)
            json_array_append_new(
                js, json_pack("{s:I,s:I,s:I,s:f,s:f,s:I}", "devices", (json_int_t)sc[i].global,
                              "ranks", (json_int_t)b->rk.ranks, "devices_per_rank",
                              (json_int_t)sc[i].k, "tokens_per_s", sc[i].tokens_per_s,
                              "efficiency",
                              sc[i].tokens_per_s * (double)sc[0].global /
                                  ((double)sc[i].global * sc[0].tokens_per_s),
                              "bytes_sent_per_step", (json_int_t)sc[i].bytes_sent_per_step));
        json_object_set_new(root, "scaling",
                            json_pack("{s:s,s:o}", "mode", dp_mode_name(scale_mode), "points", js));
    }
    return root;
}

// --- output files: checked before the first step, written all or none --------------

/* The directory part of path ("." for a bare name); malloc'd. */
static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

/* Fails (one line naming the flag, the path and the reason) unless a file
 * can be created at path: its directory exists, is a directory and is
 * writable, and path is not a directory. A probe creates and removes the
 * atomic writer's temporary file, so what passes here can be written. */
static int check_output(const char *flag, const char *path)
{
    if (!*path) return cli_fail("%s: the path is empty", flag);
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return cli_fail("%s: \"%s\" is a directory; give a file name", flag, path);
    char *dir = dir_of(path);
    if (!dir) return cli_fail("out of host memory");
    int rc = 0;
    if (stat(dir, &sb) != 0)
        rc = cli_fail("%s: cannot write \"%s\": the directory \"%s\" %s", flag, path, dir,
                      errno == ENOENT ? "does not exist" : strerror(errno));
    else if (!S_ISDIR(sb.st_mode))
        rc = cli_fail("%s: cannot write \"%s\": \"%s\" is not a directory", flag, path, dir);
    else if (access(dir, W_OK | X_OK) != 0)
        rc = cli_fail("%s: cannot write \"%s\": the directory \"%s\" is not writable (%s)", flag,
                      path, dir, strerror(errno));
    free(dir);
    if (rc) return rc;
    dp_atomic_file *af = NULL;
    if (dp_atomic_file_open(path, &af) != DP_OK)
        return cli_fail("%s: cannot write \"%s\": %s", flag, path, strerror(errno));
    dp_atomic_file_abort(af);
    return 0;
}

/* An output written to its temporary file, renamed into place at the end. */
typedef struct pending {
    const char *flag, *path;
    dp_atomic_file *af;
} pending;

#define MAX_PENDING 4

typedef struct outputs {
    pending p[MAX_PENDING];
    size_t n;
} outputs;

/* Starts an output with its bytes. */
static int stage(outputs *out, const char *flag, const char *path, const void *bytes, size_t n)
{
    pending *q = &out->p[out->n];
    q->flag = flag;
    q->path = path;
    if (dp_atomic_file_open(path, &q->af) != DP_OK)
        return cli_fail("%s: cannot write \"%s\": %s", flag, path, strerror(errno));
    out->n++;
    if (dp_atomic_file_write(q->af, bytes, n) != DP_OK || dp_atomic_file_sync(q->af) != DP_OK)
        return cli_fail("%s: cannot write \"%s\": %s", flag, path, strerror(errno));
    return 0;
}

/* rc == 0: renames every staged output into place; else removes them all. */
static int finish(outputs *out, int rc)
{
    for (size_t i = 0; i < out->n; i++) {
        pending *q = &out->p[i];
        if (rc) {
            dp_atomic_file_abort(q->af);
        } else if (dp_atomic_file_commit(q->af) != DP_OK) {
            rc = cli_fail("%s: cannot write \"%s\": %s", q->flag, q->path, strerror(errno));
        }
    }
    out->n = 0;
    return rc;
}

static char *csv_text(const mode_result *res, size_t nres, int ranks)
{
    size_t cap = 4096 + nres * DP_MAX_DEVICES * 512, len = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    len += (size_t)snprintf(s + len, cap - len,
                            "mode,device,peak_bytes,optimizer_bytes,logits_bytes,param_bytes,"
                            "reserved_bytes");
    for (int p = 0; p < DP_PHASE_COUNT; p++)
        len += (size_t)snprintf(s + len, cap - len, ",%s_peak_bytes", dp_phase_name((dp_phase)p));
    len += (size_t)snprintf(s + len, cap - len,
                            ",step_ms_median,step_ms_min,step_ms_max,tokens_per_s,max_batch,rows,"
                            "ranks,devices_per_rank,bytes_sent_per_step,shard_optimizer\n");
    for (size_t r = 0; r < nres; r++) {
        const mode_result *m = &res[r];
        for (size_t i = 0; i < m->k; i++) {
            const dev_result *d = &m->dev[i];
            len += (size_t)snprintf(s + len, cap - len, "%s,%s,%zu,%zu,%zu,%zu,%zu",
                                    dp_mode_name(m->mode), d->name, d->peak, d->optimizer,
                                    d->logits, d->params, d->reserved);
            for (int p = 0; p < DP_PHASE_COUNT; p++)
                len += (size_t)snprintf(s + len, cap - len, ",%zu", d->phase_peak[p]);
            len += (size_t)snprintf(s + len, cap - len, ",%.3f,%.3f,%.3f,%.1f,%ld,%zu,%d,%zu,%zu,%d\n",
                                    m->step_ms_median, m->step_ms_min, m->step_ms_max,
                                    m->tokens_per_s, m->max_batch, d->rows, ranks, m->k,
                                    m->bytes_sent_per_step, m->shard);
        }
    }
    return s;
}

// --- plots: gnuplot never sees a user's text ------------------------------------------
//
// gnuplot runs in a private temporary directory of ours (mkdtemp) and
// writes a file of a fixed name there ("plot.png"/"plot.svg"); the script
// holds only numbers, dp's device and mode names and that name. The plot
// is then copied into the user's path through the atomic writer. gnuplot's
// own stdout and stderr go to a log file in that directory, never to ours;
// when it fails, its last message is reported.

static const char *ext_of(const char *path) { return strrchr(path, '.'); }

/* Runs gnuplot (argv[1..] = args) in dir with stdin from `script` (may be
 * NULL: /dev/null), stdout and stderr to logpath. Returns the wait status,
 * or -1 with errno when it could not be started. */
static int spawn_gnuplot(const char *dir, const char *script, const char *arg,
                         const char *logpath)
{
    int in[2];
    if (pipe(in) != 0) return -1;
    int logfd = open(logpath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (logfd < 0) {
        close(in[0]);
        close(in[1]);
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(in[0]);
        close(in[1]);
        close(logfd);
        errno = e;
        return -1;
    }
    if (pid == 0) {
        if (chdir(dir) != 0 || dup2(in[0], 0) < 0 || dup2(logfd, 1) < 0 || dup2(logfd, 2) < 0)
            _exit(126);
        close(in[1]);
        execlp("gnuplot", "gnuplot", arg, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(logfd);
    if (script) {
        size_t n = strlen(script), off = 0;
        while (off < n) { /* EPIPE when gnuplot stops early: its log says why */
            ssize_t k = write(in[1], script + off, n - off);
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) break;
            off += (size_t)k;
        }
    }
    close(in[1]);
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    return st;
}

/* The last non-empty line of the log, whitespace collapsed, into msg. */
static void last_log_line(const char *logpath, char *msg, size_t cap)
{
    snprintf(msg, cap, "no message");
    FILE *f = fopen(logpath, "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char clean[512];
        size_t n = 0;
        for (const char *c = line; *c && n + 1 < sizeof clean; c++) {
            int sp = *c == ' ' || *c == '\t' || *c == '\n' || *c == '\r';
            if (sp && (n == 0 || clean[n - 1] == ' ')) continue;
            clean[n++] = sp ? ' ' : *c;
        }
        while (n && clean[n - 1] == ' ') n--;
        clean[n] = '\0';
        /* gnuplot's caret line under the command is not a message */
        if (n && strspn(clean, "^ ") != n) snprintf(msg, cap, "%s", clean);
    }
    fclose(f);
}

typedef struct plot_dir {
    char dir[4096];
    char log[4200], out[4200];
} plot_dir;

static int plot_dir_create(plot_dir *pd, const char *ext)
{
    const char *base = getenv("TMPDIR");
    if (!base || !*base || strlen(base) > 3000) base = "/tmp";
    snprintf(pd->dir, sizeof pd->dir, "%s/dp_bench_plot_XXXXXX", base);
    if (!mkdtemp(pd->dir)) {
        snprintf(pd->dir, sizeof pd->dir, "/tmp/dp_bench_plot_XXXXXX");
        if (!mkdtemp(pd->dir))
            return cli_fail("--plot: cannot create a temporary directory in %s: %s", base,
                            strerror(errno));
    }
    snprintf(pd->log, sizeof pd->log, "%s/gnuplot.log", pd->dir);
    snprintf(pd->out, sizeof pd->out, "%s/plot%s", pd->dir, ext);
    return 0;
}

static void plot_dir_destroy(plot_dir *pd)
{
    unlink(pd->log);
    unlink(pd->out);
    rmdir(pd->dir);
}

/* Fails unless gnuplot can be run (checked before the first step). */
static int check_gnuplot(void)
{
    plot_dir pd;
    if (plot_dir_create(&pd, ".png")) return 1;
    int st = spawn_gnuplot(pd.dir, NULL, "--version", pd.log);
    int rc = 0;
    if (st < 0)
        rc = cli_fail("--plot: cannot start gnuplot: %s", strerror(errno));
    else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        rc = cli_fail("--plot needs gnuplot, which %s; install it (Debian: gnuplot-nox) or drop "
                      "--plot",
                      WIFEXITED(st) && WEXITSTATUS(st) == 127 ? "was not found in PATH"
                                                               : "does not run");
    plot_dir_destroy(&pd);
    return rc;
}

/* gnuplot's cairo and svg terminals ignore write errors and exit 0 with a
 * truncated file: a PNG must end with its IEND chunk, an SVG with </svg>. */
static int plot_complete(const char *ext, const char *bytes, size_t n)
{
    if (strcmp(ext, ".png") == 0)
        return n >= 20 && memcmp(bytes, "\x89PNG", 4) == 0 &&
               memcmp(bytes + n - 8, "IEND\xae\x42\x60\x82", 8) == 0;
    while (n && (bytes[n - 1] == '\n' || bytes[n - 1] == ' ')) n--;
    return n >= 6 && memcmp(bytes + n - 6, "</svg>", 6) == 0;
}

/* Renders `body` (the script after its terminal and output lines) for
 * path's extension and stages the plot as an output for path. */
static int render(outputs *out, const char *path, const char *body)
{
    const char *ext = ext_of(path);
    const char *term = strcmp(ext, ".svg") == 0 ? "svg size 900,520 dynamic"
                                                : "pngcairo size 900,520";
    plot_dir pd;
    if (plot_dir_create(&pd, ext)) return 1;
    size_t n = strlen(body) + 256;
    char *script = malloc(n);
    if (!script) {
        plot_dir_destroy(&pd);
        return cli_fail("out of host memory");
    }
    snprintf(script, n, "set terminal %s\nset output 'plot%s'\n%s", term, ext, body);
    int st = spawn_gnuplot(pd.dir, script, NULL, pd.log);
    free(script);
    int rc = 0;
    struct stat sb;
    if (st < 0) {
        rc = cli_fail("--plot: cannot start gnuplot: %s", strerror(errno));
    } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || stat(pd.out, &sb) != 0 ||
               sb.st_size == 0) {
        char msg[512];
        last_log_line(pd.log, msg, sizeof msg);
        rc = cli_fail("--plot: gnuplot failed drawing \"%s\": %s", path, msg);
    } else {
        size_t len;
        FILE *f = fopen(pd.out, "rb");
        char *bytes = f ? malloc((size_t)sb.st_size) : NULL;
        len = bytes ? fread(bytes, 1, (size_t)sb.st_size, f) : 0;
        if (!bytes || len != (size_t)sb.st_size)
            rc = cli_fail("--plot: cannot read gnuplot's output: %s", strerror(errno));
        else if (!plot_complete(ext, bytes, len))
            rc = cli_fail("--plot: gnuplot wrote an incomplete plot for \"%s\" (%zu bytes); is "
                          "the disk full or a file size limit set?",
                          path, len);
        else
            rc = stage(out, "--plot", path, bytes, len);
        free(bytes);
        if (f) fclose(f);
    }
    plot_dir_destroy(&pd);
    return rc;
}

static int plot_memory(const bench *b, outputs *out, const char *path, const mode_result *res,
                       size_t nres)
{
    size_t cap = 8192 + (size_t)DP_MAX_DEVICES * 128, len = 0;
    char *s = malloc(cap);
    if (!s) return cli_fail("out of host memory");
    len += (size_t)snprintf(s + len, cap - len, "$d << EOD\ndevice");
    char name[32];
    for (size_t r = 0; r < nres; r++)
        len += (size_t)snprintf(s + len, cap - len, " %s",
                                run_name(res[r].mode, res[r].shard, name, sizeof name));
    len += (size_t)snprintf(s + len, cap - len, "\n");
    for (size_t i = 0; i < res[0].k; i++) {
        len += (size_t)snprintf(s + len, cap - len, "%s", res[0].dev[i].name);
        for (size_t r = 0; r < nres; r++)
            len += (size_t)snprintf(s + len, cap - len, " %.4f", (double)res[r].dev[i].peak / 1e9);
        len += (size_t)snprintf(s + len, cap - len, "\n");
    }
    len += (size_t)snprintf(
        s + len, cap - len,
        "EOD\n"
        "set title 'Peak memory per device: GPT V=%ld T=%ld B=%zu C=%ld L=%ld (device 0 is the root)'\n"
        "set ylabel 'peak bytes (GB)'\nset style data histograms\n"
        "set style histogram clustered gap 1\nset style fill solid 0.8 border -1\n"
        "set key top right\nset grid ytics\nset yrange [0:*]\n"
        "plot for [c=2:%zu] $d using c:xtic(1) title columnheader\n",
        b->o.vocab, b->o.context, res[0].rows, b->o.dim, b->o.layers, nres + 1);
    int rc = render(out, path, s);
    free(s);
    return rc;
}

static int plot_scaling(const bench *b, outputs *out, const char *path, const scale_point *sc,
                        size_t nsc, dp_mode mode, size_t rows)
{
    char s[8192];
    size_t len = 0;
    len += (size_t)snprintf(s + len, sizeof s - len, "$d << EOD\n");
    for (size_t i = 0; i < nsc; i++)
        len += (size_t)snprintf(s + len, sizeof s - len, "%zu %.1f %.1f\n", sc[i].global,
                                sc[i].tokens_per_s,
                                sc[0].tokens_per_s * (double)sc[i].global / (double)sc[0].global);
    /* An explicit x range: one device alone would give gnuplot an empty
     * range (and a warning). */
    snprintf(s + len, sizeof s - len,
             "EOD\n"
             "set title 'Scaling (%s mode): GPT V=%ld T=%ld B=%zu C=%ld L=%ld'\n"
             "set xlabel 'devices'\nset ylabel 'tokens/s'\nset key top left\nset grid\n"
             "set xtics %zu\nset xrange [0.5:%zu.5]\nset yrange [0:*]\n"
             "plot $d using 1:2 with linespoints lw 2 pt 7 title 'measured', "
             "$d using 1:3 with lines dt 2 title 'linear'\n",
             dp_mode_name(mode), b->o.vocab, b->o.context, rows, b->o.dim, b->o.layers,
             sc[0].global, sc[nsc - 1].global);
    return render(out, path, s);
}

/* PATH.ext -> PATH-scaling.ext */
static char *scaling_path(const char *path)
{
    const char *dot = strrchr(path, '.');
    size_t stem = (size_t)(dot - path), n = strlen(path) + 16;
    char *out = malloc(n);
    if (out) snprintf(out, n, "%.*s-scaling%s", (int)stem, path, dot);
    return out;
}

// --- main ---------------------------------------------------------------------------

/* Every output path, before any work: a bad one fails the run at once. */
static int check_outputs(const bench *b)
{
    const opts *o = &b->o;
    const char *flag[5] = {"--json", "--csv", "--plot", "--plot", "--trace"};
    const char *path[5] = {o->json, o->csv, o->plot, NULL, o->trace};
    char *sp = NULL;
    if (o->plot && o->scaling) {
        if (!(sp = scaling_path(o->plot))) return cli_fail("out of host memory");
        path[3] = sp;
    }
    int rc = 0;
    for (int i = 0; i < 5 && !rc; i++) {
        if (!path[i]) continue;
        rc = check_output(flag[i], path[i]);
        for (int j = 0; j < i && !rc; j++)
            if (path[j] && strcmp(path[i], path[j]) == 0)
                rc = cli_fail("%s and %s both write \"%s\"; give each output its own file",
                              flag[j], flag[i], path[i]);
    }
    free(sp);
    if (!rc && o->plot) rc = check_gnuplot();
    return rc;
}

/* Stages every requested output, then renames them all into place, or
 * removes them all when one failed. */
static int write_outputs(bench *b, const mode_result *res, size_t nres, const scale_point *sc,
                         size_t nsc, dp_mode scale_mode)
{
    const opts *o = &b->o;
    outputs out = {.n = 0};
    int rc = 0;
    char *sp = NULL;
    if (o->json) {
        json_t *j = json_results(b, res, nres, sc, nsc, scale_mode);
        /* 17 significant digits: every double reads back exactly (a loss compares bitwise). */
        char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(17)) : NULL;
        rc = text ? stage(&out, "--json", o->json, text, strlen(text))
                  : cli_fail("--json: cannot encode the results");
        free(text);
        json_decref(j);
    }
    if (!rc && o->csv) {
        char *text = csv_text(res, nres, b->rk.ranks);
        rc = text ? stage(&out, "--csv", o->csv, text, strlen(text)) : cli_fail("out of host memory");
        free(text);
    }
    if (!rc && o->plot && nres) rc = plot_memory(b, &out, o->plot, res, nres);
    if (!rc && o->plot && nsc) {
        sp = scaling_path(o->plot);
        rc = sp ? plot_scaling(b, &out, sp, sc, nsc, scale_mode, b->scale_rows) : cli_fail("out of host memory");
    }
    /* The trace writes itself atomically: last, so its failure still
     * removes the others. */
    if (!rc && o->trace && dp_trace_write(b->trace, o->trace) != DP_OK)
        rc = cli_fail("--trace: cannot write \"%s\": %s", o->trace, strerror(errno));
    rc = finish(&out, rc);
    if (!rc && o->plot) {
        if (!nres) printf("plot: none, no mode was timed\n");
        else if (nsc) printf("plots: %s, %s\n", o->plot, sp);
        else printf("plot: %s\n", o->plot);
    }
    if (!rc && o->trace) printf("trace: %s (open in ui.perfetto.dev)\n", o->trace);
    free(sp);
    return rc;
}

/* The command line's checks after parsing: the same outcome on every
 * rank (rank 0 alone prints it). */
static int check_args(bench *b)
{
    opts *o = &b->o;
    if (!o->devices) o->devices = dp_cuda_device_count() > 0 ? "cuda" : "cpu:4";
    if (dp_device_list_parse(o->devices, b->specs, DP_MAX_DEVICES, &b->k) != DP_OK)
        return cli_dp_fail("--devices");
    size_t global = b->k * (size_t)b->rk.ranks;
    if ((size_t)o->batch < global) {
        if (b->rk.ranks > 1)
            return cli_fail("--batch-size %ld is smaller than the %zu devices of %d ranks x %zu; "
                            "give every device a sequence",
                            o->batch, global, b->rk.ranks, b->k);
        return cli_fail("--batch-size %ld is smaller than the %zu devices; give every device a "
                        "sequence",
                        o->batch, b->k);
    }
    if (o->weights_arg &&
        cli_parse_weights("--device-weights", o->weights_arg, b->k, o->weights, &o->n_weights))
        return 1;
    if (b->rk.ranks > 1 && strcmp(o->mode, "gather") == 0)
        return cli_fail("--mode gather: gather mode cannot span ranks (it reproduces one "
                        "process's DataParallel); run it without mpirun, or use --mode balanced");
    return 0;
}

/* The bench once the ranks are joined and the command line parsed. */
static int bench_main(bench *b)
{
    opts *o = &b->o;
    /* Every rank has the same command line: rank 0 says what is wrong with it. */
    cli_set_quiet(b->rk.rank > 0);
    int bad = check_args(b);
    cli_set_quiet(0);
    if (bad) return 1;
    /* Output paths and gnuplot: rank 0 writes them. */
    if (agree(b, b->rk.rank == 0 ? check_outputs(b) : 0)) return 1;
    dp_gpt_config gc = {.vocab_size = (size_t)o->vocab,
                        .block_size = (size_t)o->context,
                        .n_layer = (size_t)o->layers,
                        .n_head = (size_t)o->heads,
                        .n_embd = (size_t)o->dim,
                        .attention_chunk = (size_t)o->compute.att_chunk};
    if (agree(b, dp_gpt_create(&gc, &b->gpt) != DP_OK ? cli_dp_fail("model") : 0)) return 1;

    int both = strcmp(o->mode, "both") == 0;
    dp_mode modes[2];
    size_t nmodes = 0;
    /* Gather mode copies every logit to one device: across ranks the engine refuses it. */
    int skip_gather = both && b->rk.ranks > 1;
    if ((both && !skip_gather) || strcmp(o->mode, "gather") == 0) modes[nmodes++] = DP_MODE_GATHER;
    if (both || strcmp(o->mode, "balanced") == 0) modes[nmodes++] = DP_MODE_BALANCED;
    int rc = 0;
    if (o->trace && b->rk.rank == 0) {
        const char *names[DP_MAX_DEVICES];
        char nbuf[DP_MAX_DEVICES][32];
        for (size_t i = 0; i < b->k; i++) names[i] = spec_name(&b->specs[i], nbuf[i], sizeof nbuf[i]);
        if (dp_trace_create(names, b->k, &b->trace) != DP_OK) rc = cli_dp_fail("--trace");
    }
    if (agree(b, rc)) return 1;

    printf("dp_bench: GPT vocab %ld, context %ld, dim %ld, %ld layers, %ld heads: %.2fM "
           "parameters\n",
           o->vocab, o->context, o->dim, o->layers, o->heads,
           (double)dp_gpt_model(b->gpt)->n_params / 1e6);
    if (b->rk.ranks > 1)
        printf("          global batch %ld sequences (%ld tokens) on %d ranks x %s (%zu devices), "
               "%ld warm-up + %ld timed steps",
               o->batch, o->batch * o->context, b->rk.ranks, o->devices, b->k * (size_t)b->rk.ranks,
               o->warmup, o->steps);
    else
        printf("          global batch %ld sequences (%ld tokens) on %s (%zu devices), %ld "
               "warm-up + %ld timed steps",
               o->batch, o->batch * o->context, o->devices, b->k, o->warmup, o->steps);
    if (o->memory_limit) printf(", memory limit %s per device", o->memory_limit);
    if (o->weights_arg) printf(", device weights %s", o->weights_arg);
    if (o->token_balanced) printf(", token-balanced");
    cli_print_compute(&o->compute);
    size_t chunk = o->compute.logits_chunk;
    if (chunk == DP_LOGITS_WHOLE) printf(", whole logits");
    else if (chunk) printf(", logits in chunks of %zu rows", chunk);
    printf("\n");
    if (skip_gather)
        printf("gather mode: skipped across ranks (it reproduces one process's DataParallel)\n");
    fflush(stdout);

    /* The runs: each mode, then with --shard-optimizer the same sharded. */
    dp_mode run_modes[4];
    int run_shard[4];
    size_t nruns = 0;
    for (size_t r = 0; r < nmodes; r++)
        for (int sh = 0; sh <= o->shard_optimizer; sh++) {
            run_modes[nruns] = modes[r];
            run_shard[nruns++] = sh;
        }
    /* res holds the runs that were timed (nres); max_batch[] every run's. */
    mode_result *res = calloc(4, sizeof *res);
    long max_batch[4] = {0, 0, 0, 0};
    scale_point sc[DP_MAX_DEVICES];
    size_t nres = 0, nsc = 0;
    char name[32];
    if (agree(b, !res ? cli_fail("out of host memory") : 0)) {
        free(res);
        return 1;
    }
    for (size_t r = 0; r < nruns && !rc; r++) {
        size_t rows = (size_t)o->batch;
        run_name(run_modes[r], run_shard[r], name, sizeof name);
        if (o->find_max_batch) {
            char why[512] = "";
            rc = find_max_batch(b, run_modes[r], run_shard[r], rows, &max_batch[r], why,
                                sizeof why);
            if (rc) break;
            if (max_batch[r] == 0) {
                printf("%s: not even 1 sequence fits under --memory-limit %s: %s\n", name,
                       o->memory_limit, why);
                continue;
            }
            if ((size_t)max_batch[r] < rows) rows = (size_t)max_batch[r];
        }
        rc = run_mode(b, run_modes[r], run_shard[r], b->k, rows, 1, &res[nres]);
        if (!rc) res[nres++].max_batch = max_batch[r];
    }
    if (!rc && nres) {
        print_table(b, res, nres);
        print_arithmetic(b, res, nres);
    }
    if (!rc && o->find_max_batch) {
        printf("\nlargest global batch under --memory-limit %s per device:", o->memory_limit);
        for (size_t r = 0; r < nruns; r++)
            printf("  %s %ld", run_name(run_modes[r], run_shard[r], name, sizeof name),
                   max_batch[r]);
        /* The root runs of the two modes: runs 0 and nruns / 2. */
        if (nmodes == 2 && max_batch[0] > 0)
            printf("  (balanced / gather = %.2f)",
                   (double)max_batch[nruns / 2] / (double)max_batch[0]);
        printf("\n");
    }
    dp_mode scale_mode = nmodes == 2 ? DP_MODE_BALANCED : modes[0];
    /* Scaling at the batch that mode was timed at (under --find-max-batch
     * perhaps smaller than --batch-size); none when it was not timed. */
    size_t scale_rows = 0;
    for (size_t r = 0; r < nres; r++)
        if (res[r].mode == scale_mode && !res[r].shard) scale_rows = res[r].rows;
    b->scale_rows = scale_rows;
    if (!rc && o->scaling && !scale_rows)
        printf("\nscaling: skipped, %s mode was not timed\n", dp_mode_name(scale_mode));
    if (!rc && o->scaling && scale_rows) {
        /* With ranks: R x 1..k devices, each rank adding one device at a time. */
        printf("\nscaling (%s mode, global batch %zu):\n", dp_mode_name(scale_mode), scale_rows);
        if (b->rk.ranks > 1)
            printf("%8s %8s %12s %9s %11s\n", "ranks x", "devices", "tokens/s", "speedup",
                   "efficiency");
        else
            printf("%8s %12s %9s %11s\n", "devices", "tokens/s", "speedup", "efficiency");
        for (size_t k = 1; k <= b->k && !rc; k++) {
            mode_result m;
            rc = run_mode(b, scale_mode, 0, k, scale_rows, 0, &m);
            if (rc) break;
            sc[nsc].k = k;
            sc[nsc].global = m.k_global;
            sc[nsc].tokens_per_s = m.tokens_per_s;
            sc[nsc].bytes_sent_per_step = m.bytes_sent_per_step;
            double sp = m.tokens_per_s / sc[0].tokens_per_s;
            double eff = sp * (double)sc[0].global / (double)m.k_global;
            if (b->rk.ranks > 1) {
                char rk[32];
                snprintf(rk, sizeof rk, "%d x %zu", b->rk.ranks, k);
                printf("%8s %8zu %12.0f %9.2f %10.1f%%\n", rk, m.k_global, m.tokens_per_s, sp,
                       100.0 * eff);
            } else {
                printf("%8zu %12.0f %9.2f %10.1f%%\n", k, m.tokens_per_s, sp, 100.0 * eff);
            }
            fflush(stdout);
            nsc++;
        }
    }
    /* Rank 0 writes the outputs; the others learn whether it could. */
    if (!rc) rc = agree(b, b->rk.rank == 0 ? write_outputs(b, res, nres, sc, nsc, scale_mode) : 0);
    free(res);
    return rc;
}

int main(int argc, char **argv)
{
    cli_set_program("dp_bench");
    /* A gnuplot that stops reading its script must not kill us. */
    signal(SIGPIPE, SIG_IGN);
    bench b;
    memset(&b, 0, sizeof b);
    b.rk.ranks = 1;
    b.t_origin = cli_now();
    opts *o = &b.o;
    *o = (opts){.vocab = 40000, .context = 250, .batch = 32, .dim = 256, .layers = 2,
                .heads = 4, .steps = 3, .warmup = 1, .mode = "both", .seed = 1337};
    if (join_ranks(&b, &argc, &argv)) {
        dp_dist_close(b.rk.dist);
        return 1;
    }
    /* Every rank has the same command line: rank 0 says what is wrong with it. */
    cli_set_quiet(b.rk.rank > 0);
    int pa = parse_args(argc, argv, o);
    cli_set_quiet(0);
    int rc = pa ? (pa < 0 ? 0 : 1) : bench_main(&b); /* pa -1: --help */
    fflush(stdout);
    free(b.inputs);
    free(b.targets);
    dp_trace_destroy(b.trace);
    dp_gpt_destroy(b.gpt);
    if (b.rk.broken) {
        /* Some rank may wait in a collective that will never complete. */
        fflush(stderr);
        dp_dist_abort(b.rk.dist, rc ? rc : 1);
    }
    dp_dist_close(b.rk.dist);
    return rc;
}
