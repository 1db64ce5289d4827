// The conv_pool family: conv and conv_transpose as implicit GEMMs (no im2col in device memory),
// max / smooth max / average pooling with one thread per output (forward) or per input cell
// (backward, a gather over the covering windows). Every kernel is atomic-free and deterministic.
// The per-thread math is in conv_pool.cuh; this file holds the tile loops, the barriers and the
// warp reductions.
//
// GEMM kernels (128 threads): a block walks its tiles (grid-stride), and for each reduction step
// loads the next gathered patch / weight values into registers while it multiplies the current
// shared-memory tiles (register prefetch), each thread accumulating an 8 × 4 (dw: 4 × 2) block.
//
// Parameter lists (registry _CONV): x (n, c_in, d, h, w), y (n, c_out, od, oh, ow); for conv w is
// (c_out, c_in, k), for conv_transpose (c_in, c_out, k) and od = (d − 1)·s + k − 2p.
#include <cstdint>

#include "common.cuh"
#include "conv_pool.cuh"

using namespace capsule_cp;

namespace {

__device__ __forceinline__ Dims3 dims(int64_t d, int64_t h, int64_t w) { return Dims3{d, h, w}; }

__device__ __forceinline__ Window window(int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh, int64_t sw,
                                         int64_t pd, int64_t ph, int64_t pw) {
    return Window{Dims3{kd, kh, kw}, Dims3{sd, sh, sw}, Dims3{pd, ph, pw}};
}

__device__ __forceinline__ PoolGeom pool(int64_t planes, int64_t d, int64_t h, int64_t w, int64_t od, int64_t oh,
                                         int64_t ow, int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh,
                                         int64_t sw, int64_t pd, int64_t ph, int64_t pw) {
    return PoolGeom{planes, dims(d, h, w), dims(od, oh, ow), window(kd, kh, kw, sd, sh, sw, pd, ph, pw)};
}

// The tile layouts assume one block shape; any other writes nothing (and `bounds` says so).
__device__ __forceinline__ bool block_is(int threads) {
    return blockDim.x == static_cast<unsigned>(threads) && blockDim.y == 1 && blockDim.z == 1;
}

// One correlation-shaped GEMM (see CorrProblem) with tile shape T, its reduction flattened or not.
// Two shared stages: a step's product reads one while the next step's values go into the other,
// so one barrier per step both publishes the stores and retires the reads of the stage that the
// step after next overwrites.
template <class T, bool FLAT, bool TRANSPOSED>
__device__ __forceinline__ void corr_gemm(const CorrProblem& p) {
    alignas(16) __shared__ float As[2][T::BK * T::BM];
    alignas(16) __shared__ float Bs[2][T::BK * T::BN];
    if (!block_is(kGemmThreads)) return;
    const int tid = static_cast<int>(threadIdx.x);
    const int64_t tiles = corr_tiles<T>(p), tiles_n = corr_tiles_n<T>(p), steps = corr_steps<T>(p, FLAT);
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
        const int64_t tile_m = quot(t, tiles_n), tile_n = t - tile_m * tiles_n;
        const CorrRow row = corr_row<T, TRANSPOSED>(p, tile_m, tid);
        CorrCursor cur = corr_start<T, FLAT, TRANSPOSED>(p, row, tile_n, tid);
        float acc[T::TM][T::TN];
#pragma unroll
        for (int i = 0; i < T::TM; ++i)
#pragma unroll
            for (int j = 0; j < T::TN; ++j) acc[i][j] = 0.0f;
        float ra[T::BK];
        float4 rb = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (steps > 0) {
            corr_load<T, FLAT, TRANSPOSED>(p, row, cur, ra, rb);
            corr_store<T>(ra, rb, As[0], Bs[0], tid);
            __syncthreads();
        }
        for (int64_t step = 0; step < steps; ++step) {
            const int stage = static_cast<int>(step & 1);
            const bool more = step + 1 < steps;
            if (more) corr_load<T, FLAT, TRANSPOSED>(p, row, cur, ra, rb);
            corr_product<T, FLAT ? 2 : 8>(As[stage], Bs[stage], tid, acc);
            if (more) corr_store<T>(ra, rb, As[stage ^ 1], Bs[stage ^ 1], tid);
            __syncthreads();
        }
        corr_epilogue<T>(p, tile_m, tile_n, tid, acc);
    }
}

template <bool FLAT, bool TRANSPOSED>
__device__ __forceinline__ void corr(const CorrProblem& p) { corr_gemm<CorrTiles, FLAT, TRANSPOSED>(p); }

// The GEMM's packed weights (corr_packed_at) from w.
template <bool TRANSPOSED>
__device__ __forceinline__ void corr_pack(const float* __restrict__ w, float* __restrict__ packed, const CorrProblem& p,
                                          bool flat) {
    using T = CorrTiles;
    CAPSULE_GRID_STRIDE(e, corr_rows<T>(p, flat) * corr_cols<T>(p)) packed[e] = corr_packed_at<T, TRANSPOSED>(w, p, flat, e);
}

// The weight gradient's GEMM, with corr_gemm's two shared stages and one barrier per step.
__device__ __forceinline__ void weight_gemm(const WeightProblem& p) {
    using T = WeightTile;
    alignas(16) __shared__ float As[2][T::BK * T::LDA];
    alignas(16) __shared__ float Bs[2][T::BK * T::LDB];
    if (!block_is(kGemmThreads)) return;
    const int tid = static_cast<int>(threadIdx.x);
    const int64_t tiles = weight_tiles(p);
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
        const WeightJob job = weight_job(p, t);
        float acc[T::TM][T::TN];
#pragma unroll
        for (int i = 0; i < T::TM; ++i)
#pragma unroll
            for (int j = 0; j < T::TN; ++j) acc[i][j] = 0.0f;
        float ra[T::PER], rb[T::PER];
        if (job.step0 < job.step1) {
            weight_load(p, job, job.step0, tid, ra, rb);
            weight_store(ra, rb, As[0], Bs[0], tid);
            __syncthreads();
        }
        for (int64_t step = job.step0; step < job.step1; ++step) {
            const int stage = static_cast<int>((step - job.step0) & 1);
            const bool more = step + 1 < job.step1;
            if (more) weight_load(p, job, step + 1, tid, ra, rb);
            weight_product(As[stage], Bs[stage], tid, acc);
            if (more) weight_store(ra, rb, As[stage ^ 1], Bs[stage ^ 1], tid);
            __syncthreads();
        }
        weight_epilogue(p, job, tid, acc);
    }
}

// db[c] = Σ g[n, c, o]: one block of kSumThreads per channel (grid-stride over channels); each
// thread's partial, then a fixed tree: butterfly within each warp, warps added in order.
__device__ __forceinline__ void channel_sums(const float* __restrict__ g, float* __restrict__ db, int64_t n,
                                             int64_t channels, int64_t positions) {
    __shared__ float warp_sums[kSumThreads / 32];
    if (!block_is(kSumThreads)) return;
    const int tid = static_cast<int>(threadIdx.x);
    const bool vec = positions % 4 == 0 && aligned16(g);
    for (int64_t c = blockIdx.x; c < channels; c += gridDim.x) {
        float s = channel_partial(g, n, channels, positions, c, tid, kSumThreads, vec);
        s = capsule::group_sum_rn<32>(s);
        if (tid % 32 == 0) warp_sums[tid / 32] = s;
        __syncthreads();
        if (tid == 0) {
            float total = warp_sums[0];
            for (int k = 1; k < kSumThreads / 32; ++k) total = add_rn(total, warp_sums[k]);
            db[c] = total;
        }
        __syncthreads();
    }
}

__device__ __forceinline__ void split_sums(const float* __restrict__ partial, float* __restrict__ dw, int64_t count,
                                           int64_t splits) {
    int64_t tail = 0;
    if (count % 4 == 0 && aligned16(partial) && aligned16(dw)) {
        CAPSULE_GRID_STRIDE(v, count / 4) {
            float4 s = load4(partial, v);
            for (int64_t k = 1; k < splits; ++k) {
                const float4 x = load4(partial + k * count, v);
                s = make_float4(add_rn(s.x, x.x), add_rn(s.y, x.y), add_rn(s.z, x.z), add_rn(s.w, x.w));
            }
            reinterpret_cast<float4*>(dw)[v] = s;
        }
        tail = count;
    }
    CAPSULE_GRID_STRIDE(i, count - tail) dw[tail + i] = split_sum(partial, count, splits, tail + i);
}

}  // namespace

// -- conv -------------------------------------------------------------------------------------
//
// Each GEMM reads its weights packed by the launch before it (_pack; flat != 0 for the _flat GEMM,
// which the correlations have: conv forward, conv_transpose dx).

extern "C" __global__ void capsule_conv_fwd_pack(const float* __restrict__ weight, float* __restrict__ packed, int64_t n, int64_t c_in, int64_t c_out, int64_t d, int64_t h, int64_t w, int64_t od, int64_t oh, int64_t ow, int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh, int64_t sw, int64_t pd, int64_t ph, int64_t pw, int32_t flat) {
    corr_pack<false>(weight, packed, CorrProblem{nullptr, nullptr, nullptr, nullptr, n, c_in, c_out, dims(d, h, w), dims(od, oh, ow), window(kd, kh, kw, sd, sh, sw, pd, ph, pw)}, flat != 0);
}

extern "C" __global__ __launch_bounds__(128, 4) void capsule_conv_fwd(const float* __restrict__ x, const float* __restrict__ packed, const float* __restrict__ b, float* __restrict__ y, int64_t n, int64_t c_in, int64_t c_out, int64_t d, int64_t h, int64_t w, int64_t od, int64_t oh, int64_t ow, int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh, int64_t sw, int64_t pd, int64_t ph, int64_t pw) {
    corr<false, false>(CorrProblem{x, packed, b, y, n, c_in, c_out, dims(d, h, w), dims(od, oh, ow), window(kd, kh, kw, sd, sh, sw, pd, ph, pw)});
}

extern "C" __global__ __launch_bounds__(128, 4) void capsule_conv_fwd_flat(const float* __restrict__ x, const float* __restrict__ packed, const float* __restrict__ b, float* __restrict__ y, int64_t n, int64_t c_in, int64_t c_out, int64_t d, int64_t h, int64_t w, int64_t od, int64_t oh, int64_t ow, int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh, int64_t sw, int64_t pd, int64_t ph, int64_t pw) {
    corr<true, false>(CorrProblem{x, packed, b, y, n, c_in, c_out, dims(d, h, w), dims(od, oh, ow), window(kd, kh, kw, sd, sh, sw, pd, ph, pw)});
}

// dx = the adjoint of the correlation: a gather from the windows that touch each cell of x.
extern "C" __global__ void capsule_conv_bwd_x_pack(const float* __restrict__ weight, float* __restrict__ packed, int64_t n, int64_t c_in, int64_t c_out, int64_t d, int64_t h, int64_t w, int64_t od, int64_t oh, int64_t ow, int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh, int64_t sw, int64_t pd, int64_t ph, int64_t pw, int32_t flat) {
    corr_pack<true>(weight, packed, CorrProblem{nullptr, nullptr, nullptr, nullptr, n, c_out, c_in, dims(od, oh, ow), dims(d, h, w), window(kd, kh, kw, sd, sh, sw, pd, ph, pw)}, flat != 0);
}

extern "C" __global__ __launch_bounds__(128, 4) void capsule_conv_bwd_x(const float* __restrict__ g, const float* __restrict__ packed, float* __restrict__ dx, int64_t n, int64_t c_in, int64_t c_out, int64_t d, int64_t h, int64_t w, int64_t od, int64_t oh, int64_t ow, int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh, int64_t sw, int64_t pd, int64_t ph, int64_t pw) {
    corr<false, true>(CorrProblem{g, packed, nullptr, dx, n, c_out, c_in, dims(od, oh, ow), dims(d, h, w), window(kd, kh, kw, sd, sh, sw, pd, ph, pw)});
}

extern "C" __global__ __launch_bounds__(128, 6) void capsule_conv_bwd_w(const float* __restrict__ x, const float* __restrict__ g, float* __restrict__ dw, float* __restrict__ partial, int64_t n, int64_t c_in, int64_t c_out, int64_t d, int64_t h, int64_t w, int64_t od, int64_t oh, int64_t ow, int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh, int64_t sw, int64_t pd, int64_t ph, int64_t pw, int64_t splits) {
    weight_gemm(WeightProblem{g, x, dw, partial, n, c_out, c_in, dims(od, oh, ow), dims(d, h, w), window(kd, kh, kw, sd, sh, sw, pd, ph, pw), splits});
}

extern "C" __global__ void capsule_conv_bwd_wsum(const float* __restrict__ partial, float* __restrict__ dw, int64_t count, int64_t splits) {
    split_sums(partial, dw, count, splits);
}

extern "C" __global__ void capsule_conv_bwd_b(const float* __restrict__ g, float* __restrict__ db, int64_t n, int64_t c_in, int64_t c_out, int64_t d, int64_t h, int64_t w, int64_t od, int64_t oh, int64_t ow, int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh, int64_t sw, int64_t pd, int64_t ph, int64_t pw) {
    channel_sums(g, db, n, c_out, od * oh * ow);
}

// -- conv_transpose ---------------------------------------------------------------------------

// The forward: conv's dx with the roles of the operands swapped, plus the bias.
extern "C" __global__ void capsule_conv_transpose_fwd_pack(const float* __restrict__ weight, float* __restrict__ packed, int64_t n, int64_t c_in, int64_t c_out, int64_t d, int64_t h, int64_t w, int64_t od, int64_t oh, int64_t ow, int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh, int64_t sw, int64_t pd, int64_t ph, int64_t pw, int32_t flat) {
    corr_pack<true>(weight, packed, CorrProblem{nullptr, nullptr, nullptr, nullptr, n, c_in, c_out, dims(d, h, w), dims(od, oh, ow), window(kd, kh, kw, sd, sh, sw, pd, ph, pw)}, flat != 0);
}

extern "C" __global__ __launch_bounds__(128, 4) void capsule_conv_transpose_fwd(const float* __restrict__ x, const float* __restrict__ packed, const float* __restrict__ b, float* __restrict__ y, int64_t n, int64_t c_in, int64_t c_out, int64_t d, int64_t h, int64_t w, int64_t od, int64_t oh, int64_t ow, int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh, int64_t sw, int64_t pd, int64_t ph, int64_t pw) {
    corr<false, true>(CorrProblem{x, packed, b, y, n, c_in, c_out, dims(d, h, w), dims(od, oh, ow), window(kd, kh, kw, sd, sh, sw, pd, ph, pw)});
}

// dx: conv's forward (no bias) of g; w (c_in, c_out, k) is a correlation weight from c_out to c_in channels.
extern "C" __global__ void capsule_conv_transpose_bwd_x_pack(const float* __restrict__ weight, float* __restrict__ packed, int64_t n, int64_t c_in, int64_t c_out, int64_t d, int64_t h, int64_t w, int64_t od, int64_t oh, int64_t ow, int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh, int64_t sw, int64_t pd, int64_t ph, int64_t pw, int32_t flat) {
    corr_pack<false>(weight, packed, CorrProblem{nullptr, nullptr, nullptr, nullptr, n, c_out, c_in, dims(od, oh, ow), dims(d, h, w), window(kd, kh, kw, sd, sh, sw, pd, ph, pw)}, flat != 0);
}

extern "C" __global__ __launch_bounds__(128, 4) void capsule_conv_transpose_bwd_x(const float* __restrict__ g, const float* __restrict__ packed, float* __restrict__ dx, int64_t n, int64_t c_in, int64_t c_out, int64_t d, int64_t h, int64_t w, int64_t od, int64_t oh, int64_t ow, int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh, int64_t sw, int64_t pd, int64_t ph, int64_t pw) {
    corr<false, false>(CorrProblem{g, packed, nullptr, dx, n, c_out, c_in, dims(od, oh, ow), dims(d, h, w), window(kd, kh, kw, sd, sh, sw, pd, ph, pw)});
}

extern "C" __global__ __launch_bounds__(128, 4) void capsule_conv_transpose_bwd_x_flat(const float* __restrict__ g, const float* __restrict__ packed, float* __restrict__ dx, int64_t n, int64_t c_in, int64_t c_out, int64_t d, int64_t h, int64_t w, int64_t od, int64_t oh, int64_t ow, int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh, int64_t sw, int64_t pd, int64_t ph, int64_t pw) {
    corr<true, false>(CorrProblem{g, packed, nullptr, dx, n, c_out, c_in, dims(od, oh, ow), dims(d, h, w), window(kd, kh, kw, sd, sh, sw, pd, ph, pw)});
}

extern "C" __global__ __launch_bounds__(128, 6) void capsule_conv_transpose_bwd_w(const float* __restrict__ x, const float* __restrict__ g, float* __restrict__ dw, float* __restrict__ partial, int64_t n, int64_t c_in, int64_t c_out, int64_t d, int64_t h, int64_t w, int64_t od, int64_t oh, int64_t ow, int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh, int64_t sw, int64_t pd, int64_t ph, int64_t pw, int64_t splits) {
    // conv's weight gradient with x in the role of the cotangent and g in the role of the input.
    weight_gemm(WeightProblem{x, g, dw, partial, n, c_in, c_out, dims(d, h, w), dims(od, oh, ow), window(kd, kh, kw, sd, sh, sw, pd, ph, pw), splits});
}

extern "C" __global__ void capsule_conv_transpose_bwd_wsum(const float* __restrict__ partial, float* __restrict__ dw, int64_t count, int64_t splits) {
    split_sums(partial, dw, count, splits);
}

extern "C" __global__ void capsule_conv_transpose_bwd_b(const float* __restrict__ g, float* __restrict__ db, int64_t n, int64_t c_in, int64_t c_out, int64_t d, int64_t h, int64_t w, int64_t od, int64_t oh, int64_t ow, int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh, int64_t sw, int64_t pd, int64_t ph, int64_t pw) {
    channel_sums(g, db, n, c_out, od * oh * ow);
}

// -- pooling: one thread per output (forward) or per input cell (backward) --------------------

extern "C" __global__ __launch_bounds__(256, 4) void capsule_max_pool_fwd(const float* __restrict__ x, float* __restrict__ y, int64_t planes, int64_t d, int64_t h, int64_t w, int64_t od, int64_t oh, int64_t ow, int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh, int64_t sw, int64_t pd, int64_t ph, int64_t pw) {
    const PoolGeom geo = pool(planes, d, h, w, od, oh, ow, kd, kh, kw, sd, sh, sw, pd, ph, pw);
    CAPSULE_GRID_STRIDE(i, planes * volume(geo.out)) y[i] = max_pool_at(x, geo, i);
}

// The backward in two passes: every window's first maximum once into a workspace, then a gather
// per input cell over the argmax of its covering windows only. The argmax is a cell of its plane:
// 32-bit while a plane has fewer than 2^31 cells (half the workspace traffic of 64-bit), 64-bit
// past that (the _wide entry points).
template <class Index>
__device__ __forceinline__ void max_pool_argmax_pass(const float* __restrict__ x, Index* __restrict__ argmax, const PoolGeom& geo) {
    CAPSULE_GRID_STRIDE(i, geo.planes * volume(geo.out)) argmax[i] = static_cast<Index>(max_pool_argmax_at(x, geo, i));
}

template <class Index>
__device__ __forceinline__ void max_pool_gather_pass(const Index* __restrict__ argmax, const float* __restrict__ g, float* __restrict__ dx,
                                                     const PoolGeom& geo) {
    CAPSULE_GRID_STRIDE(i, geo.planes * volume(geo.in)) dx[i] = max_pool_grad_at(argmax, g, geo, i);
}

extern "C" __global__ __launch_bounds__(256, 4) void capsule_max_pool_bwd_argmax(const float* __restrict__ x, int32_t* __restrict__ argmax, int64_t planes, int64_t d, int64_t h, int64_t w, int64_t od, int64_t oh, int64_t ow, int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh, int64_t sw, int64_t pd, int64_t ph, int64_t pw) {
    max_pool_argmax_pass(x, argmax, pool(planes, d, h, w, od, oh, ow, kd, kh, kw, sd, sh, sw, pd, ph, pw));
}

extern "C" __global__ __launch_bounds__(256, 4) void capsule_max_pool_bwd_argmax_wide(const float* __restrict__ x, int64_t* __restrict__ argmax, int64_t planes, int64_t d, int64_t h, int64_t w, int64_t od, int64_t oh, int64_t ow, int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh, int64_t sw, int64_t pd, int64_t ph, int64_t pw) {
    max_pool_argmax_pass(x, argmax, pool(planes, d, h, w, od, oh, ow, kd, kh, kw, sd, sh, sw, pd, ph, pw));
}

extern "C" __global__ __launch_bounds__(256, 4) void capsule_max_pool_bwd(const int32_t* __restrict__ argmax, const float* __restrict__ g, float* __restrict__ dx, int64_t planes, int64_t d, int64_t h, int64_t w, int64_t od, int64_t oh, int64_t ow, int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh, int64_t sw, int64_t pd, int64_t ph, int64_t pw) {
    max_pool_gather_pass(argmax, g, dx, pool(planes, d, h, w, od, oh, ow, kd, kh, kw, sd, sh, sw, pd, ph, pw));
}

extern "C" __global__ __launch_bounds__(256, 4) void capsule_max_pool_bwd_wide(const int64_t* __restrict__ argmax, const float* __restrict__ g, float* __restrict__ dx, int64_t planes, int64_t d, int64_t h, int64_t w, int64_t od, int64_t oh, int64_t ow, int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh, int64_t sw, int64_t pd, int64_t ph, int64_t pw) {
    max_pool_gather_pass(argmax, g, dx, pool(planes, d, h, w, od, oh, ow, kd, kh, kw, sd, sh, sw, pd, ph, pw));
}

extern "C" __global__ void capsule_smooth_max_pool_fwd(const float* __restrict__ x, float* __restrict__ y, int64_t planes, int64_t d, int64_t h, int64_t w, int64_t od, int64_t oh, int64_t ow, int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh, int64_t sw, int64_t pd, int64_t ph, int64_t pw, float beta) {
    const PoolGeom geo = pool(planes, d, h, w, od, oh, ow, kd, kh, kw, sd, sh, sw, pd, ph, pw);
    CAPSULE_GRID_STRIDE(i, planes * volume(geo.out)) y[i] = smooth_max_pool_at(x, geo, beta, i);
}

extern "C" __global__ void capsule_smooth_max_pool_bwd(const float* __restrict__ x, const float* __restrict__ y, const float* __restrict__ g, float* __restrict__ dx, int64_t planes, int64_t d, int64_t h, int64_t w, int64_t od, int64_t oh, int64_t ow, int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh, int64_t sw, int64_t pd, int64_t ph, int64_t pw, float beta) {
    const PoolGeom geo = pool(planes, d, h, w, od, oh, ow, kd, kh, kw, sd, sh, sw, pd, ph, pw);
    CAPSULE_GRID_STRIDE(i, planes * volume(geo.in)) dx[i] = smooth_max_pool_grad_at(x, y, g, geo, beta, i);
}

extern "C" __global__ void capsule_avg_pool_fwd(const float* __restrict__ x, float* __restrict__ y, int64_t planes, int64_t d, int64_t h, int64_t w, int64_t od, int64_t oh, int64_t ow, int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh, int64_t sw, int64_t pd, int64_t ph, int64_t pw) {
    const PoolGeom geo = pool(planes, d, h, w, od, oh, ow, kd, kh, kw, sd, sh, sw, pd, ph, pw);
    CAPSULE_GRID_STRIDE(i, planes * volume(geo.out)) y[i] = avg_pool_at(x, geo, i);
}

extern "C" __global__ void capsule_avg_pool_bwd(const float* __restrict__ g, float* __restrict__ dx, int64_t planes, int64_t d, int64_t h, int64_t w, int64_t od, int64_t oh, int64_t ow, int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh, int64_t sw, int64_t pd, int64_t ph, int64_t pw) {
    const PoolGeom geo = pool(planes, d, h, w, od, oh, ow, kd, kh, kw, sd, sh, sw, pd, ph, pw);
    CAPSULE_GRID_STRIDE(i, planes * volume(geo.in)) dx[i] = avg_pool_grad_at(g, geo, i);
}
