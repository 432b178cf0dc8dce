/*
 * io/tokenizer_llmc.c - llm.c's GPT-2 token table (gpt2_tokenizer.bin),
 * loaded to decode only (dp_tokenizer_load_llmc).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "dp/checked.h"
#include "dp/tokenizer.h"
#include "io/file.h"
#include "io/tokenizer_internal.h"

// ----------------------------------------------------------------------------
// llm.c's token table (gpt2_tokenizer.bin, written by llm.c's train_gpt2.py)
//
// A header of 256 little-endian uint32: [0] magic 20240328, [1] version
// (1: no EOT field, GPT-2's 50257 tokens with EOT 50256; 2: [3] is the EOT
// id), [2] the number of tokens V; then V records of a uint8 length
// (1..255) and that many bytes.

#define LLMC_DATA_MAGIC 20240520 /* a token shard, passed here by mistake */

static uint32_t tok_le32(const unsigned char *b)
{
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* Reads exactly n bytes from fd into buf; 0, or -1 with errno (0 at EOF). */
static int read_full(int fd, unsigned char *buf, size_t n)
{
    while (n > 0) {
        ssize_t k = read(fd, buf, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            if (k == 0) errno = 0;
            return -1;
        }
        buf += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Checks the records of body[0..len) (after the header) and builds the
 * table; body becomes the tokenizer's pool (freed with it). */
static dp_status llmc_table(const char *path, unsigned char *body, size_t len, size_t V,
                            int32_t eot, dp_tokenizer **out)
{
    size_t bytes = 0;
    int fits = dp_size_mul(V, sizeof(size_t), &bytes);
    dp_tokenizer *t = calloc(1, sizeof *t);
    size_t *off = fits ? malloc(bytes) : NULL, *lens = fits ? malloc(bytes) : NULL;
    if (!t || !off || !lens) {
        free(t);
        free(off);
        free(lens);
        free(body);
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate a table of %zu tokens", V);
    }
    t->kind = DP_TOKENIZER_LLMC;
    t->vocab = V;
    t->eot = eot;
    t->tok_off = off;
    t->tok_len = lens;
    t->pool = (char *)body;
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    size_t p = 0;
    dp_status st = DP_OK;
    for (size_t i = 0; i < V; i++) {
        size_t at = DP_LLMC_TOKENIZER_HEADER_BYTES + p; // offset in the file
        if (p >= len) {
            st = DP_FAIL(DP_ERR_FORMAT,
                         "'%s' is cut short: it ends at byte %zu, before token %zu of the %zu "
                         "its header announces; re-create it (llm.c's train_gpt2.py)",
                         path, at, i, V);
            break;
        }
        size_t n = body[p];
        if (n == 0) {
            st = DP_FAIL(DP_ERR_FORMAT,
                         "'%s': token %zu has a zero length byte (at byte %zu); every token is "
                         "1..255 bytes, so the file is corrupt; re-create it",
                         path, i, at);
            break;
        }
        if (n > len - p - 1) {
            st = DP_FAIL(DP_ERR_FORMAT,
                         "'%s' is cut short: token %zu needs %zu bytes after byte %zu but the "
                         "file ends at byte %zu; re-create it",
                         path, i, n, at, DP_LLMC_TOKENIZER_HEADER_BYTES + len);
            break;
        }
        off[i] = p + 1;
        lens[i] = n;
        p += 1 + n;
    }
    if (st == DP_OK && p != len)
        st = DP_FAIL(DP_ERR_FORMAT,
                     "'%s' has %zu bytes past its last token (token %zu ends at byte %zu): the "
                     "header's vocabulary size %zu is wrong or the file is corrupt",
                     path, len - p, V - 1, DP_LLMC_TOKENIZER_HEADER_BYTES + p, V);
    if (st != DP_OK) {
        dp_tokenizer_destroy(t);
        return st;
    }
    *out = t;
    return DP_OK;
}

dp_status dp_tokenizer_load_llmc(const char *path, dp_tokenizer **out)
{
    if (!out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    if (!path || !*path) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "the path is NULL or empty");
    const char *what = "llm.c tokenizer file (gpt2_tokenizer.bin)";
    struct stat sb;
    if (stat(path, &sb) != 0)
        return DP_FAIL(DP_ERR_IO, "cannot read the %s '%s': %s", what, path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return DP_FAIL(DP_ERR_FORMAT,
                       "the %s '%s' is not a regular file (it is a %s); pass the file llm.c's "
                       "train_gpt2.py writes",
                       what, path, dp_file_kind(sb.st_mode));
    // Non-blocking, so a FIFO swapped in after stat is refused, not waited on.
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return DP_FAIL(DP_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    dp_status st = DP_OK;
    unsigned char *body = NULL;
    unsigned char h[DP_LLMC_TOKENIZER_HEADER_BYTES];
    size_t size = 0, V = 0;
    int32_t eot = -1;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = DP_FAIL(DP_ERR_FORMAT, "'%s' is not a regular file", path);
        goto done;
    }
    if ((uintmax_t)sb.st_size > (uintmax_t)SIZE_MAX / 2) {
        st = DP_FAIL(DP_ERR_FORMAT, "'%s' is too large (%jd bytes) for a %s", path,
                     (intmax_t)sb.st_size, what);
        goto done;
    }
    size = (size_t)sb.st_size;
    if (size < DP_LLMC_TOKENIZER_HEADER_BYTES) {
        st = DP_FAIL(DP_ERR_FORMAT,
                     "'%s' has %zu bytes, less than the %d-byte header of an %s: it is cut "
                     "short or not such a file",
                     path, size, DP_LLMC_TOKENIZER_HEADER_BYTES, what);
        goto done;
    }
    if (read_full(fd, h, sizeof h) != 0) {
        st = DP_FAIL(DP_ERR_IO, "reading '%s' failed: %s", path,
                     errno ? strerror(errno) : "the file shrank while read");
        goto done;
    }
    uint32_t magic = tok_le32(h), version = tok_le32(h + 4), nv = tok_le32(h + 8);
    if (magic != DP_LLMC_TOKENIZER_MAGIC) {
        if (magic == LLMC_DATA_MAGIC)
            st = DP_FAIL(DP_ERR_FORMAT,
                         "'%s' is an llm.c token file (magic %d), not a tokenizer: it is "
                         "training data; the tokenizer is gpt2_tokenizer.bin",
                         path, LLMC_DATA_MAGIC);
        else if (h[0] == '{' || h[0] == '[') /* a JSON tokenizer without its name */
            st = DP_FAIL(DP_ERR_FORMAT,
                         "'%s' is not an %s but starts as JSON: a tokenizer.json or "
                         "encoder.json is told by its name; give it a name ending in .json",
                         path, what);
        else
            st = DP_FAIL(DP_ERR_FORMAT,
                         "'%s' is not an %s: its magic is %u, not %d", path, what, magic,
                         DP_LLMC_TOKENIZER_MAGIC);
        goto done;
    }
    if (version != 1 && version != 2) {
        st = DP_FAIL(DP_ERR_FORMAT,
                     "'%s': %s version %u; dp reads versions 1 and 2 (llm.c's train_gpt2.py "
                     "writes 2)",
                     path, what, version);
        goto done;
    }
    // Each token takes at least 2 bytes (length + 1 byte), at most 256.
    size_t rest = size - DP_LLMC_TOKENIZER_HEADER_BYTES;
    if (nv == 0 || nv > (uint32_t)INT32_MAX || (size_t)nv > rest / 2) {
        st = DP_FAIL(DP_ERR_FORMAT,
                     "'%s': the header's vocabulary size %u %s; the file is cut short or corrupt",
                     path, nv,
                     nv == 0                    ? "is zero"
                     : nv > (uint32_t)INT32_MAX ? "overflows an int32 id"
                                                : "cannot fit in the file (2 bytes a token at "
                                                  "least)");
        goto done;
    }
    V = nv;
    if (rest / 256 > V || (rest / 256 == V && rest % 256)) {
        st = DP_FAIL(DP_ERR_FORMAT,
                     "'%s': %zu bytes of records are more than %zu tokens of at most 255 bytes "
                     "can fill; the header's vocabulary size is wrong or the file is corrupt",
                     path, rest, V);
        goto done;
    }
    if (version == 1) {
        // No EOT field: llm.c takes it for GPT-2's, which fixes the size.
        if (V != DP_GPT2_VOCAB_SIZE) {
            st = DP_FAIL(DP_ERR_FORMAT,
                         "'%s': version 1 has no end-of-text field and holds GPT-2's %d "
                         "tokens, but the header says %zu; re-create it (version 2)",
                         path, DP_GPT2_VOCAB_SIZE, V);
            goto done;
        }
        eot = DP_GPT2_EOT;
    } else {
        uint32_t e = tok_le32(h + 12);
        if ((size_t)e >= V) {
            st = DP_FAIL(DP_ERR_FORMAT,
                         "'%s': the end-of-text id %u is outside the vocabulary [0, %zu); the "
                         "file is corrupt",
                         path, e, V);
            goto done;
        }
        eot = (int32_t)e;
    }
    body = malloc(rest);
    if (!body) {
        st = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes for '%s'", rest, path);
        goto done;
    }
    if (read_full(fd, body, rest) != 0) {
        st = DP_FAIL(DP_ERR_IO, "reading '%s' failed: %s", path,
                     errno ? strerror(errno) : "the file shrank while read");
        goto done;
    }
    close(fd);
    fd = -1;
    st = llmc_table(path, body, rest, V, eot, out); // owns body
    body = NULL;
done:
    if (fd >= 0) close(fd);
    free(body);
    return st;
}
