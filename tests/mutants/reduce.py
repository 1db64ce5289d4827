"""Mutants of the reduce family: gross bugs that verify must catch."""

from __future__ import annotations

from capsule_core.ops import reduce as rd
from capsule_core.ops.base import numel
from mutants.planting import Mutant, _cast, forward_is, vjp_is

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
