"""`capsules fuzz`: Hypothesis searches each capsule's input space for a contract violation.

Strategies come from the OpSpec alone (no op-specific code here): the op's own small samples,
edges and error inputs are the templates, so shape rules such as conv's channels or matmul's
inner dimension stay satisfiable; every distinct dimension of a template can be remapped (the
same value everywhere it appears, shape parameters included), values redrawn from ordinary to
extreme, index entries redrawn with repeats and out-of-range entries, rows blocked, parameters
moved across and beyond their valid ranges, and inputs broken on purpose (wrong rank, missing,
unknown or mistyped inputs and parameters).

Each example is first judged by the runtime guard `validate`. An input it refuses must be
refused by the backend with the same InputError type naming the same argument, before any
launch; any other outcome (a crash, another error, a silent result) is a failure. An input it
accepts runs the checks of verify (value or value.special, vjp, bounds, inputs.intact,
determinism) on that one case under the worst-case bound c = k + n/(1 − n·u) (design §4),
through verify's own comparison code. Hypothesis shrinks the first failure of a capsule; the
result is a typed FuzzReport (nothing here prints); `write_replay` saves a failure as a replay
file (docs/fuzz-replay.md) that `replay` reruns exactly.

Elements outside the error model's domain (their float32 intermediates overflow) are counted,
not compared, by the same rule as verify's (numerics.out_of_model).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from hypothesis import HealthCheck, Phase, Verbosity, given, reject, settings, target
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from hypothesis.extra.numpy import arrays

from capsule_core.backends.execution import SENTINEL, GuardedOutput
from capsule_core.errors import CapsuleError, InputError
from capsule_core.model import KernelCapsule
from capsule_core.ops import get_spec
from capsule_core.ops.base import OpSpec, Sample, numel, seeded_rng, shapes_of, validate
from capsule_core.verify.engine import Session, Status, StoppableRun, interrupted_exit_code
from capsule_core.verify.numerics import FLT_MAX

MAX_ELEMENTS = 1 << 16
"""Memory budget of one example: input elements in all (remapped dimensions are halved to fit)."""
MAX_FLOPS = 2e6
"""Compute budget of one example, from the op's cost model (larger examples are rejected)."""
SHRINK_SECONDS = 20.0
"""At least this long for shrinking a failure, even past the capsule's share of the time."""
CASE = "fuzz"
"""The case id of every fuzz example: the cotangent is seeded from (op, case, seed) and shape."""

SIZES = (0, 1, 2, 3, 5, 7, 13, 31, 37, 127, 4099)
"""Dimension sizes a remap favours: empty, one, primes, odd, large."""
TIES = (0.0, 1.0, -1.0, 0.5, 2.0, -2.0, 0.25, 3.0)
"""A small value set: arrays drawn from it are full of ties."""
EXTREMES = (
    math.nan,
    math.inf,
    -math.inf,
    -0.0,
    1e-45,
    -1e-45,
    1e-40,
    1.1754942e-38,
    -1.1754942e-38,
    3e38,
    -3e38,
    FLT_MAX,
    -FLT_MAX,
    0.0,
    1.0,
)
"""Values sprinkled into template arrays: NaN, ±inf, −0, subnormals, the largest normals."""
FLOAT_PARAMS = (
    0.0,
    -0.0,
    1e-50,
    1e-45,
    1e-6,
    0.5,
    1.0,
    2.0,
    -1.0,
    -3.0,
    50.0,
    1e4,
    3e38,
    1e39,
    math.nan,
    math.inf,
    -math.inf,
)
"""Float parameter values across and beyond their ranges (1e39 is not a float32, 1e-50 rounds to 0)."""


# -- the example and what running it gave -------------------------------------------------


@dataclass(frozen=True)
class Example:
    """One drawn input: arrays (a tuple for a variadic input), parameters, and where it came
    from (the template and the mutations applied), for messages."""

    inputs: dict
    params: dict
    origin: str = ""

    def sample(self) -> Sample:
        return Sample(self.inputs, self.params, CASE, worst_case=True)

    def summary(self) -> str:
        return self.sample().summary().split(": ", 1)[1]

    def elements(self) -> int:
        return sum(int(np.size(a)) for v in self.inputs.values() for a in (v if isinstance(v, (tuple, list)) else (v,)))


@dataclass(frozen=True)
class Outcome:
    """What one example gave. `failure` is (check, status, detail) or None."""

    valid: bool
    failure: tuple[str, str, str] | None = None
    worst: float = 0.0
    out_of_model: bool = False
    too_large: bool = False


@dataclass(frozen=True)
class Failure:
    """A shrunk failure: the check that failed, its status (FAILED or ERROR) and message, the
    example, the seed, and whether a rerun of the same example behaved differently (flaky)."""

    capsule: str
    op: str
    check: str
    status: str
    detail: str
    example: Example
    seed: int
    backend: str
    flaky: bool = False


@dataclass
class CapsuleFuzz:
    """The fuzzing of one capsule. `examples` counts the accepted inputs checked, `refused` the
    invalid inputs correctly refused (both before any failure), `shrink_steps` the calls spent
    shrinking; `out_of_model` the examples with elements outside the error model's domain,
    `rejected` those over the memory or compute budget."""

    capsule: str
    op: str
    examples: int = 0
    refused: int = 0
    out_of_model: int = 0
    rejected: int = 0
    shrink_steps: int = 0
    seconds: float = 0.0
    stopped: str = ""
    failure: Failure | None = None
    skipped: str = ""
    poisoned: bool = False
    error: str = ""

    @property
    def status(self) -> str:
        if self.failure is not None:
            return self.failure.status
        if self.error:
            return "ERROR"
        return "SKIPPED" if self.skipped else "PASSED"


@dataclass
class FuzzReport(StoppableRun):
    backend: str
    backend_note: str
    seed: int
    time_budget: float | None
    max_examples: int | None
    capsules: list[CapsuleFuzz] = field(default_factory=list)
    interrupted: bool = False
    stopped_by: str = ""
    """The signal that interrupted the run (SIGINT, SIGTERM, SIGHUP)."""
    not_run: list[str] = field(default_factory=list)
    poisoned: bool = False
    seconds: float = 0.0

    @property
    def failures(self) -> list[Failure]:
        return [c.failure for c in self.capsules if c.failure is not None]

    @property
    def exit_code(self) -> int:
        """128 + the signal's number after an interruption, 1 on a failure, an error or a poisoned
        context, else 0."""
        if self.interrupted:
            return interrupted_exit_code(self.stopped_by)
        broken = any(c.error for c in self.capsules)
        return 1 if self.failures or broken or self.poisoned else 0


# -- strategies derived from the OpSpec -----------------------------------------------------


@dataclass(frozen=True)
class ValuePolicy:
    """Which special values the op's policy states: those its own edge inputs exercise. An op
    whose edges hold no NaN states nothing about NaN (conv may skip padded cells, where 0·NaN
    would differ); max_pool's edges leave out −0 (a ±0 tie has no defined winner sign)."""

    nan: bool
    inf: bool
    negative_zero: bool

    @staticmethod
    def of(spec: OpSpec) -> ValuePolicy:
        nan = inf = negative_zero = False
        for sample in spec.edges():
            for a in _arrays_of(sample.inputs):
                if a.dtype.kind != "f" or not a.size:
                    continue
                nan = nan or bool(np.isnan(a).any())
                inf = inf or bool(np.isinf(a).any())
                negative_zero = negative_zero or bool(((a == 0) & np.signbit(a)).any())
        return ValuePolicy(nan, inf, negative_zero)

    def extremes(self) -> tuple[float, ...]:
        return tuple(
            v
            for v in EXTREMES
            if (self.nan or not math.isnan(v))
            and (self.inf or not math.isinf(v))
            and (self.negative_zero or not (v == 0 and math.copysign(1, v) < 0))
        )

    def clean(self, a: np.ndarray) -> np.ndarray:
        """−0 → +0 where the policy states nothing about it; NaNs carrying the bits of the
        unwritten-element sentinel (either sign) → the canonical NaN, so a copy of an input can
        never look unwritten."""
        if a.dtype != np.float32 or not a.size:
            return a
        a = a.copy()
        bits = a.reshape(-1).view(np.uint32)
        bits[(bits & np.uint32(0x7FFFFFFF)) == np.uint32(SENTINEL)] = np.uint32(0x7FC00000)
        if not self.negative_zero:
            a[(a == 0) & np.signbit(a)] = 0.0
        return a


def _arrays_of(inputs: dict) -> list[np.ndarray]:
    out = []
    for v in inputs.values():
        for a in v if isinstance(v, (tuple, list)) else (v,):
            out.append(np.asarray(a))
    return out


def _size_of(sample: Sample, spec: OpSpec) -> int:
    """Input elements, or the output elements of an op without inputs (its shape parameter)."""
    size = sum(int(a.size) for a in _arrays_of(sample.inputs))
    for p in spec.params:
        value = sample.params.get(p.name)
        if p.kind == "shape" and isinstance(value, (tuple, list)) and all(isinstance(d, int) and d >= 0 for d in value):
            size += numel(tuple(value))
    return size


def templates(spec: OpSpec) -> list[Sample]:
    """The op's small samples and edges within the memory budget, smallest first (so that a
    failure shrinks towards the smallest template that still fails)."""
    found = spec.samples("small", seeded_rng(spec.name, "small", 0)) + spec.edges()
    found = [s for s in found if _size_of(s, spec) <= MAX_ELEMENTS]
    return sorted(found, key=lambda s: _size_of(s, spec))


def _dims(sample: Sample, spec: OpSpec) -> list[int]:
    """Every distinct dimension of the template: the axes of its arrays and the non-negative
    entries of its shape parameters."""
    dims = {int(d) for a in _arrays_of(sample.inputs) for d in a.shape}
    for p in spec.params:
        value = sample.params.get(p.name)
        if p.kind == "shape" and isinstance(value, (tuple, list)):
            dims |= {int(d) for d in value if isinstance(d, (int, np.integer)) and d >= 0}
    return sorted(dims)


def _fit(remap: dict, sample: Sample, spec: OpSpec) -> None:
    """Halve the largest remapped dimension until the example fits the memory budget."""

    def size():  # Python integers: a rank-9 template remapped to 4099 would overflow int64
        total = sum(math.prod(remap.get(int(d), int(d)) for d in a.shape) for a in _arrays_of(sample.inputs))
        for p in spec.params:
            value = sample.params.get(p.name)
            if (
                p.kind == "shape"
                and isinstance(value, (tuple, list))
                and all(isinstance(d, (int, np.integer)) and d >= 0 for d in value)
            ):
                total += math.prod(remap.get(int(d), int(d)) for d in value)
        return total

    while size() > MAX_ELEMENTS:
        big = max(remap, key=lambda d: remap[d])
        if remap[big] <= 1:
            break
        remap[big] //= 2


class ExampleStrategy:
    """The Hypothesis strategy of one op's examples (see the module docstring)."""

    def __init__(self, spec: OpSpec):
        self.spec = spec
        self.tensors = {t.name: t for t in spec.inputs}
        self.policy = ValuePolicy.of(spec)
        self.templates = templates(spec)
        self.error_templates = [e.sample for e in spec.errors()]
        ordinary = st.floats(-8.0, 8.0, width=32)
        wide = st.floats(width=32, allow_nan=self.policy.nan, allow_infinity=self.policy.inf)
        self.elements = st.one_of(st.sampled_from(TIES), ordinary, wide)
        self.size = st.one_of(st.sampled_from(SIZES), st.integers(0, 64), st.integers(65, 4099))

    def strategy(self):
        return st.composite(self._draw)()

    # -- one example ------------------------------------------------------------------------

    def _draw(self, draw) -> Example:
        spec = self.spec
        from_errors = bool(self.error_templates) and draw(st.integers(0, 9)) >= 8
        template = draw(st.sampled_from(self.error_templates if from_errors else self.templates))
        origin = [template.case]
        remap: dict[int, int] = {}
        dims = _dims(template, spec)
        if dims and draw(st.booleans()):
            for d in dims:
                if draw(st.booleans()):
                    remap[d] = draw(self.size)
            _fit(remap, template, spec)
            changed = {d: n for d, n in remap.items() if d != n}
            if changed:
                origin.append("dims " + ", ".join(f"{d}->{n}" for d, n in sorted(changed.items())))

        def reshaped(shape):
            return tuple(remap.get(int(d), int(d)) for d in shape)

        float_dims = sorted(
            {
                (int(d), remap.get(int(d), int(d)))
                for a in _arrays_of(template.inputs)
                if a.dtype.kind == "f"
                for d in a.shape
            }
        )
        inputs = {}
        for name, value in template.inputs.items():
            if isinstance(value, (tuple, list)):
                parts = [
                    self._array(draw, name, np.asarray(v), reshaped(np.shape(v)), float_dims, origin) for v in value
                ]
                if parts and draw(st.integers(0, 5)) == 5:
                    if len(parts) > 1 and draw(st.booleans()):
                        parts.pop()
                        origin.append(f"{name} one part fewer")
                    else:
                        parts.append(parts[0].copy())
                        origin.append(f"{name} one part more")
                inputs[name] = tuple(parts)
            else:
                inputs[name] = self._array(draw, name, np.asarray(value), reshaped(np.shape(value)), float_dims, origin)

        params = {}
        for name, value in template.params.items():
            kind = next((p.kind for p in spec.params if p.name == name), None)
            if kind == "shape" and isinstance(value, (tuple, list)):
                value = tuple(
                    remap.get(int(d), int(d)) if isinstance(d, (int, np.integer)) and d >= 0 else d for d in value
                )
            params[name] = value
        if spec.params and draw(st.booleans()):
            for p in spec.params:
                if draw(st.booleans()):
                    params[p.name] = draw(self._param(p, inputs))
                    origin.append(f"{p.name}={params[p.name]!r}")

        breakage = draw(st.integers(0, 11))
        if breakage == 10:
            self._wrong_rank(draw, inputs, origin)
        elif breakage == 11:
            self._break(draw, inputs, params, origin)
        return Example(inputs, params, "; ".join(origin))

    # -- arrays -----------------------------------------------------------------------------

    def _array(self, draw, name, template: np.ndarray, shape: tuple, float_dims, origin) -> np.ndarray:
        tensor = self.tensors.get(name)
        if template.dtype.kind in "iu" and tensor is not None and tensor.dtype == "int64":
            return self._index(draw, name, template, shape, float_dims, origin)
        if template.dtype.kind != "f":
            return np.resize(template, shape) if template.size else np.zeros(shape, template.dtype)
        base = np.resize(template.astype(np.float32), shape) if template.size else np.zeros(shape, np.float32)
        how = draw(st.integers(0, 2)) if base.size else 0
        if how == 0:
            values = base
        elif how == 1:
            values = base.copy()
            flat = values.reshape(-1)
            for _ in range(draw(st.integers(1, 4))):
                flat[draw(st.integers(0, flat.size - 1))] = draw(st.sampled_from(self.policy.extremes()))
            origin.append(f"{name} extremes")
        else:
            values = draw(arrays(np.float32, shape, elements=self.elements))
            origin.append(f"{name} drawn")
        if values.ndim and values.size and draw(st.integers(0, 4)) == 4:
            values = values.copy()
            rows = values.reshape(-1, values.shape[-1])
            rows[draw(st.integers(0, rows.shape[0] - 1))] = 0.0
            origin.append(f"{name} row zeroed")
        return self.policy.clean(np.ascontiguousarray(values))

    def _index(self, draw, name, template, shape, float_dims, origin) -> np.ndarray:
        """Template entries, or entries drawn below a bound taken from the other inputs' axes
        (an axis longer than every template entry first: the likely indexed one), with repeats;
        sometimes one entry out of range."""
        limit = int(template.max()) if template.size else -1
        bounds = (
            sorted({new for old, new in float_dims if old > limit}) or sorted({new for _, new in float_dims}) or [1]
        )
        largest = max([new for _, new in float_dims] + [1])
        if draw(st.booleans()):
            bound = draw(st.sampled_from(bounds))
            values = (
                draw(arrays(np.int64, shape, elements=st.integers(0, bound - 1)))
                if bound > 0
                else np.zeros(shape, np.int64)
            )
            origin.append(f"{name} drawn below {bound}")
        else:
            values = np.resize(template.astype(np.int64), shape) if template.size else np.zeros(shape, np.int64)
        if values.size and draw(st.integers(0, 4)) == 4:
            values = values.copy()
            bad = draw(st.sampled_from((-1, largest, largest + 7, -(2**40), 2**40)))
            values.reshape(-1)[draw(st.integers(0, values.size - 1))] = bad
            origin.append(f"{name} entry {bad}")
        return values

    # -- parameters ---------------------------------------------------------------------------

    def _param(self, p, inputs):
        arrays_ = [a for a in _arrays_of(inputs)]
        rank = arrays_[0].ndim if arrays_ else 1
        largest = max([int(d) for a in arrays_ for d in a.shape] + [4])
        if p.kind == "float":
            return st.one_of(st.sampled_from(FLOAT_PARAMS), st.floats(-100.0, 100.0))
        if p.kind == "int":
            return st.integers(-3, largest + 3)
        if p.kind == "axis":
            return st.integers(-rank - 1, rank)
        if p.kind == "axis_or_none":
            return st.one_of(st.none(), st.integers(-rank - 1, rank))
        if p.kind == "shape":
            return st.lists(st.one_of(st.integers(0, 9), st.sampled_from((-1, -2))), max_size=4).map(tuple)
        if p.kind == "perm":
            return st.one_of(
                st.permutations(range(rank)).map(tuple), st.lists(st.integers(-1, rank), max_size=rank + 1).map(tuple)
            )
        if p.kind == "per_axis":
            spatial = max(rank - 2, 0)
            return st.one_of(
                st.integers(-1, 4),
                st.lists(st.integers(-1, 4), min_size=max(spatial - 1, 0), max_size=spatial + 1).map(tuple),
                st.none(),
            )
        if p.kind == "seed":
            return st.one_of(st.integers(0, 2**64 - 1), st.sampled_from((-1, 2**64)))
        raise AssertionError(p.kind)

    # -- deliberate breakage ------------------------------------------------------------------

    def _wrong_rank(self, draw, inputs, origin):
        names = [n for n, v in inputs.items() if not isinstance(v, tuple)]
        if not names:
            return
        name = draw(st.sampled_from(names))
        a = inputs[name]
        if a.ndim and draw(st.booleans()):
            axis = draw(st.integers(0, a.ndim - 1))
            inputs[name] = (
                np.ascontiguousarray(np.take(a, 0, axis=axis))
                if a.shape[axis]
                else np.zeros(a.shape[:axis] + a.shape[axis + 1 :], a.dtype)
            )
            origin.append(f"{name} axis {axis} dropped")
        else:
            axis = draw(st.integers(0, a.ndim))
            inputs[name] = np.ascontiguousarray(np.expand_dims(a, axis))
            origin.append(f"{name} axis {axis} added")

    def _break(self, draw, inputs, params, origin):
        choices = ["unknown-param", "unknown-input"]
        if params:
            choices += ["drop-param", "mistype-param"]
        if inputs:
            choices += ["drop-input", "complex-input"]
        if any(t.dtype == "int64" and t.name in inputs for t in self.spec.inputs):
            choices.append("float-index")
        how = draw(st.sampled_from(choices))
        if how == "unknown-param":
            params["bogus"] = 1
        elif how == "unknown-input":
            inputs["bogus"] = np.zeros(3, np.float32)
        elif how == "drop-param":
            params.pop(draw(st.sampled_from(sorted(params))))
        elif how == "mistype-param":
            name = draw(st.sampled_from(sorted(params)))
            params[name] = draw(st.sampled_from(("two", True, 1.5, [1, "a"], -1)))
        elif how == "drop-input":
            inputs.pop(draw(st.sampled_from(sorted(inputs))))
        elif how == "complex-input":
            name = draw(st.sampled_from(sorted(inputs)))
            value = inputs[name]
            inputs[name] = (
                tuple(np.asarray(v).astype(np.complex64) for v in value)
                if isinstance(value, tuple)
                else np.asarray(value).astype(np.complex64)
            )
        else:
            name = next(t.name for t in self.spec.inputs if t.dtype == "int64" and t.name in inputs)
            inputs[name] = np.asarray(inputs[name]).astype(np.float32)
        origin.append(how)


# -- running one example --------------------------------------------------------------------


class _Poisoned(BaseException):
    """The backend's context died (a CUDA launch fault): nothing more can run in this process."""

    def __init__(self, exc: BaseException):
        super().__init__(str(exc))
        self.exc = exc


def _window_ties(spec: OpSpec, case) -> bool:
    """A selection op (its spec declares `windows`) whose input has a window with tied maxima:
    the winner is implementation-defined, so instead of the VJP comparison verify's
    selection.ties check runs on the case (each window's gradient to exactly one maximal cell)."""
    windows = spec.windows
    if windows is None or "x" not in case.arrays or not case.arrays["x"].size:
        return False
    cells = windows(case.arrays["x"].shape, case.params)
    if not cells.size:
        return False
    x = case.arrays["x"].reshape(-1).astype(np.float64)
    values = np.where(cells >= 0, x[np.clip(cells, 0, None)], -np.inf)
    with np.errstate(invalid="ignore"):
        best = np.nanmax(np.where(np.isnan(values), -np.inf, values), axis=1, keepdims=True)
    return bool(((values == best).sum(axis=1) > 1).any())


def _refusal(spec: OpSpec, backend, sample: Sample, expected: InputError) -> tuple[str, str, str] | None:
    """An input validate refuses: the backend must raise the same InputError type naming the same
    argument, before any launch (forward, and backward for an op with a VJP)."""
    directions = ("forward", "backward") if spec.has_vjp else ("forward",)
    want = f"{type(expected).__name__} naming {expected.argument!r} ({expected})"
    for direction in directions:
        before = getattr(backend, "launch_count", 0)
        try:
            if direction == "forward":
                backend.forward(spec, dict(sample.inputs), dict(sample.params), GuardedOutput((0,)))
            else:
                backend.backward(spec, dict(sample.inputs), dict(sample.params), np.zeros((0,), np.float32), {})
        except InputError as exc:
            if type(exc) is not type(expected) or exc.argument != expected.argument:
                return (
                    "shape.guard",
                    "FAILED",
                    f"{direction}: raised {type(exc).__name__} naming {exc.argument!r} ({exc}), expected {want}",
                )
        except Exception as exc:
            if getattr(exc, "poisoned", False):
                raise _Poisoned(exc)
            return ("shape.guard", "FAILED", f"{direction}: crashed with {type(exc).__name__}: {exc}, expected {want}")
        else:
            return ("shape.guard", "FAILED", f"{direction}: accepted an input the guard refuses, expected {want}")
        launched = getattr(backend, "launch_count", 0) - before
        if launched:
            return ("shape.guard", "FAILED", f"{direction}: refused, but only after {launched} launch(es)")
    return None


def run_example(capsule: KernelCapsule, spec: OpSpec, backend, example: Example, seed: int) -> Outcome:
    """Judge one example: refused inputs by `_refusal`, accepted ones by verify's checks."""
    sample = example.sample()
    try:
        arrays, params, out_shape = validate(spec, sample.inputs, sample.params, np.float32)
    except InputError as expected:
        return Outcome(False, _refusal(spec, backend, sample, expected))
    except Exception as exc:
        return Outcome(
            False, ("shape.guard", "ERROR", f"the runtime guard validate crashed: {type(exc).__name__}: {exc}")
        )
    try:
        too_large = math.prod(out_shape) > 4 * MAX_ELEMENTS or spec.cost(shapes_of(arrays), params).flops > MAX_FLOPS
    except Exception as exc:
        return Outcome(
            True, ("reference", "ERROR", f"the cost model crashed on an accepted input: {type(exc).__name__}: {exc}")
        )
    if too_large:
        return Outcome(True, too_large=True)
    run = Session(capsule, spec, backend, True, seed, None)
    try:
        case = run.prepare(sample)
    except Exception as exc:
        return Outcome(
            True,
            ("reference", "ERROR", f"the float64 reference crashed on an accepted input: {type(exc).__name__}: {exc}"),
        )
    try:
        run.execute(case)
    except Exception as exc:  # execute re-raises only a poisoned context
        raise _Poisoned(exc)
    run.cases = [case]
    results = [
        run.compare_cases(
            "value.special" if case.special else "value", [case], run.forward_pairs(worst_case_bound=True)
        )
    ]
    if spec.has_vjp and not case.error and _window_ties(spec, case):
        results.append(run.check_selection_ties(tie_cases=(CASE,)))
    elif spec.has_vjp and not case.error:
        results.append(run.compare_cases("vjp", [case], run.vjp_pairs))
    try:
        results += [run.check_bounds(), run.check_inputs_intact(), run.check_determinism()]
    except Exception as exc:
        raise _Poisoned(exc)
    worst = max((r.worst for r in results if r.worst is not None and math.isfinite(r.worst)), default=0.0)
    bad = next((r for r in results if r.status in (Status.FAILED, Status.ERROR)), None)
    failure = (bad.check, bad.status.value, bad.reason) if bad else None
    return Outcome(True, failure, worst, any(r.out_of_model for r in results))


# -- fuzzing a capsule ----------------------------------------------------------------------


class _OutOfTime(BaseException):
    """Raised inside the test when the capsule's time is up: Hypothesis lets it through."""


class _Found(Exception):
    """Raised inside the test on a failure: what Hypothesis shrinks."""


def database_dir() -> Path:
    """Where the Hypothesis example database lives: the cache folder (a cache, not a record)."""
    from capsule_core.kernels.nvcc import cache_dir

    return cache_dir() / "hypothesis"


def _settings(max_examples: int, database) -> settings:
    from hypothesis.database import DirectoryBasedExampleDatabase

    db = None if database is None else DirectoryBasedExampleDatabase(str(database))
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=db,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
        verbosity=Verbosity.quiet,
        phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink),
        print_blob=False,
    )


def _preflight(spec: OpSpec, backend) -> str:
    """Why the backend cannot run this op at all ('' when it can): a non-input CapsuleError on the
    op's first sample, before any launch (a cuda op whose kernels are not written yet)."""
    first = spec.samples("small", seeded_rng(spec.name, "small", 0))[:1]
    if not first:
        return ""
    sample = first[0]
    try:
        _, _, out_shape = validate(spec, sample.inputs, sample.params, np.float32)
        before = getattr(backend, "launch_count", 0)
        backend.forward(spec, dict(sample.inputs), dict(sample.params), GuardedOutput(out_shape))
    except InputError:
        return ""
    except CapsuleError as exc:
        if getattr(exc, "poisoned", False) or getattr(backend, "launch_count", 0) != before:
            return ""
        return f"the {backend.name} backend cannot run it: {exc}"
    except Exception:
        return ""
    return ""


def fuzz_capsule(
    capsule: KernelCapsule,
    backend,
    *,
    max_examples: int | None = 100,
    deadline: float = math.inf,
    seed: int = 0,
    database=None,
    on_example: Callable[[CapsuleFuzz], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> CapsuleFuzz:
    """Fuzz one capsule until `max_examples` examples (None: no limit), the `deadline` (a `clock`
    time) or the first failure, which Hypothesis then shrinks."""
    start = clock()
    spec = get_spec(capsule.op.value)
    result = CapsuleFuzz(capsule.name, spec.name)
    if hasattr(backend, "bind"):
        backend.bind(capsule)
    result.skipped = _preflight(spec, backend)
    if result.skipped:
        return result
    strategy = ExampleStrategy(spec).strategy()
    found: dict = {}

    def test(example: Example):
        now = clock()
        if not found and result.examples + result.refused >= 1 and now > deadline:
            raise _OutOfTime()
        if found and now > found["shrink_until"]:
            raise _OutOfTime()
        try:
            outcome = run_example(capsule, spec, backend, example, seed)
        except _Poisoned as exc:
            found.setdefault("poisoned", (example, exc))
            raise
        if outcome.too_large:
            result.rejected += 1
            reject()
        if found:
            result.shrink_steps += 1
        elif outcome.valid:
            result.examples += 1
            result.out_of_model += outcome.out_of_model
        else:
            result.refused += int(outcome.failure is None)
        if on_example is not None:
            on_example(result)
        if outcome.failure is not None:
            if not found:
                found["shrink_until"] = max(deadline, clock() + SHRINK_SECONDS)
            found["last"] = (example, outcome.failure)
            raise _Found(outcome.failure[2])
        if outcome.worst:
            target(min(outcome.worst, 1e12), label="error / bound")

    # settings outermost: hypothesis.seed() alone would switch the example database off
    wrapped = _settings(max_examples if max_examples is not None else 10**9, database)(
        hypothesis_seed(seed)(given(strategy)(test))
    )
    wrapped.hypothesis.inner_test._hypothesis_internal_add_digest = f"{capsule.name}|{backend.name}".encode()
    from hypothesis.reporting import with_reporter

    flaky = False
    try:
        with with_reporter(lambda *args: None):
            wrapped()
        result.stopped = "examples"
    except _OutOfTime:
        result.stopped = "time"
    except _Found:
        result.stopped = "failure"
    except _Poisoned as exc:
        result.poisoned = True
        result.stopped = "poisoned"
        example = found["poisoned"][0]
        found["last"] = (example, ("value", "ERROR", f"the backend's context is poisoned: {exc.exc}"))
    except Unsatisfiable:
        result.stopped = "no example fits the budget"
    except Exception as exc:  # a Flaky failure, or the engine itself broke
        result.stopped = type(exc).__name__
        flaky = "last" in found
        if not flaky:
            result.error = f"the fuzz engine failed: {type(exc).__name__}: {exc}"
    if "last" in found:
        example, (check, status, detail) = found["last"]
        result.failure = Failure(capsule.name, spec.name, check, status, detail, example, seed, backend.name, flaky)
    result.seconds = clock() - start
    return result


def fuzz(
    capsules,
    backend,
    *,
    time_budget: float | None = None,
    max_examples: int | None = None,
    seed: int = 0,
    database=None,
    on_example: Callable[[CapsuleFuzz], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[CapsuleFuzz]:
    """One CapsuleFuzz per capsule, as each finishes. The time budget is shared: each capsule gets
    the time left divided by the capsules left (a quick capsule leaves its time to the others).
    A poisoned backend context stops the run after the capsule that poisoned it."""
    capsules = list(capsules)
    end = clock() + time_budget if time_budget is not None else math.inf
    for i, capsule in enumerate(capsules):
        now = clock()
        deadline = now + max(end - now, 0.0) / (len(capsules) - i) if math.isfinite(end) else math.inf
        one = fuzz_capsule(
            capsule,
            backend,
            max_examples=max_examples,
            deadline=deadline,
            seed=seed,
            database=database,
            on_example=on_example,
            clock=clock,
        )
        yield one
        if one.poisoned:
            return


def new_seed() -> int:
    """A fresh seed for a run without --seed (reported, and stored in every replay file)."""
    return random.SystemRandom().randrange(2**32)


# -- replay files ---------------------------------------------------------------------------

REPLAY_SCHEMA = "capsules.fuzz-replay"
REPLAY_SCHEMA_VERSION = 1


def _encode(value):
    """A parameter value as JSON: tuples tagged, non-finite floats tagged (strict JSON)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, tuple):
        return {"tuple": [_encode(v) for v in value]}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"cannot encode parameter value {value!r}")


def _decode(value):
    if isinstance(value, dict):
        if "tuple" in value:
            return tuple(_decode(v) for v in value["tuple"])
        if "float" in value:
            return float(value["float"])
        raise ValueError(f"unknown tagged value {value!r}")
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(
        str(a.dtype).encode() + repr(a.shape).encode() + np.ascontiguousarray(a).tobytes()
    ).hexdigest()


def replay_document(failure: Failure) -> tuple[dict, dict]:
    """(the JSON document, the arrays keyed as in the .npz) of a failure (docs/fuzz-replay.md)."""
    stored, inputs = {}, {}
    for name, value in failure.example.inputs.items():
        if isinstance(value, (tuple, list)):
            keys = [f"{name}.{i}" for i in range(len(value))]
            stored.update({k: np.asarray(v) for k, v in zip(keys, value)})
            inputs[name] = {"arrays": keys}
        else:
            stored[name] = np.asarray(value)
            inputs[name] = {"array": name}
    document = {
        "schema": REPLAY_SCHEMA,
        "schema_version": REPLAY_SCHEMA_VERSION,
        "capsule": failure.capsule,
        "op": failure.op,
        "backend": failure.backend,
        "seed": failure.seed,
        "case": CASE,
        "check": failure.check,
        "status": failure.status,
        "detail": failure.detail,
        "flaky": failure.flaky,
        "origin": failure.example.origin,
        "summary": failure.example.summary(),
        "params": {k: _encode(v) for k, v in failure.example.params.items()},
        "inputs": inputs,
        "arrays": {k: {"dtype": str(a.dtype), "shape": list(a.shape), "sha256": _digest(a)} for k, a in stored.items()},
    }
    return document, stored


def write_replay(failure: Failure, directory: Path) -> Path:
    """Write <op>-<check>-<digest>.json and its .npz into `directory`, each atomically; returns the
    JSON's path."""
    from capsule_core.output_files import atomic_path, write_text_atomic

    document, stored = replay_document(failure)
    key = hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()[:10]
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stem = f"{failure.op}-{failure.check}-{key}"
    document["arrays_file"] = f"{stem}.npz"
    with atomic_path(directory / f"{stem}.npz") as temporary:
        np.savez(temporary, **stored)
    path = directory / f"{stem}.json"
    write_text_atomic(path, json.dumps(document, indent=2) + "\n")
    return path


class ReplayFileError(CapsuleError):
    """A replay file that cannot be read: missing, not JSON, another schema, arrays changed."""


@dataclass(frozen=True)
class Replay:
    """A replay file read back: the recorded failure, ready to rerun."""

    path: str
    capsule: str
    check: str
    status: str
    detail: str
    seed: int
    backend: str
    example: Example


def read_replay(path) -> Replay:
    path = Path(path)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ReplayFileError(f"--replay: cannot read {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise ReplayFileError(f"--replay: {path} is not JSON: {exc}") from exc
    if not isinstance(document, dict) or document.get("schema") != REPLAY_SCHEMA:
        raise ReplayFileError(f"--replay: {path} is not a {REPLAY_SCHEMA} file")
    if document.get("schema_version") != REPLAY_SCHEMA_VERSION:
        raise ReplayFileError(
            f"--replay: {path} has schema version {document.get('schema_version')}, "
            f"this capsules reads {REPLAY_SCHEMA_VERSION}"
        )
    arrays_path = path.parent / document["arrays_file"]
    try:
        with np.load(arrays_path, allow_pickle=False) as data:
            stored = {k: data[k] for k in data.files}
    except OSError as exc:
        raise ReplayFileError(f"--replay: cannot read the arrays {arrays_path}: {exc}") from exc
    for key, meta in document["arrays"].items():
        if key not in stored or _digest(stored[key]) != meta["sha256"]:
            raise ReplayFileError(f"--replay: array {key} of {arrays_path} is missing or changed")
    inputs = {}
    for name, ref in document["inputs"].items():
        inputs[name] = tuple(stored[k] for k in ref["arrays"]) if "arrays" in ref else stored[ref["array"]]
    params = {k: _decode(v) for k, v in document["params"].items()}
    example = Example(inputs, params, document.get("origin", ""))
    return Replay(
        str(path),
        document["capsule"],
        document["check"],
        document["status"],
        document["detail"],
        int(document["seed"]),
        document["backend"],
        example,
    )


@dataclass(frozen=True)
class ReplayResult:
    """A replay rerun: the recorded failure and what the example gives now."""

    replay: Replay
    backend: str
    outcome: Outcome

    @property
    def reproduced(self) -> bool:
        """The same check fails with the same message, bit for bit (but for the absolute addresses
        of a memory fault: every process places device memory elsewhere)."""
        f = self.outcome.failure
        return f is not None and (f[0], f[1], _without_addresses(f[2])) == (
            self.replay.check,
            self.replay.status,
            _without_addresses(self.replay.detail),
        )

    @property
    def exit_code(self) -> int:
        return 1 if self.outcome.failure is not None else 0


def _without_addresses(text: str) -> str:
    return re.sub(r"0x[0-9a-f]+", "0x?", text)


def replay(recorded: Replay, backend) -> ReplayResult:
    """Rerun a recorded example exactly (same arrays, parameters and seed) on `backend`."""
    from capsule_core.catalog.registry import lookup

    capsule = lookup(recorded.capsule)
    spec = get_spec(capsule.op.value)
    if hasattr(backend, "bind"):
        backend.bind(capsule)
    try:
        outcome = run_example(capsule, spec, backend, recorded.example, recorded.seed)
    except _Poisoned as exc:
        outcome = Outcome(True, ("value", "ERROR", f"the backend's context is poisoned: {exc.exc}"))
    return ReplayResult(recorded, backend.name, outcome)
