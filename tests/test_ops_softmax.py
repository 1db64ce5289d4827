"""softmax, log_softmax and hard_masked_softmax against scipy.special, plus the masking rules
and the special-value conventions of the spec."""

import numpy as np
import pytest

from capsule_core.backends.numpy_f32 import forward as numpy_forward
from capsule_core.catalog import reference
from capsule_core.errors import ShapeError

special = pytest.importorskip("scipy.special")

RNG = np.random.default_rng(11)
NAN, INF = np.nan, np.inf


def _logits(shape, scale=3.0):
    return (scale * RNG.standard_normal(shape)).astype(np.float32)


@pytest.mark.parametrize("shape", [(1,), (7,), (3, 5), (2, 3, 1000), (1, 4097)])
def test_softmax_and_log_softmax_match_scipy(shape):
    x = _logits(shape)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(
        reference.forward("softmax", {"x": x}), special.softmax(x64, axis=-1), rtol=1e-12, atol=1e-300
    )
    np.testing.assert_allclose(
        reference.forward("log_softmax", {"x": x}), special.log_softmax(x64, axis=-1), rtol=1e-12, atol=1e-12
    )


def test_huge_logits_are_stable():
    x = np.float32([[3e38, -3e38, 3e38], [-3e38, -3e38, -3e38]])
    assert np.array_equal(reference.forward("softmax", {"x": x}), [[0.5, 0.0, 0.5], [1 / 3, 1 / 3, 1 / 3]])
    y = numpy_forward("softmax", {"x": x})
    assert np.allclose(y, [[0.5, 0.0, 0.5], [1 / 3, 1 / 3, 1 / 3]], rtol=1e-6)
    x = np.float32([[3e38, 3e38, 1e38]])
    x64 = x.astype(np.float64)
    log_y = reference.forward("log_softmax", {"x": x})
    assert np.allclose(log_y, x64 - x64.max() - np.log(2), rtol=1e-15)


def test_all_equal_rows_are_uniform_and_rows_of_one_are_one():
    x = np.repeat(np.float32([[0.0], [5.5], [-1e30]]), 17, axis=1)
    assert np.allclose(reference.forward("softmax", {"x": x}), 1 / 17, rtol=1e-15)
    ones = reference.forward("softmax", {"x": np.float32([[-3e38], [2.0], [1e-45]])})
    assert np.array_equal(ones, np.ones((3, 1)))
    assert np.array_equal(reference.forward("log_softmax", {"x": np.float32([[-3e38], [2.0]])}), np.zeros((2, 1)))


def test_minus_inf_entries_get_exactly_zero():
    x = np.float32([[-INF, 1.0, 2.0, -INF]])
    y = reference.forward("softmax", {"x": x})
    assert y[0, 0] == 0.0 and y[0, 3] == 0.0
    np.testing.assert_allclose(y[0, 1:3], special.softmax([1.0, 2.0]), rtol=1e-15)
    assert reference.forward("log_softmax", {"x": x})[0, 0] == -INF


def test_float32_long_rows_sum_to_one():
    y = numpy_forward("softmax", {"x": _logits((3, 4097))})
    assert y.dtype == np.float32 and np.allclose(y.sum(axis=-1, dtype=np.float64), 1.0, atol=1e-5)


def test_softmax_vjp_is_the_jacobian_transpose():
    x, g = _logits((6,)).astype(np.float64), RNG.standard_normal(6)
    y = special.softmax(x)
    jacobian = np.diag(y) - np.outer(y, y)
    np.testing.assert_allclose(reference.vjp("softmax", {"x": x}, g)["x"], jacobian.T @ g, rtol=1e-12, atol=1e-15)


def test_log_softmax_vjp_is_the_jacobian_transpose():
    x, g = _logits((6,)).astype(np.float64), RNG.standard_normal(6)
    jacobian = np.eye(6) - special.softmax(x)[None, :]
    np.testing.assert_allclose(reference.vjp("log_softmax", {"x": x}, g)["x"], jacobian.T @ g, rtol=1e-12, atol=1e-15)


# -- hard_masked_softmax -------------------------------------------------------------------


def test_hard_masked_is_softmax_over_allowed_entries():
    x = _logits((5, 9))
    mask = (RNG.random((5, 9)) < 0.6).astype(np.float32)
    mask[:, 0] = 1.0
    y = reference.forward("hard_masked_softmax", {"x": x, "mask": mask})
    for row, m, out in zip(x.astype(np.float64), mask != 0, y):
        np.testing.assert_allclose(out[m], special.softmax(row[m]), rtol=1e-12)
        assert np.all(out[~m] == 0.0)


def test_hard_masked_dead_rows_are_all_zeros():
    x = np.float32([[1.0, 2.0, 3.0], [-INF, -INF, 5.0], [NAN, INF, -INF]])
    mask = np.float32([[0, 0, 0], [1, 1, 0], [0, 0, 0]])
    for forward in (reference.forward, numpy_forward):
        y = forward("hard_masked_softmax", {"x": x, "mask": mask})
        assert np.array_equal(y, np.zeros((3, 3)))


def test_hard_masked_blocked_values_never_matter():
    x = np.float32([[NAN, 1.0, INF, 2.0, -INF, 3e38]])
    mask = np.float32([[0, 1, 0, 1, 0, 0]])
    clean = np.where(mask != 0, x, 0.0).astype(np.float32)
    for forward in (reference.forward, numpy_forward):
        y = forward("hard_masked_softmax", {"x": x, "mask": mask})
        assert np.array_equal(y, forward("hard_masked_softmax", {"x": clean, "mask": mask}))
        assert not np.isnan(y).any()
    g = RNG.standard_normal((1, 6))
    dx = reference.vjp("hard_masked_softmax", {"x": x, "mask": mask}, g)["x"]
    assert np.all(np.isfinite(dx)) and np.all(dx[mask == 0] == 0.0)


def test_hard_masked_mask_means_nonzero():
    x = np.float32([[1.0, 2.0, 3.0, 4.0, 5.0]])
    mask = np.float32([[-0.0, 0.5, -2.0, 0.0, 1e30]])
    y = reference.forward("hard_masked_softmax", {"x": x, "mask": mask})
    assert y[0, 0] == 0.0 and y[0, 3] == 0.0
    np.testing.assert_allclose(y[0, [1, 2, 4]], special.softmax([2.0, 3.0, 5.0]), rtol=1e-12)


def test_hard_masked_vjp_is_softmax_vjp_on_allowed_entries_and_mask_gets_none():
    x, g = _logits((8,)).astype(np.float64), RNG.standard_normal(8)
    mask = np.float32([1, 0, 1, 1, 0, 1, 0, 1])
    grads = reference.vjp("hard_masked_softmax", {"x": x, "mask": mask}, g)
    assert set(grads) == {"x"}
    allowed = mask != 0
    expected = reference.vjp("softmax", {"x": x[allowed]}, g[allowed])["x"]
    np.testing.assert_allclose(grads["x"][allowed], expected, rtol=1e-12, atol=1e-15)
    assert np.all(grads["x"][~allowed] == 0.0)


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "hard_masked_softmax"])
def test_empty_rows_are_refused_naming_x(op):
    inputs = {"x": np.zeros((3, 0), np.float32)}
    if op == "hard_masked_softmax":
        inputs["mask"] = np.zeros((3, 0), np.float32)
    with pytest.raises(ShapeError, match=rf"^{op}: x: the last axis \(D\) must be at least 1"):
        reference.forward(op, inputs)


def test_mask_of_another_shape_is_refused_naming_mask():
    with pytest.raises(ShapeError, match=r"^hard_masked_softmax: mask: must have the shape of x"):
        reference.forward(
            "hard_masked_softmax", {"x": np.zeros((2, 3), np.float32), "mask": np.ones((2, 4), np.float32)}
        )
