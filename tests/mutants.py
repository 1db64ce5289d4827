"""The mutant catalog: planted bugs in the numpy float32 provider that `capsules verify` must catch.

Design §4 promises discriminating power: a tolerance model that a planted bug cannot exceed is as
wrong as one a legitimate float32 implementation exceeds. Each `Mutant` names one realistic kernel
bug (a sign flipped in a VJP, an off-by-one window, a dropped bias, a wrong axis, a broken NaN or
tie policy, an RNG stream off by one, a write past the end of an output, an input overwritten ...)
and builds a `MutantBackend`: the numpy provider behind verify's Backend interface, which

* swaps in a mutated OpSpec internally (`dataclasses.replace(spec, forward=..., vjp=...)`) while
  the engine keeps the correct spec for its float64 reference, and/or
* post-processes the forward values (nondeterministic jitter), and/or
* misbehaves with the guarded buffers (writes past the end, leaves an element unwritten, writes
  float64 bytes into a float32 buffer), and/or
* misbehaves around the runtime guard (counts a launch before validating, raises the wrong error).

`expect` lists the checks that should catch the bug for the right reason; tests/test_mutants.py
runs `verify_capsule(..., quick=True)` on every mutant and holds the suite to that.

MUTANTS = one list per family (gross bugs), SUBTLE (small numerical errors: TF32 operands, a one-pass
variance, a truncated constant ...) and GAPS (bugs verify misses today, each with a `gap` note saying
what would catch it). LEGIT holds the other side: different but sane float32 implementations
(another summation order, Welford, another tie winner, numpy.fft) that must raise no alarm.
Run `python tests/mutants.py` for the per-mutant table (which check killed what).

KERNEL_MUTANTS are bugs planted in the CUDA sources themselves (design §8): each replaces one exact
piece of text, which must occur exactly once, in a temporary copy of cuda/ that the emu backend
builds (EmuBackend(family_dir=...); the repository's cuda/ is never touched), and `verify op
--backend emu` must FAIL an expected check. A family build takes 5 to 30 s, so the default tests
(tests/test_kernel_mutants.py) plant KERNEL_REPRESENTATIVES, one per family; `python
tests/mutants.py --kernels [ID ...]` runs the whole catalog (builds side by side, one per core) and
prints its table and score, exit 1 on a surprise.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from capsule_core.backends.execution import GUARD_ELEMENTS, Run
from capsule_core.backends.numpy_f32 import NumpyBackend
from capsule_core.errors import InputError
from capsule_core.kernels.nvcc import cuda_source_dir
from capsule_core.ops import conv_pool as cp
from capsule_core.ops import get_spec
from capsule_core.ops import norm as nm
from capsule_core.ops import pointwise as pw
from capsule_core.ops import random as rn
from capsule_core.ops import reduce as rd
from capsule_core.ops import scan as sc
from capsule_core.ops import spectral as sp
from capsule_core.ops import view as vw
from capsule_core.ops.base import DTYPE, TINY, numel

DYNAMIC_CHECKS = (
    "shape.guard",
    "value",
    "value.special",
    "vjp",
    "vjp.reference",
    "reduction.order",
    "determinism",
    "rng",
    "selection.ties",
    "bounds",
    "inputs.intact",
)
"""verify's dynamic checks: the static ones (contract.aligned, ffi.symbols, launch.plan) read the
capsule and the CUDA sources, never the backend, so no numpy mutant can affect them."""


# -- the mutant backend ------------------------------------------------------------------------


def _write(out, y):
    out.view[...] = y


class MutantBackend(NumpyBackend):
    """The numpy provider with one planted bug. Every hook defaults to the honest behaviour:

    spec(spec) -> the mutated OpSpec the provider runs (the engine's own spec stays correct);
    post(backend, y) -> forward values as the buggy kernel leaves them;
    write(out, y) -> how the forward result lands in its GuardedOutput;
    write_grad(name, target, value) -> how each gradient lands in its GuardedOutput;
    before(backend) -> run first in forward, before any validation (a premature launch).
    """

    def __init__(self, mutant_id: str, *, spec=None, post=None, write=None, write_grad=None, before=None):
        super().__init__()
        self.name = f"mutant:{mutant_id}"
        self.description = f"numpy provider with planted bug {mutant_id}"
        self._spec, self._post, self._before = spec, post, before
        self._write, self._write_grad = write or _write, write_grad
        self.calls = 0
        self.launch_count = 0

    def mutated(self, spec):
        return self._spec(spec) if self._spec else spec

    def forward(self, spec, inputs, params, out):
        self.calls += 1
        if self._before:
            self._before(self)
        y = self.provider.forward(self.mutated(spec), inputs, **params)
        self.launch_count += 1
        if self._post:
            y = self._post(self, y)
        self._write(out, y)
        return Run(inputs, 1)

    def backward(self, spec, inputs, params, g, grads):
        self.calls += 1
        result = self.provider.vjp(self.mutated(spec), inputs, g, **params)
        self.launch_count += 1
        for name, target in grads.items():
            pairs = zip(target, result[name]) if isinstance(target, tuple) else [(target, result[name])]
            for t, r in pairs:
                if self._write_grad:
                    self._write_grad(name, t, r)
                else:
                    t.view[...] = r
        return Run(inputs, 1)


@dataclass(frozen=True)
class Mutant:
    """One planted bug: `kind` is its class (the issue's list), `expect` the checks that should
    catch it for the right reason."""

    id: str
    op: str
    kind: str
    description: str
    expect: tuple[str, ...]
    hooks: dict
    gap: str = ""
    """Non-empty for a mutant verify is known to miss: why, and what would catch it."""

    @property
    def family(self) -> str:
        return get_spec(self.op).family

    @property
    def how(self) -> str:
        """What the mutant changes: the spec's formula, the output values, the buffers, the guard."""
        parts = {"spec": "formula", "post": "values", "write": "buffers", "write_grad": "buffers", "before": "guard"}
        return "+".join(sorted({parts[k] for k in self.hooks}))

    def backend(self) -> MutantBackend:
        """A fresh backend (mutants with state, like the jitter's call counter, start over)."""
        cls = _SizeAware if self.hooks.get("post") is _jitter_large else MutantBackend
        return cls(self.id, **self.hooks)


# -- building blocks ----------------------------------------------------------------------------


def forward_is(fn):
    """Replace the forward by fn(orig_forward, arrays, params)."""

    def mutate(spec):
        return dataclasses.replace(spec, forward=lambda a, p, f=spec.forward: fn(f, a, p))

    return mutate


def vjp_is(fn):
    """Replace the VJP by fn(orig_vjp, arrays, params, y, g)."""

    def mutate(spec):
        return dataclasses.replace(spec, vjp=lambda a, p, y, g, f=spec.vjp: fn(f, a, p, y, g))

    return mutate


def both(*mutations):
    def mutate(spec):
        for m in mutations:
            spec = m(spec)
        return spec

    return mutate


def _cast(like, value):
    return np.asarray(value).astype(np.asarray(like).dtype)


def _lenient_write(out, y):
    """Writes what fits: a kernel with no guard just runs on whatever it was given."""
    flat, values = out.view.reshape(-1), np.asarray(y).reshape(-1)
    k = min(flat.size, values.size)
    flat[:k] = values[:k]


# -- pointwise ----------------------------------------------------------------------------------


def _gelu_erf(f, a, p):
    x = a["x"]
    from scipy.special import erf  # here, not at import: the GPU machine has no scipy

    return _cast(x, 0.5 * x * (1.0 + erf(x * np.float32(1.0 / math.sqrt(2.0)))))


def _sigmoid_unstable(f, a, p):
    e = np.exp(a["x"])
    return e / (1.0 + e)  # inf/inf = NaN for x > 88


def _jitter(backend, y):
    """Up to one ulp of noise, different on every call (as a racy atomic accumulation gives)."""
    rng = np.random.default_rng(backend.calls)
    y = np.asarray(y)
    flip = (rng.random(y.shape) < 0.5) & np.isfinite(y) & (np.abs(y) >= TINY)
    return np.where(flip, np.nextafter(y, np.float32(np.inf)), y).astype(y.dtype)


def _approximate_reciprocal(f, a, p):
    """rcp.approx: every third result one ulp off."""
    y = f(a, p)
    off = (np.arange(y.size).reshape(y.shape) % 3 == 0) & np.isfinite(y) & (y != 0)
    return np.where(off, np.nextafter(y, np.float32(0.0)), y).astype(y.dtype)


def _float64_bytes(name, target, value):
    """The gradient stored as float64 into a float32 buffer: twice the bytes, garbage values."""
    raw = target.full.view(np.uint8)
    data = np.ascontiguousarray(value, dtype=np.float64).reshape(-1).view(np.uint8)
    start = GUARD_ELEMENTS * 4
    n = min(data.size, raw.size - start)
    raw[start : start + n] = data[:n]


def _write_past_end(out, y):
    out.view[...] = y
    if out.size:
        out.full[GUARD_ELEMENTS + out.size] = np.asarray(y).reshape(-1)[-1]


def _write_before_start(out, y):
    out.view[...] = y
    if out.size:
        out.full[GUARD_ELEMENTS - 1] = np.asarray(y).reshape(-1)[0]


def _skip_last(out, y):
    """The last element is never written (a grid one block short): the sentinel stays."""
    flat = out.view.reshape(-1)
    flat[:-1] = np.asarray(y).reshape(-1)[:-1]


def _relu_in_place(f, a, p):
    y = f(a, p)
    a["x"][...] = y  # an in-place relu: the caller's x is gone
    return a["x"]


POINTWISE = [
    Mutant(
        "relu-nan-propagates",
        "relu",
        "NaN policy",
        "relu(NaN) = NaN (fmaxf(x, 0) order / max not fmax) instead of 0",
        ("value.special",),
        {"spec": forward_is(lambda f, a, p: np.maximum(a["x"], np.float32(0.0)))},
    ),
    Mutant(
        "relu-in-place",
        "relu",
        "input overwritten",
        "relu computed in place: the result overwrites x",
        ("inputs.intact",),
        {"spec": forward_is(_relu_in_place)},
    ),
    Mutant(
        "gelu-erf",
        "gelu",
        "wrong formula",
        "exact erf gelu instead of the tanh approximation the op promises",
        ("value",),
        {"spec": forward_is(_gelu_erf)},
    ),
    Mutant(
        "sigmoid-unstable",
        "sigmoid",
        "NaN policy",
        "e^x/(1 + e^x): inf/inf = NaN for large x",
        ("value",),
        {"spec": forward_is(_sigmoid_unstable)},
    ),
    # Seed-dependent: softplus's edges hold no x in (5, 17), so only the samples' random tail (x ~ 3*N(0, 1)
    # beyond 5) shows this bug; seed 0 has one, about half of all seeds do not (see the report).
    Mutant(
        "softplus-threshold-5",
        "softplus",
        "threshold switch",
        "returns x for x > 5 (a threshold tuned for half precision)",
        ("value",),
        {"spec": forward_is(lambda f, a, p: _cast(a["x"], np.where(a["x"] > 5, a["x"], f(a, p))))},
    ),
    Mutant(
        "clamp-grad-at-bounds",
        "clamp",
        "boundary gradient",
        "the gradient passes at x == lo and x == hi (>= instead of >)",
        ("vjp",),
        {
            "spec": vjp_is(
                lambda f, a, p, y, g: {"x": _cast(g, np.where((a["x"] >= p["lo"]) & (a["x"] <= p["hi"]), g, 0.0))}
            )
        },
    ),
    Mutant(
        "max-not-fmax",
        "max",
        "NaN policy",
        "max propagates NaN (fmaxf replaced by a > b ? a : b style max)",
        ("value.special",),
        {"spec": forward_is(lambda f, a, p: np.maximum(a["x"], a["y"]))},
    ),
    Mutant(
        "max-ties-not-split",
        "max",
        "tie rule",
        "on a tie x takes the whole gradient instead of half each",
        ("vjp",),
        {"spec": vjp_is(lambda f, a, p, y, g: pw._selection_vjp(a["x"] >= a["y"], a["y"] > a["x"], g))},
    ),
    Mutant(
        "min-signed-zero",
        "min",
        "NaN policy",
        "fminf that ignores -0 < +0: min(+0, -0) = +0",
        ("value.special",),
        {"spec": forward_is(lambda f, a, p: np.fmin(a["x"], a["y"]))},
    ),
    Mutant(
        "min-nan-grad-to-number",
        "min",
        "NaN policy",
        "a NaN operand gives the whole gradient to the other one instead of splitting it",
        ("vjp",),
        {
            "spec": vjp_is(
                lambda f, a, p, y, g: pw._selection_vjp(
                    (a["x"] < a["y"]) | np.isnan(a["y"]), (a["y"] < a["x"]) | np.isnan(a["x"]), g
                )
            )
        },
    ),
    Mutant(
        "sub-vjp-sign",
        "sub",
        "VJP sign",
        "d/dy of x - y is +g instead of -g",
        ("vjp",),
        {"spec": vjp_is(lambda f, a, p, y, g: {"x": g.copy(), "y": g.copy()})},
    ),
    Mutant(
        "cos-vjp-sign",
        "cos",
        "VJP sign",
        "cos' = +sin",
        ("vjp",),
        {"spec": vjp_is(lambda f, a, p, y, g: {"x": g * np.sin(a["x"])})},
    ),
    Mutant(
        "abs-negative-zero",
        "abs",
        "NaN policy",
        "abs as x < 0 ? -x : x keeps -0",
        ("value.special",),
        {"spec": forward_is(lambda f, a, p: np.where(a["x"] < 0, -a["x"], a["x"]))},
    ),
    Mutant(
        "sqrt-grad-at-zero",
        "sqrt",
        "boundary gradient",
        "sqrt'(0) = g/(2*sqrt(0)) = inf instead of 0",
        ("vjp",),
        {
            "spec": vjp_is(
                lambda f, a, p, y, g: {"x": _cast(g, np.where(a["x"] >= 0, g / (2.0 * np.sqrt(a["x"])), 0.0))}
            )
        },
    ),
    Mutant(
        "inv-approximate-reciprocal",
        "inv",
        "precision",
        "rcp.approx: one result in three one ulp off a correctly rounded op",
        ("value",),
        {"spec": forward_is(_approximate_reciprocal)},
    ),
    Mutant(
        "exp-nondeterministic",
        "exp",
        "nondeterminism",
        "one ulp of run-to-run noise (racy accumulation)",
        ("determinism",),
        {"post": _jitter},
    ),
    Mutant(
        "safe-log-flushes-small-grads",
        "safe_log",
        "zeros for small values",
        "gradients below 1e-6 flushed to zero (a 'safe' gradient)",
        ("vjp",),
        {
            "spec": vjp_is(
                lambda f, a, p, y, g: {
                    "x": (lambda d: _cast(d, np.where(np.abs(d) < 1e-6, 0.0, d)))(f(a, p, y, g)["x"])
                }
            )
        },
    ),
    Mutant(
        "log-grad-float64",
        "log",
        "wrong dtype",
        "the gradient written as float64 into the float32 buffer",
        ("bounds", "vjp"),
        {"write_grad": _float64_bytes},
    ),
    Mutant(
        "add-writes-past-end",
        "add",
        "write out of bounds",
        "one element written after the end of the output",
        ("bounds",),
        {"write": _write_past_end},
    ),
]

# -- softmax ------------------------------------------------------------------------------------


def _softmax_axis0(f, a, p):
    x = a["x"]
    if x.size == 0:
        return f(a, p)
    e = np.exp(x - np.max(x, axis=0, keepdims=True))
    return e / np.sum(e, axis=0, keepdims=True)


def _softmax_unstable(f, a, p):
    e = np.exp(a["x"])
    return e / np.sum(e, axis=-1, keepdims=True)


def _softmax_long_rows_zero(f, a, p):
    y = f(a, p)
    return np.zeros_like(y) if a["x"].shape[-1] >= 1000 else y


def _masked_softmax_reads_blocked(f, a, p):
    x, allowed = a["x"], a["mask"] != 0
    if x.size == 0:
        return f(a, p)
    m = np.max(x, axis=-1, keepdims=True)  # over every entry: blocked NaN / inf leak in
    e = np.where(allowed, np.exp(x - m), 0.0).astype(x.dtype)
    s = np.sum(e, axis=-1, keepdims=True)
    return _cast(x, np.where(s > 0, e / np.where(s > 0, s, 1.0), 0.0))


SOFTMAX = [
    Mutant(
        "softmax-wrong-axis",
        "softmax",
        "wrong axis",
        "softmax over axis 0 instead of the last axis",
        ("value",),
        {"spec": forward_is(_softmax_axis0)},
    ),
    Mutant(
        "softmax-unstable",
        "softmax",
        "NaN policy",
        "no max subtraction: exp overflows to inf/inf = NaN",
        ("value",),
        {"spec": forward_is(_softmax_unstable)},
    ),
    Mutant(
        "softmax-zeros-long-rows",
        "softmax",
        "zeros for small values",
        "rows of 1000+ (tiny values) come out all zeros",
        ("value",),
        {"spec": forward_is(_softmax_long_rows_zero)},
    ),
    Mutant(
        "softmax-skips-last-element",
        "softmax",
        "unwritten output",
        "the last output element is never written",
        ("bounds", "value"),
        {"write": _skip_last},
    ),
    Mutant(
        "hard-masked-reads-blocked",
        "hard_masked_softmax",
        "NaN policy",
        "the row max reads blocked entries, so a blocked NaN or inf poisons the row",
        ("value.special",),
        {"spec": forward_is(_masked_softmax_reads_blocked)},
    ),
    Mutant(
        "log-softmax-vjp-no-exp",
        "log_softmax",
        "wrong VJP",
        "dx = g - y*sum(g) (exp(y) forgotten)",
        ("vjp",),
        {"spec": vjp_is(lambda f, a, p, y, g: {"x": g - y * np.sum(g, axis=-1, keepdims=True)})},
    ),
]

# -- reduce -------------------------------------------------------------------------------------


def _sum_axis_innermost(f, a, p):
    """Indexes as if the reduced axis were the innermost one (a stride bug)."""
    x, axis = a["x"], p["axis"]
    if axis is None or x.size == 0:
        return f(a, p)
    axis %= x.ndim
    outer, inner = numel(x.shape[:axis]), numel(x.shape[axis + 1 :])
    y = x.reshape(outer, inner, x.shape[axis]).sum(axis=-1)
    return _cast(x, y.reshape(rd._reduced_shape(x.shape, p)))


REDUCE = [
    Mutant(
        "reduce-sum-axis-innermost",
        "reduce_sum",
        "wrong axis",
        "reduces with the innermost axis's stride whatever the axis",
        ("value",),
        {"spec": forward_is(_sum_axis_innermost)},
    ),
    Mutant(
        "reduce-mean-missing-1/n",
        "reduce_mean",
        "missing 1/n",
        "the mean returns the sum",
        ("value",),
        {"spec": forward_is(lambda f, a, p: _cast(a["x"], rd._sum(a["x"], p)))},
    ),
    Mutant(
        "reduce-mean-vjp-missing-1/n",
        "reduce_mean",
        "missing 1/n",
        "the mean's gradient broadcasts g without 1/n",
        ("vjp",),
        {"spec": vjp_is(lambda f, a, p, y, g: {"x": rd._broadcast_back(g, a["x"].shape, p)})},
    ),
]

# -- view ---------------------------------------------------------------------------------------


def _permute_inverse(f, a, p):
    x = a["x"]
    out_shape = tuple(x.shape[i] for i in p["perm"])
    return np.ascontiguousarray(np.transpose(x, vw._inverse(p["perm"]))).reshape(out_shape)


def _concat_flat(f, a, p):
    """Offsets computed as if joining along axis 0: the parts' buffers laid end to end."""
    xs = a["xs"]
    shape = np.concatenate(xs, axis=p["axis"]).shape
    return np.concatenate([x.reshape(-1) for x in xs]).reshape(shape)


def _slice_off_by_one(f, a, p):
    x = a["x"]
    axis, start, length = p["axis"] % x.ndim, p["start"], p["length"]
    if length == 0 or x.size == 0:
        return f(a, p)
    index = np.clip(np.arange(start + 1, start + 1 + length), 0, x.shape[axis] - 1)
    return np.take(x, index, axis=axis)


def _broadcast_vjp_first_copy(f, a, p, y, g):
    x = a["x"]
    if g.size == 0:
        return f(a, p, y, g)
    axes = vw._summed_axes(x.shape, p["shape"])
    first = tuple(slice(0, 1) if i in axes else slice(None) for i in range(g.ndim))
    return {"x": np.ascontiguousarray(g[first]).reshape(x.shape)}


def _slice_unguarded(spec):
    """No range check: start + length past the end is clamped, not refused."""

    def shape(shapes, p, f=spec.shape):
        x = tuple(shapes["x"])
        if x and p["start"] >= 0 and p["length"] >= 0:
            axis = p["axis"] % len(x)
            p = {**p, "length": max(0, min(p["length"], x[axis] - p["start"]))}
        return f(shapes, p)

    return dataclasses.replace(spec, shape=shape)


VIEW = [
    Mutant(
        "reshape-column-major",
        "reshape",
        "layout",
        "reshape reads the buffer column-major",
        ("value",),
        {"spec": forward_is(lambda f, a, p: a["x"].reshape(p["shape"], order="F"))},
    ),
    Mutant(
        "permute-inverse-perm",
        "permute",
        "wrong axis",
        "the output index uses the inverse permutation",
        ("value",),
        {"spec": forward_is(_permute_inverse)},
    ),
    Mutant(
        "concat-flat-offsets",
        "concat",
        "wrong axis",
        "parts laid end to end as if joined along axis 0",
        ("value",),
        {"spec": forward_is(_concat_flat)},
    ),
    Mutant(
        "slice-off-by-one",
        "slice",
        "off by one",
        "reads from start + 1",
        ("value",),
        {"spec": forward_is(_slice_off_by_one)},
    ),
    Mutant(
        "slice-no-range-check",
        "slice",
        "missing guard",
        "start + length past the end is clamped instead of refused",
        ("shape.guard",),
        {"spec": _slice_unguarded, "write": _lenient_write},
    ),
    Mutant(
        "broadcast-vjp-first-copy",
        "broadcast",
        "wrong VJP",
        "the gradient takes the first copy instead of summing every copy",
        ("vjp",),
        {"spec": vjp_is(_broadcast_vjp_first_copy)},
    ),
]

# -- index --------------------------------------------------------------------------------------


def _scatter_drops_repeats(f, a, p):
    base = a["base"]
    out = base.copy()
    axis = p["axis"] % base.ndim
    np.moveaxis(out, axis, 0)[a["index"]] += np.moveaxis(a["src"], axis, 0)  # buffered: the last repeat wins
    return out


def _gather_vjp_drops_repeats(f, a, p, y, g):
    x = a["x"]
    dx = np.zeros(x.shape, g.dtype)
    np.moveaxis(dx, p["axis"] % x.ndim, 0)[a["index"]] = np.moveaxis(g, p["axis"] % x.ndim, 0)
    return {"x": dx}


def _gather_clipping(spec):
    """Indices clamped into range instead of refused."""
    return dataclasses.replace(
        spec, check_values=None, forward=lambda a, p: np.take(a["x"], a["index"], axis=p["axis"], mode="clip")
    )


INDEX = [
    Mutant(
        "scatter-add-drops-repeats",
        "scatter_add",
        "lost update",
        "a non-atomic add: of repeated indices only the last lands",
        ("value",),
        {"spec": forward_is(_scatter_drops_repeats)},
    ),
    Mutant(
        "gather-vjp-drops-repeats",
        "gather",
        "lost update",
        "the gradient's scatter is a store, not an add: repeats are lost",
        ("vjp",),
        {"spec": vjp_is(_gather_vjp_drops_repeats)},
    ),
    Mutant(
        "gather-clips-indices",
        "gather",
        "missing guard",
        "out-of-range indices are clamped instead of refused",
        ("shape.guard",),
        {"spec": _gather_clipping, "write": _lenient_write},
    ),
    Mutant(
        "gather-writes-before-start",
        "gather",
        "write out of bounds",
        "one element written before the output",
        ("bounds",),
        {"write": _write_before_start},
    ),
]

# -- random -------------------------------------------------------------------------------------


def _stream_shifted(draw):
    def forward(f, a, p):
        shape = tuple(p["shape"])
        return draw(rn.uniform_values(p["seed"], numel(shape) + 1, p[DTYPE])[1:], p).reshape(shape)

    return forward


RANDOM = [
    Mutant(
        "rand-uniform-stream-off-by-one",
        "rand_uniform",
        "RNG stream",
        "element i draws counter i + 1",
        ("rng", "value"),
        {"spec": forward_is(_stream_shifted(lambda u, p: u))},
    ),
    Mutant(
        "rand-uniform-ignores-seed",
        "rand_uniform",
        "RNG stream",
        "the seed is never passed to the generator",
        ("rng", "value"),
        {"spec": forward_is(lambda f, a, p: f(a, {**p, "seed": 0}))},
    ),
    Mutant(
        "bernoulli-stream-off-by-one",
        "bernoulli_mask",
        "RNG stream",
        "element i draws counter i + 1",
        ("rng", "value"),
        {"spec": forward_is(_stream_shifted(lambda u, p: (u < p["p"]).astype(u.dtype)))},
    ),
    Mutant(
        "bernoulli-rescaled",
        "bernoulli_mask",
        "wrong formula",
        "dropout-style mask / p (the op promises no rescaling)",
        ("value", "rng"),
        {"spec": forward_is(lambda f, a, p: f(a, p) / p["p"])},
    ),
]

# -- norm ---------------------------------------------------------------------------------------


def _layer_norm_eps_outside(f, a, p):
    x = a["x"]
    axes = (x.ndim - 1,)
    d = x - nm._mean(x, axes)
    s = np.sqrt(nm._mean(d * d, axes)) + p["eps"]
    return d / s * a["gamma"] + a["beta"]


def _batch_norm_unbiased(f, a, p):
    x = a["x"]
    axes = nm.BATCH.stat_axes(x.ndim)
    n = numel(tuple(x.shape[i] for i in axes))
    d = x - nm._mean(x, axes)
    var = np.sum(d * d, axis=axes, keepdims=True) / x.dtype.type(n - 1)
    xhat = d / np.sqrt(var + p["eps"])
    return xhat * nm.BATCH.along(a["gamma"], x.ndim) + nm.BATCH.along(a["beta"], x.ndim)


def _layer_norm_vjp_no_projection(f, a, p, y, g):
    x = a["x"]
    axes = (x.ndim - 1,)
    grads = f(a, p, y, g)
    _, s = nm._normalise(x, nm.LAYER, p["eps"])
    ghat = g * a["gamma"]
    grads["x"] = (ghat - nm._mean(ghat, axes)) / s  # the x-hat * mean(g-hat * x-hat) term dropped
    return grads


def _centre_in_place(f, a, p):
    x = a["x"]
    x -= nm._mean(x, (x.ndim - 1,))  # x centred in place, then normalised
    return f(a, p)


def _skip_grad(skipped):
    def write_grad(name, target, value):
        if name != skipped:
            target.view[...] = value

    return write_grad


NORM = [
    Mutant(
        "layer-norm-eps-hardcoded",
        "layer_norm",
        "wrong eps",
        "eps fixed at 1e-5, the parameter ignored",
        ("value",),
        {"spec": forward_is(lambda f, a, p: f(a, {**p, "eps": np.float32(1e-5)}))},
    ),
    Mutant(
        "layer-norm-eps-outside-sqrt",
        "layer_norm",
        "wrong eps",
        "sqrt(var) + eps instead of sqrt(var + eps)",
        ("value",),
        {"spec": forward_is(_layer_norm_eps_outside)},
    ),
    Mutant(
        "layer-norm-vjp-no-projection",
        "layer_norm",
        "wrong VJP",
        "dx drops the x-hat * mean(g-hat * x-hat) term",
        ("vjp",),
        {"spec": vjp_is(_layer_norm_vjp_no_projection)},
    ),
    Mutant(
        "layer-norm-centres-in-place",
        "layer_norm",
        "input overwritten",
        "x -= mean(x) in place",
        ("inputs.intact",),
        {"spec": forward_is(_centre_in_place)},
    ),
    Mutant(
        "batch-norm-unbiased-variance",
        "batch_norm",
        "wrong formula",
        "variance divided by n - 1 (unbiased) instead of n",
        ("value",),
        {"spec": forward_is(_batch_norm_unbiased)},
    ),
    Mutant(
        "batch-norm-dbeta-unwritten",
        "batch_norm",
        "unwritten output",
        "the beta gradient is never written",
        ("bounds", "vjp"),
        {"write_grad": _skip_grad("beta")},
    ),
]

# -- conv_pool ----------------------------------------------------------------------------------


def _no_bias(f, a, p):
    return f({**a, "b": np.zeros_like(a["b"])}, p)


def _flipped_kernel(f, a, p):
    w = a["w"]
    flip = (slice(None), slice(None)) + (slice(None, None, -1),) * (w.ndim - 2)
    return f({**a, "w": np.ascontiguousarray(w[flip])}, p)


def _max_pool_short_window(f, a, p):
    """The window loop stops one cell early on the innermost axis (< k - 1 instead of < k)."""
    x = a["x"]
    cells, (kernel, _, _) = cp._window_cells(x, p, np.nan)
    cells = np.array(cells).reshape(cells.shape[:-1] + tuple(kernel))
    cells[..., -1] = np.nan
    return np.fmax.reduce(cells.reshape(cells.shape[: x.ndim] + (numel(kernel),)), axis=-1)


def _max_pool_split_ties(f, a, p, y, g):
    x = a["x"]
    cells, geometry = cp._window_cells(x, p, np.nan)
    hits = cells == y[..., None]
    count = np.maximum(np.sum(hits, axis=-1, keepdims=True), 1).astype(g.dtype)
    return {"x": cp._unfold_back(np.where(hits, g[..., None] / count, 0.0).astype(g.dtype), x.shape, geometry)}


def _max_pool_nan_wins(f, a, p):
    cells, _ = cp._window_cells(a["x"], p, -np.inf)
    return np.max(cells, axis=-1)


def _avg_pool_exclude_pad(f, a, p):
    x = a["x"]
    cells, _ = cp._window_cells(x, p, 0.0)
    count, _ = cp._window_cells(np.ones_like(x), p, 0.0)
    return np.sum(cells, axis=-1) / np.maximum(np.sum(count, axis=-1), 1.0)


def _smooth_pivot_always_max(f, a, p):
    beta = p["beta"]
    cells, _ = cp._window_cells(a["x"], p, 0.0)
    pivot = np.max(cells, axis=-1)
    e = np.exp(beta * (cells - pivot[..., None]))
    return pivot + np.log(np.sum(e, axis=-1)) / beta


def _launch_first(backend):
    backend.launch_count += 1


CONV_POOL = [
    Mutant(
        "conv-drops-bias", "conv", "dropped bias", "the bias is never added", ("value",), {"spec": forward_is(_no_bias)}
    ),
    Mutant(
        "conv-flipped-kernel",
        "conv",
        "transposed weights",
        "true convolution (kernel flipped) instead of cross-correlation",
        ("value",),
        {"spec": forward_is(_flipped_kernel)},
    ),
    Mutant(
        "conv-launches-before-validating",
        "conv",
        "missing guard",
        "the kernel launches before the shapes are checked",
        ("shape.guard",),
        {"before": _launch_first},
    ),
    Mutant(
        "conv-transpose-drops-bias",
        "conv_transpose",
        "dropped bias",
        "the bias is never added",
        ("value",),
        {"spec": forward_is(_no_bias)},
    ),
    Mutant(
        "max-pool-window-off-by-one",
        "max_pool",
        "off by one",
        "the window loop skips its last cell on the innermost axis",
        ("value",),
        {"spec": forward_is(_max_pool_short_window)},
    ),
    Mutant(
        "max-pool-grad-split-ties",
        "max_pool",
        "tie rule",
        "the gradient is split across tied maxima",
        ("selection.ties",),
        {"spec": vjp_is(_max_pool_split_ties)},
    ),
    Mutant(
        "max-pool-nan-wins",
        "max_pool",
        "NaN policy",
        "max instead of fmax: a NaN cell wins its window",
        ("value.special",),
        {"spec": forward_is(_max_pool_nan_wins)},
    ),
    Mutant(
        "avg-pool-exclude-pad",
        "avg_pool",
        "off by one",
        "divides by the real cells (count_include_pad=False)",
        ("value",),
        {"spec": forward_is(_avg_pool_exclude_pad)},
    ),
    Mutant(
        "smooth-max-pool-pivot-max",
        "smooth_max_pool",
        "NaN policy",
        "pivot is the max even for beta < 0: exp overflows",
        ("value",),
        {"spec": forward_is(_smooth_pivot_always_max)},
    ),
]

# -- linalg -------------------------------------------------------------------------------------


def _linear_w_transposed(f, a, p):
    """w (out, in) read as if stored (in, out)."""
    out, width = a["w"].shape
    return np.matmul(a["x"], a["w"].reshape(width, out)) + a["b"]


def _matmul_b_transposed(f, a, p):
    """b (…, k, n) read as if stored (…, n, k)."""
    b = a["b"]
    return np.matmul(a["a"], np.swapaxes(b.reshape(b.shape[:-2] + (b.shape[-1], b.shape[-2])), -1, -2))


def _zero_g_after(f, a, p, y, g):
    grads = f(a, p, y, g)
    g[...] = 0  # the cotangent buffer reused as scratch
    return grads


def _mse_sum(f, a, p):
    d = a["pred"] - a["target"]
    return np.asarray(np.sum(d * d))


def _halved(f, a, p, y, g):
    return {k: v * np.float32(0.5) for k, v in f(a, p, y, g).items()}


def _wrong_error_type(spec):
    def shape(shapes, p, f=spec.shape):
        try:
            return f(shapes, p)
        except InputError as exc:
            raise ValueError(str(exc)) from None

    return dataclasses.replace(spec, shape=shape)


LINALG = [
    Mutant(
        "linear-drops-bias",
        "linear",
        "dropped bias",
        "the bias is never added",
        ("value",),
        {"spec": forward_is(lambda f, a, p: np.matmul(a["x"], a["w"].T))},
    ),
    Mutant(
        "linear-weights-transposed",
        "linear",
        "transposed weights",
        "w read as (in, out) row-major",
        ("value",),
        {"spec": forward_is(_linear_w_transposed)},
    ),
    Mutant(
        "matmul-b-transposed",
        "matmul",
        "transposed weights",
        "b read as (n, k) row-major",
        ("value",),
        {"spec": forward_is(_matmul_b_transposed)},
    ),
    Mutant(
        "matmul-backward-clobbers-g",
        "matmul",
        "input overwritten",
        "the backward zeroes the cotangent buffer",
        ("inputs.intact",),
        {"spec": vjp_is(_zero_g_after)},
    ),
    Mutant(
        "matmul-wrong-error-type",
        "matmul",
        "missing guard",
        "shape errors raised as a bare ValueError",
        ("shape.guard",),
        {"spec": _wrong_error_type},
    ),
    Mutant(
        "mse-loss-missing-1/n",
        "mse_loss",
        "missing 1/n",
        "the loss returns the sum of squares",
        ("value",),
        {"spec": forward_is(_mse_sum)},
    ),
    Mutant(
        "mse-loss-vjp-missing-2",
        "mse_loss",
        "wrong VJP factor",
        "d(pred) = d*g/n instead of 2*d*g/n",
        ("vjp",),
        {"spec": vjp_is(_halved)},
    ),
]

# -- spectral -----------------------------------------------------------------------------------


def _fno_nyquist_double(f, a, p):
    """irfft weight 2/G at the Nyquist bin too (only DC kept at 1/G)."""
    x, w_re, w_im = a["x"], a["w_re"], a["w_im"]
    modes, grid = w_re.shape[0], x.shape[1]
    (tw_re, tw_im), (x_re, x_im) = sp._spectrum(x, modes, False)
    z_re = sp._mix(x_re, w_re) - sp._mix(x_im, w_im)
    z_im = sp._mix(x_re, w_im) + sp._mix(x_im, w_re)
    scale = (np.where(np.arange(modes) == 0, 1.0, 2.0) / grid).astype(x.dtype)[:, None]
    return tw_re.T @ (scale * z_re) + tw_im.T @ (scale * z_im)


def _negate(name):
    def vjp(f, a, p, y, g):
        grads = f(a, p, y, g)
        grads[name] = -grads[name]
        return grads

    return vjp


SPECTRAL = [
    Mutant(
        "fft-fno-nyquist-weight-2",
        "fft_fno",
        "wrong formula",
        "the Nyquist bin weighted 2/G like the others",
        ("value",),
        {"spec": forward_is(_fno_nyquist_double)},
    ),
    Mutant(
        "fft-fno-conjugate-weights",
        "fft_fno",
        "wrong sign",
        "multiplies by conj(w): the sign of w_im flipped",
        ("value",),
        {"spec": forward_is(lambda f, a, p: f({**a, "w_im": -a["w_im"]}, p))},
    ),
    Mutant(
        "fft-fno-vjp-w-im-sign",
        "fft_fno",
        "VJP sign",
        "the w_im gradient has the wrong sign",
        ("vjp",),
        {"spec": vjp_is(_negate("w_im"))},
    ),
]

# -- scan ---------------------------------------------------------------------------------------


def _scan_previous_state(f, a, p):
    """Stores h before the update: y[t] = h[t-1]."""
    return sc._previous(a["h0"], f(a, p))


def _scan_dh0_without_a0(f, a, p, y, g):
    grads = f(a, p, y, g)
    total, _ = sc._reverse(a["a"], g)
    grads["h0"] = total[:, 0].copy() if g.shape[1] else np.zeros_like(a["h0"])
    return grads


SCAN = [
    Mutant(
        "selective-scan-off-by-one-step",
        "selective_scan",
        "off by one",
        "y[t] = h[t-1]: the state stored before the update",
        ("value",),
        {"spec": forward_is(_scan_previous_state)},
    ),
    Mutant(
        "selective-scan-dh0-missing-a0",
        "selective_scan",
        "wrong VJP",
        "dh0 = total[0] without the factor A[0]",
        ("vjp",),
        {"spec": vjp_is(_scan_dh0_without_a0)},
    ),
]


# -- subtle mutants: small numerical errors, a legitimate-looking formula --------------------------


def _exp_via_exp2(f, a, p):
    """expf as exp2f(x * log2(e)) with the product rounded to float32: relative error ~u*|x|."""
    x = a["x"]
    return np.exp2(x * np.float32(1.4426950408889634))


def _gelu_truncated_constant(f, a, p):
    x = a["x"]
    return 0.5 * x * (1.0 + np.tanh(np.float32(0.7978) * (x + np.float32(pw.GELU_A) * x * x * x)))


def _sigmoid_via_tanh(f, a, p):
    """0.5 + 0.5*tanh(x/2): exact algebra, but cancels to 0 far below zero (no relative accuracy)."""
    return 0.5 + 0.5 * np.tanh(0.5 * a["x"])


def _log_softmax_as_log_of_softmax(f, a, p):
    x = a["x"]
    if x.size == 0:
        return f(a, p)
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return np.log(e / np.sum(e, axis=-1, keepdims=True))  # exp underflow: log(0) = -inf


def _additive_mask(f, a, p):
    """Blocked logits pushed down by 1e4 instead of excluded: a fully blocked row becomes uniform."""
    x = a["x"] + np.where(a["mask"] != 0, np.float32(0.0), np.float32(-1e4))
    if x.size == 0:
        return f(a, p)
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def _layer_norm_one_pass(f, a, p):
    """var = E[x^2] - E[x]^2: catastrophic cancellation on offset rows."""
    x = a["x"]
    axes = (x.ndim - 1,)
    mean = nm._mean(x, axes)
    var = np.maximum(nm._mean(x * x, axes) - mean * mean, 0.0)
    return (x - mean) / np.sqrt(var + p["eps"]) * a["gamma"] + a["beta"]


def _batch_norm_per_sample(f, a, p):
    """Statistics over the spatial axes only (instance norm), not over N and spatial."""
    x = a["x"]
    if x.ndim == 2 or x.size == 0:
        return f(a, p)
    axes = tuple(range(2, x.ndim))
    d = x - nm._mean(x, axes)
    xhat = d / np.sqrt(nm._mean(d * d, axes) + p["eps"])
    return xhat * nm.BATCH.along(a["gamma"], x.ndim) + nm.BATCH.along(a["beta"], x.ndim)


def _tf32(v):
    """Round to TF32 (10 explicit mantissa bits), as tensor cores read float32 operands."""
    bits = np.ascontiguousarray(v, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
    return np.where(np.isfinite(v), rounded.view(np.float32), v)


def _matmul_tf32(f, a, p):
    return np.matmul(_tf32(a["a"]), _tf32(a["b"]))


def _scan_ignores_h0(f, a, p):
    return f({**a, "h0": np.zeros_like(a["h0"])}, p)


def _softmax_vjp_no_dot(f, a, p, y, g):
    return {"x": y * g}


SUBTLE = [
    Mutant(
        "exp-via-exp2",
        "exp",
        "precision",
        "exp2f(x*log2e) with the product rounded: ~u*|x| relative error",
        ("value",),
        {"spec": forward_is(_exp_via_exp2)},
    ),
    Mutant(
        "gelu-truncated-constant",
        "gelu",
        "precision",
        "sqrt(2/pi) written as 0.7978",
        ("value",),
        {"spec": forward_is(_gelu_truncated_constant)},
    ),
    Mutant(
        "sigmoid-via-tanh",
        "sigmoid",
        "precision",
        "0.5 + 0.5*tanh(x/2): 0 instead of e^x far below zero",
        ("value",),
        {"spec": forward_is(_sigmoid_via_tanh)},
    ),
    Mutant(
        "log-softmax-as-log-of-softmax",
        "log_softmax",
        "precision",
        "log(softmax(x)): -inf where exp underflows",
        ("value",),
        {"spec": forward_is(_log_softmax_as_log_of_softmax)},
    ),
    Mutant(
        "softmax-vjp-no-dot",
        "softmax",
        "wrong VJP",
        "dx = y*g, the y*sum(g*y) term dropped",
        ("vjp",),
        {"spec": vjp_is(_softmax_vjp_no_dot)},
    ),
    Mutant(
        "hard-masked-additive-mask",
        "hard_masked_softmax",
        "NaN policy",
        "mask as -1e4 added to the logits: a fully blocked row comes out uniform, not zeros",
        ("value",),
        {"spec": forward_is(_additive_mask)},
    ),
    Mutant(
        "layer-norm-one-pass-variance",
        "layer_norm",
        "precision",
        "var = E[x^2] - E[x]^2 (cancels on offset rows)",
        ("value",),
        {"spec": forward_is(_layer_norm_one_pass)},
    ),
    Mutant(
        "batch-norm-per-sample-stats",
        "batch_norm",
        "wrong axis",
        "statistics over spatial only (instance norm)",
        ("value",),
        {"spec": forward_is(_batch_norm_per_sample)},
    ),
    Mutant(
        "matmul-tf32",
        "matmul",
        "precision",
        "operands rounded to TF32 (tensor-core default)",
        ("value",),
        {"spec": forward_is(_matmul_tf32)},
    ),
    Mutant(
        "selective-scan-ignores-h0",
        "selective_scan",
        "dropped bias",
        "the initial state is taken as zero",
        ("value",),
        {"spec": forward_is(_scan_ignores_h0)},
    ),
]

# -- subtle ones: bugs that need a dedicated edge (a p equal to a draw, k > 4096), and a known gap ---


def _bernoulli_le(f, a, p):
    shape = tuple(p["shape"])
    u = rn.uniform_values(p["seed"], numel(shape), p[DTYPE])
    return (u <= p["p"]).astype(u.dtype).reshape(shape)


def _matmul_k_tile_limit(f, a, p):
    """A shared-memory tile loop that stops after 4096 terms of k."""
    k = a["a"].shape[-1]
    if k <= 4096:
        return f(a, p)
    return np.matmul(a["a"][..., :4096], a["b"][..., :4096, :])


def _jitter_large(backend, y):
    """Run-to-run noise only where the input is large enough for a multi-block atomic reduction."""
    return _jitter(backend, y) if backend.last_input_size >= 4096 else y


class _SizeAware(MutantBackend):
    def forward(self, spec, inputs, params, out):
        self.last_input_size = int(sum(np.size(v) for v in inputs.values() if not isinstance(v, tuple)))
        return super().forward(spec, inputs, params, out)


GAPS = [
    Mutant(
        "bernoulli-u-le-p",
        "bernoulli_mask",
        "RNG stream",
        "keeps u <= p instead of u < p",
        ("value", "rng"),
        {"spec": forward_is(_bernoulli_le)},
    ),
    Mutant(
        "matmul-k-tile-limit",
        "matmul",
        "off by one",
        "the k loop stops after 4096 terms",
        ("value",),
        {"spec": forward_is(_matmul_k_tile_limit)},
    ),
    Mutant(
        "reduce-sum-multiblock-nondeterministic",
        "reduce_sum",
        "nondeterminism",
        "one ulp of run-to-run noise once the input spans several blocks (>= 4096 elements: atomics across blocks)",
        ("determinism",),
        {"post": _jitter_large},
        gap="in quick mode no reduce_sum case reaches 4096 elements; a full run (medium and large samples) "
        "catches it, since determinism reruns the largest case",
    ),
]

MUTANTS: tuple[Mutant, ...] = tuple(
    itertools.chain(
        POINTWISE, SOFTMAX, REDUCE, VIEW, INDEX, RANDOM, NORM, CONV_POOL, LINALG, SPECTRAL, SCAN, SUBTLE, GAPS
    )
)


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


# -- running ------------------------------------------------------------------------------------

BAD = ("FAILED", "ERROR")


@dataclass(frozen=True)
class Outcome:
    """What verify made of one mutant. `killers`: the checks that FAILED or ERRORed on the mutant
    and did not on the unmutated provider (an engine false alarm kills nothing)."""

    mutant: Mutant
    statuses: dict
    reasons: dict
    killers: tuple[str, ...]
    seconds: float

    @property
    def killed(self) -> bool:
        return bool(self.killers)

    @property
    def right_reason(self) -> bool:
        """An expected check FAILED (not merely ERRORed: a crash is no proof the check works)."""
        return any(self.statuses.get(c) == "FAILED" for c in self.mutant.expect if c in self.killers)


def verify_statuses(op: str, backend, seed: int = 0):
    from capsule_core.catalog import registry
    from capsule_core.verify.engine import verify_capsule

    report = verify_capsule(registry.lookup(op), backend, quick=True, seed=seed, checks=DYNAMIC_CHECKS)
    statuses = {r.check: r.status.value for r in report.results}
    return statuses, {r.check: r.reason for r in report.results}, report.seconds


_BASELINE: dict = {}


def baseline(op: str) -> dict:
    """Statuses of the unmutated numpy provider on `op` (cached)."""
    if op not in _BASELINE:
        _BASELINE[op] = verify_statuses(op, NumpyBackend())[0]
    return _BASELINE[op]


def run_mutant(mutant: Mutant, seed: int = 0) -> Outcome:
    statuses, reasons, seconds = verify_statuses(mutant.op, mutant.backend(), seed)
    base = baseline(mutant.op)
    killers = tuple(c for c, s in statuses.items() if s in BAD and base.get(c) not in BAD)
    return Outcome(mutant, statuses, reasons, killers, seconds)


def table(outcomes) -> str:
    rows = []
    for o in outcomes:
        if not o.mutant.expect:
            verdict = (
                "passed (legitimate)"
                if not any(s in BAD + ("MISTRUSTED",) for s in o.statuses.values())
                else "FALSE ALARM"
            )
        else:
            verdict = (
                ("killed" if o.right_reason else "killed (wrong reason)")
                if o.killed
                else ("survived (known gap)" if o.mutant.gap else "SURVIVED")
            )
        rows.append(
            f"{o.mutant.id:40s} {o.mutant.family:10s} {o.mutant.op:20s} {verdict:22s} "
            f"by {', '.join(o.killers) or '-':40s} expected {', '.join(o.mutant.expect) or '-'}"
        )
    return "\n".join(rows)


# -- kernel mutants: bugs planted in the CUDA sources, run by the emu backend ---------------------


class StaleMutant(AssertionError):
    """A kernel mutant's source text is no longer in its file exactly once: the kernel changed
    under it, so it would test nothing (or something else). Update the mutant."""


@dataclass(frozen=True)
class KernelMutant:
    """One bug planted in the CUDA sources: `original`, which must occur exactly once in
    cuda/`file`, becomes `replacement` in a temporary copy of cuda/ that the emu backend builds
    (the repository's cuda/ is never touched); `verify op --backend emu` must FAIL one of
    `expect`. `gap`, when set, says why the emulator cannot tell and what would."""

    id: str
    file: str
    original: str
    replacement: str
    op: str
    kind: str
    description: str
    expect: tuple[str, ...]
    gap: str = ""

    @property
    def family(self) -> str:
        return get_spec(self.op).family

    def planted(self, text: str) -> str:
        count = text.count(self.original)
        if count != 1:
            raise StaleMutant(
                f"kernel mutant {self.id}: its source text occurs {count} times in cuda/{self.file}, "
                f"not once; the kernel changed, update the mutant:\n{self.original}"
            )
        return text.replace(self.original, self.replacement)


KERNEL_MUTANTS: tuple[KernelMutant, ...] = (
    # pointwise
    KernelMutant(
        "pw-vector-tail-starts-late",
        "pointwise.cu",
        "f(x.w)));\n        }\n        tail = vectors * 4;",
        "f(x.w)));\n        }\n        tail = vectors * 4 + 4;",
        "relu",
        "vector tail",
        "map_1_1's scalar tail starts one float4 late: n % 4 elements never written",
        ("bounds",),
    ),
    KernelMutant(
        "pw-vector-reads-a-twice",
        "pointwise.cu",
        "const float4 x = load4(a, v), y = load4(b, v);",
        "const float4 x = load4(a, v), y = load4(a, v);",
        "add",
        "wrong operand",
        "map_2_1's float4 path loads a where it needs b: add gives 2x",
        ("value",),
    ),
    KernelMutant(
        "pw-mul-bwd-wrong-operand",
        "pointwise.cu",
        "capsule_mul_df(a, b, w, da, db)",
        "capsule_mul_df(a, a, w, da, db)",
        "mul",
        "wrong operand",
        "mul's backward is handed x where it needs y: dx = g*x",
        ("vjp",),
    ),
    KernelMutant(
        "pw-sub-bwd-swapped-outputs",
        "pointwise.cu",
        "capsule_sub_df(a, b, w, da, db)",
        "capsule_sub_df(a, b, w, db, da)",
        "sub",
        "VJP sign",
        "sub's backward writes dy into dx and dx into dy: dx = -g",
        ("vjp",),
    ),
    # softmax
    KernelMutant(
        "softmax-dropped-max-shuffle",
        "softmax.cu",
        "for (int offset = G / 2; offset > 0; offset >>= 1) v = capsule_nanmax(",
        "for (int offset = G / 2; offset > 1; offset >>= 1) v = capsule_nanmax(",
        "softmax",
        "dropped shuffle",
        "group_max stops one butterfly step early: lane pairs keep different maxima",
        ("value",),
    ),
    KernelMutant(
        "softmax-block-tail-starts-late",
        "softmax.cu",
        "for (int64_t i = split.head + 4 * split.body4 + threadIdx.x; i < len; i += step) one(i);",
        "for (int64_t i = split.head + 4 * split.body4 + threadIdx.x + 1; i < len; i += step) one(i);",
        "softmax",
        "vector tail",
        "the block path's scalar tail after the float4 body starts one element late",
        ("bounds", "value"),
    ),
    KernelMutant(
        "log-softmax-bwd-softmax-rule",
        "softmax.cu",
        "backward<CAPSULE_LOG_SOFTMAX>(y, g, dx, rows, cols);",
        "backward<CAPSULE_SOFTMAX>(y, g, dx, rows, cols);",
        "log_softmax",
        "wrong VJP",
        "log_softmax's backward runs softmax's rule (y is a log-probability)",
        ("vjp",),
    ),
    KernelMutant(
        "block-reduce-dropped-first-barrier",
        "common.cuh",
        "v = warp_reduce(v);\n    __syncthreads();",
        "v = warp_reduce(v);",
        "softmax",
        "dropped barrier",
        "block_sum's warp leaders publish into scratch while other warps may still read block_max's values from it",
        ("value",),
        gap="a write-after-read race the emulator's schedule hides: released by block_max's barrier, every "
        "thread reads scratch before its first shuffle, and no warp gets through block_sum's shuffles "
        "(several rounds of the round-robin) before all have; sanitize.racecheck is the check for it",
    ),
    # reduce
    KernelMutant(
        "reduce-tile-dropped-barrier",
        "reduce.cu",
        "if (ty < depth) partial[threadIdx.x] = acc;\n        __syncthreads();",
        "if (ty < depth) partial[threadIdx.x] = acc;",
        "reduce_sum",
        "dropped barrier",
        "the tile path's shared-memory tree starts before every partial is stored",
        ("value",),
    ),
    KernelMutant(
        "reduce-wrong-identity",
        "reduce.cu",
        "acc[r] = 0.0f;",
        "acc[r] = 1.0f;",
        "reduce_sum",
        "wrong identity",
        "short segments start their sums from 1 instead of 0",
        ("value",),
    ),
    KernelMutant(
        "reduce-column-swapped-strides",
        "reduce.cu",
        "for (int64_t s = 0; s < seg.length; ++s) acc += p[s * inner];",
        "for (int64_t s = 0; s < seg.length; ++s) acc += p[s];",
        "reduce_sum",
        "swapped strides",
        "the column path steps along the axis with stride 1 instead of inner",
        ("value",),
    ),
    KernelMutant(
        "reduce-mean-bwd-wrong-count",
        "reduce.cu",
        "broadcast_back<true>(g, dx, outer, size, inner, capsule_inverse_count(size));",
        "broadcast_back<true>(g, dx, outer, size, inner, capsule_inverse_count(inner));",
        "reduce_mean",
        "missing 1/n",
        "the mean's backward divides by the inner extent, not the reduced one",
        ("vjp",),
    ),
    KernelMutant(
        "reduce-row-block-tail-starts-late",
        "reduce.cu",
        "4 * split.body4 + threadIdx.x; i < seg.length; i += step) acc += p[i];",
        "4 * split.body4 + threadIdx.x + 1; i < seg.length; i += step) acc += p[i];",
        "reduce_sum",
        "vector tail",
        "a block's scalar tail after the float4 body starts one element late",
        ("value",),
        gap="quick samples reach the block-per-segment path only through edges (4097 and 3 x 100001 same-sign "
        "terms) judged by the order-free worst-case bound n*u*sum|x|, which exceeds the one lost term "
        "(about sum|x|/n) once n >= 2^12; the full run kills it (value, large-0 x(1024, 4099))",
    ),
    # view
    KernelMutant(
        "permute-tile-dropped-barrier",
        "view.cu",
        "tile[slot] = x[x_base + rel];\n        __syncthreads();",
        "tile[slot] = x[x_base + rel];",
        "permute",
        "dropped barrier",
        "the transposing tile is read back before every thread has loaded it",
        ("value",),
    ),
    KernelMutant(
        "broadcast-columns-dropped-barrier",
        "view.cu",
        "                                                : 0.0f;\n        __syncthreads();",
        "                                                : 0.0f;",
        "broadcast",
        "dropped barrier",
        "warp 0 adds the warps' partial sums before they are stored",
        ("vjp",),
    ),
    KernelMutant(
        "broadcast-rows-dropped-shuffle",
        "view.cu",
        "if (group == 32) acc = capsule::group_sum_rn<32>(acc);",
        "if (group == 32) acc = capsule::group_sum_rn<16>(acc);",
        "broadcast",
        "dropped shuffle",
        "the warp sum over copies skips its 16-lane step: half the copies lost",
        ("vjp",),
    ),
    KernelMutant(
        "slice-bwd-off-by-one",
        "view.cu",
        "dx[e] = s < 0 ? 0u : g[s];",
        "dx[e] = s <= 0 ? 0u : g[s];",
        "slice",
        "off by one",
        "slice's backward zeroes the first element taken from g as well",
        ("vjp",),
    ),
    KernelMutant(
        "permute-tile-dropped-trailing-barrier",
        "view.cu",
        "y[y_base + rel] = tile[slot];\n        __syncthreads();",
        "y[y_base + rel] = tile[slot];",
        "permute",
        "dropped barrier",
        "a block loads its next tile before every thread has stored the last one",
        ("value",),
        gap="unreachable under the plan: its grid has a block per tile (up to 4224 tiles, more than any "
        "sample has), so no block loads a second tile; a launch with fewer blocks than tiles, which the "
        "kernel allows, would show it",
    ),
    # index
    KernelMutant(
        "scatter-add-bwd-tail-starts-late",
        "index.cu",
        "for (int64_t e = head + thread_index(); e < n; e += thread_count()) dbw[e] = gw[e];",
        "for (int64_t e = head + 1 + thread_index(); e < n; e += thread_count()) dbw[e] = gw[e];",
        "scatter_add",
        "vector tail",
        "dbase's scalar tail after the float4 copy starts one element late",
        ("bounds", "vjp"),
    ),
    KernelMutant(
        "scatter-add-dropped-base",
        "index.cu",
        "out[e] = capsule_segment_sum(base ? base[e] : 0.0f,",
        "out[e] = capsule_segment_sum(0.0f,",
        "scatter_add",
        "dropped bias",
        "the thread-per-element path sums the sources onto 0 instead of base",
        ("value",),
    ),
    KernelMutant(
        "segment-warps-dropped-shuffle",
        "index.cu",
        "acc = capsule::group_sum_rn<32>(acc);",
        "acc = capsule::group_sum_rn<16>(acc);",
        "gather",
        "dropped shuffle",
        "the warp-per-element segment sum skips its 16-lane step",
        ("vjp",),
    ),
    # random
    KernelMutant(
        "random-stream-off-by-one",
        "random.cu",
        "capsule_keyed_uniform(key, static_cast<uint64_t>(e + k))",
        "capsule_keyed_uniform(key, static_cast<uint64_t>(e + k + 1))",
        "rand_uniform",
        "RNG stream",
        "element i draws counter i + 1 of the stream",
        ("rng",),
    ),
    KernelMutant(
        "random-grid-rounds-down",
        "random.cu",
        "CAPSULE_GRID_STRIDE(q, (n + 3) / 4)",
        "CAPSULE_GRID_STRIDE(q, n / 4)",
        "bernoulli_mask",
        "vector tail",
        "the float4 groups round down: the last n % 4 elements never written",
        ("bounds",),
    ),
    # norm
    KernelMutant(
        "layer-norm-bwd-partials-dropped-barrier",
        "norm.cu",
        "acc[ty * width + tx] = s;\n            __syncthreads();",
        "acc[ty * width + tx] = s;",
        "layer_norm",
        "dropped barrier",
        "row lane 0 adds the column partials before the other lanes store them",
        ("vjp",),
    ),
    KernelMutant(
        "layer-norm-unbiased-variance",
        "norm.cu",
        "rstd = capsule_norm_rstd(team.sum(make_float2(q, 0.0f)).x / static_cast<float>(cols), eps);",
        "rstd = capsule_norm_rstd(team.sum(make_float2(q, 0.0f)).x / static_cast<float>(cols - 1), eps);",
        "layer_norm",
        "off by one",
        "the register path's variance divides by cols - 1",
        ("value",),
    ),
    KernelMutant(
        "layer-norm-wide-sum-dropped-barrier",
        "norm.cu",
        "if (lane_id() == 0) slots[warp] = v;\n    __syncthreads();\n    float r = slots[0];",
        "if (lane_id() == 0) slots[warp] = v;\n    float r = slots[0];",
        "layer_norm",
        "dropped barrier",
        "the wide kernels' row sums read the warp totals before every warp has stored its own",
        ("value",),
    ),
    KernelMutant(
        "layer-norm-wide-part-drops-last-row",
        "norm.cu",
        "for (int row = 0; row < static_cast<int>(hi - lo); ++row, xr += cols, gr += cols, dr += cols) {",
        "for (int row = 0; row < static_cast<int>(hi - lo) - 1; ++row, xr += cols, gr += cols, dr += cols) {",
        "layer_norm",
        "off by one",
        "the wide backward skips the last row of each part: its dx never written, dgamma and dbeta miss it",
        ("bounds", "vjp"),
    ),
    KernelMutant(
        "block-merge-dropped-barrier",
        "norm.cu",
        "if (lane_id() == 0) slots[warp] = w;\n    __syncthreads();",
        "if (lane_id() == 0) slots[warp] = w;",
        "batch_norm",
        "dropped barrier",
        "the warps' Welford states are merged before every warp has stored its own",
        ("value",),
    ),
    KernelMutant(
        "batch-norm-bwd-x-swapped-sums",
        "norm.cu",
        "gm * __ldg(dbeta + c) * inv_count, gm * __ldg(dgamma + c) * inv_count",
        "gm * __ldg(dgamma + c) * inv_count, gm * __ldg(dbeta + c) * inv_count",
        "batch_norm",
        "wrong operand",
        "dx's two channel means are handed each other's sums",
        ("vjp",),
    ),
    KernelMutant(
        "batch-norm-chunk-tail-overreads",
        "norm.cu",
        "const int64_t valid = e < hi ? (hi - e < 4 ? hi - e : 4) : 0;",
        "const int64_t valid = e < hi ? 4 : 0;",
        "batch_norm",
        "vector tail",
        "the statistics' last group of a channel counts all 4 values, reading past the channel's end",
        ("value", "bounds"),
    ),
    KernelMutant(
        "block-merge-dropped-second-barrier",
        "norm.cu",
        "for (int i = 1; i < warps; ++i) r = merge(r, slots[i]);\n    __syncthreads();",
        "for (int i = 1; i < warps; ++i) r = merge(r, slots[i]);",
        "batch_norm",
        "dropped barrier",
        "the next part's merge overwrites slots while other threads may still read the last one's",
        ("value",),
        gap="unreachable under the plans: each block merges once (batch_norm's grid has a block per "
        "(channel, part), layer_norm's long rows a block per row), so no second merge overwrites the "
        "slots; sanitize.racecheck passes it too. A grid with fewer blocks than merges would show it",
    ),
    # conv_pool
    KernelMutant(
        "conv-wgrad-dropped-barrier",
        "conv_pool.cu",
        "if (more) weight_store(ra, rb, As[stage ^ 1], Bs[stage ^ 1], tid);\n            __syncthreads();",
        "if (more) weight_store(ra, rb, As[stage ^ 1], Bs[stage ^ 1], tid);",
        "conv",
        "dropped barrier",
        "the weight gradient's GEMM multiplies a stage before every thread has stored its share",
        ("vjp",),
    ),
    KernelMutant(
        "conv-wgrad-one-stage",
        "conv_pool.cu",
        "if (more) weight_store(ra, rb, As[stage ^ 1], Bs[stage ^ 1], tid);",
        "if (more) weight_store(ra, rb, As[stage], Bs[stage], tid);",
        "conv",
        "dropped barrier",
        "the weight gradient's next step goes into the stage other threads are still multiplying",
        ("vjp",),
    ),
    KernelMutant(
        "conv-gemm-dropped-barrier",
        "conv_pool.cu",
        "if (more) corr_store<T>(ra, rb, As[stage ^ 1], Bs[stage ^ 1], tid);\n            __syncthreads();",
        "if (more) corr_store<T>(ra, rb, As[stage ^ 1], Bs[stage ^ 1], tid);",
        "conv_transpose",
        "dropped barrier",
        "the implicit GEMM multiplies a stage before every thread has stored its share",
        ("value",),
    ),
    KernelMutant(
        "conv-gemm-dropped-first-barrier",
        "conv_pool.cu",
        "corr_store<T>(ra, rb, As[0], Bs[0], tid);\n            __syncthreads();",
        "corr_store<T>(ra, rb, As[0], Bs[0], tid);",
        "conv_transpose",
        "dropped barrier",
        "the first step's product starts before every thread has stored the first stage",
        ("value",),
    ),
    KernelMutant(
        "conv-gemm-one-stage",
        "conv_pool.cu",
        "if (more) corr_store<T>(ra, rb, As[stage ^ 1], Bs[stage ^ 1], tid);",
        "if (more) corr_store<T>(ra, rb, As[stage], Bs[stage], tid);",
        "conv_transpose",
        "dropped barrier",
        "the next step's values go into the stage other threads are still multiplying",
        ("value",),
    ),
    KernelMutant(
        "conv-gemm-kernel-offset-off-by-one",
        "conv_pool.cuh",
        "if (++k.w < kernel.w) return;",
        "if (++k.w <= kernel.w) return;",
        "conv",
        "off by one",
        "the GEMM's reduction walks one kernel column past the window's last before moving down a row",
        ("value",),
    ),
    KernelMutant(
        "conv-flat-gemm-channel-stuck",
        "conv_pool.cuh",
        "            cur.off += plane;\n",
        "",
        "conv",
        "wrong operand",
        "the flattened (few-channel) GEMM's gather offset never moves to the next channel",
        ("value",),
    ),
    KernelMutant(
        "conv-gemm-padding-row-reads-a-channel",
        "conv_pool.cuh",
        "const int64_t left = cur.live ? p.ic - cur.c : 0;",
        "const int64_t left = cur.live ? p.ic - cur.c : 1;",
        "conv",
        "off by one",
        "a row whose window cell is padding (or past the last row) still loads its first channel",
        ("value",),
    ),
    KernelMutant(
        "conv-gemm-weight-step-one-row",
        "conv_pool.cuh",
        "cur.b += T::BK * corr_cols<T>(p);",
        "cur.b += corr_cols<T>(p);",
        "conv_transpose",
        "swapped strides",
        "the packed weights advance one row per reduction step instead of BK rows",
        ("value",),
    ),
    KernelMutant(
        "conv-transpose-dropped-bias",
        "conv_pool.cu",
        "corr<false, true>(CorrProblem{x, packed, b,",
        "corr<false, true>(CorrProblem{x, packed, nullptr,",
        "conv_transpose",
        "dropped bias",
        "conv_transpose's forward is launched without its bias",
        ("value",),
    ),
    KernelMutant(
        "channel-sums-dropped-barrier",
        "conv_pool.cu",
        "if (tid % 32 == 0) warp_sums[tid / 32] = s;\n        __syncthreads();",
        "if (tid % 32 == 0) warp_sums[tid / 32] = s;",
        "conv_transpose",
        "dropped barrier",
        "the bias gradient adds the warp sums before they are stored",
        ("vjp",),
    ),
    KernelMutant(
        "pool-bwd-window-off-by-one",
        "conv_pool.cuh",
        "const int64_t lo = i + p - k + 1;",
        "const int64_t lo = i + p - k + 2;",
        "avg_pool",
        "off by one",
        "the backward's covering windows start one late: a cell's first window is missed",
        ("vjp",),
    ),
    KernelMutant(
        "max-pool-bwd-lost-window",
        "conv_pool.cuh",
        "if (ld(ap, oi) == cell) acc = add_rn(acc, ld(gp, oi));",
        "if (ld(ap, oi) == cell) acc = ld(gp, oi);",
        "max_pool",
        "lost partial",
        "a cell that is the argmax of several overlapping windows keeps only the last window's g",
        ("vjp",),
    ),
    KernelMutant(
        "max-pool-argmax-one-past-the-end",
        "conv_pool.cu",
        "CAPSULE_GRID_STRIDE(i, geo.planes * volume(geo.out)) argmax[i]",
        "CAPSULE_GRID_STRIDE(i, geo.planes * volume(geo.out) + 1) argmax[i]",
        "max_pool",
        "write out of bounds",
        "the argmax pass runs one window past the last and writes its index after the end of the "
        "workspace; every value stays right",
        ("bounds",),
    ),
    KernelMutant(
        "split-sums-lost-split",
        "conv_pool.cu",
        "dw[tail + i] = split_sum(partial, count, splits, tail + i);",
        "dw[tail + i] = split_sum(partial, count, splits - 1, tail + i);",
        "conv_transpose",
        "lost partial",
        "the scalar weight-gradient sum drops the last split's partial",
        ("vjp",),
        gap="no verify sample runs split_sums' scalar path: splits > 1 only in the medium and large samples "
        "(never in quick), whose weight counts (2304, 320, 648, 16384) are all multiples of 4 (the "
        "float4 path); a sample with splits > 1 and an odd c_in * c_out * kernel volume would",
    ),
    # linalg
    KernelMutant(
        "sgemm-tile-count-rounds-down",
        "linalg.cu",
        "g.batch * cdiv(g.m, T::BM) * cdiv(g.n, T::BN)",
        "g.batch * (g.m / T::BM) * cdiv(g.n, T::BN)",
        "matmul",
        "tile count",
        "the GEMM's tile rows round down: the rows past the last full tile never written",
        ("bounds", "value"),
    ),
    KernelMutant(
        "sgemm-dropped-stage-barrier",
        "linalg.cuh",
        "        __syncthreads();\n        copy_next(write);",
        "        copy_next(write);",
        "matmul",
        "dropped barrier",
        "the k loop multiplies a stage before the other threads' copies have landed, and copies into the "
        "stage others still multiply",
        ("value",),
    ),
    KernelMutant(
        "sgemm-async-wait-one-short",
        "linalg.cuh",
        "wait_async<T::STAGES - 2>();",
        "wait_async<T::STAGES - 1>();",
        "matmul",
        "missing wait",
        "the k loop waits for all but the newest two copy groups: it multiplies a k-tile still in flight "
        "(the emulator lands copies at the wait that retires them)",
        ("value",),
    ),
    KernelMutant(
        "sgemm-k-tail-copies-one-more",
        "linalg.cuh",
        "copy1_async(s + dst + c * E, src + c, live && c < kin);",
        "copy1_async(s + dst + c * E, src + c, live && c <= kin);",
        "matmul",
        "vector tail",
        "the transposing copies of a tail k-tile take one element past the k range instead of a zero",
        ("value",),
    ),
    KernelMutant(
        "sgemm-dropped-item-barrier",
        "linalg.cuh",
        "    __syncthreads();  // every thread is done with the stages before the next item's copies\n",
        "",
        "matmul",
        "dropped barrier",
        "a block copies its next tile's first k-tiles into stages other threads still multiply",
        ("value",),
        gap="unreachable under the plan: its grid has a block per (tile, split), so no block takes a second "
        "item; tests/test_kernels_linalg.py runs the GEMMs on grids of at most 4 blocks, which shows it",
    ),
    KernelMutant(
        "matmul-bwd-a-untransposed-b",
        "linalg.cu",
        "gemm<MatmulBwdA>(MatmulBwdA::map(g, b, da,",
        "gemm<MatmulFwd>(MatmulBwdA::map(g, b, da,",
        "matmul",
        "transposed weights",
        "da = g*b^T reads b with its layout untransposed",
        ("vjp",),
    ),
    KernelMutant(
        "linear-bwd-b-dropped-barrier",
        "linalg.cu",
        "part[warp][lane] = v;\n        __syncthreads();",
        "part[warp][lane] = v;",
        "linear",
        "dropped barrier",
        "warp 0 adds the bias-gradient partials before the other warps store them",
        ("vjp",),
    ),
    KernelMutant(
        "mse-block-sum-wrong-identity",
        "linalg.cu",
        "group_sum<32>(lane < warps ? scratch[lane] : 0.0);",
        "group_sum<32>(lane < warps ? scratch[lane] : 1.0);",
        "mse_loss",
        "wrong identity",
        "the block sum pads the lanes past the last warp with 1 instead of 0",
        ("value",),
    ),
    KernelMutant(
        "mse-bwd-tail-starts-late",
        "linalg.cu",
        "for (int64_t i = rest + first; i < n; i += step) {",
        "for (int64_t i = rest + first + 1; i < n; i += step) {",
        "mse_loss",
        "vector tail",
        "the backward's scalar tail after the float4 body starts one element late",
        ("bounds", "vjp"),
    ),
    # spectral
    KernelMutant(
        "fno-twiddle-table-last-entry",
        "spectral.cu",
        "CAPSULE_GRID_STRIDE(r, grid) {",
        "CAPSULE_GRID_STRIDE(r, grid - 1) {",
        "fft_fno",
        "off by one",
        "the twiddle table kernel never writes entry G - 1: the transforms read an unwritten twiddle",
        ("value",),
    ),
    KernelMutant(
        "fno-synthesis-last-point",
        "spectral.cu",
        "if (t0 + m < G && o < O) out[(b * G + t0 + m) * O + o] = acc[m][j];",
        "if (t0 + m < G - 1 && o < O) out[(b * G + t0 + m) * O + o] = acc[m][j];",
        "fft_fno",
        "off by one",
        "the synthesis never writes the last grid point",
        ("bounds", "value"),
    ),
    KernelMutant(
        "fno-bwd-unscaled-gspec",
        "spectral.cu",
        "part_sum(gpart, gspec, n_g, grid, c_out, modes, parts, true, i - n_x);",
        "part_sum(gpart, gspec, n_g, grid, c_out, modes, parts, false, i - n_x);",
        "fft_fno",
        "missing 1/n",
        "the sum of g's partial spectra misses irfft's bin weight w_k/G",
        ("vjp",),
    ),
    KernelMutant(
        "fno-bwd-unscaled-gspec-whole",
        "spectral.cu",
        "of_b && parts == 1, of_b ? i - n_a : i);",
        "false, of_b ? i - n_a : i);",
        "fft_fno",
        "missing 1/n",
        "g's spectrum in one part misses irfft's bin weight w_k/G",
        ("vjp",),
    ),
    KernelMutant(
        "fno-mix-swapped-strides",
        "spectral.cu",
        "__ldg(w_re + w0 + c * c_out)",
        "__ldg(w_re + w0 + c)",
        "fft_fno",
        "swapped strides",
        "the mix reads W's real part with the channel stride 1 instead of c_out",
        ("value",),
    ),
    KernelMutant(
        "fno-analysis-short-last-part",
        "spectral.cu",
        "n = static_cast<Turn>(G - t0 < span ? G - t0 : span);",
        "n = static_cast<Turn>(G - t0 < span ? G - t0 - 1 : span);",
        "fft_fno",
        "off by one",
        "a short last part of the analysis drops its last grid point",
        ("value", "vjp"),
    ),
    KernelMutant(
        "fno-analysis-parts-start-at-zero",
        "spectral.cu",
        "first_turn<Turn>(inc[0], dt, G)",
        "first_turn<Turn>(inc[0], 0, G)",
        "fft_fno",
        "wrong offset",
        "every part of the split analysis starts at turn 0, as if at t = 0",
        ("value", "vjp"),
    ),
    KernelMutant(
        "fno-analysis-adjacent-channels",
        "spectral.cu",
        "(c < C ? c : C - 1);",
        "(c < C ? h + j0 + j : C - 1);",
        "fft_fno",
        "swapped strides",
        "an analysis thread reads channels h, h + 1, ... where it accumulates and writes h, h + H, ... (H = ceil(C/4))",
        ("value", "vjp"),
    ),
    KernelMutant(
        "fno-synthesis-writes-past-outputs",
        "spectral.cu",
        "if (t0 + m < G && o < O) out[",
        "if (t0 + m < G) out[",
        "fft_fno",
        "off by one",
        "a synthesis thread writes its clamped outputs past O: into the next grid point's row, and past the end of y",
        ("bounds", "value"),
    ),
    KernelMutant(
        "fno-sum-drops-last-part",
        "spectral.cu",
        "for (; s < parts; ++s, p += items) {",
        "for (; s + 1 < parts; ++s, p += items) {",
        "fft_fno",
        "vector tail",
        "the partial sums' remainder after the four-at-a-time body misses the last part",
        ("value", "vjp"),
    ),
    # scan
    KernelMutant(
        "scan-lost-carry",
        "scan.cu",
        "h = capsule_scan_apply(c, h);",
        "h = c.h;",
        "selective_scan",
        "lost carry",
        "the state entering a chunk forgets the state before the previous chunk",
        ("value",),
    ),
    KernelMutant(
        "scan-dropped-barrier",
        "scan.cu",
        "chunk_h[slot()] = s.h;\n        __syncthreads();",
        "chunk_h[slot()] = s.h;",
        "selective_scan",
        "dropped barrier",
        "chunk summaries are chained before every chunk has stored its own",
        ("value",),
    ),
    KernelMutant(
        "scan-bwd-wrong-state",
        "scan.cu",
        "const float hprev = t > 0 ? __ldg(y + i - dim)",
        "const float hprev = t > 0 ? __ldg(y + i)",
        "selective_scan",
        "wrong operand",
        "the backward is handed h[t] where it needs h[t-1]",
        ("vjp",),
    ),
    KernelMutant(
        "scan-shared-grad-swapped-strides",
        "scan.cu",
        "s += __ldg(da_part + i * dim + d);",
        "s += __ldg(da_part + i + d * batch);",
        "selective_scan",
        "swapped strides",
        "the batch sum of a shared A's gradient walks (b, d) transposed",
        ("vjp",),
    ),
)

KERNEL_REPRESENTATIVES = (
    "pw-vector-tail-starts-late",
    "softmax-dropped-max-shuffle",
    "reduce-tile-dropped-barrier",
    "slice-bwd-off-by-one",
    "scatter-add-dropped-base",
    "random-stream-off-by-one",
    "batch-norm-bwd-x-swapped-sums",
    "pool-bwd-window-off-by-one",
    "sgemm-tile-count-rounds-down",
    "fno-mix-swapped-strides",
    "scan-lost-carry",
)
"""One kernel mutant per family, of as many kinds as there are families: what the default test run
plants (a build of a family costs 5 to 30 s; the whole catalog runs with --kernels)."""


@contextmanager
def mutated_sources(mutant: KernelMutant):
    """A temporary copy of cuda/ with the mutant planted: the folder an EmuBackend(family_dir=...)
    builds the family from (against the package's emulator header)."""
    with tempfile.TemporaryDirectory(prefix=f"capsules-mutant-{mutant.id}-") as work:
        folder = Path(work) / "cuda"
        shutil.copytree(cuda_source_dir(), folder)
        path = folder / mutant.file
        path.write_text(mutant.planted(path.read_text()))
        yield folder


def prebuild(mutants) -> None:
    """Builds the mutated families side by side, one host compiler per core (a build takes 5 to 30
    s, a verify run mostly under 2), into the content-hash cache the runs then load from."""
    from capsule_core.backends.emu import build_family

    def build(mutant):
        with mutated_sources(mutant) as folder:
            build_family(mutant.family, family_dir=folder)

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(build, mutants))


_EMU_BASELINE: dict = {}


def emu_baseline(op: str) -> dict:
    """Statuses of the unmutated kernels on `op` (cached)."""
    from capsule_core.backends.emu import EmuBackend

    if op not in _EMU_BASELINE:
        _EMU_BASELINE[op] = verify_statuses(op, EmuBackend())[0]
    return _EMU_BASELINE[op]


def run_kernel_mutant(mutant: KernelMutant, seed: int = 0) -> Outcome:
    from capsule_core.backends.emu import EmuBackend

    base = emu_baseline(mutant.op)
    with mutated_sources(mutant) as folder:
        statuses, reasons, seconds = verify_statuses(mutant.op, EmuBackend(family_dir=folder), seed)
    killers = tuple(c for c, s in statuses.items() if s in BAD and base.get(c) not in BAD)
    return Outcome(mutant, statuses, reasons, killers, seconds)


def unexpected(outcomes) -> list:
    """Outcomes that break the catalog's promise: a mutant without a gap note that survived or was
    killed for the wrong reason, or a known gap that is now killed (its note should go)."""
    return [o for o in outcomes if (o.killed and o.mutant.gap) or (not o.mutant.gap and not o.right_reason)]


def _details(o: Outcome) -> str:
    return f"{o.mutant.id}: " + "; ".join(
        f"{c}={s} {o.reasons[c][:200]}" for c, s in o.statuses.items() if s != "SKIPPED"
    )


def _main_numpy():
    start = time.perf_counter()
    outcomes = [run_mutant(m) for m in MUTANTS]
    seconds = time.perf_counter() - start
    legit = [run_mutant(m) for m in LEGIT]
    print(table(outcomes))
    print()
    print(table(legit))
    killed = sum(o.killed for o in outcomes)
    print(
        f"\nmutation score {killed}/{len(outcomes)} = {killed / len(outcomes):.1%}; "
        f"{sum(o.killed and not o.right_reason for o in outcomes)} for the wrong reason; {seconds:.1f} s"
    )
    for o in outcomes + legit:
        bad = (
            (not o.killed or not o.right_reason)
            if o.mutant.expect
            else any(s in BAD + ("MISTRUSTED",) for s in o.statuses.values())
        )
        if bad:
            print("\n" + _details(o))


def _main_kernels(ids: list[str]) -> int:
    known = {m.id for m in KERNEL_MUTANTS}
    if set(ids) - known:
        raise SystemExit(f"unknown kernel mutants: {', '.join(sorted(set(ids) - known))}")
    chosen = [m for m in KERNEL_MUTANTS if not ids or m.id in ids]
    start = time.perf_counter()
    prebuild(chosen)
    built = time.perf_counter()
    outcomes = [run_kernel_mutant(m) for m in chosen]
    print(table(outcomes))
    killed = sum(o.killed for o in outcomes)
    print(
        f"\nkernel mutation score {killed}/{len(outcomes)} = {killed / len(outcomes):.1%} "
        f"({sum(bool(o.mutant.gap) for o in outcomes)} known gaps); builds {built - start:.1f} s, "
        f"verify runs {time.perf_counter() - built:.1f} s"
    )
    for o in outcomes:
        if o.mutant.gap:
            print(f"\n{o.mutant.id} (known gap): {o.mutant.gap}")
    wrong = unexpected(outcomes)
    for o in wrong:
        print("\nUNEXPECTED " + _details(o))
    return 1 if wrong else 0


if __name__ == "__main__":
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        description="The mutation suite: the numpy provider's mutants, or with "
        "--kernels the kernel mutants on the emu backend."
    )
    parser.add_argument("--kernels", nargs="*", metavar="ID", help="run the kernel mutants (all, or these ids)")
    arguments = parser.parse_args()
    if arguments.kernels is None:
        _main_numpy()
    else:
        sys.exit(_main_kernels(arguments.kernels))
