/*
 * The GPT with fused attention (DP_GPT_FUSED_ATTENTION:
 * dp_attention_forward_fused, no probabilities in memory, each layer
 * keeping only the logs of its softmax normalisers) through the engine on
 * CPU devices (the fused kernels' CPU reference):
 *
 *  - it tracks the whole-matrix training to float32 rounding in every
 *    variant (float32, bf16 replicas, bf16 activations) and both matmul
 *    precisions, on 2 devices with micro-batches, from the initial weights
 *    and from 4x them (peaked attention), and it is never the whole
 *    matrix's bits (the key sums really run in another order);
 *  - two runs give the same bits, and sharding stays bitwise the root
 *    update;
 *  - its workspace keeps (B,NH,T) floats per layer and no probabilities,
 *    less than the chunked variant's;
 *  - the flags select it, with or without DP_GPT_RECOMPUTE_ATTENTION, and
 *    refuse it together with DP_GPT_CHUNKED_ATTENTION.
 * (The layer itself is checked against float64 in test_attention_fused.)
 */
#include <math.h>
#include <string.h>

#include "dp_test.h"

/* A context past two of the CUDA kernels' 64-row tiles. */
enum { V = 37, T = 150, L = 2, NH = 2, C = 16, ROWS = 4 };
enum { STEPS = 5, MAXP = 20000 };

static dp_gpt *make_gpt(size_t block_size)
{
    dp_gpt_config cfg = {
        .vocab_size = V, .block_size = block_size, .n_layer = L, .n_head = NH, .n_embd = C};
    dp_gpt *g = NULL;
    dp_assert_ok(dp_gpt_create(&cfg, &g));
    cr_assert_leq(dp_gpt_model(g, 0)->n_params, MAXP);
    return g;
}

static dp_engine *open_engine(const dp_model *m, int prec, int shard)
{
    dp_device_spec specs[2] = {{DP_DEVICE_CPU, 0}, {DP_DEVICE_CPU, 1}};
    dp_engine_config c = dp_engine_config_default();
    c.optim.lr = 3e-3f;
    c.optim.weight_decay = 0.1f;
    c.optim.grad_clip = 1.0f;
    c.seed = 29;
    c.max_rows_per_micro = 1; /* two micro-batches per device */
    c.matmul_precision = prec ? DP_MATMUL_BF16 : DP_MATMUL_FP32;
    c.shard_optimizer = shard;
    dp_criterion crit = dp_criterion_cross_entropy();
    dp_engine *e = NULL;
    dp_assert_ok(dp_engine_create(specs, 2, m, &crit, &c, &e));
    return e;
}

/* Step s on random tokens (targets the next token, some ignored). */
static dp_step_stats step(dp_engine *e, int s)
{
    static int32_t tok[ROWS * T], tgt[ROWS * T];
    dp_rng rng;
    dp_rng_seed(&rng, 700 + (uint64_t)s);
    for (size_t i = 0; i < ROWS * T; i++) tok[i] = (int32_t)dp_rng_below(&rng, V);
    for (size_t i = 0; i < ROWS * T; i++)
        tgt[i] = i % 13 == 4 ? -1 : (i + 1) % T ? tok[i + 1] : (int32_t)(i % V);
    dp_batch b = {ROWS, tok, tgt};
    dp_step_stats st;
    dp_assert_ok(dp_engine_step(e, &b, &st));
    cr_assert(!st.skipped);
    return st;
}

static const unsigned kinds[] = {0, DP_GPT_BF16, DP_GPT_BF16_ACT};

/* Against the whole-matrix run, with the chunked attention's bounds
 * (test_chunked_attention: both split the key sums, the fused one per
 * key rather than per chunk). FP32 math: losses within 1e-6 relative,
 * masters' mean difference within 0.1% of the mean distance training
 * moved them (AdamW turns a rounding in a near-zero gradient into up to
 * a whole lr step). BF16 math rounds every GEMM input, so a float32
 * rounding difference can flip a bfloat16 rounding: losses within 5e-4,
 * masters within 3% (measured: 2.0% at most, from sharp weights with bf16
 * activations, whose fused backward also rounds d(ln_1 output)). With
 * bf16 activations the fused backward also forms D from the
 * bfloat16-rounded attention output (dp/nn.h), a 2^-9 relative error in
 * every score gradient's D, and reads d(attention output) and writes
 * dqkv and d(ln_1 output) as bfloat16 (which the whole-matrix backward
 * keeps float32), which in FP32 math move the masters by 0.22%
 * (measured) rather than float32's 0.0001%: 0.5% there; and the logits
 * are bfloat16 (the bfloat16 head),
 * so a float32 difference can flip a logit's rounding, moving its row's
 * loss by up to 2^-8 of the logit (7e-6 of the mean loss here per flip):
 * losses within 5e-5 there (measured: 3.7e-6). */
Test(gpt_fused_attention, tracks_the_whole_matrix, .timeout = 240)
{
    dp_gpt *g = make_gpt(T);
    size_t n = dp_gpt_model(g, 0)->n_params;
    static float p0[MAXP], pa[MAXP], pb[MAXP];
    for (int kind = 0; kind < 3; kind++)
        for (int run = 0; run < 3; run++) {
            /* runs: FP32, BF16 math, BF16 from 4x the initial weights */
            int prec = run >= 1, sharp = run == 2;
            dp_engine *a = open_engine(dp_gpt_model(g, kinds[kind]), prec, 0);
            dp_engine *b = open_engine(dp_gpt_model(g, kinds[kind] | DP_GPT_FUSED_ATTENTION),
                                       prec, 0);
            dp_assert_ok(dp_engine_get_params(a, p0));
            if (sharp) {
                for (size_t i = 0; i < n; i++) p0[i] *= 4.0f;
                dp_assert_ok(dp_engine_set_params(a, p0));
                dp_assert_ok(dp_engine_set_params(b, p0));
            }
            int same = 1;
            for (int s = 0; s < STEPS; s++) {
                dp_step_stats sa = step(a, s), sb = step(b, s);
                cr_log_info("kind %d run %d step %d: relative loss difference %.3g", kind, run, s,
                            fabs(sa.loss - sb.loss) / fabs(sa.loss));
                double tol = prec ? 5e-4 : kinds[kind] & DP_GPT_BF16_ACT ? 5e-5 : 1e-6;
                cr_assert(fabs(sa.loss - sb.loss) <= tol * fabs(sa.loss),
                          "kind %d run %d step %d: loss %.9g whole, %.9g fused", kind, run, s,
                          sa.loss, sb.loss);
                same = same && sa.loss == sb.loss && sa.grad_norm == sb.grad_norm;
            }
            dp_assert_ok(dp_engine_get_params(a, pa));
            dp_assert_ok(dp_engine_get_params(b, pb));
            double diff, moved;
            dp_test_param_drift(pa, pb, p0, n, &diff, &moved);
            cr_log_info("kind %d run %d: mean difference %.3g of mean move %.3g (%.4f%%)", kind,
                        run, diff / n, moved / n, 100.0 * diff / moved);
            double bound = prec ? 0.03 : kinds[kind] & DP_GPT_BF16_ACT ? 0.005 : 0.001;
            cr_assert_leq(diff, bound * moved,
                          "kind %d run %d: masters differ by %g on average, training moved them "
                          "by %g", kind, run, diff / n, moved / n);
            same = same && memcmp(pa, pb, n * sizeof *pa) == 0;
            cr_assert(!same, "kind %d run %d: the fused run is bitwise the whole-matrix run",
                      kind, run);
            dp_engine_destroy(a);
            dp_engine_destroy(b);
        }
    dp_gpt_destroy(g);
}

/* Deterministic: two runs are the same bits; sharding the optimizer is
 * the root update bit for bit. */
Test(gpt_fused_attention, repeats_and_shards_bitwise, .timeout = 120)
{
    dp_gpt *g = make_gpt(T);
    const dp_model *m = dp_gpt_model(g, DP_GPT_BF16_ACT | DP_GPT_FUSED_ATTENTION);
    size_t n = m->n_params;
    static float pa[MAXP], pb[MAXP], pc[MAXP];
    dp_engine *a = open_engine(m, 1, 0), *b = open_engine(m, 1, 0), *c = open_engine(m, 1, 1);
    for (int s = 0; s < 3; s++) {
        dp_step_stats sa = step(a, s), sb = step(b, s), sc = step(c, s);
        cr_assert(sa.loss == sb.loss && sa.grad_norm == sb.grad_norm,
                  "step %d: %.17g vs %.17g again", s, sa.loss, sb.loss);
        cr_assert(sa.loss == sc.loss, "step %d: %.17g vs %.17g sharded", s, sa.loss, sc.loss);
    }
    dp_assert_ok(dp_engine_get_params(a, pa));
    dp_assert_ok(dp_engine_get_params(b, pb));
    dp_assert_ok(dp_engine_get_params(c, pc));
    cr_assert(memcmp(pa, pb, n * sizeof *pa) == 0, "a second run's masters differ");
    cr_assert(memcmp(pa, pc, n * sizeof *pa) == 0, "sharded masters differ");
    dp_engine_destroy(a);
    dp_engine_destroy(b);
    dp_engine_destroy(c);
    dp_gpt_destroy(g);
}

/* The workspace: against the variant that recomputes the whole matrix
 * (no probabilities kept either), each layer adds its normalisers' logs,
 * rows*NH*T floats, and the backward's attention scratch loses its two
 * (rows,NH,T,T) probability buffers for one (rows,NH,T) D, and dqkvr
 * (3 btc: the fused backward writes dqkv directly, the forward's permute
 * the kept qkvr); the chunked variant's two chunk buffers are gone too,
 * so fused < chunked. The MLP half of the scratch (dfch, 4 btc, and with
 * bfloat16 activations the linears' bfloat16 dout, 2 btc) may then be
 * the larger. Up to the slots' alignment. */
Test(gpt_fused_attention, workspace_keeps_only_the_normalisers)
{
    dp_gpt_config cfg = {
        .vocab_size = 97, .block_size = 256, .n_layer = 3, .n_head = 4, .n_embd = 32};
    dp_gpt *g = NULL;
    dp_assert_ok(dp_gpt_create(&cfg, &g));
    size_t bs = cfg.block_size;
    for (int kind = 0; kind < 3; kind++)
        for (size_t rows = 1; rows <= 4; rows *= 2) {
            const dp_model *r = dp_gpt_model(g, kinds[kind] | DP_GPT_RECOMPUTE_ATTENTION);
            const dp_model *f = dp_gpt_model(g, kinds[kind] | DP_GPT_FUSED_ATTENTION);
            const dp_model *ch = dp_gpt_model(g, kinds[kind] | DP_GPT_CHUNKED_ATTENTION);
            size_t wr = r->workspace_bytes(r->ctx, rows), wf = f->workspace_bytes(f->ctx, rows),
                   wc = ch->workspace_bytes(ch->ctx, rows);
            size_t btc = rows * bs * cfg.n_embd, bnht = rows * cfg.n_head * bs,
                   bnhtt = bnht * bs, mlp = kinds[kind] == DP_GPT_BF16_ACT ? 6 * btc : 4 * btc;
            size_t attn_r = 7 * btc + 2 * bnhtt, attn_f = 4 * btc + bnht;
            size_t big_r = attn_r > mlp ? attn_r : mlp, big_f = attn_f > mlp ? attn_f : mlp;
            long long want =
                ((long long)big_r - (long long)big_f - (long long)(cfg.n_layer * bnht)) *
                (long long)sizeof(float);
            long long saved = (long long)wr - (long long)wf,
                      slack = (long long)(2 * cfg.n_layer + 2) * 512;
            cr_assert(saved + slack >= want && saved <= want + slack,
                      "kind %d rows %zu: saved %lld bytes, want %lld (+-%lld)", kind, rows, saved,
                      want, slack);
            cr_assert_lt(wf, wc, "kind %d rows %zu: fused %zu bytes, chunked %zu", kind, rows,
                         wf, wc);
        }
    dp_gpt_destroy(g);
}

Test(gpt_fused_attention, flags_select_it)
{
    dp_gpt *g = make_gpt(16);
    for (int kind = 0; kind < 3; kind++) {
        const dp_model *f = dp_gpt_model(g, kinds[kind] | DP_GPT_FUSED_ATTENTION);
        cr_assert_not_null(f);
        cr_assert_eq(f, dp_gpt_model(g, kinds[kind] | DP_GPT_FUSED_ATTENTION |
                                            DP_GPT_RECOMPUTE_ATTENTION));
        cr_assert_neq(f, dp_gpt_model(g, kinds[kind] | DP_GPT_CHUNKED_ATTENTION));
        cr_assert_neq(f, dp_gpt_model(g, kinds[kind] | DP_GPT_RECOMPUTE_ATTENTION));
        cr_assert_neq(f, dp_gpt_model(g, kinds[kind] | DP_GPT_FUSED_ATTENTION |
                                             DP_GPT_RECOMPUTE_GELU));
        cr_assert_null(dp_gpt_model(g, kinds[kind] | DP_GPT_FUSED_ATTENTION |
                                           DP_GPT_CHUNKED_ATTENTION));
        cr_assert_eq(f->param_dtype, kind ? DP_DTYPE_BF16 : DP_DTYPE_F32);
    }
    dp_gpt_destroy(g);
}
