"""Subtle mutants (small numerical errors, a legitimate-looking formula) and GAPS (bugs verify misses today, each with its note)."""

from __future__ import annotations

import numpy as np

from capsule_core.ops import norm as nm
from capsule_core.ops import pointwise as pw
from capsule_core.ops import random as rn
from capsule_core.ops.base import DTYPE, numel
from mutants.planting import Mutant, forward_is, jitter_large, vjp_is

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
        {"post": jitter_large},
        gap="in quick mode no reduce_sum case reaches 4096 elements; a full run (medium and large samples) "
        "catches it, since determinism reruns the largest case",
    ),
]
