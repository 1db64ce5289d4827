"""The OpSpec: everything one op promises, in one place.

An OpSpec holds the signature, the parameter schema, the shape rule, the reference forward and
VJP (written once, dtype-generic: float64 makes the reference, float32 the numpy provider), the
magnitude companion of the error model, seeded sample / edge / error inputs and the cost model.
Engines (verify, fuzz, bench) only ever read OpSpecs; they hold no op-specific code.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from capsule_core.errors import InputError, ParamError, ShapeError

U = 2.0**-24
"""Unit roundoff of float32."""
TINY = 2.0**-126
"""Smallest normal float32: the absolute term that absorbs subnormal effects."""
LAMBDA = 10.0
"""Higham–Mary constant of the probabilistic accumulation bound."""

REQUIRED: Any = object()
"""Default of a parameter that has none."""

Arrays = Mapping[str, Any]
Params = Mapping[str, Any]
Shapes = Mapping[str, Any]


@dataclass(frozen=True)
class Tensor:
    """One input of an op. `rank` describes the shape for humans, e.g. "(…, D)"."""

    name: str
    rank: str
    dtype: str = "float32"
    differentiable: bool = True
    variadic: bool = False

    def __post_init__(self):
        if self.dtype not in ("float32", "int64"):
            raise ValueError(f"Tensor {self.name}: dtype must be float32 or int64")
        if self.dtype == "int64" and self.differentiable:
            raise ValueError(f"Tensor {self.name}: an int64 input cannot be differentiable")


PARAM_KINDS = ("float", "int", "axis", "axis_or_none", "shape", "perm", "per_axis", "seed")


@dataclass(frozen=True)
class Param:
    """One scalar or tuple parameter. `kind` picks the generic type check and normalisation:

    float (rounded to float32, must be finite), int, axis (int), axis_or_none, shape (tuple of
    ints), perm (tuple of ints), per_axis (int or tuple of ints, one per spatial axis), seed
    (int in [0, 2**64)). Range rules beyond the type live in the op's `shape` function.
    """

    name: str
    kind: str
    default: Any = REQUIRED
    doc: str = ""

    def __post_init__(self):
        if self.kind not in PARAM_KINDS:
            raise ValueError(f"Param {self.name}: kind must be one of {PARAM_KINDS}")

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


@dataclass(frozen=True)
class Sample:
    """A concrete input: arrays (float32 or int64; a tuple of arrays for a variadic input),
    parameters and a stable case id. `worst_case` selects the order-free worst-case bound
    (edge inputs, whose rounding errors may be correlated by design)."""

    inputs: Mapping[str, Any]
    params: Mapping[str, Any]
    case: str
    worst_case: bool = False

    def summary(self) -> str:
        parts = []
        for name, value in self.inputs.items():
            if isinstance(value, (tuple, list)):
                parts.append(f"{name}=[{', '.join(_shape_str(v) for v in value)}]")
            else:
                parts.append(f"{name}{_shape_str(value)}")
        parts += [f"{k}={v!r}" for k, v in self.params.items()]
        return f"{self.case}: " + " ".join(parts)


def _shape_str(a) -> str:
    return "(" + ",".join(str(d) for d in np.shape(a)) + ")"


@dataclass(frozen=True)
class ErrorCase:
    """An input the op must refuse: the error type and a regex its message must match
    (the message always names the argument)."""

    sample: Sample
    error: type[InputError]
    match: str


@dataclass(frozen=True)
class Cost:
    """What one forward call moves and computes (for bench)."""

    bytes_read: int
    bytes_written: int
    flops: int

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else 0.0


@dataclass(frozen=True)
class Exact:
    """Correctly rounded: the result must be bitwise float32(reference)."""

    why: str

    def describe(self) -> str:
        return f"exact: bitwise equal to float32(reference) ({self.why})"


@dataclass(frozen=True)
class Accumulation:
    """|y − r| ≤ c·u·M + c·2⁻¹²⁶ with c = k + λ√n (probabilistic) or k + n/(1 − n·u) (worst case).

    k counts roundings and library ulp errors along the formula; n(shapes, params) is the
    accumulation length (1 for a pointwise formula). `why` justifies k and n in one line.
    """

    k: float
    why: str
    n: Callable[[Shapes, Params], int] | None = None

    def length(self, shapes: Shapes, params: Params) -> int:
        return max(1, int(self.n(shapes, params))) if self.n is not None else 1

    def c(self, n: int, worst_case: bool) -> float:
        if worst_case:
            if n * U >= 1:
                return math.inf
            return self.k + n / (1 - n * U)
        return self.k + LAMBDA * math.sqrt(n)

    def describe(self) -> str:
        acc = "n = accumulation length" if self.n is not None else "n = 1"
        return f"|y-r| <= c*u*M + c*2^-126, c = {self.k:g} + 10*sqrt(n), {acc} ({self.why})"


ErrorModel = Exact | Accumulation


@dataclass(frozen=True)
class OpSpec:
    """One op's whole truth. Callables receive dicts of arrays keyed by input name (float
    arrays already in the working dtype, int64 index arrays) and a dict of normalised
    parameters (float parameters as the working dtype's scalar, already rounded to float32).

    shape(shapes, params) -> output shape; validates every shape and parameter rule.
    check_values(inputs, params) -> None; value-dependent rules (index ranges), optional.
    forward(inputs, params) -> y in the working dtype.
    vjp(inputs, params, y, g) -> {input: gradient} for exactly the differentiable inputs.
    magnitude(inputs, params, y) -> M (float64, shape of y): the formula on absolute values.
    vjp_magnitude(inputs, params, y, g) -> {input: M}.
    cost(shapes, params) -> Cost.
    samples(size, rng) -> [Sample] for size in small / medium / large.
    edges() -> [Sample]; errors() -> [ErrorCase].
    order_inputs() -> [Sample]: reduction.order's inputs, sums whose float32 value depends on the
    summation order (`order_terms` along the op's accumulation axis); None where none can be
    built (`no_order_inputs` says why).
    left_fold(inputs, params) -> y: the float32 left fold a fixed-left capsule must equal bitwise.
    """

    name: str
    family: str
    inputs: tuple[Tensor, ...]
    params: tuple[Param, ...]
    shape_rule: str
    shape: Callable[[Shapes, Params], tuple]
    forward: Callable[[Arrays, Params], Any]
    magnitude: Callable[[Arrays, Params, Any], Any]
    error: ErrorModel
    cost: Callable[[Shapes, Params], Cost]
    samples: Callable[[str, np.random.Generator], list[Sample]]
    edges: Callable[[], list[Sample]]
    errors: Callable[[], list[ErrorCase]]
    vjp: Callable[[Arrays, Params, Any, Any], dict] | None = None
    vjp_magnitude: Callable[[Arrays, Params, Any, Any], dict] | None = None
    vjp_error: ErrorModel | Mapping[str, ErrorModel] | None = None
    check_values: Callable[[Arrays, Params], None] | None = None
    order_inputs: Callable[[], list[Sample]] | None = None
    left_fold: Callable[[Arrays, Params], Any] | None = None
    doc: str = ""
    no_order_inputs: str = ""
    """Why reduction.order has no inputs for this op (when order_inputs is None)."""
    selection: str = ""
    """A selection op's rule for its winner ("first maximum in window order"): what selection.ties holds it to."""
    windows: Callable[[Arrays, Params], Any] | None = None
    """A selection op's windows: for each output element, the input cells it chooses among."""
    tie_cases: tuple[str, ...] = ()
    """The case ids whose windows hold ties: where selection.ties looks."""

    @property
    def differentiable(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.inputs if t.differentiable)

    @property
    def has_vjp(self) -> bool:
        return self.vjp is not None

    def vjp_error_for(self, name: str) -> ErrorModel:
        if isinstance(self.vjp_error, Mapping):
            return self.vjp_error[name]
        return self.vjp_error or self.error

    def signature(self) -> str:
        args = [f"{t.name}{'...' if t.variadic else ''}: {t.rank}" for t in self.inputs]
        for p in self.params:
            args.append(p.name if p.required else f"{p.name}={p.default!r}")
        return f"{self.name}({', '.join(args)}) -> y: {self.shape_rule}"


# -- validation: the runtime guard every backend calls before computing or launching --------


def normalize_params(spec: OpSpec, params: Params) -> dict:
    """Fill defaults, reject unknown or missing parameters, type-check each by its kind."""
    known = {p.name for p in spec.params}
    for name in params:
        if name not in known:
            allowed = ", ".join(sorted(known)) or "none"
            raise ParamError(spec.name, name, f"unknown parameter (allowed: {allowed})")
    out = {}
    for p in spec.params:
        if p.name in params:
            out[p.name] = _normalize_param(spec.name, p, params[p.name])
        elif p.required:
            raise ParamError(spec.name, p.name, "required parameter is missing")
        else:
            out[p.name] = p.default if p.default is None else _normalize_param(spec.name, p, p.default)
    return out


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _int_tuple(op: str, name: str, value, what: str) -> tuple[int, ...]:
    if _is_int(value) or not isinstance(value, (tuple, list)):
        raise ParamError(op, name, f"must be a tuple of ints ({what}), got {value!r}")
    if not all(_is_int(v) for v in value):
        raise ParamError(op, name, f"must be a tuple of ints ({what}), got {value!r}")
    return tuple(int(v) for v in value)


def _normalize_param(op: str, p: Param, value):
    if value is None and p.default is None:
        return None
    if p.kind == "float":
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise ParamError(op, p.name, f"must be a real number, got {value!r}")
        if not math.isfinite(float(value)):
            raise ParamError(op, p.name, f"must be finite, got {value!r}")
        with np.errstate(over="ignore"):
            rounded = float(np.float32(value))
        if not math.isfinite(rounded):
            raise ParamError(op, p.name, f"must be representable as float32, got {value!r}")
        return rounded
    if p.kind in ("int", "axis"):
        if not _is_int(value):
            raise ParamError(op, p.name, f"must be an int, got {value!r}")
        return int(value)
    if p.kind == "axis_or_none":
        if value is None:
            return None
        if not _is_int(value):
            raise ParamError(op, p.name, f"must be an int or None, got {value!r}")
        return int(value)
    if p.kind == "seed":
        if not _is_int(value) or not 0 <= int(value) < 2**64:
            raise ParamError(op, p.name, f"must be an int in [0, 2**64), got {value!r}")
        return int(value)
    if p.kind in ("shape", "perm"):
        return _int_tuple(op, p.name, value, p.kind)
    if p.kind == "per_axis":
        if _is_int(value):
            return int(value)
        return _int_tuple(op, p.name, value, "one per spatial axis")
    raise AssertionError(p.kind)


def check_input_names(spec: OpSpec, names) -> None:
    """Refuse an input the op does not take and a missing one (validate's rule, shared with
    callers that only have shapes, such as `capsules plan`)."""
    known = {t.name for t in spec.inputs}
    for name in names:
        if name not in known:
            raise ShapeError(spec.name, name, f"unknown input (inputs: {', '.join(sorted(known)) or 'none'})")
    for t in spec.inputs:
        if t.name not in names:
            raise ShapeError(spec.name, t.name, "required input is missing")


def as_input_arrays(spec: OpSpec, inputs: Arrays, dtype) -> dict:
    """Check input names, convert float inputs to `dtype` and index inputs to int64,
    contiguous (the flat row-major layout contract)."""
    check_input_names(spec, inputs)
    out = {}
    for t in spec.inputs:
        value = inputs[t.name]
        if t.variadic:
            if not isinstance(value, (tuple, list)) or len(value) == 0:
                raise ShapeError(spec.name, t.name, "must be a non-empty list of arrays")
            out[t.name] = tuple(_convert(spec.name, f"{t.name}[{i}]", t, v, dtype) for i, v in enumerate(value))
        else:
            out[t.name] = _convert(spec.name, t.name, t, value, dtype)
    return out


def _convert(op: str, name: str, t: Tensor, value, dtype):
    arr = np.asarray(value)
    if t.dtype == "int64":
        if arr.dtype.kind not in "iu":
            raise ShapeError(op, name, f"must be an integer array, got dtype {arr.dtype}")
        return np.array(arr, dtype=np.int64, order="C", copy=None)
    if arr.dtype.kind not in "fiub":
        raise ShapeError(op, name, f"must be a real array, got dtype {arr.dtype}")
    return np.array(arr, dtype=dtype, order="C", copy=None)


def shapes_of(inputs: Arrays) -> dict:
    return {k: (tuple(np.shape(a) for a in v) if isinstance(v, tuple) else np.shape(v)) for k, v in inputs.items()}


def validate(spec: OpSpec, inputs: Arrays, params: Params, dtype=np.float64):
    """The runtime guard: returns (arrays, params, output shape) or raises an InputError
    naming the op, the argument and the rule. Nothing is computed or launched before it."""
    p = normalize_params(spec, params)
    arrays = as_input_arrays(spec, inputs, dtype)
    out_shape = tuple(spec.shape(shapes_of(arrays), p))
    if spec.check_values is not None:
        spec.check_values(arrays, p)
    return arrays, p, out_shape


DTYPE = "dtype"
"""Reserved key of the working parameters: the working dtype, for ops with no input to read it from."""


def working_params(params: Params, dtype) -> dict:
    """Float parameters as scalars of the working dtype (values already rounded to float32),
    plus the working dtype itself under DTYPE."""
    out = {k: (dtype(v) if isinstance(v, float) else v) for k, v in params.items()}
    out[DTYPE] = np.dtype(dtype)
    return out


# -- shared helpers for op modules ---------------------------------------------------------


def require_rank(op: str, name: str, shape: Sequence[int], min_rank: int = 0, max_rank: int | None = None):
    r = len(shape)
    if r < min_rank or (max_rank is not None and r > max_rank):
        want = (
            f"rank {min_rank}"
            if max_rank == min_rank
            else (f"rank >= {min_rank}" if max_rank is None else f"rank {min_rank} to {max_rank}")
        )
        raise ShapeError(op, name, f"must have {want}, got shape {tuple(shape)}")


def require_same_shape(op: str, name: str, shape, other_name: str, other_shape):
    if tuple(shape) != tuple(other_shape):
        raise ShapeError(op, name, f"must have the shape of {other_name} {tuple(other_shape)}, got {tuple(shape)}")


def normalize_axis(op: str, name: str, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ParamError(op, name, f"must be in [{-rank}, {rank}) for rank {rank}, got {axis}")
    return axis % rank


def numel(shape) -> int:
    return int(np.prod(shape, dtype=np.int64)) if len(shape) else 1


def seeded_rng(op: str, case: str, seed: int = 0) -> np.random.Generator:
    """A generator that depends only on (op, case, seed): cases are reproducible by id."""
    key = np.frombuffer(f"{op}/{case}".encode(), dtype=np.uint8).astype(np.uint64)
    return np.random.default_rng([seed, *key.tolist()])


_SIZED: OrderedDict = OrderedDict()
SIZED_KEPT = 4
"""(op, size, seed) draws sized_samples keeps: the sizes of the capsule being checked and verified."""


def sized_samples(spec: OpSpec, size: str, seed: int = 0) -> list[Sample]:
    """spec.samples(size) drawn from seeded_rng(op, size, seed), kept for the last few asked:
    check's launch plans and verify's cases of one capsule draw the same inputs, and a large
    sample takes up to 40 ms to draw. Their arrays are read-only, because every caller shares them."""
    key = (spec.name, size, seed)
    kept = _SIZED.get(key)
    if kept is None or kept[0] is not spec:
        samples = spec.samples(size, seeded_rng(spec.name, size, seed))
        for sample in samples:
            for value in sample.inputs.values():
                for a in value if isinstance(value, (tuple, list)) else (value,):
                    if isinstance(a, np.ndarray):
                        a.flags.writeable = False
        kept = _SIZED[key] = (spec, tuple(samples))
        while len(_SIZED) > SIZED_KEPT:
            _SIZED.popitem(last=False)
    _SIZED.move_to_end(key)
    return list(kept[1])


def f32(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32)


def zeros_error_case(case: str, shapes: Mapping[str, Any], error: type[InputError], match: str, params=None):
    """An ErrorCase whose inputs are float32 zeros of `shapes` (in that order): for a rule on shapes
    or parameters, where the values do not matter."""
    inputs = {name: np.zeros(shape, np.float32) for name, shape in shapes.items()}
    return ErrorCase(Sample(inputs, {} if params is None else params, case), error, match)


def absolute_inputs(arrays: Arrays) -> dict:
    """Every input as |v| in float64: the operands of a formula evaluated on absolute values (M)."""
    return {name: np.abs(np.asarray(v, dtype=np.float64)) for name, v in arrays.items()}


def on_absolute_values(forward: Callable[[Arrays, Params], Any]) -> Callable[[Arrays, Params, Any], Any]:
    """The magnitude M of a formula that is a sum of products (no cancellation of its own to
    bound): the formula itself on |inputs|."""
    return lambda a, p, y: forward(absolute_inputs(a), p)


def vjp_on_absolute_values(
    vjp: Callable[[Arrays, Params, Any, Any], dict],
) -> Callable[[Arrays, Params, Any, Any], dict]:
    """vjp_magnitude for a VJP that is a sum of products and does not read y: the VJP itself on
    |inputs| and |g|."""
    return lambda a, p, y, g: vjp(absolute_inputs(a), p, None, np.abs(np.asarray(g, dtype=np.float64)))


SPECIAL_VALUES = np.array(
    [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 1e-45, -1e-45, 1.1754942e-38, 3e38, -3e38, 0.5, 2.0],
    dtype=np.float32,
)
"""NaN, ±inf, ±0, ±1, subnormals, the largest normals: the values edge inputs draw from."""


ORDER_LENGTH = 4099
"""Terms of an order input's sum: past 4096 (several blocks, warps and tiles), not a power of two."""


def order_terms(n: int = ORDER_LENGTH, signed: bool = True) -> dict[str, np.ndarray]:
    """reduction.order's sequences (design §4), float32, by order: large terms among n − 2 ones.

    signed: 2²⁴, 1, …, 1, −2²⁴ (the exact sum n − 2; a float32 left fold loses every 1 and
    gives 0); for sums of non-negative terms (squares, exponentials): 2²⁴, 1, …, 1 (n − 1 ones,
    all lost by a left fold). In three orders: "descending" (the sequence as written), its
    reverse "ascending", and "spread" (the large terms at n/3 and 2n/3 among the ones), so
    that every summation tree meets the cancellation somewhere else.
    """
    big = 2.0**24
    descending = np.ones(n, np.float32)
    descending[0] = big
    if signed:
        descending[-1] = -big
    spread = np.ones(n, np.float32)
    spread[n // 3] = big
    if signed:
        spread[2 * n // 3] = -big
    return {"descending": descending, "ascending": descending[::-1].copy(), "spread": spread}
