/*
 * io/utf8.c - UTF-8 validation for the byte-level BPE (dp_utf8_check):
 * the well-formed byte sequences of the Unicode Standard (chapter 3, table
 * 3-7; RFC 3629), which is also what PCRE2 requires of a subject it is
 * told not to check.
 */
#include <stdint.h>
#include <string.h>

#include "core/error.h"
#include "dp/tokenizer.h"

dp_status dp_utf8_check(const char *text, size_t len, size_t *bad_offset)
{
    if (bad_offset) *bad_offset = len;
    if (!text && len) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "text is NULL");
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < len) {
        if (s[i] < 0x80) {
            // ASCII runs, 8 bytes at a time: most text is mostly ASCII.
            while (len - i >= 8) {
                uint64_t w;
                memcpy(&w, s + i, 8);
                if (w & 0x8080808080808080ULL) break;
                i += 8;
            }
            while (i < len && s[i] < 0x80) i++;
            continue;
        }
        unsigned c = s[i];
        size_t need;               // continuation bytes after the lead byte
        unsigned lo = 0x80, hi = 0xBF; // the second byte's range (table 3-7)
        const char *why = NULL;
        if (c < 0xC0) why = "a continuation byte without a lead byte";
        else if (c < 0xC2) why = "an overlong encoding (lead byte 0xC0 or 0xC1)";
        else if (c < 0xE0) need = 1;
        else if (c < 0xF0) {
            need = 2;
            if (c == 0xE0) lo = 0xA0;      // below: overlong
            else if (c == 0xED) hi = 0x9F; // above: a surrogate, U+D800..U+DFFF
        } else if (c < 0xF5) {
            need = 3;
            if (c == 0xF0) lo = 0x90;      // below: overlong
            else if (c == 0xF4) hi = 0x8F; // above: past U+10FFFF
        } else
            why = "a byte that never occurs in UTF-8 (0xF5..0xFF)";
        if (why) {
            if (bad_offset) *bad_offset = i;
            return DP_FAIL(DP_ERR_FORMAT, "invalid UTF-8 at byte offset %zu: 0x%02X is %s", i, c,
                           why);
        }
        for (size_t k = 1; k <= need; k++) {
            if (i + k >= len) {
                if (bad_offset) *bad_offset = i;
                return DP_FAIL(DP_ERR_FORMAT,
                               "invalid UTF-8 at byte offset %zu: a truncated sequence (lead "
                               "byte 0x%02X needs %zu continuation bytes; the text ends after "
                               "%zu)",
                               i, c, need, k - 1);
            }
            unsigned d = s[i + k];
            unsigned dlo = k == 1 ? lo : 0x80, dhi = k == 1 ? hi : 0xBF;
            if (d < dlo || d > dhi) {
                if (bad_offset) *bad_offset = i;
                if (d < 0x80 || d > 0xBF)
                    return DP_FAIL(DP_ERR_FORMAT,
                                   "invalid UTF-8 at byte offset %zu: a truncated sequence (lead "
                                   "byte 0x%02X needs %zu continuation bytes; byte 0x%02X at "
                                   "offset %zu is not one)",
                                   i, c, need, d, i + k);
                return DP_FAIL(DP_ERR_FORMAT, "invalid UTF-8 at byte offset %zu: 0x%02X 0x%02X "
                               "starts %s",
                               i, c, d,
                               c == 0xED ? "a surrogate (U+D800..U+DFFF)"
                               : c == 0xF4 ? "a code point past U+10FFFF"
                                           : "an overlong encoding");
            }
        }
        i += need + 1;
    }
    return DP_OK;
}
