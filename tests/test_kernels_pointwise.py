"""cuda/pointwise.cu without a GPU: it compiles cleanly for sm_80 and sm_90 with the registry's
entry points, its per-element math (cuda/pointwise.cuh, compiled for the host) meets each op's
contract against the float64 reference, and its launch plans are legal for every sample."""

import ctypes
import dataclasses
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from capsule_core import registry
from capsule_core.backends.cpu import REFERENCE
from capsule_core.kernels import cuda_source_dir, find_nvcc
from capsule_core.launch import parse_param, plan_functions, plan_problems
from capsule_core.numerics import compare
from capsule_core.ops import get_spec
from capsule_core.ops.base import SPECIAL_VALUES, Exact, seeded_rng, shapes_of, validate
from capsule_core.plans.pointwise import BLOCK, PLANS, VECTOR
from hostmath import load

OPS = ("relu", "gelu", "add", "sub", "mul", "scale", "abs", "sqrt", "clamp", "max", "min", "sigmoid",
       "tanh", "softplus", "exp", "sin", "cos", "log", "inv", "safe_log")
ARCHS = ("sm_80", "sm_90")
FLAGS = ("-std=c++17", "-O3", "-prec-div=true", "-prec-sqrt=true", "-ftz=false", "-fmad=true")
SOURCE = cuda_source_dir() / "pointwise.cu"


def symbols(op):
    return {ref.symbol: ref for ref in registry.lookup(op).symbols}


ALL_SYMBOLS = {name: ref for op in OPS for name, ref in symbols(op).items()}


# -- the build ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """pointwise.cu compiled once per arch (in parallel): ptxas's report and the PTX."""
    def compile_for(arch):
        out = tmp_path_factory.mktemp(f"pointwise_{arch}")
        cmd = [str(find_nvcc().path), *FLAGS, f"-arch={arch}", "-Xptxas", "-v", "-Werror", "all-warnings",
               "-I", str(cuda_source_dir()), "-cubin", "-keep", "-keep-dir", str(out), "-o", str(out / "pointwise.cubin"),
               str(SOURCE)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        ptx = out / "pointwise.ptx"
        return arch, (result, ptx.read_text() if ptx.exists() else "")
    with ThreadPoolExecutor(len(ARCHS)) as pool:
        return dict(pool.map(compile_for, ARCHS))


def ptxas_report(stderr: str) -> dict:
    """{kernel: (registers, stack frame bytes, spill store bytes, spill load bytes)} from -Xptxas -v."""
    report = {}
    for block in re.split(r"Compiling entry function ", stderr)[1:]:
        name = re.match(r"'(\w+)'", block)[1]
        frame, stores, loads = map(int, re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                                                  block).groups())
        report[name] = (int(re.search(r"Used (\d+) registers", block)[1]), frame, stores, loads)
    return report


def ptx_entries(ptx: str) -> dict:
    """{entry: [PTX parameter types]}."""
    return {m[1]: re.findall(r"\.param \.(\w+) ", m[2]) for m in re.finditer(r"\.entry (\w+)\(([^)]*)\)", ptx)}


PTX_TYPES = {"float": "f32", "int64_t": "u64", "uint64_t": "u64", "int32_t": "u32"}


@pytest.mark.parametrize("arch", ARCHS)
def test_compiles_without_warnings_or_spills(build, arch):
    result, _ = build[arch]
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr.lower(), result.stderr
    report = ptxas_report(result.stderr)
    assert set(report) == set(ALL_SYMBOLS), "every kernel of the file is a registered entry point"
    for name, (registers, _frame, stores, loads) in report.items():
        assert stores == loads == 0, f"{name} spills on {arch}"
        assert registers <= 32, f"{name}: {registers} registers on {arch} (full occupancy needs 32)"


@pytest.mark.parametrize("arch", ARCHS)
def test_ptx_entries_have_the_declared_parameter_lists(build, arch):
    entries = ptx_entries(build[arch][1])
    for name, ref in ALL_SYMBOLS.items():
        assert name in entries, f"no .entry {name} in the {arch} PTX"
        params = [parse_param(p) for p in ref.params]
        expected = ["u64" if p.pointer else PTX_TYPES[p.ctype] for p in params]
        assert entries[name] == expected, f"{name}: PTX {entries[name]} for the declared {ref.params}"


def test_source_spells_out_each_declared_signature():
    """Each entry point is written literally (no macro-made names) with the registry's list."""
    source = re.sub(r"\s+", " ", SOURCE.read_text())
    for name, ref in ALL_SYMBOLS.items():
        assert ref.path == "cuda/pointwise.cu"
        declaration = f'extern "C" __global__ void {name}({", ".join(ref.params)})'
        assert declaration in source, f"{name}: the source does not declare {declaration}"


# -- the per-element math, on the host --------------------------------------------------------------


@pytest.fixture(scope="module")
def lib(host_build_dir):
    lib = load("pointwise_host", host_build_dir)
    for name, ref in ALL_SYMBOLS.items():
        fn = getattr(lib, name.replace("capsule_", "host_", 1))
        fn.restype = None
        fn.argtypes = [ctypes.POINTER(ctypes.c_float) if p.pointer else
                       {"float": ctypes.c_float, "int64_t": ctypes.c_int64}[p.ctype]
                       for p in map(parse_param, ref.params)]
    return lib


def call(lib, symbol, arrays, params, n):
    """Run host_<op>_<dir> with the registry's parameter list: const pointers read the named
    array, writable pointers are fresh outputs (returned by name), scalars are params or n."""
    ref = ALL_SYMBOLS[symbol]
    args, outputs, alive = [], {}, []
    for p in map(parse_param, ref.params):
        if p.pointer and p.const:
            alive.append(np.ascontiguousarray(arrays[p.name], dtype=np.float32))
            args.append(alive[-1].ctypes.data_as(ctypes.POINTER(ctypes.c_float)))
        elif p.pointer:
            outputs[p.name] = np.full(n, np.nan, np.float32)
            args.append(outputs[p.name].ctypes.data_as(ctypes.POINTER(ctypes.c_float)))
        else:
            args.append(n if p.name == "n" else params[p.name])
    getattr(lib, symbol.replace("capsule_", "host_", 1))(*args)
    return outputs


def host_forward(lib, spec, arrays, params):
    shape = np.shape(arrays[spec.inputs[0].name])
    (out,) = call(lib, f"capsule_{spec.name}_fwd", arrays, params, int(np.prod(shape))).values()
    return out.reshape(shape)


def host_vjp(lib, spec, arrays, params, g):
    shape = g.shape
    outs = call(lib, f"capsule_{spec.name}_bwd", {**arrays, "g": g}, params, g.size)
    return {name[1:]: v.reshape(shape) for name, v in outs.items()}


def check_forward(lib, spec, sample):
    arrays, p, _ = validate(spec, sample.inputs, sample.params, np.float32)
    y = host_forward(lib, spec, arrays, p)
    r = REFERENCE.forward(spec, sample.inputs, **sample.params)
    m = REFERENCE.magnitude(spec, sample.inputs, **sample.params)
    result = compare(y, r, m, spec.error, 1, sample.worst_case)
    assert result.passed, f"{spec.name} forward {sample.summary()}: {result.reason} (worst {result.worst:.3g})"


def check_vjp(lib, spec, sample, g=None):
    arrays, p, out_shape = validate(spec, sample.inputs, sample.params, np.float32)
    if g is None:
        g = seeded_rng(spec.name, f"g/{sample.case}").standard_normal(out_shape).astype(np.float32)
    got = host_vjp(lib, spec, arrays, p, g)
    r = REFERENCE.vjp(spec, sample.inputs, g, **sample.params)
    m = REFERENCE.vjp_magnitude(spec, sample.inputs, g, **sample.params)
    assert set(got) == set(spec.differentiable)
    for name in spec.differentiable:
        result = compare(got[name], r[name], m[name], spec.vjp_error_for(name), 1, sample.worst_case)
        assert result.passed, f"{spec.name} d{name} {sample.summary()}: {result.reason} (worst {result.worst:.3g})"


def cases(spec):
    out = []
    for size in ("small", "medium"):
        out += spec.samples(size, seeded_rng(spec.name, size))
    return out + spec.edges()


@pytest.mark.parametrize("op", OPS)
def test_host_forward_meets_the_contract(lib, op):
    """Samples and edges (every special value; every ordered pair for binary ops): bitwise for the
    correctly rounded ops, the op's error model otherwise."""
    spec = get_spec(op)
    for sample in cases(spec):
        check_forward(lib, spec, sample)


@pytest.mark.parametrize("op", OPS)
def test_host_vjp_meets_the_contract(lib, op):
    spec = get_spec(op)
    for sample in cases(spec):
        check_vjp(lib, spec, sample)


@pytest.mark.parametrize("op", OPS)
def test_host_vjp_with_special_cotangents(lib, op):
    """Every special value of g against every special value of each input (0·inf, NaN and
    signed-zero handling of the backward formulas)."""
    spec = get_spec(op)
    s = SPECIAL_VALUES
    names = [t.name for t in spec.inputs]
    grids = np.meshgrid(*([s] * (len(names) + 1)), indexing="ij")
    inputs = {n: np.ascontiguousarray(a.ravel()) for n, a in zip(names, grids)}
    g = np.ascontiguousarray(grids[-1].ravel())
    sample = dataclasses.replace(spec.edges()[0], inputs=inputs, case="special-g", worst_case=True)
    check_vjp(lib, spec, sample, g)


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("op", OPS)
def test_host_math_on_random_bit_patterns(lib, op):
    """Every kind of float32 (NaN payloads, subnormals, huge) drawn as raw bits."""
    spec = get_spec(op)
    rng = seeded_rng(op, "host-bits")
    base = spec.edges()[0]
    inputs = {t.name: rng.integers(0, 2**32, 1 << 14, dtype=np.uint64).astype(np.uint32).view(np.float32)
              for t in spec.inputs}
    sample = dataclasses.replace(base, inputs=inputs, case="random-bits", worst_case=True)
    check_forward(lib, spec, sample)
    check_vjp(lib, spec, sample)


def f32(*values):
    return np.array(values, np.float32)


def bits(a):
    return np.asarray(a, np.float32).view(np.uint32).tolist()


def test_host_conventions_spelled_out(lib):
    """The spec's NaN / -0 / kink conventions, value by value."""
    nan, inf = np.nan, np.inf
    fwd = lambda op, *arrays, **p: host_forward(lib, get_spec(op), dict(zip(("x", "y"), arrays)), p)
    vjp = lambda op, *arrays, g, **p: host_vjp(lib, get_spec(op), dict(zip(("x", "y"), arrays)), p, g)
    assert bits(fwd("relu", f32(nan, -0.0, 0.0, -2.0, 3.0))) == bits(f32(0, 0, 0, 0, 3))
    assert bits(vjp("relu", f32(0.0, -0.0, 1e-45, nan), g=f32(5, 5, 5, 5))["x"]) == bits(f32(0, 0, 5, 0))
    assert bits(vjp("abs", f32(0.0, -0.0, nan, -2.0, 2.0), g=f32(3, 3, 3, 3, 3))["x"]) == bits(f32(0, 0, 0, -3, 3))
    assert bits(fwd("sqrt", f32(-0.0, 0.0))) == bits(f32(-0.0, 0.0)) and np.isnan(fwd("sqrt", f32(-1e-45))).all()
    assert bits(vjp("sqrt", f32(0.0, -0.0, -1.0), g=f32(1, 1, 1))["x"]) == bits(f32(0, 0, 0))
    assert bits(fwd("clamp", f32(nan, -inf, inf, -5.0), lo=-1.0, hi=2.0)) == bits(f32(-1, -1, 2, -1))
    assert bits(vjp("clamp", f32(-1.0, 2.0, 0.0, nan), g=f32(7, 7, 7, 7), lo=-1.0, hi=2.0)["x"]) == bits(f32(0, 0, 7, 0))
    assert bits(fwd("max", f32(0.0, -0.0, nan, 1.0), f32(-0.0, 0.0, 1.0, nan))) == bits(f32(0.0, 0.0, 1, 1))
    assert bits(fwd("min", f32(0.0, -0.0, nan, 1.0), f32(-0.0, 0.0, 1.0, nan))) == bits(f32(-0.0, -0.0, 1, 1))
    d = vjp("max", f32(2.0, 1.0, 0.0, nan), f32(1.0, 2.0, -0.0, 3.0), g=f32(4, 4, 4, 4))
    assert bits(d["x"]) == bits(f32(4, 0, 2, 2)) and bits(d["y"]) == bits(f32(0, 4, 2, 2))
    assert bits(fwd("inv", f32(0.0, -0.0))) == bits(f32(inf, -inf))
    assert np.isfinite(fwd("sigmoid", f32(-3e38, -1e4, -104.0, 104.0, 3e38))).all()
    assert bits(fwd("tanh", f32(-100.0, 100.0))) == bits(f32(-1, 1))
    assert abs(fwd("safe_log", f32(0.0), eps=1e-6)[0] - (-0.36651)) < 1e-5
    assert np.isnan(fwd("gelu", f32(-inf))).all() and fwd("gelu", f32(inf))[0] == inf
    assert bits(vjp("gelu", f32(-1e30, 1e30, inf), g=f32(1, 1, 1))["x"]) == bits(f32(0, 1, 1))


# -- launch plans -----------------------------------------------------------------------------------


def all_samples(spec):
    out = []
    for size in ("small", "medium", "large"):
        out += spec.samples(size, seeded_rng(spec.name, size))
    return out + spec.edges()


@pytest.mark.parametrize("op", OPS)
def test_plans_are_legal_for_every_sample(op):
    spec = get_spec(op)
    capsule = registry.lookup(op)
    forward_plan, backward_plan = plan_functions(capsule)
    assert PLANS[op] == (forward_plan, backward_plan)
    syms = {r.symbol: r for r in capsule.symbols}
    for sample in all_samples(spec):
        arrays, p, out_shape = validate(spec, sample.inputs, sample.params, np.float32)
        n = int(np.prod(out_shape))
        if n < 100_000:
            out_shape = REFERENCE.forward(spec, sample.inputs, **sample.params).shape
            g = np.zeros(out_shape, np.float32)
            grad_shapes = {k: v.shape for k, v in REFERENCE.vjp(spec, sample.inputs, g, **sample.params).items()}
        else:
            grad_shapes = shapes_of(arrays)
        fwd, bwd = forward_plan(arrays, p), backward_plan(arrays, p)
        for arch in ARCHS:
            for plan in (fwd, bwd):
                assert plan_problems(plan, syms, arch) == [], f"{op} {plan.direction} {sample.summary()}"
        assert dict(fwd.output_shapes) == {"out": out_shape}
        assert dict(bwd.output_shapes) == {f"d{k}": v for k, v in grad_shapes.items()}
        for plan in (fwd, bwd):
            (launch,) = plan.launches
            assert launch.block == (BLOCK, 1, 1)
            blocks = launch.grid[0]
            assert blocks * BLOCK * VECTOR >= n or blocks == 132 * 32, "about one vector per thread"
            assert {b.elements for b in plan.buffers} == {n}
        inputs = {b.name for b in fwd.buffers if b.role == "input"}
        assert inputs == {t.name for t in spec.inputs}


def test_planted_launch_faults_are_caught():
    spec = get_spec("clamp")
    arrays, p, _ = validate(spec, {"x": np.zeros(1000, np.float32)}, {"lo": -1.0, "hi": 1.0}, np.float32)
    plan = PLANS["clamp"][1](arrays, p)
    syms = symbols("clamp")
    (launch,) = plan.launches

    def problems(**changes):
        return plan_problems(dataclasses.replace(plan, launches=(dataclasses.replace(launch, **changes),)), syms)

    assert plan_problems(plan, syms) == []
    assert any("2048 threads" in m for m in problems(block=(2048, 1, 1)))
    assert any("5 arguments for 6" in m for m in problems(args=launch.args[:2] + launch.args[3:]))
    assert any("writable" in m for m in problems(args=("x", "g", "x", *launch.args[3:])))
    assert any("lo needs" in m for m in problems(args=(*launch.args[:3], "x", *launch.args[4:])))
    assert any("not declared" in m for m in problems(symbol="capsule_relu_bwd"))
