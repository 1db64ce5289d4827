"""Pointwise ops: same shape in, same shape out, no implicit broadcasting.

Each op is a short declaration through `unary` or `binary`; the formulas are dtype-generic
numpy (float64 for the reference, float32 for the numpy provider), so Python-float constants
only (NEP 50 keeps them weak) and parameters arrive as scalars of the working dtype.
"""

from __future__ import annotations

import numpy as np

from ..errors import ParamError, ShapeError
from .base import (SPECIAL_VALUES, Accumulation, Cost, ErrorCase, Exact, OpSpec, Param, Sample,
                   Tensor, f32, numel, require_same_shape, seeded_rng)

SIZES = {"small": ((7,), (3, 5)), "medium": ((64, 129),), "large": ((1024, 4099),)}
"""Sample shapes per size: odd and non-power-of-two, up to 4M elements."""

EXACT = Exact("one correctly rounded IEEE operation")


def _samples(name: str, inputs: tuple[str, ...], draw, params: dict):
    """Seeded sample inputs: `draw(rng, shape)` gives one float32 array of the op's domain."""
    def samples(size: str, rng: np.random.Generator) -> list[Sample]:
        out = []
        for i, shape in enumerate(SIZES[size]):
            arrays = {n: f32(draw(rng, shape)) for n in inputs}
            out.append(Sample(arrays, dict(params), f"{size}-{i}"))
        return out
    return samples


def _normal(scale: float = 2.0):
    return lambda rng, shape: scale * rng.standard_normal(shape)


def _edges(name: str, inputs: tuple[str, ...], params: dict, extra=()):
    """Empty, size 1, every special value, every pair of special values (binary), plus extras."""
    def edges() -> list[Sample]:
        s = SPECIAL_VALUES
        cases = [
            Sample({n: np.zeros((0,), np.float32) for n in inputs}, dict(params), "edge-empty", True),
            Sample({n: f32([0.75]) for n in inputs}, dict(params), "edge-one", True),
            Sample({n: np.zeros((2, 0, 3), np.float32) for n in inputs}, dict(params), "edge-empty-3d", True),
        ]
        if len(inputs) == 1:
            cases.append(Sample({inputs[0]: s.copy()}, dict(params), "edge-special", True))
        else:
            a, b = np.meshgrid(s, s, indexing="ij")
            cases.append(Sample({inputs[0]: f32(a), inputs[1]: f32(b)}, dict(params), "edge-special-pairs", True))
        rng = seeded_rng(name, "edge-odd")
        cases.append(Sample({n: f32(rng.standard_normal((3, 37))) for n in inputs}, dict(params), "edge-odd", True))
        return cases + [Sample(inputs=x, params={**params, **p}, case=c, worst_case=True) for x, p, c in extra]
    return edges


def _common_errors(name: str, inputs: tuple[str, ...], params: dict):
    errors = [ErrorCase(Sample({n: np.zeros(3, np.float32) for n in inputs[:-1]}, dict(params), "error-missing-input"),
                       ShapeError, rf"{inputs[-1]}: required input is missing")]
    if len(inputs) == 2:
        errors.append(ErrorCase(Sample({inputs[0]: np.zeros((2, 3), np.float32), inputs[1]: np.zeros((3, 2), np.float32)},
                                       dict(params), "error-shape-mismatch"), ShapeError, rf"{inputs[1]}: must have the shape of {inputs[0]}"))
    return errors


def _same_shape(name: str, inputs: tuple[str, ...]):
    def shape(shapes, params):
        for n in inputs[1:]:
            require_same_shape(name, n, shapes[n], inputs[0], shapes[inputs[0]])
        return tuple(shapes[inputs[0]])
    return shape


def pointwise(name: str, *, inputs: tuple[str, ...], forward, vjp, magnitude, vjp_magnitude,
              error, vjp_error, flops: int, params: tuple[Param, ...] = (), draw=_normal(),
              sample_params: dict | None = None, extra_edges=(), extra_errors=(), check_params=None,
              doc: str = "") -> OpSpec:
    """The family factory. `flops` counts floating-point operations per element (cost model);
    `check_params(params)` raises ParamError for range rules beyond the generic type check."""
    sample_params = dict(sample_params or {})
    same = _same_shape(name, inputs)

    def shape(shapes, p):
        if check_params is not None:
            check_params(p)
        return same(shapes, p)

    def cost(shapes, p):
        n = numel(shapes[inputs[0]])
        return Cost(bytes_read=4 * n * len(inputs), bytes_written=4 * n, flops=flops * n)

    return OpSpec(
        name=name, family="pointwise",
        inputs=tuple(Tensor(n, "(…)") for n in inputs), params=params,
        shape_rule=f"shape of {inputs[0]}", shape=shape,
        forward=forward, vjp=vjp, magnitude=magnitude, vjp_magnitude=vjp_magnitude,
        error=error, vjp_error=vjp_error, cost=cost,
        samples=_samples(name, inputs, draw, sample_params),
        edges=_edges(name, inputs, sample_params, extra_edges),
        errors=lambda: _common_errors(name, inputs, sample_params) + [e() for e in extra_errors],
        doc=doc,
    )


def _abs_dict(**arrays):
    return {k: np.abs(np.asarray(v, dtype=np.float64)) for k, v in arrays.items()}


# -- relu: x if x > 0 else 0 (NaN → 0, −0 → +0); relu′(0) = 0 ------------------------------

RELU = pointwise(
    "relu", inputs=("x",),
    forward=lambda a, p: np.where(a["x"] > 0, a["x"], 0.0).astype(a["x"].dtype),
    vjp=lambda a, p, y, g: {"x": np.where(a["x"] > 0, g, 0.0).astype(g.dtype)},
    magnitude=lambda a, p, y: np.abs(y),
    vjp_magnitude=lambda a, p, y, g: _abs_dict(x=np.where(a["x"] > 0, g, 0.0)),
    error=Exact("a selection, no rounding"), vjp_error=Exact("a selection, no rounding"), flops=1,
    doc="relu(x) = x if x > 0 else 0; NaN -> 0, -0 -> +0; relu'(0) = 0.",
)

# -- add: x + y ------------------------------------------------------------------------------

ADD = pointwise(
    "add", inputs=("x", "y"),
    forward=lambda a, p: a["x"] + a["y"],
    vjp=lambda a, p, y, g: {"x": g.copy(), "y": g.copy()},
    magnitude=lambda a, p, y: np.abs(a["x"]) + np.abs(a["y"]),
    vjp_magnitude=lambda a, p, y, g: _abs_dict(x=g, y=g),
    error=EXACT, vjp_error=Exact("a copy"), flops=1,
    doc="add(x, y) = x + y, correctly rounded.",
)

# -- scale: c·x ------------------------------------------------------------------------------

SCALE = pointwise(
    "scale", inputs=("x",), params=(Param("c", "float", doc="the constant factor"),),
    forward=lambda a, p: p["c"] * a["x"],
    vjp=lambda a, p, y, g: {"x": p["c"] * g},
    magnitude=lambda a, p, y: np.abs(y),
    vjp_magnitude=lambda a, p, y, g: _abs_dict(x=p["c"] * g),
    error=EXACT, vjp_error=EXACT, flops=1, sample_params={"c": -1.75},
    extra_errors=(lambda: ErrorCase(Sample({"x": f32([1.0])}, {"c": float("nan")}, "error-c-nan"),
                                    ParamError, r"c: must be finite"),
                  lambda: ErrorCase(Sample({"x": f32([1.0])}, {}, "error-c-missing"),
                                    ParamError, r"c: required parameter is missing")),
    doc="scale(x, c) = c*x with c rounded to float32.",
)

SPECS = (RELU, ADD, SCALE)
