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

/* DP_UNROLL: before a constant-trip loop of device code whose arrays must
 * stay in registers, unrolled in nvcc's device passes; nothing for host
 * compilers (nvcc's host pass of a DP_HD function, and the CUDA emulator
 * of the tests, which compiles device code with them). */
#if defined(__CUDA_ARCH__)
#define DP_UNROLL _Pragma("unroll")
#else
#define DP_UNROLL
#endif

/* DP_HD_ALWAYS_INLINE: kernel math the CPU backend's loops must inline whatever
 * its size: a function the compiler keeps out of line is compiled once,
 * for baseline x86-64, and the backend's AVX2 clone (DP_CPU_SIMD) then
 * calls that scalar copy. */
#if defined(__GNUC__) && !defined(__CUDACC__)
#define DP_HD_ALWAYS_INLINE __attribute__((always_inline))
#else
#define DP_HD_ALWAYS_INLINE
#endif

#endif /* DP_KERNELS_HD_H */
