/*
 * nn/ops_internal.h - the chunked host loop behind dp/ops.h, shared with
 * the bundled MSE criterion (not installed).
 */
#ifndef DP_NN_OPS_INTERNAL_H
#define DP_NN_OPS_INTERNAL_H

#include <stddef.h>

#include "backend/backend.h"

/* Processes n elements: out (written, may be NULL or equal to a), a and b
 * (read, may be NULL) are host pointers to the chunk of len elements that
 * starts at element `first`. */
typedef dp_status (*dp_ops_chunk_fn)(void *ctx, float *out, const float *a, const float *b,
                                     size_t len, size_t first);

/* Runs fn over the n elements of the device arrays in index order: in
 * place on host-memory devices, chunk by chunk through stack buffers on
 * others (out is copied back after each chunk). */
dp_status dp_ops_foreach(dp_device *dev, float *out, const float *a, const float *b, size_t n,
                         dp_ops_chunk_fn fn, void *ctx);

#endif /* DP_NN_OPS_INTERNAL_H */
