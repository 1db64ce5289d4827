"""The CPU emulator of tests/host/cuda_emu.h keeps CUDA's block semantics: every thread of a block
runs, barriers and warp shuffles exchange values as on a GPU, and a divergent barrier or shuffle
(undefined behaviour on a GPU) is reported as a deadlock rather than passing silently."""

import ctypes

import numpy as np
import pytest

from kernel_emu import build, compiler

SOURCE = r'''
#include <cstdint>
__global__ void block_sums(const float* x, float* out) {
    __shared__ float partial[1024];
    partial[threadIdx.x] = x[blockIdx.x * blockDim.x + threadIdx.x];
    __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
        __syncthreads();
    }
    float v = partial[0];
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (threadIdx.x == 0) out[blockIdx.x] = v;   // 32 copies of the block's sum, summed by the warp
}
__global__ void divergent_sync(float* out) {
    if (threadIdx.x < 5) __syncthreads();
    out[threadIdx.x] = 1.0f;
}
__global__ void divergent_shuffle(float* out) {
    float v = 1.0f;
    if ((threadIdx.x & 31) != 7) v = __shfl_xor_sync(0xffffffffu, v, 1);
    out[threadIdx.x] = v;
}
extern "C" int run_block_sums(unsigned grid, unsigned block, const float* x, float* out) {
    return capsule_emu::launch(grid, block, &block_sums, x, out);
}
extern "C" int run_divergent_sync(float* out) { return capsule_emu::launch(1, 64, &divergent_sync, out); }
extern "C" int run_divergent_shuffle(float* out) { return capsule_emu::launch(1, 64, &divergent_shuffle, out); }
'''


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    if compiler() is None:
        pytest.skip("no C++ compiler (g++) for the emulator")
    lib = build("selftest", SOURCE, str(tmp_path_factory.mktemp("emu")))
    lib.run_block_sums.argtypes = [ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
    lib.run_divergent_sync.argtypes = [ctypes.c_void_p]
    lib.run_divergent_shuffle.argtypes = [ctypes.c_void_p]
    return lib


@pytest.mark.parametrize("block", [32, 64, 256, 1024])
def test_barriers_and_shuffles_exchange_values(lib, block):
    grid = 3
    x = np.arange(grid * block, dtype=np.float32) % 7
    out = np.zeros(grid, np.float32)
    assert lib.run_block_sums(grid, block, x.ctypes.data, out.ctypes.data) == 1
    assert np.array_equal(out, 32 * x.reshape(grid, block).sum(axis=1))


def test_divergent_barriers_and_shuffles_are_reported(lib):
    out = np.zeros(64, np.float32)
    assert lib.run_divergent_sync(out.ctypes.data) == 0
    assert lib.run_divergent_shuffle(out.ctypes.data) == 0
    x = np.ones(64, np.float32)
    assert lib.run_block_sums(1, 64, x.ctypes.data, out.ctypes.data) == 1  # the emulator recovers
