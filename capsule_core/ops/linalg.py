"""Linear algebra and losses: batched matmul, linear (any leading axes) and mse_loss.

Error models are accumulations whose n is the contraction length of each formula (forward and
each VJP separately) and whose M is the same formula on absolute values (|a|·|b| for a product).
An n-term dot product's n roundings (products and additions) are inside γ_n; k = 1 is a spare.
"""

from __future__ import annotations

import numpy as np

from capsule_core.errors import ShapeError
from capsule_core.ops import base

NAN, INF = np.nan, np.inf


def _abs64(a):
    return np.abs(np.asarray(a, dtype=np.float64))


def _t(a):
    """Transpose of the last two axes."""
    return np.swapaxes(a, -1, -2)


def _normal_sample(shapes: dict, case: str, rng: np.random.Generator, worst_case: bool = False) -> base.Sample:
    return base.Sample({k: base.f32(rng.standard_normal(s)) for k, s in shapes.items()}, {}, case, worst_case)


def _sampler(sizes: dict):
    """samples(size, rng) drawing standard normal inputs of each shape set in sizes[size]."""

    def samples(size: str, rng: np.random.Generator) -> list[base.Sample]:
        return [_normal_sample(shapes, f"{size}-{i}", rng) for i, shapes in enumerate(sizes[size])]

    return samples


def _errors(cases):
    return lambda: [base.zeros_error_case(f"error-{i}", shapes, e, m) for i, (shapes, e, m) in enumerate(cases)]


def _order_rows() -> np.ndarray:
    """The three orders of order_terms as rows (3, n)."""
    return np.stack(list(base.order_terms().values()))


def _exact_factors(n: int) -> np.ndarray:
    """(n, 2): columns of ones and halves, so every product is exact and only the sum rounds."""
    return np.repeat(base.f32([[1.0, 0.5]]), n, axis=0)


def _matmul_order_inputs() -> list[base.Sample]:
    a = _order_rows()
    return [base.Sample({"a": a, "b": _exact_factors(a.shape[1])}, {}, "order-k", True)]


def _linear_order_inputs() -> list[base.Sample]:
    x = _order_rows()
    w = np.ascontiguousarray(_exact_factors(x.shape[1]).T)
    return [base.Sample({"x": x, "w": w, "b": base.f32([0.0, 1.0])}, {}, "order-in", True)]


def _with_special(shapes: dict, rng, name: str, positions) -> dict:
    """Normal inputs, with NaN / ±inf placed in `name` at the given positions: IEEE propagation
    gives the same NaN / inf in any summation order when each sum holds at most one of them."""
    arrays = {k: base.f32(rng.standard_normal(s)) for k, s in shapes.items()}
    for index, value in positions:
        arrays[name][index] = value
    return arrays


# -- matmul: a (…, m, k) · b (…, k, n) -------------------------------------------------------


def _matmul_shape(shapes, params):
    a, b = tuple(shapes["a"]), tuple(shapes["b"])
    base.require_rank("matmul", "a", a, 2)
    base.require_rank("matmul", "b", b, 2)
    if len(b) != len(a):
        raise ShapeError("matmul", "b", f"must have the rank of a ({len(a)}), got shape {b}")
    if b[:-2] != a[:-2]:
        raise ShapeError("matmul", "b", f"batch shape {b[:-2]} must equal a's batch shape {a[:-2]}")
    if b[-2] != a[-1]:
        raise ShapeError("matmul", "b", f"must have k = {a[-1]} rows (a's last axis), got shape {b}")
    return a[:-1] + b[-1:]


def _matmul_cost(shapes, params):
    a, b = tuple(shapes["a"]), tuple(shapes["b"])
    batch, m, k, n = base.numel(a[:-2]), a[-2], a[-1], b[-1]
    return base.Cost(
        bytes_read=4 * (base.numel(a) + base.numel(b)), bytes_written=4 * batch * m * n, flops=2 * batch * m * n * k
    )  # one multiply and one add per term


MATMUL_SIZES = {
    "small": ({"a": (3, 4), "b": (4, 5)}, {"a": (2, 3, 4), "b": (2, 4, 2)}, {"a": (1, 6), "b": (6, 3)}),
    "medium": (
        {"a": (64, 129), "b": (129, 65)},
        {"a": (3, 33, 65), "b": (3, 65, 17)},
        {"a": (8, 4096), "b": (4096, 8)},
    ),
    "large": ({"a": (1024, 1024), "b": (1024, 1024)}, {"a": (4, 512, 513), "b": (4, 513, 255)}),
}


def _matmul_edges() -> list[base.Sample]:
    rng = base.seeded_rng("matmul", "edges")
    shape_cases = [
        ({"a": (3, 0), "b": (0, 4)}, "edge-k0"),
        ({"a": (0, 5), "b": (5, 4)}, "edge-m0"),
        ({"a": (3, 5), "b": (5, 0)}, "edge-n0"),
        ({"a": (0, 3, 4), "b": (0, 4, 2)}, "edge-batch0"),
        ({"a": (2, 3, 0), "b": (2, 0, 4)}, "edge-batch-k0"),
        ({"a": (1, 1), "b": (1, 1)}, "edge-one"),
        ({"a": (33, 65), "b": (65, 17)}, "edge-odd"),
        ({"a": (3, 5, 7), "b": (3, 7, 2)}, "edge-batch3"),
        ({"a": (2, 3, 4, 5), "b": (2, 3, 5, 2)}, "edge-batch-2d"),
        ({"a": (1, 1, 1), "b": (1, 1, 1)}, "edge-one-batched"),
    ]
    cases = [_normal_sample(s, c, rng, True) for s, c in shape_cases]
    same_sign = {
        "a": base.f32(np.abs(rng.standard_normal((2, 4096)))),
        "b": base.f32(np.abs(rng.standard_normal((4096, 3)))),
    }
    tiny = {"a": base.f32(rng.standard_normal((3, 8)) * 1e-20), "b": base.f32(rng.standard_normal((8, 4)) * 1e-20)}
    special = _with_special({"a": (3, 4), "b": (4, 5)}, rng, "a", [((0, 1), NAN), ((1, 2), INF), ((2, 0), -INF)])
    long_k = {"a": base.f32(rng.standard_normal((2, 5000))), "b": base.f32(rng.standard_normal((5000, 3)))}
    cases += [
        base.Sample(same_sign, {}, "edge-same-sign-k4096", True),
        base.Sample(tiny, {}, "edge-underflow", True),
        base.Sample(special, {}, "edge-nan-inf", True),
        base.Sample(long_k, {}, "edge-k5000", True),
    ]
    return cases


def _matmul_k(shapes, params):
    return shapes["a"][-1]


MATMUL = base.OpSpec(
    name="matmul",
    family="linalg",
    inputs=(base.Tensor("a", "(…, m, k)"), base.Tensor("b", "(…, k, n)")),
    params=(),
    shape_rule="(…, m, n)",
    shape=_matmul_shape,
    forward=lambda x, p: np.matmul(x["a"], x["b"]),
    vjp=lambda x, p, y, g: {"a": np.matmul(g, _t(x["b"])), "b": np.matmul(_t(x["a"]), g)},
    magnitude=lambda x, p, y: np.matmul(_abs64(x["a"]), _abs64(x["b"])),
    vjp_magnitude=lambda x, p, y, g: {
        "a": np.matmul(_abs64(g), _t(_abs64(x["b"]))),
        "b": np.matmul(_t(_abs64(x["a"])), _abs64(g)),
    },
    error=base.Accumulation(1, "k-term dot product per output: its roundings are inside gamma_k; one spare", _matmul_k),
    vjp_error={
        "a": base.Accumulation(1, "g·bᵀ: n-term dot products (n = b's last axis)", lambda s, p: s["b"][-1]),
        "b": base.Accumulation(1, "aᵀ·g: m-term dot products (m = a's rows, per batch)", lambda s, p: s["a"][-2]),
    },
    cost=_matmul_cost,
    samples=_sampler(MATMUL_SIZES),
    edges=_matmul_edges,
    order_inputs=_matmul_order_inputs,
    errors=_errors(
        [
            ({"a": (3,), "b": (3, 2)}, ShapeError, r"a: must have rank >= 2"),
            ({"a": (2, 3), "b": (3,)}, ShapeError, r"b: must have rank >= 2"),
            ({"a": (2, 2, 3), "b": (3, 4)}, ShapeError, r"b: must have the rank of a \(3\)"),
            ({"a": (2, 2, 3), "b": (3, 3, 4)}, ShapeError, r"b: batch shape \(3,\) must equal a's batch shape \(2,\)"),
            ({"a": (2, 3), "b": (4, 5)}, ShapeError, r"b: must have k = 3 rows"),
            ({"a": (2, 3)}, ShapeError, r"b: required input is missing"),
        ]
    ),
    doc="matmul(a, b): batched product (..., m, k) x (..., k, n), equal batch shapes; k = 0 gives zeros.",
)

# -- linear: x (…, in) · wᵀ + b ---------------------------------------------------------------


def _linear_shape(shapes, params):
    x, w, b = tuple(shapes["x"]), tuple(shapes["w"]), tuple(shapes["b"])
    base.require_rank("linear", "x", x, 1)
    base.require_rank("linear", "w", w, 2, 2)
    if w[1] != x[-1]:
        raise ShapeError("linear", "w", f"must have in = {x[-1]} columns (x's last axis), got shape {w}")
    if b != (w[0],):
        raise ShapeError("linear", "b", f"must have shape (out,) = ({w[0]},), got {b}")
    return x[:-1] + (w[0],)


def _rows(a, width: int):
    """All leading axes flattened: (L, width); L given explicitly, as width may be 0."""
    return a.reshape(base.numel(a.shape[:-1]), width)


def _linear_vjp(x, p, y, g):
    out, width = x["w"].shape
    g_rows = _rows(g, out)
    return {"x": np.matmul(g, x["w"]), "w": np.matmul(g_rows.T, _rows(x["x"], width)), "b": np.sum(g_rows, axis=0)}


def _linear_vjp_magnitude(x, p, y, g):
    out, width = x["w"].shape
    g_rows = _rows(_abs64(g), out)
    return {
        "x": np.matmul(_abs64(g), _abs64(x["w"])),
        "w": np.matmul(g_rows.T, _rows(_abs64(x["x"]), width)),
        "b": np.sum(g_rows, axis=0),
    }


def _leading(shapes, params) -> int:
    """L: how many rows the leading axes of x hold (the sum length of the w and b gradients)."""
    return base.numel(tuple(shapes["x"])[:-1])


def _linear_cost(shapes, params):
    x, w = tuple(shapes["x"]), tuple(shapes["w"])
    rows, (out, width) = base.numel(x[:-1]), w
    return base.Cost(
        bytes_read=4 * (base.numel(x) + out * width + out),
        bytes_written=4 * rows * out,
        flops=2 * rows * out * width + rows * out,
    )  # the dot products, then the bias add


LINEAR_SIZES = {
    "small": ({"x": (5,), "w": (3, 5), "b": (3,)}, {"x": (2, 3, 4), "w": (2, 4), "b": (2,)}),
    "medium": ({"x": (64, 257), "w": (129, 257), "b": (129,)}, {"x": (4, 8, 100), "w": (33, 100), "b": (33,)}),
    "large": ({"x": (2048, 1024), "w": (1024, 1024), "b": (1024,)},),
}


def _linear_edges() -> list[base.Sample]:
    rng = base.seeded_rng("linear", "edges")
    shape_cases = [
        ({"x": (0, 5), "w": (4, 5), "b": (4,)}, "edge-no-rows"),
        ({"x": (3, 0), "w": (4, 0), "b": (4,)}, "edge-in0"),
        ({"x": (3, 5), "w": (0, 5), "b": (0,)}, "edge-out0"),
        ({"x": (1,), "w": (1, 1), "b": (1,)}, "edge-one"),
        ({"x": (2, 3, 4, 5), "w": (6, 5), "b": (6,)}, "edge-leading-3"),
        ({"x": (33, 65), "w": (17, 65), "b": (17,)}, "edge-odd"),
        ({"x": (2, 0, 5), "w": (3, 5), "b": (3,)}, "edge-empty-leading"),
    ]
    cases = [_normal_sample(s, c, rng, True) for s, c in shape_cases]
    same_sign = {
        "x": base.f32(np.abs(rng.standard_normal((3, 4096)))),
        "w": base.f32(np.abs(rng.standard_normal((2, 4096)))),
        "b": base.f32([1.0, 2.0]),
    }
    special = _with_special(
        {"x": (3, 4), "w": (5, 4), "b": (5,)}, rng, "x", [((0, 1), NAN), ((1, 2), INF), ((2, 0), -INF)]
    )
    cases += [base.Sample(same_sign, {}, "edge-same-sign-in4096", True), base.Sample(special, {}, "edge-nan-inf", True)]
    # the paths of plans/linalg.py: 9-16 rows take the GEMV16 kernel, a long k over few tiles
    # split-K forward, many rows over a small weight split-K in dw
    cases += [
        _normal_sample(s, c, rng, True)
        for s, c in (
            ({"x": (12, 300), "w": (40, 300), "b": (40,)}, "edge-rows-12"),
            ({"x": (33, 1024), "w": (17, 1024), "b": (17,)}, "edge-split-k"),
            ({"x": (2048, 8), "w": (6, 8), "b": (6,)}, "edge-many-rows"),
        )
    ]
    return cases


LINEAR = base.OpSpec(
    name="linear",
    family="linalg",
    inputs=(base.Tensor("x", "(…, in)"), base.Tensor("w", "(out, in)"), base.Tensor("b", "(out)")),
    params=(),
    shape_rule="(…, out)",
    shape=_linear_shape,
    forward=lambda x, p: np.matmul(x["x"], x["w"].T) + x["b"],
    vjp=_linear_vjp,
    magnitude=lambda x, p, y: np.matmul(_abs64(x["x"]), _abs64(x["w"]).T) + _abs64(x["b"]),
    vjp_magnitude=_linear_vjp_magnitude,
    error=base.Accumulation(
        1, "(in + 1)-term sum per output, the bias included; one spare", lambda s, p: s["x"][-1] + 1
    ),
    vjp_error={
        "x": base.Accumulation(1, "g·w: out-term dot products", lambda s, p: s["w"][0]),
        "w": base.Accumulation(1, "gᵀ·x: L-term sums over the leading axes", _leading),
        "b": base.Accumulation(1, "Σ g: L-term sums over the leading axes", _leading),
    },
    cost=_linear_cost,
    samples=_sampler(LINEAR_SIZES),
    edges=_linear_edges,
    order_inputs=_linear_order_inputs,
    errors=_errors(
        [
            ({"x": (), "w": (3, 1), "b": (3,)}, ShapeError, r"x: must have rank >= 1"),
            ({"x": (2, 3), "w": (3,), "b": (3,)}, ShapeError, r"w: must have rank 2"),
            ({"x": (2, 3), "w": (4, 2), "b": (4,)}, ShapeError, r"w: must have in = 3 columns"),
            ({"x": (2, 3), "w": (4, 3), "b": (3,)}, ShapeError, r"b: must have shape \(out,\) = \(4,\)"),
            ({"x": (2, 3), "w": (4, 3), "b": (1, 4)}, ShapeError, r"b: must have shape \(out,\)"),
            ({"x": (2, 3), "w": (4, 3)}, ShapeError, r"b: required input is missing"),
        ]
    ),
    doc="linear(x, w, b) = x @ w.T + b over any leading axes of x.",
)

# -- mse_loss: mean((pred − target)²), shape () ------------------------------------------------


def _mse_shape(shapes, params):
    base.require_same_shape("mse_loss", "target", shapes["target"], "pred", shapes["pred"])
    if base.numel(shapes["pred"]) < 1:
        raise ShapeError("mse_loss", "pred", f"must have at least 1 element, got shape {tuple(shapes['pred'])}")
    return ()


def _mse_forward(x, p):
    d = x["pred"] - x["target"]
    return np.asarray(np.sum(d * d) / d.size)


def _mse_vjp(x, p, y, g):
    d = x["pred"] - x["target"]
    dpred = d * (g * (2.0 / d.size))
    return {"pred": dpred, "target": -dpred}


def _mse_vjp_magnitude(x, p, y, g):
    m = 2.0 * _abs64(x["pred"] - x["target"]) * float(np.abs(g)) / x["pred"].size
    return {"pred": m, "target": m.copy()}


def _mse_edges() -> list[base.Sample]:
    rng = base.seeded_rng("mse_loss", "edges")
    pairs = [
        (base.f32([0.75]), base.f32([-1.5]), "edge-one"),
        (base.f32(2.0), base.f32(0.5), "edge-rank0"),
        (base.f32([NAN, 1.0]), base.f32([0.0, 1.0]), "edge-nan"),
        (base.f32([INF, 1.0]), base.f32([1.0, 2.0]), "edge-inf"),
        (base.f32([INF, 1.0]), base.f32([INF, 2.0]), "edge-inf-minus-inf"),
        (base.f32([1e-45, -1e-45, 1.1754942e-38]), base.f32([0.0, 1e-45, -0.0]), "edge-subnormal"),
        (base.f32([-0.0, 0.0]), base.f32([0.0, -0.0]), "edge-signed-zeros"),
        (base.f32([1e18, -1e18]), base.f32([-1e18, 1e18]), "edge-large-finite"),
    ]
    same = base.f32(rng.standard_normal((3, 37)))
    cases = [base.Sample({"pred": p, "target": t}, {}, c, True) for p, t, c in pairs]
    cases += [
        base.Sample({"pred": same, "target": same.copy()}, {}, "edge-equal", True),
        _normal_sample({"pred": (3, 37), "target": (3, 37)}, "edge-odd", rng, True),
        _normal_sample({"pred": (100_003,), "target": (100_003,)}, "edge-long", rng, True),
    ]
    return cases


MSE_SIZES = {
    "small": ({"pred": (7,), "target": (7,)}, {"pred": (3, 5), "target": (3, 5)}),
    "medium": ({"pred": (64, 129), "target": (64, 129)},),
    "large": ({"pred": (1024, 4099), "target": (1024, 4099)},),
}


def _mse_cost(shapes, params):
    size = base.numel(shapes["pred"])
    return base.Cost(bytes_read=8 * size, bytes_written=4, flops=3 * size + 1)  # subtract, square, add; one divide


def _mse_length(shapes, params) -> int:
    return base.numel(shapes["pred"])


MSE_LOSS = base.OpSpec(
    name="mse_loss",
    family="linalg",
    inputs=(base.Tensor("pred", "(…)"), base.Tensor("target", "(…)")),
    params=(),
    shape_rule="()",
    shape=_mse_shape,
    forward=_mse_forward,
    vjp=_mse_vjp,
    magnitude=lambda x, p, y: np.asarray(np.mean(_abs64(x["pred"] - x["target"]) ** 2)),
    vjp_magnitude=_mse_vjp_magnitude,
    error=base.Accumulation(
        5,
        "d = pred - target (u|d|, so 2u on d²), the square, the n-term sum inside gamma_n, the division, one spare",
        _mse_length,
    ),
    vjp_error=base.Accumulation(5, "d, 2/n, g·(2/n), the product: four roundings, one spare"),
    cost=_mse_cost,
    samples=_sampler(MSE_SIZES),
    edges=_mse_edges,
    # squares are non-negative: pred = √terms (2¹², 1, …), target 0, one sample per order
    order_inputs=lambda: [
        base.Sample({"pred": np.sqrt(t), "target": np.zeros_like(t)}, {}, f"order-{name}", True)
        for name, t in base.order_terms(signed=False).items()
    ],
    errors=_errors(
        [
            ({"pred": (0,), "target": (0,)}, ShapeError, r"pred: must have at least 1 element"),
            ({"pred": (2, 0, 3), "target": (2, 0, 3)}, ShapeError, r"pred: must have at least 1 element"),
            ({"pred": (2, 3), "target": (3, 2)}, ShapeError, r"target: must have the shape of pred \(2, 3\)"),
            ({"pred": (2, 3)}, ShapeError, r"target: required input is missing"),
        ]
    ),
    doc="mse_loss(pred, target) = mean((pred - target)^2), shape (); at least one element.",
)

SPECS = (MATMUL, LINEAR, MSE_LOSS)
