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

/* Parses a byte size: decimal digits with an optional fraction ("12",
 * "1.5"; no sign, exponent or hex), then an optional unit: B,
 * KB/MB/GB/TB (powers of 1000), KiB/MiB/GiB/TiB (powers of 1024), or
 * K/M/G/T (1024-based, as --memory-limit 12G is usually meant);
 * case-insensitive; white space before and after the number and the
 * unit is ignored. *out receives the size in bytes, exactly (fractions
 * rounded down), up to SIZE_MAX.
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL, not such a number, unknown unit,
 * too large for size_t) with the text and the accepted forms. */
DP_API dp_status dp_parse_bytes(const char *text, size_t *out);

#ifdef __cplusplus
}
#endif

#endif /* DP_UNITS_H */
