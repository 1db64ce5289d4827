// Host harness of cuda/view.cuh: each kernel of cuda/view.cu replayed on the host with the same
// per-element functions, the grid-stride loops run one item after another, the shared-memory tile of
// the permute path as a host array, the warp shuffle tree of broadcast's backward lane by lane
// (replay.h: the tree, and the count of 16-byte accesses off alignment).

#include "replay.h"

#include <vector>

#include "view.cuh"

namespace {

template <int kPath, typename I>
void items(const int64_t* shape, const int64_t* stride, int rank, const uint32_t* x, uint32_t* y, int64_t n) {
    const int64_t count = capsule_view_items(kPath, n);
    for (int64_t item = 0; item < count; ++item) capsule_view_item<kPath, I>(shape, stride, rank, x, y, static_cast<I>(item));
}

template <int kPath>
void path(const int64_t* shape, const int64_t* stride, int rank, const uint32_t* x, uint32_t* y, int64_t n) {
    if (n <= int64_t(0xffffffff)) items<kPath, uint32_t>(shape, stride, rank, x, y, n);
    else items<kPath, int64_t>(shape, stride, rank, x, y, n);
}

void tiles(const int64_t* shape, const int64_t* stride, int rank, const uint32_t* x, uint32_t* y) {
    std::vector<uint32_t> tile(CAPSULE_TILE_SLOTS, 0xdeadbeefu);
    const CapsuleTile t = capsule_tile_layout(shape, stride, rank, capsule_tile_axis(shape, stride, rank));
    for (int64_t id = 0; id < t.tiles; ++id) {
        int64_t x_base, y_base, a0, b0, rel;
        int slot;
        capsule_tile_origin(shape, stride, rank, t, id, &x_base, &y_base, &a0, &b0);
        for (int e = 0; e < CAPSULE_TILE_ELEMS; ++e)
            if (capsule_tile_load(t, a0, b0, e, &rel, &slot)) tile[slot] = x[x_base + rel];
        for (int e = 0; e < CAPSULE_TILE_ELEMS; ++e)
            if (capsule_tile_store(t, a0, b0, e, &rel, &slot)) y[y_base + rel] = tile[slot];
    }
}

template <typename I>
void rows_with(const uint32_t* src, uint32_t* dst, const CapsuleRows& r, bool vec4) {
    const CapsuleRows q = vec4 ? capsule_rows_by4(r) : r;
    for (int64_t e = 0; e < q.rows * q.len; ++e) {
        I s, d;
        capsule_rows_offsets<I>(q, static_cast<I>(e), &s, &d);
        if (vec4) capsule_move4(src + 4 * static_cast<int64_t>(s), dst + 4 * static_cast<int64_t>(d));
        else dst[d] = src[s];
    }
}

void rows(const uint32_t* src, uint32_t* dst, const CapsuleRows& r) {
    const bool vec4 = capsule_rows_vec4(r, capsule_aligned16(src), capsule_aligned16(dst));
    if (capsule_rows_fit32(r)) rows_with<uint32_t>(src, dst, r, vec4);
    else rows_with<int64_t>(src, dst, r, vec4);
}

template <typename I>
void slice_fill(const uint32_t* g, uint32_t* dx, const CapsuleSliceFill& f, int64_t n, bool vec4) {
    const CapsuleSliceFill q = vec4 ? capsule_slice_fill_by4(f) : f;
    for (int64_t e = 0; e < (vec4 ? n / 4 : n); ++e) {
        const int64_t s = capsule_slice_fill_source<I>(q, static_cast<I>(e));
        if (vec4) {
            if (s < 0) capsule_fill4(0u, dx + 4 * e);
            else capsule_move4(g + 4 * s, dx + 4 * e);
        } else {
            dx[e] = s < 0 ? 0u : g[s];
        }
    }
}

}  // namespace

extern "C" int64_t host_view_offset(const int64_t* shape, const int64_t* stride, int rank, int64_t i, int use32) {
    if (use32) return capsule_view_offset<uint32_t>(shape, stride, rank, static_cast<uint32_t>(i));
    return capsule_view_offset<int64_t>(shape, stride, rank, i);
}

extern "C" int host_view_path(const int64_t* shape, const int64_t* stride, int rank, int x16, int y16, int tiles) {
    return capsule_view_path(shape, stride, rank, x16 != 0, y16 != 0, tiles != 0);
}

extern "C" int64_t host_tile_count(const int64_t* shape, const int64_t* stride, int rank) {
    return capsule_tile_layout(shape, stride, rank, capsule_tile_axis(shape, stride, rank)).tiles;
}

// capsule_permute_fwd/bwd (tiles = 1) and capsule_broadcast_fwd (tiles = 0); returns the path taken.
extern "C" int host_view_gather(const uint32_t* x, uint32_t* y, const int64_t* geometry, int rank, int64_t n, int allow_tiles) {
    if (rank < 0 || rank > CAPSULE_VIEW_MAX_RANK) return -1;
    const int64_t* shape = geometry;
    const int64_t* stride = geometry + rank;
    const int p = capsule_view_path(shape, stride, rank, capsule_aligned16(x), capsule_aligned16(y), allow_tiles != 0);
    if (p == CAPSULE_PATH_TILE) tiles(shape, stride, rank, x, y);
    else if (p == CAPSULE_PATH_COPY4) path<CAPSULE_PATH_COPY4>(shape, stride, rank, x, y, n);
    else if (p == CAPSULE_PATH_FILL4) path<CAPSULE_PATH_FILL4>(shape, stride, rank, x, y, n);
    else path<CAPSULE_PATH_SCALAR>(shape, stride, rank, x, y, n);
    return p;
}

// capsule_broadcast_bwd with `block` threads per block; returns 1 for row mode, 0 for column mode.
extern "C" int host_broadcast_bwd(const float* g, float* dx, const int64_t* geometry, int rank, int64_t n_x,
                                  int64_t copies, int block) {
    if (rank < 0 || rank > CAPSULE_VIEW_MAX_RANK) return -1;
    int64_t kshape[CAPSULE_VIEW_MAX_RANK], kstride[CAPSULE_VIEW_MAX_RANK];
    int64_t sshape[CAPSULE_VIEW_MAX_RANK], sstride[CAPSULE_VIEW_MAX_RANK];
    int nk, ns;
    const bool row_mode = capsule_broadcast_split(geometry, rank, kshape, kstride, &nk, sshape, sstride, &ns);
    if (row_mode) {
        const int group = block % 32 == 0 ? 32 : 1;
        for (int64_t j = 0; j < n_x; ++j) {
            float p[32];
            for (int lane = 0; lane < group; ++lane)
                p[lane] = capsule_broadcast_partial<int64_t>(g, kshape, kstride, nk, sshape, sstride, ns, j, lane, group, copies);
            dx[j] = group == 32 ? capsule_replay::tree32(p) : p[0];
        }
    } else {
        const int lanes = block < 32 ? block : 32, warps = block / lanes;
        for (int64_t j = 0; j < n_x; ++j) {
            float sum = 0.0f;
            for (int w = 0; w < warps; ++w) {
                const float acc = capsule_broadcast_partial<int64_t>(g, kshape, kstride, nk, sshape, sstride, ns, j, w, warps, copies);
                sum = w == 0 ? acc : sum + acc;
            }
            dx[j] = sum;
        }
    }
    return row_mode ? 1 : 0;
}

extern "C" void host_concat_fwd(const uint32_t* x, uint32_t* y, int64_t outer, int64_t size_in, int64_t inner,
                                int64_t size_out, int64_t offset) {
    rows(x, y, capsule_concat_fwd_rows(outer, size_in, inner, size_out, offset));
}

extern "C" void host_concat_bwd(const uint32_t* g, uint32_t* dx, int64_t outer, int64_t size_in, int64_t inner,
                                int64_t size_out, int64_t offset) {
    rows(g, dx, capsule_concat_bwd_rows(outer, size_in, inner, size_out, offset));
}

extern "C" void host_slice_fwd(const uint32_t* x, uint32_t* y, int64_t outer, int64_t size, int64_t inner,
                               int64_t start, int64_t length) {
    rows(x, y, capsule_slice_fwd_rows(outer, size, inner, start, length));
}

// Returns 1 where the 16-byte path ran.
extern "C" int host_slice_bwd(const uint32_t* g, uint32_t* dx, int64_t outer, int64_t size, int64_t inner,
                              int64_t start, int64_t length) {
    const CapsuleSliceFill f = capsule_slice_fill(size, inner, start, length);
    const int64_t n = outer * f.row;
    const bool vec4 = capsule_slice_fill_vec4(f, capsule_aligned16(g), capsule_aligned16(dx));
    if (n <= int64_t(0xffffffff)) slice_fill<uint32_t>(g, dx, f, n, vec4);
    else slice_fill<int64_t>(g, dx, f, n, vec4);
    return vec4 ? 1 : 0;
}

// The row plan of a concat or slice launch: [rows, len, src0, src_step, dst0, dst_step].
extern "C" void host_rows(int which, int64_t a, int64_t b, int64_t c, int64_t d, int64_t e, int64_t* out) {
    CapsuleRows r = which == 0 ? capsule_concat_fwd_rows(a, b, c, d, e)
                  : which == 1 ? capsule_concat_bwd_rows(a, b, c, d, e)
                               : capsule_slice_fwd_rows(a, b, c, d, e);
    out[0] = r.rows; out[1] = r.len; out[2] = r.src0; out[3] = r.src_step; out[4] = r.dst0; out[5] = r.dst_step;
}
