/*
 * nn/crossentropy.c - fused softmax cross-entropy (dp/nn.h).
 *
 * The backend writes one loss per row (and dlogits) on the device; only
 * those N floats come to the host, where they are summed in row order in
 * double so the loss sum does not depend on the backend's reduction order.
 * The bundled criterion writes them to the engine's row losses instead,
 * when the engine gives them (dp_criterion.writes_row_losses): the engine
 * sums them the same way once per step. It also takes bfloat16 logits
 * (dp_criterion.bf16_logits): dp_crossentropy_bf16 (nn/nn_act16.h) then
 * writes bfloat16 dlogits over them.
 */
#include <math.h>
#include <string.h>

#include "nn/nn_act16.h"
#include "nn/nn_check.h"

#include "dp/model.h"
#include "dp/nn.h"

/* Losses are copied to the host in chunks of this many floats, so no host
 * allocation (which could fail) is needed. */
#define LOSS_CHUNK 1024

/* The arguments of the backend's kernel, checked in the calling function
 * (so its name heads the message): the pointers, N and V, dscale. */
#define CE_CHECKS(dev, losses, logits, targets, N, V, dscale)                              \
    do {                                                                                  \
        size_t ce_n_;                                                                     \
        DP_NN_REQUIRE_PTR(dev, losses);                                                   \
        DP_NN_REQUIRE_PTR(dev, logits);                                                   \
        DP_NN_REQUIRE_PTR(dev, targets);                                                  \
        DP_NN_CHECK_DIMS2(dev, N, V, &ce_n_);                                             \
        if ((V) > (size_t)INT32_MAX)                                                      \
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: V=%zu does not fit the int32 "   \
                           "targets", (dev)->name, (size_t)(V));                          \
        if (!isfinite(dscale))                                                            \
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: dscale must be finite (got %g); " \
                           "it is usually 1/N_global with N_global > 0", (dev)->name,      \
                           (double)(dscale));                                             \
    } while (0)

/* *sum_host = the N device losses summed on the host in row order in
 * double (so the sum does not depend on the backend's reduction order). */
static dp_status loss_sum_to_host(dp_device *dev, double *sum_host, const float *losses,
                                  size_t N)
{
    float chunk[LOSS_CHUNK];
    double sum = 0.0;
    for (size_t i0 = 0; i0 < N; i0 += LOSS_CHUNK) {
        size_t len = N - i0 < LOSS_CHUNK ? N - i0 : LOSS_CHUNK;
        DP_TRY(dev->ops->copy_d2h(dev, chunk, losses + i0, len * sizeof(float)));
        for (size_t i = 0; i < len; i++) sum += (double)chunk[i];
    }
    *sum_host = sum;
    return DP_OK;
}

dp_status dp_crossentropy_forward_backward(dp_device *dev, double *loss_sum_host,
                                           float *dlogits, float *losses, const float *logits,
                                           const int32_t *targets, size_t N, size_t V,
                                           float dscale)
{
    DP_NN_REQUIRE_DEV(dev);
    if (!loss_sum_host)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: loss_sum_host must not be NULL; pass the "
                       "address of a host double", dev->name);
    CE_CHECKS(dev, losses, logits, targets, N, V, dscale);
    *loss_sum_host = 0.0;
    DP_TRY(dev->ops->crossentropy(dev, losses, dlogits, logits, targets, V, dscale, N));
    return loss_sum_to_host(dev, loss_sum_host, losses, N);
}

dp_status dp_crossentropy_bf16(dp_device *dev, float *losses, uint16_t *dlogits,
                               const uint16_t *logits, const int32_t *targets, size_t N,
                               size_t V, float dscale)
{
    DP_NN_REQUIRE_DEV(dev);
    CE_CHECKS(dev, losses, logits, targets, N, V, dscale);
    return dev->ops->crossentropy_bf16(dev, losses, dlogits, logits, targets, V, dscale, N);
}

// --- the bundled criterion (dp/model.h) ------------------------------------------

static size_t ce_scratch_bytes(void *ctx, size_t n, size_t V)
{
    (void)ctx;
    (void)V;
    return n * sizeof(float); /* per-row losses */
}

static dp_status ce_forward_backward(void *ctx, const dp_criterion_args *a,
                                     double *loss_sum_host, size_t *count_host)
{
    (void)ctx;
    if (a->target_type != DP_TARGET_CLASS || a->target_size != 1)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "cross-entropy takes one int32 class id per "
                       "output row (got target type %s, %zu per row)",
                       dp_target_type_name(a->target_type), a->target_size);
    if (a->logits_dtype == DP_DTYPE_BF16) {
        /* bfloat16 logits, dlogits written over them as bfloat16 */
        uint16_t *dl = (uint16_t *)a->dlogits;
        const uint16_t *lg = (const uint16_t *)a->logits;
        const int32_t *tg = (const int32_t *)a->targets;
        DP_NN_REQUIRE_DEV(a->dev);
        if (a->row_losses)
            DP_TRY(dp_crossentropy_bf16(a->dev, a->row_losses, dl, lg, tg, a->n, a->V,
                                        a->dscale));
        else {
            if (!loss_sum_host)
                return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: loss_sum_host must not be NULL "
                               "without row losses", a->dev->name);
            *loss_sum_host = 0.0;
            DP_TRY(dp_crossentropy_bf16(a->dev, a->scratch, dl, lg, tg, a->n, a->V, a->dscale));
            DP_TRY(loss_sum_to_host(a->dev, loss_sum_host, a->scratch, a->n));
        }
    } else if (a->row_losses) {
        /* the engine's: each row's loss stays on the device */
        CE_CHECKS(a->dev, a->row_losses, a->logits, a->targets, a->n, a->V, a->dscale);
        DP_TRY(a->dev->ops->crossentropy(a->dev, a->row_losses, a->dlogits, a->logits,
                                         (const int32_t *)a->targets, a->V, a->dscale, a->n));
    } else
        DP_TRY(dp_crossentropy_forward_backward(a->dev, loss_sum_host, a->dlogits, a->scratch,
                                                a->logits, a->targets, a->n, a->V, a->dscale));
    /* The kernel skips -1 targets, the ones the engine leaves out of n_valid. */
    *count_host = a->n_valid;
    return DP_OK;
}

dp_criterion dp_criterion_cross_entropy(void)
{
    dp_criterion c;
    memset(&c, 0, sizeof c);
    c.scratch_bytes = ce_scratch_bytes;
    c.forward_backward = ce_forward_backward;
    c.writes_row_losses = 1;
    c.bf16_logits = 1;
    c.replayable = 1; /* device work only, with row losses */
    return c;
}
