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
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

static void host_init(void)
{
    /* one BLAS thread per virtual device, set once for the process */
    openblas_set_num_threads(1);
    host_available = meminfo_available();
    if (!host_available) host_available = sysconf_available();
    const char *huge = getenv("DP_CPU_HUGEPAGES");
    host_huge = !(huge && strcmp(huge, "0") == 0);
}

/* Counts bytes against the host's available memory, or says why not. */
dp_status dp_cpu_host_reserve(dp_device *dev, size_t bytes)
{
    pthread_mutex_lock(&host_mu);
    size_t avail = host_available, used = host_in_use;
    int fits = !avail || (bytes <= avail && used <= avail - bytes);
    if (fits) host_in_use += bytes;
    pthread_mutex_unlock(&host_mu);
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

void dp_cpu_host_init(void) { pthread_once(&host_once, host_init); }

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
