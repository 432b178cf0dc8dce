/*
 * dp_bench as a user runs it (DP_BENCH_PATH, a compile definition), on a
 * tiny GPT on cpu:2:
 *  - the JSON has the fixed field names, both modes, every device, and
 *    logits bytes equal to the arithmetic of the engine's buffers;
 *  - gather's root peak exceeds balanced's, balanced is symmetric without
 *    the optimizer state; --find-max-batch gives balanced >= gather;
 *  - CSV and both plots are written; --scaling reports 1..k devices;
 *  - bad command lines exit non-zero with one "dp_bench: ..." line on
 *    stderr and leave no output file; a bad output path fails before the
 *    first step (nothing on stdout);
 *  - --plot never hands the path to gnuplot (quotes and gnuplot commands in
 *    it are a file name, nothing else), and gnuplot's own output stays off
 *    ours; outputs are written all or none;
 *  - --find-max-batch finds the same largest batch from any start, and
 *    reports 0 when not even one sequence fits;
 *  - --device-weights and --token-balanced reach the engine; --trace
 *    writes one track per device;
 *  - --shard-optimizer adds sharded runs: the same loss as the root runs,
 *    each device's optimizer bytes those of its slice;
 *  - --logits-chunk reaches the balanced runs (each device's logits bytes
 *    are one chunk's) and the JSON config, gather keeps whole logits.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dp_test.h"
#include "dp_test_json.h"
#include "dp_test_fs.h"
#include "dp_test_spawn.h"

#include <criterion/parameterized.h> /* after criterion.h (in dp_test.h) */

#ifndef DP_BENCH_PATH
#error "DP_BENCH_PATH (the dp_bench binary) must be defined by the build"
#endif

static char tmpdir[64];

static void setup(void)
{
    strcpy(tmpdir, "/tmp/dp_test_bench_XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp failed");
}

static void teardown(void) { dp_test_remove_tree(tmpdir); }

TestSuite(dp_bench, .init = setup, .fini = teardown, .timeout = 60);

/* V=64, T=16, B=8, C=16, L=1, NH=2 on cpu:2: 4 rows per device. */
static const char *const BASE[] = {"--vocab", "64",     "--context", "16", "--batch-size", "8",
                                   "--dim",   "16",     "--layers",  "1",  "--heads",      "2",
                                   "--devices", "cpu:2", "--steps",  "2",  "--warmup",     "1"};
#define N_BASE (sizeof BASE / sizeof BASE[0])

/* Starts dp_bench with BASE (when with_base) then args ('@x' is
 * tmpdir/x), its stdout and stderr to tmpdir/<tag>stdout.txt and
 * <tag>stderr.txt. */
static pid_t spawn_bench(int with_base, const char *const *args, size_t n, const char *tag)
{
    char *argv[64];
    size_t argc = 0;
    argv[argc++] = strdup(DP_BENCH_PATH);
    for (size_t i = 0; i < (with_base ? N_BASE : 0) + n; i++) {
        const char *a = with_base && i < N_BASE ? BASE[i] : args[i - (with_base ? N_BASE : 0)];
        char p[256];
        if (a[0] == '@') snprintf(p, sizeof p, "%s/%s", tmpdir, a + 1);
        argv[argc++] = strdup(a[0] == '@' ? p : a);
    }
    argv[argc] = NULL;
    char out[256], err[256];
    snprintf(out, sizeof out, "%s/%sstdout.txt", tmpdir, tag);
    snprintf(err, sizeof err, "%s/%sstderr.txt", tmpdir, tag);
    pid_t pid = dp_test_spawn(argv, out, err);
    for (size_t i = 0; i < argc; i++) free(argv[i]);
    return pid;
}

static dp_test_result collect_bench(pid_t pid, const char *tag)
{
    char out[256], err[256];
    snprintf(out, sizeof out, "%s/%sstdout.txt", tmpdir, tag);
    snprintf(err, sizeof err, "%s/%sstderr.txt", tmpdir, tag);
    return dp_test_collect(pid, out, err);
}

/* dp_bench with BASE (when with_base) then args, run to its end. */
static dp_test_result run_bench(int with_base, const char *const *args, size_t n)
{
    return collect_bench(spawn_bench(with_base, args, n, ""), "");
}

#define ARGS_(...)                                                                         \
    (const char *const[]){__VA_ARGS__},                                                    \
        sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *)
#define BENCH(...) run_bench(1, ARGS_(__VA_ARGS__))

static void assert_success(const dp_test_result *r)
{
    cr_assert(WIFEXITED(r->status) && WEXITSTATUS(r->status) == 0,
              "dp_bench failed (status %d); stderr:\n%s", r->status, r->err);
}

static json_t *load_json(const char *name) { return dp_test_load_json(tmpdir, name); }
#define int_at dp_test_int_at

static json_t *mode_result(json_t *root, const char *mode)
{
    json_t *res = json_object_get(root, "results"), *r;
    size_t i;
    json_array_foreach(res, i, r) if (strcmp(json_string_value(json_object_get(r, "mode")), mode) == 0) return r;
    cr_assert_fail("no results entry for mode %s", mode);
    return NULL;
}

Test(dp_bench, json_csv_and_plots_hold_the_measurements)
{
    dp_test_result r = BENCH("--json", "@b.json", "--csv", "@b.csv", "--plot", "@m.svg");
    assert_success(&r);
    cr_assert(strstr(r.out, "root peak gather / balanced ="), "%s", r.out);
    json_t *j = load_json("b.json");
    json_t *cfg = json_object_get(j, "config");
    cr_assert_eq(int_at(cfg, "vocab"), 64);
    cr_assert_eq(int_at(cfg, "batch_size"), 8);
    cr_assert_eq(json_array_size(json_object_get(cfg, "devices")), 2);
    cr_assert_str_eq(json_string_value(json_object_get(cfg, "logits_chunk_rows")), "auto");

    const size_t T = 16, V = 64, rows = 4, chunk = rows * T * V * 4;
    json_t *g = mode_result(j, "gather"), *b = mode_result(j, "balanced");
    size_t i;
    json_t *d;
    json_t *modes[2] = {g, b};
    for (int m = 0; m < 2; m++) {
        json_t *res = modes[m];
        cr_assert(json_number_value(json_object_get(res, "tokens_per_s")) > 0);
        json_t *ms = json_object_get(res, "step_ms");
        double med = json_number_value(json_object_get(ms, "median"));
        cr_assert(json_number_value(json_object_get(ms, "min")) <= med &&
                  med <= json_number_value(json_object_get(ms, "max")));
        json_t *devs = json_object_get(res, "devices");
        cr_assert_eq(json_array_size(devs), 2);
        json_array_foreach(devs, i, d) {
            char want[32];
            snprintf(want, sizeof want, "cpu:%zu", i);
            cr_assert_str_eq(json_string_value(json_object_get(d, "device")), want);
            json_t *pp = json_object_get(d, "phase_peak_bytes");
            const char *ph[] = {"scatter", "forward", "criterion", "backward", "reduce",
                                "optimizer", "broadcast"};
            json_int_t peak = int_at(d, "peak_bytes");
            for (int p = 0; p < 7; p++) cr_assert(int_at(pp, ph[p]) <= peak, "%s", ph[p]);
            cr_assert_eq(int_at(d, "optimizer_bytes") > 0, i == 0, "optimizer state on the root only");
        }
    }
    /* Logits buffers, from the engine's layout: balanced keeps each chunk's
     * logits with the gradient written in place; gather adds separate
     * dlogits on every device and, on the root, the gathered batch and its
     * gradient. */
    json_t *bd = json_object_get(b, "devices"), *gd = json_object_get(g, "devices");
    cr_assert_eq(int_at(json_array_get(bd, 0), "logits_bytes"), (json_int_t)chunk);
    cr_assert_eq(int_at(json_array_get(bd, 1), "logits_bytes"), (json_int_t)chunk);
    cr_assert_eq(int_at(json_array_get(gd, 1), "logits_bytes"), (json_int_t)(2 * chunk));
    cr_assert_eq(int_at(json_array_get(gd, 0), "logits_bytes"), (json_int_t)(6 * chunk));
    json_int_t groot = int_at(json_array_get(gd, 0), "peak_bytes");
    json_int_t broot = int_at(json_array_get(bd, 0), "peak_bytes");
    cr_assert_gt(groot, broot);
    double ratio = json_number_value(json_object_get(j, "root_peak_ratio"));
    cr_assert_float_eq(ratio, (double)groot / (double)broot, 1e-9);
    cr_assert_float_eq(json_number_value(json_object_get(b, "imbalance_without_optimizer")), 1.0,
                       1e-12, "balanced replicas hold the same bytes apart from the optimizer");
    json_decref(j);

    char p[256];
    snprintf(p, sizeof p, "%s/b.csv", tmpdir);
    size_t n;
    char *csv = (char *)dp_test_read_file(p, &n);
    cr_assert_eq(strncmp(csv, "mode,device,peak_bytes,", 23), 0, "%s", csv);
    size_t lines = 0;
    for (char *c = csv; *c; c++) lines += *c == '\n';
    cr_assert_eq(lines, 5, "header + 2 modes x 2 devices:\n%s", csv);
    free(csv);
    snprintf(p, sizeof p, "%s/m.svg", tmpdir);
    char *svg = (char *)dp_test_read_file(p, &n);
    cr_assert(strstr(svg, "<svg") && strstr(svg, "gather") && strstr(svg, "balanced"));
    free(svg);
    dp_test_result_free(&r);
}

Test(dp_bench, find_max_batch_and_scaling)
{
    /* 600 kB per device: the model with AdamW state is about 70 kB, one row
     * of logits 4 kB, so the largest batches are a few tens of rows. */
    dp_test_result r = BENCH("--memory-limit", "600kB", "--find-max-batch", "--scaling",
                             "--json", "@f.json", "--plot", "@f.png");
    assert_success(&r);
    json_t *j = load_json("f.json");
    json_int_t g = int_at(mode_result(j, "gather"), "max_batch");
    json_int_t b = int_at(mode_result(j, "balanced"), "max_batch");
    cr_assert(g >= 2 && b > g, "max batch gather %lld, balanced %lld", (long long)g, (long long)b);
    /* What stopped each search is said: here the limit, one sequence more. */
    char said[96];
    snprintf(said, sizeof said, "(balanced: %lld sequences do not fit: ", (long long)b + 1);
    const char *line = strstr(r.out, said);
    cr_assert(line && strstr(line, "limit"), "no reason for balanced's max batch:\n%s", r.out);
    json_t *pts = json_object_get(json_object_get(j, "scaling"), "points");
    cr_assert_eq(json_array_size(pts), 2);
    cr_assert_eq(int_at(json_array_get(pts, 1), "devices"), 2);
    cr_assert_float_eq(json_number_value(json_object_get(json_array_get(pts, 0), "efficiency")),
                       1.0, 1e-12);
    json_decref(j);
    struct stat sb;
    char p[256];
    snprintf(p, sizeof p, "%s/f-scaling.png", tmpdir);
    cr_assert_eq(stat(p, &sb), 0, "no scaling plot");
    snprintf(p, sizeof p, "%s/f.png", tmpdir);
    cr_assert_eq(stat(p, &sb), 0, "no memory plot");
    dp_test_result_free(&r);
}

/* The results entry of mode with the optimizer state sharded or not. */
static json_t *run_result(json_t *root, const char *mode, int shard)
{
    json_t *res = json_object_get(root, "results"), *r;
    size_t i;
    json_array_foreach(res, i, r) {
        json_t *sh = json_object_get(r, "shard_optimizer");
        cr_assert(json_is_boolean(sh), "results[%zu] lacks \"shard_optimizer\": true|false", i);
        if (strcmp(json_string_value(json_object_get(r, "mode")), mode) == 0 &&
            json_is_true(sh) == shard)
            return r;
    }
    cr_assert_fail("no results entry for mode %s, shard_optimizer %d", mode, shard);
    return NULL;
}

/* The slice rule of dp/engine.h (shard_optimizer). */
static json_int_t slice_floats(json_int_t n, json_int_t k, json_int_t i)
{
    json_int_t b = n * i / k / 64 * 64, e = i + 1 == k ? n : n * (i + 1) / k / 64 * 64;
    return e - b;
}

Test(dp_bench, shard_optimizer_runs_next_to_the_root_runs)
{
    dp_test_result r = BENCH("--shard-optimizer", "--json", "@s.json", "--csv", "@s.csv");
    assert_success(&r);
    cr_assert(strstr(r.out, "balanced+shard") && strstr(r.out, "gather+shard"), "%s", r.out);
    json_t *j = load_json("s.json");
    cr_assert_eq(json_array_size(json_object_get(j, "results")), 4);
    cr_assert(json_is_true(json_object_get(json_object_get(j, "config"), "shard_optimizer")));
    json_int_t n = int_at(json_object_get(j, "config"), "n_params");
    const char *modes[2] = {"gather", "balanced"};
    for (int m = 0; m < 2; m++) {
        json_t *root = run_result(j, modes[m], 0), *sh = run_result(j, modes[m], 1);
        /* Same additions in the same order: the same loss, bitwise. */
        cr_assert(json_real_value(json_object_get(root, "loss")) ==
                      json_real_value(json_object_get(sh, "loss")),
                  "%s: sharded loss differs from the root run's", modes[m]);
        json_t *rd = json_object_get(root, "devices"), *sd = json_object_get(sh, "devices");
        for (json_int_t i = 0; i < 2; i++) {
            /* AdamW: two moments of 4 bytes per parameter of the slice. */
            cr_assert_eq(int_at(json_array_get(sd, (size_t)i), "optimizer_bytes"),
                         8 * slice_floats(n, 2, i), "%s+shard device %lld", modes[m],
                         (long long)i);
            cr_assert_eq(int_at(json_array_get(rd, (size_t)i), "optimizer_bytes"), i ? 0 : 8 * n);
        }
        /* The root's peak drops by the moments it no longer holds. */
        cr_assert_lt(int_at(json_array_get(sd, 0), "peak_bytes"),
                     int_at(json_array_get(rd, 0), "peak_bytes"));
    }
    json_decref(j);
    char p[256];
    snprintf(p, sizeof p, "%s/s.csv", tmpdir);
    size_t len;
    char *csv = (char *)dp_test_read_file(p, &len);
    size_t lines = 0;
    for (char *c = csv; *c; c++) lines += *c == '\n';
    cr_assert_eq(lines, 9, "header + 4 runs x 2 devices:\n%s", csv);
    cr_assert(strstr(csv, ",shard_optimizer\n") && strstr(csv, ",1\n"), "%s", csv);
    free(csv);
    dp_test_result_free(&r);
}

/* The devices array of the results entry of mode (unsharded). */
static json_t *devices_of(json_t *root, const char *mode)
{
    return json_object_get(run_result(root, mode, 0), "devices");
}

/* --peak-tflops: each run's MFU is its tokens/s times llm.c's 6N + 6LCT
 * FLOPs per token over the peak, with N counted here from GPT-2's shapes
 * (the base case: V 64, T 16, C 16, L 1); without it the MFU is null. */
Test(dp_bench, peak_tflops_gives_the_mfu_of_llmc_count)
{
    const double V = 64, T = 16, C = 16, L = 1;
    /* wte, wpe, per block ln_1, c_attn, attn.c_proj, ln_2, c_fc, mlp.c_proj, then ln_f */
    const double N = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
    const double fpt = 6 * N + 6 * L * C * T;
    dp_test_result r = BENCH("--peak-tflops", "0.002", "--mode", "balanced", "--json", "@m.json");
    assert_success(&r);
    cr_assert(strstr(r.out, "MFU ") && strstr(r.out, "of 0.002 TFLOP/s"), "%s", r.out);
    json_t *j = load_json("m.json");
    json_t *cfg = json_object_get(j, "config");
    cr_assert_float_eq(json_real_value(json_object_get(cfg, "model_flops_per_token")), fpt, 1e-9,
                       "model FLOPs per token %.17g, want %.17g",
                       json_real_value(json_object_get(cfg, "model_flops_per_token")), fpt);
    json_t *run = run_result(j, "balanced", 0);
    double tps = json_real_value(json_object_get(run, "tokens_per_s"));
    double got = json_real_value(json_object_get(run, "mfu"));
    double want = tps * fpt / 0.002e12;
    cr_assert(tps > 0 && fabs(got - want) <= 1e-9 * want, "mfu %.17g, want %.17g", got, want);
    json_decref(j);

    dp_test_result n = BENCH("--mode", "balanced", "--json", "@n.json");
    assert_success(&n);
    cr_assert(!strstr(n.out, "MFU"), "%s", n.out);
    j = load_json("n.json");
    cr_assert(json_is_null(json_object_get(run_result(j, "balanced", 0), "mfu")));
    cr_assert(json_is_null(json_object_get(json_object_get(j, "config"), "peak_tflops")));
    json_decref(j);
    dp_test_result_free(&r);
    dp_test_result_free(&n);
}

/* --bucket-mb reaches the engine (JSON config in bytes, or "off"), the
 * loss is bitwise the same with the overlap in pieces of one float and
 * without it, and each run reports its exposed communication. */
Test(dp_bench, bucket_mb_reaches_the_engine_and_keeps_the_bits)
{
    dp_test_result r = BENCH("--bucket-mb", "0.000004", "--mode", "balanced", "--json", "@b.json");
    assert_success(&r);
    cr_assert(strstr(r.out, "exposed"), "%s", r.out);
    json_t *j = load_json("b.json");
    cr_assert_eq(int_at(json_object_get(j, "config"), "bucket_bytes"), 4);
    json_t *run = run_result(j, "balanced", 0);
    double tiny = json_real_value(json_object_get(run, "loss"));
    cr_assert_geq(json_real_value(json_object_get(run, "exposed_ms")), 0.0);
    json_decref(j);

    dp_test_result o = BENCH("--bucket-mb", "off", "--mode", "balanced", "--json", "@o.json");
    assert_success(&o);
    j = load_json("o.json");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "config"),
                                                       "bucket_bytes")), "off");
    double off = json_real_value(json_object_get(run_result(j, "balanced", 0), "loss"));
    cr_assert(tiny == off, "loss with 4-byte buckets %.17g, without overlap %.17g", tiny, off);
    json_decref(j);

    dp_test_result d = BENCH("--mode", "balanced", "--json", "@d.json");
    assert_success(&d);
    j = load_json("d.json");
    cr_assert_eq(int_at(json_object_get(j, "config"), "bucket_bytes"), 4 << 20);
    json_decref(j);
    dp_test_result_free(&r);
    dp_test_result_free(&o);
    dp_test_result_free(&d);
}

/* The CUDA graphs' line is printed where they were asked for (and then
 * says none replayed on CPUs), not in every CPU run. */
Test(dp_bench, graphs_line_only_where_asked)
{
    unsetenv("DP_CUDA_GRAPHS");
    dp_test_result r = BENCH("--mode", "balanced");
    assert_success(&r);
    cr_assert(strstr(r.out, "overlap with the backward: balanced on"), "%s", r.out);
    cr_assert(!strstr(r.out, "CUDA graph"), "%s", r.out);
    setenv("DP_CUDA_GRAPHS", "1", 1);
    dp_test_result g = BENCH("--mode", "balanced");
    assert_success(&g);
    cr_assert(strstr(g.out, "compute phase replayed from a CUDA graph (DP_CUDA_GRAPHS=1): "
                            "balanced 0 of 2 steps\n"), "%s", g.out);
    dp_test_result_free(&r);
    dp_test_result_free(&g);
}

/* --logits-chunk 10: each balanced device holds 10 output rows of logits at
 * a time (its 4 x 16 = 64 rows in chunks of 10, the gradient in place);
 * gather still gathers the whole batch. Under auto the 64 rows stay whole
 * (below DP_LOGITS_CHUNK_MIN_ROWS), so a flag that did not reach the engine
 * shows as 64 rows. whole gives those 64 rows and the loss of the chunked
 * run to float rounding. */
Test(dp_bench, logits_chunk_reaches_the_balanced_runs)
{
    const json_int_t T = 16, V = 64, rows = 4, whole = rows * T * V * 4;
    dp_test_result r = BENCH("--logits-chunk", "10", "--json", "@c.json");
    assert_success(&r);
    cr_assert(strstr(r.out, "logits in chunks of 10 rows"), "%s", r.out);
    json_t *j = load_json("c.json");
    cr_assert_eq(int_at(json_object_get(j, "config"), "logits_chunk_rows"), 10);
    json_t *bd = devices_of(j, "balanced"), *gd = devices_of(j, "gather");
    for (size_t i = 0; i < 2; i++)
        cr_assert_eq(int_at(json_array_get(bd, i), "logits_bytes"), 10 * V * 4, "cpu:%zu", i);
    cr_assert_eq(int_at(json_array_get(gd, 0), "logits_bytes"), 6 * whole);
    cr_assert_eq(int_at(json_array_get(gd, 1), "logits_bytes"), 2 * whole);
    double chunked = json_real_value(json_object_get(run_result(j, "balanced", 0), "loss"));
    json_decref(j);

    dp_test_result w = BENCH("--logits-chunk", "whole", "--mode", "balanced", "--json", "@w.json");
    assert_success(&w);
    j = load_json("w.json");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "config"),
                                                       "logits_chunk_rows")), "whole");
    bd = devices_of(j, "balanced");
    for (size_t i = 0; i < 2; i++)
        cr_assert_eq(int_at(json_array_get(bd, i), "logits_bytes"), whole, "cpu:%zu", i);
    double unchunked = json_real_value(json_object_get(run_result(j, "balanced", 0), "loss"));
    cr_assert(chunked > 0 && fabs(chunked - unchunked) <= 1e-5 * unchunked,
              "loss with chunks of 10 rows %.9g, whole %.9g", chunked, unchunked);
    json_decref(j);
    dp_test_result_free(&r);
    dp_test_result_free(&w);
}

/* Run b (what) against run a (base) in every mode: losses within rtol
 * relative (0: the same bits) and a smaller peak on every device. */
static void assert_same_losses_lower_peaks(json_t *a, json_t *b, double rtol, const char *base,
                                           const char *what)
{
    const char *modes[] = {"balanced", "gather"};
    for (int m = 0; m < 2; m++) {
        double la = json_real_value(json_object_get(run_result(a, modes[m], 0), "loss"));
        double lb = json_real_value(json_object_get(run_result(b, modes[m], 0), "loss"));
        cr_assert(la > 0 && (rtol ? fabs(la - lb) <= rtol * la : la == lb),
                  "%s: loss %.17g %s, %.17g %s", modes[m], la, base, lb, what);
        for (size_t i = 0; i < 2; i++) {
            json_int_t pa = int_at(json_array_get(devices_of(a, modes[m]), i), "peak_bytes");
            json_int_t pb = int_at(json_array_get(devices_of(b, modes[m]), i), "peak_bytes");
            cr_assert_lt(pb, pa, "%s cpu:%zu: peak %lld %s, %lld %s", modes[m], i,
                         (long long)pb, what, (long long)pa, base);
        }
    }
}

static const char *config_string(json_t *j, const char *key)
{
    return json_string_value(json_object_get(json_object_get(j, "config"), key));
}

/* --vocab-pad: the model pads the vocabulary (50 to 64) inside and trains
 * the same to float32 rounding (tests/test_gpt_pad.c); the logits are 64
 * wide, and the FLOPs count keeps the true parameters (llm.c's 6N + 6LCT
 * with N without the padding). On CPU devices nothing is padded unless
 * asked. */
Test(dp_bench, vocab_pad_keeps_the_loss_and_the_flops_count)
{
    dp_test_result u = BENCH("--vocab-size", "50", "--mode", "balanced", "--json", "@u.json");
    assert_success(&u);
    dp_test_result p = BENCH("--vocab-size", "50", "--mode", "balanced", "--vocab-pad", "64",
                             "--json", "@p.json");
    assert_success(&p);
    cr_assert_null(strstr(u.out, "padded"), "%s", u.out);
    cr_assert(strstr(p.out, "GPT vocab 50 (padded to 64),"), "%s", p.out);
    json_t *ju = load_json("u.json"), *jp = load_json("p.json");
    json_t *cu = json_object_get(ju, "config"), *cp = json_object_get(jp, "config");
    cr_assert_eq(int_at(cu, "vocab_pad"), 1);
    cr_assert_eq(int_at(cu, "vocab_padded"), 50);
    cr_assert_eq(int_at(cp, "vocab_pad"), 64);
    cr_assert_eq(int_at(cp, "vocab_padded"), 64);
    cr_assert(json_real_value(json_object_get(cu, "model_flops_per_token")) ==
                  json_real_value(json_object_get(cp, "model_flops_per_token")),
              "the padding changed the FLOPs count");
    double lu = json_real_value(json_object_get(run_result(ju, "balanced", 0), "loss"));
    double lp = json_real_value(json_object_get(run_result(jp, "balanced", 0), "loss"));
    cr_assert(fabs(lu - lp) <= 1e-5 * lu, "loss %.17g padded, %.17g unpadded", lp, lu);
    json_decref(ju);
    json_decref(jp);
    dp_test_result_free(&u);
    dp_test_result_free(&p);
}

/* --recompute reaches every run: the same losses, bit for bit, and a
 * smaller peak on every device (no probabilities or GELU output per
 * layer). */
Test(dp_bench, recompute_reaches_every_run)
{
    dp_test_result k = BENCH("--layers", "3", "--json", "@k.json");
    assert_success(&k);
    dp_test_result r = BENCH("--layers", "3", "--recompute", "all", "--json", "@r.json");
    assert_success(&r);
    cr_assert(strstr(r.out, "attention and GELU recomputed"), "%s", r.out);
    json_t *jk = load_json("k.json"), *jr = load_json("r.json");
    cr_assert_str_eq(config_string(jr, "recompute"), "all");
    assert_same_losses_lower_peaks(jk, jr, 0.0, "kept", "recomputed");
    json_decref(jk);
    json_decref(jr);
    dp_test_result_free(&k);
    dp_test_result_free(&r);
}

/* --attention fused reaches every run: with --context 150 the losses
 * within 1e-5 of the whole-matrix runs' and a smaller peak on every
 * device; the banner and the JSON say so. */
Test(dp_bench, fused_attention_reaches_every_run)
{
    dp_test_result w = BENCH("--layers", "2", "--context", "150", "--json", "@w.json");
    assert_success(&w);
    dp_test_result f = BENCH("--layers", "2", "--context", "150", "--attention", "fused",
                             "--json", "@f.json");
    assert_success(&f);
    cr_assert(strstr(f.out, "attention fused"), "%s", f.out);
    json_t *jw = load_json("w.json"), *jf = load_json("f.json");
    cr_assert_str_eq(config_string(jf, "attention"), "fused");
    cr_assert(json_is_null(json_object_get(json_object_get(jf, "config"), "attention_chunk")));
    assert_same_losses_lower_peaks(jw, jf, 1e-5, "whole", "fused");
    json_decref(jw);
    json_decref(jf);
    dp_test_result_free(&w);
    dp_test_result_free(&f);
}

/* --attention chunked reaches every run: with --context 150 (chunks of
 * 64, 64 and 22 queries) the losses within 1e-5 of the whole-matrix
 * runs' and a smaller peak on every device. */
Test(dp_bench, chunked_attention_reaches_every_run)
{
    dp_test_result w = BENCH("--layers", "2", "--context", "150", "--json", "@w.json");
    assert_success(&w);
    dp_test_result c = BENCH("--layers", "2", "--context", "150", "--attention", "chunked",
                             "--json", "@c.json");
    assert_success(&c);
    cr_assert(strstr(c.out, "attention in chunks of 64 queries"), "%s", c.out);
    json_t *jw = load_json("w.json"), *jc = load_json("c.json");
    cr_assert_str_eq(config_string(jc, "attention"), "chunked");
    cr_assert_str_eq(config_string(jw, "attention"), "whole");
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(jc, "config"),
                                                    "attention_chunk")),
                 DP_GPT_ATTENTION_CHUNK);
    cr_assert(json_is_null(json_object_get(json_object_get(jw, "config"), "attention_chunk")));
    assert_same_losses_lower_peaks(jw, jc, 1e-5, "whole", "chunked");
    /* --attention-chunk 32: five chunks, the same losses, smaller peaks than 64's */
    dp_test_result c32 = BENCH("--layers", "2", "--context", "150", "--attention", "chunked",
                               "--attention-chunk", "32", "--json", "@c32.json");
    assert_success(&c32);
    cr_assert(strstr(c32.out, "attention in chunks of 32 queries"), "%s", c32.out);
    json_t *j32 = load_json("c32.json");
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(j32, "config"),
                                                    "attention_chunk")),
                 32);
    assert_same_losses_lower_peaks(jc, j32, 1e-5, "chunks of 64", "chunks of 32");
    json_decref(j32);
    json_decref(jw);
    json_decref(jc);
    dp_test_result_free(&w);
    dp_test_result_free(&c);
    dp_test_result_free(&c32);
}

/* --precision bf16 reaches every run: 2 bytes per parameter of replica
 * plus 4 of gradient on every device, the root's optimizer bytes hold the
 * masters beside m and v (root mode), and the loss is float32's to about
 * bfloat16's rounding. */
Test(dp_bench, precision_bf16_reaches_every_run)
{
    dp_test_result r = BENCH("--precision", "bf16", "--json", "@p.json");
    assert_success(&r);
    cr_assert(strstr(r.out, "bf16 (float32 masters)"), "%s", r.out);
    json_t *j = load_json("p.json");
    json_t *cfg = json_object_get(j, "config");
    cr_assert_str_eq(json_string_value(json_object_get(cfg, "precision")), "bf16");
    json_int_t n = int_at(cfg, "n_params");
    const char *modes[] = {"balanced", "gather"};
    double loss16[2];
    for (int m = 0; m < 2; m++) {
        json_t *d = devices_of(j, modes[m]);
        for (size_t i = 0; i < 2; i++)
            cr_assert_eq(int_at(json_array_get(d, i), "param_bytes"), 6 * n, "%s cpu:%zu",
                         modes[m], i);
        cr_assert_eq(int_at(json_array_get(d, 0), "optimizer_bytes"), 12 * n, "%s root",
                     modes[m]);
        /* the GEMMs' conversion scratch: at least a bfloat16 copy of an operand */
        cr_assert_gt(int_at(json_array_get(d, 1), "reserved_bytes"), 0, "%s", modes[m]);
        loss16[m] = json_real_value(json_object_get(run_result(j, modes[m], 0), "loss"));
    }
    json_decref(j);
    dp_test_result f = BENCH("--json", "@f.json");
    assert_success(&f);
    j = load_json("f.json");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "config"), "precision")),
                     "fp32");
    for (int m = 0; m < 2; m++) {
        double loss32 = json_real_value(json_object_get(run_result(j, modes[m], 0), "loss"));
        cr_assert(loss16[m] != loss32 && fabs(loss16[m] - loss32) <= 0.01 * loss32,
                  "%s: bf16 loss %.9g, fp32 %.9g", modes[m], loss16[m], loss32);
        cr_assert_eq(int_at(json_array_get(devices_of(j, modes[m]), 0), "param_bytes"), 8 * n);
        cr_assert_eq(int_at(json_array_get(devices_of(j, modes[m]), 0), "reserved_bytes"), 0);
    }
    json_decref(j);
    dp_test_result_free(&r);
    dp_test_result_free(&f);
}

// --- bad command lines ----------------------------------------------------------------

typedef struct bad_case {
    char name[48];
    char args[8][40]; /* after BASE; "" ends the list */
    char needle[48];
    int late; /* 1: fails after the first step, so stdout has the header */
    int status; /* the exit status: 2 for a refused command line, else 1 */
} bad_case;

static bad_case bad_cases[] = {
    {"batch-size 0", {"--batch-size", "0"}, "--batch-size", 0, 2},
    {"batch-size -2", {"--batch-size", "-2"}, "--batch-size", 0, 2},
    {"batch-size abc", {"--batch-size", "abc"}, "--batch-size", 0, 2},
    {"batch-size huge", {"--batch-size", "99999999999999999999"}, "--batch-size", 0, 2},
    {"batch smaller than devices", {"--batch-size", "1"}, "smaller than the 2 devices", 0, 2},
    {"heads not dividing dim", {"--heads", "3"}, "--heads 3", 0, 2},
    {"unknown mode", {"--mode", "fast"}, "fast", 0, 2},
    {"duplicate devices", {"--devices", "cpu:0,0"}, "cpu:0,0", 0, 2},
    {"unknown device kind", {"--devices", "tpu:0"}, "tpu", 0, 2},
    {"memory-limit 12XB", {"--memory-limit", "12XB"}, "12XB", 0, 2},
    {"memory limit too small", {"--memory-limit", "1KiB"}, "higher --memory-limit", 1, 1},
    /* refused before the tokens are made: no gigabytes touched first */
    {"batch past the host's RAM", {"--batch-size", "1000000000", "--context", "4096"},
     "does not fit in the host's", 1, 1},
    {"find-max-batch without limit", {"--find-max-batch"}, "--memory-limit", 0, 2},
    /* CPU devices' memory is the host's: the search doubled past 12 GB */
    {"find-max-batch past the host's RAM", {"--find-max-batch", "--memory-limit", "1000TiB"},
     "of available RAM", 1, 1},
    {"plot as jpg", {"--plot", "@p.jpg"}, ".png or .svg", 0, 2},
    {"json in a missing directory", {"--json", "@nodir/b.json"}, "nodir", 0, 1},
    {"unknown option", {"--frobnicate"}, "--frobnicate", 0, 2},
    {"option without its value", {"--steps"}, "--steps needs a value", 0, 2},
    {"steps 0", {"--steps", "0"}, "--steps", 0, 2},
    {"context malformed", {"--context", "12x"}, "--context", 0, 2},
    {"dim past the GEMM's int", {"--dim", "600000000"}, "--dim", 0, 2},
    {"find-max-batch with limit 0", {"--find-max-batch", "--memory-limit", "0"},
     "--memory-limit 0 is 0 bytes", 0, 2},
    {"memory-limit 0KiB", {"--memory-limit", "0KiB"}, "--memory-limit 0KiB is 0 bytes", 0, 2},
    {"device-weights: 3 for 2 devices", {"--device-weights", "1,2,3"}, "3 weights for 2 devices", 0, 2},
    {"device-weights: 1 for 2 devices", {"--device-weights", "1"}, "1 weights for 2 devices", 0, 2},
    {"device-weights negative", {"--device-weights", "1,-1"}, "--device-weights", 0, 2},
    {"device-weights all zero", {"--device-weights", "0,0"}, "no weight > 0", 0, 2},
    {"device-weights text", {"--device-weights", "a,b"}, "--device-weights", 0, 2},
    {"device-weights NaN", {"--device-weights", "nan,1"}, "--device-weights", 0, 2},
    {"device-weights empty entry", {"--device-weights", "1,"}, "--device-weights", 0, 2},
    {"token-balanced with a value", {"--token-balanced=1"}, "takes no value", 0, 2},
    {"tf32 with a value", {"--tf32=yes"}, "\"--tf32=yes\": this option takes no value", 0, 2},
    /* past LONG_MAX: the upper bound named, not "an integer >= 0" */
    {"seed past long", {"--seed", "18446744073709551615"},
     "not an integer in [0, 9223372036854775807]", 0, 2},
    {"csv in a missing directory", {"--csv", "@nodir/b.csv"}, "nodir", 0, 1},
    {"trace in a missing directory", {"--trace", "@nodir/t.json"}, "--trace", 0, 1},
    {"trace without its value", {"--trace"}, "--trace needs a value", 0, 2},
    {"plot in a missing /proc directory", {"--plot", "/proc/nope/x.png"}, "/proc/nope\" does not exist", 0, 1},
    {"json is a directory", {"--json", "@"}, "is a directory", 0, 1},
    {"json and csv on one file", {"--csv", "@out.json"}, "both write", 0, 1},
    {"logits-chunk 0", {"--logits-chunk", "0"}, "--logits-chunk", 0, 2},
    {"logits-chunk -3", {"--logits-chunk", "-3"}, "--logits-chunk", 0, 2},
    {"logits-chunk abc", {"--logits-chunk", "abc"}, "--logits-chunk", 0, 2},
    {"logits-chunk 12x", {"--logits-chunk", "12x"}, "--logits-chunk", 0, 2},
    {"logits-chunk past size_t", {"--logits-chunk", "99999999999999999999999"},
     "--logits-chunk", 0, 2},
    {"bucket-mb 0", {"--bucket-mb", "0"}, "--bucket-mb: \"0\"", 0, 2},
    {"bucket-mb -1", {"--bucket-mb", "-1"}, "--bucket-mb: \"-1\"", 0, 2},
    {"bucket-mb abc", {"--bucket-mb", "abc"}, "--bucket-mb: \"abc\"", 0, 2},
    {"bucket-mb nan", {"--bucket-mb", "nan"}, "--bucket-mb: \"nan\"", 0, 2},
    {"bucket-mb 4x", {"--bucket-mb", "4x"}, "--bucket-mb: \"4x\"", 0, 2},
    {"bucket-mb past 1 TiB", {"--bucket-mb", "1e9"}, "is too large", 0, 2},
    {"peak-tflops 0", {"--peak-tflops", "0"}, "--peak-tflops: 0 is not a peak", 0, 2},
    {"peak-tflops -5", {"--peak-tflops", "-5"}, "--peak-tflops: \"-5\"", 0, 2},
    {"peak-tflops abc", {"--peak-tflops", "abc"}, "--peak-tflops: \"abc\"", 0, 2},
    {"peak-tflops inf", {"--peak-tflops", "inf"}, "--peak-tflops: \"inf\"", 0, 2},
    {"peak-tflops 1e12", {"--peak-tflops", "1e12"}, "at most 1e9", 0, 2},
    {"precision fp16", {"--precision", "fp16"}, "--precision", 0, 2},
    {"precision bf16 with tf32", {"--precision", "bf16", "--tf32"}, "--tf32", 0, 2},
    {"recompute everything", {"--recompute", "everything"}, "--recompute", 0, 2},
    {"attention flash", {"--attention", "flash"}, "is not whole, chunked or fused", 0, 2},
    {"attention-chunk without chunked", {"--attention-chunk", "16"},
     "needs --attention chunked", 0, 2},
    {"attention-chunk 0", {"--attention", "chunked", "--attention-chunk", "0"},
     "--attention-chunk: \"0\"", 0, 2},
    {"attention-chunk past int", {"--attention", "chunked", "--attention-chunk", "2147483648"},
     "--attention-chunk: ", 0, 2},
    {"vocab-pad 0", {"--vocab-pad", "0"}, "give 1 for no padding", 0, 2},
    {"vocab-pad 65537", {"--vocab-pad", "65537"}, "--vocab-pad 65537 is too large", 0, 2},
    {"vocab-pad abc", {"--vocab-pad", "abc"}, "--vocab-pad: \"abc\"", 0, 2},
    {"vocab-size 1", {"--vocab-size", "1"}, "--vocab-size", 0, 2},
    /* --vocab, dp_bench's older name, is the same option */
    {"vocab 1", {"--vocab", "1"}, "--vocab-size", 0, 2},
    {"plot and its scaling plot on json", {"--scaling", "--plot", "@p.png", "--json", "@p-scaling.png"},
     "both write", 0, 1},
    /* one file by other names: compared as files, not as strings */
    {"json and csv through ./", {"--csv", "@./out.json"}, "both write", 0, 1},
    {"trace onto json through ./.", {"--trace", "@././out.json"}, "both write", 0, 1},
    /* a lock file is written and removed too */
    {"trace onto json's lock file", {"--trace", "@out.json.lock"}, "--json's lock file", 0, 1},
};

ParameterizedTestParameters(dp_bench, bad_input_fails_cleanly)
{
    return cr_make_param_array(bad_case, bad_cases, sizeof bad_cases / sizeof bad_cases[0]);
}

ParameterizedTest(bad_case *bc, dp_bench, bad_input_fails_cleanly, .timeout = 20)
{
    /* JSON and CSV requested first, so no case's failure may leave them. */
    const char *args[16] = {"--json", "@out.json", "--csv", "@out.csv"};
    size_t n = 4;
    for (int i = 0; i < 8 && bc->args[i][0]; i++) args[n++] = bc->args[i];
    dp_test_result r = run_bench(1, args, n);
    cr_assert(WIFEXITED(r.status), "%s: killed by signal %d", bc->name,
              WIFSIGNALED(r.status) ? WTERMSIG(r.status) : -1);
    cr_assert_eq(WEXITSTATUS(r.status), bc->status, "%s: exit status %d, want %d; stdout:\n%s",
                 bc->name, WEXITSTATUS(r.status), bc->status, r.out);
    size_t lines = 0, len = strlen(r.err);
    for (const char *p = r.err; *p; p++) lines += *p == '\n';
    cr_assert(lines == 1 && len > 0 && r.err[len - 1] == '\n',
              "%s: want exactly one line on stderr, got %zu:\n%s", bc->name, lines, r.err);
    cr_assert_eq(strncmp(r.err, "dp_bench: ", 10), 0, "%s: %s", bc->name, r.err);
    cr_assert(strstr(r.err, bc->needle), "%s: stderr does not mention \"%s\": %s", bc->name,
              bc->needle, r.err);
    if (!bc->late) cr_assert_str_empty(r.out, "%s: failed after starting work:\n%s", bc->name, r.out);
    DIR *d = opendir(tmpdir);
    struct dirent *de;
    while ((de = readdir(d)))
        cr_assert(de->d_name[0] == '.' || strstr(de->d_name, ".txt"),
                  "%s: left %s behind", bc->name, de->d_name);
    closedir(d);
    dp_test_result_free(&r);
}

/* The table on a full standard output (/dev/full) is lost: the run fails,
 * naming it. */
Test(dp_bench, a_full_standard_output_fails_the_run)
{
    char *argv[64];
    size_t argc = dp_test_argv(argv, 64, 0, NULL, DP_BENCH_PATH, BASE, N_BASE, NULL, 0, tmpdir);
    char err[256];
    snprintf(err, sizeof err, "%s/stderr.txt", tmpdir);
    dp_test_result r = dp_test_collect_err(dp_test_spawn(argv, "/dev/full", err), err);
    dp_test_argv_free(argv, argc);
    cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 1, "status %d; stderr:\n%s",
              r.status, r.err);
    cr_assert(strstr(r.err, "dp_bench: cannot write standard output: No space left on device"),
              "stderr:\n%s", r.err);
    dp_test_result_free(&r);
}

/* Outputs that are one file by a path through "..", or a symlink to one
 * that exists: refused before any step, the file untouched. */
Test(dp_bench, outputs_that_are_one_file_are_refused)
{
    char p[256], q[256];
    snprintf(p, sizeof p, "%s/sub", tmpdir);
    cr_assert_eq(mkdir(p, 0755), 0);
    dp_test_result r = BENCH("--json", "@x.json", "--csv", "@sub/../x.json");
    cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) != 0, "status %d", r.status);
    cr_assert(strstr(r.err, "--json \"") && strstr(r.err, "--csv \"") &&
                  strstr(r.err, "both write"), "stderr:\n%s", r.err);
    cr_assert_str_empty(r.out, "stdout:\n%s", r.out);
    dp_test_result_free(&r);
    snprintf(p, sizeof p, "%s/old.csv", tmpdir);
    dp_test_write_file(p, "old", 3);
    snprintf(q, sizeof q, "%s/link.json", tmpdir);
    cr_assert_eq(symlink(p, q), 0);
    r = BENCH("--json", "@link.json", "--csv", "@old.csv");
    cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) != 0, "status %d", r.status);
    cr_assert(strstr(r.err, "both write"), "stderr:\n%s", r.err);
    size_t len = 0;
    unsigned char *b = dp_test_read_file(p, &len);
    cr_assert(len == 3 && memcmp(b, "old", 3) == 0, "old.csv changed");
    free(b);
    dp_test_result_free(&r);
}

// --- --plot: the path is a name, never a script -------------------------------------

/* Names in tmpdir, without . and .. and the harness's *.txt, sorted by the
 * caller's expectations: returns the count and fails on any not in want. */
static size_t expect_only(const char *const *want, size_t n_want)
{
    DIR *d = opendir(tmpdir);
    struct dirent *de;
    size_t n = 0;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
            !strcmp(de->d_name, "stdout.txt") || !strcmp(de->d_name, "stderr.txt"))
            continue;
        int ok = 0;
        for (size_t i = 0; i < n_want; i++) ok |= strcmp(de->d_name, want[i]) == 0;
        cr_assert(ok, "unexpected file \"%s\" in the output directory", de->d_name);
        n++;
    }
    closedir(d);
    return n;
}

static void assert_fails_cleanly(const dp_test_result *r, const char *needle)
{
    cr_assert(WIFEXITED(r->status) && WEXITSTATUS(r->status) != 0, "status %d; stdout:\n%s",
              r->status, r->out);
    size_t lines = 0;
    for (const char *p = r->err; *p; p++) lines += *p == '\n';
    cr_assert(lines == 1 && strstr(r->err, needle), "want one line with \"%s\":\n%s", needle,
              r->err);
}

/* One run at a time writes an output path: a second run given the
 * --json or --csv of one still timing is refused before its first step,
 * naming the first (which holds "<path>.lock"); the first, killed by a
 * signal, leaves neither its outputs nor its lock files. Two runs used to
 * rename their sets into place in turn, so one's JSON could end beside
 * the other's CSV. */
Test(dp_bench, an_output_another_run_writes_is_refused, .timeout = 60)
{
    pid_t pid = spawn_bench(1, ARGS_("--steps", "100000000", "--json", "@a.json", "--csv",
                                     "@a.csv"), "first-");
    char lock[300];
    snprintf(lock, sizeof lock, "%s/a.csv.lock", tmpdir);
    struct stat sb;
    for (int i = 0; stat(lock, &sb) != 0 && i < 3000; i++) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    int locked = stat(lock, &sb) == 0;
    dp_test_result json = BENCH("--json", "@a.json");
    dp_test_result csv = BENCH("--csv", "@a.csv");
    kill(pid, SIGTERM); /* before any assertion: a failed test must not leave it timing */
    dp_test_result first = collect_bench(pid, "first-");
    cr_assert(locked, "the first run took no lock within 30 s; stderr:\n%s", first.err);
    char pid_words[64];
    snprintf(pid_words, sizeof pid_words, "(process %ld)", (long)pid);
    assert_fails_cleanly(&json, "--json");
    assert_fails_cleanly(&csv, "--csv");
    cr_assert(strstr(json.err, "is being written by another run") && strstr(json.err, pid_words),
              "stderr:\n%s", json.err);
    cr_assert(strstr(csv.err, "is being written by another run") && strstr(csv.err, pid_words),
              "stderr:\n%s", csv.err);
    cr_assert(WIFSIGNALED(first.status) && WTERMSIG(first.status) == SIGTERM,
              "status %d; stderr:\n%s", first.status, first.err);
    const char *const want[] = {"first-stdout.txt", "first-stderr.txt"};
    cr_assert_eq(expect_only(want, 2), 2);
    dp_test_result_free(&json);
    dp_test_result_free(&csv);
    dp_test_result_free(&first);
}

/* An existing output that dp_bench did not write (a text file at the
 * --json, --csv, --plot or --trace path) is refused before any step and
 * kept; its own outputs of an earlier run are replaced. */
Test(dp_bench, outputs_that_dp_bench_did_not_write_are_kept)
{
    static const char notes[] = "my notes\n";
    static const char *const flags[] = {"--json", "--csv", "--plot", "--trace"};
    static const char *const names[] = {"notes.json", "notes.csv", "notes.png", "notes.trace"};
    static const char *const what[] = {"dp_bench's JSON", "dp_bench's CSV", "a PNG or SVG plot",
                                       "a dp trace"};
    for (int i = 0; i < 4; i++) {
        char p[256], arg[64], words[96];
        snprintf(p, sizeof p, "%s/%s", tmpdir, names[i]);
        dp_test_write_file(p, notes, sizeof notes - 1);
        snprintf(arg, sizeof arg, "@%s", names[i]);
        dp_test_result r = BENCH(flags[i], arg);
        snprintf(words, sizeof words, "exists and is not %s", what[i]);
        assert_fails_cleanly(&r, words);
        cr_assert(strstr(r.err, flags[i]), "%s:\n%s", flags[i], r.err);
        cr_assert_str_empty(r.out, "%s: it ran:\n%s", flags[i], r.out);
        size_t len = 0;
        unsigned char *b = dp_test_read_file(p, &len);
        cr_assert(len == sizeof notes - 1 && memcmp(b, notes, len) == 0, "%s changed", names[i]);
        free(b);
        dp_test_result_free(&r);
    }
    for (int run = 0; run < 2; run++) { /* the second replaces the first's files */
        dp_test_result r = BENCH("--json", "@o.json", "--csv", "@o.csv", "--plot", "@o.svg",
                                 "--trace", "@o.trace");
        assert_success(&r);
        dp_test_result_free(&r);
    }
}

Test(dp_bench, plot_path_with_quotes_is_a_file_name)
{
    /* "bob's plot.png": exactly that file, no stray "bob". */
    dp_test_result r = BENCH("--plot", "@bob's plot.png");
    assert_success(&r);
    const char *want[] = {"bob's plot.png"};
    cr_assert_eq(expect_only(want, 1), 1);
    char p[256];
    snprintf(p, sizeof p, "%s/bob's plot.png", tmpdir);
    size_t n;
    unsigned char *png = dp_test_read_file(p, &n);
    cr_assert(n > 8 && memcmp(png, "\x89PNG", 4) == 0, "not a PNG");
    free(png);
    dp_test_result_free(&r);
}

Test(dp_bench, plot_path_cannot_run_gnuplot_commands)
{
    /* The issue's case: out/a'; system "touch out/X"; x='.png. Its directory
     * part does not exist, so it must fail cleanly, and nothing may run. */
    char out[128], arg[400], x[160];
    snprintf(out, sizeof out, "%s/out", tmpdir);
    cr_assert_eq(mkdir(out, 0755), 0);
    snprintf(arg, sizeof arg, "%s/a'; system \"touch %s/X\"; x='.png", out, out);
    snprintf(x, sizeof x, "%s/X", out);
    dp_test_result r = BENCH("--plot", arg);
    assert_fails_cleanly(&r, "does not exist");
    cr_assert_str_empty(r.out);
    struct stat sb;
    cr_assert_neq(stat(x, &sb), 0, "gnuplot ran the command in --plot");
    dp_test_result_free(&r);

    /* The same text where its directory part exists: the plot gets that
     * literal name and still nothing runs. */
    char dir[400];
    snprintf(dir, sizeof dir, "%s/a'; system \"touch %s", out, out);
    char mk[1024];
    snprintf(mk, sizeof mk, "mkdir -p '%s'", dir);
    for (char *c = mk + 10; *c; c++) /* the path holds one ' : make it shell-safe */
        if (*c == '\'' && c[1] != '\0') { memmove(c + 4, c + 1, strlen(c + 1) + 1); memcpy(c, "'\\''", 4); c += 3; }
    cr_assert_eq(system(mk), 0, "%s", mk);
    r = BENCH("--plot", arg);
    assert_success(&r);
    cr_assert_eq(stat(arg, &sb), 0, "the plot was not written under its literal name");
    cr_assert_neq(stat(x, &sb), 0, "gnuplot ran the command in --plot");
    dp_test_result_free(&r);
}

Test(dp_bench, scaling_plot_on_one_device_keeps_gnuplot_quiet)
{
    /* One device gives the scaling plot a single point: gnuplot used to warn
     * about an empty x range on our stdout. */
    dp_test_result r = BENCH("--devices", "cpu:1", "--scaling", "--plot", "@s.svg");
    assert_success(&r);
    cr_assert_null(strstr(r.out, "arning"), "gnuplot's output reached stdout:\n%s", r.out);
    cr_assert_str_empty(r.err);
    const char *want[] = {"s.svg", "s-scaling.svg"};
    cr_assert_eq(expect_only(want, 2), 2);
    dp_test_result_free(&r);
}

Test(dp_bench, outputs_are_written_all_or_none)
{
    /* A 12 KiB file size limit (inherited by dp_bench and gnuplot): the
     * JSON and CSV fit, the PNG does not, so the run fails after every step
     * and must leave neither the JSON nor the CSV nor a temporary file. */
    signal(SIGXFSZ, SIG_IGN); /* an ignored signal stays ignored across exec */
    struct rlimit lim;
    cr_assert_eq(getrlimit(RLIMIT_FSIZE, &lim), 0);
    lim.rlim_cur = 12 << 10;
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    dp_test_result r = BENCH("--json", "@o.json", "--csv", "@o.csv", "--plot", "@o.png");
    assert_fails_cleanly(&r, "--plot");
    cr_assert(strstr(r.out, "root peak gather / balanced"), "failed before the steps:\n%s", r.out);
    cr_assert_eq(expect_only(NULL, 0), 0, "a failed run left files behind");
    dp_test_result_free(&r);
}

// --- --find-max-batch from any start ---------------------------------------------------

static void max_batches(const char *start, const char *limit, json_int_t out[2], json_int_t rows[2])
{
    dp_test_result r = BENCH("--memory-limit", limit, "--find-max-batch", "--batch-size", start,
                             "--json", "@m.json");
    assert_success(&r);
    json_t *j = load_json("m.json");
    const char *modes[2] = {"gather", "balanced"};
    for (int m = 0; m < 2; m++) {
        json_t *res = mode_result(j, modes[m]);
        out[m] = int_at(res, "max_batch");
        rows[m] = int_at(res, "batch_size");
    }
    json_decref(j);
    dp_test_result_free(&r);
}

Test(dp_bench, find_max_batch_from_any_start)
{
    /* 600 kB per device: the largest batches are a few tens of rows. From
     * a start that fits (8), one far above the answer (500) and one below
     * it (2), the search gives the same answer; each mode is then timed at
     * the smaller of --batch-size and its answer. */
    json_int_t m8[2], m500[2], m2[2], r8[2], r500[2], r2[2];
    max_batches("8", "600kB", m8, r8);
    max_batches("500", "600kB", m500, r500);
    max_batches("2", "600kB", m2, r2);
    cr_assert(m8[0] >= 2 && m8[1] > m8[0], "gather %lld balanced %lld", (long long)m8[0],
              (long long)m8[1]);
    for (int m = 0; m < 2; m++) {
        cr_assert_eq(m500[m], m8[m], "start 500: %lld, start 8: %lld", (long long)m500[m],
                     (long long)m8[m]);
        cr_assert_eq(m2[m], m8[m], "start 2: %lld, start 8: %lld", (long long)m2[m],
                     (long long)m8[m]);
        cr_assert_eq(r8[m], 8);
        cr_assert_eq(r500[m], m500[m], "timed at the largest batch that fits");
    }
}

Test(dp_bench, find_max_batch_reports_zero_when_nothing_fits)
{
    /* 20 kB cannot hold the model's parameters: not even one sequence. */
    dp_test_result r = BENCH("--memory-limit", "20kB", "--find-max-batch", "--json", "@z.json");
    assert_success(&r);
    cr_assert(strstr(r.out, "gather: not even 1 sequence fits under --memory-limit 20kB: ") &&
                  strstr(r.out, "would pass the memory limit"),
              "%s", r.out);
    cr_assert(strstr(r.out, "gather 0  balanced 0"), "%s", r.out);
    json_t *j = load_json("z.json");
    cr_assert_eq(json_array_size(json_object_get(j, "results")), 0);
    json_decref(j);
    dp_test_result_free(&r);
}

// --- --device-weights, --token-balanced, --trace ------------------------------------

Test(dp_bench, device_weights_token_balanced_and_trace)
{
    dp_test_result r = BENCH("--device-weights", "1,3", "--token-balanced", "--json", "@w.json",
                             "--trace", "@t.json");
    assert_success(&r);
    json_t *j = load_json("w.json");
    json_t *cfg = json_object_get(j, "config");
    cr_assert(json_is_true(json_object_get(cfg, "token_balanced")));
    json_t *w = json_object_get(cfg, "device_weights");
    cr_assert(json_array_size(w) == 2 && json_number_value(json_array_get(w, 1)) == 3.0);
    const char *modes[2] = {"gather", "balanced"};
    for (int m = 0; m < 2; m++) {
        json_t *devs = json_object_get(mode_result(j, modes[m]), "devices");
        /* 8 rows weighted 1:3 */
        cr_assert_eq(int_at(json_array_get(devs, 0), "rows"), 2, "%s", modes[m]);
        cr_assert_eq(int_at(json_array_get(devs, 1), "rows"), 6, "%s", modes[m]);
    }
    json_decref(j);

    /* The trace: one track per device, named after it; every event on one. */
    json_t *t = load_json("t.json");
    json_t *ev = json_object_get(t, "traceEvents"), *e;
    size_t i, tracks = 0;
    json_array_foreach(ev, i, e) {
        json_int_t tid = json_integer_value(json_object_get(e, "tid"));
        cr_assert(tid >= 0 && tid < 2, "event %zu on track %lld", i, (long long)tid);
        if (strcmp(json_string_value(json_object_get(e, "name")), "thread_name") == 0) {
            char want[16];
            snprintf(want, sizeof want, "cpu:%lld", (long long)tid);
            cr_assert_str_eq(
                json_string_value(json_object_get(json_object_get(e, "args"), "name")), want);
            tracks++;
        }
    }
    cr_assert_eq(tracks, 2);
    /* Spans from the engine's phase timing: every phase of the step appears
     * on both tracks (both devices run every phase), the forward equally
     * often (once a step; the reduce-scatter's pieces differ by device). */
    size_t spans[2][DP_PHASE_COUNT] = {{0}};
    json_array_foreach(ev, i, e) {
        if (strcmp(json_string_value(json_object_get(e, "ph")), "X") != 0) continue;
        json_int_t tid = json_integer_value(json_object_get(e, "tid"));
        const char *name = json_string_value(json_object_get(e, "name"));
        int p = 0;
        while (p < DP_PHASE_COUNT && strcmp(name, dp_phase_name((dp_phase)p)) != 0) p++;
        cr_assert(p < DP_PHASE_COUNT, "event %zu is no phase: %s", i, name);
        cr_assert(json_number_value(json_object_get(e, "dur")) >= 0);
        spans[tid][p]++;
    }
    for (int p = 0; p < DP_PHASE_COUNT; p++) {
        cr_assert_gt(spans[0][p], 0, "no %s span on cpu:0", dp_phase_name((dp_phase)p));
        cr_assert_gt(spans[1][p], 0, "no %s span on cpu:1", dp_phase_name((dp_phase)p));
    }
    cr_assert_eq(spans[0][DP_PHASE_FORWARD], spans[1][DP_PHASE_FORWARD],
                 "forward: %zu spans on cpu:0, %zu on cpu:1", spans[0][DP_PHASE_FORWARD],
                 spans[1][DP_PHASE_FORWARD]);
    json_decref(t);
    dp_test_result_free(&r);
}

/* A stand-in gnuplot in tmpdir/bin, alone on PATH: it answers --version
 * as gnuplot 5.4, and otherwise runs body (shell lines). */
static void fake_gnuplot(const char *body)
{
    char bin[300], fake[320];
    snprintf(bin, sizeof bin, "%s/bin", tmpdir);
    cr_assert_eq(mkdir(bin, 0755), 0);
    snprintf(fake, sizeof fake, "%s/gnuplot", bin);
    char script[1024];
    int n = snprintf(script, sizeof script,
                     "#!/bin/sh\n"
                     "case \"$*\" in *--version*) echo gnuplot 5.4; exit 0;; esac\n%s", body);
    cr_assert(n > 0 && (size_t)n < sizeof script);
    dp_test_write_file(fake, script, (size_t)n);
    cr_assert_eq(chmod(fake, 0755), 0);
    setenv("PATH", bin, 1);
}

/* A fatal signal while the outputs are staged (here from a gnuplot that
 * signals dp_bench as it draws) removes the staged --json and --csv
 * files and gnuplot's private directory, and says so. */
Test(dp_bench, a_signal_while_plotting_leaves_no_staged_file, .timeout = 60)
{
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s/tmp", tmpdir);
    cr_assert_eq(mkdir(tmp, 0755), 0);
    fake_gnuplot("kill -INT $PPID\nexit 1\n");
    setenv("TMPDIR", tmp, 1);
    dp_test_result r = BENCH("--json", "@s.json", "--csv", "@s.csv", "--plot", "@s.png");
    cr_assert(WIFSIGNALED(r.status) && WTERMSIG(r.status) == SIGINT, "status %d; stderr:\n%s",
              r.status, r.err);
    cr_assert(strstr(r.err, "dp_bench: stopped by a signal; its outputs were left as they were"),
              "stderr:\n%s", r.err);
    const char *const want[] = {"bin", "tmp"};
    cr_assert_eq(expect_only(want, 2), 2);
    DIR *d = opendir(tmp);
    struct dirent *de;
    while ((de = readdir(d)))
        cr_assert(de->d_name[0] == '.', "gnuplot's directory %s was left", de->d_name);
    closedir(d);
    dp_test_result_free(&r);
}

/* The trace is staged with the other outputs: when one of them cannot be
 * renamed into place (here --json's path became a directory while a
 * stand-in gnuplot drew), none appears, the trace included. It used to be
 * written by itself before the others were renamed, and stayed. */
Test(dp_bench, the_trace_appears_with_the_other_outputs_or_not_at_all, .timeout = 60)
{
    char json[300];
    snprintf(json, sizeof json, "%s/s.json", tmpdir);
    fake_gnuplot("/bin/mkdir \"$DP_TEST_BLOCKED\"\nprintf '<svg></svg>\\n' > plot.svg\n");
    setenv("DP_TEST_BLOCKED", json, 1);
    dp_test_result r = BENCH("--json", "@s.json", "--plot", "@s.svg", "--trace", "@t.json");
    unsetenv("DP_TEST_BLOCKED");
    assert_fails_cleanly(&r, "--json");
    const char *const want[] = {"bin", "s.json"};
    cr_assert_eq(expect_only(want, 2), 2);
    struct stat sb;
    cr_assert(stat(json, &sb) == 0 && S_ISDIR(sb.st_mode), "s.json is not the directory");
    dp_test_result_free(&r);
}

/* A gnuplot killed by a signal (a file size limit's SIGXFSZ; here one it
 * sends itself) is named with the signal, not "no message". */
Test(dp_bench, a_gnuplot_killed_by_a_signal_is_named, .timeout = 60)
{
    fake_gnuplot("kill -XFSZ $$\n");
    dp_test_result r = BENCH("--plot", "@p.png");
    assert_fails_cleanly(&r, "--plot: gnuplot was killed by signal 25");
    cr_assert(strstr(r.err, "ulimit -f"), "stderr:\n%s", r.err);
    const char *const want[] = {"bin"};
    cr_assert_eq(expect_only(want, 1), 1);
    dp_test_result_free(&r);
}

Test(dp_bench, plot_without_gnuplot_fails_before_the_first_step)
{
    /* No gnuplot in PATH (dp_bench itself is started by its full path). */
    setenv("PATH", tmpdir, 1);
    dp_test_result r = BENCH("--json", "@g.json", "--plot", "@g.png");
    assert_fails_cleanly(&r, "gnuplot");
    cr_assert_str_empty(r.out, "started work without gnuplot:\n%s", r.out);
    cr_assert_eq(expect_only(NULL, 0), 0, "a failed run left files behind");
    dp_test_result_free(&r);
}
