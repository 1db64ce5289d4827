"""fft_fno against the spec's test vectors and numpy.fft (the independent implementation: the
reference is a direct DFT with its own twiddles)."""

import doctest

import numpy as np
import pytest

from capsule_core.catalog import reference
from capsule_core.errors import ShapeError
from capsule_core.ops import spectral
from capsule_core.ops.spectral import rfft_modes

SHAPES = [
    # (B, G, Ci, Co, M)
    (2, 8, 3, 2, 3),
    (2, 8, 3, 2, 5),  # even G, every mode: Nyquist kept
    (1, 7, 2, 3, 4),  # odd G, every mode
    (2, 1, 2, 3, 1),  # G = 1
    (2, 9, 3, 2, 1),  # one mode
    (1, 12, 5, 1, 4),  # B = 1, Ci != Co
]


def _inputs(shape, seed=0):
    batch, grid, c_in, c_out, modes = shape
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal((batch, grid, c_in)),
        "w_re": rng.standard_normal((modes, c_in, c_out)),
        "w_im": rng.standard_normal((modes, c_in, c_out)),
    }


def _numpy_fft_fno(x, w_re, w_im):
    """The spec's formula through numpy.fft: rfft, mix the first M bins, zero the rest, irfft."""
    grid, modes = x.shape[1], w_re.shape[0]
    spectrum = np.fft.rfft(x, axis=1)[:, :modes]
    mixed = np.zeros((x.shape[0], grid // 2 + 1, w_re.shape[2]), dtype=complex)
    mixed[:, :modes] = np.einsum("bkc,kco->bko", spectrum, w_re + 1j * w_im)
    return np.fft.irfft(mixed, n=grid, axis=1)


def _jacobian(inputs, name):
    """d y / d inputs[name] as a (y.size, inputs[name].size) matrix, column by column through
    numpy.fft (y is affine in each input with the others fixed: f(e_i) − f(0))."""

    def f(value):
        return _numpy_fft_fno(**{**inputs, name: value.reshape(inputs[name].shape)}).ravel()

    offset = f(np.zeros(inputs[name].size))
    columns = [f(unit) - offset for unit in np.eye(inputs[name].size)]
    return np.stack(columns, axis=1)


def test_rfft_test_vectors_are_exact():
    re, im = rfft_modes(np.array([[1.0], [0.0], [0.0], [0.0]]), 3)
    assert re.ravel().tolist() == [1.0, 1.0, 1.0] and im.ravel().tolist() == [0.0, 0.0, 0.0]
    re, im = rfft_modes(np.array([[1.0], [2.0], [3.0], [4.0]]), 3)
    assert re.ravel().tolist() == [10.0, -2.0, -2.0] and im.ravel().tolist() == [0.0, 2.0, 0.0]


def test_rfft_modes_docstring_example():
    assert doctest.testmod(spectral, raise_on_error=True).attempted >= 1


@pytest.mark.parametrize("grid", [1, 2, 7, 8, 31, 64])
def test_rfft_modes_match_numpy_fft(grid):
    x = np.random.default_rng(grid).standard_normal((3, grid, 2))
    re, im = rfft_modes(x, grid // 2 + 1)
    expected = np.fft.rfft(x, axis=1)
    np.testing.assert_allclose(re + 1j * im, expected, rtol=0, atol=1e-12 * grid)


@pytest.mark.parametrize("grid", [1, 2, 10, 11])
def test_identity_weights_reproduce_x(grid):
    modes = grid // 2 + 1
    x = np.random.default_rng(grid).standard_normal((2, grid, 3))
    identity = np.broadcast_to(np.eye(3), (modes, 3, 3))
    y = reference.forward("fft_fno", {"x": x, "w_re": identity, "w_im": np.zeros_like(identity)})
    np.testing.assert_allclose(y, x, rtol=0, atol=1e-13)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_matches_numpy_fft(shape):
    inputs = _inputs(shape)
    y = reference.forward("fft_fno", inputs)
    np.testing.assert_allclose(y, _numpy_fft_fno(**inputs), rtol=0, atol=1e-12)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_vjp_is_the_transposed_numpy_fft_jacobian(shape):
    inputs = _inputs(shape, seed=1)
    y = reference.forward("fft_fno", inputs)
    g = np.random.default_rng(2).standard_normal(y.shape)
    grads = reference.vjp("fft_fno", inputs, g)
    for name in ("x", "w_re", "w_im"):
        expected = (_jacobian(inputs, name).T @ g.ravel()).reshape(inputs[name].shape)
        np.testing.assert_allclose(grads[name], expected, rtol=0, atol=1e-11, err_msg=name)


@pytest.mark.parametrize("grid", [8, 9])
def test_imaginary_weights_of_dc_and_nyquist_are_ignored(grid):
    """Im Z at DC (and, for even G, Nyquist) never reaches y: w_im there has no effect and a zero
    gradient, exactly."""
    modes = grid // 2 + 1
    inputs = _inputs((2, grid, 3, 2, modes), seed=3)
    ignored = [0] + ([grid // 2] if grid % 2 == 0 else [])
    changed = inputs["w_im"].copy()
    changed[ignored] += 5.0
    y = reference.forward("fft_fno", inputs)
    np.testing.assert_allclose(reference.forward("fft_fno", {**inputs, "w_im": changed}), y, rtol=0, atol=1e-12)
    grads = reference.vjp("fft_fno", inputs, np.ones_like(y))
    assert not grads["w_im"][ignored].any()


@pytest.mark.parametrize("grid, modes, ok", [(8, 5, True), (8, 6, False), (9, 5, True), (9, 6, False), (1, 1, True)])
def test_mode_count_limit_is_g_over_two_plus_one(grid, modes, ok):
    inputs = {"x": np.zeros((1, grid, 2)), "w_re": np.zeros((modes, 2, 2)), "w_im": np.zeros((modes, 2, 2))}
    if ok:
        assert reference.forward("fft_fno", inputs).shape == (1, grid, 2)
    else:
        with pytest.raises(ShapeError, match=r"^fft_fno: w_re: modes M"):
            reference.forward("fft_fno", inputs)


def test_numpy_provider_returns_float32():
    from capsule_core.catalog.cpu_providers import NUMPY_F32

    inputs = {k: v.astype(np.float32) for k, v in _inputs(SHAPES[2]).items()}
    y = NUMPY_F32.forward("fft_fno", inputs)
    assert y.dtype == np.float32
    assert all(g.dtype == np.float32 for g in NUMPY_F32.vjp("fft_fno", inputs, np.ones_like(y)).values())
