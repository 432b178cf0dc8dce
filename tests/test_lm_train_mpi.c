/*
 * lm_train under an MPI launcher: the built binary (LM_TRAIN_PATH) is
 * started by mpiexec (MPIEXEC_PATH, CMake's FindMPI) with 2 ranks on a
 * small generated corpus and a tiny model, and compared with one process.
 *
 *  - 2 ranks x cpu:1 save the same checkpoint, byte for byte, as one
 *    process on cpu:2, with and without --shard-optimizer, and with
 *    --logits-chunk 7; rank 0 alone prints (one summary, one sample, the
 *    same text) and writes --log; its --trace holds both ranks' steps;
 *  - with --val-tokens the ranks evaluate the same first windows: the
 *    final loss of one process;
 *  - a checkpoint from 2 ranks x cpu:2 resumes in one process on cpu:4
 *    bitwise as 8 steps straight, and one from cpu:1 resumes under 2 ranks
 *    as it resumes in one process on cpu:2;
 *  - SIGTERM to the ranks, or to mpiexec, stops every rank at the same
 *    step with the checkpoint saved;
 *  - a rank killed with SIGKILL ends the job (mpiexec exits non-zero)
 *    within 60 s: nothing hangs;
 *  - ranks started with different options (an unknown option or --help
 *    on one rank, a value, a flag or a path that differs) fail at once,
 *    every rank naming the first difference; a bad device on one rank
 *    fails the job there; the same options spelled differently, and each
 *    rank's own devices, run;
 *  - --log onto the resumed checkpoint is refused before anything is
 *    written; rank 0's --log on a full disk, or an evaluation meeting an
 *    id past the vocabulary, stops both ranks after a collective save;
 *  - SIGTERM while a rank waits in MPI_Init for a late one ends it at once;
 *  - a rank that stops answering (blocked writing its output between
 *    steps, or SIGSTOP) ends the job after --watchdog seconds.
 *
 * Open MPI's environment: running as root allowed, oversubscription (more
 * ranks than cores) allowed.
 */
#define _GNU_SOURCE /* F_SETPIPE_SZ */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dp/checkpoint.h"
#include "dp/gpt.h"
#include "dp_test.h"
#include "dp_test_fs.h"
#include "dp_test_json.h"
#include "dp_test_spawn.h"
#include "dp_test_tokens.h"

#include <criterion/parameterized.h> /* after criterion.h (in dp_test.h) */

#ifndef LM_TRAIN_PATH
#error "LM_TRAIN_PATH (the lm_train binary) must be defined by the build"
#endif
#ifndef MPIEXEC_PATH
#error "MPIEXEC_PATH (CMake's MPIEXEC_EXECUTABLE) must be defined by the build"
#endif

// --- temp dir, corpus and environment ------------------------------------------------

static char tmpdir[64];

static void path_in(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", tmpdir, name);
}

/* About `bytes` of sentences drawn from a fixed word list (seeded). */
static void write_corpus(const char *name, uint64_t seed, size_t bytes)
{
    static const char *words[] = {"the", "of", "and", "to", "a", "in", "is", "it", "that",
                                  "was", "he", "for", "on", "are", "with", "as", "his", "they",
                                  "river", "stone", "quiet", "morning", "light", "water"};
    const size_t nw = sizeof words / sizeof words[0];
    dp_rng rng;
    dp_rng_seed(&rng, seed);
    char p[256];
    path_in(p, sizeof p, name);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f, "cannot create %s", p);
    for (size_t n = 0; n < bytes;) {
        size_t k = 3 + (size_t)dp_rng_below(&rng, 10);
        for (size_t i = 0; i < k; i++)
            n += (size_t)fprintf(f, "%s%s", words[dp_rng_below(&rng, nw)], i + 1 < k ? " " : "");
        n += (size_t)fprintf(f, ".%s", dp_rng_below(&rng, 4) ? " " : "\n");
    }
    cr_assert_eq(fclose(f), 0);
}

static void setup(void)
{
    if (access(MPIEXEC_PATH, X_OK) != 0) cr_skip_test("mpiexec not found at " MPIEXEC_PATH);
    strcpy(tmpdir, "/tmp/dp_test_lm_mpi_XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp failed");
    write_corpus("corpus.txt", 2024, 20000);
    dp_test_mpi_env();
}

static void teardown(void)
{
    if (tmpdir[0]) dp_test_remove_tree(tmpdir);
}

// --- running lm_train, alone or under mpiexec ------------------------------------------

typedef dp_test_result result;

/* The options every run gets: a tiny model; later options override these. */
static const char *const BASE[] = {"--data", "@corpus.txt", "--layers", "1", "--heads", "2",
                                   "--dim", "32", "--context", "16", "--batch-size", "8",
                                   "--sample", "0", "--eval-iters", "1"};
#define N_BASE (sizeof BASE / sizeof BASE[0])

/* Starts argv[0..argc) (then freed), stdout and stderr to stdout.txt and
 * stderr.txt in tmpdir. */
static pid_t spawn_argv(char **argv, size_t argc)
{
    char out_path[256], err_path[256];
    path_in(out_path, sizeof out_path, "stdout.txt");
    path_in(err_path, sizeof err_path, "stderr.txt");
    pid_t pid = dp_test_spawn(argv, out_path, err_path);
    dp_test_argv_free(argv, argc);
    return pid;
}

/* Starts lm_train with BASE and extra[0..n), under `mpiexec -n ranks`
 * when ranks > 0; an argument starting with '@' names a file in tmpdir. */
static pid_t spawn_lm(int ranks, const char *const *extra, size_t n)
{
    char *argv[N_BASE + 40];
    return spawn_argv(argv, dp_test_argv(argv, N_BASE + 40, ranks, MPIEXEC_PATH, LM_TRAIN_PATH,
                                         BASE, N_BASE, extra, n, tmpdir));
}

/* Starts a job of two ranks, each lm_train with BASE as rk[r] says. */
static pid_t spawn_ranks(const dp_test_rank_cmd rk[2])
{
    char *argv[2 * N_BASE + 60];
    return spawn_argv(argv, dp_test_argv_mpmd(argv, 2 * N_BASE + 60, MPIEXEC_PATH, LM_TRAIN_PATH,
                                              BASE, N_BASE, rk, tmpdir));
}

static result collect(pid_t pid)
{
    char out_path[256], err_path[256];
    path_in(out_path, sizeof out_path, "stdout.txt");
    path_in(err_path, sizeof err_path, "stderr.txt");
    return dp_test_collect(pid, out_path, err_path);
}

/* The outputs of a run already waited for (exit status st). */
static result collect_ended(int st)
{
    result r;
    char p[256];
    size_t n;
    r.status = st;
    path_in(p, sizeof p, "stdout.txt");
    r.out = (char *)dp_test_read_file(p, &n);
    path_in(p, sizeof p, "stderr.txt");
    r.err = (char *)dp_test_read_file(p, &n);
    cr_assert(r.out && r.err);
    return r;
}

#define ARGS_(...)                                                                         \
    (const char *const[]){__VA_ARGS__},                                                    \
        sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *)
/* RUN(ranks, args...): ranks 0 = one process, without mpiexec. */
#define RUN(ranks, ...) collect(spawn_lm((ranks), ARGS_(__VA_ARGS__)))

static unsigned char *read_in(const char *name, size_t *len)
{
    char p[256];
    path_in(p, sizeof p, name);
    unsigned char *b = dp_test_read_file(p, len);
    cr_assert_not_null(b, "cannot read %s", p);
    return b;
}

/* The two checkpoints hold the same step, parameters and AdamW moments,
 * bitwise, and (no timestamps in them) are the same bytes. */
static void assert_same_checkpoint(const char *a_name, const char *b_name)
{
    char pa[256], pb[256];
    path_in(pa, sizeof pa, a_name);
    path_in(pb, sizeof pb, b_name);
    dp_checkpoint *a = NULL, *b = NULL;
    dp_gpt *ga = NULL, *gb = NULL;
    dp_assert_ok(dp_gpt_checkpoint_load(pa, &a, &ga));
    dp_assert_ok(dp_gpt_checkpoint_load(pb, &b, &gb));
    size_t n = dp_gpt_model(ga, 0)->n_params;
    cr_assert_eq(dp_gpt_model(gb, 0)->n_params, n);
    cr_assert_eq(a->step, b->step);
    cr_assert_eq(a->optimizer_step, b->optimizer_step);
    cr_assert(a->m && b->m && a->v && b->v);
    cr_assert_eq(memcmp(a->params, b->params, n * sizeof(float)), 0, "%s, %s: parameters differ",
                 a_name, b_name);
    cr_assert_eq(memcmp(a->m, b->m, n * sizeof(float)), 0, "%s, %s: m differs", a_name, b_name);
    cr_assert_eq(memcmp(a->v, b->v, n * sizeof(float)), 0, "%s, %s: v differs", a_name, b_name);
    dp_checkpoint_close(a);
    dp_checkpoint_close(b);
    dp_gpt_destroy(ga);
    dp_gpt_destroy(gb);
    size_t la, lb;
    unsigned char *fa = read_in(a_name, &la), *fb = read_in(b_name, &lb);
    cr_assert(la == lb && memcmp(fa, fb, la) == 0, "%s and %s: the files differ", a_name, b_name);
    free(fa);
    free(fb);
}

TestSuite(lm_train_mpi, .init = setup, .fini = teardown, .timeout = 120);

// --- ranks compute what one process computes -------------------------------------------

/* 2 ranks x cpu:1 == one process on cpu:2, bitwise, both with the option
 * `extra`; rank 0 alone prints (one data line, one summary, one sample:
 * the same text) and writes the log (6 rows, not 12). */
static void two_ranks_equal_one_process(const char *extra)
{
    result a = RUN(2, "--devices", "cpu:1", "--steps", "6", "--save", "@a.st", "--log",
                   "@a.jsonl", "--sample", "40", extra);
    dp_test_assert_success(&a, "mpiexec -n 2 lm_train --devices cpu:1");
    result b = RUN(0, "--devices", "cpu:2", "--steps", "6", "--save", "@b.st", "--sample", "40",
                   extra);
    dp_test_assert_success(&b, "lm_train --devices cpu:2");
    assert_same_checkpoint("a.st", "b.st");

    cr_assert_eq(dp_test_count(a.out, "data: "), 1, "stdout:\n%s", a.out);
    cr_assert_eq(dp_test_count(a.out, "trained 6 steps"), 1, "stdout:\n%s", a.out);
    cr_assert_eq(dp_test_count(a.out, "final val_loss"), 1, "stdout:\n%s", a.out);
    cr_assert(strstr(a.out, "on 2 devices (2 ranks"), "stdout:\n%s", a.out);
    /* The sample, from the same parameters and seed, is the same text. */
    const char *sa = strstr(a.out, "--- sample"), *sb = strstr(b.out, "--- sample");
    cr_assert(sa && sb, "no sample; stdout:\n%s", a.out);
    cr_assert_eq(dp_test_count(a.out, "--- sample"), 1);
    cr_assert_str_eq(sa, sb);
    const char *va = strstr(a.out, "final val_loss"), *vb = strstr(b.out, "final val_loss");
    cr_assert(vb && strncmp(va, vb, 26) == 0, "evaluation differs:\n%s\n%s", va, vb);
    size_t len;
    char *log = (char *)read_in("a.jsonl", &len);
    cr_assert_eq(dp_test_count(log, "\n"), 6, "log:\n%s", log);
    free(log);
    dp_test_result_free(&a);
    dp_test_result_free(&b);
}

Test(lm_train_mpi, two_ranks_equal_one_process_bitwise)
{
    two_ranks_equal_one_process("--eval-iters=1"); /* BASE again: no extra option */
}

Test(lm_train_mpi, two_ranks_equal_one_process_bitwise_with_sharded_optimizer)
{
    two_ranks_equal_one_process("--shard-optimizer");
}

/* Each device's 4 x 16 = 64 output rows in chunks of 7: the chunks are
 * cut per device, so they are the same however the devices are split
 * into ranks. */
Test(lm_train_mpi, two_ranks_equal_one_process_bitwise_with_logits_chunks)
{
    two_ranks_equal_one_process("--logits-chunk=7");
}

/* --val-tokens 200 keeps floor(199 / 16) = 12 windows of the validation
 * split (a batch of 8 and one of 4 rows): every rank must count the same
 * windows, or the ranks' collective evaluations would not match. */
/* --trace under 2 ranks: rank 0 gathers rank 1's steps, so the file has
 * a process per rank ("rank 0", "rank 1"), each with its device's track
 * (a forward per step) and its exchanges' track; rank 1 writes nothing. */
Test(lm_train_mpi, the_trace_of_two_ranks_holds_both)
{
    result a = RUN(2, "--devices", "cpu:1", "--steps", "4", "--trace", "@t.json", "--sample", "0");
    dp_test_assert_success(&a, "mpiexec -n 2 lm_train --trace");
    json_t *tr = dp_test_load_json(tmpdir, "t.json");
    for (int r = 0; r < 2; r++) {
        dp_test_trace_assert_rank(tr, r, "cpu:0");
        cr_assert_eq(dp_test_trace_events(tr, r + 1, 0, "forward"), 4, "rank %d", r);
        cr_assert_eq(dp_test_trace_events(tr, r + 1, 0, "optimizer"), 4, "rank %d", r);
    }
    cr_assert_eq(dp_test_trace_events(tr, 3, -1, "forward"), 0, "a third process");
    json_decref(tr);
    /* one file: the rank 0's (no other rank wrote beside it) */
    DIR *d = opendir(tmpdir);
    struct dirent *de;
    while ((de = readdir(d)))
        cr_assert(!strstr(de->d_name, "t.json") || strcmp(de->d_name, "t.json") == 0,
                  "%s was written beside t.json", de->d_name);
    closedir(d);
    dp_test_result_free(&a);
}

Test(lm_train_mpi, val_tokens_under_2_ranks_equals_one_process)
{
    result a = RUN(2, "--devices", "cpu:1", "--steps", "2", "--val-tokens", "200");
    dp_test_assert_success(&a, "mpiexec -n 2 lm_train --val-tokens 200");
    result b = RUN(0, "--devices", "cpu:2", "--steps", "2", "--val-tokens", "200");
    dp_test_assert_success(&b, "lm_train --devices cpu:2 --val-tokens 200");
    cr_assert_eq(dp_test_count(a.out, "validation: the first 193 of "), 1, "stdout:\n%s", a.out);
    const char *va = strstr(a.out, "final val_loss"), *vb = strstr(b.out, "final val_loss");
    cr_assert(va && vb && strncmp(va, vb, 26) == 0, "evaluation differs:\n%s\n%s", a.out,
              b.out);
    dp_test_result_free(&a);
    dp_test_result_free(&b);
}

// --- resume across ranks and devices ---------------------------------------------------

/* The flat checkpoint does not depend on how the devices were split into
 * ranks. --lr-decay-steps fixes the schedule so a stopped run resumes
 * bitwise (see test_lm_train). */
Test(lm_train_mpi, checkpoint_of_2_ranks_x_cpu2_resumes_on_cpu4_bitwise)
{
    result a = RUN(2, "--devices", "cpu:2", "--steps", "4", "--lr-decay-steps", "8", "--save",
                   "@half.st");
    dp_test_assert_success(&a, "2 ranks x cpu:2, 4 steps");
    result b = RUN(0, "--devices", "cpu:4", "--steps", "8", "--resume", "@half.st", "--save",
                   "@resumed.st");
    dp_test_assert_success(&b, "cpu:4, resume to 8 steps");
    result c = RUN(0, "--devices", "cpu:4", "--steps", "8", "--save", "@straight.st");
    dp_test_assert_success(&c, "cpu:4, 8 steps");
    assert_same_checkpoint("resumed.st", "straight.st");
    /* and on one device of one process */
    result d = RUN(0, "--devices", "cpu:1", "--steps", "8", "--resume", "@half.st", "--save",
                   "@single.st");
    dp_test_assert_success(&d, "cpu:1, resume to 8 steps");
    cr_assert_eq(dp_test_count(d.out, "trained 4 steps"), 1, "stdout:\n%s", d.out);
    dp_test_result_free(&a);
    dp_test_result_free(&b);
    dp_test_result_free(&c);
    dp_test_result_free(&d);
}

Test(lm_train_mpi, checkpoint_of_one_process_resumes_under_2_ranks_bitwise)
{
    result a = RUN(0, "--devices", "cpu:1", "--steps", "4", "--lr-decay-steps", "8", "--save",
                   "@half.st");
    dp_test_assert_success(&a, "cpu:1, 4 steps");
    result b = RUN(2, "--devices", "cpu:1", "--steps", "8", "--resume", "@half.st", "--save",
                   "@ranks.st");
    dp_test_assert_success(&b, "2 ranks x cpu:1, resume to 8 steps");
    cr_assert_eq(dp_test_count(b.out, "trained 4 steps"), 1, "stdout:\n%s", b.out);
    result c = RUN(0, "--devices", "cpu:2", "--steps", "8", "--resume", "@half.st", "--save",
                   "@one.st");
    dp_test_assert_success(&c, "cpu:2, resume to 8 steps");
    assert_same_checkpoint("ranks.st", "one.st");
    /* and under 2 ranks x cpu:2, as one process with cpu:4 */
    result d = RUN(2, "--devices", "cpu:2", "--steps", "8", "--resume", "@half.st", "--save",
                   "@ranks4.st");
    dp_test_assert_success(&d, "2 ranks x cpu:2, resume to 8 steps");
    result e = RUN(0, "--devices", "cpu:4", "--steps", "8", "--resume", "@half.st", "--save",
                   "@one4.st");
    dp_test_assert_success(&e, "cpu:4, resume to 8 steps");
    assert_same_checkpoint("ranks4.st", "one4.st");
    dp_test_result_free(&a);
    dp_test_result_free(&b);
    dp_test_result_free(&c);
    dp_test_result_free(&d);
    dp_test_result_free(&e);
}

// --- signals and a killed rank ----------------------------------------------------------

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Waits until stdout shows a training step; after 60 s stops the job
 * (SIGTERM: mpiexec passes it to the ranks and kills them after its
 * grace period) and fails, so a failed test leaves no ranks training. */
static void wait_for_progress(pid_t launcher)
{
    char p[256];
    path_in(p, sizeof p, "stdout.txt");
    for (int i = 0;; i++) {
        if (i == 3000) {
            kill(launcher, SIGTERM);
            waitpid(launcher, NULL, 0);
            cr_assert_fail("no training step within 60 s");
        }
        size_t n;
        char *t = (char *)dp_test_read_file(p, &n);
        int seen = t && strstr(t, "step ");
        free(t);
        if (seen) return;
        int st;
        cr_assert_eq(waitpid(launcher, &st, WNOHANG), 0, "mpiexec ended before training");
        sleep_ms(20);
    }
}

/* The launcher's child processes (the ranks, for Open MPI's mpiexec,
 * which starts local ranks itself), from /proc/<pid>/task/<tid>/children. */
static size_t children_of(pid_t pid, pid_t *out, size_t cap)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/task", (int)pid);
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "cannot read %s", dir);
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char p[400];
        snprintf(p, sizeof p, "%s/%.200s/children", dir, de->d_name);
        FILE *f = fopen(p, "r");
        if (!f) continue;
        int c;
        while (n < cap && fscanf(f, "%d", &c) == 1) out[n++] = (pid_t)c;
        fclose(f);
    }
    closedir(d);
    return n;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Waits up to limit seconds for pid; 1 with *status when it ended. */
static int wait_bounded(pid_t pid, double limit, int *status)
{
    for (double t0 = now_s(); now_s() - t0 < limit; sleep_ms(20))
        if (waitpid(pid, status, WNOHANG) == pid) return 1;
    return 0;
}

/* Whether process pid still runs (not gone, not a zombie). */
static int running(pid_t pid)
{
    char p[64], buf[512];
    snprintf(p, sizeof p, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(p, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *q = strrchr(buf, ')'); /* "pid (comm) S ..." */
    return q && q[1] == ' ' && q[2] != 'Z' && q[2] != 'X';
}

/* A job that did not end: kill the launcher and its ranks, then fail. */
static void kill_job(pid_t launcher, const char *what)
{
    pid_t ranks[16];
    size_t n = children_of(launcher, ranks, 16);
    for (size_t i = 0; i < n; i++) kill(ranks[i], SIGKILL);
    kill(launcher, SIGKILL);
    waitpid(launcher, NULL, 0);
    cr_assert_fail("%s", what);
}

/* SIGTERM to every rank (a scheduler's signal reaches them all), to one
 * rank only, or to mpiexec (which passes SIGTERM to the ranks): every rank
 * stops at the same step, rank 0 saves the checkpoint and says so once. */
static void signal_saves(int target)
{
    static const char *what[3] = {"every rank", "rank process 1", "mpiexec"};
    /* Signalled, Open MPI's mpiexec sends SIGTERM to the ranks and SIGKILL
     * 1 s later (odls_base_sigkill_timeout): 10 s here, for a loaded machine. */
    if (target == 2) setenv("OMPI_MCA_odls_base_sigkill_timeout", "10", 1);
    pid_t pid = spawn_lm(2, ARGS_("--devices", "cpu:1", "--steps", "100000000", "--eval-interval",
                                  "100000000", "--save", "@sig.st"));
    wait_for_progress(pid);
    pid_t ranks[16];
    size_t n = children_of(pid, ranks, 16);
    cr_assert_eq(n, 2, "mpiexec has %zu children, not the 2 ranks", n);
    if (target == 0) {
        kill(ranks[0], SIGTERM);
        kill(ranks[1], SIGTERM);
    } else if (target == 1) {
        kill(ranks[1], SIGTERM);
    } else {
        kill(pid, SIGTERM);
    }
    int st;
    if (!wait_bounded(pid, 60, &st)) kill_job(pid, "the job did not end within 60 s");
    result r = collect_ended(st);
    cr_assert(!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0, "SIGTERM to %s: exit 0",
              what[target]);
    char p[256];
    path_in(p, sizeof p, "sig.st");
    cr_assert_eq(access(p, F_OK), 0, "SIGTERM to %s: no checkpoint; stderr:\n%s", what[target],
                 r.err);
    dp_checkpoint *ck = NULL;
    dp_assert_ok(dp_gpt_checkpoint_load(p, &ck, NULL));
    cr_assert_gt(ck->step, 0);
    /* Signalled, mpiexec stops forwarding the ranks' output: rank 0's
     * message may not reach it. Otherwise it comes once, from rank 0. */
    if (target < 2) {
        cr_assert_eq(WEXITSTATUS(r.status), 128 + SIGTERM, "stderr:\n%s", r.err);
        cr_assert_eq(dp_test_count(r.err, "checkpoint saved to"), 1, "SIGTERM to %s: stderr:\n%s",
                     what[target], r.err);
        char want[80];
        snprintf(want, sizeof want, "rank 0: interrupted by SIGTERM at step %ld;", ck->step);
        cr_assert(strstr(r.err, want), "SIGTERM to %s: the checkpoint holds step %ld; "
                  "stderr:\n%s", what[target], ck->step, r.err);
    }
    dp_checkpoint_close(ck);
    dp_test_result_free(&r);
}

Test(lm_train_mpi, sigterm_to_every_rank_saves_once) { signal_saves(0); }
Test(lm_train_mpi, sigterm_to_one_rank_stops_both_and_saves) { signal_saves(1); }
Test(lm_train_mpi, sigterm_to_mpiexec_saves) { signal_saves(2); }

/* Signal sig to rank `which` in the middle of training (the job runs
 * --watchdog watchdog): the job must end within 60 s, non-zero. Returns
 * its outputs; *other is the other rank's process. */
static result rank_signalled(size_t which, int sig, const char *watchdog, pid_t *other)
{
    pid_t pid = spawn_lm(2, ARGS_("--devices", "cpu:1", "--steps", "100000000", "--eval-interval",
                                  "100000000", "--watchdog", watchdog));
    wait_for_progress(pid);
    pid_t ranks[16];
    size_t n = children_of(pid, ranks, 16);
    cr_assert_eq(n, 2, "mpiexec has %zu children, not the 2 ranks", n);
    *other = ranks[1 - which];
    double t0 = now_s();
    kill(ranks[which], sig);
    int st;
    int ended = wait_bounded(pid, 60, &st);
    if (sig == SIGSTOP) kill(ranks[which], SIGCONT);
    if (!ended) kill_job(pid, "the job did not end within 60 s of the signal to one rank");
    double took = now_s() - t0;
    result r = collect_ended(st);
    cr_assert(!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0, "mpiexec exited 0; stderr:\n%s",
              r.err);
    cr_log_info("mpiexec ended %.1f s after signal %d to rank %zu; stderr:\n%s", took, sig, which,
                r.err);
    return r;
}

/* SIGKILL to one rank (either): mpiexec notices, ends the other rank and
 * exits non-zero within 60 s; no rank is left waiting in a collective. */
static void killed_rank_ends_the_job(size_t which)
{
    pid_t other = 0;
    result r = rank_signalled(which, SIGKILL, "0", &other);
    /* The other rank is gone too (mpiexec may exit while its SIGKILL is
     * still taking the process down). */
    for (int i = 0; i < 250 && running(other); i++) sleep_ms(20);
    cr_assert(!running(other), "rank process %d outlived mpiexec by 5 s", (int)other);
    dp_test_result_free(&r);
}

Test(lm_train_mpi, killed_rank_ends_the_job) { killed_rank_ends_the_job(1); }
Test(lm_train_mpi, killed_first_rank_ends_the_job) { killed_rank_ends_the_job(0); }

// --- ranks started differently ----------------------------------------------------------

/* Starts an MPMD job: rank 0 runs lm_train with BASE and a[], rank 1 with
 * BASE and b[] ("" ends each list). */
static pid_t spawn_mpmd(const char (*a)[32], const char (*b)[32])
{
    const char *ra[8], *rb[8];
    size_t na = 0, nb = 0;
    while (na < 8 && a[na][0]) ra[na] = a[na], na++;
    while (nb < 8 && b[nb][0]) rb[nb] = b[nb], nb++;
    const dp_test_rank_cmd rk[2] = {{NULL, 0, ra, na}, {NULL, 0, rb, nb}};
    return spawn_ranks(rk);
}

typedef struct differ_case {
    char name[48];
    char a[8][32];   /* rank 0's options after BASE; "" ends */
    char b[8][32];   /* rank 1's */
    char needle[96]; /* the refusal; "" = the job runs */
    int every;       /* every rank prints the refusal (else the rank that met it) */
} differ_case;

static differ_case differ_cases[] = {
    {"unknown option on rank 0", {"--bogus"}, {""},
     "rank 0 refuses its command line: unknown option \"--bogus\"", 1},
    {"unknown option on rank 1", {""}, {"--steps", "1", "--bogus"},
     "rank 1 refuses its command line: unknown option \"--bogus\"", 1},
    {"val-tokens under a watchdog", {"--val-tokens", "33", "--watchdog", "3"},
     {"--val-tokens", "65", "--watchdog", "3"}, "--val-tokens is 65 on rank 1, 33 on rank 0", 1},
    {"sample on rank 0 only", {"--sample", "5"}, {""}, "--sample is 0 on rank 1, 5 on rank 0", 1},
    {"save on rank 1 only", {""}, {"--save", "@x.st"}, "--save is given on rank 1 (", 1},
    {"a flag on rank 1 only", {""}, {"--shard-optimizer"},
     "--shard-optimizer is given on rank 1, not on rank 0", 1},
    {"help on rank 0 only", {"--help"}, {""}, "--help is given on rank 0, not on rank 1", 1},
    {"data of another path", {"--data", "@corpus2.txt"}, {""}, "--data is ", 1},
    /* Each rank's own devices may differ; a bad list is that rank's
     * command line refused, which every rank names. */
    {"a bad device on rank 1", {"--devices", "cpu:1"}, {"--devices", "cpu:0,0"},
     "rank 1 refuses its command line: --devices: ", 1},
    /* The same options, spelled differently, and each rank its own devices: the job runs. */
    {"the same options spelled differently", {"--steps=1", "--eval-iters=1"},
     {"--eval-iters", "1", "--st", "1"}, "", 0},
    {"each rank its own devices", {"--steps", "1", "--devices", "cpu:1"},
     {"--steps", "1", "--devices", "cpu:2", "--device-weights", "1,2"}, "", 0},
};

ParameterizedTestParameters(lm_train_mpi, ranks_started_differently)
{
    return cr_make_param_array(differ_case, differ_cases,
                               sizeof differ_cases / sizeof differ_cases[0]);
}

/* Ranks whose options differ (all of them compared, not a list) fail at
 * once, every rank naming the first option that differs; a rank that
 * refused its command line alone is named with its message; nothing
 * trains and no rank waits for the others. */
ParameterizedTest(differ_case *dc, lm_train_mpi, ranks_started_differently, .timeout = 120)
{
    write_corpus("corpus2.txt", 2024, 20000);
    double t0 = now_s();
    pid_t pid = spawn_mpmd(dc->a, dc->b);
    int st;
    if (!wait_bounded(pid, 60, &st)) kill_job(pid, "the ranks did not end within 60 s");
    double took = now_s() - t0;
    result r = collect_ended(st);
    cr_log_info("%s: mpiexec ended after %.2f s", dc->name, took);
    if (!dc->needle[0]) {
        dp_test_assert_success(&r, dc->name);
        cr_assert_eq(dp_test_count(r.out, "trained 1 steps"), 1, "%s: stdout:\n%s", dc->name,
                     r.out);
        /* the summary counts every rank's devices (it said "2 x 1 devices") */
        if (strstr(dc->a[3], "cpu:1") && strstr(dc->b[3], "cpu:2"))
            cr_assert(strstr(r.out, "ranks: 2, 3 devices in all (rank 0 1)"), "%s: stdout:\n%s",
                      dc->name, r.out);
        dp_test_result_free(&r);
        return;
    }
    cr_assert(!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0, "%s: exit 0; stdout:\n%s",
              dc->name, r.out);
    cr_assert(strstr(r.err, dc->needle), "%s: stderr lacks \"%s\":\n%s", dc->name, dc->needle,
              r.err);
    /* a refused command line is said alone: the option may be one a rank
     * gives its own way (--devices), which does not "differ" */
    int refusal = strstr(dc->needle, "refuses its command line") != NULL;
    if (refusal)
        cr_assert_null(strstr(r.err, "options differ"), "%s:\n%s", dc->name, r.err);
    if (dc->every)
        for (int k = 0; k < 2; k++) {
            char who[192];
            snprintf(who, sizeof who, "lm_train: rank %d: %s", k,
                     refusal ? dc->needle : "rank 1's options differ from rank 0's: ");
            cr_assert_eq(dp_test_count(r.err, who), 1, "%s: rank %d's line:\n%s", dc->name, k,
                         r.err);
        }
    cr_assert_null(strstr(r.out, "trained "), "%s: trained:\n%s", dc->name, r.out);
    char p[256];
    path_in(p, sizeof p, "x.st");
    cr_assert_neq(access(p, F_OK), 0, "%s: a checkpoint was written", dc->name);
    dp_test_result_free(&r);
}

/* The text rank r finds at "c.txt" in its own working directory (dir),
 * the corpus with every `from` replaced by `to`. */
static void write_rank_text(const char *dir, char from, char to)
{
    char p[256];
    path_in(p, sizeof p, dir);
    cr_assert(mkdir(p, 0700) == 0 || errno == EEXIST, "mkdir %s: %s", p, strerror(errno));
    size_t n;
    char *text = (char *)read_in("corpus.txt", &n);
    for (size_t i = 0; i < n; i++)
        if (text[i] == from) text[i] = to;
    char name[64];
    snprintf(name, sizeof name, "%s/c.txt", dir);
    path_in(p, sizeof p, name);
    FILE *f = fopen(p, "w");
    cr_assert(f && fwrite(text, 1, n, f) == n && fclose(f) == 0, "cannot write %s", p);
    free(text);
}

/* The same --data path holding other text on each rank's machine (here:
 * each rank its own working directory) gives each rank another char
 * vocabulary: refused before the engine, naming the tokenizer, where it
 * used to be "the model's n_params differs" (a vocabulary of another
 * size), or not at all (the same size: ids meaning other characters on
 * each rank). The same text trains. */
Test(lm_train_mpi, ranks_whose_data_give_another_tokenizer_are_refused, .timeout = 120)
{
    static const struct {
        char from, to; /* rank 1's text: the corpus with from replaced by to */
        const char *needle;
    } cases[] = {
        {'q', 'Q', "(vocab 22 here, 22 on rank 0, other tokens)"}, /* 'q' -> 'Q': other ids */
        {'.', 't', "(vocab 21 here, 22 on rank 0)"},               /* one character fewer */
        {0, 0, NULL},                                              /* the same text: it trains */
    };
    write_rank_text("r0", 0, 0);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        write_rank_text("r1", cases[c].from, cases[c].to);
        char d0[256], d1[256];
        path_in(d0, sizeof d0, "r0");
        path_in(d1, sizeof d1, "r1");
        const char *pre0[] = {"-wdir", d0}, *pre1[] = {"-wdir", d1};
        const char *args[] = {"--data", "c.txt", "--steps", "1"};
        const dp_test_rank_cmd rk[2] = {{pre0, 2, args, 4}, {pre1, 2, args, 4}};
        pid_t pid = spawn_ranks(rk);
        int st;
        if (!wait_bounded(pid, 60, &st)) kill_job(pid, "the ranks did not end within 60 s");
        result r = collect_ended(st);
        if (!cases[c].needle) {
            dp_test_assert_success(&r, "the same text");
            dp_test_result_free(&r);
            continue;
        }
        cr_assert(!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0, "case %zu: exit 0", c);
        char want[256];
        snprintf(want, sizeof want, "lm_train: rank 1: this rank's tokenizer differs from rank "
                 "0's %s", cases[c].needle);
        cr_assert(strstr(r.err, want), "case %zu: stderr lacks \"%s\":\n%s", c, want, r.err);
        cr_assert_null(strstr(r.err, "n_params"), "case %zu:\n%s", c, r.err);
        cr_assert_null(strstr(r.out, "trained "), "case %zu: trained:\n%s", c, r.out);
        dp_test_result_free(&r);
    }
}

/* Token files at the same path that differ between the ranks' machines:
 * refused before the engine, naming the data, on every rank. With
 * --eval-only a longer validation split on rank 1 used to print rank 0's
 * loss, then hold rank 1 for the watchdog's 600 s, waiting for a batch
 * rank 0 never sent; other tokens of the same length were blamed on the
 * seed at the first step. */
static void write_rank_tokens(const char *dir, size_t n_val, int shift)
{
    static int32_t ids[6000];
    for (int i = 0; i < 6000; i++) ids[i] = (i * 37 + i / 7 + (i >= 4000 ? shift : 0)) % 300;
    char p[256], name[64];
    snprintf(name, sizeof name, "%s", dir);
    path_in(p, sizeof p, name);
    cr_assert(mkdir(p, 0700) == 0 || errno == EEXIST, "mkdir %s: %s", p, strerror(errno));
    snprintf(name, sizeof name, "%s/tv", dir);
    path_in(p, sizeof p, name);
    cr_assert(mkdir(p, 0700) == 0 || errno == EEXIST, "mkdir %s: %s", p, strerror(errno));
    snprintf(name, sizeof name, "%s/tv/train.bin", dir);
    path_in(p, sizeof p, name);
    dp_test_write_raw(p, ids, 4000);
    snprintf(name, sizeof name, "%s/tv/val.bin", dir);
    path_in(p, sizeof p, name);
    dp_test_write_raw(p, ids + 4000, n_val);
}

Test(lm_train_mpi, ranks_whose_token_data_differ_are_refused, .timeout = 120)
{
    write_rank_tokens("r0", 1000, 0);
    char d0[256], d1[256], ck[256];
    path_in(d0, sizeof d0, "r0");
    path_in(d1, sizeof d1, "r1");
    path_in(ck, sizeof ck, "ck.st");
    result m = RUN(0, "--devices", "cpu:1", "--data", "@r0/tv", "--vocab-size", "300", "--steps",
                   "1", "--save", "@ck.st");
    dp_test_assert_success(&m, "the checkpoint");
    dp_test_result_free(&m);
    static const struct {
        size_t n_val;
        int shift, eval_only;
        const char *needle;
    } cases[] = {
        {2000, 0, 1, "validation split 2000, 1000)"}, /* the hang */
        {1000, 5, 1, "validation split 1000, 1000; other tokens)"},
        {1000, 5, 0, "validation split 1000, 1000; other tokens)"},
        {1000, 0, 1, NULL}, /* the same data: it evaluates */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        write_rank_tokens("r1", cases[c].n_val, cases[c].shift);
        const char *pre0[] = {"-wdir", d0}, *pre1[] = {"-wdir", d1};
        const char *eval[] = {"--data", "tv", "--vocab-size", "300", "--eval-only", "--resume",
                              ck};
        const char *train[] = {"--data", "tv", "--vocab-size", "300", "--steps", "1"};
        const char *const *args = cases[c].eval_only ? eval : train;
        size_t n = cases[c].eval_only ? 7 : 6;
        const dp_test_rank_cmd rk[2] = {{pre0, 2, args, n}, {pre1, 2, args, n}};
        pid_t pid = spawn_ranks(rk);
        int st;
        if (!wait_bounded(pid, 60, &st)) kill_job(pid, "the ranks did not end within 60 s");
        result r = collect_ended(st);
        if (!cases[c].needle) {
            dp_test_assert_success(&r, "the same data");
            cr_assert(strstr(r.out, "val_loss "), "stdout:\n%s", r.out);
            dp_test_result_free(&r);
            continue;
        }
        cr_assert(!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0, "case %zu: exit 0", c);
        cr_assert(strstr(r.err, "lm_train: rank 1: this rank's --data differs from rank 0's") &&
                      strstr(r.err, cases[c].needle),
                  "case %zu: stderr lacks \"%s\":\n%s", c, cases[c].needle, r.err);
        cr_assert_null(strstr(r.out, "val_loss"), "case %zu: evaluated:\n%s", c, r.out);
        cr_assert_null(strstr(r.out, "trained "), "case %zu: trained:\n%s", c, r.out);
        dp_test_result_free(&r);
    }
}

// --- outputs onto inputs, under ranks ---------------------------------------------------------

/* Rank 0 writes the outputs, so it refuses --log onto the checkpoint the
 * ranks resume, before anything is written; the other rank stops with it. */
Test(lm_train_mpi, log_onto_the_resumed_checkpoint_is_refused_by_every_rank)
{
    result a = RUN(0, "--devices", "cpu:1", "--steps", "1", "--save", "@ck.st");
    dp_test_assert_success(&a, "one step");
    size_t n0 = 0, n1 = 0;
    unsigned char *before = read_in("ck.st", &n0);
    result r = RUN(2, "--devices", "cpu:1", "--steps", "3", "--resume", "@ck.st", "--log", "@ck.st",
                   "--save", "@new.st");
    cr_assert(!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0, "exit 0:\n%s", r.out);
    cr_assert_eq(dp_test_count(r.err, "lm_train: rank 0: --log \""), 1, "stderr:\n%s", r.err);
    cr_assert(strstr(r.err, "is the same file as --resume"), "stderr:\n%s", r.err);
    unsigned char *after = read_in("ck.st", &n1);
    cr_assert(n0 == n1 && memcmp(before, after, n0) == 0, "ck.st changed");
    char p[256];
    path_in(p, sizeof p, "new.st");
    cr_assert_neq(access(p, F_OK), 0, "new.st was written");
    free(before);
    free(after);
    dp_test_result_free(&a);
    dp_test_result_free(&r);
}

/* Rank 0's --log cannot be written (/dev/full): both ranks stop at the
 * next step, save it together, and fail. */
Test(lm_train_mpi, a_log_that_cannot_be_written_stops_every_rank_after_saving)
{
    result r = RUN(2, "--devices", "cpu:1", "--steps", "400", "--log", "/dev/full", "--save",
                   "@ck.st");
    cr_assert(!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0, "exit 0:\n%s", r.out);
    cr_assert(strstr(r.err, "lm_train: rank 0: cannot write --log /dev/full: No space left"),
              "stderr:\n%s", r.err);
    char p[256];
    path_in(p, sizeof p, "ck.st");
    dp_checkpoint *ck = NULL;
    dp_assert_ok(dp_gpt_checkpoint_load(p, &ck, NULL));
    cr_assert(ck->step >= 1 && ck->step < 400, "step %ld", ck->step);
    cr_assert(strstr(r.err, "its checkpoint is saved in "), "stderr:\n%s", r.err);
    dp_checkpoint_close(ck);
    dp_test_result_free(&r);
}

/* An id past the vocabulary in the validation split, found by the
 * evaluation at the last step: every rank meets it in the same batch, the
 * ranks agree on it, save the 4 steps together and fail. */
Test(lm_train_mpi, an_evaluation_that_fails_after_training_saves_first)
{
    int32_t ids[2000];
    for (int i = 0; i < 2000; i++) ids[i] = i % 7 == 0 && i >= 1500 ? 400 : (i * 37) % 300;
    char p[256];
    path_in(p, sizeof p, "badval");
    cr_assert_eq(mkdir(p, 0755), 0);
    path_in(p, sizeof p, "badval/train.bin");
    dp_test_write_raw(p, ids, 1500);
    path_in(p, sizeof p, "badval/val.bin");
    dp_test_write_raw(p, ids + 1500, 500);
    result r = RUN(2, "--devices", "cpu:1", "--data", "@badval", "--vocab-size", "300", "--steps",
                   "4", "--eval-interval", "4", "--eval-iters", "20", "--save", "@ck.st");
    cr_assert(!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0, "exit 0:\n%s", r.out);
    cr_assert(strstr(r.err, "outside the vocabulary [0, 300)") &&
                  strstr(r.err, "rank 0: stopped at step 4; its checkpoint is saved in "),
              "stderr:\n%s", r.err);
    path_in(p, sizeof p, "ck.st");
    dp_checkpoint *ck = NULL;
    dp_assert_ok(dp_gpt_checkpoint_load(p, &ck, NULL));
    cr_assert_eq(ck->step, 4);
    dp_checkpoint_close(ck);
    dp_test_result_free(&r);
}

// --- a signal before training ----------------------------------------------------------------

/* Rank 1 starts 6 s late, so rank 0 waits for it in MPI_Init (setup):
 * SIGTERM there ends rank 0 at once with 128 + 15, saying so, and the job
 * with it, instead of being held (or killed without a word). */
Test(lm_train_mpi, a_signal_while_starting_ends_the_rank_at_once)
{
    const char *pre[] = {"sh", "-c", "sleep 6; exec \"$0\" \"$@\""};
    const dp_test_rank_cmd rk[2] = {{NULL, 0, NULL, 0}, {pre, 3, NULL, 0}};
    pid_t pid = spawn_ranks(rk);
    /* rank 0: the child that runs lm_train (rank 1 is still sh, sleeping) */
    pid_t rank0 = 0;
    for (int tries = 0; tries < 250 && !rank0; tries++) {
        sleep_ms(20);
        pid_t kids[16];
        size_t n = children_of(pid, kids, 16);
        for (size_t i = 0; i < n && !rank0; i++) {
            char p[64], comm[64] = "";
            snprintf(p, sizeof p, "/proc/%d/comm", (int)kids[i]);
            FILE *f = fopen(p, "r");
            if (f && fgets(comm, sizeof comm, f) && strncmp(comm, "lm_train", 8) == 0)
                rank0 = kids[i];
            if (f) fclose(f);
        }
    }
    cr_assert_gt(rank0, 0, "rank 0 did not start");
    sleep_ms(1000); /* into MPI_Init's wait for rank 1 */
    double t0 = now_s();
    kill(rank0, SIGTERM);
    int st;
    if (!wait_bounded(pid, 60, &st)) kill_job(pid, "the job did not end within 60 s");
    double took = now_s() - t0;
    result r = collect_ended(st);
    cr_assert(!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0, "exit 0");
    cr_assert(strstr(r.err, "lm_train: interrupted by SIGTERM before training began"),
              "stderr:\n%s", r.err);
    cr_assert_lt(took, 4.0, "the job ended %.1f s after the signal (rank 1 came at 5 s)", took);
    dp_test_result_free(&r);
}

// --- a rank that stops answering ---------------------------------------------------------

/* Rank 0 blocks writing its stdout (a FIFO nobody reads, its pipe shrunk
 * to a page) after a step, so rank 1 waits for it in the agreement
 * between steps: with --watchdog 3 rank 1 gives up after 3 s and ends the
 * job, naming the wait. */
Test(lm_train_mpi, a_rank_stuck_between_steps_ends_the_job_after_the_watchdog)
{
    char fifo[256];
    path_in(fifo, sizeof fifo, "stuck.fifo");
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    int rd = open(fifo, O_RDONLY | O_NONBLOCK);
    cr_assert_geq(rd, 0);
    fcntl(rd, F_SETPIPE_SZ, 4096);
    char redirect[300];
    snprintf(redirect, sizeof redirect, "exec \"$0\" \"$@\" > %s", fifo);
    const char *pre[] = {"sh", "-c", redirect};
    const char *extra[] = {"--devices", "cpu:1", "--steps", "100000000", "--eval-interval", "10",
                           "--watchdog", "3"};
    const dp_test_rank_cmd rk[2] = {{pre, 3, extra, 8}, {NULL, 0, extra, 8}};
    double t0 = now_s();
    pid_t pid = spawn_ranks(rk);
    int st;
    if (!wait_bounded(pid, 60, &st)) {
        close(rd);
        kill_job(pid, "the job did not end within 60 s of rank 0 blocking");
    }
    close(rd);
    result r = collect_ended(st);
    cr_log_info("the job ended %.1f s after it started", now_s() - t0);
    cr_assert(!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0, "exit 0:\n%s", r.err);
    cr_assert(strstr(r.err, "lm_train: rank 1: agreement between the ranks: ") &&
                  strstr(r.err, "rank 1 waited 3 s"),
              "stderr:\n%s", r.err);
    dp_test_result_free(&r);
}

/* A rank stopped (SIGSTOP) in the middle of training, under --watchdog 3:
 * the other rank gives up within a few watchdog periods, wherever it was
 * waiting (the engine's exchanges or the agreement between steps), and
 * the job ends. */
Test(lm_train_mpi, a_stopped_rank_ends_the_job_after_the_watchdog)
{
    pid_t other = 0;
    result r = rank_signalled(1, SIGSTOP, "3", &other);
    /* 3 s in an agreement; 6 s (twice the watchdog) in the reduce-scatter's
     * rounds, which leave a stuck peer's own watchdog time to name it */
    cr_assert(strstr(r.err, "lm_train: rank 0: ") &&
                  (strstr(r.err, "waited 3 s") || strstr(r.err, "waited 6 s")),
              "stderr:\n%s", r.err);
    dp_test_result_free(&r);
}
