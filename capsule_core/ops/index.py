"""Index ops: gather and scatter_add along one axis with a 1-D int64 index.

Indices outside [0, size) are refused on the host (IndexRangeError; no wraparound, **differs**
from TorchLean, which gathers 0 and skips such scatters). Gather copies (Exact); wherever an index
repeats, values accumulate (gather's VJP, scatter_add's forward) in an implementation-defined
order, so those are Accumulations. Scatter-adds use np.add.at, which is vectorised in numpy 2.
"""

from __future__ import annotations

import numpy as np

from capsule_core.errors import IndexRangeError, ParamError, ShapeError
from capsule_core.ops import base as op_base

COPY = op_base.Exact("a copy: values move, nothing is computed")
INDEX = op_base.Tensor("index", "(K,)", dtype="int64", differentiable=False)
AXIS = op_base.Param("axis", "axis", doc="the indexed axis; negative counts from the end")


def _normal(rng: np.random.Generator, shape) -> np.ndarray:
    return op_base.f32(2.0 * rng.standard_normal(shape))


def _abs(a) -> np.ndarray:
    return np.abs(np.asarray(a, dtype=np.float64))


def _numbered(prefix: str, cases) -> list[op_base.Sample]:
    return [op_base.Sample(inputs, params, f"{prefix}-{i}") for i, (inputs, params) in enumerate(cases)]


def _edges(cases) -> list[op_base.Sample]:
    return [op_base.Sample(inputs, params, case, True) for case, inputs, params in cases]


def _error(case: str, inputs: dict, params: dict, error, match: str) -> op_base.ErrorCase:
    return op_base.ErrorCase(op_base.Sample(inputs, params, case), error, match)


def _index_axis(op: str, data: str, shapes, p) -> int:
    """Check the shared rules (index 1-D, axis within data's rank) and return the axis."""
    op_base.require_rank(op, "index", shapes["index"], 1, 1)
    return op_base.normalize_axis(op, "axis", p["axis"], len(shapes[data]))


def _check_index(op: str, data: str):
    """check_values: every index entry in [0, size of the axis)."""

    def check_values(inputs, p):
        index, shape = inputs["index"], inputs[data].shape
        axis = p["axis"] % len(shape)
        outside = (index < 0) | (index >= shape[axis])
        if outside.any():
            j = int(np.argmax(outside))
            raise IndexRangeError(
                op,
                "index",
                f"entries must be in [0, {shape[axis]}) (the size of axis {axis} "
                f"of {data}), got index[{j}] = {int(index[j])}",
            )

    return check_values


def _with_axis(shape: tuple, axis: int, size: int) -> tuple:
    return tuple(shape[:axis]) + (size,) + tuple(shape[axis + 1 :])


def scatter_add_into(out: np.ndarray, index: np.ndarray, src: np.ndarray, axis: int) -> np.ndarray:
    """out[..., index[j], ...] += src[..., j, ...] along axis, repeats accumulating; returns out."""
    np.add.at(np.moveaxis(out, axis, 0), index, np.moveaxis(src, axis, 0))
    return out


def _index_samples(data_shapes, build):
    """Samples from (data shape, index length, axis) rows: index drawn uniformly in range."""

    def samples(size: str, rng: np.random.Generator) -> list[op_base.Sample]:
        cases = []
        for shape, k, axis in data_shapes[size]:
            index = rng.integers(0, shape[axis], k)
            cases.append(build(rng, shape, index, axis))
        return _numbered(size, cases)

    return samples


SHAPES = {
    "small": (((5, 6), 4, 0), ((3, 7), 9, 1), ((2, 4, 3), 5, -2)),
    "medium": (((300, 129), 500, 0), ((64, 129), 200, -1)),
    "large": (((2000, 1024), 1500, 0),),
}
"""(data shape, len(index), axis) per sample size; small indices repeat by construction."""


# -- gather: take along an axis ----------------------------------------------------------------


def _gather_shape(shapes, p) -> tuple:
    axis = _index_axis("gather", "x", shapes, p)
    return _with_axis(shapes["x"], axis, shapes["index"][0])


def _gather_vjp(a, p, y, g) -> dict:
    x = a["x"]
    return {"x": scatter_add_into(np.zeros(x.shape, dtype=g.dtype), a["index"], g, p["axis"] % x.ndim)}


def _gather_build(rng, shape, index, axis):
    return {"x": _normal(rng, shape), "index": index}, {"axis": axis}


def _gather_edges() -> list[op_base.Sample]:
    rng = op_base.seeded_rng("gather", "edge")
    x = _normal(rng, (7, 5))
    return _edges(
        [
            ("edge-empty-index", {"x": x, "index": np.zeros(0, np.int64)}, {"axis": 0}),
            ("edge-empty-axis", {"x": np.zeros((0, 3), np.float32), "index": np.zeros(0, np.int64)}, {"axis": 0}),
            ("edge-empty-rows", {"x": np.zeros((4, 0), np.float32), "index": np.array([1, 3, 3])}, {"axis": 0}),
            ("edge-first-last", {"x": x, "index": np.array([0, 6, 0, 6])}, {"axis": 0}),
            ("edge-one-repeated", {"x": x, "index": np.full(1000, 4)}, {"axis": -1}),
            ("edge-size1", {"x": op_base.f32([[2.5]]), "index": np.array([0])}, {"axis": 1}),
            ("edge-rank1-odd", {"x": _normal(rng, (37,)), "index": rng.integers(0, 37, 101)}, {"axis": 0}),
            (
                "edge-special",
                {"x": np.resize(op_base.SPECIAL_VALUES, (3, 14)), "index": np.array([13, 0, 4, 4, 7, 1])},
                {"axis": 1},
            ),
        ]
    )


def _gather_errors() -> list[op_base.ErrorCase]:
    x = np.zeros((4, 5), np.float32)
    return [
        _error(
            "error-index-high",
            {"x": x, "index": np.array([0, 5])},
            {"axis": 1},
            IndexRangeError,
            r"gather: index: entries must be in \[0, 5\).*index\[1\] = 5",
        ),
        _error(
            "error-index-negative",
            {"x": x, "index": np.array([2, -1])},
            {"axis": 0},
            IndexRangeError,
            r"gather: index: entries must be in \[0, 4\).*index\[1\] = -1",
        ),
        _error(
            "error-index-on-empty-axis",
            {"x": np.zeros((0, 3), np.float32), "index": np.array([0])},
            {"axis": 0},
            IndexRangeError,
            r"gather: index: entries must be in \[0, 0\)",
        ),
        _error(
            "error-index-2d",
            {"x": x, "index": np.zeros((2, 2), np.int64)},
            {"axis": 0},
            ShapeError,
            r"gather: index: must have rank 1",
        ),
        _error(
            "error-index-float",
            {"x": x, "index": np.array([0.0, 1.0])},
            {"axis": 0},
            ShapeError,
            r"gather: index: must be an integer array",
        ),
        _error(
            "error-axis-range",
            {"x": x, "index": np.array([0])},
            {"axis": -3},
            ParamError,
            r"gather: axis: must be in \[-2, 2\)",
        ),
    ]


GATHER = op_base.OpSpec(
    name="gather",
    family="index",
    inputs=(op_base.Tensor("x", "(…)"), INDEX),
    params=(AXIS,),
    shape_rule="x.shape with axis replaced by len(index)",
    shape=_gather_shape,
    check_values=_check_index("gather", "x"),
    forward=lambda a, p: np.take(a["x"], a["index"], axis=p["axis"]),
    vjp=_gather_vjp,
    magnitude=lambda a, p, y: _abs(y),
    vjp_magnitude=lambda a, p, y, g: _gather_vjp(a, p, y, _abs(g)),
    error=COPY,
    vjp_error=op_base.Accumulation(
        1,
        "g scatter-added back: an element sums its repeats, at most len(index) terms; k = 1 spare rounding",
        lambda shapes, p: shapes["index"][0],
    ),
    # reads the gathered elements and the index, writes y; no arithmetic
    cost=lambda shapes, p: op_base.Cost(
        bytes_read=4 * op_base.numel(_gather_shape(shapes, p)) + 8 * shapes["index"][0],
        bytes_written=4 * op_base.numel(_gather_shape(shapes, p)),
        flops=0,
    ),
    samples=_index_samples(SHAPES, _gather_build),
    edges=_gather_edges,
    errors=_gather_errors,
    doc="gather(x, index, axis): np.take along axis; the gradient scatter-adds g back (repeats accumulate).",
)


# -- scatter_add: base plus src accumulated at index ----------------------------------------


def _scatter_shape(shapes, p) -> tuple:
    axis = _index_axis("scatter_add", "base", shapes, p)
    base = tuple(shapes["base"])
    want = _with_axis(base, axis, shapes["index"][0])
    if tuple(shapes["src"]) != want:
        raise ShapeError(
            "scatter_add",
            "src",
            f"must have the shape of base {base} with axis {axis} replaced "
            f"by len(index): {want}, got {tuple(shapes['src'])}",
        )
    return base


def _scatter_forward(a, p) -> np.ndarray:
    base = a["base"]
    return scatter_add_into(base.copy(), a["index"], a["src"], p["axis"] % base.ndim)


def _scatter_magnitude(a, p, y) -> np.ndarray:
    return _scatter_forward({"base": _abs(a["base"]), "index": a["index"], "src": _abs(a["src"])}, p)


def _scatter_vjp(a, p, y, g) -> dict:
    return {"base": g.copy(), "src": np.take(g, a["index"], axis=p["axis"])}


def _scatter_build(rng, shape, index, axis):
    src = _normal(rng, _with_axis(shape, axis % len(shape), len(index)))
    return {"base": _normal(rng, shape), "index": index, "src": src}, {"axis": axis}


def _scatter_edges() -> list[op_base.Sample]:
    rng = op_base.seeded_rng("scatter_add", "edge")
    base = _normal(rng, (7, 5))
    # NaN, ±inf, ±0, subnormals, ±1 on both sides; not the largest normals, whose float32 sum
    # overflows where float64's does not (an overflow no error model can bound)
    safe = op_base.SPECIAL_VALUES[np.abs(np.nan_to_num(op_base.SPECIAL_VALUES)) < 1e38]
    special_index = rng.integers(0, 14, 2 * safe.size)
    return _edges(
        [
            (
                "edge-empty-index",
                {"base": base, "index": np.zeros(0, np.int64), "src": np.zeros((7, 0), np.float32)},
                {"axis": 1},
            ),
            (
                "edge-empty-axis",
                {
                    "base": np.zeros((0, 3), np.float32),
                    "index": np.zeros(0, np.int64),
                    "src": np.zeros((0, 3), np.float32),
                },
                {"axis": 0},
            ),
            (
                "edge-empty-rows",
                {
                    "base": np.zeros((0, 4), np.float32),
                    "index": np.array([1, 3, 3]),
                    "src": np.zeros((0, 3), np.float32),
                },
                {"axis": 1},
            ),
            (
                "edge-first-last",
                {"base": base, "index": np.array([0, 6, 0, 6]), "src": _normal(rng, (4, 5))},
                {"axis": 0},
            ),
            (
                "edge-one-repeated",
                {"base": base, "index": np.full(1000, 4), "src": _normal(rng, (7, 1000))},
                {"axis": -1},
            ),
            (
                "edge-size1",
                {"base": op_base.f32([[2.5]]), "index": np.array([0]), "src": op_base.f32([[-0.75]])},
                {"axis": 1},
            ),
            (
                "edge-rank1-odd",
                {"base": _normal(rng, (37,)), "index": rng.integers(0, 37, 101), "src": _normal(rng, (101,))},
                {"axis": 0},
            ),
            (
                "edge-special",
                {
                    "base": np.resize(op_base.SPECIAL_VALUES, (2, 14)),
                    "index": special_index,
                    "src": np.resize(safe, (2, special_index.size)),
                },
                {"axis": 1},
            ),
        ]
    )


def _scatter_order_inputs() -> list[op_base.Sample]:
    """Every src entry of a row scattered to the same element (base 0): each output is the sum
    of one order of order_terms, in whatever order the kernel's adds land."""
    src = np.stack(list(op_base.order_terms().values()))
    inputs = {"base": np.zeros((3, 1), np.float32), "index": np.zeros(src.shape[1], np.int64), "src": src}
    return [op_base.Sample(inputs, {"axis": 1}, "order-one-element", True)]


def _scatter_errors() -> list[op_base.ErrorCase]:
    base, src = np.zeros((4, 5), np.float32), np.zeros((4, 2), np.float32)
    return [
        _error(
            "error-src-shape",
            {"base": base, "index": np.array([0, 1]), "src": np.zeros((4, 3), np.float32)},
            {"axis": 1},
            ShapeError,
            r"scatter_add: src: must have the shape of base",
        ),
        _error(
            "error-src-rank",
            {"base": base, "index": np.array([0, 1]), "src": np.zeros((4, 2, 1), np.float32)},
            {"axis": 1},
            ShapeError,
            r"scatter_add: src: must have the shape of base",
        ),
        _error(
            "error-index-high",
            {"base": base, "index": np.array([0, 5]), "src": src},
            {"axis": 1},
            IndexRangeError,
            r"scatter_add: index: entries must be in \[0, 5\).*index\[1\] = 5",
        ),
        _error(
            "error-index-negative",
            {"base": base, "index": np.array([-1, 2]), "src": src},
            {"axis": 1},
            IndexRangeError,
            r"scatter_add: index: entries must be in \[0, 5\).*index\[0\] = -1",
        ),
        _error(
            "error-index-2d",
            {"base": base, "index": np.zeros((1, 2), np.int64), "src": src},
            {"axis": 1},
            ShapeError,
            r"scatter_add: index: must have rank 1",
        ),
        _error(
            "error-index-float",
            {"base": base, "index": np.array([0.0, 1.0]), "src": src},
            {"axis": 1},
            ShapeError,
            r"scatter_add: index: must be an integer array",
        ),
        _error(
            "error-axis-range",
            {"base": base, "index": np.array([0, 1]), "src": src},
            {"axis": 2},
            ParamError,
            r"scatter_add: axis: must be in \[-2, 2\)",
        ),
    ]


SCATTER_ADD = op_base.OpSpec(
    name="scatter_add",
    family="index",
    inputs=(op_base.Tensor("base", "(…)"), INDEX, op_base.Tensor("src", "base's shape with axis = K")),
    params=(AXIS,),
    shape_rule="shape of base",
    shape=_scatter_shape,
    check_values=_check_index("scatter_add", "base"),
    forward=_scatter_forward,
    vjp=_scatter_vjp,
    magnitude=_scatter_magnitude,
    vjp_magnitude=lambda a, p, y, g: _scatter_vjp(a, p, y, _abs(g)),
    # n = len(index) + 1 bounds (largest repeat count) + 1, the true length of an element's sum;
    # n(shapes, params) cannot see the index values, so it takes the bound every index obeys
    error=op_base.Accumulation(
        1,
        "base plus the src values scattered to one element, at most len(index) + 1 terms "
        "in any order; k = 1 spare rounding",
        lambda shapes, p: shapes["index"][0] + 1,
    ),
    vjp_error={"base": op_base.Exact("g copied"), "src": op_base.Exact("g gathered: a copy")},
    # copies base, reads src and the index, one add per src element
    cost=lambda shapes, p: op_base.Cost(
        bytes_read=4 * (op_base.numel(shapes["base"]) + op_base.numel(shapes["src"])) + 8 * shapes["index"][0],
        bytes_written=4 * op_base.numel(shapes["base"]),
        flops=op_base.numel(shapes["src"]),
    ),
    samples=_index_samples(SHAPES, _scatter_build),
    edges=_scatter_edges,
    errors=_scatter_errors,
    order_inputs=_scatter_order_inputs,
    doc="scatter_add(base, index, src, axis): y = base; y[..., index[j], ...] += src[..., j, ...].",
)

SPECS = (GATHER, SCATTER_ADD)
