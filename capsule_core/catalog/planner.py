"""TorchLean's planner: the policy a program asks for (device, provider preference, assurance,
VJP), why a capsule is or is not admissible under it, and the capsule chosen for an op. Apart from
the catalog's vocabulary so that `capsules list` never builds its dataclasses."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from capsule_core.catalog import registry
from capsule_core.model import (
    AssurancePolicy,
    BackendOp,
    Device,
    KernelCapsule,
    LibraryOp,
    Provider,
    TrustLevel,
    VJPMode,
    contracts_aligned,
)


class PreferenceKind(str, Enum):
    AUTO = "auto"
    PREFER = "prefer"
    ONLY = "only"


@dataclass(frozen=True)
class ProviderPreference:
    """TorchLean's provider preference: auto, prefer:PROVIDER (its capsules first) or
    only:PROVIDER. A capsule library's name stands for a provider too (prefer:tinylib)."""

    kind: PreferenceKind = PreferenceKind.AUTO
    provider: Provider | None = None
    library: str | None = None

    @classmethod
    def parse(cls, text: str, libraries: tuple[str, ...] = ()) -> ProviderPreference:
        """'auto', 'prefer:<provider or library>' or 'only:<provider or library>'."""
        kind, _, provider = text.partition(":")
        try:
            k = PreferenceKind(kind)
        except ValueError:
            raise ValueError(
                f"provider preference must be auto, prefer:PROVIDER or only:PROVIDER, got {text!r}"
            ) from None
        if k is PreferenceKind.AUTO:
            if provider:
                raise ValueError(f"'auto' takes no provider, got {text!r}")
            return cls()
        if provider in {p.value for p in Provider}:
            return cls(k, Provider(provider))
        if provider in libraries:
            return cls(k, library=provider)
        names = ", ".join([p.value for p in Provider] + [n for n in libraries if n not in {p.value for p in Provider}])
        raise ValueError(f"unknown provider {provider!r} in {text!r} (providers and libraries: {names})")

    @property
    def target(self) -> str | None:
        return self.library or (self.provider.value if self.provider else None)

    def matches(self, capsule: KernelCapsule) -> bool:
        return capsule.module == self.library if self.library else capsule.provider is self.provider

    def __str__(self) -> str:
        return self.kind.value if self.target is None else f"{self.kind.value}:{self.target}"


@dataclass(frozen=True)
class KernelPolicy:
    """What the planner may choose: the device, the provider preference, the assurance asked for
    and whether a VJP is required."""

    device: Device
    provider: ProviderPreference = ProviderPreference()
    assurance: AssurancePolicy = AssurancePolicy.CHECKED
    require_vjp: bool = True


def refusal(policy: KernelPolicy, capsule: KernelCapsule) -> str | None:
    """Why `capsule` is not admissible under `policy`, or None when it is."""
    if capsule.device is not policy.device:
        return f"runs on {capsule.device.value}, the policy asks for {policy.device.value}"
    pref = policy.provider
    if pref.kind is PreferenceKind.ONLY and not pref.matches(capsule):
        which = f"library {capsule.module}" if pref.library else f"provider {capsule.provider.value}"
        return f"{which} is excluded by only:{pref.target}"
    if policy.assurance is AssurancePolicy.CHECKED and capsule.trust_level is not TrustLevel.CHECKED:
        return f"trust level {capsule.trust_level.value} is below the checked assurance policy"
    if policy.require_vjp and capsule.op.requires_vjp and capsule.vjp_mode is VJPMode.NONE:
        return "has no VJP and the policy requires one"
    if not capsule.supports_forward:
        return "does not support the forward pass"
    if not contracts_aligned(capsule):
        return "its contracts are not aligned"
    return None


def admissible(policy: KernelPolicy, capsule: KernelCapsule) -> bool:
    return refusal(policy, capsule) is None


def choose(policy: KernelPolicy, op: BackendOp, catalog) -> KernelCapsule | None:
    """TorchLean's chooseCapsuleFor: with `prefer`, that provider's capsules are searched
    first, then the catalog in order; the first admissible capsule for `op` wins."""
    candidates = [c for c in catalog if c.op == op]
    if policy.provider.kind is PreferenceKind.PREFER:
        candidates.sort(key=lambda c: not policy.provider.matches(c))
    return next((c for c in candidates if admissible(policy, c)), None)


@dataclass(frozen=True)
class Selection:
    """The planner's answer for one op under one policy: the capsule chosen (or none) and why
    each other capsule of the op was refused."""

    op: BackendOp | LibraryOp
    policy: KernelPolicy
    chosen: KernelCapsule | None
    refused: tuple[tuple[KernelCapsule, str], ...]


def select(op: BackendOp | LibraryOp, policy: KernelPolicy) -> Selection:
    """The planner's choice for `op`, and the reason each other capsule of that op was refused."""
    catalog = registry.catalog()
    chosen = choose(policy, op, catalog)
    refused = []
    for c in catalog:
        if c.op == op and c is not chosen:
            reason = refusal(policy, c) or "admissible, but not first in the search order"
            refused.append((c, reason))
    return Selection(op, policy, chosen, tuple(refused))
