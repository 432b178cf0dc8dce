/*
 * tests/nn_test_util.h - small helpers shared by the layer tests
 * (test_encoder.c, test_linear.c, ...): device<->host copies, checks of
 * the error path and of the device's memory accounting.
 */
#ifndef DP_NN_TEST_UTIL_H
#define DP_NN_TEST_UTIL_H

#include <stdint.h>
#include <string.h>

#include "dp_test.h"

/* Host copy of n device floats; the caller frees it. */
static inline float *dp_test_nn_download(dp_device *dev, const float *d, size_t n)
{
    float *h = malloc((n ? n : 1) * sizeof *h);
    cr_assert_not_null(h, "out of host memory");
    dp_assert_ok(dp_copy_d2h(dev, h, d, n * sizeof *h));
    return h;
}

/* Device buffer holding a copy of n host int32s. */
static inline int32_t *nn_upload_i32(dp_device *dev, const int32_t *host, size_t n)
{
    void *p = NULL;
    dp_assert_ok(dp_device_alloc(dev, (n ? n : 1) * sizeof(int32_t), &p));
    dp_assert_ok(dp_copy_h2d(dev, p, host, n * sizeof(int32_t)));
    return p;
}

/* Device buffer of n floats, every one set to value. */
static inline float *dp_test_nn_filled(dp_device *dev, size_t n, float value)
{
    float *h = malloc((n ? n : 1) * sizeof *h);
    cr_assert_not_null(h, "out of host memory");
    for (size_t i = 0; i < n; i++) h[i] = value;
    float *d = dp_test_upload(dev, h, n);
    free(h);
    return d;
}

static inline void dp_test_nn_check_invalid(dp_status s, const char *expr, const char *want1,
                                    const char *want2)
{
    cr_assert_eq(s, DP_ERR_INVALID_ARGUMENT, "%s returned %s, want invalid argument", expr,
                 dp_strerror(s));
    const char *msg = dp_last_error();
    cr_assert(strstr(msg, want1) != NULL, "%s: message lacks '%s': %s", expr, want1, msg);
    if (want2)
        cr_assert(strstr(msg, want2) != NULL, "%s: message lacks '%s': %s", expr, want2, msg);
}

/* Asserts expr returns DP_ERR_INVALID_ARGUMENT and its message contains
 * want1 and, unless NULL, want2 (the call's name, the bad argument, ...). */
#define dp_test_nn_assert_invalid(expr, want1, want2)                                                \
    do {                                                                                     \
        dp_clear_error();                                                                    \
        dp_test_nn_check_invalid((expr), #expr, (want1), (want2));                                   \
    } while (0)

/* Everything allocated on dev has been freed. */
static inline void dp_test_nn_assert_all_freed(dp_device *dev)
{
    dp_memory_stats st;
    dp_device_memory(dev, &st);
    cr_assert_eq(st.in_use, 0, "%zu bytes still allocated on %s", st.in_use,
                 dp_device_name(dev));
    cr_assert_eq(st.n_allocs, 0, "%zu allocations still live on %s", st.n_allocs,
                 dp_device_name(dev));
}

#endif /* DP_NN_TEST_UTIL_H */
