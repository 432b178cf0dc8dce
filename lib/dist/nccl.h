/*
 * dist/nccl.h - GPUs of several ranks joined by NCCL (not installed): one
 * communicator over all K = R x k devices of the job, NCCL rank = global
 * device index, each device's operations on dp's stream of that device.
 * Implemented in nccl.c (builds with CUDA, MPI and NCCL) or refused
 * (nccl_none.c). Every call is made from the thread that opened the ranks'
 * handle; every wait is bounded by timeout seconds (0: none), after which
 * the communicators are aborted and the call fails with DP_ERR_TIMEOUT.
 */
#ifndef DP_DIST_NCCL_H
#define DP_DIST_NCCL_H

#include <stddef.h>

#include "backend/backend.h"
#include "dp/dist.h"

typedef struct dp_nccl dp_nccl;

/* Collective over the ranks: rank 0 makes the NCCL id, MPI broadcasts it,
 * and each rank joins its k devices (global indices g0 .. g0 + k - 1). */
dp_status dp_nccl_open(dp_dist *d, dp_device **devs, size_t k, size_t K, size_t g0,
                       dp_nccl **out);
/* Destroys the communicators (aborts them after a failure or timeout). */
void dp_nccl_close(dp_nccl *n);

/* One point-to-point message of a grouped exchange: local device `local`
 * sends `count` floats at ptr to global device `peer`, or receives them. */
typedef struct dp_nccl_msg {
    size_t local;
    int peer;
    int send;
    float *ptr;
    size_t count;
} dp_nccl_msg;
/* Posts every message in one NCCL group and waits for the local streams.
 * Between a pair of devices, messages match in the order listed. */
dp_status dp_nccl_exchange(dp_nccl *n, const dp_nccl_msg *m, size_t n_msgs, double timeout,
                           const char *what);

/* Broadcasts, in one group: for each range, global device root's elements
 * [begin, begin + count) of its buffer to the same range of every local
 * device's buffer bufs[i] (esize-byte elements: 4 float32, 2 bfloat16). */
typedef struct dp_nccl_range {
    size_t begin, count;
    int root;
} dp_nccl_range;
dp_status dp_nccl_broadcast(dp_nccl *n, void *const *bufs, size_t esize, const dp_nccl_range *r,
                            size_t n_ranges, double timeout, const char *what);

#endif /* DP_DIST_NCCL_H */
