/*
 * The small programs' command lines and standard output (the benches,
 * the two embedding examples, and lm_train's and dp_tokenize's --help),
 * as a user runs them (the built binaries): a figure or a help text that cannot reach
 * standard output (/dev/full, a reader that quits) fails the program
 * with one line naming it, never exit 0; gemm_bench's and attention_bench's values are parsed
 * strictly (junk, zero, negative and absurd sizes refused with a message);
 * token_data_bench takes --help, strict TOKENS, and never overwrites a
 * train.bin it did not write.
 */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dp_test.h"
#include "dp_test_fs.h"
#include "dp_test_spawn.h"

#if !defined(GEMM_BENCH_PATH) || !defined(ATTENTION_BENCH_PATH) ||                         \
    !defined(TOKEN_DATA_BENCH_PATH) || !defined(LM_TRAIN_PATH) || !defined(DP_TOKENIZE_PATH) || \
    !defined(MLP_CLASSIFIER_PATH) || !defined(REGRESSION_PATH)
#error "the programs' paths must be defined by the build"
#endif

static char tmpdir[64];

static void setup(void)
{
    strcpy(tmpdir, "/tmp/dp_test_tools_XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
}

static void teardown(void) { dp_test_remove_tree(tmpdir); }

TestSuite(tools, .init = setup, .fini = teardown, .timeout = 60);

/* prog with args[0..n) ('@name': tmpdir/name), stdout to out_path. */
static dp_test_result run_to(const char *prog, const char *const *args, size_t n,
                             const char *out_path)
{
    char *argv[32], err[256], out[256];
    size_t argc = dp_test_argv(argv, 32, 0, NULL, prog, args, n, NULL, 0, tmpdir);
    snprintf(err, sizeof err, "%s/stderr.txt", tmpdir);
    snprintf(out, sizeof out, "%s/stdout.txt", tmpdir);
    dp_test_result r = dp_test_collect_err(dp_test_spawn(argv, out_path ? out_path : out, err),
                                           err);
    dp_test_argv_free(argv, argc);
    return r;
}

#define RUN_TO(prog, out, ...)                                                             \
    run_to(prog, (const char *const[]){__VA_ARGS__},                                       \
           sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *), out)

/* Exit status `code` with one stderr line holding needle. */
static void assert_fails(const dp_test_result *r, int code, const char *needle)
{
    cr_assert(WIFEXITED(r->status) && WEXITSTATUS(r->status) == code,
              "status %d (want exit %d); stderr:\n%s", r->status, code, r->err);
    cr_assert(strstr(r->err, needle) && dp_test_count(r->err, "\n") == 1,
              "want one line with \"%s\":\n%s", needle, r->err);
}

Test(tools, a_full_standard_output_fails_every_program)
{
    dp_test_result a = RUN_TO(GEMM_BENCH_PATH, "/dev/full", "--size", "32", "--reps", "1");
    assert_fails(&a, 1, "gemm_bench: cannot write the figures to standard output");
    dp_test_result_free(&a);
    dp_test_result b = RUN_TO(ATTENTION_BENCH_PATH, "/dev/full", "--shape", "1,16,16,2",
                              "--reps", "1");
    assert_fails(&b, 1, "attention_bench: cannot write the figures to standard output");
    dp_test_result_free(&b);
    dp_test_result c = RUN_TO(MLP_CLASSIFIER_PATH, "/dev/full", "--steps", "200");
    assert_fails(&c, 1, "mlp_classifier: cannot write standard output");
    dp_test_result_free(&c);
    dp_test_result d = RUN_TO(REGRESSION_PATH, "/dev/full", "--steps", "300");
    assert_fails(&d, 1, "regression: cannot write standard output");
    dp_test_result_free(&d);
    const char *progs[] = {GEMM_BENCH_PATH, ATTENTION_BENCH_PATH, TOKEN_DATA_BENCH_PATH,
                           LM_TRAIN_PATH,   DP_TOKENIZE_PATH,     MLP_CLASSIFIER_PATH,
                           REGRESSION_PATH, DP_BENCH_PATH};
    for (size_t i = 0; i < sizeof progs / sizeof progs[0]; i++) {
        /* the reason, not stdio's bare flag ("an earlier write failed"):
         * the help is longer than stdio's buffer in lm_train and dp_bench */
        dp_test_result h = RUN_TO(progs[i], "/dev/full", "--help");
        assert_fails(&h, 1, "standard output: No space left on device");
        dp_test_result_free(&h);
        dp_test_result ok = RUN_TO(progs[i], NULL, "--help");
        dp_test_assert_success(&ok, "--help to a file");
        dp_test_result_free(&ok);
    }
}

/* prog with args[0..n) ('@name': tmpdir/name), its stdout a pipe whose
 * reader has quit before the program starts: every write to it fails. */
static dp_test_result run_into_closed_pipe(const char *prog, const char *const *args, size_t n)
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    close(fds[0]);
    char *argv[32], err[256];
    size_t argc = dp_test_argv(argv, 32, 0, NULL, prog, args, n, NULL, 0, tmpdir);
    snprintf(err, sizeof err, "%s/stderr.txt", tmpdir);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_addopen(&fa, 2, err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    pid_t pid;
    int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    dp_test_argv_free(argv, argc);
    cr_assert_eq(rc, 0, "cannot run %s: %s", prog, strerror(rc));
    return dp_test_collect_err(pid, err);
}

/* A reader that quits (| head): the write fails with EPIPE and the program
 * exits 1 naming it; they died of SIGPIPE, status 141 without a word.
 * dp_bench's --json is not written then either: the run failed. */
Test(tools, a_reader_that_quits_fails_every_program)
{
    char json[128];
    snprintf(json, sizeof json, "%s/r.json", tmpdir);
    static const struct {
        const char *prog, *args[16];
    } cases[] = {
        {GEMM_BENCH_PATH, {"--size", "32", "--reps", "1"}},
        {ATTENTION_BENCH_PATH, {"--shape", "1,16,16,2", "--reps", "1"}},
        {MLP_CLASSIFIER_PATH, {"--steps", "200"}},
        {REGRESSION_PATH, {"--steps", "300"}},
        {DP_BENCH_PATH, {"--vocab-size", "64", "--context", "8", "--batch-size", "4", "--dim",
                         "16", "--layers", "1", "--heads", "2", "--steps", "1", "--json",
                         "@r.json"}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t n = 0;
        while (n < 16 && cases[c].args[n]) n++;
        dp_test_result r = run_into_closed_pipe(cases[c].prog, cases[c].args, n);
        cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 1, "%s: status %d; stderr:\n%s",
                  cases[c].prog, r.status, r.err);
        cr_assert(strstr(r.err, "standard output: Broken pipe"), "%s: stderr:\n%s",
                  cases[c].prog, r.err);
        dp_test_result_free(&r);
    }
    cr_assert_neq(access(json, F_OK), 0, "dp_bench wrote --json though its run failed");
}

Test(tools, values_are_parsed_strictly)
{
    static const char *const bad[][3] = {
        {"--shape", "-1,2,2,1", "--shape: \"-1\""},
        {"--shape", "1,2,4,2x", "--shape: \"2x\""},
        {"--shape", "99999999999,2,2,1", "--shape: \"99999999999\""},
        {"--shape", "1,2,3", "four numbers"},
        {"--shape", "1,2,5,2", "does not divide"},
        {"--chunk", "0", "--chunk: \"0\""},
        {"--chunk", "99999999999999999999", "--chunk"},
        {"--reps", "0", "--reps: \"0\""},
        {"--warmup", "-1", "--warmup: \"-1\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dp_test_result r = RUN_TO(ATTENTION_BENCH_PATH, NULL, bad[i][0], bad[i][1]);
        assert_fails(&r, 2, bad[i][2]);
        dp_test_result_free(&r);
    }
    static const char *const ex[][4] = {
        {REGRESSION_PATH, "--steps", "5abc", "--steps: \"5abc\""},
        {REGRESSION_PATH, "--steps", "99999999999999999999", "--steps: \"9999"},
        {REGRESSION_PATH, "--mode", "junk", "--mode: \"junk\" is not balanced or gather"},
        {MLP_CLASSIFIER_PATH, "--steps", "0", "--steps: \"0\""},
        {MLP_CLASSIFIER_PATH, "extra", "args", "unexpected argument \"extra\""},
        /* bad options named by the program (not argv[0]'s path), exit 2 */
        {MLP_CLASSIFIER_PATH, "--devices", "tpu:0", "mlp_classifier: --devices: "},
        {REGRESSION_PATH, "--frob", "1", "regression: unknown option \"--frob\""},
        {MLP_CLASSIFIER_PATH, "--bf16=1", "--steps", "mlp_classifier: \"--bf16=1\": this option "
                                                   "takes no value"},
        {GEMM_BENCH_PATH, "-q", "1", "gemm_bench: unknown option \"-q\""},
        {ATTENTION_BENCH_PATH, "--bogus", "1", "attention_bench: unknown option \"--bogus\""},
        {ATTENTION_BENCH_PATH, "--device", "cpu:-1", "attention_bench: --device: "},
    };
    for (size_t i = 0; i < sizeof ex / sizeof ex[0]; i++) {
        dp_test_result r = RUN_TO(ex[i][0], NULL, ex[i][1], ex[i][2]);
        assert_fails(&r, 2, ex[i][3]);
        dp_test_result_free(&r);
    }
    dp_test_result g = RUN_TO(GEMM_BENCH_PATH, NULL, "--size", "12x");
    assert_fails(&g, 2, "--size");
    dp_test_result_free(&g);
    dp_test_result w = RUN_TO(GEMM_BENCH_PATH, NULL, "--size", "32", "--reps", "1", "--warmup",
                              "0");
    dp_test_assert_success(&w, "gemm_bench without warm-up");
    dp_test_result_free(&w);
}

Test(tools, token_data_bench_keeps_files_it_did_not_write)
{
    dp_test_result a = RUN_TO(TOKEN_DATA_BENCH_PATH, NULL, "@d", "20000junk");
    assert_fails(&a, 2, "TOKENS: \"20000junk\"");
    dp_test_result_free(&a);
    dp_test_result b = RUN_TO(TOKEN_DATA_BENCH_PATH, NULL, "@d", "-1");
    assert_fails(&b, 2, "TOKENS: \"-1\"");
    dp_test_result_free(&b);
    dp_test_result c = RUN_TO(TOKEN_DATA_BENCH_PATH, NULL, "--frob");
    assert_fails(&c, 2, "no options but --help");
    dp_test_result_free(&c);
    /* each named, where they printed ": No such file..." or the usage alone */
    dp_test_result e1 = RUN_TO(TOKEN_DATA_BENCH_PATH, NULL, "", "20000");
    assert_fails(&e1, 2, "DIR is empty");
    dp_test_result_free(&e1);
    dp_test_result e2 = RUN_TO(TOKEN_DATA_BENCH_PATH, NULL, "@d", "20000", "1", "extra");
    assert_fails(&e2, 2, "\"extra\": one operand too many");
    dp_test_result_free(&e2);
    dp_test_result e3 = RUN_TO(TOKEN_DATA_BENCH_PATH, NULL, "@no/sub", "20000");
    assert_fails(&e3, 1, "its parent directory does not exist");
    dp_test_result_free(&e3);
    char dir[256], train[300];
    snprintf(dir, sizeof dir, "%s/data", tmpdir);
    cr_assert_eq(mkdir(dir, 0755), 0);
    snprintf(train, sizeof train, "%s/train.bin", dir);
    dp_test_write_file(train, "mine", 4);
    dp_test_result d = RUN_TO(TOKEN_DATA_BENCH_PATH, NULL, "@data", "20000", "1");
    assert_fails(&d, 1, "exists and is not the 20000 ids");
    dp_test_result_free(&d);
    size_t n = 0;
    unsigned char *kept = dp_test_read_file(train, &n);
    cr_assert(n == 4 && memcmp(kept, "mine", 4) == 0, "train.bin was overwritten");
    free(kept);
    /* another token file, which the mapped path would read and the
     * in-memory one not: refused up front, not "same batches: NO" */
    char other_dir[256], other[300];
    snprintf(other_dir, sizeof other_dir, "%s/other", tmpdir);
    cr_assert_eq(mkdir(other_dir, 0755), 0);
    snprintf(other, sizeof other, "%s/extra_val.bin", other_dir);
    dp_test_write_file(other, "\1\0\2\0", 4);
    dp_test_result e = RUN_TO(TOKEN_DATA_BENCH_PATH, NULL, "@other", "20000", "1");
    assert_fails(&e, 1, "holds extra_val.bin, which dp_token_data_open would read");
    dp_test_result_free(&e);
    snprintf(train, sizeof train, "%s/train.bin", other_dir);
    cr_assert_neq(access(train, F_OK), 0, "train.bin was written beside extra_val.bin");
}
