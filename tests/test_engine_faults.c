/*
 * The engine under faults: non-finite steps are skipped without touching
 * parameters, optimizer moments or the step counter, and name the device;
 * the watchdog turns a stalled worker in any phase into DP_ERR_TIMEOUT
 * naming device and phase, every worker comes back and the engine keeps
 * working; the replica check names a diverged replica. Every test ends
 * with the devices' accounting back to zero (dp_test_run_close).
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dp_test.h"

#include <criterion/parameterized.h>
#include "engine_fixture.h"
#include "core/clock.h"

#define NP 4096

typedef struct snapshot {
    float params[NP], m[NP], v[NP];
    long t;
} snapshot;

static void take(dp_engine *e, snapshot *s)
{
    dp_assert_ok(dp_engine_get_params(e, s->params));
    dp_assert_ok(dp_engine_get_optimizer_state(e, s->m, s->v, &s->t));
}

static void assert_same(const snapshot *a, const snapshot *b, size_t n, const char *when)
{
    cr_assert(memcmp(a->params, b->params, n * sizeof(float)) == 0, "%s changed the parameters", when);
    cr_assert(memcmp(a->m, b->m, n * sizeof(float)) == 0, "%s changed AdamW's first moment", when);
    cr_assert(memcmp(a->v, b->v, n * sizeof(float)) == 0, "%s changed AdamW's second moment", when);
    cr_assert_eq(a->t, b->t, "%s changed the step counter (%ld -> %ld)", when, a->t, b->t);
}

// --- non-finite steps ---------------------------------------------------------------------

/* 6 rows on 3 devices are 2/2/2; an Inf feature in row `bad_row` makes only
 * that device's chunk non-finite. */
static void non_finite_case(dp_mode mode, int bad_row, int want_device, int shard)
{
    run r;
    dp_engine_config cfg = dp_test_base_cfg(mode);
    cfg.shard_optimizer = shard;
    dp_test_run_open(&r, 3, cfg, NULL);
    float x[6 * D];
    int32_t y[6];
    dp_step_stats st;
    dp_test_make_batch(0, 6, 0, x, y);
    dp_batch b = {6, x, y};
    dp_assert_ok(dp_engine_step(r.e, &b, &st)); /* non-zero moments to protect */
    static snapshot before, after;
    take(r.e, &before);

    dp_test_make_batch(1, 6, 0, x, y);
    x[bad_row * D + 2] = INFINITY;
    dp_assert_ok(dp_engine_step(r.e, &b, &st));
    cr_assert(st.skipped, "a step with an Inf input was not skipped (loss %g)", st.loss);
    cr_assert(!isfinite(st.loss));
    cr_assert_eq(st.skipped_device, want_device, "skipped_device %d, want %d",
                 st.skipped_device, want_device);
    cr_assert_eq(st.step, 1);
    take(r.e, &after);
    assert_same(&before, &after, r.model.n_params, "a skipped step");

    /* The next finite batch trains normally from the untouched state. */
    dp_test_make_batch(2, 6, 0, x, y);
    dp_assert_ok(dp_engine_step(r.e, &b, &st));
    cr_assert(!st.skipped && isfinite(st.loss));
    cr_assert_eq(st.step, 2);
    dp_test_run_close(&r);
}

Test(engine_faults, non_finite_chunk_skips_the_update_balanced, .timeout = 10) { non_finite_case(DP_MODE_BALANCED, 3, 1, 0); }
Test(engine_faults, non_finite_chunk_skips_the_update_gather, .timeout = 10) { non_finite_case(DP_MODE_GATHER, 5, 2, 0); }
Test(engine_faults, non_finite_on_the_root, .timeout = 10) { non_finite_case(DP_MODE_BALANCED, 0, 0, 0); }
/* Sharded: every owner's m, v (and t) stay untouched. */
Test(engine_faults, non_finite_chunk_skips_the_update_sharded_balanced, .timeout = 10) { non_finite_case(DP_MODE_BALANCED, 3, 1, 1); }
Test(engine_faults, non_finite_chunk_skips_the_update_sharded_gather, .timeout = 10) { non_finite_case(DP_MODE_GATHER, 0, 0, 1); }

/* +Inf, not NaN, must skip the update too (isnan would let these through):
 * one device's criterion reports a +Inf loss sum with finite dlogits, or
 * one device's backward leaves a +Inf gradient element with a finite loss. */
static void infinity_case(dp_mode mode, int loss_dev, int grad_dev, int shard)
{
    hooked h;
    dp_engine_config cfg = dp_test_base_cfg(mode);
    cfg.shard_optimizer = shard;
    dp_engine *e = dp_test_hooked_open(&h, 3, cfg);
    float x[6 * D];
    int32_t y[6];
    dp_step_stats st;
    dp_batch b = {6, x, y};
    dp_test_make_batch(0, 6, 0, x, y);
    dp_assert_ok(dp_engine_step(e, &b, &st)); /* non-zero moments to protect */
    static snapshot before, after;
    take(e, &before);

    dp_test_make_batch(1, 6, 0, x, y);
    h.inf_loss_dev = loss_dev;
    h.inf_grad_dev = grad_dev;
    dp_assert_ok(dp_engine_step(e, &b, &st));
    cr_assert(st.skipped, "a step with a +Inf %s was not skipped (loss %g, grad norm %g)",
              loss_dev >= 0 ? "loss" : "gradient", st.loss, st.grad_norm);
    if (loss_dev >= 0) {
        cr_assert(isinf(st.loss) && st.loss > 0, "loss %g, want +Inf", st.loss);
        cr_assert_eq(st.skipped_device, loss_dev);
    } else {
        cr_assert(isfinite(st.loss), "the loss %g should stay finite", st.loss);
        cr_assert(isinf(st.grad_norm), "grad norm %g, want +Inf", st.grad_norm);
        cr_assert_eq(st.skipped_device, -1, "only the summed gradient was non-finite");
    }
    cr_assert_eq(st.step, 1);
    take(e, &after);
    assert_same(&before, &after, h.model.n_params, "a skipped +Inf step");

    h.inf_loss_dev = h.inf_grad_dev = -1;
    dp_assert_ok(dp_engine_step(e, &b, &st));
    cr_assert(!st.skipped && isfinite(st.loss) && isfinite(st.grad_norm));
    cr_assert_eq(st.step, 2);
    dp_test_hooked_close(&h, e);
}

Test(engine_faults, inf_loss_with_finite_gradients_is_skipped_balanced, .timeout = 10)
{
    infinity_case(DP_MODE_BALANCED, 1, -1, 0);
}
Test(engine_faults, inf_loss_with_finite_gradients_is_skipped_gather, .timeout = 10)
{
    infinity_case(DP_MODE_GATHER, 0, -1, 0); /* the root computes every loss */
}
Test(engine_faults, inf_gradient_with_finite_loss_is_skipped_balanced, .timeout = 10)
{
    infinity_case(DP_MODE_BALANCED, -1, 2, 0);
}
Test(engine_faults, inf_gradient_with_finite_loss_is_skipped_gather, .timeout = 10)
{
    infinity_case(DP_MODE_GATHER, -1, 0, 0);
}
Test(engine_faults, inf_loss_or_gradient_is_skipped_sharded, .timeout = 10)
{
    infinity_case(DP_MODE_BALANCED, 2, -1, 1);
    infinity_case(DP_MODE_BALANCED, -1, 1, 1); /* +Inf in slice 0, owned by device 0 */
    infinity_case(DP_MODE_GATHER, -1, 2, 1);
}

// --- watchdog -----------------------------------------------------------------------------

/* The watchdog tests' setup: the MLP on cpu:0,cpu:1 and a 6-row batch (3/3). */
static dp_batch open_two(run *r, dp_engine_config cfg, float *x, int32_t *y)
{
    dp_test_run_open(r, 2, cfg, NULL);
    dp_test_make_batch(0, 6, 0, x, y);
    return (dp_batch){6, x, y};
}

ParameterizedTestParameters(engine_faults, watchdog_names_stalled_device_and_phase)
{
    static int cases[4 * 2 * DP_PHASE_COUNT]; /* see dp_test_phase_cases */
    return cr_make_param_array(int, cases, dp_test_phase_cases(cases, 1, 1));
}

ParameterizedTest(int *c, engine_faults, watchdog_names_stalled_device_and_phase, .timeout = 10)
{
    int dev = *c / 10 % 10;
    dp_phase phase = (dp_phase)(*c % 10);
    dp_engine_config cfg = dp_test_case_cfg(*c);
    cfg.check_replicas_every = 1; /* the recovered steps check the replicas agree */
    run r;
    float x[6 * D];
    int32_t y[6];
    dp_batch b = open_two(&r, cfg, x, y);
    /* Watched from here on, for 1 s: at 0.2 s (and from creation on) a
     * machine busy with other tests fired it in creation, and in a phase
     * other than the stalled one (ctest -j2 under ASan, and 2 CPU hogs:
     * 8 of 25 runs); the stall never ends by itself, so any period shows
     * the same thing. */
    dp_engine_set_watchdog(r.e, 1.0);
    dp_step_stats st;
    static snapshot before, after;
    take(r.e, &before);

    /* A stall far longer than the test's timeout: only the watchdog's
     * abort can end it, so returning at all shows the abort reached the
     * stalled worker. */
    dp_engine_inject_stall(r.e, dev, phase, 1e9);
    dp_status s = dp_engine_step(r.e, &b, &st);
    cr_assert_eq(s, DP_ERR_TIMEOUT, "step returned %s: %s", dp_strerror(s), dp_last_error());
    /* Behaviour, not time: the workers came back within the grace period
     * (the engine is not marked unusable). */
    cr_assert(strstr(dp_last_error(), "the step was aborted") &&
                  !strstr(dp_last_error(), "unusable"),
              "the stalled worker did not come back: %s", dp_last_error());
    char want[64];
    snprintf(want, sizeof want, "cpu:%d %s:", dev, dp_phase_name(phase));
    cr_assert(strstr(dp_last_error(), want) && strstr(dp_last_error(), "watchdog"),
              "message \"%s\" does not name \"%s\" and the watchdog", dp_last_error(), want);
    if (phase < DP_PHASE_OPTIMIZER) {
        take(r.e, &after);
        assert_same(&before, &after, r.model.n_params, "a step stopped by the watchdog");
    }

    /* Every worker came back: the engine says so, trains on, and its
     * replicas agree. */
    dp_assert_ok(dp_engine_usable(r.e));
    for (int i = 0; i < 2; i++) dp_assert_ok(dp_engine_step(r.e, &b, &st));
    cr_assert(isfinite(st.loss));
    dp_test_run_close(&r);
}

Test(engine_faults, without_watchdog_a_stall_only_slows_the_step, .timeout = 10)
{
    run r;
    float x[6 * D];
    int32_t y[6];
    dp_batch b = open_two(&r, dp_test_base_cfg(DP_MODE_BALANCED), x, y);
    dp_step_stats st;
    dp_engine_inject_stall(r.e, 1, DP_PHASE_BACKWARD, 0.3);
    dp_assert_ok(dp_engine_step(r.e, &b, &st));
    /* The stall happened, on device 1 in its backward phase (a monotonic
     * sleep never ends early, so this lower bound is exact, not a race). */
    cr_assert_geq(st.devices[1].phase_seconds[DP_PHASE_BACKWARD], 0.3,
                  "the injected stall did not happen in cpu:1's backward (%g s)",
                  st.devices[1].phase_seconds[DP_PHASE_BACKWARD]);
    cr_assert_eq(st.step, 1);
    dp_test_run_close(&r);
}

/* Phase times come from marks recorded on the device; a job of many
 * micro-batches reads its older marks part-way (pool.c keeps at most 64).
 * A stall in the first backward must still be counted, in the backward. */
Test(engine_faults, phase_times_survive_many_micro_batches, .timeout = 20)
{
    dp_engine_config cfg = dp_test_base_cfg(DP_MODE_BALANCED);
    cfg.max_rows_per_micro = 1;
    run r;
    dp_test_run_open(&r, 2, cfg, NULL);
    enum { ROWS = 60 };
    static float x[ROWS * D];
    static int32_t y[ROWS];
    dp_test_make_batch(0, ROWS, 0, x, y);
    dp_batch b = {ROWS, x, y};
    dp_step_stats st;
    dp_engine_inject_stall(r.e, 1, DP_PHASE_BACKWARD, 0.3);
    dp_assert_ok(dp_engine_step(r.e, &b, &st));
    /* between the steps: must not be counted in the next */
    nanosleep(&(struct timespec){0, 300000000L}, NULL);
    const dp_device_step_stats *d = &st.devices[1];
    cr_assert_eq(d->micro_batches, ROWS / 2);
    cr_assert_geq(d->phase_seconds[DP_PHASE_BACKWARD], 0.3,
                  "the stall in cpu:1's first backward was lost (%g s)",
                  d->phase_seconds[DP_PHASE_BACKWARD]);
    double sum = 0.0;
    for (int p = 0; p < DP_PHASE_COUNT; p++) sum += d->phase_seconds[p];
    cr_assert_leq(sum, st.seconds, "phases sum to %g s in a %g s step", sum, st.seconds);
    /* The next step starts from fresh marks: nothing of the last one (its
     * stall, or the time between the steps) is counted again. */
    dp_assert_ok(dp_engine_step(r.e, &b, &st));
    for (int i = 0; i < 2; i++) {
        sum = 0.0;
        for (int p = 0; p < DP_PHASE_COUNT; p++) sum += st.devices[i].phase_seconds[p];
        cr_assert_leq(sum, st.seconds, "cpu:%d: phases sum to %g s in a %g s step", i, sum,
                      st.seconds);
    }
    dp_test_run_close(&r);
}

Test(engine_faults, a_slow_step_within_the_watchdog_succeeds, .timeout = 10)
{
    dp_engine_config cfg = dp_test_base_cfg(DP_MODE_GATHER);
    cfg.watchdog_seconds = 2.0;
    run r;
    float x[6 * D];
    int32_t y[6];
    dp_batch b = open_two(&r, cfg, x, y);
    dp_step_stats st;
    dp_engine_inject_stall(r.e, 0, DP_PHASE_FORWARD, 0.2);
    dp_assert_ok(dp_engine_step(r.e, &b, &st));
    cr_assert_eq(st.step, 1);
    dp_test_run_close(&r);
}

// --- replica consistency -------------------------------------------------------------------

static void replica_case(dp_mode mode, int k, int bad, int shard)
{
    dp_engine_config cfg = dp_test_base_cfg(mode);
    cfg.shard_optimizer = shard;
    cfg.check_replicas_every = 2;
    run r;
    dp_test_run_open(&r, k, cfg, NULL);
    float x[7 * D];
    int32_t y[7];
    dp_batch b = {7, x, y};
    dp_step_stats st;
    dp_engine_inject_divergence(r.e, bad);
    dp_test_make_batch(0, 7, 0, x, y);
    dp_assert_ok(dp_engine_step(r.e, &b, &st)); /* step 1: no check */
    dp_test_make_batch(1, 7, 0, x, y);
    dp_status s = dp_engine_step(r.e, &b, &st); /* step 2: checked */
    cr_assert_eq(s, DP_ERR_INTERNAL, "a diverged replica gave %s", dp_strerror(s));
    char want[64];
    snprintf(want, sizeof want, "replica on cpu:%d diverged", bad);
    cr_assert(strstr(dp_last_error(), want), "message \"%s\" lacks \"%s\"", dp_last_error(), want);
    /* Re-broadcast from the root: the next checked steps pass. */
    for (int i = 2; i < 6; i++) {
        dp_test_make_batch(i, 7, 0, x, y);
        dp_assert_ok(dp_engine_step(r.e, &b, &st));
    }
    cr_assert_eq(st.step, 6);
    dp_test_run_close(&r);
}

Test(engine_faults, diverged_replica_is_named_balanced, .timeout = 10) { replica_case(DP_MODE_BALANCED, 3, 2, 0); }
Test(engine_faults, diverged_replica_is_named_gather, .timeout = 10) { replica_case(DP_MODE_GATHER, 2, 1, 0); }
Test(engine_faults, diverged_replica_is_named_sharded, .timeout = 10)
{
    replica_case(DP_MODE_BALANCED, 4, 3, 1);
    replica_case(DP_MODE_GATHER, 3, 1, 1);
}

Test(engine_faults, replica_check_passes_every_step_when_replicas_agree, .timeout = 10)
{
    for (int mode = 0; mode < 4; mode++) {
        dp_engine_config cfg = dp_test_base_cfg((dp_mode)(mode % 2));
        cfg.shard_optimizer = mode / 2;
        cfg.check_replicas_every = 1;
        run r;
        dp_test_run_open(&r, 3, cfg, NULL);
        float x[7 * D];
        int32_t y[7];
        dp_batch b = {7, x, y};
        dp_step_stats st;
        for (int i = 0; i < 5; i++) {
            dp_test_make_batch(i, 7, 0, x, y);
            dp_assert_ok(dp_engine_step(r.e, &b, &st));
        }
        dp_test_run_close(&r);
    }
}

Test(engine_faults, bad_watchdog_and_check_settings_are_rejected, .timeout = 10)
{
    mlp net;
    dp_model model;
    mlp_config mc = {D, H, K, DP_DTYPE_F32};
    mlp_init_model(&net, &mc, &model);
    dp_criterion crit = dp_criterion_cross_entropy();
    dp_device_spec spec = {DP_DEVICE_CPU, 0};
    dp_engine *e = NULL;
    /* Negative, NaN, Inf, below the minimum (it would fire on every step
     * and break the engine) and above the maximum (1e19 once overflowed the
     * deadline and spun forever). */
    const double bad_wd[] = {-1.0, NAN, INFINITY, -INFINITY, 1e-9, DP_WATCHDOG_MIN_SECONDS / 2,
                             DP_WATCHDOG_MAX_SECONDS * 2, 1e19, DBL_MAX};
    for (size_t i = 0; i < sizeof bad_wd / sizeof *bad_wd; i++) {
        dp_engine_config cfg = dp_test_base_cfg(DP_MODE_BALANCED);
        cfg.watchdog_seconds = bad_wd[i];
        cr_assert_eq(dp_engine_create(&spec, 1, &model, &crit, &cfg, &e), DP_ERR_INVALID_ARGUMENT);
        cr_assert(strstr(dp_last_error(), "watchdog_seconds"), "%s", dp_last_error());
    }
    dp_engine_config cfg = dp_test_base_cfg(DP_MODE_BALANCED);
    cfg.check_replicas_every = -3;
    cr_assert_eq(dp_engine_create(&spec, 1, &model, &crit, &cfg, &e), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "check_replicas_every"), "%s", dp_last_error());
}

/* The bounds themselves and 0 (off) are accepted, and a step under the
 * largest watchdog returns at once (no overflowed deadline to spin on). */
Test(engine_faults, watchdog_bounds_are_accepted, .timeout = 10)
{
    /* 10 s, not less: creation is watched too, and a busy machine can
     * hold it up for a fraction of a second */
    const double good[] = {0.0, 10.0, DP_WATCHDOG_MAX_SECONDS};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        dp_engine_config cfg = dp_test_base_cfg(DP_MODE_BALANCED);
        cfg.watchdog_seconds = good[i];
        run r;
        float x[6 * D];
        int32_t y[6];
        dp_batch b = open_two(&r, cfg, x, y);
        dp_step_stats st;
        dp_assert_ok(dp_engine_step(r.e, &b, &st));
        dp_test_run_close(&r);
    }
    /* The minimum is accepted; a millisecond may really pass during the
     * setup on a busy machine, which is then the documented timeout. */
    mlp net;
    dp_model model;
    mlp_config mc = {D, H, K, DP_DTYPE_F32};
    mlp_init_model(&net, &mc, &model);
    dp_criterion crit = dp_criterion_cross_entropy();
    dp_device_spec spec = {DP_DEVICE_CPU, 0};
    dp_engine_config cfg = dp_test_base_cfg(DP_MODE_BALANCED);
    cfg.watchdog_seconds = DP_WATCHDOG_MIN_SECONDS;
    dp_engine *e = NULL;
    dp_status s = dp_engine_create(&spec, 1, &model, &crit, &cfg, &e);
    cr_assert(s == DP_OK || s == DP_ERR_TIMEOUT, "the minimum watchdog gave %s: %s",
              dp_strerror(s), dp_last_error());
    dp_engine_destroy(e);
}

/* Deadlines far in the future, NaN or negative never overflow time_t. */
Test(engine_faults, deadline_conversion_is_overflow_safe)
{
    const double ts[] = {0.0, 0.5, 1.25, 1e9, DP_DEADLINE_MAX_SECONDS, 1e19, DBL_MAX, INFINITY,
                         NAN, -1.0, -INFINITY};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) {
        struct timespec d = dp_deadline_at(ts[i]);
        cr_assert(d.tv_nsec >= 0 && d.tv_nsec < 1000000000L, "%g: tv_nsec %ld", ts[i], d.tv_nsec);
        cr_assert(d.tv_sec >= 0 && (double)d.tv_sec <= DP_DEADLINE_MAX_SECONDS,
                  "%g: tv_sec %lld", ts[i], (long long)d.tv_sec);
        if (ts[i] >= 1e9) /* far deadlines stay far: never wrapped to the past */
            cr_assert_geq((double)d.tv_sec, 1e9, "%g became %lld", ts[i], (long long)d.tv_sec);
    }
    struct timespec d = dp_deadline_at(1.25);
    cr_assert(d.tv_sec == 1 && d.tv_nsec == 250000000L);
}

/* A worker thread that cannot start (the user's limit on threads, ulimit
 * -u) is the user's resource running out, named with the fix, not an
 * internal error. In a child process under RLIMIT_NPROC 1; root ignores
 * the limit, so a root child runs as nobody first. */
Test(engine_faults, worker_threads_past_the_users_limit_are_out_of_memory, .timeout = 20)
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        close(fds[0]);
        mlp net;
        dp_model model;
        mlp_init_model(&net, &(mlp_config){D, H, K, DP_DTYPE_F32}, &model);
        dp_criterion ce = dp_criterion_cross_entropy();
        dp_engine_config cfg = dp_test_base_cfg(DP_MODE_BALANCED);
        dp_device_spec specs[2] = {{DP_DEVICE_CPU, 0}, {DP_DEVICE_CPU, 1}};
        dp_engine *e = NULL;
        /* One step first, so that the BLAS library's own threads exist
         * (OpenBLAS ends the process when it cannot start them). */
        float x[8 * D];
        int32_t y[8];
        dp_test_make_batch(1, 8, 0, x, y);
        dp_batch b = {8, x, y};
        if (dp_engine_create(specs, 2, &model, &ce, &cfg, &e) != DP_OK ||
            dp_engine_step(e, &b, NULL) != DP_OK)
            _exit(3);
        dp_engine_destroy(e);
        e = NULL;
        if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(77);
        struct rlimit one = {1, 1};
        if (setrlimit(RLIMIT_NPROC, &one) != 0) _exit(77);
        dp_status s = dp_engine_create(specs, 2, &model, &ce, &cfg, &e);
        char line[1100];
        int n = snprintf(line, sizeof line, "%d %s", (int)s, dp_last_error());
        if (write(fds[1], line, (size_t)n) != n) _exit(2);
        _exit(s == DP_ERR_OUT_OF_MEMORY && !e ? 0 : 1);
    }
    close(fds[1]);
    char got[1100] = {0};
    ssize_t n = read(fds[0], got, sizeof got - 1);
    close(fds[0]);
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status), "the child died: %d", status);
    if (WEXITSTATUS(status) == 77) cr_skip_test("cannot run a child as nobody under RLIMIT_NPROC");
    cr_assert_gt(n, 0);
    cr_assert_eq(WEXITSTATUS(status), 0, "status %s", got);
    cr_assert(strstr(got, "cannot start worker thread") && strstr(got, "ulimit -u"), "%s", got);
}
