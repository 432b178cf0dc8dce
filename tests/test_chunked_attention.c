/*
 * The GPT with chunked attention (DP_GPT_CHUNKED_ATTENTION: the attention
 * formed DP_GPT_ATTENTION_CHUNK queries at a time, nothing (T,T) kept or
 * formed) through the engine on CPU devices:
 *
 *  - with T <= the chunk it is one chunk, the whole-matrix calls, so every
 *    variant trains bit for bit as without the flag;
 *  - with T spanning three chunks it tracks the whole-matrix training to
 *    float32 rounding, in every variant and both matmul precisions, on 2
 *    devices with micro-batches, from the initial weights and from 4x them
 *    (peaked attention); sharding stays bitwise the root update;
 *  - its workspace holds no probabilities per layer and two chunk-sized
 *    scratches instead of two (B,NH,T,T);
 *  - the flags select it, alone or with DP_GPT_RECOMPUTE_ATTENTION;
 *  - dp_gpt_config.attention_chunk sets the chunk: 32 queries (five chunks)
 *    track the whole matrix as 64 do, with other bits than 64; a chunk
 *    of T or more is the whole matrix's bits; the workspace follows.
 * (The layer itself is checked against float64 and finite differences in
 * test_attention.)
 */
#include <math.h>
#include <string.h>

#include "dp_test.h"

/* Context of two whole chunks and a short one (64 + 64 + 22). */
enum { V = 37, T = 2 * DP_GPT_ATTENTION_CHUNK + 22, L = 2, NH = 2, C = 16, ROWS = 4 };
enum { STEPS = 5, MAXP = 20000 };

/* attention_chunk 0: DP_GPT_ATTENTION_CHUNK. */
static dp_gpt *make_gpt_chunk(size_t block_size, size_t attention_chunk)
{
    dp_gpt_config cfg = {.vocab_size = V,
                         .block_size = block_size,
                         .n_layer = L,
                         .n_head = NH,
                         .n_embd = C,
                         .attention_chunk = attention_chunk};
    dp_gpt *g = NULL;
    dp_assert_ok(dp_gpt_create(&cfg, &g));
    cr_assert_leq(dp_gpt_model(g, 0)->n_params, MAXP);
    return g;
}

static dp_gpt *make_gpt(size_t block_size) { return make_gpt_chunk(block_size, 0); }

static dp_engine *open_engine_ex(const dp_model *m, size_t k, int prec, int shard)
{
    dp_device_spec specs[2] = {{DP_DEVICE_CPU, 0}, {DP_DEVICE_CPU, 1}};
    dp_engine_config c = dp_engine_config_default();
    c.optim.lr = 3e-3f;
    c.optim.weight_decay = 0.1f;
    c.optim.grad_clip = 1.0f;
    c.seed = 23;
    c.max_rows_per_micro = 1; /* two micro-batches per device */
    c.matmul_precision = prec ? DP_MATMUL_BF16 : DP_MATMUL_FP32;
    c.shard_optimizer = shard;
    dp_criterion crit = dp_criterion_cross_entropy();
    dp_engine *e = NULL;
    dp_assert_ok(dp_engine_create(specs, k, m, &crit, &c, &e));
    return e;
}

static dp_engine *open_engine(const dp_model *m, size_t k, int prec)
{
    return open_engine_ex(m, k, prec, 0);
}

/* Step s on random tokens of block_size bs (targets the next token, some ignored). */
static dp_step_stats step(dp_engine *e, size_t bs, int s)
{
    static int32_t tok[ROWS * T], tgt[ROWS * T];
    dp_rng rng;
    dp_rng_seed(&rng, 900 + (uint64_t)s);
    for (size_t i = 0; i < ROWS * bs; i++) tok[i] = (int32_t)dp_rng_below(&rng, V);
    for (size_t i = 0; i < ROWS * bs; i++)
        tgt[i] = i % 11 == 5 ? -1 : (i + 1) % bs ? tok[i + 1] : (int32_t)(i % V);
    dp_batch b = {ROWS, tok, tgt};
    dp_step_stats st;
    dp_assert_ok(dp_engine_step(e, &b, &st));
    cr_assert(!st.skipped);
    return st;
}

static const unsigned kinds[] = {0, DP_GPT_BF16, DP_GPT_BF16_ACT};

Test(chunked_attention, one_chunk_is_the_whole_matrix_bitwise, .timeout = 60)
{
    dp_gpt *g = make_gpt(DP_GPT_ATTENTION_CHUNK);
    size_t n = dp_gpt_model(g, 0)->n_params;
    static float pa[MAXP], pb[MAXP];
    for (int kind = 0; kind < 3; kind++)
        for (int prec = 0; prec < 2; prec++) {
            dp_engine *a = open_engine(dp_gpt_model(g, kinds[kind]), 2, prec);
            dp_engine *b =
                open_engine(dp_gpt_model(g, kinds[kind] | DP_GPT_CHUNKED_ATTENTION), 2, prec);
            for (int s = 0; s < 3; s++) {
                dp_step_stats sa = step(a, DP_GPT_ATTENTION_CHUNK, s),
                              sb = step(b, DP_GPT_ATTENTION_CHUNK, s);
                cr_assert(sa.loss == sb.loss && sa.grad_norm == sb.grad_norm,
                          "kind %d prec %d step %d: loss %.17g vs %.17g", kind, prec, s, sa.loss,
                          sb.loss);
            }
            dp_assert_ok(dp_engine_get_params(a, pa));
            dp_assert_ok(dp_engine_get_params(b, pb));
            cr_assert(memcmp(pa, pb, n * sizeof *pa) == 0, "kind %d prec %d: masters differ",
                      kind, prec);
            dp_engine_destroy(a);
            dp_engine_destroy(b);
        }
    dp_gpt_destroy(g);
}

/* Three chunks against the whole-matrix run. FP32 math: losses within
 * 1e-7 relative (measured: 1.3e-9 at most); with bf16 activations the
 * logits are bfloat16 (the bfloat16 head), so a float32 difference can
 * flip a logit's rounding, which moves its row's loss by up to 2^-8 of
 * the logit (below 4 here: 0.016, 7e-6 of the mean loss over 600 rows):
 * 5e-5 (measured: 3.7e-7), masters' mean difference
 * within 0.1% of the mean distance training moved them (measured: 0.003%;
 * AdamW turns a rounding in a near-zero gradient into up to a whole lr
 * step). BF16 math rounds every GEMM input, the probabilities too, so a
 * float32 rounding difference can flip a bfloat16 rounding: losses within
 * 5e-4 (measured: 5.2e-5), masters within 3% (measured: 0.44%, from sharp
 * weights). The chunked run is never the whole-matrix run's bits (the
 * chunks really split the sums). */
Test(chunked_attention, three_chunks_track_the_whole_matrix, .timeout = 240)
{
    dp_gpt *g = make_gpt(T);
    size_t n = dp_gpt_model(g, 0)->n_params;
    static float p0[MAXP], pa[MAXP], pb[MAXP];
    for (int kind = 0; kind < 3; kind++)
        for (int run = 0; run < 3; run++) {
            /* runs: FP32, BF16 math, BF16 from 4x the initial weights */
            int prec = run >= 1, sharp = run == 2;
            dp_engine *a = open_engine(dp_gpt_model(g, kinds[kind]), 2, prec);
            dp_engine *b =
                open_engine(dp_gpt_model(g, kinds[kind] | DP_GPT_CHUNKED_ATTENTION), 2, prec);
            dp_assert_ok(dp_engine_get_params(a, p0));
            if (sharp) {
                for (size_t i = 0; i < n; i++) p0[i] *= 4.0f;
                dp_assert_ok(dp_engine_set_params(a, p0));
                dp_assert_ok(dp_engine_set_params(b, p0));
            }
            int same = 1;
            for (int s = 0; s < STEPS; s++) {
                dp_step_stats sa = step(a, T, s), sb = step(b, T, s);
                cr_log_info("kind %d run %d step %d: relative loss difference %.3g", kind, run, s,
                            fabs(sa.loss - sb.loss) / fabs(sa.loss));
                double tol = prec ? 5e-4 : kinds[kind] & DP_GPT_BF16_ACT ? 5e-5 : 1e-7;
                cr_assert(fabs(sa.loss - sb.loss) <= tol * fabs(sa.loss),
                          "kind %d run %d step %d: loss %.9g whole, %.9g chunked", kind, run, s,
                          sa.loss, sb.loss);
                same = same && sa.loss == sb.loss && sa.grad_norm == sb.grad_norm;
            }
            dp_assert_ok(dp_engine_get_params(a, pa));
            dp_assert_ok(dp_engine_get_params(b, pb));
            double diff, moved;
            dp_test_param_drift(pa, pb, p0, n, &diff, &moved);
            cr_log_info("kind %d run %d: mean difference %.3g of mean move %.3g (%.4f%%)", kind,
                        run, diff / n, moved / n, 100.0 * diff / moved);
            cr_assert_leq(diff, (prec ? 0.03 : 0.001) * moved,
                          "kind %d run %d: masters differ by %g on average, training moved them "
                          "by %g", kind, run, diff / n, moved / n);
            same = same && memcmp(pa, pb, n * sizeof *pa) == 0;
            cr_assert(!same, "kind %d run %d: chunked run is bitwise the whole-matrix run", kind,
                      run);
            dp_engine_destroy(a);
            dp_engine_destroy(b);
        }
    dp_gpt_destroy(g);
}

/* The engine's guarantees hold: the sharded update is the root's bit for bit. */
Test(chunked_attention, sharding_is_bitwise_the_root_update, .timeout = 120)
{
    dp_gpt *g = make_gpt(T);
    const dp_model *m = dp_gpt_model(g, DP_GPT_BF16_ACT | DP_GPT_CHUNKED_ATTENTION);
    size_t n = m->n_params;
    static float pa[MAXP], pb[MAXP];
    dp_engine *a = open_engine(m, 2, 1), *b = open_engine_ex(m, 2, 1, 1);
    for (int s = 0; s < 3; s++) {
        dp_step_stats sa = step(a, T, s), sb = step(b, T, s);
        cr_assert(sa.loss == sb.loss, "step %d: %.17g vs %.17g", s, sa.loss, sb.loss);
    }
    dp_assert_ok(dp_engine_get_params(a, pa));
    dp_assert_ok(dp_engine_get_params(b, pb));
    cr_assert(memcmp(pa, pb, n * sizeof *pa) == 0, "sharded masters differ");
    dp_engine_destroy(a);
    dp_engine_destroy(b);
    dp_gpt_destroy(g);
}

/* Against the whole-matrix variant the workspace loses the per-layer
 * probabilities (L x rows*NH*T*T floats) and the backward's scratch
 * shrinks where the attention half is the larger: its att and datt are
 * two rows*NH*chunk*T instead of one rows*NH*T*T datt (recompute: two),
 * and with bf16 activations a third in bfloat16 (att16: half as many
 * bytes). Up to the slots' alignment. */
Test(chunked_attention, workspace_holds_two_chunks)
{
    dp_gpt_config cfg = {.vocab_size = 97,
                         .block_size = 4 * DP_GPT_ATTENTION_CHUNK,
                         .n_layer = 3,
                         .n_head = 4,
                         .n_embd = 32};
    dp_gpt *g = NULL;
    dp_assert_ok(dp_gpt_create(&cfg, &g));
    size_t bs = cfg.block_size;
    for (int kind = 0; kind < 3; kind++)
        for (int recompute = 0; recompute < 2; recompute++)
            for (size_t rows = 1; rows <= 4; rows *= 2) {
                unsigned base = kinds[kind] | (recompute ? DP_GPT_RECOMPUTE_ATTENTION : 0);
                const dp_model *w = dp_gpt_model(g, base);
                const dp_model *ch = dp_gpt_model(g, kinds[kind] | DP_GPT_CHUNKED_ATTENTION);
                size_t ww = w->workspace_bytes(w->ctx, rows),
                       wc = ch->workspace_bytes(ch->ctx, rows);
                size_t btc = rows * bs * cfg.n_embd, bnhtt = rows * cfg.n_head * bs * bs,
                       chunk = rows * cfg.n_head * DP_GPT_ATTENTION_CHUNK * bs;
                size_t attn_w = 7 * btc + (recompute ? 2 : 1) * bnhtt,
                       attn_c = 7 * btc + 2 * chunk + (kinds[kind] & DP_GPT_BF16_ACT ? chunk / 2 : 0),
                       mlp = 4 * btc;
                size_t big_w = attn_w > mlp ? attn_w : mlp, big_c = attn_c > mlp ? attn_c : mlp;
                size_t want =
                    ((recompute ? 0 : cfg.n_layer * bnhtt) + big_w - big_c) * sizeof(float);
                cr_assert(ww > wc, "flags %#x rows %zu: %zu vs %zu bytes", base, rows, ww, wc);
                size_t saved = ww - wc, slack = (2 * cfg.n_layer + 2) * 512;
                cr_assert(saved + slack >= want && saved <= want + slack,
                          "flags %#x rows %zu: saved %zu bytes, want %zu (+-%zu)", base, rows,
                          saved, want, slack);
            }
    /* the flags pick the variant; RECOMPUTE_ATTENTION adds nothing to it */
    for (int kind = 0; kind < 3; kind++) {
        const dp_model *ch = dp_gpt_model(g, kinds[kind] | DP_GPT_CHUNKED_ATTENTION);
        cr_assert_not_null(ch);
        cr_assert_eq(ch, dp_gpt_model(g, kinds[kind] | DP_GPT_CHUNKED_ATTENTION |
                                                DP_GPT_RECOMPUTE_ATTENTION));
        cr_assert_neq(ch, dp_gpt_model(g, kinds[kind] | DP_GPT_RECOMPUTE_ATTENTION));
        cr_assert_neq(ch, dp_gpt_model(g, kinds[kind] | DP_GPT_CHUNKED_ATTENTION |
                                                 DP_GPT_RECOMPUTE_GELU));
        cr_assert_eq(ch->param_dtype, kind ? DP_DTYPE_BF16 : DP_DTYPE_F32);
    }
    cr_assert_null(dp_gpt_model(g, 0x40u), "an unknown flag must give NULL");
    dp_gpt_destroy(g);
}

/* The whole-matrix run and chunked runs with attention_chunk = 32 (five
 * chunks of T = 150), 0 (the default 64: three) and 1000 (>= T: one), FP32
 * math, steps and bounds as three_chunks_track_the_whole_matrix: 32 tracks
 * the whole matrix within the same bounds and differs from 64 (the chunk
 * really changed); 1000 is the whole matrix's bits. */
Test(chunked_attention, attention_chunk_sets_the_chunk, .timeout = 120)
{
    static const size_t chunks[] = {32, 0, 1000};
    dp_gpt *gw = make_gpt(T);
    size_t n = dp_gpt_model(gw, 0)->n_params;
    static float p0[MAXP], pw[MAXP], pc[3][MAXP];
    double lw[STEPS], lc[3][STEPS];
    dp_engine *w = open_engine(dp_gpt_model(gw, 0), 2, 0);
    dp_assert_ok(dp_engine_get_params(w, p0));
    for (int s = 0; s < STEPS; s++) lw[s] = step(w, T, s).loss;
    dp_assert_ok(dp_engine_get_params(w, pw));
    dp_engine_destroy(w);
    for (int i = 0; i < 3; i++) {
        dp_gpt *g = make_gpt_chunk(T, chunks[i]);
        cr_assert_eq(dp_gpt_config_of(g)->attention_chunk, chunks[i]);
        dp_engine *e = open_engine(dp_gpt_model(g, DP_GPT_CHUNKED_ATTENTION), 2, 0);
        for (int s = 0; s < STEPS; s++) {
            lc[i][s] = step(e, T, s).loss;
            cr_assert(fabs(lc[i][s] - lw[s]) <= 1e-7 * fabs(lw[s]),
                      "chunk %zu step %d: loss %.9g, whole %.9g", chunks[i], s, lc[i][s], lw[s]);
        }
        dp_assert_ok(dp_engine_get_params(e, pc[i]));
        double diff, moved;
        dp_test_param_drift(pw, pc[i], p0, n, &diff, &moved);
        cr_assert_leq(diff, 0.001 * moved, "chunk %zu: masters differ by %g, moved %g", chunks[i],
                      diff / n, moved / n);
        dp_engine_destroy(e);
        dp_gpt_destroy(g);
    }
    cr_assert(memcmp(pc[0], pc[1], n * sizeof *p0) != 0 ||
                  memcmp(lc[0], lc[1], sizeof lc[0]) != 0,
              "chunks of 32 gave the bits of chunks of 64");
    cr_assert(memcmp(pc[2], pw, n * sizeof *p0) == 0 && memcmp(lc[2], lw, sizeof lw) == 0,
              "one chunk of 1000 >= T is not the whole matrix's bits");
    dp_gpt_destroy(gw);
}

/* The chunked workspace's attention scratch is two (rows,NH,chunk,T), chunk
 * = min(attention_chunk, T): against the default 64, chunks of 16, 100,
 * T and 10^9 change it by 2 rows NH (chunk - 64) T floats where the
 * attention half of the backward's scratch is the larger (it is, with
 * these shapes), up to the slots' alignment. */
Test(chunked_attention, workspace_follows_attention_chunk)
{
    static const size_t asked[] = {16, 100, 4 * DP_GPT_ATTENTION_CHUNK, 1000000000};
    const size_t bs = 4 * DP_GPT_ATTENTION_CHUNK, nh = 4, rows = 2;
    dp_gpt_config cfg = {.vocab_size = 97, .block_size = bs, .n_layer = 3, .n_head = nh,
                         .n_embd = 32};
    dp_gpt *g0 = NULL;
    dp_assert_ok(dp_gpt_create(&cfg, &g0));
    const dp_model *m0 = dp_gpt_model(g0, DP_GPT_CHUNKED_ATTENTION);
    size_t w0 = m0->workspace_bytes(m0->ctx, rows);
    for (size_t i = 0; i < sizeof asked / sizeof *asked; i++) {
        cfg.attention_chunk = asked[i];
        dp_gpt *g = NULL;
        dp_assert_ok(dp_gpt_create(&cfg, &g));
        const dp_model *m = dp_gpt_model(g, DP_GPT_CHUNKED_ATTENTION);
        size_t w = m->workspace_bytes(m->ctx, rows), chunk = asked[i] < bs ? asked[i] : bs;
        double want = 2.0 * rows * nh * ((double)chunk - DP_GPT_ATTENTION_CHUNK) * bs * 4,
               got = (double)w - (double)w0;
        cr_assert(fabs(got - want) <= 2048, "chunk %zu: workspace changed by %.0f bytes, want %.0f",
                  asked[i], got, want);
        dp_gpt_destroy(g);
    }
    dp_gpt_destroy(g0);
}
