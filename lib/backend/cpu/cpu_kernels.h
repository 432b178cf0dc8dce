/*
 * backend/cpu/cpu_kernels.h - the CPU backend's hand-written kernel entries.
 *
 * Each loops over the DP_HD functions of lib/kernels/ (*.h) on the calling
 * thread (a virtual CPU device is one thread). Signatures are those of the
 * matching dp_backend_ops entries in backend/backend.h. The element-wise
 * and row-wise ops need no declaration: cpu_backend.c generates them from
 * kernels/ops.h.
 */
#ifndef DP_CPU_KERNELS_H
#define DP_CPU_KERNELS_H

#include "backend/backend.h"

/* DP_CPU_SIMD: compile a kernel loop three times, for AVX-512 (x86-64-v4),
 * AVX2 and baseline x86-64, and pick one at load time (GCC function
 * multi-versioning). The loops are written to auto-vectorise; the wider
 * clones widen them on machines that have the instructions while the
 * library still runs on any x86-64. Contraction to FMA stays off
 * (-std=c11) and no loop's sums are reassociated, so every clone gives the
 * same bits (lm_train's checkpoints after 200 steps, fp32 and bf16, are
 * byte-identical with and without the AVX-512 clone). Not under
 * sanitizers, whose runtimes do not expect ifunc resolvers to run before
 * them. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define DP_CPU_SIMD __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define DP_CPU_SIMD
#endif

/* A CPU device's state (dev->ctx, cpu_gemm.c): the GEMM's conversion
 * scratch and oneDNN's engine, stream and primitives. */
dp_status dp_cpu_ctx_create(dp_device *dev);
void dp_cpu_ctx_destroy(dp_device *dev);
/* The gemm and gemm_bias_out entries (backend.h). */
dp_status dp_cpu_gemm(dp_device *dev, dp_op ta, dp_op tb, int m, int n, int k, float alpha,
                      const dp_gemm_arg *A, const dp_gemm_arg *B, float beta, float *C, int ldc,
                      long long sc, int batch);
dp_status dp_cpu_gemm_bias_out(dp_device *dev, dp_op ta, dp_op tb, int m, int n, int k,
                               const dp_gemm_arg *A, const dp_gemm_arg *B, dp_pref bias, void *C,
                               int c_bf16, int ldc, int *done);
/* The matmul_native entry (backend.h): BF16 is native where oneDNN
 * builds a bf16 matmul on this CPU (probed once per device). */
dp_status dp_cpu_matmul_native(dp_device *dev, dp_matmul_precision p, int *native);
/* cpu_host.c: the process's setup for CPU devices (once: one BLAS thread,
 * the host's available memory, the address-space limit), then the bytes
 * allocated on any CPU device against it: open (one per CPU device, undone
 * by close) and reserve fail with DP_ERR_OUT_OF_MEMORY naming dev. */
dp_status dp_cpu_host_open(dp_device *dev);
void dp_cpu_host_close(void);
dp_status dp_cpu_host_reserve(dp_device *dev, size_t bytes);
void dp_cpu_host_release(size_t bytes);
/* A CPU buffer of bytes (> 0; NULL when the host has none): aligned to
 * DP_CPU_ALIGN, and from DP_CPU_HUGE_PAGE bytes up to a huge page and
 * advised as transparent huge pages (unless DP_CPU_HUGEPAGES=0). Freed
 * with free(). The caller counts it (dp_cpu_host_reserve). */
#define DP_CPU_ALIGN 256
#define DP_CPU_HUGE_PAGE ((size_t)2 << 20)
void *dp_cpu_host_alloc(size_t bytes);
/* Around every OpenBLAS call (cpu_host.c): enter admits it, or fails with
 * DP_ERR_OUT_OF_MEMORY where OpenBLAS would need a work buffer that the
 * address-space limit has no room for (it would hang); leave(admitted)
 * after the call, only when enter succeeded. Free without a limit. */
dp_status dp_cpu_blas_enter(dp_device *dev, int *admitted);
void dp_cpu_blas_leave(int admitted);

/* The entries not generated from kernels/ops.h (reductions, scatters,
 * permutes), in cpu_nn.c and cpu_attention.c. */
dp_status dp_cpu_encoder_forward(dp_device *dev, float *out, const int32_t *inp, dp_pref wte,
                                 dp_pref wpe, size_t T, size_t C, size_t n);
dp_status dp_cpu_encoder_backward(dp_device *dev, float *dwte, float *dwpe, const float *dout,
                                  const int32_t *inp, size_t B, size_t T, size_t C);
dp_status dp_cpu_bias_broadcast(dp_device *dev, float *out, dp_pref bias, size_t N, size_t OC);
dp_status dp_cpu_bias_backward(dp_device *dev, float *dbias, uint16_t *dout16, dp_pref dout,
                               size_t N, size_t OC);
dp_status dp_cpu_layernorm_backward_params(dp_device *dev, float *dweight, float *dbias,
                                           dp_pref dout, const float *inp,
                                           const float *mean, const float *rstd, size_t N,
                                           size_t C);
dp_status dp_cpu_sum_squares(dp_device *dev, double *out_host, const float *x, size_t n);
dp_status dp_cpu_adamw_segments(dp_device *dev, float *params, float *grads, float *m, float *v,
                                uint16_t *replica, const dp_adamw_segs *segs, float lr,
                                float beta1, float beta2, float eps, float bias_corr1,
                                float bias_corr2, float clip);
dp_status dp_cpu_attention_permute(dp_device *dev, float *qkvr, const float *qkv, size_t B,
                                   size_t T, size_t NH, size_t hs);
dp_status dp_cpu_attention_permute_bf16(dp_device *dev, uint16_t *qkvr, const float *qkv,
                                       size_t B, size_t T, size_t NH, size_t hs);
dp_status dp_cpu_attention_permute_backward(dp_device *dev, float *dqkv, const float *dqkvr,
                                            size_t B, size_t T, size_t NH, size_t hs);
dp_status dp_cpu_attention_unpermute(dp_device *dev, float *out, const float *y, size_t B,
                                     size_t T, size_t NH, size_t hs);
dp_status dp_cpu_attention_unpermute_backward(dp_device *dev, float *dy, const float *dout,
                                              size_t B, size_t T, size_t NH, size_t hs);

#endif /* DP_CPU_KERNELS_H */
