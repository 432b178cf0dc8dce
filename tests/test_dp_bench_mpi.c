/*
 * dp_bench under an MPI launcher: the built binary (DP_BENCH_PATH) is
 * started by mpiexec (MPIEXEC_PATH, CMake's FindMPI) with 2 ranks on a
 * tiny GPT, and compared with one process.
 *
 *  - 2 ranks x cpu:1 time the balanced runs (root and --shard-optimizer)
 *    with the loss of one process on cpu:2, bitwise (JSON reals have 17
 *    digits); rank 0 alone prints (one table) and writes --json, --csv and
 *    --trace (both ranks' tracks, gathered); gather mode is skipped with
 *    one line; every row carries ranks 2, devices_per_rank 1 and the
 *    bytes rank 0 sent per step: the
 *    parameters' all-gather (n_params x 4 bytes to the one other rank) and
 *    a few kB of statuses;
 *  - --scaling reports 2 x 1 and 2 x 2 devices; --find-max-batch searches
 *    on every rank alike;
 *  - a command line every rank refuses (--mode gather) and an output path
 *    rank 0 cannot write give one message, from rank 0, and exit non-zero;
 *  - ranks started with different options fail at once, both naming the
 *    first that differs; an alias of an option is the same option.
 *
 * Open MPI's environment: running as root allowed, oversubscription (more
 * ranks than cores) allowed.
 */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dp_test.h"
#include "dp_test_json.h"
#include "dp_test_fs.h"
#include "dp_test_spawn.h"

#ifndef DP_BENCH_PATH
#error "DP_BENCH_PATH (the dp_bench binary) must be defined by the build"
#endif
#ifndef MPIEXEC_PATH
#error "MPIEXEC_PATH (CMake's MPIEXEC_EXECUTABLE) must be defined by the build"
#endif

static char tmpdir[64];

static void setup(void)
{
    if (access(MPIEXEC_PATH, X_OK) != 0) cr_skip_test("mpiexec not found at " MPIEXEC_PATH);
    strcpy(tmpdir, "/tmp/dp_test_bench_mpi_XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp failed");
    dp_test_mpi_env();
}

static void teardown(void)
{
    if (tmpdir[0]) dp_test_remove_tree(tmpdir);
}

TestSuite(dp_bench_mpi, .init = setup, .fini = teardown, .timeout = 120);

/* V=64, T=16, B=8, C=16, L=1, NH=2 (test_dp_bench's model). */
static const char *const BASE[] = {"--vocab", "64", "--context", "16", "--batch-size", "8",
                                   "--dim",   "16", "--layers",  "1",  "--heads",      "2",
                                   "--steps", "2",  "--warmup",  "1"};
#define N_BASE (sizeof BASE / sizeof BASE[0])

/* Runs argv[0..argc) (then freed), stdout and stderr read back from
 * tmpdir. */
static dp_test_result run_argv(char **argv, size_t argc)
{
    char out[256], err[256];
    snprintf(out, sizeof out, "%s/stdout.txt", tmpdir);
    snprintf(err, sizeof err, "%s/stderr.txt", tmpdir);
    dp_test_result r = dp_test_collect(dp_test_spawn(argv, out, err), out, err);
    dp_test_argv_free(argv, argc);
    return r;
}

/* dp_bench with BASE then args, under `mpiexec -n ranks` when ranks > 0;
 * '@x' is tmpdir/x. */
static dp_test_result run_bench(int ranks, const char *const *args, size_t n)
{
    char *argv[64];
    return run_argv(argv, dp_test_argv(argv, 64, ranks, MPIEXEC_PATH, DP_BENCH_PATH, BASE, N_BASE,
                                       args, n, tmpdir));
}

#define ARGS_(...)                                                                         \
    (const char *const[]){__VA_ARGS__},                                                    \
        sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *)
/* BENCH(ranks, args...): ranks 0 = one process, without mpiexec. */
#define BENCH(ranks, ...) run_bench((ranks), ARGS_(__VA_ARGS__))

static json_t *load_json(const char *name) { return dp_test_load_json(tmpdir, name); }
#define int_at dp_test_int_at

static double real_at(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    cr_assert(json_is_real(v), "\"%s\" is missing or not a number", key);
    return json_real_value(v);
}

/* The results row of mode with or without the sharded optimizer; NULL if none. */
static json_t *row(json_t *root, const char *mode, int shard)
{
    json_t *res = json_object_get(root, "results"), *r;
    size_t i;
    json_array_foreach(res, i, r)
    {
        if (strcmp(json_string_value(json_object_get(r, "mode")), mode) == 0 &&
            json_is_true(json_object_get(r, "shard_optimizer")) == shard)
            return r;
    }
    return NULL;
}

static int exists(const char *name)
{
    char p[256];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    return stat(p, &sb) == 0;
}

// --- ranks time what one process times ------------------------------------------------

Test(dp_bench_mpi, two_ranks_balanced_loss_equals_one_process_bitwise)
{
    dp_test_result a = BENCH(2, "--devices", "cpu:1", "--shard-optimizer", "--json", "@a.json",
                             "--csv", "@a.csv", "--trace", "@a.trace");
    dp_test_assert_success(&a, "mpiexec -n 2 dp_bench --devices cpu:1");
    dp_test_result b = BENCH(0, "--devices", "cpu:2", "--shard-optimizer", "--json", "@b.json");
    dp_test_assert_success(&b, "dp_bench --devices cpu:2");

    /* Rank 0 alone prints: one header, one table; gather skipped in one line. */
    cr_assert_eq(dp_test_count(a.out, "dp_bench: GPT"), 1, "stdout:\n%s", a.out);
    cr_assert_eq(dp_test_count(a.out, "(step ms: median"), 1, "stdout:\n%s", a.out);
    cr_assert_eq(dp_test_count(a.out, "phase ms"), 1, "stdout:\n%s", a.out);
    cr_assert_eq(dp_test_count(a.out, "gather mode: skipped across ranks (it reproduces one process's "
                              "DataParallel)\n"),
                 1, "stdout:\n%s", a.out);
    cr_assert(strstr(a.out, "on 2 ranks x cpu:1 (2 devices)"), "stdout:\n%s", a.out);
    cr_assert_eq(dp_test_count(a.err, "dp_bench"), 0, "stderr:\n%s", a.err);
    cr_assert(exists("a.csv") && exists("a.trace"));
    /* The trace holds both ranks (rank 0 gathered rank 1's steps): a
     * process each, named, with its device's track and its exchanges', a
     * forward per timed step (2 runs x (warm-up + timed) steps) on each. */
    json_t *tr = load_json("a.trace");
    for (int r = 0; r < 2; r++) {
        dp_test_trace_assert_rank(tr, r, "cpu:0");
        size_t fw = dp_test_trace_events(tr, r + 1, 0, "forward");
        cr_assert_eq(fw, 2 * (1 + 2), "rank %d: %zu forward events", r, fw);
    }
    cr_assert_eq(dp_test_trace_events(tr, 3, -1, "forward"), 0, "a third process");
    json_decref(tr);

    json_t *ja = load_json("a.json"), *jb = load_json("b.json");
    size_t n_params = (size_t)int_at(json_object_get(ja, "config"), "n_params");
    cr_assert_eq(int_at(json_object_get(ja, "config"), "ranks"), 2);
    cr_assert_eq(json_array_size(json_object_get(ja, "results")), 2, "balanced, balanced+shard");
    cr_assert_null(row(ja, "gather", 0), "gather ran across ranks");
    double want = real_at(row(jb, "balanced", 0), "loss");
    for (int shard = 0; shard <= 1; shard++) {
        json_t *r = row(ja, "balanced", shard);
        cr_assert_not_null(r, "no balanced%s row", shard ? "+shard" : "");
        cr_assert_eq(int_at(r, "ranks"), 2);
        cr_assert_eq(int_at(r, "devices_per_rank"), 1);
        cr_assert_eq(json_array_size(json_object_get(r, "devices")), 1, "rank 0's device");
        double loss = real_at(r, "loss");
        cr_assert(loss == want, "balanced%s loss %.17g under 2 ranks, %.17g in one process",
                  shard ? "+shard" : "", loss, want);
        /* Rank 0 sends the parameters it owns to the other rank and its
         * share of the gradient of the slice summed there (the second
         * half): in root mode all the parameters (the all-gather) and half
         * its gradient (rank 1 sums the second slice and returns the sum),
         * with the sharded optimizer half its gradient and half the
         * parameters; plus each sync point's status (a few kB). The halves
         * are cut on 64-float boundaries. */
        size_t sent = (size_t)int_at(r, "bytes_sent_per_step");
        size_t expect = shard ? n_params * 4 : n_params * 6;
        cr_assert(sent + 256 > expect && sent < expect + 256 + 8192,
                  "balanced%s: %zu bytes sent per step for %zu parameters (expected about %zu)",
                  shard ? "+shard" : "", sent, n_params, expect);
    }
    /* One process: ranks 1, its devices, nothing sent. */
    for (int shard = 0; shard <= 1; shard++) {
        json_t *r = row(jb, "balanced", shard);
        cr_assert_eq(int_at(r, "ranks"), 1);
        cr_assert_eq(int_at(r, "devices_per_rank"), 2);
        cr_assert_eq(int_at(r, "bytes_sent_per_step"), 0);
    }
    cr_assert_not_null(row(jb, "gather", 0));
    json_decref(ja);
    json_decref(jb);
    dp_test_result_free(&a);
    dp_test_result_free(&b);
}

Test(dp_bench_mpi, scaling_reports_ranks_times_local_devices)
{
    dp_test_result r = BENCH(2, "--devices", "cpu:2", "--mode", "balanced", "--scaling", "--json",
                             "@s.json");
    dp_test_assert_success(&r, "mpiexec -n 2 dp_bench --devices cpu:2 --scaling");
    cr_assert(strstr(r.out, "2 x 1") && strstr(r.out, "2 x 2"), "stdout:\n%s", r.out);
    json_t *j = load_json("s.json");
    json_t *pts = json_object_get(json_object_get(j, "scaling"), "points");
    cr_assert_eq(json_array_size(pts), 2, "2 x 1 and 2 x 2");
    for (size_t i = 0; i < 2; i++) {
        json_t *p = json_array_get(pts, i);
        cr_assert_eq(int_at(p, "ranks"), 2);
        cr_assert_eq(int_at(p, "devices_per_rank"), (json_int_t)i + 1);
        cr_assert_eq(int_at(p, "devices"), 2 * ((json_int_t)i + 1));
        cr_assert_gt(int_at(p, "bytes_sent_per_step"), 0);
    }
    json_t *b = row(j, "balanced", 0);
    cr_assert_eq(int_at(b, "devices_per_rank"), 2);
    cr_assert_eq(json_array_size(json_object_get(b, "devices")), 2, "rank 0's devices");
    json_decref(j);
    dp_test_result_free(&r);
}

Test(dp_bench_mpi, find_max_batch_searches_on_every_rank_alike)
{
    dp_test_result r = BENCH(2, "--devices", "cpu:1", "--mode", "balanced", "--memory-limit",
                             "600kB", "--find-max-batch", "--json", "@f.json");
    dp_test_assert_success(&r, "mpiexec -n 2 dp_bench --find-max-batch");
    cr_assert_eq(dp_test_count(r.out, "largest global batch"), 1, "stdout:\n%s", r.out);
    json_t *j = load_json("f.json");
    cr_assert_gt(int_at(row(j, "balanced", 0), "max_batch"), 1);
    json_decref(j);
    dp_test_result_free(&r);
}

// --- refusals: one message, from rank 0 ---------------------------------------------------

Test(dp_bench_mpi, gather_mode_alone_is_refused_once)
{
    dp_test_result r = BENCH(2, "--devices", "cpu:1", "--mode", "gather", "--json", "@g.json");
    cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) != 0, "stderr:\n%s", r.err);
    cr_assert_eq(dp_test_count(r.err, "dp_bench: rank 0: --mode gather: gather mode cannot span ranks"),
                 1, "stderr:\n%s", r.err);
    cr_assert_eq(dp_test_count(r.err, "dp_bench: rank 1"), 0, "stderr:\n%s", r.err);
    cr_assert(!exists("g.json"));
    dp_test_result_free(&r);
}

Test(dp_bench_mpi, unwritable_output_fails_before_the_first_step)
{
    dp_test_result r = BENCH(2, "--devices", "cpu:1", "--json", "@nodir/x.json");
    cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) != 0, "stderr:\n%s", r.err);
    cr_assert_eq(dp_test_count(r.err, "dp_bench: rank 0: --json: cannot write"), 1, "stderr:\n%s", r.err);
    cr_assert_eq(dp_test_count(r.err, "dp_bench: rank 1"), 0, "stderr:\n%s", r.err);
    cr_assert_eq(dp_test_count(r.out, "step ms"), 0, "stdout:\n%s", r.out);
    dp_test_result_free(&r);
}

// --- ranks started differently ------------------------------------------------------------

/* dp_bench with BASE then a[] on rank 0 and BASE then b[] on rank 1. */
static dp_test_result run_mpmd(const char *const *a, size_t na, const char *const *b, size_t nb)
{
    char *argv[2 * N_BASE + 40];
    const dp_test_rank_cmd rk[2] = {{NULL, 0, a, na}, {NULL, 0, b, nb}};
    return run_argv(argv, dp_test_argv_mpmd(argv, 2 * N_BASE + 40, MPIEXEC_PATH, DP_BENCH_PATH,
                                            BASE, N_BASE, rk, tmpdir));
}

/* Both ranks fail naming the first option that differs, before any step. */
static void assert_both_refuse(const dp_test_result *r, const char *needle)
{
    cr_assert(WIFEXITED(r->status) && WEXITSTATUS(r->status) != 0, "stderr:\n%s", r->err);
    cr_assert(strstr(r->err, needle), "stderr lacks \"%s\":\n%s", needle, r->err);
    for (int k = 0; k < 2; k++) {
        char who[96];
        snprintf(who, sizeof who, "dp_bench: rank %d: rank 1's options differ from rank 0's: ", k);
        cr_assert_eq(dp_test_count(r->err, who), 1, "rank %d's line:\n%s", k, r->err);
    }
    cr_assert_null(strstr(r->out, "step ms"), "stdout:\n%s", r->out);
}

/* The cases that hung (--shard-optimizer on one rank) or ended in Open
 * MPI's "MPI Error in NBC subrequest" (--steps 1 against 2); an alias
 * (--vocab for --vocab-size) is the same option. */
Test(dp_bench_mpi, ranks_started_differently_fail_at_once)
{
    const char *one[] = {"--devices", "cpu:1", "--mode", "balanced"};
    const char *shard[] = {"--devices", "cpu:1", "--mode", "balanced", "--shard-optimizer"};
    dp_test_result r = run_mpmd(one, 4, shard, 5);
    assert_both_refuse(&r, "--shard-optimizer is given on rank 1, not on rank 0");
    dp_test_result_free(&r);
    const char *steps1[] = {"--devices", "cpu:1", "--mode", "balanced", "--steps", "1"};
    r = run_mpmd(steps1, 6, one, 4);
    assert_both_refuse(&r, "--steps is 2 on rank 1, 1 on rank 0");
    dp_test_result_free(&r);
    const char *alias[] = {"--devices", "cpu:1", "--mode", "balanced", "--vocab-size", "64"};
    r = run_mpmd(one, 4, alias, 6);
    dp_test_assert_success(&r, "--vocab 64 on rank 0, --vocab-size 64 on rank 1");
    cr_assert_eq(dp_test_count(r.out, "(step ms: median"), 1, "stdout:\n%s", r.out);
    dp_test_result_free(&r);
}
