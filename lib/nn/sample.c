/*
 * nn/sample.c - dp_sample_logits (dp/sample.h): top-k filtering, softmax
 * with temperature and one uniform draw over a row of logits, on the
 * host. The arithmetic is lm_train's sampler's, kept to the bit so that
 * a seed gives the samples it always gave.
 */
#include <math.h>
#include <stdint.h>

#include "core/error.h"
#include "dp/sample.h"

/* The top_k-th largest of x[0..V), counting repeats, by top_k passes of
 * selection over work (a copy of x): each pass takes the first largest
 * value left and removes it. 0 < top_k < V; x holds no NaN. */
static float kth_largest(const float *x, size_t V, size_t top_k, float *work)
{
    for (size_t j = 0; j < V; j++) work[j] = x[j];
    float kth = -INFINITY;
    for (size_t k = 0; k < top_k; k++) {
        size_t best = 0;
        for (size_t j = 1; j < V; j++)
            if (work[j] > work[best]) best = j;
        kth = work[best];
        work[best] = -INFINITY;
    }
    return kth;
}

static int overlap(const float *a, const float *b, size_t n)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b, bytes = (uintptr_t)n * sizeof(float);
    return x < y + bytes && y < x + bytes;
}

dp_status dp_sample_logits(const float *logits, size_t V, double temperature, size_t top_k,
                           dp_rng *rng, float *work, int32_t *id)
{
    const char *null = !logits ? "logits" : !rng ? "rng" : !work ? "work" : !id ? "id" : NULL;
    if (null) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s must not be NULL", null);
    if (V == 0 || V - 1 > (size_t)INT32_MAX)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "V = %zu: the vocabulary must have 1 to 2^31 "
                       "ids (ids are int32)", V);
    if (!(temperature > 0) || !isfinite(temperature))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "temperature %g: it must be a finite number > 0 "
                       "(1 samples the model's distribution as it is)", temperature);
    if (overlap(logits, work, V))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "work overlaps logits; pass a separate buffer of "
                       "V = %zu floats", V);
    /* The one draw, taken first so that the stream does not depend on the logits. */
    float draw = dp_rng_uniform(rng);

    float mx = -INFINITY;
    for (size_t j = 0; j < V; j++) {
        if (isnan(logits[j]) || logits[j] == INFINITY)
            return DP_FAIL(DP_ERR_NON_FINITE, "logit %zu of %zu is %s; sample from finite "
                           "logits (-inf excludes an id)", j, V, isnan(logits[j]) ? "NaN" : "+inf");
        mx = logits[j] > mx ? logits[j] : mx;
    }
    if (mx == -INFINITY)
        return DP_FAIL(DP_ERR_NON_FINITE, "all %zu logits are -inf: no id can be picked", V);

    float kth = top_k > 0 && top_k < V ? kth_largest(logits, V, top_k, work) : -INFINITY;
    double z = 0.0;
    for (size_t j = 0; j < V; j++) {
        double p = logits[j] < kth ? 0.0 : exp((logits[j] - mx) / temperature);
        work[j] = (float)p;
        z += p;
    }
    double u = draw * z, acc = 0.0;
    size_t pick = V - 1;
    for (size_t j = 0; j < V; j++) {
        acc += work[j];
        if (u < acc && work[j] > 0) {
            pick = j;
            break;
        }
    }
    *id = (int32_t)pick;
    return DP_OK;
}
