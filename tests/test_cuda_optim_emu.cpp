/*
 * test_cuda_optim_emu.cpp - the CUDA backend's fused AdamW kernels
 * (backend/cuda/cuda_optim.cuh), compiled by the host's C++ compiler
 * against tests/cuda_emu.hpp and run on the CPU, against the CPU
 * backend's loop over dp_adamw_clip_element (kernels/optim.h): every
 * element of every segment bit for bit (the same arithmetic), the gaps
 * between segments and the elements past the last one untouched, for
 * the element-per-thread kernel and the 4-element one (segments that end
 * inside a group of four, one-element segments, gaps of one and three),
 * with and without clipping and the bf16 replica, over grids that take
 * several grid-stride passes.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <vector>

#include "cuda_emu.hpp"

#include "backend/cuda/cuda_optim.cuh"

namespace {

uint32_t next(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

float uniform(uint32_t *s, float lo, float hi)
{
    return lo + (hi - lo) * (float)next(s) / 16777216.0f;
}

/* The arrays of one call; 16-byte aligned (the vector kernel's need). */
struct state {
    std::vector<float> p, g, m, v;
    std::vector<uint16_t> r;
};

state make(size_t n, uint32_t seed)
{
    state s;
    s.p.resize(n + 8), s.g.resize(n + 8), s.m.resize(n + 8), s.v.resize(n + 8);
    s.r.resize(n + 8);
    for (size_t i = 0; i < n + 8; i++) {
        s.p[i] = uniform(&seed, -1, 1);
        s.g[i] = uniform(&seed, -0.1f, 0.1f);
        s.m[i] = uniform(&seed, -0.01f, 0.01f);
        s.v[i] = uniform(&seed, 0, 1e-4f);
        s.r[i] = (uint16_t)next(&seed);
    }
    return s;
}

/* Segments [begin, end) with weight decays 0.1 and 0 alternating. */
dp_adamw_segs table(const std::vector<std::pair<uint64_t, uint64_t>> &t)
{
    dp_adamw_segs s;
    memset(&s, 0, sizeof s);
    s.n = (uint32_t)t.size();
    for (size_t i = 0; i < t.size(); i++) {
        s.begin[i] = t[i].first;
        s.end[i] = t[i].second;
        s.weight_decay[i] = i % 2 ? 0.0f : 0.1f;
    }
    return s;
}

void same(const char *what, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        cr_assert(memcmp(&a[i], &b[i], sizeof(float)) == 0, "%s[%zu]: %a, want %a", what, i,
                  (double)a[i], (double)b[i]);
}

/* One table through one kernel (vec or not), at element offset off of the
 * arrays (off % 4 != 0 only for the element kernel). */
void run_case(const std::vector<std::pair<uint64_t, uint64_t>> &t, bool vec, size_t off,
              float clip, bool with_replica, unsigned grid, uint32_t seed)
{
    dp_adamw_segs segs = table(t);
    size_t n = (size_t)segs.end[segs.n - 1];
    state want = make(n + off, seed), got = want;
    adamw_args a = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.19f, 0.0975f, clip};
    /* the CPU backend's loop over the segments' elements */
    for (uint32_t k = 0; k < segs.n; k++)
        for (size_t i = segs.begin[k]; i < segs.end[k]; i++)
            dp_adamw_clip_element(want.p.data() + off, want.g.data() + off, want.m.data() + off,
                                  want.v.data() + off, with_replica ? want.r.data() + off : NULL,
                                  i, a.lr, a.beta1, a.beta2, a.eps, segs.weight_decay[k],
                                  a.bias_corr1, a.bias_corr2, a.clip);
    float *p = got.p.data() + off, *g = got.g.data() + off, *m = got.m.data() + off,
          *v = got.v.data() + off;
    uint16_t *r = with_replica ? got.r.data() + off : NULL;
    if (vec) /* what the launcher checks before it picks the vector kernel */
        cr_assert((uintptr_t)p % 16 == 0 && (uintptr_t)g % 16 == 0 && (uintptr_t)m % 16 == 0 &&
                  (uintptr_t)v % 16 == 0 && (uintptr_t)r % 8 == 0);
    if (vec)
        emu_launch(grid, 64, 0, k_adamw_segments_vec, p, g, m, v, r, segs, a, n);
    else
        emu_launch(grid, 64, 0, k_adamw_segments, p, g, m, v, r, segs, a, n);
    size_t all = n + off + 8; /* the gaps and the tail included */
    cr_log_info("%s kernel, offset %zu, clip %g, replica %d: %zu elements", vec ? "vec" : "element",
                off, (double)clip, with_replica, n);
    same("params", got.p.data(), want.p.data(), all);
    same("grads", got.g.data(), want.g.data(), all);
    same("m", got.m.data(), want.m.data(), all);
    same("v", got.v.data(), want.v.data(), all);
    cr_assert(memcmp(got.r.data(), want.r.data(), all * sizeof(uint16_t)) == 0,
              "the replica differs");
}

const std::vector<std::pair<uint64_t, uint64_t>> awkward = {
    {0, 37}, {40, 41}, {41, 45}, {48, 1003}, {1004, 1005}, {1008, 2051}};

} // namespace

Test(cuda_optim_emu, vector_kernel_matches_the_cpu_bitwise, .timeout = 120)
{
    for (int c = 0; c < 2; c++)
        for (int rep = 0; rep < 2; rep++)
            run_case(awkward, true, 0, c ? 0.5f : 1.0f, rep, 3, 11u + (uint32_t)(2 * c + rep));
    /* one segment, a multiple of four: every group takes the vector path */
    run_case({{0, 4096}}, true, 0, 0.25f, true, 5, 7u);
}

Test(cuda_optim_emu, element_kernel_matches_the_cpu_bitwise, .timeout = 120)
{
    for (int c = 0; c < 2; c++)
        run_case(awkward, false, c ? 3 : 0, c ? 0.5f : 1.0f, c == 1, 2, 21u + (uint32_t)c);
}
