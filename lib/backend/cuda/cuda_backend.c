/*
 * backend/cuda/cuda_backend.c - CUDA devices: open and close, device
 * memory, events, the backend's table and the module's entry; the copies
 * are in cuda_copy.c, GEMM through cuBLAS and the kernel entries
 * (launchers in cuda_kernels.h) in cuda_compute.c, what they share in
 * cuda_internal.h.
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
 *
 * DP_CUDA_LT=0 in the environment makes the cuBLASLt entries (cuda_lt.c)
 * decline, so every linear layer runs as cuBLAS's GEMM plus the bias
 * broadcast: a switch for a GPU session to tell those kernels apart.
 * The fused attention runs through cuDNN where it loads, DP_CUDA_CUDNN=0
 * keeps dp's own kernels and DP_CUDA_CUDNN=1 requires cuDNN's (cuda_sdpa.c).
 */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"
#include "core/module.h"

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
dp_status dp_cuda_fail(const dp_device *dev, cudaError_t e, const char *call, const char *func,
                       const char *file, int line) {
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

dp_status dp_cuda_blas_fail(const dp_device *dev, cublasStatus_t st, const char *call,
                            const char *func, const char *file, int line) {
    (void)cudaGetLastError();
    dp_status s = st == CUBLAS_STATUS_ALLOC_FAILED ? DP_ERR_OUT_OF_MEMORY : DP_ERR_DEVICE;
    return dp_error_set(s, func, file, line, "%s: %.*s failed: %s (%s)", dev->name,
                        (int)strcspn(call, "("), call, cublasGetStatusString(st),
                        cublasGetStatusName(st));
}

// --- devices and threads -------------------------------------------------------------------

dp_status dp_cuda_use_device(const dp_device *dev, int ordinal, int *prev)
{
    int cur = current_device();
    if (cur == ordinal) return DP_OK;
    CU_TRY(dev, cudaSetDevice(ordinal));
    if (prev && *prev < 0) *prev = cur;
    return DP_OK;
}

/* dp_cuda_use_device for the entries that cannot fail (close, free): no message,
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

// --- open / close -----------------------------------------------------------------------------

static void cuda_close(dp_device *dev)
{
    cuda_ctx *c = CTX(dev);
    if (!c) return;
    DEVICE_GUARD;
    /* Best effort: close cannot fail, so errors are cleared, not reported. */
    if (use_device_quietly(c->ordinal, &dp_prev_device_) && c->stream)
        cudaStreamSynchronize(c->stream);
    dp_cuda_sdpa_close(c);
    if (c->lt) cublasLtDestroy(c->lt);
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
    if (c->tickets) cudaFree(c->tickets);
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
    c->blas_ws_bytes = ws;
    BLAS_TRY(dev, cublasSetWorkspace(c->blas, c->blas_ws, ws));
    BLAS_TRY(dev, cublasLtCreate(&c->lt));
    const char *lt = getenv("DP_CUDA_LT");
    c->lt_off = lt && strcmp(lt, "0") == 0;
    const char *lt_gelu = getenv("DP_CUDA_LT_GELU");
    c->lt_gelu = lt_gelu && strcmp(lt_gelu, "1") == 0;
    const char *graphs = getenv("DP_CUDA_GRAPHS");
    if (graphs && *graphs && strcmp(graphs, "0") != 0 && strcmp(graphs, "1") != 0)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "%s: DP_CUDA_GRAPHS=%.40s is not 0 or 1: set 1 to replay each step's "
                       "compute phase from a CUDA graph, or 0 (or unset it) to launch every "
                       "kernel", dev->name, graphs);
    c->graphs = graphs && strcmp(graphs, "1") == 0;
    const char *cudnn = getenv("DP_CUDA_CUDNN");
    if (!cudnn || !*cudnn) c->cudnn = CUDA_CUDNN_AUTO;
    else if (strcmp(cudnn, "0") == 0) c->cudnn = CUDA_CUDNN_OFF;
    else if (strcmp(cudnn, "1") == 0) c->cudnn = CUDA_CUDNN_REQUIRED;
    else
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "%s: DP_CUDA_CUDNN=%.40s is not 0 or 1: set 1 for cuDNN's attention (an "
                       "error where it cannot run), 0 for dp's own kernels, or unset it for "
                       "cuDNN's where it loads",
                       dev->name, cudnn);
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

/* A communication queue (backend.h): a non-blocking stream on dev's GPU
 * with its ordering event, nothing else (it runs copies and element-wise
 * entries only); offered only with DP_CUDA_OVERLAP=1 for now. */
static dp_status cuda_open_comm(dp_device *dev, dp_device *comm, int *declined)
{
    const char *on = getenv("DP_CUDA_OVERLAP");
    *declined = !on || strcmp(on, "1") != 0;
    if (*declined) return DP_OK;
    cuda_ctx *c = calloc(1, sizeof *c);
    if (!c) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "%s: cannot allocate the queue's context",
                           comm->name);
    c->ordinal = CTX(dev)->ordinal;
    c->comm = 1;
    comm->ctx = c;
    c->mu_ok = pthread_mutex_init(&c->mu, NULL) == 0;
    c->ev_mu_ok = pthread_mutex_init(&c->ev_mu, NULL) == 0;
    dp_status s = DP_OK;
    if (!c->mu_ok || !c->ev_mu_ok) {
        s = DP_FAIL(DP_ERR_INTERNAL, "%s: pthread_mutex_init failed", comm->name);
    } else {
        DEVICE_GUARD;
        cudaError_t e = cudaSuccess;
        const char *call = "cudaSetDevice";
        s = dp_cuda_use_device(comm, c->ordinal, &dp_prev_device_);
        if (s == DP_OK) {
            call = "cudaStreamCreateWithFlags";
            e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
        }
        if (s == DP_OK && e == cudaSuccess) {
            call = "cudaEventCreateWithFlags";
            e = cudaEventCreateWithFlags(&c->order_ev, cudaEventDisableTiming);
        }
        if (s == DP_OK && e != cudaSuccess)
            s = dp_cuda_fail(comm, e, call, __func__, __FILE__, __LINE__);
    }
    if (s != DP_OK) cuda_close(comm);
    return s;
}

/* The one entry that leaves dev current: binding is its purpose. */
static dp_status cuda_bind_thread(dp_device *dev)
{
    return dp_cuda_use_device(dev, CTX(dev)->ordinal, NULL);
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

/* TF32 and BF16 GEMMs run on tensor cores from compute capability 8.0
 * (Ampere) on; older GPUs have none for them. */
static dp_status cuda_matmul_native(dp_device *dev, dp_matmul_precision p, int *native)
{
    int major = 0;
    CU_TRY(dev, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                                       CTX(dev)->ordinal));
    *native = p == DP_MATMUL_FP32 || major >= 8;
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
    if (e != cudaSuccess) return dp_cuda_fail(dev, e, "cudaMalloc", __func__, __FILE__, __LINE__);
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
    .copy_h2d = dp_cuda_copy_h2d,
    .copy_d2h = dp_cuda_copy_d2h,
    .copy_d2d = dp_cuda_copy_d2d,
    .copy_peer = dp_cuda_copy_peer,
    .memset = dp_cuda_memset,
    .synchronize = dp_cuda_synchronize,
    .open_comm = cuda_open_comm,
    .close_comm = cuda_close,
    .order = dp_cuda_order,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_wait = cuda_event_wait,
    .event_synchronize = cuda_event_synchronize,
    .event_elapsed = cuda_event_elapsed,
    .graph_begin = dp_cuda_graph_begin,
    .graph_end = dp_cuda_graph_end,
    .graph_launch = dp_cuda_graph_launch,
    .graph_destroy = dp_cuda_graph_destroy,
    .graph_epoch = dp_cuda_graph_epoch,
    .gemm = dp_cuda_gemm,
    .set_matmul_precision = cuda_set_matmul_precision,
    .matmul_native = cuda_matmul_native,
#define CUDA_OP_ENTRY(name, shape, fn, params, args) .name = dp_cuda_##name,
    DP_KERNEL_OPS(CUDA_OP_ENTRY)
#undef CUDA_OP_ENTRY
    .encoder_backward = dp_cuda_encoder_backward,
    .bias_broadcast = dp_cuda_bias_broadcast,
    .bias_backward = dp_cuda_bias_backward,
    .layernorm_backward_params = dp_cuda_layernorm_backward_params,
    .sum_squares = dp_cuda_sum_squares,
    .attention_permute = dp_cuda_attention_permute,
    .attention_permute_bf16 = dp_cuda_attention_permute_bf16,
    .attention_permute_backward = dp_cuda_attention_permute_backward,
    .attention_unpermute = dp_cuda_attention_unpermute,
    .attention_unpermute_backward = dp_cuda_attention_unpermute_backward,
    .gemm_bias_out = dp_cuda_gemm_bias_out,
    .gemm_gelu = dp_cuda_gemm_gelu,
    .attention_lib_forward = dp_cuda_attention_lib_forward,
    .attention_lib_backward = dp_cuda_attention_lib_backward,
    .adamw_segments = dp_cuda_adamw_segments,
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
