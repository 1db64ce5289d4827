"""Normalisation over a row: softmax, log_softmax and hard_masked_softmax over the last axis.

All three subtract the row maximum first (stable). Error models: z = x − max is one rounding
relative to |z|, and exp turns an absolute error in z into a relative error in e, so every
magnitude carries |z| terms next to the roundings; n = D, the length of the row sum.
"""

from __future__ import annotations

import numpy as np

from capsule_core.errors import ShapeError
from capsule_core.ops import base

SIZES = {"small": ((7,), (3, 5), (2, 3, 4)), "medium": ((128, 129), (16, 1000)), "large": ((1024, 1000), (256, 4097))}
"""Sample shapes per size: rank 1 to 3, odd and non-power-of-two rows, up to 1000 and 4097."""

LOGIT_SCALE = 3.0


def _row_length(shapes, params) -> int:
    return int(shapes["x"][-1])


def _check_rows(op: str, shapes):
    base.require_rank(op, "x", shapes["x"], 1)
    if shapes["x"][-1] < 1:
        raise ShapeError(op, "x", f"the last axis (D) must be at least 1, got shape {tuple(shapes['x'])}")


def _row_sum(a):
    return np.sum(a, axis=-1, keepdims=True)


def _finite_abs(z):
    """|z| as float64, 0 where z is ±inf or NaN (there e = 0 or the result is NaN anyway)."""
    z = np.asarray(z, dtype=np.float64)
    return np.where(np.isfinite(z), np.abs(z), 0.0)


# -- softmax and log_softmax ------------------------------------------------------------------


def _shifted(x):
    """z = x − rowmax (stable): every z ≤ 0 and the row maximum gives e = 1."""
    return x - np.max(x, axis=-1, keepdims=True)


def _softmax(x):
    e = np.exp(_shifted(x))
    return e / _row_sum(e)


def _log_softmax(x):
    z = _shifted(x)
    return z - np.log(_row_sum(np.exp(z)))


def _softmax_magnitude(y, z_abs):
    """y·(1 + |z_i| + Σ y_j|z_j|): the rounding of z_i through exp, the same in Σe, one
    relative unit for expf, the sum and the division (their counts are in k)."""
    return y * (1.0 + z_abs + _row_sum(y * z_abs))


def _softmax_vjp_magnitude(y, z_abs, g):
    """dx = y·(g − Σ g·y) on absolute values, each y carrying its forward relative error
    (1 + |z| + Σ y|z|) as in _softmax_magnitude."""
    g = np.abs(np.asarray(g, dtype=np.float64))
    rel = 1.0 + z_abs + _row_sum(y * z_abs)
    return y * ((g + _row_sum(g * y)) * rel + _row_sum(g * y * rel))


def _log_softmax_magnitude(x):
    """|z_i| + |ln Σe| + 1 + Σ p_j|z_j|: z's rounding, the log's, Σe's relative error (through
    each term's |z_j|) as an absolute error of the log; p = softmax."""
    z = _shifted(x)
    z_abs = _finite_abs(z)
    e = np.exp(z)
    s = _row_sum(e)
    p = e / s
    return z_abs + np.abs(np.log(s)) + 1.0 + _row_sum(p * z_abs)


def _samples(inputs: tuple[str, ...], draw_mask: bool):
    def samples(size: str, rng: np.random.Generator) -> list[base.Sample]:
        out = []
        for i, shape in enumerate(SIZES[size]):
            arrays = {"x": base.f32(LOGIT_SCALE * rng.standard_normal(shape))}
            if draw_mask:
                arrays["mask"] = _random_mask(rng, shape)
            out.append(base.Sample(arrays, {}, f"{size}-{i}"))
        return out

    return samples


def _random_mask(rng: np.random.Generator, shape) -> np.ndarray:
    """About 70 % allowed (1.0), with the first row fully blocked (rows permitting)."""
    mask = base.f32(rng.random(shape) < 0.7)
    if len(shape) >= 2:
        mask.reshape(-1, shape[-1])[0] = 0.0
    return mask


def _common_edges(op: str, huge_rows) -> list[tuple[np.ndarray, str]]:
    """(x, case) edges shared by softmax and log_softmax. `huge_rows`: rows of ±3e38 logits
    whose results stay in float32 range for this op."""
    rng = base.seeded_rng(op, "edges")
    inf = np.inf
    return [
        (np.zeros((0, 5), np.float32), "edge-empty"),
        (np.zeros((2, 0, 3), np.float32), "edge-empty-3d"),
        (base.f32([[-3e38], [3e38], [0.0], [-1e-45]]), "edge-rows-of-one"),
        (base.f32([0.75]), "edge-one"),
        (base.f32(np.repeat([[0.0], [5.5], [-1e30], [-0.0]], 17, axis=1)), "edge-all-equal"),
        (base.f32(huge_rows), "edge-huge-logits"),
        (base.f32([[-inf, 1.0, 2.0, -inf], [0.0, -inf, 0.0, 0.0], [-inf, -inf, -inf, 7.0]]), "edge-minus-inf"),
        (base.f32([[1e-45, -1e-45, 0.0, -0.0], [1.1754942e-38, 0.0, -1.1754942e-38, 1e-45]]), "edge-subnormal"),
        (base.f32([[0.0, -50.0, -100.0, 20.0, 87.0], [-87.0, 0.0, 30.0, -30.0, 1.0]]), "edge-wide-spread"),
        (base.f32(LOGIT_SCALE * rng.standard_normal((3, 37))), "edge-odd"),
        (base.f32(LOGIT_SCALE * rng.standard_normal((2, 1000))), "edge-row-1000"),
        (base.f32(LOGIT_SCALE * rng.standard_normal((1, 4097))), "edge-row-4097"),
        (base.f32(LOGIT_SCALE * rng.standard_normal((3, 2000))), "edge-row-2000"),
    ]


def _row_errors(op: str, mask: bool) -> list[base.ErrorCase]:
    def inputs(x):
        """x, with a mask of its shape when the op takes one."""
        return {"x": x, "mask": np.ones_like(x)} if mask else {"x": x}

    cases = [
        (inputs(np.zeros((3, 0), np.float32)), ShapeError, r"x: the last axis \(D\) must be at least 1"),
        (inputs(np.float32(1.0)), ShapeError, r"x: must have rank >= 1"),
        ({}, ShapeError, r"x: required input is missing"),
    ]
    if mask:
        cases += [
            (
                {"x": np.zeros((2, 3), np.float32), "mask": np.ones((3, 2), np.float32)},
                ShapeError,
                r"mask: must have the shape of x \(2, 3\)",
            ),
            (
                {"x": np.zeros((2, 3), np.float32), "mask": np.ones(3, np.float32)},
                ShapeError,
                r"mask: must have the shape of x",
            ),
            ({"x": np.zeros((2, 3), np.float32)}, ShapeError, r"mask: required input is missing"),
        ]
    else:
        cases.append(
            (
                {"x": np.zeros(3, np.float32), "mask": np.ones(3, np.float32)},
                ShapeError,
                r"mask: unknown input \(inputs: x\)",
            )
        )
    return [base.ErrorCase(base.Sample(x, {}, f"error-{i}"), e, m) for i, (x, e, m) in enumerate(cases)]


def _cost(flops_per_element: int, inputs: int, flops_per_row: int = 0):
    """Per element: max compare, subtract, exp, add, divide (log_softmax: subtract), so 5;
    hard_masked_softmax adds the mask test (6); log_softmax adds one log per row."""

    def cost(shapes, params):
        size = base.numel(shapes["x"])
        rows = size // max(1, int(shapes["x"][-1]))
        return base.Cost(
            bytes_read=4 * size * inputs, bytes_written=4 * size, flops=flops_per_element * size + flops_per_row * rows
        )

    return cost


def _order_inputs(masked: bool):
    """Rows of logits ln(terms) for the non-negative order_terms: the row sum of exp(x − max)
    is 1 among many 2⁻²⁴ (a left fold from the top loses them all), one row per order."""

    def order_inputs() -> list[base.Sample]:
        x = base.f32(np.log(np.stack(list(base.order_terms(signed=False).values()))))
        arrays = {"x": x, "mask": np.ones_like(x)} if masked else {"x": x}
        return [base.Sample(arrays, {}, "order-rows", True)]

    return order_inputs


def row_op(
    name: str, *, inputs: tuple[base.Tensor, ...], cost, samples, edges, errors, doc: str, **reference
) -> base.OpSpec:
    """The family factory: x (…, D) with D ≥ 1, and an optional mask of x's shape. `reference` is
    the op's forward, vjp, magnitude, vjp_magnitude, error and vjp_error, as OpSpec takes them."""

    def shape(shapes, params):
        _check_rows(name, shapes)
        if "mask" in shapes:
            base.require_same_shape(name, "mask", shapes["mask"], "x", shapes["x"])
        return tuple(shapes["x"])

    return base.OpSpec(
        name=name,
        family="softmax",
        inputs=inputs,
        params=(),
        shape_rule="shape of x",
        shape=shape,
        **reference,
        cost=cost,
        samples=samples,
        edges=edges,
        errors=errors,
        order_inputs=_order_inputs(any(t.name == "mask" for t in inputs)),
        doc=doc,
    )


X_ROWS = base.Tensor("x", "(…, D)")

# -- log_softmax: (x − m) − ln Σ exp(x − m) ----------------------------------------------------

LOG_SOFTMAX = row_op(
    "log_softmax",
    inputs=(X_ROWS,),
    forward=lambda a, p: _log_softmax(a["x"]),
    vjp=lambda a, p, y, g: {"x": g - np.exp(y) * _row_sum(g)},
    magnitude=lambda a, p, y: _log_softmax_magnitude(a["x"]),
    vjp_magnitude=lambda a, p, y, g: {
        "x": np.abs(g) + np.exp(y) * _row_sum(np.abs(g)) * (1.0 + _log_softmax_magnitude(a["x"]))
    },
    error=base.Accumulation(
        8,
        "expf 2 ulp (4u) on each term of the n-term sum, logf 1 ulp, the final "
        "subtraction, one spare; |z| terms carry the rounding of x - max",
        _row_length,
    ),
    vjp_error=base.Accumulation(
        14,
        "exp(y) carries y's error (k = 8 through M) plus expf 2 ulp (4u), the "
        "product and the subtraction; n-term sum of g",
        _row_length,
    ),
    cost=_cost(5, 1, flops_per_row=1),
    samples=_samples(("x",), False),
    edges=lambda: [
        base.Sample({"x": x}, {}, c, True)
        for x, c in _common_edges("log_softmax", [[3e38, 3e38, 1e38], [-3e38, -1e38, -2e38], [3e38, 0.0, 1e38]])
    ],
    errors=lambda: _row_errors("log_softmax", False),
    doc="log_softmax(x) over the last axis, stable: (x - m) - ln sum exp(x - m).",
)

# -- softmax: e = exp(x − m), y = e / Σe -------------------------------------------------------

SOFTMAX = row_op(
    "softmax",
    inputs=(X_ROWS,),
    forward=lambda a, p: _softmax(a["x"]),
    vjp=lambda a, p, y, g: {"x": y * (g - _row_sum(g * y))},
    magnitude=lambda a, p, y: _softmax_magnitude(y, _finite_abs(_shifted(a["x"]))),
    vjp_magnitude=lambda a, p, y, g: {"x": _softmax_vjp_magnitude(y, _finite_abs(_shifted(a["x"])), g)},
    error=base.Accumulation(
        10,
        "expf 2 ulp (4u) on e_i and on each term of the n-term sum, the division, "
        "one spare; |z| terms carry the rounding of x - max",
        _row_length,
    ),
    vjp_error=base.Accumulation(
        12,
        "y carries the forward's error (k = 10 through M); the n-term dot, the subtraction and the product",
        _row_length,
    ),
    cost=_cost(5, 1),
    samples=_samples(("x",), False),
    edges=lambda: [
        base.Sample({"x": x}, {}, c, True)
        for x, c in _common_edges(
            "softmax", [[3e38, -3e38, 0.0, 3e38], [-3e38, -3e38, -3e38, -3e38], [3e38, 2.9e38, -1e38, 1e38]]
        )
    ],
    errors=lambda: _row_errors("softmax", False),
    doc="softmax(x) over the last axis, stable: e = exp(x - max), y = e / sum(e).",
)

# -- hard_masked_softmax: softmax over entries with mask ≠ 0, exactly 0 elsewhere -------------


def _masked_shift(x, mask):
    """(z, dead): z = x − max over allowed entries at allowed entries, −inf at blocked ones
    (so blocked values, NaN or inf included, never reach the result); dead marks the rows
    with no allowed entry or only −inf allowed scores, which are all zeros."""
    allowed = mask != 0
    m = np.max(np.where(allowed, x, -np.inf), axis=-1, keepdims=True)
    dead = m == -np.inf
    z = np.where(allowed, x - np.where(dead, 0.0, m), -np.inf)
    return z, dead


def _hard_masked_softmax(x, mask):
    z, dead = _masked_shift(x, mask)
    e = np.exp(z)
    s = _row_sum(e)
    return e / np.where(dead, 1.0, s)


def _hard_masked_edges() -> list[base.Sample]:
    rng = base.seeded_rng("hard_masked_softmax", "edges")
    nan, inf = np.nan, np.inf
    cases = [
        (x, np.ones_like(x), c)
        for x, c in _common_edges("hard_masked_softmax", [[3e38, -3e38, 0.0, 3e38], [-3e38, -3e38, -3e38, -3e38]])
    ]
    x4 = base.f32(LOGIT_SCALE * rng.standard_normal((4, 6)))
    cases += [
        (x4, np.zeros_like(x4), "edge-all-blocked"),
        (
            base.f32(
                [[nan, 1.0, inf, 2.0, -inf, nan], [1.0, 2.0, 3.0, nan, inf, -inf], [nan, nan, inf, -inf, 3e38, 0.0]]
            ),
            base.f32([[0, 1, 0, 1, 0, 0], [1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]]),
            "edge-nan-inf-blocked",
        ),
        (
            base.f32([[-inf, -inf, 1.0, nan], [-inf, 2.0, -inf, 0.5]]),
            base.f32([[1, 1, 0, 0], [1, 0, 1, 0]]),
            "edge-allowed-all-minus-inf",
        ),
        (
            base.f32([[1.0, 2.0, 3.0, 4.0, 5.0]] * 2),
            base.f32([[-0.0, 0.5, -2.0, 0.0, 1.0], [1e30, -0.0, 0.0, -1.0, 3.0]]),
            "edge-mask-values",
        ),
        (base.f32([[4.0], [-3e38], [nan]]), base.f32([[1.0], [1.0], [0.0]]), "edge-rows-of-one-masked"),
        (
            base.f32([[3e38, -3e38, 3e38, 1.0], [-3e38, 3e38, 2.0, 1.0]]),
            base.f32([[1, 1, 0, 1], [1, 0, 1, 0]]),
            "edge-huge-logits-masked",
        ),
    ]
    for shape in ((2, 1000), (1, 4097), (3, 37), (3, 2000)):
        key = "x".join(map(str, shape))
        cases.append(
            (base.f32(LOGIT_SCALE * rng.standard_normal(shape)), _random_mask(rng, shape), f"edge-masked-{key}")
        )
    return [base.Sample({"x": x, "mask": m}, {}, c, True) for x, m, c in cases]


HARD_MASKED_SOFTMAX = row_op(
    "hard_masked_softmax",
    inputs=(X_ROWS, base.Tensor("mask", "(…, D)", differentiable=False)),
    forward=lambda a, p: _hard_masked_softmax(a["x"], a["mask"]),
    vjp=lambda a, p, y, g: {"x": y * (g - _row_sum(g * y))},
    magnitude=lambda a, p, y: _softmax_magnitude(y, _finite_abs(_masked_shift(a["x"], a["mask"])[0])),
    vjp_magnitude=lambda a, p, y, g: {
        "x": _softmax_vjp_magnitude(y, _finite_abs(_masked_shift(a["x"], a["mask"])[0]), g)
    },
    error=base.Accumulation(
        10, "softmax's k over the allowed entries (the mask test is exact); n = D bounds the allowed count", _row_length
    ),
    vjp_error=base.Accumulation(12, "softmax's VJP; blocked entries have y = 0 exactly", _row_length),
    cost=_cost(6, 2),
    samples=_samples(("x", "mask"), True),
    edges=_hard_masked_edges,
    errors=lambda: _row_errors("hard_masked_softmax", True),
    doc="hard_masked_softmax(x, mask): softmax over entries with mask != 0, exactly 0 elsewhere; "
    "rows with no allowed entry (or only -inf allowed) are all zeros.",
)

SPECS = (LOG_SOFTMAX, SOFTMAX, HARD_MASKED_SOFTMAX)
