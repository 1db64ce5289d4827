"""The PyCUDA backend: the only module that imports pycuda.

A context on the chosen device; cubins from the nvcc layer loaded with module_from_buffer; each
entry point prepared from the registry's declared C parameters (so a launch can only pass what
the registry declares); device buffers for every buffer of a launch plan, outputs inside guard
bands (capsule_core.execution); upload, launches, download; CUDA events for timing.
"""

from __future__ import annotations

import atexit
from dataclasses import dataclass

import numpy as np

from ..errors import CapsuleError, EnvironmentMissing
from ..execution import GUARD_ELEMENTS, GuardedOutput, Run


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


class LaunchFailed(CapsuleError):
    """A kernel launch or synchronisation failed: the CUDA context is poisoned, nothing more can
    run in this process (verify --isolate runs each capsule in its own)."""

    poisoned = True


PREPARE_FORMAT = {"float": "f", "int32_t": "i", "int64_t": "q", "uint64_t": "Q"}
SCALAR_TYPES = {"float": np.float32, "int32_t": np.int32, "int64_t": np.int64, "uint64_t": np.uint64}
DTYPES = {"float32": np.float32, "int64": np.int64}


class CudaBackend:
    """Runs launch plans on one GPU."""

    name = "cuda"

    def __init__(self, device: int = 0):
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
        self.launch_count = 0
        self._modules: dict = {}
        self._functions: dict = {}

    def _close(self):
        try:
            self.context.pop()
        except Exception:
            pass

    # -- kernels ---------------------------------------------------------------------------

    def function(self, ref):
        """The prepared entry point of a NativeSymbolRef (compiled and loaded once)."""
        from ..kernels import compile_file, source_path
        from ..launch import parse_param
        if ref.symbol not in self._functions:
            if ref.path not in self._modules:
                compiled = compile_file(source_path(ref.path), self.arch)
                self._modules[ref.path] = self.drv.module_from_buffer(compiled.cubin)
            fn = self._modules[ref.path].get_function(ref.symbol)
            params = [parse_param(p) for p in ref.params]
            fn.prepare("".join("P" if p.pointer else PREPARE_FORMAT[p.ctype] for p in params))
            self._functions[ref.symbol] = (fn, params)
        return self._functions[ref.symbol]

    # -- execution -------------------------------------------------------------------------

    def execute(self, capsule, plan, host: dict, outputs: dict) -> dict:
        """Allocate every buffer of `plan`, upload `host` inputs and meta data, launch in order,
        download the guarded outputs in place; returns the input buffers read back."""
        drv = self.drv
        symbols = {r.symbol: r for r in capsule.symbols}
        allocations, pointers = [], {}

        def alloc(nbytes):
            a = drv.mem_alloc(max(int(nbytes), 16))
            allocations.append(a)
            return a
        try:
            for b in plan.buffers:
                if b.role == "output":
                    guarded = outputs[b.name]
                    a = alloc(guarded.full.nbytes)
                    drv.memcpy_htod(a, guarded.full)
                    pointers[b.name] = int(a) + 4 * GUARD_ELEMENTS
                elif b.role in ("input", "meta"):
                    data = plan.host_data[b.name] if b.role == "meta" else host[b.name]
                    data = np.ascontiguousarray(data, dtype=DTYPES[b.dtype]).reshape(-1)
                    a = alloc(data.nbytes)
                    if data.size:
                        drv.memcpy_htod(a, data)
                    pointers[b.name] = int(a)
                else:
                    a = alloc(b.elements * np.dtype(DTYPES[b.dtype]).itemsize)
                    pointers[b.name] = int(a)
            for launch in plan.launches:
                fn, params = self.function(symbols[launch.symbol])
                args = [np.uintp(pointers[a]) if p.pointer else SCALAR_TYPES[p.ctype](a) for p, a in zip(params, launch.args)]
                if launch.shared_bytes > 48 * 1024:
                    fn.set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, launch.shared_bytes)
                self.launch_count += 1
                fn.prepared_call(launch.grid, launch.block, *args, shared_size=launch.shared_bytes)
            self.context.synchronize()
            for b in plan.buffers:
                if b.role == "output":
                    guarded = outputs[b.name]
                    base = pointers[b.name] - 4 * GUARD_ELEMENTS
                    drv.memcpy_dtoh(guarded.full, base)
            after = {}
            for b in plan.buffers:
                if b.role == "input":
                    data = np.empty(np.asarray(host[b.name]).shape, DTYPES[b.dtype])
                    if data.size:
                        drv.memcpy_dtoh(data, pointers[b.name])
                    after[b.name] = data
            return after
        except drv.MemoryError as exc:
            raise EnvironmentMissing(f"out of GPU memory for {plan.op} {plan.direction}: {exc}") from exc
        except (drv.LaunchError, drv.LogicError, drv.RuntimeError) as exc:
            raise LaunchFailed(f"{plan.op} {plan.direction}: {exc}") from exc
        finally:
            for a in allocations:
                try:
                    a.free()
                except Exception:
                    pass

    def _plans(self, spec):
        from ..launch import plan_functions
        from ..registry import lookup
        capsule = lookup(spec.name)
        functions = plan_functions(capsule)
        if functions is None:
            raise CapsuleError(f"{spec.name}: no launch plan (its kernels are not written yet)")
        return capsule, functions

    def forward(self, spec, inputs, params, out: GuardedOutput) -> Run:
        from ..ops.base import validate
        arrays, p, _ = validate(spec, inputs, params, np.float32)
        capsule, (forward_plan, _) = self._plans(spec)
        plan = forward_plan(arrays, p)
        before = self.launch_count
        after = self.execute(capsule, plan, _flat_inputs(arrays), {"out": out})
        return Run(_unflatten(after, inputs), self.launch_count - before)

    def backward(self, spec, inputs, params, g, grads) -> Run:
        from ..ops.base import validate
        arrays, p, out_shape = validate(spec, inputs, params, np.float32)
        capsule, (forward_plan, backward_plan) = self._plans(spec)
        before = self.launch_count
        host = _flat_inputs(arrays)
        host["g"] = np.ascontiguousarray(g, dtype=np.float32)
        plan = backward_plan(arrays, p)
        if any(b.name == "out" and b.role == "input" for b in plan.buffers):
            y = GuardedOutput(out_shape)
            self.execute(capsule, forward_plan(arrays, p), _flat_inputs(arrays), {"out": y})
            host["out"] = y.view.copy()
        outputs = {}
        for name, target in grads.items():
            if isinstance(target, tuple):
                outputs.update({f"d{name}[{i}]": t for i, t in enumerate(target)})
            else:
                outputs[f"d{name}"] = target
        after = self.execute(capsule, plan, host, outputs)
        result = _unflatten(after, inputs)
        result["g"] = after.get("g", host["g"])
        return Run(result, self.launch_count - before)

    # -- timing ----------------------------------------------------------------------------

    def event_pair(self):
        """Two CUDA events for timing a region (start.record(); ...; end.record(); end.synchronize())."""
        return self.drv.Event(), self.drv.Event()


def _flat_inputs(arrays: dict) -> dict:
    """Plan buffer names of the inputs: a variadic input xs becomes xs[0], xs[1], ..."""
    flat = {}
    for name, value in arrays.items():
        if isinstance(value, tuple):
            flat.update({f"{name}[{i}]": v for i, v in enumerate(value)})
        else:
            flat[name] = value
    return flat


def _unflatten(after: dict, inputs: dict) -> dict:
    out = {}
    for name, value in inputs.items():
        if isinstance(value, (tuple, list)):
            out[name] = tuple(after.get(f"{name}[{i}]", v) for i, v in enumerate(value))
        else:
            out[name] = after.get(name, value)
    return out
