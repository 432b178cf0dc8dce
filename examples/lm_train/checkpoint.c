/*
 * examples/lm_train/checkpoint.c - --save and --resume: the checkpoint's
 * metadata, writing it (collective under ranks), applying a checkpoint's
 * model shape, tokenizer, schedule and precision to the options, checking
 * that resumed training reads the same token data, and saying what is
 * saved when a run stops.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lm_train.h"

/* Checkpoint metadata key of the cosine schedule's length (the trainer's,
 * not the model's). */
#define META_DECAY "lr_decay_steps"
/* Checkpoint metadata: the precision the run trained in (fp32 or bf16). */
#define META_PRECISION "precision"
/* Checkpoint metadata: the --vocab-pad the run trained with (1: none).
 * The tensors are the same for every pad (wte keeps its true rows), so it
 * only decides the layout a resumed run rebuilds; older files: none. */
#define META_VOCAB_PAD "vocab_pad"
/* Checkpoint metadata of the data trained on: "text", or the token files'
 * format (dp_token_format_name: "nanogpt", "llmc"), and the split lengths
 * in tokens. A checkpoint without them was trained on text. */
#define META_FORMAT "data_format"
#define META_TRAIN "data_train_tokens"
#define META_VAL "data_val_tokens"
#define FORMAT_TEXT "text"

// --- writing ------------------------------------------------------------------------


/* What the checkpoint's META_FORMAT says of the data. */
static const char *data_format(const run *r)
{
    dp_token_data_info info;
    if (!r->is_tokens || dp_token_data_get_info(r->data, &info) != DP_OK) return FORMAT_TEXT;
    return dp_token_format_name(info.format);
}

static char *config_json(const opts *o)
{
    json_t *j = json_pack("{s:s, s:s, s:I, s:I, s:f, s:f, s:I, s:I, s:f, s:f, s:f, s:f, s:I, "
                          "s:I, s:I, s:s}",
                          "tokenizer", o->tokenizer, "mode", o->mode, "batch_size",
                          (json_int_t)o->batch_size, "steps", (json_int_t)o->steps, "lr", o->lr,
                          "min_lr", o->min_lr, "warmup", (json_int_t)o->warmup,
                          "lr_decay_steps", (json_int_t)o->lr_decay_steps, "weight_decay",
                          o->weight_decay, "beta1", o->beta1, "beta2", o->beta2, "grad_clip",
                          o->grad_clip, "seed", (json_int_t)o->seed, "grad_accum",
                          (json_int_t)o->grad_accum, "vocab_size", (json_int_t)o->vocab_size,
                          "precision", o->compute.bf16 ? "bf16" : "fp32");
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(j);
    return s;
}

/* Writes --save. With ranks every rank reads the parameters and moments
 * (collective), rank 0 writes the file, and the ranks agree on the
 * outcome, so a failed write stops every rank with the same status. */
int save_checkpoint(run *r)
{
    dp_checkpoint ck;
    memset(&ck, 0, sizeof ck);
    ck.step = r->step;
    size_t bytes = 0;
    if (!dp_size_mul(r->n_params, sizeof(float), &bytes))
        return AGREED_FAIL(r, "the model's %zu parameters overflow a buffer size", r->n_params);
    ck.params = malloc(bytes);
    ck.m = malloc(bytes);
    ck.v = malloc(bytes);
    char decay[32], ntrain[32], nval[32], pad[32];
    size_t vpad = dp_gpt_config_of(r->gpt)->vocab_pad;
    snprintf(pad, sizeof pad, "%zu", vpad ? vpad : 1);
    snprintf(decay, sizeof decay, "%ld", r->o.lr_decay_steps);
    snprintf(ntrain, sizeof ntrain, "%zu", dp_token_data_size(r->data, DP_SPLIT_TRAIN));
    snprintf(nval, sizeof nval, "%zu", dp_token_data_size(r->data, DP_SPLIT_VAL));
    const dp_checkpoint_kv meta[6] = {{META_DECAY, decay},
                                      {META_FORMAT, data_format(r)},
                                      {META_TRAIN, ntrain},
                                      {META_VAL, nval},
                                      {META_PRECISION, r->o.compute.bf16 ? "bf16" : "fp32"},
                                      {META_VOCAB_PAD, pad}};
    ck.meta = meta;
    ck.n_meta = 6;
    int rc = 0;
    if (!ck.params || !ck.m || !ck.v) rc = cli_fail("out of host memory saving a checkpoint");
    rc = agree(r, rc);
    dp_status s = DP_OK;
    if (!rc && (s = dp_engine_get_params(r->engine, ck.params)) == DP_OK)
        s = dp_engine_get_optimizer_state(r->engine, ck.m, ck.v, &ck.optimizer_step);
    if (!rc && s != DP_OK) rc = engine_fail(r, s, "reading parameters");
    int all_here = !rc; /* every rank is here: the outcome of the write is agreed */
    if (!rc && r->rk.rank == 0) {
        /* Token data have no tokenizer to store (--tokenizer-file is given again). */
        if (!r->is_tokens && dp_tokenizer_serialize(r->tok, &ck.tokenizer) != DP_OK)
            rc = cli_dp_fail("tokenizer");
        if (!rc && dp_sampler_get_state(r->train, ck.sampler) != DP_OK) rc = cli_dp_fail("sampler state");
        ck.has_sampler = 1;
        if (!rc && !(ck.config_json = config_json(&r->o))) rc = cli_fail("out of host memory");
        if (!rc && dp_gpt_checkpoint_save(r->o.save, r->gpt, &ck) != DP_OK) rc = cli_dp_fail("save");
    }
    if (all_here) rc = agree_writes(r, rc);
    if (!rc) r->saved_step = r->step;
    free(ck.params);
    free(ck.m);
    free(ck.v);
    free(ck.tokenizer);
    free(ck.config_json);
    return rc;
}

int is_checkpoint_file(const char *path) { return cli_st_has_metadata(path, "step", NULL); }

// --- resuming -----------------------------------------------------------------------

/* With --resume, the schedule and the steps: the checkpoint's
 * --lr-decay-steps unless given, and --steps not below its step. */
static int apply_schedule(run *r)
{
    opts *o = &r->o;
    const dp_checkpoint *ck = r->ck;
    int g = o->given;
    /* The schedule's length: the flag, else the checkpoint's, else --steps. */
    const char *decay = dp_checkpoint_meta(ck, META_DECAY);
    if (!(g & G_DECAY) && decay) {
        char *end = NULL;
        errno = 0;
        long d = strtol(decay, &end, 10);
        if (errno || end == decay || *end || d < 1)
            return cli_fail("--resume %s: metadata \"" META_DECAY "\" = \"%s\" is not an integer "
                            ">= 1", o->resume, decay);
        o->lr_decay_steps = d;
    }
    /* The precision: the flag, else the checkpoint's (files from before
     * bf16 trained in fp32); the weights are float32 either way. */
    const char *prec = dp_checkpoint_meta(ck, META_PRECISION);
    if (!(g & G_PREC) && prec) {
        if (strcmp(prec, "bf16") == 0 || strcmp(prec, "fp32") == 0)
            o->compute.bf16 = prec[0] == 'b';
        else
            return cli_fail("--resume %s: metadata \"" META_PRECISION "\" = \"%s\" is not fp32 "
                            "or bf16", o->resume, prec);
        if (o->compute.bf16 && o->tf32)
            return cli_fail("--tf32 with --resume %s, which trained in bf16: give --precision "
                            "fp32 to resume in float32 with TF32, or drop --tf32", o->resume);
    }
    if (!o->eval_only && o->steps < ck->step)
        return cli_fail("--steps %ld is below the checkpoint's step %ld: nothing to train; give "
                        "--steps above %ld to continue, or --eval-only", o->steps, ck->step,
                        ck->step);
    return 0;
}

/* With --resume, the vocabulary's padding: --vocab-pad, else the
 * checkpoint's (setup's pad_vocab lays its unpadded tensors out for it),
 * else auto; files from before the option have none recorded. */
static int apply_vocab_pad(run *r)
{
    opts *o = &r->o;
    const char *pad = dp_checkpoint_meta(r->ck, META_VOCAB_PAD);
    if (o->compute.vocab_pad || !pad) return 0;
    char *end = NULL;
    errno = 0;
    long p = strtol(pad, &end, 10);
    if (errno || end == pad || *end || p < 1 || p > CLI_VOCAB_PAD_MAX)
        return cli_fail("--resume %s: metadata \"" META_VOCAB_PAD "\" = \"%s\" is not an "
                        "integer in [1, %d]; give --vocab-pad to choose the padding", o->resume,
                        pad, CLI_VOCAB_PAD_MAX);
    o->compute.vocab_pad = p;
    return 0;
}

/* With --resume on text: the checkpoint's tokenizer, checked against
 * --tokenizer and --vocab-size when given. */
static int apply_text_tokenizer(run *r)
{
    opts *o = &r->o;
    const dp_checkpoint *ck = r->ck;
    const dp_gpt_config *c = dp_gpt_config_of(r->gpt);
    int g = o->given;
    if (!ck->tokenizer) return cli_fail("--resume %s has no tokenizer", o->resume);
    if (dp_tokenizer_parse(ck->tokenizer, &r->tok) != DP_OK) return cli_dp_fail("checkpoint tokenizer");
    dp_tokenizer_kind kind = dp_tokenizer_kind_of(r->tok);
    const char *kname = dp_tokenizer_kind_name(kind);
    if ((g & G_TOK) && strcmp(o->tokenizer, kname) != 0)
        return cli_fail("--resume %s uses the %s tokenizer, which differs from --tokenizer %s; "
                        "drop --tokenizer or match it", o->resume, kname, o->tokenizer);
    o->tokenizer = kname;
    /* The word vocabulary asked for is in the training options (a corpus
     * with fewer words gives a smaller one); older files: the tokenizer's size. */
    long want = (long)dp_tokenizer_vocab_size(r->tok);
    json_t *cfg = ck->config_json ? json_loads(ck->config_json, 0, NULL) : NULL;
    json_t *vs = cfg ? json_object_get(cfg, "vocab_size") : NULL;
    if (vs && json_is_integer(vs)) want = (long)json_integer_value(vs);
    json_decref(cfg);
    if (g & G_VOCAB) {
        if (kind != DP_TOKENIZER_WORD)
            return cli_fail("--vocab-size applies to the word tokenizer; --resume %s uses the %s "
                            "tokenizer; drop --vocab-size", o->resume, kname);
        if (o->vocab_size != want)
            return cli_fail("--resume %s has a word vocabulary of --vocab-size %ld, which differs "
                            "from --vocab-size %ld; drop it or match it", o->resume, want,
                            o->vocab_size);
    }
    if (kind == DP_TOKENIZER_WORD) o->vocab_size = want;
    if (dp_tokenizer_vocab_size(r->tok) != c->vocab_size)
        return cli_fail("--resume: the checkpoint's vocabulary (%zu) does not match its "
                        "tokenizer (%zu)", c->vocab_size, dp_tokenizer_vocab_size(r->tok));
    return 0;
}

/* With --resume: checks the options given against the checkpoint (the
 * model's shape, the kind of data, tokenizer, vocabulary size, steps) and
 * takes the checkpoint's values for the others. */
int apply_checkpoint(run *r)
{
    opts *o = &r->o;
    const dp_checkpoint *ck = r->ck;
    const dp_gpt_config *c = dp_gpt_config_of(r->gpt);
    /* Only the options given count: the others are defaults, not requests. */
    int g = o->given;
    if (((g & G_LAYERS) && (size_t)o->layers != c->n_layer) ||
        ((g & G_HEADS) && (size_t)o->heads != c->n_head) ||
        ((g & G_DIM) && (size_t)o->dim != c->n_embd) ||
        ((g & G_CTX) && (size_t)o->context != c->block_size))
        return cli_fail("--resume %s holds a model with --layers %zu --heads %zu --dim %zu "
                        "--context %zu, which differs from the options given; drop them or "
                        "match them", o->resume, c->n_layer, c->n_head, c->n_embd, c->block_size);
    if (adopt_shape(o, c, "the checkpoint's ") || apply_vocab_pad(r)) return 1;
    /* The kind of data trained on: token files, or text (older checkpoints). */
    const char *fmt = dp_checkpoint_meta(ck, META_FORMAT);
    int ck_tokens = fmt && strcmp(fmt, FORMAT_TEXT) != 0;
    const char *data = o->data ? o->data : LM_DEFAULT_CORPUS;
    if (ck_tokens != r->is_tokens)
        return cli_fail("--resume %s was trained on %s, but --data %s is %s: %s", o->resume,
                        ck_tokens ? "token ids (pre-tokenized files)" : "text", data,
                        r->is_tokens ? "token files" : "text",
                        ck_tokens ? "pass token data (a directory of .bin files or one .bin file)"
                                  : "pass text the checkpoint's tokenizer covers");
    if (ck_tokens) {
        /* The model's vocabulary is the checkpoint's; token data's --vocab-size names it. */
        if ((g & G_VOCAB) && (size_t)o->vocab_size != c->vocab_size)
            return cli_fail("--resume %s has a vocabulary of %zu, which differs from --vocab-size "
                            "%ld; drop --vocab-size or match it", o->resume, c->vocab_size,
                            o->vocab_size);
        o->vocab_size = (long)c->vocab_size;
        return apply_schedule(r);
    }
    return apply_text_tokenizer(r) || apply_schedule(r);
}

/* The checkpoint's number under key, or -1 when absent or not a number. */
static long long meta_count(const dp_checkpoint *ck, const char *key)
{
    const char *v = dp_checkpoint_meta(ck, key);
    if (!v || !*v) return -1;
    char *end = NULL;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    return errno || *end || x < 0 ? -1 : x;
}

/* Resuming training on token data: the same format and split lengths as
 * the checkpoint's (the sampler state checks the training split's length
 * too). --eval-only evaluates any token data of the model's vocabulary. */
int check_resume_data(const run *r, const char *path)
{
    if (!r->ck || r->o.eval_only) return 0;
    const char *fmt = dp_checkpoint_meta(r->ck, META_FORMAT), *now = data_format(r);
    long long ct = meta_count(r->ck, META_TRAIN), cv = meta_count(r->ck, META_VAL);
    size_t nt = dp_token_data_size(r->data, DP_SPLIT_TRAIN);
    size_t nv = dp_token_data_size(r->data, DP_SPLIT_VAL);
    if (!fmt || ct < 0 || cv < 0)
        return cli_fail("--resume %s does not record its token data (metadata \"" META_FORMAT
                        "\", \"" META_TRAIN "\", \"" META_VAL "\"); it cannot be checked "
                        "against --data %s", r->o.resume, path);
    if (strcmp(fmt, now) != 0 || (size_t)ct != nt || (size_t)cv != nv)
        return cli_fail("--resume %s was trained on %s data of %lld train and %lld validation "
                        "tokens, but --data %s is %s data of %zu and %zu: resume on the same data "
                        "(--eval-only evaluates on other data)", r->o.resume, fmt, ct, cv, path,
                        now, nt, nv);
    return 0;
}

// --- stopping -----------------------------------------------------------------------

/* What the checkpoint file holds after the run stops early, in words. */
void checkpoint_state(const run *r, char *buf, size_t cap)
{
    const opts *o = &r->o;
    if (!o->save)
        snprintf(buf, cap, "; no --save was given, nothing was saved");
    else if (r->saved_step >= 0)
        snprintf(buf, cap, "; the last checkpoint is intact: %s (step %ld)", o->save,
                 r->saved_step);
    else if (r->ck && strcmp(o->resume, o->save) == 0)
        snprintf(buf, cap, "; the last checkpoint is intact: %s (step %ld, the one resumed)",
                 o->save, r->ck->step);
    else
        snprintf(buf, cap, "; no checkpoint was written to %s (none was due%s)", o->save,
                 o->save_interval ? " yet" : ": --save-interval is 0");
}
