/*
 * tests/fuzz/fuzz_bpe_fixture.h - a small byte-level BPE for fuzz_bpe and
 * its seeds (gen_corpus), as the text of its files: a tokenizer.json and
 * the same vocabulary as OpenAI's encoder.json, plus its merges as
 * vocab.bpe. Ids: the 256 byte tokens in byte order, then one per merge of
 * MERGES (by rank), then the special tokens <|endoftext|> and "<|a\nb|>"
 * (which holds a newline, for the cut points).
 */
#ifndef DP_FUZZ_BPE_FIXTURE_H
#define DP_FUZZ_BPE_FIXTURE_H

#include <stdio.h>
#include <string.h>

/* The merges, by rank, as alphabet strings ('Ġ' is the space byte, 'Ċ'
 * the newline, "Ã©" the bytes of 'é'). */
static const char *const FUZZ_BPE_MERGES[][2] = {
    {"\xc4\xa0", "t"},           {"h", "e"},           {"\xc4\xa0t", "he"},
    {"i", "n"},                  {"\xc4\xa0", "a"},    {"\xc4\xa0", "\xc4\xa0"},
    {"\xc4\xa0\xc4\xa0", "\xc4\xa0\xc4\xa0"}, {"\xc3\x83", "\xc2\xa9"}, {"e", "r"},
    {"\xc4\x8a", "\xc4\x8a"},    {"a", "a"},           {"aa", "aa"},
    {"'", "s"},                  {"\xc4\xa0", "in"},   {"o", "u"},
};
#define FUZZ_BPE_N_MERGES (sizeof FUZZ_BPE_MERGES / sizeof FUZZ_BPE_MERGES[0])
#define FUZZ_BPE_V (256 + FUZZ_BPE_N_MERGES + 2)
#define FUZZ_BPE_EOT (256 + (int)FUZZ_BPE_N_MERGES)

/* GPT-2's byte alphabet (bytes_to_unicode in OpenAI's encoder.py): the
 * UTF-8 of the character that stands for byte b, written to out[0..3). */
static inline void fuzz_bpe_char(unsigned b, char out[3])
{
    unsigned cp = b, n = 0;
    int printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    if (!printable) {
        for (unsigned c = 0; c < b; c++)
            n += !((c >= 0x21 && c <= 0x7e) || (c >= 0xa1 && c <= 0xac) || c >= 0xae);
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = '\0';
    } else {
        out[0] = (char)(0xc0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3f));
        out[2] = '\0';
    }
}

/* Appends s to buf[*k..cap) as a JSON string (quotes escaped). */
static inline void fuzz_bpe_put_str(char *buf, size_t cap, size_t *k, const char *s)
{
    *k += (size_t)snprintf(buf + *k, cap - *k, "\"");
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') *k += (size_t)snprintf(buf + *k, cap - *k, "\\%c", *s);
        else if (*s == '\n') *k += (size_t)snprintf(buf + *k, cap - *k, "\\n");
        else *k += (size_t)snprintf(buf + *k, cap - *k, "%c", *s);
    }
    *k += (size_t)snprintf(buf + *k, cap - *k, "\"");
}

/* The vocabulary object {token: id} into buf[*k..cap), with the first
 * `specials` special tokens (encoder.json holds <|endoftext|> only: the
 * other is not made of the byte alphabet). */
static inline void fuzz_bpe_vocab(char *buf, size_t cap, size_t *k, int specials)
{
    *k += (size_t)snprintf(buf + *k, cap - *k, "{");
    for (unsigned b = 0; b < 256; b++) {
        char c[3];
        fuzz_bpe_char(b, c);
        fuzz_bpe_put_str(buf, cap, k, c);
        *k += (size_t)snprintf(buf + *k, cap - *k, ":%u,", b);
    }
    for (size_t i = 0; i < FUZZ_BPE_N_MERGES; i++) {
        char tok[64];
        snprintf(tok, sizeof tok, "%s%s", FUZZ_BPE_MERGES[i][0], FUZZ_BPE_MERGES[i][1]);
        fuzz_bpe_put_str(buf, cap, k, tok);
        *k += (size_t)snprintf(buf + *k, cap - *k, ":%zu%s", 256 + i,
                               i + 1 < FUZZ_BPE_N_MERGES || specials ? "," : "");
    }
    if (specials)
        *k += (size_t)snprintf(buf + *k, cap - *k, "\"<|endoftext|>\":%d", FUZZ_BPE_EOT);
    if (specials > 1)
        *k += (size_t)snprintf(buf + *k, cap - *k, ",\"<|a\\nb|>\":%d", FUZZ_BPE_EOT + 1);
    *k += (size_t)snprintf(buf + *k, cap - *k, "}");
}

/* tokenizer.json (merges as pairs, or with string_merges as "a b"). */
static inline size_t fuzz_bpe_tokenizer_json(char *buf, size_t cap, int string_merges)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, cap - k,
                          "{\"added_tokens\":[{\"id\":%d,\"content\":\"<|endoftext|>\","
                          "\"special\":true},{\"id\":%d,\"content\":\"<|a\\nb|>\","
                          "\"special\":true}],\"normalizer\":null,\"pre_tokenizer\":{\"type\":"
                          "\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true},"
                          "\"model\":{\"type\":\"BPE\",\"vocab\":",
                          FUZZ_BPE_EOT, FUZZ_BPE_EOT + 1);
    fuzz_bpe_vocab(buf, cap, &k, 2);
    k += (size_t)snprintf(buf + k, cap - k, ",\"merges\":[");
    for (size_t i = 0; i < FUZZ_BPE_N_MERGES; i++) {
        if (string_merges) {
            char m[64];
            snprintf(m, sizeof m, "%s %s", FUZZ_BPE_MERGES[i][0], FUZZ_BPE_MERGES[i][1]);
            fuzz_bpe_put_str(buf, cap, &k, m);
        } else {
            k += (size_t)snprintf(buf + k, cap - k, "[");
            fuzz_bpe_put_str(buf, cap, &k, FUZZ_BPE_MERGES[i][0]);
            k += (size_t)snprintf(buf + k, cap - k, ",");
            fuzz_bpe_put_str(buf, cap, &k, FUZZ_BPE_MERGES[i][1]);
            k += (size_t)snprintf(buf + k, cap - k, "]");
        }
        k += (size_t)snprintf(buf + k, cap - k, "%s", i + 1 < FUZZ_BPE_N_MERGES ? "," : "");
    }
    k += (size_t)snprintf(buf + k, cap - k, "]}}");
    return k;
}

/* encoder.json: the vocabulary with <|endoftext|> (V = FUZZ_BPE_V - 1). */
static inline size_t fuzz_bpe_encoder_json(char *buf, size_t cap)
{
    size_t k = 0;
    fuzz_bpe_vocab(buf, cap, &k, 1);
    return k;
}

/* vocab.bpe: "#version: 0.2", then the merges a line. */
static inline size_t fuzz_bpe_vocab_bpe(char *buf, size_t cap)
{
    size_t k = (size_t)snprintf(buf, cap, "#version: 0.2\n");
    for (size_t i = 0; i < FUZZ_BPE_N_MERGES; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s %s\n", FUZZ_BPE_MERGES[i][0],
                              FUZZ_BPE_MERGES[i][1]);
    return k;
}

#endif /* DP_FUZZ_BPE_FIXTURE_H */
