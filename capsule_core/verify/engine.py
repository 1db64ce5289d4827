"""`capsules verify`: every contract claim of a capsule becomes a check that can fail.

The engine yields one CapsuleReport per capsule and never prints. Each check ends PASSED,
FAILED, MISTRUSTED (it ran but could not tell: an all-zero output would have passed too),
SKIPPED (with the reason) or ERROR (the backend crashed), with the worst error over its bound
and a one-line rerun. Tolerances come only from the OpSpecs' error models (design §4).
"""

from __future__ import annotations

import re
import time
import traceback
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Iterator

import numpy as np

from capsule_core import activity
from capsule_core.backends.execution import GuardedOutput, gradient_outputs
from capsule_core.catalog.registry import launches_kernels, library_option, short_name
from capsule_core.errors import InputError
from capsule_core.model import KernelCapsule, ReductionPolicy, contracts_aligned
from capsule_core.ops import get_spec
from capsule_core.ops.base import (
    Accumulation,
    Exact,
    OpSpec,
    Sample,
    seeded_rng,
    shapes_of,
    sized_samples,
    validate,
    working_params,
)
from capsule_core.verify.checks import ALL_CHECKS, CHECKS, SANITIZER_CHECKS, STATIC_CHECKS
from capsule_core.verify.numerics import Comparison, Float32Run, compare, out_of_model


class Status(str, Enum):
    PASSED = "PASSED"
    FAILED = "FAILED"
    MISTRUSTED = "MISTRUSTED"
    SKIPPED = "SKIPPED"
    ERROR = "ERROR"


SEVERITY = [Status.ERROR, Status.FAILED, Status.MISTRUSTED, Status.PASSED, Status.SKIPPED]


@dataclass(frozen=True)
class Result:
    check: str
    status: Status
    reason: str = ""
    worst: float | None = None
    case: str | None = None
    cases: int = 0
    repro: str = ""
    out_of_model: int = 0
    """Elements never compared: their float32 intermediates overflow (numerics.out_of_model)."""
    details: str = ""
    """The whole text behind a one-line reason (a sanitizer's report)."""


@dataclass(frozen=True)
class CapsuleReport:
    capsule: str
    results: tuple[Result, ...]
    seconds: float

    @property
    def status(self) -> Status:
        present = {r.status for r in self.results}
        return next((s for s in SEVERITY if s in present), Status.SKIPPED)


class StoppableRun:
    """What verify's and fuzz's reports share: a run a signal may stop part way. The report is a
    dataclass with `capsules` (results naming their `capsule`), `interrupted`, `stopped_by` and
    `not_run`."""

    def stop(self, signal_name: str, asked) -> None:
        """Record an interruption by `signal_name`: the capsules of `asked` without a result are not run."""
        self.interrupted, self.stopped_by = True, signal_name
        done = {c.capsule for c in self.capsules}
        self.not_run = [c.name for c in asked if c.name not in done]


@dataclass
class VerifyReport(StoppableRun):
    backend: str
    backend_note: str
    seed: int
    quick: bool
    capsules: list[CapsuleReport] = field(default_factory=list)
    interrupted: bool = False
    stopped_by: str = ""
    """The signal that interrupted the run: SIGINT (Ctrl-C), SIGTERM (a CI job's timeout), SIGHUP."""
    not_run: list[str] = field(default_factory=list)
    """The capsules asked for that the interrupted run never finished."""
    seconds: float = 0.0

    @property
    def exit_code(self) -> int:
        """The process's exit code, which the JSON report records: 128 + the signal's number after
        an interruption (as a shell reports it: 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP), 1 on a FAILED
        or ERROR check, else 0."""
        if self.interrupted:
            return interrupted_exit_code(self.stopped_by)
        bad = {Status.FAILED, Status.ERROR}
        return 1 if any(r.status in bad for c in self.capsules for r in c.results) else 0


def interrupted_exit_code(signal_name: str) -> int:
    """128 + the number of the signal that stopped a run (SIGINT when none is named)."""
    import signal

    return 128 + int(getattr(signal, signal_name or "SIGINT", signal.SIGINT))


@dataclass
class Case:
    """One sample, its reference results, and what the backend did with it."""

    sample: Sample
    special: bool
    arrays: dict
    params: dict
    out_shape: tuple
    reference: np.ndarray
    magnitude: np.ndarray
    """M of the error model, beside the reference."""
    length: int
    """n of the error model: the accumulation length."""
    cotangent: np.ndarray | None = None
    reference_grads: dict | None = None
    magnitude_grads: dict | None = None
    y: np.ndarray | None = None
    grads: dict | None = None
    outputs: list = field(default_factory=list)
    overruns: list = field(default_factory=list)
    intact: list = field(default_factory=list)
    error: str | None = None
    fault: bool = False
    """The error is the kernel's own (an illegal address, a trap, a hang: what a GPU reports as a
    failed launch), so the checks of the case FAIL; else the backend broke and they are ERROR."""
    f32: Float32Run | None = None
    f32_grads: dict | None = None


def _has_special(sample: Sample) -> bool:
    def special(a):
        a = np.asarray(a)
        return a.dtype.kind == "f" and a.size > 0 and bool(np.any(~np.isfinite(a) | ((a == 0) & np.signbit(a))))

    return any(special(v) if not isinstance(v, tuple) else any(special(x) for x in v) for v in sample.inputs.values())


def _copy_inputs(arrays: dict) -> dict:
    return {k: (tuple(x.copy() for x in v) if isinstance(v, tuple) else v.copy()) for k, v in arrays.items()}


def _same_bits(a, b) -> bool:
    if isinstance(a, tuple):
        return all(_same_bits(x, y) for x, y in zip(a, b))
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype.itemsize != b.dtype.itemsize:
        return False
    return np.array_equal(np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


def _crash_status(case: Case) -> Status:
    """FAILED when the kernel itself faulted (a contract violation: on a GPU the launch fails),
    ERROR when the backend could not run the case."""
    return Status.FAILED if case.fault else Status.ERROR


LEFT_FOLD = Exact("a fixed-left reduction is bitwise the float32 left fold")


def _float32_runs(spec: OpSpec, case: Case) -> tuple[Float32Run, dict | None]:
    """The op's own code in float32 on the case's inputs, forward and VJP (the gradients keyed
    like case.reference_grads): what numerics.out_of_model judges each element by."""
    from capsule_core.catalog.cpu_providers import REFERENCE

    params = working_params(case.params, np.float32)

    def evaluate(function):
        flags = []
        try:
            with np.errstate(
                over="call",
                divide="ignore",
                invalid="ignore",
                under="ignore",
                call=lambda kind, flag: flags.append(kind),
            ):
                return function(), bool(flags)
        except Exception:
            return None, False

    finite_m, finite_m_grads = case.magnitude, case.magnitude_grads
    if not all(a.dtype.kind != "f" or np.isfinite(a).all() for a in _flat(case.arrays)):

        def zeroed(a):
            return np.where(np.isfinite(a), a, np.float32(0)) if a.dtype.kind == "f" else a

        arrays = {
            k: (tuple(zeroed(x) for x in v) if isinstance(v, tuple) else zeroed(v)) for k, v in case.arrays.items()
        }
        try:
            finite_m = REFERENCE.magnitude(spec, arrays, **case.sample.params)
            if spec.has_vjp:
                finite_m_grads = REFERENCE.vjp_magnitude(spec, arrays, case.cotangent, **case.sample.params)
        except Exception:
            finite_m, finite_m_grads = case.magnitude, case.magnitude_grads
    forward, overflowed = evaluate(lambda: spec.forward(case.arrays, params))
    run = Float32Run(forward, overflowed, finite_m)
    if not spec.has_vjp:
        return run, None
    grads, overflowed = evaluate(
        lambda: spec.vjp(case.arrays, params, spec.forward(case.arrays, params), case.cotangent)
    )
    runs = {}
    for name in spec.differentiable:
        values = grads.get(name) if isinstance(grads, dict) else None
        if isinstance(case.reference_grads[name], tuple):
            values = values if isinstance(values, tuple) else (None,) * len(case.reference_grads[name])
            runs[name] = tuple(Float32Run(v, overflowed, m) for v, m in zip(values, finite_m_grads[name]))
        else:
            runs[name] = Float32Run(values, overflowed, finite_m_grads[name])
    return run, runs


def _flat(arrays: dict) -> list:
    return [a for v in arrays.values() for a in (v if isinstance(v, tuple) else (v,))]


def run_samples(spec: OpSpec, quick: bool, seed: int) -> list[Sample]:
    """The cases a verify run of `spec` executes: the sized samples (small only when quick), then
    the edges."""
    sizes = ("small",) if quick else ("small", "medium", "large")
    out = [s for size in sizes for s in sized_samples(spec, size, seed)]
    return out + spec.edges()


def unknown_case(specs, case: str, quick: bool, seed: int) -> str | None:
    """Why `--case case` would select nothing in a run of `specs`, or None when some spec has it.
    A typo must not pass as a run that skipped every check."""
    known = {s.case for spec in specs for s in run_samples(spec, quick, seed)}
    if case in known:
        return None
    shown = sorted(known)
    listed = ", ".join(shown[:12]) + (f" and {len(shown) - 12} more" if len(shown) > 12 else "")
    mode = "quick mode's" if quick else "the"
    return f"no case {case!r} among {mode} cases of {', '.join(spec.name for spec in specs)} (cases: {listed})"


class Session:
    """Verification of one capsule on one backend: its cases (samples with their reference
    results, run on the backend by `prepare` and `execute`) and one method per check. verify_capsule
    drives it over the op's samples; fuzz drives it over one drawn example at a time."""

    def __init__(self, capsule: KernelCapsule, spec: OpSpec, backend, quick: bool, seed: int, case_filter: str | None):
        self.capsule, self.spec, self.backend = capsule, spec, backend
        if hasattr(backend, "bind"):
            backend.bind(capsule)
        self.quick, self.seed, self.case_filter = quick, seed, case_filter
        self.cases: list[Case] = []
        self.hung = ""
        """Set when a launch ran past its timeout: the capsule's later cases fail unlaunched."""

    def repro(self, check: str, case: str | None = None) -> str:
        line = f"capsules verify {short_name(self.capsule)} --check {check} --seed {self.seed} --backend {self.backend.name}"
        return line + library_option(self.capsule) + (f" --case {case}" if case else "")

    def failed(self, check: str, reason: str, case: str | None, **fields) -> Result:
        """A FAILED check on `case`, with the command line that reruns that case."""
        return Result(check, Status.FAILED, reason, case=case, repro=self.repro(check, case), **fields)

    def passed(self, check: str, reason: str, **fields) -> Result:
        """A PASSED check, with the command line that reruns it."""
        return Result(check, Status.PASSED, reason, repro=self.repro(check), **fields)

    def clean(self, check: str, count: int, reason: str) -> Result:
        """The verdict of a check that found nothing wrong in `count` runs: SKIPPED when none ran."""
        if not count:
            return Result(check, Status.SKIPPED, "no case ran")
        return self.passed(check, reason, cases=count)

    def crashed(self, check: str, case: Case) -> Result:
        """The check's result when the backend could not run `case` (_crash_status says which)."""
        return Result(
            check, _crash_status(case), case.error, case=case.sample.case, repro=self.repro(check, case.sample.case)
        )

    # -- running ----------------------------------------------------------------------------

    def samples(self) -> list[Sample]:
        out = run_samples(self.spec, self.quick, self.seed)
        if self.case_filter:
            out = [s for s in out if s.case == self.case_filter]
        return out

    def prepare(self, sample: Sample) -> Case:
        from capsule_core.catalog.cpu_providers import REFERENCE

        spec = self.spec
        arrays, params, out_shape = validate(spec, sample.inputs, sample.params, np.float32)
        cotangent = (
            seeded_rng(spec.name, f"g/{sample.case}", self.seed).standard_normal(out_shape).astype(np.float32)
            if spec.has_vjp
            else None
        )
        r, m, reference_grads, magnitude_grads = REFERENCE.case(spec, arrays, cotangent, **sample.params)
        n = spec.error.length(shapes_of(arrays), params) if isinstance(spec.error, Accumulation) else 1
        case = Case(sample, _has_special(sample), arrays, params, out_shape, r, m, n)
        case.cotangent, case.reference_grads, case.magnitude_grads = cotangent, reference_grads, magnitude_grads
        case.f32, case.f32_grads = _float32_runs(spec, case)
        return case

    def execute(self, case: Case):
        """Forward and backward on the backend, with fresh guarded outputs and input copies."""
        activity.working_on(case=f"{case.sample.case} (forward)")
        direction = "forward"
        if self.hung:
            case.error, case.fault = f"{case.sample.summary()}: not run, {self.hung}", True
            return
        try:
            out = GuardedOutput(case.out_shape)
            originals = _copy_inputs(case.arrays)
            given = _copy_inputs(case.arrays)
            run = self.backend.forward(self.spec, given, dict(case.sample.params), out)
            case.y = out.view.copy()
            case.outputs.append(("forward", out))
            case.overruns += [(f"forward {name}", n) for name, n in run.overruns.items()]
            case.intact.append(("forward", all(_same_bits(run.inputs_after[k], originals[k]) for k in originals)))
            if self.spec.has_vjp:
                activity.working_on(case=f"{case.sample.case} (backward)")
                direction = "backward"
                grads = gradient_outputs(self.spec, case.arrays)
                given = _copy_inputs(case.arrays)
                g = case.cotangent.copy()
                run = self.backend.backward(self.spec, given, dict(case.sample.params), g, grads)
                case.grads = {
                    k: (tuple(x.view.copy() for x in v) if isinstance(v, tuple) else v.view.copy())
                    for k, v in grads.items()
                }
                for k, v in grads.items():
                    case.outputs += [(f"d{k}", x) for x in (v if isinstance(v, tuple) else (v,))]
                case.overruns += [(f"backward {name}", n) for name, n in run.overruns.items()]
                intact = all(_same_bits(run.inputs_after[k], originals[k]) for k in originals)
                intact = intact and _same_bits(run.inputs_after.get("g", g), case.cotangent)
                case.intact.append(("backward", intact))
        except Exception as exc:  # a backend crash is a result (ERROR), never a lost report
            case.error = f"{direction} {case.sample.summary()}: {type(exc).__name__}: {exc}"
            case.fault = bool(getattr(exc, "kernel_fault", False))
            if getattr(exc, "hung", False):
                self.hung = f"the kernel hung on case {case.sample.case} ({direction})"
            if getattr(exc, "poisoned", False):
                raise

    # -- checks -----------------------------------------------------------------------------

    def compare_cases(self, check: str, cases, pairs) -> Result:
        """Run `pairs(case) -> [(label, y, r, m, model, n, worst_case, float32 run)]` over cases;
        the worst ratio decides; MISTRUSTED when no case could tell the output from all zeros.
        Elements out of model (judged by the float32 run, when given) are counted, not compared."""
        worst, worst_case, failure, crash, discriminating, counted, uncompared, compared = (
            0.0,
            None,
            None,
            None,
            False,
            0,
            0,
            0,
        )
        for case in cases:
            if case.error:
                crash = crash or case
                continue
            for label, y, r, m, model, n, wc, run in pairs(case):
                counted += 1
                outside = None if run is None else out_of_model(y, r, m, model, n, run)
                c: Comparison = compare(y, r, m, model, n, wc, outside)
                uncompared += c.out_of_model
                compared += np.size(y) - c.out_of_model
                if not discriminating and np.asarray(r).size:
                    discriminating = not compare(np.zeros_like(y), r, m, model, n, wc, outside).passed
                if not c.passed and failure is None:
                    failure = (case, label, c)
                if c.worst >= worst:
                    worst, worst_case = c.worst, case.sample.case
        if failure is None and crash is not None:
            return self.crashed(check, crash)
        if counted == 0:
            return Result(check, Status.SKIPPED, "no case applies")
        if failure:
            case, label, c = failure
            return self.failed(
                check,
                f"{label} {case.sample.summary()}: {c.reason}",
                case.sample.case,
                worst=c.worst,
                cases=counted,
                out_of_model=uncompared,
            )
        if not discriminating:
            why = (
                "every reference was degenerate: an all-zero output passes too"
                if compared or not uncompared
                else "every element was out of model: none was compared"
            )
            return Result(check, Status.MISTRUSTED, why, worst, worst_case, counted, self.repro(check), uncompared)
        return self.passed(check, "", worst=worst, case=worst_case, cases=counted, out_of_model=uncompared)

    def forward_pairs(self, worst_case_bound: bool = False):
        def pairs(case):
            return [
                (
                    "y",
                    case.y,
                    case.reference,
                    case.magnitude,
                    self.spec.error,
                    case.length,
                    case.sample.worst_case or worst_case_bound,
                    case.f32,
                )
            ]

        return pairs

    def vjp_pairs(self, case):
        shapes = shapes_of(case.arrays)
        out = []
        for name in self.spec.differentiable:
            model = self.spec.vjp_error_for(name)
            n = model.length(shapes, case.params) if isinstance(model, Accumulation) else 1
            ys, rs, ms, runs = (
                case.grads[name],
                case.reference_grads[name],
                case.magnitude_grads[name],
                case.f32_grads[name],
            )
            quads = zip(ys, rs, ms, runs) if isinstance(rs, tuple) else [(ys, rs, ms, runs)]
            out += [(f"d{name}", y, r, m, model, n, case.sample.worst_case, run) for y, r, m, run in quads]
        return out

    def left_fold_pairs(self, case):
        fold = self.spec.left_fold(case.arrays, working_params(case.params, np.float32))
        r = np.asarray(fold, dtype=np.float64)
        return [("y against the float32 left fold", case.y, r, np.zeros(r.shape), LEFT_FOLD, 1, True, None)]

    def order_pairs(self, case):
        return self.forward_pairs(worst_case_bound=True)(case) + (self.vjp_pairs(case) if self.spec.has_vjp else [])

    def check_value(self) -> Result:
        return self.compare_cases("value", [c for c in self.cases if not c.special], self.forward_pairs())

    def check_special(self) -> Result:
        cases = [c for c in self.cases if c.special]
        if not cases:
            return Result("value.special", Status.SKIPPED, "the op's edges hold no NaN, infinity or -0")
        return self.compare_cases("value.special", cases, self.forward_pairs())

    def check_vjp(self) -> Result:
        if not self.spec.has_vjp:
            return Result("vjp", Status.SKIPPED, "VJP mode none: the op has no reverse derivative")
        ties = set(self.spec.tie_cases)
        cases = [c for c in self.cases if c.sample.case not in ties]
        return self.compare_cases("vjp", cases, self.vjp_pairs)

    def check_vjp_reference(self) -> Result:
        from capsule_core.verify import gradcheck

        if not self.spec.has_vjp:
            return Result("vjp.reference", Status.SKIPPED, "VJP mode none: nothing to check")
        samples = sized_samples(self.spec, "small", self.seed)
        if self.quick:
            samples = samples[:1]
        worst, count = 0.0, 0
        for sample in samples:
            for test in (gradcheck.finite_difference, gradcheck.adjoint_identity):
                r = test(self.spec, sample)
                count += 1
                worst = max(worst, r.worst)
                if not r.passed:
                    return self.failed(
                        "vjp.reference",
                        f"{test.__name__} on {sample.case}: {r.detail}",
                        sample.case,
                        worst=r.worst,
                        cases=count,
                    )
        return self.passed("vjp.reference", "finite differences and the adjoint identity", worst=worst, cases=count)

    def check_reduction_order(self) -> Result:
        """The numerical policy on the op's order inputs (sums whose value depends on the order:
        large cancelling terms among many small ones, in several orders): fixed-left must be
        bitwise the float32 left fold, implementation-defined within the order-free worst-case
        bound, forward and VJP."""
        check = "reduction.order"
        policy = self.capsule.numerical_policy.reduction
        if policy is ReductionPolicy.NOT_APPLICABLE:
            return Result(check, Status.SKIPPED, "no reduction (policy n/a)")
        if self.spec.order_inputs is None:
            return Result(check, Status.SKIPPED, self.spec.no_order_inputs or "the op defines no order inputs")
        fixed_left = policy is ReductionPolicy.FIXED_LEFT
        if fixed_left and self.spec.left_fold is None:
            return Result(check, Status.SKIPPED, f"declared fixed-left, but {self.spec.name} has no float32 left fold")
        cases = []
        for sample in self.spec.order_inputs():
            if self.case_filter in (None, sample.case):
                cases.append(self.prepare(sample))
                self.execute(cases[-1])
        result = self.compare_cases(check, cases, self.left_fold_pairs if fixed_left else self.order_pairs)
        if result.status is not Status.PASSED:
            return result
        promise = "bitwise the float32 left fold" if fixed_left else "within the order-free worst-case bound"
        inputs = f"{len(cases)} order input{'s' if len(cases) != 1 else ''}"
        return replace(result, reason=f"{promise} on {inputs} (sums whose value depends on the summation order)")

    def check_determinism(self) -> Result:
        ran = [c for c in self.cases if not c.error and c.y is not None and c.y.size]
        picks = ran[:3] + [max(ran, key=lambda c: c.y.size)] if ran else []
        if not picks:
            return Result("determinism", Status.SKIPPED, "no non-empty case ran")
        for case in picks:
            first_y, first_grads = case.y, case.grads
            again = replace(case, y=None, grads=None, outputs=[], intact=[], error=None)
            with getattr(self.backend, "other_schedule", nullcontext)():
                self.execute(again)
            if again.error:
                return self.crashed("determinism", again)
            if not _same_bits(again.y, first_y) or (
                first_grads and any(not _same_bits(again.grads[k], first_grads[k]) for k in first_grads)
            ):
                return self.failed(
                    "determinism",
                    f"two runs of {case.sample.case} differ in their bits (on the emulator the second runs "
                    "blocks and threads in reversed order)",
                    case.sample.case,
                    cases=len(picks),
                )
        return self.passed("determinism", "forward and backward repeat bitwise", cases=len(picks))

    def check_bounds(self) -> Result:
        count = 0
        for case in self.cases:
            if case.error:
                return self.crashed("bounds", case)
            for label, out in case.outputs:
                count += 1
                damage, unwritten = out.guard_damage(), out.unwritten()
                if damage or unwritten:
                    what = ", ".join(
                        t
                        for t in (
                            f"{damage} guard elements overwritten" if damage else "",
                            f"{unwritten} of {out.size} elements never written" if unwritten else "",
                        )
                        if t
                    )
                    return self.failed(
                        "bounds", f"{label} {case.sample.summary()}: {what}", case.sample.case, cases=count
                    )
            if case.overruns:
                label, damage = case.overruns[0]
                what = f"{damage} guard elements overwritten (a write past the buffer)"
                return self.failed("bounds", f"{label} {case.sample.summary()}: {what}", case.sample.case, cases=count)
        return self.clean("bounds", count, "guard bands intact, every element written")

    def check_inputs_intact(self) -> Result:
        count = 0
        for case in self.cases:
            for label, ok in case.intact:
                count += 1
                if not ok:
                    return self.failed(
                        "inputs.intact",
                        f"{label} {case.sample.summary()}: an input changed",
                        case.sample.case,
                        cases=count,
                    )
        return self.clean("inputs.intact", count, "every input bitwise unchanged")

    def check_shape_guard(self) -> Result:
        cases = self.spec.errors()
        for i, error_case in enumerate(cases):
            case_id = error_case.sample.case
            before = getattr(self.backend, "launch_count", 0)
            try:
                self.backend.forward(
                    self.spec, dict(error_case.sample.inputs), dict(error_case.sample.params), GuardedOutput((0,))
                )
            except InputError as exc:
                if not isinstance(exc, error_case.error) or not re.search(error_case.match, str(exc)):
                    return self.failed(
                        "shape.guard",
                        f"{case_id}: {type(exc).__name__}({exc}) is not {error_case.error.__name__} "
                        f"matching {error_case.match!r}",
                        case_id,
                        cases=i + 1,
                    )
            except Exception as exc:
                return self.failed(
                    "shape.guard", f"{case_id}: crashed with {type(exc).__name__}: {exc}", case_id, cases=i + 1
                )
            else:
                return self.failed(
                    "shape.guard", f"{case_id}: accepted, expected {error_case.error.__name__}", case_id, cases=i + 1
                )
            if getattr(self.backend, "launch_count", 0) != before:
                return Result(
                    "shape.guard",
                    Status.FAILED,
                    f"{case_id}: refused, but only after a launch",
                    case=case_id,
                    cases=i + 1,
                )
        return self.passed("shape.guard", f"{len(cases)} error inputs refused before any launch", cases=len(cases))

    def check_rng(self) -> Result:
        from capsule_core.ops.random import uniform_values

        if "seed" not in {p.name for p in self.spec.params}:
            return Result("rng", Status.SKIPPED, "not a seeded op")
        base = sized_samples(self.spec, "medium", self.seed)[0]
        params = dict(base.params)

        def run(p):
            _, _, shape = validate(self.spec, {}, p, np.float32)
            out = GuardedOutput(shape)
            self.backend.forward(self.spec, {}, dict(p), out)
            return out.view.copy()

        try:
            a, b = run(params), run(params)
            other = run({**params, "seed": (params["seed"] + 1) % 2**64})
        except Exception as exc:
            return Result("rng", Status.ERROR, f"{type(exc).__name__}: {exc}")
        from capsule_core.catalog.cpu_providers import REFERENCE

        ref = REFERENCE.forward(self.spec, {}, **params).astype(np.float32)
        problems = []
        if not _same_bits(a, b):
            problems.append("the same seed gave different bits")
        if a.size and _same_bits(a, other):
            problems.append("another seed gave the same bits")
        if not _same_bits(a, ref):
            problems.append("not bitwise the reference generator")
        u = uniform_values(params["seed"], a.size, np.float64)
        if self.spec.name == "rand_uniform":
            values = np.sort(a.reshape(-1).astype(np.float64))
            ranks = np.arange(values.size + 1) / max(values.size, 1)
            d = float(max(np.max(ranks[1:] - values), np.max(values - ranks[:-1]))) if values.size else 0.0
            limit = 1.63 / max(values.size, 1) ** 0.5
            if d > limit:
                problems.append(f"Kolmogorov-Smirnov D = {d:.4g} > {limit:.4g} (alpha 0.01)")
        else:
            p = float(np.float32(params["p"]))
            kept = float(np.sum(a))
            expected, spread = p * a.size, (a.size * p * (1 - p)) ** 0.5
            if spread > 0 and abs(kept - expected) > 4.0 * spread:
                problems.append(f"{kept:.0f} kept of {a.size}, expected {expected:.0f} ± {spread:.1f} (4 sigma)")
            if not _same_bits(a, (u < p).astype(np.float32).reshape(a.shape)):
                problems.append("the mask is not u < p")
        if problems:
            return Result("rng", Status.FAILED, "; ".join(problems), case=base.case, repro=self.repro("rng"))
        return self.passed("rng", "seeded, reproducible, bitwise the reference stream, statistically sound", cases=3)

    def check_selection_ties(self, tie_cases: tuple[str, ...] | None = None) -> Result:
        """Under ties each window's gradient goes to exactly one tied cell, on the cases of
        `tie_cases` (default: the op's own tie cases; fuzz passes the case it drew)."""
        windows = self.spec.windows
        if windows is None:
            return Result("selection.ties", Status.SKIPPED, "no selection: the op has no tie winner")
        ties = set(self.spec.tie_cases if tie_cases is None else tie_cases)
        checked = 0
        for case in [c for c in self.cases if c.sample.case in ties]:
            x = case.arrays["x"].reshape(-1)
            cells = windows(case.arrays["x"].shape, case.params)
            for o in range(min(len(cells), 64)):
                g = np.zeros(case.out_shape, np.float32)
                g.reshape(-1)[o] = 1.0
                grads = gradient_outputs(self.spec, case.arrays)
                try:
                    self.backend.backward(self.spec, _copy_inputs(case.arrays), dict(case.sample.params), g, grads)
                except Exception as exc:
                    return Result("selection.ties", Status.ERROR, f"{type(exc).__name__}: {exc}", case=case.sample.case)
                dx = grads["x"].view.reshape(-1)
                hit = np.flatnonzero(dx)
                window = cells[o][cells[o] >= 0]
                values = x[window]
                checked += 1
                if np.all(np.isnan(values)):
                    if hit.size:
                        return self._tie_failure(case, o, "an all-NaN window gave a gradient")
                    continue
                best = np.nanmax(values)
                maximal = set(window[values == best].tolist())
                if hit.size != 1 or dx[hit[0]] != 1.0 or int(hit[0]) not in maximal:
                    return self._tie_failure(
                        case,
                        o,
                        f"gradient at {hit.tolist()} (values {dx[hit].tolist()}), maximal cells {sorted(maximal)}",
                    )
        if not checked:
            return Result("selection.ties", Status.SKIPPED, "no tie case declared")
        return self.passed("selection.ties", "each window's gradient goes to exactly one maximal cell", cases=checked)

    def check_sanitizer(self, tool: str) -> Result:
        """Every sample and edge case, forward and backward, through the kernels under `tool`, all
        in one sanitizer process (a batch): the first finding fails the check with its case and
        trimmed report (the whole text in `details`)."""
        from capsule_core.sanitize.engine import SanitizerFinding, SanitizerTimeout, backend_for, compute_sanitizer

        check = f"sanitize.{tool}"
        if not self.capsule.symbols:
            return Result(check, Status.SKIPPED, f"{self.capsule.name} launches no kernel")
        if self.backend.name == "cuda":
            outcome = compute_sanitizer(tool, short_name(self.capsule), self.seed, self.quick, self.case_filter)
            status = {"finding": Status.FAILED, "clean": Status.PASSED, "skipped": Status.SKIPPED}[outcome.status]
            return Result(check, status, outcome.summary, repro=self.sanitizer_repro(tool), details=outcome.text)
        backend = backend_for(tool, batch=True)
        backend.bind(self.capsule)
        runs, sample = 0, None
        samples = self.samples()
        try:
            for sample in samples:
                arrays, _, out_shape = validate(self.spec, sample.inputs, sample.params, np.float32)
                backend.begin_case(sample.case)
                backend.forward(self.spec, _copy_inputs(arrays), dict(sample.params), GuardedOutput(out_shape))
                runs += 1
                if self.spec.has_vjp:
                    g = (
                        seeded_rng(self.spec.name, f"g/{sample.case}", self.seed)
                        .standard_normal(out_shape)
                        .astype(np.float32)
                    )
                    backend.backward(
                        self.spec, _copy_inputs(arrays), dict(sample.params), g, gradient_outputs(self.spec, arrays)
                    )
                    runs += 1
            sample = None  # every case is recorded: the batch runs now
            backend.flush()
        except SanitizerFinding as exc:
            found = next((s for s in samples if s.case == exc.case), sample)
            return Result(
                check,
                Status.FAILED,
                f"{found.summary()}: {exc.finding.summary}",
                case=found.case,
                cases=runs if sample is None else runs + 1,
                repro=self.sanitizer_repro(tool, found.case),
                details=exc.finding.text,
            )
        except SanitizerTimeout as exc:  # no verdict on the case the limit struck in, named for its rerun
            return Result(
                check,
                Status.ERROR,
                f"{type(exc).__name__}: {exc}",
                case=exc.case,
                cases=runs,
                repro=self.sanitizer_repro(tool, exc.case),
            )
        except Exception as exc:  # the runner could not run the case (or the batch): no verdict on it
            return Result(
                check,
                Status.ERROR,
                (f"{sample.summary()}: " if sample is not None else "") + f"{type(exc).__name__}: {exc}",
                case=sample.case if sample is not None else None,
                cases=runs,
                repro=self.sanitizer_repro(tool, sample.case if sample is not None else None),
            )
        return Result(
            check,
            Status.PASSED,
            f"{runs} kernel runs (forward and backward) clean",
            cases=runs,
            repro=self.sanitizer_repro(tool),
        )

    def sanitizer_repro(self, tool: str, case: str | None = None) -> str:
        line = f"capsules verify {short_name(self.capsule)} --check sanitize.{tool} --seed {self.seed}"
        return line + library_option(self.capsule) + (f" --case {case}" if case else "")

    def _tie_failure(self, case, o, what) -> Result:
        return self.failed("selection.ties", f"{case.sample.case} window {o}: {what}", case.sample.case)


def static_arches(quick: bool) -> tuple[str, ...]:
    """The architectures ffi.symbols and launch.plan compile for: sm_90 alone in a quick run."""
    from capsule_core.check import engine as check

    return ("sm_90",) if quick else check.ARCHES


def run_builds(capsules, backend: str, quick: bool, checks=None, tools=()) -> dict:
    """Every build a verify run of `capsules` makes, as {name: build} for build_in_parallel, so
    that they are made side by side before the first capsule instead of one capsule at a time:
    nvcc's compiles for ffi.symbols and launch.plan, the emulator builds on emu (the kernels and
    synccheck run on them) and the sanitizers' runners."""
    from capsule_core.check.engine import nvcc_builds

    wanted = set(checks or CHECKS)
    builds = nvcc_builds(capsules, static_arches(quick)) if wanted & {"ffi.symbols", "launch.plan"} else {}
    if backend == "emu" and (tools or wanted - set(STATIC_CHECKS)):
        from capsule_core.sanitize.engine import sanitizer_builds

        builds.update(sanitizer_builds(capsules, tools))
    return builds


def static_results(capsule: KernelCapsule, quick: bool, compiled: bool) -> list[Result]:
    """contract.aligned, and ffi.symbols / launch.plan through `capsules check` when nvcc is here
    (unless `compiled` is False: contract.aligned alone, nothing compiled)."""
    from capsule_core.errors import EnvironmentMissing

    out = [
        Result(
            "contract.aligned",
            Status.PASSED if contracts_aligned(capsule) else Status.FAILED,
            "" if contracts_aligned(capsule) else "a descriptor states another aspect's obligation",
        )
    ]
    if not compiled:
        return out
    if not launches_kernels(capsule):
        reason = f"{capsule.name} launches no native kernel"
        return out + [Result("ffi.symbols", Status.SKIPPED, reason), Result("launch.plan", Status.SKIPPED, reason)]
    from capsule_core.check import engine as check

    try:
        report = check.check(
            [capsule],
            static_arches(quick),
            sizes=("small",) if quick else ("small", "medium", "large"),
        )
    except EnvironmentMissing as exc:
        return out + [Result("ffi.symbols", Status.SKIPPED, str(exc)), Result("launch.plan", Status.SKIPPED, str(exc))]
    items = {i.check: i for i in report.capsules[0].items}
    for check_id in ("ffi.symbols", "launch.plan"):
        item = items.get(check_id)
        if item is None:
            out.append(Result(check_id, Status.SKIPPED, "not reached: ffi.symbols failed"))
        elif item.status is check.Status.PENDING:
            out.append(Result(check_id, Status.SKIPPED, "; ".join(item.messages)))
        else:
            status = Status.PASSED if item.status is check.Status.PASSED else Status.FAILED
            out.append(Result(check_id, status, "; ".join(item.messages), repro=f"capsules check {capsule.op.value}"))
    return out


def verify_capsule(
    capsule: KernelCapsule,
    backend,
    *,
    quick: bool = False,
    seed: int = 0,
    checks: tuple[str, ...] | None = None,
    case: str | None = None,
    sanitize: tuple[str, ...] = (),
) -> CapsuleReport:
    """The report of one capsule: the checks wanted (default: every contract check), then one
    sanitize.<tool> check per sanitizer of `sanitize` (capsule_core.sanitize.engine)."""
    start = time.perf_counter()
    wanted = set(checks or CHECKS)
    asked = [c.split(".", 1)[1] for c in SANITIZER_CHECKS if c in wanted]
    sanitize = tuple(dict.fromkeys((*sanitize, *asked)))
    wanted -= set(SANITIZER_CHECKS)
    spec = get_spec(capsule.op.value)
    run = Session(capsule, spec, backend, quick, seed, case)
    static = wanted & set(STATIC_CHECKS)
    compiled = bool(static - {"contract.aligned"})
    results = [r for r in static_results(capsule, quick, compiled) if r.check in wanted] if static else []
    dynamic = wanted - set(STATIC_CHECKS)
    activity.working_on(capsule=capsule.name)
    try:
        sampled = dynamic & {
            "value",
            "value.special",
            "vjp",
            "determinism",
            "bounds",
            "inputs.intact",
            "selection.ties",
        }
        if sampled:
            activity.working_on(check=", ".join(c for c in CHECKS if c in sampled) + " (their cases)")
            for sample in run.samples():
                c = run.prepare(sample)
                run.execute(c)
                run.cases.append(c)
        order = [
            ("shape.guard", run.check_shape_guard),
            ("value", run.check_value),
            ("value.special", run.check_special),
            ("vjp", run.check_vjp),
            ("vjp.reference", run.check_vjp_reference),
            ("reduction.order", run.check_reduction_order),
            ("determinism", run.check_determinism),
            ("rng", run.check_rng),
            ("selection.ties", run.check_selection_ties),
            ("bounds", run.check_bounds),
            ("inputs.intact", run.check_inputs_intact),
        ]
        for check_id, function in order:
            if check_id in dynamic:
                activity.working_on(check=check_id, case="")
                results.append(function())
        for tool in sanitize:
            activity.working_on(check=f"sanitize.{tool}", case="")
            results.append(run.check_sanitizer(tool))
    except Exception as exc:
        if not getattr(exc, "poisoned", False):
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        else:
            detail = f"the CUDA context is poisoned: {exc}"
        done = {r.check for r in results}
        results += [Result(c, Status.ERROR, detail) for c in CHECKS if c in dynamic and c not in done]
        results += [Result(f"sanitize.{t}", Status.ERROR, detail) for t in sanitize if f"sanitize.{t}" not in done]
    order = list(ALL_CHECKS)
    results.sort(key=lambda r: order.index(r.check))
    return CapsuleReport(capsule.name, tuple(results), time.perf_counter() - start)


def verify(
    capsules, backend, *, quick: bool = False, seed: int = 0, checks=None, case=None, sanitize: tuple[str, ...] = ()
) -> Iterator[CapsuleReport]:
    """One CapsuleReport per capsule, as each finishes (so a caller can stop and keep the rest)."""
    for capsule in capsules:
        yield verify_capsule(capsule, backend, quick=quick, seed=seed, checks=checks, case=case, sanitize=sanitize)
