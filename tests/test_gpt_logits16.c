/*
 * The GPT's logits chunks in bfloat16 (dp_model.head_forward_bf16 and
 * head_backward_bf16, llm.c's fused classifier): with bf16 activations
 * (DP_GPT_BF16_ACT) the head writes each chunk's logits as bfloat16, the
 * bundled cross-entropy (dp_criterion.bf16_logits) reads them and writes
 * bfloat16 dlogits in place, and the head's backward GEMMs read those. On
 * CPU devices, through the engine:
 *
 *  - it tracks the float32 logits of the same model (a criterion without
 *    bf16_logits: the engine then runs the float32 head) within the bound
 *    that rounding each logit and each dlogit to bfloat16 allows;
 *  - two runs give the same bits; 2 devices track 1;
 *  - a device holds a bfloat16 chunk and the head's float32 scratch;
 *  - an incomplete bfloat16 head is refused;
 *  - dp_linear_backward_from16 is the rounded backward's bits.
 */
#include <math.h>
#include <string.h>

#include "dp_test.h"
#include "nn/nn_act16.h"
#include "nn_test_util.h"

enum { V = 300, T = 24, L = 2, NH = 2, C = 32, ROWS = 6 };
enum { STEPS = 4, MAXP = 40000 };

static dp_gpt *make_gpt(void)
{
    dp_gpt_config cfg = {.vocab_size = V, .block_size = T, .n_layer = L, .n_head = NH, .n_embd = C};
    dp_gpt *g = NULL;
    dp_assert_ok(dp_gpt_create(&cfg, &g));
    cr_assert_leq(dp_gpt_model(g, 0)->n_params, MAXP);
    return g;
}

/* The bundled cross-entropy without bf16_logits: the engine keeps the
 * float32 head for it. */
static dp_status plain_fb(void *ctx, const dp_criterion_args *a, double *loss, size_t *count)
{
    const dp_criterion *inner = ctx;
    return inner->forward_backward(inner->ctx, a, loss, count);
}

static size_t plain_scratch(void *ctx, size_t n, size_t v)
{
    const dp_criterion *inner = ctx;
    return inner->scratch_bytes(inner->ctx, n, v);
}

static dp_engine *open_engine(const dp_model *m, size_t k, int bf16_math, int b16,
                              const dp_criterion *ce)
{
    dp_device_spec specs[2] = {{DP_DEVICE_CPU, 0}, {DP_DEVICE_CPU, 1}};
    dp_engine_config c = dp_engine_config_default();
    c.optim.lr = 3e-3f;
    c.optim.weight_decay = 0.1f;
    c.optim.grad_clip = 1.0f;
    c.seed = 31;
    c.logits_chunk_rows = 40; /* chunks cut sequences; the last of a device is short */
    c.matmul_precision = bf16_math ? DP_MATMUL_BF16 : DP_MATMUL_FP32;
    dp_criterion plain = {(void *)ce, plain_scratch, plain_fb, DP_TARGET_CLASS, 1, 0, 0};
    dp_engine *e = NULL;
    dp_assert_ok(dp_engine_create(specs, k, m, b16 ? ce : &plain, &c, &e));
    return e;
}

/* Step s on random tokens (targets the next token, some ignored). */
static dp_step_stats step(dp_engine *e, int s, int train)
{
    static int32_t tok[ROWS * T], tgt[ROWS * T];
    dp_rng rng;
    dp_rng_seed(&rng, 900 + (uint64_t)s);
    for (size_t i = 0; i < ROWS * T; i++) tok[i] = (int32_t)dp_rng_below(&rng, V);
    for (size_t i = 0; i < ROWS * T; i++)
        tgt[i] = i % 11 == 3 ? -1 : (i + 1) % T ? tok[i + 1] : (int32_t)(i % V);
    dp_batch b = {ROWS, tok, tgt};
    dp_step_stats st;
    dp_assert_ok(train ? dp_engine_step(e, &b, &st) : dp_engine_evaluate(e, &b, &st));
    cr_assert(!st.skipped);
    return st;
}

/*
 * bfloat16 against float32 logits. Rounding a logit x to bfloat16 moves
 * it by at most u|x| (u = 2^-9), so a row's loss log sum exp(x) - x_t by
 * at most 2u max|x|: below 0.016 with these logits (|x| < 4), the bound
 * if every rounding went one way; they do not, and over 144 rows the mean
 * moves far less: 2e-3 (measured: 8e-5). The dlogits' rounding (u of
 * each) and the logits' move the gradients by a few u relative; after
 * STEPS AdamW steps the masters differ by a small fraction of the
 * distance training moved them (AdamW turns a small gradient change into
 * up to an lr step where the gradient is near zero): 3% (measured: 0.5%),
 * against about 100% for unrelated runs.
 */
Test(gpt_logits16, tracks_float32_logits, .timeout = 120)
{
    dp_gpt *g = make_gpt();
    dp_criterion ce = dp_criterion_cross_entropy();
    cr_assert(ce.bf16_logits, "the bundled cross-entropy takes bfloat16 logits");
    const dp_model *m = dp_gpt_model(g, DP_GPT_BF16_ACT);
    cr_assert(m->head_forward_bf16 && m->head_backward_bf16);
    cr_assert(!dp_gpt_model(g, DP_GPT_BF16)->head_forward_bf16,
              "only the bf16-activation GPT has the bfloat16 head");
    size_t n = m->n_params;
    static float p0[MAXP], pa[MAXP], pb[MAXP];
    for (int math = 0; math < 2; math++) {
        dp_engine *a = open_engine(m, 2, math, 0, &ce), *b = open_engine(m, 2, math, 1, &ce);
        dp_assert_ok(dp_engine_get_params(a, p0));
        int same = 1;
        for (int s = 0; s < STEPS; s++) {
            dp_step_stats sa = step(a, s, 1), sb = step(b, s, 1);
            cr_log_info("math %d step %d: loss %.6f float32 logits, %.6f bfloat16", math, s,
                        sa.loss, sb.loss);
            cr_assert(fabs(sa.loss - sb.loss) <= 2e-3, "math %d step %d: loss %.9g vs %.9g",
                      math, s, sa.loss, sb.loss);
            same = same && sa.loss == sb.loss;
        }
        dp_step_stats ea = step(a, 9, 0), eb = step(b, 9, 0);
        cr_assert(fabs(ea.loss - eb.loss) <= 2e-3, "math %d evaluation: %.9g vs %.9g", math,
                  ea.loss, eb.loss);
        dp_assert_ok(dp_engine_get_params(a, pa));
        dp_assert_ok(dp_engine_get_params(b, pb));
        double diff, moved;
        dp_test_param_drift(pa, pb, p0, n, &diff, &moved);
        cr_log_info("math %d: masters differ by %.4f%% of the distance trained", math,
                    100.0 * diff / moved);
        cr_assert_leq(diff, 0.03 * moved, "math %d: masters differ by %g, moved %g", math, diff,
                      moved);
        cr_assert(!same, "math %d: bfloat16 logits gave float32's losses exactly: not used?",
                  math);
        dp_engine_destroy(a);
        dp_engine_destroy(b);
    }
    dp_gpt_destroy(g);
}

/* Two runs, the same bits; 2 devices track 1 (the float sums regroup);
 * a device holds the bfloat16 chunk and the head's float32 scratch. */
Test(gpt_logits16, repeats_bitwise_and_two_devices_track_one, .timeout = 120)
{
    dp_gpt *g = make_gpt();
    dp_criterion ce = dp_criterion_cross_entropy();
    const dp_model *m = dp_gpt_model(g, DP_GPT_BF16_ACT);
    size_t n = m->n_params;
    static float p[3][MAXP];
    double loss[3][STEPS];
    const size_t ks[3] = {2, 2, 1};
    for (int r = 0; r < 3; r++) {
        dp_engine *e = open_engine(m, ks[r], 1, 1, &ce);
        for (int s = 0; s < STEPS; s++) {
            dp_step_stats st = step(e, s, 1);
            loss[r][s] = st.loss;
            if (s == 0 && r == 0) {
                /* 72 output rows per device, chunks of 40: 40 bf16 rows (256-aligned)
                 * and max(40 * V / 2, V) + 40 * C + 64 floats of scratch */
                size_t b16 = (40 * V * 2 + 255) / 256 * 256,
                       want = b16 + (40 * V / 2 + 40 * C + 64) * 4;
                cr_assert_eq(st.devices[0].logits_bytes, want, "logits bytes %zu, want %zu",
                             st.devices[0].logits_bytes, want);
            }
        }
        dp_assert_ok(dp_engine_get_params(e, p[r]));
        dp_engine_destroy(e);
    }
    cr_assert(memcmp(loss[0], loss[1], sizeof loss[0]) == 0 &&
                  memcmp(p[0], p[1], n * sizeof(float)) == 0,
              "two runs of the same configuration differ");
    for (int s = 0; s < STEPS; s++)
        cr_assert(fabs(loss[0][s] - loss[2][s]) <= 2e-3 * fabs(loss[2][s]),
                  "step %d: 2 devices %.9g, 1 device %.9g", s, loss[0][s], loss[2][s]);
    dp_gpt_destroy(g);
}

static dp_status no_head16(void *ctx, dp_device *dev, dp_params params, const float *features,
                           size_t m, uint16_t *logits, float *scratch, size_t scratch_floats)
{
    return DP_OK;
}

/* Both bfloat16 callbacks beside a float32 head, or neither. */
Test(gpt_logits16, an_incomplete_bfloat16_head_is_refused)
{
    dp_gpt *g = make_gpt();
    dp_model m = *dp_gpt_model(g, DP_GPT_BF16_ACT);
    m.head_backward_bf16 = NULL;
    cr_assert_eq(dp_model_validate(&m), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "head_backward_bf16 NULL") != NULL, "%s", dp_last_error());
    m = *dp_gpt_model(g, DP_GPT_BF16_ACT);
    m.head_forward_bf16 = no_head16;
    dp_assert_ok(dp_model_validate(&m));
    m.head_features = 0;
    m.head_forward = NULL;
    m.head_backward = NULL;
    cr_assert_eq(dp_model_validate(&m), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "head unset") != NULL, "%s", dp_last_error());
    dp_gpt_destroy(g);
}

/* dp_linear_backward_from16: in BF16 math the bits of the backward that
 * rounds dout once (the same GEMM calls), in FP32 math of the float32
 * backward of the widened dout; the bias gradient that of the widened dout
 * in both. */
Test(gpt_logits16, linear_backward_from16_is_the_rounded_backward)
{
    enum { N = 9, IC = 24, OC = 70 };
    for (int math = 0; math < 2; math++) {
        dp_device *dev = dp_test_cpu(0);
        dp_assert_ok(dp_device_set_matmul_precision(dev, math ? DP_MATMUL_BF16 : DP_MATMUL_FP32));
        float hx[N * IC], hw[OC * IC], hd[N * OC];
        uint16_t hd16[N * OC];
        dp_rng rng;
        dp_rng_seed(&rng, 5);
        for (size_t i = 0; i < N * IC; i++) hx[i] = dp_rng_uniform(&rng) - 0.5f;
        for (size_t i = 0; i < OC * IC; i++) hw[i] = dp_rng_uniform(&rng) - 0.5f;
        for (size_t i = 0; i < N * OC; i++) hd[i] = dp_rng_uniform(&rng) - 0.5f;
        for (size_t i = 0; i < N * OC; i++) {
            hd16[i] = dp_bf16_round(hd[i]);
            hd[i] = dp_bf16_widen(hd16[i]); /* dout is its rounding: the same values */
        }
        float *x = dp_test_upload(dev, hx, N * IC), *w = dp_test_upload(dev, hw, OC * IC);
        float *d = dp_test_upload(dev, hd, N * OC);
        dp_bf16 *d16 = NULL;
        dp_assert_ok(dp_device_alloc(dev, sizeof hd16, (void **)&d16));
        cr_assert(d16);
        dp_assert_ok(dp_copy_h2d(dev, d16, hd16, sizeof hd16));
        float *dx[2], *dw[2], *db[2], rx[2][N * IC], rw[2][OC * IC], rb[2][OC];
        for (int r = 0; r < 2; r++) {
            dx[r] = dp_test_nn_filled(dev, N * IC, 7.0f);
            dw[r] = dp_test_nn_filled(dev, OC * IC, 0.5f);
            db[r] = dp_test_nn_filled(dev, OC, -0.25f);
        }
        dp_pref pw = dp_pref_f32(w);
        dp_assert_ok(dp_linear_backward_from16(dev, dx[0], dw[0], db[0], d16, x, DP_DTYPE_F32,
                                               pw, N, IC, OC));
        /* d16 rounded again from d, its widening: the same bfloat16 values */
        dp_bf16 *again = NULL;
        dp_assert_ok(dp_device_alloc(dev, sizeof hd16, (void **)&again));
        dp_assert_ok(dp_linear_backward_dout16(dev, dx[1], dw[1], db[1], d, again, x,
                                               DP_DTYPE_F32, pw, N, IC, OC));
        for (int r = 0; r < 2; r++) {
            dp_assert_ok(dp_copy_d2h(dev, rx[r], dx[r], sizeof rx[r]));
            dp_assert_ok(dp_copy_d2h(dev, rw[r], dw[r], sizeof rw[r]));
            dp_assert_ok(dp_copy_d2h(dev, rb[r], db[r], sizeof rb[r]));
        }
        cr_assert(memcmp(rx[0], rx[1], sizeof rx[0]) == 0, "math %d: dinp differs", math);
        cr_assert(memcmp(rw[0], rw[1], sizeof rw[0]) == 0, "math %d: dweight differs", math);
        cr_assert(memcmp(rb[0], rb[1], sizeof rb[0]) == 0, "math %d: dbias differs", math);
        cr_assert(rb[0][0] != -0.25f, "the bias gradient was not added");
        dp_test_nn_assert_invalid(dp_linear_backward_from16(dev, dx[0], dw[0], NULL, NULL, x,
                                                            DP_DTYPE_F32, pw, N, IC, OC),
                                  "dout16", NULL);
        dp_test_nn_assert_invalid(dp_linear_backward_from16(dev, dx[0], dw[0], (float *)d16,
                                                            d16, x, DP_DTYPE_F32, pw, N, IC, OC),
                                  "overlap", "dbias");
        dp_device_free(dev, again);
        dp_device_free(dev, db[0]);
        dp_device_free(dev, db[1]);
        void *bufs[] = {x, w, d, d16, dx[0], dx[1], dw[0], dw[1]};
        for (size_t i = 0; i < 8; i++) dp_device_free(dev, bufs[i]);
        dp_device_close(dev);
    }
}
