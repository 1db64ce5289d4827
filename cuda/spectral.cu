// fft_fno: one FNO-1D spectral block as a direct transform restricted to the M kept modes
// (O(G·M) per channel, no FFT library), in stages, each a grid-stride loop over its outputs:
//   twiddles  table[r] = (cos, sin)(2π·r/G), r < G                  (once per plan)
//   analysis  X[b, k, c] = Σ_t x[b, t, c]·e^(−2πi·k·t/G), k < M    (KPT modes × CPT channels per thread)
//   mix       Zs[b, k, o] = (w_k/G)·Σ_c X[b, k, c]·W[k, c, o]       (w_k: irfft's bin weight)
//   synthesis y[b, t, o] = Σ_k Re(Zs[b, k, o]·e^(2πi·k·t/G))         (TPT points × OPT outputs per thread)
// A thread's channels (outputs) are H = ⌈C/CPT⌉ apart, so that each twiddle it loads serves CPT
// (OPT) of them while a warp's loads stay coalesced. The analysis is split over t into `parts`
// contiguous ranges of ⌈G/parts⌉ points, each thread one (part, batch, mode group, channel group):
// the parts' partial spectra go to a workspace and a second launch adds them in part order. With
// one part the analysis writes the spectrum itself. Grids past 2^31 take the analyses' _wide entry
// points (64-bit turns; the 32-bit ones trap on them). The
// backward is the same stages transposed: the analysis of g (scaled by w_k/G), the mix's adjoint
// with conj(W), the synthesis into dx, and the weight cotangents summed over the batch in a fixed
// order. No atomics; every sum has a fixed order that does not depend on the grid.
//
// Complex spectra are stored interleaved (re, im) as float pairs: spectrum and gxspec (B, M, Ci),
// mixed and gspec (B, M, Co), partials (parts, B, M, C). Channels are the fastest thread index, so
// the loads of x, W and the spectra are coalesced or broadcast, and the twiddle a warp reads is
// one entry of the table (global memory, cached) when the channels fill it.
#include <cstdint>

#include "common.cuh"
#include "spectral.cuh"

namespace {

using capsule::thread_count;
using capsule::thread_index;

constexpr int kMaxThreads = 256;
constexpr int kTransformBlocks = 4;  // analysis and synthesis: 64 registers
constexpr int kLeanBlocks = 8;       // the partial sums: 32 registers
constexpr int kModesPerThread = 2;     // KPT
constexpr int kChannelsPerThread = 4;  // CPT
constexpr int kPointsPerThread = 2;    // TPT
constexpr int kOutputsPerThread = 4;   // OPT
constexpr int64_t kTurn32Limit = int64_t{1} << 31;

__device__ __forceinline__ int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// (k·t) mod G for 0 ≤ k, t < G: a 64-bit product for 32-bit turns (below 2^62), else capsule_fno_turn.
template <typename Turn>
__device__ __forceinline__ Turn first_turn(Turn k, Turn t, int64_t G) {
    if constexpr (sizeof(Turn) == sizeof(uint32_t)) {
        return static_cast<Turn>(static_cast<uint64_t>(k) * t % static_cast<uint64_t>(G));
    } else {
        return static_cast<Turn>(capsule_fno_turn(k, t, G));
    }
}

// Item i = (part p, b, mode group, channel group h), h fastest: for its modes k < M and channels
// c = h + j·H (H = ⌈C/CPT⌉, j < CPT, c < C), out[p, b, k, c] = Σ_{t in part p} in[b, t, c]·
// e^(−2πi·k·t/G), interleaved; part p is t in [p·span, min(G, (p + 1)·span)), span = ⌈G/parts⌉.
// With one part out is the spectrum, scaled by w_k/G when `scaled`. 32-bit turns walk the item's
// KPT modes and CPT channels together (each twiddle load serves CPT channels); 64-bit ones
// (G > 2^31) one mode and channel at a time, to fit the registers.
template <typename Turn>
__device__ __forceinline__ void analysis_item(const float* __restrict__ in, const float2* __restrict__ table,
                                              float* __restrict__ out, int64_t batch, int64_t G, int64_t C, int64_t M,
                                              int64_t parts, bool scaled, int64_t i) {
    constexpr bool kNarrow = sizeof(Turn) == sizeof(uint32_t);
    constexpr int KM = kNarrow ? kModesPerThread : 1, KC = kNarrow ? kChannelsPerThread : 1;
    const int64_t groups = cdiv(M, kModesPerThread), H = cdiv(C, kChannelsPerThread);
    const int64_t items = batch * groups * H, span = cdiv(G, parts);
    const int64_t item = i % items, part = i / items;
    const int64_t h = item % H, q = item / H;
    const int64_t b = q / groups, k_first = (q % groups) * kModesPerThread;
    const int64_t t0 = part * span < G ? part * span : G;
    const Turn g = static_cast<Turn>(G), n = static_cast<Turn>(G - t0 < span ? G - t0 : span);
    const Turn dt = static_cast<Turn>(t0 < G ? t0 : 0);
#pragma unroll 1
    for (int64_t k0 = k_first; k0 < k_first + kModesPerThread; k0 += KM) {
#pragma unroll 1
        for (int j0 = 0; j0 < kChannelsPerThread; j0 += KC) {
            Turn r[KM], inc[KM];
            float re[KM][KC], im[KM][KC];
            const float* p[KC];
#pragma unroll
            for (int m = 0; m < KM; ++m) {
                inc[m] = static_cast<Turn>(k0 + m < G ? k0 + m : (k0 + m) % G);
                // (k0 + m)·t0 mod G: one product, then t0 more per mode
                r[m] = m > 0 ? capsule_fno_turn_step(r[m - 1], dt, g) : first_turn<Turn>(inc[0], dt, G);
#pragma unroll
                for (int j = 0; j < KC; ++j) re[m][j] = im[m][j] = 0.0f;
            }
            // channels past C read channel C − 1 (in bounds) and are never written
#pragma unroll
            for (int j = 0; j < KC; ++j) {
                const int64_t c = h + (j0 + j) * H;
                p[j] = in + (b * G + t0) * C + (c < C ? c : C - 1);
            }
#pragma unroll 2
            for (Turn t = 0; t < n; ++t) {
                float v[KC];
#pragma unroll
                for (int j = 0; j < KC; ++j) {
                    v[j] = __ldg(p[j]);
                    p[j] += C;
                }
#pragma unroll
                for (int m = 0; m < KM; ++m) {
                    const float2 w = __ldg(table + r[m]);
#pragma unroll
                    for (int j = 0; j < KC; ++j) capsule_fno_analysis_acc(v[j], w.x, w.y, re[m][j], im[m][j]);
                    r[m] = capsule_fno_turn_step(r[m], inc[m], g);
                }
            }
#pragma unroll
            for (int m = 0; m < KM; ++m) {
                const int64_t k = k0 + m;
#pragma unroll
                for (int j = 0; j < KC; ++j) {
                    const int64_t c = h + (j0 + j) * H;
                    if (k < M && c < C) {
                        float* o = out + 2 * (((part * batch + b) * M + k) * C + c);
                        o[0] = scaled ? capsule_fno_scale(re[m][j], k, G) : re[m][j];
                        o[1] = scaled ? capsule_fno_scale(im[m][j], k, G) : im[m][j];
                    }
                }
            }
        }
    }
}

// The analysis of a (C_a channels) into a_out, then that of b (C_b channels, scaled by w_k/G when
// it is the spectrum itself) into b_out: one grid-stride loop over both analyses' items (C_b = 0:
// a alone).
template <typename Turn>
__device__ void analyses(const float* __restrict__ a, const float* __restrict__ b, const float2* __restrict__ table,
                         float* __restrict__ a_out, float* __restrict__ b_out, int64_t batch, int64_t G, int64_t C_a,
                         int64_t C_b, int64_t M, int64_t parts) {
    const int64_t per_group = batch * cdiv(M, kModesPerThread) * parts;
    const int64_t n_a = per_group * cdiv(C_a, kChannelsPerThread), n = n_a + per_group * cdiv(C_b, kChannelsPerThread);
    CAPSULE_GRID_STRIDE(i, n) {
        const bool of_b = i >= n_a;
        analysis_item<Turn>(of_b ? b : a, table, of_b ? b_out : a_out, batch, G, of_b ? C_b : C_a, M, parts,
                            of_b && parts == 1, of_b ? i - n_a : i);
    }
}

// spectrum[item] = (scaled ? w_k/G : 1)·Σ_p partial[p, item] for item = (b, k, c) of `items`, in
// part order p = 0, 1, … (four loads in flight).
__device__ __forceinline__ void part_sum(const float* __restrict__ partial, float* __restrict__ spectrum, int64_t items,
                                         int64_t G, int64_t C, int64_t M, int64_t parts, bool scaled, int64_t item) {
    const float2* p = reinterpret_cast<const float2*>(partial) + item;
    float re = 0.0f, im = 0.0f;
    int64_t s = 0;
    for (; s + 4 <= parts; s += 4, p += 4 * items) {
        const float2 v0 = __ldg(p), v1 = __ldg(p + items), v2 = __ldg(p + 2 * items), v3 = __ldg(p + 3 * items);
        re = re + v0.x;
        im = im + v0.y;
        re = re + v1.x;
        im = im + v1.y;
        re = re + v2.x;
        im = im + v2.y;
        re = re + v3.x;
        im = im + v3.y;
    }
    for (; s < parts; ++s, p += items) {
        const float2 v = __ldg(p);
        re = re + v.x;
        im = im + v.y;
    }
    const int64_t k = (item / C) % M;
    reinterpret_cast<float2*>(spectrum)[item] =
        scaled ? make_float2(capsule_fno_scale(re, k, G), capsule_fno_scale(im, k, G)) : make_float2(re, im);
}

// Item (b, point group, output group h), h fastest: out[b, t, o] = Σ_k Re(z[b, k, o]·e^(2πi·k·t/G))
// for its TPT points t < G and outputs o = h + j·H (H = ⌈O/OPT⌉, j < OPT, o < O), z interleaved
// (B, M, O). Each twiddle load serves OPT outputs. 32-bit turns walk the item's points and outputs
// together; 64-bit ones (G > 2^31) one point and output at a time, to fit the registers.
template <typename Turn>
__device__ void synthesis(const float* __restrict__ z, const float2* __restrict__ table, float* __restrict__ out,
                          int64_t batch, int64_t G, int64_t O, int64_t M, int64_t first, int64_t step) {
    constexpr bool kNarrow = sizeof(Turn) == sizeof(uint32_t);
    constexpr int KT = kNarrow ? kPointsPerThread : 1, KO = kNarrow ? kOutputsPerThread : 1;
    const int64_t groups = cdiv(G, kPointsPerThread), H = cdiv(O, kOutputsPerThread);
    const int64_t items = batch * groups * H;
    const Turn g = static_cast<Turn>(G), modes = static_cast<Turn>(M);
    for (int64_t item = first; item < items; item += step) {
        const int64_t h = item % H, q = item / H;
        const int64_t t_first = (q % groups) * kPointsPerThread, b = q / groups;
#pragma unroll 1
        for (int64_t t0 = t_first; t0 < t_first + kPointsPerThread; t0 += KT) {
#pragma unroll 1
            for (int j0 = 0; j0 < kOutputsPerThread; j0 += KO) {
                Turn r[KT], inc[KT];
                float acc[KT][KO];
                const float2* zp[KO];
#pragma unroll
                for (int m = 0; m < KT; ++m) {
                    r[m] = 0;
                    inc[m] = static_cast<Turn>(t0 + m < G ? t0 + m : (t0 + m) % G);
#pragma unroll
                    for (int j = 0; j < KO; ++j) acc[m][j] = 0.0f;
                }
                // outputs past O read output O − 1 (in bounds) and are never written
#pragma unroll
                for (int j = 0; j < KO; ++j) {
                    const int64_t o = h + (j0 + j) * H;
                    zp[j] = reinterpret_cast<const float2*>(z) + b * M * O + (o < O ? o : O - 1);
                }
#pragma unroll 2
                for (Turn k = 0; k < modes; ++k) {
                    float2 zk[KO];
#pragma unroll
                    for (int j = 0; j < KO; ++j) {
                        zk[j] = __ldg(zp[j]);
                        zp[j] += O;
                    }
#pragma unroll
                    for (int m = 0; m < KT; ++m) {
                        const float2 w = __ldg(table + r[m]);
#pragma unroll
                        for (int j = 0; j < KO; ++j)
                            acc[m][j] = capsule_fno_synthesis_acc(zk[j].x, zk[j].y, w.x, w.y, acc[m][j]);
                        r[m] = capsule_fno_turn_step(r[m], inc[m], g);
                    }
                }
#pragma unroll
                for (int m = 0; m < KT; ++m) {
#pragma unroll
                    for (int j = 0; j < KO; ++j) {
                        const int64_t o = h + (j0 + j) * H;
                        if (t0 + m < G && o < O) out[(b * G + t0 + m) * O + o] = acc[m][j];
                    }
                }
            }
        }
    }
}

__device__ __forceinline__ void run_synthesis(const float* __restrict__ z, const float* __restrict__ table,
                                              float* __restrict__ out, int64_t batch, int64_t G, int64_t O, int64_t M) {
    const float2* tw = reinterpret_cast<const float2*>(table);
    if (G <= kTurn32Limit) synthesis<uint32_t>(z, tw, out, batch, G, O, M, thread_index(), thread_count());
    else synthesis<uint64_t>(z, tw, out, batch, G, O, M, thread_index(), thread_count());
}

}  // namespace

// table (G pairs) = (cos, sin)(2π·r/G): built once per plan, read by the analyses and syntheses.
extern "C" __global__ __launch_bounds__(kMaxThreads) void capsule_fft_fno_fwd_twiddles(float* __restrict__ table,
                                                                                       int64_t grid) {
    float2* out = reinterpret_cast<float2*>(table);
    CAPSULE_GRID_STRIDE(r, grid) {
        float c, s;
        capsule_fno_twiddle(r, grid, c, s);
        out[r] = make_float2(c, s);
    }
}

// The analysis of x: with parts > 1 the parts' partial spectra into `spectrum` (parts × the
// spectrum's size), added by capsule_fft_fno_fwd_sum; with one part the spectrum itself.
extern "C" __global__ __launch_bounds__(kMaxThreads, kTransformBlocks) void capsule_fft_fno_fwd_analysis(
    const float* __restrict__ x, const float* __restrict__ table, float* __restrict__ spectrum, int64_t batch,
    int64_t grid, int64_t c_in, int64_t c_out, int64_t modes, int64_t parts) {
    (void)c_out;
    if (grid > kTurn32Limit) __trap();  // capsule_fft_fno_fwd_analysis_wide takes these grids
    analyses<uint32_t>(x, nullptr, reinterpret_cast<const float2*>(table), spectrum, nullptr, batch, grid, c_in, 0, modes,
                       parts);
}

// The same for any grid (64-bit turns): the plans launch it for G > 2^31.
extern "C" __global__ __launch_bounds__(kMaxThreads, kTransformBlocks) void capsule_fft_fno_fwd_analysis_wide(
    const float* __restrict__ x, const float* __restrict__ table, float* __restrict__ spectrum, int64_t batch,
    int64_t grid, int64_t c_in, int64_t c_out, int64_t modes, int64_t parts) {
    (void)c_out;
    analyses<uint64_t>(x, nullptr, reinterpret_cast<const float2*>(table), spectrum, nullptr, batch, grid, c_in, 0, modes,
                       parts);
}

// spectrum = Σ_p partial[p] in part order.
extern "C" __global__ __launch_bounds__(kMaxThreads, kLeanBlocks) void capsule_fft_fno_fwd_sum(
    const float* __restrict__ partial, float* __restrict__ spectrum, int64_t batch, int64_t grid, int64_t c_in,
    int64_t c_out, int64_t modes, int64_t parts) {
    (void)c_out;
    const int64_t items = batch * modes * c_in;
    CAPSULE_GRID_STRIDE(item, items) part_sum(partial, spectrum, items, grid, c_in, modes, parts, false, item);
}

// (b, k, o), o fastest: mixed = Zs = (w_k/G)·Σ_c X[b, k, c]·W[k, c, o].
extern "C" __global__ __launch_bounds__(kMaxThreads) void capsule_fft_fno_fwd_mix(
    const float* __restrict__ spectrum, const float* __restrict__ w_re, const float* __restrict__ w_im,
    float* __restrict__ mixed, int64_t batch, int64_t grid, int64_t c_in, int64_t c_out, int64_t modes) {
    CAPSULE_GRID_STRIDE(item, batch * modes * c_out) {
        const int64_t o = item % c_out, q = item / c_out;
        const int64_t k = q % modes, b = q / modes;
        const float* xs = spectrum + 2 * (b * modes + k) * c_in;
        const int64_t w0 = k * c_in * c_out + o;
        float zr = 0.0f, zi = 0.0f;
        for (int64_t c = 0; c < c_in; ++c)
            capsule_fno_mix_acc(__ldg(xs + 2 * c), __ldg(xs + 2 * c + 1), __ldg(w_re + w0 + c * c_out),
                                __ldg(w_im + w0 + c * c_out), zr, zi);
        mixed[2 * item] = capsule_fno_scale(zr, k, grid);
        mixed[2 * item + 1] = capsule_fno_scale(zi, k, grid);
    }
}

// y = the synthesis of mixed.
extern "C" __global__ __launch_bounds__(kMaxThreads, kTransformBlocks) void capsule_fft_fno_fwd_synthesis(
    const float* __restrict__ mixed, const float* __restrict__ table, float* __restrict__ y, int64_t batch,
    int64_t grid, int64_t c_in, int64_t c_out, int64_t modes) {
    (void)c_in;
    run_synthesis(mixed, table, y, batch, grid, c_out, modes);
}

// The analyses of x (unscaled, into xspec) and of g (into gspec, scaled by w_k/G: the cotangent
// of the mix's output is the adjoint of irfft applied to g), one grid over both. With parts > 1
// both are partial spectra that capsule_fft_fno_bwd_sum adds and scales.
extern "C" __global__ __launch_bounds__(kMaxThreads, kTransformBlocks) void capsule_fft_fno_bwd_spectra(
    const float* __restrict__ x, const float* __restrict__ g, const float* __restrict__ table, float* __restrict__ xspec,
    float* __restrict__ gspec, int64_t batch, int64_t grid, int64_t c_in, int64_t c_out, int64_t modes, int64_t parts) {
    if (grid > kTurn32Limit) __trap();  // capsule_fft_fno_bwd_spectra_wide takes these grids
    analyses<uint32_t>(x, g, reinterpret_cast<const float2*>(table), xspec, gspec, batch, grid, c_in, c_out, modes, parts);
}

// The same for any grid (64-bit turns): the plans launch it for G > 2^31.
extern "C" __global__ __launch_bounds__(kMaxThreads, kTransformBlocks) void capsule_fft_fno_bwd_spectra_wide(
    const float* __restrict__ x, const float* __restrict__ g, const float* __restrict__ table, float* __restrict__ xspec,
    float* __restrict__ gspec, int64_t batch, int64_t grid, int64_t c_in, int64_t c_out, int64_t modes, int64_t parts) {
    analyses<uint64_t>(x, g, reinterpret_cast<const float2*>(table), xspec, gspec, batch, grid, c_in, c_out, modes, parts);
}

// xspec = Σ_p xpart[p] and gspec = (w_k/G)·Σ_p gpart[p], part order, one grid over both.
extern "C" __global__ __launch_bounds__(kMaxThreads, kLeanBlocks) void capsule_fft_fno_bwd_sum(
    const float* __restrict__ xpart, const float* __restrict__ gpart, float* __restrict__ xspec,
    float* __restrict__ gspec, int64_t batch, int64_t grid, int64_t c_in, int64_t c_out, int64_t modes, int64_t parts) {
    const int64_t n_x = batch * modes * c_in, n_g = batch * modes * c_out;
    CAPSULE_GRID_STRIDE(i, n_x + n_g) {
        if (i < n_x) part_sum(xpart, xspec, n_x, grid, c_in, modes, parts, false, i);
        else part_sum(gpart, gspec, n_g, grid, c_out, modes, parts, true, i - n_x);
    }
}

// gxspec[b, k, c] = Σ_o gspec[b, k, o]·conj(W[k, c, o]) ((b, k, c), c fastest).
extern "C" __global__ __launch_bounds__(kMaxThreads) void capsule_fft_fno_bwd_mix(
    const float* __restrict__ gspec, const float* __restrict__ w_re, const float* __restrict__ w_im,
    float* __restrict__ gxspec, int64_t batch, int64_t grid, int64_t c_in, int64_t c_out, int64_t modes) {
    (void)grid;
    CAPSULE_GRID_STRIDE(item, batch * modes * c_in) {
        const int64_t c = item % c_in, q = item / c_in;
        const int64_t k = q % modes, b = q / modes;
        const float* gs = gspec + 2 * (b * modes + k) * c_out;
        const float* wr = w_re + (k * c_in + c) * c_out;
        const float* wi = w_im + (k * c_in + c) * c_out;
        float ar = 0.0f, ai = 0.0f;
        for (int64_t o = 0; o < c_out; ++o)
            capsule_fno_mix_adjoint_acc(__ldg(gs + 2 * o), __ldg(gs + 2 * o + 1), __ldg(wr + o), __ldg(wi + o), ar, ai);
        gxspec[2 * item] = ar;
        gxspec[2 * item + 1] = ai;
    }
}

// dx = the synthesis of gxspec (the adjoint of the analysis is the transposed twiddles).
extern "C" __global__ __launch_bounds__(kMaxThreads, kTransformBlocks) void capsule_fft_fno_bwd_x(
    const float* __restrict__ gxspec, const float* __restrict__ table, float* __restrict__ dx, int64_t batch,
    int64_t grid, int64_t c_in, int64_t c_out, int64_t modes) {
    (void)c_out;
    run_synthesis(gxspec, table, dx, batch, grid, c_in, modes);
}

// dw_re + i·dw_im [k, c, o] = Σ_b conj(xspec[b, k, c])·gspec[b, k, o], b in order ((k, c, o), o fastest).
extern "C" __global__ __launch_bounds__(kMaxThreads) void capsule_fft_fno_bwd_w(
    const float* __restrict__ xspec, const float* __restrict__ gspec, float* __restrict__ dw_re,
    float* __restrict__ dw_im, int64_t batch, int64_t grid, int64_t c_in, int64_t c_out, int64_t modes) {
    (void)grid;
    CAPSULE_GRID_STRIDE(item, modes * c_in * c_out) {
        const int64_t o = item % c_out, q = item / c_out;
        const int64_t c = q % c_in, k = q / c_in;
        float dr = 0.0f, di = 0.0f;
        for (int64_t b = 0; b < batch; ++b) {
            const float* xs = xspec + 2 * ((b * modes + k) * c_in + c);
            const float* gs = gspec + 2 * ((b * modes + k) * c_out + o);
            capsule_fno_weight_acc(__ldg(xs), __ldg(xs + 1), __ldg(gs), __ldg(gs + 1), dr, di);
        }
        dw_re[item] = dr;
        dw_im[item] = di;
    }
}
