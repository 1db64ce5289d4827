// rand_uniform and bernoulli_mask: the spec's SplitMix64 counter stream (common.cuh) with its
// key computed once per thread, and the Bernoulli threshold; shared by cuda/random.cu and its
// host tests.
#pragma once

#include <cstdint>

#include "common.cuh"

// Threads per block of the family's kernels (the plans launch exactly this many).
constexpr int CAPSULE_RANDOM_THREADS = 256;

// key = mix(seed): element i then draws r_i = low 32 bits of mix(key + i).
CAPSULE_HD uint64_t capsule_stream_key(uint64_t seed) { return capsule_splitmix64(seed); }

// u_i = (r_i >> 8) * 2^-24 from the key: equal to capsule_uniform(capsule_stream_bits(seed, i)).
CAPSULE_HD float capsule_keyed_uniform(uint64_t key, uint64_t i) {
    return capsule_uniform(static_cast<uint32_t>(capsule_splitmix64(key + i)));
}

// 1.0 where u < p, else 0.0, with no 1/p rescaling: p = 0 gives zeros and p = 1 ones (u < 1).
CAPSULE_HD float capsule_bernoulli(float u, float p) { return u < p ? 1.0f : 0.0f; }
