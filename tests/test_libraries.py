"""Capsule libraries: kernels capsules did not write, declared in Python (capsule_core/catalog/library.py)
and held to the same checks as the built-in 46. The libraries under tests/libraries are small and
planted; examples/tinylib is the worked example of the README."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from capsule_core.catalog import library as declared
from capsule_core.catalog import registry
from capsule_core.model import BackendOp, LibraryOp
from cli.app import app

ROOT = Path(__file__).resolve().parent.parent
LIBRARIES = ROOT / "tests" / "libraries"
TINYLIB = ROOT / "examples" / "tinylib"
runner = CliRunner()


@pytest.fixture(autouse=True)
def own_libraries(monkeypatch):
    """Libraries loaded in this process (runner.invoke, use_libraries) stay in this test."""
    from capsule_core import ops

    monkeypatch.setattr(registry, "_STATE", registry._Libraries())
    monkeypatch.setattr(ops, "_LIBRARY_SPECS", {})


def has_compilers() -> bool:
    return shutil.which("g++") is not None


def capsules(*args, env=None, cwd=ROOT):
    """The CLI as a process: the library state of one run never leaks into another test."""
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "CAPSULES_PROGRESS": "0", **(env or {})},
        timeout=900,
    )


# -- the declaration ---------------------------------------------------------------------------------


def test_the_example_declares_cpp_kernels_read_from_their_sources():
    lib = declared.load_path(TINYLIB)
    assert lib.name == "tinylib" and lib.path == TINYLIB.resolve()
    by_name = {c.name: c for c in lib.capsules}
    assert set(by_name) == {"tinylib.relu", "tinylib.softmax", "tinylib.max_pool", "tinylib.squared_relu"}
    softmax = by_name["tinylib.softmax"]
    assert softmax.op is BackendOp.SOFTMAX and softmax.trust_level.value == "trusted_external"
    row_max = next(r for r in softmax.symbols if r.symbol == "tinylib::row_max")
    assert row_max.linkage == "C++" and row_max.params == (
        "const float* __restrict__ x",
        "int* __restrict__ rowmax",
        "size_t n",
        "size_t cols",
    )
    assert row_max.definition.startswith("csrc/cuda/softmax.cu:") and Path(row_max.path).is_absolute()
    assert row_max.build.include_dirs == (str(TINYLIB / "csrc" / "include"),)
    assert row_max.build.defines == ("TINYLIB_THREADS=256",)
    own = by_name["tinylib.squared_relu"]
    assert own.op == LibraryOp("tinylib.squared_relu") and "tinylib.squared_relu" in lib.specs
    assert lib.plans_for(softmax) is not None and lib.budget_for(softmax) is not None


@pytest.mark.parametrize(
    "declaration, message",
    [
        ("import_error.py", "library tests/libraries/import_error.py (import_error.py:8): NameError: name 'TRUSTED'"),
        ("unknown_op.py", "library typo (unknown_op.py:9): unknown op 'rellu' (did you mean relu"),
        (
            "missing_kernel.py",
            "library missing (missing_kernel.py:11): kernel 'tiny::relu_forward' is not defined in its sources "
            "(csrc/tiny.cu) (did you mean relu_fwd",
        ),
    ],
)
def test_a_broken_library_names_itself_and_the_line_and_the_rest_still_works(declaration, message):
    listed = capsules("list", "--library", f"tests/libraries/{declaration}", "--format", "json")
    assert listed.returncode == 2 and message in listed.stderr and "Traceback" not in listed.stderr
    assert "native_cuda.relu" in {c["name"] for c in json.loads(listed.stdout)}
    verified = capsules("verify", "relu", "--backend", "numpy", "--library", f"tests/libraries/{declaration}")
    assert verified.returncode == 2 and message in verified.stderr and "Traceback" not in verified.stderr
    found = capsules(
        "verify", "relu", "--backend", "numpy", env={"CAPSULES_LIBRARIES": f"tests/libraries/{declaration}"}
    )
    assert found.returncode == 0 and "warning" in found.stderr and message in found.stderr
    doctor = capsules("doctor", env={"CAPSULES_LIBRARIES": f"tests/libraries/{declaration}"})
    assert message in doctor.stdout and "library native_cuda" in doctor.stdout


def test_a_plan_that_raises_fails_launch_plan_naming_the_error():
    checked = capsules("check", "raising.relu", "--arch", "sm_90", "--library", "tests/libraries/raising.py")
    assert checked.returncode == 1, checked.stderr
    assert (
        "the plan function raised ZeroDivisionError: float division by zero (at raising_plans.py:7)" in checked.stdout
    )


def test_a_library_loads_once_and_its_name_must_be_free():
    first = registry.use_libraries([str(LIBRARIES / "tiny.py")])
    again = registry.use_libraries([str(LIBRARIES / "tiny.py")])
    assert first == [] and again == []
    assert [lib.name for lib in registry.libraries()].count("tiny") == 1
    with pytest.raises(declared.LibraryError, match="must be an identifier other than native_cuda"):
        declared.resolve(declared.CapsuleLibrary("native_cuda", ()), LIBRARIES, "capsules_library_x", "a test")


# -- discovery -----------------------------------------------------------------------------------------


def test_an_installed_package_is_found_through_its_entry_point(tmp_path):
    site = tmp_path / "site"
    package = site / "tinypkg"
    shutil.copytree(LIBRARIES, package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "__init__.py").write_text("")
    info = site / "tinypkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[capsules.libraries]\ntiny = tinypkg.tiny:LIBRARY\n")
    listed = capsules("list", "--module", "tiny", "--format", "json", env={"PYTHONPATH": str(site)})
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert {r["name"] for r in rows} == {"tiny.relu", "tiny.mse_loss"} and {r["library"] for r in rows} == {"tiny"}


# -- every command ---------------------------------------------------------------------------------------


def test_list_show_select_and_export_see_a_library():
    lib = ["--library", str(TINYLIB)]
    listed = runner.invoke(app, ["list", "--module", "tinylib", *lib])
    assert listed.exit_code == 0 and "library" in listed.stdout.splitlines()[0]
    assert "tinylib.softmax" in listed.stdout and "native_cuda" not in listed.stdout
    chosen = runner.invoke(
        app, ["select", "softmax", "--provider", "prefer:tinylib", "--assurance", "external", "--format", "json", *lib]
    )
    assert chosen.exit_code == 0, chosen.output
    doc = json.loads(chosen.stdout)
    assert doc["chosen"] == "tinylib.softmax"
    checked_only = json.loads(runner.invoke(app, ["select", "softmax", "--format", "json", *lib]).stdout)
    assert checked_only["chosen"] == "native_cuda.softmax"
    assert any(r["capsule"] == "tinylib.softmax" and "trusted_external" in r["reason"] for r in checked_only["refused"])
    exported = json.loads(runner.invoke(app, ["export", *lib]).stdout)
    assert "tinylib" in exported["modules"] and "tinylib.squared_relu" in {o["name"] for o in exported["ops"]}


def test_show_gives_sources_with_lines_and_mangled_entries():
    shown = runner.invoke(app, ["show", "tinylib.softmax", "--library", str(TINYLIB)])
    assert shown.exit_code == 0, shown.output
    assert "csrc/cuda/softmax.cu:" in shown.stdout and "tinylib::row_max(" in shown.stdout
    assert "[C++ linkage]" in shown.stdout and "PTX entry _ZN7tinylib7row_maxE" in shown.stdout


def test_plan_explains_a_library_chain_of_launches():
    planned = runner.invoke(app, ["plan", "tinylib.softmax", "--input", "x=4x300", "--library", str(TINYLIB)])
    assert planned.exit_code == 0, planned.output
    for kernel in ("tinylib::row_max", "tinylib::row_exp", "tinylib::row_sum", "tinylib::row_divide"):
        assert kernel in planned.stdout


@pytest.mark.skipif(not has_compilers(), reason="the emulator needs g++")
def test_verify_finds_the_examples_deliberate_defect_and_passes_the_rest(tmp_path):
    out = tmp_path / "report.json"
    result = capsules("verify", "tinylib", "--backend", "emu", "--quick", "--json", str(out), "--library", str(TINYLIB))
    assert result.returncode == 1, result.stderr
    doc = json.loads(out.read_text())
    status = {c["name"]: c["status"] for c in doc["capsules"]}
    assert status == {
        "tinylib.relu": "PASSED",
        "tinylib.softmax": "PASSED",
        "tinylib.max_pool": "FAILED",
        "tinylib.squared_relu": "PASSED",
    }
    pool = next(c for c in doc["capsules"] if c["name"] == "tinylib.max_pool")
    assert pool["library"] == "tinylib"
    failed = [c for c in pool["checks"] if c["status"] == "FAILED"]
    assert [c["id"] for c in failed] == ["value.special"]
    assert "y=-3.4028234663852886e+38, reference=-inf" in failed[0]["reason"]
    assert failed[0]["repro"].endswith(f"--library {TINYLIB.relative_to(ROOT)} --case edge-infinities")


@pytest.mark.skipif(not has_compilers(), reason="the emulator needs g++")
def test_a_float_atomic_sum_fails_determinism_and_the_fixed_order_sum_passes():
    result = capsules(
        "verify",
        "tiny.mse_loss",
        "ordered.mse_loss",
        "--check",
        "determinism",
        "--backend",
        "emu",
        "--jobs",
        "2",
        "--library",
        "tests/libraries/tiny.py",
        "--library",
        "tests/libraries/ordered.py",
    )
    assert result.returncode == 1, result.stderr
    assert "FAILED tiny.mse_loss determinism: two runs of" in result.stdout
    assert (
        "differ in their bits (on the emulator the second runs blocks and threads in reversed order)" in result.stdout
    )
    rows = {line.split()[0]: line.split()[1] for line in result.stdout.splitlines() if line.startswith(("tiny", "ord"))}
    assert rows == {"tiny.mse_loss": "FAILED", "ordered.mse_loss": "PASSED"}


@pytest.mark.skipif(not has_compilers(), reason="the emulator needs g++")
def test_the_pytest_plugin_verifies_a_library_capsule_from_an_empty_folder(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--capsules",
            "tiny.relu",
            "--capsules-backend",
            "emu",
            "--capsules-quick",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "CAPSULES_LIBRARIES": str(LIBRARIES / "tiny.py")},
        timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert " passed" in result.stdout and "failed" not in result.stdout


def test_check_holds_library_kernels_to_their_declarations():
    if shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists():
        pytest.skip("capsules check needs nvcc")
    checked = capsules("check", "tinylib", "--format", "json", "--library", str(TINYLIB))
    assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr
    doc = json.loads(checked.stdout)
    assert {c["name"] for c in doc["capsules"]} == {
        "tinylib.relu",
        "tinylib.softmax",
        "tinylib.max_pool",
        "tinylib.squared_relu",
    }
    assert all(c["status"] == "PASSED" for c in doc["capsules"])


def test_a_librarys_files_travel_with_a_ray_job(tmp_path):
    pytest.importorskip("ray", reason="--ray needs the ray extra")
    result = capsules(
        "verify",
        "tiny.relu",
        "--backend",
        "emu",
        "--quick",
        "--ray",
        "local",
        "--library",
        str(LIBRARIES / "tiny.py"),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1/1 capsules passed" in result.stdout


def test_racecheck_names_a_planted_inter_block_race():
    """tests/libraries/csrc/racy.cu: thread 0 of every block writes y[0], no ordering between
    blocks (a race a GPU's concurrent blocks make real)."""
    from capsule_core.sanitize.engine import unavailable

    why = unavailable("racecheck")
    if why:
        pytest.skip(why)
    result = capsules(
        "verify",
        "racy.relu",
        "--library",
        "tests/libraries/racy.py",
        "--sanitize",
        "racecheck",
        "--check",
        "sanitize.racecheck",
        "--backend",
        "emu",
        "--case",
        "medium-0",
    )
    assert result.returncode == 1, result.stdout + result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("FAILED racy.relu sanitize.racecheck"))
    assert "data race on buffer out" in line and "racy.cu:10" in line
    blocks = re.findall(r"by block \((\d+),0,0\) thread \(0,0,0\)", line)
    assert len(blocks) == 2 and blocks[0] != blocks[1], line
