/*
 * dp/dtype.h - element types of tensors in files and buffers.
 *
 * The names are the safetensors format's dtype names, which dp uses for
 * every tensor it reads or writes.
 */
#ifndef DP_DTYPE_H
#define DP_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "dp/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element types dp knows, with the safetensors name of each. */
typedef enum dp_dtype {
    DP_DTYPE_F32 = 0, /* "F32"  float32 */
    DP_DTYPE_F64,     /* "F64"  float64 */
    DP_DTYPE_F16,     /* "F16"  IEEE half */
    DP_DTYPE_BF16,    /* "BF16" bfloat16 */
    DP_DTYPE_I64,     /* "I64" */
    DP_DTYPE_I32,     /* "I32" */
    DP_DTYPE_I16,     /* "I16" */
    DP_DTYPE_I8,      /* "I8" */
    DP_DTYPE_U64,     /* "U64" */
    DP_DTYPE_U32,     /* "U32" */
    DP_DTYPE_U16,     /* "U16" */
    DP_DTYPE_U8,      /* "U8" */
    DP_DTYPE_BOOL,    /* "BOOL" one byte per element */
    DP_DTYPE_COUNT
} dp_dtype;

/* Size of one element in bytes; 0 for a value outside the enum. */
DP_API size_t dp_dtype_size(dp_dtype dtype);

/* The format's name ("F32", ...); "invalid dtype" for a value outside the enum. */
DP_API const char *dp_dtype_name(dp_dtype dtype);

/* bfloat16 (Google Brain's "brain float"): the upper 16 bits of a float32
 * (sign, the 8-bit exponent, 7 mantissa bits), so it has float32's range
 * and about 3 significant decimal digits. dp stores bf16 replicas of the
 * parameters (dp_model.param_dtype) as these bits. */
typedef uint16_t dp_bf16;

/* x rounded to the nearest bfloat16, ties to even (PyTorch's
 * tensor.to(torch.bfloat16), CUDA's __float2bfloat16_rn): finite values past
 * the largest bfloat16 (about 3.39e38) become +-Inf, subnormals stay
 * subnormal, a NaN stays a NaN. Every device rounds the same way. */
DP_API dp_bf16 dp_bf16_from_float(float x);

/* The float32 with x's value (exact). */
DP_API float dp_bf16_to_float(dp_bf16 x);

#ifdef __cplusplus
}
#endif

#endif /* DP_DTYPE_H */
