/*
 * transport/mpi.h - the MPI transport's operations on host memory, which
 * the NCCL transport shares (its agreements, broadcasts and host
 * all-gathers go over MPI too). Not installed.
 */
#ifndef DP_TRANSPORT_MPI_H
#define DP_TRANSPORT_MPI_H

#include "core/module.h"
#include "transport/transport.h"

/* In the core (the NCCL transport in the CUDA module calls them too). */
DP_MODULE_API dp_status dp_mpi_agree(dp_transport *t, dp_status local, const void *mine, void *all,
                       size_t bytes, const char *what);
DP_MODULE_API dp_status dp_mpi_broadcast(dp_transport *t, void *buf, size_t bytes, const char *what);
DP_MODULE_API dp_status dp_mpi_allgather_host(dp_transport *t, void *buf, size_t esize, const dp_run *runs,
                                size_t n, const char *what);

#endif /* DP_TRANSPORT_MPI_H */
