// Index kernels: gather and scatter_add along one axis. Copies move 32-bit words (−0 and NaN payloads
// survive); sums over repeated indices follow the plan's sorted order (see index.cuh): no atomics, the
// same bits on every run. Every kernel is correct for any 1-D grid and block; the plans size them.
#include "index.cuh"

namespace {

using capsule::thread_count;
using capsule::thread_index;

// y (outer, count, inner) = x[o, index[j], i]; with inner a multiple of 4 on aligned buffers, in 16-byte vectors.
template <typename I>
__device__ __forceinline__ void gather_words(const uint32_t* __restrict__ x, const int64_t* __restrict__ index,
                                             uint32_t* __restrict__ y, int64_t outer, int64_t size, int64_t inner,
                                             int64_t count) {
    const int64_t n = outer * count * inner;
    for (int64_t e = thread_index(); e < n; e += thread_count()) {
        const int64_t s = capsule_gather_source<I>(static_cast<I>(e), static_cast<I>(size), static_cast<I>(inner),
                                                   static_cast<I>(count), index);
        y[e] = s < 0 ? CAPSULE_QUIET_NAN_BITS : x[s];
    }
}

template <typename I>
__device__ __forceinline__ void gather_vectors(const uint32_t* __restrict__ x, const int64_t* __restrict__ index,
                                               uint32_t* __restrict__ y, int64_t outer, int64_t size, int64_t inner4,
                                               int64_t count) {
    const int64_t n = outer * count * inner4;
    for (int64_t e = thread_index(); e < n; e += thread_count()) {
        const int64_t s = capsule_gather_source<I>(static_cast<I>(e), static_cast<I>(size), static_cast<I>(inner4),
                                                   static_cast<I>(count), index);
        if (s < 0) capsule_fill4(CAPSULE_QUIET_NAN_BITS, y + 4 * e);
        else capsule_move4(x + 4 * s, y + 4 * e);
    }
}

__device__ __forceinline__ void gather(const float* x_, const int64_t* __restrict__ index, float* y_, int64_t outer,
                                       int64_t size, int64_t inner, int64_t count) {
    const uint32_t* __restrict__ x = reinterpret_cast<const uint32_t*>(x_);
    uint32_t* __restrict__ y = reinterpret_cast<uint32_t*>(y_);
    const bool fit = capsule_gather_fit32(outer, size, inner, count);
    if (inner % 4 == 0 && capsule_aligned16(x) && capsule_aligned16(y)) {
        if (fit) gather_vectors<uint32_t>(x, index, y, outer, size, inner / 4, count);
        else gather_vectors<int64_t>(x, index, y, outer, size, inner / 4, count);
    } else if (fit) {
        gather_words<uint32_t>(x, index, y, outer, size, inner, count);
    } else {
        gather_words<int64_t>(x, index, y, outer, size, inner, count);
    }
}

// out (outer, size, inner) = base (or 0) + the sum of src (outer, count, inner) over each element's segment.
template <typename I>
__device__ __forceinline__ void segment_threads(const float* __restrict__ base, const float* __restrict__ src,
                                                const int64_t* __restrict__ order, const int64_t* __restrict__ starts,
                                                float* __restrict__ out, int64_t outer, int64_t size, int64_t inner,
                                                int64_t count) {
    const int64_t n = outer * size * inner;
    for (int64_t e = thread_index(); e < n; e += thread_count()) {
        const CapsuleSegment seg = capsule_segment<I>(static_cast<I>(e), static_cast<I>(size), static_cast<I>(inner), count, starts);
        out[e] = capsule_segment_sum(base ? base[e] : 0.0f, src, order, seg, inner, count, 0, 1);
    }
}

// A warp per element: lane l sums terms l, l + 32, ... of the segment, then a fixed xor-shuffle tree.
template <typename I>
__device__ __forceinline__ void segment_warps(const float* __restrict__ base, const float* __restrict__ src,
                                              const int64_t* __restrict__ order, const int64_t* __restrict__ starts,
                                              float* __restrict__ out, int64_t outer, int64_t size, int64_t inner,
                                              int64_t count) {
    const int64_t n = outer * size * inner;
    const int lane = static_cast<int>(threadIdx.x) & 31;
    for (int64_t e = thread_index() / 32; e < n; e += thread_count() / 32) {
        const CapsuleSegment seg = capsule_segment<I>(static_cast<I>(e), static_cast<I>(size), static_cast<I>(inner), count, starts);
        float acc = capsule_segment_sum(0.0f, src, order, seg, inner, count, lane, 32);
        acc = capsule::group_sum_rn<32>(acc);
        if (lane == 0) out[e] = base ? capsule::add_rn(base[e], acc) : acc;
    }
}

__device__ __forceinline__ void segment_sum(const float* base, const float* src, const int64_t* order,
                                            const int64_t* starts, float* out, int64_t outer, int64_t size,
                                            int64_t inner, int64_t count) {
    const bool fit = capsule_gather_fit32(outer, size, inner, count);
    if (capsule_segment_warp_mode(size, inner, count, blockDim.x)) {
        if (fit) segment_warps<uint32_t>(base, src, order, starts, out, outer, size, inner, count);
        else segment_warps<int64_t>(base, src, order, starts, out, outer, size, inner, count);
    } else if (fit) {
        segment_threads<uint32_t>(base, src, order, starts, out, outer, size, inner, count);
    } else {
        segment_threads<int64_t>(base, src, order, starts, out, outer, size, inner, count);
    }
}

}  // namespace

extern "C" __global__ void
capsule_gather_fwd(const float* __restrict__ x, const int64_t* __restrict__ index, float* __restrict__ y,
                   int64_t outer, int64_t size, int64_t inner, int64_t count) {
    gather(x, index, y, outer, size, inner, count);
}

extern "C" __global__ void
capsule_gather_bwd(const float* __restrict__ g, const int64_t* __restrict__ order, const int64_t* __restrict__ starts,
                   float* __restrict__ dx, int64_t outer, int64_t size, int64_t inner, int64_t count) {
    segment_sum(nullptr, g, order, starts, dx, outer, size, inner, count);
}

extern "C" __global__ void
capsule_scatter_add_fwd(const float* __restrict__ base, const float* __restrict__ src,
                        const int64_t* __restrict__ order, const int64_t* __restrict__ starts, float* __restrict__ y,
                        int64_t outer, int64_t size, int64_t inner, int64_t count) {
    segment_sum(base, src, order, starts, y, outer, size, inner, count);
}

// dbase = g (a flat copy, 16-byte vectors and a scalar tail), then dsrc = g gathered at the index.
extern "C" __global__ void
capsule_scatter_add_bwd(const float* __restrict__ g, const int64_t* __restrict__ index, float* __restrict__ dbase,
                        float* __restrict__ dsrc, int64_t outer, int64_t size, int64_t inner, int64_t count) {
    const uint32_t* __restrict__ gw = reinterpret_cast<const uint32_t*>(g);
    uint32_t* __restrict__ dbw = reinterpret_cast<uint32_t*>(dbase);
    const int64_t n = outer * size * inner;
    int64_t head = 0;
    if (capsule_aligned16(gw) && capsule_aligned16(dbw)) {
        head = n / 4 * 4;
        for (int64_t v = thread_index(); v < n / 4; v += thread_count()) capsule_move4(gw + 4 * v, dbw + 4 * v);
    }
    for (int64_t e = head + thread_index(); e < n; e += thread_count()) dbw[e] = gw[e];
    gather(g, index, dsrc, outer, size, inner, count);
}
