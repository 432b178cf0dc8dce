/*
 * parallel/callbacks.c - the engine's calls of the model's callbacks
 * (callbacks.h): each on the worker's replica, buffers and rows, its
 * failure turned into "<the callback>: <its message>".
 */
#include "parallel/callbacks.h"
#include "parallel/overlap.h"
#include "parallel/plan.h" /* dp_callback_message */

/* The model's forward into logits, or into the features for a model with
 * a head (the head makes the logits). */
dp_status dp_call_forward(worker *w, const dp_chunk *c, float *logits)
{
    const dp_model *m = &w->e->model;
    dp_clear_error();
    float *out = m->head_forward ? w->features.ptr : logits;
    dp_status s = m->forward(m->ctx, w->dev, dp_replica_params(w), c, w->workspace.ptr, out);
    if (s != DP_OK) s = dp_callback_message(s, "the model's forward");
    return s;
}

/* last: the device's last backward of the step, whose dp_grads_ready
 * signals make its gradient final (overlap.h). */
dp_status dp_call_backward(worker *w, const dp_chunk *c, float *dlogits, int last)
{
    const dp_model *m = &w->e->model;
    dp_chunk armed = *c;
    dp_overlap_arm(w, &armed, last);
    dp_clear_error();
    dp_status s = m->backward(m->ctx, w->dev, dp_replica_params(w), w->grads, &armed,
                              w->workspace.ptr, dlogits);
    /* A refused signal fails the step even when the backward swallowed it. */
    dp_status refused = dp_overlap_disarm(w, s == DP_OK);
    if (s == DP_OK) s = refused;
    if (s != DP_OK) s = dp_callback_message(s, "the model's backward");
    return s;
}

/* logits(rows, V) of output rows [o, o + rows) of the features. */
dp_status dp_call_head_forward(worker *w, size_t o, size_t rows, float *logits)
{
    const dp_model *m = &w->e->model;
    const float *f = (const float *)w->features.ptr + o * m->head_features;
    dp_clear_error();
    dp_status s = m->head_forward(m->ctx, w->dev, dp_replica_params(w), f, rows, logits);
    if (s != DP_OK) s = dp_callback_message(s, "the model's head_forward");
    return s;
}

/* Head gradients += and dfeatures of output rows [o, o + rows), from dlogits(rows, V). */
dp_status dp_call_head_backward(worker *w, size_t o, size_t rows, float *dlogits)
{
    const dp_model *m = &w->e->model;
    size_t at = o * m->head_features;
    dp_clear_error();
    dp_status s = m->head_backward(m->ctx, w->dev, dp_replica_params(w), w->grads,
                                   (const float *)w->features.ptr + at, rows, dlogits,
                                   (float *)w->dfeatures.ptr + at);
    if (s != DP_OK) s = dp_callback_message(s, "the model's head_backward");
    return s;
}

/* head_forward in bfloat16 logits, with the chunk buffer's scratch. */
dp_status dp_call_head_forward16(worker *w, size_t o, size_t rows, uint16_t *logits, float *scratch,
                                size_t scratch_floats)
{
    const dp_model *m = &w->e->model;
    const float *f = (const float *)w->features.ptr + o * m->head_features;
    dp_clear_error();
    dp_status s = m->head_forward_bf16(m->ctx, w->dev, dp_replica_params(w), f, rows, logits,
                                       scratch, scratch_floats);
    if (s != DP_OK) s = dp_callback_message(s, "the model's head_forward_bf16");
    return s;
}

dp_status dp_call_head_backward16(worker *w, size_t o, size_t rows, const uint16_t *dlogits)
{
    const dp_model *m = &w->e->model;
    size_t at = o * m->head_features;
    dp_clear_error();
    dp_status s = m->head_backward_bf16(m->ctx, w->dev, dp_replica_params(w), w->grads,
                                        (const float *)w->features.ptr + at, rows, dlogits,
                                        (float *)w->dfeatures.ptr + at);
    if (s != DP_OK) s = dp_callback_message(s, "the model's head_backward_bf16");
    return s;
}
