"""cuda/spectral.cu without a GPU: it compiles cleanly for sm_80 and sm_90 with the registry's
entry points and fits its launches; fft_fno computed on the host with the kernels' per-element
functions (cuda/spectral.cuh) in the kernels' order meets the error model against the float64
reference, with the twiddle table and with on-the-fly twiddles; the spec's test vectors hold
exactly; spectral.cu itself runs the plans on the CPU emulator (tests/kernel_emu.py); the launch
plans are legal for every sample."""

import ctypes
import dataclasses
import re

import numpy as np
import pytest

from capsule_core.kernels import ARCHES, cuda_source_dir
from capsule_core.ops import get_spec
from capsule_core.ops.base import seeded_rng, validate
from capsule_core.plans import spectral as plans
from family_checks import (build_problems, cases, check_host_model, emulated_problems, family_ops,
                           missed_faults, plan_case_problems, signature_problems, symbols)
from hostmath import F32P, I64P, declare, load, ptr
from kernel_emu import emulator as family_emulator

FAMILY = "spectral"
OP = "fft_fno"
SOURCE = cuda_source_dir() / "spectral.cu"
U = 2.0**-24
SYMBOLS = symbols(OP)


# -- the build ------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHES)
def test_compiles_without_warnings_or_spills(arch):
    assert build_problems(FAMILY, arch) == []


def test_source_spells_out_each_declared_signature():
    assert family_ops(FAMILY) == {OP}
    assert signature_problems(FAMILY, launch_bounds=True) == []


def test_plan_constants_match_the_kernels():
    text = SOURCE.read_text()
    assert int(re.search(r"kModesPerThread = (\d+);", text)[1]) == plans.MODES_PER_THREAD
    assert int(re.search(r"kPointsPerThread = (\d+);", text)[1]) == plans.POINTS_PER_THREAD
    assert int(re.search(r"kMaxThreads = (\d+);", text)[1]) >= plans.BLOCK
    assert "#include <cufft" not in text.lower()


# -- the per-element math, on the host --------------------------------------------------------------

I64, I32 = ctypes.c_int64, ctypes.c_int32


@pytest.fixture(scope="module")
def lib(host_build_dir):
    return declare(load("spectral_host", host_build_dir), {
        "host_fft_fno_fwd": [F32P] * 4 + [I64] * 5 + [I32],
        "host_fft_fno_bwd": [F32P] * 7 + [I64] * 5 + [I32],
        "host_rfft_modes": [F32P, I64, I64, F32P, I32],
        "host_fno_twiddles": [I64, I64P, I64, F32P, F32P, I32],
        "host_fno_turns": [I64, I64, I64, I64P],
        "host_fno_bin_scale": [F32P, I64P, I64, I64, F32P],
    })


def dims(arrays):
    b, g, ci = arrays["x"].shape
    m, _, co = arrays["w_re"].shape
    return b, g, ci, co, m


def host_forward(lib, arrays, table=True):
    x, w_re, w_im = (np.ascontiguousarray(arrays[k], np.float32) for k in ("x", "w_re", "w_im"))
    b, g, ci, co, m = dims(arrays)
    y = np.full((b, g, co), np.nan, np.float32)
    lib.host_fft_fno_fwd(ptr(x), ptr(w_re), ptr(w_im), ptr(y), b, g, ci, co, m, int(table))
    return y


def host_vjp(lib, arrays, g_, table=True):
    x, w_re, w_im = (np.ascontiguousarray(arrays[k], np.float32) for k in ("x", "w_re", "w_im"))
    g_ = np.ascontiguousarray(g_, np.float32)
    b, g, ci, co, m = dims(arrays)
    dx = np.full(x.shape, np.nan, np.float32)
    dw_re, dw_im = np.full(w_re.shape, np.nan, np.float32), np.full(w_re.shape, np.nan, np.float32)
    lib.host_fft_fno_bwd(ptr(x), ptr(w_re), ptr(w_im), ptr(g_), ptr(dx), ptr(dw_re), ptr(dw_im), b, g, ci, co, m, int(table))
    return {"x": dx, "w_re": dw_re, "w_im": dw_im}


def check_forward(lib, sample, table=True):
    return check_host_model(OP, sample, forward=lambda arrays, _: host_forward(lib, arrays, table), label=f" table={table}")


def check_vjp(lib, sample, table=True):
    return check_host_model(OP, sample, vjp=lambda arrays, _, g: host_vjp(lib, arrays, g, table), label=f" table={table}")


def test_host_forward_meets_the_contract(lib):
    """Small and medium samples and every edge (the large sample runs the same code, slowly)."""
    worst = max(check_forward(lib, s) for s in cases(OP, ("small", "medium")))
    assert worst <= 0.5, f"the worst error uses {worst:.2f} of the bound"


def test_host_vjp_meets_the_contract(lib):
    worst = max(check_vjp(lib, s) for s in cases(OP, ("small", "medium")))
    assert worst <= 0.5, f"the worst error uses {worst:.2f} of the bound"


def test_host_math_with_twiddles_on_the_fly(lib):
    """The kernels' path for grids too long for the shared-memory table (sincospif per turn)."""
    for sample in cases(OP, ("small", "medium")):
        check_forward(lib, sample, table=False)
        check_vjp(lib, sample, table=False)


@pytest.mark.parametrize("table", [True, False])
def test_spec_test_vectors(lib, table):
    out = np.empty(6, np.float32)
    lib.host_rfft_modes(ptr(np.array([1, 0, 0, 0], np.float32)), 4, 3, ptr(out), int(table))
    assert out.tolist() == [1, 0, 1, 0, 1, 0]
    lib.host_rfft_modes(ptr(np.array([1, 2, 3, 4], np.float32)), 4, 3, ptr(out), int(table))
    assert out.tolist() == [10, 0, -2, 2, -2, 0]
    for grid in (4, 10, 11):
        modes = grid // 2 + 1
        x = seeded_rng(OP, f"identity-{grid}").standard_normal((2, grid, 3)).astype(np.float32)
        eye = np.broadcast_to(np.eye(3, dtype=np.float32), (modes, 3, 3)).copy()
        y = host_forward(lib, {"x": x, "w_re": eye, "w_im": np.zeros_like(eye)}, table)
        assert np.allclose(y, x, rtol=0, atol=1e-5), grid


@pytest.mark.parametrize("grid", [1, 2, 3, 4, 7, 8, 12, 100, 243, 2048, 6144, 4099 * 3])
def test_twiddles_are_accurate_and_exact_at_quarter_turns(lib, grid):
    r = np.arange(grid, dtype=np.int64)
    quarter = (4 * r) % grid == 0
    step = (4 * r) // grid % 4
    angle = 2 * np.pi * r / grid
    exact_c = np.where(quarter, np.array([1.0, 0.0, -1.0, 0.0])[step], np.cos(angle))
    exact_s = np.where(quarter, np.array([0.0, 1.0, 0.0, -1.0])[step], np.sin(angle))
    for table in (1, 0):
        c, s = np.empty(grid, np.float32), np.empty(grid, np.float32)
        lib.host_fno_twiddles(grid, ptr(r), grid, ptr(c), ptr(s), table)
        assert (c[quarter] == exact_c[quarter]).all() and (s[quarter] == exact_s[quarter]).all(), table
        for got, want in ((c, exact_c), (s, exact_s)):
            if table:
                # double-precision sincospi rounded once: within half an ulp of the value (and a hair)
                bound = 0.5001 * np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
            else:
                # sincospif (1 ulp) of the once-rounded reduced argument: within 4·2^-24 absolute
                bound = np.full(grid, 4 * U)
            assert np.all(np.abs(got - want) <= bound + 1e-300), (table, np.max(np.abs(got - want) / bound))


def test_turns_are_reduced_exactly_for_huge_grids(lib):
    """A thread adds k (or t) to its turn and wraps it: r_j = (j·k) mod G without ever forming j·k,
    so grids past 2^31 (and products past 2^63) stay exact."""
    out = np.empty(1000, np.int64)
    for grid, inc in ((7, 3), (2**31 + 11, 2**30 + 7), (2**40 + 3, 2**39 + 1), (2**62 - 57, 2**61 + 5)):
        lib.host_fno_turns(grid, inc, out.size, ptr(out))
        assert out.tolist() == [(j * inc) % grid for j in range(out.size)]


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
    """spectral.cu itself, as launched by the plans (the twiddle table in dynamic shared memory):
    every output written, nothing outside, inputs intact, values within the error model."""
    problems = []
    for sample in cases(OP, ("small", "medium")):
        problems += emulated_problems(emulator, OP, sample)
    assert problems == []


def test_kernels_on_the_emulator_without_the_table(emulator):
    """The same launches without dynamic shared memory: twiddles computed on the fly."""
    class NoTable:
        def run(self, plan, arrays, misalign=None):
            launches = tuple(dataclasses.replace(launch, shared_bytes=0) for launch in plan.launches)
            return emulator.run(dataclasses.replace(plan, launches=launches), arrays, misalign)

    problems = []
    for sample in cases(OP, ("small",)):
        problems += emulated_problems(NoTable(), OP, sample, {"x": 1, "w_re": 2, "g": 3})
    assert problems == []


# -- launch plans -----------------------------------------------------------------------------------


def _three_stages(case):
    assert [launch.args[-1] for launch in case.forward.launches] == [0, 1, 2]


def test_plans_are_legal_for_every_sample():
    assert plan_case_problems(OP, check=_three_stages) == []


def test_plans_size_the_launches_as_the_kernels_expect():
    spec = get_spec(OP)
    for b, g, ci, co, m in ((16, 2048, 64, 64, 64), (2, 6144, 3, 2, 5), (2, 6145, 3, 2, 5), (0, 8, 2, 3, 5)):
        arrays, p, _ = validate(spec, {"x": np.zeros((b, g, ci), np.float32), "w_re": np.zeros((m, ci, co), np.float32),
                                       "w_im": np.zeros((m, ci, co), np.float32)}, {}, np.float32)
        fwd, bwd = plans.forward(arrays, p), plans.backward(arrays, p)
        table = 8 * g if g <= 6144 else 0
        assert [launch.shared_bytes for launch in fwd.launches] == [table, 0, table]
        assert [launch.shared_bytes for launch in bwd.launches] == [table, 0, table, 0]
        assert bwd.launches[0].grid[1] == 2
        threads = fwd.launches[0].grid[0] * plans.BLOCK
        assert threads >= min(b * -(-m // 4) * ci, 132 * 32 * plans.BLOCK) or threads == plans.BLOCK
        assert fwd.buffer("spectrum").elements == 2 * b * m * ci and fwd.buffer("mixed").elements == 2 * b * m * co


def test_planted_launch_faults_are_caught():
    spec = get_spec(OP)
    arrays, p, _ = validate(spec, {"x": np.zeros((2, 8, 3), np.float32), "w_re": np.zeros((3, 3, 2), np.float32),
                                   "w_im": np.zeros((3, 3, 2), np.float32)}, {}, np.float32)
    plan = plans.forward(arrays, p)
    launch = plan.launches[0]
    assert missed_faults(plan, SYMBOLS, [
        ("2048 threads", {"block": (2048, 1, 1)}),
        ("11 arguments for 12", {"args": launch.args[:-1]}),
        ("writable", {"args": ("x", "w_re", "w_im", "x", *launch.args[4:])}),
        ("dynamic shared memory", {"shared_bytes": 200 * 1024}),
        ("not declared", {"symbol": "capsule_fft_fno_bwd"}),
    ], arch="sm_80") == []
