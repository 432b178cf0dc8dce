/*
 * optim/schedule.c - the learning-rate schedule of nanoGPT / llm.c: linear
 * warmup, then cosine decay to min_lr at max_steps, then min_lr.
 *
 * The function returns a float, so it cannot return a status: bad
 * arguments give NaN and record DP_ERR_INVALID_ARGUMENT in dp_last_error().
 * dp_adamw_update and dp_sgd_update refuse a NaN learning rate, so a bad
 * schedule stops training with that message instead of corrupting weights.
 */
#include <math.h>

#include "core/error.h"
#include "dp/optim.h"

float dp_lr_schedule(long step, long warmup, long max_steps, float lr, float min_lr)
{
    if (step < 0 || warmup < 0 || max_steps < 0) {
        DP_FAIL(DP_ERR_INVALID_ARGUMENT, "step (%ld), warmup (%ld) and max_steps (%ld) must be "
                ">= 0", step, warmup, max_steps);
        return NAN;
    }
    if (!isfinite(lr) || !isfinite(min_lr)) {
        DP_FAIL(DP_ERR_INVALID_ARGUMENT, "lr (%g) and min_lr (%g) must be finite", (double)lr,
                (double)min_lr);
        return NAN;
    }
    /* Warmup: (step+1)/warmup reaches lr on the last warmup step instead of
     * spending step 0 at a learning rate of zero. */
    if (step < warmup) return (float)((double)lr * (double)(step + 1) / (double)warmup);
    /* Also covers max_steps <= warmup, where there is no decay phase. */
    if (step >= max_steps) return min_lr;
    const double pi = 3.14159265358979323846;
    double ratio = (double)(step - warmup) / (double)(max_steps - warmup); /* in [0, 1) */
    double coeff = 0.5 * (1.0 + cos(pi * ratio));                         /* 1 -> 0 */
    return (float)((double)min_lr + coeff * ((double)lr - (double)min_lr));
}
