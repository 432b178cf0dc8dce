/*
 * core/dtype.c - the element types' sizes and names (dp/dtype.h), shared
 * by the backends, the layers and the safetensors reader and writer.
 */
#include <math.h>
#include <string.h>

#include "core/dtype.h"

/* The names are the safetensors format's. */
static const struct {
    const char *name;
    size_t size;
} dtype_info[DP_DTYPE_COUNT] = {
    [DP_DTYPE_F32] = {"F32", 4},  [DP_DTYPE_F64] = {"F64", 8}, [DP_DTYPE_F16] = {"F16", 2},
    [DP_DTYPE_BF16] = {"BF16", 2}, [DP_DTYPE_I64] = {"I64", 8}, [DP_DTYPE_I32] = {"I32", 4},
    [DP_DTYPE_I16] = {"I16", 2},  [DP_DTYPE_I8] = {"I8", 1},   [DP_DTYPE_U64] = {"U64", 8},
    [DP_DTYPE_U32] = {"U32", 4},  [DP_DTYPE_U16] = {"U16", 2}, [DP_DTYPE_U8] = {"U8", 1},
    [DP_DTYPE_BOOL] = {"BOOL", 1},
};

size_t dp_dtype_size(dp_dtype dtype)
{
    if ((int)dtype < 0 || dtype >= DP_DTYPE_COUNT) return 0;
    return dtype_info[dtype].size;
}

const char *dp_dtype_name(dp_dtype dtype)
{
    if ((int)dtype < 0 || dtype >= DP_DTYPE_COUNT) return "invalid dtype";
    return dtype_info[dtype].name;
}

int dp_dtype_from_name(const char *name, dp_dtype *out)
{
    for (int i = 0; i < DP_DTYPE_COUNT; i++) {
        if (strcmp(name, dtype_info[i].name) == 0) {
            *out = (dp_dtype)i;
            return 1;
        }
    }
    return 0;
}

float dp_f16_to_float(uint16_t h)
{
    int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    float v;
    if (exp == 0) v = ldexpf((float)man, -24);                 /* zero, subnormal */
    else if (exp == 31) v = man ? NAN : INFINITY;              /* Inf, NaN */
    else v = ldexpf((float)(man | 0x400), exp - 25);          /* normal: 1.man x 2^(exp-15) */
    return sign ? -v : v;
}
