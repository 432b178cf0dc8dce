/*
 * GPT-2's byte-level BPE (dp_tokenizer_load_bpe) against Hugging Face's
 * `tokenizers`, on the committed fixture of tests/data/bpe/ (a 657-id BPE
 * trained by tests/gen_bpe_reference.py, and 81 strings it encoded):
 *  - tokenizer.json (merges as pairs, and as "a b" strings, rewritten
 *    here), OpenAI's encoder.json + vocab.bpe, and a directory all load,
 *    with V = 657 and <|endoftext|> = 0;
 *  - every reference string encodes to the reference ids in each format,
 *    and decodes back to its bytes; a too-small buffer gets the count;
 *  - special tokens: split out, or encoded as text (encode_ordinary);
 *    ignore_merges; a tokenizer without <|endoftext|>;
 *  - cut points: encoding in pieces cut there gives the whole's ids;
 *  - invalid UTF-8 refused with its byte offset (stray continuation,
 *    truncated, overlong, surrogate, past U+10FFFF, 0xFF);
 *  - malformed and unsupported files refused with messages naming them;
 *  - two threads encoding with one tokenizer get the same ids.
 * Every file besides the fixture is written here, in a temp dir.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dp_test.h"
#include "dp_test_bpe.h"
#include "dp_test_fs.h"

static char tmpdir[64];

static void setup(void)
{
    strcpy(tmpdir, "/tmp/dp_test_bpe_XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
}

static void teardown(void) { dp_test_remove_tree(tmpdir); }

TestSuite(bpe, .init = setup, .fini = teardown, .timeout = 30);

static const char *in_tmp(const char *name) { return dp_test_join(tmpdir, name); }

static dp_tokenizer *load(const char *path)
{
    dp_tokenizer *t = NULL;
    dp_assert_ok(dp_tokenizer_load_bpe(path, &t));
    cr_assert_not_null(t);
    return t;
}

/* The fixture's tokenizer.json as JSON, to derive variants from. */
static json_t *fixture_json(void)
{
    json_error_t e;
    json_t *j = json_load_file(bpe_data("tokenizer.json"), 0, &e);
    cr_assert_not_null(j, "%s", e.text);
    return j;
}

static const char *save_json(json_t *j, const char *name)
{
    const char *p = in_tmp(name);
    cr_assert_eq(json_dump_file(j, p, JSON_COMPACT), 0);
    json_decref(j);
    return p;
}

static json_t *model_of(json_t *j) { return json_object_get(j, "model"); }

/* The merges rewritten as "a b" strings: the older tokenizer.json form. */
static const char *string_merges_file(void)
{
    json_t *j = fixture_json();
    json_t *m = json_object_get(model_of(j), "merges"), *s = json_array();
    size_t i;
    json_t *pair;
    json_array_foreach(m, i, pair)
    {
        char buf[256];
        snprintf(buf, sizeof buf, "%s %s", json_string_value(json_array_get(pair, 0)),
                 json_string_value(json_array_get(pair, 1)));
        json_array_append_new(s, json_string(buf));
    }
    json_object_set_new(model_of(j), "merges", s);
    return save_json(j, "string_merges.json");
}

/* Asserts that t encodes every reference string to its ids and decodes
 * them back to its bytes. */
static void check_references(const dp_tokenizer *t, const char *what)
{
    json_t *root;
    size_t count;
    bpe_ref *r = dp_test_bpe_refs(&count, &root);
    for (size_t i = 0; i < count; i++) {
        size_t n;
        int32_t *ids = bpe_encode_all(t, r[i].text, r[i].len, 0, &n);
        size_t bad = 0;
        while (bad < n && bad < r[i].n && ids[bad] == r[i].ids[bad]) bad++;
        cr_assert(n == r[i].n && bad == n,
                  "%s: reference %zu (\"%.40s\"): %zu ids, expected %zu; first difference at "
                  "%zu: %d, expected %d",
                  what, i, r[i].text, n, r[i].n, bad, bad < n ? (int)ids[bad] : -1,
                  bad < r[i].n ? (int)r[i].ids[bad] : -1);
        char *back;
        size_t blen;
        dp_assert_ok(dp_tokenizer_decode(t, ids, n, &back, &blen));
        cr_assert(blen == r[i].len && memcmp(back, r[i].text, blen) == 0,
                  "%s: reference %zu does not decode to its text", what, i);
        cr_assert_eq(back[blen], '\0');
        free(back);
        free(ids);
    }
    dp_test_bpe_refs_free(r, count, root);
}

// --- loading and the reference ids ----------------------------------------------------

Test(bpe, every_format_gives_the_reference_ids)
{
    const char *paths[] = {bpe_data("tokenizer.json"), string_merges_file(),
                           bpe_data("encoder.json"), bpe_data("")};
    const char *what[] = {"tokenizer.json (pair merges)", "tokenizer.json (string merges)",
                          "encoder.json (vocab.bpe beside)", "the fixture directory"};
    for (size_t f = 0; f < 5; f++) {
        dp_tokenizer *t = NULL;
        if (f < 4) {
            char p[4096];
            snprintf(p, sizeof p, "%s", paths[f]);
            t = load(p);
        } else {
            char e[4096], v[4096];
            snprintf(e, sizeof e, "%s", bpe_data("encoder.json"));
            snprintf(v, sizeof v, "%s", bpe_data("vocab.bpe"));
            dp_assert_ok(dp_tokenizer_load_bpe_openai(e, v, &t));
        }
        const char *w = f < 4 ? what[f] : "encoder.json + vocab.bpe";
        cr_assert_eq(dp_tokenizer_kind_of(t), DP_TOKENIZER_BPE, "%s", w);
        cr_assert_eq(dp_tokenizer_vocab_size(t), BPE_V, "%s", w);
        cr_assert_eq(dp_tokenizer_eot_id(t), BPE_EOT, "%s", w);
        cr_assert_eq(dp_tokenizer_unk_id(t), -1, "%s", w);
        check_references(t, w);
        dp_tokenizer_destroy(t);
    }
    cr_assert_str_eq(dp_tokenizer_kind_name(DP_TOKENIZER_BPE), "bpe");
}

Test(bpe, token_bytes_and_decode)
{
    dp_tokenizer *t = load(bpe_data("tokenizer.json"));
    const char *b;
    size_t l;
    dp_assert_ok(dp_tokenizer_token(t, BPE_EOT, &b, &l));
    cr_assert(l == 13 && memcmp(b, "<|endoftext|>", 13) == 0);
    // Each byte's own token is that byte, through the byte alphabet (0x20 is 'Ġ').
    for (int c = 0; c < 256; c++) {
        char s[1] = {(char)c};
        int32_t id;
        size_t n = 0;
        if (c < 0x80) {
            dp_assert_ok(dp_tokenizer_encode(t, s, 1, &id, 1, &n, NULL));
            cr_assert_eq(n, 1);
            dp_assert_ok(dp_tokenizer_token(t, id, &b, &l));
            cr_assert(l == 1 && (unsigned char)b[0] == c, "byte 0x%02x", c);
        }
    }
    int32_t all[BPE_V];
    size_t total = 0;
    for (int32_t i = 0; i < BPE_V; i++) {
        all[i] = i;
        dp_assert_ok(dp_tokenizer_token(t, i, &b, &l));
        cr_assert_gt(l, 0);
        total += l;
    }
    char *text;
    size_t len;
    dp_assert_ok(dp_tokenizer_decode(t, all, BPE_V, &text, &len));
    cr_assert_eq(len, total);
    free(text);
    cr_assert_eq(dp_tokenizer_token(t, BPE_V, &b, &l), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_tokenizer_token(t, -1, &b, &l), DP_ERR_INVALID_ARGUMENT);
    int32_t bad = BPE_V;
    cr_assert_eq(dp_tokenizer_decode(t, &bad, 1, &text, &len), DP_ERR_INVALID_ARGUMENT);
    char *json = NULL;
    cr_assert_eq(dp_tokenizer_serialize(t, &json), DP_ERR_UNSUPPORTED);
    cr_assert(strstr(dp_last_error(), "tokenizer.json"), "%s", dp_last_error());
    dp_tokenizer_kind k;
    cr_assert_eq(dp_tokenizer_kind_parse("bpe", &k), DP_ERR_INVALID_ARGUMENT);
    dp_tokenizer_destroy(t);
}

Test(bpe, small_buffer_gets_the_count)
{
    dp_tokenizer *t = load(bpe_data("tokenizer.json"));
    const char *s = "Hello, world! Hello<|endoftext|>again";
    size_t n_all;
    int32_t *all = bpe_encode_all(t, s, strlen(s), 0, &n_all);
    int32_t ids[4];
    size_t n = 0;
    cr_assert_eq(dp_tokenizer_encode(t, s, strlen(s), ids, 4, &n, NULL), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(n, n_all);
    cr_assert_eq(memcmp(ids, all, sizeof ids), 0, "the first cap ids are written");
    cr_assert_eq(dp_tokenizer_encode(t, s, strlen(s), NULL, 0, &n, NULL), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(n, n_all);
    cr_assert_eq(dp_tokenizer_encode(t, "", 0, NULL, 0, &n, NULL), DP_OK);
    cr_assert_eq(n, 0);
    free(all);
    dp_tokenizer_destroy(t);
}

// --- special tokens, ignore_merges ------------------------------------------------------

Test(bpe, ordinary_encodes_special_text_as_text)
{
    dp_tokenizer *t = load(bpe_data("tokenizer.json"));
    const char *s = "a<|endoftext|>b <|endoftext|>";
    size_t n, m;
    int32_t *sp = bpe_encode_all(t, s, strlen(s), 0, &n);
    int32_t *ord = bpe_encode_all(t, s, strlen(s), 1, &m);
    size_t eots = 0;
    for (size_t i = 0; i < n; i++) eots += sp[i] == BPE_EOT;
    cr_assert_eq(eots, 2);
    for (size_t i = 0; i < m; i++) cr_assert_neq(ord[i], BPE_EOT, "ordinary produced EOT at %zu", i);
    char *back;
    size_t blen;
    dp_assert_ok(dp_tokenizer_decode(t, ord, m, &back, &blen));
    cr_assert(blen == strlen(s) && memcmp(back, s, blen) == 0);
    free(back);
    // Without special text, both are the same.
    const char *plain = "no special tokens here <|endoftext|";
    free(sp);
    free(ord);
    sp = bpe_encode_all(t, plain, strlen(plain), 0, &n);
    ord = bpe_encode_all(t, plain, strlen(plain), 1, &m);
    cr_assert(n == m && memcmp(sp, ord, n * sizeof *sp) == 0);
    free(sp);
    free(ord);
    dp_tokenizer_destroy(t);
}

Test(bpe, other_special_tokens_and_no_eot)
{
    // <|endoftext|> renamed <|end|>: still special, but not the end-of-text token.
    json_t *j = fixture_json();
    json_t *vocab = json_object_get(model_of(j), "vocab");
    json_object_del(vocab, "<|endoftext|>");
    json_object_set_new(vocab, "<|end|>", json_integer(0));
    json_object_set_new(json_array_get(json_object_get(j, "added_tokens"), 0), "content",
                        json_string("<|end|>"));
    dp_tokenizer *t = load(save_json(j, "end.json"));
    cr_assert_eq(dp_tokenizer_eot_id(t), -1);
    size_t n;
    int32_t *ids = bpe_encode_all(t, "x<|end|>y", 9, 0, &n);
    cr_assert(n == 3 && ids[1] == 0, "n %zu", n);
    free(ids);
    dp_tokenizer_destroy(t);
}

Test(bpe, ignore_merges_takes_whole_words)
{
    // "zzq" is a token no merge makes: only ignore_merges gives it.
    json_t *j = fixture_json();
    json_object_set_new(json_object_get(model_of(j), "vocab"), "zzq", json_integer(BPE_V));
    const char *plain = save_json(json_deep_copy(j), "zzq.json");
    json_object_set_new(model_of(j), "ignore_merges", json_true());
    const char *ignore = save_json(j, "zzq_ignore.json");
    dp_tokenizer *a = load(plain), *b = load(ignore);
    cr_assert_eq(dp_tokenizer_vocab_size(a), BPE_V + 1);
    size_t na, nb;
    int32_t *ia = bpe_encode_all(a, "zzq", 3, 0, &na);
    int32_t *ib = bpe_encode_all(b, "zzq", 3, 0, &nb);
    cr_assert_gt(na, 1);
    cr_assert(nb == 1 && ib[0] == BPE_V);
    free(ia);
    free(ib);
    // " zzq" is another pre-token, not in the vocabulary: merged as usual.
    ia = bpe_encode_all(a, " zzq", 4, 0, &na);
    ib = bpe_encode_all(b, " zzq", 4, 0, &nb);
    cr_assert(na == nb && memcmp(ia, ib, na * sizeof *ia) == 0);
    free(ia);
    free(ib);
    check_references(b, "ignore_merges"); // the fixture's words are whole tokens or merge alike
    dp_tokenizer_destroy(a);
    dp_tokenizer_destroy(b);
}

// --- cut points --------------------------------------------------------------------------

Test(bpe, pieces_cut_at_cut_points_give_the_whole_ids)
{
    dp_tokenizer *t = load(bpe_data("tokenizer.json"));
    size_t len, n;
    char *text = dp_test_bpe_joined_refs('\n', 3, 0, 1 << 16, &len);
    int32_t *whole = bpe_encode_all(t, text, len, 0, &n);
    int32_t *pieces = malloc(n * sizeof *pieces);
    size_t k = 0, at = 0, cuts = 0;
    // Windows of 64 bytes, doubled while they hold no cut point; the rest whole at the end.
    while (at < len) {
        size_t w = 64, cut = 0;
        for (;;) {
            if (w >= len - at) {
                cut = len - at;
                break;
            }
            if ((cut = dp_tokenizer_cut_point(t, text + at, w)) > 0) break;
            w *= 2;
        }
        cuts++;
        size_t m;
        int32_t *ids = bpe_encode_all(t, text + at, cut, 0, &m);
        cr_assert_leq(k + m, n);
        memcpy(pieces + k, ids, m * sizeof *ids);
        k += m;
        free(ids);
        at += cut;
    }
    cr_assert_gt(cuts, 50);
    cr_assert_eq(k, n);
    cr_assert_eq(memcmp(pieces, whole, n * sizeof *whole), 0);
    free(pieces);
    free(whole);
    free(text);

    // Only between graphic ASCII bytes around the '\n'.
    cr_assert_eq(dp_tokenizer_cut_point(t, "ab\ncd", 5), 3);
    cr_assert_eq(dp_tokenizer_cut_point(t, "ab\ncd\nef", 8), 6);
    cr_assert_eq(dp_tokenizer_cut_point(t, "ab\n", 3), 0, "the byte after the cut is unknown");
    cr_assert_eq(dp_tokenizer_cut_point(t, "a \ncd", 5), 0);
    cr_assert_eq(dp_tokenizer_cut_point(t, "ab\n cd", 6), 0);
    cr_assert_eq(dp_tokenizer_cut_point(t, "ab\n\ncd", 6), 0);
    cr_assert_eq(dp_tokenizer_cut_point(t, "\xc3\xa9\ncd", 5), 0);
    dp_tokenizer_destroy(t);

    // Never inside a special token that holds a '\n'.
    json_t *j = fixture_json();
    json_t *tok = json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", BPE_V, "content",
                            "A\nB", "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0,
                            "special", 1);
    json_array_append_new(json_object_get(j, "added_tokens"), tok);
    t = load(save_json(j, "nl_special.json"));
    cr_assert_eq(dp_tokenizer_vocab_size(t), BPE_V + 1);
    cr_assert_eq(dp_tokenizer_cut_point(t, "xA\nBx", 5), 0);
    cr_assert_eq(dp_tokenizer_cut_point(t, "xA\nB", 4), 0, "it could be the special token");
    cr_assert_eq(dp_tokenizer_cut_point(t, "xA\nC", 4), 3);
    cr_assert_eq(dp_tokenizer_cut_point(t, "A\nBx\ny", 6), 5);
    size_t m;
    int32_t *ids = bpe_encode_all(t, "xA\nBx", 5, 0, &m);
    cr_assert(m == 3 && ids[1] == BPE_V);
    free(ids);
    dp_tokenizer_destroy(t);
}

// --- invalid UTF-8 -------------------------------------------------------------------------

Test(bpe, invalid_utf8_is_refused_with_its_offset)
{
    static const struct {
        const char *s;
        size_t len, offset;
        const char *why;
    } cases[] = {
        {"ab\x80" "cd", 5, 2, "continuation byte without a lead"},
        {"abc\xc3", 4, 3, "truncated"},
        {"a\xc3(b", 4, 1, "truncated"},
        {"ok\xf0\x9f\x99", 5, 2, "truncated"},
        {"\xc0\xaf", 2, 0, "overlong"},
        {"xx\xe0\x80\xaf", 5, 2, "overlong"},
        {"xyz\xf0\x8f\xbf\xbf", 7, 3, "overlong"},
        {"\xed\xa0\x80", 3, 0, "surrogate"},
        {"s\xed\xbf\xbf", 4, 1, "surrogate"},
        {"\xf4\x90\x80\x80", 4, 0, "past U+10FFFF"},
        {"caf\xc3\xa9 \xff", 7, 6, "never occurs"},
    };
    dp_tokenizer *t = load(bpe_data("tokenizer.json"));
    int32_t ids[16];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t bad = 99, n = 99;
        cr_assert_eq(dp_utf8_check(cases[i].s, cases[i].len, &bad), DP_ERR_FORMAT, "case %zu", i);
        cr_assert_eq(bad, cases[i].offset, "case %zu: offset %zu", i, bad);
        cr_assert(strstr(dp_last_error(), cases[i].why), "case %zu: %s", i, dp_last_error());
        cr_assert_eq(dp_tokenizer_encode(t, cases[i].s, cases[i].len, ids, 16, &n, NULL),
                     DP_ERR_FORMAT, "case %zu", i);
        char want[64];
        snprintf(want, sizeof want, "byte offset %zu:", cases[i].offset);
        cr_assert(strstr(dp_last_error(), want), "case %zu: %s", i, dp_last_error());
        cr_assert_eq(n, 0);
    }
    // The edges of the valid ranges, and NUL.
    static const char *ok[] = {"\xf4\x8f\xbf\xbf", "\xef\xbf\xbf", "\xed\x9f\xbf", "\xee\x80\x80",
                               "\xf0\x90\x80\x80", "\xc2\x80", "\xdf\xbf", "\xe0\xa0\x80"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        size_t bad = 99;
        dp_assert_ok(dp_utf8_check(ok[i], strlen(ok[i]), &bad));
        cr_assert_eq(bad, strlen(ok[i]));
        size_t n;
        int32_t *x = bpe_encode_all(t, ok[i], strlen(ok[i]), 0, &n);
        free(x);
    }
    size_t bad;
    dp_assert_ok(dp_utf8_check("a\0b", 3, &bad));
    cr_assert_eq(dp_utf8_check(NULL, 1, &bad), DP_ERR_INVALID_ARGUMENT);
    dp_tokenizer_destroy(t);
}

// --- bad files ---------------------------------------------------------------------------

/* Asserts that loading path fails with status and a message holding
 * every one of the NULL-terminated words, and leaves no tokenizer. */
static void refused(const char *path, dp_status status, ...)
{
    dp_tokenizer *t = (dp_tokenizer *)1;
    dp_status st = dp_tokenizer_load_bpe(path, &t);
    cr_assert_eq(st, status, "'%s': status %s, expected %s: %s", path, dp_strerror(st),
                 dp_strerror(status), dp_last_error());
    cr_assert_null(t);
    va_list ap;
    va_start(ap, status);
    for (const char *w; (w = va_arg(ap, const char *));)
        cr_assert(strstr(dp_last_error(), w), "'%s': the message lacks \"%s\": %s", path, w,
                  dp_last_error());
    va_end(ap);
}

/* The fixture with model.<key> set to v (NULL: removed). */
static const char *with_model(const char *key, json_t *v, const char *name)
{
    json_t *j = fixture_json();
    if (v) json_object_set_new(model_of(j), key, v);
    else json_object_del(model_of(j), key);
    return save_json(j, name);
}

static const char *with_vocab(const char *key, json_t *v, const char *name)
{
    json_t *j = fixture_json();
    json_t *vocab = json_object_get(model_of(j), "vocab");
    if (v) json_object_set_new(vocab, key, v);
    else json_object_del(vocab, key);
    return save_json(j, name);
}

static const char *with_merge(size_t i, const char *a, const char *b, const char *name)
{
    json_t *j = fixture_json();
    json_array_set_new(json_object_get(model_of(j), "merges"), i, json_pack("[s,s]", a, b));
    return save_json(j, name);
}

static const char *with_root(const char *key, json_t *v, const char *name)
{
    json_t *j = fixture_json();
    json_object_set_new(j, key, v);
    return save_json(j, name);
}

Test(bpe, malformed_files_are_refused)
{
    refused(with_model("merges", NULL, "no_merges.json"), DP_ERR_FORMAT, "no_merges.json",
            "model.merges", "missing", NULL);
    refused(with_model("merges", json_string("e s"), "merges_string.json"), DP_ERR_FORMAT,
            "not an array", NULL);
    refused(with_model("vocab", json_array(), "vocab_array.json"), DP_ERR_FORMAT, "model.vocab",
            "not an object", NULL);
    refused(with_model("vocab", json_object(), "vocab_empty.json"), DP_ERR_FORMAT,
            "vocabulary is empty", NULL);
    refused(with_model("vocab", NULL, "no_vocab.json"), DP_ERR_FORMAT, "model.vocab", NULL);
    refused(with_merge(3, "zq", "e", "merge_unknown.json"), DP_ERR_FORMAT, "merge 3", "'zq'",
            "not in the vocabulary", NULL);
    refused(with_merge(0, "q", "Ġ", "merge_concat.json"), DP_ERR_FORMAT, "merge 0",
            "concatenation 'qĠ'", NULL);
    json_t *j = fixture_json();
    json_array_set_new(json_object_get(model_of(j), "merges"), 5, json_string("e  s"));
    refused(save_json(j, "merge_spaces.json"), DP_ERR_FORMAT, "merge 5", "one space", NULL);
    j = fixture_json();
    json_array_set_new(json_object_get(model_of(j), "merges"), 5, json_integer(7));
    refused(save_json(j, "merge_int.json"), DP_ERR_FORMAT, "merge 5", NULL);
    refused(with_vocab("e", json_integer(1), "dup_id.json"), DP_ERR_FORMAT, "id 1",
            "two vocabulary tokens", NULL);
    refused(with_vocab("e", json_integer(100000), "id_range.json"), DP_ERR_FORMAT, "'e'",
            "id 100000", "outside [0, 658)", NULL);
    refused(with_vocab("e", json_integer(-1), "id_negative.json"), DP_ERR_FORMAT, "id -1", NULL);
    refused(with_vocab("e", json_integer(BPE_V), "id_gap.json"), DP_ERR_FORMAT,
            "no token has id 69", "gap", NULL);
    refused(with_vocab("e", json_string("69"), "id_string.json"), DP_ERR_FORMAT, "'e'",
            "not an integer", NULL);
    refused(with_vocab("a b", json_integer(BPE_V), "not_alphabet.json"), DP_ERR_FORMAT, "'a b'",
            "U+0020", "byte alphabet", NULL);
    refused(with_vocab("", json_integer(BPE_V), "empty_token.json"), DP_ERR_FORMAT,
            "empty token", NULL);
    // Byte 0's token ('Ā', U+0100) renamed: the vocabulary misses a byte.
    j = fixture_json();
    json_t *vocab = json_object_get(model_of(j), "vocab");
    json_t *id0 = json_incref(json_object_get(vocab, "\xc4\x80"));
    json_object_del(vocab, "\xc4\x80");
    json_object_set_new(vocab, "\xc4\x80\xc4\x80", id0);
    refused(save_json(j, "no_byte.json"), DP_ERR_FORMAT, "byte 0x00", "all 256", NULL);
    j = fixture_json();
    json_object_set_new(json_array_get(json_object_get(j, "added_tokens"), 0), "id",
                        json_integer(5));
    refused(save_json(j, "added_conflict.json"), DP_ERR_FORMAT, "id 5", NULL);
    refused(with_root("added_tokens", json_string("x"), "added_string.json"), DP_ERR_FORMAT,
            "added_tokens", NULL);

    // Not JSON, cut short, empty, other JSON.
    size_t len;
    unsigned char *text = dp_test_read_file(bpe_data("tokenizer.json"), &len);
    dp_test_write_file(in_tmp("cut.json"), text, len / 2);
    refused(in_tmp("cut.json"), DP_ERR_FORMAT, "cut.json", "not valid JSON", NULL);
    free(text);
    dp_test_write_file(in_tmp("empty.json"), "", 0);
    refused(in_tmp("empty.json"), DP_ERR_FORMAT, "empty.json", "empty", NULL);
    dp_test_write_file(in_tmp("array.json"), "[1, 2]", 6);
    refused(in_tmp("array.json"), DP_ERR_FORMAT, "not a JSON object", NULL);
    dp_test_write_file(in_tmp("nomodel.json"), "{\"model\": 3}", 12);
    refused(in_tmp("nomodel.json"), DP_ERR_FORMAT, "\"model\"", NULL);
    // An object without "model" is taken for an encoder.json: vocab.bpe must be beside it.
    dp_test_write_file(in_tmp("other.json"), "{\"a\": 3}", 8);
    refused(in_tmp("other.json"), DP_ERR_FORMAT, "vocab.bpe", NULL);

    // Not files.
    refused(in_tmp("missing.json"), DP_ERR_IO, "missing.json", "No such file", NULL);
    refused(tmpdir, DP_ERR_FORMAT, "neither tokenizer.json nor", NULL);
    cr_assert_eq(mkfifo(in_tmp("fifo.json"), 0600), 0);
    refused(in_tmp("fifo.json"), DP_ERR_FORMAT, "FIFO", NULL);
    dp_tokenizer *t = (dp_tokenizer *)1;
    cr_assert_eq(dp_tokenizer_load_bpe(NULL, &t), DP_ERR_INVALID_ARGUMENT);
    cr_assert_null(t);
    cr_assert_eq(dp_tokenizer_load_bpe("", &t), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_tokenizer_load_bpe("x", NULL), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_tokenizer_load_bpe_openai(NULL, "x", &t), DP_ERR_INVALID_ARGUMENT);
}

Test(bpe, unsupported_settings_are_refused)
{
    refused(with_root("normalizer", json_pack("{s:s}", "type", "NFC"), "norm.json"),
            DP_ERR_UNSUPPORTED, "normalizer", NULL);
    refused(with_root("pre_tokenizer", json_pack("{s:s}", "type", "Whitespace"), "pre.json"),
            DP_ERR_UNSUPPORTED, "'Whitespace'", "ByteLevel", NULL);
    refused(with_root("pre_tokenizer", json_pack("{s:s, s:b}", "type", "ByteLevel",
                                                 "add_prefix_space", 1),
                      "prefix.json"),
            DP_ERR_UNSUPPORTED, "add_prefix_space", NULL);
    refused(with_model("dropout", json_real(0.1), "dropout.json"), DP_ERR_UNSUPPORTED, "dropout",
            NULL);
    refused(with_model("continuing_subword_prefix", json_string("##"), "prefix2.json"),
            DP_ERR_UNSUPPORTED, "continuing_subword_prefix", NULL);
    refused(with_model("type", json_string("WordPiece"), "wordpiece.json"), DP_ERR_UNSUPPORTED,
            "'WordPiece'", NULL);
    json_t *j = fixture_json();
    json_object_set_new(json_array_get(json_object_get(j, "added_tokens"), 0), "lstrip",
                        json_true());
    refused(save_json(j, "lstrip.json"), DP_ERR_UNSUPPORTED, "lstrip", NULL);
}

/* "model" may be a token of an encoder.json (an English word): an integer there
 * still means encoder.json; only tokenizer.json's "model" is an object.
 * And a tokenizer.json named as the encoder of a vocab.bpe says so. */
Test(bpe, a_model_token_does_not_make_an_encoder_a_tokenizer_json)
{
    json_error_t e;
    json_t *enc = json_load_file(bpe_data("encoder.json"), 0, &e);
    cr_assert_not_null(enc, "%s", e.text);
    size_t v = json_object_size(enc);
    json_object_set_new(enc, "model", json_integer((json_int_t)v));
    save_json(enc, "encoder.json"); /* takes enc */
    size_t len;
    unsigned char *merges = dp_test_read_file(bpe_data("vocab.bpe"), &len);
    dp_test_write_file(in_tmp("vocab.bpe"), merges, len);
    free(merges);
    dp_tokenizer *t = load(in_tmp("encoder.json"));
    cr_assert_eq(dp_tokenizer_vocab_size(t), v + 1);
    int32_t id = (int32_t)v;
    char *text = NULL;
    size_t n = 0;
    dp_assert_ok(dp_tokenizer_decode(t, &id, 1, &text, &n));
    cr_assert(n == 5 && memcmp(text, "model", 5) == 0, "id %d decodes as '%s'", id, text);
    free(text);
    dp_tokenizer_destroy(t);

    dp_tokenizer *u = (dp_tokenizer *)1;
    cr_assert_eq(dp_tokenizer_load_bpe_openai(bpe_data("tokenizer.json"), bpe_data("vocab.bpe"),
                                              &u),
                 DP_ERR_FORMAT);
    cr_assert_null(u);
    cr_assert(strstr(dp_last_error(), "is a tokenizers tokenizer.json") &&
                  strstr(dp_last_error(), "load it alone"),
              "%s", dp_last_error());
}

Test(bpe, bad_openai_files_are_refused)
{
    char enc[4096];
    snprintf(enc, sizeof enc, "%s", bpe_data("encoder.json"));
    const char *bad[][2] = {
        {"#version: 0.2\ne s\nno-space-here\n", "line 3"},
        {"#version: 0.2\ne s\nzq e\n", "'zq' is not in the vocabulary"},
        {"e  s\n", "line 1"},
        {"#version: 0.2\n\ne s\n", "line 2"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dp_test_write_file(in_tmp("vocab.bpe"), bad[i][0], strlen(bad[i][0]));
        dp_tokenizer *t = (dp_tokenizer *)1;
        cr_assert_eq(dp_tokenizer_load_bpe_openai(enc, in_tmp("vocab.bpe"), &t), DP_ERR_FORMAT,
                     "case %zu", i);
        cr_assert_null(t);
        cr_assert(strstr(dp_last_error(), bad[i][1]) && strstr(dp_last_error(), "vocab.bpe"),
                  "case %zu: %s", i, dp_last_error());
    }
    // A NUL byte would cut its line short ("e s\0junk" read as "e s").
    static const char nul[] = "#version: 0.2\ne s\0 junk\nt h\n";
    dp_test_write_file(in_tmp("vocab.bpe"), nul, sizeof nul - 1);
    dp_tokenizer *n = (dp_tokenizer *)1;
    cr_assert_eq(dp_tokenizer_load_bpe_openai(enc, in_tmp("vocab.bpe"), &n), DP_ERR_FORMAT);
    cr_assert_null(n);
    cr_assert(strstr(dp_last_error(), "line 2 holds a NUL byte"), "%s", dp_last_error());
    // \r\n line ends and no final newline are fine.
    dp_test_write_file(in_tmp("vocab.bpe"), "#version: 0.2\r\ne s\r\nt h", 23);
    dp_tokenizer *t;
    dp_assert_ok(dp_tokenizer_load_bpe_openai(enc, in_tmp("vocab.bpe"), &t));
    dp_tokenizer_destroy(t);
    dp_tokenizer *u = (dp_tokenizer *)1;
    cr_assert_eq(dp_tokenizer_load_bpe_openai(enc, in_tmp("none.bpe"), &u), DP_ERR_IO);
    cr_assert_null(u);
}

// --- threads -------------------------------------------------------------------------------

typedef struct job {
    const dp_tokenizer *t;
    const char *text;
    size_t len;
    int32_t *ids;
    size_t n;
    dp_status st;
} job;

static void *encode_job(void *arg)
{
    job *j = arg;
    for (int rep = 0; rep < 20 && j->st == DP_OK; rep++)
        j->st = dp_tokenizer_encode(j->t, j->text, j->len, j->ids, j->len, &j->n, NULL);
    return NULL;
}

Test(bpe, threads_share_a_tokenizer)
{
    dp_tokenizer *t = load(bpe_data("tokenizer.json"));
    size_t len;
    char *text = dp_test_bpe_joined_refs(0, 1, 0, 1 << 16, &len);
    job jobs[2];
    pthread_t th[2];
    for (int k = 0; k < 2; k++) {
        jobs[k] = (job){t, text, len, malloc(len * sizeof(int32_t)), 0, DP_OK};
        cr_assert_eq(pthread_create(&th[k], NULL, encode_job, &jobs[k]), 0);
    }
    for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
    size_t n;
    int32_t *want = bpe_encode_all(t, text, len, 0, &n);
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(jobs[k].st, DP_OK);
        cr_assert(jobs[k].n == n && memcmp(jobs[k].ids, want, n * sizeof *want) == 0);
        free(jobs[k].ids);
    }
    free(want);
    free(text);
    dp_tokenizer_destroy(t);
}
