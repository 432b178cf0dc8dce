/*
 * GPT checkpoints (dp/checkpoint.h): exact save/load round trips, rejection
 * of corrupted and inconsistent files with DP_ERR_FORMAT naming the file,
 * and atomic writes (a failed save leaves no file, or the old one).
 *
 * Bad files are made two ways: structure-valid but wrong checkpoints with
 * dp_st_writer (a mirror of dp_checkpoint_save with one thing changed), and
 * structural damage by editing the bytes of a good file.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dp/atomic_file.h"
#include "dp/checkpoint.h"
#include "dp/safetensors.h"
#include "dp_test.h"
#include "dp_test_fs.h"

#include <criterion/parameterized.h> /* after criterion.h (in dp_test.h) */

// --- fixtures -------------------------------------------------------------------------

static char tmpdir[64];

static void path_in(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", tmpdir, name);
}


static void setup(void)
{
    strcpy(tmpdir, "/tmp/dp_test_ck_XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp failed");
}

static void teardown(void) { dp_test_remove_tree(tmpdir); }

/* Entries of dir (without . and ..). */
static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "cannot open %s", dir);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) n++;
    closedir(d);
    return n;
}

// --- the tiny GPT and a checkpoint of random numbers ------------------------------------

static const dp_gpt_config TINY = {
    .vocab_size = 11, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 8};

static dp_gpt *tiny_gpt(void)
{
    dp_gpt *gpt = NULL;
    dp_assert_ok(dp_gpt_create(&TINY, &gpt));
    return gpt;
}

/* A checkpoint for gpt: params normal, m normal, v uniform [0,1) (a second
 * moment is >= 0), step 7 / optimizer_step 5, a real char tokenizer, options
 * JSON and a sampler state, all from seed. Free with free_filled. */
static dp_checkpoint fill_ck(const dp_gpt *gpt, uint64_t seed, int with_opt)
{
    size_t n = dp_gpt_model(gpt, 0)->n_params;
    dp_checkpoint ck;
    memset(&ck, 0, sizeof ck);
    ck.step = 7;
    ck.optimizer_step = 5;
    dp_rng rng;
    dp_rng_seed(&rng, seed);
    ck.params = malloc(n * sizeof(float));
    cr_assert_not_null(ck.params);
    dp_rng_fill_normal(&rng, ck.params, n, 0.0f, 0.02f);
    if (with_opt) {
        ck.m = malloc(n * sizeof(float));
        ck.v = malloc(n * sizeof(float));
        cr_assert(ck.m && ck.v);
        dp_rng_fill_normal(&rng, ck.m, n, 0.0f, 1e-3f);
        dp_rng_fill_uniform(&rng, ck.v, n, 0.0f, 1.0f);
    }
    dp_tokenizer *tok = NULL;
    const char *text = "hello, world\n"; /* the checkpoint stores the JSON as is */
    dp_assert_ok(dp_tokenizer_create_char(text, strlen(text), &tok));
    dp_assert_ok(dp_tokenizer_serialize(tok, &ck.tokenizer));
    dp_tokenizer_destroy(tok);
    ck.config_json = strdup("{\"lr\":0.001,\"note\":\"quote \\\" and unicode \\u00e9\"}");
    ck.has_sampler = 1;
    for (int i = 0; i < DP_SAMPLER_STATE_WORDS; i++) ck.sampler[i] = dp_rng_u64(&rng);
    return ck;
}

static void free_filled(dp_checkpoint *ck)
{
    free(ck->params);
    free(ck->m);
    free(ck->v);
    free(ck->tokenizer);
    free(ck->config_json);
}

/* Bitwise equality of every tensor of the flat layout (the alignment
 * padding between tensors is not stored, so it is not compared). */
static void assert_bits_equal(const dp_gpt *gpt, const float *a, const float *b, const char *what)
{
    cr_assert_not_null(a, "%s is NULL", what);
    cr_assert_not_null(b);
    const dp_model *m = dp_gpt_model(gpt, 0);
    for (size_t t = 0; t < m->n_tensors; t++) {
        const dp_param_tensor *pt = &m->tensors[t];
        for (size_t i = pt->offset; i < pt->offset + pt->numel; i++)
            if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
                cr_assert_fail("%s of %s differs at %zu: %a vs %a", what, pt->name, i - pt->offset,
                               (double)a[i], (double)b[i]);
    }
}

/* Saves a good checkpoint of TINY (with optimizer state) to tmpdir/name. */
static void save_good(const char *name, char *path, size_t cap)
{
    path_in(path, cap, name);
    dp_gpt *gpt = tiny_gpt();
    dp_checkpoint ck = fill_ck(gpt, 42, 1);
    dp_assert_ok(dp_gpt_checkpoint_save(path, gpt, &ck));
    free_filled(&ck);
    dp_gpt_destroy(gpt);
}

/* Loading path must fail with want, a message naming the file and holding
 * `needle` (when not NULL), and leave *out and *gpt_out NULL. */
static void expect_load_fails(const char *path, dp_status want, const char *needle,
                              const char *label)
{
    dp_checkpoint *ck = (dp_checkpoint *)1;
    dp_gpt *gpt = (dp_gpt *)1;
    dp_clear_error();
    dp_status s = dp_gpt_checkpoint_load(path, &ck, &gpt);
    const char *msg = dp_last_error();
    cr_assert_eq(s, want, "%s: got %s (%s), want %s", label, dp_strerror(s), msg,
                 dp_strerror(want));
    cr_assert_null(ck, "%s: *out not NULL on failure", label);
    cr_assert_null(gpt, "%s: *gpt_out not NULL on failure", label);
    cr_assert(strstr(msg, path) != NULL, "%s: message does not name the file %s: %s", label,
              path, msg);
    if (needle)
        cr_assert(strstr(msg, needle) != NULL, "%s: message lacks \"%s\": %s", label, needle,
                  msg);
}

// --- round trips ------------------------------------------------------------------------

TestSuite(checkpoint, .init = setup, .fini = teardown, .timeout = 30);

Test(checkpoint, round_trip_is_exact)
{
    dp_gpt *gpt = tiny_gpt();
    size_t n = dp_gpt_model(gpt, 0)->n_params;
    dp_checkpoint ck = fill_ck(gpt, 1, 1);
    char path[256];
    path_in(path, sizeof path, "ck.safetensors");
    dp_assert_ok(dp_gpt_checkpoint_save(path, gpt, &ck));

    dp_checkpoint *got = NULL;
    dp_gpt *g2 = NULL;
    dp_assert_ok(dp_gpt_checkpoint_load(path, &got, &g2));
    cr_assert_not_null(got);
    cr_assert_not_null(g2);
    cr_assert_eq(memcmp(dp_gpt_config_of(g2), &TINY, sizeof TINY), 0, "gpt_out config differs");
    cr_assert_eq(dp_gpt_model(g2, 0)->n_params, n);
    cr_assert_eq(got->step, 7);
    cr_assert_eq(got->optimizer_step, 5);
    assert_bits_equal(gpt, got->params, ck.params, "params");
    assert_bits_equal(gpt, got->m, ck.m, "m");
    assert_bits_equal(gpt, got->v, ck.v, "v");
    cr_assert_str_eq(got->tokenizer, ck.tokenizer);
    cr_assert_str_eq(got->config_json, ck.config_json);
    cr_assert_eq(got->has_sampler, 1);
    cr_assert_eq(memcmp(got->sampler, ck.sampler, sizeof ck.sampler), 0, "sampler state differs");

    /* The tokenizer survives as a usable tokenizer. */
    dp_tokenizer *tok = NULL;
    dp_assert_ok(dp_tokenizer_parse(got->tokenizer, &tok));
    dp_tokenizer_destroy(tok);

    /* Saving what was loaded gives the same bytes (deterministic writer). */
    char path2[256];
    path_in(path2, sizeof path2, "ck2.safetensors");
    dp_assert_ok(dp_gpt_checkpoint_save(path2, g2, got));
    size_t la, lb;
    unsigned char *a = dp_test_read_file(path, &la), *b = dp_test_read_file(path2, &lb);
    cr_assert_eq(la, lb);
    cr_assert_eq(memcmp(a, b, la), 0, "re-saved checkpoint has different bytes");
    free(a);
    free(b);

    dp_checkpoint_close(got);
    dp_gpt_destroy(g2);
    free_filled(&ck);
    dp_gpt_destroy(gpt);
}

Test(checkpoint, without_optimizer_state_and_strings)
{
    dp_gpt *gpt = tiny_gpt();
    dp_checkpoint ck = fill_ck(gpt, 2, 0);
    free(ck.tokenizer);
    free(ck.config_json);
    ck.tokenizer = ck.config_json = NULL;
    ck.has_sampler = 0;
    ck.step = 0;
    ck.optimizer_step = 0;
    char path[256];
    path_in(path, sizeof path, "params_only.st");
    dp_assert_ok(dp_gpt_checkpoint_save(path, gpt, &ck));

    /* Only the transformer tensors are in the file. */
    dp_st_file *f = NULL;
    dp_assert_ok(dp_st_open(path, &f));
    cr_assert_eq(dp_st_count(f), dp_gpt_model(gpt, 0)->n_tensors);
    for (size_t i = 0; i < dp_st_count(f); i++)
        cr_assert_eq(strncmp(dp_st_tensor_at(f, i)->name, "transformer.", 12), 0, "%s",
                     dp_st_tensor_at(f, i)->name);
    dp_st_close(f);

    dp_checkpoint *got = NULL;
    dp_assert_ok(dp_gpt_checkpoint_load(path, &got, NULL)); /* gpt_out may be NULL */
    cr_assert_null(got->m);
    cr_assert_null(got->v);
    cr_assert_null(got->tokenizer);
    cr_assert_null(got->config_json);
    cr_assert_eq(got->has_sampler, 0);
    cr_assert_eq(got->step, 0);
    cr_assert_eq(got->optimizer_step, 0);
    cr_assert_str_eq(dp_checkpoint_meta(got, "n_layer"), "2");
    assert_bits_equal(gpt, got->params, ck.params, "params");
    dp_checkpoint_close(got);
    free_filled(&ck);
    dp_gpt_destroy(gpt);
}

Test(checkpoint, tensor_names_follow_nanogpt)
{
    char path[256];
    save_good("names.st", path, sizeof path);
    dp_st_file *f = NULL;
    dp_assert_ok(dp_st_open(path, &f));
    /* nanoGPT's layouts: wte [V,C], c_attn [3C,C] ([out,in]), c_fc [4C,C]. */
    static const size_t wte[2] = {11, 8}, attn[2] = {24, 8}, fc[2] = {32, 8}, b[1] = {8};
    const void *d;
    dp_assert_ok(dp_st_expect(f, "transformer.wte.weight", DP_DTYPE_F32, wte, 2, &d));
    dp_assert_ok(dp_st_expect(f, "transformer.h.1.attn.c_attn.weight", DP_DTYPE_F32, attn, 2, &d));
    dp_assert_ok(dp_st_expect(f, "transformer.h.0.mlp.c_fc.weight", DP_DTYPE_F32, fc, 2, &d));
    dp_assert_ok(dp_st_expect(f, "optimizer.exp_avg.transformer.ln_f.bias", DP_DTYPE_F32, b, 1, &d));
    dp_assert_ok(dp_st_expect(f, "optimizer.exp_avg_sq.transformer.ln_f.bias", DP_DTYPE_F32, b, 1,
                              &d));
    cr_assert_null(dp_st_find(f, "lm_head.weight"), "the tied LM head must not be stored");
    cr_assert_str_eq(dp_st_metadata(f, "format"), "dp-gpt-1");
    cr_assert_str_eq(dp_st_metadata(f, "n_layer"), "2");
    cr_assert_str_eq(dp_st_metadata(f, "n_head"), "2");
    cr_assert_str_eq(dp_st_metadata(f, "n_embd"), "8");
    cr_assert_str_eq(dp_st_metadata(f, "block_size"), "8");
    cr_assert_str_eq(dp_st_metadata(f, "vocab_size"), "11");
    dp_st_close(f);
}

Test(checkpoint, save_rejects_bad_arguments)
{
    dp_gpt *gpt = tiny_gpt();
    dp_checkpoint ck = fill_ck(gpt, 3, 1);
    char path[256];
    path_in(path, sizeof path, "bad.st");

    cr_assert_eq(dp_gpt_checkpoint_save(NULL, gpt, &ck), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_gpt_checkpoint_save(path, NULL, &ck), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_gpt_checkpoint_save(path, gpt, NULL), DP_ERR_INVALID_ARGUMENT);
    float *p = ck.params;
    ck.params = NULL;
    cr_assert_eq(dp_gpt_checkpoint_save(path, gpt, &ck), DP_ERR_INVALID_ARGUMENT);
    ck.params = p;

    /* A configuration that is not the model's. */
    const dp_checkpoint_kv three[1] = {{"n_layer", "3"}};
    ck.meta = three;
    ck.n_meta = 1;
    cr_assert_eq(dp_gpt_checkpoint_save(path, gpt, &ck), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "configuration") != NULL, "%s", dp_last_error());
    /* A key the checkpoint writes itself, and a key given twice. */
    const dp_checkpoint_kv own[1] = {{"step", "3"}}, twice[2] = {{"a", "1"}, {"a", "2"}};
    ck.meta = own;
    cr_assert_eq(dp_gpt_checkpoint_save(path, gpt, &ck), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "\"step\"") != NULL, "%s", dp_last_error());
    ck.meta = twice;
    ck.n_meta = 2;
    cr_assert_eq(dp_gpt_checkpoint_save(path, gpt, &ck), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "twice") != NULL, "%s", dp_last_error());
    /* Named by the caller's index (the GPT's own entries are added after). */
    const dp_checkpoint_kv third[3] = {{"a", "1"}, {"n_layer", "2"}, {"", "x"}};
    ck.meta = third;
    ck.n_meta = 3;
    cr_assert_eq(dp_gpt_checkpoint_save(path, gpt, &ck), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "ck->meta[2]") != NULL, "%s", dp_last_error());
    ck.meta = NULL;
    ck.n_meta = 0;

    /* One moment without the other would silently drop optimizer state. */
    float *v = ck.v;
    ck.v = NULL;
    cr_assert_eq(dp_gpt_checkpoint_save(path, gpt, &ck), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "ck->m and ck->v") != NULL, "%s", dp_last_error());
    ck.v = v;

    /* Negative counters would be written but never load again. */
    ck.step = -1;
    cr_assert_eq(dp_gpt_checkpoint_save(path, gpt, &ck), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "step") != NULL, "%s", dp_last_error());
    ck.step = 1;
    ck.optimizer_step = -2;
    cr_assert_eq(dp_gpt_checkpoint_save(path, gpt, &ck), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "optimizer_step") != NULL, "%s", dp_last_error());
    /* Counts past what open reads back: refused, not written unloadable. */
    ck.optimizer_step = 1;
    ck.step = LONG_MAX;
    cr_assert_eq(dp_gpt_checkpoint_save(path, gpt, &ck), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "2^62") != NULL, "%s", dp_last_error());
    ck.step = DP_MAX_STEP + 1;
    cr_assert_eq(dp_gpt_checkpoint_save(path, gpt, &ck), DP_ERR_INVALID_ARGUMENT);
    ck.step = 1;
    ck.optimizer_step = DP_MAX_STEP + 1;
    cr_assert_eq(dp_gpt_checkpoint_save(path, gpt, &ck), DP_ERR_INVALID_ARGUMENT);

    cr_assert_eq(access(path, F_OK), -1, "a rejected save created %s", path);
    cr_assert_eq(count_entries(tmpdir), 0);

    dp_checkpoint *out = NULL;
    cr_assert_eq(dp_gpt_checkpoint_load(NULL, &out, NULL), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_gpt_checkpoint_load(path, NULL, NULL), DP_ERR_INVALID_ARGUMENT);
    free_filled(&ck);
    dp_gpt_destroy(gpt);
}

// --- structure-valid but wrong checkpoints (written with dp_st_writer) ------------------

/* One change relative to what dp_checkpoint_save writes for TINY. Strings
 * are arrays, not pointers: Criterion copies parameters into the test's
 * process, where the addresses of literals need not be the same. An empty
 * string means "no change". */
typedef struct variant {
    char label[64];
    char skip[64];      /* tensor not written */
    char as_f64[64];    /* tensor written as F64 */
    char transpose[64]; /* 2-D tensor written with its shape reversed (same bytes) */
    char extra[64];     /* a stray F32 tensor of 4 elements */
    int no_m, no_v;     /* leave out every exp_avg / exp_avg_sq tensor */
    char meta_key[32];  /* metadata key to change ... */
    char meta_val[32];  /* ... to this */
    int meta_drop;      /* ... or leave the key out */
    char needle[64];    /* expected in the message */
} variant;

static int is(const char *field, const char *name) { return field[0] && !strcmp(field, name); }

static void write_variant(const char *path, const variant *vr)
{
    dp_gpt *gpt = tiny_gpt();
    const dp_model *m = dp_gpt_model(gpt, 0);
    dp_checkpoint ck = fill_ck(gpt, 4, 1);
    dp_st_writer *w = NULL;
    dp_assert_ok(dp_st_writer_create(&w));
    static const char *prefixes[3] = {"", "optimizer.exp_avg.", "optimizer.exp_avg_sq."};
    const float *bufs[3] = {ck.params, ck.m, ck.v};
    char names[3 * 64][128];
    double *f64 = NULL;
    size_t k = 0;
    for (int p = 0; p < 3; p++) {
        if ((p == 1 && vr->no_m) || (p == 2 && vr->no_v)) continue;
        for (size_t i = 0; i < m->n_tensors; i++, k++) {
            const dp_param_tensor *t = &m->tensors[i];
            cr_assert_lt(k, 3 * 64);
            snprintf(names[k], sizeof names[k], "%s%s", prefixes[p], t->name);
            if (is(vr->skip, names[k])) continue;
            const float *data = bufs[p] + t->offset;
            if (is(vr->as_f64, names[k])) {
                f64 = malloc(t->numel * sizeof *f64);
                for (size_t j = 0; j < t->numel; j++) f64[j] = data[j];
                dp_assert_ok(dp_st_writer_add(w, names[k], DP_DTYPE_F64, t->shape, t->ndim, f64));
            } else if (is(vr->transpose, names[k])) {
                cr_assert_eq(t->ndim, 2);
                size_t sh[2] = {t->shape[1], t->shape[0]};
                dp_assert_ok(dp_st_writer_add(w, names[k], DP_DTYPE_F32, sh, 2, data));
            } else {
                dp_assert_ok(dp_st_writer_add(w, names[k], DP_DTYPE_F32, t->shape, t->ndim, data));
            }
        }
    }
    static const float four[4] = {1, 2, 3, 4};
    static const size_t shape4[1] = {4};
    if (vr->extra[0]) dp_assert_ok(dp_st_writer_add(w, vr->extra, DP_DTYPE_F32, shape4, 1, four));
    const char *meta[][2] = {{"format", "dp-gpt-1"}, {"n_layer", "2"}, {"n_head", "2"},
                             {"n_embd", "8"},        {"block_size", "8"}, {"vocab_size", "11"},
                             {"step", "7"},          {"optimizer_step", "5"},
                             {"tokenizer", ck.tokenizer}, {"config", ck.config_json}};
    for (size_t i = 0; i < sizeof meta / sizeof meta[0]; i++) {
        const char *val = meta[i][1];
        if (is(vr->meta_key, meta[i][0])) {
            if (vr->meta_drop) continue;
            val = vr->meta_val;
        }
        dp_assert_ok(dp_st_writer_set_metadata(w, meta[i][0], val));
    }
    if (is(vr->meta_key, "sampler"))
        dp_assert_ok(dp_st_writer_set_metadata(w, "sampler", vr->meta_val));
    dp_assert_ok(dp_st_writer_write(w, path));
    dp_st_writer_destroy(w);
    free(f64);
    free_filled(&ck);
    dp_gpt_destroy(gpt);
}

/* The mirror writer itself produces a loadable checkpoint (else every bad
 * case below would pass for the wrong reason). */
Test(checkpoint, mirror_writer_is_loadable)
{
    char path[256];
    path_in(path, sizeof path, "mirror.st");
    variant none = {.label = "none"};
    write_variant(path, &none);
    dp_checkpoint *ck = NULL;
    dp_assert_ok(dp_gpt_checkpoint_load(path, &ck, NULL));
    cr_assert_not_null(ck->m);
    cr_assert_eq(ck->step, 7);
    dp_checkpoint_close(ck);
}

static variant bad_variants[] = {
    {.label = "F64 tensor", .as_f64 = "transformer.h.0.ln_2.weight", .needle = "F64"},
    {.label = "F64 moment", .as_f64 = "optimizer.exp_avg_sq.transformer.wpe.weight",
     .needle = "F64"},
    {.label = "transposed c_attn", .transpose = "transformer.h.1.attn.c_attn.weight",
     .needle = "transformer.h.1.attn.c_attn.weight"},
    {.label = "transposed moment", .transpose = "optimizer.exp_avg.transformer.h.0.mlp.c_fc.weight",
     .needle = "optimizer.exp_avg.transformer.h.0.mlp.c_fc.weight"},
    {.label = "metadata n_embd 16 vs tensors of 8", .meta_key = "n_embd", .meta_val = "16",
     .needle = "shape"},
    {.label = "metadata vocab_size 12", .meta_key = "vocab_size", .meta_val = "12",
     .needle = "transformer.wte.weight"},
    {.label = "metadata block_size 4", .meta_key = "block_size", .meta_val = "4",
     .needle = "transformer.wpe.weight"},
    {.label = "metadata n_layer 3", .meta_key = "n_layer", .meta_val = "3",
     .needle = "transformer.h.2."},
    {.label = "metadata n_layer 1", .meta_key = "n_layer", .meta_val = "1", .needle = "tensors"},
    {.label = "missing tensor", .skip = "transformer.h.1.mlp.c_fc.bias",
     .needle = "transformer.h.1.mlp.c_fc.bias"},
    {.label = "missing moment", .skip = "optimizer.exp_avg_sq.transformer.ln_f.weight",
     .needle = "optimizer.exp_avg_sq.transformer.ln_f.weight"},
    {.label = "stray tensor", .extra = "transformer.extra.weight", .needle = "tensors"},
    {.label = "stray tensor lm_head", .extra = "lm_head.weight", .needle = "tensors"},
    {.label = "exp_avg without exp_avg_sq", .no_v = 1, .needle = "exp_avg_sq"},
    {.label = "exp_avg_sq without exp_avg", .no_m = 1, .needle = "tensors"},
    {.label = "missing n_head", .meta_key = "n_head", .meta_drop = 1, .needle = "n_head"},
    {.label = "missing step", .meta_key = "step", .meta_drop = 1, .needle = "\"step\""},
    {.label = "missing format", .meta_key = "format", .meta_drop = 1, .needle = "format"},
    {.label = "wrong format", .meta_key = "format", .meta_val = "dp-gpt-0", .needle = "format"},
    {.label = "n_layer x", .meta_key = "n_layer", .meta_val = "x", .needle = "n_layer"},
    {.label = "n_layer 2x", .meta_key = "n_layer", .meta_val = "2x", .needle = "n_layer"},
    {.label = "n_layer empty", .meta_key = "n_layer", .meta_val = "", .needle = "n_layer"},
    {.label = "n_layer 0", .meta_key = "n_layer", .meta_val = "0", .needle = "n_layer"},
    {.label = "n_embd -8", .meta_key = "n_embd", .meta_val = "-8", .needle = "n_embd"},
    {.label = "vocab_size 1e3", .meta_key = "vocab_size", .meta_val = "1e3",
     .needle = "vocab_size"},
    {.label = "step -1", .meta_key = "step", .meta_val = "-1", .needle = "step"},
    {.label = "optimizer_step overflow", .meta_key = "optimizer_step",
     .meta_val = "99999999999999999999999", .needle = "optimizer_step"},
    {.label = "n_head 3 does not divide n_embd 8", .meta_key = "n_head", .meta_val = "3",
     .needle = "n_head"},
    /* Sizes that would make the loader allocate far more than the file holds
     * must be refused from the tensors, quickly, not by running out of memory. */
    {.label = "huge n_layer", .meta_key = "n_layer", .meta_val = "1000000000", .needle = "n_layer"},
    {.label = "huge vocab_size", .meta_key = "vocab_size", .meta_val = "2147483647",
     .needle = "transformer.wte.weight"},
    {.label = "huge n_embd", .meta_key = "n_embd", .meta_val = "100000000", .needle = "shape"},
    {.label = "n_embd past the GEMMs' int", .meta_key = "n_embd", .meta_val = "536870912",
     .needle = "n_embd"},
    {.label = "bad sampler", .meta_key = "sampler", .meta_val = "00,11", .needle = "sampler"},
};

ParameterizedTestParameters(checkpoint, rejects_wrong_content)
{
    return cr_make_param_array(variant, bad_variants, sizeof bad_variants / sizeof bad_variants[0]);
}

ParameterizedTest(variant *vr, checkpoint, rejects_wrong_content)
{
    char path[256];
    path_in(path, sizeof path, "wrong.st");
    write_variant(path, vr);
    expect_load_fails(path, DP_ERR_FORMAT, vr->needle[0] ? vr->needle : NULL, vr->label);
    /* dp_checkpoint_load without gpt_out fails the same way. */
    dp_checkpoint *ck = NULL;
    cr_assert_eq(dp_gpt_checkpoint_load(path, &ck, NULL), DP_ERR_FORMAT, "%s", vr->label);
    cr_assert_null(ck);
}

// --- structural damage (bytes of a good file edited) ------------------------------------

/* The header JSON of a file dp wrote (without padding) and its data section. */
typedef struct parts {
    unsigned char *bytes;
    size_t len, hlen;
} parts;

static parts split_file(const char *path)
{
    parts p;
    p.bytes = dp_test_read_file(path, &p.len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | p.bytes[i];
    cr_assert_leq(n, p.len - 8);
    p.hlen = (size_t)n;
    return p;
}

/* Writes dst from src's parts with the first occurrence of `from` in the
 * header replaced by `to` (the length field updated), then `tail` extra
 * zero bytes after the data. */
static void rewrite_header(const parts *p, const char *dst, const char *from, const char *to,
                           size_t tail)
{
    char *h = malloc(p->hlen + 1);
    memcpy(h, p->bytes + 8, p->hlen);
    h[p->hlen] = 0;
    char *at = strstr(h, from);
    cr_assert_not_null(at, "\"%s\" not in the header", from);
    size_t nh = p->hlen - strlen(from) + strlen(to);
    size_t data = p->len - 8 - p->hlen;
    unsigned char *out = calloc(8 + nh + data + tail, 1);
    for (int i = 0; i < 8; i++) out[i] = (unsigned char)((uint64_t)nh >> (8 * i));
    size_t pre = (size_t)(at - h);
    memcpy(out + 8, h, pre);
    memcpy(out + 8 + pre, to, strlen(to));
    memcpy(out + 8 + pre + strlen(to), at + strlen(from), p->hlen - pre - strlen(from));
    memcpy(out + 8 + nh, p->bytes + 8 + p->hlen, data);
    dp_test_write_file(dst, out, 8 + nh + data + tail);
    free(out);
    free(h);
}

Test(checkpoint, rejects_truncated_files)
{
    char good[256], bad[256];
    save_good("good.st", good, sizeof good);
    path_in(bad, sizeof bad, "cut.st");
    parts p = split_file(good);
    /* Empty, inside the length field, just the length field, inside the
     * header, header without data, inside the data, one byte short. */
    size_t cuts[] = {0, 3, 8, 9, 8 + p.hlen / 2, 8 + p.hlen - 1, 8 + p.hlen,
                     8 + p.hlen + 4, (8 + p.hlen + p.len) / 2, p.len - 4, p.len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        char label[64];
        snprintf(label, sizeof label, "cut at %zu of %zu bytes", cuts[i], p.len);
        dp_test_write_file(bad, p.bytes, cuts[i]);
        expect_load_fails(bad, DP_ERR_FORMAT, NULL, label);
    }
    /* One byte too many is as wrong as one too few. */
    unsigned char *longer = malloc(p.len + 1);
    memcpy(longer, p.bytes, p.len);
    longer[p.len] = 0;
    dp_test_write_file(bad, longer, p.len + 1);
    expect_load_fails(bad, DP_ERR_FORMAT, "trailing", "one extra byte");
    free(longer);
    free(p.bytes);
}

Test(checkpoint, rejects_bad_header_length)
{
    char good[256], bad[256];
    save_good("good.st", good, sizeof good);
    path_in(bad, sizeof bad, "hdr.st");
    parts p = split_file(good);
    uint64_t lens[] = {p.len - 7, p.len, (uint64_t)1 << 40, UINT64_MAX, 0};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        for (int b = 0; b < 8; b++) p.bytes[b] = (unsigned char)(lens[i] >> (8 * b));
        dp_test_write_file(bad, p.bytes, p.len);
        char label[64];
        snprintf(label, sizeof label, "header length %llu", (unsigned long long)lens[i]);
        expect_load_fails(bad, DP_ERR_FORMAT, "header length", label);
    }
    free(p.bytes);
}

Test(checkpoint, rejects_bad_json)
{
    char good[256], bad[256];
    save_good("good.st", good, sizeof good);
    path_in(bad, sizeof bad, "json.st");
    parts p = split_file(good);
    /* A missing colon, an unterminated string, a header that is an array,
     * a duplicated key, metadata that is not a string. */
    rewrite_header(&p, bad, "\"__metadata__\":", "\"__metadata__\" ", 0);
    expect_load_fails(bad, DP_ERR_FORMAT, "JSON", "missing colon");
    rewrite_header(&p, bad, "\"format\":\"dp-gpt-1\"", "\"format\":\"dp-gpt-1", 0);
    expect_load_fails(bad, DP_ERR_FORMAT, "JSON", "unterminated string");
    rewrite_header(&p, bad, "\"n_layer\":\"2\"", "\"n_layer\":\"2\",\"n_layer\":\"2\"", 0);
    expect_load_fails(bad, DP_ERR_FORMAT, NULL, "duplicate key");
    rewrite_header(&p, bad, "\"n_layer\":\"2\"", "\"n_layer\":2", 0);
    expect_load_fails(bad, DP_ERR_FORMAT, "n_layer", "number metadata");
    /* The whole header replaced by an array of the same length. */
    unsigned char *b = malloc(p.len);
    memcpy(b, p.bytes, p.len);
    memset(b + 8, ' ', p.hlen);
    b[8] = '[';
    b[9] = ']';
    dp_test_write_file(bad, b, p.len);
    expect_load_fails(bad, DP_ERR_FORMAT, "object", "array header");
    /* Garbage bytes in the header. */
    memcpy(b, p.bytes, p.len);
    memcpy(b + 8 + 20, "\x01\xff\x00garbage", 10);
    dp_test_write_file(bad, b, p.len);
    expect_load_fails(bad, DP_ERR_FORMAT, NULL, "garbage in header");
    free(b);
    free(p.bytes);
}

Test(checkpoint, rejects_overlapping_and_gapped_offsets)
{
    char good[256], bad[256];
    save_good("good.st", good, sizeof good);
    path_in(bad, sizeof bad, "offsets.st");
    dp_st_file *f = NULL;
    dp_assert_ok(dp_st_open(good, &f));
    const dp_st_tensor *wpe = dp_st_find(f, "transformer.wpe.weight");
    const dp_st_tensor *last = dp_st_tensor_at(f, dp_st_count(f) - 1);
    cr_assert(wpe && last && wpe->offset >= 4);
    char from[64], to[64], from_last[64], to_last[64];
    snprintf(from, sizeof from, "\"data_offsets\":[%zu,%zu]", wpe->offset,
             wpe->offset + wpe->nbytes);
    snprintf(to, sizeof to, "\"data_offsets\":[%zu,%zu]", wpe->offset - 4,
             wpe->offset + wpe->nbytes - 4);
    snprintf(from_last, sizeof from_last, "\"data_offsets\":[%zu,%zu]", last->offset,
             last->offset + last->nbytes);
    size_t lo = last->offset, hi = last->offset + last->nbytes;
    dp_st_close(f);
    parts p = split_file(good);

    /* wpe moved 4 bytes back: it overlaps wte, same size. */
    rewrite_header(&p, bad, from, to, 0);
    expect_load_fails(bad, DP_ERR_FORMAT, "overlap", "overlap");

    /* The last tensor moved 4 bytes on, the file 4 bytes longer: a gap. */
    snprintf(to_last, sizeof to_last, "\"data_offsets\":[%zu,%zu]", lo + 4, hi + 4);
    rewrite_header(&p, bad, from_last, to_last, 4);
    expect_load_fails(bad, DP_ERR_FORMAT, "gap", "gap");

    /* The last tensor claims bytes past the end of the file. */
    rewrite_header(&p, bad, from_last, to_last, 0);
    expect_load_fails(bad, DP_ERR_FORMAT, NULL, "past the end");

    /* begin > end. */
    snprintf(to_last, sizeof to_last, "\"data_offsets\":[%zu,%zu]", hi, lo);
    rewrite_header(&p, bad, from_last, to_last, 0);
    expect_load_fails(bad, DP_ERR_FORMAT, NULL, "begin > end");
    free(p.bytes);
}

Test(checkpoint, rejects_dtype_edited_in_place)
{
    /* "F32" -> "I32" in the header: same byte size, so only the dtype
     * check can notice. */
    char good[256], bad[256];
    save_good("good.st", good, sizeof good);
    path_in(bad, sizeof bad, "i32.st");
    parts p = split_file(good);
    rewrite_header(&p, bad, "\"dtype\":\"F32\"", "\"dtype\":\"I32\"", 0);
    expect_load_fails(bad, DP_ERR_FORMAT, "I32", "I32 tensor");
    free(p.bytes);
}

Test(checkpoint, missing_file_and_not_a_file)
{
    char path[256];
    path_in(path, sizeof path, "nope.st");
    expect_load_fails(path, DP_ERR_IO, NULL, "missing file");
    expect_load_fails(tmpdir, DP_ERR_IO, NULL, "a directory");
    path_in(path, sizeof path, "text.st");
    dp_test_write_file(path, "this is not a checkpoint at all\n", 32);
    expect_load_fails(path, DP_ERR_FORMAT, NULL, "a text file");
}

// --- atomic writes --------------------------------------------------------------------

Test(checkpoint, save_into_missing_directory_leaves_nothing)
{
    dp_gpt *gpt = tiny_gpt();
    dp_checkpoint ck = fill_ck(gpt, 5, 1);
    char dir[256], path[300];
    path_in(dir, sizeof dir, "no_such_dir");
    snprintf(path, sizeof path, "%s/ck.st", dir);
    dp_status s = dp_gpt_checkpoint_save(path, gpt, &ck);
    cr_assert_eq(s, DP_ERR_IO, "got %s: %s", dp_strerror(s), dp_last_error());
    cr_assert(strstr(dp_last_error(), path) != NULL, "message lacks the path: %s", dp_last_error());
    cr_assert_eq(access(path, F_OK), -1);
    cr_assert_eq(access(dir, F_OK), -1, "save created the directory");
    cr_assert_eq(count_entries(tmpdir), 0, "something was left in %s", tmpdir);
    free_filled(&ck);
    dp_gpt_destroy(gpt);
}

Test(checkpoint, overwrite_leaves_the_new_checkpoint)
{
    dp_gpt *gpt = tiny_gpt();
    dp_checkpoint a = fill_ck(gpt, 6, 1), b = fill_ck(gpt, 7, 0);
    b.step = 100;
    char path[256];
    path_in(path, sizeof path, "ck.st");
    dp_assert_ok(dp_gpt_checkpoint_save(path, gpt, &a));
    dp_assert_ok(dp_gpt_checkpoint_save(path, gpt, &b)); /* smaller: no optimizer state */
    dp_checkpoint *got = NULL;
    dp_assert_ok(dp_gpt_checkpoint_load(path, &got, NULL));
    cr_assert_eq(got->step, 100);
    cr_assert_null(got->m);
    assert_bits_equal(gpt, got->params, b.params, "params");
    dp_checkpoint_close(got);
    dp_assert_ok(dp_gpt_checkpoint_save(path, gpt, &a)); /* and back to the larger one */
    dp_assert_ok(dp_gpt_checkpoint_load(path, &got, NULL));
    assert_bits_equal(gpt, got->v, a.v, "v");
    dp_checkpoint_close(got);
    cr_assert_eq(count_entries(tmpdir), 1, "temporary files left beside the checkpoint");
    free_filled(&a);
    free_filled(&b);
    dp_gpt_destroy(gpt);
}

Test(checkpoint, failed_overwrite_keeps_the_old_checkpoint)
{
    dp_gpt *gpt = tiny_gpt();
    dp_checkpoint a = fill_ck(gpt, 8, 0), b = fill_ck(gpt, 9, 1);
    char path[256];
    path_in(path, sizeof path, "ck.st");
    dp_assert_ok(dp_gpt_checkpoint_save(path, gpt, &a));
    size_t old_len;
    free(dp_test_read_file(path, &old_len));
    /* Files may not grow past the old size: writing b (3x the tensors)
     * fails part way with EFBIG (SIGXFSZ ignored so write returns it). */
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {(rlim_t)old_len, (rlim_t)old_len};
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
    dp_status s = dp_gpt_checkpoint_save(path, gpt, &b);
    cr_assert_eq(s, DP_ERR_IO, "got %s: %s", dp_strerror(s), dp_last_error());
    dp_checkpoint *got = NULL;
    dp_assert_ok(dp_gpt_checkpoint_load(path, &got, NULL));
    cr_assert_null(got->m, "the old checkpoint (no optimizer state) was replaced");
    assert_bits_equal(gpt, got->params, a.params, "params");
    dp_checkpoint_close(got);
    cr_assert_eq(count_entries(tmpdir), 1, "the failed save left a temporary file");
    free_filled(&a);
    free_filled(&b);
    dp_gpt_destroy(gpt);
}

/* A process killed while saving leaves "<path>.tmp.<pid>.<n>.<host>" the
 * size of the checkpoint: the next save of that path removes it when the
 * process is gone, and leaves alone a live process's file, another host's
 * (a shared filesystem: its pid names nothing here), our own naming for
 * another path, and names that only look alike. */
Test(checkpoint, save_removes_stale_temporary_files)
{
    pid_t dead = dp_test_dead_pid();
    cr_assert_gt(dead, 0);
    char path[256], stale[320], live[320], other[320], alike[320], far[320], old[320];
    path_in(path, sizeof path, "ck.st");
    /* This host's tag, as the writer names it. */
    dp_atomic_file *probe = NULL;
    dp_assert_ok(dp_atomic_file_open(path, &probe));
    char host[16];
    snprintf(host, sizeof host, "%s", strrchr(dp_atomic_file_temp_path(probe), '.') + 1);
    dp_atomic_file_abort(probe);
    cr_assert_eq(strlen(host), 8);
    const char *elsewhere = strcmp(host, "0badc0de") ? "0badc0de" : "0badc0df";
    snprintf(stale, sizeof stale, "%s.tmp.%ld.3.%s", path, (long)dead, host);
    snprintf(live, sizeof live, "%s.tmp.%ld.0.%s", path, (long)getppid(), host);
    snprintf(alike, sizeof alike, "%s.tmp.%ld.x.%s", path, (long)dead, host);
    snprintf(far, sizeof far, "%s.tmp.%ld.2.%s", path, (long)dead, elsewhere);
    snprintf(old, sizeof old, "%s.tmp.%ld.4", path, (long)dead); /* no host: not ours */
    path_in(other, sizeof other, "other.st");
    snprintf(other + strlen(other), sizeof other - strlen(other), ".tmp.%ld.1.%s", (long)dead,
             host);
    const char *names[6] = {stale, live, alike, far, old, other};
    for (int i = 0; i < 6; i++) dp_test_write_file(names[i], "partial", 7);

    dp_gpt *gpt = tiny_gpt();
    dp_checkpoint ck = fill_ck(gpt, 10, 1);
    dp_assert_ok(dp_gpt_checkpoint_save(path, gpt, &ck));
    cr_assert_eq(access(stale, F_OK), -1, "the stale temporary file %s was left", stale);
    cr_assert_eq(access(live, F_OK), 0, "a live process's temporary file was removed");
    cr_assert_eq(access(alike, F_OK), 0, "a file that is not ours was removed");
    cr_assert_eq(access(far, F_OK), 0, "another host's temporary file was removed");
    cr_assert_eq(access(old, F_OK), 0, "a name without a host was removed");
    cr_assert_eq(access(other, F_OK), 0, "another checkpoint's temporary file was removed");
    cr_assert_eq(count_entries(tmpdir), 6);
    free_filled(&ck);
    dp_gpt_destroy(gpt);
}
