/*
 * backend/cuda/cuda_sdpa.c - the fused causal attention through cuDNN
 * (dp_backend_ops.attention_lib_forward / _backward; the module:
 * cudnn_sdpa.h), for bfloat16 q, k, v.
 *
 * On only with DP_CUDA_CUDNN=1 in the environment when the device opens:
 * then a shape cuDNN declines, or a machine without the module or
 * libcudnn.so.9, fails the call with the reason instead of falling back,
 * so a run that asked for cuDNN's attention got it. One exception: a
 * single token (T = 1), whose attention is v itself and whose backward
 * cuDNN's frontend refuses (s_q = s_kv = 1), runs dp's kernels both
 * ways. Without the variable the entries decline and dp's own kernels
 * (cuda_flash.cu) run. The
 * default stays off until a GPU session has checked the results and
 * timed them (docs/design.md, section 10).
 *
 * cuDNN reads and writes bfloat16: the forward writes o straight into a
 * bfloat16 out (the GPT's bf16 activations), or into the scratch and
 * widens it into a float32 out (exactly, so the backward rounds it back
 * to cuDNN's own o); the backward rounds a float32 dout (a bfloat16 one,
 * the GPT's bf16 gradients, it reads as it is) and writes dq, dk, dv
 * straight into a bfloat16 dqkv, or widens them into a float32 one.
 * Those bfloat16 buffers and cuDNN's workspace share the device's scratch
 * c->cvt (the GEMMs' converted operands): everything runs on c->stream
 * under c->mu, so no two uses overlap.
 */
#include <stdint.h>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cudnn_sdpa.h"
#include "core/module.h"

/* Bytes rounded up to a 256-byte boundary: each piece of the scratch
 * starts aligned for cuDNN's vector loads. */
static size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

/* The module and its context for c (both kept from the first use), or
 * why not. */
static dp_status ready(dp_device *dev, cuda_ctx *c, const dp_cudnn_module **m)
{
    if (c->sdpa) {
        *m = c->sdpa_mod;
        return DP_OK;
    }
    const void *table = NULL;
    if (dp_module_load(DP_MODULE_CUDNN, &table) != DP_OK) {
        dp_error_prefix("%s: DP_CUDA_CUDNN=1 asks for cuDNN's attention (unset it to use dp's "
                        "own kernels)",
                        dev->name);
        return DP_ERR_UNSUPPORTED;
    }
    *m = c->sdpa_mod = table;
    char err[512] = "";
    int r = (*m)->open(&c->sdpa, (void *)c->stream, err, sizeof err);
    if (r != DP_SDPA_DONE)
        return DP_FAIL(r == DP_SDPA_DECLINED ? DP_ERR_UNSUPPORTED : DP_ERR_DEVICE,
                       "%s: cuDNN's attention could not start (%s); unset DP_CUDA_CUDNN to use "
                       "dp's own attention kernels",
                       dev->name, err);
    return DP_OK;
}

/* The status of a module call that did not return DP_SDPA_DONE. */
static dp_status failed(dp_device *dev, int r, const char *err)
{
    if (r == DP_SDPA_DECLINED)
        return DP_FAIL(DP_ERR_UNSUPPORTED,
                       "%s: DP_CUDA_CUDNN=1, but cuDNN does not take this attention (%s); unset "
                       "DP_CUDA_CUDNN to use dp's own attention kernels",
                       dev->name, err);
    return DP_FAIL(DP_ERR_DEVICE, "%s: %s", dev->name, err);
}

static dp_sdpa_desc desc_of(size_t B, size_t T, size_t NH, size_t hs, float scale)
{
    dp_sdpa_desc d = {(int64_t)B, (int64_t)T, (int64_t)NH, (int64_t)hs, scale};
    return d;
}

/* The scratch for `parts` bfloat16 buffers of the given element counts
 * plus the workspace of d's plan (direction backward): their addresses in
 * p[0..parts-1] and *ws. */
static dp_status scratch(dp_device *dev, cuda_ctx *c, const dp_cudnn_module *m,
                         const dp_sdpa_desc *d, int backward, const size_t *elems, int parts,
                         uint16_t **p, void **ws)
{
    char err[512] = "";
    size_t ws_bytes = 0;
    int r = m->workspace(c->sdpa, d, backward, &ws_bytes, err, sizeof err);
    if (r != DP_SDPA_DONE) return failed(dev, r, err);
    size_t off[4], total = 0;
    for (int i = 0; i < parts; i++) {
        off[i] = total;
        total += align256(elems[i] * sizeof(uint16_t));
    }
    DP_TRY(dp_cuda_grow_scratch(dev, c, &c->cvt, &c->cvt_bytes, total + ws_bytes));
    for (int i = 0; i < parts; i++) p[i] = (uint16_t *)((unsigned char *)c->cvt + off[i]);
    *ws = ws_bytes ? (unsigned char *)c->cvt + total : NULL;
    return DP_OK;
}

static dp_status forward_locked(dp_device *dev, cuda_ctx *c, dp_pout out, float *lse,
                                const uint16_t *qkv, const dp_sdpa_desc *d)
{
    const dp_cudnn_module *m = NULL;
    DP_TRY(ready(dev, c, &m));
    size_t n = (size_t)(d->B * d->T * d->NH * d->hs);
    /* a bfloat16 out is written by cuDNN itself; a float32 one is widened
     * from o16 in the scratch (no scratch piece otherwise) */
    size_t elems = out.bf16 ? 0 : n;
    uint16_t *o16 = NULL;
    void *ws = NULL;
    DP_TRY(scratch(dev, c, m, d, 0, &elems, 1, &o16, &ws));
    if (out.bf16) o16 = (uint16_t *)out.p;
    char err[512] = "";
    int r = m->forward(c->sdpa, d, qkv, o16, lse, ws, err, sizeof err);
    if (r != DP_SDPA_DONE) return failed(dev, r, err);
    if (!out.bf16) CU_TRY(dev, dp_cuda_launch_cast_bf16_f32(c->stream, (float *)out.p, o16, n));
    return DP_OK;
}

dp_status dp_cuda_attention_lib_forward(dp_device *dev, dp_pout out, float *lse,
                                        const uint16_t *qkv, size_t B, size_t T, size_t NH,
                                        size_t hs, float scale, int *done)
{
    *done = 0;
    if (!CTX(dev)->cudnn || T == 1) return DP_OK; /* T = 1: see the file comment */
    ENTER(dev);
    cuda_ctx *c = CTX(dev);
    dp_sdpa_desc d = desc_of(B, T, NH, hs, scale);
    pthread_mutex_lock(&c->mu);
    dp_status s = forward_locked(dev, c, out, lse, qkv, &d);
    pthread_mutex_unlock(&c->mu);
    *done = s == DP_OK;
    return s;
}

static dp_status backward_locked(dp_device *dev, cuda_ctx *c, dp_pout dqkv, dp_pref dout,
                                 const uint16_t *qkv, const float *lse, dp_pref out,
                                 const dp_sdpa_desc *d)
{
    const dp_cudnn_module *m = NULL;
    DP_TRY(ready(dev, c, &m));
    size_t n = (size_t)(d->B * d->T * d->NH * d->hs);
    /* do16 for a float32 dout, dqkv16 for a float32 dqkv and o16 for a
     * float32 out (a piece not needed takes no scratch) */
    size_t elems[3] = {dout.bf16 ? 0 : n, dqkv.bf16 ? 0 : 3 * n, out.bf16 ? 0 : n};
    uint16_t *p[3] = {NULL, NULL, NULL};
    void *ws = NULL;
    DP_TRY(scratch(dev, c, m, d, 1, elems, 3, p, &ws));
    const uint16_t *o16 = out.bf16 ? (const uint16_t *)out.p : p[2];
    uint16_t *dqkv16 = dqkv.bf16 ? (uint16_t *)dqkv.p : p[1];
    const uint16_t *do16 = dout.bf16 ? (const uint16_t *)dout.p : p[0];
    if (!out.bf16)
        CU_TRY(dev, dp_cuda_launch_cast_f32_bf16(c->stream, p[2], (const float *)out.p, n));
    if (!dout.bf16)
        CU_TRY(dev, dp_cuda_launch_cast_f32_bf16(c->stream, p[0], (const float *)dout.p, n));
    char err[512] = "";
    int r = m->backward(c->sdpa, d, qkv, o16, do16, lse, dqkv16, ws, err, sizeof err);
    if (r != DP_SDPA_DONE) return failed(dev, r, err);
    if (!dqkv.bf16)
        CU_TRY(dev, dp_cuda_launch_cast_bf16_f32(c->stream, (float *)dqkv.p, dqkv16, 3 * n));
    return DP_OK;
}

dp_status dp_cuda_attention_lib_backward(dp_device *dev, dp_pout dqkv, dp_pref dout,
                                         const uint16_t *qkv, const float *lse, dp_pref out,
                                         size_t B, size_t T, size_t NH, size_t hs, float scale,
                                         int *done)
{
    *done = 0;
    if (!CTX(dev)->cudnn || T == 1) return DP_OK; /* T = 1: see the file comment */
    ENTER(dev);
    cuda_ctx *c = CTX(dev);
    dp_sdpa_desc d = desc_of(B, T, NH, hs, scale);
    pthread_mutex_lock(&c->mu);
    dp_status s = backward_locked(dev, c, dqkv, dout, qkv, lse, out, &d);
    pthread_mutex_unlock(&c->mu);
    *done = s == DP_OK;
    return s;
}

void dp_cuda_sdpa_close(cuda_ctx *c)
{
    if (c->sdpa) c->sdpa_mod->close(c->sdpa);
    c->sdpa = NULL;
}
