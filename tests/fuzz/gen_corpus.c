/*
 * tests/fuzz/gen_corpus.c - writes the committed seed corpora of the
 * harnesses (tests/fuzz/corpus/<harness>/), valid files made with dp
 * itself and near-valid variants of them. Run by hand after a format
 * change:  build/fuzz/gen_corpus tests/fuzz/corpus
 * The output is deterministic.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dp/safetensors.h"
#include "dp/tokenizer.h"
#include "fuzz_bpe_fixture.h"

static const char *root;

static void die(const char *what)
{
    fprintf(stderr, "gen_corpus: %s: %s\n", what, dp_last_error());
    exit(1);
}

static void put(const char *harness, const char *name, const void *data, size_t n)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", root, harness);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) die(path);
    snprintf(path, sizeof path, "%s/%s/%s", root, harness, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) die(path);
}

static void put_str(const char *harness, const char *name, const char *s)
{
    put(harness, name, s, strlen(s));
}

// The bytes of the file at path (malloc'd).
static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) die(path);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n ? *n : 1);
    if (!b || fread(b, 1, *n, f) != *n) die(path);
    fclose(f);
    return b;
}

// A file written by dp's writer, also returned (malloc'd) for variants.
static unsigned char *st_file(dp_st_writer *w, const char *name, size_t *n)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/.gen.safetensors", root);
    if (dp_st_writer_write(w, path) != DP_OK) die("write");
    unsigned char *b = slurp(path, n);
    remove(path);
    put("safetensors", name, b, *n);
    return b;
}

// A raw file: u64 LE header length, header, data_len bytes 0, 1, 2, ...
static void st_raw(const char *name, const char *header, size_t data_len)
{
    size_t h = strlen(header), n = 8 + h + data_len;
    unsigned char *b = malloc(n);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(((uint64_t)h >> (8 * i)) & 0xff);
    memcpy(b + 8, header, h);
    for (size_t i = 0; i < data_len; i++) b[8 + h + i] = (unsigned char)i;
    put("safetensors", name, b, n);
    free(b);
}

static void gen_safetensors(void)
{
    dp_st_writer *w;
    size_t n;
    if (dp_st_writer_create(&w) != DP_OK) die("writer");
    free(st_file(w, "empty.safetensors", &n));

    float a[6] = {1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-30f};
    size_t sa[2] = {2, 3};
    if (dp_st_writer_add(w, "transformer.wte.weight", DP_DTYPE_F32, sa, 2, a) != DP_OK) die("add");
    if (dp_st_writer_set_metadata(w, "format", "pt") != DP_OK) die("meta");
    size_t n1;
    unsigned char *one = st_file(w, "one_f32.safetensors", &n1);

    int64_t b[3] = {-1, 0, 7};
    uint8_t c[4] = {0, 1, 254, 255};
    int32_t s = 42;
    uint16_t h[2] = {0x3c00, 0xbc00};
    size_t sb[1] = {3}, sc[2] = {2, 2}, sz[2] = {0, 5}, sh[1] = {2};
    if (dp_st_writer_add(w, "step", DP_DTYPE_I64, sb, 1, b) != DP_OK ||
        dp_st_writer_add(w, "mask", DP_DTYPE_BOOL, sc, 2, c) != DP_OK ||
        dp_st_writer_add(w, "scalar", DP_DTYPE_I32, NULL, 0, &s) != DP_OK ||
        dp_st_writer_add(w, "empty", DP_DTYPE_F64, sz, 2, NULL) != DP_OK ||
        dp_st_writer_add(w, "half", DP_DTYPE_F16, sh, 1, h) != DP_OK ||
        dp_st_writer_set_metadata(w, "tokenizer", "{\"type\":\"char\",\"version\":1,\"bytes\":[10,97]}") != DP_OK ||
        dp_st_writer_set_metadata(w, "sampler", "6470534d50000001,1,2,3,4,0,0,8,100") != DP_OK)
        die("add");
    free(st_file(w, "many_dtypes.safetensors", &n));
    dp_st_writer_destroy(w);

    // Near-valid variants of the one-tensor file.
    put("safetensors", "truncated.safetensors", one, n1 - 4);
    put("safetensors", "header_only.safetensors", one, 8);
    one[0] += 1; // header length one past: the JSON loses a padding byte to data
    put("safetensors", "header_len_off_by_one.safetensors", one, n1);
    one[0] = 0xff;
    one[5] = 0x01; // header length past the end of the file
    put("safetensors", "header_len_huge.safetensors", one, n1);
    free(one);

    st_raw("gap.safetensors",
           "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
           "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[3,5]}}",
           5);
    st_raw("overlap.safetensors",
           "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
           "\"b\":{\"dtype\":\"I16\",\"shape\":[1],\"data_offsets\":[2,4]}}",
           4);
    st_raw("shape_overflow.safetensors",
           "{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}",
           8);
    st_raw("bad_dtype.safetensors",
           "{\"a\":{\"dtype\":\"F8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
    st_raw("metadata_not_string.safetensors",
           "{\"__metadata__\":{\"k\":1},\"a\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}",
           1);
    st_raw("duplicate.safetensors",
           "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
           "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
           2);
}

static void gen_tokenizer(void)
{
    const char *text = "The quick brown fox's 2nd jump, over the lazy dog.\n"
                       "the fox\tand the dog: caf\xc3\xa9!\n";
    dp_tokenizer *t;
    char *json;
    if (dp_tokenizer_create_char(text, strlen(text), &t) != DP_OK) die("char");
    if (dp_tokenizer_serialize(t, &json) != DP_OK) die("serialize");
    put_str("tokenizer", "char.json", json);
    free(json);
    dp_tokenizer_destroy(t);
    if (dp_tokenizer_create_word(text, strlen(text), 40, &t) != DP_OK) die("word");
    if (dp_tokenizer_serialize(t, &json) != DP_OK) die("serialize");
    put_str("tokenizer", "word.json", json);
    free(json);
    dp_tokenizer_destroy(t);
    put_str("tokenizer", "word_no_words.json", "{\"type\":\"word\",\"version\":1,\"bytes\":[32],\"words\":[]}");
    put_str("tokenizer", "unsorted_bytes.json", "{\"type\":\"char\",\"version\":1,\"bytes\":[97,10]}");
    put_str("tokenizer", "word_byte_in_bytes.json",
            "{\"type\":\"word\",\"version\":1,\"bytes\":[32,97],\"words\":[\"b\"]}");
    put_str("tokenizer", "bad_word.json",
            "{\"type\":\"word\",\"version\":1,\"bytes\":[32],\"words\":[\"a b\"]}");
    put_str("tokenizer", "duplicate_word.json",
            "{\"type\":\"word\",\"version\":1,\"bytes\":[],\"words\":[\"ab\",\"ab\"]}");
    put_str("tokenizer", "version2.json", "{\"type\":\"char\",\"version\":2,\"bytes\":[10]}");
    put_str("tokenizer", "unknown_key.json",
            "{\"type\":\"char\",\"version\":1,\"bytes\":[10],\"merges\":[]}");
}

// An input of a harness that reads a mode byte, then the body (text, bpe).
static void mode_input(const char *harness, const char *name, unsigned char mode,
                       const char *body, size_t n)
{
    unsigned char *b = malloc(n + 1);
    if (!b) die("out of memory");
    b[0] = mode;
    memcpy(b + 1, body, n);
    put(harness, name, b, n + 1);
    free(b);
}

// A text-harness input: mode byte then the corpus.
static void text_input(const char *name, unsigned char mode, const char *body, size_t n)
{
    mode_input("text", name, mode, body, n);
}

// A literal corpus, embedded NULs included.
#define TEXT_LIT(name, mode, lit) text_input(name, mode, lit, sizeof(lit) - 1)

static void gen_text(void)
{
    const char *fortune =
        "A day for firm decisions!!!!!  Or is it?\n%\n"
        "A few hours grace before the madness begins again.\n%\n"
        "You will be successful in love, it's the 3rd time.\n";
    text_input("file_small_vocab.bin", 0x05, fortune, strlen(fortune));
    text_input("file_big_vocab.bin", 0x7f, fortune, strlen(fortune));
    text_input("file_one_byte.bin", 0x00, "x", 1);
    text_input("file_empty.bin", 0x10, "", 0);
    TEXT_LIT("file_binary.bin", 0x21, "ab\0cd");
    const char *dir = "first file\n%%\nskipped dot-file\n%%\nskipped .dat\n%%\nthird\n%%\n"
                      "skipped .u8\n%%\n\n%%\nin a subdirectory\n%%\nlast file, z\n";
    text_input("dir_all.bin", 0x83, dir, strlen(dir));
    TEXT_LIT("dir_two.bin", 0xc4, "one\n%%\n.\n%%\n..\n%%\ntwo");
    TEXT_LIT("dir_empty_files.bin", 0x80, "\n%%\n\n%%\n");
    TEXT_LIT("dir_binary.bin", 0x81, "text\n%%\nmore\n%%\n\0");
    TEXT_LIT("dir_links.bin", 0xc2, "dot\n%%\nread twice, through w\n%%\ndat, also behind y\n%%\nc");
    // A sampler state text that fits the char-token training split of itself
    // (152 bytes: 136 training tokens = 0x88; context 3 from mode 0x02).
    TEXT_LIT("state_text.bin", 0x02,
             "6470534d50000001,0123456789abcdef,00000000000000ff,0000000000000000,"
             "FEDCBA9876543210,0000000000000002,0000000000000006,0000000000000003,"
             "0000000000000088");
    // More distinct words than the word counter's first table holds (512).
    char *many = malloc(8192);
    size_t k = 0;
    for (int i = 0; i < 700; i++) k += (size_t)snprintf(many + k, 8192 - k, "w%d ", i * 7919 % 10007);
    text_input("file_many_words.bin", 0x7e, many, k);
    free(many);
}

// --- token_files: llm.c token shards, raw nanoGPT ids, llm.c token tables ---

static void le32(unsigned char *b, uint32_t v)
{
    for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> (8 * i));
}

// A token_files input: mode byte, then an llm.c header (magic, version,
// count) when magic is not 0, then n ids 0, 7, 14, ... as uint16.
static void tok_input(const char *name, unsigned char mode, uint32_t magic, uint32_t version,
                      uint32_t count, size_t n, size_t cut)
{
    size_t h = magic ? 1024 : 0, len = 1 + h + 2 * n;
    unsigned char *b = calloc(1, len);
    b[0] = mode;
    if (magic) {
        le32(b + 1, magic);
        le32(b + 5, version);
        le32(b + 9, count);
    }
    for (size_t i = 0; i < n; i++) {
        b[1 + h + 2 * i] = (unsigned char)((7 * i) & 0xff);
        b[1 + h + 2 * i + 1] = (unsigned char)((7 * i) >> 8);
    }
    put("token_files", name, b, len - cut);
    free(b);
}

// A token-table input: mode 1, header, then V records "t<i>" (zero_at:
// that record's length byte is 0; extra bytes appended; cut bytes off).
static void table_input(const char *name, uint32_t version, uint32_t V_header, size_t V,
                        uint32_t eot, long zero_at, size_t extra, size_t cut)
{
    unsigned char *b = calloc(1, 1 + 1024 + V * 8 + extra + 1);
    b[0] = 1;
    le32(b + 1, 20240328);
    le32(b + 5, version);
    le32(b + 9, V_header);
    le32(b + 13, eot);
    size_t k = 1 + 1024;
    for (size_t i = 0; i < V; i++) {
        char t[16];
        int n = snprintf(t, sizeof t, "t%zu", i);
        b[k] = (long)i == zero_at ? 0 : (unsigned char)n;
        memcpy(b + k + 1, t, (size_t)n);
        k += 1 + (size_t)n;
    }
    memset(b + k, 'x', extra);
    k += extra;
    put("token_files", name, b, k - cut);
    free(b);
}

static void gen_token_files(void)
{
    tok_input("raw_even.bin", 0x00, 0, 0, 0, 40, 0);
    tok_input("raw_odd.bin", 0x00, 0, 0, 0, 40, 1);
    tok_input("raw_dir.bin", 0x02, 0, 0, 0, 40, 0);
    tok_input("raw_vocab300.bin", 0x04, 0, 0, 0, 60, 0); // ids up to 413: some past 300
    tok_input("llmc_good.bin", 0x00, 20240520, 1, 40, 40, 0);
    tok_input("llmc_dir_mixed.bin", 0x02, 20240520, 1, 40, 40, 0);
    tok_input("llmc_version2.bin", 0x00, 20240520, 2, 40, 40, 0);
    tok_input("llmc_count_past.bin", 0x00, 20240520, 1, 41, 40, 0);
    tok_input("llmc_count_short.bin", 0x00, 20240520, 1, 39, 40, 0);
    tok_input("llmc_count_negative.bin", 0x00, 20240520, 1, 0x80000000u, 40, 0);
    tok_input("llmc_count_zero.bin", 0x00, 20240520, 1, 0, 0, 0);
    tok_input("llmc_header_cut.bin", 0x00, 20240520, 1, 40, 0, 600);
    tok_input("llama3.bin", 0x00, 20240801, 7, 20, 40, 0);
    tok_input("eval.bin", 0x00, 20240522, 1, 2, 40, 0);
    tok_input("empty.bin", 0x00, 0, 0, 0, 0, 0);
    table_input("table_good.bin", 2, 30, 30, 29, -1, 0, 0);
    table_input("table_zero_length.bin", 2, 30, 30, 29, 3, 0, 0);
    table_input("table_cut.bin", 2, 30, 30, 29, -1, 0, 2);
    table_input("table_trailing.bin", 2, 30, 30, 29, -1, 5, 0);
    table_input("table_vocab_overflow.bin", 2, 0xffffffffu, 30, 29, -1, 0, 0);
    table_input("table_eot_past.bin", 2, 30, 30, 30, -1, 0, 0);
    table_input("table_version1.bin", 1, 30, 30, 0, -1, 0, 0);
    table_input("table_version3.bin", 3, 30, 30, 29, -1, 0, 0);
}

static void dev_input(const char *name, unsigned char cap, const char *text)
{
    size_t n = strlen(text);
    unsigned char *b = malloc(n + 1);
    b[0] = cap;
    memcpy(b + 1, text, n);
    put("devlist", name, b, n + 1);
    free(b);
}

static void gen_devlist(void)
{
    dev_input("count", 64, "cpu:4");
    dev_input("list", 64, "cpu:0,1,3");
    dev_input("kinds", 64, "cpu:0, cpu:1 ,2");
    dev_input("auto", 64, "auto");
    dev_input("cpu", 1, "cpu");
    dev_input("cuda", 64, "cuda:0,0");
    dev_input("mixed", 64, "cpu:0,cuda:1");
    dev_input("too_many", 2, "cpu:3");
    dev_input("empty_entry", 64, "cpu:0,,1");
    dev_input("bare_index", 64, "0,1");
    dev_input("bytes_gib", 64, "12GiB");
    dev_input("bytes_mb", 64, " 512 mb ");
    dev_input("bytes_plain", 64, "4096");
}

// fuzz_bpe: a mode byte, then text to encode or a file to load.
static void bpe_input(const char *name, unsigned char mode, const char *body, size_t n)
{
    mode_input("bpe", name, mode, body, n);
}

#define BPE_LIT(name, mode, lit) bpe_input(name, mode, lit, sizeof(lit) - 1)

static void gen_bpe(void)
{
    // Text for the fixture BPE (mode 0: its tokenizer.json; 2: its OpenAI files).
    BPE_LIT("text_ascii", 0x00, "The cat's in the hat; they're here, we'll see, I'd go.\n");
    BPE_LIT("text_spaces", 0x00, "a  b   c\t\td \n\n  \r\nend   ");
    BPE_LIT("text_unicode", 0x02, "caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x99\x82 e\xcc\x81 \xc2\xa0x");
    BPE_LIT("text_special", 0x00, "a<|endoftext|>b <|a\nb|> <|endoftext|");
    BPE_LIT("text_cut", 0x02, "one\ntwo\nthree\n<|a\nb|>\nfour");
    BPE_LIT("text_digits", 0x00, "12345 3.14 1,000,000 \xd9\xa3 \xc2\xb2");
    BPE_LIT("text_long", 0x00, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    BPE_LIT("bad_continuation", 0x00, "ab\x80" "cd");
    BPE_LIT("bad_truncated", 0x00, "abc\xe4\xb8");
    BPE_LIT("bad_overlong", 0x00, "x\xc0\xaf");
    BPE_LIT("bad_surrogate", 0x02, "\xed\xa0\x80");
    BPE_LIT("bad_past_max", 0x00, "\xf4\x90\x80\x80");
    // Files (mode 1: a tokenizer.json; 3: a vocab.bpe for the fixture's encoder.json).
    static char buf[1 << 16];
    size_t n = fuzz_bpe_tokenizer_json(buf, sizeof buf, 0);
    bpe_input("file_tokenizer.json", 0x01, buf, n);
    bpe_input("file_tokenizer_cut.json", 0x01, buf, n / 2);
    n = fuzz_bpe_tokenizer_json(buf, sizeof buf, 1);
    bpe_input("file_string_merges.json", 0x01, buf, n);
    n = fuzz_bpe_vocab_bpe(buf, sizeof buf);
    bpe_input("file_vocab.bpe", 0x03, buf, n);
    BPE_LIT("file_vocab_bad_line.bpe", 0x03, "#version: 0.2\nh e\nno_space\n");
    BPE_LIT("file_vocab_unknown.bpe", 0x03, "#version: 0.2\nzq e\n");
    BPE_LIT("file_not_json", 0x01, "{\"model\": {\"vocab\": [1, 2]");
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: gen_corpus DIR (e.g. tests/fuzz/corpus)\n");
        return 2;
    }
    root = argv[1];
    if (mkdir(root, 0755) != 0 && errno != EEXIST) die(root);
    gen_safetensors();
    gen_tokenizer();
    gen_text();
    gen_devlist();
    gen_token_files();
    gen_bpe();
    return 0;
}
