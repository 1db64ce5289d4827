"""The catalog: the native CUDA capsules and their CPU reference twins, validated on load.
Lookup by capsule or op name with did-you-mean, filters, and TorchLean's planner."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from capsule_core.catalog import native_cuda, reference
from capsule_core.errors import RegistryError, UnknownNameError
from capsule_core.model import (
    BackendOp,
    KernelCapsule,
    KernelPolicy,
    ReductionPolicy,
    VJPMode,
    choose,
    contracts_aligned,
    refusal,
    same_identity,
)

MODULES: dict[str, tuple[KernelCapsule, ...]] = {
    "native_cuda": native_cuda.CAPSULES,
    "reference": reference.CAPSULES,
}
"""Registry modules in catalog order, named as TorchLean names them."""


def validate_catalog(capsules) -> tuple[KernelCapsule, ...]:
    """Unique names, unique identities (op, provider, device), aligned contracts; else RegistryError."""
    names: set[str] = set()
    identities: dict[tuple, KernelCapsule] = {}
    for c in capsules:
        if c.name in names:
            raise RegistryError(f"capsule name {c.name!r} is registered twice")
        key = (c.op, c.provider, c.device)
        twin = identities.get(key)
        if twin is not None and same_identity(twin, c):
            raise RegistryError(
                f"{c.name} and {twin.name} have the same identity ({c.op.value}, {c.provider.value}, {c.device.value})"
            )
        if not contracts_aligned(c):
            raise RegistryError(
                f"{c.name}: contracts are not aligned (each descriptor must state its own "
                f"obligation, the layout claim must be the layout, the VJP claim the VJP mode)"
            )
        names.add(c.name)
        identities[key] = c
    return tuple(capsules)


CATALOG: tuple[KernelCapsule, ...] = validate_catalog([c for m in MODULES.values() for c in m])
_BY_NAME = {c.name: c for c in CATALOG}
_NATIVE_BY_OP = {c.op.value: c for c in native_cuda.CAPSULES}


def lookup(name: str) -> KernelCapsule:
    """A capsule by its name (`native_cuda.relu`) or an op name (`relu`, the native capsule)."""
    if name in _BY_NAME:
        return _BY_NAME[name]
    if name in _NATIVE_BY_OP:
        return _NATIVE_BY_OP[name]
    choices = list(_NATIVE_BY_OP) + list(_BY_NAME)
    raise UnknownNameError("capsule", name, tuple(difflib.get_close_matches(name, choices, n=3, cutoff=0.6)))


def parse_op(name: str) -> BackendOp:
    try:
        return BackendOp(name)
    except ValueError:
        raise UnknownNameError(
            "op", name, tuple(difflib.get_close_matches(name, [o.value for o in BackendOp], n=3, cutoff=0.6))
        ) from None


def filter_capsules(
    module: str | None = None,
    family: str | None = None,
    vjp: VJPMode | None = None,
    reduction: ReductionPolicy | None = None,
) -> list[KernelCapsule]:
    if module is not None and module not in MODULES:
        raise UnknownNameError("module", module, tuple(difflib.get_close_matches(module, MODULES, n=2)))
    families = sorted(set(native_cuda.FAMILIES.values()))
    if family is not None and family not in families:
        raise UnknownNameError("family", family, tuple(difflib.get_close_matches(family, families, n=2)))
    return [
        c
        for c in CATALOG
        if (module is None or c.module == module)
        and (family is None or c.family == family)
        and (vjp is None or c.vjp_mode is vjp)
        and (reduction is None or c.numerical_policy.reduction is reduction)
    ]


@dataclass(frozen=True)
class Selection:
    """The planner's answer for one op under one policy: the capsule chosen (or none) and why
    each other capsule of the op was refused."""

    op: BackendOp
    policy: KernelPolicy
    chosen: KernelCapsule | None
    refused: tuple[tuple[KernelCapsule, str], ...]


def select(op: BackendOp, policy: KernelPolicy) -> Selection:
    """The planner's choice for `op`, and the reason each other capsule of that op was refused."""
    chosen = choose(policy, op, CATALOG)
    refused = []
    for c in CATALOG:
        if c.op is op and c is not chosen:
            reason = refusal(policy, c) or "admissible, but not first in the search order"
            refused.append((c, reason))
    return Selection(op, policy, chosen, tuple(refused))
