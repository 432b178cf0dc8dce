/*
 * dp/units.h - byte sizes written with units, as command lines take them
 * (--memory-limit 12GiB).
 */
#ifndef DP_UNITS_H
#define DP_UNITS_H

#include <stddef.h>

#include "dp/export.h"
#include "dp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Parses a byte size: a non-negative number with an optional unit, B, K,
 * KB/MB/GB/TB (powers of 1000), KiB/MiB/GiB/TiB (powers of 1024), M and G
 * (1024-based, as --memory-limit 12G is usually meant); case-insensitive;
 * white space before and after the number and the unit is ignored.
 * *out receives the size in bytes (fractions rounded down).
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL, not a number, negative, unknown
 * unit, too large for size_t) with the text and the accepted units. */
DP_API dp_status dp_parse_bytes(const char *text, size_t *out);

#ifdef __cplusplus
}
#endif

#endif /* DP_UNITS_H */
