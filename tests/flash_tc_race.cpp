/*
 * flash_tc_race.cpp - the tensor core attention kernels
 * (backend/cuda/cuda_flash_tc.cuh) on the CUDA emulator under
 * ThreadSanitizer (the tsan preset; Criterion does not run under TSan):
 * a missing __syncthreads or __syncwarp between a shared tile's writers
 * and readers is a data race between the emulated threads. Two tiles,
 * the second partial, so every barrier of every kernel is crossed.
 * Exits 0 when the kernels ran; TSan's report fails the test.
 */
#include <stdio.h>

#include "flash_tc_emu_run.hpp"

int main(void)
{
    flash_tc_emu::problem p = flash_tc_emu::make(1, 80, 2, 1.0f, 7u);
    flash_tc_emu::result r = flash_tc_emu::run_kernels(p);
    for (float x : r.dqkv)
        if (!(x == x)) {
            fprintf(stderr, "flash_tc_race: a NaN in dqkv\n");
            return 1;
        }
    printf("flash_tc_race: forward, dq, dk and dv ran, no NaN\n");
    return 0;
}
