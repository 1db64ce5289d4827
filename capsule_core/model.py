"""The capsule vocabulary, mirroring TorchLean's backend types (NN.Backend.*).

Pure data: enums, frozen dataclasses and the predicates `contracts_aligned` and `same_identity`.
Standard library only, so that `capsules list` starts fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Device(str, Enum):
    CPU = "cpu"
    CUDA = "cuda"


class Provider(str, Enum):
    NATIVE_CUDA = "native_cuda"
    REFERENCE = "reference"


class BackendOp(str, Enum):
    """TorchLean's BackendOp: the 46 ops of the native CUDA backend plus attention, which the
    native catalog leaves out (it has a dedicated semantic split)."""

    MATMUL = "matmul"
    LINEAR = "linear"
    MSE_LOSS = "mse_loss"
    RELU = "relu"
    GELU = "gelu"
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    SCALE = "scale"
    ABS = "abs"
    SQRT = "sqrt"
    CLAMP = "clamp"
    MAX = "max"
    MIN = "min"
    SIGMOID = "sigmoid"
    TANH = "tanh"
    SOFTPLUS = "softplus"
    EXP = "exp"
    SIN = "sin"
    COS = "cos"
    LOG = "log"
    INV = "inv"
    SAFE_LOG = "safe_log"
    LOG_SOFTMAX = "log_softmax"
    SOFTMAX = "softmax"
    HARD_MASKED_SOFTMAX = "hard_masked_softmax"
    REDUCE_SUM = "reduce_sum"
    REDUCE_MEAN = "reduce_mean"
    RESHAPE = "reshape"
    PERMUTE = "permute"
    BROADCAST = "broadcast"
    CONCAT = "concat"
    SLICE = "slice"
    GATHER = "gather"
    SCATTER_ADD = "scatter_add"
    RAND_UNIFORM = "rand_uniform"
    BERNOULLI_MASK = "bernoulli_mask"
    LAYER_NORM = "layer_norm"
    BATCH_NORM = "batch_norm"
    CONV = "conv"
    CONV_TRANSPOSE = "conv_transpose"
    MAX_POOL = "max_pool"
    SMOOTH_MAX_POOL = "smooth_max_pool"
    AVG_POOL = "avg_pool"
    FFT_FNO = "fft_fno"
    SELECTIVE_SCAN = "selective_scan"
    SCALED_DOT_PRODUCT_ATTENTION = "scaled_dot_product_attention"

    @property
    def requires_vjp(self) -> bool:
        """Whether a differentiable program needs this op's VJP (false only for random ops)."""
        return self not in RANDOM_OPS


RANDOM_OPS = frozenset({BackendOp.RAND_UNIFORM, BackendOp.BERNOULLI_MASK})


@dataclass(frozen=True)
class LibraryOp:
    """An op a capsule library defines itself, named "<library>.<op>" (TorchLean's BackendOp
    holds only the built-in ones). It reads like a BackendOp: `.value` is its name."""

    value: str
    requires_vjp: bool = True

    def __str__(self) -> str:
        return self.value


class TrustLevel(str, Enum):
    CHECKED = "checked"
    """Every claim is backed by a runtime guard or a test suite of this project."""
    TRUSTED_EXTERNAL = "trusted_external"
    """At least one claim rests on a trusted boundary (an external library)."""


class VJPMode(str, Enum):
    NONE = "none"
    TORCHLEAN_TAPE = "torchlean_tape"
    BACKEND_VJP = "backend_vjp"


class TensorLayout(str, Enum):
    FLAT_ROW_MAJOR = "flat_row_major"
    """Contiguous float32, last axis fastest."""
    CHANNEL_FIRST = "channel_first"
    """Flat row-major (N, C, *spatial)."""
    ALIAS = "alias"
    """The output is the input buffer under a new shape: no copy."""


class Aspect(str, Enum):
    """Which of the four descriptors a claim belongs to."""

    SHAPE = "shape"
    LAYOUT = "layout"
    VALUE = "value"
    VJP = "vjp"


class ContractClaim(str, Enum):
    SHAPE_CHECKED = "shape_checked"
    LAYOUT_FLAT_ROW_MAJOR = "layout_flat_row_major"
    LAYOUT_CHANNEL_FIRST = "layout_channel_first"
    LAYOUT_ALIAS = "layout_alias"
    VALUE_MATCHES_REFERENCE = "value_matches_reference"
    VALUE_SEEDED_STREAM = "value_seeded_stream"
    VJP_MATCHES_REFERENCE = "vjp_matches_reference"
    VJP_UNAVAILABLE = "vjp_unavailable"

    @property
    def aspect(self) -> Aspect:
        return Aspect(self.value.split("_", 1)[0])


LAYOUT_CLAIMS = {
    TensorLayout.FLAT_ROW_MAJOR: ContractClaim.LAYOUT_FLAT_ROW_MAJOR,
    TensorLayout.CHANNEL_FIRST: ContractClaim.LAYOUT_CHANNEL_FIRST,
    TensorLayout.ALIAS: ContractClaim.LAYOUT_ALIAS,
}


class EvidenceKind(str, Enum):
    RUNTIME_GUARD = "runtime_guard"
    TEST_SUITE = "test_suite"
    TRUSTED_BOUNDARY = "trusted_boundary"
    NOT_APPLICABLE = "not_applicable"


@dataclass(frozen=True)
class ContractEvidence:
    """What backs a claim: a guard function (dotted path), a test suite (a test module or a
    `verify:<check>` id), a trusted boundary (with its reason), or nothing to back."""

    kind: EvidenceKind
    detail: str = ""

    @classmethod
    def runtime_guard(cls, name: str) -> ContractEvidence:
        return cls(EvidenceKind.RUNTIME_GUARD, name)

    @classmethod
    def test_suite(cls, name: str) -> ContractEvidence:
        return cls(EvidenceKind.TEST_SUITE, name)

    @classmethod
    def trusted_boundary(cls, reason: str) -> ContractEvidence:
        return cls(EvidenceKind.TRUSTED_BOUNDARY, reason)

    @classmethod
    def not_applicable(cls) -> ContractEvidence:
        return cls(EvidenceKind.NOT_APPLICABLE)

    def __str__(self) -> str:
        return f"{self.kind.value}({self.detail})" if self.detail else self.kind.value


@dataclass(frozen=True)
class BuildOptions:
    """How a capsule library's sources are built: its translation units (each built on its own),
    include folders, -D defines and extra nvcc flags; the folders, defines and flags are part of
    every build's cache key. Absolute paths; `library` names the library."""

    library: str
    sources: tuple[str, ...]
    include_dirs: tuple[str, ...] = ()
    defines: tuple[str, ...] = ()
    nvcc_flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class NativeSymbolRef:
    """A kernel entry point: its source file, its symbol, its declared C parameter list (the
    single source of the launch signature), its linkage and how its library is built. A relative
    path ("cuda/pointwise.cu") is a source shipped with capsules, an absolute one a library's.
    `extern "C"` kernels are their own PTX .entry; a kernel with C++ linkage is named as C++ writes
    it ("ns::rows_max", "scale<float>") and found among the PTX entries by its demangled name."""

    path: str
    symbol: str
    params: tuple[str, ...]
    linkage: str = "C"
    """"C" (extern "C") or "C++"."""
    build: BuildOptions | None = None
    """None: the file alone, with the shipped headers (each built-in family is one unit)."""
    definition: str = ""
    """Where the source defines the kernel ("csrc/cuda/softmax.cu:42"; "" when not looked up)."""

    def declaration(self) -> str:
        extern = 'extern "C" ' if self.linkage == "C" else ""
        return f"{extern}__global__ void {self.symbol}({', '.join(self.params)})"


@dataclass(frozen=True)
class ContractDescriptor:
    """One aspect's contract: the claim, in words, the evidence behind it and the native symbols
    that implement it."""

    claim: ContractClaim
    summary: str
    evidence: ContractEvidence
    provenance: tuple[NativeSymbolRef, ...] = ()


class ReductionPolicy(str, Enum):
    FIXED_LEFT = "fixed-left"
    IMPLEMENTATION_DEFINED = "implementation-defined"
    NOT_APPLICABLE = "n/a"


@dataclass(frozen=True)
class NumericalPolicy:
    """How the kernel orders its reductions, with a note on what that means for this op."""

    reduction: ReductionPolicy
    note: str = ""


@dataclass(frozen=True)
class KernelCapsule:
    """One kernel's identity and promises."""

    name: str
    op: BackendOp | LibraryOp
    provider: Provider
    device: Device
    trust_level: TrustLevel
    supports_forward: bool
    vjp_mode: VJPMode
    layout: TensorLayout
    shape: ContractDescriptor
    layout_contract: ContractDescriptor
    value: ContractDescriptor
    vjp: ContractDescriptor
    numerical_policy: NumericalPolicy
    description: str
    family: str

    @property
    def module(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def descriptors(self) -> dict[Aspect, ContractDescriptor]:
        return {
            Aspect.SHAPE: self.shape,
            Aspect.LAYOUT: self.layout_contract,
            Aspect.VALUE: self.value,
            Aspect.VJP: self.vjp,
        }

    @property
    def symbols(self) -> tuple[NativeSymbolRef, ...]:
        """Every distinct entry point behind the capsule, forward first."""
        seen: dict[str, NativeSymbolRef] = {}
        for d in (self.value, self.vjp, self.shape, self.layout_contract):
            for ref in d.provenance:
                seen.setdefault(ref.symbol, ref)
        return tuple(seen.values())


def contracts_aligned(capsule: KernelCapsule) -> bool:
    """TorchLean's contractsAligned: each descriptor states its own obligation, the layout claim
    is the capsule's layout, and the VJP claim agrees with the VJP mode."""
    for aspect, descriptor in capsule.descriptors.items():
        if descriptor.claim.aspect is not aspect:
            return False
    if capsule.layout_contract.claim is not LAYOUT_CLAIMS[capsule.layout]:
        return False
    vjp_unavailable = capsule.vjp.claim is ContractClaim.VJP_UNAVAILABLE
    return vjp_unavailable == (capsule.vjp_mode is VJPMode.NONE)


def same_identity(a: KernelCapsule, b: KernelCapsule) -> bool:
    """Two capsules are the same kernel if one module (a library) implements the same op for the
    same provider and device twice: a catalog may hold at most one of them."""
    return (a.module, a.op, a.provider, a.device) == (b.module, b.op, b.provider, b.device)


class AssurancePolicy(str, Enum):
    CHECKED = "checked"
    """Admit only checked capsules."""
    EXTERNAL = "external"
    """Admit trusted-external capsules too."""
