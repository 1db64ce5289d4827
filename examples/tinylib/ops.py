"""tinylib's own op: squared_relu(x) = max(x, 0)², its OpSpec built with the pointwise family's
factory, so it gets the family's samples (normal draws), edges (empty, one element, every special
value, an odd shape) and error cases. The loader names it "tinylib.squared_relu".

Error models (design §4, capsule_core/ops/base.py):
- forward: Exact. max(x, 0) is a selection, r·r one correctly rounded product (of float32 r, r² is
  exact in float64, so float32(reference) is the correctly rounded square, overflow and the
  subnormal range included).
- VJP: dx = 2·max(x, 0)·g is two operations, the doubling exact in the normal range: Accumulation
  with k = 1 and M = |2·x·g|. A kernel that rounds x·g then doubles is within u·M, and in the
  subnormal range within 2⁻¹⁴⁹ (the absolute c·2⁻¹²⁶ term); tinylib's kernel is in fact correctly
  rounded ((2x)·g, or x·(2g) where 2x would overflow). Exact would refuse the sane order x·g·2 for
  a last-bit difference in the subnormal range; anything looser than k = 1 would admit errors no
  order of these two operations can make.
NaN → 0 in both directions, as relu: x > 0 is false for NaN (and for ±0, so −0 → +0 and the
derivative at 0 is 0).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from capsule_core.ops.base import Accumulation, Exact, f32
from capsule_core.ops.pointwise import pointwise


def _positive(x):
    """max(x, 0) with NaN → 0 and −0 → +0 (relu)."""
    return np.where(x > 0, x, 0.0).astype(x.dtype)


def _forward(a, p):
    r = _positive(a["x"])
    return r * r


def _vjp(a, p, y, g):
    x = a["x"]
    return {"x": np.where(x > 0, 2.0 * x * g, 0.0).astype(g.dtype)}


def _vjp_magnitude(a, p, y, g):
    x = np.asarray(a["x"], np.float64)
    return {"x": np.abs(np.where(x > 0, 2.0 * x * np.asarray(g, np.float64), 0.0))}


SQUARED_RELU = replace(
    pointwise(
        "squared_relu",
        inputs=("x",),
        forward=_forward,
        vjp=_vjp,
        magnitude=lambda a, p, y: np.abs(np.asarray(y, np.float64)),
        vjp_magnitude=_vjp_magnitude,
        error=Exact("a selection, then one correctly rounded product"),
        vjp_error=Accumulation(1, "x·g rounded once; the doubling is exact (subnormal range: the absolute term)"),
        # forward: the comparison and the product; backward: the comparison and two products
        flops=2,
        extra_edges=[
            (
                dict(x=f32([1e19, 1.8446743e19, 1.9e19, 3e38, 1.7014118e38, 1e-20, 1e-23, 1e-30, -5.0, -1e30])),
                {},
                "edge-range",
            )
        ],
        doc="squared_relu(x) = max(x, 0)^2 (NaN -> 0, -0 -> +0); d/dx = 2 max(x, 0), 0 at 0 and for NaN.",
    ),
    family="tinylib",
)
