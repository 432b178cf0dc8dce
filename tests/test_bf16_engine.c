/*
 * bf16 replicas through the engine (dp_model.param_dtype = DP_DTYPE_BF16),
 * on the GPT's bf16 model and CPU devices:
 *
 *  - every replica holds the rounding of the owners' float32 masters,
 *    after every step, in root and sharded mode, after set_params and
 *    after a failed update's re-synchronisation;
 *  - in float32 matmul precision a bf16 replica's step computes exactly
 *    the float32 step at the rounded parameters (losses and gradients
 *    bitwise), and the master moves by exactly that gradient (SGD);
 *  - sharded equals root bitwise; k devices track one device; bf16
 *    training tracks float32 training; bf16 GEMMs (DP_MATMUL_BF16) too;
 *  - memory: replicas take 2 bytes per parameter, masters 4 on their
 *    owner (optimizer_bytes); the engine frees what it allocates;
 *  - refusals: a model of another param_dtype, a matmul precision out of
 *    range or contradicting allow_tf32;
 *  - bf16 activations: their producers (nn/nn_act16.h) train bitwise as
 *    the compositions they replace.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "backend/device_testing.h"
#include "dp_test.h"
#include "gpt_fixture.h"
#include "parallel/engine_testing.h"

enum { STEPS = 6, LONG = 30, MAXP = 20000 };

static dp_gpt *tiny_gpt(void)
{
    dp_gpt_config cfg = {
        .vocab_size = EV, .block_size = EBS, .n_layer = EL, .n_head = ENH, .n_embd = EC};
    dp_gpt *g = NULL;
    dp_assert_ok(dp_gpt_create(&cfg, &g));
    cr_assert_leq(dp_gpt_model(g, 0)->n_params, MAXP);
    return g;
}

static dp_engine_config base_cfg(void)
{
    dp_engine_config c = dp_engine_config_default();
    c.optim.lr = 3e-3f;
    c.optim.weight_decay = 0.1f;
    c.optim.grad_clip = 1.0f;
    c.seed = 11;
    return c;
}

static dp_engine *open_engine(const dp_model *m, size_t k, const dp_engine_config *cfg)
{
    dp_device_spec specs[DP_MAX_DEVICES];
    for (size_t i = 0; i < k; i++) specs[i] = (dp_device_spec){DP_DEVICE_CPU, (int)i};
    dp_criterion crit = dp_criterion_cross_entropy();
    dp_engine *e = NULL;
    dp_assert_ok(dp_engine_create(specs, k, m, &crit, cfg, &e));
    return e;
}

static dp_step_stats step(dp_engine *e, int s)
{
    int32_t tok[EROWS * EBS], tgt[EROWS * EBS];
    dp_test_gpt_batch(s, EROWS, tok, tgt);
    dp_batch b = {EROWS, tok, tgt};
    dp_step_stats st;
    dp_assert_ok(dp_engine_step(e, &b, &st));
    cr_assert(!st.skipped);
    return st;
}

/* Every local replica of e equals the rounding of the masters (rounded
 * here in double, not with dp's function). */
static void assert_replicas_are_rounded_masters(dp_engine *e, const char *what)
{
    size_t n = dp_engine_model(e)->n_params;
    static float master[MAXP];
    static dp_bf16 replica[MAXP];
    dp_assert_ok(dp_engine_get_params(e, master));
    for (size_t d = 0; d < dp_engine_num_devices(e); d++) {
        dp_assert_ok(dp_engine_read_replica(e, d, 0, replica));
        for (size_t i = 0; i < n; i++)
            if ((double)dp_bf16_to_float(replica[i]) != dp_test_bf16_value(master[i]))
                cr_assert_fail("%s: device %zu's replica[%zu] = %.9g, master %.9g rounds to %.9g",
                               what, d, i, (double)dp_bf16_to_float(replica[i]),
                               (double)master[i], dp_test_bf16_value(master[i]));
    }
}

/* The masters are not themselves bfloat16 values once training moved
 * them (else the master would be pointless). */
static size_t count_unrounded(dp_engine *e)
{
    static float master[MAXP];
    size_t n = dp_engine_model(e)->n_params, c = 0;
    dp_assert_ok(dp_engine_get_params(e, master));
    for (size_t i = 0; i < n; i++)
        c += dp_bf16_to_float(dp_bf16_from_float(master[i])) != master[i];
    return c;
}

Test(bf16_engine, replicas_are_the_rounded_masters, .timeout = 60)
{
    dp_gpt *g = tiny_gpt();
    for (int shard = 0; shard < 2; shard++)
        for (int prec = 0; prec < 2; prec++) {
            dp_engine_config c = base_cfg();
            c.shard_optimizer = shard;
            c.matmul_precision = prec ? DP_MATMUL_BF16 : DP_MATMUL_FP32;
            size_t before = dp_device_bytes_freed_at_close();
            dp_engine *e = open_engine(dp_gpt_model(g, DP_GPT_BF16), 3, &c);
            assert_replicas_are_rounded_masters(e, "after create");
            cr_assert_eq(count_unrounded(e), count_unrounded(e));
            for (int s = 0; s < STEPS; s++) {
                step(e, s);
                assert_replicas_are_rounded_masters(e, "after a step");
            }
            cr_assert_gt(count_unrounded(e), 100, "the masters hold only bfloat16 values");
            dp_engine_destroy(e);
            cr_assert_eq(dp_device_bytes_freed_at_close(), before, "the engine leaked");
        }
    dp_gpt_destroy(g);
}

/* set_params keeps the float32 values (get_params returns them exactly)
 * and rounds them into every replica. */
Test(bf16_engine, set_params_keeps_float32_masters, .timeout = 30)
{
    dp_gpt *g = tiny_gpt();
    dp_engine_config c = base_cfg();
    c.shard_optimizer = 1;
    dp_engine *e = open_engine(dp_gpt_model(g, DP_GPT_BF16), 2, &c);
    size_t n = dp_gpt_model(g, 0)->n_params;
    static float p[MAXP], back[MAXP];
    dp_rng rng;
    dp_rng_seed(&rng, 3);
    for (size_t i = 0; i < n; i++) p[i] = 0.1f * (dp_rng_uniform(&rng) - 0.5f);
    dp_assert_ok(dp_engine_set_params(e, p));
    dp_assert_ok(dp_engine_get_params(e, back));
    cr_assert(memcmp(p, back, n * sizeof *p) == 0, "the masters were rounded");
    assert_replicas_are_rounded_masters(e, "after set_params");
    /* finite in float32, infinite as bfloat16: refused, nothing changed */
    float keep = p[5];
    p[5] = FLT_MAX; /* rounds up to +Inf as bfloat16 */
    cr_assert_eq(dp_engine_set_params(e, p), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "parameter 5") && strstr(dp_last_error(), "bfloat16"),
              "%s", dp_last_error());
    p[5] = keep;
    dp_assert_ok(dp_engine_get_params(e, back));
    cr_assert(memcmp(p, back, n * sizeof *p) == 0, "a refused set_params changed the masters");
    assert_replicas_are_rounded_masters(e, "after a refused set_params");
    dp_engine_destroy(e);
    dp_gpt_destroy(g);
}

/* With float32 GEMMs, a bf16 replica computes the float32 model at the
 * rounded parameters: the same loss and gradient, bit for bit. SGD without
 * momentum, decay or clipping then moves the master by exactly -lr g. */
Test(bf16_engine, float32_math_on_bf16_replicas_is_the_float32_step_at_rounded_params,
     .timeout = 30)
{
    dp_gpt *g = tiny_gpt();
    size_t n = dp_gpt_model(g, 0)->n_params;
    dp_engine_config c = base_cfg();
    c.optim.kind = DP_OPTIMIZER_SGD;
    c.optim.lr = 0.5f;
    c.optim.momentum = 0.0f;
    c.optim.weight_decay = 0.0f;
    c.optim.grad_clip = 0.0f;
    dp_engine *e16 = open_engine(dp_gpt_model(g, DP_GPT_BF16), 1, &c);
    dp_engine *e32 = open_engine(dp_gpt_model(g, 0), 1, &c);
    static float master[MAXP], rounded[MAXP], g16[MAXP], g32[MAXP], after[MAXP];
    dp_assert_ok(dp_engine_get_params(e16, master));
    for (size_t i = 0; i < n; i++) rounded[i] = dp_bf16_to_float(dp_bf16_from_float(master[i]));
    dp_assert_ok(dp_engine_set_params(e32, rounded));
    dp_step_stats s16 = step(e16, 0), s32 = step(e32, 0);
    cr_assert_eq(s16.loss, s32.loss, "loss %.17g vs %.17g", s16.loss, s32.loss);
    cr_assert_eq(s16.grad_norm, s32.grad_norm);
    dp_assert_ok(dp_engine_read_replica(e16, 0, 1, g16));
    dp_assert_ok(dp_engine_read_replica(e32, 0, 1, g32));
    cr_assert(memcmp(g16, g32, n * sizeof *g16) == 0, "gradients differ");
    dp_assert_ok(dp_engine_get_params(e16, after));
    for (size_t i = 0; i < n; i++) {
        float want = master[i] - 0.5f * g16[i];
        if (memcmp(&after[i], &want, sizeof want) != 0)
            cr_assert_fail("master[%zu] = %.9g after the step, want %.9g - 0.5 * %.9g = %.9g", i,
                           (double)after[i], (double)master[i], (double)g16[i], (double)want);
    }
    dp_engine_destroy(e16);
    dp_engine_destroy(e32);
    dp_gpt_destroy(g);
}

typedef struct run_state {
    double loss[LONG];
    float p[MAXP], m[MAXP], v[MAXP];
    long t;
} run_state;

/* steps steps, on batch s at step s, or (fixed) batch 0 every time. */
static void train_n(const dp_model *model, size_t k, const dp_engine_config *c, int steps,
                    int fixed, run_state *r)
{
    dp_engine *e = open_engine(model, k, c);
    for (int s = 0; s < steps; s++) r->loss[s] = step(e, fixed ? 0 : s).loss;
    dp_assert_ok(dp_engine_get_params(e, r->p));
    dp_assert_ok(dp_engine_get_optimizer_state(e, r->m, r->v, &r->t));
    dp_engine_destroy(e);
}

static void train(const dp_model *model, size_t k, const dp_engine_config *c, run_state *r)
{
    train_n(model, k, c, STEPS, 0, r);
}

Test(bf16_engine, sharded_equals_root_bitwise, .timeout = 60)
{
    dp_gpt *g = tiny_gpt();
    size_t n = dp_gpt_model(g, 0)->n_params;
    static run_state a, b;
    for (size_t k = 1; k <= 3; k++)
        for (int prec = 0; prec < 2; prec++) {
            dp_engine_config c = base_cfg();
            c.matmul_precision = prec ? DP_MATMUL_BF16 : DP_MATMUL_FP32;
            train(dp_gpt_model(g, DP_GPT_BF16), k, &c, &a);
            c.shard_optimizer = 1;
            train(dp_gpt_model(g, DP_GPT_BF16), k, &c, &b);
            cr_assert(memcmp(a.loss, b.loss, sizeof a.loss) == 0, "k=%zu: losses differ", k);
            cr_assert(memcmp(a.p, b.p, n * sizeof *a.p) == 0, "k=%zu: masters differ", k);
            cr_assert(memcmp(a.m, b.m, n * sizeof *a.m) == 0, "k=%zu: m differs", k);
            cr_assert(memcmp(a.v, b.v, n * sizeof *a.v) == 0, "k=%zu: v differs", k);
            cr_assert_eq(a.t, b.t);
        }
    dp_gpt_destroy(g);
}

/* k devices sum the same per-row gradients in another order; in bf16 the
 * parameters the devices see are the same rounded values, so the runs
 * agree to float32 rounding of the gradient, amplified at most to a
 * rounding step of a master (AdamW normalises). */
Test(bf16_engine, k_devices_track_one_device, .timeout = 60)
{
    dp_gpt *g = tiny_gpt();
    size_t n = dp_gpt_model(g, 0)->n_params;
    static run_state one, many;
    for (int prec = 0; prec < 2; prec++) {
        dp_engine_config c = base_cfg();
        c.matmul_precision = prec ? DP_MATMUL_BF16 : DP_MATMUL_FP32;
        train(dp_gpt_model(g, DP_GPT_BF16), 1, &c, &one);
        train(dp_gpt_model(g, DP_GPT_BF16), 3, &c, &many);
        for (int s = 0; s < STEPS; s++)
            cr_assert(fabs(one.loss[s] - many.loss[s]) <= 1e-4 * fabs(one.loss[s]),
                      "%s step %d: loss %.9g on 1 device, %.9g on 3",
                      dp_matmul_precision_name(c.matmul_precision), s, one.loss[s], many.loss[s]);
        double worst = 0.0;
        for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)one.p[i] - many.p[i]));
        /* six AdamW steps of lr 3e-3 move a parameter by at most ~0.02 */
        cr_assert_leq(worst, 5e-3, "largest master difference %g", worst);
    }
    dp_gpt_destroy(g);
}

/* bf16 replicas (and bf16 GEMMs) track float32 training: fitting one
 * batch for LONG steps (the loss falls from 3.6 to 0.5), the curves stay
 * within 2% of the first loss of each other (measured: 0.03 at most). */
Test(bf16_engine, training_tracks_float32, .timeout = 60)
{
    dp_gpt *g = tiny_gpt();
    static run_state f32, b16, b16mm, b16act;
    dp_engine_config c = base_cfg();
    c.optim.lr = 1e-2f;
    train_n(dp_gpt_model(g, 0), 2, &c, LONG, 1, &f32);
    train_n(dp_gpt_model(g, DP_GPT_BF16), 2, &c, LONG, 1, &b16);
    c.matmul_precision = DP_MATMUL_BF16;
    train_n(dp_gpt_model(g, DP_GPT_BF16), 2, &c, LONG, 1, &b16mm);
    train_n(dp_gpt_model(g, DP_GPT_BF16_ACT), 2, &c, LONG, 1, &b16act);
    cr_assert_lt(f32.loss[LONG - 1], 0.8 * f32.loss[0], "float32 did not learn (%g -> %g)",
                 f32.loss[0], f32.loss[LONG - 1]);
    for (int s = 0; s < LONG; s++) {
        double tol = 0.02 * f32.loss[0];
        cr_assert(fabs(b16.loss[s] - f32.loss[s]) <= tol, "step %d: %g vs %g", s, b16.loss[s],
                  f32.loss[s]);
        cr_assert(fabs(b16mm.loss[s] - f32.loss[s]) <= tol, "step %d: %g vs %g", s,
                  b16mm.loss[s], f32.loss[s]);
        cr_assert(fabs(b16act.loss[s] - f32.loss[s]) <= tol, "bf16 activations, step %d: %g vs %g",
                  s, b16act.loss[s], f32.loss[s]);
    }
    /* and the precision is real: the curves are not float32's bits */
    cr_assert(memcmp(b16.loss, f32.loss, sizeof f32.loss) != 0);
    cr_assert(memcmp(b16mm.loss, b16.loss, sizeof b16.loss) != 0);
    dp_gpt_destroy(g);
}

/* Bytes per device: the bf16 replica and the float32 gradient; the owner
 * holds m, v and the master of its slice. */
Test(bf16_engine, memory_of_replicas_and_masters, .timeout = 30)
{
    dp_gpt *g = tiny_gpt();
    size_t n = dp_gpt_model(g, 0)->n_params;
    dp_engine_config c = base_cfg();
    c.shard_optimizer = 1;
    dp_engine *e = open_engine(dp_gpt_model(g, DP_GPT_BF16), 2, &c);
    dp_step_stats st = step(e, 0);
    size_t owned = 0;
    for (size_t d = 0; d < 2; d++) {
        cr_assert_eq(st.devices[d].param_bytes, n * 2 + n * 4, "device %zu param_bytes %zu", d,
                     st.devices[d].param_bytes);
        owned += st.devices[d].optimizer_bytes;
    }
    cr_assert_eq(owned, 3 * n * sizeof(float), "m, v and master: %zu bytes, want %zu", owned,
                 3 * n * sizeof(float));
    dp_engine_destroy(e);
    /* float32 replicas: 4 + 4, and m, v only */
    e = open_engine(dp_gpt_model(g, 0), 2, &c);
    st = step(e, 0);
    cr_assert_eq(st.devices[0].param_bytes, n * 8);
    cr_assert_eq(st.devices[0].optimizer_bytes + st.devices[1].optimizer_bytes, 2 * n * 4);
    dp_engine_destroy(e);
    dp_gpt_destroy(g);
}

/* A failure inside the update leaves the replicas to re-synchronise from
 * the owners' masters before the next step, which then works; a diverged
 * replica is found by the replica check and re-synchronised the same way. */
Test(bf16_engine, failed_update_and_divergence_resync_from_masters, .timeout = 60)
{
    dp_gpt *g = tiny_gpt();
    dp_engine_config c = base_cfg();
    c.shard_optimizer = 1;
    c.check_replicas_every = 1;
    dp_engine *e = open_engine(dp_gpt_model(g, DP_GPT_BF16), 3, &c);
    step(e, 0);
    dp_engine_inject_fault(e, 2, DP_PHASE_OPTIMIZER, DP_ERR_DEVICE);
    int32_t tok[EROWS * EBS], tgt[EROWS * EBS];
    dp_test_gpt_batch(1, EROWS, tok, tgt);
    dp_batch b = {EROWS, tok, tgt};
    cr_assert_eq(dp_engine_step(e, &b, NULL), DP_ERR_DEVICE);
    step(e, 2);
    assert_replicas_are_rounded_masters(e, "after a failed update and the next step");
    dp_engine_inject_divergence(e, 1);
    dp_test_gpt_batch(3, EROWS, tok, tgt);
    cr_assert_eq(dp_engine_step(e, &b, NULL), DP_ERR_INTERNAL, "the replica check missed it");
    cr_assert(strstr(dp_last_error(), "cpu:1"), "%s", dp_last_error());
    step(e, 4);
    assert_replicas_are_rounded_masters(e, "after a divergence and the next step");
    /* A bit flipped in the slice a device owns itself: the all-gather
     * never copies that slice to its owner; the rounding of the master
     * restores it. */
    dp_engine_inject_divergence(e, 0);
    dp_test_gpt_batch(5, EROWS, tok, tgt);
    cr_assert_eq(dp_engine_step(e, &b, NULL), DP_ERR_INTERNAL, "the replica check missed it");
    step(e, 6);
    assert_replicas_are_rounded_masters(e, "after the root diverged and the next step");
    dp_engine_destroy(e);
    dp_gpt_destroy(g);
}

/* The GEMMs' conversion scratch past the limit fails the step with a
 * message naming it and updates nothing; with room the same engine steps. */
Test(bf16_engine, conversion_scratch_past_the_limit_fails_the_step_cleanly, .timeout = 30)
{
    dp_gpt *g = tiny_gpt();
    dp_engine_config c = base_cfg();
    c.matmul_precision = DP_MATMUL_BF16;
    dp_engine *e = open_engine(dp_gpt_model(g, DP_GPT_BF16), 1, &c);
    dp_device *dev = dp_engine_device(e, 0);
    size_t n = dp_gpt_model(g, 0)->n_params;
    static float before[MAXP], after[MAXP];
    dp_assert_ok(dp_engine_get_params(e, before));
    dp_memory_stats ms;
    dp_device_memory(dev, &ms);
    cr_assert_eq(ms.reserved, 0, "scratch before any GEMM");
    /* everything the step allocates itself fits; the scratch does not */
    dp_step_stats st = step(e, 0);
    size_t scratch = st.devices[0].reserved_bytes;
    cr_assert_gt(scratch, 0);
    dp_engine_destroy(e);
    e = open_engine(dp_gpt_model(g, DP_GPT_BF16), 1, &c);
    dev = dp_engine_device(e, 0);
    dp_assert_ok(dp_device_set_limit(dev, st.devices[0].peak + scratch / 2));
    int32_t tok[EROWS * EBS], tgt[EROWS * EBS];
    dp_test_gpt_batch(0, EROWS, tok, tgt);
    dp_batch b = {EROWS, tok, tgt};
    cr_assert_eq(dp_engine_step(e, &b, NULL), DP_ERR_OUT_OF_MEMORY);
    cr_assert(strstr(dp_last_error(), "scratch") && strstr(dp_last_error(), "cpu:0"), "%s",
              dp_last_error());
    dp_assert_ok(dp_engine_get_params(e, after));
    cr_assert(memcmp(before, after, n * sizeof *after) == 0, "a failed step updated");
    dp_assert_ok(dp_device_set_limit(dev, 0));
    step(e, 0);
    dp_engine_destroy(e);
    dp_gpt_destroy(g);
}

Test(bf16_engine, refusals, .timeout = 30)
{
    dp_gpt *g = tiny_gpt();
    dp_device_spec spec = {DP_DEVICE_CPU, 0};
    dp_criterion crit = dp_criterion_cross_entropy();
    dp_engine *e = NULL;
    dp_model bad = *dp_gpt_model(g, 0);
    bad.param_dtype = DP_DTYPE_F16;
    dp_engine_config c = base_cfg();
    cr_assert_eq(dp_engine_create(&spec, 1, &bad, &crit, &c, &e), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "param_dtype F16"), "%s", dp_last_error());
    c.matmul_precision = DP_MATMUL_PRECISION_COUNT;
    cr_assert_eq(dp_engine_create(&spec, 1, dp_gpt_model(g, 0), &crit, &c, &e),
                 DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "matmul_precision"), "%s", dp_last_error());
    c.matmul_precision = DP_MATMUL_BF16;
    c.allow_tf32 = 1;
    cr_assert_eq(dp_engine_create(&spec, 1, dp_gpt_model(g, 0), &crit, &c, &e),
                 DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "allow_tf32") && strstr(dp_last_error(), "bf16"), "%s",
              dp_last_error());
    cr_assert_null(e);
    /* the engine sets the devices' precision */
    c.allow_tf32 = 0;
    dp_assert_ok(dp_engine_create(&spec, 1, dp_gpt_model(g, 0), &crit, &c, &e));
    cr_assert_eq(dp_device_matmul_precision(dp_engine_device(e, 0)), DP_MATMUL_BF16);
    dp_engine_destroy(e);
    dp_gpt_destroy(g);
}

// --- bf16 activations (DP_GPT_BF16_ACT) ------------------------------------------------

/* Keeping the activations off the residual stream as bfloat16 moves
 * training only by the rounding the GELU and its backward now see (and,
 * in FP32 precision, the GEMMs' rounded inputs), and by the logits
 * chunks' (the bfloat16 head, test_gpt_logits16): in both precisions,
 * on 1 and 2 devices with micro-batches, the losses stay within 2e-3
 * relative of DP_GPT_BF16's over steps with AdamW (measured: 8e-4
 * at most), and the parameters close, but not equal; also from 4x the
 * initial weights, where each layer's attention is peaked and its own
 * and the logits are large: rounding each to bfloat16 (2^-9 of it) moves
 * a row's loss by up to 2^-8 of the largest, so there 5e-3 (measured:
 * 2.5e-3). */
Test(bf16_engine, bf16_activations_track_the_bf16_model, .timeout = 60)
{
    dp_gpt *g = tiny_gpt();
    size_t n = dp_gpt_model(g, 0)->n_params;
    for (int run = 0; run < 6; run++) {
        /* runs 0-3: each precision on 1 and 2 devices; 4-5: BF16 from sharp weights */
        int sharp = run >= 4, prec = sharp || (run & 1);
        size_t k = 1 + (size_t)(sharp ? run & 1 : run >> 1 & 1);
        {
            dp_engine_config c = base_cfg();
            c.matmul_precision = prec ? DP_MATMUL_BF16 : DP_MATMUL_FP32;
            c.max_rows_per_micro = 2;
            dp_engine *a = open_engine(dp_gpt_model(g, DP_GPT_BF16), k, &c);
            dp_engine *b = open_engine(dp_gpt_model(g, DP_GPT_BF16_ACT), k, &c);
            static float p0[MAXP];
            dp_assert_ok(dp_engine_get_params(a, p0));
            if (sharp) { /* 4x the initial weights: peaked, layer-specific attention */
                for (size_t i = 0; i < n; i++) p0[i] *= 4.0f;
                dp_assert_ok(dp_engine_set_params(a, p0));
                dp_assert_ok(dp_engine_set_params(b, p0));
            }
            for (int s = 0; s < STEPS; s++) {
                dp_step_stats sa = step(a, s), sb = step(b, s);
                cr_assert(fabs(sa.loss - sb.loss) <= (sharp ? 5e-3 : 2e-3) * fabs(sa.loss),
                          "%s k %zu step %d: loss %.9g vs %.9g",
                          dp_matmul_precision_name(c.matmul_precision), k, s, sa.loss, sb.loss);
            }
            static float pa[MAXP], pb[MAXP];
            dp_assert_ok(dp_engine_get_params(a, pa));
            dp_assert_ok(dp_engine_get_params(b, pb));
            /* the mean difference against the mean distance trained */
            double diff, moved;
            dp_test_param_drift(pa, pb, p0, n, &diff, &moved);
            /* measured: 0.003 to 0.005; from sharp weights 0.024 */
            cr_assert_leq(diff, (sharp ? 0.06 : 0.02) * moved,
                          "run %d: parameters differ by %g on average, training moved them by %g",
                          run, diff / n, moved / n);
            cr_assert_gt(diff, 0.0, "run %d: the rounded activations changed no parameter", run);
            dp_engine_destroy(a);
            dp_engine_destroy(b);
        }
    }
    dp_gpt_destroy(g);
}

/* ... and they keep the engine's guarantees: sharding the optimizer is
 * bitwise the root update, and k devices track one. */
Test(bf16_engine, bf16_activations_shard_bitwise_and_track_k_devices, .timeout = 60)
{
    dp_gpt *g = tiny_gpt();
    const dp_model *act = dp_gpt_model(g, DP_GPT_BF16_ACT);
    size_t n = act->n_params;
    static run_state a, b;
    dp_engine_config c = base_cfg();
    c.matmul_precision = DP_MATMUL_BF16;
    train(act, 2, &c, &a);
    c.shard_optimizer = 1;
    train(act, 2, &c, &b);
    cr_assert(memcmp(a.loss, b.loss, sizeof a.loss) == 0, "sharded: losses differ");
    cr_assert(memcmp(a.p, b.p, n * sizeof *a.p) == 0, "sharded: masters differ");
    train(act, 1, &c, &b);
    double worst = 0.0;
    for (int s = 0; s < STEPS; s++)
        cr_assert(fabs(a.loss[s] - b.loss[s]) <= 1e-4 * fabs(b.loss[s]),
                  "step %d: loss %.9g on 2 devices, %.9g on 1", s, a.loss[s], b.loss[s]);
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)a.p[i] - b.p[i]));
    cr_assert_leq(worst, 5e-3, "largest master difference %g", worst);
    dp_gpt_destroy(g);
}

/* The GPT whose workspaces the memory tests measure. */
static const dp_gpt_config WORKSPACE_GPT = {
    .vocab_size = 97, .block_size = 32, .n_layer = 3, .n_head = 4, .n_embd = 64};

/* The workspace shrinks by the kept activations' halves: per token and
 * layer, 28 bytes per embedding dimension (ln_1, q/k/v, attention output,
 * ln_2: 2+6+2+2; pre-GELU and GELU output: 8+8), up to the slots'
 * alignment. */
Test(bf16_engine, bf16_activations_take_half_their_memory)
{
    const dp_gpt_config cfg = WORKSPACE_GPT;
    dp_gpt *g = NULL;
    dp_assert_ok(dp_gpt_create(&cfg, &g));
    const dp_model *m16 = dp_gpt_model(g, DP_GPT_BF16), *act = dp_gpt_model(g, DP_GPT_BF16_ACT);
    for (size_t rows = 1; rows <= 8; rows *= 2) {
        size_t w16 = m16->workspace_bytes(m16->ctx, rows), wa = act->workspace_bytes(act->ctx, rows);
        size_t want = cfg.n_layer * rows * cfg.block_size * 28 * cfg.n_embd;
        cr_assert(w16 > wa, "rows %zu: %zu vs %zu bytes", rows, w16, wa);
        size_t saved = w16 - wa, slack = cfg.n_layer * 6 * 512;
        cr_assert(saved + slack >= want && saved <= want + slack,
                  "rows %zu: saved %zu bytes, want %zu (+-%zu)", rows, saved, want, slack);
    }
    cr_assert_eq(dp_gpt_model(NULL, DP_GPT_BF16_ACT), NULL);
    dp_gpt_destroy(g);
}

// --- recomputation (DP_GPT_RECOMPUTE_ATTENTION, DP_GPT_RECOMPUTE_GELU) --------------------

/* Recomputing the probabilities or the GELU output in the backward is
 * the forward's own calls on the same values: every variant trains bit
 * for bit as without it (losses, gradient norms, masters), on 2 devices
 * with micro-batches, in FP32 and BF16 math, from the initial weights and
 * from 4x them (peaked attention, so another layer's probabilities would
 * show). */
Test(bf16_engine, recomputation_trains_bitwise_the_same, .timeout = 120)
{
    dp_gpt *g = tiny_gpt();
    size_t n = dp_gpt_model(g, 0)->n_params;
    static const unsigned kinds[] = {0, DP_GPT_BF16, DP_GPT_BF16_ACT};
    static const unsigned recompute[] = {DP_GPT_RECOMPUTE_ATTENTION, DP_GPT_RECOMPUTE_GELU,
                                         DP_GPT_RECOMPUTE_ATTENTION | DP_GPT_RECOMPUTE_GELU};
    static float p0[MAXP], pa[MAXP], pb[MAXP];
    for (int kind = 0; kind < 3; kind++)
        for (int run = 0; run < 4; run++) {
            int prec = run & 1, sharp = run >> 1;
            dp_engine_config c = base_cfg();
            c.matmul_precision = prec ? DP_MATMUL_BF16 : DP_MATMUL_FP32;
            c.max_rows_per_micro = 2;
            const dp_model *keep = dp_gpt_model(g, kinds[kind]);
            dp_engine *a = open_engine(keep, 2, &c), *b[3];
            for (int r = 0; r < 3; r++) {
                const dp_model *again = dp_gpt_model(g, kinds[kind] | recompute[r]);
                cr_assert(keep && again && keep != again);
                b[r] = open_engine(again, 2, &c);
            }
            if (sharp) {
                dp_assert_ok(dp_engine_get_params(a, p0));
                for (size_t i = 0; i < n; i++) p0[i] *= 4.0f;
                dp_assert_ok(dp_engine_set_params(a, p0));
                for (int r = 0; r < 3; r++) dp_assert_ok(dp_engine_set_params(b[r], p0));
            }
            for (int s = 0; s < STEPS; s++) {
                dp_step_stats sa = step(a, s);
                for (int r = 0; r < 3; r++) {
                    dp_step_stats sb = step(b[r], s);
                    cr_assert(sa.loss == sb.loss && sa.grad_norm == sb.grad_norm,
                              "flags %#x run %d step %d: loss %.17g vs %.17g, norm %.17g vs "
                              "%.17g", kinds[kind] | recompute[r], run, s, sa.loss, sb.loss,
                              sa.grad_norm, sb.grad_norm);
                }
            }
            dp_assert_ok(dp_engine_get_params(a, pa));
            for (int r = 0; r < 3; r++) {
                dp_assert_ok(dp_engine_get_params(b[r], pb));
                cr_assert(memcmp(pa, pb, n * sizeof *pa) == 0, "flags %#x run %d: masters differ",
                          kinds[kind] | recompute[r], run);
                dp_engine_destroy(b[r]);
            }
            dp_engine_destroy(a);
        }
    dp_gpt_destroy(g);
}

/* Recomputing the probabilities makes each variant's workspace 4 bytes
 * per head, key position and token per layer smaller, the GELU output 16
 * (8 with bf16 activations) per token and embedding dimension per layer,
 * less the scratch each adds to the backward's shared scratch where it
 * grows (up to the slots' alignment); the flags pick the variants. */
Test(bf16_engine, recomputation_saves_memory)
{
    const dp_gpt_config cfg = WORKSPACE_GPT;
    dp_gpt *g = NULL;
    dp_assert_ok(dp_gpt_create(&cfg, &g));
    static const unsigned kinds[] = {0, DP_GPT_BF16, DP_GPT_BF16_ACT};
    size_t T = cfg.block_size;
    for (int kind = 0; kind < 3; kind++)
        for (unsigned r = 1; r < 4; r++)
            for (size_t rows = 1; rows <= 8; rows *= 2) {
                int att = r & 1, gelu = r >> 1 & 1;
                unsigned flags = kinds[kind] | (att ? DP_GPT_RECOMPUTE_ATTENTION : 0) |
                                 (gelu ? DP_GPT_RECOMPUTE_GELU : 0);
                const dp_model *keep = dp_gpt_model(g, kinds[kind]);
                const dp_model *again = dp_gpt_model(g, flags);
                size_t wk = keep->workspace_bytes(keep->ctx, rows);
                size_t wr = again->workspace_bytes(again->ctx, rows);
                /* floats: a (B,T,C) tensor, the probabilities, a kept GELU output */
                size_t btc = rows * T * cfg.n_embd, bnhtt = rows * cfg.n_head * T * T;
                size_t g4 = kind == 2 ? 2 * btc : 4 * btc;
                /* act16's MLP half also holds the linears' bfloat16 dout (2 btc) */
                size_t attn = 7 * btc + bnhtt, mlp = 4 * btc + (kind == 2 ? 2 * btc : 0);
                size_t big0 = attn > mlp ? attn : mlp;
                size_t attn1 = attn + (att ? bnhtt : 0), mlp1 = mlp + (gelu ? g4 : 0);
                size_t big1 = attn1 > mlp1 ? attn1 : mlp1;
                size_t want = (cfg.n_layer * ((att ? bnhtt : 0) + (gelu ? g4 : 0)) -
                               (big1 - big0)) * sizeof(float);
                cr_assert(wk > wr, "flags %#x rows %zu: %zu vs %zu bytes", flags, rows, wk, wr);
                size_t saved = wk - wr, slack = (2 * cfg.n_layer + 2) * 512;
                cr_assert(saved + slack >= want && saved <= want + slack,
                          "flags %#x rows %zu: saved %zu bytes, want %zu (+-%zu)", flags, rows,
                          saved, want, slack);
            }
    /* the named models are the flags' */
    cr_assert_eq(dp_gpt_model(g, 0), dp_gpt_model(g, 0));
    cr_assert_eq(dp_gpt_model(g, DP_GPT_BF16), dp_gpt_model(g, DP_GPT_BF16));
    cr_assert_eq(dp_gpt_model(g, DP_GPT_BF16_ACT), dp_gpt_model(g, DP_GPT_BF16_ACT));
    cr_assert_eq(dp_gpt_model(g, DP_GPT_BF16 | DP_GPT_BF16_ACT), dp_gpt_model(g, DP_GPT_BF16_ACT));
    cr_assert_eq(dp_gpt_model(g, DP_GPT_BF16_ACT)->param_dtype, DP_DTYPE_BF16);
    cr_assert_eq(dp_gpt_model(g, DP_GPT_RECOMPUTE_ATTENTION)->param_dtype, DP_DTYPE_F32);
    cr_assert_eq(dp_gpt_model(g, DP_GPT_RECOMPUTE_GELU)->param_dtype, DP_DTYPE_F32);
    cr_assert_null(dp_gpt_model(g, 0x40u), "an unknown flag must give NULL");
    cr_assert_null(dp_gpt_model(NULL, 0));
    dp_gpt_destroy(g);
}

// --- the bfloat16 producers (nn/nn_act16.h) ----------------------------------------------

/* The bf16 activations' producers - the blocks' LayerNorms and c_fc
 * writing bfloat16 once, their linear backwards rounding dout once for
 * both GEMMs, c_proj's writing its bfloat16 input gradient - train bit
 * for bit as the compositions they replace (the test hook runs those on
 * every device of the second engine): losses, gradient norms and
 * masters, on 2 devices with micro-batches, in FP32 and BF16 math (only
 * BF16 rounds dout), with everything kept, the probabilities and GELU
 * output recomputed, the attention chunked (3 queries per chunk of the
 * 8) or fused (its bfloat16 dqkv). */
Test(bf16_engine, act16_producers_train_bitwise_as_their_compositions, .timeout = 120)
{
    dp_gpt *g = tiny_gpt(), *g3 = NULL;
    dp_gpt_config cfg3 = {.vocab_size = EV, .block_size = EBS, .n_layer = EL, .n_head = ENH,
                          .n_embd = EC, .attention_chunk = 3};
    dp_assert_ok(dp_gpt_create(&cfg3, &g3));
    size_t n = dp_gpt_model(g, 0)->n_params;
    static const unsigned flags[] = {
        DP_GPT_BF16_ACT, DP_GPT_BF16_ACT | DP_GPT_RECOMPUTE_ATTENTION | DP_GPT_RECOMPUTE_GELU,
        DP_GPT_BF16_ACT | DP_GPT_CHUNKED_ATTENTION | DP_GPT_RECOMPUTE_GELU,
        DP_GPT_BF16_ACT | DP_GPT_FUSED_ATTENTION | DP_GPT_RECOMPUTE_GELU};
    static float pa[MAXP], pb[MAXP];
    for (int f = 0; f < 4; f++)
        for (int prec = 0; prec < 2; prec++) {
            const dp_model *m = dp_gpt_model(f == 2 ? g3 : g, flags[f]);
            dp_engine_config c = base_cfg();
            c.matmul_precision = prec ? DP_MATMUL_BF16 : DP_MATMUL_FP32;
            c.max_rows_per_micro = 2;
            dp_engine *a = open_engine(m, 2, &c), *b = open_engine(m, 2, &c);
            for (size_t d = 0; d < dp_engine_num_devices(b); d++)
                dp_device_set_fused_producers(dp_engine_device(b, d), 0);
            for (int s = 0; s < STEPS; s++) {
                dp_step_stats sa = step(a, s), sb = step(b, s);
                cr_assert(sa.loss == sb.loss && sa.grad_norm == sb.grad_norm,
                          "flags %#x prec %d step %d: loss %.17g vs %.17g, norm %.17g vs %.17g",
                          flags[f], prec, s, sa.loss, sb.loss, sa.grad_norm, sb.grad_norm);
            }
            dp_assert_ok(dp_engine_get_params(a, pa));
            dp_assert_ok(dp_engine_get_params(b, pb));
            cr_assert(memcmp(pa, pb, n * sizeof *pa) == 0, "flags %#x prec %d: masters differ",
                      flags[f], prec);
            dp_engine_destroy(a);
            dp_engine_destroy(b);
        }
    dp_gpt_destroy(g3);
    dp_gpt_destroy(g);
}
