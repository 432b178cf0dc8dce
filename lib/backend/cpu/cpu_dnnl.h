/*
 * backend/cpu/cpu_dnnl.h - the oneDNN module's table (libdp-dnnl,
 * cpu_dnnl.c; core/module.h): the bf16 matmul of CPU devices.
 *
 * cpu_gemm.c cuts a GEMM into pieces and converts their operands; a piece
 * with bf16 math then runs here, on oneDNN's matmul primitive, or, where
 * the module cannot be loaded or this CPU has no bf16 matmul, on OpenBLAS
 * with the same arithmetic (as a build without oneDNN does).
 */
#ifndef DP_BACKEND_CPU_DNNL_H
#define DP_BACKEND_CPU_DNNL_H

#include <stddef.h>

#include "backend/backend.h"
#include "core/module.h"

/* A bias the matmul's epilogue adds (dp_dnnl_key.bias). */
enum { DP_DNNL_BIAS_NONE, DP_DNNL_BIAS_F32, DP_DNNL_BIAS_BF16 };

/* One piece's matmul: what a primitive is built for. Compared with
 * memcmp: zero it (padding too) before filling it in. bias: a bias(m)
 * added to every column of C in float32 (DP_DNNL_BIAS_*; batch 1 only);
 * c_bf16: C is bfloat16, each float32 result rounded once. */
typedef struct dp_dnnl_key {
    int ta, tb, m, n, k, lda, ldb, ldc, batch;
    long long sa, sb, sc;
    float alpha, beta;
    int bias, c_bf16;
} dp_dnnl_key;

typedef struct dp_dnnl_module {
    dp_module_header hdr;
    /* A device's oneDNN state (engine, stream, the last primitives built,
     * one per GEMM shape); NULL when oneDNN cannot run here. */
    void *(*create)(void);
    void (*destroy)(void *st);
    /* The primitive for key, built on a miss: *pad_bytes raised to its
     * scratchpad's size; *unimplemented set (and DP_OK) when this CPU has
     * no bf16 matmul, so the caller runs the piece on OpenBLAS. */
    dp_status (*prepare)(dp_device *dev, void *st, const dp_dnnl_key *key, size_t *pad_bytes,
                         int *unimplemented);
    /* C(key) = alpha op(A) op(B) + beta C (+ bias): the piece's product of
     * bfloat16 operands a (weights: op(A)) and b (source: op(B)) summed in
     * float32, on one OpenMP thread, stored as key->c_bf16 says; bias is
     * NULL unless key->bias names its type; pad is the scratchpad
     * (prepare's size). */
    dp_status (*run)(dp_device *dev, void *st, const dp_dnnl_key *key, const void *a,
                     const void *b, const void *bias, void *C, void *pad);
} dp_dnnl_module;

#endif /* DP_BACKEND_CPU_DNNL_H */
