"""cuda/scan.cu without a GPU: it compiles cleanly for sm_80 and sm_90 with the registry's entry
points and fits its launches; the kernels themselves, run on the CPU emulator as the launch plans
launch them (tests/kernel_emu.py: guard bands, NaN-prefilled outputs, inputs checked intact), meet
the error model against the float64 reference on every sample and edge and for any chunk count,
give the spec's test vectors exactly and the same bits for any grid; the chunk algebra of
cuda/scan.cuh (compiled for the host) composes and associates; the launch plans are legal for every
sample."""

import ctypes
import re

import family_checks as fc
import numpy as np
import pytest
from hostmath import F32P, I64P, declare, f32, load, ptr
from kernel_emu import emulator as family_emulator

from capsule_core.kernels.nvcc import cuda_source_dir
from capsule_core.kernels.plans import scan as plans
from capsule_core.ops import get_spec
from capsule_core.ops.base import Sample, seeded_rng, validate

FAMILY = "scan"
OP = "selective_scan"
SOURCE = cuda_source_dir() / "scan.cu"
SYMBOLS = fc.symbols(OP)


# -- the build ------------------------------------------------------------------------------------


def test_the_thread_limit_is_the_plans():
    assert int(re.search(r"kMaxThreads = (\d+);", SOURCE.read_text())[1]) == plans.MAX_THREADS


# -- the kernels themselves, on the CPU emulator ----------------------------------------------------


@pytest.fixture(scope="module")
def emulator():
    """scan.cu on the emu backend, grids capped at 3 blocks: each block walks several tiles."""
    return family_emulator(max_grid=(3, 2))


def force_chunks(monkeypatch, chunks: int):
    """Every plan launched on `chunks` chunks of time (blockDim.y), its channel tile narrowed where
    needed to stay within MAX_THREADS."""
    tile_shape = plans.tile_shape

    def forced(batch, time, dim):
        width = max(1, min(tile_shape(batch, time, dim)[1][0], plans.MAX_THREADS // chunks))
        return (max(1, min(plans.MAX_GRID_BLOCKS, batch * -(-dim // width))), 1, 1), (width, chunks, 1)

    monkeypatch.setattr(plans, "tile_shape", forced)


def check_sample(emulator, sample, label: str = "") -> float:
    """The forward and backward plans of one sample on the emulator (every output written, nothing
    outside, inputs intact) against the reference; returns the worst error over its bound."""
    run = fc.emulate(emulator, OP, sample)
    result = fc.compared(OP, sample, run.y, run.grads, run.g, label)
    assert result.problems == [], "\n".join(result.problems)
    return result.worst


def test_kernels_meet_the_contract(emulator):
    """scan.cu itself, as launched by the plans (blocks of channels by chunks), on every sample and
    edge, forward and backward."""
    worst = max(check_sample(emulator, s) for s in fc.cases(OP))
    assert worst <= 0.5, f"the worst error uses {worst:.2f} of the bound"


@pytest.mark.parametrize("chunks", [1, 3, 7, 64, 256])
def test_kernels_for_any_chunk_count(emulator, chunks, monkeypatch):
    """More chunks than steps (empty chunks), uneven chunks, one chunk (the plain recurrence)."""
    force_chunks(monkeypatch, chunks)
    for sample in fc.cases(OP, ("small", "medium")):
        for plan in fc.case_plans(OP, sample):
            assert plan.launches[0].block[1] == chunks
        check_sample(emulator, sample, f" chunks={chunks}")


def underflowing_decay_product() -> dict:
    """Issue 24 item 8 (`capsules fuzz selective_scan --backend emu --seed 7`, drawn from
    edge-one-step with `a` at extremes), channel (0, :, 38) of its replay: one large input at t = 1,
    A = 0.8226804 but 1e-45 = 2^-149 at t = 19. Every A·h of the recurrence is normal (h[19] =
    -1.04e-36), but chunk [18, 27)'s Π A = 2.94e-46 rounds, factor by factor in plain float32, to
    2^-149 (×0.82 rounds back up), 4.77 times too large, and times the entering state -9.03e8 made
    h[27] = -1.0413467e-36 where the reference is -2.1849653e-37."""
    x = np.zeros((1, 33, 1), np.float32)
    x[0, 1, 0] = 2.9021735e10
    a = np.full((1, 33, 1), 0.8226804, np.float32)
    a[0, 19, 0] = 1e-45
    return {"x": x, "a": a, "b": np.full((1, 33, 1), -0.70698726, np.float32), "h0": f32([[-0.9223675]])}


def test_decay_product_in_the_subnormals_keeps_its_relative_accuracy(emulator, monkeypatch):
    force_chunks(monkeypatch, 4)  # chunks of 9 steps, as the plan of the fuzzed (3, 33, 45) launched it
    inputs = underflowing_decay_product()
    assert inputs["a"][0, 19, 0] == np.float32(2.0**-149)
    y, _ = run_plans(emulator, inputs, np.ones((1, 33, 1), np.float32))
    assert abs(y[0, 27, 0] / -2.1849653e-37 - 1) < 2**-20, y[0, 27, 0]
    # the failing kernel used 1.0000002 of the bound here; a float32 run of the spec formula, 0.035
    assert check_sample(emulator, Sample(inputs, {}, "fuzz", True), " issue 24 item 8") < 0.1
    # The backward's carry map over the same chunk: Π A from t = 26 down, 0.82^7·2^-149, rounds to 0
    # in plain float32, which would drop all of g[27] from the cotangents before t = 18.
    g = np.zeros((1, 33, 1), np.float32)
    g[0, 27, 0] = 1e30
    y, d = run_plans(emulator, inputs, g)
    result = fc.compared(OP, Sample(inputs, {}, "fuzz", True), y, d, g, " issue 24 item 8, g[27] = 1e30")
    assert d["h0"][0, 0] != 0 and result.problems == [] and result.worst < 0.1, result


def test_decay_product_beyond_float32_range_is_applied_exactly(emulator, monkeypatch):
    """Chunks whose Π A overflows (2^90·2^90, 2^200) or underflows (2^-90·2^-90) float32 where the
    recurrence stays normal: the chunked scan still gives the recurrence's result, not ±inf or 0
    times the entering state (powers of two only: every step is exact)."""
    force_chunks(monkeypatch, 3)
    exponents = [90, 90, -90, -90, 50, 50, 50, 50, -90, -90, 90, 90]
    inputs = {
        "x": np.zeros((1, 12, 1), np.float32),
        "a": f32([2.0**e for e in exponents])[None, :, None],
        "b": f32([1]),
        "h0": f32([[2.0**-100]]),
    }
    y, _ = run_plans(emulator, inputs, np.zeros((1, 12, 1), np.float32))
    assert y[0, :, 0].tolist() == [2.0**e for e in np.cumsum([-100] + exponents)[1:].tolist()]


def run_plans(runner, arrays, g):
    """y and the gradients ({"x": dx, ...}) of the plans at cotangent g."""
    y = runner.run(plans.forward(arrays, {}), arrays)["out"]
    grads = runner.run(plans.backward(arrays, {}), {**arrays, "out": y, "g": g})
    return y, {name[1:]: value for name, value in grads.items()}


@pytest.mark.parametrize("chunks", [1, 2, 3, 4, 8])
def test_spec_test_vectors(emulator, chunks, monkeypatch):
    """The spec's vectors are dyadic: every chunked order gives them exactly."""
    force_chunks(monkeypatch, chunks)
    x = f32([[[2, 1], [4, -2], [0, 3]]])
    shared = {"x": x, "a": f32([0.5, 0.25]), "b": f32([1, 2]), "h0": f32([[1, -1]])}
    y, d = run_plans(emulator, shared, np.ones((1, 3, 2), np.float32))
    assert y[0].tolist() == [[2.5, 1.75], [5.25, -3.5625], [2.625, 5.109375]]
    assert d["a"].tolist() == [10.75, -2.6875] and d["b"].tolist() == [9.5, 1.8125]
    assert d["x"][0].tolist() == [[1.75, 2.625], [1.5, 2.5], [1, 2]] and d["h0"].tolist() == [[0.875, 0.328125]]
    token = {
        "x": x,
        "a": f32([[[0.5, 0.25], [0.1, 0.75], [-1, 0.2]]]),
        "b": f32([[[1, 2], [0.5, -1], [0.25, 0.5]]]),
        "h0": f32([[1, -1]]),
    }
    y, _ = run_plans(emulator, token, np.ones((1, 3, 2), np.float32))
    assert np.allclose(y[0], [[2.5, 1.75], [2.25, 3.3125], [-2.25, 2.1625]], rtol=2**-22, atol=0)


def test_results_are_bitwise_independent_of_the_grid():
    """A block walking many tiles computes each as a block of its own would: the same bits for any
    grid (one fixed order of every sum, whatever the scheduling)."""
    for sample in fc.cases(OP, ("small", "medium")):
        arrays, _, out_shape = validate(get_spec(OP), sample.inputs, sample.params, np.float32)
        g = fc.cotangent(OP, sample.case, out_shape)
        y, grads = run_plans(family_emulator((3, 2)), arrays, g)
        for max_grid in ((1, 1), (7, 1)):
            y_other, grads_other = run_plans(family_emulator(max_grid), arrays, g)
            assert fc.same_bits(y, y_other), (sample.case, max_grid)
            for name, value in grads.items():
                assert fc.same_bits(value, grads_other[name]), (sample.case, name, max_grid)


# -- the chunk algebra of scan.cuh, on the host -------------------------------------------------------

I64, I32 = ctypes.c_int64, ctypes.c_int32


@pytest.fixture(scope="module")
def lib(host_build_dir):
    return declare(
        load("scan_host", host_build_dir),
        {
            "host_scan_split": [F32P] * 3 + [I64, I64, ctypes.c_float, F32P],
            "host_scan_associate": [F32P] * 4,
            "host_scan_chunk_range": [I64] * 3 + [I64P, I64P],
        },
    )


def test_chunk_combine_is_associative(lib):
    out = np.empty(4, np.float32)
    # Dyadic summaries: every product and sum exact, so both groupings agree bitwise.
    lib.host_scan_associate(ptr(f32([0.5, 3])), ptr(f32([-0.25, 1.5])), ptr(f32([2, -0.125])), ptr(out))
    assert out[0] == out[2] == np.float32(0.5 * -0.25 * 2) and out[1] == out[3] == np.float32(
        2 * (-0.25 * 3 + 1.5) - 0.125
    )
    rng = seeded_rng(OP, "associate")
    for _ in range(200):
        c = [f32(rng.uniform(-1.5, 1.5, 2)) for _ in range(3)]
        lib.host_scan_associate(ptr(c[0]), ptr(c[1]), ptr(c[2]), ptr(out))
        a3 = np.prod([ci[0].astype(np.float64) for ci in c])
        h3 = c[2][1] + c[2][0] * (c[1][1] + c[1][0] * np.float64(c[0][1]))
        mag = abs(c[2][1]) + abs(c[2][0]) * (abs(c[1][1]) + abs(c[1][0] * np.float64(c[0][1])))
        for a_, h_ in ((out[0], out[1]), (out[2], out[3])):
            assert abs(a_ - a3) <= 2 * 2**-24 * abs(a3) and abs(h_ - h3) <= 4 * 2**-24 * mag


def test_split_summaries_compose_to_the_recurrence(lib):
    """Summarise steps [0, s) and [s, n), combine, apply to h: the plain recurrence (exactly at
    s = 0 and s = n, where one side is the identity)."""
    rng = seeded_rng(OP, "split")
    n = 50
    a, b, x = f32(rng.uniform(-1, 1, n)), f32(rng.uniform(-1, 1, n)), f32(rng.standard_normal(n))
    h = np.float32(0.75)
    seq = np.empty(3, np.float32)
    lib.host_scan_split(ptr(a), ptr(b), ptr(x), n, n, h, ptr(seq))
    ref, mag = np.float64(h), abs(np.float64(h))
    for i in range(n):
        ref = a[i] * ref + np.float64(b[i]) * x[i]
        mag = abs(a[i]) * mag + abs(np.float64(b[i]) * x[i])
    out = np.empty(3, np.float32)
    for split in (0, 1, 17, n - 1, n):
        lib.host_scan_split(ptr(a), ptr(b), ptr(x), n, split, h, ptr(out))
        if split in (0, n):
            assert out.tolist() == seq.tolist()
        assert abs(out[2] - ref) <= (4 + 2 * n) * 2**-24 * mag


def test_chunks_cover_time_once_in_order(lib):
    lo, hi = np.empty(1, np.int64), np.empty(1, np.int64)
    for time, chunks in ((0, 1), (0, 8), (5, 1), (5, 8), (33, 4), (4096, 32), (300, 32)):
        covered = []
        for j in range(chunks):
            lib.host_scan_chunk_range(time, chunks, j, ptr(lo), ptr(hi))
            covered += range(lo[0], hi[0])
        assert covered == list(range(time))


# -- launch plans -----------------------------------------------------------------------------------


def _backward_reads_the_forward_result(case):
    shared = case.arrays["a"].ndim == 1 or case.arrays["b"].ndim == 1
    assert [launch.symbol for launch in case.backward.launches] == (
        ["capsule_selective_scan_bwd"] + ["capsule_selective_scan_bwd_shared"] * shared
    )
    assert case.backward.buffer("out").role == "input", "the backward reads h[t-1] from the forward's result"


def test_plans_are_legal_for_every_sample():
    assert fc.plan_case_problems(OP, check=_backward_reads_the_forward_result) == []


def test_tile_shapes():
    for (batch, time, dim), block in (
        ((4, 2048, 256), (8, 32, 1)),
        ((1, 4096, 8), (8, 32, 1)),
        ((2, 5, 3), (4, 1, 1)),
        ((1, 33, 1), (1, 4, 1)),
        ((2, 0, 3), (4, 1, 1)),
        ((0, 7, 3), (4, 1, 1)),
        ((2, 300, 50), (8, 32, 1)),
    ):
        grid, got = plans.tile_shape(batch, time, dim)
        assert got == block, (batch, time, dim)
        assert grid[0] == max(1, min(plans.MAX_GRID_BLOCKS, batch * -(-dim // block[0])))


def test_planted_launch_faults_are_caught():
    zeros = {"x": (2, 5, 3), "a": 3, "b": 3, "h0": (2, 3)}
    _, plan = fc.launch_plans(OP, {name: np.zeros(shape, np.float32) for name, shape in zeros.items()})
    launch = plan.launches[0]
    faults = [
        ("2048 threads", {"block": (64, 32, 1)}),
        ("writable", {"args": (*launch.args[:6], "x", *launch.args[7:])}),
        ("a_per_token", {"args": (*launch.args[:-2], 2**40, launch.args[-1])}),
        ("not declared", {"symbol": "capsule_selective_scan_bwd_x"}),
    ]
    assert fc.missed_launch_faults(plan, SYMBOLS, faults) == []
