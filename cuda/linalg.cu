// The linalg family: matmul and linear through one SGEMM core (linalg.cuh: k-tiles copied by
// cp.async into a three-stage shared-memory ring, register micro-tiles, 16-byte accesses where
// legal), split-K for few tiles (partial tiles into a workspace, then a second launch adds them in
// split order), linear's forward for few rows as a GEMV, mse_loss as a deterministic two-pass
// reduction, linear's bias gradient as column sums over row chunks. No atomics.
#include <cstdint>

#include "common.cuh"
#include "linalg.cuh"

namespace {

using namespace capsule_la;

constexpr int GEMM_SMEM_FLOATS =
    BigTile::SMEM_FLOATS > SmallTile::SMEM_FLOATS ? BigTile::SMEM_FLOATS : SmallTile::SMEM_FLOATS;

// Every tile of the GEMM (of every split), grid-stride: correct for any grid. Split by split, so
// blocks running together share a k range (its A and B slices in L2).
template <class T, class Map, class Epi>
__device__ __forceinline__ void gemm_tiles(const Gemm& g, float* smem, const Epi& epi) {
    const int64_t tiles = g.batch * cdiv(g.m, T::BM) * cdiv(g.n, T::BN);
    for (int64_t t = blockIdx.x; t < tiles * g.splits; t += gridDim.x) {
        gemm_tile<T, Map::AT, Map::BT>(g, t, smem, epi);
    }
}

// The block names the tile shape: 256 threads BigTile, 128 threads SmallTile (the launch plan
// picks one per problem). Any other block is a plan error: trap rather than leave C unwritten;
// likewise a split count below 1. splits > 1: the partial products go to `partial`.
template <class Map, class Epi>
__device__ __forceinline__ void gemm(Gemm g, float* partial, int64_t splits, const Epi& epi) {
    __shared__ __align__(16) float smem[GEMM_SMEM_FLOATS];
    if (blockDim.y != 1 || blockDim.z != 1 || splits < 1) __trap();
    g.partial = partial;
    g.splits = splits;
    begin_async();
    if (blockDim.x == BigTile::THREADS) {
        gemm_tiles<BigTile, Map>(g, smem, epi);
    } else if (blockDim.x == SmallTile::THREADS) {
        gemm_tiles<SmallTile, Map>(g, smem, epi);
    } else {
        __trap();
    }
}

// A lane's FMA chains of a GEMV column group (columns j0, …): elements p, p+1, p+2, p+3 of the
// chunks p = p0, p0 + stride, … of k, for each row of x and each column. VEC: every chunk one
// 16-byte load per row (x and w aligned, k a multiple of 4), otherwise element by element,
// stopping at k; the same FMAs in the same order either way. Columns past the last are computed
// from the last one's weights and never stored.
template <class G, bool VEC>
__device__ __forceinline__ void gemv_chains(const float* __restrict__ x, const float* __restrict__ w, int64_t rows,
                                            int64_t k, int64_t out_features, int64_t j0, int64_t p0, int64_t stride,
                                            float (&acc)[G::ROWS][G::COLS]) {
    const float* wr[G::COLS];
#pragma unroll
    for (int c = 0; c < G::COLS; ++c) wr[c] = w + min64(j0 + c, out_features - 1) * k;
    for (int64_t p = p0; p < k; p += stride) {
        if (VEC) {
            float wv[G::COLS][4];
#pragma unroll
            for (int c = 0; c < G::COLS; ++c) ldg4(wr[c] + p, wv[c]);
#pragma unroll
            for (int r = 0; r < G::ROWS; ++r) {
                if (r < rows) {
                    float xv[4];
                    ldg4(x + r * k + p, xv);
#pragma unroll
                    for (int c = 0; c < G::COLS; ++c) acc[r][c] = dot4(xv, wv[c], acc[r][c]);
                }
            }
        } else {
#pragma unroll 1
            for (int64_t e = p; e < p + 4 && e < k; ++e) {
                float wv[G::COLS];
#pragma unroll
                for (int c = 0; c < G::COLS; ++c) wv[c] = ldg(wr[c] + e);
#pragma unroll
                for (int r = 0; r < G::ROWS; ++r) {
                    if (r < rows) {
                        const float xv = ldg(x + r * k + e);
#pragma unroll
                        for (int c = 0; c < G::COLS; ++c) acc[r][c] = fma_rn(xv, wv[c], acc[r][c]);
                    }
                }
            }
        }
    }
}

// out[e] = Σ_s partial[s·count + e] + bias[e mod cols] (bias may be null), s ascending: the
// second launch of a split-K GEMM. 16-byte loads and stores when every split's base and out
// are aligned (and a float4 stays within one row of the bias).
__device__ __forceinline__ void split_sums(const float* __restrict__ partial, const float* __restrict__ bias,
                                           float* __restrict__ out, int64_t count, int64_t cols, int64_t splits) {
    if (splits < 1 || cols < 1) __trap();
    int64_t tail = 0;
    if (count % 4 == 0 && aligned16(partial) && aligned16(out) && (bias == nullptr || cols % 4 == 0)) {
        CAPSULE_GRID_STRIDE(v, count / 4) {
            float s[4];
            ldg4(partial + 4 * v, s);
            for (int64_t k = 1; k < splits; ++k) {
                float x[4];
                ldg4(partial + k * count + 4 * v, x);
#pragma unroll
                for (int q = 0; q < 4; ++q) s[q] = add_rn(s[q], x[q]);
            }
            if (bias != nullptr) {
                const int64_t j = (4 * v) % cols;
#pragma unroll
                for (int q = 0; q < 4; ++q) s[q] = add_rn(s[q], ldg(bias + j + q));
            }
            stg4(out + 4 * v, s);
        }
        tail = count;
    }
    CAPSULE_GRID_STRIDE(i, count - tail) {
        const int64_t e = tail + i;
        const float s = split_sum(partial, count, splits, e);
        out[e] = bias != nullptr ? add_rn(s, ldg(bias + e % cols)) : s;
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

// splits == 1: y = a·b. splits > 1: the splits' partial products into `partial` (splits × the
// size of y), y untouched; capsule_matmul_fwd_ksum adds them. Likewise for the gradients.
extern "C" __global__ __launch_bounds__(256, 2) void capsule_matmul_fwd(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ y, float* __restrict__ partial, int64_t batch, int64_t m, int64_t k, int64_t n, int64_t splits) {
    gemm<MatmulFwd>(MatmulFwd::map(a, b, y, batch, m, k, n), partial, splits, NoBias{});
}

extern "C" __global__ __launch_bounds__(256, 2) void capsule_matmul_bwd_a(const float* __restrict__ g, const float* __restrict__ b, float* __restrict__ da, float* __restrict__ partial, int64_t batch, int64_t m, int64_t k, int64_t n, int64_t splits) {
    gemm<MatmulBwdA>(MatmulBwdA::map(g, b, da, batch, m, k, n), partial, splits, NoBias{});
}

extern "C" __global__ __launch_bounds__(256, 2) void capsule_matmul_bwd_b(const float* __restrict__ a, const float* __restrict__ g, float* __restrict__ db, float* __restrict__ partial, int64_t batch, int64_t m, int64_t k, int64_t n, int64_t splits) {
    gemm<MatmulBwdB>(MatmulBwdB::map(a, g, db, batch, m, k, n), partial, splits, NoBias{});
}

// The sums of a split-K product's partials (count elements each), split order.
extern "C" __global__ void capsule_matmul_fwd_ksum(const float* __restrict__ partial, float* __restrict__ out, int64_t count, int64_t splits) {
    split_sums(partial, nullptr, out, count, 1, splits);
}

extern "C" __global__ void capsule_matmul_bwd_ksum(const float* __restrict__ partial, float* __restrict__ out, int64_t count, int64_t splits) {
    split_sums(partial, nullptr, out, count, 1, splits);
}

// -- linear -----------------------------------------------------------------------------------------

extern "C" __global__ __launch_bounds__(256, 2) void capsule_linear_fwd(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b, float* __restrict__ y, float* __restrict__ partial, int64_t rows, int64_t in_features, int64_t out_features, int64_t splits) {
    gemm<LinearFwd>(LinearFwd::map(x, w, y, rows, in_features, out_features), partial, splits, AddBias{b});
}

// y = Σ_s partial[s] + b (rows × out_features each), split order, the bias last.
extern "C" __global__ void capsule_linear_fwd_ksum(const float* __restrict__ partial, const float* __restrict__ b, float* __restrict__ y, int64_t rows, int64_t out_features, int64_t splits) {
    split_sums(partial, b, y, rows * out_features, out_features, splits);
}

// y = x·wᵀ + b for rows ≤ G::ROWS (linalg.cuh's GEMV tiles). Each warp: G::COLS columns, slice
// (warp mod k_warps) of k; the block's warps / k_warps column groups, grid-stride. Outputs are
// independent of the grid; blockDim.x (whole warps, at most GEMV_THREADS, a multiple of
// 32·k_warps) and k_warps set the summation order, so the plan derives them from the shape.
template <class G>
__device__ __forceinline__ void gemv(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                                     float* __restrict__ y, int64_t rows, int64_t in_features, int64_t out_features,
                                     int32_t k_warps) {
    __shared__ float part[GEMV_THREADS / 32][G::ROWS * G::COLS];
    const int warps = static_cast<int>(blockDim.x >> 5);
    if (blockDim.x % 32 != 0 || blockDim.x > GEMV_THREADS || blockDim.y != 1 || blockDim.z != 1 || k_warps < 1 ||
        warps % k_warps != 0 || rows > G::ROWS) {
        __trap();
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int per_block = warps / k_warps;
    const int64_t k = in_features, groups = cdiv(out_features, G::COLS);
    const int64_t stride = 4 * 32 * static_cast<int64_t>(k_warps);
    const bool vec = aligned16(x) && aligned16(w) && k % 4 == 0;
    for (int64_t first = blockIdx.x * static_cast<int64_t>(per_block); first < groups;
         first += static_cast<int64_t>(gridDim.x) * per_block) {
        const int64_t group = first + warp / k_warps, j0 = group * G::COLS;
        float acc[G::ROWS][G::COLS];
#pragma unroll
        for (int r = 0; r < G::ROWS; ++r) {
#pragma unroll
            for (int c = 0; c < G::COLS; ++c) acc[r][c] = 0.0f;
        }
        if (group < groups && rows > 0) {
            const int64_t p0 = 4 * static_cast<int64_t>((warp % k_warps) * 32 + lane);
            if (vec) {
                gemv_chains<G, true>(x, w, rows, k, out_features, j0, p0, stride, acc);
            } else {
                gemv_chains<G, false>(x, w, rows, k, out_features, j0, p0, stride, acc);
            }
        }
#pragma unroll
        for (int r = 0; r < G::ROWS; ++r) {
            if (r < rows) {
#pragma unroll
                for (int c = 0; c < G::COLS; ++c) acc[r][c] = capsule::group_sum_rn<32>(acc[r][c]);
            }
        }
        __syncthreads();
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < G::ROWS; ++r) {
#pragma unroll
                for (int c = 0; c < G::COLS; ++c) part[warp][r * G::COLS + c] = acc[r][c];
            }
        }
        __syncthreads();
        for (int t = threadIdx.x; t < per_block * G::ROWS * G::COLS; t += blockDim.x) {
            const int gi = t / (G::ROWS * G::COLS), rc = t % (G::ROWS * G::COLS);
            const int r = rc / G::COLS;
            const int64_t j = (first + gi) * G::COLS + rc % G::COLS;
            if (r < rows && j < out_features) {
                float s = part[gi * k_warps][rc];
                for (int q = 1; q < k_warps; ++q) s = add_rn(s, part[gi * k_warps + q][rc]);
                y[r * out_features + j] = add_rn(s, ldg(b + j));
            }
        }
    }
}

// The GEMV for at most 8 rows (64 registers: four blocks, half the warp slots, per
// multiprocessor) and for at most 16 (128 registers: two blocks).
extern "C" __global__ __launch_bounds__(256, 4) void capsule_linear_fwd_gemv8(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b, float* __restrict__ y, int64_t rows, int64_t in_features, int64_t out_features, int32_t k_warps) {
    gemv<Gemv8>(x, w, b, y, rows, in_features, out_features, k_warps);
}

extern "C" __global__ __launch_bounds__(256, 2) void capsule_linear_fwd_gemv16(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b, float* __restrict__ y, int64_t rows, int64_t in_features, int64_t out_features, int32_t k_warps) {
    gemv<Gemv16>(x, w, b, y, rows, in_features, out_features, k_warps);
}

extern "C" __global__ __launch_bounds__(256, 2) void capsule_linear_bwd_x(const float* __restrict__ g, const float* __restrict__ w, float* __restrict__ dx, float* __restrict__ partial, int64_t rows, int64_t in_features, int64_t out_features, int64_t splits) {
    gemm<LinearBwdX>(LinearBwdX::map(g, w, dx, rows, in_features, out_features), partial, splits, NoBias{});
}

extern "C" __global__ __launch_bounds__(256, 2) void capsule_linear_bwd_w(const float* __restrict__ x, const float* __restrict__ g, float* __restrict__ dw, float* __restrict__ partial, int64_t rows, int64_t in_features, int64_t out_features, int64_t splits) {
    gemm<LinearBwdW>(LinearBwdW::map(x, g, dw, rows, in_features, out_features), partial, splits, NoBias{});
}

// The sums of a split-K gradient's partials (count elements each), split order.
extern "C" __global__ void capsule_linear_bwd_ksum(const float* __restrict__ partial, float* __restrict__ out, int64_t count, int64_t splits) {
    split_sums(partial, nullptr, out, count, 1, splits);
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
