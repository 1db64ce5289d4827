// Host harness of cuda/norm.cuh: layer_norm and batch_norm computed with the kernels' per-element
// functions in the kernels' order (member partials, the xor butterfly within each warp, warps folded
// in order, parts merged in order), so their rounding is what a launch of the plan's shape does.
#include <cstdint>
#include <vector>

#include "norm.cuh"

namespace {

// The device's warp butterfly on each 32 members, then the warp results folded in warp order.
float team_sum(std::vector<float> v) {
    for (size_t base = 0; base < v.size(); base += 32) {
        for (int o = 16; o > 0; o >>= 1) {
            float next[32];
            for (int i = 0; i < 32; ++i) next[i] = v[base + i] + v[base + (i ^ o)];
            for (int i = 0; i < 32; ++i) v[base + i] = next[i];
        }
    }
    float r = v[0];
    for (size_t w = 32; w < v.size(); w += 32) r += v[w];
    return r;
}

CapsuleWelford merge(const CapsuleWelford& a, const CapsuleWelford& b) { return capsule_welford_merge(a, b); }

CapsuleComoment merge(const CapsuleComoment& a, const CapsuleComoment& b) { return capsule_comoment_merge(a, b); }

// The butterfly merges (lower lane, upper lane) on both partners, as warp_merge does.
template <class W>
W team_merge(std::vector<W> v) {
    for (size_t base = 0; base < v.size(); base += 32) {
        for (int o = 16; o > 0; o >>= 1) {
            W next[32];
            for (int i = 0; i < 32; ++i) {
                next[i] = (i & o) ? merge(v[base + (i ^ o)], v[base + i]) : merge(v[base + i], v[base + (i ^ o)]);
            }
            for (int i = 0; i < 32; ++i) v[base + i] = next[i];
        }
    }
    W r = v[0];
    for (size_t w = 32; w < v.size(); w += 32) r = merge(r, v[w]);
    return r;
}

constexpr int64_t kWarpRowMax = 256;
constexpr int64_t kWideFwdGroups = 4, kWideBwdGroups = 2;

// How the kernels hold one row: `team` members (a warp, or the block), `per` vectors of `vec`
// floats each, or streamed (per = 0) by a block. `wide_groups` > 0: the wide kernels' layout
// (groups of 4 columns, that many a thread, over a block of `block` threads).
struct RowLayout {
    int64_t team, vec, per;
};

RowLayout row_layout(int64_t cols, int64_t block, int64_t wide_groups) {
    if (wide_groups > 0) return RowLayout{block, 4, wide_groups};
    if (cols > kWarpRowMax) return RowLayout{block, cols % 4 == 0 ? 4 : 1, 0};
    const int64_t vec = cols % 4 == 0 ? 4 : 1;
    int64_t per = (cols + vec * 32 - 1) / (vec * 32);
    int64_t p = 1;
    while (p < per) p *= 2;
    return RowLayout{32, vec, p};
}

int64_t tile_col(const RowLayout& L, int64_t m, int64_t j) { return (j * L.team + m) * L.vec; }

// Row statistics: two-pass over the member tiles, or Welford streamed by the block (float4 by
// float4 when `vec_stream`: the forward's streamed path; the backward's streams scalars).
void row_stats(const float* x, int64_t cols, float eps, const RowLayout& L, bool vec_stream, float& mean, float& rstd) {
    if (L.per == 0) {
        std::vector<CapsuleWelford> w(L.team, capsule_welford_empty());
        for (int64_t m = 0; m < L.team; ++m) {
            if (vec_stream && L.vec == 4) {
                for (int64_t q = m; q < cols / 4; q += L.team)
                    for (int k = 0; k < 4; ++k) capsule_welford_push(w[m], x[4 * q + k]);
            } else {
                for (int64_t i = m; i < cols; i += L.team) capsule_welford_push(w[m], x[i]);
            }
        }
        const CapsuleWelford r = team_merge(w);
        mean = r.mean;
        rstd = capsule_norm_rstd(r.m2 / static_cast<float>(cols), eps);
        return;
    }
    std::vector<float> s(L.team), q(L.team);
    for (int64_t m = 0; m < L.team; ++m) {
        float acc = 0.0f;
        for (int64_t j = 0; j < L.per; ++j)
            for (int64_t k = 0; k < L.vec; ++k) {
                const int64_t col = tile_col(L, m, j);
                acc += col < cols ? x[col + k] : 0.0f;
            }
        s[m] = acc;
    }
    mean = team_sum(s) / static_cast<float>(cols);
    for (int64_t m = 0; m < L.team; ++m) {
        float acc = 0.0f;
        for (int64_t j = 0; j < L.per; ++j) {
            const int64_t col = tile_col(L, m, j);
            if (col < cols)
                for (int64_t k = 0; k < L.vec; ++k) {
                    const float d = x[col + k] - mean;
                    acc = fmaf(d, d, acc);
                }
        }
        q[m] = acc;
    }
    rstd = capsule_norm_rstd(team_sum(q) / static_cast<float>(cols), eps);
}

}  // namespace

// `wide`: capsule_layer_norm_fwd_wide with a block of `block` threads; else capsule_layer_norm_fwd.
extern "C" void host_layer_norm_fwd(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd,
                                    int64_t rows, int64_t cols, float eps, int64_t block, int64_t wide) {
    const RowLayout L = row_layout(cols, block, wide ? kWideFwdGroups : 0);
    for (int64_t row = 0; row < rows; ++row) {
        const float* xr = x + row * cols;
        float mu, r;
        row_stats(xr, cols, eps, L, true, mu, r);
        for (int64_t c = 0; c < cols; ++c)
            y[row * cols + c] = capsule_norm_affine(capsule_norm_xhat(xr[c], mu, r), gamma[c], beta[c]);
        mean[row] = mu;
        rstd[row] = r;
    }
}

// dx per row as capsule_layer_norm_bwd_x, then dgamma, dbeta as bwd_partials (row lanes
// `lanes`, parts `parts`) and bwd_params; with `wide` as capsule_layer_norm_bwd_x_wide (a block of
// `block` threads per part, each column's sums over the part's rows in row order) and bwd_params.
extern "C" void host_layer_norm_bwd(const float* x, const float* gamma, const float* g, float* dx, float* dgamma, float* dbeta,
                                    int64_t rows, int64_t cols, float eps, int64_t block, int64_t parts, int64_t lanes,
                                    int64_t wide) {
    const RowLayout L = row_layout(cols, block, wide ? kWideBwdGroups : 0);
    std::vector<float> mean(rows), rstd(rows);
    for (int64_t row = 0; row < rows; ++row) {
        const float* xr = x + row * cols;
        const float* gr = g + row * cols;
        float mu, r;
        row_stats(xr, cols, eps, L, false, mu, r);
        mean[row] = mu;
        rstd[row] = r;
        std::vector<float> s1(L.team, 0.0f), s2(L.team, 0.0f);
        for (int64_t m = 0; m < L.team; ++m) {
            if (L.per == 0) {
                for (int64_t i = m; i < cols; i += L.team) {
                    const float gh = gr[i] * gamma[i];
                    s1[m] += gh;
                    s2[m] = fmaf(gh, capsule_norm_xhat(xr[i], mu, r), s2[m]);
                }
            } else {
                for (int64_t j = 0; j < L.per; ++j)
                    for (int64_t k = 0; k < L.vec; ++k) {
                        const int64_t col = tile_col(L, m, j);
                        const float gh = col < cols ? gr[col + k] * gamma[col + k] : 0.0f;
                        const float xh = col < cols ? capsule_norm_xhat(xr[col + k], mu, r) : 0.0f;
                        s1[m] += gh;
                        s2[m] = fmaf(gh, xh, s2[m]);
                    }
            }
        }
        const float m1 = team_sum(s1) / static_cast<float>(cols), m2 = team_sum(s2) / static_cast<float>(cols);
        for (int64_t c = 0; c < cols; ++c)
            dx[row * cols + c] = capsule_norm_dx(capsule_norm_xhat(xr[c], mu, r), gr[c] * gamma[c], r, m1, m2);
    }
    for (int64_t c = 0; c < cols; ++c) {
        float sg = 0.0f, sb = 0.0f;
        for (int64_t p = 0; p < parts; ++p) {
            int64_t lo, hi;
            capsule_part_range(rows, parts, p, lo, hi);
            float tg = 0.0f, tb = 0.0f;
            for (int64_t lane = 0; lane < (wide ? 1 : lanes); ++lane) {
                float ag = 0.0f, ab = 0.0f;
                for (int64_t r = lo + lane; r < hi; r += (wide ? 1 : lanes)) {
                    const float gv = g[r * cols + c];
                    ag = fmaf(gv, capsule_norm_xhat(x[r * cols + c], mean[r], rstd[r]), ag);
                    ab += gv;
                }
                if (lane == 0) {
                    tg = ag;
                    tb = ab;
                } else {
                    tg += ag;
                    tb += ab;
                }
            }
            sg += tg;
            sb += tb;
        }
        dgamma[c] = sg;
        dbeta[c] = sb;
    }
}

namespace {

// Group u of a chunk: the `valid` values of channel c's 4 consecutive statistic indices at the
// walker, zeros after (load_group's element walk; its 16-byte load reads the same values).
void load_group(const float* p, const CapsulePlaneWalker& it, int64_t valid, float* v) {
    int64_t s = it.s, off = it.offset;
    for (int k = 0; k < 4; ++k) {
        v[k] = k < valid ? p[off] : 0.0f;
        if (++s == it.S) {
            s = 0;
            off += it.plane_gap + 1;
        } else {
            ++off;
        }
    }
}

CapsuleWelford finish(const CapsuleChunkWelford& w) { return CapsuleWelford{static_cast<int64_t>(w.n), w.mean, w.m2}; }

CapsuleComoment finish(const CapsuleChunkComoment& w) {
    return CapsuleComoment{static_cast<int64_t>(w.n), w.mean_x, w.m2, w.mean_g, w.cxg, w.sum_g};
}

// Channel c's statistics as the partial launch and the merge compute them: per part, each thread
// its groups t, t + block, … in chunks of U groups (channel_chunks), then the block merge.
template <int U, class W, class C, class Push>
W channel_state(const float* x, const float* g, int64_t n, int64_t channels, int64_t spatial, int64_t c, int64_t block,
                int64_t parts, W empty, C chunk_empty, Push push) {
    const int64_t per_channel = n * spatial;
    W total = empty;
    for (int64_t p = 0; p < parts; ++p) {
        int64_t lo, hi;
        capsule_group_part_range(per_channel, parts, p, lo, hi);
        std::vector<W> w(block, empty);
        for (int64_t t = 0; t < block; ++t) {
            const int64_t first = lo + 4 * t;
            if (first >= hi) continue;
            CapsulePlaneWalker it = capsule_plane_walker(first, 4 * block, c, channels, spatial);
            C state = chunk_empty;
            for (int64_t j = first; j < hi; j += 4 * U * block) {
                float xv[4 * U], gv[4 * U];
                int count = 0;
                for (int u = 0; u < U; ++u) {
                    const int64_t e = j + 4 * u * block;
                    const int64_t valid = e < hi ? (hi - e < 4 ? hi - e : 4) : 0;
                    load_group(x, it, valid, xv + 4 * u);
                    if (g) load_group(g, it, valid, gv + 4 * u);
                    count += static_cast<int>(valid);
                    if (valid > 0) capsule_plane_advance(it);
                }
                push(state, xv, gv, count);
            }
            w[t] = finish(state);
        }
        W part = team_merge(w);
        part.n = hi - lo;  // the merge kernel knows the count from the part's bounds
        total = merge(total, part);
    }
    return total;
}

}  // namespace

extern "C" void host_batch_norm_fwd(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd,
                                    int64_t n, int64_t channels, int64_t spatial, float eps, int64_t block, int64_t parts) {
    for (int64_t c = 0; c < channels; ++c) {
        const CapsuleWelford w = channel_state<4>(
            x, nullptr, n, channels, spatial, c, block, parts, capsule_welford_empty(), CapsuleChunkWelford{0.0f, 0.0f, 0.0f},
            [](CapsuleChunkWelford& s, const float (&xv)[16], const float (&)[16], int count) { capsule_chunk_push(s, xv, count); });
        mean[c] = w.mean;
        rstd[c] = capsule_norm_rstd(w.m2 / static_cast<float>(n * spatial), eps);
    }
    for (int64_t i = 0; i < n * channels * spatial; ++i) {
        const int64_t c = (i / spatial) % channels;
        y[i] = capsule_norm_affine(capsule_norm_xhat(x[i], mean[c], rstd[c]), gamma[c], beta[c]);
    }
}

extern "C" void host_batch_norm_bwd(const float* x, const float* gamma, const float* g, float* dx, float* dgamma, float* dbeta,
                                    int64_t n, int64_t channels, int64_t spatial, float eps, int64_t block, int64_t parts) {
    std::vector<float> mean(channels), rstd(channels);
    for (int64_t c = 0; c < channels; ++c) {
        const CapsuleComoment w = channel_state<2>(
            x, g, n, channels, spatial, c, block, parts, capsule_comoment_empty(),
            CapsuleChunkComoment{0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f},
            [](CapsuleChunkComoment& s, const float (&xv)[8], const float (&gv)[8], int count) {
                capsule_chunk_push(s, xv, gv, count);
            });
        rstd[c] = capsule_norm_rstd(w.m2 / static_cast<float>(n * spatial), eps);
        mean[c] = w.mean_x;
        dgamma[c] = w.cxg * rstd[c];
        dbeta[c] = w.sum_g;
    }
    const float inv_count = 1.0f / static_cast<float>(n * spatial);
    for (int64_t i = 0; i < n * channels * spatial; ++i) {
        const int64_t c = (i / spatial) % channels;
        const float m1 = gamma[c] * dbeta[c] * inv_count, m2 = gamma[c] * dgamma[c] * inv_count;
        dx[i] = capsule_norm_dx(capsule_norm_xhat(x[i], mean[c], rstd[c]), g[i] * gamma[c], rstd[c], m1, m2);
    }
}

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
