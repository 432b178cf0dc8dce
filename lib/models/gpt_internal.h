/*
 * models/gpt_internal.h - what the GPT's files share (not installed):
 * the tensor table's indices, the model variants, the replica views, the
 * workspace layout (gpt_workspace.c) and the passes (gpt_pass.c), for the
 * dp_model callbacks and the public functions in gpt.c.
 */
#ifndef DP_MODELS_GPT_INTERNAL_H
#define DP_MODELS_GPT_INTERNAL_H

#include <math.h> /* INFINITY: the padded vocabulary's logits */
#include <stdint.h>

#include "dp/checked.h"
#include "dp/gpt.h"
#include "dp/nn.h"
#include "kernels/bf16.h"

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
    /* attention fused (dp_attention_forward_fused): only the softmax
     * normalisers' logs kept per layer */
    int fused_att;
} gpt_variant;

/* (float32, bf16, bf16 + activations) x (GELU output kept, recomputed) x
 * (probabilities kept, recomputed, chunked, fused) */
#define GPT_VARIANTS 24

/* The variant's index in dp_gpt's arrays: kind 0 float32, 1 bf16, 2 bf16
 * with bf16 activations; att 0 kept, 1 recomputed, 2 chunked, 3 fused. */
static inline size_t variant_index(int kind, int recompute_gelu, int att)
{
    return (size_t)(8 * kind + 4 * recompute_gelu + att);
}

struct dp_gpt {
    dp_gpt_config cfg;
    dp_model models[GPT_VARIANTS]; /* at variant_index */
    gpt_variant variants[GPT_VARIANTS];
    dp_param_tensor *tensors; /* 2 + 12 L + 2 entries */
    char *names;              /* NAME_CAP bytes per tensor */
};

/* Queries per chunk of the chunked attention. */
static inline size_t att_chunk(const dp_gpt *g)
{
    return g->cfg.attention_chunk ? g->cfg.attention_chunk : DP_GPT_ATTENTION_CHUNK;
}

/* Table index: wte 0, wpe 1, block l's tensor j at 2 + 12 l + j, then ln_f. */
static inline size_t idx_block(size_t l, int j) { return 2 + l * BLK_COUNT + (size_t)j; }
static inline size_t idx_lnf_w(const dp_gpt *g) { return 2 + g->cfg.n_layer * BLK_COUNT; }

/* The replica's parameters: float32, or bfloat16 (a bf16 replica). */
typedef struct wview {
    dp_params p;
    int bf16;
} wview;

static inline wview view_f32(const float *p)
{
    wview w = {{.f32 = p}, 0};
    return w;
}

/* Tensor i of the replica, as the kernels read it. */
static inline dp_pref pw(const dp_gpt *g, wview w, size_t i)
{
    size_t off = g->tensors[i].offset;
    return w.bf16 ? dp_pref_bf16(w.p.bf16 + off) : dp_pref_f32(w.p.f32 + off);
}
static inline float *gw(const dp_gpt *g, float *base, size_t i)
{
    return base + g->tensors[i].offset;
}

/* A layer's input activation: float32, or bfloat16 (x16, bf16 replicas only). */
typedef struct xin {
    const void *p;
    int x16;
} xin;

static inline xin x32(const float *p)
{
    xin x = {p, 0};
    return x;
}

// --- size arithmetic -------------------------------------------------------------------

/* *acc = *acc + a * b, setting *of on size_t overflow (dp/checked.h). */
static inline void mad(size_t *acc, size_t a, size_t b, int *of)
{
    if (!dp_size_mad(acc, a, b)) *of = 1;
}

/* n rounded up to DP_PARAM_ALIGN floats (256 bytes). */
static inline size_t align_up(size_t n, int *of)
{
    if (n > SIZE_MAX - DP_PARAM_ALIGN) {
        *of = 1;
        return n;
    }
    return (n + DP_PARAM_ALIGN - 1) / DP_PARAM_ALIGN * DP_PARAM_ALIGN;
}

// --- the workspace layout (gpt_workspace.c) ----------------------------------------

/* One block's cached activations (pointers into the workspace). With
 * act16 all but the residual stream, the LayerNorm statistics and att
 * hold bfloat16 elements: the GEMM inputs (ln1, qkvr, atty, ln2,
 * fch_gelu), which only GEMMs read, and the pre-GELU values (fch), which
 * the GELU and its backward read. With recompute_att att is not kept
 * (NULL), with recompute_gelu fch_gelu: the backward recomputes them (from
 * q and k, from fch) into the scratch. */
typedef struct layer_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* (B,T,C), (B,T), (B,T) */
    float *qkvr;                      /* (3,B,NH,T,hs); with fused_att qkv (B,T,3C) */
    float *att;                       /* (B,NH,T,T) softmax */
    float *atty;                      /* (B,T,C) attention output, heads concatenated */
    float *residual2;                 /* (B,T,C) x + attn */
    float *ln2, *ln2_mean, *ln2_rstd; /* (B,T,C), (B,T), (B,T) */
    float *fch, *fch_gelu;            /* (B,T,4C) */
    float *residual3;                 /* (B,T,C) residual2 + mlp: the block's output */
    float *lse;                       /* (B,NH,T) fused attention's normaliser logs, or NULL */
    int act16;
} layer_acts;

/* A GEMM input of the block as the linear layer reads it. */
static inline xin gemm_in(const layer_acts *a, const float *p)
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
 *   all blocks (the fused attention permutes nothing: qkv is what it
 *   keeps, in qkvr's slot);
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
 *                     queries, in the forward too; with act16 as well
 *                     att16 (B,NH,rows,T) bfloat16, the chunk's
 *                     probabilities and then score gradients as the
 *                     GEMMs read them. With fused_att no att, datt or
 *                     dqkvr: the fused backward writes dqkv directly (as
 *                     bfloat16 with dqkv16, in its first half) and
 *                     needs only delta (B,NH,T); in the forward q, k,
 *                     v are read in place in the kept qkvr slot, which
 *                     then holds c_attn's output (B,T,3C) (as it is in
 *                     float32; with act16 rounded from qkv at big, or
 *                     with fused16 written as bfloat16 by the GEMM, big
 *                     holding its float32 layer only where it cannot),
 *                     and the forward uses the attention scratch for
 *                     its float32 output (none with fused16: the output
 *                     goes to the kept atty as bfloat16).
 *                     With act16, big_d16 after the MLP half's buffers
 *                     (dfch, the recomputed GELU output), (B,T,4C)
 *                     bfloat16: in the MLP half the bfloat16 gradients
 *                     d(fch_gelu), then d(fch) in place (c_proj's dout,
 *                     rounded once, is in dbtc, and dfch is the float32
 *                     scratch where its GEMM cannot write bfloat16); in
 *                     the attention half the float32 dout of c_proj and
 *                     c_attn rounded once for both GEMMs. There it lies
 *                     over dqkvr, the scratch and datt (and att16, delta;
 *                     with fused_att the scratch and delta only), which
 *                     the attention backward has not written yet at
 *                     c_proj and no longer reads at c_attn (whose dout,
 *                     dqkv, lies before it).
 */
typedef struct carve {
    size_t floats; /* total, in floats */
    /* offsets in floats */
    size_t encoded, lnf, lnf_mean, lnf_rstd;
    size_t layer0, layer_stride; /* first block, floats per block */
    size_t l_ln1, l_ln1_mean, l_ln1_rstd, l_qkvr, l_att, l_atty, l_res2, l_ln2,
        l_ln2_mean, l_ln2_rstd, l_fch, l_fch_gelu, l_res3, l_lse;
    size_t dresidual, dbtc, big;
    size_t big_dqkvr, big_scratch, big_datt, big_att, big_gelu; /* inside big */
    size_t big_att16; /* inside big: act16 with chunked_att only (else 0) */
    size_t big_delta; /* inside big: fused_att's D (B,NH,T) (else 0) */
    size_t big_d16;     /* inside big, act16 only: bfloat16 gradients (the MLP's, a dout) */
    int act16;          /* the blocks' activations off the residual stream are bfloat16 */
    int recompute_att;  /* no att per block: big_att holds the recomputed probabilities */
    int recompute_gelu; /* no fch_gelu per block: big_gelu holds it, recomputed */
    int chunked_att;    /* big_att and big_datt hold one chunk of queries */
    int fused_att;      /* no probabilities anywhere: l_lse per block, big_delta */
    /* act16 with fused_att (head size <= DP_FLASH_HS_MAX16): the attention
     * reads and writes bfloat16 both ways. Forward: c_attn's GEMM writes
     * the kept qkv as bfloat16 (the float32 layer at big where the GEMM
     * cannot write bfloat16), the attention reads it in place and writes
     * the kept atty directly. Backward: it writes dqkv as bfloat16 at big,
     * which c_attn's reads as it is. */
    int fused16;
    size_t att_rows;    /* queries per chunk: min(att_chunk(g), T), else T */
} carve;

/* Fills c for (B,T); returns 0 on size_t overflow (of bytes, too). With
 * keep_lnf 0 the final LayerNorm's output lives outside the workspace (the
 * engine's features buffer, for the dp_model with a head). */
int gpt_make_carve(const gpt_variant *v, size_t B, size_t T, int keep_lnf, carve *c);
/* Block l's activations in the workspace ws. */
layer_acts gpt_layer_of(const carve *c, float *ws, size_t l);

// --- the passes (gpt_pass.c) --------------------------------------------------------------

/* Shared argument checks of forward and backward; fills the carve. */
dp_status gpt_pass_check(const char *fn, const dp_gpt *gpt, dp_device *dev, size_t B, size_t T,
                         int keep_lnf, const gpt_variant *v, carve *c);
/* Everything but the LM head: lnf(B,T,C) = ln_f(blocks(embeddings)). */
dp_status gpt_pass_body_forward(const dp_gpt *gpt, dp_device *dev, wview params,
                           const int32_t *tokens, size_t B, size_t T, float *ws, const carve *cv,
                           float *lnf);
/* The tied LM head: logits(N,Vp) = lnf(N,C) @ wte^T over wte's slot of
 * Vp rows (Vp = V without dp_gpt_config.vocab_pad), the padded columns
 * -inf, for any N rows; its backward writes d(lnf)(N,C) = dlogits @ wte
 * and adds d(wte) += dlogits^T @ lnf (0 in the padded rows). */
dp_status gpt_pass_head_forward(const dp_gpt *gpt, dp_device *dev, wview params,
                                const float *lnf, size_t N, float *logits);
dp_status gpt_pass_head_backward(const dp_gpt *gpt, dp_device *dev, wview params, float *grads,
                                 const float *lnf, size_t N, const float *dlogits, float *dlnf);
/* The configuration's checks of dp_gpt_create (gpt.c); gpt_checkpoint.c
 * holds a stored configuration to them. Errors: DP_ERR_INVALID_ARGUMENT
 * naming the field. */
dp_status gpt_check_config(const dp_gpt_config *c);

/* The head in bfloat16 logits (dp_model.head_forward_bf16 and
 * head_backward_bf16; gpt_pass.c). */
dp_status gpt_pass_head_forward16(const dp_gpt *gpt, dp_device *dev, wview params,
                                  const float *lnf, size_t N, uint16_t *logits, float *scratch,
                                  size_t scratch_floats);
dp_status gpt_pass_head_backward16(const dp_gpt *gpt, dp_device *dev, wview params, float *grads,
                                   const float *lnf, size_t N, const uint16_t *dlogits,
                                   float *dlnf);
/* grads += d loss / d (everything but the LM head), from dlnf(B,T,C);
 * chunk (NULL: none) gets the signals of the final gradient. */
dp_status gpt_pass_body_backward(const dp_gpt *gpt, dp_device *dev, wview params, float *grads,
                            const int32_t *tokens, size_t B, size_t T, float *ws,
                            const carve *cv, const float *dlnf, const dp_chunk *chunk);

/* The index of the first of ids[0..n) outside [0, V) of gpt's vocabulary,
 * or n when all are in it (gpt.c): the engine's batch check and the
 * direct passes' share it. */
size_t gpt_first_bad_id(const dp_gpt *gpt, const int32_t *ids, size_t n);

#endif /* DP_MODELS_GPT_INTERNAL_H */
