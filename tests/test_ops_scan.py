"""selective_scan against the spec's test vectors (exact in binary), scipy.signal.lfilter and the
unrolled sum (independent implementations), and its edge conventions."""

import numpy as np
import pytest

from capsule_core.catalog import reference
from capsule_core.errors import ShapeError

lfilter = pytest.importorskip("scipy.signal").lfilter

X = np.array([[[2.0, 1.0], [4.0, -2.0], [0.0, 3.0]]])
H0 = np.array([[1.0, -1.0]])
A_SHARED = np.array([0.5, 0.25])
B_SHARED = np.array([1.0, 2.0])
A_TOKEN = np.array([[[0.5, 0.25], [0.1, 0.75], [-1.0, 0.2]]])
B_TOKEN = np.array([[[1.0, 2.0], [0.5, -1.0], [0.25, 0.5]]])


def _scan(x, a, b, h0):
    return reference.forward("selective_scan", {"x": x, "a": a, "b": b, "h0": h0})


def _unrolled(x, a, b, h0):
    """h[t] = (Π_{r≤t} A_r)·h0 + Σ_{s≤t} (Π_{s<r≤t} A_r)·Bc_s·X_s, term by term."""
    batch, steps, channels = x.shape
    a, b = np.broadcast_to(a, x.shape), np.broadcast_to(b, x.shape)
    y = np.zeros(x.shape)
    for t in range(steps):
        y[:, t] = np.prod(a[:, : t + 1], axis=1) * h0
        for s in range(t + 1):
            y[:, t] += np.prod(a[:, s + 1 : t + 1], axis=1) * b[:, s] * x[:, s]
    return y


def test_shared_test_vector_is_exact():
    y = _scan(X, A_SHARED, B_SHARED, H0)
    assert y.tolist() == [[[2.5, 1.75], [5.25, -3.5625], [2.625, 5.109375]]]
    grads = reference.vjp("selective_scan", {"x": X, "a": A_SHARED, "b": B_SHARED, "h0": H0}, np.ones_like(y))
    assert grads["a"].tolist() == [10.75, -2.6875]
    assert grads["b"].tolist() == [9.5, 1.8125]
    assert grads["x"].tolist() == [[[1.75, 2.625], [1.5, 2.5], [1.0, 2.0]]]
    assert grads["h0"].tolist() == [[0.875, 0.328125]]


def test_token_dependent_test_vector_is_exact():
    y = _scan(X, A_TOKEN, B_TOKEN, H0)
    assert y.tolist() == [[[2.5, 1.75], [2.25, 3.3125], [-2.25, 2.1625]]]


def test_token_form_of_shared_coefficients_gives_the_same_gradients():
    """Shared coefficients sum their per-token cotangents over time and batch."""
    x = np.concatenate([X, 2 * X])
    h0 = np.concatenate([H0, -H0])
    token = {
        "x": x,
        "a": np.broadcast_to(A_SHARED, x.shape).copy(),
        "b": np.broadcast_to(B_SHARED, x.shape).copy(),
        "h0": h0,
    }
    shared = {"x": x, "a": A_SHARED, "b": B_SHARED, "h0": h0}
    g = np.random.default_rng(0).standard_normal(x.shape)
    from_token = reference.vjp("selective_scan", token, g)
    from_shared = reference.vjp("selective_scan", shared, g)
    for name in ("a", "b"):
        np.testing.assert_allclose(from_token[name].sum(axis=(0, 1)), from_shared[name], rtol=1e-14)
    for name in ("x", "h0"):
        np.testing.assert_array_equal(from_token[name], from_shared[name])


def test_shared_form_matches_scipy_lfilter():
    """Per channel, h[t] = A·h[t−1] + Bc·X[t] is the IIR filter Bc / (1 − A·z⁻¹) with state A·h0."""
    rng = np.random.default_rng(1)
    x, h0 = rng.standard_normal((3, 50, 4)), rng.standard_normal((3, 4))
    a, b = rng.uniform(-1, 1, 4), rng.uniform(-1, 1, 4)
    y = _scan(x, a, b, h0)
    for d in range(4):
        expected = lfilter([b[d]], [1.0, -a[d]], x[:, :, d], axis=1, zi=(a[d] * h0[:, d])[:, None])[0]
        np.testing.assert_allclose(y[:, :, d], expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "a_form, b_form", [("shared", "shared"), ("token", "token"), ("shared", "token"), ("token", "shared")]
)
def test_every_form_matches_the_unrolled_sum(a_form, b_form):
    rng = np.random.default_rng(2)
    x, h0 = rng.standard_normal((2, 7, 3)), rng.standard_normal((2, 3))
    a = rng.uniform(-1, 1, (3,) if a_form == "shared" else x.shape)
    b = rng.uniform(-1, 1, (3,) if b_form == "shared" else x.shape)
    np.testing.assert_allclose(_scan(x, a, b, h0), _unrolled(x, a, b, h0), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("form", ["shared", "token"])
def test_empty_time_gives_empty_output_and_zero_gradients(form):
    x, h0 = np.zeros((2, 0, 3)), np.ones((2, 3))
    coefficient = np.ones((3,) if form == "shared" else x.shape)
    inputs = {"x": x, "a": coefficient, "b": coefficient, "h0": h0}
    assert _scan(**inputs).shape == (2, 0, 3)
    grads = reference.vjp("selective_scan", inputs, np.zeros((2, 0, 3)))
    assert grads["h0"].tolist() == [[0.0] * 3] * 2
    assert grads["a"].shape == coefficient.shape and not grads["a"].any()


def test_unit_decay_is_a_running_sum():
    rng = np.random.default_rng(3)
    x, h0, b = rng.standard_normal((2, 4096, 3)), rng.standard_normal((2, 3)), rng.uniform(-1, 1, 3)
    y = _scan(x, np.ones(3), b, h0)
    np.testing.assert_allclose(y, h0[:, None] + np.cumsum(b * x, axis=1), rtol=1e-12, atol=1e-10)


def test_zero_decay_forgets_the_state():
    rng = np.random.default_rng(4)
    inputs = {
        "x": rng.standard_normal((2, 5, 3)),
        "a": np.zeros((2, 5, 3)),
        "b": rng.uniform(-1, 1, 3),
        "h0": rng.standard_normal((2, 3)),
    }
    y = _scan(**inputs)
    np.testing.assert_array_equal(y, inputs["b"] * inputs["x"])
    assert not reference.vjp("selective_scan", inputs, np.ones_like(y))["h0"].any()


def test_coefficient_with_the_state_shape_is_refused():
    inputs = {"x": np.zeros((2, 5, 3)), "a": np.zeros((2, 3)), "b": np.zeros(3), "h0": np.zeros((2, 3))}
    with pytest.raises(ShapeError, match=r"^selective_scan: a: must have shape \(D,\)"):
        _scan(**inputs)


def test_model_holds_the_recurrence_in_float32_where_a_chunk_decay_product_underflows():
    """Issue 24 item 8's input (fuzz seed 7; channel (0, :, 38) of its replay, the values as float32
    prints them): the error model is right near the subnormals. The spec formula run in float32 (the
    numpy provider) keeps every A·h normal and meets it with room to spare; a chunked scan that forms
    chunk [18, 27)'s Π A in plain float32 (0.82·2^-149·0.82^7 = 2.94e-46 rounds to 2^-149, as the
    failing kernel did) gives 4.77 times the reference at t = 27: |y-r| = 8.23e-37 > 70·2^-126 + 70u·M
    (x = 2.9e10 is the smallest the fuzzer's shrinking kept failing; a larger x fails by far more)."""
    from capsule_core.ops import get_spec
    from capsule_core.verify.numerics import compare

    spec = get_spec("selective_scan")
    x = np.zeros((1, 33, 1), np.float32)
    x[0, 1, 0] = 2.9021735e10
    a = np.full((1, 33, 1), 0.8226804, np.float32)
    a[0, 19, 0] = 1e-45
    b, h0 = np.full((1, 33, 1), -0.70698726, np.float32), np.array([[-0.9223675]], np.float32)
    inputs = {"x": x, "a": a, "b": b, "h0": h0}
    r = reference.forward("selective_scan", inputs)
    assert r[0, 27, 0] == pytest.approx(-2.1849653e-37, rel=1e-7)
    m = spec.magnitude({k: np.abs(v.astype(np.float64)) for k, v in inputs.items()}, {}, r)
    n = spec.error.length({k: v.shape for k, v in inputs.items()}, {})
    assert n == 66
    y32 = spec.forward(inputs, {})
    assert y32.dtype == np.float32 and np.abs(y32[0, 19:, 0]).min() > 2.0**-126  # nothing subnormal
    assert compare(y32, r, m, spec.error, n, worst_case=True).worst < 0.1
    product = np.float32(1)
    for t in range(18, 27):
        product = np.float32(product * a[0, t, 0])
    assert product == np.float32(2.0**-149)
    entering = np.float32(product * np.float32(-903303232.0))  # h[17] as the kernel had it, times Π A
    failing = y32.copy()
    failing[0, 27, 0] = np.float32(a[0, 27, 0] * entering)  # x[27] = 0
    assert failing[0, 27, 0] == np.float32(-1.0413467e-36)  # what the fuzzed kernel returned
    result = compare(failing, r, m, spec.error, n, worst_case=True)
    assert not result.passed and result.index == (0, 27, 0)
