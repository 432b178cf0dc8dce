/*
 * models/gpt.c - GPT-2 (nanoGPT's architecture) as a dp_model (dp/gpt.h).
 *
 *   x = wte[tokens] + wpe[0..T)                              encoder
 *   for each block:  x = x + c_proj(attn(c_attn(ln_1(x))))   attention
 *                    x = x + c_proj(gelu(c_fc(ln_2(x))))      MLP
 *   logits = ln_f(x) @ wte^T                                 tied LM head
 *
 * With dp_gpt_config.vocab_pad the vocabulary is padded inside to Vp (as
 * llm.c does): wte's slot holds Vp rows, the padded ones a zero gap after
 * the (V, C) tensor, and the head's logits are Vp wide, the padded
 * columns -inf (gpt_pass.c), so the model is the unpadded one.
 *
 * Built from the layer functions of dp/nn.h, so every product goes through
 * the backend's GEMM. Parameters live in one flat buffer (the tensor table
 * below, nanoGPT's state-dict names); activations live in a caller-given
 * workspace, laid out as llm.c does: every activation the backward needs,
 * per layer, followed by the backward's gradient scratch.
 *
 * The backward runs llm.c's scheme: one buffer dresidual carries the
 * gradient of the residual stream from the top down; each block's two
 * LayerNorm backwards accumulate into it, so after the block's ln_1 it
 * holds the gradient with respect to the block's input, without copies.
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "dp/checked.h"
#include "kernels/bf16.h"
#include "dp/gpt.h"
#include "dp/nn.h"
#include "dp/rng.h"
#include "models/gpt_internal.h"

// --- the tensor table ------------------------------------------------------------------

static const char *const blk_suffix[BLK_COUNT] = {
    "ln_1.weight",      "ln_1.bias",      "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",     "ln_2.bias",
    "mlp.c_fc.weight",  "mlp.c_fc.bias",  "mlp.c_proj.weight",  "mlp.c_proj.bias"};

/* Longest name: "transformer.h." + 20 digits + "." + the longest suffix. */
#define NAME_CAP 64

// --- dp_model callbacks ----------------------------------------------------------------

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static dp_status gpt_init(void *ctx, float *params, uint64_t seed)
{
    const dp_gpt *g = ((const gpt_variant *)ctx)->g;
    if (!params) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "gpt init: params must not be NULL");
    /* Padding between tensors must be zero. */
    memset(params, 0, g->models[0].n_params * sizeof(float));
    dp_rng rng;
    dp_rng_seed(&rng, seed);
    /* nanoGPT: residual projections get std 0.02/sqrt(2L) (GPT-2 paper, section 2.3). */
    float proj_std = 0.02f / sqrtf(2.0f * (float)g->cfg.n_layer);
    for (size_t i = 0; i < g->models[0].n_tensors; i++) {
        const dp_param_tensor *t = &g->tensors[i];
        float *x = params + t->offset;
        if (t->ndim == 2) {
            dp_rng_fill_normal(&rng, x, t->numel, 0.0f,
                               ends_with(t->name, ".c_proj.weight") ? proj_std : 0.02f);
        } else if (ends_with(t->name, ".weight")) {
            for (size_t k = 0; k < t->numel; k++) x[k] = 1.0f; /* LayerNorm gain */
        } /* biases stay zero */
    }
    return DP_OK;
}

size_t gpt_first_bad_id(const dp_gpt *gpt, const int32_t *ids, size_t n)
{
    size_t V = gpt->cfg.vocab_size;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (size_t)ids[i] >= V) return i;
    return n;
}

static dp_status gpt_validate_inputs(void *ctx, const void *inputs, size_t rows)
{
    const dp_gpt *g = ((const gpt_variant *)ctx)->g;
    const int32_t *tok = inputs;
    size_t T = g->cfg.block_size, V = g->cfg.vocab_size;
    if (!tok && rows) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "gpt inputs must not be NULL");
    size_t bad = gpt_first_bad_id(g, tok, rows * T);
    if (bad == rows * T) return DP_OK;
    return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                   "token id %d at row %zu, position %zu is outside the vocabulary [0, %zu); "
                   "encode the text with a tokenizer whose vocabulary fits the model's "
                   "vocab_size (or build the model with a larger vocab_size)",
                   (int)tok[bad], bad / T, bad % T, V);
}

/*
 * The dp_model splits off the LM head (dp/model.h): forward stops at
 * ln_f, whose output the engine keeps as the features, and the engine
 * runs the head over chunks of rows. The workspace then has no lnf.
 */
static size_t gpt_workspace(void *ctx, size_t rows)
{
    const gpt_variant *v = ctx;
    carve c;
    if (!rows) return 0;
    return gpt_make_carve(v, rows, v->g->cfg.block_size, 0, &c) ? c.floats * sizeof(float)
                                                            : SIZE_MAX;
}

/* The callbacks of every variant (ctx a gpt_variant): one implementation.
 * The head reads the float32 features in every variant. */
static wview view_of(const gpt_variant *v, dp_params params)
{
    wview w = {params, v->bf16};
    return w;
}

static dp_status gpt_model_forward(void *ctx, dp_device *dev, dp_params params,
                                   const dp_chunk *chunk, void *workspace, float *features)
{
    const gpt_variant *v = ctx;
    carve c;
    DP_TRY(gpt_pass_check("gpt forward", v->g, dev, chunk->rows, v->g->cfg.block_size, 0, v, &c));
    return gpt_pass_body_forward(v->g, dev, view_of(v, params), chunk->inputs, chunk->rows,
                                 v->g->cfg.block_size, workspace, &c, features);
}

static dp_status gpt_model_backward(void *ctx, dp_device *dev, dp_params params, float *grads,
                                    const dp_chunk *chunk, void *workspace, float *dfeatures)
{
    const gpt_variant *v = ctx;
    carve c;
    DP_TRY(gpt_pass_check("gpt backward", v->g, dev, chunk->rows, v->g->cfg.block_size, 0, v, &c));
    return gpt_pass_body_backward(v->g, dev, view_of(v, params), grads, chunk->inputs,
                                  chunk->rows, v->g->cfg.block_size, workspace, &c, dfeatures,
                                  chunk);
}

static dp_status gpt_head_forward(void *ctx, dp_device *dev, dp_params params,
                                  const float *features, size_t m, float *logits)
{
    const gpt_variant *v = ctx;
    return gpt_pass_head_forward(v->g, dev, view_of(v, params), features, m, logits);
}

static dp_status gpt_head_forward16(void *ctx, dp_device *dev, dp_params params,
                                    const float *features, size_t m, uint16_t *logits,
                                    float *scratch, size_t scratch_floats)
{
    const gpt_variant *v = ctx;
    return gpt_pass_head_forward16(v->g, dev, view_of(v, params), features, m, logits, scratch,
                                   scratch_floats);
}

static dp_status gpt_head_backward16(void *ctx, dp_device *dev, dp_params params, float *grads,
                                     const float *features, size_t m, const uint16_t *dlogits,
                                     float *dfeatures)
{
    const gpt_variant *v = ctx;
    return gpt_pass_head_backward16(v->g, dev, view_of(v, params), grads, features, m, dlogits,
                                    dfeatures);
}

static dp_status gpt_head_backward(void *ctx, dp_device *dev, dp_params params, float *grads,
                                   const float *features, size_t m, float *dlogits,
                                   float *dfeatures)
{
    const gpt_variant *v = ctx;
    return gpt_pass_head_backward(v->g, dev, view_of(v, params), grads, features, m, dlogits,
                                  dfeatures);
}

// --- create / destroy ------------------------------------------------------------------

dp_status gpt_check_config(const dp_gpt_config *c)
{
    if (!c) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "gpt config must not be NULL");
    const char *zero = !c->vocab_size ? "vocab_size"
                       : !c->block_size ? "block_size"
                       : !c->n_layer    ? "n_layer"
                       : !c->n_head     ? "n_head"
                       : !c->n_embd     ? "n_embd"
                                        : NULL;
    if (zero)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "gpt config: %s is 0; every size (vocab_size %zu, block_size %zu, n_layer "
                       "%zu, n_head %zu, n_embd %zu) must be >= 1",
                       zero, c->vocab_size, c->block_size, c->n_layer, c->n_head, c->n_embd);
    if (c->n_embd % c->n_head)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "gpt config: n_head %zu does not divide n_embd %zu; each head gets n_embd "
                       "/ n_head channels, so pick n_embd a multiple of n_head",
                       c->n_head, c->n_embd);
    if (c->vocab_size > (size_t)INT32_MAX)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "gpt config: vocab_size %zu does not fit int32 token ids", c->vocab_size);
    size_t Vp = dp_gpt_padded_vocab(c);
    if (!Vp || Vp > (size_t)INT32_MAX)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "gpt config: vocab_pad %zu rounds vocab_size %zu up past %d logits (the "
                       "classes are int32 ids and the head's GEMM takes int sizes); use a pad "
                       "such as 64 or 128, or 0 for none", c->vocab_pad, c->vocab_size,
                       INT32_MAX);
    /* The GEMMs take int sizes: 4C, Vp and block_size must fit. */
    if (c->n_embd > (size_t)INT_MAX / 4)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "gpt config: n_embd %zu is too large (4*n_embd "
                       "must be <= %d)", c->n_embd, INT_MAX);
    if (c->block_size > (size_t)INT_MAX)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "gpt config: block_size %zu is too large (at "
                       "most %d)", c->block_size, INT_MAX);
    return DP_OK;
}

dp_status dp_gpt_create(const dp_gpt_config *cfg, dp_gpt **out)
{
    if (!out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "dp_gpt_create: out must not be NULL");
    *out = NULL;
    DP_TRY(gpt_check_config(cfg));
    size_t V = cfg->vocab_size, C = cfg->n_embd, L = cfg->n_layer, BS = cfg->block_size;
    size_t Vp = dp_gpt_padded_vocab(cfg); /* wte's slot: Vp rows, the last Vp - V zero */

    /* Shapes, and the total size with padding, checked for overflow. */
    int of = 0;
    size_t n_tensors = 0;
    mad(&n_tensors, L, BLK_COUNT, &of);
    mad(&n_tensors, 4, 1, &of);
    size_t per_block = 0; /* aligned floats of one block */
    size_t blk_shape[BLK_COUNT][2] = {{C, 0},     {C, 0},     {3 * C, C}, {3 * C, 0},
                                      {C, C},     {C, 0},     {C, 0},     {C, 0},
                                      {4 * C, C}, {4 * C, 0}, {C, 4 * C}, {C, 0}};
    for (int j = 0; j < BLK_COUNT; j++) {
        mad(&per_block, blk_shape[j][0], blk_shape[j][1] ? blk_shape[j][1] : 1, &of);
        per_block = align_up(per_block, &of);
    }
    size_t total = 0;
    mad(&total, Vp, C, &of);
    total = align_up(total, &of);
    mad(&total, BS, C, &of);
    total = align_up(total, &of);
    mad(&total, per_block, L, &of);
    mad(&total, 2 * DP_PARAM_ALIGN, (C + DP_PARAM_ALIGN - 1) / DP_PARAM_ALIGN, &of);
    if (of || total > SIZE_MAX / sizeof(float) || n_tensors > SIZE_MAX / NAME_CAP)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "gpt config: vocab_size %zu (padded to %zu by vocab_pad %zu), "
                       "block_size %zu, n_layer %zu, n_embd %zu overflow the parameter count; "
                       "use smaller sizes (or a smaller vocab_pad)",
                       V, Vp, cfg->vocab_pad, BS, L, C);

    dp_gpt *g = calloc(1, sizeof *g);
    if (!g) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "dp_gpt_create: host allocation failed");
    g->cfg = *cfg;
    g->tensors = calloc(n_tensors, sizeof *g->tensors);
    g->names = calloc(n_tensors, NAME_CAP);
    if (!g->tensors || !g->names) {
        dp_gpt_destroy(g);
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY,
                       "dp_gpt_create: host allocation of the %zu-tensor table failed", n_tensors);
    }

    size_t off = 0, i = 0;
#define ADD_TENSOR(d0, d1, ...)                                                     \
    do {                                                                            \
        dp_param_tensor *t_ = &g->tensors[i];                                       \
        char *nm_ = g->names + i * NAME_CAP;                                        \
        snprintf(nm_, NAME_CAP, __VA_ARGS__);                                       \
        t_->name = nm_;                                                             \
        t_->offset = off;                                                           \
        t_->ndim = (d1) ? 2 : 1;                                                    \
        t_->shape[0] = (d0);                                                        \
        t_->shape[1] = (d1);                                                        \
        t_->numel = (d0) * ((d1) ? (d1) : 1);                                       \
        t_->weight_decay = t_->ndim == 2; /* nanoGPT: decay 2-D tensors only */    \
        off = align_up(off + t_->numel, &of);                                       \
        i++;                                                                        \
    } while (0)
    ADD_TENSOR(V, C, "transformer.wte.weight");
    /* The padded rows: a larger gap before wpe (zero, as every gap). */
    off = align_up(Vp * C, &of);
    ADD_TENSOR(BS, C, "transformer.wpe.weight");
    for (size_t l = 0; l < L; l++)
        for (int j = 0; j < BLK_COUNT; j++)
            ADD_TENSOR(blk_shape[j][0], blk_shape[j][1], "transformer.h.%zu.%s", l, blk_suffix[j]);
    ADD_TENSOR(C, (size_t)0, "transformer.ln_f.weight");
    ADD_TENSOR(C, (size_t)0, "transformer.ln_f.bias");
#undef ADD_TENSOR

    /* Variant 0 is the float32 GPT; the others differ in the replicas'
     * type (the engine keeps float32 masters for bf16 ones) and in what
     * the blocks keep, so in the workspace and the body's callbacks. */
    for (int j = 0; j < GPT_VARIANTS; j++) {
        int kind = j / 8, gelu = j / 4 % 2, att = j % 4;
        size_t at = variant_index(kind, gelu, att);
        gpt_variant *v = &g->variants[at];
        v->g = g;
        v->bf16 = kind >= 1;
        v->act16 = kind == 2;
        v->recompute_att = att == 1;
        v->chunked_att = att == 2;
        v->fused_att = att == 3;
        v->recompute_gelu = gelu;
        dp_model *m = &g->models[at];
        m->ctx = v;
        m->param_dtype = v->bf16 ? DP_DTYPE_BF16 : DP_DTYPE_F32;
        m->input_row_bytes = BS * sizeof(int32_t);
        m->outputs_per_row = BS;
        m->n_classes = Vp;     /* the logits' width (llm.c's padded Vp) */
        m->target_classes = V; /* targets in the padding are refused */
        m->n_params = off;
        m->n_tensors = n_tensors;
        m->tensors = g->tensors;
        m->init = gpt_init;
        m->validate_inputs = gpt_validate_inputs;
        m->workspace_bytes = gpt_workspace;
        m->forward = gpt_model_forward;
        m->backward = gpt_model_backward;
        m->head_features = C;
        m->head_forward = gpt_head_forward;
        m->head_backward = gpt_head_backward;
        /* bf16 activations: the logits chunks in bfloat16 too (llm.c's floatX) */
        m->head_forward_bf16 = v->act16 ? gpt_head_forward16 : NULL;
        m->head_backward_bf16 = v->act16 ? gpt_head_backward16 : NULL;
        /* the same device work every step: no dropout, no host waits */
        m->replayable = 1;
    }
    *out = g;
    return DP_OK;
}

void dp_gpt_destroy(dp_gpt *gpt)
{
    if (!gpt) return;
    free(gpt->tensors);
    free(gpt->names);
    free(gpt);
}

const dp_model *dp_gpt_model(const dp_gpt *gpt, unsigned flags)
{
    if (!gpt || (flags & ~(DP_GPT_BF16 | DP_GPT_BF16_ACT | DP_GPT_RECOMPUTE_ATTENTION |
                           DP_GPT_RECOMPUTE_GELU | DP_GPT_CHUNKED_ATTENTION |
                           DP_GPT_FUSED_ATTENTION)))
        return NULL;
    if ((flags & DP_GPT_CHUNKED_ATTENTION) && (flags & DP_GPT_FUSED_ATTENTION)) return NULL;
    int kind = (flags & DP_GPT_BF16_ACT) ? 2 : (flags & DP_GPT_BF16) ? 1 : 0;
    int att = (flags & DP_GPT_FUSED_ATTENTION)     ? 3
              : (flags & DP_GPT_CHUNKED_ATTENTION) ? 2
              : (flags & DP_GPT_RECOMPUTE_ATTENTION) ? 1
                                                     : 0;
    return &gpt->models[variant_index(kind, !!(flags & DP_GPT_RECOMPUTE_GELU), att)];
}

const dp_gpt_config *dp_gpt_config_of(const dp_gpt *gpt) { return gpt ? &gpt->cfg : NULL; }

size_t dp_gpt_padded_vocab(const dp_gpt_config *cfg)
{
    if (!cfg) return 0;
    size_t V = cfg->vocab_size, pad = cfg->vocab_pad;
    if (pad <= 1) return V;
    if (V > SIZE_MAX - (pad - 1)) return 0;
    return (V + pad - 1) / pad * pad;
}

dp_status dp_gpt_copy_layout(const dp_gpt *to, float *dst, const dp_gpt *from, const float *src)
{
    if (!to || !dst || !from || !src)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "dp_gpt_copy_layout: to, dst, from and src must "
                       "not be NULL");
    const dp_gpt_config *a = &to->cfg, *b = &from->cfg;
    const char *diff = a->vocab_size != b->vocab_size   ? "vocab_size"
                       : a->block_size != b->block_size ? "block_size"
                       : a->n_layer != b->n_layer       ? "n_layer"
                       : a->n_embd != b->n_embd         ? "n_embd"
                       : a->n_head != b->n_head         ? "n_head"
                                                        : NULL;
    if (diff)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "dp_gpt_copy_layout: the GPTs differ in %s, so "
                       "their tensors differ; only vocab_pad and attention_chunk may differ",
                       diff);
    const dp_model *mt = &to->models[0], *mf = &from->models[0];
    memset(dst, 0, mt->n_params * sizeof(float));
    for (size_t i = 0; i < mt->n_tensors; i++)
        memcpy(dst + mt->tensors[i].offset, src + mf->tensors[i].offset,
               mt->tensors[i].numel * sizeof(float));
    return DP_OK;
}

long dp_gpt_find_tensor(const dp_gpt *gpt, const char *name)
{
    if (!gpt || !name) return -1;
    for (size_t i = 0; i < gpt->models[0].n_tensors; i++)
        if (strcmp(gpt->tensors[i].name, name) == 0) return (long)i;
    return -1;
}
