"""`capsules fuzz`: parse the options, run capsule_core.fuzz.engine, write what capsule_core.render.report renders.

Kept light at import time: hypothesis, numpy and the engine load inside the command.
"""

from pathlib import Path
from typing import Annotated, Optional

import typer

from cli.options import (
    AllOption,
    BackendChoice,
    BackendOption,
    LibraryOption,
    NamesArgument,
    load_libraries,
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
from cli.stop_signals import signal_name, stop_signals

DEFAULT_EXAMPLES = 100
"""Examples per capsule when neither --examples nor --time is given."""
DEFAULT_SAVE = Path("capsules-fuzz-failures")


def fuzz(
    names: NamesArgument = None,
    all_: AllOption = False,
    backend: BackendChoice = BackendOption.auto,
    time_budget: Annotated[
        Optional[float],
        typer.Option(
            "--time",
            help="Seconds for the whole run, shared across the capsules (shrinking a failure may run over "
            "by up to 20 s).",
        ),
    ] = None,
    examples: Annotated[
        Optional[int],
        typer.Option(
            help=f"At most this many examples per capsule (default {DEFAULT_EXAMPLES} without --time, "
            "no limit with it)."
        ),
    ] = None,
    seed: Annotated[
        Optional[int],
        typer.Option(help="Seed of the search and of the cotangents (default: a fresh one, printed in the summary)."),
    ] = None,
    save: Annotated[
        Optional[Path],
        typer.Option(
            help=f"Write each shrunk failure as a replay file here "
            f"(default ./{DEFAULT_SAVE}, created on the first failure)."
        ),
    ] = None,
    replay: Annotated[
        Optional[Path], typer.Option(help="Rerun one saved failure exactly (its .json file) instead of fuzzing.")
    ] = None,
    json_file: Annotated[
        Optional[Path], typer.Option("--json", help="Write the JSON report (docs/fuzz-schema.md).")
    ] = None,
    junit_file: Annotated[
        Optional[Path], typer.Option("--junit", help="Write a JUnit XML report: one test per capsule.")
    ] = None,
    jobs: JobsOption = None,
    devices: DevicesOption = None,
    ray: RayOption = None,
    isolate: IsolateOption = None,
    launch_timeout: LaunchTimeoutOption = None,
    emu_threads: EmuThreadsOption = None,
    library: LibraryOption = None,
):
    """Search for contract violations with Hypothesis: shapes, parameters and values, invalid inputs included.

    Strategies come from each op's OpSpec (its samples, edges and error inputs as templates):
    dimensions remapped (empty, 1, primes, large), values from ordinary to extreme (NaN, inf,
    -0, subnormals, 3e38, ties), index entries repeated and out of range, rows blocked,
    parameters across and beyond their ranges, inputs broken on purpose. An input the runtime
    guard refuses must be refused by the backend with the same error before any launch; an
    accepted one runs value or value.special, vjp, bounds, inputs.intact and determinism under
    the worst-case bound. The first failure of a capsule is shrunk and saved as a replay file
    (docs/fuzz-replay.md); the example database lives in the cache folder.
    Exit 0 when nothing failed, 1 on a failure, 2 on a usage error, 3 when the backend is missing,
    128 + the signal's number when Ctrl-C, SIGTERM or SIGHUP stopped it (the reports are then partial).

    Example: capsules fuzz relu softmax --backend numpy --examples 30 --seed 1
    """
    import time as clock

    from capsule_core.catalog import registry
    from capsule_core.errors import UnknownNameError
    from capsule_core.render import report
    from cli.common import EXIT_USAGE, fail, write_reports

    load_libraries(library)
    if replay is not None and (names or all_):
        raise fail("--replay: reruns the capsule its file names; give no NAME or --all with it", EXIT_USAGE)
    if replay is not None and (jobs or devices or ray):
        raise fail("--replay: reruns one example here; give no --jobs, --devices or --ray with it", EXIT_USAGE)
    if replay is None and not names and not all_:
        raise fail("NAME: give capsule names, --all or --replay FILE", EXIT_USAGE)
    if time_budget is not None and not time_budget > 0:
        raise fail(f"--time: must be a positive number of seconds, got {time_budget:g}", EXIT_USAGE)
    if examples is not None and examples < 1:
        raise fail(f"--examples: must be at least 1, got {examples}", EXIT_USAGE)
    if seed is not None and not 0 <= seed < 2**32:
        raise fail(f"--seed: must be in [0, 2**32), got {seed}", EXIT_USAGE)
    try:
        capsules = registry.kernel_capsules() if all_ else registry.lookup_many(names or ())
    except UnknownNameError as exc:
        raise fail(str(exc), EXIT_USAGE)
    directory = save if save is not None else DEFAULT_SAVE
    if replay is not None and (json_file or junit_file):
        raise fail("--replay: prints what one saved failure gives now; give no --json or --junit with it", EXIT_USAGE)
    unwritable = (
        None
        if replay is not None
        else unwritable_outputs({"--json": json_file, "--junit": junit_file}, {"--save": directory})
    )
    if unwritable:
        raise fail(unwritable, EXIT_USAGE)
    emulator = emulator_options(launch_timeout, emu_threads)

    from capsule_core.fuzz import engine

    recorded = None
    if replay is not None:
        try:
            recorded = engine.read_replay(replay)
            registry.lookup(recorded.capsule)
        except (engine.ReplayFileError, UnknownNameError) as exc:
            raise fail(str(exc), EXIT_USAGE)
    chosen, note = resolve_backend(backend.value, **emulator)
    typer.echo(note, err=True)
    where = spread(chosen.name, jobs, devices, ray, len(capsules), isolate=isolate, **emulator)
    from capsule_core.drivers import parallel

    if where is not None:
        typer.echo(parallel.describe(where, fresh=bool(isolate)), err=True)

    if recorded is not None:
        result = parallel.replay(recorded, where) if where is not None else engine.replay(recorded, chosen)
        typer.echo(report.render_fuzz_replay(result))
        raise typer.Exit(result.exit_code)

    database = engine.database_dir()
    try:
        database.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        typer.echo(f"capsules: warning: no example database ({database}: {exc.strerror})", err=True)
        database = None
    max_examples = examples if examples is not None else (None if time_budget is not None else DEFAULT_EXAMPLES)
    run_seed = engine.new_seed() if seed is None else seed
    result = engine.FuzzReport(chosen.name, note, run_seed, time_budget, max_examples)
    start = clock.perf_counter()
    with stop_signals():
        try:
            _search(capsules, chosen, where, result, database, time_budget, max_examples, run_seed, bool(isolate))
        except KeyboardInterrupt as interruption:
            result.stop(signal_name(interruption), capsules)
        result.seconds = clock.perf_counter() - start

        saved = {}
        for failure in result.failures:
            try:
                saved[failure.capsule] = engine.write_replay(failure, directory)
            except OSError as exc:
                typer.echo(
                    f"capsules: error: --save: cannot write the replay of {failure.capsule} into {directory}: "
                    f"{exc.strerror}",
                    err=True,
                )
        typer.echo(report.render_fuzz(result, saved))
        write_reports(
            json_file, junit_file, lambda: report.fuzz_record(result, saved), lambda: report.fuzz_junit(result, saved)
        )
    raise typer.Exit(result.exit_code)


def _search(capsules, chosen, where, result, database, time_budget, max_examples, run_seed, fresh) -> None:
    """Fuzz the capsules into result.capsules: in the workers of `where` (a poisoned or dead
    worker is replaced, the run goes on), or here one after another."""
    from capsule_core.drivers import parallel
    from capsule_core.fuzz import engine
    from cli.common import progress_bar

    with progress_bar() as progress:
        task = progress.add_task("fuzz", total=len(capsules)) if progress else None
        if where is not None:
            collect(
                parallel.fuzz(
                    capsules,
                    where,
                    time_budget=time_budget,
                    max_examples=max_examples,
                    seed=run_seed,
                    database=database,
                    fresh=fresh,
                ),
                result.capsules,
                progress,
                task,
            )
            return

        def on_example(state):
            progress.update(
                task,
                description=f"fuzz {state.op}: {state.examples} examples"
                + (f", shrinking ({state.shrink_steps})" if state.shrink_steps else ""),
            )

        for one in engine.fuzz(
            capsules,
            chosen,
            time_budget=time_budget,
            max_examples=max_examples,
            seed=run_seed,
            database=database,
            on_example=on_example if progress else None,
        ):
            result.capsules.append(one)
            result.poisoned = result.poisoned or one.poisoned
            if progress:
                progress.advance(task)
