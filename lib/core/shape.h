/*
 * core/shape.h - a tensor shape as text for messages (not installed).
 */
#ifndef DP_CORE_SHAPE_H
#define DP_CORE_SHAPE_H

#include <stddef.h>
#include <stdio.h>

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

#endif /* DP_CORE_SHAPE_H */
