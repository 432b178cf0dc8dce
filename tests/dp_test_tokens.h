/*
 * tests/dp_test_tokens.h - small pre-tokenized fixture files, written by
 * the tests themselves (no binary is committed), byte by byte in
 * little-endian as nanoGPT's and llm.c's scripts write them:
 *   raw uint16 ids (nanoGPT's train.bin / val.bin);
 *   llm.c shards: 256 int32 header (magic, version, count), uint16 ids;
 *   llm.c's tokenizer file: 256 uint32 header (magic, version, V, EOT),
 *   then V records of a length byte and that many bytes; token i of the
 *   fixture table is " w<i>" (e.g. " w7"), so decoded text is checkable.
 * Include after dp_test.h (Criterion).
 */
#ifndef DP_TEST_TOKENS_H
#define DP_TEST_TOKENS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/data.h"
#include "dp/tokenizer.h"

static inline void dp_test_put_le32(unsigned char *b, uint32_t v)
{
    for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> (8 * i));
}

/* ids[0..n) as little-endian uint16 bytes (malloc'd, 2n bytes). */
static inline unsigned char *dp_test_u16_bytes(const int32_t *ids, size_t n)
{
    unsigned char *b = malloc(2 * n + 1);
    cr_assert_not_null(b);
    for (size_t i = 0; i < n; i++) {
        b[2 * i] = (unsigned char)(ids[i] & 0xff);
        b[2 * i + 1] = (unsigned char)((ids[i] >> 8) & 0xff);
    }
    return b;
}

static inline void dp_test_put_file(const char *path, const void *a, size_t na, const void *b,
                                    size_t nb)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot create %s", path);
    if (na) cr_assert_eq(fwrite(a, 1, na, f), na);
    if (nb) cr_assert_eq(fwrite(b, 1, nb, f), nb);
    cr_assert_eq(fclose(f), 0);
}

/* nanoGPT: raw uint16 ids. */
static inline void dp_test_write_raw(const char *path, const int32_t *ids, size_t n)
{
    unsigned char *b = dp_test_u16_bytes(ids, n);
    dp_test_put_file(path, b, 2 * n, NULL, 0);
    free(b);
}

/* llm.c shard with the given header words (magic, version, count) and
 * ids[0..n) after it: the count need not be n, to make bad files. */
static inline void dp_test_write_llmc_header(const char *path, uint32_t magic, uint32_t version,
                                             uint32_t count, const int32_t *ids, size_t n)
{
    unsigned char h[DP_LLMC_HEADER_BYTES];
    memset(h, 0, sizeof h);
    dp_test_put_le32(h, magic);
    dp_test_put_le32(h + 4, version);
    dp_test_put_le32(h + 8, count);
    unsigned char *b = dp_test_u16_bytes(ids, n);
    dp_test_put_file(path, h, sizeof h, b, 2 * n);
    free(b);
}

/* A good llm.c shard of ids[0..n). */
static inline void dp_test_write_llmc(const char *path, const int32_t *ids, size_t n)
{
    dp_test_write_llmc_header(path, DP_LLMC_DATA_MAGIC, DP_LLMC_DATA_VERSION, (uint32_t)n, ids, n);
}

/* The bytes of the fixture token i: " w<i>". */
static inline size_t dp_test_token_text(size_t i, char *buf, size_t cap)
{
    return (size_t)snprintf(buf, cap, " w%zu", i);
}

/* llm.c's tokenizer file with V fixture tokens, header words as given
 * (version 1 ignores eot), into a malloc'd buffer of *len bytes. */
static inline unsigned char *dp_test_llmc_tokenizer_bytes(uint32_t version, uint32_t V_header,
                                                          size_t V, uint32_t eot, size_t *len)
{
    size_t cap = DP_LLMC_TOKENIZER_HEADER_BYTES + V * 16 + 16;
    unsigned char *b = calloc(1, cap);
    cr_assert_not_null(b);
    dp_test_put_le32(b, DP_LLMC_TOKENIZER_MAGIC);
    dp_test_put_le32(b + 4, version);
    dp_test_put_le32(b + 8, V_header);
    if (version >= 2) dp_test_put_le32(b + 12, eot);
    size_t k = DP_LLMC_TOKENIZER_HEADER_BYTES;
    for (size_t i = 0; i < V; i++) {
        char t[32];
        size_t n = dp_test_token_text(i, t, sizeof t);
        b[k++] = (unsigned char)n;
        memcpy(b + k, t, n);
        k += n;
    }
    *len = k;
    return b;
}

/* A good version-2 tokenizer file of V tokens, EOT V - 1. */
static inline void dp_test_write_llmc_tokenizer(const char *path, size_t V)
{
    size_t len = 0;
    unsigned char *b = dp_test_llmc_tokenizer_bytes(2, (uint32_t)V, V, (uint32_t)(V - 1), &len);
    dp_test_put_file(path, b, len, NULL, 0);
    free(b);
}

#endif /* DP_TEST_TOKENS_H */
