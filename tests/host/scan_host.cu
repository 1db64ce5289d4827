// Host build of cuda/scan.cuh's chunk algebra (the summaries the kernels of cuda/scan.cu combine, and
// their chunks of time), callable from ctypes.
#include <cstdint>

#include "scan.cuh"

// Chunk summaries of the steps (a[i], b[i], x[i]), i < n, split at `split` and combined, applied
// to h: out = (combined a, combined h, state after all steps from h).
extern "C" void host_scan_split(const float* a, const float* b, const float* x, int64_t n, int64_t split, float h, float* out) {
    CapsuleScanChunk first = capsule_scan_identity(), second = capsule_scan_identity();
    for (int64_t i = 0; i < n; ++i) capsule_scan_push(i < split ? first : second, a[i], b[i], x[i]);
    const CapsuleScanChunk s = capsule_scan_combine(first, second);
    out[0] = s.a;
    out[1] = s.h;
    out[2] = capsule_scan_apply(s, h);
}

// ((c1 c2) c3) and (c1 (c2 c3)) for chunk summaries given as (a, h) pairs: out = both, a then h.
extern "C" void host_scan_associate(const float* c1, const float* c2, const float* c3, float* out) {
    const CapsuleScanChunk p{c1[0], c1[1]}, q{c2[0], c2[1]}, r{c3[0], c3[1]};
    const CapsuleScanChunk left = capsule_scan_combine(capsule_scan_combine(p, q), r);
    const CapsuleScanChunk right = capsule_scan_combine(p, capsule_scan_combine(q, r));
    out[0] = left.a;
    out[1] = left.h;
    out[2] = right.a;
    out[3] = right.h;
}

extern "C" void host_scan_chunk_range(int64_t T, int64_t chunks, int64_t j, int64_t* lo, int64_t* hi) {
    capsule_scan_chunk_range(T, chunks, j, *lo, *hi);
}
