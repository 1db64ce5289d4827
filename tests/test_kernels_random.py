"""cuda/random.cu without a GPU: the build, the registry's entry points, the launch plans, the
keyed stream and Bernoulli threshold of cuda/random.cuh compiled for the host, and the kernels
themselves run on the CPU emulator: bitwise the reference generator, for any grid."""

import ctypes

import family_checks as fc
import numpy as np
import pytest
from hostmath import f32_ptr, load
from kernel_emu import emulator as family_emulator
from kernel_emu import unwritten

from capsule_core.catalog import reference, registry
from capsule_core.kernels.plans import random as plans
from capsule_core.ops import get_spec
from capsule_core.ops.base import Sample, validate
from capsule_core.ops.random import uniform_values

FAMILY = "random"
OPS = ("rand_uniform", "bernoulli_mask")
SEEDS = (0, 1, 1234567, 2**63 + 5, 2**64 - 1)


@pytest.fixture(scope="module")
def lib(host_build_dir):
    lib = load("random_host", host_build_dir)
    lib.host_keyed_uniform.argtypes = [ctypes.c_uint64, ctypes.c_int64, ctypes.POINTER(ctypes.c_float)]
    lib.host_bernoulli.argtypes = [ctypes.c_uint64, ctypes.c_float, ctypes.c_int64, ctypes.POINTER(ctypes.c_float)]
    lib.host_bernoulli_threshold.argtypes = [ctypes.c_float, ctypes.c_float]
    lib.host_bernoulli_threshold.restype = ctypes.c_float
    return lib


@pytest.fixture(scope="module")
def emulator():
    """PlanRunners of the family at any grid cap: emulator(max_grid)."""
    return lambda max_grid=4: family_emulator((max_grid, max_grid))


@pytest.mark.parametrize("op", OPS)
def test_plans_are_legal_for_every_sample_and_edge(op):
    assert fc.plan_case_problems(op) == []
    assert registry.lookup(op).vjp.provenance == () and plans.PLANS[op][1] is None


def test_planted_plan_faults_are_caught():
    plan = plans.PLANS["bernoulli_mask"][0]({}, {"shape": (3, 5), "p": 0.25, "seed": 7})
    launch = plan.launches[0]
    assert launch.args == ("out", 7, np.float32(0.25), 15) and launch.block == (plans.THREADS, 1, 1)
    faults = [("seed = -1 does not fit uint64_t", {"args": ("out", -1, 0.25, 15)})]
    assert fc.missed_launch_faults(plan, fc.symbols("bernoulli_mask"), faults) == []


@pytest.mark.parametrize("seed", SEEDS)
def test_host_keyed_stream_is_the_reference_generator(lib, seed):
    n = 4099
    u = np.empty(n, np.float32)
    lib.host_keyed_uniform(seed, n, f32_ptr(u))
    assert np.array_equal(u, uniform_values(seed, n, np.float32))
    for p in (0.0, 2.0**-24, 0.3, 0.5, 1.0):
        mask = np.empty(n, np.float32)
        lib.host_bernoulli(seed, np.float32(p), n, f32_ptr(mask))
        want = reference.forward("bernoulli_mask", {}, shape=(n,), p=p, seed=seed)
        assert np.array_equal(mask, want.astype(np.float32)), p


def test_host_bernoulli_threshold_is_strict(lib):
    t = lib.host_bernoulli_threshold
    assert t(0.0, 0.0) == 0.0 and t(0.0, 2.0**-24) == 1.0 and t(0.5, 0.5) == 0.0 and t(0.5, 0.50000006) == 1.0
    assert t(1.0 - 2.0**-24, 1.0) == 1.0


def _run(emulator, op, params, misalign=None, max_grid=4):
    spec = get_spec(op)
    _, p, _ = validate(spec, {}, params, np.float32)
    plan = plans.PLANS[op][0]({}, p)
    return emulator(max_grid).run(plan, {}, misalign)["out"]


@pytest.mark.parametrize("op", OPS)
def test_emulated_kernels_are_bitwise_the_reference(emulator, op):
    for sample in fc.cases(op, ("small", "medium", "large")):
        y = _run(emulator, op, sample.params)
        assert not unwritten(y).any(), sample.case
        want = reference.forward(op, {}, **sample.params).astype(np.float32)
        assert np.array_equal(y.view(np.uint32), want.view(np.uint32)), sample.summary()


@pytest.mark.parametrize("op", OPS)
def test_emulated_bits_do_not_depend_on_the_grid_or_alignment(emulator, op):
    params = {"shape": (37, 29), "seed": 2**64 - 3, **({"p": 0.5} if op == "bernoulli_mask" else {})}
    want = reference.forward(op, {}, **params).astype(np.float32)
    for max_grid, misalign in ((1, None), (2, {"out": 1}), (3, {"out": 2}), (5, {"out": 3})):
        y = _run(emulator, op, params, misalign, max_grid)
        assert np.array_equal(y.view(np.uint32), want.view(np.uint32)), (max_grid, misalign)


def test_emulated_bernoulli_edges(emulator):
    for p, value in ((0.0, 0.0), (1.0, 1.0)):
        y = _run(emulator, "bernoulli_mask", {"shape": (1001,), "p": p, "seed": 3})
        assert (y == value).all()
    sample = Sample({}, {"shape": (64, 129), "p": 0.3, "seed": 11}, "rate")
    y = _run(emulator, "bernoulli_mask", sample.params)
    assert abs(y.mean() - 0.3) < 0.02
