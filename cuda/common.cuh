// Shared by every kernel family: index arithmetic, the grid-stride loop and the SplitMix64 stream.
// Per-element math is __host__ __device__ so that the tests compile it for the host too.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define CAPSULE_HD __host__ __device__ __forceinline__
#else
#define CAPSULE_HD inline
#endif

// Grid-stride loop over [0, n) with 64-bit indices: correct for any grid size and any n.
#define CAPSULE_GRID_STRIDE(i, n)                                                              \
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);   \
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// SplitMix64 finaliser (Steele, Lea, Flood 2014): the spec's mix(z), all arithmetic mod 2^64.
CAPSULE_HD uint64_t capsule_splitmix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Element i of the counter stream of `seed`: the low 32 bits of mix(mix(seed) + i).
CAPSULE_HD uint32_t capsule_stream_bits(uint64_t seed, uint64_t i) {
    return static_cast<uint32_t>(capsule_splitmix64(capsule_splitmix64(seed) + i));
}

// u = (r >> 8) * 2^-24: 24 random bits, exactly representable, in [0, 1).
CAPSULE_HD float capsule_uniform(uint32_t r) {
    return static_cast<float>(r >> 8) * 5.9604644775390625e-08f;
}

// Output length of conv and the pools: floor((in + 2p - k) / s) + 1, or 0 when in + 2p < k.
CAPSULE_HD int64_t capsule_window_out_len(int64_t in, int64_t k, int64_t s, int64_t p) {
    const int64_t span = in + 2 * p - k;
    return span < 0 ? 0 : span / s + 1;
}

// Output length of conv_transpose: max(0, (in - 1) * s + k - 2p).
CAPSULE_HD int64_t capsule_transpose_out_len(int64_t in, int64_t k, int64_t s, int64_t p) {
    const int64_t len = (in - 1) * s + k - 2 * p;
    return len < 0 ? 0 : len;
}
