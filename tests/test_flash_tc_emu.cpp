/*
 * test_flash_tc_emu.cpp - the tensor core attention kernels of
 * backend/cuda/cuda_flash_tc.cuh, compiled by the host's C++ compiler
 * against tests/cuda_emu.hpp (threads, barriers, shuffles and WMMA
 * fragments emulated) and run on the CPU, against a float64 reference of
 * causal attention on the same bfloat16 q, k, v.
 *
 * The bounds and the reference are tests/flash_tc_bound.h's.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "flash_tc_bound.h"
#include "flash_tc_emu_run.hpp"

namespace {

using namespace flash_tc_emu;

/* Holds the kernels' outputs to flash_tc_bound.h's reference and bounds. */
void check(const problem &p, const result &r, const char *what)
{
    std::vector<float> q(p.qkv.size());
    for (size_t i = 0; i < q.size(); i++) q[i] = dp_bf16_widen(p.qkv[i]);
    flash_tc_in in = {p.B, p.T, p.NH, HS, q.data(), p.dout.data(), r.delta.data(), 0.0};
    flash_tc_worst w = flash_tc_check(&in, r.out.data(), r.lse.data(), r.dqkv.data());
    cr_log_info("%s: worst err/bound out %.3f lse %.3f dq %.3f dk %.3f dv %.3f", what, w.out,
                w.lse, w.dq, w.dk, w.dv);
    cr_expect(w.out <= 1.0, "%s: out off by %.3g of its bound", what, w.out);
    cr_expect(w.lse <= 1.0, "%s: lse off by %.3g of its bound", what, w.lse);
    cr_expect(w.dq <= 1.0, "%s: dq off by %.3g of its bound", what, w.dq);
    cr_expect(w.dk <= 1.0, "%s: dk off by %.3g of its bound", what, w.dk);
    cr_expect(w.dv <= 1.0, "%s: dv off by %.3g of its bound", what, w.dv);
    cr_expect(w.biggest > 1e-3, "%s: the gradients are all near zero (%g): nothing was tested",
              what, w.biggest);
    /* a bfloat16 dqkv: the same sums, each rounded once as it is stored */
    for (size_t i = 0; i < r.dqkv.size(); i++)
        cr_assert_eq(r.dqkv16[i], dp_bf16_round(r.dqkv[i]), "%s: bf16 dqkv[%zu]", what, i);
}

void case_of(size_t B, size_t T, size_t NH, float sharp, uint32_t seed)
{
    problem p = make(B, T, NH, sharp, seed);
    result r = run_kernels(p);
    char what[96];
    snprintf(what, sizeof what, "B=%zu T=%zu NH=%zu sharp=%g", B, T, NH, (double)sharp);
    check(p, r, what);
}

} // namespace

/* One query, one key: out is v_0, the gradients of a softmax of one term. */
Test(flash_tc_emu, single_token) { case_of(1, 1, 2, 1.0f, 1u); }

/* Within one tile, the diagonal tile's mask only. */
Test(flash_tc_emu, one_partial_tile) { case_of(2, 17, 2, 1.0f, 2u); }

Test(flash_tc_emu, one_full_tile) { case_of(1, 64, 2, 1.0f, 3u); }

/* Three tiles, the last partial: the rescale across tiles, the dk/dv
 * query loop past the diagonal, rows past T. */
Test(flash_tc_emu, three_tiles) { case_of(2, 130, 2, 1.0f, 4u); }

/* Peaked rows (q four times larger): the running maximum moves between
 * tiles and a masking error would move whole probabilities. */
Test(flash_tc_emu, sharp_rows) { case_of(1, 150, 1, 4.0f, 5u); }

/* The same inputs give the same bits. */
Test(flash_tc_emu, deterministic)
{
    problem p = make(1, 70, 1, 2.0f, 6u);
    result a = run_kernels(p), b = run_kernels(p);
    cr_assert(memcmp(a.out.data(), b.out.data(), a.out.size() * sizeof(float)) == 0);
    cr_assert(memcmp(a.dqkv.data(), b.dqkv.data(), a.dqkv.size() * sizeof(float)) == 0);
}

/* A bfloat16 dO (the GPT's bf16 activation gradients) gives the bits of
 * the float32 dO holding its widened values: the kernels round dO for
 * their products either way, and then read the same bfloat16 tiles
 * (dk/dv copies them as they are instead of rounding a float32 copy). */
Test(flash_tc_emu, bf16_dout_is_its_widened_float32)
{
    problem p = make(2, 130, 2, 1.0f, 7u);
    std::vector<uint16_t> g16(p.dout.size());
    for (size_t i = 0; i < g16.size(); i++) {
        g16[i] = dp_bf16_round(p.dout[i]);
        p.dout[i] = dp_bf16_widen(g16[i]);
    }
    result r = run_kernels(p); /* from the float32 dO: its widened values */
    std::vector<float> got(r.dqkv.size(), NAN);
    backward(p, r, dp_pref_bf16(g16.data()), dp_pout_f32(got.data()));
    cr_assert(memcmp(got.data(), r.dqkv.data(), got.size() * sizeof(float)) == 0,
              "dqkv from a bfloat16 dO differs");
    std::vector<uint16_t> got16(r.dqkv.size(), 0xabcd);
    backward(p, r, dp_pref_bf16(g16.data()), dp_pout_bf16(got16.data()));
    cr_assert(memcmp(got16.data(), r.dqkv16.data(), got16.size() * 2) == 0,
              "bfloat16 dqkv from a bfloat16 dO differs");
    /* ... and the forward into a bfloat16 out (the GPT's kept output): the
     * float32 out rounded once as it is stored, the same lse (here, not
     * in every case: the emulated forward is slow under the sanitizers) */
    std::vector<uint16_t> out16(r.out.size(), 0xabcd);
    std::vector<float> lse16(r.lse.size(), NAN);
    forward(p, dp_pout_bf16(out16.data()), lse16.data());
    for (size_t i = 0; i < r.out.size(); i++)
        cr_assert_eq(out16[i], dp_bf16_round(r.out[i]), "bf16 out[%zu]", i);
    cr_assert(memcmp(lse16.data(), r.lse.data(), r.lse.size() * sizeof(float)) == 0,
              "lse differs with a bfloat16 out");
}
