// tinylib: device helpers shared by every kernel file of the library.
//
// Everything lives in namespace tinylib with C++ linkage; the kernels' symbols are mangled C++
// names (tinylib::row_sum, tinylib::relu_forward<float>), declared as such in capsules.py.
#pragma once

#include <cfloat>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>

// Threads per block of every launch the plans make (plans.THREADS). capsules.py passes it as
// -DTINYLIB_THREADS=256 on every build; the default keeps a plain nvcc command working.
#ifndef TINYLIB_THREADS
#define TINYLIB_THREADS 256
#endif

// Grid-stride loop over [0, n) with size_t indices: correct for any grid and any n.
#define TINYLIB_GRID_STRIDE(i, n)                                                          \
    for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
         i += static_cast<size_t>(gridDim.x) * blockDim.x)

namespace tinylib {

constexpr unsigned int kThreads = TINYLIB_THREADS;
static_assert(kThreads >= 32 && kThreads <= 1024 && (kThreads & (kThreads - 1)) == 0,
              "TINYLIB_THREADS must be a power of two in [32, 1024]");

// -- the order-preserving int encoding of a float ---------------------------------------------
// atomicMax exists for int, not float. A non-negative float's bits, read as an int, already
// order like the float; a negative float's do in reverse, so their low 31 bits are flipped:
// key(a) < key(b) exactly when a < b (and -0 < +0). Every NaN becomes INT_MAX, above +inf's key,
// so a row holding a NaN has the maximum NaN, as the reference's np.max propagates it (a
// negative NaN's raw bits would otherwise sort below -inf and lose).
__device__ __forceinline__ int ordered_key(float v) {
    if (v != v) return INT_MAX;
    const int bits = __float_as_int(v);
    return bits >= 0 ? bits : bits ^ INT_MAX;
}

__device__ __forceinline__ float ordered_value(int key) { return __int_as_float(key >= 0 ? key : key ^ INT_MAX); }

// key(-inf) = 0xFF800000 ^ 0x7FFFFFFF = 0x807FFFFF: what a row-max buffer is memset to before
// the atomicMax kernel (plans.ORDERED_MINUS_INF); every real element's key is at least this.
constexpr int kOrderedMinusInf = -2139095041;

// -- the block sum ----------------------------------------------------------------------------
// The sum of every thread's v in a fixed shared-memory tree: thread t adds t + s for
// s = kThreads/2, ..., 1. The tree depends only on kThreads, never on the schedule, so a block
// sum has the same bits run to run. Every thread of the block must call it (it has barriers) and
// blockDim.x must be kThreads; `scratch` holds kThreads floats. Every thread gets the total; the
// scratch is free again when it returns.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const unsigned int t = threadIdx.x;
    scratch[t] = v;
    __syncthreads();
    for (unsigned int s = kThreads / 2; s > 0; s >>= 1) {
        if (t < s) scratch[t] = scratch[t] + scratch[t + s];
        __syncthreads();
    }
    const float total = scratch[0];
    __syncthreads();
    return total;
}

}  // namespace tinylib
