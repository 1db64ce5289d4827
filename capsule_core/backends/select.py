"""Which backend a command runs on: `auto` is cuda when PyCUDA imports and a device answers,
else the numpy provider."""

from __future__ import annotations

from ..errors import EnvironmentMissing


def resolve(name: str, device: int = 0):
    """(backend, one line saying what was chosen and why). Raises EnvironmentMissing for an
    explicit `cuda` that this machine cannot run."""
    from ..execution import NumpyBackend
    if name == "numpy":
        return NumpyBackend(), "backend numpy: the numpy float32 provider on the CPU"
    from . import cuda
    probe = cuda.probe()
    if probe.problem is None and device < len(probe.devices):
        gpu = probe.devices[device]
        return cuda.CudaBackend(device), f"backend cuda: #{gpu.index} {gpu.name} (sm {gpu.compute_capability})"
    problem = probe.problem or f"--device {device}: only {len(probe.devices)} device(s) here"
    if name == "cuda":
        raise EnvironmentMissing(f"--backend cuda needs a GPU: {problem}")
    return NumpyBackend(), f"backend auto -> numpy: no GPU here ({problem})"
