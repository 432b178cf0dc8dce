/*
 * io/text_data.c - corpus loading (a file or a directory of text files)
 * and token datasets with a 90/10 train/validation split (sampler.c: the
 * batches and windows read from them).
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "dp/data.h"
#include "dp/rng.h"
#include "io/file.h"
#include "io/token_data.h"

// ----------------------------------------------------------------------------
// corpus loading

// Appends the regular file at path to buf[*len..), growing *buf (capacity
// *cap). *got gets the file's length. Each piece is checked for a NUL byte
// as it arrives, so a binary file is refused at its first piece, not after
// the whole file was read.
static dp_status append_file(const char *path, char **buf, size_t *len, size_t *cap,
                             size_t *got)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) return DP_FAIL(DP_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    /* its size as opened: a file cut or grown while it is read is refused,
     * not trained on in part (a size of 0 says nothing: /proc's files) */
    struct stat sb;
    int sized = fstat(fileno(fp), &sb) == 0 && S_ISREG(sb.st_mode);
    size_t start = *len;
    for (;;) {
        if (*cap - *len < 65536) {
            size_t ncap = *cap ? *cap * 2 : 1 << 20;
            while (ncap - *len < 65536) ncap *= 2;
            char *nb = realloc(*buf, ncap);
            if (!nb) {
                fclose(fp);
                *len = start;
                return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot grow the corpus to %zu bytes",
                               ncap);
            }
            *buf = nb;
            *cap = ncap;
        }
        size_t k = fread(*buf + *len, 1, *cap - *len - 1, fp);
        const char *nul = memchr(*buf + *len, '\0', k);
        if (nul) {
            size_t off = (size_t)(nul - (*buf + start));
            fclose(fp);
            *len = start;
            return DP_FAIL(DP_ERR_FORMAT,
                           "'%s' contains a NUL byte at offset %zu: it looks like a binary file, "
                           "not text; pass a text file or a directory of text files",
                           path, off);
        }
        *len += k;
        if (k == 0) break;
    }
    int err = ferror(fp);
    int e = errno;
    fclose(fp);
    if (err) {
        *len = start;
        return DP_FAIL(DP_ERR_IO, "reading '%s' failed: %s", path, strerror(e));
    }
    *got = *len - start;
    if (sized && sb.st_size > 0 && (uintmax_t)*got != (uintmax_t)sb.st_size) {
        *len = start;
        return DP_FAIL(DP_ERR_IO, "'%s' changed while it was read (%jd bytes when opened, %zu "
                       "read): the data must not change during a run; run again once it is "
                       "complete", path, (intmax_t)sb.st_size, *got);
    }
    return DP_OK;
}

// Names the directory loader skips: dot-files, fortunes' *.dat and *.u8.
static int skipped_name(const char *name)
{
    size_t n = strlen(name);
    if (name[0] == '.') return 1;
    if (n >= 4 && strcmp(name + n - 4, ".dat") == 0) return 1;
    if (n >= 3 && strcmp(name + n - 3, ".u8") == 0) return 1;
    return 0;
}

// 1 if the directory entry at full should be read, 0 to skip it; -1 and an
// error recorded when it cannot be inspected.
static int usable_entry(const char *full, dp_status *st)
{
    struct stat lsb, sb;
    if (lstat(full, &lsb) != 0) {
        *st = DP_FAIL(DP_ERR_IO, "cannot inspect '%s': %s", full, strerror(errno));
        return -1;
    }
    if (S_ISLNK(lsb.st_mode)) {
        char target[4096];
        ssize_t k = readlink(full, target, sizeof target - 1);
        if (k < 0) {
            *st = DP_FAIL(DP_ERR_IO, "cannot read the symlink '%s': %s", full, strerror(errno));
            return -1;
        }
        target[k] = '\0';
        const char *base = strrchr(target, '/');
        base = base ? base + 1 : target;
        if (*base && skipped_name(base)) return 0;
    }
    if (stat(full, &sb) != 0) {
        *st = DP_FAIL(DP_ERR_IO, "cannot read '%s': %s%s", full, strerror(errno),
                      S_ISLNK(lsb.st_mode) ? " (a broken symlink?)" : "");
        return -1;
    }
    return S_ISREG(sb.st_mode) ? 1 : 0;
}

static dp_status load_dir(const char *path, char **buf, size_t *len, size_t *cap,
                          size_t *n_files)
{
    DIR *d = opendir(path);
    if (!d) return DP_FAIL(DP_ERR_IO, "cannot open the directory '%s': %s", path, strerror(errno));
    char **names = NULL;
    size_t n = 0, ncap = 0;
    dp_status st = DP_OK;
    struct dirent *de;
    for (;;) {
        errno = 0;
        de = readdir(d);
        if (!de) {
            if (errno)
                st = DP_FAIL(DP_ERR_IO, "cannot list the directory '%s': %s", path,
                             strerror(errno));
            break;
        }
        if (skipped_name(de->d_name)) continue;
        if (n == ncap) {
            ncap = ncap ? 2 * ncap : 64;
            char **nn = realloc(names, ncap * sizeof *nn);
            if (!nn) {
                st = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot list '%s'", path);
                break;
            }
            names = nn;
        }
        names[n] = strdup(de->d_name);
        if (!names[n]) {
            st = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot list '%s'", path);
            break;
        }
        n++;
    }
    closedir(d);
    if (st == DP_OK && n > 0) qsort(names, n, sizeof *names, token_cmp_names);
    size_t files = 0;
    for (size_t i = 0; st == DP_OK && i < n; i++) {
        char *full = token_join_path(path, names[i]);
        if (!full) {
            st = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot build a path");
            break;
        }
        int use = usable_entry(full, &st);
        if (use > 0) {
            size_t before = *len, got = 0;
            if (files > 0) (*buf)[(*len)++] = '\n'; // capacity: append_file keeps slack
            st = append_file(full, buf, len, cap, &got);
            if (st == DP_OK && got == 0) *len = before; // empty files add nothing
            else if (st == DP_OK) files++;
        }
        free(full);
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    if (st == DP_OK && files == 0)
        st = DP_FAIL(DP_ERR_FORMAT,
                     "the directory '%s' has no non-empty text files (dot-files, *.dat and "
                     "*.u8 are skipped)",
                     path);
    *n_files = files;
    return st;
}

dp_status dp_text_load(const char *path, char **text, size_t *len, size_t *n_files)
{
    if (!text || !len) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "text or len is NULL");
    *text = NULL;
    *len = 0;
    if (n_files) *n_files = 0;
    if (!path || !*path)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "the corpus path is NULL or empty; pass a text "
                       "file or a directory of text files");
    struct stat sb;
    if (stat(path, &sb) != 0) {
        int e = errno;
        return DP_FAIL(DP_ERR_IO, "cannot read the corpus '%s': %s; pass a text file or a "
                       "directory of text files", path, strerror(e));
    }
    char *buf = NULL;
    size_t n = 0, cap = 0, files = 0;
    dp_status st;
    if (S_ISDIR(sb.st_mode)) {
        st = load_dir(path, &buf, &n, &cap, &files);
    } else if (!S_ISREG(sb.st_mode)) {
        // A device, FIFO or socket has no end to read to (/dev/zero, /dev/urandom
        // would fill the host's memory) and no stable contents to split.
        return DP_FAIL(DP_ERR_FORMAT,
                       "the corpus '%s' is not a regular file or a directory (it is a %s); "
                       "pass a text file or a directory of text files",
                       path, dp_file_kind(sb.st_mode));
    } else {
        size_t got = 0;
        st = append_file(path, &buf, &n, &cap, &got);
        if (st == DP_OK && got == 0)
            st = DP_FAIL(DP_ERR_FORMAT, "the corpus file '%s' is empty", path);
        files = 1;
    }
    if (st != DP_OK) {
        free(buf);
        return st;
    }
    buf[n] = '\0'; // append_file leaves at least one spare byte
    *text = buf;
    *len = n;
    if (n_files) *n_files = files;
    return DP_OK;
}

// ----------------------------------------------------------------------------
// token data

const char *dp_split_name(dp_split split)
{
    switch (split) {
    case DP_SPLIT_TRAIN: return "training";
    case DP_SPLIT_VAL: return "validation";
    default: return "invalid split";
    }
}

dp_status dp_token_data_from_text(const dp_tokenizer *tok, const char *text, size_t len,
                                  dp_token_data **out)
{
    if (!out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    if (!tok || !text) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "tok or text is NULL");
    if (len == 0) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "the text is empty");
    if (len > SIZE_MAX / sizeof(int32_t))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "the text is too long (%zu bytes)", len);
    dp_token_data *d = calloc(1, sizeof *d);
    int32_t *ids = malloc(len * sizeof *ids); // a token covers >= 1 byte
    if (!d || !ids) {
        free(d);
        free(ids);
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate %zu token ids", len);
    }
    size_t n = 0, unk = 0;
    dp_status st = dp_tokenizer_encode(tok, text, len, ids, len, &n, &unk);
    if (st != DP_OK) {
        free(d);
        free(ids);
        return st;
    }
    int32_t *shrunk = realloc(ids, n * sizeof *ids);
    d->tokens = shrunk ? shrunk : ids;
    d->n = n;
    d->n_train = token_train_count(n);
    d->vocab = dp_tokenizer_vocab_size(tok);
    d->unknown = unk;
    *out = d;
    return DP_OK;
}

dp_status dp_token_data_from_tokens(const int32_t *tokens, size_t n, size_t vocab_size,
                                    dp_token_data **out)
{
    if (!out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    if (!tokens || n == 0) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "tokens is NULL or n is 0");
    if (vocab_size == 0 || vocab_size > INT32_MAX)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "vocab_size %zu is outside 1..INT32_MAX",
                       vocab_size);
    if (n > SIZE_MAX / sizeof(int32_t))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "n %zu is too large", n);
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || (size_t)tokens[i] >= vocab_size)
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                           "token %d at position %zu is outside the vocabulary [0, %zu)",
                           (int)tokens[i], i, vocab_size);
    dp_token_data *d = calloc(1, sizeof *d);
    int32_t *copy = malloc(n * sizeof *copy);
    if (!d || !copy) {
        free(d);
        free(copy);
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate %zu tokens", n);
    }
    memcpy(copy, tokens, n * sizeof *copy);
    d->tokens = copy;
    d->n = n;
    d->n_train = token_train_count(n);
    d->vocab = vocab_size;
    *out = d;
    return DP_OK;
}

size_t dp_token_data_total(const dp_token_data *data) { return data ? data->n : 0; }

size_t dp_token_data_vocab_size(const dp_token_data *data) { return data ? data->vocab : 0; }

size_t dp_token_data_unknown_count(const dp_token_data *data)
{
    return data ? data->unknown : 0;
}

size_t dp_token_data_size(const dp_token_data *data, dp_split split)
{
    if (!data) return 0;
    switch (split) {
    case DP_SPLIT_TRAIN: return data->n_train;
    case DP_SPLIT_VAL: return data->n - data->n_train;
    default: return 0;
    }
}

const int32_t *dp_token_data_tokens(const dp_token_data *data, dp_split split)
{
    if (!data || !data->tokens) return NULL;
    switch (split) {
    case DP_SPLIT_TRAIN: return data->tokens;
    case DP_SPLIT_VAL: return data->tokens + data->n_train;
    default: return NULL;
    }
}

dp_status dp_token_data_read(const dp_token_data *data, dp_split split, size_t first,
                             size_t count, int32_t *out)
{
    if (!data || !out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "data or out is NULL");
    if (split != DP_SPLIT_TRAIN && split != DP_SPLIT_VAL)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "unknown split %d", (int)split);
    if (count == 0) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "count must be >= 1");
    size_t n = dp_token_data_size(data, split);
    if (first > n || count > n - first)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "%zu tokens from token %zu pass the end of the %s split (%zu tokens)",
                       count, first, dp_split_name(split), n);
    return token_data_copy(data, token_split_start(data, split) + first, count, out);
}
