/*
 * io/checkpoint.c - training checkpoints: a model's tensor table as
 * safetensors, optimizer moments beside it, the rest in __metadata__.
 * Generic over dp_model: what the metadata means for a model is the
 * model's business (lib/models), so io never depends on a model.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "dp/atomic_file.h"
#include "dp/checkpoint.h"
#include "dp/safetensors.h"

#define EXP_AVG "optimizer.exp_avg."
#define EXP_AVG_SQ "optimizer.exp_avg_sq."

/* Metadata keys the checkpoint itself writes; the caller's entries may not use them. */
static const char *const reserved[] = {"step", "optimizer_step", "tokenizer", "config", "sampler"};
#define N_RESERVED (sizeof reserved / sizeof reserved[0])

static int is_reserved(const char *key)
{
    for (size_t i = 0; i < N_RESERVED; i++)
        if (strcmp(key, reserved[i]) == 0) return 1;
    return 0;
}

/* What dp_checkpoint_open keeps: the open file and the metadata table. */
typedef struct ck_priv {
    dp_st_file *file;      /* NULL once the tensors were read */
    dp_checkpoint_kv *kv;  /* n_meta entries pointing into strings */
    char *strings;         /* one block holding every key and value */
    char *path;
    size_t n_tensors;      /* the file's tensor count */
} ck_priv;

// --- save -------------------------------------------------------------------------------

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

static dp_status check_meta(const dp_checkpoint *ck)
{
    if (ck->n_meta && !ck->meta)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "ck->meta is NULL but ck->n_meta is %zu", ck->n_meta);
    for (size_t i = 0; i < ck->n_meta; i++) {
        const dp_checkpoint_kv *e = &ck->meta[i];
        if (!e->key || !e->value || !*e->key)
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "ck->meta[%zu] has a NULL or empty key or a "
                           "NULL value", i);
        if (is_reserved(e->key))
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "ck->meta[%zu]: the key \"%s\" is written by "
                           "the checkpoint itself; use the dp_checkpoint field", i, e->key);
        for (size_t j = 0; j < i; j++)
            if (strcmp(ck->meta[j].key, e->key) == 0)
                return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "ck->meta: the key \"%s\" appears twice",
                               e->key);
    }
    return DP_OK;
}

dp_status dp_checkpoint_save(const char *path, const dp_model *m, const dp_checkpoint *ck)
{
    if (!path || !m || !ck || !ck->params)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "path, model, ck and ck->params must not be NULL");
    /* One moment alone would silently drop the optimizer state. */
    if (!ck->m != !ck->v)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "ck->m and ck->v must both be set (optimizer "
                       "state) or both be NULL (none); %s is NULL", ck->m ? "v" : "m");
    /* dp_checkpoint_open refuses negative counters: never write a file it cannot read. */
    /* the bounds open reads back: a file it would refuse is never written */
    if (ck->step < 0 || ck->optimizer_step < 0 || ck->step > DP_MAX_STEP ||
        ck->optimizer_step > DP_MAX_STEP)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "ck->step (%ld) and ck->optimizer_step (%ld) "
                       "must be in [0, 2^62] (DP_MAX_STEP)", ck->step, ck->optimizer_step);
    DP_TRY(check_meta(ck));
    dp_st_writer *w = NULL;
    char **names = calloc(2 * m->n_tensors + 1, sizeof *names);
    if (!names) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    dp_status s = dp_st_writer_create(&w);
    if (s == DP_OK) s = add_table(w, m, NULL, ck->params, NULL);
    if (s == DP_OK && ck->m) s = add_table(w, m, EXP_AVG, ck->m, names);
    if (s == DP_OK && ck->m) s = add_table(w, m, EXP_AVG_SQ, ck->v, names + m->n_tensors);
    /* The caller's entries first: for a GPT that keeps nanoGPT's key order. */
    for (size_t i = 0; s == DP_OK && i < ck->n_meta; i++)
        s = dp_st_writer_set_metadata(w, ck->meta[i].key, ck->meta[i].value);
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
    dp_st_writer_destroy(w);
    for (size_t i = 0; i < 2 * m->n_tensors; i++) free(names[i]);
    free(names);
    return s;
}

// --- load -------------------------------------------------------------------------------

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

void dp_checkpoint_close(dp_checkpoint *ck)
{
    if (!ck) return;
    ck_priv *p = ck->priv;
    if (p) {
        dp_st_close(p->file);
        free(p->kv);
        free(p->strings);
        free(p->path);
        free(p);
    }
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

/* Copies every non-reserved metadata entry of f into p's table. */
static dp_status copy_meta(const dp_st_file *f, ck_priv *p, size_t *n_out)
{
    size_t n = dp_st_metadata_count(f), bytes = 0, k = 0;
    for (size_t i = 0; i < n; i++) {
        const char *key, *val;
        DP_TRY(dp_st_metadata_at(f, i, &key, &val));
        if (!is_reserved(key)) bytes += strlen(key) + strlen(val) + 2;
    }
    p->kv = calloc(n ? n : 1, sizeof *p->kv);
    p->strings = malloc(bytes ? bytes : 1);
    if (!p->kv || !p->strings) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    char *at = p->strings;
    for (size_t i = 0; i < n; i++) {
        const char *key, *val;
        DP_TRY(dp_st_metadata_at(f, i, &key, &val));
        if (is_reserved(key)) continue;
        size_t kl = strlen(key) + 1, vl = strlen(val) + 1;
        memcpy(at, key, kl);
        p->kv[k].key = at;
        at += kl;
        memcpy(at, val, vl);
        p->kv[k].value = at;
        at += vl;
        k++;
    }
    *n_out = k;
    return DP_OK;
}

dp_status dp_checkpoint_open(const char *path, dp_checkpoint **out)
{
    if (!path || !out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "path and out must not be NULL");
    *out = NULL;
    dp_st_file *f = NULL;
    DP_TRY(dp_st_open(path, &f));
    dp_checkpoint *ck = calloc(1, sizeof *ck);
    ck_priv *p = calloc(1, sizeof *p);
    if (!ck || !p) {
        free(ck);
        free(p);
        dp_st_close(f);
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    }
    ck->priv = p;
    p->file = f;
    p->n_tensors = dp_st_count(f);
    dp_status s = (p->path = dup_str(path)) ? DP_OK
                                            : DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    long long step = 0, opt_step = 0;
    if (s == DP_OK) s = get_num(f, "step", 0, DP_MAX_STEP, &step);
    if (s == DP_OK) s = get_num(f, "optimizer_step", 0, DP_MAX_STEP, &opt_step);
    ck->step = (long)step;
    ck->optimizer_step = (long)opt_step;
    if (s == DP_OK) s = copy_meta(f, p, &ck->n_meta);
    ck->meta = p->kv;
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
    if (s != DP_OK) {
        dp_checkpoint_close(ck);
        return s;
    }
    *out = ck;
    return DP_OK;
}

const char *dp_checkpoint_meta(const dp_checkpoint *ck, const char *key)
{
    if (!ck || !key) return NULL;
    for (size_t i = 0; i < ck->n_meta; i++)
        if (ck->meta[i].key && strcmp(ck->meta[i].key, key) == 0) return ck->meta[i].value;
    return NULL;
}

size_t dp_checkpoint_tensor_count(const dp_checkpoint *ck)
{
    const ck_priv *p = ck ? ck->priv : NULL;
    return p ? p->n_tensors : 0;
}

const char *dp_checkpoint_path(const dp_checkpoint *ck)
{
    const ck_priv *p = ck ? ck->priv : NULL;
    return p ? p->path : NULL;
}

dp_status dp_checkpoint_read_tensors(dp_checkpoint *ck, const dp_model *m)
{
    if (!ck || !m) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "ck and model must not be NULL");
    ck_priv *p = ck->priv;
    if (!p || !p->file || ck->params)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "ck is not a checkpoint from dp_checkpoint_open "
                       "whose tensors are still unread");
    if (!m->n_tensors || !m->tensors)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "the model has no tensor table");
    const dp_st_file *f = p->file;
    const char *path = p->path;
    char first[512];
    snprintf(first, sizeof first, EXP_AVG "%s", m->tensors[0].name);
    int has_opt = dp_st_find(f, first) != NULL;
    /* Every tensor must be accounted for: no stray or partial state. */
    size_t expected = m->n_tensors * (has_opt ? 3 : 1);
    /* Shapes first, so sizes the tensors do not back are refused before
     * anything of their size is allocated. */
    dp_status s = read_table(f, m, NULL, NULL);
    if (s == DP_OK && has_opt) s = read_table(f, m, EXP_AVG, NULL);
    if (s == DP_OK && has_opt) s = read_table(f, m, EXP_AVG_SQ, NULL);
    if (s == DP_OK && dp_st_count(f) != expected)
        s = DP_FAIL(DP_ERR_FORMAT, "%s: %zu tensors, expected %zu for this configuration%s",
                    path, dp_st_count(f), expected, has_opt ? " with optimizer state" : "");
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
    if (s != DP_OK) {
        free(ck->params);
        free(ck->m);
        free(ck->v);
        ck->params = ck->m = ck->v = NULL;
        return s;
    }
    dp_st_close(p->file);
    p->file = NULL;
    return DP_OK;
}
