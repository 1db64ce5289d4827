"""The float64 reference: the truth every provider is measured against.

`forward(op, inputs, **params)` and `vjp(op, inputs, cotangent, **params)` are the public API
shared by every backend; `magnitude` and `vjp_magnitude` give M of the error model.

>>> import numpy as np
>>> float(forward("relu", {"x": np.float32([-1.0, 2.0])})[1])
2.0
"""

from __future__ import annotations


def forward(op: str, inputs: dict, **params):
    from .backends.cpu import REFERENCE
    return REFERENCE.forward(op, inputs, **params)


def vjp(op: str, inputs: dict, cotangent, **params) -> dict:
    from .backends.cpu import REFERENCE
    return REFERENCE.vjp(op, inputs, cotangent, **params)


def magnitude(op: str, inputs: dict, **params):
    from .backends.cpu import REFERENCE
    return REFERENCE.magnitude(op, inputs, **params)


def vjp_magnitude(op: str, inputs: dict, cotangent, **params) -> dict:
    from .backends.cpu import REFERENCE
    return REFERENCE.vjp_magnitude(op, inputs, cotangent, **params)
