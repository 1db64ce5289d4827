"""The verify engine and command on the numpy provider: statuses, reports, exit codes, Ctrl-C."""

import json
from xml.etree import ElementTree

import numpy as np
import pytest
from mutants import DYNAMIC_CHECKS
from typer.testing import CliRunner

from capsule_core.backends.execution import GUARD_ELEMENTS, SENTINEL, BackendRun, GuardedOutput
from capsule_core.backends.numpy_f32 import NumpyBackend
from capsule_core.catalog import registry
from capsule_core.verify import engine
from cli.app import app

runner = CliRunner()


def statuses(op, backend=None, **kwargs):
    report = engine.verify_capsule(
        registry.lookup(op),
        backend or NumpyBackend(),
        quick=True,
        checks=kwargs.pop("checks", DYNAMIC_CHECKS),
        **kwargs,
    )
    return {r.check: r for r in report.results}


@pytest.mark.parametrize("op", ["relu", "softmax", "max_pool", "rand_uniform", "concat", "selective_scan"])
def test_numpy_provider_passes_its_checks(op):
    results = statuses(op)
    bad = {k: (r.status.value, r.reason) for k, r in results.items() if r.status.value not in ("PASSED", "SKIPPED")}
    assert bad == {}
    assert all(r.reason for r in results.values() if r.status.value == "SKIPPED"), "every skip says why"


def test_checks_that_do_not_apply_are_skipped_with_reasons():
    results = statuses("rand_uniform")
    assert results["vjp"].status.value == "SKIPPED" and "VJP mode none" in results["vjp"].reason
    assert results["rng"].status.value == "PASSED"
    assert statuses("relu")["rng"].reason == "not a seeded op"
    assert statuses("max_pool")["selection.ties"].status.value == "PASSED"


def test_an_empty_case_alone_cannot_tell_so_value_is_mistrusted():
    results = statuses("relu", checks=("value",), case="edge-empty")
    assert results["value"].status.value == "MISTRUSTED"


class ShiftedOutput(NumpyBackend):
    """Writes one element past the end and leaves the first unwritten."""

    def forward(self, spec, inputs, params, out):
        run = super().forward(spec, inputs, params, out)
        if out.size:
            out.full[GUARD_ELEMENTS + out.size] = 0.0
            out.view.reshape(-1)[:1] = np.uint32(SENTINEL).view(np.float32)
        return run


def test_bounds_catch_a_write_past_the_end_and_an_unwritten_element():
    result = statuses("relu", ShiftedOutput(), checks=("bounds",))["bounds"]
    assert result.status.value == "FAILED"
    assert "guard elements overwritten" in result.reason and "never written" in result.reason
    assert result.repro.startswith("capsules verify relu --check bounds --seed 0 --backend numpy --case ")


class WorkspaceOverrun(NumpyBackend):
    """Reports what DeviceBackend.execute reports when a kernel writes past a workspace."""

    def backward(self, spec, inputs, params, g, grads):
        run = super().backward(spec, inputs, params, g, grads)
        return BackendRun(run.inputs_after, run.launches, {"partials": 3})


def test_bounds_catch_a_write_past_a_workspace():
    result = statuses("softmax", WorkspaceOverrun(), checks=("bounds",))["bounds"]
    assert result.status.value == "FAILED"
    assert result.reason.startswith("backward partials ") and result.reason.endswith(
        ": 3 guard elements overwritten (a write past the buffer)"
    ), result.reason


def test_guarded_output_accounting():
    out = GuardedOutput((3, 5))
    assert out.unwritten() == 15 and out.guard_damage() == 0
    out.view[...] = 1.0
    out.full[0] = 2.0
    assert out.unwritten() == 0 and out.guard_damage() == 1


def test_cli_backend_cuda_without_a_gpu_exits_3_with_one_sentence(machine_without_gpu):
    result = runner.invoke(app, ["verify", "relu", "--backend", "cuda"])
    assert result.exit_code == 3
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("capsules: error: --backend cuda needs a GPU")


def test_cli_usage_errors_exit_2():
    assert runner.invoke(app, ["verify"]).exit_code == 2
    bad = runner.invoke(app, ["verify", "relu", "--check", "valu"])
    assert bad.exit_code == 2 and "--check: unknown check valu" in bad.stderr
    assert runner.invoke(app, ["verify", "relux"]).exit_code == 2


def test_cli_require_gpu_exits_3_here(machine_without_gpu):
    result = runner.invoke(app, ["verify", "relu", "--require-gpu"])
    assert result.exit_code == 3 and "--require-gpu" in result.stderr


def test_cli_auto_says_which_backend_and_writes_json_and_junit(tmp_path, machine_without_gpu):
    json_file, junit_file = tmp_path / "v.json", tmp_path / "v.xml"
    result = runner.invoke(
        app,
        [
            "verify",
            "relu",
            "add",
            "--quick",
            "--json",
            str(json_file),
            "--junit",
            str(junit_file),
            *[a for c in DYNAMIC_CHECKS for a in ("--check", c)],
        ],
    )
    assert result.stderr.startswith("backend auto -> emu: no GPU here")
    assert result.exit_code == 0, result.stdout
    doc = json.loads(json_file.read_text())
    assert doc["schema"] == "capsules.verify" and doc["backend"] == "emu" and doc["exit_code"] == 0
    assert [c["name"] for c in doc["capsules"]] == ["native_cuda.relu", "native_cuda.add"]
    value = next(c for c in doc["capsules"][0]["checks"] if c["id"] == "value")
    assert value["status"] == "PASSED" and value["worst"] == 0.0 and value["repro"].startswith("capsules verify relu")
    root = ElementTree.parse(junit_file).getroot()
    assert root.get("name") == "capsules verify (emu)"
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == ["native_cuda.relu", "native_cuda.add"]
    assert all(s.get("failures") == "0" and s.get("errors") == "0" for s in suites)


def test_ctrl_c_still_writes_the_partial_report(tmp_path, monkeypatch):
    real = engine.verify_capsule
    calls = []

    def interrupted(capsule, *args, **kwargs):
        calls.append(capsule.name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(capsule, *args, **kwargs)

    monkeypatch.setattr(engine, "verify_capsule", interrupted)
    json_file = tmp_path / "partial.json"
    result = runner.invoke(
        app,
        ["verify", "relu", "add", "sub", "--backend", "numpy", "--quick", "--check", "value", "--json", str(json_file)],
    )
    assert result.exit_code == 130
    doc = json.loads(json_file.read_text())
    assert doc["interrupted"] is True and [c["name"] for c in doc["capsules"]] == ["native_cuda.relu"]
    assert doc["stopped_by"] == "SIGINT" and doc["not_run"] == ["native_cuda.add", "native_cuda.sub"]
    assert "(interrupted by SIGINT: partial report; 2 capsules not run: add, sub)" in result.stdout


def test_isolate_runs_each_capsule_in_its_own_process(tmp_path):
    json_file = tmp_path / "iso.json"
    result = runner.invoke(
        app,
        ["verify", "abs", "--backend", "numpy", "--quick", "--isolate", "--check", "value", "--json", str(json_file)],
    )
    assert result.exit_code == 0, result.stdout
    doc = json.loads(json_file.read_text())
    assert doc["capsules"][0]["checks"][0]["id"] == "value" and doc["capsules"][0]["checks"][0]["status"] == "PASSED"
