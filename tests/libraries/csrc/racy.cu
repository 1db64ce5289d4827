// An inter-block race, planted: thread 0 of every block writes y[0] (the same value, but no
// ordering between blocks), besides each thread's own elements. racecheck must name it.
#include <cstddef>

namespace racy {

__global__ void relu_fwd(const float* __restrict__ x, float* __restrict__ y, size_t n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        y[i] = x[i] > 0.0f ? x[i] : 0.0f;
    if (threadIdx.x == 0 && n > 0) y[0] = x[0] > 0.0f ? x[0] : 0.0f;
}

__global__ void relu_bwd(const float* __restrict__ x, const float* __restrict__ g, float* __restrict__ dx, size_t n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        dx[i] = x[i] > 0.0f ? g[i] : 0.0f;
}

}  // namespace racy
