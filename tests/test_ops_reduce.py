"""reduce_sum and reduce_mean against numpy's own sum and mean, plus their conventions."""

import numpy as np
import pytest

from capsule_core.catalog import reference
from capsule_core.errors import ParamError

RNG = np.random.default_rng(7)
X = RNG.standard_normal((3, 4, 5)).astype(np.float32)


@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1, -3])
def test_sum_and_mean_match_numpy(axis):
    x64 = X.astype(np.float64)
    assert np.allclose(reference.forward("reduce_sum", {"x": X}, axis=axis), np.sum(x64, axis=axis), rtol=1e-14)
    assert np.allclose(reference.forward("reduce_mean", {"x": X}, axis=axis), np.mean(x64, axis=axis), rtol=1e-14)


def test_axis_is_removed_and_none_gives_a_scalar():
    assert reference.forward("reduce_sum", {"x": X}, axis=1).shape == (3, 5)
    assert reference.forward("reduce_mean", {"x": X}).shape == ()


def test_empty_sum_is_zero_and_empty_mean_is_nan():
    empty = np.zeros((2, 0, 3), np.float32)
    assert reference.forward("reduce_sum", {"x": empty}) == 0.0
    assert np.isnan(reference.forward("reduce_mean", {"x": empty}))
    assert np.array_equal(reference.forward("reduce_sum", {"x": empty}, axis=1), np.zeros((2, 3)))
    assert np.isnan(reference.forward("reduce_mean", {"x": empty}, axis=1)).all()
    assert reference.forward("reduce_mean", {"x": empty}, axis=0).shape == (0, 3)


def test_rank0_input_reduces_to_itself():
    assert reference.forward("reduce_sum", {"x": np.float32(2.5)}) == 2.5
    assert reference.forward("reduce_mean", {"x": np.float32(2.5)}) == 2.5


def test_sum_vjp_broadcasts_g_back():
    g = RNG.standard_normal((3, 5))
    dx = reference.vjp("reduce_sum", {"x": X}, g, axis=-2)["x"]
    assert np.array_equal(dx, np.broadcast_to(g[:, None, :], X.shape))


def test_mean_vjp_is_g_over_n():
    g = RNG.standard_normal((4, 5))
    dx = reference.vjp("reduce_mean", {"x": X}, g, axis=0)["x"]
    assert np.allclose(dx, np.broadcast_to(g / 3, X.shape), rtol=1e-15)
    dx_all = reference.vjp("reduce_mean", {"x": X}, np.float64(6.0))["x"]
    assert np.allclose(dx_all, np.full(X.shape, 6.0 / 60), rtol=1e-15)


def test_special_values_propagate():
    x = np.float32([[np.nan, 1.0], [np.inf, 1.0], [np.inf, -np.inf]])
    assert np.array_equal(reference.forward("reduce_sum", {"x": x}, axis=1), [np.nan, np.inf, np.nan], equal_nan=True)


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_mean"])
@pytest.mark.parametrize("axis", [3, -4])
def test_out_of_range_axis_is_refused_naming_axis(op, axis):
    with pytest.raises(ParamError, match=rf"^{op}: axis: must be in \[-3, 3\) for rank 3, got {axis}"):
        reference.forward(op, {"x": X}, axis=axis)
