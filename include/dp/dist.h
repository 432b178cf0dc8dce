/*
 * dp/dist.h - processes joined by MPI: R ranks, each running one engine
 * with its own devices (hierarchical data parallel, docs/design.md).
 *
 * A rank is one process started by an MPI launcher (mpirun, mpiexec,
 * srun). Every rank creates its engine with its local devices and the
 * same configuration, passing the dp_dist handle in
 * dp_engine_config.dist; the engine then spans the R x k devices of the
 * job in global device order (rank-major: rank 0's devices first). Every
 * rank passes the same global batch to each step (sample it from the same
 * seed) and the engine takes the rows the split gives its devices, so R
 * ranks of k devices compute what one process with R x k devices
 * computes, bitwise.
 *
 * Built with MPI (CMake DP_MPI, Open MPI from libopenmpi-dev) or not: a
 * build without it has these functions, and dp_dist_open returns
 * DP_ERR_UNSUPPORTED when a launcher started more than one rank. With
 * it, MPI is the MPI module (libdp-mpi.so.0, next to libdp), which
 * dp_dist_open loads: where it or libmpi cannot be loaded the same
 * holds (one rank without a launcher; DP_ERR_UNSUPPORTED naming the
 * library and the fix with one).
 *
 * Thread contract: open, close and every collective call are made from
 * the thread that opened the handle (MPI_THREAD_FUNNELED); the engine's
 * worker threads never call MPI.
 */
#ifndef DP_DIST_H
#define DP_DIST_H

#include <stddef.h>

#include "dp/export.h"
#include "dp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dp_dist dp_dist;

/* 1 when this libdp was built with MPI, else 0. */
DP_API int dp_dist_built(void);

/* The number of ranks the launcher's environment announces (Open MPI's
 * OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_SIZE, Slurm's SLURM_NTASKS under
 * srun), or 1 when the process was not started by a launcher. Reads the
 * environment only; MPI is not initialised. */
DP_API int dp_dist_launched_size(void);

/* Joins the job: initialises MPI (MPI_THREAD_FUNNELED) unless the
 * application already did, and takes a private duplicate of
 * MPI_COMM_WORLD. argc and argv may be NULL. *out is owned by the caller
 * (dp_dist_close). Errors: DP_ERR_UNSUPPORTED when built without MPI, or
 * the MPI module cannot be loaded, and a launcher started more than one
 * rank (the message names the fix);
 * DP_ERR_COMM when MPI fails to initialise; DP_ERR_UNSUPPORTED under a
 * launcher when MPI was finalized in this process already (by
 * dp_dist_close: MPI starts once per process). Without a launcher it
 * succeeds with one rank, with MPI or without (also after a close). */
DP_API dp_status dp_dist_open(int *argc, char ***argv, dp_dist **out);

/* Leaves the job: frees the communicator and finalises MPI when
 * dp_dist_open initialised it. Collective: every rank calls it. NULL is
 * a no-op. Destroy the engines that use the handle first. */
DP_API void dp_dist_close(dp_dist *d);

/* This process's rank (0..size-1) and the number of ranks; 0 and 1 for
 * NULL. */
DP_API int dp_dist_rank(const dp_dist *d);
DP_API int dp_dist_size(const dp_dist *d);

/* Agreement on an outcome (collective): every rank passes its own status
 * (with its message as this thread's last error when not DP_OK) and
 * every rank gets DP_OK when all passed DP_OK, else the status of the
 * lowest failing rank with its message prefixed by "rank r: " (a handle
 * without MPI, one rank: local and its message as they are). Use it
 * around work only some ranks do (rank 0 writes a checkpoint) so no rank
 * goes on into a collective the others have left. */
DP_API dp_status dp_dist_agree(dp_dist *d, dp_status local);

/* dp_dist_agree, waiting at most `seconds` for the other ranks (0: no
 * bound, as dp_dist_agree). When they do not all arrive in time: this
 * rank gets DP_ERR_TIMEOUT, naming the wait; the handle can then no
 * longer be trusted to match the others' collectives (a late rank may
 * still complete the one given up on): end the job (dp_dist_abort). */
DP_API dp_status dp_dist_agree_timeout(dp_dist *d, dp_status local, double seconds);

/* Broadcast of bytes bytes from rank 0's buf to every rank's buf
 * (collective; every rank passes the same bytes). */
DP_API dp_status dp_dist_broadcast(dp_dist *d, void *buf, size_t bytes);

/* dp_dist_broadcast, waiting at most `seconds` (0: no bound) for each
 * piece; DP_ERR_TIMEOUT as dp_dist_agree_timeout. */
DP_API dp_status dp_dist_broadcast_timeout(dp_dist *d, void *buf, size_t bytes, double seconds);

/* Bytes this rank has sent to other ranks since the handle was opened
 * (the engine's collectives and dp_dist_broadcast; MPI's own protocol
 * messages are not counted). */
DP_API size_t dp_dist_bytes_sent(const dp_dist *d);

/* Ends every rank of the job at once with exit status code (MPI_Abort):
 * for a rank that cannot go on and must not leave the others waiting in
 * a collective. Without MPI it does nothing and returns; library code
 * never calls it. */
DP_API void dp_dist_abort(dp_dist *d, int code);

#ifdef __cplusplus
}
#endif

#endif /* DP_DIST_H */
