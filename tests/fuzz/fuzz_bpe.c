/*
 * tests/fuzz/fuzz_bpe.c - libFuzzer harness for GPT-2's byte-level BPE:
 * its encoder on any bytes, and its loaders on any file.
 *
 * Input: byte 0 picks the mode, the rest is the body.
 *   bit 0 clear: the body is text, encoded with the small BPE of
 *     fuzz_bpe_fixture.h (its tokenizer.json, or with bit 1 its
 *     encoder.json + vocab.bpe). An oracle written here from the Unicode
 *     Standard's table 3-7 says whether the body is UTF-8 and where the
 *     first bad sequence starts: encoding must fail exactly then, with
 *     DP_ERR_FORMAT, that byte offset in the message, and dp_utf8_check
 *     agreeing. Encoded text must decode back to its bytes (with special
 *     tokens recognised or not), ids in range, no more ids than bytes; a
 *     buffer one short is refused with the count; and encoding the two
 *     sides of dp_tokenizer_cut_point's cut gives the whole's ids.
 *   bit 0 set: the body is a tokenizer.json (bit 1 clear) or a vocab.bpe
 *     for the fixture's encoder.json (bit 1 set). A refusal must leave no
 *     handle and a message naming the file; an accepted tokenizer must
 *     give every id at least one byte, have 256 or more ids, and encode
 *     and decode a fixed text and the body (when UTF-8) exactly.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/tokenizer.h"
#include "fuzz_bpe_fixture.h"
#include "fuzz_common.h"

/* The oracle: the offset of the first ill-formed sequence of s[0..n), or n. */
static size_t utf8_bad(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t len;
        uint8_t lo = 0x80, hi = 0xbf;
        if (c <= 0x7f) len = 1;
        else if (c >= 0xc2 && c <= 0xdf) len = 2;
        else if (c == 0xe0) len = 3, lo = 0xa0;
        else if (c == 0xed) len = 3, hi = 0x9f;
        else if (c >= 0xe1 && c <= 0xef) len = 3;
        else if (c == 0xf0) len = 4, lo = 0x90;
        else if (c == 0xf4) len = 4, hi = 0x8f;
        else if (c >= 0xf1 && c <= 0xf3) len = 4;
        else return i;
        if (len > n - i) return i;
        for (size_t k = 1; k < len; k++) {
            uint8_t a = k == 1 ? lo : 0x80, b = k == 1 ? hi : 0xbf;
            if (s[i + k] < a || s[i + k] > b) return i;
        }
        i += len;
    }
    return n;
}

static dp_tokenizer *fixture[2]; /* tokenizer.json; encoder.json + vocab.bpe */
static char enc_path[512];

static void write_text(const char *path, const char *text, size_t n)
{
    fuzz_write_file(path, text, n);
}

static void load_fixtures(void)
{
    if (fixture[0]) return;
    static char buf[1 << 16];
    char path[512], bpe[512];
    snprintf(path, sizeof path, "%s/tokenizer.json", fuzz_dir());
    write_text(path, buf, fuzz_bpe_tokenizer_json(buf, sizeof buf, 0));
    FUZZ_CHECK(dp_tokenizer_load_bpe(path, &fixture[0]) == DP_OK, "the fixture tokenizer.json");
    snprintf(enc_path, sizeof enc_path, "%s/encoder.json", fuzz_dir());
    write_text(enc_path, buf, fuzz_bpe_encoder_json(buf, sizeof buf));
    snprintf(bpe, sizeof bpe, "%s/fixture.bpe", fuzz_dir());
    write_text(bpe, buf, fuzz_bpe_vocab_bpe(buf, sizeof buf));
    FUZZ_CHECK(dp_tokenizer_load_bpe_openai(enc_path, bpe, &fixture[1]) == DP_OK,
               "the fixture encoder.json");
    FUZZ_CHECK(dp_tokenizer_vocab_size(fixture[0]) == FUZZ_BPE_V &&
                   dp_tokenizer_vocab_size(fixture[1]) == FUZZ_BPE_V - 1 &&
                   dp_tokenizer_eot_id(fixture[0]) == FUZZ_BPE_EOT &&
                   dp_tokenizer_eot_id(fixture[1]) == FUZZ_BPE_EOT,
               "the fixtures' sizes");
}

/* Encodes text[0..n) (valid UTF-8); returns the ids (malloc'd), *m of them. */
static int32_t *encode_ok(const dp_tokenizer *t, const char *text, size_t n, int ordinary,
                          size_t *m)
{
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    FUZZ_CHECK(ids, "out of memory");
    dp_status st = ordinary ? dp_tokenizer_encode_ordinary(t, text, n, ids, n, m)
                            : dp_tokenizer_encode(t, text, n, ids, n, m, NULL);
    FUZZ_CHECK(st == DP_OK, "encoding %zu bytes of UTF-8: status %d", n, (int)st);
    FUZZ_CHECK(*m <= n, "%zu ids for %zu bytes", *m, n);
    size_t V = dp_tokenizer_vocab_size(t);
    for (size_t i = 0; i < *m; i++)
        FUZZ_CHECK(ids[i] >= 0 && (size_t)ids[i] < V, "id %d at %zu", (int)ids[i], i);
    char *back = NULL;
    size_t blen = 0;
    FUZZ_CHECK(dp_tokenizer_decode(t, ids, *m, &back, &blen) == DP_OK, "decode");
    FUZZ_CHECK(blen == n && memcmp(back, text, n) == 0 && back[n] == '\0',
               "decode(encode(x)) != x (%zu bytes, %zu back)", n, blen);
    free(back);
    return ids;
}

static void check_text(const dp_tokenizer *t, const char *text, size_t n)
{
    size_t bad = utf8_bad((const uint8_t *)text, n), off = 99;
    dp_status st = dp_utf8_check(text, n, &off);
    FUZZ_CHECK(off == bad && (st == DP_OK) == (bad == n), "dp_utf8_check: offset %zu, oracle %zu",
               off, bad);
    if (bad < n) {
        int32_t ids[8];
        size_t m = 99;
        char want[64];
        snprintf(want, sizeof want, "byte offset %zu:", bad);
        st = dp_tokenizer_encode(t, text, n, ids, 8, &m, NULL);
        FUZZ_CHECK(st == DP_ERR_FORMAT && m == 0, "invalid UTF-8 at %zu: status %d", bad, (int)st);
        FUZZ_CHECK(strstr(dp_last_error(), want), "no \"%s\" in: %s", want, dp_last_error());
        return;
    }
    for (int ordinary = 0; ordinary < 2; ordinary++) {
        size_t m;
        int32_t *ids = encode_ok(t, text, n, ordinary, &m);
        if (m > 0) {
            size_t need = 0;
            st = ordinary ? dp_tokenizer_encode_ordinary(t, text, n, ids, m - 1, &need)
                          : dp_tokenizer_encode(t, text, n, ids, m - 1, &need, NULL);
            FUZZ_CHECK(st == DP_ERR_INVALID_ARGUMENT && need == m, "cap %zu: status %d need %zu",
                       m - 1, (int)st, need);
            free(ids);
            ids = encode_ok(t, text, n, ordinary, &m);
        }
        size_t cut = dp_tokenizer_cut_point(t, text, n);
        FUZZ_CHECK(cut <= n, "cut %zu of %zu", cut, n);
        if (cut > 0) {
            size_t a, b;
            int32_t *ia = encode_ok(t, text, cut, ordinary, &a);
            int32_t *ib = encode_ok(t, text + cut, n - cut, ordinary, &b);
            FUZZ_CHECK(a + b == m && memcmp(ia, ids, a * sizeof *ids) == 0 &&
                           memcmp(ib, ids + a, b * sizeof *ids) == 0,
                       "the pieces cut at %zu give other ids", cut);
            free(ia);
            free(ib);
        }
        free(ids);
    }
}

static void check_file(const uint8_t *body, size_t n, int openai)
{
    // Not named vocab.bpe: a tokenizer.json without "model" is taken for an
    // encoder.json, and must not find an earlier input's merges beside it.
    char path[512];
    snprintf(path, sizeof path, "%s/%s", fuzz_dir(), openai ? "merges.bpe" : "tokenizer.json");
    fuzz_write_file(path, body, n);
    dp_clear_error();
    dp_tokenizer *t = (dp_tokenizer *)1;
    dp_status st = openai ? dp_tokenizer_load_bpe_openai(enc_path, path, &t)
                          : dp_tokenizer_load_bpe(path, &t);
    if (st != DP_OK) {
        FUZZ_CHECK(t == NULL, "handle left after an error");
        FUZZ_CHECK(st == DP_ERR_FORMAT || st == DP_ERR_UNSUPPORTED ||
                       st == DP_ERR_OUT_OF_MEMORY,
                   "status %d", (int)st);
        FUZZ_CHECK_MESSAGE(st);
        FUZZ_CHECK(strstr(dp_last_error(), openai ? "merges.bpe" : "tokenizer.json") ||
                       (openai && strstr(dp_last_error(), "encoder.json")),
                   "the message does not name the file: %s", dp_last_error());
        return;
    }
    size_t V = dp_tokenizer_vocab_size(t);
    FUZZ_CHECK(V >= 256 && V <= (size_t)INT32_MAX, "vocab %zu", V);
    FUZZ_CHECK(dp_tokenizer_kind_of(t) == DP_TOKENIZER_BPE, "kind");
    int32_t eot = dp_tokenizer_eot_id(t);
    FUZZ_CHECK(eot >= -1 && eot < (int32_t)V, "eot %d", (int)eot);
    for (size_t i = 0; i < V; i++) {
        const char *b;
        size_t l;
        FUZZ_CHECK(dp_tokenizer_token(t, (int32_t)i, &b, &l) == DP_OK && l > 0, "token %zu", i);
    }
    static const char text[] = "The cat's in the hat.\n\n  caf\xc3\xa9 <|endoftext|> 123 \xf0\x9f\x99\x82";
    check_text(t, text, sizeof text - 1);
    if (utf8_bad(body, n) == n) check_text(t, (const char *)body, n);
    dp_tokenizer_destroy(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) return 0;
    load_fixtures();
    uint8_t mode = data[0];
    const uint8_t *body = data + 1;
    size_t n = size - 1;
    if (mode & 1) {
        check_file(body, n, (mode >> 1) & 1);
        return 0;
    }
    // A private copy: the encoder must not read past n.
    char *text = malloc(n ? n : 1);
    FUZZ_CHECK(text, "out of memory");
    memcpy(text, body, n);
    check_text(fixture[(mode >> 1) & 1], text, n);
    free(text);
    return 0;
}
