/*
 * test_flash_f32_emu.cpp - the fused attention's float32 CUDA kernels
 * (backend/cuda/cuda_flash_f32.cuh: tiled for head sizes 64 and 128, a
 * thread per item otherwise), compiled by the host's C++ compiler against
 * tests/cuda_emu.hpp and run on the CPU, against the CPU backend's items
 * (kernels/flash.h) on the same inputs: float32 and bfloat16 q, k, v, a
 * context of two 64-row tiles (the second partial), two heads. The
 * bounds are test_cuda_ops.c's for the same kernels on a GPU: the tiled
 * kernels split each dot over G threads (a butterfly of partial sums)
 * where the CPU sums in four running sums, and exp is the host's expf
 * here against dp_expf: out 6e-5, lse 2e-5, dqkv 8e-5 absolute, 2e-5
 * relative.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <vector>

#include "cuda_emu.hpp"

#include "backend/cuda/cuda_flash_f32.cuh"

namespace {

uint32_t next(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

float uniform(uint32_t *s) { return (float)next(s) / 16777216.0f * 3.0f - 1.5f; }

void close(const char *what, const std::vector<float> &a, const std::vector<float> &b,
           float atol)
{
    for (size_t i = 0; i < a.size(); i++)
        cr_assert(fabsf(a[i] - b[i]) <= atol + 2e-5f * fabsf(b[i]), "%s[%zu]: %.9g, CPU %.9g",
                  what, i, (double)a[i], (double)b[i]);
}

/* The three passes on the emulator (the launchers' shapes, cuda_flash.cu)
 * and on the CPU, compared. */
template <int HS, int GF, int GB> void run_case(size_t T, size_t NH, int bf16, uint32_t seed)
{
    const size_t B = 1, C = NH * HS, BNH = B * NH, n = BNH * T, hs = HS;
    const float scale = 1.0f / sqrtf((float)HS);
    std::vector<float> q32(3 * n * hs), dout(B * T * C);
    std::vector<uint16_t> q16(3 * n * hs);
    for (size_t i = 0; i < q32.size(); i++) {
        q16[i] = dp_bf16_round(uniform(&seed));
        q32[i] = bf16 ? dp_bf16_widen(q16[i]) : uniform(&seed);
    }
    /* dO of bfloat16 values, so a bfloat16 copy (g16) holds the same ones */
    std::vector<uint16_t> g16(dout.size());
    for (size_t i = 0; i < dout.size(); i++) {
        g16[i] = dp_bf16_round(uniform(&seed));
        dout[i] = dp_bf16_widen(g16[i]);
    }
    dp_pref qkv = bf16 ? dp_pref_bf16(q16.data()) : dp_pref_f32(q32.data());
    /* the CPU */
    const size_t nq = B * T * 3 * C;
    std::vector<float> out_c(B * T * C), lse_c(n), lse_c16(n), delta(n), dqkv_c(nq);
    std::vector<uint16_t> dqkv_c16(nq, 0xabcd); /* the items' bfloat16 dqkv */
    std::vector<uint16_t> out_c16(B * T * C, 0xabcd); /* ... and out */
    for (size_t r = 0; r < n; r++) {
        dp_flash_forward_item(dp_pout_f32(out_c.data()), lse_c.data(), qkv, B, T, NH, hs, scale,
                              r);
        dp_flash_forward_item(dp_pout_bf16(out_c16.data()), lse_c16.data(), qkv, B, T, NH, hs,
                              scale, r);
    }
    for (size_t i = 0; i < out_c.size(); i++)
        cr_assert_eq(out_c16[i], dp_bf16_round(out_c[i]), "hs %d: the CPU's bf16 out[%zu]", HS,
                     i);
    cr_assert(memcmp(lse_c16.data(), lse_c.data(), n * sizeof(float)) == 0,
              "hs %d: the CPU's lse differs with a bfloat16 out", HS);
    for (size_t r = 0; r < n; r++)
        dp_flash_delta_item(delta.data(), dp_pref_f32(dout.data()), dp_pref_f32(out_c.data()), T,
                            NH, hs, r);
    for (int o16 = 0; o16 < 2; o16++) {
        dp_pout dq = o16 ? dp_pout_bf16(dqkv_c16.data()) : dp_pout_f32(dqkv_c.data());
        for (size_t r = 0; r < n; r++) {
            dp_flash_dq_item(dq, dp_pref_f32(dout.data()), qkv, lse_c.data(), delta.data(), B,
                             T, NH, hs, scale, r);
            dp_flash_dkdv_item(dq, dp_pref_f32(dout.data()), qkv, lse_c.data(), delta.data(), B,
                               T, NH, hs, scale, r);
        }
    }
    for (size_t i = 0; i < nq; i++)
        cr_assert_eq(dqkv_c16[i], dp_bf16_round(dqkv_c[i]), "hs %d: the CPU's bf16 dqkv[%zu]",
                     HS, i);
    /* the emulated GPU, from the CPU's lse and D (each pass on its own),
     * with a float32 and a bfloat16 dqkv */
    std::vector<float> out(B * T * C, NAN), lse(n, NAN), lse16(n, NAN), dqkv(nq, NAN);
    std::vector<uint16_t> out_k16(B * T * C, 0xabcd), dqkv16(nq, 0xabcd);
    const size_t nt = (T + ROWS - 1) / ROWS;
    const unsigned tiles = (unsigned)(nt * BNH), items = 3;
    const float *L = lse_c.data(), *D = delta.data();
    const dp_pref g = dp_pref_f32(dout.data());
    /* the bfloat16 items' local rows for this head size (items16_cap) */
    constexpr unsigned CAP = HS <= 32 ? 32 : HS <= 64 ? 64 : HS <= 128 ? 128 : DP_FLASH_HS_MAX16;
    for (int o16 = 0; o16 < 2; o16++) {
        dp_pout dq = o16 ? dp_pout_bf16(dqkv16.data()) : dp_pout_f32(dqkv.data());
        dp_pout o = o16 ? dp_pout_bf16(out_k16.data()) : dp_pout_f32(out.data());
        float *lo = o16 ? lse16.data() : lse.data();
        if (HS == 64 || HS == 128) {
            emu_launch(tiles, ROWS * GF, 0, k_flash_forward<HS, GF>, o, lo, qkv, B, T, NH,
                       scale, nt);
            emu_launch(tiles, ROWS * GB, 0, k_flash_dq<HS, GB>, dq, g, qkv, L, D, B, T, NH,
                       scale, nt);
            emu_launch(tiles, ROWS * GB, 0, k_flash_dkdv<HS, GB>, dq, g, qkv, L, D, B, T, NH,
                       scale);
        } else {
            if (o16) { /* the launcher's choice per type and head size */
                cr_assert_eq(items16_cap(hs), CAP);
                emu_launch(items, ROW_THREADS, 0, k_flash_forward_items16<CAP>, out_k16.data(),
                           lo, qkv, T, NH, hs, scale, n);
                emu_launch(items, ROW_THREADS, 0, k_flash_dq_items16<CAP>, dqkv16.data(), g, qkv,
                           L, D, T, NH, hs, scale, n);
                emu_launch(items, ROW_THREADS, 0, k_flash_dkdv_items16<CAP>, dqkv16.data(), g,
                           qkv, L, D, T, NH, hs, scale, n);
            } else {
                emu_launch(items, ROW_THREADS, 0, k_flash_forward_items_f32, out.data(), lo,
                           qkv, B, T, NH, hs, scale, n);
                emu_launch(items, ROW_THREADS, 0, k_flash_dq_items_f32, dqkv.data(), g, qkv, L,
                           D, B, T, NH, hs, scale, n);
                emu_launch(items, ROW_THREADS, 0, k_flash_dkdv_items_f32, dqkv.data(), g, qkv,
                           L, D, B, T, NH, hs, scale, n);
            }
        }
    }
    for (size_t i = 0; i < nq; i++) /* the same kernel's sums, rounded as stored */
        cr_assert_eq(dqkv16[i], dp_bf16_round(dqkv[i]), "hs %d: the kernels' bf16 dqkv[%zu]",
                     HS, i);
    for (size_t i = 0; i < out.size(); i++) /* ... and the forward's */
        cr_assert_eq(out_k16[i], dp_bf16_round(out[i]), "hs %d: the kernels' bf16 out[%zu]", HS,
                     i);
    cr_assert(memcmp(lse16.data(), lse.data(), n * sizeof(float)) == 0,
              "hs %d: the kernels' lse differs with a bfloat16 out", HS);
    /* from the bfloat16 dO: the same values, so the same bits */
    {
        const dp_pref g16p = dp_pref_bf16(g16.data());
        std::vector<float> again(nq, NAN);
        const dp_pout dq = dp_pout_f32(again.data());
        if (HS == 64 || HS == 128) {
            emu_launch(tiles, ROWS * GB, 0, k_flash_dq<HS, GB>, dq, g16p, qkv, L, D, B, T, NH,
                       scale, nt);
            emu_launch(tiles, ROWS * GB, 0, k_flash_dkdv<HS, GB>, dq, g16p, qkv, L, D, B, T, NH,
                       scale);
        } else {
            emu_launch(items, ROW_THREADS, 0, k_flash_dq_items_f32, again.data(), g16p, qkv, L,
                       D, B, T, NH, hs, scale, n);
            emu_launch(items, ROW_THREADS, 0, k_flash_dkdv_items_f32, again.data(), g16p, qkv,
                       L, D, B, T, NH, hs, scale, n);
            /* the bfloat16 items with the widest local rows: the same bits
             * (the rows' size is only their capacity) */
            std::vector<uint16_t> wide16(nq, 0xabcd), wout16(out.size(), 0xabcd);
            std::vector<float> wlse(n, NAN);
            emu_launch(items, ROW_THREADS, 0, k_flash_dq_items16<DP_FLASH_HS_MAX16>,
                       wide16.data(), g16p, qkv, L, D, T, NH, hs, scale, n);
            emu_launch(items, ROW_THREADS, 0, k_flash_dkdv_items16<DP_FLASH_HS_MAX16>,
                       wide16.data(), g16p, qkv, L, D, T, NH, hs, scale, n);
            emu_launch(items, ROW_THREADS, 0, k_flash_forward_items16<DP_FLASH_HS_MAX16>,
                       wout16.data(), wlse.data(), qkv, T, NH, hs, scale, n);
            cr_assert(wide16 == dqkv16, "hs %d: the widest bf16 items' dqkv differs", HS);
            cr_assert(wout16 == out_k16 && memcmp(wlse.data(), lse.data(), n * 4) == 0,
                      "hs %d: the widest bf16 forward items differ", HS);
        }
        cr_assert(memcmp(again.data(), dqkv.data(), nq * sizeof(float)) == 0,
                  "hs %d: dqkv from a bfloat16 dO differs", HS);
        std::vector<float> d16(n, NAN), d32(n, NAN);
        if (hs % 4 == 0) {
            emu_launch(items, ROW_THREADS, 0, k_flash_delta_vec, d16.data(), g16p,
                       dp_pref_f32(out_c.data()), T, NH, hs, n);
            emu_launch(items, ROW_THREADS, 0, k_flash_delta_vec, d32.data(), g,
                       dp_pref_f32(out_c.data()), T, NH, hs, n);
            cr_assert(memcmp(d16.data(), d32.data(), n * sizeof(float)) == 0,
                      "hs %d: D from a bfloat16 dO differs", HS);
        }
    }
    /* D: the vectorised kernel (hs % 4 == 0) and the item kernel give the
     * CPU's bits, from a float32 and a bfloat16 O */
    std::vector<uint16_t> out16(B * T * C);
    for (size_t i = 0; i < out16.size(); i++) out16[i] = dp_bf16_round(out_c[i]);
    for (int o16 = 0; o16 < 2; o16++) {
        dp_pref op = o16 ? dp_pref_bf16(out16.data()) : dp_pref_f32(out_c.data());
        std::vector<float> d_cpu(n), d_vec(n, NAN), d_items(n, NAN);
        for (size_t r = 0; r < n; r++)
            dp_flash_delta_item(d_cpu.data(), g, op, T, NH, hs, r);
        if (hs % 4 == 0)
            emu_launch(items, ROW_THREADS, 0, k_flash_delta_vec, d_vec.data(), g, op, T, NH, hs, n);
        else
            d_vec = d_cpu;
        emu_launch(items, ROW_THREADS, 0, k_flash_delta_items, d_items.data(), g, op, T, NH, hs,
                   n);
        cr_assert(memcmp(d_vec.data(), d_cpu.data(), n * sizeof(float)) == 0,
                  "hs %d: the vectorised D differs from the CPU's (out %s)", HS,
                  o16 ? "bf16" : "f32");
        cr_assert(memcmp(d_items.data(), d_cpu.data(), n * sizeof(float)) == 0,
                  "hs %d: the item kernel's D differs from the CPU's", HS);
    }
    char what[64];
    snprintf(what, sizeof what, "hs %d T %zu %s out", HS, T, bf16 ? "bf16" : "f32");
    close(what, out, out_c, 6e-5f);
    snprintf(what, sizeof what, "hs %d T %zu %s lse", HS, T, bf16 ? "bf16" : "f32");
    close(what, lse, lse_c, 2e-5f);
    snprintf(what, sizeof what, "hs %d T %zu %s dqkv", HS, T, bf16 ? "bf16" : "f32");
    close(what, dqkv, dqkv_c, 8e-5f);
}

} // namespace

/* Head size 64: a thread a row in the forward, two in dq and dk/dv. */
Test(flash_f32_emu, head_size_64, .timeout = 120)
{
    run_case<64, 1, 2>(70, 2, 0, 1u);
    run_case<64, 1, 2>(70, 2, 1, 2u);
}

/* Head size 128: two threads a row in the forward, four in dq and dk/dv. */
Test(flash_f32_emu, head_size_128, .timeout = 120) { run_case<128, 2, 4>(70, 1, 0, 3u); }

/* Another head size: the one-thread-per-item kernels, grid-stride. */
Test(flash_f32_emu, other_head_sizes)
{
    run_case<24, 1, 1>(37, 2, 1, 4u); /* local rows of 32 floats for bfloat16 outputs */
    run_case<40, 1, 1>(37, 1, 1, 6u); /* ... of 64 */
}
