/*
 * models/gpt_hf.c - the GPT's weights from and to Hugging Face's GPT-2
 * layout (dp/gpt_hf.h): names with or without "transformer.", GPT-2's
 * Conv1D weights [in, out] transposed to dp's [out, in], F32, F16 and
 * BF16 read, and config.json through jansson; gpt_hf_export.c writes.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/shape.h"
#include "dp/atomic_file.h"
#include "dp/gpt_hf.h"
#include "dp/safetensors.h"
#include "io/file.h"
#include "io/json_load.h"
#include "models/gpt_hf_internal.h"

/* A config.json past 16 MiB is refused (GPT-2's has under 1 KiB). */
#define CONFIG_MAX_BYTES ((size_t)16 << 20)

// --- names and layouts -------------------------------------------------------------

/* Element i of tensor t as float32 (F32, or F16 and BF16 widened exactly). */
static float element(const dp_st_tensor *t, size_t i)
{
    const unsigned char *p = (const unsigned char *)t->data;
    if (t->dtype == DP_DTYPE_F32) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return t->dtype == DP_DTYPE_F16 ? dp_f16_to_float(h) : dp_bf16_to_float(h);
}

// --- config.json ---------------------------------------------------------------------

/* What config.json says (-1 / NULL: absent). */
typedef struct hf_config {
    long long n_head, n_embd, n_layer, n_positions, vocab_size, n_inner;
    double eps;
    const char *activation, *model_type;
    int tied, scale_attn, scale_by_layer; /* -1 absent, else 0 / 1 */
    json_t *root;
} hf_config;

static long long int_key(json_t *root, const char *key)
{
    json_t *v = json_object_get(root, key);
    return json_is_integer(v) ? (long long)json_integer_value(v) : -1;
}

static int bool_key(json_t *root, const char *key)
{
    json_t *v = json_object_get(root, key);
    return json_is_boolean(v) ? json_is_true(v) : -1;
}

/* A key config.json gives with another JSON type than its own is
 * refused, not taken for absent (it would skip the check it is for:
 * "n_embd": "32"). null is absent, as transformers writes None. */
static dp_status check_types(const char *path, json_t *root)
{
    static const struct {
        const char *key;
        char type; /* 'i' a non-negative integer, 'n' a number, 's' a string, 'b' a boolean */
    } keys[] = {{"n_head", 'i'}, {"n_embd", 'i'}, {"n_layer", 'i'}, {"n_positions", 'i'},
                {"n_ctx", 'i'}, {"vocab_size", 'i'}, {"n_inner", 'i'},
                {"layer_norm_epsilon", 'n'}, {"activation_function", 's'},
                {"model_type", 's'}, {"tie_word_embeddings", 'b'},
                {"scale_attn_weights", 'b'}, {"scale_attn_by_inverse_layer_idx", 'b'}};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        json_t *v = json_object_get(root, keys[i].key);
        if (!v || json_is_null(v)) continue;
        char t = keys[i].type;
        int ok = t == 'i'   ? json_is_integer(v) && json_integer_value(v) >= 0
                 : t == 'n' ? json_is_number(v)
                 : t == 's' ? json_is_string(v)
                            : json_is_boolean(v);
        if (!ok)
            return DP_FAIL(DP_ERR_FORMAT, "'%s': %s is not %s", path, keys[i].key,
                           t == 'i'   ? "a non-negative integer"
                           : t == 'n' ? "a number"
                           : t == 's' ? "a string"
                                      : "true or false");
    }
    return DP_OK;
}

/* Reads path into *c (c->root NULL when there is no such file). */
static dp_status read_config(const char *path, hf_config *c)
{
    memset(c, 0, sizeof *c);
    c->n_head = c->n_embd = c->n_layer = c->n_positions = c->vocab_size = c->n_inner = -1;
    c->eps = NAN; /* absent; any number given is checked, a negative one too */
    c->tied = c->scale_attn = c->scale_by_layer = -1;
    struct stat sb;
    if (stat(path, &sb) != 0) return DP_OK; /* none */
    if (!S_ISREG(sb.st_mode))
        return DP_FAIL(DP_ERR_FORMAT, "'%s' is not a regular file", path);
    // Read without blocking: a FIFO swapped in after the stat is refused, not waited on.
    char *text;
    size_t len;
    DP_TRY(dp_file_read(path, "config file", CONFIG_MAX_BYTES, &text, &len));
    json_error_t err;
    c->root = json_loadb(text, len, 0, &err);
    free(text);
    if (!c->root && dp_json_load_out_of_memory(&err))
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "'%s': out of host memory parsing its JSON", path);
    if (!c->root)
        return DP_FAIL(DP_ERR_FORMAT, "'%s' line %d: %s", path, err.line, err.text);
    if (!json_is_object(c->root))
        return DP_FAIL(DP_ERR_FORMAT, "'%s' is not a JSON object", path);
    json_t *r = c->root;
    DP_TRY(check_types(path, r));
    c->n_head = int_key(r, "n_head");
    c->n_embd = int_key(r, "n_embd");
    c->n_layer = int_key(r, "n_layer");
    c->n_positions = int_key(r, "n_positions");
    if (c->n_positions < 0) c->n_positions = int_key(r, "n_ctx");
    c->vocab_size = int_key(r, "vocab_size");
    c->n_inner = int_key(r, "n_inner");
    json_t *eps = json_object_get(r, "layer_norm_epsilon");
    if (json_is_number(eps)) c->eps = json_number_value(eps);
    c->activation = json_string_value(json_object_get(r, "activation_function"));
    c->model_type = json_string_value(json_object_get(r, "model_type"));
    c->tied = bool_key(r, "tie_word_embeddings");
    c->scale_attn = bool_key(r, "scale_attn_weights");
    c->scale_by_layer = bool_key(r, "scale_attn_by_inverse_layer_idx");
    return DP_OK;
}

/* config.json against the model dp builds: another architecture is
 * refused (it would load and compute something else). */
static dp_status check_config(const char *path, const hf_config *c)
{
    if (c->model_type && strcmp(c->model_type, "gpt2") != 0)
        return DP_FAIL(DP_ERR_UNSUPPORTED, "'%s': model_type \"%s\"; dp's GPT is GPT-2's "
                       "architecture (model_type \"gpt2\")", path, c->model_type);
    if (c->activation && strcmp(c->activation, "gelu_new") != 0 &&
        strcmp(c->activation, "gelu_pytorch_tanh") != 0)
        return DP_FAIL(DP_ERR_UNSUPPORTED, "'%s': activation_function \"%s\"; dp's GPT uses "
                       "GPT-2's tanh GELU (\"gelu_new\")", path, c->activation);
    if (!isnan(c->eps) && !(fabs(c->eps - 1e-5) <= 1e-12))
        return DP_FAIL(DP_ERR_UNSUPPORTED, "'%s': layer_norm_epsilon %g; dp's LayerNorm uses "
                       "1e-5, GPT-2's", path, c->eps);
    if (c->tied == 0)
        return DP_FAIL(DP_ERR_UNSUPPORTED, "'%s': tie_word_embeddings is false; dp's LM head "
                       "is the token embedding (tied), as GPT-2's", path);
    if (c->scale_attn == 0 || c->scale_by_layer == 1)
        return DP_FAIL(DP_ERR_UNSUPPORTED, "'%s': the attention is not scaled by 1/sqrt(head "
                       "size) alone (scale_attn_weights, scale_attn_by_inverse_layer_idx); dp's "
                       "GPT scales as GPT-2 does", path);
    return DP_OK;
}

/* A config.json size must equal what the tensors say. */
static dp_status check_size(const char *path, const char *key, long long said, size_t is,
                            const char *from)
{
    if (said < 0 || (size_t)said == is) return DP_OK;
    return DP_FAIL(DP_ERR_FORMAT, "'%s': %s is %lld, but the tensors have %zu (%s); the files "
                   "disagree", path, key, said, is, from);
}

// --- reading ----------------------------------------------------------------------------

/* The paths of a directory's or a bare file's model and config. */
static dp_status locate(const char *path, char **model, char **config)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        return DP_FAIL(DP_ERR_IO, "cannot read '%s': %s", path, strerror(errno));
    size_t n = strlen(path);
    *model = malloc(n + 32);
    *config = malloc(n + 32);
    if (!*model || !*config) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    if (S_ISDIR(sb.st_mode)) {
        snprintf(*model, n + 32, "%s/model.safetensors", path);
        snprintf(*config, n + 32, "%s/config.json", path);
        return DP_OK;
    }
    snprintf(*model, n + 32, "%s", path);
    const char *slash = strrchr(path, '/');
    if (slash) snprintf(*config, n + 32, "%.*s/config.json", (int)(slash - path), path);
    else snprintf(*config, n + 32, "config.json");
    return DP_OK;
}

/* The blocks h.0 .. h.{L-1} of an open file. */
static size_t count_layers(const dp_st_file *f, const char *prefix)
{
    char name[256];
    size_t L = 0;
    for (;; L++) {
        snprintf(name, sizeof name, "%sh.%zu.ln_1.weight", prefix, L);
        if (!dp_st_find(f, name)) return L;
    }
}

/* Tensors a file may carry that dp's model does not have: the attention's
 * mask buffers of older transformers versions. */
static int known_extra(const char *name)
{
    size_t n = strlen(name);
    return (n > 10 && strcmp(name + n - 10, ".attn.bias") == 0) ||
           (n > 17 && strcmp(name + n - 17, ".attn.masked_bias") == 0);
}

/* Fills params from f's tensors in dp's layout; marks the ones used. */
static dp_status read_tensors(const dp_st_file *f, const char *prefix, const dp_model *m,
                              float *params, unsigned char *used)
{
    for (size_t i = 0; i < m->n_tensors; i++) {
        const dp_param_tensor *t = &m->tensors[i];
        char name[256], got[64], want[64];
        hf_name(t->name, prefix, name, sizeof name);
        const dp_st_tensor *x = dp_st_find(f, name);
        if (!x)
            return DP_FAIL(DP_ERR_FORMAT, "'%s' has no tensor %s: not a complete GPT-2 in Hugging "
                           "Face's layout", dp_st_path(f), name);
        int conv = is_conv1d(t->name);
        size_t shape[2] = {t->shape[0], t->ndim == 2 ? t->shape[1] : 0};
        if (conv) shape[0] = t->shape[1], shape[1] = t->shape[0];
        int ok = x->ndim == t->ndim && x->shape[0] == shape[0] &&
                 (t->ndim < 2 || x->shape[1] == shape[1]);
        if (!ok)
            return DP_FAIL(DP_ERR_FORMAT, "'%s': tensor %s has shape %s, want %s%s",
                           dp_st_path(f), name, dp_shape_text(got, sizeof got, x->shape, x->ndim),
                           dp_shape_text(want, sizeof want, shape, t->ndim),
                           conv ? " (GPT-2's Conv1D weight: [in, out])" : "");
        if (x->dtype != DP_DTYPE_F32 && x->dtype != DP_DTYPE_F16 && x->dtype != DP_DTYPE_BF16)
            return DP_FAIL(DP_ERR_FORMAT, "'%s': tensor %s is %s; dp reads F32, F16 and BF16 "
                           "weights", dp_st_path(f), name, dp_dtype_name(x->dtype));
        float *dst = params + t->offset;
        if (conv) { /* dst[o][i] = x[i][o] */
            size_t in = x->shape[0], out = x->shape[1];
            for (size_t r = 0; r < in; r++)
                for (size_t c = 0; c < out; c++) dst[c * in + r] = element(x, r * out + c);
        } else {
            for (size_t k = 0; k < t->numel; k++) dst[k] = element(x, k);
        }
        used[x - dp_st_tensor_at(f, 0)] = 1;
    }
    return DP_OK;
}

/* Every tensor of f the model did not use is one dp cannot place: named
 * (but the mask buffers and a head equal to wte are GPT-2's own). */
static dp_status check_unused(const dp_st_file *f, const char *prefix, const unsigned char *used,
                              const float *wte, size_t wte_numel)
{
    for (size_t i = 0; i < dp_st_count(f); i++) {
        const dp_st_tensor *x = dp_st_tensor_at(f, i);
        if (used[i] || known_extra(x->name)) continue;
        if (strcmp(x->name, "lm_head.weight") == 0) {
            int same = x->numel == wte_numel &&
                       (x->dtype == DP_DTYPE_F32 || x->dtype == DP_DTYPE_F16 ||
                        x->dtype == DP_DTYPE_BF16);
            for (size_t k = 0; same && k < wte_numel; k++) same = element(x, k) == wte[k];
            if (same) continue;
            return DP_FAIL(DP_ERR_UNSUPPORTED, "'%s': lm_head.weight differs from %swte.weight "
                           "(an untied head); dp's LM head is the token embedding",
                           dp_st_path(f), prefix);
        }
        size_t extra = 0;
        for (size_t j = i; j < dp_st_count(f); j++)
            extra += !used[j] && !known_extra(dp_st_tensor_at(f, j)->name);
        return DP_FAIL(DP_ERR_FORMAT, "'%s' has %zu tensor%s dp's GPT does not have, the first "
                       "%s; is it another architecture, or another layer count than its "
                       "h.{i} blocks say?", dp_st_path(f), extra, extra == 1 ? "" : "s", x->name);
    }
    return DP_OK;
}

/* A Hugging Face file f: the configuration, then the tensors. */
static dp_status load_hf(const dp_st_file *f, const char *config_path, size_t n_head,
                         dp_gpt **gpt_out, float **params_out)
{
    const char *path = dp_st_path(f), *prefix;
    if (dp_st_find(f, PREFIX "wte.weight")) prefix = PREFIX;
    else if (dp_st_find(f, "wte.weight")) prefix = "";
    else
        return DP_FAIL(DP_ERR_FORMAT, "'%s' has neither transformer.wte.weight nor wte.weight: "
                       "not a GPT-2 in Hugging Face's layout, nor a dp checkpoint", path);
    char name[256];
    snprintf(name, sizeof name, "%swte.weight", prefix);
    const dp_st_tensor *wte = dp_st_find(f, name);
    snprintf(name, sizeof name, "%swpe.weight", prefix);
    const dp_st_tensor *wpe = dp_st_find(f, name);
    if (wte->ndim != 2 || !wpe || wpe->ndim != 2 || wpe->shape[1] != wte->shape[1])
        return DP_FAIL(DP_ERR_FORMAT, "'%s': %swte.weight must be [V, C] and %swpe.weight [T, "
                       "C]", path, prefix, prefix);
    dp_gpt_config cfg = {.vocab_size = wte->shape[0], .block_size = wpe->shape[0],
                         .n_layer = count_layers(f, prefix), .n_embd = wte->shape[1]};
    if (cfg.n_layer == 0)
        return DP_FAIL(DP_ERR_FORMAT, "'%s' has no block %sh.0: not a GPT-2 in Hugging Face's "
                       "layout", path, prefix);
    hf_config c;
    dp_status s = read_config(config_path, &c);
    if (s == DP_OK && c.root) s = check_config(config_path, &c);
    if (s == DP_OK) s = check_size(config_path, "n_embd", c.n_embd, cfg.n_embd, "wte.weight");
    if (s == DP_OK) s = check_size(config_path, "n_layer", c.n_layer, cfg.n_layer, "the h.{i} blocks");
    if (s == DP_OK)
        s = check_size(config_path, "n_positions", c.n_positions, cfg.block_size, "wpe.weight");
    if (s == DP_OK) s = check_size(config_path, "vocab_size", c.vocab_size, cfg.vocab_size, "wte.weight");
    if (s == DP_OK && c.n_inner >= 0 && (size_t)c.n_inner != 4 * cfg.n_embd)
        s = DP_FAIL(DP_ERR_UNSUPPORTED, "'%s': n_inner %lld; dp's MLP is 4 n_embd = %zu wide",
                    config_path, c.n_inner, 4 * cfg.n_embd);
    if (s == DP_OK && c.root && c.n_head < 1)
        s = DP_FAIL(DP_ERR_FORMAT, "'%s' has no positive integer n_head", config_path);
    if (s == DP_OK && n_head && c.n_head > 0 && (size_t)c.n_head != n_head)
        s = DP_FAIL(DP_ERR_INVALID_ARGUMENT, "n_head %zu contradicts '%s', which says %lld "
                    "heads; leave n_head out (0) to take the file's", n_head, config_path,
                    c.n_head);
    if (s == DP_OK && !n_head && c.n_head < 1)
        s = DP_FAIL(DP_ERR_INVALID_ARGUMENT, "'%s' is a bare file (no '%s' beside it) and the "
                    "tensors do not say how many heads the attention has: give n_head", path,
                    config_path);
    if (c.root) json_decref(c.root);
    DP_TRY(s);
    cfg.n_head = n_head ? n_head : (size_t)c.n_head;

    dp_gpt *gpt = NULL;
    s = dp_gpt_create(&cfg, &gpt);
    if (s != DP_OK) {
        if (n_head) dp_error_prefix("'%s': the shape its tensors give", path);
        else dp_error_prefix("'%s': the shape its tensors give, with n_head from '%s'", path,
                             config_path);
        /* everything but a caller's n_head came from the files */
        return s == DP_ERR_INVALID_ARGUMENT && !n_head ? DP_ERR_FORMAT : s;
    }
    const dp_model *m = dp_gpt_model(gpt, 0);
    float *params = calloc(m->n_params, sizeof *params);
    unsigned char *used = calloc(dp_st_count(f) + 1, 1);
    if (!params || !used) s = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation of %zu parameters "
                                      "failed", m->n_params);
    if (s == DP_OK) s = read_tensors(f, prefix, m, params, used);
    if (s == DP_OK)
        s = check_unused(f, prefix, used, params + m->tensors[dp_gpt_find_tensor(gpt,
                                                               PREFIX "wte.weight")].offset,
                         cfg.vocab_size * cfg.n_embd);
    free(used);
    if (s != DP_OK) {
        free(params);
        dp_gpt_destroy(gpt);
        return s;
    }
    *gpt_out = gpt;
    *params_out = params;
    return DP_OK;
}

/* A dp checkpoint: its GPT and weights (nothing else). */
static dp_status load_checkpoint(const char *path, size_t n_head, dp_gpt **gpt_out,
                                 float **params_out)
{
    dp_checkpoint *ck = NULL;
    dp_gpt *gpt = NULL;
    DP_TRY(dp_gpt_checkpoint_load(path, &ck, &gpt));
    size_t has = dp_gpt_config_of(gpt)->n_head;
    if (n_head && n_head != has) {
        dp_checkpoint_close(ck);
        dp_gpt_destroy(gpt);
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "n_head %zu contradicts the checkpoint '%s', "
                       "which has %zu heads", n_head, path, has);
    }
    *params_out = ck->params;
    ck->params = NULL; /* kept; the rest goes */
    dp_checkpoint_close(ck);
    *gpt_out = gpt;
    return DP_OK;
}

dp_status dp_gpt_init_from(const char *path, size_t n_head, dp_gpt **gpt_out, float **params_out)
{
    if (gpt_out) *gpt_out = NULL;
    if (params_out) *params_out = NULL;
    if (!path || !*path || !gpt_out || !params_out)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "path, gpt_out and params_out must not be NULL "
                       "or empty");
    char *model = NULL, *config = NULL;
    dp_st_file *f = NULL;
    dp_status s = locate(path, &model, &config);
    if (s == DP_OK) s = dp_st_open(model, &f);
    if (s == DP_OK) {
        const char *format = dp_st_metadata(f, "format");
        int dp_ck = format && strcmp(format, DP_GPT_FORMAT) == 0;
        if (dp_ck) {
            dp_st_close(f);
            f = NULL;
            s = load_checkpoint(model, n_head, gpt_out, params_out);
        } else {
            s = load_hf(f, config, n_head, gpt_out, params_out);
        }
    }
    dp_st_close(f);
    free(model);
    free(config);
    return s;
}
