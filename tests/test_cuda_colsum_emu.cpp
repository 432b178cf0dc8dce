/*
 * test_cuda_colsum_emu.cpp - the CUDA backend's column reductions (bias
 * gradients, rounding dout in the same pass or not; LayerNorm parameter
 * gradients; from a float32 or a bfloat16 dout), both stages in one
 * launch (backend/cuda/cuda_colsum.cuh), compiled by the host's C++
 * compiler against tests/cuda_emu.hpp and run on the CPU, against the
 * CPU backend's loops (kernels/linear.h's dp_bias_backward_cols,
 * kernels/layernorm.h's dp_layernorm_param_cols over DP_COL_TILE tiles):
 * bit for bit, since both add the same terms in the order of
 * kernels/colsum.h and the host compiler contracts no product here. The
 * shapes cover a chunk shorter than one pass, chunks whose last pass is
 * short, several chunks (11: stage 2 loads a batch of 8, then a tail of
 * 3), column counts below, at and past a tile of 32, and grids of fewer
 * blocks than tiles (grid-stride). One set of tickets serves every
 * launch of a test, as the backend's does: each launch must leave them 0
 * (checked), or the next would combine at the wrong block. On a GPU,
 * nvcc's contraction of the LayerNorm's dout * xhat into the sum is the
 * one difference; test_cuda_ops checks those bits against fmaf.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <vector>

#include "cuda_emu.hpp"

#include "backend/cuda/cuda_colsum.cuh"
#include "kernels/linear.h"

namespace {

uint32_t next(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

std::vector<float> uniform(size_t n, float lo, float hi, uint32_t seed)
{
    std::vector<float> v(n);
    for (auto &x : v) x = lo + (hi - lo) * (float)next(&seed) / 16777216.0f;
    return v;
}

std::vector<uint16_t> rounded(const std::vector<float> &v)
{
    std::vector<uint16_t> r(v.size());
    for (size_t i = 0; i < v.size(); i++) r[i] = dp_bf16_round(v[i]);
    return r;
}

void same(const char *what, const float *got, const float *want, size_t n, size_t N, size_t C)
{
    for (size_t i = 0; i < n; i++)
        cr_assert(memcmp(&got[i], &want[i], sizeof(float)) == 0,
                  "N=%zu C=%zu: %s[%zu] = %a, the CPU's %a", N, C, what, i, (double)got[i],
                  (double)want[i]);
}

/* The shapes (N, C); each runs on 2 blocks (several tiles each) and on
 * the launcher's grid (a block per tile). */
struct shape {
    size_t N, C;
};
const shape shapes[] = {{1, 1},   {37, 31}, {64, 32},  {256, 33},
                        {300, 70}, {549, 96}, {777, 5}, {2600, 40}};
const size_t MAX_C = 96; /* the widest of shapes */

/* The tickets of a test's launches (0 between launches). */
std::vector<unsigned> tickets((MAX_C + COL_W - 1) / COL_W, 0);

void tickets_back_to_0(size_t N, size_t C)
{
    for (size_t i = 0; i < tickets.size(); i++)
        cr_assert_eq(tickets[i], 0u, "N=%zu C=%zu: ticket %zu left at %u", N, C, i, tickets[i]);
}

const unsigned small_grid = 2;

unsigned launcher_grid(size_t N, size_t C) { return (unsigned)col_tiles(N, C); }

/* The bias gradient of dout(N,C) (bf16: a bfloat16 dout) into dbias, which
 * starts at db0, through the kernels (grid blocks) or the CPU's loop;
 * with round16, dout (float32) rounded into out16 too. */
void bias_run(std::vector<float> &dbias, std::vector<uint16_t> &out16, bool kernels,
              unsigned grid, const std::vector<float> &dout, const std::vector<uint16_t> &d16,
              bool bf16, bool round16, size_t N, size_t C)
{
    uint16_t *o16 = round16 ? out16.data() : NULL;
    dp_pref d = bf16 ? dp_pref_bf16(d16.data()) : dp_pref_f32(dout.data());
    if (!kernels) {
        for (size_t o0 = 0; o0 < C; o0 += DP_COL_TILE)
            dp_bias_backward_cols(dbias.data(), o16, d, N, C, o0,
                                  C - o0 < DP_COL_TILE ? C : o0 + DP_COL_TILE);
        return;
    }
    std::vector<float> partial(dp_col_chunks(N) * C, NAN);
    if (bf16)
        emu_launch(grid, COL_THREADS, 0, k_bias_backward<1>, dbias.data(), partial.data(),
                   tickets.data(), o16, d.p, N, C);
    else
        emu_launch(grid, COL_THREADS, 0, k_bias_backward<0>, dbias.data(), partial.data(),
                   tickets.data(), o16, d.p, N, C);
    tickets_back_to_0(N, C);
}

void ln_run(std::vector<float> &dw, std::vector<float> &db, bool kernels, unsigned grid,
            const std::vector<float> &dout, const std::vector<uint16_t> &d16, bool bf16,
            const std::vector<float> &inp, const std::vector<float> &mean,
            const std::vector<float> &rstd, size_t N, size_t C)
{
    dp_pref d = bf16 ? dp_pref_bf16(d16.data()) : dp_pref_f32(dout.data());
    if (!kernels) {
        for (size_t c0 = 0; c0 < C; c0 += DP_COL_TILE)
            dp_layernorm_param_cols(dw.data(), db.data(), d, inp.data(), mean.data(),
                                    rstd.data(), N, C, c0,
                                    C - c0 < DP_COL_TILE ? C : c0 + DP_COL_TILE);
        return;
    }
    size_t K = dp_col_chunks(N);
    std::vector<float> pdw(K * C, NAN), pdb(K * C, NAN);
    if (bf16)
        emu_launch(grid, COL_THREADS, 0, k_layernorm_backward_params<1>, dw.data(), db.data(),
                   pdw.data(), pdb.data(), tickets.data(), d.p, inp.data(), mean.data(),
                   rstd.data(), N, C);
    else
        emu_launch(grid, COL_THREADS, 0, k_layernorm_backward_params<0>, dw.data(), db.data(),
                   pdw.data(), pdb.data(), tickets.data(), d.p, inp.data(), mean.data(),
                   rstd.data(), N, C);
    tickets_back_to_0(N, C);
}

} // namespace

Test(cuda_colsum_emu, bias_gradient_matches_the_cpu_bitwise, .timeout = 300)
{
    uint32_t seed = 5;
    for (const shape &s : shapes) {
        size_t N = s.N, C = s.C;
        std::vector<float> dout = uniform(N * C, -1, 1, seed++), db0 = uniform(C, -1, 1, seed++);
        std::vector<uint16_t> d16 = rounded(dout);
        for (unsigned grid : {small_grid, launcher_grid(N, C)})
            for (int mode = 0; mode < 3; mode++) { /* f32, bf16, f32 rounding dout */
                bool bf16 = mode == 1, round16 = mode == 2;
                std::vector<float> want = db0, got = db0;
                std::vector<uint16_t> want16(N * C, 0xdead), got16(N * C, 0xbeef);
                bias_run(want, want16, false, grid, dout, d16, bf16, round16, N, C);
                bias_run(got, got16, true, grid, dout, d16, bf16, round16, N, C);
                cr_log_info("bias N=%zu C=%zu grid %u mode %d", N, C, grid, mode);
                same(bf16 ? "dbias from bf16" : "dbias", got.data(), want.data(), C, N, C);
                if (round16)
                    cr_assert(memcmp(got16.data(), want16.data(), 2 * N * C) == 0 &&
                                  memcmp(got16.data(), d16.data(), 2 * N * C) == 0,
                              "N=%zu C=%zu: dout rounded otherwise than dp_bf16_round", N, C);
            }
    }
}

Test(cuda_colsum_emu, layernorm_parameter_gradients_match_the_cpu_bitwise, .timeout = 300)
{
    uint32_t seed = 50;
    for (const shape &s : shapes) {
        size_t N = s.N, C = s.C;
        std::vector<float> dout = uniform(N * C, -1, 1, seed++), inp = uniform(N * C, 2, 4, seed++),
                           mean = uniform(N, 2.5f, 3.5f, seed++),
                           rstd = uniform(N, 0.5f, 2, seed++), dw0 = uniform(C, -1, 1, seed++),
                           db0 = uniform(C, -1, 1, seed++);
        std::vector<uint16_t> d16 = rounded(dout);
        for (unsigned grid : {small_grid, launcher_grid(N, C)})
            for (int bf16 = 0; bf16 < 2; bf16++) {
                std::vector<float> wdw = dw0, wdb = db0, gdw = dw0, gdb = db0;
                ln_run(wdw, wdb, false, grid, dout, d16, bf16, inp, mean, rstd, N, C);
                ln_run(gdw, gdb, true, grid, dout, d16, bf16, inp, mean, rstd, N, C);
                cr_log_info("layernorm N=%zu C=%zu grid %u bf16 %d", N, C, grid, bf16);
                same("dweight", gdw.data(), wdw.data(), C, N, C);
                same("dbias", gdb.data(), wdb.data(), C, N, C);
            }
    }
}
