"""Reductions: the sum or mean over one axis (removed) or over everything (shape ())."""

from __future__ import annotations

import numpy as np

from capsule_core.errors import ParamError, ShapeError
from capsule_core.ops import base

SIZES = {
    "small": (((7,), None), ((3, 5), 1), ((2, 3, 4), -3)),
    "medium": (((64, 129), 0), ((100_003,), None)),
    "large": (((1024, 4099), -1), ((4_000_037,), None)),
}
"""Sample (shape, axis) per size: every axis form, odd and non-power-of-two lengths."""

AXIS = base.Param("axis", "axis_or_none", default=None, doc="axis to reduce (negative counts from the end), None = all")


def _axis(x_shape, params):
    """The normalised axis, or None for a reduction over everything."""
    axis = params["axis"]
    return None if axis is None else axis % len(x_shape)


def _count(x_shape, params) -> int:
    """n: how many elements each output sums."""
    axis = _axis(x_shape, params)
    return base.numel(x_shape) if axis is None else int(x_shape[axis])


def _reduced_shape(x_shape, params) -> tuple:
    axis = _axis(x_shape, params)
    return () if axis is None else tuple(x_shape[:axis]) + tuple(x_shape[axis + 1 :])


def _shape(op: str):
    def shape(shapes, params):
        if params["axis"] is not None:
            base.normalize_axis(op, "axis", params["axis"], len(shapes["x"]))
        return _reduced_shape(tuple(shapes["x"]), params)

    return shape


def _sum(x, params):
    return np.asarray(np.sum(x, axis=_axis(x.shape, params)))


def _broadcast_back(g, x_shape, params):
    """g of the output shape, repeated along the reduced axis (or everywhere)."""
    axis = _axis(x_shape, params)
    expanded = g if axis is None else np.expand_dims(g, axis)
    return np.broadcast_to(expanded, x_shape).copy()


def _inverse_count(x_shape, params) -> float:
    """1/n as a Python float (weak under NEP 50); NaN for n = 0, so an empty mean is NaN."""
    n = _count(x_shape, params)
    return 1.0 / n if n else float("nan")


def _mean(x, params):
    return _sum(x, params) * _inverse_count(x.shape, params)


def _mean_vjp(a, params, y, g):
    x = a["x"]
    if x.size == 0:
        return {"x": np.zeros_like(x)}
    return {"x": _broadcast_back(g * _inverse_count(x.shape, params), x.shape, params)}


def _samples(size: str, rng: np.random.Generator) -> list[base.Sample]:
    return [
        base.Sample({"x": base.f32(2.0 * rng.standard_normal(shape))}, {"axis": axis}, f"{size}-{i}")
        for i, (shape, axis) in enumerate(SIZES[size])
    ]


def _special_rows() -> np.ndarray:
    """Rows of special values whose float32 sum cannot overflow (no 3e38 + 3e38)."""
    nan, inf = np.nan, np.inf
    return base.f32(
        [
            [nan, 1.0, 2.0],
            [inf, 1.0, -2.0],
            [-inf, 0.5, 3e38],
            [inf, -inf, 0.0],
            [3e38, -3e38, 1.0],
            [1e-45, 1e-45, -1e-45],
            [-0.0, -0.0, -0.0],
            [1.1754942e-38, -1e-45, 0.0],
        ]
    )


def _edges(op: str):
    def edges() -> list[base.Sample]:
        rng = base.seeded_rng(op, "edge-odd")
        cases = [
            ({"x": np.zeros((0,), np.float32)}, {"axis": None}, "edge-empty"),
            ({"x": np.zeros((2, 0, 3), np.float32)}, {"axis": None}, "edge-empty-3d-all"),
            ({"x": np.zeros((2, 0, 3), np.float32)}, {"axis": 1}, "edge-empty-axis"),
            ({"x": np.zeros((2, 0, 3), np.float32)}, {"axis": 0}, "edge-empty-output"),
            ({"x": base.f32(0.75)}, {"axis": None}, "edge-rank0"),
            ({"x": base.f32([0.75])}, {"axis": 0}, "edge-one"),
            ({"x": base.f32(rng.standard_normal((3, 37, 5)))}, {"axis": 1}, "edge-odd-middle"),
            ({"x": base.f32(rng.standard_normal((3, 37, 5)))}, {"axis": -1}, "edge-odd-last"),
            ({"x": _special_rows()}, {"axis": 1}, "edge-special-rows"),
            (
                {
                    "x": base.SPECIAL_VALUES[
                        np.isfinite(base.SPECIAL_VALUES) & (np.abs(base.SPECIAL_VALUES) < 1e38)
                    ].copy()
                },
                {"axis": None},
                "edge-special-finite",
            ),
            ({"x": np.full((4097,), 0.1, np.float32)}, {"axis": 0}, "edge-same-sign-4097"),
            ({"x": base.f32(np.abs(rng.standard_normal((3, 100_001))))}, {"axis": -1}, "edge-same-sign-long"),
        ]
        return [base.Sample(x, p, c, True) for x, p, c in cases]

    return edges


def _errors() -> list[base.ErrorCase]:
    x2 = np.zeros((2, 3), np.float32)
    cases = [
        ({"x": x2}, {"axis": 2}, ParamError, r"axis: must be in \[-2, 2\) for rank 2, got 2"),
        ({"x": x2}, {"axis": -3}, ParamError, r"axis: must be in \[-2, 2\) for rank 2, got -3"),
        ({"x": base.f32(1.0)}, {"axis": 0}, ParamError, r"axis: must be in \[0, 0\) for rank 0"),
        ({"x": x2}, {"axis": 1.0}, ParamError, r"axis: must be an int or None"),
        ({}, {}, ShapeError, r"x: required input is missing"),
    ]
    return [base.ErrorCase(base.Sample(x, p, f"error-{i}"), e, m) for i, (x, p, e, m) in enumerate(cases)]


def _order_inputs() -> list[base.Sample]:
    """The three orders as rows, summed along the contiguous axis, along the strided one, and
    all together (the rows one after another)."""
    rows = np.stack(list(base.order_terms().values()))
    return [
        base.Sample({"x": rows}, {"axis": -1}, "order-rows", True),
        base.Sample({"x": np.ascontiguousarray(rows.T)}, {"axis": 0}, "order-columns", True),
        base.Sample({"x": rows}, {"axis": None}, "order-all", True),
    ]


def _left_fold_sum(a, p):
    """((x0 + x1) + x2) + … in the working dtype along the axis (ufunc accumulate is sequential)."""
    x = a["x"]
    axis = _axis(x.shape, p)
    terms = x.reshape(-1) if axis is None else np.moveaxis(x, axis, -1)
    if terms.shape[-1] == 0:
        return np.zeros(terms.shape[:-1], x.dtype)
    return np.asarray(np.add.accumulate(terms, axis=-1)[..., -1])


def _cost(extra_flops_per_output: int):
    def cost(shapes, params):
        size = base.numel(shapes["x"])
        outputs = base.numel(_reduced_shape(shapes["x"], params))
        # One addition per input element, plus the per-output scaling of the mean.
        return base.Cost(bytes_read=4 * size, bytes_written=4 * outputs, flops=size + extra_flops_per_output * outputs)

    return cost


def reduction(name: str, *, left_fold, extra_flops_per_output: int, doc: str, **reference) -> base.OpSpec:
    """The family factory: one input x, the axis parameter, the shape rule above. `reference` is
    the op's forward, vjp, magnitude, vjp_magnitude, error and vjp_error, as OpSpec takes them."""
    return base.OpSpec(
        name=name,
        family="reduce",
        inputs=(base.Tensor("x", "(…)"),),
        params=(AXIS,),
        shape_rule="x.shape without axis; () for axis=None",
        shape=_shape(name),
        **reference,
        cost=_cost(extra_flops_per_output),
        samples=_samples,
        edges=_edges(name),
        errors=_errors,
        order_inputs=_order_inputs,
        left_fold=left_fold,
        doc=doc,
    )


def _abs_sum(a, params):
    return np.asarray(np.sum(np.abs(a["x"]), axis=_axis(a["x"].shape, params)), dtype=np.float64)


def _length(shapes, params) -> int:
    return _count(tuple(shapes["x"]), params)


# -- reduce_sum: Σ x over the axis; empty → 0 ----------------------------------------------

REDUCE_SUM = reduction(
    "reduce_sum",
    forward=lambda a, p: _sum(a["x"], p),
    vjp=lambda a, p, y, g: {"x": _broadcast_back(g, a["x"].shape, p)},
    magnitude=lambda a, p, y: _abs_sum(a, p),
    vjp_magnitude=lambda a, p, y, g: {"x": np.abs(_broadcast_back(g, a["x"].shape, p)).astype(np.float64)},
    error=base.Accumulation(1, "n-term sum: n-1 additions inside gamma_n, one spare", _length),
    vjp_error=base.Exact("a copy of g"),
    left_fold=_left_fold_sum,
    extra_flops_per_output=0,
    doc="reduce_sum(x, axis=None): sum over axis (removed) or of everything (shape ()); empty -> 0.",
)

# -- reduce_mean: Σ x · (1/n); empty → NaN -------------------------------------------------

REDUCE_MEAN = reduction(
    "reduce_mean",
    forward=lambda a, p: _mean(a["x"], p),
    vjp=_mean_vjp,
    magnitude=lambda a, p, y: _abs_sum(a, p) / max(1, _count(a["x"].shape, p)),
    vjp_magnitude=lambda a, p, y, g: {
        "x": np.abs(_broadcast_back(g, a["x"].shape, p)).astype(np.float64) / max(1, _count(a["x"].shape, p))
    },
    error=base.Accumulation(3, "n-term sum inside gamma_n; rounding 1/n, the product, one spare", _length),
    vjp_error=base.Accumulation(2, "g/n or g*(1/n): at most two roundings"),
    left_fold=lambda a, p: _left_fold_sum(a, p) * _inverse_count(a["x"].shape, p),
    extra_flops_per_output=1,
    doc="reduce_mean(x, axis=None): sum * (1/n) over axis or everything; empty -> NaN.",
)

SPECS = (REDUCE_SUM, REDUCE_MEAN)
