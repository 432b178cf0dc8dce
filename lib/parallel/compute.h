/*
 * parallel/compute.h - the compute phases of a step on one worker:
 * forward, criterion and backward over its micro-batches of a plan.
 * Balanced mode runs the criterion on every device; gather mode
 * (nn.DataParallel) gathers the logits on the root, which computes the
 * loss and dlogits for the whole micro-batch and scatters each device its
 * slice (comm.h). A model with a head (dp/model.h) forwards to its
 * features; balanced mode then runs head, criterion and head backward over
 * chunks of the output rows, so no device holds its whole logits.
 * Each sets w->loss_sum, this worker's loss sum over its rows. A
 * prediction runs the forward alone and keeps the logits.
 */
#ifndef DP_PARALLEL_COMPUTE_H
#define DP_PARALLEL_COMPUTE_H

#include "parallel/state.h"

/* Inside a job (pool.h): forward, criterion (and backward when train)
 * over this worker's micro-batches, the criterion on each device ... */
void dp_compute_balanced(worker *w, const dp_plan *plan, int train);
/* ... or on the root over every device's gathered logits (gather mode). */
void dp_compute_gather(worker *w, const dp_plan *plan);

/* Inside a job: the forward (and the head, chunk by chunk) of this
 * worker's micro-batches into w->outputs, the logits of its rows, kept
 * there (balanced); in gather mode the root then gathers every local
 * device's (nn.DataParallel's output gather) and holds them all. Sets
 * w->out_begin and w->out_rows to the rows it holds. */
void dp_compute_predict(worker *w, const dp_plan *plan);

#endif /* DP_PARALLEL_COMPUTE_H */
