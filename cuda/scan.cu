// selective_scan: h[t] = A[t]·h[t−1] + Bc[t]·X[t] per (batch, channel), as a chunked scan inside
// one block. A block of (DT channels, CH chunks) threads owns DT consecutive channels of one batch
// entry (channels are the fast thread index: coalesced loads of X, A and Bc at every step); thread
// (d, j) owns the time steps of chunk j:
//   pass 1  the chunk's summary from h = 0: (Π A, final state)            (all chunks in parallel)
//           (Π A with its own exponent, never subnormal: see CapsuleScanChunk in scan.cuh)
//   pass 2  the state entering each chunk, chunk by chunk in order       (one thread per channel)
//   pass 3  the chunk again from its entering state, writing y           (all chunks in parallel)
// The backward runs the reverse recurrence the same way, chunks in reverse order; shared
// coefficients sum their cotangents over the chunk, then over chunks in order into
// da_part/db_part (B, D), then over the batch in order (capsule_selective_scan_bwd_shared).
// No atomics. Launch: blockDim.x·blockDim.y ≤ 256; any grid.
#include <cstdint>

#include "common.cuh"
#include "scan.cuh"

namespace {

constexpr int kMaxThreads = 256;

struct Tile {
    int64_t b, d, lo, hi;
    bool valid;
};

// Tile `tile` of batch·ceil(dim/DT): this thread's batch entry, channel and chunk [lo, hi).
__device__ __forceinline__ Tile tile_of(int64_t tile, int64_t time, int64_t dim) {
    const int64_t width = blockDim.x, dtiles = (dim + width - 1) / width;
    Tile t;
    t.b = tile / dtiles;
    t.d = (tile % dtiles) * width + threadIdx.x;
    t.valid = t.d < dim;
    capsule_scan_chunk_range(time, blockDim.y, threadIdx.y, t.lo, t.hi);
    return t;
}

__device__ __forceinline__ int64_t tile_count(int64_t batch, int64_t dim) {
    return dim == 0 ? 0 : batch * ((dim + blockDim.x - 1) / blockDim.x);
}

__device__ __forceinline__ int slot() { return static_cast<int>(threadIdx.y * blockDim.x + threadIdx.x); }

__device__ __forceinline__ int slot_of_chunk(int j) { return static_cast<int>(j * blockDim.x + threadIdx.x); }

}  // namespace

extern "C" __global__ __launch_bounds__(kMaxThreads) void capsule_selective_scan_fwd(
    const float* __restrict__ x, const float* __restrict__ a, const float* __restrict__ b, const float* __restrict__ h0,
    float* __restrict__ y, int64_t batch, int64_t time, int64_t dim, int32_t a_per_token, int32_t b_per_token) {
    __shared__ float chunk_a[kMaxThreads], chunk_h[kMaxThreads];
    __shared__ int chunk_e[kMaxThreads];
    const bool at = a_per_token != 0, bt = b_per_token != 0;
    for (int64_t tile = blockIdx.x; tile < tile_count(batch, dim); tile += gridDim.x) {
        const Tile w = tile_of(tile, time, dim);
        CapsuleScanChunk s = capsule_scan_identity();
        if (w.valid) {
            const float a_shared = at ? 0.0f : __ldg(a + w.d), b_shared = bt ? 0.0f : __ldg(b + w.d);
#pragma unroll 4
            for (int64_t t = w.lo; t < w.hi; ++t) {
                const int64_t i = (w.b * time + t) * dim + w.d;
                capsule_scan_push(s, at ? __ldg(a + i) : a_shared, bt ? __ldg(b + i) : b_shared, __ldg(x + i));
            }
        }
        chunk_a[slot()] = s.a;
        chunk_e[slot()] = s.e;
        chunk_h[slot()] = s.h;
        __syncthreads();
        if (threadIdx.y == 0 && w.valid) {
            // chunk_h[j] becomes the state entering chunk j.
            float h = __ldg(h0 + w.b * dim + w.d);
            for (int j = 0; j < static_cast<int>(blockDim.y); ++j) {
                const int k = slot_of_chunk(j);
                const CapsuleScanChunk c{chunk_a[k], chunk_h[k], chunk_e[k]};
                chunk_h[slot_of_chunk(j)] = h;
                h = capsule_scan_apply(c, h);
            }
        }
        __syncthreads();
        if (w.valid) {
            float h = chunk_h[slot()];
            const float a_shared = at ? 0.0f : __ldg(a + w.d), b_shared = bt ? 0.0f : __ldg(b + w.d);
#pragma unroll 4
            for (int64_t t = w.lo; t < w.hi; ++t) {
                const int64_t i = (w.b * time + t) * dim + w.d;
                h = capsule_scan_step(h, at ? __ldg(a + i) : a_shared, bt ? __ldg(b + i) : b_shared, __ldg(x + i));
                y[i] = h;
            }
        }
        __syncthreads();
    }
}

// dx, dh0, and da/db when token-dependent; when shared, the per-(b, d) sums into da_part/db_part.
extern "C" __global__ __launch_bounds__(kMaxThreads) void capsule_selective_scan_bwd(
    const float* __restrict__ x, const float* __restrict__ a, const float* __restrict__ b, const float* __restrict__ h0,
    const float* __restrict__ y, const float* __restrict__ g, float* __restrict__ dx, float* __restrict__ da,
    float* __restrict__ db, float* __restrict__ dh0, float* __restrict__ da_part, float* __restrict__ db_part,
    int64_t batch, int64_t time, int64_t dim, int32_t a_per_token, int32_t b_per_token) {
    __shared__ float chunk_a[kMaxThreads], chunk_c[kMaxThreads];
    __shared__ int chunk_e[kMaxThreads];
    const bool at = a_per_token != 0, bt = b_per_token != 0;
    for (int64_t tile = blockIdx.x; tile < tile_count(batch, dim); tile += gridDim.x) {
        const Tile w = tile_of(tile, time, dim);
        const float a_shared = (at || !w.valid) ? 0.0f : __ldg(a + w.d), b_shared = (bt || !w.valid) ? 0.0f : __ldg(b + w.d);
        // Pass 1: the chunk's carry map c_in ↦ (Π A)·c_in + c_out(0), t descending.
        CapsuleScanChunk s = capsule_scan_identity();
        if (w.valid) {
#pragma unroll 4
            for (int64_t t = w.hi - 1; t >= w.lo; --t) {
                const int64_t i = (w.b * time + t) * dim + w.d;
                const float av = at ? __ldg(a + i) : a_shared;
                s.h = capsule_scan_carry(capsule_scan_total(__ldg(g + i), s.h), av);
                capsule_scan_scale(s, av);
            }
        }
        chunk_a[slot()] = s.a;
        chunk_e[slot()] = s.e;
        chunk_c[slot()] = s.h;
        __syncthreads();
        if (threadIdx.y == 0 && w.valid) {
            // chunk_c[j] becomes the carry entering chunk j from the chunks after it.
            float c = 0.0f;
            for (int j = static_cast<int>(blockDim.y) - 1; j >= 0; --j) {
                const int k = slot_of_chunk(j);
                const CapsuleScanChunk m{chunk_a[k], chunk_c[k], chunk_e[k]};
                chunk_c[slot_of_chunk(j)] = c;
                c = capsule_scan_apply(m, c);
            }
            dh0[w.b * dim + w.d] = c;
        }
        __syncthreads();
        float sum_a = 0.0f, sum_b = 0.0f;
        if (w.valid) {
            float c = chunk_c[slot()];
#pragma unroll 4
            for (int64_t t = w.hi - 1; t >= w.lo; --t) {
                const int64_t i = (w.b * time + t) * dim + w.d;
                const float total = capsule_scan_total(__ldg(g + i), c);
                const float hprev = t > 0 ? __ldg(y + i - dim) : __ldg(h0 + w.b * dim + w.d);
                const float av = at ? __ldg(a + i) : a_shared;
                const float ga = total * hprev, gb = total * __ldg(x + i);
                dx[i] = total * (bt ? __ldg(b + i) : b_shared);
                if (at) da[i] = ga;
                else sum_a += ga;
                if (bt) db[i] = gb;
                else sum_b += gb;
                c = capsule_scan_carry(total, av);
            }
        }
        if (!at || !bt) {
            __syncthreads();  // pass 2 has read chunk_a and chunk_c
            chunk_a[slot()] = sum_a;
            chunk_c[slot()] = sum_b;
            __syncthreads();
            if (threadIdx.y == 0 && w.valid) {
                float ta = 0.0f, tb = 0.0f;
                for (int j = 0; j < static_cast<int>(blockDim.y); ++j) {
                    ta += chunk_a[slot_of_chunk(j)];
                    tb += chunk_c[slot_of_chunk(j)];
                }
                if (!at) da_part[w.b * dim + w.d] = ta;
                if (!bt) db_part[w.b * dim + w.d] = tb;
            }
        }
        __syncthreads();
    }
}

// Shared coefficients: da[d] = Σ_b da_part[b, d] (b in order), likewise db; token-dependent ones
// were written by capsule_selective_scan_bwd and are left alone.
extern "C" __global__ __launch_bounds__(kMaxThreads) void capsule_selective_scan_bwd_shared(
    const float* __restrict__ da_part, const float* __restrict__ db_part, float* __restrict__ da,
    float* __restrict__ db, int64_t batch, int64_t dim, int32_t a_per_token, int32_t b_per_token) {
    CAPSULE_GRID_STRIDE(d, dim) {
        if (a_per_token == 0) {
            float s = 0.0f;
            for (int64_t i = 0; i < batch; ++i) s += __ldg(da_part + i * dim + d);
            da[d] = s;
        }
        if (b_per_token == 0) {
            float s = 0.0f;
            for (int64_t i = 0; i < batch; ++i) s += __ldg(db_part + i * dim + d);
            db[d] = s;
        }
    }
}
