"""Mutants of the random family: gross bugs that verify must catch."""

from __future__ import annotations

from capsule_core.ops import random as rn
from capsule_core.ops.base import DTYPE, numel
from mutants.planting import Mutant, forward_is

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
