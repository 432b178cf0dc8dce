/*
 * test_cuda_vec_emu.cpp - the CUDA backend's VEC kernels
 * (backend/cuda/cuda_vec.cuh: the float32 to bfloat16 cast, the bf16
 * GELU and its backward with 16-byte accesses), compiled by the host's
 * C++ compiler against tests/cuda_emu.hpp and run on the CPU, against
 * the CPU backend's loops over the same item functions: every output bit
 * for bit, lengths with and without a tail (n % 8), grids that take
 * several grid-stride passes, the GELU backward in place (dinp = dout)
 * as the GPT calls it, and the elements past n untouched.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <vector>

#include "cuda_emu.hpp"

#include "backend/cuda/cuda_vec.cuh"

namespace {

uint32_t next(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

/* Values in [-8, 8), with zeros, infinities, a NaN and huge values mixed in. */
std::vector<float> values(size_t n, uint32_t seed)
{
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) {
        v[i] = (float)next(&seed) / 16777216.0f * 16.0f - 8.0f;
        if (i % 97 == 5) v[i] = 0.0f;
        if (i % 101 == 7) v[i] = (i % 2 ? 1 : -1) * INFINITY;
        if (i % 103 == 11) v[i] = NAN;
        if (i % 107 == 13) v[i] = (i % 2 ? 1 : -1) * 3e30f;
    }
    return v;
}

std::vector<uint16_t> rounded(const std::vector<float> &v)
{
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); i++) h[i] = dp_bf16_round(v[i]);
    return h;
}

template <typename T> void same(const char *what, const std::vector<T> &a, const std::vector<T> &b)
{
    cr_assert_eq(a.size(), b.size());
    for (size_t i = 0; i < a.size(); i++)
        cr_assert(memcmp(&a[i], &b[i], sizeof(T)) == 0, "%s: element %zu of %zu differs", what, i,
                  a.size());
}

/* The lengths: whole groups, a tail, a single item, a few grid passes. */
const size_t lengths[] = {8, 13, 1, 64, 1000, 4100};

/* A one-input VEC op with a bfloat16 output, out(n) from x(n): the kernel
 * on a grid of blocks x threads against the CPU's loop over elem, bit for
 * bit, the 8 elements past n untouched. */
template <typename In, typename Elem, typename Kernel>
void unary_matches(const char *what, const std::vector<In> &x, size_t n, Elem elem, Kernel kernel,
                   unsigned blocks, unsigned threads)
{
    std::vector<uint16_t> got(n + 8, 0xabcd), want(n + 8, 0xabcd);
    for (size_t i = 0; i < n; i++) elem(want.data(), x.data(), i);
    emu_launch(blocks, threads, 0, kernel, got.data(), (const In *)x.data(), n);
    cr_log_info("%s n %zu", what, n);
    same(what, got, want);
}

} // namespace

Test(cuda_vec_emu, cast_f32_bf16_matches_the_cpu_bitwise, .timeout = 60)
{
    for (size_t n : lengths)
        unary_matches("cast_f32_bf16", values(n + 8, 1u), n, dp_cast_f32_bf16_elem,
                      k_cast_f32_bf16_vec, 2, 64);
}

Test(cuda_vec_emu, gelu_forward_bf16_matches_the_cpu_bitwise, .timeout = 60)
{
    for (size_t n : lengths)
        unary_matches("gelu_forward_bf16", rounded(values(n + 8, 2u)), n,
                      dp_gelu_forward_bf16_elem, k_gelu_forward_bf16_vec, 3, 32);
}

Test(cuda_vec_emu, gelu_backward_in_place_matches_the_cpu_bitwise, .timeout = 60)
{
    for (size_t n : lengths) {
        std::vector<uint16_t> x = rounded(values(n + 8, 3u)), g = rounded(values(n + 8, 4u));
        std::vector<uint16_t> want = g, got = g;
        for (size_t i = 0; i < n; i++)
            dp_gelu_backward_bf16_elem(want.data(), x.data(), want.data(), i);
        emu_launch(2, 64, 0, k_gelu_backward_bf16_vec, got.data(), (const uint16_t *)x.data(),
                   (const uint16_t *)got.data(), n);
        cr_log_info("gelu backward n %zu", n);
        same("gelu backward dinp", got, want);
    }
}
