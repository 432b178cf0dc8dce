/*
 * backend/cuda/cuda_sdpa.c - the fused causal attention through cuDNN
 * (dp_backend_ops.attention_lib_forward / _backward; the module:
 * cudnn_sdpa.h), for bfloat16 q, k, v.
 *
 * Which attention runs is DP_CUDA_CUDNN's, read as the device opens
 * (cuda_internal.h's CUDA_CUDNN_*):
 * - unset (the default): cuDNN's where it can run. A machine without the
 *   module or libcudnn.so.9 runs dp's own kernels (cuda_flash.cu) from
 *   then on, and a shape cuDNN declines, or whose workspace would pass
 *   the device's memory limit, runs them for that shape. Only
 *   the first DP_CUDA_SDPA_AUTO_SHAPES shapes are given to cuDNN, as
 *   each costs a plan built on first use: training reuses a few, but
 *   sampling, whose context grows a token at a time, would build one per
 *   length; later shapes run dp's kernels. Which shapes those are follows
 *   the calls' order, so a run repeats its bits.
 * - 1: cuDNN's, and a shape cuDNN declines, or a machine without the
 *   module or libcudnn.so.9, fails the call with the reason instead of
 *   falling back, so a run that asked for cuDNN's attention got it.
 * - 0: dp's own kernels.
 * One exception to each: a single token (T = 1), whose attention is v
 * itself and whose backward cuDNN's frontend refuses (s_q = s_kv = 1),
 * runs dp's kernels. A backward may run other kernels than its forward:
 * both keep kernels/flash.h's lse and the same out.
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
 * why not. In CUDA_CUDNN_AUTO the caller falls back instead. */
static dp_status ready(dp_device *dev, cuda_ctx *c, const dp_cudnn_module **m)
{
    if (c->sdpa) {
        *m = c->sdpa_mod;
        return DP_OK;
    }
    const void *table = NULL;
    if (dp_module_load(DP_MODULE_CUDNN, &table) != DP_OK) {
        dp_error_prefix("%s: DP_CUDA_CUDNN=1 asks for cuDNN's attention (set it to 0 to use "
                        "dp's own kernels)",
                        dev->name);
        return DP_ERR_UNSUPPORTED;
    }
    *m = c->sdpa_mod = table;
    char err[512] = "";
    int r = (*m)->open(&c->sdpa, (void *)c->stream, err, sizeof err);
    if (r != DP_SDPA_DONE)
        return DP_FAIL(r == DP_SDPA_DECLINED ? DP_ERR_UNSUPPORTED : DP_ERR_DEVICE,
                       "%s: cuDNN's attention could not start (%s); set DP_CUDA_CUDNN=0 to use "
                       "dp's own attention kernels",
                       dev->name, err);
    return DP_OK;
}

/* The status of a module call that did not return DP_SDPA_DONE. */
static dp_status failed(dp_device *dev, int r, const char *err)
{
    if (r == DP_SDPA_DECLINED)
        return DP_FAIL(DP_ERR_UNSUPPORTED,
                       "%s: DP_CUDA_CUDNN=1, but cuDNN does not take this attention (%s); set "
                       "DP_CUDA_CUDNN=0 to use dp's own attention kernels",
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

/* In CUDA_CUDNN_AUTO, whether a call of this shape and direction goes to
 * cuDNN: a shape already given to it as it went then, a new one while
 * fewer than DP_CUDA_SDPA_AUTO_SHAPES are kept (*slot: its entry, whose
 * way the caller sets from the outcome), else not. Under c->mu. */
static int auto_admits(cuda_ctx *c, const dp_sdpa_desc *d, int backward,
                       struct cuda_sdpa_shape **slot)
{
    *slot = NULL;
    struct cuda_sdpa_shape *e = NULL;
    for (int i = 0; i < c->sdpa_n_shapes && !e; i++) {
        struct cuda_sdpa_shape *s = &c->sdpa_shapes[i];
        if (s->B == (size_t)d->B && s->T == (size_t)d->T && s->NH == (size_t)d->NH &&
            s->hs == (size_t)d->hs)
            e = s;
    }
    if (!e) {
        if (c->sdpa_n_shapes == DP_CUDA_SDPA_AUTO_SHAPES) return 0;
        e = &c->sdpa_shapes[c->sdpa_n_shapes++];
        *e = (struct cuda_sdpa_shape){(size_t)d->B, (size_t)d->T, (size_t)d->NH, (size_t)d->hs,
                                      {0, 0}};
    }
    if (e->way[backward]) return e->way[backward] > 0;
    *slot = e;
    return 1;
}

/* A call's way to cuDNN, decided under c->mu as DP_CUDA_CUDNN says: go,
 * and in CUDA_CUDNN_AUTO the shape's entry (NULL when already settled)
 * and whether the module had started. */
typedef struct admission {
    int go, started;
    struct cuda_sdpa_shape *slot;
} admission;

static admission admit(cuda_ctx *c, const dp_sdpa_desc *d, int backward)
{
    admission a = {0, c->sdpa != NULL, NULL};
    a.go = c->cudnn == CUDA_CUDNN_REQUIRED ||
           (!c->sdpa_absent && auto_admits(c, d, backward, &a.slot));
    return a;
}

/* The status of an admitted call that returned s, under c->mu; *done
 * when cuDNN ran it. In CUDA_CUDNN_AUTO a module, cuDNN or shape that is
 * not there (DP_ERR_UNSUPPORTED; with the module, also its start
 * failing), or a shape whose scratch and workspace would not fit
 * (DP_ERR_OUT_OF_MEMORY: dp's kernels need neither), is remembered and
 * declined, so the default never fails where dp's kernels run; everything
 * else is the error it is. */
static dp_status settle(cuda_ctx *c, const admission *a, int backward, dp_status s, int *done)
{
    int absent = s != DP_OK && !a->started && !c->sdpa; /* no module, cuDNN or start */
    if (c->cudnn == CUDA_CUDNN_AUTO &&
        (s == DP_ERR_UNSUPPORTED || s == DP_ERR_OUT_OF_MEMORY || absent)) {
        if (absent) c->sdpa_absent = 1; /* not again */
        if (a->slot) a->slot->way[backward] = -1;
        dp_clear_error();
        return DP_OK;
    }
    if (a->slot && s == DP_OK) a->slot->way[backward] = 1;
    *done = s == DP_OK;
    return s;
}

dp_status dp_cuda_attention_lib_forward(dp_device *dev, dp_pout out, float *lse,
                                        const uint16_t *qkv, size_t B, size_t T, size_t NH,
                                        size_t hs, float scale, int *done)
{
    *done = 0;
    if (CTX(dev)->cudnn == CUDA_CUDNN_OFF || T == 1) return DP_OK; /* T = 1: the file comment */
    ENTER(dev);
    cuda_ctx *c = CTX(dev);
    dp_sdpa_desc d = desc_of(B, T, NH, hs, scale);
    pthread_mutex_lock(&c->mu);
    admission a = admit(c, &d, 0);
    dp_status s = a.go ? settle(c, &a, 0, forward_locked(dev, c, out, lse, qkv, &d), done) : DP_OK;
    pthread_mutex_unlock(&c->mu);
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
    if (CTX(dev)->cudnn == CUDA_CUDNN_OFF || T == 1) return DP_OK; /* T = 1: the file comment */
    ENTER(dev);
    cuda_ctx *c = CTX(dev);
    dp_sdpa_desc d = desc_of(B, T, NH, hs, scale);
    pthread_mutex_lock(&c->mu);
    admission a = admit(c, &d, 1);
    dp_status s = a.go ? settle(c, &a, 1, backward_locked(dev, c, dqkv, dout, qkv, lse, out, &d),
                                done)
                       : DP_OK;
    pthread_mutex_unlock(&c->mu);
    return s;
}

void dp_cuda_sdpa_close(cuda_ctx *c)
{
    if (c->sdpa) c->sdpa_mod->close(c->sdpa);
    c->sdpa = NULL;
}
