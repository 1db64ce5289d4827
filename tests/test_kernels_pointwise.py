"""cuda/pointwise.cu without a GPU: it compiles cleanly for sm_80 and sm_90 with the registry's
entry points, its per-element math (cuda/pointwise.cuh, compiled for the host) meets each op's
contract against the float64 reference, and its launch plans are legal for every sample."""

import dataclasses

import family_checks as fc
import numpy as np
import pytest
from hostmath import declare_kernels, f32_ptr, load

from capsule_core.catalog import native_cuda
from capsule_core.kernels.launch import parse_param
from capsule_core.kernels.plans.pointwise import BLOCK, VECTOR
from capsule_core.ops import get_spec
from capsule_core.ops.base import SPECIAL_VALUES, seeded_rng

FAMILY = "pointwise"
OPS = tuple(op for op, family in native_cuda.FAMILIES.items() if family == FAMILY)
"""The pointwise ops in catalog order."""
ALL_SYMBOLS = fc.symbols(*OPS)


# -- the build ------------------------------------------------------------------------------------


# -- the per-element math, on the host --------------------------------------------------------------


@pytest.fixture(scope="module")
def lib(host_build_dir):
    return declare_kernels(load("pointwise_host", host_build_dir), ALL_SYMBOLS.values())


def call(lib, symbol, arrays, params, n):
    """Run host_<op>_<dir> with the registry's parameter list: const pointers read the named
    array, writable pointers are fresh outputs (returned by name), scalars are params or n."""
    ref = ALL_SYMBOLS[symbol]
    args, outputs, alive = [], {}, []
    for p in map(parse_param, ref.params):
        if p.pointer and p.const:
            alive.append(np.ascontiguousarray(arrays[p.name], dtype=np.float32))
            args.append(f32_ptr(alive[-1]))
        elif p.pointer:
            outputs[p.name] = np.full(n, np.nan, np.float32)
            args.append(f32_ptr(outputs[p.name]))
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
    fc.check_host_model(spec.name, sample, forward=lambda arrays, p: host_forward(lib, spec, arrays, p))


def check_vjp(lib, spec, sample, g=None):
    fc.check_host_model(spec.name, sample, vjp=lambda arrays, p, g: host_vjp(lib, spec, arrays, p, g), g=g)


@pytest.mark.parametrize("op", OPS)
def test_host_forward_meets_the_contract(lib, op):
    """Samples and edges (every special value; every ordered pair for binary ops): bitwise for the
    correctly rounded ops, the op's error model otherwise."""
    spec = get_spec(op)
    for sample in fc.cases(op, ("small", "medium")):
        check_forward(lib, spec, sample)


@pytest.mark.parametrize("op", OPS)
def test_host_vjp_meets_the_contract(lib, op):
    spec = get_spec(op)
    for sample in fc.cases(op, ("small", "medium")):
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
    inputs = {
        t.name: rng.integers(0, 2**32, 1 << 14, dtype=np.uint64).astype(np.uint32).view(np.float32) for t in spec.inputs
    }
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

    def fwd(op, *arrays, **p):
        return host_forward(lib, get_spec(op), dict(zip(("x", "y"), arrays)), p)

    def vjp(op, *arrays, g, **p):
        return host_vjp(lib, get_spec(op), dict(zip(("x", "y"), arrays)), p, g)

    assert bits(fwd("relu", f32(nan, -0.0, 0.0, -2.0, 3.0))) == bits(f32(0, 0, 0, 0, 3))
    assert bits(vjp("relu", f32(0.0, -0.0, 1e-45, nan), g=f32(5, 5, 5, 5))["x"]) == bits(f32(0, 0, 5, 0))
    assert bits(vjp("abs", f32(0.0, -0.0, nan, -2.0, 2.0), g=f32(3, 3, 3, 3, 3))["x"]) == bits(f32(0, 0, 0, -3, 3))
    assert bits(fwd("sqrt", f32(-0.0, 0.0))) == bits(f32(-0.0, 0.0)) and np.isnan(fwd("sqrt", f32(-1e-45))).all()
    assert bits(vjp("sqrt", f32(0.0, -0.0, -1.0), g=f32(1, 1, 1))["x"]) == bits(f32(0, 0, 0))
    assert bits(fwd("clamp", f32(nan, -inf, inf, -5.0), lo=-1.0, hi=2.0)) == bits(f32(-1, -1, 2, -1))
    assert bits(vjp("clamp", f32(-1.0, 2.0, 0.0, nan), g=f32(7, 7, 7, 7), lo=-1.0, hi=2.0)["x"]) == bits(
        f32(0, 0, 7, 0)
    )
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


def _one_vector_launch_per_plan(case):
    """A block of BLOCK threads, about one vector per thread, every buffer the size of the output."""
    n = int(np.prod(case.out_shape))
    for plan in case.plans:
        (launch,) = plan.launches
        assert launch.block == (BLOCK, 1, 1)
        blocks = launch.grid[0]
        assert blocks * BLOCK * VECTOR >= n or blocks == 132 * 32, "about one vector per thread"
        assert {b.elements for b in plan.buffers} == {n}


@pytest.mark.parametrize("op", OPS)
def test_plans_are_legal_for_every_sample(op):
    assert fc.plan_case_problems(op, reference_shapes=100_000, check=_one_vector_launch_per_plan) == []


def test_planted_launch_faults_are_caught():
    _, plan = fc.launch_plans("clamp", {"x": np.zeros(1000, np.float32)}, {"lo": -1.0, "hi": 1.0})
    (launch,) = plan.launches
    faults = [
        ("5 arguments for 6", {"args": launch.args[:2] + launch.args[3:]}),
        ("writable", {"args": ("x", "g", "x", *launch.args[3:])}),
        ("lo needs", {"args": (*launch.args[:3], "x", *launch.args[4:])}),
        ("not declared", {"symbol": "capsule_relu_bwd"}),
    ]
    assert fc.missed_launch_faults(plan, fc.symbols("clamp"), faults) == []
