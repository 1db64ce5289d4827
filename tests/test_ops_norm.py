"""layer_norm and batch_norm beyond the generic contract: direct formulas, the degenerate rows
(D = 1, constant rows, one value per channel), the large-offset rows that separate a two-pass
or Welford kernel (within the error model) from a one-pass E[x²] − E[x]² kernel (outside it),
and batch_norm as layer_norm of the channel rows."""

import numpy as np
import pytest

from capsule_core.catalog import reference
from capsule_core.catalog.cpu_providers import NUMPY_F32, REFERENCE
from capsule_core.ops import get_spec
from capsule_core.verify.numerics import compare

EPS32 = float(np.float32(1e-6))
"""The default eps as the reference sees it (rounded to float32)."""


def _affine(rng, channels):
    return (
        rng.standard_normal(channels).astype(np.float32) + 1.0,
        (0.5 * rng.standard_normal(channels)).astype(np.float32),
    )


def _layer_norm_inputs(seed, shape, offset=0.0, scale=3.0):
    rng = np.random.default_rng(seed)
    x = (offset + scale * rng.standard_normal(shape)).astype(np.float32)
    gamma, beta = _affine(rng, shape[-1])
    return {"x": x, "gamma": gamma, "beta": beta}


def test_layer_norm_matches_the_direct_formula_and_the_spec_vjp():
    a = _layer_norm_inputs(0, (5, 9), offset=1.0)
    x, gamma, beta = (a[k].astype(np.float64) for k in ("x", "gamma", "beta"))
    d = x.shape[-1]
    s = np.sqrt(np.var(x, axis=-1, keepdims=True) + EPS32)
    xhat = (x - x.mean(axis=-1, keepdims=True)) / s
    np.testing.assert_allclose(reference.forward("layer_norm", a), xhat * gamma + beta, rtol=1e-12, atol=1e-12)

    g = np.random.default_rng(1).standard_normal(x.shape)
    grads = reference.vjp("layer_norm", a, g)
    ghat = g * gamma
    # The spec's formula, literally: (D·ĝ − Σĝ − x̂·Σ(ĝ·x̂)) / (D·√(σ² + eps)).
    dx = (d * ghat - ghat.sum(-1, keepdims=True) - xhat * (ghat * xhat).sum(-1, keepdims=True)) / (d * s)
    np.testing.assert_allclose(grads["x"], dx, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(grads["gamma"], (g * xhat).sum(0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grads["beta"], g.sum(0), rtol=1e-12, atol=1e-12)


def test_layer_norm_dx_projects_out_the_mean_and_most_of_xhat():
    """Σ dx = 0 per row, and Σ dx·x̂ = Σ(ĝ·x̂)·(1 − mean x̂²)/s: zero but for eps's share of s²."""
    a = _layer_norm_inputs(2, (4, 3, 17), offset=-2.0, scale=0.01)
    x = a["x"].astype(np.float64)
    s = np.sqrt(x.var(-1) + EPS32)
    xhat = (x - x.mean(-1, keepdims=True)) / s[..., None]
    g = np.random.default_rng(3).standard_normal(x.shape)
    dx = reference.vjp("layer_norm", a, g)["x"]
    assert np.abs(dx.sum(-1)).max() < 1e-9
    ghat_xhat = (g * a["gamma"] * xhat).sum(-1)
    expected = ghat_xhat * (1.0 - (xhat * xhat).mean(-1)) / s
    np.testing.assert_allclose((dx * xhat).sum(-1), expected, rtol=1e-6, atol=1e-9)
    assert np.abs(expected).max() > 1e-3 * np.abs(ghat_xhat / s).max()


def test_layer_norm_d1_gives_beta_and_no_x_gradient():
    a = _layer_norm_inputs(4, (6, 1))
    y = reference.forward("layer_norm", a)
    np.testing.assert_array_equal(y, np.broadcast_to(a["beta"].astype(np.float64), y.shape))
    grads = reference.vjp("layer_norm", a, np.ones((6, 1)))
    np.testing.assert_array_equal(grads["x"], 0.0)
    np.testing.assert_array_equal(grads["gamma"], 0.0)
    np.testing.assert_array_equal(grads["beta"], 6.0)


def test_constant_rows_give_beta_and_eps_sets_the_scale():
    x = np.repeat(np.float32([0.1, -3.75, 0.0])[:, None], 7, axis=1)
    gamma, beta = _affine(np.random.default_rng(5), 7)
    y = reference.forward("layer_norm", {"x": x, "gamma": gamma, "beta": beta})
    np.testing.assert_array_equal(y, np.broadcast_to(beta.astype(np.float64), y.shape))

    # Rows ±a: x̂ = ±a/√(a² + eps), so eps decides the result when a² is comparable to eps.
    a = float(np.float32(1e-3))
    x = np.float32([[-a, a]])
    ones, zeros = np.ones(2, np.float32), np.zeros(2, np.float32)
    for eps in (1e-6, 1e-2, 3.0):
        y = reference.forward("layer_norm", {"x": x, "gamma": ones, "beta": zeros}, eps=eps)
        expected = a / np.sqrt(a * a + float(np.float32(eps)))
        np.testing.assert_allclose(y, [[-expected, expected]], rtol=1e-14)


def _one_pass(x, gamma, beta, eps):
    """The formula a careless kernel uses: var = E[x²] − E[x]² in float32."""
    mean = x.mean(-1, keepdims=True)
    var = np.maximum((x * x).mean(-1, keepdims=True) - mean * mean, 0.0)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def _welford(x, gamma, beta, eps):
    """A Welford kernel in float32, one element of each row at a time (rows vectorised)."""
    mean = np.zeros(x.shape[:-1], np.float32)
    m2 = np.zeros(x.shape[:-1], np.float32)
    for i in range(x.shape[-1]):
        delta = x[..., i] - mean
        mean = mean + delta / np.float32(i + 1)
        m2 = m2 + delta * (x[..., i] - mean)
    s = np.sqrt(m2 / np.float32(x.shape[-1]) + eps)[..., None]
    return (x - mean[..., None]) / s * gamma + beta


def _within_model(op, inputs, y, worst_case=True, **params):
    spec = get_spec(op)
    r = REFERENCE.forward(spec, inputs, **params)
    m = REFERENCE.magnitude(spec, inputs, **params)
    n = spec.error.length({k: v.shape for k, v in inputs.items()}, {"eps": EPS32, **params})
    return compare(y, r, m, spec.error, n, worst_case)


def test_large_offset_rows_separate_two_pass_and_welford_from_one_pass():
    a = _layer_norm_inputs(6, (8, 64), offset=1e4, scale=1.0)
    x, gamma, beta, eps = a["x"], a["gamma"], a["beta"], np.float32(EPS32)
    assert _within_model("layer_norm", a, NUMPY_F32.forward("layer_norm", a)).passed
    welford = _within_model("layer_norm", a, _welford(x, gamma, beta, eps))
    assert welford.passed, welford.reason
    one_pass = _within_model("layer_norm", a, _one_pass(x, gamma, beta, eps))
    assert not one_pass.passed and one_pass.worst > 10


def test_unbiased_variance_is_outside_the_model():
    a = _layer_norm_inputs(7, (16, 64))
    x = a["x"]
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).sum(-1, keepdims=True) / np.float32(63)
    y = (x - mean) / np.sqrt(var + np.float32(EPS32)) * a["gamma"] + a["beta"]
    assert not _within_model("layer_norm", a, y, worst_case=False).passed


def _batch_inputs(seed, shape, offset=0.5):
    rng = np.random.default_rng(seed)
    x = (offset + 2.0 * rng.standard_normal(shape)).astype(np.float32)
    gamma, beta = _affine(rng, shape[1])
    return {"x": x, "gamma": gamma, "beta": beta}


@pytest.mark.parametrize("shape", [(4, 3), (3, 2, 5), (1, 3, 4, 5), (2, 2, 3, 2, 3)])
def test_batch_norm_is_layer_norm_of_the_channel_rows(shape):
    """Forward and x-gradient against layer_norm on x moved to (C, N·spatial), gamma = 1, beta = 0,
    with the cotangent g·gamma (the chain rule through the affine step)."""
    a = _batch_inputs(8, shape)
    channels = shape[1]
    rows = np.moveaxis(a["x"], 1, 0).reshape(channels, -1)
    plain = {"x": rows, "gamma": np.ones(rows.shape[1], np.float32), "beta": np.zeros(rows.shape[1], np.float32)}
    along = (1, channels) + (1,) * (len(shape) - 2)
    xhat = np.moveaxis(reference.forward("layer_norm", plain).reshape((channels, shape[0]) + shape[2:]), 0, 1)
    y = reference.forward("batch_norm", a)
    np.testing.assert_allclose(y, xhat * a["gamma"].reshape(along) + a["beta"].reshape(along), rtol=1e-12, atol=1e-12)

    g = np.random.default_rng(9).standard_normal(shape)
    grads = reference.vjp("batch_norm", a, g)
    ghat_rows = np.moveaxis(g * a["gamma"].reshape(along), 1, 0).reshape(channels, -1)
    dx_rows = reference.vjp("layer_norm", plain, ghat_rows)["x"]
    np.testing.assert_allclose(
        grads["x"], np.moveaxis(dx_rows.reshape((channels, shape[0]) + shape[2:]), 0, 1), rtol=1e-10, atol=1e-12
    )
    axes = (0, *range(2, len(shape)))
    np.testing.assert_allclose(grads["gamma"], (g * xhat).sum(axes), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grads["beta"], g.sum(axes), rtol=1e-12, atol=1e-12)


def test_batch_norm_n1_normalises_each_image_channel_over_space():
    a = _batch_inputs(10, (1, 3, 4, 5))
    x = a["x"].astype(np.float64)
    xhat = (x - x.mean((0, 2, 3), keepdims=True)) / np.sqrt(x.var((0, 2, 3), keepdims=True) + EPS32)
    expected = xhat * a["gamma"].reshape(1, 3, 1, 1) + a["beta"].reshape(1, 3, 1, 1)
    np.testing.assert_allclose(reference.forward("batch_norm", a), expected, rtol=1e-12, atol=1e-12)
    assert _within_model("batch_norm", a, NUMPY_F32.forward("batch_norm", a)).passed


def test_batch_norm_one_value_per_channel_gives_beta():
    a = _batch_inputs(11, (1, 4))
    np.testing.assert_array_equal(reference.forward("batch_norm", a), a["beta"].astype(np.float64)[None, :])
    grads = reference.vjp("batch_norm", a, np.ones((1, 4)))
    np.testing.assert_array_equal(grads["x"], 0.0)
