/*
 * The criterion contract (dp/model.h): the bundled MSE against float64
 * with ignored (NaN) targets, the engine's count check on a custom
 * criterion, the engine's zeroing of ignored rows' gradient (a criterion
 * that forgets them trains as gather mode does), callbacks' dp_set_error
 * messages reaching dp_last_error, the target-type check at create, and
 * the dp/ops.h helpers.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dp_test.h"

#include <criterion/parameterized.h>

#include "engine_fixture.h"
#include "nn/nn_act16.h"

// --- MSE against float64 --------------------------------------------------------------

enum { MN = 13, MV = 4 };

/* Logits and targets with NaN elements, and a fully-ignored row 5. */
static void mse_data(float *logits, float *targets)
{
    dp_rng rng;
    dp_rng_seed(&rng, 99);
    dp_rng_fill_normal(&rng, logits, MN * MV, 0.0f, 2.0f);
    dp_rng_fill_normal(&rng, targets, MN * MV, 0.5f, 1.0f);
    for (int i = 0; i < MN * MV; i++)
        if (i % 7 == 2 || i / MV == 5) targets[i] = NAN;
}

/* Reference in double: loss sum, count, dlogits = dscale * 2 * (x - t). */
static size_t mse_reference(const float *x, const float *t, double dscale, double *loss,
                            double *dl)
{
    size_t count = 0;
    *loss = 0.0;
    for (int i = 0; i < MN * MV; i++) {
        if (isnan(t[i])) {
            dl[i] = 0.0;
            continue;
        }
        double d = (double)x[i] - (double)t[i];
        *loss += d * d;
        dl[i] = dscale * 2.0 * d;
        count++;
    }
    return count;
}

static dp_criterion_args mse_args(dp_device *dev, const float *logits, float *dlogits,
                                  const float *targets, float dscale)
{
    dp_criterion_args a;
    memset(&a, 0, sizeof a);
    a.dev = dev;
    a.logits = logits;
    a.dlogits = dlogits;
    a.targets = targets;
    a.target_type = DP_TARGET_F32;
    a.target_size = MV;
    a.n = MN;
    a.V = MV;
    a.dscale = dscale;
    return a;
}

/* 0: separate dlogits, 1: dlogits aliasing logits (balanced mode), 2: loss only. */
ParameterizedTestParameters(contract, mse_matches_float64)
{
    static int cases[] = {0, 1, 2};
    return cr_make_param_array(int, cases, 3);
}

ParameterizedTest(int *mode, contract, mse_matches_float64)
{
    float x[MN * MV], t[MN * MV], got[MN * MV];
    double ref_loss, ref_dl[MN * MV], dl[MN * MV];
    mse_data(x, t);
    const float dscale = 1.0f / 37.0f;
    size_t ref_count = mse_reference(x, t, dscale, &ref_loss, ref_dl);
    cr_assert(ref_count > 0 && ref_count < MN * MV - MV, "the data must ignore some elements");

    dp_device *dev = dp_test_cpu(0);
    float *dx = dp_test_upload(dev, x, MN * MV), *dt = dp_test_upload(dev, t, MN * MV);
    float *ddl = *mode == 0 ? dp_test_upload(dev, x, MN * MV) : *mode == 1 ? dx : NULL;
    dp_criterion mse = dp_criterion_mse();
    cr_assert_eq(mse.target_type, DP_TARGET_F32);
    dp_criterion_args a = mse_args(dev, dx, ddl, dt, dscale);
    double loss = -1.0;
    size_t count = 0;
    dp_assert_ok(mse.forward_backward(mse.ctx, &a, &loss, &count));
    cr_assert_eq(count, ref_count, "MSE counted %zu valid elements, expected %zu", count,
                 ref_count);
    dp_assert_allclose(&loss, &ref_loss, 1, 1e-12, 1e-12);
    if (ddl) {
        dp_assert_ok(dp_copy_d2h(dev, got, ddl, sizeof got));
        for (int i = 0; i < MN * MV; i++) dl[i] = got[i];
        dp_assert_allclose(dl, ref_dl, MN * MV, 1e-7, 1e-6);
        for (int i = 0; i < MV; i++)
            cr_assert_eq(got[5 * MV + i], 0.0f, "an ignored row's gradient must be 0");
    } else {
        dp_assert_ok(dp_copy_d2h(dev, got, dx, sizeof got));
        cr_assert(memcmp(got, x, sizeof got) == 0, "loss only must leave the logits alone");
    }
    if (*mode == 0) dp_device_free(dev, ddl);
    dp_device_free(dev, dx);
    dp_device_free(dev, dt);
    dp_device_close(dev);
}

Test(contract, mse_refuses_targets_of_another_shape)
{
    dp_device *dev = dp_test_cpu(0);
    float x[MN * MV] = {0}, t[MN * MV] = {0};
    float *dx = dp_test_upload(dev, x, MN * MV), *dt = dp_test_upload(dev, t, MN * MV);
    dp_criterion mse = dp_criterion_mse();
    dp_criterion_args a = mse_args(dev, dx, NULL, dt, 1.0f);
    a.target_size = 1;
    double loss;
    size_t count;
    cr_assert_eq(mse.forward_backward(mse.ctx, &a, &loss, &count), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "target_size") != NULL, "%s", dp_last_error());
    dp_device_free(dev, dx);
    dp_device_free(dev, dt);
    dp_device_close(dev);
}

Test(contract, cross_entropy_reports_the_valid_count)
{
    dp_device *dev = dp_test_cpu(0);
    float x[6 * 3] = {0};
    int32_t t[6] = {0, -1, 2, 1, -1, 0};
    float *dx = dp_test_upload(dev, x, 18);
    void *dt = NULL;
    dp_assert_ok(dp_device_alloc(dev, sizeof t, &dt));
    dp_assert_ok(dp_copy_h2d(dev, dt, t, sizeof t));
    dp_criterion ce = dp_criterion_cross_entropy();
    void *scratch = NULL;
    dp_assert_ok(dp_device_alloc(dev, ce.scratch_bytes(ce.ctx, 6, 3), &scratch));
    dp_criterion_args a;
    memset(&a, 0, sizeof a);
    a.dev = dev;
    a.logits = dx;
    a.targets = dt;
    a.target_type = DP_TARGET_CLASS;
    a.target_size = 1;
    a.n = 6;
    a.V = 3;
    a.n_valid = 4;
    a.dscale = 0.25f;
    a.scratch = scratch;
    double loss = 0.0;
    size_t count = 0;
    dp_assert_ok(ce.forward_backward(ce.ctx, &a, &loss, &count));
    cr_assert_eq(count, 4);
    /* uniform logits: each valid row's loss is log(3) */
    double want = 4.0 * log(3.0);
    dp_assert_allclose(&loss, &want, 1, 1e-6, 1e-6);
    dp_device_free(dev, scratch);
    dp_device_free(dev, dt);
    dp_device_free(dev, dx);
    dp_device_close(dev);
}

// --- the engine holds a custom criterion to the plan's count ----------------------------

typedef struct counting {
    dp_criterion inner;
    int mode; /* 0: report every element (ignored ones too), 1: leave the count unset */
} counting;

static dp_status counting_fb(void *ctx, const dp_criterion_args *a, double *loss, size_t *count)
{
    counting *c = ctx;
    size_t mine = 0;
    dp_status s = c->inner.forward_backward(c->inner.ctx, a, loss, &mine);
    if (s != DP_OK) return s;
    if (c->mode == 0) *count = a->n * a->target_size; /* summed the ignored targets too */
    return DP_OK;
}

static size_t counting_scratch(void *ctx, size_t n, size_t V)
{
    counting *c = ctx;
    return c->inner.scratch_bytes(c->inner.ctx, n, V);
}

/* Case: mode * 10 + count mode; the batch has ignored targets. */
ParameterizedTestParameters(contract, engine_refuses_a_count_unlike_the_plan)
{
    static int cases[] = {0, 1, 10, 11};
    return cr_make_param_array(int, cases, 4);
}

ParameterizedTest(int *c, contract, engine_refuses_a_count_unlike_the_plan)
{
    run r;
    mlp_config mc = {D, H, K, DP_DTYPE_F32};
    r.leaked_before = dp_device_bytes_freed_at_close();
    mlp_init_model(&r.net, &mc, &r.model);
    counting cc = {dp_criterion_cross_entropy(), *c % 10};
    dp_criterion crit = {&cc, counting_scratch, counting_fb, DP_TARGET_CLASS, 0, 0, 0};
    dp_engine_config cfg = dp_test_base_cfg(*c / 10 ? DP_MODE_GATHER : DP_MODE_BALANCED);
    dp_device_spec specs[2] = {{DP_DEVICE_CPU, 0}, {DP_DEVICE_CPU, 1}};
    dp_assert_ok(dp_engine_create(specs, 2, &r.model, &crit, &cfg, &r.e));
    float x[20 * D];
    int32_t y[20];
    dp_test_make_batch(0, 20, 5, x, y); /* 4 of 20 ignored */
    dp_batch b = {20, x, y};
    float before[4096], after[4096];
    cr_assert(r.model.n_params <= 4096);
    dp_assert_ok(dp_engine_get_params(r.e, before));
    cr_assert_eq(dp_engine_step(r.e, &b, NULL), DP_ERR_INVALID_ARGUMENT);
    const char *msg = dp_last_error();
    cr_assert(strstr(msg, "cpu:0 criterion:") != NULL, "the message names device and phase: %s",
              msg);
    if (*c % 10 == 0) {
        /* balanced: device 0's 10 rows, 2 ignored; gather: the 20 gathered rows, 4 ignored */
        const char *want = *c / 10 ? "summed 20 target elements but the engine counted 16"
                                   : "summed 10 target elements but the engine counted 8";
        cr_assert(strstr(msg, want) != NULL, "want \"%s\" in: %s", want, msg);
    } else {
        cr_assert(strstr(msg, "did not report") != NULL, "%s", msg);
    }
    dp_assert_ok(dp_engine_get_params(r.e, after));
    cr_assert(memcmp(before, after, r.model.n_params * sizeof(float)) == 0,
              "a refused step must not update the parameters");
    /* The same batch without ignored targets agrees with the plan: it trains. */
    if (*c % 10 == 0) {
        dp_test_make_batch(0, 20, 0, x, y);
        dp_assert_ok(dp_engine_step(r.e, &b, NULL));
    }
    dp_test_run_close(&r);
}

// --- the engine keeps ignored rows' gradient at zero --------------------------------------

/* Softmax cross-entropy in host loops (CPU devices), written as a user
 * might: it writes the gradient of the valid rows and never touches the
 * ignored ones, against dp/model.h's rule. In balanced mode dlogits is the
 * logits buffer, so without the engine's zeroing those rows would pass
 * their logits back as gradients and the step would differ from gather
 * mode's (where dlogits starts zeroed). */
static dp_status forgetful_fb(void *ctx, const dp_criterion_args *a, double *loss, size_t *count)
{
    const int32_t *t = a->targets;
    size_t V = a->V;
    double p[64];
    if (V > 64) return dp_set_error(DP_ERR_INVALID_ARGUMENT, "forgetful: V %zu > 64", V);
    *loss = 0.0;
    *count = 0;
    for (size_t r = 0; r < a->n; r++) {
        if (t[r] < 0) continue; /* forgotten: the row keeps whatever it held */
        const float *x = a->logits + r * V;
        double m = x[0], sum = 0.0;
        for (size_t v = 1; v < V; v++) m = x[v] > m ? x[v] : m;
        for (size_t v = 0; v < V; v++) sum += p[v] = exp(x[v] - m);
        *loss += m + log(sum) - x[t[r]];
        ++*count;
        for (size_t v = 0; a->dlogits && v < V; v++)
            a->dlogits[r * V + v] = a->dscale * (float)(p[v] / sum - (v == (size_t)t[r]));
    }
    return DP_OK;
}

/* Case: mode (0 balanced, 1 gather) * 10 + criterion (0 forgetful, 1 the bundled one). */
static void one_step_params(int c, float *params)
{
    run r;
    mlp_config mc = {D, H, K, DP_DTYPE_F32};
    r.leaked_before = dp_device_bytes_freed_at_close();
    mlp_init_model(&r.net, &mc, &r.model);
    dp_criterion forgetful = {NULL, NULL, forgetful_fb, DP_TARGET_CLASS, 0, 0, 0};
    dp_criterion crit = c % 10 ? dp_criterion_cross_entropy() : forgetful;
    dp_engine_config cfg = dp_test_base_cfg(c / 10 ? DP_MODE_GATHER : DP_MODE_BALANCED);
    cfg.optim.kind = DP_OPTIMIZER_SGD; /* an update proportional to the gradient */
    cfg.optim.lr = 0.1f;
    cfg.optim.grad_clip = 0.0f;
    dp_device_spec specs[2] = {{DP_DEVICE_CPU, 0}, {DP_DEVICE_CPU, 1}};
    dp_assert_ok(dp_engine_create(specs, 2, &r.model, &crit, &cfg, &r.e));
    float x[20 * D];
    int32_t y[20];
    dp_test_make_batch(3, 20, 3, x, y); /* rows 2, 5, 8, ... ignored */
    dp_batch b = {20, x, y};
    dp_assert_ok(dp_engine_step(r.e, &b, NULL));
    dp_assert_ok(dp_engine_get_params(r.e, params));
    dp_test_run_close(&r);
}

Test(contract, engine_zeroes_the_gradient_of_ignored_rows)
{
    static float p[4][4096];
    mlp net;
    dp_model model;
    mlp_init_model(&net, &(mlp_config){D, H, K, DP_DTYPE_F32}, &model);
    cr_assert(model.n_params <= 4096);
    int cases[4] = {0, 10, 1, 11};
    for (int i = 0; i < 4; i++) one_step_params(cases[i], p[i]);
    /* The forgetful criterion in balanced mode equals it in gather mode and
     * the bundled cross-entropy in both (host double vs the kernel's sums:
     * a few float roundings). Without the zeroing balanced mode is off by
     * about 1e-3 in the parameters. */
    for (int i = 1; i < 4; i++)
        for (size_t j = 0; j < model.n_params; j++)
            cr_assert(fabsf(p[0][j] - p[i][j]) <= 1e-6f, "parameter %zu: balanced forgetful %.9g, "
                      "%s %s %.9g", j, p[0][j], cases[i] / 10 ? "gather" : "balanced",
                      cases[i] % 10 ? "cross-entropy" : "forgetful", p[i][j]);
}

/* The zeroing itself (dp/ops.h): class rows with id -1, float rows whose
 * values are all NaN (a row with one valid value is kept), bad arguments. */
Test(contract, zero_ignored_rows_op)
{
    dp_device *dev = dp_test_cpu(0);
    enum { R = 4, C = 3 };
    float x[R * C], got[R * C], ft[R * 2] = {1, 2, NAN, NAN, NAN, 5, 7, 8};
    int32_t ct[R] = {0, -1, 2, -1};
    for (int i = 0; i < R * C; i++) x[i] = (float)(i + 1);
    float *dx = dp_test_upload(dev, x, R * C), *dft = dp_test_upload(dev, ft, R * 2);
    void *dct = NULL;
    dp_assert_ok(dp_device_alloc(dev, sizeof ct, &dct));
    dp_assert_ok(dp_copy_h2d(dev, dct, ct, sizeof ct));
    dp_assert_ok(dp_zero_ignored_rows(dev, dx, dct, DP_TARGET_CLASS, 1, R, C));
    dp_assert_ok(dp_copy_d2h(dev, got, dx, sizeof got));
    for (int i = 0; i < R * C; i++)
        cr_assert_eq(got[i], ct[i / C] < 0 ? 0.0f : x[i], "class: element %d is %g", i, got[i]);
    dp_assert_ok(dp_copy_h2d(dev, dx, x, sizeof x));
    dp_assert_ok(dp_zero_ignored_rows(dev, dx, dft, DP_TARGET_F32, 2, R, C));
    dp_assert_ok(dp_copy_d2h(dev, got, dx, sizeof got));
    for (int i = 0; i < R * C; i++)
        cr_assert_eq(got[i], i / C == 1 ? 0.0f : x[i], "f32: element %d is %g", i, got[i]);
    cr_assert_eq(dp_zero_ignored_rows(dev, dx, dct, DP_TARGET_CLASS, 0, R, C),
                 DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_zero_ignored_rows(dev, dx, dct, (dp_target_type)7, 1, R, C),
                 DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "invalid target type"), "%s", dp_last_error());
    cr_assert_eq(dp_zero_ignored_rows(dev, dx, NULL, DP_TARGET_CLASS, 1, R, C),
                 DP_ERR_INVALID_ARGUMENT);
    dp_device_free(dev, dx);
    dp_device_free(dev, dft);
    dp_device_free(dev, dct);
    dp_device_close(dev);
}

/* dp_zero_ignored_rows_bf16 (nn/nn_act16.h): the same rule on bfloat16
 * rows, ignored rows +0 bits, the others' bits untouched; its checks name
 * it. */
Test(contract, zero_ignored_rows_bf16_op)
{
    dp_device *dev = dp_test_cpu(0);
    enum { R = 4, C = 3 };
    uint16_t x[R * C], got[R * C];
    float ft[R * 2] = {1, 2, NAN, NAN, NAN, 5, 7, 8};
    int32_t ct[R] = {0, -1, 2, -1};
    for (int i = 0; i < R * C; i++) x[i] = dp_bf16_round(-0.3f * (float)(i + 1));
    void *dx = NULL, *dct = NULL;
    dp_assert_ok(dp_device_alloc(dev, sizeof x, &dx));
    dp_assert_ok(dp_copy_h2d(dev, dx, x, sizeof x));
    float *dft = dp_test_upload(dev, ft, R * 2);
    dp_assert_ok(dp_device_alloc(dev, sizeof ct, &dct));
    dp_assert_ok(dp_copy_h2d(dev, dct, ct, sizeof ct));
    dp_assert_ok(dp_zero_ignored_rows_bf16(dev, dx, dct, DP_TARGET_CLASS, 1, R, C));
    dp_assert_ok(dp_copy_d2h(dev, got, dx, sizeof got));
    for (int i = 0; i < R * C; i++)
        cr_assert_eq(got[i], ct[i / C] < 0 ? 0 : x[i], "class: element %d is 0x%04x", i, got[i]);
    dp_assert_ok(dp_copy_h2d(dev, dx, x, sizeof x));
    dp_assert_ok(dp_zero_ignored_rows_bf16(dev, dx, dft, DP_TARGET_F32, 2, R, C));
    dp_assert_ok(dp_copy_d2h(dev, got, dx, sizeof got));
    for (int i = 0; i < R * C; i++)
        cr_assert_eq(got[i], i / C == 1 ? 0 : x[i], "f32: element %d is 0x%04x", i, got[i]);
    static const struct {
        int case_;
        const char *want;
    } bad[] = {{0, "target_size 0"}, {1, "invalid target type"}, {2, "targets must not"},
               {3, "x must not"},    {4, "rows and cols"},       {5, "dev must not"}};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        dp_status s = DP_OK;
        switch (bad[k].case_) {
        case 0: s = dp_zero_ignored_rows_bf16(dev, dx, dct, DP_TARGET_CLASS, 0, R, C); break;
        case 1: s = dp_zero_ignored_rows_bf16(dev, dx, dct, (dp_target_type)7, 1, R, C); break;
        case 2: s = dp_zero_ignored_rows_bf16(dev, dx, NULL, DP_TARGET_CLASS, 1, R, C); break;
        case 3: s = dp_zero_ignored_rows_bf16(dev, NULL, dct, DP_TARGET_CLASS, 1, R, C); break;
        case 4: s = dp_zero_ignored_rows_bf16(dev, dx, dct, DP_TARGET_CLASS, 1, 0, C); break;
        default: s = dp_zero_ignored_rows_bf16(NULL, dx, dct, DP_TARGET_CLASS, 1, R, C); break;
        }
        cr_assert_eq(s, DP_ERR_INVALID_ARGUMENT, "case %d", bad[k].case_);
        cr_assert(strstr(dp_last_error(), bad[k].want) &&
                      strstr(dp_last_error(), "dp_zero_ignored_rows_bf16"),
                  "case %d: %s", bad[k].case_, dp_last_error());
    }
    dp_device_free(dev, dx);
    dp_device_free(dev, dft);
    dp_device_free(dev, dct);
    dp_device_close(dev);
}

Test(contract, create_refuses_a_criterion_for_other_targets)
{
    mlp net;
    dp_model model;
    mlp_init_model(&net, &(mlp_config){D, H, K, DP_DTYPE_F32}, &model);
    dp_criterion mse = dp_criterion_mse();
    dp_engine_config cfg = dp_test_base_cfg(DP_MODE_BALANCED);
    dp_device_spec spec = {DP_DEVICE_CPU, 0};
    dp_engine *e = NULL;
    cr_assert_eq(dp_engine_create(&spec, 1, &model, &mse, &cfg, &e), DP_ERR_INVALID_ARGUMENT);
    cr_assert_null(e);
    cr_assert(strstr(dp_last_error(), "DP_TARGET_F32") != NULL, "%s", dp_last_error());
    model.target_type = DP_TARGET_CLASS;
    model.target_size = 3;
    dp_criterion ce = dp_criterion_cross_entropy();
    cr_assert_eq(dp_engine_create(&spec, 1, &model, &ce, &cfg, &e), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "target_size is 3") != NULL, "%s", dp_last_error());
}

/* n_params whose bytes overflow size_t (2^62 floats wrapped to 0 bytes,
 * and a device "allocated" it), and a tensor without a name, are refused
 * before anything is allocated. */
Test(contract, create_refuses_absurd_parameter_counts_and_unnamed_tensors)
{
    mlp net;
    dp_model model;
    mlp_init_model(&net, &(mlp_config){D, H, K, DP_DTYPE_F32}, &model);
    dp_criterion ce = dp_criterion_cross_entropy();
    dp_engine_config cfg = dp_test_base_cfg(DP_MODE_BALANCED);
    dp_device_spec spec = {DP_DEVICE_CPU, 0};
    dp_engine *e = NULL;
    const size_t absurd[] = {SIZE_MAX / 4 + 1, SIZE_MAX / 4 + 65, SIZE_MAX / 16 + 1, SIZE_MAX};
    for (size_t i = 0; i < sizeof absurd / sizeof *absurd; i++) {
        dp_model big = model;
        big.n_params = absurd[i];
        cr_assert_eq(dp_engine_create(&spec, 1, &big, &ce, &cfg, &e), DP_ERR_INVALID_ARGUMENT,
                     "n_params %zu: %s", absurd[i], dp_last_error());
        cr_assert_null(e);
        cr_assert(strstr(dp_last_error(), "is absurd") && strstr(dp_last_error(), "overflow"),
                  "%s", dp_last_error());
    }
    cr_assert_gt(model.n_tensors, 0);
    dp_param_tensor t[8];
    cr_assert_leq(model.n_tensors, 8);
    memcpy(t, model.tensors, model.n_tensors * sizeof *t);
    t[model.n_tensors - 1].name = NULL;
    dp_model unnamed = model;
    unnamed.tensors = t;
    cr_assert_eq(dp_model_validate(&unnamed), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "has no name"), "%s", dp_last_error());
    t[model.n_tensors - 1].name = "";
    cr_assert_eq(dp_model_validate(&unnamed), DP_ERR_INVALID_ARGUMENT);
    dp_assert_ok(dp_model_validate(&model));
}

// --- callbacks' messages reach dp_last_error ---------------------------------------------

typedef struct failing {
    mlp net;
    dp_model inner;
    dp_criterion inner_crit;
    int where;  /* 0 validate_inputs, 1 forward, 2 criterion, 3 backward */
    int silent; /* 1: fail without a message; 2: with a status outside dp_status;
                 * 3: with a message longer than dp_last_error keeps */
} failing;

#define LONG_FIX " FIX: do X"

static dp_status fail_here(const failing *f, int where, const char *dev)
{
    if (f->where != where) return DP_OK;
    if (f->silent == 1) return DP_ERR_DEVICE;
    if (f->silent == 2) {
        dp_set_error(DP_ERR_IO, "user says no");
        return (dp_status)77;
    }
    if (f->silent == 3) { /* 1016 bytes of two-byte characters, then the fix */
        static char text[1100];
        for (size_t i = 0; i < 1016; i += 2) memcpy(text + i, "\xc3\xa9", 2);
        memcpy(text + 1016, LONG_FIX, sizeof LONG_FIX);
        return dp_set_error(DP_ERR_INVALID_ARGUMENT, "%s", text);
    }
    return dp_set_error(DP_ERR_INVALID_ARGUMENT, "user says no (%s, step %d)", dev, 42);
}

static dp_status f_validate(void *ctx, const void *in, size_t rows)
{
    return fail_here(ctx, 0, "host");
}

static dp_status f_forward(void *ctx, dp_device *dev, dp_params params, const dp_chunk *c, void *ws,
                           float *logits)
{
    failing *f = ctx;
    dp_status s = fail_here(f, 1, dp_device_name(dev));
    if (s != DP_OK) return s;
    return f->inner.forward(f->inner.ctx, dev, params, c, ws, logits);
}

static dp_status f_backward(void *ctx, dp_device *dev, dp_params params, float *g,
                            const dp_chunk *c, void *ws, float *dl)
{
    failing *f = ctx;
    dp_status s = fail_here(f, 3, dp_device_name(dev));
    if (s != DP_OK) return s;
    return f->inner.backward(f->inner.ctx, dev, params, g, c, ws, dl);
}

static dp_status f_crit(void *ctx, const dp_criterion_args *a, double *loss, size_t *count)
{
    failing *f = ctx;
    dp_status s = fail_here(f, 2, dp_device_name(a->dev));
    if (s != DP_OK) return s;
    return f->inner_crit.forward_backward(f->inner_crit.ctx, a, loss, count);
}

static size_t f_scratch(void *ctx, size_t n, size_t V)
{
    failing *f = ctx;
    return f->inner_crit.scratch_bytes(f->inner_crit.ctx, n, V);
}

/* Case: silent * 100 + mode * 10 + where. */
ParameterizedTestParameters(contract, callback_messages_reach_last_error)
{
    static int cases[] = {0,   1,   2,   3,   11,  12,  13,  100, 101, 102, 103, 112,
                          200, 201, 202, 203, 300, 301, 302, 303, 313};
    return cr_make_param_array(int, cases, sizeof cases / sizeof *cases);
}

ParameterizedTest(int *c, contract, callback_messages_reach_last_error)
{
    static const char *phase[] = {"", "forward", "criterion", "backward"};
    failing f;
    memset(&f, 0, sizeof f);
    f.where = *c % 10;
    f.silent = *c / 100;
    mlp_init_model(&f.net, &(mlp_config){D, H, K, DP_DTYPE_F32}, &f.inner);
    dp_model model = f.inner;
    model.ctx = &f;
    model.validate_inputs = f_validate;
    model.forward = f_forward;
    model.backward = f_backward;
    f.inner_crit = dp_criterion_cross_entropy();
    dp_criterion crit = {&f, f_scratch, f_crit, DP_TARGET_CLASS, 0, 0, 0};
    dp_engine_config cfg = dp_test_base_cfg((*c / 10) % 10 ? DP_MODE_GATHER : DP_MODE_BALANCED);
    dp_device_spec specs[2] = {{DP_DEVICE_CPU, 0}, {DP_DEVICE_CPU, 1}};
    dp_engine *e = NULL;
    dp_assert_ok(dp_engine_create(specs, 2, &model, &crit, &cfg, &e));
    float x[8 * D];
    int32_t y[8];
    dp_test_make_batch(1, 8, 0, x, y);
    dp_batch b = {8, x, y};
    /* a stale message from an earlier failure must not leak into this one */
    dp_set_error(DP_ERR_IO, "an unrelated old message");
    dp_status s = dp_engine_step(e, &b, NULL);
    const char *msg = dp_last_error();
    char want[256];
    if (!f.silent) {
        cr_assert_eq(s, DP_ERR_INVALID_ARGUMENT, "%s", dp_strerror(s));
        if (f.where == 0)
            snprintf(want, sizeof want, "validate_inputs: user says no (host, step 42)");
        else
            snprintf(want, sizeof want, "cpu:0 %s: user says no (cpu:0, step 42)", phase[f.where]);
        cr_assert_str_eq(msg, want);
    } else if (f.silent == 2) { /* a caller switching on the status gets one of dp's */
        cr_assert_eq(s, DP_ERR_INVALID_ARGUMENT, "%d", (int)s);
        cr_assert(strstr(msg, "returned 77, which is no dp_status") &&
                  strstr(msg, "its message: ") && strstr(msg, "user says no"), "%s", msg);
    } else if (f.silent == 3) { /* the device and phase added, the fix at the end kept */
        cr_assert_eq(s, DP_ERR_INVALID_ARGUMENT, "%s", dp_strerror(s));
        size_t n = strlen(msg);
        cr_assert_lt(n, 1024);
        cr_assert_str_eq(msg + n - strlen(LONG_FIX), LONG_FIX);
        cr_assert_eq(dp_utf8_check(msg, n, NULL), DP_OK, "cut inside a character: %s", msg);
        snprintf(want, sizeof want, f.where ? "cpu:0 %s: \xc3\xa9" : "validate_inputs: \xc3\xa9",
                 phase[f.where]);
        cr_assert_eq(strncmp(msg, want, strlen(want)), 0, "%s", msg);
    } else {
        cr_assert_eq(s, DP_ERR_DEVICE, "%s", dp_strerror(s));
        cr_assert(strstr(msg, "without a message") && strstr(msg, "dp_set_error") &&
                  !strstr(msg, "unrelated"), "%s", msg);
        if (f.where)
            cr_assert(strncmp(msg, "cpu:0 ", 6) == 0 && strstr(msg, phase[f.where]), "%s", msg);
    }
    dp_engine_destroy(e);
}

Test(contract, set_error_records_the_message_verbatim)
{
    dp_clear_error();
    cr_assert_eq(dp_set_error(DP_ERR_FORMAT, "row %d of %s", 3, "x"), DP_ERR_FORMAT);
    cr_assert_str_eq(dp_last_error(), "row 3 of x");
    char big[2000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    dp_set_error(DP_ERR_FORMAT, "%s", big);
    cr_assert_eq(strlen(dp_last_error()), 1023, "truncated to the buffer");
}

// --- dp/ops.h ----------------------------------------------------------------------------

Test(ops, helpers_match_host_loops)
{
    dp_device *dev = dp_test_cpu(0);
    enum { R = 5, C = 3, LD = 4, N = R * LD };
    float x[N], y[N], bias[C], t[N], got[N], want[N];
    dp_rng rng;
    dp_rng_seed(&rng, 5);
    dp_rng_fill_normal(&rng, x, N, 0.0f, 1.0f);
    dp_rng_fill_normal(&rng, y, N, 0.0f, 1.0f);
    dp_rng_fill_normal(&rng, bias, C, 0.0f, 1.0f);
    dp_rng_fill_normal(&rng, t, N, 0.0f, 1.0f);
    t[3] = t[11] = NAN;
    float *dx = dp_test_upload(dev, x, N), *dy = dp_test_upload(dev, y, N);
    float *db = dp_test_upload(dev, bias, C), *dt = dp_test_upload(dev, t, N);

    dp_assert_ok(dp_axpy(dev, dy, -0.5f, dx, N));
    for (int i = 0; i < N; i++) want[i] = y[i] + -0.5f * x[i];
    dp_assert_ok(dp_copy_d2h(dev, got, dy, sizeof got));
    dp_assert_allclose(got, want, N, 0.0, 0.0);

    dp_assert_ok(dp_bias_add(dev, dy, db, R, C, LD));
    for (int i = 0; i < N; i++) want[i] += i % LD < C ? bias[i % LD] : 0.0f;
    dp_assert_ok(dp_copy_d2h(dev, got, dy, sizeof got));
    dp_assert_allclose(got, want, N, 0.0, 0.0);
    cr_assert_eq(dp_bias_add(dev, dy, db, R, C, C - 1), DP_ERR_INVALID_ARGUMENT);

    double sum = 0.0, ref = 0.0;
    size_t count = 0;
    dp_assert_ok(dp_masked_sum(dev, &sum, &count, dx, dt, N));
    for (int i = 0; i < N; i++) ref += isnan(t[i]) ? 0.0 : (double)x[i];
    cr_assert_eq(count, N - 2);
    dp_assert_allclose(&sum, &ref, 1, 1e-12, 1e-12);
    dp_assert_ok(dp_masked_sum(dev, &sum, &count, dt, dt, N)); /* NaNs skipped, not summed */
    cr_assert(isfinite(sum) && count == N - 2);

    dp_assert_ok(dp_masked_diff(dev, dy, 2.0f, dx, dt, N));
    for (int i = 0; i < N; i++) want[i] = isnan(t[i]) ? 0.0f : 2.0f * (x[i] - t[i]);
    dp_assert_ok(dp_copy_d2h(dev, got, dy, sizeof got));
    dp_assert_allclose(got, want, N, 0.0, 0.0);
    dp_assert_ok(dp_masked_diff(dev, dx, 2.0f, dx, dt, N)); /* in place */
    dp_assert_ok(dp_copy_d2h(dev, got, dx, sizeof got));
    dp_assert_allclose(got, want, N, 0.0, 0.0);

    cr_assert_eq(dp_axpy(NULL, dy, 1.0f, dx, N), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_masked_sum(dev, NULL, NULL, dx, NULL, N), DP_ERR_INVALID_ARGUMENT);
    void *bufs[] = {dx, dy, db, dt};
    for (int i = 0; i < 4; i++) dp_device_free(dev, bufs[i]);
    dp_device_close(dev);
}

Test(ops, linear_with_strided_rows_equals_contiguous)
{
    enum { N = 6, C = 4, LD = 7, OC = 3 };
    dp_device *dev = dp_test_cpu(0);
    float rows[N * LD], packed[N * C], w[OC * C], b[OC], dout[N * OC];
    dp_rng rng;
    dp_rng_seed(&rng, 8);
    dp_rng_fill_normal(&rng, rows, N * LD, 0.0f, 1.0f);
    dp_rng_fill_normal(&rng, w, OC * C, 0.0f, 1.0f);
    dp_rng_fill_normal(&rng, b, OC, 0.0f, 1.0f);
    dp_rng_fill_normal(&rng, dout, N * OC, 0.0f, 1.0f);
    for (int r = 0; r < N; r++) memcpy(packed + r * C, rows + r * LD, C * sizeof(float));
    float *drows = dp_test_upload(dev, rows, N * LD), *dpacked = dp_test_upload(dev, packed, N * C);
    float *dw = dp_test_upload(dev, w, OC * C), *db = dp_test_upload(dev, b, OC);
    float *ddout = dp_test_upload(dev, dout, N * OC);
    float zeros[OC * C] = {0};
    float *o1 = dp_test_upload(dev, dout, N * OC), *o2 = dp_test_upload(dev, dout, N * OC);
    float *gw1 = dp_test_upload(dev, zeros, OC * C), *gw2 = dp_test_upload(dev, zeros, OC * C);
    float *gb1 = dp_test_upload(dev, zeros, OC), *gb2 = dp_test_upload(dev, zeros, OC);
    float *di1 = dp_test_upload(dev, packed, N * C), *di2 = dp_test_upload(dev, rows, N * LD);

    dp_assert_ok(dp_linear_forward(dev, o1, dpacked, dw, db, N, C, OC));
    dp_assert_ok(dp_linear_forward_ld(dev, o2, drows, LD, dw, db, N, C, OC));
    dp_assert_ok(dp_linear_backward(dev, di1, gw1, gb1, ddout, dpacked, dw, N, C, OC));
    dp_assert_ok(dp_linear_backward_ld(dev, di2, gw2, gb2, ddout, drows, LD, dw, N, C, OC));
    float a[N * LD], e[N * LD];
    dp_assert_ok(dp_copy_d2h(dev, a, o2, N * OC * sizeof(float)));
    dp_assert_ok(dp_copy_d2h(dev, e, o1, N * OC * sizeof(float)));
    dp_assert_allclose(a, e, N * OC, 1e-6, 1e-6);
    dp_assert_ok(dp_copy_d2h(dev, a, gw2, OC * C * sizeof(float)));
    dp_assert_ok(dp_copy_d2h(dev, e, gw1, OC * C * sizeof(float)));
    dp_assert_allclose(a, e, OC * C, 1e-6, 1e-6);
    dp_assert_ok(dp_copy_d2h(dev, a, gb2, OC * sizeof(float)));
    dp_assert_ok(dp_copy_d2h(dev, e, gb1, OC * sizeof(float)));
    dp_assert_allclose(a, e, OC, 0.0, 0.0);
    dp_assert_ok(dp_copy_d2h(dev, a, di2, N * LD * sizeof(float)));
    dp_assert_ok(dp_copy_d2h(dev, e, di1, N * C * sizeof(float)));
    for (int r = 0; r < N; r++) {
        dp_assert_allclose(a + r * LD, e + r * C, C, 1e-6, 1e-6);
        /* the columns past C (y) are left alone */
        cr_assert(memcmp(a + r * LD + C, rows + r * LD + C, (LD - C) * sizeof(float)) == 0);
    }
    cr_assert_eq(dp_linear_forward_ld(dev, o2, drows, C - 1, dw, db, N, C, OC),
                 DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "ld_inp=3 is smaller than C=4"), "%s", dp_last_error());
    float *bufs[] = {drows, dpacked, dw, db, ddout, o1, o2, gw1, gw2, gb1, gb2, di1, di2};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) dp_device_free(dev, bufs[i]);
    dp_device_close(dev);
}

/* The staged path (non-host memory) gives exactly the CPU device's results. */
Test(ops, cuda_matches_cpu)
{
    if (dp_cuda_device_count() < 1) cr_skip_test("no CUDA device");
    dp_device_spec spec = {DP_DEVICE_CUDA, 0};
    dp_device *gpu = NULL, *cpu = dp_test_cpu(0);
    dp_assert_ok(dp_device_open(&spec, &gpu));
    enum { N = 3000 }; /* several staging chunks */
    static float x[N], t[N], got[N], want[N];
    dp_rng rng;
    dp_rng_seed(&rng, 12);
    dp_rng_fill_normal(&rng, x, N, 0.0f, 1.0f);
    dp_rng_fill_normal(&rng, t, N, 0.0f, 1.0f);
    for (int i = 0; i < N; i += 97) t[i] = NAN;
    dp_device *devs[2] = {cpu, gpu};
    double loss[2];
    size_t count[2];
    float *out[2] = {want, got};
    for (int d = 0; d < 2; d++) {
        float *dx = dp_test_upload(devs[d], x, N), *dt = dp_test_upload(devs[d], t, N);
        dp_criterion mse = dp_criterion_mse();
        dp_criterion_args a;
        memset(&a, 0, sizeof a);
        a.dev = devs[d];
        a.logits = a.dlogits = dx; /* in place, as balanced mode */
        a.targets = dt;
        a.target_type = DP_TARGET_F32;
        a.target_size = 4;
        a.n = N / 4;
        a.V = 4;
        a.dscale = 0.001f;
        dp_assert_ok(mse.forward_backward(mse.ctx, &a, &loss[d], &count[d]));
        dp_assert_ok(dp_axpy(devs[d], dx, 0.5f, dt, N)); /* NaNs where t is NaN */
        dp_assert_ok(dp_copy_d2h(devs[d], out[d], dx, sizeof got));
        dp_device_free(devs[d], dx);
        dp_device_free(devs[d], dt);
    }
    cr_assert_eq(count[0], count[1]);
    cr_assert_eq(loss[0], loss[1], "MSE loss differs: %.17g vs %.17g", loss[0], loss[1]);
    for (int i = 0; i < N; i++)
        cr_assert(memcmp(&got[i], &want[i], sizeof(float)) == 0, "element %d: %g vs %g", i,
                  got[i], want[i]);
    dp_device_close(gpu);
    dp_device_close(cpu);
}
