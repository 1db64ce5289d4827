"""Pointwise ops: same shape in, same shape out, no implicit broadcasting.

Each op is a short declaration through the `pointwise` factory; the formulas are dtype-generic
numpy (float64 for the reference, float32 for the numpy provider), so Python-float constants
only (NEP 50 keeps them weak) and parameters arrive as scalars of the working dtype.

Error models. Correctly rounded ops and selections are Exact. The others are Accumulation with
n = 1 and M from first-order error propagation on absolute values: every intermediate v that is
rounded (or comes out of a library function) contributes |∂y/∂v|·|v|abs, where |v|abs is v's own
formula on absolute values (design §4; gelu's M is the design's). k sums, along the formula,
1 per rounding and 2 per ulp of CUDA's documented libm errors (an ulp is up to 2u of the result:
expf, tanhf, sinf, cosf, rsqrtf 2 ulp count 4; logf, log1pf 1 ulp count 2; division and sqrtf
are single roundings). Edge samples use the worst case c = k + 1, so k alone must hold there.
"""

from __future__ import annotations

import math

import numpy as np

from capsule_core.errors import ParamError, ShapeError
from capsule_core.ops import base

SIZES = {"small": ((7,), (3, 5)), "medium": ((64, 129),), "large": ((1024, 4099),)}
"""Sample shapes per size: odd and non-power-of-two, up to 4M elements."""

EXACT = base.Exact("one correctly rounded IEEE operation")
SELECTION = base.Exact("a selection or a sign change, no rounding")
HALVING = base.Exact("a selection, or g/2: one correctly rounded operation")


def _samples(inputs: tuple[str, ...], draws: dict, params: dict):
    """Seeded sample inputs: `draws[size](rng, shape)` gives one float32 array of the op's domain."""

    def samples(size: str, rng: np.random.Generator) -> list[base.Sample]:
        pick = draws[size]
        out = []
        for i, shape in enumerate(SIZES[size]):
            arrays = {n: base.f32(pick(rng, shape)) for n in inputs}
            out.append(base.Sample(arrays, dict(params), f"{size}-{i}"))
        return out

    return samples


def _normal(scale: float = 2.0):
    return lambda rng, shape: scale * rng.standard_normal(shape)


def _log_uniform(lo: float, hi: float):
    """Positive values spread evenly over the binades between lo and hi."""
    return lambda rng, shape: np.exp(rng.uniform(math.log(lo), math.log(hi), shape))


def _edges(name: str, inputs: tuple[str, ...], params: dict, extra=()):
    """Empty, size 1, every special value, every pair of special values (binary), plus extras:
    `extra` holds (inputs, param overrides, case id) or a callable returning such a list."""

    def edges() -> list[base.Sample]:
        s = base.SPECIAL_VALUES
        cases = [
            base.Sample({n: np.zeros((0,), np.float32) for n in inputs}, dict(params), "edge-empty", True),
            base.Sample({n: base.f32([0.75]) for n in inputs}, dict(params), "edge-one", True),
            base.Sample({n: np.zeros((2, 0, 3), np.float32) for n in inputs}, dict(params), "edge-empty-3d", True),
        ]
        if len(inputs) == 1:
            cases.append(base.Sample({inputs[0]: s.copy()}, dict(params), "edge-special", True))
        else:
            a, b = np.meshgrid(s, s, indexing="ij")
            cases.append(
                base.Sample({inputs[0]: base.f32(a), inputs[1]: base.f32(b)}, dict(params), "edge-special-pairs", True)
            )
        rng = base.seeded_rng(name, "edge-odd")
        cases.append(
            base.Sample({n: base.f32(rng.standard_normal((3, 37))) for n in inputs}, dict(params), "edge-odd", True)
        )
        more = extra() if callable(extra) else extra
        return cases + [base.Sample(inputs=x, params={**params, **p}, case=c, worst_case=True) for x, p, c in more]

    return edges


def _common_errors(name: str, inputs: tuple[str, ...], params: dict):
    errors = [
        base.ErrorCase(
            base.Sample({n: np.zeros(3, np.float32) for n in inputs[:-1]}, dict(params), "error-missing-input"),
            ShapeError,
            rf"{inputs[-1]}: required input is missing",
        )
    ]
    if len(inputs) == 2:
        errors.append(
            base.ErrorCase(
                base.Sample(
                    {inputs[0]: np.zeros((2, 3), np.float32), inputs[1]: np.zeros((3, 2), np.float32)},
                    dict(params),
                    "error-shape-mismatch",
                ),
                ShapeError,
                rf"{inputs[1]}: must have the shape of {inputs[0]}",
            )
        )
    return errors


def _param_error(params: dict, case: str, match: str):
    """An ErrorCase on a one-element x with the given (bad) parameters."""
    return lambda: base.ErrorCase(base.Sample({"x": base.f32([1.0])}, params, case), ParamError, match)


def _same_shape(name: str, inputs: tuple[str, ...]):
    def shape(shapes, params):
        for n in inputs[1:]:
            base.require_same_shape(name, n, shapes[n], inputs[0], shapes[inputs[0]])
        return tuple(shapes[inputs[0]])

    return shape


def pointwise(
    name: str,
    *,
    inputs: tuple[str, ...],
    flops: int,
    params: tuple[base.Param, ...] = (),
    draw=_normal(),
    small_draw=None,
    large_draw=None,
    sample_params: dict | None = None,
    extra_edges=(),
    extra_errors=(),
    check_params=None,
    doc: str = "",
    **reference,
) -> base.OpSpec:
    """The family factory. `reference` is the op's forward, vjp, magnitude, vjp_magnitude, error
    and vjp_error, as OpSpec takes them. `flops` counts floating-point operations per element (cost
    model; a library function counts as one); `check_params(params)` raises ParamError for range
    rules beyond the generic type check. `draw` makes the medium samples and, unless given their
    own, the small ones (finite differences: keep them off kinks and domain edges) and the large
    ones (forward only: they may span a wider range; medium ones feed the adjoint identity, whose
    single step is scaled by the largest |x|)."""
    sample_params = dict(sample_params or {})
    same = _same_shape(name, inputs)

    def shape(shapes, p):
        if check_params is not None:
            check_params(p)
        return same(shapes, p)

    def cost(shapes, p):
        n = base.numel(shapes[inputs[0]])
        return base.Cost(bytes_read=4 * n * len(inputs), bytes_written=4 * n, flops=flops * n)

    return base.OpSpec(
        name=name,
        family="pointwise",
        inputs=tuple(base.Tensor(n, "(…)") for n in inputs),
        params=params,
        shape_rule=f"shape of {inputs[0]}",
        shape=shape,
        **reference,
        cost=cost,
        samples=_samples(
            inputs, {"small": small_draw or draw, "medium": draw, "large": large_draw or draw}, sample_params
        ),
        edges=_edges(name, inputs, sample_params, extra_edges),
        errors=lambda: _common_errors(name, inputs, sample_params) + [e() for e in extra_errors],
        doc=doc,
    )


def _abs_dict(**arrays):
    return {k: np.abs(np.asarray(v, dtype=np.float64)) for k, v in arrays.items()}


def _as_float32_result(y):
    """A forward result as float32 holds it: beyond float32's range it is ±inf. VJPs written in
    terms of y (exp's g·y) see the infinity every float32 forward produces there."""
    with np.errstate(over="ignore"):
        rounded = y.astype(np.float32)
    return np.where(np.isinf(rounded), rounded, y).astype(y.dtype)


# -- relu: x if x > 0 else 0 (NaN → 0, −0 → +0); relu′(0) = 0 ------------------------------

RELU = pointwise(
    "relu",
    inputs=("x",),
    forward=lambda a, p: np.where(a["x"] > 0, a["x"], 0.0).astype(a["x"].dtype),
    vjp=lambda a, p, y, g: {"x": np.where(a["x"] > 0, g, 0.0).astype(g.dtype)},
    magnitude=lambda a, p, y: np.abs(y),
    vjp_magnitude=lambda a, p, y, g: _abs_dict(x=np.where(a["x"] > 0, g, 0.0)),
    error=base.Exact("a selection, no rounding"),
    vjp_error=base.Exact("a selection, no rounding"),
    flops=1,
    doc="relu(x) = x if x > 0 else 0; NaN -> 0, -0 -> +0; relu'(0) = 0.",
)

# -- gelu, tanh approximation: ½·x·(1 + t), t = tanh(√(2/π)·(x + 0.044715·x³)) ----------------

GELU_K = math.sqrt(2.0 / math.pi)
GELU_A = 0.044715


def _gelu_t(x):
    return np.tanh(GELU_K * (x + GELU_A * x * x * x))


def _gelu_forward(a, p):
    x = a["x"]
    return 0.5 * x * (1.0 + _gelu_t(x))


def _gelu_vjp(a, p, y, g):
    """½(1 + t) + ½·x·(1 − t²)·√(2/π)·(1 + 3·0.044715·x²): the second term is 0 wherever t has
    saturated (1 − t² = 0), so x² overflowing float32 for huge |x| never makes 0·inf = NaN."""
    x = a["x"]
    t = _gelu_t(x)
    sech2 = 1.0 - t * t
    slope = np.where(sech2 > 0, 0.5 * x * sech2 * GELU_K * (1.0 + 3.0 * GELU_A * x * x), 0.0)
    return {"x": (g * (0.5 * (1.0 + t) + slope)).astype(g.dtype)}


def _gelu_magnitude(a, p, y):
    """Design §4: ½|x|(1 + |t|) + ½|x|(1 − t²)·√(2/π)·(|x| + 0.044715|x|³), the second term
    the tanh argument's rounding error carried through tanh′ = 1 − t²."""
    ax = np.abs(a["x"])
    t = _gelu_t(a["x"])
    return 0.5 * ax * (1.0 + np.abs(t)) + 0.5 * ax * (1.0 - t * t) * GELU_K * (ax + GELU_A * ax**3)


def _gelu_vjp_magnitude(a, p, y, g):
    """|g|·[½(1 + |t|) + ½|x|(1 + t²)·P + (½ + |x||t|·P)·(1 − t²)·Z] with P = √(2/π)(1 + 3a·x²)
    and Z = √(2/π)(|x| + a|x|³): the two terms on absolute values, plus the tanh argument's error
    (relative to Z) carried through t into both terms (∂/∂t = ½ − x·t·P). Where t is ±1 even in
    float64 (|x| above about 5.5), float32's t is exactly ±1 too and the slope term vanishes
    without error: M is then the first term alone (and finite at ±inf)."""
    x = a["x"]
    ax = np.abs(x)
    t = _gelu_t(x)
    at = np.abs(t)
    sech2 = 1.0 - t * t
    poly = GELU_K * (1.0 + 3.0 * GELU_A * ax * ax)
    arg = GELU_K * (ax + GELU_A * ax**3)
    m = 0.5 * (1.0 + at) + 0.5 * ax * (1.0 + t * t) * poly + (0.5 + ax * at * poly) * sech2 * arg
    return {"x": np.abs(g) * np.where(sech2 > 0, m, 0.5 * (1.0 + at))}


GELU = pointwise(
    "gelu",
    inputs=("x",),
    forward=_gelu_forward,
    vjp=_gelu_vjp,
    magnitude=_gelu_magnitude,
    vjp_magnitude=_gelu_vjp_magnitude,
    error=base.Accumulation(12, "x³ (2), ·a, +x, ·√(2/π), tanhf (4), 1 + t, the product: 11; design §4's k"),
    vjp_error=base.Accumulation(
        20, "the tanh argument and tanhf (9), 1 - t² (2), the polynomial (4), 3 products, 1 + t, the sum, ·g: 20"
    ),
    flops=9,
    draw=_normal(3.0),
    extra_edges=[
        (
            dict(x=base.f32([-1e30, -1e20, -100.0, -10.0, -5.0, -1e-3, 1e-3, 5.0, 10.0, 100.0, 1e20, 1e30])),
            {},
            "edge-large",
        )
    ],
    doc="gelu(x) = ½x(1 + tanh(√(2/π)(x + 0.044715x³))) (tanh approximation; the literal formula "
    "gives gelu(-inf) = NaN).",
)

# -- add: x + y ------------------------------------------------------------------------------

ADD = pointwise(
    "add",
    inputs=("x", "y"),
    forward=lambda a, p: a["x"] + a["y"],
    vjp=lambda a, p, y, g: {"x": g.copy(), "y": g.copy()},
    magnitude=lambda a, p, y: np.abs(a["x"]) + np.abs(a["y"]),
    vjp_magnitude=lambda a, p, y, g: _abs_dict(x=g, y=g),
    error=EXACT,
    vjp_error=base.Exact("a copy"),
    flops=1,
    doc="add(x, y) = x + y, correctly rounded.",
)

# -- sub: x − y ------------------------------------------------------------------------------

SUB = pointwise(
    "sub",
    inputs=("x", "y"),
    forward=lambda a, p: a["x"] - a["y"],
    vjp=lambda a, p, y, g: {"x": g.copy(), "y": -g},
    magnitude=lambda a, p, y: np.abs(a["x"]) + np.abs(a["y"]),
    vjp_magnitude=lambda a, p, y, g: _abs_dict(x=g, y=g),
    error=EXACT,
    vjp_error=base.Exact("a copy and a sign change"),
    flops=1,
    doc="sub(x, y) = x - y, correctly rounded.",
)

# -- mul: x·y --------------------------------------------------------------------------------

MUL = pointwise(
    "mul",
    inputs=("x", "y"),
    forward=lambda a, p: a["x"] * a["y"],
    vjp=lambda a, p, y, g: {"x": g * a["y"], "y": g * a["x"]},
    magnitude=lambda a, p, y: np.abs(y),
    vjp_magnitude=lambda a, p, y, g: _abs_dict(x=g * a["y"], y=g * a["x"]),
    error=EXACT,
    vjp_error=base.Exact("g·y and g·x: one correctly rounded product each"),
    flops=1,
    doc="mul(x, y) = x*y, correctly rounded.",
)

# -- scale: c·x ------------------------------------------------------------------------------

SCALE = pointwise(
    "scale",
    inputs=("x",),
    params=(base.Param("c", "float", doc="the constant factor"),),
    forward=lambda a, p: p["c"] * a["x"],
    vjp=lambda a, p, y, g: {"x": p["c"] * g},
    magnitude=lambda a, p, y: np.abs(y),
    vjp_magnitude=lambda a, p, y, g: _abs_dict(x=p["c"] * g),
    error=EXACT,
    vjp_error=EXACT,
    flops=1,
    sample_params={"c": -1.75},
    extra_errors=(
        _param_error({"c": float("nan")}, "error-c-nan", r"c: must be finite"),
        _param_error({}, "error-c-missing", r"c: required parameter is missing"),
    ),
    doc="scale(x, c) = c*x with c rounded to float32.",
)

# -- abs: |x|; grad sign(x)·g with sign(0) = sign(NaN) = 0 -----------------------------------


def _sign_times(x, g):
    """sign(x)·g with sign(±0) = sign(NaN) = 0."""
    return np.where(x > 0, g, np.where(x < 0, -g, 0.0)).astype(g.dtype)


ABS = pointwise(
    "abs",
    inputs=("x",),
    forward=lambda a, p: np.abs(a["x"]),
    vjp=lambda a, p, y, g: {"x": _sign_times(a["x"], g)},
    magnitude=lambda a, p, y: np.abs(y),
    vjp_magnitude=lambda a, p, y, g: _abs_dict(x=_sign_times(a["x"], g)),
    error=SELECTION,
    vjp_error=SELECTION,
    flops=1,
    doc="abs(x) = |x| (-0 -> +0); abs'(x) = sign(x) with sign(0) = sign(NaN) = 0.",
)

# -- sqrt: √x (x < 0 → NaN, −0 → −0); grad g/(2√x) for x > 0, else 0 ---------------------------


def _sqrt_vjp(a, p, y, g):
    x = a["x"]
    return {"x": np.where(x > 0, g / (2.0 * np.sqrt(x)), 0.0).astype(g.dtype)}


SQRT = pointwise(
    "sqrt",
    inputs=("x",),
    forward=lambda a, p: np.sqrt(a["x"]),
    vjp=_sqrt_vjp,
    magnitude=lambda a, p, y: np.abs(y),
    vjp_magnitude=lambda a, p, y, g: _abs_dict(**_sqrt_vjp(a, p, y, g)),
    error=EXACT,
    vjp_error=base.Accumulation(5, "sqrtf and the division (2), or rsqrtf (4) and ·g"),
    flops=1,
    draw=_log_uniform(1.0 / 16, 16.0),
    small_draw=_log_uniform(0.25, 4.0),
    large_draw=_log_uniform(1e-6, 1e6),
    extra_edges=[(dict(x=base.f32([4.0, 2.0, 1e-30, 1e-40, 1e30, 3.4028235e38, -4.0, -1e-30])), {}, "edge-range")],
    doc="sqrt(x), correctly rounded; x < 0 -> NaN, -0 -> -0; sqrt'(x) = 1/(2 sqrt x) for x > 0, else 0.",
)

# -- max / min: fmax / fmin; −0 < +0; winner gets g, ties and NaN split ½g ------------------------


def _maximum(x, y):
    """fmax: the non-NaN one if one is NaN; −0 < +0 (IEEE 754-2019 maximumNumber)."""
    pick_x = (x > y) | np.isnan(y) | ((x == y) & ~np.signbit(x))
    return np.where(pick_x, x, y)


def _minimum(x, y):
    """fmin: the non-NaN one if one is NaN; −0 < +0 (IEEE 754-2019 minimumNumber)."""
    pick_x = (x < y) | np.isnan(y) | ((x == y) & np.signbit(x))
    return np.where(pick_x, x, y)


def _selection_vjp(x_wins, y_wins, g):
    """The winner gets g, the loser 0; ties and any NaN (neither wins) give ½g to each."""
    half = np.where(x_wins | y_wins, 0.0, 0.5 * g)
    return {"x": np.where(x_wins, g, half).astype(g.dtype), "y": np.where(y_wins, g, half).astype(g.dtype)}


def _tie_edges(name: str):
    """Ties (x == y, including ±0 against ∓0) and NaN in either input, at an odd size."""

    def extra():
        rng = base.seeded_rng(name, "edge-ties")
        x = base.f32(np.round(rng.standard_normal((5, 41)) * 4) / 4)
        y = base.f32(np.round(rng.standard_normal((5, 41)) * 4) / 4)
        tie = rng.random(x.shape) < 0.4
        y[tie] = x[tie]
        x[0, :6] = [0.0, -0.0, 0.0, -0.0, np.nan, 1.0]
        y[0, :6] = [-0.0, 0.0, 0.0, -0.0, 1.0, np.nan]
        x[1, rng.random(41) < 0.3] = np.nan
        y[2, rng.random(41) < 0.3] = np.nan
        return [({"x": x, "y": y}, {}, "edge-ties")]

    return extra


MAX = pointwise(
    "max",
    inputs=("x", "y"),
    forward=lambda a, p: _maximum(a["x"], a["y"]),
    vjp=lambda a, p, y, g: _selection_vjp(a["x"] > a["y"], a["y"] > a["x"], g),
    magnitude=lambda a, p, y: np.abs(y),
    vjp_magnitude=lambda a, p, y, g: _abs_dict(**_selection_vjp(a["x"] > a["y"], a["y"] > a["x"], g)),
    error=SELECTION,
    vjp_error=HALVING,
    flops=1,
    extra_edges=_tie_edges("max"),
    doc="max(x, y) = fmax (the non-NaN one if one is NaN; max(+0, -0) = +0); ties and NaN split g.",
)

MIN = pointwise(
    "min",
    inputs=("x", "y"),
    forward=lambda a, p: _minimum(a["x"], a["y"]),
    vjp=lambda a, p, y, g: _selection_vjp(a["x"] < a["y"], a["y"] < a["x"], g),
    magnitude=lambda a, p, y: np.abs(y),
    vjp_magnitude=lambda a, p, y, g: _abs_dict(**_selection_vjp(a["x"] < a["y"], a["y"] < a["x"], g)),
    error=SELECTION,
    vjp_error=HALVING,
    flops=1,
    extra_edges=_tie_edges("min"),
    doc="min(x, y) = fmin (the non-NaN one if one is NaN; min(+0, -0) = -0); ties and NaN split g.",
)

# -- clamp: min(max(x, lo), hi), NaN → lo; grad g strictly inside (lo, hi) -------------------------


def _check_clamp(p):
    if p["lo"] > p["hi"]:
        raise ParamError("clamp", "hi", f"must be >= lo, got lo={p['lo']!r}, hi={p['hi']!r}")


def _clamp_vjp(a, p, y, g):
    x = a["x"]
    return {"x": np.where((x > p["lo"]) & (x < p["hi"]), g, 0.0).astype(g.dtype)}


def _clamp_edges():
    """Exactly at lo and hi, one ulp either side, specials; lo = hi; a ±0 bound."""
    lo, hi = base.f32(-1.0), base.f32(1.5)
    near = [np.nextafter(v, d) for v in (lo, hi) for d in (base.f32(-np.inf), base.f32(np.inf))]
    x = base.f32([lo, hi, *near, np.nan, np.inf, -np.inf, 0.0, -0.0, 0.25, lo, hi])
    return [
        ({"x": x}, {}, "edge-at-bounds"),
        ({"x": x}, {"lo": 0.5, "hi": 0.5}, "edge-lo-equals-hi"),
        ({"x": x}, {"lo": -0.0, "hi": 0.0}, "edge-signed-zero-bounds"),
    ]


CLAMP = pointwise(
    "clamp",
    inputs=("x",),
    params=(base.Param("lo", "float", doc="lower bound"), base.Param("hi", "float", doc="upper bound, >= lo")),
    forward=lambda a, p: _minimum(_maximum(a["x"], p["lo"]), p["hi"]),
    vjp=_clamp_vjp,
    magnitude=lambda a, p, y: np.abs(y),
    vjp_magnitude=lambda a, p, y, g: _abs_dict(**_clamp_vjp(a, p, y, g)),
    error=SELECTION,
    vjp_error=SELECTION,
    flops=2,
    check_params=_check_clamp,
    sample_params={"lo": -1.0, "hi": 1.5},
    extra_edges=_clamp_edges(),
    extra_errors=(
        _param_error({"lo": 2.0, "hi": 1.0}, "error-lo-above-hi", r"hi: must be >= lo"),
        _param_error({"hi": 1.0}, "error-lo-missing", r"lo: required parameter is missing"),
        _param_error({"lo": float("nan"), "hi": 1.0}, "error-lo-nan", r"lo: must be finite"),
    ),
    doc="clamp(x, lo, hi) = min(max(x, lo), hi) with lo <= hi (else an error); NaN -> lo; "
    "the gradient passes only strictly inside (lo, hi).",
)

# -- sigmoid: 1/(1 + e^(−x)), stable; grad g·y·(1 − y) ---------------------------------------


def _sigmoid(x):
    """1/(1 + e^(−x)) for x ≥ 0, e^x/(1 + e^x) below: e^(−|x|) never overflows, so no NaN for
    finite x."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


SIGMOID_K = 6
"""expf (4), 1 + e, the division: relative to the result in either form (e/(1 + e) ≤ 1)."""

SIGMOID = pointwise(
    "sigmoid",
    inputs=("x",),
    forward=lambda a, p: _sigmoid(a["x"]),
    vjp=lambda a, p, y, g: {"x": g * y * (1.0 - y)},
    magnitude=lambda a, p, y: np.abs(y),
    vjp_magnitude=lambda a, p, y, g: {"x": np.abs(g) * np.abs(y) * (1.0 + np.abs(y))},
    error=base.Accumulation(SIGMOID_K, "expf (4), 1 + e, the division; e's error reaches y damped by e/(1 + e)"),
    vjp_error=base.Accumulation(SIGMOID_K + 3, "y's 6, 1 - y, two products"),
    flops=3,
    draw=_normal(6.0),
    small_draw=_normal(3.0),
    extra_edges=[
        (
            dict(x=base.f32([-1e4, -200.0, -104.0, -88.0, -20.0, -1e-30, 1e-30, 20.0, 88.0, 104.0, 200.0, 1e4])),
            {},
            "edge-saturation",
        )
    ],
    doc="sigmoid(x) = 1/(1 + e^-x), computed stably: no NaN for finite x.",
)

# -- tanh: saturating; grad g·(1 − y²) ------------------------------------------------------------

TANH = pointwise(
    "tanh",
    inputs=("x",),
    forward=lambda a, p: np.tanh(a["x"]),
    vjp=lambda a, p, y, g: {"x": g * (1.0 - y * y)},
    magnitude=lambda a, p, y: np.abs(y),
    vjp_magnitude=lambda a, p, y, g: {"x": np.abs(g) * (1.0 + y * y)},
    error=base.Accumulation(4, "tanhf (2 ulp)"),
    vjp_error=base.Accumulation(11, "tanhf's 4 doubled by y², the square, 1 - y², the product"),
    flops=1,
    draw=_normal(4.0),
    small_draw=_normal(2.0),
    extra_edges=[
        (dict(x=base.f32([-100.0, -10.0, -1e-3, -1e-20, 1e-20, 1e-3, 10.0, 100.0, 1e30])), {}, "edge-saturation")
    ],
    doc="tanh(x), saturating to +-1 (tanh(+-100) = +-1).",
)

# -- softplus: max(x, 0) + log(1 + e^(−|x|)); grad g·sigmoid(x) ----------------------------------


def _softplus(x):
    return np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x)))


def _softplus_magnitude(x):
    """max(x, 0) + log(1 + e) + 1 (float64): the terms, and the rounding of 1 + e^(−|x|) (error
    u·(1 + e)) carried through the log (×1/(1 + e)); a literal log(1 + ·) is a sane kernel, so
    far below 0 the bound is absolute (about 1e-6), not relative to the tiny result."""
    return np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x))) + 1.0


SOFTPLUS_K = 8
"""expf (4), 1 + e, logf or log1pf (2), the final sum."""

SOFTPLUS = pointwise(
    "softplus",
    inputs=("x",),
    forward=lambda a, p: _softplus(a["x"]),
    vjp=lambda a, p, y, g: {"x": g * _sigmoid(a["x"])},
    magnitude=lambda a, p, y: _softplus_magnitude(a["x"]),
    vjp_magnitude=lambda a, p, y, g: {"x": np.abs(g) * _sigmoid(a["x"])},
    error=base.Accumulation(SOFTPLUS_K, "expf (4), 1 + e, logf or log1pf (2), the sum"),
    vjp_error=base.Accumulation(SIGMOID_K + 1, "sigmoid's 6, the product"),
    flops=4,
    draw=_normal(6.0),
    small_draw=_normal(3.0),
    extra_edges=[
        (
            dict(
                x=base.f32(
                    [
                        -1e4,
                        -104.0,
                        -88.0,
                        -30.0,
                        -17.0,
                        -1e-30,
                        1e-30,
                        2.0,
                        5.0,
                        6.0,
                        8.0,
                        10.0,
                        12.0,
                        17.0,
                        30.0,
                        88.0,
                        1e4,
                        1e30,
                    ]
                )
            ),
            {},
            "edge-range",
        )
    ],
    doc="softplus(x) = max(x, 0) + log(1 + e^-|x|), no threshold switch; softplus' = sigmoid.",
)

# -- exp: eˣ; grad g·eˣ -------------------------------------------------------------------------

EXP = pointwise(
    "exp",
    inputs=("x",),
    forward=lambda a, p: np.exp(a["x"]),
    vjp=lambda a, p, y, g: {"x": g * _as_float32_result(y)},
    magnitude=lambda a, p, y: np.abs(y),
    vjp_magnitude=lambda a, p, y, g: {"x": np.abs(g) * np.abs(y)},
    error=base.Accumulation(4, "expf (2 ulp)"),
    vjp_error=base.Accumulation(5, "expf (4), the product"),
    flops=1,
    draw=_normal(3.0),
    small_draw=_normal(1.5),
    extra_edges=[
        (
            dict(x=base.f32([-200.0, -104.0, -100.0, -88.0, -1e-30, 1e-30, 80.0, 88.0, 89.0, 100.0, 200.0])),
            {},
            "edge-range",
        )
    ],
    doc="exp(x); beyond float32's range +inf (as every float32 kernel gives).",
)

# -- sin, cos (radians) ---------------------------------------------------------------------------

TRIG_EDGE = base.f32([np.pi / 2, np.pi, 2 * np.pi, -np.pi, 1e-30, 100.0, 1e4, 71476.0, 1e5, 1e8, 1e20, -1e30])
"""Near the zeros of sin and cos, and large arguments (the full range reduction)."""

SIN = pointwise(
    "sin",
    inputs=("x",),
    forward=lambda a, p: np.sin(a["x"]),
    vjp=lambda a, p, y, g: {"x": g * np.cos(a["x"])},
    magnitude=lambda a, p, y: np.abs(y),
    vjp_magnitude=lambda a, p, y, g: {"x": np.abs(g) * np.abs(np.cos(a["x"]))},
    error=base.Accumulation(4, "sinf (2 ulp over the full range)"),
    vjp_error=base.Accumulation(5, "cosf (4), the product"),
    flops=1,
    draw=_normal(30.0),
    extra_edges=[(dict(x=TRIG_EDGE), {}, "edge-range")],
    doc="sin(x), x in radians.",
)

COS = pointwise(
    "cos",
    inputs=("x",),
    forward=lambda a, p: np.cos(a["x"]),
    vjp=lambda a, p, y, g: {"x": -g * np.sin(a["x"])},
    magnitude=lambda a, p, y: np.abs(y),
    vjp_magnitude=lambda a, p, y, g: {"x": np.abs(g) * np.abs(np.sin(a["x"]))},
    error=base.Accumulation(4, "cosf (2 ulp over the full range)"),
    vjp_error=base.Accumulation(5, "sinf (4), the product"),
    flops=1,
    draw=_normal(30.0),
    extra_edges=[(dict(x=TRIG_EDGE), {}, "edge-range")],
    doc="cos(x), x in radians.",
)

# -- log: ln x (0 → −inf, x < 0 → NaN); grad g/x ---------------------------------------------------

LOG = pointwise(
    "log",
    inputs=("x",),
    forward=lambda a, p: np.log(a["x"]),
    vjp=lambda a, p, y, g: {"x": g / a["x"]},
    magnitude=lambda a, p, y: np.abs(y),
    vjp_magnitude=lambda a, p, y, g: _abs_dict(x=g / a["x"]),
    error=base.Accumulation(2, "logf (1 ulp over the full range, relative to the result even near x = 1)"),
    vjp_error=base.Exact("g/x: one correctly rounded division"),
    flops=1,
    draw=_log_uniform(1.0 / 16, 16.0),
    small_draw=_log_uniform(0.25, 4.0),
    large_draw=_log_uniform(1e-6, 1e6),
    extra_edges=[
        (
            dict(
                x=base.f32(
                    [
                        1.0,
                        np.nextafter(base.f32(1), base.f32(2)),
                        np.nextafter(base.f32(1), base.f32(0)),
                        1.0001,
                        0.9999,
                        1e-30,
                        1e-40,
                        1e30,
                        3.4028235e38,
                        -2.0,
                    ]
                )
            ),
            {},
            "edge-near-one",
        )
    ],
    doc="log(x) = ln x; 0 -> -inf, x < 0 -> NaN (no guard); log'(x) = 1/x.",
)

# -- inv: 1/x (±0 → ±inf); grad −g/x² ------------------------------------------------------------


def _inv_vjp(a, p, y, g):
    x = a["x"]
    return {"x": -g / (x * x)}


INV = pointwise(
    "inv",
    inputs=("x",),
    forward=lambda a, p: 1.0 / a["x"],
    vjp=_inv_vjp,
    magnitude=lambda a, p, y: np.abs(y),
    vjp_magnitude=lambda a, p, y, g: {"x": np.abs(g) / (a["x"] * a["x"])},
    error=EXACT,
    vjp_error=base.Accumulation(4, "x² and the division (2), or 1/x doubled by squaring, the square, ·g (4)"),
    flops=1,
    draw=_log_uniform(1.0 / 16, 16.0),
    small_draw=_log_uniform(0.25, 4.0),
    large_draw=_log_uniform(1e-6, 1e6),
    extra_edges=[(dict(x=base.f32([3.0, -3.0, 1e-10, -1e-10, 1e10, 1e19, 1e20, 3e-39, 1e30])), {}, "edge-range")],
    doc="inv(x) = 1/x, correctly rounded; +-0 -> +-inf; inv'(x) = -1/x^2 (+-inf beyond float32's range).",
)

# -- safe_log: ln(softplus(x) + eps); grad g·sigmoid(x)/(softplus(x) + eps) ---------------------------


def _check_eps(p):
    if not p["eps"] > 0:
        raise ParamError("safe_log", "eps", f"must be > 0 (after rounding to float32), got {p['eps']!r}")


def _safe_log_forward(a, p):
    return np.log(_softplus(a["x"]) + p["eps"])


def _safe_log_vjp(a, p, y, g):
    x = a["x"]
    return {"x": g * _sigmoid(x) / (_softplus(x) + p["eps"])}


def _safe_log_relative(x, eps):
    """(M_softplus + s)/s, s = softplus(x) + eps: the absolute error of s (softplus's, then the
    sum's rounding) relative to s, which the log (and the VJP's division) turns into its error."""
    s = _softplus(x) + eps
    return (_softplus_magnitude(x) + s) / s


SAFE_LOG = pointwise(
    "safe_log",
    inputs=("x",),
    params=(base.Param("eps", "float", default=1e-6, doc="added to softplus(x), > 0"),),
    forward=_safe_log_forward,
    vjp=_safe_log_vjp,
    magnitude=lambda a, p, y: np.abs(y) + _safe_log_relative(a["x"], p["eps"]),
    vjp_magnitude=lambda a, p, y, g: {
        "x": np.abs(_safe_log_vjp(a, p, y, g)["x"]) * (1.0 + _safe_log_relative(a["x"], p["eps"]))
    },
    error=base.Accumulation(SOFTPLUS_K + 3, "softplus's 8, + eps, logf (2)"),
    vjp_error=base.Accumulation(SIGMOID_K + SOFTPLUS_K + 3, "sigmoid's 6, softplus's 8, + eps, the division, ·g"),
    flops=6,
    check_params=_check_eps,
    draw=_normal(6.0),
    small_draw=_normal(3.0),
    extra_edges=[
        (dict(x=base.f32([-1e4, -104.0, -30.0, -14.0, -1.0, 0.0, -0.0, 1.0, 14.0, 30.0, 1e4, 1e30])), {}, "edge-range"),
        (dict(x=base.f32([-1e4, -30.0, -1.0, 0.0, 1.0, 30.0])), {"eps": 0.5}, "edge-eps-large"),
        (dict(x=base.f32([-1e4, -30.0, -1.0, 0.0, 1.0, 30.0])), {"eps": 1e-40}, "edge-eps-subnormal"),
    ],
    extra_errors=(
        _param_error({"eps": 0.0}, "error-eps-zero", r"eps: must be > 0"),
        _param_error({"eps": -1e-6}, "error-eps-negative", r"eps: must be > 0"),
        _param_error({"eps": 1e-50}, "error-eps-underflows", r"eps: must be > 0"),
        _param_error({"eps": float("inf")}, "error-eps-inf", r"eps: must be finite"),
    ),
    doc="safe_log(x, eps=1e-6) = ln(softplus(x) + eps): smooth everywhere, safe_log(0) ~ -0.36651 "
    "(not log(max(x, eps))).",
)

SPECS = (
    RELU,
    GELU,
    ADD,
    SUB,
    MUL,
    SCALE,
    ABS,
    SQRT,
    CLAMP,
    MAX,
    MIN,
    SIGMOID,
    TANH,
    SOFTPLUS,
    EXP,
    SIN,
    COS,
    LOG,
    INV,
    SAFE_LOG,
)
