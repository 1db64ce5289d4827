"""One execution path for the devices that run the kernels: the GPU (cuda) and the CPU emulator
(emu), design §8.

A device implements eight calls: allocate, upload, download, launch, memset32, copy, synchronize,
free. Everything above them is written once here: the plans of an op, guarded outputs (guard bands around a
NaN-sentinel view, capsule_core.backends.execution), inputs and host metadata uploaded, workspaces left
as the device gives them, every other buffer between guard bands too, every launch of the plan in
order, outputs and aliases downloaded, the inputs read back for `inputs.intact` and the bands for
`bounds`. So the emulator exercises every line of a GPU run except the driver calls themselves.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from capsule_core import activity
from capsule_core.backends.execution import GUARD, GUARD_ELEMENTS, BackendRun, GuardedOutput
from capsule_core.errors import CapsuleError
from capsule_core.kernels.c_types import BUFFER_DTYPES, scalar_argument
from capsule_core.kernels.launch import Copy, Memset, View, flat_buffers, parse_param


@dataclass(frozen=True)
class Executed:
    """What one plan's run left: its input buffers read back, and {buffer name: guard elements
    changed} for the inputs, meta data and workspaces a kernel wrote past."""

    inputs_after: dict
    overruns: dict


@dataclass
class Staged:
    """A launch plan on a device: its allocations, the device address of each buffer, the guard
    bands to examine, and each launch with its typed arguments."""

    plan: object
    allocations: list = field(default_factory=list)
    pointers: dict = field(default_factory=dict)
    bands: list = field(default_factory=list)
    launches: list = field(default_factory=list)
    """The steps in plan order: ("launch", NativeSymbolRef, Launch, typed arguments),
    ("memset", address, word, words) or ("copy", destination, source, bytes)."""


class DeviceBackend:
    """Runs launch plans on a device; subclasses implement the device calls."""

    name = "device"
    description = "a device"
    guard_bands = True
    """Outputs inside guard bands, pre-filled with the sentinel, and every other buffer between
    guard bands; False (a sanitizer's device): each buffer its own exact-size allocation, outputs
    left as the device gives them, the sanitizer the guard."""

    def __init__(self):
        self.launch_count = 0
        self.current_launch = ""
        """The launch in progress or last made, in words (its place in the plan, kernel, grid, block)."""

    # -- the device interface ------------------------------------------------------------------

    def allocate(self, nbytes: int) -> int:
        """A device allocation of at least `nbytes` (aligned to 256 bytes, like cudaMalloc); its address."""
        raise NotImplementedError

    def free(self, address: int):
        raise NotImplementedError

    def upload(self, address: int, data: np.ndarray):
        raise NotImplementedError

    def download(self, data: np.ndarray, address: int):
        """Fill the contiguous host array `data` from device memory at `address`."""
        raise NotImplementedError

    def launch(self, ref, grid: tuple, block: tuple, shared_bytes: int, args: list):
        """Launch entry point `ref` (a NativeSymbolRef); `args` are typed as its declared C parameters
        (device addresses as np.uintp, scalars as numpy scalars of the declared type)."""
        raise NotImplementedError

    def synchronize(self):
        raise NotImplementedError

    def memset32(self, address: int, word: int, words: int):
        """Set `words` 32-bit words at `address` to `word` (a plan's Memset step)."""
        raise NotImplementedError

    def copy(self, destination: int, source: int, nbytes: int):
        """Copy `nbytes` of device memory from `source` to `destination` (a plan's Copy step)."""
        raise NotImplementedError

    @contextmanager
    def other_schedule(self):
        """While the block runs, launches take another schedule of blocks and threads than
        before, where the device lets one choose (the emulator); determinism's second execution
        runs under it, so a result that depends on the schedule is caught. A GPU chooses its own."""
        yield

    def name_buffer(self, address: int, nbytes: int, name: str):
        """Plan buffer `name` occupies [address, address + nbytes): for naming a faulting access
        (the emulator); a device that cannot use it ignores it."""

    # -- plans ---------------------------------------------------------------------------------

    capsule = None
    """The capsule whose kernels run the ops it implements (bind); other ops run the capsule
    their name stands for (the built-in one)."""

    def bind(self, capsule) -> None:
        """Run `capsule`'s kernels for its op from now on (verify and fuzz bind the capsule they
        check: a library's softmax, not the built-in one)."""
        self.capsule = capsule

    def _plans(self, spec):
        from capsule_core.catalog.registry import lookup
        from capsule_core.kernels.launch import plan_functions

        bound = self.capsule
        capsule = bound if bound is not None and bound.op.value == spec.name else lookup(spec.name)
        functions = plan_functions(capsule)
        if functions is None:
            why = (
                "it declares no native kernel (a CPU reference capsule: --backend numpy runs it)"
                if not capsule.symbols
                else "its library declares no launch plan for it (its kernels are not written yet)"
            )
            raise CapsuleError(f"{capsule.name}: nothing to launch on {self.name}: {why}")
        return capsule, functions

    def execute(self, capsule, plan, host: dict, outputs: dict, misalign=None) -> Executed:
        """Stage `plan` (stage), launch in order (run), download the guarded outputs in place and
        read back the inputs and every other buffer's guard bands (collect), free everything."""
        staged = self.stage(capsule, plan, host, outputs, misalign)
        try:
            self.run(staged)
            return self.collect(staged, host, outputs)
        finally:
            self.release(staged)

    def stage(self, capsule, plan, host: dict, outputs: dict | None = None, misalign=None) -> Staged:
        """Allocate every buffer of `plan`, upload `host` inputs and meta data (and the guarded
        outputs' sentinels), and type every launch's arguments from its declared C parameters:
        what execute runs once and bench times many times. `outputs` None (bench): outputs are
        left as the device gives them. `misalign` starts buffers off alignment, as tensors that are
        views at an offset are: the elements each buffer starts past a 256-byte boundary of its
        allocation, {buffer name: elements} or a function of the Buffer (default 0)."""
        staged = Staged(plan)
        shift = misalign if callable(misalign) else (lambda b: (misalign or {}).get(b.name, 0))

        def alloc(nbytes, b, banded=True):
            lead = int(shift(b)) * b.itemsize
            band = GUARD_ELEMENTS * b.itemsize if banded and self.guard_bands else 0
            address = self.allocate(lead + int(nbytes) + 2 * band)
            staged.allocations.append(address)
            if band:
                pattern = np.full(band // 4, GUARD, dtype=np.uint32)
                self.upload(address + lead, pattern)
                self.upload(address + lead + band + int(nbytes), pattern)
                staged.bands.append((b, address + lead, int(nbytes), pattern))
            if banded:  # a guarded output names its view itself, not the guards around it
                self.name_buffer(address + lead + band, int(nbytes), b.name)
            return address + lead + band

        pointers = staged.pointers
        try:
            for b in plan.buffers:
                if b.name in plan.aliases:
                    continue
                if b.role == "output" and outputs is not None and self.guard_bands:
                    guarded = outputs[b.name]
                    address = alloc(guarded.full.nbytes, b, banded=False)
                    self.upload(address, guarded.full)
                    pointers[b.name] = address + 4 * GUARD_ELEMENTS
                    self.name_buffer(pointers[b.name], guarded.view.nbytes, b.name)
                elif b.role == "output" and outputs is not None:
                    pointers[b.name] = alloc(outputs[b.name].view.nbytes, b)
                elif b.role in ("input", "meta"):
                    data = plan.host_data[b.name] if b.role == "meta" else host[b.name]
                    data = np.ascontiguousarray(data, dtype=BUFFER_DTYPES[b.dtype]).reshape(-1)
                    address = alloc(data.nbytes, b)
                    if data.size:
                        self.upload(address, data)
                    pointers[b.name] = address
                else:
                    pointers[b.name] = alloc(b.nbytes, b)
            symbols = {r.symbol: r for r in capsule.symbols}
            buffers = {b.name: b for b in plan.buffers}

            def address(name: str, offset: int = 0, elements: int = 0) -> int:
                b = buffers[name]
                if not (0 <= offset and offset + elements <= b.elements):
                    raise CapsuleError(
                        f"{plan.op}: elements {offset}..{offset + elements} are outside buffer {name} "
                        f"({b.elements} elements)"
                    )
                return pointers[name] + offset * b.itemsize

            for step in plan.launches:
                if isinstance(step, Memset):
                    b = buffers[step.buffer]
                    word = (
                        int(np.array([step.value], BUFFER_DTYPES[b.dtype]).view(np.uint32)[0]) if b.itemsize == 4 else 0
                    )
                    staged.launches.append(("memset", address(b.name), word, b.nbytes // 4))
                elif isinstance(step, Copy):
                    nbytes = step.elements * buffers[step.src].itemsize
                    staged.launches.append(
                        (
                            "copy",
                            address(step.dst, step.dst_offset, step.elements),
                            address(step.src, step.src_offset, step.elements),
                            nbytes,
                        )
                    )
                else:
                    ref = symbols[step.symbol]
                    args = [
                        np.uintp(address(a.buffer, a.offset) if isinstance(a, View) else pointers[a])
                        if p.pointer
                        else scalar_argument(p.ctype, a)
                        for p, a in zip(map(parse_param, ref.params), step.args)
                    ]
                    staged.launches.append(("launch", ref, step, args))
        except BaseException:
            self.release(staged)
            raise
        return staged

    def run(self, staged: Staged) -> None:
        """Every step of a staged plan, in order, each launch recorded (current_launch, activity)
        so that a fault or a dead worker names it."""
        total = len(staged.launches)
        for index, step in enumerate(staged.launches, 1):
            if step[0] == "launch":
                launch = step[2]
                self.launch_count += 1
                self.current_launch = (
                    f"{index}/{total} of the plan: {launch.symbol} grid "
                    f"{'x'.join(map(str, launch.grid))} block {'x'.join(map(str, launch.block))}"
                )
                activity.launch_started(self.current_launch)
            self.step(step)
            activity.launch_ended()

    def step(self, step: tuple) -> None:
        """One staged step on the device: a launch, a memset or a copy."""
        if step[0] == "launch":
            _, ref, launch, args = step
            self.launch(ref, launch.grid, launch.block, launch.shared_bytes, args)
        elif step[0] == "memset":
            self.memset32(*step[1:])
        else:
            self.copy(*step[1:])

    def collect(self, staged: Staged, host: dict, outputs: dict) -> Executed:
        """After run: the outputs downloaded into their guarded buffers, the inputs read back, the
        guard bands of every other buffer examined."""
        plan, pointers = staged.plan, staged.pointers
        self.synchronize()
        for b in plan.buffers:
            if b.role == "output" and b.name not in plan.aliases:
                if self.guard_bands:
                    self.download(outputs[b.name].full, pointers[b.name] - 4 * GUARD_ELEMENTS)
                elif outputs[b.name].size:
                    self.download(outputs[b.name].view, pointers[b.name])
        for out, src in plan.aliases.items():
            view = outputs[out].view
            if view.size:
                self.download(view, pointers[src])
        after = {}
        for b in plan.buffers:
            if b.role == "input":
                data = np.empty(np.asarray(host[b.name]).shape, BUFFER_DTYPES[b.dtype])
                if data.size:
                    self.download(data, pointers[b.name])
                after[b.name] = data
        return Executed(after, _overruns(self, staged.bands))

    def release(self, staged: Staged) -> None:
        """Free a staged plan's allocations (once)."""
        allocations, staged.allocations = staged.allocations, []
        for address in allocations:
            self.free(address)

    def recompute_forward(self, capsule, plan, arrays: dict, out_shape) -> tuple[np.ndarray, dict]:
        """The forward output that a backward plan reads, run again on this device, and the
        overruns of that run."""
        y = GuardedOutput(out_shape)
        recomputed = self.execute(capsule, plan, flat_buffers(arrays), {"out": y})
        return y.view.copy(), recomputed.overruns

    def forward(self, spec, inputs, params, out: GuardedOutput) -> BackendRun:
        from capsule_core.ops.base import validate

        arrays, p, _ = validate(spec, inputs, params, np.float32)
        capsule, (forward_plan, _) = self._plans(spec)
        plan = forward_plan(arrays, p)
        before = self.launch_count
        executed = self.execute(capsule, plan, flat_buffers(arrays), {"out": out})
        return BackendRun(_unflatten(executed.inputs_after, inputs), self.launch_count - before, executed.overruns)

    def backward(self, spec, inputs, params, g, grads) -> BackendRun:
        from capsule_core.ops.base import validate

        arrays, p, out_shape = validate(spec, inputs, params, np.float32)
        capsule, (forward_plan, backward_plan) = self._plans(spec)
        before = self.launch_count
        host = flat_buffers(arrays)
        host["g"] = np.array(g, dtype=np.float32, order="C")  # ascontiguousarray would make a 0-d g 1-d
        plan = backward_plan(arrays, p)
        overruns = {}
        if any(b.name == "out" and b.role == "input" for b in plan.buffers):
            host["out"], recomputed = self.recompute_forward(capsule, forward_plan(arrays, p), arrays, out_shape)
            overruns = {f"{name} (forward recomputed)": n for name, n in recomputed.items()}
        executed = self.execute(capsule, plan, host, flat_buffers(grads, "d"))
        result = _unflatten(executed.inputs_after, inputs)
        result["g"] = executed.inputs_after.get("g", host["g"])
        return BackendRun(result, self.launch_count - before, {**overruns, **executed.overruns})


def _overruns(device: DeviceBackend, bands: list) -> dict:
    """{buffer name: elements of its guard bands that no longer hold the pattern}."""
    damage = {}
    for b, start, nbytes, pattern in bands:
        words = len(pattern)
        head, tail = np.empty_like(pattern), np.empty_like(pattern)
        device.download(head, start)
        device.download(tail, start + 4 * words + nbytes)
        per_element = b.itemsize // 4
        changed = np.concatenate([head != pattern, tail != pattern]).reshape(-1, per_element).any(axis=1)
        if changed.any():
            damage[b.name] = int(changed.sum())
    return damage


def _unflatten(after: dict, inputs: dict) -> dict:
    out = {}
    for name, value in inputs.items():
        if isinstance(value, (tuple, list)):
            out[name] = tuple(after.get(f"{name}[{i}]", v) for i, v in enumerate(value))
        else:
            out[name] = after.get(name, value)
    return out
