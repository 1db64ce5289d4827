"""Launch plans run by tests through the product's one execution path (DeviceBackend.execute,
design §8), with what a test asserts after every run: no guard band touched, every output element
written, every input read back bit for bit as it went in.

Two devices run the launches: the emu backend with its grids capped (GridCappedEmu: the kernels
loop grid-stride, so a grid of a few blocks makes every block walk several tiles or chunks at test
sizes), and host functions called in place of the kernels (HostReplay: what a launch receives
through DeviceBackend.execute).
"""

from __future__ import annotations

import numpy as np

from capsule_core.backends.emu import EmuBackend, KernelFault, find_host_compiler
from capsule_core.backends.execution import SENTINEL, GuardedOutput
from capsule_core.catalog import registry
from capsule_core.errors import EnvironmentMissing
from capsule_core.kernels.c_types import BUFFER_DTYPES
from capsule_core.kernels.launch import Launch, LaunchPlan


class GridCappedEmu(EmuBackend):
    """The emu backend launching at most `max_grid` blocks along x and y."""

    def __init__(self, max_grid: tuple[int, int]):
        super().__init__()
        self.max_grid = max_grid

    def launch(self, ref, grid, block, shared_bytes, args):
        capped = (min(grid[0], self.max_grid[0]), min(grid[1], self.max_grid[1]), grid[2])
        super().launch(ref, capped, block, shared_bytes, args)


class PlanRunner:
    """Runs LaunchPlans on `device` (an EmuBackend) and checks each run."""

    def __init__(self, device: EmuBackend):
        self.device = device

    def run(self, plan: LaunchPlan, arrays: dict, misalign=None) -> dict:
        """Every launch of `plan`; `arrays` maps its input buffer names (and "out" for a backward
        that reads the forward's result) to arrays, `misalign` is DeviceBackend.execute's. Returns
        the outputs shaped by plan.output_shapes. Raises AssertionError on a kernel fault, a changed
        input, a write outside any buffer or an output element left unwritten."""
        where = f"{plan.op} {plan.direction}"
        host = {b.name: arrays[b.name] for b in plan.buffers if b.role == "input"}
        outputs = {name: GuardedOutput(tuple(shape)) for name, shape in plan.output_shapes.items()}
        try:
            executed = self.device.execute(registry.lookup(plan.op), plan, host, outputs, misalign)
        except KernelFault as exc:
            raise AssertionError(f"{where}: {exc}") from exc
        assert not executed.overruns, f"{where}: writes past buffers (guard elements changed): {executed.overruns}"
        for name, value in executed.inputs_after.items():
            sent = np.ascontiguousarray(host[name], BUFFER_DTYPES[plan.buffer(name).dtype])
            assert sent.tobytes() == value.tobytes(), f"{where}: input {name} changed"
        for name, out in outputs.items():
            assert out.guard_damage() == 0, f"{where}: a write outside buffer {name}"
            left = out.unwritten()
            assert name in plan.aliases or left == 0, f"{where}: {name} not fully written ({left} elements)"
        return {name: out.view.copy() for name, out in outputs.items()}


class HostReplay(PlanRunner):
    """A PlanRunner whose launches call `call(launch)` in place of a kernel: launch.args hold the
    buffers' device addresses and the numbers as Python values. What each call returned is kept in
    `returned` as (symbol, value): the path or mode the harness took."""

    def __init__(self, call):
        self.returned: list[tuple[str, object]] = []
        super().__init__(_Harness(call, self.returned))


class _Harness(EmuBackend):
    """Device memory as the emulator's (host memory); each launch a host harness call."""

    def __init__(self, call, returned: list):
        super().__init__()
        self.call, self.returned = call, returned

    def launch(self, ref, grid, block, shared_bytes, args):
        launch = Launch(ref.symbol, tuple(grid), tuple(block), tuple(a.item() for a in args), shared_bytes)
        self.returned.append((ref.symbol, self.call(launch)))


def emulator(max_grid: tuple[int, int] = (4, 4)) -> PlanRunner:
    """A PlanRunner on the emu backend, grids capped at `max_grid`; skips the test where no C++
    compiler is installed."""
    try:
        find_host_compiler()
    except EnvironmentMissing as exc:
        import pytest

        pytest.skip(str(exc))
    return PlanRunner(GridCappedEmu(max_grid))


def unwritten(y: np.ndarray) -> np.ndarray:
    """Elements still holding the sentinel (never written)."""
    return np.ascontiguousarray(y, np.float32).view(np.uint32) == SENTINEL
