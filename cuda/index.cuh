// Index arithmetic of the index kernels (cuda/index.cu): gather and scatter_add along one axis, seen
// as (outer, size, inner) for the indexed array and (outer, count, inner) for the gathered one.
// Every function here is __host__ __device__: tests/host/index_host.cu checks them on the host.
//
// Repeated indices accumulate without atomics: the plan sorts the index on the host (a stable argsort,
// "order", and CSR row starts, "starts", of length size + 1), so the entries j with index[j] = s are
// order[starts[s]] .. order[starts[s + 1] − 1], ascending in j, and each output element sums its own.
#pragma once

#include <cstdint>

#include "common.cuh"
#include "view.cuh"

#define CAPSULE_QUIET_NAN_BITS 0x7fc00000u

// Offset in x (outer, size, inner) of element e of y (outer, count, inner) = x[o, index[j], i], or −1
// when index[j] lies outside [0, size) (refused on the host; the kernel then writes NaN, never reads).
template <typename I>
CAPSULE_HD int64_t capsule_gather_source(I e, I size, I inner, I count, const int64_t* index) {
    const I row = e / inner, i = e - row * inner;
    const I o = row / count, j = row - o * count;
    const int64_t v = index[j];
    if (v < 0 || v >= static_cast<int64_t>(size)) return -1;
    return (static_cast<int64_t>(o) * static_cast<int64_t>(size) + v) * static_cast<int64_t>(inner) + static_cast<int64_t>(i);
}

// Whether every offset of a gather between x (outer, size, inner) and y (outer, count, inner) fits in 32 bits.
CAPSULE_HD bool capsule_gather_fit32(int64_t outer, int64_t size, int64_t inner, int64_t count) {
    const int64_t limit = int64_t(1) << 32;
    const int64_t big = size > count ? size : count;
    return outer * big * inner < limit;
}

// Element e of the segment-summed array (outer, size, inner): where its segment starts in `order`
// (clamped to [0, count], so a bad starts array can never send a read out of bounds) and the offset of
// its row in the source (outer, count, inner) without the index term.
struct CapsuleSegment {
    int64_t lo, hi;      // order[lo .. hi) lists the source rows j, ascending
    int64_t src_base;    // o·count·inner + i: add j·inner for the term of row j
};

template <typename I>
CAPSULE_HD CapsuleSegment capsule_segment(I e, I size, I inner, int64_t count, const int64_t* starts) {
    const I row = e / inner, i = e - row * inner;
    const I o = row / size, s = row - o * size;
    int64_t lo = starts[s], hi = starts[s + 1];
    lo = lo < 0 ? 0 : (lo > count ? count : lo);
    hi = hi < lo ? lo : (hi > count ? count : hi);
    return CapsuleSegment{lo, hi, static_cast<int64_t>(o) * count * static_cast<int64_t>(inner) + static_cast<int64_t>(i)};
}

// Offset of the term order[k] in the source, or −1 for an entry outside [0, count) (skipped).
CAPSULE_HD int64_t capsule_segment_term(const CapsuleSegment& seg, int64_t j, int64_t inner, int64_t count) {
    return (j < 0 || j >= count) ? -1 : seg.src_base + j * inner;
}

// A warp per output element, lanes splitting its segment, pays off when segments are long on average
// and rows too short (inner < 32) to give a warp's lanes distinct elements; otherwise a thread per
// element sums its segment in j order. Whole warps only (blocks of a multiple of 32 threads).
CAPSULE_HD bool capsule_segment_warp_mode(int64_t size, int64_t inner, int64_t count, int64_t block_threads) {
    return block_threads % 32 == 0 && inner < 32 && count >= 32 * size;
}

// Sum of a segment's terms in k order from `acc` (a thread's whole segment, or one lane's share:
// k = lo + lane, lo + lane + step, ...); rounding to nearest at each add.
CAPSULE_HD float capsule_segment_sum(float acc, const float* src, const int64_t* order, const CapsuleSegment& seg,
                                     int64_t inner, int64_t count, int64_t lane, int64_t step) {
    for (int64_t k = seg.lo + lane; k < seg.hi; k += step) {
        const int64_t t = capsule_segment_term(seg, order[k], inner, count);
        if (t >= 0) acc = capsule::add_rn(acc, src[t]);
    }
    return acc;
}
