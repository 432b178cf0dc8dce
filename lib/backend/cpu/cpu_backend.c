/*
 * backend/cpu/cpu_backend.c - virtual CPU devices: host memory, memcpy
 * copies, and the backend table (the element-wise and row-wise ops of
 * kernels/ops.h are generated here; the GEMM, OpenBLAS or oneDNN, is in
 * cpu_gemm.c, the other kernels in cpu_nn.c and cpu_attention.c, the
 * host's memory count in cpu_host.c).
 *
 * A virtual device is host memory plus the thread that drives it; the
 * engine gives each device its own thread, so OpenBLAS is made
 * single-threaded once (cpu_host.c) and the devices run their GEMMs
 * concurrently instead of fighting over BLAS threads.
 */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "core/error.h"

// --- devices ------------------------------------------------------------------------------

static dp_status cpu_open(dp_device *dev)
{
    DP_TRY(dp_cpu_host_open(dev));
    dp_status s = dp_cpu_ctx_create(dev);
    if (s != DP_OK) dp_cpu_host_close();
    return s;
}

static void cpu_close(dp_device *dev)
{
    dp_cpu_ctx_destroy(dev);
    dp_cpu_host_close();
}

static dp_status cpu_alloc(dp_device *dev, size_t bytes, void **out)
{
    DP_TRY(dp_cpu_host_reserve(dev, bytes));
    void *p = dp_cpu_host_alloc(bytes);
    if (!p) {
        dp_cpu_host_release(bytes);
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "%s: host allocation of %zu bytes failed",
                       dev->name, bytes);
    }
    *out = p;
    return DP_OK;
}

static void cpu_free(dp_device *dev, void *ptr, size_t bytes)
{
    (void)dev;
    free(ptr);
    dp_cpu_host_release(bytes);
}

static dp_status cpu_copy(dp_device *dev, void *dst, const void *src, size_t bytes)
{
    (void)dev;
    memmove(dst, src, bytes);
    return DP_OK;
}

static dp_status cpu_copy_peer(dp_device *dst_dev, void *dst, dp_device *src_dev,
                               const void *src, size_t bytes)
{
    (void)dst_dev;
    (void)src_dev;
    memmove(dst, src, bytes);
    return DP_OK;
}

static dp_status cpu_memset(dp_device *dev, void *dst, int value, size_t bytes)
{
    (void)dev;
    memset(dst, value, bytes);
    return DP_OK;
}

static dp_status cpu_synchronize(dp_device *dev)
{
    (void)dev;
    return DP_OK;
}

// --- events: work on a CPU device is done when its call returns -----------------------

static dp_status cpu_event_create(dp_device *dev, void **out)
{
    struct timespec *t = calloc(1, sizeof *t);
    if (!t) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "%s: cannot allocate an event", dev->name);
    *out = t;
    return DP_OK;
}

static void cpu_event_destroy(dp_device *dev, void *ev)
{
    (void)dev;
    free(ev);
}

static dp_status cpu_event_record(dp_device *dev, void *ev)
{
    if (clock_gettime(CLOCK_MONOTONIC, ev) != 0)
        return DP_FAIL(DP_ERR_INTERNAL, "%s: clock_gettime failed", dev->name);
    return DP_OK;
}

static dp_status cpu_event_wait(dp_device *dev, dp_device *ev_dev, void *ev)
{
    (void)dev;
    (void)ev_dev;
    (void)ev; /* the work before the record is already done */
    return DP_OK;
}

static dp_status cpu_event_synchronize(dp_device *dev, void *ev)
{
    (void)dev;
    (void)ev;
    return DP_OK;
}

static dp_status cpu_event_elapsed(dp_device *dev, void *start, void *end, double *seconds)
{
    (void)dev;
    const struct timespec *a = start, *b = end;
    *seconds = (double)(b->tv_sec - a->tv_sec) + 1e-9 * (double)(b->tv_nsec - a->tv_nsec);
    return DP_OK;
}

// --- the element-wise and row-wise ops of kernels/ops.h --------------------------------

/* One function per list entry: items i = 0..n-1 in order on the calling thread. */
#define CPU_OP(name, shape, fn, params, args)                                    \
    static DP_CPU_SIMD dp_status cpu_##name(dp_device *dev, DP_UNPAREN params, size_t n) \
    {                                                                            \
        (void)dev;                                                               \
        for (size_t i = 0; i < n; i++) fn(DP_UNPAREN args, i);                   \
        return DP_OK;                                                            \
    }
DP_KERNEL_OPS(CPU_OP)
#undef CPU_OP

#define CPU_OP_ENTRY(name, shape, fn, params, args) .name = cpu_##name,

/* Entries listed after the generated ones replace them: GCC's
 * -Woverride-init (in -Wextra) is silenced for this table only. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Woverride-init"
static const dp_backend_ops cpu_ops = {
    .name = "cpu",
    .host_memory = 1,
    .open = cpu_open,
    .close = cpu_close,
    .bind_thread = NULL,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .mem_info = NULL,
    .copy_h2d = cpu_copy,
    .copy_d2h = cpu_copy,
    .copy_d2d = cpu_copy,
    .copy_peer = cpu_copy_peer,
    .memset = cpu_memset,
    .synchronize = cpu_synchronize,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .event_wait = cpu_event_wait,
    .event_synchronize = cpu_event_synchronize,
    .event_elapsed = cpu_event_elapsed,
    .gemm = dp_cpu_gemm,
    .set_matmul_precision = NULL,
    .matmul_native = dp_cpu_matmul_native,
    DP_KERNEL_OPS(CPU_OP_ENTRY)
    /* replaces the generated element loop: rows, no divisions (cpu_nn.c) */
    .encoder_forward = dp_cpu_encoder_forward,
    .encoder_backward = dp_cpu_encoder_backward,
    .bias_broadcast = dp_cpu_bias_broadcast,
    .bias_backward = dp_cpu_bias_backward,
    .layernorm_backward_params = dp_cpu_layernorm_backward_params,
    .sum_squares = dp_cpu_sum_squares,
    .attention_permute = dp_cpu_attention_permute,
    .attention_permute_bf16 = dp_cpu_attention_permute_bf16,
    .attention_permute_backward = dp_cpu_attention_permute_backward,
    .attention_unpermute = dp_cpu_attention_unpermute,
    .attention_unpermute_backward = dp_cpu_attention_unpermute_backward,
    /* oneDNN's matmul with the bias and a bfloat16 output (cpu_gemm.c);
     * it declines where the composition is the only way */
    .gemm_bias_out = dp_cpu_gemm_bias_out,
    .adamw_segments = dp_cpu_adamw_segments,
};
#pragma GCC diagnostic pop

const dp_backend_ops *dp_backend_cpu(void) { return &cpu_ops; }
