/*
 * dp_sample_logits (dp/sample.h), on the host with fixed seeds:
 *
 *  - top_k = 1 gives the argmax; V = 1 gives id 0; a draw landing on a
 *    running sum takes the next id;
 *  - the ids drawn follow softmax(logits / temperature), computed here in
 *    float64, by a chi-square bound (justified at chi2_bound); the same
 *    draws fail that bound against the distribution of another
 *    temperature, so the check has the power to fail;
 *  - top_k keeps exactly the ids at or above the k-th largest logit,
 *    ties at that value included, in their renormalised proportions;
 *  - -inf logits are never drawn; NaN, +inf or all -inf fail with
 *    DP_ERR_NON_FINITE after the one draw every valid call takes;
 *  - bad arguments fail with DP_ERR_INVALID_ARGUMENT, a message naming
 *    what is wrong, and no draw;
 *  - ids, probabilities and the generator's state equal, bit for bit,
 *    those of lm_train's sampler before it moved into dp (transcribed
 *    below as old_sample) over many rows, sizes, temperatures and top_k.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dp_test.h"

TestSuite(sample, .timeout = 60);

// --- helpers -------------------------------------------------------------------

/* The id dp_sample_logits picks (asserting DP_OK). */
static int32_t pick(const float *logits, size_t V, double temperature, size_t top_k, dp_rng *rng,
                    float *work)
{
    int32_t id = -1;
    dp_assert_ok(dp_sample_logits(logits, V, temperature, top_k, rng, work, &id));
    cr_assert(id >= 0 && (size_t)id < V, "id %d outside [0, %zu)", (int)id, V);
    return id;
}

/* counts[j] = how often id j came in n draws from one seed. */
static void draw_counts(const float *logits, size_t V, double temperature, size_t top_k,
                        uint64_t seed, size_t n, size_t *counts)
{
    dp_rng rng;
    dp_rng_seed(&rng, seed);
    float *work = malloc(V * sizeof *work);
    cr_assert_not_null(work);
    memset(counts, 0, V * sizeof *counts);
    for (size_t i = 0; i < n; i++) counts[pick(logits, V, temperature, top_k, &rng, work)]++;
    free(work);
}

/* The float64 reference: softmax(logits / temperature) over the ids kept
 * (keep[j] != 0), 0 elsewhere. */
static void reference(const float *logits, const int *keep, size_t V, double temperature,
                      double *q)
{
    double mx = -INFINITY, z = 0.0;
    for (size_t j = 0; j < V; j++)
        if (keep[j] && logits[j] > mx) mx = logits[j];
    for (size_t j = 0; j < V; j++) {
        q[j] = keep[j] ? exp(((double)logits[j] - mx) / temperature) : 0.0;
        z += q[j];
    }
    for (size_t j = 0; j < V; j++) q[j] /= z;
}

/* Pearson's statistic sum (observed - expected)^2 / expected over the ids
 * with q > 0; an id with q == 0 that was drawn makes it infinite. */
static double chi2(const size_t *counts, const double *q, size_t V, size_t n)
{
    double s = 0.0;
    for (size_t j = 0; j < V; j++) {
        double e = q[j] * (double)n;
        if (e == 0.0) {
            if (counts[j]) return INFINITY;
            continue;
        }
        double d = (double)counts[j] - e;
        s += d * d / e;
    }
    return s;
}

/*
 * chi2_bound(df): the 1 - 1e-6 quantile of the chi-square distribution
 * with df degrees of freedom (computed from the regularised incomplete
 * gamma function; df 2: 27.63, df 7: 40.52). With n draws from the true
 * distribution and every expected count >= 5 (here >= 800), Pearson's
 * statistic is chi-square distributed with (ids kept - 1) degrees of
 * freedom, so a correct sampler passes with probability 1 - 1e-6 for a
 * random seed; the seeds are fixed, so the outcome is too. A wrong
 * distribution shifts the statistic by about n * sum (p - q)^2 / q: with
 * n = 100000 a probability off by 0.005 on a q of 0.1 adds 25 and one
 * off by 0.01 adds 100, past the bound.
 */
static double chi2_bound(size_t df)
{
    switch (df) {
    case 2: return 27.63;
    case 7: return 40.52;
    default: cr_assert_fail("no chi-square bound for %zu degrees of freedom", df); return 0;
    }
}

/* lm_train's sampler as it was before dp_sample_logits (the body of its
 * generate_into), transcribed: probs holds the logits on entry and the
 * float probabilities on return; sorted is V floats of scratch. */
static size_t old_sample(float *probs, float *sorted, size_t V, double temperature, long top_k,
                         dp_rng *rng)
{
    float kth = -INFINITY;
    if (top_k > 0 && (size_t)top_k < V) {
        memcpy(sorted, probs, V * sizeof(float));
        for (long k = 0; k < top_k; k++) {
            size_t best = 0;
            for (size_t j = 1; j < V; j++)
                if (sorted[j] > sorted[best]) best = j;
            kth = sorted[best];
            sorted[best] = -INFINITY;
        }
    }
    float mx = -INFINITY;
    for (size_t j = 0; j < V; j++) mx = probs[j] > mx ? probs[j] : mx;
    double z = 0.0;
    for (size_t j = 0; j < V; j++) {
        double p = probs[j] < kth ? 0.0 : exp((probs[j] - mx) / temperature);
        probs[j] = (float)p;
        z += p;
    }
    double u = dp_rng_uniform(rng) * z, acc = 0.0;
    size_t pick_ = V - 1;
    for (size_t j = 0; j < V; j++) {
        acc += probs[j];
        if (u < acc && probs[j] > 0) {
            pick_ = j;
            break;
        }
    }
    return pick_;
}

static int same_rng(const dp_rng *a, const dp_rng *b) { return memcmp(a, b, sizeof *a) == 0; }

// --- top_k = 1, V = 1 ----------------------------------------------------------------

Test(sample, top_k_one_is_the_argmax)
{
    enum { V = 37 };
    float logits[V], work[V];
    dp_rng data, rng;
    dp_rng_seed(&data, 11);
    dp_rng_seed(&rng, 12);
    for (int row = 0; row < 200; row++) {
        dp_rng_fill_normal(&data, logits, V, 0.0f, 3.0f);
        size_t arg = 0;
        for (size_t j = 1; j < V; j++)
            if (logits[j] > logits[arg]) arg = j;
        for (double t = 0.25; t <= 4.0; t *= 4)
            cr_assert_eq(pick(logits, V, t, 1, &rng, work), (int32_t)arg,
                         "row %d, temperature %g: not the argmax %zu", row, t, arg);
    }
}

Test(sample, one_id_is_always_picked)
{
    float logit = -3.5f, work;
    dp_rng rng;
    dp_rng_seed(&rng, 1);
    for (int i = 0; i < 100; i++) cr_assert_eq(pick(&logit, 1, 0.7, 0, &rng, &work), 0);
}

// --- the distribution -----------------------------------------------------------------

Test(sample, temperature_gives_the_softmax_of_the_scaled_logits)
{
    enum { V = 8, N = 100000 };
    /* Smallest probability at temperature 0.7: about 0.8%, 800 expected draws. */
    const float logits[V] = {1.0f, -0.5f, 2.0f, 0.25f, -1.0f, 1.5f, 0.0f, -2.0f};
    int keep[V];
    for (size_t j = 0; j < V; j++) keep[j] = 1;
    size_t counts[V];
    double q[V];
    const double temps[] = {0.7, 1.0, 1.6};
    for (size_t t = 0; t < sizeof temps / sizeof temps[0]; t++) {
        draw_counts(logits, V, temps[t], 0, 1000 + t, N, counts);
        reference(logits, keep, V, temps[t], q);
        double s = chi2(counts, q, V, N);
        cr_assert_lt(s, chi2_bound(V - 1), "temperature %g: chi-square %.2f over %zu draws",
                     temps[t], s, (size_t)N);
        /* The same draws against the distribution of another temperature
         * fail the bound: the check can tell temperatures apart. */
        reference(logits, keep, V, temps[t] * 1.25, q);
        double wrong = chi2(counts, q, V, N);
        cr_assert_gt(wrong, 10 * chi2_bound(V - 1),
                     "temperature %g read as %g: chi-square only %.2f", temps[t],
                     temps[t] * 1.25, wrong);
    }
}

Test(sample, work_holds_the_unnormalised_probabilities)
{
    enum { V = 5 };
    const float logits[V] = {0.5f, 2.0f, -1.0f, 2.0f, -INFINITY};
    float work[V];
    dp_rng rng;
    dp_rng_seed(&rng, 3);
    pick(logits, V, 2.0, 0, &rng, work);
    for (size_t j = 0; j < V; j++) {
        float want = (float)exp(((double)logits[j] - 2.0) / 2.0);
        cr_assert_eq(work[j], want, "work[%zu] = %.9g, want exp((l - max) / T) = %.9g", j,
                     (double)work[j], (double)want);
    }
}

/* Seed 1144774's first dp_rng_uniform is exactly 0.5 (found by search):
 * u then lands on a running sum, which it must pass, not reach. */
Test(sample, a_draw_on_a_running_sum_takes_the_next_id)
{
    dp_rng rng;
    dp_rng_seed(&rng, 1144774);
    cr_assert_eq(dp_rng_uniform(&rng), 0.5f, "the seed no longer draws 0.5 first");
    const float equal[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float work[4];
    for (size_t V = 2; V <= 4; V += 2) {
        /* p = 1 each, z = V, u = V / 2: the running sums 1, 2, .. reach u at id V/2 - 1. */
        dp_rng_seed(&rng, 1144774);
        cr_assert_eq(pick(equal, V, 1.0, 0, &rng, work), (int32_t)(V / 2),
                     "V %zu: u = %zu on a running sum", V, V / 2);
    }
}

// --- top-k, ties, -inf ------------------------------------------------------------------

Test(sample, top_k_keeps_the_k_largest_in_proportion)
{
    enum { V = 9, K = 3, N = 100000 };
    const float logits[V] = {0.3f, 1.9f, -0.7f, 1.2f, 0.9f, -2.0f, 1.6f, 0.0f, 1.0f};
    /* The three largest: 1.9 (id 1), 1.6 (id 6), 1.2 (id 3). */
    int keep[V] = {0};
    keep[1] = keep[6] = keep[3] = 1;
    size_t counts[V];
    double q[V];
    draw_counts(logits, V, 0.9, K, 77, N, counts);
    for (size_t j = 0; j < V; j++)
        if (!keep[j]) cr_assert_eq(counts[j], 0, "id %zu below the 3rd largest was drawn", j);
    reference(logits, keep, V, 0.9, q);
    double s = chi2(counts, q, V, N);
    cr_assert_lt(s, chi2_bound(K - 1), "chi-square %.2f over the top 3", s);
}

Test(sample, ties_at_the_kth_value_are_all_kept)
{
    enum { V = 6, N = 20000 };
    /* Sorted: 5, 3, 3, 3, 1, 0: the 2nd largest is 3, shared by ids 1, 2, 4. */
    const float logits[V] = {5.0f, 3.0f, 3.0f, 1.0f, 3.0f, 0.0f};
    size_t counts[V];
    draw_counts(logits, V, 2.0, 2, 5, N, counts);
    const int kept[V] = {1, 1, 1, 0, 1, 0};
    for (size_t j = 0; j < V; j++) {
        if (kept[j]) cr_assert_gt(counts[j], 0, "id %zu (tied at the 2nd largest) never drawn", j);
        else cr_assert_eq(counts[j], 0, "id %zu below the 2nd largest was drawn", j);
    }
    /* Equal logits, equal chances: ids 1, 2, 4 within 5 sigma of each other. */
    double p = exp(-1.0) / (1.0 + 3 * exp(-1.0)), sd = sqrt(N * p * (1 - p));
    for (size_t j = 1; j < V; j++)
        if (kept[j])
            cr_assert_lt(fabs((double)counts[j] - N * p), 5 * sd, "id %zu: %zu draws, want %.0f",
                         j, counts[j], N * p);
    /* Ties at the maximum with top_k = 1 keep both maxima. */
    const float two_max[4] = {1.0f, 4.0f, 4.0f, 3.9f};
    size_t c2[4];
    draw_counts(two_max, 4, 1.0, 1, 6, 2000, c2);
    cr_assert(c2[1] > 800 && c2[2] > 800 && c2[0] == 0 && c2[3] == 0,
              "top_k 1 over a tied maximum: %zu %zu %zu %zu", c2[0], c2[1], c2[2], c2[3]);
}

Test(sample, minus_infinity_is_never_drawn)
{
    enum { V = 6, N = 20000 };
    const float logits[V] = {-INFINITY, 0.0f, -INFINITY, -30.0f, 0.5f, -INFINITY};
    size_t counts[V];
    const size_t ks[] = {0, 1, 2, 4, 5, 6};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        draw_counts(logits, V, 1.0, ks[i], 9, N, counts);
        cr_assert(counts[0] == 0 && counts[2] == 0 && counts[5] == 0,
                  "top_k %zu: a -inf id was drawn (%zu %zu %zu)", ks[i], counts[0], counts[2],
                  counts[5]);
        /* top_k 1 keeps id 4 (0.5) alone; the others keep ids 1 and 4 at least. */
        cr_assert(counts[4] > 0 && (ks[i] == 1) == (counts[1] == 0),
                  "top_k %zu: ids 1 and 4 drawn %zu and %zu times", ks[i], counts[1], counts[4]);
    }
}

Test(sample, no_distribution_fails_after_one_draw)
{
    const float cases[][3] = {{0.0f, NAN, 1.0f},
                              {INFINITY, 0.0f, 1.0f},
                              {-INFINITY, -INFINITY, -INFINITY}};
    const char *words[] = {"NaN", "+inf", "-inf"};
    for (size_t c = 0; c < 3; c++) {
        dp_rng rng, want;
        dp_rng_seed(&rng, 21);
        dp_rng_seed(&want, 21);
        dp_rng_uniform(&want);
        float work[3];
        int32_t id = 99;
        dp_status s = dp_sample_logits(cases[c], 3, 1.0, 0, &rng, work, &id);
        cr_assert_eq(s, DP_ERR_NON_FINITE, "case %zu: %s", c, dp_strerror(s));
        cr_assert_not_null(strstr(dp_last_error(), words[c]), "case %zu: message \"%s\"", c,
                           dp_last_error());
        cr_assert_eq(id, 99, "id written on failure");
        cr_assert(same_rng(&rng, &want), "case %zu: not exactly one draw", c);
    }
}

// --- bad arguments -----------------------------------------------------------------------

Test(sample, bad_arguments_fail_without_a_draw)
{
    float logits[4] = {0.0f, 1.0f, 2.0f, 3.0f}, work[4];
    int32_t id = 0;
    dp_rng rng, before;
    dp_rng_seed(&rng, 4);
    before = rng;
    const struct {
        const float *logits;
        size_t V;
        double t;
        dp_rng *rng;
        float *work;
        int32_t *id;
        const char *says;
    } bad[] = {
        {NULL, 4, 1.0, &rng, work, &id, "logits must not be NULL"},
        {logits, 4, 1.0, NULL, work, &id, "rng must not be NULL"},
        {logits, 4, 1.0, &rng, NULL, &id, "work must not be NULL"},
        {logits, 4, 1.0, &rng, work, NULL, "id must not be NULL"},
        {logits, 0, 1.0, &rng, work, &id, "V = 0"},
        {logits, (size_t)INT32_MAX + 2, 1.0, &rng, work, &id, "2^31"},
        {logits, 4, 0.0, &rng, work, &id, "temperature 0"},
        {logits, 4, -1.0, &rng, work, &id, "temperature -1"},
        {logits, 4, NAN, &rng, work, &id, "temperature nan"},
        {logits, 4, INFINITY, &rng, work, &id, "temperature inf"},
        {logits, 4, 1.0, &rng, logits, &id, "overlaps"},
        {logits, 4, 1.0, &rng, logits + 3, &id, "overlaps"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dp_clear_error();
        dp_status s = dp_sample_logits(bad[i].logits, bad[i].V, bad[i].t, 0, bad[i].rng,
                                       bad[i].work, bad[i].id);
        cr_assert_eq(s, DP_ERR_INVALID_ARGUMENT, "case %zu (%s): %s", i, bad[i].says,
                     dp_strerror(s));
        cr_assert_not_null(strstr(dp_last_error(), bad[i].says), "case %zu: message \"%s\"", i,
                           dp_last_error());
        cr_assert(same_rng(&rng, &before), "case %zu: the generator moved", i);
    }
    /* Adjacent buffers do not overlap. */
    float both[8] = {0.0f, 1.0f, 2.0f, 3.0f};
    dp_assert_ok(dp_sample_logits(both, 4, 1.0, 0, &rng, both + 4, &id));
}

// --- lm_train's sampler, to the bit --------------------------------------------------------

Test(sample, equals_the_old_sampler_bit_for_bit)
{
    const size_t sizes[] = {1, 2, 7, 65, 300};
    const double temps[] = {1e-6, 0.7, 1.0, 3.0};
    dp_rng data;
    dp_rng_seed(&data, 2024);
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        size_t V = sizes[si];
        float *logits = malloc(V * sizeof(float)), *old = malloc(V * sizeof(float));
        float *sorted = malloc(V * sizeof(float)), *work = malloc(V * sizeof(float));
        cr_assert(logits && old && sorted && work);
        const long ks[] = {0, 1, 5, (long)V - 1, (long)V, (long)V + 3};
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
            if (ks[ki] < 0) continue;
            for (size_t ti = 0; ti < sizeof temps / sizeof temps[0]; ti++) {
                dp_rng a, b;
                dp_rng_seed(&a, 100 * si + 10 * ki + ti);
                b = a;
                for (int row = 0; row < 40; row++) {
                    dp_rng_fill_normal(&data, logits, V, 0.0f, 2.5f);
                    /* Some rows with ties (values on a coarse grid) and -inf. */
                    for (size_t j = 0; j < V && row % 3 == 1; j++)
                        logits[j] = floorf(logits[j]);
                    for (size_t j = 1; j < V && row % 4 == 2; j += 3) logits[j] = -INFINITY;
                    memcpy(old, logits, V * sizeof(float));
                    size_t want = old_sample(old, sorted, V, temps[ti], ks[ki], &a);
                    int32_t got = pick(logits, V, temps[ti], (size_t)ks[ki], &b, work);
                    cr_assert_eq((size_t)got, want,
                                 "V %zu, top_k %ld, temperature %g, row %d: id %d, old %zu", V,
                                 ks[ki], temps[ti], row, (int)got, want);
                    cr_assert(memcmp(work, old, V * sizeof(float)) == 0,
                              "V %zu, top_k %ld, temperature %g, row %d: probabilities differ",
                              V, ks[ki], temps[ti], row);
                    cr_assert(same_rng(&a, &b), "the generators parted");
                }
            }
        }
        free(logits);
        free(old);
        free(sorted);
        free(work);
    }
}
