"""The pointwise family beyond the generic contract: independent implementations, the kink and
special-value conventions, parameter rules, and the error models judged from both sides (sane
float32 implementations other than numpy's pass, planted bugs do not)."""

import numpy as np
import pytest

from capsule_core.catalog.cpu_providers import NUMPY_F32, REFERENCE
from capsule_core.errors import ParamError
from capsule_core.ops import get_spec
from capsule_core.ops.pointwise import SPECS
from capsule_core.verify.numerics import compare

scipy_special = pytest.importorskip("scipy.special")

ORDER = (
    "relu",
    "gelu",
    "add",
    "sub",
    "mul",
    "scale",
    "abs",
    "sqrt",
    "clamp",
    "max",
    "min",
    "sigmoid",
    "tanh",
    "softplus",
    "exp",
    "sin",
    "cos",
    "log",
    "inv",
    "safe_log",
)

X = np.float32(np.concatenate([np.linspace(-30, 30, 1201), [-1e-3, 1e-3, 1e-20, -1e-20]]))
"""A dense float32 grid through the interesting range of the smooth ops."""


def fwd(op, **inputs_and_params):
    inputs = {k: v for k, v in inputs_and_params.items() if k in ("x", "y")}
    params = {k: v for k, v in inputs_and_params.items() if k not in ("x", "y")}
    return REFERENCE.forward(op, {k: np.float32(v) for k, v in inputs.items()}, **params)


def grad(op, g=1.0, **inputs_and_params):
    inputs = {k: np.float32(v) for k, v in inputs_and_params.items() if k in ("x", "y")}
    params = {k: v for k, v in inputs_and_params.items() if k not in ("x", "y")}
    shape = np.shape(next(iter(inputs.values())))
    return REFERENCE.vjp(op, inputs, np.full(shape, g, np.float32), **params)


def bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


def test_specs_hold_the_twenty_ops_in_order():
    assert tuple(s.name for s in SPECS) == ORDER
    assert all(s.family == "pointwise" for s in SPECS)


# -- independent implementations ---------------------------------------------------------------


@pytest.mark.parametrize(
    "op, independent",
    [
        ("sigmoid", scipy_special.expit),
        ("tanh", np.tanh),
        ("exp", np.exp),
        ("sin", np.sin),
        ("cos", np.cos),
        ("softplus", lambda x: np.logaddexp(0.0, x)),
        ("gelu", lambda x: x * scipy_special.expit(2 * np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
    ],
)
def test_smooth_forward_matches_an_independent_implementation(op, independent):
    """Relative 1e-13, or absolute 1e-14 where the formula cancels in float64 (gelu's far left
    tail): both far below any float32 bound."""
    x = np.float32(np.concatenate([X, [-1e4, 1e4]]))
    with np.errstate(over="ignore"):
        expected = independent(x.astype(np.float64))
    np.testing.assert_allclose(fwd(op, x=x), expected, rtol=1e-13, atol=1e-14)


def test_log_sqrt_inv_match_numpy_on_their_domain():
    x = np.float32(np.geomspace(1e-30, 1e30, 301))
    np.testing.assert_array_equal(fwd("log", x=x), np.log(x.astype(np.float64)))
    np.testing.assert_array_equal(fwd("sqrt", x=x), np.sqrt(x.astype(np.float64)))
    np.testing.assert_array_equal(fwd("inv", x=x), 1 / x.astype(np.float64))


def test_safe_log_of_zero_and_its_definition():
    assert fwd("safe_log", x=[0.0])[0] == pytest.approx(-0.36651, abs=1e-5)
    x = np.float32([-1e4, -50.0, -1.0, 0.0, 2.0, 50.0])
    eps = float(np.float32(1e-6))
    np.testing.assert_allclose(fwd("safe_log", x=x), np.log(np.logaddexp(0.0, x.astype(np.float64)) + eps), rtol=1e-13)
    assert fwd("safe_log", x=[-1e4])[0] == pytest.approx(np.log(eps), rel=1e-12)
    assert fwd("safe_log", x=[-1e4], eps=0.5)[0] == pytest.approx(np.log(0.5), rel=1e-12)


@pytest.mark.parametrize(
    "op, analytic",
    [
        ("gelu", lambda z: 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z**3)))),
        ("sigmoid", lambda z: 1 / (1 + np.exp(-z))),
        ("tanh", np.tanh),
        ("softplus", lambda z: np.log(1 + np.exp(z))),
        ("safe_log", lambda z: np.log(np.log(1 + np.exp(z)) + float(np.float32(1e-6)))),
        ("sin", np.sin),
        ("cos", np.cos),
        ("exp", np.exp),
    ],
)
def test_smooth_vjp_matches_the_complex_step_derivative(op, analytic):
    """f'(x) = Im f(x + ih)/h to machine precision: an independent derivative, no differencing
    (absolute 1e-14 where the reference's 1 - t² cancels in float64, times gelu's x·P)."""
    x = np.float32(np.linspace(-8, 8, 161))
    h = 1e-30
    expected = np.imag(analytic(x.astype(np.complex128) + 1j * h)) / h
    np.testing.assert_allclose(grad(op, x=x)["x"], expected, rtol=1e-12, atol=1e-14)


def test_binary_ops_and_their_vjps_match_numpy():
    rng = np.random.default_rng(0)
    x, y = np.float32(rng.standard_normal(50)), np.float32(rng.standard_normal(50))
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    np.testing.assert_array_equal(fwd("sub", x=x, y=y), x64 - y64)
    np.testing.assert_array_equal(fwd("mul", x=x, y=y), x64 * y64)
    np.testing.assert_array_equal(fwd("max", x=x, y=y), np.maximum(x64, y64))
    np.testing.assert_array_equal(fwd("min", x=x, y=y), np.minimum(x64, y64))
    g = grad("mul", g=2.0, x=x, y=y)
    np.testing.assert_array_equal(g["x"], 2 * y64)
    np.testing.assert_array_equal(g["y"], 2 * x64)
    np.testing.assert_array_equal(grad("sub", g=2.0, x=x, y=y)["y"], np.full(50, -2.0))


# -- kinks and special values ------------------------------------------------------------------


def test_kink_conventions():
    assert grad("relu", x=[0.0, -0.0, 1.0])["x"].tolist() == [0.0, 0.0, 1.0]
    assert grad("sqrt", x=[0.0, -0.0, -1.0, np.nan])["x"].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert grad("abs", x=[0.0, -0.0, np.nan, -2.0, 3.0])["x"].tolist() == [0.0, 0.0, 0.0, -1.0, 1.0]
    at = grad("clamp", x=[-1.0, 1.5, 0.0, -2.0, 2.0, np.nan], lo=-1.0, hi=1.5)["x"]
    assert at.tolist() == [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("op, winner", [("max", [0, 1]), ("min", [1, 0])])
def test_max_min_gradients_go_to_the_winner_and_split_on_ties_and_nan(op, winner):
    x = [2.0, 1.0, 3.0, 0.0, np.nan, 1.0, np.nan]
    y = [1.0, 2.0, 3.0, -0.0, 1.0, np.nan, np.nan]
    g = grad(op, g=4.0, x=x, y=y)
    first, second = (4.0, 0.0) if winner == [0, 1] else (0.0, 4.0)
    assert g["x"].tolist() == [first, second, 2.0, 2.0, 2.0, 2.0, 2.0]
    assert g["y"].tolist() == [second, first, 2.0, 2.0, 2.0, 2.0, 2.0]


@pytest.mark.parametrize("provider", [REFERENCE, NUMPY_F32], ids=["reference", "numpy"])
def test_special_value_policies(provider):
    def f(op, x, **kw):
        inputs = {k: np.float32(v) for k, v in x.items()}
        return np.asarray(provider.forward(op, inputs, **kw))

    relu = f("relu", {"x": [np.nan, -0.0, -np.inf]})
    assert bits(relu).tolist() == bits([0.0, 0.0, 0.0]).tolist()
    assert bits(f("sqrt", {"x": [-0.0]})).tolist() == bits([-0.0]).tolist()
    assert np.isnan(f("sqrt", {"x": [-1.0]})).all()
    assert f("clamp", {"x": [np.nan, np.inf, -np.inf]}, lo=-1.0, hi=2.0).tolist() == [-1.0, 2.0, -1.0]
    assert f("max", {"x": [np.nan, 1.0], "y": [1.0, np.nan]}).tolist() == [1.0, 1.0]
    assert f("min", {"x": [np.nan, 1.0], "y": [1.0, np.nan]}).tolist() == [1.0, 1.0]
    assert np.isnan(f("max", {"x": [np.nan], "y": [np.nan]})).all()
    assert bits(f("max", {"x": [0.0, -0.0], "y": [-0.0, 0.0]})).tolist() == bits([0.0, 0.0]).tolist()
    assert bits(f("min", {"x": [0.0, -0.0], "y": [-0.0, 0.0]})).tolist() == bits([-0.0, -0.0]).tolist()
    assert f("tanh", {"x": [-100.0, 100.0]}).tolist() == [-1.0, 1.0]
    sig = f("sigmoid", {"x": [-1e4, 1e4, -3e38, 3e38]})
    assert np.isfinite(sig).all() and sig.tolist() == [0.0, 1.0, 0.0, 1.0]
    assert f("softplus", {"x": [-1e4, 1e4]}).tolist() == [0.0, 1e4]
    assert f("log", {"x": [0.0, -0.0, 1.0]}).tolist() == [-np.inf, -np.inf, 0.0]
    assert np.isnan(f("log", {"x": [-1.0]})).all()
    assert f("inv", {"x": [0.0, -0.0]}).tolist() == [np.inf, -np.inf]
    with np.errstate(over="ignore"):
        assert f("exp", {"x": [100.0, -np.inf]}).astype(np.float32).tolist() == [np.inf, 0.0]


def test_results_beyond_float32_range_must_be_infinite_in_float32():
    """The float64 reference holds exp(89) finite; a float32 result must be the infinity it rounds to."""
    spec = get_spec("exp")
    r = fwd("exp", x=[89.0])
    assert np.isfinite(r[0]) and r[0] > np.finfo(np.float32).max
    assert compare(np.float32([np.inf]), r, r, spec.error).passed
    assert not compare(np.float32([np.finfo(np.float32).max]), r, r, spec.error).passed
    assert not compare(np.float32([-np.inf]), r, r, spec.error).passed
    r = grad("inv", g=1.0, x=[1e-20, -1e-20])["x"]
    assert compare(np.float32([-np.inf, -np.inf]), r, np.abs(r), spec.error).passed


def test_gelu_vjp_is_finite_where_x_squared_overflows_float32():
    x = np.float32([-3e38, -1e20, 1e20, 3e38])
    for provider in (REFERENCE, NUMPY_F32):
        g = provider.vjp("gelu", {"x": x}, np.ones(4, np.float32))["x"]
        assert g.tolist() == [0.0, 0.0, 1.0, 1.0]


# -- parameter rules ---------------------------------------------------------------------------


def test_clamp_refuses_lo_above_hi_and_accepts_equal_bounds():
    with pytest.raises(ParamError, match=r"^clamp: hi: must be >= lo"):
        fwd("clamp", x=[0.0], lo=1.0, hi=0.5)
    assert fwd("clamp", x=[-3.0, 3.0, np.nan], lo=0.5, hi=0.5).tolist() == [0.5, 0.5, 0.5]


@pytest.mark.parametrize("eps", [0.0, -1e-6, 1e-50])
def test_safe_log_refuses_eps_that_is_not_positive_in_float32(eps):
    with pytest.raises(ParamError, match=r"^safe_log: eps: must be > 0"):
        fwd("safe_log", x=[0.0], eps=eps)


def test_safe_log_refuses_infinite_eps():
    with pytest.raises(ParamError, match=r"^safe_log: eps: must be finite"):
        fwd("safe_log", x=[0.0], eps=float("inf"))


# -- the error models, from both sides ---------------------------------------------------------


def _judge(op, x, y32, vjp_g=None, **params):
    """compare() of a float32 result against the reference under the op's model (edges' worst case)."""
    spec = get_spec(op)
    inputs = {"x": x}
    if vjp_g is None:
        r = REFERENCE.forward(op, inputs, **params)
        m = REFERENCE.magnitude(op, inputs, **params)
        model = spec.error
    else:
        r = REFERENCE.vjp(op, inputs, vjp_g, **params)["x"]
        m = REFERENCE.vjp_magnitude(op, inputs, vjp_g, **params)["x"]
        model = spec.vjp_error_for("x")
    return compare(y32, r, m, model, 1, worst_case=True)


def _f32(fn, x):
    with np.errstate(all="ignore"):
        return fn(x)


EPS = np.float32(1e-6)
ONE = np.float32(1)


def _literal_softplus(x):
    return np.maximum(x, 0) + np.log(ONE + np.exp(-np.abs(x)))


SANE = [
    ("sigmoid", None, lambda x, g: ONE / (ONE + np.exp(-x))),
    ("softplus", None, lambda x, g: _literal_softplus(x)),
    ("safe_log", None, lambda x, g: np.log(_literal_softplus(x) + EPS)),
    ("tanh", None, lambda x, g: -np.expm1(-2 * np.abs(x)) / (np.float32(2) + np.expm1(-2 * np.abs(x))) * np.sign(x)),
    ("sigmoid", "vjp", lambda x, g: g * (ONE / (ONE + np.exp(-x))) * (ONE / (ONE + np.exp(x)))),
    ("softplus", "vjp", lambda x, g: g / (ONE + np.exp(-x))),
    ("safe_log", "vjp", lambda x, g: g / (ONE + np.exp(-x)) / (_literal_softplus(x) + EPS)),
    ("tanh", "vjp", lambda x, g: g * (ONE - np.tanh(x)) * (ONE + np.tanh(x))),
    ("inv", "vjp", lambda x, g: -g * (ONE / x) * (ONE / x)),
    ("sqrt", "vjp", lambda x, g: np.float32(0.5) * g * (ONE / np.sqrt(x))),
    ("gelu", "vjp", lambda x, g: g * _gelu_derivative_other_order(x)),
]


def _gelu_derivative_other_order(x):
    k, a = np.float32(np.sqrt(2 / np.pi)), np.float32(0.044715)
    t = np.tanh(k * x * (ONE + a * x * x))
    slope = np.float32(0.5) * x * k * (ONE + np.float32(3) * a * x * x)
    return np.float32(0.5) * (ONE + t) + slope * (ONE - t) * (ONE + t)


def _domain(op):
    return np.float32(np.geomspace(1e-3, 1e3, 1201)) if op in ("inv", "sqrt") else X


@pytest.mark.parametrize("op, kind, fn", SANE, ids=[f"{op}-{kind or 'forward'}" for op, kind, _ in SANE])
def test_other_sane_float32_implementations_pass(op, kind, fn):
    """No false alarm for a legitimate kernel written another way (literal log(1 + e), naive
    sigmoid, tanh from expm1, products of reciprocals, rsqrt-style sqrt')."""
    x = _domain(op)
    g = np.float32(np.random.default_rng(1).standard_normal(x.shape))
    y32 = _f32(lambda v: fn(v, g), x)
    result = _judge(op, x, y32, g if kind else None)
    assert result.passed, f"{op} {kind}: {result.reason}"


PLANTED = [
    ("safe_log", None, lambda x, g: np.log(np.maximum(x, EPS))),
    ("safe_log", None, lambda x, g: np.log(_literal_softplus(x))),
    ("safe_log", None, lambda x, g: np.log(_literal_softplus(x) + np.float32(1e-7))),
    ("softplus", None, lambda x, g: np.maximum(x, 0)),
    ("softplus", None, lambda x, g: np.log1p(np.exp(x)) * np.float32(1.001)),
    ("sigmoid", None, lambda x, g: np.float32(0.5) * (ONE + np.tanh(x))),
    ("gelu", None, lambda x, g: np.float32(0.5) * x * (ONE + np.float32(scipy_special.erf(x / np.sqrt(2))))),
    ("sigmoid", "vjp", lambda x, g: g * (ONE / (ONE + np.exp(-x)))),
    ("softplus", "vjp", lambda x, g: g / (ONE + np.exp(x))),
    ("tanh", "vjp", lambda x, g: g * (ONE - np.tanh(x))),
    ("gelu", "vjp", lambda x, g: g * np.float32(0.5) * (ONE + np.tanh(np.float32(np.sqrt(2 / np.pi)) * x))),
]


@pytest.mark.parametrize(
    "op, kind, fn", PLANTED, ids=[f"{op}-{kind or 'forward'}-{i}" for i, (op, kind, _) in enumerate(PLANTED)]
)
def test_planted_bugs_exceed_the_model(op, kind, fn):
    x = X
    g = np.float32(np.random.default_rng(2).standard_normal(x.shape))
    y32 = _f32(lambda v: np.float32(fn(v, g)), x)
    assert not _judge(op, x, y32, g if kind else None).passed
