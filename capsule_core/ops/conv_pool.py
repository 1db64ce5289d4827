"""Convolution and pooling: channel-first (N, C, *spatial), spatial rank 1 to 3.

Everything is built from two adjoint primitives on a padded input: `_windows` (im2col, a strided
view (N, C, *L, *k) of every window, no copy) and `_fold` (col2im, its adjoint: window cells
added back, one vectorised slice per kernel offset). conv is a tensordot of the windows with the
weights; conv_transpose is by definition the adjoint of conv in x, so its forward is conv's
x-gradient code and its x-gradient is conv's forward.

Output length per axis: ⌊(in + 2p − k)/s⌋ + 1, or 0 when in + 2p < k (conv, pools);
max(0, (in − 1)·s + k − 2p) (conv_transpose). An int stride/padding/kernel means every axis.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from capsule_core.errors import ParamError, ShapeError
from capsule_core.ops import base

STRIDE = base.Param("stride", "per_axis", default=1, doc="step between windows, >= 1 (int: every axis)")
PADDING = base.Param("padding", "per_axis", default=0, doc="zeros added on both sides, >= 0 (int: every axis)")
KERNEL = base.Param("kernel", "per_axis", doc="window size, >= 1 (int: every axis)")
POOL_STRIDE = base.Param("stride", "per_axis", default=None, doc="step between windows, >= 1; default: kernel")
POOL_PADDING = base.Param("padding", "per_axis", default=0, doc="on both sides, 0 <= padding <= kernel/2")
BETA = base.Param("beta", "float", doc="sharpness; finite and nonzero as float32 (< 0: smooth min)")

MAX_SELECTION = "first maximum in window order"
"""The reference's tie policy: the gradient goes to the first maximal cell, row-major in the window."""


# -- geometry ------------------------------------------------------------------------------


def _per_axis(value, rank: int) -> tuple[int, ...]:
    return (value,) * rank if isinstance(value, int) else tuple(value)


def _check_per_axis(op: str, name: str, value, rank: int, minimum: int) -> tuple[int, ...]:
    values = _per_axis(value, rank)
    if len(values) != rank:
        raise ParamError(op, name, f"must be an int or one entry per spatial axis ({rank}), got {value!r}")
    if any(v < minimum for v in values):
        raise ParamError(op, name, f"must be >= {minimum} on every axis, got {value!r}")
    return values


def _out_len(size: int, k: int, s: int, p: int) -> int:
    return (size + 2 * p - k) // s + 1 if size + 2 * p >= k else 0


def _transposed_len(size: int, k: int, s: int, p: int) -> int:
    return max(0, (size - 1) * s + k - 2 * p)


def _pad(x, padding, value: float = 0.0):
    if not any(padding):
        return x
    return np.pad(x, ((0, 0), (0, 0)) + tuple((p, p) for p in padding), constant_values=value)


def _crop(a, padding, sizes):
    return a[(slice(None), slice(None)) + tuple(slice(p, p + n) for p, n in zip(padding, sizes))]


def _windows(xp, kernel, stride):
    """(N, C, *L, *k): every window of the padded input, a strided view (no copy)."""
    r = len(kernel)
    lengths = tuple(_out_len(n, k, s, 0) for n, k, s in zip(xp.shape[2:], kernel, stride))
    if 0 in lengths:
        return np.zeros(xp.shape[:2] + lengths + tuple(kernel), xp.dtype)
    view = sliding_window_view(xp, tuple(kernel), axis=tuple(range(2, 2 + r)))
    return view[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in stride)]


def _fold(cols, stride, padded_sizes):
    """The adjoint of `_windows`: (N, C, *L, *k) window cells added into (N, C, *padded_sizes),
    one vectorised slice per kernel offset (at most k0·k1·k2 iterations)."""
    r = len(stride)
    lengths, kernel = cols.shape[2 : 2 + r], cols.shape[2 + r :]
    out = np.zeros(cols.shape[:2] + tuple(padded_sizes), cols.dtype)
    if cols.size == 0:
        return out
    for offset in np.ndindex(*kernel):
        target = tuple(slice(o, o + s * (n - 1) + 1, s) for o, s, n in zip(offset, stride, lengths))
        out[(slice(None), slice(None)) + target] += cols[(Ellipsis,) + offset]
    return out


def _correlate(xp, w, stride):
    """(N, Co, *L): Σ over Ci and the kernel of windows(xp) · w, w of shape (Co, Ci, *k)."""
    r = w.ndim - 2
    win = _windows(xp, w.shape[2:], stride)
    y = np.tensordot(win, w, axes=([1, *range(2 + r, 2 + 2 * r)], [1, *range(2, 2 + r)]))
    return np.ascontiguousarray(np.moveaxis(y, -1, 1))


def _correlate_adjoint(g, w, stride, padded_sizes):
    """(N, Ci, *padded_sizes): the adjoint of `_correlate` in xp for g of shape (N, Co, *L)."""
    r = w.ndim - 2
    cols = np.moveaxis(np.tensordot(g, w, axes=([1], [0])), 1 + r, 1)
    return _fold(cols, stride, padded_sizes)


def _weight_grad(g, xp, kernel, stride):
    """(Co, Ci, *k): Σ over N and L of g · windows(xp), the adjoint of `_correlate` in w."""
    r = len(kernel)
    win = _windows(xp, kernel, stride)
    return np.tensordot(g, win, axes=([0, *range(2, 2 + r)], [0, *range(2, 2 + r)]))


def _channel_sum(g):
    return np.sum(g, axis=(0, *range(2, g.ndim)))


def _along_channels(b, rank: int):
    return np.reshape(b, (1, -1) + (1,) * (rank - 2))


def _abs(a):
    return np.abs(np.asarray(a, dtype=np.float64))


# -- conv and conv_transpose -----------------------------------------------------------------


def _conv_geometry(shapes, params):
    """(x shape, w shape, stride, padding) as tuples; params already validated."""
    x, w = tuple(shapes["x"]), tuple(shapes["w"])
    r = len(x) - 2
    return x, w, _per_axis(params["stride"], r), _per_axis(params["padding"], r)


def _conv_shape_rule(op: str, transposed: bool):
    def shape(shapes, params):
        x, w, b = tuple(shapes["x"]), tuple(shapes["w"]), tuple(shapes["b"])
        base.require_rank(op, "x", x, 3, 5)
        r = len(x) - 2
        layout = "(Ci, Co, *kernel)" if transposed else "(Co, Ci, *kernel)"
        if len(w) != len(x):
            raise ShapeError(op, "w", f"must have rank {len(x)} {layout} for x of shape {x}, got shape {w}")
        ci_axis, co_axis = (0, 1) if transposed else (1, 0)
        if w[ci_axis] != x[1]:
            raise ShapeError(
                op, "w", f"must have Ci = {x[1]} (x's channels) on axis {ci_axis} of {layout}, got shape {w}"
            )
        if min(w[2:]) < 1:
            raise ShapeError(op, "w", f"kernel sizes must be >= 1, got shape {w}")
        if b != (w[co_axis],):
            raise ShapeError(op, "b", f"must have shape (Co,) = ({w[co_axis]},), got {b}")
        stride = _check_per_axis(op, "stride", params["stride"], r, 1)
        padding = _check_per_axis(op, "padding", params["padding"], r, 0)
        length = _transposed_len if transposed else _out_len
        return (x[0], w[co_axis]) + tuple(length(n, k, s, p) for n, k, s, p in zip(x[2:], w[2:], stride, padding))

    return shape


def _conv(a, p):
    x, w = a["x"], a["w"]
    r = x.ndim - 2
    xp = _pad(x, _per_axis(p["padding"], r))
    return _correlate(xp, w, _per_axis(p["stride"], r)) + _along_channels(a["b"], x.ndim)


def _conv_vjp(a, p, y, g):
    x, w = a["x"], a["w"]
    r = x.ndim - 2
    stride, padding = _per_axis(p["stride"], r), _per_axis(p["padding"], r)
    xp = _pad(x, padding)
    dxp = _correlate_adjoint(g, w, stride, xp.shape[2:])
    return {
        "x": np.ascontiguousarray(_crop(dxp, padding, x.shape[2:])),
        "w": _weight_grad(g, xp, w.shape[2:], stride),
        "b": _channel_sum(g),
    }


def _transposed(x, w, stride, padding):
    """conv_transpose without bias: the adjoint of conv in x, (N, Co, *out)."""
    sizes = tuple(_transposed_len(n, k, s, q) for n, k, s, q in zip(x.shape[2:], w.shape[2:], stride, padding))
    if x.size == 0 or 0 in sizes:
        return np.zeros((x.shape[0], w.shape[1]) + sizes, x.dtype)
    full = tuple(n + 2 * q for n, q in zip(sizes, padding))
    return np.ascontiguousarray(_crop(_correlate_adjoint(x, w, stride, full), padding, sizes))


def _conv_transpose(a, p):
    x, w = a["x"], a["w"]
    r = x.ndim - 2
    y = _transposed(x, w, _per_axis(p["stride"], r), _per_axis(p["padding"], r))
    return y + _along_channels(a["b"], x.ndim)


def _conv_transpose_vjp(a, p, y, g):
    """dx = conv(g) (without bias) over the zero-padded cotangent; dw by conv's weight gradient
    with x in the role of the cotangent; db = Σ g."""
    x, w = a["x"], a["w"]
    r = x.ndim - 2
    stride, padding = _per_axis(p["stride"], r), _per_axis(p["padding"], r)
    if x.size == 0 or g.size == 0:
        return {"x": np.zeros_like(x), "w": np.zeros_like(w), "b": _channel_sum(g)}
    gp = _pad(g, padding)
    return {"x": _correlate(gp, w, stride), "w": _weight_grad(x, gp, w.shape[2:], stride), "b": _channel_sum(g)}


def _kernel_volume(shapes) -> int:
    return base.numel(tuple(shapes["w"])[2:])


def _conv_out_positions(shapes, params) -> int:
    """N·prod(L): the terms of conv's w and b gradients."""
    x, w, stride, padding = _conv_geometry(shapes, params)
    return x[0] * base.numel(tuple(_out_len(n, k, s, q) for n, k, s, q in zip(x[2:], w[2:], stride, padding)))


def _transposed_out_positions(shapes, params) -> int:
    x, w, stride, padding = _conv_geometry(shapes, params)
    return x[0] * base.numel(tuple(_transposed_len(n, k, s, q) for n, k, s, q in zip(x[2:], w[2:], stride, padding)))


def _conv_cost(shape_rule, transposed: bool):
    def cost(shapes, params):
        x, w = tuple(shapes["x"]), tuple(shapes["w"])
        out = shape_rule(shapes, params)
        # A multiply-add (2 flops) per (input cell, weight) pair that meets, plus the bias: conv pairs
        # each output with Ci*prod(k) weights, conv_transpose each input cell with Co*prod(k).
        pairs = (base.numel(x) if transposed else base.numel(out)) * w[1] * _kernel_volume(shapes)
        return base.Cost(
            bytes_read=4 * (base.numel(x) + base.numel(w) + out[1]),
            bytes_written=4 * base.numel(out),
            flops=2 * pairs + base.numel(out),
        )

    return cost


CONV_SIZES = {
    # (x shape, w shape, stride, padding)
    "small": (
        ((2, 2, 5, 4), (3, 2, 3, 2), 1, 0),
        ((2, 2, 7), (3, 2, 3), 2, 1),
        ((1, 2, 3, 3, 3), (2, 2, 2, 2, 2), (1, 2, 1), (1, 0, 1)),
    ),
    "medium": (
        ((2, 16, 32, 32), (16, 16, 3, 3), 1, 1),
        ((4, 8, 1000), (8, 8, 5), 2, 2),
        ((2, 4, 12, 12, 12), (6, 4, 3, 3, 3), (1, 2, 1), 1),
    ),
    "large": (((8, 32, 64, 64), (32, 32, 3, 3), 1, 1),),
}
CONV_TRANSPOSE_SIZES = {
    # (x shape, w shape (Ci, Co, *k), stride, padding)
    "small": (
        ((2, 2, 3, 2), (2, 3, 3, 2), 1, 0),
        ((2, 2, 4), (2, 3, 3), 2, 1),
        ((1, 2, 2, 2, 2), (2, 2, 2, 3, 2), (2, 1, 2), (0, 1, 0)),
    ),
    "medium": (
        ((2, 16, 16, 16), (16, 16, 3, 3), 2, 1),
        ((4, 8, 500), (8, 8, 5), 2, 2),
        ((2, 4, 8, 8, 8), (4, 6, 3, 3, 3), (1, 2, 1), 1),
    ),
    "large": (((8, 32, 32, 32), (32, 32, 4, 4), 2, 1),),
}


def _conv_arrays(rng, x_shape, w_shape, co: int) -> dict:
    """x ~ N(0, 1), w scaled by 1/sqrt(fan-in) so outputs stay O(1), b ~ N(0, 1/4)."""
    fan_in = max(1, base.numel(w_shape[1:]))
    return {
        "x": base.f32(rng.standard_normal(x_shape)),
        "w": base.f32(rng.standard_normal(w_shape) / math.sqrt(fan_in)),
        "b": base.f32(0.5 * rng.standard_normal(co)),
    }


def _conv_samples(sizes: dict, transposed: bool):
    def samples(size: str, rng: np.random.Generator) -> list[base.Sample]:
        out = []
        for i, (x, w, s, q) in enumerate(sizes[size]):
            co = w[1] if transposed else w[0]
            out.append(base.Sample(_conv_arrays(rng, x, w, co), {"stride": s, "padding": q}, f"{size}-{i}"))
        return out

    return samples


def _conv_edges(op: str, transposed: bool, cases):
    def edges() -> list[base.Sample]:
        out = []
        for case, x, w, params in cases:
            arrays = _conv_arrays(base.seeded_rng(op, case), x, w, w[1] if transposed else w[0])
            out.append(base.Sample(arrays, params, case, True))
        return out

    return edges


CONV_EDGES = (
    ("edge-output-zero", (1, 2, 2, 5), (3, 2, 3, 3), {}),
    ("edge-kernel-equals-input", (2, 3, 4, 5), (2, 3, 4, 5), {}),
    ("edge-kernel-1x1", (2, 4, 5, 6), (3, 4, 1, 1), {}),
    ("edge-stride-gt-kernel", (1, 2, 9, 8), (2, 2, 2, 2), {"stride": 3}),
    ("edge-n1-padding", (1, 3, 6, 7), (4, 3, 3, 2), {"padding": (2, 1), "stride": (2, 1)}),
    ("edge-empty-batch", (0, 2, 4, 4), (3, 2, 2, 2), {}),
    ("edge-no-input-channels", (2, 0, 4, 4), (3, 0, 2, 2), {}),
    ("edge-odd-1d", (3, 3, 37), (5, 3, 4), {"stride": 3, "padding": 2}),
    ("edge-3d", (1, 2, 5, 4, 3), (2, 2, 3, 1, 2), {"stride": (2, 1, 1), "padding": (1, 0, 1)}),
    ("edge-long-sum", (1, 64, 5, 5), (2, 64, 5, 5), {"padding": 2}),
    ("edge-many-out-channels", (1, 3, 6, 5), (20, 3, 3, 3), {"padding": 1}),
)
CONV_TRANSPOSE_EDGES = (
    ("edge-output-zero", (1, 2, 1, 3), (2, 3, 2, 2), {"padding": 1}),
    ("edge-input-empty-bias-only", (1, 2, 0, 3), (2, 3, 3, 3), {}),
    ("edge-kernel-1x1", (2, 4, 5, 6), (4, 3, 1, 1), {}),
    ("edge-stride-gt-kernel", (1, 2, 4, 3), (2, 2, 2, 2), {"stride": 3}),
    ("edge-n1-padding", (1, 3, 4, 5), (3, 4, 3, 2), {"padding": (1, 0), "stride": (2, 1)}),
    ("edge-empty-batch", (0, 2, 4, 4), (2, 3, 2, 2), {}),
    ("edge-no-input-channels", (2, 0, 4, 4), (0, 3, 2, 2), {}),
    ("edge-odd-1d", (3, 3, 37), (3, 5, 4), {"stride": 3, "padding": 1}),
    ("edge-3d", (1, 2, 3, 4, 3), (2, 2, 3, 1, 2), {"stride": (2, 1, 1), "padding": (1, 0, 0)}),
    ("edge-long-sum", (1, 64, 5, 5), (64, 2, 3, 3), {"padding": 1}),
    ("edge-many-out-channels", (1, 3, 4, 3), (3, 20, 3, 3), {"stride": 2, "padding": 1}),
)


WINDOW_ORDER_LENGTH = 1027
"""Taps of conv's order-window case: shorter than ORDER_LENGTH because a one-channel window of n
taps is n reduction steps of the implicit GEMM in each of ~n/128 blocks of its backward (n² work:
350 s on the emulator at 4099 taps, 22 s at 1027); 2²⁴ still swallows every one of its 1025 ones."""


def _order_rows(n: int = base.ORDER_LENGTH) -> np.ndarray:
    """The three orders of order_terms as rows (3, n): one batch element per order."""
    return np.stack(list(base.order_terms(n).values()))


def _conv_order_inputs(transposed: bool):
    """Weights of ones (exact products), the orders along the input channels (a 1×1 kernel);
    for conv also along one window (Ci = 1, kernel = input length: a single output)."""

    def order_inputs() -> list[base.Sample]:
        rows = _order_rows()
        n = rows.shape[1]
        channels = {
            "x": rows[:, :, None],
            "w": np.ones((n, 1, 1) if transposed else (1, n, 1), np.float32),
            "b": np.zeros(1, np.float32),
        }
        out = [base.Sample(channels, {}, "order-channels", True)]
        if not transposed:
            rows = _order_rows(WINDOW_ORDER_LENGTH)
            window = {
                "x": rows[:, None, :],
                "w": np.ones((1, 1, WINDOW_ORDER_LENGTH), np.float32),
                "b": np.zeros(1, np.float32),
            }
            out.append(base.Sample(window, {}, "order-window", True))
        return out

    return order_inputs


def _conv_errors(op: str, transposed: bool):
    def w_shape(ci, co, *k):
        return (ci, co, *k) if transposed else (co, ci, *k)

    def case(i, x, w, b, params, error, match):
        return base.zeros_error_case(f"error-{i}", {"x": x, "w": w, "b": b}, error, match, params)

    rows = [
        ((2, 4), w_shape(4, 3, 2), (3,), {}, ShapeError, r"x: must have rank 3 to 5"),
        ((1, 1, 2, 2, 2, 2), w_shape(1, 1, 1, 1, 1, 1), (1,), {}, ShapeError, r"x: must have rank 3 to 5"),
        ((2, 4, 5, 5), w_shape(4, 3, 2), (3,), {}, ShapeError, r"w: must have rank 4"),
        ((2, 4, 5, 5), w_shape(5, 3, 2, 2), (3,), {}, ShapeError, r"w: must have Ci = 4"),
        ((2, 4, 5, 5), w_shape(4, 3, 0, 2), (3,), {}, ShapeError, r"w: kernel sizes must be >= 1"),
        ((2, 4, 5, 5), w_shape(4, 3, 2, 2), (2,), {}, ShapeError, r"b: must have shape \(Co,\) = \(3,\)"),
        ((2, 4, 5, 5), w_shape(4, 3, 2, 2), (3,), {"stride": 0}, ParamError, r"stride: must be >= 1"),
        ((2, 4, 5, 5), w_shape(4, 3, 2, 2), (3,), {"stride": (1, 0)}, ParamError, r"stride: must be >= 1"),
        ((2, 4, 5, 5), w_shape(4, 3, 2, 2), (3,), {"padding": -1}, ParamError, r"padding: must be >= 0"),
        (
            (2, 4, 5, 5),
            w_shape(4, 3, 2, 2),
            (3,),
            {"stride": (1, 1, 1)},
            ParamError,
            r"stride: must be an int or one entry per spatial axis \(2\)",
        ),
        (
            (2, 4, 5, 5),
            w_shape(4, 3, 2, 2),
            (3,),
            {"padding": (1,)},
            ParamError,
            r"padding: must be an int or one entry per spatial axis \(2\)",
        ),
        ((2, 4, 5, 5), w_shape(4, 3, 2, 2), (3,), {"stride": 1.0}, ParamError, r"stride: must be a tuple of ints"),
        ((2, 4, 5, 5), w_shape(4, 3, 2, 2), (3,), {"dilation": 2}, ParamError, r"dilation: unknown parameter"),
    ]

    def errors() -> list[base.ErrorCase]:
        out = [case(i, *row) for i, row in enumerate(rows)]
        out.append(
            base.ErrorCase(
                base.Sample(
                    {"x": np.zeros((1, 1, 3), np.float32), "w": np.zeros((1, 1, 2), np.float32)}, {}, "error-missing-b"
                ),
                ShapeError,
                r"b: required input is missing",
            )
        )
        return out

    return errors


def _conv_spec(name: str, transposed: bool, *, sizes, edges, doc: str, **reference) -> base.OpSpec:
    """conv and conv_transpose: the same inputs and parameters; w's first two axes swap roles.
    `reference` is the op's forward, vjp, magnitude, vjp_magnitude, error and vjp_error."""
    w_rank = "(Ci, Co, *kernel)" if transposed else "(Co, Ci, *kernel)"
    rule = "(N, Co, *[max(0, (in-1)*s + k - 2p)])" if transposed else "(N, Co, *[(in + 2p - k)//s + 1, or 0])"
    shape_rule = _conv_shape_rule(name, transposed)
    return base.OpSpec(
        name=name,
        family="conv_pool",
        inputs=(
            base.Tensor("x", "(N, Ci, *spatial), spatial rank 1 to 3"),
            base.Tensor("w", w_rank),
            base.Tensor("b", "(Co)"),
        ),
        params=(STRIDE, PADDING),
        shape_rule=rule,
        shape=shape_rule,
        **reference,
        cost=_conv_cost(shape_rule, transposed),
        samples=_conv_samples(sizes, transposed),
        edges=_conv_edges(name, transposed, edges),
        errors=_conv_errors(name, transposed),
        order_inputs=_conv_order_inputs(transposed),
        doc=doc,
    )


CONV = _conv_spec(
    "conv",
    False,
    forward=_conv,
    vjp=_conv_vjp,
    magnitude=base.on_absolute_values(_conv),
    vjp_magnitude=base.vjp_on_absolute_values(_conv_vjp),
    error=base.Accumulation(
        2,
        "Ci*prod(k) products plus the bias summed: n = Ci*prod(k) + 1; the product rounding and one spare",
        lambda s, p: tuple(s["w"])[1] * _kernel_volume(s) + 1,
    ),
    vjp_error={
        "x": base.Accumulation(
            2, "each x cell sums at most Co*prod(k) products g*w", lambda s, p: tuple(s["w"])[0] * _kernel_volume(s)
        ),
        "w": base.Accumulation(2, "each weight sums N*prod(L) products g*x", _conv_out_positions),
        "b": base.Accumulation(1, "each bias sums N*prod(L) cotangents", _conv_out_positions),
    },
    sizes=CONV_SIZES,
    edges=CONV_EDGES,
    doc="conv(x, w, b, stride=1, padding=0): cross-correlation + bias (PyTorch convNd), "
    "zero padding, no dilation or groups.",
)

CONV_TRANSPOSE = _conv_spec(
    "conv_transpose",
    True,
    forward=_conv_transpose,
    vjp=_conv_transpose_vjp,
    magnitude=base.on_absolute_values(_conv_transpose),
    vjp_magnitude=base.vjp_on_absolute_values(_conv_transpose_vjp),
    error=base.Accumulation(
        2,
        "each output sums at most Ci*prod(k) products x*w plus the bias",
        lambda s, p: tuple(s["w"])[0] * _kernel_volume(s) + 1,
    ),
    vjp_error={
        "x": base.Accumulation(
            2, "a conv of g: Co*prod(k) products", lambda s, p: tuple(s["w"])[1] * _kernel_volume(s)
        ),
        "w": base.Accumulation(
            2,
            "each weight sums N*prod(in) products x*g",
            lambda s, p: base.numel(tuple(s["x"])[:1] + tuple(s["x"])[2:]),
        ),
        "b": base.Accumulation(1, "each bias sums N*prod(out) cotangents", _transposed_out_positions),
    },
    sizes=CONV_TRANSPOSE_SIZES,
    edges=CONV_TRANSPOSE_EDGES,
    doc="conv_transpose(x, w, b, stride=1, padding=0): the adjoint of conv in x plus bias "
    "(PyTorch conv_transposeNd without output_padding); w is (Ci, Co, *kernel).",
)


# -- pools -----------------------------------------------------------------------------------


def _pool_geometry(x_ndim: int, params):
    """(kernel, stride, padding) as tuples; stride defaults to the kernel."""
    r = x_ndim - 2
    kernel = _per_axis(params["kernel"], r)
    stride = kernel if params["stride"] is None else _per_axis(params["stride"], r)
    return kernel, stride, _per_axis(params["padding"], r)


def _pool_shape_rule(op: str):
    def shape(shapes, params):
        x = tuple(shapes["x"])
        base.require_rank(op, "x", x, 3, 5)
        r = len(x) - 2
        kernel = _check_per_axis(op, "kernel", params["kernel"], r, 1)
        stride = kernel if params["stride"] is None else _check_per_axis(op, "stride", params["stride"], r, 1)
        padding = _check_per_axis(op, "padding", params["padding"], r, 0)
        if any(2 * p > k for p, k in zip(padding, kernel)):
            raise ParamError(
                op, "padding", f"must be <= kernel/2 on every axis (kernel {kernel}), got {params['padding']!r}"
            )
        if "beta" in params and params["beta"] == 0:
            raise ParamError(op, "beta", f"must be nonzero as float32, got {params['beta']!r}")
        return x[:2] + tuple(_out_len(n, k, s, p) for n, k, s, p in zip(x[2:], kernel, stride, padding))

    return shape


def _window_cells(x, params, pad_value: float):
    """(windows as (N, C, *L, K) with K = prod(kernel), geometry) of x padded with pad_value."""
    kernel, stride, padding = _pool_geometry(x.ndim, params)
    win = _windows(_pad(x, padding, pad_value), kernel, stride)
    return win.reshape(win.shape[: x.ndim] + (base.numel(kernel),)), (kernel, stride, padding)


def _unfold_back(cells, x_shape, geometry):
    """Per-cell gradients (N, C, *L, K) added back into x's shape (padding cells dropped)."""
    kernel, stride, padding = geometry
    padded = tuple(n + 2 * p for n, p in zip(x_shape[2:], padding))
    folded = _fold(cells.reshape(cells.shape[:-1] + tuple(kernel)), stride, padded)
    return np.ascontiguousarray(_crop(folded, padding, x_shape[2:]))


def _overlap(shapes, params) -> int:
    """At most how many windows cover one cell: prod(ceil(k/s))."""
    kernel, stride, _ = _pool_geometry(len(tuple(shapes["x"])), params)
    return base.numel(tuple(-(-k // s) for k, s in zip(kernel, stride)))


def _volume(shapes, params) -> int:
    return base.numel(_pool_geometry(len(tuple(shapes["x"])), params)[0])


def _max_pool(a, p):
    """NaN padding never wins: fmax ignores NaN, and a window whose cells are all NaN gives NaN."""
    cells, _ = _window_cells(a["x"], p, np.nan)
    return np.fmax.reduce(cells, axis=-1)


def _max_pool_vjp(a, p, y, g):
    """g to the first cell (row-major in the window) equal to the window's maximum; none for an
    all-NaN window (NaN equals nothing)."""
    x = a["x"]
    cells, geometry = _window_cells(x, p, np.nan)
    hits = cells == y[..., None]
    first = np.argmax(hits, axis=-1)[..., None]
    chosen = (np.arange(cells.shape[-1]) == first) & np.take_along_axis(hits, first, axis=-1)
    return {"x": _unfold_back(np.where(chosen, g[..., None], 0.0), x.shape, geometry)}


def max_pool_windows(x_shape, params) -> np.ndarray:
    """Each output's window as flat indices into x, row-major in the window, −1 for padding:
    shape (outputs, kernel volume). What verify's selection.ties check needs to judge a gradient."""
    index = np.arange(base.numel(x_shape), dtype=np.int64).reshape(x_shape)
    cells, _ = _window_cells(index, params, -1)
    return cells.reshape(-1, cells.shape[-1])


def _avg_pool(a, p):
    cells, _ = _window_cells(a["x"], p, 0.0)
    return np.sum(cells, axis=-1) / float(cells.shape[-1])


def _avg_pool_vjp(a, p, y, g):
    x = a["x"]
    cells, geometry = _window_cells(x, p, 0.0)
    share = np.broadcast_to((g / float(cells.shape[-1]))[..., None], cells.shape)
    return {"x": _unfold_back(share, x.shape, geometry)}


def _smooth_terms(x, p):
    """(cells, pivot, e = exp(beta·(v − pivot)), S = Σ e, geometry), padding counted as 0."""
    beta = p["beta"]
    cells, geometry = _window_cells(x, p, 0.0)
    pivot = np.max(cells, axis=-1) if beta > 0 else np.min(cells, axis=-1)
    e = np.exp(beta * (cells - pivot[..., None]))
    return cells, pivot, e, np.sum(e, axis=-1), geometry


def _smooth_max_pool(a, p):
    _, pivot, _, total, _ = _smooth_terms(a["x"], p)
    return pivot + np.log(total) / p["beta"]


def _smooth_max_pool_vjp(a, p, y, g):
    """g times the window's softmax weights e/S, to real cells only."""
    x = a["x"]
    _, _, e, total, geometry = _smooth_terms(x, p)
    return {"x": _unfold_back(g[..., None] * (e / total[..., None]), x.shape, geometry)}


def _smooth_magnitude_terms(a, p):
    """(M of y, |v − pivot| per cell, weights, geometry) in float64.

    M(y) = |pivot| + (|ln S| + 1)/|beta| + Σ w·|v − pivot|: the pivot and final addition, the
    sum S (relative c·u, as all its terms are positive) and the exp ulps through ln and /beta,
    and the rounding of beta·(v − pivot) through the weights w = e/S.
    """
    x = np.asarray(a["x"], np.float64)
    cells, pivot, e, total, geometry = _smooth_terms(x, p)
    spread = np.abs(cells - pivot[..., None])
    weights = e / total[..., None]
    m_y = np.abs(pivot) + (np.abs(np.log(total)) + 1.0) / abs(p["beta"]) + np.sum(weights * spread, axis=-1)
    return m_y, spread, weights, geometry


def _smooth_vjp_magnitude(a, p, y, g):
    """Σ over windows |g|·w·(2 + |beta|·(|v − pivot| + M(y))): a kernel may form the weights as
    exp(beta·(v − y)), whose argument carries |beta| times y's error."""
    m_y, spread, weights, geometry = _smooth_magnitude_terms(a, p)
    terms = _abs(g)[..., None] * weights * (2.0 + abs(p["beta"]) * (spread + m_y[..., None]))
    return {"x": _unfold_back(terms, a["x"].shape, geometry)}


def _pool_cost(name: str, flops_per_cell: int, flops_per_output: int):
    def cost(shapes, params):
        x = tuple(shapes["x"])
        out = _pool_shape_rule(name)(shapes, params)
        flops = base.numel(out) * (flops_per_cell * _volume(shapes, params) + flops_per_output)
        return base.Cost(bytes_read=4 * base.numel(x), bytes_written=4 * base.numel(out), flops=flops)

    return cost


POOL_SIZES = {
    # (x shape, kernel, stride, padding)
    "small": (((2, 2, 5, 4), 2, 1, 0), ((1, 2, 7), 3, 2, 1), ((1, 1, 3, 4, 3), (2, 2, 2), (1, 2, 1), (1, 0, 1))),
    "medium": (
        ((4, 16, 32, 32), 2, None, 0),
        ((2, 8, 1000), 3, 2, 1),
        ((2, 4, 16, 16, 16), (2, 3, 2), (2, 2, 1), (1, 1, 0)),
    ),
    "large": (((8, 64, 64, 64), 3, 2, 1),),
}


def _distinct(rng, shape):
    """Values 0.25 apart in random order (plus small noise): no ties, no near-ties for finite
    differences, mixed signs."""
    size = base.numel(shape)
    values = 0.25 * (rng.permutation(size) - size / 2.0) + 0.01 * rng.uniform(-1.0, 1.0, size)
    return base.f32(values.reshape(shape))


def _pool_samples(betas=()):
    def samples(size: str, rng: np.random.Generator) -> list[base.Sample]:
        out = []
        for i, (shape, kernel, stride, padding) in enumerate(POOL_SIZES[size]):
            params = {"kernel": kernel, "padding": padding, **({} if stride is None else {"stride": stride})}
            if betas:
                params["beta"] = betas[i % len(betas)]
            x = _distinct(rng, shape) if size == "small" else base.f32(2.0 * rng.standard_normal(shape))
            out.append(base.Sample({"x": x}, params, f"{size}-{i}"))
        return out

    return samples


def _pool_edges(op: str, cases) -> list[base.Sample]:
    """Edge samples from (case, x or a shape to draw, params)."""
    out = []
    for case, x, params in cases:
        if isinstance(x, tuple):
            x = 2.0 * base.seeded_rng(op, case).standard_normal(x)
        out.append(base.Sample({"x": base.f32(x)}, params, case, True))
    return out


def _common_pool_edges(extra: dict):
    """Geometry edges shared by every pool; `extra` holds the op's own parameters (beta)."""
    return [
        ("edge-empty-batch", (0, 2, 4, 4), {"kernel": 2, **extra}),
        ("edge-output-zero", (1, 2, 1, 5), {"kernel": 3, **extra}),
        ("edge-kernel-equals-input", (2, 3, 4, 5), {"kernel": (4, 5), **extra}),
        ("edge-kernel-1", (1, 2, 3, 5), {"kernel": 1, **extra}),
        ("edge-stride-gt-kernel", (1, 2, 9, 8), {"kernel": 2, "stride": 3, **extra}),
        ("edge-overlapping", (1, 2, 7, 6), {"kernel": 3, "stride": 1, "padding": 1, **extra}),
        ("edge-1d-odd", (3, 2, 37), {"kernel": 4, "stride": 3, "padding": 2, **extra}),
        ("edge-3d-padding", (1, 2, 5, 4, 3), {"kernel": (3, 2, 3), "stride": (2, 1, 1), "padding": (1, 1, 1), **extra}),
    ]


SPECIAL_NO_NEGATIVE_ZERO = base.SPECIAL_VALUES[~((base.SPECIAL_VALUES == 0) & np.signbit(base.SPECIAL_VALUES))]
"""The special values without −0: a ±0 tie has no defined winner sign, so a bitwise comparison
of a max over +0 and −0 would depend on the traversal order."""


def _max_pool_edges() -> list[base.Sample]:
    rng = base.seeded_rng("max_pool", "edge-values")
    nan, inf = np.nan, np.inf
    all_nan = np.arange(16.0).reshape(1, 1, 4, 4)
    all_nan[..., :2, :2] = nan
    some_nan = 2.0 * rng.standard_normal((2, 2, 6, 6))
    some_nan[rng.random(some_nan.shape) < 0.3] = nan
    ties = np.round(rng.random((1, 2, 6, 6)))
    return _pool_edges(
        "max_pool",
        _common_pool_edges({})
        + [
            ("edge-ties-constant", np.ones((1, 2, 4, 4)), {"kernel": 2}),
            ("edge-ties-overlapping", ties, {"kernel": 3, "stride": 1, "padding": 1}),
            ("edge-all-nan-window", all_nan, {"kernel": 2}),
            ("edge-nan-never-wins", some_nan, {"kernel": 3, "stride": 2, "padding": 1}),
            ("edge-padding-never-wins", -1.0 - rng.random((1, 2, 5, 5)), {"kernel": 3, "stride": 2, "padding": 1}),
            (
                "edge-infinities",
                np.array([[[-inf, -inf, 1.0, inf, -inf, nan, -inf]]]),
                {"kernel": 2, "stride": 1, "padding": 1},
            ),
            ("edge-special", SPECIAL_NO_NEGATIVE_ZERO.reshape(1, 1, -1), {"kernel": 3, "stride": 1, "padding": 1}),
        ],
    )


def _avg_pool_edges() -> list[base.Sample]:
    rng = base.seeded_rng("avg_pool", "edge-values")
    return _pool_edges(
        "avg_pool",
        _common_pool_edges({})
        + [
            ("edge-border-windows", 1.0 + rng.random((1, 1, 5, 5)), {"kernel": 3, "stride": 2, "padding": 1}),
            ("edge-same-sign-long", np.abs(rng.standard_normal((1, 1, 64, 64))), {"kernel": 32, "padding": 16}),
        ],
    )


def _smooth_max_pool_edges() -> list[base.Sample]:
    rng = base.seeded_rng("smooth_max_pool", "edge-values")
    x = 3.0 * rng.standard_normal((2, 2, 6, 6))
    return _pool_edges(
        "smooth_max_pool",
        _common_pool_edges({"beta": 2.0})
        + [
            ("edge-beta-negative", x, {"kernel": 3, "stride": 2, "padding": 1, "beta": -3.0}),
            ("edge-beta-50", x, {"kernel": 3, "stride": 1, "padding": 1, "beta": 50.0}),
            ("edge-beta-50-negative", x, {"kernel": 2, "beta": -50.0}),
            ("edge-beta-huge", x, {"kernel": 3, "stride": 1, "beta": 1e4}),
            ("edge-beta-small", x, {"kernel": 3, "stride": 2, "beta": 1e-3}),
            ("edge-constant-windows", np.full((1, 2, 4, 4), 0.7), {"kernel": 2, "beta": 5.0}),
            ("edge-offset", 1e3 + rng.standard_normal((1, 2, 6, 6)), {"kernel": 3, "stride": 3, "beta": 4.0}),
            (
                "edge-padding-all-negative",
                -1.0 - rng.random((1, 2, 5, 5)),
                {"kernel": 3, "stride": 2, "padding": 1, "beta": 4.0},
            ),
        ],
    )


def _pool_order_inputs(signed: bool, extra: dict):
    """One window over a whole row (3, 1, n) per order: the orders of order_terms, or for
    smooth_max_pool ln(terms) of the non-negative ones, whose exp(beta·(v − pivot)) with
    beta = 1 are 1 among many 2⁻²⁴."""

    def order_inputs() -> list[base.Sample]:
        rows = np.stack(list(base.order_terms(signed=signed).values()))
        x = (rows if signed else base.f32(np.log(rows)))[:, None, :]
        return [base.Sample({"x": x}, {"kernel": x.shape[-1], **extra}, "order-window", True)]

    return order_inputs


def _pool_errors(op: str, extra: dict):
    x4 = {"x": np.zeros((1, 2, 5, 5), np.float32)}
    cases = [
        ({"x": np.zeros((2, 5), np.float32)}, {"kernel": 2}, ShapeError, r"x: must have rank 3 to 5"),
        ({"x": np.zeros((1, 1, 2, 2, 2, 2), np.float32)}, {"kernel": 2}, ShapeError, r"x: must have rank 3 to 5"),
        (x4, {}, ParamError, r"kernel: required parameter is missing"),
        (x4, {"kernel": 0}, ParamError, r"kernel: must be >= 1"),
        (x4, {"kernel": (2, 2, 2)}, ParamError, r"kernel: must be an int or one entry per spatial axis \(2\)"),
        (x4, {"kernel": 2, "stride": 0}, ParamError, r"stride: must be >= 1"),
        (x4, {"kernel": 2, "stride": (1,)}, ParamError, r"stride: must be an int or one entry per spatial axis"),
        (x4, {"kernel": 2, "padding": -1}, ParamError, r"padding: must be >= 0"),
        (x4, {"kernel": 2, "padding": 2}, ParamError, r"padding: must be <= kernel/2"),
        (x4, {"kernel": (3, 2), "padding": (1, 2)}, ParamError, r"padding: must be <= kernel/2"),
    ]
    cases = [(x, {**extra, **p}, e, m) for x, p, e, m in cases]
    if extra:
        cases += [
            (x4, {"kernel": 2}, ParamError, r"beta: required parameter is missing"),
            (x4, {"kernel": 2, "beta": 0.0}, ParamError, r"beta: must be nonzero as float32"),
            (x4, {"kernel": 2, "beta": 1e-46}, ParamError, r"beta: must be nonzero as float32"),
            (x4, {"kernel": 2, "beta": float("nan")}, ParamError, r"beta: must be finite"),
            (x4, {"kernel": 2, "beta": float("inf")}, ParamError, r"beta: must be finite"),
            (x4, {"kernel": 2, "beta": 1e39}, ParamError, r"beta: must be representable as float32"),
        ]

    def errors() -> list[base.ErrorCase]:
        return [base.ErrorCase(base.Sample(x, p, f"error-{i}"), e, m) for i, (x, p, e, m) in enumerate(cases)]

    return errors


def _pool_spec(
    name: str,
    *,
    params,
    flops_per_cell: int,
    flops_per_output: int,
    samples,
    edges,
    errors,
    doc: str,
    order_inputs=None,
    **fields,
) -> base.OpSpec:
    """The pools' factory. `fields`: the rest of the op's OpSpec fields, as OpSpec takes them: its
    forward, vjp, magnitude, vjp_magnitude, error and vjp_error, and a selection's rule, windows
    and tie cases."""
    return base.OpSpec(
        name=name,
        family="conv_pool",
        inputs=(base.Tensor("x", "(N, C, *spatial), spatial rank 1 to 3"),),
        params=params,
        shape_rule="(N, C, *[(in + 2p - k)//s + 1, or 0])",
        shape=_pool_shape_rule(name),
        **fields,
        cost=_pool_cost(name, flops_per_cell, flops_per_output),
        samples=samples,
        edges=edges,
        errors=errors,
        order_inputs=order_inputs,
        doc=doc,
    )


POOL_PARAMS = (KERNEL, POOL_STRIDE, POOL_PADDING)

MAX_POOL = _pool_spec(
    "max_pool",
    params=POOL_PARAMS,
    forward=_max_pool,
    vjp=_max_pool_vjp,
    magnitude=lambda a, p, y: _abs(y),
    vjp_magnitude=lambda a, p, y, g: _max_pool_vjp({"x": np.asarray(a["x"], np.float64)}, p, y, _abs(g)),
    error=base.Exact("a selection, no rounding"),
    vjp_error=base.Accumulation(
        1, "each cell sums the cotangents of the windows that chose it: at most prod(ceil(k/s)) terms", _overlap
    ),
    flops_per_cell=1,
    flops_per_output=0,
    samples=_pool_samples(),
    edges=_max_pool_edges,
    errors=_pool_errors("max_pool", {}),
    selection=MAX_SELECTION,
    windows=max_pool_windows,
    tie_cases=("edge-ties-constant", "edge-ties-overlapping", "edge-infinities"),
    no_order_inputs="a selection sums nothing: the window traversal decides only the tie winner "
    "(selection.ties), and the gradient's few overlapping-window sums add drawn cotangents",
    doc="max_pool(x, kernel, stride=kernel, padding=0): max over each window's real cells (padding "
    "never wins, NaN never wins, an all-NaN window gives NaN); the gradient goes to the first "
    "maximum in window order.",
)

SMOOTH_MAX_POOL = _pool_spec(
    "smooth_max_pool",
    params=(KERNEL, BETA, POOL_STRIDE, POOL_PADDING),
    forward=_smooth_max_pool,
    vjp=_smooth_max_pool_vjp,
    magnitude=lambda a, p, y: _smooth_magnitude_terms(a, p)[0],
    vjp_magnitude=_smooth_vjp_magnitude,
    error=base.Accumulation(
        8,
        "a K-term sum of exponentials (n = kernel volume); subtraction, product, expf "
        "(2 ulp), logf (1 ulp), division, addition, one spare",
        _volume,
    ),
    vjp_error=base.Accumulation(
        8,
        "weights from the K-term sum (and y), then at most prod(ceil(k/s)) windows per cell: n = K + overlap",
        lambda s, p: _volume(s, p) + _overlap(s, p),
    ),
    # Per cell: pivot comparison, subtraction, product, exp, addition; per window: log, division, addition.
    flops_per_cell=5,
    flops_per_output=3,
    samples=_pool_samples(betas=(2.0, -3.0, 4.0)),
    edges=_smooth_max_pool_edges,
    order_inputs=_pool_order_inputs(False, {"beta": 1.0}),
    errors=_pool_errors("smooth_max_pool", {"beta": 2.0}),
    doc="smooth_max_pool(x, kernel, beta, stride=kernel, padding=0): per window over all cells "
    "(padding counted as 0), pivot + ln(sum exp(beta*(v - pivot)))/beta, pivot = max (beta > 0) "
    "or min (beta < 0); no window-size correction.",
)

AVG_POOL = _pool_spec(
    "avg_pool",
    params=POOL_PARAMS,
    forward=_avg_pool,
    vjp=_avg_pool_vjp,
    magnitude=base.on_absolute_values(_avg_pool),
    vjp_magnitude=base.vjp_on_absolute_values(_avg_pool_vjp),
    error=base.Accumulation(
        2, "a K-term sum (n = kernel volume), then the division (or * 1/K: two roundings)", _volume
    ),
    vjp_error=base.Accumulation(2, "g/K, summed over at most prod(ceil(k/s)) windows per cell", _overlap),
    flops_per_cell=1,
    flops_per_output=0,
    samples=_pool_samples(),
    edges=_avg_pool_edges,
    order_inputs=_pool_order_inputs(True, {}),
    errors=_pool_errors("avg_pool", {}),
    doc="avg_pool(x, kernel, stride=kernel, padding=0): sum of the window's real cells / kernel "
    "volume (count-include-pad).",
)

SPECS = (CONV, CONV_TRANSPOSE, MAX_POOL, SMOOTH_MAX_POOL, AVG_POOL)
