/*
 * backend/gemm_pieces.h - a GEMM whose operands must be converted (rounded
 * to bfloat16 for BF16 math, or widened to float32 for float32 math) cut
 * into pieces whose converted operands fit a bounded scratch.
 *
 * Converting a whole operand costs scratch the size of the operand: for the
 * head's backward that is a chunk of logits. Cut instead: C(m,n) =
 * op(A)(m,k) op(B)(k,n) over groups of the batch, then either blocks of
 * C's rows (rows of op(A)) and columns (columns of op(B)), or blocks of k,
 * whichever moves fewer bytes again: cutting C's columns re-reads op(A)
 * once per extra block, cutting k re-reads and re-writes C (float32) once
 * per extra block. A cut of k runs its first block with the call's beta
 * and the others with beta = 1, adding their products to C; the partial
 * sums stored in C between blocks are float32, as a GEMM's own
 * accumulators are, so only the order of the sums changes, not their
 * precision. Each piece's operand block is converted densely (leading
 * dimension = its rows), which also skips the gaps between a strided
 * operand's columns.
 *
 * The plan depends only on the call's sizes, which operands convert and
 * the cap, so a given call is cut the same way every time (deterministic).
 * Below the cap nothing is cut: one piece, the whole call.
 */
#ifndef DP_BACKEND_GEMM_PIECES_H
#define DP_BACKEND_GEMM_PIECES_H

#include <stddef.h>

#include "backend/backend.h"

/* Default bound on a device's GEMM conversion scratch (bytes): room for a
 * 4096 x 2048 bfloat16 block, large enough that no GEMM of a
 * moderate model is cut, small next to any accelerator or host. */
#define DP_GEMM_CONVERT_CAP ((size_t)16 << 20)

/* Blocks of rows or columns are multiples of this (GEMM-friendly), except
 * the last; no block is smaller, even when the cap would ask for less. */
#define DP_GEMM_PIECE_ALIGN 16

typedef struct dp_gemm_plan {
    int g;          /* matrices of the batch per piece */
    int mb, nb, kb; /* rows and columns of C, and the part of k, per piece */
} dp_gemm_plan;

/* A block of one operand as stored: rows x cols elements from element
 * offset `off` (leading dimension and stride those of the operand),
 * `count` matrices of the batch (1 when the operand's stride is 0: one
 * matrix shared by the batch). */
typedef struct dp_gemm_block {
    size_t off;
    int rows, cols, count;
} dp_gemm_block;

static inline int dp_gemm_align_down(size_t x, int limit)
{
    if (x >= (size_t)limit) return limit;
    int b = (int)(x / DP_GEMM_PIECE_ALIGN * DP_GEMM_PIECE_ALIGN);
    if (b < DP_GEMM_PIECE_ALIGN) b = DP_GEMM_PIECE_ALIGN;
    return b < limit ? b : limit;
}

/* Bytes of a piece's converted blocks: a_conv/b_conv say which operands
 * convert, esize the converted element's bytes; k is the piece's part. */
static inline size_t dp_gemm_piece_bytes(int a_conv, int b_conv, size_t esize, int mb, int nb,
                                         int k, int g)
{
    size_t a = a_conv ? (size_t)mb * (size_t)k * esize : 0;
    size_t b = b_conv ? (size_t)k * (size_t)nb * esize : 0;
    return (size_t)g * (a + b);
}

static inline size_t dp_gemm_blocks(int dim, int block) { return ((size_t)dim + block - 1) / block; }

/* The cut of an (m, n, k, batch) GEMM under `cap` scratch bytes. */
static inline dp_gemm_plan dp_gemm_plan_pieces(int m, int n, int k, int batch, int a_conv,
                                               int b_conv, size_t esize, size_t cap)
{
    dp_gemm_plan p = {batch, m, n, k};
    size_t one = dp_gemm_piece_bytes(a_conv, b_conv, esize, m, n, k, 1);
    if ((size_t)batch * one <= cap || one == 0) return p;
    if (one <= cap) { /* whole matrices, a group of the batch at a time */
        p.g = (int)(cap / one);
        return p;
    }
    p.g = 1;
    /* Rows and columns of C. */
    dp_gemm_plan mn = p;
    size_t row = a_conv ? (size_t)k * esize : 0; /* bytes per row of C (A's block) */
    size_t col = b_conv ? (size_t)k * esize : 0; /* bytes per column of C (B's block) */
    size_t a_all = row * (size_t)m, b_all = col * (size_t)n;
    if (!b_conv) {
        mn.mb = dp_gemm_align_down(cap / row, m);
    } else if (!a_conv) {
        mn.nb = dp_gemm_align_down(cap / col, n);
    } else if (a_all <= cap / 2) { /* A whole, B in blocks */
        mn.nb = dp_gemm_align_down((cap - a_all) / col, n);
    } else if (b_all <= cap / 2) {
        mn.mb = dp_gemm_align_down((cap - b_all) / row, m);
    } else {
        mn.mb = dp_gemm_align_down(cap / 2 / row, m);
        mn.nb = dp_gemm_align_down(cap / 2 / col, n);
    }
    /* Blocks of k: a piece converts kb rows of op(B) and kb columns of op(A). */
    dp_gemm_plan kc = p;
    size_t per_k = ((a_conv ? (size_t)m : 0) + (b_conv ? (size_t)n : 0)) * esize;
    kc.kb = dp_gemm_align_down(cap / per_k, k);
    /* Bytes read (and written) again: op(A) per extra column block, op(B)
     * per extra row block (as converted, a fair guess for both types); C
     * read and written per extra block of k. */
    size_t again_mn = (dp_gemm_blocks(n, mn.nb) - 1) * (size_t)m * (size_t)k * esize +
                      (dp_gemm_blocks(m, mn.mb) - 1) * (size_t)k * (size_t)n * esize;
    size_t again_k = (dp_gemm_blocks(k, kc.kb) - 1) * (size_t)m * (size_t)n * 8;
    /* A cut that keeps within the cap first (C too narrow to cut, or the
     * blocks of 16 too large), then the one that moves less again. */
    size_t bytes_mn = dp_gemm_piece_bytes(a_conv, b_conv, esize, mn.mb, mn.nb, k, 1);
    size_t bytes_k = dp_gemm_piece_bytes(a_conv, b_conv, esize, m, n, kc.kb, 1);
    if (bytes_mn > cap || bytes_k > cap) return bytes_k < bytes_mn ? kc : mn;
    return again_k < again_mn ? kc : mn;
}

/* A plan p for C(m,n) further cut so that no piece's block of a matrix
 * of C passes c_cap bytes of float32, by C's columns only (in multiples of
 * DP_GEMM_PIECE_ALIGN, at least one such block): for a GEMM that adds
 * into C (beta != 0, or k cut), which oneDNN's matmul does through a sum
 * post-op that runs well below its rate on a large C (cpu_gemm.c). Only
 * C's elements are split between pieces, not their sums over k, and the
 * cut depends on the sizes alone. */
static inline dp_gemm_plan dp_gemm_plan_sum_cut(dp_gemm_plan p, size_t c_cap)
{
    size_t col = (size_t)p.mb * sizeof(float);
    if ((size_t)p.nb * col <= c_cap) return p;
    p.nb = dp_gemm_align_down(c_cap / col, p.nb);
    return p;
}

/* One piece of a planned GEMM: matrices [b0, b0 + g) of the batch, k's
 * part [l0, l0 + kb), C's rows [i0, i0 + mb) and columns [j0, j0 + nb).
 * Pieces come in the order batch group, block of k, rows, columns, so
 * op(A)'s block changes only when new_a is set (convert it then) and a
 * block of k is done before the next one adds to C. */
typedef struct dp_gemm_piece {
    int b0, g, l0, kb, i0, mb, j0, nb;
    float beta; /* the call's beta on k's first block; 1 on the others (they add to C) */
    int new_a;
} dp_gemm_piece;

/* Sizes and beta of the piece at pc's starts (the last block of each
 * dimension may be shorter). */
static inline void dp_gemm_piece_fill(dp_gemm_piece *pc, const dp_gemm_plan *p, int m, int n,
                                      int k, int batch, float beta)
{
    pc->g = batch - pc->b0 < p->g ? batch - pc->b0 : p->g;
    pc->kb = k - pc->l0 < p->kb ? k - pc->l0 : p->kb;
    pc->mb = m - pc->i0 < p->mb ? m - pc->i0 : p->mb;
    pc->nb = n - pc->j0 < p->nb ? n - pc->j0 : p->nb;
    pc->beta = pc->l0 == 0 ? beta : 1.0f;
    pc->new_a = pc->j0 == 0;
}

/* The first piece of an (m, n, k, batch) GEMM planned as p. */
static inline dp_gemm_piece dp_gemm_piece_first(const dp_gemm_plan *p, int m, int n, int k,
                                                int batch, float beta)
{
    dp_gemm_piece pc = {0, 0, 0, 0, 0, 0, 0, 0, 0.0f, 0};
    dp_gemm_piece_fill(&pc, p, m, n, k, batch, beta);
    return pc;
}

/* Moves pc to the next piece; 0 when there is none. */
static inline int dp_gemm_piece_next(dp_gemm_piece *pc, const dp_gemm_plan *p, int m, int n,
                                     int k, int batch, float beta)
{
    if ((pc->j0 += p->nb) >= n) {
        pc->j0 = 0;
        if ((pc->i0 += p->mb) >= m) {
            pc->i0 = 0;
            if ((pc->l0 += p->kb) >= k) {
                pc->l0 = 0;
                if ((pc->b0 += p->g) >= batch) return 0;
            }
        }
    }
    dp_gemm_piece_fill(pc, p, m, n, k, batch, beta);
    return 1;
}

/* Elements [at, at + len) of a cut dimension and [k0, k0 + kb) of k, in
 * matrices [b0, b0 + g): the cut dimension is the stored rows (by_rows)
 * or the stored columns. */
static inline dp_gemm_block dp_gemm_block_of(const dp_gemm_arg *a, int by_rows, int b0, int g,
                                             int at, int len, int k0, int kb)
{
    dp_gemm_block b;
    b.count = a->stride == 0 ? 1 : g;
    size_t r0 = (size_t)(by_rows ? at : k0), c0 = (size_t)(by_rows ? k0 : at);
    b.off = (size_t)b0 * (size_t)a->stride + r0 + c0 * (size_t)a->ld;
    b.rows = by_rows ? len : kb;
    b.cols = by_rows ? kb : len;
    return b;
}

/* op(A)'s rows [i0, i0 + mb) and columns [k0, k0 + kb): A's stored rows
 * and columns, swapped when transposed. */
static inline dp_gemm_block dp_gemm_block_a(const dp_gemm_arg *A, dp_op ta, int b0, int g, int i0,
                                            int mb, int k0, int kb)
{
    return dp_gemm_block_of(A, ta == DP_OP_N, b0, g, i0, mb, k0, kb);
}

/* op(B)'s rows [k0, k0 + kb) and columns [j0, j0 + nb). */
static inline dp_gemm_block dp_gemm_block_b(const dp_gemm_arg *B, dp_op tb, int b0, int g, int j0,
                                            int nb, int k0, int kb)
{
    return dp_gemm_block_of(B, tb == DP_OP_T, b0, g, j0, nb, k0, kb);
}

/* The piece's operand: the converted block at dst (dense: ld = rows,
 * stride = rows x cols, or 0 when shared), or the unconverted operand in
 * place from the block's offset (esize: its element's bytes). */
static inline dp_gemm_arg dp_gemm_block_arg(const dp_gemm_arg *a, const dp_gemm_block *b,
                                            const void *dst, int dst_bf16, size_t esize)
{
    dp_gemm_arg r;
    if (dst) {
        r.p = dst;
        r.bf16 = dst_bf16;
        r.ld = b->rows;
        r.stride = b->count == 1 && a->stride == 0 ? 0 : (long long)b->rows * b->cols;
    } else {
        r.p = (const char *)a->p + b->off * esize;
        r.bf16 = a->bf16;
        r.ld = a->ld;
        r.stride = a->stride;
    }
    return r;
}

#endif /* DP_BACKEND_GEMM_PIECES_H */
