"""A plain wheel ships the CUDA sources and finds them: built here, installed into a fresh venv."""

import json
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_every_python_package_is_listed_for_the_wheel():
    tomllib = pytest.importorskip("tomllib")
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for top in ("cli", "capsule_core")
        for p in (ROOT / top).rglob("__init__.py")
    }
    assert found <= listed, f"packages missing from pyproject.toml: {sorted(found - listed)}"


@pytest.mark.slow
def test_wheel_installs_and_finds_its_cuda_sources(tmp_path):
    wheel_dir = tmp_path / "wheel"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(ROOT),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheel_dir),
        ],
        check=True,
        capture_output=True,
    )
    wheel = next(wheel_dir.glob("capsules-*.whl"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    # Install the wheel itself (no network); its dependencies come from this venv, appended after
    # the new venv's own site-packages so that the wheel's capsule_core wins.
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
    )
    (site / "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    listed = subprocess.run(
        [str(python), "-m", "cli", "list", "--module", "native_cuda", "--format", "json"],
        cwd=outside,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    assert len(json.loads(listed.stdout)) == 46
    located = subprocess.run(
        [
            str(python),
            "-c",
            "import capsule_core, capsule_core.kernels.nvcc as k, capsule_core.kernels.plans.pointwise; "
            "print(capsule_core.__file__); print(k.source_path('cuda/common.cuh'))",
        ],
        cwd=outside,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    package_file, source = Path(located[0]), Path(located[1])
    assert package_file.is_relative_to(site), "the wheel's capsule_core must be the one imported"
    assert source == site / "capsule_core" / "_cuda" / "common.cuh" and source.is_file()
    assert not (site / "cuda").exists(), "cuda/ must not become a top-level package"
