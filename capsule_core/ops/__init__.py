"""One OpSpec per op, one module per family. `get_spec("relu")`, `all_specs()`."""

from __future__ import annotations

import importlib
from functools import lru_cache

from capsule_core.errors import UnknownNameError

FAMILIES = (
    "pointwise",
    "softmax",
    "reduce",
    "view",
    "index",
    "random",
    "norm",
    "conv_pool",
    "linalg",
    "spectral",
    "scan",
)
"""Family modules; each defines SPECS, a tuple of OpSpec. The same names as the .cu files."""


@lru_cache(maxsize=None)
def all_specs() -> dict:
    specs = {}
    for family in FAMILIES:
        module = importlib.import_module(f"{__name__}.{family}")
        for spec in module.SPECS:
            if spec.name in specs:
                raise AssertionError(f"op {spec.name} is defined twice")
            if spec.family != family:
                raise AssertionError(f"op {spec.name} says family {spec.family}, lives in {family}")
            specs[spec.name] = spec
    return specs


def get_spec(name: str):
    specs = all_specs()
    if name not in specs:
        import difflib

        raise UnknownNameError("op", name, tuple(difflib.get_close_matches(name, specs, n=3)))
    return specs[name]
