/*
 * backend/cpu/cpu_dnnl.c - the oneDNN module (libdp-dnnl, cpu_dnnl.h): the
 * bf16 matmul of CPU devices on oneDNN's matmul primitive.
 *
 * The column-major product C(m,n) = op(A) op(B) is, read row-major, the
 * product C^T(n,m) = op(B)^T(n,k) op(A)^T(k,m): oneDNN's src, weights and
 * dst, described by strides alone, so no operand is copied to transpose
 * it. A primitive is costly to create (tens of microseconds), so each
 * device keeps the last few it built, keyed by the GEMM's shape. A
 * linear layer's bias and a bfloat16 output are the primitive's own (its
 * bias argument and destination type): one pass over C instead of a
 * broadcast before the GEMM and a conversion after it.
 * Debian's libdnnl runs on OpenMP: a call asks it for one thread (a
 * virtual device is one thread) through libgomp's omp_set_num_threads.
 */
#include <stdlib.h>
#include <string.h>

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>

#include "backend/cpu/cpu_dnnl.h"
#include "core/error.h"

/* Primitives kept per device: a GPT step uses about ten GEMM shapes, and
 * a GEMM cut into pieces up to eight more. */
#define MM_CACHE 32

typedef struct mm_entry {
    int used;
    dp_dnnl_key key;
    dnnl_primitive_t prim;
    dnnl_memory_t src, wei, dst, bias, pad; /* handles set per call */
    size_t pad_bytes;                 /* oneDNN's scratchpad */
} mm_entry;

/* A device's oneDNN state. */
typedef struct dnnl_state {
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    mm_entry cache[MM_CACHE];
    unsigned next; /* the entry to replace next (round robin) */
} dnnl_state;

static void mm_entry_clear(mm_entry *en)
{
    if (!en->used) return;
    dnnl_primitive_destroy(en->prim);
    dnnl_memory_destroy(en->src);
    dnnl_memory_destroy(en->wei);
    dnnl_memory_destroy(en->dst);
    if (en->bias) dnnl_memory_destroy(en->bias);
    if (en->pad) dnnl_memory_destroy(en->pad);
    memset(en, 0, sizeof *en);
}
static void *state_create(void)
{
    dnnl_state *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    if (dnnl_engine_create(&c->eng, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&c->stream, c->eng, dnnl_stream_default_flags) != dnnl_success) {
        if (c->eng) dnnl_engine_destroy(c->eng);
        free(c);
        return NULL;
    }
    return c;
}

static void state_destroy(void *st)
{
    dnnl_state *c = st;
    if (!c) return;
    for (int i = 0; i < MM_CACHE; i++) mm_entry_clear(&c->cache[i]);
    if (c->stream) dnnl_stream_destroy(c->stream);
    if (c->eng) dnnl_engine_destroy(c->eng);
    free(c);
}

static dp_status dnnl_fail(const dp_device *dev, dnnl_status_t st, const char *call,
                           const char *func, const char *file, int line)
{
    return dp_error_set(DP_ERR_DEVICE, func, file, line, "%s: oneDNN %.*s failed: %s", dev->name,
                        (int)strcspn(call, "("), call, dnnl_status2str(st));
}

#define DNNL_TRY(dev, call)                                                           \
    do {                                                                              \
        dnnl_status_t dn_s_ = (call);                                                 \
        if (dn_s_ != dnnl_success)                                                    \
            return dnnl_fail((dev), dn_s_, #call, __func__, __FILE__, __LINE__);      \
    } while (0)

/* Strided descriptions of a (batch, rows, cols) view; 2-D for one matrix. */
static dnnl_status_t view_md(dnnl_memory_desc_t *md, int batch, int rows, int cols,
                             long long s_batch, long long s_row, long long s_col,
                             dnnl_data_type_t dt)
{
    if (batch == 1) {
        dnnl_dims_t dims = {rows, cols}, strides = {s_row, s_col};
        return dnnl_memory_desc_init_by_strides(md, 2, dims, dt, strides);
    }
    dnnl_dims_t dims = {batch, rows, cols}, strides = {s_batch, s_row, s_col};
    return dnnl_memory_desc_init_by_strides(md, 3, dims, dt, strides);
}

/* Builds the primitive for key into en; dnnl_unimplemented when this CPU
 * has no bf16 matmul (the caller then emulates). */
static dnnl_status_t mm_build(dnnl_state *c, const dp_dnnl_key *key, mm_entry *en)
{
    dnnl_memory_desc_t src, wei, dst, bias;
    int tb = key->tb, ta = key->ta;
    /* src = op(B)^T (n,k); weights = op(A)^T (k,m); dst = C^T (n,m) */
    dnnl_status_t st = view_md(&src, key->batch, key->n, key->k, key->sb, tb ? 1 : key->ldb,
                               tb ? key->ldb : 1, dnnl_bf16);
    if (st == dnnl_success)
        st = view_md(&wei, key->batch, key->k, key->m, key->sa, ta ? 1 : key->lda,
                     ta ? key->lda : 1, dnnl_bf16);
    if (st == dnnl_success)
        st = view_md(&dst, key->batch, key->n, key->m, key->sc, key->ldc, 1,
                     key->c_bf16 ? dnnl_bf16 : dnnl_f32);
    /* bias(m) on C's columns: one value per column of dst (1, m) */
    if (st == dnnl_success && key->bias)
        st = view_md(&bias, 1, 1, key->m, 0, key->m, 1,
                     key->bias == DP_DNNL_BIAS_BF16 ? dnnl_bf16 : dnnl_f32);
    dnnl_matmul_desc_t md;
    if (st == dnnl_success)
        st = dnnl_matmul_desc_init(&md, &src, &wei, key->bias ? &bias : NULL, &dst);
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    if (st == dnnl_success) st = dnnl_primitive_attr_create(&attr);
    if (st == dnnl_success)
        st = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (st == dnnl_success && key->alpha != 1.0f)
        st = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &key->alpha);
    if (st == dnnl_success && key->beta != 0.0f) {
        st = dnnl_post_ops_create(&po);
        if (st == dnnl_success) st = dnnl_post_ops_append_sum(po, key->beta);
        if (st == dnnl_success) st = dnnl_primitive_attr_set_post_ops(attr, po);
    }
    if (st == dnnl_success) st = dnnl_primitive_desc_create(&pd, &md, attr, c->eng, NULL);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (st != dnnl_success) return st;

    mm_entry e;
    memset(&e, 0, sizeof e);
    const dnnl_memory_desc_t *pad = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    e.pad_bytes = pad ? dnnl_memory_desc_get_size(pad) : 0;
    st = dnnl_primitive_create(&e.prim, pd);
    if (st == dnnl_success) st = dnnl_memory_create(&e.src, &src, c->eng, DNNL_MEMORY_NONE);
    if (st == dnnl_success) st = dnnl_memory_create(&e.wei, &wei, c->eng, DNNL_MEMORY_NONE);
    if (st == dnnl_success) st = dnnl_memory_create(&e.dst, &dst, c->eng, DNNL_MEMORY_NONE);
    if (st == dnnl_success && key->bias)
        st = dnnl_memory_create(&e.bias, &bias, c->eng, DNNL_MEMORY_NONE);
    if (st == dnnl_success && e.pad_bytes)
        st = dnnl_memory_create(&e.pad, pad, c->eng, DNNL_MEMORY_NONE);
    dnnl_primitive_desc_destroy(pd);
    e.used = 1;
    if (st != dnnl_success) {
        mm_entry_clear(&e);
        return st;
    }
    e.key = *key;
    *en = e;
    return dnnl_success;
}

/* The cached primitive for key, built on a miss. */
static dnnl_status_t mm_find(dnnl_state *c, const dp_dnnl_key *key, mm_entry **out)
{
    for (int i = 0; i < MM_CACHE; i++)
        if (c->cache[i].used && memcmp(&c->cache[i].key, key, sizeof *key) == 0) {
            *out = &c->cache[i];
            return dnnl_success;
        }
    mm_entry *en = &c->cache[c->next];
    mm_entry fresh;
    dnnl_status_t st = mm_build(c, key, &fresh);
    if (st != dnnl_success) return st;
    mm_entry_clear(en);
    *en = fresh;
    c->next = (c->next + 1) % MM_CACHE;
    *out = en;
    return dnnl_success;
}

/* Runs one piece on oneDNN: bfloat16 operands, C as key->c_bf16 says,
 * plus bias when key->bias; pad is the primitive's scratchpad. */
static dp_status dnnl_piece(dp_device *dev, dnnl_state *c, const dp_dnnl_key *key,
                            const void *pa, const void *pb, const void *bias, void *C, void *pad)
{
    mm_entry *en = NULL;
    DNNL_TRY(dev, mm_find(c, key, &en));
    DNNL_TRY(dev, dnnl_memory_set_data_handle(en->src, (void *)pb));
    DNNL_TRY(dev, dnnl_memory_set_data_handle(en->wei, (void *)pa));
    DNNL_TRY(dev, dnnl_memory_set_data_handle(en->dst, C));
    if (en->bias) DNNL_TRY(dev, dnnl_memory_set_data_handle(en->bias, (void *)bias));
    if (en->pad) DNNL_TRY(dev, dnnl_memory_set_data_handle(en->pad, pad));
    dnnl_exec_arg_t args[5];
    int nargs = 0;
    args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SRC, en->src};
    args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, en->wei};
    args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_DST, en->dst};
    if (en->bias) args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, en->bias};
    if (en->pad) args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, en->pad};
    /* One OpenMP thread: the device is this thread. The calling thread's
     * own setting comes back after the call. */
    int threads = omp_get_max_threads();
    if (threads != 1) omp_set_num_threads(1);
    dnnl_status_t st = dnnl_primitive_execute(en->prim, c->stream, nargs, args);
    if (st == dnnl_success) st = dnnl_stream_wait(c->stream);
    if (threads != 1) omp_set_num_threads(threads);
    DNNL_TRY(dev, st);
    return DP_OK;
}

static dp_status prepare(dp_device *dev, void *st, const dp_dnnl_key *key, size_t *pad_bytes,
                         int *unimplemented)
{
    mm_entry *en = NULL;
    dnnl_status_t s = mm_find(st, key, &en);
    if (s == dnnl_unimplemented) {
        *unimplemented = 1;
        return DP_OK;
    }
    DNNL_TRY(dev, s);
    if (en->pad_bytes > *pad_bytes) *pad_bytes = en->pad_bytes;
    return DP_OK;
}

static dp_status run(dp_device *dev, void *st, const dp_dnnl_key *key, const void *a,
                     const void *b, const void *bias, void *C, void *pad)
{
    return dnnl_piece(dev, st, key, a, b, bias, C, pad);
}

static const dp_dnnl_module dnnl_module = {
    {DP_MODULE_ABI, "dnnl"}, state_create, state_destroy, prepare, run,
};

DP_API const void *dp_module_dnnl(void) { return &dnnl_module; }
