// Host harness of cuda/conv_pool.cuh. host_<kernel> has the parameter list of capsule_<kernel>
// (the registry's) and runs the kernel's per-thread code for every thread of every tile, phase by
// phase as the barriers of conv_pool.cu order them: all threads store their registers into the
// shared tiles, then each loads the next step and multiplies. The warp butterflies of the channel
// sums are replayed lane by lane. Plus the index helpers the tests probe one by one.
#include <array>
#include <cstdint>
#include <vector>

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

template <bool TRANSPOSED>
void corr(const CorrProblem& p) {
    using T = CorrTiles;
    struct Thread {
        CorrRow row;
        float ra[T::A_PER], rb[T::B_PER];
        float acc[T::TM][T::TN];
    };
    alignas(16) float As[T::BK * T::BM];
    alignas(16) float Bs[T::BK * T::BN];
    std::vector<Thread> threads(kGemmThreads);
    const int64_t tiles = corr_tiles<T>(p), tiles_n = corr_tiles_n<T>(p), steps = corr_steps<T>(p);
    for (int64_t t = 0; t < tiles; ++t) {
        const int64_t tile_m = t / tiles_n, tile_n = t % tiles_n;
        for (int tid = 0; tid < kGemmThreads; ++tid) {
            Thread& th = threads[tid];
            th.row = corr_row<T>(p, tile_m, tid);
            for (auto& r : th.acc)
                for (float& a : r) a = 0.0f;
            if (steps > 0) corr_load<T, TRANSPOSED>(p, th.row, 0, tile_n, tid, th.ra, th.rb);
        }
        for (int64_t step = 0; step < steps; ++step) {
            for (int tid = 0; tid < kGemmThreads; ++tid) corr_store<T>(threads[tid].ra, threads[tid].rb, As, Bs, tid);
            for (int tid = 0; tid < kGemmThreads; ++tid) {
                Thread& th = threads[tid];
                if (step + 1 < steps) corr_load<T, TRANSPOSED>(p, th.row, step + 1, tile_n, tid, th.ra, th.rb);
                corr_product<T>(As, Bs, tid, th.acc);
            }
        }
        for (int tid = 0; tid < kGemmThreads; ++tid) corr_epilogue<T>(p, tile_m, tile_n, tid, threads[tid].acc);
    }
}

void weight(const WeightProblem& p) {
    using T = WeightTile;
    struct Thread {
        float ra[T::PER], rb[T::PER];
        float acc[T::TM][T::TN];
    };
    alignas(16) float As[T::BK * T::LDA];
    alignas(16) float Bs[T::BK * T::LDB];
    std::vector<Thread> threads(kGemmThreads);
    const int64_t tiles = weight_tiles(p);
    for (int64_t t = 0; t < tiles; ++t) {
        const WeightJob job = weight_job(p, t);
        for (int tid = 0; tid < kGemmThreads; ++tid) {
            Thread& th = threads[tid];
            for (auto& r : th.acc)
                for (float& a : r) a = 0.0f;
            if (job.step0 < job.step1) weight_load(p, job, job.step0, tid, th.ra, th.rb);
        }
        for (int64_t step = job.step0; step < job.step1; ++step) {
            for (int tid = 0; tid < kGemmThreads; ++tid) weight_store(threads[tid].ra, threads[tid].rb, As, Bs, tid);
            for (int tid = 0; tid < kGemmThreads; ++tid) {
                Thread& th = threads[tid];
                if (step + 1 < job.step1) weight_load(p, job, step + 1, tid, th.ra, th.rb);
                weight_product(As, Bs, tid, th.acc);
            }
        }
        for (int tid = 0; tid < kGemmThreads; ++tid) weight_epilogue(p, job, tid, threads[tid].acc);
    }
}

// The block reduction of channel_sums: __shfl_xor_sync butterflies per warp, then warps in order.
void channel_sums(const float* g, float* db, int64_t n, int64_t channels, int64_t positions) {
    const bool vec = positions % 4 == 0 && aligned16(g);
    for (int64_t c = 0; c < channels; ++c) {
        std::array<float, kSumThreads> s;
        for (int tid = 0; tid < kSumThreads; ++tid) s[tid] = channel_partial(g, n, channels, positions, c, tid, kSumThreads, vec);
        for (int offset = 16; offset > 0; offset >>= 1) {
            std::array<float, kSumThreads> next;
            for (int tid = 0; tid < kSumThreads; ++tid) next[tid] = add_rn(s[tid], s[(tid & ~31) | ((tid & 31) ^ offset)]);
            s = next;
        }
        float total = s[0];
        for (int k = 1; k < kSumThreads / 32; ++k) total = add_rn(total, s[32 * k]);
        db[c] = total;
    }
}

}  // namespace

// -- conv ---------------------------------------------------------------------------------------------

extern "C" void host_conv_fwd(const float* x, const float* weight, const float* b, float* y, int64_t n, int64_t c_in,
                              int64_t c_out, int64_t d, int64_t h, int64_t w, int64_t od, int64_t oh, int64_t ow,
                              int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh, int64_t sw, int64_t pd,
                              int64_t ph, int64_t pw) {
    corr<false>(CorrProblem{x, weight, b, y, n, c_in, c_out, dims(d, h, w), dims(od, oh, ow),
                            window(kd, kh, kw, sd, sh, sw, pd, ph, pw)});
}

extern "C" void host_conv_bwd_x(const float* g, const float* weight, float* dx, int64_t n, int64_t c_in, int64_t c_out,
                                int64_t d, int64_t h, int64_t w, int64_t od, int64_t oh, int64_t ow, int64_t kd,
                                int64_t kh, int64_t kw, int64_t sd, int64_t sh, int64_t sw, int64_t pd, int64_t ph,
                                int64_t pw) {
    corr<true>(CorrProblem{g, weight, nullptr, dx, n, c_out, c_in, dims(od, oh, ow), dims(d, h, w),
                           window(kd, kh, kw, sd, sh, sw, pd, ph, pw)});
}

extern "C" void host_conv_bwd_w(const float* x, const float* g, float* dw, float* partial, int64_t n, int64_t c_in,
                                int64_t c_out, int64_t d, int64_t h, int64_t w, int64_t od, int64_t oh, int64_t ow,
                                int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh, int64_t sw, int64_t pd,
                                int64_t ph, int64_t pw, int64_t splits) {
    weight(WeightProblem{g, x, dw, partial, n, c_out, c_in, dims(od, oh, ow), dims(d, h, w),
                         window(kd, kh, kw, sd, sh, sw, pd, ph, pw), splits});
}

extern "C" void host_conv_bwd_wsum(const float* partial, float* dw, int64_t count, int64_t splits) {
    for (int64_t e = 0; e < count; ++e) dw[e] = split_sum(partial, count, splits, e);
}

extern "C" void host_conv_bwd_b(const float* g, float* db, int64_t n, int64_t, int64_t c_out, int64_t, int64_t,
                                int64_t, int64_t od, int64_t oh, int64_t ow, int64_t, int64_t, int64_t, int64_t,
                                int64_t, int64_t, int64_t, int64_t, int64_t) {
    channel_sums(g, db, n, c_out, od * oh * ow);
}

// -- conv_transpose -------------------------------------------------------------------------------------

extern "C" void host_conv_transpose_fwd(const float* x, const float* weight, const float* b, float* y, int64_t n,
                                        int64_t c_in, int64_t c_out, int64_t d, int64_t h, int64_t w, int64_t od,
                                        int64_t oh, int64_t ow, int64_t kd, int64_t kh, int64_t kw, int64_t sd,
                                        int64_t sh, int64_t sw, int64_t pd, int64_t ph, int64_t pw) {
    corr<true>(CorrProblem{x, weight, b, y, n, c_in, c_out, dims(d, h, w), dims(od, oh, ow),
                           window(kd, kh, kw, sd, sh, sw, pd, ph, pw)});
}

extern "C" void host_conv_transpose_bwd_x(const float* g, const float* weight, float* dx, int64_t n, int64_t c_in,
                                          int64_t c_out, int64_t d, int64_t h, int64_t w, int64_t od, int64_t oh,
                                          int64_t ow, int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh,
                                          int64_t sw, int64_t pd, int64_t ph, int64_t pw) {
    corr<false>(CorrProblem{g, weight, nullptr, dx, n, c_out, c_in, dims(od, oh, ow), dims(d, h, w),
                            window(kd, kh, kw, sd, sh, sw, pd, ph, pw)});
}

extern "C" void host_conv_transpose_bwd_w(const float* x, const float* g, float* dw, float* partial, int64_t n,
                                          int64_t c_in, int64_t c_out, int64_t d, int64_t h, int64_t w, int64_t od,
                                          int64_t oh, int64_t ow, int64_t kd, int64_t kh, int64_t kw, int64_t sd,
                                          int64_t sh, int64_t sw, int64_t pd, int64_t ph, int64_t pw, int64_t splits) {
    weight(WeightProblem{x, g, dw, partial, n, c_in, c_out, dims(d, h, w), dims(od, oh, ow),
                         window(kd, kh, kw, sd, sh, sw, pd, ph, pw), splits});
}

extern "C" void host_conv_transpose_bwd_wsum(const float* partial, float* dw, int64_t count, int64_t splits) {
    host_conv_bwd_wsum(partial, dw, count, splits);
}

extern "C" void host_conv_transpose_bwd_b(const float* g, float* db, int64_t n, int64_t, int64_t c_out, int64_t,
                                          int64_t, int64_t, int64_t od, int64_t oh, int64_t ow, int64_t, int64_t,
                                          int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t) {
    channel_sums(g, db, n, c_out, od * oh * ow);
}

// -- pooling ----------------------------------------------------------------------------------------------

#define POOL_PARAMS                                                                                              \
    int64_t planes, int64_t d, int64_t h, int64_t w, int64_t od, int64_t oh, int64_t ow, int64_t kd, int64_t kh, \
        int64_t kw, int64_t sd, int64_t sh, int64_t sw, int64_t pd, int64_t ph, int64_t pw
#define POOL_GEOM pool(planes, d, h, w, od, oh, ow, kd, kh, kw, sd, sh, sw, pd, ph, pw)

extern "C" void host_max_pool_fwd(const float* x, float* y, POOL_PARAMS) {
    const PoolGeom g = POOL_GEOM;
    for (int64_t i = 0; i < planes * volume(g.out); ++i) y[i] = max_pool_at(x, g, i);
}

extern "C" void host_max_pool_bwd(const float* x, const float* gy, float* dx, POOL_PARAMS) {
    const PoolGeom g = POOL_GEOM;
    for (int64_t i = 0; i < planes * volume(g.in); ++i) dx[i] = max_pool_grad_at(x, gy, g, i);
}

extern "C" void host_smooth_max_pool_fwd(const float* x, float* y, POOL_PARAMS, float beta) {
    const PoolGeom g = POOL_GEOM;
    for (int64_t i = 0; i < planes * volume(g.out); ++i) y[i] = smooth_max_pool_at(x, g, beta, i);
}

extern "C" void host_smooth_max_pool_bwd(const float* x, const float* y, const float* gy, float* dx, POOL_PARAMS,
                                         float beta) {
    const PoolGeom g = POOL_GEOM;
    for (int64_t i = 0; i < planes * volume(g.in); ++i) dx[i] = smooth_max_pool_grad_at(x, y, gy, g, beta, i);
}

extern "C" void host_avg_pool_fwd(const float* x, float* y, POOL_PARAMS) {
    const PoolGeom g = POOL_GEOM;
    for (int64_t i = 0; i < planes * volume(g.out); ++i) y[i] = avg_pool_at(x, g, i);
}

extern "C" void host_avg_pool_bwd(const float* gy, float* dx, POOL_PARAMS) {
    const PoolGeom g = POOL_GEOM;
    for (int64_t i = 0; i < planes * volume(g.in); ++i) dx[i] = avg_pool_grad_at(gy, g, i);
}

// -- index helpers --------------------------------------------------------------------------------------------

extern "C" int64_t host_source(int32_t transposed, int64_t o, int64_t k, int64_t s, int64_t p, int64_t in) {
    return transposed ? source<true>(o, k, s, p, in) : source<false>(o, k, s, p, in);
}

extern "C" void host_covering(int64_t i, int64_t k, int64_t s, int64_t p, int64_t out, int64_t* span) {
    const Span r = covering(i, k, s, p, out);
    span[0] = r.first;
    span[1] = r.last;
}

// The first maximum of every window: index[o] (flat cell in the plane, -1 for none), value[o].
extern "C" void host_window_argmax(const float* x, int64_t* index, float* value, POOL_PARAMS) {
    const PoolGeom g = POOL_GEOM;
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
// for padding, from the same corr_row / source_cell the tile loader uses.
extern "C" void host_corr_gather(int32_t transposed, int64_t n, int64_t ic, int64_t d, int64_t h, int64_t w, int64_t od,
                                 int64_t oh, int64_t ow, int64_t kd, int64_t kh, int64_t kw, int64_t sd, int64_t sh,
                                 int64_t sw, int64_t pd, int64_t ph, int64_t pw, int64_t* table) {
    using T = CorrTiles;
    const CorrProblem p{nullptr, nullptr, nullptr, nullptr, n, ic, 1, dims(d, h, w), dims(od, oh, ow),
                        window(kd, kh, kw, sd, sh, sw, pd, ph, pw)};
    const int64_t rows = n * volume(p.os), kv = volume(p.win.k);
    for (int64_t m = 0; m < rows; ++m) {
        const CorrRow row = corr_row<T>(p, m / T::BM, static_cast<int>(m % T::BM));
        for (int64_t r = 0; r < kv; ++r) {
            const Cell kc = unflatten(r, p.win.k);
            const int64_t cell = transposed ? source_cell<true>(row.cell, kc, p.win, p.is)
                                            : source_cell<false>(row.cell, kc, p.win, p.is);
            table[m * kv + r] = (row.valid && cell >= 0) ? row.in_base + cell : -1;
        }
    }
}
