"""Scan ops: selective_scan, the diagonal linear recurrence h[t] = A[t]·h[t−1] + Bc[t]·X[t].

The one op whose reference loops, over time only (vectorised over batch and channels): the
recurrence is inherently sequential and the loop is the definition. `a` and `b` each choose
their form by shape, independently: (D,) is shared by every token, (B, T, D) is token-dependent
(the spec says the form follows their shape, so a shared decay with a token-dependent input gate
is legal, as in Mamba-style blocks).
"""

from __future__ import annotations

import numpy as np

from capsule_core.errors import ShapeError
from capsule_core.ops import base


def _at(coefficient, t: int):
    """A[t] or Bc[t] as (B, D) or (D,): a shared coefficient is the same at every step."""
    return coefficient if coefficient.ndim == 1 else coefficient[:, t]


def _recurrence(x, a, b, h0):
    """h[t] = A[t]·h[t−1] + Bc[t]·X[t] from h[−1] = h0, every h stacked as (B, T, D)."""
    out = np.empty(x.shape, dtype=x.dtype)
    h = h0
    for t in range(x.shape[1]):
        h = _at(a, t) * h + _at(b, t) * x[:, t]
        out[:, t] = h
    return out


def _reverse(a, g):
    """The reverse recurrence: total[t] = g[t] + A[t+1]·total[t+1] (B, T, D), and the final
    carry A[0]·total[0], which is dh0 (0 when T = 0)."""
    total = np.empty(g.shape, dtype=g.dtype)
    carry = np.zeros((g.shape[0], g.shape[2]), dtype=g.dtype)
    for t in reversed(range(g.shape[1])):
        carry = g[:, t] + carry
        total[:, t] = carry
        carry = carry * _at(a, t)
    return total, carry


def _previous(h0, y):
    """h[t−1] for every t: h0 then y without its last step, (B, T, D)."""
    return np.concatenate([h0[:, None], y], axis=1)[:, : y.shape[1]]


def _reduce_to(grad, coefficient):
    """A shared coefficient's cotangent sums the per-token ones over batch and time."""
    return grad.sum(axis=(0, 1)) if coefficient.ndim == 1 else grad


def _forward(a, p):
    return _recurrence(a["x"], a["a"], a["b"], a["h0"])


def _vjp(a, p, y, g):
    total, dh0 = _reverse(a["a"], g)
    return {
        "x": total * a["b"],
        "a": _reduce_to(total * _previous(a["h0"], y), a["a"]),
        "b": _reduce_to(total * a["x"], a["b"]),
        "h0": dh0,
    }


def _vjp_magnitude(a, p, y, g):
    """The reverse recurrence on |g| and |A|, times the forward magnitudes of h[t−1], |X|, |Bc|."""
    m = base.absolute_inputs(a)
    return _vjp(m, p, _forward(m, p), np.abs(np.asarray(g, dtype=np.float64)))


def _require_coefficient(name: str, shape, batch: int, steps: int, channels: int):
    if tuple(shape) not in ((channels,), (batch, steps, channels)):
        raise ShapeError(
            "selective_scan",
            name,
            f"must have shape (D,) = ({channels},) (shared) or (B, T, D) = {(batch, steps, channels)} "
            f"(token-dependent), got {tuple(shape)}",
        )


def _shape(shapes, p):
    base.require_rank("selective_scan", "x", shapes["x"], 3, 3)
    batch, steps, channels = shapes["x"]
    _require_coefficient("a", shapes["a"], batch, steps, channels)
    _require_coefficient("b", shapes["b"], batch, steps, channels)
    if tuple(shapes["h0"]) != (batch, channels):
        raise ShapeError(
            "selective_scan", "h0", f"must have shape (B, D) = {(batch, channels)}, got {tuple(shapes['h0'])}"
        )
    return (batch, steps, channels)


def _cost(shapes, p):
    """flops: two products and a sum per (b, t, d)."""
    n = base.numel(shapes["x"])
    read = n + base.numel(shapes["a"]) + base.numel(shapes["b"]) + base.numel(shapes["h0"])
    return base.Cost(bytes_read=4 * read, bytes_written=4 * n, flops=3 * n)


def _case(rng, batch, steps, channels, a_form, b_form, case, worst_case=False, decay=(0.5, 1.0)) -> base.Sample:
    """|A| drawn from `decay` with random signs (bounded, long memory near 1); Bc ~ U(−1, 1)."""

    def coefficient(form, draw):
        return base.f32(draw((channels,) if form == "shared" else (batch, steps, channels)))

    def signed_decay(shape):
        return np.where(rng.random(shape) < 0.5, -1.0, 1.0) * rng.uniform(*decay, shape)

    inputs = {
        "x": base.f32(rng.standard_normal((batch, steps, channels))),
        "a": coefficient(a_form, signed_decay),
        "b": coefficient(b_form, lambda shape: rng.uniform(-1.0, 1.0, shape)),
        "h0": base.f32(rng.standard_normal((batch, channels))),
    }
    return base.Sample(inputs, {}, case, worst_case)


SIZES = {
    # (B, T, D, form of a, form of b)
    "small": ((2, 5, 3, "shared", "shared"), (2, 4, 3, "token", "token"), (1, 6, 4, "shared", "token")),
    "medium": ((4, 256, 64, "shared", "shared"), (2, 300, 50, "token", "token")),
    "large": ((4, 2048, 256, "shared", "shared"), (4, 2048, 256, "token", "token")),
}


def _samples(size, rng):
    return [_case(rng, *dims, f"{size}-{i}") for i, dims in enumerate(SIZES[size])]


EDGES = (
    # (B, T, D, form of a, form of b, case[, |A| range where not _case's (0.5, 1.0)])
    (2, 0, 3, "shared", "shared", "edge-empty-time-shared"),
    (2, 0, 3, "token", "token", "edge-empty-time-token"),
    (0, 7, 3, "shared", "token", "edge-empty-batch"),
    (2, 7, 0, "token", "shared", "edge-no-channels"),
    (3, 1, 5, "token", "token", "edge-one-step"),
    (1, 33, 1, "shared", "shared", "edge-one-channel"),
    (2, 33, 3, "token", "shared", "edge-token-a-shared-b"),
    (2, 257, 6, "shared", "shared", "edge-unit-decay-shared", (1.0, 1.0)),
    (2, 257, 6, "token", "token", "edge-unit-decay-token", (1.0, 1.0)),
    (2, 65, 4, "token", "shared", "edge-zero-decay", (0.0, 0.0)),
    (1, 4096, 8, "shared", "shared", "edge-long-shared", (0.999, 1.0)),
    (1, 4096, 8, "token", "token", "edge-long-token", (0.999, 1.0)),
)


def _edges():
    return [
        _case(base.seeded_rng("selective_scan", case), b, t, d, fa, fb, case, True, *decay)
        for b, t, d, fa, fb, case, *decay in EDGES
    ]


def _order_inputs() -> list[base.Sample]:
    """Unit decay and gate from h0 = 0: h is the running sum of x along time, every output a
    prefix sum of the orders of order_terms (one batch element each)."""
    x = np.stack(list(base.order_terms().values()))[:, :, None]
    inputs = {"x": x, "a": np.ones(1, np.float32), "b": np.ones(1, np.float32), "h0": np.zeros((3, 1), np.float32)}
    return [base.Sample(inputs, {}, "order-time", True)]


def _error(case, argument, pattern, x=(2, 5, 3), a=(3,), b=(3,), h0=(2, 3)) -> base.ErrorCase:
    return base.zeros_error_case(case, {"x": x, "a": a, "b": b, "h0": h0}, ShapeError, rf"{argument}: {pattern}")


def _errors():
    return [
        _error("error-x-rank", "x", "must have rank 3", x=(5, 3)),
        _error("error-h0-shape", "h0", r"must have shape \(B, D\)", h0=(3, 2)),
        _error("error-a-shape", "a", r"must have shape \(D,\) .* or \(B, T, D\)", a=(5, 3)),
        _error("error-b-shape", "b", r"must have shape \(D,\) .* or \(B, T, D\)", b=(2, 5, 4)),
    ]


def _recurrence_length(shapes, p):
    """Two roundings per step on the carried state (a product and a sum), T steps."""
    return 2 * shapes["x"][1]


def _coefficient_length(name: str, chain: int):
    """`chain`·T roundings in the per-token cotangent, plus a B·T-term sum when shared."""

    def n(shapes, p):
        batch, steps, _ = shapes["x"]
        return chain * steps + (batch * steps if len(shapes[name]) == 1 else 0)

    return n


SELECTIVE_SCAN = base.OpSpec(
    name="selective_scan",
    family="scan",
    inputs=(
        base.Tensor("x", "(B, T, D)"),
        base.Tensor("a", "(D) or (B, T, D)"),
        base.Tensor("b", "(D) or (B, T, D)"),
        base.Tensor("h0", "(B, D)"),
    ),
    params=(),
    shape_rule="(B, T, D)",
    shape=_shape,
    forward=_forward,
    vjp=_vjp,
    # M: the recurrence on absolute values, M[t] = |A[t]|·M[t−1] + |Bc[t]|·|X[t]|, M[−1] = |h0|
    magnitude=base.on_absolute_values(_forward),
    vjp_magnitude=_vjp_magnitude,
    # Near the subnormals M is right (float32 A·h + Bc·X meets it); a chunked scan's Π A must not underflow.
    error=base.Accumulation(
        4,
        "Bc·X 1 rounding, a chunked or parallel scan's combine 2 more; each step rounds the carried state "
        "twice (A·h, + Bc·X; once with FMA), so n = 2T over the unrolled recurrence",
        n=_recurrence_length,
    ),
    vjp_error={
        "x": base.Accumulation(4, "the reverse recurrence (n = 2T) times Bc", n=_recurrence_length),
        "h0": base.Accumulation(4, "the reverse recurrence (n = 2T) times A[0]", n=_recurrence_length),
        "a": base.Accumulation(
            4, "reverse total (2T) times h[t−1] (2T): n = 4T, + B·T summed when shared", n=_coefficient_length("a", 4)
        ),
        "b": base.Accumulation(
            4, "reverse total (2T) times X: n = 2T, + B·T summed when shared", n=_coefficient_length("b", 2)
        ),
    },
    cost=_cost,
    samples=_samples,
    edges=_edges,
    errors=_errors,
    order_inputs=_order_inputs,
    doc="selective_scan(x, a, b, h0): h[t] = A[t]·h[t−1] + Bc[t]·X[t], h[−1] = h0, y = h; a and b are "
    "each shared (D,) or token-dependent (B, T, D).",
)

SPECS = (SELECTIVE_SCAN,)
