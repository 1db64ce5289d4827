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


_LIBRARY_SPECS: dict = {}
"""Capsule libraries' own ops ("tinylib.squared_relu"): a function that imports the OpSpec."""


def register_spec(name: str, load) -> None:
    """Make a library's own op known to get_spec (catalog.registry calls this as a library loads);
    `load()` imports its OpSpec when it is first needed."""
    _LIBRARY_SPECS[name] = load


def get_spec(name: str):
    specs = all_specs()
    if name in specs:
        return specs[name]
    if name in _LIBRARY_SPECS:
        return _LIBRARY_SPECS[name]()
    import difflib

    raise UnknownNameError("op", name, tuple(difflib.get_close_matches(name, [*specs, *_LIBRARY_SPECS], n=3)))
