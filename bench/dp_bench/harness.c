/*
 * bench/dp_bench/harness.c - dp_bench: gathered vs balanced DataParallel,
 * side by side. The harness: options, engine creation, timing, main.
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
 *
 * The other files (dp_bench.h: what they share): modes.c (the runs,
 * --find-max-batch, --scaling), report.c (table, arithmetic, JSON, CSV),
 * plots.c (gnuplot), outputs.c (output files, all or none).
 */
#define _POSIX_C_SOURCE 200809L
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp_bench.h"

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
          "                       the features (at least 256 rows, 2048 on GPUs);\n"
          "                       whole = unchunked\n"
          "  --peak-tflops T      the job's peak dense TFLOP/s in the run's precision (e.g.\n"
          "                       989 for one H100 in bf16, 2 x 989 for two): prints MFU\n"
          "  --bucket-mb MB       sum the gradient in pieces of MB MiB while the backward\n"
          "                       runs (with ranks, in the rounds between them; default 4);\n"
          "                       off: after the backward\n"
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
          "  --attention whole|chunked|fused  chunked: the attention "
          CLI_STR(DP_GPT_ATTENTION_CHUNK) " queries at a\n"
          "                       time, no (T,T) probabilities; fused: one kernel, no\n"
          "                       probabilities in memory (GPUs; default auto: fused in\n"
          "                       bf16 on GPUs at head size 64, else whole)\n"
          "  --attention-chunk N  queries per chunk with --attention chunked (default "
          CLI_STR(DP_GPT_ATTENTION_CHUNK) "):\n"
          "                       larger chunks, larger GEMMs (GPUs) and a larger scratch\n"
          "  --vocab-pad N|auto   pad the vocabulary inside the model to a multiple of N\n"
          "                       (1: none; at most " CLI_STR(CLI_VOCAB_PAD_MAX)
          "), as llm.c pads 50257 to 50304:\n"
          "                       aligned LM-head GEMMs on GPUs, the same model and FLOPs\n"
          "                       count (default auto: " CLI_STR(CLI_VOCAB_PAD_GPU)
          " with a GPU, else none)\n"
          "  --json PATH          write the results as JSON\n"
          "  --csv PATH           write one row per mode and device as CSV\n"
          "  --plot PATH          per-device peak memory plot (.png or .svg, gnuplot);\n"
          "                       with --scaling also PATH-scaling.EXT\n"
          "  --trace PATH         Chrome trace-event JSON of every step of the timed modes,\n"
          "                       one track per device (open in ui.perfetto.dev)\n"
          "                       The outputs are written together at the end, or none;\n"
          "                       the run holds PATH.lock of each, and a second run given\n"
          "                       one of them is refused\n"
          "  --help               this text\n"
          "Under mpirun -np R, the R ranks time one engine over R x the --devices of each\n"
          "rank (CPU devices): gather mode is skipped (it cannot span ranks), --scaling\n"
          "times R x 1..k devices, rank 0 alone prints and writes the outputs, and its\n"
          "devices are the ones shown (--trace holds every rank's: a process each);\n"
          "JSON rows carry ranks, devices_per_rank and\n"
          "bytes_sent_per_step (rank 0's bytes to the other ranks per timed step).\n"
          "Every rank must be given the same options: the ranks compare them when they\n"
          "join and all fail naming the first that differs. A wait between the ranks\n"
          "lasts at most " CLI_STR(CLI_RANKS_WAIT_DEFAULT_S) " s (twice that for the gradient's pieces\n"
          "inside a step, so a stuck rank's own watchdog names it first); then every\n"
          "rank stops.\n"
          "Exit status: 0; 2 for a command line it refuses (nothing run, nothing\n"
          "written); 1 for a failure after it, with no output file half-written.\n",
          f);
}

/* getopt_long's codes of this program's own options and their table (the
 * shared ones: CLI_COMPUTE_LONGOPTS). */
enum {
    O_VOCAB = 256, O_CTX, O_BATCH, O_DIM, O_LAYERS, O_HEADS, O_DEV, O_STEPS, O_WARM, O_MODE,
    O_MEM, O_FIND, O_SCALE, O_SEED, O_JSON, O_CSV, O_PLOT, O_TF32, O_WEIGHTS, O_TOKBAL,
    O_TRACE, O_SHARD, O_PEAK, O_HELP
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
    {"peak-tflops", 1, 0, O_PEAK},
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
    case O_PEAK:
        bad = cli_parse_double("--peak-tflops", v, 0, &o->peak_tflops);
        if (!bad && (o->peak_tflops <= 0 || o->peak_tflops > 1e9))
            bad = cli_fail("--peak-tflops: %s is not a peak in TFLOP/s above 0 and at most 1e9 "
                           "(e.g. 989 for one H100 in bf16)", v);
        break;
    case O_HELP: cli_print_help(usage); return -1;
    default: return CLI_NOT_MINE;
    }
    return bad;
}

static int parse_args(int argc, char **argv, opts *o)
{
    int rc = cli_parse_options(argc, argv, longopts, &o->compute, option, o);
    if (rc) return rc;
    if (cli_check_tf32(&o->compute, o->tf32) || cli_check_attention_chunk(&o->compute)) return 1;
    if (strcmp(o->mode, "both") && strcmp(o->mode, "gather") && strcmp(o->mode, "balanced"))
        return cli_fail("--mode: \"%s\" is not both, gather or balanced", o->mode);
    if (o->dim % o->heads)
        return cli_fail("--heads %ld does not divide --dim %ld; pick heads that divide dim", o->heads,
                    o->dim);
    if (o->memory_limit && cli_parse_memory_limit(o->memory_limit, &o->limit_bytes)) return 1;
    /* Without a limit every batch would fit and the search would double
     * until the host runs out of memory. */
    if (o->find_max_batch && !o->memory_limit)
        return cli_fail("--find-max-batch needs --memory-limit (e.g. --memory-limit 2GiB)");
    if (o->plot) {
        const char *dot = strrchr(o->plot, '.');
        if (!dot || (strcmp(dot, ".png") && strcmp(dot, ".svg")))
            return cli_fail("--plot: \"%s\" must end in .png or .svg", o->plot);
    }
    return 0;
}

// --- ranks ----------------------------------------------------------------------------

/* A failed engine call (cli_ranks_engine_fail). */
int engine_fail(bench *b, dp_status s, const char *what)
{
    return cli_ranks_engine_fail(&b->rk, s, what,
                                 "a smaller --batch-size, --recompute all, a smaller "
                                 "--logits-chunk, --shard-optimizer, more --devices, or a "
                                 "higher --memory-limit where one is set");
}

/* Agreement on this rank's outcome (cli_ranks_agree). */
int agree(bench *b, int failed) { return cli_ranks_agree(&b->rk, failed); }

/* Agreement after rank 0's files (cli_ranks_agree_writes). */
static int agree_writes(bench *b, int failed) { return cli_ranks_agree_writes(&b->rk, failed); }

/* Joins the ranks under a launcher (cli_ranks_join). */
static int join_ranks(bench *b, int *argc, char ***argv)
{
    return cli_ranks_join(&b->rk, argc, argv);
}

// --- engines and timing -----------------------------------------------------------------

/* A fresh engine for one run: mode, the optimizer state sharded or not,
 * on the first k devices of the list, the options' settings. */
dp_status make_engine(bench *b, dp_mode mode, int shard, size_t k, dp_engine **out)
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
    ec.bucket_bytes = b->o.compute.bucket_bytes;
    ec.dist = b->rk.dist;
    /* Under ranks every wait between them is bounded, the engine's too. */
    ec.watchdog_seconds = b->rk.ranks > 1 ? b->rk.wait : 0.0;
    /* The weights are per device of the full list; --scaling's shorter
     * lists use equal shares. */
    if (b->o.n_weights && k == b->k) ec.device_weights = b->o.weights;
    dp_criterion ce = dp_criterion_cross_entropy();
    /* bf16: replicas and the activations off the residual stream (dp_gpt_model_bf16_act) */
    const dp_model *m = dp_gpt_model(b->gpt, cli_gpt_flags(&b->o.compute));
    return dp_engine_create(b->specs, k, m, &ce, &ec, out);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double median_of(double *x, size_t m)
{
    qsort(x, m, sizeof *x, cmp_double);
    return m % 2 ? x[m / 2] : 0.5 * (x[m / 2 - 1] + x[m / 2]);
}

void step_times(mode_result *res, double *ms, size_t m, size_t rows, long context)
{
    res->step_ms_median = median_of(ms, m);
    res->step_ms_min = ms[0];
    res->step_ms_max = ms[m - 1];
    res->tokens_per_s = (double)rows * (double)context / (1e-3 * res->step_ms_median);
}

// --- main ---------------------------------------------------------------------------

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
    if (o->heads > 0) /* --attention auto */
        cli_resolve_attention(&o->compute, b->specs, b->k, (size_t)(o->dim / o->heads));
    if (b->rk.ranks > 1 && strcmp(o->mode, "gather") == 0)
        return cli_fail("--mode gather: gather mode cannot span ranks (it reproduces one "
                        "process's DataParallel); run it without mpirun, or use --mode balanced");
    return 0;
}

/* The model every run trains: --vocab-size, --context, --layers, --heads,
 * --dim, --attention-chunk, --vocab-pad (auto: on the devices). */
static int make_model(bench *b)
{
    const opts *o = &b->o;
    dp_gpt_config gc = {.vocab_size = (size_t)o->vocab,
                        .block_size = (size_t)o->context,
                        .n_layer = (size_t)o->layers,
                        .n_head = (size_t)o->heads,
                        .n_embd = (size_t)o->dim,
                        .attention_chunk = (size_t)o->compute.att_chunk,
                        .vocab_pad = cli_vocab_pad(&o->compute, b->specs, b->k)};
    return dp_gpt_create(&gc, &b->gpt) != DP_OK ? cli_dp_fail("model") : 0;
}

/* The bench once the ranks are joined and the command line parsed. */
static int bench_main(bench *b)
{
    /* The same options on every rank (compared at join): rank 0 says what
     * is wrong with them, unless only another rank's devices refuse. */
    cli_set_quiet(1);
    int bad = check_args(b);
    cli_set_quiet(0);
    if (cli_ranks_agree_alike(&b->rk, bad)) return bad ? 2 : 1; /* 2: refused, as parse_args */
    /* the trace's time 0: the ranks leave that agreement together, so
     * their tracks line up in the gathered trace */
    b->t_origin = cli_now();
    /* Output paths and gnuplot: rank 0 writes them. */
    if (agree_writes(b, b->rk.rank == 0 ? check_outputs(b) : 0)) return 1;
    if (agree(b, make_model(b))) return 1;
    run_plan plan = plan_runs(b);
    if (agree(b, open_trace(b))) return 1; /* every rank's steps: rank 0 gathers them */
    print_banner(b, &plan);
    run_results *rs = calloc(1, sizeof *rs);
    if (agree(b, !rs ? cli_fail("out of host memory") : 0)) {
        free(rs);
        return 1;
    }
    int rc = time_runs(b, &plan, rs);
    if (!rc && rs->nres) {
        print_table(b, rs);
        print_arithmetic(b, rs);
    }
    if (!rc && b->o.find_max_batch) print_max_batches(b, &plan, rs);
    if (!rc) rc = run_scaling(b, &plan, rs);
    if (!rc && b->trace && b->rk.ranks > 1) {
        dp_status s = dp_trace_gather(b->trace, b->rk.dist, b->rk.wait);
        if (s != DP_OK) rc = engine_fail(b, s, "--trace: gathering the ranks' steps");
    }
    /* Rank 0 writes the outputs; the others learn whether it could. */
    if (!rc) rc = agree_writes(b, b->rk.rank == 0 ? write_outputs(b, rs) : 0);
    free(rs);
    return rc;
}

int main(int argc, char **argv)
{
    cli_set_program("dp_bench"); /* SIGPIPE ignored: a gnuplot that quits cannot kill us */
    bench b;
    memset(&b, 0, sizeof b);
    b.rk.ranks = 1;
    opts *o = &b.o;
    *o = (opts){.vocab = 40000, .context = 250, .batch = 32, .dim = 256, .layers = 2,
                .heads = 4, .steps = 3, .warmup = 1, .mode = "both", .seed = 1337};
    if (join_ranks(&b, &argc, &argv)) {
        cli_ranks_leave(&b.rk, 1);
        return 1;
    }
    /* Quietly: the ranks first compare their options, then say what is
     * wrong (every option counts: the runs, --scaling's device counts and
     * the table are planned from them alike on every rank). */
    cli_set_quiet(1);
    int pa = parse_args(argc, argv, o);
    cli_set_quiet(0);
    pa = cli_ranks_options(&b.rk, pa, NULL);
    /* pa -1: --help; a refused command line exits 2, as lm_train's and the
     * other benchmarks' do, a failure after it 1. */
    int rc = pa ? (pa < 0 ? 0 : 2) : bench_main(&b);
    /* The table on stdout, checked (a full disk, /dev/full): exit alone
     * cannot change the status. */
    if (!rc && cli_check_stream(stdout, "standard output")) rc = 1;
    free(b.inputs);
    free(b.targets);
    dp_trace_destroy(b.trace);
    for (size_t i = 0; i < sizeof b.locks / sizeof b.locks[0]; i++) cli_unlock_output(&b.locks[i]);
    dp_gpt_destroy(b.gpt);
    /* A broken job (some rank may wait in a collective that will never
     * complete) is aborted. */
    cli_ranks_leave(&b.rk, rc);
    return rc;
}
