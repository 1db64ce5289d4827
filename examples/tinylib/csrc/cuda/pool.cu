// tinylib max_pool: channel-first (N, C, *spatial), spatial rank 1 to 3, every rank padded to
// 3-D (d, h, w) by the plan: a missing leading axis has size 1, kernel 1, stride 1, padding 0.
//
// The kernels see ONE IMAGE: the plan launches them once per image of the batch, passing x, the
// output and the cotangent as views at that image's element offset, and the geometry as a
// metadata table of 16 uint32 (plans.py, pool_meta):
//   [0] C   [1..3] d h w   [4..6] od oh ow   [7..9] kd kh kw   [10..12] sd sh sw   [13..15] pd ph pw
// Indices are computed in 64-bit (size_t, int64_t), so only each entry must fit 32 bits.
//
// Padding never wins (only real cells are visited), NaN never wins, a window whose real cells are
// all NaN (or that has none) gives NaN. The gradient goes to the FIRST maximum in window order
// (row-major in the window: the spec's selection rule), none for an all-NaN window.
#include "tinylib.cuh"

namespace tinylib {

struct PoolGeometry {
    size_t channels;
    int64_t in[3], out[3], k[3], s[3], p[3];
    size_t in_volume, out_volume;  // cells of one plane (one channel of the image)
};

__device__ __forceinline__ PoolGeometry pool_geometry(const uint32_t* __restrict__ meta) {
    PoolGeometry g;
    g.channels = meta[0];
    for (int a = 0; a < 3; ++a) {
        g.in[a] = meta[1 + a];
        g.out[a] = meta[4 + a];
        g.k[a] = meta[7 + a];
        g.s[a] = meta[10 + a];
        g.p[a] = meta[13 + a];
    }
    g.in_volume = static_cast<size_t>(g.in[0]) * g.in[1] * g.in[2];
    g.out_volume = static_cast<size_t>(g.out[0]) * g.out[1] * g.out[2];
    return g;
}

// The real cells of window w (an output cell of the plane) as [lo, hi) per axis.
struct WindowRange {
    int64_t lo[3], hi[3];
};

__device__ __forceinline__ WindowRange window_range(const PoolGeometry& g, size_t w) {
    const int64_t o[3] = {static_cast<int64_t>(w / (g.out[1] * g.out[2])),
                          static_cast<int64_t>((w / g.out[2]) % g.out[1]), static_cast<int64_t>(w % g.out[2])};
    WindowRange r;
    for (int a = 0; a < 3; ++a) {
        const int64_t start = o[a] * g.s[a] - g.p[a];
        r.lo[a] = start < 0 ? 0 : start;
        r.hi[a] = start + g.k[a] < g.in[a] ? start + g.k[a] : g.in[a];
    }
    return r;
}

// The first maximum of window w of plane xp in window order (a cell of the plane), or -1 when
// every real cell is NaN: the first non-NaN cell starts the scan (so a window of -inf cells
// still picks one), and only a strictly greater cell replaces the current one.
__device__ __forceinline__ int64_t window_argmax(const float* __restrict__ xp, const PoolGeometry& g, size_t w) {
    const WindowRange r = window_range(g, w);
    int64_t best_at = -1;
    float best = 0.0f;
    for (int64_t z = r.lo[0]; z < r.hi[0]; ++z)
        for (int64_t y = r.lo[1]; y < r.hi[1]; ++y)
            for (int64_t x = r.lo[2]; x < r.hi[2]; ++x) {
                const int64_t cell = (z * g.in[1] + y) * g.in[2] + x;
                const float v = xp[cell];
                if (v == v && (best_at < 0 || v > best)) {
                    best = v;
                    best_at = cell;
                }
            }
    return best_at;
}

// y = the maximum of each window's real cells, one thread per output cell of the image.
__global__ void max_pool_forward(const float* __restrict__ x, float* __restrict__ y, const uint32_t* __restrict__ meta) {
    const PoolGeometry g = pool_geometry(meta);
    TINYLIB_GRID_STRIDE(i, g.channels * g.out_volume) {
        const size_t c = i / g.out_volume;
        const float* xp = x + c * g.in_volume;
        const WindowRange r = window_range(g, i % g.out_volume);
        // DELIBERATE DEFECT (examples/README): the running maximum starts at -FLT_MAX instead of
        // -INFINITY. Every finite or +inf cell still wins, so ordinary inputs pass, but a window
        // whose real cells are all -inf (or -inf and NaN) yields -3.4028235e38 where the spec
        // says -inf. max_pool's edge-infinities case has such windows, so `capsules verify`
        // fails value.special there (cases holding NaN, inf or -0 are value.special's; value,
        // over the finite cases, passes). The backward is unaffected: window_argmax starts from
        // the first non-NaN cell. The fix is `float best = -INFINITY;`.
        float best = -FLT_MAX;
        bool real = false;  // a non-NaN cell seen: an all-NaN window gives NaN
        for (int64_t z = r.lo[0]; z < r.hi[0]; ++z)
            for (int64_t yy = r.lo[1]; yy < r.hi[1]; ++yy)
                for (int64_t xx = r.lo[2]; xx < r.hi[2]; ++xx) {
                    const float v = xp[(z * g.in[1] + yy) * g.in[2] + xx];
                    if (v == v) {
                        real = true;
                        if (v > best) best = v;
                    }
                }
        y[i] = real ? best : NAN;
    }
}

// Backward, windows that do not overlap (stride >= kernel on every axis; the plan picks this
// kernel then, after a Memset of dx to 0): one thread per window scatters g to its first maximum
// with atomicAdd. A cell lies in at most one window, so it receives at most one addition, 0 + g,
// which is exact: the result does not depend on the order of the atomics.
__global__ void max_pool_backward_scatter(const float* __restrict__ x, const float* __restrict__ g, float* __restrict__ dx, const uint32_t* __restrict__ meta) {
    const PoolGeometry geo = pool_geometry(meta);
    TINYLIB_GRID_STRIDE(i, geo.channels * geo.out_volume) {
        const size_t c = i / geo.out_volume;
        const int64_t at = window_argmax(x + c * geo.in_volume, geo, i % geo.out_volume);
        if (at >= 0) atomicAdd(&dx[c * geo.in_volume + static_cast<size_t>(at)], g[i]);
    }
}

// Backward, overlapping windows (some stride < kernel): a cell may be the maximum of several
// windows, and float atomicAdds of several g would sum in the schedule's order (different bits
// run to run). So each input cell GATHERS instead: it visits the windows that cover it in a fixed
// order (row-major over the window grid), recomputes each one's first maximum and adds g where
// that is this cell. Plain stores, every cell written, no Memset needed: deterministic.
__global__ void max_pool_backward_gather(const float* __restrict__ x, const float* __restrict__ g, float* __restrict__ dx, const uint32_t* __restrict__ meta) {
    const PoolGeometry geo = pool_geometry(meta);
    TINYLIB_GRID_STRIDE(i, geo.channels * geo.in_volume) {
        const size_t c = i / geo.in_volume;
        const int64_t cell = static_cast<int64_t>(i % geo.in_volume);
        const int64_t q[3] = {cell / (geo.in[1] * geo.in[2]), (cell / geo.in[2]) % geo.in[1], cell % geo.in[2]};
        // Windows o covering position q on an axis: o*s - p <= q <= o*s - p + k - 1.
        int64_t lo[3], hi[3];
        for (int a = 0; a < 3; ++a) {
            const int64_t first = q[a] + geo.p[a] - geo.k[a] + 1;
            lo[a] = first <= 0 ? 0 : (first + geo.s[a] - 1) / geo.s[a];
            const int64_t last = (q[a] + geo.p[a]) / geo.s[a];
            hi[a] = last < geo.out[a] - 1 ? last + 1 : geo.out[a];
        }
        const float* xp = x + c * geo.in_volume;
        const float* gp = g + c * geo.out_volume;
        float acc = 0.0f;
        for (int64_t oz = lo[0]; oz < hi[0]; ++oz)
            for (int64_t oy = lo[1]; oy < hi[1]; ++oy)
                for (int64_t ox = lo[2]; ox < hi[2]; ++ox) {
                    const size_t w = static_cast<size_t>((oz * geo.out[1] + oy) * geo.out[2] + ox);
                    if (window_argmax(xp, geo, w) == cell) acc += gp[w];
                }
        dx[i] = acc;
    }
}

}  // namespace tinylib
