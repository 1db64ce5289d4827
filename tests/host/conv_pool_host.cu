// Host harness of cuda/conv_pool.cuh: the index arithmetic of the pools and the implicit GEMMs,
// callable from ctypes, probed one case at a time against brute force.
#include <cstdint>

#include "conv_pool.cuh"

using namespace capsule_cp;

namespace {

Dims3 dims(int64_t d, int64_t h, int64_t w) { return Dims3{d, h, w}; }

Window window(int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh, int64_t sw, int64_t pd, int64_t ph,
              int64_t pw) {
    return Window{Dims3{kd, kh, kw}, Dims3{sd, sh, sw}, Dims3{pd, ph, pw}};
}

PoolGeom pool(int64_t planes, int64_t d, int64_t h, int64_t w, int64_t od, int64_t oh, int64_t ow, int64_t kd,
              int64_t kh, int64_t kw, int64_t sd, int64_t sh, int64_t sw, int64_t pd, int64_t ph, int64_t pw) {
    return PoolGeom{planes, dims(d, h, w), dims(od, oh, ow), window(kd, kh, kw, sd, sh, sw, pd, ph, pw)};
}

}  // namespace

extern "C" int64_t host_source(int32_t transposed, int64_t o, int64_t k, int64_t s, int64_t p, int64_t in) {
    return transposed ? source<true>(o, k, s, p, in) : source<false>(o, k, s, p, in);
}

extern "C" void host_covering(int64_t i, int64_t k, int64_t s, int64_t p, int64_t out, int64_t* span) {
    const Span r = covering(i, k, s, p, out);
    span[0] = r.first;
    span[1] = r.last;
}

// The first maximum of every window: index[o] (flat cell in the plane, -1 for none), value[o].
extern "C" void host_window_argmax(const float* x, int64_t* index, float* value, int64_t planes, int64_t d, int64_t h,
                                   int64_t w, int64_t od, int64_t oh, int64_t ow, int64_t kd, int64_t kh, int64_t kw,
                                   int64_t sd, int64_t sh, int64_t sw, int64_t pd, int64_t ph, int64_t pw) {
    const PoolGeom g = pool(planes, d, h, w, od, oh, ow, kd, kh, kw, sd, sh, sw, pd, ph, pw);
    const int64_t ov = volume(g.out);
    for (int64_t i = 0; i < planes * ov; ++i) {
        const int64_t plane = i / ov;
        const MaxCell m = window_max(x + plane * volume(g.in), g, unflatten(i - plane * ov, g.out));
        index[i] = m.index;
        value[i] = m.value;
    }
}

// The implicit GEMM's gather map: table[m·K + r] = the element of `in` (n·c·cells flat, channel
// 0) that row m (output position) reads at reduction index r = kernel offset (channel 0), or -1
// for padding, from the same corr_row / corr_source the tile loader uses.
template <bool TRANSPOSED>
void corr_gather(const CorrProblem& p, int64_t* table) {
    using T = CorrTiles;
    const int64_t rows = p.n * volume(p.os), kv = volume(p.win.k);
    for (int64_t m = 0; m < rows; ++m) {
        const CorrRow row = corr_row<T, TRANSPOSED>(p, m / T::BM, static_cast<int>(m % T::BM));
        for (int64_t r = 0; r < kv; ++r) {
            const Cell k = unflatten(r, p.win.k);
            const int64_t cell = corr_source<TRANSPOSED>(p, row, k);
            table[m * kv + r] = cell < 0 ? -1 : row.base + (TRANSPOSED ? cell : flatten(k, p.is));
        }
    }
}

extern "C" void host_corr_gather(int32_t transposed, int64_t n, int64_t ic, int64_t d, int64_t h, int64_t w, int64_t od,
                                 int64_t oh, int64_t ow, int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh,
                                 int64_t sw, int64_t pd, int64_t ph, int64_t pw, int64_t* table) {
    const CorrProblem p{nullptr, nullptr, nullptr, nullptr, n, ic, 1, dims(d, h, w), dims(od, oh, ow),
                        window(kd, kh, kw, sd, sh, sw, pd, ph, pw)};
    if (transposed)
        corr_gather<true>(p, table);
    else
        corr_gather<false>(p, table);
}
