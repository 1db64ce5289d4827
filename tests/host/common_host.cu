// Host harness of cuda/common.cuh: the counter stream and the output-length rules, callable from ctypes.
#include "common.cuh"

extern "C" void host_stream_bits(uint64_t seed, int64_t n, uint32_t* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = capsule_stream_bits(seed, static_cast<uint64_t>(i));
}

extern "C" void host_uniform(uint64_t seed, int64_t n, float* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = capsule_uniform(capsule_stream_bits(seed, static_cast<uint64_t>(i)));
}

extern "C" int64_t host_window_out_len(int64_t in, int64_t k, int64_t s, int64_t p) {
    return capsule_window_out_len(in, k, s, p);
}

extern "C" int64_t host_transpose_out_len(int64_t in, int64_t k, int64_t s, int64_t p) {
    return capsule_transpose_out_len(in, k, s, p);
}
