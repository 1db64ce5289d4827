"""The float64 reference: the truth every provider is measured against.

`forward(op, inputs, **params)` and `vjp(op, inputs, cotangent, **params)` are the public API
shared by every backend; `magnitude` and `vjp_magnitude` give M of the error model.

>>> import numpy as np
>>> float(forward("relu", {"x": np.float32([-1.0, 2.0])})[1])
2.0
"""

from __future__ import annotations


def forward(op: str, inputs: dict, **params):
    from capsule_core.catalog.cpu_providers import REFERENCE

    return REFERENCE.forward(op, inputs, **params)


def vjp(op: str, inputs: dict, cotangent, **params) -> dict:
    from capsule_core.catalog.cpu_providers import REFERENCE

    return REFERENCE.vjp(op, inputs, cotangent, **params)


def magnitude(op: str, inputs: dict, **params):
    from capsule_core.catalog.cpu_providers import REFERENCE

    return REFERENCE.magnitude(op, inputs, **params)


def vjp_magnitude(op: str, inputs: dict, cotangent, **params) -> dict:
    from capsule_core.catalog.cpu_providers import REFERENCE

    return REFERENCE.vjp_magnitude(op, inputs, cotangent, **params)


def _reference_capsule(native):
    """The CPU twin of a native capsule: the same op and contracts, computed by the OpSpec's
    float64 code (so the planner has a real choice on a machine without a GPU). Made with the
    constructors, not dataclasses.replace: `capsules list` makes all 46 at start-up."""
    from capsule_core.model import ContractDescriptor, ContractEvidence, Device, KernelCapsule, Provider

    def cpu(d, evidence=None):
        return ContractDescriptor(d.claim, d.summary, evidence or d.evidence)

    vjp_evidence = native.vjp.evidence
    return KernelCapsule(
        name=f"{Provider.REFERENCE.value}.{native.op.value}",
        op=native.op,
        provider=Provider.REFERENCE,
        device=Device.CPU,
        trust_level=native.trust_level,
        supports_forward=native.supports_forward,
        vjp_mode=native.vjp_mode,
        layout=native.layout,
        shape=cpu(native.shape),
        layout_contract=cpu(native.layout_contract),
        value=cpu(native.value, ContractEvidence.test_suite("tests/test_ops_contract.py")),
        vjp=cpu(
            native.vjp,
            vjp_evidence if not vjp_evidence.detail else ContractEvidence.test_suite("verify:vjp.reference"),
        ),
        numerical_policy=native.numerical_policy,
        description=f"float64 numpy reference of {native.op.value} (capsule_core.ops.{native.family}).",
        family=native.family,
    )


def _build_capsules():
    from capsule_core.catalog.native_cuda import CAPSULES as NATIVE

    return tuple(_reference_capsule(c) for c in NATIVE)


CAPSULES = _build_capsules()
"""One CPU capsule per op, in the native catalog's order."""
