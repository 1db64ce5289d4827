"""verify and fuzz with --jobs and --ray: the report is the serial one, a dying worker costs its
capsule only, Ctrl-C keeps what finished, bad values are usage errors, Ray's example databases
come home."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mutants import MUTANTS
from typer.testing import CliRunner

from capsule_core.catalog import registry
from capsule_core.drivers import parallel
from capsule_core.errors import EnvironmentMissing
from cli.app import app

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()
SOME = ("relu", "exp", "softmax", "reduce_sum", "gather", "layer_norm")
"""A handful of capsules from five kernel families."""

HOOK = '''
import functools, os, signal, time
from pathlib import Path

import capsule_core.drivers.parallel as parallel

ACTION, TARGET, MARKS = os.environ["CAPSULES_TEST_HOOK"].split(":", 2)


def hooked(real):
    """The worker's task, except for TARGET: SIGKILL (as the OOM killer sends) or a long hang."""
    @functools.wraps(real)
    def work(backend, task, **options):
        name = task if isinstance(task, str) else task[0]
        if name == TARGET:
            Path(MARKS, "started").write_text(str(os.getpid()))
            if ACTION == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(600)
        result = real(backend, task, **options)
        Path(MARKS, "finished-" + name).touch()
        return result
    return work


parallel._verify_one = hooked(parallel._verify_one)
parallel._fuzz_one = hooked(parallel._fuzz_one)
'''
"""A sitecustomize for the CLI's processes in a test: the parent pickles the hooked function by
name and every spawned worker imports the same hook, so the test reaches into the workers
without any hook in the product."""


def without_timings(document: dict) -> dict:
    document = {k: v for k, v in document.items() if k != "seconds"}
    document["capsules"] = [{k: v for k, v in c.items() if k != "seconds"} for c in document["capsules"]]
    return document


def verify_json(tmp_path, *args) -> tuple[int, dict]:
    target = tmp_path / f"report-{len(list(tmp_path.glob('report-*')))}.json"
    result = runner.invoke(app, ["verify", *args, "--json", str(target)])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(target.read_text())


def hooked_cli(tmp_path, hook: str, *args, **popen) -> subprocess.Popen:
    """`python -m cli ARGS` with HOOK as its sitecustomize (hook: "kill:CAPSULE" or "hang:CAPSULE")."""
    hooks = tmp_path / "hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "sitecustomize.py").write_text(HOOK)
    marks = tmp_path / "marks"
    marks.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(hooks), str(ROOT)]),
        "CAPSULES_TEST_HOOK": f"{hook}:{marks}",
        "CAPSULES_PROGRESS": "0",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "cli", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


# -- the report is the serial one -------------------------------------------------------------


def test_verify_on_two_workers_gives_the_serial_report_on_emu(tmp_path):
    serial_code, serial = verify_json(tmp_path, *SOME, "--backend", "emu", "--quick")
    parallel_code, spread = verify_json(tmp_path, *SOME, "--backend", "emu", "--quick", "--jobs", "2")
    assert [c["name"] for c in serial["capsules"]] == [registry.lookup(n).name for n in SOME]
    assert without_timings(spread) == without_timings(serial)
    assert parallel_code == serial_code


def test_fuzz_on_two_workers_gives_the_serial_results(tmp_path):
    """Both runs as processes of the command: Hypothesis also draws constants from the local
    modules a process has loaded, and pytest's process holds every test module."""

    def rows(jobs: list[str]) -> list[list[str]]:  # the table without its seconds column
        env = {**os.environ, "CAPSULES_CACHE": str(tmp_path / f"cache{len(jobs)}")}  # empty example databases
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "cli",
                "fuzz",
                "relu",
                "softmax",
                "gather",
                "--backend",
                "numpy",
                "--examples",
                "15",
                "--seed",
                "3",
                *jobs,
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        return [
            line.split()[:-2] for line in done.stdout.splitlines() if line.startswith(("relu", "softmax", "gather"))
        ]

    serial = rows([])
    assert rows(["--jobs", "2"]) == serial and len(serial) == 3


# -- a worker that dies, Ctrl-C ---------------------------------------------------------------


def hooked_verify(tmp_path, hook: str, *capsules: str, **popen) -> tuple[subprocess.Popen, Path]:
    """hooked_cli running `verify CAPSULES --backend numpy --quick --jobs 2 --json REPORT`, and REPORT."""
    report = tmp_path / "report.json"
    args = ("--backend", "numpy", "--quick", "--jobs", "2", "--json", str(report))
    return hooked_cli(tmp_path, hook, "verify", *capsules, *args, **popen), report


def test_a_killed_worker_is_an_error_of_its_capsule_only(tmp_path):
    proc, report = hooked_verify(tmp_path, "kill:native_cuda.exp", "relu", "exp", "softmax", "gather")
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 1, stderr
    capsules = json.loads(report.read_text())["capsules"]
    assert [c["name"] for c in capsules] == [f"native_cuda.{n}" for n in ("relu", "exp", "softmax", "gather")]
    assert {c["name"]: c["status"] for c in capsules} == {
        "native_cuda.relu": "PASSED",
        "native_cuda.exp": "ERROR",
        "native_cuda.softmax": "PASSED",
        "native_cuda.gather": "PASSED",
    }
    killed = capsules[1]["checks"]
    assert len(killed) == 14 and all(c["status"] == "ERROR" and "killed by SIGKILL" in c["reason"] for c in killed)
    assert "Traceback" not in stderr


def test_a_killed_fuzz_worker_is_an_error_of_its_capsule_only(tmp_path):
    proc = hooked_cli(
        tmp_path,
        "kill:native_cuda.exp",
        "fuzz",
        "relu",
        "exp",
        "softmax",
        "--backend",
        "numpy",
        "--examples",
        "5",
        "--seed",
        "1",
        "--jobs",
        "2",
        "--save",
        str(tmp_path / "failures"),
    )
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 1, stderr
    statuses = {
        line.split()[0]: line.split()[1] for line in stdout.splitlines() if line.startswith(("relu", "exp", "softmax"))
    }
    assert statuses == {"relu": "PASSED", "exp": "ERROR", "softmax": "PASSED"}
    assert "killed by SIGKILL" in stdout


def _interruptible() -> None:
    """SIGINT at its default in the CLI's process, as in a terminal. A test run started in the
    background of a shell (`pytest &`, nohup) inherits SIGINT ignored, and so would the CLI: Python
    then installs no KeyboardInterrupt handler, and the Ctrl-C below would go unseen."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_writes_the_partial_report_and_ends_the_workers(tmp_path):
    proc, report = hooked_verify(
        tmp_path, "hang:native_cuda.exp", "relu", "exp", start_new_session=True, preexec_fn=_interruptible
    )
    marks = tmp_path / "marks"
    deadline = time.monotonic() + 240
    while not ((marks / "started").exists() and (marks / "finished-native_cuda.relu").exists()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    time.sleep(5)  # relu's report on its way to the parent
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal does: the whole process group
    try:
        stdout, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # leave no hung CLI behind, and say how its signals stood
        status = Path(f"/proc/{proc.pid}/status")
        state = (
            [
                line
                for line in status.read_text().splitlines()
                if line.startswith(("State", "SigBlk", "SigIgn", "SigCgt"))
            ]
            if status.exists()
            else []
        )
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"the CLI was still running 60 s after Ctrl-C ({'; '.join(state)})")
    assert proc.returncode == 130, stderr
    document = json.loads(report.read_text())
    assert document["interrupted"] is True and document["exit_code"] == 130
    assert [(c["name"], c["status"]) for c in document["capsules"]] == [("native_cuda.relu", "PASSED")]
    hung = int((marks / "started").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(hung, 0)


# -- the options --------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["verify", "relu", "--quick"], ["fuzz", "relu", "--examples", "1"]])
@pytest.mark.parametrize(
    "args, message",
    [
        (["--jobs", "0"], "--jobs: must be a positive number of workers or auto, got '0'"),
        (["--jobs", "-1"], "--jobs: must be a positive number of workers or auto, got '-1'"),
        (["--jobs", "many"], "--jobs: must be a positive number of workers or auto, got 'many'"),
        (["--devices", "0"], "--devices: pins the workers of --jobs to GPUs; give --jobs too"),
        (["--jobs", "2", "--devices", "0"], "--devices: pins cuda workers to GPUs; this run is on the numpy backend"),
        (["--jobs", "2", "--ray", "local"], "--ray: runs each capsule as a Ray task; give --ray or --jobs, not both"),
    ],
)
def test_bad_spread_options_exit_2_naming_the_option(command, args, message):
    result = runner.invoke(app, [*command, "--backend", "numpy", *args])
    assert result.exit_code == 2 and message in result.stderr, result.output


def test_ray_without_ray_installed_exits_3_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    result = runner.invoke(app, ["verify", "relu", "--backend", "numpy", "--ray", "local"])
    assert result.exit_code == 3
    assert result.stderr.splitlines()[-1] == (
        "capsules: error: --ray needs Ray, which the ray extra installs: pip install 'capsules[ray]'"
    )


def _without_thread_settings(monkeypatch):
    for name in ("CAPSULES_EMU_THREADS", *parallel.BLAS_THREADS_ENV):
        monkeypatch.delenv(name, raising=False)


def test_jobs_auto_is_one_worker_per_core_and_never_more_than_capsules(monkeypatch):
    monkeypatch.setattr(parallel, "usable_cpus", lambda: 8)
    _without_thread_settings(monkeypatch)
    assert (
        parallel.local_workers("emu", "auto", None, 46) == (parallel.Worker("emu", emu_threads=1, blas_threads=1),) * 8
    )
    assert parallel.local_workers("numpy", "auto", None, 3) == (parallel.Worker("numpy", blas_threads=2),) * 3
    assert len(parallel.local_workers("emu", "16", None, 46)) == 16


def test_several_workers_share_the_cores_with_their_blas_unless_the_environment_sets_it(monkeypatch):
    monkeypatch.setattr(parallel, "usable_cpus", lambda: 8)
    _without_thread_settings(monkeypatch)
    assert {w.blas_threads for w in parallel.local_workers("emu", "4", None, 46)} == {2}
    assert parallel.local_workers("emu", "1", None, 46)[0].blas_threads is None
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert {w.blas_threads for w in parallel.local_workers("emu", "4", None, 46)} == {None}


def test_a_worker_process_starts_with_its_blas_threads_and_the_parent_keeps_its_own(tmp_path, monkeypatch):
    (tmp_path / "blas_probe.py").write_text(
        "import os\n\n\ndef threads(backend, task):\n    return [os.environ.get(name) for name in task]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    _without_thread_settings(monkeypatch)
    import blas_probe

    names = parallel.BLAS_THREADS_ENV
    workers = (parallel.Worker("numpy", blas_threads=1), parallel.Worker("numpy"))
    done = dict(parallel._run_local(workers, blas_probe.threads, [(0, names), (1, names)], None, lambda r: False))
    assert done == {0: ["1"] * len(names), 1: [None] * len(names)}
    assert not any(os.environ.get(name) for name in names)


def test_a_worker_process_keeps_freed_memory_in_its_heap_unless_the_environment_says(tmp_path, monkeypatch):
    (tmp_path / "malloc_probe.py").write_text(
        "import os\n\n\ndef settings(backend, task):\n    return [os.environ.get(name) for name in task]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import malloc_probe

    names = list(parallel.WORKER_MALLOC_ENV)
    for name in names:
        monkeypatch.delenv(name, raising=False)
    workers = (parallel.Worker("numpy"),)
    done = dict(parallel._run_local(workers, malloc_probe.settings, [(0, names)], None, lambda r: False))
    assert done == {0: [parallel.WORKER_MALLOC_ENV[name] for name in names]}
    assert not any(os.environ.get(name) for name in names)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")
    done = dict(parallel._run_local(workers, malloc_probe.settings, [(0, names)], None, lambda r: False))
    assert done[0][names.index("MALLOC_TRIM_THRESHOLD_")] == "0"


def test_emulator_workers_share_the_cores_unless_told(monkeypatch):
    """N emu workers run a launch's blocks on cores / N threads each; --emu-threads or
    CAPSULES_EMU_THREADS decides instead when given."""
    monkeypatch.setattr(parallel, "usable_cpus", lambda: 8)
    monkeypatch.delenv("CAPSULES_EMU_THREADS", raising=False)
    assert {w.emu_threads for w in parallel.local_workers("emu", "3", None, 46)} == {2}
    assert {w.emu_threads for w in parallel.local_workers("emu", "2", None, 46, emu_threads=7)} == {7}
    monkeypatch.setenv("CAPSULES_EMU_THREADS", "5")
    assert {w.emu_threads for w in parallel.local_workers("emu", "2", None, 46)} == {None}


def test_cuda_workers_are_pinned_to_the_devices_in_turn(monkeypatch):
    from capsule_core.backends import cuda

    gpus = tuple(cuda.GpuInfo(i, "GPU", "9.0", 80.0) for i in range(2))
    monkeypatch.setattr(cuda, "probe", lambda: cuda.CudaProbe("2024.1", "13.0", gpus, None))
    assert [w.device for w in parallel.local_workers("cuda", "auto", None, 46)] == [0, 1]
    assert [w.device for w in parallel.local_workers("cuda", "auto", "1", 46)] == [1]
    assert [w.device for w in parallel.local_workers("cuda", "3", "all", 46)] == [0, 1, 0]
    with pytest.raises(parallel.OptionError, match="--devices: must be all or distinct device indices"):
        parallel.local_workers("cuda", "auto", "0,0", 46)
    with pytest.raises(EnvironmentMissing, match="--devices: no CUDA device 2 here"):
        parallel.local_workers("cuda", "auto", "0,2", 46)


def test_the_workers_start_the_longest_capsules_first_and_learn_their_times(monkeypatch, tmp_path):
    assert parallel.longest_first(["a", "b", "c", "d"], {"a": 1.0, "b": 5.0, "c": 3.0}) == [3, 1, 2, 0]
    monkeypatch.setenv("CAPSULES_CACHE", str(tmp_path))
    capsules = [registry.lookup(n) for n in ("relu", "softmax", "gather")]
    done = dict(parallel.verify(capsules, (parallel.Worker("numpy"),) * 2, quick=True, seed=0))
    ((key, seconds),) = parallel.read_costs().items()
    assert key.startswith("numpy ") and "('quick', True)" in key
    assert seconds == {done[i].capsule: round(done[i].seconds, 3) for i in range(3)}


def test_the_fuzz_time_budget_is_shared_in_rounds_of_one_capsule_per_worker(monkeypatch):
    monkeypatch.setattr(parallel.time, "monotonic", lambda: 1000.0)  # no time passes
    names = [f"native_cuda.{n}" for n in ("relu", "exp", "softmax", "gather", "add")]
    tasks = list(parallel._fuzz_tasks(names, 60.0, (parallel.Worker("numpy"),) * 2))
    assert tasks == [(n, s) for n, s in zip(names, (20.0, 30.0, 30.0, 60.0, 60.0))]
    assert list(parallel._fuzz_tasks(names[:1], None, (parallel.Worker("numpy"),))) == [(names[0], math.inf)]


# -- example databases ----------------------------------------------------------------------------


def test_a_failure_found_on_a_node_replays_here_from_the_merged_database(tmp_path):
    """What a Ray fuzz task does on its node (a private database, back with what it added), then
    the merge here: the local search starts from the node's failure."""
    from capsule_core.fuzz.engine import fuzz_capsule

    mutant = next(m for m in MUTANTS if m.id == "sub-vjp-sign")
    found, added = parallel._fuzz_on_node(
        mutant.backend(), ("native_cuda.sub", math.inf), max_examples=200, seed=0, snapshot={}
    )
    assert found.failure is not None and found.examples + found.refused > 1 and added
    local = tmp_path / "hypothesis"
    parallel.merge_database(local, added)
    assert parallel.read_database(local) == added
    here = fuzz_capsule(registry.lookup("sub"), mutant.backend(), max_examples=200, seed=0, database=local)
    assert here.failure is not None and here.failure.check == found.failure.check
    assert here.examples + here.refused == 1  # the first example, the node's, fails
    with pytest.raises(ValueError, match="not a path inside the example database"):
        parallel.merge_database(local, {"../outside": b""})


# -- Ray ----------------------------------------------------------------------------------------


def test_verify_on_a_local_ray_cluster_gives_the_serial_report(tmp_path):
    pytest.importorskip("ray", reason="ray is not installed (pip install 'capsules[ray]')")
    serial_code, serial = verify_json(tmp_path, *SOME, "--backend", "emu", "--quick")
    ray_code, on_ray = verify_json(tmp_path, *SOME, "--backend", "emu", "--quick", "--ray", "local")
    assert without_timings(on_ray) == without_timings(serial) and ray_code == serial_code
