// Host build of cuda/view.cuh's index arithmetic and of the choices the kernels of cuda/view.cu make
// from their arguments (path, broadcast backward mode, 16-byte row moves), callable from ctypes.

#include "view.cuh"

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

// capsule_broadcast_bwd's mode for a geometry: 1 for row mode (g's innermost axis summed), 0 for column mode.
extern "C" int host_broadcast_row_mode(const int64_t* geometry, int rank) {
    if (rank < 0 || rank > CAPSULE_VIEW_MAX_RANK) return -1;
    int64_t kshape[CAPSULE_VIEW_MAX_RANK], kstride[CAPSULE_VIEW_MAX_RANK];
    int64_t sshape[CAPSULE_VIEW_MAX_RANK], sstride[CAPSULE_VIEW_MAX_RANK];
    int nk, ns;
    return capsule_broadcast_split(geometry, rank, kshape, kstride, &nk, sshape, sstride, &ns) ? 1 : 0;
}

namespace {

CapsuleRows rows_of(int which, int64_t a, int64_t b, int64_t c, int64_t d, int64_t e) {
    return which == 0 ? capsule_concat_fwd_rows(a, b, c, d, e)
         : which == 1 ? capsule_concat_bwd_rows(a, b, c, d, e)
                      : capsule_slice_fwd_rows(a, b, c, d, e);
}

}  // namespace

// The row plan of a concat (which 0: forward, 1: backward) or slice forward (2) launch:
// [rows, len, src0, src_step, dst0, dst_step].
extern "C" void host_rows(int which, int64_t a, int64_t b, int64_t c, int64_t d, int64_t e, int64_t* out) {
    const CapsuleRows r = rows_of(which, a, b, c, d, e);
    out[0] = r.rows; out[1] = r.len; out[2] = r.src0; out[3] = r.src_step; out[4] = r.dst0; out[5] = r.dst_step;
}

// Whether that launch moves its rows in 16-byte vectors (source and destination alignment given).
extern "C" int host_rows_vec4(int which, int64_t a, int64_t b, int64_t c, int64_t d, int64_t e, int src16, int dst16) {
    return capsule_rows_vec4(rows_of(which, a, b, c, d, e), src16 != 0, dst16 != 0) ? 1 : 0;
}

// Whether capsule_slice_bwd (its arguments after the buffers) fills dx in 16-byte vectors.
extern "C" int host_slice_fill_vec4(int64_t size, int64_t inner, int64_t start, int64_t length, int g16, int dx16) {
    return capsule_slice_fill_vec4(capsule_slice_fill(size, inner, start, length), g16 != 0, dx16 != 0) ? 1 : 0;
}
