/*
 * dp_bench as a user runs it (DP_BENCH_PATH, a compile definition), on a
 * tiny GPT on cpu:2:
 *  - the JSON has the fixed field names, both modes, every device, and
 *    logits bytes equal to the arithmetic of the engine's buffers;
 *  - gather's root peak exceeds balanced's, balanced is symmetric without
 *    the optimizer state; --find-max-batch gives balanced >= gather;
 *  - CSV and both plots are written; --scaling reports 1..k devices;
 *  - bad command lines exit non-zero with one "dp_bench: ..." line on
 *    stderr and leave no output file.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dp_test.h"
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

/* dp_bench with BASE (when with_base) then args; '@x' is tmpdir/x. */
static dp_test_result run_bench(int with_base, const char *const *args, size_t n)
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
    snprintf(out, sizeof out, "%s/stdout.txt", tmpdir);
    snprintf(err, sizeof err, "%s/stderr.txt", tmpdir);
    dp_test_result r = dp_test_collect(dp_test_spawn(argv, out, err), out, err);
    for (size_t i = 0; i < argc; i++) free(argv[i]);
    return r;
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

static json_t *load_json(const char *name)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je);
    cr_assert_not_null(j, "%s: %s (line %d)", p, je.text, je.line);
    return j;
}

static json_int_t int_at(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    cr_assert(json_is_integer(v), "\"%s\" is missing or not an integer", key);
    return json_integer_value(v);
}

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

// --- bad command lines ----------------------------------------------------------------

typedef struct bad_case {
    char name[48];
    char args[8][40]; /* after BASE; "" ends the list */
    char needle[48];
} bad_case;

static bad_case bad_cases[] = {
    {"batch-size 0", {"--batch-size", "0"}, "--batch-size"},
    {"batch-size -2", {"--batch-size", "-2"}, "--batch-size"},
    {"batch-size abc", {"--batch-size", "abc"}, "--batch-size"},
    {"batch-size huge", {"--batch-size", "99999999999999999999"}, "--batch-size"},
    {"batch smaller than devices", {"--batch-size", "1"}, "smaller than the 2 devices"},
    {"heads not dividing dim", {"--heads", "3"}, "--heads 3"},
    {"unknown mode", {"--mode", "fast"}, "fast"},
    {"duplicate devices", {"--devices", "cpu:0,0"}, "cpu:0,0"},
    {"unknown device kind", {"--devices", "tpu:0"}, "tpu"},
    {"memory-limit 12XB", {"--memory-limit", "12XB"}, "12XB"},
    {"memory limit too small", {"--memory-limit", "1KiB"}, "limit"},
    {"find-max-batch without limit", {"--find-max-batch"}, "--memory-limit"},
    {"plot as jpg", {"--plot", "@p.jpg"}, ".png or .svg"},
    {"json in a missing directory", {"--json", "@nodir/b.json"}, "nodir"},
    {"unknown option", {"--frobnicate"}, "--frobnicate"},
    {"option without its value", {"--steps"}, "--steps needs a value"},
    {"steps 0", {"--steps", "0"}, "--steps"},
    {"context malformed", {"--context", "12x"}, "--context"},
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
    cr_assert_neq(WEXITSTATUS(r.status), 0, "%s: exit status 0; stdout:\n%s", bc->name, r.out);
    size_t lines = 0, len = strlen(r.err);
    for (const char *p = r.err; *p; p++) lines += *p == '\n';
    cr_assert(lines == 1 && len > 0 && r.err[len - 1] == '\n',
              "%s: want exactly one line on stderr, got %zu:\n%s", bc->name, lines, r.err);
    cr_assert_eq(strncmp(r.err, "dp_bench: ", 10), 0, "%s: %s", bc->name, r.err);
    cr_assert(strstr(r.err, bc->needle), "%s: stderr does not mention \"%s\": %s", bc->name,
              bc->needle, r.err);
    DIR *d = opendir(tmpdir);
    struct dirent *de;
    while ((de = readdir(d)))
        cr_assert(de->d_name[0] == '.' || strstr(de->d_name, ".txt"),
                  "%s: left %s behind", bc->name, de->d_name);
    closedir(d);
    dp_test_result_free(&r);
}
