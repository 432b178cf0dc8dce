/*
 * CPU devices under an address-space limit (RLIMIT_AS, `ulimit -v`).
 * OpenBLAS maps a ~128 MiB work buffer for a GEMM when the ones it has are
 * all in use, and retries one it cannot map forever: a GEMM past the limit
 * hung its thread. dp now keeps room for the buffers when it allocates,
 * refuses a device with no room for one, and refuses (instead of
 * running) a GEMM whose new buffer does not fit (cpu_host.c).
 *
 * Each test sets the limit a fixed distance above the process's size
 * before its first CPU device opens (Criterion runs each in a process of
 * its own). The sanitizers reserve terabytes of shadow memory, which no
 * such limit leaves room for, so their builds skip these tests.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "dp_test.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define DP_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define DP_TEST_SANITIZED 1
#endif
#endif

#define MIB ((size_t)1 << 20)

#ifndef DP_TEST_SANITIZED
/* The process's size (VmSize) in bytes. */
static size_t process_size(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    cr_assert_not_null(f, "no /proc/self/statm");
    unsigned long long pages = 0;
    cr_assert_eq(fscanf(f, "%llu", &pages), 1);
    fclose(f);
    return (size_t)pages * (size_t)sysconf(_SC_PAGESIZE);
}
#endif

/* The limit set to the process's size plus room bytes. */
static void limit_room(size_t room)
{
#ifdef DP_TEST_SANITIZED
    (void)room;
    cr_skip_test("a sanitizer's shadow memory leaves no room for an address-space limit");
#else
    struct rlimit rl = {.rlim_cur = process_size() + room, .rlim_max = RLIM_INFINITY};
    cr_assert_eq(setrlimit(RLIMIT_AS, &rl), 0, "setrlimit: %s", strerror(errno));
#endif
}

static dp_device *open_cpu(int index)
{
    dp_device_spec spec = {DP_DEVICE_CPU, index};
    dp_device *dev = NULL;
    dp_assert_ok(dp_device_open(&spec, &dev));
    return dev;
}

static void assert_refused(dp_status s, const char *what)
{
    cr_assert_eq(s, DP_ERR_OUT_OF_MEMORY, "expected out of memory, got %s (%s)", dp_strerror(s),
                 dp_last_error());
    cr_assert(strstr(dp_last_error(), "ulimit -v") && strstr(dp_last_error(), what),
              "message \"%s\" names neither the limit nor \"%s\"", dp_last_error(), what);
}

/* A small GEMM C = A B (4 x 4) on dev. */
static dp_status gemm4(dp_device *dev, float *c)
{
    static const float a[16] = {1, 2, 3, 4}, /* column 0; the rest 0 */
                       b[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    return dp_gemm(dev, DP_OP_N, DP_OP_N, 4, 4, 4, 1.0f, a, 4, b, 4, 0.0f, c, 4);
}

/* 64 MiB above the process: not enough for the device's work buffer. */
Test(address_space, a_cpu_device_without_room_for_its_blas_buffer_is_refused, .timeout = 60)
{
    limit_room(64 * MIB);
    dp_device_spec spec = {DP_DEVICE_CPU, 0};
    dp_device *dev = NULL;
    assert_refused(dp_device_open(&spec, &dev), "opening a CPU device");
    cr_assert_null(dev);
}

/* Allocations keep room for the buffer until a GEMM has made it; the GEMM
 * gives the right product and the buffer's room is then in use. */
Test(address_space, allocations_keep_room_for_the_blas_buffer, .timeout = 60)
{
    limit_room(256 * MIB);
    dp_device *dev = open_cpu(0);
    void *p = NULL;
    /* 200 MiB would fit the limit, but not with the buffer's 128 */
    assert_refused(dp_device_alloc(dev, 200 * MIB, &p), "an allocation of 209715200 bytes");
    float c[16];
    memset(c, 0xff, sizeof c);
    dp_assert_ok(gemm4(dev, c));
    for (int j = 0; j < 4; j++)
        for (int i = 0; i < 4; i++) cr_assert_eq(c[i + 4 * j], (float)(i + 1));
    assert_refused(dp_device_alloc(dev, 200 * MIB, &p), "an allocation");
    dp_assert_ok(dp_device_alloc(dev, 16 * MIB, &p));
    dp_device_free(dev, p);
    dp_device_close(dev);
}

/* Something else maps the room after the device opened: the GEMM that
 * needs the buffer is refused, and C is untouched, instead of hanging in
 * OpenBLAS (the test's timeout); with the room back, it runs. */
Test(address_space, a_gemm_without_room_for_its_blas_buffer_is_refused, .timeout = 60)
{
    limit_room(256 * MIB);
    dp_device *dev = open_cpu(0);
    size_t other = 200 * MIB;
    void *m = mmap(NULL, other, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(m, MAP_FAILED, "mmap: %s", strerror(errno));
    float c[16];
    memset(c, 0x7f, sizeof c);
    assert_refused(gemm4(dev, c), "OpenBLAS's work buffer");
    for (int i = 0; i < 16; i++) cr_assert_eq(memcmp(&c[i], &(int){0x7f7f7f7f}, 4), 0);
    munmap(m, other);
    dp_assert_ok(gemm4(dev, c));
    cr_assert_eq(c[0], 1.0f);
    dp_device_close(dev);
}

/* Two CPU devices keep room for two buffers (two GEMMs at once need two). */
Test(address_space, each_cpu_device_keeps_room_for_a_buffer, .timeout = 60)
{
    limit_room(320 * MIB);
    dp_device *d0 = open_cpu(0), *d1 = open_cpu(1);
    void *p = NULL;
    /* 100 MiB and two buffers' 256 pass 320 MiB; 32 MiB does not */
    assert_refused(dp_device_alloc(d1, 100 * MIB, &p), "buffers of 2 CPU devices");
    dp_assert_ok(dp_device_alloc(d1, 32 * MIB, &p));
    dp_device_free(d1, p);
    dp_device_close(d1);
    /* with one device closed its room is free again */
    dp_assert_ok(dp_device_alloc(d0, 100 * MIB, &p));
    dp_device_free(d0, p);
    dp_device_close(d0);
}
