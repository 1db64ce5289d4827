// rand_uniform and bernoulli_mask: element i of the output is a function of (seed, i) alone
// (cuda/random.cuh), so any launch configuration gives the same bits. Each thread writes 4
// consecutive elements, one float4 store when y is 16-byte aligned.
// Launch contract: at most CAPSULE_RANDOM_THREADS threads per block; any grid size.
#include "random.cuh"

namespace {

// Writes draw(key, i) for i in [0, n): BERNOULLI thresholds the uniform value at p.
template <bool BERNOULLI>
__device__ void draw(float* __restrict__ y, uint64_t seed, float p, int64_t n) {
    const uint64_t key = capsule_stream_key(seed);
    const bool vector = capsule::aligned16(y);
    CAPSULE_GRID_STRIDE(q, (n + 3) / 4) {
        const int64_t e = 4 * q;
        float v[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const float u = capsule_keyed_uniform(key, static_cast<uint64_t>(e + k));
            v[k] = BERNOULLI ? capsule_bernoulli(u, p) : u;
        }
        capsule::store4_upto(y, e, n, vector, v);
    }
}

}  // namespace

extern "C" __global__ __launch_bounds__(CAPSULE_RANDOM_THREADS) void
    capsule_rand_uniform_fwd(float* __restrict__ y, uint64_t seed, int64_t n) {
    draw<false>(y, seed, 0.0f, n);
}

extern "C" __global__ __launch_bounds__(CAPSULE_RANDOM_THREADS) void
    capsule_bernoulli_mask_fwd(float* __restrict__ y, uint64_t seed, float p, int64_t n) {
    draw<true>(y, seed, p, n);
}
