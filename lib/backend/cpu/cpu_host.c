/*
 * backend/cpu/cpu_host.c - the host memory shared by all CPU devices.
 *
 * All CPU devices share the host's RAM, and on Linux malloc overcommits:
 * an allocation far beyond RAM succeeds and the process is killed by the
 * OOM killer minutes later, when the pages are touched. So the backend
 * keeps one process-wide count of the bytes allocated on all CPU devices
 * (device memory and the GEMM's conversion scratch) and refuses an
 * allocation that would take it past the memory the host had available
 * when the first CPU device opened (MemAvailable of /proc/meminfo, else
 * sysconf's available pages): a clear DP_ERR_OUT_OF_MEMORY at once
 * instead of a kill.
 *
 * Under an address-space limit (RLIMIT_AS, `ulimit -v`) a second count is
 * made, against the limit, for a mapping dp does not make: OpenBLAS's
 * work buffers. A GEMM takes a free one, or maps a new one of ~128 MiB
 * when all are in use (so there are as many as GEMMs ever ran at once;
 * none is unmapped), and OpenBLAS 0.3.21 retries a buffer it cannot map
 * forever (blas_memory_alloc): the device's thread would hang. So
 * dp_cpu_blas_enter admits a GEMM that may need a new buffer only where
 * one fits under the limit, makes the buffer itself, measured, with a
 * 1x1 GEMM, and refuses the GEMM otherwise; and the devices' allocations
 * leave room for a buffer per open CPU device beyond those made.
 *
 * The buffers themselves come from dp_cpu_host_alloc: from 2 MiB up they
 * are aligned to a huge page and advised as transparent huge pages
 * (madvise MADV_HUGEPAGE), which Debian's default THP mode, "madvise",
 * otherwise gives no process. A GEMM's strided operand and a weight
 * gradient then cost a TLB entry per 2 MiB instead of per 4 KiB: a
 * bf16 GPT step (dp_bench's seed case on cpu:2) runs ~1.5% faster. The
 * cost is at most one partly used huge page per buffer (less than 2 MiB
 * of RAM more than the count below, which stays the bytes asked for).
 * DP_CPU_HUGEPAGES=0 in the environment turns the advice off.
 */
#define _DEFAULT_SOURCE /* madvise */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cblas.h>

#include "backend/cpu/cpu_kernels.h"
#include "core/error.h"

/* Declared by OpenBLAS's cblas.h; repeated so a different cblas.h still builds. */
void openblas_set_num_threads(int num_threads);

static pthread_once_t host_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t host_mu = PTHREAD_MUTEX_INITIALIZER;
static size_t host_available; /* bytes available at the first open; 0 = unknown, no check */
static size_t host_in_use;    /* bytes allocated on all CPU devices (guarded by host_mu) */
static int host_huge = 1;     /* advise huge pages (DP_CPU_HUGEPAGES unset or not "0") */
static size_t host_space;     /* the address-space limit in bytes; 0 = none, no count */
static size_t host_devices;   /* CPU devices open (guarded by host_mu) */

/* OpenBLAS's work buffer: BUFFER_SIZE, 128 MiB in Debian's dynamic-arch
 * build, plus a page (measured with 0.3.21: the first GEMM adds 128 MiB
 * to VmSize, a second one at the same time 128 MiB more, a later one
 * nothing). A probe that grows the process by at least DP_CPU_BLAS_MADE
 * made one. */
#define DP_CPU_BLAS_BUFFER (((size_t)128 << 20) + ((size_t)64 << 10))
#define DP_CPU_BLAS_MADE ((size_t)120 << 20)
static pthread_mutex_t blas_mu = PTHREAD_MUTEX_INITIALIZER; /* one admission at a time */
static atomic_size_t blas_running; /* GEMMs admitted and not yet left */
static atomic_size_t blas_buffers; /* OpenBLAS buffers known to be mapped */

/* MemAvailable (the kernel's estimate of what can be allocated without
 * swapping) in bytes, or 0 when /proc/meminfo does not say. */
static size_t meminfo_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    int found = 0;
    while (!found && fgets(line, sizeof line, f))
        found = sscanf(line, "MemAvailable: %llu kB", &kb) == 1;
    fclose(f);
    if (!found || kb > SIZE_MAX / 1024) return 0;
    return (size_t)kb * 1024;
}

static size_t sysconf_available(void)
{
#ifdef _SC_AVPHYS_PAGES
    long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 && (unsigned long)pages <= SIZE_MAX / (unsigned long)page)
        return (size_t)pages * (size_t)page;
#endif
    return 0;
}

/* The process's size (VmSize) in bytes, or 0 when /proc does not say. */
static size_t process_size(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long long pages = 0;
    int found = fscanf(f, "%llu", &pages) == 1;
    fclose(f);
    long page = sysconf(_SC_PAGESIZE);
    if (!found || page <= 0 || pages > SIZE_MAX / (unsigned long long)page) return 0;
    return (size_t)pages * (size_t)page;
}

/* RLIMIT_AS in bytes; 0 where unlimited or unknown. */
static size_t space_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return 0;
    return rl.rlim_cur > SIZE_MAX ? 0 : (size_t)rl.rlim_cur;
}

/* bytes more, and held for buffers still to come, fit under the
 * address-space limit. *size is the process's size (0: no limit or
 * unknown, which fits). */
static int space_fits(size_t bytes, size_t held, size_t *size)
{
    *size = host_space ? process_size() : 0;
    if (!*size) return 1;
    return *size <= host_space && held <= host_space - *size &&
           bytes <= host_space - *size - held;
}

/* Room for a buffer per open CPU device beyond those made (host_mu held). */
static size_t buffers_to_come(void)
{
    size_t made = atomic_load(&blas_buffers);
    size_t n = host_devices > made ? host_devices - made : 0;
    return n > SIZE_MAX / DP_CPU_BLAS_BUFFER ? SIZE_MAX : n * DP_CPU_BLAS_BUFFER;
}

/* what: "opening a CPU device", or the bytes asked for (bytes > 0). */
static dp_status space_refused(dp_device *dev, const char *what, size_t bytes, size_t size,
                               size_t held, size_t devices)
{
    char asked[96];
    if (bytes) snprintf(asked, sizeof asked, "%s of %zu bytes", what, bytes);
    else snprintf(asked, sizeof asked, "%s", what);
    return DP_FAIL(DP_ERR_OUT_OF_MEMORY,
                   "%s: %s, with the process at %zu bytes and %zu bytes kept for the "
                   "OpenBLAS work buffers of %zu CPU devices (~128 MiB each, one per GEMM "
                   "running at once; %zu made), would pass the address-space limit of %zu "
                   "bytes (ulimit -v), past which OpenBLAS hangs instead of failing: raise the "
                   "limit (ulimit -v), or use fewer CPU devices or a smaller batch or model",
                   dev->name, asked, size, held, devices, atomic_load(&blas_buffers),
                   host_space);
}

size_t dp_host_memory_available(void)
{
    size_t bytes = meminfo_available();
    return bytes ? bytes : sysconf_available();
}

static void host_init(void)
{
    /* one BLAS thread per virtual device, set once for the process */
    openblas_set_num_threads(1);
    host_available = dp_host_memory_available();
    const char *huge = getenv("DP_CPU_HUGEPAGES");
    host_huge = !(huge && strcmp(huge, "0") == 0);
    host_space = space_limit();
}

/* Counts bytes against the host's available memory, or says why not. */
dp_status dp_cpu_host_reserve(dp_device *dev, size_t bytes)
{
    pthread_mutex_lock(&host_mu);
    size_t avail = host_available, used = host_in_use;
    int fits = !avail || (bytes <= avail && used <= avail - bytes);
    size_t held = buffers_to_come(), size = 0, devices = host_devices;
    int space = !fits || space_fits(bytes, held, &size);
    if (fits && space) host_in_use += bytes;
    pthread_mutex_unlock(&host_mu);
    if (fits && !space) return space_refused(dev, "an allocation", bytes, size, held, devices);
    if (fits) return DP_OK;
    return DP_FAIL(DP_ERR_OUT_OF_MEMORY,
                   "%s: %zu bytes asked, %zu bytes in use on all CPU devices, %zu bytes of "
                   "host memory available when the first CPU device opened: this does not "
                   "fit in the host's RAM; use a smaller batch or context, micro-batches "
                   "(dp_engine_config.max_rows_per_micro or max_tokens_per_micro), or a "
                   "per-device limit that fits (dp_engine_config.memory_limit)",
                   dev->name, bytes, used, avail);
}

void dp_cpu_host_release(size_t bytes)
{
    pthread_mutex_lock(&host_mu);
    host_in_use -= bytes < host_in_use ? bytes : host_in_use;
    pthread_mutex_unlock(&host_mu);
}

dp_status dp_cpu_host_open(dp_device *dev)
{
    pthread_once(&host_once, host_init);
    pthread_mutex_lock(&host_mu);
    host_devices++;
    size_t held = buffers_to_come(), size = 0, devices = host_devices;
    int fits = space_fits(0, held, &size);
    if (!fits) host_devices--;
    pthread_mutex_unlock(&host_mu);
    return fits ? DP_OK : space_refused(dev, "opening a CPU device", 0, size, held, devices);
}

void dp_cpu_host_close(void)
{
    pthread_mutex_lock(&host_mu);
    if (host_devices) host_devices--;
    pthread_mutex_unlock(&host_mu);
}

/* Fast: fewer GEMMs running than buffers made, so a free one waits. Else,
 * one admission at a time (blas_mu, held until the GEMM leaves, so no
 * admitted GEMM can find the buffers all taken by a later one): a buffer
 * is made by a 1x1 GEMM where it fits, and counted where the process
 * grew by one. Every buffer is so made under blas_mu and measured. */
dp_status dp_cpu_blas_enter(dp_device *dev, int *admitted)
{
    *admitted = 0;
    if (!host_space) return DP_OK;
    size_t running = atomic_fetch_add(&blas_running, 1) + 1;
    if (running <= atomic_load(&blas_buffers)) return DP_OK;
    pthread_mutex_lock(&blas_mu);
    *admitted = 1;
    if (atomic_load(&blas_running) <= atomic_load(&blas_buffers)) return DP_OK;
    pthread_mutex_lock(&host_mu);
    size_t devices = host_devices;
    pthread_mutex_unlock(&host_mu);
    size_t size = 0;
    if (!space_fits(DP_CPU_BLAS_BUFFER, 0, &size)) {
        dp_status s = space_refused(dev, "OpenBLAS's work buffer for a GEMM",
                                    DP_CPU_BLAS_BUFFER, size, 0, devices);
        dp_cpu_blas_leave(*admitted);
        *admitted = 0;
        return s;
    }
    float a = 0.0f, b = 0.0f, c = 0.0f;
    cblas_sgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f,
                &c, 1);
    size_t after = process_size();
    if (size && after >= size && after - size >= DP_CPU_BLAS_MADE)
        atomic_fetch_add(&blas_buffers, 1);
    return DP_OK;
}

void dp_cpu_blas_leave(int admitted)
{
    if (!host_space) return;
    atomic_fetch_sub(&blas_running, 1);
    if (admitted) pthread_mutex_unlock(&blas_mu);
}

void *dp_cpu_host_alloc(size_t bytes)
{
    size_t rounded = (bytes + DP_CPU_ALIGN - 1) / DP_CPU_ALIGN * DP_CPU_ALIGN;
    if (rounded < bytes || bytes == 0) return NULL;
#ifdef MADV_HUGEPAGE
    if (host_huge && rounded >= DP_CPU_HUGE_PAGE) {
        /* aligned_alloc takes a multiple of the alignment (C11) */
        size_t whole = (rounded + DP_CPU_HUGE_PAGE - 1) / DP_CPU_HUGE_PAGE * DP_CPU_HUGE_PAGE;
        void *p = whole < rounded ? NULL : aligned_alloc(DP_CPU_HUGE_PAGE, whole);
        /* advice: a kernel without THP refuses it and the pages stay small */
        if (p) (void)madvise(p, whole, MADV_HUGEPAGE);
        return p;
    }
#endif
    return aligned_alloc(DP_CPU_ALIGN, rounded);
}
