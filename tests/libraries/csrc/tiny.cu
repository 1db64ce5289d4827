// A tiny kernel library for the library tests: C++ linkage, size_t sizes, and two mean squared
// errors that differ only in the order of their float sum (an atomicAdd from every thread, or one
// block's fixed tree).
#include <cstddef>
#include <cstdint>

namespace tiny {

__global__ void relu_fwd(const float* __restrict__ x, float* __restrict__ y, size_t n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

__global__ void relu_bwd(const float* __restrict__ x, const float* __restrict__ g, float* __restrict__ dx, size_t n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        dx[i] = x[i] > 0.0f ? g[i] : 0.0f;
}

// Each thread's partial sum of squares goes into *sum (zeroed by the host) with atomicAdd: the
// order of the float additions is the order the blocks and threads happen to run in.
__global__ void mse_atomic(const float* __restrict__ pred, const float* __restrict__ target, float* sum, size_t n) {
    float local = 0.0f;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const float d = pred[i] - target[i];
        local += d * d;
    }
    atomicAdd(sum, local);
}

__global__ void mse_finish(const float* __restrict__ sum, float* __restrict__ out, size_t n) {
    if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = sum[0] / float(n);
}

// One block of 256 threads: strided partials, then a fixed shared-memory tree.
__global__ void mse_ordered(const float* __restrict__ pred, const float* __restrict__ target, float* __restrict__ out,
                            size_t n) {
    __shared__ float part[256];
    if (blockDim.x != 256) return;
    float local = 0.0f;
    for (size_t i = threadIdx.x; i < n; i += 256) {
        const float d = pred[i] - target[i];
        local += d * d;
    }
    part[threadIdx.x] = local;
    __syncthreads();
    for (unsigned s = 128; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[0] = part[0] / float(n);
}

__global__ void mse_bwd(const float* __restrict__ pred, const float* __restrict__ target, const float* __restrict__ g,
                        float* __restrict__ dpred, float* __restrict__ dtarget, size_t n) {
    const float scale = g[0] * (2.0f / float(n));
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const float d = (pred[i] - target[i]) * scale;
        dpred[i] = d;
        dtarget[i] = -d;
    }
}

}  // namespace tiny
