/*
 * tests/cuda_emu_selftest.cpp - checks tests/cuda_emu.hpp: barriers,
 * shuffles, mma.sync and ldmatrix against a double GEMM, and the
 * alignment check.
 *
 *   g++ -std=c++17 -O1 -g -fsanitize=thread -pthread -Itests \
 *       tests/cuda_emu_selftest.cpp -o /tmp/cuda_emu_selftest && /tmp/cuda_emu_selftest
 *
 * Prints PASS/FAIL per test; exits nonzero on any failure.
 */
#include "cuda_emu.hpp"
#include "kernels/bf16.h"

#include <sys/wait.h>
#include <unistd.h>

#include <signal.h>

#include <random>
#include <vector>

static int failures = 0;

static void report(const char *name, bool ok)
{
    printf("%s: %s\n", ok ? "PASS" : "FAIL", name);
    if (!ok) failures++;
}

// 1. __syncthreads, reused: neighbour reads across rounds; fresh 0xA5 shared
//    memory per block; early-returning threads drop out of later barriers.
__global__ void k_barrier(unsigned *errors, unsigned rounds, unsigned live)
{
    unsigned *s = (unsigned *)tc_shared();
    const unsigned t = threadIdx.x, n = blockDim.x, g = blockIdx.x * n + t;
    unsigned err = 0;
    if ((uintptr_t)s % 128) err++;
    if (s[t] != 0xA5A5A5A5u) err++; /* unwritten shared memory shows the pattern */
    if (blockDim.y != 1 || gridDim.z != 1 || threadIdx.y != 0 || blockIdx.z != 0) err++;
    for (unsigned it = 0; it < rounds; it++) {
        s[t] = it * 1000003u + blockIdx.x * 1000u + t;
        __syncthreads();
        if (s[(t + 1) % n] != it * 1000003u + blockIdx.x * 1000u + (t + 1) % n) err++;
        __syncthreads();
    }
    errors[g] = err;
    if (t >= live) return;
    for (unsigned it = 0; it < rounds; it++) {
        s[t] = it + t;
        __syncthreads();
        if (s[(t + 1) % live] != it + (t + 1) % live) errors[g]++;
        __syncthreads();
    }
}

// 2. Butterfly sums over each warp, float and int.
__global__ void k_shfl(float *fsum, int *isum)
{
    const unsigned t = threadIdx.x;
    float f = 0.5f * (float)(t % 32) + (float)(t / 32);
    int i = (int)(t * t) - 100;
    for (int m = 16; m >= 1; m /= 2) {
        f += __shfl_xor_sync(0xffffffffu, f, m);
        i += __shfl_xor_sync(0xffffffffu, i, m);
    }
    fsum[t] = f;
    isum[t] = i;
}

// 2b. __shfl_sync: lane (7l + 3) % 32's value, and lane 37 (37 % 32 = 5).
__global__ void k_shfl_idx(float *got, double *got5)
{
    const unsigned t = threadIdx.x, l = t % 32;
    got[t] = __shfl_sync(0xffffffffu, (float)t, (int)((7 * l + 3) % 32));
    got5[t] = __shfl_sync(0xffffffffu, 0.25 * (double)t, 37);
}

// 3. C = A B + D: A (32, 48), B (48, 32) bf16, 4 warps, a 16x16 tile each
//    (two 16x8 accumulators). A by ldmatrix; B twice: by ldmatrix.trans from
//    B row-major (k rows) into c_t, by plain ldmatrix from B^T row-major (n
//    rows) into c_n. Each lane writes its own accumulator elements, so the
//    layouts of cuda_mma.cuh compose into the right product.
//    Shared: A (32, LA), B (48, LB), B^T (32, LA); rows 16-byte aligned.
const unsigned GM = 32, GN = 32, GK = 48, LA = 56, LB = 40;
const size_t OFF_B = GM * LA * 2, OFF_BT = OFF_B + GK * LB * 2;
const size_t GEMM_SMEM = OFF_BT + GN * LA * 2;

__global__ void __launch_bounds__(128, 1)
    k_gemm(float *c_t, float *c_n, const uint16_t *a, const uint16_t *b, const float *d)
{
    unsigned char *s = tc_shared();
    uint16_t *sa = (uint16_t *)s, *sb = (uint16_t *)(s + OFF_B), *sbt = (uint16_t *)(s + OFF_BT);
    const unsigned warp = threadIdx.x / 32, l = threadIdx.x % 32, ti = warp / 2, tj = warp % 2;
    const unsigned g = l / 4, t = l % 4;
    for (unsigned e = threadIdx.x; e < GM * GK; e += blockDim.x) sa[e / GK * LA + e % GK] = a[e];
    for (unsigned e = threadIdx.x; e < GK * GN; e += blockDim.x) {
        sb[e / GN * LB + e % GN] = b[e];
        sbt[e % GN * LA + e / GN] = b[e];
    }
    __syncthreads();
    float acc_t[2][4], acc_n[2][4];
    for (unsigned n = 0; n < 2; n++)
        for (unsigned e = 0; e < 4; e++) {
            const unsigned i = ti * 16 + g + (e / 2) * 8, j = tj * 16 + n * 8 + 2 * t + e % 2;
            acc_t[n][e] = acc_n[n][e] = d[i * GN + j];
        }
    for (unsigned kk = 0; kk < GK / 16; kk++) {
        uint32_t fa[4], bt[4], bn[4];
        dp_ldmatrix_x4(fa, sa + (ti * 16 + (l / 8 % 2) * 8 + l % 8) * LA + kk * 16 + (l / 16) * 8);
        dp_ldmatrix_x4_trans(bt, sb + (kk * 16 + (l / 8 % 2) * 8 + l % 8) * LB + tj * 16 +
                                     (l / 16) * 8);
        dp_ldmatrix_x4(bn, sbt + (tj * 16 + (l / 16) * 8 + l % 8) * LA + kk * 16 + (l / 8 % 2) * 8);
        for (unsigned n = 0; n < 2; n++) {
            dp_mma_bf16_16816(acc_t[n], fa, bt + 2 * n);
            dp_mma_bf16_16816(acc_n[n], fa, bn + 2 * n);
        }
    }
    for (unsigned n = 0; n < 2; n++)
        for (unsigned e = 0; e < 4; e++) {
            const unsigned i = ti * 16 + g + (e / 2) * 8, j = tj * 16 + n * 8 + 2 * t + e % 2;
            c_t[i * GN + j] = acc_t[n][e];
            c_n[i * GN + j] = acc_n[n][e];
        }
}

// 4. An ldmatrix row address one element past a 16-byte aligned one.
__global__ void k_misaligned(float *out)
{
    uint16_t *s = (uint16_t *)tc_shared();
    for (unsigned e = threadIdx.x; e < 16 * 24; e += blockDim.x) s[e] = 0x3f80; /* 1.0 */
    __syncthreads();
    uint32_t r[4];
    dp_ldmatrix_x4(r, s + 1 + (threadIdx.x % 8) * 24);
    out[threadIdx.x] = (float)r[0];
}

// 5. cp.async: what a thread sees of its copies before and after its
//    waits, in the two landing modes; the zero fill; groups.
__global__ void k_cp_async(float *seen, const float *src)
{
    float *s = (float *)tc_shared(); /* 4 floats a thread and group, two groups */
    float *a = s + threadIdx.x * 8, *b = a + 4;
    for (unsigned k = 0; k < 8; k++) a[k] = -1.0f;
    dp_cp_async16(a, src + threadIdx.x * 4, true);
    dp_cp_async_commit();
    dp_cp_async16(b, src, false); /* 16 zero bytes */
    dp_cp_async_commit();
    float *o = seen + threadIdx.x * 24;
    for (unsigned k = 0; k < 8; k++) o[k] = a[k];      /* before any wait */
    dp_cp_async_wait<1>();
    for (unsigned k = 0; k < 8; k++) o[8 + k] = a[k];  /* the first group only */
    dp_cp_async_wait<0>();
    for (unsigned k = 0; k < 8; k++) o[16 + k] = a[k]; /* both */
}

// 6. A thread that ends with a copy not waited for.
__global__ void k_cp_async_unwaited(const float *src)
{
    dp_cp_async16(tc_shared() + threadIdx.x * 16, src, true);
    dp_cp_async_commit();
}

static uint16_t bf16_trunc(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static double widen(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

int main()
{
    { // 1
        const unsigned grid = 3, block = 128;
        std::vector<unsigned> err(grid * block, 99);
        emu_launch(grid, block, block * sizeof(unsigned), k_barrier, err.data(), 50, 100);
        bool ok = true;
        for (unsigned e : err) ok = ok && e == 0;
        report("__syncthreads neighbour exchange, 3 blocks x 128 threads, early exits", ok);
    }
    { // 2
        const unsigned block = 96;
        std::vector<float> fs(block);
        std::vector<int> is(block);
        emu_launch(1, block, 0, k_shfl, fs.data(), is.data());
        bool ok = true;
        for (unsigned t = 0; t < block; t++) {
            const unsigned w = t / 32;
            float fr = 0;
            int ir = 0;
            for (unsigned l = 0; l < 32; l++) {
                const unsigned u = w * 32 + l;
                fr += 0.5f * (float)l + (float)w;
                ir += (int)(u * u) - 100;
            }
            ok = ok && fs[t] == fr && is[t] == ir;
        }
        report("__shfl_xor_sync butterfly sums (float, int), 3 warps", ok);
    }
    { // 2b
        const unsigned block = 64;
        std::vector<float> got(block);
        std::vector<double> got5(block);
        emu_launch(1, block, 0, k_shfl_idx, got.data(), got5.data());
        bool ok = true;
        for (unsigned t = 0; t < block; t++) {
            const unsigned base = t / 32 * 32;
            ok = ok && got[t] == (float)(base + (7 * (t % 32) + 3) % 32) &&
                 got5[t] == 0.25 * (double)(base + 5);
        }
        report("__shfl_sync lane reads (float, double, src past the warp), 2 warps", ok);
    }
    { // 3
        std::mt19937 rng(1234);
        std::uniform_real_distribution<float> U(-1.0f, 1.0f);
        std::vector<uint16_t> a(GM * GK), b(GK * GN);
        for (auto &x : a) x = bf16_trunc(U(rng));
        for (auto &x : b) x = bf16_trunc(U(rng));
        std::vector<float> d(GM * GN);
        for (auto &x : d) x = U(rng);
        std::vector<float> ct(GM * GN, NAN), cn(GM * GN, NAN);
        emu_launch(1, 128, GEMM_SMEM, k_gemm, ct.data(), cn.data(), a.data(), b.data(),
                   (const float *)d.data());
        double worst = 0;
        for (unsigned i = 0; i < GM; i++)
            for (unsigned j = 0; j < GN; j++) {
                double ref = d[i * GN + j], mag = fabs(d[i * GN + j]);
                for (unsigned k = 0; k < GK; k++) {
                    const double p = widen(a[i * GK + k]) * widen(b[k * GN + j]);
                    ref += p, mag += fabs(p);
                }
                const double et = fabs(ct[i * GN + j] - ref) / (mag + 1e-30);
                const double en = fabs(cn[i * GN + j] - ref) / (mag + 1e-30);
                if (!(et <= worst)) worst = et; /* NaN-safe: NaN becomes worst */
                if (!(en <= worst)) worst = en;
            }
        printf("      gemm: worst relative error %.3g\n", worst);
        report("mma.sync m16n8k16 GEMM 32x48 . 48x32 + D, B by ldmatrix and .trans, vs double",
               worst <= 1e-5);
    }
    { // 4
        fflush(stdout);
        const pid_t pid = fork();
        if (pid == 0) {
            std::vector<float> out(32);
            emu_launch(1, 32, 16 * 24 * 2 + 64, k_misaligned, out.data());
            _exit(0); /* not reached if the check works */
        }
        int st = 0;
        waitpid(pid, &st, 0);
        report("misaligned ldmatrix row address aborts (child)", WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    }
    { // 5
        std::vector<float> src(32 * 4);
        for (unsigned i = 0; i < src.size(); i++) src[i] = (float)i + 0.5f;
        for (int eager = 0; eager < 2; eager++) {
            cuda_emu::cp_async_eager = eager;
            std::vector<float> seen(32 * 24, NAN);
            emu_launch(1, 32, 32 * 8 * sizeof(float), k_cp_async, seen.data(),
                       (const float *)src.data());
            bool ok = true;
            for (unsigned t = 0; t < 32; t++) {
                const float *o = seen.data() + t * 24;
                for (unsigned k = 0; k < 4; k++) {
                    const float v = src[t * 4 + k];
                    ok = ok && o[k] == (eager ? v : -1.0f) && o[4 + k] == (eager ? 0.0f : -1.0f);
                    ok = ok && o[8 + k] == v && o[12 + k] == (eager ? 0.0f : -1.0f);
                    ok = ok && o[16 + k] == v && o[20 + k] == 0.0f;
                }
            }
            report(eager ? "cp.async landing at issue: data, zero fill"
                         : "cp.async landing at wait_group: old bytes before, groups in order",
                   ok);
        }
        cuda_emu::cp_async_eager = false;
    }
    { // 6
        fflush(stdout);
        const pid_t pid = fork();
        if (pid == 0) {
            std::vector<float> src(4, 1.0f);
            emu_launch(1, 32, 32 * 16, k_cp_async_unwaited, (const float *)src.data());
            _exit(0); /* not reached if the check works */
        }
        int st = 0;
        waitpid(pid, &st, 0);
        report("a thread ending with a copy not waited for aborts (child)",
               WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    }
    { // 7
        bool ok = true;
        const float xs[] = {1.0f, -2.5f, 1.00390625f, 1.01171875f, 3e38f, 1e-40f, -0.0f, INFINITY};
        for (float lo : xs)
            for (float hi : xs) {
                const uint32_t w = dp_cvt_bf16x2(lo, hi);
                ok = ok && (w & 0xffffu) == dp_bf16_round(lo) && (w >> 16) == dp_bf16_round(hi);
            }
        ok = ok && (dp_cvt_bf16x2(NAN, 1.0f) & 0xffffu) == 0x7fffu;
        ok = ok && dp_ex2(3.0f) == 8.0f && dp_ex2(-INFINITY) == 0.0f && dp_ex2(-130.0f) == 0.0f;
        report("cvt.rn.bf16x2 (ties to even, NaN 0x7fff) and ex2.approx.ftz", ok);
    }
    printf("%s\n", failures ? "cuda_emu selftest: FAILED" : "cuda_emu selftest: all passed");
    return failures ? 1 : 0;
}
