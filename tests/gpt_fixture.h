/*
 * tests/gpt_fixture.h - a tiny GPT configuration and deterministic token
 * batches shared by the GPT tests on CPU and on CUDA devices.
 */
#ifndef DP_TEST_GPT_FIXTURE_H
#define DP_TEST_GPT_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "dp/rng.h"

enum { EV = 37, EBS = 8, EL = 2, ENH = 2, EC = 16, EROWS = 5 };

/* Batch for step s: random tokens, targets the next token, some ignored. */
static inline void dp_test_gpt_batch(int s, size_t rows, int32_t *tok, int32_t *tgt)
{
    dp_rng rng;
    dp_rng_seed(&rng, 500 + (uint64_t)s);
    for (size_t r = 0; r < rows; r++) {
        int32_t seq[EBS + 1];
        for (size_t t = 0; t <= EBS; t++) seq[t] = (int32_t)dp_rng_below(&rng, EV);
        for (size_t t = 0; t < EBS; t++) {
            tok[r * EBS + t] = seq[t];
            tgt[r * EBS + t] = (r * EBS + t) % 7 == 3 ? -1 : seq[t + 1];
        }
    }
}

#endif /* DP_TEST_GPT_FIXTURE_H */
