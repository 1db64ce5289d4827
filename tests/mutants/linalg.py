"""Mutants of the linalg family: gross bugs that verify must catch."""

from __future__ import annotations

import dataclasses

import numpy as np

from capsule_core.errors import InputError
from mutants.planting import Mutant, forward_is, vjp_is

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
