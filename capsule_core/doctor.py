"""What this machine has, and what each command can do with it."""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from importlib import metadata

from capsule_core.errors import EnvironmentMissing

PACKAGES = ("typer", "numpy", "tabulate", "platformdirs", "pycuda", "hypothesis", "scipy", "pytest", "torch", "cupy")

NEEDS = {
    "list": (),
    "show": (),
    "export": (),
    "select": (),
    "doctor": (),
    "check": ("nvcc",),
    "verify --backend numpy": (),
    "verify --backend emu": ("c++",),
    "verify --backend cuda": ("gpu",),
    "fuzz --backend numpy": (),
    "fuzz --backend emu": ("c++",),
    "fuzz --backend cuda": ("gpu",),
    "bench --backend numpy": (),
    "bench --backend cuda": ("gpu",),
}
"""Command name to what it needs: "nvcc", "gpu", "c++" (the emulator's host compiler). Commands that need nothing run everywhere."""


@dataclass(frozen=True)
class Fact:
    name: str
    value: str
    ok: bool


@dataclass(frozen=True)
class DoctorReport:
    facts: tuple[Fact, ...]
    commands: tuple[tuple[str, bool, str], ...]
    """(command, can run, why not)."""


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def library_facts() -> list[Fact]:
    """One fact per capsule library: its capsules and where it came from, or why it did not load."""
    from capsule_core.catalog import registry

    facts = [
        Fact(f"library {lib.name}", f"{len(lib.capsules)} capsules ({lib.origin})", True)
        for lib in registry.libraries()
    ]
    return facts + [
        Fact(f"library {f.source}", f"did not load: {f.message}", False) for f in registry.library_failures()
    ]


def nvcc_rule(found_by: str) -> str:
    """Which discovery rule of capsule_core.kernels.nvcc.find_nvcc found nvcc, in words."""
    if found_by in ("CUDA_HOME", "CUDA_PATH"):
        return f"{found_by}={os.environ.get(found_by, '')}"
    if found_by == "PATH":
        return "PATH (CUDA_HOME, CUDA_PATH not set)"
    return f"the default {found_by} (CUDA_HOME, CUDA_PATH not set; no nvcc on PATH)"


def examine() -> DoctorReport:
    from capsule_core.backends import cuda
    from capsule_core.backends.emu import emulated_families, find_host_compiler
    from capsule_core.kernels.nvcc import NVCC_RULES, cache_dir, find_nvcc

    facts = [
        Fact("python", f"{platform.python_version()} ({sys.executable})", sys.version_info >= (3, 10)),
        Fact("platform", platform.platform(), True),
    ]
    for name in PACKAGES:
        version = package_version(name)
        facts.append(
            Fact(name, version or "not installed", version is not None or name not in ("typer", "numpy", "tabulate"))
        )
    try:
        nvcc = find_nvcc()
        facts.append(Fact("nvcc", f"{nvcc.version} at {nvcc.path}", True))
        facts.append(Fact("nvcc found by", f"{nvcc_rule(nvcc.found_by)}; order: {', '.join(NVCC_RULES)}", True))
        have_nvcc = ""
    except EnvironmentMissing as exc:
        facts.append(Fact("nvcc", str(exc), False))
        have_nvcc = str(exc)
    try:
        compiler = find_host_compiler()
        facts.append(
            Fact(
                "host C++ compiler",
                f"{compiler.version} at {compiler.path} (found by {compiler.rule}); "
                f"emu runs all {len(emulated_families())} kernel families",
                True,
            )
        )
        have_compiler = ""
    except EnvironmentMissing as exc:
        facts.append(Fact("host C++ compiler", str(exc), False))
        have_compiler = str(exc)
    p = cuda.probe()
    facts.append(Fact("pycuda import", "ok" if p.pycuda_version else p.problem or "", p.pycuda_version is not None))
    facts.append(Fact("CUDA driver", p.driver_version or "none", p.driver_version is not None))
    gpus = "; ".join(f"#{d.index} {d.name} (sm {d.compute_capability}, {d.memory_gib:.0f} GiB)" for d in p.devices)
    facts.append(Fact("GPUs", gpus or (p.problem or "none"), bool(p.devices)))
    facts.append(Fact("cache folder", str(cache_dir()), True))
    facts += library_facts()
    missing = {"nvcc": have_nvcc, "gpu": p.problem or "", "c++": have_compiler}
    commands = []
    for command, needs in NEEDS.items():
        why = "; ".join(missing[n] for n in needs if missing[n])
        commands.append((command, not why, why))
    return DoctorReport(tuple(facts), tuple(commands))
