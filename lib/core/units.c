/*
 * core/units.c - byte sizes with units ("12GiB", "512MB", "4096").
 */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/error.h"
#include "dp/units.h"

/* The units, each an exact integer number of bytes. */
static const struct {
    const char *suffix;
    uint64_t factor;
} units[] = {{"", 1},
             {"B", 1},
             {"K", 1024},
             {"KB", 1000},
             {"KiB", 1024},
             {"M", 1048576},
             {"MB", 1000000},
             {"MiB", 1048576},
             {"G", 1073741824},
             {"GB", 1000000000},
             {"GiB", 1073741824},
             {"T", 1099511627776ull},
             {"TB", 1000000000000ull},
             {"TiB", 1099511627776ull}};

#define SIZE_HELP "write e.g. 12GiB, 512MB or 4096 (bytes)"

/* Digits past this many after the point are read as 0: a size rounds
 * down to whole bytes, and 10^19 x 2^40 still fits 128 bits. */
#define MAX_FRACTION_DIGITS 19

dp_status dp_parse_bytes(const char *text, size_t *out)
{
    if (!text || !out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "text and out must not be NULL");
    while (isspace((unsigned char)*text)) text++;
    /* Decimal digits, exactly: strtod would round past 2^53, and take
     * exponents, hex and "inf". */
    const char *p = text;
    uint64_t whole = 0, frac = 0, frac_den = 1;
    int whole_fits = 1, digits = 0;
    for (; isdigit((unsigned char)*p); p++, digits++) {
        unsigned d = (unsigned)(*p - '0');
        if (whole > (UINT64_MAX - d) / 10) whole_fits = 0;
        else whole = whole * 10 + d;
    }
    if (*p == '.') {
        p++;
        for (int n = 0; isdigit((unsigned char)*p); p++, digits++, n++)
            if (n < MAX_FRACTION_DIGITS) {
                frac = frac * 10 + (uint64_t)(*p - '0');
                frac_den *= 10;
            }
    }
    if (!digits)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "\"%s\" is not a size; " SIZE_HELP, text);
    if ((*p == 'e' || *p == 'E') && (isdigit((unsigned char)p[1]) || p[1] == '+' || p[1] == '-'))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "\"%s\": sizes are decimal digits, without an "
                       "exponent; " SIZE_HELP, text);
    if ((*p == 'x' || *p == 'X') && p - text == 1 && *text == '0')
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "\"%s\": sizes are decimal digits, not hex; "
                       SIZE_HELP, text);
    const char *end = p;
    while (isspace((unsigned char)*end)) end++;
    /* the unit, without the white space after it (as before the number) */
    size_t unit_len = strlen(end);
    while (unit_len && isspace((unsigned char)end[unit_len - 1])) unit_len--;
    for (size_t i = 0; i < sizeof units / sizeof *units; i++) {
        if (strlen(units[i].suffix) != unit_len ||
            strncasecmp(end, units[i].suffix, unit_len) != 0)
            continue;
        __extension__ typedef unsigned __int128 u128;
        u128 bytes = (u128)whole * units[i].factor + (u128)frac * units[i].factor / frac_den;
        if (!whole_fits || bytes > (u128)SIZE_MAX)
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "size \"%s\" is too large (at most %zu "
                           "bytes)", text, (size_t)SIZE_MAX);
        *out = (size_t)bytes;
        return DP_OK;
    }
    return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "\"%s\": unknown unit \"%.*s\"; use B, KB, MB, GB, "
                   "TB (powers of 1000), KiB, MiB, GiB, TiB (powers of 1024), or K, M, G, T "
                   "(as KiB, MiB, GiB, TiB)", text, (int)unit_len, end);
}
