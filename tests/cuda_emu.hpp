/*
 * tests/cuda_emu.hpp - a host emulator of the CUDA C++ subset that the
 * tensor-core attention kernels (lib/backend/cuda/cuda_flash_tc.cuh) use,
 * so their source compiles with g++ -std=c++17 and runs on the CPU.
 *
 * Model: emu_launch runs the grid's blocks one at a time; each block is
 * blockDim.x real threads (pthreads), so barriers, shuffles and races
 * behave like real concurrency and ThreadSanitizer sees them. mma.sync
 * (m16n8k16 bf16) and ldmatrix (x4, .trans) are warp collectives over
 * the PTX ISA's fragment layouts: each lane deposits its registers or
 * row address, the warp meets, each lane computes its own outputs; row
 * addresses must be 16-byte aligned and in shared memory. The products
 * sum k = 0..15 in order in float (fmaf); the hardware's order and
 * intermediate precision differ, so compare with tolerances. atomicAdd,
 * __threadfence and __ldcg are the host's atomics, fences and loads.
 *
 * Shared memory is the launch's dynamic buffer via tc_shared() (128-byte
 * aligned, refilled with 0xA5 before every block so reads of unwritten
 * bytes show). Threads that return early drop out of the block's and the
 * warp's barriers (as exited threads do on sm_70+). A barrier that waits
 * more than CUDA_EMU_BARRIER_TIMEOUT_S seconds aborts: a divergent
 * __syncthreads() fails the test instead of hanging it.
 *
 * Not reentrant: one emu_launch at a time per process.
 */
#ifndef DP_TESTS_CUDA_EMU_HPP
#define DP_TESTS_CUDA_EMU_HPP

#if defined(__CUDACC__)
#error "cuda_emu.hpp emulates CUDA for host compilers; do not include it under nvcc"
#endif

#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static /* one block runs at a time: a static is per block */
#define __align__(n) __attribute__((aligned(n)))

#ifndef CUDA_EMU_BARRIER_TIMEOUT_S
#define CUDA_EMU_BARRIER_TIMEOUT_S 120
#endif

// --- built-in types and variables --------------------------------------------------------------

struct uint3 { unsigned x, y, z; };
/* CUDA's vector types with their alignment; may_alias because kernels
 * reinterpret uint16_t / float arrays through them (fine under nvcc). */
struct __attribute__((may_alias, aligned(8))) uint2 { unsigned x, y; };
struct __attribute__((may_alias, aligned(8))) float2 { float x, y; };
struct __attribute__((may_alias, aligned(16))) float4 { float x, y, z, w; };
inline float2 make_float2(float x, float y) { return float2{x, y}; }
struct __attribute__((may_alias, aligned(16))) uint4 { unsigned x, y, z, w; };
inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

/* bfloat16 storage only: the kernels compute their own bits. */
struct __attribute__((may_alias)) __nv_bfloat16 { uint16_t x; };
static_assert(sizeof(__nv_bfloat16) == 2 && std::is_trivially_copyable<__nv_bfloat16>::value,
              "__nv_bfloat16 must be 2 trivially copyable bytes");

constexpr int warpSize = 32;
inline thread_local uint3 threadIdx = {0, 0, 0};
/* Set by emu_launch before a block's threads start (thread creation orders it). */
inline uint3 blockIdx = {0, 0, 0}, blockDim = {1, 1, 1}, gridDim = {1, 1, 1};

namespace cuda_emu {

[[noreturn]] inline void fail(const char *what, const char *detail)
{
    static std::mutex once; /* one message, even when every lane fails */
    once.lock();
    fprintf(stderr, "cuda_emu: %s: %s (block %u, thread %u)\n", what, detail, blockIdx.x,
            threadIdx.x);
    fflush(stderr);
    abort();
}

/* Reusable barrier (generation counter); leave() drops an exited thread. */
class barrier {
    std::mutex m_;
    std::condition_variable cv_;
    unsigned count_ = 0, arrived_ = 0;
    unsigned long gen_ = 0;

    void release() { arrived_ = 0, gen_++, cv_.notify_all(); }

  public:
    void init(unsigned n) { count_ = n; }
    void wait(const char *who)
    {
        std::unique_lock<std::mutex> l(m_);
        const unsigned long g = gen_;
        if (++arrived_ == count_) return release();
        /* system_clock: pthread_cond_timedwait, which every TSan intercepts */
        const auto until = std::chrono::system_clock::now() +
                           std::chrono::seconds(CUDA_EMU_BARRIER_TIMEOUT_S);
        if (!cv_.wait_until(l, until, [&] { return gen_ != g; }))
            fail(who, "barrier timed out: not every live thread reached it (divergent barrier?)");
    }
    void leave()
    {
        std::lock_guard<std::mutex> l(m_);
        count_--;
        if (arrived_ && arrived_ == count_) release();
    }
};

/* The running block: its barriers, shuffle slots and shared memory. */
struct block_ctx {
    barrier block;
    std::unique_ptr<barrier[]> warp;
    std::unique_ptr<uint64_t[]> slot; /* 32 per warp, 8 bytes each (double shuffles) */
    std::unique_ptr<uint32_t[]> mma;  /* 32 per warp, 6 words each (an mma's a and b) */
    unsigned char *smem_end = nullptr;
    unsigned char *smem = nullptr;
};
inline block_ctx *cur = nullptr;

inline unsigned lane() { return threadIdx.x % 32; }
inline unsigned warp_id() { return threadIdx.x / 32; }

inline void full_mask(unsigned mask, const char *who)
{
    if (mask != 0xffffffffu) fail(who, "only the full mask 0xffffffff is emulated");
}

/* Write own value, barrier, read lane src's, barrier (so the next
 * shuffle cannot overwrite a slot before it has been read). A source lane
 * outside the warp gives the caller's own value, as CUDA's do. */
template <class T> T shfl(unsigned mask, T v, unsigned src, const char *who)
{
    static_assert(sizeof(T) <= 8, "shuffles of up to 64 bits");
    full_mask(mask, who);
    uint64_t *s = cur->slot.get() + warp_id() * 32;
    memcpy(&s[lane()], &v, sizeof v);
    cur->warp[warp_id()].wait(who);
    T r = v;
    if (src < 32) memcpy(&r, &s[src], sizeof r);
    cur->warp[warp_id()].wait(who);
    return r;
}

template <class T> T shfl_xor(unsigned mask, T v, int laneMask)
{
    return shfl(mask, v, lane() ^ (unsigned)laneMask, "__shfl_xor_sync");
}

template <class T> T shfl_down(unsigned mask, T v, unsigned delta)
{
    return shfl(mask, v, lane() + delta, "__shfl_down_sync");
}

template <class F> struct thread_arg { const F *body; unsigned tid; };

/* A thread's cp.async copies not yet waited for (cp_async16): 16 or 4
 * bytes each, read from global memory when issued. The hardware may land
 * them any time between the issue and the wait that retires their group;
 * the emulator takes either end. Deferred (the default): written to
 * shared memory only at that wait, so a kernel that reads a tile before
 * waiting for it sees the old bytes. Eager (cp_async_eager): written at
 * the issue, so a copy into a buffer that another warp may still be
 * reading (a barrier missing before the refill) is a race TSan reports
 * and may give wrong results. */
inline bool cp_async_eager = false;
struct async_copy {
    unsigned char *dst;
    unsigned char bytes[16];
    unsigned size;
    unsigned long group;
};
inline thread_local std::vector<async_copy> async_pending;
inline thread_local unsigned long async_group = 0; /* the open (uncommitted) group */

template <class F> void *thread_main(void *p)
{
    const thread_arg<F> *a = (const thread_arg<F> *)p;
    threadIdx = uint3{a->tid, 0, 0};
    async_pending.clear();
    async_group = 0;
    (*a->body)();
    if (!async_pending.empty()) fail("cp.async", "a thread ended with copies not waited for");
    cur->warp[warp_id()].leave();
    cur->block.leave();
    return nullptr;
}

/* Implicit conversion only (no static_cast from void * and the like). */
template <class To> To conv(To v) { return v; }

} // namespace cuda_emu

inline void __syncthreads() { cuda_emu::cur->block.wait("__syncthreads"); }
inline void __syncwarp(unsigned mask = 0xffffffffu)
{
    cuda_emu::full_mask(mask, "__syncwarp");
    cuda_emu::cur->warp[cuda_emu::warp_id()].wait("__syncwarp");
}
inline float __shfl_xor_sync(unsigned m, float v, int l) { return cuda_emu::shfl_xor(m, v, l); }
inline int __shfl_xor_sync(unsigned m, int v, int l) { return cuda_emu::shfl_xor(m, v, l); }
inline unsigned __shfl_xor_sync(unsigned m, unsigned v, int l) { return cuda_emu::shfl_xor(m, v, l); }
inline double __shfl_xor_sync(unsigned m, double v, int l) { return cuda_emu::shfl_xor(m, v, l); }
/* __shfl_sync: lane src's value (src taken modulo the warp, as CUDA's). */
inline float __shfl_sync(unsigned m, float v, int src)
{
    return cuda_emu::shfl(m, v, (unsigned)src % 32u, "__shfl_sync");
}
inline double __shfl_sync(unsigned m, double v, int src)
{
    return cuda_emu::shfl(m, v, (unsigned)src % 32u, "__shfl_sync");
}
inline float __shfl_down_sync(unsigned m, float v, unsigned d) { return cuda_emu::shfl_down(m, v, d); }
inline double __shfl_down_sync(unsigned m, double v, unsigned d) { return cuda_emu::shfl_down(m, v, d); }
inline int __shfl_down_sync(unsigned m, int v, unsigned d) { return cuda_emu::shfl_down(m, v, d); }
inline unsigned __shfl_down_sync(unsigned m, unsigned v, unsigned d) { return cuda_emu::shfl_down(m, v, d); }

/* Device-scope atomics, fences and L2 loads: the host's atomics and
 * fences (the emulator's blocks run one at a time, but their threads are
 * real); an __ldcg is a load. */
inline unsigned atomicAdd(unsigned *p, unsigned v)
{
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline float __ldcg(const float *p) { return *p; }

/* cp.async.cg.shared.global [dst], [src], 16, valid ? 16 : 0: both
 * 16-byte aligned, dst in shared memory; a zero source size fills 16
 * zero bytes without reading src. */
namespace cuda_emu {
inline void cp_async(void *dst, const void *src, bool valid, unsigned size)
{
    unsigned char *q = (unsigned char *)dst;
    if ((uintptr_t)q % size || (valid && (uintptr_t)src % size))
        fail("cp.async", "addresses must be aligned to the copy's size");
    if (q < cur->smem || q + size > cur->smem_end)
        fail("cp.async", "destination outside shared memory");
    async_copy c;
    c.dst = q;
    c.size = size;
    c.group = async_group;
    if (valid) memcpy(c.bytes, src, size);
    else memset(c.bytes, 0, size);
    if (cp_async_eager) {
        memcpy(q, c.bytes, size);
        c.dst = nullptr; /* landed: only its group is left to wait for */
    }
    async_pending.push_back(c);
}
} // namespace cuda_emu
inline void dp_cp_async16(void *dst, const void *src, bool valid)
{
    cuda_emu::cp_async(dst, src, valid, 16);
}
inline void dp_cp_async4(void *dst, const void *src, bool valid)
{
    cuda_emu::cp_async(dst, src, valid, 4);
}
inline void dp_cp_async_commit() { cuda_emu::async_group++; }
/* cp.async.wait_group n: every committed group but the newest n is done
 * (copies still in the open group stay pending, as on the hardware). */
template <int N> inline void dp_cp_async_wait()
{
    std::vector<cuda_emu::async_copy> keep;
    for (const cuda_emu::async_copy &c : cuda_emu::async_pending) {
        if (c.group + N < cuda_emu::async_group) {
            if (c.dst) memcpy(c.dst, c.bytes, c.size);
        }
        else keep.push_back(c);
    }
    cuda_emu::async_pending.swap(keep);
}

/* The current block's dynamic shared memory (what nvcc's extern __shared__ gives). */
inline unsigned char *tc_shared() { return cuda_emu::cur->smem; }

// --- mma.sync and ldmatrix (backend/cuda/cuda_mma.cuh's functions) ---------------------------
/*
 * Warp collectives over the PTX ISA's fragment layouts (cuda_mma.cuh
 * lists them): each lane deposits its registers (or its row address),
 * the warp meets at a barrier, each lane computes its own outputs from
 * every lane's deposits, and the warp meets again before the slots are
 * reused. The products sum k = 0..15 in order with fmaf, starting from d.
 */
namespace cuda_emu {

inline uint16_t half_of(uint32_t w, unsigned hi) { return (uint16_t)(hi ? w >> 16 : w); }
inline float widen16(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* lane i's row address for an ldmatrix, checked: 16-byte aligned, in the
 * block's shared memory. */
inline void ldmatrix(uint32_t r[4], const void *p, bool trans)
{
    const char *who = trans ? "ldmatrix.x4.trans" : "ldmatrix.x4";
    const unsigned char *q = (const unsigned char *)p;
    if ((uintptr_t)q % 16) fail(who, "row address not 16-byte aligned");
    if (q < cur->smem || q + 16 > cur->smem_end) fail(who, "row address outside shared memory");
    uint64_t *s = cur->slot.get() + warp_id() * 32;
    s[lane()] = (uint64_t)(uintptr_t)q;
    cur->warp[warp_id()].wait(who);
    const unsigned i = lane();
    for (unsigned m = 0; m < 4; m++) {
        uint16_t lo, hi;
        if (!trans) {
            const unsigned char *row = (const unsigned char *)(uintptr_t)s[m * 8 + i / 4];
            memcpy(&lo, row + 2 * (2 * (i % 4)), 2);
            memcpy(&hi, row + 2 * (2 * (i % 4) + 1), 2);
        } else {
            const unsigned char *r0 = (const unsigned char *)(uintptr_t)s[m * 8 + 2 * (i % 4)];
            const unsigned char *r1 = (const unsigned char *)(uintptr_t)s[m * 8 + 2 * (i % 4) + 1];
            memcpy(&lo, r0 + 2 * (i / 4), 2);
            memcpy(&hi, r1 + 2 * (i / 4), 2);
        }
        r[m] = (uint32_t)lo | (uint32_t)hi << 16;
    }
    cur->warp[warp_id()].wait(who);
}

} // namespace cuda_emu

inline void dp_ldmatrix_x4(uint32_t r[4], const void *p) { cuda_emu::ldmatrix(r, p, false); }
inline void dp_ldmatrix_x4_trans(uint32_t r[4], const void *p) { cuda_emu::ldmatrix(r, p, true); }

/* cvt.rn.bf16x2.f32: round to nearest even (kernels/bf16.h's rounding),
 * NaN to the canonical 0x7fff, as the hardware does. */
inline uint32_t dp_cvt_bf16x2(float lo, float hi)
{
    const auto one = [](float f) -> uint32_t {
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        return isnan(f) ? 0x7fffu : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    };
    return one(lo) | one(hi) << 16;
}

/* ex2.approx.ftz.f32: the host's exp2f (correctly rounded or nearly; the
 * hardware's is a few ulp off), subnormal results flushed to +0. */
inline float dp_ex2(float x)
{
    const float y = exp2f(x);
    return y < 1.17549435e-38f ? 0.0f : y;
}

inline void dp_mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2])
{
    using namespace cuda_emu;
    uint32_t *x = cur->mma.get() + (size_t)warp_id() * 32 * 6;
    memcpy(x + lane() * 6, a, 16);
    memcpy(x + lane() * 6 + 4, b, 8);
    cur->warp[warp_id()].wait("mma.sync");
    float A[16][16], B[16][8];
    for (unsigned L = 0; L < 32; L++) {
        const uint32_t *w = x + L * 6;
        const unsigned g = L / 4, t = L % 4;
        for (unsigned h = 0; h < 2; h++) {
            A[g][2 * t + h] = widen16(half_of(w[0], h));
            A[g + 8][2 * t + h] = widen16(half_of(w[1], h));
            A[g][2 * t + 8 + h] = widen16(half_of(w[2], h));
            A[g + 8][2 * t + 8 + h] = widen16(half_of(w[3], h));
            B[2 * t + h][g] = widen16(half_of(w[4], h));
            B[2 * t + 8 + h][g] = widen16(half_of(w[5], h));
        }
    }
    cur->warp[warp_id()].wait("mma.sync");
    const unsigned g = lane() / 4, t = lane() % 4;
    for (unsigned e = 0; e < 4; e++) {
        const unsigned row = g + (e / 2) * 8, col = 2 * t + e % 2;
        float acc = d[e];
        for (unsigned k = 0; k < 16; k++) acc = fmaf(A[row][k], B[k][col], acc);
        d[e] = acc;
    }
}

// --- launcher ----------------------------------------------------------------------------------

/* kernel<<<grid, block, smem_bytes>>>(args...): blocks 0..grid-1 one at a
 * time, each as `block` threads with 4 MiB stacks (fragments are 1 KiB
 * each), joined before the next block starts. */
template <class... P, class... A>
void emu_launch(unsigned grid, unsigned block, size_t smem_bytes, void (*kernel)(P...),
                A... args)
{
    static_assert(sizeof...(P) == sizeof...(A), "emu_launch: wrong number of kernel arguments");
    if (grid == 0 || block == 0 || block % 32 || block > 1024)
        cuda_emu::fail("emu_launch", "grid must be > 0, block a multiple of 32 up to 1024");
    const std::tuple<P...> params(cuda_emu::conv<P>(args)...);
    const auto body = [&] { std::apply(kernel, params); };
    typedef decltype(body) F;

    const size_t bytes = (smem_bytes + 127) / 128 * 128 + 128;
    unsigned char *smem = (unsigned char *)aligned_alloc(128, bytes);
    std::vector<pthread_t> th(block);
    std::vector<cuda_emu::thread_arg<F>> targ(block);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, (size_t)4 << 20);
    gridDim = uint3{grid, 1, 1};
    blockDim = uint3{block, 1, 1};
    for (unsigned b = 0; b < grid; b++) {
        cuda_emu::block_ctx ctx;
        ctx.block.init(block);
        ctx.warp.reset(new cuda_emu::barrier[block / 32]);
        for (unsigned w = 0; w < block / 32; w++) ctx.warp[w].init(32);
        ctx.slot.reset(new uint64_t[block]());
        ctx.mma.reset(new uint32_t[(size_t)block * 6]());
        memset(smem, 0xA5, bytes);
        ctx.smem = smem;
        ctx.smem_end = smem + bytes;
        cuda_emu::cur = &ctx;
        blockIdx = uint3{b, 0, 0};
        for (unsigned t = 0; t < block; t++) {
            targ[t] = cuda_emu::thread_arg<F>{&body, t};
            if (pthread_create(&th[t], &attr, cuda_emu::thread_main<F>, &targ[t]))
                cuda_emu::fail("emu_launch", "pthread_create failed");
        }
        for (unsigned t = 0; t < block; t++) pthread_join(th[t], nullptr);
        cuda_emu::cur = nullptr;
    }
    pthread_attr_destroy(&attr);
    free(smem);
}

#endif /* DP_TESTS_CUDA_EMU_HPP */
