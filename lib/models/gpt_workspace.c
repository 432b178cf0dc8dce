/*
 * models/gpt_workspace.c - the GPT's activation workspace (gpt_internal.h):
 * where each block's kept activations and the backward's scratch live,
 * llm.c's layout.
 */
#include "kernels/flash.h" /* DP_FLASH_HS_MAX16 */
#include "models/gpt_internal.h"

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
int gpt_make_carve(const gpt_variant *v, size_t B, size_t T, int keep_lnf, carve *c)
{
    int of = 0;
    const dp_gpt_config *cfg = &v->g->cfg;
    int act16 = v->act16, recompute_att = v->recompute_att || v->chunked_att;
    int fused = v->fused_att; /* keeps no probabilities either, recomputes none outside */
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
    c->fused_att = fused;
    c->fused16 = act16 && fused && C / NH <= DP_FLASH_HS_MAX16;
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
    c->l_att = recompute_att || fused ? 0 : place(&at, BNHTT, &of);
    c->l_lse = fused ? place(&at, BNHT, &of) : 0;
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
    c->big_dqkvr = fused ? 0 : place(&bat, x3, &of); /* the fused backward needs none */
    c->big_scratch = place(&bat, BTC, &of);
    if (fused) {
        c->big_delta = place(&bat, BNHT, &of);
    } else {
        c->big_datt = place(&bat, scores, &of);
        if (recompute_att) c->big_att = place(&bat, scores, &of); /* the probabilities, again */
        /* their bfloat16 copy, for the GEMMs (dp_attention_forward_chunked) */
        if (act16 && v->chunked_att) c->big_att16 = place(&bat, scores / 2 + 1, &of);
    }
    size_t mat = 0;
    place(&mat, x4, &of); /* dfch at 0 */
    if (c->recompute_gelu) c->big_gelu = place(&mat, in4, &of); /* the GELU output, again */
    /* the blocks' linear backwards' dout rounded once: at most (B,T,4C) bfloat16 */
    if (act16) c->big_d16 = place(&mat, x4 / 2, &of);
    size_t big = bat > mat ? bat : mat;
    c->big = place(&at, big, &of);
    c->floats = at;
    if (c->floats > SIZE_MAX / sizeof(float)) of = 1;
    return !of;
}

layer_acts gpt_layer_of(const carve *c, float *ws, size_t l)
{
    float *b = ws + c->layer0 + l * c->layer_stride;
    layer_acts a;
    a.ln1 = b + c->l_ln1;
    a.ln1_mean = b + c->l_ln1_mean;
    a.ln1_rstd = b + c->l_ln1_rstd;
    a.qkvr = b + c->l_qkvr;
    a.att = c->recompute_att || c->fused_att ? NULL : b + c->l_att;
    a.lse = c->fused_att ? b + c->l_lse : NULL;
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
    if (!gpt_make_carve(&gpt->variants[0], B, T, 1, &c)) return SIZE_MAX;
    return c.floats * sizeof(float);
}

