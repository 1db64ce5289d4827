"""The CPU emulator of cuda/capsule_emu.h keeps CUDA's block semantics: every thread of a block
runs, barriers and warp shuffles exchange values as on a GPU (warps of consecutive linear thread
indices in 2-D blocks; 32- and 64-bit values), blocks cover 2-D grids, dynamic shared memory is
there, and a divergent barrier or shuffle (undefined behaviour on a GPU) is reported as a deadlock
rather than passing silently. The one execution path (DeviceBackend.execute) starts buffers where
`misalign` says, and the plan runs of tests/kernel_emu.py report writes past any buffer, changed
inputs, unwritten outputs and kernel faults."""

import ctypes
import subprocess
from pathlib import Path

import family_checks as fc
import numpy as np
import pytest
from kernel_emu import HostReplay, emulator

from capsule_core.backends.emu import EMULATOR_HEADER, HOST_FLAGS, LINKER_SCRIPT, find_host_compiler
from capsule_core.errors import EnvironmentMissing
from capsule_core.kernels.launch import Buffer, Launch, LaunchPlan
from capsule_core.kernels.nvcc import cuda_source_dir

SOURCE = r"""
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
__global__ void divide_by(const int64_t* d, int64_t* out) {
    out[threadIdx.x] = 7 / d[threadIdx.x];
}
__global__ void store_through(int64_t address, float* out) {
    if (threadIdx.x == 2) *reinterpret_cast<float*>(address) = 1.0f;
    out[threadIdx.x] = 1.0f;
}
// 256 KiB of local array: twice the emulator's stack per thread.
__global__ void deep_stack(float* out) {
    volatile float big[65536];
    for (int i = 0; i < 65536; ++i) big[i] = static_cast<float>(i);
    out[threadIdx.x] = big[threadIdx.x];
}
__global__ void misaligned_float4(const float* x, float* out) {
    const float4 v = *reinterpret_cast<const float4*>(x + 1);
    out[threadIdx.x] = v.x;
}
// Each thread's SSE control word, before and after a barrier (a switch to the other threads).
__global__ void control_words(unsigned* seen) {
    unsigned word;
    asm volatile("stmxcsr %0" : "=m"(word));
    seen[2 * threadIdx.x] = word;
    __syncthreads();
    asm volatile("stmxcsr %0" : "=m"(word));
    seen[2 * threadIdx.x + 1] = word;
}
// The test that emulator code makes where it moves a vector without a typed access (linalg.cuh's
// multiply on the host): thread t at x + t.
__global__ void hand_tested_alignment(const float* x, float* out) {
    capsule_emu::require_aligned(x + threadIdx.x, 16);
    out[threadIdx.x] = x[threadIdx.x];
}
extern "C" int run_read_unwritten_shared(unsigned* out) {
    return capsule_emu::launch("read_unwritten_shared", dim3{2}, dim3{1}, 16, &read_unwritten_shared, out);
}
extern "C" int run_trap(float* out) { return capsule_emu::launch("trap_in_block_one", dim3{2}, dim3{32}, 0, &trap_in_block_one, out); }
extern "C" int run_divide_by(const int64_t* d, int64_t* out) {
    return capsule_emu::launch("divide_by", dim3{1}, dim3{4}, 0, &divide_by, d, out);
}
extern "C" int run_store_through(int64_t address, float* out) {
    return capsule_emu::launch("store_through", dim3{2}, dim3{4}, 0, &store_through, address, out);
}
extern "C" int run_deep_stack(float* out) { return capsule_emu::launch("deep_stack", dim3{1}, dim3{4}, 0, &deep_stack, out); }
extern "C" int run_misaligned(const float* x, float* out) {
    return capsule_emu::launch("misaligned_float4", dim3{1}, dim3{4}, 0, &misaligned_float4, x, out);
}
extern "C" int run_hand_tested_alignment(unsigned block, const float* x, float* out) {
    return capsule_emu::launch("hand_tested_alignment", dim3{1}, dim3{block}, 0, &hand_tested_alignment, x, out);
}
// Launched with the host's control word set to `host` (then put back); *after: the host's word
// once the launch has returned.
extern "C" int run_control_words(unsigned host, unsigned* seen, unsigned* after) {
    unsigned before;
    asm volatile("stmxcsr %0" : "=m"(before));
    asm volatile("ldmxcsr %0" ::"m"(host));
    const int ok = capsule_emu::launch("control_words", dim3{3}, dim3{64}, 0, &control_words, seen);
    asm volatile("stmxcsr %0" : "=m"(*after));
    asm volatile("ldmxcsr %0" ::"m"(before));
    return ok;
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
"""


def build(name: str, code: str, build_dir: Path) -> ctypes.CDLL:
    """C++ `code` built against the emulator header as the emu backend builds a family."""
    try:
        compiler = find_host_compiler()
    except EnvironmentMissing as exc:
        pytest.skip(str(exc))
    driver = build_dir / f"{name}_emu.cpp"
    driver.write_text(code)
    target = build_dir / f"lib{name}_emu.so"
    source_dir = cuda_source_dir()
    cmd = [
        str(compiler.path),
        *HOST_FLAGS,
        "-include",
        str(source_dir / EMULATOR_HEADER),
        "-I",
        str(source_dir),
        "-o",
        str(target),
        str(driver),
        f"-Wl,-T,{source_dir / LINKER_SCRIPT}",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, f"emulator build of {name} failed:\n{result.stderr}"
    return ctypes.CDLL(str(target))


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = build("selftest", SOURCE, tmp_path_factory.mktemp("emu"))
    p, u = ctypes.c_void_p, ctypes.c_uint
    lib.run_block_sums.argtypes = [u, u, p, p]
    lib.run_warp_sums_2d.argtypes = [u, u, u, u, p, p, p, p]
    lib.run_reverse.argtypes = [u, p, p, p]
    lib.run_divergent_sync.argtypes = [p]
    lib.run_divergent_shuffle.argtypes = [p]
    lib.run_read_unwritten_shared.argtypes = [p]
    lib.run_trap.argtypes = [p]
    lib.run_misaligned.argtypes = [p, p]
    lib.run_control_words.argtypes = [u, p, p]
    lib.run_hand_tested_alignment.argtypes = [u, p, p]
    lib.run_divide_by.argtypes = [p, p]
    lib.run_store_through.argtypes = [ctypes.c_int64, p]
    lib.run_deep_stack.argtypes = [p]
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
    assert lib.last_error().decode() == (
        "divergent_sync block (0,0,0): __syncthreads at selftest_emu.cpp:42 reached by "
        "threads 0-4 of 64; threads 5-63 exited without reaching it"
    )
    assert lib.run_divergent_shuffle(out.ctypes.data) == 0
    assert lib.last_error().decode() == (
        "divergent_shuffle block (0,0,0): warp 0: __shfl_xor_sync at selftest_emu.cpp:47 "
        "reached by lanes 0-6,8-31 of 32; lanes 7 exited without reaching it"
    )
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
    assert (
        lib.last_error().decode() == "trap_in_block_one block (1,0,0) thread (3,0,0): __trap() at selftest_emu.cpp:59"
    )


def test_hardware_faults_end_the_launch_not_the_process(lib):
    """An integer division by zero and a store to an unmapped address in one thread are launch
    errors naming kernel, block, thread and signal; the next launch (fault or not) runs normally,
    so neither the emulator's state nor the signal mask is left broken."""
    d, out = np.array([1, 7, 0, 1], np.int64), np.zeros(4, np.int64)
    for _ in range(2):
        assert lib.run_divide_by(d.ctypes.data, out.ctypes.data) == 0
        assert (
            lib.last_error().decode()
            == "divide_by block (0,0,0) thread (2,0,0): SIGFPE, integer divide by zero in the kernel's code"
        )
        y = np.zeros(4, np.float32)
        assert lib.run_store_through(16, y.ctypes.data) == 0
        assert lib.last_error().decode() == (
            "store_through block (0,0,0) thread (2,0,0): SIGSEGV: write at address 0x10 (not mapped) "
            "in the kernel's code"
        )
    d[2] = 2
    assert lib.run_divide_by(d.ctypes.data, out.ctypes.data) == 1
    assert out.tolist() == [7, 1, 3, 7]


def test_a_thread_that_outgrows_its_stack_ends_the_launch_not_the_process(lib):
    """A thread's frame larger than its fiber stack faults on the guard page below it, on the
    handler's own signal stack; without the guard it would write over the stack of the thread
    below, without the signal stack the fault could not be handled. Twice, then a launch that
    fits: the emulator's stacks and signal handling are left as they were."""
    for _ in range(2):
        out = np.zeros(4, np.float32)
        assert lib.run_deep_stack(out.ctypes.data) == 0
        assert lib.last_error().decode() == (
            "deep_stack block (0,0,0) thread (0,0,0): stack overflow: the thread needed more "
            "than its 128 KiB of stack on the emulator (a large local array, or deep recursion) "
            "in the kernel's code"
        )
    d, out = np.array([1, 7, 2, 1], np.int64), np.zeros(4, np.int64)
    assert lib.run_divide_by(d.ctypes.data, out.ctypes.data) == 1
    assert out.tolist() == [7, 1, 3, 7]


def test_a_misaligned_vector_access_is_an_error(lib):
    x = np.zeros(16, np.float32)
    base = x.ctypes.data + (-x.ctypes.data % 16)
    out = np.zeros(4, np.float32)
    assert lib.run_misaligned(base, out.ctypes.data) == 0
    assert (
        lib.last_error()
        .decode()
        .startswith(
            f"misaligned_float4 block (0,0,0) thread (0,0,0): misaligned 16-byte access at address {base + 4:#x} at selftest_emu.cpp:"
        )
    )


def test_an_alignment_tested_by_hand_reports_as_the_instrumented_one(lib):
    x = np.arange(8, dtype=np.float32)
    base = x.ctypes.data + (-x.ctypes.data % 16)
    out = np.zeros(2, np.float32)
    assert lib.run_hand_tested_alignment(1, base, out.ctypes.data) == 1
    assert lib.run_hand_tested_alignment(2, base, out.ctypes.data) == 0
    error = lib.last_error().decode()
    assert error.startswith(
        f"hand_tested_alignment block (0,0,0) thread (1,0,0): misaligned 16-byte access at address {base + 4:#x} "
        "at selftest_emu.cpp:"
    ), error


def test_kernels_run_in_the_gpus_floating_point_environment_and_the_hosts_is_kept(lib):
    """Round to nearest, subnormals kept, exceptions masked (MXCSR 0x1F80) in every kernel thread,
    across switches, whatever the host set (here flush-to-zero and denormals-are-zero); the host's
    word is back after the launch."""
    host_ftz_daz = 0x1F80 | 0x8000 | 0x0040
    seen = np.zeros(2 * 64, np.uint32)
    after = np.zeros(1, np.uint32)
    assert lib.run_control_words(host_ftz_daz, seen.ctypes.data, after.ctypes.data) == 1
    assert set(seen.tolist()) == {0x1F80}
    assert after[0] == host_ftz_daz


# -- plans through DeviceBackend.execute: misaligned buffers, and what a run reports ---------------


def _permute_plan() -> LaunchPlan:
    """capsule_permute_fwd's buffers of every role that reaches a kernel: float32 input and output,
    int64 metadata."""
    buffers = (
        Buffer("x", "input", "float32", 6),
        Buffer("out", "output", "float32", 6),
        Buffer("geometry", "meta", "int64", 3),
    )
    launch = Launch("capsule_permute_fwd", (1, 1, 1), (32, 1, 1), ("x", "out", "geometry", 1, 6))
    return LaunchPlan(
        "permute",
        "forward",
        buffers,
        (launch,),
        host_data={"geometry": np.array([6, 1, 7])},
        output_shapes={"out": (2, 3)},
    )


def _recorded_args(misalign) -> tuple:
    """The arguments capsule_permute_fwd receives, the harness copying x to out and reading geometry."""
    seen = []

    def call(launch):
        x, out, geometry = launch.args[:3]
        ctypes.memmove(out, x, 24)
        seen.append((launch.args, (ctypes.c_int64 * 3).from_address(geometry)[:]))

    y = HostReplay(call).run(_permute_plan(), {"x": np.arange(6, dtype=np.float32)}, misalign)["out"]
    assert np.array_equal(y, np.arange(6, dtype=np.float32).reshape(2, 3))
    ((args, geometry),) = seen
    assert geometry == [6, 1, 7] and args[3:] == (1, 6)
    return args


@pytest.mark.parametrize(
    "misalign, offsets",
    [
        (None, (0, 0, 0)),
        ({"x": 1, "out": 3, "geometry": 1}, (4, 12, 8)),
        (lambda b: 2 * (b.dtype == "float32"), (8, 8, 0)),
    ],
)
def test_misaligned_buffers_start_past_a_256_byte_boundary(misalign, offsets):
    """`misalign` counts elements of the buffer's own type (8 bytes for int64 metadata); the
    contents arrive there and the output comes back from there."""
    x, out, geometry = _recorded_args(misalign)[:3]
    assert (x % 256, out % 256, geometry % 256) == offsets


def test_an_alias_comes_back_from_the_misaligned_input():
    """reshape launches nothing: its output is its input's memory, under the output's shape."""
    x = np.arange(6, dtype=np.float32)
    plan = LaunchPlan(
        "reshape",
        "forward",
        (Buffer("x", "input", "float32", 6), Buffer("out", "output", "float32", 6)),
        (),
        output_shapes={"out": (3, 2)},
        aliases={"out": "x"},
    )
    assert np.array_equal(emulator().run(plan, {"x": x}, {"x": 3})["out"], x.reshape(3, 2))


def _relu_plan(n: int = 40) -> LaunchPlan:
    buffers = (Buffer("x", "input", "float32", n), Buffer("out", "output", "float32", n))
    launch = Launch("capsule_relu_fwd", (1, 1, 1), (32, 1, 1), ("x", "out", n))
    return LaunchPlan("relu", "forward", buffers, (launch,), output_shapes={"out": (n,)})


def test_a_write_past_a_workspace_is_reported():
    """Every buffer, not only the outputs, sits between guard bands: relu through a workspace that
    one launch overruns by an element (its values unharmed) fails the run."""
    n = 40
    buffers = (
        Buffer("x", "input", "float32", n),
        Buffer("staged", "workspace", "float32", n),
        Buffer("out", "output", "float32", n),
    )
    plan = LaunchPlan(
        "relu",
        "forward",
        buffers,
        (
            Launch("capsule_relu_fwd", (1, 1, 1), (32, 1, 1), ("x", "staged", n)),
            Launch("capsule_relu_fwd", (1, 1, 1), (32, 1, 1), ("staged", "out", n)),
        ),
        output_shapes={"out": (n,)},
    )
    x = np.linspace(-2, 2, n, dtype=np.float32)
    runner = emulator()
    assert np.array_equal(runner.run(plan, {"x": x})["out"], np.maximum(x, 0))
    overrun = fc.with_launch(plan, args=("x", "staged", n + 1))
    with pytest.raises(AssertionError, match=r"writes past buffers \(guard elements changed\): \{'staged': 1\}"):
        runner.run(overrun, {"x": x})


@pytest.mark.parametrize(
    "fault, message",
    [
        ({"args": ("x", "out", 41)}, "a write outside buffer out"),
        ({"args": ("x", "out", 39)}, r"out not fully written \(1 elements\)"),
        ({"args": ("x", "x", 40)}, "input x changed"),
    ],
)
def test_planted_launch_faults_are_reported(fault, message):
    """relu's kernel on the emulator launched wrongly, its buffers off 16-byte alignment: past the
    end of the output, short of it, into its input."""
    x = np.linspace(-2, 2, 40, dtype=np.float32)
    runner = emulator()
    assert np.array_equal(runner.run(_relu_plan(), {"x": x}, {"x": 1, "out": 1})["out"], np.maximum(x, 0))
    with pytest.raises(AssertionError, match=message):
        runner.run(fc.with_launch(_relu_plan(), **fault), {"x": x}, {"x": 1, "out": 1})
