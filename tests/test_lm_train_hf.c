/*
 * lm_train from and to Hugging Face's GPT-2 layout, as a user runs it:
 * the built binary (LM_TRAIN_PATH) on files the test writes into a temp
 * dir: llm.c token shards (ids below 657, the test BPE's vocabulary), a
 * tiny GPT's weights (V 657, 1 layer, dim 16, 2 heads, context 16) as a
 * Hugging Face directory (hf/), a bare model.safetensors (bare/) and a dp
 * checkpoint (ck.safetensors), and llm.c's decode-only table (tok.bin):
 *
 *  - --init-from any of the three evaluates to the same loss, another
 *    than a fresh model's; --heads is needed for the bare file;
 *  - --init-from, training, --save and --export-hf: the export holds the
 *    saved checkpoint's parameters bitwise, and the run started at step 0;
 *  - --eval-only --init-from CK --export-hf DIR converts: DIR's tensors
 *    are hf/'s, byte for byte;
 *  - --prompt TEXT on token data encodes through a BPE --tokenizer-file
 *    and the sample starts with it; llm.c's table cannot encode;
 *  - refusals before any work: --init-from with --resume, shape options
 *    contradicting the weights (both values named), --export-hf where a
 *    directory cannot be (no checkpoint written), outputs over
 *    --init-from's or --export-hf's files, a FIFO as an output;
 *  - an export writes both files or neither.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dp_test.h"
#include "dp_test_ckpt.h"
#include "dp_test_fs.h"
#include "dp_test_spawn.h"
#include "dp_test_tokens.h"

#ifndef LM_TRAIN_PATH
#error "LM_TRAIN_PATH (the lm_train binary) must be defined by the build"
#endif

static char tmpdir[64];
enum { V = 657, N_TRAIN = 3000, N_VAL = 600 };

static const char *in_tmp(const char *name) { return dp_test_join(tmpdir, name); }

/* tests/data/bpe/tokenizer.json, beside this source file. */
static const char *bpe_file(void)
{
    static char path[4096];
    const char *src = __FILE__, *slash = strrchr(src, '/');
    snprintf(path, sizeof path, "%.*sdata/bpe/tokenizer.json", (int)(slash ? slash - src + 1 : 0),
             src);
    return path;
}

static void setup(void)
{
    strcpy(tmpdir, "/tmp/dp_test_lm_hf_XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
    int32_t *ids = malloc((N_TRAIN + N_VAL) * sizeof *ids);
    uint32_t x = 99;
    for (size_t i = 0; i < N_TRAIN + N_VAL; i++) {
        x = x * 1664525u + 1013904223u;
        ids[i] = (int32_t)((x >> 8) % V);
    }
    cr_assert_eq(mkdir(in_tmp("llmc"), 0755), 0);
    dp_test_write_llmc(in_tmp("llmc/toy_train_000001.bin"), ids, N_TRAIN);
    dp_test_write_llmc(in_tmp("llmc/toy_val_000000.bin"), ids + N_TRAIN, N_VAL);
    free(ids);
    dp_test_write_llmc_tokenizer(in_tmp("tok.bin"), V);
    /* the weights: a GPT initialised from another seed than lm_train's */
    dp_gpt_config cfg = {.vocab_size = V, .block_size = 16, .n_layer = 1, .n_head = 2, .n_embd = 16};
    dp_gpt *g = NULL;
    dp_assert_ok(dp_gpt_create(&cfg, &g));
    const dp_model *m = dp_gpt_model(g, 0);
    float *p = calloc(m->n_params, sizeof *p);
    dp_assert_ok(m->init(m->ctx, p, 4242));
    /* far from a fresh model's near-uniform predictions, so its loss tells */
    for (size_t i = 0; i < m->n_params; i++) p[i] *= 8.0f;
    dp_assert_ok(dp_gpt_export_hf(in_tmp("hf"), g, p));
    cr_assert_eq(mkdir(in_tmp("bare"), 0755), 0);
    size_t n = 0;
    unsigned char *bytes = dp_test_read_file(in_tmp("hf/model.safetensors"), &n);
    dp_test_write_file(in_tmp("bare/model.safetensors"), bytes, n);
    free(bytes);
    dp_checkpoint ck = {.params = p};
    dp_assert_ok(dp_gpt_checkpoint_save(in_tmp("ck.safetensors"), g, &ck));
    free(p);
    dp_gpt_destroy(g);
}

static void teardown(void) { dp_test_remove_tree(tmpdir); }

TestSuite(lm_hf, .init = setup, .fini = teardown, .timeout = 90);

typedef dp_test_result result;

static const char *const BASE[] = {"--devices", "cpu:2", "--batch-size", "4", "--sample", "0",
                                   "--eval-iters", "1", "--data", "@llmc"};
#define N_BASE (sizeof BASE / sizeof BASE[0])

/* lm_train with BASE, then extra[0..n); '@name' is tmpdir/name. */
static result run_args(const char *const *extra, size_t n)
{
    return dp_test_run(LM_TRAIN_PATH, BASE, N_BASE, extra, n, tmpdir);
}

#define RUN(...)                                                                           \
    run_args((const char *const[]){__VA_ARGS__},                                           \
             sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *))

static void assert_ok(const result *r)
{
    cr_assert(WIFEXITED(r->status) && WEXITSTATUS(r->status) == 0, "failed:\n%s\n%s", r->out,
              r->err);
}

/* Refused with one "lm_train: ..." line holding a and b. */
static void assert_refused(const result *r, const char *a, const char *b)
{
    cr_assert(WIFEXITED(r->status) && WEXITSTATUS(r->status) != 0, "not refused:\n%s", r->out);
    cr_assert(strstr(r->err, a) && (!b || strstr(r->err, b)) && dp_test_count(r->err, "\n") == 1,
              "want one line with \"%s\"%s%s:\n%s", a, b ? " and " : "", b ? b : "", r->err);
}

/* The run of the given arguments is refused (assert_refused: a, b). */
#define REFUSED(a, b, ...)                                                                 \
    do {                                                                                   \
        result r_ = RUN(__VA_ARGS__);                                                      \
        assert_refused(&r_, a, b);                                                         \
        dp_test_result_free(&r_);                                                          \
    } while (0)

/* The "val_loss X" line's text, malloc'd. */
static char *val_loss_line(const result *r)
{
    const char *v = strstr(r->out, "val_loss ");
    cr_assert_not_null(v, "no val_loss in:\n%s", r->out);
    return strndup(v, strcspn(v, "\n"));
}

Test(lm_hf, three_sources_of_the_same_weights_evaluate_alike)
{
    const char *src[][4] = {{"--init-from", "@hf", NULL, NULL},
                            {"--init-from", "@ck.safetensors", NULL, NULL},
                            {"--init-from", "@bare/model.safetensors", "--heads", "2"}};
    char *first = NULL;
    for (int i = 0; i < 3; i++) {
        result r = src[i][2] ? RUN("--eval-only", src[i][0], src[i][1], src[i][2], src[i][3])
                             : RUN("--eval-only", src[i][0], src[i][1]);
        assert_ok(&r);
        char *line = val_loss_line(&r);
        if (!first) first = line;
        else {
            cr_assert_str_eq(line, first, "source %d", i);
            free(line);
        }
        dp_test_result_free(&r);
    }
    /* a fresh model of the same shape is another model */
    result f = RUN("--layers", "1", "--heads", "2", "--dim", "16", "--context", "16",
                   "--vocab-size", "657", "--steps", "0");
    assert_ok(&f);
    char *fresh = val_loss_line(&f);
    double lw = atof(first + strlen("val_loss ")), lf = atof(fresh + strlen("val_loss "));
    cr_assert(fabs(lw - lf) > 0.1, "a fresh model evaluated like the weights: %g vs %g", lf, lw);
    free(fresh);
    dp_test_result_free(&f);
    /* the bare file needs the heads */
    result b = RUN("--eval-only", "--init-from", "@bare/model.safetensors");
    assert_refused(&b, "--init-from", "--heads");
    dp_test_result_free(&b);
    free(first);
}

Test(lm_hf, training_from_weights_exports_what_it_saved)
{
    result r = RUN("--init-from", "@hf", "--steps", "3", "--save", "@t.safetensors",
                   "--export-hf", "@out");
    assert_ok(&r);
    cr_assert(strstr(r.out, "exported to"), "%s", r.out);
    dp_checkpoint *ck = dp_test_load_ck(in_tmp("t.safetensors"));
    cr_assert_eq(ck->step, 3, "a run from weights starts at step 0: saved at %ld", ck->step);
    dp_gpt *g = NULL;
    float *p = NULL;
    dp_assert_ok(dp_gpt_init_from(in_tmp("out"), 0, &g, &p));
    size_t n = dp_gpt_model(g, 0)->n_params;
    cr_assert_eq(dp_test_ck_params(ck), n);
    cr_assert(memcmp(p, ck->params, n * sizeof(float)) == 0,
              "the export differs from the saved parameters");
    /* and training moved them from the starting weights */
    dp_gpt *g0 = NULL;
    float *p0 = NULL;
    dp_assert_ok(dp_gpt_init_from(in_tmp("hf"), 0, &g0, &p0));
    cr_assert(memcmp(p0, p, n * sizeof(float)) != 0, "three steps changed nothing");
    free(p0);
    dp_gpt_destroy(g0);
    free(p);
    dp_gpt_destroy(g);
    dp_checkpoint_close(ck);
    dp_test_result_free(&r);
}

Test(lm_hf, eval_only_converts_a_checkpoint)
{
    result r = RUN("--eval-only", "--init-from", "@ck.safetensors", "--export-hf", "@conv");
    assert_ok(&r);
    dp_st_file *a = NULL, *b = NULL;
    dp_assert_ok(dp_st_open(in_tmp("conv/model.safetensors"), &a));
    dp_assert_ok(dp_st_open(in_tmp("hf/model.safetensors"), &b));
    cr_assert_eq(dp_st_count(a), dp_st_count(b));
    for (size_t i = 0; i < dp_st_count(a); i++) {
        const dp_st_tensor *x = dp_st_tensor_at(a, i), *y = dp_st_find(b, x->name);
        cr_assert(y && x->nbytes == y->nbytes && memcmp(x->data, y->data, x->nbytes) == 0,
                  "%s differs", x->name);
    }
    dp_st_close(a);
    dp_st_close(b);
    struct stat sb;
    cr_assert_eq(stat(in_tmp("conv/config.json"), &sb), 0);
    dp_test_result_free(&r);
}

Test(lm_hf, a_text_prompt_encodes_through_a_bpe_tokenizer_file)
{
    result r = RUN("--init-from", "@hf", "--steps", "1", "--sample", "3", "--tokenizer-file",
                   bpe_file(), "--prompt", "To be or not");
    assert_ok(&r);
    const char *h = strstr(r.out, "--- sample (");
    cr_assert_not_null(h, "%s", r.out);
    const char *body = strchr(h, '\n');
    cr_assert(body && strncmp(body + 1, "To be or not", 12) == 0, "the sample does not start "
              "with the prompt:\n%s", r.out);
    dp_test_result_free(&r);
    result t = RUN("--init-from", "@hf", "--steps", "1", "--sample", "3", "--tokenizer-file",
                   "@tok.bin", "--prompt", "To be");
    assert_refused(&t, "cannot encode", NULL);
    dp_test_result_free(&t);
    result n = RUN("--init-from", "@hf", "--steps", "1", "--sample", "3", "--prompt", "To be");
    assert_refused(&n, "--tokenizer-file", "--prompt-ids");
    dp_test_result_free(&n);
}

Test(lm_hf, contradictions_are_refused_before_any_work)
{
    result a = RUN("--init-from", "@hf", "--resume", "@ck.safetensors");
    assert_refused(&a, "--init-from", "--resume");
    dp_test_result_free(&a);
    result b = RUN("--init-from", "@hf", "--layers", "2", "--save", "@x.safetensors");
    assert_refused(&b, "--layers 1", "--layers 2 was given");
    dp_test_result_free(&b);
    result c = RUN("--init-from", "@hf", "--vocab-size", "512");
    assert_refused(&c, "--vocab-size 657", "--vocab-size 512 was given");
    dp_test_result_free(&c);
    result d = RUN("--init-from", "@hf", "--heads", "4");
    assert_refused(&d, "a model with 2 heads", "--heads 4 was given; drop --heads");
    dp_test_result_free(&d);
    dp_test_write_file(in_tmp("a_file"), "x", 1);
    result e = RUN("--init-from", "@hf", "--steps", "2", "--save", "@x.safetensors",
                   "--export-hf", "@a_file");
    assert_refused(&e, "--export-hf", "not a directory");
    dp_test_result_free(&e);
    result f = RUN("--init-from", "@hf", "--steps", "2", "--save", "@x.safetensors",
                   "--export-hf", "@no/such/dir");
    assert_refused(&f, "--export-hf", "parent directory");
    dp_test_result_free(&f);
    struct stat sb;
    cr_assert_neq(stat(in_tmp("x.safetensors"), &sb), 0, "a refused run wrote a checkpoint");
    result g = RUN("--eval-only", "--init-from", "@nothing");
    assert_refused(&g, "--init-from", "nothing");
    dp_test_result_free(&g);
    result h = RUN("--init-from", "");
    assert_refused(&h, "--init-from needs a path", NULL);
    dp_test_result_free(&h);
    /* a symbolic link to nothing: mkdir would fail only after training */
    char dangling[300];
    snprintf(dangling, sizeof dangling, "%s", in_tmp("dangling"));
    cr_assert_eq(symlink(in_tmp("nowhere"), dangling), 0);
    result i = RUN("--init-from", "@hf", "--steps", "2", "--export-hf", "@dangling");
    assert_refused(&i, "--export-hf", "symbolic link");
    dp_test_result_free(&i);
}

/* Outputs over --init-from's files or --export-hf's are refused before
 * any work, naming both options, and every file is left as it was: the
 * pretrained weights as --log, --save into --init-from's directory,
 * --export-hf over the training text or the --save checkpoint, and an
 * output that is a FIFO (the atomic writer's rename would replace it). */
Test(lm_hf, outputs_over_the_weights_or_the_export_are_refused)
{
    size_t n0 = 0;
    unsigned char *weights = dp_test_read_file(in_tmp("hf/model.safetensors"), &n0);
    REFUSED("--log", "--init-from",
            "--init-from", "@bare/model.safetensors", "--heads", "2", "--steps", "1", "--log",
            "@bare/model.safetensors");
    REFUSED("--save", "--init-from",
            "--init-from", "@hf", "--steps", "1", "--save", "@hf/model.safetensors");
    REFUSED("--trace", "--init-from",
            "--init-from", "@hf/model.safetensors", "--steps", "1", "--trace", "@hf/config.json");
    REFUSED("--export-hf", "--init-from",
            "--init-from", "@hf", "--steps", "1", "--export-hf", "@hf");
    cr_assert_eq(mkdir(in_tmp("ex"), 0755), 0);
    dp_test_write_file(in_tmp("ex/model.safetensors"), "keep", 4);
    REFUSED("--export-hf", "--save",
            "--init-from", "@hf", "--steps", "1", "--save", "@ex/model.safetensors",
            "--export-hf", "@ex");
    dp_test_write_file(in_tmp("ex/config.json"), "text", 4);
    REFUSED("--export-hf", "--data",
            "--init-from", "@hf", "--steps", "1", "--data", "@ex/config.json", "--export-hf",
            "@ex");
    /* encoder.json's merges beside it are an input too */
    cr_assert_eq(mkdir(in_tmp("tok"), 0755), 0);
    static const char *const bpe[] = {"encoder.json", "vocab.bpe"};
    for (int k = 0; k < 2; k++) {
        char src[4096];
        snprintf(src, sizeof src, "%s", bpe_file());
        snprintf(strrchr(src, '/') + 1, sizeof src - (size_t)(strrchr(src, '/') + 1 - src), "%s",
                 bpe[k]);
        size_t len = 0;
        unsigned char *bytes = dp_test_read_file(src, &len);
        char dst[64];
        snprintf(dst, sizeof dst, "tok/%s", bpe[k]);
        dp_test_write_file(in_tmp(dst), bytes, len);
        free(bytes);
    }
    REFUSED("--trace", "--tokenizer-file",
            "--tokenizer-file", "@tok/encoder.json", "--steps", "1", "--trace", "@tok/vocab.bpe");
    cr_assert_eq(mkfifo(in_tmp("fifo"), 0644), 0);
    REFUSED("--save", "is a FIFO",
            "--init-from", "@hf", "--steps", "1", "--save", "@fifo");
    size_t n1 = 0, n2 = 0, n3 = 0;
    unsigned char *now = dp_test_read_file(in_tmp("hf/model.safetensors"), &n1);
    cr_assert(n1 == n0 && memcmp(now, weights, n0) == 0, "the pretrained weights changed");
    unsigned char *bare = dp_test_read_file(in_tmp("bare/model.safetensors"), &n2);
    cr_assert(n2 == n0 && memcmp(bare, weights, n0) == 0, "the bare weights changed");
    unsigned char *kept = dp_test_read_file(in_tmp("ex/model.safetensors"), &n3);
    cr_assert(n3 == 4 && memcmp(kept, "keep", 4) == 0);
    struct stat sb;
    cr_assert(stat(in_tmp("fifo"), &sb) == 0 && S_ISFIFO(sb.st_mode), "the FIFO was replaced");
    free(weights), free(now), free(bare), free(kept);
}

/* Entries of directory dir, "." and ".." aside. */
static int entries(const char *dir)
{
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "%s", dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

/* dp_gpt_export_hf writes both files or neither: when model.safetensors
 * cannot be written (a directory in its place), an earlier export's
 * config.json stays as it was and no temporary file is left; a directory
 * the failed export made is removed. */
Test(lm_hf, a_failed_export_leaves_the_earlier_pair)
{
    cr_assert_eq(mkdir(in_tmp("pair"), 0755), 0);
    cr_assert_eq(mkdir(in_tmp("pair/model.safetensors"), 0755), 0);
    dp_test_write_file(in_tmp("pair/model.safetensors/x"), "x", 1);
    dp_test_write_file(in_tmp("pair/config.json"), "old", 3);
    dp_gpt_config cfg = {.vocab_size = V, .block_size = 16, .n_layer = 1, .n_head = 2, .n_embd = 16};
    dp_gpt *g = NULL;
    dp_assert_ok(dp_gpt_create(&cfg, &g));
    const dp_model *m = dp_gpt_model(g, 0);
    float *p = calloc(m->n_params, sizeof *p);
    cr_assert_neq(dp_gpt_export_hf(in_tmp("pair"), g, p), DP_OK);
    size_t n = 0;
    unsigned char *config = dp_test_read_file(in_tmp("pair/config.json"), &n);
    cr_assert(n == 3 && memcmp(config, "old", 3) == 0, "config.json was replaced alone");
    cr_assert_eq(entries(in_tmp("pair")), 2, "a temporary file was left");
    /* a directory the call made is removed again (the model's write fails
     * past a 4 KiB file-size limit) */
    struct rlimit old;
    dp_test_limit_file_size(4096, &old);
    dp_status made = dp_gpt_export_hf(in_tmp("made"), g, p);
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
    cr_assert_eq(made, DP_ERR_IO, "%s", dp_last_error());
    struct stat sb;
    cr_assert_neq(stat(in_tmp("made"), &sb), 0, "the directory the export made was left");
    free(config);
    free(p);
    dp_gpt_destroy(g);
}

/* --init-from a dp checkpoint of text takes the checkpoint's tokenizer, as
 * --resume does: one built from --data gave the trained rows to other
 * characters whenever the vocabulary merely had the same size (here
 * every letter upper-cased and mirrored: a silent, much worse loss).
 * Text the tokenizer does not cover is refused, naming it; --tokenizer
 * must match it. The same text evaluates as --resume does. */
Test(lm_hf, init_from_a_text_checkpoint_takes_its_tokenizer)
{
    char text[3000], mirrored[3000];
    static const char line[] = "the quick brown fox jumps over the lazy dog, again and again.\n";
    size_t n = 0;
    while (n + sizeof line - 1 < sizeof text) {
        memcpy(text + n, line, sizeof line - 1);
        n += sizeof line - 1;
    }
    for (size_t i = 0; i < n; i++) {
        char c = text[i];
        mirrored[i] = c >= 'a' && c <= 'z' ? (char)('Z' - (c - 'a')) : c;
    }
    dp_test_write_file(in_tmp("t.txt"), text, n);
    dp_test_write_file(in_tmp("m.txt"), mirrored, n);
    result a = RUN("--data", "@t.txt", "--steps", "30", "--save", "@text.st");
    assert_ok(&a);
    dp_test_result_free(&a);
    result r = RUN("--data", "@t.txt", "--resume", "@text.st", "--eval-only");
    result i = RUN("--data", "@t.txt", "--init-from", "@text.st", "--eval-only");
    assert_ok(&r);
    assert_ok(&i);
    char *lr = val_loss_line(&r), *li = val_loss_line(&i);
    cr_assert_str_eq(li, lr, "--init-from evaluates %s, --resume %s", li, lr);
    free(lr);
    free(li);
    dp_test_result_free(&r);
    dp_test_result_free(&i);
    REFUSED("--init-from's tokenizer was built from other text", "byte 0x",
            "--data", "@m.txt", "--init-from", "@text.st", "--eval-only");
    REFUSED("uses the char tokenizer", "--tokenizer word",
            "--data", "@t.txt", "--init-from", "@text.st", "--tokenizer", "word", "--eval-only");
}

/* Weights whose forward overflows (every parameter 3e38): --eval-only
 * fails naming them, where it printed "val_loss -nan" and exited 0. */
Test(lm_hf, eval_only_of_weights_that_overflow_fails)
{
    dp_gpt_config cfg = {.vocab_size = V, .block_size = 16, .n_layer = 1, .n_head = 2, .n_embd = 16};
    dp_gpt *g = NULL;
    dp_assert_ok(dp_gpt_create(&cfg, &g));
    size_t n = dp_gpt_model(g, 0)->n_params;
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = 3e38f;
    dp_checkpoint ck = {.params = p};
    dp_assert_ok(dp_gpt_checkpoint_save(in_tmp("huge.st"), g, &ck));
    free(p);
    dp_gpt_destroy(g);
    REFUSED("the validation loss is", "--init-from", "--eval-only", "--init-from", "@huge.st");
    result r = RUN("--eval-only", "--init-from", "@huge.st");
    cr_assert_null(strstr(r.out, "val_loss"), "a loss was printed:\n%s", r.out);
    dp_test_result_free(&r);
}
