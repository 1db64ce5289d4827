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

    # -- timing (bench) ---------------------------------------------------------------------

    def record_event(self, event=None):
        """A CUDA event recorded now on the default stream (a new one, or `event` again)."""
        with self._driver("event record"):
            event = event or self.drv.Event()
            event.record()
            return event

    def event_seconds(self, start, end) -> float:
        """Seconds from `start` to `end`, once `end` has happened (waits for it)."""
        with self._driver("event synchronize"):
            end.synchronize()
            return end.time_since(start) * 1e-3

    def free_bytes(self) -> int:
        free, _total = self.drv.mem_get_info()
        return int(free)

    def facts(self) -> dict:
        """What bench sizes its work by: the L2, the multiprocessors, the memory."""
        attribute = self.drv.device_attribute
        return {
            "l2_bytes": int(self.device.get_attribute(attribute.L2_CACHE_SIZE)),
            "multiprocessors": int(self.device.get_attribute(attribute.MULTIPROCESSOR_COUNT)),
            "total_bytes": int(self.device.total_memory()),
        }

    def release_context(self):
        """Make this context non-current, so that PyTorch and CuPy (which use the device's primary
        context) run next without touching it. PyCUDA work after this is not possible; the exit
        handler then finds nothing to pop."""
        try:
            self.context.synchronize()
            self.drv.Context.pop()
        except Exception:  # a poisoned context cannot synchronize; nothing more runs on it
            pass
