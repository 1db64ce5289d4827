"""The emulator's atomics (CUDA's semantics, on CUDA's types) and its schedules: blocks and
threads in index order, reversed or shuffled, so that a result that depends on the order (a float
atomicAdd sum) changes its bits here as it would between two GPU runs; under racecheck an atomic
is synchronisation, not a race."""

from __future__ import annotations

import numpy as np
import pytest

from capsule_core.backends.emu import EmuBackend
from capsule_core.kernels.c_types import C_TYPES
from capsule_core.model import NativeSymbolRef
from capsule_core.sanitize import engine as sanitize

ATOMICS = r"""
#include <cstdint>
// Every atomic of CUDA's list, on the values a test can predict.
extern "C" __global__ void capsule_atomics_fwd(const float* __restrict__ x, float* __restrict__ sum,
                                               int* __restrict__ ints, unsigned int* __restrict__ words, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        atomicAdd(sum, x[i]);
        atomicMax(ints, static_cast<int>(x[i]));
        atomicMin(ints + 1, static_cast<int>(x[i]));
        atomicInc(words, 1000000u);
        atomicAdd(ints + 2, 1);
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        ints[3] = static_cast<int>(atomicExch(words + 1, 7u));
        atomicCAS(words + 2, 0u, 5u);
        atomicCAS(words + 3, 1u, 9u);
        atomicOr(words + 4, 6u);
        atomicAnd(words + 5, 3u);
        atomicXor(words + 6, 5u);
        atomicSub(words + 7, 2u);
        atomicDec(words + 8, 4u);
        atomicDec(words + 9, 4u);
        atomicInc(words + 10, 3u);
    }
}
// The same sum in one fixed order: one thread walks the elements.
extern "C" __global__ void capsule_atomics_ordered(const float* __restrict__ x, float* __restrict__ sum,
                                                   int* __restrict__ ints, unsigned int* __restrict__ words, int64_t n) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        float s = 0.0f;
        for (int64_t i = 0; i < n; ++i) s += x[i];
        *sum = s;
    }
}
// A block's sum in shared memory: by atomicAdd (synchronised), or by a plain += (a race).
extern "C" __global__ void capsule_atomics_shared(const float* __restrict__ x, float* __restrict__ sum,
                                                  int* __restrict__ ints, unsigned int* __restrict__ words, int64_t n) {
    __shared__ float acc;
    if (threadIdx.x == 0) acc = 0.0f;
    __syncthreads();
    if (threadIdx.x < n) {
        if (ints[0] != 0) acc += x[threadIdx.x];
        else atomicAdd(&acc, x[threadIdx.x]);
    }
    __syncthreads();
    if (threadIdx.x == 0) *sum = acc;
}
"""
PARAMS = (
    "const float* __restrict__ x",
    "float* __restrict__ sum",
    "int* __restrict__ ints",
    "unsigned int* __restrict__ words",
    "int64_t n",
)
REFS = tuple(NativeSymbolRef("cuda/atomics.cu", f"capsule_atomics_{k}", PARAMS) for k in ("fwd", "ordered", "shared"))


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    folder = tmp_path_factory.mktemp("atomics")
    (folder / "atomics.cu").write_text(ATOMICS)
    return folder


def run(backend, kernel: str, x: np.ndarray, grid: int, block: int, ints=(0, 0, 0, 0), words=(0,) * 11):
    """The kernel over x with the given starting ints and words: (sum, ints, words) after it."""
    arrays = {
        "x": x,
        "sum": np.zeros(1, np.float32),
        "ints": np.array(ints, np.int32),
        "words": np.array(words, np.uint32),
    }
    addresses = {name: backend.allocate(a.nbytes) for name, a in arrays.items()}
    for name, a in arrays.items():
        backend.upload(addresses[name], a)
    ref = next(r for r in REFS if r.symbol == f"capsule_atomics_{kernel}")
    args = [np.uintp(addresses[name]) for name in arrays] + [C_TYPES["int64_t"].numpy(x.size)]
    backend.launch(ref, (grid, 1, 1), (block, 1, 1), 0, args)
    backend.synchronize()
    for name, a in arrays.items():
        backend.download(a, addresses[name])
        backend.free(addresses[name])
    return arrays["sum"][0], arrays["ints"], arrays["words"]


def test_atomics_follow_cuda(family):
    backend = EmuBackend(family_dir=family, refs=REFS)
    x = np.arange(-50, 50, dtype=np.float32)
    total, ints, words = run(
        backend, "fwd", x, 3, 32, ints=(-1000, 1000, 0, 0), words=(0, 1, 0, 0, 1, 6, 6, 10, 0, 3, 3)
    )
    assert total == np.float32(x.sum())
    assert ints.tolist() == [49, -50, 100, 1]  # max, min, count, the old value atomicExch returned
    # inc, exch, CAS (matched, unmatched), or, and, xor, sub, dec (from 0 wraps to 4), dec, inc (at the limit wraps)
    assert words.tolist() == [100, 7, 5, 0, 7, 2, 3, 8, 4, 2, 0]


def test_a_float_atomic_sum_depends_on_the_schedule_and_a_fixed_order_does_not(family):
    backend = EmuBackend(family_dir=family, refs=REFS)
    x = np.tile(np.float32([1e8, 1.0, -1e8, 3.0, 0.5]), 40)
    sums = {}
    for order in ("index", "reversed", "shuffled"):
        backend.order, backend.order_seed = order, 7
        sums[order] = (run(backend, "fwd", x, 4, 32)[0], run(backend, "ordered", x, 4, 32)[0])
    atomic = {order: s[0].tobytes() for order, s in sums.items()}
    fixed = {order: s[1].tobytes() for order, s in sums.items()}
    assert len(set(atomic.values())) > 1, f"the atomic sum gave the same bits under every schedule: {sums}"
    assert len(set(fixed.values())) == 1
    backend.order = "index"
    first = run(backend, "fwd", x, 4, 32)[0]
    with backend.other_schedule():
        assert backend.order == "reversed"
        second = run(backend, "fwd", x, 4, 32)[0]
    assert backend.order == "index" and first.tobytes() != second.tobytes()


@pytest.mark.parametrize("racy, found", [(0, False), (1, True)])
def test_racecheck_sees_an_atomic_as_synchronisation(family, racy, found):
    why = sanitize.unavailable("racecheck")
    if why:
        pytest.skip(why)
    backend = sanitize.backend_for("racecheck", family, REFS)
    x = np.ones(32, np.float32)
    if found:
        with pytest.raises(sanitize.SanitizerFinding, match="data race on shared memory"):
            run(backend, "shared", x, 1, 32, ints=(racy, 0, 0, 0))
    else:
        assert run(backend, "shared", x, 1, 32, ints=(racy, 0, 0, 0))[0] == 32.0
