"""cuda/norm.cu without a GPU: it compiles cleanly for sm_80 and sm_90 with the registry's entry
points and fits its launches; the kernels' per-element math (cuda/norm.cuh), run on the host in
the kernels' reduction order (member partials, warp butterflies, warps and parts in order), meets
each op's error model against the float64 reference; norm.cu itself runs the plans on the CPU
emulator (tests/kernel_emu.py) bitwise like that host model, within bounds and writing every
output; the launch plans are legal for every sample."""

import ctypes
import re

import family_checks as fc
import numpy as np
import pytest
from hostmath import F32P, I64P, declare, f32, load, ptr
from kernel_emu import emulator as family_emulator

from capsule_core.kernels.nvcc import cuda_source_dir
from capsule_core.kernels.plans import norm as plans
from capsule_core.ops import get_spec
from capsule_core.ops.base import seeded_rng, validate

FAMILY = "norm"
OPS = ("layer_norm", "batch_norm")
SOURCE = cuda_source_dir() / "norm.cu"


# -- the build ------------------------------------------------------------------------------------


def test_plan_constants_match_the_kernels():
    text = SOURCE.read_text()
    assert int(re.search(r"kWarpRowMax = (\d+);", text)[1]) == plans.WARP_ROW_MAX
    assert int(re.search(r"kMaxThreads = (\d+);", text)[1]) >= plans.BLOCK
    assert plans.BLOCK % 32 == 0 and plans.COLUMN_TILE * plans.ROW_LANES <= plans.BLOCK
    assert int(re.search(r"kWideMaxThreads = (\d+);", text)[1]) == plans.WIDE_MAX_THREADS
    assert 4 * int(re.search(r"kWideFwdGroups = (\d+);", text)[1]) == plans.WIDE_FWD_FLOATS
    assert 4 * int(re.search(r"kWideBwdGroups = (\d+);", text)[1]) == plans.WIDE_BWD_FLOATS
    assert plans.WIDE_MIN_THREADS % 32 == 0 and plans.WIDE_MAX_THREADS % 32 == 0


# -- the per-element math and reduction order, on the host ----------------------------------------

I64 = ctypes.c_int64


@pytest.fixture(scope="module")
def lib(host_build_dir):
    return declare(
        load("norm_host", host_build_dir),
        {
            "host_welford": [F32P, I64, F32P],
            "host_welford_split": [F32P, I64, I64, F32P],
            "host_norm_rows": [F32P] * 6 + [I64],
            "host_norm_dx": [F32P] * 6 + [I64],
            "host_channel_walk": [I64] * 5 + [I64P, I64P],
            "host_channel_next": [I64] * 5 + [I64P, I64P],
            "host_plane_walk": [I64] * 6 + [I64P],
            "host_part_range": [I64] * 3 + [I64P, I64P],
        },
    )


def test_host_layer_norm_row_paths_are_all_exercised():
    """The samples reach the warp path (vector and scalar), the wide kernels (a block of 128 and of
    more threads, several parts of several rows) and the streamed path, for rows of cols % 4 != 0
    and for rows wider than a wide block holds."""
    shapes = {s.inputs["x"].shape for s in fc.cases("layer_norm")}
    widths = {shape[-1] for shape in shapes}
    assert any(w <= plans.WARP_ROW_MAX and w % 4 == 0 for w in widths)
    assert any(w <= plans.WARP_ROW_MAX and w % 4 for w in widths)
    for floats in (plans.WIDE_FWD_FLOATS, plans.WIDE_BWD_FLOATS):
        assert any(plans.wide_threads(w, floats) == plans.WIDE_MIN_THREADS for w in widths)
        assert any(plans.wide_threads(w, floats) > plans.WIDE_MIN_THREADS for w in widths)
    assert any(
        plans.wide_threads(s[-1], plans.WIDE_BWD_FLOATS)
        and int(np.prod(s[:-1])) > plans.wide_parts(int(np.prod(s[:-1])), 128) > 1
        for s in shapes
    )
    assert any(w > plans.WARP_ROW_MAX and w % 4 for w in widths)
    assert any(w > plans.WIDE_FWD_MAX and w % 4 == 0 for w in widths)


def test_constant_rows_have_exact_statistics(lib):
    """Welford on equal values keeps the mean exact and M2 zero, split or not."""
    out = np.empty(2, np.float32)
    for c in (0.1, -3.7, 1e4, 1e-40, 0.0):
        v = np.full(37, c, np.float32)
        lib.host_welford(ptr(v), v.size, ptr(out))
        assert out[0] == np.float32(c) and out[1] == 0.0
        lib.host_welford_split(ptr(v), v.size, 11, ptr(out))
        assert out[0] == np.float32(c) and out[1] == 0.0


def test_welford_merge_matches_float64_statistics(lib):
    rng = seeded_rng("norm", "welford")
    out = np.empty(2, np.float32)
    for n, offset in ((1, 0.0), (2, 0.0), (100, 0.0), (1000, 1e4), (4099, -3.0)):
        v = f32(offset + rng.standard_normal(n))
        v64 = v.astype(np.float64)
        mean, m2 = v64.mean(), ((v64 - v64.mean()) ** 2).sum()
        for split in (0, 1, n // 3, n):
            lib.host_welford_split(ptr(v), n, split, ptr(out))
            # Welford's error model (ops/norm.py): the mean within c·u·mean|x|, M2 within c·u·(M2 + n·A·s).
            c = 10 + 10 * np.sqrt(n)
            scale = np.abs(v64).mean()
            assert abs(out[0] - mean) <= c * 2**-24 * scale + 1e-45
            assert abs(out[1] - m2) <= c * 2**-24 * (m2 + n * scale * np.sqrt(m2 / n)) + 1e-45


def test_normalise_affine_and_backward_formulas(lib):
    """y = x̂·gamma + beta and dx = (ĝ − m1 − x̂·m2)·rstd elementwise: within 3 roundings."""
    rng = seeded_rng("norm", "formulas")
    n = 4096
    x, mean, rstd, gamma, beta = (f32(rng.standard_normal(n) * s) for s in (3.0, 1.0, 2.0, 1.5, 0.5))
    rstd = np.abs(rstd) + np.float32(0.1)
    y = np.empty(n, np.float32)
    lib.host_norm_rows(ptr(x), ptr(mean), ptr(rstd), ptr(gamma), ptr(beta), ptr(y), n)
    x64, xhat = x.astype(np.float64), (x.astype(np.float64) - mean) * rstd
    ref = xhat * gamma + beta
    mag = (np.abs(x64) + np.abs(mean)) * rstd * np.abs(gamma) + np.abs(beta)
    assert np.all(np.abs(y - ref) <= 3 * 2**-24 * mag)
    ghat, m1, m2 = (f32(rng.standard_normal(n)) for _ in range(3))
    xh = f32(xhat)
    dx = np.empty(n, np.float32)
    lib.host_norm_dx(ptr(xh), ptr(ghat), ptr(rstd), ptr(m1), ptr(m2), ptr(dx), n)
    ref = (ghat.astype(np.float64) - m1 - xh.astype(np.float64) * m2) * rstd
    mag = (np.abs(ghat) + np.abs(m1) + np.abs(xh.astype(np.float64) * m2)) * rstd
    assert np.all(np.abs(dx - ref) <= 3 * 2**-24 * mag)


@pytest.mark.parametrize("C,S", [(1, 1), (3, 1), (1, 5), (4, 7), (64, 1), (5, 1024)])
def test_index_walkers_agree_with_division(lib, C, S):
    total = 3 * C * S + 5
    count = 40
    c, s = np.empty(count, np.int64), np.empty(count, np.int64)
    for first in (0, 1, S, C * S - 1, 2 * C * S + 3):
        for step in (1, 3, S, C * S, 4 * 256, 7 * C * S + 2):
            lib.host_channel_walk(first, step, C, S, count, ptr(c), ptr(s))
            i = first + step * np.arange(count)
            assert (c == (i // S) % C).all() and (s == i % S).all(), (first, step)
            for ch in (0, C - 1):
                offsets = np.empty(count, np.int64)
                lib.host_plane_walk(first, step, ch, C, S, count, ptr(offsets))
                assert (offsets == ((i // S) * C + ch) * S + i % S).all(), (first, step, ch)
        lib.host_channel_next(first % S, (first // S) % C, C, S, count, ptr(c), ptr(s))
        i = first + np.arange(count)
        assert (c == (i // S) % C).all() and (s == i % S).all()
    assert total > 0


def test_parts_cover_each_range_once_in_order(lib):
    lo, hi = np.empty(1, np.int64), np.empty(1, np.int64)
    for total, parts in ((0, 1), (1, 1), (10, 3), (10, 10), (10, 17), (4096, 7)):
        covered = []
        for p in range(parts):
            lib.host_part_range(total, parts, p, ptr(lo), ptr(hi))
            assert 0 <= lo[0] <= hi[0] <= total
            covered += range(lo[0], hi[0])
        assert covered == list(range(total))


# -- the kernels themselves, on the CPU emulator -----------------------------------------------------


@pytest.fixture(scope="module")
def emulator():
    return family_emulator(max_grid=(3, 2))


def emulated_cases(spec):
    """Small samples, the medium ones that reach other row paths, and every edge."""
    medium = [s for s in spec.samples("medium", seeded_rng(spec.name, "medium")) if s.inputs["x"].size <= 80_000]
    return spec.samples("small", seeded_rng(spec.name, "small")) + medium + spec.edges()


@pytest.mark.parametrize("op", OPS)
def test_kernels_on_the_emulator(emulator, op):
    """norm.cu itself, as launched by the plans, like every other family: every output written,
    nothing outside, inputs intact, values within the error model (worst at most half the bound),
    with aligned buffers (the float4 paths) and misaligned ones, and bitwise the same when run
    again with blocks and threads in reversed order (the reductions' order is the kernels' own)."""
    spec = get_spec(op)
    problems, worst = [], 0.0
    for sample in emulated_cases(spec):
        run = fc.emulate(emulator, op, sample)
        result = fc.compared(op, sample, run.y, run.grads, run.g)
        problems += result.problems
        worst = max(worst, result.worst)
        with emulator.device.other_schedule():
            again = fc.emulate(emulator, op, sample)
        assert fc.same_bits(again.y, run.y), f"{op} {sample.case}: the forward changed under another schedule"
        for name in spec.differentiable:
            assert fc.same_bits(again.grads[name], run.grads[name]), f"{op} d{name} {sample.case}"
        problems += fc.emulated_problems(emulator, op, sample, {"x": 1, "out": 3, "dx": 1})
    assert problems == []
    assert worst <= 0.5, f"{op}: the worst error uses {worst:.2f} of the bound"


# -- launch plans -----------------------------------------------------------------------------------


def _whole_warps_and_inputs_only(case):
    for plan in case.plans:
        for launch in plan.launches:
            assert int(np.prod(launch.block)) % 32 == 0, launch
    spec = get_spec(case.forward.op)
    assert {b.name for b in case.backward.buffers if b.role == "input"} <= {t.name for t in spec.inputs} | {"g"}


@pytest.mark.parametrize("op", OPS)
def test_plans_are_legal_for_every_sample(op):
    assert fc.plan_case_problems(op, reference_shapes=np.inf, check=_whole_warps_and_inputs_only) == []


def _normed_inputs(op: str, shape) -> dict:
    """x of `shape` (zeros) with gamma ones and beta zeros over the axis the op normalizes along
    (layer_norm's last, batch_norm's channels): what a plan reads is shapes only."""
    features = shape[-1] if op == "layer_norm" else shape[1]
    return {
        "x": np.zeros(shape, np.float32),
        "gamma": np.ones(features, np.float32),
        "beta": np.zeros(features, np.float32),
    }


def test_plans_shape_the_launches_as_the_kernels_expect():
    spec = get_spec("layer_norm")
    for shape, per_block in (((4096, 64), 8), ((10, 256), 8), ((10, 257), 1), ((3, 100_000), 1)):
        arrays, p, _ = validate(spec, _normed_inputs("layer_norm", shape), {}, np.float32)
        (launch,) = plans.layer_norm_forward(arrays, p).launches
        assert launch.symbol == "capsule_layer_norm_fwd" and launch.block == (plans.BLOCK, 1, 1)
        assert launch.grid[0] == min(plans.MAX_GRID_BLOCKS, -(-shape[0] // per_block))
        bwd = plans.layer_norm_backward(arrays, p)
        assert [launch.symbol for launch in bwd.launches] == [
            "capsule_layer_norm_bwd_x",
            "capsule_layer_norm_bwd_partials",
            "capsule_layer_norm_bwd_params",
        ]
        parts = bwd.launches[1].args[-1]
        assert bwd.buffer("partial").elements == 2 * parts * shape[-1] and bwd.launches[1].grid[1] == parts
    # wide rows: a block per row (forward) or per part of the rows (backward), each thread holding
    # at most WIDE_FWD_FLOATS (WIDE_BWD_FLOATS) of the row; the backward fills one wave
    for shape, fwd_threads, bwd_threads in (
        ((4096, 8192), 512, 1024),
        ((4096, 4096), 256, 512),
        ((7, 260), 128, 128),
        ((64, 16384), 1024, 0),
    ):
        arrays, p, _ = validate(spec, _normed_inputs("layer_norm", shape), {}, np.float32)
        (launch,) = plans.layer_norm_forward(arrays, p).launches
        assert (launch.symbol, launch.block, launch.grid) == (
            "capsule_layer_norm_fwd_wide",
            (fwd_threads, 1, 1),
            (shape[0], 1, 1),
        )
        assert fwd_threads * plans.WIDE_FWD_FLOATS >= shape[-1]
        bwd = plans.layer_norm_backward(arrays, p)
        if not bwd_threads:
            assert bwd.launches[0].symbol == "capsule_layer_norm_bwd_x"
            continue
        wide, params = bwd.launches
        parts = wide.args[-2]
        assert (wide.symbol, wide.block, wide.grid) == (
            "capsule_layer_norm_bwd_x_wide",
            (bwd_threads, 1, 1),
            (parts, 1, 1),
        )
        assert bwd_threads * plans.WIDE_BWD_FLOATS >= shape[-1] and params.args[-1] == parts
        assert bwd.buffer("partial").elements == 2 * parts * shape[-1]
        assert parts == min(shape[0], max(132, min(-(-shape[0] // plans.WIDE_ROW_PART), 132 * (1024 // bwd_threads))))
    wide = [(8, 1024), (512, 1024), (4096, 1024), (4096, 512), (2048, 128), (100_000, 128)]
    assert [plans.wide_parts(rows, threads) for rows, threads in wide] == [8, 132, 132, 264, 256, 1056]
    arrays, p, _ = validate(get_spec("batch_norm"), _normed_inputs("batch_norm", (16, 64, 32, 32)), {}, np.float32)
    fwd = plans.batch_norm_forward(arrays, p)
    assert [launch.args[-1] for launch in fwd.launches] == [0, 1, 2]
    assert fwd.launches[0].grid[:2] == (64, fwd.launches[0].args[-3])
    assert fwd.buffer("partial").elements == 2 * 64 * fwd.launches[0].args[-3]


def test_planted_launch_faults_are_caught():
    plan, _ = fc.launch_plans("batch_norm", _normed_inputs("batch_norm", (2, 3, 4)))
    launch = plan.launches[0]
    faults = [
        ("writable", {"args": ("x", "gamma", "beta", "x", *launch.args[4:])}),
        ("stage", {"args": (*launch.args[:-1], 0.5)}),
        ("not declared", {"symbol": "capsule_layer_norm_fwd"}),
        ("grid dimension 1", {"grid": (3, 70_000, 1)}),
    ]
    assert fc.missed_launch_faults(plan, fc.symbols("batch_norm"), faults) == []
