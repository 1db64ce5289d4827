"""Mutants of the index family: gross bugs that verify must catch."""

from __future__ import annotations

import dataclasses

import numpy as np

from mutants.planting import Mutant, _lenient_write, forward_is, vjp_is, write_before_start

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
        {"write": write_before_start},
    ),
]
