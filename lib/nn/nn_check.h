/*
 * nn/nn_check.h - argument checks shared by the lib/nn public wrappers.
 *
 * Macros, so that the recorded message names the public function that
 * was called (DP_FAIL takes __func__ where it expands).
 */
#ifndef DP_NN_CHECK_H
#define DP_NN_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "core/error.h"
#include "dp/checked.h"

/* *out = a * b * c; returns 0 when the product, or the product times
 * sizeof(float) (the buffer's bytes), does not fit in size_t. */
static inline int dp_nn_count3(size_t a, size_t b, size_t c, size_t *out)
{
    size_t abc, bytes;
    if (!dp_size_mul(a, b, &abc) || !dp_size_mul(abc, c, &abc) ||
        !dp_size_mul(abc, sizeof(float), &bytes))
        return 0;
    *out = abc;
    return 1;
}

/* Buffers a call writes (or reads while another is written) must be
 * separate (the permutes, GEMMs and fused kernels are not in place): the
 * first two of the n pointers p that are equal fail the call fn, naming
 * them (names[i]). Only identical start pointers are detected. */
static inline dp_status dp_nn_check_distinct(const char *fn, dp_device *dev,
                                             const void *const *p, const char *const *names,
                                             int n)
{
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (p[i] == p[j])
                return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                               "%s on %s: %s and %s are the same buffer; pass separate "
                               "buffers",
                               fn, dev->name, names[i], names[j]);
    return DP_OK;
}

/* A tensor's element type where a call takes float32 or bfloat16: *bf16
 * = whether it is bfloat16; else the call fn fails, naming the argument
 * `what`. dev may be NULL (a message's device name). */
static inline dp_status dp_nn_check_dtype(const char *fn, const dp_device *dev, const char *what,
                                          dp_dtype t, int *bf16)
{
    *bf16 = t == DP_DTYPE_BF16;
    if (t == DP_DTYPE_F32 || t == DP_DTYPE_BF16) return DP_OK;
    return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                   "%s on %s: %s %s (%d) is neither DP_DTYPE_F32 nor DP_DTYPE_BF16", fn,
                   dev ? dev->name : "(null)", what, dp_dtype_name(t), (int)t);
}

/* The attention's heads: B, T, C and NH > 0 and C a multiple of NH (the
 * head size is C/NH); else the call fn fails. */
static inline dp_status dp_nn_check_heads(const char *fn, const dp_device *dev, size_t B,
                                          size_t T, size_t C, size_t NH)
{
    if (!B || !T || !C || !NH)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "%s on %s: B=%zu, T=%zu, C=%zu and NH=%zu must all be > 0", fn,
                       dev->name, B, T, C, NH);
    if (C % NH)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "%s on %s: C=%zu is not a multiple of NH=%zu (C %% NH != 0); the head "
                       "size is C/NH, so choose C divisible by the number of heads",
                       fn, dev->name, C, NH);
    return DP_OK;
}

#define DP_NN_REQUIRE_DEV(dev)                                                            \
    do {                                                                                  \
        if (!(dev)) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "dev must not be NULL");     \
    } while (0)

/* A required device pointer. */
#define DP_NN_REQUIRE_PTR(dev, p)                                                         \
    do {                                                                                  \
        if (!(p))                                                                         \
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: %s must not be NULL; pass a "   \
                           "buffer allocated on this device", (dev)->name, #p);           \
    } while (0)

/* Dimensions a, b, c must be > 0 and a*b*c floats must fit in size_t;
 * *count receives a*b*c. */
#define DP_NN_CHECK_DIMS3(dev, a, b, c, count)                                            \
    do {                                                                                  \
        if (!(a) || !(b) || !(c))                                                         \
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: %s, %s and %s must all be > 0 "  \
                           "(got %s=%zu %s=%zu %s=%zu)", (dev)->name, #a, #b, #c, #a,     \
                           (size_t)(a), #b, (size_t)(b), #c, (size_t)(c));                \
        if (!dp_nn_count3((a), (b), (c), (count)))                                        \
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: %s*%s*%s floats overflow size_t " \
                           "(%s=%zu %s=%zu %s=%zu)", (dev)->name, #a, #b, #c, #a,         \
                           (size_t)(a), #b, (size_t)(b), #c, (size_t)(c));                \
    } while (0)

#define DP_NN_CHECK_DIMS2(dev, a, b, count)                                               \
    do {                                                                                  \
        if (!(a) || !(b))                                                                 \
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: %s and %s must both be > 0 (got " \
                           "%s=%zu %s=%zu)", (dev)->name, #a, #b, #a, (size_t)(a), #b,    \
                           (size_t)(b));                                                  \
        if (!dp_nn_count3((a), (b), 1, (count)))                                          \
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: %s*%s floats overflow size_t "   \
                           "(%s=%zu %s=%zu)", (dev)->name, #a, #b, #a, (size_t)(a), #b,   \
                           (size_t)(b));                                                  \
    } while (0)

#define DP_NN_CHECK_DIMS1(dev, a)                                                         \
    do {                                                                                  \
        size_t dp_nn_count_;                                                              \
        if (!(a))                                                                         \
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: %s must be > 0", (dev)->name,   \
                           #a);                                                           \
        if (!dp_nn_count3((a), 1, 1, &dp_nn_count_))                                      \
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: %s=%zu floats overflow size_t",  \
                           (dev)->name, #a, (size_t)(a));                                 \
    } while (0)

/* 1 when the byte ranges [a, a + na) and [b, b + nb) share a byte (NULL
 * or empty ranges share none). */
static inline int dp_nn_overlap(const void *a, size_t na, const void *b, size_t nb)
{
    if (!a || !b || !na || !nb) return 0;
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y ? y - x < na : x - y < nb;
}

/* Buffers p (np bytes) and q (nq bytes) must not overlap: one is written
 * while the other is read. */
#define DP_NN_REQUIRE_DISJOINT(dev, p, np, q, nq)                                         \
    do {                                                                                  \
        if (dp_nn_overlap((p), (np), (q), (nq)))                                          \
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: %s (%zu bytes) and %s (%zu "     \
                           "bytes) overlap; pass separate buffers", (dev)->name, #p,      \
                           (size_t)(np), #q, (size_t)(nq));                               \
    } while (0)

#endif /* DP_NN_CHECK_H */
