/*
 * safetensors: round trip, exact bytes, validation of corrupted files,
 * atomic writes (failures leave no temporary file and keep the old file).
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "dp/safetensors.h"
#include "dp_test.h"
#include "dp_test_fs.h"

// ----------------------------------------------------------------------------
// temp-dir helpers

static char tmpdir[64];

static void make_tmpdir(void)
{
    strcpy(tmpdir, "/tmp/dp_test_st_XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp failed");
}

static void path_in(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", tmpdir, name);
}


static void cleanup(void) { dp_test_remove_tree(tmpdir); }

// Number of entries in dir (without . and ..); names containing ".tmp." counted in *tmp.
static int count_entries(const char *dir, int *tmp)
{
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    int n = 0;
    *tmp = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        n++;
        if (strstr(de->d_name, ".tmp.")) (*tmp)++;
    }
    closedir(d);
    return n;
}

// A raw safetensors file: u64 LE header length, the header text, data_len data bytes.
static void write_raw(const char *path, const char *header, size_t data_len)
{
    size_t h = strlen(header);
    size_t n = 8 + h + data_len;
    unsigned char *buf = calloc(1, n);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(((uint64_t)h >> (8 * i)) & 0xff);
    memcpy(buf + 8, header, h);
    for (size_t i = 0; i < data_len; i++) buf[8 + h + i] = (unsigned char)i;
    dp_test_write_file(path, buf, n);
    free(buf);
}

// ----------------------------------------------------------------------------
// round trip

TestSuite(safetensors, .init = make_tmpdir, .fini = cleanup);

Test(safetensors, round_trip_preserves_everything)
{
    float a[6] = {1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-30f};
    int64_t b[4] = {INT64_MIN, -1, 0, INT64_MAX};
    uint8_t c[5] = {0, 1, 127, 128, 255};
    int32_t d = -123456;
    float e_unused = 0.0f;
    size_t sa[2] = {2, 3}, sb[1] = {4}, sc[1] = {5}, se[2] = {0, 3};

    dp_st_writer *w = NULL;
    dp_assert_ok(dp_st_writer_create(&w));
    dp_assert_ok(dp_st_writer_add(w, "transformer.wte.weight", DP_DTYPE_F32, sa, 2, a));
    dp_assert_ok(dp_st_writer_add(w, "steps", DP_DTYPE_I64, sb, 1, b));
    dp_assert_ok(dp_st_writer_add(w, "bytes", DP_DTYPE_U8, sc, 1, c)); // 5 bytes: odd offset next
    dp_assert_ok(dp_st_writer_add(w, "scalar", DP_DTYPE_I32, NULL, 0, &d));
    dp_assert_ok(dp_st_writer_add(w, "empty", DP_DTYPE_F32, se, 2, &e_unused));
    dp_assert_ok(dp_st_writer_set_metadata(w, "format", "pt"));
    dp_assert_ok(dp_st_writer_set_metadata(w, "tokenizer", "{\"type\":\"char\"} \xc3\xa9"));
    dp_assert_ok(dp_st_writer_set_metadata(w, "format", "pt2")); // replaces, keeps position
    char path[256];
    path_in(path, sizeof path, "model.safetensors");
    dp_assert_ok(dp_st_writer_write(w, path));
    dp_st_writer_destroy(w);

    // The data section starts 8-byte aligned and the header is space-padded JSON.
    size_t len;
    unsigned char *raw = dp_test_read_file(path, &len);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | raw[i];
    cr_assert_eq((8 + hl) % 8, 0, "data section starts at %llu", (unsigned long long)(8 + hl));
    cr_assert_eq(raw[8], '{');
    size_t data_bytes = 24 + 32 + 5 + 4 + 0;
    cr_assert_eq(len, 8 + hl + data_bytes);
    free(raw);

    dp_st_file *f = NULL;
    dp_assert_ok(dp_st_open(path, &f));
    cr_assert_str_eq(dp_st_path(f), path);
    cr_assert_eq(dp_st_count(f), 5);
    const char *order[5] = {"transformer.wte.weight", "steps", "bytes", "scalar", "empty"};
    for (size_t i = 0; i < 5; i++)
        cr_assert_str_eq(dp_st_tensor_at(f, i)->name, order[i], "tensor %zu is out of order", i);
    cr_assert_null(dp_st_tensor_at(f, 5));

    const dp_st_tensor *t = dp_st_find(f, "transformer.wte.weight");
    cr_assert_not_null(t);
    cr_assert_eq(t->dtype, DP_DTYPE_F32);
    cr_assert_eq(t->ndim, 2);
    cr_assert(t->shape[0] == 2 && t->shape[1] == 3 && t->shape[2] == 0);
    cr_assert_eq(t->numel, 6);
    cr_assert_eq(t->nbytes, 24);
    cr_assert_eq(t->offset, 0);
    cr_assert_eq(memcmp(t->data, a, sizeof a), 0, "F32 bytes differ");
    cr_assert_eq((uintptr_t)t->data % 8, 0, "first tensor not 8-byte aligned");

    t = dp_st_find(f, "steps");
    cr_assert(t && t->dtype == DP_DTYPE_I64 && t->ndim == 1 && t->shape[0] == 4);
    cr_assert_eq(t->offset, 24);
    cr_assert_eq(memcmp(t->data, b, sizeof b), 0, "I64 bytes differ");
    t = dp_st_find(f, "bytes");
    cr_assert(t && t->dtype == DP_DTYPE_U8 && t->nbytes == 5);
    cr_assert_eq(memcmp(t->data, c, sizeof c), 0);
    t = dp_st_find(f, "scalar");
    cr_assert(t && t->dtype == DP_DTYPE_I32 && t->ndim == 0 && t->numel == 1 && t->nbytes == 4);
    int32_t dd;
    memcpy(&dd, t->data, 4); // offset 61: unaligned, read with memcpy as documented
    cr_assert_eq(dd, d);
    t = dp_st_find(f, "empty");
    cr_assert(t && t->ndim == 2 && t->shape[0] == 0 && t->shape[1] == 3 && t->nbytes == 0);
    cr_assert_null(dp_st_find(f, "missing"));

    cr_assert_eq(dp_st_metadata_count(f), 2);
    cr_assert_str_eq(dp_st_metadata(f, "format"), "pt2");
    cr_assert_str_eq(dp_st_metadata(f, "tokenizer"), "{\"type\":\"char\"} \xc3\xa9");
    cr_assert_null(dp_st_metadata(f, "nope"));
    const char *k, *v;
    dp_assert_ok(dp_st_metadata_at(f, 0, &k, &v));
    cr_assert_str_eq(k, "format");
    dp_assert_ok(dp_st_metadata_at(f, 1, &k, &v));
    cr_assert_str_eq(k, "tokenizer");
    cr_assert_eq(dp_st_metadata_at(f, 2, &k, &v), DP_ERR_INVALID_ARGUMENT);

    // Checked lookup.
    const void *p = NULL;
    size_t want[2] = {2, 3};
    dp_assert_ok(dp_st_expect(f, "transformer.wte.weight", DP_DTYPE_F32, want, 2, &p));
    cr_assert_eq(p, dp_st_find(f, "transformer.wte.weight")->data);
    size_t wrong[2] = {3, 2};
    cr_assert_eq(dp_st_expect(f, "transformer.wte.weight", DP_DTYPE_F32, wrong, 2, &p),
                 DP_ERR_FORMAT);
    cr_assert(strstr(dp_last_error(), "[2, 3]") && strstr(dp_last_error(), "[3, 2]") &&
                  strstr(dp_last_error(), "model.safetensors"),
              "%s", dp_last_error());
    cr_assert_null(p);
    cr_assert_eq(dp_st_expect(f, "steps", DP_DTYPE_I32, sb, 1, &p), DP_ERR_FORMAT);
    cr_assert(strstr(dp_last_error(), "I64") && strstr(dp_last_error(), "I32"), "%s",
              dp_last_error());
    cr_assert_eq(dp_st_expect(f, "nope", DP_DTYPE_F32, sb, 1, &p), DP_ERR_FORMAT);
    cr_assert(strstr(dp_last_error(), "no tensor named 'nope'"), "%s", dp_last_error());
    dp_st_close(f);
}

Test(safetensors, exact_bytes_and_deterministic)
{
    // The exact file for one F32 tensor and one metadata pair, from the format's definition:
    // 8-byte LE length, compact JSON padded with spaces to a multiple of 8, then the data.
    float x[2] = {1.0f, -2.0f};
    size_t s[1] = {2};
    char p1[256], p2[256];
    path_in(p1, sizeof p1, "a.safetensors");
    path_in(p2, sizeof p2, "b.safetensors");
    for (int rep = 0; rep < 2; rep++) {
        dp_st_writer *w;
        dp_assert_ok(dp_st_writer_create(&w));
        dp_assert_ok(dp_st_writer_add(w, "a", DP_DTYPE_F32, s, 1, x));
        dp_assert_ok(dp_st_writer_set_metadata(w, "k", "v"));
        dp_assert_ok(dp_st_writer_write(w, rep == 0 ? p1 : p2));
        dp_st_writer_destroy(w);
    }
    const char *json = "{\"__metadata__\":{\"k\":\"v\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
                       "\"data_offsets\":[0,8]}}";
    size_t jl = strlen(json), padded = (jl + 7) / 8 * 8;
    size_t n1, n2;
    unsigned char *b1 = dp_test_read_file(p1, &n1), *b2 = dp_test_read_file(p2, &n2);
    cr_assert_eq(n1, 8 + padded + 8);
    cr_assert_eq(b1[0], (unsigned char)padded);
    for (int i = 1; i < 8; i++) cr_assert_eq(b1[i], 0);
    cr_assert_eq(memcmp(b1 + 8, json, jl), 0, "header is %.*s", (int)padded, (char *)b1 + 8);
    for (size_t i = jl; i < padded; i++) cr_assert_eq(b1[8 + i], ' ', "padding byte %zu", i);
    cr_assert_eq(memcmp(b1 + 8 + padded, x, 8), 0);
    cr_assert_eq(n1, n2);
    cr_assert_eq(memcmp(b1, b2, n1), 0, "the same input gave different bytes");
    free(b1);
    free(b2);
}

Test(safetensors, empty_file_has_no_tensors)
{
    dp_st_writer *w;
    dp_assert_ok(dp_st_writer_create(&w));
    char path[256];
    path_in(path, sizeof path, "empty.safetensors");
    dp_assert_ok(dp_st_writer_write(w, path));
    dp_st_writer_destroy(w);
    dp_st_file *f;
    dp_assert_ok(dp_st_open(path, &f));
    cr_assert_eq(dp_st_count(f), 0);
    cr_assert_eq(dp_st_metadata_count(f), 0);
    dp_st_close(f);
}

/* jansson's allocator, made to fail from the first allocation on: the
 * parser then leaves its reason empty (jansson 2.14), and the header is
 * reported as the host out of memory, not as a malformed file. */
static void *no_memory(size_t n)
{
    (void)n;
    return NULL;
}

Test(safetensors, a_failed_allocation_in_the_json_parser_is_out_of_memory)
{
    dp_st_writer *w;
    dp_assert_ok(dp_st_writer_create(&w));
    dp_assert_ok(dp_st_writer_set_metadata(w, "k", "v"));
    char path[256];
    path_in(path, sizeof path, "oom.safetensors");
    dp_assert_ok(dp_st_writer_write(w, path));
    dp_st_writer_destroy(w);
    json_malloc_t m;
    json_free_t f;
    json_get_alloc_funcs(&m, &f);
    json_set_alloc_funcs(no_memory, f);
    dp_st_file *st = NULL;
    dp_status s = dp_st_open(path, &st);
    json_set_alloc_funcs(m, f);
    cr_assert_eq(s, DP_ERR_OUT_OF_MEMORY, "%s: %s", dp_strerror(s), dp_last_error());
    cr_assert(strstr(dp_last_error(), "out of host memory parsing its header"), "%s",
              dp_last_error());
    cr_assert_null(st);
    dp_assert_ok(dp_st_open(path, &st)); /* and with memory, it opens */
    dp_st_close(st);
}

Test(safetensors, writer_rejects_bad_arguments)
{
    dp_st_writer *w;
    dp_assert_ok(dp_st_writer_create(&w));
    float x[4] = {0};
    size_t s[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    dp_assert_ok(dp_st_writer_add(w, "x", DP_DTYPE_F32, s, 1, x));
    cr_assert_eq(dp_st_writer_add(w, "x", DP_DTYPE_F32, s, 1, x), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "already added"), "%s", dp_last_error());
    cr_assert_eq(dp_st_writer_add(w, "__metadata__", DP_DTYPE_F32, s, 1, x),
                 DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_st_writer_add(w, "", DP_DTYPE_F32, s, 1, x), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_st_writer_add(w, NULL, DP_DTYPE_F32, s, 1, x), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_st_writer_add(w, "y", DP_DTYPE_COUNT, s, 1, x), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_st_writer_add(w, "y", DP_DTYPE_F32, s, 9, x), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_st_writer_add(w, "y", DP_DTYPE_F32, s, -1, x), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_st_writer_add(w, "y", DP_DTYPE_F32, NULL, 1, x), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_st_writer_add(w, "y", DP_DTYPE_F32, s, 1, NULL), DP_ERR_INVALID_ARGUMENT);
    size_t huge[2] = {(size_t)1 << 40, (size_t)1 << 40};
    cr_assert_eq(dp_st_writer_add(w, "y", DP_DTYPE_F32, huge, 2, x), DP_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(dp_last_error(), "overflow"), "%s", dp_last_error());
    cr_assert_eq(dp_st_writer_add(w, "bad\xff", DP_DTYPE_F32, s, 1, x), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_st_writer_set_metadata(w, "k", "\xff\xfe"), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_st_writer_set_metadata(w, "", "v"), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_st_writer_set_metadata(w, "k", NULL), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_st_writer_write(w, NULL), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_st_writer_create(NULL), DP_ERR_INVALID_ARGUMENT);
    dp_st_writer_destroy(w);
    dp_st_writer_destroy(NULL);
    dp_st_close(NULL);
}

// ----------------------------------------------------------------------------
// corrupted files

typedef struct bad_case {
    const char *what;
    const char *header;
    size_t data_len;
    const char *needle; // must appear in the error message
} bad_case;

#define T8 "\"dtype\":\"F32\",\"shape\":[2]"

static const bad_case bad_cases[] = {
    {"bad JSON", "{\"a\":{" T8 ",\"data_offsets\":[0,8]}", 8, "not valid JSON"},
    {"not JSON at all", "hello, world", 8, "not valid JSON"},
    {"JSON not an object", "[1,2,3]", 0, "not an object"},
    {"header with a NUL", "{\"a\":1}\0   ", 0, "not valid JSON"},
    {"overlapping offsets",
     "{\"a\":{" T8 ",\"data_offsets\":[0,8]},\"b\":{" T8 ",\"data_offsets\":[4,12]}}", 12,
     "overlaps"},
    {"identical offsets",
     "{\"a\":{" T8 ",\"data_offsets\":[0,8]},\"b\":{" T8 ",\"data_offsets\":[0,8]}}", 8,
     "overlaps"},
    {"gapped offsets",
     "{\"a\":{" T8 ",\"data_offsets\":[0,8]},\"b\":{" T8 ",\"data_offsets\":[12,20]}}", 20,
     "gap"},
    {"gap at the start", "{\"a\":{" T8 ",\"data_offsets\":[4,12]}}", 12, "gap"},
    {"offsets out of bounds", "{\"a\":{" T8 ",\"data_offsets\":[0,8]}}", 4, "run past"},
    {"trailing data bytes", "{\"a\":{" T8 ",\"data_offsets\":[0,8]}}", 12, "trailing"},
    {"unknown dtype", "{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
     "unknown dtype \"F33\""},
    {"lowercase dtype", "{\"a\":{\"dtype\":\"f32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
     "unknown dtype"},
    {"dtype not a string", "{\"a\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
     "dtype is not a string"},
    {"shape bytes disagree with offsets",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "is 12 bytes"},
    {"wrong dtype for the bytes", "{\"a\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,8]}}",
     8, "is 16 bytes"},
    {"duplicate names",
     "{\"a\":{" T8 ",\"data_offsets\":[0,8]},\"a\":{" T8 ",\"data_offsets\":[8,16]}}", 16,
     "duplicate"},
    {"non-string metadata", "{\"__metadata__\":{\"k\":1},\"a\":{" T8 ",\"data_offsets\":[0,8]}}",
     8, "not a string"},
    {"metadata not an object", "{\"__metadata__\":[\"k\"],\"a\":{" T8 ",\"data_offsets\":[0,8]}}",
     8, "__metadata__ is not a JSON object"},
    {"negative shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
     "shape[0]"},
    {"fractional shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8,
     "shape[0]"},
    {"shape not an array", "{\"a\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8,
     "shape is not an array"},
    {"too many dims",
     "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
     "9 dimensions"},
    {"byte size overflow",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,0]}}", 0,
     "overflows"},
    {"begin after end", "{\"a\":{" T8 ",\"data_offsets\":[8,0]}}", 8, "begin > end"},
    {"three offsets", "{\"a\":{" T8 ",\"data_offsets\":[0,4,8]}}", 8, "two non-negative"},
    {"negative offset", "{\"a\":{" T8 ",\"data_offsets\":[-8,0]}}", 8, "two non-negative"},
    {"missing data_offsets", "{\"a\":{" T8 "}}", 8, "missing \"data_offsets\""},
    {"missing dtype", "{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "missing \"dtype\""},
    {"unknown key", "{\"a\":{" T8 ",\"data_offsets\":[0,8],\"extra\":1}}", 8, "unknown key 'extra'"},
    {"entry not an object", "{\"a\":[1]}", 0, "not a JSON object"},
    {"empty tensor name", "{\"\":{" T8 ",\"data_offsets\":[0,8]}}", 8, "empty name"},
    {"empty metadata key", "{\"__metadata__\":{\"\":\"v\"},\"a\":{" T8 ",\"data_offsets\":[0,8]}}",
     8, "empty key"},
};

Test(safetensors, corrupted_headers_are_rejected)
{
    char path[256];
    path_in(path, sizeof path, "bad.safetensors");
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const bad_case *c = &bad_cases[i];
        // The NUL case needs its full length; others are plain strings.
        if (strcmp(c->what, "header with a NUL") == 0) {
            unsigned char buf[8 + 11];
            memset(buf, 0, sizeof buf);
            buf[0] = 11;
            memcpy(buf + 8, c->header, 11);
            dp_test_write_file(path, buf, sizeof buf);
        } else {
            write_raw(path, c->header, c->data_len);
        }
        dp_st_file *f = (dp_st_file *)&path; // must be reset to NULL on failure
        dp_clear_error();
        dp_status st = dp_st_open(path, &f);
        cr_assert_eq(st, DP_ERR_FORMAT, "case '%s': got %s (%s)", c->what, dp_strerror(st),
                     dp_last_error());
        cr_assert_null(f, "case '%s': out not reset", c->what);
        const char *msg = dp_last_error();
        cr_assert(strstr(msg, c->needle), "case '%s': message lacks '%s': %s", c->what,
                  c->needle, msg);
        cr_assert(strstr(msg, "bad.safetensors"), "case '%s': message lacks the file: %s",
                  c->what, msg);
    }
}

Test(safetensors, truncated_files_are_rejected)
{
    char path[256], cut[256];
    path_in(path, sizeof path, "good.safetensors");
    path_in(cut, sizeof cut, "cut.safetensors");
    float x[16] = {0};
    size_t s[1] = {16};
    dp_st_writer *w;
    dp_assert_ok(dp_st_writer_create(&w));
    dp_assert_ok(dp_st_writer_add(w, "x", DP_DTYPE_F32, s, 1, x));
    dp_assert_ok(dp_st_writer_write(w, path));
    dp_st_writer_destroy(w);
    size_t n;
    unsigned char *raw = dp_test_read_file(path, &n);
    dp_st_file *f;

    // Cut inside the data, inside the header, inside the length field, and empty.
    size_t cuts[4] = {n - 4, 20, 5, 0};
    const char *needles[4] = {"run past", "runs past the end", "shorter than the 8-byte",
                              "shorter than the 8-byte"};
    for (int i = 0; i < 4; i++) {
        dp_test_write_file(cut, raw, cuts[i]);
        cr_assert_eq(dp_st_open(cut, &f), DP_ERR_FORMAT, "cut at %zu: %s", cuts[i],
                     dp_last_error());
        cr_assert(strstr(dp_last_error(), needles[i]), "cut at %zu: %s", cuts[i],
                  dp_last_error());
    }
    // A header length far past the end (and far past the 100 MiB limit).
    unsigned char big[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, '{', '}'};
    dp_test_write_file(cut, big, sizeof big);
    cr_assert_eq(dp_st_open(cut, &f), DP_ERR_FORMAT);
    cr_assert(strstr(dp_last_error(), "runs past the end"), "%s", dp_last_error());
    free(raw);
}

Test(safetensors, missing_file_is_io_error)
{
    char path[256];
    path_in(path, sizeof path, "nope.safetensors");
    dp_st_file *f;
    cr_assert_eq(dp_st_open(path, &f), DP_ERR_IO);
    cr_assert(strstr(dp_last_error(), "nope.safetensors") &&
                  strstr(dp_last_error(), "No such file"),
              "%s", dp_last_error());
    cr_assert_eq(dp_st_open(tmpdir, &f), DP_ERR_IO, "a directory is not a checkpoint");
    cr_assert_eq(dp_st_open(NULL, &f), DP_ERR_INVALID_ARGUMENT);
}

// ----------------------------------------------------------------------------
// atomic writes

static void write_one(const char *path, const char *name, const float *x, size_t n,
                      dp_status expect)
{
    dp_st_writer *w;
    dp_assert_ok(dp_st_writer_create(&w));
    dp_assert_ok(dp_st_writer_add(w, name, DP_DTYPE_F32, &n, 1, x));
    dp_status st = dp_st_writer_write(w, path);
    cr_assert_eq(st, expect, "writing %s: %s (%s)", path, dp_strerror(st), dp_last_error());
    dp_st_writer_destroy(w);
}

Test(safetensors, missing_directory_gives_io_error_and_no_temp_file)
{
    float x[2] = {1, 2};
    char path[256];
    path_in(path, sizeof path, "no/such/dir/model.safetensors");
    write_one(path, "x", x, 2, DP_ERR_IO);
    cr_assert(strstr(dp_last_error(), "model.safetensors") &&
                  strstr(dp_last_error(), "No such file"),
              "%s", dp_last_error());
    // A path through a regular file.
    char file[256];
    path_in(file, sizeof file, "plain");
    dp_test_write_file(file, "x", 1);
    path_in(path, sizeof path, "plain/model.safetensors");
    write_one(path, "x", x, 2, DP_ERR_IO);
    int tmp, n = count_entries(tmpdir, &tmp);
    cr_assert_eq(n, 1, "only 'plain' should exist");
    cr_assert_eq(tmp, 0);
}

Test(safetensors, unwritable_directory_gives_io_error)
{
    if (geteuid() == 0) {
        cleanup(); // .fini does not run for a skipped test
        cr_skip_test("running as root: directory permissions do not stop writes");
    }
    char dir[256];
    path_in(dir, sizeof dir, "ro");
    cr_assert_eq(mkdir(dir, 0555), 0);
    char path[300];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    float x[2] = {1, 2};
    write_one(path, "x", x, 2, DP_ERR_IO);
    cr_assert(strstr(dp_last_error(), "Permission denied"), "%s", dp_last_error());
    int tmp;
    cr_assert_eq(count_entries(dir, &tmp), 0);
}

Test(safetensors, overwrite_replaces_the_file)
{
    char path[256];
    path_in(path, sizeof path, "ckpt.safetensors");
    float a[2] = {1, 2}, b[3] = {3, 4, 5};
    write_one(path, "a", a, 2, DP_OK);
    write_one(path, "b", b, 3, DP_OK);
    dp_st_file *f;
    dp_assert_ok(dp_st_open(path, &f));
    cr_assert_eq(dp_st_count(f), 1);
    cr_assert_null(dp_st_find(f, "a"));
    const dp_st_tensor *t = dp_st_find(f, "b");
    cr_assert(t && t->numel == 3 && memcmp(t->data, b, sizeof b) == 0);
    dp_st_close(f);
    int tmp;
    cr_assert_eq(count_entries(tmpdir, &tmp), 1);
    cr_assert_eq(tmp, 0);
}

Test(safetensors, failed_write_keeps_the_old_file)
{
    char path[256];
    path_in(path, sizeof path, "ckpt.safetensors");
    float a[4] = {1, 2, 3, 4};
    write_one(path, "a", a, 4, DP_OK);
    size_t n_old;
    unsigned char *old = dp_test_read_file(path, &n_old);

    // Make the write fail half-way: a 64 KiB file size limit and a 1 MiB tensor.
    // The test runs in its own process, so the limit does not leak.
    size_t big_n = 1 << 18;
    float *big = calloc(big_n, sizeof *big);
    signal(SIGXFSZ, SIG_IGN); // get EFBIG from write() instead of a signal
    struct rlimit old_lim, lim;
    cr_assert_eq(getrlimit(RLIMIT_FSIZE, &old_lim), 0);
    lim = old_lim;
    lim.rlim_cur = 64 << 10;
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    dp_st_writer *w;
    dp_assert_ok(dp_st_writer_create(&w));
    dp_assert_ok(dp_st_writer_add(w, "big", DP_DTYPE_F32, &big_n, 1, big));
    dp_status st = dp_st_writer_write(w, path);
    setrlimit(RLIMIT_FSIZE, &old_lim);
    dp_st_writer_destroy(w);
    free(big);
    cr_assert_eq(st, DP_ERR_IO, "%s", dp_last_error());
    cr_assert(strstr(dp_last_error(), "tensor 'big'"), "%s", dp_last_error());

    size_t n_now;
    unsigned char *now = dp_test_read_file(path, &n_now);
    cr_assert_eq(n_now, n_old, "the old checkpoint changed size");
    cr_assert_eq(memcmp(now, old, n_old), 0, "the old checkpoint changed");
    int tmp;
    cr_assert_eq(count_entries(tmpdir, &tmp), 1);
    cr_assert_eq(tmp, 0, "a temporary file was left behind");
    free(old);
    free(now);
}

Test(safetensors, a_directory_target_is_refused_untouched)
{
    // The target is a non-empty directory: refused before anything is written.
    char path[256], inner[300];
    path_in(path, sizeof path, "target");
    cr_assert_eq(mkdir(path, 0755), 0);
    snprintf(inner, sizeof inner, "%s/keep", path);
    dp_test_write_file(inner, "k", 1);
    float a[2] = {1, 2};
    write_one(path, "a", a, 2, DP_ERR_IO);
    cr_assert(strstr(dp_last_error(), "is a directory"), "%s", dp_last_error());
    int tmp;
    cr_assert_eq(count_entries(tmpdir, &tmp), 1);
    cr_assert_eq(tmp, 0);
    struct stat sb;
    cr_assert(stat(inner, &sb) == 0, "the directory's content was touched");
}
