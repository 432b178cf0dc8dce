/*
 * The optimizer's fused update (optim/adamw_segments.h): AdamW over
 * several tensors of a slice in one call, with the clipping factor and the
 * bf16 replica's refresh, gives the same bits as the three calls per
 * tensor it replaces (dp_scale, dp_adamw_update, dp_convert), leaves the
 * gaps between tensors alone, and refuses bad tables and factors. (The
 * engine's training through it is unchanged bit for bit: every engine
 * test, and the float64 AdamW reference in test_optim.)
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dp_test.h"
#include "optim/adamw_segments.h"

enum { N = 700 };

static float *upload(dp_device *dev, const float *h, size_t n)
{
    float *d = NULL;
    dp_assert_ok(dp_device_alloc(dev, n * sizeof *d, (void **)&d));
    dp_assert_ok(dp_copy_h2d(dev, d, h, n * sizeof *d));
    return d;
}

/* Segments of 1, 100, 37, 200 and 3 elements with gaps of 0, 5, 11 and 2
 * between them (the first at 0), decay on every other one. */
static dp_adamw_segs table(void)
{
    static const uint64_t len[] = {1, 100, 37, 200, 3}, gap[] = {0, 5, 11, 2};
    dp_adamw_segs s;
    memset(&s, 0, sizeof s);
    uint64_t at = 0;
    for (uint32_t i = 0; i < 5; i++) {
        if (i) at += gap[i - 1];
        s.begin[i] = at;
        s.end[i] = at + len[i];
        s.weight_decay[i] = i % 2 ? 0.1f : 0.0f;
        at = s.end[i];
    }
    s.n = 5;
    return s;
}

/* Two steps of the fused call against the three calls per segment, from
 * the same state: params, grads (scaled in place), m, v and the bf16
 * replica the same bits; the gaps (NaN-filled) untouched. */
static void check_fused(float clip, int with_replica)
{
    dp_device *dev = dp_test_cpu(0);
    dp_adamw_segs s = table();
    float h[5][N];
    dp_rng rng;
    dp_rng_seed(&rng, 4040);
    dp_rng_fill_normal(&rng, h[0], N, 0.0f, 1.0f);  /* params */
    dp_rng_fill_normal(&rng, h[1], N, 0.0f, 0.3f);  /* grads */
    dp_rng_fill_normal(&rng, h[2], N, 0.0f, 0.01f); /* m */
    dp_rng_fill_uniform(&rng, h[3], N, 0.0f, 1e-3f); /* v */
    for (size_t i = 0; i < N; i++) h[4][i] = NAN;    /* bf16 replica, as floats */
    /* the gaps: NaN everywhere, so any write shows */
    for (uint32_t k = 0; k + 1 < s.n; k++)
        for (uint64_t i = s.end[k]; i < s.begin[k + 1]; i++)
            for (int b = 0; b < 4; b++) h[b][i] = NAN;
    float *a[5], *b[5];
    for (int j = 0; j < 5; j++) a[j] = upload(dev, h[j], N), b[j] = upload(dev, h[j], N);
    uint16_t *ra = with_replica ? (uint16_t *)a[4] : NULL, *rb = with_replica ? (uint16_t *)b[4] : NULL;
    for (long t = 1; t <= 2; t++) {
        dp_assert_ok(dp_adamw_update_segments(dev, a[0], a[1], a[2], a[3], ra, &s, 3e-3f, 0.9f,
                                              0.95f, 1e-8f, t, clip));
        for (uint32_t k = 0; k < s.n; k++) {
            size_t o = (size_t)s.begin[k], n = (size_t)(s.end[k] - s.begin[k]);
            if (clip != 1.0f) dp_assert_ok(dp_scale(dev, b[1] + o, clip, n));
            dp_assert_ok(dp_adamw_update(dev, b[0] + o, b[1] + o, b[2] + o, b[3] + o, n, 3e-3f,
                                         0.9f, 0.95f, 1e-8f, s.weight_decay[k], t));
            if (rb)
                dp_assert_ok(dp_convert(dev, rb + o, DP_DTYPE_BF16, b[0] + o, DP_DTYPE_F32, n));
        }
    }
    static const char *what[] = {"params", "grads", "m", "v", "replica"};
    for (int j = 0; j < 5; j++) {
        float x[N], y[N];
        dp_assert_ok(dp_copy_d2h(dev, x, a[j], sizeof x));
        dp_assert_ok(dp_copy_d2h(dev, y, b[j], sizeof y));
        cr_assert(memcmp(x, y, sizeof x) == 0, "clip %g replica %d: %s differ", (double)clip,
                  with_replica, what[j]);
        for (uint32_t k = 0; k + 1 < s.n && j < 4; k++)
            for (uint64_t i = s.end[k]; i < s.begin[k + 1]; i++)
                cr_assert(isnan(x[i]), "%s: gap element %llu written", what[j],
                          (unsigned long long)i);
        if (j == 0) { /* and the update did move the parameters */
            int moved = 0;
            for (size_t i = 0; i < N; i++) moved += !isnan(h[0][i]) && x[i] != h[0][i];
            cr_assert_gt(moved, 300, "only %d parameters moved", moved);
        }
    }
    for (int j = 0; j < 5; j++) {
        dp_device_free(dev, a[j]);
        dp_device_free(dev, b[j]);
    }
    dp_device_close(dev);
}

Test(adamw_segments, clipped_with_replica_equals_the_three_calls) { check_fused(0.37f, 1); }
Test(adamw_segments, unclipped_without_replica_equals_the_three_calls) { check_fused(1.0f, 0); }

static void expect_invalid(dp_status st, const char *needle)
{
    cr_assert_eq(st, DP_ERR_INVALID_ARGUMENT, "status %d", (int)st);
    cr_assert(strstr(dp_last_error(), needle), "message \"%s\" lacks \"%s\"", dp_last_error(),
              needle);
}

Test(adamw_segments, bad_tables_and_factors)
{
    dp_device *dev = dp_test_cpu(0);
    float h[N] = {0};
    float *p = upload(dev, h, N), *g = upload(dev, h, N), *m = upload(dev, h, N),
          *v = upload(dev, h, N);
    dp_adamw_segs s = table(), bad;
#define CALL(segs, clip) \
    dp_adamw_update_segments(dev, p, g, m, v, NULL, segs, 1e-3f, 0.9f, 0.95f, 1e-8f, 1, clip)
    bad = s;
    bad.n = 0;
    expect_invalid(CALL(&bad, 1.0f), "segment table of 0 entries");
    bad.n = DP_ADAMW_SEGS + 1;
    expect_invalid(CALL(&bad, 1.0f), "1 to 64");
    bad = s;
    bad.begin[0] = 1;
    expect_invalid(CALL(&bad, 1.0f), "begins at 1, not 0");
    bad = s;
    bad.begin[2] = bad.end[1] - 1;
    expect_invalid(CALL(&bad, 1.0f), "overlaps the one before");
    bad = s;
    bad.end[3] = bad.begin[3];
    expect_invalid(CALL(&bad, 1.0f), "is empty");
    bad = s;
    bad.weight_decay[1] = -0.1f;
    expect_invalid(CALL(&bad, 1.0f), "weight_decay");
    expect_invalid(CALL(&s, 0.0f), "clip factor 0");
    expect_invalid(CALL(&s, INFINITY), "clip factor inf");
    expect_invalid(CALL(&s, NAN), "clip factor nan");
    expect_invalid(CALL(NULL, 1.0f), "segment table of 0 entries");
    expect_invalid(dp_adamw_update_segments(dev, p, g, NULL, v, NULL, &s, 1e-3f, 0.9f, 0.95f,
                                            1e-8f, 1, 1.0f),
                   "moments m and v");
    expect_invalid(dp_adamw_update_segments(dev, p, g, m, v, NULL, &s, 1e-3f, 0.9f, 0.95f, 1e-8f,
                                            0, 1.0f),
                   "step t = 0");
#undef CALL
    float *bufs[] = {p, g, m, v};
    for (int i = 0; i < 4; i++) dp_device_free(dev, bufs[i]);
    dp_device_close(dev);
}
