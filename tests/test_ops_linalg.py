"""matmul, linear and mse_loss against numpy's matmul / einsum, with their shape rules."""

import numpy as np
import pytest

from capsule_core.backends.numpy_f32 import forward as numpy_forward
from capsule_core.catalog import reference
from capsule_core.errors import ShapeError
from capsule_core.ops import get_spec

RNG = np.random.default_rng(5)


def _normal(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize(
    "a_shape, b_shape", [((3, 4), (4, 5)), ((3, 5, 7), (3, 7, 2)), ((2, 3, 4, 5), (2, 3, 5, 2)), ((33, 65), (65, 17))]
)
def test_matmul_matches_einsum(a_shape, b_shape):
    a, b = _normal(*a_shape), _normal(*b_shape)
    expected = np.einsum("...mk,...kn->...mn", a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(reference.forward("matmul", {"a": a, "b": b}), expected, rtol=1e-12, atol=1e-12)
    y = numpy_forward("matmul", {"a": a, "b": b})
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)


def test_matmul_vjp_matches_einsum():
    a, b, g = _normal(3, 5, 7), _normal(3, 7, 2), RNG.standard_normal((3, 5, 2))
    grads = reference.vjp("matmul", {"a": a, "b": b}, g)
    np.testing.assert_allclose(grads["a"], np.einsum("bmn,bkn->bmk", g, b.astype(np.float64)), rtol=1e-12)
    np.testing.assert_allclose(grads["b"], np.einsum("bmk,bmn->bkn", a.astype(np.float64), g), rtol=1e-12)


@pytest.mark.parametrize(
    "a_shape, b_shape, y_shape",
    [((3, 0), (0, 4), (3, 4)), ((0, 5), (5, 4), (0, 4)), ((3, 5), (5, 0), (3, 0)), ((0, 3, 4), (0, 4, 2), (0, 3, 2))],
)
def test_matmul_empty_cases(a_shape, b_shape, y_shape):
    y = reference.forward("matmul", {"a": np.zeros(a_shape, np.float32), "b": np.zeros(b_shape, np.float32)})
    assert y.shape == y_shape and not y.any()


def test_matmul_k0_gives_zeros_and_zero_gradients():
    a, b = np.zeros((3, 0), np.float32), np.zeros((0, 4), np.float32)
    assert np.array_equal(reference.forward("matmul", {"a": a, "b": b}), np.zeros((3, 4)))
    grads = reference.vjp("matmul", {"a": a, "b": b}, np.ones((3, 4)))
    assert grads["a"].shape == (3, 0) and grads["b"].shape == (0, 4)


def test_matmul_refuses_mismatched_inner_dims_naming_b():
    with pytest.raises(ShapeError, match=r"^matmul: b: must have k = 3 rows"):
        reference.forward("matmul", {"a": _normal(2, 3), "b": _normal(4, 5)})


def test_matmul_refuses_mismatched_batch_naming_b():
    with pytest.raises(ShapeError, match=r"^matmul: b: batch shape \(3,\) must equal a's batch shape \(2,\)"):
        reference.forward("matmul", {"a": _normal(2, 2, 3), "b": _normal(3, 3, 4)})
    with pytest.raises(ShapeError, match=r"^matmul: b: must have the rank of a \(3\)"):
        reference.forward("matmul", {"a": _normal(2, 2, 3), "b": _normal(3, 4)})


def test_matmul_cost():
    cost = get_spec("matmul").cost({"a": (3, 5, 7), "b": (3, 7, 2)}, {})
    assert cost.flops == 2 * 3 * 5 * 2 * 7
    assert cost.bytes == 4 * (3 * 5 * 7 + 3 * 7 * 2 + 3 * 5 * 2)


def test_linear_with_several_leading_axes():
    x, w, b = _normal(2, 3, 4, 5), _normal(6, 5), _normal(6)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    y = reference.forward("linear", {"x": x, "w": w, "b": b})
    np.testing.assert_allclose(y, np.einsum("...i,oi->...o", x64, w64) + b, rtol=1e-12, atol=1e-12)
    g = RNG.standard_normal((2, 3, 4, 6))
    grads = reference.vjp("linear", {"x": x, "w": w, "b": b}, g)
    np.testing.assert_allclose(grads["x"], np.einsum("...o,oi->...i", g, w64), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grads["w"], np.einsum("abco,abci->oi", g, x64), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grads["b"], g.sum(axis=(0, 1, 2)), rtol=1e-12, atol=1e-12)


def test_linear_of_one_vector():
    x, w, b = _normal(5), _normal(3, 5), _normal(3)
    y = reference.forward("linear", {"x": x, "w": w, "b": b})
    np.testing.assert_allclose(y, w.astype(np.float64) @ x + b, rtol=1e-12)
    g = RNG.standard_normal(3)
    grads = reference.vjp("linear", {"x": x, "w": w, "b": b}, g)
    np.testing.assert_allclose(grads["w"], np.outer(g, x), rtol=1e-15)
    np.testing.assert_allclose(grads["b"], g, rtol=1e-15)


def test_linear_without_rows_or_inputs():
    w, b = _normal(4, 5), _normal(4)
    empty = reference.vjp("linear", {"x": np.zeros((0, 5), np.float32), "w": w, "b": b}, np.zeros((0, 4)))
    assert not empty["w"].any() and not empty["b"].any()
    y = reference.forward("linear", {"x": np.zeros((3, 0), np.float32), "w": np.zeros((4, 0), np.float32), "b": b})
    assert np.array_equal(y, np.broadcast_to(b.astype(np.float64), (3, 4)))


def test_linear_refuses_mismatched_shapes_naming_the_argument():
    with pytest.raises(ShapeError, match=r"^linear: w: must have in = 3 columns"):
        reference.forward("linear", {"x": _normal(2, 3), "w": _normal(4, 2), "b": _normal(4)})
    with pytest.raises(ShapeError, match=r"^linear: b: must have shape \(out,\) = \(4,\)"):
        reference.forward("linear", {"x": _normal(2, 3), "w": _normal(4, 3), "b": _normal(3)})


def test_mse_loss_of_one_element():
    y = reference.forward("mse_loss", {"pred": np.float32([0.75]), "target": np.float32([-1.5])})
    assert y.shape == () and y == 2.25**2
    grads = reference.vjp("mse_loss", {"pred": np.float32([0.75]), "target": np.float32([-1.5])}, np.float64(2.0))
    assert grads["pred"].tolist() == [2 * 2.25 * 2.0] and grads["target"].tolist() == [-2 * 2.25 * 2.0]


def test_mse_loss_matches_numpy_mean():
    pred, target = _normal(3, 37), _normal(3, 37)
    d = pred.astype(np.float64) - target
    assert np.isclose(reference.forward("mse_loss", {"pred": pred, "target": target}), np.mean(d**2), rtol=1e-14)
    grads = reference.vjp("mse_loss", {"pred": pred, "target": target}, np.float64(0.5))
    np.testing.assert_allclose(grads["pred"], 2 * d * 0.5 / d.size, rtol=1e-14)
    np.testing.assert_allclose(grads["target"], -2 * d * 0.5 / d.size, rtol=1e-14)


def test_mse_loss_refuses_empty_and_mismatched_inputs():
    with pytest.raises(ShapeError, match=r"^mse_loss: pred: must have at least 1 element"):
        reference.forward("mse_loss", {"pred": np.zeros(0, np.float32), "target": np.zeros(0, np.float32)})
    with pytest.raises(ShapeError, match=r"^mse_loss: target: must have the shape of pred"):
        reference.forward("mse_loss", {"pred": _normal(2, 3), "target": _normal(3, 2)})
