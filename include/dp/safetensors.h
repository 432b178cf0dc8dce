/*
 * dp/safetensors.h - reading and writing safetensors checkpoints.
 *
 * The format (https://github.com/huggingface/safetensors): an 8-byte
 * little-endian unsigned header length N, N bytes of a JSON object, then
 * the data section. Each tensor is an entry
 *   "name": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [b, e]}
 * whose row-major bytes lie at [b, e) relative to the start of the data
 * section; an optional "__metadata__" entry maps strings to strings. The
 * files dp writes load with Python's `safetensors` package and PyTorch.
 *
 * Host memory only: move tensors to or from a device with dp_copy_h2d /
 * dp_copy_d2h. Handles are not thread-safe; distinct handles are
 * independent.
 */
#ifndef DP_SAFETENSORS_H
#define DP_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "dp/dtype.h"
#include "dp/export.h"
#include "dp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Most dimensions of one tensor. */
#define DP_ST_MAX_DIMS 8

/* Largest JSON header dp reads or writes (bytes). */
#define DP_ST_MAX_HEADER ((size_t)100 << 20)

/* --- writer -------------------------------------------------------------- */

typedef struct dp_st_writer dp_st_writer;

/* Creates an empty writer. Free it with dp_st_writer_destroy.
 * Errors: DP_ERR_INVALID_ARGUMENT (out NULL), DP_ERR_OUT_OF_MEMORY. */
DP_API dp_status dp_st_writer_create(dp_st_writer **out);

/* Frees the writer (never the tensor data it points at). NULL is a no-op. */
DP_API void dp_st_writer_destroy(dp_st_writer *w);

/*
 * Adds a tensor: name (copied), dtype, shape[0..ndim) (copied; 0 <= ndim
 * <= DP_ST_MAX_DIMS, ndim 0 is a scalar of one element; dimensions may be
 * 0) and `data`, host memory holding prod(shape) * dp_dtype_size(dtype)
 * row-major bytes. The bytes are NOT copied: `data` must stay valid and
 * unchanged until dp_st_writer_write returns (so a checkpoint of views into
 * a flat parameter buffer costs no extra memory). data may be NULL only
 * when the tensor has 0 bytes. Tensors are laid out in the file in the
 * order they are added, without padding between them.
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL, empty or non-UTF-8 name, the
 * name "__metadata__", a name already added, unknown dtype, bad ndim, NULL
 * shape with ndim > 0, byte size overflowing size_t, NULL data),
 * DP_ERR_OUT_OF_MEMORY.
 */
DP_API dp_status dp_st_writer_add(dp_st_writer *w, const char *name, dp_dtype dtype,
                                  const size_t *shape, int ndim, const void *data);

/* Sets metadata key -> value (both copied, NUL-terminated UTF-8; setting a
 * key again replaces its value). Stored in "__metadata__" in the order
 * keys were first set.
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL arguments, empty key, a string that
 * is not valid UTF-8), DP_ERR_OUT_OF_MEMORY. */
DP_API dp_status dp_st_writer_set_metadata(dp_st_writer *w, const char *key, const char *value);

/*
 * Writes the file atomically: the bytes go to a temporary file beside path
 * ("<path>.tmp.<pid>.<n>.<host>"), which is written in full, fsync'ed and renamed
 * over path; then the directory is fsync'ed. On any failure the temporary
 * file is removed and a file already at path is left untouched, so path
 * always holds either the old or the new checkpoint. The same tensors and
 * metadata always give the same bytes. The header is padded with spaces
 * so the data section starts at an offset that is a multiple of 8.
 * The writer keeps its contents and may write again.
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL), DP_ERR_IO (with the path and the
 * system's reason: missing or unwritable directory, disk full, ...),
 * DP_ERR_OUT_OF_MEMORY, DP_ERR_FORMAT (header over DP_ST_MAX_HEADER).
 */
DP_API dp_status dp_st_writer_write(dp_st_writer *w, const char *path);

/* --- reader -------------------------------------------------------------- */

typedef struct dp_st_file dp_st_file;

/* One tensor of an open file. Everything it points at is owned by the file
 * and valid until dp_st_close. */
typedef struct dp_st_tensor {
    const char *name;
    dp_dtype dtype;
    int ndim;                      /* 0..DP_ST_MAX_DIMS */
    size_t shape[DP_ST_MAX_DIMS];  /* shape[ndim..] are 0 */
    size_t numel;                  /* product of shape (1 for a scalar) */
    size_t nbytes;                 /* numel * dp_dtype_size(dtype) */
    size_t offset;                 /* of the bytes, relative to the data section */
    /* The row-major bytes (read-only). Aligned to the element size when the
     * data section offset is (always true for files dp writes whose earlier
     * tensors have sizes that are multiples of it, e.g. all F32 and I64);
     * otherwise read them with memcpy. */
    const void *data;
} dp_st_tensor;

/*
 * Opens path, maps it into memory and validates it completely before
 * returning: length field, header size (<= DP_ST_MAX_HEADER and inside the
 * file), JSON syntax, every entry's dtype, shape (non-negative integers,
 * at most DP_ST_MAX_DIMS), data_offsets (two integers, begin <= end),
 * byte size = numel * element size (overflow-checked) = end - begin,
 * offsets inside the data section, tensors contiguous without gaps or
 * overlaps covering the data section exactly, unique names, and string
 * metadata values. Close with dp_st_close.
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL), DP_ERR_IO (cannot open or read:
 * the message has the path and reason), DP_ERR_FORMAT (the message names
 * the file and the exact problem), DP_ERR_OUT_OF_MEMORY.
 */
DP_API dp_status dp_st_open(const char *path, dp_st_file **out);

/* Unmaps and frees everything. NULL is a no-op. */
DP_API void dp_st_close(dp_st_file *f);

/* The path the file was opened with (owned by f). */
DP_API const char *dp_st_path(const dp_st_file *f);

/* Number of tensors. */
DP_API size_t dp_st_count(const dp_st_file *f);

/* Tensor i, 0 <= i < dp_st_count, in data-offset order (the order they
 * were added, for files dp writes); NULL when i is out of range. */
DP_API const dp_st_tensor *dp_st_tensor_at(const dp_st_file *f, size_t i);

/* The tensor called name, or NULL if there is none. */
DP_API const dp_st_tensor *dp_st_find(const dp_st_file *f, const char *name);

/*
 * Checked lookup for loading a model: the tensor called name must exist,
 * have dtype and exactly the shape shape[0..ndim). On success *data points
 * at its bytes (owned by f). Errors: DP_ERR_INVALID_ARGUMENT (NULL
 * arguments), DP_ERR_FORMAT with the file, the tensor and what differs
 * (missing, dtype, shape as "[768, 3072]" vs expected).
 */
DP_API dp_status dp_st_expect(const dp_st_file *f, const char *name, dp_dtype dtype,
                              const size_t *shape, int ndim, const void **data);

/* The metadata value for key, or NULL if absent (owned by f). */
DP_API const char *dp_st_metadata(const dp_st_file *f, const char *key);

/* Number of metadata entries, and entry i's key and value (file order);
 * dp_st_metadata_at returns DP_ERR_INVALID_ARGUMENT when i is out of range. */
DP_API size_t dp_st_metadata_count(const dp_st_file *f);
DP_API dp_status dp_st_metadata_at(const dp_st_file *f, size_t i, const char **key,
                                   const char **value);

#ifdef __cplusplus
}
#endif

#endif /* DP_SAFETENSORS_H */
