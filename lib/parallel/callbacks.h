/*
 * parallel/callbacks.h - the engine's calls of the model's callbacks
 * (dp/model.h) on one worker: its replica, gradient, workspace and
 * features, the error cleared before and the callback named in the
 * message after (dp_callback_message). o and rows count output rows of
 * the micro-batch's features (a model with a head).
 */
#ifndef DP_PARALLEL_CALLBACKS_H
#define DP_PARALLEL_CALLBACKS_H

#include <stdint.h>

#include "parallel/state.h"

/* forward into logits, or into w->features for a model with a head */
dp_status dp_call_forward(worker *w, const dp_chunk *c, float *logits);
/* backward from dlogits (dfeatures with a head); last: the device's last
 * backward of the step, whose dp_grads_ready signals make its gradient
 * final (overlap.h) */
dp_status dp_call_backward(worker *w, const dp_chunk *c, float *dlogits, int last);
/* the head over output rows [o, o + rows): logits(rows, V) ... */
dp_status dp_call_head_forward(worker *w, size_t o, size_t rows, float *logits);
/* ... and its backward: head gradients += and those rows of w->dfeatures */
dp_status dp_call_head_backward(worker *w, size_t o, size_t rows, float *dlogits);
/* the same in bfloat16 logits (dp_model.head_forward_bf16), with the
 * chunk buffer's float32 scratch */
dp_status dp_call_head_forward16(worker *w, size_t o, size_t rows, uint16_t *logits,
                                 float *scratch, size_t scratch_floats);
dp_status dp_call_head_backward16(worker *w, size_t o, size_t rows, const uint16_t *dlogits);

#endif /* DP_PARALLEL_CALLBACKS_H */
