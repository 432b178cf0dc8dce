/*
 * io/safetensors_write.c - safetensors checkpoints: the atomic writer
 * (dp/safetensors.h; its header written with jansson).
 *
 * Layout: u64 little-endian header length N | N bytes of JSON, padded with
 * spaces | data section. Tensor data_offsets are relative to the data
 * section and tile it exactly (io/safetensors_read.c checks them).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "dp/atomic_file.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/shape.h"
#include "dp/checked.h"
#include "dp/safetensors.h"
#include "dp/tokenizer.h" /* dp_utf8_check */


typedef struct st_entry {
    char *name;
    dp_dtype dtype;
    int ndim;
    size_t shape[DP_ST_MAX_DIMS];
    size_t nbytes;
    const void *data; // borrowed until dp_st_writer_write returns
} st_entry;

struct dp_st_writer {
    st_entry *t;
    size_t n, cap;
    char **meta_key, **meta_val;
    size_t n_meta, cap_meta;
};

/* JSON strings must be UTF-8 (jansson refuses the rest when it writes
 * the header). Checked without allocating, so that a failed allocation
 * is not reported as invalid text. */
static int utf8_valid(const char *s)
{
    return dp_utf8_check(s, strlen(s), NULL) == DP_OK;
}

dp_status dp_st_writer_create(dp_st_writer **out)
{
    if (!out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = calloc(1, sizeof **out);
    if (!*out) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate a safetensors writer");
    return DP_OK;
}

void dp_st_writer_destroy(dp_st_writer *w)
{
    if (!w) return;
    for (size_t i = 0; i < w->n; i++) free(w->t[i].name);
    for (size_t i = 0; i < w->n_meta; i++) {
        free(w->meta_key[i]);
        free(w->meta_val[i]);
    }
    free(w->t);
    free(w->meta_key);
    free(w->meta_val);
    free(w);
}

dp_status dp_st_writer_add(dp_st_writer *w, const char *name, dp_dtype dtype,
                           const size_t *shape, int ndim, const void *data)
{
    if (!w || !name) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "writer or name is NULL");
    if (!*name) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "tensor name is empty");
    if (strcmp(name, "__metadata__") == 0)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "'__metadata__' is reserved by the format and cannot name a tensor");
    if (!utf8_valid(name))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "a tensor name is not valid UTF-8 (JSON strings "
                       "must be)");
    if (dp_dtype_size(dtype) == 0)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "tensor '%s': unknown dtype %d", name, (int)dtype);
    if (ndim < 0 || ndim > DP_ST_MAX_DIMS)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "tensor '%s': ndim %d is outside 0..%d", name,
                       ndim, DP_ST_MAX_DIMS);
    if (ndim > 0 && !shape)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "tensor '%s': shape is NULL with ndim %d", name,
                       ndim);
    for (int i = 0; i < ndim; i++)
        if (shape[i] > (size_t)INT64_MAX)
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "tensor '%s': shape[%d] = %zu is too large",
                           name, i, shape[i]);
    size_t numel, nbytes;
    if (!dp_shape_bytes(shape, ndim, dp_dtype_size(dtype), &numel, &nbytes) ||
        nbytes > (size_t)INT64_MAX)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "tensor '%s': byte size overflows", name);
    if (nbytes > 0 && !data)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "tensor '%s': data is NULL for %zu bytes", name,
                       nbytes);
    for (size_t i = 0; i < w->n; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                           "tensor '%s' was already added: names must be unique", name);
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 16;
        st_entry *t = realloc(w->t, cap * sizeof *t);
        if (!t) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot grow the tensor list");
        w->t = t;
        w->cap = cap;
    }
    st_entry *e = &w->t[w->n];
    memset(e, 0, sizeof *e);
    e->name = strdup(name);
    if (!e->name) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot copy tensor name '%s'", name);
    e->dtype = dtype;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++) e->shape[i] = shape[i];
    e->nbytes = nbytes;
    e->data = data;
    w->n++;
    return DP_OK;
}

dp_status dp_st_writer_set_metadata(dp_st_writer *w, const char *key, const char *value)
{
    if (!w || !key || !value)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "writer, key or value is NULL");
    if (!*key) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "metadata key is empty");
    if (!utf8_valid(key) || !utf8_valid(value))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "metadata '%s': key and value must be valid UTF-8 (JSON strings)", key);
    char *v = strdup(value);
    if (!v) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot copy metadata value");
    for (size_t i = 0; i < w->n_meta; i++) {
        if (strcmp(w->meta_key[i], key) == 0) {
            free(w->meta_val[i]);
            w->meta_val[i] = v;
            return DP_OK;
        }
    }
    if (w->n_meta == w->cap_meta) {
        size_t cap = w->cap_meta ? 2 * w->cap_meta : 8;
        char **k = realloc(w->meta_key, cap * sizeof *k);
        if (k) w->meta_key = k;
        char **vv = k ? realloc(w->meta_val, cap * sizeof *vv) : NULL;
        if (vv) w->meta_val = vv;
        if (!k || !vv) {
            free(v);
            return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot grow the metadata list");
        }
        w->cap_meta = cap;
    }
    char *k = strdup(key);
    if (!k) {
        free(v);
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot copy metadata key");
    }
    w->meta_key[w->n_meta] = k;
    w->meta_val[w->n_meta] = v;
    w->n_meta++;
    return DP_OK;
}

// The header JSON text (malloc'd, compact, keys in insertion order), or NULL.
static dp_status build_header(const dp_st_writer *w, char **out)
{
    *out = NULL;
    json_t *root = json_object();
    if (!root) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot build the header");
    int bad = 0;
    if (w->n_meta > 0) {
        json_t *meta = json_object();
        bad |= meta == NULL || json_object_set_new(root, "__metadata__", meta) != 0;
        for (size_t i = 0; !bad && i < w->n_meta; i++)
            bad |= json_object_set_new(meta, w->meta_key[i], json_string(w->meta_val[i])) != 0;
    }
    size_t offset = 0;
    for (size_t i = 0; !bad && i < w->n; i++) {
        const st_entry *e = &w->t[i];
        if (e->nbytes > (size_t)INT64_MAX - offset) {
            json_decref(root);
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "the data section exceeds 2^63 bytes");
        }
        json_t *shape = json_array();
        bad |= shape == NULL;
        for (int d = 0; !bad && d < e->ndim; d++)
            bad |= json_array_append_new(shape, json_integer((json_int_t)e->shape[d])) != 0;
        json_t *offs = json_array();
        bad |= offs == NULL;
        if (!bad) {
            bad |= json_array_append_new(offs, json_integer((json_int_t)offset)) != 0;
            bad |= json_array_append_new(offs, json_integer((json_int_t)(offset + e->nbytes))) != 0;
        }
        json_t *t = json_object();
        bad |= t == NULL;
        if (!bad) {
            // Sets decref their value on failure too, so nothing leaks.
            bad |= json_object_set_new(t, "dtype", json_string(dp_dtype_name(e->dtype))) != 0;
            bad |= json_object_set_new(t, "shape", shape) != 0;
            shape = NULL;
            bad |= json_object_set_new(t, "data_offsets", offs) != 0;
            offs = NULL;
            bad |= json_object_set_new(root, e->name, t) != 0;
            t = NULL;
        }
        json_decref(shape);
        json_decref(offs);
        json_decref(t);
        offset += e->nbytes;
    }
    char *text = bad ? NULL : json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!text) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot build the JSON header");
    *out = text;
    return DP_OK;
}

dp_status dp_st_writer_write(dp_st_writer *w, const char *path)
{
    if (!w || !path || !*path) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "writer or path is NULL/empty");
    char *header = NULL;
    DP_TRY(build_header(w, &header));
    size_t hlen = strlen(header);
    size_t padded = (hlen + 7) & ~(size_t)7; // data starts at 8 + padded, a multiple of 8
    if (padded > DP_ST_MAX_HEADER) {
        free(header);
        return DP_FAIL(DP_ERR_FORMAT, "'%s': header of %zu bytes exceeds the %zu-byte limit",
                       path, padded, DP_ST_MAX_HEADER);
    }
    char *hbuf = malloc(8 + padded);
    if (!hbuf) {
        free(header);
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate the header");
    }
    for (int i = 0; i < 8; i++) hbuf[i] = (char)(((uint64_t)padded >> (8 * i)) & 0xff);
    memcpy(hbuf + 8, header, hlen);
    memset(hbuf + 8 + hlen, ' ', padded - hlen);
    free(header);

    dp_atomic_file *af = NULL;
    dp_status st = dp_atomic_file_open(path, &af);
    if (st != DP_OK) {
        free(hbuf);
        return st;
    }
    st = dp_atomic_file_write(af, hbuf, 8 + padded);
    if (st != DP_OK) dp_error_prefix("writing the header of '%s'", path);
    for (size_t i = 0; st == DP_OK && i < w->n; i++) {
        if (!w->t[i].nbytes) continue;
        st = dp_atomic_file_write(af, w->t[i].data, w->t[i].nbytes);
        if (st != DP_OK)
            dp_error_prefix("writing tensor '%s' (%zu bytes) to '%s'", w->t[i].name,
                            w->t[i].nbytes, path);
    }
    free(hbuf);
    if (st != DP_OK) {
        dp_atomic_file_abort(af);
        return st;
    }
    return dp_atomic_file_commit(af);
}
