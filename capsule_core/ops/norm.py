"""Normalisation layers: layer_norm over the last axis, batch_norm per channel over (N, spatial).

Both are one computation with different axes: statistics (mean, biased variance) over the
"statistic axes", affine weights gamma and beta along the "parameter axis" (so their gradients
sum over every other axis). The reference is two-pass (mean, then mean of squared deviations):
the one-pass E[x²] − E[x]² cancels catastrophically on rows with a large offset, and the error
model below is one that a two-pass or Welford kernel meets and a one-pass kernel does not.

Error model (A = mean |x| over the statistic axes, s = √(σ² + eps), x̂ = (x − μ)/s):
the computed mean is off by ≤ c·u·A and the subtraction rounds relative to |x − μ| ≤ |x| + A,
so x − μ is off by c·u·(|x| + A); the variance, eps add, sqrt and division move s relatively by
≤ c·u·(1 + A/s) (the A/s part is the first-order effect of the mean's error on a Welford-style
variance; two-pass is second order there). Hence M(x̂) = (|x| + A)/s + (1 + A/s)·|x̂| and
M(y) = |gamma|·M(x̂) + |beta|. A one-pass variance is off by ~c·u·A²/s² relative, which for
offset rows exceeds this bound by the factor A/s. On subnormal inputs the mean's roundings are
absolute (≤ 2⁻¹⁴⁹ = 2·u·2⁻¹²⁶ each) and 1/s amplifies them, so M(x̂) also carries 2·2⁻¹²⁶/s
(the design's absolute term, applied where subnormals enter rather than only at the output).
"""

from __future__ import annotations

import numpy as np

from capsule_core.errors import ParamError, ShapeError
from capsule_core.ops import base

EPS = base.Param("eps", "float", default=1e-6, doc="added to the variance; > 0 as float32")

K_FORWARD = 10
"""Roundings along x → y: mean division, subtraction, square, variance division, + eps, sqrt
(or rsqrtf, 2 ulp), division, × gamma, + beta, one spare."""


class _Layout:
    """Which axes hold the statistics and which axis holds gamma and beta, for a given rank."""

    def __init__(self, stat_axes, param_axis):
        self.stat_axes = stat_axes
        self.param_axis = param_axis

    def affine_axes(self, rank: int) -> tuple[int, ...]:
        """The axes gamma's and beta's gradients sum over: all but the parameter axis."""
        keep = self.param_axis(rank)
        return tuple(a for a in range(rank) if a != keep)

    def along(self, v, rank: int):
        """A (C,) parameter reshaped to broadcast along the parameter axis."""
        shape = [1] * rank
        shape[self.param_axis(rank)] = -1
        return np.reshape(v, shape)


LAYER = _Layout(stat_axes=lambda rank: (rank - 1,), param_axis=lambda rank: rank - 1)
BATCH = _Layout(stat_axes=lambda rank: (0, *range(2, rank)), param_axis=lambda rank: 1)


def _mean(a, axes):
    return np.mean(a, axis=axes, keepdims=True)


def _normalise(x, layout: _Layout, eps):
    """(x̂, s) by the two-pass formula; s = √(σ² + eps) keeps the statistic axes (size 1)."""
    axes = layout.stat_axes(x.ndim)
    d = x - _mean(x, axes)
    s = np.sqrt(_mean(d * d, axes) + eps)
    return d / s, s


def _forward(layout: _Layout):
    def forward(a, p):
        x = a["x"]
        xhat, _ = _normalise(x, layout, p["eps"])
        return xhat * layout.along(a["gamma"], x.ndim) + layout.along(a["beta"], x.ndim)

    return forward


def _vjp(layout: _Layout):
    """dx = (ĝ − mean ĝ − x̂·mean(ĝ·x̂))/s with ĝ = g·gamma (the spec's formula divided through
    by the reduction length); dgamma = Σ g·x̂, dbeta = Σ g over the affine axes."""

    def vjp(a, p, y, g):
        x = a["x"]
        axes, affine = layout.stat_axes(x.ndim), layout.affine_axes(x.ndim)
        xhat, s = _normalise(x, layout, p["eps"])
        ghat = g * layout.along(a["gamma"], x.ndim)
        dx = (ghat - _mean(ghat, axes) - xhat * _mean(ghat * xhat, axes)) / s
        return {"x": dx, "gamma": np.sum(g * xhat, axis=affine), "beta": np.sum(g, axis=affine)}

    return vjp


def _error_terms(x, layout: _Layout, eps):
    """(x̂, s, A/s, M(x̂)) in float64: the error model of the module docstring."""
    x = np.asarray(x, dtype=np.float64)
    xhat, s = _normalise(x, layout, eps)
    offset = _mean(np.abs(x), layout.stat_axes(x.ndim)) / s
    subnormal = 2.0 * base.TINY / s
    return xhat, s, offset, (np.abs(x) / s + offset) + (1.0 + offset) * np.abs(xhat) + subnormal


def _magnitude(layout: _Layout):
    def magnitude(a, p, y):
        x = a["x"]
        _, _, _, m_xhat = _error_terms(x, layout, p["eps"])
        gamma = np.abs(layout.along(np.asarray(a["gamma"], np.float64), x.ndim))
        return gamma * m_xhat + np.abs(layout.along(np.asarray(a["beta"], np.float64), x.ndim))

    return magnitude


def _vjp_magnitude(layout: _Layout):
    """dx: one c for dx's own reductions and one for s's error (hence 2 + A/s), plus x̂'s error
    M(x̂) through both x̂ factors of x̂·mean(ĝ·x̂); dgamma: Σ |g|·M(x̂); dbeta: Σ |g|."""

    def vjp_magnitude(a, p, y, g):
        x = a["x"]
        axes, affine = layout.stat_axes(x.ndim), layout.affine_axes(x.ndim)
        xhat, s, offset, m_xhat = _error_terms(x, layout, p["eps"])
        g = np.abs(np.asarray(g, dtype=np.float64))
        ghat = g * np.abs(layout.along(np.asarray(a["gamma"], np.float64), x.ndim))
        q = _mean(ghat * np.abs(xhat), axes)
        direct = (2.0 + offset) * (ghat + _mean(ghat, axes) + np.abs(xhat) * q)
        through_xhat = m_xhat * q + np.abs(xhat) * _mean(ghat * m_xhat, axes)
        return {
            "x": (direct + through_xhat) / s,
            "gamma": np.sum(g * m_xhat, axis=affine),
            "beta": np.sum(g, axis=affine),
        }

    return vjp_magnitude


def _check_eps(op: str, params):
    if not params["eps"] > 0:
        raise ParamError(op, "eps", f"must be > 0 as float32, got {params['eps']!r}")


def _check_affine(op: str, shapes, channels: int, what: str):
    for name in ("gamma", "beta"):
        if tuple(shapes[name]) != (channels,):
            raise ShapeError(op, name, f"must have shape ({what},) = ({channels},), got {tuple(shapes[name])}")


def _layer_norm_shape(shapes, params):
    x = tuple(shapes["x"])
    base.require_rank("layer_norm", "x", x, 1)
    if x[-1] < 1:
        raise ShapeError("layer_norm", "x", f"last axis D must be >= 1, got shape {x}")
    _check_affine("layer_norm", shapes, x[-1], "D")
    _check_eps("layer_norm", params)
    return x


def _batch_norm_shape(shapes, params):
    x = tuple(shapes["x"])
    base.require_rank("batch_norm", "x", x, 2, 5)
    if base.numel(x[:1] + x[2:]) < 1:
        raise ShapeError("batch_norm", "x", f"N*spatial must be >= 1 (statistics of an empty batch), got shape {x}")
    _check_affine("batch_norm", shapes, x[1], "C")
    _check_eps("batch_norm", params)
    return x


def _stat_length(layout: _Layout):
    """Elements per statistic: D (layer_norm) or N·spatial (batch_norm)."""

    def length(shapes, params) -> int:
        x = tuple(shapes["x"])
        return base.numel(tuple(x[a] for a in layout.stat_axes(len(x))))

    return length


def _affine_length(layout: _Layout):
    """Terms of a gamma/beta gradient: rows (layer_norm) or N·spatial (batch_norm)."""

    def length(shapes, params) -> int:
        x = tuple(shapes["x"])
        return base.numel(tuple(x[a] for a in layout.affine_axes(len(x))))

    return length


def _cost(layout: _Layout):
    def cost(shapes, params):
        x = tuple(shapes["x"])
        size, channels = base.numel(x), x[layout.param_axis(len(x))] if x else 0
        statistics = size // max(1, _stat_length(layout)(shapes, params))
        # Per element: mean add, subtraction, square and add, scaling, × gamma, + beta (7);
        # per statistic: two divisions, + eps, sqrt (4).
        return base.Cost(bytes_read=4 * (size + 2 * channels), bytes_written=4 * size, flops=7 * size + 4 * statistics)

    return cost


def _arrays(x, channels: int, rng) -> dict:
    return {
        "x": base.f32(x),
        "gamma": base.f32(1.0 + 0.5 * rng.standard_normal(channels)),
        "beta": base.f32(0.5 * rng.standard_normal(channels)),
    }


def _samples(layout: _Layout, sizes: dict):
    def samples(size: str, rng: np.random.Generator) -> list[base.Sample]:
        out = []
        for i, shape in enumerate(sizes[size]):
            x = 1.5 * rng.standard_normal(shape) + rng.uniform(-1.0, 1.0)
            out.append(base.Sample(_arrays(x, shape[layout.param_axis(len(shape))], rng), {}, f"{size}-{i}"))
        return out

    return samples


def _edge_list(op: str, layout: _Layout, shapes: list) -> list[base.Sample]:
    """Edge inputs from (case, x or a shape to draw, params); gamma, beta seeded by case."""
    out = []
    for case, x, params in shapes:
        rng = base.seeded_rng(op, case)
        x = 1.5 * rng.standard_normal(x) if isinstance(x, tuple) else np.asarray(x, np.float64)
        out.append(base.Sample(_arrays(x, x.shape[layout.param_axis(x.ndim)], rng), params, case, True))
    return out


def _layer_norm_edges() -> list[base.Sample]:
    rng = base.seeded_rng("layer_norm", "edge-values")
    constant = np.repeat(base.f32([0.1, 0.0, -3.7, 1e4])[:, None], 16, axis=1)
    return _edge_list(
        "layer_norm",
        LAYER,
        [
            ("edge-empty-rows", (0, 8), {}),
            ("edge-d1", (5, 1), {}),
            ("edge-one", (1, 1), {}),
            ("edge-single-row", (1, 9), {}),
            ("edge-odd", (3, 37), {}),
            ("edge-long-rows", (2, 4099), {}),
            ("edge-wide-rows", (3, 4104), {}),
            ("edge-wide-many-rows", (300, 260), {}),
            ("edge-wider-than-a-block", (2, 16400), {}),
            ("edge-rank3", (2, 3, 5), {}),
            ("edge-constant-rows", constant, {}),
            ("edge-constant-rows-eps", constant, {"eps": 0.5}),
            ("edge-offset", 1e4 + rng.standard_normal((8, 64)), {}),
            ("edge-offset-tiny-noise", 1e3 + 1e-2 * rng.standard_normal((4, 33)), {}),
            ("edge-eps-dominant", 1e-4 * rng.standard_normal((4, 16)), {}),
            ("edge-subnormal", 1e-40 * np.arange(-3.0, 4.0)[None, :], {}),
        ],
    )


def _batch_norm_edges() -> list[base.Sample]:
    rng = base.seeded_rng("batch_norm", "edge-values")
    constant = np.repeat(base.f32([0.1, 0.0, -3.7, 1e4])[None, :, None], 6, axis=2).repeat(2, axis=0)
    return _edge_list(
        "batch_norm",
        BATCH,
        [
            ("edge-n1", (1, 3, 4, 5), {}),
            ("edge-spatial0", (6, 4), {}),
            ("edge-one-per-channel", (1, 3), {}),
            ("edge-one-per-channel-spatial", (1, 2, 1, 1, 1), {}),
            ("edge-spatial1", (2, 3, 7), {}),
            ("edge-spatial3", (2, 2, 3, 4, 5), {}),
            ("edge-no-channels", (2, 0, 3), {}),
            ("edge-odd", (3, 5, 37), {}),
            ("edge-constant-channels", constant, {}),
            ("edge-constant-channels-eps", constant, {"eps": 0.5}),
            ("edge-offset", 1e4 + rng.standard_normal((4, 3, 8, 8)), {}),
            ("edge-eps-dominant", 1e-4 * rng.standard_normal((2, 3, 5, 5)), {}),
        ],
    )


def _order_inputs(layout: _Layout):
    """The three orders of order_terms along the statistic axis (layer_norm: rows (3, n);
    batch_norm: the batch axis of (n, 3), one channel per order); gamma 1, beta 0."""

    def order_inputs() -> list[base.Sample]:
        rows = np.stack(list(base.order_terms().values()))
        x = rows if layout is LAYER else np.ascontiguousarray(rows.T)
        channels = x.shape[layout.param_axis(x.ndim)]
        inputs = {"x": x, "gamma": np.ones(channels, np.float32), "beta": np.zeros(channels, np.float32)}
        return [base.Sample(inputs, {}, "order-statistics", True)]

    return order_inputs


def _error_cases(op: str, cases) -> list[base.ErrorCase]:
    out = []
    for i, (x_shape, c_shape, params, error, match) in enumerate(cases):
        inputs = {
            "x": np.zeros(x_shape, np.float32),
            "gamma": np.ones(c_shape, np.float32),
            "beta": np.zeros(c_shape, np.float32),
        }
        out.append(base.ErrorCase(base.Sample(inputs, params, f"error-{i}"), error, match))
    out.append(
        base.ErrorCase(
            base.Sample({"x": np.zeros((2, 3), np.float32), "gamma": np.ones(3, np.float32)}, {}, "error-missing-beta"),
            ShapeError,
            r"beta: required input is missing",
        )
    )
    return out


def _layer_norm_errors() -> list[base.ErrorCase]:
    return _error_cases(
        "layer_norm",
        [
            ((), (1,), {}, ShapeError, r"x: must have rank >= 1"),
            ((3, 0), (0,), {}, ShapeError, r"x: last axis D must be >= 1"),
            ((3, 4), (5,), {}, ShapeError, r"gamma: must have shape \(D,\) = \(4,\)"),
            ((3, 4), (4, 1), {}, ShapeError, r"gamma: must have shape \(D,\)"),
            ((3, 4), (4,), {"eps": 0.0}, ParamError, r"eps: must be > 0"),
            ((3, 4), (4,), {"eps": -1e-5}, ParamError, r"eps: must be > 0"),
            ((3, 4), (4,), {"eps": 1e-46}, ParamError, r"eps: must be > 0 as float32"),
            ((3, 4), (4,), {"eps": float("nan")}, ParamError, r"eps: must be finite"),
        ],
    ) + [
        base.ErrorCase(
            base.Sample(
                {"x": np.zeros((3, 4), np.float32), "gamma": np.ones(4, np.float32), "beta": np.zeros(3, np.float32)},
                {},
                "error-beta-shape",
            ),
            ShapeError,
            r"beta: must have shape \(D,\) = \(4,\)",
        )
    ]


def _batch_norm_errors() -> list[base.ErrorCase]:
    return _error_cases(
        "batch_norm",
        [
            ((4,), (4,), {}, ShapeError, r"x: must have rank 2 to 5"),
            ((1, 2, 1, 1, 1, 1), (2,), {}, ShapeError, r"x: must have rank 2 to 5"),
            ((0, 3, 4), (3,), {}, ShapeError, r"x: N\*spatial must be >= 1"),
            ((2, 3, 0), (3,), {}, ShapeError, r"x: N\*spatial must be >= 1"),
            ((0, 3), (3,), {}, ShapeError, r"x: N\*spatial must be >= 1"),
            ((2, 3, 4), (4,), {}, ShapeError, r"gamma: must have shape \(C,\) = \(3,\)"),
            ((2, 3, 4), (3,), {"eps": 0.0}, ParamError, r"eps: must be > 0"),
            ((2, 3, 4), (3,), {"eps": 1e-46}, ParamError, r"eps: must be > 0 as float32"),
        ],
    ) + [
        base.ErrorCase(
            base.Sample(
                {
                    "x": np.zeros((2, 3, 4), np.float32),
                    "gamma": np.ones(3, np.float32),
                    "beta": np.zeros(2, np.float32),
                },
                {},
                "error-beta-shape",
            ),
            ShapeError,
            r"beta: must have shape \(C,\) = \(3,\)",
        )
    ]


def _norm_spec(
    name: str,
    layout: _Layout,
    *,
    x_rank: str,
    channels: str,
    shape,
    shape_rule: str,
    sizes: dict,
    edges,
    errors,
    stats: str,
    rows: str,
    doc: str,
) -> base.OpSpec:
    """The family factory: layer_norm and batch_norm differ only in layout, shapes and data."""
    stat, affine = _stat_length(layout), _affine_length(layout)
    return base.OpSpec(
        name=name,
        family="norm",
        inputs=(base.Tensor("x", x_rank), base.Tensor("gamma", f"({channels})"), base.Tensor("beta", f"({channels})")),
        params=(EPS,),
        shape_rule=shape_rule,
        shape=shape,
        forward=_forward(layout),
        vjp=_vjp(layout),
        magnitude=_magnitude(layout),
        vjp_magnitude=_vjp_magnitude(layout),
        error=base.Accumulation(
            K_FORWARD,
            f"mean and variance are {stats}-term sums; roundings along "
            "x -> y, M includes the mean's and s's errors (module doc)",
            stat,
        ),
        vjp_error={
            "x": base.Accumulation(K_FORWARD, f"two {stats}-term means on top of recomputing x-hat and s", stat),
            "gamma": base.Accumulation(
                K_FORWARD + 1,
                f"a {rows}-term sum of g*x-hat, each x-hat from {stats}-term statistics: n = {stats} + {rows}",
                lambda shapes, params: stat(shapes, params) + affine(shapes, params),
            ),
            "beta": base.Accumulation(1, f"a {rows}-term sum of g", affine),
        },
        cost=_cost(layout),
        samples=_samples(layout, sizes),
        edges=edges,
        errors=errors,
        order_inputs=_order_inputs(layout),
        doc=doc,
    )


# -- layer_norm: per row of the last axis ----------------------------------------------------

LAYER_NORM = _norm_spec(
    "layer_norm",
    LAYER,
    x_rank="(…, D), D >= 1",
    channels="D",
    shape=_layer_norm_shape,
    shape_rule="shape of x",
    sizes={"small": ((4, 7), (2, 3, 5)), "medium": ((64, 257), (96, 768)), "large": ((2048, 1024),)},
    edges=_layer_norm_edges,
    errors=_layer_norm_errors,
    stats="D",
    rows="rows",
    doc="layer_norm(x, gamma, beta, eps=1e-6): per row of the last axis, x-hat = (x - mean) / "
    "sqrt(biased var + eps), y = x-hat*gamma + beta.",
)

# -- batch_norm: per channel over (N, spatial), training-mode batch statistics ----------------

BATCH_NORM = _norm_spec(
    "batch_norm",
    BATCH,
    x_rank="(N, C, *spatial), spatial rank 0 to 3, N*spatial >= 1",
    channels="C",
    shape=_batch_norm_shape,
    shape_rule="shape of x",
    sizes={
        "small": ((3, 2, 4), (2, 3, 2, 3), (5, 3), (2, 2, 2, 2, 2)),
        "medium": ((8, 16, 16, 16), (256, 64), (4, 8, 8, 8, 8)),
        "large": ((16, 64, 32, 32), (8, 16, 16, 16, 32)),
    },
    edges=_batch_norm_edges,
    errors=_batch_norm_errors,
    stats="N*spatial",
    rows="N*spatial",
    doc="batch_norm(x, gamma, beta, eps=1e-6): per channel, statistics over N and spatial "
    "(training mode, no running stats); x-hat*gamma + beta.",
)

SPECS = (LAYER_NORM, BATCH_NORM)
