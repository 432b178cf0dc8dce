/*
 * dp_parse_bytes: the units (powers of 1000 and 1024, M and G as 1024's),
 * case, white space around the number and the unit, fractions, and the
 * refusals (not a number, negative, unknown unit, past size_t, NULL).
 */
#include <stdint.h>
#include <string.h>

#include "dp/units.h"
#include "dp_test.h"

static size_t bytes_of(const char *text)
{
    size_t n = 0;
    dp_assert_ok(dp_parse_bytes(text, &n));
    return n;
}

static void refused(const char *text, const char *needle)
{
    size_t n = 7;
    cr_assert_eq(dp_parse_bytes(text, &n), DP_ERR_INVALID_ARGUMENT, "\"%s\" was taken", text);
    cr_assert_eq(n, 7, "\"%s\": the output was written", text);
    cr_assert(strstr(dp_last_error(), needle), "\"%s\": \"%s\" lacks \"%s\"", text,
              dp_last_error(), needle);
}

Test(units, sizes_in_every_unit)
{
    cr_assert_eq(bytes_of("4096"), 4096);
    cr_assert_eq(bytes_of("4096B"), 4096);
    cr_assert_eq(bytes_of("12KB"), 12000);
    cr_assert_eq(bytes_of("12KiB"), 12 * 1024);
    cr_assert_eq(bytes_of("12K"), 12 * 1024);
    cr_assert_eq(bytes_of("3MB"), 3000000);
    cr_assert_eq(bytes_of("3M"), 3 << 20);
    cr_assert_eq(bytes_of("2GiB"), (size_t)2 << 30);
    cr_assert_eq(bytes_of("2g"), (size_t)2 << 30);
    cr_assert_eq(bytes_of("2gb"), 2000000000);
    cr_assert_eq(bytes_of("1TB"), (size_t)1000000000000ull);
    cr_assert_eq(bytes_of("1.5KiB"), 1536);
    cr_assert_eq(bytes_of("0.5B"), 0); /* fractions round down */
    cr_assert_eq(bytes_of("0"), 0);
}

/* White space is ignored before and after both the number and the unit,
 * alike (it used to be refused after the unit alone). */
Test(units, white_space_around_number_and_unit)
{
    cr_assert_eq(bytes_of(" 2GiB"), (size_t)2 << 30);
    cr_assert_eq(bytes_of("2 GiB"), (size_t)2 << 30);
    cr_assert_eq(bytes_of("2GiB "), (size_t)2 << 30);
    cr_assert_eq(bytes_of("\t2 GiB\n"), (size_t)2 << 30);
    cr_assert_eq(bytes_of("4096 "), 4096);
}

Test(units, bad_sizes_are_refused_with_the_text)
{
    refused("", "is not a size");
    refused("GiB", "is not a size");
    refused("-1", "is not a size");
    refused("-0", "is not a size");
    refused("12XB", "unknown unit \"XB\"");
    refused("12 G iB", "unknown unit");
    refused("nan", "is not a size");
    refused("inf", "is not a size");
    refused("1e30", "without an exponent");
    refused("1.5e3", "without an exponent");
    refused("0x10", "not hex");
    refused("0x1p4", "not hex");
    refused("+5", "is not a size");
    refused(".", "is not a size");
    refused("18446744073709551616", "too large");
    refused("16777216TiB", "too large");
    refused("12Q", "or K, M, G, T");
    size_t n;
    cr_assert_eq(dp_parse_bytes(NULL, &n), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_parse_bytes("1", NULL), DP_ERR_INVALID_ARGUMENT);
}

/* Sizes are read as decimal digits, exactly: a double would round past
 * 2^53 and miss SIZE_MAX, and decimal fractions like 0.3 are inexact. */
Test(units, sizes_are_exact)
{
    cr_assert_eq(bytes_of("9007199254740993"), (size_t)9007199254740993ull);
    if (SIZE_MAX == UINT64_MAX) cr_assert_eq(bytes_of("18446744073709551615"), SIZE_MAX);
    cr_assert_eq(bytes_of("0.3KB"), 300);
    cr_assert_eq(bytes_of("1.1MB"), 1100000);
    cr_assert_eq(bytes_of("0.001KiB"), 1); /* 1.024 rounds down */
    cr_assert_eq(bytes_of(".5KiB"), 512);
    cr_assert_eq(bytes_of("5."), 5);
    cr_assert_eq(bytes_of("16777215.5TiB"), (size_t)16777215 * 1099511627776ull + 549755813888ull);
}
