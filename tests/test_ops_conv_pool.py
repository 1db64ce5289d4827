"""Convolution and pooling beyond the generic contract: conv against scipy.signal.correlate,
conv_transpose as conv's adjoint, the output-length formulas, max_pool's selection policy
(one cell per window, padding and NaN never win, all-NaN windows), avg_pool's
count-include-pad, and smooth_max_pool's limits and pivot."""

import itertools

import numpy as np
import pytest

from capsule_core.catalog import reference
from capsule_core.catalog.cpu_providers import NUMPY_F32, REFERENCE
from capsule_core.ops import get_spec
from capsule_core.ops.base import shapes_of, validate
from capsule_core.verify.numerics import compare

correlate = pytest.importorskip("scipy.signal").correlate
logsumexp = pytest.importorskip("scipy.special").logsumexp

CONV_CASES = [
    # (x shape, w shape (Co, Ci, *k), stride, padding)
    ((2, 3, 11), (4, 3, 3), 1, 0),
    ((1, 2, 13), (3, 2, 4), 3, 2),
    ((2, 2, 5, 4), (3, 2, 3, 2), 1, 0),
    ((2, 3, 9, 8), (2, 3, 2, 3), (2, 3), (1, 0)),
    ((1, 2, 6, 5), (2, 2, 1, 1), 2, 1),
    ((1, 2, 5, 6, 4), (2, 2, 3, 2, 2), (1, 2, 1), (1, 0, 1)),
]


def _draw(seed, *shapes):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def _tuple(v, rank):
    return (v,) * rank if isinstance(v, int) else tuple(v)


def _scipy_conv(x, w, b, stride, padding):
    """Cross-correlation by scipy, one (sample, out channel) pair at a time, then strided."""
    rank = x.ndim - 2
    stride, padding = _tuple(stride, rank), _tuple(padding, rank)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0)) + tuple((p, p) for p in padding))
    take = tuple(slice(None, None, s) for s in stride)
    out = []
    for n in range(x.shape[0]):
        out.append(
            [
                sum(correlate(xp[n, c], w[o, c].astype(np.float64), mode="valid") for c in range(x.shape[1]))[take]
                + b[o]
                for o in range(w.shape[0])
            ]
        )
    return np.array(out)


@pytest.mark.parametrize("x_shape, w_shape, stride, padding", CONV_CASES)
def test_conv_matches_scipy_correlate(x_shape, w_shape, stride, padding):
    x, w, b = _draw(0, x_shape, w_shape, (w_shape[0],))
    y = reference.forward("conv", {"x": x, "w": w, "b": b}, stride=stride, padding=padding)
    np.testing.assert_allclose(y, _scipy_conv(x, w, b, stride, padding), rtol=1e-12, atol=1e-12)


def _exact_fit(x_shape, w_shape, stride, padding):
    """x_shape trimmed so that the windows end exactly at the padded border, (in + 2p − k) % s = 0:
    the same conv output, and conv_transpose's output then has x's length."""
    rank = len(x_shape) - 2
    sizes = tuple(
        n - (n + 2 * p - k) % s
        for n, k, s, p in zip(x_shape[2:], w_shape[2:], _tuple(stride, rank), _tuple(padding, rank))
    )
    return x_shape[:2] + sizes


@pytest.mark.parametrize("x_shape, w_shape, stride, padding", CONV_CASES)
def test_conv_transpose_is_the_adjoint_of_conv(x_shape, w_shape, stride, padding):
    """⟨conv(x), y⟩ = ⟨x, conv_transpose(y)⟩ without bias, where the windows fit exactly."""
    x, w = _draw(1, _exact_fit(x_shape, w_shape, stride, padding), w_shape)
    params = {"stride": stride, "padding": padding}
    conv_x = reference.forward("conv", {"x": x, "w": w, "b": np.zeros(w_shape[0], np.float32)}, **params)
    (y,) = _draw(2, conv_x.shape)
    back = reference.forward("conv_transpose", {"x": y, "w": w, "b": np.zeros(w_shape[1], np.float32)}, **params)
    assert back.shape == x.shape
    assert float(np.sum(conv_x * y)) == pytest.approx(float(np.sum(x * back)), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("x_shape, w_shape, stride, padding", CONV_CASES)
def test_conv_x_gradient_starts_with_conv_transpose(x_shape, w_shape, stride, padding):
    """Where the windows do not fit exactly, conv_transpose (no output_padding) is conv's x-gradient
    cut to its length; the cells after it get no gradient unless windows reach them (at most p)."""
    x, w = _draw(3, x_shape, w_shape)
    params = {"stride": stride, "padding": padding}
    inputs = {"x": x, "w": w, "b": np.zeros(w_shape[0], np.float32)}
    (y,) = _draw(4, reference.forward("conv", inputs, **params).shape)
    back = reference.forward("conv_transpose", {"x": y, "w": w, "b": np.zeros(w_shape[1], np.float32)}, **params)
    dx = reference.vjp("conv", inputs, y, **params)["x"]
    covered = (slice(None), slice(None)) + tuple(slice(0, n) for n in back.shape[2:])
    np.testing.assert_allclose(dx[covered], back, rtol=1e-12, atol=1e-12)
    reached = (slice(None), slice(None)) + tuple(
        slice(0, n + p) for n, p in zip(back.shape[2:], _tuple(padding, len(x_shape) - 2))
    )
    outside = np.ones(dx.shape, bool)
    outside[reached] = False
    assert not dx[outside].any()


@pytest.mark.parametrize(
    "size, k, s, p, conv_len, transposed_len",
    [
        (5, 3, 1, 0, 3, 7),
        (5, 3, 2, 1, 3, 9),
        (7, 2, 3, 0, 2, 20),
        (2, 3, 1, 0, 0, 4),
        (1, 3, 1, 1, 1, 1),
        (4, 4, 1, 0, 1, 7),
        (1, 2, 1, 1, 2, 0),
        (0, 3, 1, 0, 0, 2),
    ],
)
def test_output_lengths(size, k, s, p, conv_len, transposed_len):
    x = np.zeros((1, 2, size), np.float32)
    for op, w_shape, expected in (("conv", (3, 2, k), conv_len), ("conv_transpose", (2, 3, k), transposed_len)):
        inputs = {"x": x, "w": np.zeros(w_shape, np.float32), "b": np.zeros(3, np.float32)}
        _, _, shape = validate(get_spec(op), inputs, {"stride": s, "padding": p})
        assert shape == (1, 3, expected), op


def test_conv_transpose_of_an_empty_input_is_the_bias():
    """in = 0 with k > s + 2p: the output has positive length and no contribution but the bias."""
    x, w, b = _draw(3, (1, 2, 0), (2, 3, 3), (3,))
    y = reference.forward("conv_transpose", {"x": x, "w": w, "b": b})
    np.testing.assert_array_equal(y, np.broadcast_to(b.astype(np.float64)[None, :, None], (1, 3, 2)))


# -- pools -----------------------------------------------------------------------------------


def _windows_by_loop(x, kernel, stride=None, padding=0, **_):
    """{(n, c, *out index): [(cell index or None for padding, value)]} in row-major window order."""
    rank = x.ndim - 2
    kernel, padding = _tuple(kernel, rank), _tuple(padding, rank)
    stride = kernel if stride is None else _tuple(stride, rank)
    lengths = [
        (n + 2 * p - k) // s + 1 if n + 2 * p >= k else 0 for n, k, s, p in zip(x.shape[2:], kernel, stride, padding)
    ]
    out = {}
    for n, c in itertools.product(range(x.shape[0]), range(x.shape[1])):
        for pos in itertools.product(*(range(m) for m in lengths)):
            cells = []
            for off in itertools.product(*(range(k) for k in kernel)):
                idx = tuple(q * s + o - p for q, s, o, p in zip(pos, stride, off, padding))
                real = all(0 <= i < m for i, m in zip(idx, x.shape[2:]))
                cells.append(((n, c) + idx, x[(n, c) + idx]) if real else (None, 0.0))
            out[(n, c) + pos] = cells
    return out


def test_max_pool_matches_a_loop_with_nan_and_padding():
    (x,) = _draw(4, (2, 2, 7, 6))
    x[np.random.default_rng(5).random(x.shape) < 0.25] = np.nan
    params = {"kernel": (3, 2), "stride": (2, 1), "padding": (1, 1)}
    y = reference.forward("max_pool", {"x": x}, **params)
    for index, cells in _windows_by_loop(x, **params).items():
        real = [v for i, v in cells if i is not None and not np.isnan(v)]
        assert (np.isnan(y[index]) and not real) or y[index] == max(real), index


def test_max_pool_gradient_goes_to_the_first_maximum_of_each_window():
    """Ties everywhere (values 0 and 1): one cell per window gets g, the first in window order."""
    assert get_spec("max_pool").selection == "first maximum in window order"
    x = np.round(np.random.default_rng(6).random((2, 3, 6, 8))).astype(np.float32)
    params = {"kernel": 2, "stride": 2, "padding": 0}
    g = np.arange(1.0, 1.0 + 2 * 3 * 3 * 4).reshape(2, 3, 3, 4)
    dx = reference.vjp("max_pool", {"x": x}, g, **params)["x"]
    for index, cells in _windows_by_loop(x, **params).items():
        winner = max(range(len(cells)), key=lambda j: (cells[j][1], -j))
        for j, (i, _) in enumerate(cells):
            assert dx[i] == (g[index] if j == winner else 0.0), (index, i)


def test_max_pool_padding_never_wins():
    x = -1.0 - np.random.default_rng(7).random((1, 2, 5, 5)).astype(np.float32)
    params = {"kernel": 3, "stride": 2, "padding": 1}
    y = reference.forward("max_pool", {"x": x}, **params)
    assert (y < -1.0).all()
    dx = reference.vjp("max_pool", {"x": x}, np.ones_like(y), **params)["x"]
    assert dx.sum() == y.size
    for index, cells in _windows_by_loop(x, **params).items():
        assert y[index] == max(v for i, v in cells if i is not None)


def test_max_pool_all_nan_window_gives_nan_and_no_gradient():
    x = np.arange(16.0, dtype=np.float32).reshape(1, 1, 4, 4)
    x[0, 0, :2, :2] = np.nan
    x[0, 0, 2, 3] = np.nan
    for provider in (reference, NUMPY_F32):
        y = provider.forward("max_pool", {"x": x}, kernel=2)
        np.testing.assert_array_equal(y, [[[[np.nan, 7.0], [13.0, 15.0]]]])
        dx = provider.vjp("max_pool", {"x": x}, np.ones((1, 1, 2, 2), np.float32), kernel=2)["x"]
        assert not dx[0, 0, :2, :2].any()
        assert dx.sum() == 3 and dx[0, 0, 1, 3] == 1 and dx[0, 0, 3, 1] == 1 and dx[0, 0, 3, 3] == 1


def test_avg_pool_counts_padding_in_the_divisor():
    (x,) = _draw(8, (1, 2, 5, 4))
    x64 = x.astype(np.float64)
    params = {"kernel": 3, "stride": 2, "padding": 1}
    y = reference.forward("avg_pool", {"x": x}, **params)
    g = _draw(9, y.shape)[0].astype(np.float64)
    dx = reference.vjp("avg_pool", {"x": x}, g, **params)["x"]
    expected_dx = np.zeros(x.shape)
    for index, cells in _windows_by_loop(x64, **params).items():
        assert y[index] == pytest.approx(sum(v for _, v in cells) / 9.0, rel=1e-12, abs=1e-12)
        for i, _ in cells:
            if i is not None:
                expected_dx[i] += g[index] / 9.0
    # The corner window holds 4 real cells of 9: count-include-pad, not their mean.
    assert y[0, 0, 0, 0] == pytest.approx(x[0, 0, :2, :2].astype(np.float64).sum() / 9.0, rel=1e-12)
    np.testing.assert_allclose(dx, expected_dx, rtol=1e-12, atol=1e-12)


def test_smooth_max_pool_matches_logsumexp_with_padding_as_zeros():
    (x,) = _draw(10, (1, 2, 5, 6))
    x = 3.0 * x
    for beta in (2.0, -0.5, 50.0, -50.0):
        params = {"kernel": 3, "stride": 2, "padding": 1, "beta": beta}
        y = reference.forward("smooth_max_pool", {"x": x}, **params)
        y32 = NUMPY_F32.forward("smooth_max_pool", {"x": x}, **params)
        assert np.isfinite(y32).all()
        for index, cells in _windows_by_loop(x, **params).items():
            v = np.array([value for _, value in cells], np.float64)
            assert y[index] == pytest.approx(logsumexp(beta * v) / beta, rel=1e-12, abs=1e-12)


def test_smooth_max_pool_tends_to_max_pool_and_min_pool():
    """|smooth − max| ≤ ln(K)/|beta| without padding; beta < 0 gives the smooth minimum."""
    (x,) = _draw(11, (2, 2, 6, 6))
    beta = 1e3
    smooth = reference.forward("smooth_max_pool", {"x": x}, kernel=2, beta=beta)
    hard = reference.forward("max_pool", {"x": x}, kernel=2)
    assert (smooth >= hard).all() and (smooth - hard).max() <= np.log(4) / beta
    smooth_min = reference.forward("smooth_max_pool", {"x": x}, kernel=2, beta=-beta)
    hard_min = -reference.forward("max_pool", {"x": -x}, kernel=2)
    assert (smooth_min <= hard_min).all() and (hard_min - smooth_min).max() <= np.log(4) / beta


def test_smooth_max_pool_gradient_drops_the_padding_share():
    """Weights sum to 1 over all cells of a window; padding's share is not passed to x."""
    (x,) = _draw(12, (1, 1, 4, 4))
    params = {"kernel": 3, "stride": 3, "padding": 1, "beta": 1.5}
    y = reference.forward("smooth_max_pool", {"x": x}, **params)
    dx = reference.vjp("smooth_max_pool", {"x": x}, np.ones_like(y), **params)["x"]
    expected_total = 0.0
    for _index, cells in _windows_by_loop(x, **params).items():
        v = np.array([value for _, value in cells], np.float64)
        weights = np.exp(1.5 * v - logsumexp(1.5 * v))
        expected_total += sum(w for (i, _), w in zip(cells, weights) if i is not None)
    assert dx.sum() == pytest.approx(expected_total, rel=1e-12)
    assert dx.sum() < y.size


def _within_model(op, inputs, y, **params):
    spec = get_spec(op)
    arrays, p, _ = validate(spec, inputs, params)
    n = spec.error.length(shapes_of(arrays), p) if hasattr(spec.error, "length") else 1
    r = REFERENCE.forward(spec, inputs, **params)
    return compare(y, r, REFERENCE.magnitude(spec, inputs, **params), spec.error, n).passed


def _mistakes():
    """(op, inputs, params, what a plausible wrong kernel returns)."""
    x, w, b = _draw(13, (2, 3, 8, 7), (4, 3, 3, 2), (4,))
    conv = {"x": x, "w": w, "b": b}
    yield "conv", conv, {}, NUMPY_F32.forward("conv", {**conv, "w": np.ascontiguousarray(w[..., ::-1, ::-1])})
    yield "conv", conv, {}, NUMPY_F32.forward("conv", {**conv, "b": np.zeros_like(b)})
    yield "conv", conv, {"padding": 1}, np.pad(NUMPY_F32.forward("conv", conv), ((0, 0), (0, 0), (1, 1), (1, 1)))
    pool = {"kernel": 3, "stride": 2, "padding": 1}
    negative = {"x": -1.0 - np.abs(x)}
    touches_padding = np.zeros((2, 3, 4, 4), bool)
    touches_padding[..., 0, :] = touches_padding[..., :, 0] = True
    padding_wins = np.where(touches_padding, np.float32(0.0), NUMPY_F32.forward("max_pool", negative, **pool))
    yield "max_pool", negative, pool, padding_wins
    real_cells = np.array([2.0, 3.0, 3.0, 3.0])[:, None] * np.array([2.0, 3.0, 3.0, 2.0])[None, :]
    exclude_pad = NUMPY_F32.forward("avg_pool", {"x": x}, **pool) * (9.0 / real_cells)
    yield "avg_pool", {"x": x}, pool, exclude_pad.astype(np.float32)
    smooth = {**pool, "beta": 4.0}
    corrected = NUMPY_F32.forward("smooth_max_pool", {"x": x}, **smooth) - np.float32(np.log(9) / 4)
    yield "smooth_max_pool", {"x": x}, smooth, corrected


@pytest.mark.parametrize(
    "op, inputs, params, wrong",
    list(_mistakes()),
    ids=[
        "conv-flipped-kernel",
        "conv-dropped-bias",
        "conv-padding-off-by-one",
        "max_pool-padding-wins",
        "avg_pool-count-exclude-pad",
        "smooth_max_pool-size-correction",
    ],
)
def test_plausible_mistakes_are_outside_the_error_model(op, inputs, params, wrong):
    assert _within_model(op, inputs, NUMPY_F32.forward(op, inputs, **params), **params)
    assert not _within_model(op, inputs, wrong, **params)
