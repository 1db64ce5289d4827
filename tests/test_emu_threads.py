"""The emulator's blocks on several OS threads (capsule_emu.h's pool): the same bits as one thread
for kernels whose blocks write disjoint memory, shared memory of each block its own, atomics exact
across threads, and a failed launch reporting the first failing block of the schedule whatever ran
beside it."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from capsule_core.backends import emu
from capsule_core.backends.emu import EmuBackend, KernelFault
from capsule_core.backends.execution import GuardedOutput, gradient_outputs
from capsule_core.catalog import registry
from capsule_core.errors import CapsuleError
from capsule_core.kernels.c_types import C_TYPES
from capsule_core.model import NativeSymbolRef
from capsule_core.ops import get_spec
from capsule_core.ops.base import validate
from capsule_core.verify.engine import run_samples
from cli.app import app

PLANTED = r"""
#include <cstdint>
// Each block fills its shared memory with its own index and reads it back many times: blocks that
// shared one copy across OS threads would see each other's index.
extern "C" __global__ void capsule_threads_shared(const float* __restrict__ x, float* __restrict__ y,
                                                  int* __restrict__ counter, int64_t n) {
    __shared__ float tag[256];
    tag[threadIdx.x] = static_cast<float>(blockIdx.x);
    __syncthreads();
    float s = 0.0f;
    for (int k = 0; k < 4000; ++k) s += tag[(threadIdx.x + k) % blockDim.x];
    y[blockIdx.x * blockDim.x + threadIdx.x] = s;
    atomicAdd(counter, 1);
}
// Blocks from n on store through a null pointer; the others run a while first.
extern "C" __global__ void capsule_threads_fault(const float* __restrict__ x, float* __restrict__ y,
                                                 int* __restrict__ counter, int64_t n) {
    if (blockIdx.x >= n) *(volatile float*)(nullptr) = 1.0f;
    float s = 0.0f;
    for (int k = 0; k < 2000; ++k) s += x[(threadIdx.x + k) % 64];
    y[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
"""
PARAMS = ("const float* __restrict__ x", "float* __restrict__ y", "int* __restrict__ counter", "int64_t n")
REFS = tuple(NativeSymbolRef("cuda/threads.cu", f"capsule_threads_{k}", PARAMS) for k in ("shared", "fault"))
BLOCKS, THREADS = 48, 256


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    folder = tmp_path_factory.mktemp("threads")
    (folder / "threads.cu").write_text(PLANTED)
    return folder


def launch(backend, kernel: str, n: int):
    """(y, counter) after the planted kernel over BLOCKS x THREADS."""
    x = np.arange(64, dtype=np.float32)
    y = np.zeros(BLOCKS * THREADS, np.float32)
    counter = np.zeros(1, np.int32)
    arrays = {"x": x, "y": y, "counter": counter}
    addresses = {name: backend.allocate(a.nbytes) for name, a in arrays.items()}
    try:
        for name, a in arrays.items():
            backend.upload(addresses[name], a)
        ref = next(r for r in REFS if r.symbol == f"capsule_threads_{kernel}")
        args = [np.uintp(addresses[name]) for name in arrays] + [C_TYPES["int64_t"].numpy(n)]
        backend.launch(ref, (BLOCKS, 1, 1), (THREADS, 1, 1), 0, args)
        for name, a in arrays.items():
            backend.download(a, addresses[name])
    finally:
        for address in addresses.values():
            backend.free(address)
    return y, int(counter[0])


@pytest.mark.parametrize("threads", [1, 2, 5])
def test_every_block_has_its_own_shared_memory_and_atomics_count_exactly(family, threads):
    y, counter = launch(EmuBackend(family_dir=family, refs=REFS, threads=threads), "shared", 0)
    expected = np.repeat(np.arange(BLOCKS, dtype=np.float32) * 4000, THREADS)
    assert np.array_equal(y, expected)
    assert counter == BLOCKS * THREADS


@pytest.mark.parametrize("order", ["index", "reversed", "shuffled"])
def test_a_fault_names_the_first_failing_block_of_the_schedule_with_any_thread_count(family, order):
    reports = set()
    for threads in (1, 3, 6):
        backend = EmuBackend(family_dir=family, refs=REFS, threads=threads)
        backend.order, backend.order_seed = order, 11
        with pytest.raises(KernelFault) as fault:
            launch(backend, "fault", 5)
        assert "write at address (nil)" in str(fault.value), fault.value
        reports.add(str(fault.value).split(":")[0])
    assert len(reports) == 1, reports
    if order == "index":
        assert reports == {"capsule_threads_fault block (5,0,0) thread (0,0,0)"}
    elif order == "reversed":
        assert reports == {f"capsule_threads_fault block ({BLOCKS - 1},0,0) thread ({THREADS - 1},0,0)"}


def largest_sample(op: str):
    """The op's largest full-mode sample under 150,000 input elements: several blocks per launch."""
    samples = [s for s in run_samples(get_spec(op), False, 0) if sum(np.size(v) for v in s.inputs.values()) < 150000]
    return max(samples, key=lambda s: sum(np.size(v) for v in s.inputs.values()))


def forward_and_backward(backend, op: str) -> list[bytes]:
    spec, sample = get_spec(op), largest_sample(op)
    backend.bind(registry.lookup(op))
    arrays, params, out_shape = validate(spec, sample.inputs, sample.params, np.float32)
    y = GuardedOutput(out_shape)
    backend.forward(spec, dict(arrays), dict(sample.params), y)
    bits = [y.view.tobytes()]
    if spec.has_vjp:
        g = np.random.default_rng(1).standard_normal(out_shape).astype(np.float32)
        grads = gradient_outputs(spec, arrays)
        backend.backward(spec, dict(arrays), dict(sample.params), g, grads)
        bits += [grads[name].view.tobytes() for name in sorted(grads)]
    return bits


@pytest.mark.parametrize(
    "op", ["matmul", "softmax", "conv", "layer_norm", "batch_norm", "scatter_add", "reduce_sum", "max_pool"]
)
def test_kernels_give_the_same_bits_on_one_thread_and_on_several(op):
    one = forward_and_backward(EmuBackend(threads=1), op)
    several = forward_and_backward(EmuBackend(threads=4), op)
    assert one == several


def test_the_default_thread_count_stays_within_the_mapping_limit(monkeypatch):
    monkeypatch.setattr(emu, "usable_cpus", lambda: 64)
    monkeypatch.delenv("CAPSULES_EMU_THREADS", raising=False)
    monkeypatch.setattr(emu, "max_map_count", lambda: 65530)
    assert EmuBackend().threads == 15
    monkeypatch.setattr(emu, "max_map_count", lambda: 1 << 20)
    assert EmuBackend().threads == 64
    assert EmuBackend(threads=40).threads == 40


def test_the_thread_count_is_checked():
    with pytest.raises(CapsuleError, match="--emu-threads: must be >= 1"):
        EmuBackend(threads=0)


def test_a_bad_thread_count_is_a_usage_error(monkeypatch):
    result = CliRunner().invoke(app, ["verify", "relu", "--backend", "emu", "--emu-threads", "0"])
    assert result.exit_code == 2 and "--emu-threads: must be >= 1" in result.output
    monkeypatch.setenv("CAPSULES_EMU_THREADS", "many")
    result = CliRunner().invoke(app, ["verify", "relu", "--backend", "emu", "--quick"])
    assert result.exit_code == 2 and "CAPSULES_EMU_THREADS: must be a whole number" in result.output


POOL_PROBE = """
import os, sys
from capsule_core.backends.emu import EmuBackend
sys.path.insert(0, {tests!r})
from test_emu_threads import forward_and_backward

def os_threads():
    return len(os.listdir("/proc/self/task"))

before = os_threads()
for op in ("relu", "matmul", "softmax", "conv"):
    forward_and_backward(EmuBackend(threads=3), op)
print(os_threads() - before)
"""


def test_every_family_library_shares_one_pool_of_threads(tmp_path):
    """Four family libraries launched on three OS threads add two threads to the process, not two
    per library: each pool thread holds a stack and a guard page per kernel thread, two mappings of
    the 65,530 that vm.max_map_count allows a process."""
    probe = POOL_PROBE.format(tests=str(Path(__file__).parent))
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[-1] == "2"


def test_launches_from_two_host_threads_at_once_both_finish_exactly(family):
    """The pool runs one launch at a time; a launch that finds it busy runs on its own thread."""
    with ThreadPoolExecutor(2) as host:
        runs = [host.submit(launch, EmuBackend(family_dir=family, refs=REFS, threads=3), "shared", 0) for _ in range(4)]
        results = [run.result(timeout=300) for run in runs]
    expected = np.repeat(np.arange(BLOCKS, dtype=np.float32) * 4000, THREADS)
    for y, counter in results:
        assert np.array_equal(y, expected) and counter == BLOCKS * THREADS


EXHAUSTION_PROBE = """
import ctypes, mmap, sys
from pathlib import Path
import numpy as np
from capsule_core.backends.emu import EmuBackend, KernelFault, max_map_count
from capsule_core.kernels.c_types import C_TYPES
sys.path.insert(0, {tests!r})
from test_emu_threads import REFS

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
backend = EmuBackend(family_dir=Path({family!r}), refs=REFS, threads=1)
x, y, counter = (backend.allocate(n) for n in (256, 4 * 256 * 4, 4))
backend.upload(x, np.arange(64, dtype=np.float32))
args = [np.uintp(x), np.uintp(y), np.uintp(counter), C_TYPES["int64_t"].numpy(0)]
backend.launch(REFS[0], (4, 1, 1), (32, 1, 1), 0, args)  # the library loaded, stacks for 32 threads
page = mmap.PAGESIZE
spare = max_map_count() - len(open("/proc/self/maps").readlines()) - 100
filler = libc.mmap(None, 2 * spare * page, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x4000, -1, 0)
for i in range(spare):
    libc.mprotect(filler + 2 * i * page, page, mmap.PROT_READ)
try:
    backend.launch(REFS[0], (4, 1, 1), (256, 1, 1), 0, args)
except KernelFault as fault:
    print("FAULT", fault)
libc.munmap(filler, 2 * spare * page)
backend.launch(REFS[0], (4, 1, 1), (256, 1, 1), 0, args)
out = np.zeros(4 * 256, np.float32)
backend.download(out, y)
assert np.array_equal(out, np.repeat(np.arange(4, dtype=np.float32) * 4000, 256))
print("RECOVERED")
"""


def test_a_process_out_of_mappings_fails_the_launch_not_the_verifier(family):
    """A block whose fibers' stacks cannot be mapped (vm.max_map_count reached) is an error of its
    launch, where it used to abort the process; once mappings are free again the next launch runs."""
    probe = EXHAUSTION_PROBE.format(tests=str(Path(__file__).parent), family=str(family))
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "capsule_threads_shared block (0,0,0): the emulator could not map the stacks of a block of 256" in (
        result.stdout
    ), result.stdout
    assert result.stdout.rstrip().endswith("RECOVERED")
