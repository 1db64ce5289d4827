// Host harness of cuda/spectral.cuh: fft_fno forward and backward computed with the kernels'
// per-element functions in the kernels' order (each mode and channel over each of `parts` ranges
// of ⌈G/parts⌉ grid points in t order, whichever modes and channels a thread groups; the partial
// spectra added in part order; TPT grid points per synthesis thread; turns advanced by addition
// from capsule_fno_turn; the twiddle table).
#include <cstdint>
#include <vector>

#include "spectral.cuh"

namespace {

constexpr int64_t kModesPerThread = 2;
constexpr int64_t kPointsPerThread = 2;

struct Twiddles {
    std::vector<float> c, s;

    explicit Twiddles(int64_t G) : c(G), s(G) {
        for (int64_t r = 0; r < G; ++r) capsule_fno_twiddle(r, G, c[r], s[r]);
    }
};

// out (B, M, C) interleaved = (scaled ? w_k/G : 1)·Σ_t in[b, t, c]·e^(−2πi·k·t/G): per part the
// partial sums from zero, then (parts > 1) the parts added in order from zero and scaled.
void analysis(const float* in, float* out, int64_t B, int64_t G, int64_t C, int64_t M, int64_t parts, bool scaled,
              const Twiddles& tw) {
    const int64_t groups = (M + kModesPerThread - 1) / kModesPerThread, span = (G + parts - 1) / parts;
    std::vector<float> partial(2 * parts * B * M * C);
    for (int64_t p = 0; p < parts; ++p)
        for (int64_t b = 0; b < B; ++b)
            for (int64_t kg = 0; kg < groups; ++kg)
                for (int64_t c = 0; c < C; ++c) {
                    const int64_t k0 = kg * kModesPerThread, t0 = p * span < G ? p * span : G;
                    const int64_t n = G - t0 < span ? G - t0 : span;
                    for (int64_t j = 0; j < kModesPerThread; ++j) {
                        const int64_t k = k0 + j;
                        int64_t r = capsule_fno_turn(k, t0, G);
                        const int64_t inc = k % G;
                        float re = 0.0f, im = 0.0f;
                        for (int64_t t = t0; t < t0 + n; ++t) {
                            capsule_fno_analysis_acc(in[(b * G + t) * C + c], tw.c[r], tw.s[r], re, im);
                            r = capsule_fno_turn_step<uint64_t>(r, inc, G);
                        }
                        if (k >= M) continue;
                        float* o = partial.data() + 2 * (((p * B + b) * M + k) * C + c);
                        o[0] = re;
                        o[1] = im;
                    }
                }
    for (int64_t i = 0; i < B * M * C; ++i) {
        float re = partial[2 * i], im = partial[2 * i + 1];
        if (parts > 1) {
            re = im = 0.0f;
            for (int64_t p = 0; p < parts; ++p) {
                re = re + partial[2 * (p * B * M * C + i)];
                im = im + partial[2 * (p * B * M * C + i) + 1];
            }
        }
        const int64_t k = (i / C) % M;
        out[2 * i] = scaled ? capsule_fno_scale(re, k, G) : re;
        out[2 * i + 1] = scaled ? capsule_fno_scale(im, k, G) : im;
    }
}

// out (B, G, O) = Σ_k Re(z[b, k, o]·e^(2πi·k·t/G)).
void synthesis(const float* z, float* out, int64_t B, int64_t G, int64_t O, int64_t M, const Twiddles& tw) {
    const int64_t groups = (G + kPointsPerThread - 1) / kPointsPerThread;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t tg = 0; tg < groups; ++tg)
            for (int64_t o = 0; o < O; ++o) {
                const int64_t t0 = tg * kPointsPerThread;
                int64_t r[kPointsPerThread], inc[kPointsPerThread];
                float acc[kPointsPerThread];
                for (int64_t j = 0; j < kPointsPerThread; ++j) {
                    r[j] = 0;
                    inc[j] = (t0 + j) % G;
                    acc[j] = 0.0f;
                }
                for (int64_t k = 0; k < M; ++k) {
                    const float* zk = z + 2 * ((b * M + k) * O + o);
                    for (int64_t j = 0; j < kPointsPerThread; ++j) {
                        acc[j] = capsule_fno_synthesis_acc(zk[0], zk[1], tw.c[r[j]], tw.s[r[j]], acc[j]);
                        r[j] = capsule_fno_turn_step<uint64_t>(r[j], inc[j], G);
                    }
                }
                for (int64_t j = 0; j < kPointsPerThread; ++j)
                    if (t0 + j < G) out[(b * G + t0 + j) * O + o] = acc[j];
            }
}

// out (B, M, O) interleaved = finish(Σ_i acc over the I channels of in (B, M, I), k): per batch, mode
// and out channel the channels in order from zero, the weight of (i, o) at w[k, i, o] (w (M, I, O))
// or, `adjoint`, at w[k, o, i] (w (M, O, I)).
template <typename Acc, typename Finish>
void mix(const float* in, const float* w_re, const float* w_im, float* out, int64_t B, int64_t M, int64_t I, int64_t O,
         bool adjoint, Acc acc, Finish finish) {
    for (int64_t b = 0; b < B; ++b)
        for (int64_t k = 0; k < M; ++k)
            for (int64_t o = 0; o < O; ++o) {
                float zr = 0.0f, zi = 0.0f;
                for (int64_t i = 0; i < I; ++i) {
                    const float* s = in + 2 * ((b * M + k) * I + i);
                    const int64_t w = adjoint ? (k * O + o) * I + i : (k * I + i) * O + o;
                    acc(s[0], s[1], w_re[w], w_im[w], zr, zi);
                }
                float* z = out + 2 * ((b * M + k) * O + o);
                z[0] = finish(zr, k);
                z[1] = finish(zi, k);
            }
}

}  // namespace

extern "C" void host_fft_fno_fwd(const float* x, const float* w_re, const float* w_im, float* y, int64_t B, int64_t G,
                                 int64_t Ci, int64_t Co, int64_t M, int64_t parts) {
    const Twiddles tw(G);
    std::vector<float> spectrum(2 * B * M * Ci), mixed(2 * B * M * Co);
    analysis(x, spectrum.data(), B, G, Ci, M, parts, false, tw);
    mix(spectrum.data(), w_re, w_im, mixed.data(), B, M, Ci, Co, false, capsule_fno_mix_acc,
        [G](float v, int64_t k) { return capsule_fno_scale(v, k, G); });
    synthesis(mixed.data(), y, B, G, Co, M, tw);
}

extern "C" void host_fft_fno_bwd(const float* x, const float* w_re, const float* w_im, const float* g, float* dx, float* dw_re,
                                 float* dw_im, int64_t B, int64_t G, int64_t Ci, int64_t Co, int64_t M, int64_t parts) {
    const Twiddles tw(G);
    std::vector<float> xspec(2 * B * M * Ci), gspec(2 * B * M * Co), gxspec(2 * B * M * Ci);
    analysis(x, xspec.data(), B, G, Ci, M, parts, false, tw);
    analysis(g, gspec.data(), B, G, Co, M, parts, true, tw);
    mix(gspec.data(), w_re, w_im, gxspec.data(), B, M, Co, Ci, true, capsule_fno_mix_adjoint_acc,
        [](float v, int64_t) { return v; });
    synthesis(gxspec.data(), dx, B, G, Ci, M, tw);
    for (int64_t k = 0; k < M; ++k)
        for (int64_t c = 0; c < Ci; ++c)
            for (int64_t o = 0; o < Co; ++o) {
                float dr = 0.0f, di = 0.0f;
                for (int64_t b = 0; b < B; ++b) {
                    const float* xs = xspec.data() + 2 * ((b * M + k) * Ci + c);
                    const float* gs = gspec.data() + 2 * ((b * M + k) * Co + o);
                    capsule_fno_weight_acc(xs[0], xs[1], gs[0], gs[1], dr, di);
                }
                dw_re[(k * Ci + c) * Co + o] = dr;
                dw_im[(k * Ci + c) * Co + o] = di;
            }
}

// The rfft bins k < M of one real sequence (the analysis alone): out (M, 2).
extern "C" void host_rfft_modes(const float* x, int64_t G, int64_t M, float* out, int64_t parts) {
    analysis(x, out, 1, G, 1, M, parts, false, Twiddles(G));
}

extern "C" void host_fno_twiddles(int64_t G, const int64_t* r, int64_t n, float* c, float* s) {
    for (int64_t i = 0; i < n; ++i) capsule_fno_twiddle(r[i], G, c[i], s[i]);
}

// The turn sequence a thread walks: r_0 = start, r_{j+1} = r_j + inc mod G, in 32-bit turns when
// `narrow` (G ≤ 2^31), else in 64-bit ones (G < 2^63).
extern "C" void host_fno_turns(int64_t G, int64_t start, int64_t inc, int64_t n, int64_t* out, int32_t narrow) {
    if (narrow) {
        uint32_t r = static_cast<uint32_t>(start);
        for (int64_t j = 0; j < n; ++j) {
            out[j] = r;
            r = capsule_fno_turn_step<uint32_t>(r, static_cast<uint32_t>(inc % G), static_cast<uint32_t>(G));
        }
    } else {
        uint64_t r = static_cast<uint64_t>(start);
        for (int64_t j = 0; j < n; ++j) {
            out[j] = static_cast<int64_t>(r);
            r = capsule_fno_turn_step<uint64_t>(r, static_cast<uint64_t>(inc % G), static_cast<uint64_t>(G));
        }
    }
}

// (k[i]·t[i]) mod G.
extern "C" void host_fno_turn(const int64_t* k, const int64_t* t, int64_t n, int64_t G, int64_t* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = capsule_fno_turn(k[i], t[i], G);
}

extern "C" void host_fno_bin_scale(const float* v, const int64_t* k, int64_t n, int64_t G, float* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = capsule_fno_scale(v[i], k[i], G);
}
