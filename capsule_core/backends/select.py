"""Which backend a command runs on: `auto` is cuda when PyCUDA imports and a device answers, else
the emulator when a host C++ compiler is there, else the numpy provider (design §3)."""

from __future__ import annotations

from capsule_core.errors import EnvironmentMissing

BACKENDS = ("auto", "cuda", "emu", "numpy")


def resolve(
    name: str,
    device: int = 0,
    emulate: bool = True,
    launch_timeout: float | None = None,
    emu_threads: int | None = None,
):
    """(backend, one line saying what was chosen and why). Raises EnvironmentMissing for an
    explicit `cuda` or `emu` that this machine cannot run. `emulate` False: auto never picks the
    emulator (bench: an emulator's time is no kernel timing). `launch_timeout`: the emulator's
    watchdog in seconds (None: CAPSULES_LAUNCH_TIMEOUT or its default); `emu_threads`: the OS
    threads that run a launch's blocks (None: CAPSULES_EMU_THREADS, else every usable core)."""
    from capsule_core.backends.numpy_f32 import NumpyBackend

    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r} (backends: {', '.join(BACKENDS)})")
    if name == "numpy":
        return NumpyBackend(), "backend numpy: the numpy float32 provider on the CPU (no kernel runs)"
    if name == "emu":
        backend = _emulator(launch_timeout, emu_threads)
        return backend, f"backend emu: {backend.description}"
    from capsule_core.backends import cuda

    probe = cuda.probe()
    if probe.problem is None and device < len(probe.devices):
        gpu = probe.devices[device]
        return cuda.CudaBackend(device), f"backend cuda: #{gpu.index} {gpu.name} (sm {gpu.compute_capability})"
    problem = probe.problem or f"--device {device}: only {len(probe.devices)} device(s) here"
    if name == "cuda":
        raise EnvironmentMissing(f"--backend cuda needs a GPU: {problem}")
    if not emulate:
        return NumpyBackend(), f"backend auto -> numpy: no GPU here ({problem})"
    try:
        backend = _emulator(launch_timeout, emu_threads)
    except EnvironmentMissing as exc:
        return NumpyBackend(), f"backend auto -> numpy: no GPU here ({problem}) and no emulator ({exc})"
    return backend, f"backend auto -> emu: no GPU here ({problem}); the kernels run on the {backend.description}"


def _emulator(launch_timeout: float | None = None, emu_threads: int | None = None):
    from capsule_core.backends.emu import EmuBackend

    return EmuBackend(launch_timeout=launch_timeout, threads=emu_threads)
