// Per-element math of selective_scan (cuda/scan.cu), shared with the host tests: the recurrence
// step, the chunk summary and its associative combine, the reverse (cotangent) step, and the
// index arithmetic of shared and token-dependent coefficients.
#pragma once

#include <cmath>
#include <cstdint>

#include "common.cuh"

// h[t] = A[t]·h[t−1] + Bc[t]·X[t]: Bc·X rounded, then one fused multiply-add.
CAPSULE_HD float capsule_scan_step(float h, float a, float b, float x) { return fmaf(a, h, b * x); }

// A chunk of steps as the affine map h ↦ a·h + h: a = Π A over the chunk, h = its final state
// from h = 0.
struct CapsuleScanChunk {
    float a;
    float h;
};

CAPSULE_HD CapsuleScanChunk capsule_scan_identity() { return CapsuleScanChunk{1.0f, 0.0f}; }

// Extend a chunk summary by one step.
CAPSULE_HD void capsule_scan_push(CapsuleScanChunk& s, float a, float b, float x) {
    s.h = capsule_scan_step(s.h, a, b, x);
    s.a *= a;
}

// The state after the chunk, entered with state h.
CAPSULE_HD float capsule_scan_apply(CapsuleScanChunk s, float h) { return fmaf(s.a, h, s.h); }

// `first` then `second`: (A2·A1, A2·h1 + h2). Associative in exact arithmetic.
CAPSULE_HD CapsuleScanChunk capsule_scan_combine(CapsuleScanChunk first, CapsuleScanChunk second) {
    return CapsuleScanChunk{second.a * first.a, fmaf(second.a, first.h, second.h)};
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
