/*
 * The lm_train trainer as a user runs it: the built binary (LM_TRAIN_PATH,
 * a compile definition) is spawned on a small generated corpus with a tiny
 * model on cpu:2, its stdout and stderr captured to files.
 *
 *  - resume is exact: 8 steps in one run give the same parameters and
 *    AdamW moments, bit for bit, as 4 steps, save, resume, 4 more;
 *  - a checkpoint from cpu:2 resumes on cpu:1;
 *  - --eval-only prints the same validation loss as the end of training;
 *    --val-tokens of the split's length or more changes nothing printed;
 *  - --lr-decay-steps: a run stopped part-way resumes bitwise;
 *  - SIGTERM / SIGINT save the checkpoint and exit with 128 + signal;
 *  - a resume truncates the JSONL log to the checkpoint's step, and the
 *    next save removes the temporary files a kill -9 left;
 *  - the prompt is checked before training (a corpus without a newline
 *    falls back to its first token); --eval-only works on another corpus;
 *    conflicting --tokenizer / --vocab-size on resume are refused;
 *  - --logits-chunk 7 is bitwise reproducible, matches whole logits to
 *    float rounding, and lowers every device's peak (the chunks ran);
 *  - --vocab-pad 64 trains as the unpadded run to float32 rounding,
 *    samples only ids below the vocabulary, records the pad, and resumes
 *    in either layout;
 *  - bad command lines fail fast with one "lm_train: ..." line on stderr,
 *    a non-zero exit status (not a signal) and no checkpoint or log file.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <signal.h>
#include <time.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "dp/checkpoint.h"
#include "dp/gpt.h"
#include "dp_test.h"
#include "dp_test_ckpt.h"
#include "dp_test_fs.h"
#include "dp_test_spawn.h"

#include <criterion/parameterized.h> /* after criterion.h (in dp_test.h) */

#ifndef LM_TRAIN_PATH
#error "LM_TRAIN_PATH (the lm_train binary) must be defined by the build"
#endif


// --- temp dir and files -----------------------------------------------------------------

static char tmpdir[64];

static void path_in(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", tmpdir, name);
}


static void write_file(const char *name, const void *b, size_t n)
{
    char p[256];
    path_in(p, sizeof p, name);
    FILE *f = fopen(p, "wb");
    cr_assert_not_null(f, "cannot create %s", p);
    cr_assert_eq(fwrite(b, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

static char *read_text(const char *path)
{
    size_t n;
    return (char *)dp_test_read_file(path, &n);
}

/* About `bytes` of pseudo-English: sentences of 3..12 words from a fixed
 * list, capitalised, ending in '.', '?' or '!', some with a comma, lines of
 * a few sentences. Deterministic in seed. */
static char *pseudo_english(uint64_t seed, size_t bytes, size_t *len)
{
    static const char *words[] = {
        "the", "of", "and", "to", "a", "in", "is", "it", "that", "was", "he", "for", "on",
        "are", "with", "as", "his", "they", "be", "at", "one", "have", "this", "from", "or",
        "had", "by", "word", "but", "what", "some", "we", "can", "out", "other", "were",
        "all", "there", "when", "up", "use", "your", "how", "said", "each", "she", "which",
        "do", "their", "time", "if", "will", "way", "about", "many", "then", "them", "would",
        "like", "so", "these", "her", "long", "make", "thing", "see", "him", "two", "has",
        "look", "more", "day", "could", "go", "come", "did", "number", "sound", "no", "most",
        "people", "my", "over", "know", "water", "than", "call", "first", "who", "may", "down",
        "side", "been", "now", "find", "river", "stone", "quiet", "morning", "light"};
    const size_t nw = sizeof words / sizeof words[0];
    dp_rng rng;
    dp_rng_seed(&rng, seed);
    char *t = malloc(bytes + 128);
    cr_assert_not_null(t);
    size_t n = 0;
    while (n < bytes) {
        size_t k = 3 + (size_t)dp_rng_below(&rng, 10);
        for (size_t i = 0; i < k; i++) {
            const char *w = words[dp_rng_below(&rng, nw)];
            size_t wl = strlen(w);
            memcpy(t + n, w, wl);
            if (i == 0) t[n] = (char)(t[n] - 'a' + 'A');
            n += wl;
            if (i + 1 < k) {
                if (dp_rng_below(&rng, 8) == 0) t[n++] = ',';
                t[n++] = ' ';
            }
        }
        static const char ends[] = ".....?!";
        t[n++] = ends[dp_rng_below(&rng, sizeof ends - 1)];
        t[n++] = dp_rng_below(&rng, 4) == 0 ? '\n' : ' ';
        if (n + 100 > bytes + 128) break;
    }
    t[n] = 0;
    *len = n;
    return t;
}

static void setup(void)
{
    strcpy(tmpdir, "/tmp/dp_test_lm_XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp failed");
    size_t len;
    char *text = pseudo_english(2024, 20000, &len);
    write_file("corpus.txt", text, len);
    /* 300 bytes: a validation split of 30 tokens, shorter than --context 32. */
    write_file("small.txt", text, 300);
    /* the corpus and a character it lacks: another char vocabulary */
    text[len - 1] = '~';
    write_file("other.txt", text, len);
    free(text);
}

static void teardown(void) { dp_test_remove_tree(tmpdir); }

// --- running lm_train -------------------------------------------------------------------

typedef dp_test_result result;
#define result_free dp_test_result_free

/* The options every run gets: a tiny, fast model on two CPU devices. Later
 * options on the command line override these (getopt keeps the last). */
static const char *const BASE[] = {"--data", "@corpus.txt", "--devices", "cpu:2", "--layers", "1",
                                   "--heads", "2", "--dim", "16", "--context", "16",
                                   "--batch-size", "4", "--sample", "0", "--eval-iters", "1"};
#define N_BASE (sizeof BASE / sizeof BASE[0])

/* Starts lm_train with BASE (when with_base) and then extra[0..n) (NULL
 * entries skipped); an argument starting with '@' names a file in tmpdir.
 * stdout and stderr go to stdout.txt and stderr.txt there (stdout to
 * stdout_path instead when not NULL). */
static pid_t spawn_args_to(int with_base, const char *const *extra, size_t n,
                           const char *stdout_path)
{
    char *argv[N_BASE + 32];
    size_t argc = 0, nb = with_base ? N_BASE : 0;
    argv[argc++] = (char *)LM_TRAIN_PATH;
    for (size_t i = 0; i < nb + n; i++) {
        const char *a = i < nb ? BASE[i] : extra[i - nb];
        if (!a) continue;
        cr_assert_lt(argc, sizeof argv / sizeof argv[0] - 1);
        if (a[0] == '@') {
            char p[256];
            path_in(p, sizeof p, a + 1);
            argv[argc++] = strdup(p);
        } else {
            argv[argc++] = strdup(a);
        }
    }
    argv[argc] = NULL;
    char out_path[256], err_path[256];
    path_in(out_path, sizeof out_path, "stdout.txt");
    path_in(err_path, sizeof err_path, "stderr.txt");
    pid_t pid = dp_test_spawn(argv, stdout_path ? stdout_path : out_path, err_path);
    for (size_t i = 1; i < argc; i++) free(argv[i]);
    return pid;
}

static pid_t spawn_args(int with_base, const char *const *extra, size_t n)
{
    return spawn_args_to(with_base, extra, n, NULL);
}

/* Waits for pid and collects its exit status and output. */
static result collect(pid_t pid)
{
    char out_path[256], err_path[256];
    path_in(out_path, sizeof out_path, "stdout.txt");
    path_in(err_path, sizeof err_path, "stderr.txt");
    return dp_test_collect(pid, out_path, err_path);
}

static result run_args(int with_base, const char *const *extra, size_t n)
{
    return collect(spawn_args(with_base, extra, n));
}

static result run_lm(const char *const *extra, size_t n) { return run_args(1, extra, n); }

#define ARGS_(...)                                                                         \
    (const char *const[]){__VA_ARGS__},                                                    \
        sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *)
/* RUN: BASE + the arguments; RUN_RAW: the arguments alone. */
#define RUN(...) run_args(1, ARGS_(__VA_ARGS__))
#define RUN_RAW(...) run_args(0, ARGS_(__VA_ARGS__))

/* The run exited 0; otherwise fail showing its stderr. */
static void assert_success(const result *r, const char *what)
{
    cr_assert(WIFEXITED(r->status) && WEXITSTATUS(r->status) == 0,
              "%s: lm_train %s %d; stderr:\n%s", what,
              WIFEXITED(r->status) ? "exited with" : "was killed by signal",
              WIFEXITED(r->status) ? WEXITSTATUS(r->status) : WTERMSIG(r->status), r->err);
}

static dp_checkpoint *load_ck(const char *name)
{
    char p[256];
    path_in(p, sizeof p, name);
    return dp_test_load_ck(p);
}

#define ck_params dp_test_ck_params
#define number_after dp_test_number_after

TestSuite(lm_train, .init = setup, .fini = teardown, .timeout = 60);

// --- resume -------------------------------------------------------------------------

/* The learning rate schedule depends on --steps once warmup is over, so
 * the runs keep the default --warmup (100) above --steps (8): then every
 * step's learning rate is the same whether the run was planned for 4 or 8
 * steps, and exactness depends only on the checkpoint restoring the
 * parameters, moments, AdamW's step count and the batch sampler. */
Test(lm_train, resume_is_bitwise_exact)
{
    result a = RUN("--steps", "8", "--save", "@a.st");
    assert_success(&a, "run A (8 steps)");
    result b1 = RUN("--steps", "4", "--save", "@b.st");
    assert_success(&b1, "run B (4 steps)");
    dp_checkpoint *half = load_ck("b.st");
    cr_assert_eq(half->step, 4);
    result b2 = RUN("--resume", "@b.st", "--steps", "8", "--save", "@b.st");
    assert_success(&b2, "run B resumed (to 8 steps)");

    dp_checkpoint *ca = load_ck("a.st"), *cb = load_ck("b.st");
    size_t n = ck_params(ca);
    cr_assert_eq(ck_params(cb), n);
    cr_assert_eq(ca->step, 8);
    cr_assert_eq(cb->step, 8);
    cr_assert_eq(ca->optimizer_step, cb->optimizer_step);
    cr_assert_not_null(ca->m);
    cr_assert_not_null(cb->m);
    cr_assert_eq(memcmp(ca->params, cb->params, n * sizeof(float)), 0,
                 "parameters after 8 steps differ from 4 + resume + 4");
    cr_assert_eq(memcmp(ca->m, cb->m, n * sizeof(float)), 0, "AdamW m differs after resume");
    cr_assert_eq(memcmp(ca->v, cb->v, n * sizeof(float)), 0, "AdamW v differs after resume");
    cr_assert(ca->has_sampler && cb->has_sampler);
    cr_assert_eq(memcmp(ca->sampler, cb->sampler, sizeof ca->sampler), 0,
                 "batch sampler state differs after resume");
    /* The test has teeth: the resumed run really changed the parameters. */
    cr_assert_neq(memcmp(half->params, cb->params, n * sizeof(float)), 0,
                  "resuming trained nothing");
    /* Both runs report the same final validation loss. */
    cr_assert_eq(number_after(a.out, "final val_loss "), number_after(b2.out, "final val_loss "),
                 "A:\n%s\nB:\n%s", a.out, b2.out);

    dp_checkpoint_close(half);
    dp_checkpoint_close(ca);
    dp_checkpoint_close(cb);
    result_free(&a);
    result_free(&b1);
    result_free(&b2);
}

Test(lm_train, checkpoint_from_two_devices_resumes_on_one)
{
    result a = RUN("--steps", "3", "--save", "@two.st");
    assert_success(&a, "training on cpu:2");
    /* Without BASE: the model's shape comes from the checkpoint; --dim 16
     * agrees with it and the other shape options are not given. */
    result b = RUN_RAW("--data", "@corpus.txt", "--devices", "cpu:1", "--resume", "@two.st",
                       "--dim", "16", "--batch-size", "4", "--sample", "0", "--eval-iters", "1",
                       "--steps", "5", "--save", "@one.st");
    assert_success(&b, "resuming on cpu:1");
    cr_assert(strstr(b.out, "1 device (cpu:0)") != NULL, "not on one device:\n%s", b.out);
    dp_checkpoint *ck = load_ck("one.st");
    cr_assert_eq(ck->step, 5);
    cr_assert_eq(ck->optimizer_step, 5);
    dp_checkpoint_close(ck);
    result_free(&a);
    result_free(&b);
}

// --- evaluation -----------------------------------------------------------------------

Test(lm_train, eval_only_matches_final_val_loss)
{
    result a = RUN("--steps", "5", "--save", "@e.st");
    assert_success(&a, "training");
    double final = number_after(a.out, "final val_loss ");
    cr_assert(isfinite(final), "no \"final val_loss X\" line:\n%s", a.out);

    result e = RUN("--resume", "@e.st", "--eval-only");
    assert_success(&e, "--eval-only");
    const char *line = strstr(e.out, "val_loss ");
    cr_assert_not_null(line, "no val_loss line:\n%s", e.out);
    double v = NAN;
    cr_assert_eq(sscanf(line, "val_loss %lf", &v), 1, "%s", line);
    cr_assert(isfinite(v) && v > 0, "val_loss %g", v);
    /* Same computation on the same devices: they differ only by printing,
     * final with 4 decimals (error <= 5e-5), eval-only with 6 (<= 5e-7). */
    cr_assert(fabs(final - v) <= 5e-5 + 5e-7, "final val_loss %.6f vs --eval-only %.6f", final, v);
    cr_assert_null(strstr(e.out, "trained"), "--eval-only trained:\n%s", e.out);
    result_free(&a);
    result_free(&e);
}

/* --val-tokens as long as the validation split, or longer, is the whole
 * split: the same output to the byte (the same loss, no note). Shorter
 * limits are checked on token files (test_lm_train_tokens.c). */
Test(lm_train, val_tokens_of_the_whole_split_changes_nothing)
{
    result a = RUN("--steps", "2", "--save", "@v.st");
    assert_success(&a, "training");
    result e = RUN("--resume", "@v.st", "--eval-only");
    assert_success(&e, "--eval-only");
    /* The data line: "N tokens: X train, Y validation". */
    double nval = number_after(e.out, " train, ");
    cr_assert(isfinite(nval) && nval > 17, "no validation size:\n%s", e.out);
    char whole[32];
    snprintf(whole, sizeof whole, "%.0f", nval);
    result w = RUN("--resume", "@v.st", "--eval-only", "--val-tokens", whole);
    assert_success(&w, "--val-tokens the split's length");
    cr_assert_str_eq(w.out, e.out, "--val-tokens %s", whole);
    result x = RUN("--resume", "@v.st", "--eval-only", "--val-tokens", "9223372036854775807");
    assert_success(&x, "--val-tokens LONG_MAX");
    cr_assert_str_eq(x.out, e.out, "--val-tokens LONG_MAX");
    cr_assert_null(strstr(e.out, "validation: the first"), "%s", e.out);
    result_free(&a);
    result_free(&e);
    result_free(&w);
    result_free(&x);
}

// --- non-finite steps and crash safety -------------------------------------------------

/* A learning rate of 1e30 blows the parameters up in one update (AdamW's
 * step is about lr in size), so every later step has a non-finite loss:
 * each is skipped, --max-skips of them in a row stop the run, and the
 * checkpoint saved before is left as it was and still resumes. */
Test(lm_train, non_finite_steps_stop_training_and_keep_the_last_checkpoint)
{
    result a = RUN("--steps", "4", "--save", "@g.st");
    assert_success(&a, "4 good steps");
    char g[256];
    path_in(g, sizeof g, "g.st");
    size_t n0, n1;
    unsigned char *before = dp_test_read_file(g, &n0);

    /* --lr-decay-steps: the checkpoint's schedule (4 steps long) would give min_lr. */
    result b = RUN("--resume", "@g.st", "--steps", "40", "--lr", "1e30", "--warmup", "0",
                   "--lr-decay-steps", "40",
                   "--max-skips", "3", "--save", "@g.st", "--save-interval", "2", "--log",
                   "@skip.jsonl");
    cr_assert(WIFEXITED(b.status) && WEXITSTATUS(b.status) != 0,
              "a run that only produces NaN did not fail; stdout:\n%s", b.out);
    cr_assert(strstr(b.err, "3 consecutive steps") && strstr(b.err, "non-finite") &&
                  strstr(b.err, "intact"),
              "stderr: %s", b.err);
    cr_assert(strstr(b.out, "step 6 skipped: non-finite loss or gradient on cpu:"),
              "no skip line naming a device:\n%s", b.out);
    /* The log counts the skipped steps; JSON has no NaN, so the loss is null. */
    char lp[256];
    path_in(lp, sizeof lp, "skip.jsonl");
    char *log = read_text(lp);
    cr_assert(strstr(log, "\"loss\":null") && strstr(log, "\"skipped\":true") &&
                  strstr(log, "\"skipped_total\":3"),
              "log:\n%s", log);
    free(log);

    /* Step 5 updated (the last good step) but was never saved: the file is
     * the 4-step checkpoint, byte for byte, and it still resumes. */
    unsigned char *after = dp_test_read_file(g, &n1);
    cr_assert(n0 == n1 && memcmp(before, after, n0) == 0, "the checkpoint changed");
    free(before);
    free(after);
    result c = RUN("--resume", "@g.st", "--steps", "6");
    assert_success(&c, "resuming the intact checkpoint");
    cr_assert(strstr(c.out, "trained 2 steps"), "%s", c.out);
    result_free(&a);
    result_free(&b);
    result_free(&c);
}

/* Kill -9 at arbitrary moments of a run that saves every step (about 1 MB
 * per save here, so many kills land inside a write): the checkpoint path
 * always holds a complete checkpoint (or none yet), leftover temporary
 * files do not get in the way, and --resume continues from it. */
Test(lm_train, killed_while_saving_leaves_a_loadable_checkpoint, .timeout = 120)
{
    char ck_path[256];
    path_in(ck_path, sizeof ck_path, "k.st");
    const long delays_ms[] = {30, 90, 160, 240, 330, 420};
    int loaded = 0;
    for (size_t i = 0; i < sizeof delays_ms / sizeof delays_ms[0]; i++) {
        const char *const extra[] = {"--dim", "64", "--heads", "4", "--layers", "2",
                                     "--steps", "100000", "--save", "@k.st",
                                     "--save-interval", "1", "--eval-interval", "100000"};
        const char *const resume[] = {"--resume", "@k.st"};
        const char *args[20];
        size_t n = 0;
        for (size_t j = 0; j < sizeof extra / sizeof extra[0]; j++) args[n++] = extra[j];
        struct stat sb;
        if (stat(ck_path, &sb) == 0)
            for (size_t j = 0; j < 2; j++) args[n++] = resume[j];
        pid_t pid = spawn_args(1, args, n);
        /* The first run is killed only once it has saved, however slow the
         * machine: the kills are then at arbitrary moments of a run that
         * has a checkpoint, which is what this test is about. */
        for (int waited = 0; i == 0 && stat(ck_path, &sb) != 0; waited += 5) {
            if (waited >= 60000) { /* killed first: a failed test leaves nothing training */
                kill(pid, SIGKILL);
                cr_assert_fail("lm_train wrote no checkpoint in 60 s; stderr:\n%s",
                               collect(pid).err);
            }
            struct timespec poll = {0, 5 * 1000000L};
            nanosleep(&poll, NULL);
        }
        struct timespec ts = {0, delays_ms[i] * 1000000L};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        result r = collect(pid);
        result_free(&r);
        if (stat(ck_path, &sb) == 0) {
            dp_checkpoint *ck = NULL;
            dp_status s = dp_gpt_checkpoint_load(ck_path, &ck, NULL);
            cr_assert_eq(s, DP_OK, "after a kill at %ld ms the checkpoint does not load: %s",
                         delays_ms[i], dp_last_error());
            dp_checkpoint_close(ck);
            loaded++;
        }
    }
    cr_assert_eq(loaded, (int)(sizeof delays_ms / sizeof delays_ms[0]),
                 "a kill left no checkpoint behind");

    /* A truncated temp file such as a kill leaves, named as the writer names
     * them, of a process that is gone (a reaped child). */
    pid_t dead = fork();
    cr_assert_geq(dead, 0);
    if (dead == 0) _exit(0);
    cr_assert_eq(waitpid(dead, NULL, 0), dead);
    char junk[300];
    dp_atomic_file *probe = NULL; /* this host's tag, as the writer names it */
    dp_assert_ok(dp_atomic_file_open(ck_path, &probe));
    snprintf(junk, sizeof junk, "%s.tmp.%ld.0.%s", ck_path, (long)dead,
             strrchr(dp_atomic_file_temp_path(probe), '.') + 1);
    dp_atomic_file_abort(probe);
    dp_test_write_file(junk, "\x40\0\0\0\0\0\0\0{\"a\"", 12);
    dp_checkpoint *ck = load_ck("k.st");
    long step = ck->step;
    dp_checkpoint_close(ck);
    char until[32];
    snprintf(until, sizeof until, "%ld", step + 2);
    result r = RUN("--dim", "64", "--heads", "4", "--layers", "2", "--resume", "@k.st",
                   "--steps", until, "--save", "@k.st");
    assert_success(&r, "resuming after kills");
    cr_assert(strstr(r.out, "trained 2 steps"), "%s", r.out);
    ck = load_ck("k.st");
    cr_assert_eq(ck->step, step + 2);
    dp_checkpoint_close(ck);
    /* The save after the resume removed every temporary file the kills left. */
    DIR *d = opendir(tmpdir);
    struct dirent *de;
    while ((de = readdir(d)))
        cr_assert_null(strstr(de->d_name, ".tmp."), "stale temporary file %s was left",
                       de->d_name);
    closedir(d);
    result_free(&r);
}

// --- schedule, signals, logs and prompts --------------------------------------------------

/* Bitwise equality of the parameters and AdamW moments of two checkpoints. */
static void assert_same_state(const char *a_name, const char *b_name)
{
    char a[256], b[256];
    path_in(a, sizeof a, a_name);
    path_in(b, sizeof b, b_name);
    dp_test_assert_same_state(a, b, 0);
}

/* --lr-decay-steps makes the schedule independent of --steps, so a run
 * stopped part-way resumes bitwise: 8 steps of a 20-step schedule, then a
 * resume to 16 without the flag (the checkpoint's 20 counts), equals 16
 * steps of the same schedule in one run. Warmup 2, so the decay matters:
 * 16 steps of a 16-step schedule differ. */
Test(lm_train, lr_decay_steps_resume_is_bitwise_exact)
{
    result a = RUN("--steps", "16", "--lr-decay-steps", "20", "--warmup", "2", "--save", "@a.st");
    assert_success(&a, "16 of 20");
    result b1 = RUN("--steps", "8", "--lr-decay-steps", "20", "--warmup", "2", "--save", "@b.st");
    assert_success(&b1, "8 of 20");
    dp_checkpoint *half = load_ck("b.st");
    cr_assert_str_eq(dp_checkpoint_meta(half, "lr_decay_steps"), "20");
    dp_checkpoint_close(half);
    result b2 = RUN("--resume", "@b.st", "--steps", "16", "--warmup", "2", "--save", "@b.st");
    assert_success(&b2, "resumed to 16");
    assert_same_state("a.st", "b.st");
    /* The flag given again on resume gives the same. */
    result c1 = RUN("--steps", "8", "--lr-decay-steps", "20", "--warmup", "2", "--save", "@c.st");
    assert_success(&c1, "8 of 20 again");
    result c2 = RUN("--resume", "@c.st", "--steps", "16", "--lr-decay-steps", "20", "--warmup",
                    "2", "--save", "@c.st");
    assert_success(&c2, "resumed to 16 with the flag");
    assert_same_state("a.st", "c.st");
    /* Teeth: a 16-step schedule trains differently. */
    result d = RUN("--steps", "16", "--warmup", "2", "--save", "@d.st");
    assert_success(&d, "16 of 16");
    dp_checkpoint *ca = load_ck("a.st"), *cd = load_ck("d.st");
    cr_assert_str_eq(dp_checkpoint_meta(cd, "lr_decay_steps"), "16");
    cr_assert_neq(memcmp(ca->params, cd->params, ck_params(ca) * sizeof(float)), 0,
                  "the decay length changed nothing");
    dp_checkpoint_close(ca);
    dp_checkpoint_close(cd);
    result_free(&a);
    result_free(&b1);
    result_free(&b2);
    result_free(&c1);
    result_free(&c2);
    result_free(&d);
}

// --- the padded vocabulary -------------------------------------------------------------

/* Checkpoint name's parameters and the moved/diff measure against a and
 * the initial parameters p0 (dp_test_param_drift). */
static void assert_drift(const char *a_name, const char *b_name, const dp_checkpoint *init,
                         const char *what)
{
    dp_checkpoint *a = load_ck(a_name), *b = load_ck(b_name);
    size_t n = ck_params(a);
    cr_assert_eq(ck_params(b), n);
    cr_assert_eq(a->step, b->step);
    double diff, moved;
    dp_test_param_drift(a->params, b->params, init->params, n, &diff, &moved);
    cr_log_info("%s: parameters differ by %.3g on average, moved by %.3g", what, diff / n,
                moved / n);
    /* The same training to float32 rounding (tests/test_gpt_pad.c): a few
     * key-bias entries, whose exact gradient is 0, may move by AdamW's lr
     * per step either way; everything else agrees to about 1e-7. Measured:
     * differences 3e-7 of the move. */
    cr_assert(moved > 0 && diff <= 1e-4 * moved, "%s: parameters differ by %g on average, "
              "training moved them by %g", what, diff / n, moved / n);
    dp_checkpoint_close(a);
    dp_checkpoint_close(b);
}

/* The sample printed in out: what follows its header line up to the final
 * "\n---\n" (the prompt, then the tokens). */
static size_t sample_chars(const char *out)
{
    const char *h = strstr(out, "--- sample (");
    cr_assert_not_null(h, "no sample:\n%s", out);
    const char *start = strchr(h, '\n') + 1, *end = NULL, *q = start;
    while ((q = strstr(q, "\n---\n"))) end = q++;
    cr_assert_not_null(end, "the sample does not end:\n%s", out);
    return (size_t)(end - start);
}

/* --vocab-pad 64 pads the char vocabulary of the corpus (under 64
 * characters) to 64 inside the model. Training is the unpadded run's to
 * float32 rounding (without the -inf mask the padded logits would be 0,
 * the loss another one: measured, parameters 6% of their move apart); the
 * sample, with top-k off and temperature 1 so that every id with a
 * probability can come, holds exactly --sample characters after the
 * prompt (a newline): an id >= V would print nothing; the checkpoint
 * keeps wte's true rows and records the pad, which a resume keeps unless
 * --vocab-pad is given; and a run resumes in the other layout. */
Test(lm_train, vocab_pad_trains_samples_below_v_and_resumes_across_layouts, .timeout = 120)
{
    result i = RUN("--steps", "0", "--save", "@init.st");
    assert_success(&i, "the initial parameters");
    dp_checkpoint *init = load_ck("init.st");
    result a = RUN("--steps", "4", "--save", "@plain.st");
    assert_success(&a, "unpadded");
    cr_assert_null(strstr(a.out, "padded"), "CPU devices pad nothing by default:\n%s", a.out);
    result b = RUN("--steps", "4", "--vocab-pad", "64", "--sample", "200", "--top-k", "0",
                   "--temperature", "1", "--save", "@pad.st");
    assert_success(&b, "--vocab-pad 64");
    cr_assert(strstr(b.out, "padded to 64 (--vocab-pad 64)"), "%s", b.out);
    cr_assert_eq(sample_chars(b.out), 1 + 200, "the sample holds ids past the vocabulary:\n%s",
                 b.out);
    dp_checkpoint *pad = load_ck("pad.st"), *plain = load_ck("plain.st");
    cr_assert_str_eq(dp_checkpoint_meta(pad, "vocab_pad"), "64");
    cr_assert_str_eq(dp_checkpoint_meta(plain, "vocab_pad"), "1");
    /* The same tensors: the file holds the model, not the layout. */
    cr_assert_eq(ck_params(pad), ck_params(plain));
    dp_checkpoint_close(pad);
    dp_checkpoint_close(plain);
    assert_drift("plain.st", "pad.st", init, "padded against unpadded");

    /* Padded half, resumed with the checkpoint's pad: bitwise the padded run. */
    result c1 = RUN("--steps", "2", "--vocab-pad", "64", "--save", "@keep.st");
    assert_success(&c1, "padded half");
    result c2 = RUN("--resume", "@keep.st", "--steps", "4", "--save", "@keep.st");
    assert_success(&c2, "resumed with the checkpoint's pad");
    cr_assert(strstr(c2.out, "padded to 64"), "%s", c2.out);
    assert_same_state("pad.st", "keep.st");
    /* Padded half resumed unpadded, and the reverse. */
    result d1 = RUN("--steps", "2", "--vocab-pad", "64", "--save", "@p2u.st");
    assert_success(&d1, "padded half");
    result d2 = RUN("--resume", "@p2u.st", "--steps", "4", "--vocab-pad", "1", "--save", "@p2u.st");
    assert_success(&d2, "resumed unpadded");
    cr_assert_null(strstr(d2.out, "padded"), "%s", d2.out);
    dp_checkpoint *ck = load_ck("p2u.st");
    cr_assert_str_eq(dp_checkpoint_meta(ck, "vocab_pad"), "1");
    dp_checkpoint_close(ck);
    assert_drift("plain.st", "p2u.st", init, "padded, then unpadded");
    result e1 = RUN("--steps", "2", "--save", "@u2p.st");
    assert_success(&e1, "unpadded half");
    result e2 = RUN("--resume", "@u2p.st", "--steps", "4", "--vocab-pad", "64", "--save", "@u2p.st");
    assert_success(&e2, "resumed padded");
    cr_assert(strstr(e2.out, "padded to 64"), "%s", e2.out);
    assert_drift("plain.st", "u2p.st", init, "unpadded, then padded");
    dp_checkpoint_close(init);
    result *rs[] = {&i, &a, &b, &c1, &c2, &d1, &d2, &e1, &e2};
    for (size_t k = 0; k < sizeof rs / sizeof *rs; k++) result_free(rs[k]);
}

/* The last checkpoint holds the last step even when --save-interval does
 * not divide --steps. */
/* --shard-optimizer: the same run, bitwise; its checkpoint resumes unsharded
 * (the moments are saved flat whatever the sharding), again bitwise. */
Test(lm_train, shard_optimizer_is_bitwise_the_root_run)
{
    result a = RUN("--steps", "4", "--save", "@root.st");
    assert_success(&a, "root run");
    result b = RUN("--steps", "4", "--shard-optimizer", "--save", "@shard.st");
    assert_success(&b, "sharded run");
    cr_assert(strstr(b.out, "sharded optimizer"), "%s", b.out);
    assert_same_state("root.st", "shard.st");
    result c = RUN("--steps", "2", "--lr-decay-steps", "4", "--shard-optimizer", "--save",
                   "@half.st");
    assert_success(&c, "sharded half run");
    result d = RUN("--steps", "4", "--resume", "@half.st", "--save", "@half.st");
    assert_success(&d, "unsharded resume");
    assert_same_state("root.st", "half.st");
    result_free(&a);
    result_free(&b);
    result_free(&c);
    result_free(&d);
}

/* --bucket-mb: the reduce-scatter summed while the backward runs, in
 * pieces of 4 bytes or of the default 4 MiB, gives the run without
 * overlap (--bucket-mb off), bitwise. */
Test(lm_train, bucket_mb_is_bitwise_the_run_without_overlap)
{
    result a = RUN("--steps", "3", "--bucket-mb", "off", "--save", "@off.st");
    assert_success(&a, "no overlap");
    result b = RUN("--steps", "3", "--bucket-mb", "0.000004", "--save", "@tiny.st");
    assert_success(&b, "4-byte buckets");
    result c = RUN("--steps", "3", "--save", "@default.st");
    assert_success(&c, "default bucket");
    assert_same_state("off.st", "tiny.st");
    assert_same_state("off.st", "default.st");
    result_free(&a);
    result_free(&b);
    result_free(&c);
}

/* --recompute all keeps neither the attention probabilities nor the GELU
 * output and recomputes them: the same run, bitwise, in float32 and in
 * bf16. */
Test(lm_train, recompute_is_bitwise_the_same_run)
{
    static const char *const prec[] = {"fp32", "bf16"};
    for (int i = 0; i < 2; i++) {
        result a = RUN("--steps", "3", "--precision", prec[i], "--save", "@keep.st");
        assert_success(&a, "activations kept");
        result b = RUN("--steps", "3", "--precision", prec[i], "--recompute", "all", "--save",
                       "@again.st");
        assert_success(&b, "activations recomputed");
        cr_assert(strstr(b.out, "attention and GELU recomputed"), "%s", b.out);
        assert_same_state("keep.st", "again.st");
        result_free(&a);
        result_free(&b);
    }
}

/* --tf32 on CPU devices: they compute float32 (TF32 is a GPU tensor-core
 * format), and a note says so; the run trains as without the flag. */
Test(lm_train, tf32_on_cpus_is_noted_and_changes_nothing)
{
    result a = RUN("--steps", "2", "--tf32");
    assert_success(&a, "--tf32");
    cr_assert(strstr(a.out, "note: cpu:0,cpu:1 compute --tf32 GEMMs in float32"), "%s", a.out);
    result b = RUN("--steps", "2");
    assert_success(&b, "without --tf32");
    cr_assert_null(strstr(b.out, "note:"), "%s", b.out);
    cr_assert_eq(number_after(a.out, "final val_loss "), number_after(b.out, "final val_loss "));
    result_free(&a);
    result_free(&b);
}

/* --precision bf16: bf16 replicas and GEMMs, float32 masters. The
 * checkpoint holds the masters (float32 values that bfloat16 cannot hold)
 * and the precision; a resume without the flag continues in bf16,
 * bitwise; --precision fp32 resumes the same file in float32; bf16 tracks
 * float32 training. */
Test(lm_train, bf16_resumes_bitwise_in_the_checkpoints_precision)
{
    result a = RUN("--steps", "8", "--precision", "bf16", "--save", "@a.st");
    assert_success(&a, "bf16, 8 steps");
    cr_assert(strstr(a.out, "bf16 (float32 masters)"), "%s", a.out);
    /* a note says so where the CPU's bf16 GEMMs are emulated (slower) */
    dp_device *cpu = dp_test_cpu(0);
    int native = -1;
    dp_assert_ok(dp_device_matmul_native(cpu, DP_MATMUL_BF16, &native));
    dp_device_close(cpu);
    cr_assert_eq(strstr(a.out, "no bf16 matmul in oneDNN") == NULL, native, "%s", a.out);
    result b1 = RUN("--steps", "4", "--precision", "bf16", "--save", "@b.st");
    assert_success(&b1, "bf16, 4 steps");
    dp_checkpoint *half = load_ck("b.st");
    cr_assert_str_eq(dp_checkpoint_meta(half, "precision"), "bf16");
    size_t n = ck_params(half), unrounded = 0;
    for (size_t i = 0; i < n; i++)
        unrounded += dp_bf16_to_float(dp_bf16_from_float(half->params[i])) != half->params[i];
    cr_assert_gt(unrounded, n / 4, "the checkpoint holds bfloat16 values, not the masters");
    dp_checkpoint_close(half);
    result b2 = RUN("--resume", "@b.st", "--steps", "8", "--save", "@b.st");
    assert_success(&b2, "resumed without --precision");
    cr_assert(strstr(b2.out, "bf16 (float32 masters)"), "not resumed in bf16:\n%s", b2.out);
    assert_same_state("a.st", "b.st");
    cr_assert_eq(number_after(a.out, "final val_loss "), number_after(b2.out, "final val_loss "));
    /* the same half run resumed in float32: it runs, and trains differently */
    result c1 = RUN("--steps", "4", "--precision", "bf16", "--save", "@c.st");
    assert_success(&c1, "bf16, 4 steps again");
    result c2 = RUN("--resume", "@c.st", "--precision", "fp32", "--steps", "8", "--save", "@c.st");
    assert_success(&c2, "resumed in fp32");
    cr_assert_null(strstr(c2.out, "bf16"), "%s", c2.out);
    dp_checkpoint *ca = load_ck("a.st"), *cc = load_ck("c.st");
    cr_assert_str_eq(dp_checkpoint_meta(cc, "precision"), "fp32");
    cr_assert_neq(memcmp(ca->params, cc->params, n * sizeof(float)), 0, "fp32 changed nothing");
    dp_checkpoint_close(ca);
    dp_checkpoint_close(cc);
    /* a bf16 checkpoint with --tf32 and no --precision is refused, nothing written */
    result d = RUN("--resume", "@c.st", "--steps", "9", "--tf32", "--save", "@d.st");
    cr_assert_eq(d.status, 0, "fp32 checkpoint with --tf32 must run:\n%s", d.err);
    result e = RUN("--resume", "@b.st", "--steps", "9", "--tf32", "--save", "@e.st");
    cr_assert_neq(e.status, 0);
    cr_assert(strstr(e.err, "--tf32") && strstr(e.err, "bf16"), "%s", e.err);
    struct stat sb;
    char ep[256];
    path_in(ep, sizeof ep, "e.st");
    cr_assert_neq(stat(ep, &sb), 0, "e.st was written");
    /* bf16 tracks float32 over the same 8 steps */
    result f = RUN("--steps", "8", "--save", "@f.st");
    assert_success(&f, "fp32, 8 steps");
    double l16 = number_after(a.out, "final val_loss "), l32 = number_after(f.out, "final val_loss ");
    cr_assert(fabs(l16 - l32) <= 0.02 * l32, "bf16 val loss %g, fp32 %g", l16, l32);
    result r[] = {a, b1, b2, c1, c2, d, e, f};
    for (size_t i = 0; i < sizeof r / sizeof *r; i++) result_free(&r[i]);
}

Test(lm_train, save_interval_not_dividing_steps_saves_the_last_step)
{
    result a = RUN("--steps", "5", "--save-interval", "2", "--save", "@x.st");
    assert_success(&a, "5 steps, saving every 2");
    dp_checkpoint *ck = load_ck("x.st");
    cr_assert_eq(ck->step, 5);
    cr_assert_eq(ck->optimizer_step, 5);
    dp_checkpoint_close(ck);
    result_free(&a);
}

/* 1 when file (in tmpdir) holds needle, read afresh. */
static int file_has(const char *name, const char *needle)
{
    char p[256];
    path_in(p, sizeof p, name);
    size_t n;
    char *t = (char *)dp_test_read_file(p, &n);
    int has = strstr(t, needle) != NULL;
    free(t);
    return has;
}

/* Waits for the run pid's first progress line (stdout.txt); after 30 s
 * kills it (a failed test must not leave it training) and fails. */
static void wait_for_step(pid_t pid)
{
    for (int i = 0; !file_has("stdout.txt", "step "); i++) {
        if (i == 3000) {
            kill(pid, SIGKILL);
            cr_assert_fail("no progress line within 30 s; stderr:\n%s", collect(pid).err);
        }
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* SIGTERM or SIGINT after the first progress line: the run saves its
 * checkpoint, says so in one stderr line, and exits with 128 + signal. */
Test(lm_train, signal_saves_the_checkpoint_and_exits_non_zero, .timeout = 120)
{
    const int sigs[3] = {SIGTERM, SIGINT, SIGHUP};
    const char *names[3] = {"SIGTERM", "SIGINT", "SIGHUP"};
    for (int i = 0; i < 3; i++) {
        const char *const args[] = {"--steps", "100000000", "--eval-interval", "10", "--save",
                                    "@sig.st", "--log", "@sig.jsonl"};
        pid_t pid = spawn_args(1, args, sizeof args / sizeof args[0]);
        wait_for_step(pid);
        kill(pid, sigs[i]);
        result r = collect(pid);
        cr_assert(WIFEXITED(r.status), "%s: killed by the signal instead of stopping; stderr:\n%s",
                  names[i], r.err);
        cr_assert_eq(WEXITSTATUS(r.status), 128 + sigs[i], "%s: exit status %d; stderr:\n%s",
                     names[i], WEXITSTATUS(r.status), r.err);
        size_t lines = 0;
        for (const char *p = r.err; *p; p++) lines += *p == '\n';
        cr_assert_eq(lines, 1, "%s: stderr:\n%s", names[i], r.err);
        cr_assert(strstr(r.err, "interrupted by ") && strstr(r.err, names[i]) &&
                      strstr(r.err, "checkpoint saved to"),
                  "%s: stderr: %s", names[i], r.err);
        dp_checkpoint *ck = load_ck("sig.st");
        cr_assert_gt(ck->step, 0, "%s: the checkpoint holds step 0", names[i]);
        /* The output was flushed: the log's last row is the checkpoint's step. */
        char want[48];
        snprintf(want, sizeof want, "{\"step\":%ld,", ck->step);
        cr_assert(file_has("sig.jsonl", want), "%s: the log lacks step %ld", names[i], ck->step);
        dp_checkpoint_close(ck);
        result_free(&r);
        char p[256];
        path_in(p, sizeof p, "sig.st");
        unlink(p);
    }
}

/* AddressSanitizer refuses a preloaded library that comes before its
 * runtime unless told (the asan-ubsan preset). */
static void preload(const char *library)
{
    setenv("LD_PRELOAD", library, 1);
    const char *asan = getenv("ASAN_OPTIONS");
    char opts[1024];
    snprintf(opts, sizeof opts, "%s%sverify_asan_link_order=0", asan ? asan : "",
             asan && *asan ? ":" : "");
    setenv("ASAN_OPTIONS", opts, 1);
}

/* A worker stuck inside a device call (a GEMM that never returns,
 * preloaded): the watchdog fails the step, the engine is unusable, and
 * lm_train ends with status 1 naming it instead of waiting for the
 * worker forever (the test's timeout bounds a hang). */
Test(lm_train, a_worker_stuck_in_a_device_call_ends_the_run, .timeout = 60)
{
    preload(STUCK_GEMM_PATH);
    result r = RUN("--steps", "5", "--watchdog", "1", "--save", "@stuck.st");
    unsetenv("LD_PRELOAD");
    cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 1, "status %d; stderr:\n%s",
              r.status, r.err);
    cr_assert(strstr(r.err, "watchdog") && strstr(r.err, "unusable"), "stderr:\n%s", r.err);
    result_free(&r);
}

/* On a host with 100 MB available (fake_meminfo.c, preloaded), a batch of
 * 500000 x 16 tokens (64 MB of inputs and targets) fits, but not beside
 * the engine's copy of it: lm_train touches its batch before the engine's
 * devices measure the host, so they see 36 MB left and refuse their
 * share with the numbers. It used to be counted against the 100 MB
 * as if the batch took nothing, and the two grew into the OOM killer
 * (GPT context 16 with --batch-size 1e8 on a 24 GB host). */
Test(lm_train, the_batch_counts_against_the_host_before_the_engine, .timeout = 60)
{
    preload(FAKE_MEMINFO_PATH);
    setenv("DP_TEST_MEM_AVAILABLE_KB", "100000", 1);
    result r = RUN("--steps", "1", "--batch-size", "500000");
    unsetenv("LD_PRELOAD");
    unsetenv("DP_TEST_MEM_AVAILABLE_KB");
    cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 1, "status %d; stderr:\n%s",
              r.status, r.err);
    /* where it is refused (the scatter, or a device's forward) depends on
     * the threads' order; what the host had left must not count the batch
     * as free: less than the 100 MB less its 64 MB */
    const char *avail = strstr(r.err, " bytes of host memory available when the first CPU");
    cr_assert(avail && strstr(r.err, "does not fit in the host's RAM"), "stderr:\n%s", r.err);
    const char *num = avail;
    while (num > r.err && num[-1] >= '0' && num[-1] <= '9') num--;
    double left = strtod(num, NULL);
    cr_assert_lt(left, 40e6, "the host had %.0f bytes left beside a 64 MB batch:\n%s", left,
                 r.err);
    result_free(&r);
}

/* A signal that lm_train does not handle (here SIGXFSZ, from a file size
 * limit while it saves) still leaves no partial checkpoint: the handler of
 * every program (cli_guard_signals) removes the library writer's
 * temporary file; the older checkpoint stays, and the run says so. It
 * used to leave s.st.tmp.<pid>.* behind, without a word. */
Test(lm_train, a_fatal_signal_while_saving_leaves_no_temporary_file, .timeout = 60)
{
    result a = RUN("--steps", "2", "--dim", "64", "--save", "@s.st");
    assert_success(&a, "the first run");
    result_free(&a);
    char ck[256];
    path_in(ck, sizeof ck, "s.st");
    size_t n0 = 0;
    unsigned char *before = dp_test_read_file(ck, &n0);
    cr_assert(before && n0 > 200 * 1024, "a checkpoint of %zu bytes is below the limit", n0);
    struct rlimit old, lim;
    cr_assert_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 100 * 1024; /* inherited by lm_train alone: restored at once */
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    pid_t pid = spawn_args(1, ARGS_("--steps", "4", "--dim", "64", "--save", "@s.st"));
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
    result r = collect(pid);
    cr_assert(WIFSIGNALED(r.status) && WTERMSIG(r.status) == SIGXFSZ, "status %d; stderr:\n%s",
              r.status, r.err);
    cr_assert(strstr(r.err, "lm_train: stopped by a signal; its outputs were left as they were"),
              "stderr:\n%s", r.err);
    DIR *d = opendir(tmpdir);
    struct dirent *de;
    while ((de = readdir(d)))
        cr_assert_null(strstr(de->d_name, ".tmp."), "%s was left behind", de->d_name);
    closedir(d);
    size_t n1 = 0;
    unsigned char *after = dp_test_read_file(ck, &n1);
    cr_assert(n1 == n0 && memcmp(before, after, n0) == 0, "the older checkpoint changed");
    free(before);
    free(after);
    result_free(&r);
}

/* The step numbers of a JSONL log, in order; returns the count. */
static size_t log_steps(const char *name, long *steps, size_t cap)
{
    char p[256];
    path_in(p, sizeof p, name);
    char *t = read_text(p), *save = NULL;
    size_t n = 0;
    for (char *line = strtok_r(t, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cr_assert_lt(n, cap);
        cr_assert_eq(sscanf(line, "{\"step\":%ld", &steps[n]), 1, "bad row: %s", line);
        n++;
    }
    free(t);
    return n;
}

/* A run that went past its checkpoint (then died) logged steps 4..6; the
 * resume from step 3 drops those rows (and a line cut off by a kill), so
 * every step is logged once. */
Test(lm_train, resume_truncates_the_log_to_the_checkpoint)
{
    result a = RUN("--steps", "3", "--lr-decay-steps", "6", "--save", "@c.st", "--log", "@l.jsonl");
    assert_success(&a, "3 steps");
    result b = RUN("--resume", "@c.st", "--steps", "6", "--log", "@l.jsonl");
    assert_success(&b, "to 6, not saved");
    char p[256];
    path_in(p, sizeof p, "l.jsonl");
    FILE *f = fopen(p, "a");
    cr_assert_not_null(f);
    fputs("{\"step\":7,\"lo", f); /* cut off mid-row */
    fclose(f);
    result c = RUN("--resume", "@c.st", "--steps", "6", "--log", "@l.jsonl");
    assert_success(&c, "to 6 again");
    cr_assert(strstr(c.out, "dropped 4"), "no word about the dropped rows:\n%s", c.out);
    long steps[32];
    size_t n = log_steps("l.jsonl", steps, 32);
    cr_assert_eq(n, 6, "%zu rows", n);
    for (size_t i = 0; i < n; i++) cr_assert_eq(steps[i], (long)i + 1, "row %zu is step %ld", i, steps[i]);
    result_free(&a);
    result_free(&b);
    result_free(&c);
}

/* The resumed run's kept rows replace the log atomically: when that write
 * fails (a file size limit, SIGXFSZ ignored), the log is left whole and
 * the run stops naming it. It was truncated first and rewritten in place,
 * and such a failure (or a signal) emptied it. */
Test(lm_train, a_resume_that_cannot_rewrite_the_log_keeps_it, .timeout = 60)
{
    result a = RUN("--steps", "20", "--lr-decay-steps", "40", "--save", "@c.st", "--log",
                   "@l.jsonl");
    assert_success(&a, "20 steps");
    result b = RUN("--resume", "@c.st", "--steps", "40", "--log", "@l.jsonl");
    assert_success(&b, "to 40, not saved");
    char p[256];
    path_in(p, sizeof p, "l.jsonl");
    size_t n0 = 0;
    unsigned char *before = dp_test_read_file(p, &n0);
    cr_assert(before && n0 > 3000, "a log of %zu bytes", n0);
    struct rlimit old, lim;
    cr_assert_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 1024; /* below the 20 rows kept; inherited by lm_train alone */
    void (*xfsz)(int) = signal(SIGXFSZ, SIG_IGN);
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    pid_t pid = spawn_args(1, ARGS_("--resume", "@c.st", "--steps", "40", "--log", "@l.jsonl"));
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, xfsz);
    result c = collect(pid);
    cr_assert(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 1, "status %d; stderr:\n%s",
              c.status, c.err);
    cr_assert(strstr(c.err, "--log") && strstr(c.err, "File too large"), "stderr:\n%s", c.err);
    size_t n1 = 0;
    unsigned char *after = dp_test_read_file(p, &n1);
    cr_assert(n1 == n0 && memcmp(before, after, n0) == 0, "the log changed: %zu bytes of %zu",
              n1, n0);
    free(before);
    free(after);
    result_free(&a);
    result_free(&b);
    result_free(&c);
}

/* Waits until the file at path exists and is not empty, which the run
 * pid makes; after 30 s kills it (a failed test must not leave it
 * training) and fails. */
static void wait_for_file(const char *path, pid_t pid)
{
    struct stat sb;
    for (int i = 0; stat(path, &sb) != 0 || sb.st_size == 0; i++) {
        if (i == 3000) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            cr_assert_fail("%s was not written within 30 s", path);
        }
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* A second, 2-step run beside one that is going (its output in the
 * folder "second", not the first's), with output option flag at path. */
static result run_second(const char *flag, const char *path)
{
    char dir[300], corpus[256], out[320], err[320];
    snprintf(dir, sizeof dir, "%s/second", tmpdir);
    dp_test_remove_tree(dir); /* an earlier second run's */
    cr_assert_eq(mkdir(dir, 0755), 0);
    path_in(corpus, sizeof corpus, "corpus.txt");
    char *argv[] = {(char *)LM_TRAIN_PATH, "--data", corpus, "--devices", "cpu:1", "--layers",
                    "1", "--heads", "2", "--dim", "16", "--context", "16", "--steps", "2",
                    (char *)flag, (char *)path, NULL};
    snprintf(out, sizeof out, "%s/stdout.txt", dir);
    snprintf(err, sizeof err, "%s/stderr.txt", dir);
    return dp_test_collect(dp_test_spawn(argv, out, err), out, err);
}

/* A second run onto the --log another run is writing is refused before
 * it reads or changes the file (an advisory lock the run holds): the two
 * used to interleave their rows, which a later --resume refused. */
Test(lm_train, a_log_another_run_writes_is_refused, .timeout = 60)
{
    const char *const long_args[] = {"--steps", "100000000", "--log", "@l.jsonl"};
    pid_t pid = spawn_args(1, long_args, 4);
    char p[256];
    path_in(p, sizeof p, "l.jsonl");
    wait_for_file(p, pid);
    result b = run_second("--log", p);
    kill(pid, SIGKILL);
    result a = collect(pid);
    cr_assert(WIFEXITED(b.status) && WEXITSTATUS(b.status) == 1, "status %d; stderr:\n%s",
              b.status, b.err);
    cr_assert(strstr(b.err, "is being written by another run"), "stderr:\n%s", b.err);
    static long steps[1 << 20];
    size_t n = log_steps("l.jsonl", steps, 1 << 20);
    for (size_t i = 0; i < n; i++) cr_assert_eq(steps[i], (long)i + 1, "row %zu is step %ld", i, steps[i]);
    result_free(&a);
    result_free(&b);
}

/* A second run given the --save of a run that is still going is refused
 * before it trains (the first holds an advisory lock on "<save>.lock"):
 * each used to replace the other's checkpoints, and a --resume then read
 * whichever wrote last. The first saves on SIGTERM and removes its lock
 * file; a third run then takes the path. */
Test(lm_train, a_save_another_run_writes_is_refused, .timeout = 60)
{
    const char *const long_args[] = {"--steps", "100000000", "--save", "@ck.st", "--log",
                                     "@l.jsonl"};
    pid_t pid = spawn_args(1, long_args, 6);
    char p[256], lock[300], log[256];
    path_in(p, sizeof p, "ck.st");
    snprintf(lock, sizeof lock, "%s.lock", p);
    path_in(log, sizeof log, "l.jsonl");
    /* a step logged: training began (a signal before it exits unsaved) */
    wait_for_file(log, pid);
    wait_for_file(lock, pid);
    struct stat sb;
    result b = run_second("--save", p);
    int b_saved = stat(p, &sb) == 0;
    kill(pid, SIGTERM); /* before any assertion: a failed test must not leave it training */
    result a = collect(pid);
    cr_assert(WIFEXITED(b.status) && WEXITSTATUS(b.status) == 1, "status %d; stderr:\n%s",
              b.status, b.err);
    char pid_words[64];
    snprintf(pid_words, sizeof pid_words, "(process %ld)", (long)pid);
    cr_assert(strstr(b.err, "is being written by another run") && strstr(b.err, pid_words),
              "stderr:\n%s", b.err);
    cr_assert_null(strstr(b.out, "step 1"), "the second run trained:\n%s", b.out);
    cr_assert_not(b_saved, "the second run wrote --save");
    cr_assert(WIFEXITED(a.status) && WEXITSTATUS(a.status) == 128 + SIGTERM, "status %d:\n%s",
              a.status, a.err);
    cr_assert_eq(stat(p, &sb), 0, "the first run did not save on SIGTERM");
    cr_assert_neq(stat(lock, &sb), 0, "the lock file outlived its run");
    result c = RUN("--steps", "2", "--save", "@ck.st");
    assert_success(&c, "a run after the first ended");
    cr_assert_neq(stat(lock, &sb), 0, "the lock file outlived its run");
    result_free(&a);
    result_free(&b);
    result_free(&c);
}

/* --trace and --export-hf are locked as --save is ("<trace>.lock",
 * "<dir>.lock"): a second run given either path is refused before it
 * trains. Without it the later run's trace replaced the first's, and two
 * exports into one directory could pair one run's weights with the
 * other's config.json. "DIR/" and a symbolic link to DIR name the same
 * lock as "DIR" (a link used to take a lock of its own). */
Test(lm_train, a_trace_or_export_another_run_writes_is_refused, .timeout = 60)
{
    const char *const long_args[] = {"--steps", "100000000", "--trace", "@t.json",
                                     "--export-hf", "@ex", "--log", "@l.jsonl"};
    pid_t pid = spawn_args(1, long_args, 8);
    char trace[256], ex[256], ex_slash[260], log[256], lock[2][300], tlink[256], exlink[256];
    path_in(trace, sizeof trace, "t.json");
    path_in(ex, sizeof ex, "ex");
    snprintf(ex_slash, sizeof ex_slash, "%s/", ex);
    path_in(log, sizeof log, "l.jsonl");
    snprintf(lock[0], sizeof lock[0], "%s.lock", trace);
    snprintf(lock[1], sizeof lock[1], "%s.lock", ex);
    /* other names of the same files: the locks are the files' own */
    path_in(tlink, sizeof tlink, "tlink.json");
    path_in(exlink, sizeof exlink, "exlink");
    cr_assert_eq(symlink("t.json", tlink), 0);
    cr_assert_eq(symlink("ex", exlink), 0);
    cr_assert_eq(mkdir(ex, 0755), 0); /* a link to it is taken, one to nothing is not */
    wait_for_file(log, pid); /* training began: the locks are held */
    result b[5] = {run_second("--trace", trace), run_second("--export-hf", ex),
                   run_second("--export-hf", ex_slash), run_second("--trace", tlink),
                   run_second("--export-hf", exlink)};
    struct stat sb;
    int ex_made = dp_test_count_entries(ex) != 0;
    kill(pid, SIGTERM); /* before any assertion: a failed test must not leave it training */
    result a = collect(pid);
    char pid_words[64];
    snprintf(pid_words, sizeof pid_words, "(process %ld)", (long)pid);
    static const char *const flag[] = {"--trace", "--export-hf", "--export-hf", "--trace",
                                       "--export-hf"};
    for (int i = 0; i < 5; i++) {
        cr_assert(WIFEXITED(b[i].status) && WEXITSTATUS(b[i].status) == 1,
                  "%s: status %d; stderr:\n%s", flag[i], b[i].status, b[i].err);
        cr_assert(strstr(b[i].err, flag[i]) && strstr(b[i].err, pid_words) &&
                      strstr(b[i].err, "is being written by another run"),
                  "stderr:\n%s", b[i].err);
        cr_assert_null(strstr(b[i].out, "step 1"), "the second run trained:\n%s", b[i].out);
        result_free(&b[i]);
    }
    cr_assert_not(ex_made, "a second run exported into the first's directory");
    cr_assert(WIFEXITED(a.status) && WEXITSTATUS(a.status) == 128 + SIGTERM, "status %d:\n%s",
              a.status, a.err);
    cr_assert_eq(stat(trace, &sb), 0, "the first run wrote no trace");
    for (int i = 0; i < 2; i++)
        cr_assert_neq(stat(lock[i], &sb), 0, "%s outlived its run", lock[i]);
    result_free(&a);
}

/* A signal that kills the run at once (one lm_train does not handle, or
 * a second SIGTERM) removes the lock files of its outputs with their
 * temporary files: a stale lock file only SIGKILL leaves. */
Test(lm_train, a_signal_that_kills_the_run_removes_its_lock_files, .timeout = 60)
{
    /* SIGUSR1 once (cli_guard_signals' handler: the run dies of it), or
     * SIGTERM twice (lm_train's: the second exits at once, 128 + 15) */
    const struct {
        int sig, times;
    } cases[] = {{SIGUSR1, 1}, {SIGTERM, 2}};
    for (int k = 0; k < 2; k++) {
        const char *const long_args[] = {"--steps", "100000000", "--save", "@ck.st", "--trace",
                                         "@t.json", "--log", "@l.jsonl"};
        pid_t pid = spawn_args(1, long_args, 8);
        char log[256], lock[2][300];
        path_in(log, sizeof log, "l.jsonl");
        path_in(lock[0], sizeof lock[0], "ck.st.lock");
        path_in(lock[1], sizeof lock[1], "t.json.lock");
        wait_for_file(log, pid);
        struct stat sb;
        int held = stat(lock[0], &sb) == 0 && stat(lock[1], &sb) == 0;
        for (int t = 0; t < cases[k].times; t++) kill(pid, cases[k].sig);
        result a = collect(pid);
        cr_assert(held, "the locks were not held while training");
        if (cases[k].sig == SIGTERM)
            cr_assert(WIFEXITED(a.status) && WEXITSTATUS(a.status) == 128 + SIGTERM,
                      "status %d:\n%s", a.status, a.err);
        else
            cr_assert(WIFSIGNALED(a.status) && WTERMSIG(a.status) == SIGUSR1, "status %d:\n%s",
                      a.status, a.err);
        for (int i = 0; i < 2; i++)
            cr_assert_neq(stat(lock[i], &sb), 0, "%s outlived its run (signal %d x%d)", lock[i],
                          cases[k].sig, cases[k].times);
        result_free(&a);
        unlink(log);
    }
}

/* A "<save>.lock" that is not a dp lock file (any other contents) is
 * refused and left as it is, and so is a run onto it. A stale one (its
 * run killed: the file remains, nobody holds the lock) is taken. */
Test(lm_train, a_save_lock_file_that_is_not_one_is_refused)
{
    static const char other[] = "someone's notes\n";
    write_file("ck.st.lock", other, sizeof other - 1);
    result r = RUN("--steps", "2", "--save", "@ck.st");
    cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 1, "status %d; stderr:\n%s",
              r.status, r.err);
    cr_assert(strstr(r.err, "ck.st.lock, which exists and is not one"), "stderr:\n%s", r.err);
    char p[256];
    path_in(p, sizeof p, "ck.st.lock");
    size_t n = 0;
    char *kept = (char *)dp_test_read_file(p, &n);
    cr_assert(n == sizeof other - 1 && memcmp(kept, other, n) == 0, "the file was changed");
    free(kept);
    static const char stale[] = "dp output lock\npid 999999 lm_train\n";
    write_file("ck.st.lock", stale, sizeof stale - 1);
    result s = RUN("--steps", "2", "--save", "@ck.st");
    assert_success(&s, "onto a stale lock file");
    struct stat sb;
    cr_assert_neq(stat(p, &sb), 0, "the stale lock file is still there");
    result_free(&r);
    result_free(&s);
}

/* Fails unless the run r was refused before training with a message
 * holding words, and the file name (in the test's folder) still holds
 * exactly the n bytes at text. */
static void assert_kept(const result *r, const char *words, const char *name, const void *text,
                        size_t len)
{
    cr_assert(WIFEXITED(r->status) && WEXITSTATUS(r->status) == 1, "status %d; stderr:\n%s",
              r->status, r->err);
    cr_assert(strstr(r->err, words), "stderr:\n%s", r->err);
    cr_assert_null(strstr(r->out, "step 1"), "it trained:\n%s", r->out);
    char p[256];
    path_in(p, sizeof p, name);
    size_t n = 0;
    char *kept = (char *)dp_test_read_file(p, &n);
    cr_assert(n == len && memcmp(kept, text, n) == 0, "%s was changed", name);
    free(kept);
}

/* An output path that holds a file lm_train did not write is refused
 * before training and the file kept: --save onto anything but a dp
 * checkpoint, --trace onto anything but a dp trace, --export-hf onto
 * weights it did not export (a downloaded model) or a config.json of
 * another model. Empty files, and the program's own files, are
 * replaced as before. */
Test(lm_train, outputs_that_lm_train_did_not_write_are_kept)
{
    static const char notes[] = "my notes\n";
    write_file("notes.txt", notes, sizeof notes - 1);
    result a = RUN("--steps", "2", "--save", "@notes.txt");
    assert_kept(&a, "--save", "notes.txt", notes, sizeof notes - 1);
    cr_assert(strstr(a.err, "exists and is not a dp checkpoint"), "%s", a.err);
    result b = RUN("--steps", "2", "--trace", "@notes.txt");
    assert_kept(&b, "exists and is not a dp trace", "notes.txt", notes, sizeof notes - 1);
    /* a file of the same kind another program wrote: a safetensors file
     * without a step, Hugging Face weights */
    char p[256], dir[256];
    path_in(p, sizeof p, "other.safetensors");
    dp_st_writer *w = NULL;
    dp_assert_ok(dp_st_writer_create(&w));
    dp_assert_ok(dp_st_writer_set_metadata(w, "format", "pt"));
    float x[2] = {1.0f, 2.0f};
    size_t shape[1] = {2};
    dp_assert_ok(dp_st_writer_add(w, "wte.weight", DP_DTYPE_F32, shape, 1, x));
    dp_assert_ok(dp_st_writer_write(w, p));
    dp_st_writer_destroy(w);
    size_t n_other = 0;
    unsigned char *other = dp_test_read_file(p, &n_other);
    result c = RUN("--steps", "2", "--save", "@other.safetensors");
    assert_kept(&c, "exists and is not a dp checkpoint", "other.safetensors", other, n_other);
    path_in(dir, sizeof dir, "hf");
    cr_assert_eq(mkdir(dir, 0755), 0);
    char model[300];
    snprintf(model, sizeof model, "%s/model.safetensors", dir);
    cr_assert_eq(rename(p, model), 0);
    result d = RUN("--steps", "2", "--export-hf", "@hf");
    assert_kept(&d, "is not the weights of an earlier dp export", "hf/model.safetensors", other,
                n_other);
    cr_assert_eq(unlink(model), 0);
    static const char llama[] = "{\"model_type\": \"llama\"}\n";
    write_file("hf/config.json", llama, sizeof llama - 1);
    result e = RUN("--steps", "2", "--export-hf", "@hf");
    assert_kept(&e, "is not a GPT-2 config.json", "hf/config.json", llama, sizeof llama - 1);
    free(other);
    /* the program's own files, and empty ones, are replaced */
    write_file("empty.st", "", 0);
    write_file("hf/config.json", "", 0);
    result f = RUN("--steps", "2", "--save", "@empty.st", "--trace", "@t.json", "--export-hf",
                   "@hf");
    assert_success(&f, "onto empty files");
    result g = RUN("--steps", "3", "--save", "@empty.st", "--trace", "@t.json", "--export-hf",
                   "@hf");
    assert_success(&g, "onto its own files");
    dp_checkpoint *ck = load_ck("empty.st");
    cr_assert_eq(ck->step, 3);
    dp_checkpoint_close(ck);
    result *all[] = {&a, &b, &c, &d, &e, &f, &g};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) result_free(all[i]);
}

/* --log onto the file standard output goes to (--log /dev/stdout > run.txt)
 * is refused: the log's truncation and rows garbled the progress lines. */
Test(lm_train, a_log_onto_standard_output_s_file_is_refused)
{
    result r = RUN("--steps", "3", "--log", "@stdout.txt");
    cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 1, "status %d; stderr:\n%s",
              r.status, r.err);
    cr_assert(strstr(r.err, "is the file standard output goes to"), "stderr:\n%s", r.err);
    cr_assert_null(strstr(r.out, "step 1"), "it trained:\n%s", r.out);
    result_free(&r);
}

/* After --max-skips non-finite steps with nothing saved yet, the message
 * must not claim a checkpoint exists. */
Test(lm_train, non_finite_stop_without_a_checkpoint_says_so)
{
    result b = RUN("--steps", "40", "--lr", "1e30", "--warmup", "0", "--max-skips", "2", "--save",
                   "@n.st");
    cr_assert(WIFEXITED(b.status) && WEXITSTATUS(b.status) != 0, "stdout:\n%s", b.out);
    cr_assert_null(strstr(b.err, "intact"), "stderr claims a checkpoint: %s", b.err);
    cr_assert(strstr(b.err, "no checkpoint was written to"), "stderr: %s", b.err);
    char p[256];
    path_in(p, sizeof p, "n.st");
    cr_assert_eq(access(p, F_OK), -1, "n.st exists");
    result_free(&b);
}

/* A corpus without a newline: the default prompt (a newline) falls back to
 * a token of the corpus, and sampling works. */
Test(lm_train, default_prompt_falls_back_on_a_corpus_without_newline)
{
    char *a = malloc(10240);
    memset(a, 'a', 10240);
    write_file("aaa.txt", a, 10240);
    free(a);
    result r = RUN("--data", "@aaa.txt", "--steps", "2", "--sample", "20");
    assert_success(&r, "one-line corpus");
    cr_assert(strstr(r.out, "--- sample (20 tokens") && strstr(r.out, "aaaaaaaaaaaaaaaaaaaa"),
              "no sample:\n%s", r.out);
    result_free(&r);
}

/* Evaluation needs no training sampler state: --eval-only on another text
 * the tokenizer covers (a part of the corpus, so a different length). */
Test(lm_train, eval_only_on_another_corpus)
{
    result a = RUN("--steps", "2", "--save", "@e.st");
    assert_success(&a, "training");
    char p[256];
    path_in(p, sizeof p, "corpus.txt");
    size_t n;
    char *t = (char *)dp_test_read_file(p, &n);
    write_file("part.txt", t + 5000, 8000);
    free(t);
    result e = RUN("--resume", "@e.st", "--eval-only", "--data", "@part.txt");
    assert_success(&e, "--eval-only on part.txt");
    cr_assert(strstr(e.out, "val_loss "), "%s", e.out);
    result_free(&a);
    result_free(&e);
}

/* A word-tokenizer checkpoint refuses a conflicting --tokenizer or
 * --vocab-size on resume, and accepts the matching ones. */
Test(lm_train, resume_refuses_a_conflicting_tokenizer)
{
    result a = RUN("--steps", "1", "--tokenizer", "word", "--vocab-size", "50", "--save", "@w.st");
    assert_success(&a, "word tokenizer");
    result b = RUN("--resume", "@w.st", "--steps", "2", "--tokenizer", "char");
    cr_assert(WIFEXITED(b.status) && WEXITSTATUS(b.status) != 0, "%s", b.out);
    cr_assert(strstr(b.err, "word tokenizer") && strstr(b.err, "--tokenizer char"), "%s", b.err);
    result c = RUN("--resume", "@w.st", "--steps", "2", "--vocab-size", "60");
    cr_assert(WIFEXITED(c.status) && WEXITSTATUS(c.status) != 0, "%s", c.out);
    cr_assert(strstr(c.err, "--vocab-size 50") && strstr(c.err, "--vocab-size 60"), "%s", c.err);
    result d = RUN("--resume", "@w.st", "--steps", "2", "--tokenizer", "word", "--vocab-size",
                   "50", "--save", "@w.st");
    assert_success(&d, "matching --tokenizer and --vocab-size");
    dp_checkpoint *ck = load_ck("w.st");
    cr_assert_eq(ck->step, 2);
    cr_assert(strstr(ck->config_json, "\"tokenizer\":\"word\""), "%s", ck->config_json);
    dp_checkpoint_close(ck);
    result_free(&a);
    result_free(&b);
    result_free(&c);
    result_free(&d);
}

/* --device-weights and --token-balanced reach the engine and train. */
Test(lm_train, device_weights_and_token_balanced)
{
    result r = RUN("--steps", "2", "--device-weights", "1,3", "--token-balanced");
    assert_success(&r, "--device-weights 1,3 --token-balanced");
    result_free(&r);
}

/* --trace: one track per device, and per step a span for every phase on
 * each (the reduce-scatter's pieces may add more), one after another. */
Test(lm_train, trace_has_a_track_per_device_and_a_span_per_phase_and_step)
{
    /* an older trace is replaced at the end, not at the start (a run
     * killed before its end keeps it whole) */
    char tp[256];
    path_in(tp, sizeof tp, "t.json");
    result o = RUN("--steps", "1", "--trace", "@t.json");
    assert_success(&o, "the older trace");
    result_free(&o);
    size_t on = 0, tn = 0;
    unsigned char *old = dp_test_read_file(tp, &on);
    const char *const kill_args[] = {"--steps", "100000000", "--trace", "@t.json"};
    pid_t pid = spawn_args(1, kill_args, 4);
    wait_for_step(pid);
    kill(pid, SIGKILL);
    result k = collect(pid);
    result_free(&k);
    unsigned char *tb = dp_test_read_file(tp, &tn);
    cr_assert(tb && tn == on && memcmp(tb, old, on) == 0, "the older trace was replaced at start");
    free(tb);
    free(old);
    result r = RUN("--steps", "3", "--trace", "@t.json");
    assert_success(&r, "--trace");
    char path[256];
    path_in(path, sizeof path, "t.json");
    json_error_t err;
    json_t *t = json_load_file(path, 0, &err);
    cr_assert_not_null(t, "the trace does not parse: %s", err.text);
    json_t *ev = json_object_get(t, "traceEvents"), *e;
    size_t i, tracks = 0, spans[2][3][DP_PHASE_COUNT] = {{{0}}};
    double end[2] = {0, 0};
    json_array_foreach(ev, i, e) {
        json_int_t tid = json_integer_value(json_object_get(e, "tid"));
        cr_assert(tid == 0 || tid == 1, "event %zu on track %lld", i, (long long)tid);
        const char *ph = json_string_value(json_object_get(e, "ph"));
        const char *name = json_string_value(json_object_get(e, "name"));
        if (strcmp(ph, "M") == 0) { /* metadata: process, thread names and order */
            tracks += strcmp(name, "thread_name") == 0;
            continue;
        }
        cr_assert_str_eq(ph, "X");
        int p = 0;
        while (p < DP_PHASE_COUNT && strcmp(name, dp_phase_name((dp_phase)p)) != 0) p++;
        cr_assert(p < DP_PHASE_COUNT, "event %zu is no phase: %s", i, name);
        json_int_t step = json_integer_value(json_object_get(json_object_get(e, "args"), "step"));
        cr_assert(step >= 1 && step <= 3, "event %zu of step %lld", i, (long long)step);
        spans[tid][step - 1][p]++;
        /* a track's spans in time order, none overlapping (ts and dur are
         * printed to 0.001 us) */
        double ts = json_number_value(json_object_get(e, "ts"));
        double dur = json_number_value(json_object_get(e, "dur"));
        cr_assert_geq(ts, end[tid] - 0.002, "event %zu (%s) on cpu:%lld starts at %.3f us, "
                      "before the one before ends (%.3f)", i, name, (long long)tid, ts, end[tid]);
        end[tid] = ts + dur;
    }
    cr_assert_eq(tracks, 2);
    for (int d = 0; d < 2; d++)
        for (int s = 0; s < 3; s++)
            for (int p = 0; p < DP_PHASE_COUNT; p++) {
                /* one micro-batch: one forward, criterion and backward start */
                int once = p <= DP_PHASE_CRITERION;
                cr_assert(once ? spans[d][s][p] == 1 : spans[d][s][p] >= 1,
                          "cpu:%d step %d %s: %zu spans", d, s + 1, dp_phase_name((dp_phase)p),
                          spans[d][s][p]);
            }
    json_decref(t);
    result_free(&r);
}

/* --devices auto says when it chose CPU devices, and why. */
Test(lm_train, devices_auto_says_it_chose_cpu)
{
    if (dp_cuda_device_count() > 0) cr_skip_test("a CUDA device is visible here");
    result r = RUN("--steps", "1", "--devices", "auto");
    assert_success(&r, "--devices auto");
    cr_assert(strstr(r.out, "devices: auto chose ") && strstr(r.out, "CPU device"), "%s", r.out);
    cr_assert(strstr(r.out, "no CUDA"), "no reason given:\n%s", r.out);
    result_free(&r);
}

// --- logits chunks --------------------------------------------------------------------

/* What a --log row of a cpu:2 run says about its step. */
typedef struct log_row {
    double loss, grad_norm;
    json_int_t peak[2]; /* each device's peak bytes */
} log_row;

/* The rows of a JSONL log in tmpdir; returns the count. */
static size_t read_log_rows(const char *name, log_row *rows, size_t cap)
{
    char p[256];
    path_in(p, sizeof p, name);
    char *t = read_text(p), *save = NULL;
    cr_assert_not_null(t, "no log %s", p);
    size_t n = 0;
    for (char *line = strtok_r(t, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cr_assert_lt(n, cap);
        json_t *row = json_loads(line, 0, NULL);
        json_t *loss = json_object_get(row, "loss"), *norm = json_object_get(row, "grad_norm");
        json_t *peaks = json_object_get(row, "peak_bytes");
        cr_assert(json_is_real(loss) && json_is_real(norm) && json_array_size(peaks) == 2,
                  "%s: bad row: %s", name, line);
        /* jansson writes doubles with 17 digits: they read back bitwise. */
        rows[n].loss = json_real_value(loss);
        rows[n].grad_norm = json_real_value(norm);
        for (size_t d = 0; d < 2; d++) rows[n].peak[d] = json_integer_value(json_array_get(peaks, d));
        json_decref(row);
        n++;
    }
    free(t);
    return n;
}

/* |a - b| <= 1e-5 |b| */
static int close_rel(double a, double b) { return fabs(a - b) <= 1e-5 * fabs(b); }

/* BASE gives each device 2 sequences x 16 tokens = 32 output rows, and a
 * vocabulary of a few dozen characters (more than --dim 16): --logits-chunk
 * 7 runs the head and loss over chunks of 7, 7, 7, 7 and 4 rows. The same
 * chunks give the same bits; whole logits give the same losses and norms
 * to float rounding (the chunks only regroup float sums). That the chunks
 * ran shows in the peak bytes: whole logits hold 32 rows where chunks hold
 * 7, on every device. */
Test(lm_train, logits_chunk_is_reproducible_and_matches_whole_logits)
{
    result a = RUN("--steps", "4", "--logits-chunk", "7", "--log", "@a.jsonl", "--save", "@a.st");
    assert_success(&a, "--logits-chunk 7");
    result b = RUN("--steps", "4", "--logits-chunk", "7", "--log", "@b.jsonl", "--save", "@b.st");
    assert_success(&b, "--logits-chunk 7 again");
    result c = RUN("--steps", "4", "--logits-chunk", "whole", "--log", "@c.jsonl");
    assert_success(&c, "--logits-chunk whole");
    log_row ra[8], rb[8], rc[8];
    cr_assert_eq(read_log_rows("a.jsonl", ra, 8), 4);
    cr_assert_eq(read_log_rows("b.jsonl", rb, 8), 4);
    cr_assert_eq(read_log_rows("c.jsonl", rc, 8), 4);
    for (size_t i = 0; i < 4; i++) {
        cr_assert(ra[i].loss == rb[i].loss && ra[i].grad_norm == rb[i].grad_norm,
                  "step %zu: chunked runs differ: loss %.17g vs %.17g, norm %.17g vs %.17g",
                  i + 1, ra[i].loss, rb[i].loss, ra[i].grad_norm, rb[i].grad_norm);
        cr_assert(close_rel(ra[i].loss, rc[i].loss) && close_rel(ra[i].grad_norm, rc[i].grad_norm),
                  "step %zu: chunked loss %.9g norm %.9g, whole loss %.9g norm %.9g", i + 1,
                  ra[i].loss, ra[i].grad_norm, rc[i].loss, rc[i].grad_norm);
        for (size_t d = 0; d < 2; d++)
            cr_assert_lt(ra[i].peak[d], rc[i].peak[d],
                         "step %zu cpu:%zu: peak %lld with chunks of 7 rows, %lld whole", i + 1,
                         d, (long long)ra[i].peak[d], (long long)rc[i].peak[d]);
    }
    assert_same_state("a.st", "b.st");
    result_free(&a);
    result_free(&b);
    result_free(&c);
}

/* Run b's steps against run a's: losses and norms within close_rel, and a
 * smaller peak on both devices. */
static void assert_close_lower_peaks(const log_row *a, const log_row *b, size_t n,
                                     const char *an, const char *bn)
{
    for (size_t i = 0; i < n; i++) {
        cr_assert(close_rel(b[i].loss, a[i].loss) && close_rel(b[i].grad_norm, a[i].grad_norm),
                  "step %zu: %s loss %.9g norm %.9g, %s loss %.9g norm %.9g", i + 1, bn,
                  b[i].loss, b[i].grad_norm, an, a[i].loss, a[i].grad_norm);
        for (size_t dv = 0; dv < 2; dv++)
            cr_assert_lt(b[i].peak[dv], a[i].peak[dv], "step %zu cpu:%zu: peak %lld %s, %lld %s",
                         i + 1, dv, (long long)b[i].peak[dv], bn, (long long)a[i].peak[dv], an);
    }
}

/* --attention chunked forms the attention 64 queries at a time: with
 * --context 16 (one chunk) it is the whole-matrix run, bitwise; with
 * --context 150 (chunks of 64, 64 and 22) the same run to float32
 * rounding (losses and norms within 1e-5), with a smaller peak on every
 * device (no (T,T) probabilities per layer). --attention-chunk 32 (five
 * chunks) is the same run to rounding too, with a smaller peak than 64's.
 * It also applies to a resumed checkpoint, which does not store it: a
 * context-150 checkpoint resumed with chunks of 32 runs the same steps
 * to rounding as resumed with the default 64, at a smaller peak on every
 * device (the banner alone, which prints the flag, would not show it;
 * with a context under 64 one chunk is the whole matrix either way). */
Test(lm_train, chunked_attention_is_the_same_run_to_rounding)
{
    result a = RUN("--steps", "3", "--save", "@whole.st");
    assert_success(&a, "whole attention");
    result b = RUN("--steps", "3", "--attention", "chunked", "--save", "@chunked.st");
    assert_success(&b, "chunked attention, one chunk");
    assert_same_state("whole.st", "chunked.st");
    result c = RUN("--steps", "3", "--context", "150", "--log", "@w.jsonl");
    assert_success(&c, "whole attention, context 150");
    result d = RUN("--steps", "3", "--context", "150", "--attention", "chunked", "--log",
                   "@c.jsonl");
    assert_success(&d, "chunked attention, context 150");
    cr_assert(strstr(d.out, "attention in chunks of 64 queries"), "%s", d.out);
    result e = RUN("--steps", "3", "--context", "150", "--attention", "chunked",
                   "--attention-chunk", "32", "--log", "@c32.jsonl");
    assert_success(&e, "chunks of 32, context 150");
    cr_assert(strstr(e.out, "attention in chunks of 32 queries"), "%s", e.out);
    result g = RUN("--steps", "1", "--lr-decay-steps", "3", "--context", "150", "--save",
                   "@c150.st");
    assert_success(&g, "context 150, one step");
    result f = RUN("--steps", "3", "--context", "150", "--resume", "@c150.st", "--attention",
                   "chunked", "--attention-chunk", "32", "--log", "@f32.jsonl");
    assert_success(&f, "resumed with chunks of 32");
    cr_assert(strstr(f.out, "attention in chunks of 32 queries"), "%s", f.out);
    result h = RUN("--steps", "3", "--context", "150", "--resume", "@c150.st", "--attention",
                   "chunked", "--log", "@f64.jsonl");
    assert_success(&h, "resumed with chunks of 64");
    log_row rw[4], rc[4], r32[4], f32[4], f64[4];
    cr_assert_eq(read_log_rows("w.jsonl", rw, 4), 3);
    cr_assert_eq(read_log_rows("c.jsonl", rc, 4), 3);
    cr_assert_eq(read_log_rows("c32.jsonl", r32, 4), 3);
    cr_assert_eq(read_log_rows("f32.jsonl", f32, 4), 2);
    cr_assert_eq(read_log_rows("f64.jsonl", f64, 4), 2);
    assert_close_lower_peaks(rw, rc, 3, "whole", "chunks of 64");
    assert_close_lower_peaks(rc, r32, 3, "chunks of 64", "chunks of 32");
    assert_close_lower_peaks(f64, f32, 2, "resumed, chunks of 64", "resumed, chunks of 32");
    result_free(&e);
    result_free(&f);
    result_free(&g);
    result_free(&h);
    result_free(&a);
    result_free(&b);
    result_free(&c);
    result_free(&d);
}

/* --attention fused (no probabilities in memory, the kernels' CPU
 * reference here): with --context 150 the same run as the whole matrix's
 * to float32 rounding (losses and norms within 1e-5) at a smaller peak on
 * every device (no (T,T) probabilities per layer), and the banner says
 * so; with --attention-chunk it is refused (chunks are the chunked
 * attention's). */
Test(lm_train, fused_attention_is_the_same_run_to_rounding)
{
    result c = RUN("--steps", "3", "--context", "150", "--log", "@w.jsonl");
    assert_success(&c, "whole attention, context 150");
    result d = RUN("--steps", "3", "--context", "150", "--attention", "fused", "--log",
                   "@f.jsonl");
    assert_success(&d, "fused attention, context 150");
    cr_assert(strstr(d.out, "attention fused"), "%s", d.out);
    log_row rw[4], rf[4];
    cr_assert_eq(read_log_rows("w.jsonl", rw, 4), 3);
    cr_assert_eq(read_log_rows("f.jsonl", rf, 4), 3);
    assert_close_lower_peaks(rw, rf, 3, "whole", "fused");
    result e = RUN("--steps", "1", "--attention", "fused", "--attention-chunk", "32");
    cr_assert(WIFEXITED(e.status) && WEXITSTATUS(e.status) != 0,
              "--attention fused --attention-chunk 32 was accepted");
    cr_assert(strstr(e.err, "needs --attention chunked"), "%s", e.err);
    result_free(&c);
    result_free(&d);
    result_free(&e);
}

// --- outputs that would replace inputs or each other ------------------------------------

typedef struct overlap_case {
    char name[48];
    char args[8][40]; /* after BASE; "" ends; '@' = in tmpdir */
    char first[16], second[32]; /* the two options the message names */
} overlap_case;

static overlap_case overlap_cases[] = {
    /* the issue's cases */
    {"log onto the resumed checkpoint", {"--resume", "@ck.st", "--log", "@ck.st", "--save",
     "@new.st"}, "--log", "--resume"},
    {"trace onto the saved checkpoint", {"--save", "@ck.st", "--trace", "@ck.st"}, "--save",
     "--trace"},
    {"log onto the corpus", {"--data", "@corpus.txt", "--log", "@corpus.txt"}, "--log", "--data"},
    /* siblings: other spellings of one file */
    {"log through a symlink to the checkpoint", {"--resume", "@ck.st", "--log", "@link.st",
     "--steps", "3"}, "--log", "--resume"},
    {"trace onto a hard link of the corpus", {"--trace", "@hard.txt"}, "--trace", "--data"},
    {"save onto the corpus through ./", {"--save", "@./corpus.txt"}, "--save", "--data"},
    {"log and trace through ..", {"--log", "@sub/../x.jsonl", "--trace", "@x.jsonl"}, "--log",
     "--trace"},
    {"save and log, neither existing", {"--save", "@y.st", "--log", "@./y.st"}, "--save", "--log"},
    {"log onto a file of a text directory", {"--data", "@textdir", "--log", "@textdir/b.txt"},
     "--log", "--data"},
    /* a new file in a text directory would be read as text by the next run */
    {"save as a new file of a text directory", {"--data", "@textdir", "--save",
     "@textdir/new.st"}, "--save", "--data"},
    /* a symbolic link to nothing names the file a write through it creates */
    {"log via a dangling symlink onto the save", {"--log", "@dangling.log",
     "--save", "@later.st"}, "--save", "--log"},
    /* an output's lock file is written and removed too: an output there
     * was deleted at the end (a --save at --export-hf's lock, exit 0) */
    {"save onto the export's lock file", {"--save", "@E.lock", "--export-hf", "@E",
     "--save-interval", "1"}, "--save", "--export-hf's lock file"},
    {"trace onto the save's lock file", {"--save", "@x.st", "--trace", "@x.st.lock"}, "--trace",
     "--save's lock file"},
    {"log onto the save's lock file", {"--save", "@x.st", "--log", "@x.st.lock"}, "--log",
     "--save's lock file"},
    {"export onto the trace's lock file", {"--trace", "@t.json", "--export-hf", "@t.json.lock/"},
     "--export-hf", "--trace's lock file"},
};

ParameterizedTestParameters(lm_train, outputs_never_replace_inputs_or_each_other)
{
    return cr_make_param_array(overlap_case, overlap_cases,
                               sizeof overlap_cases / sizeof overlap_cases[0]);
}

/* Refused before anything is written, in one line naming both options:
 * the inputs keep their bytes and no output appears. */
ParameterizedTest(overlap_case *oc, lm_train, outputs_never_replace_inputs_or_each_other,
                  .timeout = 30)
{
    result g = RUN("--steps", "2", "--save", "@ck.st");
    assert_success(&g, "making ck.st");
    result_free(&g);
    char p[256], q[256];
    path_in(p, sizeof p, "ck.st");
    path_in(q, sizeof q, "link.st");
    cr_assert_eq(symlink(p, q), 0);
    path_in(p, sizeof p, "corpus.txt");
    path_in(q, sizeof q, "hard.txt");
    cr_assert_eq(link(p, q), 0);
    path_in(p, sizeof p, "later.st");
    path_in(q, sizeof q, "dangling.log");
    cr_assert_eq(symlink(p, q), 0);
    path_in(p, sizeof p, "sub");
    cr_assert_eq(mkdir(p, 0755), 0);
    path_in(p, sizeof p, "textdir");
    cr_assert_eq(mkdir(p, 0755), 0);
    size_t len = 0, ck_len = 0, c_len = 0;
    char *text = pseudo_english(7, 4000, &len);
    write_file("textdir/a.txt", text, len / 2);
    write_file("textdir/b.txt", text + len / 2, len - len / 2);
    free(text);
    path_in(p, sizeof p, "ck.st");
    unsigned char *ck = dp_test_read_file(p, &ck_len);
    path_in(p, sizeof p, "corpus.txt");
    unsigned char *corpus = dp_test_read_file(p, &c_len);

    const char *extra[10];
    size_t n = 0;
    for (int i = 0; i < 8 && oc->args[i][0]; i++) extra[n++] = oc->args[i];
    result r = run_lm(extra, n);
    cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) != 0, "%s: status %d; stdout:\n%s",
              oc->name, r.status, r.out);
    cr_assert(dp_test_count(r.err, "\n") == 1 && strncmp(r.err, "lm_train: ", 10) == 0,
              "%s: want one line:\n%s", oc->name, r.err);
    char a[40], b[40];
    snprintf(a, sizeof a, "%s \"", oc->first);
    snprintf(b, sizeof b, "%s \"", oc->second);
    cr_assert(strstr(r.err, a) && strstr(r.err, b), "%s: the message names %s and %s? %s",
              oc->name, oc->first, oc->second, r.err);
    cr_assert_null(strstr(r.out, "model: "), "%s: went on to the model:\n%s", oc->name, r.out);
    size_t l2 = 0;
    path_in(p, sizeof p, "ck.st");
    unsigned char *ck2 = dp_test_read_file(p, &l2);
    cr_assert(ck2 && l2 == ck_len && memcmp(ck, ck2, l2) == 0, "%s: ck.st changed", oc->name);
    free(ck2);
    path_in(p, sizeof p, "corpus.txt");
    unsigned char *c2 = dp_test_read_file(p, &l2);
    cr_assert(c2 && l2 == c_len && memcmp(corpus, c2, l2) == 0, "%s: corpus.txt changed",
              oc->name);
    free(c2);
    static const char *const never[] = {"new.st", "x.jsonl", "y.st"};
    for (size_t i = 0; i < 3; i++) {
        path_in(p, sizeof p, never[i]);
        cr_assert_neq(access(p, F_OK), 0, "%s: %s was written", oc->name, never[i]);
    }
    free(ck);
    free(corpus);
    result_free(&r);
}

/* --resume C --save C goes on saving into the file it resumed (written
 * atomically, after the checkpoint was read). */
Test(lm_train, save_may_replace_the_resumed_checkpoint)
{
    result a = RUN("--steps", "2", "--lr-decay-steps", "4", "--save", "@ck.st");
    assert_success(&a, "2 steps");
    result b = RUN("--steps", "4", "--resume", "@ck.st", "--save", "@ck.st");
    assert_success(&b, "resumed into the same file");
    dp_checkpoint *ck = load_ck("ck.st");
    cr_assert_eq(ck->step, 4);
    dp_checkpoint_close(ck);
    result_free(&a);
    result_free(&b);
}

/* A 248-byte --save (or --trace) name: the name fits the 255-byte limit,
 * but the atomic writer's temporary file "<name>.tmp.<pid>.<n>.<host>" would not,
 * so the run is refused before training instead of losing it at the
 * save. */
Test(lm_train, output_names_too_long_for_their_temporary_files_fail_before_training)
{
    char name[300], full[400];
    memset(name, 'c', 245);
    strcpy(name + 245, ".st");
    snprintf(full, sizeof full, "%s/%s", tmpdir, name); /* past path_in's 256 bytes */
    for (int i = 0; i < 2; i++) {
        const char *flag = i ? "--trace" : "--save";
        result r = RUN("--steps", "2", flag, full);
        cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) != 0, "%s: status %d", flag,
                  r.status);
        cr_assert(dp_test_count(r.err, "\n") == 1 && strstr(r.err, flag) &&
                      strstr(r.err, "is 248 bytes"),
                  "%s: stderr:\n%s", flag, r.err);
        cr_assert_null(strstr(r.out, "trained"), "%s: trained first:\n%s", flag, r.out);
        result_free(&r);
    }
    DIR *d = opendir(tmpdir);
    struct dirent *de;
    while ((de = readdir(d))) cr_assert_lt(strlen(de->d_name), 200, "left %s", de->d_name);
    closedir(d);
}

// --- writes that fail -------------------------------------------------------------------

/* An existing --log that is not an lm_train log, or a FIFO, is refused
 * before any work (nothing printed on stdout: no data loaded), with one
 * line, and the file keeps its bytes; the run's own log is taken. */
Test(lm_train, a_log_that_is_not_one_is_refused_before_any_work)
{
    static const char notes[] = "my notes\nsecond line\n";
    write_file("notes.txt", notes, sizeof notes - 1);
    char p[256];
    path_in(p, sizeof p, "pipe");
    cr_assert_eq(mkfifo(p, 0600), 0);
    static const char *const logs[][2] = {{"@notes.txt", "line 1 is not a row"},
                                          {"@pipe", "a FIFO; give a regular file"}};
    for (int i = 0; i < 2; i++) {
        result r = RUN("--steps", "2", "--log", logs[i][0]);
        cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) != 0, "not refused:\n%s", r.out);
        cr_assert(strstr(r.err, logs[i][1]) && dp_test_count(r.err, "\n") == 1, "%s", r.err);
        cr_assert_eq(r.out[0], '\0', "work began before the refusal:\n%s", r.out);
        result_free(&r);
    }
    size_t n = 0;
    path_in(p, sizeof p, "notes.txt");
    unsigned char *kept = dp_test_read_file(p, &n);
    cr_assert(n == sizeof notes - 1 && memcmp(kept, notes, n) == 0, "notes.txt changed");
    free(kept);
    result g = RUN("--steps", "2", "--log", "@own.jsonl");
    assert_success(&g, "a new log");
    result_free(&g);
    result h = RUN("--steps", "2", "--log", "@own.jsonl");
    assert_success(&h, "its own log again");
    result_free(&h);
}

/* --log on a full disk (/dev/full): the first row's write fails, the run
 * stops at once, saves the step it trained and says both. */
Test(lm_train, a_log_that_cannot_be_written_stops_the_run_after_saving)
{
    result r = RUN("--steps", "400", "--log", "/dev/full", "--save", "@ck.st");
    cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 1, "status %d; stderr:\n%s",
              r.status, r.err);
    cr_assert(strstr(r.err, "lm_train: cannot write --log /dev/full: No space left on device"),
              "stderr:\n%s", r.err);
    dp_checkpoint *ck = load_ck("ck.st");
    char want[80];
    snprintf(want, sizeof want, "stopped at step %ld; its checkpoint is saved in ", ck->step);
    cr_assert(ck->step >= 1 && ck->step < 400 && strstr(r.err, want), "step %ld; stderr:\n%s",
              ck->step, r.err);
    cr_assert_null(strstr(r.out, "trained 400 steps"), "stdout:\n%s", r.out);
    dp_checkpoint_close(ck);
    result_free(&r);
}

/* The issue's case: a log cut mid-row by a full disk (here a 64 KiB file
 * size limit, which fails the write with EFBIG; SIGXFSZ ignored, inherited)
 * at about row 300 of 400 no longer exits 0: the run stops there, saves
 * that step (the checkpoint, smaller than the limit, is written) and
 * fails naming the log. The log keeps its complete rows only: the row the
 * disk cut is removed (log_steps fails on a partial row). */
Test(lm_train, a_log_cut_by_a_full_disk_stops_the_run_after_saving)
{
    struct rlimit old;
    dp_test_limit_file_size(64 << 10, &old);
    result r = RUN("--steps", "400", "--log", "@run.jsonl", "--save", "@ck.st");
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
    cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 1, "status %d; stderr:\n%s",
              r.status, r.err);
    cr_assert(strstr(r.err, "cannot write --log ") && strstr(r.err, "File too large"),
              "stderr:\n%s", r.err);
    dp_checkpoint *ck = load_ck("ck.st");
    /* The rows up to the one cut: the step that stopped the run. */
    long steps[400];
    long rows = (long)log_steps("run.jsonl", steps, 400);
    cr_assert(ck->step > 100 && ck->step < 400 && (ck->step == rows || ck->step == rows + 1),
              "step %ld, %ld rows", ck->step, rows);
    char p[256];
    path_in(p, sizeof p, "run.jsonl");
    char *t = read_text(p);
    size_t n = strlen(t);
    cr_assert(n > 0 && t[n - 1] == '\n', "the log ends in half a row: ...%s",
              n > 80 ? t + n - 80 : t);
    free(t);
    dp_checkpoint_close(ck);
    result_free(&r);
}

/* Standard output read by a program that quits after a line (| head -1):
 * the next write fails (EPIPE; SIGPIPE would kill the run unsaved), so
 * the run saves and stops, naming standard output, exit 1. */
Test(lm_train, a_closed_pipe_on_standard_output_saves_and_stops, .timeout = 120)
{
    char fifo[256];
    path_in(fifo, sizeof fifo, "out.fifo");
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    const char *const args[] = {"--steps", "100000000", "--eval-interval", "10", "--save",
                                "@pipe.st"};
    /* The reader first (without a writer only O_NONBLOCK opens), so that
     * the spawn's open of the writing end does not wait. */
    int fd = open(fifo, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* lm_train must not hold it */
    cr_assert_geq(fd, 0);
    pid_t pid = spawn_args_to(1, args, sizeof args / sizeof args[0], fifo);
    cr_assert_eq(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK), 0);
    FILE *f = fdopen(fd, "r");
    cr_assert_not_null(f);
    char line[1024];
    while (fgets(line, sizeof line, f) && strncmp(line, "step ", 5) != 0) {
    }
    fclose(f); /* the reader quits */
    char err[256];
    path_in(err, sizeof err, "stderr.txt");
    result r = dp_test_collect_err(pid, err);
    cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 1, "status %d; stderr:\n%s",
              r.status, r.err);
    cr_assert(strstr(r.err, "cannot write standard output: Broken pipe"), "stderr:\n%s", r.err);
    dp_checkpoint *ck = load_ck("pipe.st");
    cr_assert_gt(ck->step, 0, "the checkpoint holds step 0");
    dp_checkpoint_close(ck);
    result_free(&r);
}

/* Standard output on a full disk: --eval-only's val_loss line is lost, so
 * the run fails, naming it. */
Test(lm_train, a_full_standard_output_fails_the_run)
{
    result g = RUN("--steps", "2", "--save", "@ck.st");
    assert_success(&g, "2 steps");
    result_free(&g);
    char err[256];
    path_in(err, sizeof err, "stderr.txt");
    const char *args[] = {"--resume", "@ck.st", "--eval-only"};
    result r = dp_test_collect_err(spawn_args_to(1, args, 3, "/dev/full"), err);
    cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 1, "status %d; stderr:\n%s",
              r.status, r.err);
    cr_assert(strstr(r.err, "lm_train: cannot write standard output: No space left on device"),
              "stderr:\n%s", r.err);
    result_free(&r);
}

// --- bad command lines ----------------------------------------------------------------

/* Values that are wrong in themselves are refused with the command line
 * (status 2), before the data loads: they were found in setup (status 1),
 * and a limit of 0 bytes was taken for none. */
Test(lm_train, bad_values_are_refused_with_the_command_line)
{
    static const struct {
        const char *args[4], *needle;
    } cases[] = {
        {{"--mode", "bogus"}, "--mode: \"bogus\" is not balanced or gather"},
        {{"--devices", "cpu:0,0"}, "names cpu:0 twice"},
        {{"--memory-limit", "12XB"}, "unknown unit \"XB\""},
        {{"--memory-limit", "0KiB"}, "--memory-limit 0KiB is 0 bytes"},
        {{"--device-weights", "1,x"}, "--device-weights: \"1,x\" is not"},
        {{"--devices", "cpu:2", "--device-weights", "1,2,3"}, "3 weights for 2 devices"},
        /* white space is refused before a number as after it (strtol skipped it) */
        {{"--steps", " 2"}, "--steps: \" 2\" is not an integer"},
        {{"--steps", "2 "}, "--steps: \"2 \" is not an integer"},
        {{"--lr", " 1e-3"}, "--lr: \" 1e-3\" is not a number"},
        {{"--device-weights", " 1,2"}, "--device-weights: \" 1,2\" is not"},
        /* past a float (the engine's): refused here, not in setup as "inf" */
        {{"--lr", "1e39"}, "--lr: 1e39 is past the largest float"},
        {{"--grad-clip", "1e308"}, "--grad-clip: 1e308 is past the largest float"},
        {{"--tokenizer", "bogus"}, "--tokenizer: "},
        {{"--prompt-ids", "1,,2"}, "entry 2 is not a token id"},
        {{"--prompt-ids", "-1"}, "entry 1 is not a token id"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *const *a = cases[i].args;
        result r = a[2] ? RUN("--data", "@missing.txt", a[0], a[1], a[2], a[3])
                        : RUN("--data", "@missing.txt", a[0], a[1]);
        cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 2, "%s %s: status %d; "
                  "stderr:\n%s", a[0], a[1], r.status, r.err);
        cr_assert(strstr(r.err, cases[i].needle) && !strstr(r.err, "missing.txt"),
                  "%s %s: stderr:\n%s", a[0], a[1], r.err);
        result_free(&r);
    }
}

typedef struct bad_case {
    char name[48];
    char args[10][48]; /* after BASE; "" ends the list; '@' = in tmpdir */
    char needle[48];   /* the stderr line must hold this */
    char save[48];     /* the --save path whose file must not appear; "" = "@out.st" */
    int needs_ckpt;    /* first make @good.st with a 1-step run */
    int no_gpu_only;   /* only meaningful where no CUDA device is visible */
    int no_save;       /* do not add "--save @out.st" first */
} bad_case;

static bad_case bad_cases[] = {
    {"missing data file", {"--data", "@missing.txt"}, "missing.txt", "", 0, 0, 0},
    {"empty data file", {"--data", "@empty.txt"}, "empty", "", 0, 0, 0},
    {"binary data file", {"--data", "@binary.bin"}, "NUL", "", 0, 0, 0},
    {"context longer than validation split", {"--data", "@small.txt", "--context", "32"},
     "validation split", "", 0, 0, 0},
    {"batch-size 0", {"--batch-size", "0"}, "--batch-size", "", 0, 0, 0},
    {"batch-size -3", {"--batch-size", "-3"}, "--batch-size", "", 0, 0, 0},
    {"batch-size abc", {"--batch-size", "abc"}, "--batch-size", "", 0, 0, 0},
    /* refused before its buffers are touched, not left to the OOM killer */
    {"batch past the host's RAM", {"--batch-size", "100000000000"}, "do not fit in the host's",
     "", 0, 0, 0},
    {"heads 3 dim 16", {"--heads", "3", "--dim", "16"}, "--heads 3", "", 0, 0, 0},
    /* it was ignored: the char tokenizer's vocabulary is the text's */
    {"vocab-size with the char tokenizer", {"--vocab-size", "50"}, "--vocab-size applies to",
     "", 0, 0, 0},
    /* named by the option, not the library's n_embd alone */
    {"dim past the GEMMs' int", {"--heads", "1", "--dim", "1000000000"},
     "--dim 1000000000", "", 0, 0, 0},
    {"devices gpu:0", {"--devices", "gpu:0"}, "gpu", "", 0, 0, 0},
    {"devices cpu:0,0", {"--devices", "cpu:0,0"}, "cpu:0,0", "", 0, 0, 0},
    {"devices cuda:0 without a GPU", {"--devices", "cuda:0"}, "cuda", "", 0, 1, 0},
    {"unknown option", {"--frobnicate"}, "--frobnicate", "", 0, 0, 0},
    /* there are no short options: named as unknown, not as given a value */
    {"unknown short option", {"-x"}, "unknown option \"-x\"", "", 0, 0, 0},
    {"unknown short options grouped", {"-qx"}, "unknown option \"-q\"", "", 0, 0, 0},
    {"option without its value", {"--steps"}, "--steps needs a value", "", 0, 0, 0},
    {"steps x", {"--steps", "x"}, "--steps", "", 0, 0, 0},
    {"lr -1", {"--lr", "-1"}, "--lr", "", 0, 0, 0},
    {"grad-accum past int", {"--grad-accum", "4294967297"}, "--grad-accum", "", 0, 0, 0},
    {"memory-limit 12XB", {"--memory-limit", "12XB"}, "12XB", "", 0, 0, 0},
    /* --log's path problems named with the fix, as --save's and --trace's */
    {"log empty", {"--log="}, "--log: the path is empty", "", 0, 0, 0},
    {"log in a missing directory", {"--log", "@nodir/l.jsonl"}, "does not exist; create it",
     "", 0, 0, 0},
    /* the library's message, then the options that fix it */
    {"memory-limit too small", {"--memory-limit", "1KiB"}, "limit); in lm_train: a smaller --batch",
     "", 0, 0, 0},
    {"resume missing file", {"--resume", "@missing.st"}, "missing.st", "", 0, 0, 0},
    {"resume corrupt file", {"--resume", "@corrupt.st"}, "corrupt.st", "", 0, 0, 0},
    {"resume on other text", {"--resume", "@good.st", "--data", "@other.txt"},
     "tokenizer was built from other text", "", 1, 0, 0},
    {"resume with conflicting --dim", {"--resume", "@good.st", "--dim", "32"}, "differs", "", 1,
     0, 0},
    {"resume with conflicting --heads", {"--resume", "@good.st", "--heads", "4"}, "differs", "",
     1, 0, 0},
    {"resume with --heads 3 not dividing", {"--resume", "@good.st", "--heads", "3"}, "differs",
     "", 1, 0, 0},
    {"eval-only without resume", {"--eval-only"}, "--eval-only", "", 0, 0, 0},
    {"save into a missing directory", {"--steps", "2", "--save", "@nodir/out.st"}, "nodir",
     "@nodir/out.st", 0, 0, 0},
    {"save onto a directory", {"--steps", "2", "--save", "@sub"}, "directory", "@sub", 0, 0, 0},
    {"max-skips 0", {"--max-skips", "0"}, "--max-skips", "", 0, 0, 0},
    {"watchdog -1", {"--watchdog", "-1"}, "--watchdog", "", 0, 0, 0},
    {"watchdog 1e19", {"--watchdog", "1e19"}, "--watchdog: 1e19 seconds is out of range", "", 0,
     0, 0},
    {"watchdog 1e-9", {"--watchdog", "1e-9"}, "--watchdog", "", 0, 0, 0},
    {"check-replicas x", {"--check-replicas", "x"}, "--check-replicas", "", 0, 0, 0},
    /* Sizes from the command line are bounded before any work. */
    {"sample 2^63-1", {"--sample", "9223372036854775807"}, "--sample", "", 0, 0, 0},
    {"sample 2^62", {"--sample", "4611686018427387904"}, "--sample", "", 0, 0, 0},
    {"batch-size x context overflows", {"--batch-size", "4611686018427387904", "--context",
     "16"}, "overflow", "", 0, 0, 0},
    {"max-tokens-per-device below context", {"--max-tokens-per-device", "4"},
     "--max-tokens-per-device 4", "", 0, 0, 0},
    {"lr-decay-steps 0", {"--lr-decay-steps", "0"}, "--lr-decay-steps", "", 0, 0, 0},
    {"min-lr above lr", {"--lr", "1e-3", "--min-lr", "2e-3"}, "--min-lr 0.002 is above --lr 0.001",
     "", 0, 0, 0},
    {"lr below the default min-lr", {"--lr", "1e-4"}, "--min-lr 0.0003 is above --lr 0.0001", "",
     0, 0, 0},
    {"val-tokens below one window", {"--val-tokens", "16", "--log", "@out.jsonl"},
     "--val-tokens 16 is shorter than one window", "", 0, 0, 0},
    {"val-tokens -1", {"--val-tokens", "-1"}, "--val-tokens: \"-1\" is not an integer", "", 0,
     0, 0},
    {"val-tokens abc", {"--val-tokens", "abc"}, "--val-tokens: \"abc\"", "", 0, 0, 0},
    {"recompute everything", {"--recompute", "everything"},
     "is not none, attention, gelu or all", "", 0, 0, 0},
    {"attention flash", {"--attention", "flash"}, "is not whole, chunked or fused", "", 0, 0, 0},
    {"attention-chunk without chunked", {"--attention-chunk", "16"},
     "--attention-chunk 16 needs --attention chunked", "", 0, 0, 0},
    {"attention-chunk 0", {"--attention", "chunked", "--attention-chunk", "0"},
     "--attention-chunk: \"0\" is not an integer", "", 0, 0, 0},
    {"attention-chunk abc", {"--attention", "chunked", "--attention-chunk", "abc"},
     "--attention-chunk: \"abc\"", "", 0, 0, 0},
    {"attention-chunk past int", {"--attention", "chunked", "--attention-chunk", "2147483648"},
     "--attention-chunk: ", "", 0, 0, 0},
    {"val-tokens past long", {"--val-tokens", "99999999999999999999999"}, "--val-tokens: ", "",
     0, 0, 0},
    {"val-tokens below the checkpoint's window", {"--resume", "@good.st", "--eval-only",
     "--val-tokens", "1"}, "give at least 17 or 0", "", 1, 0, 1},
    {"save-interval without save", {"--save-interval", "2"}, "--save-interval needs --save", "",
     0, 0, 1},
    {"save with eval-only", {"--resume", "@good.st", "--eval-only"}, "--eval-only", "", 1, 0, 0},
    {"resume with steps below the checkpoint", {"--resume", "@good.st", "--steps", "0"},
     "below the checkpoint's step 1", "", 1, 0, 0},
    {"resume with conflicting --tokenizer", {"--resume", "@good.st", "--tokenizer", "word"},
     "--tokenizer word", "", 1, 0, 0},
    {"resume with --vocab-size on a char model", {"--resume", "@good.st", "--vocab-size", "99"},
     "--vocab-size", "", 1, 0, 0},
    {"prompt outside the vocabulary", {"--prompt", "~", "--sample", "10"}, "--prompt", "", 0, 0, 0},
    /* refused, as with token data, not replaced by the corpus's first token */
    {"prompt empty", {"--prompt=", "--sample", "10"}, "--prompt is empty", "", 0, 0, 0},
    {"device-weights count", {"--device-weights", "1,2,3"}, "--device-weights", "", 0, 0, 0},
    {"device-weights x", {"--device-weights", "1,x"}, "--device-weights", "", 0, 0, 0},
    {"device-weights all zero", {"--device-weights", "0,0"}, "--device-weights", "", 0, 0, 0},
    {"token-balanced with a value", {"--token-balanced=1"}, "takes no value", "", 0, 0, 0},
    {"device-weights negative", {"--device-weights", "1,-1"}, "--device-weights", "", 0, 0, 0},
    {"trace into a missing directory", {"--steps", "2", "--trace", "@nodir/t.json"}, "nodir", "",
     0, 0, 0},
    /* an existing file that is not a log is not replaced by one */
    {"log onto a text file", {"--steps", "2", "--log", "@small.txt"},
     "not a row of an lm_train log", "", 0, 0, 0},
    {"log onto a JSON object without a newline", {"--steps", "2", "--log", "@settings.json"},
     "line 1 is not a row", "", 0, 0, 0},
    {"resume with log onto a text file", {"--resume", "@good.st", "--steps", "2", "--log",
     "@small.txt"}, "line 1 is not a row", "", 1, 0, 0},
    {"trace with eval-only", {"--resume", "@good.st", "--eval-only", "--trace", "@t.json"},
     "--trace", "", 1, 0, 1},
    /* it used to be ignored: no log, no message, status 0 */
    {"log with eval-only", {"--resume", "@good.st", "--eval-only", "--log", "@eo.jsonl"},
     "--log with --eval-only", "", 1, 0, 1},
    {"logits-chunk 0", {"--logits-chunk", "0", "--log", "@out.jsonl"}, "--logits-chunk", "", 0,
     0, 0},
    {"logits-chunk -3", {"--logits-chunk", "-3", "--log", "@out.jsonl"}, "--logits-chunk", "", 0,
     0, 0},
    {"logits-chunk abc", {"--logits-chunk", "abc", "--log", "@out.jsonl"}, "--logits-chunk", "",
     0, 0, 0},
    {"logits-chunk 12x", {"--logits-chunk", "12x", "--log", "@out.jsonl"}, "--logits-chunk", "",
     0, 0, 0},
    {"logits-chunk past size_t", {"--logits-chunk", "99999999999999999999999", "--log",
     "@out.jsonl"}, "--logits-chunk", "", 0, 0, 0},
    {"precision fp16", {"--precision", "fp16", "--log", "@out.jsonl"}, "--precision", "", 0, 0,
     0},
    {"precision BF16", {"--precision", "BF16"}, "--precision: \"BF16\"", "", 0, 0, 0},
    {"vocab-pad 0", {"--vocab-pad", "0"}, "--vocab-pad 0 pads to a multiple of nothing", "", 0,
     0, 0},
    {"vocab-pad -64", {"--vocab-pad", "-64"}, "--vocab-pad: \"-64\" is not", "", 0, 0, 0},
    {"vocab-pad abc", {"--vocab-pad", "abc"}, "--vocab-pad: \"abc\"", "", 0, 0, 0},
    {"vocab-pad 64x", {"--vocab-pad", "64x"}, "--vocab-pad: \"64x\"", "", 0, 0, 0},
    {"vocab-pad too large", {"--vocab-pad", "65537"}, "--vocab-pad 65537 is too large", "", 0,
     0, 0},
    {"vocab-pad past long", {"--vocab-pad", "99999999999999999999999"}, "is too large", "", 0,
     0, 0},
    {"precision bf16 with tf32", {"--precision", "bf16", "--tf32", "--log", "@out.jsonl"},
     "--tf32", "", 0, 0, 0},
    /* Inputs that would block: refused unread (open() blocked for ever on them). */
    {"resume a FIFO", {"--resume", "@fifo"}, "fifo' is not a regular file", "", 0, 0, 0},
    {"data a FIFO", {"--data", "@fifo"}, "FIFO", "", 0, 0, 0},
    {"log a FIFO", {"--steps", "2", "--log", "@fifo"}, "--log ", "", 0, 0, 0},
};

ParameterizedTestParameters(lm_train, bad_input_fails_cleanly)
{
    return cr_make_param_array(bad_case, bad_cases, sizeof bad_cases / sizeof bad_cases[0]);
}

ParameterizedTest(bad_case *bc, lm_train, bad_input_fails_cleanly, .timeout = 20)
{
    if (bc->no_gpu_only && dp_cuda_device_count() > 0)
        cr_skip_test("%s: a CUDA device is visible here", bc->name);
    write_file("empty.txt", "", 0);
    static const char settings[] = "{\"step\": 3, \"lr\": 0.1}"; /* no final newline */
    write_file("settings.json", settings, sizeof settings - 1);
    static const char binary[] = "some text\0\x01\x02 more text\n";
    write_file("binary.bin", binary, sizeof binary - 1);
    /* A header length of 16 in a 13-byte file. */
    static const char corrupt[] = "\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":";
    write_file("corrupt.st", corrupt, sizeof corrupt - 1);
    char sub[256];
    path_in(sub, sizeof sub, "sub");
    cr_assert_eq(mkdir(sub, 0755), 0);
    path_in(sub, sizeof sub, "fifo");
    cr_assert_eq(mkfifo(sub, 0600), 0);
    if (bc->needs_ckpt) {
        result g = RUN("--steps", "1", "--save", "@good.st");
        assert_success(&g, "making good.st");
        result_free(&g);
    }

    /* --save first, so a case may end with an option lacking its value and
     * a case's own --save (given later) wins. */
    const char *save = bc->save[0] ? bc->save : "@out.st";
    const char *extra[16] = {"--save", save};
    size_t n = bc->no_save ? 0 : 2;
    for (int i = 0; i < 10 && bc->args[i][0]; i++) extra[n++] = bc->args[i];
    result r = run_lm(extra, n);

    cr_assert(WIFEXITED(r.status), "%s: killed by signal %d; stderr:\n%s", bc->name,
              WIFSIGNALED(r.status) ? WTERMSIG(r.status) : -1, r.err);
    cr_assert_neq(WEXITSTATUS(r.status), 0, "%s: exit status 0; stdout:\n%s", bc->name, r.out);
    size_t lines = 0;
    for (const char *p = r.err; *p; p++) lines += *p == '\n';
    size_t len = strlen(r.err);
    cr_assert(lines == 1 && len > 0 && r.err[len - 1] == '\n',
              "%s: want exactly one line on stderr, got %zu:\n%s", bc->name, lines, r.err);
    cr_assert_eq(strncmp(r.err, "lm_train: ", 10), 0, "%s: stderr does not start with "
                 "\"lm_train: \": %s", bc->name, r.err);
    cr_assert(strstr(r.err, bc->needle) != NULL, "%s: stderr does not mention \"%s\": %s",
              bc->name, bc->needle, r.err);
    /* Every one of these is known before the first step: nothing trains. */
    cr_assert_null(strstr(r.out, "trained "), "%s: trained before failing:\n%s", bc->name, r.out);

    char save_path[256];
    path_in(save_path, sizeof save_path, save + 1);
    struct stat sb;
    if (strcmp(save, "@sub") == 0) {
        cr_assert(stat(save_path, &sb) == 0 && S_ISDIR(sb.st_mode), "%s: the directory is gone",
                  bc->name);
        DIR *d = opendir(save_path);
        int entries = 0;
        struct dirent *de;
        while ((de = readdir(d))) entries += de->d_name[0] != '.';
        closedir(d);
        cr_assert_eq(entries, 0, "%s: files appeared in %s", bc->name, save_path);
    } else {
        cr_assert_neq(stat(save_path, &sb), 0, "%s: %s was created", bc->name, save_path);
    }
    /* No log either (cases may give --log @out.jsonl). */
    char log_path[256];
    path_in(log_path, sizeof log_path, "out.jsonl");
    cr_assert_neq(stat(log_path, &sb), 0, "%s: %s was created", bc->name, log_path);
    /* No temporary checkpoint file beside it either. */
    DIR *d = opendir(tmpdir);
    struct dirent *de;
    while ((de = readdir(d)))
        cr_assert_null(strstr(de->d_name, ".tmp."), "%s: left %s", bc->name, de->d_name);
    closedir(d);
    result_free(&r);
}
