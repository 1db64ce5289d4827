"""The numpy float32 provider: the reference code run in float32, behind the same API.

It rounds and sums differently from the float64 reference, which is the point: it is the first
honest test of the tolerance models, and the CPU stand-in for the GPU in verify.
"""

from __future__ import annotations

from .cpu import NUMPY_F32


def forward(op: str, inputs: dict, **params):
    return NUMPY_F32.forward(op, inputs, **params)


def vjp(op: str, inputs: dict, cotangent, **params) -> dict:
    return NUMPY_F32.vjp(op, inputs, cotangent, **params)
