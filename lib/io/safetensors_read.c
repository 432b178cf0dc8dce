/*
 * io/safetensors_read.c - safetensors checkpoints: the validating reader
 * (dp/safetensors.h; the header parsed with jansson).
 *
 * Layout: u64 little-endian header length N | N bytes of JSON, padded with
 * spaces | data section. Tensor data_offsets are relative to the data
 * section and must tile it exactly.
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
#include "io/json_load.h"

struct dp_st_file {
    char *path;
    unsigned char *buf; // the whole file
    size_t size;
    int mapped;         // buf from mmap (else malloc)
    dp_st_tensor *t;    // data-offset order
    size_t n;
    size_t *by_name;    // indices into t sorted by name
    char **meta_key, **meta_val;
    size_t n_meta;
};

void dp_st_close(dp_st_file *f)
{
    if (!f) return;
    if (f->buf) {
        if (f->mapped) munmap(f->buf, f->size);
        else free(f->buf);
    }
    for (size_t i = 0; i < f->n; i++) free((char *)f->t[i].name);
    for (size_t i = 0; i < f->n_meta; i++) {
        free(f->meta_key[i]);
        free(f->meta_val[i]);
    }
    free(f->t);
    free(f->by_name);
    free(f->meta_key);
    free(f->meta_val);
    free(f->path);
    free(f);
}

static dp_status load_bytes(dp_st_file *f)
{
    // Non-blocking: a FIFO is refused below, not waited on for ever in open().
    int fd = open(f->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return DP_FAIL(DP_ERR_IO, "cannot open '%s': %s", f->path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return DP_FAIL(DP_ERR_IO, "cannot stat '%s': %s", f->path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return DP_FAIL(DP_ERR_IO, "'%s' is not a regular file", f->path);
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        close(fd);
        return DP_FAIL(DP_ERR_IO, "'%s' is too large to map", f->path);
    }
    f->size = (size_t)sb.st_size;
    if (f->size < 8) {
        close(fd);
        return DP_FAIL(DP_ERR_FORMAT,
                       "'%s' is %zu bytes, shorter than the 8-byte header length: truncated "
                       "or not a safetensors file",
                       f->path, f->size);
    }
    void *p = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p != MAP_FAILED) {
        f->buf = p;
        f->mapped = 1;
        close(fd);
        return DP_OK;
    }
    // Filesystems without mmap: read it.
    f->buf = malloc(f->size);
    if (!f->buf) {
        close(fd);
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes for '%s'", f->size,
                       f->path);
    }
    size_t got = 0;
    while (got < f->size) {
        ssize_t k = read(fd, f->buf + got, f->size - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            int e = k < 0 ? errno : 0;
            close(fd);
            if (k == 0)
                return DP_FAIL(DP_ERR_IO, "'%s' shrank while being read", f->path);
            return DP_FAIL(DP_ERR_IO, "reading '%s' failed: %s", f->path, strerror(e));
        }
        got += (size_t)k;
    }
    close(fd);
    return DP_OK;
}

// A non-negative JSON integer as size_t.
static int json_size(const json_t *j, size_t *out)
{
    if (!json_is_integer(j)) return 0;
    json_int_t v = json_integer_value(j);
    if (v < 0 || (unsigned long long)v > SIZE_MAX) return 0;
    *out = (size_t)v;
    return 1;
}

static dp_status parse_tensor(dp_st_file *f, const char *name, json_t *obj, size_t data_size,
                              dp_st_tensor *t)
{
    const char *path = f->path;
    if (!json_is_object(obj))
        return DP_FAIL(DP_ERR_FORMAT, "'%s': tensor '%s': entry is not a JSON object", path, name);
    const char *key;
    json_t *val;
    json_object_foreach(obj, key, val)
    {
        if (strcmp(key, "dtype") != 0 && strcmp(key, "shape") != 0 &&
            strcmp(key, "data_offsets") != 0)
            return DP_FAIL(DP_ERR_FORMAT,
                           "'%s': tensor '%s': unknown key '%s' (expected dtype, shape, "
                           "data_offsets)",
                           path, name, key);
    }
    json_t *jd = json_object_get(obj, "dtype");
    json_t *js = json_object_get(obj, "shape");
    json_t *jo = json_object_get(obj, "data_offsets");
    if (!jd || !js || !jo)
        return DP_FAIL(DP_ERR_FORMAT, "'%s': tensor '%s': missing \"%s\"", path, name,
                       !jd ? "dtype" : !js ? "shape" : "data_offsets");
    if (!json_is_string(jd))
        return DP_FAIL(DP_ERR_FORMAT, "'%s': tensor '%s': dtype is not a string", path, name);
    if (!dp_dtype_from_name(json_string_value(jd), &t->dtype))
        return DP_FAIL(DP_ERR_FORMAT,
                       "'%s': tensor '%s': unknown dtype \"%s\" (dp reads F32, F64, F16, BF16, "
                       "I64, I32, I16, I8, U64, U32, U16, U8, BOOL)",
                       path, name, json_string_value(jd));
    if (!json_is_array(js))
        return DP_FAIL(DP_ERR_FORMAT, "'%s': tensor '%s': shape is not an array", path, name);
    if (json_array_size(js) > DP_ST_MAX_DIMS)
        return DP_FAIL(DP_ERR_FORMAT, "'%s': tensor '%s': shape has %zu dimensions, dp reads "
                       "at most %d", path, name, json_array_size(js), DP_ST_MAX_DIMS);
    t->ndim = (int)json_array_size(js);
    for (int d = 0; d < t->ndim; d++)
        if (!json_size(json_array_get(js, (size_t)d), &t->shape[d]))
            return DP_FAIL(DP_ERR_FORMAT,
                           "'%s': tensor '%s': shape[%d] is not a non-negative integer", path,
                           name, d);
    size_t b, e;
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_size(json_array_get(jo, 0), &b) ||
        !json_size(json_array_get(jo, 1), &e))
        return DP_FAIL(DP_ERR_FORMAT,
                       "'%s': tensor '%s': data_offsets is not two non-negative integers", path,
                       name);
    if (b > e)
        return DP_FAIL(DP_ERR_FORMAT, "'%s': tensor '%s': data_offsets [%zu, %zu] has begin > end",
                       path, name, b, e);
    char sbuf[256];
    if (!dp_shape_bytes(t->shape, t->ndim, dp_dtype_size(t->dtype), &t->numel, &t->nbytes))
        return DP_FAIL(DP_ERR_FORMAT, "'%s': tensor '%s': shape %s of %s overflows the byte size",
                       path, name, dp_shape_text(sbuf, sizeof sbuf, t->shape, t->ndim),
                       dp_dtype_name(t->dtype));
    if (t->nbytes != e - b)
        return DP_FAIL(DP_ERR_FORMAT,
                       "'%s': tensor '%s': shape %s of %s is %zu bytes but data_offsets [%zu, "
                       "%zu] hold %zu",
                       path, name, dp_shape_text(sbuf, sizeof sbuf, t->shape, t->ndim),
                       dp_dtype_name(t->dtype), t->nbytes, b, e, e - b);
    if (e > data_size)
        return DP_FAIL(DP_ERR_FORMAT,
                       "'%s': tensor '%s': data_offsets [%zu, %zu] run past the %zu-byte data "
                       "section: truncated file or bad offsets",
                       path, name, b, e, data_size);
    t->offset = b;
    t->name = strdup(name);
    if (!t->name) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot copy a tensor name");
    return DP_OK;
}

static dp_status parse_metadata(dp_st_file *f, json_t *meta)
{
    if (!json_is_object(meta))
        return DP_FAIL(DP_ERR_FORMAT, "'%s': __metadata__ is not a JSON object", f->path);
    size_t n = json_object_size(meta);
    f->meta_key = calloc(n ? n : 1, sizeof *f->meta_key);
    f->meta_val = calloc(n ? n : 1, sizeof *f->meta_val);
    if (!f->meta_key || !f->meta_val)
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate metadata");
    const char *key;
    json_t *val;
    json_object_foreach(meta, key, val)
    {
        if (!*key)
            return DP_FAIL(DP_ERR_FORMAT, "'%s': __metadata__ has an empty key, which the "
                           "writer never produces", f->path);
        if (!json_is_string(val))
            return DP_FAIL(DP_ERR_FORMAT, "'%s': __metadata__ value for key '%s' is not a string",
                           f->path, key);
        f->meta_key[f->n_meta] = strdup(key);
        f->meta_val[f->n_meta] = strdup(json_string_value(val));
        f->n_meta++;
        if (!f->meta_key[f->n_meta - 1] || !f->meta_val[f->n_meta - 1])
            return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot copy metadata");
    }
    return DP_OK;
}

static int cmp_offset(const void *a, const void *b)
{
    const dp_st_tensor *x = a, *y = b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

// qsort has no context argument: the tensors being sorted by name.
static _Thread_local const dp_st_tensor *sort_tensors;

static int cmp_name_idx(const void *a, const void *b)
{
    return strcmp(sort_tensors[*(const size_t *)a].name, sort_tensors[*(const size_t *)b].name);
}

static dp_status parse_header(dp_st_file *f)
{
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | f->buf[i];
    if (n > (uint64_t)(f->size - 8))
        return DP_FAIL(DP_ERR_FORMAT,
                       "'%s': header length %llu runs past the end of the %zu-byte file: "
                       "truncated or not a safetensors file",
                       f->path, (unsigned long long)n, f->size);
    if (n > DP_ST_MAX_HEADER)
        return DP_FAIL(DP_ERR_FORMAT, "'%s': header length %llu exceeds the %zu-byte limit",
                       f->path, (unsigned long long)n, DP_ST_MAX_HEADER);
    if (n == 0) return DP_FAIL(DP_ERR_FORMAT, "'%s': header length is 0", f->path);
    size_t hlen = (size_t)n;
    size_t data_size = f->size - 8 - hlen;
    const unsigned char *data = f->buf + 8 + hlen;

    json_error_t jerr;
    json_t *root = json_loadb((const char *)f->buf + 8, hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root && dp_json_load_out_of_memory(&jerr))
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "'%s': out of host memory parsing its header",
                       f->path);
    if (!root)
        return DP_FAIL(DP_ERR_FORMAT, "'%s': header is not valid JSON: %s (line %d, column %d)%s",
                       f->path, jerr.text, jerr.line, jerr.column,
                       strstr(jerr.text, "duplicate")
                           ? ": tensor names and metadata keys must be unique"
                           : "");
    dp_status st = DP_OK;
    if (!json_is_object(root)) {
        st = DP_FAIL(DP_ERR_FORMAT, "'%s': header is a JSON value but not an object", f->path);
        goto out;
    }
    size_t cap = json_object_size(root);
    f->t = calloc(cap ? cap : 1, sizeof *f->t);
    f->by_name = calloc(cap ? cap : 1, sizeof *f->by_name);
    if (!f->t || !f->by_name) {
        st = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate the tensor table");
        goto out;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        if (strcmp(key, "__metadata__") == 0) {
            st = parse_metadata(f, val);
        } else if (!*key) {
            /* The writer refuses empty names, so the reader does too: every
             * file it accepts can be written back. */
            st = DP_FAIL(DP_ERR_FORMAT, "'%s': a tensor has an empty name", f->path);
        } else {
            st = parse_tensor(f, key, val, data_size, &f->t[f->n]);
            if (st == DP_OK) f->n++;
        }
        if (st != DP_OK) goto out;
    }
    // Tile check: sorted by offset, each tensor starts where the last ended.
    qsort(f->t, f->n, sizeof *f->t, cmp_offset);
    size_t expect = 0;
    for (size_t i = 0; i < f->n; i++) {
        dp_st_tensor *t = &f->t[i];
        if (t->offset < expect) {
            st = DP_FAIL(DP_ERR_FORMAT,
                         "'%s': tensor '%s' at data offsets [%zu, %zu] overlaps tensor '%s' "
                         "which ends at %zu",
                         f->path, t->name, t->offset, t->offset + t->nbytes, f->t[i - 1].name,
                         expect);
            goto out;
        }
        if (t->offset > expect) {
            st = DP_FAIL(DP_ERR_FORMAT,
                         "'%s': data bytes [%zu, %zu) before tensor '%s' belong to no tensor "
                         "(a gap in data_offsets)",
                         f->path, expect, t->offset, t->name);
            goto out;
        }
        expect = t->offset + t->nbytes;
        t->data = data + t->offset;
    }
    if (expect != data_size) {
        st = DP_FAIL(DP_ERR_FORMAT,
                     "'%s': the tensors cover %zu bytes but the data section has %zu: trailing "
                     "bytes belong to no tensor",
                     f->path, expect, data_size);
        goto out;
    }
    for (size_t i = 0; i < f->n; i++) f->by_name[i] = i;
    sort_tensors = f->t;
    qsort(f->by_name, f->n, sizeof *f->by_name, cmp_name_idx);
    sort_tensors = NULL;
    for (size_t i = 1; i < f->n; i++) {
        // JSON_REJECT_DUPLICATES already refused these; kept as a guard.
        if (strcmp(f->t[f->by_name[i]].name, f->t[f->by_name[i - 1]].name) == 0) {
            st = DP_FAIL(DP_ERR_FORMAT, "'%s': tensor name '%s' appears twice", f->path,
                         f->t[f->by_name[i]].name);
            goto out;
        }
    }
out:
    json_decref(root);
    return st;
}

dp_status dp_st_open(const char *path, dp_st_file **out)
{
    if (!out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    if (!path || !*path) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "path is NULL or empty");
    dp_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate a safetensors reader");
    }
    dp_status st = load_bytes(f);
    if (st == DP_OK) st = parse_header(f);
    if (st != DP_OK) {
        dp_st_close(f);
        return st;
    }
    *out = f;
    return DP_OK;
}

const char *dp_st_path(const dp_st_file *f) { return f ? f->path : NULL; }

size_t dp_st_count(const dp_st_file *f) { return f ? f->n : 0; }

const dp_st_tensor *dp_st_tensor_at(const dp_st_file *f, size_t i)
{
    return f && i < f->n ? &f->t[i] : NULL;
}

const dp_st_tensor *dp_st_find(const dp_st_file *f, const char *name)
{
    if (!f || !name) return NULL;
    size_t lo = 0, hi = f->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->t[f->by_name[mid]].name, name);
        if (c == 0) return &f->t[f->by_name[mid]];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

dp_status dp_st_expect(const dp_st_file *f, const char *name, dp_dtype dtype,
                       const size_t *shape, int ndim, const void **data)
{
    if (!f || !name || !data || (ndim > 0 && !shape))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "file, name, shape or data is NULL");
    *data = NULL;
    if (ndim < 0 || ndim > DP_ST_MAX_DIMS)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "ndim %d is outside 0..%d", ndim, DP_ST_MAX_DIMS);
    const dp_st_tensor *t = dp_st_find(f, name);
    if (!t) return DP_FAIL(DP_ERR_FORMAT, "'%s' has no tensor named '%s'", f->path, name);
    if (t->dtype != dtype)
        return DP_FAIL(DP_ERR_FORMAT, "'%s': tensor '%s' is %s, expected %s", f->path, name,
                       dp_dtype_name(t->dtype), dp_dtype_name(dtype));
    int same = t->ndim == ndim;
    for (int d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
    if (!same) {
        char a[256], b[256];
        return DP_FAIL(DP_ERR_FORMAT, "'%s': tensor '%s' has shape %s, expected %s", f->path,
                       name, dp_shape_text(a, sizeof a, t->shape, t->ndim),
                       dp_shape_text(b, sizeof b, shape, ndim));
    }
    *data = t->data;
    return DP_OK;
}

const char *dp_st_metadata(const dp_st_file *f, const char *key)
{
    if (!f || !key) return NULL;
    for (size_t i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_key[i], key) == 0) return f->meta_val[i];
    return NULL;
}

size_t dp_st_metadata_count(const dp_st_file *f) { return f ? f->n_meta : 0; }

dp_status dp_st_metadata_at(const dp_st_file *f, size_t i, const char **key, const char **value)
{
    if (!f || !key || !value)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "file, key or value is NULL");
    if (i >= f->n_meta)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "metadata index %zu is out of range (%zu entries)",
                       i, f->n_meta);
    *key = f->meta_key[i];
    *value = f->meta_val[i];
    return DP_OK;
}
