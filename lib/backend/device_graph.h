/*
 * backend/device_graph.h - a device's queued work recorded once as a graph
 * and replayed (CUDA graphs), for the engine's compute phase
 * (parallel/graph.c). Internal: not installed.
 *
 * Between dp_device_graph_begin and dp_device_graph_end, the calls made on
 * the device queue nothing: the backend records them. A replay then runs
 * exactly the recorded device work - the same kernels with the same
 * arguments on the same buffers - and none of the host code around it. So
 * what may be recorded is work whose host side decides nothing per call:
 * while recording, every call that would wait for the device, read its
 * results on the host, copy from host memory or allocate fails with
 * DP_ERR_UNSUPPORTED (dp_device_refuse_recording), and the recording is
 * then dropped by dp_device_graph_end. One thread records a device at a
 * time, on the device's own queue.
 */
#ifndef DP_BACKEND_DEVICE_GRAPH_H
#define DP_BACKEND_DEVICE_GRAPH_H

#include <stdint.h>

#include "backend/backend.h"
#include "core/error.h"
#include "dp/device.h"

/* A recorded graph of one device (the backend's handle). */
typedef struct dp_device_graph dp_device_graph;

/* Starts recording dev's queue. DP_ERR_UNSUPPORTED where the backend has
 * no graphs (CPU devices) or has them off (CUDA without
 * DP_CUDA_GRAPHS=1); DP_ERR_INVALID_ARGUMENT when dev is recording already. */
dp_status dp_device_graph_begin(dp_device *dev);

/* Stops recording dev's queue (always, once begun) and gives the graph in
 * *out, owned by the caller (dp_device_graph_destroy). Fails, *out NULL,
 * where a call made while recording failed or the backend could not make
 * the graph; nothing recorded has run then. */
dp_status dp_device_graph_end(dp_device *dev, dp_device_graph **out);

/* Queues one replay of g on dev, the device that recorded it. */
dp_status dp_device_graph_launch(dp_device *dev, dp_device_graph *g);

/* Frees g (NULL: nothing); dev is the device that recorded it. */
void dp_device_graph_destroy(dp_device *dev, dp_device_graph *g);

/* A count of the backend's reallocations of its own scratch on dev
 * (column sums' partials, converted operands, ...): a graph recorded at
 * another value may name memory freed since. 0 on a backend without graphs. */
uint64_t dp_device_graph_epoch(dp_device *dev);

/* 1 while dev's queue is being recorded. */
int dp_device_graph_recording(const dp_device *dev);

/* DP_OK, or DP_ERR_UNSUPPORTED naming `what` (a call that waits for the
 * device, reads a result on the host, copies host memory or allocates)
 * when dev's queue is being recorded: such a call cannot be replayed.
 * Inline: the backends' modules call it too. */
static inline dp_status dp_device_refuse_recording(const dp_device *dev, const char *what)
{
    if (!dev || !dev->graph_recording) return DP_OK;
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: %s while the device's work is recorded as a graph, "
                   "which would replay none of it: only device work that waits for nothing on "
                   "the host can be recorded", dev->name, what);
}

#endif /* DP_BACKEND_DEVICE_GRAPH_H */
