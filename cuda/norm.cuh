// Per-element math of the normalisation family (layer_norm, batch_norm), shared by the kernels in
// norm.cu and the host tests: Welford statistics and their merge, the normalise/affine formula, the
// backward formula given the per-statistic sums, and the (N, C, S) index walkers.
#pragma once

#include <cmath>
#include <cstdint>

#include "common.cuh"

// -- Welford statistics -----------------------------------------------------------------------------

// Count, mean and M2 = Σ(x − mean)² of a set of values.
struct CapsuleWelford {
    int64_t n;
    float mean;
    float m2;
};

CAPSULE_HD CapsuleWelford capsule_welford_empty() { return CapsuleWelford{0, 0.0f, 0.0f}; }

// Welford's update: M2 grows by d·(x − new mean), both factors of one sign, so M2 ≥ 0.
CAPSULE_HD void capsule_welford_push(CapsuleWelford& w, float x) {
    w.n += 1;
    const float d = x - w.mean;
    w.mean += d / static_cast<float>(w.n);
    w.m2 = fmaf(d, x - w.mean, w.m2);
}

// Chan et al.'s merge of two disjoint sets. Not symmetric in rounding: callers fix the order
// (lower lane, warp or part first) so that every thread that merges the same pair gets the same bits.
CAPSULE_HD CapsuleWelford capsule_welford_merge(CapsuleWelford a, CapsuleWelford b) {
    if (b.n == 0) return a;
    if (a.n == 0) return b;
    const int64_t n = a.n + b.n;
    const float wb = static_cast<float>(b.n) / static_cast<float>(n);
    const float d = b.mean - a.mean;
    CapsuleWelford r;
    r.n = n;
    r.mean = fmaf(d, wb, a.mean);
    r.m2 = fmaf(d * d, static_cast<float>(a.n) * wb, a.m2 + b.m2);
    return r;
}

// Welford state of x and g together, for batch_norm's backward: the statistics of x, the mean and the
// plain sum of g, and the co-moment C = Σ(x − x̄)(g − ḡ) = Σ g·(x − x̄), so Σ g·x̂ = C·rstd.
struct CapsuleComoment {
    int64_t n;
    float mean_x;
    float m2;
    float mean_g;
    float cxg;
    float sum_g;
};

CAPSULE_HD CapsuleComoment capsule_comoment_empty() { return CapsuleComoment{0, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f}; }

CAPSULE_HD CapsuleComoment capsule_comoment_merge(CapsuleComoment a, CapsuleComoment b) {
    if (b.n == 0) return a;
    if (a.n == 0) return b;
    const int64_t n = a.n + b.n;
    const float wb = static_cast<float>(b.n) / static_cast<float>(n);
    const float cross = static_cast<float>(a.n) * wb;
    const float dx = b.mean_x - a.mean_x;
    const float dg = b.mean_g - a.mean_g;
    CapsuleComoment r;
    r.n = n;
    r.mean_x = fmaf(dx, wb, a.mean_x);
    r.mean_g = fmaf(dg, wb, a.mean_g);
    r.m2 = fmaf(dx * dx, cross, a.m2 + b.m2);
    r.cxg = fmaf(dx * dg, cross, a.cxg + b.cxg);
    r.sum_g = a.sum_g + b.sum_g;
    return r;
}

// A thread's running Welford state with a float count, fed a chunk of values at a time: the chunk's
// mean (one division) and M2 about it (two-pass over the chunk), then Chan's merge (one division
// for the weight). Per chunk, not per element: no divide or int64 conversion per value.
struct CapsuleChunkWelford {
    float n;
    float mean;
    float m2;
};

// Merges values v[0 .. count) (count ≥ 1) into w.
template <int N>
CAPSULE_HD void capsule_chunk_push(CapsuleChunkWelford& w, const float (&v)[N], int count) {
    float s = 0.0f;
    for (int i = 0; i < N; ++i)
        if (i < count) s += v[i];
    const float c = static_cast<float>(count), mean = s / c;
    float m2 = 0.0f;
    for (int i = 0; i < N; ++i) {
        if (i < count) {
            const float d = v[i] - mean;
            m2 = fmaf(d, d, m2);
        }
    }
    const float n = w.n + c, wb = c / n, d = mean - w.mean;
    w.mean = fmaf(d, wb, w.mean);
    w.m2 = fmaf(d * d, w.n * wb, w.m2 + m2);
    w.n = n;
}

// The same for x and g together (batch_norm's backward): means of x and g, M2 of x, the co-moment
// Σ(x − x̄)(g − ḡ) and the plain sum of g.
struct CapsuleChunkComoment {
    float n;
    float mean_x;
    float m2;
    float mean_g;
    float cxg;
    float sum_g;
};

template <int N>
CAPSULE_HD void capsule_chunk_push(CapsuleChunkComoment& w, const float (&x)[N], const float (&g)[N], int count) {
    float sx = 0.0f, sg = 0.0f;
    for (int i = 0; i < N; ++i) {
        if (i < count) {
            sx += x[i];
            sg += g[i];
        }
    }
    const float c = static_cast<float>(count), mx = sx / c, mg = sg / c;
    float m2 = 0.0f, cxg = 0.0f;
    for (int i = 0; i < N; ++i) {
        if (i < count) {
            const float dx = x[i] - mx;
            m2 = fmaf(dx, dx, m2);
            cxg = fmaf(dx, g[i] - mg, cxg);
        }
    }
    const float n = w.n + c, wb = c / n, cross = w.n * wb, dx = mx - w.mean_x, dg = mg - w.mean_g;
    w.mean_x = fmaf(dx, wb, w.mean_x);
    w.mean_g = fmaf(dg, wb, w.mean_g);
    w.m2 = fmaf(dx * dx, cross, w.m2 + m2);
    w.cxg = fmaf(dx * dg, cross, w.cxg + cxg);
    w.sum_g += sg;
    w.n = n;
}

// -- the normalisation formulas --------------------------------------------------------------------

// 1/√(σ² + eps) with a correctly rounded square root and division (-prec-sqrt, -prec-div).
CAPSULE_HD float capsule_norm_rstd(float var, float eps) { return 1.0f / sqrtf(var + eps); }

CAPSULE_HD float capsule_norm_xhat(float x, float mean, float rstd) { return (x - mean) * rstd; }

CAPSULE_HD float capsule_norm_affine(float xhat, float gamma, float beta) { return fmaf(xhat, gamma, beta); }

// dx = (ĝ − mean ĝ − x̂·mean(ĝ·x̂))·rstd, ĝ = g·gamma: the spec's formula divided through by the
// statistic length, given the two means of the row or channel.
CAPSULE_HD float capsule_norm_dx(float xhat, float ghat, float rstd, float mean_ghat, float mean_ghat_xhat) {
    return fmaf(-xhat, mean_ghat_xhat, ghat - mean_ghat) * rstd;
}

// -- index walkers over (N, C, S) ---------------------------------------------------------------------

// The channel c = (i / S) % C and spatial offset s = i % S of flat indices i = first, first + step, …,
// advanced without a division per step. Needs S ≥ 1 and C ≥ 1.
struct CapsuleChannelWalker {
    int64_t s, c, ds, dc, S, C;
};

CAPSULE_HD CapsuleChannelWalker capsule_channel_walker(int64_t first, int64_t step, int64_t C, int64_t S) {
    CapsuleChannelWalker w;
    w.S = S;
    w.C = C;
    w.s = first % S;
    w.c = (first / S) % C;
    w.ds = step % S;
    w.dc = (step / S) % C;
    return w;
}

// c + dc + carry ≤ 2C − 1, so one subtraction wraps it.
CAPSULE_HD void capsule_channel_advance(CapsuleChannelWalker& w) {
    w.s += w.ds;
    w.c += w.dc;
    if (w.s >= w.S) {
        w.s -= w.S;
        w.c += 1;
    }
    if (w.c >= w.C) w.c -= w.C;
}

// The next flat index (i + 1): used inside a 4-element vector.
CAPSULE_HD void capsule_channel_next(int64_t& s, int64_t& c, int64_t S, int64_t C) {
    if (++s == S) {
        s = 0;
        if (++c == C) c = 0;
    }
}

// The elements of channel c in statistic order j = n·S + s (j = first, first + step, …): their flat
// offsets (n·C + c)·S + s, advanced without a division per step.
struct CapsulePlaneWalker {
    int64_t s, offset, ds, doffset, S, plane_gap;
};

CAPSULE_HD CapsulePlaneWalker capsule_plane_walker(int64_t first, int64_t step, int64_t c, int64_t C, int64_t S) {
    CapsulePlaneWalker w;
    w.S = S;
    w.s = first % S;
    w.offset = ((first / S) * C + c) * S + w.s;
    w.ds = step % S;
    w.doffset = (step / S) * C * S + w.ds;
    w.plane_gap = (C - 1) * S;  // from the end of a plane of channel c to the start of its next one
    return w;
}

CAPSULE_HD void capsule_plane_advance(CapsulePlaneWalker& w) {
    w.s += w.ds;
    w.offset += w.doffset;
    if (w.s >= w.S) {
        w.s -= w.S;
        w.offset += w.plane_gap;
    }
}

// Part p of [0, total) cut into `parts` balanced runs of whole groups of 4 (the last group may be
// short): [lo, hi), lo a multiple of 4.
CAPSULE_HD void capsule_group_part_range(int64_t total, int64_t parts, int64_t p, int64_t& lo, int64_t& hi) {
    const int64_t groups = (total + 3) / 4;
    lo = 4 * (p * groups / parts);
    const int64_t end = 4 * ((p + 1) * groups / parts);
    hi = end < total ? end : total;
}

// Part p of `parts` balanced chunks of [0, total) (lengths differ by at most one): [lo, hi).
CAPSULE_HD void capsule_part_range(int64_t total, int64_t parts, int64_t p, int64_t& lo, int64_t& hi) {
    lo = p * total / parts;
    hi = (p + 1) * total / parts;
}
