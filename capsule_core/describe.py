"""An op's OpSpec in words, for `capsules show`: signature, parameters, shape rule, tolerance
models and the cost of its first sample."""

from __future__ import annotations

from .errors import UnknownNameError


def op_details(op: str) -> dict[str, list[str]]:
    from .ops import get_spec
    from .ops.base import Accumulation, seeded_rng, shapes_of, validate

    try:
        spec = get_spec(op)
    except UnknownNameError:
        return {}
    params = [f"{p.name} ({p.kind}){'' if p.required else f', default {p.default!r}'}{': ' + p.doc if p.doc else ''}"
              for p in spec.params]
    inputs = [f"{t.name}: {t.rank} {t.dtype}{'' if t.differentiable else ', no gradient'}"
              f"{', a list' if t.variadic else ''}" for t in spec.inputs]
    sample = spec.samples("medium", seeded_rng(spec.name, "medium"))[0]
    arrays, p, out_shape = validate(spec, sample.inputs, sample.params)
    shapes = shapes_of(arrays)

    def model_text(model) -> str:
        length = f"; n = {model.length(shapes, p)} for {sample.case}" if isinstance(model, Accumulation) and model.n else ""
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
        "cost model": [f"for {sample.summary()} -> y{out_shape}:",
                       f"{cost.bytes_read} bytes read, {cost.bytes_written} bytes written, {cost.flops} flops "
                       f"(intensity {cost.intensity:.3g} flop/byte)"],
    }
