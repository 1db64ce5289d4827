// Host harness of cuda/linalg.cuh: the kernels' own per-thread code run on the host, callable from
// ctypes. The GEMM entry points run gemm_tile over every tile with all of a block's threads as
// slots (each to the next barrier in turn); the reductions mirror the kernels' block trees.
#include <cstdint>
#include <vector>

#include "linalg.cuh"

using namespace capsule_la;

namespace {

template <int N>
struct HostThreads {
    static constexpr int kSlots = N;
    CAPSULE_HD int tid(int s) const { return s; }
    CAPSULE_HD void sync() const {}
};

template <class T, class Map, class Epi>
void run_tiles(const Gemm& g, const Epi& epi) {
    std::vector<GemmRegs<T, Map::AT, Map::BT>> regs(T::THREADS);
    std::vector<float> smem(T::SMEM_FLOATS);
    const int64_t tiles = g.batch * cdiv(g.m, T::BM) * cdiv(g.n, T::BN);
    for (int64_t t = 0; t < tiles; ++t) {
        gemm_tile<T, Map::AT, Map::BT>(HostThreads<T::THREADS>{}, g, t, smem.data(), regs.data(), epi);
    }
}

// The device picks the tile from the block size; so does the harness. -1: no such tile.
template <class Map, class Epi>
int run_gemm(int threads, const Gemm& g, const Epi& epi) {
    if (threads == BigTile::THREADS) {
        run_tiles<BigTile, Map>(g, epi);
    } else if (threads == SmallTile::THREADS) {
        run_tiles<SmallTile, Map>(g, epi);
    } else {
        return -1;
    }
    return 0;
}

// The butterfly of warp_sum over 32 lane values (every lane ends with the same sum).
double warp_sum(std::vector<double>& v, int base) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        double next[32];
        for (int l = 0; l < 32; ++l) next[l] = v[base + l] + v[base + (l ^ offset)];
        for (int l = 0; l < 32; ++l) v[base + l] = next[l];
    }
    return v[base];
}

// block_sum: warp sums, then warp 0 over them (zeros past the last warp); thread 0's value.
double block_sum(std::vector<double> v) {
    const int warps = static_cast<int>(v.size()) / 32;
    std::vector<double> scratch(32, 0.0);
    for (int w = 0; w < warps; ++w) scratch[w] = warp_sum(v, 32 * w);
    return warp_sum(scratch, 0);
}

}  // namespace

extern "C" int host_matmul_fwd(const float* a, const float* b, float* y, int64_t batch, int64_t m, int64_t k, int64_t n,
                               int threads) {
    return run_gemm<MatmulFwd>(threads, MatmulFwd::map(a, b, y, batch, m, k, n), NoBias{});
}

extern "C" int host_matmul_bwd_a(const float* g, const float* b, float* da, int64_t batch, int64_t m, int64_t k, int64_t n,
                                 int threads) {
    return run_gemm<MatmulBwdA>(threads, MatmulBwdA::map(g, b, da, batch, m, k, n), NoBias{});
}

extern "C" int host_matmul_bwd_b(const float* a, const float* g, float* db, int64_t batch, int64_t m, int64_t k, int64_t n,
                                 int threads) {
    return run_gemm<MatmulBwdB>(threads, MatmulBwdB::map(a, g, db, batch, m, k, n), NoBias{});
}

extern "C" int host_linear_fwd(const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in_features,
                               int64_t out_features, int threads) {
    return run_gemm<LinearFwd>(threads, LinearFwd::map(x, w, y, rows, in_features, out_features), AddBias{b});
}

extern "C" int host_linear_bwd_x(const float* g, const float* w, float* dx, int64_t rows, int64_t in_features,
                                 int64_t out_features, int threads) {
    return run_gemm<LinearBwdX>(threads, LinearBwdX::map(g, w, dx, rows, in_features, out_features), NoBias{});
}

extern "C" int host_linear_bwd_w(const float* x, const float* g, float* dw, int64_t rows, int64_t in_features,
                                 int64_t out_features, int threads) {
    return run_gemm<LinearBwdW>(threads, LinearBwdW::map(x, g, dw, rows, in_features, out_features), NoBias{});
}

// The plain sequential FMA chain of every output (p ascending): what each GEMM output must equal.
extern "C" void host_gemm_naive(int at, int bt, const float* a, const float* b, float* c, int64_t batch, int64_t m,
                                int64_t n, int64_t k) {
    for (int64_t e = 0; e < batch; ++e) {
        const float* A = a + e * m * k;
        const float* B = b + e * k * n;
        for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) {
                float s = 0.0f;
                for (int64_t p = 0; p < k; ++p) s = fma_rn(at ? A[p * m + i] : A[i * k + p], bt ? B[j * k + p] : B[p * n + j], s);
                c[e * m * n + i * n + j] = s;
            }
        }
    }
}

extern "C" void host_tile_coords(int64_t t, int64_t tiles_m, int64_t tiles_n, int64_t* out) {
    tile_coords(t, tiles_m, tiles_n, out[0], out[1], out[2]);
}

// Where each thread of a block sits: its micro-tile rows and columns, and its chunk positions.
extern "C" void host_thread_layout(int big, int tid, int* rows, int* cols) {
    if (big) {
        for (int r = 0; r < BigTile::TM; ++r) rows[r] = tile_row<BigTile>(thread_y<BigTile>(tid), r);
        for (int c = 0; c < BigTile::TN; ++c) cols[c] = tile_col<BigTile>(thread_x<BigTile>(tid), c);
    } else {
        for (int r = 0; r < SmallTile::TM; ++r) rows[r] = tile_row<SmallTile>(thread_y<SmallTile>(tid), r);
        for (int c = 0; c < SmallTile::TN; ++c) cols[c] = tile_col<SmallTile>(thread_x<SmallTile>(tid), c);
    }
}

// capsule_mse_loss_fwd's two stages with `threads` threads per block. partials: 2 floats a chunk.
extern "C" void host_mse_loss_fwd(const float* pred, const float* target, float* partials, float* y, int64_t n, int64_t chunk,
                                  int32_t stage, int threads) {
    double* sums = reinterpret_cast<double*>(partials);
    const int64_t chunks = cdiv(n, chunk);
    if (stage == 0) {
        const bool vec = aligned16(pred) && aligned16(target) && chunk % 4 == 0;
        for (int64_t c = 0; c < chunks; ++c) {
            const int64_t lo = c * chunk, hi = min64(n, lo + chunk);
            std::vector<double> v(threads);
            for (int t = 0; t < threads; ++t) v[t] = mse_thread_sum(pred, target, lo, hi, t, threads, vec);
            const double s = block_sum(v);
            if (chunks == 1) {
                y[0] = mse_mean(s, n);
            } else {
                sums[c] = s;
            }
        }
    } else {
        std::vector<double> v(threads, 0.0);
        for (int t = 0; t < threads; ++t) {
            for (int64_t c = t; c < chunks; c += threads) v[t] += sums[c];
        }
        y[0] = mse_mean(block_sum(v), n);
    }
}

extern "C" double host_mse_accumulate(double s, float p, float t) { return mse_accumulate(s, p, t); }

extern "C" void host_mse_loss_bwd(const float* pred, const float* target, const float* g, float* dpred, float* dtarget, int64_t n) {
    const float scale = mse_grad_scale(g[0], n);
    for (int64_t i = 0; i < n; ++i) {
        dpred[i] = mse_grad(pred[i], target[i], scale);
        dtarget[i] = -dpred[i];
    }
}

// capsule_linear_bwd_b with `threads` threads per block: warp w sums rows ≡ w (mod warps), the
// warps' sums are added in warp order.
extern "C" void host_linear_bwd_b(const float* g, float* db, int64_t rows, int64_t cols, int64_t row_chunk, int threads) {
    const int warps = threads / 32;
    const int64_t chunk = row_chunk < 1 ? 1 : row_chunk;
    const int64_t chunks = column_chunks(rows, chunk);
    for (int64_t c = 0; c < chunks; ++c) {
        const int64_t r0 = c * chunk, r1 = min64(rows, r0 + chunk);
        for (int64_t j = 0; j < cols; ++j) {
            float s = column_partial(g, cols, r0, r1, j, 0, warps);
            for (int w = 1; w < warps; ++w) s = add_rn(s, column_partial(g, cols, r0, r1, j, w, warps));
            db[c * cols + j] = s;
        }
    }
}
