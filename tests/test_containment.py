"""Nothing a kernel does takes the verifier down: planted defects in a copy of the pointwise
family (CAPSULES_CUDA_DIR; the repository's cuda/ is never touched) end as FAILED or ERROR checks
of their own capsule, named (kernel, case, address, buffer), with a complete table, JSON and JUnit,
and the other capsules of the run unaffected; SIGTERM and SIGHUP keep the partial report."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from xml.etree import ElementTree

import pytest

from capsule_core.kernels.nvcc import cuda_source_dir

ROOT = Path(__file__).resolve().parent.parent

PLANTED = """
// Planted defects for tests/test_containment.py, chosen at run time by $CAPSULES_PLANT: the
// emulator runs device code on the host, so the kernel can read the environment (nvcc sees none).
namespace {
#if !defined(__CUDACC__)
const float* planted_previous_x = nullptr;

void planted_defect(const float* x, float* y, int64_t n) {
    const char* chosen = std::getenv("CAPSULES_PLANT");
    const std::string mode = chosen ? chosen : "";
    const int64_t i = capsule::thread_index();
    if (mode == "one-past" && i == 0) y[n] = 1.0f;
    if (mode == "64k-past" && i == 0) y[n + 16384] = 1.0f;
    if (mode == "stride" && i < n) y[(i + 1) * 1048576] = 1.0f;
    if (mode == "far-load" && i == 0) y[0] = *(volatile const float*)(x + n + (int64_t(1) << 27));
    if (mode == "null" && i == 0) *(volatile float*)(nullptr) = 1.0f;
    if (mode == "after-free" && i == 0) {
        if (planted_previous_x) y[0] = *(volatile const float*)planted_previous_x;
        planted_previous_x = x;
    }
    if (mode == "hang") {
        volatile int spinning = 1;
        while (spinning) {}
    }
    if (mode == "abort" && i == 0) std::abort();
    if (mode == "hang-masked") {  // the watchdog's signal blocked: only the parent can end it
        sigset_t watchdog;
        sigemptyset(&watchdog);
        sigaddset(&watchdog, SIGVTALRM);
        pthread_sigmask(SIG_BLOCK, &watchdog, nullptr);
        volatile int spinning = 1;
        while (spinning) {}
    }
    if (mode == "kill" && i == 0) std::raise(SIGKILL);
}
#else
__device__ void planted_defect(const float*, float*, int64_t) {}
#endif
}  // namespace

extern "C" __global__ void capsule_relu_fwd(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    map_1_1(x, y, n, [](float v) { return capsule_relu_f(v); });
    planted_defect(x, y, n);
}"""

RELU_FWD = """
extern "C" __global__ void capsule_relu_fwd(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    map_1_1(x, y, n, [](float v) { return capsule_relu_f(v); });
}"""


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    """A copy of the kernel sources whose capsule_relu_fwd carries the planted defects, its
    emulator build made once."""
    folder = tmp_path_factory.mktemp("planted-cuda")
    for source in cuda_source_dir().iterdir():
        if source.is_file():
            shutil.copy(source, folder / source.name)
    text = (folder / "pointwise.cu").read_text()
    assert RELU_FWD in text, "capsule_relu_fwd changed: update RELU_FWD"
    text = text.replace(RELU_FWD, PLANTED).replace(
        "#include <cstdint>\n", "#include <csignal>\n#include <cstdint>\n#include <cstdlib>\n#include <string>\n", 1
    )
    (folder / "pointwise.cu").write_text(text)
    warm = capsules(folder, "", "verify", "relu", "--backend", "emu", "--quick", "--check", "value")
    assert warm.returncode == 0, warm.stdout + warm.stderr
    return folder


def environment(folder: Path, plant: str, **extra) -> dict:
    return {
        **os.environ,
        "CAPSULES_CUDA_DIR": str(folder),
        "CAPSULES_PLANT": plant,
        "CAPSULES_PROGRESS": "0",
        "PYTHONPATH": str(ROOT),
        **extra,
    }


def capsules(folder: Path, plant: str, *args) -> subprocess.CompletedProcess:
    """The CLI as a whole process, as a CI job runs it."""
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        cwd=ROOT,
        env=environment(folder, plant),
        capture_output=True,
        text=True,
        timeout=600,
    )


def verify_planted(folder: Path, tmp_path: Path, plant: str, *extra):
    json_file, junit_file = tmp_path / "r.json", tmp_path / "r.xml"
    proc = capsules(
        folder,
        plant,
        "verify",
        "relu",
        "abs",
        "--backend",
        "emu",
        "--quick",
        "--check",
        "value",
        "--check",
        "bounds",
        "--json",
        str(json_file),
        "--junit",
        str(junit_file),
        *extra,
    )
    document = json.loads(json_file.read_text())
    suites = ElementTree.parse(junit_file).getroot().findall("testsuite")
    return proc, document, suites


@pytest.mark.parametrize(
    "plant, expected",
    [
        (
            "64k-past",
            ["SIGSEGV: write at address 0x", "65,536 bytes after the end of buffer `out` (28 bytes)", "pointwise.cu:"],
        ),
        ("stride", ["SIGSEGV: write at address 0x", "4,194,276 bytes after the end of buffer `out` (28 bytes)"]),
        ("far-load", ["SIGSEGV: read at address 0x", "536,870,912 bytes after the end of buffer `x` (28 bytes)"]),
        ("null", ["SIGSEGV: write at address (nil)", "outside the emulated device's memory"]),
        (
            "after-free",
            ["SIGSEGV: read at address 0x", "inside buffer `x` (28 bytes), which was freed (a use after free)"],
        ),
        ("abort", ["abort() called (SIGABRT)"]),
        ("hang", ["capsule_relu_fwd did not finish in 2 s (the launch timeout)", "threads 0-255 still running"]),
    ],
)
def test_a_kernel_fault_fails_its_own_capsule_with_a_complete_report(planted, tmp_path, plant, expected):
    proc, document, suites = verify_planted(planted, tmp_path, plant, "--launch-timeout", "2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    statuses = {c["name"]: {r["id"]: r["status"] for r in c["checks"]} for c in document["capsules"]}
    assert statuses == {
        "native_cuda.relu": {"value": "FAILED", "bounds": "FAILED"},
        "native_cuda.abs": {"value": "PASSED", "bounds": "PASSED"},
    }
    reason = document["capsules"][0]["checks"][0]["reason"]
    assert reason.startswith("forward small-0: x(7): KernelFault: capsule_relu_fwd") or plant == "after-free", reason
    assert "capsule_relu_fwd" in reason and "(launch 1/1 of the plan: capsule_relu_fwd grid" in reason
    for words in expected:
        assert words in reason, reason
    assert [s.get("name") for s in suites] == ["native_cuda.relu", "native_cuda.abs"]
    assert suites[0].get("failures") == "2" and suites[1].get("failures") == "0"
    assert "1/2 capsules passed on emu" in proc.stdout


def test_a_store_one_past_the_end_fails_bounds_by_its_guard_band(planted, tmp_path):
    proc, document, _ = verify_planted(planted, tmp_path, "one-past")
    assert proc.returncode == 1
    relu = {r["id"]: r for r in document["capsules"][0]["checks"]}
    assert relu["value"]["status"] == "PASSED" and relu["bounds"]["status"] == "FAILED"
    assert "guard elements overwritten" in relu["bounds"]["reason"]


def test_a_hang_fails_the_later_cases_without_launching_them(planted, tmp_path):
    proc, document, _ = verify_planted(planted, tmp_path, "hang", "--launch-timeout", "1")
    assert proc.returncode == 1
    assert document["capsules"][0]["seconds"] < 30, "each later case waited for the watchdog again"


def test_a_kernel_that_blocks_the_watchdog_is_killed_by_the_parent(planted, tmp_path):
    proc, document, _ = verify_planted(planted, tmp_path, "hang-masked", "--launch-timeout", "1")
    assert proc.returncode == 1
    relu, abs_ = document["capsules"]
    reason = relu["checks"][0]["reason"]
    assert relu["status"] == "ERROR" and abs_["status"] == "PASSED"
    assert reason.startswith("the worker process hung in one launch for ") and "and was killed" in reason, reason
    assert "in launch 1/1 of the plan: capsule_relu_fwd grid" in reason


def test_a_worker_killed_by_its_kernel_is_an_error_naming_the_launch(planted, tmp_path):
    proc, document, suites = verify_planted(planted, tmp_path, "kill")
    assert proc.returncode == 1
    relu, abs_ = document["capsules"]
    assert {r["status"] for r in relu["checks"]} == {"ERROR"} and abs_["status"] == "PASSED"
    reason = relu["checks"][0]["reason"]
    assert reason.startswith("the worker process was killed by SIGKILL"), reason
    assert "during case small-0 (forward)" in reason and "in launch 1/1 of the plan: capsule_relu_fwd grid" in reason
    assert suites[0].get("errors") == "2"


def test_no_isolate_runs_the_kernels_in_this_process(planted, tmp_path):
    proc, document, _ = verify_planted(planted, tmp_path, "64k-past", "--no-isolate")
    assert proc.returncode == 1 and "contained:" not in proc.stderr
    assert document["capsules"][0]["status"] == "FAILED"


def test_fuzz_shrinks_a_wild_store_and_replays_it(planted, tmp_path):
    proc = capsules(
        planted,
        "64k-past",
        "fuzz",
        "relu",
        "--backend",
        "emu",
        "--examples",
        "20",
        "--seed",
        "3",
        "--save",
        str(tmp_path / "failures"),
        "--json",
        str(tmp_path / "f.json"),
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    record = json.loads((tmp_path / "f.json").read_text())
    failure = record["capsules"][0]["failure"]
    assert failure["status"] == "FAILED" and "bytes after the end of buffer `out`" in failure["detail"]
    again = capsules(planted, "64k-past", "fuzz", "--replay", failure["replay"], "--backend", "emu")
    assert again.returncode == 1 and "the same failure, bit for bit" in again.stdout, again.stdout + again.stderr


def _processes_with(marker: str) -> list[int]:
    """The processes whose environment holds `marker` (this user's, from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.parametrize("stop, code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_stop_signal_writes_the_partial_report_and_leaves_no_worker(planted, tmp_path, stop, code):
    marker = f"CAPSULES_TEST_RUN={uuid.uuid4().hex}"
    name, value = marker.split("=")
    json_file, junit_file = tmp_path / "r.json", tmp_path / "r.xml"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli",
            "verify",
            "abs",
            "relu",
            "sub",
            "--backend",
            "emu",
            "--quick",
            "--check",
            "value",
            "--launch-timeout",
            "0",
            "--json",
            str(json_file),
            "--junit",
            str(junit_file),
        ],
        cwd=ROOT,
        env=environment(planted, "hang", **{name: value}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while len(_processes_with(marker)) < 2:  # the CLI and its worker
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    time.sleep(6)  # abs verified, relu's kernel spinning
    os.killpg(proc.pid, stop)  # as a CI runner's timeout or a closed terminal does: the whole group
    try:
        stdout, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"the CLI was still running 60 s after {stop.name}")
    assert proc.returncode == code, stderr
    document = json.loads(json_file.read_text())
    assert document["interrupted"] is True and document["stopped_by"] == stop.name
    assert document["exit_code"] == code
    done, not_run = [c["name"] for c in document["capsules"]], document["not_run"]
    assert "native_cuda.relu" in not_run and sorted(done + not_run) == sorted(
        ["native_cuda.abs", "native_cuda.relu", "native_cuda.sub"]
    ), document  # the workers start the longest first
    assert all(c["status"] == "PASSED" for c in document["capsules"])
    short = ", ".join(n.split(".")[1] for n in not_run)
    assert f"interrupted by {stop.name}: partial report; {len(not_run)} capsules not run: {short}" in stdout
    root = ElementTree.parse(junit_file).getroot()
    assert root.get("interrupted") == "true"
    assert [s.get("name") for s in root.findall("testsuite") if s.get("skipped") == "1"] == not_run
    time.sleep(1)
    assert _processes_with(marker) == [], "a worker outlived the CLI"


FAKE_DRIVER = '''
"""A fake pycuda.driver for tests/test_containment.py: memory that holds bytes, kernels that do
nothing, and one kernel ($FAKE_CUDA_POISON) whose launch fails with an illegal address and leaves
the context unusable, as a GPU's sticky error does. Every context and launch goes to $FAKE_CUDA_LOG."""
import bisect, os, types

class Error(Exception): pass
class LogicError(Error): pass
class LaunchError(Error): pass
class RuntimeError(Error): pass
class MemoryError(Error): pass

device_attribute = types.SimpleNamespace(MULTIPROCESSOR_COUNT="sms", L2_CACHE_SIZE="l2")
function_attribute = types.SimpleNamespace(MAX_DYNAMIC_SHARED_SIZE_BYTES="smem")
_sticky = []
_starts, _memory = [], {}

def _log(line):
    with open(os.environ["FAKE_CUDA_LOG"], "a") as f:
        f.write(f"{os.getpid()} {line}\\n")

def _check():
    if _sticky:
        raise LaunchError(_sticky[0])

def init(): pass
def get_driver_version(): return 13000

class Context:
    def synchronize(self): _check()
    def pop(self): pass

class Device:
    @staticmethod
    def count(): return 1
    def __init__(self, index): pass
    def compute_capability(self): return (9, 0)
    def name(self): return "Fake GPU"
    def total_memory(self): return 80 << 30
    def make_context(self):
        _log("context")
        return Context()

class _Allocation:
    def __init__(self, ptr): self.ptr = ptr
    def __int__(self): return self.ptr
    def free(self): _check()

def mem_alloc(nbytes):
    _check()
    ptr = (_starts[-1] + len(_memory[_starts[-1]]) + 4096) if _starts else 1 << 32
    _starts.append(ptr)
    _memory[ptr] = bytearray(nbytes)
    return _Allocation(ptr)

def _span(address, nbytes):
    base = _starts[bisect.bisect_right(_starts, address) - 1]
    return _memory[base], address - base

def memcpy_htod(address, data):
    _check()
    raw = bytes(memoryview(data).cast("B"))
    block, at = _span(int(address), len(raw))
    block[at:at + len(raw)] = raw

def memcpy_dtoh(data, address):
    _check()
    view = memoryview(data).cast("B")
    block, at = _span(int(address), len(view))
    view[:] = block[at:at + len(view)]

class _Function:
    def __init__(self, name): self.name = name
    def prepare(self, formats): pass
    def set_attribute(self, attribute, value): pass
    def prepared_call(self, grid, block, *args, shared_size=0):
        _check()
        _log(f"launch {self.name}")
        if self.name == os.environ["FAKE_CUDA_POISON"]:
            _sticky.append("cuLaunchKernel failed: an illegal memory access was encountered")
            raise LaunchError(_sticky[0])

class _Module:
    def get_function(self, name): return _Function(name)

def module_from_buffer(cubin): return _Module()
'''


def test_a_sticky_gpu_error_costs_its_capsule_and_the_next_gets_a_fresh_context(tmp_path):
    fake = tmp_path / "fake"
    (fake / "pycuda").mkdir(parents=True)
    (fake / "pycuda" / "__init__.py").write_text('VERSION_TEXT = "fake"\n')
    (fake / "pycuda" / "driver.py").write_text(FAKE_DRIVER)
    log, report = tmp_path / "driver.log", tmp_path / "r.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(fake), str(ROOT)]),
        "FAKE_CUDA_LOG": str(log),
        "FAKE_CUDA_POISON": "capsule_relu_fwd",
        "CAPSULES_PROGRESS": "0",
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli",
            "verify",
            "relu",
            "abs",
            "--backend",
            "cuda",
            "--quick",
            "--check",
            "value",
            "--json",
            str(report),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    relu, abs_ = json.loads(report.read_text())["capsules"]
    assert relu["checks"][0]["status"] == "ERROR"
    assert "an illegal memory access was encountered" in relu["checks"][0]["reason"]
    # abs ran its kernels (the fake computes nothing, so its values fail), never seeing the poisoned context
    assert abs_["checks"][0]["status"] == "FAILED" and "illegal memory access" not in abs_["checks"][0]["reason"]
    lines = [line.split(" ", 1) for line in log.read_text().splitlines()]
    relu_pid = next(pid for pid, what in lines if what == "launch capsule_relu_fwd")
    abs_pid = next(pid for pid, what in lines if what == "launch capsule_abs_fwd")
    assert relu_pid != abs_pid and ("context" in {what for pid, what in lines if pid == abs_pid})


def test_the_pytest_plugin_contains_a_kernel_that_kills_its_worker(planted, tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--capsules",
            "relu,abs",
            "--capsules-backend",
            "emu",
            "--capsules-quick",
            "-k",
            "value and not special",
            "-q",
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=environment(planted, "kill"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 failed, 1 passed" in proc.stdout, proc.stdout
    assert "ERROR native_cuda.relu value: the worker process was killed by SIGKILL" in proc.stdout
