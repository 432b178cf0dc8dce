/*
 * examples/dp_tokenize/inputs.c - checking the inputs and encoding each
 * one in windows.
 *
 * A file is read a window at a time (1 MiB to start) and encoded up to
 * the last place dp_tokenizer_cut_point says a cut changes no id; the rest
 * of the window moves to the front and more is read. A window without
 * such a place doubles. So memory stays a few windows whatever the file's
 * size, the progress line moves within a file, and the ids are those of
 * encoding the whole file at once.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dp_cli.h"
#include "inputs.h"

#define WINDOW ((size_t)1 << 20)


/* An llm.c token shard (what --out writes, and may replace): its first
 * int32, little-endian, is the magic 20240520. */
static int is_shard(const char *path)
{
    char h[5];
    if (cli_read_head(path, h, 4) != 4) return 0;
    const unsigned char *b = (const unsigned char *)h;
    uint32_t magic = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                     (uint32_t)b[3] << 24;
    return magic == 20240520u;
}

/* The files of the tokenizer: --tokenizer-file, the tokenizer.json,
 * encoder.json and vocab.bpe in its directory (or in it, a directory),
 * --merges-file. Fills f with n of
 * them (paths in buf) and returns n. */
static size_t tokenizer_files(const tok_options *o, cli_file *f, char buf[4][4096])
{
    size_t n = 0;
    const char *t = o->tokenizer_file;
    struct stat sb;
    const char *slash = strrchr(t, '/');
    int dir = stat(t, &sb) == 0 && S_ISDIR(sb.st_mode);
    if (!dir) f[n++] = (cli_file){"--tokenizer-file", t, 0, NULL, NULL};
    int dl = dir ? (int)strlen(t) : slash ? (int)(slash - t) : 1;
    const char *d = dir || slash ? t : ".";
    /* for a file, its siblings too: the vocab.bpe an encoder.json reads,
     * and a tokenizer's other files, which --out must not clobber either */
    static const char *const names[3] = {"tokenizer.json", "encoder.json", "vocab.bpe"};
    for (int i = 0; i < 3; i++) {
        snprintf(buf[i], sizeof buf[i], "%.*s/%s", dl, d, names[i]);
        f[n++] = (cli_file){"--tokenizer-file", buf[i], 0, NULL, NULL};
    }
    if (o->merges_file) f[n++] = (cli_file){"--merges-file", o->merges_file, 0, NULL, NULL};
    return n;
}

int tok_check_inputs(const tok_options *o, size_t *total_bytes)
{
    *total_bytes = 0;
    /* The atomic writer's checks, as lm_train's --save: a regular file or
     * none (never a device or a FIFO), a writable directory, a temporary
     * name within the file system's limit. */
    if (o->out && cli_check_output("--out", o->out)) return 1;
    for (size_t i = 0; i < o->n_inputs; i++) {
        const char *p = o->inputs[i];
        struct stat sb;
        if (stat(p, &sb) != 0) return tok_fail("cannot read '%s': %s", p, strerror(errno));
        if (!S_ISREG(sb.st_mode))
            return tok_fail("'%s' is a %s: each INPUT must be a regular file of text", p,
                            dp_file_kind(sb.st_mode));
        *total_bytes += (size_t)sb.st_size;
    }
    // --out must be none of the files read (device and inode, or the resolved path).
    size_t n = o->n_inputs + 6;
    cli_file *f = calloc(n, sizeof *f);
    static char buf[4][4096];
    if (!f) return tok_fail("out of memory");
    size_t k = tokenizer_files(o, f, buf);
    for (size_t i = 0; i < o->n_inputs; i++) f[k++] = (cli_file){"INPUT", o->inputs[i], 0, NULL, NULL};
    f[k++] = (cli_file){"--out", o->out, 1, NULL, NULL};
    int rc = cli_check_overlaps(f, k);
    free(f);
    /* after the overlaps, whose message names the input: a file that is
     * not a shard (another program's) is kept */
    if (!rc && o->out) rc = cli_check_replace("--out", o->out, is_shard, "an llm.c token shard");
    return rc;
}

typedef struct window {
    char *text;
    size_t cap, have; /* bytes it holds, bytes in it */
    int32_t *ids;     /* cap ids: a window's text never needs more */
} window;

static int grow(window *w, size_t cap)
{
    char *t = realloc(w->text, cap);
    if (t) w->text = t;
    int32_t *ids = t ? realloc(w->ids, cap * sizeof *ids) : NULL;
    if (ids) w->ids = ids;
    if (!ids) return tok_fail("out of memory (a window of %zu bytes)", cap);
    w->cap = cap;
    return 0;
}

/* Fills the window from fd; *eof once the file ends. */
static int fill(window *w, int fd, const char *path, int *eof)
{
    while (w->have < w->cap && !*eof) {
        ssize_t k = read(fd, w->text + w->have, w->cap - w->have);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return tok_fail("reading '%s' failed: %s", path, strerror(errno));
        if (k == 0) *eof = 1;
        w->have += (size_t)k;
    }
    return 0;
}

/* Reports invalid UTF-8 in text[0..n) (at file offset base) with the
 * file's byte offset. 0 if it is valid. */
static int check_utf8(const char *path, const char *text, size_t n, size_t base)
{
    size_t bad;
    if (dp_utf8_check(text, n, &bad) == DP_OK) return 0;
    char bytes[16] = "";
    for (size_t k = 0; k < 4 && bad + k < n; k++)
        snprintf(bytes + 3 * k, sizeof bytes - 3 * k, "%s%02X", k ? " " : "",
                 (unsigned)(unsigned char)text[bad + k]);
    return tok_fail("'%s' is not UTF-8 text: invalid byte sequence at byte offset %zu (bytes "
                    "%s); convert it to UTF-8 first (e.g. iconv)",
                    path, base + bad, bytes);
}

static int encode_window(const dp_tokenizer *tok, const tok_options *o, window *w, size_t n,
                         size_t *ids_out)
{
    dp_status st = o->allow_special
                       ? dp_tokenizer_encode(tok, w->text, n, w->ids, w->cap, ids_out, NULL)
                       : dp_tokenizer_encode_ordinary(tok, w->text, n, w->ids, w->cap, ids_out);
    return st == DP_OK ? 0 : tok_fail("encoding failed: %s", dp_last_error());
}

int tok_encode_input(const dp_tokenizer *tok, int32_t eot, const tok_options *o, size_t i,
                     tok_shard *sh, tok_progress *pg)
{
    const char *path = o->inputs[i];
    pg->file = i;
    pg->path = path;
    // Each document is preceded by the end-of-text id (llm.c's fineweb.py).
    if (sh && tok_shard_append(sh, &eot, 1)) return 1;
    tok_progress_add(pg, 0, 1);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return tok_fail("cannot open '%s': %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return tok_fail("'%s' is not a regular file (any more)", path);
    }
    window w = {0};
    int rc = grow(&w, WINDOW), eof = 0;
    size_t base = 0; // file offset of w.text[0]
    while (rc == 0) {
        rc = fill(&w, fd, path, &eof);
        if (rc || w.have == 0) break;
        size_t cut = eof ? w.have : dp_tokenizer_cut_point(tok, w.text, w.have);
        if (cut == 0) {
            // No safe cut in the window: read on in a larger one.
            if (w.cap > SIZE_MAX / 2 / sizeof *w.ids) {
                rc = tok_fail("'%s': no place to cut in %zu bytes", path, w.cap);
                break;
            }
            rc = grow(&w, 2 * w.cap);
            continue;
        }
        size_t n = 0;
        rc = check_utf8(path, w.text, cut, base);
        if (rc == 0) rc = encode_window(tok, o, &w, cut, &n);
        if (rc == 0 && sh) rc = tok_shard_append(sh, w.ids, n);
        if (rc) break;
        tok_progress_add(pg, cut, n);
        memmove(w.text, w.text + cut, w.have - cut);
        w.have -= cut;
        base += cut;
    }
    close(fd);
    free(w.text);
    free(w.ids);
    if (rc == 0) tok_progress_file_done(pg);
    return rc;
}
