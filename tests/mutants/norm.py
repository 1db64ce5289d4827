"""Mutants of the norm family: gross bugs that verify must catch."""

from __future__ import annotations

import numpy as np

from capsule_core.ops import norm as nm
from capsule_core.ops.base import numel
from mutants.planting import Mutant, forward_is, vjp_is

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
