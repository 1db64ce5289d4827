"""Legitimate variants: other sane float32 implementations, which verify must pass."""

from __future__ import annotations

import numpy as np

from capsule_core.ops import conv_pool as cp
from capsule_core.ops import pointwise as pw
from mutants.planting import Mutant, forward_is, vjp_is

# -- legitimate variants: other sane float32 implementations, which verify must pass ---------------


def _left_fold_sum(f, a, p):
    """A strictly sequential float32 left fold (cumsum is sequential)."""
    x, axis = a["x"], p["axis"]
    if x.size == 0:
        return f(a, p)
    if axis is None:
        return np.asarray(np.cumsum(x.reshape(-1), dtype=x.dtype)[-1])
    return np.take(np.cumsum(x, axis=axis, dtype=x.dtype), -1, axis=axis)


def _softmax_reciprocal(f, a, p):
    x = a["x"]
    if x.size == 0:
        return f(a, p)
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e * (1.0 / np.sum(e, axis=-1, keepdims=True))


def _gelu_sigmoid_form(f, a, p):
    """x * sigmoid(2u) = 0.5x(1 + tanh(u)), the sigmoid computed stably."""
    x = a["x"]
    arg = np.float32(2 * pw.GELU_K) * (x + np.float32(pw.GELU_A) * x * x * x)
    return x * pw._sigmoid(arg)


def _layer_norm_welford(f, a, p):
    x = a["x"]
    if x.size == 0:
        return f(a, p)
    rows = x.reshape(-1, x.shape[-1])
    mean = np.zeros(rows.shape[0], x.dtype)
    m2 = np.zeros(rows.shape[0], x.dtype)
    for i in range(rows.shape[1]):
        delta = rows[:, i] - mean
        mean = mean + delta / np.float32(i + 1)
        m2 = m2 + delta * (rows[:, i] - mean)
    var = (m2 / np.float32(rows.shape[1]))[:, None]
    y = (rows - mean[:, None]) / np.sqrt(var + p["eps"])
    return y.reshape(x.shape) * a["gamma"] + a["beta"]


def _max_pool_last_maximum(f, a, p, y, g):
    """Ties go to the last maximal cell: the tie winner is implementation-defined."""
    x = a["x"]
    cells, geometry = cp._window_cells(x, p, np.nan)
    hits = (cells == y[..., None])[..., ::-1]
    last = cells.shape[-1] - 1 - np.argmax(hits, axis=-1)[..., None]
    chosen = (np.arange(cells.shape[-1]) == last) & np.take_along_axis(hits[..., ::-1], last, axis=-1)
    return {"x": cp._unfold_back(np.where(chosen, g[..., None], 0.0).astype(g.dtype), x.shape, geometry)}


def _matmul_k_chunks(f, a, p):
    """Partial products over chunks of 32 terms of k, summed: another summation order."""
    x, b = a["a"], a["b"]
    k = x.shape[-1]
    y = np.zeros(x.shape[:-1] + b.shape[-1:], x.dtype)
    for s in range(0, k, 32):
        y = y + np.matmul(x[..., s : s + 32], b[..., s : s + 32, :])
    return y


def _fno_numpy_fft(f, a, p):
    x, w_re, w_im = a["x"], a["w_re"], a["w_im"]
    modes, grid = w_re.shape[0], x.shape[1]
    if x.size == 0 or x.shape[2] == 0:
        return f(a, p)
    spectrum = np.fft.rfft(x, axis=1)[:, :modes]
    w = (w_re + 1j * w_im).astype(np.complex64)
    z = np.einsum("bkc,kco->bko", spectrum, w)
    full = np.zeros((x.shape[0], grid // 2 + 1, w.shape[2]), np.complex64)
    full[:, :modes] = z
    return np.fft.irfft(full, n=grid, axis=1).astype(x.dtype)


def _scatter_sorted(f, a, p):
    """Repeats accumulated in index order (stable sort): another summation order."""
    base, index, src = a["base"], a["index"], a["src"]
    axis = p["axis"] % base.ndim
    order = np.argsort(index, kind="stable")
    out = base.copy()
    np.add.at(np.moveaxis(out, axis, 0), index[order], np.moveaxis(src, axis, 0)[order])
    return out


LEGIT = [
    Mutant(
        "reduce-sum-left-fold",
        "reduce_sum",
        "legitimate",
        "a sequential left fold",
        (),
        {"spec": forward_is(_left_fold_sum)},
    ),
    Mutant(
        "softmax-times-reciprocal",
        "softmax",
        "legitimate",
        "e * (1/sum) instead of e/sum",
        (),
        {"spec": forward_is(_softmax_reciprocal)},
    ),
    Mutant(
        "gelu-sigmoid-form",
        "gelu",
        "legitimate",
        "x*sigmoid(2u), algebraically the tanh form",
        (),
        {"spec": forward_is(_gelu_sigmoid_form)},
    ),
    Mutant(
        "layer-norm-welford",
        "layer_norm",
        "legitimate",
        "Welford's one-pass mean and variance",
        (),
        {"spec": forward_is(_layer_norm_welford)},
    ),
    Mutant(
        "max-pool-last-maximum",
        "max_pool",
        "legitimate",
        "ties give the gradient to the last maximum",
        (),
        {"spec": vjp_is(_max_pool_last_maximum)},
    ),
    Mutant(
        "matmul-k-chunks",
        "matmul",
        "legitimate",
        "k summed in chunks of 32",
        (),
        {"spec": forward_is(_matmul_k_chunks)},
    ),
    Mutant(
        "fft-fno-numpy-fft",
        "fft_fno",
        "legitimate",
        "numpy.fft rfft/irfft in single precision",
        (),
        {"spec": forward_is(_fno_numpy_fft)},
    ),
    Mutant(
        "scatter-add-sorted",
        "scatter_add",
        "legitimate",
        "repeats accumulated in sorted index order",
        (),
        {"spec": forward_is(_scatter_sorted)},
    ),
]
