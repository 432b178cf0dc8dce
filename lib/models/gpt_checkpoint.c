/*
 * models/gpt_checkpoint.c - a GPT's configuration as checkpoint metadata
 * and the GPT checkpoints (dp/gpt.h: dp_gpt_config_to_metadata,
 * _from_metadata, dp_gpt_checkpoint_save, _load): the keys and their
 * checks, a stored configuration held to the rules of dp_gpt_create.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "dp/checked.h"
#include "dp/gpt.h"
#include "models/gpt_internal.h"

// --- checkpoints: the configuration as metadata -----------------------------------------

static const char *const meta_keys[DP_GPT_META_COUNT] = {"format",   "n_layer",    "n_head",
                                                         "n_embd",   "block_size", "vocab_size"};

dp_status dp_gpt_config_to_metadata(const dp_gpt_config *c, dp_gpt_metadata *out)
{
    if (!c || !out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "cfg and out must not be NULL");
    const size_t v[DP_GPT_META_COUNT] = {0, c->n_layer, c->n_head, c->n_embd, c->block_size,
                                         c->vocab_size};
    for (int i = 0; i < DP_GPT_META_COUNT; i++) {
        if (i == 0) snprintf(out->buf[i], sizeof out->buf[i], "%s", DP_GPT_FORMAT);
        else snprintf(out->buf[i], sizeof out->buf[i], "%zu", v[i]);
        out->kv[i].key = meta_keys[i];
        out->kv[i].value = out->buf[i];
    }
    return DP_OK;
}

dp_status dp_gpt_config_from_metadata(const dp_checkpoint *ck, dp_gpt_config *out)
{
    if (!ck || !out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "ck and out must not be NULL");
    const char *path = dp_checkpoint_path(ck) ? dp_checkpoint_path(ck) : "checkpoint";
    const char *fmt = dp_checkpoint_meta(ck, "format");
    if (!fmt || strcmp(fmt, DP_GPT_FORMAT) != 0)
        return DP_FAIL(DP_ERR_FORMAT, "%s: metadata \"format\" is %s%s%s, expected \"" DP_GPT_FORMAT
                       "\"; not a dp GPT checkpoint", path, fmt ? "\"" : "", fmt ? fmt : "missing",
                       fmt ? "\"" : "");
    size_t v[DP_GPT_META_COUNT] = {0};
    for (int i = 1; i < DP_GPT_META_COUNT; i++) {
        const char *s = dp_checkpoint_meta(ck, meta_keys[i]);
        if (!s)
            return DP_FAIL(DP_ERR_FORMAT, "%s: metadata \"%s\" is missing; is this a dp "
                           "checkpoint?", path, meta_keys[i]);
        char *end = NULL;
        errno = 0;
        long long x = strtoll(s, &end, 10);
        if (errno || end == s || *end || x < 1 || x > (1LL << 31))
            return DP_FAIL(DP_ERR_FORMAT, "%s: metadata \"%s\" = \"%s\" is not an integer in "
                           "[1, %lld]", path, meta_keys[i], s, 1LL << 31);
        v[i] = (size_t)x;
    }
    /* Every layer has tensors in the file: a larger n_layer is corrupt, and
     * must not make dp_gpt_create build a table of billions of entries. */
    size_t count = dp_checkpoint_tensor_count(ck);
    if (v[1] > count)
        return DP_FAIL(DP_ERR_FORMAT, "%s: metadata \"n_layer\" = %zu but the file holds only %zu "
                       "tensors", path, v[1], count);
    dp_gpt_config c = {
        .vocab_size = v[5], .block_size = v[4], .n_layer = v[1], .n_head = v[2], .n_embd = v[3]};
    if (gpt_check_config(&c) != DP_OK) {
        /* An impossible configuration is a defect of the file, not of the call. */
        char why[1024];
        snprintf(why, sizeof why, "%s", dp_last_error());
        return DP_FAIL(DP_ERR_FORMAT, "%s: the stored configuration is not a valid GPT: %s", path,
                       why);
    }
    *out = c;
    return DP_OK;
}

dp_status dp_gpt_checkpoint_save(const char *path, const dp_gpt *gpt, const dp_checkpoint *ck)
{
    if (!path || !gpt || !ck)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "path, gpt and ck must not be NULL");
    if (ck->n_meta && !ck->meta)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "ck->meta is NULL but ck->n_meta is %zu", ck->n_meta);
    dp_gpt_metadata gm;
    DP_TRY(dp_gpt_config_to_metadata(&gpt->cfg, &gm));
    /* The caller's entries first, at their own indices, so that
     * dp_checkpoint_save's messages name them as the caller numbered them
     * (ck->meta[i]); then the model's entries the caller did not give. */
    size_t n = 0;
    dp_checkpoint_kv *kv = calloc(ck->n_meta + DP_GPT_META_COUNT, sizeof *kv);
    if (!kv) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    int given[DP_GPT_META_COUNT] = {0};
    for (size_t i = 0; i < ck->n_meta; i++) {
        const dp_checkpoint_kv *e = &ck->meta[i];
        int mine = -1;
        for (int j = 0; e->key && j < DP_GPT_META_COUNT; j++)
            if (strcmp(e->key, meta_keys[j]) == 0) mine = j;
        kv[n++] = *e; /* dp_checkpoint_save checks the entry */
        if (mine < 0) continue;
        given[mine] = 1;
        if (!e->value || strcmp(e->value, gm.buf[mine]) != 0) {
            free(kv);
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "ck->meta \"%s\" = \"%s\" differs from the "
                           "model's \"%s\"; the checkpoint's configuration must be the model's",
                           e->key, e->value ? e->value : "(null)", gm.buf[mine]);
        }
    }
    for (int j = 0; j < DP_GPT_META_COUNT; j++)
        if (!given[j]) kv[n++] = gm.kv[j];
    dp_checkpoint c = *ck;
    c.meta = kv;
    c.n_meta = n;
    dp_status s = dp_checkpoint_save(path, &gpt->models[0], &c);
    free(kv);
    return s;
}

dp_status dp_gpt_checkpoint_load(const char *path, dp_checkpoint **out, dp_gpt **gpt_out)
{
    if (!path || !out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "path and out must not be NULL");
    *out = NULL;
    if (gpt_out) *gpt_out = NULL;
    dp_checkpoint *ck = NULL;
    DP_TRY(dp_checkpoint_open(path, &ck));
    dp_gpt_config cfg;
    dp_gpt *gpt = NULL;
    dp_status s = dp_gpt_config_from_metadata(ck, &cfg);
    if (s == DP_OK) {
        s = dp_gpt_create(&cfg, &gpt);
        if (s != DP_OK) dp_error_prefix("%s: stored configuration", path);
    }
    if (s == DP_OK) s = dp_checkpoint_read_tensors(ck, &gpt->models[0]);
    if (s != DP_OK) {
        dp_checkpoint_close(ck);
        dp_gpt_destroy(gpt);
        return s;
    }
    *out = ck;
    if (gpt_out) *gpt_out = gpt;
    else dp_gpt_destroy(gpt);
    return DP_OK;
}
