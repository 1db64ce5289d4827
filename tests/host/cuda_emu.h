// A CPU emulator of the CUDA device features the reduction kernels use, to run a family's .cu
// file, unchanged, on a machine without a GPU: compile it as C++ with this header forced in
// (g++ -std=c++20 -include cuda_emu.h -x c++ cuda/<family>.cu) plus a driver that calls
// capsule_emu::launch(grid, block, kernel, args...).
//
// Each CUDA thread of a block is a fiber (ucontext) on one OS thread, run round-robin by a
// scheduler; blocks run one after another. __syncthreads is a barrier of the block's fibers and
// __shfl_xor_sync a barrier of the warp's 32 fibers around an exchange buffer, so a kernel whose
// threads reach a barrier or a shuffle divergently deadlocks, which the scheduler detects and
// reports (capsule_emu::deadlocked). __shared__ variables are static (one block at a time).
// This checks the kernels' logic (index arithmetic, paths, grid-stride loops, reductions, the
// handling of NaN and alignment) with the host's expf/logf; it says nothing of timing or races.
#pragma once

#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
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

struct alignas(16) float4 {
    float x, y, z, w;
};

inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

namespace capsule_emu {

struct Barrier {
    unsigned size = 0;
    unsigned arrived = 0;
    unsigned long generation = 0;
};

struct Fiber {
    ucontext_t context;
    dim3 thread;
    bool done = false;
};

constexpr size_t kStackBytes = 64 * 1024;

struct Warp {
    Barrier barrier;
    float exchange[32];
};

inline ucontext_t scheduler;
inline std::vector<std::vector<char>> stacks;  // reused from block to block
inline Fiber* current = nullptr;
inline Barrier block_barrier;
inline std::vector<Warp> warps;
inline bool progress = false;
inline bool deadlocked = false;
inline dim3 block_index, block_dim, grid_dim;

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

inline float shfl_xor(float v, int offset) {
    const unsigned lane = current->thread.x & 31u;
    Warp& w = warps[current->thread.x >> 5];
    wait(w.barrier);  // every lane has finished reading the previous exchange
    w.exchange[lane] = v;
    wait(w.barrier);
    return w.exchange[lane ^ static_cast<unsigned>(offset)];
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

// Runs kernel(args...) over grid x block (1-D); false when the threads deadlocked at a barrier
// or a shuffle (a divergent barrier: undefined behaviour on a GPU).
template <class... P, class... A>
bool launch(unsigned grid, unsigned block, void (*kernel)(P...), A... args) {
    deadlocked = false;
    grid_dim = dim3{grid, 1, 1};
    block_dim = dim3{block, 1, 1};
    auto body = [&]() { kernel(args...); };
    using Body = decltype(body);
    Entry<Body>::body = &body;
    for (unsigned b = 0; b < grid && !deadlocked; ++b) {
        block_index = dim3{b, 1, 1};
        std::vector<Fiber> threads(block);
        if (stacks.size() < block) stacks.resize(block);
        block_barrier = Barrier{block, 0, 0};
        warps.assign((block + 31) / 32, Warp{});
        for (unsigned w = 0; w < warps.size(); ++w) warps[w].barrier.size = (w + 1) * 32 <= block ? 32 : block - w * 32;
        for (unsigned t = 0; t < block; ++t) {
            Fiber& f = threads[t];
            f.thread = dim3{t, 1, 1};
            stacks[t].resize(kStackBytes);
            getcontext(&f.context);
            f.context.uc_stack.ss_sp = stacks[t].data();
            f.context.uc_stack.ss_size = kStackBytes;
            f.context.uc_link = &scheduler;
            makecontext(&f.context, &Entry<Body>::run, 0);
        }
        unsigned live = block;
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
                deadlocked = true;
                break;
            }
        }
    }
    return !deadlocked;
}

}  // namespace capsule_emu

#define threadIdx (capsule_emu::current->thread)
#define blockIdx (capsule_emu::block_index)
#define blockDim (capsule_emu::block_dim)
#define gridDim (capsule_emu::grid_dim)

inline void __syncthreads() { capsule_emu::sync_block(); }

inline float __shfl_xor_sync(unsigned, float v, int offset) { return capsule_emu::shfl_xor(v, offset); }
