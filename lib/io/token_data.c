/*
 * io/token_data.c - the representation of a token dataset (token_data.h),
 * shared by its two makers: text_data.c (tokens in memory) and
 * token_files.c (nanoGPT's and llm.c's files mapped read-only): reading a
 * range of tokens from either, releasing the mappings, destroying a
 * dataset, and the directory listings both readers walk.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/error.h"
#include "io/token_data.h"

// ----------------------------------------------------------------------------
// reading and releasing

void token_files_release(dp_token_data *d)
{
    if (!d) return;
    for (size_t i = 0; i < d->n_maps; i++) {
        if (d->maps[i].addr) munmap(d->maps[i].addr, d->maps[i].bytes);
        free(d->maps[i].path);
    }
    free(d->maps);
    free(d->segs);
    d->maps = NULL;
    d->segs = NULL;
    d->n_maps = d->n_segs = 0;
}

dp_status token_data_copy(const dp_token_data *d, size_t pos, size_t count, int32_t *out)
{
    if (d->tokens) {
        memcpy(out, d->tokens + pos, count * sizeof *out);
        return DP_OK;
    }
    // The last segment starting at or before pos (segments are in sequence order).
    size_t lo = 0, hi = d->n_segs;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (d->segs[mid].start <= pos) lo = mid;
        else hi = mid;
    }
    size_t vocab = d->vocab;
    for (size_t s = lo; count > 0; s++) {
        const token_segment *g = &d->segs[s];
        size_t i = pos - g->start, k = g->n - i < count ? g->n - i : count;
        const unsigned char *b = g->ids + 2 * i;
        for (size_t j = 0; j < k; j++) {
            uint32_t id = (uint32_t)b[2 * j] | (uint32_t)b[2 * j + 1] << 8;
            if (id >= vocab)
                return DP_FAIL(DP_ERR_FORMAT,
                               "'%s': token %zu (byte offset %zu) is id %u, outside the "
                               "vocabulary [0, %zu); give the model a vocabulary of at least "
                               "%u, or check the file",
                               g->path, i + j, g->file_offset + 2 * (i + j), id, vocab, id + 1);
            out[j] = (int32_t)id;
        }
        out += k;
        pos += k;
        count -= k;
    }
    return DP_OK;
}

void dp_token_data_destroy(dp_token_data *data)
{
    if (!data) return;
    token_files_release(data);
    free(data->tokens);
    free(data);
}

// ----------------------------------------------------------------------------
// directory listings

int token_cmp_names(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

char *token_join_path(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (a == 0 || dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}
