/*
 * io/hash.h - the byte-string hash and table sizing shared by the
 * tokenizers' open-addressing tables (tokenizer.c, bpe.c).
 */
#ifndef DP_IO_HASH_H
#define DP_IO_HASH_H

#include <stddef.h>
#include <stdint.h>

/* FNV-1a (Fowler, Noll, Vo), 64-bit, of p[0..n). */
static inline uint64_t io_hash_bytes(const char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

/* The smallest power of two >= n, at least 16 (a table's capacity). */
static inline size_t io_pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
}

#endif /* DP_IO_HASH_H */
