/*
 * io/token_files.c - pre-tokenized data on disk, as the field writes it:
 *   nanoGPT (data/<name>/prepare.py): train.bin and val.bin, raw little-endian
 *     uint16 GPT-2 ids, no header;
 *   llm.c (dev/data/<name>.py): shards *_train_*.bin and *_val_*.bin, a header
 *     of 256 little-endian int32 (magic 20240520, version 1, the token
 *     count) followed by that many little-endian uint16 ids.
 * Files are mapped read-only and never converted as a whole: a 10B-token
 * corpus is 20 GB of uint16, 40 GB as int32. token_data_copy converts the
 * ranges the sampler and the validation windows ask for, checking each id
 * against the vocabulary on the way.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "dp/checked.h"
#include "dp/data.h"
#include "io/file.h"
#include "io/token_data.h"

/* Other llm.c files someone may pass by mistake (dev/data/data_common.py,
 * train_gpt2.py): each is named in the refusal. */
#define LLMC_LLAMA3_MAGIC 20240801 /* llama-3 shards: uint32 ids */
#define LLMC_EVAL_MAGIC 20240522   /* HellaSwag / MMLU evaluation examples */
#define LLMC_TOKENIZER_MAGIC 20240328

/* How much of a refused .bin is searched for a NUL byte, to say whether
 * it would be text. */
#define TEXT_SNIFF_BYTES 65536

// ----------------------------------------------------------------------------
// helpers

static uint32_t le32(const unsigned char *b)
{
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

const char *dp_token_format_name(dp_token_format format)
{
    switch (format) {
    case DP_TOKEN_FORMAT_MEMORY: return "memory";
    case DP_TOKEN_FORMAT_NANOGPT: return "nanogpt";
    case DP_TOKEN_FORMAT_LLMC: return "llmc";
    default: return "invalid token format";
    }
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

// ----------------------------------------------------------------------------
// one file: map it, tell its format, check its header

/*
 * Maps the regular file at m->path read-only into m. The file is opened
 * non-blocking, so a FIFO put in its place is refused by fstat without
 * waiting for a writer, and nothing is read before the checks.
 */
static dp_status map_file(token_map *m)
{
    int fd = open(m->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return DP_FAIL(DP_ERR_IO, "cannot open '%s': %s", m->path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return DP_FAIL(DP_ERR_IO, "cannot inspect '%s': %s", m->path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return DP_FAIL(DP_ERR_FORMAT,
                       "'%s' is not a regular file (it is a %s); token data are files of "
                       "uint16 ids (nanoGPT's train.bin, llm.c's shards)",
                       m->path, dp_file_kind(sb.st_mode));
    }
    if (sb.st_size == 0) {
        close(fd);
        return DP_FAIL(DP_ERR_FORMAT,
                       "the token file '%s' is empty; re-create it (nanoGPT's prepare.py, "
                       "llm.c's dev/data scripts) or remove it",
                       m->path);
    }
    if ((uintmax_t)sb.st_size > (uintmax_t)SIZE_MAX) {
        close(fd);
        return DP_FAIL(DP_ERR_FORMAT, "'%s' (%jd bytes) is larger than this machine can map",
                       m->path, (intmax_t)sb.st_size);
    }
    size_t bytes = (size_t)sb.st_size;
    void *addr = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (addr == MAP_FAILED)
        return DP_FAIL(DP_ERR_IO, "cannot map '%s' (%zu bytes) read-only: %s", m->path, bytes,
                       strerror(e));
    m->addr = addr;
    m->bytes = bytes;
    return DP_OK;
}

/* The refusal of a file with no llm.c header and an odd size, saying
 * whether it would be text (which .bin names are not read as). */
static dp_status odd_size(const token_map *m)
{
    size_t look = m->bytes < TEXT_SNIFF_BYTES ? m->bytes : TEXT_SNIFF_BYTES;
    const unsigned char *nul = memchr(m->addr, '\0', look);
    char why[160];
    if (nul)
        snprintf(why, sizeof why, "; nor is it text (a NUL byte at offset %zu)",
                 (size_t)(nul - (const unsigned char *)m->addr));
    else
        snprintf(why, sizeof why,
                 "; it may be text (no NUL byte in its first %zu bytes): a name ending in .bin "
                 "is read as tokens, so rename it",
                 look);
    return DP_FAIL(DP_ERR_FORMAT,
                   "'%s' is not token data: %zu bytes is an odd size for 2-byte uint16 ids "
                   "(nanoGPT's .bin) and it has no llm.c header (magic %d)%s; re-create it if "
                   "it was cut short",
                   m->path, m->bytes, DP_LLMC_DATA_MAGIC, why);
}

/* An llm.c shard's header but for its magic: version 1, a token count
 * that is the file's size, the other 253 ints zero, as llm.c writes
 * them. Its header would otherwise be read as 512 raw tokens; raw ids
 * that match all of it (ids 1 and 0, then 503 zeros) are no real data. */
static int corrupt_llmc_header(const token_map *m)
{
    const unsigned char *b = m->addr;
    if (m->bytes < DP_LLMC_HEADER_BYTES || le32(b + 4) != DP_LLMC_DATA_VERSION) return 0;
    int32_t c = (int32_t)le32(b + 8);
    if (c <= 0 || m->bytes - DP_LLMC_HEADER_BYTES != 2 * (size_t)c) return 0;
    for (size_t i = 12; i < DP_LLMC_HEADER_BYTES; i++)
        if (b[i]) return 0;
    return 1;
}

/*
 * Tells m's format from its first 4 bytes and checks it: an llm.c shard's
 * header (version, count against the file's size), a raw file's size.
 * *n gets its number of tokens and *offset the byte offset of the first.
 */
static dp_status parse_file(const token_map *m, dp_token_format *format, size_t *n,
                            size_t *offset)
{
    const unsigned char *b = m->addr;
    uint32_t magic = m->bytes >= 4 ? le32(b) : 0;
    if (magic == LLMC_TOKENIZER_MAGIC)
        return DP_FAIL(DP_ERR_FORMAT,
                       "'%s' is an llm.c tokenizer file (magic %d), not token data; it decodes "
                       "samples (dp_tokenizer_load_llmc)",
                       m->path, LLMC_TOKENIZER_MAGIC);
    if (magic == LLMC_EVAL_MAGIC)
        return DP_FAIL(DP_ERR_FORMAT,
                       "'%s' is an llm.c evaluation file (magic %d: HellaSwag or MMLU "
                       "examples), not token data; move it out of the data",
                       m->path, LLMC_EVAL_MAGIC);
    if (magic == LLMC_LLAMA3_MAGIC)
        return DP_FAIL(DP_ERR_FORMAT,
                       "'%s' is an llm.c llama-3 shard (magic %d, uint32 ids), which dp does not "
                       "read; prepare the data for GPT-2 (uint16 ids, magic %d)",
                       m->path, LLMC_LLAMA3_MAGIC, DP_LLMC_DATA_MAGIC);
    if (magic != DP_LLMC_DATA_MAGIC) {
        if (corrupt_llmc_header(m))
            return DP_FAIL(DP_ERR_FORMAT,
                           "'%s' has an llm.c shard's header (version %d, %d tokens, the "
                           "file's size, the rest zero) but the magic %u, not %d: the header "
                           "is corrupt; re-create the file", m->path, DP_LLMC_DATA_VERSION,
                           (int)le32(b + 8), magic, DP_LLMC_DATA_MAGIC);
        if (m->bytes % 2) return odd_size(m);
        *format = DP_TOKEN_FORMAT_NANOGPT;
        *n = m->bytes / 2;
        *offset = 0;
        return DP_OK;
    }
    if (m->bytes < DP_LLMC_HEADER_BYTES)
        return DP_FAIL(DP_ERR_FORMAT,
                       "'%s' starts with llm.c's magic %d but has only %zu bytes, less than "
                       "the %d-byte header: the file was cut short; re-create it",
                       m->path, DP_LLMC_DATA_MAGIC, m->bytes, DP_LLMC_HEADER_BYTES);
    uint32_t version = le32(b + 4);
    if (version != DP_LLMC_DATA_VERSION)
        return DP_FAIL(DP_ERR_FORMAT,
                       "'%s' is an llm.c token file of version %u; dp reads version %d (GPT-2 "
                       "uint16 ids): re-create it with llm.c's dev/data scripts",
                       m->path, version, DP_LLMC_DATA_VERSION);
    int32_t count = (int32_t)le32(b + 8);
    if (count < 0)
        return DP_FAIL(DP_ERR_FORMAT,
                       "'%s': the llm.c header's token count is %d (negative: the int32 "
                       "overflowed, or the header is corrupt); re-create the file",
                       m->path, (int)count);
    if (count == 0)
        return DP_FAIL(DP_ERR_FORMAT,
                       "'%s': the llm.c header says the file holds no tokens; remove it or "
                       "re-create it",
                       m->path);
    size_t want = DP_LLMC_HEADER_BYTES;
    if (!dp_size_mad(&want, (size_t)count, sizeof(uint16_t)))
        return DP_FAIL(DP_ERR_FORMAT, "'%s': the header's %d tokens overflow a size", m->path,
                       (int)count);
    if (want != m->bytes)
        return DP_FAIL(DP_ERR_FORMAT,
                       "'%s': the llm.c header says %d tokens, %zu bytes with the header, but "
                       "the file has %zu bytes: %s; re-create it",
                       m->path, (int)count, want, m->bytes,
                       m->bytes < want ? "it was cut short" : "it has bytes past its tokens");
    *format = DP_TOKEN_FORMAT_LLMC;
    *n = (size_t)count;
    *offset = DP_LLMC_HEADER_BYTES;
    return DP_OK;
}

// ----------------------------------------------------------------------------
// info

dp_status dp_token_data_get_info(const dp_token_data *data, dp_token_data_info *info)
{
    if (!data || !info) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "data or info is NULL");
    memset(info, 0, sizeof *info);
    info->format = data->format;
    info->split_by_files = data->split_by_files;
    info->files[DP_SPLIT_TRAIN] = data->files[DP_SPLIT_TRAIN];
    info->files[DP_SPLIT_VAL] = data->files[DP_SPLIT_VAL];
    info->ignored_files = data->ignored_files;
    for (size_t i = 0; i < data->n_maps; i++) info->mapped_bytes += data->maps[i].bytes;
    return DP_OK;
}

// ----------------------------------------------------------------------------
// probing a path

dp_status dp_token_files_probe(const char *path, int *is_tokens)
{
    if (!is_tokens) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "is_tokens is NULL");
    *is_tokens = 0;
    if (!path || !*path)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "the data path is NULL or empty");
    struct stat sb;
    if (stat(path, &sb) != 0)
        return DP_FAIL(DP_ERR_IO, "cannot read the data '%s': %s; pass a text file, a token "
                       "file (.bin) or a directory of either", path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) {
        DIR *d = opendir(path);
        if (!d)
            return DP_FAIL(DP_ERR_IO, "cannot open the directory '%s': %s", path,
                           strerror(errno));
        struct dirent *de;
        errno = 0;
        while ((de = readdir(d)))
            if (de->d_name[0] != '.' && ends_with(de->d_name, ".bin")) {
                *is_tokens = 1;
                break;
            }
        int e = errno;
        closedir(d);
        if (!de && e)
            return DP_FAIL(DP_ERR_IO, "cannot list the directory '%s': %s", path, strerror(e));
        return DP_OK;
    }
    if (!S_ISREG(sb.st_mode))
        return DP_FAIL(DP_ERR_FORMAT,
                       "the data '%s' is not a regular file or a directory (it is a %s); pass "
                       "a text file, a token file (.bin) or a directory of either",
                       path, dp_file_kind(sb.st_mode));
    if (ends_with(path, ".bin")) {
        *is_tokens = 1;
        return DP_OK;
    }
    // Another name: an llm.c shard renamed still says what it is.
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return DP_FAIL(DP_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    unsigned char b[4];
    ssize_t k = -1;
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode)) k = read(fd, b, sizeof b);
    close(fd);
    *is_tokens = k == (ssize_t)sizeof b && le32(b) == DP_LLMC_DATA_MAGIC;
    return DP_OK;
}

// ----------------------------------------------------------------------------
// opening

/* The *.bin names of a directory, by split, sorted; *ignored counts the
 * other entries (dot-files aside). */
typedef struct bin_names {
    char **names[DP_SPLIT_COUNT];
    size_t n[DP_SPLIT_COUNT], cap[DP_SPLIT_COUNT];
    size_t ignored;
} bin_names;

static void bin_names_free(bin_names *b)
{
    for (int s = 0; s < DP_SPLIT_COUNT; s++) {
        for (size_t i = 0; i < b->n[s]; i++) free(b->names[s][i]);
        free(b->names[s]);
    }
}

static dp_status list_bins(const char *path, bin_names *b)
{
    DIR *d = opendir(path);
    if (!d) return DP_FAIL(DP_ERR_IO, "cannot open the directory '%s': %s", path, strerror(errno));
    dp_status st = DP_OK;
    for (;;) {
        errno = 0;
        struct dirent *de = readdir(d);
        if (!de) {
            if (errno)
                st = DP_FAIL(DP_ERR_IO, "cannot list the directory '%s': %s", path,
                             strerror(errno));
            break;
        }
        const char *name = de->d_name;
        if (name[0] == '.') continue;
        if (!ends_with(name, ".bin")) {
            b->ignored++;
            continue;
        }
        int tr = strstr(name, "train") != NULL, va = strstr(name, "val") != NULL;
        if (tr == va) {
            st = DP_FAIL(DP_ERR_FORMAT,
                         "'%s%s%s': a token file's name must hold \"train\" or \"val\" (not "
                         "%s) to say its split, as nanoGPT's train.bin / val.bin and llm.c's "
                         "*_train_*.bin / *_val_*.bin do; rename it or move it out",
                         path, ends_with(path, "/") ? "" : "/", name, tr ? "both" : "neither");
            break;
        }
        int s = tr ? DP_SPLIT_TRAIN : DP_SPLIT_VAL;
        if (b->n[s] == b->cap[s]) {
            size_t ncap = b->cap[s] ? 2 * b->cap[s] : 16;
            char **nn = realloc(b->names[s], ncap * sizeof *nn);
            if (!nn) {
                st = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot list '%s'", path);
                break;
            }
            b->names[s] = nn;
            b->cap[s] = ncap;
        }
        if (!(b->names[s][b->n[s]] = strdup(name))) {
            st = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot list '%s'", path);
            break;
        }
        b->n[s]++;
    }
    closedir(d);
    if (st != DP_OK) return st;
    for (int s = 0; s < DP_SPLIT_COUNT; s++)
        if (b->n[s] > 1) qsort(b->names[s], b->n[s], sizeof *b->names[s], token_cmp_names);
    size_t nt = b->n[DP_SPLIT_TRAIN], nv = b->n[DP_SPLIT_VAL];
    if (nt == 0 && nv == 0)
        return DP_FAIL(DP_ERR_FORMAT,
                       "the directory '%s' has no token files (*.bin); pass nanoGPT's data "
                       "directory (train.bin, val.bin) or llm.c's (*_train_*.bin, *_val_*.bin)",
                       path);
    if (nv == 0)
        return DP_FAIL(DP_ERR_FORMAT,
                       "the directory '%s' has %zu training file%s ('%s'%s) but no validation "
                       "file: add one whose name holds \"val\" (nanoGPT's val.bin, llm.c's "
                       "*_val_*.bin), or pass a training file alone to split it 90/10",
                       path, nt, nt == 1 ? "" : "s", b->names[DP_SPLIT_TRAIN][0],
                       nt > 1 ? ", ..." : "");
    if (nt == 0)
        return DP_FAIL(DP_ERR_FORMAT,
                       "the directory '%s' has %zu validation file%s ('%s'%s) but no training "
                       "file: add one whose name holds \"train\" (nanoGPT's train.bin, llm.c's "
                       "*_train_*.bin)",
                       path, nv, nv == 1 ? "" : "s", b->names[DP_SPLIT_VAL][0],
                       nv > 1 ? ", ..." : "");
    return DP_OK;
}

/* Maps d->maps[0..n_maps) (paths set) and builds the segments; split
 * counts files per split in map order (train first). */
static dp_status map_all(dp_token_data *d, const size_t files[DP_SPLIT_COUNT])
{
    d->segs = calloc(d->n_maps, sizeof *d->segs);
    if (!d->segs) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate %zu segments", d->n_maps);
    size_t total = 0, train = 0;
    for (size_t i = 0; i < d->n_maps; i++) {
        token_map *m = &d->maps[i];
        DP_TRY(map_file(m));
        dp_token_format f = DP_TOKEN_FORMAT_MEMORY;
        size_t n = 0, off = 0;
        DP_TRY(parse_file(m, &f, &n, &off));
        if (i > 0 && f != d->format)
            return DP_FAIL(DP_ERR_FORMAT,
                           "'%s' is %s data but '%s' is %s: a directory must hold one format; "
                           "move one kind out",
                           m->path, f == DP_TOKEN_FORMAT_LLMC ? "llm.c" : "raw nanoGPT",
                           d->maps[0].path,
                           d->format == DP_TOKEN_FORMAT_LLMC ? "llm.c" : "raw nanoGPT");
        d->format = f;
        token_segment *g = &d->segs[i];
        g->ids = (const unsigned char *)m->addr + off;
        g->n = n;
        g->start = total;
        g->file_offset = off;
        g->path = m->path;
        d->n_segs = i + 1;
        if (!dp_size_add(total, n, &total))
            return DP_FAIL(DP_ERR_FORMAT, "the token counts of '%s' overflow a size", m->path);
        if (i < files[DP_SPLIT_TRAIN]) train = total;
    }
    d->n = total;
    d->n_train = train;
    return DP_OK;
}

dp_status dp_token_data_open(const char *path, size_t vocab_size, dp_token_data **out)
{
    if (!out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    if (!path || !*path)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "the token data path is NULL or empty");
    if (vocab_size == 0 || vocab_size > INT32_MAX)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "vocab_size %zu is outside 1..INT32_MAX",
                       vocab_size);
    struct stat sb;
    if (stat(path, &sb) != 0)
        return DP_FAIL(DP_ERR_IO, "cannot read the token data '%s': %s", path, strerror(errno));
    if (!S_ISDIR(sb.st_mode) && !S_ISREG(sb.st_mode))
        return DP_FAIL(DP_ERR_FORMAT,
                       "the token data '%s' is not a regular file or a directory (it is a %s); "
                       "pass a token file (.bin) or a directory of them",
                       path, dp_file_kind(sb.st_mode));
    dp_token_data *d = calloc(1, sizeof *d);
    if (!d) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate token data");
    d->vocab = vocab_size;
    dp_status st = DP_OK;
    size_t files[DP_SPLIT_COUNT] = {0, 0};
    if (S_ISDIR(sb.st_mode)) {
        bin_names b;
        memset(&b, 0, sizeof b);
        st = list_bins(path, &b);
        size_t nf = b.n[DP_SPLIT_TRAIN] + b.n[DP_SPLIT_VAL];
        if (st == DP_OK && !(d->maps = calloc(nf, sizeof *d->maps)))
            st = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate %zu file entries", nf);
        for (int s = 0; st == DP_OK && s < DP_SPLIT_COUNT; s++)
            for (size_t i = 0; st == DP_OK && i < b.n[s]; i++) {
                token_map *m = &d->maps[d->n_maps];
                if (!(m->path = token_join_path(path, b.names[s][i])))
                    st = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot build a path");
                else
                    d->n_maps++;
            }
        files[DP_SPLIT_TRAIN] = b.n[DP_SPLIT_TRAIN];
        files[DP_SPLIT_VAL] = b.n[DP_SPLIT_VAL];
        d->ignored_files = b.ignored;
        bin_names_free(&b);
        if (st == DP_OK) st = map_all(d, files);
        d->split_by_files = 1;
    } else {
        if (!(d->maps = calloc(1, sizeof *d->maps)) || !(d->maps[0].path = strdup(path)))
            st = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate a file entry");
        else
            d->n_maps = 1;
        files[DP_SPLIT_TRAIN] = 1; // the whole file: map_all's train count is overridden
        if (st == DP_OK) st = map_all(d, files);
        d->n_train = token_train_count(d->n);
        files[DP_SPLIT_VAL] = 1;
    }
    if (st != DP_OK) {
        dp_token_data_destroy(d);
        return st;
    }
    d->files[DP_SPLIT_TRAIN] = files[DP_SPLIT_TRAIN];
    d->files[DP_SPLIT_VAL] = files[DP_SPLIT_VAL];
    *out = d;
    return DP_OK;
}
