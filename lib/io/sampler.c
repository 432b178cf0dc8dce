/*
 * io/sampler.c - the seeded random batch sampler with a resumable state,
 * and fixed validation windows (dp/data.h). Both read tokens through
 * token_data_copy, so they work alike on data in memory and on files
 * mapped by token_files.c.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "dp/data.h"
#include "dp/rng.h"
#include "io/token_data.h"

// --- the random batch sampler ----------------------------------------------------------

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
    s->start = token_split_start(data, split);
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

// --- validation windows -----------------------------------------------------------------

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
                       "%zu windows from window %zu pass the %zu windows of context %zu in "
                       "the %s split (%zu tokens)",
                       count, first, nw, context, dp_split_name(split),
                       dp_token_data_size(data, split));
    size_t T = context, start = token_split_start(data, split);
    for (size_t r = 0; r < count; r++) {
        size_t w = start + (first + r) * T;
        DP_TRY(token_data_copy(data, w, T, inputs + r * T));      // (count,T)
        DP_TRY(token_data_copy(data, w + 1, T, targets + r * T)); // (count,T)
    }
    return DP_OK;
}
