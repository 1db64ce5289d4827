"""Comparison of a float32 result against the float64 reference under the design's error model,
and where that model ends (elements whose float32 evaluation overflows are out of model)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from capsule_core.ops.base import TINY, Accumulation, ErrorModel, Exact, U

FLT_MAX = float(np.finfo(np.float32).max)
OVERFLOW_THRESHOLD = FLT_MAX * (1 + 2.0**-25)
"""Beyond this magnitude a float64 value rounds to infinity in float32."""


@dataclass(frozen=True)
class Comparison:
    """Outcome of one comparison. `worst` is the largest |y − r| / bound over the elements
    (0 for a bitwise match, inf for a special-value or exactness mismatch); `out_of_model`
    counts the elements left uncompared because they lie outside the model's domain."""

    passed: bool
    worst: float
    index: tuple | None = None
    reason: str = ""
    out_of_model: int = 0


@dataclass(frozen=True)
class Float32Run:
    """The op's own code run in float32 on the same inputs (the numpy provider's arithmetic):
    its values (None where it crashed), whether numpy's overflow flag rose, and M of the finite
    terms alone (the inputs' NaNs and infinities set to 0). What `out_of_model` judges by."""

    values: np.ndarray | None
    overflowed: bool
    finite_m: np.ndarray


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
        b = np.abs(np.asarray(magnitude, dtype=np.float64))
        b *= c * U
        b += c * TINY
        return b


def out_of_model(y, r, m, model: ErrorModel, n: int, run: Float32Run) -> np.ndarray:
    """Where the error model ends (design §4): the elements whose float32 intermediates overflow.
    The model bounds rounding, not overflow, so these are never compared, only counted. An
    element is out of model where
    - the float32 run gives NaN or infinity and the float64 reference (as float32 holds it)
      does not, or the other way round: float32's range, not rounding, decided it;
    - the bound around the reference reaches across float32's overflow threshold (the largest
      float32 and infinity are both sane results there);
    - n·M of the finite terms exceeds float32's range for an accumulation of n > 1 terms (some
      order may overflow, then meet an infinity);
    - the float32 run overflowed: if it then missed the bound somewhere in the output (an
      intermediate's overflow decided the result, as in a variance of values near 3e38), the
      whole output, since another sane implementation (Welford's, an FFT's butterflies) loses
      other elements, or gets NaN where it got infinity; if it did not (gelu's x³ for huge x,
      where tanh saturates; a variance that overflows but meets gamma = 0), only the elements
      where y is NaN or an infinity the reference is not. A wrong finite value is still compared.
    """
    r = np.asarray(r, dtype=np.float64)
    mask = np.array(_overflowing(model, run.finite_m, n, r.shape) | _straddling(model, r, m, n), dtype=bool)
    ranged = _out_of_range(run.values, r)
    if ranged is not None:
        mask |= ranged
    if run.overflowed:
        missed = _misses(run.values, r, m, model, n)
        if missed is None or missed.any():
            mask[...] = True
        else:
            t = _float32_target(r)
            with np.errstate(invalid="ignore"):
                y64 = np.asarray(y, dtype=np.float64)
                mask |= ~np.isfinite(y64) & (y64 != t) & ~(np.isnan(y64) & np.isnan(t))
    return mask


def compare(
    y, r, magnitude, model: ErrorModel, n: int = 1, worst_case: bool = False, outside: np.ndarray | None = None
) -> Comparison:
    """y (float32 result) against r (float64 reference) with the NaN / ±inf policy:
    NaN where r is NaN, the same infinity where r is infinite, the model's bound elsewhere.
    `outside` marks the elements out of model (see `out_of_model`): never compared, counted."""
    y = np.asarray(y)
    r = np.asarray(r, dtype=np.float64)
    if y.shape != r.shape:
        return Comparison(False, float("inf"), None, f"shape {y.shape} != reference shape {r.shape}")
    uncompared = 0
    if outside is not None and outside.any():
        uncompared = int(outside.sum())
        y = np.where(outside, np.float32(0), y).astype(np.float32)
        r = np.where(outside, 0.0, r)
        magnitude = np.where(outside, 0.0, np.broadcast_to(np.asarray(magnitude, dtype=np.float64), r.shape))
    c = _compare(y, _float32_target(r), magnitude, model, n, worst_case)
    return Comparison(c.passed, c.worst, c.index, c.reason, uncompared)


def _compare(y, r, magnitude, model: ErrorModel, n: int, worst_case: bool) -> Comparison:
    if y.size == 0:
        return Comparison(True, 0.0)
    with np.errstate(invalid="ignore"):
        y64 = y.astype(np.float64)
    if not isinstance(model, Exact) and np.isfinite(r).all() and np.isfinite(y).all():
        return _within(y64, r, bound(model, magnitude, n, worst_case))
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
    return _worst(np.nan_to_num(ratio, nan=0.0), err, b)


def _within(y64, r, b) -> Comparison:
    """_compare where every element of y and r is finite (the common case): no NaN or infinity to
    match, so a third of the passes over the arrays."""
    err = np.abs(y64 - r)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = err / b
    return _worst(np.nan_to_num(ratio, nan=0.0), err, np.broadcast_to(b, r.shape))


def _worst(ratio, err, b) -> Comparison:
    worst_i = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    worst = float(ratio[worst_i])
    if worst > 1.0:
        return Comparison(
            False,
            worst,
            tuple(int(i) for i in worst_i),
            f"|y-r| = {float(err[worst_i])!r} exceeds the bound {float(b[worst_i])!r} ({worst!r} times the bound)",
        )
    return Comparison(True, worst)


def _float32_target(r: np.ndarray) -> np.ndarray:
    """A finite reference beyond float32's range rounds to ±inf: that infinity is what a float32
    result must be (the float64 reference alone can hold it finite)."""
    with np.errstate(over="ignore", invalid="ignore"):
        r32 = r.astype(np.float32)
    if not np.isinf(r32).any():
        return r
    overflow = np.isfinite(r) & np.isinf(r32)
    return np.where(overflow, r32.astype(np.float64), r) if overflow.any() else r


def _out_of_range(values, r) -> np.ndarray | None:
    """Where the float32 run and the reference (as float32 holds it) disagree on NaN or infinity;
    None where they cannot (no run, another shape, or both finite everywhere)."""
    if values is None or np.shape(values) != np.shape(r):
        return None
    if np.isfinite(values).all() and _finite_in_float32(r):
        return None
    o = np.asarray(values, dtype=np.float64)
    t = _float32_target(r)
    both_inf = np.isinf(o) & np.isinf(t)
    return (np.isnan(o) != np.isnan(t)) | (np.isinf(o) != np.isinf(t)) | (both_inf & (np.sign(o) != np.sign(t)))


def _finite_in_float32(r) -> bool:
    """Whether every element of r is finite as float32 holds it (no NaN, infinity or overflow)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isfinite(np.asarray(r, dtype=np.float64).astype(np.float32)).all())


def _misses(values, r, m, model, n: int) -> np.ndarray | None:
    """Where the float32 run itself misses the model's worst-case bound."""
    if values is None:
        return None
    o = np.asarray(values)
    t = _float32_target(r)
    if o.shape != t.shape:
        return None
    if not isinstance(model, Accumulation):
        with np.errstate(over="ignore", invalid="ignore"):
            t32 = t.astype(np.float32)
        same = o.astype(np.float32).view(np.uint32) == t32.view(np.uint32)
        return ~(same | (np.isnan(o) & np.isnan(t)))
    b = bound(model, m, n, True)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(o.astype(np.float64) - t)
        inside = (err <= b) | (np.isnan(o) & np.isnan(t)) | (np.isinf(t) & (o == t))
    return ~inside


def _overflowing(model, finite_m, n: int, shape) -> np.ndarray:
    """Where n·M of the finite terms exceeds float32's range, n > 1 the accumulation length:
    some summation order may overflow there (a mean's partial sums reach n times its M; a sum
    holding +inf and 3e38s may meet -inf on the way, then NaN)."""
    if not isinstance(model, Accumulation) or n <= 1 or finite_m is None:
        return np.zeros(shape, bool)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.broadcast_to(n * np.abs(np.asarray(finite_m, dtype=np.float64)) > FLT_MAX, shape)


def _straddling(model, r, m, n: int) -> np.ndarray:
    """Where the bound around the reference reaches across float32's overflow threshold: a sane
    result may be the largest finite float32 or infinity there (compare demands infinity)."""
    if not isinstance(model, Accumulation):
        return np.zeros(r.shape, bool)
    b = np.broadcast_to(bound(model, m, n, True), r.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        a = np.abs(r)
        if r.size and np.fmax.reduce(a, axis=None) + np.fmax.reduce(b, axis=None) <= OVERFLOW_THRESHOLD:
            return np.zeros(r.shape, bool)  # no finite |r| + b reaches the threshold (fmax skips NaNs)
        return np.isfinite(a) & (a - b <= OVERFLOW_THRESHOLD) & (a + b > OVERFLOW_THRESHOLD)


def _fail(mask, reason, y, r) -> Comparison:
    """The first failing element in C order (argmax of a mask: argwhere would list them all)."""
    i = tuple(int(v) for v in np.unravel_index(int(np.argmax(mask)), mask.shape))
    return Comparison(False, float("inf"), i, f"{reason} at {i}: y={float(y[i])!r}, reference={float(r[i])!r}")
