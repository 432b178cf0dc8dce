/*
 * examples/lm_train/eval.c - losses without training: the mean over
 * random batches of a split (during training), and the loss over the
 * whole validation split, or its first --val-tokens, in windows at
 * multiples of the context (after training and with --eval-only).
 */
#include <math.h>
#include <stdio.h>

#include "lm_train.h"

/* Evaluates the first rows of r->inputs and r->targets (every rank its
 * share): adds the batch's loss sum to *sum and its valid targets to *n. */
static int eval_batch(run *r, size_t rows, double *sum, size_t *n)
{
    dp_batch b = {rows, r->inputs, r->targets};
    dp_step_stats st;
    dp_status es = dp_engine_evaluate(r->engine, &b, &st);
    if (es != DP_OK) return engine_fail(r, es, "evaluate");
    *sum += st.loss * (double)st.valid_targets;
    *n += st.valid_targets;
    return 0;
}

/* Mean loss over eval_iters random batches of a split (with ranks, each
 * rank evaluates its rows of every batch; the loss is global); -1 (no
 * message) when a signal arrived, so the training loop saves and stops. */
static int estimate_loss(run *r, dp_sampler *s, double *out)
{
    size_t B = (size_t)r->o.batch_size;
    double sum = 0.0;
    size_t n = 0;
    for (long i = 0; i < r->o.eval_iters; i++) {
        /* A batch that fails (an id past the vocabulary) is agreed with
         * the signals, so every rank stops together, able to save. */
        int bad = dp_sampler_next(s, r->inputs, r->targets, B) != DP_OK ? cli_dp_fail("eval batch")
                                                                        : 0;
        int g = go_on(r, bad);
        if (g) return g > 0 ? -1 : 1;
        if (eval_batch(r, B, &sum, &n)) return 1;
    }
    *out = sum / (double)n;
    return 0;
}

/* Loss over the validation split: consecutive windows at multiples of the
 * context, the last incomplete one dropped. Window w reads tokens w*T ..
 * w*T + T (T inputs, the last target one further), so with --val-tokens N
 * the windows wholly within the first N tokens are W = min(all windows,
 * floor((N - 1) / T)): the same windows, in the same batches, as a split
 * of exactly N tokens: the loss is that split's, to the bit on the same
 * devices. With ranks every rank computes the same W (the same data and
 * command line) and evaluates its rows of each batch, so the collective
 * calls match. */
static int full_val_loss(run *r, double *out)
{
    size_t T = (size_t)r->o.context, B = (size_t)r->o.batch_size;
    size_t W = dp_eval_window_count(r->data, DP_SPLIT_VAL, T);
    if (!W)
        return AGREED_FAIL(r, "the validation split has fewer than context+1 = %zu tokens", T + 1);
    /* check_context made N > T, so the limit is at least one window. */
    size_t limit = r->o.val_tokens ? ((size_t)r->o.val_tokens - 1) / T : W;
    if (limit < W) {
        /* The loss no longer covers the whole split: say so, on a line of
         * its own so the val_loss lines read as before. */
        printf("validation: the first %zu of %zu tokens (--val-tokens %ld: %zu windows of "
               "context %zu)\n", limit * T + 1, dp_token_data_size(r->data, DP_SPLIT_VAL),
               r->o.val_tokens, limit, T);
        W = limit;
    }
    double sum = 0.0;
    size_t n = 0;
    for (size_t first = 0; first < W; first += B) {
        size_t rows = W - first < B ? W - first : B;
        int bad = dp_eval_windows(r->data, DP_SPLIT_VAL, T, first, rows, r->inputs,
                                  r->targets) != DP_OK ? cli_dp_fail("validation windows") : 0;
        int g = go_on(r, bad);
        if (g) return g > 0 ? interrupted(r, g, "the final evaluation") : 1;
        if (eval_batch(r, rows, &sum, &n)) return 1;
    }
    *out = sum / (double)n;
    return 0;
}

/* The evaluation every --eval-interval steps and at the last: prints
 * both splits' mean loss over --eval-iters batches; -1 (no message) when
 * a signal arrived, so the training loop saves and stops. */
int eval_step(run *r)
{
    double tl = 0, vl = 0; /* set when estimate_loss succeeds */
    int e = estimate_loss(r, r->eval_train, &tl);
    if (!e) e = estimate_loss(r, r->eval_val, &vl);
    if (e) return e;
    printf("%seval step %ld: train loss %.4f, val loss %.4f\n", r->tty ? "\n" : "", r->step, tl,
           vl);
    fflush(stdout);
    return 0;
}

int print_val_loss(run *r, int after_training)
{
    double vl = 0; /* set when full_val_loss succeeds */
    int rc = full_val_loss(r, &vl);
    /* --eval-only's answer is the loss: one that is no number is a
     * failure of the weights (their forward overflows), not a result */
    if (!rc && !after_training && !isfinite(vl))
        return AGREED_FAIL(r, "the validation loss is %g: the forward of %s %s overflows; "
                           "check those weights", vl, r->o.resume ? "--resume" : "--init-from",
                           r->o.resume ? r->o.resume : r->o.init_from);
    if (!rc && after_training) printf("final val_loss %.4f\n", vl);
    else if (!rc) printf("val_loss %.6f\n", vl);
    return rc;
}
