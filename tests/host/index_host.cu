// Host harness of cuda/index.cuh: each kernel of cuda/index.cu replayed on the host with the same
// per-element functions (grid-stride loops run one item after another, the warp tree lane by lane;
// replay.h: the tree, and the count of 16-byte accesses off alignment).

#include "replay.h"

#include "index.cuh"

namespace {

template <typename I>
void gather_with(const uint32_t* x, const int64_t* index, uint32_t* y, int64_t outer, int64_t size, int64_t inner,
                 int64_t count, bool vec4) {
    const int64_t width = vec4 ? inner / 4 : inner;
    for (int64_t e = 0; e < outer * count * width; ++e) {
        const int64_t s = capsule_gather_source<I>(static_cast<I>(e), static_cast<I>(size), static_cast<I>(width),
                                                   static_cast<I>(count), index);
        if (vec4) {
            if (s < 0) capsule_fill4(CAPSULE_QUIET_NAN_BITS, y + 4 * e);
            else capsule_move4(x + 4 * s, y + 4 * e);
        } else {
            y[e] = s < 0 ? CAPSULE_QUIET_NAN_BITS : x[s];
        }
    }
}

int gather(const uint32_t* x, const int64_t* index, uint32_t* y, int64_t outer, int64_t size, int64_t inner, int64_t count) {
    const bool vec4 = inner % 4 == 0 && capsule_aligned16(x) && capsule_aligned16(y);
    if (capsule_gather_fit32(outer, size, inner, count)) gather_with<uint32_t>(x, index, y, outer, size, inner, count, vec4);
    else gather_with<int64_t>(x, index, y, outer, size, inner, count, vec4);
    return vec4 ? 1 : 0;
}

template <typename I>
void segments(const float* base, const float* src, const int64_t* order, const int64_t* starts, float* out,
              int64_t outer, int64_t size, int64_t inner, int64_t count, bool warps) {
    for (int64_t e = 0; e < outer * size * inner; ++e) {
        const CapsuleSegment seg = capsule_segment<I>(static_cast<I>(e), static_cast<I>(size), static_cast<I>(inner), count, starts);
        if (warps) {
            float p[32];
            for (int lane = 0; lane < 32; ++lane) p[lane] = capsule_segment_sum(0.0f, src, order, seg, inner, count, lane, 32);
            const float total = capsule_replay::tree32(p);
            out[e] = base ? base[e] + total : total;
        } else {
            out[e] = capsule_segment_sum(base ? base[e] : 0.0f, src, order, seg, inner, count, 0, 1);
        }
    }
}

}  // namespace

// capsule_gather_fwd; returns 1 where the 16-byte path ran.
extern "C" int host_gather_fwd(const uint32_t* x, const int64_t* index, uint32_t* y, int64_t outer, int64_t size,
                               int64_t inner, int64_t count) {
    return gather(x, index, y, outer, size, inner, count);
}

// capsule_gather_bwd (base null) and capsule_scatter_add_fwd with `block` threads per block; returns
// 1 where a warp summed each element.
extern "C" int host_segment_sum(const float* base, const float* src, const int64_t* order, const int64_t* starts,
                                float* out, int64_t outer, int64_t size, int64_t inner, int64_t count, int block) {
    const bool warps = capsule_segment_warp_mode(size, inner, count, block);
    if (capsule_gather_fit32(outer, size, inner, count)) segments<uint32_t>(base, src, order, starts, out, outer, size, inner, count, warps);
    else segments<int64_t>(base, src, order, starts, out, outer, size, inner, count, warps);
    return warps ? 1 : 0;
}

extern "C" int host_segment_warp_mode(int64_t size, int64_t inner, int64_t count, int64_t block) {
    return capsule_segment_warp_mode(size, inner, count, block) ? 1 : 0;
}

// capsule_scatter_add_bwd: dbase = g, dsrc = g gathered at the index.
extern "C" void host_scatter_add_bwd(const uint32_t* g, const int64_t* index, uint32_t* dbase, uint32_t* dsrc,
                                     int64_t outer, int64_t size, int64_t inner, int64_t count) {
    const int64_t n = outer * size * inner;
    int64_t head = 0;
    if (capsule_aligned16(g) && capsule_aligned16(dbase)) {
        head = n / 4 * 4;
        for (int64_t v = 0; v < n / 4; ++v) capsule_move4(g + 4 * v, dbase + 4 * v);
    }
    for (int64_t e = head; e < n; ++e) dbase[e] = g[e];
    gather(g, index, dsrc, outer, size, inner, count);
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
