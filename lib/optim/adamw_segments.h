/*
 * optim/adamw_segments.h - AdamW over several tensors of one optimizer
 * slice in one call, with the clipping factor and the bf16 replica's
 * refresh fused in (the engine's update, parallel/optimizer.c). Internal.
 */
#ifndef DP_OPTIM_ADAMW_SEGMENTS_H
#define DP_OPTIM_ADAMW_SEGMENTS_H

#include <stdint.h>

#include "core/module.h"
#include "dp/device.h"
#include "kernels/optim.h"

/*
 * For every element i of the segments of segs (each with its weight
 * decay; the elements between segments untouched): grads[i] *= clip
 * (unless clip is 1), AdamW step t on params[i], m[i], v[i] (as
 * dp_adamw_update), and with replica (else NULL) replica[i] = params[i]
 * rounded to bfloat16 (as dp_convert). The same bits as those three calls
 * per segment, which is what runs on a backend without the fused entry;
 * with it, one launch. Pointers are device memory of dev at the call's
 * element 0 (segs->begin[0] = 0). Errors: DP_ERR_INVALID_ARGUMENT for
 * NULL pointers, a table that is empty, too long, not ascending or not
 * starting at 0, t < 1, hyper-parameters dp_adamw_update refuses, or a
 * clip factor that is not finite and > 0; DP_ERR_DEVICE. (DP_MODULE_API:
 * visible to the tests.)
 */
DP_MODULE_API dp_status dp_adamw_update_segments(dp_device *dev, float *params, float *grads,
                                                 float *m, float *v, uint16_t *replica,
                                                 const dp_adamw_segs *segs, float lr,
                                                 float beta1, float beta2, float eps, long t,
                                                 float clip);

#endif /* DP_OPTIM_ADAMW_SEGMENTS_H */
