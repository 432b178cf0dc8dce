/*
 * tests/fuzz/fuzz_safetensors.c - libFuzzer harness for the safetensors
 * reader (dp_st_open and its queries) and, for files it accepts, the writer.
 *
 * The input is the whole file. Whatever dp_st_open accepts must satisfy the
 * format's invariants, checked against the raw input bytes:
 *   - every tensor's numel is the product of its shape, nbytes = numel *
 *     element size, [offset, offset + nbytes) lies in the data section and
 *     its bytes are the input's bytes there; the tensors tile the section;
 *   - lookups by name and dp_st_expect with the tensor's own dtype and shape
 *     find it; metadata lookups agree with the metadata list;
 *   - writing the tensors and metadata back with the writer and reopening
 *     the result gives the same tensors, bytes and metadata.
 * A rejected file must leave an error message and no handle.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/safetensors.h"
#include "fuzz_common.h"

static void check_tensors(const dp_st_file *f, const uint8_t *data, size_t size)
{
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | data[i];
    FUZZ_CHECK(hlen <= size - 8, "accepted header length %llu in a %zu-byte file",
               (unsigned long long)hlen, size);
    const uint8_t *section = data + 8 + hlen;
    size_t section_size = size - 8 - (size_t)hlen;

    size_t n = dp_st_count(f), covered = 0;
    for (size_t i = 0; i < n; i++) {
        const dp_st_tensor *t = dp_st_tensor_at(f, i);
        FUZZ_CHECK(t && t->name, "tensor %zu missing", i);
        FUZZ_CHECK(t->ndim >= 0 && t->ndim <= DP_ST_MAX_DIMS, "ndim %d", t->ndim);
        size_t numel = 1;
        for (int d = 0; d < t->ndim; d++) numel *= t->shape[d]; // checked below via nbytes
        for (int d = t->ndim; d < DP_ST_MAX_DIMS; d++)
            FUZZ_CHECK(t->shape[d] == 0, "shape[%d] beyond ndim is %zu", d, t->shape[d]);
        FUZZ_CHECK(numel == t->numel, "numel %zu vs product %zu", t->numel, numel);
        size_t es = dp_dtype_size(t->dtype);
        FUZZ_CHECK(es > 0, "dtype %d", (int)t->dtype);
        FUZZ_CHECK(t->numel == 0 || t->nbytes / t->numel == es, "nbytes %zu for numel %zu",
                   t->nbytes, t->numel);
        FUZZ_CHECK(t->nbytes % es == 0 && t->nbytes / es == t->numel, "nbytes %zu numel %zu",
                   t->nbytes, t->numel);
        FUZZ_CHECK(t->offset <= section_size && t->nbytes <= section_size - t->offset,
                   "tensor '%s' [%zu, +%zu) outside the %zu-byte section", t->name, t->offset,
                   t->nbytes, section_size);
        FUZZ_CHECK(t->offset == covered, "tensor %zu starts at %zu, previous ended at %zu", i,
                   t->offset, covered);
        covered += t->nbytes;
        FUZZ_CHECK(t->nbytes == 0 || memcmp(t->data, section + t->offset, t->nbytes) == 0,
                   "tensor '%s' bytes differ from the file", t->name);

        const dp_st_tensor *g = dp_st_find(f, t->name);
        FUZZ_CHECK(g == t, "dp_st_find('%s') gave %p, expected %p", t->name, (const void *)g,
                   (const void *)t);
        const void *p = NULL;
        dp_status st = dp_st_expect(f, t->name, t->dtype, t->shape, t->ndim, &p);
        FUZZ_CHECK(st == DP_OK && p == t->data, "dp_st_expect('%s') failed", t->name);
        if (t->ndim > 0) {
            size_t other[DP_ST_MAX_DIMS];
            memcpy(other, t->shape, sizeof other);
            other[0] += 1;
            st = dp_st_expect(f, t->name, t->dtype, other, t->ndim, &p);
            FUZZ_CHECK(st == DP_ERR_FORMAT && p == NULL, "wrong shape accepted for '%s'",
                       t->name);
        }
    }
    FUZZ_CHECK(covered == section_size, "tensors cover %zu of %zu bytes", covered, section_size);
    FUZZ_CHECK(dp_st_tensor_at(f, n) == NULL, "tensor_at(count) is not NULL");

    size_t m = dp_st_metadata_count(f);
    for (size_t i = 0; i < m; i++) {
        const char *k = NULL, *v = NULL;
        FUZZ_CHECK(dp_st_metadata_at(f, i, &k, &v) == DP_OK && k && v, "metadata %zu", i);
        FUZZ_CHECK(dp_st_metadata(f, k) == v, "metadata lookup of '%s'", k);
    }
    const char *k = NULL, *v = NULL;
    FUZZ_CHECK(dp_st_metadata_at(f, m, &k, &v) == DP_ERR_INVALID_ARGUMENT,
               "metadata index past the end accepted");
}

// Writes f's tensors and metadata with the writer and checks the reopened copy.
static void check_rewrite(const dp_st_file *f)
{
    dp_st_writer *w = NULL;
    FUZZ_CHECK(dp_st_writer_create(&w) == DP_OK, "writer_create");
    size_t n = dp_st_count(f), m = dp_st_metadata_count(f);
    for (size_t i = 0; i < n; i++) {
        const dp_st_tensor *t = dp_st_tensor_at(f, i);
        dp_status st = dp_st_writer_add(w, t->name, t->dtype, t->shape, t->ndim, t->data);
        FUZZ_CHECK(st == DP_OK, "writer refused tensor '%s' that the reader accepted", t->name);
    }
    for (size_t i = 0; i < m; i++) {
        const char *k, *v;
        dp_st_metadata_at(f, i, &k, &v);
        dp_status st = dp_st_writer_set_metadata(w, k, v);
        FUZZ_CHECK(st == DP_OK, "writer refused metadata '%s'", k);
    }
    char path[300];
    snprintf(path, sizeof path, "%s/rewrite.safetensors", fuzz_dir());
    dp_status st = dp_st_writer_write(w, path);
    FUZZ_CHECK(st == DP_OK, "writing back an accepted file failed");
    dp_st_file *g = NULL;
    st = dp_st_open(path, &g);
    FUZZ_CHECK(st == DP_OK, "reopening a written file failed");
    FUZZ_CHECK(dp_st_count(g) == n && dp_st_metadata_count(g) == m, "counts differ");
    for (size_t i = 0; i < n; i++) {
        const dp_st_tensor *a = dp_st_tensor_at(f, i), *b = dp_st_find(g, a->name);
        FUZZ_CHECK(b && b->dtype == a->dtype && b->ndim == a->ndim && b->nbytes == a->nbytes &&
                       memcmp(a->shape, b->shape, sizeof a->shape) == 0 &&
                       (a->nbytes == 0 || memcmp(a->data, b->data, a->nbytes) == 0),
                   "tensor '%s' changed in the round trip", a->name);
    }
    for (size_t i = 0; i < m; i++) {
        const char *k, *v;
        dp_st_metadata_at(f, i, &k, &v);
        const char *v2 = dp_st_metadata(g, k);
        FUZZ_CHECK(v2 && strcmp(v, v2) == 0, "metadata '%s' changed in the round trip", k);
    }
    dp_st_close(g);
    dp_st_writer_destroy(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[300];
    snprintf(path, sizeof path, "%s/input.safetensors", fuzz_dir());
    fuzz_write_file(path, data, size);
    dp_clear_error();
    dp_st_file *f = (dp_st_file *)1;
    dp_status st = dp_st_open(path, &f);
    if (st != DP_OK) {
        FUZZ_CHECK(f == NULL, "handle left after an error");
        FUZZ_CHECK(st == DP_ERR_FORMAT || st == DP_ERR_OUT_OF_MEMORY,
                   "unexpected status %d for a readable file", (int)st);
        FUZZ_CHECK_MESSAGE(st);
        return 0;
    }
    FUZZ_CHECK(strcmp(dp_st_path(f), path) == 0, "path");
    check_tensors(f, data, size);
    check_rewrite(f);
    dp_st_close(f);
    return 0;
}
