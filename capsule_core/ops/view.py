"""Shape and layout ops: reshape, permute, broadcast, concat, slice.

Every forward moves values without arithmetic, so it is Exact: the float32 result is the input's
bits (−0 and NaN payloads included). The one VJP that computes is broadcast's, a sum over the
broadcast copies (an Accumulation of that many terms). Outputs are fresh contiguous arrays,
except reshape's, which shares the input's buffer (the spec's "no copy").
"""

from __future__ import annotations

import math

import numpy as np

from capsule_core.errors import ParamError, ShapeError
from capsule_core.ops import base

COPY = base.Exact("a copy: values move, nothing is computed")
MAX_PERMUTE_RANK = 8


def _normal(rng: np.random.Generator, shape) -> np.ndarray:
    return base.f32(2.0 * rng.standard_normal(shape))


def _numbered(prefix: str, cases) -> list[base.Sample]:
    """Samples with stable ids "<prefix>-0", "<prefix>-1", ... from (inputs, params) pairs."""
    return [base.Sample(inputs, params, f"{prefix}-{i}") for i, (inputs, params) in enumerate(cases)]


def _edges(cases) -> list[base.Sample]:
    """Edge samples (worst-case bound) from (case id, inputs, params) triples."""
    return [base.Sample(inputs, params, case, True) for case, inputs, params in cases]


def _abs(a) -> np.ndarray:
    return np.abs(np.asarray(a, dtype=np.float64))


def _copy_cost(shape_rule):
    """The cost of a copy: every output element (of `shape_rule`'s shape) read once and written once."""

    def cost(shapes, p) -> base.Cost:
        n = base.numel(shape_rule(shapes, p))
        return base.Cost(bytes_read=4 * n, bytes_written=4 * n, flops=0)

    return cost


def _specials(shape) -> np.ndarray:
    """SPECIAL_VALUES tiled to `shape`: NaN, ±inf, ±0, subnormals, the largest normals."""
    return np.resize(base.SPECIAL_VALUES, shape)


def _error(case: str, inputs: dict, params: dict, error, match: str) -> base.ErrorCase:
    return base.ErrorCase(base.Sample(inputs, params, case), error, match)


# -- reshape: the same buffer read with a new shape -------------------------------------------


def _reshape_shape(shapes, p) -> tuple:
    target, x_shape = p["shape"], tuple(shapes["x"])
    size = base.numel(x_shape)
    if any(d < -1 for d in target):
        raise ParamError("reshape", "shape", f"entries must be >= 0 or a single -1, got {target}")
    if target.count(-1) > 1:
        raise ParamError("reshape", "shape", f"at most one -1 is allowed, got {target}")
    known = math.prod(d for d in target if d != -1)
    if -1 in target:
        if known == 0:
            raise ParamError(
                "reshape", "shape", f"-1 cannot be inferred when the other entries multiply to 0, got {target}"
            )
        if size % known:
            raise ParamError(
                "reshape",
                "shape",
                f"cannot infer -1: the {size} elements of x {x_shape} are not a multiple of {known}, got {target}",
            )
        return tuple(size // known if d == -1 else d for d in target)
    if known != size:
        raise ParamError(
            "reshape", "shape", f"must hold the {size} elements of x {x_shape}, got {target} ({known} elements)"
        )
    return target


def _reshape_samples(size: str, rng: np.random.Generator) -> list[base.Sample]:
    cases = {
        "small": (((3, 4, 5), (-1, 5, 4)), ((7,), (7, 1)), ((2, 3, 5), (5, 6))),
        "medium": (((64, 129), (43, -1)), ((16, 31, 33), (-1,))),
        "large": (((1024, 1531), (1531, 1024)),),
    }[size]
    return _numbered(size, [({"x": _normal(rng, s)}, {"shape": t}) for s, t in cases])


def _reshape_edges() -> list[base.Sample]:
    rng = base.seeded_rng("reshape", "edge")
    return _edges(
        [
            ("edge-empty", {"x": np.zeros((0, 3), np.float32)}, {"shape": (3, 0)}),
            ("edge-empty-infer", {"x": np.zeros((2, 0, 3), np.float32)}, {"shape": (-1, 3)}),
            ("edge-rank0-to-1x1", {"x": base.f32(0.75)}, {"shape": (1, 1)}),
            ("edge-to-rank0", {"x": base.f32([[[-1.5]]])}, {"shape": ()}),
            ("edge-infer-only", {"x": _normal(rng, (3, 37))}, {"shape": (-1,)}),
            ("edge-size1-axes", {"x": _normal(rng, (5, 7))}, {"shape": (1, 5, 1, 7, 1)}),
            ("edge-special", {"x": _specials((14,))}, {"shape": (2, 7)}),
        ]
    )


def _reshape_errors() -> list[base.ErrorCase]:
    x = np.zeros((3, 4), np.float32)
    return [
        _error("error-count", {"x": x}, {"shape": (5, 2)}, ParamError, r"reshape: shape: must hold the 12 elements"),
        _error("error-infer-indivisible", {"x": x}, {"shape": (5, -1)}, ParamError, r"shape: cannot infer -1"),
        _error("error-two-free", {"x": x}, {"shape": (-1, -1)}, ParamError, r"shape: at most one -1"),
        _error("error-negative", {"x": x}, {"shape": (-2, -6)}, ParamError, r"shape: entries must be >= 0"),
        _error(
            "error-infer-zero",
            {"x": np.zeros((0, 3), np.float32)},
            {"shape": (0, -1)},
            ParamError,
            r"shape: -1 cannot be inferred",
        ),
        _error("error-missing", {"x": x}, {}, ParamError, r"shape: required parameter is missing"),
    ]


RESHAPE = base.OpSpec(
    name="reshape",
    family="view",
    inputs=(base.Tensor("x", "(…)"),),
    params=(base.Param("shape", "shape", doc="the new shape; one -1 is inferred"),),
    shape_rule="shape, with a -1 inferred",
    shape=_reshape_shape,
    forward=lambda a, p: a["x"].reshape(p["shape"]),
    vjp=lambda a, p, y, g: {"x": g.reshape(a["x"].shape)},
    magnitude=lambda a, p, y: _abs(y),
    vjp_magnitude=lambda a, p, y, g: {"x": _abs(g).reshape(a["x"].shape)},
    error=base.Exact("the same buffer: nothing is computed"),
    vjp_error=base.Exact("the same buffer: nothing is computed"),
    cost=lambda shapes, p: base.Cost(0, 0, 0),  # no copy and no launch: the buffer is only relabelled
    samples=_reshape_samples,
    edges=_reshape_edges,
    errors=_reshape_errors,
    doc="reshape(x, shape): the same buffer with a new shape (one -1 inferred); no copy.",
)


# -- permute: axes reordered, any rank up to 8 --------------------------------------------------


def _permute_shape(shapes, p) -> tuple:
    x_shape, perm = tuple(shapes["x"]), p["perm"]
    base.require_rank("permute", "x", x_shape, 0, MAX_PERMUTE_RANK)
    rank = len(x_shape)
    if len(perm) != rank:
        raise ParamError("permute", "perm", f"must have one entry per axis of x (rank {rank}), got {perm}")
    if sorted(perm) != list(range(rank)):
        raise ParamError(
            "permute",
            "perm",
            f"must be a permutation of range({rank}) (no repeats, entries in [0, {rank})), got {perm}",
        )
    return tuple(x_shape[i] for i in perm)


def _inverse(perm: tuple) -> tuple:
    inverse = [0] * len(perm)
    for position, axis in enumerate(perm):
        inverse[axis] = position
    return tuple(inverse)


def _permute_samples(size: str, rng: np.random.Generator) -> list[base.Sample]:
    cases = {
        "small": (((3, 4, 5), (2, 0, 1)), ((2, 3, 1, 5), (3, 1, 0, 2))),
        "medium": (((64, 129), (1, 0)), ((8, 9, 10, 11, 12), (4, 2, 0, 3, 1))),
        "large": (((48, 128, 257), (2, 0, 1)),),
    }[size]
    return _numbered(size, [({"x": _normal(rng, s)}, {"perm": perm}) for s, perm in cases])


def _permute_edges() -> list[base.Sample]:
    rng = base.seeded_rng("permute", "edge")
    return _edges(
        [
            ("edge-empty", {"x": np.zeros((0, 3, 2), np.float32)}, {"perm": (2, 0, 1)}),
            ("edge-size1-axes", {"x": _normal(rng, (1, 5, 1))}, {"perm": (2, 1, 0)}),
            ("edge-identity", {"x": _normal(rng, (3, 37))}, {"perm": (0, 1)}),
            ("edge-rank8", {"x": _normal(rng, (2, 1, 3, 1, 2, 3, 1, 2))}, {"perm": (7, 2, 5, 0, 3, 6, 1, 4)}),
            ("edge-special", {"x": _specials((2, 7))}, {"perm": (1, 0)}),
            ("edge-rank0", {"x": base.f32(-2.5)}, {"perm": ()}),
        ]
    )


def _permute_errors() -> list[base.ErrorCase]:
    x = np.zeros((2, 3, 4), np.float32)
    return [
        _error(
            "error-perm-length", {"x": x}, {"perm": (1, 0)}, ParamError, r"permute: perm: must have one entry per axis"
        ),
        _error(
            "error-perm-repeat", {"x": x}, {"perm": (0, 1, 1)}, ParamError, r"perm: must be a permutation of range\(3\)"
        ),
        _error("error-perm-range", {"x": x}, {"perm": (0, 1, 3)}, ParamError, r"perm: must be a permutation"),
        _error("error-perm-negative", {"x": x}, {"perm": (0, 1, -1)}, ParamError, r"perm: must be a permutation"),
        _error(
            "error-rank9",
            {"x": np.zeros((1,) * 9, np.float32)},
            {"perm": tuple(range(9))},
            ShapeError,
            r"permute: x: must have rank 0 to 8",
        ),
    ]


PERMUTE = base.OpSpec(
    name="permute",
    family="view",
    inputs=(base.Tensor("x", "(…) rank <= 8"),),
    params=(base.Param("perm", "perm", doc="a permutation of range(rank)"),),
    shape_rule="x.shape[perm[i]] for each i",
    shape=_permute_shape,
    forward=lambda a, p: np.transpose(a["x"], p["perm"]).copy(),
    vjp=lambda a, p, y, g: {"x": np.transpose(g, _inverse(p["perm"])).copy()},
    magnitude=lambda a, p, y: _abs(y),
    vjp_magnitude=lambda a, p, y, g: {"x": np.transpose(_abs(g), _inverse(p["perm"]))},
    error=COPY,
    vjp_error=COPY,
    cost=_copy_cost(_permute_shape),
    samples=_permute_samples,
    edges=_permute_edges,
    errors=_permute_errors,
    doc="permute(x, perm): y.shape[i] = x.shape[perm[i]]; any permutation of up to 8 axes.",
)


# -- broadcast: NumPy broadcasting to a target shape -------------------------------------------


def _broadcast_shape(shapes, p) -> tuple:
    x_shape, target = tuple(shapes["x"]), p["shape"]
    if any(d < 0 for d in target):
        raise ParamError("broadcast", "shape", f"entries must be >= 0, got {target}")
    if len(target) < len(x_shape):
        raise ParamError("broadcast", "shape", f"must have rank >= the rank of x {x_shape}, got {target}")
    lead = len(target) - len(x_shape)
    for i, d in enumerate(x_shape):
        if d != 1 and d != target[lead + i]:
            raise ShapeError(
                "broadcast",
                "shape",
                f"axis {lead + i} of size {target[lead + i]} cannot take axis {i} "
                f"of x {x_shape} (x's axes align to the right; each 1 or equal)",
            )
    return target


def _summed_axes(x_shape: tuple, target: tuple) -> tuple:
    """Axes of the target that hold copies of x: the leading new ones and those where x has 1."""
    lead = len(target) - len(x_shape)
    return tuple(range(lead)) + tuple(lead + i for i, d in enumerate(x_shape) if d == 1 and target[lead + i] != 1)


def _copies(shapes, p) -> int:
    """How many times each element of x appears in y: the VJP's accumulation length."""
    return math.prod(p["shape"][a] for a in _summed_axes(tuple(shapes["x"]), p["shape"]))


def _broadcast_vjp(a, p, y, g) -> dict:
    x = a["x"]
    return {"x": g.sum(axis=_summed_axes(x.shape, p["shape"]), dtype=g.dtype).reshape(x.shape)}


def _broadcast_samples(size: str, rng: np.random.Generator) -> list[base.Sample]:
    cases = {
        "small": (((3, 1, 5), (2, 3, 4, 5)), ((4,), (3, 4)), ((), (2, 3))),
        "medium": (((1, 129), (64, 129)), ((16, 1, 33), (8, 16, 31, 33))),
        "large": (((1, 1531), (1024, 1531)),),
    }[size]
    return _numbered(size, [({"x": _normal(rng, s)}, {"shape": t}) for s, t in cases])


def _broadcast_edges() -> list[base.Sample]:
    rng = base.seeded_rng("broadcast", "edge")
    return _edges(
        [
            ("edge-from-rank0", {"x": base.f32(-0.0)}, {"shape": (3, 37)}),
            ("edge-rank0-to-rank0", {"x": base.f32(1.25)}, {"shape": ()}),
            ("edge-new-leading-axes", {"x": _normal(rng, (2, 1))}, {"shape": (5, 3, 2, 7)}),
            ("edge-identity", {"x": _normal(rng, (3, 37))}, {"shape": (3, 37)}),
            ("edge-one-to-empty", {"x": _normal(rng, (1, 3))}, {"shape": (0, 3)}),
            ("edge-new-empty-axis", {"x": _normal(rng, (3,))}, {"shape": (2, 0, 3)}),
            ("edge-empty-x", {"x": np.zeros((0,), np.float32)}, {"shape": (4, 0)}),
            ("edge-many-copies", {"x": _normal(rng, (1, 3))}, {"shape": (4099, 3)}),
            ("edge-special", {"x": _specials((14,))}, {"shape": (3, 14)}),
        ]
    )


def _broadcast_errors() -> list[base.ErrorCase]:
    x = np.zeros((3, 4), np.float32)
    return [
        _error(
            "error-incompatible",
            {"x": x},
            {"shape": (2, 3, 5)},
            ShapeError,
            r"broadcast: shape: axis 2 of size 5 cannot take",
        ),
        _error("error-rank-too-small", {"x": x}, {"shape": (12,)}, ParamError, r"shape: must have rank >="),
        _error("error-negative", {"x": x}, {"shape": (-1, 3, 4)}, ParamError, r"shape: entries must be >= 0"),
        _error(
            "error-zero-to-one",
            {"x": np.zeros((0,), np.float32)},
            {"shape": (1,)},
            ShapeError,
            r"shape: axis 0 of size 1",
        ),
    ]


BROADCAST = base.OpSpec(
    name="broadcast",
    family="view",
    inputs=(base.Tensor("x", "(…)"),),
    params=(base.Param("shape", "shape", doc="the target shape"),),
    shape_rule="shape (x's axes aligned to the right, each 1 or equal)",
    shape=_broadcast_shape,
    forward=lambda a, p: np.array(np.broadcast_to(a["x"], p["shape"])),
    vjp=_broadcast_vjp,
    magnitude=lambda a, p, y: _abs(y),
    vjp_magnitude=lambda a, p, y, g: _broadcast_vjp(a, p, y, _abs(g)),
    error=COPY,
    vjp_error=base.Accumulation(1, "a sum of the broadcast copies of each element; k = 1 spare rounding", _copies),
    cost=lambda shapes, p: base.Cost(
        bytes_read=4 * base.numel(shapes["x"]), bytes_written=4 * math.prod(p["shape"]), flops=0
    ),
    samples=_broadcast_samples,
    edges=_broadcast_edges,
    errors=_broadcast_errors,
    doc="broadcast(x, shape): x read with its size-1 and missing leading axes repeated.",
)


# -- concat: a variadic list joined along one axis --------------------------------------------


def _concat_shape(shapes, p) -> tuple:
    parts = [tuple(s) for s in shapes["xs"]]
    first = parts[0]
    for i, s in enumerate(parts[1:], start=1):
        if len(s) != len(first):
            raise ShapeError("concat", f"xs[{i}]", f"must have the rank of xs[0] {first}, got shape {s}")
    axis = base.normalize_axis("concat", "axis", p["axis"], len(first))
    for i, s in enumerate(parts[1:], start=1):
        if s[:axis] != first[:axis] or s[axis + 1 :] != first[axis + 1 :]:
            raise ShapeError("concat", f"xs[{i}]", f"must match xs[0] {first} on every axis but {axis}, got shape {s}")
    return first[:axis] + (sum(s[axis] for s in parts),) + first[axis + 1 :]


def _concat_vjp(a, p, y, g) -> dict:
    xs = a["xs"]
    axis = p["axis"] % g.ndim
    ends = np.cumsum([x.shape[axis] for x in xs])[:-1]
    return {"xs": tuple(part.copy() for part in np.split(g, ends, axis=axis))}


def _concat_samples(size: str, rng: np.random.Generator) -> list[base.Sample]:
    cases = {
        "small": ((((2, 3), (2, 5), (2, 1)), 1), (((3, 2, 2), (1, 2, 2)), 0), (((2, 3, 2), (2, 4, 2)), -2)),
        "medium": ((((64, 100), (64, 29), (64, 129)), -1), (((30, 64, 7), (30, 64, 9)), 2)),
        "large": ((((512, 1024), (300, 1024), (211, 1024)), 0),),
    }[size]
    return _numbered(size, [({"xs": tuple(_normal(rng, s) for s in shapes)}, {"axis": axis}) for shapes, axis in cases])


def _concat_edges() -> list[base.Sample]:
    rng = base.seeded_rng("concat", "edge")
    return _edges(
        [
            ("edge-one-input", {"xs": (_normal(rng, (3, 37)),)}, {"axis": 1}),
            (
                "edge-zero-length-parts",
                {"xs": (np.zeros((2, 0), np.float32), _normal(rng, (2, 3)), np.zeros((2, 0), np.float32))},
                {"axis": 1},
            ),
            ("edge-all-empty", {"xs": (np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32))}, {"axis": 0}),
            (
                "edge-empty-other-axis",
                {"xs": (np.zeros((0, 2), np.float32), np.zeros((0, 3), np.float32))},
                {"axis": 1},
            ),
            ("edge-rank1", {"xs": (_normal(rng, (1,)), _normal(rng, (5,)))}, {"axis": -1}),
            ("edge-many", {"xs": tuple(_normal(rng, (2, k, 3)) for k in range(1, 10))}, {"axis": 1}),
            ("edge-special", {"xs": (_specials((7, 2)), _specials((7, 3))[::-1].copy())}, {"axis": 1}),
        ]
    )


def _concat_errors() -> list[base.ErrorCase]:
    a, b = np.zeros((2, 3), np.float32), np.zeros((3, 3), np.float32)
    return [
        _error("error-empty-list", {"xs": ()}, {"axis": 0}, ShapeError, r"concat: xs: must be a non-empty list"),
        _error(
            "error-shape-mismatch", {"xs": (a, a, b)}, {"axis": 1}, ShapeError, r"concat: xs\[2\]: must match xs\[0\]"
        ),
        _error(
            "error-rank-mismatch",
            {"xs": (a, np.zeros((2, 3, 1), np.float32))},
            {"axis": 0},
            ShapeError,
            r"xs\[1\]: must have the rank of xs\[0\]",
        ),
        _error("error-axis-range", {"xs": (a, a)}, {"axis": 2}, ParamError, r"concat: axis: must be in \[-2, 2\)"),
        _error(
            "error-rank0",
            {"xs": (base.f32(1.0), base.f32(2.0))},
            {"axis": 0},
            ParamError,
            r"concat: axis: .* for rank 0",
        ),
    ]


CONCAT = base.OpSpec(
    name="concat",
    family="view",
    inputs=(base.Tensor("xs", "list of (…), equal but along axis", variadic=True),),
    params=(base.Param("axis", "axis", doc="the axis joined along; negative counts from the end"),),
    shape_rule="xs[0].shape with axis summed over xs",
    shape=_concat_shape,
    forward=lambda a, p: np.concatenate(a["xs"], axis=p["axis"]),
    vjp=_concat_vjp,
    magnitude=lambda a, p, y: _abs(y),
    vjp_magnitude=lambda a, p, y, g: _concat_vjp(a, p, y, _abs(g)),
    error=COPY,
    vjp_error=COPY,
    cost=_copy_cost(_concat_shape),
    samples=_concat_samples,
    edges=_concat_edges,
    errors=_concat_errors,
    doc="concat(xs, axis): the inputs joined along axis; each input's gradient is its slice of g.",
)


# -- slice: a contiguous range along one axis -------------------------------------------------


def _slice_shape(shapes, p) -> tuple:
    x_shape = tuple(shapes["x"])
    axis = base.normalize_axis("slice", "axis", p["axis"], len(x_shape))
    start, length, size = p["start"], p["length"], x_shape[axis]
    if not 0 <= start <= size:
        raise ParamError("slice", "start", f"must be in [0, {size}] (the size of axis {axis} of x), got {start}")
    if length < 0:
        raise ParamError("slice", "length", f"must be >= 0, got {length}")
    if start + length > size:
        raise ParamError(
            "slice",
            "length",
            f"start + length must be <= {size} (the size of axis {axis} of x), got {start} + {length}",
        )
    return x_shape[:axis] + (length,) + x_shape[axis + 1 :]


def _range(p, rank: int) -> tuple:
    """The index tuple that selects the slice from an array of `rank`."""
    axis = p["axis"] % rank
    return (slice(None),) * axis + (slice(p["start"], p["start"] + p["length"]),)


def _slice_vjp(a, p, y, g) -> dict:
    dx = np.zeros(a["x"].shape, dtype=g.dtype)
    dx[_range(p, g.ndim)] = g
    return {"x": dx}


def _slice_samples(size: str, rng: np.random.Generator) -> list[base.Sample]:
    cases = {
        "small": (((4, 9), (1, 2, 5)), ((6, 5), (0, 0, 3)), ((2, 3, 7), (-1, 4, 3))),
        "medium": (((64, 129), (1, 17, 100)), ((30, 40, 50), (1, 3, 31))),
        "large": (((1024, 2047), (0, 100, 700)),),
    }[size]
    return _numbered(
        size, [({"x": _normal(rng, s)}, {"axis": ax, "start": st, "length": ln}) for s, (ax, st, ln) in cases]
    )


def _slice_edges() -> list[base.Sample]:
    rng = base.seeded_rng("slice", "edge")
    x = _normal(rng, (3, 37))
    return _edges(
        [
            ("edge-length0", {"x": x}, {"axis": 1, "start": 5, "length": 0}),
            ("edge-length0-at-end", {"x": x}, {"axis": 1, "start": 37, "length": 0}),
            ("edge-full-axis", {"x": x}, {"axis": 0, "start": 0, "length": 3}),
            ("edge-first", {"x": x}, {"axis": -1, "start": 0, "length": 1}),
            ("edge-last", {"x": x}, {"axis": -1, "start": 36, "length": 1}),
            ("edge-empty-other-axis", {"x": np.zeros((0, 5), np.float32)}, {"axis": 1, "start": 1, "length": 3}),
            ("edge-rank1", {"x": _normal(rng, (7,))}, {"axis": 0, "start": 2, "length": 4}),
            ("edge-special", {"x": _specials((3, 14))}, {"axis": 1, "start": 1, "length": 13}),
        ]
    )


def _slice_errors() -> list[base.ErrorCase]:
    x = np.zeros((4, 6), np.float32)

    def refused(case, axis, start, length, match):
        return _error(case, {"x": x}, {"axis": axis, "start": start, "length": length}, ParamError, match)

    return [
        refused("error-axis-range", 2, 0, 1, r"slice: axis: must be in \[-2, 2\)"),
        refused("error-start-negative", 1, -1, 2, r"slice: start: must be in \[0, 6\]"),
        refused("error-start-past-end", 1, 7, 0, r"slice: start: must be in \[0, 6\]"),
        refused("error-length-negative", 1, 2, -1, r"slice: length: must be >= 0"),
        refused("error-past-end", 0, 2, 3, r"slice: length: start \+ length must be <= 4"),
        _error(
            "error-rank0",
            {"x": base.f32(1.0)},
            {"axis": 0, "start": 0, "length": 1},
            ParamError,
            r"slice: axis: .* for rank 0",
        ),
    ]


SLICE = base.OpSpec(
    name="slice",
    family="view",
    inputs=(base.Tensor("x", "(…)"),),
    params=(
        base.Param("axis", "axis", doc="the sliced axis; negative counts from the end"),
        base.Param("start", "int", doc="first index taken, 0 <= start"),
        base.Param("length", "int", doc="how many indices, start + length <= size"),
    ),
    shape_rule="x.shape with axis replaced by length",
    shape=_slice_shape,
    forward=lambda a, p: a["x"][_range(p, a["x"].ndim)].copy(),
    vjp=_slice_vjp,
    magnitude=lambda a, p, y: _abs(y),
    vjp_magnitude=lambda a, p, y, g: _slice_vjp(a, p, y, _abs(g)),
    error=COPY,
    vjp_error=base.Exact("a copy into zeros"),
    cost=_copy_cost(_slice_shape),
    samples=_slice_samples,
    edges=_slice_edges,
    errors=_slice_errors,
    doc="slice(x, axis, start, length): x[..., start:start + length, ...] along axis.",
)

SPECS = (RESHAPE, PERMUTE, BROADCAST, CONCAT, SLICE)
