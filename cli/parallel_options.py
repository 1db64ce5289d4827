"""--jobs, --devices and --ray, shared by verify and fuzz: parse them into capsule_core.parallel's
terms and gather what its engines yield. Kept light at import time (capsules --help)."""

from typing import Annotated, Optional

import typer

JobsOption = Annotated[Optional[str], typer.Option(
    "--jobs", metavar="N|auto",
    help="Spread the capsules over N worker processes (auto: one per CPU core; on cuda one per GPU of --devices). "
         "The report is the serial one; a worker that dies is an ERROR of its capsule only.")]
DevicesOption = Annotated[Optional[str], typer.Option(
    "--devices", metavar="0,1|all", help="The GPUs the cuda workers of --jobs are pinned to, in turn (default all).")]
RayOption = Annotated[Optional[str], typer.Option(
    "--ray", metavar="ADDRESS",
    help="Each capsule a task on a Ray cluster: local (start one here), auto (the one `ray start` runs here) or "
         "HOST:PORT; needs the ray extra.")]


def spread(backend: str, jobs: Optional[str], devices: Optional[str], ray: Optional[str], capsules: int):
    """Where the options put the capsules: local workers, a Ray cluster, or None (here, one after
    another). A usage error exits 2, a missing Ray or GPU 3."""
    from capsule_core import parallel
    from capsule_core.errors import EnvironmentMissing
    from cli.app import EXIT_ENVIRONMENT, EXIT_USAGE, fail

    try:
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
            return None
        return parallel.local_workers(backend, jobs, devices, capsules)
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
