"""cuda/spectral.cu without a GPU: it compiles cleanly for sm_80 and sm_90 with the registry's
entry points and fits its launches; fft_fno computed on the host with the kernels' per-element
functions (cuda/spectral.cuh) in the kernels' order meets the error model against the float64
reference, whole or with the analysis split over the grid axis; the spec's test vectors hold
exactly; the twiddle table and the turn arithmetic (32- and 64-bit) are exact where they must be;
spectral.cu itself runs the plans on the CPU emulator (tests/kernel_emu.py), split or not, with
32-bit turns and with the 64-bit path; the launch plans are legal for every sample and fill an
H200 at the reference shape."""

import ctypes
import re

import family_checks as fc
import numpy as np
import pytest
from hostmath import F32P, I64P, declare, load, ptr
from kernel_emu import emulator as family_emulator

from capsule_core.kernels.nvcc import cuda_source_dir
from capsule_core.kernels.plans import spectral as plans
from capsule_core.ops import get_spec
from capsule_core.ops.base import seeded_rng, validate

FAMILY = "spectral"
OP = "fft_fno"
SOURCE = cuda_source_dir() / "spectral.cu"
U = 2.0**-24
SYMBOLS = fc.symbols(OP)


# -- the build ------------------------------------------------------------------------------------


def test_plan_constants_match_the_kernels():
    text = SOURCE.read_text()
    assert int(re.search(r"kModesPerThread = (\d+);", text)[1]) == plans.MODES_PER_THREAD
    assert int(re.search(r"kChannelsPerThread = (\d+);", text)[1]) == plans.CHANNELS_PER_THREAD
    assert 2 ** int(re.search(r"kTurn32Limit = int64_t\{1\} << (\d+);", text)[1]) == plans.TURN32_LIMIT
    assert int(re.search(r"kPointsPerThread = (\d+);", text)[1]) == plans.POINTS_PER_THREAD
    assert int(re.search(r"kOutputsPerThread = (\d+);", text)[1]) == plans.OUTPUTS_PER_THREAD
    assert int(re.search(r"kMaxThreads = (\d+);", text)[1]) >= plans.BLOCK
    assert int(re.search(r"kTransformBlocks = (\d+);", text)[1]) == plans.TRANSFORM_BLOCKS
    assert int(re.search(r"kLeanBlocks = (\d+);", text)[1]) == plans.LEAN_BLOCKS
    assert "#include <cufft" not in text.lower()


# -- the per-element math, on the host --------------------------------------------------------------

I64, I32 = ctypes.c_int64, ctypes.c_int32


@pytest.fixture(scope="module")
def lib(host_build_dir):
    return declare(
        load("spectral_host", host_build_dir),
        {
            "host_fft_fno_fwd": [F32P] * 4 + [I64] * 6,
            "host_fft_fno_bwd": [F32P] * 7 + [I64] * 6,
            "host_rfft_modes": [F32P, I64, I64, F32P, I64],
            "host_fno_twiddles": [I64, I64P, I64, F32P, F32P],
            "host_fno_turns": [I64, I64, I64, I64, I64P, I32],
            "host_fno_turn": [I64P, I64P, I64, I64, I64P],
            "host_fno_bin_scale": [F32P, I64P, I64, I64, F32P],
        },
    )


def dims(arrays):
    b, g, ci = arrays["x"].shape
    m, _, co = arrays["w_re"].shape
    return b, g, ci, co, m


def plan_parts(arrays, direction="fwd"):
    """The parts the plan splits this sample's analysis into."""
    b, g, ci, co, m = dims(arrays)
    items = plans.analysis_items(b, g, ci, m) + (plans.analysis_items(b, g, co, m) if direction == "bwd" else 0)
    return plans.analysis_parts(items, g)


def host_forward(lib, arrays, parts=None):
    x, w_re, w_im = (np.ascontiguousarray(arrays[k], np.float32) for k in ("x", "w_re", "w_im"))
    b, g, ci, co, m = dims(arrays)
    y = np.full((b, g, co), np.nan, np.float32)
    lib.host_fft_fno_fwd(ptr(x), ptr(w_re), ptr(w_im), ptr(y), b, g, ci, co, m, parts or plan_parts(arrays))
    return y


def host_vjp(lib, arrays, g_, parts=None):
    x, w_re, w_im = (np.ascontiguousarray(arrays[k], np.float32) for k in ("x", "w_re", "w_im"))
    g_ = np.ascontiguousarray(g_, np.float32)
    b, g, ci, co, m = dims(arrays)
    dx = np.full(x.shape, np.nan, np.float32)
    dw_re, dw_im = np.full(w_re.shape, np.nan, np.float32), np.full(w_re.shape, np.nan, np.float32)
    lib.host_fft_fno_bwd(
        ptr(x),
        ptr(w_re),
        ptr(w_im),
        ptr(g_),
        ptr(dx),
        ptr(dw_re),
        ptr(dw_im),
        b,
        g,
        ci,
        co,
        m,
        parts or plan_parts(arrays, "bwd"),
    )
    return {"x": dx, "w_re": dw_re, "w_im": dw_im}


def check_forward(lib, sample, parts=None):
    return fc.check_host_model(
        OP, sample, forward=lambda arrays, _: host_forward(lib, arrays, parts), label=f" parts={parts}"
    )


def check_vjp(lib, sample, parts=None):
    return fc.check_host_model(
        OP, sample, vjp=lambda arrays, _, g: host_vjp(lib, arrays, g, parts), label=f" parts={parts}"
    )


def test_host_forward_meets_the_contract(lib):
    """Small and medium samples and every edge, split as the plans split them (the large sample
    runs the same code, slowly)."""
    worst = max(check_forward(lib, s) for s in fc.cases(OP, ("small", "medium")))
    assert worst <= 0.5, f"the worst error uses {worst:.2f} of the bound"


def test_host_vjp_meets_the_contract(lib):
    worst = max(check_vjp(lib, s) for s in fc.cases(OP, ("small", "medium")))
    assert worst <= 0.5, f"the worst error uses {worst:.2f} of the bound"


@pytest.mark.parametrize("parts", [1, 2, 3, 7, 64])
def test_host_math_with_the_analysis_split(lib, parts):
    """Any split of the grid axis (parts of one point, a short last part) meets the same models."""
    for sample in fc.cases(OP, ("small", "medium")):
        g = sample.inputs["x"].shape[1]
        if parts <= g:
            check_forward(lib, sample, parts)
            check_vjp(lib, sample, parts)


@pytest.mark.parametrize("parts", [1, 2, 3])
def test_spec_test_vectors(lib, parts):
    out = np.empty(6, np.float32)
    lib.host_rfft_modes(ptr(np.array([1, 0, 0, 0], np.float32)), 4, 3, ptr(out), parts)
    assert out.tolist() == [1, 0, 1, 0, 1, 0]
    lib.host_rfft_modes(ptr(np.array([1, 2, 3, 4], np.float32)), 4, 3, ptr(out), parts)
    assert out.tolist() == [10, 0, -2, 2, -2, 0]
    for grid in (4, 10, 11):
        modes = grid // 2 + 1
        x = seeded_rng(OP, f"identity-{grid}").standard_normal((2, grid, 3)).astype(np.float32)
        eye = np.broadcast_to(np.eye(3, dtype=np.float32), (modes, 3, 3)).copy()
        y = host_forward(lib, {"x": x, "w_re": eye, "w_im": np.zeros_like(eye)}, parts)
        assert np.allclose(y, x, rtol=0, atol=1e-5), grid


@pytest.mark.parametrize("grid", [1, 2, 3, 4, 7, 8, 12, 100, 243, 2048, 6144, 4099 * 3])
def test_twiddles_are_accurate_and_exact_at_quarter_turns(lib, grid):
    r = np.arange(grid, dtype=np.int64)
    quarter = (4 * r) % grid == 0
    step = (4 * r) // grid % 4
    angle = 2 * np.pi * r / grid
    exact_c = np.where(quarter, np.array([1.0, 0.0, -1.0, 0.0])[step], np.cos(angle))
    exact_s = np.where(quarter, np.array([0.0, 1.0, 0.0, -1.0])[step], np.sin(angle))
    c, s = np.empty(grid, np.float32), np.empty(grid, np.float32)
    lib.host_fno_twiddles(grid, ptr(r), grid, ptr(c), ptr(s))
    assert (c[quarter] == exact_c[quarter]).all() and (s[quarter] == exact_s[quarter]).all()
    for got, want in ((c, exact_c), (s, exact_s)):
        # double-precision sincospi rounded once: within half an ulp of the value (and a hair)
        bound = 0.5001 * np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
        assert np.all(np.abs(got - want) <= bound + 1e-300), np.max(np.abs(got - want) / bound)


def test_turns_are_reduced_exactly_for_huge_grids(lib):
    """A thread adds k (or t) to its turn and wraps it: r_j = (start + j·inc) mod G without ever
    forming j·inc, so grids past 2^31 (and products past 2^63) stay exact; 32-bit turns stay
    exact up to G = 2^31 (r + inc < 2^32)."""
    out = np.empty(1000, np.int64)
    for grid, start, inc, narrow in (
        (7, 0, 3, 1),
        (7, 5, 6, 0),
        (2**31, 2**31 - 1, 2**31 - 1, 1),
        (2**31 - 1, 3, 2**30 + 7, 1),
        (2**31 + 11, 2**31, 2**30 + 7, 0),
        (2**40 + 3, 0, 2**39 + 1, 0),
        (2**62 - 57, 2**62 - 58, 2**61 + 5, 0),
    ):
        lib.host_fno_turns(grid, start, inc, out.size, ptr(out), narrow)
        assert out.tolist() == [(start + j * inc) % grid for j in range(out.size)], (grid, narrow)


def test_start_turns_are_exact_for_any_grid(lib):
    """capsule_fno_turn: (k·t) mod G for k, t of any size below 2^63 (a part's first turn)."""
    rng = seeded_rng(OP, "turn")
    for grid in (1, 7, 4096, 2**31, 2**32 - 1, 2**32, 2**32 + 15, 2**47 + 5, 2**62 - 57, 2**63 - 25):
        edge_k = np.array([0, 1, grid - 1, min(3 * grid + 2, 2**63 - 1)], np.int64)
        edge_t = np.array([grid - 1, grid - 1, grid - 1, 5], np.int64)
        k = np.concatenate([edge_k, rng.integers(0, 2**63 - 1, 60, dtype=np.int64)])
        t = np.concatenate([edge_t, rng.integers(0, 2**63 - 1, 60, dtype=np.int64)])
        out = np.empty(k.size, np.int64)
        lib.host_fno_turn(ptr(k), ptr(t), k.size, grid, ptr(out))
        assert out.tolist() == [(int(a) * int(b)) % grid for a, b in zip(k, t)], grid


def test_bin_weights_and_scale(lib):
    """w_k/G is applied as (w_k·v)/G: one rounding; w_k = 1 at DC and (even G) Nyquist, 2 elsewhere."""
    v = seeded_rng(OP, "scale").standard_normal(64).astype(np.float32)
    for grid in (1, 2, 7, 8, 243, 2048):
        k = np.arange(64, dtype=np.int64) % (grid // 2 + 1)
        out = np.empty(64, np.float32)
        lib.host_fno_bin_scale(ptr(v), ptr(k), 64, grid, ptr(out))
        weight = np.where((k == 0) | (2 * k == grid), 1.0, 2.0)
        assert (out == (weight * v.astype(np.float64) / grid).astype(np.float32)).all(), grid


# -- the kernels themselves, on the CPU emulator ----------------------------------------------------


@pytest.fixture(scope="module")
def emulator():
    return family_emulator(max_grid=(3, 2))


def test_kernels_on_the_emulator(emulator):
    """spectral.cu itself, as launched by the plans (medium samples split the analysis in parts):
    every output written, nothing outside, inputs intact, values within the error model."""
    problems = []
    for sample in fc.cases(OP, ("small", "medium")):
        problems += fc.emulated_problems(emulator, OP, sample)
    assert problems == []


def test_kernels_on_the_emulator_split_to_single_points(emulator, monkeypatch):
    """Parts as short as one grid point (MIN_SPAN = 1): small samples and edges split too, and
    spans that leave a short last part."""
    monkeypatch.setattr(plans, "MIN_SPAN", 1)
    problems, split = [], 0
    for sample in fc.cases(OP, ("small",)):
        split += plan_parts(sample.inputs) > 1
        problems += fc.emulated_problems(emulator, OP, sample, {"x": 1, "w_re": 2, "g": 3})
    assert problems == [] and split >= 3


def test_kernels_on_the_emulator_with_64_bit_turns(emulator, monkeypatch):
    """The analyses' _wide entry points (64-bit turns, one mode and channel at a time, the start
    turn by doubling), which the plans launch for grids past 2^31, here for every grid."""
    monkeypatch.setattr(plans, "TURN32_LIMIT", 0)
    problems = []
    for sample in fc.cases(OP, ("small", "medium")):
        fwd = plans.forward(sample.inputs, sample.params)
        assert fwd.launches[1].symbol == "capsule_fft_fno_fwd_analysis_wide"
        problems += fc.emulated_problems(emulator, OP, sample)
    assert problems == []


# -- launch plans -----------------------------------------------------------------------------------


def _launches(case):
    fwd = [launch.symbol for launch in case.forward.launches]
    assert fwd[0] == "capsule_fft_fno_fwd_twiddles" and fwd[-2:] == [
        "capsule_fft_fno_fwd_mix",
        "capsule_fft_fno_fwd_synthesis",
    ]


def test_plans_are_legal_for_every_sample():
    assert fc.plan_case_problems(OP, check=_launches) == []


def _plans(b, g, ci, co, m):
    arrays, p, _ = validate(
        get_spec(OP),
        {
            "x": np.zeros((b, g, ci), np.float32),
            "w_re": np.zeros((m, ci, co), np.float32),
            "w_im": np.zeros((m, ci, co), np.float32),
        },
        {},
        np.float32,
    )
    return plans.forward(arrays, p), plans.backward(arrays, p)


def test_plans_size_the_launches_as_the_kernels_expect():
    for b, g, ci, co, m in (
        (16, 2048, 64, 64, 64),
        (2, 6144, 3, 2, 5),
        (2, 6145, 3, 2, 5),
        (0, 8, 2, 3, 5),
        (20, 4096, 64, 64, 16),
        (1, 100, 7, 5, 51),
        (4096, 64, 64, 64, 16),
    ):
        fwd, bwd = _plans(b, g, ci, co, m)
        assert all(launch.shared_bytes == 0 for launch in fwd.launches + bwd.launches)
        assert fwd.buffer("table").elements == bwd.buffer("table").elements == 2 * g
        for plan, analysis, total in (
            (fwd, "capsule_fft_fno_fwd_analysis", plans.analysis_items(b, g, ci, m)),
            (bwd, "capsule_fft_fno_bwd_spectra", plans.analysis_items(b, g, ci, m) + plans.analysis_items(b, g, co, m)),
        ):
            launch = next(launch for launch in plan.launches if launch.symbol == analysis)
            parts = launch.args[-1]
            span = -(-g // parts)
            assert parts == plans.analysis_parts(total, g) and -(-g // span) == parts, "no part is empty"
            assert parts == 1 or span >= plans.MIN_SPAN
            threads = launch.grid[0] * plans.BLOCK
            assert threads >= min(total * parts, 132 * 32 * plans.BLOCK) or threads == plans.BLOCK
            sums = [launch for launch in plan.launches if launch.symbol.endswith("_sum")]
            assert len(sums) == (parts > 1) and all(launch.args[-1] == parts for launch in sums)
        assert fwd.buffer("spectrum").elements == 2 * b * m * ci and fwd.buffer("mixed").elements == 2 * b * m * co


def test_reference_shape_fills_an_h200():
    """B = 20, G = 4096, C = 64, M = 16: the analyses were 20 (forward) and 2 x 20 blocks; split
    over the grid axis they make one wave of four 256-thread blocks on each of 132 SMs."""
    fwd, bwd = _plans(20, 4096, 64, 64, 16)
    assert [(launch.symbol, launch.grid[0], launch.args[-1]) for launch in fwd.launches[1:3]] == [
        ("capsule_fft_fno_fwd_analysis", 520, 52),
        ("capsule_fft_fno_fwd_sum", 320, 52),
    ]
    assert [(launch.symbol, launch.grid, launch.args[-1]) for launch in bwd.launches[1:3]] == [
        ("capsule_fft_fno_bwd_spectra", (520, 1, 1), 26),
        ("capsule_fft_fno_bwd_sum", (640, 1, 1), 26),
    ]
    for launch in fwd.launches[1:] + bwd.launches[1:]:
        assert launch.grid[0] * launch.grid[1] >= 132, launch.symbol


def test_planted_launch_faults_are_caught():
    zeros = {"x": (2, 8, 3), "w_re": (3, 3, 2), "w_im": (3, 3, 2)}
    plan, _ = fc.launch_plans(OP, {name: np.zeros(shape, np.float32) for name, shape in zeros.items()})
    launch = plan.launches[1]
    assert launch.symbol == "capsule_fft_fno_fwd_analysis"
    faults = [
        ("writable", {"args": ("x", "table", "x", *launch.args[3:])}),
        ("dynamic shared memory", {"shared_bytes": 200 * 1024}),
        ("not declared", {"symbol": "capsule_fft_fno_fwd"}),
    ]
    assert fc.missed_launch_faults(plan, SYMBOLS, faults, index=1, arch="sm_80") == []
