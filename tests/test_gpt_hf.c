/*
 * GPT-2 weights from and to Hugging Face's layout (dp/gpt_hf.h), on the
 * PyTorch float64 reference GPT (tests/data/gpt_reference.bin): its
 * parameters written here in Hugging Face's layout (both name forms; F32,
 * F16 and BF16) give the reference's loss; an export is what
 * transformers' save_pretrained writes (tests/data/hf_gpt2_keys.txt, made
 * by tests/gen_hf_gpt2_keys.py) and reads back bitwise; a dp checkpoint
 * gives its weights; bad files and contradicting configurations are
 * refused naming the problem.
 */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dp_test.h"
#include "dp_test_fs.h"
#include "gpt_reference.h"

static char tmpdir[256];

static void make_tmpdir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dp_test_gpt_hf.XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
}

static void cleanup(void) { dp_test_remove_tree(tmpdir); }

TestSuite(gpt_hf, .init = make_tmpdir, .fini = cleanup, .timeout = 60);

/* tmpdir/name (a few of them alive at once). */
static const char *in_tmp(const char *name) { return dp_test_join(tmpdir, name); }

// --- writing Hugging Face files from the reference ---------------------------------------

/* How to spoil a file (0: a good one). */
typedef struct spoil {
    const char *drop;     /* leave this (dp) tensor out */
    const char *unflip;   /* write this Conv1D weight in dp's [out, in] */
    const char *extra;    /* add a tensor of this (full) name */
    int buffers;          /* add the attention's mask buffers */
    int lm_head;          /* 1: an lm_head equal to wte, 2: one that differs */
    dp_dtype int_dtype;   /* 0, or I32 for every 1-D tensor */
} spoil;

static uint16_t to_f16(float x) /* exact for the reference's values (float16 numbers) */
{
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    int exp = (int)((u >> 23) & 0xff) - 127 + 15;
    uint32_t man = u & 0x7fffffu;
    if (x == 0.0f) return (uint16_t)sign;
    if (exp <= 0) /* subnormal half: man bits shifted, exact by construction */
        return (uint16_t)(sign | ((man | 0x800000u) >> (14 - exp)));
    return (uint16_t)(sign | (uint32_t)exp << 10 | man >> 13);
}

/* Writes the reference's parameters (dp layout in p, model m) as a
 * Hugging Face model.safetensors at path. */
static void write_hf(const char *path, const dp_model *m, const float *p, dp_dtype dtype,
                     const char *prefix, const spoil *sp)
{
    dp_st_writer *w = NULL;
    dp_assert_ok(dp_st_writer_create(&w));
    dp_assert_ok(dp_st_writer_set_metadata(w, "format", "pt"));
    void **keep = calloc(m->n_tensors + 8, sizeof *keep);
    size_t nk = 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        const dp_param_tensor *t = &m->tensors[i];
        if (sp && sp->drop && strcmp(sp->drop, t->name) == 0) continue;
        char name[256];
        snprintf(name, sizeof name, "%s%s", prefix, t->name + strlen("transformer."));
        size_t n = t->numel, shape[2] = {t->shape[0], t->ndim == 2 ? t->shape[1] : 0};
        const float *src = p + t->offset;
        float *x = malloc(n * sizeof *x);
        const char *nm = t->name;
        int conv = strstr(nm, "c_attn.weight") || strstr(nm, "c_proj.weight") ||
                   strstr(nm, "c_fc.weight");
        if (conv && !(sp && sp->unflip && strcmp(sp->unflip, nm) == 0)) {
            size_t out = t->shape[0], in = t->shape[1];
            for (size_t o = 0; o < out; o++)
                for (size_t k = 0; k < in; k++) x[k * out + o] = src[o * in + k];
            shape[0] = in, shape[1] = out;
        } else {
            memcpy(x, src, n * sizeof *x);
        }
        dp_dtype dt = dtype;
        if (sp && sp->int_dtype && t->ndim == 1) dt = sp->int_dtype;
        void *data = x;
        if (dt == DP_DTYPE_F16 || dt == DP_DTYPE_BF16) {
            uint16_t *h = malloc(n * sizeof *h);
            for (size_t k = 0; k < n; k++)
                h[k] = dt == DP_DTYPE_F16 ? to_f16(x[k]) : dp_bf16_from_float(x[k]);
            free(x);
            data = h;
        } else if (dt == DP_DTYPE_I32) {
            for (size_t k = 0; k < n; k++) ((int32_t *)x)[k] = (int32_t)k;
        }
        keep[nk++] = data;
        dp_assert_ok(dp_st_writer_add(w, name, dt, shape, t->ndim, data));
    }
    static float one[4096];
    if (sp && sp->extra) {
        size_t shape[1] = {4};
        dp_assert_ok(dp_st_writer_add(w, sp->extra, DP_DTYPE_F32, shape, 1, one));
    }
    if (sp && sp->buffers) {
        for (int l = 0; l < 2; l++) {
            char name[128];
            size_t shape[4] = {1, 1, 16, 16};
            snprintf(name, sizeof name, "%sh.%d.attn.bias", prefix, l);
            dp_assert_ok(dp_st_writer_add(w, name, DP_DTYPE_F32, shape, 4, one));
            snprintf(name, sizeof name, "%sh.%d.attn.masked_bias", prefix, l);
            dp_assert_ok(dp_st_writer_add(w, name, DP_DTYPE_F32, shape, 0, one));
        }
    }
    if (sp && sp->lm_head) {
        long j = -1;
        for (size_t i = 0; i < m->n_tensors; i++)
            if (strcmp(m->tensors[i].name, "transformer.wte.weight") == 0) j = (long)i;
        const dp_param_tensor *t = &m->tensors[j];
        float *x = malloc(t->numel * sizeof *x);
        memcpy(x, p + t->offset, t->numel * sizeof *x);
        if (sp->lm_head == 2) x[7] += 1.0f;
        keep[nk++] = x;
        size_t shape[2] = {t->shape[0], t->shape[1]};
        dp_assert_ok(dp_st_writer_add(w, "lm_head.weight", DP_DTYPE_F32, shape, 2, x));
    }
    dp_assert_ok(dp_st_writer_write(w, path));
    dp_st_writer_destroy(w);
    for (size_t i = 0; i < nk; i++) free(keep[i]);
    free(keep);
}

/* A config.json with the reference's sizes, and with override_key's value
 * replaced by override_value (JSON text) when it is not NULL. */
static void write_config(const char *path, const reference *r, const char *override_key,
                         const char *override_value)
{
    struct kv {
        const char *k;
        char v[64];
    } kv[] = {{"model_type", "\"gpt2\""},     {"activation_function", "\"gelu_new\""},
              {"layer_norm_epsilon", "1e-05"}, {"n_head", ""},
              {"n_embd", ""},                  {"n_layer", ""},
              {"n_positions", ""},             {"vocab_size", ""},
              {"n_inner", "null"},             {"tie_word_embeddings", "true"}};
    snprintf(kv[3].v, 64, "%u", r->NH);
    snprintf(kv[4].v, 64, "%u", r->C);
    snprintf(kv[5].v, 64, "%u", r->L);
    snprintf(kv[6].v, 64, "%u", r->BS);
    snprintf(kv[7].v, 64, "%u", r->V);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "{\"architectures\": [\"GPT2LMHeadModel\"]");
    for (size_t i = 0; i < sizeof kv / sizeof *kv; i++) {
        const char *v = override_key && strcmp(override_key, kv[i].k) == 0 ? override_value : kv[i].v;
        fprintf(f, ", \"%s\": %s", kv[i].k, v);
    }
    fprintf(f, "}\n");
    cr_assert_eq(fclose(f), 0);
}

// --- the reference -----------------------------------------------------------------------

typedef struct fixture {
    reference r;
    dp_gpt *g;         /* the reference's shape */
    float *p;          /* its parameters, dp's layout */
} fixture;

static void fixture_open(fixture *x)
{
    dp_test_load_reference(&x->r);
    reference *r = &x->r;
    dp_gpt_config cfg = {.vocab_size = r->V, .block_size = r->BS, .n_layer = r->L,
                         .n_head = r->NH, .n_embd = r->C};
    dp_assert_ok(dp_gpt_create(&cfg, &x->g));
    const dp_model *m = dp_gpt_model(x->g, 0);
    x->p = calloc(m->n_params, sizeof *x->p);
    for (size_t i = 0; i < r->n_tensors; i++) {
        long j = dp_gpt_find_tensor(x->g, r->t[i].name);
        cr_assert_geq(j, 0);
        memcpy(x->p + m->tensors[j].offset, r->t[i].param, r->t[i].numel * sizeof(float));
    }
}

static void fixture_close(fixture *x)
{
    free(x->p);
    dp_gpt_destroy(x->g);
    dp_test_free_reference(&x->r);
}

/* A Hugging Face directory of the reference: name/model.safetensors and
 * name/config.json. */
static const char *hf_dir(const fixture *x, const char *name, dp_dtype dtype, const char *prefix,
                          const spoil *sp)
{
    const char *dir = in_tmp(name);
    mkdir(dir, 0777);
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_hf(path, dp_gpt_model(x->g, 0), x->p, dtype, prefix, sp);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_config(path, &x->r, NULL, NULL);
    return dir;
}

/* The mean cross-entropy of gpt with params on the reference's batch (cpu:0). */
static double loss_of(const dp_gpt *g, const float *params, const reference *r)
{
    const dp_model *m = dp_gpt_model(g, 0);
    size_t BT = (size_t)r->B * r->BS, n_valid = 0;
    for (size_t i = 0; i < BT; i++) n_valid += r->targets[i] >= 0;
    dp_device *dev = dp_test_cpu(0);
    float *dp_ = dp_test_upload(dev, params, m->n_params);
    void *ws = NULL, *logits = NULL, *losses = NULL, *tok = NULL, *tgt = NULL;
    dp_assert_ok(dp_device_alloc(dev, dp_gpt_workspace_bytes(g, r->B, r->BS), &ws));
    dp_assert_ok(dp_device_alloc(dev, BT * r->V * sizeof(float), &logits));
    dp_assert_ok(dp_device_alloc(dev, BT * sizeof(float), &losses));
    dp_assert_ok(dp_device_alloc(dev, BT * sizeof(int32_t), &tok));
    dp_assert_ok(dp_device_alloc(dev, BT * sizeof(int32_t), &tgt));
    dp_assert_ok(dp_copy_h2d(dev, tok, r->tokens, BT * sizeof(int32_t)));
    dp_assert_ok(dp_copy_h2d(dev, tgt, r->targets, BT * sizeof(int32_t)));
    dp_assert_ok(dp_gpt_forward(g, dev, dp_, tok, r->B, r->BS, ws, logits));
    double sum = 0.0;
    dp_assert_ok(dp_crossentropy_forward_backward(dev, &sum, NULL, losses, logits, tgt, BT, r->V,
                                                  1.0f));
    void *bufs[] = {dp_, ws, logits, losses, tok, tgt};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) dp_device_free(dev, bufs[i]);
    dp_device_close(dev);
    return sum / (double)n_valid;
}

// --- reading -----------------------------------------------------------------------------

/* Both name forms, F32, F16 (exact: the reference's values are float16
 * numbers) and BF16 (each value the bfloat16 rounding, computed here in
 * double): the reference's parameters, the reference's shape, and (F32,
 * F16) PyTorch's loss within test_gpt's tolerance (rtol 1e-6). */
Test(gpt_hf, both_name_forms_and_three_dtypes_give_the_reference)
{
    fixture x;
    fixture_open(&x);
    const char *prefixes[] = {"transformer.", ""};
    dp_dtype dtypes[] = {DP_DTYPE_F32, DP_DTYPE_F16, DP_DTYPE_BF16};
    size_t n = dp_gpt_model(x.g, 0)->n_params;
    for (int pf = 0; pf < 2; pf++)
        for (int d = 0; d < 3; d++) {
            char name[64];
            snprintf(name, sizeof name, "hf_%d_%d", pf, d);
            const char *dir = hf_dir(&x, name, dtypes[d], prefixes[pf], NULL);
            dp_gpt *g = NULL;
            float *p = NULL;
            dp_assert_ok(dp_gpt_init_from(dir, 0, &g, &p));
            const dp_gpt_config *c = dp_gpt_config_of(g);
            cr_assert(c->vocab_size == x.r.V && c->block_size == x.r.BS &&
                          c->n_layer == x.r.L && c->n_head == x.r.NH && c->n_embd == x.r.C,
                      "%s: shape %zu %zu %zu %zu %zu", name, c->vocab_size, c->block_size,
                      c->n_layer, c->n_head, c->n_embd);
            cr_assert_eq(dp_gpt_model(g, 0)->n_params, n);
            for (size_t i = 0; i < n; i++) {
                double want = dtypes[d] == DP_DTYPE_BF16 ? dp_test_bf16_value(x.p[i]) : x.p[i];
                if ((double)p[i] != want)
                    cr_assert_fail("%s: parameter %zu is %.9g, want %.9g", name, i, (double)p[i],
                                   want);
            }
            if (dtypes[d] != DP_DTYPE_BF16) {
                double loss = loss_of(g, p, &x.r);
                cr_assert(fabs(loss - x.r.loss) <= 1e-6 * fabs(x.r.loss),
                          "%s: loss %.10f, PyTorch %.10f", name, loss, x.r.loss);
            }
            free(p);
            dp_gpt_destroy(g);
        }
    fixture_close(&x);
}

/* Expects init_from(path, n_head) to fail with want and a message holding
 * each of the (up to two) strings. */
static void assert_refused(const char *path, size_t n_head, dp_status want, const char *a,
                           const char *b)
{
    dp_gpt *g = (dp_gpt *)1;
    float *p = (float *)1;
    dp_status s = dp_gpt_init_from(path, n_head, &g, &p);
    cr_assert_eq(s, want, "%s: status %s, want %s: %s", path, dp_strerror(s), dp_strerror(want),
                 dp_last_error());
    cr_assert(g == NULL && p == NULL, "%s: outputs set on failure", path);
    cr_assert(strstr(dp_last_error(), a) && (!b || strstr(dp_last_error(), b)),
              "%s: want \"%s\"%s%s in: %s", path, a, b ? " and " : "", b ? b : "", dp_last_error());
}

/* A bare file: the heads come from n_head (or a config.json beside it); a
 * config.json and n_head that disagree are both named. */
Test(gpt_hf, heads_come_from_config_or_the_caller_and_must_agree)
{
    fixture x;
    fixture_open(&x);
    const char *bare = in_tmp("bare.safetensors");
    write_hf(bare, dp_gpt_model(x.g, 0), x.p, DP_DTYPE_F32, "", NULL);
    assert_refused(bare, 0, DP_ERR_INVALID_ARGUMENT, "bare file", "give n_head");
    dp_gpt *g = NULL;
    float *p = NULL;
    dp_assert_ok(dp_gpt_init_from(bare, x.r.NH, &g, &p));
    cr_assert_eq(dp_gpt_config_of(g)->n_head, x.r.NH);
    free(p);
    dp_gpt_destroy(g);
    assert_refused(bare, 3, DP_ERR_INVALID_ARGUMENT, "n_head", "does not divide");
    const char *dir = hf_dir(&x, "cfg", DP_DTYPE_F32, "transformer.", NULL);
    char want[64];
    snprintf(want, sizeof want, "says %u heads", x.r.NH);
    assert_refused(dir, 2 * x.r.NH, DP_ERR_INVALID_ARGUMENT, "n_head 8 contradicts", want);
    fixture_close(&x);
}

/* config.json sizes that contradict the tensors, and other architectures. */
Test(gpt_hf, a_config_contradicting_the_tensors_or_another_model_is_refused)
{
    fixture x;
    fixture_open(&x);
    const char *dir = hf_dir(&x, "c", DP_DTYPE_F32, "transformer.", NULL);
    char cfg[600];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    struct {
        const char *key, *value, *msg;
        dp_status want;
    } cases[] = {
        {"n_embd", "64", "n_embd is 64, but the tensors have 32 (wte.weight)", DP_ERR_FORMAT},
        {"n_layer", "3", "n_layer is 3, but the tensors have 2 (the h.{i} blocks)", DP_ERR_FORMAT},
        {"n_positions", "1024", "n_positions is 1024, but the tensors have 16 (wpe.weight)", DP_ERR_FORMAT},
        {"vocab_size", "50257", "vocab_size is 50257, but the tensors have 65 (wte.weight)", DP_ERR_FORMAT},
        {"n_inner", "96", "n_inner 96", DP_ERR_UNSUPPORTED},
        {"activation_function", "\"gelu\"", "activation_function \"gelu\"", DP_ERR_UNSUPPORTED},
        {"model_type", "\"llama\"", "model_type \"llama\"", DP_ERR_UNSUPPORTED},
        {"layer_norm_epsilon", "1e-6", "layer_norm_epsilon 1e-06", DP_ERR_UNSUPPORTED},
        /* -1 was the "absent" mark, so it passed */
        {"layer_norm_epsilon", "-1.0", "layer_norm_epsilon -1", DP_ERR_UNSUPPORTED},
        {"tie_word_embeddings", "false", "tie_word_embeddings is false", DP_ERR_UNSUPPORTED},
        {"n_head", "\"four\"", "n_head is not a non-negative integer", DP_ERR_FORMAT},
        {"n_head", "0", "no positive integer n_head", DP_ERR_FORMAT},
        /* another type is refused, not taken for absent (which skips the check) */
        {"n_embd", "\"32\"", "n_embd is not a non-negative integer", DP_ERR_FORMAT},
        {"n_layer", "2.0", "n_layer is not a non-negative integer", DP_ERR_FORMAT},
        {"vocab_size", "-65", "vocab_size is not a non-negative integer", DP_ERR_FORMAT},
        {"layer_norm_epsilon", "\"1e-5\"", "layer_norm_epsilon is not a number", DP_ERR_FORMAT},
        {"tie_word_embeddings", "\"false\"", "tie_word_embeddings is not true or false",
         DP_ERR_FORMAT},
        {"model_type", "7", "model_type is not a string", DP_ERR_FORMAT},
        /* the file's, not the caller's: a malformed file */
        {"n_head", "3", "does not divide", DP_ERR_FORMAT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        write_config(cfg, &x.r, cases[i].key, cases[i].value);
        assert_refused(dir, 0, cases[i].want, cases[i].msg, "config.json");
    }
    FILE *f = fopen(cfg, "w");
    fputs("{\"n_head\": 4,", f);
    fclose(f);
    assert_refused(dir, 0, DP_ERR_FORMAT, "config.json", "line");
    fixture_close(&x);
}

/* Missing, extra, misshaped and other-dtype tensors are named; the mask
 * buffers and a tied lm_head are GPT-2's own; an untied head is refused;
 * so is a cut file. */
Test(gpt_hf, bad_tensors_are_named_and_gpt2s_extras_accepted)
{
    fixture x;
    fixture_open(&x);
    spoil drop = {.drop = "transformer.h.1.mlp.c_fc.bias"};
    assert_refused(hf_dir(&x, "drop", DP_DTYPE_F32, "transformer.", &drop), 0, DP_ERR_FORMAT,
                   "no tensor transformer.h.1.mlp.c_fc.bias", NULL);
    spoil unflip = {.unflip = "transformer.h.0.attn.c_attn.weight"};
    assert_refused(hf_dir(&x, "unflip", DP_DTYPE_F32, "", &unflip), 0, DP_ERR_FORMAT,
                   "h.0.attn.c_attn.weight has shape [96, 32], want [32, 96]", "Conv1D");
    spoil extra = {.extra = "transformer.h.0.attn.rotary"};
    assert_refused(hf_dir(&x, "extra", DP_DTYPE_F32, "transformer.", &extra), 0, DP_ERR_FORMAT,
                   "1 tensor dp's GPT does not have", "transformer.h.0.attn.rotary");
    spoil layer = {.extra = "h.2.attn.c_attn.weight"};
    assert_refused(hf_dir(&x, "layer", DP_DTYPE_F32, "", &layer), 0, DP_ERR_FORMAT,
                   "h.2.attn.c_attn.weight", NULL);
    spoil ints = {.int_dtype = DP_DTYPE_I32};
    assert_refused(hf_dir(&x, "ints", DP_DTYPE_F32, "transformer.", &ints), 0, DP_ERR_FORMAT,
                   "is I32", NULL);
    spoil untied = {.lm_head = 2};
    assert_refused(hf_dir(&x, "untied", DP_DTYPE_F32, "transformer.", &untied), 0,
                   DP_ERR_UNSUPPORTED, "untied head", NULL);
    spoil own = {.buffers = 1, .lm_head = 1};
    dp_gpt *g = NULL;
    float *p = NULL;
    dp_assert_ok(dp_gpt_init_from(hf_dir(&x, "own", DP_DTYPE_F32, "transformer.", &own), 0, &g,
                                  &p));
    cr_assert(memcmp(p, x.p, dp_gpt_model(g, 0)->n_params * sizeof(float)) == 0);
    free(p);
    dp_gpt_destroy(g);
    /* a cut file, and a file that is not GPT-2 at all */
    const char *dir = hf_dir(&x, "cut", DP_DTYPE_F32, "transformer.", NULL);
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0);
    cr_assert_eq(truncate(path, sb.st_size - 100), 0);
    assert_refused(dir, 0, DP_ERR_FORMAT, "model.safetensors", NULL);
    dp_test_write_file(path, "{}", 2);
    assert_refused(dir, 0, DP_ERR_FORMAT, "model.safetensors", NULL);
    assert_refused(in_tmp("nothing_here"), 0, DP_ERR_IO, "nothing_here", NULL);
    fixture_close(&x);
}

// --- writing -----------------------------------------------------------------------------

/* "name d0,d1" lines of tests/data/hf_gpt2_keys.txt, in name order. */
static char *expected_keys(void)
{
    char path[4096];
    const char *src = __FILE__, *slash = strrchr(src, '/');
    snprintf(path, sizeof path, "%.*sdata/hf_gpt2_keys.txt", (int)(slash ? slash - src + 1 : 0),
             src);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s; regenerate it with tests/gen_hf_gpt2_keys.py", path);
    static char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The export holds what transformers' save_pretrained writes (names,
 * shapes, metadata), the reference's values bitwise in Hugging Face's
 * layout (the very file it was read from), and reads back bitwise. */
Test(gpt_hf, export_is_what_transformers_writes_and_round_trips_bitwise)
{
    fixture x;
    fixture_open(&x);
    const char *src = hf_dir(&x, "src", DP_DTYPE_F32, "transformer.", NULL);
    dp_gpt *g = NULL;
    float *p = NULL;
    dp_assert_ok(dp_gpt_init_from(src, 0, &g, &p));
    const char *out = in_tmp("out"); /* made by the export */
    dp_assert_ok(dp_gpt_export_hf(out, g, p));

    char path[600], want_path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    snprintf(want_path, sizeof want_path, "%s/model.safetensors", src);
    dp_st_file *f = NULL, *w = NULL;
    dp_assert_ok(dp_st_open(path, &f));
    dp_assert_ok(dp_st_open(want_path, &w));
    /* the names and shapes, as transformers writes them */
    size_t n = dp_st_count(f);
    const char **names = malloc(n * sizeof *names);
    for (size_t i = 0; i < n; i++) names[i] = dp_st_tensor_at(f, i)->name;
    qsort(names, n, sizeof *names, cmp_names);
    char got[8192];
    size_t at = (size_t)snprintf(got, sizeof got, "format %s\n", dp_st_metadata(f, "format"));
    for (size_t i = 0; i < n; i++) {
        const dp_st_tensor *t = dp_st_find(f, names[i]);
        at += (size_t)snprintf(got + at, sizeof got - at, "%s %zu", t->name, t->shape[0]);
        if (t->ndim == 2) at += (size_t)snprintf(got + at, sizeof got - at, ",%zu", t->shape[1]);
        at += (size_t)snprintf(got + at, sizeof got - at, "\n");
    }
    cr_assert_str_eq(got, expected_keys());
    /* the values: the input file's, byte for byte */
    cr_assert_eq(n, dp_st_count(w));
    for (size_t i = 0; i < n; i++) {
        const dp_st_tensor *a = dp_st_tensor_at(f, i), *b = dp_st_find(w, a->name);
        cr_assert_not_null(b, "%s is not in the input", a->name);
        cr_assert(a->nbytes == b->nbytes && memcmp(a->data, b->data, a->nbytes) == 0,
                  "%s differs from the input's", a->name);
    }
    free(names);
    dp_st_close(f);
    dp_st_close(w);
    /* config.json describes it: reading the export back needs nothing else */
    dp_gpt *g2 = NULL;
    float *p2 = NULL;
    dp_assert_ok(dp_gpt_init_from(out, 0, &g2, &p2));
    cr_assert_eq(dp_gpt_config_of(g2)->n_head, x.r.NH);
    cr_assert(memcmp(p2, p, dp_gpt_model(g, 0)->n_params * sizeof(float)) == 0);
    /* a second export over the first replaces it */
    p[0] += 1.0f;
    dp_assert_ok(dp_gpt_export_hf(out, g, p));
    free(p2);
    dp_gpt_destroy(g2);
    dp_assert_ok(dp_gpt_init_from(out, 0, &g2, &p2));
    cr_assert_eq(p2[0], p[0]);
    free(p2);
    dp_gpt_destroy(g2);
    /* a file where the directory should be is left alone */
    const char *file = in_tmp("a_file");
    dp_test_write_file(file, "keep", 4);
    cr_assert_eq(dp_gpt_export_hf(file, g, p), DP_ERR_IO);
    cr_assert(strstr(dp_last_error(), "not a directory"), "%s", dp_last_error());
    cr_assert_eq(dp_gpt_export_hf(in_tmp("no/such/parent"), g, p), DP_ERR_IO);
    free(p);
    dp_gpt_destroy(g);
    fixture_close(&x);
}

/* A dp checkpoint gives its weights (not its optimizer state). */
Test(gpt_hf, a_dp_checkpoint_gives_its_weights)
{
    fixture x;
    fixture_open(&x);
    const dp_model *m = dp_gpt_model(x.g, 0);
    float *mom = calloc(m->n_params, sizeof *mom);
    dp_checkpoint ck = {.step = 7, .optimizer_step = 7, .params = x.p, .m = mom, .v = mom};
    const char *path = in_tmp("ck.safetensors");
    dp_assert_ok(dp_gpt_checkpoint_save(path, x.g, &ck));
    dp_gpt *g = NULL;
    float *p = NULL;
    dp_assert_ok(dp_gpt_init_from(path, 0, &g, &p));
    cr_assert(memcmp(p, x.p, m->n_params * sizeof(float)) == 0);
    free(p);
    dp_gpt_destroy(g);
    assert_refused(path, 2 * x.r.NH, DP_ERR_INVALID_ARGUMENT, "contradicts the checkpoint", NULL);
    assert_refused("", 0, DP_ERR_INVALID_ARGUMENT, "must not be NULL", NULL);
    free(mom);
    fixture_close(&x);
}
