"""The PyCUDA backend: the only module that imports pycuda."""

from __future__ import annotations

from dataclasses import dataclass


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
