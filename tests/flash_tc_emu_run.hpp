/*
 * flash_tc_emu_run.hpp - a causal attention problem with bfloat16 q, k, v
 * and the tensor core kernels of backend/cuda/cuda_flash_tc.cuh run on
 * it under tests/cuda_emu.hpp: forward, D = dO.O per row (the backend's
 * delta op), dq, then dk and dv. For test_flash_tc_emu.cpp (held to
 * float64) and flash_tc_race.cpp (the same under ThreadSanitizer).
 */
#ifndef DP_TEST_FLASH_TC_EMU_RUN_HPP
#define DP_TEST_FLASH_TC_EMU_RUN_HPP

#include <math.h>
#include <stdint.h>

#include <vector>

#include "cuda_emu.hpp"

#include "backend/cuda/cuda_flash_tc.cuh"

namespace flash_tc_emu {

const size_t HS = 64;

struct problem {
    size_t B, T, NH, C, BNH;
    float scale;
    std::vector<uint16_t> qkv; /* (B, T, 3C) bf16 bits, read in place */
    std::vector<float> dout;    /* (B, T, C) */
};

inline uint32_t next(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

inline float uniform(uint32_t *s) { return (float)next(s) / 16777216.0f * 2.0f - 1.0f; }

inline problem make(size_t B, size_t T, size_t NH, float qsharp, uint32_t seed)
{
    problem p;
    p.B = B, p.T = T, p.NH = NH, p.C = NH * HS, p.BNH = B * NH;
    p.scale = 1.0f / sqrtf((float)HS);
    p.qkv.resize(B * T * 3 * p.C);
    for (size_t i = 0; i < p.qkv.size(); i++) { /* q sharpened: part 0 of each token */
        float x = uniform(&seed) * (i / p.C % 3 == 0 ? qsharp : 1.0f);
        p.qkv[i] = dp_bf16_round(x);
    }
    p.dout.resize(B * T * p.C);
    for (float &x : p.dout) x = uniform(&seed);
    return p;
}

/* The kernels' outputs; dqkv16 the backward's again into a bfloat16
 * dqkv. */
struct result {
    std::vector<float> out, lse, delta, dqkv;
    std::vector<uint16_t> dqkv16;
};

/* The forward into out (float32 or bfloat16) and lse. */
inline void forward(const problem &p, dp_pout out, float *lse)
{
    size_t nt = (p.T + dp_tc::BR - 1) / dp_tc::BR, blocks = nt * p.BNH;
    emu_launch((unsigned)blocks, dp_tc::THREADS, dp_tc::SMEM_QUERY, k_flash_tc_forward, out, lse,
               p.qkv.data(), p.B, p.T, p.NH, p.scale, nt);
}

/* dq, then dk and dv, from dout (float32 or bfloat16) and r's lse and
 * delta into dqkv. */
inline void backward(const problem &p, const result &r, dp_pref dout, dp_pout dqkv)
{
    size_t nt = (p.T + dp_tc::BR - 1) / dp_tc::BR, blocks = nt * p.BNH;
    emu_launch((unsigned)blocks, dp_tc::THREADS, dp_tc::SMEM_QUERY, k_flash_tc_dq, dqkv, dout,
               p.qkv.data(), (const float *)r.lse.data(), (const float *)r.delta.data(), p.B,
               p.T, p.NH, p.scale, nt);
    emu_launch((unsigned)blocks, dp_tc::THREADS, dp_tc::SMEM_KEY, k_flash_tc_dkdv, dqkv, dout,
               p.qkv.data(), (const float *)r.lse.data(), (const float *)r.delta.data(), p.B,
               p.T, p.NH, p.scale, nt);
}

inline result run_kernels(const problem &p)
{
    result r;
    r.out.assign(p.B * p.T * p.C, NAN);
    r.lse.assign(p.BNH * p.T, NAN);
    r.dqkv.assign(p.B * p.T * 3 * p.C, NAN);
    forward(p, dp_pout_f32(r.out.data()), r.lse.data());
    /* D = dO . O per row, as the backend's delta op gives it */
    r.delta.resize(p.BNH * p.T);
    for (size_t row = 0; row < p.BNH * p.T; row++)
        dp_flash_delta_item(r.delta.data(), dp_pref_f32(p.dout.data()),
                            dp_pref_f32(r.out.data()), p.T, p.NH, HS, row);
    r.dqkv16.assign(r.dqkv.size(), 0xabcd);
    for (int o16 = 0; o16 < 2; o16++)
        backward(p, r, dp_pref_f32(p.dout.data()),
                 o16 ? dp_pout_bf16(r.dqkv16.data()) : dp_pout_f32(r.dqkv.data()));
    return r;
}

} // namespace flash_tc_emu

#endif /* DP_TEST_FLASH_TC_EMU_RUN_HPP */
