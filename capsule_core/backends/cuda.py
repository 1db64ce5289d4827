"""The PyCUDA backend: the only module that imports pycuda.

A context on the chosen device; cubins from the nvcc layer loaded with module_from_buffer; each
entry point prepared from the registry's declared C parameters (so a launch can only pass what
the registry declares); device buffers for every buffer of a launch plan, outputs inside guard
bands (capsule_core.backends.device: the execution path it shares with the emulator); CUDA
events for timing.
"""

from __future__ import annotations

import atexit
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from capsule_core.backends.device import DeviceBackend
from capsule_core.errors import CapsuleError, EnvironmentMissing
from capsule_core.kernels.c_types import C_TYPES


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    compute_capability: str
    memory_gib: float


@dataclass(frozen=True)
class CudaProbe:
    """What PyCUDA sees: its version, the driver, the devices; `problem` says what is missing."""

    pycuda_version: str | None
    driver_version: str | None
    devices: tuple[GpuInfo, ...]
    problem: str | None


def probe() -> CudaProbe:
    try:
        import pycuda
        import pycuda.driver as drv
    except ImportError as exc:
        return CudaProbe(None, None, (), f"pycuda does not import ({exc}); install the gpu extra: pip install '.[gpu]'")
    version = getattr(pycuda, "VERSION_TEXT", None)
    try:
        drv.init()
        driver = drv.get_driver_version()
        devices = []
        for i in range(drv.Device.count()):
            d = drv.Device(i)
            major, minor = d.compute_capability()
            devices.append(GpuInfo(i, d.name(), f"{major}.{minor}", d.total_memory() / 2**30))
    except Exception as exc:  # pycuda raises its own LogicError/RuntimeError types without a driver
        return CudaProbe(version, None, (), f"no usable CUDA driver: {exc}")
    driver_text = f"{driver // 1000}.{driver % 1000 // 10}"
    if not devices:
        return CudaProbe(version, driver_text, (), "the CUDA driver sees no device")
    return CudaProbe(version, driver_text, tuple(devices), None)


@dataclass(frozen=True)
class GpuProperties:
    """What `capsules plan` needs of a GPU: its SM count and the clocks behind its nominal peaks."""

    multiprocessors: int
    clock_mhz: float
    memory_clock_mhz: float
    memory_bus_bits: int


def gpu_properties(index: int) -> GpuProperties:
    """The properties of a GPU that probe() found (EnvironmentMissing if the driver will not say)."""
    import pycuda.driver as drv

    try:
        drv.init()
        d, a = drv.Device(index), drv.device_attribute
        return GpuProperties(
            d.get_attribute(a.MULTIPROCESSOR_COUNT),
            d.get_attribute(a.CLOCK_RATE) / 1e3,
            d.get_attribute(a.MEMORY_CLOCK_RATE) / 1e3,
            d.get_attribute(a.GLOBAL_MEMORY_BUS_WIDTH),
        )
    except Exception as exc:  # pycuda raises its own LogicError/RuntimeError types
        raise EnvironmentMissing(f"cannot read GPU {index}'s properties: {exc}") from exc


class LaunchFailed(CapsuleError):
    """A kernel launch or synchronisation failed: the CUDA context is poisoned, nothing more can
    run in this process (verify --isolate runs each capsule in its own)."""

    poisoned = True


class CudaBackend(DeviceBackend):
    """Runs launch plans on one GPU: the device calls of DeviceBackend through PyCUDA."""

    name = "cuda"

    def __init__(self, device: int = 0):
        super().__init__()
        import pycuda.driver as drv

        self.drv = drv
        try:
            drv.init()
            self.device = drv.Device(device)
            self.context = self.device.make_context()
        except Exception as exc:
            raise EnvironmentMissing(f"--device {device}: cannot open a CUDA context: {exc}") from exc
        atexit.register(self._close)
        major, minor = self.device.compute_capability()
        self.arch = f"sm_{major}{minor}"
        self.description = f"{self.device.name()} ({self.arch})"
        self._modules: dict = {}
        self._functions: dict = {}
        self._allocations: dict = {}

    def _close(self):
        try:
            self.context.pop()
        except Exception:
            pass

    @contextmanager
    def _driver(self, what: str):
        """Driver errors as the library's: out of memory is the environment, any other failure
        poisons the context (LaunchFailed)."""
        drv = self.drv
        try:
            yield
        except drv.MemoryError as exc:
            raise EnvironmentMissing(f"out of GPU memory ({what}): {exc}") from exc
        except (drv.LaunchError, drv.LogicError, drv.RuntimeError) as exc:
            raise LaunchFailed(f"{what}: {exc}") from exc

    # -- kernels ---------------------------------------------------------------------------

    def function(self, ref):
        """The prepared entry point of a NativeSymbolRef (compiled and loaded once)."""
        from capsule_core.kernels.launch import parse_param
        from capsule_core.kernels.nvcc import compile_file, source_path

        key = (ref.path, ref.symbol)
        if key not in self._functions:
            compiled = compile_file(source_path(ref.path), self.arch, build=ref.build)
            if ref.path not in self._modules:
                self._modules[ref.path] = self.drv.module_from_buffer(compiled.cubin)
            fn = self._modules[ref.path].get_function(compiled.entry_name(ref) or ref.symbol)
            params = [parse_param(p) for p in ref.params]
            fn.prepare("".join("P" if p.pointer else C_TYPES[p.ctype].prepare for p in params))
            self._functions[key] = (fn, params)
        return self._functions[key]

    # -- the device interface --------------------------------------------------------------

    def allocate(self, nbytes: int) -> int:
        with self._driver(f"allocating {nbytes} bytes"):
            allocation = self.drv.mem_alloc(max(int(nbytes), 16))
        self._allocations[int(allocation)] = allocation
        return int(allocation)

    def free(self, address: int):
        allocation = self._allocations.pop(address, None)
        if allocation is not None:
            try:
                allocation.free()
            except Exception:  # a poisoned context cannot free; the process ends soon after
                pass

    def upload(self, address: int, data: np.ndarray):
        with self._driver("copy to the device"):
            self.drv.memcpy_htod(address, data)

    def download(self, data: np.ndarray, address: int):
        with self._driver("copy from the device"):
            self.drv.memcpy_dtoh(data, address)

    def launch(self, ref, grid, block, shared_bytes, args):
        with self._driver(f"launch of {ref.symbol}"):
            fn, _ = self.function(ref)
            if shared_bytes > 48 * 1024:
                fn.set_attribute(self.drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_bytes)
            fn.prepared_call(tuple(grid), tuple(block), *args, shared_size=shared_bytes)

    def synchronize(self):
        with self._driver("synchronize"):
            self.context.synchronize()

    def memset32(self, address: int, word: int, words: int):
        with self._driver("memset"):
            self.drv.memset_d32(address, word, words)

    def copy(self, destination: int, source: int, nbytes: int):
        with self._driver("device-to-device copy"):
            self.drv.memcpy_dtod(destination, source, nbytes)


# -- bench: timing on the device ------------------------------------------------------------
#
# Triton's do_bench with its holes closed: buffers allocated and uploaded once, one event pair
# per call, the batch enqueued behind a spin kernel (so the pairs time the GPU, not the host's
# launch gaps), the L2 flushed outside the pair by a write of a scratch buffer sized from the
# device's L2 (--cold), one synchronisation per batch. The engine (capsule_core.bench.engine) decides
# how many calls to make; everything here returns seconds per call.

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


class DeviceTimer:
    """Timing on the backend's GPU: flush buffer, event pool, spin kernel, device facts."""

    timer = "cuda events"

    def __init__(self, backend: CudaBackend):
        self.backend = backend
        self.drv = drv = backend.drv
        attribute = drv.device_attribute
        self.l2_bytes = int(backend.device.get_attribute(attribute.L2_CACHE_SIZE))
        self.multiprocessors = int(backend.device.get_attribute(attribute.MULTIPROCESSOR_COUNT))
        self.description = backend.description
        self.total_bytes = int(backend.device.total_memory())
        self._events: list = []
        self._scratch = None
        self._module = None
        self._spin = None
        self._released = False

    # -- device facts ------------------------------------------------------------------------

    def free_bytes(self) -> int:
        free, _total = self.drv.mem_get_info()
        return int(free)

    @property
    def flush_bytes(self) -> int:
        """Twice the L2 (at least 8 MiB): written between calls, it leaves nothing of the last call."""
        return max(2 * self.l2_bytes, 8 << 20)

    # -- the pieces of a timed batch ----------------------------------------------------------

    def _peak_module(self):
        if self._module is None:
            from capsule_core.kernels.nvcc import compile_file, source_path

            compiled = compile_file(source_path("cuda/peak.cu"), self.backend.arch)
            self._module = self.drv.module_from_buffer(compiled.cubin)
        return self._module

    def _spin_function(self):
        """The spin kernel, or False when it cannot be loaded (then batches run without it)."""
        if self._spin is None:
            try:
                fn = self._peak_module().get_function("capsule_bench_spin")
                fn.prepare("q")
                self._spin = fn
            except Exception:  # no nvcc here, or the module does not load: time without the guard
                self._spin = False
        return self._spin

    def spin(self, seconds: float) -> bool:
        fn = self._spin_function()
        if not fn or seconds <= 0:
            return False
        fn.prepared_call((1, 1, 1), (1, 1, 1), np.int64(int(min(seconds, SPIN_SECONDS_MAX) * 1e9)))
        return True

    def flush(self):
        """Overwrite a scratch buffer of flush_bytes: issued before a call's start event, untimed."""
        if self._scratch is None:
            try:
                self._scratch = self.drv.mem_alloc(self.flush_bytes)
            except self.drv.MemoryError as exc:
                raise MemoryError(f"no device memory for the {self.flush_bytes} byte L2 flush buffer: {exc}") from exc
        self.drv.memset_d32_async(int(self._scratch), 0, self.flush_bytes // 4)

    def events(self, n: int) -> list:
        while len(self._events) < n:
            self._events.append((self.drv.Event(), self.drv.Event()))
        return self._events[:n]

    def time_calls(self, enqueue, n: int, cold: bool, enqueue_estimate_s: float) -> tuple[list[float], float, bool]:
        """Run `enqueue` n times, each between its own event pair; returns (seconds per call,
        host seconds spent enqueueing per call, whether the spin guard ran)."""
        import time

        drv = self.drv
        pairs = self.events(n)
        try:
            guarded = self.spin(1.5 * n * enqueue_estimate_s + 2e-4)
            t0 = time.perf_counter()
            for start, end in pairs:
                if cold:
                    self.flush()
                start.record()
                enqueue()
                end.record()
            host = (time.perf_counter() - t0) / n
            pairs[-1][1].synchronize()
            return [end.time_since(start) * 1e-3 for start, end in pairs], host, guarded
        except drv.MemoryError as exc:
            raise MemoryError(f"out of GPU memory: {exc}") from exc
        except (drv.LaunchError, drv.LogicError, drv.RuntimeError) as exc:
            raise LaunchFailed(f"timed launch failed: {exc}") from exc

    # -- what bench times ----------------------------------------------------------------------

    def plan_target(self, capsule, plan, host: dict) -> "TimedPlan":
        return TimedPlan(self, capsule, plan, host)

    def copy_target(self, nbytes: int) -> "TimedCopy":
        return TimedCopy(self, nbytes)

    def fma_target(self) -> "TimedFma":
        return TimedFma(self)

    def release(self):
        """Free the scratch buffer and make this context non-current, so that PyTorch and CuPy
        (which use the device's primary context) run next without touching it. PyCUDA work
        after this is not possible; the backend's exit handler then finds nothing to pop."""
        if self._released:
            return
        self._released = True
        if self._scratch is not None:
            try:
                self._scratch.free()
            except Exception:
                pass
            self._scratch = None
        try:
            self.backend.context.synchronize()
            self.drv.Context.pop()
        except Exception:
            pass


class _Timed:
    """Common part of a timed target: run(n, cold) -> seconds per call; close()."""

    max_batch = MAX_BATCH

    def __init__(self, timer: DeviceTimer):
        self.timer = timer
        self.enqueue_s = ENQUEUE_GUESS_S
        self.guarded = False
        self._allocations: list = []

    @property
    def timer_name(self) -> str:
        return self.timer.timer

    def _alloc(self, nbytes: int):
        drv = self.timer.drv
        try:
            a = drv.mem_alloc(max(int(nbytes), 16))
        except drv.MemoryError as exc:
            self.close()
            raise MemoryError(
                f"out of GPU memory allocating {int(nbytes)} bytes ({self.timer.free_bytes()} free): {exc}"
            ) from exc
        self._allocations.append(a)
        return a

    def _enqueue(self):
        raise NotImplementedError

    def run(self, n: int, cold: bool) -> list[float]:
        times, host, guarded = self.timer.time_calls(self._enqueue, n, cold, self.enqueue_s)
        self.enqueue_s, self.guarded = host, guarded
        return times

    def close(self):
        for a in self._allocations:
            try:
                a.free()
            except Exception:
                pass
        self._allocations = []


class TimedPlan(_Timed):
    """A launch plan staged once by the backend (DeviceBackend.stage: the same allocation, upload
    and argument typing as verify's run); each timed call makes all its launches through the
    backend's own launch."""

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
    """cuMemcpyDtoDAsync of nbytes: moves 2 * nbytes through device memory per call."""

    def __init__(self, timer: DeviceTimer, nbytes: int):
        super().__init__(timer)
        self.nbytes = int(nbytes) // 16 * 16
        self.src = self._alloc(self.nbytes)
        self.dst = self._alloc(self.nbytes)
        timer.drv.memset_d32(int(self.src), 0x3F800000, self.nbytes // 4)  # 1.0f: never time zeros

    @property
    def bytes_moved(self) -> int:
        return 2 * self.nbytes

    def _enqueue(self):
        self.timer.drv.memcpy_dtod_async(int(self.dst), int(self.src), self.nbytes)


class TimedFma(_Timed):
    """capsule_peak_fma over one full wave of the device (2048 threads per multiprocessor)."""

    BLOCK = 256

    def __init__(self, timer: DeviceTimer):
        super().__init__(timer)
        self.fn = timer._peak_module().get_function("capsule_peak_fma")
        self.fn.prepare("Pffq")
        self.grid = (timer.multiprocessors * (2048 // self.BLOCK), 1, 1)
        self.out = self._alloc(self.grid[0] * self.BLOCK * 4)
        self.iterations = PEAK_ITERATIONS

    @property
    def flops(self) -> int:
        return 2 * PEAK_CHAINS * self.iterations * self.grid[0] * self.BLOCK

    def _enqueue(self):
        self.fn.prepared_call(
            self.grid,
            (self.BLOCK, 1, 1),
            np.uintp(int(self.out)),
            np.float32(0.9999999),
            np.float32(1e-7),
            np.int64(self.iterations),
        )
