"""How a kernel capsule is made and what a loaded library holds: `kernel_capsule`, the one way
(the 46 built-in capsules and every capsule library's go through it), and `Library`. Light:
`capsules list` imports it; a library's declaration and loader live in catalog/library.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from capsule_core.model import (
    LAYOUT_CLAIMS,
    BackendOp,
    ContractClaim,
    ContractDescriptor,
    ContractEvidence,
    Device,
    KernelCapsule,
    LibraryOp,
    NativeSymbolRef,
    NumericalPolicy,
    Provider,
    ReductionPolicy,
    TensorLayout,
    TrustLevel,
    VJPMode,
)

SHAPE_GUARD = "capsule_core.ops.base.validate"
LAYOUT_GUARD = "capsule_core.ops.base.as_input_arrays"

LAYOUT_SUMMARY = {
    TensorLayout.FLAT_ROW_MAJOR: "Contiguous flat row-major float32 buffers, last axis fastest.",
    TensorLayout.CHANNEL_FIRST: "Contiguous flat row-major (N, C, *spatial) float32 buffers.",
    TensorLayout.ALIAS: "The output aliases the input buffer; only the shape changes.",
}

POLICY_NOTE = {
    ReductionPolicy.NOT_APPLICABLE: "no reduction",
    ReductionPolicy.IMPLEMENTATION_DEFINED: "the summation tree and order are chosen by the kernel; "
    "values are held to the order-free bound",
    ReductionPolicy.FIXED_LEFT: "bitwise a float32 left fold",
}


def kernel_capsule(
    library: str,
    op: BackendOp | LibraryOp,
    forward: tuple[NativeSymbolRef, ...],
    backward: tuple[NativeSymbolRef, ...],
    *,
    value_summary: str,
    vjp_summary: str,
    description: str,
    family: str,
    vjp_mode: VJPMode = VJPMode.BACKEND_VJP,
    reduction: ReductionPolicy = ReductionPolicy.NOT_APPLICABLE,
    trust: TrustLevel = TrustLevel.CHECKED,
    layout: TensorLayout = TensorLayout.FLAT_ROW_MAJOR,
    value_claim: ContractClaim = ContractClaim.VALUE_MATCHES_REFERENCE,
    policy_note: str | None = None,
) -> KernelCapsule:
    """A native CUDA capsule `<library>.<op>` with its four contracts: shapes and layout held by
    the host's runtime guards, the value and the VJP by verify's checks, each naming its kernels."""
    no_vjp = vjp_mode is VJPMode.NONE
    short = op.value.removeprefix(f"{library}.")
    return KernelCapsule(
        name=f"{library}.{short}",
        op=op,
        provider=Provider.NATIVE_CUDA,
        device=Device.CUDA,
        trust_level=trust,
        supports_forward=True,
        vjp_mode=vjp_mode,
        layout=layout,
        shape=ContractDescriptor(
            ContractClaim.SHAPE_CHECKED,
            "Shapes and parameters are checked on the host before any launch.",
            ContractEvidence.runtime_guard(SHAPE_GUARD),
            forward,
        ),
        layout_contract=ContractDescriptor(
            LAYOUT_CLAIMS[layout], LAYOUT_SUMMARY[layout], ContractEvidence.runtime_guard(LAYOUT_GUARD), forward
        ),
        value=ContractDescriptor(
            value_claim,
            value_summary,
            ContractEvidence.test_suite(
                "verify:rng" if value_claim is ContractClaim.VALUE_SEEDED_STREAM else "verify:value"
            ),
            forward,
        ),
        vjp=ContractDescriptor(
            ContractClaim.VJP_UNAVAILABLE if no_vjp else ContractClaim.VJP_MATCHES_REFERENCE,
            vjp_summary,
            ContractEvidence.not_applicable() if no_vjp else ContractEvidence.test_suite("verify:vjp"),
            backward,
        ),
        numerical_policy=NumericalPolicy(reduction, policy_note or POLICY_NOTE[reduction]),
        description=description,
        family=family,
    )


class Library:
    """A library's capsules, ready for every command: where its plans, budget and own ops live.
    (A plain class: the built-in library is made at every start-up, `capsules list` included.)"""

    def __init__(
        self,
        name: str,
        origin: str,
        capsules: tuple[KernelCapsule, ...],
        plan_module: Callable[[KernelCapsule], Any],
        specs: dict | None = None,
        root: Path | None = None,
        path: Path | None = None,
    ):
        self.name = name
        self.origin = origin
        """"built-in", or what was loaded: a declaration's path, an entry point."""
        self.capsules = capsules
        self.plan_module = plan_module
        """The module of a capsule's plans (PLANS, and BUDGET when it declares one)."""
        self.specs = specs or {}
        """The library's own ops by name ("tinylib.squared_relu"): a function that imports its OpSpec."""
        self.root = root
        """The folder of the declaration: what travels with a job to another machine."""
        self.path = path
        """The declaration to load again in a worker process (None: found again by itself)."""

    def plans_for(self, capsule: KernelCapsule):
        """(forward plan, backward plan) of a capsule, or None when its plans are not written."""
        module = self.plan_module(capsule)
        plans = getattr(module, "PLANS", {}) if module is not None else {}
        return plans.get(capsule.op.value.removeprefix(f"{self.name}."))

    def budget_for(self, capsule: KernelCapsule):
        """The KernelBudget declared beside the capsule's plans, or None."""
        module = self.plan_module(capsule)
        return getattr(module, "BUDGET", None) if module is not None else None
