/*
 * The optimizer state sharded over the devices (shard_optimizer, ZeRO
 * stage 1) against the reduce-to-root default, on CPU virtual devices:
 *
 *  - for a given k the two modes agree bitwise (losses, gradient norms,
 *    parameters, moments, step count), in both criterion modes, for AdamW
 *    and SGD, with clipping, idle devices (an idle owner, an idle device 0)
 *    and slices longer than one reduce-scatter chunk;
 *  - accounting: each device holds the moments of its own slice (the
 *    documented slice rule), the reduce-scatter stages at most one chunk,
 *    and nothing is allocated inside the reduce, update and all-gather; a
 *    limit the root's whole state exceeds fits the sharded state;
 *  - optimizer state moves between engines in the flat layout whatever the
 *    sharding: sharded cpu:4 -> root cpu:1 and back continue the run, and
 *    sharded k=2 -> root k=2 (and back) continues bitwise.
 */
#include <string.h>

#include "dp_test.h"

#include <criterion/parameterized.h>
#include "engine_fixture.h"
#include "parallel/comm.h"

/* Wide enough that every slice on up to 4 devices spans several chunks. */
enum { WIDE = 6000, NPW = 80000, ZSTEPS = 4 };

typedef struct state {
    double loss[ZSTEPS], norm[ZSTEPS];
    float p[NPW], m[NPW], v[NPW];
    long t;
    size_t n;
} state;

static void get_state(dp_engine *e, state *s)
{
    dp_assert_ok(dp_engine_get_params(e, s->p));
    dp_assert_ok(dp_engine_get_optimizer_state(e, s->m, s->v, &s->t));
}

/* Steps `from` .. `to`-1 of a run (batch s for step s). */
static void steps(dp_engine *e, int from, int to, int rows, state *s)
{
    static float x[MAXROWS * D];
    int32_t y[MAXROWS];
    for (int i = from; i < to; i++) {
        dp_test_make_batch(i, rows, 3, x, y);
        dp_batch b = {(size_t)rows, x, y};
        dp_step_stats st;
        dp_assert_ok(dp_engine_step(e, &b, &st));
        cr_assert(!st.skipped);
        s->loss[i] = st.loss;
        s->norm[i] = st.grad_norm;
    }
}

static void train(int k, dp_engine_config cfg, int rows, state *s)
{
    run r;
    mlp_config mc = {D, WIDE, K, DP_DTYPE_F32};
    dp_test_run_open(&r, k, cfg, &mc);
    cr_assert_leq(r.model.n_params, NPW);
    s->n = r.model.n_params;
    steps(r.e, 0, ZSTEPS, rows, s);
    get_state(r.e, s);
    dp_test_run_close(&r);
}

static void assert_bitwise(const state *a, const state *b, int adamw, const char *what)
{
    cr_assert_eq(a->n, b->n);
    cr_assert(memcmp(a->loss, b->loss, sizeof a->loss) == 0, "%s: losses differ", what);
    cr_assert(memcmp(a->norm, b->norm, sizeof a->norm) == 0, "%s: gradient norms differ", what);
    cr_assert(memcmp(a->p, b->p, a->n * sizeof(float)) == 0, "%s: parameters differ", what);
    cr_assert(memcmp(a->m, b->m, a->n * sizeof(float)) == 0, "%s: first moments differ", what);
    if (adamw)
        cr_assert(memcmp(a->v, b->v, a->n * sizeof(float)) == 0, "%s: second moments differ", what);
    cr_assert_eq(a->t, b->t, "%s: step counts differ", what);
}

// --- root == sharded, bitwise ----------------------------------------------------------------

typedef struct zcase {
    int k;
    dp_mode mode;
} zcase;

ParameterizedTestParameters(zero, sharded_equals_root_bitwise)
{
    static zcase cases[4 * 2];
    size_t n = 0;
    for (int m = 0; m < 2; m++)
        for (int k = 1; k <= 4; k++) cases[n++] = (zcase){k, (dp_mode)m};
    return cr_make_param_array(zcase, cases, n);
}

ParameterizedTest(zcase *c, zero, sharded_equals_root_bitwise, .timeout = 120)
{
    static state root, shard;
    /* 7 rows keep every device busy; 2 rows leave devices 2 and 3 idle
     * (idle owners); weights {0, 1, ...} leave device 0 idle. */
    static const float w0[DP_MAX_DEVICES] = {0.0f, 1.0f, 1.0f, 1.0f};
    for (int o = 0; o < DP_OPTIMIZER_COUNT; o++)
        for (int split = 0; split < 3; split++) {
            if (split == 2 && c->k < 2) continue;
            dp_engine_config cfg = dp_test_base_cfg(c->mode);
            cfg.optim.kind = (dp_optimizer)o;
            cfg.optim.momentum = 0.9f;
            cfg.optim.grad_clip = 0.05f; /* below every step's norm: always clips */
            if (split == 2) cfg.device_weights = w0;
            int rows = split == 1 ? 2 : 7;
            train(c->k, cfg, rows, &root);
            cfg.shard_optimizer = 1;
            train(c->k, cfg, rows, &shard);
            if (c->k > 1)
                cr_assert_gt(root.n / (size_t)c->k, DP_COMM_CHUNK_FLOATS_HOST,
                             "the slices should span several reduce-scatter chunks");
            for (int i = 0; i < ZSTEPS; i++)
                cr_assert_gt(root.norm[i], cfg.optim.grad_clip, "step %d did not clip", i);
            char what[96];
            snprintf(what, sizeof what, "k=%d %s %s split %d", c->k, dp_mode_name(c->mode),
                     o == DP_OPTIMIZER_ADAMW ? "adamw" : "sgd", split);
            assert_bitwise(&shard, &root, o == DP_OPTIMIZER_ADAMW, what);
            /* Not trivially equal: the moments are non-zero across the buffer. */
            size_t nz = 0;
            for (size_t i = 0; i < root.n; i++) nz += root.m[i] != 0.0f;
            cr_assert_gt(nz, root.n / 2, "%s: only %zu of %zu moments are non-zero", what, nz,
                         root.n);
        }
}

// --- accounting ------------------------------------------------------------------------------

/* The documented slice rule (dp/engine.h, shard_optimizer). */
static size_t slice_floats(size_t n, size_t k, size_t i)
{
    size_t b = n * i / k / DP_PARAM_ALIGN * DP_PARAM_ALIGN;
    size_t e = i + 1 == k ? n : n * (i + 1) / k / DP_PARAM_ALIGN * DP_PARAM_ALIGN;
    return e - b;
}

Test(zero, each_device_holds_its_slice_and_no_staging_of_params_size, .timeout = 60)
{
    enum { KD = 4 };
    for (int o = 0; o < DP_OPTIMIZER_COUNT; o++)
        for (int shard = 0; shard < 2; shard++) {
            dp_engine_config cfg = dp_test_base_cfg(DP_MODE_BALANCED);
            cfg.optim.kind = (dp_optimizer)o;
            cfg.shard_optimizer = shard;
            size_t per = o == DP_OPTIMIZER_ADAMW ? 2 : 1; /* moments per parameter */
            run r;
            mlp_config mc = {D, WIDE, K, DP_DTYPE_F32};
            dp_test_run_open(&r, KD, cfg, &mc);
            size_t n = r.model.n_params, fb = sizeof(float);
            size_t created[KD];
            for (size_t i = 0; i < KD; i++) {
                dp_memory_stats ms;
                dp_device_memory(dp_engine_device(r.e, i), &ms);
                size_t opt = shard ? per * slice_floats(n, KD, i) * fb
                                   : (i == 0 ? per * n * fb : 0);
                size_t fixed = 2 * n * fb + opt; /* params, grads, optimizer state */
                cr_assert_geq(ms.in_use, fixed, "device %zu holds %zu bytes < %zu", i,
                              ms.in_use, fixed);
                /* What the collectives stage: on host memory, the running sum
                 * of an owner other than device 0 (one chunk); never a
                 * params-sized buffer. */
                size_t staging = ms.in_use - fixed;
                size_t want = shard && i > 0 ? DP_COMM_CHUNK_FLOATS_HOST * fb : 0;
                cr_assert_eq(staging, want, "device %zu stages %zu bytes, want %zu (n %zu)", i,
                             staging, want, n * fb);
                cr_assert_eq(ms.peak, ms.in_use, "device %zu: a transient allocation at create", i);
                created[i] = ms.in_use;
            }
            float x[8 * D];
            int32_t y[8];
            dp_test_make_batch(0, 8, 0, x, y);
            dp_batch b = {8, x, y};
            dp_step_stats st;
            dp_assert_ok(dp_engine_step(r.e, &b, &st));
            size_t total = 0;
            for (size_t i = 0; i < KD; i++) {
                const dp_device_step_stats *d = &st.devices[i];
                size_t want = shard ? per * slice_floats(n, KD, i) * fb
                                    : (i == 0 ? per * n * fb : 0);
                cr_assert_eq(d->optimizer_bytes, want, "device %zu optimizer bytes %zu, want %zu",
                             i, d->optimizer_bytes, want);
                total += d->optimizer_bytes;
                /* The reduce-scatter, update and all-gather allocate nothing. */
                for (int p = DP_PHASE_REDUCE; p <= DP_PHASE_BROADCAST; p++)
                    cr_assert_leq(d->phase_peak[p], d->in_use,
                                  "device %zu allocated during %s", i, dp_phase_name((dp_phase)p));
                cr_assert_geq(d->in_use, created[i]);
                if (shard) /* every slice within an alignment step of n / k */
                    cr_assert_leq(slice_floats(n, KD, i), n / KD + DP_PARAM_ALIGN);
            }
            cr_assert_eq(total, per * n * fb, "the slices' state adds up to the whole");
            dp_test_run_close(&r);
        }
}

/* A per-device limit of params + grads + 1.5 x params: the root cannot
 * hold AdamW's 2 x params (create fails naming the root and the optimizer
 * state), four owners of a quarter each fit and train. */
Test(zero, a_limit_only_the_sharded_state_fits, .timeout = 60)
{
    mlp net;
    dp_model model;
    mlp_config mc = {D, WIDE, K, DP_DTYPE_F32};
    mlp_init_model(&net, &mc, &model);
    dp_criterion crit = dp_criterion_cross_entropy();
    dp_device_spec spec[4];
    for (int i = 0; i < 4; i++) spec[i] = (dp_device_spec){DP_DEVICE_CPU, i};
    size_t before = dp_device_bytes_freed_at_close();
    dp_engine_config c = dp_test_base_cfg(DP_MODE_BALANCED);
    c.memory_limit = (2 * model.n_params + 3 * model.n_params / 2) * sizeof(float);
    dp_engine *e = NULL;
    cr_assert_eq(dp_engine_create(spec, 4, &model, &crit, &c, &e), DP_ERR_OUT_OF_MEMORY);
    cr_assert(strstr(dp_last_error(), "optimizer state") && strstr(dp_last_error(), "on cpu:0"),
              "%s", dp_last_error());
    cr_assert_null(e);
    c.shard_optimizer = 1;
    dp_assert_ok(dp_engine_create(spec, 4, &model, &crit, &c, &e));
    float x[4 * D];
    int32_t y[4];
    dp_test_make_batch(0, 4, 0, x, y);
    dp_batch b = {4, x, y};
    dp_step_stats st;
    dp_assert_ok(dp_engine_step(e, &b, &st));
    dp_engine_destroy(e);
    cr_assert_eq(dp_device_bytes_freed_at_close(), before);
}

Test(zero, bad_shard_setting_is_rejected)
{
    mlp net;
    dp_model model;
    mlp_config mc = {D, H, K, DP_DTYPE_F32};
    mlp_init_model(&net, &mc, &model);
    dp_criterion crit = dp_criterion_cross_entropy();
    dp_device_spec spec[2] = {{DP_DEVICE_CPU, 0}, {DP_DEVICE_CPU, 1}};
    dp_engine *e = NULL;
    dp_engine_config c = dp_test_base_cfg(DP_MODE_BALANCED);
    c.shard_optimizer = 2;
    cr_assert_eq(dp_engine_create(spec, 2, &model, &crit, &c, &e), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "shard_optimizer 2"), "%s", dp_last_error());
    cr_assert_null(e);
    /* the other flags are 0 or 1 too */
    c.shard_optimizer = 0;
    c.token_balanced = 5;
    cr_assert_eq(dp_engine_create(spec, 2, &model, &crit, &c, &e), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "token_balanced 5"), "%s", dp_last_error());
    c.token_balanced = 0;
    c.allow_tf32 = -1;
    cr_assert_eq(dp_engine_create(spec, 2, &model, &crit, &c, &e), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "allow_tf32 -1"), "%s", dp_last_error());
    cr_assert_null(e);
}

// --- optimizer state across shardings ----------------------------------------------------------

/* Runs `half` steps on (ka, sharded a), moves params and optimizer state
 * into a fresh engine (kb, sharded b) and runs the rest there. */
static void handover(int ka, int sa, int kb, int sb, state *out)
{
    dp_engine_config ca = dp_test_base_cfg(DP_MODE_BALANCED), cb = ca;
    ca.shard_optimizer = sa;
    cb.shard_optimizer = sb;
    mlp_config mc = {D, WIDE, K, DP_DTYPE_F32};
    static state mid;
    run a, b;
    dp_test_run_open(&a, ka, ca, &mc);
    steps(a.e, 0, ZSTEPS / 2, 7, out);
    get_state(a.e, &mid);
    dp_test_run_close(&a);
    dp_test_run_open(&b, kb, cb, &mc);
    out->n = b.model.n_params;
    dp_assert_ok(dp_engine_set_params(b.e, mid.p));
    dp_assert_ok(dp_engine_set_optimizer_state(b.e, mid.m, mid.v, mid.t));
    steps(b.e, ZSTEPS / 2, ZSTEPS, 7, out);
    get_state(b.e, out);
    dp_test_run_close(&b);
}

Test(zero, state_moves_between_sharded_and_root_engines, .timeout = 120)
{
    static state ref, moved;
    dp_engine_config root = dp_test_base_cfg(DP_MODE_BALANCED), shard = root;
    shard.shard_optimizer = 1;

    /* Same k: the continuation is bitwise the uninterrupted run. */
    train(2, shard, 7, &ref);
    handover(2, 1, 2, 0, &moved);
    assert_bitwise(&moved, &ref, 1, "sharded k=2 -> root k=2");
    handover(2, 0, 2, 1, &moved);
    assert_bitwise(&moved, &ref, 1, "root k=2 -> sharded k=2");

    /* Sharded cpu:4 -> root cpu:1 and the reverse: within float tolerance
     * of the uninterrupted run (the device count changes the sum order). */
    train(4, shard, 7, &ref);
    handover(4, 1, 1, 0, &moved);
    cr_assert_eq(moved.t, ZSTEPS);
    dp_assert_allclose(moved.loss, ref.loss, ZSTEPS, 1e-7, 1e-5);
    dp_assert_allclose(moved.p, ref.p, ref.n, 1e-6, 1e-5);
    train(1, root, 7, &ref);
    handover(1, 0, 4, 1, &moved);
    cr_assert_eq(moved.t, ZSTEPS);
    dp_assert_allclose(moved.loss, ref.loss, ZSTEPS, 1e-7, 1e-5);
    dp_assert_allclose(moved.p, ref.p, ref.n, 1e-6, 1e-5);
    dp_assert_allclose(moved.m, ref.m, ref.n, 1e-7, 1e-4);
}
