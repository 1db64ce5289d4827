// Host harness of cuda/reduce.cuh: the mean's 1/n, the chunking, the path choice and the index
// arithmetic of the backward, callable from ctypes.
#include "reduce.cuh"

extern "C" float host_inverse_count(int64_t n) { return capsule_inverse_count(n); }

extern "C" void host_mean(const float* sums, int64_t count, int64_t n, float* out) {
    const float inverse = capsule_inverse_count(count);
    for (int64_t k = 0; k < n; ++k) out[k] = capsule_mean(sums[k], inverse);
}

// The kernel's path for a launch: chunks, span, path, lanes and batch (row group), tile width and depth.
extern "C" void host_reduce_path(int64_t size, int64_t inner, int64_t chunk, int threads, int64_t* out) {
    const int64_t span = capsule_reduce_span(size, chunk);
    out[0] = capsule_reduce_chunks(size, chunk);
    out[1] = span;
    out[2] = capsule_reduce_path(span, inner);
    out[3] = capsule_reduce_lanes(span);
    out[4] = capsule_tile_width(inner);
    out[5] = capsule_tile_depth(inner, threads);
    out[6] = capsule_reduce_batch(span);
}

extern "C" int host_reduce_threads() { return CAPSULE_REDUCE_THREADS; }

// Segments 0..count-1 of a chunked axis as (outer, start, length) triples.
extern "C" void host_segments(int64_t size, int64_t chunk, int64_t count, int64_t* out) {
    const int64_t chunks = capsule_reduce_chunks(size, chunk);
    const int64_t span = capsule_reduce_span(size, chunk);
    for (int64_t q = 0; q < count; ++q) {
        const CapsuleSegment s = capsule_reduce_segment(q, size, span, chunks);
        out[3 * q] = s.outer;
        out[3 * q + 1] = s.start;
        out[3 * q + 2] = s.length;
    }
}

// The backward's walk: from `first`, `count` groups of 4 positions `stride` groups apart,
// stepped as the kernel steps them; out gets the source index of each of the 4 * count elements.
extern "C" void host_broadcast_walk(int64_t first, int64_t stride, int64_t count, int64_t size, int64_t inner,
                                    int64_t* out) {
    CapsulePosition p = capsule_position(4 * first, size, inner);
    const CapsulePosition step = capsule_position(4 * stride, size, inner);
    for (int64_t q = 0; q < count; ++q) {
        CapsulePosition r = p;
        for (int k = 0; k < 4; ++k) {
            out[4 * q + k] = capsule_broadcast_source(r, inner);
            capsule_position_next(r, size, inner);
        }
        capsule_position_add(p, step, size, inner);
    }
}

extern "C" void host_reduce_split(uint64_t addr, int64_t len, int64_t* out) {
    const CapsuleSplit split = capsule_reduce_split(addr, len);
    out[0] = split.head;
    out[1] = split.body4;
}
