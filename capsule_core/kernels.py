"""Where the CUDA sources live and which nvcc compiles them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .errors import EnvironmentMissing

_PACKAGE = Path(__file__).resolve().parent


def cuda_source_dir() -> Path:
    """The folder of the .cu/.cuh sources: inside the package in a wheel (capsule_core/_cuda),
    the top-level cuda/ in a checkout or an editable install. cuda/ is data, never a package."""
    for candidate in (_PACKAGE / "_cuda", _PACKAGE.parent / "cuda"):
        if candidate.is_dir() and any(candidate.glob("*.cu*")):
            return candidate
    raise EnvironmentMissing(f"the CUDA sources are missing: looked in {_PACKAGE / '_cuda'} and "
                             f"{_PACKAGE.parent / 'cuda'}; reinstall the package")


def source_path(path: str) -> Path:
    """A NativeSymbolRef path ("cuda/pointwise.cu") resolved to a file on this machine."""
    return cuda_source_dir() / Path(path).name


@dataclass(frozen=True)
class Nvcc:
    path: Path
    version: str
    found_by: str


def find_nvcc() -> Nvcc:
    """nvcc through CUDA_HOME, CUDA_PATH, PATH or /usr/local/cuda, in that order."""
    candidates = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append((Path(os.environ[var]) / "bin" / "nvcc", var))
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append((Path(on_path), "PATH"))
    candidates.append((Path("/usr/local/cuda/bin/nvcc"), "/usr/local/cuda"))
    for path, how in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return Nvcc(path, _nvcc_version(path), how)
    raise EnvironmentMissing("nvcc not found (looked in $CUDA_HOME/bin, $CUDA_PATH/bin, PATH and "
                             "/usr/local/cuda/bin): install the CUDA toolkit or set CUDA_HOME")


def _nvcc_version(path: Path) -> str:
    out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60).stdout
    match = re.search(r"release ([\d.]+), V([\d.]+)", out)
    return match.group(2) if match else out.strip().splitlines()[-1] if out.strip() else "unknown"


def cache_dir() -> Path:
    """The user cache folder for compiled kernels and the fuzz database (CAPSULES_CACHE overrides)."""
    if os.environ.get("CAPSULES_CACHE"):
        return Path(os.environ["CAPSULES_CACHE"])
    import platformdirs
    return Path(platformdirs.user_cache_dir("capsules"))
