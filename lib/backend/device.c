/*
 * backend/device.c - device handles, memory accounting and copies
 * (device_gemm.c: GEMM and conversion; device_event.c: events).
 *
 * The accounting lives here, not in the backends, so every backend counts
 * the same way: each live allocation is kept in a small open-addressing map
 * (pointer -> bytes) under the device's mutex; in_use, peak,
 * peak_since_reset and the optional limit follow from it.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/device_graph.h"
#include "backend/device_testing.h"
#include "core/error.h"

// --- allocation map ---------------------------------------------------------

#define DP_ALLOC_TOMB ((void *)(uintptr_t)1)

static size_t ptr_hash(const void *p, size_t cap)
{
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x & (cap - 1);
}

static int map_grow(dp_alloc_map *m)
{
    /* Size from the live count (tombstones are dropped), at most a quarter
     * full, so allocators that never reuse addresses do not grow it forever. */
    size_t ncap = 64;
    while (ncap < 4 * (m->count + 1)) ncap *= 2;
    void **keys = calloc(ncap, sizeof *keys);
    size_t *sizes = calloc(ncap, sizeof *sizes);
    if (!keys || !sizes) {
        free(keys);
        free(sizes);
        return -1;
    }
    for (size_t i = 0; i < m->cap; i++) {
        void *k = m->keys[i];
        if (!k || k == DP_ALLOC_TOMB) continue;
        size_t j = ptr_hash(k, ncap);
        while (keys[j]) j = (j + 1) & (ncap - 1);
        keys[j] = k;
        sizes[j] = m->sizes[i];
    }
    free(m->keys);
    free(m->sizes);
    m->keys = keys;
    m->sizes = sizes;
    m->cap = ncap;
    m->used = m->count;
    return 0;
}

static int map_insert(dp_alloc_map *m, void *p, size_t bytes)
{
    if ((m->used + 1) * 2 > m->cap && map_grow(m) != 0) return -1;
    size_t j = ptr_hash(p, m->cap);
    while (m->keys[j] && m->keys[j] != DP_ALLOC_TOMB) j = (j + 1) & (m->cap - 1);
    if (!m->keys[j]) m->used++;
    m->keys[j] = p;
    m->sizes[j] = bytes;
    m->count++;
    return 0;
}

/* Index of p in the map, or (size_t)-1. */
static size_t map_find(const dp_alloc_map *m, const void *p)
{
    if (!m->cap) return (size_t)-1;
    size_t j = ptr_hash(p, m->cap);
    while (m->keys[j]) {
        if (m->keys[j] == p) return j;
        j = (j + 1) & (m->cap - 1);
    }
    return (size_t)-1;
}

// --- open / close -------------------------------------------------------------

dp_status dp_device_open(const dp_device_spec *spec, dp_device **out)
{
    if (!spec || !out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "spec and out must not be NULL");
    *out = NULL;
    if (spec->index < 0)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "device index %d is negative", spec->index);
    const dp_backend_ops *ops = NULL;
    if (spec->kind == DP_DEVICE_CPU) {
        ops = dp_backend_cpu();
    } else if (spec->kind == DP_DEVICE_CUDA) {
        /* The CUDA module, loaded for the first CUDA device. */
        const dp_cuda_module *cuda = NULL;
        if (dp_backend_cuda(&cuda) != DP_OK) {
            dp_error_prefix("cuda:%d requested", spec->index);
            return DP_ERR_NO_DEVICE;
        }
        ops = cuda->ops;
    } else {
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "unknown device kind %d", (int)spec->kind);
    }
    dp_device *dev = calloc(1, sizeof *dev);
    if (!dev) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "cannot allocate a device handle");
    dev->ops = ops;
    dev->kind = spec->kind;
    dev->index = spec->index;
    snprintf(dev->name, sizeof dev->name, "%s:%d", spec->kind == DP_DEVICE_CPU ? "cpu" : "cuda",
             spec->index);
    if (pthread_mutex_init(&dev->mu, NULL) != 0) {
        free(dev);
        return DP_FAIL(DP_ERR_INTERNAL, "pthread_mutex_init failed");
    }
    dp_status s = ops->open(dev);
    if (s != DP_OK) {
        pthread_mutex_destroy(&dev->mu);
        free(dev);
        return s;
    }
    *out = dev;
    return DP_OK;
}

static atomic_size_t freed_at_close;

size_t dp_device_bytes_freed_at_close(void) { return atomic_load(&freed_at_close); }

void dp_device_close(dp_device *dev)
{
    if (!dev) return;
    atomic_fetch_add(&freed_at_close, dev->in_use);
    /* Free whatever is still live so closing never leaks. */
    for (size_t i = 0; i < dev->allocs.cap; i++) {
        void *k = dev->allocs.keys[i];
        if (k && k != DP_ALLOC_TOMB) dev->ops->free(dev, k, dev->allocs.sizes[i]);
    }
    free(dev->allocs.keys);
    free(dev->allocs.sizes);
    dev->ops->close(dev);
    pthread_mutex_destroy(&dev->mu);
    free(dev);
}

dp_status dp_device_open_comm(dp_device *dev, dp_device **out)
{
    if (!dev || !out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "dev and out must not be NULL");
    *out = NULL;
    if (!dev->ops->open_comm) return DP_OK;
    dp_device *c = calloc(1, sizeof *c);
    if (!c) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "%s: cannot allocate a queue handle", dev->name);
    c->ops = dev->ops;
    c->kind = dev->kind;
    c->index = dev->index;
    c->matmul = dev->matmul;
    snprintf(c->name, sizeof c->name, "%.26s comm", dev->name);
    if (pthread_mutex_init(&c->mu, NULL) != 0) {
        free(c);
        return DP_FAIL(DP_ERR_INTERNAL, "pthread_mutex_init failed");
    }
    int declined = 0;
    dp_status s = dev->ops->open_comm(dev, c, &declined);
    if (s != DP_OK || declined) {
        pthread_mutex_destroy(&c->mu);
        free(c);
        return s;
    }
    *out = c;
    return DP_OK;
}

void dp_device_close_comm(dp_device *comm)
{
    if (!comm) return;
    comm->ops->close_comm(comm);
    pthread_mutex_destroy(&comm->mu);
    free(comm);
}

dp_status dp_device_order(dp_device *first, dp_device *then)
{
    if (!first || !then) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "devices must not be NULL");
    if (first->kind != then->kind)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s cannot wait for %s: devices must be of one "
                       "kind", then->name, first->name);
    if (first == then || !then->ops->order) return DP_OK; /* one queue keeps its own order */
    return then->ops->order(first, then);
}

const char *dp_device_name(const dp_device *dev) { return dev ? dev->name : "(null)"; }

dp_device_kind dp_device_kind_of(const dp_device *dev) { return dev ? dev->kind : DP_DEVICE_KIND_COUNT; }

dp_status dp_device_bind_thread(dp_device *dev)
{
    if (!dev) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "dev must not be NULL");
    return dev->ops->bind_thread ? dev->ops->bind_thread(dev) : DP_OK;
}

const char *dp_matmul_precision_name(dp_matmul_precision p)
{
    static const char *names[DP_MATMUL_PRECISION_COUNT] = {"fp32", "tf32", "bf16"};
    return (unsigned)p < DP_MATMUL_PRECISION_COUNT ? names[p] : "invalid matmul precision";
}

dp_status dp_device_set_matmul_precision(dp_device *dev, dp_matmul_precision p)
{
    if (!dev) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "dev must not be NULL");
    if ((unsigned)p >= DP_MATMUL_PRECISION_COUNT)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: matmul precision %d; use DP_MATMUL_FP32, "
                       "DP_MATMUL_TF32 or DP_MATMUL_BF16", dev->name, (int)p);
    if (dev->ops->set_matmul_precision) DP_TRY(dev->ops->set_matmul_precision(dev, p));
    dev->matmul = p;
    return DP_OK;
}

dp_matmul_precision dp_device_matmul_precision(const dp_device *dev)
{
    return dev ? dev->matmul : DP_MATMUL_FP32;
}

dp_status dp_device_matmul_native(dp_device *dev, dp_matmul_precision p, int *native)
{
    if (!dev || !native) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "dev and native must not be NULL");
    if ((unsigned)p >= DP_MATMUL_PRECISION_COUNT)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: matmul precision %d; use DP_MATMUL_FP32, "
                       "DP_MATMUL_TF32 or DP_MATMUL_BF16", dev->name, (int)p);
    *native = p == DP_MATMUL_FP32;
    if (p == DP_MATMUL_FP32 || !dev->ops->matmul_native) return DP_OK;
    return dev->ops->matmul_native(dev, p, native);
}

dp_status dp_device_set_allow_tf32(dp_device *dev, int allow)
{
    if (!dev) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "dev must not be NULL");
    return dp_device_set_matmul_precision(dev, allow ? DP_MATMUL_TF32 : DP_MATMUL_FP32);
}

// --- memory -------------------------------------------------------------------

dp_status dp_device_alloc(dp_device *dev, size_t bytes, void **out)
{
    if (!dev || !out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "dev and out must not be NULL");
    *out = NULL;
    if (bytes == 0)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: cannot allocate 0 bytes", dev->name);
    DP_TRY(dp_device_refuse_recording(dev, "an allocation"));
    pthread_mutex_lock(&dev->mu);
    /* The backend's own buffers (reserved) count against the limit too. */
    size_t room = dev->limit > dev->reserved ? dev->limit - dev->reserved : 0;
    if (dev->limit && (bytes > room || dev->in_use > room - bytes)) {
        size_t in_use = dev->in_use, limit = dev->limit, reserved = dev->reserved;
        pthread_mutex_unlock(&dev->mu);
        char extra[96] = "";
        if (reserved)
            snprintf(extra, sizeof extra, ", %zu bytes reserved by the %s backend", reserved,
                     dev->ops->name);
        return DP_FAIL(DP_ERR_OUT_OF_MEMORY,
                       "%s: allocating %zu bytes would pass the memory limit "
                       "(%zu bytes in use%s, limit %zu bytes); use a smaller batch, more "
                       "devices or a higher limit (dp_device_set_limit; "
                       "dp_engine_config.memory_limit)",
                       dev->name, bytes, in_use, extra, limit);
    }
    /* Reserve the bytes before the (possibly slow) backend call so that
     * concurrent allocations cannot overshoot the limit together. */
    dev->in_use += bytes;
    pthread_mutex_unlock(&dev->mu);

    void *p = NULL;
    dp_status s = dev->ops->alloc(dev, bytes, &p);

    pthread_mutex_lock(&dev->mu);
    if (s == DP_OK && map_insert(&dev->allocs, p, bytes) != 0) {
        dev->ops->free(dev, p, bytes);
        s = DP_FAIL(DP_ERR_OUT_OF_MEMORY, "%s: cannot grow the allocation table", dev->name);
    }
    if (s != DP_OK) {
        dev->in_use -= bytes;
        size_t in_use = dev->in_use, limit = dev->limit;
        pthread_mutex_unlock(&dev->mu);
        dp_error_prefix("%s: allocating %zu bytes failed (%zu bytes in use, limit %zu bytes%s)",
                        dev->name, bytes, in_use, limit, limit ? "" : " = none");
        return s;
    }
    if (dev->in_use > dev->peak) dev->peak = dev->in_use;
    if (dev->in_use > dev->peak_since_reset) dev->peak_since_reset = dev->in_use;
    pthread_mutex_unlock(&dev->mu);
    *out = p;
    return DP_OK;
}

void dp_device_free(dp_device *dev, void *ptr)
{
    if (!dev || !ptr) return;
    pthread_mutex_lock(&dev->mu);
    size_t j = map_find(&dev->allocs, ptr);
    if (j == (size_t)-1) {
        pthread_mutex_unlock(&dev->mu);
        return;
    }
    size_t bytes = dev->allocs.sizes[j];
    dev->in_use -= bytes;
    dev->allocs.keys[j] = DP_ALLOC_TOMB;
    dev->allocs.count--;
    pthread_mutex_unlock(&dev->mu);
    dev->ops->free(dev, ptr, bytes);
}

size_t dp_device_alloc_size(dp_device *dev, const void *ptr)
{
    if (!dev || !ptr) return 0;
    pthread_mutex_lock(&dev->mu);
    size_t j = map_find(&dev->allocs, ptr);
    size_t bytes = j == (size_t)-1 ? 0 : dev->allocs.sizes[j];
    pthread_mutex_unlock(&dev->mu);
    return bytes;
}

void dp_device_memory(dp_device *dev, dp_memory_stats *out)
{
    if (!dev || !out) return;
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&dev->mu);
    out->in_use = dev->in_use;
    out->peak = dev->peak;
    out->peak_since_reset = dev->peak_since_reset;
    out->limit = dev->limit;
    out->n_allocs = dev->allocs.count;
    out->reserved = dev->reserved;
    pthread_mutex_unlock(&dev->mu);
    if (dev->ops->mem_info) dev->ops->mem_info(dev, &out->device_free, &out->device_total);
}

void dp_device_reset_peak(dp_device *dev)
{
    if (!dev) return;
    pthread_mutex_lock(&dev->mu);
    dev->peak_since_reset = dev->in_use;
    pthread_mutex_unlock(&dev->mu);
}

dp_status dp_device_set_limit(dp_device *dev, size_t bytes)
{
    if (!dev) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "dev must not be NULL");
    pthread_mutex_lock(&dev->mu);
    dev->limit = bytes;
    pthread_mutex_unlock(&dev->mu);
    return DP_OK;
}

// --- copies -------------------------------------------------------------------

#define CHECK_COPY(dev, dst, src)                                                      \
    do {                                                                               \
        if (!(dev)) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "dev must not be NULL");   \
        if (bytes && (!(dst) || !(src)))                                               \
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: NULL pointer in a copy of %zu " \
                           "bytes", (dev)->name, bytes);                               \
        if (!bytes) return DP_OK;                                                      \
    } while (0)

dp_status dp_copy_h2d(dp_device *dev, void *dst, const void *src, size_t bytes)
{
    CHECK_COPY(dev, dst, src);
    DP_TRY(dp_device_refuse_recording(dev, "a copy from host memory"));
    return dev->ops->copy_h2d(dev, dst, src, bytes);
}

dp_status dp_copy_d2h(dp_device *dev, void *dst, const void *src, size_t bytes)
{
    CHECK_COPY(dev, dst, src);
    DP_TRY(dp_device_refuse_recording(dev, "a copy to host memory"));
    return dev->ops->copy_d2h(dev, dst, src, bytes);
}

dp_status dp_copy_d2d(dp_device *dev, void *dst, const void *src, size_t bytes)
{
    CHECK_COPY(dev, dst, src);
    return dev->ops->copy_d2d(dev, dst, src, bytes);
}

dp_status dp_copy_peer(dp_device *dst_dev, void *dst, dp_device *src_dev, const void *src,
                       size_t bytes)
{
    CHECK_COPY(dst_dev, dst, src);
    if (!src_dev) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "src_dev must not be NULL");
    if (dst_dev->kind != src_dev->kind)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "peer copy from %s to %s: devices must be of "
                       "one kind", src_dev->name, dst_dev->name);
    /* It orders two queues with events: no part of one device's recording. */
    if (dst_dev != src_dev) {
        DP_TRY(dp_device_refuse_recording(dst_dev, "a copy between devices"));
        DP_TRY(dp_device_refuse_recording(src_dev, "a copy between devices"));
    }
    return dst_dev->ops->copy_peer(dst_dev, dst, src_dev, src, bytes);
}

dp_status dp_memset(dp_device *dev, void *dst, int value, size_t bytes)
{
    if (!dev) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "dev must not be NULL");
    if (!bytes) return DP_OK;
    if (!dst) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: memset of NULL", dev->name);
    return dev->ops->memset(dev, dst, value, bytes);
}

dp_status dp_device_synchronize(dp_device *dev)
{
    if (!dev) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "dev must not be NULL");
    DP_TRY(dp_device_refuse_recording(dev, "a wait for the device"));
    return dev->ops->synchronize(dev);
}
