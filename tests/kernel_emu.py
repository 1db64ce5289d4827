"""Run launch plans on the CPU in test-made memory: guard-banded buffers at chosen misalignments,
outputs and workspaces pre-filled with a NaN sentinel, every output element written, guard bands
and inputs checked bitwise intact afterwards. Either through a host harness (HostReplay: a callable
per launch) or through the product's emu backend (PlanRunner: capsule_core.backends.emu, the
family's .cu unchanged on the CPU emulator), with the grid capped at `max_grid` blocks so that the
kernels' grid-stride loops run several trips.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from capsule_core.backends.emu import (EMULATOR_HEADER, HOST_FLAGS, LINKER_SCRIPT, EmuBackend, KernelFault,
                                       find_host_compiler)
from capsule_core.backends.device import SCALAR_TYPES
from capsule_core.errors import EnvironmentMissing
from capsule_core.kernels import cuda_source_dir
from capsule_core.launch import LaunchPlan, parse_param

GUARD = 64
"""Elements of guard band on each side of every buffer."""
GUARD_BITS = np.uint32(0x7F8BEEF0)
"""A signalling-NaN pattern no kernel writes."""
FILL_BITS = np.uint32(0x7FC0DEAD)
"""The NaN that outputs and workspaces hold before the launch (no test input holds it)."""


def compiler() -> str | None:
    try:
        return str(find_host_compiler().path)
    except EnvironmentMissing:
        return None


def build(name: str, code: str, build_dir: str):
    """C++ `code` built against the product's emulator header, as the emu backend builds a family."""
    import ctypes
    import subprocess
    driver = Path(build_dir) / f"{name}_emu.cpp"
    driver.write_text(code)
    target = Path(build_dir) / f"lib{name}_emu.so"
    source_dir = cuda_source_dir()
    cmd = [compiler(), *HOST_FLAGS, "-include", str(source_dir / EMULATOR_HEADER), "-I", str(source_dir),
           "-o", str(target), str(driver), f"-Wl,-T,{source_dir / LINKER_SCRIPT}"]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"emulator build of {name} failed:\n{result.stderr}")
    return ctypes.CDLL(str(target))


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
    """Executes LaunchPlans of one family through the emu backend, the grid capped at `max_grid`
    blocks (x, y)."""

    def __init__(self, family: str, build_dir: str = "", max_grid: tuple[int, int] = (4, 4)):
        super().__init__()
        from capsule_core import registry
        self.device = EmuBackend()
        self.refs = {r.symbol: r for c in registry.CATALOG if c.family == family for r in c.symbols}
        self.max_grid = max_grid

    def launch(self, memory: PlanMemory, launch):
        grid = (min(launch.grid[0], self.max_grid[0]), min(launch.grid[1], self.max_grid[1]), launch.grid[2])
        ref = self.refs[launch.symbol]
        params = [parse_param(p) for p in ref.params]
        args = [np.uintp(a) if p.pointer else SCALAR_TYPES[p.ctype](a) for p, a in zip(params, memory.args(launch))]
        try:
            self.device.launch(ref, grid, launch.block, launch.shared_bytes, args)
        except KernelFault as exc:
            raise AssertionError(f"{launch.symbol}: {exc}") from exc
        return True


def emulator(family: str, build_dir: str = "", max_grid: tuple[int, int] = (4, 4)) -> PlanRunner:
    """The family's PlanRunner; skips the test where no C++ compiler is installed."""
    if compiler() is None:
        import pytest
        pytest.skip("no C++ compiler (g++) for the emulator")
    return PlanRunner(family, build_dir, max_grid)
