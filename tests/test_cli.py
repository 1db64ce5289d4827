"""The commands through Typer's runner: exit codes, stdout, stderr."""

import json

import pytest
from typer.testing import CliRunner

from capsule_core import __version__
from cli.app import app

runner = CliRunner()


def run(*args):
    return runner.invoke(app, list(args))


def test_version():
    result = run("--version")
    assert result.exit_code == 0 and result.stdout.strip() == f"capsules {__version__}"


def test_list_native_json_is_the_seed_catalog():
    result = run("list", "--module", "native_cuda", "--format", "json")
    assert result.exit_code == 0
    rows = json.loads(result.stdout)
    assert len(rows) == 46
    assert rows[0]["name"] == "native_cuda.matmul" and rows[-1]["name"] == "native_cuda.selective_scan"
    assert all(r["name"] == f"native_cuda.{r['op']}" for r in rows)


@pytest.mark.parametrize(
    "fmt, marker", [("table", "native_cuda.relu"), ("csv", "name,library,op,family"), ("markdown", "| name")]
)
def test_list_formats(fmt, marker):
    result = run("list", "--format", fmt)
    assert result.exit_code == 0 and marker in result.stdout
    assert "reference.relu" in result.stdout


def test_list_filters_and_bad_filter():
    result = run("list", "--vjp", "none", "--module", "native_cuda", "--format", "csv")
    assert result.stdout.strip().splitlines()[1:] and all(
        line.split(",")[2] in ("rand_uniform", "bernoulli_mask") for line in result.stdout.strip().splitlines()[1:]
    )
    bad = run("list", "--module", "native_cudaa")
    assert bad.exit_code == 2 and "did you mean native_cuda" in bad.stderr


def test_show_matmul_states_policy_vjp_layout_and_evidence():
    result = run("show", "matmul")
    assert result.exit_code == 0
    out = result.stdout
    for text in (
        "native_cuda.matmul",
        "implementation-defined",
        "backend_vjp",
        "flat_row_major",
        "evidence: runtime_guard(capsule_core.ops.base.validate)",
        "evidence: test_suite(verify:value)",
        "evidence: test_suite(verify:vjp)",
        "capsule_matmul_fwd(",
        "cuda/linalg.cu",
    ):
        assert text in out, text


def test_show_rand_uniform_has_no_vjp():
    result = run("show", "rand_uniform", "--format", "json")
    assert result.exit_code == 0
    record = json.loads(result.stdout)
    assert record["vjp_mode"] == "none"
    assert record["contracts"]["vjp"]["claim"] == "vjp_unavailable"
    assert record["contracts"]["vjp"]["evidence"]["kind"] == "not_applicable"


def test_show_unknown_name_exits_2_with_a_suggestion():
    result = run("show", "relux")
    assert result.exit_code == 2
    assert "unknown capsule 'relux'" in result.stderr and "relu" in result.stderr
    assert result.stdout == ""


def test_verify_unknown_case_exits_2_listing_the_cases():
    """A mistyped --case must not pass as a run that skipped every check."""
    result = run("verify", "linear", "--backend", "numpy", "--quick", "--case", "edge-nosuch")
    assert result.exit_code == 2
    assert "--case: no case 'edge-nosuch'" in result.stderr and "edge-split-k" in result.stderr
    assert run("verify", "linear", "relu", "--backend", "numpy", "--quick", "--case", "edge-split-k").exit_code == 0


def test_select_by_device_and_provider():
    cuda = run("select", "sin", "--device", "cuda")
    assert cuda.exit_code == 0 and "chosen: native_cuda.sin" in cuda.stdout
    cpu = run("select", "sin", "--device", "cpu")
    assert "chosen: reference.sin" in cpu.stdout
    none = run("select", "sin", "--provider", "only:native_cuda", "--device", "cpu", "--format", "json")
    record = json.loads(none.stdout)
    assert record["chosen"] is None
    assert {r["capsule"]: r["reason"] for r in record["refused"]} == {
        "native_cuda.sin": "runs on cuda, the policy asks for cpu",
        "reference.sin": "provider reference is excluded by only:native_cuda",
    }


def test_select_usage_errors_exit_2():
    assert run("select", "sine").exit_code == 2
    bad = run("select", "sin", "--provider", "only:cudnn")
    assert bad.exit_code == 2 and "--provider" in bad.stderr and "cudnn" in bad.stderr


def test_export_is_versioned_json(tmp_path):
    target = tmp_path / "registry.json"
    result = run("export", "-o", str(target))
    assert result.exit_code == 0
    doc = json.loads(target.read_text())
    assert doc["schema"] == "capsules.registry" and doc["schema_version"] == 1
    assert doc["tool_version"] == __version__
    assert doc["modules"] == ["native_cuda", "reference"]
    assert len(doc["capsules"]) == 92 and len(doc["ops"]) == 47
    matmul = doc["capsules"][0]
    assert set(matmul["contracts"]) == {"shape", "layout", "value", "vjp"}
    assert matmul["contracts"]["value"]["provenance"][0]["symbol"] == "capsule_matmul_fwd"


def test_export_to_unwritable_path_exits_3(tmp_path):
    result = run("export", "-o", str(tmp_path / "missing" / "r.json"))
    assert result.exit_code == 3 and "--output" in result.stderr


def test_doctor_reports_the_machine():
    result = run("doctor")
    assert result.exit_code == 0
    for text in ("python", "numpy", "nvcc", "pycuda import", "GPUs", "cache folder", "can run"):
        assert text in result.stdout


def test_no_command_shows_help():
    result = run()
    assert "Usage" in result.stdout + result.stderr


def test_show_gives_ptxas_resources_of_each_kernel():
    result = run("show", "relu")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    fwd = lines.index(next(line for line in lines if "capsule_relu_fwd(" in line))
    assert (
        lines[fwd + 1].strip().startswith("sm_90: ")
        and "registers" in lines[fwd + 1]
        and "spill bytes" in lines[fwd + 1]
    )


def test_show_without_nvcc_says_why_resources_are_unknown(monkeypatch, tmp_path):
    from capsule_core.kernels import nvcc as kernels

    for var in ("CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(kernels, "DEFAULT_CUDA", tmp_path / "none")
    record = json.loads(run("show", "relu", "--format", "json").stdout)
    assert record["kernel_resources"]["capsule_relu_fwd"].startswith("not compiled: nvcc not found")
