/*
 * core/shape.h - a tensor shape as text for messages, and its sizes (not
 * installed).
 */
#ifndef DP_CORE_SHAPE_H
#define DP_CORE_SHAPE_H

#include <stddef.h>
#include <stdio.h>

#include "dp/checked.h"

/* "[768, 3072]" of shape (ndim dimensions) into buf (cap bytes, cut short
 * when it does not fit); returns buf. */
static inline const char *dp_shape_text(char *buf, size_t cap, const size_t *shape, int ndim)
{
    size_t k = 0;
    buf[0] = '\0';
    k += (size_t)snprintf(buf + k, cap - k, "[");
    for (int i = 0; i < ndim && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, i ? ", %zu" : "%zu", shape[i]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
    return buf;
}

/* numel and byte size of a shape (ndim dimensions of elsize bytes); 0 on
 * size_t overflow. */
static inline int dp_shape_bytes(const size_t *shape, int ndim, size_t elsize, size_t *numel,
                                 size_t *nbytes)
{
    size_t n = 1, b;
    for (int i = 0; i < ndim; i++)
        if (!dp_size_mul(n, shape[i], &n)) return 0;
    if (!dp_size_mul(n, elsize, &b)) return 0;
    *numel = n;
    *nbytes = b;
    return 1;
}

#endif /* DP_CORE_SHAPE_H */
