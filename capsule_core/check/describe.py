"""An op's OpSpec in words, for `capsules show`: signature, parameters, shape rule, tolerance
models and the cost of its first sample."""

from __future__ import annotations

from pathlib import Path

from capsule_core.errors import UnknownNameError


def op_details(op: str) -> dict[str, list[str]]:
    from capsule_core.ops import get_spec
    from capsule_core.ops.base import Accumulation, seeded_rng, shapes_of, validate

    try:
        spec = get_spec(op)
    except UnknownNameError:
        return {}
    params = [
        f"{p.name} ({p.kind}){'' if p.required else f', default {p.default!r}'}{': ' + p.doc if p.doc else ''}"
        for p in spec.params
    ]
    inputs = [
        f"{t.name}: {t.rank} {t.dtype}{'' if t.differentiable else ', no gradient'}{', a list' if t.variadic else ''}"
        for t in spec.inputs
    ]
    sample = spec.samples("medium", seeded_rng(spec.name, "medium"))[0]
    arrays, p, out_shape = validate(spec, sample.inputs, sample.params)
    shapes = shapes_of(arrays)

    def model_text(model) -> str:
        length = (
            f"; n = {model.length(shapes, p)} for {sample.case}" if isinstance(model, Accumulation) and model.n else ""
        )
        return model.describe() + length

    tolerance = [f"forward: {model_text(spec.error)}"]
    if spec.has_vjp:
        for name in spec.differentiable:
            tolerance.append(f"vjp {name}: {model_text(spec.vjp_error_for(name))}")
    else:
        tolerance.append("vjp: none (forward-only op)")
    cost = spec.cost(shapes, p)
    return {
        "signature": [spec.signature()],
        "inputs": inputs or ["(none)"],
        "parameters": params or ["(none)"],
        "shape rule": [spec.shape_rule],
        "tolerance model (u = 2^-24)": tolerance,
        "cost model": [
            f"for {sample.summary()} -> y{out_shape}:",
            f"{cost.bytes_read} bytes read, {cost.bytes_written} bytes written, {cost.flops} flops "
            f"(intensity {cost.intensity:.3g} flop/byte)",
        ],
    }


def kernel_resources(capsule, arch: str = "sm_90") -> dict[str, str]:
    """ptxas's registers, spills, stack and shared memory per symbol beside the family's budget
    (what `capsules check` enforces), or why they are unknown."""
    from capsule_core.check.engine import budget_for
    from capsule_core.errors import EnvironmentMissing
    from capsule_core.kernels.nvcc import CompileError, compile_file, source_path

    out = {}
    for path, options in sorted({(r.path, r.build) for r in capsule.symbols}, key=lambda pair: pair[0]):
        source = source_path(path)
        if not source.is_file():
            out.update(
                {r.symbol: f"not compiled: {path} is not written yet" for r in capsule.symbols if r.path == path}
            )
            continue
        try:
            build = compile_file(source, arch, build=options)
        except (EnvironmentMissing, CompileError) as exc:
            reason = str(exc).splitlines()[0]
            out.update({r.symbol: f"not compiled: {reason}" for r in capsule.symbols if r.path == path})
            continue
        budget = budget_for(capsule)
        shown = Path(path).name if Path(path).is_absolute() else path
        warnings = [f"{len(build.warnings)} nvcc warnings in {shown}"] if build.warnings else []
        for ref in capsule.symbols:
            if ref.path != path:
                continue
            r = build.resources_of(ref)
            if r is None:
                out[ref.symbol] = f"{arch}: no such entry in the compiled PTX"
                continue
            used = (
                f"{arch}: {r.registers} registers, {r.spill_stores + r.spill_loads} spill bytes, "
                f"{r.stack_bytes} stack bytes, {r.shared_bytes} smem bytes"
            )
            if budget is None:
                out[ref.symbol] = f"{used}; no budget declared"
                continue
            over = budget.problems(ref.symbol, r) + warnings
            verdict = f"OVER BUDGET: {'; '.join(over)}" if over else "within budget"
            out[ref.symbol] = f"{used}; {verdict} ({budget.describe(ref.symbol)}, no nvcc warning)"
    return out


def entry_names(capsule, arch: str = "sm_90") -> dict[str, str]:
    """Each kernel's PTX .entry (a C++ kernel's mangled name) from the kernel cache; {} without nvcc."""
    from capsule_core.errors import EnvironmentMissing
    from capsule_core.kernels.nvcc import CompileError, compile_file, source_path

    out = {}
    for ref in capsule.symbols:
        try:
            name = compile_file(source_path(ref.path), arch, build=ref.build).entry_name(ref)
        except (EnvironmentMissing, CompileError, OSError):
            continue
        if name:
            out[ref.symbol] = name
    return out
