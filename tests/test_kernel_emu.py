"""The CPU emulator of cuda/capsule_emu.h keeps CUDA's block semantics: every thread of a block
runs, barriers and warp shuffles exchange values as on a GPU (warps of consecutive linear thread
indices in 2-D blocks; 32- and 64-bit values), blocks cover 2-D grids, dynamic shared memory is
there, and a divergent barrier or shuffle (undefined behaviour on a GPU) is reported as a deadlock
rather than passing silently. The plan memory of tests/kernel_emu.py, which every emulated or
host-replayed plan runs in, reports writes outside a buffer, changed inputs and unwritten outputs."""

import ctypes

import numpy as np
import pytest

from capsule_core.launch import Buffer, Launch, LaunchPlan
from kernel_emu import FILL_BITS, HostReplay, PlanMemory, build, compiler

SOURCE = r'''
#include <cstdint>
#include "common.cuh"
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
// One value per thread of a 2-D grid of 2-D blocks: the warp's (linear lanes) sum of 64-bit
// integers and of doubles, and the float2 read through __ldg.
__global__ void warp_sums_2d(const float2* x, long long* isum, double* dsum, float* y) {
    const unsigned t = threadIdx.x + blockDim.x * threadIdx.y;
    const unsigned block = blockIdx.x + gridDim.x * blockIdx.y;
    const unsigned i = block * blockDim.x * blockDim.y + t;
    const float2 v = __ldg(x + i);
    long long a = (1ll << 40) + static_cast<long long>(v.x);
    double d = static_cast<double>(v.y);
    for (int offset = 16; offset > 0; offset /= 2) {
        a += __shfl_xor_sync(0xffffffffu, a, offset);
        d += __shfl_xor_sync(0xffffffffu, d, offset);
    }
    isum[i] = a;
    dsum[i] = d;
    y[i] = v.x + v.y;
}
// The dynamic shared memory the launch sized: its size, and a block-wide reversal through it.
__global__ void reverse_through_dynamic_shared(const float* x, float* y, unsigned* bytes) {
    float* s = capsule::dynamic_shared<float>();
    s[threadIdx.x] = x[threadIdx.x];
    __syncthreads();
    y[threadIdx.x] = s[blockDim.x - 1 - threadIdx.x];
    if (threadIdx.x == 0) *bytes = capsule::dynamic_shared_bytes();
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
// What shared memory holds before the block writes it: the NaN pattern, static and dynamic.
__global__ void read_unwritten_shared(unsigned* out) {
    __shared__ unsigned tile[8];
    const unsigned* dynamic = capsule::dynamic_shared<unsigned>();
    out[blockIdx.x * 2] = tile[threadIdx.x];
    out[blockIdx.x * 2 + 1] = dynamic[threadIdx.x];
    tile[threadIdx.x] = 0;
}
__global__ void trap_in_block_one(float* out) {
    if (blockIdx.x == 1 && threadIdx.x == 3) __trap();
    out[threadIdx.x] = 1.0f;
}
__global__ void misaligned_float4(const float* x, float* out) {
    const float4 v = *reinterpret_cast<const float4*>(x + 1);
    out[threadIdx.x] = v.x;
}
extern "C" int run_read_unwritten_shared(unsigned* out) {
    return capsule_emu::launch("read_unwritten_shared", dim3{2}, dim3{1}, 16, &read_unwritten_shared, out);
}
extern "C" int run_trap(float* out) { return capsule_emu::launch("trap_in_block_one", dim3{2}, dim3{32}, 0, &trap_in_block_one, out); }
extern "C" int run_misaligned(const float* x, float* out) {
    return capsule_emu::launch("misaligned_float4", dim3{1}, dim3{4}, 0, &misaligned_float4, x, out);
}
extern "C" const char* last_error() { return capsule_emu::state.error.c_str(); }
extern "C" int run_block_sums(unsigned grid, unsigned block, const float* x, float* out) {
    return capsule_emu::launch("block_sums", dim3{grid}, dim3{block}, 0, &block_sums, x, out);
}
extern "C" int run_warp_sums_2d(unsigned gx, unsigned gy, unsigned bx, unsigned by, const float2* x, long long* isum,
                                double* dsum, float* y) {
    return capsule_emu::launch("warp_sums_2d", dim3{gx, gy}, dim3{bx, by}, 0, &warp_sums_2d, x, isum, dsum, y);
}
extern "C" int run_reverse(unsigned block, const float* x, float* y, unsigned* bytes) {
    return capsule_emu::launch("reverse", dim3{1}, dim3{block}, block * 4, &reverse_through_dynamic_shared, x, y, bytes);
}
extern "C" int run_divergent_sync(float* out) { return capsule_emu::launch("divergent_sync", dim3{1}, dim3{64}, 0, &divergent_sync, out); }
extern "C" int run_divergent_shuffle(float* out) {
    return capsule_emu::launch("divergent_shuffle", dim3{1}, dim3{64}, 0, &divergent_shuffle, out);
}
'''


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    if compiler() is None:
        pytest.skip("no C++ compiler (g++) for the emulator")
    lib = build("selftest", SOURCE, str(tmp_path_factory.mktemp("emu")))
    p, u = ctypes.c_void_p, ctypes.c_uint
    lib.run_block_sums.argtypes = [u, u, p, p]
    lib.run_warp_sums_2d.argtypes = [u, u, u, u, p, p, p, p]
    lib.run_reverse.argtypes = [u, p, p, p]
    lib.run_divergent_sync.argtypes = [p]
    lib.run_divergent_shuffle.argtypes = [p]
    lib.run_read_unwritten_shared.argtypes = [p]
    lib.run_trap.argtypes = [p]
    lib.run_misaligned.argtypes = [p, p]
    lib.last_error.restype = ctypes.c_char_p
    return lib


@pytest.mark.parametrize("block", [32, 64, 256, 1024])
def test_barriers_and_shuffles_exchange_values(lib, block):
    grid = 3
    x = np.arange(grid * block, dtype=np.float32) % 7
    out = np.zeros(grid, np.float32)
    assert lib.run_block_sums(grid, block, x.ctypes.data, out.ctypes.data) == 1
    assert np.array_equal(out, 32 * x.reshape(grid, block).sum(axis=1))


@pytest.mark.parametrize("grid, block", [((2, 3), (32, 4)), ((1, 1), (64, 2)), ((3, 2), (8, 8)), ((1, 2), (16, 2))])
def test_two_dimensional_grids_and_blocks_with_64_bit_shuffles(lib, grid, block):
    """Every thread of every block runs once; warps are 32 consecutive linear thread indices; long
    long and double values cross the shuffle whole."""
    n = grid[0] * grid[1] * block[0] * block[1]
    x = np.empty((n, 2), np.float32)
    x[:, 0] = np.arange(n) % 11
    x[:, 1] = 0.25 * (np.arange(n) % 5)
    isum, dsum, y = np.zeros(n, np.int64), np.zeros(n, np.float64), np.full(n, np.nan, np.float32)
    assert lib.run_warp_sums_2d(*grid, *block, x.ctypes.data, isum.ctypes.data, dsum.ctypes.data, y.ctypes.data) == 1
    assert np.array_equal(y, x.sum(axis=1))
    warps = x.reshape(-1, 32, 2)
    assert np.array_equal(isum, np.repeat(32 * 2**40 + warps[:, :, 0].astype(np.int64).sum(axis=1), 32))
    assert np.array_equal(dsum, np.repeat(warps[:, :, 1].astype(np.float64).sum(axis=1), 32))


def test_dynamic_shared_memory(lib):
    x = np.arange(96, dtype=np.float32)
    y, size = np.zeros(96, np.float32), np.zeros(1, np.uint32)
    assert lib.run_reverse(96, x.ctypes.data, y.ctypes.data, size.ctypes.data) == 1
    assert np.array_equal(y, x[::-1]) and size[0] == 96 * 4


def test_divergent_barriers_and_shuffles_are_reported(lib):
    """Never hung: the kernel, the block and which threads (lanes) arrived and which did not."""
    out = np.zeros(64, np.float32)
    assert lib.run_divergent_sync(out.ctypes.data) == 0
    assert lib.last_error().decode() == ("divergent_sync block (0,0,0): __syncthreads at selftest_emu.cpp:42 reached by "
                                         "threads 0-4 of 64; threads 5-63 exited without reaching it")
    assert lib.run_divergent_shuffle(out.ctypes.data) == 0
    assert lib.last_error().decode() == ("divergent_shuffle block (0,0,0): warp 0: __shfl_xor_sync at selftest_emu.cpp:47 "
                                         "reached by lanes 0-6,8-31 of 32; lanes 7 exited without reaching it")
    x = np.ones(64, np.float32)
    assert lib.run_block_sums(1, 64, x.ctypes.data, out.ctypes.data) == 1  # the emulator recovers


def test_shared_memory_starts_each_block_as_a_nan_pattern(lib):
    """A GPU gives stale bits, never zeros: static and dynamic shared memory hold 0x7FE5E5E5 (a NaN)
    when each block starts, even after the previous block wrote zeros."""
    out = np.zeros(4, np.uint32)
    assert lib.run_read_unwritten_shared(out.ctypes.data) == 1
    assert out.tolist() == [0x7FE5E5E5] * 4


def test_trap_ends_the_launch_naming_kernel_block_and_thread(lib):
    out = np.zeros(32, np.float32)
    assert lib.run_trap(out.ctypes.data) == 0
    assert lib.last_error().decode() == "trap_in_block_one block (1,0,0) thread (3,0,0): __trap() at selftest_emu.cpp:59"


def test_a_misaligned_vector_access_is_an_error(lib):
    x = np.zeros(16, np.float32)
    base = x.ctypes.data + (-x.ctypes.data % 16)
    out = np.zeros(4, np.float32)
    assert lib.run_misaligned(base, out.ctypes.data) == 0
    assert lib.last_error().decode().startswith(
        f"misaligned_float4 block (0,0,0) thread (0,0,0): misaligned 16-byte access at address {base + 4:#x} at selftest_emu.cpp:")


# -- kernel_emu.PlanMemory and HostReplay: the buffers every plan run (emulated or replayed) uses --


def _plan(launches=1, alias=False):
    buffers = (Buffer("x", "input", "float32", 8), Buffer("meta", "meta", "int64", 2),
               Buffer("work", "workspace", "float32", 4), Buffer("out", "output", "float32", 8))
    return LaunchPlan("selftest", "forward", buffers, (Launch("k", (1, 1, 1), (32, 1, 1), ("x", "meta", "out")),) * launches,
                      host_data={"meta": np.array([3, 4])}, output_shapes={"out": (2, 4)},
                      aliases={"out": "x"} if alias else {})


def _replay(write):
    return HostReplay(lambda memory, launch: write(memory))


def test_plan_memory_lays_out_guarded_prefilled_buffers():
    x = np.arange(8, dtype=np.float32)
    memory = PlanMemory(_plan(), {"x": x}, {"x": 1, "out": 3})
    assert memory.slots["x"].address % 64 == 4 and memory.slots["out"].address % 64 == 12
    assert memory.slots["work"].address % 64 == 0
    assert np.array_equal(memory.view("x"), x) and memory.view("meta").tolist() == [3, 4]
    assert (memory.view("out").view(np.uint32) == FILL_BITS).all() and (memory.view("work").view(np.uint32) == FILL_BITS).all()
    memory = PlanMemory(_plan(), {"x": x}, lambda b: 2 * (b.dtype == "float32"))
    assert memory.slots["x"].address % 64 == 8 and memory.slots["meta"].address % 64 == 0


def test_host_replay_returns_written_outputs_and_aliases():
    x = np.arange(8, dtype=np.float32)

    def write(memory):
        memory.view("out")[:] = memory.view("x") * 2
        return "path"
    runner = _replay(write)
    assert np.array_equal(runner.run(_plan(), {"x": x})["out"], (2 * x).reshape(2, 4))
    assert runner.returned == [("k", "path")]
    assert np.array_equal(_replay(write).run(_plan(launches=0, alias=True), {"x": x})["out"], x.reshape(2, 4))


@pytest.mark.parametrize("fault, message", [
    (lambda m: m.slots["out"].storage.__setitem__(m.slots["out"].start + 8, 0.0), "a write outside buffer out"),
    (lambda m: m.slots["x"].storage.__setitem__(m.slots["x"].start - 1, 0.0), "a write outside buffer x"),
    (lambda m: m.view("x").__setitem__(3, 9.0), "input x changed"),
    (lambda m: m.view("meta").__setitem__(0, 9), "input meta changed"),
    (lambda m: m.view("out").view(np.uint32).__setitem__(7, FILL_BITS), "out not fully written"),
])
def test_host_replay_reports_writes_outside_changed_inputs_and_unwritten_outputs(fault, message):
    def write(memory):
        memory.view("out")[:] = 1.0
        fault(memory)
    with pytest.raises(AssertionError, match=message):
        _replay(write).run(_plan(), {"x": np.zeros(8, np.float32)})
