/*
 * tests/cuda_emu_selftest.cpp - checks tests/cuda_emu.hpp: barriers,
 * shuffles, WMMA against a double GEMM, and the alignment check.
 *
 *   g++ -std=c++17 -O1 -g -fsanitize=thread -pthread -Itests \
 *       tests/cuda_emu_selftest.cpp -o /tmp/cuda_emu_selftest && /tmp/cuda_emu_selftest
 *
 * Prints PASS/FAIL per test; exits nonzero on any failure.
 */
#include "cuda_emu.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <signal.h>

#include <random>
#include <vector>

namespace wmma = nvcuda::wmma;

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

// 3. C = A B (+ D): A (32, 48), B (48, 32) bf16, 4 warps, a 16x16 tile each.
//    Shared: A (32, LA), B row-major (48, LB), B^T (32, LA), 4 float tiles (16, LC).
const unsigned GM = 32, GN = 32, GK = 48, LA = 56, LB = 40, LC = 20;
const size_t OFF_B = GM * LA * 2, OFF_BT = OFF_B + GK * LB * 2, OFF_C = OFF_BT + GN * LA * 2;
const size_t GEMM_SMEM = OFF_C + 4 * 16 * LC * 4;

__global__ void __launch_bounds__(128, 1)
    k_gemm(float *c_row, float *c_col, const uint16_t *a, const uint16_t *b, const float *d,
           float scale)
{
    unsigned char *s = tc_shared();
    uint16_t *sa = (uint16_t *)s, *sb = (uint16_t *)(s + OFF_B), *sbt = (uint16_t *)(s + OFF_BT);
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, ti = warp / 2, tj = warp % 2;
    float *sc = (float *)(s + OFF_C) + warp * 16 * LC;
    for (unsigned e = threadIdx.x; e < GM * GK; e += blockDim.x) sa[e / GK * LA + e % GK] = a[e];
    for (unsigned e = threadIdx.x; e < GK * GN; e += blockDim.x) {
        sb[e / GN * LB + e % GN] = b[e];
        sbt[e % GN * LA + e / GN] = b[e]; /* B^T row-major = B col-major */
    }
    __syncthreads();

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc_r, acc_c;
    wmma::fill_fragment(acc_r, 0.0f);
    wmma::load_matrix_sync(acc_c, d + ti * 16 * GN + tj * 16, GN, wmma::mem_row_major);
    for (unsigned kk = 0; kk < GK / 16; kk++) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fbr;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fbc;
        wmma::load_matrix_sync(fa, (const __nv_bfloat16 *)(sa + ti * 16 * LA + kk * 16), LA);
        wmma::load_matrix_sync(fbr, (const __nv_bfloat16 *)(sb + kk * 16 * LB + tj * 16), LB);
        wmma::load_matrix_sync(fbc, (const __nv_bfloat16 *)(sbt + tj * 16 * LA + kk * 16), LA);
        wmma::mma_sync(acc_r, fa, fbr, acc_r);
        wmma::mma_sync(acc_c, fa, fbc, acc_c);
    }
    for (int i = 0; i < acc_r.num_elements; i++) acc_r.x[i] *= scale;

    /* row-major store, every lane copies 8 elements out */
    wmma::store_matrix_sync(sc, acc_r, LC, wmma::mem_row_major);
    __syncwarp();
    for (unsigned e = lane; e < 256; e += 32)
        c_row[(ti * 16 + e / 16) * GN + tj * 16 + e % 16] = sc[e / 16 * LC + e % 16];
    __syncwarp(); /* reads done before the next store reuses sc */
    wmma::store_matrix_sync(sc, acc_c, LC, wmma::mem_col_major);
    __syncwarp();
    for (unsigned e = lane; e < 256; e += 32) /* sc holds the tile transposed */
        c_col[(ti * 16 + e / 16) * GN + tj * 16 + e % 16] = sc[e % 16 * LC + e / 16];
}

// 4. A WMMA load from a misaligned pointer (one element past an aligned one).
__global__ void k_misaligned(float *out)
{
    uint16_t *s = (uint16_t *)tc_shared();
    for (unsigned e = threadIdx.x; e < 16 * 24; e += blockDim.x) s[e] = 0x3f80; /* 1.0 */
    __syncthreads();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
    wmma::load_matrix_sync(fa, (const __nv_bfloat16 *)(s + 1), 16);
    out[threadIdx.x] = fa.x[0];
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
    { // 3
        std::mt19937 rng(1234);
        std::uniform_real_distribution<float> U(-1.0f, 1.0f);
        std::vector<uint16_t> a(GM * GK), b(GK * GN);
        for (auto &x : a) x = bf16_trunc(U(rng));
        for (auto &x : b) x = bf16_trunc(U(rng));
        alignas(32) static float d[GM * GN];
        for (auto &x : d) x = U(rng);
        std::vector<float> cr(GM * GN, NAN), cc(GM * GN, NAN);
        const float scale = 0.5f;
        emu_launch(1, 128, GEMM_SMEM, k_gemm, cr.data(), cc.data(), a.data(), b.data(),
                   (const float *)d, scale);
        double worst = 0;
        for (unsigned i = 0; i < GM; i++)
            for (unsigned j = 0; j < GN; j++) {
                double ref = 0, mag = 0;
                for (unsigned k = 0; k < GK; k++) {
                    const double p = widen(a[i * GK + k]) * widen(b[k * GN + j]);
                    ref += p, mag += fabs(p);
                }
                const double er = fabs(cr[i * GN + j] - ref * scale) / (scale * mag + 1e-30);
                const double ec = fabs(cc[i * GN + j] - (ref + d[i * GN + j])) /
                                  (mag + fabs(d[i * GN + j]) + 1e-30);
                if (!(er <= worst)) worst = er; /* NaN-safe: NaN becomes worst */
                if (!(ec <= worst)) worst = ec;
            }
        printf("      gemm: worst relative error %.3g\n", worst);
        report("WMMA GEMM 32x48 . 48x32, matrix_b row and col major, vs double", worst <= 1e-5);
    }
    { // 4
        fflush(stdout);
        const pid_t pid = fork();
        if (pid == 0) {
            std::vector<float> out(32);
            emu_launch(1, 32, 16 * 24 * 2, k_misaligned, out.data());
            _exit(0); /* not reached if the check works */
        }
        int st = 0;
        waitpid(pid, &st, 0);
        report("misaligned load_matrix_sync aborts (child)", WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    }
    printf("%s\n", failures ? "cuda_emu selftest: FAILED" : "cuda_emu selftest: all passed");
    return failures ? 1 : 0;
}
