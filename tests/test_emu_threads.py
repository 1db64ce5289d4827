"""The emulator's blocks on several OS threads (capsule_emu.h's pool): the same bits as one thread
for kernels whose blocks write disjoint memory, shared memory of each block its own, atomics exact
across threads, and a failed launch reporting the first failing block of the schedule whatever ran
beside it."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

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


def test_the_thread_count_is_checked():
    with pytest.raises(CapsuleError, match="--emu-threads: must be >= 1"):
        EmuBackend(threads=0)


def test_a_bad_thread_count_is_a_usage_error(monkeypatch):
    result = CliRunner().invoke(app, ["verify", "relu", "--backend", "emu", "--emu-threads", "0"])
    assert result.exit_code == 2 and "--emu-threads: must be >= 1" in result.output
    monkeypatch.setenv("CAPSULES_EMU_THREADS", "many")
    result = CliRunner().invoke(app, ["verify", "relu", "--backend", "emu", "--quick"])
    assert result.exit_code == 2 and "CAPSULES_EMU_THREADS: must be a whole number" in result.output
