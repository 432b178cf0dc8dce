/*
 * core/module.c - finding, loading and checking the modules (module.h).
 */
#define _GNU_SOURCE /* dladdr */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef DP_MODULES_STATIC
#include <dlfcn.h>
#endif

#include "core/error.h"
#include "core/module.h"

// --- what each module is --------------------------------------------------------

typedef struct module_info {
    const char *file;  /* the library, by its soname */
    const char *entry; /* the entry function's name */
    const char *what;  /* what it is, for messages */
    const char *fix;   /* what to do when a library it needs is missing */
    const char *alt;   /* what to do without it */
    int built;         /* part of this build */
} module_info;

#ifdef DP_MODULE_BUILT_DNNL
#define BUILT_DNNL 1
#else
#define BUILT_DNNL 0
#endif
#ifdef DP_MODULE_BUILT_MPI
#define BUILT_MPI 1
#else
#define BUILT_MPI 0
#endif
#ifdef DP_MODULE_BUILT_CUDA
#define BUILT_CUDA 1
#else
#define BUILT_CUDA 0
#endif
#ifdef DP_MODULE_BUILT_CUDNN
#define BUILT_CUDNN 1
#else
#define BUILT_CUDNN 0
#endif

static const module_info modules[DP_MODULE_COUNT] = {
    [DP_MODULE_DNNL] = {"libdp-dnnl.so." DP_MODULE_SOVERSION, "dp_module_dnnl",
                        "oneDNN GEMM module", "install oneDNN (libdnnl) and libgomp",
                        "leave bf16 GEMMs to OpenBLAS", BUILT_DNNL},
    [DP_MODULE_MPI] = {"libdp-mpi.so." DP_MODULE_SOVERSION, "dp_module_mpi", "MPI module",
                       "install the MPI library dp was built with (Open MPI: libopenmpi3) or "
                       "run one process", "run one process", BUILT_MPI},
    [DP_MODULE_CUDA] = {"libdp-cuda.so." DP_MODULE_SOVERSION, "dp_module_cuda", "CUDA backend",
                        "install the CUDA runtime and cuBLAS (and NCCL, when dp was built with "
                        "it) or use cpu devices", "use cpu devices", BUILT_CUDA},
    [DP_MODULE_CUDNN] = {"libdp-cudnn.so." DP_MODULE_SOVERSION, "dp_module_cudnn",
                         "cuDNN attention module", "install cuDNN 9 (libcudnn.so.9: the CUDA "
                         "toolkit's, or PyTorch's nvidia-cudnn wheel on LD_LIBRARY_PATH)",
                         "use dp's own attention kernels", BUILT_CUDNN},
};

const char *dp_module_file(dp_module_id id)
{
    return (unsigned)id < DP_MODULE_COUNT ? modules[id].file : "(no such module)";
}

// --- static builds: the modules are linked in ------------------------------------

#ifdef DP_MODULES_STATIC
#ifdef DP_MODULE_BUILT_DNNL
const void *dp_module_dnnl(void);
#endif
#ifdef DP_MODULE_BUILT_MPI
const void *dp_module_mpi(void);
#endif
#ifdef DP_MODULE_BUILT_CUDA
const void *dp_module_cuda(void);
#endif
#ifdef DP_MODULE_BUILT_CUDNN
const void *dp_module_cudnn(void);
#endif

static const void *linked_entry(dp_module_id id)
{
    switch (id) {
#ifdef DP_MODULE_BUILT_DNNL
    case DP_MODULE_DNNL: return dp_module_dnnl();
#endif
#ifdef DP_MODULE_BUILT_MPI
    case DP_MODULE_MPI: return dp_module_mpi();
#endif
#ifdef DP_MODULE_BUILT_CUDA
    case DP_MODULE_CUDA: return dp_module_cuda();
#endif
#ifdef DP_MODULE_BUILT_CUDNN
    case DP_MODULE_CUDNN: return dp_module_cudnn();
#endif
    default: return NULL;
    }
}
#endif

// --- loading ----------------------------------------------------------------------

typedef struct module_state {
    int tried;
    const void *table;
    char error[768]; /* why it is not there (after a failed try) */
} module_state;

static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;
static module_state states[DP_MODULE_COUNT];

#ifndef DP_MODULES_STATIC
/* The folder modules are looked for in (module.h), with a trailing '/';
 * "" when neither the override nor libdp's own path is known (dlopen then
 * searches the loader's path). */
static void module_dir(char *dir, size_t cap)
{
    const char *env = getenv("DP_MODULE_DIR");
    dir[0] = '\0';
    if (env && *env) {
        snprintf(dir, cap, "%s/", env);
        return;
    }
    Dl_info info;
    if (dladdr((void *)dp_module_load, &info) && info.dli_fname) {
        const char *slash = strrchr(info.dli_fname, '/');
        if (slash && (size_t)(slash - info.dli_fname) + 2 <= cap)
            snprintf(dir, cap, "%.*s/", (int)(slash - info.dli_fname), info.dli_fname);
    }
}

/* Loads the library and takes its table; the reason in why otherwise,
 * and *absent set when the module's own file is not there (rather than
 * a library it needs). */
static const void *load_shared(const module_info *m, char *why, size_t cap, int *absent)
{
    char dir[4096], path[4096 + 64];
    module_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s%s", dir, m->file);
    if (dir[0] && access(path, F_OK) != 0) {
        *absent = 1;
        snprintf(why, cap, "no such file in %.*s%s", (int)strlen(dir) - 1, dir,
                 getenv("DP_MODULE_DIR") && *getenv("DP_MODULE_DIR") ? " (DP_MODULE_DIR)" : "");
        return NULL;
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(why, cap, "%s", e ? e : "dlopen failed");
        return NULL;
    }
    dlerror();
    const void *(*entry)(void) = NULL;
    *(void **)&entry = dlsym(h, m->entry);
    if (!entry) {
        snprintf(why, cap, "%.300s has no entry function %s", path, m->entry);
        dlclose(h);
        return NULL;
    }
    /* Never closed: the tables and the state they point at live as long
     * as the process. */
    return entry();
}
#endif

dp_status dp_module_load(dp_module_id id, const void **table)
{
    if (!table) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "table must not be NULL");
    *table = NULL;
    if ((unsigned)id >= DP_MODULE_COUNT)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "no module %d", (int)id);
    const module_info *m = &modules[id];
    module_state *st = &states[id];
    pthread_mutex_lock(&load_mu);
    if (!st->tried) {
        st->tried = 1;
        char why[512] = "";
        const void *t = NULL;
        int absent = 0;
        if (!m->built) {
            snprintf(why, sizeof why, "this dp was built without it");
        } else {
#ifdef DP_MODULES_STATIC
            t = linked_entry(id);
            if (!t) snprintf(why, sizeof why, "its entry function returned no table");
#else
            t = load_shared(m, why, sizeof why, &absent);
#endif
        }
        const dp_module_header *hdr = t;
        if (hdr && hdr->abi != DP_MODULE_ABI) {
            snprintf(why, sizeof why, "it was built for module ABI %u and this libdp has ABI "
                     "%u: install the modules built with this libdp", hdr->abi, DP_MODULE_ABI);
            t = NULL;
        }
        st->table = t;
        if (!t && absent)
            snprintf(st->error, sizeof st->error, "the %s %s could not be loaded (%s); install "
                     "it with libdp (cmake --install puts the modules next to libdp) or set "
                     "DP_MODULE_DIR to its folder; or %s",
                     m->what, m->file, why, m->alt);
        else if (!t)
            snprintf(st->error, sizeof st->error, "the %s %s could not be loaded (%s); %s",
                     m->what, m->file, why, m->fix);
    }
    const void *t = st->table;
    char msg[sizeof st->error];
    if (!t) memcpy(msg, st->error, sizeof msg);
    pthread_mutex_unlock(&load_mu);
    if (!t) return DP_FAIL(DP_ERR_UNSUPPORTED, "%s", msg);
    *table = t;
    return DP_OK;
}
