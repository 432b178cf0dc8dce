/*
 * kernels/dp_hd.h - DP_HD marks kernel math shared by both backends.
 *
 * Functions in lib/kernels/ are `static inline DP_HD`: under nvcc they
 * are __host__ __device__, so the CUDA backend's __global__ wrappers call
 * exactly the code the CPU backend loops over and the CPU tests check.
 */
#ifndef DP_KERNELS_HD_H
#define DP_KERNELS_HD_H

#if defined(__CUDACC__)
#define DP_HD __host__ __device__
#else
#define DP_HD
#endif

#endif /* DP_KERNELS_HD_H */
