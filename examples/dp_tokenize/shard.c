/*
 * examples/dp_tokenize/shard.c - the llm.c shard writer (shard.h).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <dp/atomic_file.h>
#include <dp/data.h>

#include "dp_cli.h"
#include "report.h"
#include "shard.h"

struct tok_shard {
    dp_atomic_file *af;
    char *path;
    size_t count;        /* ids written */
    unsigned char *buf;  /* little-endian uint16 staging */
    size_t buf_cap;      /* ids it holds */
};

static void put_le32(unsigned char *b, uint32_t v)
{
    for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> (8 * i));
}

/* The header for count ids. */
static void header(unsigned char h[DP_LLMC_HEADER_BYTES], size_t count)
{
    memset(h, 0, DP_LLMC_HEADER_BYTES);
    put_le32(h, DP_LLMC_DATA_MAGIC);
    put_le32(h + 4, DP_LLMC_DATA_VERSION);
    put_le32(h + 8, (uint32_t)count);
}

int tok_shard_open(const char *path, tok_shard **out)
{
    *out = NULL;
    tok_shard *s = calloc(1, sizeof *s);
    char *p = strdup(path);
    if (!s || !p) {
        free(s);
        free(p);
        return tok_fail("out of memory");
    }
    s->path = p;
    if (dp_atomic_file_open(path, &s->af) != DP_OK) {
        int rc = tok_fail("cannot write --out '%s': %s", path, strerror(errno));
        free(p);
        free(s);
        return rc;
    }
    cli_guard_temp(s->af, "--out");
    // A zero count for now: the real header is written at the end.
    unsigned char h[DP_LLMC_HEADER_BYTES];
    header(h, 0);
    if (dp_atomic_file_write(s->af, h, sizeof h) != DP_OK) {
        int rc = tok_fail("writing '%s' failed: %s", path, strerror(errno));
        tok_shard_abort(s);
        return rc;
    }
    *out = s;
    return 0;
}

int tok_shard_append(tok_shard *s, const int32_t *ids, size_t n)
{
    if (n > (size_t)INT32_MAX - s->count)
        return tok_fail("'%s' would hold more than %d tokens, the most llm.c's int32 header "
                        "count can say: encode the inputs into several shards",
                        s->path, INT32_MAX);
    if (n > s->buf_cap) {
        unsigned char *b = realloc(s->buf, 2 * n);
        if (!b) return tok_fail("out of memory (%zu bytes for '%s')", 2 * n, s->path);
        s->buf = b;
        s->buf_cap = n;
    }
    for (size_t i = 0; i < n; i++) {
        s->buf[2 * i] = (unsigned char)(ids[i] & 0xff);
        s->buf[2 * i + 1] = (unsigned char)((ids[i] >> 8) & 0xff);
    }
    if (dp_atomic_file_write(s->af, s->buf, 2 * n) != DP_OK)
        return tok_fail("writing '%s' failed: %s", s->path, strerror(errno));
    s->count += n;
    return 0;
}

int tok_shard_commit(tok_shard *s)
{
    unsigned char h[DP_LLMC_HEADER_BYTES];
    header(h, s->count);
    int fd = dp_atomic_file_fd(s->af);
    size_t done = 0;
    while (done < sizeof h) {
        ssize_t k = pwrite(fd, h + done, sizeof h - done, (off_t)done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            int rc = tok_fail("writing the header of '%s' failed: %s", s->path,
                              k < 0 ? strerror(errno) : "nothing written");
            tok_shard_abort(s);
            return rc;
        }
        done += (size_t)k;
    }
    int rc = 0;
    if (dp_atomic_file_commit(s->af) != DP_OK)
        rc = tok_fail("cannot complete '%s': %s", s->path, strerror(errno));
    cli_guard_temp(NULL, NULL); /* renamed, or removed by the commit */
    free(s->buf);
    free(s->path);
    free(s);
    return rc;
}

void tok_shard_abort(tok_shard *s)
{
    if (!s) return;
    dp_atomic_file_abort(s->af);
    cli_guard_temp(NULL, NULL);
    free(s->buf);
    free(s->path);
    free(s);
}
