/*
 * tests/test_modules.c - the modules (lib/core/module.h) when they are
 * there and when they cannot be loaded: DP_MODULE_DIR pointed at an empty
 * folder makes every module unloadable, as on a machine without oneDNN,
 * MPI or CUDA. Each Criterion test runs in its own process, so each sees
 * the loader's first try.
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, setenv */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/device_testing.h"
#include "core/module.h"
#include "dp_test.h"

/* Points DP_MODULE_DIR at a fresh empty folder (removed at exit). */
static char empty_dir[64];
static void no_modules(void)
{
    snprintf(empty_dir, sizeof empty_dir, "/tmp/dp-no-modules.XXXXXX");
    cr_assert_not_null(mkdtemp(empty_dir), "mkdtemp failed");
    cr_assert_eq(setenv("DP_MODULE_DIR", empty_dir, 1), 0);
}
static char junk_file[128];
static void remove_dir(void)
{
    if (junk_file[0]) unlink(junk_file);
    if (empty_dir[0]) rmdir(empty_dir);
}

/* A module file that is there but cannot be loaded (not an ELF file), as
 * one whose libraries are missing: dlopen fails on it. */
static void junk_module(const char *file)
{
    snprintf(junk_file, sizeof junk_file, "%s/%s", empty_dir, file);
    FILE *f = fopen(junk_file, "w");
    cr_assert_not_null(f);
    fputs("not a shared library\n", f);
    fclose(f);
}

static void assert_msg(const char *what, const char *needle)
{
    cr_assert(strstr(dp_last_error(), needle) != NULL, "%s: message lacks \"%s\": %s", what,
              needle, dp_last_error());
}

// --- the loader -------------------------------------------------------------------

/* A module that cannot be loaded: DP_ERR_UNSUPPORTED naming the library,
 * the loader's reason and the fix; the same answer on a second call. */
Test(modules, unloadable_module_names_the_library_and_the_fix, .init = no_modules,
     .fini = remove_dir)
{
    for (int id = 0; id < DP_MODULE_COUNT; id++) {
        for (int again = 0; again < 2; again++) {
            const void *t = (const void *)&id;
            cr_assert_eq(dp_module_load((dp_module_id)id, &t), DP_ERR_UNSUPPORTED);
            cr_assert_null(t);
            assert_msg("unloadable", dp_module_file((dp_module_id)id));
            assert_msg("unloadable", "could not be loaded");
            if (id == DP_MODULE_CUDA    ? DP_TEST_HAVE_CUDA
                : id == DP_MODULE_CUDNN ? DP_TEST_HAVE_CUDNN
                : id == DP_MODULE_MPI   ? DP_TEST_HAVE_MPI
                                        : DP_TEST_HAVE_DNNL)
                assert_msg("unloadable", "no such file in /tmp/dp-no-modules.");
            else
                assert_msg("unloadable", "built without it");
        }
    }
    cr_assert_eq(dp_module_load(DP_MODULE_COUNT, NULL), DP_ERR_INVALID_ARGUMENT);
}

/* Without the override the modules this dp was built with load from
 * libdp's folder, and their tables carry this libdp's ABI. */
Test(modules, built_modules_load_from_libdps_folder)
{
    unsetenv("DP_MODULE_DIR");
    static const struct {
        dp_module_id id;
        int built;
    } want[] = {
        {DP_MODULE_DNNL, DP_TEST_HAVE_DNNL},
        {DP_MODULE_MPI, DP_TEST_HAVE_MPI},
        {DP_MODULE_CUDA, DP_TEST_HAVE_CUDA},
        {DP_MODULE_CUDNN, DP_TEST_HAVE_CUDNN},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        const void *t = NULL;
        dp_status s = dp_module_load(want[i].id, &t);
        if (!want[i].built) {
            cr_assert_eq(s, DP_ERR_UNSUPPORTED);
            assert_msg("not built", "built without it");
            continue;
        }
        cr_assert_eq(s, DP_OK, "%s: %s", dp_module_file(want[i].id), dp_last_error());
        const dp_module_header *h = t;
        cr_assert_eq(h->abi, DP_MODULE_ABI);
    }
}

// --- oneDNN: CPU GEMMs fall back to OpenBLAS -----------------------------------------

/* A bf16 GEMM (32 x 24 x 40, float32 operands rounded) on dev. */
static void bf16_gemm(dp_device *dev, float *out)
{
    enum { M = 32, N = 24, K = 40 };
    float *a = malloc(sizeof(float) * M * K), *b = malloc(sizeof(float) * K * N);
    cr_assert(a && b);
    for (int i = 0; i < M * K; i++) a[i] = (float)((i * 37) % 101) / 17.0f - 2.5f;
    for (int i = 0; i < K * N; i++) b[i] = (float)((i * 53) % 97) / 13.0f - 3.0f;
    float *da, *db, *dc;
    dp_assert_ok(dp_device_set_matmul_precision(dev, DP_MATMUL_BF16));
    dp_assert_ok(dp_device_alloc(dev, sizeof(float) * M * K, (void **)&da));
    dp_assert_ok(dp_device_alloc(dev, sizeof(float) * K * N, (void **)&db));
    dp_assert_ok(dp_device_alloc(dev, sizeof(float) * M * N, (void **)&dc));
    dp_assert_ok(dp_copy_h2d(dev, da, a, sizeof(float) * M * K));
    dp_assert_ok(dp_copy_h2d(dev, db, b, sizeof(float) * K * N));
    dp_assert_ok(dp_gemm(dev, DP_OP_N, DP_OP_N, M, N, K, 1.0f, da, M, db, K, 0.0f, dc, M));
    dp_assert_ok(dp_copy_d2h(dev, out, dc, sizeof(float) * M * N));
    dp_device_free(dev, da);
    dp_device_free(dev, db);
    dp_device_free(dev, dc);
    free(a);
    free(b);
}

/* Without the oneDNN module, bf16 math runs on OpenBLAS: bitwise what a
 * device told not to use oneDNN computes (the build without oneDNN). */
Test(modules, bf16_gemm_without_the_dnnl_module_is_the_openblas_path, .init = no_modules,
     .fini = remove_dir)
{
    float got[32 * 24], want[32 * 24];
    dp_device *dev = dp_test_cpu(0);
    dp_set_error(DP_ERR_TIMEOUT, "an earlier message");
    bf16_gemm(dev, got);
    /* The fallback is no error: the thread's last message is kept. */
    cr_assert_str_eq(dp_last_error(), "an earlier message");
    dp_device_close(dev);
    dev = dp_test_cpu(1);
    dp_device_set_gemm_dnnl(dev, 0);
    bf16_gemm(dev, want);
    dp_device_close(dev);
    cr_assert(memcmp(got, want, sizeof got) == 0, "the fallback differs from OpenBLAS's bf16 math");
    const void *t = NULL;
    cr_assert_eq(dp_module_load(DP_MODULE_DNNL, &t), DP_ERR_UNSUPPORTED);
}

// --- MPI: dp/dist.h without its module -----------------------------------------------

static void no_launcher(void)
{
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE", "SLURM_NTASKS"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
}

/* Without a launcher a program joins as one rank, MPI module or not. */
Test(modules, dist_without_the_mpi_module_is_one_rank, .init = no_modules, .fini = remove_dir)
{
    no_launcher();
    dp_dist *d = NULL;
    dp_assert_ok(dp_dist_open(NULL, NULL, &d));
    cr_assert_not_null(d);
    cr_assert_eq(dp_dist_rank(d), 0);
    cr_assert_eq(dp_dist_size(d), 1);
    cr_assert_eq(dp_dist_agree(d, DP_ERR_TIMEOUT), DP_ERR_TIMEOUT);
    int x = 7;
    dp_assert_ok(dp_dist_broadcast(d, &x, sizeof x));
    cr_assert_eq(dp_dist_bytes_sent(d), 0);
    dp_dist_close(d);
}

/* With the MPI module, without a launcher: a second handle after the
 * first closed (and finalized MPI) is one rank again, not the end of the
 * process in MPI_Query_thread. */
Test(modules, dist_opens_again_after_a_close)
{
    no_launcher();
    for (int i = 0; i < 3; i++) {
        dp_dist *d = NULL;
        dp_assert_ok(dp_dist_open(NULL, NULL, &d));
        cr_assert_eq(dp_dist_size(d), 1, "open %d", i);
        cr_assert_eq(dp_dist_rank(d), 0, "open %d", i);
        int x = 7;
        dp_assert_ok(dp_dist_broadcast(d, &x, sizeof x));
        cr_assert_eq(x, 7);
        dp_dist_close(d);
    }
}

/* A launcher's ranks without the module: the clear error, not one rank
 * each (R copies would train R separate models). */
Test(modules, dist_ranks_without_the_mpi_module_say_why, .init = no_modules, .fini = remove_dir)
{
    no_launcher();
    cr_assert_eq(setenv("OMPI_COMM_WORLD_SIZE", "2", 1), 0);
    dp_dist *d = (dp_dist *)&d;
    cr_assert_eq(dp_dist_open(NULL, NULL, &d), DP_ERR_UNSUPPORTED, "%s", dp_last_error());
    cr_assert_null(d);
    assert_msg("ranks", "a launcher started 2 ranks");
    if (DP_TEST_HAVE_MPI) {
        assert_msg("ranks", "libdp-mpi.so.0 could not be loaded");
        assert_msg("ranks", "set DP_MODULE_DIR");
        assert_msg("ranks", "or run one process");
    } else {
        assert_msg("ranks", "built without MPI");
    }
}

// --- CUDA: devices without their module ----------------------------------------------

/* cuda:0 with the CUDA module unloadable: DP_ERR_NO_DEVICE naming the
 * device, the library and the fix, from dp_device_open and from the
 * device list; no CUDA device counted, and auto picks CPU devices. */
Test(modules, cuda_device_without_the_cuda_module_says_why, .init = no_modules,
     .fini = remove_dir)
{
    dp_device_spec spec = {DP_DEVICE_CUDA, 0};
    dp_device *dev = (dp_device *)&spec;
    cr_assert_eq(dp_device_open(&spec, &dev), DP_ERR_NO_DEVICE, "%s", dp_last_error());
    cr_assert_null(dev);
    assert_msg("open", "cuda:0");
    if (DP_TEST_HAVE_CUDA) {
        assert_msg("open", "the CUDA backend libdp-cuda.so.0 could not be loaded");
        assert_msg("open", "install it with libdp");
        assert_msg("open", "use cpu devices");
    } else {
        assert_msg("open", "this build has no CUDA backend");
    }
    cr_assert_eq(dp_cuda_device_count(), 0);
    dp_device_spec specs[4];
    size_t n = 9;
    static const char *lists[] = {"cuda:0", "cuda"};
    for (size_t i = 0; i < 2; i++) {
        cr_assert_eq(dp_device_list_parse(lists[i], specs, 4, &n), DP_ERR_NO_DEVICE);
        cr_assert_eq(n, 0);
        if (DP_TEST_HAVE_CUDA) assert_msg(lists[i], "libdp-cuda.so.0 could not be loaded");
    }
    dp_assert_ok(dp_device_list_parse("auto", specs, 4, &n));
    cr_assert(n >= 1 && specs[0].kind == DP_DEVICE_CPU);
    /* CPU devices work as ever. */
    dev = dp_test_cpu(0);
    dp_device_close(dev);
}

/* The CUDA module there but unloadable (a library it needs missing, here
 * a file dlopen rejects): the loader's reason and the fix that names the
 * CUDA libraries. */
Test(modules, cuda_module_that_cannot_load_names_the_reason_and_the_fix, .init = no_modules,
     .fini = remove_dir)
{
    if (!DP_TEST_HAVE_CUDA) cr_skip_test("this build has no CUDA module");
    junk_module("libdp-cuda.so.0");
    dp_device_spec spec = {DP_DEVICE_CUDA, 0};
    dp_device *dev = NULL;
    cr_assert_eq(dp_device_open(&spec, &dev), DP_ERR_NO_DEVICE, "%s", dp_last_error());
    cr_assert_null(dev);
    assert_msg("junk", "cuda:0");
    assert_msg("junk", "the CUDA backend libdp-cuda.so.0 could not be loaded (");
    assert_msg("junk", junk_file); /* dlopen's message names the file it rejected */
    assert_msg("junk", "install the CUDA runtime and cuBLAS");
    assert_msg("junk", "or use cpu devices");
    cr_assert_eq(dp_cuda_device_count(), 0);
}

/* The MPI module there but unloadable, under a launcher: the fix names
 * the MPI library. */
Test(modules, mpi_module_that_cannot_load_names_the_fix, .init = no_modules, .fini = remove_dir)
{
    if (!DP_TEST_HAVE_MPI) cr_skip_test("this build has no MPI module");
    junk_module("libdp-mpi.so.0");
    no_launcher();
    cr_assert_eq(setenv("OMPI_COMM_WORLD_SIZE", "2", 1), 0);
    dp_dist *d = NULL;
    cr_assert_eq(dp_dist_open(NULL, NULL, &d), DP_ERR_UNSUPPORTED);
    cr_assert_null(d);
    assert_msg("junk", "libdp-mpi.so.0 could not be loaded (");
    assert_msg("junk", "install the MPI library dp was built with");
}
