// The pointwise family: one memory-bound map per entry point, the per-element math in pointwise.cuh.
// Each thread moves 16-byte float4 vectors in a grid-stride loop, then a scalar tail of n % 4
// elements; when any buffer is not 16-byte aligned the whole launch takes the scalar path.
#include <cstdint>

#include "common.cuh"
#include "pointwise.cuh"

namespace {

using capsule::aligned16;
using capsule::load4;
using capsule::store4;
using capsule::thread_count;
using capsule::thread_index;

// out = f(a)
template <class F>
__device__ __forceinline__ void map_1_1(const float* __restrict__ a, float* __restrict__ out, int64_t n, F f) {
    const int64_t first = thread_index(), step = thread_count();
    int64_t tail = 0;
    if (aligned16(a) && aligned16(out)) {
        const int64_t vectors = n / 4;
        for (int64_t v = first; v < vectors; v += step) {
            const float4 x = load4(a, v);
            store4(out, v, make_float4(f(x.x), f(x.y), f(x.z), f(x.w)));
        }
        tail = vectors * 4;
    }
    for (int64_t i = tail + first; i < n; i += step) out[i] = f(a[i]);
}

// out = f(a, b)
template <class F>
__device__ __forceinline__ void map_2_1(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out,
                                        int64_t n, F f) {
    const int64_t first = thread_index(), step = thread_count();
    int64_t tail = 0;
    if (aligned16(a) && aligned16(b) && aligned16(out)) {
        const int64_t vectors = n / 4;
        for (int64_t v = first; v < vectors; v += step) {
            const float4 x = load4(a, v), y = load4(b, v);
            store4(out, v, make_float4(f(x.x, y.x), f(x.y, y.y), f(x.z, y.z), f(x.w, y.w)));
        }
        tail = vectors * 4;
    }
    for (int64_t i = tail + first; i < n; i += step) out[i] = f(a[i], b[i]);
}

// (out1, out2) = f(a, b, c)
template <class F>
__device__ __forceinline__ void map_3_2(const float* __restrict__ a, const float* __restrict__ b, const float* __restrict__ c,
                                        float* __restrict__ out1, float* __restrict__ out2, int64_t n, F f) {
    const int64_t first = thread_index(), step = thread_count();
    int64_t tail = 0;
    if (aligned16(a) && aligned16(b) && aligned16(c) && aligned16(out1) && aligned16(out2)) {
        const int64_t vectors = n / 4;
        for (int64_t v = first; v < vectors; v += step) {
            const float4 x = load4(a, v), y = load4(b, v), z = load4(c, v);
            float4 r1, r2;
            f(x.x, y.x, z.x, r1.x, r2.x);
            f(x.y, y.y, z.y, r1.y, r2.y);
            f(x.z, y.z, z.z, r1.z, r2.z);
            f(x.w, y.w, z.w, r1.w, r2.w);
            store4(out1, v, r1);
            store4(out2, v, r2);
        }
        tail = vectors * 4;
    }
    for (int64_t i = tail + first; i < n; i += step) f(a[i], b[i], c[i], out1[i], out2[i]);
}

}  // namespace

// -- relu, gelu ---------------------------------------------------------------------------------

extern "C" __global__ void capsule_relu_fwd(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    map_1_1(x, y, n, [](float v) { return capsule_relu_f(v); });
}

extern "C" __global__ void capsule_relu_bwd(const float* __restrict__ x, const float* __restrict__ g, float* __restrict__ dx, int64_t n) {
    map_2_1(x, g, dx, n, [](float v, float w) { return capsule_relu_df(v, w); });
}

extern "C" __global__ void capsule_gelu_fwd(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    map_1_1(x, y, n, [](float v) { return capsule_gelu_f(v); });
}

extern "C" __global__ void capsule_gelu_bwd(const float* __restrict__ x, const float* __restrict__ g, float* __restrict__ dx, int64_t n) {
    map_2_1(x, g, dx, n, [](float v, float w) { return capsule_gelu_df(v, w); });
}

// -- add, sub, mul --------------------------------------------------------------------------------

extern "C" __global__ void capsule_add_fwd(const float* __restrict__ x, const float* __restrict__ y, float* __restrict__ out, int64_t n) {
    map_2_1(x, y, out, n, [](float a, float b) { return capsule_add_f(a, b); });
}

extern "C" __global__ void capsule_add_bwd(const float* __restrict__ x, const float* __restrict__ y, const float* __restrict__ g,
                                           float* __restrict__ dx, float* __restrict__ dy, int64_t n) {
    map_3_2(x, y, g, dx, dy, n, [](float a, float b, float w, float& da, float& db) { capsule_add_df(a, b, w, da, db); });
}

extern "C" __global__ void capsule_sub_fwd(const float* __restrict__ x, const float* __restrict__ y, float* __restrict__ out, int64_t n) {
    map_2_1(x, y, out, n, [](float a, float b) { return capsule_sub_f(a, b); });
}

extern "C" __global__ void capsule_sub_bwd(const float* __restrict__ x, const float* __restrict__ y, const float* __restrict__ g,
                                           float* __restrict__ dx, float* __restrict__ dy, int64_t n) {
    map_3_2(x, y, g, dx, dy, n, [](float a, float b, float w, float& da, float& db) { capsule_sub_df(a, b, w, da, db); });
}

extern "C" __global__ void capsule_mul_fwd(const float* __restrict__ x, const float* __restrict__ y, float* __restrict__ out, int64_t n) {
    map_2_1(x, y, out, n, [](float a, float b) { return capsule_mul_f(a, b); });
}

extern "C" __global__ void capsule_mul_bwd(const float* __restrict__ x, const float* __restrict__ y, const float* __restrict__ g,
                                           float* __restrict__ dx, float* __restrict__ dy, int64_t n) {
    map_3_2(x, y, g, dx, dy, n, [](float a, float b, float w, float& da, float& db) { capsule_mul_df(a, b, w, da, db); });
}

// -- scale: c·x -----------------------------------------------------------------------------------

extern "C" __global__ void capsule_scale_fwd(const float* __restrict__ x, float* __restrict__ y, float c, int64_t n) {
    map_1_1(x, y, n, [c](float v) { return capsule_scale_f(v, c); });
}

extern "C" __global__ void capsule_scale_bwd(const float* __restrict__ g, float* __restrict__ dx, float c, int64_t n) {
    map_1_1(g, dx, n, [c](float w) { return capsule_scale_df(w, c); });
}

// -- abs, sqrt, clamp -------------------------------------------------------------------------------

extern "C" __global__ void capsule_abs_fwd(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    map_1_1(x, y, n, [](float v) { return capsule_abs_f(v); });
}

extern "C" __global__ void capsule_abs_bwd(const float* __restrict__ x, const float* __restrict__ g, float* __restrict__ dx, int64_t n) {
    map_2_1(x, g, dx, n, [](float v, float w) { return capsule_abs_df(v, w); });
}

extern "C" __global__ void capsule_sqrt_fwd(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    map_1_1(x, y, n, [](float v) { return capsule_sqrt_f(v); });
}

extern "C" __global__ void capsule_sqrt_bwd(const float* __restrict__ x, const float* __restrict__ g, float* __restrict__ dx, int64_t n) {
    map_2_1(x, g, dx, n, [](float v, float w) { return capsule_sqrt_df(v, w); });
}

extern "C" __global__ void capsule_clamp_fwd(const float* __restrict__ x, float* __restrict__ y, float lo, float hi, int64_t n) {
    map_1_1(x, y, n, [lo, hi](float v) { return capsule_clamp_f(v, lo, hi); });
}

extern "C" __global__ void capsule_clamp_bwd(const float* __restrict__ x, const float* __restrict__ g, float* __restrict__ dx, float lo,
                                             float hi, int64_t n) {
    map_2_1(x, g, dx, n, [lo, hi](float v, float w) { return capsule_clamp_df(v, w, lo, hi); });
}

// -- max, min -----------------------------------------------------------------------------------------

extern "C" __global__ void capsule_max_fwd(const float* __restrict__ x, const float* __restrict__ y, float* __restrict__ out, int64_t n) {
    map_2_1(x, y, out, n, [](float a, float b) { return capsule_max_f(a, b); });
}

extern "C" __global__ void capsule_max_bwd(const float* __restrict__ x, const float* __restrict__ y, const float* __restrict__ g,
                                           float* __restrict__ dx, float* __restrict__ dy, int64_t n) {
    map_3_2(x, y, g, dx, dy, n, [](float a, float b, float w, float& da, float& db) { capsule_max_df(a, b, w, da, db); });
}

extern "C" __global__ void capsule_min_fwd(const float* __restrict__ x, const float* __restrict__ y, float* __restrict__ out, int64_t n) {
    map_2_1(x, y, out, n, [](float a, float b) { return capsule_min_f(a, b); });
}

extern "C" __global__ void capsule_min_bwd(const float* __restrict__ x, const float* __restrict__ y, const float* __restrict__ g,
                                           float* __restrict__ dx, float* __restrict__ dy, int64_t n) {
    map_3_2(x, y, g, dx, dy, n, [](float a, float b, float w, float& da, float& db) { capsule_min_df(a, b, w, da, db); });
}

// -- sigmoid, tanh, softplus --------------------------------------------------------------------------

extern "C" __global__ void capsule_sigmoid_fwd(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    map_1_1(x, y, n, [](float v) { return capsule_sigmoid_f(v); });
}

extern "C" __global__ void capsule_sigmoid_bwd(const float* __restrict__ x, const float* __restrict__ g, float* __restrict__ dx, int64_t n) {
    map_2_1(x, g, dx, n, [](float v, float w) { return capsule_sigmoid_df(v, w); });
}

extern "C" __global__ void capsule_tanh_fwd(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    map_1_1(x, y, n, [](float v) { return capsule_tanh_f(v); });
}

extern "C" __global__ void capsule_tanh_bwd(const float* __restrict__ x, const float* __restrict__ g, float* __restrict__ dx, int64_t n) {
    map_2_1(x, g, dx, n, [](float v, float w) { return capsule_tanh_df(v, w); });
}

extern "C" __global__ void capsule_softplus_fwd(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    map_1_1(x, y, n, [](float v) { return capsule_softplus_f(v); });
}

extern "C" __global__ void capsule_softplus_bwd(const float* __restrict__ x, const float* __restrict__ g, float* __restrict__ dx, int64_t n) {
    map_2_1(x, g, dx, n, [](float v, float w) { return capsule_softplus_df(v, w); });
}

// -- exp, sin, cos, log, inv ------------------------------------------------------------------------------

extern "C" __global__ void capsule_exp_fwd(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    map_1_1(x, y, n, [](float v) { return capsule_exp_f(v); });
}

extern "C" __global__ void capsule_exp_bwd(const float* __restrict__ x, const float* __restrict__ g, float* __restrict__ dx, int64_t n) {
    map_2_1(x, g, dx, n, [](float v, float w) { return capsule_exp_df(v, w); });
}

extern "C" __global__ void capsule_sin_fwd(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    map_1_1(x, y, n, [](float v) { return capsule_sin_f(v); });
}

extern "C" __global__ void capsule_sin_bwd(const float* __restrict__ x, const float* __restrict__ g, float* __restrict__ dx, int64_t n) {
    map_2_1(x, g, dx, n, [](float v, float w) { return capsule_sin_df(v, w); });
}

extern "C" __global__ void capsule_cos_fwd(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    map_1_1(x, y, n, [](float v) { return capsule_cos_f(v); });
}

extern "C" __global__ void capsule_cos_bwd(const float* __restrict__ x, const float* __restrict__ g, float* __restrict__ dx, int64_t n) {
    map_2_1(x, g, dx, n, [](float v, float w) { return capsule_cos_df(v, w); });
}

extern "C" __global__ void capsule_log_fwd(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    map_1_1(x, y, n, [](float v) { return capsule_log_f(v); });
}

extern "C" __global__ void capsule_log_bwd(const float* __restrict__ x, const float* __restrict__ g, float* __restrict__ dx, int64_t n) {
    map_2_1(x, g, dx, n, [](float v, float w) { return capsule_log_df(v, w); });
}

extern "C" __global__ void capsule_inv_fwd(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    map_1_1(x, y, n, [](float v) { return capsule_inv_f(v); });
}

extern "C" __global__ void capsule_inv_bwd(const float* __restrict__ x, const float* __restrict__ g, float* __restrict__ dx, int64_t n) {
    map_2_1(x, g, dx, n, [](float v, float w) { return capsule_inv_df(v, w); });
}

// -- safe_log: ln(softplus(x) + eps) -------------------------------------------------------------------------

extern "C" __global__ void capsule_safe_log_fwd(const float* __restrict__ x, float* __restrict__ y, float eps, int64_t n) {
    map_1_1(x, y, n, [eps](float v) { return capsule_safe_log_f(v, eps); });
}

extern "C" __global__ void capsule_safe_log_bwd(const float* __restrict__ x, const float* __restrict__ g, float* __restrict__ dx,
                                                float eps, int64_t n) {
    map_2_1(x, g, dx, n, [eps](float v, float w) { return capsule_safe_log_df(v, w, eps); });
}
