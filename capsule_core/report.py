"""Renderers: records (plain dicts) to table, JSON, CSV and Markdown text. Nothing here computes
results or prints; the CLI writes what these return."""

from __future__ import annotations

import csv
import io
import json

from .model import BackendOp, ContractDescriptor, KernelCapsule, NativeSymbolRef

EXPORT_SCHEMA = "capsules.registry"
EXPORT_SCHEMA_VERSION = 1
FORMATS = ("table", "json", "csv", "markdown")


def symbol_record(ref: NativeSymbolRef) -> dict:
    return {"path": ref.path, "symbol": ref.symbol, "params": list(ref.params)}


def descriptor_record(d: ContractDescriptor) -> dict:
    return {"claim": d.claim.value, "summary": d.summary,
            "evidence": {"kind": d.evidence.kind.value, "detail": d.evidence.detail},
            "provenance": [symbol_record(r) for r in d.provenance]}


def capsule_record(c: KernelCapsule) -> dict:
    """Every field of a capsule as JSON-ready data (the export schema's capsule object)."""
    return {
        "name": c.name, "op": c.op.value, "module": c.module, "family": c.family,
        "description": c.description, "provider": c.provider.value, "device": c.device.value,
        "trust_level": c.trust_level.value, "supports_forward": c.supports_forward,
        "vjp_mode": c.vjp_mode.value, "layout": c.layout.value,
        "numerical_policy": {"reduction": c.numerical_policy.reduction.value, "note": c.numerical_policy.note},
        "contracts": {aspect.value: descriptor_record(d) for aspect, d in c.descriptors.items()},
        "symbols": [r.symbol for r in c.symbols],
    }


def export_document(capsules, modules, tool_version: str) -> dict:
    return {
        "schema": EXPORT_SCHEMA, "schema_version": EXPORT_SCHEMA_VERSION, "tool_version": tool_version,
        "modules": list(modules),
        "ops": [{"name": op.value, "requires_vjp": op.requires_vjp} for op in BackendOp],
        "capsules": [capsule_record(c) for c in capsules],
    }


def list_rows(capsules) -> list[dict]:
    return [{"name": c.name, "op": c.op.value, "family": c.family, "vjp": c.vjp_mode.value,
             "reduction": c.numerical_policy.reduction.value,
             "symbols": " ".join(r.symbol for r in c.symbols) or "(no launch)"} for c in capsules]


def simple_table(rows: list[dict]) -> str:
    """tabulate's "simple" format for rows of strings, without importing tabulate: `capsules list`
    must start within 1.5x of a bare `import typer`, and tabulate's import and first call cost
    about 9 ms of that budget. A test keeps the two outputs identical."""
    if not rows:
        return ""
    headers = list(rows[0])
    cells = [[str(r[h]) for h in headers] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    def line(values):
        return "  ".join(v.ljust(w) for v, w in zip(values, widths)).rstrip()
    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(c) for c in cells)])


def render_rows(rows: list[dict], fmt: str, json_value=None) -> str:
    """rows as a table, CSV or Markdown; JSON renders `json_value` (default: the rows)."""
    if fmt == "table":
        return simple_table(rows)
    if fmt == "json":
        return json.dumps(rows if json_value is None else json_value, indent=2, ensure_ascii=False)
    if fmt == "csv":
        buf = io.StringIO()
        if rows:
            writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
        return buf.getvalue().rstrip("\n")
    from tabulate import tabulate
    return tabulate(rows, headers="keys", tablefmt="github")


def render_capsule(c: KernelCapsule, op_details: dict | None = None, resources: dict | None = None) -> str:
    """The `show` page: identity, policy, the four contracts with evidence and provenance,
    then the op's signature, parameters, shape rule, tolerance and cost models when known."""
    from tabulate import tabulate
    lines = [f"{c.name} — {c.description}", ""]
    identity = [
        ("op", c.op.value), ("family", c.family), ("provider", c.provider.value), ("device", c.device.value),
        ("trust level", c.trust_level.value), ("forward", "supported" if c.supports_forward else "not supported"),
        ("VJP mode", c.vjp_mode.value), ("layout", c.layout.value),
        ("reduction", f"{c.numerical_policy.reduction.value} ({c.numerical_policy.note})"),
    ]
    lines += [tabulate(identity, tablefmt="plain"), "", "contracts:"]
    for aspect, d in c.descriptors.items():
        lines.append(f"  {aspect.value:<7} {d.claim.value}: {d.summary}")
        lines.append(f"          evidence: {d.evidence}")
    lines += ["", "native symbols:"]
    if not c.symbols:
        lines.append("  (none: the op launches no kernel)")
    for ref in c.symbols:
        lines.append(f"  {ref.path}: {ref.symbol}({', '.join(ref.params)})")
        if resources and ref.symbol in resources:
            lines.append(f"      {resources[ref.symbol]}")
    for title, body in (op_details or {}).items():
        lines += ["", f"{title}:"] + [f"  {line}" for line in body]
    return "\n".join(lines)


def render_selection(selection) -> str:
    from tabulate import tabulate
    p = selection.policy
    head = (f"select {selection.op.value}: device={p.device.value} provider={p.provider} "
            f"assurance={p.assurance.value} vjp={'required' if p.require_vjp else 'not required'}")
    chosen = (f"chosen: {selection.chosen.name}" if selection.chosen
              else "chosen: none — no capsule is admissible under this policy")
    rows = [(c.name, reason) for c, reason in selection.refused]
    body = tabulate(rows, headers=("not chosen", "why"), tablefmt="simple") if rows else "no other capsule implements this op"
    return "\n".join([head, chosen, "", body])


def selection_record(selection) -> dict:
    p = selection.policy
    return {"op": selection.op.value,
            "policy": {"device": p.device.value, "provider": str(p.provider), "assurance": p.assurance.value,
                       "require_vjp": p.require_vjp},
            "chosen": selection.chosen.name if selection.chosen else None,
            "refused": [{"capsule": c.name, "reason": r} for c, r in selection.refused]}


def check_record(report) -> dict:
    """The JSON document of `capsules check` (the same fields as the dataclasses)."""
    return {
        "schema": "capsules.check", "schema_version": 1, "arches": list(report.arches), "nvcc": report.nvcc,
        "flags": list(report.flags), "seconds": round(report.seconds, 3),
        "compiles": {"cached": report.cached_compiles, "fresh": report.fresh_compiles},
        "exit_code": report.exit_code,
        "capsules": [{"name": c.capsule, "status": c.status.value,
                      "checks": [{"id": i.check, "status": i.status.value, "messages": list(i.messages)} for i in c.items],
                      "kernels": [vars(k) for k in c.kernels], "warnings": list(c.warnings)} for c in report.capsules],
    }


def render_check(report) -> str:
    """One row per capsule (status per check, kernels, worst registers and spills), the failures'
    messages, then one row per kernel and architecture."""
    from tabulate import tabulate
    check_ids = ("contract.aligned", "ffi.symbols", "launch.plan")
    rows = []
    for c in report.capsules:
        statuses = {i.check: i.status.value for i in c.items}
        regs = max((k.registers for k in c.kernels), default=None)
        spills = sum(k.spill_stores + k.spill_loads for k in c.kernels)
        rows.append([c.capsule, c.status.value, *(statuses.get(i, "-") for i in check_ids),
                     len({k.symbol for k in c.kernels}), "-" if regs is None else regs, spills])
    out = [tabulate(rows, headers=("capsule", "status", *check_ids, "kernels", "max regs", "spill bytes"), tablefmt="simple")]
    notes = [f"{c.capsule} {i.check} {i.status.value}: {m}" for c in report.capsules for i in c.items
             if i.status.value != "PASSED" for m in i.messages]
    notes += [f"{c.capsule} warning: {w}" for c in report.capsules for w in c.warnings]
    if notes:
        out += ["", *notes]
    kernels = [[k.symbol, k.arch, k.registers, k.spill_stores, k.spill_loads, k.stack_bytes, k.shared_bytes]
               for c in report.capsules for k in c.kernels]
    if kernels:
        out += ["", tabulate(kernels, headers=("kernel", "arch", "registers", "spill st", "spill ld", "stack", "smem"),
                             tablefmt="simple")]
    counts = {s: sum(1 for c in report.capsules if c.status.value == s) for s in ("PASSED", "FAILED", "PENDING")}
    out += ["", f"{counts['PASSED']} passed, {counts['FAILED']} failed, {counts['PENDING']} pending (kernels not written) "
                f"of {len(report.capsules)} capsules; arches {', '.join(report.arches)}; nvcc {report.nvcc}; "
                f"{report.fresh_compiles} compiled, {report.cached_compiles} from cache; {report.seconds:.1f} s"]
    return "\n".join(out)


VERIFY_SCHEMA_VERSION = 1
STATUS_MARK = {"PASSED": "ok", "FAILED": "FAIL", "MISTRUSTED": "?", "SKIPPED": "-", "ERROR": "ERR"}


def verify_record(report) -> dict:
    """The JSON document of `capsules verify` (docs/verify-schema.md)."""
    return {
        "schema": "capsules.verify", "schema_version": VERIFY_SCHEMA_VERSION,
        "backend": report.backend, "backend_note": report.backend_note, "seed": report.seed, "quick": report.quick,
        "interrupted": report.interrupted, "seconds": round(report.seconds, 3), "exit_code": report.exit_code,
        "capsules": [{"name": c.capsule, "status": c.status.value, "seconds": round(c.seconds, 3),
                      "checks": [{"id": r.check, "status": r.status.value, "reason": r.reason,
                                  "worst": None if r.worst is None or not _finite(r.worst) else r.worst,
                                  "case": r.case, "cases": r.cases, "repro": r.repro} for r in c.results]}
                     for c in report.capsules],
    }


def _finite(v: float) -> bool:
    return v == v and v not in (float("inf"), float("-inf"))


def render_verify(report) -> str:
    """A capsules × checks table (ok, FAIL, ? mistrusted, - skipped, ERR), then every problem with
    its rerun line, then the totals."""
    from tabulate import tabulate

    from .checks import CHECKS
    ids = list(CHECKS)
    rows = []
    for c in report.capsules:
        marks = {r.check: STATUS_MARK[r.status.value] for r in c.results}
        rows.append([c.capsule.split(".", 1)[1], c.status.value, *(marks.get(i, "") for i in ids)])
    headers = ["capsule", "status", *(i.replace("contract.", "").replace("value.special", "special")
                                      .replace("vjp.reference", "vjp.ref").replace("reduction.order", "order")
                                      .replace("inputs.intact", "intact").replace("selection.ties", "ties")
                                      .replace("determinism", "determ") for i in ids)]
    out = [tabulate(rows, headers=headers, tablefmt="simple")]
    problems = [(c.capsule, r) for c in report.capsules for r in c.results
                if r.status.value in ("FAILED", "ERROR", "MISTRUSTED")]
    if problems:
        out.append("")
        for capsule, r in problems:
            worst = f" (worst {r.worst:.3g} of the bound)" if r.worst is not None and _finite(r.worst) else ""
            out.append(f"{r.status.value} {capsule} {r.check}: {r.reason}{worst}")
            if r.repro:
                out.append(f"    rerun: {r.repro}")
    counts = {}
    for c in report.capsules:
        for r in c.results:
            counts[r.status.value] = counts.get(r.status.value, 0) + 1
    totals = ", ".join(f"{counts.get(s, 0)} {s.lower()}" for s in ("PASSED", "FAILED", "MISTRUSTED", "SKIPPED", "ERROR"))
    passed = sum(1 for c in report.capsules if c.status.value in ("PASSED", "SKIPPED"))
    tail = " (interrupted: partial report)" if report.interrupted else ""
    out += ["", f"{passed}/{len(report.capsules)} capsules passed on {report.backend}; checks: {totals}; "
                f"{report.seconds:.1f} s{tail}"]
    return "\n".join(out)


def verify_junit(report) -> str:
    """JUnit XML: one testsuite per capsule, one testcase per check; FAILED is a failure, ERROR an
    error, SKIPPED and MISTRUSTED (ran, could not tell) are skipped with their reason."""
    from xml.etree import ElementTree as ET
    root = ET.Element("testsuites", name=f"capsules verify ({report.backend})")
    for c in report.capsules:
        suite = ET.SubElement(root, "testsuite", name=c.capsule, tests=str(len(c.results)), time=f"{c.seconds:.3f}",
                              failures=str(sum(r.status.value == "FAILED" for r in c.results)),
                              errors=str(sum(r.status.value == "ERROR" for r in c.results)),
                              skipped=str(sum(r.status.value in ("SKIPPED", "MISTRUSTED") for r in c.results)))
        for r in c.results:
            case = ET.SubElement(suite, "testcase", classname=c.capsule, name=r.check)
            message = r.reason + (f" | rerun: {r.repro}" if r.repro else "")
            if r.status.value == "FAILED":
                ET.SubElement(case, "failure", message=r.reason, type="FAILED").text = message
            elif r.status.value == "ERROR":
                ET.SubElement(case, "error", message=r.reason, type="ERROR").text = message
            elif r.status.value == "MISTRUSTED":
                ET.SubElement(case, "skipped", message=f"MISTRUSTED (could not tell): {r.reason}")
            elif r.status.value == "SKIPPED":
                ET.SubElement(case, "skipped", message=r.reason)
    if report.interrupted:
        root.set("interrupted", "true")
    return ET.tostring(root, encoding="unicode", xml_declaration=True)
