/*
 * backend/cuda/cuda_backend.c - CUDA devices: device memory, copies, GEMM
 * through cuBLAS, and the kernel entries (launchers in cuda_kernels.cu).
 *
 * A logical device "cuda:i" owns a non-blocking stream, a cuBLAS handle
 * bound to that stream with a workspace dp allocates, two pinned host
 * staging buffers and a small scratch area; their bytes are the device's
 * `reserved` memory, counted against its limit. Several logical devices may share one physical GPU
 * (cuda:0,cuda:0): each has its own stream, handle and accounting.
 *
 * Ordering. All work of a device runs on its stream, so one device's ops
 * are ordered among themselves and most entries return before the GPU is
 * done. Host-visible results are synchronous: copy_d2h, sum_squares and
 * synchronize wait. Between devices, copy_peer orders by events: the copy
 * waits for everything already queued on the source, runs on the
 * destination's stream, and later work on the source waits for the copy,
 * so it neither reads unfinished data nor has its source overwritten
 * while reading. The engine hands work between threads through host
 * barriers, after which these events capture all earlier work.
 *
 * Threads. dp's engine calls the root device's entries from every worker
 * thread during the reduce and the optimizer (on disjoint slices), so each
 * entry first makes its device current on the calling thread (cheap when
 * it already is), and the state shared by calls (staging buffers, scratch,
 * the ordering event) is guarded by per-device mutexes. The CUDA runtime
 * and cuBLAS are thread-safe for this use; one cuBLAS handle per stream
 * keeps GEMM results bitwise reproducible.
 *
 * The CUDA module (libdp-cuda.so.0, core/module.h): libdp loads it for
 * the first cuda device or device count, so only programs that use GPUs
 * need the CUDA libraries. Only the runtime (libcudart) and cuBLAS are
 * linked (and NCCL, nccl.c), never the driver library: on a machine without a driver cudaGetDeviceCount fails with
 * cudaErrorInsufficientDriver (or cudaErrorNoDevice) and dp sees 0 GPUs.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/gemm_pieces.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_native.h"
#include "core/error.h"
#include "transport/transport.h"

/* Bytes of each of the two pinned staging buffers: host<->device copies
 * move in chunks of this size, the host memcpy of one chunk overlapping
 * the DMA of the other. */
#define STAGE_BYTES ((size_t)4 << 20)

/* cuBLAS workspace per handle (cuBLAS's own defaults for these GPUs). */
#define BLAS_WS_BYTES ((size_t)4 << 20)
#define BLAS_WS_BYTES_SM90 ((size_t)32 << 20)

typedef struct cuda_ctx {
    int ordinal; /* physical device, after CUDA_VISIBLE_DEVICES */
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_ws;                /* device: the cuBLAS workspace dp gives the handle */

    pthread_mutex_t mu;           /* guards stage, stage_done, sumsq, result_host, col, grp */
    unsigned char *stage[2];      /* pinned host, STAGE_BYTES each */
    cudaEvent_t stage_done[2];    /* last GPU use of stage[b] */
    double *sumsq;                /* device: DP_CUDA_SUMSQ_BLOCKS partials + 1 result */
    double *result_host;          /* pinned: the result copied back */
    float *col;                   /* device: partials of the column reductions */
    size_t col_bytes;             /* its size (grown on demand, part of dev->reserved) */
    void *grp;                    /* device: the embedding backward's token groups */
    size_t grp_bytes;             /* its size (likewise) */
    void *cvt;                    /* device: GEMM operands converted to the math's type */
    size_t cvt_bytes;             /* its size (likewise) */

    pthread_mutex_t ev_mu;        /* guards order_ev between its record and wait */
    cudaEvent_t order_ev;         /* marks this stream's work for another stream */
    int mu_ok, ev_mu_ok;          /* mutexes initialised (for cleanup after a failed open) */
} cuda_ctx;

#define CTX(dev) ((cuda_ctx *)(dev)->ctx)

// --- errors --------------------------------------------------------------------------

/* Errors after which the CUDA context cannot be used again (a kernel fault). */
static int is_sticky(cudaError_t e)
{
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable: return 1;
    default: return 0;
    }
}

/* Records "dev: call failed: reason (name)" with the caller's function,
 * file and line; `call` is the source text of the call (only its name, up
 * to the first '(', is printed). Clears the runtime's last error so a
 * recoverable failure (out of memory) does not resurface later. */
static dp_status cuda_fail(const dp_device *dev, cudaError_t e, const char *call, const char *func,
                           const char *file, int line)
{
    (void)cudaGetLastError();
    dp_status s = e == cudaErrorMemoryAllocation ? DP_ERR_OUT_OF_MEMORY : DP_ERR_DEVICE;
    return dp_error_set(s, func, file, line, "%s: %.*s failed: %s (%s)%s", dev->name,
                        (int)strcspn(call, "("), call, cudaGetErrorString(e),
                        cudaGetErrorName(e),
                        is_sticky(e) ? "; the GPU context is now unusable, restart the process "
                                       "(CUDA_LAUNCH_BLOCKING=1 reports the failing kernel at "
                                       "its launch)"
                                     : "");
}

static dp_status blas_fail(const dp_device *dev, cublasStatus_t st, const char *call,
                           const char *func, const char *file, int line)
{
    (void)cudaGetLastError();
    dp_status s = st == CUBLAS_STATUS_ALLOC_FAILED ? DP_ERR_OUT_OF_MEMORY : DP_ERR_DEVICE;
    return dp_error_set(s, func, file, line, "%s: %.*s failed: %s (%s)", dev->name,
                        (int)strcspn(call, "("), call, cublasGetStatusString(st),
                        cublasGetStatusName(st));
}

/* Runs a CUDA runtime call (or a kernel launcher); on failure returns the
 * dp_status naming the call, the device, and this file and line. */
#define CU_TRY(dev, call)                                                            \
    do {                                                                             \
        cudaError_t cu_e_ = (call);                                                  \
        if (cu_e_ != cudaSuccess)                                                    \
            return cuda_fail((dev), cu_e_, #call, __func__, __FILE__, __LINE__);     \
    } while (0)

#define BLAS_TRY(dev, call)                                                          \
    do {                                                                             \
        cublasStatus_t blas_s_ = (call);                                             \
        if (blas_s_ != CUBLAS_STATUS_SUCCESS)                                        \
            return blas_fail((dev), blas_s_, #call, __func__, __FILE__, __LINE__);   \
    } while (0)

// --- devices and threads -------------------------------------------------------------------

/* The calling thread's current device belongs to the application: every
 * entry that switches it switches it back before returning (except
 * bind_thread, whose purpose is to set it). An entry declares
 * DEVICE_GUARD, which remembers the device current before dp's first
 * switch (-1: not switched) and restores it when the entry returns, on
 * every path (GCC/Clang's cleanup attribute runs at scope exit, after the
 * return value has been computed). */
static void restore_device(int *prev)
{
    if (*prev >= 0 && cudaSetDevice(*prev) != cudaSuccess) (void)cudaGetLastError();
}

#define DEVICE_GUARD int dp_prev_device_ __attribute__((cleanup(restore_device))) = -1

/* Thread's current device, or -1 when the runtime cannot say. */
static int current_device(void)
{
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess) {
        (void)cudaGetLastError();
        cur = -1;
    }
    return cur;
}

/* Makes ordinal the calling thread's current device (kernels and cuBLAS
 * calls need it; cudaGetDevice is a thread-local read). On the first switch
 * *prev (a DEVICE_GUARD's, or NULL to keep the switch) gets the device to
 * restore. */
static dp_status use_device(const dp_device *dev, int ordinal, int *prev)
{
    int cur = current_device();
    if (cur == ordinal) return DP_OK;
    CU_TRY(dev, cudaSetDevice(ordinal));
    if (prev && *prev < 0) *prev = cur;
    return DP_OK;
}

/* use_device for the entries that cannot fail (close, free): no message,
 * the runtime's error cleared; 1 when ordinal is current. */
static int use_device_quietly(int ordinal, int *prev)
{
    int cur = current_device();
    if (cur == ordinal) return 1;
    if (cudaSetDevice(ordinal) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    if (*prev < 0) *prev = cur;
    return 1;
}

/* First statement of an entry: switch to dev's GPU until it returns. */
#define ENTER(dev)  \
    DEVICE_GUARD;   \
    DP_TRY(use_device((dev), CTX(dev)->ordinal, &dp_prev_device_))

static pthread_once_t count_once = PTHREAD_ONCE_INIT;
static int visible_count;
static cudaError_t count_error = cudaSuccess;

static void count_devices(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        /* cudaErrorNoDevice, cudaErrorInsufficientDriver (no driver at
         * all) and anything else: no usable GPU, which is not an error. */
        (void)cudaGetLastError();
        n = 0;
    }
    visible_count = n < 0 ? 0 : (n > DP_MAX_DEVICES ? DP_MAX_DEVICES : n);
    count_error = e;
}

static int visible_devices(void)
{
    pthread_once(&count_once, count_devices);
    return visible_count;
}

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

// --- open / close -----------------------------------------------------------------------------

static void cuda_close(dp_device *dev)
{
    cuda_ctx *c = CTX(dev);
    if (!c) return;
    DEVICE_GUARD;
    /* Best effort: close cannot fail, so errors are cleared, not reported. */
    if (use_device_quietly(c->ordinal, &dp_prev_device_) && c->stream)
        cudaStreamSynchronize(c->stream);
    if (c->blas) cublasDestroy(c->blas);
    if (c->blas_ws) cudaFree(c->blas_ws);
    for (int b = 0; b < 2; b++) {
        if (c->stage_done[b]) cudaEventDestroy(c->stage_done[b]);
        if (c->stage[b]) cudaFreeHost(c->stage[b]);
    }
    if (c->order_ev) cudaEventDestroy(c->order_ev);
    if (c->sumsq) cudaFree(c->sumsq);
    if (c->result_host) cudaFreeHost(c->result_host);
    if (c->col) cudaFree(c->col);
    if (c->grp) cudaFree(c->grp);
    if (c->cvt) cudaFree(c->cvt);
    if (c->stream) cudaStreamDestroy(c->stream);
    (void)cudaGetLastError();
    if (c->mu_ok) pthread_mutex_destroy(&c->mu);
    if (c->ev_mu_ok) pthread_mutex_destroy(&c->ev_mu);
    free(c);
    dev->ctx = NULL;
}

static dp_status open_resources(dp_device *dev, cuda_ctx *c)
{
    ENTER(dev);
    CU_TRY(dev, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    BLAS_TRY(dev, cublasCreate(&c->blas));
    BLAS_TRY(dev, cublasSetStream(c->blas, c->stream));
    /* The workspace is memory dp allocates and counts (dev->reserved), not
     * one cuBLAS takes behind the accounting's back: the size cuBLAS
     * itself would pick (32 MiB on Hopper and newer, 4 MiB before). */
    int major = 0;
    CU_TRY(dev, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->ordinal));
    size_t ws = major >= 9 ? BLAS_WS_BYTES_SM90 : BLAS_WS_BYTES;
    CU_TRY(dev, cudaMalloc(&c->blas_ws, ws));
    BLAS_TRY(dev, cublasSetWorkspace(c->blas, c->blas_ws, ws));
    /* Full float32 unless dp_device_set_matmul_precision says otherwise. */
    BLAS_TRY(dev, cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH));
    for (int b = 0; b < 2; b++) {
        CU_TRY(dev, cudaEventCreateWithFlags(&c->stage_done[b], cudaEventDisableTiming));
        CU_TRY(dev, cudaHostAlloc((void **)&c->stage[b], STAGE_BYTES, cudaHostAllocPortable));
    }
    CU_TRY(dev, cudaEventCreateWithFlags(&c->order_ev, cudaEventDisableTiming));
    CU_TRY(dev, cudaMalloc((void **)&c->sumsq, (DP_CUDA_SUMSQ_BLOCKS + 1) * sizeof(double)));
    CU_TRY(dev, cudaHostAlloc((void **)&c->result_host, sizeof(double), cudaHostAllocPortable));
    /* Counted against the device's limit (dp_memory_stats.reserved): GPU
     * memory (workspace, scratch) and pinned host memory (staging). */
    dev->reserved = ws + (DP_CUDA_SUMSQ_BLOCKS + 1) * sizeof(double) + 2 * STAGE_BYTES +
                    sizeof(double);
    return DP_OK;
}

static dp_status cuda_open(dp_device *dev)
{
    dev->ctx = NULL;
    int count = visible_devices();
    if (dev->index >= count) {
        const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
        if (count == 0)
            return DP_FAIL(DP_ERR_NO_DEVICE,
                           "%s: no CUDA device is visible (cudaGetDeviceCount: %s; "
                           "CUDA_VISIBLE_DEVICES=%s): no GPU, no NVIDIA driver, or all "
                           "hidden; use cpu devices",
                           dev->name,
                           count_error == cudaSuccess ? "0 devices"
                                                      : cudaGetErrorString(count_error),
                           cvd ? cvd : "(unset)");
        return DP_FAIL(DP_ERR_NO_DEVICE,
                       "%s does not exist: %d CUDA device%s visible (CUDA_VISIBLE_DEVICES=%s); "
                       "use an index below %d",
                       dev->name, count, count == 1 ? "" : "s", cvd ? cvd : "(unset)", count);
    }
    cuda_ctx *c = calloc(1, sizeof *c);
    if (!c) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "%s: cannot allocate the device context", dev->name);
    c->ordinal = dev->index;
    dev->ctx = c;
    c->mu_ok = pthread_mutex_init(&c->mu, NULL) == 0;
    c->ev_mu_ok = pthread_mutex_init(&c->ev_mu, NULL) == 0;
    dp_status s = c->mu_ok && c->ev_mu_ok
                      ? open_resources(dev, c)
                      : DP_FAIL(DP_ERR_INTERNAL, "%s: pthread_mutex_init failed", dev->name);
    if (s != DP_OK) cuda_close(dev);
    return s;
}

/* The one entry that leaves dev current: binding is its purpose. */
static dp_status cuda_bind_thread(dp_device *dev)
{
    return use_device(dev, CTX(dev)->ordinal, NULL);
}

/* TF32 is cuBLAS's math mode for float32 GEMMs; BF16 passes bfloat16
 * operands with float32 compute instead (cuda_gemm), so the mode stays
 * the default there. */
static dp_status cuda_set_matmul_precision(dp_device *dev, dp_matmul_precision p)
{
    ENTER(dev);
    cuda_ctx *c = CTX(dev);
    BLAS_TRY(dev, cublasSetMathMode(c->blas, p == DP_MATMUL_TF32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                                : CUBLAS_DEFAULT_MATH));
    return DP_OK;
}

// --- memory --------------------------------------------------------------------------------------

static dp_status cuda_alloc(dp_device *dev, size_t bytes, void **out)
{
    ENTER(dev);
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes); /* 256-byte aligned, as dp_device_alloc promises */
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY,
                       "%s: cudaMalloc of %zu bytes failed: out of GPU memory (%zu of %zu "
                       "bytes free on the GPU, which other logical devices and processes "
                       "share); use a smaller batch, micro-batches or more devices",
                       dev->name, bytes, free_b, total_b);
    }
    if (e != cudaSuccess) return cuda_fail(dev, e, "cudaMalloc", __func__, __FILE__, __LINE__);
    *out = p;
    return DP_OK;
}

static void cuda_free(dp_device *dev, void *ptr, size_t bytes)
{
    (void)bytes;
    cuda_ctx *c = CTX(dev);
    /* Work queued on this stream may still use ptr, and peer copies that
     * read it are ordered before this stream's later work (copy_peer), so
     * waiting for the stream makes the free safe without relying on
     * cudaFree's implicit synchronisation. free cannot fail: errors are
     * cleared. */
    DEVICE_GUARD;
    if (use_device_quietly(c->ordinal, &dp_prev_device_)) {
        cudaStreamSynchronize(c->stream);
        cudaFree(ptr);
    }
    (void)cudaGetLastError();
}

static dp_status cuda_mem_info(dp_device *dev, size_t *free_bytes, size_t *total_bytes)
{
    ENTER(dev);
    CU_TRY(dev, cudaMemGetInfo(free_bytes, total_bytes));
    return DP_OK;
}

// --- copies --------------------------------------------------------------------------------------

/* Host -> device through the pinned buffers. Returns once src has been
 * read (into pinned memory): the caller may reuse src; the DMA finishes
 * on the stream, before any later work of this device. */
static dp_status h2d_locked(dp_device *dev, cuda_ctx *c, void *dst, const void *src, size_t bytes)
{
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
static dp_status d2h_locked(dp_device *dev, cuda_ctx *c, void *dst, const void *src, size_t bytes)
{
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

static dp_status cuda_copy_h2d(dp_device *dev, void *dst, const void *src, size_t bytes)
{
    ENTER(dev);
    cuda_ctx *c = CTX(dev);
    pthread_mutex_lock(&c->mu);
    dp_status s = h2d_locked(dev, c, dst, src, bytes);
    pthread_mutex_unlock(&c->mu);
    return s;
}

static dp_status cuda_copy_d2h(dp_device *dev, void *dst, const void *src, size_t bytes)
{
    ENTER(dev);
    cuda_ctx *c = CTX(dev);
    pthread_mutex_lock(&c->mu);
    dp_status s = d2h_locked(dev, c, dst, src, bytes);
    pthread_mutex_unlock(&c->mu);
    return s;
}

static dp_status cuda_copy_d2d(dp_device *dev, void *dst, const void *src, size_t bytes)
{
    ENTER(dev);
    CU_TRY(dev, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, CTX(dev)->stream));
    return DP_OK;
}

/* Work queued on `then`'s stream from now on waits for all work queued so
 * far on `first`'s stream. */
static dp_status order_after(dp_device *first, dp_device *then, int *prev)
{
    cuda_ctx *fc = CTX(first), *tc = CTX(then);
    DP_TRY(use_device(first, fc->ordinal, prev)); /* the event is recorded on first's device */
    pthread_mutex_lock(&fc->ev_mu);
    cudaError_t e = cudaEventRecord(fc->order_ev, fc->stream);
    const char *call = "cudaEventRecord";
    if (e == cudaSuccess) {
        /* The wait takes the record just made, so the lock spans both. */
        e = cudaStreamWaitEvent(tc->stream, fc->order_ev, 0);
        call = "cudaStreamWaitEvent";
    }
    pthread_mutex_unlock(&fc->ev_mu);
    if (e != cudaSuccess) return cuda_fail(first, e, call, __func__, __FILE__, __LINE__);
    return DP_OK;
}

static dp_status cuda_copy_peer(dp_device *dst_dev, void *dst, dp_device *src_dev,
                                const void *src, size_t bytes)
{
    if (dst_dev == src_dev) return cuda_copy_d2d(dst_dev, dst, src, bytes);
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
    DP_TRY(use_device(dst_dev, dc->ordinal, &dp_prev_device_));
    if (same_gpu)
        CU_TRY(dst_dev, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, dc->stream));
    else
        CU_TRY(dst_dev, cudaMemcpyPeerAsync(dst, dc->ordinal, src, sc->ordinal, bytes, dc->stream));
    /* 3. Later work on the source (which may overwrite src) waits for the copy. */
    return order_after(dst_dev, src_dev, &dp_prev_device_);
}

static dp_status cuda_memset(dp_device *dev, void *dst, int value, size_t bytes)
{
    ENTER(dev);
    CU_TRY(dev, cudaMemsetAsync(dst, value, bytes, CTX(dev)->stream));
    return DP_OK;
}

static dp_status cuda_synchronize(dp_device *dev)
{
    ENTER(dev);
    CU_TRY(dev, cudaStreamSynchronize(CTX(dev)->stream));
    return DP_OK;
}

// --- events --------------------------------------------------------------------------------------

static dp_status cuda_event_create(dp_device *dev, void **out)
{
    ENTER(dev);
    cudaEvent_t e = NULL;
    CU_TRY(dev, cudaEventCreate(&e)); /* with timing, for dp_event_elapsed */
    *out = e;
    return DP_OK;
}

static void cuda_event_destroy(dp_device *dev, void *ev)
{
    (void)dev;
    if (cudaEventDestroy((cudaEvent_t)ev) != cudaSuccess) (void)cudaGetLastError();
}

static dp_status cuda_event_record(dp_device *dev, void *ev)
{
    ENTER(dev);
    CU_TRY(dev, cudaEventRecord((cudaEvent_t)ev, CTX(dev)->stream));
    return DP_OK;
}

/* A stream may wait for an event of another device's stream. */
static dp_status cuda_event_wait(dp_device *dev, dp_device *ev_dev, void *ev)
{
    (void)ev_dev;
    ENTER(dev);
    CU_TRY(dev, cudaStreamWaitEvent(CTX(dev)->stream, (cudaEvent_t)ev, 0));
    return DP_OK;
}

static dp_status cuda_event_synchronize(dp_device *dev, void *ev)
{
    ENTER(dev);
    CU_TRY(dev, cudaEventSynchronize((cudaEvent_t)ev));
    return DP_OK;
}

static dp_status cuda_event_elapsed(dp_device *dev, void *start, void *end, double *seconds)
{
    ENTER(dev);
    float ms = 0.0f;
    CU_TRY(dev, cudaEventSynchronize((cudaEvent_t)end));
    CU_TRY(dev, cudaEventElapsedTime(&ms, (cudaEvent_t)start, (cudaEvent_t)end));
    *seconds = 1e-3 * (double)ms;
    return DP_OK;
}

// --- GEMM --------------------------------------------------------------------------------------

/* Forward declaration: the scratch is shared with the kernels below. */
static dp_status grow_scratch(dp_device *dev, cuda_ctx *c, void **buf, size_t *cap, size_t bytes);

/* A piece's block of an operand converted densely into dst on the stream:
 * float32 rounded to bfloat16 (to_bf16), or bfloat16 widened. */
static cudaError_t convert_block(cudaStream_t s, void *dst, const dp_gemm_arg *a,
                                 const dp_gemm_block *b, int to_bf16)
{
    dp_block kb = {b->off, (size_t)a->ld, (size_t)a->stride, (size_t)b->rows, (size_t)b->cols};
    size_t n = (size_t)b->count * (size_t)b->rows * (size_t)b->cols;
    return to_bf16 ? dp_cuda_launch_pack_f32_bf16(s, dst, a->p, kb, n)
                   : dp_cuda_launch_pack_bf16_f32(s, dst, a->p, kb, n);
}

static size_t round256(size_t bytes) { return (bytes + 255) / 256 * 256; }

/* The operands in the math's type (c->mu held): a float32 operand rounded
 * to bfloat16 for BF16 math, a bfloat16 one widened for float32 math, into
 * c->cvt; then cuBLAS with bfloat16 operands and float32 compute
 * (tensor cores), or its float32 GEMM. Past the device's conversion cap
 * the GEMM runs in pieces (backend/gemm_pieces.h), each converting only
 * its blocks; the stream orders each piece's conversion after the last
 * piece's GEMM has read the scratch. */
static dp_status gemm_converted_locked(dp_device *dev, cuda_ctx *c, cublasOperation_t ta,
                                       cublasOperation_t tb, dp_op opa, dp_op opb, int m, int n,
                                       int k, float alpha, const dp_gemm_arg *A,
                                       const dp_gemm_arg *B, float beta, float *C, int ldc,
                                       long long sC, int batch, int bf16)
{
    size_t esize = bf16 ? 2 : 4, ea = A->bf16 ? 2 : 4, eb = B->bf16 ? 2 : 4;
    int conv_a = bf16 ? !A->bf16 : A->bf16, conv_b = bf16 ? !B->bf16 : B->bf16;
    size_t cap = dev->gemm_convert_cap ? dev->gemm_convert_cap : DP_GEMM_CONVERT_CAP;
    dp_gemm_plan p = dp_gemm_plan_pieces(m, n, k, batch, conv_a, conv_b, esize, cap);
    size_t a_bytes = round256(dp_gemm_piece_bytes(conv_a, 0, esize, p.mb, p.nb, p.kb, p.g));
    size_t b_bytes = round256(dp_gemm_piece_bytes(0, conv_b, esize, p.mb, p.nb, p.kb, p.g));
    DP_TRY(grow_scratch(dev, c, &c->cvt, &c->cvt_bytes, a_bytes + b_bytes));
    unsigned char *sa = c->cvt, *sb = (unsigned char *)c->cvt + a_bytes;
    dp_gemm_piece pc = dp_gemm_piece_first(&p, m, n, k, batch, beta);
    dp_gemm_arg pa = {0};
    do {
        if (pc.new_a) {
            dp_gemm_block ba = dp_gemm_block_a(A, opa, pc.b0, pc.g, pc.i0, pc.mb, pc.l0, pc.kb);
            if (conv_a) CU_TRY(dev, convert_block(c->stream, sa, A, &ba, bf16));
            pa = dp_gemm_block_arg(A, &ba, conv_a ? sa : NULL, bf16, ea);
        }
        dp_gemm_block bb = dp_gemm_block_b(B, opb, pc.b0, pc.g, pc.j0, pc.nb, pc.l0, pc.kb);
        if (conv_b) CU_TRY(dev, convert_block(c->stream, sb, B, &bb, bf16));
        dp_gemm_arg pb = dp_gemm_block_arg(B, &bb, conv_b ? sb : NULL, bf16, eb);
        float *Cp = C + (size_t)pc.b0 * (size_t)sC + (size_t)pc.i0 + (size_t)pc.j0 * (size_t)ldc;
        if (bf16)
            BLAS_TRY(dev, cublasGemmStridedBatchedEx(
                              c->blas, ta, tb, pc.mb, pc.nb, pc.kb, &alpha, pa.p, CUDA_R_16BF,
                              pa.ld, pa.stride, pb.p, CUDA_R_16BF, pb.ld, pb.stride, &pc.beta, Cp,
                              CUDA_R_32F, ldc, sC, pc.g, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        else
            BLAS_TRY(dev, cublasSgemmStridedBatched(c->blas, ta, tb, pc.mb, pc.nb, pc.kb, &alpha,
                                                    pa.p, pa.ld, pa.stride, pb.p, pb.ld, pb.stride,
                                                    &pc.beta, Cp, ldc, sC, pc.g));
    } while (dp_gemm_piece_next(&pc, &p, m, n, k, batch, beta));
    return DP_OK;
}

static dp_status cuda_gemm(dp_device *dev, dp_op transa, dp_op transb, int m, int n, int k,
                           float alpha, const dp_gemm_arg *A, const dp_gemm_arg *B, float beta,
                           float *C, int ldc, long long strideC, int batch)
{
    ENTER(dev);
    cuda_ctx *c = CTX(dev);
    if (k == 0) {
        /* C = beta C exactly as the CPU backend does (A and B may be NULL). */
        CU_TRY(dev, dp_cuda_launch_gemm_scale_c(c->stream, C, m, n, ldc, strideC, batch, beta));
        return DP_OK;
    }
    cublasOperation_t ta = transa == DP_OP_T ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = transb == DP_OP_T ? CUBLAS_OP_T : CUBLAS_OP_N;
    int bf16 = dev->matmul == DP_MATMUL_BF16;
    if (bf16 || A->bf16 || B->bf16) {
        pthread_mutex_lock(&c->mu);
        dp_status s = gemm_converted_locked(dev, c, ta, tb, transa, transb, m, n, k, alpha, A, B,
                                            beta, C, ldc, strideC, batch, bf16);
        pthread_mutex_unlock(&c->mu);
        return s;
    }
    /* Column-major with host-side alpha and beta: the convention of
     * dp_gemm, so the arguments pass through unchanged. */
    const float *pa = A->p, *pb = B->p;
    if (batch == 1)
        BLAS_TRY(dev, cublasSgemm(c->blas, ta, tb, m, n, k, &alpha, pa, A->ld, pb, B->ld, &beta, C,
                                  ldc));
    else
        BLAS_TRY(dev, cublasSgemmStridedBatched(c->blas, ta, tb, m, n, k, &alpha, pa, A->ld,
                                                A->stride, pb, B->ld, B->stride, &beta, C, ldc,
                                                strideC, batch));
    return DP_OK;
}

// --- kernels -------------------------------------------------------------------------------------

/* Enqueues a launcher from cuda_kernels.cu on dev's stream. */
#define LAUNCH(dev, launcher, ...)                                 \
    do {                                                           \
        ENTER(dev);                                                \
        CU_TRY(dev, launcher(CTX(dev)->stream, __VA_ARGS__));      \
        return DP_OK;                                              \
    } while (0)

/* The element-wise and row-wise ops of kernels/ops.h: one entry each. */
#define CUDA_OP(name, shape, fn, params, args)                                   \
    static dp_status cuda_##name(dp_device *dev, DP_UNPAREN params, size_t n)     \
    {                                                                            \
        LAUNCH(dev, dp_cuda_launch_##name, DP_UNPAREN args, n);                  \
    }
DP_KERNEL_OPS(CUDA_OP)
#undef CUDA_OP
#define CUDA_OP_ENTRY(name, shape, fn, params, args) .name = cuda_##name,

/* Device scratch *buf of *cap bytes grown to at least `bytes` (c->mu
 * held): the column reductions' partials, the embedding backward's token
 * groups. Its bytes are reserved memory, so growing it respects the
 * device's limit. */
static dp_status grow_scratch(dp_device *dev, cuda_ctx *c, void **buf, size_t *cap, size_t bytes)
{
    if (bytes <= *cap) return DP_OK;
    if (bytes > SIZE_MAX / 2)
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "%s: %zu scratch bytes overflow", dev->name, bytes);
    bytes = (bytes + ((size_t)64 << 10) - 1) / ((size_t)64 << 10) * ((size_t)64 << 10);
    pthread_mutex_lock(&dev->mu);
    size_t grow = bytes - *cap, used = dev->in_use + dev->reserved, limit = dev->limit;
    pthread_mutex_unlock(&dev->mu);
    if (limit && (used > limit || grow > limit - used))
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY,
                       "%s: a kernel's scratch buffer needs %zu more bytes, which would "
                       "pass the memory limit (%zu bytes in use and reserved, limit %zu "
                       "bytes); use a smaller batch or a higher limit (dp_device_set_limit; "
                       "dp_engine_config.memory_limit)",
                       dev->name, grow, used, limit);
    /* Kernels queued on the stream may still read the old buffer. */
    CU_TRY(dev, cudaStreamSynchronize(c->stream));
    if (*buf) CU_TRY(dev, cudaFree(*buf));
    pthread_mutex_lock(&dev->mu);
    dev->reserved -= *cap;
    pthread_mutex_unlock(&dev->mu);
    *buf = NULL;
    *cap = 0;
    CU_TRY(dev, cudaMalloc(buf, bytes));
    *cap = bytes;
    pthread_mutex_lock(&dev->mu);
    dev->reserved += bytes;
    pthread_mutex_unlock(&dev->mu);
    return DP_OK;
}

/* The rows grouped by token on the host (kernels/encoder.h): inp comes to
 * the host (the end of backward, where the wait costs little), the groups
 * go to the device scratch c->grp, then one thread per (group, channel). */
static dp_status encoder_backward_locked(dp_device *dev, cuda_ctx *c, uint32_t *host,
                                         float *dwte, float *dwpe, const float *dout,
                                         const int32_t *inp, size_t B, size_t T, size_t C)
{
    size_t BT = B * T;
    int32_t *ids = (int32_t *)(host + dp_encoder_group_scratch_words(BT));
    DP_TRY(d2h_locked(dev, c, ids, inp, BT * sizeof *ids));
    uint32_t *order, *seg;
    size_t ng = dp_encoder_group_rows(ids, BT, host, &order, &seg);
    /* order and seg are adjacent in host (seg = order + 2 BT): copy both parts. */
    DP_TRY(grow_scratch(dev, c, &c->grp, &c->grp_bytes, (BT + ng + 1) * sizeof(uint32_t)));
    uint32_t *d_order = (uint32_t *)c->grp, *d_seg = d_order + BT;
    DP_TRY(h2d_locked(dev, c, d_order, order, BT * sizeof(uint32_t)));
    DP_TRY(h2d_locked(dev, c, d_seg, seg, (ng + 1) * sizeof(uint32_t)));
    CU_TRY(dev, dp_cuda_launch_encoder_backward(c->stream, dwte, dwpe, dout, inp, d_order, d_seg,
                                                ng, B, T, C));
    /* The caller may free host now: h2d_locked returns once it has copied
     * its source into the pinned staging buffers. */
    return DP_OK;
}

static dp_status cuda_encoder_backward(dp_device *dev, float *dwte, float *dwpe,
                                       const float *dout, const int32_t *inp, size_t B, size_t T,
                                       size_t C)
{
    ENTER(dev);
    size_t BT = B * T;
    if (BT >= UINT32_MAX / 4)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: B*T = %zu rows; the embedding backward "
                       "takes fewer than 2^30 rows; split the batch", dev->name, BT);
    uint32_t *host = malloc((dp_encoder_group_scratch_words(BT) + BT) * sizeof *host);
    if (!host)
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "%s: no host memory to group %zu rows by token",
                       dev->name, BT);
    cuda_ctx *c = CTX(dev);
    pthread_mutex_lock(&c->mu);
    dp_status s = encoder_backward_locked(dev, c, host, dwte, dwpe, dout, inp, B, T, C);
    pthread_mutex_unlock(&c->mu);
    free(host);
    return s;
}

static dp_status cuda_bias_broadcast(dp_device *dev, float *out, dp_pref bias, size_t N,
                                     size_t OC)
{
    LAUNCH(dev, dp_cuda_launch_bias_broadcast, out, bias, N, OC);
}

static dp_status bias_backward_locked(dp_device *dev, cuda_ctx *c, float *dbias,
                                      const float *dout, size_t N, size_t OC)
{
    DP_TRY(grow_scratch(dev, c, (void **)&c->col, &c->col_bytes,
                        dp_col_chunks(N) * OC * sizeof(float)));
    CU_TRY(dev, dp_cuda_launch_bias_backward(c->stream, dbias, c->col, dout, N, OC));
    return DP_OK;
}

static dp_status cuda_bias_backward(dp_device *dev, float *dbias, const float *dout, size_t N,
                                    size_t OC)
{
    ENTER(dev);
    cuda_ctx *c = CTX(dev);
    pthread_mutex_lock(&c->mu); /* the scratch is shared by concurrent callers */
    dp_status s = bias_backward_locked(dev, c, dbias, dout, N, OC);
    pthread_mutex_unlock(&c->mu);
    return s;
}

static dp_status cuda_layernorm_backward_params(dp_device *dev, float *dweight, float *dbias,
                                                const float *dout, const float *inp,
                                                const float *mean, const float *rstd, size_t N,
                                                size_t C)
{
    ENTER(dev);
    cuda_ctx *c = CTX(dev);
    pthread_mutex_lock(&c->mu);
    /* Products of sizes the public wrapper has checked to fit (N*C floats). */
    dp_status s = grow_scratch(dev, c, (void **)&c->col, &c->col_bytes,
                               2 * dp_col_chunks(N) * C * sizeof(float));
    if (s == DP_OK) {
        cudaError_t e = dp_cuda_launch_layernorm_backward_params(c->stream, dweight, dbias, c->col,
                                                                 dout, inp, mean, rstd, N, C);
        if (e != cudaSuccess)
            s = cuda_fail(dev, e, "dp_cuda_launch_layernorm_backward_params", __func__, __FILE__,
                          __LINE__);
    }
    pthread_mutex_unlock(&c->mu);
    return s;
}

static dp_status sum_squares_locked(dp_device *dev, cuda_ctx *c, double *out_host,
                                    const float *x, size_t n)
{
    double *result = c->sumsq + DP_CUDA_SUMSQ_BLOCKS;
    CU_TRY(dev, dp_cuda_launch_sum_squares(c->stream, result, c->sumsq, x, n));
    CU_TRY(dev, cudaMemcpyAsync(c->result_host, result, sizeof(double), cudaMemcpyDeviceToHost,
                                c->stream));
    CU_TRY(dev, cudaStreamSynchronize(c->stream));
    *out_host = *c->result_host;
    return DP_OK;
}

static dp_status cuda_sum_squares(dp_device *dev, double *out_host, const float *x, size_t n)
{
    ENTER(dev);
    cuda_ctx *c = CTX(dev);
    pthread_mutex_lock(&c->mu); /* the scratch is shared by concurrent callers */
    dp_status s = sum_squares_locked(dev, c, out_host, x, n);
    pthread_mutex_unlock(&c->mu);
    return s;
}

static dp_status cuda_attention_permute(dp_device *dev, float *qkvr, const float *qkv,
                                        size_t B, size_t T, size_t NH, size_t hs)
{
    LAUNCH(dev, dp_cuda_launch_attention_permute, qkvr, qkv, B, T, NH, hs);
}

static dp_status cuda_attention_permute_backward(dp_device *dev, float *dqkv,
                                                 const float *dqkvr, size_t B, size_t T,
                                                 size_t NH, size_t hs)
{
    LAUNCH(dev, dp_cuda_launch_attention_permute_backward, dqkv, dqkvr, B, T, NH, hs);
}

static dp_status cuda_attention_unpermute(dp_device *dev, float *out, const float *y, size_t B,
                                          size_t T, size_t NH, size_t hs)
{
    LAUNCH(dev, dp_cuda_launch_attention_unpermute, out, y, B, T, NH, hs);
}

static dp_status cuda_attention_unpermute_backward(dp_device *dev, float *dy,
                                                   const float *dout, size_t B, size_t T,
                                                   size_t NH, size_t hs)
{
    LAUNCH(dev, dp_cuda_launch_attention_unpermute_backward, dy, dout, B, T, NH, hs);
}

// --- the table -------------------------------------------------------------------------------------

static const dp_backend_ops cuda_ops = {
    .name = "cuda",
    .host_memory = 0,
    .open = cuda_open,
    .close = cuda_close,
    .bind_thread = cuda_bind_thread,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .mem_info = cuda_mem_info,
    .copy_h2d = cuda_copy_h2d,
    .copy_d2h = cuda_copy_d2h,
    .copy_d2d = cuda_copy_d2d,
    .copy_peer = cuda_copy_peer,
    .memset = cuda_memset,
    .synchronize = cuda_synchronize,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_wait = cuda_event_wait,
    .event_synchronize = cuda_event_synchronize,
    .event_elapsed = cuda_event_elapsed,
    .gemm = cuda_gemm,
    .set_matmul_precision = cuda_set_matmul_precision,
    DP_KERNEL_OPS(CUDA_OP_ENTRY)
    .encoder_backward = cuda_encoder_backward,
    .bias_broadcast = cuda_bias_broadcast,
    .bias_backward = cuda_bias_backward,
    .layernorm_backward_params = cuda_layernorm_backward_params,
    .sum_squares = cuda_sum_squares,
    .attention_permute = cuda_attention_permute,
    .attention_permute_backward = cuda_attention_permute_backward,
    .attention_unpermute = cuda_attention_unpermute,
    .attention_unpermute_backward = cuda_attention_unpermute_backward,
};

// --- the module (libdp-cuda, core/module.h) ------------------------------------------------------

#ifdef DP_HAVE_NCCL
extern const dp_transport_ops dp_transport_nccl;
#endif

static const dp_cuda_module cuda_module = {
    .hdr = {DP_MODULE_ABI, "cuda"},
    .ops = &cuda_ops,
    .count = visible_devices,
#ifdef DP_HAVE_NCCL
    .nccl = &dp_transport_nccl,
#endif
};

DP_API const void *dp_module_cuda(void) { return &cuda_module; }

// --- for other libraries on dp's streams (cuda_native.h) -----------------------------------------

cudaStream_t dp_cuda_native_stream(dp_device *dev) { return CTX(dev)->stream; }
int dp_cuda_native_ordinal(dp_device *dev) { return CTX(dev)->ordinal; }
