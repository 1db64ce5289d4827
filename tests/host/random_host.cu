// Host harness of cuda/random.cuh: the keyed stream and the Bernoulli threshold, callable from ctypes.
#include "random.cuh"

extern "C" void host_keyed_uniform(uint64_t seed, int64_t n, float* out) {
    const uint64_t key = capsule_stream_key(seed);
    for (int64_t i = 0; i < n; ++i) out[i] = capsule_keyed_uniform(key, static_cast<uint64_t>(i));
}

extern "C" void host_bernoulli(uint64_t seed, float p, int64_t n, float* out) {
    const uint64_t key = capsule_stream_key(seed);
    for (int64_t i = 0; i < n; ++i) out[i] = capsule_bernoulli(capsule_keyed_uniform(key, static_cast<uint64_t>(i)), p);
}

extern "C" float host_bernoulli_threshold(float u, float p) { return capsule_bernoulli(u, p); }

extern "C" int host_random_threads() { return CAPSULE_RANDOM_THREADS; }
