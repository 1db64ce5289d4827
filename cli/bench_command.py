"""`capsules bench`: parse the options, run capsule_core.bench.engine, write what capsule_core.render.report renders.

Kept light at import time: numpy, the engine and the backends load inside the command.
"""

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from cli.options import (
    AllOption,
    LibraryOption,
    NamesArgument,
    kernel_library_capsules,
    load_libraries,
    unwritable_outputs,
)


class BenchBackend(str, Enum):
    cuda = "cuda"
    emu = "emu"
    numpy = "numpy"


class BaselineOption(str, Enum):
    torch = "torch"
    cupy = "cupy"
    numpy = "numpy"
    none = "none"


def bench(
    names: NamesArgument = None,
    all_: AllOption = False,
    suite: Annotated[
        Optional[str],
        typer.Option(
            help="A named suite of fixed workloads instead of NAMES, --all and --size: reference (the kernel "
            "review's shapes, forward and backward; on numpy, cases over 128 MiB are skipped)."
        ),
    ] = None,
    size: Annotated[
        Optional[str],
        typer.Option(
            help="small, medium, large, a byte count moved per call (256MB, 1GiB), or auto (the default): "
            "large on the CPU, grown to 4x the L2 on a GPU."
        ),
    ] = None,
    backend: Annotated[
        Optional[BenchBackend], typer.Option(help="Default: cuda when a GPU answers, else numpy (said in one line).")
    ] = None,
    device: Annotated[int, typer.Option(help="CUDA device index.")] = 0,
    cold: Annotated[
        bool,
        typer.Option(
            "--cold",
            help="Flush the L2 (the CPU's last-level cache on numpy) "
            "before every timed call, outside the timed region.",
        ),
    ] = False,
    json_file: Annotated[
        Optional[Path], typer.Option("--json", help="Write the JSON report (docs/bench-schema.md).")
    ] = None,
    csv_file: Annotated[Optional[Path], typer.Option("--csv", help="Write one CSV row per case.")] = None,
    markdown: Annotated[bool, typer.Option("--markdown", help="Print the table as Markdown.")] = False,
    compare: Annotated[
        Optional[Path], typer.Option("--compare", help="An earlier --json report: mark regressions, exit 1 on any.")
    ] = None,
    threshold: Annotated[
        str,
        typer.Option(
            help="Slowdown beyond which --compare calls a regression, beyond the "
            "noise: the new first quartile over the old third quartile."
        ),
    ] = "5%",
    baseline: Annotated[
        Optional[list[BaselineOption]],
        typer.Option(
            help="Baseline library; repeat for several (default: every one that can run here; none for none)."
        ),
    ] = None,
    plot: Annotated[
        Optional[Path], typer.Option("--plot", help="Draw a roofline PNG (needs matplotlib: the plot extra).")
    ] = None,
    noise: Annotated[str, typer.Option(help="Stop sampling when the IQR falls under this share of the median.")] = "2%",
    min_samples: Annotated[int, typer.Option(min=1, help="Samples before the noise test applies.")] = 10,
    max_time: Annotated[
        float, typer.Option(min=0.001, help="Seconds of sampling per measurement before giving up on the noise target.")
    ] = 0.5,
    warmup: Annotated[float, typer.Option(min=0.0, help="Warm-up per measurement, in milliseconds.")] = 25.0,
    seed: Annotated[int, typer.Option(help="Seed of the sample inputs.")] = 0,
    library: LibraryOption = None,
):
    """Time kernels: median and spread, GB/s and GFLOP/s, % of the device's measured peak, beside baselines.

    CUDA events through the cuda backend (wall-clock timers on the numpy provider), a warm-up,
    then samples until the IQR is under --noise of the median or --max-time passes; --cold
    flushes the L2 outside each timed call. Bytes and flops come from the cost models; the copy
    bandwidth and FMA throughput are measured once per run, and each kernel is shown as a share
    of the one that bounds it. Baseline ratios: PyTorch and CuPy on the same GPU, numpy on the
    CPU, only where they compute the same thing (the rest are listed with the reason).
    Exit 0; 1 on a regression under --compare or a kernel that failed; 2 usage; 3 missing GPU or matplotlib.

    Examples: capsules bench relu softmax matmul --backend numpy --json out.json;
    on a GPU, the whole performance table: capsules bench --suite reference --json reference.json
    """
    import importlib.util

    from capsule_core.errors import EnvironmentMissing
    from cli.common import EXIT_ENVIRONMENT, EXIT_USAGE, fail, progress_bar

    load_libraries(library)
    chosen_suite, capsules = None, []
    if suite is not None:
        given = [
            label
            for label, present in (("NAME", bool(names)), ("--all", all_), ("--size", size is not None))
            if present
        ]
        if given:
            raise fail(
                f"--suite: cannot be combined with {', '.join(given)} (a suite fixes its ops and shapes)", EXIT_USAGE
            )
        from capsule_core.bench.suites import SUITES

        if suite not in SUITES:
            raise fail(f"--suite: unknown suite {suite!r} (suites: {', '.join(SUITES)})", EXIT_USAGE)
        chosen_suite = SUITES[suite]
    elif not names and not all_:
        raise fail("NAME: give capsule names, --all or --suite reference", EXIT_USAGE)
    else:
        capsules = kernel_library_capsules(names, all_, "bench")

    from capsule_core.bench import engine
    from capsule_core.render import report

    try:
        chosen_size = engine.parse_size(size or "auto")
        rule = engine.StoppingRule(
            noise=engine.parse_percent(noise, "--noise"), min_samples=min_samples, max_time_s=max_time, warmup_ms=warmup
        )
        limit = engine.parse_percent(threshold, "--threshold")
    except ValueError as exc:
        message = str(exc)
        raise fail(message if message.startswith("--") else f"--size: {message}", EXIT_USAGE)
    requested = [b.value for b in baseline or ()]
    if "none" in requested and len(requested) > 1:
        raise fail("--baseline: none cannot be combined with a library", EXIT_USAGE)
    libraries = () if requested == ["none"] else tuple(requested) or engine.twins_table.BASELINES
    previous = None
    if compare is not None:
        try:
            previous = engine.load_previous(compare)
        except engine.CompareError as exc:
            raise fail(str(exc), EXIT_USAGE)
    unwritable = unwritable_outputs({"--json": json_file, "--csv": csv_file, "--plot": plot})
    if unwritable:
        raise fail(unwritable, EXIT_USAGE)
    if plot is not None and importlib.util.find_spec("matplotlib") is None:
        raise fail(
            "--plot needs matplotlib: pip install 'capsules[plot]' (or pip install matplotlib)", EXIT_ENVIRONMENT
        )
    for name in requested:
        if name in ("torch", "cupy") and importlib.util.find_spec(name) is None:
            raise fail(
                f"--baseline {name}: {name} is not installed here (pip install {name if name == 'torch' else 'cupy-cuda12x'})",
                EXIT_ENVIRONMENT,
            )

    from capsule_core.backends.select import resolve

    if backend is BenchBackend.emu:
        raise fail(
            "--backend emu: the emulator runs every thread of a kernel one after another on the CPU, so its "
            "time says nothing about the kernel's; bench on a GPU (--backend cuda) or the numpy provider",
            EXIT_ENVIRONMENT,
        )
    try:
        chosen, note = resolve(backend.value if backend else "auto", device, emulate=False)
    except EnvironmentMissing as exc:
        raise fail(str(exc), EXIT_ENVIRONMENT)
    if "cupy" in requested and chosen.name != "cuda":
        raise fail("--baseline cupy: CuPy runs on a GPU and this run is on the CPU (numpy backend)", EXIT_ENVIRONMENT)
    typer.echo(note, err=True)
    try:
        bench_device = engine.device_for(chosen)
    except EnvironmentMissing as exc:
        raise fail(str(exc), EXIT_ENVIRONMENT)
    settings = engine.Settings(chosen_size, cold, rule, libraries, seed)

    with progress_bar() as bar:
        task = bar.add_task("bench", total=len(chosen_suite.cases if chosen_suite else capsules)) if bar else None

        def progress(done: int, total: int, label: str):
            if bar:
                bar.update(task, total=total, completed=done, description=label)

        if chosen_suite is not None:
            result = engine.run_suite(chosen_suite, bench_device, settings, note, progress=progress)
        else:
            result = engine.run(capsules, bench_device, settings, note, progress=progress)
    if previous is not None:
        result.comparison = engine.compare(previous, result, limit, str(compare))

    typer.echo(report.render_bench(result, markdown=markdown))
    _write_outputs(result, json_file, csv_file, plot)
    raise typer.Exit(result.exit_code)


def _write_outputs(result, json_file: Path | None, csv_file: Path | None, plot: Path | None):
    """--json, --csv and --plot, each written atomically; exit 3 if one cannot be."""
    from capsule_core import __version__
    from capsule_core.output_files import atomic_path, write_texts_atomic
    from capsule_core.render import report
    from cli.common import EXIT_ENVIRONMENT, fail

    texts = {}
    if json_file is not None:
        import json

        texts[json_file] = json.dumps(report.bench_record(result, __version__), indent=2) + "\n"
    if csv_file is not None:
        texts[csv_file] = report.bench_csv(result) + "\n"
    try:
        write_texts_atomic(texts)
        if plot is not None:
            with atomic_path(plot) as temporary:
                report.write_roofline(result, temporary)
    except OSError as exc:
        raise fail(f"cannot write {exc.filename}: {exc.strerror}", EXIT_ENVIRONMENT)
