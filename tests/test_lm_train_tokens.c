/*
 * lm_train on pre-tokenized data, as a user runs it: the built binary
 * (LM_TRAIN_PATH) on fixture files the test writes into a temp dir (ids in
 * [0, 512), a tiny GPT with --vocab-size 512 on cpu:2):
 *   nano/   nanoGPT's train.bin + val.bin beside prepare.py and input.txt
 *   llmc/   the same ids as llm.c shards: two train shards, one val shard
 *   one.bin the same ids in one raw file (split 90/10)
 *   tok.bin llm.c's tokenizer file of 512 tokens, token i = " w<i>"
 *
 *  - for both directories: trains, saves, and 4 steps + resume + 4 equal 8
 *    steps bitwise (parameters, AdamW moments, sampler, final loss); the
 *    checkpoint records the format and split lengths; --eval-only prints
 *    the final validation loss;
 *  - the two formats of the same ids train to the same bits;
 *  - samples decode through --tokenizer-file (also with a vocabulary
 *    padded to 50304 past the table), print as ids without it, and
 *    --prompt-ids starts them;
 *  - a single .bin splits 90/10;
 *  - --val-tokens N: the final evaluation and --eval-only read the first N
 *    validation tokens, bitwise the loss of a split holding only those;
 *    N of the split's length or more is the whole split, output unchanged;
 *  - resume refuses other data (format, lengths, text vs tokens);
 *    --eval-only takes other token data;
 *  - bad files and options fail before training with one "lm_train: ..."
 *    line on stderr naming the file, a non-zero exit, and no checkpoint or
 *    log written.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dp/checkpoint.h"
#include "dp/gpt.h"
#include "dp_test.h"
#include "dp_test_ckpt.h"
#include "dp_test_fs.h"
#include "dp_test_spawn.h"
#include "dp_test_tokens.h"

#include <criterion/parameterized.h> /* after criterion.h (in dp_test.h) */

#ifndef LM_TRAIN_PATH
#error "LM_TRAIN_PATH (the lm_train binary) must be defined by the build"
#endif

// --- fixtures -------------------------------------------------------------------------

static char tmpdir[64];

enum { N_TRAIN = 6000, N_VAL = 1000, V = 512 };

static const char *in_tmp(const char *name) { return dp_test_join(tmpdir, name); }

/* N_TRAIN + N_VAL ids with some structure to learn: runs of consecutive
 * ids from pseudo-random starts. */
static int32_t *fixture_ids(void)
{
    int32_t *t = malloc((N_TRAIN + N_VAL) * sizeof *t);
    cr_assert_not_null(t);
    uint32_t x = 12345;
    int32_t cur = 0;
    for (size_t i = 0; i < N_TRAIN + N_VAL; i++) {
        x = x * 1664525u + 1013904223u;
        cur = (x >> 28) == 0 ? (int32_t)((x >> 8) % V) : (cur + 1) % V;
        t[i] = cur;
    }
    return t;
}

static void setup(void)
{
    strcpy(tmpdir, "/tmp/dp_test_lm_tok_XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp failed");
    int32_t *ids = fixture_ids();
    cr_assert_eq(mkdir(in_tmp("nano"), 0755), 0);
    dp_test_write_raw(in_tmp("nano/train.bin"), ids, N_TRAIN);
    dp_test_write_raw(in_tmp("nano/val.bin"), ids + N_TRAIN, N_VAL);
    dp_test_put_file(in_tmp("nano/prepare.py"), "import numpy\n", 13, NULL, 0);
    dp_test_put_file(in_tmp("nano/input.txt"), "To be, or not\n", 14, NULL, 0);
    cr_assert_eq(mkdir(in_tmp("llmc"), 0755), 0);
    dp_test_write_llmc(in_tmp("llmc/toy_train_000002.bin"), ids + 2500, N_TRAIN - 2500);
    dp_test_write_llmc(in_tmp("llmc/toy_train_000001.bin"), ids, 2500);
    dp_test_write_llmc(in_tmp("llmc/toy_val_000000.bin"), ids + N_TRAIN, N_VAL);
    dp_test_write_raw(in_tmp("one.bin"), ids, N_TRAIN + N_VAL);
    dp_test_write_llmc_tokenizer(in_tmp("tok.bin"), V);
    free(ids);
}

static void teardown(void) { dp_test_remove_tree(tmpdir); }

TestSuite(lm_tokens, .init = setup, .fini = teardown, .timeout = 60);

// --- running lm_train -------------------------------------------------------------------

typedef dp_test_result result;

static const char *const BASE[] = {"--devices", "cpu:2", "--layers", "1", "--heads", "2",
                                   "--dim", "16", "--context", "16", "--batch-size", "4",
                                   "--sample", "0", "--eval-iters", "1", "--vocab-size", "512"};
#define N_BASE (sizeof BASE / sizeof BASE[0])

/* lm_train with BASE (when with_base), then extra[0..n); an argument
 * starting with '@' names a file in tmpdir. */
static result run_args(int with_base, const char *const *extra, size_t n)
{
    return dp_test_run(LM_TRAIN_PATH, BASE, with_base ? N_BASE : 0, extra, n, tmpdir);
}

#define ARGS_(...)                                                                         \
    (const char *const[]){__VA_ARGS__},                                                    \
        sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *)
#define RUN(...) run_args(1, ARGS_(__VA_ARGS__))

static dp_checkpoint *load_ck(const char *name) { return dp_test_load_ck(in_tmp(name)); }

#define ck_params dp_test_ck_params
#define number_after dp_test_number_after

/* Parameters, moments, step counts and sampler state of two checkpoints
 * are the same bits. */
static void assert_same_state(const char *a_name, const char *b_name)
{
    char a[256];
    snprintf(a, sizeof a, "%s", in_tmp(a_name));
    dp_test_assert_same_state(a, in_tmp(b_name), 1);
}

/* The text between the sample's header line and the closing "\n---",
 * malloc'd. */
static char *sample_of(const char *out)
{
    const char *h = strstr(out, "--- sample (");
    cr_assert_not_null(h, "no sample in:\n%s", out);
    const char *b = strchr(h, '\n');
    cr_assert_not_null(b);
    b++;
    const char *e = strstr(b, "\n---");
    cr_assert_not_null(e, "unterminated sample:\n%s", out);
    char *s = strndup(b, (size_t)(e - b));
    cr_assert_not_null(s);
    return s;
}

// --- training, resume, evaluation ------------------------------------------------------

typedef struct data_case {
    char dir[8];
    char format[8]; /* the checkpoint's data_format */
} data_case;

static data_case data_cases[] = {{"@nano", "nanogpt"}, {"@llmc", "llmc"}};

ParameterizedTestParameters(lm_tokens, trains_and_resumes_bitwise)
{
    return cr_make_param_array(data_case, data_cases, sizeof data_cases / sizeof data_cases[0]);
}

/* Warmup 2 and an 8-step schedule: every step's learning rate differs, so
 * the resumed run matches only if the schedule, parameters, moments and
 * the sampler all continue exactly. */
ParameterizedTest(data_case *dc, lm_tokens, trains_and_resumes_bitwise)
{
    result a = RUN("--data", dc->dir, "--steps", "8", "--warmup", "2", "--lr-decay-steps", "8",
                   "--save", "@a.st");
    dp_test_assert_success(&a, "8 steps");
    cr_assert(strstr(a.out, "6000 train, 1000 validation") && strstr(a.out, "mapped read-only"),
              "data line:\n%s", a.out);
    result b1 = RUN("--data", dc->dir, "--steps", "4", "--warmup", "2", "--lr-decay-steps", "8",
                    "--save", "@b.st");
    dp_test_assert_success(&b1, "4 steps");
    dp_checkpoint *half = load_ck("b.st");
    result b2 = RUN("--data", dc->dir, "--steps", "8", "--warmup", "2", "--resume", "@b.st",
                    "--save", "@b.st");
    dp_test_assert_success(&b2, "resumed to 8 steps");
    assert_same_state("a.st", "b.st");
    cr_assert_eq(number_after(a.out, "final val_loss "), number_after(b2.out, "final val_loss "),
                 "A:\n%s\nB:\n%s", a.out, b2.out);

    dp_checkpoint *ck = load_ck("b.st");
    size_t n = ck_params(ck);
    cr_assert_neq(memcmp(half->params, ck->params, n * sizeof(float)), 0, "the resume trained "
                  "nothing");
    cr_assert_str_eq(dp_checkpoint_meta(ck, "data_format"), dc->format);
    cr_assert_str_eq(dp_checkpoint_meta(ck, "data_train_tokens"), "6000");
    cr_assert_str_eq(dp_checkpoint_meta(ck, "data_val_tokens"), "1000");
    cr_assert_null(ck->tokenizer, "token data have no tokenizer to store");
    dp_gpt_config c;
    dp_assert_ok(dp_gpt_config_from_metadata(ck, &c));
    cr_assert_eq(c.vocab_size, V);
    dp_checkpoint_close(ck);
    dp_checkpoint_close(half);

    /* Without BASE's --vocab-size: the checkpoint's vocabulary counts. */
    const char *const ev[] = {LM_TRAIN_PATH, "--data", dc->dir, "--devices", "cpu:2",
                              "--batch-size", "4", "--resume", "@b.st", "--eval-only"};
    result e = run_args(0, ev + 1, sizeof ev / sizeof ev[0] - 1);
    dp_test_assert_success(&e, "--eval-only");
    double final = number_after(a.out, "final val_loss "), v = number_after(e.out, "val_loss ");
    cr_assert(isfinite(final) && fabs(final - v) <= 5e-5 + 5e-7,
              "final val_loss %.6f vs --eval-only %.6f:\n%s", final, v, e.out);
    dp_test_result_free(&a);
    dp_test_result_free(&b1);
    dp_test_result_free(&b2);
    dp_test_result_free(&e);
}

/* nanoGPT's files and llm.c's shards of the same ids are the same data:
 * the same run to the bit (the shards joined in name order). */
Test(lm_tokens, both_formats_of_the_same_ids_train_alike)
{
    result a = RUN("--data", "@nano", "--steps", "3", "--save", "@nano.st");
    dp_test_assert_success(&a, "nano");
    result b = RUN("--data", "@llmc", "--steps", "3", "--save", "@llmc.st");
    dp_test_assert_success(&b, "llmc");
    cr_assert(strstr(b.out, "llm.c files: 2 train, 1 validation"), "%s", b.out);
    cr_assert(strstr(a.out, "other files ignored"), "%s", a.out);
    assert_same_state("nano.st", "llmc.st");
    dp_test_result_free(&a);
    dp_test_result_free(&b);
}

Test(lm_tokens, a_single_bin_file_splits_90_10)
{
    result a = RUN("--data", "@one.bin", "--steps", "2");
    dp_test_assert_success(&a, "one.bin");
    cr_assert(strstr(a.out, "split 90/10; 7000 tokens: 6300 train, 700 validation"), "%s", a.out);
    dp_test_result_free(&a);
}

// --- --val-tokens -----------------------------------------------------------------------

/* The one line lm_train wrote on stderr holds needle; it failed. */
static void assert_refused(const result *r, const char *needle)
{
    cr_assert(WIFEXITED(r->status) && WEXITSTATUS(r->status) != 0, "not refused:\n%s", r->out);
    cr_assert(strstr(r->err, needle) && dp_test_count(r->err, "\n") == 1, "want one line with "
              "\"%s\":\n%s", needle, r->err);
}

/* A validation split whose first 304 tokens are the fixture's and the
 * rest one repeated id, as llm.c shards (vmix), and the same train split
 * with only those 304 validation tokens as nanoGPT files (vhead). With
 * --context 16, --val-tokens 304 keeps floor(303 / 16) = 18 windows
 * (tokens 0..288); a count of floor(304 / 16) = 19 would read token 304,
 * the other content, and differ from vhead's loss. */
enum { VT_HEAD = 304, VT_VAL = 1000 };

static void make_val_tokens_data(void)
{
    int32_t *ids = fixture_ids(), val[VT_VAL];
    for (size_t i = 0; i < VT_VAL; i++) val[i] = i < VT_HEAD ? ids[N_TRAIN + i] : 7;
    cr_assert_eq(mkdir(in_tmp("vmix"), 0755), 0);
    dp_test_write_llmc(in_tmp("vmix/toy_train_000001.bin"), ids, N_TRAIN);
    dp_test_write_llmc(in_tmp("vmix/toy_val_000000.bin"), val, VT_VAL);
    cr_assert_eq(mkdir(in_tmp("vhead"), 0755), 0);
    dp_test_write_raw(in_tmp("vhead/train.bin"), ids, N_TRAIN);
    dp_test_write_raw(in_tmp("vhead/val.bin"), val, VT_HEAD);
    free(ids);
}

Test(lm_tokens, val_tokens_evaluates_the_first_n_tokens)
{
    make_val_tokens_data();
    /* The final evaluation: training reads no validation token, so both
     * runs train alike and evaluate the same 18 windows. */
    result t = RUN("--data", "@vmix", "--steps", "3", "--val-tokens", "304", "--save", "@vt.st");
    dp_test_assert_success(&t, "training with --val-tokens 304");
    cr_assert(strstr(t.out, "validation: the first 289 of 1000 tokens (--val-tokens 304: 18 "
                            "windows of context 16)\n"), "no note:\n%s", t.out);
    result h = RUN("--data", "@vhead", "--steps", "3");
    dp_test_assert_success(&h, "training on the first 304 validation tokens");
    cr_assert_null(strstr(h.out, "validation: the first"), "%s", h.out);
    double ft = number_after(t.out, "final val_loss "), fh = number_after(h.out, "final val_loss ");
    cr_assert(isfinite(ft) && ft == fh, "final val_loss %.4f with --val-tokens 304, %.4f on the "
              "first 304 tokens:\n%s\n%s", ft, fh, t.out, h.out);

    /* --eval-only: the limited loss is the head's to all printed digits,
     * and differs from the whole split's. */
    result el = RUN("--data", "@vmix", "--resume", "@vt.st", "--eval-only", "--val-tokens", "304");
    dp_test_assert_success(&el, "--eval-only --val-tokens 304");
    result eh = RUN("--data", "@vhead", "--resume", "@vt.st", "--eval-only");
    dp_test_assert_success(&eh, "--eval-only on the first 304 tokens");
    result ea = RUN("--data", "@vmix", "--resume", "@vt.st", "--eval-only");
    dp_test_assert_success(&ea, "--eval-only on the whole split");
    double vl = number_after(el.out, "val_loss "), vh = number_after(eh.out, "val_loss ");
    double va = number_after(ea.out, "val_loss ");
    cr_assert(isfinite(vl) && vl == vh, "--val-tokens 304: %.6f, the first 304 tokens: %.6f", vl,
              vh);
    cr_assert(isfinite(va) && va != vl, "the whole split's loss %.6f equals the first 304 "
              "tokens'", va);
    cr_assert(fabs(ft - vl) <= 5e-5 + 5e-7, "final %.4f vs --eval-only %.6f", ft, vl);

    /* The split's length, or more: the whole split, the output unchanged. */
    result ew = RUN("--data", "@vmix", "--resume", "@vt.st", "--eval-only", "--val-tokens", "1000");
    dp_test_assert_success(&ew, "--val-tokens 1000");
    cr_assert_str_eq(ew.out, ea.out);
    result ep = RUN("--data", "@vmix", "--resume", "@vt.st", "--eval-only", "--val-tokens", "5000");
    dp_test_assert_success(&ep, "--val-tokens 5000");
    cr_assert_str_eq(ep.out, ea.out);

    /* Below one window: refused, naming the fix; with the checkpoint's context too. */
    result b = RUN("--data", "@vmix", "--val-tokens", "16", "--save", "@bad.st");
    assert_refused(&b, "--val-tokens 16 is shorter than one window (context+1 = 17 tokens); "
                       "give at least 17 or 0 for the whole split");
    result c = RUN("--data", "@vmix", "--resume", "@vt.st", "--eval-only", "--val-tokens", "5");
    assert_refused(&c, "(the checkpoint's context+1 = 17 tokens)");
    struct stat sb;
    cr_assert_neq(stat(in_tmp("bad.st"), &sb), 0, "a checkpoint was written");

    dp_test_result_free(&t);
    dp_test_result_free(&h);
    dp_test_result_free(&el);
    dp_test_result_free(&eh);
    dp_test_result_free(&ea);
    dp_test_result_free(&ew);
    dp_test_result_free(&ep);
    dp_test_result_free(&b);
    dp_test_result_free(&c);
}

// --- samples --------------------------------------------------------------------------

/* Checks that s is made of n fixture tokens " w<i>", each i < V; returns
 * the first id. */
static long assert_decoded(const char *s, size_t n)
{
    size_t k = 0;
    long first = -1;
    for (const char *p = s; *p; k++) {
        char *end = NULL;
        cr_assert(p[0] == ' ' && p[1] == 'w', "not a fixture token at \"%.12s\" in:\n%s", p, s);
        long id = strtol(p + 2, &end, 10);
        cr_assert(end > p + 2 && id >= 0 && id < V, "bad token at \"%.12s\"", p);
        if (k == 0) first = id;
        p = end;
    }
    cr_assert_eq(k, n, "%zu tokens in the sample, want %zu:\n%s", k, n, s);
    return first;
}

/* The case: an id past the vocabulary in the validation split,
 * found by the evaluation at the last step, no longer loses the 4 steps
 * trained: the checkpoint is written first, then the run fails naming the
 * id. */
Test(lm_tokens, an_evaluation_that_fails_after_training_saves_first)
{
    int32_t *ids = fixture_ids();
    for (size_t i = 0; i < N_TRAIN + N_VAL; i++) ids[i] %= 300;
    for (size_t i = N_TRAIN; i < N_TRAIN + N_VAL; i += 7) ids[i] = 400; /* past --vocab-size 300 */
    cr_assert_eq(mkdir(in_tmp("badval"), 0755), 0);
    dp_test_write_raw(in_tmp("badval/train.bin"), ids, N_TRAIN);
    dp_test_write_raw(in_tmp("badval/val.bin"), ids + N_TRAIN, N_VAL);
    free(ids);
    result r = RUN("--data", "@badval", "--vocab-size", "300", "--steps", "4", "--eval-interval",
                   "4", "--eval-iters", "20", "--save", "@ck.st");
    cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 1, "status %d; stderr:\n%s",
              r.status, r.err);
    cr_assert(strstr(r.err, "outside the vocabulary [0, 300)") &&
                  strstr(r.err, "stopped at step 4; its checkpoint is saved in "),
              "stderr:\n%s", r.err);
    dp_checkpoint *ck = load_ck("ck.st");
    cr_assert_eq(ck->step, 4);
    dp_checkpoint_close(ck);
    dp_test_result_free(&r);
}

/* The same id in the training split: the batch that meets it stops the
 * run, which saves the steps trained before it (it used to fail unsaved). */
Test(lm_tokens, a_training_batch_that_cannot_be_made_saves_first)
{
    int32_t *ids = fixture_ids();
    for (size_t i = 0; i < N_TRAIN + N_VAL; i++) ids[i] %= 300;
    ids[N_TRAIN / 2] = 400; /* one id past --vocab-size 300: met after some steps */
    cr_assert_eq(mkdir(in_tmp("badtrain"), 0755), 0);
    dp_test_write_raw(in_tmp("badtrain/train.bin"), ids, N_TRAIN);
    dp_test_write_raw(in_tmp("badtrain/val.bin"), ids + N_TRAIN, N_VAL);
    free(ids);
    result r = RUN("--data", "@badtrain", "--vocab-size", "300", "--steps", "100000",
                   "--eval-interval", "100000", "--save", "@ck.st");
    cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 1, "status %d; stderr:\n%s",
              r.status, r.err);
    cr_assert(strstr(r.err, "lm_train: batch: ") && strstr(r.err, "stopped at step ") &&
                  strstr(r.err, "its checkpoint is saved in "),
              "stderr:\n%s", r.err);
    dp_checkpoint *ck = load_ck("ck.st");
    cr_assert_gt(ck->step, 0);
    dp_checkpoint_close(ck);
    dp_test_result_free(&r);

    /* Again with stderr closed (2>&-) and a --log: the message must not
     * land in the log, which would take descriptor 2 (the log's rows only). */
    char *argv[N_BASE + 16];
    size_t argc = 0;
    argv[argc++] = "/bin/sh";
    argv[argc++] = "-c";
    argv[argc++] = "exec \"$0\" \"$@\" 2>&-";
    argv[argc++] = LM_TRAIN_PATH;
    for (size_t i = 0; i < N_BASE; i++) argv[argc++] = (char *)BASE[i];
    char data[256], log[256];
    snprintf(data, sizeof data, "%s", in_tmp("badtrain"));
    snprintf(log, sizeof log, "%s", in_tmp("l.jsonl"));
    const char *more[] = {"--data", data, "--vocab-size", "300", "--steps", "100000",
                          "--eval-interval", "100000", "--log", log};
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) argv[argc++] = (char *)more[i];
    argv[argc] = NULL;
    char out[256], err[256];
    snprintf(out, sizeof out, "%s", in_tmp("out.txt"));
    snprintf(err, sizeof err, "%s", in_tmp("err.txt"));
    dp_test_result c = dp_test_collect(dp_test_spawn(argv, out, err), out, err);
    cr_assert(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 1, "status %d", c.status);
    size_t n;
    char *text = (char *)dp_test_read_file(log, &n);
    cr_assert(text && n > 0);
    for (char *line = text; *line; line = strchr(line, '\n') + 1) {
        cr_assert(strncmp(line, "{\"step\":", 8) == 0, "not a row of the log: %.80s", line);
        cr_assert_not_null(strchr(line, '\n'), "a cut row: %s", line);
    }
    free(text);
    dp_test_result_free(&c);
}

/* --eval-only reads the validation split only: a training split shorter
 * than the context (which training could not sample) does not stop it,
 * and the loss is the one of the same validation split beside a long
 * training split. */
Test(lm_tokens, eval_only_needs_no_training_split)
{
    int32_t *ids = fixture_ids();
    cr_assert_eq(mkdir(in_tmp("shorttrain"), 0755), 0);
    dp_test_write_raw(in_tmp("shorttrain/train.bin"), ids, 10);
    dp_test_write_raw(in_tmp("shorttrain/val.bin"), ids + N_TRAIN, N_VAL);
    free(ids);
    result a = RUN("--data", "@nano", "--steps", "2", "--save", "@ck.st");
    dp_test_assert_success(&a, "2 steps on nano");
    result b = RUN("--data", "@shorttrain", "--resume", "@ck.st", "--eval-only");
    dp_test_assert_success(&b, "--eval-only with a 10-token training split");
    result c = RUN("--data", "@nano", "--resume", "@ck.st", "--eval-only");
    dp_test_assert_success(&c, "--eval-only on nano");
    const char *vb = strstr(b.out, "val_loss "), *vc = strstr(c.out, "val_loss ");
    cr_assert(vb && vc && strcmp(vb, vc) == 0, "losses differ:\n%s\n%s", b.out, c.out);
    dp_test_result_free(&a);
    dp_test_result_free(&b);
    dp_test_result_free(&c);
}

/* A token file cut short while lm_train reads it through its mapping
 * (SIGBUS at the next read past its new end): the run ends at once with
 * status 1 and a message naming the data, not killed by the signal
 * without a word. */
Test(lm_tokens, a_token_file_cut_while_mapped_ends_the_run_naming_it)
{
    int32_t *ids = fixture_ids();
    cr_assert_eq(mkdir(in_tmp("cut"), 0755), 0);
    dp_test_write_raw(in_tmp("cut/train.bin"), ids, N_TRAIN);
    dp_test_write_raw(in_tmp("cut/val.bin"), ids + N_TRAIN, N_VAL);
    free(ids);
    const char *args[] = {"--data", in_tmp("cut"), "--steps", "100000000", "--eval-interval",
                          "10", "--save", in_tmp("ck.st")};
    char *argv[N_BASE + 16];
    size_t argc = dp_test_argv(argv, N_BASE + 16, 0, NULL, LM_TRAIN_PATH, BASE, N_BASE, args, 8,
                               tmpdir);
    char out[256], err[256];
    snprintf(out, sizeof out, "%s/stdout.txt", tmpdir);
    snprintf(err, sizeof err, "%s/stderr.txt", tmpdir);
    pid_t pid = dp_test_spawn(argv, out, err);
    dp_test_argv_free(argv, argc);
    for (int seen = 0; !seen;) { /* training has begun (the test's timeout bounds it) */
        size_t n;
        char *t = (char *)dp_test_read_file(out, &n);
        seen = t && strstr(t, "step 2/");
        free(t);
        int st;
        cr_assert_eq(waitpid(pid, &st, WNOHANG), 0, "lm_train ended before training");
    }
    cr_assert_eq(truncate(in_tmp("cut/train.bin"), 0), 0);
    result r = dp_test_collect(pid, out, err);
    cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 1, "status %d (killed by %d)",
              r.status, WIFSIGNALED(r.status) ? WTERMSIG(r.status) : 0);
    char want[300];
    snprintf(want, sizeof want, "lm_train: a token file of --data %s was cut short", in_tmp("cut"));
    cr_assert(strstr(r.err, want) && strstr(r.err, "(SIGBUS)"), "stderr:\n%s", r.err);
    dp_test_result_free(&r);
}

/* A token directory's data are its *.bin files: a checkpoint kept beside
 * them is not one (only an output onto a .bin there is refused). */
Test(lm_tokens, a_checkpoint_beside_the_token_files_is_not_an_input)
{
    for (int i = 0; i < 2; i++) { /* the second run finds it there */
        result r = RUN("--data", "@nano", "--steps", "1", "--save", "@nano/ck.st");
        dp_test_assert_success(&r, i ? "saving again beside the token files" : "saving beside");
        dp_test_result_free(&r);
    }
}

Test(lm_tokens, samples_decode_through_the_tokenizer_file_or_print_ids)
{
    /* With the table: the prompt is its end-of-text id (511), then 20 tokens. */
    result a = RUN("--data", "@llmc", "--steps", "2", "--sample", "20", "--tokenizer-file",
                   "@tok.bin");
    dp_test_assert_success(&a, "--tokenizer-file");
    char *s = sample_of(a.out);
    cr_assert_eq(assert_decoded(s, 21), V - 1, "the prompt is not the end-of-text token");
    free(s);
    /* --prompt-ids starts the sample. */
    result b = RUN("--data", "@llmc", "--steps", "2", "--sample", "5", "--tokenizer-file",
                   "@tok.bin", "--prompt-ids", "7,300");
    dp_test_assert_success(&b, "--prompt-ids");
    s = sample_of(b.out);
    cr_assert_eq(strncmp(s, " w7 w300 w", 10), 0, "%s", s);
    assert_decoded(s, 7);
    free(s);
    /* Without the table: ids, the prompt the training split's first id
     * (50256 is past --vocab-size 512). */
    result c = RUN("--data", "@nano", "--steps", "2", "--sample", "20");
    dp_test_assert_success(&c, "ids");
    cr_assert(strstr(c.out, "samples print as ids") && strstr(c.out, "token ids:"), "%s", c.out);
    s = sample_of(c.out);
    int32_t *ids = fixture_ids();
    size_t k = 0;
    for (char *p = s, *end; *p; p = end, k++) {
        long id = strtol(p, &end, 10);
        cr_assert(end > p && id >= 0 && id < V && (*end == ' ' || !*end), "at \"%.12s\"", p);
        if (k == 0) cr_assert_eq(id, ids[0], "the prompt is not the first training token");
    }
    cr_assert_eq(k, 21, "%s", s);
    free(ids);
    free(s);
    /* A vocabulary padded past the table (llm.c's 50304): ids the table
     * lacks print nothing, the rest decode. */
    result d = RUN("--data", "@llmc", "--steps", "2", "--sample", "10", "--tokenizer-file",
                   "@tok.bin", "--vocab-size", "50304");
    dp_test_assert_success(&d, "--vocab-size 50304");
    cr_assert(strstr(d.out, "vocab 50304"), "%s", d.out);
    s = sample_of(d.out);
    cr_assert_eq(strncmp(s, " w511", 5), 0, "%s", s);
    free(s);
    dp_test_result_free(&a);
    dp_test_result_free(&b);
    dp_test_result_free(&c);
    dp_test_result_free(&d);
}

// --- resume on other data ---------------------------------------------------------------

Test(lm_tokens, resume_refuses_other_data_and_eval_only_takes_it)
{
    result a = RUN("--data", "@llmc", "--steps", "2", "--save", "@t.st");
    dp_test_assert_success(&a, "tokens");
    result b = RUN("--data", "@nano", "--steps", "4", "--resume", "@t.st");
    assert_refused(&b, "trained on llmc data of 6000 train and 1000 validation tokens");
    result c = RUN("--data", "@one.bin", "--steps", "4", "--resume", "@t.st");
    assert_refused(&c, "6300 and 700");
    /* Other token data of the model's vocabulary: --eval-only evaluates it. */
    result d = RUN("--data", "@one.bin", "--resume", "@t.st", "--eval-only");
    dp_test_assert_success(&d, "--eval-only on other token data");
    cr_assert(isfinite(number_after(d.out, "val_loss ")), "%s", d.out);
    /* Text and token ids do not mix either way. */
    char text[241];
    for (int i = 0; i < 10; i++) memcpy(text + 24 * i, "the cat sat on the mat.\n", 24);
    dp_test_put_file(in_tmp("text.txt"), text, 240, NULL, 0);
    result e = run_args(0, ARGS_("--data", "@text.txt", "--resume", "@t.st", "--eval-only"));
    assert_refused(&e, "trained on token ids");
    result f = run_args(0, ARGS_("--data", "@text.txt", "--devices", "cpu:1", "--layers", "1",
                                 "--heads", "1", "--dim", "8", "--context", "4", "--steps", "1",
                                 "--sample", "0", "--eval-iters", "1", "--save", "@text.st"));
    dp_test_assert_success(&f, "text");
    result g = run_args(0, ARGS_("--data", "@nano", "--resume", "@text.st", "--eval-only"));
    assert_refused(&g, "was trained on text");
    /* The vocabulary is the checkpoint's. */
    result h = RUN("--data", "@llmc", "--resume", "@t.st", "--eval-only", "--vocab-size", "600");
    assert_refused(&h, "--vocab-size 600");
    dp_test_result_free(&a);
    dp_test_result_free(&b);
    dp_test_result_free(&c);
    dp_test_result_free(&d);
    dp_test_result_free(&e);
    dp_test_result_free(&f);
    dp_test_result_free(&g);
    dp_test_result_free(&h);
}

// --- bad input ---------------------------------------------------------------------------

typedef struct bad_case {
    char name[48];
    char args[8][40]; /* after BASE, --save @out.st --log @out.jsonl; "" ends */
    char needle[64];  /* the stderr line must hold this */
    int at_step;      /* found by the first step (the log is open, holding no row) */
} bad_case;

static bad_case bad_cases[] = {
    {"odd-sized raw file", {"--data", "@bad/odd.bin"}, "odd.bin", 0},
    {"empty file", {"--data", "@bad/empty.bin"}, "empty.bin' is empty", 0},
    {"llm.c version 2", {"--data", "@bad/v2.bin"}, "v2.bin' is an llm.c token file of version 2",
     0},
    {"count past the file", {"--data", "@bad/short.bin"}, "short.bin': the llm.c header says 7000",
     0},
    {"count overflowing int32", {"--data", "@bad/neg.bin"}, "neg.bin': the llm.c header's token "
     "count", 0},
    {"train files but no val", {"--data", "@trainonly"}, "toy_train_000001.bin', ...) but no val",
     0},
    {"no .bin but val", {"--data", "@valonly"}, "no training file", 0},
    {"FIFO as data", {"--data", "@bad/fifo.bin"}, "fifo.bin' is not a regular file", 0},
    {"/dev/zero as data", {"--data", "/dev/zero"}, "/dev/zero' is not a regular file", 0},
    {"id past the vocabulary", {"--data", "@nano", "--vocab-size", "300"}, "outside the "
     "vocabulary [0, 300)", 1},
    {"tokenizer cut short", {"--data", "@llmc", "--tokenizer-file", "@bad/tok_cut.bin"},
     "tok_cut.bin' is cut short", 0},
    {"tokenizer zero length", {"--data", "@llmc", "--tokenizer-file", "@bad/tok_zero.bin"},
     "tok_zero.bin': token 1 has a zero length", 0},
    {"tokenizer vocab overflow", {"--data", "@llmc", "--tokenizer-file", "@bad/tok_ovf.bin"},
     "tok_ovf.bin': the header's vocabulary size 4294967295", 0},
    {"tokenizer past --vocab-size", {"--data", "@llmc", "--tokenizer-file", "@tok.bin",
     "--vocab-size", "511"}, "--vocab-size 512 or more", 0},
    {"tokenizer a FIFO", {"--data", "@llmc", "--tokenizer-file", "@bad/fifo.bin"},
     "fifo.bin' is not a regular file", 0},
    {"prompt-ids past the vocabulary", {"--data", "@llmc", "--prompt-ids", "5,512"},
     "--prompt-ids: id 512", 0},
    {"prompt-ids malformed", {"--data", "@llmc", "--prompt-ids", "5,,6"}, "entry 2 is not", 0},
    {"prompt-ids negative", {"--data", "@llmc", "--prompt-ids", "-1"}, "entry 1 is not", 0},
    {"prompt-ids huge", {"--data", "@llmc", "--prompt-ids", "99999999999999999999999"},
     "entry 1 is not", 0},
    {"text prompt on token data", {"--data", "@llmc", "--prompt", "Hello"}, "--prompt-ids", 0},
    {"tokenizer kind on token data", {"--data", "@llmc", "--tokenizer", "word"}, "--tokenizer "
     "word applies to text", 0},
    {"vocab-size past uint16", {"--data", "@llmc", "--vocab-size", "70000"}, "--vocab-size "
     "70000", 0},
    {"tokenizer file on text", {"--data", "@bad/text.txt", "--tokenizer-file", "@tok.bin"},
     "--tokenizer-file decodes token data", 0},
    {"prompt-ids on text", {"--data", "@bad/text.txt", "--prompt-ids", "1"}, "--prompt-ids "
     "applies to token data", 0},
    /* An output onto an input: refused before anything is written. */
    {"log onto the tokenizer file", {"--data", "@llmc", "--tokenizer-file", "@tok.bin", "--log",
     "@tok.bin"}, "--log \"", 0},
    {"save onto a shard of the data", {"--data", "@nano", "--save", "@nano/val.bin"},
     "is one of the files --data", 0},
    {"trace onto the data file", {"--data", "@one.bin", "--trace", "@./one.bin"},
     "is the same file as --data", 0},
};

ParameterizedTestParameters(lm_tokens, bad_input_fails_cleanly)
{
    return cr_make_param_array(bad_case, bad_cases, sizeof bad_cases / sizeof bad_cases[0]);
}

static void make_bad_files(void)
{
    int32_t *ids = fixture_ids();
    cr_assert_eq(mkdir(in_tmp("bad"), 0755), 0);
    dp_test_put_file(in_tmp("bad/odd.bin"), "\1\0\2\0\3", 5, NULL, 0);
    dp_test_put_file(in_tmp("bad/empty.bin"), "", 0, NULL, 0);
    dp_test_write_llmc_header(in_tmp("bad/v2.bin"), DP_LLMC_DATA_MAGIC, 2, 100, ids, 100);
    dp_test_write_llmc_header(in_tmp("bad/short.bin"), DP_LLMC_DATA_MAGIC, 1, 7000, ids, 6999);
    dp_test_write_llmc_header(in_tmp("bad/neg.bin"), DP_LLMC_DATA_MAGIC, 1, 0xfffffff0u, ids, 100);
    cr_assert_eq(mkfifo(in_tmp("bad/fifo.bin"), 0600), 0);
    dp_test_put_file(in_tmp("bad/text.txt"), "some text to train on, some text.\n", 34, NULL, 0);
    cr_assert_eq(mkdir(in_tmp("trainonly"), 0755), 0);
    dp_test_write_llmc(in_tmp("trainonly/toy_train_000001.bin"), ids, 3000);
    dp_test_write_llmc(in_tmp("trainonly/toy_train_000002.bin"), ids, 3000);
    cr_assert_eq(mkdir(in_tmp("valonly"), 0755), 0);
    dp_test_write_raw(in_tmp("valonly/val.bin"), ids, 3000);
    size_t len = 0;
    unsigned char *t = dp_test_llmc_tokenizer_bytes(2, V, V, V - 1, &len);
    dp_test_put_file(in_tmp("bad/tok_cut.bin"), t, len - 1, NULL, 0);
    t[DP_LLMC_TOKENIZER_HEADER_BYTES + 4] = 0; // token 1's length byte
    dp_test_put_file(in_tmp("bad/tok_zero.bin"), t, len, NULL, 0);
    free(t);
    t = dp_test_llmc_tokenizer_bytes(2, 0xffffffffu, V, V - 1, &len);
    dp_test_put_file(in_tmp("bad/tok_ovf.bin"), t, len, NULL, 0);
    free(t);
    free(ids);
}

ParameterizedTest(bad_case *bc, lm_tokens, bad_input_fails_cleanly, .timeout = 20)
{
    make_bad_files();
    const char *extra[16] = {"--save", "@out.st", "--log", "@out.jsonl"};
    size_t n = 4;
    for (int i = 0; i < 8 && bc->args[i][0]; i++) extra[n++] = bc->args[i];
    result r = run_args(1, extra, n);
    cr_assert(WIFEXITED(r.status), "%s: killed by signal %d; stderr:\n%s", bc->name,
              WIFSIGNALED(r.status) ? WTERMSIG(r.status) : -1, r.err);
    cr_assert_neq(WEXITSTATUS(r.status), 0, "%s: exit status 0; stdout:\n%s", bc->name, r.out);
    size_t len = strlen(r.err);
    cr_assert(dp_test_count(r.err, "\n") == 1 && len > 0 && r.err[len - 1] == '\n',
              "%s: want exactly one line on stderr:\n%s", bc->name, r.err);
    cr_assert_eq(strncmp(r.err, "lm_train: ", 10), 0, "%s: %s", bc->name, r.err);
    cr_assert(strstr(r.err, bc->needle), "%s: stderr lacks \"%s\": %s", bc->name, bc->needle,
              r.err);
    cr_assert_null(strstr(r.out, "trained "), "%s: trained before failing:\n%s", bc->name, r.out);
    struct stat sb;
    cr_assert_neq(stat(in_tmp("out.st"), &sb), 0, "%s: a checkpoint was written", bc->name);
    if (bc->at_step)
        cr_assert(stat(in_tmp("out.jsonl"), &sb) == 0 && sb.st_size == 0, "%s: the log has rows",
                  bc->name);
    else
        cr_assert_neq(stat(in_tmp("out.jsonl"), &sb), 0, "%s: a log was written", bc->name);
    DIR *d = opendir(tmpdir);
    struct dirent *de;
    while ((de = readdir(d)))
        cr_assert_null(strstr(de->d_name, ".tmp."), "%s: left %s", bc->name, de->d_name);
    closedir(d);
    dp_test_result_free(&r);
}
