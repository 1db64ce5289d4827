"""Random ops: SplitMix64 as a counter stream, forward only (VJP mode none).

Element i (row-major) of a draw with seed s takes r_i = low 32 bits of mix(mix(s) + i), so the
bits depend only on (seed, i): any launch configuration, device or call order gives the same
values. `splitmix64_stream` and `uniform_bits` are public so that verify's rng check and tests
reuse this one generator.
"""

from __future__ import annotations

import numpy as np

from capsule_core.errors import ParamError
from capsule_core.ops import base

GOLDEN_GAMMA = 0x9E3779B97F4A7C15
MIX_MULTIPLIERS = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
MASK64 = 2**64 - 1

SHAPES = {"small": ((7,), (3, 5)), "medium": ((64, 129),), "large": ((2048, 1025),)}
"""Sample shapes per size: odd and non-power-of-two, up to 2M elements."""


def mix(z):
    """SplitMix64's step: z + γ, then the two xor-shift-multiply rounds, all mod 2⁶⁴.

    Accepts a Python int (returns an int) or a uint64 array (wraps elementwise, no warnings).
    The standard SplitMix64 generator seeded with s returns mix(s + i·γ) as its i-th output.
    """
    if isinstance(z, (int, np.integer)):
        z = (int(z) + GOLDEN_GAMMA) & MASK64
        z = ((z ^ (z >> 30)) * MIX_MULTIPLIERS[0]) & MASK64
        z = ((z ^ (z >> 27)) * MIX_MULTIPLIERS[1]) & MASK64
        return z ^ (z >> 31)
    z = np.asarray(z, dtype=np.uint64) + np.uint64(GOLDEN_GAMMA)
    z ^= z >> np.uint64(30)
    z *= np.uint64(MIX_MULTIPLIERS[0])
    z ^= z >> np.uint64(27)
    z *= np.uint64(MIX_MULTIPLIERS[1])
    z ^= z >> np.uint64(31)
    return z


def splitmix64_stream(seed: int, n: int) -> np.ndarray:
    """The counter stream's full 64-bit outputs mix(mix(seed) + i), i = 0 … n−1 (uint64)."""
    key = mix(int(seed) & MASK64)
    return mix(np.arange(n, dtype=np.uint64) + np.uint64(key))


def uniform_bits(seed: int, n: int) -> np.ndarray:
    """r_i = the low 32 bits of the stream (uint32): the bits every random op draws."""
    return splitmix64_stream(seed, n).astype(np.uint32)


def uniform_values(seed: int, n: int, dtype=np.float32) -> np.ndarray:
    """u_i = (r_i >> 8)·2⁻²⁴ in [0, 1): exactly representable in float32 (and float64)."""
    return (uniform_bits(seed, n) >> np.uint32(8)).astype(dtype) * 2.0**-24


def _check_shape(op: str, params) -> tuple:
    shape = params["shape"]
    if any(d < 0 for d in shape):
        raise ParamError(op, "shape", f"dimensions must be non-negative, got {shape}")
    return tuple(shape)


def _check_p(op: str, params):
    if not 0.0 <= params["p"] <= 1.0:
        raise ParamError(op, "p", f"must be in [0, 1], got {params['p']!r}")


def _random_op(
    name: str,
    *,
    params: tuple[base.Param, ...],
    draw,
    check=None,
    sample_params: dict,
    extra_edges=(),
    extra_errors=(),
    doc: str,
) -> base.OpSpec:
    """The family factory: `draw(u, params)` maps uniform values u (working dtype) to y."""

    def shape(shapes, p):
        if check is not None:
            check(name, p)
        return _check_shape(name, p)

    def forward(inputs, p):
        out_shape = tuple(p["shape"])
        return draw(uniform_values(p["seed"], base.numel(out_shape), p[base.DTYPE]), p).reshape(out_shape)

    def cost(shapes, p):
        n = base.numel(p["shape"])
        # The generator is integer arithmetic; the float work is one scale or compare per element.
        return base.Cost(bytes_read=0, bytes_written=4 * n, flops=n)

    def samples(size: str, rng: np.random.Generator) -> list[base.Sample]:
        return [
            base.Sample({}, {**sample_params, "shape": s, "seed": int(rng.integers(0, 2**63))}, f"{size}-{i}")
            for i, s in enumerate(SHAPES[size])
        ]

    def edges() -> list[base.Sample]:
        cases = [
            ({"shape": (0,), "seed": 1}, "edge-empty"),
            ({"shape": (2, 0, 3), "seed": 1}, "edge-empty-3d"),
            ({"shape": (), "seed": 5}, "edge-rank0"),
            ({"shape": (1,), "seed": 0}, "edge-one-seed0"),
            ({"shape": (3, 37), "seed": 2**64 - 1}, "edge-odd-max-seed"),
        ]
        return [base.Sample({}, {**sample_params, **p}, c, True) for p, c in cases] + [
            base.Sample({}, {**sample_params, **p}, c, True) for p, c in extra_edges
        ]

    def errors() -> list[base.ErrorCase]:
        given = {**sample_params, "shape": (3,), "seed": 1}
        cases = [
            (dict(given, shape=(2, -1)), ParamError, r"shape: dimensions must be non-negative"),
            (dict(given, shape=4), ParamError, r"shape: must be a tuple of ints"),
            (dict(given, seed=-1), ParamError, r"seed: must be an int in \[0, 2\*\*64\)"),
            (dict(given, seed=2**64), ParamError, r"seed: must be an int in \[0, 2\*\*64\)"),
            ({k: v for k, v in given.items() if k != "seed"}, ParamError, r"seed: required parameter is missing"),
            ({k: v for k, v in given.items() if k != "shape"}, ParamError, r"shape: required parameter is missing"),
        ] + list(extra_errors)
        return [base.ErrorCase(base.Sample({}, p, f"error-{i}"), e, m) for i, (p, e, m) in enumerate(cases)]

    return base.OpSpec(
        name=name,
        family="random",
        inputs=(),
        params=params,
        shape_rule="shape",
        shape=shape,
        forward=forward,
        magnitude=lambda inputs, p, y: np.abs(y),
        error=base.Exact("an integer times 2^-24 below 1 is exactly representable in float32"),
        cost=cost,
        samples=samples,
        edges=edges,
        errors=errors,
        doc=doc,
    )


SHAPE = base.Param("shape", "shape", doc="output shape, non-negative dimensions")
SEED = base.Param("seed", "seed", doc="generator seed in [0, 2**64)")

# -- rand_uniform: u_i = (r_i >> 8)·2⁻²⁴ in [0, 1) -----------------------------------------

RAND_UNIFORM = _random_op(
    "rand_uniform",
    params=(SHAPE, SEED),
    draw=lambda u, p: u,
    sample_params={},
    doc="rand_uniform(shape, seed): u_i = (r_i >> 8) * 2^-24, exactly representable, in [0, 1).",
)

# -- bernoulli_mask: 1.0 if u_i < p else 0.0, no 1/p rescaling ------------------------------

BERNOULLI_MASK = _random_op(
    "bernoulli_mask",
    params=(SHAPE, base.Param("p", "float", doc="keep probability in [0, 1]"), SEED),
    draw=lambda u, p: (u < p["p"]).astype(u.dtype),
    check=_check_p,
    sample_params={"p": 0.3},
    extra_edges=(
        ({"shape": (5, 7), "p": 0.0, "seed": 3}, "edge-p0"),
        ({"shape": (5, 7), "p": 1.0, "seed": 3}, "edge-p1"),
        ({"shape": (4, 33), "p": 2.0**-24, "seed": 9}, "edge-p-one-step"),
        ({"shape": (4, 33), "p": 0.5, "seed": 9}, "edge-p-half"),
        # p equal to one of the draws: only u < p (not u <= p) leaves that element 0.
        ({"shape": (4, 33), "p": float(uniform_values(9, 132, np.float64)[17]), "seed": 9}, "edge-p-is-a-draw"),
    ),
    extra_errors=(
        ({"shape": (3,), "seed": 1, "p": 1.5}, ParamError, r"p: must be in \[0, 1\]"),
        ({"shape": (3,), "seed": 1, "p": -0.25}, ParamError, r"p: must be in \[0, 1\]"),
        ({"shape": (3,), "seed": 1, "p": float("nan")}, ParamError, r"p: must be finite"),
        ({"shape": (3,), "seed": 1}, ParamError, r"p: required parameter is missing"),
    ),
    doc="bernoulli_mask(shape, p, seed): 1.0 if u_i < p else 0.0; p = 0 gives zeros, p = 1 ones.",
)

SPECS = (RAND_UNIFORM, BERNOULLI_MASK)
