/*
 * core/units.c - byte sizes with units ("12GiB", "512MB", "4096").
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/error.h"
#include "dp/units.h"

dp_status dp_parse_bytes(const char *text, size_t *out)
{
    if (!text || !out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "text and out must not be NULL");
    static const struct {
        const char *suffix;
        double factor;
    } units[] = {{"", 1},          {"B", 1},           {"K", 1024},       {"KB", 1e3},
                 {"KiB", 1024},    {"M", 1048576},     {"MB", 1e6},       {"MiB", 1048576},
                 {"G", 1073741824}, {"GB", 1e9},       {"GiB", 1073741824}, {"T", 1099511627776.0},
                 {"TB", 1e12},     {"TiB", 1099511627776.0}};
    while (isspace((unsigned char)*text)) text++;
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || errno || !isfinite(v) || v < 0 || *text == '-')
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "\"%s\" is not a size; write e.g. 12GiB, 512MB or "
                       "4096 (bytes)", text);
    while (isspace((unsigned char)*end)) end++;
    /* the unit, without the white space after it (as before the number) */
    size_t unit_len = strlen(end);
    while (unit_len && isspace((unsigned char)end[unit_len - 1])) unit_len--;
    for (size_t i = 0; i < sizeof units / sizeof *units; i++) {
        if (strlen(units[i].suffix) != unit_len ||
            strncasecmp(end, units[i].suffix, unit_len) != 0)
            continue;
        /* Case-insensitive match, but "mb" vs "MiB" are distinct suffixes by spelling. */
        double bytes = v * units[i].factor;
        if (bytes >= 18446744073709551615.0 || bytes >= (double)SIZE_MAX)
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "size \"%s\" is too large", text);
        *out = (size_t)bytes;
        return DP_OK;
    }
    return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "\"%s\": unknown unit \"%s\"; use B, KB, MB, GB, TB "
                   "(powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024)", text, end);
}
