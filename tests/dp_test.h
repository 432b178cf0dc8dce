/*
 * tests/dp_test.h - helpers shared by the Criterion tests.
 *
 * dp_assert_allclose(actual, expected, n, atol, rtol): passes when
 * |a - e| <= atol + rtol * |e| for every element (numpy.allclose's rule);
 * otherwise fails the test naming the first bad index, its values, how many
 * elements are bad and the largest absolute and relative differences.
 * NaN never compares close.
 */
#ifndef DP_TEST_H
#define DP_TEST_H

#include <math.h>
#include <stddef.h>
#include <stdlib.h>

#include <criterion/criterion.h>

#include "dp/dp.h"

static inline void dp_test_allclose_d(const char *what, const double *a, const double *e,
                                      size_t n, double atol, double rtol, const char *file,
                                      int line)
{
    size_t bad = 0, first = (size_t)-1, worst = 0;
    double max_abs = 0.0, max_rel = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(a[i] - e[i]);
        double rel = d / (fabs(e[i]) > 1e-30 ? fabs(e[i]) : 1e-30);
        int ok = d <= atol + rtol * fabs(e[i]);
        if (!ok || isnan(d)) {
            if (first == (size_t)-1) first = i;
            bad++;
        }
        if (d > max_abs || isnan(d)) {
            max_abs = d;
            worst = i;
        }
        if (rel > max_rel) max_rel = rel;
    }
    if (bad)
        cr_assert_fail("%s:%d: %s: %zu of %zu elements not close (atol %g, rtol %g); first bad index "
                "%zu: actual %.9g expected %.9g; largest |diff| %.3g at %zu, largest rel %.3g",
                file, line, what, bad, n, atol, rtol, first, a[first], e[first], max_abs,
                worst, max_rel);
}

static inline void dp_test_allclose_f(const char *what, const float *a, const float *e,
                                      size_t n, double atol, double rtol, const char *file,
                                      int line)
{
    double *ad = malloc((n ? n : 1) * sizeof *ad), *ed = malloc((n ? n : 1) * sizeof *ed);
    cr_assert(ad && ed, "out of host memory");
    for (size_t i = 0; i < n; i++) {
        ad[i] = a[i];
        ed[i] = e[i];
    }
    dp_test_allclose_d(what, ad, ed, n, atol, rtol, file, line);
    free(ad);
    free(ed);
}

#define dp_assert_allclose(a, e, n, atol, rtol)                                              \
    _Generic((a), float *: dp_test_allclose_f, const float *: dp_test_allclose_f,            \
             double *: dp_test_allclose_d, const double *: dp_test_allclose_d)(              \
        #a " vs " #e, (a), (e), (n), (atol), (rtol), __FILE__, __LINE__)

/* Fails the test with dp's last error when s is not DP_OK. */
#define dp_assert_ok(expr)                                                                   \
    do {                                                                                     \
        dp_status dp_s_ = (expr);                                                            \
        cr_assert(dp_s_ == DP_OK, "%s failed: %s: %s", #expr, dp_strerror(dp_s_),            \
                  dp_last_error());                                                          \
    } while (0)

/* x's bfloat16 value computed in double, independently of dp's own
 * rounding (so a fault there shows): the nearest number of 8 significant
 * bits, ties to even (nearbyint in the default rounding mode). For finite
 * x well inside bfloat16's range (no overflow, no subnormals). */
static inline double dp_test_bf16_value(double x)
{
    if (x == 0.0 || !isfinite(x)) return x;
    int e;
    double f = frexp(x, &e); /* x = f 2^e, 0.5 <= |f| < 1 */
    return ldexp(nearbyint(ldexp(f, 8)), e - 8);
}

/* Opens cpu:index for a test. */
static inline dp_device *dp_test_cpu(int index)
{
    dp_device_spec spec = {DP_DEVICE_CPU, index};
    dp_device *dev = NULL;
    dp_assert_ok(dp_device_open(&spec, &dev));
    return dev;
}

/* Device buffer holding a copy of n host floats. */
/* Two training runs from the same start p0: *diff = sum |a - b|, *moved =
 * sum |a - p0| over n parameters. AdamW moves a parameter whose tiny
 * gradient changes sign by a whole lr either way, so runs that should
 * agree to rounding compare diff with moved rather than element-wise. */
static inline void dp_test_param_drift(const float *a, const float *b, const float *p0, size_t n,
                                       double *diff, double *moved)
{
    *diff = *moved = 0.0;
    for (size_t i = 0; i < n; i++) {
        *diff += fabs((double)a[i] - b[i]);
        *moved += fabs((double)a[i] - p0[i]);
    }
}

static inline float *dp_test_upload(dp_device *dev, const float *host, size_t n)
{
    void *p = NULL;
    dp_assert_ok(dp_device_alloc(dev, (n ? n : 1) * sizeof(float), &p));
    dp_assert_ok(dp_copy_h2d(dev, p, host, n * sizeof(float)));
    return p;
}

#endif /* DP_TEST_H */
