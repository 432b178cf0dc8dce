/*
 * core/module.h - the optional parts of dp as loadable modules (not
 * installed).
 *
 * The core libdp needs OpenBLAS, jansson, PCRE2 and pthreads only. What
 * needs more lives in a module of its own, a shared library installed
 * next to libdp and loaded with dlopen when it is first needed:
 *   libdp-dnnl.so.0   oneDNN's bf16 matmul on CPU devices (libdnnl, libgomp)
 *   libdp-mpi.so.0    ranks joined by MPI, the bootstrap of dp/dist.h (libmpi)
 *   libdp-cuda.so.0   the CUDA backend, with NCCL between ranks (libcudart,
 *                     libcublas, libnccl)
 *   libdp-cudnn.so.0  cuDNN's fused attention for the CUDA backend (libcudnn;
 *                     loaded by libdp-cuda, which falls back to its own
 *                     kernels without it)
 * so a program that uses only CPU devices runs where none of those
 * libraries exist. Each module exports one entry function,
 * dp_module_<name>(), that returns its table; the table starts with the
 * ABI number it was built for (DP_MODULE_ABI), which must be the core's.
 *
 * Where modules are looked for: the folder named by the environment
 * variable DP_MODULE_DIR when it is set (tests point it at an empty folder
 * to see the failure), else libdp's own folder (dladdr on a libdp
 * function), which is the build tree's top folder or the install's libdir.
 * A static libdp (BUILD_SHARED_LIBS=OFF) holds the modules it was built
 * with: the entry functions are called directly, nothing is loaded.
 *
 * A module that cannot be loaded fails the call that needed it with the
 * library's name, the loader's reason and the fix; the outcome (table or
 * message) is kept, so later calls answer the same without retrying.
 */
#ifndef DP_CORE_MODULE_H
#define DP_CORE_MODULE_H

#include "dp/export.h"
#include "dp/status.h"

/* Marks an internal core function that the modules (and the tests) call:
 * visible in the shared libdp's symbol table, declared in no installed
 * header. */
#define DP_MODULE_API DP_API

/* Bumped whenever a module table, struct dp_device or another structure
 * the modules share with the core changes layout. */
#define DP_MODULE_ABI 12

typedef enum dp_module_id {
    DP_MODULE_DNNL, /* struct dp_dnnl_module (backend/cpu/cpu_dnnl.h) */
    DP_MODULE_MPI,  /* struct dp_mpi_module (transport/dist_internal.h) */
    DP_MODULE_CUDA, /* struct dp_cuda_module (backend/backend.h) */
    DP_MODULE_CUDNN, /* struct dp_cudnn_module (backend/cuda/cudnn_sdpa.h) */
    DP_MODULE_COUNT
} dp_module_id;

/* What every module table starts with. */
typedef struct dp_module_header {
    unsigned abi; /* DP_MODULE_ABI of the module's build */
    const char *name; /* "cuda", "mpi", "dnnl", "cudnn" */
} dp_module_header;

/* The table of module id, loading it on the first call (thread-safe).
 * DP_OK with *table set; or DP_ERR_UNSUPPORTED, *table NULL and a message
 * "the <what> <file> could not be loaded (<reason>); <fix>" when the
 * module is not in this build, is absent, cannot load (a missing
 * dependency) or is of another ABI. Callers prefix their own context
 * (dp_error_prefix), e.g. the device's name. */
DP_MODULE_API dp_status dp_module_load(dp_module_id id, const void **table);

/* The library file of module id ("libdp-cuda.so.0"). */
DP_MODULE_API const char *dp_module_file(dp_module_id id);

#endif /* DP_CORE_MODULE_H */
