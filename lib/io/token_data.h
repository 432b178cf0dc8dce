/*
 * io/token_data.h - the representation of dp_token_data (token_data.c)
 * shared by text_data.c (data in memory, the sampler, the validation
 * windows) and token_files.c (nanoGPT and llm.c files mapped read-only).
 *
 * A dataset is one sequence of n tokens, the training split [0, n_train)
 * followed by the validation split [n_train, n). In memory it is an int32
 * array; from files it is a list of segments, each a file's uint16 ids in
 * its mapping, in sequence order (training files, then validation files).
 */
#ifndef DP_IO_TOKEN_DATA_H
#define DP_IO_TOKEN_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "dp/data.h"

/* One file's tokens within the sequence. */
typedef struct token_segment {
    const unsigned char *ids; /* (n) little-endian uint16, inside the file's mapping */
    size_t n;                 /* tokens */
    size_t start;             /* index of its first token in the sequence */
    size_t file_offset;       /* byte offset of ids in the file (the header's size) */
    const char *path;         /* the file, for messages (owned by the dataset) */
} token_segment;

/* One mapped file. */
typedef struct token_map {
    char *path;
    void *addr;
    size_t bytes;
} token_map;

struct dp_token_data {
    int32_t *tokens; /* (n) in memory, or NULL for files */
    size_t n, n_train;
    size_t vocab;
    size_t unknown;
    dp_token_format format;
    int split_by_files;
    size_t files[DP_SPLIT_COUNT];
    size_t ignored_files;
    token_segment *segs; /* (n_segs) in sequence order, files only */
    size_t n_segs;
    token_map *maps; /* (n_maps) */
    size_t n_maps;
};

/* The training split's length for one sequence of n tokens cut 90/10:
 * floor(0.9 n), without overflow or floating point. */
static inline size_t token_train_count(size_t n) { return n / 10 * 9 + n % 10 * 9 / 10; }

/*
 * Copies tokens [pos, pos + count) of the whole sequence (not of a split)
 * into out as int32; the range is known to be inside [0, n). For files,
 * ids >= vocab fail with DP_ERR_FORMAT naming the file and the index.
 */
dp_status token_data_copy(const dp_token_data *d, size_t pos, size_t count, int32_t *out);

/* Index of split's first token in the whole sequence. */
static inline size_t token_split_start(const dp_token_data *d, dp_split split)
{
    return split == DP_SPLIT_VAL ? d->n_train : 0;
}

/* Unmaps and frees the files of d; nothing for data in memory. */
void token_files_release(dp_token_data *d);

/* Directory listings, shared by the text and token readers:
 * dir + "/" + name, malloc'd (NULL when out of memory), and strcmp over
 * char * for qsort (byte order, so a listing sorts the same everywhere). */
char *token_join_path(const char *dir, const char *name);
int token_cmp_names(const void *a, const void *b);

#endif /* DP_IO_TOKEN_DATA_H */
