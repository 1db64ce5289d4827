// tinylib softmax over the last axis: rows x cols (cols = D >= 1), as a chain of launches
// through two small workspaces, the way a library without a fused kernel writes it.
//
// Forward (plans.py, softmax_forward):
//   memset rowmax to key(-inf)    the ordered-int encoding (tinylib.cuh) of -inf
//   row_max                       atomicMax of every element's key into rowmax[row]
//   memset rowsum to 0
//   row_exp                       out = expf(x - max)
//   row_sum                       one block per row: a fixed shared-memory tree, then ONE
//                                 atomicAdd per row onto the zeroed rowsum[row]
//   row_divide                    out = out / rowsum[row], in place
// Backward (softmax_backward): dx = y * (g - sum(y * g)):
//   memset dot to 0
//   row_dot                       one block per row: the tree over y * g, ONE atomicAdd per row
//   softmax_backward              dx = y * (g - dot[row])
//
// Deterministic: the maximum is exact in any order, and each row's sum is one block's fixed tree
// added once onto an exact 0, so no float addition depends on the schedule. Edge values follow
// the reference e = exp(x - max), y = e / sum e literally: a row holding NaN, a row holding +inf,
// and a row of -inf only come out all NaN (inf - inf, -inf - -inf); a row of huge logits
// (+-3e38) shifts to -inf where x - max overflows, whose exp is 0, as in float64.
#include "tinylib.cuh"

namespace tinylib {

// rowmax[row] = key(max over the row) (rowmax set to key(-inf) first). One atomicMax per
// element: max is exact and commutative on the keys, so the order of the atomics never matters.
__global__ void row_max(const float* __restrict__ x, int* __restrict__ rowmax, size_t n, size_t cols) {
    TINYLIB_GRID_STRIDE(i, n) atomicMax(&rowmax[i / cols], ordered_key(x[i]));
}

// e = exp(x - max) into out: the rounding of x - max, then expf (full precision, no fast-math).
__global__ void row_exp(const float* __restrict__ x, const int* __restrict__ rowmax, float* __restrict__ out, size_t n, size_t cols) {
    TINYLIB_GRID_STRIDE(i, n) out[i] = expf(x[i] - ordered_value(rowmax[i / cols]));
}

// rowsum[row] += sum of e over the row (rowsum zeroed first): a block per row (the grid loops
// over rows when there are more rows than blocks, each row still one block), each thread a
// strided partial in column order, the block's fixed tree, then thread 0's single atomicAdd.
// blockDim.x must be TINYLIB_THREADS; any other size does nothing (uniformly, before a barrier).
__global__ void row_sum(const float* __restrict__ e, float* __restrict__ rowsum, size_t rows, size_t cols) {
    __shared__ float scratch[kThreads];
    if (blockDim.x != kThreads) return;
    for (size_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* er = e + row * cols;
        float s = 0.0f;
        for (size_t c = threadIdx.x; c < cols; c += kThreads) s += er[c];
        s = block_sum(s, scratch);
        if (threadIdx.x == 0) atomicAdd(&rowsum[row], s);
    }
}

// y = e / sum, in place (an IEEE division: the plans build without fast-math).
__global__ void row_divide(float* __restrict__ y, const float* __restrict__ rowsum, size_t n, size_t cols) {
    TINYLIB_GRID_STRIDE(i, n) y[i] = y[i] / rowsum[i / cols];
}

// dot[row] += sum of y * g over the row (dot zeroed first): row_sum's scheme.
__global__ void row_dot(const float* __restrict__ y, const float* __restrict__ g, float* __restrict__ dot, size_t rows, size_t cols) {
    __shared__ float scratch[kThreads];
    if (blockDim.x != kThreads) return;
    for (size_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* yr = y + row * cols;
        const float* gr = g + row * cols;
        float s = 0.0f;
        for (size_t c = threadIdx.x; c < cols; c += kThreads) s += yr[c] * gr[c];
        s = block_sum(s, scratch);
        if (threadIdx.x == 0) atomicAdd(&dot[row], s);
    }
}

// dx = y * (g - dot[row]).
__global__ void softmax_backward(const float* __restrict__ y, const float* __restrict__ g, const float* __restrict__ dot, float* __restrict__ dx, size_t n, size_t cols) {
    TINYLIB_GRID_STRIDE(i, n) dx[i] = y[i] * (g[i] - dot[i / cols]);
}

}  // namespace tinylib
