// Shape and layout kernels: permute, broadcast, concat, slice (reshape launches nothing: its output
// aliases its input). Values move as 32-bit words, never through float arithmetic, except the sum of
// broadcast's backward. Every kernel is correct for any 1-D grid and block; the plans size them.
#include "view.cuh"

namespace {

using capsule::thread_count;
using capsule::thread_index;

// The geometry into shared memory (shape, then strides); every thread of the block calls it.
__device__ __forceinline__ void load_geometry(const int64_t* __restrict__ geometry, int rank, int64_t* shape,
                                              int64_t* stride) {
    for (int k = threadIdx.x; k < rank; k += blockDim.x) {
        shape[k] = geometry[k];
        stride[k] = geometry[rank + k];
    }
    __syncthreads();
}

template <int kPath, typename I>
__device__ __forceinline__ void view_items(const int64_t* shape, const int64_t* stride, int rank,
                                           const uint32_t* __restrict__ x, uint32_t* __restrict__ y, int64_t items) {
    for (int64_t item = thread_index(); item < items; item += thread_count())
        capsule_view_item<kPath, I>(shape, stride, rank, x, y, static_cast<I>(item));
}

template <int kPath>
__device__ __forceinline__ void view_path(const int64_t* shape, const int64_t* stride, int rank,
                                          const uint32_t* __restrict__ x, uint32_t* __restrict__ y, int64_t n) {
    const int64_t items = capsule_view_items(kPath, n);
    if (n <= int64_t(0xffffffff)) view_items<kPath, uint32_t>(shape, stride, rank, x, y, items);
    else view_items<kPath, int64_t>(shape, stride, rank, x, y, items);
}

// Permutations that move x's innermost axis: each block-iteration moves one tile through shared memory,
// read along the tile axis (contiguous in x) and written along y's last axis (contiguous in y).
__device__ void view_tiles(const int64_t* shape, const int64_t* stride, int rank, const uint32_t* __restrict__ x,
                           uint32_t* __restrict__ y) {
    __shared__ uint32_t tile[CAPSULE_TILE_SLOTS];
    const CapsuleTile t = capsule_tile_layout(shape, stride, rank, capsule_tile_axis(shape, stride, rank));
    for (int64_t id = blockIdx.x; id < t.tiles; id += gridDim.x) {
        int64_t x_base, y_base, a0, b0, rel;
        int slot;
        capsule_tile_origin(shape, stride, rank, t, id, &x_base, &y_base, &a0, &b0);
        for (int e = threadIdx.x; e < CAPSULE_TILE_ELEMS; e += blockDim.x)
            if (capsule_tile_load(t, a0, b0, e, &rel, &slot)) tile[slot] = x[x_base + rel];
        __syncthreads();
        for (int e = threadIdx.x; e < CAPSULE_TILE_ELEMS; e += blockDim.x)
            if (capsule_tile_store(t, a0, b0, e, &rel, &slot)) y[y_base + rel] = tile[slot];
        __syncthreads();
    }
}

// y[i] = x[offset(i)] through the geometry: permute (tiles allowed) and broadcast.
template <bool kTiles>
__device__ __forceinline__ void view_gather(const float* x_, float* y_, const int64_t* __restrict__ geometry,
                                            int32_t rank, int64_t n) {
    __shared__ int64_t shape[CAPSULE_VIEW_MAX_RANK], stride[CAPSULE_VIEW_MAX_RANK];
    if (rank < 0 || rank > CAPSULE_VIEW_MAX_RANK) return;
    load_geometry(geometry, rank, shape, stride);
    const uint32_t* __restrict__ x = reinterpret_cast<const uint32_t*>(x_);
    uint32_t* __restrict__ y = reinterpret_cast<uint32_t*>(y_);
    const int path = capsule_view_path(shape, stride, rank, capsule_aligned16(x), capsule_aligned16(y), kTiles);
    if (kTiles && path == CAPSULE_PATH_TILE) view_tiles(shape, stride, rank, x, y);
    else if (path == CAPSULE_PATH_COPY4) view_path<CAPSULE_PATH_COPY4>(shape, stride, rank, x, y, n);
    else if (path == CAPSULE_PATH_FILL4) view_path<CAPSULE_PATH_FILL4>(shape, stride, rank, x, y, n);
    else view_path<CAPSULE_PATH_SCALAR>(shape, stride, rank, x, y, n);
}

// Broadcast backward, g's innermost axis kept: blocks take 32 consecutive dx elements (one per lane),
// the block's warps split the copies (warp w sums copies w, w + W, ...), then warp 0 adds the W
// partial sums in order. Fixed order for a given block size, no atomics.
template <typename I>
__device__ void broadcast_columns(const float* __restrict__ g, float* __restrict__ dx, const int64_t* kshape,
                                  const int64_t* kstride, int nk, const int64_t* sshape, const int64_t* sstride, int ns,
                                  int64_t n_x, int64_t copies) {
    __shared__ float partial[1024];
    const int lanes = blockDim.x < 32 ? static_cast<int>(blockDim.x) : 32;
    const int warps = static_cast<int>(blockDim.x) / lanes;
    const int lane = static_cast<int>(threadIdx.x) % lanes, w = static_cast<int>(threadIdx.x) / lanes;
    const int64_t step = static_cast<int64_t>(gridDim.x) * lanes;
    for (int64_t first = static_cast<int64_t>(blockIdx.x) * lanes; first < n_x; first += step) {
        const int64_t j = first + lane;
        if (w < warps)
            partial[w * lanes + lane] = j < n_x ? capsule_broadcast_partial<I>(g, kshape, kstride, nk, sshape, sstride, ns,
                                                                             static_cast<I>(j), w, warps, copies)
                                                : 0.0f;
        __syncthreads();
        if (w == 0 && j < n_x) {
            float sum = partial[lane];
            for (int q = 1; q < warps; ++q) sum = capsule::add_rn(sum, partial[q * lanes + lane]);
            dx[j] = sum;
        }
        __syncthreads();
    }
}

// Broadcast backward, g's innermost axis summed: a warp per dx element, lanes over the copies (coalesced),
// a fixed xor-shuffle tree. Blocks that are not whole warps fall back to a thread per element.
template <typename I>
__device__ void broadcast_rows(const float* __restrict__ g, float* __restrict__ dx, const int64_t* kshape,
                               const int64_t* kstride, int nk, const int64_t* sshape, const int64_t* sstride, int ns,
                               int64_t n_x, int64_t copies) {
    const int group = blockDim.x % 32 == 0 ? 32 : 1;
    const int lane = static_cast<int>(threadIdx.x) % group;
    for (int64_t j = thread_index() / group; j < n_x; j += thread_count() / group) {
        float acc = capsule_broadcast_partial<I>(g, kshape, kstride, nk, sshape, sstride, ns, static_cast<I>(j), lane, group,
                                                 copies);
        if (group == 32) acc = capsule::group_sum_rn<32>(acc);
        if (lane == 0) dx[j] = acc;
    }
}

template <typename I>
__device__ __forceinline__ void copy_rows(const uint32_t* __restrict__ src, uint32_t* __restrict__ dst, const CapsuleRows& r) {
    const int64_t n = r.rows * r.len;
    for (int64_t e = thread_index(); e < n; e += thread_count()) {
        I s, d;
        capsule_rows_offsets<I>(r, static_cast<I>(e), &s, &d);
        dst[d] = src[s];
    }
}

template <typename I>
__device__ __forceinline__ void copy_rows4(const uint32_t* __restrict__ src, uint32_t* __restrict__ dst, const CapsuleRows& r4) {
    const int64_t n = r4.rows * r4.len;
    for (int64_t e = thread_index(); e < n; e += thread_count()) {
        I s, d;
        capsule_rows_offsets<I>(r4, static_cast<I>(e), &s, &d);
        capsule_move4(src + 4 * static_cast<int64_t>(s), dst + 4 * static_cast<int64_t>(d));
    }
}

// Strided row copy (concat and slice): 16-byte moves when every row start allows, 32-bit offsets when they fit.
__device__ __forceinline__ void rows_kernel(const float* src_, float* dst_, const CapsuleRows& r) {
    const uint32_t* __restrict__ src = reinterpret_cast<const uint32_t*>(src_);
    uint32_t* __restrict__ dst = reinterpret_cast<uint32_t*>(dst_);
    const bool fit = capsule_rows_fit32(r);
    if (capsule_rows_vec4(r, capsule_aligned16(src), capsule_aligned16(dst))) {
        const CapsuleRows r4 = capsule_rows_by4(r);
        if (fit) copy_rows4<uint32_t>(src, dst, r4);
        else copy_rows4<int64_t>(src, dst, r4);
    } else if (fit) {
        copy_rows<uint32_t>(src, dst, r);
    } else {
        copy_rows<int64_t>(src, dst, r);
    }
}

template <typename I>
__device__ __forceinline__ void slice_fill(const uint32_t* __restrict__ g, uint32_t* __restrict__ dx, const CapsuleSliceFill& f,
                                           int64_t n) {
    for (int64_t e = thread_index(); e < n; e += thread_count()) {
        const int64_t s = capsule_slice_fill_source<I>(f, static_cast<I>(e));
        dx[e] = s < 0 ? 0u : g[s];
    }
}

template <typename I>
__device__ __forceinline__ void slice_fill4(const uint32_t* __restrict__ g, uint32_t* __restrict__ dx, const CapsuleSliceFill& f4,
                                            int64_t n4) {
    for (int64_t e = thread_index(); e < n4; e += thread_count()) {
        const int64_t s = capsule_slice_fill_source<I>(f4, static_cast<I>(e));
        if (s < 0) capsule_fill4(0u, dx + 4 * e);
        else capsule_move4(g + 4 * s, dx + 4 * e);
    }
}

}  // namespace

extern "C" __global__ void
capsule_permute_fwd(const float* __restrict__ x, float* __restrict__ y, const int64_t* __restrict__ geometry,
                    int32_t rank, int64_t n) {
    view_gather<true>(x, y, geometry, rank, n);
}

extern "C" __global__ void
capsule_permute_bwd(const float* __restrict__ g, float* __restrict__ dx, const int64_t* __restrict__ geometry,
                    int32_t rank, int64_t n) {
    view_gather<true>(g, dx, geometry, rank, n);
}

extern "C" __global__ void
capsule_broadcast_fwd(const float* __restrict__ x, float* __restrict__ y, const int64_t* __restrict__ geometry,
                      int32_t rank, int64_t n) {
    view_gather<false>(x, y, geometry, rank, n);
}

extern "C" __global__ void __launch_bounds__(512, 1)
capsule_broadcast_bwd(const float* __restrict__ g, float* __restrict__ dx, const int64_t* __restrict__ geometry,
                      int32_t rank, int64_t n_x, int64_t copies) {
    __shared__ int64_t kshape[CAPSULE_VIEW_MAX_RANK], kstride[CAPSULE_VIEW_MAX_RANK];
    __shared__ int64_t sshape[CAPSULE_VIEW_MAX_RANK], sstride[CAPSULE_VIEW_MAX_RANK];
    __shared__ int counts[3];
    if (rank < 0 || rank > CAPSULE_VIEW_MAX_RANK) return;
    if (threadIdx.x == 0)
        counts[2] = capsule_broadcast_split(geometry, rank, kshape, kstride, &counts[0], sshape, sstride, &counts[1]);
    __syncthreads();
    const int nk = counts[0], ns = counts[1];
    const bool fit = n_x <= int64_t(0xffffffff) && (copies == 0 || n_x <= int64_t(0xffffffff) / copies);
    if (counts[2]) {
        if (fit) broadcast_rows<uint32_t>(g, dx, kshape, kstride, nk, sshape, sstride, ns, n_x, copies);
        else broadcast_rows<int64_t>(g, dx, kshape, kstride, nk, sshape, sstride, ns, n_x, copies);
    } else {
        if (fit) broadcast_columns<uint32_t>(g, dx, kshape, kstride, nk, sshape, sstride, ns, n_x, copies);
        else broadcast_columns<int64_t>(g, dx, kshape, kstride, nk, sshape, sstride, ns, n_x, copies);
    }
}

extern "C" __global__ void
capsule_concat_fwd(const float* __restrict__ x, float* __restrict__ y, int64_t outer, int64_t size_in, int64_t inner,
                   int64_t size_out, int64_t offset) {
    rows_kernel(x, y, capsule_concat_fwd_rows(outer, size_in, inner, size_out, offset));
}

extern "C" __global__ void
capsule_concat_bwd(const float* __restrict__ g, float* __restrict__ dx, int64_t outer, int64_t size_in, int64_t inner,
                   int64_t size_out, int64_t offset) {
    rows_kernel(g, dx, capsule_concat_bwd_rows(outer, size_in, inner, size_out, offset));
}

extern "C" __global__ void
capsule_slice_fwd(const float* __restrict__ x, float* __restrict__ y, int64_t outer, int64_t size, int64_t inner,
                  int64_t start, int64_t length) {
    rows_kernel(x, y, capsule_slice_fwd_rows(outer, size, inner, start, length));
}

extern "C" __global__ void
capsule_slice_bwd(const float* __restrict__ g, float* __restrict__ dx, int64_t outer, int64_t size, int64_t inner,
                  int64_t start, int64_t length) {
    const uint32_t* __restrict__ gw = reinterpret_cast<const uint32_t*>(g);
    uint32_t* __restrict__ dxw = reinterpret_cast<uint32_t*>(dx);
    const CapsuleSliceFill f = capsule_slice_fill(size, inner, start, length);
    const int64_t n = outer * f.row;
    const bool fit = n <= int64_t(0xffffffff);
    if (capsule_slice_fill_vec4(f, capsule_aligned16(gw), capsule_aligned16(dxw))) {
        if (fit) slice_fill4<uint32_t>(gw, dxw, capsule_slice_fill_by4(f), n / 4);
        else slice_fill4<int64_t>(gw, dxw, capsule_slice_fill_by4(f), n / 4);
    } else if (fit) {
        slice_fill<uint32_t>(gw, dxw, f, n);
    } else {
        slice_fill<int64_t>(gw, dxw, f, n);
    }
}
