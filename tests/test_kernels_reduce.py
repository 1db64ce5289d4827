"""cuda/reduce.cu without a GPU: the build, the registry's entry points, the launch plans (one or
two launches), the math and index arithmetic of cuda/reduce.cuh compiled for the host, and the
kernels themselves run on the CPU emulator against the float64 reference."""

import ctypes

import family_checks as fc
import numpy as np
import pytest
from hostmath import f32_ptr, load
from kernel_emu import emulator as family_emulator

from capsule_core.catalog import reference
from capsule_core.kernels.plans import reduce as plans
from capsule_core.ops.base import Sample

FAMILY = "reduce"
OPS = ("reduce_sum", "reduce_mean")
I64 = ctypes.POINTER(ctypes.c_int64)


@pytest.fixture(scope="module")
def lib(host_build_dir):
    lib = load("reduce_host", host_build_dir)
    lib.host_inverse_count.restype = ctypes.c_float
    lib.host_inverse_count.argtypes = [ctypes.c_int64]
    lib.host_mean.argtypes = [
        ctypes.POINTER(ctypes.c_float),
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.POINTER(ctypes.c_float),
    ]
    lib.host_reduce_path.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int, I64]
    lib.host_segments.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, I64]
    lib.host_broadcast_walk.argtypes = [ctypes.c_int64] * 5 + [I64]
    lib.host_reduce_split.argtypes = [ctypes.c_uint64, ctypes.c_int64, I64]
    return lib


@pytest.fixture(scope="module")
def emulator():
    return family_emulator()


def _i64(n):
    return np.zeros(n, np.int64)


def _ptr(a):
    return a.ctypes.data_as(I64)


# -- build and entry points ---------------------------------------------------------------------


# -- launch plans ------------------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_plans_are_legal_for_every_sample_and_edge(op):
    assert fc.plan_case_problems(op) == []


def test_planted_plan_faults_are_caught():
    x = np.zeros((4, 7), np.float32)
    plan = plans.PLANS["reduce_mean"][0]({"x": x}, {"axis": 1})
    launch = plan.launches[0]
    faults = [("count = 0.5", {"args": launch.args[:-1] + (0.5,)})]
    assert fc.missed_launch_faults(plan, fc.symbols("reduce_mean"), faults) == []


def _shaped(shape):
    """A float32 input of `shape` that allocates nothing (plans read shapes only)."""
    return np.broadcast_to(np.float32(0), shape)


def _geometry_args(launch):
    """A forward launch's arguments as capsule_<op>_fwd's: (x, y, outer, size, inner, chunk[, count]);
    the block-per-segment kernel takes no inner (it is 1)."""
    if launch.symbol.endswith("_fwd_block"):
        return launch.args[:4] + (1,) + launch.args[4:]
    return launch.args


@pytest.mark.parametrize(
    "shape, axis, two",
    [
        ((7,), None, False),
        ((1024, 4099), -1, False),
        ((100_003,), None, True),
        ((4_000_037,), None, True),
        ((3, 100_001), -1, True),
        ((4097,), 0, True),
        ((100_000, 3), 0, True),
        ((64, 129), 0, False),
        ((2, 0, 3), 1, False),
        ((5000, 0), 0, False),
        ((0, 5000), 1, False),
        ((1025, 0, 2), 0, False),
    ],
)
def test_few_outputs_over_a_long_axis_take_two_launches(shape, axis, two):
    x = np.zeros(shape, np.float32)
    for op in OPS:
        plan = plans.PLANS[op][0]({"x": x}, {"axis": axis})
        assert len(plan.launches) == (2 if two else 1)
        outer, size, inner = plans.geometry(shape, axis)
        if two:
            first, second = (_geometry_args(launch) for launch in plan.launches)
            chunk = first[5]
            chunks = plans.chunks_of(size, chunk)
            assert chunk % plans.CHUNK_QUANTUM == 0 and 2 <= chunks <= plans.TARGET_BLOCKS
            assert first[:5] == ("x", "partials", outer, size, inner)
            assert second[:6] == ("partials", "out", outer, chunks, inner, chunks)
            assert plan.buffer("partials").elements == outer * chunks * inner
            if op == "reduce_mean":
                assert (first[6], second[6]) == (1, size)
        elif op == "reduce_mean":
            assert _geometry_args(plan.launches[0])[5:] == (size, size)


def test_plans_size_the_grid_by_the_kernels_path():
    assert plans.grid(3, 5, 1, 5) == (1, 1, 1)  # row groups of 8 lanes: 256 segments a block
    assert plans.grid(10_000, 5, 1, 5) == (40, 1, 1)
    assert plans.grid(10_000, 100, 1, 100) == (1250, 1, 1)  # a warp per segment
    assert plans.grid(1024, 4099, 1, 4099) == (1024, 1, 1)  # a block per row
    assert plans.grid(1, 37, 5, 37) == (1, 1, 1)  # one tile
    assert plans.grid(1, 64, 129, 64) == (5, 1, 1)  # tiles of 32 outputs
    assert plans.grid(100, 3, 1000, 3) == (-(-100_000 // 256), 1, 1)  # a thread per output
    assert plans.grid(10**7, 2000, 1, 2000) == (plans.MAX_BLOCKS, 1, 1)


@pytest.mark.parametrize(
    "shape, axis, symbols",
    [
        ((2**28,), None, ("fwd_block", "fwd_block")),  # 1053 chunks, then their sum in one block
        ((1024, 4099), -1, ("fwd_block",)),  # a block per row
        ((3, 100_001), -1, ("fwd_block", "fwd")),  # chunks of 2048 (49 a row), then their sums: groups
        ((10_000, 100), -1, ("fwd",)),  # a warp per row
        ((100_000, 3), 0, ("fwd", "fwd")),  # tiles, then columns
        ((64, 129), 0, ("fwd",)),
    ],
)
def test_plans_launch_the_block_per_segment_path_through_its_own_kernel(shape, axis, symbols):
    for op in OPS:
        plan = plans.PLANS[op][0]({"x": _shaped(shape)}, {"axis": axis})
        assert tuple(launch.symbol for launch in plan.launches) == tuple(f"capsule_{op}_{s}" for s in symbols)
        for launch in plan.launches:
            outer, size, inner, chunk = _geometry_args(launch)[2:6]
            span = size if plans.chunks_of(size, chunk) == 1 else chunk
            assert (plans.path(span, inner) == plans.ROW_BLOCK) == launch.symbol.endswith("_fwd_block")


def test_a_full_reduction_fills_the_device_with_lean_blocks():
    """reduce_sum of 2^28 floats: one wave of the block-per-segment kernel, eight blocks per
    multiprocessor of an H200 (132), built for eight (its 32-register budget)."""
    plan = plans.PLANS["reduce_sum"][0]({"x": _shaped((2**28,))}, {"axis": None})
    first = plan.launches[0]
    assert 132 <= first.grid[0] <= plans.TARGET_BLOCKS == 8 * 132
    assert plans.BUDGET.registers_for(first.symbol) == 32 and plans.BUDGET.registers_for("capsule_reduce_sum_fwd") == 64


def test_python_mirror_of_the_path_choice_matches_the_header(lib):
    assert lib.host_reduce_threads() == plans.THREADS
    out = _i64(7)
    for size in (0, 1, 2, 5, 31, 32, 33, 100, 1024, 1025, 4099, 100_003):
        for inner in (1, 2, 5, 31, 32, 33, 129):
            for chunk in (0, size, 1, 7, 1024, 10**9):
                lib.host_reduce_path(size, inner, chunk, plans.THREADS, _ptr(out))
                chunks, span = plans.chunks_of(size, chunk), (size if plans.chunks_of(size, chunk) == 1 else chunk)
                assert out[:3].tolist() == [chunks, span, plans.path(span, inner)]
                assert out[3] == plans.lanes(span) and out[4] == plans.tile_width(inner) and out[6] == plans.batch(span)
                assert out[4] * out[5] <= plans.THREADS < out[4] * out[5] * 2


# -- math and index arithmetic on the host --------------------------------------------------------


def test_host_inverse_count_and_mean_follow_the_reference(lib):
    assert np.isinf(lib.host_inverse_count(0))
    for n in (1, 2, 3, 7, 10, 4099, 100_003, 2**24 + 1, 2**40 + 3):
        assert np.float32(lib.host_inverse_count(n)) == np.float32(1.0 / n)
    sums = np.float32([0.0, -0.0, 1.0, -6.5, 3e38, np.inf, np.nan, 1e-45])
    out = np.empty_like(sums)
    lib.host_mean(f32_ptr(sums), 0, sums.size, f32_ptr(out))
    assert np.isnan(out[:2]).all()  # an empty mean (its sum is ±0) is NaN: 0 * (1/0), never 0
    lib.host_mean(f32_ptr(sums), 3, sums.size, f32_ptr(out))
    with np.errstate(invalid="ignore"):
        r = sums.astype(np.float64) * (1.0 / 3)
    assert np.array_equal(np.isnan(out), np.isnan(r))
    finite = np.isfinite(r)
    assert np.all(np.abs(out[finite] - r[finite]) <= 2 * 2.0**-24 * np.abs(r[finite]) + 2.0**-149)
    lib.host_mean(f32_ptr(sums), 1, sums.size, f32_ptr(out))
    assert np.array_equal(out.view(np.uint32), sums.view(np.uint32))  # the partials' scaling is exact


def test_host_segments_tile_the_axis(lib):
    for outer, size, chunk in ((1, 10, 3), (3, 10, 4), (2, 4097, 1024), (4, 5, 0), (2, 0, 0), (1, 7, 7)):
        chunks = plans.chunks_of(size, chunk)
        out = _i64(3 * outer * chunks)
        lib.host_segments(size, chunk, outer * chunks, _ptr(out))
        seen = {}
        for o, start, length in out.reshape(-1, 3).tolist():
            seen.setdefault(o, []).append((start, length))
        assert sorted(seen) == list(range(outer))
        for parts in seen.values():
            covered = [i for start, length in parts for i in range(start, start + length)]
            assert covered == list(range(size)) and len(parts) == chunks


@pytest.mark.parametrize(
    "outer, size, inner", [(1, 1, 1), (3, 5, 1), (2, 3, 4), (1, 64, 129), (5, 1, 7), (7, 3, 1), (3, 37, 5), (2, 2, 2)]
)
def test_host_backward_walk_matches_division(lib, outer, size, inner):
    n = outer * size * inner
    for first, stride in ((0, 1), (1, 3), (2, 7), (0, 1000)):
        groups = (n + 3) // 4
        count = max(0, -(-(groups - first) // stride))
        out = _i64(4 * count)
        lib.host_broadcast_walk(first, stride, count, size, inner, _ptr(out))
        e = (4 * (first + stride * np.arange(count))[:, None] + np.arange(4)).reshape(-1)
        want = (e // (size * inner)) * inner + e % inner
        valid = e < n
        assert np.array_equal(out[valid], want[valid])


def test_host_split_covers_the_segment(lib):
    out = _i64(2)
    for addr in range(4096, 4096 + 32, 4):
        for length in (0, 1, 3, 4, 5, 9, 100):
            lib.host_reduce_split(addr, length, _ptr(out))
            head, body4 = out.tolist()
            assert 0 <= head <= 3 and 0 <= length - head - 4 * body4 < 4
            if head < length:
                assert (addr + 4 * head) % 16 == 0


# -- the kernels on the CPU emulator --------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_emulated_kernels_match_the_reference(emulator, op):
    problems = []
    for sample in fc.cases(op, ("small", "medium", "large")):
        problems += fc.emulated_problems(emulator, op, sample)
    assert problems == []


@pytest.mark.parametrize("op", OPS)
def test_emulated_kernels_every_path_and_two_launches(emulator, op):
    """Shapes for each path, with chunking along inner > 1 too, and odd lengths everywhere."""
    rng = np.random.default_rng(3)
    problems = []
    for shape, axis in (
        ((100_000, 3), 0),
        ((9000, 40), 0),
        ((5, 7000, 3), 1),
        ((33, 1025), 1),
        ((2, 33, 2), 1),
        ((1, 31, 70), 1),
        ((3, 1, 5), 1),
        ((6000,), 0),
        ((1025, 0, 2), 0),
        ((0, 5000), 1),
        ((5000, 0), 0),
    ):
        x = (2.0 * rng.standard_normal(shape)).astype(np.float32)
        problems += fc.emulated_problems(emulator, op, Sample({"x": x}, {"axis": axis}, f"path-{shape}-{axis}"))
    assert problems == []


@pytest.mark.parametrize("op", OPS)
def test_emulated_kernels_with_misaligned_buffers(emulator, op):
    problems = []
    for sample in fc.cases(op, ("small", "medium")):
        for misalign in ({"x": 1, "out": 3, "partials": 2, "g": 1, "dx": 2}, {"x": 3, "dx": 1}):
            problems += fc.emulated_problems(emulator, op, sample, misalign)
    assert problems == []


def test_emulated_kernels_are_deterministic(emulator):
    x = np.random.default_rng(8).standard_normal(300_001).astype(np.float32)
    plan = plans.PLANS["reduce_sum"][0]({"x": x}, {"axis": None})
    first = emulator.run(plan, {"x": x})["out"]
    again = emulator.run(plan, {"x": x})["out"]
    assert np.array_equal(first.view(np.uint32), again.view(np.uint32))
    assert abs(float(first) - float(reference.forward("reduce_sum", {"x": x}))) < 1e-2
