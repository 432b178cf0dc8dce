/*
 * tests/fuzz/fuzz_token_files.c - libFuzzer harness for the two header
 * parsers of llm.c's files: token data (dp_token_data_open on an llm.c
 * shard or a raw nanoGPT file) and the token table (dp_tokenizer_load_llmc
 * on gpt2_tokenizer.bin).
 *
 * Input: byte 0 picks the mode, the rest is the file.
 *   bit 0 clear: token data. The file is written as one file, or (bit 1)
 *     as "d_train.bin" of a directory whose "d_val.bin" is a fixed raw
 *     file of 4 ids. The vocabulary is 65536 (every uint16 id), or 300
 *     with bit 2 set.
 *   bit 0 set: the token table.
 * Each parser is checked against an oracle written here from the formats'
 * descriptions (dp/data.h, dp/tokenizer.h), not from the library's code:
 * a file is accepted exactly when the oracle says it is valid; accepted
 * data read back (dp_token_data_read) the oracle's little-endian ids, each
 * read failing exactly when it holds an id past the vocabulary; a sampler
 * batch is made of slices of its split; an accepted table gives every id
 * the oracle's bytes, its EOT id, and refuses to encode and serialize. A
 * refusal leaves *out NULL and a message naming the file.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dp/data.h"
#include "dp/tokenizer.h"
#include "fuzz_common.h"

static uint32_t get32(const uint8_t *b)
{
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

// ----------------------------------------------------------------------------
// token data

/* The oracle: whether f[0..n) is token data, and where its ids are. */
static int data_valid(const uint8_t *f, size_t n, size_t *ids_at, size_t *count)
{
    if (n == 0) return 0;
    uint32_t magic = n >= 4 ? get32(f) : 0;
    if (magic == 20240328 || magic == 20240522 || magic == 20240801) return 0;
    if (magic != 20240520) {
        /* an llm.c header but for its magic (version 1, the count the
         * file's size, the rest zero) is a corrupt shard, refused */
        if (n >= 1024 && get32(f + 4) == 1 && (int32_t)get32(f + 8) > 0 &&
            1024 + 2 * (uint64_t)(int32_t)get32(f + 8) == n) {
            size_t i = 12;
            while (i < 1024 && !f[i]) i++;
            if (i == 1024) return 0;
        }
        *ids_at = 0;
        *count = n / 2;
        return n % 2 == 0;
    }
    if (n < 1024 || get32(f + 4) != 1) return 0;
    int32_t c = (int32_t)get32(f + 8);
    if (c <= 0 || 1024 + 2 * (uint64_t)c != n) return 0;
    *ids_at = 1024;
    *count = (size_t)c;
    return 1;
}

static void check_refused(dp_status st, const void *out, const char *name)
{
    FUZZ_CHECK(st == DP_ERR_FORMAT || st == DP_ERR_OUT_OF_MEMORY, "status %d", (int)st);
    FUZZ_CHECK(out == NULL, "handle left after an error");
    FUZZ_CHECK_MESSAGE(st);
    FUZZ_CHECK(strstr(dp_last_error(), name) != NULL, "the message does not name %s", name);
}

/* ids[0..n) of the split read back, each read compared with want[]
 * (the oracle's ids), failing exactly when an id is >= vocab. */
static void check_reads(const dp_token_data *d, dp_split s, const uint8_t *want, size_t n,
                        size_t vocab)
{
    FUZZ_CHECK(dp_token_data_size(d, s) == n, "%s split of %zu, want %zu", dp_split_name(s),
               dp_token_data_size(d, s), n);
    if (n == 0) return;
    int32_t *got = malloc(n * sizeof *got);
    FUZZ_CHECK(got, "out of memory");
    // The whole split, then a few ranges of it.
    size_t starts[4] = {0, n / 3, n / 2, n - 1}, lens[4] = {n, n - n / 3, 1, 1};
    for (int r = 0; r < 4; r++) {
        size_t a = starts[r], k = lens[r];
        int bad = 0;
        for (size_t i = a; i < a + k; i++) bad |= (size_t)(want[2 * i] | want[2 * i + 1] << 8) >= vocab;
        dp_clear_error();
        dp_status st = dp_token_data_read(d, s, a, k, got);
        if (bad) {
            FUZZ_CHECK(st == DP_ERR_FORMAT, "a range holding an id >= %zu read: status %d", vocab,
                       (int)st);
            FUZZ_CHECK_MESSAGE(st);
            continue;
        }
        FUZZ_CHECK(st == DP_OK, "reading %zu..%zu failed", a, a + k);
        for (size_t i = 0; i < k; i++)
            FUZZ_CHECK(got[i] == (want[2 * (a + i)] | want[2 * (a + i) + 1] << 8),
                       "id %zu of the %s split: %d", a + i, dp_split_name(s), (int)got[i]);
    }
    FUZZ_CHECK(dp_token_data_read(d, s, n, 1, got) == DP_ERR_INVALID_ARGUMENT, "read past the end");
    free(got);
}

/* A batch from the split's sampler is made of its slices (when every id
 * is in the vocabulary; else the batch may fail, leaving it unchanged). */
static void check_sampler(const dp_token_data *d, dp_split s, const uint8_t *ids, size_t n)
{
    enum { B = 2, T = 4 };
    dp_sampler *sm = NULL;
    dp_status st = dp_sampler_create(d, s, T, 7, &sm);
    if (n < T + 1) {
        FUZZ_CHECK(st == DP_ERR_INVALID_ARGUMENT && !sm, "a sampler over %zu tokens", n);
        return;
    }
    FUZZ_CHECK(st == DP_OK, "sampler over %zu tokens", n);
    int32_t x[B * T], y[B * T];
    uint64_t before[DP_SAMPLER_STATE_WORDS], after[DP_SAMPLER_STATE_WORDS];
    dp_sampler_get_state(sm, before);
    st = dp_sampler_next(sm, x, y, B);
    dp_sampler_get_state(sm, after);
    if (st != DP_OK) {
        FUZZ_CHECK(st == DP_ERR_FORMAT && memcmp(before, after, sizeof before) == 0,
                   "a failed batch (status %d) moved the sampler", (int)st);
    } else {
        for (int b = 0; b < B; b++) {
            int found = 0;
            for (size_t p = 0; !found && p + T < n; p++) {
                found = 1;
                for (int t = 0; t <= T && found; t++) {
                    int32_t id = ids[2 * (p + t)] | ids[2 * (p + t) + 1] << 8;
                    found = (t < T ? x[b * T + t] == id : 1) && (t > 0 ? y[b * T + t - 1] == id : 1);
                }
            }
            FUZZ_CHECK(found, "row %d is not a window of the %s split", b, dp_split_name(s));
        }
    }
    dp_sampler_destroy(sm);
}

static void fuzz_data(const uint8_t *f, size_t n, int as_dir, size_t vocab)
{
    const char *dir = fuzz_dir();
    char path[600], val[600], name[64];
    static const uint8_t val_ids[8] = {1, 0, 2, 0, 3, 0, 4, 0};
    if (as_dir) {
        snprintf(path, sizeof path, "%s/tokens", dir);
        mkdir(path, 0755);
        snprintf(val, sizeof val, "%s/d_val.bin", path);
        fuzz_write_file(val, val_ids, sizeof val_ids);
        char file[700];
        snprintf(file, sizeof file, "%s/d_train.bin", path);
        fuzz_write_file(file, f, n);
        strcpy(name, "d_train.bin");
    } else {
        snprintf(path, sizeof path, "%s/data.bin", dir);
        fuzz_write_file(path, f, n);
        strcpy(name, "data.bin");
    }
    size_t at = 0, count = 0;
    int valid = data_valid(f, n, &at, &count);
    // In the directory the fixed val file is raw: an llm.c train file mixes formats.
    if (as_dir && valid && at != 0) valid = 0;
    dp_clear_error();
    dp_token_data *d = (dp_token_data *)1;
    dp_status st = dp_token_data_open(path, vocab, &d);
    if (!valid) {
        check_refused(st, d, name);
        return;
    }
    FUZZ_CHECK(st == DP_OK, "a valid file was refused");
    dp_token_data_info info;
    FUZZ_CHECK(dp_token_data_get_info(d, &info) == DP_OK, "info");
    FUZZ_CHECK(info.format == (at ? DP_TOKEN_FORMAT_LLMC : DP_TOKEN_FORMAT_NANOGPT), "format %d",
               (int)info.format);
    FUZZ_CHECK(info.split_by_files == as_dir, "split_by_files");
    FUZZ_CHECK(dp_token_data_tokens(d, DP_SPLIT_TRAIN) == NULL, "mapped data gave an array");
    const uint8_t *ids = f + at;
    if (as_dir) {
        FUZZ_CHECK(dp_token_data_total(d) == count + 4, "total");
        check_reads(d, DP_SPLIT_TRAIN, ids, count, vocab);
        check_reads(d, DP_SPLIT_VAL, val_ids, 4, vocab);
        check_sampler(d, DP_SPLIT_TRAIN, ids, count);
    } else {
        size_t ntr = count / 10 * 9 + count % 10 * 9 / 10;
        FUZZ_CHECK(dp_token_data_total(d) == count, "total %zu, want %zu", dp_token_data_total(d),
                   count);
        check_reads(d, DP_SPLIT_TRAIN, ids, ntr, vocab);
        check_reads(d, DP_SPLIT_VAL, ids + 2 * ntr, count - ntr, vocab);
        check_sampler(d, DP_SPLIT_TRAIN, ids, ntr);
        check_sampler(d, DP_SPLIT_VAL, ids + 2 * ntr, count - ntr);
    }
    dp_token_data_destroy(d);
}

// ----------------------------------------------------------------------------
// the token table

/* The oracle: whether f[0..n) is a token table; *V and *eot. */
static int table_valid(const uint8_t *f, size_t n, size_t *V, int32_t *eot)
{
    if (n < 1024 || get32(f) != 20240328) return 0;
    uint32_t version = get32(f + 4), v = get32(f + 8);
    if (version != 1 && version != 2) return 0;
    if (v == 0 || v > INT32_MAX) return 0;
    if (version == 1 && v != 50257) return 0;
    uint32_t e = version == 1 ? 50256 : get32(f + 12);
    if (e >= v) return 0;
    size_t p = 1024;
    for (uint32_t i = 0; i < v; i++) {
        if (p >= n || f[p] == 0 || f[p] > n - p - 1) return 0;
        p += 1 + f[p];
    }
    if (p != n) return 0;
    *V = v;
    *eot = (int32_t)e;
    return 1;
}

static void fuzz_table(const uint8_t *f, size_t n)
{
    char path[600];
    snprintf(path, sizeof path, "%s/tok.bin", fuzz_dir());
    fuzz_write_file(path, f, n);
    size_t V = 0;
    int32_t eot = -1;
    int valid = table_valid(f, n, &V, &eot);
    dp_clear_error();
    dp_tokenizer *t = (dp_tokenizer *)1;
    dp_status st = dp_tokenizer_load_llmc(path, &t);
    if (!valid) {
        check_refused(st, t, "tok.bin");
        return;
    }
    FUZZ_CHECK(st == DP_OK, "a valid table was refused");
    FUZZ_CHECK(dp_tokenizer_kind_of(t) == DP_TOKENIZER_LLMC, "kind");
    FUZZ_CHECK(dp_tokenizer_vocab_size(t) == V, "V %zu, want %zu", dp_tokenizer_vocab_size(t), V);
    FUZZ_CHECK(dp_tokenizer_eot_id(t) == eot, "eot %d, want %d", (int)dp_tokenizer_eot_id(t),
               (int)eot);
    int32_t *all = malloc(V * sizeof *all);
    FUZZ_CHECK(all, "out of memory");
    size_t p = 1024, total = 0;
    for (size_t i = 0; i < V; i++) {
        const char *b = NULL;
        size_t len = 0;
        FUZZ_CHECK(dp_tokenizer_token(t, (int32_t)i, &b, &len) == DP_OK, "token %zu", i);
        FUZZ_CHECK(len == f[p] && memcmp(b, f + p + 1, len) == 0, "token %zu's bytes", i);
        p += 1 + f[p];
        total += len;
        all[i] = (int32_t)i;
    }
    char *text = NULL;
    size_t tlen = 0;
    FUZZ_CHECK(dp_tokenizer_decode(t, all, V, &text, &tlen) == DP_OK && tlen == total,
               "decode of every id");
    free(text);
    const char *b;
    size_t l;
    FUZZ_CHECK(dp_tokenizer_token(t, (int32_t)V, &b, &l) == DP_ERR_INVALID_ARGUMENT, "id V");
    int32_t ids[1];
    size_t k = 0;
    FUZZ_CHECK(dp_tokenizer_encode(t, "a", 1, ids, 1, &k, NULL) == DP_ERR_UNSUPPORTED, "encode");
    char *json = NULL;
    FUZZ_CHECK(dp_tokenizer_serialize(t, &json) == DP_ERR_UNSUPPORTED && !json, "serialize");
    free(all);
    dp_tokenizer_destroy(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    uint8_t mode = data[0];
    if (mode & 1) fuzz_table(data + 1, size - 1);
    else fuzz_data(data + 1, size - 1, (mode & 2) != 0, (mode & 4) ? 300 : 65536);
    return 0;
}
