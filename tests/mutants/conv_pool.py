"""Mutants of the conv_pool family: gross bugs that verify must catch."""

from __future__ import annotations

import numpy as np

from capsule_core.ops import conv_pool as cp
from capsule_core.ops.base import numel
from mutants.planting import Mutant, forward_is, vjp_is

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
