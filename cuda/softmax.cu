// softmax, log_softmax and hard_masked_softmax over the last axis: rows x cols, cols >= 1.
//
// Rows of up to CAPSULE_SOFTMAX_GROUP_COLS columns: a group of lanes per row (1 to 32 lanes, several
// rows per warp, several warps per block), the row held in registers, reductions by warp shuffles.
// Longer rows: one block per row, three passes over the row (max, sum of exp, write) with 16-byte
// accesses where the buffers' rows are equally aligned, block reductions through shared memory.
// Every reduction has a fixed order for a given launch: no atomics, the same bits run to run.
// Launch contract: blockDim.x a multiple of 32, at most CAPSULE_SOFTMAX_THREADS (built for 4 such blocks
// per multiprocessor, so at most 64 registers); any grid size.
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

template <int OP>
__device__ __forceinline__ float4 load_score4(const float* __restrict__ x, const float* __restrict__ mask, int64_t i) {
    float4 v = *reinterpret_cast<const float4*>(x + i);
    if (OP == CAPSULE_MASKED_SOFTMAX) {
        const float4 m = *reinterpret_cast<const float4*>(mask + i);
        v = make_float4(capsule_masked_score(v.x, m.x), capsule_masked_score(v.y, m.y),
                        capsule_masked_score(v.z, m.z), capsule_masked_score(v.w, m.w));
    }
    return v;
}

// Visits a row of `len` split by `split`: one(i) for scalar elements, four(i) for the float4 at i.
template <class One, class Four>
__device__ __forceinline__ void block_visit(int64_t len, CapsuleRowSplit split, One one, Four four) {
    const int64_t step = blockDim.x;
    for (int64_t i = threadIdx.x; i < split.head; i += step) one(i);
#pragma unroll 4
    for (int64_t j = threadIdx.x; j < split.body4; j += step) four(split.head + 4 * j);
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

template <int OP>
__device__ void forward_block(const float* __restrict__ x, const float* __restrict__ mask, float* __restrict__ y,
                              int64_t rows, int64_t cols) {
    __shared__ float scratch[32];
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* xr = x + row * cols;
        const float* mr = OP == CAPSULE_MASKED_SOFTMAX ? mask + row * cols : nullptr;
        float* yr = y + row * cols;
        const bool vector = same_alignment(xr, yr) && (OP != CAPSULE_MASKED_SOFTMAX || same_alignment(xr, mr));
        const CapsuleRowSplit split = capsule_row_split(reinterpret_cast<uintptr_t>(xr), cols, vector);

        float m = -INFINITY;
        block_visit(cols, split, [&](int64_t i) { m = capsule_nanmax(m, load_score<OP>(xr, mr, i)); },
                    [&](int64_t i) { m = capsule_nanmax(m, max4(load_score4<OP>(xr, mr, i))); });
        m = block_max(m, scratch);
        const float shift = capsule_row_shift(OP, m);

        float s = 0.0f;
        block_visit(cols, split, [&](int64_t i) { s += capsule_exp_term(load_score<OP>(xr, mr, i), shift); },
                    [&](int64_t i) {
                        const float4 v = load_score4<OP>(xr, mr, i);
                        s += (capsule_exp_term(v.x, shift) + capsule_exp_term(v.y, shift)) +
                             (capsule_exp_term(v.z, shift) + capsule_exp_term(v.w, shift));
                    });
        s = block_sum(s, scratch);
        const float d = OP == CAPSULE_LOG_SOFTMAX ? logf(s) : capsule_row_denominator(OP, m, s);

        block_visit(cols, split, [&](int64_t i) { yr[i] = capsule_row_value(OP, load_score<OP>(xr, mr, i), shift, d); },
                    [&](int64_t i) {
                        const float4 v = load_score4<OP>(xr, mr, i);
                        *reinterpret_cast<float4*>(yr + i) =
                            make_float4(capsule_row_value(OP, v.x, shift, d), capsule_row_value(OP, v.y, shift, d),
                                        capsule_row_value(OP, v.z, shift, d), capsule_row_value(OP, v.w, shift, d));
                    });
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

template <int OP>
__device__ void backward_block(const float* __restrict__ y, const float* __restrict__ g, float* __restrict__ dx,
                               int64_t rows, int64_t cols) {
    __shared__ float scratch[32];
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* yr = y + row * cols;
        const float* gr = g + row * cols;
        float* dxr = dx + row * cols;
        const bool vector = same_alignment(yr, gr) && same_alignment(yr, dxr);
        const CapsuleRowSplit split = capsule_row_split(reinterpret_cast<uintptr_t>(yr), cols, vector);

        float r = 0.0f;
        block_visit(cols, split, [&](int64_t i) { r += capsule_grad_term(OP, yr[i], gr[i]); },
                    [&](int64_t i) {
                        const float4 a = *reinterpret_cast<const float4*>(yr + i);
                        const float4 b = *reinterpret_cast<const float4*>(gr + i);
                        r += (capsule_grad_term(OP, a.x, b.x) + capsule_grad_term(OP, a.y, b.y)) +
                             (capsule_grad_term(OP, a.z, b.z) + capsule_grad_term(OP, a.w, b.w));
                    });
        r = block_sum(r, scratch);

        block_visit(cols, split, [&](int64_t i) { dxr[i] = capsule_row_grad(OP, yr[i], gr[i], r); },
                    [&](int64_t i) {
                        const float4 a = *reinterpret_cast<const float4*>(yr + i);
                        const float4 b = *reinterpret_cast<const float4*>(gr + i);
                        *reinterpret_cast<float4*>(dxr + i) =
                            make_float4(capsule_row_grad(OP, a.x, b.x, r), capsule_row_grad(OP, a.y, b.y, r),
                                        capsule_row_grad(OP, a.z, b.z, r), capsule_row_grad(OP, a.w, b.w, r));
                    });
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

extern "C" __global__ __launch_bounds__(CAPSULE_SOFTMAX_THREADS, 4) void
    capsule_log_softmax_fwd(const float* __restrict__ x, float* __restrict__ y, int64_t rows, int64_t cols) {
    forward<CAPSULE_LOG_SOFTMAX>(x, nullptr, y, rows, cols);
}

extern "C" __global__ __launch_bounds__(CAPSULE_SOFTMAX_THREADS, 4) void
    capsule_log_softmax_bwd(const float* __restrict__ y, const float* __restrict__ g, float* __restrict__ dx,
                            int64_t rows, int64_t cols) {
    backward<CAPSULE_LOG_SOFTMAX>(y, g, dx, rows, cols);
}

extern "C" __global__ __launch_bounds__(CAPSULE_SOFTMAX_THREADS, 4) void
    capsule_softmax_fwd(const float* __restrict__ x, float* __restrict__ y, int64_t rows, int64_t cols) {
    forward<CAPSULE_SOFTMAX>(x, nullptr, y, rows, cols);
}

extern "C" __global__ __launch_bounds__(CAPSULE_SOFTMAX_THREADS, 4) void
    capsule_softmax_bwd(const float* __restrict__ y, const float* __restrict__ g, float* __restrict__ dx,
                        int64_t rows, int64_t cols) {
    backward<CAPSULE_SOFTMAX>(y, g, dx, rows, cols);
}

extern "C" __global__ __launch_bounds__(CAPSULE_SOFTMAX_THREADS, 4) void
    capsule_hard_masked_softmax_fwd(const float* __restrict__ x, const float* __restrict__ mask,
                                    float* __restrict__ y, int64_t rows, int64_t cols) {
    forward<CAPSULE_MASKED_SOFTMAX>(x, mask, y, rows, cols);
}

extern "C" __global__ __launch_bounds__(CAPSULE_SOFTMAX_THREADS, 4) void
    capsule_hard_masked_softmax_bwd(const float* __restrict__ y, const float* __restrict__ g,
                                    float* __restrict__ dx, int64_t rows, int64_t cols) {
    backward<CAPSULE_SOFTMAX>(y, g, dx, rows, cols);
}
