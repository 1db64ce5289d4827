// The linalg family: matmul and linear through one SGEMM core (linalg.cuh: shared-memory k-tiles,
// double-buffered, register micro-tiles, 16-byte loads where legal), mse_loss as a deterministic
// two-pass reduction, linear's bias gradient as column sums over row chunks. No atomics.
#include <cstdint>

#include "common.cuh"
#include "linalg.cuh"

namespace {

using namespace capsule_la;

constexpr int GEMM_SMEM_FLOATS =
    BigTile::SMEM_FLOATS > SmallTile::SMEM_FLOATS ? BigTile::SMEM_FLOATS : SmallTile::SMEM_FLOATS;

// Every tile of the GEMM, grid-stride: correct for any grid.
template <class T, class Map, class Epi>
__device__ __forceinline__ void gemm_tiles(const Gemm& g, float* smem, const Epi& epi) {
    const int64_t tiles = g.batch * cdiv(g.m, T::BM) * cdiv(g.n, T::BN);
    GemmRegs<T, Map::AT, Map::BT> regs[1];
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
        gemm_tile<T, Map::AT, Map::BT>(DeviceThreads{}, g, t, smem, regs, epi);
    }
}

// The block names the tile shape: 256 threads BigTile, 128 threads SmallTile (the launch plan
// picks one per problem). Any other block is a plan error: trap rather than leave C unwritten.
template <class Map, class Epi>
__device__ __forceinline__ void gemm(const Gemm& g, const Epi& epi) {
    __shared__ __align__(16) float smem[GEMM_SMEM_FLOATS];
    if (blockDim.y != 1 || blockDim.z != 1) __trap();
    if (blockDim.x == BigTile::THREADS) {
        gemm_tiles<BigTile, Map>(g, smem, epi);
    } else if (blockDim.x == SmallTile::THREADS) {
        gemm_tiles<SmallTile, Map>(g, smem, epi);
    } else {
        __trap();
    }
}

// Sum over the block (blockDim.x a multiple of 32): warp sums (capsule::group_sum), then warp 0
// sums those in warp order. The result is valid in thread 0; `scratch` holds 32 doubles and may
// be reused at once.
__device__ __forceinline__ double block_sum(double v, double* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = capsule::group_sum<32>(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) v = capsule::group_sum<32>(lane < warps ? scratch[lane] : 0.0);
    return v;
}

}  // namespace

// -- matmul -----------------------------------------------------------------------------------------

extern "C" __global__ __launch_bounds__(256, 2) void capsule_matmul_fwd(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ y, int64_t batch, int64_t m, int64_t k, int64_t n) {
    gemm<MatmulFwd>(MatmulFwd::map(a, b, y, batch, m, k, n), NoBias{});
}

extern "C" __global__ __launch_bounds__(256, 2) void capsule_matmul_bwd_a(const float* __restrict__ g, const float* __restrict__ b, float* __restrict__ da, int64_t batch, int64_t m, int64_t k, int64_t n) {
    gemm<MatmulBwdA>(MatmulBwdA::map(g, b, da, batch, m, k, n), NoBias{});
}

extern "C" __global__ __launch_bounds__(256, 2) void capsule_matmul_bwd_b(const float* __restrict__ a, const float* __restrict__ g, float* __restrict__ db, int64_t batch, int64_t m, int64_t k, int64_t n) {
    gemm<MatmulBwdB>(MatmulBwdB::map(a, g, db, batch, m, k, n), NoBias{});
}

// -- linear -----------------------------------------------------------------------------------------

extern "C" __global__ __launch_bounds__(256, 2) void capsule_linear_fwd(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b, float* __restrict__ y, int64_t rows, int64_t in_features, int64_t out_features) {
    gemm<LinearFwd>(LinearFwd::map(x, w, y, rows, in_features, out_features), AddBias{b});
}

extern "C" __global__ __launch_bounds__(256, 2) void capsule_linear_bwd_x(const float* __restrict__ g, const float* __restrict__ w, float* __restrict__ dx, int64_t rows, int64_t in_features, int64_t out_features) {
    gemm<LinearBwdX>(LinearBwdX::map(g, w, dx, rows, in_features, out_features), NoBias{});
}

extern "C" __global__ __launch_bounds__(256, 2) void capsule_linear_bwd_w(const float* __restrict__ x, const float* __restrict__ g, float* __restrict__ dw, int64_t rows, int64_t in_features, int64_t out_features) {
    gemm<LinearBwdW>(LinearBwdW::map(x, g, dw, rows, in_features, out_features), NoBias{});
}

// db[c][j] = Σ g[r][j] over the rows of chunk c (rows ≥ 1 chunk each, zero rows give one chunk
// of zeros). One block per (chunk, 32-column strip): lane = column (coalesced rows), warp =
// row phase; the warps' partial sums are added in warp order. The plan runs it once over g
// (one chunk), or twice: over row chunks into a workspace, then over that workspace's rows.
extern "C" __global__ __launch_bounds__(1024) void capsule_linear_bwd_b(const float* __restrict__ g, float* __restrict__ db, int64_t rows, int64_t cols, int64_t row_chunk) {
    __shared__ float part[32][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (blockDim.x % 32 != 0 || blockDim.y != 1 || blockDim.z != 1) __trap();
    const int64_t chunk = row_chunk < 1 ? 1 : row_chunk;
    const int64_t chunks = column_chunks(rows, chunk), strips = cdiv(cols, 32);
    for (int64_t item = blockIdx.x; item < chunks * strips; item += gridDim.x) {
        const int64_t c = item / strips, j = (item - c * strips) * 32 + lane;
        const int64_t r0 = c * chunk, r1 = min64(rows, r0 + chunk);
        const float v = j < cols ? column_partial(g, cols, r0, r1, j, warp, warps) : 0.0f;
        __syncthreads();
        part[warp][lane] = v;
        __syncthreads();
        if (warp == 0 && j < cols) {
            float s = part[0][lane];
            for (int w = 1; w < warps; ++w) s = add_rn(s, part[w][lane]);
            db[c * cols + j] = s;
        }
    }
}

// -- mse_loss ---------------------------------------------------------------------------------------

// stage 0: the squared differences of each chunk of `chunk` elements (a multiple of 4), one block
// per chunk; with a single chunk the block writes y = sum / n itself, otherwise the chunk sums go
// to `partials` as doubles (2 floats each). stage 1 (block 0): y = (Σ partials) / n.
extern "C" __global__ __launch_bounds__(1024) void capsule_mse_loss_fwd(const float* __restrict__ pred, const float* __restrict__ target, float* __restrict__ partials, float* __restrict__ y, int64_t n, int64_t chunk, int32_t stage) {
    __shared__ double scratch[32];
    if (blockDim.x % 32 != 0 || blockDim.y != 1 || blockDim.z != 1 || chunk < 1) __trap();
    double* const sums = reinterpret_cast<double*>(partials);
    const int64_t chunks = cdiv(n, chunk);
    const int tid = threadIdx.x, threads = blockDim.x;
    if (stage == 0) {
        const bool vec = aligned16(pred) && aligned16(target) && chunk % 4 == 0;
        for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
            const int64_t lo = c * chunk;
            const double s = block_sum(mse_thread_sum(pred, target, lo, min64(n, lo + chunk), tid, threads, vec), scratch);
            if (tid == 0) {
                if (chunks == 1) {
                    y[0] = mse_mean(s, n);
                } else {
                    sums[c] = s;
                }
            }
        }
    } else if (blockIdx.x == 0) {
        double s = 0.0;
        for (int64_t c = tid; c < chunks; c += threads) s += sums[c];
        s = block_sum(s, scratch);
        if (tid == 0) y[0] = mse_mean(s, n);
    }
}

// dpred = (pred − target)·(g·(2/n)), dtarget = −dpred: float4 when every buffer is aligned.
extern "C" __global__ __launch_bounds__(1024) void capsule_mse_loss_bwd(const float* __restrict__ pred, const float* __restrict__ target, const float* __restrict__ g, float* __restrict__ dpred, float* __restrict__ dtarget, int64_t n) {
    const float scale = mse_grad_scale(ldg(g), n);
    const int64_t first = capsule::thread_index();
    const int64_t step = capsule::thread_count();
    int64_t rest = 0;
    if (aligned16(pred) && aligned16(target) && aligned16(dpred) && aligned16(dtarget)) {
        rest = n / 4 * 4;
        for (int64_t v = 4 * first; v < rest; v += 4 * step) {
            float p[4], t[4], d[4], e[4];
            ldg4(pred + v, p);
            ldg4(target + v, t);
#pragma unroll
            for (int x = 0; x < 4; ++x) {
                d[x] = mse_grad(p[x], t[x], scale);
                e[x] = -d[x];
            }
            stg4(dpred + v, d);
            stg4(dtarget + v, e);
        }
    }
    for (int64_t i = rest + first; i < n; i += step) {
        const float d = mse_grad(ldg(pred + i), ldg(target + i), scale);
        dpred[i] = d;
        dtarget[i] = -d;
    }
}
