"""The Typer app. Commands parse options, call capsule_core and write what report.py renders:
results to stdout, errors to stderr. Heavy modules are imported inside the command that needs them."""

import os
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from capsule_core import __version__
from capsule_core.errors import CapsuleError, EnvironmentMissing, UnknownNameError
from capsule_core.model import AssurancePolicy, Device, ReductionPolicy, VJPMode
from cli.bench_command import bench
from cli.common import EXIT_ENVIRONMENT, EXIT_USAGE, fail, progress_bar, write_reports
from cli.fuzz_command import fuzz
from cli.options import (
    AllOption,
    ArchOption,
    BackendChoice,
    BackendOption,
    LibraryOption,
    NamesArgument,
    kernel_library_capsules,
    load_libraries,
    optional_option_values,
    resolve_backend,
    unwritable_outputs,
)
from cli.parallel_options import (
    DevicesOption,
    EmuThreadsOption,
    IsolateOption,
    JobsOption,
    LaunchTimeoutOption,
    RayOption,
    collect,
    emulator_options,
    spread,
)
from cli.plan_command import plan
from cli.stop_signals import signal_name, stop_signals

app = typer.Typer(
    name="capsules",
    help="Make native CUDA kernels accountable: list, show, export and select the capsules of the native "
    "CUDA backend; check, plan, verify, fuzz and bench their kernels; doctor says what this machine can run.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


class Format(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"
    markdown = "markdown"


class ShowFormat(str, Enum):
    text = "text"
    json = "json"


def _version(value: bool):
    if value:
        typer.echo(f"capsules {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
):
    """Make native CUDA kernels accountable."""


@app.command("list")
def list_command(
    module: Annotated[
        Optional[str], typer.Option(help="Only this registry module: native_cuda, reference or a library's name.")
    ] = None,
    family: Annotated[
        Optional[str], typer.Option(help="Only this kernel family (pointwise, softmax, conv_pool, ...).")
    ] = None,
    vjp: Annotated[Optional[VJPMode], typer.Option(help="Only this VJP mode.")] = None,
    reduction: Annotated[Optional[ReductionPolicy], typer.Option(help="Only this reduction policy.")] = None,
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.table,
    library: LibraryOption = None,
):
    """One row per capsule: name, library, op, family, VJP mode, reduction policy, symbols.

    A library that did not load is named on stderr with the reason (exit 2 for a --library).

    Example: capsules list --module native_cuda --family softmax
    """
    from capsule_core.catalog import registry
    from capsule_core.render import report

    code = load_libraries(library, keep_going=True)
    try:
        capsules = registry.filter_capsules(module, family, vjp, reduction)
    except UnknownNameError as exc:
        raise fail(str(exc), EXIT_USAGE)
    json_value = [report.capsule_record(c) for c in capsules] if fmt is Format.json else None
    typer.echo(report.render_rows(report.list_rows(capsules), fmt.value, json_value))
    raise typer.Exit(code)


@app.command()
def show(
    name: Annotated[str, typer.Argument(help="A capsule name (native_cuda.relu) or an op name (relu).")],
    fmt: Annotated[ShowFormat, typer.Option("--format", help="Output format.")] = ShowFormat.text,
    library: LibraryOption = None,
):
    """Every field of one capsule, and its op's signature, tolerance and cost models.

    Contracts with their evidence, numerical policy, native symbols with their C parameters;
    then the op's signature, parameters, shape rule, tolerance and cost models.

    Example: capsules show matmul
    """
    import json

    from capsule_core.catalog import registry
    from capsule_core.check import describe
    from capsule_core.render import report

    load_libraries(library)
    try:
        capsule = registry.lookup(name)
    except UnknownNameError as exc:
        raise fail(str(exc), EXIT_USAGE)
    details = describe.op_details(capsule.op.value)
    resources = describe.kernel_resources(capsule)
    entries = describe.entry_names(capsule)
    if fmt is ShowFormat.json:
        typer.echo(
            json.dumps(
                {
                    **report.capsule_record(capsule),
                    "op_details": details,
                    "kernel_resources": resources,
                    "ptx_entries": entries,
                },
                indent=2,
                ensure_ascii=False,
            )
        )
    else:
        typer.echo(report.render_capsule(capsule, details, resources, entries))


@app.command()
def export(
    output: Annotated[
        Optional[Path], typer.Option("--output", "-o", help="Write to this file instead of stdout.")
    ] = None,
    library: LibraryOption = None,
):
    """The whole registry as versioned JSON (schema: docs/export-schema.md).

    Example: capsules export -o registry.json
    """
    import json

    from capsule_core.catalog import registry
    from capsule_core.render import report

    load_libraries(library)
    text = json.dumps(
        report.export_document(registry.catalog(), registry.modules(), __version__), indent=2, ensure_ascii=False
    )
    if output is None:
        typer.echo(text)
        return
    try:
        output.write_text(text + "\n", encoding="utf-8")
    except OSError as exc:
        raise fail(f"--output: cannot write {output}: {exc.strerror}", EXIT_ENVIRONMENT)


@app.command()
def select(
    op: Annotated[str, typer.Argument(help="An op name, e.g. sin.")],
    device: Annotated[Device, typer.Option(help="The device the program runs on.")] = Device.CUDA,
    provider: Annotated[
        str,
        typer.Option(help="auto, prefer:PROVIDER or only:PROVIDER (native_cuda, reference, or a library's name)."),
    ] = "auto",
    assurance: Annotated[
        AssurancePolicy, typer.Option(help="checked: only checked capsules; external: trusted-external too.")
    ] = AssurancePolicy.CHECKED,
    vjp: Annotated[bool, typer.Option("--vjp/--no-vjp", help="Require a VJP (for ops that have one).")] = True,
    fmt: Annotated[ShowFormat, typer.Option("--format", help="Output format.")] = ShowFormat.text,
    library: LibraryOption = None,
):
    """TorchLean's planner: the capsule chosen for OP under a policy, and why the others were refused.

    The search follows TorchLean's chooseCapsuleFor: with prefer:PROVIDER that provider's
    capsules come first, then the catalog order; the first admissible capsule wins.

    Example: capsules select sin --device cpu
    """
    import json

    from capsule_core.catalog import planner, registry
    from capsule_core.render import report

    load_libraries(library)
    try:
        backend_op = registry.parse_op(op)
    except UnknownNameError as exc:
        raise fail(str(exc), EXIT_USAGE)
    try:
        preference = planner.ProviderPreference.parse(provider, tuple(lib.name for lib in registry.libraries()))
    except ValueError as exc:
        raise fail(f"--provider: {exc}", EXIT_USAGE)
    policy = planner.KernelPolicy(device, preference, assurance, vjp)
    selection = planner.select(backend_op, policy)
    if fmt is ShowFormat.json:
        typer.echo(json.dumps(report.selection_record(selection), indent=2))
    else:
        typer.echo(report.render_selection(selection))


@app.command()
def check(
    names: Annotated[
        Optional[list[str]],
        typer.Argument(help="Capsule, op or library names (default: every capsule of every loaded library)."),
    ] = None,
    arch: Annotated[
        Optional[list[ArchOption]],
        typer.Option(help="Target architecture; repeat for several (default: sm_80 and sm_90)."),
    ] = None,
    fmt: Annotated[ShowFormat, typer.Option("--format", help="text (tables) or json (for CI).")] = ShowFormat.text,
    library: LibraryOption = None,
):
    """Static contract checks, no GPU needed: symbols, PTX signatures, kernel budgets, launch plans.

    Every declared symbol must be in its source and a PTX .entry with the declared parameters;
    every kernel within its family's budget (capsule_core/kernels/plans/<family>.py: registers per
    thread, no spills, no stack frame unless a libm slow path is declared, no nvcc warning);
    launch plans legal for every sample and edge input. Exit 1 on any failure, 3 without nvcc
    (or with a CUDA_HOME or CUDA_PATH that holds none).

    Example: capsules check softmax --arch sm_90
    """
    import json

    from capsule_core.check import engine
    from capsule_core.render import report

    load_libraries(library)
    capsules = kernel_library_capsules(names, not names, "check")
    try:
        result = engine.check(capsules, tuple(a.value for a in arch) if arch else engine.ARCHES)
    except EnvironmentMissing as exc:
        raise fail(str(exc), EXIT_ENVIRONMENT)
    if fmt is ShowFormat.json:
        typer.echo(json.dumps(report.check_record(result), indent=2))
    else:
        typer.echo(report.render_check(result))
    raise typer.Exit(result.exit_code)


@app.command()
def verify(
    names: NamesArgument = None,
    all_: AllOption = False,
    backend: BackendChoice = BackendOption.auto,
    device: Annotated[int, typer.Option(help="CUDA device index.")] = 0,
    quick: Annotated[bool, typer.Option("--quick", help="Small samples and edges only (a CI smoke run).")] = False,
    seed: Annotated[int, typer.Option(help="Seed of the sample inputs and cotangents.")] = 0,
    check: Annotated[Optional[list[str]], typer.Option("--check", help="Run only this check id; repeatable.")] = None,
    case: Annotated[Optional[str], typer.Option(help="Run only this case id (from a rerun line).")] = None,
    json_file: Annotated[
        Optional[Path], typer.Option("--json", help="Write the JSON report (docs/verify-schema.md).")
    ] = None,
    junit_file: Annotated[Optional[Path], typer.Option("--junit", help="Write a JUnit XML report.")] = None,
    require_gpu: Annotated[bool, typer.Option("--require-gpu", help="Exit 3 unless the run is on a GPU.")] = False,
    isolate: IsolateOption = None,
    launch_timeout: LaunchTimeoutOption = None,
    emu_threads: EmuThreadsOption = None,
    fail_fast: Annotated[bool, typer.Option("--fail-fast", help="Stop after the first capsule that fails.")] = False,
    jobs: JobsOption = None,
    devices: DevicesOption = None,
    ray: RayOption = None,
    sanitize: Annotated[
        Optional[str],
        typer.Option(
            "--sanitize",
            metavar="[TOOLS]",
            help="Also run the kernels under sanitizers on the emulator, each a check "
            "sanitize.TOOL: a comma list of memcheck, racecheck, synccheck, initcheck; "
            "alone: all four. The builds are made first, in parallel; the capsules then run one per "
            "CPU core unless --jobs or --no-isolate says otherwise.",
        ),
    ] = None,
    sanitize_timeout: Annotated[
        Optional[float],
        typer.Option(
            "--sanitize-timeout",
            metavar="SECONDS",
            help="The most one sanitized run may take (default 600; the large "
            "cases of a full run under valgrind or TSan can need more).",
        ),
    ] = None,
    library: LibraryOption = None,
):
    """Check every contract claim of the named capsules on a backend.

    Checks: contract.aligned, ffi.symbols, launch.plan, shape.guard, value, value.special, vjp,
    vjp.reference, reduction.order, determinism, rng, selection.ties, bounds, inputs.intact.
    With --sanitize: sanitize.memcheck, sanitize.racecheck, sanitize.synccheck, sanitize.initcheck.
    Exit 0 when nothing failed, 1 on a FAILED or ERROR check, 3 when the backend or a sanitizer is missing.

    Example: capsules verify softmax relu --backend numpy --junit report.xml
    """
    import time as clock

    from capsule_core.catalog import registry
    from capsule_core.render import report
    from capsule_core.sanitize.engine import unavailable
    from capsule_core.verify import engine
    from capsule_core.verify.checks import ALL_CHECKS

    load_libraries(library)
    if not names and not all_:
        raise fail("NAME: give capsule names or --all", EXIT_USAGE)
    unknown_checks = [c for c in check or () if c not in ALL_CHECKS]
    if unknown_checks:
        raise fail(f"--check: unknown check {', '.join(unknown_checks)} (checks: {', '.join(ALL_CHECKS)})", EXIT_USAGE)
    tools = sanitizer_tools(sanitize, check)
    if sanitize_timeout is not None:
        from capsule_core.sanitize.engine import TIMEOUT_ENV

        if not tools:
            raise fail("--sanitize-timeout: applies to sanitizer runs; add --sanitize", EXIT_USAGE)
        if not 0 < sanitize_timeout < float("inf"):
            raise fail(
                f"--sanitize-timeout: must be a positive number of seconds, got {sanitize_timeout:g}", EXIT_USAGE
            )
        os.environ[TIMEOUT_ENV] = repr(sanitize_timeout)
    try:
        capsules = registry.kernel_capsules() if all_ else registry.lookup_many(names)
    except UnknownNameError as exc:
        raise fail(str(exc), EXIT_USAGE)
    if case is not None:
        from capsule_core.ops import get_spec

        why = engine.unknown_case([get_spec(c.op.value) for c in capsules], case, quick, seed)
        if why:
            raise fail(f"--case: {why}", EXIT_USAGE)
    unwritable = unwritable_outputs({"--json": json_file, "--junit": junit_file})
    if unwritable:
        raise fail(unwritable, EXIT_USAGE)
    emulator = emulator_options(launch_timeout, emu_threads)
    chosen, note = resolve_backend(backend.value, device, **emulator)
    if require_gpu and chosen.name != "cuda":
        raise fail(f"--require-gpu: {note}", EXIT_ENVIRONMENT)
    typer.echo(note, err=True)
    if tools and chosen.name == "cuda":
        typer.echo(f"sanitizers: {', '.join(tools)} under NVIDIA's compute-sanitizer", err=True)
    elif tools:
        for tool in tools:
            why = unavailable(tool)
            if why:
                raise fail(f"--sanitize {tool}: {why}", EXIT_ENVIRONMENT)
        typer.echo(f"sanitizers: {', '.join(tools)} on the emulator (child processes)", err=True)
        if jobs is None and isolate is not False and ray is None:
            jobs = "auto"  # a sanitize run's time is the sanitizers' runs: one capsule per core
    if jobs is None and isolate is None and ray is None and chosen.name == "emu" and len(capsules) > 1:
        jobs = "auto"  # on emu a run's time is the capsules' own work (references, launches): one per core
    builds = engine.run_builds(capsules, chosen.name, quick, tuple(check) if check else None, tools)
    if builds:
        from capsule_core.kernels.nvcc import build_in_parallel

        start_build = clock.perf_counter()
        build_in_parallel(builds, int(jobs) if jobs and jobs.isdigit() else None)
        count = f"{len(builds)} build" + ("s" if len(builds) != 1 else "")
        typer.echo(f"{count} ready in {clock.perf_counter() - start_build:.1f} s", err=True)
    where = spread(chosen.name, jobs, devices, ray, len(capsules), isolate=isolate, device=device, **emulator)
    if where is not None:
        from capsule_core.drivers import parallel

        typer.echo(parallel.describe(where, fresh=bool(isolate)), err=True)
    result = engine.VerifyReport(chosen.name, note, seed, quick)
    start = clock.perf_counter()
    with stop_signals():
        try:
            with progress_bar() as progress:
                task = progress.add_task("verify", total=len(capsules)) if progress else None
                if where is not None:
                    collect(
                        parallel.verify(
                            capsules,
                            where,
                            fresh=bool(isolate),
                            quick=quick,
                            seed=seed,
                            checks=tuple(check) if check else None,
                            case=case,
                            sanitize=tools,
                        ),
                        result.capsules,
                        progress,
                        task,
                        stop=lambda one: fail_fast and one.status in (engine.Status.FAILED, engine.Status.ERROR),
                    )
                for capsule in capsules if where is None else ():
                    if progress:
                        progress.update(task, description=f"verify {capsule.op.value}")
                    one = engine.verify_capsule(
                        capsule,
                        chosen,
                        quick=quick,
                        seed=seed,
                        checks=tuple(check) if check else None,
                        case=case,
                        sanitize=tools,
                    )
                    result.capsules.append(one)
                    if progress:
                        progress.advance(task)
                    if fail_fast and one.status in (engine.Status.FAILED, engine.Status.ERROR):
                        break
        except KeyboardInterrupt as interruption:
            result.stop(signal_name(interruption), capsules)
        result.seconds = clock.perf_counter() - start
        typer.echo(report.render_verify(result))
        write_reports(json_file, junit_file, lambda: report.verify_record(result), lambda: report.verify_junit(result))
    raise typer.Exit(result.exit_code)


def sanitizer_tools(sanitize: Optional[str], check: Optional[list[str]]) -> tuple[str, ...]:
    """The sanitizers asked for by --sanitize (a comma list, or all) and --check sanitize.TOOL
    (exit 2 for an unknown tool)."""
    from capsule_core.sanitize.engine import TOOLS

    asked = (
        []
        if sanitize is None
        else list(TOOLS)
        if sanitize == "all"
        else [t.strip() for t in sanitize.split(",") if t.strip()]
    )
    unknown = [t for t in asked if t not in TOOLS]
    if unknown or (sanitize is not None and not asked):
        raise fail(
            f"--sanitize: unknown tool {', '.join(unknown) or repr(sanitize)} (tools: {', '.join(TOOLS)}, or all)",
            EXIT_USAGE,
        )
    asked += [c.split(".", 1)[1] for c in check or () if c.startswith("sanitize.")]
    return tuple(dict.fromkeys(asked))


@app.command()
def doctor(
    library: LibraryOption = None,
):
    """What this machine has, and which commands can run here.

    Python and package versions, whether pycuda imports, nvcc, the driver and GPUs, the cache
    folder, and each capsule library (or why it did not load).

    Example: capsules doctor
    """
    from tabulate import tabulate

    from capsule_core import doctor as engine

    code = load_libraries(library, keep_going=True)
    result = engine.examine()
    typer.echo(
        tabulate(
            [(f.name, f.value, "ok" if f.ok else "missing") for f in result.facts],
            headers=("what", "found", ""),
            tablefmt="simple",
        )
    )
    typer.echo("")
    typer.echo(
        tabulate(
            [(c, "yes" if ok else "no", why) for c, ok, why in result.commands],
            headers=("command", "can run", "why not"),
            tablefmt="simple",
        )
    )
    raise typer.Exit(code)


app.command()(bench)
app.command()(fuzz)
app.command()(plan)


def main():
    """Console-script entry point: library errors become one line and an exit code, never a traceback."""
    import sys

    sys.argv[1:] = optional_option_values(sys.argv[1:])
    try:
        app()
    except EnvironmentMissing as exc:
        typer.echo(f"capsules: error: {exc}", err=True)
        raise SystemExit(EXIT_ENVIRONMENT)
    except CapsuleError as exc:
        typer.echo(f"capsules: error: {exc}", err=True)
        raise SystemExit(EXIT_USAGE)
