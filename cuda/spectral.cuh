// Per-element math of fft_fno (cuda/spectral.cu), shared with the host tests: twiddles, the
// per-mode turn arithmetic, the irfft bin weights and the complex multiply-adds of the channel mix
// and its adjoints.
//
// Conventions: a twiddle is (cos θ, sin θ) with θ = 2π·r/G, r = (k·t) mod G. Kernels never form
// k·t in a loop: a thread that walks t for a fixed k (or k for a fixed t) adds k (or t) to r and
// wraps it, starting from capsule_fno_turn, so r stays exact for any G that fits in 64 bits. The
// walk runs in 32-bit unsigned integers when G ≤ 2^31 (r + inc < 2^32), else in 64-bit ones.
#pragma once

#include <cmath>
#include <cstdint>

#include "common.cuh"

// r + inc mod G for 0 ≤ r, inc < G (Turn: uint32_t for G ≤ 2^31, uint64_t for any G < 2^63): the
// unsigned minimum of s = r + inc and s − G, which wraps around above s when s < G.
template <typename Turn>
CAPSULE_HD Turn capsule_fno_turn_step(Turn r, Turn inc, Turn G) {
    const Turn s = r + inc, w = s - G;
    return w < s ? w : s;
}

// (k·t) mod G, exact for any k, t ≥ 0 and G ≥ 1 that fit in 64 bits: the product directly when
// it fits (both reduced below 2^32), else by doubling and adding, each step below G.
CAPSULE_HD int64_t capsule_fno_turn(int64_t k, int64_t t, int64_t G) {
    uint64_t a = static_cast<uint64_t>(k % G), b = static_cast<uint64_t>(t % G);
    const uint64_t g = static_cast<uint64_t>(G);
    if (g <= 0xFFFFFFFFull) return static_cast<int64_t>(a * b % g);
    uint64_t r = 0;
    for (; b != 0; b >>= 1) {
        if (b & 1) r = r >= g - a ? r - (g - a) : r + a;
        a = a >= g - a ? a - (g - a) : a + a;
    }
    return static_cast<int64_t>(r);
}

// At a quarter turn (4r a multiple of G, 0 ≤ r < G): the exact (cos, sin) of 2π·r/G, and true.
CAPSULE_HD bool capsule_fno_quarter_turn(int64_t r, int64_t G, float& c, float& s) {
    if ((4 * r) % G != 0) return false;
    const int64_t q = (4 * r) / G;
    c = q == 0 ? 1.0f : (q == 2 ? -1.0f : 0.0f);
    s = q == 1 ? 1.0f : (q == 3 ? -1.0f : 0.0f);
    return true;
}

// (cos, sin) of 2π·r/G for 0 ≤ r < G, exact (±1, 0) at quarter turns. The angle is reduced to
// (−π, π] in integers and evaluated in double precision, then rounded to float: the twiddle
// table's entry, computed once per plan (capsule_fft_fno_twiddles).
CAPSULE_HD void capsule_fno_twiddle(int64_t r, int64_t G, float& c, float& s) {
    if (capsule_fno_quarter_turn(r, G, c, s)) return;
    const int64_t rr = 2 * r > G ? r - G : r;
    double sd, cd;
    sincospi(2.0 * static_cast<double>(rr) / static_cast<double>(G), &sd, &cd);
    c = static_cast<float>(cd);
    s = static_cast<float>(sd);
}

// irfft's weight of bin k: 1 at DC and (even G) Nyquist, 2 elsewhere (the conjugate half).
CAPSULE_HD float capsule_fno_bin_weight(int64_t k, int64_t G) { return (k == 0 || 2 * k == G) ? 1.0f : 2.0f; }

// v·weight/G: the weight is exact (1 or 2), so one rounding.
CAPSULE_HD float capsule_fno_scale(float v, int64_t k, int64_t G) {
    return (capsule_fno_bin_weight(k, G) * v) / static_cast<float>(G);
}

// Spectrum accumulation: X += v·e^(−iθ) = (v·cos, −v·sin).
CAPSULE_HD void capsule_fno_analysis_acc(float v, float c, float s, float& re, float& im) {
    re = fmaf(v, c, re);
    im = fmaf(-v, s, im);
}

// Synthesis accumulation: y += Re(Z·e^(iθ)) = Z_re·cos − Z_im·sin.
CAPSULE_HD float capsule_fno_synthesis_acc(float zr, float zi, float c, float s, float acc) {
    return fmaf(-zi, s, fmaf(zr, c, acc));
}

// Channel mix: Z += X·W (complex).
CAPSULE_HD void capsule_fno_mix_acc(float xr, float xi, float wr, float wi, float& zr, float& zi) {
    zr = fmaf(-xi, wi, fmaf(xr, wr, zr));
    zi = fmaf(xi, wr, fmaf(xr, wi, zi));
}

// The mix's adjoint: GX += G·conj(W).
CAPSULE_HD void capsule_fno_mix_adjoint_acc(float gr, float gi, float wr, float wi, float& ar, float& ai) {
    ar = fmaf(gi, wi, fmaf(gr, wr, ar));
    ai = fmaf(-gr, wi, fmaf(gi, wr, ai));
}

// Weight cotangent: dW += conj(X)·G, i.e. dw_re += xr·gr + xi·gi, dw_im += xr·gi − xi·gr.
CAPSULE_HD void capsule_fno_weight_acc(float xr, float xi, float gr, float gi, float& dr, float& di) {
    dr = fmaf(xi, gi, fmaf(xr, gr, dr));
    di = fmaf(-xi, gr, fmaf(xr, gi, di));
}
