"""capsules: native CUDA kernels made accountable. The library behind the `capsules` command."""

__version__ = "0.1.0"
