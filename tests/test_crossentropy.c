/* Fused softmax cross-entropy: per-row losses, the row-ordered double loss
 * sum and dlogits against float64, finite differences of the float64 loss,
 * ignored targets, an all-ignored batch, logits of magnitude 1e4, dscale,
 * in-place and loss-only modes, masked (-inf) classes, more rows than the
 * host copy's chunk, bad arguments. Then bfloat16 logits
 * (dp_crossentropy_bf16 and the bundled criterion): bit for bit the float
 * kernel on the widened logits. */
#include "kernels/crossentropy.h" /* DP_CE_KEEP */
#include "nn/nn_act16.h"
#include "nn_test_util.h"

/* float64 reference for one row: loss and, if dl, dscale*(softmax - onehot). */
static double ce_row_ref(double *dl, const float *x, int32_t y, size_t V, double dscale)
{
    if (y < 0) {
        if (dl)
            for (size_t v = 0; v < V; v++) dl[v] = 0.0;
        return 0.0;
    }
    double m = x[0];
    for (size_t v = 1; v < V; v++) m = x[v] > m ? x[v] : m;
    double s = 0.0;
    for (size_t v = 0; v < V; v++) s += exp((double)x[v] - m);
    if (dl)
        for (size_t v = 0; v < V; v++)
            dl[v] = dscale * (exp((double)x[v] - m) / s - ((size_t)y == v ? 1.0 : 0.0));
    return m + log(s) - (double)x[y];
}

/* float64 loss of a float64 row (for finite differences). */
static double ce_loss64(const double *x, int32_t y, size_t V)
{
    if (y < 0) return 0.0;
    double m = x[0], s = 0.0;
    for (size_t v = 1; v < V; v++) m = x[v] > m ? x[v] : m;
    for (size_t v = 0; v < V; v++) s += exp(x[v] - m);
    return m + log(s) - x[y];
}

typedef struct ce_result {
    double loss_sum;
    float *losses;  /* (N) host */
    float *dlogits; /* (N,V) host, NULL in loss-only mode */
} ce_result;

/* Runs the kernel: mode 0 separate dlogits buffer, 1 in place (dlogits ==
 * logits), 2 loss only (dlogits NULL; then also checks logits unchanged). */
static ce_result run_ce(const float *logits, const int32_t *targets, size_t N, size_t V,
                        float dscale, int mode)
{
    dp_device *dev = dp_test_cpu(0);
    float *d_logits = dp_test_upload(dev, logits, N * V);
    int32_t *d_t = nn_upload_i32(dev, targets, N);
    float *d_losses = dp_test_nn_filled(dev, N, NAN);
    /* NaN garbage in dlogits: every element, ignored rows included, must be
     * written. */
    float *d_dl = mode == 0 ? dp_test_nn_filled(dev, N * V, NAN) : NULL;
    float *dl_arg = mode == 0 ? d_dl : mode == 1 ? d_logits : NULL;
    ce_result r = {-1.0, NULL, NULL};
    dp_assert_ok(dp_crossentropy_forward_backward(dev, &r.loss_sum, dl_arg, d_losses, d_logits,
                                                  d_t, N, V, dscale));
    r.losses = dp_test_nn_download(dev, d_losses, N);
    if (mode == 0) r.dlogits = dp_test_nn_download(dev, d_dl, N * V);
    if (mode == 1) r.dlogits = dp_test_nn_download(dev, d_logits, N * V);
    if (mode == 2) {
        float *after = dp_test_nn_download(dev, d_logits, N * V);
        cr_assert(memcmp(after, logits, N * V * sizeof(float)) == 0,
                  "loss-only mode modified logits");
        free(after);
    }
    /* The loss sum is the per-row losses added in row order in double. */
    double sum = 0.0;
    for (size_t i = 0; i < N; i++) sum += (double)r.losses[i];
    cr_assert(r.loss_sum == sum, "loss_sum %.17g is not the row-ordered double sum %.17g",
              r.loss_sum, sum);
    dp_device_free(dev, d_logits);
    dp_device_free(dev, d_t);
    dp_device_free(dev, d_losses);
    dp_device_free(dev, d_dl);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
    return r;
}

/* Compares a run with the float64 reference. loss_atol/rtol as stated by
 * each caller; dlogits: float softmax values have relative error ~1e-7
 * (expf, one division, one subtraction), so atol 1e-7 * |dscale|, rtol 1e-5. */
static void check_against_ref(const ce_result *r, const float *logits, const int32_t *targets,
                              size_t N, size_t V, float dscale, double loss_atol,
                              double loss_rtol)
{
    double *ref_dl = malloc(N * V * sizeof *ref_dl), *got_dl = malloc(N * V * sizeof *got_dl);
    double *ref_l = malloc(N * sizeof *ref_l), *got_l = malloc(N * sizeof *got_l);
    cr_assert(ref_dl && got_dl && ref_l && got_l);
    double ref_sum = 0.0;
    for (size_t i = 0; i < N; i++) {
        ref_l[i] = ce_row_ref(ref_dl + i * V, logits + i * V, targets[i], V, dscale);
        ref_sum += ref_l[i];
        got_l[i] = r->losses[i];
    }
    dp_assert_allclose(got_l, ref_l, N, loss_atol, loss_rtol);
    double s[1] = {r->loss_sum}, rs[1] = {ref_sum};
    dp_assert_allclose(s, rs, 1, loss_atol * (double)N, loss_rtol);
    if (r->dlogits) {
        for (size_t i = 0; i < N * V; i++) got_dl[i] = r->dlogits[i];
        dp_assert_allclose(got_dl, ref_dl, N * V, 1e-7 * fabs((double)dscale), 1e-5);
    }
    free(ref_dl);
    free(got_dl);
    free(ref_l);
    free(got_l);
}

static void free_result(ce_result *r)
{
    free(r->losses);
    free(r->dlogits);
}

#define N1 9
#define V1 13

static void make_case1(float *logits, int32_t *targets)
{
    dp_rng rng;
    dp_rng_seed(&rng, 71);
    dp_rng_fill_normal(&rng, logits, N1 * V1, 0.0f, 3.0f);
    for (size_t i = 0; i < N1; i++) targets[i] = (int32_t)dp_rng_below(&rng, V1);
    targets[2] = -1; /* ignored rows */
    targets[7] = -1;
    targets[0] = V1 - 1; /* the last class */
}

Test(crossentropy, matches_float64_with_ignored_targets)
{
    float logits[N1 * V1];
    int32_t targets[N1];
    make_case1(logits, targets);
    const float dscale = 1.0f / 7.0f; /* 7 valid targets */
    ce_result r = run_ce(logits, targets, N1, V1, dscale, 0);
    /* Loss rows are O(1-10): the float cast of an accurate double, rtol 1e-6. */
    check_against_ref(&r, logits, targets, N1, V1, dscale, 1e-6, 1e-6);
    for (size_t v = 0; v < V1; v++)
        cr_assert(r.dlogits[2 * V1 + v] == 0.0f && r.dlogits[7 * V1 + v] == 0.0f,
                  "an ignored row's dlogits is not zero");
    cr_assert(r.losses[2] == 0.0f && r.losses[7] == 0.0f, "an ignored row has a loss");
    free_result(&r);
}

Test(crossentropy, dscale_is_applied)
{
    float logits[N1 * V1];
    int32_t targets[N1];
    make_case1(logits, targets);
    ce_result one = run_ce(logits, targets, N1, V1, 1.0f, 0);
    ce_result scaled = run_ce(logits, targets, N1, V1, -0.37f, 0);
    check_against_ref(&scaled, logits, targets, N1, V1, -0.37f, 1e-6, 1e-6);
    /* dscale scales dlogits only, never the loss. */
    cr_assert(memcmp(one.losses, scaled.losses, N1 * sizeof(float)) == 0,
              "dscale changed the losses");
    /* The float product dscale * g is one rounding of the exact product. */
    for (size_t i = 0; i < N1 * V1; i++)
        cr_assert(scaled.dlogits[i] == -0.37f * one.dlogits[i], "dlogits[%zu] not scaled", i);
    free_result(&one);
    free_result(&scaled);
}

Test(crossentropy, gradient_matches_finite_differences)
{
    /* dlogits / dscale must be the derivative of the summed loss; central
     * differences of the float64 loss with h = 1e-6 (truncation ~1e-13,
     * rounding ~1e-16 * 10 / 1e-6 = 1e-9). */
    float logits[N1 * V1];
    int32_t targets[N1];
    make_case1(logits, targets);
    ce_result r = run_ce(logits, targets, N1, V1, 1.0f, 0);
    double got[N1 * V1], fd[N1 * V1], x[V1];
    const double h = 1e-6;
    for (size_t i = 0; i < N1; i++)
        for (size_t v = 0; v < V1; v++) {
            /* A float64 copy of the row so the step is not rounded to float. */
            for (size_t u = 0; u < V1; u++) x[u] = logits[i * V1 + u];
            double keep = x[v];
            x[v] = keep + h;
            double lp = ce_loss64(x, targets[i], V1);
            x[v] = keep - h;
            double lm = ce_loss64(x, targets[i], V1);
            fd[i * V1 + v] = (lp - lm) / (2 * h);
            got[i * V1 + v] = r.dlogits[i * V1 + v];
        }
    dp_assert_allclose(got, fd, N1 * V1, 1e-6, 1e-5);
    free_result(&r);
}

Test(crossentropy, in_place_and_loss_only)
{
    float logits[N1 * V1];
    int32_t targets[N1];
    make_case1(logits, targets);
    ce_result sep = run_ce(logits, targets, N1, V1, 0.25f, 0);
    ce_result inplace = run_ce(logits, targets, N1, V1, 0.25f, 1);
    ce_result lossonly = run_ce(logits, targets, N1, V1, 0.25f, 2);
    cr_assert(memcmp(sep.dlogits, inplace.dlogits, N1 * V1 * sizeof(float)) == 0,
              "in-place dlogits differ from a separate buffer's");
    cr_assert(memcmp(sep.losses, inplace.losses, N1 * sizeof(float)) == 0,
              "in-place losses differ");
    cr_assert(memcmp(sep.losses, lossonly.losses, N1 * sizeof(float)) == 0,
              "loss-only losses differ");
    cr_assert(sep.loss_sum == inplace.loss_sum && sep.loss_sum == lossonly.loss_sum);
    free_result(&sep);
    free_result(&inplace);
    free_result(&lossonly);
}

Test(crossentropy, all_ignored_batch)
{
    float logits[N1 * V1];
    int32_t targets[N1];
    make_case1(logits, targets);
    for (size_t i = 0; i < N1; i++) targets[i] = -1;
    for (int mode = 0; mode < 3; mode++) {
        ce_result r = run_ce(logits, targets, N1, V1, 1.0f, mode);
        cr_assert(r.loss_sum == 0.0, "all-ignored loss sum is %g", r.loss_sum);
        for (size_t i = 0; i < N1; i++) cr_assert(r.losses[i] == 0.0f);
        if (r.dlogits)
            for (size_t i = 0; i < N1 * V1; i++)
                cr_assert(r.dlogits[i] == 0.0f, "dlogits[%zu] = %g, want 0 (mode %d)", i,
                          r.dlogits[i], mode);
        free_result(&r);
    }
}

Test(crossentropy, large_logits_are_stable)
{
    /* Rows of magnitude 1e4: (a) spread over [-1e4, 1e4] (loss up to ~2e4,
     * softmax one-hot-like), (b) 1e4 + noise (a real softmax on top of a
     * huge offset), (c) -1e4 + noise, (d) all equal 1e4 (loss = log V).
     * exp(1e4) overflows float and double, and logsumexp computed in float
     * at 1e4 has an error of ~1e-3, so both naive forms fail these checks. */
    enum { N = 8, V = 50 };
    float logits[N * V];
    int32_t targets[N];
    dp_rng rng;
    dp_rng_seed(&rng, 72);
    dp_rng_fill_uniform(&rng, logits, 2 * V, -1e4f, 1e4f);
    for (size_t i = 2; i < 4; i++)
        for (size_t v = 0; v < V; v++) logits[i * V + v] = 1e4f + 3.0f * dp_rng_uniform(&rng);
    for (size_t i = 4; i < 6; i++)
        for (size_t v = 0; v < V; v++) logits[i * V + v] = -1e4f + 3.0f * dp_rng_uniform(&rng);
    for (size_t i = 6; i < 8; i++)
        for (size_t v = 0; v < V; v++) logits[i * V + v] = 1e4f;
    for (size_t i = 0; i < N; i++) targets[i] = (int32_t)dp_rng_below(&rng, V);
    /* Row 1's target is its largest logit (loss ~0). */
    size_t best = 0;
    for (size_t v = 1; v < V; v++) best = logits[V + v] > logits[V + best] ? v : best;
    targets[1] = (int32_t)best;

    ce_result r = run_ce(logits, targets, N, V, 1.0f / N, 0);
    for (size_t i = 0; i < N; i++) cr_assert(isfinite(r.losses[i]), "loss %zu not finite", i);
    for (size_t i = 0; i < N * V; i++)
        cr_assert(isfinite(r.dlogits[i]), "dlogits[%zu] not finite", i);
    /* The float cast of an accurate double: rtol 1e-6 of losses up to 2e4,
     * atol 1e-6 for the ~0 and ~log(50) rows. */
    check_against_ref(&r, logits, targets, N, V, 1.0f / N, 1e-6, 1e-6);
    free_result(&r);
}

/* Masked classes: -inf logits (a vocabulary mask) get probability 0 and a
 * zero gradient, in all three modes, and the loss is that of the unmasked
 * classes (the float64 reference's exp(-inf) is 0 too). Row 0 has every
 * class but its target masked (loss exactly 0, gradient 0); row 1 its first
 * half; row 2 none. */
Test(crossentropy, masked_classes_are_excluded)
{
    enum { N = 3, V = 37 };
    float logits[N * V];
    int32_t targets[N] = {5, 30, 11};
    dp_rng rng;
    dp_rng_seed(&rng, 73);
    dp_rng_fill_normal(&rng, logits, N * V, 0.0f, 2.0f);
    for (size_t v = 0; v < V; v++)
        if (v != 5) logits[v] = -INFINITY;
    for (size_t v = 0; v < V / 2; v++) logits[V + v] = -INFINITY;
    for (int mode = 0; mode < 3; mode++) {
        ce_result r = run_ce(logits, targets, N, V, 0.5f, mode);
        cr_assert_eq(r.losses[0], 0.0f, "mode %d: one unmasked class, loss %g", mode,
                     (double)r.losses[0]);
        check_against_ref(&r, logits, targets, N, V, 0.5f, 1e-6, 1e-6);
        if (r.dlogits)
            for (size_t i = 0; i < N * V; i++) {
                cr_assert(isfinite(r.dlogits[i]), "mode %d: dlogits[%zu] = %g", mode, i,
                          (double)r.dlogits[i]);
                if (logits[i] == -INFINITY)
                    cr_assert_eq(r.dlogits[i], 0.0f, "mode %d: masked dlogits[%zu] = %g", mode,
                                 i, (double)r.dlogits[i]);
            }
        free_result(&r);
    }
}

Test(crossentropy, more_rows_than_one_host_chunk)
{
    /* 2500 rows: the losses come to the host in several chunks. */
    enum { N = 2500, V = 3 };
    float *logits = malloc(N * V * sizeof(float));
    int32_t *targets = malloc(N * sizeof(int32_t));
    cr_assert(logits && targets);
    dp_rng rng;
    dp_rng_seed(&rng, 73);
    dp_rng_fill_normal(&rng, logits, N * V, 0.0f, 2.0f);
    for (size_t i = 0; i < N; i++) targets[i] = (int32_t)dp_rng_below(&rng, V + 1) - 1;
    ce_result r = run_ce(logits, targets, N, V, 1.0f, 2);
    check_against_ref(&r, logits, targets, N, V, 1.0f, 1e-6, 1e-6);
    free_result(&r);
    free(logits);
    free(targets);
}

Test(crossentropy, bad_arguments)
{
    dp_device *dev = dp_test_cpu(0);
    float *f = dp_test_nn_filled(dev, 16, 0.0f);
    int32_t zeros[4] = {0};
    int32_t *t = nn_upload_i32(dev, zeros, 4);
    double sum = 0.0;
    dp_test_nn_assert_invalid(dp_crossentropy_forward_backward(NULL, &sum, f, f, f, t, 4, 4, 1.0f),
                      "dev", NULL);
    dp_test_nn_assert_invalid(dp_crossentropy_forward_backward(dev, NULL, f, f, f, t, 4, 4, 1.0f),
                      "loss_sum_host", "cpu:0");
    dp_test_nn_assert_invalid(dp_crossentropy_forward_backward(dev, &sum, f, NULL, f, t, 4, 4, 1.0f),
                      "losses", NULL);
    dp_test_nn_assert_invalid(dp_crossentropy_forward_backward(dev, &sum, f, f, NULL, t, 4, 4, 1.0f),
                      "logits", NULL);
    dp_test_nn_assert_invalid(dp_crossentropy_forward_backward(dev, &sum, f, f, f, NULL, 4, 4, 1.0f),
                      "targets", NULL);
    dp_test_nn_assert_invalid(dp_crossentropy_forward_backward(dev, &sum, f, f, f, t, 0, 4, 1.0f),
                      "N=0", "dp_crossentropy_forward_backward");
    dp_test_nn_assert_invalid(dp_crossentropy_forward_backward(dev, &sum, f, f, f, t, 4, 0, 1.0f),
                      "V=0", NULL);
    dp_test_nn_assert_invalid(dp_crossentropy_forward_backward(dev, &sum, f, f, f, t, SIZE_MAX, 4,
                                                       1.0f),
                      "overflow", NULL);
    dp_test_nn_assert_invalid(dp_crossentropy_forward_backward(dev, &sum, f, f, f, t, 4, 4, NAN),
                      "dscale", NULL);
    dp_test_nn_assert_invalid(dp_crossentropy_forward_backward(dev, &sum, f, f, f, t, 4, 4, INFINITY),
                      "dscale", NULL);
    dp_device_free(dev, f);
    dp_device_free(dev, t);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

// --- bfloat16 logits (dp_crossentropy_bf16, nn/nn_act16.h) ---------------------------------

static uint16_t *upload16(dp_device *dev, const uint16_t *host, size_t n)
{
    void *p = NULL;
    dp_assert_ok(dp_device_alloc(dev, (n ? n : 1) * sizeof(uint16_t), &p));
    dp_assert_ok(dp_copy_h2d(dev, p, host, n * sizeof(uint16_t)));
    return p;
}

static uint16_t *download16(dp_device *dev, const uint16_t *d, size_t n)
{
    uint16_t *h = malloc((n ? n : 1) * sizeof *h);
    cr_assert_not_null(h);
    dp_assert_ok(dp_copy_d2h(dev, h, d, n * sizeof *h));
    return h;
}

static float *widen16(const uint16_t *x, size_t n)
{
    float *f = malloc((n ? n : 1) * sizeof *f);
    cr_assert_not_null(f);
    for (size_t i = 0; i < n; i++) f[i] = dp_bf16_widen(x[i]);
    return f;
}

/* Bitwise equality of n floats, naming the first difference. */
static void assert_same_floats(const char *what, const float *a, const float *e, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &e[i], sizeof(float)) != 0)
            cr_assert_fail("%s: element %zu of %zu is %a, want %a", what, i, n, (double)a[i],
                           (double)e[i]);
}

/* got[i] == the bfloat16 rounding of want[i], bit for bit. */
static void assert_rounded(const char *what, const uint16_t *got, const float *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (got[i] != dp_bf16_round(want[i]))
            cr_assert_fail("%s: element %zu of %zu is 0x%04x, want 0x%04x (%a rounded)", what,
                           i, n, got[i], dp_bf16_round(want[i]), (double)want[i]);
}

/* N rows of bfloat16 logits(N,V) and their targets (in [0, V - 7), V > 7):
 * normal(0, 3) rounded, rows 2 and 5 (when there) ignored, row 1's last 7
 * columns -inf (a padded vocabulary), row 3 shifted by +1e4 (bfloat16's
 * spacing there is 64: nearly every logit ties at the max), row 4 wide. */
static uint16_t *make_logits16(size_t N, size_t V, uint64_t seed, int32_t *targets)
{
    float *f = malloc(N * V * sizeof *f);
    uint16_t *x = malloc(N * V * sizeof *x);
    cr_assert(f && x);
    dp_rng rng;
    dp_rng_seed(&rng, seed);
    dp_rng_fill_normal(&rng, f, N * V, 0.0f, 3.0f);
    for (size_t i = 0; i < N * V; i++) x[i] = dp_bf16_round(f[i]);
    for (size_t r = 0; r < N; r++) targets[r] = (int32_t)dp_rng_below(&rng, V - 7);
    if (N > 2) targets[2] = -1;
    if (N > 5) targets[5] = -1;
    if (N > 1)
        for (size_t v = V - 7; v < V; v++) x[1 * V + v] = 0xFF80; /* -inf */
    if (N > 3)
        for (size_t v = 0; v < V; v++) x[3 * V + v] = dp_bf16_round(f[3 * V + v] + 1e4f);
    /* Row 4 spread 8 times wider: its exps span 2^-125 .. 1 (some flush to
     * 0), more than a double's 53 bits, so even its double sum rounds. */
    if (N > 4)
        for (size_t v = 0; v < V; v++) x[4 * V + v] = dp_bf16_round(8.0f * f[4 * V + v]);
    free(f);
    return x;
}

typedef struct ce16_result {
    float *losses;     /* (N) host */
    uint16_t *dlogits; /* (N,V) host, NULL in loss-only mode */
} ce16_result;

/* dp_crossentropy_bf16 on cpu:0: mode 0 a separate dlogits buffer (NaN
 * garbage first, so every element must be written), 1 in place (dlogits ==
 * logits), 2 loss only (dlogits NULL; then logits must be unchanged). */
static ce16_result run_ce16(const uint16_t *logits, const int32_t *targets, size_t N, size_t V,
                            float dscale, int mode)
{
    dp_device *dev = dp_test_cpu(0);
    uint16_t *d_logits = upload16(dev, logits, N * V), *d_dl = NULL;
    int32_t *d_t = nn_upload_i32(dev, targets, N);
    float *d_losses = dp_test_nn_filled(dev, N, NAN);
    if (mode == 0) {
        uint16_t *junk = malloc(N * V * sizeof *junk);
        cr_assert_not_null(junk);
        for (size_t i = 0; i < N * V; i++) junk[i] = 0x7FC1;
        d_dl = upload16(dev, junk, N * V);
        free(junk);
    }
    uint16_t *dl_arg = mode == 0 ? d_dl : mode == 1 ? d_logits : NULL;
    dp_assert_ok(dp_crossentropy_bf16(dev, d_losses, dl_arg, d_logits, d_t, N, V, dscale));
    ce16_result r = {dp_test_nn_download(dev, d_losses, N), NULL};
    if (mode < 2) r.dlogits = download16(dev, dl_arg, N * V);
    if (mode == 2) {
        uint16_t *after = download16(dev, d_logits, N * V);
        cr_assert(memcmp(after, logits, N * V * sizeof *after) == 0,
                  "loss-only mode modified the logits");
        free(after);
    }
    dp_device_free(dev, d_logits);
    dp_device_free(dev, d_dl);
    dp_device_free(dev, d_t);
    dp_device_free(dev, d_losses);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
    return r;
}

/* Every mode against the float kernel on the widened logits: the losses
 * bit for bit (the same max, the same exps summed in the same 8 partials),
 * dlogits its dlogits rounded once; so in place equals out of place. */
static void check_bf16_matches_float(size_t N, size_t V, uint64_t seed)
{
    int32_t *targets = malloc(N * sizeof *targets);
    cr_assert_not_null(targets);
    uint16_t *x = make_logits16(N, V, seed, targets);
    float *wide = widen16(x, N * V), dscale = 1.0f / (float)N;
    ce_result ref = run_ce(wide, targets, N, V, dscale, 0);
    ce_result ref_only = run_ce(wide, targets, N, V, dscale, 2);
    assert_same_floats("float kernel: loss-only vs with dlogits", ref_only.losses, ref.losses, N);
    ce16_result r[3];
    for (int mode = 0; mode < 3; mode++) {
        r[mode] = run_ce16(x, targets, N, V, dscale, mode);
        assert_same_floats(mode == 0 ? "bf16 losses (separate)"
                           : mode == 1 ? "bf16 losses (in place)"
                                       : "bf16 losses (loss only)",
                           r[mode].losses, ref.losses, N);
    }
    assert_rounded("bf16 dlogits (separate)", r[0].dlogits, ref.dlogits, N * V);
    assert_rounded("bf16 dlogits (in place)", r[1].dlogits, ref.dlogits, N * V);
    cr_assert(memcmp(r[0].dlogits, r[1].dlogits, N * V * sizeof(uint16_t)) == 0,
              "in place differs from out of place");
    /* not vacuous: losses of O(1-10) and a negative target gradient on
     * the valid rows, zero rows where the target is -1 */
    for (size_t i = 0; i < N; i++) {
        if (targets[i] < 0) {
            cr_assert(r[0].losses[i] == 0.0f, "ignored row %zu has a loss", i);
            for (size_t v = 0; v < V; v++)
                cr_assert(r[0].dlogits[i * V + v] == 0, "ignored row %zu has dlogits", i);
            continue;
        }
        cr_assert(r[0].losses[i] > 0.1f, "row %zu: loss %g", i, (double)r[0].losses[i]);
        cr_assert(dp_bf16_widen(r[0].dlogits[i * V + (size_t)targets[i]]) < 0.0f,
                  "row %zu: the target's gradient is not negative", i);
    }
    for (int mode = 0; mode < 3; mode++) {
        free(r[mode].losses);
        free(r[mode].dlogits);
    }
    free_result(&ref);
    free_result(&ref_only);
    free(wide);
    free(x);
    free(targets);
}

/* V odd (3001: 375 blocks of 8 and a tail of 1), a multiple of 64 (4096),
 * a short row (13: one block and a tail of 5), V < 8 (5: the tail only);
 * the longest row whose terms the kernel keeps (DP_CE_KEEP) and one past
 * it, which computes them twice. */
Test(crossentropy, bf16_logits_match_the_float_kernel_bitwise)
{
    check_bf16_matches_float(7, 3001, 81);
    check_bf16_matches_float(6, 4096, 82);
    check_bf16_matches_float(9, 13, 83);
    check_bf16_matches_float(4, 12, 84);
    check_bf16_matches_float(3, DP_CE_KEEP, 86);
    check_bf16_matches_float(3, DP_CE_KEEP + 257, 87);
}

Test(crossentropy, bf16_all_ignored_rows_are_zero)
{
    enum { N = 3, V = 100 };
    int32_t targets[N] = {-1, -1, -1};
    uint16_t *x = make_logits16(N, V, 85, targets);
    for (size_t i = 0; i < N; i++) targets[i] = -1;
    for (int mode = 0; mode < 3; mode++) {
        ce16_result r = run_ce16(x, targets, N, V, 1.0f, mode);
        for (size_t i = 0; i < N; i++) cr_assert(r.losses[i] == 0.0f, "loss %zu", i);
        for (size_t i = 0; r.dlogits && i < (size_t)N * V; i++)
            cr_assert(r.dlogits[i] == 0, "mode %d: dlogits[%zu] = 0x%04x", mode, i, r.dlogits[i]);
        free(r.losses);
        free(r.dlogits);
    }
    free(x);
}

Test(crossentropy, bf16_bad_arguments)
{
    dp_device *dev = dp_test_cpu(0);
    float *l = dp_test_nn_filled(dev, 4, 0.0f);
    uint16_t zeros16[16] = {0};
    uint16_t *x = upload16(dev, zeros16, 16);
    int32_t zeros[4] = {0};
    int32_t *t = nn_upload_i32(dev, zeros, 4);
    const char *fn = "dp_crossentropy_bf16";
    dp_test_nn_assert_invalid(dp_crossentropy_bf16(NULL, l, x, x, t, 4, 4, 1.0f), "dev", fn);
    dp_test_nn_assert_invalid(dp_crossentropy_bf16(dev, NULL, x, x, t, 4, 4, 1.0f), "losses", fn);
    dp_test_nn_assert_invalid(dp_crossentropy_bf16(dev, l, x, NULL, t, 4, 4, 1.0f), "logits", fn);
    dp_test_nn_assert_invalid(dp_crossentropy_bf16(dev, l, x, x, NULL, 4, 4, 1.0f), "targets", fn);
    dp_test_nn_assert_invalid(dp_crossentropy_bf16(dev, l, x, x, t, 0, 4, 1.0f), "N=0", fn);
    dp_test_nn_assert_invalid(dp_crossentropy_bf16(dev, l, x, x, t, 4, 0, 1.0f), "V=0", fn);
    dp_test_nn_assert_invalid(dp_crossentropy_bf16(dev, l, x, x, t, SIZE_MAX, 4, 1.0f),
                              "overflow", fn);
    dp_test_nn_assert_invalid(dp_crossentropy_bf16(dev, l, x, x, t, 1, (size_t)INT32_MAX + 1,
                                                    1.0f),
                              "int32", fn);
    dp_test_nn_assert_invalid(dp_crossentropy_bf16(dev, l, x, x, t, 4, 4, NAN), "dscale", fn);
    dp_test_nn_assert_invalid(dp_crossentropy_bf16(dev, l, x, x, t, 4, 4, -INFINITY), "dscale",
                              fn);
    /* dlogits NULL is evaluation, not an error */
    dp_assert_ok(dp_crossentropy_bf16(dev, l, NULL, x, t, 4, 4, 1.0f));
    dp_device_free(dev, l);
    dp_device_free(dev, x);
    dp_device_free(dev, t);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

/* The bundled criterion given bfloat16 logits (logits_dtype BF16, dlogits
 * in place as in the engine's balanced mode): with row losses they are the
 * float kernel's losses on the widened logits, bit for bit; without, the
 * host sum is those losses' row-ordered double sum (the float path's sum).
 * Evaluation (dlogits NULL) leaves the logits alone and gives the same. */
Test(crossentropy, bundled_criterion_takes_bf16_logits)
{
    enum { N = 7, V = 3001 };
    int32_t targets[N];
    uint16_t *x = make_logits16(N, V, 86, targets);
    float *wide = widen16(x, (size_t)N * V), dscale = 1.0f / 5.0f;
    ce_result ref = run_ce(wide, targets, N, V, dscale, 0);
    size_t n_valid = 0;
    for (size_t i = 0; i < N; i++) n_valid += targets[i] >= 0;
    dp_criterion c = dp_criterion_cross_entropy();
    cr_assert_eq(c.bf16_logits, 1, "the bundled cross-entropy takes bfloat16 logits");
    for (int eval = 0; eval < 2; eval++)
        for (int with_rows = 0; with_rows < 2; with_rows++) {
            dp_device *dev = dp_test_cpu(0);
            uint16_t *d_x = upload16(dev, x, (size_t)N * V);
            int32_t *d_t = nn_upload_i32(dev, targets, N);
            void *scratch = NULL;
            dp_assert_ok(dp_device_alloc(dev, c.scratch_bytes(c.ctx, N, V), &scratch));
            float *rows = with_rows ? dp_test_nn_filled(dev, N, NAN) : NULL;
            dp_criterion_args a;
            memset(&a, 0, sizeof a);
            a.dev = dev;
            a.logits = (const float *)d_x;
            a.dlogits = eval ? NULL : (float *)d_x;
            a.targets = d_t;
            a.target_type = DP_TARGET_CLASS;
            a.target_size = 1;
            a.n = N;
            a.V = V;
            a.n_valid = n_valid;
            a.dscale = dscale;
            a.scratch = scratch;
            a.row_losses = rows;
            a.logits_dtype = DP_DTYPE_BF16;
            double sum = -1.0;
            size_t count = 0;
            dp_assert_ok(c.forward_backward(c.ctx, &a, &sum, &count));
            cr_assert_eq(count, n_valid);
            if (with_rows) {
                float *got = dp_test_nn_download(dev, rows, N);
                assert_same_floats("criterion row losses", got, ref.losses, N);
                free(got);
            } else {
                cr_assert(sum == ref.loss_sum, "host sum %.17g, float path's %.17g", sum,
                          ref.loss_sum);
            }
            uint16_t *after = download16(dev, d_x, (size_t)N * V);
            if (eval)
                cr_assert(memcmp(after, x, (size_t)N * V * sizeof *x) == 0,
                          "evaluation modified the logits");
            else
                assert_rounded("criterion dlogits (in place)", after, ref.dlogits, (size_t)N * V);
            free(after);
            dp_device_free(dev, d_x);
            dp_device_free(dev, d_t);
            dp_device_free(dev, scratch);
            dp_device_free(dev, rows);
            dp_test_nn_assert_all_freed(dev);
            dp_device_close(dev);
        }
    free_result(&ref);
    free(wide);
    free(x);
}
