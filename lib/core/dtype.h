/*
 * core/dtype.h - the element types' lookup by name (not installed; the
 * sizes and names are public, dp/dtype.h).
 */
#ifndef DP_CORE_DTYPE_H
#define DP_CORE_DTYPE_H

#include "dp/dtype.h"

/* The dtype whose safetensors name is name ("F32", ...): 1 and *out, or 0
 * for a name dp does not know. */
int dp_dtype_from_name(const char *name, dp_dtype *out);

#endif /* DP_CORE_DTYPE_H */
