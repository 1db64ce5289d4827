// The device's own yardsticks for `capsules bench`: not a capsule, no contract, no registry entry.
//
// capsule_peak_fma: the float32 FMA throughput. Each thread runs PEAK_CHAINS independent
// chains of fmaf (enough instruction-level parallelism to hide the FMA latency at full
// occupancy); each fmaf counts 2 flops, so one launch does
//     2 * PEAK_CHAINS * iterations * gridDim.x * blockDim.x   flops.
// a and b are runtime values, so nothing can be folded; the result is stored only under a
// condition the compiler cannot decide (and that never holds), so nothing is dead code either.
//
// capsule_bench_spin: one thread busy-waits `ns` nanoseconds on %globaltimer. Enqueued before a
// batch of timed launches, it keeps the GPU busy while the host enqueues the batch, so that the
// event pairs time the kernels, not the host's launch gaps (nvbench's blocking kernel, simplified).

#include <cstdint>

#define PEAK_CHAINS 8

extern "C" __global__ void capsule_peak_fma(float* __restrict__ out, float a, float b, int64_t iterations) {
    const float seed = static_cast<float>(threadIdx.x) * 1e-6f;
    float x0 = seed, x1 = seed + 0.125f, x2 = seed + 0.25f, x3 = seed + 0.375f;
    float x4 = seed + 0.5f, x5 = seed + 0.625f, x6 = seed + 0.75f, x7 = seed + 0.875f;
#pragma unroll 16
    for (int64_t i = 0; i < iterations; ++i) {
        x0 = fmaf(x0, a, b);
        x1 = fmaf(x1, a, b);
        x2 = fmaf(x2, a, b);
        x3 = fmaf(x3, a, b);
        x4 = fmaf(x4, a, b);
        x5 = fmaf(x5, a, b);
        x6 = fmaf(x6, a, b);
        x7 = fmaf(x7, a, b);
    }
    const float sum = ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7));
    if (sum == -1.0f) {  // never true for a in (0, 1), b > 0; keeps the chains alive
        out[static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x] = sum;
    }
}

__device__ __forceinline__ uint64_t capsule_globaltimer() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

extern "C" __global__ void capsule_bench_spin(int64_t ns) {
    const uint64_t start = capsule_globaltimer();
    while (capsule_globaltimer() - start < static_cast<uint64_t>(ns)) {
    }
}
