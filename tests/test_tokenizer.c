/*
 * Tokenizers: char and word vocabularies (exact ids), encode/decode round
 * trips, <unk>, the JSON form and its validation, and bad inputs.
 */
#include <string.h>

#include "dp/tokenizer.h"
#include "dp_test.h"

// Asserts that id maps to exactly the bytes s.
static void assert_token(const dp_tokenizer *t, int32_t id, const char *s, size_t n)
{
    const char *b;
    size_t l;
    dp_assert_ok(dp_tokenizer_token(t, id, &b, &l));
    cr_assert(l == n && memcmp(b, s, n) == 0, "token %d is '%.*s', expected '%.*s'", (int)id,
              (int)l, b, (int)n, s);
}

// decode(encode(text)) == text, with no unknowns; returns the ids (caller frees).
static int32_t *round_trip(const dp_tokenizer *t, const char *text, size_t len, size_t *n)
{
    int32_t *ids = malloc((len ? len : 1) * sizeof *ids);
    size_t unk = 99;
    dp_assert_ok(dp_tokenizer_encode(t, text, len, ids, len, n, &unk));
    cr_assert_eq(unk, 0);
    char *back;
    size_t blen;
    dp_assert_ok(dp_tokenizer_decode(t, ids, *n, &back, &blen));
    cr_assert_eq(blen, len);
    cr_assert_eq(memcmp(back, text, len), 0, "decode(encode(x)) != x");
    cr_assert_eq(back[blen], '\0');
    free(back);
    return ids;
}

// ----------------------------------------------------------------------------
// char

Test(tokenizer, char_vocabulary_is_sorted_distinct_bytes)
{
    const char *text = "hello world\n";
    dp_tokenizer *t;
    dp_assert_ok(dp_tokenizer_create_char(text, strlen(text), &t));
    cr_assert_eq(dp_tokenizer_kind_of(t), DP_TOKENIZER_CHAR);
    cr_assert_eq(dp_tokenizer_unk_id(t), -1);
    const char *vocab = "\n dehlorw";
    cr_assert_eq(dp_tokenizer_vocab_size(t), strlen(vocab));
    for (size_t i = 0; i < strlen(vocab); i++) assert_token(t, (int32_t)i, vocab + i, 1);

    size_t n;
    int32_t *ids = round_trip(t, text, strlen(text), &n);
    int32_t want[12] = {4, 3, 5, 5, 6, 1, 8, 6, 7, 5, 2, 0};
    cr_assert_eq(n, 12);
    cr_assert_eq(memcmp(ids, want, sizeof want), 0);
    free(ids);
    dp_tokenizer_destroy(t);
}

Test(tokenizer, char_handles_every_byte)
{
    char all[512];
    for (int i = 0; i < 512; i++) all[i] = (char)(255 - i % 256); // NUL included
    dp_tokenizer *t;
    dp_assert_ok(dp_tokenizer_create_char(all, sizeof all, &t));
    cr_assert_eq(dp_tokenizer_vocab_size(t), 256);
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        assert_token(t, b, &c, 1);
    }
    size_t n;
    free(round_trip(t, all, sizeof all, &n));
    cr_assert_eq(n, sizeof all);
    dp_tokenizer_destroy(t);
}

Test(tokenizer, char_errors)
{
    dp_tokenizer *t = (dp_tokenizer *)1;
    cr_assert_eq(dp_tokenizer_create_char("", 0, &t), DP_ERR_INVALID_ARGUMENT);
    cr_assert_null(t);
    cr_assert(strstr(dp_last_error(), "empty"), "%s", dp_last_error());
    cr_assert_eq(dp_tokenizer_create_char(NULL, 3, &t), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_tokenizer_create_char("a", 1, NULL), DP_ERR_INVALID_ARGUMENT);

    dp_assert_ok(dp_tokenizer_create_char("abc", 3, &t));
    int32_t ids[8];
    size_t n;
    // A byte the corpus never had.
    cr_assert_eq(dp_tokenizer_encode(t, "abz", 3, ids, 8, &n, NULL), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "0x7a") && strstr(dp_last_error(), "offset 2"), "%s",
              dp_last_error());
    // Too small a buffer reports the size needed.
    cr_assert_eq(dp_tokenizer_encode(t, "abcabc", 6, ids, 4, &n, NULL), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(n, 6);
    // Ids out of range on decode.
    char *text;
    size_t len;
    int32_t bad[3] = {0, 3, 1};
    cr_assert_eq(dp_tokenizer_decode(t, bad, 3, &text, &len), DP_ERR_INVALID_ARGUMENT);
    cr_assert_null(text);
    cr_assert(strstr(dp_last_error(), "id 3 at position 1"), "%s", dp_last_error());
    bad[1] = -1;
    cr_assert_eq(dp_tokenizer_decode(t, bad, 3, &text, &len), DP_ERR_INVALID_ARGUMENT);
    const char *b;
    cr_assert_eq(dp_tokenizer_token(t, 3, &b, &len), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_tokenizer_token(t, -1, &b, &len), DP_ERR_INVALID_ARGUMENT);
    // Empty input is fine both ways.
    dp_assert_ok(dp_tokenizer_encode(t, "", 0, ids, 0, &n, NULL));
    cr_assert_eq(n, 0);
    dp_assert_ok(dp_tokenizer_decode(t, ids, 0, &text, &len));
    cr_assert(len == 0 && text && text[0] == '\0');
    free(text);
    dp_tokenizer_destroy(t);
    dp_tokenizer_destroy(NULL);
}

// ----------------------------------------------------------------------------
// word

Test(tokenizer, word_vocabulary_order)
{
    // words: the x2, cat x2, The, and, hat; separators ' ', '.', '!'.
    const char *text = "the cat and the hat. The cat!";
    dp_tokenizer *t;
    dp_assert_ok(dp_tokenizer_create_word(text, strlen(text), 100, &t));
    cr_assert_eq(dp_tokenizer_kind_of(t), DP_TOKENIZER_WORD);
    cr_assert_eq(dp_tokenizer_unk_id(t), 0);
    // <unk>; separators ascending; words by count desc, then bytes asc ('T' < 'a' < 'h').
    const char *want[] = {"<unk>", " ", "!", ".", "cat", "the", "The", "and", "hat"};
    cr_assert_eq(dp_tokenizer_vocab_size(t), 9);
    for (int i = 0; i < 9; i++) assert_token(t, i, want[i], strlen(want[i]));
    size_t n;
    int32_t *ids = round_trip(t, text, strlen(text), &n);
    int32_t wid[] = {5, 1, 4, 1, 7, 1, 5, 1, 8, 3, 1, 6, 1, 4, 2};
    cr_assert_eq(n, sizeof wid / sizeof wid[0]);
    cr_assert_eq(memcmp(ids, wid, sizeof wid), 0);
    free(ids);
    dp_tokenizer_destroy(t);
}

Test(tokenizer, word_tie_break_and_word_characters)
{
    // "ab" and "a" both twice: shorter first; apostrophes and digits join words.
    const char *text = "ab a ab a don't 42x rock'n'roll";
    dp_tokenizer *t;
    dp_assert_ok(dp_tokenizer_create_word(text, strlen(text), 100, &t));
    assert_token(t, 2, "a", 1);
    assert_token(t, 3, "ab", 2);
    assert_token(t, 4, "42x", 3);
    assert_token(t, 5, "don't", 5);
    assert_token(t, 6, "rock'n'roll", 11);
    cr_assert_eq(dp_tokenizer_vocab_size(t), 7);
    size_t n;
    free(round_trip(t, text, strlen(text), &n));
    cr_assert_eq(n, 13);
    dp_tokenizer_destroy(t);
}

Test(tokenizer, word_unknowns)
{
    const char *text = "the cat and the hat. The cat!";
    dp_tokenizer *t;
    // 1 + 3 separators leaves room for the two most frequent words: cat, the.
    dp_assert_ok(dp_tokenizer_create_word(text, strlen(text), 6, &t));
    cr_assert_eq(dp_tokenizer_vocab_size(t), 6);
    assert_token(t, 4, "cat", 3);
    assert_token(t, 5, "the", 3);
    const char *in = "the dog, the cat";
    int32_t ids[32];
    size_t n, unk;
    dp_assert_ok(dp_tokenizer_encode(t, in, strlen(in), ids, 32, &n, &unk));
    // "dog" and the unseen ',' are unknown.
    int32_t want[] = {5, 1, 0, 0, 1, 5, 1, 4};
    cr_assert_eq(n, 8);
    cr_assert_eq(unk, 2);
    cr_assert_eq(memcmp(ids, want, sizeof want), 0);
    char *back;
    size_t len;
    dp_assert_ok(dp_tokenizer_decode(t, ids, n, &back, &len));
    cr_assert_str_eq(back, "the <unk><unk> the cat");
    free(back);
    // Too small an output buffer: the count needed comes back.
    cr_assert_eq(dp_tokenizer_encode(t, in, strlen(in), ids, 3, &n, NULL),
                 DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(n, 8);
    dp_tokenizer_destroy(t);
}

Test(tokenizer, word_errors)
{
    const char *text = "the cat and the hat. The cat!";
    dp_tokenizer *t = (dp_tokenizer *)1;
    cr_assert_eq(dp_tokenizer_create_word(text, strlen(text), 4, &t), DP_ERR_INVALID_ARGUMENT);
    cr_assert_null(t);
    cr_assert(strstr(dp_last_error(), "at least 5"), "%s", dp_last_error());
    dp_assert_ok(dp_tokenizer_create_word(text, strlen(text), 5, &t)); // one word
    cr_assert_eq(dp_tokenizer_vocab_size(t), 5);
    dp_tokenizer_destroy(t);
    cr_assert_eq(dp_tokenizer_create_word("", 0, 100, &t), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "empty"), "%s", dp_last_error());
    // Punctuation only: <unk> plus the bytes suffice.
    dp_assert_ok(dp_tokenizer_create_word("?!", 2, 3, &t));
    cr_assert_eq(dp_tokenizer_vocab_size(t), 3);
    dp_tokenizer_destroy(t);
    // One word, no separators.
    dp_assert_ok(dp_tokenizer_create_word("word", 4, 2, &t));
    cr_assert_eq(dp_tokenizer_vocab_size(t), 2);
    int32_t id = 7;
    cr_assert_eq(dp_tokenizer_decode(t, &id, 1, &(char *){NULL}, &(size_t){0}),
                 DP_ERR_INVALID_ARGUMENT);
    dp_tokenizer_destroy(t);
}

Test(tokenizer, word_random_text_round_trips)
{
    // Random text over a small word list and separators: everything is in the vocabulary.
    static const char *words[] = {"a", "an", "the", "dog's", "42", "Zebra", "x1y2", "I"};
    static const char seps[] = " \n\t.,;:!?-\"()%\xc3\xa9";
    dp_rng rng;
    dp_rng_seed(&rng, 1234);
    size_t cap = 20000, len = 0;
    char *text = malloc(cap);
    while (len + 16 < cap) {
        const char *w = words[dp_rng_below(&rng, 8)];
        memcpy(text + len, w, strlen(w));
        len += strlen(w);
        size_t k = 1 + dp_rng_below(&rng, 3);
        for (size_t i = 0; i < k; i++) text[len++] = seps[dp_rng_below(&rng, sizeof seps - 1)];
    }
    dp_tokenizer *t, *t2;
    dp_assert_ok(dp_tokenizer_create_word(text, len, 1000, &t));
    cr_assert_eq(dp_tokenizer_vocab_size(t), 1 + (sizeof seps - 1) + 8);
    size_t n;
    free(round_trip(t, text, len, &n));
    // Building twice gives the same tokenizer.
    dp_assert_ok(dp_tokenizer_create_word(text, len, 1000, &t2));
    char *j1, *j2;
    dp_assert_ok(dp_tokenizer_serialize(t, &j1));
    dp_assert_ok(dp_tokenizer_serialize(t2, &j2));
    cr_assert_str_eq(j1, j2);
    free(j1);
    free(j2);
    dp_tokenizer_destroy(t);
    dp_tokenizer_destroy(t2);
    free(text);
}

// ----------------------------------------------------------------------------
// JSON form

static void assert_same_tokenizer(const dp_tokenizer *a, const dp_tokenizer *b)
{
    cr_assert_eq(dp_tokenizer_kind_of(a), dp_tokenizer_kind_of(b));
    cr_assert_eq(dp_tokenizer_vocab_size(a), dp_tokenizer_vocab_size(b));
    for (int32_t i = 0; i < (int32_t)dp_tokenizer_vocab_size(a); i++) {
        const char *x;
        size_t lx;
        dp_assert_ok(dp_tokenizer_token(a, i, &x, &lx));
        assert_token(b, i, x, lx);
    }
}

Test(tokenizer, serialize_parse_round_trip)
{
    const char *text = "Hi, hi! HI\n\xc3\xa9t\xc3\xa9 it's 2 o'clock.";
    for (int kind = 0; kind < 2; kind++) {
        dp_tokenizer *t, *p;
        if (kind == 0) dp_assert_ok(dp_tokenizer_create_char(text, strlen(text), &t));
        else dp_assert_ok(dp_tokenizer_create_word(text, strlen(text), 14, &t));
        char *json, *json2;
        dp_assert_ok(dp_tokenizer_serialize(t, &json));
        for (const char *c = json; *c; c++)
            cr_assert((unsigned char)*c < 128, "serialized form is not ASCII: %s", json);
        dp_assert_ok(dp_tokenizer_parse(json, &p));
        assert_same_tokenizer(t, p);
        dp_assert_ok(dp_tokenizer_serialize(p, &json2));
        cr_assert_str_eq(json, json2);
        // Same ids for the same text.
        int32_t a[64], b[64];
        size_t na, nb, ua, ub;
        dp_assert_ok(dp_tokenizer_encode(t, text, strlen(text), a, 64, &na, &ua));
        dp_assert_ok(dp_tokenizer_encode(p, text, strlen(text), b, 64, &nb, &ub));
        cr_assert(na == nb && ua == ub && memcmp(a, b, na * sizeof *a) == 0);
        free(json);
        free(json2);
        dp_tokenizer_destroy(t);
        dp_tokenizer_destroy(p);
    }
}

Test(tokenizer, serialized_form_is_exact)
{
    dp_tokenizer *t;
    char *json;
    dp_assert_ok(dp_tokenizer_create_char("ba\nb", 4, &t));
    dp_assert_ok(dp_tokenizer_serialize(t, &json));
    cr_assert_str_eq(json, "{\"type\":\"char\",\"version\":1,\"bytes\":[10,97,98]}");
    free(json);
    dp_tokenizer_destroy(t);
    dp_assert_ok(dp_tokenizer_create_word("b a b.", 6, 10, &t));
    dp_assert_ok(dp_tokenizer_serialize(t, &json));
    cr_assert_str_eq(json,
                     "{\"type\":\"word\",\"version\":1,\"bytes\":[32,46],\"words\":[\"b\",\"a\"]}");
    free(json);
    dp_tokenizer_destroy(t);
}

Test(tokenizer, parse_rejects_malformed_input)
{
    static const char *bad[] = {
        "",
        "{",
        "[]",
        "{\"type\":\"char\",\"version\":1,\"bytes\":[10],}",
        "{\"type\":\"bpe\",\"version\":1,\"bytes\":[10]}",
        "{\"version\":1,\"bytes\":[10]}",
        "{\"type\":\"char\",\"version\":2,\"bytes\":[10]}",
        "{\"type\":\"char\",\"bytes\":[10]}",
        "{\"type\":\"char\",\"version\":1}",
        "{\"type\":\"char\",\"version\":1,\"bytes\":[]}",
        "{\"type\":\"char\",\"version\":1,\"bytes\":[32,10]}",
        "{\"type\":\"char\",\"version\":1,\"bytes\":[10,10]}",
        "{\"type\":\"char\",\"version\":1,\"bytes\":[256]}",
        "{\"type\":\"char\",\"version\":1,\"bytes\":[-1]}",
        "{\"type\":\"char\",\"version\":1,\"bytes\":[\"a\"]}",
        "{\"type\":\"char\",\"version\":1,\"bytes\":[1.5]}",
        "{\"type\":\"char\",\"version\":1,\"bytes\":[10],\"words\":[]}",
        "{\"type\":\"char\",\"version\":1,\"bytes\":[10],\"extra\":0}",
        "{\"type\":\"char\",\"type\":\"char\",\"version\":1,\"bytes\":[10]}",
        "{\"type\":\"word\",\"version\":1,\"bytes\":[32]}",
        "{\"type\":\"word\",\"version\":1,\"bytes\":[32,97],\"words\":[]}",
        "{\"type\":\"word\",\"version\":1,\"bytes\":[32],\"words\":[\"\"]}",
        "{\"type\":\"word\",\"version\":1,\"bytes\":[32],\"words\":[\"a b\"]}",
        "{\"type\":\"word\",\"version\":1,\"bytes\":[32],\"words\":[\"\\u00e9\"]}",
        "{\"type\":\"word\",\"version\":1,\"bytes\":[32],\"words\":[\"a\",\"b\",\"a\"]}",
        "{\"type\":\"word\",\"version\":1,\"bytes\":[32],\"words\":[1]}",
        "{\"type\":\"word\",\"version\":1,\"bytes\":[32],\"words\":\"a\"}",
        "{\"type\":\"word\",\"version\":1,\"bytes\":[],\"words\":[]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dp_tokenizer *t = (dp_tokenizer *)1;
        dp_status st = dp_tokenizer_parse(bad[i], &t);
        cr_assert_eq(st, DP_ERR_FORMAT, "input %zu (%s) gave %s", i, bad[i], dp_strerror(st));
        cr_assert_null(t, "input %zu", i);
        cr_assert(strstr(dp_last_error(), "tokenizer JSON"), "input %zu: %s", i, dp_last_error());
    }
    dp_tokenizer *t;
    cr_assert_eq(dp_tokenizer_parse(NULL, &t), DP_ERR_INVALID_ARGUMENT);
    // A valid word tokenizer without separators parses.
    dp_assert_ok(dp_tokenizer_parse("{\"type\":\"word\",\"version\":1,\"bytes\":[],\"words\":[\"x\"]}",
                                    &t));
    cr_assert_eq(dp_tokenizer_vocab_size(t), 2);
    dp_tokenizer_destroy(t);
}

Test(tokenizer, kind_names)
{
    dp_tokenizer_kind k;
    dp_assert_ok(dp_tokenizer_kind_parse("char", &k));
    cr_assert_eq(k, DP_TOKENIZER_CHAR);
    dp_assert_ok(dp_tokenizer_kind_parse("word", &k));
    cr_assert_eq(k, DP_TOKENIZER_WORD);
    cr_assert_eq(dp_tokenizer_kind_parse("bpe", &k), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "'char' or 'word'"), "%s", dp_last_error());
    cr_assert_str_eq(dp_tokenizer_kind_name(DP_TOKENIZER_WORD), "word");
    cr_assert_str_eq(dp_tokenizer_kind_name(DP_TOKENIZER_KIND_COUNT), "invalid tokenizer kind");
}
