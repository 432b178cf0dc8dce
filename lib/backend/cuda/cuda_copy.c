/*
 * backend/cuda/cuda_copy.c - the CUDA backend's copies (cuda_internal.h):
 * host <-> device through the pinned staging buffers, device to device,
 * and between devices ordered by events (cuda_backend.c's header says
 * how), with peer access enabled lazily.
 */
#include "backend/cuda/cuda_internal.h"

/* Peer access between physical devices, enabled lazily for the pairs that
 * copy: 0 not tried, 1 enabled, -1 unavailable (copies then go through
 * host memory inside the runtime: cudaMemcpyPeerAsync stages them). */
static pthread_mutex_t peer_mu = PTHREAD_MUTEX_INITIALIZER;
static signed char peer_state[DP_MAX_DEVICES][DP_MAX_DEVICES];

static void ensure_peer(int from, int to, int *prev)
{
    pthread_mutex_lock(&peer_mu);
    if (peer_state[from][to] == 0) {
        signed char st = -1;
        int can = 0, cur = current_device();
        if (cudaDeviceCanAccessPeer(&can, from, to) == cudaSuccess && can &&
            (cur == from || cudaSetDevice(from) == cudaSuccess)) {
            if (cur != from && *prev < 0) *prev = cur;
            cudaError_t e = cudaDeviceEnablePeerAccess(to, 0);
            if (e == cudaSuccess || e == cudaErrorPeerAccessAlreadyEnabled) st = 1;
        }
        (void)cudaGetLastError(); /* a refused peer mapping is not an error */
        peer_state[from][to] = st;
    }
    pthread_mutex_unlock(&peer_mu);
}

// --- copies --------------------------------------------------------------------------------------

/* Host -> device through the pinned buffers. Returns once src has been
 * read (into pinned memory): the caller may reuse src; the DMA finishes
 * on the stream, before any later work of this device. */
dp_status dp_cuda_h2d_locked(dp_device *dev, cuda_ctx *c, void *dst, const void *src,
                             size_t bytes) {
    size_t i = 0;
    for (size_t off = 0; off < bytes; off += STAGE_BYTES, i++) {
        size_t len = bytes - off < STAGE_BYTES ? bytes - off : STAGE_BYTES;
        int b = (int)(i & 1);
        /* The previous copy out of this buffer must be done before refilling it. */
        CU_TRY(dev, cudaEventSynchronize(c->stage_done[b]));
        memcpy(c->stage[b], (const char *)src + off, len);
        CU_TRY(dev, cudaMemcpyAsync((char *)dst + off, c->stage[b], len, cudaMemcpyHostToDevice,
                                    c->stream));
        CU_TRY(dev, cudaEventRecord(c->stage_done[b], c->stream));
    }
    return DP_OK;
}

/* Device -> host through the pinned buffers: chunk i+1 is in flight while
 * chunk i is copied out. Returns when dst holds the data. */
dp_status dp_cuda_d2h_locked(dp_device *dev, cuda_ctx *c, void *dst, const void *src,
                             size_t bytes) {
    size_t chunks = (bytes + STAGE_BYTES - 1) / STAGE_BYTES;
    for (size_t i = 0; i <= chunks; i++) {
        if (i < chunks) {
            size_t off = i * STAGE_BYTES;
            size_t len = bytes - off < STAGE_BYTES ? bytes - off : STAGE_BYTES;
            int b = (int)(i & 1);
            /* Stream order puts this after any earlier copy using stage[b]. */
            CU_TRY(dev, cudaMemcpyAsync(c->stage[b], (const char *)src + off, len,
                                        cudaMemcpyDeviceToHost, c->stream));
            CU_TRY(dev, cudaEventRecord(c->stage_done[b], c->stream));
        }
        if (i > 0) {
            size_t j = i - 1, off = j * STAGE_BYTES;
            size_t len = bytes - off < STAGE_BYTES ? bytes - off : STAGE_BYTES;
            int b = (int)(j & 1);
            CU_TRY(dev, cudaEventSynchronize(c->stage_done[b]));
            memcpy((char *)dst + off, c->stage[b], len);
        }
    }
    return DP_OK;
}

dp_status dp_cuda_copy_h2d(dp_device *dev, void *dst, const void *src, size_t bytes) {
    ENTER(dev);
    cuda_ctx *c = CTX(dev);
    pthread_mutex_lock(&c->mu);
    dp_status s = dp_cuda_h2d_locked(dev, c, dst, src, bytes);
    pthread_mutex_unlock(&c->mu);
    return s;
}

dp_status dp_cuda_copy_d2h(dp_device *dev, void *dst, const void *src, size_t bytes) {
    ENTER(dev);
    cuda_ctx *c = CTX(dev);
    pthread_mutex_lock(&c->mu);
    dp_status s = dp_cuda_d2h_locked(dev, c, dst, src, bytes);
    pthread_mutex_unlock(&c->mu);
    return s;
}

dp_status dp_cuda_copy_d2d(dp_device *dev, void *dst, const void *src, size_t bytes) {
    ENTER(dev);
    CU_TRY(dev, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, CTX(dev)->stream));
    return DP_OK;
}

/* Work queued on `then`'s stream from now on waits for all work queued so
 * far on `first`'s stream. */
static dp_status order_after(dp_device *first, dp_device *then, int *prev)
{
    cuda_ctx *fc = CTX(first), *tc = CTX(then);
    DP_TRY(dp_cuda_use_device(first, fc->ordinal, prev)); /* the event is recorded on first's device */
    pthread_mutex_lock(&fc->ev_mu);
    cudaError_t e = cudaEventRecord(fc->order_ev, fc->stream);
    const char *call = "cudaEventRecord";
    if (e == cudaSuccess) {
        /* The wait takes the record just made, so the lock spans both. */
        e = cudaStreamWaitEvent(tc->stream, fc->order_ev, 0);
        call = "cudaStreamWaitEvent";
    }
    pthread_mutex_unlock(&fc->ev_mu);
    if (e != cudaSuccess) return dp_cuda_fail(first, e, call, __func__, __FILE__, __LINE__);
    return DP_OK;
}

dp_status dp_cuda_copy_peer(dp_device *dst_dev, void *dst, dp_device *src_dev, const void *src,
                            size_t bytes) {
    if (dst_dev == src_dev)
        return dp_cuda_copy_d2d(dst_dev, dst, src, bytes);
    DEVICE_GUARD;
    cuda_ctx *dc = CTX(dst_dev), *sc = CTX(src_dev);
    int same_gpu = dc->ordinal == sc->ordinal;
    if (!same_gpu) {
        ensure_peer(dc->ordinal, sc->ordinal, &dp_prev_device_);
        ensure_peer(sc->ordinal, dc->ordinal, &dp_prev_device_);
    }
    /* 1. The copy starts after the work that produced src. */
    DP_TRY(order_after(src_dev, dst_dev, &dp_prev_device_));
    /* 2. On the destination's stream: ordered with everything using dst. */
    DP_TRY(dp_cuda_use_device(dst_dev, dc->ordinal, &dp_prev_device_));
    if (same_gpu)
        CU_TRY(dst_dev, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, dc->stream));
    else
        CU_TRY(dst_dev, cudaMemcpyPeerAsync(dst, dc->ordinal, src, sc->ordinal, bytes, dc->stream));
    /* 3. Later work on the source (which may overwrite src) waits for the
     * copy; except onto a communication queue, whose caller keeps src
     * unchanged until it synchronises the queue (backend.h), so that the
     * source's backward goes on beside the reduce-scatter's copies. */
    if (dc->comm) return DP_OK;
    return order_after(dst_dev, src_dev, &dp_prev_device_);
}

dp_status dp_cuda_order(dp_device *first, dp_device *then)
{
    DEVICE_GUARD;
    return order_after(first, then, &dp_prev_device_);
}

dp_status dp_cuda_memset(dp_device *dev, void *dst, int value, size_t bytes) {
    ENTER(dev);
    CU_TRY(dev, cudaMemsetAsync(dst, value, bytes, CTX(dev)->stream));
    return DP_OK;
}

dp_status dp_cuda_synchronize(dp_device *dev) {
    ENTER(dev);
    CU_TRY(dev, cudaStreamSynchronize(CTX(dev)->stream));
    return DP_OK;
}
