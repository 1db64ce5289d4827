// reduce_sum and reduce_mean over x viewed as (outer, size, inner); y is (outer, chunks, inner).
//
// The forward sums each chunk of `chunk` elements along the axis (chunk >= size: the whole axis,
// one chunk). A reduction with few outputs runs in two launches: chunks into a workspace of
// partial sums, then those partials (chunk = their count) into y. The mean scales by 1/count at
// the end: count = 1 (exact) for the partials, n for the final launch.
// Paths (capsule_reduce_path): inner = 1 sums contiguous segments, a group of lanes per short
// segment or a block per long one (16-byte loads, four in flight per thread); inner > 1 keeps
// threads along inner so that loads coalesce: a thread per output for short segments, else a
// block per tile of outputs. capsule_reduce_<op>_fwd takes every path (any shape); the block per
// segment, the path of long contiguous sums, also has an entry point of its own,
// capsule_reduce_<op>_fwd_block (inner = 1), built lean for twice the blocks per multiprocessor.
// Every reduction has a fixed order for a given launch: no atomics, the same bits run to run.
// Launch contract: blockDim.x a multiple of 32, at most CAPSULE_REDUCE_THREADS; any grid size.
#include "reduce.cuh"

namespace {

using capsule::block_sum;
using capsule::group_sum;

template <bool MEAN>
__device__ __forceinline__ float finish(float sum, float inverse_count) {
    return MEAN ? capsule_mean(sum, inverse_count) : sum;
}

__device__ __forceinline__ float4 add4(float4 a, float4 b) {
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

// inner = 1, short segments: G lanes per segment, several segments per warp, R segments per
// group at a time (their loads all in flight together); a lane's loads along a segment come four
// at a time, all issued before the additions (which keep the sequential order).
template <bool MEAN, int G, int R>
__device__ void row_group(const float* __restrict__ x, float* __restrict__ y, int64_t segments, int64_t size,
                          int64_t chunk, int64_t chunks, float inverse_count) {
    constexpr int per_warp = 32 / G;
    const int lane = threadIdx.x & 31;
    const int sub = lane & (G - 1);
    const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    const int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
    // The loop bound is per warp, so every lane of a warp takes part in every shuffle.
    for (int64_t base = warp * (R * per_warp); base < segments; base += warps * (R * per_warp)) {
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int64_t q = base + r * per_warp + lane / G;
            acc[r] = 0.0f;
            if (q < segments) {
                const CapsuleSegment seg = capsule_reduce_segment(q, size, chunk, chunks);
                const float* p = x + seg.outer * size + seg.start;
                int64_t j = sub;
                for (; j + 3 * G < seg.length; j += 4 * G) {
                    const float v0 = p[j], v1 = p[j + G], v2 = p[j + 2 * G], v3 = p[j + 3 * G];
                    acc[r] += v0;
                    acc[r] += v1;
                    acc[r] += v2;
                    acc[r] += v3;
                }
                for (; j < seg.length; j += G) acc[r] += p[j];
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            acc[r] = group_sum<G>(acc[r]);
            const int64_t q = base + r * per_warp + lane / G;
            if (q < segments && sub == 0) y[q] = finish<MEAN>(acc[r], inverse_count);
        }
    }
}

// inner = 1, long segments: a block per segment. The float4 body keeps four 16-byte loads in
// flight per thread: each round loads all four before the first addition (one loop test per round).
template <bool MEAN>
__device__ void row_block(const float* __restrict__ x, float* __restrict__ y, int64_t segments, int64_t size,
                          int64_t chunk, int64_t chunks, float inverse_count) {
    __shared__ float scratch[32];
    const int64_t step = blockDim.x;
    for (int64_t q = blockIdx.x; q < segments; q += gridDim.x) {
        const CapsuleSegment seg = capsule_reduce_segment(q, size, chunk, chunks);
        const float* p = x + seg.outer * size + seg.start;
        const CapsuleSplit split = capsule_reduce_split(reinterpret_cast<uintptr_t>(p), seg.length);
        float acc = 0.0f;
        for (int64_t i = threadIdx.x; i < split.head; i += step) acc += p[i];
        const float* body = p + split.head;
        float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        int64_t j = threadIdx.x;
        for (; j + 3 * step < split.body4; j += 4 * step) {
            const float4 v0 = capsule::load4(body, j);
            const float4 v1 = capsule::load4(body, j + step);
            const float4 v2 = capsule::load4(body, j + 2 * step);
            const float4 v3 = capsule::load4(body, j + 3 * step);
            a = add4(a, v0);
            a = add4(a, v1);
            a = add4(a, v2);
            a = add4(a, v3);
        }
        for (; j < split.body4; j += step) a = add4(a, capsule::load4(body, j));
        for (int64_t i = split.head + 4 * split.body4 + threadIdx.x; i < seg.length; i += step) acc += p[i];
        acc += (a.x + a.y) + (a.z + a.w);
        acc = block_sum(acc, scratch);
        if (threadIdx.x == 0) y[q] = finish<MEAN>(acc, inverse_count);
    }
}

// The block-per-segment kernel's launch: x as (outer, size) rows (inner = 1).
template <bool MEAN>
__device__ void reduce_rows(const float* __restrict__ x, float* __restrict__ y, int64_t outer, int64_t size,
                            int64_t chunk, float inverse_count) {
    const int64_t chunks = capsule_reduce_chunks(size, chunk);
    row_block<MEAN>(x, y, outer * chunks, size, capsule_reduce_span(size, chunk), chunks, inverse_count);
}

// inner > 1, short segments: a thread per output, consecutive threads along inner.
template <bool MEAN>
__device__ void column(const float* __restrict__ x, float* __restrict__ y, int64_t segments, int64_t size,
                       int64_t inner, int64_t chunk, int64_t chunks, float inverse_count) {
    CAPSULE_GRID_STRIDE(t, segments * inner) {
        const int64_t q = t / inner;
        const int64_t i = t - q * inner;
        const CapsuleSegment seg = capsule_reduce_segment(q, size, chunk, chunks);
        const float* p = x + (seg.outer * size + seg.start) * inner + i;
        float acc = 0.0f;
        for (int64_t s = 0; s < seg.length; ++s) acc += p[s * inner];
        y[t] = finish<MEAN>(acc, inverse_count);
    }
}

// inner > 1, long segments: a block per tile of `width` outputs along inner; `depth` threads
// along the axis each sum a strided share, then a tree in shared memory.
template <bool MEAN>
__device__ void tile(const float* __restrict__ x, float* __restrict__ y, int64_t segments, int64_t size,
                     int64_t inner, int64_t chunk, int64_t chunks, float inverse_count) {
    __shared__ float partial[1024];
    const int width = static_cast<int>(capsule_tile_width(inner));
    const int depth = capsule_tile_depth(inner, blockDim.x);
    const int tx = threadIdx.x % width;
    const int ty = threadIdx.x / width;
    const int64_t per_segment = (inner + width - 1) / width;
    for (int64_t t = blockIdx.x; t < segments * per_segment; t += gridDim.x) {
        const int64_t q = t / per_segment;
        const int64_t i = (t - q * per_segment) * width + tx;
        const CapsuleSegment seg = capsule_reduce_segment(q, size, chunk, chunks);
        float acc = 0.0f;
        if (ty < depth && i < inner) {
            const float* p = x + (seg.outer * size + seg.start) * inner + i;
#pragma unroll 4
            for (int64_t s = ty; s < seg.length; s += depth) acc += p[s * inner];
        }
        if (ty < depth) partial[threadIdx.x] = acc;
        __syncthreads();
        for (int half = depth / 2; half > 0; half >>= 1) {
            if (ty < half) partial[threadIdx.x] += partial[threadIdx.x + half * width];
            __syncthreads();
        }
        if (ty == 0 && i < inner) y[q * inner + i] = finish<MEAN>(partial[tx], inverse_count);
        __syncthreads();  // the next tile overwrites partial
    }
}

template <bool MEAN>
__device__ void reduce(const float* __restrict__ x, float* __restrict__ y, int64_t outer, int64_t size, int64_t inner,
                       int64_t chunk, float inverse_count) {
    const int64_t chunks = capsule_reduce_chunks(size, chunk);
    const int64_t span = capsule_reduce_span(size, chunk);
    const int64_t segments = outer * chunks;
    if (segments == 0 || inner == 0) return;  // no output (and no tile width to divide by)
    switch (capsule_reduce_path(span, inner)) {
        case CAPSULE_REDUCE_ROW_GROUP:  // lanes capsule_reduce_lanes, segments at a time capsule_reduce_batch
            switch (capsule_reduce_lanes(span)) {
                case 1: return row_group<MEAN, 1, 8>(x, y, segments, size, span, chunks, inverse_count);
                case 2: return row_group<MEAN, 2, 8>(x, y, segments, size, span, chunks, inverse_count);
                case 4: return row_group<MEAN, 4, 8>(x, y, segments, size, span, chunks, inverse_count);
                case 8: return row_group<MEAN, 8, 8>(x, y, segments, size, span, chunks, inverse_count);
                case 16: return row_group<MEAN, 16, 8>(x, y, segments, size, span, chunks, inverse_count);
                default:
                    if (span <= 32) return row_group<MEAN, 32, 8>(x, y, segments, size, span, chunks, inverse_count);
                    return row_group<MEAN, 32, 1>(x, y, segments, size, span, chunks, inverse_count);
            }
        case CAPSULE_REDUCE_ROW_BLOCK: return row_block<MEAN>(x, y, segments, size, span, chunks, inverse_count);
        case CAPSULE_REDUCE_COLUMN: return column<MEAN>(x, y, segments, size, inner, span, chunks, inverse_count);
        default: return tile<MEAN>(x, y, segments, size, inner, span, chunks, inverse_count);
    }
}

// dx at (o, s, i) = g at (o, i), times 1/n for the mean. Each thread writes 4 consecutive
// elements (one float4 when dx is 16-byte aligned) and walks its positions without dividing.
template <bool MEAN>
__device__ void broadcast_back(const float* __restrict__ g, float* __restrict__ dx, int64_t outer, int64_t size,
                               int64_t inner, float inverse_count) {
    const int64_t n = outer * size * inner;
    const int64_t groups = (n + 3) / 4;
    const int64_t first = capsule::thread_index();
    const int64_t stride = capsule::thread_count();
    if (first >= groups) return;
    const bool vector = capsule::aligned16(dx);
    CapsulePosition p = capsule_position(4 * first, size, inner);
    const CapsulePosition step = capsule_position(4 * stride, size, inner);
    for (int64_t q = first; q < groups; q += stride) {
        const int64_t e = 4 * q;
        float v[4];
        CapsulePosition r = p;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            v[k] = e + k < n ? finish<MEAN>(g[capsule_broadcast_source(r, inner)], inverse_count) : 0.0f;
            capsule_position_next(r, size, inner);
        }
        capsule::store4_upto(dx, e, n, vector, v);
        capsule_position_add(p, step, size, inner);
    }
}

}  // namespace

extern "C" __global__ __launch_bounds__(CAPSULE_REDUCE_THREADS, CAPSULE_REDUCE_BLOCKS) void
    capsule_reduce_sum_fwd(const float* __restrict__ x, float* __restrict__ y, int64_t outer, int64_t size,
                           int64_t inner, int64_t chunk) {
    reduce<false>(x, y, outer, size, inner, chunk, 1.0f);
}

extern "C" __global__ __launch_bounds__(CAPSULE_REDUCE_THREADS, CAPSULE_REDUCE_LEAN_BLOCKS) void
    capsule_reduce_sum_fwd_block(const float* __restrict__ x, float* __restrict__ y, int64_t outer, int64_t size,
                                 int64_t chunk) {
    reduce_rows<false>(x, y, outer, size, chunk, 1.0f);
}

extern "C" __global__ __launch_bounds__(CAPSULE_REDUCE_THREADS, CAPSULE_REDUCE_BLOCKS) void
    capsule_reduce_sum_bwd(const float* __restrict__ g, float* __restrict__ dx, int64_t outer, int64_t size,
                           int64_t inner) {
    broadcast_back<false>(g, dx, outer, size, inner, 1.0f);
}

extern "C" __global__ __launch_bounds__(CAPSULE_REDUCE_THREADS, CAPSULE_REDUCE_BLOCKS) void
    capsule_reduce_mean_fwd(const float* __restrict__ x, float* __restrict__ y, int64_t outer, int64_t size,
                            int64_t inner, int64_t chunk, int64_t count) {
    reduce<true>(x, y, outer, size, inner, chunk, capsule_inverse_count(count));
}

extern "C" __global__ __launch_bounds__(CAPSULE_REDUCE_THREADS, CAPSULE_REDUCE_LEAN_BLOCKS) void
    capsule_reduce_mean_fwd_block(const float* __restrict__ x, float* __restrict__ y, int64_t outer, int64_t size,
                                  int64_t chunk, int64_t count) {
    reduce_rows<true>(x, y, outer, size, chunk, capsule_inverse_count(count));
}

extern "C" __global__ __launch_bounds__(CAPSULE_REDUCE_THREADS, CAPSULE_REDUCE_BLOCKS) void
    capsule_reduce_mean_bwd(const float* __restrict__ g, float* __restrict__ dx, int64_t outer, int64_t size,
                            int64_t inner) {
    broadcast_back<true>(g, dx, outer, size, inner, capsule_inverse_count(size));
}
