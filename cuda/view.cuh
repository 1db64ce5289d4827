// Index arithmetic of the shape and layout kernels (cuda/view.cu): permute, broadcast, concat, slice.
// Every function here is __host__ __device__: tests/host/view_host.cu checks the index arithmetic on
// the host. Values move as 32-bit words (uint32_t), never as floats, so −0 and NaN payloads survive.
#pragma once

#include <cstdint>

#include "common.cuh"

// Geometry of permute and broadcast (a meta int64 buffer of 2·rank entries): the output shape, then
// for each output axis the stride of the input element it reads (0 along a broadcast axis). The plan
// drops size-1 axes and merges axes that stay contiguous, so the kernels mostly see rank 1 to 3.
#define CAPSULE_VIEW_MAX_RANK 64

// How a permute or broadcast launch moves its elements (every thread derives it from the geometry).
#define CAPSULE_PATH_SCALAR 0  // one element per item
#define CAPSULE_PATH_COPY4 1   // the last axis is contiguous in x too: 16-byte moves
#define CAPSULE_PATH_FILL4 2   // the last axis is broadcast: one x value written as a 16-byte vector
#define CAPSULE_PATH_TILE 3    // permute moving the innermost axis: shared-memory tiles, one per block-iteration

#define CAPSULE_TILE_ELEMS 1024   // elements per tile (TA · TB)
#define CAPSULE_TILE_SLOTS 2048   // shared words per tile: TA rows of TB + 1 (padding against bank conflicts)

// capsule::aligned16 under the name the view and index kernels use.
CAPSULE_HD bool capsule_aligned16(const void* p) { return capsule::aligned16(p); }

// Moves of four 32-bit words; on the device one 16-byte load and store (both addresses 16-byte aligned).
CAPSULE_HD void capsule_move4(const uint32_t* src, uint32_t* dst) {
#if defined(__CUDA_ARCH__)
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
#else
    for (int q = 0; q < 4; ++q) dst[q] = src[q];
#endif
}

CAPSULE_HD void capsule_fill4(uint32_t v, uint32_t* dst) {
#if defined(__CUDA_ARCH__)
    *reinterpret_cast<uint4*>(dst) = make_uint4(v, v, v, v);
#else
    for (int q = 0; q < 4; ++q) dst[q] = v;
#endif
}

// Offset of element i of a row-major array of `shape`, read through `stride` (one entry per axis).
// I is uint32_t when every offset fits in 32 bits (faster division), int64_t otherwise.
template <typename I>
CAPSULE_HD I capsule_view_offset(const int64_t* shape, const int64_t* stride, int rank, I i) {
    if (rank <= 0) return 0;
    I off = 0;
    for (int k = rank - 1; k > 0; --k) {
        const I s = static_cast<I>(shape[k]);
        const I q = i / s;
        off += (i - q * s) * static_cast<I>(stride[k]);
        i = q;
    }
    return off + i * static_cast<I>(stride[0]);
}

// The output axis that reads x contiguously (stride 1, more than one element) other than the last
// one, or -1: the axis a tile reads along when a permutation moves x's innermost axis.
CAPSULE_HD int capsule_tile_axis(const int64_t* shape, const int64_t* stride, int rank) {
    for (int k = 0; k < rank - 1; ++k)
        if (stride[k] == 1 && shape[k] > 1) return k;
    return -1;
}

CAPSULE_HD int capsule_view_path(const int64_t* shape, const int64_t* stride, int rank, bool x16, bool y16, bool tiles) {
    if (rank <= 0) return CAPSULE_PATH_SCALAR;
    const int64_t len = shape[rank - 1], s = stride[rank - 1];
    if (tiles && s != 1 && capsule_tile_axis(shape, stride, rank) >= 0) return CAPSULE_PATH_TILE;
    if (!y16 || len % 4 != 0) return CAPSULE_PATH_SCALAR;
    if (s == 0) return CAPSULE_PATH_FILL4;
    if (s != 1 || !x16) return CAPSULE_PATH_SCALAR;
    for (int k = 0; k < rank - 1; ++k)
        if (shape[k] > 1 && stride[k] % 4 != 0) return CAPSULE_PATH_SCALAR;
    return CAPSULE_PATH_COPY4;
}

// Work items of the element paths: 4-element vectors or single elements.
CAPSULE_HD int64_t capsule_view_items(int path, int64_t n) {
    return (path == CAPSULE_PATH_COPY4 || path == CAPSULE_PATH_FILL4) ? n / 4 : n;
}

// One work item of an element path: y[i..] from x at the geometry's offset.
template <int kPath, typename I>
CAPSULE_HD void capsule_view_item(const int64_t* shape, const int64_t* stride, int rank,
                                  const uint32_t* x, uint32_t* y, I item) {
    if (kPath == CAPSULE_PATH_SCALAR) {
        y[item] = x[capsule_view_offset<I>(shape, stride, rank, item)];
    } else {
        const I i = item * 4;
        const I off = capsule_view_offset<I>(shape, stride, rank, i);
        if (kPath == CAPSULE_PATH_COPY4) capsule_move4(x + off, y + i);
        else capsule_fill4(x[off], y + i);
    }
}

// -- permute tiles: y's last axis (extent B, x stride sB) against the tile axis j (extent A, x stride 1)

struct CapsuleTile {
    int j;                // the output axis read contiguously from x
    int la, lb;           // log2 of the tile's extents TA (along j) and TB (along the last axis); la + lb = 10
    int64_t a, b;         // extents of axis j and of the last axis
    int64_t sb;           // x stride of the last output axis
    int64_t oj;           // y stride of axis j
    int64_t tiles_a, tiles_b, tiles;  // tiles along j, along the last axis, and in all (times the batch)
};

// TB is the last axis's extent rounded up to a power of two, at most 32; TA = 1024 / TB ≥ 32, so
// reads (along j) and writes (along the last axis) both cover whole 128-byte lines when the axes allow.
CAPSULE_HD CapsuleTile capsule_tile_layout(const int64_t* shape, const int64_t* stride, int rank, int j) {
    CapsuleTile t;
    t.j = j;
    t.a = shape[j];
    t.b = shape[rank - 1];
    t.sb = stride[rank - 1];
    t.lb = 0;
    while (t.lb < 5 && (int64_t(1) << t.lb) < t.b) ++t.lb;
    t.la = 10 - t.lb;
    t.oj = 1;
    int64_t batch = 1;
    for (int k = rank - 1; k >= 0; --k) {
        if (k > j) t.oj *= shape[k];
        if (k != j && k != rank - 1) batch *= shape[k];
    }
    t.tiles_a = (t.a + (int64_t(1) << t.la) - 1) >> t.la;
    t.tiles_b = (t.b + (int64_t(1) << t.lb) - 1) >> t.lb;
    t.tiles = batch * t.tiles_a * t.tiles_b;
    return t;
}

// Where tile `tile` starts: its batch entry's offsets in x and y, and its first a and b.
CAPSULE_HD void capsule_tile_origin(const int64_t* shape, const int64_t* stride, int rank, const CapsuleTile& t,
                                    int64_t tile, int64_t* x_base, int64_t* y_base, int64_t* a0, int64_t* b0) {
    *b0 = (tile % t.tiles_b) << t.lb;
    tile /= t.tiles_b;
    *a0 = (tile % t.tiles_a) << t.la;
    int64_t batch = tile / t.tiles_a, xo = 0, yo = 0, ystride = 1;
    for (int k = rank - 1; k >= 0; --k) {
        if (k != t.j && k != rank - 1) {
            const int64_t c = batch % shape[k];
            batch /= shape[k];
            xo += c * stride[k];
            yo += c * ystride;
        }
        ystride *= shape[k];
    }
    *x_base = xo;
    *y_base = yo;
}

// Element e (0 ≤ e < 1024) of the load phase: consecutive e walk along j, contiguous in x. False when
// the element lies outside the array (a partial tile). Rows of the shared tile hold TB + 1 words, an odd
// stride, so a warp's 32 consecutive a land in 32 different banks.
CAPSULE_HD bool capsule_tile_load(const CapsuleTile& t, int64_t a0, int64_t b0, int e, int64_t* x_rel, int* slot) {
    const int al = e & ((1 << t.la) - 1), bl = e >> t.la;
    const int64_t a = a0 + al, b = b0 + bl;
    *x_rel = a + b * t.sb;
    *slot = al * ((1 << t.lb) + 1) + bl;
    return a < t.a && b < t.b;
}

// Element e of the store phase: consecutive e walk along the last axis, contiguous in y.
CAPSULE_HD bool capsule_tile_store(const CapsuleTile& t, int64_t a0, int64_t b0, int e, int64_t* y_rel, int* slot) {
    const int bl = e & ((1 << t.lb) - 1), al = e >> t.lb;
    const int64_t a = a0 + al, b = b0 + bl;
    *y_rel = a * t.oj + b;
    *slot = al * ((1 << t.lb) + 1) + bl;
    return a < t.a && b < t.b;
}

// -- broadcast backward: dx[j] = Σ over the copies c of g[base(j) + copy(c)] -------------------------

// Split the geometry's axes into kept ones (x stride ≠ 0: they index dx) and summed ones (stride 0:
// they index the copies), each with its stride in g. Returns whether g's innermost axis is summed
// ("row" mode: a warp sums each dx element) rather than kept ("column" mode: consecutive threads
// take consecutive dx elements, coalesced in g).
CAPSULE_HD bool capsule_broadcast_split(const int64_t* geometry, int rank, int64_t* kshape, int64_t* kstride, int* nk,
                                        int64_t* sshape, int64_t* sstride, int* ns) {
    int mk = 0, ms = 0;
    int64_t gstride = 1;
    for (int k = rank - 1; k >= 0; --k) {  // collected innermost first, then reversed
        if (geometry[rank + k] != 0) { kshape[mk] = geometry[k]; kstride[mk++] = gstride; }
        else { sshape[ms] = geometry[k]; sstride[ms++] = gstride; }
        gstride *= geometry[k];
    }
    for (int lo = 0, hi = mk - 1; lo < hi; ++lo, --hi) {
        int64_t s = kshape[lo]; kshape[lo] = kshape[hi]; kshape[hi] = s;
        s = kstride[lo]; kstride[lo] = kstride[hi]; kstride[hi] = s;
    }
    for (int lo = 0, hi = ms - 1; lo < hi; ++lo, --hi) {
        int64_t s = sshape[lo]; sshape[lo] = sshape[hi]; sshape[hi] = s;
        s = sstride[lo]; sstride[lo] = sstride[hi]; sstride[hi] = s;
    }
    *nk = mk;
    *ns = ms;
    return rank > 0 && geometry[2 * rank - 1] == 0;
}

// One thread's share of dx[j]: the copies c = first, first + step, ... summed in that order from +0.
template <typename I>
CAPSULE_HD float capsule_broadcast_partial(const float* g, const int64_t* kshape, const int64_t* kstride, int nk,
                                           const int64_t* sshape, const int64_t* sstride, int ns, I j, int64_t first,
                                           int64_t step, int64_t copies) {
    const I base = capsule_view_offset<I>(kshape, kstride, nk, j);
    float acc = 0.0f;
    for (int64_t c = first; c < copies; c += step)
        acc = capsule::add_rn(acc, g[base + capsule_view_offset<I>(sshape, sstride, ns, static_cast<I>(c))]);
    return acc;
}

// -- concat and slice: copies of `rows` rows of `len` elements between strided places -------------

struct CapsuleRows {
    int64_t rows, len;        // rows and elements per row
    int64_t src0, src_step;   // offset of row 0 in the source, distance between rows
    int64_t dst0, dst_step;   // the same in the destination
};

// concat forward: input x (outer, size_in, inner) into y (outer, size_out, inner) at offset along the axis.
CAPSULE_HD CapsuleRows capsule_concat_fwd_rows(int64_t outer, int64_t size_in, int64_t inner, int64_t size_out, int64_t offset) {
    return CapsuleRows{outer, size_in * inner, 0, size_in * inner, offset * inner, size_out * inner};
}

// concat backward: dx (outer, size_in, inner) from g's slice at offset.
CAPSULE_HD CapsuleRows capsule_concat_bwd_rows(int64_t outer, int64_t size_in, int64_t inner, int64_t size_out, int64_t offset) {
    return CapsuleRows{outer, size_in * inner, offset * inner, size_out * inner, 0, size_in * inner};
}

// slice forward: y (outer, length, inner) from x (outer, size, inner) at start.
CAPSULE_HD CapsuleRows capsule_slice_fwd_rows(int64_t outer, int64_t size, int64_t inner, int64_t start, int64_t length) {
    return CapsuleRows{outer, length * inner, start * inner, size * inner, 0, length * inner};
}

// Whether every row start and step is a multiple of 4 elements on 16-byte aligned buffers.
CAPSULE_HD bool capsule_rows_vec4(const CapsuleRows& r, bool src16, bool dst16) {
    return src16 && dst16 && r.len % 4 == 0 && r.src0 % 4 == 0 && r.src_step % 4 == 0 && r.dst0 % 4 == 0 &&
           r.dst_step % 4 == 0;
}

// The same rows counted in 4-element vectors.
CAPSULE_HD CapsuleRows capsule_rows_by4(const CapsuleRows& r) {
    return CapsuleRows{r.rows, r.len / 4, r.src0 / 4, r.src_step / 4, r.dst0 / 4, r.dst_step / 4};
}

// Source and destination offsets of element e (0 ≤ e < rows·len).
template <typename I>
CAPSULE_HD void capsule_rows_offsets(const CapsuleRows& r, I e, I* src, I* dst) {
    const I len = static_cast<I>(r.len);
    const I row = e / len, col = e - row * len;
    *src = static_cast<I>(r.src0) + row * static_cast<I>(r.src_step) + col;
    *dst = static_cast<I>(r.dst0) + row * static_cast<I>(r.dst_step) + col;
}

// Whether every offset of both sides fits in 32 bits.
CAPSULE_HD bool capsule_rows_fit32(const CapsuleRows& r) {
    const int64_t limit = int64_t(1) << 32;
    return r.src0 + r.rows * r.src_step + r.len < limit && r.dst0 + r.rows * r.dst_step + r.len < limit;
}

// slice backward: dx (outer, size, inner) gets g (outer, length, inner) at start and zeros elsewhere.
struct CapsuleSliceFill {
    int64_t row;        // size · inner: dx elements per outer index
    int64_t lo, hi;     // [start · inner, (start + length) · inner): the part of a row that comes from g
    int64_t g_row;      // length · inner
};

CAPSULE_HD CapsuleSliceFill capsule_slice_fill(int64_t size, int64_t inner, int64_t start, int64_t length) {
    return CapsuleSliceFill{size * inner, start * inner, (start + length) * inner, length * inner};
}

CAPSULE_HD bool capsule_slice_fill_vec4(const CapsuleSliceFill& f, bool g16, bool dx16) {
    return g16 && dx16 && f.row % 4 == 0 && f.lo % 4 == 0 && f.hi % 4 == 0;
}

CAPSULE_HD CapsuleSliceFill capsule_slice_fill_by4(const CapsuleSliceFill& f) {
    return CapsuleSliceFill{f.row / 4, f.lo / 4, f.hi / 4, f.g_row / 4};
}

// dx element e: its offset in g, or -1 where it is outside the slice (written as +0).
template <typename I>
CAPSULE_HD int64_t capsule_slice_fill_source(const CapsuleSliceFill& f, I e) {
    const I row = e / static_cast<I>(f.row), col = e - row * static_cast<I>(f.row);
    if (static_cast<int64_t>(col) < f.lo || static_cast<int64_t>(col) >= f.hi) return -1;
    return static_cast<int64_t>(row) * f.g_row + static_cast<int64_t>(col) - f.lo;
}
