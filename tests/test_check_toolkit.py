"""The toolkit the user asked for, or a clear no: an explicitly set CUDA_HOME or CUDA_PATH that
holds no nvcc is exit 3 naming the variable, never a silent fall back; with neither set, discovery
goes on through PATH and /usr/local/cuda; `doctor` says which rule found nvcc."""

import os

import pytest
from typer.testing import CliRunner

from capsule_core import doctor
from capsule_core.errors import EnvironmentMissing
from capsule_core.kernels import nvcc as kernels
from cli.app import app

runner = CliRunner()


@pytest.fixture
def real_nvcc():
    try:
        return kernels.find_nvcc().path
    except EnvironmentMissing as exc:
        pytest.skip(f"needs nvcc: {exc}")


@pytest.mark.parametrize("variable", ["CUDA_HOME", "CUDA_PATH"])
def test_an_explicit_toolkit_without_nvcc_is_exit_3_naming_the_variable(monkeypatch, tmp_path, real_nvcc, variable):
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.setenv(variable, str(tmp_path / "nonexistent"))
    with pytest.raises(EnvironmentMissing, match=f"{variable}=.*nonexistent holds no nvcc"):
        kernels.find_nvcc()
    result = runner.invoke(app, ["check", "relu"])
    assert result.exit_code == 3 and f"{variable}={tmp_path / 'nonexistent'} holds no nvcc" in result.stderr


def test_cuda_home_wins_over_path_and_doctor_names_the_rule(monkeypatch, tmp_path, real_nvcc):
    toolkit = tmp_path / "toolkit"
    (toolkit / "bin").mkdir(parents=True)
    (toolkit / "bin" / "nvcc").symlink_to(real_nvcc)
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    monkeypatch.setenv("CUDA_PATH", str(tmp_path / "ignored, CUDA_HOME comes first"))
    found = kernels.find_nvcc()
    assert found.found_by == "CUDA_HOME" and found.path == toolkit / "bin" / "nvcc"
    assert doctor_fact("nvcc found by") == f"CUDA_HOME={toolkit}; order: CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda"


def test_without_the_variables_discovery_goes_on_through_path(monkeypatch, tmp_path, real_nvcc):
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(variable, raising=False)
    (tmp_path / "nvcc").symlink_to(real_nvcc)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    found = kernels.find_nvcc()
    assert found.found_by == "PATH" and found.path == tmp_path / "nvcc"
    assert doctor_fact("nvcc found by").startswith("PATH (CUDA_HOME, CUDA_PATH not set); order: ")


def test_doctor_says_why_check_cannot_run_with_a_wrong_cuda_home(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    result = doctor.examine()
    can_run, why = next((ok, why) for command, ok, why in result.commands if command == "check")
    assert not can_run and why.startswith(f"CUDA_HOME={tmp_path} holds no nvcc")


def doctor_fact(name: str) -> str:
    return next(f.value for f in doctor.examine().facts if f.name == name)
