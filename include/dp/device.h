/*
 * dp/device.h - devices: memory with accounting, copies, GEMM.
 *
 * A device is "cpu:i" (a virtual device: host memory, one host thread,
 * single-threaded OpenBLAS) or "cuda:i". All pointers passed to the
 * functions below that are called "device pointers" must come from
 * dp_device_alloc on that same device. Tensors are row-major float32
 * unless said otherwise; dp_gemm alone uses cuBLAS's column-major
 * convention so the same call works on both backends.
 *
 * Thread-safety: allocation, free and the memory queries are thread-safe.
 * Compute and copies on one device may come from several threads, as the
 * engine's reduce and optimizer slices do on the root, provided they touch
 * disjoint memory: the CPU backend runs each call on the calling thread,
 * and the CUDA backend orders calls on the device's stream under a lock.
 */
#ifndef DP_DEVICE_H
#define DP_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "dp/dtype.h"
#include "dp/export.h"
#include "dp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dp_device_kind {
    DP_DEVICE_CPU = 0,
    DP_DEVICE_CUDA,
    DP_DEVICE_KIND_COUNT
} dp_device_kind;

/* One entry of a parsed device list. */
typedef struct dp_device_spec {
    dp_device_kind kind;
    int index; /* cpu: virtual index; cuda: physical ordinal after CUDA_VISIBLE_DEVICES */
} dp_device_spec;

/* Largest device list dp accepts. */
#define DP_MAX_DEVICES 64

/*
 * Parses a device list into specs[0..*n).
 *   "cpu"          one CPU device (cpu:0)
 *   "cpu:N"        N virtual CPU devices cpu:0..N-1 (N >= 1; "cpu:0" is cpu:0)
 *   "cpu:0,1,3"    the listed virtual CPU devices (duplicates are an error)
 *   "cuda"         every visible CUDA device
 *   "cuda:0,1"     the listed CUDA devices; "cuda:0,cuda:0" and "cuda:0,0"
 *                  map two logical devices onto one GPU (allowed)
 *   "auto"         every visible CUDA device, else one CPU device per core
 * Entries may repeat the kind ("cpu:0,cpu:1"). Mixing cpu and cuda is an
 * error. CUDA indices are checked against the visible device count.
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL, empty, malformed, negative,
 * duplicate, mixed, more than cap or DP_MAX_DEVICES entries),
 * DP_ERR_NO_DEVICE (cuda index
 * not present, or cuda requested in a build or on a machine without GPUs,
 * or where the CUDA module libdp-cuda cannot be loaded: the message names
 * the library and the fix).
 */
DP_API dp_status dp_device_list_parse(const char *text, dp_device_spec *specs, size_t cap,
                                      size_t *n);

/* Number of visible CUDA devices: 0 without a GPU, without a driver, in a
 * build without CUDA, or where the CUDA module (libdp-cuda, next to libdp;
 * the first call loads it) cannot be loaded. Never fails. */
DP_API int dp_cuda_device_count(void);

/* Number of online CPU cores (>= 1). */
DP_API int dp_cpu_core_count(void);

/* Bytes of host memory available now without swapping: MemAvailable of
 * /proc/meminfo, else sysconf(_SC_AVPHYS_PAGES) pages; 0 where neither
 * says. What the first CPU device to open measures, and all CPU devices'
 * allocations are then counted against: host buffers of an application's
 * own (a batch's tokens) are seen by it only when touched before that
 * open. Never fails. */
DP_API size_t dp_host_memory_available(void);

typedef struct dp_device dp_device;

/* Opens a device. The handle owns its memory accounting; close it with
 * dp_device_close after freeing everything allocated on it. The first
 * CUDA device loads the CUDA module (libdp-cuda.so.0, next to libdp, or
 * in the folder DP_MODULE_DIR names).
 * Errors: DP_ERR_INVALID_ARGUMENT, DP_ERR_NO_DEVICE (also when the CUDA
 * module or a library it needs cannot be loaded: the message names it and
 * the fix), DP_ERR_DEVICE, DP_ERR_OUT_OF_MEMORY (also, under an
 * address-space limit (ulimit -v), for a CPU device where no room is left
 * for OpenBLAS's ~128 MiB work buffer of its thread: OpenBLAS would hang
 * at the first GEMM instead of failing). */
DP_API dp_status dp_device_open(const dp_device_spec *spec, dp_device **out);

/* Closes the device. Memory still allocated on it is freed (and counted
 * back) so nothing leaks. NULL is a no-op. */
DP_API void dp_device_close(dp_device *dev);

/* "cpu:0", "cuda:1", ... Owned by the device. */
DP_API const char *dp_device_name(const dp_device *dev);
/* DP_DEVICE_KIND_COUNT for NULL. */
DP_API dp_device_kind dp_device_kind_of(const dp_device *dev);

/* Makes dev current for the calling thread (cudaSetDevice on CUDA; no-op
 * on CPU). Each worker thread calls it once before using dev. */
DP_API dp_status dp_device_bind_thread(dp_device *dev);

/*
 * The arithmetic of a device's GEMMs (dp_gemm, dp_gemm_ex and every layer
 * built on them); the element-wise and row-wise kernels always compute in
 * float32. The field's names: PyTorch's torch.set_float32_matmul_precision
 * "highest" (FP32), "high" (TF32) and "medium" (BF16).
 */
typedef enum dp_matmul_precision {
    /* float32 products and sums (the default) */
    DP_MATMUL_FP32 = 0,
    /* CUDA: float32 operands rounded to TF32 (10-bit mantissa) on tensor
     * cores, sums in float32: several times faster on Ampere and newer
     * GPUs, ~1e-3 relative error per product. CPU devices compute as FP32. */
    DP_MATMUL_TF32,
    /* Every device kind: float32 operands rounded to bfloat16 (8-bit
     * mantissa, dp_bf16_from_float), their products exact and summed in
     * float32 (~4e-3 relative error per operand). On CPU devices through
     * oneDNN's bf16 kernels (AVX512-BF16 or AMX; about twice OpenBLAS's
     * float32 speed where the CPU has them, and the same arithmetic on
     * OpenBLAS without them or in a build without oneDNN), on CUDA devices
     * cuBLAS's bf16 tensor cores. */
    DP_MATMUL_BF16,
    DP_MATMUL_PRECISION_COUNT
} dp_matmul_precision;

/* "fp32", "tf32" or "bf16"; "invalid matmul precision" outside the enum. */
DP_API const char *dp_matmul_precision_name(dp_matmul_precision p);

/* Sets dev's matmul precision (default DP_MATMUL_FP32). Call it while no
 * other thread uses dev (e.g. right after opening it, or through
 * dp_engine_config.matmul_precision). Errors: DP_ERR_INVALID_ARGUMENT (dev
 * NULL, a value outside the enum), DP_ERR_DEVICE. */
DP_API dp_status dp_device_set_matmul_precision(dp_device *dev, dp_matmul_precision p);

/* dev's matmul precision; DP_MATMUL_FP32 for NULL. */
DP_API dp_matmul_precision dp_device_matmul_precision(const dp_device *dev);

/* *native = 1 when dev's GEMMs in precision p run on kernels of that
 * arithmetic, 0 when they do not: BF16 on a CPU device where oneDNN has
 * no bf16 matmul (oneDNN 2.x has one from AVX-512 on, fast with
 * AVX512-BF16 or AMX; on AVX2-only CPUs, and without oneDNN, the same
 * arithmetic runs as rounded operands on OpenBLAS's float32 kernels:
 * slower than FP32, not faster),
 * TF32 on a CPU device (computed as FP32), TF32 or BF16 on a GPU older
 * than compute capability 8.0 (no tensor cores for them). FP32 is always
 * native. The first call for a CPU device's BF16 builds one small oneDNN
 * primitive (about a millisecond); later calls answer at once. Call it
 * while no other thread uses dev, as dp_device_set_matmul_precision.
 * Errors: DP_ERR_INVALID_ARGUMENT (dev or native NULL, p outside the
 * enum), DP_ERR_DEVICE (oneDNN or the driver failed to answer). */
DP_API dp_status dp_device_matmul_native(dp_device *dev, dp_matmul_precision p, int *native);

/* dp_device_set_matmul_precision(dev, allow ? DP_MATMUL_TF32 :
 * DP_MATMUL_FP32): TF32 tensor-op math for the GEMMs of a CUDA device
 * (results then no longer match the CPU backend within float32
 * rounding); no effect on the arithmetic of CPU devices.
 * Errors: DP_ERR_INVALID_ARGUMENT (dev NULL), DP_ERR_DEVICE. */
DP_API dp_status dp_device_set_allow_tf32(dp_device *dev, int allow);

/* ---- memory and accounting ---------------------------------------- */

typedef struct dp_memory_stats {
    size_t in_use;           /* bytes currently allocated through dp_device_alloc */
    size_t peak;             /* high-water mark of in_use since open */
    size_t peak_since_reset; /* high-water mark since dp_device_reset_peak */
    size_t limit;            /* allocation limit in bytes, 0 = none */
    size_t n_allocs;         /* live allocations */
    size_t device_free;      /* free bytes reported by the driver (CUDA), 0 on CPU */
    size_t device_total;     /* total bytes reported by the driver (CUDA), 0 on CPU */
    /* bytes the backend holds for itself since open, outside in_use and peak
     * but counted against the limit: on CUDA the cuBLAS workspace, the
     * sum-of-squares scratch (GPU) and the pinned staging buffers (host);
     * 0 on CPU */
    size_t reserved;
} dp_memory_stats;

/* Allocates bytes (> 0) of device memory, 256-byte aligned, not zeroed.
 * Who may touch it: memory of a CPU device is host memory, which host code
 * (a model's callbacks included) may read and write directly; memory of a
 * CUDA device must not be dereferenced by the host: move it with
 * dp_copy_h2d/d2h, or work on it with dp/nn.h layers and dp/ops.h helpers,
 * which run on every backend.
 * Errors: DP_ERR_INVALID_ARGUMENT (bytes == 0 or out NULL),
 * DP_ERR_OUT_OF_MEMORY (in_use + reserved + bytes would pass the limit, or
 * the allocator failed: on CPU devices also when all CPU devices together
 * would hold more than the host had available; the message names device,
 * bytes asked, in use and limit). */
DP_API dp_status dp_device_alloc(dp_device *dev, size_t bytes, void **out);

/* Frees a pointer from dp_device_alloc on dev. NULL is a no-op. Freeing a
 * pointer dev does not own is ignored (and reported by the next stats
 * query as unchanged in_use). */
DP_API void dp_device_free(dp_device *dev, void *ptr);

/* Process-wide count of bytes that were still allocated on a device when
 * it was closed (dp_device_close frees them). A leak check: it must not
 * grow across a create/destroy of anything that frees what it allocates. */
DP_API size_t dp_device_bytes_freed_at_close(void);

/* Bytes of the live allocation ptr (0 if ptr is not one). */
DP_API size_t dp_device_alloc_size(dp_device *dev, const void *ptr);

DP_API void dp_device_memory(dp_device *dev, dp_memory_stats *out);

/* Starts a new window for peak_since_reset (it becomes in_use). */
DP_API void dp_device_reset_peak(dp_device *dev);

/* Sets the allocation limit in bytes (0 removes it). Allocations already
 * made are kept even when they exceed a new, lower limit.
 * Errors: DP_ERR_INVALID_ARGUMENT (dev NULL). */
DP_API dp_status dp_device_set_limit(dp_device *dev, size_t bytes);

/* ---- copies ---------------------------------------------------------- */

DP_API dp_status dp_copy_h2d(dp_device *dev, void *dst, const void *src, size_t bytes);
DP_API dp_status dp_copy_d2h(dp_device *dev, void *dst, const void *src, size_t bytes);
DP_API dp_status dp_copy_d2d(dp_device *dev, void *dst, const void *src, size_t bytes);
/* Copies between two devices of the same kind (peer access when the
 * backend has it, staged through the host otherwise). */
DP_API dp_status dp_copy_peer(dp_device *dst_dev, void *dst, dp_device *src_dev,
                              const void *src, size_t bytes);
DP_API dp_status dp_memset(dp_device *dev, void *dst, int value, size_t bytes);
/* Waits for all work queued on dev. */
DP_API dp_status dp_device_synchronize(dp_device *dev);

/* ---- events: ordering and timing without a full synchronise ------------
 * An event marks a point in the work queued on its device. Recording it
 * captures everything queued on that device so far; another device can
 * make its later work wait for that point (dp_event_wait) without the host
 * waiting, and two recorded events of one device give the device time
 * between them. On CPU devices work runs on the calling thread when it is
 * queued, so a record takes the time, a wait has nothing to wait for and
 * the elapsed time is host time. Not thread-safe per event: one thread
 * records an event, others may wait on it after a host barrier. */
typedef struct dp_event dp_event;

/* Creates an event on dev (not yet recorded). Destroy it with
 * dp_event_destroy. Errors: DP_ERR_INVALID_ARGUMENT, DP_ERR_OUT_OF_MEMORY,
 * DP_ERR_DEVICE. */
DP_API dp_status dp_event_create(dp_device *dev, dp_event **out);
/* Destroys an event; call it before closing the event's device. NULL is a
 * no-op. */
DP_API void dp_event_destroy(dp_event *ev);
/* Marks the work queued on the event's device so far. */
DP_API dp_status dp_event_record(dp_event *ev);
/* Work queued on dev after this call starts after the point ev marks (ev
 * may belong to another device of the same kind). The host does not wait.
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL, never recorded, other kind). */
DP_API dp_status dp_event_wait(dp_device *dev, dp_event *ev);
/* The host waits until the work before ev's record is done. */
DP_API dp_status dp_event_synchronize(dp_event *ev);
/* *seconds = device time from start's record to end's (both recorded on
 * one device; waits for end). Errors: DP_ERR_INVALID_ARGUMENT (NULL, not
 * recorded, different devices), DP_ERR_DEVICE. */
DP_API dp_status dp_event_elapsed(dp_event *start, dp_event *end, double *seconds);

/* ---- GEMM (cuBLAS semantics on every backend) ------------------------- */

typedef enum dp_op { DP_OP_N = 0, DP_OP_T = 1 } dp_op;

/*
 * C = alpha * op(A) * op(B) + beta * C, column-major like cublasSgemm:
 * op(A) is m x k, op(B) is k x n, C is m x n with leading dimension ldc.
 * lda >= (transa == N ? m : k), ldb >= (transb == N ? k : n), ldc >= m.
 * When beta == 0, C need not be initialised (NaNs in C are not propagated).
 * Errors: DP_ERR_INVALID_ARGUMENT (negative sizes, leading dimensions too
 * small, NULL pointers), DP_ERR_DEVICE, DP_ERR_OUT_OF_MEMORY (a CPU device
 * under an address-space limit with no room for a new OpenBLAS work
 * buffer, which OpenBLAS would otherwise retry forever; C is untouched).
 */
DP_API dp_status dp_gemm(dp_device *dev, dp_op transa, dp_op transb, int m, int n, int k,
                         float alpha, const float *A, int lda, const float *B, int ldb,
                         float beta, float *C, int ldc);

/* batch independent dp_gemm calls; matrix i of A starts at A + i*strideA
 * (in floats, >= 0), likewise B and C. Same errors as dp_gemm, and
 * DP_ERR_INVALID_ARGUMENT for a negative stride. */
DP_API dp_status dp_gemm_strided_batched(dp_device *dev, dp_op transa, dp_op transb, int m,
                                         int n, int k, float alpha, const float *A, int lda,
                                         long long strideA, const float *B, int ldb,
                                         long long strideB, float beta, float *C, int ldc,
                                         long long strideC, int batch);

/*
 * dp_gemm_strided_batched with typed operands (cublasGemmStridedBatchedEx):
 * A and B each hold float32 or bfloat16 elements (a_type, b_type:
 * DP_DTYPE_F32 for float, DP_DTYPE_BF16 for dp_bf16); C is float32;
 * leading dimensions and strides count elements. The arithmetic is the
 * device's matmul precision: FP32 (and TF32) widen a bfloat16 operand
 * exactly, so it computes with the operand's float32 value; BF16 rounds a
 * float32 operand to bfloat16 first, so both operands are bfloat16 values.
 * A GEMM that converts an operand holds the converted copy in the
 * device's conversion scratch (grown on demand, kept until close; counted
 * as `reserved` in dp_memory_stats and against the limit), and on CPU
 * devices oneDNN's own scratch likewise. The scratch is bounded at 16 MiB:
 * a GEMM whose converted operands would need more runs in pieces (groups
 * of the batch, blocks of C's rows and columns, or blocks of k whose
 * products are added into C), summed in float32 throughout, cut the same
 * way on every call of the same shape. Scratch is grown before any of C
 * is written, so a GEMM that fails for memory leaves C as it was.
 * Errors: as dp_gemm_strided_batched; DP_ERR_INVALID_ARGUMENT for a type
 * other than DP_DTYPE_F32 or DP_DTYPE_BF16; DP_ERR_OUT_OF_MEMORY when the
 * scratch would pass the limit or cannot be allocated; DP_ERR_DEVICE.
 */
DP_API dp_status dp_gemm_ex(dp_device *dev, dp_op transa, dp_op transb, int m, int n, int k,
                            float alpha, const void *A, dp_dtype a_type, int lda,
                            long long strideA, const void *B, dp_dtype b_type, int ldb,
                            long long strideB, float beta, float *C, int ldc, long long strideC,
                            int batch);

/* ---- bfloat16 conversion on a device ----------------------------------- */

/* dst[i] = src[i] converted, for n elements (device pointers of dev):
 * float32 -> bfloat16 rounds to nearest even (dp_bf16_from_float),
 * bfloat16 -> float32 is exact, equal types copy. dst and src must not
 * overlap unless they are the same pointer with equal types.
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL, n == 0 or overflowing bytes, a
 * type other than DP_DTYPE_F32 and DP_DTYPE_BF16), DP_ERR_DEVICE. */
DP_API dp_status dp_convert(dp_device *dev, void *dst, dp_dtype dst_type, const void *src,
                            dp_dtype src_type, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* DP_DEVICE_H */
