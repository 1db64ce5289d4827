"""Run launch plans on the CPU the way the cuda backend will: guard-banded buffers, outputs and
workspaces pre-filled with a NaN sentinel, every output element written, guard bands and inputs
checked bitwise intact afterwards. Either through a host harness (HostReplay: a callable per
launch) or through a kernel family's CUDA source itself, unchanged, compiled for the CPU against
tests/host/cuda_emu.h (PlanRunner).

The emulator runs every thread of a block as a fiber, so barriers and warp shuffles behave as on
a GPU (a divergent one deadlocks and is reported); blocks run one after another over 3-D grids of
3-D blocks, and the grid is capped (the kernels' grid-stride loops make any grid correct), which
also exercises those loops. Dynamic shared memory, 64-bit shuffles, float2/float4 and __ldg are
there. It checks logic, not timing: the math is the host's libm, within the same error models.
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
GUARD = 64
"""Elements of guard band on each side of every buffer."""
GUARD_BITS = np.uint32(0x7F8BEEF0)
"""A signalling-NaN pattern no kernel writes."""
FILL_BITS = np.uint32(0x7FC0DEAD)
"""The NaN that outputs and workspaces hold before the launch (no test input holds it)."""

CTYPES = {"float": ctypes.c_float, "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64, "int32_t": ctypes.c_int32}


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
    """cuda/<family>.cu compiled for the CPU with a wrapper
    emu_<symbol>(grid x, y, z, block x, y, z, dynamic shared bytes, params...) per registry symbol
    of the family; each returns 1, or 0 when the threads deadlocked."""
    refs = {r.symbol: r for c in registry.CATALOG if c.family == family for r in c.symbols}
    lines = [f'#include "{family}.cu"']
    for symbol, ref in sorted(refs.items()):
        names = ", ".join(parse_param(p).name for p in ref.params)
        lines.append(f'extern "C" int emu_{symbol}(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, '
                     f'unsigned bz, unsigned shared, {", ".join(ref.params)}) {{\n'
                     f"    return capsule_emu::launch(dim3{{gx, gy, gz}}, dim3{{bx, by, bz}}, shared, &{symbol}, {names})"
                     " ? 1 : 0;\n}")
    lib = build(family, "\n".join(lines) + "\n", build_dir)
    for symbol, ref in refs.items():
        fn = getattr(lib, f"emu_{symbol}")
        fn.restype = ctypes.c_int
        params = [parse_param(p) for p in ref.params]
        fn.argtypes = [ctypes.c_uint] * 7 + [ctypes.c_void_p if p.pointer else CTYPES[p.ctype] for p in params]
    return lib


@dataclass
class Slot:
    """`count` elements of a guard-banded allocation."""

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


def guarded(count: int, dtype=np.float32, misalign: int = 0) -> Slot:
    """A buffer of `count` elements starting `misalign` elements past a 64-byte boundary, with
    at least GUARD elements of guard band on each side (its contents: the guard pattern)."""
    itemsize = np.dtype(dtype).itemsize
    storage = np.empty(count + 2 * GUARD + 64, dtype=dtype)
    storage.view(np.uint32)[:] = GUARD_BITS
    first = storage.ctypes.data + GUARD * itemsize
    lead = GUARD + ((misalign * itemsize - first) % 64) // itemsize
    return Slot(storage, int(lead), count)


def prefilled(count: int, dtype=np.float32) -> np.ndarray:
    """A 64-byte aligned buffer pre-filled with FILL_BITS (for a harness call outside a plan)."""
    view = guarded(count, dtype).view
    view.view(np.uint32)[:] = FILL_BITS
    return view


def unwritten(y: np.ndarray) -> np.ndarray:
    """Elements still holding the pre-fill sentinel (never written by the kernel)."""
    return np.asarray(y, dtype=np.float32).view(np.uint32) == FILL_BITS


class PlanMemory:
    """The device memory of one run of a plan. `misalign` gives each buffer's offset in elements
    past a 64-byte boundary: {buffer name: elements}, or a function of the Buffer. Inputs and meta
    buffers hold their data, outputs and workspaces FILL_BITS; an output that aliases an input
    (plan.aliases) is that input's memory."""

    def __init__(self, plan: LaunchPlan, arrays: dict, misalign=None):
        self.plan = plan
        shift = misalign if callable(misalign) else (lambda b, table=misalign or {}: table.get(b.name, 0))
        self.slots: dict[str, Slot] = {}
        for b in plan.buffers:
            if b.name in plan.aliases:
                continue
            dtype = np.float32 if b.dtype == "float32" else np.int64
            slot = guarded(b.elements, dtype, int(shift(b)))
            if b.role == "meta":
                slot.view[:] = np.asarray(plan.host_data[b.name], dtype=dtype).reshape(-1)
            elif b.role == "input":
                slot.view[:] = np.asarray(arrays[b.name], dtype=dtype).reshape(-1)
            else:
                slot.view.view(np.uint32)[:] = FILL_BITS
            self.slots[b.name] = slot
        self.before = {name: slot.view.copy() for name, slot in self.slots.items()
                       if plan.buffer(name).role in ("input", "meta")}

    def view(self, name: str) -> np.ndarray:
        return self.slots[name].view

    def args(self, launch) -> list:
        """The launch's arguments: buffer addresses for buffer names, the numbers as they are."""
        return [self.slots[a].address if isinstance(a, str) else a for a in launch.args]

    def check(self):
        """Nothing written outside a buffer, no input or meta buffer changed."""
        where = f"{self.plan.op} {self.plan.direction}"
        for name, slot in self.slots.items():
            assert slot.guards_intact(), f"{where}: a write outside buffer {name}"
        for name, value in self.before.items():
            assert np.array_equal(value.view(np.uint8), self.slots[name].view.view(np.uint8)), f"{where}: input {name} changed"

    def outputs(self) -> dict:
        """Copies of the outputs shaped by plan.output_shapes, each element of them written."""
        out = {}
        for name, shape in self.plan.output_shapes.items():
            source = self.plan.aliases.get(name, name)
            value = self.slots[source].view.copy().reshape(shape)
            if name not in self.plan.aliases and self.plan.buffer(name).dtype == "float32":
                left = int(unwritten(value).sum())
                assert left == 0, f"{self.plan.op} {self.plan.direction}: {name} not fully written ({left} elements)"
            out[name] = value
        return out


class HostReplay:
    """Executes LaunchPlans in PlanMemory with `call(memory, launch)` per launch (a host harness
    replaying the kernel); what each call returned is kept in `returned` as (symbol, value)."""

    def __init__(self, call=None):
        self.call = call
        self.returned: list[tuple[str, object]] = []

    def launch(self, memory: PlanMemory, launch):
        return self.call(memory, launch)

    def run(self, plan: LaunchPlan, arrays: dict, misalign=None) -> dict:
        """Runs every launch of `plan`. `arrays` maps the plan's input buffer names (and "out" for
        a backward that reads the forward's result) to arrays; returns the outputs. Raises
        AssertionError on a deadlock, a write outside a buffer, a changed input or an output
        element left unwritten."""
        memory = PlanMemory(plan, arrays, misalign)
        for launch in plan.launches:
            self.returned.append((launch.symbol, self.launch(memory, launch)))
        memory.check()
        return memory.outputs()


class PlanRunner(HostReplay):
    """Executes LaunchPlans of one family through its .cu on the emulator, the grid capped at
    `max_grid` blocks (x, y)."""

    def __init__(self, family: str, build_dir: str, max_grid: tuple[int, int] = (4, 4)):
        super().__init__()
        self.lib = load_family(family, str(build_dir))
        self.max_grid = max_grid

    def launch(self, memory: PlanMemory, launch):
        grid = (min(launch.grid[0], self.max_grid[0]), min(launch.grid[1], self.max_grid[1]), launch.grid[2])
        ok = getattr(self.lib, f"emu_{launch.symbol}")(*grid, *launch.block, launch.shared_bytes, *memory.args(launch))
        assert ok, f"{launch.symbol}: threads deadlocked at a barrier or a shuffle"
        return ok


def emulator(family: str, build_dir: str, max_grid: tuple[int, int] = (4, 4)) -> PlanRunner:
    """The family's PlanRunner; skips the test where no C++ compiler is installed."""
    if compiler() is None:
        import pytest
        pytest.skip("no C++ compiler (g++) for the emulator")
    return PlanRunner(family, build_dir, max_grid)
