"""Every OpSpec, generically: error inputs refused, shapes honest, the numpy float32 provider
within the tolerance model of the float64 reference, the reference VJP right by calculus."""

import re

import numpy as np
import pytest

from capsule_core.catalog.cpu_providers import NUMPY_F32, REFERENCE
from capsule_core.ops import all_specs
from capsule_core.ops.base import Cost, InputError, numel, seeded_rng, shapes_of, validate
from capsule_core.verify import gradcheck
from capsule_core.verify.numerics import compare

SPECS = list(all_specs().values())
IDS = [s.name for s in SPECS]
VJP_SPECS = [s for s in SPECS if s.has_vjp]


def _cases(spec, sizes=("small", "medium")):
    out = []
    for size in sizes:
        out += spec.samples(size, seeded_rng(spec.name, size))
    return out + spec.edges()


def _check_forward(spec, sample):
    r = REFERENCE.forward(spec, sample.inputs, **sample.params)
    y = NUMPY_F32.forward(spec, sample.inputs, **sample.params)
    m = REFERENCE.magnitude(spec, sample.inputs, **sample.params)
    arrays, p, _ = validate(spec, sample.inputs, sample.params)
    n = spec.error.length(shapes_of(arrays), p) if hasattr(spec.error, "length") else 1
    result = compare(y, r, m, spec.error, n, sample.worst_case)
    assert result.passed, f"{spec.name} {sample.summary()}: {result.reason}"


def _check_vjp(spec, sample):
    r_y = REFERENCE.forward(spec, sample.inputs, **sample.params)
    g = seeded_rng(spec.name, f"g/{sample.case}").standard_normal(r_y.shape).astype(np.float32)
    r = REFERENCE.vjp(spec, sample.inputs, g, **sample.params)
    y = NUMPY_F32.vjp(spec, sample.inputs, g, **sample.params)
    m = REFERENCE.vjp_magnitude(spec, sample.inputs, g, **sample.params)
    arrays, p, _ = validate(spec, sample.inputs, sample.params)
    shapes = shapes_of(arrays)
    for name in spec.differentiable:
        model = spec.vjp_error_for(name)
        n = model.length(shapes, p) if hasattr(model, "length") else 1
        pairs = zip(y[name], r[name], m[name]) if isinstance(r[name], tuple) else [(y[name], r[name], m[name])]
        for yi, ri, mi in pairs:
            result = compare(yi, ri, mi, model, n, sample.worst_case)
            assert result.passed, f"{spec.name} d{name} {sample.summary()}: {result.reason}"


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_error_inputs_are_refused_naming_the_argument(spec):
    cases = spec.errors()
    assert cases, f"{spec.name} declares no error inputs"
    for case in cases:
        with pytest.raises(case.error) as info:
            REFERENCE.forward(spec, case.sample.inputs, **case.sample.params)
        message = str(info.value)
        assert message.startswith(f"{spec.name}: "), message
        assert re.search(case.match, message), f"{case.sample.case}: {message!r} !~ {case.match!r}"


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_samples_and_edges_follow_the_shape_rule(spec):
    for sample in _cases(spec, ("small", "medium", "large")):
        arrays, p, out_shape = validate(spec, sample.inputs, sample.params)
        if sample.inputs and numel(out_shape) < 2_000_000:
            y = REFERENCE.forward(spec, sample.inputs, **sample.params)
            assert y.shape == out_shape and y.dtype == np.float64
        cost = spec.cost(shapes_of(arrays), p)
        assert isinstance(cost, Cost)
        assert min(cost.bytes_read, cost.bytes_written, cost.flops) >= 0


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_numpy_provider_forward_within_the_error_model(spec):
    for sample in _cases(spec):
        _check_forward(spec, sample)


@pytest.mark.parametrize("spec", VJP_SPECS, ids=[s.name for s in VJP_SPECS])
def test_numpy_provider_vjp_within_the_error_model(spec):
    for sample in _cases(spec):
        _check_vjp(spec, sample)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_numpy_provider_large_samples(spec):
    for sample in spec.samples("large", seeded_rng(spec.name, "large")):
        _check_forward(spec, sample)


@pytest.mark.parametrize("spec", VJP_SPECS, ids=[s.name for s in VJP_SPECS])
def test_reference_vjp_matches_finite_differences(spec):
    for sample in spec.samples("small", seeded_rng(spec.name, "small")):
        result = gradcheck.finite_difference(spec, sample)
        assert result.passed, f"{spec.name} {sample.case}: worst {result.worst:.3g}: {result.detail}"


@pytest.mark.parametrize("spec", VJP_SPECS, ids=[s.name for s in VJP_SPECS])
def test_reference_vjp_satisfies_the_adjoint_identity(spec):
    for sample in spec.samples("small", seeded_rng(spec.name, "small")) + spec.samples(
        "medium", seeded_rng(spec.name, "medium")
    ):
        result = gradcheck.adjoint_identity(spec, sample)
        assert result.passed, f"{spec.name} {sample.case}: worst {result.worst:.3g}: {result.detail}"


def test_input_errors_are_value_errors():
    assert issubclass(InputError, ValueError)
