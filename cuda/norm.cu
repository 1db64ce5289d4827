// The normalisation family: layer_norm (statistics per row of the last axis) and batch_norm
// (statistics per channel over N and space). Every reduction has a fixed shape and order for a
// given launch, and none uses atomics, so results repeat bitwise.
//
// layer_norm rows up to 256 columns are held in registers by one warp per row (at most 8 floats a
// lane, 16-byte loads when the row allows). Wide rows (cols a multiple of 4) are held in registers
// by a block per row, groups of 4 columns, up to 16 floats a thread forward and 8 backward (the
// _wide kernels, each lean on its own). Statistics are two-pass from the registers, sums merged by
// an xor butterfly (every lane ends with the same bits), then across warps in warp order. Other
// rows: one block per row, Welford per thread merged across lanes and warps in a fixed order, then
// a second pass that normalises. dgamma and dbeta are column sums: per part of the rows partial
// sums (written by the wide backward from its registers, else by a launch of their own over
// (part, 32 columns) tiles), then a fixed-order sum over the parts.
//
// batch_norm: per (channel, part of N·S) Welford partials (each thread's values taken 16 at a time,
// 16-byte loads where the planes allow, and merged as chunks), merged per channel in part order, then
// an elementwise pass; the backward's partials carry the co-moment of x and g, so one pass over
// x and g gives the statistics, dgamma = rstd·Σ g·(x − mean) and dbeta = Σ g.
//
// Launch rules (the plans in capsule_core/plans/norm.py follow them; any grid is correct): at most
// 256 threads per block, except the _wide kernels (at most 1024, and enough to hold the row);
// blockDim.x a multiple of 32 wherever a block reduces (the layer_norm row kernels and the
// batch_norm partials).
#include <cstdint>

#include "common.cuh"
#include "norm.cuh"

namespace {

using capsule::aligned16;
using capsule::group_sum;
using capsule::kFullMask;
using capsule::load4;
using capsule::store4;

constexpr int kMaxThreads = 256;
constexpr int kMaxWarps = kMaxThreads / 32;
constexpr int kWideMaxThreads = 1024;  // the wide-row kernels' largest block
constexpr int kWideMaxWarps = kWideMaxThreads / 32;
constexpr int64_t kWarpRowMax = 256;  // longest row a warp keeps in registers (8 floats a lane)

__device__ __forceinline__ int lane_id() { return static_cast<int>(threadIdx.x & 31u); }

__device__ __forceinline__ CapsuleWelford shfl_xor(const CapsuleWelford& w, int o) {
    CapsuleWelford r;
    r.n = __shfl_xor_sync(kFullMask, static_cast<long long>(w.n), o);
    r.mean = __shfl_xor_sync(kFullMask, w.mean, o);
    r.m2 = __shfl_xor_sync(kFullMask, w.m2, o);
    return r;
}

__device__ __forceinline__ CapsuleComoment shfl_xor(const CapsuleComoment& w, int o) {
    CapsuleComoment r;
    r.n = __shfl_xor_sync(kFullMask, static_cast<long long>(w.n), o);
    r.mean_x = __shfl_xor_sync(kFullMask, w.mean_x, o);
    r.m2 = __shfl_xor_sync(kFullMask, w.m2, o);
    r.mean_g = __shfl_xor_sync(kFullMask, w.mean_g, o);
    r.cxg = __shfl_xor_sync(kFullMask, w.cxg, o);
    r.sum_g = __shfl_xor_sync(kFullMask, w.sum_g, o);
    return r;
}

__device__ __forceinline__ CapsuleWelford merge(const CapsuleWelford& a, const CapsuleWelford& b) {
    return capsule_welford_merge(a, b);
}

__device__ __forceinline__ CapsuleComoment merge(const CapsuleComoment& a, const CapsuleComoment& b) {
    return capsule_comoment_merge(a, b);
}

// Butterfly merge: both partners merge (lower lane, upper lane), so all lanes end bitwise equal.
template <class W>
__device__ __forceinline__ W warp_merge(W w) {
    const int lane = lane_id();
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const W other = shfl_xor(w, o);
        w = (lane & o) ? merge(other, w) : merge(w, other);
    }
    return w;
}

// Merge over the block (blockDim.x a multiple of 32): warps, then the warp results folded in warp
// order by every thread. `slots` holds a state per warp; two barriers.
template <class W>
__device__ __forceinline__ W block_merge(W w, W* slots) {
    w = warp_merge(w);
    const int warp = static_cast<int>(threadIdx.x >> 5), warps = static_cast<int>(blockDim.x >> 5);
    if (lane_id() == 0) slots[warp] = w;
    __syncthreads();
    W r = slots[0];
    for (int i = 1; i < warps; ++i) r = merge(r, slots[i]);
    __syncthreads();
    return r;
}

// Sum of a float pair over the block, the same way.
__device__ __forceinline__ float2 block_sum2(float2 v, float2* slots) {
    v.x = group_sum<32>(v.x);
    v.y = group_sum<32>(v.y);
    const int warp = static_cast<int>(threadIdx.x >> 5), warps = static_cast<int>(blockDim.x >> 5);
    if (lane_id() == 0) slots[warp] = v;
    __syncthreads();
    float2 r = slots[0];
    for (int i = 1; i < warps; ++i) {
        r.x += slots[i].x;
        r.y += slots[i].y;
    }
    __syncthreads();
    return r;
}

// -- layer_norm: rows held in registers by a team (a warp, or the whole block) ------------------------

// A warp per row: rows warp_first, + warp_count, …; sums by xor butterfly.
struct WarpTeam {
    __device__ __forceinline__ int rank() const { return lane_id(); }
    __device__ __forceinline__ int size() const { return 32; }
    __device__ __forceinline__ int64_t first() const { return capsule::thread_index() >> 5; }
    __device__ __forceinline__ int64_t stride() const { return capsule::thread_count() >> 5; }
    __device__ __forceinline__ float2 sum(float2 v) const { return make_float2(group_sum<32>(v.x), group_sum<32>(v.y)); }
};

// PER vectors of VEC floats per team member; vector j of member m starts at column (j·size + m)·VEC.
template <int VEC, int PER>
struct RowTile {
    static constexpr int kVec = VEC;
    static constexpr int kPer = PER;
};

template <int VEC, class Team>
__device__ __forceinline__ int64_t tile_col(const Team& team, int j) {
    return (static_cast<int64_t>(j) * team.size() + team.rank()) * VEC;
}

// VEC floats at column col (zeros past the end of the row). Col is the caller's column type: the
// wide kernels' 32-bit columns keep their compares 32-bit (64-bit ones cost fwd_wide 8 registers).
template <int VEC, class Col>
__device__ __forceinline__ void load_vec(const float* __restrict__ p, Col col, Col cols, float (&out)[VEC]) {
    if constexpr (VEC == 4) {
        float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (col < cols) a = __ldg(reinterpret_cast<const float4*>(p + col));
        out[0] = a.x;
        out[1] = a.y;
        out[2] = a.z;
        out[3] = a.w;
    } else {
        out[0] = col < cols ? __ldg(p + col) : 0.0f;
    }
}

template <int VEC, int PER, class Team>
__device__ __forceinline__ void load_row(const Team& team, const float* __restrict__ p, int64_t cols, float (&v)[VEC * PER]) {
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        float a[VEC];
        load_vec<VEC>(p, tile_col<VEC>(team, j), cols, a);
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[VEC * j + k] = a[k];
    }
}

template <int VEC, int PER, class Team>
__device__ __forceinline__ void store_row(const Team& team, float* __restrict__ p, int64_t cols, const float (&v)[VEC * PER]) {
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const int64_t col = tile_col<VEC>(team, j);
        if (col < cols) {
            if constexpr (VEC == 4) {
                *reinterpret_cast<float4*>(p + col) = make_float4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
            } else {
                p[col] = v[j];
            }
        }
    }
}

// Vector j of this member read from p and q multiplied elementwise (zeros past the end of the row).
template <int VEC>
__device__ __forceinline__ void load_product(const float* __restrict__ p, const float* __restrict__ q, int64_t col, int64_t cols,
                                             float (&out)[VEC]) {
    if constexpr (VEC == 4) {
        float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b = a;
        if (col < cols) {
            a = __ldg(reinterpret_cast<const float4*>(p + col));
            b = __ldg(reinterpret_cast<const float4*>(q + col));
        }
        out[0] = a.x * b.x;
        out[1] = a.y * b.y;
        out[2] = a.z * b.z;
        out[3] = a.w * b.w;
    } else {
        out[0] = col < cols ? __ldg(p + col) * __ldg(q + col) : 0.0f;
    }
}

// Two-pass mean and rstd of a register-held row (zeros outside it); every member gets the same bits.
template <int VEC, int PER, class Team>
__device__ __forceinline__ void row_stats(const Team& team, const float (&v)[VEC * PER], int64_t cols, float eps, float& mean,
                                          float& rstd) {
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < VEC * PER; ++j) s += v[j];
    mean = team.sum(make_float2(s, 0.0f)).x / static_cast<float>(cols);
    float q = 0.0f;
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        if (tile_col<VEC>(team, j) < cols) {
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                const float d = v[VEC * j + k] - mean;
                q = fmaf(d, d, q);
            }
        }
    }
    rstd = capsule_norm_rstd(team.sum(make_float2(q, 0.0f)).x / static_cast<float>(cols), eps);
}

template <int VEC, int PER, class Team>
__device__ void ln_fwd_rows(const Team& team, const float* __restrict__ x, const float* __restrict__ gamma,
                            const float* __restrict__ beta, float* __restrict__ y, float* __restrict__ mean,
                            float* __restrict__ rstd, int64_t rows, int64_t cols, float eps) {
    for (int64_t row = team.first(); row < rows; row += team.stride()) {
        float v[VEC * PER];
        load_row<VEC, PER>(team, x + row * cols, cols, v);
        float mu, r;
        row_stats<VEC, PER>(team, v, cols, eps, mu, r);
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            const int64_t col = tile_col<VEC>(team, j);
            float gm[VEC], bt[VEC];
            load_vec<VEC>(gamma, col, cols, gm);
            load_vec<VEC>(beta, col, cols, bt);
#pragma unroll
            for (int k = 0; k < VEC; ++k)
                v[VEC * j + k] = capsule_norm_affine(capsule_norm_xhat(v[VEC * j + k], mu, r), gm[k], bt[k]);
        }
        store_row<VEC, PER>(team, y + row * cols, cols, v);
        if (team.rank() == 0) {
            mean[row] = mu;
            rstd[row] = r;
        }
    }
}

// Only x stays in registers; ĝ = g·gamma is read again for the second pass (L1 hits).
template <int VEC, int PER, class Team>
__device__ void ln_bwd_x_rows(const Team& team, const float* __restrict__ x, const float* __restrict__ gamma,
                              const float* __restrict__ g, float* __restrict__ dx, float* __restrict__ mean,
                              float* __restrict__ rstd, int64_t rows, int64_t cols, float eps) {
    for (int64_t row = team.first(); row < rows; row += team.stride()) {
        float v[VEC * PER];
        load_row<VEC, PER>(team, x + row * cols, cols, v);
        float mu, r;
        row_stats<VEC, PER>(team, v, cols, eps, mu, r);
        const float* gr = g + row * cols;
        float2 s = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            const int64_t col = tile_col<VEC>(team, j);
            float gh[VEC];
            load_product<VEC>(gr, gamma, col, cols, gh);
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                float& xh = v[VEC * j + k];
                xh = col < cols ? capsule_norm_xhat(xh, mu, r) : 0.0f;
                s.x += gh[k];
                s.y = fmaf(gh[k], xh, s.y);
            }
        }
        s = team.sum(s);
        const float m1 = s.x / static_cast<float>(cols), m2 = s.y / static_cast<float>(cols);
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            float gh[VEC];
            load_product<VEC>(gr, gamma, tile_col<VEC>(team, j), cols, gh);
#pragma unroll
            for (int k = 0; k < VEC; ++k) v[VEC * j + k] = capsule_norm_dx(v[VEC * j + k], gh[k], r, m1, m2);
        }
        store_row<VEC, PER>(team, dx + row * cols, cols, v);
        if (team.rank() == 0) {
            mean[row] = mu;
            rstd[row] = r;
        }
    }
}

// Calls f(RowTile<VEC, PER>{}) with the smallest tile that holds `cols` columns over `members`
// threads, at most 8 floats per thread; false when the row is longer than that.
template <class F>
__device__ __forceinline__ bool with_row_tile(int64_t cols, int64_t members, bool vec4, F&& f) {
    if (vec4) {
        const int64_t per = (cols + 4 * members - 1) / (4 * members);
        if (per <= 1) f(RowTile<4, 1>{});
        else if (per <= 2) f(RowTile<4, 2>{});
        else return false;
    } else {
        const int64_t per = (cols + members - 1) / members;
        if (per <= 1) f(RowTile<1, 1>{});
        else if (per <= 2) f(RowTile<1, 2>{});
        else if (per <= 4) f(RowTile<1, 4>{});
        else if (per <= 8) f(RowTile<1, 8>{});
        else return false;
    }
    return true;
}

// Calls f(WarpTeam{}, RowTile<VEC, PER>{}) for rows a warp holds in registers (up to kWarpRowMax
// columns); false for longer rows.
template <class F>
__device__ __forceinline__ bool with_warp_tile(int64_t cols, bool vec4, F&& f) {
    if (cols > kWarpRowMax) return false;
    with_row_tile(cols, 32, vec4, [&](auto tile) { f(WarpTeam{}, tile); });
    return true;
}

// -- layer_norm: longer rows, one block per row, streamed twice ----------------------------------------

// Welford statistics of one row over the block (float4 loads when vec4).
__device__ __forceinline__ CapsuleWelford row_welford(const float* __restrict__ p, int64_t cols, bool vec4,
                                                      CapsuleWelford* slots) {
    CapsuleWelford w = capsule_welford_empty();
    if (vec4) {
        const float4* q = reinterpret_cast<const float4*>(p);
        for (int64_t i = threadIdx.x; i < cols / 4; i += blockDim.x) {
            const float4 a = __ldg(q + i);
            capsule_welford_push(w, a.x);
            capsule_welford_push(w, a.y);
            capsule_welford_push(w, a.z);
            capsule_welford_push(w, a.w);
        }
    } else {
        for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) capsule_welford_push(w, __ldg(p + i));
    }
    return block_merge(w, slots);
}

__device__ void ln_fwd_block(const float* __restrict__ x, const float* __restrict__ gamma, const float* __restrict__ beta,
                             float* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd, int64_t rows,
                             int64_t cols, float eps, bool vec4) {
    __shared__ CapsuleWelford slots[kWideMaxWarps];
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* xr = x + row * cols;
        float* yr = y + row * cols;
        const CapsuleWelford w = row_welford(xr, cols, vec4, slots);
        const float mu = w.mean, r = capsule_norm_rstd(w.m2 / static_cast<float>(cols), eps);
        if (vec4) {
            for (int64_t i = threadIdx.x; i < cols / 4; i += blockDim.x) {
                const float4 a = __ldg(reinterpret_cast<const float4*>(xr) + i);
                const float4 gm = __ldg(reinterpret_cast<const float4*>(gamma) + i);
                const float4 bt = __ldg(reinterpret_cast<const float4*>(beta) + i);
                reinterpret_cast<float4*>(yr)[i] = make_float4(capsule_norm_affine(capsule_norm_xhat(a.x, mu, r), gm.x, bt.x),
                                                               capsule_norm_affine(capsule_norm_xhat(a.y, mu, r), gm.y, bt.y),
                                                               capsule_norm_affine(capsule_norm_xhat(a.z, mu, r), gm.z, bt.z),
                                                               capsule_norm_affine(capsule_norm_xhat(a.w, mu, r), gm.w, bt.w));
            }
        } else {
            for (int64_t i = threadIdx.x; i < cols; i += blockDim.x)
                yr[i] = capsule_norm_affine(capsule_norm_xhat(__ldg(xr + i), mu, r), __ldg(gamma + i), __ldg(beta + i));
        }
        if (threadIdx.x == 0) {
            mean[row] = mu;
            rstd[row] = r;
        }
    }
}

// A streamed row of the backward: its statistics (Welford over x) and the two means of the dx
// rule, m1 = mean(g·gamma) and m2 = mean(g·gamma·x̂), each a block-wide sum in a fixed order.
struct StreamedRow {
    float mu, r, m1, m2;
};

__device__ __forceinline__ StreamedRow streamed_row(const float* __restrict__ xr, const float* __restrict__ gr,
                                                    const float* __restrict__ gamma, int64_t cols, float eps,
                                                    CapsuleWelford* slots, float2* sums) {
    const CapsuleWelford w = row_welford(xr, cols, false, slots);
    const float mu = w.mean, r = capsule_norm_rstd(w.m2 / static_cast<float>(cols), eps);
    float2 s = make_float2(0.0f, 0.0f);
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
        const float gh = __ldg(gr + i) * __ldg(gamma + i);
        s.x += gh;
        s.y = fmaf(gh, capsule_norm_xhat(__ldg(xr + i), mu, r), s.y);
    }
    s = block_sum2(s, sums);
    return StreamedRow{mu, r, s.x / static_cast<float>(cols), s.y / static_cast<float>(cols)};
}

__device__ void ln_bwd_x_block(const float* __restrict__ x, const float* __restrict__ gamma, const float* __restrict__ g,
                               float* __restrict__ dx, float* __restrict__ mean, float* __restrict__ rstd, int64_t rows,
                               int64_t cols, float eps) {
    __shared__ CapsuleWelford slots[kWideMaxWarps];
    __shared__ float2 sums[kWideMaxWarps];
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* xr = x + row * cols;
        const float* gr = g + row * cols;
        const StreamedRow t = streamed_row(xr, gr, gamma, cols, eps, slots, sums);
        for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
            const float gh = __ldg(gr + i) * __ldg(gamma + i);
            dx[row * cols + i] = capsule_norm_dx(capsule_norm_xhat(__ldg(xr + i), t.mu, t.r), gh, t.r, t.m1, t.m2);
        }
        if (threadIdx.x == 0) {
            mean[row] = t.mu;
            rstd[row] = t.r;
        }
    }
}

// -- layer_norm: wide rows, a block per row held in registers ----------------------------------------

// A thread holds G groups of 4 columns of the row: group j of thread t is columns
// 4·(j·blockDim.x + t) … + 3 (zeros past the end of the row), so a block of blockDim.x threads holds
// rows of up to 4·G·blockDim.x columns. The forward holds kWideFwdGroups, the backward (which also
// keeps two column sums per column) kWideBwdGroups.
constexpr int kWideFwdGroups = 4;
constexpr int kWideBwdGroups = 2;

__device__ __forceinline__ int wide_col(int j) {
    return 4 * (j * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x));
}

// v[0..3] to the group at column col: one 16-byte store (st.global.cg.v4; a float4 assigned
// through a cast pointer can come out as four 4-byte stores).
__device__ __forceinline__ void wide_store(float* __restrict__ p, int col, int cols, const float* v) {
    if (col < cols) __stcg(reinterpret_cast<float4*>(p + col), make_float4(v[0], v[1], v[2], v[3]));
}

// The row's groups (the row 16-byte aligned, cols a multiple of 4), every load issued before any is used.
template <int G>
__device__ __forceinline__ void wide_load_row(const float* __restrict__ p, int cols, float (&v)[4 * G]) {
#pragma unroll
    for (int j = 0; j < G; ++j) {
        float a[4];
        load_vec<4>(p, wide_col(j), cols, a);
#pragma unroll
        for (int k = 0; k < 4; ++k) v[4 * j + k] = a[k];
    }
}

// Sum over the block (blockDim.x a multiple of 32): the xor butterfly in each warp, then the warps
// in order by every thread; two barriers.
__device__ __forceinline__ float block_sum1(float v, float* slots) {
    v = group_sum<32>(v);
    const int warp = static_cast<int>(threadIdx.x >> 5), warps = static_cast<int>(blockDim.x >> 5);
    if (lane_id() == 0) slots[warp] = v;
    __syncthreads();
    float r = slots[0];
    for (int i = 1; i < warps; ++i) r += slots[i];
    __syncthreads();
    return r;
}

// Two-pass mean and rstd of the block's row; every thread gets the same bits.
template <int G>
__device__ __forceinline__ void wide_stats(const float (&v)[4 * G], int cols, float eps, float* slots, float& mean, float& rstd) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4 * G; ++i) s += v[i];
    mean = block_sum1(s, slots) / static_cast<float>(cols);
    float q = 0.0f;
#pragma unroll
    for (int j = 0; j < G; ++j) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            if (wide_col(j) + k < cols) {
                const float d = v[4 * j + k] - mean;
                q = fmaf(d, d, q);
            }
        }
    }
    rstd = capsule_norm_rstd(block_sum1(q, slots) / static_cast<float>(cols), eps);
}

__device__ __forceinline__ void ln_fwd_wide(const float* __restrict__ x, const float* __restrict__ gamma,
                                            const float* __restrict__ beta, float* __restrict__ y, float* __restrict__ mean,
                                            float* __restrict__ rstd, int64_t rows, int cols, float eps, float* slots) {
    constexpr int G = kWideFwdGroups;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        float v[4 * G];
        wide_load_row<G>(x + row * cols, cols, v);
        float mu, r;
        wide_stats<G>(v, cols, eps, slots, mu, r);
#pragma unroll
        for (int j = 0; j < G; ++j) {
            float gm[4], bt[4];
            load_vec<4>(gamma, wide_col(j), cols, gm);
            load_vec<4>(beta, wide_col(j), cols, bt);
#pragma unroll
            for (int k = 0; k < 4; ++k) v[4 * j + k] = capsule_norm_affine(capsule_norm_xhat(v[4 * j + k], mu, r), gm[k], bt[k]);
            wide_store(y + row * cols, wide_col(j), cols, v + 4 * j);
        }
        if (threadIdx.x == 0) {
            mean[row] = mu;
            rstd[row] = r;
        }
    }
}

// x̂ stays in registers and ĝ = g·gamma replaces g there; each column's sum of g·x̂ over the
// part's rows accumulates in a register, its sum of g in the thread's own shared-memory column
// dbeta[·][threadIdx.x] (registers for both would not fit 64).
__device__ __forceinline__ void ln_bwd_x_wide(const float* __restrict__ x, const float* __restrict__ gamma,
                                              const float* __restrict__ g, float* __restrict__ dx, float* __restrict__ partial,
                                              int64_t rows, int cols, int64_t parts, float eps, float* slots, float2* sums,
                                              float (*dbeta)[kWideMaxThreads]) {
    constexpr int G = kWideBwdGroups;
    const int t = static_cast<int>(threadIdx.x);
    for (int64_t p = blockIdx.x; p < parts; p += gridDim.x) {
        int64_t lo, hi;
        capsule_part_range(rows, parts, p, lo, hi);
        float dgamma[4 * G];
#pragma unroll
        for (int i = 0; i < 4 * G; ++i) dgamma[i] = dbeta[i][t] = 0.0f;
        const float* xr = x + lo * cols;
        const float* gr = g + lo * cols;
        float* dr = dx + lo * cols;
        for (int row = 0; row < static_cast<int>(hi - lo); ++row, xr += cols, gr += cols, dr += cols) {
            float v[4 * G], gh[4 * G];
            wide_load_row<G>(xr, cols, v);
            wide_load_row<G>(gr, cols, gh);
            float mu, r;
            wide_stats<G>(v, cols, eps, slots, mu, r);
            float2 s = make_float2(0.0f, 0.0f);
#pragma unroll
            for (int j = 0; j < G; ++j) {
                float gm[4];
                load_vec<4>(gamma, wide_col(j), cols, gm);
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const int i = 4 * j + k;
                    v[i] = wide_col(j) + k < cols ? capsule_norm_xhat(v[i], mu, r) : 0.0f;
                    dgamma[i] = fmaf(gh[i], v[i], dgamma[i]);
                    dbeta[i][t] += gh[i];
                    gh[i] *= gm[k];
                    s.x += gh[i];
                    s.y = fmaf(gh[i], v[i], s.y);
                }
            }
            s = block_sum2(s, sums);
            const float m1 = s.x / static_cast<float>(cols), m2 = s.y / static_cast<float>(cols);
#pragma unroll
            for (int i = 0; i < 4 * G; ++i) v[i] = capsule_norm_dx(v[i], gh[i], r, m1, m2);
#pragma unroll
            for (int j = 0; j < G; ++j) wide_store(dr, wide_col(j), cols, v + 4 * j);
        }
#pragma unroll
        for (int j = 0; j < G; ++j) {
            const float b[4] = {dbeta[4 * j][t], dbeta[4 * j + 1][t], dbeta[4 * j + 2][t], dbeta[4 * j + 3][t]};
            wide_store(partial + p * cols, wide_col(j), cols, dgamma + 4 * j);
            wide_store(partial + (parts + p) * cols, wide_col(j), cols, b);
        }
    }
}

// capsule_layer_norm_bwd_x_wide where a buffer is not 16-byte aligned: the same parts, rows
// streamed (statistics by Welford, as ln_bwd_x_block), each column's sums accumulated in place in
// the partials by the one thread that owns the column.
__device__ void ln_bwd_x_parts_streamed(const float* __restrict__ x, const float* __restrict__ gamma,
                                        const float* __restrict__ g, float* __restrict__ dx, float* __restrict__ partial,
                                        int64_t rows, int64_t cols, int64_t parts, float eps) {
    __shared__ CapsuleWelford slots[kWideMaxWarps];
    __shared__ float2 sums[kWideMaxWarps];
    for (int64_t p = blockIdx.x; p < parts; p += gridDim.x) {
        float* dgamma = partial + p * cols;
        float* dbeta = partial + (parts + p) * cols;
        for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) dgamma[i] = dbeta[i] = 0.0f;
        int64_t lo, hi;
        capsule_part_range(rows, parts, p, lo, hi);
        for (int64_t row = lo; row < hi; ++row) {
            const float* xr = x + row * cols;
            const float* gr = g + row * cols;
            const StreamedRow t = streamed_row(xr, gr, gamma, cols, eps, slots, sums);
            for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
                const float gv = __ldg(gr + i), xh = capsule_norm_xhat(__ldg(xr + i), t.mu, t.r);
                dx[row * cols + i] = capsule_norm_dx(xh, gv * __ldg(gamma + i), t.r, t.m1, t.m2);
                dgamma[i] = fmaf(gv, xh, dgamma[i]);
                dbeta[i] += gv;
            }
        }
    }
}

// -- batch_norm helpers ---------------------------------------------------------------------------------

// The group of 4 consecutive statistic indices of channel c at the walker `it` from p, into
// v[0..3]: the first `valid` of them, zeros after; one 16-byte load when VEC (S a multiple of 4
// and p 16-byte aligned: a group never leaves its plane), else element by element across planes.
template <bool VEC>
__device__ __forceinline__ void load_group(const float* __restrict__ p, const CapsulePlaneWalker& it, int64_t valid, float* v) {
    if constexpr (VEC) {
        float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (valid > 0) a = __ldg(reinterpret_cast<const float4*>(p + it.offset));
        v[0] = a.x;
        v[1] = a.y;
        v[2] = a.z;
        v[3] = a.w;
    } else {
        int64_t s = it.s, off = it.offset;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            v[k] = k < valid ? __ldg(p + off) : 0.0f;
            if (++s == it.S) {
                s = 0;
                off += it.plane_gap + 1;
            } else {
                ++off;
            }
        }
    }
}

// Channel c's statistic indices j = n·S + s in [lo, hi) (lo a multiple of 4) as groups of 4:
// thread t takes groups t, t + blockDim.x, …, U of them (a chunk) at a time, every load of the
// chunk issued before any is used, and calls f(xv, gv, count) with the chunk's values of x (and of
// g when G) in group order, `count` of them valid (zeros after). Four 16-byte loads in flight a
// thread: U = 4 groups of x, or 2 of x and g.
template <bool G>
constexpr int kChunkGroups = G ? 2 : 4;

template <bool G, bool VEC, class F>
__device__ __forceinline__ void chunks_of(const float* __restrict__ x, const float* __restrict__ g, int64_t c, int64_t channels,
                                          int64_t spatial, int64_t lo, int64_t hi, F&& f) {
    const int64_t step = blockDim.x;
    const int64_t first = lo + 4 * static_cast<int64_t>(threadIdx.x);
    if (first >= hi) return;
    CapsulePlaneWalker it = capsule_plane_walker(first, 4 * step, c, channels, spatial);
    constexpr int U = kChunkGroups<G>;
    for (int64_t j = first; j < hi; j += 4 * U * step) {
        float xv[4 * U], gv[G ? 4 * U : 1];
        int count = 0;
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int64_t e = j + 4 * u * step;
            const int64_t valid = e < hi ? (hi - e < 4 ? hi - e : 4) : 0;
            load_group<VEC>(x, it, valid, xv + 4 * u);
            if constexpr (G) load_group<VEC>(g, it, valid, gv + 4 * u);
            count += static_cast<int>(valid);
            if (valid > 0) capsule_plane_advance(it);
        }
        f(xv, gv, count);
    }
}

// chunks_of with the load chosen once (one copy of the loop per kind of load keeps registers
// within 64).
template <bool G, class F>
__device__ __forceinline__ void channel_chunks(const float* __restrict__ x, const float* __restrict__ g, int64_t c,
                                               int64_t channels, int64_t spatial, int64_t lo, int64_t hi, bool vec, F&& f) {
    if (vec) {
        chunks_of<G, true>(x, g, c, channels, spatial, lo, hi, f);
    } else {
        chunks_of<G, false>(x, g, c, channels, spatial, lo, hi, f);
    }
}

// Welford statistics of channel c over the part [lo, hi) of its N·S elements, over the block.
__device__ __forceinline__ CapsuleWelford channel_welford(const float* __restrict__ x, int64_t c, int64_t channels,
                                                          int64_t spatial, int64_t lo, int64_t hi, bool vec,
                                                          CapsuleWelford* slots) {
    CapsuleChunkWelford w{0.0f, 0.0f, 0.0f};
    channel_chunks<false>(x, nullptr, c, channels, spatial, lo, hi, vec,
                          [&](const float (&xv)[4 * kChunkGroups<false>], const float (&)[1], int count) { capsule_chunk_push(w, xv, count); });
    return block_merge(CapsuleWelford{static_cast<int64_t>(w.n), w.mean, w.m2}, slots);
}

__device__ __forceinline__ CapsuleComoment channel_comoment(const float* __restrict__ x, const float* __restrict__ g, int64_t c,
                                                            int64_t channels, int64_t spatial, int64_t lo, int64_t hi, bool vec,
                                                            CapsuleComoment* slots) {
    CapsuleChunkComoment w{0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    channel_chunks<true>(x, g, c, channels, spatial, lo, hi, vec,
                         [&](const float (&xv)[4 * kChunkGroups<true>], const float (&gv)[4 * kChunkGroups<true>], int count) {
                             capsule_chunk_push(w, xv, gv, count);
                         });
    return block_merge(CapsuleComoment{static_cast<int64_t>(w.n), w.mean_x, w.m2, w.mean_g, w.cxg, w.sum_g}, slots);
}

__device__ __forceinline__ int64_t part_count(int64_t total, int64_t parts, int64_t p) {
    int64_t lo, hi;
    capsule_group_part_range(total, parts, p, lo, hi);
    return hi - lo;
}

// f1(i, c) for every flat index i of channel c, or f4(v, c) for the float4 vector v (elements
// 4v … 4v + 3 of channels c[0..3]) when vec4, then f1 over the tail.
template <class F1, class F4>
__device__ __forceinline__ void channel_map(int64_t total, int64_t channels, int64_t spatial, bool vec4, F1&& f1, F4&& f4) {
    if (total == 0) return;
    const int64_t first = capsule::thread_index();
    const int64_t step = capsule::thread_count();
    int64_t tail = 0;
    if (vec4) {
        const int64_t vectors = total / 4;
        if (first < vectors) {
            CapsuleChannelWalker it = capsule_channel_walker(4 * first, 4 * step, channels, spatial);
            for (int64_t v = first; v < vectors; v += step) {
                int64_t c[4];
                int64_t s = it.s, cc = it.c;
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    c[k] = cc;
                    capsule_channel_next(s, cc, spatial, channels);
                }
                f4(v, c);
                capsule_channel_advance(it);
            }
        }
        tail = vectors * 4;
    }
    if (tail + first < total) {
        CapsuleChannelWalker it = capsule_channel_walker(tail + first, step, channels, spatial);
        for (int64_t i = tail + first; i < total; i += step) {
            f1(i, it.c);
            capsule_channel_advance(it);
        }
    }
}

}  // namespace

// -- layer_norm ---------------------------------------------------------------------------------------

extern "C" __global__ __launch_bounds__(kMaxThreads, 2) void capsule_layer_norm_fwd(
    const float* __restrict__ x, const float* __restrict__ gamma, const float* __restrict__ beta, float* __restrict__ y,
    float* __restrict__ mean, float* __restrict__ rstd, int64_t rows, int64_t cols, float eps) {
    const bool vec4 = cols % 4 == 0 && aligned16(x) && aligned16(y) && aligned16(gamma) && aligned16(beta);
    const bool cached = with_warp_tile(cols, vec4, [&](const auto& team, auto tile) {
        using T = decltype(tile);
        ln_fwd_rows<T::kVec, T::kPer>(team, x, gamma, beta, y, mean, rstd, rows, cols, eps);
    });
    if (!cached) ln_fwd_block(x, gamma, beta, y, mean, rstd, rows, cols, eps, vec4);
}

// dx per row; recomputes the row statistics (as the forward does) and leaves them in mean and rstd
// for capsule_layer_norm_bwd_partials.
extern "C" __global__ __launch_bounds__(kMaxThreads, 2) void capsule_layer_norm_bwd_x(
    const float* __restrict__ x, const float* __restrict__ gamma, const float* __restrict__ g, float* __restrict__ dx,
    float* __restrict__ mean, float* __restrict__ rstd, int64_t rows, int64_t cols, float eps) {
    const bool vec4 = cols % 4 == 0 && aligned16(x) && aligned16(g) && aligned16(dx) && aligned16(gamma);
    const bool cached = with_warp_tile(cols, vec4, [&](const auto& team, auto tile) {
        using T = decltype(tile);
        ln_bwd_x_rows<T::kVec, T::kPer>(team, x, gamma, g, dx, mean, rstd, rows, cols, eps);
    });
    if (!cached) ln_bwd_x_block(x, gamma, g, dx, mean, rstd, rows, cols, eps);
}

// Rows of up to 16·blockDim.x columns, cols a multiple of 4, a block per row held in registers
// (streamed where a buffer is not 16-byte aligned): blockDim.x a multiple of 32, at most
// kWideMaxThreads.
extern "C" __global__ __launch_bounds__(kWideMaxThreads, 1) void capsule_layer_norm_fwd_wide(
    const float* __restrict__ x, const float* __restrict__ gamma, const float* __restrict__ beta, float* __restrict__ y,
    float* __restrict__ mean, float* __restrict__ rstd, int64_t rows, int64_t cols, float eps) {
    __shared__ float slots[kWideMaxThreads / 32];
    if (cols % 4 == 0 && aligned16(x) && aligned16(y) && aligned16(gamma) && aligned16(beta)) {
        ln_fwd_wide(x, gamma, beta, y, mean, rstd, rows, static_cast<int>(cols), eps, slots);
    } else {
        ln_fwd_block(x, gamma, beta, y, mean, rstd, rows, cols, eps, false);
    }
}

// dx of rows of up to 8·blockDim.x columns, cols a multiple of 4, a block per part of the rows (part p of `parts`, rows
// in order), and the part's column sums of g·x̂ and g from the same registers: partial[p·cols + c]
// (dgamma) and partial[(parts + p)·cols + c] (dbeta), summed over the parts by
// capsule_layer_norm_bwd_params. blockDim.x a multiple of 32, at most kWideMaxThreads.
extern "C" __global__ __launch_bounds__(kWideMaxThreads, 1) void capsule_layer_norm_bwd_x_wide(
    const float* __restrict__ x, const float* __restrict__ gamma, const float* __restrict__ g, float* __restrict__ dx,
    float* __restrict__ partial, int64_t rows, int64_t cols, int64_t parts, float eps) {
    __shared__ float slots[kWideMaxThreads / 32];
    __shared__ float2 sums[kWideMaxThreads / 32];
    if (cols % 4 == 0 && aligned16(x) && aligned16(g) && aligned16(dx) && aligned16(gamma) && aligned16(partial)) {
        __shared__ float dbeta[4 * kWideBwdGroups][kWideMaxThreads];
        ln_bwd_x_wide(x, gamma, g, dx, partial, rows, static_cast<int>(cols), parts, eps, slots, sums, dbeta);
    } else {
        ln_bwd_x_parts_streamed(x, gamma, g, dx, partial, rows, cols, parts, eps);
    }
}

// Column partial sums of g·x̂ and g over the rows of part p (of `parts`), for blocks of
// (columns, row lanes): partial[p·cols + c] (dgamma) and partial[(parts + p)·cols + c] (dbeta).
extern "C" __global__ __launch_bounds__(kMaxThreads) void capsule_layer_norm_bwd_partials(
    const float* __restrict__ x, const float* __restrict__ g, const float* __restrict__ mean,
    const float* __restrict__ rstd, float* __restrict__ partial, int64_t rows, int64_t cols, int64_t parts) {
    __shared__ float2 acc[kMaxThreads];
    const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
    const int width = static_cast<int>(blockDim.x), height = static_cast<int>(blockDim.y);
    for (int64_t tile = blockIdx.x; tile * width < cols; tile += gridDim.x) {
        const int64_t c = tile * width + tx;
        for (int64_t p = blockIdx.y; p < parts; p += gridDim.y) {
            int64_t lo, hi;
            capsule_part_range(rows, parts, p, lo, hi);
            float2 s = make_float2(0.0f, 0.0f);
            if (c < cols) {
                for (int64_t r = lo + ty; r < hi; r += height) {
                    const float gv = __ldg(g + r * cols + c);
                    s.x = fmaf(gv, capsule_norm_xhat(__ldg(x + r * cols + c), __ldg(mean + r), __ldg(rstd + r)), s.x);
                    s.y += gv;
                }
            }
            acc[ty * width + tx] = s;
            __syncthreads();
            if (ty == 0 && c < cols) {
                float2 t = acc[tx];
                for (int k = 1; k < height; ++k) {
                    t.x += acc[k * width + tx].x;
                    t.y += acc[k * width + tx].y;
                }
                partial[p * cols + c] = t.x;
                partial[(parts + p) * cols + c] = t.y;
            }
            __syncthreads();
        }
    }
}

// dgamma and dbeta: the partial sums of capsule_layer_norm_bwd_partials summed in part order.
extern "C" __global__ __launch_bounds__(kMaxThreads) void capsule_layer_norm_bwd_params(
    const float* __restrict__ partial, float* __restrict__ dgamma, float* __restrict__ dbeta, int64_t cols,
    int64_t parts) {
    CAPSULE_GRID_STRIDE(c, cols) {
        float sg = 0.0f, sb = 0.0f;
        for (int64_t p = 0; p < parts; ++p) {
            sg += __ldg(partial + p * cols + c);
            sb += __ldg(partial + (parts + p) * cols + c);
        }
        dgamma[c] = sg;
        dbeta[c] = sb;
    }
}

// -- batch_norm ------------------------------------------------------------------------------------------

// The forward in three launches of increasing `stage`:
//   0: partial[2·(c·parts + p) + {0, 1}] = mean and M2 of channel c over part p of its N·S
//      elements (grid: channels along x, parts along y);
//   1: mean[c], rstd[c] from the partials merged in part order (one thread per channel);
//   2: y = x̂·gamma + beta (a grid-stride pass over every element).
extern "C" __global__ __launch_bounds__(kMaxThreads, 4) void capsule_batch_norm_fwd(
    const float* __restrict__ x, const float* __restrict__ gamma, const float* __restrict__ beta, float* __restrict__ y,
    float* __restrict__ mean, float* __restrict__ rstd, float* __restrict__ partial, int64_t n, int64_t channels,
    int64_t spatial, int64_t parts, float eps, int32_t stage) {
    const int64_t per_channel = n * spatial;
    if (stage == 0) {
        __shared__ CapsuleWelford slots[kMaxWarps];
        const bool vec = spatial % 4 == 0 && aligned16(x);
        for (int64_t c = blockIdx.x; c < channels; c += gridDim.x) {
            for (int64_t p = blockIdx.y; p < parts; p += gridDim.y) {
                int64_t lo, hi;
                capsule_group_part_range(per_channel, parts, p, lo, hi);
                const CapsuleWelford w = channel_welford(x, c, channels, spatial, lo, hi, vec, slots);
                if (threadIdx.x == 0) {
                    partial[2 * (c * parts + p)] = w.mean;
                    partial[2 * (c * parts + p) + 1] = w.m2;
                }
            }
        }
    } else if (stage == 1) {
        CAPSULE_GRID_STRIDE(c, channels) {
            CapsuleWelford w = capsule_welford_empty();
            for (int64_t p = 0; p < parts; ++p) {
                const CapsuleWelford part{part_count(per_channel, parts, p), partial[2 * (c * parts + p)],
                                          partial[2 * (c * parts + p) + 1]};
                w = capsule_welford_merge(w, part);
            }
            mean[c] = w.mean;
            rstd[c] = capsule_norm_rstd(w.m2 / static_cast<float>(per_channel), eps);
        }
    } else {
        // y = (x − mean)·rstd·gamma + beta with the channel's four numbers loaded once per vector
        // when its four elements share a channel.
        const bool vec4 = aligned16(x) && aligned16(y);
        const auto one = [&](float xv, int64_t c) {
            return capsule_norm_affine(capsule_norm_xhat(xv, mean[c], rstd[c]), __ldg(gamma + c), __ldg(beta + c));
        };
        channel_map(
            n * channels * spatial, channels, spatial, vec4, [&](int64_t i, int64_t c) { y[i] = one(__ldg(x + i), c); },
            [&](int64_t v, const int64_t (&c)[4]) {
                const float4 a = load4(x, v);
                if (c[0] == c[1] && c[1] == c[2] && c[2] == c[3]) {
                    const float mu = mean[c[0]], r = rstd[c[0]], gm = __ldg(gamma + c[0]), bt = __ldg(beta + c[0]);
                    const auto f = [&](float xv) { return capsule_norm_affine(capsule_norm_xhat(xv, mu, r), gm, bt); };
                    store4(y, v, make_float4(f(a.x), f(a.y), f(a.z), f(a.w)));
                } else {
                    store4(y, v, make_float4(one(a.x, c[0]), one(a.y, c[1]), one(a.z, c[2]), one(a.w, c[3])));
                }
            });
    }
}

// partial[5·(c·parts + p) + {0..4}] = mean of x, M2, mean of g, co-moment Σ(x − x̄)(g − ḡ), Σ g
// of channel c over part p (grid: channels along x, parts along y).
extern "C" __global__ __launch_bounds__(kMaxThreads, 4) void capsule_batch_norm_bwd_partials(
    const float* __restrict__ x, const float* __restrict__ g, float* __restrict__ partial, int64_t n, int64_t channels,
    int64_t spatial, int64_t parts) {
    __shared__ CapsuleComoment slots[kMaxWarps];
    const int64_t per_channel = n * spatial;
    const bool vec = spatial % 4 == 0 && aligned16(x) && aligned16(g);
    for (int64_t c = blockIdx.x; c < channels; c += gridDim.x) {
        for (int64_t p = blockIdx.y; p < parts; p += gridDim.y) {
            int64_t lo, hi;
            capsule_group_part_range(per_channel, parts, p, lo, hi);
            const CapsuleComoment w = channel_comoment(x, g, c, channels, spatial, lo, hi, vec, slots);
            if (threadIdx.x == 0) {
                float* out = partial + 5 * (c * parts + p);
                out[0] = w.mean_x;
                out[1] = w.m2;
                out[2] = w.mean_g;
                out[3] = w.cxg;
                out[4] = w.sum_g;
            }
        }
    }
}

// Per channel, the partials merged in part order: mean, rstd, dgamma = rstd·Σ g·(x − mean), dbeta = Σ g.
extern "C" __global__ __launch_bounds__(kMaxThreads) void capsule_batch_norm_bwd_params(
    const float* __restrict__ partial, float* __restrict__ mean, float* __restrict__ rstd, float* __restrict__ dgamma,
    float* __restrict__ dbeta, int64_t n, int64_t channels, int64_t spatial, int64_t parts, float eps) {
    const int64_t per_channel = n * spatial;
    CAPSULE_GRID_STRIDE(c, channels) {
        CapsuleComoment w = capsule_comoment_empty();
        for (int64_t p = 0; p < parts; ++p) {
            const float* in = partial + 5 * (c * parts + p);
            const CapsuleComoment part{part_count(per_channel, parts, p), __ldg(in), __ldg(in + 1), __ldg(in + 2),
                                       __ldg(in + 3), __ldg(in + 4)};
            w = capsule_comoment_merge(w, part);
        }
        const float r = capsule_norm_rstd(w.m2 / static_cast<float>(per_channel), eps);
        mean[c] = w.mean_x;
        rstd[c] = r;
        dgamma[c] = w.cxg * r;
        dbeta[c] = w.sum_g;
    }
}

// dx elementwise, with Σĝ = gamma·dbeta and Σĝx̂ = gamma·dgamma per channel.
extern "C" __global__ __launch_bounds__(kMaxThreads) void capsule_batch_norm_bwd_x(
    const float* __restrict__ x, const float* __restrict__ gamma, const float* __restrict__ g,
    const float* __restrict__ mean, const float* __restrict__ rstd, const float* __restrict__ dgamma,
    const float* __restrict__ dbeta, float* __restrict__ dx, int64_t n, int64_t channels, int64_t spatial) {
    // Per channel: mean, rstd, gamma, mean ĝ = gamma·dbeta/count and mean ĝx̂ = gamma·dgamma/count.
    const float inv_count = 1.0f / static_cast<float>(n * spatial);
    const bool vec4 = aligned16(x) && aligned16(g) && aligned16(dx);
    struct Coef {
        float mean, rstd, gamma, m1, m2;
    };
    const auto coef = [&](int64_t c) {
        const float gm = __ldg(gamma + c);
        return Coef{__ldg(mean + c), __ldg(rstd + c), gm, gm * __ldg(dbeta + c) * inv_count, gm * __ldg(dgamma + c) * inv_count};
    };
    const auto one = [](float xv, float gv, const Coef& k) {
        return capsule_norm_dx(capsule_norm_xhat(xv, k.mean, k.rstd), gv * k.gamma, k.rstd, k.m1, k.m2);
    };
    channel_map(
        n * channels * spatial, channels, spatial, vec4,
        [&](int64_t i, int64_t c) { dx[i] = one(__ldg(x + i), __ldg(g + i), coef(c)); },
        [&](int64_t v, const int64_t (&c)[4]) {
            const float4 a = load4(x, v), b = load4(g, v);
            if (c[0] == c[1] && c[1] == c[2] && c[2] == c[3]) {
                const Coef k = coef(c[0]);
                store4(dx, v, make_float4(one(a.x, b.x, k), one(a.y, b.y, k), one(a.z, b.z, k), one(a.w, b.w, k)));
            } else {
                store4(dx, v, make_float4(one(a.x, b.x, coef(c[0])), one(a.y, b.y, coef(c[1])), one(a.z, b.z, coef(c[2])),
                                          one(a.w, b.w, coef(c[3]))));
            }
        });
}
