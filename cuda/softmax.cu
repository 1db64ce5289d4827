// softmax, log_softmax and hard_masked_softmax over the last axis: rows x cols, cols >= 1.
//
// Three paths, each its own entry points so that registers (and occupancy) fit the path:
// - capsule_<op>_{fwd,bwd}: rows of up to CAPSULE_SOFTMAX_GROUP_COLS columns (GRAD_GROUP_COLS
//   backward): a group of lanes per row (1 to 32 lanes, several rows per warp, several warps per
//   block), the row held in registers, reductions by warp shuffles. Longer rows fall back to the
//   block path, so any shape is correct (built for 4 blocks of CAPSULE_SOFTMAX_THREADS per
//   multiprocessor, at most 64 registers).
// - capsule_<op>_{fwd,bwd}_block: one block per row, passes over the row (max, sum of exp, write;
//   backward: the dot, write) with 16-byte loads, several in flight per thread, and 16-byte
//   stores where the buffers' rows are equally aligned; block reductions through shared memory.
// - capsule_<op>_{fwd,bwd}_partials and _finish (few long rows, which would leave most of the
//   device idle with a block per row): each row cut into chunks of `chunk` columns, a block per
//   chunk. _partials writes per chunk the maximum m_c and the sum of exp(x - m_c) (forward) or
//   the partial dot (backward) into a workspace, planes of rows * chunks; _finish combines the
//   row's partials in a fixed order (every block of a row the same bits) and writes its chunk.
//   The lean kernels are built for CAPSULE_SOFTMAX_LEAN_BLOCKS blocks per multiprocessor.
// Every reduction has a fixed order for a given launch: no atomics, the same bits run to run.
// Launch contract: blockDim.x a multiple of 32, at most CAPSULE_SOFTMAX_THREADS; any grid size.
#include "softmax.cuh"

namespace {

using capsule::block_sum;
using capsule::group_sum;
using capsule::kFullMask;

// Butterfly maxima inside aligned groups of G lanes, like capsule::group_sum. Every lane ends with
// the same value: capsule_nanmax commutes but for the sign of a zero maximum and the payload of a
// NaN one, which change no result beyond the sign of a zero log_softmax.
template <int G>
__device__ __forceinline__ float group_max(float v) {
#pragma unroll
    for (int offset = G / 2; offset > 0; offset >>= 1) v = capsule_nanmax(v, __shfl_xor_sync(kFullMask, v, offset));
    return v;
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    return capsule::block_reduce(v, scratch, -INFINITY, [](float x) { return group_max<32>(x); });
}

__device__ __forceinline__ float max4(float4 v) {
    return capsule_nanmax(capsule_nanmax(v.x, v.y), capsule_nanmax(v.z, v.w));
}

// The score of entry i: x, or for the masked op x where mask != 0 and -inf elsewhere.
template <int OP>
__device__ __forceinline__ float load_score(const float* __restrict__ x, const float* __restrict__ mask, int64_t i) {
    if (OP == CAPSULE_MASKED_SOFTMAX) return capsule_masked_score(x[i], mask[i]);
    return x[i];
}

// The float4 at i (16-byte aligned), read-only.
__device__ __forceinline__ float4 load_vec4(const float* __restrict__ p, int64_t i) {
    return __ldg(reinterpret_cast<const float4*>(p + i));
}

// One 16-byte store (st.global.cg.v4.f32): a float4 assigned through a cast pointer came out as
// four 4-byte stores.
__device__ __forceinline__ void store_vec4(float* __restrict__ p, int64_t i, float4 v) {
    __stcg(reinterpret_cast<float4*>(p + i), v);
}

template <int OP>
__device__ __forceinline__ float4 load_score4(const float* __restrict__ x, const float* __restrict__ mask, int64_t i) {
    float4 v = load_vec4(x, i);
    if (OP == CAPSULE_MASKED_SOFTMAX) {
        const float4 m = load_vec4(mask, i);
        v = make_float4(capsule_masked_score(v.x, m.x), capsule_masked_score(v.y, m.y),
                        capsule_masked_score(v.z, m.z), capsule_masked_score(v.w, m.w));
    }
    return v;
}

// Visits a row (or chunk) of `len` split by `split`, each thread every blockDim.x-th element:
// one(i) for the scalar head and tail; over the float4 body load(i) then use(i, loaded), U float4s
// at a time whose loads all come first (one loop test per U: they are in flight together), then
// the rest one at a time.
template <int U, class One, class Load, class Use>
__device__ __forceinline__ void block_visit(int64_t len, CapsuleRowSplit split, One one, Load load, Use use) {
    const int64_t step = blockDim.x;
    for (int64_t i = threadIdx.x; i < split.head; i += step) one(i);
    int64_t j = threadIdx.x;
    for (; j + (U - 1) * step < split.body4; j += U * step) {
        decltype(load(int64_t{0})) v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) v[u] = load(split.head + 4 * (j + u * step));
#pragma unroll
        for (int u = 0; u < U; ++u) use(split.head + 4 * (j + u * step), v[u]);
    }
    for (; j < split.body4; j += step) use(split.head + 4 * j, load(split.head + 4 * j));
    for (int64_t i = split.head + 4 * split.body4 + threadIdx.x; i < len; i += step) one(i);
}

__device__ __forceinline__ bool same_alignment(const void* a, const void* b) {
    return ((reinterpret_cast<uintptr_t>(a) ^ reinterpret_cast<uintptr_t>(b)) & 15u) == 0;
}

// The group path's shape from cols: G lanes per row (capsule_softmax_lanes), V values per lane
// (capsule_softmax_values, at most MAX_V: one call site per shape) and R rows at a time
// (capsule_softmax_batch); calls run(GroupShape<G, V, R>{}).
template <int G_, int V_, int R_>
struct GroupShape {
    static constexpr int G = G_, V = V_, R = R_;
};

template <int MAX_V, class Run>
__device__ __forceinline__ void with_group_shape(int64_t cols, Run run) {
    switch (capsule_softmax_lanes(cols)) {
        case 1: return run(GroupShape<1, 1, 8>{});
        case 2: return run(GroupShape<2, 1, 8>{});
        case 4: return run(GroupShape<4, 1, 8>{});
        case 8: return run(GroupShape<8, 1, 8>{});
        case 16: return run(GroupShape<16, 1, 8>{});
        default: break;
    }
    switch (capsule_softmax_values(cols)) {
        case 1: return run(GroupShape<32, 1, 8>{});
        case 2: return run(GroupShape<32, 2, 4>{});
        case 4: return run(GroupShape<32, 4, 2>{});
        case 8: return run(GroupShape<32, 8, 1>{});
        case 16:
            if constexpr (MAX_V > 16) return run(GroupShape<32, 16, 1>{});
            [[fallthrough]];
        default: return run(GroupShape<32, MAX_V, 1>{});
    }
}

// -- forward ---------------------------------------------------------------------------------

// G lanes per row, V values per lane: lane `sub` of a group holds columns sub + G*k. A group
// takes R rows at a time, their loads all in flight together (short rows have few per lane).
template <int OP, int G, int V, int R>
__device__ void forward_group(const float* __restrict__ x, const float* __restrict__ mask, float* __restrict__ y,
                              int64_t rows, int64_t cols) {
    constexpr int rows_per_warp = 32 / G;
    const int lane = threadIdx.x & 31;
    const int sub = lane & (G - 1);
    const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    const int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
    // The loop bound is per warp, so every lane of a warp takes part in every shuffle.
    for (int64_t base = warp * (R * rows_per_warp); base < rows; base += warps * (R * rows_per_warp)) {
        int64_t mine[R], offset[R];
        float v[R][V], m[R], s[R], d[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int64_t row = base + r * rows_per_warp + lane / G;
            // This lane's columns of row r are sub + G*k for G*k < mine (none past the last row).
            mine[r] = row < rows ? cols - sub : 0;
            offset[r] = row < rows ? row * cols + sub : 0;
            const float* mr = OP == CAPSULE_MASKED_SOFTMAX ? mask + offset[r] : nullptr;
            m[r] = -INFINITY;
#pragma unroll
            for (int k = 0; k < V; ++k) {
                v[r][k] = G * k < mine[r] ? load_score<OP>(x + offset[r], mr, G * k) : -INFINITY;
                m[r] = capsule_nanmax(m[r], v[r][k]);
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) m[r] = group_max<G>(m[r]);
        // v becomes z = x - m (log_softmax) or e = exp(x - m), so y costs no second exp.
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float shift = capsule_row_shift(OP, m[r]);
            s[r] = 0.0f;
#pragma unroll
            for (int k = 0; k < V; ++k) {
                if (OP == CAPSULE_LOG_SOFTMAX) {
                    v[r][k] = capsule_shifted(v[r][k], shift);
                    if (G * k < mine[r]) s[r] += expf(v[r][k]);
                } else {
                    v[r][k] = capsule_exp_term(v[r][k], shift);
                    if (G * k < mine[r]) s[r] += v[r][k];
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) s[r] = group_sum<G>(s[r]);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            d[r] = OP == CAPSULE_LOG_SOFTMAX ? logf(s[r]) : capsule_row_denominator(OP, m[r], s[r]);
            float* yr = y + offset[r];
#pragma unroll
            for (int k = 0; k < V; ++k) {
                if (G * k < mine[r])
                    yr[G * k] = OP == CAPSULE_LOG_SOFTMAX ? capsule_log_softmax_from_shifted(v[r][k], d[r])
                                                          : capsule_softmax_from_exp(v[r][k], d[r]);
            }
        }
    }
}

// Passes of a block over a segment of scores (a row, or a chunk of one) at xs (mask ms),
// `split` for 16-byte accesses. Each returns this thread's share; the caller reduces the block.
// Float4s in flight per thread: 4 of x, or 2 each of x and the mask; the write pass, whose
// division has a slow-path call, 2 of x (or x and the mask) within 32 registers.
template <int OP>
constexpr int kScoreUnroll = OP == CAPSULE_MASKED_SOFTMAX ? 2 : 4;
constexpr int kWriteUnroll = 2;

template <int OP>
__device__ __forceinline__ float segment_max(const float* __restrict__ xs, const float* __restrict__ ms, int64_t len,
                                             CapsuleRowSplit split) {
    float m = -INFINITY;
    block_visit<kScoreUnroll<OP>>(
        len, split, [&](int64_t i) { m = capsule_nanmax(m, load_score<OP>(xs, ms, i)); },
        [&](int64_t i) { return load_score4<OP>(xs, ms, i); },
        [&](int64_t, float4 v) { m = capsule_nanmax(m, max4(v)); });
    return m;
}

template <int OP>
__device__ __forceinline__ float segment_exp_sum(const float* __restrict__ xs, const float* __restrict__ ms,
                                                 int64_t len, CapsuleRowSplit split, float shift) {
    float s = 0.0f;
    block_visit<kScoreUnroll<OP>>(
        len, split, [&](int64_t i) { s += capsule_exp_term(load_score<OP>(xs, ms, i), shift); },
        [&](int64_t i) { return load_score4<OP>(xs, ms, i); },
        [&](int64_t, float4 v) {
            s += (capsule_exp_term(v.x, shift) + capsule_exp_term(v.y, shift)) +
                 (capsule_exp_term(v.z, shift) + capsule_exp_term(v.w, shift));
        });
    return s;
}

// ys[i] = the row value of op; 16-byte stores on the body (ys aligned as xs where split has one).
template <int OP>
__device__ __forceinline__ void segment_write(const float* __restrict__ xs, const float* __restrict__ ms,
                                              float* __restrict__ ys, int64_t len, CapsuleRowSplit split, float shift,
                                              float d) {
    block_visit<kWriteUnroll>(
        len, split, [&](int64_t i) { ys[i] = capsule_row_value(OP, load_score<OP>(xs, ms, i), shift, d); },
        [&](int64_t i) { return load_score4<OP>(xs, ms, i); },
        [&](int64_t i, float4 v) {
            store_vec4(ys, i, make_float4(capsule_row_value(OP, v.x, shift, d), capsule_row_value(OP, v.y, shift, d),
                                          capsule_row_value(OP, v.z, shift, d), capsule_row_value(OP, v.w, shift, d)));
        });
}

// The split of a segment for 16-byte accesses: the body only where every buffer the pass touches
// is aligned as xs (ys null: none written).
template <int OP>
__device__ __forceinline__ CapsuleRowSplit segment_split(const float* xs, const float* ms, const float* ys,
                                                         int64_t len) {
    const bool vector = (ys == nullptr || same_alignment(xs, ys)) &&
                        (OP != CAPSULE_MASKED_SOFTMAX || same_alignment(xs, ms));
    return capsule_row_split(reinterpret_cast<uintptr_t>(xs), len, vector);
}

// A block per row: the maximum, the sum of exp, then the write.
template <int OP>
__device__ void forward_block(const float* __restrict__ x, const float* __restrict__ mask, float* __restrict__ y,
                              int64_t rows, int64_t cols) {
    __shared__ float scratch[32];
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* xr = x + row * cols;
        const float* mr = OP == CAPSULE_MASKED_SOFTMAX ? mask + row * cols : nullptr;
        float* yr = y + row * cols;
        const CapsuleRowSplit split = segment_split<OP>(xr, mr, yr, cols);
        const float m = block_max(segment_max<OP>(xr, mr, cols, split), scratch);
        const float shift = capsule_row_shift(OP, m);
        const float s = block_sum(segment_exp_sum<OP>(xr, mr, cols, split, shift), scratch);
        const float d = OP == CAPSULE_LOG_SOFTMAX ? logf(s) : capsule_row_denominator(OP, m, s);
        segment_write<OP>(xr, mr, yr, cols, split, shift, d);
    }
}

// Split rows, first launch: a block per chunk q = row * chunks + c writes the chunk's maximum m_c
// to partials[q] and its sum of exp(x - capsule_chunk_shift(m_c)) to partials[rows * chunks + q].
template <int OP>
__device__ void forward_partials(const float* __restrict__ x, const float* __restrict__ mask,
                                 float* __restrict__ partials, int64_t rows, int64_t cols, int64_t chunk) {
    __shared__ float scratch[32];
    const int64_t chunks = capsule_softmax_chunks(cols, chunk);
    const int64_t segments = rows * chunks;
    for (int64_t q = blockIdx.x; q < segments; q += gridDim.x) {
        const CapsuleRowSegment seg = capsule_softmax_segment(q, cols, chunk, chunks);
        const float* xs = x + seg.start;
        const float* ms = OP == CAPSULE_MASKED_SOFTMAX ? mask + seg.start : nullptr;
        const CapsuleRowSplit split = segment_split<OP>(xs, ms, nullptr, seg.length);
        const float m = block_max(segment_max<OP>(xs, ms, seg.length, split), scratch);
        const float s = block_sum(segment_exp_sum<OP>(xs, ms, seg.length, split, capsule_chunk_shift(m)), scratch);
        if (threadIdx.x == 0) {
            partials[q] = m;
            partials[segments + q] = s;
        }
    }
}

// The row maximum and sum of exp(x - shift) from the chunks' partials (pm: maxima, ps: sums), in
// a fixed order: lane l takes chunks l, l + 32, ..., then butterflies; every warp of every block of
// the row computes the same bits. Returns the row maximum, `sum` the rescaled total.
template <int OP>
__device__ __forceinline__ float combine_partials(const float* __restrict__ pm, const float* __restrict__ ps,
                                                  int64_t chunks, float& sum) {
    const int lane = threadIdx.x & 31;
    float m = -INFINITY;
    for (int64_t k = lane; k < chunks; k += 32) m = capsule_nanmax(m, pm[k]);
    m = group_max<32>(m);
    const float shift = capsule_row_shift(OP, m);
    float s = 0.0f;
    for (int64_t k = lane; k < chunks; k += 32) s += capsule_chunk_rescaled(ps[k], pm[k], shift);
    sum = group_sum<32>(s);
    return m;
}

// Split rows, second launch: a block per chunk combines its row's partials and writes the chunk.
template <int OP>
__device__ void forward_finish(const float* __restrict__ x, const float* __restrict__ mask,
                               const float* __restrict__ partials, float* __restrict__ y, int64_t rows, int64_t cols,
                               int64_t chunk) {
    const int64_t chunks = capsule_softmax_chunks(cols, chunk);
    const int64_t segments = rows * chunks;
    for (int64_t q = blockIdx.x; q < segments; q += gridDim.x) {
        const CapsuleRowSegment seg = capsule_softmax_segment(q, cols, chunk, chunks);
        const float* row_partials = partials + seg.row * chunks;
        float s;
        const float m = combine_partials<OP>(row_partials, row_partials + segments, chunks, s);
        const float shift = capsule_row_shift(OP, m);
        const float d = OP == CAPSULE_LOG_SOFTMAX ? logf(s) : capsule_row_denominator(OP, m, s);
        const float* xs = x + seg.start;
        const float* ms = OP == CAPSULE_MASKED_SOFTMAX ? mask + seg.start : nullptr;
        float* ys = y + seg.start;
        segment_write<OP>(xs, ms, ys, seg.length, segment_split<OP>(xs, ms, ys, seg.length), shift, d);
    }
}

template <int OP>
__device__ void forward(const float* __restrict__ x, const float* __restrict__ mask, float* __restrict__ y,
                        int64_t rows, int64_t cols) {
    if (cols > CAPSULE_SOFTMAX_GROUP_COLS) return forward_block<OP>(x, mask, y, rows, cols);
    with_group_shape<32>(cols, [&](auto shape) {
        using S = decltype(shape);
        forward_group<OP, S::G, S::V, S::R>(x, mask, y, rows, cols);
    });
}

// -- backward: dx from y and g, with r = sum g*y (softmax, masked) or sum g (log_softmax) -------

template <int OP, int G, int V, int R>
__device__ void backward_group(const float* __restrict__ y, const float* __restrict__ g, float* __restrict__ dx,
                               int64_t rows, int64_t cols) {
    constexpr int rows_per_warp = 32 / G;
    const int lane = threadIdx.x & 31;
    const int sub = lane & (G - 1);
    const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    const int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
    for (int64_t base = warp * (R * rows_per_warp); base < rows; base += warps * (R * rows_per_warp)) {
        int64_t mine[R], offset[R];
        float yv[R][V], gv[R][V], red[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int64_t row = base + r * rows_per_warp + lane / G;
            mine[r] = row < rows ? cols - sub : 0;
            offset[r] = row < rows ? row * cols + sub : 0;
            red[r] = 0.0f;
#pragma unroll
            for (int k = 0; k < V; ++k) {
                const bool in = G * k < mine[r];
                yv[r][k] = in ? y[offset[r] + G * k] : 0.0f;
                gv[r][k] = in ? g[offset[r] + G * k] : 0.0f;
                if (in) red[r] += capsule_grad_term(OP, yv[r][k], gv[r][k]);
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) red[r] = group_sum<G>(red[r]);
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
            for (int k = 0; k < V; ++k) {
                if (G * k < mine[r]) dx[offset[r] + G * k] = capsule_row_grad(OP, yv[r][k], gv[r][k], red[r]);
            }
        }
    }
}

// y and g as float4s at one index.
struct YG4 {
    float4 y, g;
};

// The backward's passes over a segment at ys, gs: this thread's share of the row reduction r
// (capsule_grad_term), and the write of dx. Float4s in flight per thread: 2 each of y and g.
template <int OP>
__device__ __forceinline__ float segment_dot(const float* __restrict__ ys, const float* __restrict__ gs, int64_t len,
                                             CapsuleRowSplit split) {
    float r = 0.0f;
    block_visit<2>(
        len, split, [&](int64_t i) { r += capsule_grad_term(OP, ys[i], gs[i]); },
        [&](int64_t i) { return YG4{load_vec4(ys, i), load_vec4(gs, i)}; },
        [&](int64_t, YG4 v) {
            r += (capsule_grad_term(OP, v.y.x, v.g.x) + capsule_grad_term(OP, v.y.y, v.g.y)) +
                 (capsule_grad_term(OP, v.y.z, v.g.z) + capsule_grad_term(OP, v.y.w, v.g.w));
        });
    return r;
}

template <int OP>
__device__ __forceinline__ void segment_grad(const float* __restrict__ ys, const float* __restrict__ gs,
                                             float* __restrict__ dxs, int64_t len, CapsuleRowSplit split, float r) {
    block_visit<2>(
        len, split, [&](int64_t i) { dxs[i] = capsule_row_grad(OP, ys[i], gs[i], r); },
        [&](int64_t i) { return YG4{load_vec4(ys, i), load_vec4(gs, i)}; },
        [&](int64_t i, YG4 v) {
            store_vec4(dxs, i,
                       make_float4(capsule_row_grad(OP, v.y.x, v.g.x, r), capsule_row_grad(OP, v.y.y, v.g.y, r),
                                   capsule_row_grad(OP, v.y.z, v.g.z, r), capsule_row_grad(OP, v.y.w, v.g.w, r)));
        });
}

// The split of a backward segment: the body only where y, g (and dx, unless null) align alike.
__device__ __forceinline__ CapsuleRowSplit grad_split(const float* ys, const float* gs, const float* dxs, int64_t len) {
    const bool vector = same_alignment(ys, gs) && (dxs == nullptr || same_alignment(ys, dxs));
    return capsule_row_split(reinterpret_cast<uintptr_t>(ys), len, vector);
}

// A block per row: the row reduction, then the write.
template <int OP>
__device__ void backward_block(const float* __restrict__ y, const float* __restrict__ g, float* __restrict__ dx,
                               int64_t rows, int64_t cols) {
    __shared__ float scratch[32];
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* yr = y + row * cols;
        const float* gr = g + row * cols;
        float* dxr = dx + row * cols;
        const CapsuleRowSplit split = grad_split(yr, gr, dxr, cols);
        const float r = block_sum(segment_dot<OP>(yr, gr, cols, split), scratch);
        segment_grad<OP>(yr, gr, dxr, cols, split, r);
    }
}

// Split rows, first launch: a block per chunk q writes the chunk's share of the row reduction to
// partials[q].
template <int OP>
__device__ void backward_partials(const float* __restrict__ y, const float* __restrict__ g,
                                  float* __restrict__ partials, int64_t rows, int64_t cols, int64_t chunk) {
    __shared__ float scratch[32];
    const int64_t chunks = capsule_softmax_chunks(cols, chunk);
    const int64_t segments = rows * chunks;
    for (int64_t q = blockIdx.x; q < segments; q += gridDim.x) {
        const CapsuleRowSegment seg = capsule_softmax_segment(q, cols, chunk, chunks);
        const float* ys = y + seg.start;
        const float* gs = g + seg.start;
        const CapsuleRowSplit split = grad_split(ys, gs, nullptr, seg.length);
        const float r = block_sum(segment_dot<OP>(ys, gs, seg.length, split), scratch);
        if (threadIdx.x == 0) partials[q] = r;
    }
}

// Split rows, second launch: a block per chunk sums its row's partials in a fixed order (lane l
// takes chunks l, l + 32, ..., then a butterfly: every warp the same bits) and writes the chunk.
template <int OP>
__device__ void backward_finish(const float* __restrict__ y, const float* __restrict__ g,
                                const float* __restrict__ partials, float* __restrict__ dx, int64_t rows, int64_t cols,
                                int64_t chunk) {
    const int64_t chunks = capsule_softmax_chunks(cols, chunk);
    const int64_t segments = rows * chunks;
    const int lane = threadIdx.x & 31;
    for (int64_t q = blockIdx.x; q < segments; q += gridDim.x) {
        const CapsuleRowSegment seg = capsule_softmax_segment(q, cols, chunk, chunks);
        const float* pr = partials + seg.row * chunks;
        float r = 0.0f;
        for (int64_t k = lane; k < chunks; k += 32) r += pr[k];
        r = group_sum<32>(r);
        const float* ys = y + seg.start;
        const float* gs = g + seg.start;
        float* dxs = dx + seg.start;
        segment_grad<OP>(ys, gs, dxs, seg.length, grad_split(ys, gs, dxs, seg.length), r);
    }
}

template <int OP>
__device__ void backward(const float* __restrict__ y, const float* __restrict__ g, float* __restrict__ dx,
                         int64_t rows, int64_t cols) {
    if (cols > CAPSULE_SOFTMAX_GRAD_GROUP_COLS) return backward_block<OP>(y, g, dx, rows, cols);
    with_group_shape<16>(cols, [&](auto shape) {
        using S = decltype(shape);
        backward_group<OP, S::G, S::V, S::R>(y, g, dx, rows, cols);
    });
}

}  // namespace

extern "C" __global__ __launch_bounds__(CAPSULE_SOFTMAX_THREADS, CAPSULE_SOFTMAX_GROUP_BLOCKS) void
    capsule_log_softmax_fwd(const float* __restrict__ x, float* __restrict__ y, int64_t rows, int64_t cols) {
    forward<CAPSULE_LOG_SOFTMAX>(x, nullptr, y, rows, cols);
}

extern "C" __global__ __launch_bounds__(CAPSULE_SOFTMAX_THREADS, CAPSULE_SOFTMAX_LEAN_BLOCKS) void
    capsule_log_softmax_fwd_block(const float* __restrict__ x, float* __restrict__ y, int64_t rows, int64_t cols) {
    forward_block<CAPSULE_LOG_SOFTMAX>(x, nullptr, y, rows, cols);
}

extern "C" __global__ __launch_bounds__(CAPSULE_SOFTMAX_THREADS, CAPSULE_SOFTMAX_LEAN_BLOCKS) void
    capsule_log_softmax_fwd_partials(const float* __restrict__ x, float* __restrict__ partials, int64_t rows,
                                     int64_t cols, int64_t chunk) {
    forward_partials<CAPSULE_LOG_SOFTMAX>(x, nullptr, partials, rows, cols, chunk);
}

extern "C" __global__ __launch_bounds__(CAPSULE_SOFTMAX_THREADS, CAPSULE_SOFTMAX_LEAN_BLOCKS) void
    capsule_log_softmax_fwd_finish(const float* __restrict__ x, const float* __restrict__ partials,
                                   float* __restrict__ y, int64_t rows, int64_t cols, int64_t chunk) {
    forward_finish<CAPSULE_LOG_SOFTMAX>(x, nullptr, partials, y, rows, cols, chunk);
}

extern "C" __global__ __launch_bounds__(CAPSULE_SOFTMAX_THREADS, CAPSULE_SOFTMAX_GROUP_BLOCKS) void
    capsule_log_softmax_bwd(const float* __restrict__ y, const float* __restrict__ g, float* __restrict__ dx,
                            int64_t rows, int64_t cols) {
    backward<CAPSULE_LOG_SOFTMAX>(y, g, dx, rows, cols);
}

extern "C" __global__ __launch_bounds__(CAPSULE_SOFTMAX_THREADS, CAPSULE_SOFTMAX_LEAN_BLOCKS) void
    capsule_log_softmax_bwd_block(const float* __restrict__ y, const float* __restrict__ g, float* __restrict__ dx,
                                  int64_t rows, int64_t cols) {
    backward_block<CAPSULE_LOG_SOFTMAX>(y, g, dx, rows, cols);
}

extern "C" __global__ __launch_bounds__(CAPSULE_SOFTMAX_THREADS, CAPSULE_SOFTMAX_LEAN_BLOCKS) void
    capsule_log_softmax_bwd_partials(const float* __restrict__ y, const float* __restrict__ g,
                                     float* __restrict__ partials, int64_t rows, int64_t cols, int64_t chunk) {
    backward_partials<CAPSULE_LOG_SOFTMAX>(y, g, partials, rows, cols, chunk);
}

extern "C" __global__ __launch_bounds__(CAPSULE_SOFTMAX_THREADS, CAPSULE_SOFTMAX_LEAN_BLOCKS) void
    capsule_log_softmax_bwd_finish(const float* __restrict__ y, const float* __restrict__ g,
                                   const float* __restrict__ partials, float* __restrict__ dx, int64_t rows,
                                   int64_t cols, int64_t chunk) {
    backward_finish<CAPSULE_LOG_SOFTMAX>(y, g, partials, dx, rows, cols, chunk);
}

extern "C" __global__ __launch_bounds__(CAPSULE_SOFTMAX_THREADS, CAPSULE_SOFTMAX_GROUP_BLOCKS) void
    capsule_softmax_fwd(const float* __restrict__ x, float* __restrict__ y, int64_t rows, int64_t cols) {
    forward<CAPSULE_SOFTMAX>(x, nullptr, y, rows, cols);
}

extern "C" __global__ __launch_bounds__(CAPSULE_SOFTMAX_THREADS, CAPSULE_SOFTMAX_LEAN_BLOCKS) void
    capsule_softmax_fwd_block(const float* __restrict__ x, float* __restrict__ y, int64_t rows, int64_t cols) {
    forward_block<CAPSULE_SOFTMAX>(x, nullptr, y, rows, cols);
}

extern "C" __global__ __launch_bounds__(CAPSULE_SOFTMAX_THREADS, CAPSULE_SOFTMAX_LEAN_BLOCKS) void
    capsule_softmax_fwd_partials(const float* __restrict__ x, float* __restrict__ partials, int64_t rows,
                                 int64_t cols, int64_t chunk) {
    forward_partials<CAPSULE_SOFTMAX>(x, nullptr, partials, rows, cols, chunk);
}

extern "C" __global__ __launch_bounds__(CAPSULE_SOFTMAX_THREADS, CAPSULE_SOFTMAX_LEAN_BLOCKS) void
    capsule_softmax_fwd_finish(const float* __restrict__ x, const float* __restrict__ partials, float* __restrict__ y,
                               int64_t rows, int64_t cols, int64_t chunk) {
    forward_finish<CAPSULE_SOFTMAX>(x, nullptr, partials, y, rows, cols, chunk);
}

extern "C" __global__ __launch_bounds__(CAPSULE_SOFTMAX_THREADS, CAPSULE_SOFTMAX_GROUP_BLOCKS) void
    capsule_softmax_bwd(const float* __restrict__ y, const float* __restrict__ g, float* __restrict__ dx,
                        int64_t rows, int64_t cols) {
    backward<CAPSULE_SOFTMAX>(y, g, dx, rows, cols);
}

extern "C" __global__ __launch_bounds__(CAPSULE_SOFTMAX_THREADS, CAPSULE_SOFTMAX_LEAN_BLOCKS) void
    capsule_softmax_bwd_block(const float* __restrict__ y, const float* __restrict__ g, float* __restrict__ dx,
                              int64_t rows, int64_t cols) {
    backward_block<CAPSULE_SOFTMAX>(y, g, dx, rows, cols);
}

extern "C" __global__ __launch_bounds__(CAPSULE_SOFTMAX_THREADS, CAPSULE_SOFTMAX_LEAN_BLOCKS) void
    capsule_softmax_bwd_partials(const float* __restrict__ y, const float* __restrict__ g,
                                 float* __restrict__ partials, int64_t rows, int64_t cols, int64_t chunk) {
    backward_partials<CAPSULE_SOFTMAX>(y, g, partials, rows, cols, chunk);
}

extern "C" __global__ __launch_bounds__(CAPSULE_SOFTMAX_THREADS, CAPSULE_SOFTMAX_LEAN_BLOCKS) void
    capsule_softmax_bwd_finish(const float* __restrict__ y, const float* __restrict__ g,
                               const float* __restrict__ partials, float* __restrict__ dx, int64_t rows, int64_t cols,
                               int64_t chunk) {
    backward_finish<CAPSULE_SOFTMAX>(y, g, partials, dx, rows, cols, chunk);
}

extern "C" __global__ __launch_bounds__(CAPSULE_SOFTMAX_THREADS, CAPSULE_SOFTMAX_GROUP_BLOCKS) void
    capsule_hard_masked_softmax_fwd(const float* __restrict__ x, const float* __restrict__ mask,
                                    float* __restrict__ y, int64_t rows, int64_t cols) {
    forward<CAPSULE_MASKED_SOFTMAX>(x, mask, y, rows, cols);
}

extern "C" __global__ __launch_bounds__(CAPSULE_SOFTMAX_THREADS, CAPSULE_SOFTMAX_LEAN_BLOCKS) void
    capsule_hard_masked_softmax_fwd_block(const float* __restrict__ x, const float* __restrict__ mask,
                                          float* __restrict__ y, int64_t rows, int64_t cols) {
    forward_block<CAPSULE_MASKED_SOFTMAX>(x, mask, y, rows, cols);
}

extern "C" __global__ __launch_bounds__(CAPSULE_SOFTMAX_THREADS, CAPSULE_SOFTMAX_LEAN_BLOCKS) void
    capsule_hard_masked_softmax_fwd_partials(const float* __restrict__ x, const float* __restrict__ mask,
                                             float* __restrict__ partials, int64_t rows, int64_t cols,
                                             int64_t chunk) {
    forward_partials<CAPSULE_MASKED_SOFTMAX>(x, mask, partials, rows, cols, chunk);
}

extern "C" __global__ __launch_bounds__(CAPSULE_SOFTMAX_THREADS, CAPSULE_SOFTMAX_LEAN_BLOCKS) void
    capsule_hard_masked_softmax_fwd_finish(const float* __restrict__ x, const float* __restrict__ mask,
                                           const float* __restrict__ partials, float* __restrict__ y, int64_t rows,
                                           int64_t cols, int64_t chunk) {
    forward_finish<CAPSULE_MASKED_SOFTMAX>(x, mask, partials, y, rows, cols, chunk);
}

extern "C" __global__ __launch_bounds__(CAPSULE_SOFTMAX_THREADS, CAPSULE_SOFTMAX_GROUP_BLOCKS) void
    capsule_hard_masked_softmax_bwd(const float* __restrict__ y, const float* __restrict__ g, float* __restrict__ dx,
                                    int64_t rows, int64_t cols) {
    backward<CAPSULE_SOFTMAX>(y, g, dx, rows, cols);
}

extern "C" __global__ __launch_bounds__(CAPSULE_SOFTMAX_THREADS, CAPSULE_SOFTMAX_LEAN_BLOCKS) void
    capsule_hard_masked_softmax_bwd_block(const float* __restrict__ y, const float* __restrict__ g,
                                          float* __restrict__ dx, int64_t rows, int64_t cols) {
    backward_block<CAPSULE_SOFTMAX>(y, g, dx, rows, cols);
}

extern "C" __global__ __launch_bounds__(CAPSULE_SOFTMAX_THREADS, CAPSULE_SOFTMAX_LEAN_BLOCKS) void
    capsule_hard_masked_softmax_bwd_partials(const float* __restrict__ y, const float* __restrict__ g,
                                             float* __restrict__ partials, int64_t rows, int64_t cols,
                                             int64_t chunk) {
    backward_partials<CAPSULE_SOFTMAX>(y, g, partials, rows, cols, chunk);
}

extern "C" __global__ __launch_bounds__(CAPSULE_SOFTMAX_THREADS, CAPSULE_SOFTMAX_LEAN_BLOCKS) void
    capsule_hard_masked_softmax_bwd_finish(const float* __restrict__ y, const float* __restrict__ g,
                                           const float* __restrict__ partials, float* __restrict__ dx, int64_t rows,
                                           int64_t cols, int64_t chunk) {
    backward_finish<CAPSULE_SOFTMAX>(y, g, partials, dx, rows, cols, chunk);
}
