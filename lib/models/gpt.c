/*
 * models/gpt.c - GPT-2 (nanoGPT's architecture) as a dp_model (dp/gpt.h).
 *
 *   x = wte[tokens] + wpe[0..T)                              encoder
 *   for each block:  x = x + c_proj(attn(c_attn(ln_1(x))))   attention
 *                    x = x + c_proj(gelu(c_fc(ln_2(x))))      MLP
 *   logits = ln_f(x) @ wte^T                                 tied LM head
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
#include <errno.h>
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

// --- the tensor table ------------------------------------------------------------------

/* Per-block tensors, in table order. */
enum {
    BLK_LN1_W = 0,
    BLK_LN1_B,
    BLK_ATTN_W, /* c_attn.weight (3C, C) */
    BLK_ATTN_B,
    BLK_APROJ_W, /* attn.c_proj.weight (C, C) */
    BLK_APROJ_B,
    BLK_LN2_W,
    BLK_LN2_B,
    BLK_FC_W, /* mlp.c_fc.weight (4C, C) */
    BLK_FC_B,
    BLK_MPROJ_W, /* mlp.c_proj.weight (C, 4C) */
    BLK_MPROJ_B,
    BLK_COUNT
};

static const char *const blk_suffix[BLK_COUNT] = {
    "ln_1.weight",      "ln_1.bias",      "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",     "ln_2.bias",
    "mlp.c_fc.weight",  "mlp.c_fc.bias",  "mlp.c_proj.weight",  "mlp.c_proj.bias"};

/* Longest name: "transformer.h." + 20 digits + "." + the longest suffix. */
#define NAME_CAP 64

/* One of the GPT's dp_models (the ctx of its callbacks): the replicas'
 * type and what the blocks keep between forward and backward. */
typedef struct gpt_variant {
    const dp_gpt *g;
    int bf16;  /* bfloat16 replicas */
    int act16; /* the activations off the residual stream kept as bfloat16 */
    int recompute_att, recompute_gelu; /* recomputed in the backward, not kept */
    /* attention formed att_chunk(g) queries at a time (implies
     * recompute_att) */
    int chunked_att;
} gpt_variant;

/* (float32, bf16, bf16 + activations) x (GELU output kept, recomputed) x
 * (probabilities kept, recomputed, chunked) */
#define GPT_VARIANTS 18

/* The variant's index in dp_gpt's arrays: kind 0 float32, 1 bf16, 2 bf16
 * with bf16 activations; att 0 kept, 1 recomputed, 2 chunked. */
static size_t variant_index(int kind, int recompute_gelu, int att)
{
    return (size_t)(6 * kind + 3 * recompute_gelu + att);
}

struct dp_gpt {
    dp_gpt_config cfg;
    dp_model models[GPT_VARIANTS]; /* at variant_index */
    gpt_variant variants[GPT_VARIANTS];
    dp_param_tensor *tensors; /* 2 + 12 L + 2 entries */
    char *names;              /* NAME_CAP bytes per tensor */
};

/* Queries per chunk of the chunked attention. */
static size_t att_chunk(const dp_gpt *g)
{
    return g->cfg.attention_chunk ? g->cfg.attention_chunk : DP_GPT_ATTENTION_CHUNK;
}

/* Table index: wte 0, wpe 1, block l's tensor j at 2 + 12 l + j, then ln_f. */
static size_t idx_block(size_t l, int j) { return 2 + l * BLK_COUNT + (size_t)j; }
static size_t idx_lnf_w(const dp_gpt *g) { return 2 + g->cfg.n_layer * BLK_COUNT; }

/* The replica's parameters: float32, or bfloat16 (a bf16 replica). */
typedef struct wview {
    dp_params p;
    int bf16;
} wview;

static wview view_f32(const float *p)
{
    wview w = {{.f32 = p}, 0};
    return w;
}

/* Tensor i of the replica, as the kernels read it. */
static dp_pref pw(const dp_gpt *g, wview w, size_t i)
{
    size_t off = g->tensors[i].offset;
    return w.bf16 ? dp_pref_bf16(w.p.bf16 + off) : dp_pref_f32(w.p.f32 + off);
}
static float *gw(const dp_gpt *g, float *base, size_t i) { return base + g->tensors[i].offset; }

/* The layers over a tensor of either type: the _bf16 variant for a bf16
 * replica (dp/nn.h), which computes as the float32 layer on the widened
 * values. */
static dp_status enc_fwd(dp_device *dev, float *out, const int32_t *tok, dp_pref wte, dp_pref wpe,
                         size_t B, size_t T, size_t C)
{
    return wte.bf16 ? dp_encoder_forward_bf16(dev, out, tok, wte.p, wpe.p, B, T, C)
                    : dp_encoder_forward(dev, out, tok, wte.p, wpe.p, B, T, C);
}

static dp_status ln_fwd(dp_device *dev, float *out, float *mean, float *rstd, const float *inp,
                        dp_pref w, dp_pref b, size_t N, size_t C)
{
    return w.bf16 ? dp_layernorm_forward_bf16(dev, out, mean, rstd, inp, w.p, b.p, N, C)
                  : dp_layernorm_forward(dev, out, mean, rstd, inp, w.p, b.p, N, C);
}

static dp_status ln_bwd(dp_device *dev, float *dinp, float *dw, float *db, const float *dout,
                        const float *inp, dp_pref w, const float *mean, const float *rstd,
                        size_t N, size_t C)
{
    return w.bf16 ? dp_layernorm_backward_bf16(dev, dinp, dw, db, dout, inp, w.p, mean, rstd, N, C)
                  : dp_layernorm_backward(dev, dinp, dw, db, dout, inp, w.p, mean, rstd, N, C);
}

/* A layer's input activation: float32, or bfloat16 (x16, bf16 replicas only). */
typedef struct xin {
    const void *p;
    int x16;
} xin;

static xin x32(const float *p)
{
    xin x = {p, 0};
    return x;
}

/* b.p may be NULL (no bias). */
static dp_status lin_fwd(dp_device *dev, float *out, xin inp, dp_pref w, dp_pref b, size_t N,
                         size_t C, size_t OC)
{
    if (inp.x16) return dp_linear_forward_bf16_inp(dev, out, inp.p, w.p, b.p, N, C, OC);
    return w.bf16 ? dp_linear_forward_bf16(dev, out, inp.p, w.p, b.p, N, C, OC)
                  : dp_linear_forward(dev, out, inp.p, w.p, b.p, N, C, OC);
}

static dp_status lin_bwd(dp_device *dev, float *dinp, float *dw, float *db, const float *dout,
                         xin inp, dp_pref w, size_t N, size_t C, size_t OC)
{
    if (inp.x16) return dp_linear_backward_bf16_inp(dev, dinp, dw, db, dout, inp.p, w.p, N, C, OC);
    return w.bf16 ? dp_linear_backward_bf16(dev, dinp, dw, db, dout, inp.p, w.p, N, C, OC)
                  : dp_linear_backward(dev, dinp, dw, db, dout, inp.p, w.p, N, C, OC);
}

// --- size arithmetic -------------------------------------------------------------------

/* *acc = *acc + a * b, setting *of on size_t overflow (dp/checked.h). */
static void mad(size_t *acc, size_t a, size_t b, int *of)
{
    if (!dp_size_mad(acc, a, b)) *of = 1;
}

/* n rounded up to DP_PARAM_ALIGN floats (256 bytes). */
static size_t align_up(size_t n, int *of)
{
    if (n > SIZE_MAX - DP_PARAM_ALIGN) {
        *of = 1;
        return n;
    }
    return (n + DP_PARAM_ALIGN - 1) / DP_PARAM_ALIGN * DP_PARAM_ALIGN;
}

// --- workspace layout ------------------------------------------------------------------

/* One block's cached activations (pointers into the workspace). With
 * act16 all but the residual stream, the LayerNorm statistics and att
 * hold bfloat16 elements: the GEMM inputs (ln1, qkvr, atty, ln2,
 * fch_gelu), which only GEMMs read, and the pre-GELU values (fch), which
 * the GELU and its backward read. With recompute_att att is not kept
 * (NULL), with recompute_gelu fch_gelu: the backward recomputes them (from
 * q and k, from fch) into the scratch. */
typedef struct layer_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* (B,T,C), (B,T), (B,T) */
    float *qkvr;                      /* (3,B,NH,T,hs) */
    float *att;                       /* (B,NH,T,T) softmax */
    float *atty;                      /* (B,T,C) attention output, heads concatenated */
    float *residual2;                 /* (B,T,C) x + attn */
    float *ln2, *ln2_mean, *ln2_rstd; /* (B,T,C), (B,T), (B,T) */
    float *fch, *fch_gelu;            /* (B,T,4C) */
    float *residual3;                 /* (B,T,C) residual2 + mlp: the block's output */
    int act16;
} layer_acts;

/* A GEMM input of the block as the linear layer reads it. */
static xin gemm_in(const layer_acts *a, const float *p)
{
    xin x = {p, a->act16};
    return x;
}

/*
 * The workspace carve for B sequences of T tokens. Every buffer starts on a
 * 256-byte boundary. The layout depends on (B,T) and its size grows with
 * both, so a workspace sized for (B, block_size) serves any B' <= B and
 * T <= block_size (sampling with short prefixes); forward and backward
 * must use the same (B,T).
 *
 Only what the backward reads is kept per block, which saves 5 of llm.c's
 * 21 (B,T,C)-sized buffers per block:
 * - qkv (B,T,3C) is dead once attention has permuted it into qkvr, so the
 *   forward writes it into the backward's scratch region `big`, shared by
 *   all blocks;
 * - the projections write straight into residual2/residual3 and add the
 *   residual in place, so no attproj/fcproj buffers exist (the backward
 *   never reads them: their gradient is dresidual itself);
 * - the attention forward's (B,T,C) scratch is the block's residual2,
 *   which is written only afterwards.
 *
 * Backward scratch, shared by all blocks:
 *   dresidual (B,T,C)  gradient of the residual stream
 *   dbtc      (B,T,C)  dln_f, dln_2, datty and dln_1 in turn
 *   big               MLP half: dfch (B,T,4C); attention half: dqkv
 *                     (B,T,3C), dqkvr (3,B,NH,T,hs), attention scratch
 *                     (B,T,C), datt (B,NH,T,T), and with recompute_att
 *                     att (B,NH,T,T), the recomputed probabilities; the
 *                     MLP half has the recomputed GELU output (B,T,4C)
 *                     after dfch with recompute_gelu. With chunked_att
 *                     att and datt are (B,NH,rows,T), rows =
 *                     min(att_chunk(g), T): one chunk of
 *                     queries, in the forward too.
 */
typedef struct carve {
    size_t floats; /* total, in floats */
    /* offsets in floats */
    size_t encoded, lnf, lnf_mean, lnf_rstd;
    size_t layer0, layer_stride; /* first block, floats per block */
    size_t l_ln1, l_ln1_mean, l_ln1_rstd, l_qkvr, l_att, l_atty, l_res2, l_ln2,
        l_ln2_mean, l_ln2_rstd, l_fch, l_fch_gelu, l_res3;
    size_t dresidual, dbtc, big;
    size_t big_dqkvr, big_scratch, big_datt, big_att, big_gelu; /* inside big */
    int act16;          /* the blocks' activations off the residual stream are bfloat16 */
    int recompute_att;  /* no att per block: big_att holds the recomputed probabilities */
    int recompute_gelu; /* no fch_gelu per block: big_gelu holds it, recomputed */
    int chunked_att;    /* big_att and big_datt hold one chunk of queries */
    size_t att_rows;    /* queries per chunk: min(att_chunk(g), T), else T */
} carve;

/* Places a buffer of n floats at *at (aligned) and advances *at. */
static size_t place(size_t *at, size_t n, int *of)
{
    size_t here = *at;
    size_t end = here;
    mad(&end, n, 1, of);
    *at = align_up(end, of);
    return here;
}

/* Fills c for (B,T); returns 0 on size_t overflow (of bytes, too). With
 * keep_lnf 0 the final LayerNorm's output lives outside the workspace (the
 * engine's features buffer, for the dp_model with a head). */
static int make_carve(const gpt_variant *v, size_t B, size_t T, int keep_lnf, carve *c)
{
    int of = 0;
    const dp_gpt_config *cfg = &v->g->cfg;
    int act16 = v->act16, recompute_att = v->recompute_att || v->chunked_att;
    size_t C = cfg->n_embd, NH = cfg->n_head, L = cfg->n_layer;
    size_t rows = v->chunked_att && att_chunk(v->g) < T ? att_chunk(v->g) : T;
    size_t BT = 0, BTC = 0, BNH = 0, BNHT = 0, BNHTT = 0, scores = 0;
    mad(&BT, B, T, &of);
    mad(&BTC, BT, C, &of);
    mad(&BNH, B, NH, &of);
    mad(&BNHT, BNH, T, &of);
    mad(&BNHTT, BNHT, T, &of);
    mad(&scores, BNHT, rows, &of); /* the probabilities the backward holds at once */
    if (of) return 0;
    memset(c, 0, sizeof *c);
    c->act16 = act16;
    c->recompute_att = recompute_att;
    c->recompute_gelu = v->recompute_gelu;
    c->chunked_att = v->chunked_att;
    c->att_rows = rows;

    /* One block, relative to its start. */
    size_t at = 0;
    size_t x3 = 0;
    mad(&x3, BTC, 3, &of);
    size_t x4 = 0;
    mad(&x4, BTC, 4, &of);
    /* a GEMM input in bfloat16 takes half the floats */
    size_t in1 = act16 ? BTC / 2 + 1 : BTC, in4 = act16 ? x4 / 2 + 1 : x4;
    c->l_ln1 = place(&at, in1, &of);
    c->l_ln1_mean = place(&at, BT, &of);
    c->l_ln1_rstd = place(&at, BT, &of);
    c->l_qkvr = place(&at, act16 ? x3 / 2 + 1 : x3, &of);
    c->l_att = recompute_att ? 0 : place(&at, BNHTT, &of);
    c->l_atty = place(&at, in1, &of);
    c->l_res2 = place(&at, BTC, &of);
    c->l_ln2 = place(&at, in1, &of);
    c->l_ln2_mean = place(&at, BT, &of);
    c->l_ln2_rstd = place(&at, BT, &of);
    c->l_fch = place(&at, in4, &of);
    c->l_fch_gelu = c->recompute_gelu ? 0 : place(&at, in4, &of);
    c->l_res3 = place(&at, BTC, &of);
    c->layer_stride = at;

    at = 0;
    c->encoded = place(&at, BTC, &of);
    c->lnf = keep_lnf ? place(&at, BTC, &of) : 0;
    c->lnf_mean = place(&at, BT, &of);
    c->lnf_rstd = place(&at, BT, &of);
    c->layer0 = at;
    mad(&at, c->layer_stride, L, &of);
    c->dresidual = place(&at, BTC, &of);
    c->dbtc = place(&at, BTC, &of);

    /* big: the larger of the MLP half and the attention half. */
    size_t bat = 0;
    place(&bat, x3, &of); /* dqkv at 0 */
    c->big_dqkvr = place(&bat, x3, &of);
    c->big_scratch = place(&bat, BTC, &of);
    c->big_datt = place(&bat, scores, &of);
    if (recompute_att) c->big_att = place(&bat, scores, &of); /* the probabilities, again */
    size_t mat = 0;
    place(&mat, x4, &of); /* dfch at 0 */
    if (c->recompute_gelu) c->big_gelu = place(&mat, in4, &of); /* the GELU output, again */
    size_t big = bat > mat ? bat : mat;
    c->big = place(&at, big, &of);
    c->floats = at;
    if (c->floats > SIZE_MAX / sizeof(float)) of = 1;
    return !of;
}

static layer_acts layer_of(const carve *c, float *ws, size_t l)
{
    float *b = ws + c->layer0 + l * c->layer_stride;
    layer_acts a;
    a.ln1 = b + c->l_ln1;
    a.ln1_mean = b + c->l_ln1_mean;
    a.ln1_rstd = b + c->l_ln1_rstd;
    a.qkvr = b + c->l_qkvr;
    a.att = c->recompute_att ? NULL : b + c->l_att;
    a.atty = b + c->l_atty;
    a.residual2 = b + c->l_res2;
    a.ln2 = b + c->l_ln2;
    a.ln2_mean = b + c->l_ln2_mean;
    a.ln2_rstd = b + c->l_ln2_rstd;
    a.fch = b + c->l_fch;
    a.fch_gelu = c->recompute_gelu ? NULL : b + c->l_fch_gelu;
    a.residual3 = b + c->l_res3;
    a.act16 = c->act16;
    return a;
}

size_t dp_gpt_workspace_bytes(const dp_gpt *gpt, size_t B, size_t T)
{
    carve c;
    if (!gpt || !B || !T) return 0;
    /* SIZE_MAX makes the allocation fail with a message instead of wrapping. */
    if (!make_carve(&gpt->variants[0], B, T, 1, &c)) return SIZE_MAX;
    return c.floats * sizeof(float);
}

// --- forward / backward ----------------------------------------------------------------

/* Shared argument checks of forward and backward; fills the carve. */
static dp_status check_call(const char *fn, const dp_gpt *gpt, dp_device *dev, size_t B,
                            size_t T, int keep_lnf, const gpt_variant *v, carve *c)
{
    if (!gpt || !dev) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: gpt and dev must not be NULL", fn);
    const dp_gpt_config *g = &gpt->cfg;
    if (!B || !T || T > g->block_size)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "%s on %s: B=%zu and T=%zu must satisfy B >= 1 and 1 <= T <= block_size "
                       "(%zu); crop the context to the last block_size tokens",
                       fn, dp_device_name(dev), B, T, g->block_size);
    int of = 0;
    size_t bt = 0, btv = 0;
    mad(&bt, B, T, &of);
    mad(&btv, bt, g->vocab_size, &of);
    if (of || btv > SIZE_MAX / sizeof(float) ||
        !make_carve(v, B, T, keep_lnf, c))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "%s on %s: B=%zu sequences of T=%zu tokens overflow the activation sizes; "
                       "use smaller micro-batches",
                       fn, dp_device_name(dev), B, T);
    if (B * T > (size_t)INT_MAX)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "%s on %s: B*T=%zu tokens exceed the GEMM's int sizes; use smaller "
                       "micro-batches", fn, dp_device_name(dev), B * T);
    return DP_OK;
}

/* With act16: the float32 activation at src (n elements) kept in its slot
 * as bfloat16 (for a GEMM input, the rounding a BF16-precision GEMM
 * applies anyway). */
static dp_status keep(dp_device *dev, const layer_acts *a, float *slot, const float *src, size_t n)
{
    if (!a->act16) return DP_OK;
    return dp_convert(dev, slot, DP_DTYPE_BF16, src, DP_DTYPE_F32, n);
}

/* The block's GELU output from its kept fch into out (n elements):
 * bfloat16 from the kept bfloat16 fch with act16, so the forward's GELU
 * reads the very values its backward reads, and a recomputation is the
 * same call on the same values. */
static dp_status gelu_of(dp_device *dev, const layer_acts *a, float *out, size_t n)
{
    if (a->act16) return dp_gelu_forward_bf16(dev, (dp_bf16 *)out, (const dp_bf16 *)a->fch, n);
    return dp_gelu_forward(dev, out, a->fch, n);
}

/* Everything but the LM head: lnf(B,T,C) = ln_f(blocks(embeddings)). */
static dp_status body_forward(const dp_gpt *gpt, dp_device *dev, wview params,
                              const int32_t *tokens, size_t B, size_t T, float *ws,
                              const carve *cv, float *lnf)
{
    const dp_gpt_config *g = &gpt->cfg;
    size_t C = g->n_embd, NH = g->n_head, L = g->n_layer, BT = B * T;
    const carve c = *cv;
    float *encoded = ws + c.encoded; // (B,T,C)
    float *qkv = ws + c.big;         // (B,T,3C), in the backward's scratch
    DP_TRY(enc_fwd(dev, encoded, tokens, pw(gpt, params, 0), pw(gpt, params, 1), B, T, C));
    const float *residual = encoded;
    for (size_t l = 0; l < L; l++) {
        layer_acts a = layer_of(&c, ws, l);
        dp_pref p_ln1w = pw(gpt, params, idx_block(l, BLK_LN1_W));
        dp_pref p_ln1b = pw(gpt, params, idx_block(l, BLK_LN1_B));
        dp_pref p_attw = pw(gpt, params, idx_block(l, BLK_ATTN_W));
        dp_pref p_attb = pw(gpt, params, idx_block(l, BLK_ATTN_B));
        dp_pref p_aprojw = pw(gpt, params, idx_block(l, BLK_APROJ_W));
        dp_pref p_aprojb = pw(gpt, params, idx_block(l, BLK_APROJ_B));
        dp_pref p_ln2w = pw(gpt, params, idx_block(l, BLK_LN2_W));
        dp_pref p_ln2b = pw(gpt, params, idx_block(l, BLK_LN2_B));
        dp_pref p_fcw = pw(gpt, params, idx_block(l, BLK_FC_W));
        dp_pref p_fcb = pw(gpt, params, idx_block(l, BLK_FC_B));
        dp_pref p_mprojw = pw(gpt, params, idx_block(l, BLK_MPROJ_W));
        dp_pref p_mprojb = pw(gpt, params, idx_block(l, BLK_MPROJ_B));

        /* With act16 each activation is computed in float32 into the
         * backward's scratch `big` (free in the forward: qkv goes there
         * only once ln1 is kept; the attention's float32 q, k, v, output
         * and probabilities at their own offsets after it) and kept
         * rounded to bfloat16, or not at all (the probabilities). */
        float *ln1 = c.act16 ? qkv : a.ln1;
        DP_TRY(ln_fwd(dev, ln1, a.ln1_mean, a.ln1_rstd, residual, p_ln1w, p_ln1b, BT, C));
        DP_TRY(keep(dev, &a, a.ln1, ln1, BT * C));
        DP_TRY(lin_fwd(dev, qkv, gemm_in(&a, a.ln1), p_attw, p_attb, BT, C, 3 * C));
        /* residual2 is free until the projection below: it is the scratch. */
        float *atty = c.act16 ? qkv + c.big_scratch : a.atty;
        float *att = c.recompute_att ? qkv + c.big_att : a.att; /* recomputed: not kept */
        if (c.chunked_att) /* q, k, v kept (as bfloat16 with act16), nothing (T,T) */
            DP_TRY(dp_attention_forward_chunked(
                dev, atty, a.qkvr, c.act16 ? DP_DTYPE_BF16 : DP_DTYPE_F32,
                c.act16 ? qkv + c.big_dqkvr : NULL, att, a.residual2, qkv, B, T, C, NH,
                c.att_rows));
        else if (c.act16) /* q, k, v kept as bfloat16 */
            DP_TRY(dp_attention_forward_bf16_qkv(dev, atty, (dp_bf16 *)a.qkvr, qkv + c.big_dqkvr,
                                                 att, a.residual2, qkv, B, T, C, NH));
        else
            DP_TRY(dp_attention_forward(dev, atty, a.qkvr, att, a.residual2, qkv, B, T, C, NH));
        DP_TRY(keep(dev, &a, a.atty, atty, BT * C));
        DP_TRY(lin_fwd(dev, a.residual2, gemm_in(&a, a.atty), p_aprojw, p_aprojb, BT, C, C));
        DP_TRY(dp_accumulate(dev, a.residual2, residual, BT * C));
        float *ln2 = c.act16 ? qkv : a.ln2;
        DP_TRY(ln_fwd(dev, ln2, a.ln2_mean, a.ln2_rstd, a.residual2, p_ln2w, p_ln2b, BT, C));
        DP_TRY(keep(dev, &a, a.ln2, ln2, BT * C));
        float *fch = c.act16 ? qkv : a.fch;
        DP_TRY(lin_fwd(dev, fch, gemm_in(&a, a.ln2), p_fcw, p_fcb, BT, C, 4 * C));
        DP_TRY(keep(dev, &a, a.fch, fch, BT * 4 * C));
        float *gelu = c.recompute_gelu ? qkv + c.big_gelu : a.fch_gelu;
        DP_TRY(gelu_of(dev, &a, gelu, BT * 4 * C));
        DP_TRY(lin_fwd(dev, a.residual3, gemm_in(&a, gelu), p_mprojw, p_mprojb, BT, 4 * C, C));
        DP_TRY(dp_accumulate(dev, a.residual3, a.residual2, BT * C));
        residual = a.residual3;
    }
    size_t lf = idx_lnf_w(gpt);
    DP_TRY(ln_fwd(dev, lnf, ws + c.lnf_mean, ws + c.lnf_rstd, residual, pw(gpt, params, lf),
                  pw(gpt, params, lf + 1), BT, C));
    return DP_OK;
}

/* The tied LM head: logits(N,V) = lnf(N,C) @ wte^T, for any N rows. */
static dp_status head_forward(const dp_gpt *gpt, dp_device *dev, wview params, const float *lnf,
                              size_t N, float *logits)
{
    const dp_gpt_config *g = &gpt->cfg;
    dp_pref none = {NULL, params.bf16};
    return lin_fwd(dev, logits, x32(lnf), pw(gpt, params, 0), none, N, g->n_embd, g->vocab_size);
}

/* d(lnf)(N,C) = dlogits @ wte (overwritten) and d(wte) += dlogits^T @ lnf. */
static dp_status head_backward(const dp_gpt *gpt, dp_device *dev, wview params, float *grads,
                               const float *lnf, size_t N, const float *dlogits, float *dlnf)
{
    const dp_gpt_config *g = &gpt->cfg;
    return lin_bwd(dev, dlnf, gw(gpt, grads, 0), NULL, dlogits, x32(lnf), pw(gpt, params, 0), N,
                   g->n_embd, g->vocab_size);
}

dp_status dp_gpt_forward(const dp_gpt *gpt, dp_device *dev, const float *params,
                         const int32_t *tokens, size_t B, size_t T, void *workspace,
                         float *logits)
{
    static const char fn[] = "dp_gpt_forward";
    carve c;
    DP_TRY(check_call(fn, gpt, dev, B, T, 1, gpt ? &gpt->variants[0] : NULL, &c));
    if (!params || !tokens || !workspace || !logits)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "%s on %s: params, tokens, workspace and logits must not be NULL", fn,
                       dp_device_name(dev));
    float *ws = workspace;
    DP_TRY(body_forward(gpt, dev, view_f32(params), tokens, B, T, ws, &c, ws + c.lnf));
    return head_forward(gpt, dev, view_f32(params), ws + c.lnf, B * T, logits);
}

/* dqkv(B,T,3C) of the block's attention from datty(B,T,C), with the
 * backward's scratch in big: from the kept probabilities, from the
 * forward's recomputed again (recompute_att), or chunk by chunk. */
static dp_status attention_backward(dp_device *dev, const carve *c, const layer_acts *a,
                                    float *big, float *dqkv, const float *datty, size_t B,
                                    size_t T, size_t C, size_t NH)
{
    float *dqkvr = big + c->big_dqkvr, *ascratch = big + c->big_scratch,
          *datt = big + c->big_datt, *again = big + c->big_att;
    const dp_bf16 *qkvr16 = (const dp_bf16 *)a->qkvr;
    if (c->chunked_att) /* each chunk's probabilities recomputed inside */
        return dp_attention_backward_chunked(dev, dqkv, dqkvr, again, datt, ascratch, datty,
                                             a->qkvr, a->act16 ? DP_DTYPE_BF16 : DP_DTYPE_F32,
                                             B, T, C, NH, c->att_rows);
    const float *att = a->att;
    if (c->recompute_att) { /* the forward's probabilities again, bit for bit */
        DP_TRY(a->act16 ? dp_attention_probs_bf16_qkv(dev, again, qkvr16, B, T, C, NH)
                        : dp_attention_probs(dev, again, a->qkvr, B, T, C, NH));
        att = again;
    }
    if (a->act16)
        return dp_attention_backward_bf16_qkv(dev, dqkv, dqkvr, datt, ascratch, datty, qkvr16,
                                              att, B, T, C, NH);
    return dp_attention_backward(dev, dqkv, dqkvr, datt, ascratch, datty, a->qkvr, att, B, T, C,
                                 NH);
}

/* Tells the engine (when a chunk is given: the engine's callback) that
 * the gradient from tensor i's offset to the previous signal's start is
 * final (dp_grads_ready): the walk from the top finishes ln_f, then each
 * block, then the embeddings, and the layout (wte, wpe, blocks, ln_f)
 * puts them back to front. */
static dp_status signal_from(const dp_gpt *gpt, const dp_chunk *chunk, size_t i, size_t *end)
{
    if (!chunk) return DP_OK;
    size_t begin = i ? gpt->tensors[i].offset : 0;
    DP_TRY(dp_grads_ready(chunk, begin, *end));
    *end = begin;
    return DP_OK;
}

/* grads += d loss / d (everything but the LM head), from dlnf(B,T,C);
 * chunk (NULL: none) gets the signals of the final gradient. */
static dp_status body_backward(const dp_gpt *gpt, dp_device *dev, wview params, float *grads,
                               const int32_t *tokens, size_t B, size_t T, float *ws,
                               const carve *cv, const float *dlnf, const dp_chunk *chunk)
{
    size_t signalled = gpt->models[0].n_params; /* where the final gradient begins */
    const dp_gpt_config *g = &gpt->cfg;
    size_t C = g->n_embd, NH = g->n_head, L = g->n_layer, BT = B * T;
    const carve c = *cv;
    float *dresidual = ws + c.dresidual; // (B,T,C)
    float *dbtc = ws + c.dbtc;           // (B,T,C)
    float *big = ws + c.big;
    const float *final = L ? layer_of(&c, ws, L - 1).residual3 : ws + c.encoded;

    /* LayerNorm backward accumulates: the residual gradient starts at zero. */
    DP_TRY(dp_memset(dev, dresidual, 0, BT * C * sizeof(float)));
    size_t lf = idx_lnf_w(gpt);
    DP_TRY(ln_bwd(dev, dresidual, gw(gpt, grads, lf), gw(gpt, grads, lf + 1), dlnf, final,
                  pw(gpt, params, lf), ws + c.lnf_mean, ws + c.lnf_rstd, BT, C));
    DP_TRY(signal_from(gpt, chunk, lf, &signalled));

    for (size_t l = L; l-- > 0;) {
        layer_acts a = layer_of(&c, ws, l);
        const float *residual = l ? layer_of(&c, ws, l - 1).residual3 : ws + c.encoded;
#define P(j) pw(gpt, params, idx_block(l, (j)))
#define G(j) gw(gpt, grads, idx_block(l, (j)))
        /* MLP. dresidual is d(residual3) = d(mlp.c_proj output) = d(residual2) so far. */
        float *dfch = big; // (B,T,4C): d(fch_gelu), then d(fch) in place
        const float *gelu = a.fch_gelu;
        if (c.recompute_gelu) { /* the forward's GELU output again, bit for bit */
            float *again = big + c.big_gelu;
            DP_TRY(gelu_of(dev, &a, again, BT * 4 * C));
            gelu = again;
        }
        DP_TRY(lin_bwd(dev, dfch, G(BLK_MPROJ_W), G(BLK_MPROJ_B), dresidual, gemm_in(&a, gelu),
                       P(BLK_MPROJ_W), BT, 4 * C, C));
        if (a.act16)
            DP_TRY(dp_gelu_backward_bf16_inp(dev, dfch, (const dp_bf16 *)a.fch, dfch, BT * 4 * C));
        else
            DP_TRY(dp_gelu_backward(dev, dfch, a.fch, dfch, BT * 4 * C));
        DP_TRY(lin_bwd(dev, dbtc, G(BLK_FC_W), G(BLK_FC_B), dfch, gemm_in(&a, a.ln2), P(BLK_FC_W),
                       BT, C, 4 * C));
        DP_TRY(ln_bwd(dev, dresidual, G(BLK_LN2_W), G(BLK_LN2_B), dbtc, a.residual2, P(BLK_LN2_W),
                      a.ln2_mean, a.ln2_rstd, BT, C));
        /* Attention. dresidual is now the full d(residual2). */
        float *dqkv = big;
        DP_TRY(lin_bwd(dev, dbtc, G(BLK_APROJ_W), G(BLK_APROJ_B), dresidual, gemm_in(&a, a.atty),
                       P(BLK_APROJ_W), BT, C, C));
        DP_TRY(attention_backward(dev, &c, &a, big, dqkv, dbtc, B, T, C, NH));
        DP_TRY(lin_bwd(dev, dbtc, G(BLK_ATTN_W), G(BLK_ATTN_B), dqkv, gemm_in(&a, a.ln1),
                       P(BLK_ATTN_W), BT, C, 3 * C));
        DP_TRY(ln_bwd(dev, dresidual, G(BLK_LN1_W), G(BLK_LN1_B), dbtc, residual, P(BLK_LN1_W),
                      a.ln1_mean, a.ln1_rstd, BT, C));
        /* dresidual is now d(block input) = d(previous block's residual3). */
        DP_TRY(signal_from(gpt, chunk, idx_block(l, 0), &signalled));
#undef P
#undef G
    }
    /* Encoder: the embedding's share of d(wte), and d(wpe). */
    DP_TRY(dp_encoder_backward(dev, gw(gpt, grads, 0), gw(gpt, grads, 1), dresidual, tokens, B, T,
                               C));
    return signal_from(gpt, chunk, 0, &signalled);
}

dp_status dp_gpt_backward(const dp_gpt *gpt, dp_device *dev, const float *params, float *grads,
                          const int32_t *tokens, size_t B, size_t T, void *workspace,
                          float *dlogits)
{
    static const char fn[] = "dp_gpt_backward";
    carve c;
    DP_TRY(check_call(fn, gpt, dev, B, T, 1, gpt ? &gpt->variants[0] : NULL, &c));
    if (!params || !grads || !tokens || !workspace || !dlogits)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "%s on %s: params, grads, tokens, workspace and dlogits must not be NULL",
                       fn, dp_device_name(dev));
    float *ws = workspace;
    /* LM head: d(lnf) into dbtc, free until the blocks' backward. */
    DP_TRY(head_backward(gpt, dev, view_f32(params), grads, ws + c.lnf, B * T, dlogits,
                         ws + c.dbtc));
    return body_backward(gpt, dev, view_f32(params), grads, tokens, B, T, ws, &c, ws + c.dbtc,
                         NULL);
}

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

static dp_status gpt_validate_inputs(void *ctx, const void *inputs, size_t rows)
{
    const dp_gpt *g = ((const gpt_variant *)ctx)->g;
    const int32_t *tok = inputs;
    size_t T = g->cfg.block_size, V = g->cfg.vocab_size;
    if (!tok && rows) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "gpt inputs must not be NULL");
    for (size_t r = 0; r < rows; r++)
        for (size_t t = 0; t < T; t++) {
            int32_t id = tok[r * T + t];
            if (id < 0 || (size_t)id >= V)
                return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                               "token id %d at row %zu, position %zu is outside the vocabulary "
                               "[0, %zu); encode the text with a tokenizer whose vocabulary "
                               "fits the model's vocab_size (or build the model with a larger "
                               "vocab_size)",
                               (int)id, r, t, V);
        }
    return DP_OK;
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
    return make_carve(v, rows, v->g->cfg.block_size, 0, &c) ? c.floats * sizeof(float)
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
    DP_TRY(check_call("gpt forward", v->g, dev, chunk->rows, v->g->cfg.block_size, 0, v, &c));
    return body_forward(v->g, dev, view_of(v, params), chunk->inputs, chunk->rows,
                        v->g->cfg.block_size, workspace, &c, features);
}

static dp_status gpt_model_backward(void *ctx, dp_device *dev, dp_params params, float *grads,
                                    const dp_chunk *chunk, void *workspace, float *dfeatures)
{
    const gpt_variant *v = ctx;
    carve c;
    DP_TRY(check_call("gpt backward", v->g, dev, chunk->rows, v->g->cfg.block_size, 0, v, &c));
    return body_backward(v->g, dev, view_of(v, params), grads, chunk->inputs, chunk->rows,
                         v->g->cfg.block_size, workspace, &c, dfeatures, chunk);
}

static dp_status gpt_head_forward(void *ctx, dp_device *dev, dp_params params,
                                  const float *features, size_t m, float *logits)
{
    const gpt_variant *v = ctx;
    return head_forward(v->g, dev, view_of(v, params), features, m, logits);
}

static dp_status gpt_head_backward(void *ctx, dp_device *dev, dp_params params, float *grads,
                                   const float *features, size_t m, float *dlogits,
                                   float *dfeatures)
{
    const gpt_variant *v = ctx;
    return head_backward(v->g, dev, view_of(v, params), grads, features, m, dlogits, dfeatures);
}

// --- create / destroy ------------------------------------------------------------------

static dp_status check_config(const dp_gpt_config *c)
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
    /* The GEMMs take int sizes: 4C, V and block_size must fit. */
    if (c->n_embd > (size_t)INT_MAX / 4 || c->block_size > (size_t)INT_MAX)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "gpt config: n_embd %zu (4*n_embd must be <= %d) or block_size %zu is too "
                       "large", c->n_embd, INT_MAX, c->block_size);
    return DP_OK;
}

dp_status dp_gpt_create(const dp_gpt_config *cfg, dp_gpt **out)
{
    if (!out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "dp_gpt_create: out must not be NULL");
    *out = NULL;
    DP_TRY(check_config(cfg));
    size_t V = cfg->vocab_size, C = cfg->n_embd, L = cfg->n_layer, BS = cfg->block_size;

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
    mad(&total, V, C, &of);
    total = align_up(total, &of);
    mad(&total, BS, C, &of);
    total = align_up(total, &of);
    mad(&total, per_block, L, &of);
    mad(&total, 2 * DP_PARAM_ALIGN, (C + DP_PARAM_ALIGN - 1) / DP_PARAM_ALIGN, &of);
    if (of || total > SIZE_MAX / sizeof(float) || n_tensors > SIZE_MAX / NAME_CAP)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "gpt config: vocab_size %zu, block_size %zu, n_layer %zu, n_embd %zu "
                       "overflow the parameter count; use smaller sizes",
                       V, BS, L, C);

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
        int kind = j / 6, gelu = j / 3 % 2, att = j % 3;
        size_t at = variant_index(kind, gelu, att);
        gpt_variant *v = &g->variants[at];
        v->g = g;
        v->bf16 = kind >= 1;
        v->act16 = kind == 2;
        v->recompute_att = att == 1;
        v->chunked_att = att == 2;
        v->recompute_gelu = gelu;
        dp_model *m = &g->models[at];
        m->ctx = v;
        m->param_dtype = v->bf16 ? DP_DTYPE_BF16 : DP_DTYPE_F32;
        m->input_row_bytes = BS * sizeof(int32_t);
        m->outputs_per_row = BS;
        m->n_classes = V;
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
                           DP_GPT_RECOMPUTE_GELU | DP_GPT_CHUNKED_ATTENTION)))
        return NULL;
    int kind = (flags & DP_GPT_BF16_ACT) ? 2 : (flags & DP_GPT_BF16) ? 1 : 0;
    int att = (flags & DP_GPT_CHUNKED_ATTENTION) ? 2 : (flags & DP_GPT_RECOMPUTE_ATTENTION) ? 1 : 0;
    return &gpt->models[variant_index(kind, !!(flags & DP_GPT_RECOMPUTE_GELU), att)];
}

const dp_gpt_config *dp_gpt_config_of(const dp_gpt *gpt) { return gpt ? &gpt->cfg : NULL; }

long dp_gpt_find_tensor(const dp_gpt *gpt, const char *name)
{
    if (!gpt || !name) return -1;
    for (size_t i = 0; i < gpt->models[0].n_tensors; i++)
        if (strcmp(gpt->tensors[i].name, name) == 0) return (long)i;
    return -1;
}

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
    if (check_config(&c) != DP_OK) {
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
    size_t n = 0;
    dp_checkpoint_kv *kv = calloc(ck->n_meta + DP_GPT_META_COUNT, sizeof *kv);
    if (!kv) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    for (int i = 0; i < DP_GPT_META_COUNT; i++) kv[n++] = gm.kv[i];
    for (size_t i = 0; i < ck->n_meta; i++) {
        const dp_checkpoint_kv *e = &ck->meta[i];
        int mine = -1;
        for (int j = 0; e->key && j < DP_GPT_META_COUNT; j++)
            if (strcmp(e->key, meta_keys[j]) == 0) mine = j;
        if (mine < 0) {
            kv[n++] = *e; /* dp_checkpoint_save checks the entry */
        } else if (!e->value || strcmp(e->value, gm.buf[mine]) != 0) {
            free(kv);
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "ck->meta \"%s\" = \"%s\" differs from the "
                           "model's \"%s\"; the checkpoint's configuration must be the model's",
                           e->key, e->value ? e->value : "(null)", gm.buf[mine]);
        }
    }
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
