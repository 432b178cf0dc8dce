/*
 * io/checkpoint.c - GPT checkpoints: the tensor table of dp_gpt_model as
 * safetensors, optimizer moments beside it, the rest in __metadata__.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "dp/checkpoint.h"
#include "dp/safetensors.h"

#define CK_FORMAT "dp-gpt-1"
#define EXP_AVG "optimizer.exp_avg."
#define EXP_AVG_SQ "optimizer.exp_avg_sq."

static dp_status set_num(dp_st_writer *w, const char *key, long long v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", v);
    return dp_st_writer_set_metadata(w, key, buf);
}

/* Adds one F32 tensor per model tensor, name prefixed, pointing into buf. */
static dp_status add_table(dp_st_writer *w, const dp_model *m, const char *prefix, const float *buf,
                           char **names)
{
    for (size_t i = 0; i < m->n_tensors; i++) {
        const dp_param_tensor *t = &m->tensors[i];
        const char *name = t->name;
        if (prefix) {
            size_t n = strlen(prefix) + strlen(t->name) + 1;
            names[i] = malloc(n);
            if (!names[i]) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
            snprintf(names[i], n, "%s%s", prefix, t->name);
            name = names[i];
        }
        DP_TRY(dp_st_writer_add(w, name, DP_DTYPE_F32, t->shape, t->ndim, buf + t->offset));
    }
    return DP_OK;
}

dp_status dp_checkpoint_save(const char *path, const dp_gpt *gpt, const dp_checkpoint *ck)
{
    if (!path || !gpt || !ck || !ck->params)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "path, gpt, ck and ck->params must not be NULL");
    const dp_gpt_config *c = dp_gpt_config_of(gpt);
    if (memcmp(c, &ck->config, sizeof *c) != 0)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "checkpoint configuration differs from the model's");
    /* One moment alone would silently drop the optimizer state. */
    if (!ck->m != !ck->v)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "ck->m and ck->v must both be set (optimizer "
                       "state) or both be NULL (none); %s is NULL", ck->m ? "v" : "m");
    /* dp_checkpoint_load refuses negative counters: never write a file it cannot read. */
    if (ck->step < 0 || ck->optimizer_step < 0)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "ck->step (%ld) and ck->optimizer_step (%ld) "
                       "must be >= 0", ck->step, ck->optimizer_step);
    const dp_model *m = dp_gpt_model(gpt);
    dp_st_writer *w = NULL;
    char **names = calloc(2 * m->n_tensors, sizeof *names);
    if (!names) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    dp_status s = dp_st_writer_create(&w);
    if (s == DP_OK) s = add_table(w, m, NULL, ck->params, NULL);
    if (s == DP_OK && ck->m) s = add_table(w, m, EXP_AVG, ck->m, names);
    if (s == DP_OK && ck->m) s = add_table(w, m, EXP_AVG_SQ, ck->v, names + m->n_tensors);
    if (s == DP_OK) s = dp_st_writer_set_metadata(w, "format", CK_FORMAT);
    if (s == DP_OK) s = set_num(w, "n_layer", (long long)c->n_layer);
    if (s == DP_OK) s = set_num(w, "n_head", (long long)c->n_head);
    if (s == DP_OK) s = set_num(w, "n_embd", (long long)c->n_embd);
    if (s == DP_OK) s = set_num(w, "block_size", (long long)c->block_size);
    if (s == DP_OK) s = set_num(w, "vocab_size", (long long)c->vocab_size);
    if (s == DP_OK) s = set_num(w, "step", ck->step);
    if (s == DP_OK) s = set_num(w, "optimizer_step", ck->optimizer_step);
    if (s == DP_OK && ck->tokenizer) s = dp_st_writer_set_metadata(w, "tokenizer", ck->tokenizer);
    if (s == DP_OK && ck->config_json) s = dp_st_writer_set_metadata(w, "config", ck->config_json);
    if (s == DP_OK && ck->has_sampler) {
        char buf[DP_SAMPLER_STATE_CHARS];
        s = dp_sampler_state_format(ck->sampler, buf, sizeof buf);
        if (s == DP_OK) s = dp_st_writer_set_metadata(w, "sampler", buf);
    }
    if (s == DP_OK) s = dp_st_writer_write(w, path);
    dp_st_writer_free(w);
    for (size_t i = 0; i < 2 * m->n_tensors; i++) free(names[i]);
    free(names);
    return s;
}

/* Parses metadata key as an integer in [lo, hi]. */
static dp_status get_num(const dp_st_file *f, const char *key, long long lo, long long hi,
                         long long *out)
{
    const char *v = dp_st_metadata(f, key);
    if (!v)
        return DP_FAIL(DP_ERR_FORMAT, "%s: metadata \"%s\" is missing; is this a dp checkpoint?",
                       dp_st_path(f), key);
    char *end = NULL;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        return DP_FAIL(DP_ERR_FORMAT, "%s: metadata \"%s\" = \"%s\" is not an integer in "
                       "[%lld, %lld]", dp_st_path(f), key, v, lo, hi);
    *out = x;
    return DP_OK;
}

/* Checks every tensor of the table (name prefixed) and, when buf is not
 * NULL, copies it into buf. */
static dp_status read_table(const dp_st_file *f, const dp_model *m, const char *prefix, float *buf)
{
    char name[512];
    for (size_t i = 0; i < m->n_tensors; i++) {
        const dp_param_tensor *t = &m->tensors[i];
        snprintf(name, sizeof name, "%s%s", prefix ? prefix : "", t->name);
        const void *data = NULL;
        DP_TRY(dp_st_expect(f, name, DP_DTYPE_F32, t->shape, t->ndim, &data));
        if (buf) memcpy(buf + t->offset, data, t->numel * sizeof(float));
    }
    return DP_OK;
}

void dp_checkpoint_free(dp_checkpoint *ck)
{
    if (!ck) return;
    free(ck->params);
    free(ck->m);
    free(ck->v);
    free(ck->tokenizer);
    free(ck->config_json);
    free(ck);
}

static char *dup_str(const char *s)
{
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

dp_status dp_checkpoint_load(const char *path, dp_checkpoint **out, dp_gpt **gpt_out)
{
    if (!path || !out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "path and out must not be NULL");
    *out = NULL;
    if (gpt_out) *gpt_out = NULL;
    dp_st_file *f = NULL;
    DP_TRY(dp_st_open(path, &f));
    dp_checkpoint *ck = calloc(1, sizeof *ck);
    dp_gpt *gpt = NULL;
    dp_status s = ck ? DP_OK : DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    const char *fmt = dp_st_metadata(f, "format");
    if (s == DP_OK && (!fmt || strcmp(fmt, CK_FORMAT) != 0))
        s = DP_FAIL(DP_ERR_FORMAT, "%s: metadata \"format\" is %s%s%s, expected \"" CK_FORMAT
                    "\"; not a dp GPT checkpoint", path, fmt ? "\"" : "", fmt ? fmt : "missing",
                    fmt ? "\"" : "");
    long long v[7] = {0};
    static const char *keys[7] = {"n_layer", "n_head", "n_embd", "block_size", "vocab_size",
                                  "step", "optimizer_step"};
    for (int i = 0; s == DP_OK && i < 7; i++)
        s = get_num(f, keys[i], i < 5 ? 1 : 0, i < 5 ? (1LL << 31) : (1LL << 62), &v[i]);
    /* Every layer has tensors in the file: a larger n_layer is corrupt, and
     * must not make dp_gpt_create build a table of billions of entries. */
    if (s == DP_OK && (size_t)v[0] > dp_st_count(f))
        s = DP_FAIL(DP_ERR_FORMAT, "%s: metadata \"n_layer\" = %lld but the file holds only %zu "
                    "tensors", path, v[0], dp_st_count(f));
    if (s == DP_OK) {
        ck->config.n_layer = (size_t)v[0];
        ck->config.n_head = (size_t)v[1];
        ck->config.n_embd = (size_t)v[2];
        ck->config.block_size = (size_t)v[3];
        ck->config.vocab_size = (size_t)v[4];
        ck->step = (long)v[5];
        ck->optimizer_step = (long)v[6];
        s = dp_gpt_create(&ck->config, &gpt);
        if (s == DP_ERR_INVALID_ARGUMENT) {
            /* An impossible configuration is a defect of the file, not of the call. */
            char why[1024];
            snprintf(why, sizeof why, "%s", dp_last_error());
            s = DP_FAIL(DP_ERR_FORMAT, "%s: the stored configuration is not a valid GPT: %s",
                        path, why);
        } else if (s != DP_OK) {
            dp_error_prefix("%s: stored configuration", path);
        }
    }
    const dp_model *m = gpt ? dp_gpt_model(gpt) : NULL;
    int has_opt = 0;
    if (s == DP_OK) {
        char first[512];
        snprintf(first, sizeof first, EXP_AVG "%s", m->tensors[0].name);
        has_opt = dp_st_find(f, first) != NULL;
        /* Every tensor must be accounted for: no stray or partial state. */
        size_t expected = m->n_tensors * (has_opt ? 3 : 1);
        /* Shapes first, so sizes in the metadata that the tensors do not
         * back are refused before anything of their size is allocated. */
        s = read_table(f, m, NULL, NULL);
        if (s == DP_OK && has_opt) s = read_table(f, m, EXP_AVG, NULL);
        if (s == DP_OK && has_opt) s = read_table(f, m, EXP_AVG_SQ, NULL);
        if (s == DP_OK && dp_st_count(f) != expected)
            s = DP_FAIL(DP_ERR_FORMAT, "%s: %zu tensors, expected %zu for this configuration%s",
                        path, dp_st_count(f), expected, has_opt ? " with optimizer state" : "");
    }
    if (s == DP_OK) {
        ck->params = calloc(m->n_params, sizeof(float));
        if (has_opt) {
            ck->m = calloc(m->n_params, sizeof(float));
            ck->v = calloc(m->n_params, sizeof(float));
        }
        if (!ck->params || (has_opt && (!ck->m || !ck->v)))
            s = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    }
    if (s == DP_OK) s = read_table(f, m, NULL, ck->params);
    if (s == DP_OK && has_opt) s = read_table(f, m, EXP_AVG, ck->m);
    if (s == DP_OK && has_opt) s = read_table(f, m, EXP_AVG_SQ, ck->v);
    const char *tok = s == DP_OK ? dp_st_metadata(f, "tokenizer") : NULL;
    const char *cfg = s == DP_OK ? dp_st_metadata(f, "config") : NULL;
    const char *smp = s == DP_OK ? dp_st_metadata(f, "sampler") : NULL;
    if (s == DP_OK && ((tok && !(ck->tokenizer = dup_str(tok))) ||
                       (cfg && !(ck->config_json = dup_str(cfg)))))
        s = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    if (s == DP_OK && smp) {
        s = dp_sampler_state_parse(smp, ck->sampler);
        if (s != DP_OK) dp_error_prefix("%s: metadata \"sampler\"", path);
        ck->has_sampler = s == DP_OK;
    }
    dp_st_close(f);
    if (s != DP_OK) {
        dp_checkpoint_free(ck);
        dp_gpt_destroy(gpt);
        return s;
    }
    *out = ck;
    if (gpt_out) *gpt_out = gpt;
    else dp_gpt_destroy(gpt);
    return DP_OK;
}
