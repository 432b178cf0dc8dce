/*
 * dp/sample.h - drawing the next token from a row of logits, on the host:
 * top-k filtering, a softmax with temperature and one uniform draw, as
 * nanoGPT's sample.py and llm.c's sampler do. lm_train's samples come
 * from here.
 */
#ifndef DP_SAMPLE_H
#define DP_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "dp/export.h"
#include "dp/rng.h"
#include "dp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Picks a token id in [0, V) from one row of logits.
 *
 *   logits       (V,) host floats, e.g. the last position's row of a
 *                forward; read only. -inf is allowed: that id is never
 *                picked.
 *   V            the vocabulary size, 1 <= V <= 2^31 (ids are int32).
 *   temperature  > 0 and finite: the logits are divided by it (below 1
 *                sharpens the distribution, above 1 flattens it).
 *   top_k        0 or >= V: every id may be picked; else only ids whose
 *                logit is >= the top_k-th largest logit (counted with
 *                repeats, as in the logits sorted in decreasing order),
 *                so ties at that value keep more than top_k ids.
 *   rng          the generator; each call with valid arguments takes
 *                exactly one dp_rng_uniform draw, whatever the logits
 *                (also when it fails with DP_ERR_NON_FINITE), so a seeded
 *                stream of calls is reproducible. Invalid arguments take
 *                none.
 *   work         (V,) host floats of scratch, not overlapping logits. On
 *                DP_OK, work[j] holds id j's unnormalised probability
 *                p_j (float); work[j] / sum(work) is the distribution.
 *   id           receives the id (untouched on failure).
 *
 * The arithmetic, fixed so that a seed gives the same ids on every
 * machine: p_j = exp((logit_j - max) / temperature) in double (the
 * difference in float), 0 for ids filtered out by top_k; z = the sum of
 * the p_j in double, in id order; u = dp_rng_uniform(rng) * z; the id is
 * the first j with p_j > 0 whose running sum of the float-rounded p_j
 * passes u. Should rounding leave u at or past the last running sum (at
 * most one value of the 2^24 the draw takes), the id is V - 1.
 *
 * Cost: O(V) host work, plus O(top_k * V) comparisons to find the
 * top_k-th largest logit when 0 < top_k < V. Nothing is allocated; the
 * caller owns every buffer. Reentrant; a dp_rng must not be shared
 * between threads without a lock.
 *
 * Errors: DP_ERR_INVALID_ARGUMENT (logits, rng, work or id NULL; V == 0 or
 * V > 2^31; temperature not > 0 or not finite; work overlapping logits),
 * DP_ERR_NON_FINITE (a NaN or +inf logit, or every logit -inf: there is
 * no distribution to draw from).
 */
DP_API dp_status dp_sample_logits(const float *logits, size_t V, double temperature,
                                  size_t top_k, dp_rng *rng, float *work, int32_t *id);

#ifdef __cplusplus
}
#endif

#endif /* DP_SAMPLE_H */
