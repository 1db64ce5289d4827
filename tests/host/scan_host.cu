// Host harness of cuda/scan.cuh: selective_scan forward and backward computed with the kernels'
// step functions in the kernels' chunked order (per-chunk summaries, the carry pass over chunks in
// order, each chunk rerun from its entering state; shared cotangents summed over the chunk with t
// descending, then over chunks, then over the batch in order).
#include <cstdint>
#include <vector>

#include "scan.cuh"

extern "C" void host_selective_scan_fwd(const float* x, const float* a, const float* b, const float* h0, float* y, int64_t B,
                                        int64_t T, int64_t D, int32_t a_per_token, int32_t b_per_token, int64_t chunks) {
    const bool at = a_per_token != 0, bt = b_per_token != 0;
    for (int64_t bi = 0; bi < B; ++bi)
        for (int64_t d = 0; d < D; ++d) {
            std::vector<CapsuleScanChunk> summary(chunks);
            for (int64_t j = 0; j < chunks; ++j) {
                int64_t lo, hi;
                capsule_scan_chunk_range(T, chunks, j, lo, hi);
                CapsuleScanChunk s = capsule_scan_identity();
                for (int64_t t = lo; t < hi; ++t) {
                    const int64_t i = (bi * T + t) * D + d;
                    capsule_scan_push(s, a[capsule_scan_coef_index(at, bi, t, d, T, D)],
                                      b[capsule_scan_coef_index(bt, bi, t, d, T, D)], x[i]);
                }
                summary[j] = s;
            }
            std::vector<float> entering(chunks);
            float h = h0[bi * D + d];
            for (int64_t j = 0; j < chunks; ++j) {
                entering[j] = h;
                h = capsule_scan_apply(summary[j], h);
            }
            for (int64_t j = 0; j < chunks; ++j) {
                int64_t lo, hi;
                capsule_scan_chunk_range(T, chunks, j, lo, hi);
                float hj = entering[j];
                for (int64_t t = lo; t < hi; ++t) {
                    const int64_t i = (bi * T + t) * D + d;
                    hj = capsule_scan_step(hj, a[capsule_scan_coef_index(at, bi, t, d, T, D)],
                                           b[capsule_scan_coef_index(bt, bi, t, d, T, D)], x[i]);
                    y[i] = hj;
                }
            }
        }
}

// y is the forward's output (h[t]); da and db have the shapes of a and b.
extern "C" void host_selective_scan_bwd(const float* x, const float* a, const float* b, const float* h0, const float* y,
                                        const float* g, float* dx, float* da, float* db, float* dh0, int64_t B, int64_t T,
                                        int64_t D, int32_t a_per_token, int32_t b_per_token, int64_t chunks) {
    const bool at = a_per_token != 0, bt = b_per_token != 0;
    std::vector<float> da_part(B * D, 0.0f), db_part(B * D, 0.0f);
    for (int64_t bi = 0; bi < B; ++bi)
        for (int64_t d = 0; d < D; ++d) {
            std::vector<CapsuleScanChunk> map(chunks);
            for (int64_t j = 0; j < chunks; ++j) {
                int64_t lo, hi;
                capsule_scan_chunk_range(T, chunks, j, lo, hi);
                CapsuleScanChunk s = capsule_scan_identity();
                for (int64_t t = hi - 1; t >= lo; --t) {
                    const float av = a[capsule_scan_coef_index(at, bi, t, d, T, D)];
                    s.h = capsule_scan_carry(capsule_scan_total(g[(bi * T + t) * D + d], s.h), av);
                    s.a *= av;
                }
                map[j] = s;
            }
            std::vector<float> entering(chunks);
            float c = 0.0f;
            for (int64_t j = chunks - 1; j >= 0; --j) {
                entering[j] = c;
                c = capsule_scan_apply(map[j], c);
            }
            dh0[bi * D + d] = c;
            float total_a = 0.0f, total_b = 0.0f;
            for (int64_t j = 0; j < chunks; ++j) {
                int64_t lo, hi;
                capsule_scan_chunk_range(T, chunks, j, lo, hi);
                float cj = entering[j], sum_a = 0.0f, sum_b = 0.0f;
                for (int64_t t = hi - 1; t >= lo; --t) {
                    const int64_t i = (bi * T + t) * D + d;
                    const float total = capsule_scan_total(g[i], cj);
                    const float hprev = t > 0 ? y[i - D] : h0[bi * D + d];
                    const float ga = total * hprev, gb = total * x[i];
                    dx[i] = total * b[capsule_scan_coef_index(bt, bi, t, d, T, D)];
                    if (at) da[i] = ga;
                    else sum_a += ga;
                    if (bt) db[i] = gb;
                    else sum_b += gb;
                    cj = capsule_scan_carry(total, a[capsule_scan_coef_index(at, bi, t, d, T, D)]);
                }
                total_a = j == 0 ? sum_a : total_a + sum_a;
                total_b = j == 0 ? sum_b : total_b + sum_b;
            }
            da_part[bi * D + d] = total_a;
            db_part[bi * D + d] = total_b;
        }
    for (int64_t d = 0; d < D; ++d) {
        float sa = 0.0f, sb = 0.0f;
        for (int64_t bi = 0; bi < B; ++bi) {
            sa += da_part[bi * D + d];
            sb += db_part[bi * D + d];
        }
        if (!at) da[d] = sa;
        if (!bt) db[d] = sb;
    }
}

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
