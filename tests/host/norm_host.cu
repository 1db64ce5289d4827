// Host harness of cuda/norm.cuh's pieces: Welford's push and merge, the normalise/affine and dx
// formulas, the channel and plane walkers, the part ranges, each against arithmetic a test can
// compute. Whole kernels are held to the reference, the error model and bitwise determinism on the
// emulator (tests/test_kernels_norm.py), not to a copy of their reduction trees.
#include <cstdint>

#include "norm.cuh"

// -- the pieces alone --------------------------------------------------------------------------------

// Welford over values[0..n) pushed in order: out = (mean, M2).
extern "C" void host_welford(const float* values, int64_t n, float* out) {
    CapsuleWelford w = capsule_welford_empty();
    for (int64_t i = 0; i < n; ++i) capsule_welford_push(w, values[i]);
    out[0] = w.mean;
    out[1] = w.m2;
}

// Welford over values split at `split`, the halves merged: out = (mean, M2).
extern "C" void host_welford_split(const float* values, int64_t n, int64_t split, float* out) {
    CapsuleWelford a = capsule_welford_empty(), b = capsule_welford_empty();
    for (int64_t i = 0; i < n; ++i) capsule_welford_push(i < split ? a : b, values[i]);
    const CapsuleWelford w = capsule_welford_merge(a, b);
    out[0] = w.mean;
    out[1] = w.m2;
}

extern "C" void host_norm_rows(const float* x, const float* mean, const float* rstd, const float* gamma, const float* beta,
                               float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = capsule_norm_affine(capsule_norm_xhat(x[i], mean[i], rstd[i]), gamma[i], beta[i]);
}

extern "C" void host_norm_dx(const float* xhat, const float* ghat, const float* rstd, const float* m1, const float* m2,
                             float* dx, int64_t n) {
    for (int64_t i = 0; i < n; ++i) dx[i] = capsule_norm_dx(xhat[i], ghat[i], rstd[i], m1[i], m2[i]);
}

// The channel walker's (c, s) for `count` steps from `first` by `step`.
extern "C" void host_channel_walk(int64_t first, int64_t step, int64_t C, int64_t S, int64_t count, int64_t* c, int64_t* s) {
    CapsuleChannelWalker it = capsule_channel_walker(first, step, C, S);
    for (int64_t i = 0; i < count; ++i) {
        c[i] = it.c;
        s[i] = it.s;
        capsule_channel_advance(it);
    }
}

// capsule_channel_next from (s, c) `count` times.
extern "C" void host_channel_next(int64_t s, int64_t c, int64_t C, int64_t S, int64_t count, int64_t* cs, int64_t* ss) {
    for (int64_t i = 0; i < count; ++i) {
        cs[i] = c;
        ss[i] = s;
        capsule_channel_next(s, c, S, C);
    }
}

// The plane walker's offsets of channel c for `count` steps from `first` by `step`.
extern "C" void host_plane_walk(int64_t first, int64_t step, int64_t c, int64_t C, int64_t S, int64_t count, int64_t* offset) {
    CapsulePlaneWalker it = capsule_plane_walker(first, step, c, C, S);
    for (int64_t i = 0; i < count; ++i) {
        offset[i] = it.offset;
        capsule_plane_advance(it);
    }
}

extern "C" void host_part_range(int64_t total, int64_t parts, int64_t p, int64_t* lo, int64_t* hi) {
    capsule_part_range(total, parts, p, *lo, *hi);
}
