"""Renderers of `capsules plan` (capsule_core.explain.engine.Explanation): the JSON document
(docs/plan-schema.md) and the text (a header, one row per launch, the roofline footer)."""

from __future__ import annotations

from capsule_core.render.report import simple_table

PLAN_SCHEMA_VERSION = 1


def _dims(values) -> str:
    return "x".join(str(v) for v in values)


def _shape(shape) -> str:
    if shape and isinstance(shape[0], tuple):
        return "[" + ", ".join(_shape(s) for s in shape) + "]"
    return "(" + ",".join(str(d) for d in shape) + ")"


def _param(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return _dims(value) if value else "()"
    return str(value)


def _json_value(value):
    if isinstance(value, tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    return value


def _occupancy_record(occ) -> dict | None:
    if occ is None:
        return None
    return {
        "fraction": occ.fraction,
        "blocks_per_sm": occ.blocks_per_sm,
        "active_warps": occ.active_warps,
        "max_warps_per_sm": occ.max_warps_per_sm,
        "limiters": list(occ.limiters),
        "blocks_per_sm_by": dict(occ.limits),
        "registers_per_block": occ.registers_per_block,
        "shared_bytes_per_block": occ.shared_per_block,
        "refusal": occ.refusal,
    }


def _launch_record(index: int, row) -> dict:
    res = row.resources
    return {
        "index": index,
        "symbol": row.symbol,
        "source": row.source,
        "grid": list(row.grid),
        "block": list(row.block),
        "blocks": row.blocks,
        "threads_per_block": row.threads_per_block,
        "dynamic_shared_bytes": row.dynamic_shared,
        "arguments": dict(row.arguments),
        "registers": res.registers if res else None,
        "spill_store_bytes": res.spill_stores if res else None,
        "spill_load_bytes": res.spill_loads if res else None,
        "stack_bytes": res.stack_bytes if res else None,
        "static_shared_bytes": res.shared_bytes if res else None,
        "occupancy": _occupancy_record(row.occupancy),
        "waves": row.waves,
        "sms_used": row.sms_used,
        "note": row.note,
    }


def plan_record(e, tool_version: str = "") -> dict:
    """The JSON document of `capsules plan --json`."""
    d, r = e.device, e.roofline
    return {
        "schema": "capsules.plan",
        "schema_version": PLAN_SCHEMA_VERSION,
        "tool_version": tool_version,
        "op": e.op,
        "capsule": e.capsule,
        "direction": e.direction,
        "inputs": _json_value(e.inputs),
        "inferred": _json_value(e.inferred),
        "params": _json_value(e.params),
        "outputs": _json_value(e.outputs),
        "aliases": dict(e.aliases),
        "device": {
            "name": d.name,
            "arch": d.arch,
            "multiprocessors": d.multiprocessors,
            "origin": d.origin,
            "bandwidth_bytes_per_s": d.bandwidth,
            "bandwidth_basis": d.bandwidth_basis,
            "fma_flops_per_s": d.fma_peak,
            "fma_basis": d.fma_basis,
        },
        "launches": [_launch_record(i, row) for i, row in enumerate(e.launches)],
        "roofline": {
            "bytes": r.bytes,
            "flops": r.flops,
            "basis": r.basis,
            "memory_seconds": r.memory_seconds,
            "compute_seconds": r.compute_seconds,
            "floor_seconds": r.floor_seconds,
            "bound": r.bound,
        },
        "problems": list(e.problems),
    }


def _bytes(n: int) -> str:
    if n < 1024:
        return str(n)
    return f"{n / 1024:.3g} KiB"


def _si(value: float, unit: str) -> str:
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _seconds(value: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-9:.3g} ns"


def _call(row) -> str:
    """symbol(x, y=out, rows=32, ...): a buffer passed under its own name shows once."""
    args = [name if value == name else f"{name}={_param(value)}" for name, value in row.arguments]
    return f"{row.symbol}({', '.join(args)})"


def plan_rows(e) -> list[dict]:
    rows = []
    for i, row in enumerate(e.launches):
        res, occ = row.resources, row.occupancy
        spills = (
            "-"
            if res is None
            else ("0" if not res.spill_stores + res.spill_loads else f"{res.spill_stores} st / {res.spill_loads} ld B")
        )
        rows.append(
            {
                "#": i,
                "kernel": row.symbol,
                "grid": _dims(row.grid),
                "block": _dims(row.block),
                "dyn smem": _bytes(row.dynamic_shared),
                "static smem": "-" if res is None else _bytes(res.shared_bytes),
                "regs": "-" if res is None else res.registers,
                "spills": spills,
                "occupancy": "-"
                if occ is None
                else f"{100 * occ.fraction:.1f}% ({occ.active_warps}/{occ.max_warps_per_sm} warps)",
                "blocks/SM": "-" if occ is None else occ.blocks_per_sm,
                "limited by": "-" if occ is None or occ.refusal else "+".join(occ.limiters),
                "SMs used": f"{row.sms_used}/{e.device.multiprocessors}",
                "waves": "-" if row.waves is None else f"{row.waves:.2f}",
                "note": row.note or "",
            }
        )
    return rows


def render_plan(e) -> str:
    """Header (op, direction, shapes, parameters, device), the launches, the roofline footer."""
    d, r = e.device, e.roofline
    inputs = " ".join(f"{name}{_shape(shape)}" for name, shape in e.inputs.items()) or "(none)"
    by_sources: dict[tuple, list[str]] = {}
    for name, sources in e.inferred.items():
        by_sources.setdefault(sources, []).append(name)
    inferred = "; ".join(
        f"{', '.join(names)} inferred from {', '.join(sources)}" for sources, names in by_sources.items()
    )
    params = ", ".join(f"{k}={_param(v)}" for k, v in e.params.items()) or "none"
    outputs = " ".join(f"{name}{_shape(shape)}" for name, shape in e.outputs.items())
    lines = [
        f"plan {e.op} {e.direction} ({e.capsule}) on {d.name}, {d.arch}, {d.multiprocessors} SMs",
        f"inputs: {inputs}{f' ({inferred})' if inferred else ''}; params: {params}",
        f"outputs: {outputs}" + "".join(f"; {out} is {src}'s memory" for out, src in e.aliases.items()),
        f"device: {d.origin}",
        "",
    ]
    rows = plan_rows(e)
    if rows:
        if not any(row["note"] for row in rows):
            for row in rows:
                del row["note"]
        lines.append(simple_table([{k: str(v) for k, v in row.items()} for row in rows]))
        lines += ["", "calls:"] + [f"  {i}  {_call(row)}" for i, row in enumerate(e.launches)]
    else:
        lines.append("(no launches)")
    lines.append("")
    memory = f"{_si(r.bytes, 'B')} / {_si(d.bandwidth, 'B/s')} ({d.bandwidth_basis}) = {_seconds(r.memory_seconds)}"
    if r.flops is None:
        lines += [f"roofline floor: {_seconds(r.floor_seconds)}, memory only (from {r.basis})", f"  memory:  {memory}"]
    else:
        lines += [
            f"roofline floor: {_seconds(r.floor_seconds)}, {r.bound}-bound (from {r.basis})",
            f"  memory:  {memory}",
            f"  compute: {_si(r.flops, 'FLOP')} / {_si(d.fma_peak, 'FLOP/s')} ({d.fma_basis}) = "
            f"{_seconds(r.compute_seconds)}",
        ]
    lines.append(
        f"occupancy: the CUDA occupancy calculator's rules for {d.arch}; "
        f"waves = blocks / (blocks per SM x {d.multiprocessors} SMs)"
    )
    lines += [f"PROBLEM: {p}" for p in e.problems]
    return "\n".join(lines)
