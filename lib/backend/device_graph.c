/*
 * backend/device_graph.c - recording a device's queue as a graph and
 * replaying it (device_graph.h): argument checks and the recording flag,
 * the backend doing the rest.
 */
#include "backend/backend.h"
#include "backend/device_graph.h"
#include "core/error.h"

dp_status dp_device_graph_begin(dp_device *dev)
{
    if (!dev) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "dev must not be NULL");
    if (!dev->ops->graph_begin)
        return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: %s devices do not record graphs", dev->name,
                       dev->ops->name);
    if (dev->graph_recording)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: already recording a graph", dev->name);
    DP_TRY(dev->ops->graph_begin(dev));
    dev->graph_recording = 1;
    return DP_OK;
}

dp_status dp_device_graph_end(dp_device *dev, dp_device_graph **out)
{
    if (!dev || !out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "dev and out must not be NULL");
    *out = NULL;
    if (!dev->graph_recording)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: no graph is being recorded "
                       "(dp_device_graph_begin first)", dev->name);
    dev->graph_recording = 0;
    void *g = NULL;
    DP_TRY(dev->ops->graph_end(dev, &g));
    *out = g;
    return DP_OK;
}

dp_status dp_device_graph_launch(dp_device *dev, dp_device_graph *g)
{
    if (!dev || !g) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "dev and g must not be NULL");
    DP_TRY(dp_device_refuse_recording(dev, "a graph's replay"));
    return dev->ops->graph_launch(dev, g);
}

void dp_device_graph_destroy(dp_device *dev, dp_device_graph *g)
{
    if (dev && g) dev->ops->graph_destroy(dev, g);
}

uint64_t dp_device_graph_epoch(dp_device *dev)
{
    return dev && dev->ops->graph_epoch ? dev->ops->graph_epoch(dev) : 0;
}

int dp_device_graph_recording(const dp_device *dev) { return dev && dev->graph_recording; }
