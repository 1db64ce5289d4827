"""Mutants of the view family: gross bugs that verify must catch."""

from __future__ import annotations

import dataclasses

import numpy as np

from capsule_core.ops import view as vw
from mutants.planting import Mutant, _lenient_write, forward_is, vjp_is

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
