/*
 * optim/clip.h - the clipping factor of global-norm clipping, shared by
 * dp_clip_grad_norm and the engine (which sums the norm over slices on
 * several devices, then scales each slice). Internal.
 */
#ifndef DP_OPTIM_CLIP_H
#define DP_OPTIM_CLIP_H

/* The factor torch.nn.utils.clip_grad_norm_ scales gradients of global L2
 * norm `norm` by: max_norm / (norm + 1e-6) when max_norm > 0 and norm >
 * max_norm, else exactly 1 (no scaling). */
float dp_clip_factor(double norm, float max_norm);

#endif /* DP_OPTIM_CLIP_H */
