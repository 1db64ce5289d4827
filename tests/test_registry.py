"""The capsule model and the registry: the seed's catalog, its invariants, the planner."""

import dataclasses
import importlib
import re
from pathlib import Path

import pytest

from capsule_core.catalog import native_cuda, reference, registry
from capsule_core.catalog.planner import KernelPolicy, PreferenceKind, ProviderPreference, admissible, choose, select
from capsule_core.errors import RegistryError, UnknownNameError
from capsule_core.model import (
    AssurancePolicy,
    BackendOp,
    ContractClaim,
    ContractDescriptor,
    ContractEvidence,
    Device,
    EvidenceKind,
    Provider,
    ReductionPolicy,
    TrustLevel,
    VJPMode,
    contracts_aligned,
    same_identity,
)
from capsule_core.verify.checks import CHECKS

ROOT = Path(__file__).resolve().parent.parent

DEVELOPERS_ORDER = (
    "matmul linear mse_loss relu gelu add sub mul scale abs sqrt clamp max min sigmoid tanh softplus exp sin "
    "cos log inv safe_log log_softmax softmax hard_masked_softmax reduce_sum reduce_mean reshape permute "
    "broadcast concat slice gather scatter_add rand_uniform bernoulli_mask layer_norm batch_norm conv "
    "conv_transpose max_pool smooth_max_pool avg_pool fft_fno selective_scan"
).split()

IMPLEMENTATION_DEFINED = set(
    "matmul linear mse_loss log_softmax softmax hard_masked_softmax reduce_sum reduce_mean scatter_add "
    "layer_norm batch_norm conv conv_transpose max_pool smooth_max_pool avg_pool fft_fno selective_scan".split()
)

SEED_DESCRIPTIONS = {
    "matmul": "Native CUDA batched/matrix multiplication, backed by CUDA/cuBLAS paths.",
    "relu": "Native CUDA ReLU activation.",
    "sin": "Native CUDA sine, with angles measured in radians.",
    "safe_log": "Native-CUDA guarded logarithm used by numerically defensive programs.",
    "softmax": "Native CUDA row/axis softmax kernels.",
    "scatter_add": "Native-CUDA indexed scatter-add.",
    "selective_scan": "Native CUDA selective scan kernels.",
}


def test_native_catalog_is_the_seed_in_order():
    assert [c.name for c in native_cuda.CAPSULES] == [f"native_cuda.{op}" for op in DEVELOPERS_ORDER]
    assert [c.op.value for c in native_cuda.CAPSULES] == DEVELOPERS_ORDER


def test_seed_descriptions_are_kept():
    for op, text in SEED_DESCRIPTIONS.items():
        assert registry.lookup(op).description == text


def test_backend_op_vocabulary():
    assert len(BackendOp) == 47
    assert BackendOp("scaled_dot_product_attention").requires_vjp
    assert {op.value for op in BackendOp if not op.requires_vjp} == {"rand_uniform", "bernoulli_mask"}
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", op.value) for op in BackendOp)
    assert "scaled_dot_product_attention" not in {c.op.value for c in registry.catalog()}


def test_vjp_modes_and_reduction_policies_follow_the_spec():
    for c in native_cuda.CAPSULES:
        random = c.op.value in ("rand_uniform", "bernoulli_mask")
        assert (c.vjp_mode is VJPMode.NONE) == random, c.name
        assert (c.vjp.claim is ContractClaim.VJP_UNAVAILABLE) == random
        if not random:
            assert c.vjp_mode is VJPMode.BACKEND_VJP
        expected = (
            ReductionPolicy.IMPLEMENTATION_DEFINED
            if c.op.value in IMPLEMENTATION_DEFINED
            else ReductionPolicy.NOT_APPLICABLE
        )
        assert c.numerical_policy.reduction is expected, c.name


def test_every_capsule_is_checked_aligned_and_on_its_device():
    for c in native_cuda.CAPSULES:
        assert (c.provider, c.device, c.trust_level) == (Provider.NATIVE_CUDA, Device.CUDA, TrustLevel.CHECKED)
        assert contracts_aligned(c)
        assert c.value.summary and c.vjp.summary and c.value.summary != c.vjp.summary
    for c in reference.CAPSULES:
        assert (c.provider, c.device) == (Provider.REFERENCE, Device.CPU)
        assert contracts_aligned(c) and not c.symbols
    assert [c.op for c in reference.CAPSULES] == [c.op for c in native_cuda.CAPSULES]


def test_native_symbols_follow_the_naming_convention():
    for c in native_cuda.CAPSULES:
        for ref in c.symbols:
            assert ref.path == f"cuda/{c.family}.cu"
            assert re.fullmatch(rf"capsule_{c.op.value}_(fwd|bwd)(_[a-z0-9_]+)?", ref.symbol), ref.symbol
            assert all(
                re.fullmatch(r"(const )?(float|int64_t|uint64_t|int32_t)(\*)?( __restrict__)? [a-z_0-9]+", p)
                for p in ref.params
            ), ref.params
        if c.op.value == "reshape":
            assert c.symbols == ()
        else:
            assert c.value.provenance and all(
                r.symbol.startswith(f"capsule_{c.op.value}_fwd") for r in c.value.provenance
            )
            assert bool(c.vjp.provenance) == (c.vjp_mode is not VJPMode.NONE)


def test_evidence_names_are_true_of_this_project():
    for c in registry.catalog():
        for d in c.descriptors.values():
            e = d.evidence
            if e.kind is EvidenceKind.RUNTIME_GUARD:
                module, _, function = e.detail.rpartition(".")
                assert callable(getattr(importlib.import_module(module), function)), e.detail
            elif e.kind is EvidenceKind.TEST_SUITE:
                if e.detail.startswith("verify:"):
                    assert e.detail.removeprefix("verify:") in CHECKS, e.detail
                else:
                    assert (ROOT / e.detail).is_file(), e.detail
            elif e.kind is EvidenceKind.NOT_APPLICABLE:
                assert d.claim is ContractClaim.VJP_UNAVAILABLE


def _relu():
    return registry.lookup("relu")


def test_contracts_aligned_rejects_misplaced_claims():
    c = _relu()
    swapped = dataclasses.replace(c, value=dataclasses.replace(c.value, claim=ContractClaim.SHAPE_CHECKED))
    assert not contracts_aligned(swapped)
    wrong_layout = dataclasses.replace(
        c, layout_contract=dataclasses.replace(c.layout_contract, claim=ContractClaim.LAYOUT_ALIAS)
    )
    assert not contracts_aligned(wrong_layout)
    no_vjp_claim = dataclasses.replace(c, vjp_mode=VJPMode.NONE)
    assert not contracts_aligned(no_vjp_claim)


def test_same_identity():
    c = _relu()
    assert same_identity(c, dataclasses.replace(c, name="native_cuda.relu2"))
    assert not same_identity(c, registry.lookup("reference.relu"))


def test_catalog_validation_errors_are_clear():
    c = _relu()
    with pytest.raises(RegistryError, match="registered twice"):
        registry.validate_catalog([c, c])
    with pytest.raises(RegistryError, match="same identity"):
        registry.validate_catalog([c, dataclasses.replace(c, name="native_cuda.other")])
    bad = dataclasses.replace(
        c,
        name="native_cuda.bad",
        vjp=ContractDescriptor(ContractClaim.VALUE_MATCHES_REFERENCE, "x", ContractEvidence.not_applicable()),
    )
    with pytest.raises(RegistryError, match="native_cuda.bad: contracts are not aligned"):
        registry.validate_catalog([bad])


def test_lookup_by_capsule_or_op_name_with_did_you_mean():
    assert registry.lookup("relu") is registry.lookup("native_cuda.relu")
    assert registry.lookup("reference.relu").provider is Provider.REFERENCE
    with pytest.raises(UnknownNameError) as info:
        registry.lookup("relux")
    assert "relu" in info.value.suggestions


def test_filters():
    assert len(registry.filter_capsules(module="native_cuda")) == 46
    assert len(registry.filter_capsules(module="reference")) == 46
    assert {c.op.value for c in registry.filter_capsules(module="native_cuda", vjp=VJPMode.NONE)} == {
        "rand_uniform",
        "bernoulli_mask",
    }
    assert len(registry.filter_capsules(module="native_cuda", family="pointwise")) == 20
    assert {
        c.op.value
        for c in registry.filter_capsules(module="native_cuda", reduction=ReductionPolicy.IMPLEMENTATION_DEFINED)
    } == IMPLEMENTATION_DEFINED
    with pytest.raises(UnknownNameError, match="did you mean pointwise"):
        registry.filter_capsules(family="pointwize")


def test_planner_chooses_by_device_provider_and_assurance():
    sin = BackendOp.SIN
    assert select(sin, KernelPolicy(Device.CUDA)).chosen.name == "native_cuda.sin"
    assert select(sin, KernelPolicy(Device.CPU)).chosen.name == "reference.sin"
    nothing = select(sin, KernelPolicy(Device.CPU, ProviderPreference.parse("only:native_cuda")))
    assert nothing.chosen is None
    reasons = dict((c.name, r) for c, r in nothing.refused)
    assert "policy asks for cpu" in reasons["native_cuda.sin"]
    assert "excluded by only:native_cuda" in reasons["reference.sin"]


def test_prefer_searches_that_provider_first_then_catalog_order():
    cpu_native = dataclasses.replace(
        registry.lookup("reference.sin"), name="native_cuda.sin_cpu", provider=Provider.NATIVE_CUDA
    )
    catalog = [registry.lookup("reference.sin"), cpu_native]
    auto = KernelPolicy(Device.CPU)
    assert choose(auto, BackendOp.SIN, catalog).name == "reference.sin"
    prefer = KernelPolicy(Device.CPU, ProviderPreference(PreferenceKind.PREFER, Provider.NATIVE_CUDA))
    assert choose(prefer, BackendOp.SIN, catalog).name == "native_cuda.sin_cpu"


def test_assurance_and_vjp_requirements():
    external = dataclasses.replace(_relu(), trust_level=TrustLevel.TRUSTED_EXTERNAL)
    assert not admissible(KernelPolicy(Device.CUDA), external)
    assert admissible(KernelPolicy(Device.CUDA, assurance=AssurancePolicy.EXTERNAL), external)
    no_vjp = dataclasses.replace(_relu(), vjp_mode=VJPMode.NONE, vjp=registry.lookup("rand_uniform").vjp)
    assert not admissible(KernelPolicy(Device.CUDA), no_vjp)
    assert admissible(KernelPolicy(Device.CUDA, require_vjp=False), no_vjp)
    assert admissible(KernelPolicy(Device.CUDA), registry.lookup("rand_uniform")), "random ops need no VJP"


def test_provider_preference_parse_errors():
    assert str(ProviderPreference.parse("prefer:reference")) == "prefer:reference"
    for bad in ("sometimes", "only:cudnn", "auto:reference"):
        with pytest.raises(ValueError):
            ProviderPreference.parse(bad)
