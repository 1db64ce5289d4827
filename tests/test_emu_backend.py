"""The emu backend as a user meets it: `--backend emu` runs the kernels themselves (cuda/*.cu
unchanged) on the CPU, `auto` picks it where there is no GPU, a missing compiler is a one-line exit
3, bench refuses it, and builds come from the content-hash cache."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from capsule_core.backends import emu
from capsule_core.backends.execution import GuardedOutput
from capsule_core.backends.select import resolve
from capsule_core.errors import EnvironmentMissing
from capsule_core.kernels import nvcc as kernels
from capsule_core.ops import get_spec
from cli.app import app

runner = CliRunner()

pytestmark = pytest.mark.skipif(
    emu.shutil.which("g++") is None and emu.shutil.which("clang++") is None,
    reason="no C++ compiler (g++ or clang++) for the emulator",
)


@pytest.fixture
def no_compiler(monkeypatch, tmp_path):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))


def test_verify_on_emu_runs_the_kernels_and_names_the_backend(tmp_path):
    report = tmp_path / "v.json"
    result = runner.invoke(app, ["verify", "relu", "softmax", "--backend", "emu", "--quick", "--json", str(report)])
    assert result.exit_code == 0, result.stdout
    assert result.stderr.startswith("backend emu: CPU emulator of the CUDA kernels")
    doc = json.loads(report.read_text())
    assert doc["backend"] == "emu" and doc["exit_code"] == 0
    statuses = {c["id"]: c["status"] for c in doc["capsules"][1]["checks"]}
    assert statuses["value"] == statuses["vjp"] == statuses["bounds"] == statuses["reduction.order"] == "PASSED"


def test_the_emulator_launches_every_planned_kernel():
    """softmax's forward is one launch of capsule_softmax_fwd; the backend counts what it launched."""
    backend, _ = resolve("emu")
    spec = get_spec("softmax")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = GuardedOutput((3, 4))
    run = backend.forward(spec, {"x": x}, {}, out)
    assert run.launches == 1 and out.unwritten() == 0 and out.guard_damage() == 0
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out.view, e / e.sum(axis=1, keepdims=True), rtol=1e-6)


def test_no_compiler_is_one_sentence_and_exit_3(no_compiler):
    result = runner.invoke(app, ["verify", "relu", "--backend", "emu"])
    assert result.exit_code == 3
    assert result.stderr.strip() == (
        "capsules: error: the emu backend needs a C++ compiler (g++ or clang++ on PATH, or CXX); install g++"
    )


def test_a_cxx_that_is_not_there_is_named(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    with pytest.raises(EnvironmentMissing, match=r"CXX=/nonexistent/g\+\+: no such compiler"):
        resolve("emu")


def test_auto_falls_back_to_numpy_without_gpu_or_compiler(no_compiler, machine_without_gpu):
    backend, note = resolve("auto")
    assert backend.name == "numpy"
    assert note.startswith("backend auto -> numpy: no GPU here") and "no emulator" in note


def test_bench_refuses_the_emulator_in_one_sentence():
    result = runner.invoke(app, ["bench", "relu", "--backend", "emu"])
    assert result.exit_code == 3
    assert "its time says nothing about the kernel's" in result.stderr and result.stderr.count("\n") == 1


def test_builds_are_cached_by_content(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPSULES_CACHE", str(tmp_path))
    unoptimised = tuple("-O0" if f == "-O3" else f for f in emu.HOST_FLAGS)  # the cache, not the code, is tested
    first = emu.build_family("random", flags=unoptimised)
    again = emu.build_family("random", flags=unoptimised)
    assert not first.cached and again.cached and again.path == first.path
    other = emu.build_family("random", flags=unoptimised + ("-DCAPSULE_TEST_FLAG=1",))
    assert not other.cached and other.path != first.path
    assert [p.name for p in (tmp_path / "emu").iterdir() if p.name.startswith(".build-")] == []
    first.path.write_bytes(first.path.read_bytes()[:4096])  # a torn library: the one build cache rebuilds it
    rebuilt = emu.build_family("random", flags=unoptimised)
    assert not rebuilt.cached and rebuilt.path == first.path and rebuilt.path.stat().st_size > 4096


def test_every_family_builds_with_the_device_code_path():
    """__CUDA_ARCH__ is defined: common.cuh's device branches (the _rn intrinsics, __ldg, float4
    access) are what the emulator compiles. The builds go side by side through the shared build
    pool, as verify's do."""
    from capsule_core.catalog import registry

    assert len(emu.emulated_families()) == 11
    assert kernels.build_in_parallel(emu.emulator_builds(registry.kernel_capsules())) == {}
    for family in emu.emulated_families():
        built = emu.build_family(family)
        assert built.cached and built.path.is_file()


def test_a_run_on_emu_makes_its_builds_side_by_side_first(monkeypatch):
    """verify builds everything it will load before the first capsule runs (one compiler per
    core): the emulator builds on emu, nvcc's compiles when a static check is asked, and says how
    long that took."""
    from capsule_core.catalog.registry import lookup_many
    from capsule_core.verify.engine import run_builds

    capsules = lookup_many(["relu", "sigmoid", "softmax"])
    assert sorted(name.split("/")[-1] for name in emu.emulator_builds(capsules)) == ["pointwise.cu", "softmax.cu"]
    assert len(run_builds(capsules, "emu", quick=True, checks=("value",))) == 2
    assert len(run_builds(capsules, "numpy", quick=True, checks=("value",))) == 0
    made, build_unit = [], emu.build_unit

    def watched(source, *args, **kwargs):
        built = build_unit(source, *args, **kwargs)
        made.append((source.name, built.cached))
        return built

    monkeypatch.setattr(emu, "build_unit", watched)
    result = runner.invoke(app, ["verify", "relu", "--backend", "emu", "--quick", "--check", "value", "--no-isolate"])
    assert result.exit_code == 0, result.stdout
    assert "1 build ready in" in result.stderr and {name for name, _ in made} == {"pointwise.cu"}
    assert all(cached for _, cached in made[1:]), "the launch rebuilt what the prebuild made"
    made.clear()
    static = runner.invoke(app, ["verify", "sigmoid", "softmax", "--backend", "emu", "--check", "contract.aligned"])
    assert static.exit_code == 0 and "builds ready" not in static.stderr and made == []


def test_a_failed_build_is_named_and_the_other_builds_still_run():
    from capsule_core.errors import CapsuleError

    ran = []

    def broken():
        raise CapsuleError("the emulator build of x.cu failed (g++):\nx.cu:1: error")

    failures = kernels.build_in_parallel({"emulator x.cu": broken, "emulator y.cu": lambda: ran.append("y")}, workers=2)
    assert failures == {"emulator x.cu": "the emulator build of x.cu failed (g++):"}
    assert ran == ["y"]


def test_a_reference_capsule_on_emu_says_it_has_no_kernel_to_launch():
    result = runner.invoke(app, ["verify", "reference.relu", "--backend", "emu", "--quick", "--no-isolate"])
    assert result.exit_code == 1
    assert (
        "reference.relu: nothing to launch on emu: it declares no native kernel "
        "(a CPU reference capsule: --backend numpy runs it)" in result.stdout
    )
