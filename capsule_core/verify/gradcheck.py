"""The reference VJP checked against calculus: central finite differences and the adjoint
identity ⟨J v, u⟩ = ⟨v, Jᵀ u⟩, both in float64 (the `vjp.reference` check)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from capsule_core.catalog.cpu_providers import REFERENCE
from capsule_core.ops.base import OpSpec, Sample, seeded_rng

STEP = 1e-6
RTOL = 1e-5
ROUNDOFF = 100 * np.finfo(np.float64).eps
"""Absolute allowance of a difference quotient: roundoff of the objective over the step."""


@dataclass(frozen=True)
class GradCheck:
    """`worst` is the largest error over its allowance (≤ 1 passes)."""

    passed: bool
    worst: float
    detail: str = ""


def _float64_inputs(sample: Sample) -> dict:
    def conv(v):
        if isinstance(v, (tuple, list)):
            return tuple(conv(x) for x in v)
        a = np.asarray(v)
        return a.astype(np.float64) if a.dtype.kind == "f" else a

    return {k: conv(v) for k, v in sample.inputs.items()}


def _leaves(spec: OpSpec, inputs: dict):
    """(input name, index in a variadic list or None, array) for every differentiable array."""
    for name in spec.differentiable:
        value = inputs[name]
        if isinstance(value, tuple):
            for i, a in enumerate(value):
                yield name, i, a
        else:
            yield name, None, value


def _with(inputs: dict, name: str, i, array) -> dict:
    out = dict(inputs)
    if i is None:
        out[name] = array
    else:
        items = list(out[name])
        items[i] = array
        out[name] = tuple(items)
    return out


def _grad(grads: dict, name: str, i):
    return grads[name] if i is None else grads[name][i]


def _objective(spec, inputs, params, u) -> float:
    return float(np.sum(REFERENCE.forward(spec, inputs, **params) * u))


def finite_difference(spec: OpSpec, sample: Sample, max_elements: int = 400) -> GradCheck:
    """Every gradient element against (f(x + h·e_i) − f(x − h·e_i)) / 2h of f = ⟨forward, u⟩."""
    inputs = _float64_inputs(sample)
    rng = seeded_rng(spec.name, f"fd/{sample.case}")
    y = REFERENCE.forward(spec, inputs, **sample.params)
    u = rng.standard_normal(y.shape)
    grads = REFERENCE.vjp(spec, inputs, u, **sample.params)
    size = float(np.sum(np.abs(np.nan_to_num(y * u))))
    worst, detail = 0.0, ""
    for name, i, a in _leaves(spec, inputs):
        flat = a.reshape(-1)
        picks = (
            np.arange(flat.size) if flat.size <= max_elements else rng.choice(flat.size, max_elements, replace=False)
        )
        analytic = _grad(grads, name, i).reshape(-1)
        for j in picks:
            h = STEP * max(1.0, abs(flat[j]))
            plus, minus = flat.copy(), flat.copy()
            plus[j] += h
            minus[j] -= h
            fp = _objective(spec, _with(inputs, name, i, plus.reshape(a.shape)), sample.params, u)
            fm = _objective(spec, _with(inputs, name, i, minus.reshape(a.shape)), sample.params, u)
            numeric = (fp - fm) / (2 * h)
            allowance = RTOL * (abs(numeric) + abs(analytic[j])) + ROUNDOFF * size / h
            ratio = abs(numeric - analytic[j]) / allowance
            if ratio > worst:
                worst = ratio
                detail = f"{name}{'' if i is None else f'[{i}]'} element {int(j)}: vjp {analytic[j]!r}, finite difference {numeric!r}"
    return GradCheck(worst <= 1.0, worst, detail)


def adjoint_identity(spec: OpSpec, sample: Sample) -> GradCheck:
    """⟨J v, u⟩ with J v by a central difference along a random direction v, against ⟨v, Jᵀ u⟩."""
    inputs = _float64_inputs(sample)
    rng = seeded_rng(spec.name, f"adjoint/{sample.case}")
    y = REFERENCE.forward(spec, inputs, **sample.params)
    u = rng.standard_normal(y.shape)
    grads = REFERENCE.vjp(spec, inputs, u, **sample.params)
    plus, minus, rhs, scale = dict(inputs), dict(inputs), 0.0, 0.0
    for name, i, a in _leaves(spec, inputs):
        v = rng.standard_normal(a.shape)
        h = STEP * max(1.0, float(np.max(np.abs(a), initial=0.0)))
        plus = _with(plus, name, i, a + h * v)
        minus = _with(minus, name, i, a - h * v)
        g = _grad(grads, name, i)
        rhs += h * float(np.sum(v * g))
        scale += h * float(np.sum(np.abs(v * g)))
    yp = REFERENCE.forward(spec, plus, **sample.params)
    ym = REFERENCE.forward(spec, minus, **sample.params)
    lhs = float(np.sum((yp - ym) * u) / 2)
    lhs_scale = float(np.sum(np.abs((yp - ym) * u)) / 2)
    size = float(np.sum(np.abs(np.nan_to_num(y * u))))
    allowance = RTOL * (scale + lhs_scale) + ROUNDOFF * size + 1e-300
    worst = abs(lhs - rhs) / allowance
    return GradCheck(worst <= 1.0, worst, f"<Jv,u> = {lhs!r}, <v,J^T u> = {rhs!r} (both times h)")
