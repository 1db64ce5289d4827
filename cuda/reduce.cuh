// reduce_sum and reduce_mean over x viewed as (outer, size, inner): the per-element math, the
// chunking of the reduced axis, the choice of kernel path and the index arithmetic of the
// backward, shared by cuda/reduce.cu and its host tests.
#pragma once

#include <cstdint>

#include "common.cuh"

// Threads per block of every kernel of the family (the plans launch exactly this many).
constexpr int CAPSULE_REDUCE_THREADS = 256;
// Blocks per multiprocessor the kernels are built for: the forward's every-path kernel and the
// backward 4 (at most 64 registers), the block-per-segment kernel 8 (the whole multiprocessor,
// at most 32 registers).
constexpr int CAPSULE_REDUCE_BLOCKS = 4;
constexpr int CAPSULE_REDUCE_LEAN_BLOCKS = 8;

// 1/n rounded once to float32 (n < 2^53 is exact in double); n = 0 gives +inf, so an empty
// mean is 0 * inf = NaN.
CAPSULE_HD float capsule_inverse_count(int64_t n) { return static_cast<float>(1.0 / static_cast<double>(n)); }

// mean = sum * (1/n), the reference's order.
CAPSULE_HD float capsule_mean(float sum, float inverse_count) { return sum * inverse_count; }

// The reduced axis is cut into chunks of `chunk` (the last one shorter); chunk <= 0 or
// chunk >= size is one chunk of the whole axis (also for size = 0, an empty sum).
CAPSULE_HD int64_t capsule_reduce_chunks(int64_t size, int64_t chunk) {
    return (chunk <= 0 || chunk >= size) ? 1 : (size + chunk - 1) / chunk;
}

// The longest segment a single output sums.
CAPSULE_HD int64_t capsule_reduce_span(int64_t size, int64_t chunk) {
    return capsule_reduce_chunks(size, chunk) == 1 ? size : chunk;
}

// Segment q (q = o * chunks + c) of a chunked axis: its first element along the axis and its length.
struct CapsuleSegment {
    int64_t outer;
    int64_t start;
    int64_t length;
};

CAPSULE_HD CapsuleSegment capsule_reduce_segment(int64_t q, int64_t size, int64_t chunk, int64_t chunks) {
    if (chunks == 1) return {q, 0, size};
    const int64_t o = q / chunks;
    const int64_t start = (q - o * chunks) * chunk;
    const int64_t rest = size - start;
    return {o, start, rest < chunk ? rest : chunk};
}

// Kernel paths.
enum CapsuleReducePath {
    CAPSULE_REDUCE_ROW_GROUP = 0,    // inner = 1, segments <= 1024: a group of 1-32 lanes per segment
    CAPSULE_REDUCE_ROW_BLOCK = 1,    // inner = 1, longer segments: a block per segment, 16-byte loads
    CAPSULE_REDUCE_COLUMN = 2,       // inner > 1, segments <= 32: a thread per output, a left fold
    CAPSULE_REDUCE_TILE = 3,         // inner > 1, longer: a block per tile of <= 32 outputs along inner
};

constexpr int64_t CAPSULE_REDUCE_GROUP_SPAN = 1024;
constexpr int64_t CAPSULE_REDUCE_COLUMN_SPAN = 32;

CAPSULE_HD int capsule_reduce_path(int64_t span, int64_t inner) {
    if (inner == 1) return span <= CAPSULE_REDUCE_GROUP_SPAN ? CAPSULE_REDUCE_ROW_GROUP : CAPSULE_REDUCE_ROW_BLOCK;
    return span <= CAPSULE_REDUCE_COLUMN_SPAN ? CAPSULE_REDUCE_COLUMN : CAPSULE_REDUCE_TILE;
}

// Lanes per segment on the row-group path: the smallest power of two >= span, at most 32.
CAPSULE_HD int capsule_reduce_lanes(int64_t span) {
    int lanes = 1;
    while (lanes < 32 && lanes < span) lanes *= 2;
    return lanes;
}

// Segments a lane group takes at a time on the row-group path: 8 for segments of one load per
// lane (at most 32 elements), else 1 (each lane already has span / 32 loads).
CAPSULE_HD int capsule_reduce_batch(int64_t span) { return span <= 32 ? 8 : 1; }

// The tile path: `width` outputs along inner per tile (all of inner when it is below 32), and
// `depth` threads along the axis, the largest power of two with width * depth <= threads.
CAPSULE_HD int64_t capsule_tile_width(int64_t inner) { return inner < 32 ? inner : 32; }

CAPSULE_HD int capsule_tile_depth(int64_t inner, int threads) {
    const int64_t width = capsule_tile_width(inner);
    int depth = 1;
    while (width * depth * 2 <= threads) depth *= 2;
    return depth;
}

// A position (o, s, i) in x viewed as (outer, size, inner), row-major.
struct CapsulePosition {
    int64_t o;
    int64_t s;
    int64_t i;
};

CAPSULE_HD CapsulePosition capsule_position(int64_t e, int64_t size, int64_t inner) {
    const int64_t slab = size * inner;
    const int64_t o = e / slab;
    const int64_t rest = e - o * slab;
    const int64_t s = rest / inner;
    return {o, s, rest - s * inner};
}

// The next element's position, without a division.
CAPSULE_HD void capsule_position_next(CapsulePosition& p, int64_t size, int64_t inner) {
    if (++p.i == inner) {
        p.i = 0;
        if (++p.s == size) {
            p.s = 0;
            ++p.o;
        }
    }
}

// p advanced by the offset whose position is d (d.s < size, d.i < inner), without a division.
CAPSULE_HD void capsule_position_add(CapsulePosition& p, const CapsulePosition& d, int64_t size, int64_t inner) {
    p.i += d.i;
    int64_t carry = p.i >= inner ? 1 : 0;
    p.i -= carry * inner;
    p.s += d.s + carry;
    carry = p.s >= size ? 1 : 0;
    p.s -= carry * size;
    p.o += d.o + carry;
}

// The backward's source: dx at (o, s, i) takes g at (o, i).
CAPSULE_HD int64_t capsule_broadcast_source(const CapsulePosition& p, int64_t inner) { return p.o * inner + p.i; }

// A segment at address `addr` (bytes, 4-aligned) split for 16-byte loads: `head` scalar elements
// up to the first 16-byte boundary, `body4` float4s, then a scalar tail from head + 4 * body4.
struct CapsuleSplit {
    int64_t head;
    int64_t body4;
};

CAPSULE_HD CapsuleSplit capsule_reduce_split(uint64_t addr, int64_t len) {
    if ((addr & 3u) != 0) return {len, 0};
    int64_t head = static_cast<int64_t>(((16u - (addr & 15u)) & 15u) >> 2);
    if (head > len) head = len;
    return {head, (len - head) / 4};
}
