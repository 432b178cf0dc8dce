/*
 * The DataParallel engine on CUDA devices.
 *
 *  - k logical devices on one GPU (cuda:0 x k) == cuda:0 alone, both modes,
 *    AdamW with clipping and SGD, with the MLP example (the invariant of
 *    tests/test_engine.c, now through peer copies, the reduce-scatter's
 *    staging chunks and several streams on one card); cuda:0,cuda:1 too
 *    when two GPUs exist;
 *  - the optimizer state sharded over the devices equals it on the root,
 *    bitwise;
 *  - one GPU == one CPU device, and identical runs are bitwise identical;
 *  - a GPT checkpoint written from GPU devices loads exactly and resumes on
 *    CPU devices, taking the same next step as the GPU run.
 *
 * Without a GPU every test skips with "no CUDA device" (probed in the test
 * body). DP_TEST_CUDA_AS_CPU=1 runs them on virtual CPU devices instead
 * (cuda:0 x k becomes cpu:0..k-1), to check the tests where no GPU exists.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/module.h"
#include "dp/checkpoint.h"
#include "dp_test.h"
#include "dp_test_fs.h"
#include "engine_fixture.h"
#include "gpt_fixture.h"

// --- targets ----------------------------------------------------------------------------

static int as_cpu(void)
{
    const char *e = getenv("DP_TEST_CUDA_AS_CPU");
    return e && strcmp(e, "1") == 0;
}

static int n_gpus(void) { return as_cpu() ? 2 : dp_cuda_device_count(); }

#define REQUIRE_GPU()                                          \
    do {                                                       \
        if (n_gpus() == 0) cr_skip_test("no CUDA device");     \
    } while (0)

/* k logical devices: cuda:ord[0], ..., or distinct CPU stand-ins. */
static void gpu_specs(dp_device_spec *specs, size_t k, const int *ord)
{
    for (size_t i = 0; i < k; i++) {
        specs[i].kind = as_cpu() ? DP_DEVICE_CPU : DP_DEVICE_CUDA;
        specs[i].index = as_cpu() ? (int)i : ord[i];
    }
}

static void cpu_specs(dp_device_spec *specs, size_t k)
{
    for (size_t i = 0; i < k; i++) specs[i] = (dp_device_spec){DP_DEVICE_CPU, (int)i};
}

static const int ZEROS[DP_MAX_DEVICES] = {0};

/* dp's own attention kernels in every test that does not ask for cuDNN's
 * (DP_CUDA_CUDNN is read as the devices open): the default, cuDNN's where
 * it loads, would run cuDNN under the tests of dp's kernels. */
__attribute__((constructor)) static void dp_kernels_unless_asked(void)
{
    setenv("DP_CUDA_CUDNN", "0", 1);
}

// --- the MLP runs (as tests/test_engine.c) -------------------------------------------------

enum { NP_MAX = 4096 };

/* The engine tests' configuration with the optimizer chosen: AdamW and
 * clipping are nearly scale-free, so SGD runs without clipping to catch a
 * wrong 1/N. */
static dp_engine_config cuda_cfg(dp_mode mode, dp_optimizer opt)
{
    dp_engine_config c = dp_test_base_cfg(mode);
    c.optim.kind = opt;
    c.optim.momentum = 0.9f;
    c.optim.grad_clip = opt == DP_OPTIMIZER_SGD ? 0.0f : 1.0f;
    return c;
}

/* A step's spans on each device (what --trace draws): in time order, none
 * starting before the one before ends, inside the step, and per phase
 * adding up to phase_seconds. On a GPU a job's first span is placed at the
 * host's time and the rest by the device's events: the slack allows the
 * launch latency between them. */
static void assert_spans(const dp_step_stats *st, int s)
{
    const double slack = 1e-4;
    for (size_t i = 0; i < st->n_devices; i++) {
        const dp_device_step_stats *d = &st->devices[i];
        cr_assert(d->n_spans > 0 && d->spans, "step %d device %zu: no spans", s, i);
        double sum[DP_PHASE_COUNT] = {0}, end = 0.0;
        for (size_t j = 0; j < d->n_spans; j++) {
            const dp_phase_span *sp = &d->spans[j];
            cr_assert(sp->start >= end - slack && sp->seconds >= 0.0 &&
                          sp->start + sp->seconds <= st->seconds + slack,
                      "step %d device %zu span %zu (%s): %g s for %g s, the one before ends at "
                      "%g s, the step lasts %g s", s, i, j, dp_phase_name(sp->phase), sp->start,
                      sp->seconds, end, st->seconds);
            end = sp->start + sp->seconds;
            sum[sp->phase] += sp->seconds;
        }
        for (int p = 0; p < DP_PHASE_COUNT; p++)
            cr_assert_float_eq(sum[p], d->phase_seconds[p], 1e-9, "step %d device %zu %s", s, i,
                               dp_phase_name((dp_phase)p));
    }
}

/* STEPS steps of the MLP on specs[0..k) with float32 or (bf16) bf16
 * replicas; losses and final parameters (the masters). */
static void train_mlp_as(const dp_device_spec *specs, size_t k, dp_engine_config cfg, int rows,
                         int bf16, double *losses, float *params)
{
    size_t before = dp_device_bytes_freed_at_close();
    mlp net;
    dp_model model;
    mlp_config mc = {D, H, K, bf16 ? DP_DTYPE_BF16 : DP_DTYPE_F32};
    mlp_init_model(&net, &mc, &model);
    cr_assert_leq(model.n_params, NP_MAX);
    dp_criterion crit = dp_criterion_cross_entropy();
    dp_engine *e = NULL;
    dp_assert_ok(dp_engine_create(specs, k, &model, &crit, &cfg, &e));
    float x[MAXROWS * D];
    int32_t y[MAXROWS];
    for (int s = 0; s < STEPS; s++) {
        dp_test_make_batch(s, rows, 3, x, y);
        dp_batch b = {(size_t)rows, x, y};
        dp_step_stats st;
        dp_assert_ok(dp_engine_step(e, &b, &st));
        cr_assert(!st.skipped, "step %d skipped", s);
        assert_spans(&st, s);
        losses[s] = st.loss;
    }
    memset(params, 0, NP_MAX * sizeof *params);
    dp_assert_ok(dp_engine_get_params(e, params));
    dp_engine_destroy(e);
    cr_assert_eq(dp_device_bytes_freed_at_close(), before, "the engine leaked device memory");
}

static void train_mlp(const dp_device_spec *specs, size_t k, dp_engine_config cfg, int rows,
                      double *losses, float *params)
{
    train_mlp_as(specs, k, cfg, rows, 0, losses, params);
}

/*
 * Tolerances as tests/test_engine.c: the k-device run sums the same
 * per-row gradients in another order (and cuBLAS picks its tiles by shape,
 * so rows split over devices are summed differently again): gradients
 * differ by float32 rounding (~1e-7 relative), and three steps keep the
 * parameters within 1e-6 absolute + 1e-5 relative, losses within 1e-5.
 */
static void assert_runs_agree(const double *l, const double *l_ref, const float *p,
                              const float *p_ref, const char *what)
{
    cr_log_info("%s", what);
    dp_assert_allclose(l, l_ref, STEPS, 1e-7, 1e-5);
    dp_assert_allclose(p, p_ref, NP_MAX, 1e-6, 1e-5);
}

Test(cuda_engine, k_logical_devices_on_one_gpu_equal_one, .timeout = 120)
{
    REQUIRE_GPU();
    static const int ks[] = {2, 3}, rows[] = {7, 16};
    for (int o = 0; o < DP_OPTIMIZER_COUNT; o++) {
        dp_device_spec one[1];
        gpu_specs(one, 1, ZEROS);
        for (int r = 0; r < 2; r++) {
            double l1[STEPS];
            static float p1[NP_MAX];
            train_mlp(one, 1, cuda_cfg(DP_MODE_BALANCED, (dp_optimizer)o), rows[r], l1, p1);
            for (int m = 0; m < DP_MODE_COUNT; m++)
                for (int ki = 0; ki < 2; ki++) {
                    dp_device_spec specs[3];
                    gpu_specs(specs, (size_t)ks[ki], ZEROS);
                    double lk[STEPS];
                    static float pk[NP_MAX];
                    train_mlp(specs, (size_t)ks[ki], cuda_cfg((dp_mode)m, (dp_optimizer)o), rows[r],
                              lk, pk);
                    char what[128];
                    snprintf(what, sizeof what, "%d logical devices, %s, %d rows, optimizer %d",
                             ks[ki], dp_mode_name((dp_mode)m), rows[r], o);
                    assert_runs_agree(lk, l1, pk, p1, what);
                }
        }
    }
}

Test(cuda_engine, two_gpus_equal_one, .timeout = 120)
{
    REQUIRE_GPU();
    if (n_gpus() < 2) cr_skip_test("fewer than two CUDA devices");
    static const int ord[2] = {0, 1};
    dp_device_spec one[1], two[2];
    gpu_specs(one, 1, ZEROS);
    gpu_specs(two, 2, ord);
    for (int m = 0; m < DP_MODE_COUNT; m++) {
        double l1[STEPS], l2[STEPS];
        static float p1[NP_MAX], p2[NP_MAX];
        train_mlp(one, 1, cuda_cfg(DP_MODE_BALANCED, DP_OPTIMIZER_ADAMW), 16, l1, p1);
        train_mlp(two, 2, cuda_cfg((dp_mode)m, DP_OPTIMIZER_ADAMW), 16, l2, p2);
        assert_runs_agree(l2, l1, p2, p1, dp_mode_name((dp_mode)m));
    }
}

/* STEPS steps of an MLP wide enough that each of k <= 3 slices spans
 * more than one reduce-scatter chunk of a GPU; losses, parameters and
 * moments (each *n floats, malloc'd, freed by the caller). */
static void train_wide(const dp_device_spec *specs, size_t k, dp_engine_config cfg,
                       double *losses, float **p, float **m, float **v, size_t *n)
{
    mlp net;
    dp_model model;
    mlp_config mc = {D, 300000, K, DP_DTYPE_F32};
    mlp_init_model(&net, &mc, &model);
    *n = model.n_params;
    dp_criterion crit = dp_criterion_cross_entropy();
    dp_engine *e = NULL;
    dp_assert_ok(dp_engine_create(specs, k, &model, &crit, &cfg, &e));
    float x[7 * D];
    int32_t y[7];
    for (int s = 0; s < STEPS; s++) {
        dp_test_make_batch(s, 7, 3, x, y);
        dp_batch b = {7, x, y};
        dp_step_stats st;
        dp_assert_ok(dp_engine_step(e, &b, &st));
        losses[s] = st.loss;
    }
    *p = malloc(*n * sizeof(float));
    *m = malloc(*n * sizeof(float));
    *v = malloc(*n * sizeof(float));
    cr_assert(*p && *m && *v);
    long t;
    dp_assert_ok(dp_engine_get_params(e, *p));
    dp_assert_ok(dp_engine_get_optimizer_state(e, *m, *v, &t));
    cr_assert_eq(t, STEPS);
    dp_engine_destroy(e);
}

/* The optimizer state sharded over cuda:0 x 3 (each owner reduces its
 * slice on its own stream through one staging chunk) against the root
 * owning it: the same additions in the same order, so bitwise equal
 * losses, parameters and moments, both modes; cuda:0,cuda:1 too when two
 * GPUs exist. */
Test(cuda_engine, sharded_optimizer_equals_root_bitwise, .timeout = 120)
{
    REQUIRE_GPU();
    static const int ord[2] = {0, 1};
    for (int g = 0; g < (n_gpus() >= 2 ? 2 : 1); g++) {
        size_t k = g ? 2 : 3;
        dp_device_spec specs[3];
        gpu_specs(specs, k, g ? ord : ZEROS);
        for (int mode = 0; mode < DP_MODE_COUNT; mode++) {
            double l0[STEPS], l1[STEPS];
            float *p0, *m0, *v0, *p1, *m1, *v1;
            size_t n;
            dp_engine_config cfg = cuda_cfg((dp_mode)mode, DP_OPTIMIZER_ADAMW);
            cfg.optim.grad_clip = 0.05f; /* clips */
            train_wide(specs, k, cfg, l0, &p0, &m0, &v0, &n);
            cfg.shard_optimizer = 1;
            train_wide(specs, k, cfg, l1, &p1, &m1, &v1, &n);
            cr_assert_gt(n / k, (size_t)1 << 20, "slices should span several staging chunks");
            cr_assert(memcmp(l0, l1, sizeof l0) == 0, "k=%zu %s: losses differ", k,
                      dp_mode_name((dp_mode)mode));
            cr_assert(memcmp(p0, p1, n * sizeof(float)) == 0, "parameters differ");
            cr_assert(memcmp(m0, m1, n * sizeof(float)) == 0, "first moments differ");
            cr_assert(memcmp(v0, v1, n * sizeof(float)) == 0, "second moments differ");
            free(p0), free(m0), free(v0), free(p1), free(m1), free(v1);
        }
    }
}

/* One GPU against one CPU device: the GEMMs (cuBLAS vs OpenBLAS) and exp
 * differ by float32 rounding only, so the same tolerance holds. Then the
 * same for cuda:0 x 2 against cpu:2 in gather mode. */
Test(cuda_engine, gpu_equals_cpu, .timeout = 120)
{
    REQUIRE_GPU();
    for (int o = 0; o < DP_OPTIMIZER_COUNT; o++) {
        dp_device_spec g1[2], c1[2];
        gpu_specs(g1, 2, ZEROS);
        cpu_specs(c1, 2);
        double lg[STEPS], lc[STEPS];
        static float pg[NP_MAX], pc[NP_MAX];
        train_mlp(g1, 1, cuda_cfg(DP_MODE_BALANCED, (dp_optimizer)o), 16, lg, pg);
        train_mlp(c1, 1, cuda_cfg(DP_MODE_BALANCED, (dp_optimizer)o), 16, lc, pc);
        assert_runs_agree(lg, lc, pg, pc, "one GPU vs one CPU device");
        train_mlp(g1, 2, cuda_cfg(DP_MODE_GATHER, (dp_optimizer)o), 16, lg, pg);
        train_mlp(c1, 2, cuda_cfg(DP_MODE_GATHER, (dp_optimizer)o), 16, lc, pc);
        assert_runs_agree(lg, lc, pg, pc, "cuda:0 x 2 vs cpu:2, gather");
    }
}

/* bf16 replicas and bf16 GEMMs (cuBLAS tensor cores; oneDNN or OpenBLAS on
 * the CPU): the products are exact, only float32 sums differ in order, but
 * a master that moves by an ulp may round to another bfloat16, so GPU and
 * CPU agree to bfloat16's resolution rather than float32's: losses within
 * 1e-3 relative, masters within 2e-3. Two GPU runs are bitwise equal. */
Test(cuda_engine, bf16_on_gpu_tracks_cpu_and_repeats_bitwise, .timeout = 120)
{
    REQUIRE_GPU();
    dp_device_spec g2[2], c2[2];
    gpu_specs(g2, 2, ZEROS);
    cpu_specs(c2, 2);
    double lg[STEPS], lc[STEPS], lg2[STEPS];
    static float pg[NP_MAX], pc[NP_MAX], pg2[NP_MAX];
    dp_engine_config cfg = cuda_cfg(DP_MODE_BALANCED, DP_OPTIMIZER_ADAMW);
    cfg.matmul_precision = DP_MATMUL_BF16;
    cfg.shard_optimizer = 1;
    train_mlp_as(g2, 2, cfg, 16, 1, lg, pg);
    train_mlp_as(c2, 2, cfg, 16, 1, lc, pc);
    dp_assert_allclose(lg, lc, STEPS, 1e-6, 1e-3);
    dp_assert_allclose(pg, pc, NP_MAX, 2e-3, 0);
    train_mlp_as(g2, 2, cfg, 16, 1, lg2, pg2);
    cr_assert(memcmp(lg, lg2, sizeof lg) == 0, "two bf16 GPU runs: losses differ");
    cr_assert(memcmp(pg, pg2, sizeof pg) == 0, "two bf16 GPU runs: masters differ");
}

/* Fixed-order kernels and one cuBLAS handle per stream: two identical runs
 * give identical bits, in both modes. */
Test(cuda_engine, same_seed_is_bitwise_identical, .timeout = 120)
{
    REQUIRE_GPU();
    dp_device_spec specs[2];
    gpu_specs(specs, 2, ZEROS);
    for (int m = 0; m < DP_MODE_COUNT; m++) {
        double la[STEPS], lb[STEPS];
        static float pa[NP_MAX], pb[NP_MAX];
        train_mlp(specs, 2, cuda_cfg((dp_mode)m, DP_OPTIMIZER_ADAMW), 7, la, pa);
        train_mlp(specs, 2, cuda_cfg((dp_mode)m, DP_OPTIMIZER_ADAMW), 7, lb, pb);
        cr_assert(memcmp(la, lb, sizeof la) == 0, "%s: losses differ between identical runs",
                  dp_mode_name((dp_mode)m));
        cr_assert(memcmp(pa, pb, sizeof pa) == 0, "%s: parameters differ between identical runs",
                  dp_mode_name((dp_mode)m));
    }
}

// --- the overlap on communication queues -------------------------------------------------------

enum { OSTEPS = 3, OROWS = 8 };

typedef struct overlap_run {
    double loss[OSTEPS], norm[OSTEPS];
    int overlapped[OSTEPS];
    float *params; /* n_params */
} overlap_run;

/* OSTEPS steps of model on k logical devices of GPU 0 with bucket bytes,
 * the optimizer state on the root or sharded, and random batches of OROWS
 * sequences of length T over vocabulary V (fixed seeds). */
static void run_overlap(const dp_model *model, size_t k, size_t bucket, int shard, size_t T,
                        size_t V, overlap_run *r)
{
    dp_device_spec specs[DP_MAX_DEVICES];
    gpu_specs(specs, k, ZEROS);
    dp_criterion crit = dp_criterion_cross_entropy();
    dp_engine_config cfg = dp_engine_config_default();
    cfg.optim.lr = 3e-3f;
    cfg.optim.grad_clip = 1.0f;
    cfg.seed = 5;
    cfg.bucket_bytes = bucket;
    cfg.shard_optimizer = shard;
    if (model->param_dtype == DP_DTYPE_BF16) cfg.matmul_precision = DP_MATMUL_BF16;
    dp_engine *e = NULL;
    dp_assert_ok(dp_engine_create(specs, k, model, &crit, &cfg, &e));
    int32_t *tok = malloc(OROWS * T * sizeof *tok), *tgt = malloc(OROWS * T * sizeof *tgt);
    cr_assert(tok && tgt);
    dp_rng rng;
    dp_rng_seed(&rng, 77);
    for (int s = 0; s < OSTEPS; s++) {
        for (size_t i = 0; i < OROWS * T; i++) {
            tok[i] = (int32_t)dp_rng_below(&rng, V);
            tgt[i] = (int32_t)dp_rng_below(&rng, V);
        }
        dp_batch b = {OROWS, tok, tgt};
        dp_step_stats st;
        dp_assert_ok(dp_engine_step(e, &b, &st));
        cr_assert(!st.skipped);
        r->loss[s] = st.loss;
        r->norm[s] = st.grad_norm;
        r->overlapped[s] = st.overlapped;
    }
    free(tok);
    free(tgt);
    dp_assert_ok(dp_engine_get_params(e, r->params));
    dp_engine_destroy(e);
}

/* The reduce-scatter overlapped with the backward on communication queues
 * (DP_CUDA_OVERLAP=1: a second stream per device, which sums while the
 * backward runs on the first): the GPT, which signals per block, gives
 * bitwise the losses, norms and parameters of the run without overlap, on
 * 2 and 3 logical devices of one GPU, root and sharded, float32 and bf16,
 * with a bucket of one float (every signal sums what is final) and the
 * default; a GPT of 4 layers of width 128 makes the backward long enough
 * for an unordered read to show. Every step reports the overlap; without
 * DP_CUDA_OVERLAP=1 none does on a GPU. (On CPU stand-ins the overlap
 * needs no queue and is always on.) */
Test(cuda_engine, overlap_on_comm_queues_is_bitwise, .timeout = 240)
{
    REQUIRE_GPU();
    const char *was = getenv("DP_CUDA_OVERLAP");
    char *saved = was ? strdup(was) : NULL;
    struct {
        dp_gpt_config gc;
        int bf16;
    } models[] = {
        {{.vocab_size = EV, .block_size = EBS, .n_layer = EL, .n_head = ENH, .n_embd = EC}, 0},
        {{.vocab_size = 1024, .block_size = 64, .n_layer = 4, .n_head = 4, .n_embd = 128}, 0},
        {{.vocab_size = 1024, .block_size = 64, .n_layer = 4, .n_head = 4, .n_embd = 128}, 1},
    };
    for (size_t mi = 0; mi < sizeof models / sizeof *models; mi++) {
        dp_gpt *g = NULL;
        dp_assert_ok(dp_gpt_create(&models[mi].gc, &g));
        const dp_model *m = dp_gpt_model(g, models[mi].bf16 ? DP_GPT_BF16_ACT : 0);
        size_t T = models[mi].gc.block_size, V = models[mi].gc.vocab_size;
        overlap_run ref, got;
        ref.params = malloc(m->n_params * sizeof(float));
        got.params = malloc(m->n_params * sizeof(float));
        cr_assert(ref.params && got.params);
        for (size_t k = 2; k <= 3; k++)
            for (int shard = 0; shard <= 1; shard++) {
                setenv("DP_CUDA_OVERLAP", "0", 1);
                run_overlap(m, k, DP_BUCKET_OFF, shard, T, V, &ref);
                static const size_t buckets[] = {sizeof(float), 0};
                for (size_t bi = 0; bi < 2; bi++) {
                    char what[160];
                    snprintf(what, sizeof what, "GPT C%zu L%zu %s on %zu devices, %s, bucket %zu",
                             models[mi].gc.n_embd, models[mi].gc.n_layer,
                             models[mi].bf16 ? "bf16" : "fp32", k, shard ? "sharded" : "root",
                             buckets[bi]);
                    if (!as_cpu()) { /* a GPU sums beside its backward only when asked */
                        run_overlap(m, k, buckets[bi], shard, T, V, &got);
                        for (int s = 0; s < OSTEPS; s++)
                            cr_assert(!got.overlapped[s], "%s: step %d overlapped without "
                                      "DP_CUDA_OVERLAP=1", what, s);
                    }
                    setenv("DP_CUDA_OVERLAP", "1", 1);
                    run_overlap(m, k, buckets[bi], shard, T, V, &got);
                    setenv("DP_CUDA_OVERLAP", "0", 1);
                    for (int s = 0; s < OSTEPS; s++) {
                        cr_assert(got.overlapped[s], "%s: step %d did not overlap", what, s);
                        cr_assert(!ref.overlapped[s], "%s: step %d of the reference overlapped",
                                  what, s);
                        cr_assert(got.loss[s] == ref.loss[s], "%s: step %d loss %.17g != %.17g",
                                  what, s, got.loss[s], ref.loss[s]);
                        cr_assert(got.norm[s] == ref.norm[s], "%s: step %d norm %.17g != %.17g",
                                  what, s, got.norm[s], ref.norm[s]);
                    }
                    for (size_t i = 0; i < m->n_params; i++)
                        cr_assert(memcmp(&got.params[i], &ref.params[i], sizeof(float)) == 0,
                                  "%s: parameter %zu %.9g != %.9g", what, i, got.params[i],
                                  ref.params[i]);
                }
            }
        free(ref.params);
        free(got.params);
        dp_gpt_destroy(g);
    }
    if (saved) setenv("DP_CUDA_OVERLAP", saved, 1);
    else unsetenv("DP_CUDA_OVERLAP");
    free(saved);
}

// --- GPT checkpoint: GPU -> file -> CPU --------------------------------------------------------


/* model NULL: the float32 GPT; otherwise model in BF16 matmul precision. */
/* The engine tests' GPT (EV, EL, ENH, EC) with context block_size. */
static dp_gpt *engine_gpt(size_t block_size)
{
    dp_gpt_config gc = {
        .vocab_size = EV, .block_size = block_size, .n_layer = EL, .n_head = ENH, .n_embd = EC};
    dp_gpt *g = NULL;
    dp_assert_ok(dp_gpt_create(&gc, &g));
    return g;
}

static dp_engine *gpt_engine_of(const dp_gpt *g, const dp_model *model,
                                const dp_device_spec *specs, size_t k)
{
    dp_criterion crit = dp_criterion_cross_entropy();
    dp_engine_config cfg = dp_engine_config_default();
    cfg.optim.lr = 3e-3f;
    cfg.optim.grad_clip = 1.0f;
    cfg.seed = 11;
    if (model) cfg.matmul_precision = DP_MATMUL_BF16;
    dp_engine *e = NULL;
    dp_assert_ok(dp_engine_create(specs, k, model ? model : dp_gpt_model(g, 0), &crit, &cfg, &e));
    return e;
}

static dp_engine *gpt_engine(const dp_gpt *g, const dp_device_spec *specs, size_t k)
{
    return gpt_engine_of(g, NULL, specs, k);
}

static double gpt_step(dp_engine *e, int s)
{
    int32_t tok[EROWS * EBS], tgt[EROWS * EBS];
    dp_test_gpt_batch(s, EROWS, tok, tgt);
    dp_batch b = {EROWS, tok, tgt};
    dp_step_stats st;
    dp_assert_ok(dp_engine_step(e, &b, &st));
    cr_assert(!st.skipped);
    return st.loss;
}

/* Every stored tensor equal bit for bit (padding between tensors is not stored). */
static void assert_tensors_equal(const dp_gpt *g, const float *a, const float *b, const char *what)
{
    const dp_model *m = dp_gpt_model(g, 0);
    for (size_t t = 0; t < m->n_tensors; t++) {
        const dp_param_tensor *pt = &m->tensors[t];
        cr_assert(memcmp(a + pt->offset, b + pt->offset, pt->numel * sizeof(float)) == 0,
                  "%s: tensor %s differs after the checkpoint round trip", what, pt->name);
    }
}

/* The key third of each c_attn.bias: its exact gradient is zero (softmax
 * ignores a shift shared by all keys), so its float gradient is rounding
 * noise and AdamW may step it by +-lr either way (tests/test_gpt.c). */
static int is_key_bias(const dp_gpt *g, size_t i)
{
    const dp_model *m = dp_gpt_model(g, 0);
    for (size_t t = 0; t < m->n_tensors; t++) {
        const dp_param_tensor *pt = &m->tensors[t];
        size_t nl = strlen(pt->name);
        if (nl >= 16 && strcmp(pt->name + nl - 16, "attn.c_attn.bias") == 0 &&
            i >= pt->offset + EC && i < pt->offset + 2 * EC)
            return 1;
    }
    return 0;
}

/*
 * Three steps on cuda:0 x 2, checkpoint, load: parameters and moments come
 * back bit for bit. Then one more step from that state on cpu:2 and on the
 * GPUs: same loss (rtol 1e-5) and parameters within float32 rounding of
 * one step's gradients (atol 1e-6, rtol 2e-5; key biases to 2 lr).
 */
Test(cuda_engine, gpt_checkpoint_from_gpu_resumes_on_cpu, .timeout = 120)
{
    REQUIRE_GPU();
    char dir[] = "/tmp/dp_test_cuda_ck_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/gpu.safetensors", dir);

    dp_gpt *g = engine_gpt(EBS);
    size_t n = dp_gpt_model(g, 0)->n_params;
    dp_device_spec gs[2], cs[2];
    gpu_specs(gs, 2, ZEROS);
    cpu_specs(cs, 2);

    dp_engine *eg = gpt_engine(g, gs, 2);
    for (int s = 0; s < 3; s++) gpt_step(eg, s);
    float *p = calloc(n, sizeof *p), *m = calloc(n, sizeof *m), *v = calloc(n, sizeof *v);
    cr_assert(p && m && v);
    long t = 0;
    dp_assert_ok(dp_engine_get_params(eg, p));
    dp_assert_ok(dp_engine_get_optimizer_state(eg, m, v, &t));
    cr_assert_eq(t, 3);

    dp_checkpoint ck;
    memset(&ck, 0, sizeof ck);
    ck.step = 3;
    ck.optimizer_step = t;
    ck.params = p;
    ck.m = m;
    ck.v = v;
    dp_assert_ok(dp_gpt_checkpoint_save(path, g, &ck));
    dp_checkpoint *ld = NULL;
    dp_assert_ok(dp_gpt_checkpoint_load(path, &ld, NULL));
    cr_assert_eq(ld->optimizer_step, 3);
    assert_tensors_equal(g, ld->params, p, "params");
    assert_tensors_equal(g, ld->m, m, "exp_avg");
    assert_tensors_equal(g, ld->v, v, "exp_avg_sq");

    dp_engine *ec = gpt_engine(g, cs, 2);
    dp_assert_ok(dp_engine_set_params(ec, ld->params));
    dp_assert_ok(dp_engine_set_optimizer_state(ec, ld->m, ld->v, ld->optimizer_step));
    double loss_c = gpt_step(ec, 3), loss_g = gpt_step(eg, 3);
    cr_assert(fabs(loss_c - loss_g) <= 1e-5 * fabs(loss_g), "step 4 loss: cpu %.9g, gpu %.9g",
              loss_c, loss_g);
    float *pc = calloc(n, sizeof *pc), *pg = calloc(n, sizeof *pg);
    cr_assert(pc && pg);
    dp_assert_ok(dp_engine_get_params(ec, pc));
    dp_assert_ok(dp_engine_get_params(eg, pg));
    double lr = 3e-3;
    for (size_t i = 0; i < n; i++)
        if (is_key_bias(g, i)) {
            cr_assert(fabs(pc[i] - pg[i]) <= 2.0 * lr, "key bias %zu: %g vs %g", i, pc[i], pg[i]);
            pc[i] = pg[i];
        }
    dp_assert_allclose(pc, pg, n, 1e-6, 2e-5);
    cr_assert(memcmp(pg, p, n * sizeof *p) != 0, "the resumed step changed nothing");

    dp_engine_destroy(ec);
    dp_engine_destroy(eg);
    dp_checkpoint_close(ld);
    free(p);
    free(m);
    free(v);
    free(pc);
    free(pg);
    dp_gpt_destroy(g);
    dp_test_remove_tree(dir);
}

/* The padded vocabulary (dp_gpt_config.vocab_pad 64: 37 logits to 64)
 * on the GPUs: the -inf fill kernel and cuBLAS with m = 64, float32 and
 * with bf16 activations, track the unpadded GPT on the CPU over three
 * steps (losses within 1e-5 and 1e-3 relative, as the tests above), and
 * wte's padded rows stay exactly zero in the parameters and both moments. */
Test(cuda_engine, gpt_padded_vocab_on_gpu_tracks_cpu, .timeout = 120)
{
    REQUIRE_GPU();
    dp_gpt *g = engine_gpt(EBS), *gp = NULL;
    dp_gpt_config pc = *dp_gpt_config_of(g);
    pc.vocab_pad = 64;
    dp_assert_ok(dp_gpt_create(&pc, &gp));
    const dp_model *m = dp_gpt_model(gp, 0);
    size_t n = m->n_params, pad0 = m->tensors[0].numel, pad1 = m->tensors[1].offset;
    cr_assert_eq(m->n_classes, 64);
    dp_device_spec gs[2], cs[2];
    gpu_specs(gs, 2, ZEROS);
    cpu_specs(cs, 2);
    for (int bf16 = 0; bf16 < 2; bf16++) {
        dp_engine *eg = gpt_engine_of(gp, bf16 ? dp_gpt_model(gp, DP_GPT_BF16_ACT) : NULL, gs, 2);
        dp_engine *ec = gpt_engine_of(g, bf16 ? dp_gpt_model(g, DP_GPT_BF16_ACT) : NULL, cs, 2);
        double rtol = bf16 ? 1e-3 : 1e-5;
        for (int s = 0; s < 3; s++) {
            double lg = gpt_step(eg, s), lc = gpt_step(ec, s);
            cr_assert(fabs(lg - lc) <= rtol * fabs(lc), "%s step %d: padded on the gpu %.9g, "
                      "unpadded on the cpu %.9g", bf16 ? "bf16" : "fp32", s, lg, lc);
        }
        float *bufs[3];
        for (int i = 0; i < 3; i++) cr_assert_not_null(bufs[i] = calloc(n, sizeof(float)));
        long t = 0;
        dp_assert_ok(dp_engine_get_params(eg, bufs[0]));
        dp_assert_ok(dp_engine_get_optimizer_state(eg, bufs[1], bufs[2], &t));
        for (int i = 0; i < 3; i++) {
            for (size_t j = pad0; j < pad1; j++) {
                uint32_t bits;
                memcpy(&bits, &bufs[i][j], sizeof bits);
                cr_assert_eq(bits, 0u, "buffer %d (params, m, v): float %zu of wte's padded "
                             "rows is %g", i, j, bufs[i][j]);
            }
            free(bufs[i]);
        }
        dp_engine_destroy(eg);
        dp_engine_destroy(ec);
    }
    dp_gpt_destroy(gp);
    dp_gpt_destroy(g);
}

/* The GPT with bfloat16 activations (what lm_train --precision bf16
 * trains): the bf16 kernels (the GELU backward from bfloat16, the
 * conversions, cuBLAS over bfloat16 operands) on the GPU track the CPU to
 * bfloat16's resolution over three steps (losses within 1e-3 relative).
 * Recomputing the attention probabilities and the GELU output (cuBLAS,
 * the softmax and the GELU again on the same values) gives the same GPU
 * run bit for bit. */
Test(cuda_engine, gpt_bf16_activations_on_gpu_track_cpu, .timeout = 120)
{
    REQUIRE_GPU();
    dp_gpt *g = engine_gpt(EBS);
    const dp_model *act = dp_gpt_model(g, DP_GPT_BF16_ACT);
    const dp_model *again = dp_gpt_model(g, DP_GPT_BF16_ACT | DP_GPT_RECOMPUTE_ATTENTION |
                                                   DP_GPT_RECOMPUTE_GELU);
    dp_device_spec gs[2], cs[2];
    gpu_specs(gs, 2, ZEROS);
    cpu_specs(cs, 2);
    dp_engine *eg = gpt_engine_of(g, act, gs, 2), *eg2 = gpt_engine_of(g, again, gs, 2);
    dp_engine *ec = gpt_engine_of(g, act, cs, 2);
    for (int s = 0; s < 3; s++) {
        double lg = gpt_step(eg, s), lg2 = gpt_step(eg2, s), lc = gpt_step(ec, s);
        cr_assert(fabs(lg - lc) <= 1e-3 * fabs(lc), "step %d: gpu %.9g, cpu %.9g", s, lg, lc);
        cr_assert(lg == lg2, "step %d: %.17g keeping the probabilities, %.17g recomputing", s,
                  lg, lg2);
    }
    dp_engine_destroy(eg);
    dp_engine_destroy(eg2);
    dp_engine_destroy(ec);
    dp_gpt_destroy(g);
}

/* The MLP's GELU in cuBLASLt's epilogues (DP_CUDA_LT_GELU=1: c_fc's GEMM
 * stores the pre-activation and its GELU, c_proj's input-gradient GEMM
 * multiplies by GELU') in the GPT with bfloat16 activations: two runs give
 * the same bits, and the run tracks the CPU (the compositions) within the
 * 1e-3 relative the bf16 GPU runs are held to above over three steps; so
 * does the run that recomputes the GELU (its forward not fused). */
Test(cuda_engine, gpt_gelu_epilogue_repeats_bitwise_and_tracks_cpu, .timeout = 120)
{
    REQUIRE_GPU();
    if (as_cpu()) cr_skip_test("cuBLASLt runs on GPUs only");
    cr_assert_eq(setenv("DP_CUDA_LT_GELU", "1", 1), 0); /* read as the devices open */
    dp_gpt *g = engine_gpt(EBS);
    const dp_model *act = dp_gpt_model(g, DP_GPT_BF16_ACT);
    const dp_model *rg = dp_gpt_model(g, DP_GPT_BF16_ACT | DP_GPT_RECOMPUTE_GELU);
    dp_device_spec gs[2], cs[2];
    gpu_specs(gs, 2, ZEROS);
    cpu_specs(cs, 2);
    dp_engine *e1 = gpt_engine_of(g, act, gs, 2), *e2 = gpt_engine_of(g, act, gs, 2);
    dp_engine *e3 = gpt_engine_of(g, rg, gs, 2), *ec = gpt_engine_of(g, act, cs, 2);
    for (int s = 0; s < 3; s++) {
        double l1 = gpt_step(e1, s), l2 = gpt_step(e2, s), l3 = gpt_step(e3, s),
               lc = gpt_step(ec, s);
        cr_assert(l1 == l2, "step %d: %.17g, then %.17g on the same GPU run", s, l1, l2);
        cr_assert(fabs(l1 - lc) <= 1e-3 * fabs(lc), "step %d: epilogue %.9g, cpu %.9g", s, l1,
                  lc);
        cr_assert(fabs(l3 - lc) <= 1e-3 * fabs(lc), "step %d: recomputed GELU %.9g, cpu %.9g",
                  s, l3, lc);
    }
    dp_engine_destroy(e1);
    dp_engine_destroy(e2);
    dp_engine_destroy(e3);
    dp_engine_destroy(ec);
    dp_gpt_destroy(g);
    unsetenv("DP_CUDA_LT_GELU");
}

/* Steps of a GPT whose context spans three attention chunks (64 + 64 + 22). */
enum { CT = 2 * DP_GPT_ATTENTION_CHUNK + 22 };

static double gpt_step_long(dp_engine *e, int s)
{
    static int32_t tok[EROWS * CT], tgt[EROWS * CT];
    dp_rng rng;
    dp_rng_seed(&rng, 700 + (uint64_t)s);
    for (size_t i = 0; i < EROWS * CT; i++) tok[i] = (int32_t)dp_rng_below(&rng, EV);
    for (size_t i = 0; i < EROWS * CT; i++)
        tgt[i] = i % 9 == 4 ? -1 : (i + 1) % CT ? tok[i + 1] : 0;
    dp_batch b = {EROWS, tok, tgt};
    dp_step_stats st;
    dp_assert_ok(dp_engine_step(e, &b, &st));
    cr_assert(!st.skipped);
    return st.loss;
}

/* Chunked attention on the GPU (cuBLAS over strided chunks of queries,
 * the softmax kernel at a query offset): float32 tracks the CPU's chunked
 * run and the GPU's whole-matrix run within 1e-5 relative (GEMM
 * orders differ); bf16 activations in BF16 math track the CPU within 1e-3. */
Test(cuda_engine, gpt_chunked_attention_on_gpu_tracks_cpu, .timeout = 120)
{
    REQUIRE_GPU();
    dp_gpt *g = engine_gpt(CT);
    dp_device_spec gs[2], cs[2];
    gpu_specs(gs, 2, ZEROS);
    cpu_specs(cs, 2);
    const dp_model *whole = dp_gpt_model(g, 0), *ch = dp_gpt_model(g, DP_GPT_CHUNKED_ATTENTION);
    dp_criterion crit = dp_criterion_cross_entropy();
    dp_engine_config cfg = dp_engine_config_default();
    cfg.optim.lr = 3e-3f;
    cfg.optim.grad_clip = 1.0f;
    cfg.seed = 11;
    dp_engine *eg = NULL, *egw = NULL, *ec = NULL;
    dp_assert_ok(dp_engine_create(gs, 2, ch, &crit, &cfg, &eg));
    dp_assert_ok(dp_engine_create(gs, 2, whole, &crit, &cfg, &egw));
    dp_assert_ok(dp_engine_create(cs, 2, ch, &crit, &cfg, &ec));
    for (int s = 0; s < 3; s++) {
        double lg = gpt_step_long(eg, s), lw = gpt_step_long(egw, s), lc = gpt_step_long(ec, s);
        cr_assert(fabs(lg - lc) <= 1e-5 * fabs(lc), "step %d: gpu %.9g, cpu %.9g", s, lg, lc);
        cr_assert(fabs(lg - lw) <= 1e-5 * fabs(lw), "step %d: chunked %.9g, whole %.9g", s, lg,
                  lw);
    }
    dp_engine_destroy(eg);
    dp_engine_destroy(egw);
    dp_engine_destroy(ec);
    const dp_model *act = dp_gpt_model(g, DP_GPT_BF16_ACT | DP_GPT_CHUNKED_ATTENTION);
    eg = gpt_engine_of(g, act, gs, 2);
    ec = gpt_engine_of(g, act, cs, 2);
    for (int s = 0; s < 3; s++) {
        double lg = gpt_step_long(eg, s), lc = gpt_step_long(ec, s);
        cr_assert(fabs(lg - lc) <= 1e-3 * fabs(lc), "bf16 step %d: gpu %.9g, cpu %.9g", s, lg,
                  lc);
    }
    dp_engine_destroy(eg);
    dp_engine_destroy(ec);
    dp_gpt_destroy(g);
}

/* cuDNN's fused attention (DP_CUDA_CUDNN=1, backend/cuda/cuda_sdpa.c) in
 * the GPT with bfloat16 activations, at head size 64 and a context of 150
 * (past cuDNN's 64- and 128-row tiles, no multiple of them): two runs give
 * the same bits (its backward is the deterministic algorithm), so does a
 * run with DP_CUDA_CUDNN unset (the default: cuDNN's where it loads), and all
 * track the CPU's fused run within 1e-3 relative over three steps, the
 * resolution the bf16 GPU runs are held to above. Skips where the module
 * or cuDNN is missing. */
Test(cuda_engine, gpt_cudnn_attention_repeats_bitwise_and_tracks_cpu, .timeout = 120)
{
    REQUIRE_GPU();
    if (as_cpu()) cr_skip_test("cuDNN runs on GPUs only");
    const void *table = NULL;
    if (dp_module_load(DP_MODULE_CUDNN, &table) != DP_OK)
        cr_skip_test("no cuDNN attention here: %s", dp_last_error());
    cr_assert_eq(setenv("DP_CUDA_CUDNN", "1", 1), 0); /* read as the devices open */
    dp_gpt_config gc = {
        .vocab_size = EV, .block_size = CT, .n_layer = EL, .n_head = 2, .n_embd = 128};
    dp_gpt *g = NULL;
    dp_assert_ok(dp_gpt_create(&gc, &g));
    const dp_model *m = dp_gpt_model(g, DP_GPT_BF16_ACT | DP_GPT_FUSED_ATTENTION);
    dp_device_spec gs[2], cs[2];
    gpu_specs(gs, 2, ZEROS);
    cpu_specs(cs, 2);
    dp_engine *e1 = gpt_engine_of(g, m, gs, 2), *e2 = gpt_engine_of(g, m, gs, 2);
    dp_engine *ec = gpt_engine_of(g, m, cs, 2);
    cr_assert_eq(unsetenv("DP_CUDA_CUDNN"), 0); /* the default: cuDNN's, as it loads here */
    dp_engine *ed = gpt_engine_of(g, m, gs, 2);
    for (int s = 0; s < 3; s++) {
        double l1 = gpt_step_long(e1, s), l2 = gpt_step_long(e2, s), lc = gpt_step_long(ec, s);
        double ld = gpt_step_long(ed, s);
        cr_assert(l1 == l2, "step %d: %.17g, then %.17g on the same GPU run", s, l1, l2);
        cr_assert(l1 == ld, "step %d: %.17g with DP_CUDA_CUDNN=1, %.17g by default", s, l1, ld);
        cr_assert(fabs(l1 - lc) <= 1e-3 * fabs(lc), "step %d: cuDNN %.9g, cpu %.9g", s, l1, lc);
    }
    dp_engine_destroy(e1);
    dp_engine_destroy(e2);
    dp_engine_destroy(ed);
    dp_engine_destroy(ec);
    dp_gpt_destroy(g);
    setenv("DP_CUDA_CUDNN", "0", 1);
}

// --- CUDA graphs: a recorded compute phase replays the eager bits ----------------------------

enum { GSTEPS = 8 };

/* The graph test's schedule: step s's batch (a shorter one at s = 3, every
 * target valid at s = 6, the fixture's ignored targets otherwise), an
 * evaluation after steps 2, 4 and 6. Writes the losses in order into
 * loss (GSTEPS + 3), the parameters into params, and per device its
 * replays, why its last recording failed and whether the last step's
 * stats say it replayed. */
static void graph_run(const dp_gpt *g, const dp_model *m, size_t k, double *loss, float *params,
                      uint64_t *replays, const char **why, int *last_replayed)
{
    dp_device_spec gs[2];
    gpu_specs(gs, k, ZEROS);
    dp_engine *e = gpt_engine_of(g, m, gs, k);
    int32_t tok[EROWS * EBS], tgt[EROWS * EBS];
    dp_step_stats st;
    size_t at = 0;
    for (int s = 0; s < GSTEPS; s++) {
        size_t rows = s == 3 ? EROWS - 1 : EROWS;
        dp_test_gpt_batch(s, EROWS, tok, tgt);
        for (size_t i = 0; s == 6 && i < EROWS * EBS; i++)
            if (tgt[i] < 0) tgt[i] = tok[i];
        dp_batch b = {rows, tok, tgt};
        dp_assert_ok(dp_engine_step(e, &b, &st));
        loss[at++] = st.loss;
        if (s == 2 || s == 4 || s == 6) {
            dp_batch eb = {EROWS, tok, tgt};
            dp_assert_ok(dp_engine_evaluate(e, &eb, &st));
            loss[at++] = st.loss;
        }
    }
    for (size_t d = 0; d < k; d++) last_replayed[d] = st.devices[d].replayed;
    dp_assert_ok(dp_engine_get_params(e, params));
    for (size_t d = 0; d < k; d++) replays[d] = dp_engine_graph_replays(e, d, &why[d]);
    dp_engine_destroy(e);
}

/* DP_CUDA_GRAPHS=1 (read as the devices open): from the second step of a
 * shape, each device's compute phase is recorded once and replayed. The
 * losses, evaluations and parameters are those of the eager run bit for
 * bit - fp32, bf16 activations with dp's fused attention, and cuDNN's
 * where it loads - on one device and on two sharing the GPU, through a
 * shorter batch, evaluations and a batch without ignored targets (each a
 * recording of its own). Every device replays; without the variable none
 * does. */
Test(cuda_engine, gpt_graph_replays_keep_the_eager_bits, .timeout = 240)
{
    REQUIRE_GPU();
    dp_gpt *g = engine_gpt(EBS);
    const void *table = NULL;
    int cudnn = !as_cpu() && dp_module_load(DP_MODULE_CUDNN, &table) == DP_OK;
    dp_clear_error();
    struct {
        const dp_model *m;
        const char *name;
        int cudnn;
    } runs[] = {
        {NULL, "fp32", 0},
        {dp_gpt_model(g, DP_GPT_BF16_ACT | DP_GPT_FUSED_ATTENTION), "bf16 fused", 0},
        {dp_gpt_model(g, DP_GPT_BF16_ACT | DP_GPT_FUSED_ATTENTION), "bf16 cuDNN", 1},
    };
    size_t n_params = dp_gpt_model(g, 0)->n_params;
    float *pe = malloc(n_params * sizeof(float)), *pg = malloc(n_params * sizeof(float));
    cr_assert(pe && pg);
    for (size_t r = 0; r < sizeof runs / sizeof *runs; r++) {
        if (runs[r].cudnn && !cudnn) continue;
        cr_assert_eq(setenv("DP_CUDA_CUDNN", runs[r].cudnn ? "1" : "0", 1), 0);
        for (size_t k = 1; k <= 2; k++) {
            double le[GSTEPS + 3], lg[GSTEPS + 3];
            uint64_t re[2], rg[2];
            const char *we[2], *wg[2];
            int se[2], sg[2];
            cr_assert_eq(unsetenv("DP_CUDA_GRAPHS"), 0);
            graph_run(g, runs[r].m, k, le, pe, re, we, se);
            cr_assert_eq(setenv("DP_CUDA_GRAPHS", "1", 1), 0);
            graph_run(g, runs[r].m, k, lg, pg, rg, wg, sg);
            cr_assert_eq(unsetenv("DP_CUDA_GRAPHS"), 0);
            for (size_t d = 0; d < k; d++) {
                cr_assert(re[d] == 0 && !se[d], "%s on %zu devices: device %zu replayed %llu "
                          "times without DP_CUDA_GRAPHS", runs[r].name, k, d,
                          (unsigned long long)re[d]);
                cr_assert(sg[d] == !as_cpu(), "%s on %zu devices: device %zu's last step "
                          "says replayed %d", runs[r].name, k, d, sg[d]);
                if (!as_cpu())
                    cr_assert(rg[d] >= 4, "%s on %zu devices: device %zu replayed %llu times "
                              "(last recording failure: %s)", runs[r].name, k, d,
                              (unsigned long long)rg[d], wg[d][0] ? wg[d] : "none");
            }
            for (size_t i = 0; i < GSTEPS + 3; i++)
                cr_assert(memcmp(&le[i], &lg[i], sizeof le[i]) == 0,
                          "%s on %zu devices: loss %zu %.17g eager, %.17g replayed",
                          runs[r].name, k, i, le[i], lg[i]);
            cr_assert(memcmp(pe, pg, n_params * sizeof(float)) == 0,
                      "%s on %zu devices: the parameters differ after the replays",
                      runs[r].name, k);
        }
    }
    setenv("DP_CUDA_CUDNN", "0", 1);
    free(pe);
    free(pg);
    dp_gpt_destroy(g);
}
