/*
 * backend/cuda/cuda_mma.cuh - the warp-level tensor core instructions the
 * fused attention uses, as inline PTX (sm_80 and later; PTX ISA 7.0+,
 * "Warp-level matrix instructions"):
 *
 *   dp_mma_bf16_16816(d, a, b)   d(16x8 f32) += a(16x16 bf16) b(16x8 bf16):
 *                                mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
 *   dp_ldmatrix_x4(r, p)         four 8x8 b16 matrices from shared memory:
 *                                ldmatrix.sync.aligned.m8n8.x4.shared.b16
 *   dp_ldmatrix_x4_trans(r, p)   the same, each matrix transposed (.trans)
 *   dp_cp_async16(d, s, valid)   16 bytes from global s to shared d without
 *                                passing through registers, or 16 zero
 *                                bytes if !valid (s is not read):
 *                                cp.async.cg.shared.global, its source
 *                                size 16 or 0; both 16-byte aligned
 *   dp_cp_async4(d, s, valid)    the same for 4 bytes (cp.async.ca)
 *   dp_cp_async_commit()         closes the thread's group of copies
 *   dp_cp_async_wait<N>()        waits until at most N of its groups are
 *                                in flight (their bytes then visible to
 *                                it; to the block after a barrier)
 *
 * and two scalar instructions the softmax between the products needs
 * once per score, where the C library's versions take several:
 *
 *   dp_cvt_bf16x2(lo, hi)        lo and hi rounded to bfloat16 (nearest,
 *                                ties to even) in one register, lo in the
 *                                low half: cvt.rn.bf16x2.f32. The bits of
 *                                kernels/bf16.h's dp_bf16_round for every
 *                                value but NaN (which becomes 0x7fff);
 *                                dp_bf16_round is about ten integer
 *                                instructions a value
 *   dp_ex2(x)                    2^x: ex2.approx.ftz.f32 (the MUFU unit;
 *                                a relative error of a few float ulp,
 *                                subnormal results flushed to +0, -inf
 *                                gives +0); expf is about eight
 *                                instructions around the same unit
 *
 * Fragment layouts (the ISA's, which the kernels rely on): with
 * g = lane / 4 and t = lane % 4, a lane holds
 *   a[0..3]  A(g, 2t..2t+1), A(g+8, 2t..), A(g, 2t+8..), A(g+8, 2t+8..)
 *   b[0..1]  B(2t..2t+1, g), B(2t+8..2t+9, g)
 *   d[0..3]  D(g, 2t), D(g, 2t+1), D(g+8, 2t), D(g+8, 2t+1)
 * two bf16 per 32-bit register, the lower column (or row, for b) in the
 * low half. ldmatrix: lanes 8m..8m+7 give the addresses of matrix m's
 * eight 16-byte rows; lane i receives in r[m] row i/4's elements
 * 2(i%4), 2(i%4)+1 (.trans: column i/4's elements of rows 2(i%4) and
 * 2(i%4)+1). Why these and not WMMA: the accumulator layout is known, so
 * a row's scores stay in its four lanes' registers for the softmax and
 * become the next product's A operand without a trip through shared
 * memory (FlashAttention-2's register-resident P).
 *
 * tests/cuda_emu.hpp gives the same functions on the CPU (the matrix
 * ones as warp collectives over the same layouts), so the kernels run
 * there too.
 */
#ifndef DP_CUDA_MMA_CUH
#define DP_CUDA_MMA_CUH

#include <stdint.h>

__device__ __forceinline__ void dp_mma_bf16_16816(float d[4], const uint32_t a[4],
                                                  const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* "memory": the loads must not move across the stores and barriers that
 * fill the tile. */
__device__ __forceinline__ void dp_ldmatrix_x4(uint32_t r[4], const void *p)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s)
                 : "memory");
}

__device__ __forceinline__ void dp_ldmatrix_x4_trans(uint32_t r[4], const void *p)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s)
                 : "memory");
}

__device__ __forceinline__ void dp_cp_async16(void *dst, const void *src, bool valid)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}

/* 4 bytes (.ca: the only sizes below 16 it takes are 4 and 8), or 4 zero
 * bytes if !valid; both 4-byte aligned. */
__device__ __forceinline__ void dp_cp_async4(void *dst, const void *src, bool valid)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(src),
                 "r"(valid ? 4 : 0)
                 : "memory");
}

__device__ __forceinline__ void dp_cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N> __device__ __forceinline__ void dp_cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ uint32_t dp_cvt_bf16x2(float lo, float hi)
{
    uint32_t d; /* cvt's first source goes to the upper half */
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

__device__ __forceinline__ float dp_ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

#endif /* DP_CUDA_MMA_CUH */
