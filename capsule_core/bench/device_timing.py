"""bench's timing on a GPU, through the device backend's own calls (allocate, memset32, copy,
launch, free, and its events): timing wraps the launches verify makes, it does not re-implement them.

Triton's do_bench with its holes closed: buffers allocated and uploaded once, one event pair per
call, the batch enqueued behind a spin kernel (so the pairs time the GPU, not the host's launch
gaps), the L2 flushed outside the pair by a write of a scratch buffer sized from the device's L2
(--cold), one synchronisation per batch. The engine (capsule_core.bench.engine) decides how many
calls to make; everything here returns seconds per call.
"""

from __future__ import annotations

import time

import numpy as np

from capsule_core.errors import CapsuleError, EnvironmentMissing
from capsule_core.model import NativeSymbolRef

SPIN_SECONDS_MAX = 0.05
"""Longest spin before a batch; the engine keeps batches short enough for it to cover them."""
ENQUEUE_GUESS_S = 50e-6
"""Host time to enqueue one timed call (events, launches) before it has been measured."""
MAX_BATCH = 64
"""Calls per batch: each enqueues up to five commands, well inside the driver's launch queue."""
PEAK_ITERATIONS = 16384
"""FMA loop trips per thread of capsule_peak_fma: about a millisecond on an H100-class GPU."""
PEAK_CHAINS = 8
"""Independent fmaf chains per thread (cuda/peak.cu)."""

SPIN = NativeSymbolRef("cuda/peak.cu", "capsule_bench_spin", ("int64_t ns",))
PEAK_FMA = NativeSymbolRef(
    "cuda/peak.cu", "capsule_peak_fma", ("float* __restrict__ out", "float a", "float b", "int64_t iterations")
)


class DeviceTimer:
    """Timing on the backend's GPU: flush buffer, event pool, spin kernel, device facts."""

    timer = "cuda events"

    def __init__(self, backend):
        self.backend = backend
        facts = backend.facts()
        self.l2_bytes = facts["l2_bytes"]
        self.multiprocessors = facts["multiprocessors"]
        self.total_bytes = facts["total_bytes"]
        self.description = backend.description
        self._events: list = []
        self._scratch: int | None = None
        self._spin: bool | None = None
        self._released = False

    def free_bytes(self) -> int:
        return self.backend.free_bytes()

    @property
    def flush_bytes(self) -> int:
        """Twice the L2 (at least 8 MiB): written between calls, it leaves nothing of the last call."""
        return max(2 * self.l2_bytes, 8 << 20)

    def allocate(self, nbytes: int) -> int:
        try:
            return self.backend.allocate(nbytes)
        except EnvironmentMissing as exc:  # the backend's out of GPU memory
            raise MemoryError(f"out of GPU memory allocating {int(nbytes)} bytes ({self.free_bytes()} free): {exc}")

    # -- the pieces of a timed batch ----------------------------------------------------------

    def spin(self, seconds: float) -> bool:
        """The spin kernel ahead of a batch; False when it cannot be built or loaded here (then
        batches run without the guard)."""
        if self._spin is False or seconds <= 0:
            return False
        try:
            ns = np.int64(int(min(seconds, SPIN_SECONDS_MAX) * 1e9))
            self.backend.launch(SPIN, (1, 1, 1), (1, 1, 1), 0, [ns])
        except CapsuleError as exc:  # no nvcc here, or peak.cu does not build: time without the guard
            if getattr(exc, "poisoned", False):
                raise
            self._spin = False
            return False
        self._spin = True
        return True

    def flush(self):
        """Overwrite a scratch buffer of flush_bytes: issued before a call's start event, untimed."""
        if self._scratch is None:
            self._scratch = self.allocate(self.flush_bytes)
        self.backend.memset32(self._scratch, 0, self.flush_bytes // 4)

    def time_calls(self, enqueue, n: int, cold: bool, enqueue_estimate_s: float) -> tuple[list[float], float, bool]:
        """Run `enqueue` n times, each between its own event pair; returns (seconds per call,
        host seconds spent enqueueing per call, whether the spin guard ran)."""
        while len(self._events) < n:
            self._events.append([None, None])
        pairs = self._events[:n]
        guarded = self.spin(1.5 * n * enqueue_estimate_s + 2e-4)
        t0 = time.perf_counter()
        for pair in pairs:
            if cold:
                self.flush()
            pair[0] = self.backend.record_event(pair[0])
            enqueue()
            pair[1] = self.backend.record_event(pair[1])
        host = (time.perf_counter() - t0) / n
        return [self.backend.event_seconds(start, end) for start, end in pairs], host, guarded

    # -- what bench times ----------------------------------------------------------------------

    def plan_target(self, capsule, plan, host: dict) -> TimedPlan:
        return TimedPlan(self, capsule, plan, host)

    def copy_target(self, nbytes: int) -> TimedCopy:
        return TimedCopy(self, nbytes)

    def fma_target(self) -> TimedFma:
        return TimedFma(self)

    def release(self):
        """Free the scratch buffer and hand the GPU to the next library (the backend's context is
        made non-current)."""
        if self._released:
            return
        self._released = True
        if self._scratch is not None:
            self.backend.free(self._scratch)
            self._scratch = None
        self.backend.release_context()


class _Timed:
    """Common part of a timed target: run(n, cold) -> seconds per call; close()."""

    max_batch = MAX_BATCH

    def __init__(self, timer: DeviceTimer):
        self.timer = timer
        self.enqueue_s = ENQUEUE_GUESS_S
        self.guarded = False
        self._allocations: list[int] = []

    @property
    def timer_name(self) -> str:
        return self.timer.timer

    def _alloc(self, nbytes: int) -> int:
        try:
            address = self.timer.allocate(nbytes)
        except MemoryError:
            self.close()
            raise
        self._allocations.append(address)
        return address

    def _enqueue(self):
        raise NotImplementedError

    def run(self, n: int, cold: bool) -> list[float]:
        times, host, guarded = self.timer.time_calls(self._enqueue, n, cold, self.enqueue_s)
        self.enqueue_s, self.guarded = host, guarded
        return times

    def close(self):
        for address in self._allocations:
            self.timer.backend.free(address)
        self._allocations = []


class TimedPlan(_Timed):
    """A launch plan staged once by the backend (DeviceBackend.stage: the same allocation, upload
    and argument typing as verify's run); each timed call makes all its steps through the
    backend's own calls."""

    def __init__(self, timer: DeviceTimer, capsule, plan, host: dict):
        super().__init__(timer)
        self.backend = timer.backend
        needed = sum(b.nbytes for b in plan.buffers if b.name not in plan.aliases)
        free = timer.free_bytes()
        if needed > 0.9 * free:
            raise MemoryError(f"needs {needed} bytes of GPU memory for its buffers, {free} free")
        try:
            self.staged = self.backend.stage(capsule, plan, host)
        except EnvironmentMissing as exc:  # the backend's out of GPU memory
            raise MemoryError(f"{plan.op}: {exc}") from exc

    def _enqueue(self):
        for step in self.staged.launches:
            self.backend.step(step)

    def close(self):
        self.backend.release(self.staged)
        super().close()


class TimedCopy(_Timed):
    """A device-to-device copy of nbytes (cuMemcpyDtoD): moves 2 * nbytes through device memory per call."""

    def __init__(self, timer: DeviceTimer, nbytes: int):
        super().__init__(timer)
        self.nbytes = int(nbytes) // 16 * 16
        self.src = self._alloc(self.nbytes)
        self.dst = self._alloc(self.nbytes)
        timer.backend.memset32(self.src, 0x3F800000, self.nbytes // 4)  # 1.0f: never time zeros

    @property
    def bytes_moved(self) -> int:
        return 2 * self.nbytes

    def _enqueue(self):
        self.timer.backend.copy(self.dst, self.src, self.nbytes)


class TimedFma(_Timed):
    """capsule_peak_fma over one full wave of the device (2048 threads per multiprocessor)."""

    BLOCK = 256

    def __init__(self, timer: DeviceTimer):
        super().__init__(timer)
        self.grid = (timer.multiprocessors * (2048 // self.BLOCK), 1, 1)
        self.out = self._alloc(self.grid[0] * self.BLOCK * 4)
        self.iterations = PEAK_ITERATIONS

    @property
    def flops(self) -> int:
        return 2 * PEAK_CHAINS * self.iterations * self.grid[0] * self.BLOCK

    def _enqueue(self):
        args = [np.uintp(self.out), np.float32(0.9999999), np.float32(1e-7), np.int64(self.iterations)]
        self.timer.backend.launch(PEAK_FMA, self.grid, (self.BLOCK, 1, 1), 0, args)
