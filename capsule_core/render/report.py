"""Renderers: records (plain dicts) to table, JSON, CSV and Markdown text. Nothing here computes
results or prints; the CLI writes what these return."""

from __future__ import annotations

from capsule_core.model import BackendOp, ContractDescriptor, KernelCapsule, NativeSymbolRef

EXPORT_SCHEMA = "capsules.registry"
EXPORT_SCHEMA_VERSION = 1
FORMATS = ("table", "json", "csv", "markdown")


def symbol_record(ref: NativeSymbolRef) -> dict:
    return {
        "path": ref.path,
        "symbol": ref.symbol,
        "params": list(ref.params),
        "linkage": ref.linkage,
        "definition": ref.definition or None,
    }


def descriptor_record(d: ContractDescriptor) -> dict:
    return {
        "claim": d.claim.value,
        "summary": d.summary,
        "evidence": {"kind": d.evidence.kind.value, "detail": d.evidence.detail},
        "provenance": [symbol_record(r) for r in d.provenance],
    }


def capsule_record(c: KernelCapsule) -> dict:
    """Every field of a capsule as JSON-ready data (the export schema's capsule object)."""
    return {
        "name": c.name,
        "op": c.op.value,
        "module": c.module,
        "library": c.module,
        "family": c.family,
        "description": c.description,
        "provider": c.provider.value,
        "device": c.device.value,
        "trust_level": c.trust_level.value,
        "supports_forward": c.supports_forward,
        "vjp_mode": c.vjp_mode.value,
        "layout": c.layout.value,
        "numerical_policy": {"reduction": c.numerical_policy.reduction.value, "note": c.numerical_policy.note},
        "contracts": {aspect.value: descriptor_record(d) for aspect, d in c.descriptors.items()},
        "symbols": [r.symbol for r in c.symbols],
    }


def export_document(capsules, modules, tool_version: str) -> dict:
    return {
        "schema": EXPORT_SCHEMA,
        "schema_version": EXPORT_SCHEMA_VERSION,
        "tool_version": tool_version,
        "modules": list(modules),
        "ops": [
            {"name": op.value, "requires_vjp": op.requires_vjp}
            for op in dict.fromkeys([*BackendOp, *(c.op for c in capsules if not isinstance(c.op, BackendOp))])
        ],
        "capsules": [capsule_record(c) for c in capsules],
    }


def list_rows(capsules) -> list[dict]:
    return [
        {
            "name": c.name,
            "library": c.module,
            "op": c.op.value,
            "family": c.family,
            "vjp": c.vjp_mode.value,
            "reduction": c.numerical_policy.reduction.value,
            "symbols": " ".join(r.symbol for r in c.symbols) or "(no launch)",
        }
        for c in capsules
    ]


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
        import json

        return json.dumps(rows if json_value is None else json_value, indent=2, ensure_ascii=False)
    if fmt == "csv":
        import csv
        import io

        buf = io.StringIO()
        if rows:
            writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
        return buf.getvalue().rstrip("\n")
    from tabulate import tabulate

    return tabulate(rows, headers="keys", tablefmt="github")


def render_capsule(
    c: KernelCapsule, op_details: dict | None = None, resources: dict | None = None, entries: dict | None = None
) -> str:
    """The `show` page: identity, policy, the four contracts with evidence and provenance,
    then the op's signature, parameters, shape rule, tolerance and cost models when known."""
    from tabulate import tabulate

    lines = [f"{c.name} — {c.description}", ""]
    identity = [
        ("op", c.op.value),
        ("library", c.module),
        ("family", c.family),
        ("provider", c.provider.value),
        ("device", c.device.value),
        ("trust level", c.trust_level.value),
        ("forward", "supported" if c.supports_forward else "not supported"),
        ("VJP mode", c.vjp_mode.value),
        ("layout", c.layout.value),
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
        where = ref.definition or ref.path
        linkage = "" if ref.linkage == "C" else " [C++ linkage]"
        lines.append(f"  {where}: {ref.symbol}({', '.join(ref.params)}){linkage}")
        if entries and entries.get(ref.symbol, ref.symbol) != ref.symbol:
            lines.append(f"      PTX entry {entries[ref.symbol]}")
        if resources and ref.symbol in resources:
            lines.append(f"      {resources[ref.symbol]}")
    for title, body in (op_details or {}).items():
        lines += ["", f"{title}:"] + [f"  {line}" for line in body]
    return "\n".join(lines)


def render_selection(selection) -> str:
    from tabulate import tabulate

    p = selection.policy
    head = (
        f"select {selection.op.value}: device={p.device.value} provider={p.provider} "
        f"assurance={p.assurance.value} vjp={'required' if p.require_vjp else 'not required'}"
    )
    chosen = (
        f"chosen: {selection.chosen.name}"
        if selection.chosen
        else "chosen: none — no capsule is admissible under this policy"
    )
    rows = [(c.name, reason) for c, reason in selection.refused]
    body = (
        tabulate(rows, headers=("not chosen", "why"), tablefmt="simple")
        if rows
        else "no other capsule implements this op"
    )
    return "\n".join([head, chosen, "", body])


def selection_record(selection) -> dict:
    p = selection.policy
    return {
        "op": selection.op.value,
        "policy": {
            "device": p.device.value,
            "provider": str(p.provider),
            "assurance": p.assurance.value,
            "require_vjp": p.require_vjp,
        },
        "chosen": selection.chosen.name if selection.chosen else None,
        "refused": [{"capsule": c.name, "reason": r} for c, r in selection.refused],
    }


def check_record(report) -> dict:
    """The JSON document of `capsules check` (the same fields as the dataclasses)."""
    return {
        "schema": "capsules.check",
        "schema_version": 1,
        "arches": list(report.arches),
        "nvcc": report.nvcc,
        "flags": list(report.flags),
        "seconds": round(report.seconds, 3),
        "compiles": {"cached": report.cached_compiles, "fresh": report.fresh_compiles},
        "exit_code": report.exit_code,
        "capsules": [
            {
                "name": c.capsule,
                "status": c.status.value,
                "checks": [{"id": i.check, "status": i.status.value, "messages": list(i.messages)} for i in c.items],
                "kernels": [vars(k) for k in c.kernels],
            }
            for c in report.capsules
        ],
    }


def render_check(report) -> str:
    """One row per capsule (status per check, kernels, worst registers and spills), the failures'
    messages, then one row per kernel and architecture with its register budget."""
    from tabulate import tabulate

    check_ids = ("contract.aligned", "ffi.symbols", "kernel.budget", "launch.plan")
    rows = []
    for c in report.capsules:
        statuses = {i.check: i.status.value for i in c.items}
        regs = max((k.registers for k in c.kernels), default=None)
        spills = sum(k.spill_stores + k.spill_loads for k in c.kernels)
        rows.append(
            [
                c.capsule,
                c.status.value,
                *(statuses.get(i, "-") for i in check_ids),
                len({k.symbol for k in c.kernels}),
                "-" if regs is None else regs,
                spills,
            ]
        )
    out = [
        tabulate(
            rows, headers=("capsule", "status", *check_ids, "kernels", "max regs", "spill bytes"), tablefmt="simple"
        )
    ]
    notes = [
        f"{c.capsule} {i.check} {i.status.value}: {m}"
        for c in report.capsules
        for i in c.items
        if i.status.value != "PASSED"
        for m in i.messages
    ]
    if notes:
        out += ["", *notes]
    kernels = [
        [k.symbol, k.arch, k.registers, k.max_registers, k.spill_stores, k.spill_loads, k.stack_bytes, k.shared_bytes]
        for c in report.capsules
        for k in c.kernels
    ]
    if kernels:
        out += [
            "",
            tabulate(
                kernels,
                headers=("kernel", "arch", "registers", "budget", "spill st", "spill ld", "stack", "smem"),
                tablefmt="simple",
            ),
        ]
    counts = {s: sum(1 for c in report.capsules if c.status.value == s) for s in ("PASSED", "FAILED", "PENDING")}
    pending = f", {counts['PENDING']} pending (kernels not written)" if counts["PENDING"] else ""
    out += [
        "",
        f"{counts['PASSED']} passed, {counts['FAILED']} failed{pending} "
        f"of {len(report.capsules)} capsules; arches {', '.join(report.arches)}; nvcc {report.nvcc}; "
        f"{report.fresh_compiles} compiled, {report.cached_compiles} from cache; {report.seconds:.1f} s",
    ]
    return "\n".join(out)


VERIFY_SCHEMA_VERSION = 1
STATUS_MARK = {"PASSED": "ok", "FAILED": "FAIL", "MISTRUSTED": "?", "SKIPPED": "-", "ERROR": "ERR"}


def verify_record(report) -> dict:
    """The JSON document of `capsules verify` (docs/verify-schema.md)."""
    return {
        "schema": "capsules.verify",
        "schema_version": VERIFY_SCHEMA_VERSION,
        "backend": report.backend,
        "backend_note": report.backend_note,
        "seed": report.seed,
        "quick": report.quick,
        "interrupted": report.interrupted,
        "stopped_by": report.stopped_by or None,
        "not_run": list(report.not_run),
        "seconds": round(report.seconds, 3),
        "exit_code": report.exit_code,
        "capsules": [
            {
                "name": c.capsule,
                "library": c.capsule.split(".", 1)[0],
                "status": c.status.value,
                "seconds": round(c.seconds, 3),
                "checks": [
                    {
                        "id": r.check,
                        "status": r.status.value,
                        "reason": r.reason,
                        "worst": None if r.worst is None or not _finite(r.worst) else r.worst,
                        "case": r.case,
                        "cases": r.cases,
                        "repro": r.repro,
                        "out_of_model": r.out_of_model,
                        **({"details": r.details} if r.details else {}),
                    }
                    for r in c.results
                ],
            }
            for c in report.capsules
        ],
    }


def _finite(v: float) -> bool:
    return v == v and v not in (float("inf"), float("-inf"))


def render_verify(report) -> str:
    """A capsules × checks table (ok, FAIL, ? mistrusted, - skipped, ERR), then every problem with
    its rerun line, then the totals."""
    from tabulate import tabulate

    from capsule_core.verify.checks import ALL_CHECKS, SANITIZER_CHECKS

    ran = {r.check for c in report.capsules for r in c.results}
    ids = [i for i in ALL_CHECKS if i not in SANITIZER_CHECKS or i in ran]
    rows = []
    one_library = len({c.capsule.split(".", 1)[0] for c in report.capsules}) == 1
    for c in report.capsules:
        marks = {r.check: STATUS_MARK[r.status.value] for r in c.results}
        name = c.capsule.split(".", 1)[1] if one_library else c.capsule
        rows.append([name, c.status.value, *(marks.get(i, "") for i in ids)])
    headers = [
        "capsule",
        "status",
        *(
            i.replace("contract.", "")
            .replace("value.special", "special")
            .replace("vjp.reference", "vjp.ref")
            .replace("reduction.order", "order")
            .replace("inputs.intact", "intact")
            .replace("selection.ties", "ties")
            .replace("determinism", "determ")
            .replace("sanitize.", "")
            for i in ids
        ),
    ]
    out = [tabulate(rows, headers=headers, tablefmt="simple")]
    problems = [
        (c.capsule, r)
        for c in report.capsules
        for r in c.results
        if r.status.value in ("FAILED", "ERROR", "MISTRUSTED")
    ]
    if problems:
        out.append("")
        for capsule, r in problems:
            worst = f" (worst {r.worst:.3g} of the bound)" if r.worst is not None and _finite(r.worst) else ""
            out.append(f"{r.status.value} {capsule} {r.check}: {r.reason}{worst}")
            if r.repro:
                out.append(f"    rerun: {r.repro}")
    uncompared = [(c.capsule, r) for c in report.capsules for r in c.results if r.out_of_model]
    if uncompared:
        out.append("")
        out += [
            f"OUT OF MODEL {capsule} {r.check}: {r.out_of_model} elements never compared "
            f"(their float32 intermediates overflow)"
            for capsule, r in uncompared
        ]
    counts = {}
    for c in report.capsules:
        for r in c.results:
            counts[r.status.value] = counts.get(r.status.value, 0) + 1
    totals = ", ".join(
        f"{counts.get(s, 0)} {s.lower()}" for s in ("PASSED", "FAILED", "MISTRUSTED", "SKIPPED", "ERROR")
    )
    passed = sum(1 for c in report.capsules if c.status.value in ("PASSED", "SKIPPED"))
    tail = _interruption(report)
    outside = sum(r.out_of_model for _, r in uncompared)
    model = f"; {outside} elements out of model" if outside else ""
    out += [
        "",
        f"{passed}/{len(report.capsules)} capsules passed on {report.backend}; checks: {totals}{model}; "
        f"{report.seconds:.1f} s{tail}",
    ]
    return "\n".join(out)


def _interruption(report) -> str:
    """ " (interrupted by SIGTERM: partial report; 3 capsules not run: a, b, c)", or ""."""
    if not report.interrupted:
        return ""
    by = f" by {report.stopped_by}" if report.stopped_by else ""
    names = [n.split(".", 1)[-1] for n in report.not_run]
    shown = ", ".join(names[:8]) + (f", ... ({len(names) - 8} more)" if len(names) > 8 else "")
    not_run = f"; {len(names)} capsules not run: {shown}" if names else ""
    return f" (interrupted{by}: partial report{not_run})"


def _junit_not_run(root, report) -> None:
    """The capsules an interrupted run never finished, as suites whose one case is skipped: a CI
    job's report then counts them, and says why they have no results."""
    from xml.etree import ElementTree as ET

    if report.interrupted:
        root.set("interrupted", "true")
    why = f"not run: the run was interrupted{f' by {report.stopped_by}' if report.stopped_by else ''} first"
    for name in report.not_run:
        suite = ET.SubElement(root, "testsuite", name=name, tests="1", failures="0", errors="0", skipped="1", time="0")
        ET.SubElement(ET.SubElement(suite, "testcase", classname=name, name="not-run"), "skipped", message=why)


def verify_junit(report) -> str:
    """JUnit XML: one testsuite per capsule, one testcase per check; FAILED is a failure, ERROR an
    error, SKIPPED and MISTRUSTED (ran, could not tell) are skipped with their reason."""
    from xml.etree import ElementTree as ET

    root = ET.Element("testsuites", name=f"capsules verify ({report.backend})")
    for c in report.capsules:
        suite = ET.SubElement(
            root,
            "testsuite",
            name=c.capsule,
            tests=str(len(c.results)),
            time=f"{c.seconds:.3f}",
            failures=str(sum(r.status.value == "FAILED" for r in c.results)),
            errors=str(sum(r.status.value == "ERROR" for r in c.results)),
            skipped=str(sum(r.status.value in ("SKIPPED", "MISTRUSTED") for r in c.results)),
        )
        for r in c.results:
            case = ET.SubElement(suite, "testcase", classname=c.capsule, name=r.check)
            message = r.reason + (f" | rerun: {r.repro}" if r.repro else "") + (f"\n\n{r.details}" if r.details else "")
            if r.status.value == "FAILED":
                ET.SubElement(case, "failure", message=r.reason, type="FAILED").text = message
            elif r.status.value == "ERROR":
                ET.SubElement(case, "error", message=r.reason, type="ERROR").text = message
            elif r.status.value == "MISTRUSTED":
                ET.SubElement(case, "skipped", message=f"MISTRUSTED (could not tell): {r.reason}")
            elif r.status.value == "SKIPPED":
                ET.SubElement(case, "skipped", message=r.reason)
    _junit_not_run(root, report)
    return ET.tostring(root, encoding="unicode", xml_declaration=True)


# -- bench ------------------------------------------------------------------------------------
# `capsules bench`: the JSON document (docs/bench-schema.md), the table (plain or Markdown),
# CSV and the roofline plot. The numbers come computed from capsule_core.bench.engine; these only shape them.

BENCH_SCHEMA_VERSION = 1
BENCH_BASELINE_MARK = {"EXCLUDED": "-", "UNAVAILABLE": "n/a", "SKIPPED": "oom", "ERROR": "err"}


def _num(value):
    """A JSON number, or null for a missing or non-finite one."""
    if value is None:
        return None
    value = float(value)
    return value if _finite(value) else None


def _time_record(m) -> dict | None:
    if m is None:
        return None
    s = m.summary
    return {
        "timer": m.timer,
        "median_s": _num(s.median),
        "q1_s": _num(s.q1),
        "q3_s": _num(s.q3),
        "iqr_s": _num(s.iqr),
        "rel_iqr": _num(s.rel_iqr),
        "min_s": _num(s.min),
        "max_s": _num(s.max),
        "mean_s": _num(s.mean),
        "samples": s.n,
        "stop": m.stop,
        "converged": m.converged,
        "warmup_calls": m.warmup_calls,
        "warmup_s": _num(m.warmup_s),
        "batches": m.batches,
        "batch_size": m.batch_size,
        "cold": m.cold,
        "guarded": m.guarded,
        "raw_s": [_num(v) for v in m.samples],
    }


def _peak_record(peak, unit: str, scale_name: str) -> dict | None:
    if peak is None:
        return None
    return {
        "value": _num(peak.value),
        "unit": unit,
        scale_name: _num(peak.value / 1e9),
        "work": peak.work,
        "how": peak.how,
        "time": _time_record(peak.measurement),
    }


def bench_record(report, tool_version: str = "") -> dict:
    """The JSON document of `capsules bench --json` (docs/bench-schema.md)."""
    import datetime
    import platform
    import sys

    import numpy

    settings = report.settings
    rule = settings.rule
    peaks = report.peaks
    comparison = report.comparison
    cases = []
    for c in report.cases:
        t = c.throughput
        flops_modelled = c.direction == "fwd"  # the cost models have no backward flops
        cases.append(
            {
                "op": c.op,
                "capsule": c.capsule,
                "case": c.case,
                "direction": c.direction,
                "shape": c.shape,
                "shapes": c.shapes,
                "params": c.params,
                "status": c.status.value,
                "reason": c.reason,
                "resized": c.resized,
                "cost": None
                if c.cost is None
                else {
                    "bytes_read": c.cost.bytes_read,
                    "bytes_written": c.cost.bytes_written,
                    "bytes": c.cost.bytes,
                    "flops": c.cost.flops if flops_modelled else None,
                    "intensity": _num(c.cost.intensity) if c.cost.bytes and flops_modelled else None,
                },
                "time": _time_record(c.measurement),
                "gbps": _num(t.gbps) if t else None,
                "gflops": _num(t.gflops) if t else None,
                "intensity": _num(t.intensity) if t else None,
                "bound": t.bound if t else None,
                "peak_pct": _num(t.peak_pct) if t else None,
                "baselines": [
                    {
                        "name": b.name,
                        "device": b.device,
                        "status": b.status.value,
                        "reason": b.reason,
                        "note": b.note,
                        "ratio": _num(b.ratio),
                        "time": _time_record(b.measurement),
                    }
                    for b in c.baselines
                ],
            }
        )
    return {
        "schema": "capsules.bench",
        "schema_version": BENCH_SCHEMA_VERSION,
        "tool_version": tool_version,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "backend": report.backend,
        "backend_note": report.backend_note,
        "device": report.device,
        "host": {
            "python": platform.python_version(),
            "numpy": numpy.__version__,
            "platform": platform.platform(),
            "argv": sys.argv[1:],
        },
        "settings": {
            "size": settings.size.label,
            "samples": settings.size.samples,
            "target_bytes": report.target_bytes,
            "grow_only": settings.size.grow_only,
            "cold": settings.cold,
            "noise": rule.noise,
            "min_samples": rule.min_samples,
            "max_time_s": rule.max_time_s,
            "warmup_ms": rule.warmup_ms,
            "batch_ms": rule.batch_ms,
            "max_samples": rule.max_samples,
            "seed": settings.seed,
            "baselines": list(settings.baselines),
            "suite": settings.suite,
        },
        "compile_flags": list(report.compile_flags),
        "libraries": report.libraries,
        "peaks": None
        if peaks is None
        else {
            "bandwidth": _peak_record(peaks.bandwidth, "B/s", "gbps"),
            "compute": _peak_record(peaks.compute, "flop/s", "gflops"),
            "ridge_flop_per_byte": _num(peaks.ridge),
            "problems": list(peaks.problems),
        },
        "cases": cases,
        "excluded": [{"op": op, "baseline": name, "reason": reason} for op, name, reason in report.excluded()],
        "comparison": None
        if comparison is None
        else {
            "source": comparison.source,
            "threshold": comparison.threshold,
            "notes": list(comparison.notes),
            "regressions": len(comparison.regressions),
            "changes": [
                {
                    "op": ch.op,
                    "case": ch.case,
                    "shape": ch.shape,
                    "status": ch.status.value,
                    "old_median_s": _num(ch.old_median),
                    "new_median_s": _num(ch.new_median),
                    "change": _num(ch.change),
                    "low": _num(ch.low),
                    "high": _num(ch.high),
                }
                for ch in comparison.changes
            ],
        },
        "errors": list(report.errors),
        "interrupted": report.interrupted,
        "seconds": round(report.seconds, 3),
        "exit_code": report.exit_code,
    }


def _seconds(value) -> str:
    if value is None or not _finite(value):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-9:.3g} ns"


def _g(value, digits: int = 3) -> str:
    if value is None or not _finite(value):
        return "-"
    return f"{value:.{digits}g}" if abs(value) < 10**digits else f"{value:.0f}"


BENCH_BASELINES = ("torch", "cupy", "numpy")
"""Column order of the baselines (capsule_core.bench.baselines.BASELINES)."""


def _bench_columns(report) -> list[str]:
    present = {b.name for c in report.cases for b in c.baselines}
    return [name for name in BENCH_BASELINES if name in report.settings.baselines and name in present]


def _baseline_cell(b) -> str:
    if b is None:
        return ""
    if b.status.value == "OK":
        return "-" if b.ratio is None else f"{b.ratio:.2f}x"
    return BENCH_BASELINE_MARK[b.status.value]


def _change_cells(report, case) -> list[str]:
    if report.comparison is None:
        return []
    for ch in report.comparison.changes:
        if (ch.op, ch.case, ch.shape) == (case.op, case.case, case.shape):
            change = "-" if ch.change is None else f"{100 * ch.change:+.1f}%"
            return [_seconds(ch.old_median), change, ch.status.value]
    return ["-", "-", "-"]


def bench_rows(report) -> list[dict]:
    """One row per case: time, spread, throughput, share of the bounding peak, baseline ratios."""
    columns = _bench_columns(report)
    providers = len({c.capsule.split(".", 1)[0] for c in report.cases}) > 1
    rows = []
    for c in report.cases:
        m, t = c.measurement, c.throughput
        row = {
            "op": c.op,
            **({"capsule": c.capsule} if providers else {}),
            "case": c.case,
            "shape": c.shape if len(c.shape) <= 44 else c.shape[:41] + "...",
            "time": _seconds(m.summary.median) if m else c.status.value,
            "±IQR": f"{100 * m.summary.rel_iqr:.1f}%" if m else "",
            "n": m.summary.n if m else "",
            "GB/s": _g(t.gbps) if t else "",
            "GFLOP/s": _g(t.gflops) if t else "",
            "FLOP/B": _g(t.intensity, 2) if t else "",
            "bound": (t.bound or "-") if t else "",
            "% peak": _g(t.peak_pct, 3) if t else "",
        }
        by_name = {b.name: b for b in c.baselines}
        for name in columns:
            row[f"vs {name}"] = _baseline_cell(by_name.get(name))
        if report.comparison is not None:
            row["before"], row["change"], row["verdict"] = _change_cells(report, c)
        note = c.reason
        if m is not None and not m.converged:
            note = f"noisy: stopped at the {m.stop} (IQR {100 * m.summary.rel_iqr:.1f}%)"
        row["note"] = note
        rows.append(row)
    return rows


def _bench_header(report) -> list[str]:
    s = report.settings
    rule = s.rule
    if s.suite is not None:
        size = f"suite {s.suite}: fixed shapes, never resized (bwd: the VJP, judged by its traffic)"
    else:
        size = "size " + (
            s.size.label if s.size.label == s.size.samples else f"{s.size.label}, from the {s.size.samples} samples"
        )
    if report.target_bytes is not None:
        size += f" resized to ~{report.target_bytes / 1e6:.4g} MB moved per call"
    lines = [
        f"capsules bench: {report.backend_note or report.backend}",
        f"device: {report.device.get('description')}; timer: {report.device.get('timer')}",
        f"{size}; {'cold (cache flushed before each call)' if s.cold else 'warm caches'}; "
        f"stop when the IQR is under {100 * rule.noise:g}% of the median after >= {rule.min_samples} samples, "
        f"or after {rule.max_time_s:g} s; warm-up {rule.warmup_ms:g} ms",
    ]
    p = report.peaks
    if p is not None:
        parts = []
        if p.bandwidth:
            parts.append(f"copy {_g(p.bandwidth.value / 1e9, 4)} GB/s ({p.bandwidth.how})")
        if p.compute:
            parts.append(f"compute {_g(p.compute.value / 1e9, 4)} GFLOP/s ({p.compute.how})")
        ridge = f"; ridge {p.ridge:.3g} FLOP/B" if p.ridge else ""
        lines.append("measured peaks: " + ("; ".join(parts) or "none") + ridge)
        lines += [f"  {problem}" for problem in p.problems]
    return lines


def _bench_footer(report) -> list[str]:
    out = []
    columns = _bench_columns(report)
    if columns:
        out.append(
            "vs LIB = LIB's median time / the capsule's (above 1: the capsule is faster); "
            "- no twin computes the same thing, n/a library not here, oom out of memory, err failed"
        )
    grouped: dict = {}
    for op, name, reason in report.excluded():
        grouped.setdefault((name, reason), []).append(op)
    for (name, reason), ops in grouped.items():
        out.append(f"  {name} excluded for {', '.join(ops)}: {reason}")
    unavailable = {}
    for c in report.cases:
        for b in c.baselines:
            if b.status.value in ("UNAVAILABLE", "ERROR"):
                unavailable.setdefault((b.name, b.status.value, b.reason), []).append(c.op)
    for (name, status, reason), ops in unavailable.items():
        label = "not here" if status == "UNAVAILABLE" else f"failed for {', '.join(dict.fromkeys(ops))}"
        out.append(f"  {name} {label}: {reason}")
    comparison = report.comparison
    if comparison is not None:
        counts = {}
        for ch in comparison.changes:
            counts[ch.status.value] = counts.get(ch.status.value, 0) + 1
        summary = ", ".join(f"{n} {status}" for status, n in counts.items()) or "nothing to compare"
        out.append(
            f"compared with {comparison.source} (threshold {100 * comparison.threshold:g}%, noise-aware: "
            f"a regression needs the new first quartile beyond the old third quartile): {summary}"
        )
        out += [f"  note: {note}" for note in comparison.notes]
        out += [
            f"  REGRESSED {ch.op} {ch.case}: {_seconds(ch.old_median)} -> {_seconds(ch.new_median)} "
            f"({100 * ch.change:+.1f}%, at least {100 * ch.low:+.1f}%)"
            for ch in comparison.regressions
        ]
    out += [f"error: {e}" for e in report.errors]
    counts = {s: sum(1 for c in report.cases if c.status.value == s) for s in ("OK", "SKIPPED", "ERROR")}
    tail = " (interrupted: partial report)" if report.interrupted else ""
    out.append(
        f"{counts['OK']} timed, {counts['SKIPPED']} skipped, {counts['ERROR']} errors; {report.seconds:.1f} s{tail}"
    )
    return out


def render_bench(report, markdown: bool = False) -> str:
    """The bench table with its header (device, settings, measured peaks) and footer (what the
    ratio means, excluded baselines and why, the comparison, the totals)."""
    from tabulate import tabulate

    rows = bench_rows(report)
    table = (
        tabulate(rows, headers="keys", tablefmt="github" if markdown else "simple", disable_numparse=True)
        if rows
        else "(no cases)"
    )
    header, footer = _bench_header(report), _bench_footer(report)
    if markdown:
        return "\n".join([*(f"{line}  " for line in header), "", table, "", *(f"{line}  " for line in footer)])
    return "\n".join([*header, "", table, "", *footer])


def bench_csv(report) -> str:
    """One CSV row per case (times in seconds, no units in the cells)."""
    import csv
    import io

    columns = [n for n in BENCH_BASELINES if n in report.settings.baselines]
    fields = [
        "op",
        "capsule",
        "case",
        "direction",
        "shape",
        "status",
        "reason",
        "median_s",
        "q1_s",
        "q3_s",
        "rel_iqr",
        "samples",
        "stop",
        "bytes",
        "flops",
        "intensity",
        "gbps",
        "gflops",
        "bound",
        "peak_pct",
    ]
    for name in columns:
        fields += [f"{name}_status", f"{name}_median_s", f"{name}_ratio"]
    if report.comparison is not None:
        fields += ["verdict", "old_median_s", "change"]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    changes = {(ch.op, ch.case, ch.shape): ch for ch in report.comparison.changes} if report.comparison else {}
    for c in report.cases:
        m, t = c.measurement, c.throughput
        row = {
            "op": c.op,
            "capsule": c.capsule,
            "case": c.case,
            "direction": c.direction,
            "shape": c.shape,
            "status": c.status.value,
            "reason": c.reason,
        }
        if m is not None:
            row.update(
                median_s=repr(m.summary.median),
                q1_s=repr(m.summary.q1),
                q3_s=repr(m.summary.q3),
                rel_iqr=f"{m.summary.rel_iqr:.6g}",
                samples=m.summary.n,
                stop=m.stop,
            )
        if c.cost is not None:
            row.update(bytes=c.cost.bytes, flops=c.cost.flops if c.direction == "fwd" else "")
        if t is not None:
            row.update(
                intensity="" if t.intensity is None else f"{t.intensity:.6g}",
                gbps=f"{t.gbps:.6g}",
                gflops="" if t.gflops is None else f"{t.gflops:.6g}",
                bound=t.bound or "",
                peak_pct="" if t.peak_pct is None else f"{t.peak_pct:.4g}",
            )
        for b in c.baselines:
            if b.name in columns:
                row[f"{b.name}_status"] = b.status.value
                if b.measurement is not None:
                    row[f"{b.name}_median_s"] = repr(b.measurement.summary.median)
                    row[f"{b.name}_ratio"] = "" if b.ratio is None else f"{b.ratio:.6g}"
        ch = changes.get((c.op, c.case, c.shape))
        if ch is not None:
            row.update(
                verdict=ch.status.value,
                old_median_s="" if ch.old_median is None else repr(ch.old_median),
                change="" if ch.change is None else f"{ch.change:.6g}",
            )
        writer.writerow(row)
    return buf.getvalue().rstrip("\n")


def write_roofline(report, path) -> None:
    """A roofline of the timed cases: measured copy and FMA roofs, one point per case at its
    arithmetic intensity and achieved GFLOP/s. Needs matplotlib (the `plot` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    points = [
        (c.throughput.intensity, c.throughput.gflops, c.op)
        for c in report.cases
        if c.throughput is not None and c.throughput.intensity and c.throughput.gflops > 0
    ]
    hidden = sum(
        1 for c in report.cases if c.throughput is not None and not (c.throughput.intensity and c.throughput.gflops > 0)
    )
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    xs = [p[0] for p in points] or [1.0]
    peaks = report.peaks
    lo, hi = min(xs) / 4, max(xs) * 4
    if peaks is not None and peaks.bandwidth and peaks.compute:
        ridge = peaks.ridge
        lo, hi = min(lo, ridge / 8), max(hi, ridge * 8)
        roof_x = [lo, ridge, hi]
        roof_y = [lo * peaks.bandwidth.value / 1e9, peaks.compute.value / 1e9, peaks.compute.value / 1e9]
        ax.plot(
            roof_x,
            roof_y,
            color="black",
            linewidth=1.5,
            label=f"measured roof: {peaks.bandwidth.value / 1e9:.4g} GB/s, {peaks.compute.value / 1e9:.4g} GFLOP/s",
        )
    for x, y, op in points:
        ax.scatter([x], [y], s=18, color="tab:blue")
        ax.annotate(op, (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (FLOP/byte, from the cost models)")
    ax.set_ylabel("achieved GFLOP/s (median)")
    title = f"capsules bench roofline: {report.device.get('description')}"
    if hidden:
        title += f"\n({hidden} cases with no flops not shown)"
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", linewidth=0.3)
    if peaks is not None and peaks.bandwidth and peaks.compute:
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# -- capsules fuzz ----------------------------------------------------------------------------


def render_fuzz(report, saved: dict | None = None) -> str:
    """One row per capsule (status, examples checked, invalid inputs refused, examples with
    elements outside the error model's domain, over-budget rejects, shrink steps, seconds, why it
    stopped), then each failure with its shrunk example and replay line, then the totals.
    `saved` maps a capsule name to the replay file written for its failure."""
    from tabulate import tabulate

    saved = saved or {}
    rows = [
        [
            c.capsule.split(".", 1)[-1],
            c.status,
            c.examples,
            c.refused,
            c.out_of_model,
            c.rejected,
            c.shrink_steps,
            f"{c.seconds:.1f}",
            c.skipped or c.stopped,
        ]
        for c in report.capsules
    ]
    out = [
        tabulate(
            rows,
            headers=(
                "capsule",
                "status",
                "examples",
                "refused",
                "out of model",
                "too large",
                "shrink steps",
                "s",
                "stopped",
            ),
            tablefmt="simple",
        )
    ]
    for c in report.capsules:
        f = c.failure
        if c.error:
            out += ["", f"ERROR {c.capsule}: {c.error}"]
        if f is None:
            continue
        flaky = " (flaky: a rerun of the same example did not fail the same way)" if f.flaky else ""
        out += [
            "",
            f"{f.status} {f.capsule} {f.check}: {f.detail}{flaky}",
            f"    example: {f.example.summary()}",
            f"    drawn from: {f.example.origin}",
        ]
        if c.capsule in saved:
            on = f" --backend {f.backend}" if f.backend in ("cuda", "numpy") else ""
            out.append(f"    replay: capsules fuzz --replay {saved[c.capsule]}{on}")
    failed = sum(1 for c in report.capsules if c.status in ("FAILED", "ERROR"))
    examples = sum(c.examples for c in report.capsules)
    refused = sum(c.refused for c in report.capsules)
    budget = f"time budget {report.time_budget:g} s" if report.time_budget is not None else "no time budget"
    limit = (
        f"at most {report.max_examples} examples per capsule" if report.max_examples is not None else "no example limit"
    )
    tail = ""
    if report.interrupted:
        tail = _interruption(report)
    elif report.poisoned:
        tail = " (stopped: the backend's context is poisoned; rerun the rest in a fresh process)"
    out += [
        "",
        f"{len(report.capsules) - failed}/{len(report.capsules)} capsules without a failure on {report.backend}; "
        f"{examples} examples checked, {refused} invalid inputs refused; seed {report.seed}; {budget}, {limit}; "
        f"{report.seconds:.1f} s{tail}",
    ]
    return "\n".join(out)


FUZZ_SCHEMA_VERSION = 1


def fuzz_record(report, saved: dict | None = None) -> dict:
    """The JSON document of `capsules fuzz` (docs/fuzz-schema.md). `saved` maps a capsule name to
    the replay file written for its failure."""
    saved = saved or {}

    def failure(c):
        f = c.failure
        if f is None:
            return None
        return {
            "check": f.check,
            "status": f.status,
            "detail": f.detail,
            "flaky": f.flaky,
            "example": f.example.summary(),
            "origin": f.example.origin,
            "replay": str(saved[c.capsule]) if c.capsule in saved else None,
        }

    return {
        "schema": "capsules.fuzz",
        "schema_version": FUZZ_SCHEMA_VERSION,
        "backend": report.backend,
        "backend_note": report.backend_note,
        "seed": report.seed,
        "time_budget": report.time_budget,
        "max_examples": report.max_examples,
        "interrupted": report.interrupted,
        "stopped_by": report.stopped_by or None,
        "not_run": list(report.not_run),
        "poisoned": report.poisoned,
        "seconds": round(report.seconds, 3),
        "exit_code": report.exit_code,
        "capsules": [
            {
                "name": c.capsule,
                "op": c.op,
                "status": c.status,
                "examples": c.examples,
                "refused": c.refused,
                "out_of_model": c.out_of_model,
                "too_large": c.rejected,
                "shrink_steps": c.shrink_steps,
                "seconds": round(c.seconds, 3),
                "stopped": c.stopped,
                "skipped": c.skipped,
                "error": c.error,
                "failure": failure(c),
            }
            for c in report.capsules
        ],
    }


def fuzz_junit(report, saved: dict | None = None) -> str:
    """JUnit XML: one testsuite per capsule with one testcase, `fuzz`; a failure (with its shrunk
    example and replay file) fails it, an error of the search or the backend errors it, a skipped
    capsule is skipped."""
    from xml.etree import ElementTree as ET

    saved = saved or {}
    root = ET.Element("testsuites", name=f"capsules fuzz ({report.backend}, seed {report.seed})")
    for c in report.capsules:
        status = c.status
        suite = ET.SubElement(
            root,
            "testsuite",
            name=c.capsule,
            tests="1",
            time=f"{c.seconds:.3f}",
            failures=str(int(status == "FAILED")),
            errors=str(int(status == "ERROR")),
            skipped=str(int(status == "SKIPPED")),
        )
        case = ET.SubElement(suite, "testcase", classname=c.capsule, name="fuzz", time=f"{c.seconds:.3f}")
        f = c.failure
        if f is not None:
            text = f"{f.check}: {f.detail}\nexample: {f.example.summary()}\ndrawn from: {f.example.origin}" + (
                f"\nreplay: capsules fuzz --replay {saved[c.capsule]}" if c.capsule in saved else ""
            )
            tag = "failure" if f.status == "FAILED" else "error"
            ET.SubElement(case, tag, message=f"{f.check}: {f.detail}", type=f.status).text = text
        elif c.error:
            ET.SubElement(case, "error", message=c.error, type="ERROR").text = c.error
        elif c.skipped:
            ET.SubElement(case, "skipped", message=c.skipped)
        ET.SubElement(
            case, "system-out"
        ).text = f"{c.examples} examples checked, {c.refused} invalid inputs refused, stopped: {c.skipped or c.stopped}"
    _junit_not_run(root, report)
    return ET.tostring(root, encoding="unicode", xml_declaration=True)


def render_fuzz_replay(result) -> str:
    """A replayed fuzz failure: what was recorded, what the example gives now."""
    r = result.replay
    lines = [
        f"replay {r.path}: {r.capsule} on {result.backend} (recorded on {r.backend}, seed {r.seed})",
        f"    example: {r.example.summary()}",
        f"    recorded: {r.status} {r.check}: {r.detail}",
    ]
    f = result.outcome.failure
    if f is None:
        lines.append("    now: passes (the recorded failure no longer happens)")
    else:
        same = "the same failure, bit for bit" if result.reproduced else "a different failure"
        lines.append(f"    now: {f[1]} {f[0]}: {f[2]} ({same})")
    return "\n".join(lines)
