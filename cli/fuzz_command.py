"""`capsules fuzz`: parse the options, run capsule_core.fuzz, write what capsule_core.report renders.

Kept light at import time: hypothesis, numpy and the engine load inside the command.
"""

from pathlib import Path
from typing import Annotated, Optional

import typer

from cli.options import BackendOption, unwritable_outputs
from cli.parallel_options import DevicesOption, JobsOption, RayOption, collect, spread

DEFAULT_EXAMPLES = 100
"""Examples per capsule when neither --examples nor --time is given."""
DEFAULT_SAVE = Path("capsules-fuzz-failures")


def fuzz(
    names: Annotated[Optional[list[str]], typer.Argument(help="Capsule or op names.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Every native capsule.")] = False,
    backend: Annotated[BackendOption, typer.Option(help="auto: cuda when a GPU answers, else emu (the kernels on the CPU emulator) when a C++ compiler is here, else numpy.")] = BackendOption.auto,
    time_budget: Annotated[Optional[float], typer.Option(
        "--time", help="Seconds for the whole run, shared across the capsules (shrinking a failure may run over "
                       "by up to 20 s).")] = None,
    examples: Annotated[Optional[int], typer.Option(
        help=f"At most this many examples per capsule (default {DEFAULT_EXAMPLES} without --time, "
             "no limit with it).")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Seed of the search and of the cotangents (default: a fresh "
                                                     "one, printed in the summary).")] = None,
    save: Annotated[Optional[Path], typer.Option(help=f"Write each shrunk failure as a replay file here "
                                                      f"(default ./{DEFAULT_SAVE}, created on the first failure).")] = None,
    replay: Annotated[Optional[Path], typer.Option(help="Rerun one saved failure exactly (its .json file) "
                                                        "instead of fuzzing.")] = None,
    jobs: JobsOption = None,
    devices: DevicesOption = None,
    ray: RayOption = None,
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
    Exit 0 when nothing failed, 1 on a failure, 2 on a usage error, 3 when the backend is missing.

    Example: capsules fuzz relu softmax --backend numpy --examples 30 --seed 1
    """
    import time as clock

    from capsule_core import native_cuda, registry, report
    from capsule_core.errors import EnvironmentMissing, UnknownNameError
    from cli.app import EXIT_ENVIRONMENT, EXIT_USAGE, _progress, fail

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
        capsules = list(native_cuda.CAPSULES) if all_ else [registry.lookup(n) for n in names or ()]
    except UnknownNameError as exc:
        raise fail(str(exc), EXIT_USAGE)
    directory = save if save is not None else DEFAULT_SAVE
    unwritable = None if replay is not None else unwritable_outputs({}, {"--save": directory})
    if unwritable:
        raise fail(unwritable, EXIT_USAGE)

    from capsule_core import fuzz as engine
    from capsule_core.backends.select import resolve

    recorded = None
    if replay is not None:
        try:
            recorded = engine.read_replay(replay)
            registry.lookup(recorded.capsule)
        except (engine.ReplayFileError, UnknownNameError) as exc:
            raise fail(str(exc), EXIT_USAGE)
    try:
        chosen, note = resolve(backend.value)
    except EnvironmentMissing as exc:
        raise fail(str(exc), EXIT_ENVIRONMENT)
    typer.echo(note, err=True)
    where = spread(chosen.name, jobs, devices, ray, len(capsules))
    if where is not None:
        from capsule_core import parallel
        typer.echo(parallel.describe(where), err=True)

    if recorded is not None:
        result = engine.replay(recorded, chosen)
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
    try:
        with _progress() as progress:
            task = progress.add_task("fuzz", total=len(capsules)) if progress else None

            def on_example(state):
                if progress:
                    progress.update(task, description=f"fuzz {state.op}: {state.examples} examples"
                                                      + (f", shrinking ({state.shrink_steps})" if state.shrink_steps else ""))
            if where is not None:  # a poisoned worker is replaced: the run goes on, result.poisoned stays False
                collect(parallel.fuzz(capsules, where, time_budget=time_budget, max_examples=max_examples, seed=run_seed,
                                      database=database), result.capsules, progress, task)
            else:
                for one in engine.fuzz(capsules, chosen, time_budget=time_budget, max_examples=max_examples,
                                       seed=run_seed, database=database, on_example=on_example if progress else None):
                    result.capsules.append(one)
                    result.poisoned = result.poisoned or one.poisoned
                    if progress:
                        progress.advance(task)
    except KeyboardInterrupt:
        result.interrupted = True
    result.seconds = clock.perf_counter() - start

    saved = {}
    for failure in result.failures:
        try:
            saved[failure.capsule] = engine.write_replay(failure, directory)
        except OSError as exc:
            typer.echo(f"capsules: error: --save: cannot write the replay of {failure.capsule} into {directory}: "
                       f"{exc.strerror}", err=True)
    typer.echo(report.render_fuzz(result, saved))
    raise typer.Exit(130 if result.interrupted else result.exit_code)
