"""--jobs, --devices and --ray, shared by verify and fuzz: parse them into capsule_core.drivers.parallel's
terms and gather what its engines yield. Kept light at import time (capsules --help)."""

from typing import Annotated, Optional

import typer

JobsOption = Annotated[
    Optional[str],
    typer.Option(
        "--jobs",
        metavar="N|auto",
        help="Spread the capsules over N worker processes (auto: one per CPU core; on cuda one per GPU of --devices). "
        "The report is the serial one; a worker that dies is an ERROR of its capsule only. "
        "Default for verify on emu with more than one capsule: auto.",
    ),
]
DevicesOption = Annotated[
    Optional[str],
    typer.Option(
        "--devices", metavar="0,1|all", help="The GPUs the cuda workers of --jobs are pinned to, in turn (default all)."
    ),
]
IsolateOption = Annotated[
    Optional[bool],
    typer.Option(
        "--isolate/--no-isolate",
        help="Where the kernels run. Default on emu and cuda: worker processes (on emu one per core when there are "
        "several capsules, else one), replaced after a death, so that a "
        "kernel that crashes or hangs costs its own capsule only. --isolate: a fresh process for every capsule. "
        "--no-isolate: here, in this process (to debug under gdb).",
    ),
]
LaunchTimeoutOption = Annotated[
    Optional[float],
    typer.Option(
        "--launch-timeout",
        metavar="SECONDS",
        help="The emulator's watchdog: a launch running longer is ended as hung (default 120, or "
        "CAPSULES_LAUNCH_TIMEOUT; 0: none).",
    ),
]
RayOption = Annotated[
    Optional[str],
    typer.Option(
        "--ray",
        metavar="ADDRESS",
        help="Each capsule a task on a Ray cluster: local (start one here), auto (the one `ray start` runs here) or "
        "HOST:PORT; needs the ray extra.",
    ),
]


EmuThreadsOption = Annotated[
    Optional[int],
    typer.Option(
        "--emu-threads",
        metavar="N",
        help="On emu: OS threads that run the blocks of a launch (default CAPSULES_EMU_THREADS, else every usable core, "
        "shared among --jobs workers; 1: one block after another).",
    ),
]


def emulator_options(launch_timeout: Optional[float], emu_threads: Optional[int]) -> dict:
    """--launch-timeout (a finite number of seconds, 0 for none) and --emu-threads (a whole number
    >= 1) checked, as the keyword arguments of resolve and spread; exit 2 naming the rule."""
    from cli.common import EXIT_USAGE, fail

    if launch_timeout is not None and not 0 <= launch_timeout < float("inf"):
        raise fail(
            f"--launch-timeout: must be a number of seconds >= 0 (0: no watchdog), got {launch_timeout:g}", EXIT_USAGE
        )
    if emu_threads is not None and emu_threads < 1:
        raise fail(f"--emu-threads: must be >= 1 (1: blocks one after another), got {emu_threads}", EXIT_USAGE)
    return {"launch_timeout": launch_timeout, "emu_threads": emu_threads}


def spread(
    backend: str,
    jobs: Optional[str],
    devices: Optional[str],
    ray: Optional[str],
    capsules: int,
    *,
    isolate: Optional[bool] = None,
    device: int = 0,
    launch_timeout: Optional[float] = None,
    emu_threads: Optional[int] = None,
):
    """Where the options put the capsules: local workers, a Ray cluster, or None (here, one after
    another). Without --jobs or --ray, the kernels of emu and cuda run contained in one worker
    process unless --no-isolate. A usage error exits 2, a missing Ray or GPU 3."""
    from capsule_core.drivers import parallel
    from capsule_core.errors import EnvironmentMissing
    from cli.common import EXIT_ENVIRONMENT, EXIT_USAGE, fail

    try:
        if isolate is False and (jobs is not None or ray is not None):
            raise parallel.OptionError(
                "--no-isolate: runs the capsules in this process; give it without --jobs or --ray"
            )
        if ray is not None:
            if jobs is not None:
                raise parallel.OptionError("--ray: runs each capsule as a Ray task; give --ray or --jobs, not both")
            if devices is not None:
                raise parallel.OptionError("--devices: pins the workers of --jobs; on Ray each cuda task gets a GPU")
            parallel.require_ray()
            return parallel.RayCluster(ray, backend)
        if jobs is None:
            if devices is not None:
                raise parallel.OptionError("--devices: pins the workers of --jobs to GPUs; give --jobs too")
            if isolate:  # a fresh worker per capsule, on any backend
                return (parallel.Worker(backend, device, launch_timeout, emu_threads),)
            if isolate is False:
                return None
            return parallel.contained(backend, device, launch_timeout, emu_threads) or None  # () on numpy: here
        return parallel.local_workers(backend, jobs, devices, capsules, launch_timeout, emu_threads)
    except parallel.OptionError as exc:
        raise fail(str(exc), EXIT_USAGE)
    except EnvironmentMissing as exc:
        raise fail(str(exc), EXIT_ENVIRONMENT)


def collect(results, into: list, progress=None, task=None, stop=lambda one: False) -> None:
    """Put each (index, result) of a parallel engine into `into`, in request order at every step,
    so that Ctrl-C or `stop` leaves exactly the finished results there; then end the engine."""
    done = {}
    try:
        for index, one in results:
            done[index] = one
            into[:] = [done[i] for i in sorted(done)]
            if progress:
                progress.advance(task)
            if stop(one):
                return
    finally:
        results.close()
