"""verify and fuzz spread over worker processes (--jobs) or over a Ray cluster (--ray).

Capsules are independent, so the work splits per capsule and nothing else changes: a worker runs
verify_capsule or fuzz_capsule exactly as the serial loop does. The engines yield (index, result)
as capsules finish, the index being the capsule's place in the request, so that the caller
rebuilds the serial report in the serial order, also after Ctrl-C from whatever had finished.
Nothing here prints.

Local workers are long-lived processes started with the "spawn" context (never a fork of a
parent that may hold a CUDA context or threads), one capsule at a time each, over a pipe. On emu
and cuda one such worker is the default even without --jobs (containment: a kernel that scribbles
over its process or poisons its context costs its own capsule). Not a fresh process per capsule
(what --isolate asks for): `verify relu --quick` on emu costs a fresh process 1.0 s of CPU
(imports, the emulator's library, the PTX cache), a warm worker 0.05 s, and most capsules of a
quick run take 0.05-0.2 s there; a worker pays its start once, and is replaced only after a
capsule that failed, errored or killed it. Workers ignore SIGINT, SIGTERM and SIGHUP (the parent's
to act on: it keeps what finished and kills them) and die with the parent (children.py). Not
concurrent.futures.ProcessPoolExecutor: one dead worker breaks that whole pool without saying
whose task killed it. Here each worker holds one known capsule, so a worker that dies (a
segfault, the OOM killer, os._exit) is ERROR for that capsule only, and a fresh worker takes its
place; so is a worker whose capsule ended in ERROR, so that a poisoned CUDA context never reaches
the next capsule. Results cross the pipe pickled, losslessly (the JSON record of --isolate drops
non-finite worst values, and fuzz results have no record).

On a Ray cluster each capsule is a task (num_gpus=1 on cuda, num_cpus=1 otherwise, never
retried: a capsule that kills its worker is an ERROR, as here). capsule_core travels with the job
as a wheel lays it out, the CUDA sources inside, and each node compiles into its own cache
folder. A fuzz task searches with a private copy of this machine's Hypothesis example database
and sends back what it added, which is merged into the local database.
"""

from __future__ import annotations

import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from capsule_core.errors import CapsuleError, EnvironmentMissing
from capsule_core.kernels.nvcc import usable_cpus


class OptionError(CapsuleError):
    """A --jobs, --devices or --ray value that breaks its rule (a usage error)."""


@dataclass(frozen=True)
class Worker:
    """One local worker process: the backend it opens, on cuda the device it is pinned to, on
    emu the launch timeout of its emulator (None: CAPSULES_LAUNCH_TIMEOUT or the default) and the
    OS threads that run a launch's blocks (None: CAPSULES_EMU_THREADS, else every usable core),
    and the threads of numpy's BLAS (None: as the environment says, by default every core)."""

    backend: str
    device: int = 0
    launch_timeout: float | None = None
    emu_threads: int | None = None
    blas_threads: int | None = None


CONTAINED_BACKENDS = ("emu", "cuda")
"""Backends whose kernels verify, fuzz and the pytest plugin run in a worker process by default
(containment): a kernel that kills its process, or leaves a CUDA context unusable, costs its own
capsule only."""

BLAS_THREADS_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""What sets the threads of numpy's BLAS (OpenBLAS's wheels, or MKL's), read when numpy loads."""

WORKER_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 32)}
"""glibc's malloc in a worker process, where the environment does not say: blocks under 1 GiB from
its heap, and freed ones kept there for the next. A verify allocates float64 arrays of tens of MiB
over and over (references, magnitudes, comparisons); by default glibc maps each afresh and unmaps
it when freed, so every page of every array cost a fault and the kernel's zeroing (a worker's
system time on softmax, conv and three pointwise capsules: 3.0 -> 0.9 s)."""

HANG_GRACE = 10.0
"""The parent kills a worker stuck in one launch for twice the launch timeout, and at least this
many seconds more (the emulator's watchdog normally ends the launch first; this is for a kernel
that blocks the watchdog's signal, or waits in a system call)."""


def contained(
    backend: str, device: int = 0, launch_timeout: float | None = None, emu_threads: int | None = None
) -> tuple[Worker, ...]:
    """The default of verify, fuzz and the plugin on `backend`: one worker process, replaced
    after a death; () where the kernels run in-process (numpy: nothing to contain)."""
    return (Worker(backend, device, launch_timeout, emu_threads),) if backend in CONTAINED_BACKENDS else ()


@dataclass(frozen=True)
class RayCluster:
    """Capsules as tasks on the Ray cluster at `address`, in Ray's own terms: "local" (a new
    cluster on this machine), "auto" (the one `ray start` runs here), "HOST:PORT", "ray://HOST:PORT"."""

    address: str
    backend: str


def describe(where: Sequence[Worker] | RayCluster, fresh: bool = False) -> str:
    """One line saying where the capsules run (`fresh`: a new process for every capsule)."""
    if isinstance(where, RayCluster):
        return f"spread: one Ray task per capsule on the cluster at {where.address}"
    devices = sorted({w.device for w in where})
    on = f" on cuda devices {', '.join(map(str, devices))}" if where and where[0].backend == "cuda" else ""
    if fresh:
        return f"isolated: every capsule in a fresh worker process{on}"
    if len(where) == 1:
        return (
            f"contained: the kernels run in a worker process{on}, replaced after a crash "
            f"(--no-isolate: in this process)"
        )
    return f"spread: {len(where)} worker processes{on}"


# -- the options ----------------------------------------------------------------------------


def parse_jobs(text: str) -> int | None:
    """--jobs: a positive number of workers, or None for auto."""
    if text.strip().lower() == "auto":
        return None
    try:
        jobs = int(text)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise OptionError(f"--jobs: must be a positive number of workers or auto, got {text!r}")
    return jobs


def parse_devices(text: str, available: int) -> tuple[int, ...]:
    """--devices: "all" or distinct comma-separated CUDA device indices, each one this machine has."""
    if text.strip().lower() == "all":
        if not available:
            raise EnvironmentMissing("--devices all: this machine has no CUDA device")
        return tuple(range(available))
    try:
        devices = tuple(int(part) for part in text.split(","))
    except ValueError:
        devices = ()
    if not devices or min(devices) < 0 or len(set(devices)) != len(devices):
        raise OptionError(f"--devices: must be all or distinct device indices such as 0,1, got {text!r}")
    missing = [d for d in devices if d >= available]
    if missing:
        raise EnvironmentMissing(
            f"--devices: no CUDA device {', '.join(map(str, missing))} here "
            f"({available} device{'s' if available != 1 else ''}: 0..{available - 1})"
            if available
            else f"--devices: no CUDA device {', '.join(map(str, missing))} here"
        )
    return devices


def local_workers(
    backend: str,
    jobs: str,
    devices: str | None,
    capsules: int,
    launch_timeout: float | None = None,
    emu_threads: int | None = None,
) -> tuple[Worker, ...]:
    """The worker processes of `--jobs jobs [--devices devices]` on `backend` for `capsules`
    capsules. auto: one per usable CPU core (emu, numpy) or one per GPU of `devices` (cuda, default
    all); N workers on cuda take the devices in turn. Never more workers than capsules. On emu,
    unless --emu-threads or CAPSULES_EMU_THREADS says otherwise, the workers share the cores: each
    emulator runs a launch's blocks on cores / workers OS threads. So does numpy's BLAS in each of
    several workers, unless the environment sets its threads: every OpenBLAS of N workers on every
    core spins for work between calls, on cores the other workers need."""
    count = parse_jobs(jobs)
    if backend != "cuda":
        if devices is not None:
            raise OptionError(f"--devices: pins cuda workers to GPUs; this run is on the {backend} backend")
        count = max(1, min(count or usable_cpus(), capsules))
        share = max(1, usable_cpus() // count)
        if backend == "emu" and emu_threads is None:
            from capsule_core.backends.emu import emu_threads_from_env

            if emu_threads_from_env() is None:
                emu_threads = share
        told = count == 1 or any(os.environ.get(name) for name in BLAS_THREADS_ENV)
        blas = None if told else share
        return tuple(Worker(backend, 0, launch_timeout, emu_threads, blas) for _ in range(count))
    from capsule_core.backends import cuda

    chosen = parse_devices(devices or "all", len(cuda.probe().devices))
    count = count or len(chosen)
    return tuple(Worker(backend, chosen[i % len(chosen)], launch_timeout) for i in range(max(1, min(count, capsules))))


def require_ray():
    """The ray module, or EnvironmentMissing naming the extra that brings it."""
    try:
        import ray
    except ImportError as exc:
        raise EnvironmentMissing("--ray needs Ray, which the ray extra installs: pip install 'capsules[ray]'") from exc
    return ray


# -- the engines ----------------------------------------------------------------------------


def verify(
    capsules, where: Sequence[Worker] | RayCluster, *, fresh: bool = False, **options
) -> Iterator[tuple[int, object]]:
    """(index in `capsules`, CapsuleReport) for each capsule as it finishes, the longest started
    first (COSTS_FILE); `options` are verify_capsule's. `fresh`: a new process for every capsule
    (verify --isolate)."""
    from capsule_core.verify.engine import Status

    work = partial(_verify_one, **options)
    failed = partial(_verify_failed, checks=options.get("checks"), sanitize=options.get("sanitize", ()))
    names = [c.name for c in capsules]
    recorded = read_costs()
    backend = where.backend if isinstance(where, RayCluster) else where[0].backend
    key = f"{backend} {sorted((k, v) for k, v in options.items() if k != 'seed')!r}"
    costs = recorded.get(key, {})
    items = [(i, names[i]) for i in longest_first(names, costs)]
    if isinstance(where, RayCluster):
        reports = _run_ray(where, work, items, failed, fresh)
    else:  # a capsule whose kernels failed may have written over the worker's state: a fresh one goes on
        reports = _run_local(where, work, items, failed, lambda r: fresh or r.status in (Status.ERROR, Status.FAILED))
    try:
        for index, report in reports:
            if report.seconds:  # 0: its worker died, no time to learn
                costs[report.capsule] = round(report.seconds, 3)
            yield index, report
    finally:
        reports.close()
        write_costs({**recorded, key: costs})


def fuzz(
    capsules,
    where: Sequence[Worker] | RayCluster,
    *,
    time_budget: float | None = None,
    max_examples: int | None = None,
    seed: int = 0,
    database: Path | None = None,
    fresh: bool = False,
) -> Iterator[tuple[int, object]]:
    """(index in `capsules`, CapsuleFuzz) for each capsule as it finishes. The time budget is
    shared as in fuzz.fuzz: a capsule starting now gets the time left divided by the rounds of
    capsules left, a round being one capsule on every worker (or on every CPU or GPU of the cluster).
    `fresh`: a new process for every capsule (else one after a failure, an error or a death)."""
    names = [c.name for c in capsules]
    if isinstance(where, RayCluster):
        snapshot = read_database(database) if database is not None else {}
        work = partial(_fuzz_on_node, max_examples=max_examples, seed=seed, snapshot=snapshot)

        def failed(task, reason):
            return _fuzz_failed(task, reason), {}

        for index, (one, added) in _run_ray(
            where, work, enumerate(_fuzz_tasks(names, time_budget, where)), failed, False
        ):
            if database is not None:
                merge_database(database, added)
            yield index, one
    else:
        work = partial(_fuzz_one, max_examples=max_examples, seed=seed, database=database)
        yield from _run_local(
            where,
            work,
            enumerate(_fuzz_tasks(names, time_budget, where)),
            _fuzz_failed,
            lambda one: fresh or one.poisoned or bool(one.error) or one.failure is not None,
        )


def replay(recorded, workers: Sequence[Worker]):
    """fuzz.replay of a saved failure in a worker process: a replayed wild store or hang costs the
    worker, not this process (a death is the replay's ERROR outcome)."""

    def failed(task, reason):
        from capsule_core.fuzz.engine import Outcome, ReplayResult

        return ReplayResult(recorded, workers[0].backend, Outcome(True, ("value", "ERROR", reason)))

    for _, result in _run_local(workers[:1], _replay_one, [(0, recorded)], failed, lambda result: True):
        return result


def _replay_one(backend, recorded):
    from capsule_core.fuzz.engine import replay

    return replay(recorded, backend)


COSTS_FILE = "verify-seconds.json"
"""Each capsule's last verify time per backend and options, in the cache folder: the workers start
the longest capsules first (CTest's cost data), so that a long one does not start last and finish
alone. Only a hint: without it the capsules start in request order; the report's order never changes."""


def longest_first(names: list[str], seconds: dict[str, float]) -> list[int]:
    """Indices into `names`: capsules never timed first, in request order, then the longest first."""
    return sorted(range(len(names)), key=lambda i: -seconds.get(names[i], math.inf))


def read_costs() -> dict:
    import json

    from capsule_core.kernels.nvcc import cache_dir

    try:
        costs = json.loads((cache_dir() / COSTS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return costs if isinstance(costs, dict) else {}


def write_costs(costs: dict) -> None:
    import json

    from capsule_core.kernels.nvcc import cache_dir
    from capsule_core.output_files import write_text_atomic

    try:
        cache_dir().mkdir(parents=True, exist_ok=True)
        write_text_atomic(cache_dir() / COSTS_FILE, json.dumps(costs, indent=1, sort_keys=True) + "\n")
    except OSError:
        pass  # a hint lost, nothing more


def _verify_one(backend, name: str, **options):
    from capsule_core.catalog.registry import lookup
    from capsule_core.verify.engine import verify_capsule

    return verify_capsule(lookup(name), backend, **options)


def _verify_failed(name: str, reason: str, *, checks, sanitize):
    """The report of a capsule whose worker ended without one: ERROR for every check asked for."""
    from capsule_core.verify.checks import CHECKS
    from capsule_core.verify.engine import CapsuleReport, Result, Status

    why = (
        f"{reason}, while it verified this capsule; the run went on with the next one. To debug: "
        f"capsules verify {name} --no-isolate (under gdb)"
    )
    wanted = [c for c in CHECKS if not checks or c in checks] + [f"sanitize.{tool}" for tool in sanitize]
    return CapsuleReport(name, tuple(Result(c, Status.ERROR, why) for c in wanted), 0.0)


def _fuzz_tasks(names: list[str], time_budget: float | None, where) -> Iterator[tuple[str, float]]:
    """(capsule name, seconds it may take), computed as each capsule starts (on Ray, once the
    cluster is connected: the runners draw tasks only then)."""
    slots = _ray_slots(where) if isinstance(where, RayCluster) else len(where)
    end = time.monotonic() + time_budget if time_budget is not None else math.inf
    for i, name in enumerate(names):
        rounds = math.ceil((len(names) - i) / slots)
        yield name, (max(end - time.monotonic(), 0.0) / rounds if math.isfinite(end) else math.inf)


def _fuzz_one(backend, task: tuple[str, float], *, max_examples, seed, database):
    from capsule_core.catalog.registry import lookup
    from capsule_core.fuzz.engine import fuzz_capsule

    name, seconds = task
    return fuzz_capsule(
        lookup(name),
        backend,
        max_examples=max_examples,
        deadline=time.monotonic() + seconds,
        seed=seed,
        database=database,
    )


def _fuzz_failed(task: tuple[str, float], reason: str):
    from capsule_core.catalog.registry import lookup
    from capsule_core.fuzz.engine import CapsuleFuzz

    name = task[0]
    return CapsuleFuzz(name, lookup(name).op.value, error=f"{reason} while it fuzzed this capsule")


def _fuzz_on_node(backend, task, *, max_examples, seed, snapshot: dict):
    """A fuzz task on a Ray node: a private copy of the driver's example database, and back the
    result with the entries the search added."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        merge_database(Path(folder), snapshot)
        one = _fuzz_one(backend, task, max_examples=max_examples, seed=seed, database=Path(folder))
        return one, {k: v for k, v in read_database(Path(folder)).items() if k not in snapshot}


def read_database(folder: Path) -> dict[str, bytes]:
    """A Hypothesis directory database as {relative path: contents} (empty when it does not exist)."""
    folder = Path(folder)
    if not folder.is_dir():
        return {}
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def merge_database(folder: Path, entries: dict[str, bytes]) -> None:
    """Add entries to a Hypothesis directory database. Its files are named by the hash of their
    contents, so a union is a merge: existing files are kept, new ones written atomically."""
    import tempfile

    folder = Path(folder)
    for relative, contents in entries.items():
        parts = Path(relative).parts
        if not parts or Path(relative).is_absolute() or ".." in parts:
            raise ValueError(f"not a path inside the example database: {relative!r}")
        target = folder.joinpath(*parts)
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=".merge-")
        with os.fdopen(handle, "wb") as f:
            f.write(contents)
        os.replace(temporary, target)


# -- local worker processes -----------------------------------------------------------------


def open_backend(worker: Worker):
    from capsule_core.backends.select import resolve

    return resolve(worker.backend, worker.device, launch_timeout=worker.launch_timeout, emu_threads=worker.emu_threads)[
        0
    ]


def _serve(connection, worker: Worker, work, breadcrumbs=None, libraries: tuple[str, ...] = ()) -> None:
    """A worker process: open the backend on the first task, then answer each task with
    (True, work(backend, task)) until None comes; an exception is answered (False, what) and ends it.
    `breadcrumbs`: shared memory where capsule_core.activity records what the worker does;
    `libraries`: the parent's --library declarations, loaded again here (discovery finds the rest)."""
    import signal

    from capsule_core.children import die_with_parent

    for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # the parent's: it keeps what finished, then kills us
        signal.signal(stop, signal.SIG_IGN)
    die_with_parent()
    if breadcrumbs is not None:
        from capsule_core import activity

        activity.record_into(breadcrumbs)
    backend = None
    while (task := connection.recv()) is not None:
        try:
            if backend is None:
                _load_libraries(libraries)
                backend = open_backend(worker)
            answer = (True, work(backend, task))
        except Exception as exc:
            connection.send((False, f"the worker process failed with {type(exc).__name__}: {exc}"))
            return
        connection.send(answer)


def _load_libraries(paths) -> None:
    from capsule_core.catalog import registry

    failed = registry.use_libraries(paths)
    if failed:
        raise CapsuleError("; ".join(f"{f.source}: {f.message}" for f in failed))


def _death(exitcode: int | None) -> str:
    import signal

    if exitcode is None:
        return "the worker process stopped answering"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"the worker process was killed by {name}" + (
            " (kill -9, or the OOM killer)" if name == "SIGKILL" else ""
        )
    return f"the worker process exited with code {exitcode}"


BREADCRUMB_BYTES = 4096


@contextmanager
def _environment(values: dict[str, str]):
    """os.environ with `values` set while the block runs (what a spawned child inherits)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class _Process:
    """A started worker process, the (index, task) it holds, if any, and the breadcrumbs it
    leaves (capsule_core.activity) for the report of its death."""

    def __init__(self, context, worker: Worker, work):
        from capsule_core.catalog.registry import library_paths

        self.worker = worker
        self.connection, child = context.Pipe()
        self.breadcrumbs = context.RawArray("c", BREADCRUMB_BYTES)
        self.process = context.Process(
            target=_serve,
            args=(child, worker, work, self.breadcrumbs, library_paths()),
            daemon=True,
            name=f"capsules-worker-{worker.backend}-{worker.device}",
        )
        settings = {name: value for name, value in WORKER_MALLOC_ENV.items() if name not in os.environ}
        if worker.blas_threads:
            settings.update({name: str(worker.blas_threads) for name in BLAS_THREADS_ENV})
        with _environment(settings):  # read as the child starts (its malloc, its numpy), before the task arrives
            self.process.start()
        child.close()
        self.held: tuple[int, object] | None = None
        self.hung: str | None = None

    def last_activity(self):
        from capsule_core import activity

        return activity.read(self.breadcrumbs)

    def check_hang(self, now: float) -> bool:
        """Kill the worker if its current launch has run twice the launch timeout (at least
        HANG_GRACE past it)."""
        from capsule_core.backends.emu import launch_timeout_from_env

        limit = self.worker.launch_timeout
        if limit is None:
            try:
                limit = launch_timeout_from_env()
            except CapsuleError:
                return False
        if not limit:
            return False
        last = self.last_activity()
        if last.started and now - last.started > limit + max(limit, HANG_GRACE):
            self.hung = f"the worker process hung in one launch for {now - last.started:.0f} s and was killed"
            self.process.kill()
            return True
        return False

    def give(self, item: tuple[int, object]) -> None:
        self.held = item
        try:
            self.connection.send(item[1])
        except OSError:
            pass  # it died already: its sentinel says so

    def outcome(self) -> tuple[bool, object]:
        """(True, result) of the held task, or (False, why the process ended without one)."""
        try:
            if self.connection.poll():
                return self.connection.recv()
        except (EOFError, OSError):
            pass
        self.process.join(10)
        doing = self.last_activity().describe()
        return False, (self.hung or _death(self.process.exitcode)) + (f" {doing}" if doing else "")

    def close(self) -> None:
        """An idle worker is asked to leave; a busy one (the caller stopped early) is killed: it
        ignores SIGTERM, which belongs to the parent."""
        if self.held is None and self.process.is_alive():
            try:
                self.connection.send(None)
            except OSError:
                pass
            self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.connection.close()


def _run_local(
    workers: Sequence[Worker], work, items: Iterable[tuple[int, object]], failed, retire
) -> Iterator[tuple[int, object]]:
    """work(backend, task) for each task on one process per worker; yields (index, result) as
    each finishes. A process that ends without a result gives failed(task, why); it, and one
    whose result `retire` judges unsafe to follow, is replaced. (index, task) items are taken only
    when a worker is free to start them."""
    import multiprocessing
    from multiprocessing.connection import wait

    context = multiprocessing.get_context("spawn")
    pending = iter(items)
    slots: list[_Process | None] = [None] * len(workers)
    exhausted = False
    try:
        while True:
            for i, worker in enumerate(workers):
                if exhausted or (slots[i] is not None and slots[i].held is not None):
                    continue
                item = next(pending, None)
                if item is None:
                    exhausted = True
                    break
                if slots[i] is None:
                    slots[i] = _Process(context, worker, work)
                slots[i].give(item)
            running = [p for p in slots if p is not None and p.held is not None]
            if not running:
                return
            ready = set(wait([p.connection for p in running] + [p.process.sentinel for p in running], timeout=5.0))
            if not ready:
                now = time.monotonic()
                for p in running:
                    p.check_hang(now)
                continue
            for i, p in enumerate(slots):
                if p is None or p.held is None or not ({p.connection, p.process.sentinel} & ready):
                    continue
                (index, task), (ok, value) = p.held, p.outcome()
                p.held = None
                result = value if ok else failed(task, value)
                if not ok or retire(result):
                    p.close()
                    slots[i] = None
                yield index, result
    finally:
        for p in slots:
            if p is not None:
                p.close()


# -- Ray ------------------------------------------------------------------------------------


_RAY_BACKENDS: dict = {}
"""The backend a Ray worker process opened, reused by the tasks it runs after (CPU workers are
reused; a GPU task gets its own process, Ray's default)."""


def _ray_task(backend: str, work, task, libraries: tuple[tuple[str, str, str], ...] = ()):
    """`libraries`: (shipped module, declaration inside it, the driver's path of it) of each
    --library: the library's folder travels as a py_module of the job and is loaded again from
    where it landed; reports name the driver's path."""
    if backend not in _RAY_BACKENDS:
        import importlib

        from capsule_core.catalog import registry

        landed = {
            str((Path(importlib.import_module(module).__path__[0]) / inside).resolve()): given
            for module, inside, given in libraries
        }
        _load_libraries(list(landed))
        for library in registry.libraries():
            if library.path is not None and str(library.path) in landed:
                library.path = Path(landed[str(library.path)])
        _RAY_BACKENDS[backend] = open_backend(Worker(backend))  # device 0 of the GPUs Ray gives the task
    return work(_RAY_BACKENDS[backend], task)


def _ray_slots(cluster: RayCluster) -> int:
    """Tasks the connected cluster runs at once: its GPUs on cuda, else its CPUs."""
    import ray

    return max(1, int(ray.cluster_resources().get("GPU" if cluster.backend == "cuda" else "CPU", 1)))


@contextmanager
def _package():
    """capsule_core as a wheel lays it out (the CUDA sources inside, as capsule_core/_cuda), and the
    folder of each --library as a module of its own, in a temporary folder: what Ray's py_modules
    ships to every worker, from a checkout or an install. Yields (the folders to ship, (module,
    declaration inside it, its path here) per library)."""
    import shutil
    import tempfile

    from capsule_core.catalog.registry import libraries
    from capsule_core.kernels.nvcc import cuda_source_dir

    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    with tempfile.TemporaryDirectory() as folder:
        target = Path(folder) / "capsule_core"
        shutil.copytree(Path(__file__).resolve().parent.parent, target, ignore=ignore)
        if not (target / "_cuda").is_dir():
            shutil.copytree(cuda_source_dir(), target / "_cuda", ignore=ignore)
        shipped, declared = [str(target)], []
        for library in libraries():
            if library.path is None or library.root is None:
                continue
            module = f"capsules_shipped_{library.name}"
            shutil.copytree(library.root, Path(folder) / module, ignore=ignore)
            shipped.append(str(Path(folder) / module))
            declared.append((module, str(library.path.relative_to(library.root)), str(library.path)))
        yield shipped, tuple(declared)


def _run_ray(
    cluster: RayCluster, work, items: Iterable[tuple[int, object]], failed, fresh: bool
) -> Iterator[tuple[int, object]]:
    """work(backend, task) as one Ray task per task, as many in flight as the cluster runs at
    once; yields (index, result) as each finishes, failed(task, why) for a task that raised or
    whose worker died."""
    import logging

    ray = require_ray()
    with _package() as (shipped, declared):
        local = {"include_dashboard": False} if cluster.address == "local" else {}
        try:
            ray.init(
                address=cluster.address,
                runtime_env={"py_modules": shipped},
                log_to_driver=False,
                logging_level=logging.ERROR,
                **local,
            )
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise EnvironmentMissing(f"--ray {cluster.address}: cannot reach a Ray cluster: {exc}") from exc
    resources = {"num_gpus": 1} if cluster.backend == "cuda" else {"num_cpus": 1}
    remote = ray.remote(_ray_task).options(max_retries=0, **resources, **({"max_calls": 1} if fresh else {}))
    slots = _ray_slots(cluster)
    pending = iter(items)
    running: dict = {}
    try:
        while True:
            while len(running) < slots and (item := next(pending, None)) is not None:
                running[remote.remote(cluster.backend, work, item[1], declared)] = item
            if not running:
                return
            done, _ = ray.wait(list(running), num_returns=1)
            for ref in done:
                index, task = running.pop(ref)
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    why = str(exc).strip().splitlines()
                    result = failed(task, f"the Ray task failed ({type(exc).__name__}: {why[0] if why else ''})")
                yield index, result
    finally:
        for ref in running:
            ray.cancel(ref, force=True)
        ray.shutdown()
