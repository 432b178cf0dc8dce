/*
 * io/text_data.c - corpus loading (a file or a directory of text files),
 * token datasets with a 90/10 train/validation split, the seeded random
 * batch sampler with a resumable state, and fixed validation windows.
 * The sampler and the windows read tokens through token_data_copy, so
 * they work alike on data in memory and on files mapped by token_files.c.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

// Index of split's first token in the whole sequence.
static size_t split_start(const dp_token_data *data, dp_split split)
{
    return split == DP_SPLIT_VAL ? data->n_train : 0;
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
                       "tokens %zu..%zu are past the end of the %s split (%zu tokens)", first,
                       first + (count - 1), dp_split_name(split), n);
    return token_data_copy(data, split_start(data, split) + first, count, out);
}

// ----------------------------------------------------------------------------
// random batch sampler

// "dpSAMP" + format version 1 in the low 16 bits.
#define SAMPLER_TAG 0x6470534d50000001ULL

struct dp_sampler {
    const dp_token_data *data; // borrowed
    size_t start;              // the split's first token in data's sequence
    size_t n;
    size_t context;
    dp_rng rng;
    uint64_t batches, windows;
};

dp_status dp_sampler_create(const dp_token_data *data, dp_split split, size_t context,
                            uint64_t seed, dp_sampler **out)
{
    if (!out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    if (!data) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "data is NULL");
    if (split != DP_SPLIT_TRAIN && split != DP_SPLIT_VAL)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "unknown split %d", (int)split);
    if (context == 0) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "context must be >= 1");
    size_t n = dp_token_data_size(data, split);
    if (n < 2 || context > n - 1)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "context %zu is longer than the %s split (%zu tokens; a window needs "
                       "context + 1); use a smaller context or more data",
                       context, dp_split_name(split), n);
    dp_sampler *s = calloc(1, sizeof *s);
    if (!s) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate a sampler");
    s->data = data;
    s->start = split_start(data, split);
    s->n = n;
    s->context = context;
    dp_rng_seed(&s->rng, seed);
    *out = s;
    return DP_OK;
}

void dp_sampler_destroy(dp_sampler *s) { free(s); }

dp_status dp_sampler_next(dp_sampler *s, int32_t *inputs, int32_t *targets, size_t B)
{
    if (!s || !inputs || !targets)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "sampler, inputs or targets is NULL");
    if (B == 0) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "B must be >= 1");
    size_t T = s->context;
    if (B > SIZE_MAX / T / sizeof(int32_t))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "B %zu x T %zu overflows", B, T);
    uint64_t starts = (uint64_t)(s->n - T); // window start in [0, n - T - 1]
    dp_rng saved = s->rng;                  // restored on error: the sampler is unchanged
    for (size_t b = 0; b < B; b++) {
        size_t p = s->start + (size_t)dp_rng_below(&s->rng, starts);
        dp_status st = token_data_copy(s->data, p, T, inputs + b * T); // (B,T)
        if (st == DP_OK) st = token_data_copy(s->data, p + 1, T, targets + b * T); // (B,T)
        if (st != DP_OK) {
            s->rng = saved;
            return st;
        }
    }
    s->windows += B;
    s->batches++;
    return DP_OK;
}

uint64_t dp_sampler_batches(const dp_sampler *s) { return s ? s->batches : 0; }

dp_status dp_sampler_get_state(const dp_sampler *s, uint64_t state[DP_SAMPLER_STATE_WORDS])
{
    if (!s || !state) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "sampler or state is NULL");
    state[0] = SAMPLER_TAG;
    for (int i = 0; i < 4; i++) state[1 + i] = s->rng.s[i];
    state[5] = s->batches;
    state[6] = s->windows;
    state[7] = (uint64_t)s->context;
    state[8] = (uint64_t)s->n;
    return DP_OK;
}

dp_status dp_sampler_set_state(dp_sampler *s, const uint64_t state[DP_SAMPLER_STATE_WORDS])
{
    if (!s || !state) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "sampler or state is NULL");
    if (state[0] != SAMPLER_TAG)
        return DP_FAIL(DP_ERR_FORMAT,
                       "sampler state has tag 0x%016" PRIx64 ", expected 0x%016llx: not a "
                       "sampler state of this dp version",
                       state[0], (unsigned long long)SAMPLER_TAG);
    if (!(state[1] | state[2] | state[3] | state[4]))
        return DP_FAIL(DP_ERR_FORMAT, "sampler state has an all-zero rng state (never produced "
                       "by dp_rng_seed)");
    if (state[7] != (uint64_t)s->context || state[8] != (uint64_t)s->n)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "sampler state was saved for context %" PRIu64 " over %" PRIu64
                       " tokens, but this sampler has context %zu over %zu tokens: resume with "
                       "the same context, corpus and tokenizer",
                       state[7], state[8], s->context, s->n);
    for (int i = 0; i < 4; i++) s->rng.s[i] = state[1 + i];
    s->batches = state[5];
    s->windows = state[6];
    return DP_OK;
}

dp_status dp_sampler_state_format(const uint64_t state[DP_SAMPLER_STATE_WORDS], char *buf,
                                  size_t cap)
{
    if (!state || !buf) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "state or buf is NULL");
    if (cap < DP_SAMPLER_STATE_CHARS)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "buf holds %zu bytes, needs %d", cap,
                       DP_SAMPLER_STATE_CHARS);
    for (int i = 0; i < DP_SAMPLER_STATE_WORDS; i++)
        snprintf(buf + 17 * i, 18, "%016" PRIx64 "%s", state[i],
                 i + 1 < DP_SAMPLER_STATE_WORDS ? "," : "");
    return DP_OK;
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

dp_status dp_sampler_state_parse(const char *text, uint64_t state[DP_SAMPLER_STATE_WORDS])
{
    if (!text || !state) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "text or state is NULL");
    uint64_t w[DP_SAMPLER_STATE_WORDS];
    const char *p = text;
    for (int i = 0; i < DP_SAMPLER_STATE_WORDS; i++) {
        uint64_t v = 0;
        for (int k = 0; k < 16; k++, p++) {
            int d = hex_digit(*p);
            if (d < 0)
                return DP_FAIL(DP_ERR_FORMAT,
                               "sampler state text: word %d is not 16 hex digits (at offset "
                               "%zu)",
                               i, (size_t)(p - text));
            v = (v << 4) | (uint64_t)d;
        }
        w[i] = v;
        char want = i + 1 < DP_SAMPLER_STATE_WORDS ? ',' : '\0';
        if (*p != want)
            return DP_FAIL(DP_ERR_FORMAT,
                           "sampler state text: expected %s after word %d (offset %zu); it "
                           "needs %d comma-separated words",
                           want ? "','" : "the end", i, (size_t)(p - text),
                           DP_SAMPLER_STATE_WORDS);
        p++;
    }
    memcpy(state, w, sizeof w);
    return DP_OK;
}

// ----------------------------------------------------------------------------
// validation windows

size_t dp_eval_window_count(const dp_token_data *data, dp_split split, size_t context)
{
    size_t n = dp_token_data_size(data, split);
    if (context == 0 || n < 2 || context > n - 1) return 0;
    return (n - 1) / context;
}

dp_status dp_eval_windows(const dp_token_data *data, dp_split split, size_t context,
                          size_t first, size_t count, int32_t *inputs, int32_t *targets)
{
    if (!data || !inputs || !targets)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "data, inputs or targets is NULL");
    if (split != DP_SPLIT_TRAIN && split != DP_SPLIT_VAL)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "unknown split %d", (int)split);
    if (context == 0 || count == 0)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "context and count must be >= 1");
    size_t nw = dp_eval_window_count(data, split, context);
    if (first > nw || count > nw - first)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "windows %zu..%zu are past the %zu windows of context %zu in the %s "
                       "split (%zu tokens)",
                       first, first + count - 1, nw, context, dp_split_name(split),
                       dp_token_data_size(data, split));
    size_t T = context, start = split_start(data, split);
    for (size_t r = 0; r < count; r++) {
        size_t w = start + (first + r) * T;
        DP_TRY(token_data_copy(data, w, T, inputs + r * T));      // (count,T)
        DP_TRY(token_data_copy(data, w + 1, T, targets + r * T)); // (count,T)
    }
    return DP_OK;
}
