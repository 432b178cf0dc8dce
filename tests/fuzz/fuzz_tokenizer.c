/*
 * tests/fuzz/fuzz_tokenizer.c - libFuzzer harness for loading a serialized
 * tokenizer (dp_tokenizer_parse, the form stored in checkpoint metadata).
 *
 * The input, with a NUL appended, is the JSON text. Whatever parses must:
 *   - serialize to a text that parses to a tokenizer serializing to the
 *     same text (the serialized form is canonical);
 *   - give every id's bytes through dp_tokenizer_token, and reject ids
 *     outside [0, V);
 *   - encode the decoded text of all ids back to text that decodes to the
 *     same bytes (char: exactly the same ids), and encode the raw input
 *     with the promised capacity rule (cap >= len suffices).
 * A rejected text must leave an error message and no handle.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/tokenizer.h"
#include "fuzz_common.h"

static void check_encode_decode(const dp_tokenizer *tok, const char *text, size_t len)
{
    int32_t *ids = malloc((len ? len : 1) * sizeof *ids);
    FUZZ_CHECK(ids, "out of memory");
    size_t n = 0, unk = 0;
    dp_status st = dp_tokenizer_encode(tok, text, len, ids, len, &n, &unk);
    if (dp_tokenizer_kind_of(tok) == DP_TOKENIZER_WORD)
        FUZZ_CHECK(st == DP_OK && n <= len && unk <= n, "word encode of %zu bytes: st %d n %zu",
                   len, (int)st, n);
    if (st == DP_OK) {
        FUZZ_CHECK(n <= len, "%zu ids for %zu bytes", n, len);
        for (size_t i = 0; i < n; i++)
            FUZZ_CHECK(ids[i] >= 0 && (size_t)ids[i] < dp_tokenizer_vocab_size(tok),
                       "id %d at %zu out of range", (int)ids[i], i);
        char *back = NULL;
        size_t blen = 0;
        FUZZ_CHECK(dp_tokenizer_decode(tok, ids, n, &back, &blen) == DP_OK, "decode");
        FUZZ_CHECK(back[blen] == '\0', "decode not NUL-terminated");
        if (unk == 0)
            FUZZ_CHECK(blen == len && memcmp(back, text, len) == 0,
                       "decode(encode(x)) != x without unknowns");
        free(back);
        if (n > 0) {
            // Too small a buffer is refused with the size needed.
            size_t need = 0;
            st = dp_tokenizer_encode(tok, text, len, ids, n - 1, &need, NULL);
            FUZZ_CHECK(st == DP_ERR_INVALID_ARGUMENT && need >= n, "cap n-1 accepted");
        }
    } else {
        FUZZ_CHECK(st == DP_ERR_INVALID_ARGUMENT, "char encode status %d", (int)st);
        FUZZ_CHECK_MESSAGE(st);
    }
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *json = malloc(size + 1);
    FUZZ_CHECK(json, "out of memory");
    memcpy(json, data, size);
    json[size] = '\0';
    dp_clear_error();
    dp_tokenizer *tok = (dp_tokenizer *)1;
    dp_status st = dp_tokenizer_parse(json, &tok);
    if (st != DP_OK) {
        FUZZ_CHECK(tok == NULL, "handle left after an error");
        FUZZ_CHECK(st == DP_ERR_FORMAT || st == DP_ERR_OUT_OF_MEMORY, "status %d", (int)st);
        FUZZ_CHECK_MESSAGE(st);
        free(json);
        return 0;
    }
    size_t V = dp_tokenizer_vocab_size(tok);
    dp_tokenizer_kind kind = dp_tokenizer_kind_of(tok);
    FUZZ_CHECK(V > 0 && V <= (size_t)INT32_MAX, "vocab %zu", V);
    FUZZ_CHECK(kind == DP_TOKENIZER_CHAR || kind == DP_TOKENIZER_WORD, "kind %d", (int)kind);
    FUZZ_CHECK(kind == DP_TOKENIZER_CHAR ? V <= 256 : V >= 1, "vocab %zu", V);
    FUZZ_CHECK(dp_tokenizer_unk_id(tok) == (kind == DP_TOKENIZER_WORD ? 0 : -1), "unk id");

    // Canonical form: serialize -> parse -> serialize is a fixed point.
    char *s1 = NULL, *s2 = NULL;
    FUZZ_CHECK(dp_tokenizer_serialize(tok, &s1) == DP_OK, "serialize");
    dp_tokenizer *t2 = NULL;
    FUZZ_CHECK(dp_tokenizer_parse(s1, &t2) == DP_OK, "reparsing the serialized form: %s", s1);
    FUZZ_CHECK(dp_tokenizer_serialize(t2, &s2) == DP_OK, "serialize again");
    FUZZ_CHECK(strcmp(s1, s2) == 0, "serialized forms differ:\n%s\n%s", s1, s2);
    FUZZ_CHECK(dp_tokenizer_vocab_size(t2) == V && dp_tokenizer_kind_of(t2) == kind,
               "reparsed tokenizer differs");

    // Every id has bytes (the same in the copy); ids outside [0, V) are refused.
    int32_t *all = malloc(V * sizeof *all);
    FUZZ_CHECK(all, "out of memory");
    for (size_t i = 0; i < V; i++) {
        const char *b = NULL, *b2 = NULL;
        size_t l = 0, l2 = 0;
        FUZZ_CHECK(dp_tokenizer_token(tok, (int32_t)i, &b, &l) == DP_OK && l > 0, "token %zu", i);
        FUZZ_CHECK(dp_tokenizer_token(t2, (int32_t)i, &b2, &l2) == DP_OK && l == l2 &&
                       memcmp(b, b2, l) == 0,
                   "token %zu differs after the round trip", i);
        all[i] = (int32_t)i;
    }
    const char *b;
    size_t l;
    FUZZ_CHECK(dp_tokenizer_token(tok, -1, &b, &l) == DP_ERR_INVALID_ARGUMENT, "id -1");
    FUZZ_CHECK(dp_tokenizer_token(tok, (int32_t)V, &b, &l) == DP_ERR_INVALID_ARGUMENT, "id V");

    char *text = NULL;
    size_t tlen = 0;
    FUZZ_CHECK(dp_tokenizer_decode(tok, all, V, &text, &tlen) == DP_OK, "decode all ids");
    if (kind == DP_TOKENIZER_CHAR) {
        // Every byte of the vocabulary encodes to its id.
        int32_t *ids = malloc(V * sizeof *ids);
        size_t n = 0;
        FUZZ_CHECK(ids && dp_tokenizer_encode(tok, text, tlen, ids, V, &n, NULL) == DP_OK &&
                       n == V && memcmp(ids, all, V * sizeof *ids) == 0,
                   "char ids do not round trip");
        free(ids);
    }
    check_encode_decode(tok, text, tlen);
    check_encode_decode(tok, (const char *)data, size);
    int32_t bad = (int32_t)V;
    char *t = NULL;
    FUZZ_CHECK(dp_tokenizer_decode(tok, &bad, 1, &t, &l) == DP_ERR_INVALID_ARGUMENT && !t,
               "decode of id V accepted");

    free(text);
    free(all);
    free(s1);
    free(s2);
    dp_tokenizer_destroy(t2);
    dp_tokenizer_destroy(tok);
    free(json);
    return 0;
}
