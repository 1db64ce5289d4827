"""Comparison of a float32 result against the float64 reference under the design's error model."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .ops.base import TINY, U, Accumulation, ErrorModel, Exact


@dataclass(frozen=True)
class Comparison:
    """Outcome of one comparison. `worst` is the largest |y − r| / bound over the elements
    (0 for a bitwise match, inf for a special-value or exactness mismatch)."""

    passed: bool
    worst: float
    index: tuple | None = None
    reason: str = ""


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in float32 units in the last place (monotone integer mapping of the bits)."""
    def ordered(x):
        i = np.asarray(x, dtype=np.float32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    return np.abs(ordered(a) - ordered(b))


def bound(model: Accumulation, magnitude: np.ndarray, n: int, worst_case: bool) -> np.ndarray:
    """c·u·M + c·2⁻¹²⁶ of design §4."""
    c = model.c(n, worst_case)
    with np.errstate(over="ignore", invalid="ignore"):
        return c * U * np.abs(np.asarray(magnitude, dtype=np.float64)) + c * TINY


def compare(y, r, magnitude, model: ErrorModel, n: int = 1, worst_case: bool = False) -> Comparison:
    """y (float32 result) against r (float64 reference) with the NaN / ±inf policy:
    NaN where r is NaN, the same infinity where r is infinite, the model's bound elsewhere."""
    y = np.asarray(y)
    r = _float32_target(np.asarray(r, dtype=np.float64))
    if y.shape != r.shape:
        return Comparison(False, float("inf"), None, f"shape {y.shape} != reference shape {r.shape}")
    if y.size == 0:
        return Comparison(True, 0.0)
    with np.errstate(invalid="ignore"):
        y64 = y.astype(np.float64)
    r_nan = np.isnan(r)
    nan_bad = r_nan != np.isnan(y64)
    if nan_bad.any():
        return _fail(nan_bad, "NaN where the reference is not, or a number where it is NaN", y64, r)
    r_inf = np.isinf(r)
    inf_bad = r_inf & (y64 != r)
    if inf_bad.any():
        return _fail(inf_bad, "infinity mismatch", y64, r)
    if isinstance(model, Exact):
        with np.errstate(over="ignore"):
            r32 = r.astype(np.float32)
        same = (y.astype(np.float32).view(np.uint32) == r32.view(np.uint32)) | r_nan
        if not same.all():
            return _fail(~same, "not bitwise equal to float32(reference)", y64, r)
        return Comparison(True, 0.0)
    finite = ~(r_nan | r_inf)
    y_not_finite = finite & ~np.isfinite(y64)
    if y_not_finite.any():
        return _fail(y_not_finite, "non-finite where the reference is finite", y64, r)
    b = np.broadcast_to(bound(model, magnitude, n, worst_case), r.shape)
    err = np.where(finite, np.abs(y64 - np.where(finite, r, 0.0)), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(finite, err / b, 0.0)
    ratio = np.nan_to_num(ratio, nan=0.0)
    worst_i = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    worst = float(ratio[worst_i])
    if worst > 1.0:
        return Comparison(False, worst, tuple(int(i) for i in worst_i),
                          f"|y-r| = {err[worst_i]:.3g} exceeds the bound {b[worst_i]:.3g}")
    return Comparison(True, worst)


def _float32_target(r: np.ndarray) -> np.ndarray:
    """A finite reference beyond float32's range rounds to ±inf: that infinity is what a float32
    result must be (the float64 reference alone can hold it finite)."""
    with np.errstate(over="ignore"):
        r32 = r.astype(np.float32)
    overflow = np.isfinite(r) & np.isinf(r32)
    return np.where(overflow, r32.astype(np.float64), r) if overflow.any() else r


def _fail(mask, reason, y, r) -> Comparison:
    i = tuple(int(v) for v in np.argwhere(mask)[0])
    return Comparison(False, float("inf"), i, f"{reason} at {i}: y={y[i]!r}, reference={r[i]!r}")
