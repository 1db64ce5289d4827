// Host build of cuda/index.cuh's index arithmetic and of the sum mode the segment kernels of
// cuda/index.cu choose from their arguments, callable from ctypes.

#include "index.cuh"

extern "C" int host_segment_warp_mode(int64_t size, int64_t inner, int64_t count, int64_t block) {
    return capsule_segment_warp_mode(size, inner, count, block) ? 1 : 0;
}

// The segment of element e: [lo, hi, src_base].
extern "C" void host_segment(int64_t e, int64_t size, int64_t inner, int64_t count, const int64_t* starts, int64_t* out) {
    const CapsuleSegment seg = capsule_segment<int64_t>(e, size, inner, count, starts);
    out[0] = seg.lo;
    out[1] = seg.hi;
    out[2] = seg.src_base;
}

extern "C" int64_t host_gather_source(int64_t e, int64_t size, int64_t inner, int64_t count, const int64_t* index, int use32) {
    if (use32) return capsule_gather_source<uint32_t>(static_cast<uint32_t>(e), static_cast<uint32_t>(size),
                                                      static_cast<uint32_t>(inner), static_cast<uint32_t>(count), index);
    return capsule_gather_source<int64_t>(e, size, inner, count, index);
}
