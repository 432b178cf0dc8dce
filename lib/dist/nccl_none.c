/*
 * dist/nccl_none.c - dist/nccl.h in a build without NCCL: CUDA devices
 * across ranks are refused, naming the fix.
 */
#include "core/error.h"
#include "dist/nccl.h"

dp_status dp_nccl_open(dp_dist *d, dp_device **devs, size_t k, size_t K, size_t g0,
                       dp_nccl **out)
{
    *out = NULL;
    return DP_FAIL(DP_ERR_UNSUPPORTED, "CUDA devices across ranks need NCCL, and this dp was "
                   "built without it (it needs the CUDA backend, MPI and NCCL; -DDP_NCCL=ON); use "
                   "cpu devices with ranks, or one process for the GPUs");
}

void dp_nccl_close(dp_nccl *n) {}

dp_status dp_nccl_exchange(dp_nccl *n, const dp_nccl_msg *m, size_t n_msgs, double timeout,
                           const char *what)
{
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: dp was built without NCCL", what);
}

dp_status dp_nccl_broadcast(dp_nccl *n, void *const *bufs, size_t esize, const dp_nccl_range *r,
                            size_t n_ranges, double timeout, const char *what)
{
    return DP_FAIL(DP_ERR_UNSUPPORTED, "%s: dp was built without NCCL", what);
}
