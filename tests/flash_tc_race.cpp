/*
 * flash_tc_race.cpp - the tensor core attention kernels
 * (backend/cuda/cuda_flash_tc.cuh) on the CUDA emulator under
 * ThreadSanitizer (the tsan preset; Criterion does not run under TSan):
 * a missing __syncthreads or __syncwarp between a shared tile's writers
 * and readers is a data race between the emulated threads. Three tiles,
 * the third partial, so every barrier of every kernel is crossed and a
 * buffer is refilled after use (the first use's step is two back). Run
 * twice: with the cp.async copies landing at their wait (a read before
 * the wait and barrier races with the copier) and at their issue (a
 * refill before every warp is done with the buffer races with its
 * readers). Exits 0 when the kernels ran; TSan's report fails the test.
 */
#include <stdio.h>

#include "flash_tc_emu_run.hpp"

int main(void)
{
    flash_tc_emu::problem p = flash_tc_emu::make(1, 150, 1, 1.0f, 7u);
    for (int eager = 0; eager < 2; eager++) {
        cuda_emu::cp_async_eager = eager;
        flash_tc_emu::result r = flash_tc_emu::run_kernels(p);
        for (float x : r.dqkv)
            if (!(x == x)) {
                fprintf(stderr, "flash_tc_race: a NaN in dqkv\n");
                return 1;
            }
    }
    printf("flash_tc_race: forward, dq, dk and dv ran, no NaN, copies landing late and early\n");
    return 0;
}
