/*
 * tests/gpt_reference.h - the PyTorch float64 reference of a tiny GPT
 * (tests/data/gpt_reference.bin, written by tests/gen_gpt_reference.py):
 * its configuration, batch, loss, logits and every parameter (exact
 * float16 values) with its gradient, as test_gpt and test_gpt_hf read it.
 */
#ifndef DP_TEST_GPT_REFERENCE_H
#define DP_TEST_GPT_REFERENCE_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

static inline void *dp_test_ref_alloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    cr_assert_not_null(p, "out of host memory");
    return p;
}

/* IEEE binary16 -> float (exact). */
static inline float dp_test_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
    float f;
    if (exp == 0) {
        f = ldexpf((float)man, -24); /* zero or subnormal */
    } else if (exp == 31) {
        f = man ? NAN : INFINITY;
    } else {
        f = ldexpf((float)(man | 0x400), (int)exp - 25);
    }
    return sign ? -f : f;
}

// --- the PyTorch reference file -----------------------------------------------------------

typedef struct ref_tensor {
    char name[96];
    size_t numel;
    float *param, *grad;
} ref_tensor;

typedef struct reference {
    uint32_t V, BS, L, NH, C, B;
    int32_t *tokens, *targets; /* (B,T) */
    double loss;
    float *logits; /* (B,T,V) */
    size_t n_tensors;
    ref_tensor *t;
} reference;

/* The data file sits next to this source file (CMake passes absolute paths). */
static inline FILE *dp_test_open_reference(void)
{
    char path[4096];
    const char *src = __FILE__, *slash = strrchr(src, '/');
    size_t dir = slash ? (size_t)(slash - src + 1) : 0;
    snprintf(path, sizeof path, "%.*sdata/gpt_reference.bin", (int)dir, src);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s; regenerate it with /usr/bin/python3 "
                          "tests/gen_gpt_reference.py", path);
    return f;
}

static inline void dp_test_ref_read(FILE *f, void *dst, size_t bytes)
{
    cr_assert_eq(fread(dst, 1, bytes, f), bytes, "gpt_reference.bin is truncated");
}

static inline uint32_t dp_test_ref_u32(FILE *f)
{
    unsigned char b[4];
    dp_test_ref_read(f, b, 4);
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* The file is little-endian; so are the machines dp targets (x86-64, arm64). */
static inline void dp_test_load_reference(reference *r)
{
    FILE *f = dp_test_open_reference();
    char magic[8];
    dp_test_ref_read(f, magic, 8);
    cr_assert(memcmp(magic, "DPGPTREF", 8) == 0, "bad magic in gpt_reference.bin");
    cr_assert_eq(dp_test_ref_u32(f), 1, "unknown gpt_reference.bin version");
    r->V = dp_test_ref_u32(f);
    r->BS = dp_test_ref_u32(f);
    r->L = dp_test_ref_u32(f);
    r->NH = dp_test_ref_u32(f);
    r->C = dp_test_ref_u32(f);
    r->B = dp_test_ref_u32(f);
    size_t BT = (size_t)r->B * r->BS;
    r->tokens = dp_test_ref_alloc(BT * sizeof(int32_t));
    r->targets = dp_test_ref_alloc(BT * sizeof(int32_t));
    dp_test_ref_read(f, r->tokens, BT * sizeof(int32_t));
    dp_test_ref_read(f, r->targets, BT * sizeof(int32_t));
    dp_test_ref_read(f, &r->loss, sizeof r->loss);
    r->logits = dp_test_ref_alloc(BT * r->V * sizeof(float));
    dp_test_ref_read(f, r->logits, BT * r->V * sizeof(float));
    r->n_tensors = dp_test_ref_u32(f);
    r->t = dp_test_ref_alloc(r->n_tensors * sizeof *r->t);
    for (size_t i = 0; i < r->n_tensors; i++) {
        ref_tensor *t = &r->t[i];
        uint32_t len = dp_test_ref_u32(f);
        cr_assert_lt(len, sizeof t->name);
        dp_test_ref_read(f, t->name, len);
        t->name[len] = '\0';
        uint64_t numel;
        dp_test_ref_read(f, &numel, 8);
        t->numel = (size_t)numel;
        uint16_t *h = dp_test_ref_alloc(t->numel * sizeof *h);
        dp_test_ref_read(f, h, t->numel * sizeof *h);
        t->param = dp_test_ref_alloc(t->numel * sizeof(float));
        for (size_t k = 0; k < t->numel; k++) t->param[k] = dp_test_half_to_float(h[k]);
        free(h);
        t->grad = dp_test_ref_alloc(t->numel * sizeof(float));
        dp_test_ref_read(f, t->grad, t->numel * sizeof(float));
    }
    char extra;
    cr_assert_eq(fread(&extra, 1, 1, f), 0, "trailing bytes in gpt_reference.bin");
    fclose(f);
}

static inline void dp_test_free_reference(reference *r)
{
    for (size_t i = 0; i < r->n_tensors; i++) {
        free(r->t[i].param);
        free(r->t[i].grad);
    }
    free(r->t);
    free(r->tokens);
    free(r->targets);
    free(r->logits);
}

#endif /* DP_TEST_GPT_REFERENCE_H */
