"""`capsules check`: the static contract checks, no GPU needed.

Per native capsule: its contracts are aligned; every declared symbol is in its source file and
compiled into a PTX .entry whose parameters match the declared C list; every kernel within its
family's KernelBudget (registers, no spills, no undeclared stack frame, no nvcc warning); launch
plans legal for every sample and edge input of the OpSpec, on every target architecture. Capsules
whose kernels are not written yet are reported PENDING.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from enum import Enum
from functools import partial
from pathlib import Path

from capsule_core.catalog.registry import library_of
from capsule_core.errors import EnvironmentMissing
from capsule_core.kernels.c_types import C_TYPES
from capsule_core.kernels.launch import (
    DYNAMIC_SHARED_LIMIT,
    STATIC_SHARED_LIMIT,
    flat_buffers,
    parse_param,
    plan_functions,
    plan_problems,
)
from capsule_core.kernels.nvcc import (
    ARCHES,
    COMPILE_FLAGS,
    REGISTERS_PER_SM,
    CompiledFile,
    CompileError,
    KernelBudget,
    KernelResources,
    build_name,
    compile_all,
    compile_file,
    find_nvcc,
    source_path,
)
from capsule_core.model import KernelCapsule, NativeSymbolRef, contracts_aligned
from capsule_core.source_files import include_closure


class Status(str, Enum):
    PASSED = "PASSED"
    FAILED = "FAILED"
    PENDING = "PENDING"
    """The capsule's kernels are not written yet."""


@dataclass(frozen=True)
class CheckItem:
    check: str
    status: Status
    messages: tuple[str, ...] = ()


@dataclass(frozen=True)
class KernelRow(KernelResources):
    """ptxas's report for one entry point on one architecture, and its register budget."""

    symbol: str
    arch: str
    max_registers: int


@dataclass(frozen=True)
class CapsuleCheck:
    capsule: str
    items: tuple[CheckItem, ...]
    kernels: tuple[KernelRow, ...]

    @property
    def status(self) -> Status:
        statuses = {i.status for i in self.items}
        if Status.FAILED in statuses:
            return Status.FAILED
        return Status.PENDING if Status.PENDING in statuses else Status.PASSED


@dataclass(frozen=True)
class CheckReport:
    arches: tuple[str, ...]
    nvcc: str
    capsules: tuple[CapsuleCheck, ...]
    seconds: float
    cached_compiles: int
    fresh_compiles: int
    flags: tuple[str, ...] = field(default_factory=tuple)

    @property
    def exit_code(self) -> int:
        return 1 if any(c.status is Status.FAILED for c in self.capsules) else 0


def expected_ptx_type(declared: str) -> str:
    """The PTX type of a declared C parameter (c_types); PTX passes every pointer as a u64."""
    p = parse_param(declared)
    return "u64" if p.pointer else C_TYPES[p.ctype].ptx


def _source_declares(ref: NativeSymbolRef, text: str) -> bool:
    """The source defines the kernel with its declared linkage: `extern "C" __global__ void NAME(`
    with the registry's parameter list written out literally (no macro-made names or lists), or
    for C++ linkage `__global__ void NAME(` (a qualified or templated NAME by its last name; the
    PTX check holds its parameter types)."""
    return source_declaration(ref, text) is not None


def source_declaration(ref: NativeSymbolRef, text: str) -> re.Match | None:
    """Where the source declares `ref` (groups 1 and 2: a __launch_bounds__ before or after void)."""
    bounds = r"(__launch_bounds__\([^)]*\) )?"
    source = re.sub(r"\s+", " ", re.sub(r"\(\s+", "(", text))
    if ref.linkage == "C":
        params = re.escape(", ".join(ref.params))
        return re.search(rf'extern "C" __global__ {bounds}void {bounds}{re.escape(ref.symbol)}\({params}\)', source)
    name = re.escape(re.sub(r"<.*>$", "", ref.symbol).split("::")[-1])
    return re.search(rf"__global__ {bounds}void {bounds}{name} ?\(", source)


def _source_text(ref: NativeSymbolRef) -> str:
    """The text of the translation unit and the headers it includes (a library defines kernels in headers too)."""
    source = source_path(ref.path)
    files = include_closure(source, ref.build.include_dirs if ref.build else ())
    return "\n".join(f.read_text(errors="replace") for f in files)


def _symbol_problems(refs, compiled: dict[str, dict[str, CompiledFile | CompileError]]) -> list[str]:
    """Each ref against its source and its compiled PTX; `compiled` is {path: {arch: result}}."""
    problems = []
    for ref in refs:
        if not _source_declares(ref, _source_text(ref)):
            if ref.linkage == "C":
                problems.append(
                    f'{ref.symbol}: no extern "C" __global__ definition with the declared parameters '
                    f"({', '.join(ref.params)}) in {ref.path}"
                )
            else:
                problems.append(f"{ref.symbol}: no __global__ (C++ linkage) definition in {ref.path}")
        for arch, result in compiled.get(ref.path, {}).items():
            if isinstance(result, CompileError):
                continue
            name = result.entry_name(ref)
            if name is None:
                problems.append(f"{ref.symbol}: no PTX .entry for {arch}")
                continue
            entry = result.entries[name]
            want = [expected_ptx_type(p) for p in ref.params]
            got = [p.ptx_type for p in entry]
            if len(want) != len(got):
                problems.append(
                    f"{ref.symbol} ({arch}): PTX has {len(got)} parameters, the registry declares {len(want)}"
                )
            else:
                for i, (w, g, declared) in enumerate(zip(want, got, ref.params)):
                    if w != g:
                        problems.append(
                            f"{ref.symbol} ({arch}): parameter {i} `{declared}` should be .{w} in PTX, is .{g}"
                        )
    return problems


def budget_for(capsule: KernelCapsule) -> KernelBudget | None:
    """The KernelBudget its library declares beside the capsule's launch plans (the built-in
    families in capsule_core/kernels/plans/<family>.py), or None."""
    library = library_of(capsule)
    return library.budget_for(capsule) if library is not None else None


def budget_problems(budget: KernelBudget, build: CompiledFile, refs) -> list[str]:
    """Every nvcc warning of the build, and each way the kernels `refs` exceed the budget."""
    problems = [f"{build.arch}: nvcc warning (budget: 0 warnings): {line.strip()}" for line in build.warnings]
    for ref in refs:
        used = build.resources_of(ref)
        if used is not None:
            problems += [f"{build.arch}: {p}" for p in budget.problems(ref.symbol, used)]
    return problems


def _budget_item(budget: KernelBudget | None, refs, builds: dict[str, list[CompiledFile]]) -> CheckItem:
    """`builds`: each ref's compiled files by path, one per arch."""
    if budget is None:
        figures = "; ".join(
            f"{r.symbol}: {max(b.resources_of(r).registers for b in builds[r.path])} registers" for r in refs
        )
        return CheckItem("kernel.budget", Status.PASSED, (f"no budget declared; {figures}",))
    problems = list(
        dict.fromkeys(p for r in refs for build in builds[r.path] for p in budget_problems(budget, build, [r]))
    )
    if problems:
        return CheckItem("kernel.budget", Status.FAILED, tuple(problems))
    arches = ", ".join(dict.fromkeys(b.arch for bs in builds.values() for b in bs))
    return CheckItem(
        "kernel.budget",
        Status.PASSED,
        (
            f"{arches}: no nvcc warning; "
            + "; ".join(
                f"{r.symbol}: {max(b.resources_of(r).registers for b in builds[r.path])} registers "
                f"(budget: {budget.describe(r.symbol)})"
                for r in refs
            ),
        ),
    )


def fit_problems(launch, resources: dict, arch: str) -> list[str]:
    """One launch on one arch against its compiled kernel: its threads times the kernel's registers
    (allocated 8 at a time) within a multiprocessor's register file, static shared memory within
    48 KiB and static plus dynamic within the arch's opt-in limit."""
    r = resources.get(launch.symbol)
    if r is None:
        return []  # not a compiled kernel: plan_problems and ffi.symbols say so
    threads = launch.block[0] * launch.block[1] * launch.block[2]
    problems = []
    if threads * (-(-r.registers // 8) * 8) > REGISTERS_PER_SM:
        problems.append(
            f"{launch.symbol}: {threads} threads × {r.registers} registers exceed a multiprocessor's {REGISTERS_PER_SM}"
        )
    if r.shared_bytes > STATIC_SHARED_LIMIT or r.shared_bytes + launch.shared_bytes > DYNAMIC_SHARED_LIMIT[arch]:
        problems.append(f"{launch.symbol}: {r.shared_bytes} + {launch.shared_bytes} bytes of shared memory")
    return problems


def raised_at(exc: BaseException) -> str:
    """ " (at plans.py:12)": the line of the plan function's module that raised."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    return f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""


def read_problems(spec, arrays: dict, forward, backward) -> list[str]:
    """A forward plan reads only the op's inputs; a backward plan only those, the forward's result
    ("out") and the cotangent ("g")."""
    names = set(flat_buffers({k: v for k, v in arrays.items() if k in {t.name for t in spec.inputs}}))
    problems = []
    read = {b.name for b in forward.buffers if b.role == "input"}
    if not read <= names:
        problems.append(f"forward: input buffers {sorted(read - names)} are not inputs of the op")
    if backward is not None:
        read = {b.name for b in backward.buffers if b.role == "input"}
        if not read <= names | {"out", "g"}:
            problems.append(f"backward: input buffers {sorted(read - names - {'out', 'g'})} are not the op's, out or g")
    return problems


def _plan_items(capsule: KernelCapsule, arches, sizes, resources: dict | None = None) -> CheckItem:
    import numpy as np

    from capsule_core.ops import get_spec
    from capsule_core.ops.base import sized_samples, validate

    functions = plan_functions(capsule)
    if functions is None:
        return CheckItem("launch.plan", Status.FAILED, (f"no launch plan for {capsule.op.value}",))
    forward_plan, backward_plan = functions
    spec = get_spec(capsule.op.value)
    symbols = {r.symbol: r for r in capsule.symbols}
    problems, plans = [], 0
    cases = [s for size in sizes for s in sized_samples(spec, size)]
    for sample in cases + spec.edges():
        arrays, params, out_shape = validate(spec, sample.inputs, sample.params, np.float32)
        expected = {"out": out_shape}
        directions = [("fwd", forward_plan, expected)]
        if spec.has_vjp and backward_plan is not None:
            grads = {k: v.shape for k, v in flat_buffers({n: arrays[n] for n in spec.differentiable}, "d").items()}
            directions.append(("bwd", backward_plan, grads))
        elif spec.has_vjp:
            problems.append("the op has a VJP but no backward plan")
        made = {}
        for direction, function, outputs in directions:
            try:
                plan = function(arrays, params)
            except Exception as exc:  # a plan function that crashes is a failed check, never a lost report
                problems.append(
                    f"{sample.case} {direction}: the plan function raised {type(exc).__name__}: {exc}{raised_at(exc)}"
                )
                continue
            plans += 1
            made[direction] = plan
            for arch in arches:
                problems += [f"{sample.case} {direction} {arch}: {p}" for p in plan_problems(plan, symbols, arch)]
                for launch in plan.kernel_launches:
                    problems += [
                        f"{sample.case} {direction} {arch}: {p}"
                        for p in fit_problems(launch, (resources or {}).get(arch, {}), arch)
                    ]
            declared = {k: tuple(v) for k, v in plan.output_shapes.items()}
            if declared != {k: tuple(v) for k, v in outputs.items()}:
                problems.append(f"{sample.case} {direction}: plan outputs {declared} != expected {outputs}")
        if "fwd" in made:
            problems += [f"{sample.case} {p}" for p in read_problems(spec, arrays, made["fwd"], made.get("bwd"))]
    status = Status.FAILED if problems else Status.PASSED
    return CheckItem(
        "launch.plan",
        status,
        tuple(problems[:20]) or (f"{plans} plans over {len(cases) + len(spec.edges())} cases legal",),
    )


def compile_jobs(capsules, arches=ARCHES) -> list[tuple]:
    """(source, arch, build options) of every source file behind `capsules` that is here, for each
    of `arches`: the nvcc compiles a check of them makes."""
    units = {(r.path, r.build) for c in capsules for r in c.symbols}
    present = sorted((u for u in units if source_path(u[0]).is_file()), key=lambda u: u[0])
    return [(source_path(path), a, build) for path, build in present for a in arches]


def nvcc_builds(capsules, arches=ARCHES) -> dict:
    """compile_jobs as {name: build} for build_in_parallel (none without nvcc: check says why)."""
    try:
        nvcc = find_nvcc()
    except EnvironmentMissing:
        return {}
    return {
        build_name(f"nvcc {arch}", source, build): partial(compile_file, source, arch, nvcc, build)
        for source, arch, build in compile_jobs(capsules, arches)
    }


def check(capsules, arches=ARCHES, sizes=("small", "medium", "large")) -> CheckReport:
    """Run the static checks on kernel capsules (raises EnvironmentMissing without nvcc)."""
    start = time.perf_counter()
    nvcc = find_nvcc()
    compiled = compile_all(compile_jobs(capsules, arches))
    results = []
    for capsule in capsules:
        items = [CheckItem("contract.aligned", Status.PASSED if contracts_aligned(capsule) else Status.FAILED)]
        kernels = []
        refs = capsule.symbols
        paths = sorted({r.path for r in refs})
        per_path: dict[str, dict[str, CompiledFile | CompileError]] = {}
        if not refs:
            items.append(CheckItem("ffi.symbols", Status.PASSED, ("launches no kernel: the output aliases the input",)))
        elif not all(source_path(p).is_file() for p in paths):
            missing = ", ".join(p for p in paths if not source_path(p).is_file())
            items.append(CheckItem("ffi.symbols", Status.PENDING, (f"kernels not written yet ({missing} is missing)",)))
            results.append(CapsuleCheck(capsule.name, tuple(items), ()))
            continue
        else:
            build_of = {r.path: r.build for r in refs}
            per_path = {p: {a: compiled[(source_path(p), a, build_of[p])] for a in arches} for p in paths}
            errors = list(
                dict.fromkeys(str(r) for d in per_path.values() for r in d.values() if isinstance(r, CompileError))
            )
            problems = errors + _symbol_problems(refs, per_path)
            items.append(CheckItem("ffi.symbols", Status.FAILED if problems else Status.PASSED, tuple(problems)))
            if not errors:
                budget = budget_for(capsule)
                found = [r for r in refs if all(b.resources_of(r) is not None for b in per_path[r.path].values())]
                kernels = [
                    KernelRow(
                        **vars(b.resources_of(r)),
                        symbol=r.symbol,
                        arch=arch,
                        max_registers=budget.registers_for(r.symbol) if budget else 0,
                    )
                    for r in found
                    for arch, b in per_path[r.path].items()
                ]
                items.append(_budget_item(budget, found, {p: list(d.values()) for p, d in per_path.items()}))
            if problems:
                results.append(CapsuleCheck(capsule.name, tuple(items), tuple(kernels)))
                continue
        resources = (
            {
                arch: {
                    r.symbol: per_path[r.path][arch].resources_of(r)
                    for r in refs
                    if per_path[r.path][arch].resources_of(r)
                }
                for arch in arches
            }
            if refs
            else {}
        )
        items.append(_plan_items(capsule, arches, sizes, resources))
        results.append(CapsuleCheck(capsule.name, tuple(items), tuple(kernels)))
    fresh = sum(1 for r in compiled.values() if isinstance(r, CompiledFile) and not r.cached)
    cached = sum(1 for r in compiled.values() if isinstance(r, CompiledFile) and r.cached)
    return CheckReport(
        tuple(arches),
        f"{nvcc.version} ({nvcc.path})",
        tuple(results),
        time.perf_counter() - start,
        cached,
        fresh,
        COMPILE_FLAGS,
    )
