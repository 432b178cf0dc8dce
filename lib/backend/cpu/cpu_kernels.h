/*
 * backend/cpu/cpu_kernels.h - the CPU backend's kernel entries.
 *
 * Each loops over the DP_HD functions of lib/kernels/ (*.h) on the calling
 * thread (a virtual CPU device is one thread). Signatures are those of the
 * matching dp_backend_ops entries in backend/backend.h.
 */
#ifndef DP_CPU_KERNELS_H
#define DP_CPU_KERNELS_H

#include "backend/backend.h"

/* DP_CPU_SIMD: compile a kernel loop twice, for AVX2 and for baseline x86-64,
 * and pick one at load time (GCC function multi-versioning). The loops are
 * written to auto-vectorise; AVX2 doubles their width on machines that have
 * it while the library still runs on any x86-64. Contraction to FMA stays off
 * (-std=c11), so both clones give the same bits. Not under sanitizers, whose
 * runtimes do not expect ifunc resolvers to run before them. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define DP_CPU_SIMD __attribute__((target_clones("avx2", "default")))
#else
#define DP_CPU_SIMD
#endif

dp_status dp_cpu_encoder_forward(dp_device *dev, float *out, const int32_t *inp,
                                 const float *wte, const float *wpe, size_t B, size_t T,
                                 size_t C);
dp_status dp_cpu_encoder_backward(dp_device *dev, float *dwte, float *dwpe, const float *dout,
                                  const int32_t *inp, size_t B, size_t T, size_t C);
dp_status dp_cpu_bias_broadcast(dp_device *dev, float *out, const float *bias, size_t N,
                                size_t OC);
dp_status dp_cpu_bias_backward(dp_device *dev, float *dbias, const float *dout, size_t N,
                               size_t OC);
dp_status dp_cpu_layernorm_forward(dp_device *dev, float *out, float *mean, float *rstd,
                                   const float *inp, const float *weight, const float *bias,
                                   size_t N, size_t C);
dp_status dp_cpu_layernorm_backward(dp_device *dev, float *dinp, float *dweight, float *dbias,
                                    const float *dout, const float *inp, const float *weight,
                                    const float *mean, const float *rstd, size_t N, size_t C);
dp_status dp_cpu_gelu_forward(dp_device *dev, float *out, const float *inp, size_t n);
dp_status dp_cpu_gelu_backward(dp_device *dev, float *dinp, const float *inp,
                               const float *dout, size_t n);
dp_status dp_cpu_add(dp_device *dev, float *out, const float *a, const float *b, size_t n);
dp_status dp_cpu_accumulate(dp_device *dev, float *dst, const float *src, size_t n);
dp_status dp_cpu_scale(dp_device *dev, float *x, float s, size_t n);
dp_status dp_cpu_sum_squares(dp_device *dev, double *out_host, const float *x, size_t n);
dp_status dp_cpu_attention_permute(dp_device *dev, float *qkvr, const float *qkv, size_t B,
                                   size_t T, size_t NH, size_t hs);
dp_status dp_cpu_attention_permute_backward(dp_device *dev, float *dqkv, const float *dqkvr,
                                            size_t B, size_t T, size_t NH, size_t hs);
dp_status dp_cpu_attention_unpermute(dp_device *dev, float *out, const float *y, size_t B,
                                     size_t T, size_t NH, size_t hs);
dp_status dp_cpu_attention_unpermute_backward(dp_device *dev, float *dy, const float *dout,
                                              size_t B, size_t T, size_t NH, size_t hs);
dp_status dp_cpu_softmax_causal_forward(dp_device *dev, float *att, float scale, size_t BNH,
                                        size_t T);
dp_status dp_cpu_softmax_causal_backward(dp_device *dev, float *datt, const float *att,
                                         float scale, size_t BNH, size_t T);
dp_status dp_cpu_crossentropy(dp_device *dev, float *losses, float *dlogits,
                              const float *logits, const int32_t *targets, size_t N, size_t V,
                              float dscale);
dp_status dp_cpu_adamw(dp_device *dev, float *params, const float *grads, float *m, float *v,
                       size_t n, float lr, float beta1, float beta2, float eps,
                       float weight_decay, float bias_corr1, float bias_corr2);
dp_status dp_cpu_sgd(dp_device *dev, float *params, const float *grads, float *momentum_buf,
                     size_t n, float lr, float momentum, float weight_decay, int first_step);

#endif /* DP_CPU_KERNELS_H */
