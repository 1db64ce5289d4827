// Per-thread math of the conv_pool family (spec "Convolution and pooling"), __host__ __device__
// so that the tests run it on the host: the pooling windows (one output or one input cell per
// call), the index mapping of the implicit GEMMs (output position, reduction index -> input cell
// or padding), their tile loaders, register-blocked tile products and epilogues, and the
// per-thread parts of the deterministic reductions. conv_pool.cu adds only the loops over tiles
// with the barriers around shared memory and the warp shuffles; tests/host/conv_pool_host.cu
// replays those loops thread by thread, so a host run computes the device's bits (up to the
// libm of expf and logf).
//
// Geometry: every spatial rank is padded to 3-D (d, h, w); a missing axis has size 1, kernel 1,
// stride 1, padding 0. Every rounding is an explicit correctly rounded operation.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "common.cuh"

namespace capsule_cp {

// -- scalar helpers ---------------------------------------------------------------------------

using capsule::add_rn;
using capsule::aligned16;
using capsule::div_rn;
using capsule::fma_rn;
using capsule::load4;
using capsule::mul_rn;
using capsule::sub_rn;

CAPSULE_HD float quiet_nan() {
#if defined(__CUDA_ARCH__)
    return __int_as_float(0x7fc00000);
#else
    return std::numeric_limits<float>::quiet_NaN();
#endif
}

// A read-only load: through the read-only data cache on the device.
CAPSULE_HD float ld(const float* p, int64_t i) { return capsule::ldg(p + i); }

template <class Index>
CAPSULE_HD Index ld(const Index* p, int64_t i) {
    static_assert(std::is_same_v<Index, int32_t> || std::is_same_v<Index, int64_t>, "integer loads: int32_t or int64_t");
#if defined(__CUDA_ARCH__)
    return __ldg(p + i);
#else
    return p[i];
#endif
}

// Two floats as one 8-byte shared-memory access.
struct alignas(8) Float2 {
    float x, y;
};

// a / b for a >= 0, b > 0: a 32-bit division when both fit (a 64-bit one costs several times more).
CAPSULE_HD int64_t quot(int64_t a, int64_t b) {
    if (((a | b) >> 31) == 0) return static_cast<int64_t>(static_cast<uint32_t>(a) / static_cast<uint32_t>(b));
    return a / b;
}

CAPSULE_HD int64_t ceil_div(int64_t a, int64_t b) { return a == 0 ? 0 : quot(a - 1, b) + 1; }

// -- geometry ---------------------------------------------------------------------------------

struct Dims3 {
    int64_t d, h, w;
};

CAPSULE_HD int64_t volume(const Dims3& s) { return s.d * s.h * s.w; }

struct Cell {
    int64_t d, h, w;
};

// Row-major position -> (d, h, w).
CAPSULE_HD Cell unflatten(int64_t pos, const Dims3& s) {
    const int64_t hw = s.h * s.w;
    const int64_t d = quot(pos, hw);
    const int64_t r = pos - d * hw;
    const int64_t h = quot(r, s.w);
    return Cell{d, h, r - h * s.w};
}

CAPSULE_HD int64_t flatten(const Cell& c, const Dims3& s) { return (c.d * s.h + c.h) * s.w + c.w; }

// 0 <= i < n.
CAPSULE_HD bool inside(int64_t i, int64_t n) { return static_cast<uint64_t>(i) < static_cast<uint64_t>(n); }

// Kernel, stride and padding per axis.
struct Window {
    Dims3 k, s, p;
};

// Along one axis: the origin of output cell o's window, o·s − p (correlation) or o + p
// (transposed), and the input cell that kernel offset k reads from it, -1 for padding.
template <bool TRANSPOSED>
CAPSULE_HD int64_t origin(int64_t o, int64_t s, int64_t p) { return TRANSPOSED ? o + p : o * s - p; }

template <bool TRANSPOSED>
CAPSULE_HD int64_t source_at(int64_t t, int64_t k, int64_t s, int64_t in) {
    if (!TRANSPOSED) {
        const int64_t i = t + k;
        return (i >= 0 && i < in) ? i : -1;
    }
    const int64_t u = t - k;
    if (u < 0) return -1;
    const int64_t q = quot(u, s);
    return (q * s == u && q < in) ? q : -1;
}

// The input cell that kernel offset k of output cell o reads along one axis, -1 for padding.
// Correlation: i = o·s − p + k. Transposed (the adjoint, a gather): the cell o' of the
// correlated operand with o'·s − p + k = o, when that is an integer in [0, in).
template <bool TRANSPOSED>
CAPSULE_HD int64_t source(int64_t o, int64_t k, int64_t s, int64_t p, int64_t in) {
    return source_at<TRANSPOSED>(origin<TRANSPOSED>(o, s, p), k, s, in);
}

// The flat input cell read by kernel offset kc of output cell oc, -1 for padding.
template <bool TRANSPOSED>
CAPSULE_HD int64_t source_cell(const Cell& oc, const Cell& kc, const Window& win, const Dims3& in) {
    const int64_t d = source<TRANSPOSED>(oc.d, kc.d, win.s.d, win.p.d, in.d);
    const int64_t h = source<TRANSPOSED>(oc.h, kc.h, win.s.h, win.p.h, in.h);
    const int64_t w = source<TRANSPOSED>(oc.w, kc.w, win.s.w, win.p.w, in.w);
    return (d < 0 || h < 0 || w < 0) ? -1 : (d * in.h + h) * in.w + w;
}

// The windows o in [0, out) of one axis whose cells o·s − p ... o·s − p + k − 1 contain cell i:
// [first, last], empty when first > last.
struct Span {
    int64_t first, last;
};

CAPSULE_HD Span covering(int64_t i, int64_t k, int64_t s, int64_t p, int64_t out) {
    const int64_t lo = i + p - k + 1;
    const int64_t first = lo <= 0 ? 0 : ceil_div(lo, s);
    int64_t last = quot(i + p, s);
    if (last > out - 1) last = out - 1;
    return Span{first, last};
}

// The real cells of a window along one axis: offsets [k0, k1) of the kernel.
struct Clip {
    int64_t start, k0, k1;
};

CAPSULE_HD Clip clip(int64_t o, int64_t k, int64_t s, int64_t p, int64_t in) {
    const int64_t start = o * s - p;
    const int64_t k0 = start < 0 ? -start : 0;
    const int64_t k1 = in - start < k ? in - start : k;
    return Clip{start, k0, k1};
}

// -- pooling ------------------------------------------------------------------------------------

struct PoolGeom {
    int64_t planes;  // N·C
    Dims3 in, out;
    Window win;
};

struct MaxCell {
    float value;
    int64_t index;  // flat cell in the plane; -1 when every real cell is NaN
};

// The first maximum in window order (row-major over the kernel offsets): padding never wins, NaN
// never wins; NaN when every real cell is NaN.
CAPSULE_HD MaxCell window_max(const float* plane, const PoolGeom& g, const Cell& o) {
    const Clip cd = clip(o.d, g.win.k.d, g.win.s.d, g.win.p.d, g.in.d);
    const Clip ch = clip(o.h, g.win.k.h, g.win.s.h, g.win.p.h, g.in.h);
    const Clip cw = clip(o.w, g.win.k.w, g.win.s.w, g.win.p.w, g.in.w);
    MaxCell best{quiet_nan(), -1};
    for (int64_t kd = cd.k0; kd < cd.k1; ++kd) {
        for (int64_t kh = ch.k0; kh < ch.k1; ++kh) {
            const int64_t row = ((cd.start + kd) * g.in.h + ch.start + kh) * g.in.w + cw.start;
            for (int64_t kw = cw.k0; kw < cw.k1; ++kw) {
                const float v = ld(plane, row + kw);
                if (v == v && (best.index < 0 || v > best.value)) best = MaxCell{v, row + kw};
            }
        }
    }
    return best;
}

// Sum of the window's real cells in window order (padding adds zeros).
CAPSULE_HD float window_sum(const float* plane, const PoolGeom& g, const Cell& o) {
    const Clip cd = clip(o.d, g.win.k.d, g.win.s.d, g.win.p.d, g.in.d);
    const Clip ch = clip(o.h, g.win.k.h, g.win.s.h, g.win.p.h, g.in.h);
    const Clip cw = clip(o.w, g.win.k.w, g.win.s.w, g.win.p.w, g.in.w);
    float sum = 0.0f;
    for (int64_t kd = cd.k0; kd < cd.k1; ++kd) {
        for (int64_t kh = ch.k0; kh < ch.k1; ++kh) {
            const int64_t row = ((cd.start + kd) * g.in.h + ch.start + kh) * g.in.w + cw.start;
            for (int64_t kw = cw.k0; kw < cw.k1; ++kw) sum = add_rn(sum, ld(plane, row + kw));
        }
    }
    return sum;
}

// Calls f(v) for every cell of the window in window order, padding cells as v = 0.
template <class F>
CAPSULE_HD void window_cells(const float* plane, const PoolGeom& g, const Cell& o, F f) {
    const int64_t d0 = o.d * g.win.s.d - g.win.p.d, h0 = o.h * g.win.s.h - g.win.p.h, w0 = o.w * g.win.s.w - g.win.p.w;
    for (int64_t kd = 0; kd < g.win.k.d; ++kd) {
        const int64_t id = d0 + kd;
        const bool rd = id >= 0 && id < g.in.d;
        for (int64_t kh = 0; kh < g.win.k.h; ++kh) {
            const int64_t ih = h0 + kh;
            const bool rh = rd && ih >= 0 && ih < g.in.h;
            for (int64_t kw = 0; kw < g.win.k.w; ++kw) {
                const int64_t iw = w0 + kw;
                f((rh && iw >= 0 && iw < g.in.w) ? ld(plane, (id * g.in.h + ih) * g.in.w + iw) : 0.0f);
            }
        }
    }
}

// pivot + ln Σ exp(beta·(v − pivot)) / beta over every cell, padding counted as 0; pivot is
// the maximum (beta > 0) or the minimum (beta < 0). NaN or infinite cells give NaN as in the
// reference (inf − inf).
CAPSULE_HD float window_smooth_max(const float* plane, const PoolGeom& g, const Cell& o, float beta) {
    float pivot = 0.0f;
    bool first = true;
    window_cells(plane, g, o, [&](float v) {
        if (first || (beta > 0.0f ? v > pivot : v < pivot)) pivot = v;
        first = false;
    });
    float sum = 0.0f;
    window_cells(plane, g, o, [&](float v) { sum = add_rn(sum, expf(mul_rn(beta, sub_rn(v, pivot)))); });
    return add_rn(pivot, div_rn(logf(sum), beta));
}

// The forward value of output element i (flat over (planes, out)).
CAPSULE_HD float max_pool_at(const float* x, const PoolGeom& g, int64_t i) {
    const int64_t ov = volume(g.out);
    const int64_t plane = quot(i, ov);
    return window_max(x + plane * volume(g.in), g, unflatten(i - plane * ov, g.out)).value;
}

CAPSULE_HD float avg_pool_at(const float* x, const PoolGeom& g, int64_t i) {
    const int64_t ov = volume(g.out);
    const int64_t plane = quot(i, ov);
    const float sum = window_sum(x + plane * volume(g.in), g, unflatten(i - plane * ov, g.out));
    return div_rn(sum, static_cast<float>(volume(g.win.k)));
}

CAPSULE_HD float smooth_max_pool_at(const float* x, const PoolGeom& g, float beta, int64_t i) {
    const int64_t ov = volume(g.out);
    const int64_t plane = quot(i, ov);
    return window_smooth_max(x + plane * volume(g.in), g, unflatten(i - plane * ov, g.out), beta);
}

// Calls f(window cell, flat output index in the plane) for every window covering input cell c,
// in increasing output order: the gather form of every pool's backward (atomic-free).
template <class F>
CAPSULE_HD void covering_windows(const PoolGeom& g, const Cell& c, F f) {
    const Span sd = covering(c.d, g.win.k.d, g.win.s.d, g.win.p.d, g.out.d);
    const Span sh = covering(c.h, g.win.k.h, g.win.s.h, g.win.p.h, g.out.h);
    const Span sw = covering(c.w, g.win.k.w, g.win.s.w, g.win.p.w, g.out.w);
    for (int64_t od = sd.first; od <= sd.last; ++od)
        for (int64_t oh = sh.first; oh <= sh.last; ++oh)
            for (int64_t ow = sw.first; ow <= sw.last; ++ow) f(Cell{od, oh, ow}, (od * g.out.h + oh) * g.out.w + ow);
}

// The first maximum of output window i (flat over (planes, out)), as a flat cell of its plane; -1
// when every real cell is NaN. The backward's first pass.
CAPSULE_HD int64_t max_pool_argmax_at(const float* x, const PoolGeom& g, int64_t i) {
    const int64_t ov = volume(g.out);
    const int64_t plane = quot(i, ov);
    return window_max(x + plane * volume(g.in), g, unflatten(i - plane * ov, g.out)).index;
}

// dx at input element i (flat over (planes, in)): the sum of g, in increasing output order, over
// the covering windows whose first maximum (argmax, from max_pool_argmax_at) is this cell; an
// all-NaN window (argmax -1) gives nothing. Index: the workspace's integer type.
template <class Index>
CAPSULE_HD float max_pool_grad_at(const Index* argmax, const float* gy, const PoolGeom& g, int64_t i) {
    const int64_t iv = volume(g.in), ov = volume(g.out);
    const int64_t plane = quot(i, iv);
    const int64_t cell = i - plane * iv;
    const Index* ap = argmax + plane * ov;
    const float* gp = gy + plane * ov;
    float acc = 0.0f;
    covering_windows(g, unflatten(cell, g.in), [&](const Cell&, int64_t oi) {
        if (ld(ap, oi) == cell) acc = add_rn(acc, ld(gp, oi));
    });
    return acc;
}

// dx = (Σ g over the covering windows) / kernel volume.
CAPSULE_HD float avg_pool_grad_at(const float* gy, const PoolGeom& g, int64_t i) {
    const int64_t iv = volume(g.in);
    const int64_t plane = quot(i, iv);
    const float* gp = gy + plane * volume(g.out);
    float acc = 0.0f;
    covering_windows(g, unflatten(i - plane * iv, g.in), [&](const Cell&, int64_t oi) { acc = add_rn(acc, ld(gp, oi)); });
    return div_rn(acc, static_cast<float>(volume(g.win.k)));
}

// dx = Σ over the covering windows of g·e/S, the window's softmax weight of this cell, formed as
// exp(beta·(x − y)) from the forward result y = pivot + ln S / beta.
CAPSULE_HD float smooth_max_pool_grad_at(const float* x, const float* y, const float* gy, const PoolGeom& g,
                                         float beta, int64_t i) {
    const int64_t iv = volume(g.in);
    const int64_t plane = quot(i, iv);
    const float v = ld(x, i);
    const float* yp = y + plane * volume(g.out);
    const float* gp = gy + plane * volume(g.out);
    float acc = 0.0f;
    covering_windows(g, unflatten(i - plane * iv, g.in), [&](const Cell&, int64_t oi) {
        const float weight = expf(mul_rn(beta, sub_rn(v, ld(yp, oi))));
        acc = fma_rn(ld(gp, oi), weight, acc);
    });
    return acc;
}

// -- implicit GEMM: shared pieces -----------------------------------------------------------------

constexpr int kGemmThreads = 128;

// acc[i][j] += Σ_k A[k][row0 + i]·B[k][col0 + j] from k-major shared tiles (leading dimensions
// LDA, LDB, multiples of 4; row0, col0 multiples of 4 and 2): 16-byte (8-byte) shared loads.
// UNROLL bounds how far the compiler hoists shared loads (registers).
template <int BK, int TM, int TN, int LDA, int LDB, int UNROLL>
CAPSULE_HD void tile_product(const float* As, const float* Bs, int row0, int col0, float (&acc)[TM][TN]) {
    static_assert(TM % 4 == 0 && (TN % 4 == 0 || TN == 2) && LDA % 4 == 0 && LDB % 4 == 0, "vector tile reads");
#pragma unroll UNROLL
    for (int k = 0; k < BK; ++k) {
        float a[TM], b[TN];
#pragma unroll
        for (int i = 0; i < TM; i += 4) {
            const float4 v = *reinterpret_cast<const float4*>(As + k * LDA + row0 + i);
            a[i] = v.x;
            a[i + 1] = v.y;
            a[i + 2] = v.z;
            a[i + 3] = v.w;
        }
        if constexpr (TN == 2) {
            const Float2 v = *reinterpret_cast<const Float2*>(Bs + k * LDB + col0);
            b[0] = v.x;
            b[1] = v.y;
        } else {
#pragma unroll
            for (int j = 0; j < TN; j += 4) {
                const float4 v = *reinterpret_cast<const float4*>(Bs + k * LDB + col0 + j);
                b[j] = v.x;
                b[j + 1] = v.y;
                b[j + 2] = v.z;
                b[j + 3] = v.w;
            }
        }
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] = fma_rn(a[i], b[j], acc[i][j]);
    }
}

// -- implicit GEMM: correlation and its adjoint (conv forward and dx, conv_transpose forward and dx)
//
// out[n, oc, o] = Σ_{ic, k} in[n, ic, src(o, k)]·W(oc, ic, k) (+ bias[oc]), as a GEMM with rows
// M = N·prod(out spatial) (output positions), columns the oc, and the reduction ordered kernel
// offset outer, input channel inner: for one kernel offset a row reads one input cell (or
// padding) at every input channel, so the gathered patch needs no division in the inner loop.
// Correlation (conv forward, conv_transpose dx): src = o·s − p + k, W(oc, ic, k) = w[oc][ic][k].
// Transposed (conv dx, conv_transpose forward): src = (o + p − k)/s when exact, w[ic][oc][k].
// Block tile BM × BN, reduction tile BK, each of the 128 threads TM × TN outputs.
//
// The GEMM reads W packed by a first launch (corr_packed_at): row r = k·group + ic, column oc,
// so that a reduction step's weights are BK whole rows of BN consecutive floats (one float4 per
// thread). With ic >= BK the group is ic rounded up to BK: each step is one kernel offset and BK
// channels, and a row's source cell is found once per kernel offset. With ic < BK (the stem
// conv's 3 channels) the reduction is flattened: group = ic, a step spans BK (kernel offset,
// channel) pairs, none of them zero padding. Both orders add the same products in the same order.
struct CorrProblem {
    const float* in;
    const float* w;     // the packed weights
    const float* bias;  // nullptr: no bias
    float* out;
    int64_t n, ic, oc;
    Dims3 is, os;  // spatial sizes of `in` and `out`
    Window win;    // the convolution's kernel, stride and padding
};

template <int BM_, int BN_>
struct CorrTile {
    static constexpr int BM = BM_, BN = BN_, BK = 16, TM = 8, TN = 4;
    static_assert(BM == kGemmThreads, "each thread loads one row's BK patch values");
    static_assert(BK * BN == 4 * kGemmThreads, "each thread loads one float4 of the weight tile");
    static_assert((BM / TM) * (BN / TN) == kGemmThreads, "thread layout");
};

// 128 positions × 32 channels: wider channel tiles gain little (the patch gather is about 15% of
// the multiply-adds' issue slots at BN = 32) and cost registers (occupancy).
using CorrTiles = CorrTile<128, 32>;

template <class T>
CAPSULE_HD int64_t corr_tiles_n(const CorrProblem& p) { return ceil_div(p.oc, T::BN); }

template <class T>
CAPSULE_HD int64_t corr_tiles(const CorrProblem& p) {
    return ceil_div(p.n * volume(p.os), T::BM) * corr_tiles_n<T>(p);
}

// Packed rows per kernel offset, rows (a multiple of BK) and columns (a multiple of BN).
template <class T>
CAPSULE_HD int64_t corr_group(const CorrProblem& p, bool flat) { return flat ? p.ic : ceil_div(p.ic, T::BK) * T::BK; }
template <class T>
CAPSULE_HD int64_t corr_rows(const CorrProblem& p, bool flat) {
    return ceil_div(volume(p.win.k) * corr_group<T>(p, flat), T::BK) * T::BK;
}
template <class T>
CAPSULE_HD int64_t corr_cols(const CorrProblem& p) { return corr_tiles_n<T>(p) * T::BN; }

// Reduction steps of BK packed rows.
template <class T>
CAPSULE_HD int64_t corr_steps(const CorrProblem& p, bool flat) { return corr_rows<T>(p, flat) / T::BK; }

// Element e of the packed weights (flat over rows × columns) from w; zero in the padding.
template <class T, bool TRANSPOSED>
CAPSULE_HD float corr_packed_at(const float* w, const CorrProblem& p, bool flat, int64_t e) {
    const int64_t cols = corr_cols<T>(p), group = corr_group<T>(p, flat), kv = volume(p.win.k);
    const int64_t r = quot(e, cols), oc = e - r * cols;
    const int64_t kidx = quot(r, group), ic = r - kidx * group;
    if (oc >= p.oc || ic >= p.ic || kidx >= kv) return 0.0f;
    return ld(w, (TRANSPOSED ? ic * p.oc + oc : oc * p.ic + ic) * kv + kidx);
}

// What a thread keeps for one tile: its loading row (an output position).
struct CorrRow {
    int64_t base;  // offset in `in` of (n, channel 0), and for a correlation its window origin's cell
    Cell org;      // the window origin of the output cell per axis
    bool valid;
};

template <class T, bool TRANSPOSED>
CAPSULE_HD CorrRow corr_row(const CorrProblem& p, int64_t tile_m, int tid) {
    const int64_t m = tile_m * T::BM + tid;
    const int64_t ov = volume(p.os);
    if (m >= p.n * ov) return CorrRow{0, Cell{0, 0, 0}, false};
    const int64_t n = quot(m, ov);
    const Cell o = unflatten(m - n * ov, p.os);
    const Cell org{origin<TRANSPOSED>(o.d, p.win.s.d, p.win.p.d), origin<TRANSPOSED>(o.h, p.win.s.h, p.win.p.h),
                   origin<TRANSPOSED>(o.w, p.win.s.w, p.win.p.w)};
    return CorrRow{n * p.ic * volume(p.is) + (TRANSPOSED ? 0 : flatten(org, p.is)), org, true};
}

// The flat input cell (in the row's sample and channel plane) that kernel offset kc of the row
// reads, -1 for padding or an invalid row.
template <bool TRANSPOSED>
CAPSULE_HD int64_t corr_source(const CorrProblem& p, const CorrRow& row, const Cell& kc) {
    if (!row.valid) return -1;
    const int64_t d = source_at<TRANSPOSED>(row.org.d, kc.d, p.win.s.d, p.is.d);
    const int64_t h = source_at<TRANSPOSED>(row.org.h, kc.h, p.win.s.h, p.is.h);
    const int64_t w = source_at<TRANSPOSED>(row.org.w, kc.w, p.win.s.w, p.is.w);
    return (d < 0 || h < 0 || w < 0) ? -1 : (d * p.is.h + h) * p.is.w + w;
}

// A thread's place in the reduction of one tile: the next kernel offset and channel to load, and
// (unflattened) the pointer to the row's source cell at that channel.
struct CorrCursor {
    const float* a;  // unflattened: the row's source cell at channel c (meaningful when live)
    const float* b;  // this thread's float4 of the next step's weight tile
    int64_t c;       // next channel
    Cell k;          // next kernel offset
    int64_t off;     // flattened correlation: c·plane + flatten(k), the offset from the window origin
    bool live;       // unflattened: the row is valid and its source cell real
};

// Moves to the next kernel offset k (row-major), and `off`, flat over the cells of `in`, by the
// same step.
CAPSULE_HD void next_offset(const Dims3& kernel, const Dims3& in, Cell& k, int64_t& off) {
    ++off;
    if (++k.w < kernel.w) return;
    k.w = 0;
    off += in.w - kernel.w;
    if (++k.h < kernel.h) return;
    k.h = 0;
    off += (in.h - kernel.h) * in.w;
    ++k.d;
}

template <bool TRANSPOSED>
CAPSULE_HD void corr_seek(const CorrProblem& p, const CorrRow& row, CorrCursor& cur) {
    const int64_t cell = corr_source<TRANSPOSED>(p, row, cur.k);
    cur.live = cell >= 0;
    // A correlation's source cell is the origin's plus flatten(k) (when real).
    cur.a = p.in + (row.base + (cell < 0 ? 0 : TRANSPOSED ? cell : flatten(cur.k, p.is)));
}

// The cursor at the first step of tile column tile_n: the weights' float4 of this thread is
// packed row tid / (BN/4), columns 4·(tid % (BN/4)).
template <class T, bool FLAT, bool TRANSPOSED>
CAPSULE_HD CorrCursor corr_start(const CorrProblem& p, const CorrRow& row, int64_t tile_n, int tid) {
    const float* b = p.w + (tid / (T::BN / 4)) * corr_cols<T>(p) + tile_n * T::BN + 4 * (tid % (T::BN / 4));
    CorrCursor cur{p.in, b, 0, Cell{0, 0, 0}, 0, false};
    if (!FLAT) corr_seek<TRANSPOSED>(p, row, cur);
    return cur;
}

// The next reduction step's patch values of this thread's row into ra (zero for padding, an
// invalid row, or past the last channel or kernel offset), and the cursor moved past them.
template <class T, bool FLAT, bool TRANSPOSED>
CAPSULE_HD void corr_load_a(const CorrProblem& p, const CorrRow& row, CorrCursor& cur, float (&ra)[T::BK]) {
    static_assert(!(FLAT && TRANSPOSED), "flattened correlations only");
    const int64_t plane = volume(p.is);
    if (FLAT) {
        // Cell origin + k at channel c: its offset from the origin's cell at channel 0 is the
        // same in every row (cur.off, stepped along); only the bounds are the row's.
#pragma unroll
        for (int j = 0; j < T::BK; ++j) {
            const bool real = row.valid && cur.k.d < p.win.k.d && inside(row.org.d + cur.k.d, p.is.d) &&
                              inside(row.org.h + cur.k.h, p.is.h) && inside(row.org.w + cur.k.w, p.is.w);
            ra[j] = real ? ld(p.in, row.base + cur.off) : 0.0f;
            cur.off += plane;
            if (++cur.c == p.ic) {
                cur.c = 0;
                cur.off -= p.ic * plane;
                next_offset(p.win.k, p.is, cur.k, cur.off);
            }
        }
        return;
    }
    const int64_t left = cur.live ? p.ic - cur.c : 0;
    const float* a = cur.a;
    if (left >= T::BK) {
#pragma unroll
        for (int j = 0; j < T::BK; ++j) ra[j] = ld(a, j * plane);
    } else {
#pragma unroll
        for (int j = 0; j < T::BK; ++j) ra[j] = j < left ? ld(a, j * plane) : 0.0f;
    }
    cur.a = a + T::BK * plane;
    cur.c += T::BK;
    if (cur.c >= p.ic) {
        cur.c = 0;
        next_offset(p.win.k, p.is, cur.k, cur.off);
        if (cur.k.d < p.win.k.d) corr_seek<TRANSPOSED>(p, row, cur);
    }
}

// The next reduction step into registers: patch values and weights.
template <class T, bool FLAT, bool TRANSPOSED>
CAPSULE_HD void corr_load(const CorrProblem& p, const CorrRow& row, CorrCursor& cur, float (&ra)[T::BK], float4& rb) {
    corr_load_a<T, FLAT, TRANSPOSED>(p, row, cur, ra);
    rb = load4(cur.b, 0);
    cur.b += T::BK * corr_cols<T>(p);
}

// Registers -> shared tiles As[BK][BM], Bs[BK][BN] (consecutive threads, consecutive words).
template <class T>
CAPSULE_HD void corr_store(const float (&ra)[T::BK], const float4& rb, float* As, float* Bs, int tid) {
#pragma unroll
    for (int j = 0; j < T::BK; ++j) As[j * T::BM + tid] = ra[j];
    *reinterpret_cast<float4*>(Bs + 4 * tid) = rb;
}

// This thread's outputs within the tile: rows tm·TM + [0, TM), columns tn·TN + [0, TN).
template <class T>
CAPSULE_HD int corr_tm(int tid) { return tid / (T::BN / T::TN); }
template <class T>
CAPSULE_HD int corr_tn(int tid) { return tid % (T::BN / T::TN); }

template <class T, int UNROLL>
CAPSULE_HD void corr_product(const float* As, const float* Bs, int tid, float (&acc)[T::TM][T::TN]) {
    tile_product<T::BK, T::TM, T::TN, T::BM, T::BN, UNROLL>(As, Bs, corr_tm<T>(tid) * T::TM, corr_tn<T>(tid) * T::TN, acc);
}

// acc (+ bias) -> out; four consecutive positions as one 16-byte store when they share a sample
// and out is aligned (prod(out spatial) % 4 == 0).
template <class T>
CAPSULE_HD void corr_epilogue(const CorrProblem& p, int64_t tile_m, int64_t tile_n, int tid,
                              const float (&acc)[T::TM][T::TN]) {
    const int64_t ov = volume(p.os);
    const int64_t rows = p.n * ov;
    const int64_t m0 = tile_m * T::BM + corr_tm<T>(tid) * T::TM;
    const bool vec = ov % 4 == 0 && aligned16(p.out);
#pragma unroll
    for (int j = 0; j < T::TN; ++j) {
        const int64_t oc = tile_n * T::BN + corr_tn<T>(tid) * T::TN + j;
        if (oc >= p.oc) continue;
        const bool has_bias = p.bias != nullptr;
        const float b = has_bias ? ld(p.bias, oc) : 0.0f;
        float v[T::TM];
#pragma unroll
        for (int i = 0; i < T::TM; ++i) v[i] = has_bias ? add_rn(acc[i][j], b) : acc[i][j];
#pragma unroll
        for (int i = 0; i < T::TM; i += 4) {
            const int64_t m = m0 + i;
            if (m >= rows) break;
            const int64_t n = quot(m, ov);
            float* dst = p.out + (n * p.oc + oc) * ov + (m - n * ov);
            if (vec) {
                *reinterpret_cast<float4*>(dst) = make_float4(v[i], v[i + 1], v[i + 2], v[i + 3]);
                continue;
            }
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int64_t me = m + e;
                if (me >= rows) break;
                const int64_t ne = quot(me, ov);
                p.out[(ne * p.oc + oc) * ov + (me - ne * ov)] = v[i + e];
            }
        }
    }
}

// -- implicit GEMM: weight gradient ----------------------------------------------------------------
//
// dw[gc, xc, k] = Σ_{n, o} G[n, gc, o]·X[n, xc, o·s − p + k] over every position o of G:
// conv's dw with G = g, X = x; conv_transpose's dw with G = x, X = g. One block tile is
// (BM input channels xc) × (BN channels gc) at one kernel offset k, the reduction runs over the
// positions in steps of BK, and the positions are split into `splits` contiguous ranges whose
// partial tiles a second kernel adds in split order (deterministic, no atomics).
struct WeightProblem {
    const float* gsrc;  // G (n, gc, gs)
    const float* xsrc;  // X (n, xc, xs)
    float* dw;          // (gc, xc, k): written directly when splits == 1
    float* partial;     // (splits, gc, xc, k) when splits > 1
    int64_t n, gc, xc;
    Dims3 gs, xs;
    Window win;
    int64_t splits;
};

struct WeightTile {
    static constexpr int BM = 32, BN = 32, BK = 32, TM = 4, TN = 2, PAD = 4;
    static constexpr int LDA = BM + PAD, LDB = BN + PAD;  // padded rows: conflict-free stores
    static constexpr int PER = BK * BM / kGemmThreads;
    static_assert(BM == BN && BK == 8 * (kGemmThreads / 32) && BM == 4 * PER, "loader layout");
    static_assert((BM / TM) * (BN / TN) == kGemmThreads, "thread layout");
};

CAPSULE_HD int64_t weight_tiles_x(const WeightProblem& p) { return ceil_div(p.xc, WeightTile::BM); }
CAPSULE_HD int64_t weight_tiles_g(const WeightProblem& p) { return ceil_div(p.gc, WeightTile::BN); }

CAPSULE_HD int64_t weight_tiles(const WeightProblem& p) {
    return weight_tiles_x(p) * weight_tiles_g(p) * volume(p.win.k) * p.splits;
}

// One block tile: its channel tiles, kernel offset and range of reduction steps.
struct WeightJob {
    int64_t tile_x, tile_g, kidx, split, step0, step1;
};

CAPSULE_HD WeightJob weight_job(const WeightProblem& p, int64_t t) {
    const int64_t tx = weight_tiles_x(p), tg = weight_tiles_g(p), kv = volume(p.win.k);
    WeightJob job;
    job.tile_x = t % tx;
    t /= tx;
    job.tile_g = t % tg;
    t /= tg;
    job.kidx = t % kv;
    job.split = t / kv;
    const int64_t steps = ceil_div(p.n * volume(p.gs), WeightTile::BK);
    const int64_t per = ceil_div(steps, p.splits);
    job.step0 = job.split * per < steps ? job.split * per : steps;
    job.step1 = job.step0 + per < steps ? job.step0 + per : steps;
    return job;
}

// Thread tid loads position BK·step + (tid % 8 + 8·(tid / 32)) at channels (tid / 8) % 4 + 4j of
// both operands: eight consecutive lanes read 32 consecutive bytes, and the padded rows make the
// transposing stores conflict-free.
CAPSULE_HD int weight_position(int tid) { return tid % 8 + 8 * (tid / 32); }
CAPSULE_HD int weight_channel(int tid) { return (tid / 8) % 4; }

CAPSULE_HD void weight_load(const WeightProblem& p, const WeightJob& job, int64_t step, int tid,
                            float (&ra)[WeightTile::PER], float (&rb)[WeightTile::PER]) {
    using T = WeightTile;
    const int64_t q = step * T::BK + weight_position(tid);
    const int64_t gv = volume(p.gs), xv = volume(p.xs);
    const bool inside = q < p.n * gv;
    int64_t n = 0, pos = 0, cell = -1;
    if (inside) {
        n = quot(q, gv);
        pos = q - n * gv;
        cell = source_cell<false>(unflatten(pos, p.gs), unflatten(job.kidx, p.win.k), p.win, p.xs);
    }
#pragma unroll
    for (int j = 0; j < T::PER; ++j) {
        const int64_t xc = job.tile_x * T::BM + weight_channel(tid) + 4 * j;
        ra[j] = (cell >= 0 && xc < p.xc) ? ld(p.xsrc, (n * p.xc + xc) * xv + cell) : 0.0f;
        const int64_t gc = job.tile_g * T::BN + weight_channel(tid) + 4 * j;
        rb[j] = (inside && gc < p.gc) ? ld(p.gsrc, (n * p.gc + gc) * gv + pos) : 0.0f;
    }
}

CAPSULE_HD void weight_store(const float (&ra)[WeightTile::PER], const float (&rb)[WeightTile::PER], float* As,
                             float* Bs, int tid) {
    using T = WeightTile;
    const int c = weight_position(tid);
#pragma unroll
    for (int j = 0; j < T::PER; ++j) {
        As[c * T::LDA + weight_channel(tid) + 4 * j] = ra[j];
        Bs[c * T::LDB + weight_channel(tid) + 4 * j] = rb[j];
    }
}

CAPSULE_HD int weight_tm(int tid) { return tid / (WeightTile::BN / WeightTile::TN); }
CAPSULE_HD int weight_tn(int tid) { return tid % (WeightTile::BN / WeightTile::TN); }

CAPSULE_HD void weight_product(const float* As, const float* Bs, int tid, float (&acc)[WeightTile::TM][WeightTile::TN]) {
    using T = WeightTile;
    tile_product<T::BK, T::TM, T::TN, T::LDA, T::LDB, 4>(As, Bs, weight_tm(tid) * T::TM, weight_tn(tid) * T::TN, acc);
}

// The tile -> dw (one split) or its slice of the partials.
CAPSULE_HD void weight_epilogue(const WeightProblem& p, const WeightJob& job, int tid,
                                const float (&acc)[WeightTile::TM][WeightTile::TN]) {
    using T = WeightTile;
    const int64_t kv = volume(p.win.k);
    float* dst = p.splits == 1 ? p.dw : p.partial + job.split * (p.gc * p.xc * kv);
#pragma unroll
    for (int i = 0; i < T::TM; ++i) {
        const int64_t xc = job.tile_x * T::BM + weight_tm(tid) * T::TM + i;
#pragma unroll
        for (int j = 0; j < T::TN; ++j) {
            const int64_t gc = job.tile_g * T::BN + weight_tn(tid) * T::TN + j;
            if (xc < p.xc && gc < p.gc) dst[(gc * p.xc + xc) * kv + job.kidx] = acc[i][j];
        }
    }
}

// dw[e] = Σ_s partial[s·count + e] in split order (the float4 path of conv_pool.cu adds in the same order).
CAPSULE_HD float split_sum(const float* partial, int64_t count, int64_t splits, int64_t e) {
    float s = ld(partial, e);
    for (int64_t k = 1; k < splits; ++k) s = add_rn(s, ld(partial, k * count + e));
    return s;
}

// -- db: per-channel sums -------------------------------------------------------------------------

constexpr int kSumThreads = 256;

// This thread's share of Σ_{n, o} g[n, c, o]: elements t, t + threads, ... of the channel's
// (n, position) pairs, or with `vec` (positions % 4 == 0, g aligned) float4 vectors, each added
// in component order.
CAPSULE_HD float channel_partial(const float* g, int64_t n, int64_t channels, int64_t positions, int64_t c, int tid,
                                 int threads, bool vec) {
    float s = 0.0f;
    if (vec) {
        const int64_t per = positions / 4;
        for (int64_t v = tid; v < n * per; v += threads) {
            const int64_t b = quot(v, per);
            const float4 x = load4(g + (b * channels + c) * positions, v - b * per);
            s = add_rn(add_rn(add_rn(add_rn(s, x.x), x.y), x.z), x.w);
        }
        return s;
    }
    for (int64_t e = tid; e < n * positions; e += threads) {
        const int64_t b = quot(e, positions);
        s = add_rn(s, ld(g, (b * channels + c) * positions + (e - b * positions)));
    }
    return s;
}

}  // namespace capsule_cp
