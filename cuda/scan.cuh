// Per-element math of selective_scan (cuda/scan.cu), shared with the host tests: the recurrence
// step, the chunk summary and its associative combine, the reverse (cotangent) step, and the
// index arithmetic of shared and token-dependent coefficients.
#pragma once

#include <cmath>
#include <cstdint>

#include "common.cuh"

// h[t] = A[t]·h[t−1] + Bc[t]·X[t]: Bc·X rounded, then one fused multiply-add.
CAPSULE_HD float capsule_scan_step(float h, float a, float b, float x) { return fmaf(a, h, b * x); }

// A chunk of steps as the affine map h ↦ (a·2^e)·h + h: a·2^e = Π A over the chunk, h = its final
// state from h = 0. Π A is a product the recurrence itself never forms: in plain float32 it drops
// into the subnormals (or overflows) while every A·h of the recurrence stays normal, and its
// absolute rounding error there (2^-150 per factor, a relative error of up to several hundred
// percent) would then be multiplied by the state entering the chunk. So it carries its own binary
// exponent: e = 0 while |Π A| stays within [2^-60, 2^60] (then a is the plain float32 product, bit
// for bit), otherwise a is its mantissa (1/4 ≤ |a| < 1) and e its exponent.
struct CapsuleScanChunk {
    float a;
    float h;
    int e = 0;
};

CAPSULE_HD CapsuleScanChunk capsule_scan_identity() { return CapsuleScanChunk{1.0f, 0.0f}; }

// |e| beyond any exponent a product applied to a float32 state could come back from.
constexpr int kCapsuleScanMaxExp = 1 << 20;

// s.a·2^s.e times f·2^fe, one rounding of a normal product: the plain float32 product while both
// exponents are 0 and it stays within [2^-60, 2^60]; 0, ±inf and NaN factors as float32 has them.
CAPSULE_HD void capsule_scan_scale(CapsuleScanChunk& s, float f, int fe = 0) {
    const float p = capsule::mul_rn(s.a, f), m = fabsf(p);
    if ((s.e == 0 && fe == 0 && m >= 0x1p-60f && m <= 0x1p60f) || s.a == 0.0f || f == 0.0f ||
        !(fabsf(s.a) <= 0x1.fffffep127f) || !(fabsf(f) <= 0x1.fffffep127f)) {
        s.a = p;
        s.e = 0;
        return;
    }
    int es, ef;
    const float ms = frexpf(s.a, &es), mf = frexpf(f, &ef);
    s.a = capsule::mul_rn(ms, mf);  // 1/4 ≤ |s.a| < 1
    const int64_t e = static_cast<int64_t>(s.e) + fe + es + ef;
    s.e = static_cast<int>(e < -kCapsuleScanMaxExp ? -kCapsuleScanMaxExp
                           : e > kCapsuleScanMaxExp ? kCapsuleScanMaxExp : e);
    if (s.e >= -58 && s.e <= 60) {  // back within [2^-60, 2^60]: exact
        s.a = ldexpf(s.a, s.e);
        s.e = 0;
    }
}

// Extend a chunk summary by one step.
CAPSULE_HD void capsule_scan_push(CapsuleScanChunk& s, float a, float b, float x) {
    s.h = capsule_scan_step(s.h, a, b, x);
    capsule_scan_scale(s, a);
}

// The state after the chunk, entered with state h: one FMA; with a carried exponent, the product
// of the mantissas (normal, one rounding), scaled (a rounding only where it lands in the
// subnormals, as the recurrence's own A·h would), then the sum.
CAPSULE_HD float capsule_scan_apply(CapsuleScanChunk s, float h) {
    if (s.e == 0) return fmaf(s.a, h, s.h);
    int eh;
    const float mh = frexpf(h, &eh);  // h = mh·2^eh exactly; 0, ±inf and NaN come back as they are
    return capsule::add_rn(ldexpf(capsule::mul_rn(s.a, mh), s.e + eh), s.h);
}

// `first` then `second`: (A2·A1, A2·h1 + h2). Associative in exact arithmetic.
CAPSULE_HD CapsuleScanChunk capsule_scan_combine(CapsuleScanChunk first, CapsuleScanChunk second) {
    CapsuleScanChunk c{second.a, capsule_scan_apply(second, first.h), second.e};
    capsule_scan_scale(c, first.a, first.e);
    return c;
}

// The reverse recurrence, one step (t descending): total = g[t] + carry; the carry into step t−1
// is total·A[t] (and after t = 0 it is dh0).
CAPSULE_HD float capsule_scan_total(float g, float carry) { return g + carry; }

CAPSULE_HD float capsule_scan_carry(float total, float a) { return total * a; }

// Flat index of coefficient (b, t, d): (b·T + t)·D + d when token-dependent, d when shared.
CAPSULE_HD int64_t capsule_scan_coef_index(bool per_token, int64_t b, int64_t t, int64_t d, int64_t T, int64_t D) {
    return per_token ? (b * T + t) * D + d : d;
}

// Chunk j of `chunks` equal chunks of [0, T): [lo, hi), empty past the end.
CAPSULE_HD void capsule_scan_chunk_range(int64_t T, int64_t chunks, int64_t j, int64_t& lo, int64_t& hi) {
    const int64_t len = (T + chunks - 1) / chunks;
    lo = j * len < T ? j * len : T;
    hi = lo + len < T ? lo + len : T;
}
