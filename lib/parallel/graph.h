/*
 * parallel/graph.h - a worker's compute phase recorded once as a device
 * graph and replayed (CUDA graphs, backend/device_graph.h), so that a
 * step's hundreds of launches cost the host one.
 *
 * A replay runs the recorded device work and none of the host code, so
 * what the host decides per step is frozen at the recording: the plan's
 * rows and micro-batches, the loss scale 1/N, which logits chunks have
 * ignored targets (a kernel more), the buffers' addresses, the backend's
 * scratch (its epoch), the matmul precision. Those make a recording's key;
 * a step replays only a recording of its own key. Taken only where every
 * callback says its device work is the same every step
 * (dp_model.replayable, dp_criterion.replayable), with row losses (read
 * back after the replay; they also make it complete before the step goes
 * on), never while the reduce-scatter overlaps the backward (its signals
 * are host calls), and on devices that record (CUDA with
 * DP_CUDA_GRAPHS=1). A key is recorded the second time it is seen: the
 * first step of a key runs eagerly, sizing every buffer and making the
 * libraries' one-time choices (cuDNN's plans, cuBLASLt's algorithms),
 * which cannot happen inside a recording. A recording that fails (a call
 * that waits for the device, allocates or copies host memory) leaves its
 * key eager for good, and that step runs eagerly: the same bits.
 */
#ifndef DP_PARALLEL_GRAPH_H
#define DP_PARALLEL_GRAPH_H

#include "parallel/state.h"

/* The compute phase itself. recording 0: as ever, entering the phases;
 * recording 1: while the device records, entering none (a phase's timing
 * marks are events, refused inside a recording). Returns the first
 * failure (after dp_worker_enter_phase's own, w->status). */
typedef dp_status (*dp_graph_body)(worker *w, const dp_plan *plan, int train, int recording);

/* Runs body(w, plan, train, 0), or a replay of its recording, or records
 * it and launches the recording (see above); a replay or a launch enters
 * DP_PHASE_FORWARD for all of it. valid_key: a hash of how many valid
 * targets each of the body's criterion calls has (compute.c). Inside a
 * job, on w's thread. */
dp_status dp_graph_compute(worker *w, const dp_plan *plan, int train, uint64_t valid_key,
                           dp_graph_body body);

/* 1 when dp_graph_compute may record or replay w's compute phase. */
int dp_graph_eligible(const worker *w);

/* Frees w's recordings (the device open, none of them running). */
void dp_graph_release(worker *w);

#endif /* DP_PARALLEL_GRAPH_H */
