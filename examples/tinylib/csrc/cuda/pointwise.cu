// tinylib pointwise kernels: relu and the library's own squared_relu.
//
// One grid-stride launch per direction (plans.py: grid_1d over n, TINYLIB_THREADS per block).
// The relu kernels are written for exactly TINYLIB_THREADS threads per block and do nothing at
// any other block size (a library habit this example keeps on purpose: the plan must launch
// 256 threads, and `capsules verify` shows at once when it does not, as every output element
// stays unwritten).
#include "tinylib.cuh"

namespace tinylib {

// relu(x) = x if x > 0 else 0: NaN -> 0 (the comparison is false), -0 -> +0. A template, as a
// library with half-precision variants would write it; only float is instantiated, so the
// declared symbol is "tinylib::relu_forward<float>" and its parameters are spelled out in
// capsules.py (the loader cannot read them off a template).
template <typename T>
__global__ void relu_forward(const T* __restrict__ x, T* __restrict__ y, size_t n) {
    if (blockDim.x != kThreads) return;
    TINYLIB_GRID_STRIDE(i, n) {
        const T v = x[i];
        y[i] = v > T(0) ? v : T(0);
    }
}

template __global__ void relu_forward<float>(const float* __restrict__, float* __restrict__, size_t);

// dx = g where x > 0, else 0 (relu'(0) = 0, NaN -> 0).
__global__ void relu_backward(const float* __restrict__ x, const float* __restrict__ g, float* __restrict__ dx, size_t n) {
    if (blockDim.x != kThreads) return;
    TINYLIB_GRID_STRIDE(i, n) dx[i] = x[i] > 0.0f ? g[i] : 0.0f;
}

// squared_relu(x) = max(x, 0)^2: a selection, then one correctly rounded product (bitwise the
// rounded exact square, overflow to +inf past about 1.8e19 included). NaN -> 0 like relu: the
// comparison x > 0 is false for NaN, so r = 0 and y = +0; -0 -> +0.
__global__ void squared_relu_forward(const float* __restrict__ x, float* __restrict__ y, size_t n) {
    TINYLIB_GRID_STRIDE(i, n) {
        const float v = x[i];
        const float r = v > 0.0f ? v : 0.0f;
        y[i] = r * r;
    }
}

// dx = 2 * max(x, 0) * g; 0 where x <= 0 or x is NaN (as relu). Doubling is exact, so the
// product (2x) * g is one correctly rounded operation, bitwise the rounded exact 2xg, except
// that 2x overflows for x >= 2^127 where 2xg may still be finite: there g is doubled instead
// (x * 2g is the same exact product; if 2g overflows too, |2xg| >= 2^255 is +-inf anyway).
__global__ void squared_relu_backward(const float* __restrict__ x, const float* __restrict__ g, float* __restrict__ dx, size_t n) {
    TINYLIB_GRID_STRIDE(i, n) {
        const float v = x[i];
        float d = 0.0f;
        if (v > 0.0f) {
            const float gi = g[i];
            d = v < 0x1p127f ? (v + v) * gi : v * (gi + gi);
        }
        dx[i] = d;
    }
}

}  // namespace tinylib
