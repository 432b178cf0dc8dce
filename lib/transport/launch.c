/*
 * transport/launch.c - what the launcher's environment says about the job
 * (dp_dist_launched_size), the same with or without MPI.
 */
#include <limits.h>
#include <stdlib.h>

#include "dp/dist.h"

int dp_dist_launched_size(void)
{
    /* Open MPI's mpirun, PMIx and PMI launchers (MPICH's mpiexec), Slurm's srun. */
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE", "SLURM_NTASKS"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *v = getenv(vars[i]);
        char *end;
        long n;
        if (!v || !*v) continue;
        n = strtol(v, &end, 10);
        if (*end == '\0' && n >= 1 && n <= INT_MAX) return (int)n;
    }
    return 1;
}
