// What the host harnesses of the view and index kernels (which replay each kernel's items one
// after another) share: a count of misaligned 16-byte accesses and the warp's shuffle tree.
//
// Include it before the family's header: every 16-byte access the replayed kernels make is counted
// here (through the headers' CAPSULE_HOST_CHECK_ALIGNED hook) when its address is not 16-byte
// aligned (on the GPU it would fault); the tests read the count after each replay.
#pragma once

#include <cstdint>

namespace capsule_replay {

inline int64_t misaligned = 0;

inline void check_aligned(const void* a, const void* b) {
    if ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b)) & 15u) ++misaligned;
}

// The device's xor-shuffle tree over a warp's 32 partial sums: lane l adds lane l ^ d, d = 16 ... 1.
inline float tree32(float* p) {
    float next[32];
    for (int d = 16; d > 0; d >>= 1) {
        for (int l = 0; l < 32; ++l) next[l] = p[l] + p[l ^ d];
        for (int l = 0; l < 32; ++l) p[l] = next[l];
    }
    return p[0];
}

}  // namespace capsule_replay

#define CAPSULE_HOST_CHECK_ALIGNED(a, b) capsule_replay::check_aligned(a, b)

// Misaligned 16-byte accesses since the last call (and reset).
extern "C" int64_t host_misaligned_accesses() {
    const int64_t n = capsule_replay::misaligned;
    capsule_replay::misaligned = 0;
    return n;
}
