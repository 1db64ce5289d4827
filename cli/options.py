"""Option types shared by several commands (kept import-light: start-up reads this module)."""

from enum import Enum


class BackendOption(str, Enum):
    auto = "auto"
    cuda = "cuda"
    emu = "emu"
    numpy = "numpy"


class ArchOption(str, Enum):
    """The architectures the kernels are built for (capsule_core.kernels.ARCHES)."""

    sm_80 = "sm_80"
    sm_90 = "sm_90"
