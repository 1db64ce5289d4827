"""Mutants of the softmax family: gross bugs that verify must catch."""

from __future__ import annotations

import numpy as np

from mutants.planting import Mutant, _cast, forward_is, skip_last, vjp_is

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
        {"write": skip_last},
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
