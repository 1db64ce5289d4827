// Host harness of cuda/linalg.cuh: the per-thread tile and thread arithmetic and the mse term,
// callable from ctypes, and the plain sequential FMA chain every SGEMM output must equal.
#include <cstdint>

#include "linalg.cuh"

using namespace capsule_la;

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

// Where each thread of a block sits: its micro-tile rows and columns.
extern "C" void host_thread_layout(int big, int tid, int* rows, int* cols) {
    if (big) {
        for (int r = 0; r < BigTile::TM; ++r) rows[r] = tile_row<BigTile>(thread_y<BigTile>(tid), r);
        for (int c = 0; c < BigTile::TN; ++c) cols[c] = tile_col<BigTile>(thread_x<BigTile>(tid), c);
    } else {
        for (int r = 0; r < SmallTile::TM; ++r) rows[r] = tile_row<SmallTile>(thread_y<SmallTile>(tid), r);
        for (int c = 0; c < SmallTile::TN; ++c) cols[c] = tile_col<SmallTile>(thread_x<SmallTile>(tid), c);
    }
}

extern "C" double host_mse_accumulate(double s, float p, float t) { return mse_accumulate(s, p, t); }
