"""The numpy float32 provider: the reference code run in float32, behind the same API.

It rounds and sums differently from the float64 reference, which is the point: it is the first
honest test of the tolerance models, and the CPU stand-in for the GPU in verify.
"""

from __future__ import annotations

from capsule_core.backends.execution import BackendRun
from capsule_core.catalog.cpu_providers import NUMPY_F32


def forward(op: str, inputs: dict, **params):
    return NUMPY_F32.forward(op, inputs, **params)


def vjp(op: str, inputs: dict, cotangent, **params) -> dict:
    return NUMPY_F32.vjp(op, inputs, cotangent, **params)


class NumpyBackend:
    """The numpy float32 provider behind the Backend interface: the CPU stand-in for the GPU."""

    name = "numpy"
    description = "numpy float32 provider (CPU)"

    def __init__(self, provider=None):
        self.provider = provider or NUMPY_F32

    def forward(self, spec, inputs, params, out):
        y = self.provider.forward(spec, inputs, **params)
        out.view[...] = y
        return BackendRun(inputs, 1)

    def backward(self, spec, inputs, params, g, grads):
        result = self.provider.vjp(spec, inputs, g, **params)
        for name, target in grads.items():
            if isinstance(target, tuple):
                for t, r in zip(target, result[name]):
                    t.view[...] = r
            else:
                target.view[...] = result[name]
        return BackendRun(inputs, 1)
