"""What every kernel family's test checks without a GPU, written once:

- the nvcc build of cuda/<family>.cu for every arch of `capsules check`, through compile_file's
  content-hash cache (CAPSULES_CACHE; each file compiled at most once a session): within the
  family's KernelBudget (capsule_core/kernels/plans/<family>.BUDGET, what `capsules check` enforces: no nvcc
  warning, no spills, registers and stack frames as declared), every kernel of the file a
  registered entry point and a PTX .entry with the declared parameter types, and the source
  spelling out each declared signature;
- the launch plans of every sample and edge input: legal on every arch, each launch fitting the
  compiled kernel's registers and shared memory, the outputs shaped as the op's results, and
  planted faults reported;
- results of the kernels (cuda/<family>.cu on the emu backend through tests/kernel_emu.py, or a
  host harness in their place) against the float64 reference under the op's error model.

A family's test adds what is its own: its launch shapes and planted faults, its host math.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Iterator

import numpy as np
import pytest

from capsule_core.catalog import reference, registry
from capsule_core.catalog.cpu_providers import REFERENCE
from capsule_core.check.engine import (
    budget_for,
    budget_problems,
    expected_ptx_type,
    fit_problems,
    read_problems,
    source_declaration,
)
from capsule_core.kernels.launch import LaunchPlan, flat_buffers, plan_functions, plan_problems
from capsule_core.kernels.nvcc import ARCHES, CompiledFile, CompileError, compile_all, cuda_source_dir
from capsule_core.ops import get_spec
from capsule_core.ops.base import Exact, seeded_rng, shapes_of, validate
from capsule_core.verify.numerics import compare

SIZES = ("small", "medium", "large")
"""Static plus dynamic shared memory a block gets without the opt-in attribute."""


# -- the registry's view of a family ----------------------------------------------------------------


def capsules(family: str):
    return [c for c in registry.catalog() if c.family == family and c.symbols]


def family_ops(family: str) -> set[str]:
    """The ops whose native capsule is in the family (with kernels or, like reshape, without)."""
    return {c.op.value for c in registry.catalog() if c.family == family and registry.lookup(c.op.value) is c}


def symbols(*ops: str) -> dict:
    """{symbol: NativeSymbolRef} of the ops' native capsules."""
    return {ref.symbol: ref for op in ops for ref in registry.lookup(op).symbols}


def family_budget(family: str):
    """The budget beside the family's plans (capsule_core/kernels/plans/<family>.py)."""
    return budget_for(capsules(family)[0])


def family_symbols(family: str) -> dict:
    return {ref.symbol: ref for c in capsules(family) for ref in c.symbols}


# -- the build -----------------------------------------------------------------------------------------


@lru_cache(maxsize=None)
def compiled(family: str) -> dict[str, CompiledFile]:
    """cuda/<family>.cu for every arch (in parallel) from compile_file's cache: cubin, PTX and the
    whole nvcc log (ptxas -v report and any warning)."""
    source = cuda_source_dir() / f"{family}.cu"
    results = compile_all([(source, arch) for arch in ARCHES])
    failed = [str(r) for r in results.values() if isinstance(r, CompileError)]
    if failed:
        raise AssertionError("\n".join(failed))
    return {arch: results[(source, arch)] for arch in ARCHES}


def build_problems(family: str, arch: str) -> list[str]:
    """A build within the family's KernelBudget whose kernels are exactly the registry's symbols,
    each a PTX .entry with the declared parameter types."""
    build = compiled(family)[arch]
    refs = family_symbols(family)
    resources = build.resources
    problems = budget_problems(family_budget(family), build, refs.values())
    if set(resources) != set(refs):
        problems.append(
            f"{arch}: kernels not registered {sorted(set(resources) - set(refs))}, "
            f"registered but not compiled {sorted(set(refs) - set(resources))}"
        )
    entries = build.entries
    for name, ref in refs.items():
        if name not in entries:
            problems.append(f"{name}: no .entry in the {arch} PTX")
            continue
        got, want = [p.ptx_type for p in entries[name]], [expected_ptx_type(p) for p in ref.params]
        if got != want:
            problems.append(f"{name} ({arch}): PTX parameters {got} for the declared {want} ({ref.params})")
    return problems


def signature_problems(family: str, launch_bounds: bool | None = None) -> list[str]:
    """Each entry point written literally in cuda/<family>.cu (no macro-made names) with the
    registry's parameter list; `launch_bounds` True: each declares __launch_bounds__, False: none
    does, None: either."""
    text = (cuda_source_dir() / f"{family}.cu").read_text()
    problems = []
    for name, ref in family_symbols(family).items():
        if ref.path != f"cuda/{family}.cu":
            problems.append(f"{name}: declared in {ref.path}, not cuda/{family}.cu")
        match = source_declaration(ref, text)  # what `capsules check` holds it to
        if match is None:
            problems.append(f"{name}: the source does not declare ({', '.join(ref.params)})")
        elif launch_bounds is not None and bool(match[1] or match[2]) != launch_bounds:
            problems.append(f"{name}: __launch_bounds__ {'missing' if launch_bounds else 'not expected'}")
    return problems


# -- samples ---------------------------------------------------------------------------------------------


def cases(op: str, sizes=SIZES):
    """The op's samples of `sizes`, then its edges."""
    spec = get_spec(op)
    out = []
    for size in sizes:
        out += spec.samples(size, seeded_rng(spec.name, size))
    return out + spec.edges()


def refusal(op: str, inputs: dict, params: dict, error: type) -> str:
    """The message of the `error` that the float64 reference must raise for the op on `inputs`."""
    with pytest.raises(error) as info:
        reference.forward(op, inputs, **params)
    return str(info.value)


def cotangent(op: str, case: str, shape) -> np.ndarray:
    """The cotangent test_ops_contract uses for a case."""
    return seeded_rng(op, f"g/{case}").standard_normal(shape).astype(np.float32)


def plan_inputs(spec, arrays: dict) -> dict:
    """Buffer contents by name: the op's inputs, a variadic one's as xs[0], xs[1], ..."""
    out = {}
    for t in spec.inputs:
        if t.variadic:
            out.update({f"{t.name}[{i}]": a for i, a in enumerate(arrays[t.name])})
        else:
            out[t.name] = arrays[t.name]
    return out


def gradients(spec, outputs: dict) -> dict:
    """A backward plan's outputs {"dx": a, "dxs[0]": b, ...} as {"x": a, "xs": (b, ...)}."""
    out = {}
    for t in spec.inputs:
        if not t.differentiable:
            continue
        if t.variadic:
            parts = sorted((k for k in outputs if k.startswith(f"d{t.name}[")), key=lambda k: int(k.split("[")[1][:-1]))
            out[t.name] = tuple(outputs[k] for k in parts)
        else:
            out[t.name] = outputs[f"d{t.name}"]
    return out


def result_shapes(spec, arrays: dict, out_shape) -> tuple[dict, dict]:
    """The outputs a forward and a backward plan declare: {"out": y's shape}, {"dx": x's shape, ...}."""
    grads = flat_buffers({name: arrays[name] for name in spec.differentiable}, "d")
    return {"out": tuple(out_shape)}, {k: tuple(np.shape(v)) for k, v in grads.items()}


def bits(a) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def same_bits(a, b) -> bool:
    return np.array_equal(bits(a), bits(b))


# -- launch plans --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanCase:
    sample: object
    arrays: dict
    params: dict
    out_shape: tuple
    forward: LaunchPlan
    backward: LaunchPlan | None
    """None for an op without a VJP."""

    @property
    def plans(self) -> tuple[LaunchPlan, ...]:
        return (self.forward,) if self.backward is None else (self.forward, self.backward)


def plan_cases(op: str, sizes=SIZES) -> Iterator[PlanCase]:
    """The forward and backward plan of every case."""
    spec = get_spec(op)
    forward, backward = plan_functions(registry.lookup(op))
    for sample in cases(op, sizes):
        arrays, params, out_shape = validate(spec, sample.inputs, sample.params, np.float32)
        yield PlanCase(
            sample,
            arrays,
            params,
            tuple(out_shape),
            forward(arrays, params),
            backward(arrays, params) if spec.has_vjp else None,
        )


def plan_case_problems(
    op: str,
    sizes=SIZES,
    *,
    all_inputs: bool = True,
    reference_shapes: float = 0,
    check: Callable[[PlanCase], None] | None = None,
) -> list[str]:
    """Over every case: the family's PLANS are the ones launch.plan_functions finds; the forward
    (and backward) plans are legal on every arch and fit the compiled kernels (fit_problems); they
    declare the outputs of result_shapes; the forward reads every input of the op (or, without
    `all_inputs`, only inputs) and the backward only inputs, "out" and "g". Cases with fewer output
    elements than `reference_shapes` also match those shapes with the float64 reference's.
    `check(case)` asserts what is the family's own."""
    spec = get_spec(op)
    capsule = registry.lookup(op)
    refs = {r.symbol: r for r in capsule.symbols}
    family_plans = importlib.import_module(f"capsule_core.kernels.plans.{capsule.family}").PLANS
    problems = []
    if tuple(plan_functions(capsule)) != tuple(family_plans[op]):
        problems.append(f"{op}: launch.plan_functions does not find capsule_core.kernels.plans.{capsule.family}.PLANS")
    if spec.has_vjp != (family_plans[op][1] is not None):
        problems.append(f"{op}: a backward plan {'missing' if spec.has_vjp else 'without a VJP'}")
        return problems
    resources = {arch: b.resources for arch, b in compiled(capsule.family).items()} if refs else {}
    for case in plan_cases(op, sizes):
        where = case.sample.case
        outputs = result_shapes(spec, case.arrays, case.out_shape)
        if int(np.prod(case.out_shape)) < reference_shapes:
            outputs = _reference_shapes(spec, case.sample, outputs, problems)
        for plan, declared in zip(case.plans, outputs):
            for arch in ARCHES:
                problems += [f"{where} {plan.direction} {arch}: {p}" for p in plan_problems(plan, refs, arch)]
                for launch in plan.kernel_launches:
                    problems += [
                        f"{where} {plan.direction} {arch}: {p}"
                        for p in fit_problems(launch, resources.get(arch, {}), arch)
                    ]
            if {k: tuple(v) for k, v in plan.output_shapes.items()} != declared:
                problems.append(f"{where} {plan.direction}: outputs {dict(plan.output_shapes)} != {declared}")
        problems += [f"{where} {p}" for p in read_problems(spec, case.arrays, case.forward, case.backward)]
        names = set(plan_inputs(spec, case.arrays))
        read = {b.name for b in case.forward.buffers if b.role == "input"}
        if all_inputs and read != names:  # the family's own rule, beyond the gate's: every input read
            problems.append(f"{where} forward: input buffers {sorted(read)} for the op's {sorted(names)}")
        if check is not None:
            check(case)
    return problems


def _reference_shapes(spec, sample, outputs, problems):
    """The float64 reference's result shapes, noting where they differ from `outputs`."""
    y = REFERENCE.forward(spec, sample.inputs, **sample.params)
    forward = {"out": tuple(y.shape)}
    backward = {}
    if spec.has_vjp:
        grads = REFERENCE.vjp(spec, sample.inputs, np.zeros(y.shape, np.float32), **sample.params)
        backward = {k: tuple(v.shape) for k, v in flat_buffers(grads, "d").items()}
    if (forward, backward) != tuple(outputs):
        problems.append(f"{sample.case}: the reference's shapes {forward} {backward} are not the op's {outputs}")
    return forward, backward


def launch_plans(op: str, inputs: dict, params: dict | None = None) -> tuple[LaunchPlan, ...]:
    """The forward (and backward) plan of the op on float32 `inputs`, as emulate() runs them."""
    spec = get_spec(op)
    forward, backward = plan_functions(registry.lookup(op))
    arrays, params, _ = validate(spec, inputs, params or {}, np.float32)
    return (forward(arrays, params),) + ((backward(arrays, params),) if spec.has_vjp else ())


def with_launch(plan: LaunchPlan, index: int = 0, **changes) -> LaunchPlan:
    """`plan` with launch `index` changed (dataclasses.replace)."""
    launches = list(plan.launches)
    launches[index] = dataclasses.replace(launches[index], **changes)
    return dataclasses.replace(plan, launches=tuple(launches))


def missed_faults(plan: LaunchPlan, refs: dict, faults, index: int = 0, arch: str = "sm_90") -> list[str]:
    """plan_problems passes `plan` and reports each planted fault: (a fragment of the message it
    must give, the changes to launch `index` or a whole faulty plan)."""
    problems = [f"the plan itself: {p}" for p in plan_problems(plan, refs, arch)]
    for fragment, fault in faults:
        faulty = fault if isinstance(fault, LaunchPlan) else with_launch(plan, index, **fault)
        reported = plan_problems(faulty, refs, arch)
        if not any(fragment in m for m in reported):
            problems.append(
                f"{'a plan' if isinstance(fault, LaunchPlan) else fault} not reported as {fragment!r}: {reported}"
            )
    return problems


def missed_launch_faults(plan: LaunchPlan, refs: dict, faults=(), index: int = 0, arch: str = "sm_90") -> list[str]:
    """missed_faults of `faults` after the two every kernel launch must be refused for: launch
    `index` on a block of 2048 threads, and without its last argument."""
    launch = plan.launches[index]
    n = len(launch.args)
    every_launch = [
        ("2048 threads", {"block": (2048, 1, 1)}),
        (f"{n - 1} arguments for {n}", {"args": launch.args[:-1]}),
    ]
    return missed_faults(plan, refs, every_launch + list(faults), index, arch)


# -- results against the reference -------------------------------------------------------------------


@dataclass
class Compared:
    problems: list[str]
    worst: float
    """The largest error over its bound (numerics.compare's `worst`) over every output."""


def compared(op: str, sample, y=None, grads: dict | None = None, g=None, label: str = "") -> Compared:
    """y (the forward's result) and grads ({input: gradient}, a tuple of them for a variadic input:
    the VJP at cotangent g) against the float64 reference under the op's error models."""
    spec = get_spec(op)
    arrays, params, _ = validate(spec, sample.inputs, sample.params, np.float32)
    shapes = shapes_of(arrays)
    where = f"{op} {sample.summary()}{label}"
    results, problems = [], []
    if y is not None:
        results.append(
            (
                "forward",
                y,
                REFERENCE.forward(spec, sample.inputs, **sample.params),
                REFERENCE.magnitude(spec, sample.inputs, **sample.params),
                spec.error,
            )
        )
    if grads is not None:
        if set(grads) != set(spec.differentiable):
            problems.append(f"{where}: gradients of {sorted(grads)}, not of {sorted(spec.differentiable)}")
        r = REFERENCE.vjp(spec, sample.inputs, g, **sample.params)
        m = REFERENCE.vjp_magnitude(spec, sample.inputs, g, **sample.params)
        for name in spec.differentiable:
            model = spec.vjp_error_for(name)
            if isinstance(r[name], tuple):
                results += [
                    (f"d{name}[{i}]", *parts, model) for i, parts in enumerate(zip(grads[name], r[name], m[name]))
                ]
            else:
                results.append((f"d{name}", grads[name], r[name], m[name], model))
    worst = 0.0
    for what, got, ref, magnitude, model in results:
        n = model.length(shapes, params) if hasattr(model, "length") else 1
        result = compare(got, ref, magnitude, model, n, sample.worst_case)
        worst = max(worst, result.worst)
        if not result.passed:
            problems.append(f"{where}: {what} {result.reason} (worst {result.worst:.3g})")
    return Compared(problems, worst)


def check_host_model(op: str, sample, forward=None, vjp=None, g=None, label: str = "") -> float:
    """A host model of the kernels against the reference: forward(arrays, params) -> y and/or
    vjp(arrays, params, g) -> {input: gradient} at the case's cotangent (or `g`); asserts that they
    meet the error models and returns the worst error over its bound."""
    spec = get_spec(op)
    arrays, params, out_shape = validate(spec, sample.inputs, sample.params, np.float32)
    if vjp is not None and g is None:
        g = cotangent(op, sample.case, out_shape)
    result = compared(
        op,
        sample,
        None if forward is None else forward(arrays, params),
        None if vjp is None else vjp(arrays, params, g),
        g,
        label,
    )
    assert result.problems == [], "\n".join(result.problems)
    return result.worst


# -- the kernels run through their plans ----------------------------------------------------------------


@dataclass
class Emulated:
    """One case run through its plans: the forward, then the backward fed its result."""

    arrays: dict
    params: dict
    y: np.ndarray
    g: np.ndarray | None
    grads: dict | None
    """By input name (a tuple for a variadic input); None for an op without a VJP."""


def emulate(runner, op: str, sample, misalign=None) -> Emulated:
    """The forward and backward plans of a case run by `runner` (a kernel_emu.PlanRunner), buffers
    `misalign` elements off alignment (DeviceBackend.execute's `misalign`)."""
    spec = get_spec(op)
    forward, backward = plan_functions(registry.lookup(op))
    arrays, params, out_shape = validate(spec, sample.inputs, sample.params, np.float32)
    inputs = plan_inputs(spec, arrays)
    y = runner.run(forward(arrays, params), inputs, misalign)["out"]
    if not spec.has_vjp:
        return Emulated(arrays, params, y, None, None)
    g = cotangent(op, sample.case, out_shape)
    outputs = runner.run(backward(arrays, params), {**inputs, "out": y, "g": g}, misalign)
    return Emulated(arrays, params, y, g, gradients(spec, outputs))


def emulated_problems(runner, op: str, sample, misalign=None, exact_bits: bool = False) -> list[str]:
    """emulate() against the reference; with `exact_bits`, the results of exact models also bit for
    bit those of the op's float32 formula (NaN payloads included)."""
    run = emulate(runner, op, sample, misalign)
    problems = compared(op, sample, run.y, run.grads, run.g).problems
    if exact_bits:
        spec = get_spec(op)
        y = spec.forward(run.arrays, run.params)
        if isinstance(spec.error, Exact) and not same_bits(run.y, y):
            problems.append(f"{op} {sample.summary()}: forward bits differ")
        if run.grads is not None:
            exact = spec.vjp(run.arrays, run.params, y, run.g)
            for name in spec.differentiable:
                if isinstance(spec.vjp_error_for(name), Exact):
                    pairs = (
                        zip(run.grads[name], exact[name])
                        if isinstance(exact[name], tuple)
                        else [(run.grads[name], exact[name])]
                    )
                    if not all(same_bits(a, b) for a, b in pairs):
                        problems.append(f"{op} {sample.summary()}: d{name} bits differ")
    return problems


# -- misaligned buffers ----------------------------------------------------------------------------


def float32_off_16(buffer) -> int:
    """A misalignment: every float32 buffer 4 bytes off 16-byte alignment (int64 metadata stays
    aligned)."""
    return int(buffer.dtype == "float32")


# -- the kernels' paths, learned from their launches (view, index) ---------------------------------------


def case_plans(op: str, sample) -> tuple[LaunchPlan, ...]:
    """The forward (and backward) plan of one case."""
    return launch_plans(op, sample.inputs, sample.params)


def emulated_paths(runner, op: str, sample, path_of, misaligned: bool = False) -> list:
    """emulated_problems (exact results bit for bit) asserted empty, float32 buffers 4 bytes off
    16-byte alignment if `misaligned`; returns (symbol, path_of(plan, launch, aligned)) for every
    launch of the case: the path or mode each kernel takes, learned from its entry point, arguments
    and meta data and from whether its float32 buffers are 16-byte aligned (`aligned`)."""
    assert emulated_problems(runner, op, sample, float32_off_16 if misaligned else None, exact_bits=True) == []
    return [
        (launch.symbol, path_of(plan, launch, not misaligned))
        for plan in case_plans(op, sample)
        for launch in plan.launches
    ]


def float32_off_16_in(*roles: str):
    """A misalignment: the float32 buffers of `roles` ("input", "output") 4 bytes off 16-byte
    alignment, every other buffer aligned (a kernel must check each pointer it moves vectors
    through, not one for all)."""
    return lambda buffer: int(buffer.dtype == "float32" and buffer.role in roles)


def misaligned_paths(runner, op: str, sample, path_of) -> list:
    """emulated_paths with every float32 buffer 4 bytes off 16-byte alignment, and emulated_problems
    (exact results bit for bit) asserted empty where only the inputs or only the outputs are off: a
    16-byte access off alignment is the emulator's error, as it is a GPU's fault."""
    paths = emulated_paths(runner, op, sample, path_of, misaligned=True)
    for misalign in (float32_off_16_in("input"), float32_off_16_in("output")):
        assert emulated_problems(runner, op, sample, misalign, exact_bits=True) == [], f"{op} {sample.case}"
    return paths
