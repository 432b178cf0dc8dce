/*
 * test_cuda_rows_emu.cpp - the CUDA backend's block-per-row cross-entropy
 * (float32 and bfloat16 logits) and ignored-row kernels
 * (backend/cuda/cuda_rows.cuh), compiled by the host's C++ compiler
 * against tests/cuda_emu.hpp and run on the CPU, against the CPU
 * backend's items (kernels/crossentropy.h, kernels/ignored.h): the GPU
 * code's logic (block trees, grid-stride rows, in place, ignored and
 * masked rows, the 1024-thread long rows) is tested where no GPU is.
 * The LayerNorm (float32 and bfloat16 outputs, the residual's update
 * first; the input gradient from a float32 or bfloat16 dout) and causal softmax (bfloat16 copies of the probabilities and of
 * the score gradients) kernels are held to their CPU items the same way.
 * The bounds are test_cuda_ops.c's for the same kernels on a GPU: float
 * losses rtol 1e-6 (the block tree and the CPU's 8 interleaved double
 * sums differ only in double rounding; exp is the host's expf here
 * against dp_expf, 2 ulp), bfloat16 losses the float sums' bound that
 * cuda_rows.cuh derives, float dlogits rtol 1e-5 with atol 1e-6 dscale,
 * and bfloat16 dlogits within one bfloat16 step of the CPU's (the float
 * values before the one rounding differ in their last bits).
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <vector>

#include "cuda_emu.hpp"

/* GCC, inlining the CPU items into this file's loops over std::vector
 * data, proves iteration counts past the vectors' max_size "undefined"
 * and warns; the counts here are the rows' lengths. */
#pragma GCC diagnostic ignored "-Waggressive-loop-optimizations"

#include "backend/cuda/cuda_rows.cuh"

namespace {

uint32_t next(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

struct ce_problem {
    size_t N, V;
    float dscale;
    std::vector<float> logits;
    std::vector<uint16_t> logits16; /* logits rounded; logits holds their widening */
    std::vector<int32_t> targets;
};

/* Logits in [-4, 4), a -1 target every fifth row, the first half of every
 * third row masked (-inf) but its target: a thread's first elements are
 * then all -inf. The float logits are bfloat16 values, so both kernels
 * see the same numbers. */
ce_problem make(size_t N, size_t V, uint32_t seed)
{
    ce_problem p;
    p.N = N, p.V = V, p.dscale = 1.0f / (float)N;
    p.logits.resize(N * V);
    p.logits16.resize(N * V);
    p.targets.resize(N);
    for (size_t i = 0; i < N; i++)
        p.targets[i] = i % 5 == 2 ? -1 : (int32_t)(next(&seed) % V);
    for (size_t i = 0; i < N * V; i++) {
        float x = (float)next(&seed) / 16777216.0f * 8.0f - 4.0f;
        size_t r = i / V, v = i % V;
        if (r % 3 == 1 && v < V / 2 && (int32_t)v != p.targets[r]) x = -INFINITY;
        p.logits16[i] = dp_bf16_round(x);
        p.logits[i] = dp_bf16_widen(p.logits16[i]);
    }
    return p;
}

/* The float kernel's launch: CE_THREADS threads a row from CE_LONG_ROW
 * on, as cuda_rows.cu's launcher picks, over `grid` blocks (fewer than
 * the rows: the grid-stride loop). */
void run_ce(const ce_problem &p, unsigned grid, float *losses, float *dlogits,
            const float *logits)
{
    if (p.V >= CE_LONG_ROW)
        emu_launch(grid, CE_THREADS, 0, k_crossentropy_block<CE_THREADS>, losses, dlogits, logits,
                   (const int32_t *)p.targets.data(), p.V, p.dscale, p.N);
    else
        emu_launch(grid, BLOCK_THREADS, 0, k_crossentropy_block<BLOCK_THREADS>, losses, dlogits,
                   logits, (const int32_t *)p.targets.data(), p.V, p.dscale, p.N);
}

/* The bfloat16 kernel's: CE_THREADS from CE16_LONG_ROW on. */
void run_ce16(const ce_problem &p, unsigned grid, float *losses, uint16_t *dlogits,
              const uint16_t *logits)
{
    if (p.V >= CE16_LONG_ROW)
        emu_launch(grid, CE_THREADS, 0, k_crossentropy_bf16_block<CE_THREADS>, losses, dlogits,
                   logits, (const int32_t *)p.targets.data(), p.V, p.dscale, p.N);
    else
        emu_launch(grid, BLOCK_THREADS, 0, k_crossentropy_bf16_block<BLOCK_THREADS>, losses,
                   dlogits, logits, (const int32_t *)p.targets.data(), p.V, p.dscale, p.N);
}

void check_losses(const char *what, const std::vector<float> &gpu, const std::vector<float> &cpu)
{
    for (size_t r = 0; r < gpu.size(); r++)
        cr_assert(fabsf(gpu[r] - cpu[r]) <= 1e-6f * fabsf(cpu[r]) + 1e-9f,
                  "%s row %zu: loss %.9g, CPU %.9g", what, r, (double)gpu[r], (double)cpu[r]);
}

/* The bfloat16 kernel's loss against the CPU item's: (16 + 6G) float
 * roundings of S, G the groups a thread takes (cuda_rows.cuh derives it),
 * and each side's rounding of the loss to float. */
void check_losses16(const std::vector<float> &gpu, const std::vector<float> &cpu, size_t V)
{
    const size_t threads = V >= CE16_LONG_ROW ? CE_THREADS : BLOCK_THREADS;
    const size_t groups = (V + CE16_GROUP - 1) / CE16_GROUP, G = (groups + threads - 1) / threads;
    const double eps = ldexp(1.0, -24);
    for (size_t r = 0; r < gpu.size(); r++) {
        double bound = (16.0 + 6.0 * (double)G) * eps + 2.0 * eps * fabs((double)cpu[r]);
        cr_assert(fabs((double)gpu[r] - (double)cpu[r]) <= bound,
                  "bfloat16 row %zu: loss %.9g, CPU %.9g (bound %.3g)", r, (double)gpu[r],
                  (double)cpu[r], bound);
    }
}

void case_ce(size_t N, size_t V, unsigned grid, uint32_t seed)
{
    ce_problem p = make(N, V, seed);
    /* float32: separate, in place, loss only */
    std::vector<float> loss(N), loss_cpu(N), dl(N * V), dl_cpu(N * V), inpl = p.logits;
    std::vector<float> loss_in(N), loss_only(N);
    for (size_t r = 0; r < N; r++)
        dp_crossentropy_item(loss_cpu.data(), dl_cpu.data(), p.logits.data(), p.targets.data(), V,
                             p.dscale, r);
    run_ce(p, grid, loss.data(), dl.data(), p.logits.data());
    run_ce(p, grid, loss_in.data(), inpl.data(), inpl.data());
    run_ce(p, grid, loss_only.data(), (float *)NULL, p.logits.data());
    check_losses("float32", loss, loss_cpu);
    cr_assert(loss_in == loss && loss_only == loss, "float32: in place or loss only differs");
    cr_assert(memcmp(inpl.data(), dl.data(), N * V * sizeof(float)) == 0,
              "float32: dlogits in place differ from separate");
    for (size_t i = 0; i < N * V; i++) {
        float d = dl[i], c = dl_cpu[i];
        cr_assert(fabsf(d - c) <= 1e-6f * p.dscale + 1e-5f * fabsf(c),
                  "float32 dlogits (%zu,%zu): %.9g, CPU %.9g", i / V, i % V, (double)d,
                  (double)c);
        if (p.targets[i / V] < 0 || p.logits[i] == -INFINITY) cr_assert(d == 0.0f);
    }
}

/* The bfloat16 kernel: in place (as the engine calls it), separate and
 * loss only give the same bits; so do the logits at an address 2 bytes
 * past a 16-byte boundary (one element at a time instead of 16-byte
 * loads); against the CPU item, the loss within check_losses16's bound
 * and each dlogits within one bfloat16 step (the float values before the
 * one rounding differ in their last bits; p << 1 here, so p - 1 does not
 * cancel); ignored rows and masked entries exactly 0. */
void case_ce16(size_t N, size_t V, unsigned grid, uint32_t seed)
{
    ce_problem p = make(N, V, seed);
    std::vector<float> loss(N), loss_cpu(N), loss_sep(N), loss_only(N), loss_odd(N);
    std::vector<uint16_t> x16 = p.logits16, x16_cpu = p.logits16, sep(N * V);
    for (size_t r = 0; r < N; r++)
        dp_crossentropy_bf16_item(loss_cpu.data(), x16_cpu.data(), x16_cpu.data(),
                                  p.targets.data(), V, p.dscale, r);
    run_ce16(p, grid, loss.data(), x16.data(), x16.data());
    run_ce16(p, grid, loss_sep.data(), sep.data(), p.logits16.data());
    run_ce16(p, grid, loss_only.data(), (uint16_t *)NULL, p.logits16.data());
    /* 16-byte aligned storage, the row one element in */
    std::vector<uint4> raw((N * V + 1) * sizeof(uint16_t) / sizeof(uint4) + 1);
    uint16_t *odd = (uint16_t *)raw.data() + 1;
    memcpy(odd, p.logits16.data(), N * V * sizeof(uint16_t));
    run_ce16(p, grid, loss_odd.data(), odd, odd);
    check_losses16(loss, loss_cpu, V);
    cr_assert(loss_sep == loss && loss_only == loss && loss_odd == loss,
              "bfloat16: separate, loss only or unaligned losses differ from in place");
    cr_assert(memcmp(sep.data(), x16.data(), N * V * sizeof(uint16_t)) == 0 &&
                  memcmp(odd, x16.data(), N * V * sizeof(uint16_t)) == 0,
              "bfloat16: separate or unaligned dlogits differ from in place");
    for (size_t i = 0; i < N * V; i++) {
        float d = dp_bf16_widen(x16[i]), c = dp_bf16_widen(x16_cpu[i]);
        cr_assert(fabsf(d - c) <= ldexpf(fabsf(c), -7) + 1e-6f * p.dscale,
                  "bfloat16 dlogits (%zu,%zu): %.9g, CPU %.9g", i / V, i % V, (double)d,
                  (double)c);
        if (p.targets[i / V] < 0 || p.logits[i] == -INFINITY)
            cr_assert(x16[i] == 0, "bfloat16 dlogits (%zu,%zu) of an ignored row or a masked "
                      "entry: 0x%04x", i / V, i % V, x16[i]);
    }
}

} // namespace

/* 256 threads a row, 7 rows over 3 blocks. */
Test(cuda_rows_emu, crossentropy_short_rows) { case_ce(7, 1000, 3, 1u); }

/* A row shorter than the block: most threads hold nothing. */
Test(cuda_rows_emu, crossentropy_tiny_rows) { case_ce(5, 13, 5, 2u); }

/* CE_THREADS (1024) a row from CE_LONG_ROW on, 3 rows over 2 blocks. */
Test(cuda_rows_emu, crossentropy_long_rows, .timeout = 400) { case_ce(3, 4099, 2, 3u); }

/* bfloat16: 256 threads a row, whole groups (V = 1000) and a short last
 * group with every other row unaligned (V = 4099: G = 3 groups a thread);
 * a row shorter than a group. */
Test(cuda_rows_emu, crossentropy_bf16_rows, .timeout = 400)
{
    case_ce16(7, 1000, 3, 1u);
    case_ce16(5, 4099, 2, 4u);
    case_ce16(5, 5, 5, 2u);
}

/* bfloat16: CE_THREADS a row from CE16_LONG_ROW on (V = 20001: G = 3,
 * the last group short), 3 rows over 2 blocks. */
Test(cuda_rows_emu, crossentropy_bf16_long_rows, .timeout = 400) { case_ce16(3, 20001, 2, 5u); }

/* The ignored rows zeroed, the others untouched, float32 and bfloat16,
 * class ids and float targets (NaN ignored), several per row. */
Test(cuda_rows_emu, zero_ignored_rows)
{
    const size_t N = 9, C = 300, per = 3;
    std::vector<int32_t> tc(N * per);
    std::vector<float> tf(N * per);
    for (size_t i = 0; i < N * per; i++) {
        bool ignored = (i / per) % 3 == 0 || i % 4 == 1;
        tc[i] = ignored ? -1 : (int32_t)i;
        tf[i] = ignored ? NAN : (float)i;
    }
    for (int f32 = 0; f32 < 2; f32++) {
        const void *t = f32 ? (const void *)tf.data() : (const void *)tc.data();
        std::vector<float> x(N * C), xc;
        std::vector<uint16_t> h(N * C), hc;
        for (size_t i = 0; i < N * C; i++) x[i] = 1.0f + (float)i, h[i] = dp_bf16_round(x[i]);
        xc = x, hc = h;
        for (size_t r = 0; r < N; r++) {
            dp_zero_ignored_rows_item(xc.data(), t, f32, per, C, r);
            dp_zero_ignored_rows_bf16_item(hc.data(), t, f32, per, C, r);
        }
        emu_launch(4, BLOCK_THREADS, 0, k_zero_ignored_rows_block<float>, x.data(), t, f32, per,
                   C, N);
        emu_launch(4, BLOCK_THREADS, 0, k_zero_ignored_rows_block<uint16_t>, h.data(), t, f32,
                   per, C, N);
        cr_assert(x == xc, "float32 rows differ from the CPU's (f32 targets %d)", f32);
        cr_assert(h == hc, "bfloat16 rows differ from the CPU's (f32 targets %d)", f32);
        size_t zeroed = 0;
        for (size_t r = 0; r < N; r++) zeroed += xc[r * C] == 0.0f;
        cr_assert_eq(zeroed, 3u, "rows 0, 3 and 6 have only ignored targets");
    }
}

namespace {

float uniform(uint32_t *s) { return (float)next(s) / 16777216.0f * 2.0f - 1.0f; }

/* |a - b| <= atol + rtol |b| over n floats, naming the first miss. */
void close(const char *what, const float *a, const float *b, size_t n, float atol, float rtol)
{
    for (size_t i = 0; i < n; i++)
        cr_assert(fabsf(a[i] - b[i]) <= atol + rtol * fabsf(b[i]), "%s[%zu]: %.9g, CPU %.9g",
                  what, i, (double)a[i], (double)b[i]);
}

/* bfloat16 bits within one step of each other (the float values before
 * the rounding differ in their last bits). */
void close16(const char *what, const uint16_t *a, const uint16_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float x = dp_bf16_widen(a[i]), y = dp_bf16_widen(b[i]);
        cr_assert(fabsf(x - y) <= ldexpf(fabsf(y), -7) + 1e-30f, "%s[%zu]: %.9g, CPU %.9g",
                  what, i, (double)x, (double)y);
    }
}

/* k_layernorm_forward_warp for rows of kv elements a block thread (1 to
 * LN_VALS), as the launcher runs it (4 warps a block) over 2 blocks: rows
 * 0-3 and 4-7, then 8 on (the row loop). */
template <typename To>
void run_ln_warp(size_t kv, To *out, float *m, float *r, const float *x, dp_pref w, dp_pref b,
                 size_t C, float eps, size_t N, float *xw, const float *add)
{
    launch_by_vals(
        kv,
        [&](auto v) {
            emu_launch(2, 128, 0, k_layernorm_forward_warp<decltype(v)::value, To>, out, m, r, x,
                       w, b, C, eps, N, xw, add);
        },
        [] { cr_assert_fail("no warp kernel for these rows"); });
}

/* The same for k_layernorm_backward_inp_warp. */
void run_ln_bwd_warp(size_t kv, float *dinp, dp_pref g, const float *x, dp_pref w,
                     const float *m, const float *r, size_t C, size_t N)
{
    launch_by_vals(
        kv,
        [&](auto v) {
            emu_launch(2, 128, 0, k_layernorm_backward_inp_warp<decltype(v)::value>, dinp, g, x,
                       w, m, r, C, N);
        },
        [] { cr_assert_fail("no warp kernel for these rows"); });
}

} // namespace

/* LayerNorm: the block's two-pass mean and variance against the CPU's (C
 * terms summed in another order: C 2^-24 relative, 1e-5 here); the
 * bfloat16 output within a step of the CPU's; with the residual's update
 * first, the stream's new values bit for bit (one addition each). The
 * warp per row (the launcher's kernel for rows of up to LN_VALS *
 * BLOCK_THREADS) gives the block kernel's bits, every output: rows of 13
 * to 1024 elements (1 to 4 elements a block thread, the last partial). */
Test(cuda_rows_emu, layernorm_outputs_and_residual, .timeout = 400)
{
    for (size_t C : {(size_t)13, (size_t)300, (size_t)768, (size_t)1024}) {
        const size_t N = 11, kv = (C + BLOCK_THREADS - 1) / BLOCK_THREADS;
        uint32_t seed = 11u + (uint32_t)C;
        std::vector<float> x(N * C), add(N * C), w(C), b(C);
        for (float &v : x) v = 3.0f * uniform(&seed) + 0.5f;
        for (float &v : add) v = uniform(&seed);
        for (float &v : w) v = 1.0f + 0.2f * uniform(&seed);
        for (float &v : b) v = 0.1f * uniform(&seed);
        dp_pref pw = dp_pref_f32(w.data()), pb = dp_pref_f32(b.data());
        const float eps = 1e-5f;
        for (int residual = 0; residual < 2; residual++)
            for (int bf16 = 0; bf16 < 2; bf16++) {
                std::vector<float> out(N * C), oc(N * C), ow(N * C), m(N), mc(N), mw(N), r(N),
                    rc(N), rw(N);
                std::vector<uint16_t> o16(N * C), o16c(N * C), o16w(N * C);
                std::vector<float> xg = x, xc = x, xwp = x;
                for (size_t row = 0; row < N; row++) {
                    if (residual)
                        dp_residual_layernorm_item(oc.data(), bf16 ? o16c.data() : NULL,
                                                   mc.data(), rc.data(), xc.data(), add.data(),
                                                   pw, pb, C, eps, row);
                    else if (bf16)
                        dp_layernorm_forward_bf16_out_item(o16c.data(), mc.data(), rc.data(),
                                                           xc.data(), pw, pb, C, eps, row);
                    else
                        dp_layernorm_forward_item(oc.data(), mc.data(), rc.data(), xc.data(), pw,
                                                  pb, C, eps, row);
                }
                float *xb = residual ? xg.data() : (float *)NULL;
                float *xw = residual ? xwp.data() : (float *)NULL;
                const float *ad = residual ? add.data() : (const float *)NULL;
                if (bf16) {
                    emu_launch(4, BLOCK_THREADS, 0, k_layernorm_forward_block<uint16_t>,
                               o16.data(), m.data(), r.data(), (const float *)xg.data(), pw, pb,
                               C, eps, N, xb, ad);
                    run_ln_warp(kv, o16w.data(), mw.data(), rw.data(), xwp.data(), pw, pb, C,
                                eps, N, xw, ad);
                } else {
                    emu_launch(4, BLOCK_THREADS, 0, k_layernorm_forward_block<float>, out.data(),
                               m.data(), r.data(), (const float *)xg.data(), pw, pb, C, eps, N,
                               xb, ad);
                    run_ln_warp(kv, ow.data(), mw.data(), rw.data(), xwp.data(), pw, pb, C, eps,
                                N, xw, ad);
                }
                char what[64];
                snprintf(what, sizeof what, "C %zu residual %d bf16 %d", C, residual, bf16);
                cr_assert(xg == xc, "%s: the stream's update differs", what);
                close(what, m.data(), mc.data(), N, 1e-6f, 1e-5f);
                close(what, r.data(), rc.data(), N, 0.0f, 1e-5f);
                if (bf16)
                    close16(what, o16.data(), o16c.data(), N * C);
                else
                    close(what, out.data(), oc.data(), N * C, 1e-5f, 1e-5f);
                cr_assert(xwp == xg && mw == m && rw == r && ow == out && o16w == o16,
                          "%s: the warp per row differs from the block's bits", what);
            }
    }
}

/* The LayerNorm's input gradient: the block kernel against the CPU's
 * item (two row means summed in another order: 1e-5 relative), for rows
 * of 13 to 1024 elements and a longer one (C = 1500: the block kernel
 * alone); the warp per row gives the block's bits; from a bfloat16 dout,
 * the kernel's own bits from the float32 dout of its widened values, and
 * dinp added to, not overwritten. */
Test(cuda_rows_emu, layernorm_backward_from_float32_and_bfloat16_dout, .timeout = 400)
{
    for (size_t C : {(size_t)13, (size_t)300, (size_t)768, (size_t)1024, (size_t)1500}) {
        const size_t N = 11, kv = (C + BLOCK_THREADS - 1) / BLOCK_THREADS;
        uint32_t seed = 13u + (uint32_t)C;
        std::vector<float> x(N * C), g(N * C), w(C), d0(N * C), m(N), r(N);
        std::vector<uint16_t> g16(N * C);
        for (float &v : x) v = 2.0f * uniform(&seed) + 0.25f;
        for (size_t i = 0; i < N * C; i++) {
            g16[i] = dp_bf16_round(uniform(&seed));
            g[i] = dp_bf16_widen(g16[i]);
        }
        for (float &v : w) v = 1.0f + 0.2f * uniform(&seed);
        for (float &v : d0) v = uniform(&seed);
        for (size_t row = 0; row < N; row++) {
            float sum = 0.0f, ss = 0.0f;
            for (size_t c = 0; c < C; c++) sum += x[row * C + c];
            m[row] = sum / (float)C;
            for (size_t c = 0; c < C; c++) ss += (x[row * C + c] - m[row]) * (x[row * C + c] - m[row]);
            r[row] = 1.0f / sqrtf(ss / (float)C + 1e-5f);
        }
        dp_pref pw = dp_pref_f32(w.data());
        std::vector<float> want = d0, got32 = d0, got16 = d0;
        for (size_t row = 0; row < N; row++)
            dp_layernorm_backward_inp_item(want.data(), dp_pref_f32(g.data()), x.data(), pw,
                                           m.data(), r.data(), C, row);
        emu_launch(3, BLOCK_THREADS, 0, k_layernorm_backward_inp_block, got32.data(),
                   dp_pref_f32(g.data()), (const float *)x.data(), pw, (const float *)m.data(),
                   (const float *)r.data(), C, N);
        emu_launch(3, BLOCK_THREADS, 0, k_layernorm_backward_inp_block, got16.data(),
                   dp_pref_bf16(g16.data()), (const float *)x.data(), pw,
                   (const float *)m.data(), (const float *)r.data(), C, N);
        char what[64];
        snprintf(what, sizeof what, "layernorm backward C %zu", C);
        close(what, got32.data(), want.data(), N * C, 1e-5f, 1e-5f);
        cr_assert(got16 == got32, "%s: from bfloat16 dout, other bits", what);
        if (kv <= LN_VALS) {
            std::vector<float> warp32 = d0, warp16 = d0;
            run_ln_bwd_warp(kv, warp32.data(), dp_pref_f32(g.data()), x.data(), pw, m.data(),
                            r.data(), C, N);
            run_ln_bwd_warp(kv, warp16.data(), dp_pref_bf16(g16.data()), x.data(), pw, m.data(),
                            r.data(), C, N);
            cr_assert(warp32 == got32 && warp16 == got16,
                      "%s: the warp per row differs from the block's bits", what);
        }
        std::vector<float> cpu16 = d0;
        for (size_t row = 0; row < N; row++)
            dp_layernorm_backward_inp_item(cpu16.data(), dp_pref_bf16(g16.data()), x.data(), pw,
                                           m.data(), r.data(), C, row);
        cr_assert(cpu16 == want, "%s: the CPU item from bfloat16 dout, other bits", what);
    }
}

/* Causal softmax forward and backward over two blocks of nq = 3 queries
 * starting at q0 = 5 (rows see 6, 7, 8 keys of ld = 10): probabilities
 * against the CPU's (a float sum of up to ld terms in another order),
 * zeros past each row's query, and the bfloat16 copies: each the kernel's
 * own float value rounded, within a step of the CPU's. */
Test(cuda_rows_emu, softmax_causal_with_bfloat16_copies)
{
    const size_t ld = 10, q0 = 5, nq = 3, rows = 6;
    const float scale = 0.7f;
    uint32_t seed = 12u;
    std::vector<float> s0(rows * ld), g0(rows * ld);
    for (float &v : s0) v = 4.0f * uniform(&seed);
    for (float &v : g0) v = uniform(&seed);
    std::vector<float> att = s0, attc = s0;
    std::vector<uint16_t> a16(rows * ld), a16c(rows * ld);
    for (size_t r = 0; r < rows; r++)
        dp_softmax_causal_forward_item(attc.data(), a16c.data(), scale, ld, q0, nq, r);
    emu_launch(4, BLOCK_THREADS, 0, k_softmax_causal_forward_block, att.data(), a16.data(),
               scale, ld, q0, nq, rows);
    close("softmax", att.data(), attc.data(), rows * ld, 1e-7f, 1e-5f);
    close16("softmax bf16", a16.data(), a16c.data(), rows * ld);
    for (size_t i = 0; i < rows * ld; i++) {
        cr_assert(a16[i] == dp_bf16_round(att[i]), "att16[%zu] is not att rounded", i);
        if (i % ld > q0 + (i / ld) % nq) cr_assert(att[i] == 0.0f, "att[%zu] past its query", i);
    }
    /* backward from the CPU's probabilities, float32 in place and bfloat16 */
    std::vector<float> d = g0, dc = g0, d2 = g0, d2c = g0;
    std::vector<uint16_t> s16(rows * ld), s16c(rows * ld);
    for (size_t r = 0; r < rows; r++) {
        dp_softmax_causal_backward_item(dc.data(), NULL, attc.data(), scale, ld, q0, nq, r);
        dp_softmax_causal_backward_item(d2c.data(), s16c.data(), attc.data(), scale, ld, q0, nq,
                                        r);
    }
    emu_launch(4, BLOCK_THREADS, 0, k_softmax_causal_backward_block, d.data(), (uint16_t *)NULL,
               (const float *)attc.data(), scale, ld, q0, nq, rows);
    emu_launch(4, BLOCK_THREADS, 0, k_softmax_causal_backward_block, d2.data(), s16.data(),
               (const float *)attc.data(), scale, ld, q0, nq, rows);
    close("softmax backward", d.data(), dc.data(), rows * ld, 1e-6f, 1e-5f);
    close16("softmax backward bf16", s16.data(), s16c.data(), rows * ld);
    for (size_t i = 0; i < rows * ld; i++)
        cr_assert(s16[i] == dp_bf16_round(d[i]), "ds16[%zu] is not the float gradient rounded", i);
    cr_assert(d2 == g0, "with ds16 the float gradient must stay untouched");
}
