/*
 * backend/cuda/cuda_graph.c - the CUDA backend's graphs (backend.h,
 * backend/device_graph.h): a stream capture of the device's stream,
 * instantiated once and launched per replay.
 *
 * The capture is thread-local (cudaStreamCaptureModeThreadLocal): other
 * workers' threads go on queueing, allocating and copying on their own
 * streams, while the recording thread's own calls that cannot be captured
 * are refused before they reach the runtime (device_graph.h), so the
 * capture ends cleanly and the caller runs the work eagerly. cuBLAS has
 * its workspace set (cuda_backend.c) and cuBLASLt and cuDNN are given
 * theirs, so none allocates while captured.
 */
#include "backend/cuda/cuda_internal.h"

dp_status dp_cuda_graph_begin(dp_device *dev)
{
    ENTER(dev);
    cuda_ctx *c = CTX(dev);
    if (!c->graphs)
        return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: CUDA graphs are off; DP_CUDA_GRAPHS=1 turns "
                       "them on", dev->name);
    CU_TRY(dev, cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    return DP_OK;
}

dp_status dp_cuda_graph_end(dp_device *dev, void **out)
{
    ENTER(dev);
    cuda_ctx *c = CTX(dev);
    *out = NULL;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    if (e != cudaSuccess) {
        if (g) (void)cudaGraphDestroy(g);
        return dp_cuda_fail(dev, e, "cudaStreamEndCapture", __func__, __FILE__, __LINE__);
    }
    cudaGraphExec_t x = NULL;
    e = cudaGraphInstantiate(&x, g, 0);
    (void)cudaGraphDestroy(g); /* the instance keeps what it needs */
    if (e != cudaSuccess)
        return dp_cuda_fail(dev, e, "cudaGraphInstantiate", __func__, __FILE__, __LINE__);
    *out = x;
    return DP_OK;
}

dp_status dp_cuda_graph_launch(dp_device *dev, void *graph)
{
    ENTER(dev);
    CU_TRY(dev, cudaGraphLaunch((cudaGraphExec_t)graph, CTX(dev)->stream));
    return DP_OK;
}

void dp_cuda_graph_destroy(dp_device *dev, void *graph)
{
    (void)dev;
    if (cudaGraphExecDestroy((cudaGraphExec_t)graph) != cudaSuccess) (void)cudaGetLastError();
}

uint64_t dp_cuda_graph_epoch(dp_device *dev)
{
    cuda_ctx *c = CTX(dev);
    pthread_mutex_lock(&c->mu);
    uint64_t e = c->epoch;
    pthread_mutex_unlock(&c->mu);
    return e;
}
