// fft_fno: one FNO-1D spectral block as a direct transform restricted to the M kept modes
// (O(G·M) per channel, no FFT library), in three stages, each a grid-stride loop over its outputs:
//   analysis  X[b, k, c] = Σ_t x[b, t, c]·e^(−2πi·k·t/G), k < M    (KPT modes per thread)
//   mix       Zs[b, k, o] = (w_k/G)·Σ_c X[b, k, c]·W[k, c, o]       (w_k: irfft's bin weight)
//   synthesis y[b, t, o] = Σ_k Re(Zs[b, k, o]·e^(2πi·k·t/G))         (TPT grid points per thread)
// The backward is the same stages transposed: the analysis of g (scaled by w_k/G), the mix's
// adjoint with conj(W), the synthesis into dx, and the weight cotangents summed over the batch
// in a fixed order. No atomics; every sum has a fixed order.
//
// Complex spectra are stored interleaved (re, im) as float pairs: spectrum and gxspec (B, M, Ci),
// mixed and gspec (B, M, Co). Channels are the fastest thread index, so the loads of x, W and the
// spectra are coalesced or broadcast. The analysis and synthesis read twiddles from a table of
// (cos, sin)(2π·r/G), r < G, built per block in dynamic shared memory when the launch gives it
// 8·G bytes, else computed on the fly (sincospif).
#include <cstdint>

#include "common.cuh"
#include "spectral.cuh"

namespace {

using capsule::thread_count;
using capsule::thread_index;

constexpr int kMaxThreads = 256;
constexpr int kModesPerThread = 4;   // KPT
constexpr int kPointsPerThread = 4;  // TPT

// The block's twiddle table, or nullptr when the launch did not give it room for G entries.
// Every thread of the block must call it (one barrier).
__device__ __forceinline__ const float2* twiddle_table(int64_t G) {
    float2* table = capsule::dynamic_shared<float2>();
    const bool fits = static_cast<uint64_t>(G) * sizeof(float2) <= capsule::dynamic_shared_bytes();
    if (fits) {
        for (int64_t r = threadIdx.x; r < G; r += blockDim.x) {
            float c, s;
            capsule_fno_twiddle(r, G, c, s);
            table[r] = make_float2(c, s);
        }
    }
    __syncthreads();
    return fits ? table : nullptr;
}

template <bool TABLE>
__device__ __forceinline__ float2 twiddle(const float2* table, int64_t r, int64_t G) {
    if constexpr (TABLE) {
        return table[r];
    } else {
        float c, s;
        capsule_fno_twiddle_f(r, G, c, s);
        return make_float2(c, s);
    }
}

// out[b, k, c] = (scaled ? w_k/G : 1)·Σ_t in[b, t, c]·e^(−2πi·k·t/G) for k < M, interleaved.
template <bool TABLE>
__device__ void analysis(const float* __restrict__ in, float* __restrict__ out, int64_t batch, int64_t G, int64_t C, int64_t M,
                         bool scaled, const float2* table, int64_t first, int64_t step) {
    const int64_t groups = (M + kModesPerThread - 1) / kModesPerThread;
    const int64_t items = batch * groups * C;
    for (int64_t item = first; item < items; item += step) {
        const int64_t c = item % C, q = item / C;
        const int64_t k0 = (q % groups) * kModesPerThread, b = q / groups;
        int64_t r[kModesPerThread], inc[kModesPerThread];
        float re[kModesPerThread], im[kModesPerThread];
#pragma unroll
        for (int j = 0; j < kModesPerThread; ++j) {
            r[j] = 0;
            inc[j] = (k0 + j) % G;
            re[j] = 0.0f;
            im[j] = 0.0f;
        }
        const float* p = in + b * G * C + c;
        for (int64_t t = 0; t < G; ++t) {
            const float v = __ldg(p + t * C);
#pragma unroll
            for (int j = 0; j < kModesPerThread; ++j) {
                const float2 w = twiddle<TABLE>(table, r[j], G);
                capsule_fno_analysis_acc(v, w.x, w.y, re[j], im[j]);
                r[j] = capsule_fno_turn_step(r[j], inc[j], G);
            }
        }
#pragma unroll
        for (int j = 0; j < kModesPerThread; ++j) {
            const int64_t k = k0 + j;
            if (k < M) {
                float* o = out + 2 * ((b * M + k) * C + c);
                o[0] = scaled ? capsule_fno_scale(re[j], k, G) : re[j];
                o[1] = scaled ? capsule_fno_scale(im[j], k, G) : im[j];
            }
        }
    }
}

// out[b, t, o] = Σ_k Re(z[b, k, o]·e^(2πi·k·t/G)) for t < G, z interleaved (B, M, O).
template <bool TABLE>
__device__ void synthesis(const float* __restrict__ z, float* __restrict__ out, int64_t batch, int64_t G, int64_t O, int64_t M,
                          const float2* table, int64_t first, int64_t step) {
    const int64_t groups = (G + kPointsPerThread - 1) / kPointsPerThread;
    const int64_t items = batch * groups * O;
    for (int64_t item = first; item < items; item += step) {
        const int64_t o = item % O, q = item / O;
        const int64_t t0 = (q % groups) * kPointsPerThread, b = q / groups;
        int64_t r[kPointsPerThread], inc[kPointsPerThread];
        float acc[kPointsPerThread];
#pragma unroll
        for (int j = 0; j < kPointsPerThread; ++j) {
            r[j] = 0;
            inc[j] = (t0 + j) % G;
            acc[j] = 0.0f;
        }
        const float* zp = z + 2 * (b * M * O + o);
        for (int64_t k = 0; k < M; ++k) {
            const float zr = __ldg(zp + 2 * k * O), zi = __ldg(zp + 2 * k * O + 1);
#pragma unroll
            for (int j = 0; j < kPointsPerThread; ++j) {
                const float2 w = twiddle<TABLE>(table, r[j], G);
                acc[j] = capsule_fno_synthesis_acc(zr, zi, w.x, w.y, acc[j]);
                r[j] = capsule_fno_turn_step(r[j], inc[j], G);
            }
        }
#pragma unroll
        for (int j = 0; j < kPointsPerThread; ++j) {
            if (t0 + j < G) out[(b * G + t0 + j) * O + o] = acc[j];
        }
    }
}

__device__ __forceinline__ void run_analysis(const float* __restrict__ in, float* __restrict__ out, int64_t batch, int64_t G,
                                             int64_t C, int64_t M, bool scaled, int64_t first, int64_t step) {
    const float2* table = twiddle_table(G);
    if (table != nullptr) analysis<true>(in, out, batch, G, C, M, scaled, table, first, step);
    else analysis<false>(in, out, batch, G, C, M, scaled, nullptr, first, step);
}

__device__ __forceinline__ void run_synthesis(const float* __restrict__ z, float* __restrict__ out, int64_t batch, int64_t G,
                                              int64_t O, int64_t M) {
    const float2* table = twiddle_table(G);
    if (table != nullptr) synthesis<true>(z, out, batch, G, O, M, table, thread_index(), thread_count());
    else synthesis<false>(z, out, batch, G, O, M, nullptr, thread_index(), thread_count());
}

}  // namespace

// The forward in three launches of increasing `stage`: 0 analysis of x into spectrum, 1 the mix
// into mixed (scaled by w_k/G), 2 the synthesis into y. Stages 0 and 2 want 8·G bytes of dynamic
// shared memory for the twiddle table (optional: without it they compute twiddles on the fly).
extern "C" __global__ __launch_bounds__(kMaxThreads) void capsule_fft_fno_fwd(
    const float* __restrict__ x, const float* __restrict__ w_re, const float* __restrict__ w_im, float* __restrict__ y,
    float* __restrict__ spectrum, float* __restrict__ mixed, int64_t batch, int64_t grid, int64_t c_in, int64_t c_out,
    int64_t modes, int32_t stage) {
    if (stage == 0) {
        run_analysis(x, spectrum, batch, grid, c_in, modes, false, thread_index(), thread_count());
    } else if (stage == 1) {
        // (b, k, o), o fastest: Zs = (w_k/G)·Σ_c X[b, k, c]·W[k, c, o].
        CAPSULE_GRID_STRIDE(item, batch * modes * c_out) {
            const int64_t o = item % c_out, q = item / c_out;
            const int64_t k = q % modes, b = q / modes;
            const float* xs = spectrum + 2 * (b * modes + k) * c_in;
            const int64_t w0 = k * c_in * c_out + o;
            float zr = 0.0f, zi = 0.0f;
            for (int64_t c = 0; c < c_in; ++c)
                capsule_fno_mix_acc(xs[2 * c], xs[2 * c + 1], __ldg(w_re + w0 + c * c_out), __ldg(w_im + w0 + c * c_out), zr, zi);
            mixed[2 * item] = capsule_fno_scale(zr, k, grid);
            mixed[2 * item + 1] = capsule_fno_scale(zi, k, grid);
        }
    } else {
        run_synthesis(mixed, y, batch, grid, c_out, modes);
    }
}

// xspec = analysis of x (unscaled, blockIdx.y = 0) and gspec = (w_k/G)·analysis of g (blockIdx.y = 1):
// the cotangent of the mix's output is the adjoint of irfft applied to g. 8·G bytes of dynamic
// shared memory for the twiddle table, as the forward.
extern "C" __global__ __launch_bounds__(kMaxThreads) void capsule_fft_fno_bwd_spectra(
    const float* __restrict__ x, const float* __restrict__ g, float* __restrict__ xspec, float* __restrict__ gspec,
    int64_t batch, int64_t grid, int64_t c_in, int64_t c_out, int64_t modes) {
    for (int64_t which = blockIdx.y; which < 2; which += gridDim.y) {
        if (which == 0) run_analysis(x, xspec, batch, grid, c_in, modes, false, thread_index(), thread_count());
        else run_analysis(g, gspec, batch, grid, c_out, modes, true, thread_index(), thread_count());
        __syncthreads();  // the next pass rebuilds the table
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

// dx = synthesis of gxspec (the adjoint of the analysis is the transposed twiddles). 8·G bytes
// of dynamic shared memory for the twiddle table.
extern "C" __global__ __launch_bounds__(kMaxThreads) void capsule_fft_fno_bwd_x(
    const float* __restrict__ gxspec, float* __restrict__ dx, int64_t batch, int64_t grid, int64_t c_in, int64_t c_out,
    int64_t modes) {
    (void)c_out;
    run_synthesis(gxspec, dx, batch, grid, c_in, modes);
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
