"""How verify runs an op on a backend: outputs in guard-banded, sentinel-filled buffers, inputs
handed over as copies and read back afterwards, so that `bounds` and `inputs.intact` can fail.

A backend writes each result into `GuardedOutput.view` (a window inside a larger allocation);
the bytes before and after it hold a guard pattern, the view itself a NaN sentinel pattern that
no kernel computes: a guard byte changed is a write out of bounds, a sentinel left is an element
never written. The numpy provider runs through the same interface, so its mutants can fail too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol

import numpy as np

from capsule_core.ops.base import OpSpec

SENTINEL = np.uint32(0x7FA5A5A5)
"""A signalling NaN with a payload no arithmetic produces: the mark of an unwritten element."""
GUARD = np.uint32(0x7FB6B6B6)
GUARD_ELEMENTS = 64
"""Guard band length on each side, in float32 elements (256 bytes: keeps the view 16-byte aligned)."""


@dataclass
class GuardedOutput:
    shape: tuple
    full: np.ndarray = field(init=False)

    def __post_init__(self):
        n = int(np.prod(self.shape, dtype=np.int64))
        bits = np.full(n + 2 * GUARD_ELEMENTS, GUARD, dtype=np.uint32)
        bits[GUARD_ELEMENTS : GUARD_ELEMENTS + n] = SENTINEL
        self.full = bits.view(np.float32)

    @property
    def size(self) -> int:
        return self.full.size - 2 * GUARD_ELEMENTS

    @property
    def view(self) -> np.ndarray:
        return self.full[GUARD_ELEMENTS : GUARD_ELEMENTS + self.size].reshape(self.shape)

    def guard_damage(self) -> int:
        """How many guard elements changed (writes before or after the output)."""
        bits = self.full.view(np.uint32)
        return int(
            np.count_nonzero(bits[:GUARD_ELEMENTS] != GUARD)
            + np.count_nonzero(bits[GUARD_ELEMENTS + self.size :] != GUARD)
        )

    def unwritten(self) -> int:
        """How many output elements still hold the sentinel."""
        return int(np.count_nonzero(self.view.reshape(-1).view(np.uint32) == SENTINEL))


@dataclass(frozen=True)
class BackendRun:
    """What a backend returns: the inputs as they were after the launch (device buffers read back),
    the number of kernel launches it made, and `overruns`: {buffer name: guard elements changed}
    for every guarded buffer other than the outputs (inputs, meta data, workspaces) that a kernel
    wrote past."""

    inputs_after: Mapping[str, object]
    launches: int
    overruns: Mapping[str, int] = field(default_factory=dict)


class Backend(Protocol):
    name: str
    description: str

    def forward(self, spec: OpSpec, inputs: dict, params: dict, out: GuardedOutput) -> BackendRun: ...

    def backward(
        self,
        spec: OpSpec,
        inputs: dict,
        params: dict,
        g: np.ndarray,
        grads: Mapping[str, GuardedOutput | tuple[GuardedOutput, ...]],
    ) -> BackendRun: ...


def gradient_outputs(spec: OpSpec, arrays: Mapping[str, object]) -> dict:
    """Guarded buffers for every gradient, shaped like its input (a tuple for a variadic input)."""
    out = {}
    for name in spec.differentiable:
        value = arrays[name]
        out[name] = (
            tuple(GuardedOutput(v.shape) for v in value) if isinstance(value, tuple) else GuardedOutput(value.shape)
        )
    return out
