"""What every kernel family's test checks without a GPU, written once: the nvcc build of its .cu
(no warnings, no spills, a PTX .entry per registry symbol with the declared parameters), its
launch plans over every sample and edge input, and the forward and backward of its kernels run on
the CPU emulator (tests/kernel_emu.py) against the float64 reference under the op's error model.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from capsule_core import registry
from capsule_core.check import expected_ptx_type
from capsule_core.kernels import ARCHES, cuda_source_dir, find_nvcc, parse_ptx_entries, parse_ptxas_resources
from capsule_core.launch import plan_functions, plan_problems
from capsule_core.numerics import compare
from capsule_core.ops import get_spec
from capsule_core.ops.base import seeded_rng, shapes_of, validate

FLAGS = ("-std=c++17", "-O3", "-prec-div=true", "-prec-sqrt=true", "-ftz=false", "-fmad=true")
"""The build flags of DEVELOPERS.md, plus -Werror all-warnings and -Xptxas -v below."""


@dataclass(frozen=True)
class Build:
    arch: str
    log: str
    ptx: str

    @property
    def entries(self):
        return parse_ptx_entries(self.ptx)

    @property
    def resources(self):
        return parse_ptxas_resources(self.log)

    @property
    def warnings(self) -> list[str]:
        return [line for line in self.log.splitlines() if re.search(r"warning", line, re.IGNORECASE)]


def build(family: str, arch: str, build_dir: str) -> Build:
    """cuda/<family>.cu for one arch with warnings as errors; the PTX kept for its entries."""
    work = Path(build_dir) / f"{family}-{arch}"
    work.mkdir(parents=True, exist_ok=True)
    source = cuda_source_dir() / f"{family}.cu"
    cmd = [str(find_nvcc().path), *FLAGS, f"-arch={arch}", "-Xptxas", "-v", "-Werror", "all-warnings", "--keep",
           "--keep-dir", str(work), "-I", str(cuda_source_dir()), "-cubin", "-o", str(work / "kernel.cubin"), str(source)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise AssertionError(f"nvcc failed for cuda/{family}.cu ({arch}):\n{result.stdout}{result.stderr}")
    ptx = next(work.glob("*.ptx")).read_text()
    return Build(arch, result.stdout + result.stderr, ptx)


def build_all(family: str, build_dir: str) -> dict[str, Build]:
    """build() for every arch of `capsules check`, in parallel."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(ARCHES)) as pool:
        return dict(zip(ARCHES, pool.map(lambda arch: build(family, arch, build_dir), ARCHES)))


def capsules(family: str):
    return [c for c in registry.CATALOG if c.family == family and c.symbols]


def symbol_problems(family: str, builds: dict[str, Build]) -> list[str]:
    """Every registry symbol of the family as a PTX .entry with the declared parameter types."""
    problems = []
    for c in capsules(family):
        for ref in c.symbols:
            for arch, b in builds.items():
                entry = b.entries.get(ref.symbol)
                if entry is None:
                    problems.append(f"{ref.symbol}: no .entry for {arch}")
                    continue
                got = [p.ptx_type for p in entry]
                want = [expected_ptx_type(p) for p in ref.params]
                if got != want:
                    problems.append(f"{ref.symbol} ({arch}): PTX parameters {got}, declared {want}")
    return problems


def cases(op: str, sizes=("small", "medium", "large")):
    spec = get_spec(op)
    out = []
    for size in sizes:
        out += spec.samples(size, seeded_rng(spec.name, size))
    return out + spec.edges()


def plan_case_problems(op: str, sizes=("small", "medium", "large")) -> list[str]:
    """Forward and backward plans of every case, legal on both arches with the right outputs."""
    capsule = registry.lookup(op)
    symbols = {r.symbol: r for r in capsule.symbols}
    forward, backward = plan_functions(capsule)
    spec = get_spec(op)
    problems = []
    for sample in cases(op, sizes):
        arrays, params, out_shape = validate(spec, sample.inputs, sample.params, np.float32)
        directions = [(forward, {"out": tuple(out_shape)})]
        if spec.has_vjp:
            directions.append((backward, {f"d{n}": tuple(np.shape(arrays[n])) for n in spec.differentiable}))
        for function, outputs in directions:
            plan = function(arrays, params)
            for arch in ARCHES:
                problems += [f"{sample.case} {plan.direction} {arch}: {p}" for p in plan_problems(plan, symbols, arch)]
            if {k: tuple(v) for k, v in plan.output_shapes.items()} != outputs:
                problems.append(f"{sample.case} {plan.direction}: outputs {dict(plan.output_shapes)} != {outputs}")
    return problems


def cotangent(op: str, case: str, shape) -> np.ndarray:
    """The cotangent test_ops_contract uses for a case."""
    return seeded_rng(op, f"g/{case}").standard_normal(shape).astype(np.float32)


def emulated_problems(runner, op: str, sample, misalign: dict | None = None) -> list[str]:
    """Runs the forward (and backward) plans of one case on the emulator and compares them with
    the reference under the op's error model; also that every output element was written."""
    from capsule_core.backends.cpu import REFERENCE
    from kernel_emu import unwritten

    spec = get_spec(op)
    capsule = registry.lookup(op)
    forward, backward = plan_functions(capsule)
    arrays, params, out_shape = validate(spec, sample.inputs, sample.params, np.float32)
    shapes = shapes_of(arrays)
    problems = []
    plan = forward(arrays, params)
    y = runner.run(plan, arrays, misalign)["out"]
    if unwritten(y).any():
        problems.append(f"{sample.case}: forward left {int(unwritten(y).sum())} elements unwritten")
    r = REFERENCE.forward(spec, sample.inputs, **sample.params)
    m = REFERENCE.magnitude(spec, sample.inputs, **sample.params)
    n = spec.error.length(shapes, params) if hasattr(spec.error, "length") else 1
    result = compare(y, r, m, spec.error, n, sample.worst_case)
    if not result.passed:
        problems.append(f"{sample.case}: forward {result.reason}")
    if not spec.has_vjp:
        return problems
    g = cotangent(op, sample.case, r.shape)
    plan = backward(arrays, params)
    grads = runner.run(plan, {**arrays, "out": y, "g": g}, misalign)
    r_grads = REFERENCE.vjp(spec, sample.inputs, g, **sample.params)
    m_grads = REFERENCE.vjp_magnitude(spec, sample.inputs, g, **sample.params)
    for name in spec.differentiable:
        dx = grads[f"d{name}"]
        if unwritten(dx).any():
            problems.append(f"{sample.case}: d{name} left {int(unwritten(dx).sum())} elements unwritten")
        model = spec.vjp_error_for(name)
        n = model.length(shapes, params) if hasattr(model, "length") else 1
        result = compare(dx, r_grads[name], m_grads[name], model, n, sample.worst_case)
        if not result.passed:
            problems.append(f"{sample.case}: d{name} {result.reason}")
    return problems
