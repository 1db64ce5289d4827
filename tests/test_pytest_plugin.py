"""The pytest plugin (capsule_core.drivers.pytest_plugin, entry point pytest11): capsule checks as test
items, run through pytester as a user's test suite would run them."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import pytest

import capsule_core
from capsule_core.verify.checks import CHECKS

pytest_plugins = ["pytester"]

for _module in pkgutil.walk_packages(capsule_core.__path__, "capsule_core."):
    # pytester's in-process runs drop the modules they import; numpy cannot load twice in a process
    importlib.import_module(_module.name)

NUMPY = ("--capsules-backend", "numpy", "--capsules-quick", "-p", "no:cacheprovider")
DYNAMIC = "not symbols and not plan"
"""A -k term leaving out the checks that compile the CUDA sources (nvcc): seconds saved."""


def test_one_item_per_capsule_and_check(pytester):
    result = pytester.runpytest("--capsules", "relu,softmax", *NUMPY, "--collect-only", "-q")
    assert result.ret == pytest.ExitCode.OK
    items = [line for line in result.outlines if line.startswith("capsules::")]
    assert items == [f"capsules::{op}::{check}" for op in ("relu", "softmax") for check in CHECKS]


def test_all_means_every_native_capsule(pytester):
    from capsule_core.catalog.native_cuda import CAPSULES

    result = pytester.runpytest("--capsules", "all", *NUMPY, "--collect-only", "-q")
    assert sum(line.startswith("capsules::") for line in result.outlines) == len(CAPSULES) * len(CHECKS)


def test_passed_passes_and_skipped_skips_with_its_reason(pytester):
    result = pytester.runpytest("--capsules", "relu", *NUMPY, "-rs", "-k", "value or rng")
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(
        ["capsules: backend numpy: the numpy float32 provider on the CPU*", "*SKIPPED*not a seeded op*"]
    )


def _negated_relu(monkeypatch):
    """A planted bug: the numpy provider's relu comes out negated."""
    from capsule_core.catalog.cpu_providers import NUMPY_F32

    honest = NUMPY_F32.forward

    def forward(op, inputs, **params):
        y = honest(op, inputs, **params)
        return -y if getattr(op, "name", op) == "relu" else y

    monkeypatch.setattr(NUMPY_F32, "forward", forward)


def test_a_failed_check_fails_its_item_with_the_verify_message_and_rerun_line(pytester, monkeypatch):
    _negated_relu(monkeypatch)
    result = pytester.runpytest("--capsules", "relu,softmax", *NUMPY, "-k", "value")
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(
        [
            "FAILED native_cuda.relu value: y small-0: *",
            "    rerun: capsules verify relu --check value --seed 0 --backend numpy --case small-0",
            "FAILED capsules::relu::value*",
        ]
    )


def test_exitfirst_stops_at_the_first_failed_check(pytester, monkeypatch):
    _negated_relu(monkeypatch)
    result = pytester.runpytest("--capsules", "relu", *NUMPY, "-x", "-k", DYNAMIC)
    result.assert_outcomes(passed=2, failed=1, deselected=2, warnings=None)  # contract.aligned, shape.guard; value


def test_each_capsule_is_verified_once_for_its_selected_checks(pytester, monkeypatch):
    import capsule_core.verify.engine as engine

    calls = []
    honest = engine.verify_capsule

    def counted(capsule, backend, **kwargs):
        calls.append((capsule.op.value, kwargs["checks"]))
        return honest(capsule, backend, **kwargs)

    monkeypatch.setattr(engine, "verify_capsule", counted)
    result = pytester.runpytest(
        "--capsules",
        "relu,softmax",
        *NUMPY,
        "--capsules-seed",
        "3",
        "-k",
        f"softmax and {DYNAMIC} or relu and (bounds or value)",
    )
    assert result.ret == pytest.ExitCode.OK
    assert calls == [
        ("relu", ("value", "value.special", "bounds")),
        ("softmax", tuple(c for c in CHECKS if c not in ("ffi.symbols", "launch.plan"))),
    ]


def test_an_unknown_name_is_a_usage_error_naming_it(pytester):
    result = pytester.runpytest("--capsules", "relu,nosuchop", *NUMPY)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --capsules: unknown capsule 'nosuchop'*"])
    misspelt = pytester.runpytest("--capsules", "sofmax", *NUMPY)
    misspelt.stderr.fnmatch_lines(["ERROR: --capsules: unknown capsule 'sofmax'; did you mean softmax*"])


def test_a_backend_this_machine_lacks_fails_the_items_naming_it(pytester):
    from capsule_core.backends.cuda import probe

    if probe().problem is None:
        pytest.skip("a GPU answers here: --capsules-backend cuda runs")
    result = pytester.runpytest(
        "--capsules", "relu", "--capsules-backend", "cuda", "-p", "no:cacheprovider", "-k", "value and not special"
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["--capsules-backend cuda: --backend cuda needs a GPU: *"])


def test_on_the_emulator(pytester):
    from capsule_core.backends.select import resolve
    from capsule_core.errors import EnvironmentMissing

    try:
        resolve("emu")
    except EnvironmentMissing as exc:
        pytest.skip(f"no emulator here: {exc}")
    result = pytester.runpytest(
        "--capsules",
        "relu",
        "--capsules-backend",
        "emu",
        "--capsules-quick",
        "-p",
        "no:cacheprovider",
        "-k",
        "value or bounds or intact",
    )
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["capsules: backend emu: *"])


def test_without_capsules_the_plugin_adds_nothing_and_imports_no_numpy(pytester):
    pytester.makepyfile(
        test_light="""
        import sys

        def test_light():
            assert "numpy" not in sys.modules and "capsule_core.catalog.registry" not in sys.modules
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    plugins = subprocess.run(
        [sys.executable, "-m", "pytest", "--trace-config", "--co", "-q", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        cwd=pytester.path,
    )
    assert "capsule_core/drivers/pytest_plugin.py" in plugins.stdout
