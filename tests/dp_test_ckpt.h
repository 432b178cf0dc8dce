/*
 * tests/dp_test_ckpt.h - what the lm_train tests read back from a run:
 * its GPT checkpoints (parameters, moments, sampler state, compared bit
 * for bit) and the numbers it printed.
 */
#ifndef DP_TEST_CKPT_H
#define DP_TEST_CKPT_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dp_test.h"

/* The GPT checkpoint at path; the caller closes it. */
static inline dp_checkpoint *dp_test_load_ck(const char *path)
{
    dp_checkpoint *ck = NULL;
    dp_assert_ok(dp_gpt_checkpoint_load(path, &ck, NULL));
    return ck;
}

/* The number of parameters of the GPT a checkpoint holds. */
static inline size_t dp_test_ck_params(const dp_checkpoint *ck)
{
    dp_gpt_config c;
    dp_assert_ok(dp_gpt_config_from_metadata(ck, &c));
    dp_gpt *gpt = NULL;
    dp_assert_ok(dp_gpt_create(&c, &gpt));
    size_t n = dp_gpt_model(gpt, 0)->n_params;
    dp_gpt_destroy(gpt);
    return n;
}

/* Step counts, parameters and AdamW moments of the checkpoints at a and b
 * are the same bits (and with sampler, the batch sampler's state). */
static inline void dp_test_assert_same_state(const char *a_path, const char *b_path, int sampler)
{
    dp_checkpoint *a = dp_test_load_ck(a_path), *b = dp_test_load_ck(b_path);
    size_t n = dp_test_ck_params(a);
    cr_assert_eq(dp_test_ck_params(b), n);
    cr_assert_eq(a->step, b->step);
    cr_assert_eq(a->optimizer_step, b->optimizer_step);
    cr_assert(a->m && b->m);
    cr_assert_eq(memcmp(a->params, b->params, n * sizeof(float)), 0, "%s and %s: parameters "
                 "differ", a_path, b_path);
    cr_assert_eq(memcmp(a->m, b->m, n * sizeof(float)), 0, "%s and %s: m differs", a_path, b_path);
    cr_assert_eq(memcmp(a->v, b->v, n * sizeof(float)), 0, "%s and %s: v differs", a_path, b_path);
    if (sampler) {
        cr_assert(a->has_sampler && b->has_sampler);
        cr_assert_eq(memcmp(a->sampler, b->sampler, sizeof a->sampler), 0,
                     "%s and %s: sampler state differs", a_path, b_path);
    }
    dp_checkpoint_close(a);
    dp_checkpoint_close(b);
}

/* The number after the last `key` in text, or NAN. */
static inline double dp_test_number_after(const char *text, const char *key)
{
    const char *p = NULL, *q = text;
    while ((q = strstr(q, key))) p = q++;
    if (!p) return NAN;
    char *end = NULL;
    double x = strtod(p + strlen(key), &end);
    return end == p + strlen(key) ? NAN : x;
}

#endif /* DP_TEST_CKPT_H */
