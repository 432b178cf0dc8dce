/*
 * Devices: memory accounting (in use, peaks, live allocations, the limit
 * and its error message), alignment, copies and memset, thread-safe
 * allocation, close freeing leftovers, and device-list parsing.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h" /* the allocation map, to check it stays bounded */
#include "backend/device_graph.h"
#include "dp/ops.h"
#include "parallel/state.h" /* dp_dbuf_ensure */
#include "dp_test.h"

// --- helpers -------------------------------------------------------------------

static dp_memory_stats stats(dp_device *dev)
{
    dp_memory_stats st;
    memset(&st, 0xff, sizeof st); /* a query that fills nothing cannot pass */
    dp_device_memory(dev, &st);
    return st;
}

static void *alloc_ok(dp_device *dev, size_t bytes)
{
    void *p = NULL;
    dp_assert_ok(dp_device_alloc(dev, bytes, &p));
    cr_assert_not_null(p);
    return p;
}

static void assert_status(dp_status got, dp_status want, const char *what)
{
    cr_assert_eq(got, want, "expected %s, got %s (%s)", dp_strerror(want), dp_strerror(got),
                 dp_last_error());
    cr_assert(strstr(dp_last_error(), what), "message \"%s\" does not mention \"%s\"",
              dp_last_error(), what);
}

// --- accounting ------------------------------------------------------------------

Test(memory, in_use_peak_and_counts)
{
    dp_device *dev = dp_test_cpu(0);
    dp_memory_stats st = stats(dev);
    cr_assert(st.in_use == 0 && st.peak == 0 && st.peak_since_reset == 0 && st.limit == 0 &&
              st.n_allocs == 0 && st.device_free == 0 && st.device_total == 0);

    /* Accounting counts the bytes asked for, not the 256-byte rounding. */
    void *a = alloc_ok(dev, 1000), *b = alloc_ok(dev, 3000);
    st = stats(dev);
    cr_assert_eq(st.in_use, 4000);
    cr_assert_eq(st.peak, 4000);
    cr_assert_eq(st.peak_since_reset, 4000);
    cr_assert_eq(st.n_allocs, 2);
    cr_assert_eq(dp_device_alloc_size(dev, a), 1000);
    cr_assert_eq(dp_device_alloc_size(dev, b), 3000);

    dp_device_free(dev, b);
    st = stats(dev);
    cr_assert_eq(st.in_use, 1000);
    cr_assert_eq(st.peak, 4000, "peak must keep the high-water mark");
    cr_assert_eq(st.n_allocs, 1);
    cr_assert_eq(dp_device_alloc_size(dev, b), 0, "a freed pointer still has a size");

    dp_device_reset_peak(dev);
    cr_assert_eq(stats(dev).peak_since_reset, 1000, "reset starts the window at in_use");
    void *c = alloc_ok(dev, 500);
    st = stats(dev);
    cr_assert_eq(st.peak_since_reset, 1500);
    cr_assert_eq(st.peak, 4000);
    dp_device_free(dev, c);
    cr_assert_eq(stats(dev).peak_since_reset, 1500);

    dp_device_free(dev, a);
    dp_device_free(dev, NULL); /* no-op */
    st = stats(dev);
    cr_assert_eq(st.in_use, 0);
    cr_assert_eq(st.n_allocs, 0);
    cr_assert_eq(st.peak, 4000);
    dp_device_close(dev);
}

Test(memory, limit_fails_with_a_useful_message)
{
    dp_device *dev = dp_test_cpu(1);
    cr_assert_eq(dp_device_set_limit(NULL, 4096), DP_ERR_INVALID_ARGUMENT);
    dp_assert_ok(dp_device_set_limit(dev, 4096));
    cr_assert_eq(stats(dev).limit, 4096);
    void *a = alloc_ok(dev, 3000);

    void *p = (void *)&p;
    dp_status s = dp_device_alloc(dev, 2000, &p);
    assert_status(s, DP_ERR_OUT_OF_MEMORY, "cpu:1");
    cr_assert_null(p, "a failed allocation must set *out to NULL");
    const char *msg = dp_last_error();
    cr_assert(strstr(msg, "2000") && strstr(msg, "3000") && strstr(msg, "4096"),
              "message must name bytes asked (2000), in use (3000) and limit (4096): %s", msg);
    dp_memory_stats st = stats(dev);
    cr_assert_eq(st.in_use, 3000, "a failed allocation changed in_use");
    cr_assert_eq(st.n_allocs, 1);
    cr_assert_eq(st.peak, 3000, "a failed allocation changed the peak");

    /* Smaller allocations still work, up to exactly the limit. */
    void *b = alloc_ok(dev, 1096);
    cr_assert_eq(stats(dev).in_use, 4096);
    assert_status(dp_device_alloc(dev, 1, &p), DP_ERR_OUT_OF_MEMORY, "cpu:1");
    /* Larger than the whole limit (and no overflow in the check). */
    dp_device_free(dev, b);
    assert_status(dp_device_alloc(dev, SIZE_MAX, &p), DP_ERR_OUT_OF_MEMORY, "cpu:1");
    cr_assert_eq(stats(dev).in_use, 3000);

    /* A lower limit keeps existing allocations but refuses new ones. */
    dp_device_set_limit(dev, 1000);
    st = stats(dev);
    cr_assert_eq(st.in_use, 3000);
    cr_assert_eq(st.n_allocs, 1);
    assert_status(dp_device_alloc(dev, 8, &p), DP_ERR_OUT_OF_MEMORY, "limit");
    /* 0 removes the limit. */
    dp_device_set_limit(dev, 0);
    void *big = alloc_ok(dev, 1 << 20);
    dp_device_free(dev, big);
    dp_device_free(dev, a);
    cr_assert_eq(stats(dev).in_use, 0);
    dp_device_close(dev);
}

/* Without a limit, an allocation the host cannot satisfy is an error
 * naming the device and the size, never an abort. */
Test(memory, allocator_failure_is_out_of_memory)
{
#if defined(__SANITIZE_ADDRESS__)
    /* ASan aborts on impossible allocations unless allocator_may_return_null=1. */
    cr_skip_test("AddressSanitizer build: huge allocations abort instead of failing");
#endif
    dp_device *dev = dp_test_cpu(2);
    void *p = (void *)&p;
    size_t huge = (size_t)1 << 62;
    char bytes[32];
    snprintf(bytes, sizeof bytes, "%zu", huge);
    assert_status(dp_device_alloc(dev, huge, &p), DP_ERR_OUT_OF_MEMORY, "cpu:2");
    cr_assert(strstr(dp_last_error(), bytes), "message lacks the size: %s", dp_last_error());
    cr_assert_null(p);
    dp_memory_stats st = stats(dev);
    cr_assert_eq(st.in_use, 0);
    cr_assert_eq(st.peak, 0);
    cr_assert_eq(st.n_allocs, 0);
    dp_device_close(dev);
}

/* On Linux malloc overcommits: 1 TiB "succeeds" and the process is killed
 * when the pages are touched. dp counts what all CPU devices hold against
 * the host's available memory and refuses at once, with the numbers. */
Test(memory, beyond_host_ram_fails_at_once)
{
    dp_device *dev = dp_test_cpu(0);
    void *p = (void *)&p;
    size_t tib = (size_t)1 << 40;
    assert_status(dp_device_alloc(dev, tib, &p), DP_ERR_OUT_OF_MEMORY, "1099511627776 bytes asked");
    const char *msg = dp_last_error();
    cr_assert(strstr(msg, "in use on all CPU devices"), "message lacks the bytes in use: %s", msg);
    cr_assert(strstr(msg, "available"), "message lacks the available memory: %s", msg);
    cr_assert(strstr(msg, "smaller batch"), "message lacks the fix: %s", msg);
    cr_assert_null(p);
    cr_assert_eq(stats(dev).in_use, 0);
    dp_device_close(dev);
}

/* MemAvailable of /proc/meminfo in bytes (0 if absent). */
static size_t test_mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    int found = 0;
    while (!found && fgets(line, sizeof line, f))
        found = sscanf(line, "MemAvailable: %llu kB", &kb) == 1;
    fclose(f);
    return found ? (size_t)kb * 1024 : 0;
}

/* The count is process-wide: two CPU devices each holding 40% of the
 * host's available memory leave no room for a third 40% on another one,
 * though each allocation alone would fit (and malloc would grant it).
 * Nothing is touched, so no real memory is used. */
Test(memory, host_ram_is_shared_by_all_cpu_devices)
{
    size_t avail = test_mem_available();
    if (!avail) cr_skip_test("no MemAvailable in /proc/meminfo");
    dp_device *d[3] = {dp_test_cpu(0), dp_test_cpu(1), dp_test_cpu(2)};
    size_t chunk = avail / 10 * 4;
    void *p[3] = {NULL, NULL, NULL};
    dp_assert_ok(dp_device_alloc(d[0], chunk, &p[0]));
    dp_assert_ok(dp_device_alloc(d[1], chunk, &p[1]));
    char in_use[64];
    snprintf(in_use, sizeof in_use, "%zu bytes in use on all CPU devices", 2 * chunk);
    assert_status(dp_device_alloc(d[2], chunk, &p[2]), DP_ERR_OUT_OF_MEMORY, in_use);
    cr_assert_null(p[2]);
    /* Freed bytes are counted back: the third device now gets its share. */
    dp_device_free(d[0], p[0]);
    dp_assert_ok(dp_device_alloc(d[2], chunk, &p[2]));
    dp_device_free(d[1], p[1]);
    dp_device_free(d[2], p[2]);
    for (int i = 0; i < 3; i++) dp_device_close(d[i]);
}

/* Memory a backend holds for itself (dev->reserved: the cuBLAS workspace,
 * scratch and staging buffers on CUDA) counts against the limit, so
 * --memory-limit bounds everything dp holds on the device. Set by hand on
 * a CPU device (whose backend reserves nothing) to check the rule. */
Test(memory, reserved_bytes_count_against_the_limit)
{
    dp_device *dev = dp_test_cpu(1);
    cr_assert_eq(stats(dev).reserved, 0, "the CPU backend reserves nothing");
    dev->reserved = 1000;
    cr_assert_eq(stats(dev).reserved, 1000);
    dp_device_set_limit(dev, 4096);
    void *a = alloc_ok(dev, 3000); /* 3000 + 1000 reserved <= 4096 */
    void *p = (void *)&p;
    assert_status(dp_device_alloc(dev, 200, &p), DP_ERR_OUT_OF_MEMORY, "1000 bytes reserved");
    cr_assert_null(p);
    cr_assert_eq(stats(dev).in_use, 3000, "reserved bytes are not in in_use");
    dp_device_set_limit(dev, 500); /* below the reserve: nothing fits */
    dp_device_free(dev, a);
    assert_status(dp_device_alloc(dev, 1, &p), DP_ERR_OUT_OF_MEMORY, "limit 500");
    dev->reserved = 0;
    dp_device_close(dev);
}

Test(memory, bad_arguments)
{
    dp_device *dev = dp_test_cpu(3);
    void *p = (void *)&p;
    assert_status(dp_device_alloc(dev, 0, &p), DP_ERR_INVALID_ARGUMENT, "0 bytes");
    cr_assert_null(p);
    assert_status(dp_device_alloc(dev, 16, NULL), DP_ERR_INVALID_ARGUMENT, "NULL");
    assert_status(dp_device_alloc(NULL, 16, &p), DP_ERR_INVALID_ARGUMENT, "NULL");
    cr_assert_eq(stats(dev).in_use, 0);
    /* A pointer another device owns is ignored, and counted nowhere twice. */
    dp_device *other = dp_test_cpu(4);
    void *q = alloc_ok(other, 64);
    dp_device_free(dev, q);
    cr_assert_eq(stats(dev).in_use, 0);
    cr_assert_eq(stats(other).in_use, 64);
    cr_assert_eq(dp_device_alloc_size(dev, q), 0);
    cr_assert_eq(dp_device_alloc_size(other, q), 64);
    dp_device_free(other, q);
    cr_assert_eq(stats(other).n_allocs, 0);
    dp_device_close(other);
    dp_device_close(dev);
    dp_device_close(NULL); /* no-op */
}

Test(memory, allocations_are_256_byte_aligned)
{
    static const size_t sizes[] = {1, 3, 255, 256, 257, 1000, 4097, 65536 + 4, 1 << 20};
    enum { NS = sizeof sizes / sizeof sizes[0] };
    dp_device *dev = dp_test_cpu(0);
    void *p[NS];
    size_t total = 0;
    for (size_t i = 0; i < NS; i++) {
        p[i] = alloc_ok(dev, sizes[i]);
        cr_assert_eq((uintptr_t)p[i] % 256, 0, "%zu-byte allocation at %p is not 256-byte "
                     "aligned", sizes[i], p[i]);
        /* The whole asked size is writable (ASan builds check it). */
        dp_assert_ok(dp_memset(dev, p[i], 0x5a, sizes[i]));
        total += sizes[i];
    }
    cr_assert_eq(stats(dev).in_use, total);
    for (size_t i = 0; i < NS; i++) dp_device_free(dev, p[i]);
    dp_device_close(dev);
}

/* The kernel's THP mode ("always", "madvise" or "never"; "" when it has
 * no THP). */
static void thp_mode(char *out, size_t cap)
{
    out[0] = 0;
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f) return;
    char line[128] = "";
    if (fgets(line, sizeof line, f)) {
        char *a = strchr(line, '['), *b = a ? strchr(a, ']') : NULL;
        if (a && b) snprintf(out, cap, "%.*s", (int)(b - a - 1), a + 1);
    }
    fclose(f);
}

/* smaps' THPeligible of the mapping that holds p: 1 or 0, -1 when not found. */
static int thp_eligible(const void *p)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    int in = 0, r = -1;
    while (r < 0 && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
            in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
        else if (in)
            sscanf(line, "THPeligible: %d", &r);
    }
    fclose(f);
    return r;
}

/* A large buffer is aligned to a huge page and advised as transparent huge
 * pages (a GEMM's TLB misses; cpu_host.c), where the kernel's mode,
 * "madvise" (Debian's default), would otherwise leave it in 4 KiB pages. */
Test(memory, large_cpu_buffers_are_huge_page_aligned_and_advised)
{
    dp_device *dev = dp_test_cpu(0);
    size_t sizes[] = {(size_t)2 << 20, ((size_t)8 << 20) + 1000};
    char mode[32];
    thp_mode(mode, sizeof mode);
    for (size_t i = 0; i < 2; i++) {
        char *p = alloc_ok(dev, sizes[i]);
        cr_assert_eq((uintptr_t)p % ((size_t)2 << 20), 0, "%zu-byte buffer at %p", sizes[i],
                     (void *)p);
        dp_assert_ok(dp_memset(dev, p, 0x5a, sizes[i])); /* all of it writable */
        cr_assert_eq(stats(dev).in_use, sizes[i], "the count is the bytes asked for");
        int e = thp_eligible(p);
        if (strcmp(mode, "madvise") == 0 || strcmp(mode, "always") == 0)
            cr_assert_eq(e, 1, "THP mode %s: the buffer's mapping is not THP-eligible (%d)",
                         mode, e);
        dp_device_free(dev, p);
    }
    dp_device_close(dev);
}

/* DP_CPU_HUGEPAGES=0 turns the advice off: under the "madvise" mode the
 * buffer stays in small pages. */
Test(memory, cpu_hugepages_off_by_environment)
{
    char mode[32];
    thp_mode(mode, sizeof mode);
    if (strcmp(mode, "madvise") != 0)
        cr_skip_test("THP mode is \"%s\", not \"madvise\": only the advice is tested", mode);
    setenv("DP_CPU_HUGEPAGES", "0", 1); /* before the first CPU device of this process */
    dp_device *dev = dp_test_cpu(0);
    char *p = alloc_ok(dev, (size_t)8 << 20);
    dp_assert_ok(dp_memset(dev, p, 0, (size_t)8 << 20));
    cr_assert_eq(thp_eligible(p), 0);
    dp_device_free(dev, p);
    dp_device_close(dev);
}

/* glibc's count of bytes handed out by malloc (heap + mmapped chunks). */
static size_t host_bytes_in_use(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

Test(memory, close_frees_leftovers)
{
    const size_t chunk = (size_t)8 << 20;
    size_t before = host_bytes_in_use();
    size_t counted_before = dp_device_bytes_freed_at_close();
    dp_device *dev = dp_test_cpu(0);
    for (int i = 0; i < 3; i++) alloc_ok(dev, chunk);
    for (int i = 0; i < 100; i++) alloc_ok(dev, 100); /* many small ones too */
    void *freed = alloc_ok(dev, 777);
    dp_device_free(dev, freed); /* freed before close: not a leftover */
    size_t during = host_bytes_in_use();
    dp_device_close(dev);
    size_t after = host_bytes_in_use();
    /* The process-wide leak counter saw exactly the leftovers. */
    cr_assert_eq(dp_device_bytes_freed_at_close() - counted_before, 3 * chunk + 100 * 100);
    /* Sanitizers replace malloc, and mallinfo2 then sees nothing; their
     * leak checker covers this case in those builds. */
    if (during < before + 3 * chunk)
        cr_skip_test("mallinfo2 does not see the allocations (sanitizer allocator?)");
    /* Slack for glibc's own bookkeeping; a leak would be >= 24 MiB. */
    cr_assert(after <= before + (64 << 10), "dp_device_close leaked %zu bytes",
              after - before);
}

/* Many alloc/free cycles with few live allocations must not grow the
 * allocation table without bound (tombstones are reclaimed). */
Test(memory, allocation_table_stays_bounded_under_churn)
{
    enum { RING = 64 };
    static const size_t sizes[] = {48, 300, 1000, 5000, 70000};
    dp_device *dev = dp_test_cpu(0);
    void *keep[4], *ring[RING] = {0};
    size_t ring_bytes[RING] = {0};
    for (int i = 0; i < 4; i++) keep[i] = alloc_ok(dev, 32);
    /* A sliding window of live allocations of mixed sizes, so addresses vary. */
    for (int i = 0; i < 200000; i++) {
        int r = i % RING;
        dp_device_free(dev, ring[r]);
        ring_bytes[r] = sizes[(i * 7) % 5];
        ring[r] = alloc_ok(dev, ring_bytes[r]);
    }
    size_t live = 4 * 32;
    for (int r = 0; r < RING; r++) live += ring_bytes[r];
    for (int i = 0; i < 4; i++) cr_assert_eq(dp_device_alloc_size(dev, keep[i]), 32);
    dp_memory_stats st = stats(dev);
    size_t cap = dev->allocs.cap, count = dev->allocs.count;
    dp_device_close(dev); /* before asserting, so a failure leaks nothing */
    cr_assert_eq(st.in_use, live);
    cr_assert_eq(st.n_allocs, 4 + RING);
    /* Live entries fit a 256-slot table at half load; allow 4x that. */
    cr_assert(cap <= 1024, "allocation table grew to %zu slots for %zu live allocations after "
              "200000 alloc/free cycles", cap, count);
}

// --- copies ------------------------------------------------------------------------

Test(copy, h2d_d2h_d2d_peer_and_memset)
{
    enum { N = 1000 };
    unsigned char host[N], back[N];
    for (int i = 0; i < N; i++) host[i] = (unsigned char)(i * 7 + 3);
    dp_device *d0 = dp_test_cpu(0), *d1 = dp_test_cpu(1);
    unsigned char *a = alloc_ok(d0, N), *b = alloc_ok(d0, N), *c = alloc_ok(d1, N);

    dp_assert_ok(dp_copy_h2d(d0, a, host, N));
    memset(back, 0, N);
    dp_assert_ok(dp_copy_d2h(d0, back, a, N));
    cr_assert(memcmp(back, host, N) == 0, "h2d + d2h round trip differs");

    dp_assert_ok(dp_copy_d2d(d0, b, a, N));
    memset(back, 0, N);
    dp_assert_ok(dp_copy_d2h(d0, back, b, N));
    cr_assert(memcmp(back, host, N) == 0, "d2d copy differs");

    dp_assert_ok(dp_copy_peer(d1, c, d0, a, N));
    memset(back, 0, N);
    dp_assert_ok(dp_copy_d2h(d1, back, c, N));
    cr_assert(memcmp(back, host, N) == 0, "peer copy differs");

    /* memset of a middle range leaves the rest alone. */
    dp_assert_ok(dp_memset(d1, c + 100, 0xab, 50));
    dp_assert_ok(dp_copy_d2h(d1, back, c, N));
    for (int i = 0; i < N; i++) {
        unsigned char want = (i >= 100 && i < 150) ? 0xab : host[i];
        cr_assert_eq(back[i], want, "byte %d = %#x, want %#x", i, back[i], want);
    }
    /* Partial copies at offsets. */
    dp_assert_ok(dp_copy_d2d(d0, b + 10, a + 500, 20));
    dp_assert_ok(dp_copy_d2h(d0, back, b, N));
    for (int i = 0; i < N; i++) {
        unsigned char want = (i >= 10 && i < 30) ? host[i + 490] : host[i];
        cr_assert_eq(back[i], want, "byte %d after offset copy", i);
    }
    dp_assert_ok(dp_device_synchronize(d0));

    /* Zero bytes is a no-op even with NULL pointers; NULL with bytes is not. */
    dp_assert_ok(dp_copy_h2d(d0, NULL, NULL, 0));
    dp_assert_ok(dp_memset(d0, NULL, 0, 0));
    assert_status(dp_copy_h2d(d0, a, NULL, 8), DP_ERR_INVALID_ARGUMENT, "cpu:0");
    assert_status(dp_copy_d2h(d0, NULL, a, 8), DP_ERR_INVALID_ARGUMENT, "8 bytes");
    assert_status(dp_copy_d2d(NULL, b, a, 8), DP_ERR_INVALID_ARGUMENT, "dev");
    assert_status(dp_memset(d0, NULL, 0, 8), DP_ERR_INVALID_ARGUMENT, "cpu:0");
    assert_status(dp_copy_peer(d1, c, NULL, a, 8), DP_ERR_INVALID_ARGUMENT, "src_dev");
    dp_device_close(d1);
    dp_device_close(d0);
}

// --- concurrency ---------------------------------------------------------------------

enum { NTHREADS = 4, OPS = 3000, MAXLIVE = 16 };

typedef struct churn_arg {
    dp_device *dev;
    uint64_t seed;
    void *live[MAXLIVE];
    size_t live_bytes[MAXLIVE];
    size_t n_live, bytes_live, n_failed;
} churn_arg;

/* Random alloc/free on a shared device; remembers what it leaves live.
 * Failures are only expected under a limit and are counted. */
static void *churn(void *argp)
{
    churn_arg *a = argp;
    dp_rng rng;
    dp_rng_seed(&rng, a->seed);
    for (int op = 0; op < OPS; op++) {
        int do_alloc = a->n_live == 0 || (a->n_live < MAXLIVE && dp_rng_below(&rng, 2) == 0);
        if (do_alloc) {
            size_t bytes = 1 + (size_t)dp_rng_below(&rng, 4096);
            void *p = NULL;
            if (dp_device_alloc(a->dev, bytes, &p) != DP_OK) {
                a->n_failed++;
                continue;
            }
            a->live[a->n_live] = p;
            a->live_bytes[a->n_live++] = bytes;
            a->bytes_live += bytes;
        } else {
            size_t i = (size_t)dp_rng_below(&rng, a->n_live);
            dp_device_free(a->dev, a->live[i]);
            a->bytes_live -= a->live_bytes[i];
            a->n_live--;
            a->live[i] = a->live[a->n_live];
            a->live_bytes[i] = a->live_bytes[a->n_live];
        }
    }
    return NULL;
}

static void run_churn(dp_device *dev, churn_arg *args)
{
    pthread_t th[NTHREADS];
    for (int t = 0; t < NTHREADS; t++) {
        memset(&args[t], 0, sizeof args[t]);
        args[t].dev = dev;
        args[t].seed = 1000 + (uint64_t)t;
        cr_assert_eq(pthread_create(&th[t], NULL, churn, &args[t]), 0);
    }
    for (int t = 0; t < NTHREADS; t++) pthread_join(th[t], NULL);
}

Test(memory, concurrent_alloc_free_keeps_exact_counts, .timeout = 20)
{
    dp_device *dev = dp_test_cpu(0);
    churn_arg args[NTHREADS];
    run_churn(dev, args);
    size_t bytes = 0, count = 0;
    for (int t = 0; t < NTHREADS; t++) {
        cr_assert_eq(args[t].n_failed, 0, "allocation failed without a limit");
        bytes += args[t].bytes_live;
        count += args[t].n_live;
    }
    dp_memory_stats st = stats(dev);
    cr_assert_eq(st.in_use, bytes, "in_use %zu, threads hold %zu", st.in_use, bytes);
    cr_assert_eq(st.n_allocs, count);
    cr_assert(st.peak >= bytes && st.peak <= (size_t)NTHREADS * MAXLIVE * 4096);
    for (int t = 0; t < NTHREADS; t++)
        for (size_t i = 0; i < args[t].n_live; i++) {
            cr_assert_eq(dp_device_alloc_size(dev, args[t].live[i]), args[t].live_bytes[i]);
            dp_device_free(dev, args[t].live[i]);
        }
    st = stats(dev);
    cr_assert_eq(st.in_use, 0);
    cr_assert_eq(st.n_allocs, 0);
    dp_device_close(dev);
}

/* Concurrent allocations together never pass the limit. */
Test(memory, concurrent_allocations_respect_the_limit, .timeout = 20)
{
    const size_t limit = 40000; /* well under the threads' combined demand */
    dp_device *dev = dp_test_cpu(0);
    dp_device_set_limit(dev, limit);
    churn_arg args[NTHREADS];
    run_churn(dev, args);
    size_t failed = 0, bytes = 0;
    for (int t = 0; t < NTHREADS; t++) failed += args[t].n_failed, bytes += args[t].bytes_live;
    dp_memory_stats st = stats(dev);
    cr_assert(failed > 0, "the limit never bit; the test does not exercise it");
    cr_assert(st.peak <= limit, "peak %zu passed the limit %zu", st.peak, limit);
    cr_assert_eq(st.in_use, bytes);
    dp_device_close(dev); /* frees what the threads left live */
}

// --- device-list parsing ------------------------------------------------------------

static void expect_cpus(const char *text, size_t cap, const int *want, size_t nwant)
{
    dp_device_spec specs[DP_MAX_DEVICES + 1];
    size_t n = 12345;
    dp_status s = dp_device_list_parse(text, specs, cap, &n);
    cr_assert_eq(s, DP_OK, "\"%s\": %s (%s)", text, dp_strerror(s), dp_last_error());
    cr_assert_eq(n, nwant, "\"%s\" gave %zu devices, want %zu", text, n, nwant);
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(specs[i].kind, DP_DEVICE_CPU, "\"%s\"[%zu] is not a cpu device", text, i);
        cr_assert_eq(specs[i].index, want[i], "\"%s\"[%zu] = cpu:%d, want cpu:%d", text, i,
                     specs[i].index, want[i]);
    }
}

#define EXPECT_CPUS(text, ...)                                                      \
    do {                                                                            \
        static const int w_[] = {__VA_ARGS__};                                      \
        expect_cpus((text), DP_MAX_DEVICES, w_, sizeof w_ / sizeof w_[0]);          \
    } while (0)

Test(devlist, good_lists)
{
    EXPECT_CPUS("cpu", 0);
    EXPECT_CPUS("cpu:4", 0, 1, 2, 3);
    EXPECT_CPUS("cpu:0", 0);
    EXPECT_CPUS("cpu:1", 0);
    EXPECT_CPUS("cpu:0,1", 0, 1);
    EXPECT_CPUS("cpu:0,cpu:2", 0, 2);
    EXPECT_CPUS(" cpu:2 ", 0, 1);
    EXPECT_CPUS("cpu:2,3", 2, 3);
    EXPECT_CPUS("cpu:0, 1 ,3", 0, 1, 3);
    EXPECT_CPUS("cpu:3,cpu:1", 3, 1);
    int all[DP_MAX_DEVICES];
    for (int i = 0; i < DP_MAX_DEVICES; i++) all[i] = i;
    expect_cpus("cpu:64", DP_MAX_DEVICES, all, DP_MAX_DEVICES);
    expect_cpus("cpu:3", 3, all, 3); /* exactly the cap */
}

Test(devlist, auto_is_one_cpu_device_per_core_without_gpus)
{
    cr_assert_eq(dp_cuda_device_count(), 0, "this test expects a build or machine without GPUs");
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int want_n = cores < 1 ? 1 : cores > DP_MAX_DEVICES ? DP_MAX_DEVICES : (int)cores;
    cr_assert_eq(dp_cpu_core_count(), want_n);
    int all[DP_MAX_DEVICES];
    for (int i = 0; i < DP_MAX_DEVICES; i++) all[i] = i;
    expect_cpus("auto", DP_MAX_DEVICES, all, (size_t)want_n);
    expect_cpus("  auto ", DP_MAX_DEVICES, all, (size_t)want_n);
}

/* A bad list fails with `want` and a message holding each of the given
 * fragments (the offending text, and the whole list when non-empty). */
static void expect_bad(const char *text, size_t cap, dp_status want, const char *frag)
{
    dp_device_spec specs[DP_MAX_DEVICES + 1];
    size_t n = 0;
    dp_clear_error();
    dp_status s = dp_device_list_parse(text, specs, cap, &n);
    cr_assert_eq(s, want, "\"%s\": got %s, want %s (%s)", text ? text : "(null)",
                 dp_strerror(s), dp_strerror(want), dp_last_error());
    const char *msg = dp_last_error();
    cr_assert(strstr(msg, frag), "\"%s\": message \"%s\" does not mention \"%s\"",
              text ? text : "(null)", msg, frag);
    if (text && *text && strspn(text, " ") != strlen(text))
        cr_assert(strstr(msg, text), "message \"%s\" does not quote the list \"%s\"", msg, text);
}

Test(devlist, bad_lists)
{
    const size_t cap = DP_MAX_DEVICES;
    expect_bad("", cap, DP_ERR_INVALID_ARGUMENT, "empty device list");
    expect_bad("   ", cap, DP_ERR_INVALID_ARGUMENT, "empty device list");
    expect_bad("gpu:0", cap, DP_ERR_INVALID_ARGUMENT, "\"gpu\"");
    expect_bad("CPU:0", cap, DP_ERR_INVALID_ARGUMENT, "\"CPU\"");
    expect_bad("cpu:-1", cap, DP_ERR_INVALID_ARGUMENT, "\"-1\"");
    expect_bad("cpu:x", cap, DP_ERR_INVALID_ARGUMENT, "\"x\"");
    expect_bad("cpu:1.5", cap, DP_ERR_INVALID_ARGUMENT, "\"1.5\"");
    expect_bad("cpu:", cap, DP_ERR_INVALID_ARGUMENT, "cpu:");
    expect_bad("cpu:0,0", cap, DP_ERR_INVALID_ARGUMENT, "cpu:0 twice");
    expect_bad("cpu,cpu:0", cap, DP_ERR_INVALID_ARGUMENT, "cpu:0 twice");
    expect_bad("cpu:0,", cap, DP_ERR_INVALID_ARGUMENT, "empty entry");
    expect_bad(",cpu", cap, DP_ERR_INVALID_ARGUMENT, "empty entry");
    expect_bad("cpu:0,,1", cap, DP_ERR_INVALID_ARGUMENT, "empty entry");
    expect_bad("cpu:0,-1", cap, DP_ERR_INVALID_ARGUMENT, "\"-1\"");
    expect_bad("1,2", cap, DP_ERR_INVALID_ARGUMENT, "bare index");
    expect_bad("auto,cpu", cap, DP_ERR_INVALID_ARGUMENT, "auto");
    expect_bad("cpu:0,auto", cap, DP_ERR_INVALID_ARGUMENT, "auto");
    expect_bad("cpu:65", cap, DP_ERR_INVALID_ARGUMENT, "more than 64");
    expect_bad("cpu:65", DP_MAX_DEVICES + 1, DP_ERR_INVALID_ARGUMENT, "more than 64");
    expect_bad("cpu:4", 2, DP_ERR_INVALID_ARGUMENT, "more than 2");
    expect_bad("cpu:0,1,2", 2, DP_ERR_INVALID_ARGUMENT, "more than 2");
    expect_bad(NULL, cap, DP_ERR_INVALID_ARGUMENT, "NULL");
    dp_device_spec one;
    size_t n;
    cr_assert_eq(dp_device_list_parse("cpu", NULL, 1, &n), DP_ERR_INVALID_ARGUMENT);
    cr_assert_eq(dp_device_list_parse("cpu", &one, 1, NULL), DP_ERR_INVALID_ARGUMENT);
}

Test(devlist, cuda_without_gpus_is_no_device)
{
    cr_assert_eq(dp_cuda_device_count(), 0, "this test expects a build or machine without GPUs");
    const size_t cap = DP_MAX_DEVICES;
    expect_bad("cuda:0", cap, DP_ERR_NO_DEVICE, "cuda:0");
    expect_bad("cuda", cap, DP_ERR_NO_DEVICE, "CUDA");
    expect_bad("cuda:1,0", cap, DP_ERR_NO_DEVICE, "cuda:1");
}

/* Mixing kinds is an error of the list itself (dp/device.h), so it must be
 * reported as such on every machine, before asking whether cuda:0 exists. */
Test(devlist, mixed_kinds_are_invalid)
{
    const size_t cap = DP_MAX_DEVICES;
    expect_bad("cpu:0,cuda:0", cap, DP_ERR_INVALID_ARGUMENT, "mixes cpu and cuda");
    expect_bad("cuda:0,cpu:0", cap, DP_ERR_INVALID_ARGUMENT, "mixes cpu and cuda");
}

/* dp_device_open(cuda:0) without a usable GPU says why: no CUDA backend in
 * this build (cpu-only preset), or no device visible. Never a crash. */
Test(devlist, open_cuda_without_gpus_says_why)
{
    if (dp_cuda_device_count() > 0) cr_skip_test("a CUDA device is visible");
    dp_device_spec spec = {DP_DEVICE_CUDA, 0};
    dp_device *dev = (dp_device *)&spec;
#ifdef DP_HAVE_CUDA
    assert_status(dp_device_open(&spec, &dev), DP_ERR_NO_DEVICE, "no CUDA device is visible");
#else
    assert_status(dp_device_open(&spec, &dev), DP_ERR_NO_DEVICE, "this build has no CUDA backend");
#endif
    cr_assert_null(dev);
    /* The TF32 option is a no-op on CPU devices (no such op there). */
    dp_device *cpu = dp_test_cpu(0);
    dp_assert_ok(dp_device_set_allow_tf32(cpu, 1));
    dp_device_close(cpu);
}

// --- communication queues ------------------------------------------------------------

/* CPU devices have no communication queue (their entries complete as they
 * are called; the engine sums on the device itself), so ordering them is
 * a no-op; bad arguments are refused by name. */
Test(comm_queue, cpu_devices_need_none)
{
    dp_device *a = dp_test_cpu(0), *b = dp_test_cpu(1);
    dp_device *q = a;
    dp_assert_ok(dp_device_open_comm(a, &q));
    cr_assert_null(q);
    dp_assert_ok(dp_device_order(a, b));
    dp_assert_ok(dp_device_order(a, a));
    assert_status(dp_device_open_comm(NULL, &q), DP_ERR_INVALID_ARGUMENT, "NULL");
    assert_status(dp_device_open_comm(a, NULL), DP_ERR_INVALID_ARGUMENT, "NULL");
    assert_status(dp_device_order(NULL, a), DP_ERR_INVALID_ARGUMENT, "NULL");
    assert_status(dp_device_order(a, NULL), DP_ERR_INVALID_ARGUMENT, "NULL");
    dp_device_close_comm(NULL);
    dp_device_close(a);
    dp_device_close(b);
}

// --- events --------------------------------------------------------------------------

/* Events mark points in a device's work: record, wait from another device,
 * host synchronise, elapsed time between two records (never judged by its
 * size: only that it is a finite, non-negative number of seconds). */
Test(events, record_wait_elapsed_and_errors)
{
    dp_device *a = dp_test_cpu(0), *b = dp_test_cpu(1);
    dp_event *e0 = NULL, *e1 = NULL, *other = NULL;
    dp_assert_ok(dp_event_create(a, &e0));
    dp_assert_ok(dp_event_create(a, &e1));
    dp_assert_ok(dp_event_create(b, &other));
    double sec = -1.0;
    /* Not recorded yet: every use says so. */
    assert_status(dp_event_elapsed(e0, e1, &sec), DP_ERR_INVALID_ARGUMENT, "never recorded");
    assert_status(dp_event_wait(b, e0), DP_ERR_INVALID_ARGUMENT, "never recorded");
    assert_status(dp_event_synchronize(e0), DP_ERR_INVALID_ARGUMENT, "never recorded");

    void *p = alloc_ok(a, 1 << 20);
    dp_assert_ok(dp_event_record(e0));
    dp_assert_ok(dp_memset(a, p, 0, 1 << 20));
    dp_assert_ok(dp_event_record(e1));
    dp_assert_ok(dp_event_wait(b, e1)); /* b's later work after a's memset */
    dp_assert_ok(dp_event_synchronize(e1));
    dp_assert_ok(dp_event_elapsed(e0, e1, &sec));
    cr_assert(isfinite(sec) && sec >= 0.0, "elapsed %g s", sec);

    dp_assert_ok(dp_event_record(other));
    assert_status(dp_event_elapsed(e0, other, &sec), DP_ERR_INVALID_ARGUMENT, "one device");
    assert_status(dp_event_elapsed(e0, e1, NULL), DP_ERR_INVALID_ARGUMENT, "seconds");
    assert_status(dp_event_create(NULL, &e0), DP_ERR_INVALID_ARGUMENT, "NULL");
    assert_status(dp_event_record(NULL), DP_ERR_INVALID_ARGUMENT, "ev");
    assert_status(dp_event_wait(NULL, e1), DP_ERR_INVALID_ARGUMENT, "dev");
    dp_event_destroy(NULL);
    dp_event_destroy(e0);
    dp_event_destroy(e1);
    dp_event_destroy(other);
    dp_device_free(a, p);
    dp_device_close(a);
    dp_device_close(b);
}

// --- graphs: what a recording refuses ----------------------------------------------

/* CPU devices record no graphs: a clear error, and nothing to end. */
Test(graph, cpu_devices_record_none)
{
    dp_device *dev = dp_test_cpu(0);
    assert_status(dp_device_graph_begin(dev), DP_ERR_UNSUPPORTED, "do not record graphs");
    cr_assert(!dp_device_graph_recording(dev));
    dp_device_graph *g = (dp_device_graph *)dev; /* must be cleared */
    assert_status(dp_device_graph_end(dev, &g), DP_ERR_INVALID_ARGUMENT, "no graph");
    cr_assert_null(g);
    cr_assert_eq(dp_device_graph_epoch(dev), 0);
    dp_device_close(dev);
}

/* While a device's queue is recorded (the flag a backend's graph_begin
 * leads to), every call that waits for the device, reads a result on the
 * host, copies host memory, allocates or grows a buffer fails with
 * DP_ERR_UNSUPPORTED and changes nothing; afterwards each works again. */
Test(graph, a_recording_refuses_what_it_cannot_replay)
{
    dp_device *dev = dp_test_cpu(0), *peer = dp_test_cpu(1);
    float *x = alloc_ok(dev, 4 * sizeof(float)), *y = alloc_ok(peer, 4 * sizeof(float));
    const float host[4] = {1, 2, 3, 4}, mask[4] = {1, 1, 1, 1};
    dp_assert_ok(dp_copy_h2d(dev, x, host, sizeof host));
    dp_event *a = NULL, *b = NULL;
    dp_assert_ok(dp_event_create(dev, &a));
    dp_assert_ok(dp_event_create(dev, &b));
    dp_assert_ok(dp_event_record(a));
    dp_assert_ok(dp_event_record(b));
    dbuf buf = {0};
    dp_assert_ok(dp_dbuf_ensure(dev, &buf, 64));
    void *kept = buf.ptr;
    size_t in_use = stats(dev).in_use;

    dev->graph_recording = 1;
    float back[4] = {9, 9, 9, 9}, other[4] = {5, 6, 7, 8};
    void *p = (void *)1;
    double sum = -1.0, secs = -1.0;
    size_t count = 7;
    assert_status(dp_device_alloc(dev, 16, &p), DP_ERR_UNSUPPORTED, "an allocation");
    cr_assert_null(p);
    assert_status(dp_copy_h2d(dev, x, other, sizeof other), DP_ERR_UNSUPPORTED,
                  "a copy from host memory");
    assert_status(dp_copy_d2h(dev, back, x, sizeof back), DP_ERR_UNSUPPORTED,
                  "a copy to host memory");
    cr_assert(back[0] == 9 && back[3] == 9, "a refused copy wrote its destination");
    assert_status(dp_copy_peer(peer, y, dev, x, sizeof host), DP_ERR_UNSUPPORTED,
                  "a copy between devices");
    assert_status(dp_copy_peer(dev, x, peer, y, sizeof host), DP_ERR_UNSUPPORTED,
                  "a copy between devices");
    assert_status(dp_device_synchronize(dev), DP_ERR_UNSUPPORTED, "a wait for the device");
    assert_status(dp_event_record(a), DP_ERR_UNSUPPORTED, "an event");
    assert_status(dp_event_wait(dev, a), DP_ERR_UNSUPPORTED, "a wait for an event");
    assert_status(dp_event_synchronize(a), DP_ERR_UNSUPPORTED, "a wait for an event");
    assert_status(dp_event_elapsed(a, b, &secs), DP_ERR_UNSUPPORTED, "a wait for an event");
    assert_status(dp_sum_squares(dev, &sum, x, 4), DP_ERR_UNSUPPORTED, "a sum read on the host");
    cr_assert(sum == -1.0, "a refused sum wrote its result");
    assert_status(dp_masked_sum(dev, &sum, &count, x, mask, 4), DP_ERR_UNSUPPORTED,
                  "a sum read on the host");
    assert_status(dp_dbuf_ensure(dev, &buf, 128), DP_ERR_UNSUPPORTED, "a buffer that grows");
    cr_assert(buf.ptr == kept && buf.bytes == 64, "a refused growth let go of the buffer");
    dp_assert_ok(dp_dbuf_ensure(dev, &buf, 64)); /* no growth: nothing to refuse */
    dp_device_graph *g = (dp_device_graph *)dev;
    assert_status(dp_device_graph_launch(dev, g), DP_ERR_UNSUPPORTED, "a graph's replay");
    cr_assert_eq(stats(dev).in_use, in_use);
    dev->graph_recording = 0;

    dp_assert_ok(dp_copy_d2h(dev, back, x, sizeof back));
    cr_assert(memcmp(back, host, sizeof host) == 0, "a refused copy changed the device's data");
    dp_assert_ok(dp_sum_squares(dev, &sum, x, 4));
    cr_assert(sum == 30.0, "sum of squares %g", sum);
    dp_assert_ok(dp_device_synchronize(dev));
    dp_assert_ok(dp_event_record(a));
    dp_assert_ok(dp_event_synchronize(a));
    dp_assert_ok(dp_dbuf_ensure(dev, &buf, 128));
    dp_dbuf_release(dev, &buf);
    dp_event_destroy(a);
    dp_event_destroy(b);
    dp_device_free(dev, x);
    dp_device_free(peer, y);
    dp_device_close(dev);
    dp_device_close(peer);
}
