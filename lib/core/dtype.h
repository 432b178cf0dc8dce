/*
 * core/dtype.h - the element types' lookup by name and the half-precision
 * widening (not installed; the sizes and names are public, dp/dtype.h).
 */
#ifndef DP_CORE_DTYPE_H
#define DP_CORE_DTYPE_H

#include <stdint.h>

#include "dp/dtype.h"

/* The dtype whose safetensors name is name ("F32", ...): 1 and *out, or 0
 * for a name dp does not know. */
int dp_dtype_from_name(const char *name, dp_dtype *out);

/* An IEEE 754 binary16 value (its bits) as float32, exactly (every half is
 * a float: subnormals, infinities and NaNs included). */
float dp_f16_to_float(uint16_t h);

#endif /* DP_CORE_DTYPE_H */
