"""`capsules verify --sanitize` on planted defects: each of compute-sanitizer's four tools, run on the
emulator, finds its own kind of bug and no other tool reports it as its finding; the real kernels
are clean. Runners are built for a small planted family (tests/sanitize/planted.cu) so the builds
stay quick; the SGEMM test patches a copy of cuda/linalg.cu."""

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from capsule_core.kernels.c_types import C_TYPES
from capsule_core.model import NativeSymbolRef
from capsule_core.sanitize import engine as sanitize

PLANTED = r"""
#include <cstdint>
// A read one past the end that changes no value.
extern "C" __global__ void capsule_planted_oob(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    const int64_t i = threadIdx.x;
    if (i < n) y[i] = x[i];
    if (i == n - 1) {
        volatile float past = x[n];
        (void)past;
    }
}
// Thread t reads what thread t - 1 wrote to shared memory, with no barrier between: the
// round-robin schedule gives the right values, a GPU need not.
extern "C" __global__ void capsule_planted_race(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    __shared__ float s[64];
    const int64_t i = threadIdx.x;
    s[i] = x[i];
    y[i] = s[i > 0 ? i - 1 : 0];
}
// A barrier inside a branch that part of the block takes.
extern "C" __global__ void capsule_planted_divergent(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    const int64_t i = threadIdx.x;
    if (i < n / 2) __syncthreads();
    y[i] = x[i];
}
// A read of shared memory before any thread wrote it; the value reaches the output.
extern "C" __global__ void capsule_planted_uninit(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    __shared__ float s[64];
    const int64_t i = threadIdx.x;
    const float early = s[i];
    __syncthreads();
    s[i] = x[i];
    __syncthreads();
    y[i] = s[i] + 0.0f * early;
}
// No defect: a kernel that never ends when n < 0 (a run past the sanitizer's limit).
extern "C" __global__ void capsule_planted_spin(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    volatile int64_t count = n;
    while (count < 0) {
    }
    if (threadIdx.x < n) y[threadIdx.x] = x[threadIdx.x];
}
"""
PARAMS = ("const float* __restrict__ x", "float* __restrict__ y", "int64_t n")
DEFECTS = {"oob": "memcheck", "race": "racecheck", "divergent": "synccheck", "uninit": "initcheck"}
N = 64

pytestmark = pytest.mark.skipif(
    sanitize.unavailable("synccheck") is not None, reason="no C++ compiler for the emulator"
)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("planted")
    (folder / "planted.cu").write_text(PLANTED)
    refs = tuple(NativeSymbolRef("cuda/planted.cu", f"capsule_planted_{d}", PARAMS) for d in DEFECTS)
    return folder, refs


def run_planted(tool, defect, folder, refs):
    """x -> y through the planted kernel under `tool`, through the device calls verify makes."""
    why = sanitize.unavailable(tool)
    if why:
        pytest.skip(why)
    backend = sanitize.backend_for(tool, folder, refs)
    x = np.arange(N, dtype=np.float32)
    xa, ya = backend.allocate(x.nbytes), backend.allocate(x.nbytes)
    if isinstance(backend, sanitize.SanitizedBackend):
        backend.names = {xa // backend._SPAN: "x", ya // backend._SPAN: "y"}
    backend.upload(xa, x)
    ref = next(r for r in refs if r.symbol == f"capsule_planted_{defect}")
    backend.launch(ref, (1, 1, 1), (N, 1, 1), 0, [np.uintp(xa), np.uintp(ya), C_TYPES["int64_t"].numpy(N)])
    backend.synchronize()
    y = np.empty(N, np.float32)
    backend.download(y, ya)
    return y


EXPECTED = {
    "memcheck": "heap-buffer-overflow: read of 4 bytes at buffer x (256 bytes) byte 256 in capsule_planted_oob block "
    "(0,0,0) thread (63,0,0) at planted.cu:",
    "racecheck": "data race on shared memory: read at planted.cu:18 by block (0,0,0) thread (1,0,0) and write at "
    "planted.cu:17 by block (0,0,0) thread (0,0,0); no barrier orders them",
    "synccheck": "capsule_planted_divergent block (0,0,0): __syncthreads at planted.cu:",
    "initcheck": "buffer y (256 bytes) byte 0 holds bytes read from shared memory that no one wrote",
}


@pytest.mark.parametrize("tool", sanitize.TOOLS)
@pytest.mark.parametrize("defect", list(DEFECTS))
def test_each_defect_is_found_by_exactly_its_tool(planted, tool, defect):
    folder, refs = planted
    if DEFECTS[defect] == tool:
        with pytest.raises(sanitize.SanitizerFinding) as found:
            run_planted(tool, defect, folder, refs)
        finding = found.value.finding
        assert finding.tool == tool and finding.text
        assert finding.summary.startswith(EXPECTED[tool]), finding.summary
    elif defect == "divergent":
        with pytest.raises(sanitize.KernelFault, match="reached by threads 0-31 of 64"):
            run_planted(tool, defect, folder, refs)  # the launch cannot complete: no finding of this tool
    else:
        y = run_planted(tool, defect, folder, refs)
        x = np.arange(N, dtype=np.float32)
        if defect == "oob":
            assert np.array_equal(y, x)
        elif defect == "race":
            assert np.array_equal(y, np.maximum(x - 1, 0))


def test_racecheck_finds_a_dropped_sgemm_stage_barrier():
    """The SGEMM without its k-tile barrier (tests/mutants/'s sgemm-dropped-stage-barrier, planted
    in a copy of cuda/): racecheck reports the shared-memory race between the copies of a k-tile
    and the multiply of the stage, at the emulator's cp.async wait (where the copies land) and the
    fragment loads. 40 x 40 x 40: three k-tiles, so the ring of stages turns over."""
    from mutants import KERNEL_MUTANTS, mutated_sources

    from capsule_core.backends.emu import family_refs

    why = sanitize.unavailable("racecheck")
    if why:
        pytest.skip(why)
    mutant = next(m for m in KERNEL_MUTANTS if m.id == "sgemm-dropped-stage-barrier")
    ref = next(r for r in family_refs("linalg") if r.symbol == "capsule_matmul_fwd")
    n = 40
    a = np.ones((n, n), np.float32)
    with mutated_sources(mutant) as folder:
        backend = sanitize.backend_for("racecheck", folder)
        xa, xb, y = (backend.allocate(a.nbytes) for _ in range(3))
        backend.upload(xa, a)
        backend.upload(xb, a)
        i64 = C_TYPES["int64_t"].numpy
        backend.launch(
            ref,
            (1, 1, 1),
            (128, 1, 1),
            0,
            [np.uintp(xa), np.uintp(xb), np.uintp(y), np.uintp(y), i64(1), i64(n), i64(n), i64(n), i64(1)],
        )
        with pytest.raises(sanitize.SanitizerFinding) as found:
            backend.synchronize()
    finding = found.value.finding
    assert finding.tool == "racecheck" and finding.summary.startswith("data race on shared memory"), finding.summary
    assert "linalg.cuh" in finding.summary, finding.summary


BLOCKS = r"""
#include <cstdint>
// Every block writes the same n elements (blockIdx forgotten): blocks race on global memory, each
// pair by the same thread index.
extern "C" __global__ void capsule_planted_blocks(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    const int64_t i = threadIdx.x;
    if (i < n) y[i] = x[i] + static_cast<float>(blockIdx.x);
}
"""


@pytest.mark.parametrize("blocks", [2, 5])
def test_racecheck_finds_blocks_writing_one_element(tmp_path, blocks):
    """Blocks run one after another on the emulator, but no block is ordered after another, as on
    a GPU: racecheck reports two blocks that write the same element, also where the TSan fibers are
    reused (blocks alternate between two sets of them, across launches too: the second launch's
    first block runs on the fibers of the first launch's second-last)."""
    why = sanitize.unavailable("racecheck")
    if why:
        pytest.skip(why)
    (tmp_path / "planted.cu").write_text(BLOCKS)
    ref = NativeSymbolRef("cuda/planted.cu", "capsule_planted_blocks", PARAMS)
    backend = sanitize.backend_for("racecheck", tmp_path, (ref,))
    x = np.arange(N, dtype=np.float32)
    xa, ya = backend.allocate(x.nbytes), backend.allocate(x.nbytes)
    backend.names = {xa // backend._SPAN: "x", ya // backend._SPAN: "y"}
    backend.upload(xa, x)
    args = [np.uintp(xa), np.uintp(ya), C_TYPES["int64_t"].numpy(N)]
    backend.launch(ref, (1, 1, 1), (N, 1, 1), 0, args)
    backend.launch(ref, (blocks, 1, 1), (N, 1, 1), 0, args)
    with pytest.raises(sanitize.SanitizerFinding) as found:
        backend.synchronize()
    finding = found.value.finding
    assert finding.summary == (
        "data race on buffer y (256 bytes) byte 4: write at planted.cu:7 by block (1,0,0) thread "
        "(1,0,0) and write at planted.cu:7 by block (0,0,0) thread (1,0,0); no barrier orders "
        "them"
    ), finding.summary


# -- on a GPU: NVIDIA's compute-sanitizer, mapped to the same check ids -----------------------------


def fake_compute_sanitizer(folder: Path, output: str, code: int) -> None:
    script = folder / "compute-sanitizer"
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\nexit {code}\n")
    script.chmod(0o755)


def test_a_uint64_scalar_is_recorded_as_a_value_not_a_buffer():
    """An RNG key is an np.uint64 like a device address; the declared parameter decides (a key
    read as a buffer id once made every random capsule's runner abort)."""
    backend = sanitize.SanitizedBackend("memcheck")
    out = backend.allocate(28)
    ref = NativeSymbolRef("cuda/random.cu", "capsule_planted_fill", ("float* y", "uint64_t key", "int64_t n"))
    key = C_TYPES["uint64_t"].numpy(8525894732446514792)
    backend.launch(ref, (1, 1, 1), (32, 1, 1), 0, [np.uintp(out), key, C_TYPES["int64_t"].numpy(7)])
    assert backend._launches[-1].endswith(f" 3 b{out // backend._SPAN}+0 8525894732446514792 7")


def test_compute_sanitizer_missing_is_a_skip_with_its_reason(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    outcome = sanitize.compute_sanitizer("memcheck", "relu", 0, True, None)
    assert outcome.status == "skipped" and "compute-sanitizer is not on PATH" in outcome.summary


def test_compute_sanitizer_errors_become_the_finding(monkeypatch, tmp_path):
    fake_compute_sanitizer(
        tmp_path,
        "========= COMPUTE-SANITIZER\n========= Invalid __global__ read of size 4 bytes\n"
        "=========     at capsule_relu_fwd+0x90 in pointwise.cu:19\n"
        "========= ERROR SUMMARY: 1 error",
        66,
    )
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")
    outcome = sanitize.compute_sanitizer("memcheck", "relu", 0, True, None)
    assert outcome.status == "finding"
    assert outcome.summary == "Invalid __global__ read of size 4 bytes (at capsule_relu_fwd+0x90 in pointwise.cu:19)"


def test_compute_sanitizer_that_refuses_the_device_is_a_skip(monkeypatch, tmp_path):
    fake_compute_sanitizer(tmp_path, "========= COMPUTE-SANITIZER\n========= Error: Device not supported", 1)
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")
    outcome = sanitize.compute_sanitizer("racecheck", "relu", 0, True, None)
    assert outcome.status == "skipped" and "Device not supported" in outcome.summary


def test_cli_sanitize_takes_an_optional_tool_list(monkeypatch):
    from cli.options import optional_option_values

    assert optional_option_values(["verify", "relu", "--sanitize"]) == ["verify", "relu", "--sanitize=all"]
    assert optional_option_values(["verify", "--sanitize", "relu"]) == ["verify", "--sanitize=all", "relu"]
    assert optional_option_values(["verify", "--sanitize", "--quick"]) == ["verify", "--sanitize=all", "--quick"]
    assert optional_option_values(["verify", "--sanitize", "racecheck"]) == ["verify", "--sanitize", "racecheck"]
    assert optional_option_values(["verify", "--sanitize", "memcheck,bogus"]) == [
        "verify",
        "--sanitize",
        "memcheck,bogus",
    ]
    from cli.app import app

    result = CliRunner().invoke(app, ["verify", "relu", "--sanitize", "memcheck,bogus"])
    assert result.exit_code == 2 and "--sanitize: unknown tool bogus" in result.stderr


def test_cli_sanitize_without_a_compiler_is_one_sentence_and_exit_3(monkeypatch, tmp_path):
    from cli.app import app

    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    result = CliRunner().invoke(app, ["verify", "relu", "--backend", "numpy", "--sanitize=memcheck"])
    assert result.exit_code == 3
    assert result.stderr.strip().splitlines()[-1] == (
        "capsules: error: --sanitize memcheck: the emu backend needs a C++ "
        "compiler (g++ or clang++ on PATH, or CXX); install g++"
    )


def test_a_run_past_the_limit_is_a_fault_naming_the_limit(planted, monkeypatch):
    """$CAPSULES_SANITIZE_TIMEOUT (what --sanitize-timeout sets) bounds each sanitized run."""
    monkeypatch.setenv(sanitize.TIMEOUT_ENV, "0.001")
    with pytest.raises(
        sanitize.KernelFault,
        match=r"the memcheck run of capsule_planted_oob did not finish in 0\.001 s "
        r"\(--sanitize-timeout\)",
    ):
        run_planted("memcheck", "oob", *planted)
    monkeypatch.setenv(sanitize.TIMEOUT_ENV, "soon")
    with pytest.raises(
        ValueError, match="CAPSULES_SANITIZE_TIMEOUT='soon': the sanitizer run limit must be a positive"
    ):
        sanitize.run_limit()
    monkeypatch.delenv(sanitize.TIMEOUT_ENV)
    assert sanitize.run_limit() == sanitize.TIMEOUT_S


def test_a_batch_past_the_limit_names_the_case_it_struck_in(planted, monkeypatch):
    """In a batch (every case in one sanitizer process) the limit names the case the runner had
    reached and that case's first kernel, not the batch's first: the rerun line needs it."""
    folder, refs = planted
    refs = (*refs, NativeSymbolRef("cuda/planted.cu", "capsule_planted_spin", PARAMS))
    backend = sanitize.backend_for("memcheck", folder, refs, batch=True)
    x = np.arange(N, dtype=np.float32)
    for case, symbol, n in (("clean", "capsule_planted_race", N), ("stuck", "capsule_planted_spin", -1)):
        backend.begin_case(case)
        xa, ya = backend.allocate(x.nbytes), backend.allocate(x.nbytes)
        backend.upload(xa, x)
        ref = next(r for r in refs if r.symbol == symbol)
        backend.launch(ref, (1, 1, 1), (N, 1, 1), 0, [np.uintp(xa), np.uintp(ya), C_TYPES["int64_t"].numpy(n)])
        backend.synchronize()
    monkeypatch.setenv(sanitize.TIMEOUT_ENV, "3")
    with pytest.raises(sanitize.SanitizerTimeout) as timeout:
        backend.flush()
    assert timeout.value.case == "stuck"
    assert str(timeout.value) == (
        "case stuck: the memcheck run of capsule_planted_spin did not finish in 3 s (--sanitize-timeout)"
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--sanitize-timeout", "30"], "--sanitize-timeout: applies to sanitizer runs; add --sanitize"),
        (
            ["--sanitize=memcheck", "--sanitize-timeout", "0"],
            "--sanitize-timeout: must be a positive number of seconds, got 0",
        ),
        (
            ["--sanitize=memcheck", "--sanitize-timeout", "inf"],
            "--sanitize-timeout: must be a positive number of seconds, got inf",
        ),
    ],
)
def test_cli_sanitize_timeout_is_checked(monkeypatch, argv, message):
    from cli.app import app

    monkeypatch.delenv(sanitize.TIMEOUT_ENV, raising=False)
    result = CliRunner().invoke(app, ["verify", "relu", "--backend", "numpy", *argv])
    assert result.exit_code == 2 and result.stderr.strip().splitlines()[-1] == f"capsules: error: {message}"


def test_cli_sanitize_timeout_reaches_the_runs(monkeypatch):
    """The limit goes through the environment, so --jobs and --isolate workers inherit it."""
    from cli.app import app

    monkeypatch.setenv(sanitize.TIMEOUT_ENV, "600")
    result = CliRunner().invoke(
        app,
        [
            "verify",
            "rand_uniform",
            "--backend",
            "emu",
            "--quick",
            "--sanitize=synccheck",
            "--sanitize-timeout",
            "1800",
            "--check",
            "sanitize.synccheck",
        ],
    )
    assert result.exit_code == 0, result.output
    assert sanitize.run_limit() == 1800.0


def test_verify_names_the_case_a_batch_ran_out_of_time_in(monkeypatch, tmp_path):
    """The check's error carries the case the limit struck in and a rerun line for it alone (the
    runner's process stubbed: it announced two cases, then the limit struck)."""
    import json
    import subprocess
    from types import SimpleNamespace

    from capsule_core.ops import get_spec
    from capsule_core.verify.engine import run_samples
    from cli.app import app

    first, second = (s.case for s in run_samples(get_spec("relu"), True, 0)[:2])

    def out_of_time(command, **kwargs):
        announced = f"capsule-emu: case {first}\ncapsule-emu: case {second}\n".encode()
        raise subprocess.TimeoutExpired(command, kwargs["timeout"], stderr=announced)

    monkeypatch.setattr(
        sanitize, "subprocess", SimpleNamespace(run=out_of_time, TimeoutExpired=subprocess.TimeoutExpired)
    )
    monkeypatch.setenv(sanitize.TIMEOUT_ENV, "600")  # so that the limit the CLI sets is undone after
    report = tmp_path / "report.json"
    result = CliRunner().invoke(
        app,
        ["verify", "relu", "--backend", "emu", "--quick", "--sanitize=memcheck", "--check", "sanitize.memcheck"]
        + ["--no-isolate", "--sanitize-timeout", "60", "--json", str(report)],
    )
    assert result.exit_code == 1, result.output
    (check,) = json.loads(report.read_text())["capsules"][0]["checks"]
    assert check["status"] == "ERROR" and check["case"] == second
    assert check["reason"] == (
        f"SanitizerTimeout: case {second}: the memcheck run of capsule_relu_fwd did not finish in 60 s "
        "(--sanitize-timeout)"
    )
    assert check["repro"].endswith(f"--check sanitize.memcheck --seed 0 --case {second}")


def test_the_process_compute_sanitizer_watches_runs_without_the_cli():
    """drivers.sanitized_verify is what compute-sanitizer starts (the engine never launches the
    CLI); without a GPU it says so and exits 3, an unknown op exits 2."""
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-m", "capsule_core.drivers.sanitized_verify", "relu", "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode in (0, 3), run.stderr
    if run.returncode == 3:
        assert "--backend cuda needs a GPU" in run.stderr
    else:
        assert "PASSED native_cuda.relu value" in run.stdout
    unknown = subprocess.run(
        [sys.executable, "-m", "capsule_core.drivers.sanitized_verify", "relux"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert unknown.returncode == 2 and "relux" in unknown.stderr
