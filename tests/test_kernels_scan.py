"""cuda/scan.cu without a GPU: it compiles cleanly for sm_80 and sm_90 with the registry's entry
points and fits its launches; selective_scan computed on the host with the kernels' step functions
(cuda/scan.cuh) in the kernels' chunked order meets the error model against the float64
reference for any chunk count; the spec's test vectors hold exactly; the chunk combine is
associative; scan.cu itself runs the plans on the CPU emulator of test_kernels_norm, bitwise like
the host model; the launch plans are legal for every sample."""

import ctypes
import dataclasses
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from capsule_core import registry
from capsule_core.backends.cpu import REFERENCE
from capsule_core.kernels import cuda_source_dir, find_nvcc
from capsule_core.launch import parse_param, plan_functions, plan_problems
from capsule_core.numerics import compare
from capsule_core.ops import get_spec
from capsule_core.ops.base import seeded_rng, shapes_of, validate
from capsule_core.plans import scan as plans
from hostmath import load
from test_kernels_norm import Emulator, emulated_problems

OP = "selective_scan"
ARCHS = ("sm_80", "sm_90")
FLAGS = ("-std=c++17", "-O3", "-prec-div=true", "-prec-sqrt=true", "-ftz=false", "-fmad=true")
SOURCE = cuda_source_dir() / "scan.cu"
PTX_TYPES = {"float": "f32", "int64_t": "u64", "uint64_t": "u64", "int32_t": "u32"}
REGISTERS_PER_SM = 65536
SYMBOLS = {ref.symbol: ref for ref in registry.lookup(OP).symbols}


# -- the build ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """scan.cu compiled once per arch (in parallel), warnings as errors: (result, PTX, resources)."""
    def compile_for(arch):
        out = tmp_path_factory.mktemp(f"scan_{arch}")
        cmd = [str(find_nvcc().path), *FLAGS, f"-arch={arch}", "-Xptxas", "-v", "-Werror", "all-warnings",
               "-I", str(cuda_source_dir()), "-cubin", "-keep", "-keep-dir", str(out), "-o", str(out / "scan.cubin"),
               str(SOURCE)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        ptx = out / "scan.ptx"
        return arch, (result, ptx.read_text() if ptx.exists() else "", ptxas_report(result.stderr))
    with ThreadPoolExecutor(len(ARCHS)) as pool:
        return dict(pool.map(compile_for, ARCHS))


def ptxas_report(stderr: str) -> dict:
    """{kernel: (registers, stack frame bytes, spill store bytes, spill load bytes, static smem bytes)}."""
    report = {}
    for block in re.split(r"Compiling entry function ", stderr)[1:]:
        name = re.match(r"'(\w+)'", block)[1]
        frame, stores, loads = map(int, re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                                                  block).groups())
        smem = re.search(r"(\d+) bytes smem", block)
        report[name] = (int(re.search(r"Used (\d+) registers", block)[1]), frame, stores, loads, int(smem[1]) if smem else 0)
    return report


def ptx_entries(ptx: str) -> dict:
    return {m[1]: re.findall(r"\.param \.(\w+) ", m[2]) for m in re.finditer(r"\.entry (\w+)\(([^)]*)\)", ptx)}


@pytest.mark.parametrize("arch", ARCHS)
def test_compiles_without_warnings_or_spills(build, arch):
    result, _, report = build[arch]
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr.lower(), result.stderr
    assert set(report) == set(SYMBOLS), "every kernel of the file is a registered entry point"
    for name, (registers, frame, stores, loads, _) in report.items():
        assert stores == loads == frame == 0, f"{name} spills on {arch}"
        assert registers * plans.MAX_THREADS <= REGISTERS_PER_SM, f"{name}: {registers} registers"


@pytest.mark.parametrize("arch", ARCHS)
def test_ptx_entries_have_the_declared_parameter_lists(build, arch):
    entries = ptx_entries(build[arch][1])
    for name, ref in SYMBOLS.items():
        assert name in entries, f"no .entry {name} in the {arch} PTX"
        expected = ["u64" if p.pointer else PTX_TYPES[p.ctype] for p in map(parse_param, ref.params)]
        assert entries[name] == expected, f"{name}: PTX {entries[name]} for the declared {ref.params}"


def test_source_spells_out_each_declared_signature():
    source = re.sub(r"\s+", " ", re.sub(r"\(\s+", "(", SOURCE.read_text()))
    for name, ref in SYMBOLS.items():
        assert ref.path == "cuda/scan.cu"
        declaration = rf'extern "C" __global__ __launch_bounds__\([^)]*\) void {name}\({re.escape(", ".join(ref.params))}\)'
        assert re.search(declaration, source), f"{name}: the source does not declare {ref.params}"
    assert int(re.search(r"kMaxThreads = (\d+);", SOURCE.read_text())[1]) == plans.MAX_THREADS


# -- the per-element math, on the host --------------------------------------------------------------

F32P = ctypes.POINTER(ctypes.c_float)
I64P = ctypes.POINTER(ctypes.c_int64)
I64, I32 = ctypes.c_int64, ctypes.c_int32


@pytest.fixture(scope="module")
def lib(host_build_dir):
    lib = load("scan_host", host_build_dir)
    sig = {
        "host_selective_scan_fwd": [F32P] * 5 + [I64] * 3 + [I32, I32, I64],
        "host_selective_scan_bwd": [F32P] * 10 + [I64] * 3 + [I32, I32, I64],
        "host_scan_split": [F32P] * 3 + [I64, I64, ctypes.c_float, F32P],
        "host_scan_associate": [F32P] * 4,
        "host_scan_chunk_range": [I64] * 3 + [I64P, I64P],
    }
    for name, argtypes in sig.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, None
    return lib


def ptr(a: np.ndarray):
    return a.ctypes.data_as(F32P if a.dtype == np.float32 else I64P)


def f32(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def plan_chunks(x_shape) -> int:
    """The chunk count of the plan's launch: blockDim.y."""
    return plans.tile_shape(*x_shape)[1][1]


def host_forward(lib, arrays, chunks=None):
    x, a, b, h0 = (f32(arrays[k]) for k in ("x", "a", "b", "h0"))
    batch, time, dim = x.shape
    y = np.full(x.shape, np.nan, np.float32)
    lib.host_selective_scan_fwd(ptr(x), ptr(a), ptr(b), ptr(h0), ptr(y), batch, time, dim, int(a.ndim == 3),
                                int(b.ndim == 3), chunks or plan_chunks(x.shape))
    return y


def host_vjp(lib, arrays, g, chunks=None):
    x, a, b, h0 = (f32(arrays[k]) for k in ("x", "a", "b", "h0"))
    batch, time, dim = x.shape
    chunks = chunks or plan_chunks(x.shape)
    y = host_forward(lib, arrays, chunks)
    out = {k: np.full(v.shape, np.nan, np.float32) for k, v in (("x", x), ("a", a), ("b", b), ("h0", h0))}
    lib.host_selective_scan_bwd(ptr(x), ptr(a), ptr(b), ptr(h0), ptr(y), ptr(f32(g)), ptr(out["x"]), ptr(out["a"]),
                                ptr(out["b"]), ptr(out["h0"]), batch, time, dim, int(a.ndim == 3), int(b.ndim == 3), chunks)
    return out


def cases(spec, sizes=("small", "medium", "large")):
    out = []
    for size in sizes:
        out += spec.samples(size, seeded_rng(spec.name, size))
    return out + spec.edges()


def check_forward(lib, spec, sample, chunks=None):
    arrays, p, _ = validate(spec, sample.inputs, sample.params, np.float32)
    y = host_forward(lib, arrays, chunks)
    r = REFERENCE.forward(spec, sample.inputs, **sample.params)
    m = REFERENCE.magnitude(spec, sample.inputs, **sample.params)
    result = compare(y, r, m, spec.error, spec.error.length(shapes_of(arrays), p), sample.worst_case)
    assert result.passed, f"forward {sample.summary()} chunks={chunks}: {result.reason} (worst {result.worst:.3g})"
    return result.worst


def check_vjp(lib, spec, sample, chunks=None):
    arrays, p, out_shape = validate(spec, sample.inputs, sample.params, np.float32)
    g = seeded_rng(spec.name, f"g/{sample.case}").standard_normal(out_shape).astype(np.float32)
    got = host_vjp(lib, arrays, g, chunks)
    r = REFERENCE.vjp(spec, sample.inputs, g, **sample.params)
    m = REFERENCE.vjp_magnitude(spec, sample.inputs, g, **sample.params)
    worst = 0.0
    for name in spec.differentiable:
        model = spec.vjp_error_for(name)
        result = compare(got[name], r[name], m[name], model, model.length(shapes_of(arrays), p), sample.worst_case)
        assert result.passed, f"d{name} {sample.summary()} chunks={chunks}: {result.reason} (worst {result.worst:.3g})"
        worst = max(worst, result.worst)
    return worst


def test_host_forward_meets_the_contract(lib):
    spec = get_spec(OP)
    worst = max(check_forward(lib, spec, s) for s in cases(spec))
    assert worst <= 0.5, f"the worst error uses {worst:.2f} of the bound"


def test_host_vjp_meets_the_contract(lib):
    spec = get_spec(OP)
    worst = max(check_vjp(lib, spec, s) for s in cases(spec))
    assert worst <= 0.5, f"the worst error uses {worst:.2f} of the bound"


@pytest.mark.parametrize("chunks", [1, 3, 7, 64, 256])
def test_host_math_for_any_chunk_count(lib, chunks):
    """More chunks than steps (empty chunks), uneven chunks, one chunk (the plain recurrence)."""
    spec = get_spec(OP)
    for sample in cases(spec, ("small", "medium")):
        check_forward(lib, spec, sample, chunks)
        check_vjp(lib, spec, sample, chunks)


@pytest.mark.parametrize("chunks", [1, 2, 3, 4, 8])
def test_spec_test_vectors(lib, chunks):
    """The spec's vectors are dyadic: every chunked order gives them exactly."""
    x = f32([[[2, 1], [4, -2], [0, 3]]])
    shared = {"x": x, "a": f32([0.5, 0.25]), "b": f32([1, 2]), "h0": f32([[1, -1]])}
    y = host_forward(lib, shared, chunks)
    assert y[0].tolist() == [[2.5, 1.75], [5.25, -3.5625], [2.625, 5.109375]]
    d = host_vjp(lib, shared, np.ones((1, 3, 2), np.float32), chunks)
    assert d["a"].tolist() == [10.75, -2.6875] and d["b"].tolist() == [9.5, 1.8125]
    assert d["x"][0].tolist() == [[1.75, 2.625], [1.5, 2.5], [1, 2]] and d["h0"].tolist() == [[0.875, 0.328125]]
    token = {"x": x, "a": f32([[[0.5, 0.25], [0.1, 0.75], [-1, 0.2]]]), "b": f32([[[1, 2], [0.5, -1], [0.25, 0.5]]]),
             "h0": f32([[1, -1]])}
    y = host_forward(lib, token, chunks)
    assert np.allclose(y[0], [[2.5, 1.75], [2.25, 3.3125], [-2.25, 2.1625]], rtol=2**-22, atol=0)


def test_chunk_combine_is_associative(lib):
    out = np.empty(4, np.float32)
    # Dyadic summaries: every product and sum exact, so both groupings agree bitwise.
    lib.host_scan_associate(ptr(f32([0.5, 3])), ptr(f32([-0.25, 1.5])), ptr(f32([2, -0.125])), ptr(out))
    assert out[0] == out[2] == np.float32(0.5 * -0.25 * 2) and out[1] == out[3] == np.float32(2 * (-0.25 * 3 + 1.5) - 0.125)
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


# -- the kernels themselves, on the CPU emulator (test_kernels_norm.EMULATOR_H) ---------------------


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("no g++ for the CPU emulator")
    return Emulator("scan", tmp_path_factory.mktemp("scan_emu"))


def emulated_cases(spec):
    return cases(spec, ("small", "medium"))


def test_kernels_on_the_emulator(emulator):
    """scan.cu itself, as launched by the plans (blocks of channels by chunks): every output
    written, nothing outside, inputs intact, values within the error model."""
    spec = get_spec(OP)
    problems = []
    for sample in emulated_cases(spec):
        problems += emulated_problems(emulator, OP, sample)
    assert problems == []


def test_emulated_kernels_follow_the_host_math(emulator, lib):
    """The emulated kernels and the host harness's chunked model agree bitwise."""
    spec = get_spec(OP)
    forward, backward = plan_functions(registry.lookup(OP))
    for sample in emulated_cases(spec):
        arrays, p, out_shape = validate(spec, sample.inputs, sample.params, np.float32)
        y = emulator.run(forward(arrays, p), arrays)["out"]
        assert y.view(np.uint32).tolist() == host_forward(lib, arrays).view(np.uint32).tolist(), sample.case
        g = seeded_rng(OP, f"g/{sample.case}").standard_normal(out_shape).astype(np.float32)
        grads = emulator.run(backward(arrays, p), {**arrays, "out": y, "g": g})
        model = host_vjp(lib, arrays, g)
        for name in spec.differentiable:
            assert grads[f"d{name}"].view(np.uint32).tolist() == model[name].view(np.uint32).tolist(), (name, sample.case)


# -- launch plans -----------------------------------------------------------------------------------


def test_plans_are_legal_for_every_sample(build):
    spec = get_spec(OP)
    forward_plan, backward_plan = plan_functions(registry.lookup(OP))
    assert plans.PLANS[OP] == (forward_plan, backward_plan)
    resources = {arch: build[arch][2] for arch in ARCHS}
    for sample in cases(spec):
        arrays, p, out_shape = validate(spec, sample.inputs, sample.params, np.float32)
        fwd, bwd = forward_plan(arrays, p), backward_plan(arrays, p)
        for arch in ARCHS:
            for plan in (fwd, bwd):
                assert plan_problems(plan, SYMBOLS, arch) == [], f"{plan.direction} {sample.summary()}"
                for launch in plan.launches:
                    registers = resources[arch][launch.symbol][0]
                    assert registers * int(np.prod(launch.block)) <= REGISTERS_PER_SM, launch
        assert dict(fwd.output_shapes) == {"out": out_shape}
        assert dict(bwd.output_shapes) == {f"d{k}": arrays[k].shape for k in spec.differentiable}
        assert {b.name for b in fwd.buffers if b.role == "input"} == {t.name for t in spec.inputs}
        shared = arrays["a"].ndim == 1 or arrays["b"].ndim == 1
        assert [launch.symbol for launch in bwd.launches] == (
            ["capsule_selective_scan_bwd"] + ["capsule_selective_scan_bwd_shared"] * shared)
        assert bwd.buffer("out").role == "input", "the backward reads h[t-1] from the forward's result"


def test_tile_shapes():
    for (batch, time, dim), block in (((4, 2048, 256), (8, 32, 1)), ((1, 4096, 8), (8, 32, 1)), ((2, 5, 3), (4, 1, 1)),
                                      ((1, 33, 1), (1, 4, 1)), ((2, 0, 3), (4, 1, 1)), ((0, 7, 3), (4, 1, 1)),
                                      ((2, 300, 50), (8, 32, 1))):
        grid, got = plans.tile_shape(batch, time, dim)
        assert got == block, (batch, time, dim)
        assert grid[0] == max(1, min(plans.MAX_GRID_BLOCKS, batch * -(-dim // block[0])))


def test_planted_launch_faults_are_caught():
    spec = get_spec(OP)
    arrays, p, _ = validate(spec, {"x": np.zeros((2, 5, 3), np.float32), "a": np.zeros(3, np.float32),
                                   "b": np.zeros(3, np.float32), "h0": np.zeros((2, 3), np.float32)}, {}, np.float32)
    plan = plans.backward(arrays, p)
    launch = plan.launches[0]

    def problems(**changes):
        return plan_problems(dataclasses.replace(plan, launches=(dataclasses.replace(launch, **changes),)), SYMBOLS)

    assert plan_problems(plan, SYMBOLS) == []
    assert any("2048 threads" in m for m in problems(block=(64, 32, 1)))
    assert any("16 arguments for 17" in m for m in problems(args=launch.args[:-1]))
    assert any("writable" in m for m in problems(args=(*launch.args[:6], "x", *launch.args[7:])))
    assert any("a_per_token" in m for m in problems(args=(*launch.args[:-2], 2**40, launch.args[-1])))
    assert any("not declared" in m for m in problems(symbol="capsule_selective_scan_bwd_x"))
