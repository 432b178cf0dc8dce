/*
 * models/gpt_pass.c - the GPT's forward and backward (gpt_internal.h), and
 * dp_gpt_forward / dp_gpt_backward: the embeddings, the blocks and ln_f
 * over either replica type (gpt_layers.h), and llm.c's backward with one
 * residual gradient (gpt.c's header comment); the LM head is gpt_head.c.
 */
#include <limits.h>
#include <stdlib.h>

#include "core/error.h"
#include "models/gpt_internal.h"
#include "models/gpt_layers.h"
#include "nn/nn_act16.h"

// --- forward / backward ----------------------------------------------------------------

/* Shared argument checks of forward and backward; fills the carve. */
dp_status gpt_pass_check(const char *fn, const dp_gpt *gpt, dp_device *dev, size_t B, size_t T,
                         int keep_lnf, const gpt_variant *v, carve *c)
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
        !gpt_make_carve(v, B, T, keep_lnf, c))
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
dp_status gpt_pass_body_forward(const dp_gpt *gpt, dp_device *dev, wview params,
                                const int32_t *tokens, size_t B, size_t T, float *ws,
                                const carve *cv, float *lnf)
{
    const dp_gpt_config *g = &gpt->cfg;
    size_t C = g->n_embd, NH = g->n_head, L = g->n_layer, BT = B * T;
    const carve c = *cv;
    float *encoded = ws + c.encoded; // (B,T,C)
    float *qkv = ws + c.big;         // (B,T,3C), in the backward's scratch
    DP_TRY(enc_fwd(dev, encoded, tokens, pw(gpt, params, 0), pw(gpt, params, 1), B, T, C));
    /* The residual stream: each block's output is its last projection
     * plus its input, an addition left pending (added) until the next
     * LayerNorm, which makes it in the same pass. */
    float *residual = encoded;
    const float *added = NULL;
    for (size_t l = 0; l < L; l++) {
        layer_acts a = gpt_layer_of(&c, ws, l);
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

        /* With act16 the LayerNorms and c_fc write their kept outputs as
         * bfloat16 once. The fused attention reads q, k, v in place in
         * c_attn's output, which the block keeps (in qkvr's slot: as
         * bfloat16 with act16, written so by the GEMM with fused16) and
         * writes its output to atty (fused16: as bfloat16 directly). The
         * other attentions' activations are computed in float32 into the
         * backward's scratch `big` (free in the forward: its float32 q, k,
         * v, output and probabilities at their own offsets after qkv) and
         * kept rounded to bfloat16, or not at all (the probabilities). */
        DP_TRY(ln_fwd_res(dev, c.act16, a.ln1, a.ln1_mean, a.ln1_rstd, residual, added, p_ln1w,
                          p_ln1b, BT, C));
        if (c.fused16) { /* the float32 layer, where the GEMM cannot write bfloat16, in big */
            DP_TRY(dp_linear_forward_out16(dev, (dp_bf16 *)a.qkvr, qkv, BT * 3 * C, a.ln1,
                                           DP_DTYPE_BF16, p_attw, p_attb, BT, C, 3 * C));
            DP_TRY(dp_attention_forward_fused16(dev, (dp_bf16 *)a.atty, a.lse,
                                                (const dp_bf16 *)a.qkvr, B, T, C, NH));
        } else if (c.fused_att) { /* float32, or bfloat16 past DP_FLASH_HS_MAX16 */
            float *atty = c.act16 ? qkv + c.big_scratch : a.atty;
            if (c.act16) {
                DP_TRY(lin_fwd(dev, qkv, gemm_in(&a, a.ln1), p_attw, p_attb, BT, C, 3 * C));
                DP_TRY(keep(dev, &a, a.qkvr, qkv, BT * 3 * C));
            } else {
                DP_TRY(lin_fwd(dev, a.qkvr, gemm_in(&a, a.ln1), p_attw, p_attb, BT, C, 3 * C));
            }
            DP_TRY(dp_attention_forward_fused(dev, atty, a.lse, a.qkvr,
                                              c.act16 ? DP_DTYPE_BF16 : DP_DTYPE_F32, B, T, C,
                                              NH));
            DP_TRY(keep(dev, &a, a.atty, atty, BT * C));
        } else {
            DP_TRY(lin_fwd(dev, qkv, gemm_in(&a, a.ln1), p_attw, p_attb, BT, C, 3 * C));
            /* residual2 is free until the projection below: it is the scratch. */
            float *atty = c.act16 ? qkv + c.big_scratch : a.atty;
            float *att = c.recompute_att ? qkv + c.big_att : a.att; /* recomputed: not kept */
            if (c.chunked_att) /* q, k, v kept (as bfloat16 with act16), nothing (T,T) */
                DP_TRY(dp_attention_forward_chunked(
                    dev, atty, a.qkvr, c.act16 ? DP_DTYPE_BF16 : DP_DTYPE_F32, att,
                    c.act16 ? (dp_bf16 *)(qkv + c.big_att16) : NULL, a.residual2, qkv, B, T, C,
                    NH, c.att_rows));
            else if (c.act16) /* q, k, v kept as bfloat16 */
                DP_TRY(dp_attention_forward_bf16_qkv(dev, atty, (dp_bf16 *)a.qkvr, att,
                                                     a.residual2, qkv, B, T, C, NH));
            else
                DP_TRY(dp_attention_forward(dev, atty, a.qkvr, att, a.residual2, qkv, B, T, C,
                                            NH));
            DP_TRY(keep(dev, &a, a.atty, atty, BT * C));
        }
        DP_TRY(lin_fwd(dev, a.residual2, gemm_in(&a, a.atty), p_aprojw, p_aprojb, BT, C, C));
        DP_TRY(ln_fwd_res(dev, c.act16, a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, residual,
                          p_ln2w, p_ln2b, BT, C));
        float *gelu = c.recompute_gelu ? qkv + c.big_gelu : a.fch_gelu;
        /* qkv's (B,T,4C) floats: the scratch where the GEMM cannot write
         * bf16. The GELU in the GEMM's epilogue only where its output is
         * kept: a recomputation (gelu_of) must repeat the forward's bits. */
        if (c.act16 && !c.recompute_gelu)
            DP_TRY(dp_linear_gelu_forward_out16(dev, (dp_bf16 *)gelu, (dp_bf16 *)a.fch, qkv,
                                                BT * 4 * C, a.ln2, DP_DTYPE_BF16, p_fcw, p_fcb,
                                                BT, C, 4 * C));
        else {
            if (c.act16)
                DP_TRY(dp_linear_forward_out16(dev, (dp_bf16 *)a.fch, qkv, BT * 4 * C, a.ln2,
                                               DP_DTYPE_BF16, p_fcw, p_fcb, BT, C, 4 * C));
            else
                DP_TRY(lin_fwd(dev, a.fch, gemm_in(&a, a.ln2), p_fcw, p_fcb, BT, C, 4 * C));
            DP_TRY(gelu_of(dev, &a, gelu, BT * 4 * C));
        }
        DP_TRY(lin_fwd(dev, a.residual3, gemm_in(&a, gelu), p_mprojw, p_mprojb, BT, 4 * C, C));
        residual = a.residual3;
        added = a.residual2; /* pending: residual3 += residual2 */
    }
    size_t lf = idx_lnf_w(gpt);
    DP_TRY(ln_fwd_res(dev, 0, lnf, ws + c.lnf_mean, ws + c.lnf_rstd, residual, added,
                      pw(gpt, params, lf), pw(gpt, params, lf + 1), BT, C));
    return DP_OK;
}

/* The B*T token ids on dev are in [0, V): the embedding (and its
 * gradient's scatter-add) would read and write past wte otherwise. The
 * engine checks its batches on the host; these public calls take device
 * pointers, so a GPU's ids are copied back to be read (sampling's few). */
static dp_status check_tokens(const char *fn, const dp_gpt *gpt, dp_device *dev,
                              const int32_t *tokens, size_t n)
{
    int32_t *host = NULL;
    const int32_t *ids = tokens;
    if (dp_device_kind_of(dev) != DP_DEVICE_CPU) {
        if (!(host = malloc(n * sizeof *host)))
            return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu ids", fn, n);
        dp_status s = dp_copy_d2h(dev, host, tokens, n * sizeof *host);
        if (s != DP_OK) {
            free(host);
            return s;
        }
        ids = host;
    }
    size_t V = gpt->cfg.vocab_size, bad = gpt_first_bad_id(gpt, ids, n);
    int32_t id = bad < n ? ids[bad] : 0;
    free(host);
    if (bad == n) return DP_OK;
    return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                   "%s on %s: token id %d at position %zu is outside the vocabulary [0, %zu); "
                   "encode with a tokenizer whose vocabulary fits the model", fn,
                   dp_device_name(dev), (int)id, bad, V);
}

dp_status dp_gpt_forward(const dp_gpt *gpt, dp_device *dev, const float *params,
                         const int32_t *tokens, size_t B, size_t T, void *workspace,
                         float *logits)
{
    static const char fn[] = "dp_gpt_forward";
    carve c;
    DP_TRY(gpt_pass_check(fn, gpt, dev, B, T, 1, gpt ? &gpt->variants[0] : NULL, &c));
    if (!params || !tokens || !workspace || !logits)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "%s on %s: params, tokens, workspace and logits must not be NULL", fn,
                       dp_device_name(dev));
    DP_TRY(check_tokens(fn, gpt, dev, tokens, B * T));
    float *ws = workspace;
    DP_TRY(gpt_pass_body_forward(gpt, dev, view_f32(params), tokens, B, T, ws, &c, ws + c.lnf));
    return gpt_pass_head_forward(gpt, dev, view_f32(params), ws + c.lnf, B * T, logits);
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
    dp_dtype t16 = a->act16 ? DP_DTYPE_BF16 : DP_DTYPE_F32; /* qkvr's and atty's type */
    if (c->fused_att) /* from the kept q, k, v, attention output and normalisers */
        return dp_attention_backward_fused(dev, dqkv, big + c->big_delta, datty, a->qkvr, t16,
                                           a->lse, a->atty, t16, B, T, C, NH);
    if (c->chunked_att) /* each chunk's probabilities recomputed inside */
        return dp_attention_backward_chunked(
            dev, dqkv, dqkvr, again, a->act16 ? (dp_bf16 *)(big + c->big_att16) : NULL, datt,
            ascratch, datty, a->qkvr, a->act16 ? DP_DTYPE_BF16 : DP_DTYPE_F32, B, T, C, NH,
            c->att_rows);
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
dp_status gpt_pass_body_backward(const dp_gpt *gpt, dp_device *dev, wview params, float *grads,
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
    float *d16 = c.act16 ? big + c.big_d16 : NULL; /* the linears' dout in bf16, once */
    const float *final = L ? gpt_layer_of(&c, ws, L - 1).residual3 : ws + c.encoded;

    /* LayerNorm backward accumulates: the residual gradient starts at zero. */
    DP_TRY(dp_memset(dev, dresidual, 0, BT * C * sizeof(float)));
    size_t lf = idx_lnf_w(gpt);
    DP_TRY(ln_bwd(dev, dresidual, gw(gpt, grads, lf), gw(gpt, grads, lf + 1), dlnf, final,
                  pw(gpt, params, lf), ws + c.lnf_mean, ws + c.lnf_rstd, BT, C));
    DP_TRY(signal_from(gpt, chunk, lf, &signalled));

    for (size_t l = L; l-- > 0;) {
        layer_acts a = gpt_layer_of(&c, ws, l);
        const float *residual = l ? gpt_layer_of(&c, ws, l - 1).residual3 : ws + c.encoded;
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
        if (d16) { /* act16: d(fch_gelu) and d(fch) are bfloat16, in d16 */
            /* c_proj's dout rounded into dbtc (free until c_fc's dinp); the
             * float32 dinp, where the GEMM cannot write bfloat16, in dfch */
            dp_bf16 *dh16 = (dp_bf16 *)d16;
            DP_TRY(dp_linear_backward_to16_dgelu(dev, dh16, dfch, BT * 4 * C, G(BLK_MPROJ_W),
                                                 G(BLK_MPROJ_B), dresidual, (dp_bf16 *)dbtc,
                                                 gelu, DP_DTYPE_BF16, P(BLK_MPROJ_W),
                                                 (const dp_bf16 *)a.fch, BT, 4 * C, C));
            /* d(ln2 output) bfloat16 too, in dbtc (dfch: the float32 scratch) */
            DP_TRY(dp_linear_backward_to16(dev, (dp_bf16 *)dbtc, dfch, BT * C, G(BLK_FC_W),
                                           G(BLK_FC_B), NULL, dh16, a.ln2, DP_DTYPE_BF16,
                                           P(BLK_FC_W), BT, C, 4 * C));
            DP_TRY(dp_layernorm_backward_dout16(dev, dresidual, G(BLK_LN2_W), G(BLK_LN2_B),
                                                (const dp_bf16 *)dbtc, a.residual2, P(BLK_LN2_W),
                                                a.ln2_mean, a.ln2_rstd, BT, C));
        } else { /* float32 activations (d16 exists exactly with act16) */
            DP_TRY(lin_bwd(dev, dfch, G(BLK_MPROJ_W), G(BLK_MPROJ_B), dresidual, NULL,
                           gemm_in(&a, gelu), P(BLK_MPROJ_W), BT, 4 * C, C));
            DP_TRY(dp_gelu_backward(dev, dfch, a.fch, dfch, BT * 4 * C));
            DP_TRY(lin_bwd(dev, dbtc, G(BLK_FC_W), G(BLK_FC_B), dfch, NULL, gemm_in(&a, a.ln2),
                           P(BLK_FC_W), BT, C, 4 * C));
            DP_TRY(ln_bwd(dev, dresidual, G(BLK_LN2_W), G(BLK_LN2_B), dbtc, a.residual2,
                          P(BLK_LN2_W), a.ln2_mean, a.ln2_rstd, BT, C));
        }
        /* Attention. dresidual is now the full d(residual2). */
        float *dqkv = big;
        if (c.fused16) { /* d(atty) and dqkv bfloat16, each read as it is */
            /* c_proj's float32 dinp, where its GEMM cannot write bfloat16,
             * in dqkv's floats (written only by the attention after it) */
            DP_TRY(dp_linear_backward_to16(dev, (dp_bf16 *)dbtc, dqkv, BT * C, G(BLK_APROJ_W),
                                           G(BLK_APROJ_B), dresidual, (dp_bf16 *)d16, a.atty,
                                           DP_DTYPE_BF16, P(BLK_APROJ_W), BT, C, C));
            DP_TRY(dp_attention_backward_fused16(dev, (dp_bf16 *)dqkv, big + c.big_delta, dbtc,
                                                 DP_DTYPE_BF16, a.qkvr, DP_DTYPE_BF16, a.lse,
                                                 a.atty, DP_DTYPE_BF16, B, T, C, NH));
            /* d(ln1 output) bfloat16 too, in dbtc; the float32 scratch is
             * the attention's, free again, past dqkv's 3C */
            DP_TRY(dp_linear_backward_to16(dev, (dp_bf16 *)dbtc, big + c.big_scratch, BT * C,
                                           G(BLK_ATTN_W), G(BLK_ATTN_B), NULL,
                                           (dp_bf16 *)dqkv, a.ln1, DP_DTYPE_BF16,
                                           P(BLK_ATTN_W), BT, C, 3 * C));
            DP_TRY(dp_layernorm_backward_dout16(dev, dresidual, G(BLK_LN1_W), G(BLK_LN1_B),
                                                (const dp_bf16 *)dbtc, residual, P(BLK_LN1_W),
                                                a.ln1_mean, a.ln1_rstd, BT, C));
        } else {
            DP_TRY(lin_bwd(dev, dbtc, G(BLK_APROJ_W), G(BLK_APROJ_B), dresidual, d16,
                           gemm_in(&a, a.atty), P(BLK_APROJ_W), BT, C, C));
            DP_TRY(attention_backward(dev, &c, &a, big, dqkv, dbtc, B, T, C, NH));
            DP_TRY(lin_bwd(dev, dbtc, G(BLK_ATTN_W), G(BLK_ATTN_B), dqkv, d16,
                           gemm_in(&a, a.ln1), P(BLK_ATTN_W), BT, C, 3 * C));
            DP_TRY(ln_bwd(dev, dresidual, G(BLK_LN1_W), G(BLK_LN1_B), dbtc, residual,
                          P(BLK_LN1_W), a.ln1_mean, a.ln1_rstd, BT, C));
        }
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
    DP_TRY(gpt_pass_check(fn, gpt, dev, B, T, 1, gpt ? &gpt->variants[0] : NULL, &c));
    if (!params || !grads || !tokens || !workspace || !dlogits)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "%s on %s: params, grads, tokens, workspace and dlogits must not be NULL",
                       fn, dp_device_name(dev));
    DP_TRY(check_tokens(fn, gpt, dev, tokens, B * T));
    float *ws = workspace;
    /* LM head: d(lnf) into dbtc, free until the blocks' backward. */
    DP_TRY(gpt_pass_head_backward(gpt, dev, view_f32(params), grads, ws + c.lnf, B * T, dlogits,
                                  ws + c.dbtc));
    return gpt_pass_body_backward(gpt, dev, view_f32(params), grads, tokens, B, T, ws, &c,
                                  ws + c.dbtc, NULL);
}

