"""Run a kernel family's CUDA source, unchanged, on the CPU through tests/host/cuda_emu.h, and
execute launch plans with it the way the cuda backend will: guard-banded buffers, outputs and
workspaces pre-filled with a NaN sentinel, inputs checked bitwise intact afterwards.

The emulator runs every thread of a block as a fiber, so barriers and warp shuffles behave as on
a GPU (a divergent one deadlocks and is reported); blocks run one after another, and the grid is
capped (the kernels' grid-stride loops make any grid correct), which also exercises those loops.
It checks logic, not timing: the math is the host's expf/logf, within the same error models.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from capsule_core import registry
from capsule_core.kernels import cuda_source_dir
from capsule_core.launch import LaunchPlan, parse_param

HOST_DIR = Path(__file__).resolve().parent / "host"
GUARD = 16
"""Elements of guard band on each side of every buffer."""
GUARD_BITS = np.uint32(0x7F8BEEF0)
"""A signalling-NaN pattern no kernel writes."""
FILL_BITS = np.uint32(0x7FC0DEAD)
"""The NaN that outputs and workspaces hold before the launch."""

_CTYPES = {"float": ctypes.c_float, "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64, "int32_t": ctypes.c_int32}


def compiler() -> str | None:
    return shutil.which("g++") or shutil.which("c++")


def build(name: str, code: str, build_dir: str) -> ctypes.CDLL:
    """C++ `code` (which #includes CUDA sources from cuda/) built against the emulator."""
    driver = Path(build_dir) / f"{name}_emu.cpp"
    driver.write_text(code)
    target = Path(build_dir) / f"lib{name}_emu.so"
    cmd = [compiler(), "-std=c++20", "-O2", "-shared", "-fPIC", "-include", str(HOST_DIR / "cuda_emu.h"),
           "-I", str(cuda_source_dir()), "-o", str(target), str(driver)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"emulator build of {name} failed:\n{result.stderr}")
    return ctypes.CDLL(str(target))


@lru_cache(maxsize=None)
def load_family(family: str, build_dir: str) -> ctypes.CDLL:
    """cuda/<family>.cu compiled for the CPU with a wrapper emu_<symbol>(grid, block, params...)
    per registry symbol of the family; each returns 1, or 0 when the threads deadlocked."""
    refs = {r.symbol: r for c in registry.CATALOG if c.family == family for r in c.symbols}
    lines = [f'#include "{family}.cu"']
    for symbol, ref in sorted(refs.items()):
        names = ", ".join(parse_param(p).name for p in ref.params)
        lines.append(f'extern "C" int emu_{symbol}(unsigned grid, unsigned block, {", ".join(ref.params)}) {{\n'
                     f"    return capsule_emu::launch(grid, block, &{symbol}, {names}) ? 1 : 0;\n}}")
    lib = build(family, "\n".join(lines) + "\n", build_dir)
    for symbol, ref in refs.items():
        fn = getattr(lib, f"emu_{symbol}")
        fn.restype = ctypes.c_int
        params = [parse_param(p) for p in ref.params]
        fn.argtypes = [ctypes.c_uint, ctypes.c_uint] + [ctypes.c_void_p if p.pointer else _CTYPES[p.ctype] for p in params]
    return lib


@dataclass
class _Slot:
    storage: np.ndarray
    start: int
    count: int

    @property
    def view(self) -> np.ndarray:
        return self.storage[self.start:self.start + self.count]

    @property
    def address(self) -> int:
        return self.storage.ctypes.data + self.storage.itemsize * self.start

    def guards_intact(self) -> bool:
        bits = self.storage.view(np.uint32)
        width = self.storage.itemsize // 4
        return bool((bits[:self.start * width] == GUARD_BITS).all()
                    and (bits[(self.start + self.count) * width:] == GUARD_BITS).all())


def _slot(dtype, count: int, misalign: int) -> _Slot:
    """A buffer of `count` elements starting `misalign` elements past a 64-byte boundary, with
    at least GUARD elements of guard band on each side."""
    itemsize = np.dtype(dtype).itemsize
    storage = np.empty(count + 2 * GUARD + 64, dtype=dtype)
    storage.view(np.uint32)[:] = GUARD_BITS
    first = storage.ctypes.data + GUARD * itemsize
    lead = GUARD + ((misalign * itemsize - first) % 64) // itemsize
    return _Slot(storage, int(lead), count)


class PlanRunner:
    """Executes LaunchPlans of one family on the emulator."""

    def __init__(self, family: str, build_dir: str, max_grid: int = 4):
        self.lib = load_family(family, build_dir)
        self.max_grid = max_grid

    def run(self, plan: LaunchPlan, arrays: dict, misalign: dict | None = None) -> dict:
        """Runs every launch of `plan`. `arrays` maps the plan's input (and "out" for a backward)
        buffer names to arrays; returns the output arrays shaped by plan.output_shapes. Raises
        AssertionError on a deadlock, a write outside a buffer or a changed input."""
        misalign = misalign or {}
        slots = {}
        for b in plan.buffers:
            dtype = np.float32 if b.dtype == "float32" else np.int64
            slot = _slot(dtype, b.elements, misalign.get(b.name, 0))
            if b.role == "meta":
                slot.view[:] = np.asarray(plan.host_data[b.name], dtype=dtype).reshape(-1)
            elif b.role == "input":
                slot.view[:] = np.asarray(arrays[b.name], dtype=dtype).reshape(-1)
            else:
                slot.view.view(np.uint32)[:] = FILL_BITS
            slots[b.name] = slot
        before = {name: slots[name].view.copy() for name, s in slots.items()
                  if plan.buffer(name).role in ("input", "meta")}
        for launch in plan.launches:
            fn = getattr(self.lib, f"emu_{launch.symbol}")
            args = [slots[a].address if isinstance(a, str) else a for a in launch.args]
            grid = min(launch.grid[0], self.max_grid)
            assert launch.grid[1:] == (1, 1) and launch.block[1:] == (1, 1)
            ok = fn(grid, launch.block[0], *args)
            assert ok, f"{launch.symbol}: threads deadlocked at a barrier or a shuffle"
        for name, slot in slots.items():
            assert slot.guards_intact(), f"{plan.op} {plan.direction}: a write outside buffer {name}"
        for name, value in before.items():
            assert np.array_equal(value.view(np.uint8), slots[name].view.view(np.uint8)), \
                f"{plan.op} {plan.direction}: input {name} changed"
        return {name: slots[name].view.copy().reshape(shape) for name, shape in plan.output_shapes.items()}


def unwritten(y: np.ndarray) -> np.ndarray:
    """Elements still holding the pre-fill sentinel (never written by the kernel)."""
    return np.asarray(y, dtype=np.float32).view(np.uint32) == FILL_BITS
