// A CPU emulator of the CUDA device features the kernels use, to run a family's .cu file,
// unchanged, on a machine without a GPU: compile it as C++ with this header forced in
// (g++ -std=c++20 -include cuda_emu.h -x c++ cuda/<family>.cu) plus a driver that calls
// capsule_emu::launch(grid, block, dynamic_shared_bytes, kernel, args...).
//
// Each CUDA thread of a block is a fiber (ucontext) on one OS thread, run round-robin by a
// scheduler; blocks run one after another over 3-D grids and blocks. __syncthreads is a barrier of
// the block's fibers and __shfl_xor_sync (of any value up to 8 bytes: float, int, long long,
// double) a barrier of the warp's 32 fibers around an exchange buffer, warps made of consecutive
// linear thread indices as on a GPU. A kernel whose threads reach a barrier or a shuffle
// divergently deadlocks, which the scheduler detects and reports (capsule_emu::deadlocked).
// __shared__ variables are static (one block at a time); dynamic shared memory is reached through
// the CAPSULE_EMU_DYNAMIC_SHARED_{BYTES,PTR} hook (spectral.cu), zeroed at each launch. float2,
// float4, __ldg and sincospi(f) are the host's.
// This checks the kernels' logic (index arithmetic, paths, grid-stride loops, reductions, the
// handling of NaN and alignment) with the host's libm; it says nothing of timing or races.
#pragma once

#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

struct alignas(8) float2 {
    float x, y;
};

struct alignas(16) float4 {
    float x, y, z, w;
};

inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

template <class T>
inline T __ldg(const T* p) { return *p; }

inline void sincospi(double a, double* s, double* c) {
    *s = std::sin(M_PI * a);
    *c = std::cos(M_PI * a);
}

inline void sincospif(float a, float* s, float* c) {
    *s = static_cast<float>(std::sin(M_PI * static_cast<double>(a)));
    *c = static_cast<float>(std::cos(M_PI * static_cast<double>(a)));
}

namespace capsule_emu {

struct Barrier {
    unsigned size = 0;
    unsigned arrived = 0;
    unsigned long generation = 0;
};

struct Fiber {
    ucontext_t context;
    dim3 thread;
    unsigned linear = 0;  // threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)
    bool done = false;
};

constexpr size_t kStackBytes = 64 * 1024;

struct Warp {
    Barrier barrier;
    uint64_t exchange[32];
};

inline ucontext_t scheduler;
inline std::vector<std::vector<char>> stacks;  // reused from block to block
inline Fiber* current = nullptr;
inline Barrier block_barrier;
inline std::vector<Warp> warps;
inline bool progress = false;
inline bool deadlocked = false;
inline dim3 block_index, block_dim, grid_dim;
inline std::vector<unsigned char> dynamic_shared;
inline unsigned dynamic_bytes = 0;

inline void yield() { swapcontext(&current->context, &scheduler); }

inline void wait(Barrier& b) {
    const unsigned long generation = b.generation;
    progress = true;
    if (++b.arrived == b.size) {
        b.arrived = 0;
        ++b.generation;
        return;
    }
    while (b.generation == generation) yield();
}

inline void sync_block() { wait(block_barrier); }

template <class T>
inline T shfl_xor(T v, int offset) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= sizeof(uint64_t), "a shuffle moves up to 8 bytes");
    const unsigned lane = current->linear & 31u;
    Warp& w = warps[current->linear >> 5];
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof v);
    wait(w.barrier);  // every lane has finished reading the previous exchange
    w.exchange[lane] = bits;
    wait(w.barrier);
    bits = w.exchange[lane ^ static_cast<unsigned>(offset)];
    T r;
    std::memcpy(&r, &bits, sizeof r);
    return r;
}

template <class F>
struct Entry {
    static inline F* body = nullptr;
    static void run() {
        (*body)();
        current->done = true;
        progress = true;
        swapcontext(&current->context, &scheduler);
    }
};

// Runs one block of n threads to completion; false when they deadlocked.
template <class Body>
bool run_block(unsigned n) {
    std::vector<Fiber> threads(n);
    if (stacks.size() < n) stacks.resize(n);
    block_barrier = Barrier{n, 0, 0};
    warps.assign((n + 31) / 32, Warp{});
    for (unsigned w = 0; w < warps.size(); ++w) warps[w].barrier.size = (w + 1) * 32 <= n ? 32 : n - w * 32;
    for (unsigned t = 0; t < n; ++t) {
        Fiber& f = threads[t];
        f.thread = dim3{t % block_dim.x, (t / block_dim.x) % block_dim.y, t / (block_dim.x * block_dim.y)};
        f.linear = t;
        stacks[t].resize(kStackBytes);
        getcontext(&f.context);
        f.context.uc_stack.ss_sp = stacks[t].data();
        f.context.uc_stack.ss_size = kStackBytes;
        f.context.uc_link = &scheduler;
        makecontext(&f.context, &Entry<Body>::run, 0);
    }
    unsigned live = n;
    while (live > 0) {
        progress = false;
        live = 0;
        for (Fiber& f : threads) {
            if (f.done) continue;
            current = &f;
            swapcontext(&scheduler, &f.context);
            if (!f.done) ++live;
        }
        if (live > 0 && !progress) {
            // Every live fiber waits at a barrier that cannot complete: abandon them (their
            // stacks hold nothing to destroy).
            return false;
        }
    }
    return true;
}

// Runs kernel(args...) over grid x block with `shared` bytes of dynamic shared memory; false when
// the threads deadlocked at a barrier or a shuffle (a divergent barrier: undefined behaviour on a GPU).
template <class... P, class... A>
bool launch(dim3 grid, dim3 block, unsigned shared, void (*kernel)(P...), A... args) {
    deadlocked = false;
    grid_dim = grid;
    block_dim = block;
    dynamic_bytes = shared;
    dynamic_shared.assign(shared + 16, 0);
    auto body = [&]() { kernel(args...); };
    using Body = decltype(body);
    Entry<Body>::body = &body;
    const unsigned n = block.x * block.y * block.z;
    for (unsigned bz = 0; bz < grid.z && !deadlocked; ++bz)
        for (unsigned by = 0; by < grid.y && !deadlocked; ++by)
            for (unsigned bx = 0; bx < grid.x && !deadlocked; ++bx) {
                block_index = dim3{bx, by, bz};
                deadlocked = !run_block<Body>(n);
            }
    return !deadlocked;
}

}  // namespace capsule_emu

#define threadIdx (capsule_emu::current->thread)
#define blockIdx (capsule_emu::block_index)
#define blockDim (capsule_emu::block_dim)
#define gridDim (capsule_emu::grid_dim)
#define CAPSULE_EMU_DYNAMIC_SHARED_BYTES (capsule_emu::dynamic_bytes)
#define CAPSULE_EMU_DYNAMIC_SHARED_PTR (capsule_emu::dynamic_shared.data())

inline void __syncthreads() { capsule_emu::sync_block(); }

template <class T>
inline T __shfl_xor_sync(unsigned, T v, int offset) { return capsule_emu::shfl_xor(v, offset); }
