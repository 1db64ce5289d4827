"""The native CUDA capsules: TorchLean's NN.Backend.NativeCUDA, made only through its eight
builders, in the catalog order of the seed.

Each op's row in `_OPS` holds the seed's one-line description, the value and VJP contracts in
one sentence each, and the entry points of its kernels in cuda/<family>.cu with their C
parameter lists (the single source of each launch signature).
"""

from __future__ import annotations

from dataclasses import dataclass

from capsule_core.catalog.kernel_capsules import Library, kernel_capsule
from capsule_core.model import (
    BackendOp,
    ContractClaim,
    KernelCapsule,
    NativeSymbolRef,
    Provider,
    ReductionPolicy,
    TensorLayout,
    VJPMode,
)

LIBRARY_NAME = Provider.NATIVE_CUDA.value

# C parameter lists, shared by the kernels of a family.
_N = ("int64_t n",)
_UNARY_FWD = ("const float* __restrict__ x", "float* __restrict__ y") + _N
_UNARY_BWD = ("const float* __restrict__ x", "const float* __restrict__ g", "float* __restrict__ dx") + _N
_BINARY_FWD = ("const float* __restrict__ x", "const float* __restrict__ y", "float* __restrict__ out") + _N
_BINARY_BWD = (
    "const float* __restrict__ x",
    "const float* __restrict__ y",
    "const float* __restrict__ g",
    "float* __restrict__ dx",
    "float* __restrict__ dy",
) + _N
_ROWS = ("int64_t rows", "int64_t cols")
_CHUNKED_ROWS = _ROWS + ("int64_t chunk",)
_AXIS3 = ("int64_t outer", "int64_t size", "int64_t inner")
_GEOM = (
    "int64_t d",
    "int64_t h",
    "int64_t w",
    "int64_t od",
    "int64_t oh",
    "int64_t ow",
    "int64_t kd",
    "int64_t kh",
    "int64_t kw",
    "int64_t sd",
    "int64_t sh",
    "int64_t sw",
    "int64_t pd",
    "int64_t ph",
    "int64_t pw",
)
"""Spatial geometry, every rank padded to 3-D (size 1, kernel 1, stride 1, padding 0)."""
_CONV = ("int64_t n", "int64_t c_in", "int64_t c_out") + _GEOM
_POOL = ("int64_t planes",) + _GEOM
_MM = ("int64_t batch", "int64_t m", "int64_t k", "int64_t n")
_LINEAR = ("int64_t rows", "int64_t in_features", "int64_t out_features")
_SPLITS = ("int64_t splits",)
_FNO = ("int64_t batch", "int64_t grid", "int64_t c_in", "int64_t c_out", "int64_t modes")
_PARTS = ("int64_t parts",)
_SCAN = ("int64_t batch", "int64_t time", "int64_t dim", "int32_t a_per_token", "int32_t b_per_token")


def _in(*names: str) -> tuple[str, ...]:
    return tuple(f"const float* __restrict__ {n}" for n in names)


def _out(*names: str) -> tuple[str, ...]:
    return tuple(f"float* __restrict__ {n}" for n in names)


_PACK = _in("weight") + _out("packed") + _CONV + ("int32_t flat",)
"""conv_pool: an implicit GEMM's weights packed for its reduction order (flat: a correlation over < 16 channels)."""
_KSUM = _in("partial") + _out("out") + ("int64_t count",) + _SPLITS
_GEMV = _in("x", "w", "b") + _out("y") + _LINEAR + ("int32_t k_warps",)


@dataclass(frozen=True)
class _Op:
    """What the builders need to know of one op."""

    family: str
    description: str
    value: str
    vjp: str
    kernels: tuple[tuple[str, tuple[str, ...]], ...]
    layout: TensorLayout = TensorLayout.FLAT_ROW_MAJOR


def _unary(description: str, value: str, vjp: str, extra: tuple[str, ...] = ()) -> _Op:
    return _Op(
        "pointwise",
        description,
        value,
        vjp,
        (("fwd", _UNARY_FWD[:2] + extra + _N), ("bwd", _UNARY_BWD[:3] + extra + _N)),
    )


def _binary(description: str, value: str, vjp: str) -> _Op:
    return _Op("pointwise", description, value, vjp, (("fwd", _BINARY_FWD), ("bwd", _BINARY_BWD)))


def _row_kernels(*scores: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """A row op's entry points (cuda/softmax.cu): per direction the lane-group kernel, the block
    per row, and the split-row pair (chunk partials into a workspace, then the finish)."""
    x, yg = _in(*scores), _in("y", "g")
    return (
        ("fwd", x + _out("y") + _ROWS),
        ("fwd_block", x + _out("y") + _ROWS),
        ("fwd_partials", x + _out("partials") + _CHUNKED_ROWS),
        ("fwd_finish", x + _in("partials") + _out("y") + _CHUNKED_ROWS),
        ("bwd", yg + _out("dx") + _ROWS),
        ("bwd_block", yg + _out("dx") + _ROWS),
        ("bwd_partials", yg + _out("partials") + _CHUNKED_ROWS),
        ("bwd_finish", yg + _in("partials") + _out("dx") + _CHUNKED_ROWS),
    )


def _conv_kernels(flat: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """conv's and conv_transpose's entry points (cuda/conv_pool.cu): the same implicit GEMMs, but
    for the pass with a flat variant (a correlation over < 16 channels): "fwd" or "bwd_x"."""
    kernels = (
        ("fwd_pack", _PACK),
        ("fwd", _in("x", "packed", "b") + _out("y") + _CONV),
        ("bwd_x_pack", _PACK),
        ("bwd_x", _in("g", "packed") + _out("dx") + _CONV),
        ("bwd_w", _in("x", "g") + _out("dw", "partial") + _CONV + ("int64_t splits",)),
        ("bwd_wsum", _in("partial") + _out("dw") + ("int64_t count", "int64_t splits")),
        ("bwd_b", _in("g") + _out("db") + _CONV),
    )
    at = [name for name, _ in kernels].index(flat) + 1
    return kernels[:at] + ((f"{flat}_flat", kernels[at - 1][1]),) + kernels[at:]


_OPS: dict[BackendOp, _Op] = {
    BackendOp.MATMUL: _Op(
        "linalg",
        "Native CUDA batched/matrix multiplication, backed by CUDA/cuBLAS paths.",
        "y = a·b per batch entry, a (…, m, k) and b (…, k, n) with equal batch shapes; k = 0 gives zeros.",
        "da = g·bᵀ and db = aᵀ·g per batch entry.",
        (
            ("fwd", _in("a", "b") + _out("y", "partial") + _MM + _SPLITS),
            ("fwd_ksum", _KSUM),
            ("bwd_a", _in("g", "b") + _out("da", "partial") + _MM + _SPLITS),
            ("bwd_b", _in("a", "g") + _out("db", "partial") + _MM + _SPLITS),
            ("bwd_ksum", _KSUM),
        ),
    ),
    BackendOp.LINEAR: _Op(
        "linalg",
        "Native CUDA linear layer.",
        "y = x·wᵀ + b over any leading axes of x (…, in), w (out, in), b (out).",
        "dx = g·w, dw = Σ gᵀ·x and db = Σ g over the leading axes.",
        (
            ("fwd", _in("x", "w", "b") + _out("y", "partial") + _LINEAR + _SPLITS),
            ("fwd_ksum", _in("partial", "b") + _out("y") + ("int64_t rows", "int64_t out_features") + _SPLITS),
            ("fwd_gemv8", _GEMV),
            ("fwd_gemv16", _GEMV),
            ("bwd_x", _in("g", "w") + _out("dx", "partial") + _LINEAR + _SPLITS),
            ("bwd_w", _in("x", "g") + _out("dw", "partial") + _LINEAR + _SPLITS),
            ("bwd_ksum", _KSUM),
            ("bwd_b", _in("g") + _out("db") + ("int64_t rows", "int64_t cols", "int64_t row_chunk")),
        ),
    ),
    BackendOp.MSE_LOSS: _Op(
        "linalg",
        "Native CUDA mean-squared-error loss.",
        "y = mean((pred − target)²) as a scalar; an empty input is refused.",
        "dpred = 2(pred − target)·g/n and dtarget is its negative.",
        (
            ("fwd", _in("pred", "target") + _out("partials", "y") + ("int64_t n", "int64_t chunk", "int32_t stage")),
            ("bwd", _in("pred", "target", "g") + _out("dpred", "dtarget") + _N),
        ),
    ),
    BackendOp.RELU: _unary(
        "Native CUDA ReLU activation.",
        "y = x if x > 0 else 0; NaN gives 0 and −0 gives +0.",
        "dx = g where x > 0, else 0 (relu′(0) = 0).",
    ),
    BackendOp.GELU: _unary(
        "Native CUDA GELU activation.",
        "The tanh approximation ½·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).",
        "dx = g times the exact derivative of the tanh approximation.",
    ),
    BackendOp.ADD: _binary(
        "Native-CUDA pointwise addition.", "out = x + y, correctly rounded, same shapes.", "dx = g and dy = g."
    ),
    BackendOp.SUB: _binary(
        "Native-CUDA pointwise subtraction.", "out = x − y, correctly rounded, same shapes.", "dx = g and dy = −g."
    ),
    BackendOp.MUL: _binary(
        "Native-CUDA pointwise multiplication.", "out = x·y, correctly rounded, same shapes.", "dx = g·y and dy = g·x."
    ),
    BackendOp.SCALE: _Op(
        "pointwise",
        "Native-CUDA scalar multiplication.",
        "y = c·x with c rounded to float32, correctly rounded.",
        "dx = c·g.",
        (("fwd", _UNARY_FWD[:2] + ("float c",) + _N), ("bwd", _in("g") + _out("dx") + ("float c",) + _N)),
    ),
    BackendOp.ABS: _unary(
        "Native-CUDA pointwise absolute value.", "y = |x|, exact.", "dx = sign(x)·g with sign(0) = sign(NaN) = 0."
    ),
    BackendOp.SQRT: _unary(
        "Native-CUDA pointwise square root.",
        "y = √x correctly rounded; x < 0 gives NaN and −0 gives −0.",
        "dx = g/(2√x) for x > 0, else 0.",
    ),
    BackendOp.CLAMP: _unary(
        "Native-CUDA pointwise interval clamp.",
        "y = min(max(x, lo), hi) with lo ≤ hi; NaN gives lo.",
        "dx = g strictly inside (lo, hi), else 0.",
        ("float lo", "float hi"),
    ),
    BackendOp.MAX: _binary(
        "Native-CUDA pointwise maximum.",
        "out = fmax(x, y): the non-NaN operand when one is NaN.",
        "The winner gets g, the loser 0; ties and NaN split ½g each.",
    ),
    BackendOp.MIN: _binary(
        "Native-CUDA pointwise minimum.",
        "out = fmin(x, y): the non-NaN operand when one is NaN.",
        "The winner gets g, the loser 0; ties and NaN split ½g each.",
    ),
    BackendOp.SIGMOID: _unary(
        "Native-CUDA pointwise sigmoid.", "y = 1/(1 + e^(−x)), never NaN for finite x.", "dx = g·y·(1 − y)."
    ),
    BackendOp.TANH: _unary(
        "Native-CUDA pointwise hyperbolic tangent.", "y = tanh x, saturating to ±1.", "dx = g·(1 − y²)."
    ),
    BackendOp.SOFTPLUS: _unary(
        "Native-CUDA pointwise softplus.",
        "y = max(x, 0) + log(1 + e^(−|x|)), with no threshold switch.",
        "dx = g·sigmoid(x).",
    ),
    BackendOp.EXP: _unary("Native-CUDA pointwise exponential.", "y = eˣ.", "dx = g·eˣ."),
    BackendOp.SIN: _unary(
        "Native CUDA sine, with angles measured in radians.", "y = sin x for x in radians.", "dx = g·cos x."
    ),
    BackendOp.COS: _unary(
        "Native CUDA cosine, with angles measured in radians.", "y = cos x for x in radians.", "dx = −g·sin x."
    ),
    BackendOp.LOG: _unary(
        "Native-CUDA pointwise natural logarithm.",
        "y = ln x with no guard: 0 gives −inf and x < 0 gives NaN.",
        "dx = g/x.",
    ),
    BackendOp.INV: _unary(
        "Native-CUDA pointwise reciprocal.", "y = 1/x correctly rounded; ±0 gives ±inf.", "dx = −g/x²."
    ),
    BackendOp.SAFE_LOG: _unary(
        "Native-CUDA guarded logarithm used by numerically defensive programs.",
        "y = ln(softplus(x) + eps) with eps > 0, smooth everywhere (not log(max(x, eps))).",
        "dx = g·sigmoid(x)/(softplus(x) + eps).",
        ("float eps",),
    ),
    BackendOp.LOG_SOFTMAX: _Op(
        "softmax",
        "Native-CUDA log-softmax reduction and normalization.",
        "Each row of the last axis becomes (x − m) − ln Σ exp(x − m) with m the row maximum.",
        "dx = g − exp(y)·Σ g per row.",
        _row_kernels("x"),
    ),
    BackendOp.SOFTMAX: _Op(
        "softmax",
        "Native CUDA row/axis softmax kernels.",
        "Each row of the last axis becomes exp(x − m)/Σ exp(x − m) with m the row maximum.",
        "dx = y·(g − Σ g·y) per row.",
        _row_kernels("x"),
    ),
    BackendOp.HARD_MASKED_SOFTMAX: _Op(
        "softmax",
        "Native CUDA hard-masked row softmax.",
        "Softmax over the entries whose mask is nonzero, exactly 0 elsewhere; a row with nothing allowed is zeros.",
        "dx = y·(g − Σ g·y) per row, so 0 at blocked entries; the mask gets no gradient.",
        _row_kernels("x", "mask"),
    ),
    BackendOp.REDUCE_SUM: _Op(
        "reduce",
        "Native-CUDA sum reduction.",
        "The sum over one axis (removed) or over everything (a scalar); an empty sum is 0.",
        "dx = g broadcast back over the reduced axis.",
        (
            ("fwd", _in("x") + _out("y") + _AXIS3 + ("int64_t chunk",)),
            ("fwd_block", _in("x") + _out("y") + ("int64_t outer", "int64_t size", "int64_t chunk")),
            ("bwd", _in("g") + _out("dx") + _AXIS3),
        ),
    ),
    BackendOp.REDUCE_MEAN: _Op(
        "reduce",
        "Native-CUDA arithmetic-mean reduction.",
        "The sum over one axis or everything times 1/n; an empty mean is NaN.",
        "dx = g/n broadcast back over the reduced axis.",
        (
            ("fwd", _in("x") + _out("y") + _AXIS3 + ("int64_t chunk", "int64_t count")),
            ("fwd_block", _in("x") + _out("y") + ("int64_t outer", "int64_t size", "int64_t chunk", "int64_t count")),
            ("bwd", _in("g") + _out("dx") + _AXIS3),
        ),
    ),
    BackendOp.RESHAPE: _Op(
        "view",
        "Native-CUDA shape-preserving reshape view.",
        "The same buffer under a new shape with the same element count (one −1 inferred): no copy, no launch.",
        "dx = g reshaped back.",
        (),
        TensorLayout.ALIAS,
    ),
    BackendOp.PERMUTE: _Op(
        "view",
        "Native-CUDA axis permutation.",
        "The axes of x (rank ≤ 8) in the order of perm, copied exactly.",
        "dx = g permuted by the inverse permutation.",
        (
            ("fwd", _in("x") + _out("y") + ("const int64_t* __restrict__ geometry", "int32_t rank") + _N),
            ("bwd", _in("g") + _out("dx") + ("const int64_t* __restrict__ geometry", "int32_t rank") + _N),
        ),
    ),
    BackendOp.BROADCAST: _Op(
        "view",
        "Native-CUDA tensor broadcasting.",
        "x read with its size-1 and missing leading axes repeated to the target shape (NumPy rules).",
        "dx = g summed over the broadcast axes.",
        (
            ("fwd", _in("x") + _out("y") + ("const int64_t* __restrict__ geometry", "int32_t rank") + _N),
            (
                "bwd",
                _in("g")
                + _out("dx")
                + ("const int64_t* __restrict__ geometry", "int32_t rank", "int64_t n_x", "int64_t copies"),
            ),
        ),
    ),
    BackendOp.CONCAT: _Op(
        "view",
        "Native-CUDA tensor concatenation.",
        "The inputs joined along any axis, any count, equal shapes elsewhere, copied exactly.",
        "Each input receives its own slice of g.",
        (
            (
                "fwd",
                _in("x")
                + _out("y")
                + ("int64_t outer", "int64_t size_in", "int64_t inner", "int64_t size_out", "int64_t offset"),
            ),
            (
                "bwd",
                _in("g")
                + _out("dx")
                + ("int64_t outer", "int64_t size_in", "int64_t inner", "int64_t size_out", "int64_t offset"),
            ),
        ),
    ),
    BackendOp.SLICE: _Op(
        "view",
        "Native-CUDA contiguous tensor slice.",
        "The contiguous range [start, start + length) along one axis, copied exactly.",
        "dx = g placed in zeros at the sliced range.",
        (
            ("fwd", _in("x") + _out("y") + _AXIS3 + ("int64_t start", "int64_t length")),
            ("bwd", _in("g") + _out("dx") + _AXIS3 + ("int64_t start", "int64_t length")),
        ),
    ),
    BackendOp.GATHER: _Op(
        "index",
        "Native-CUDA indexed gather.",
        "x taken along one axis at a 1-D index whose entries are checked to lie in [0, size).",
        "dx = g scatter-added back in index order, repeats accumulating; the index gets none.",
        (
            ("fwd", _in("x") + ("const int64_t* __restrict__ index",) + _out("y") + _AXIS3 + ("int64_t count",)),
            (
                "bwd",
                _in("g")
                + ("const int64_t* __restrict__ order", "const int64_t* __restrict__ starts")
                + _out("dx")
                + _AXIS3
                + ("int64_t count",),
            ),
        ),
    ),
    BackendOp.SCATTER_ADD: _Op(
        "index",
        "Native-CUDA indexed scatter-add.",
        "y = base with src added along one axis at a checked 1-D index, repeats accumulating.",
        "dbase = g and dsrc = g gathered at the index; the index gets none.",
        (
            (
                "fwd",
                _in("base", "src")
                + ("const int64_t* __restrict__ order", "const int64_t* __restrict__ starts")
                + _out("y")
                + _AXIS3
                + ("int64_t count",),
            ),
            (
                "bwd",
                _in("g") + ("const int64_t* __restrict__ index",) + _out("dbase", "dsrc") + _AXIS3 + ("int64_t count",),
            ),
        ),
    ),
    BackendOp.RAND_UNIFORM: _Op(
        "random",
        "Native-CUDA seeded uniform-random tensor generation.",
        "",
        "No reverse derivative: the op is a seeded source.",
        (("fwd", _out("y") + ("uint64_t seed",) + _N),),
    ),
    BackendOp.BERNOULLI_MASK: _Op(
        "random",
        "Native-CUDA seeded Bernoulli-mask generation.",
        "",
        "No reverse derivative: the op is a seeded source.",
        (("fwd", _out("y") + ("uint64_t seed", "float p") + _N),),
    ),
    BackendOp.LAYER_NORM: _Op(
        "norm",
        "Native CUDA layer normalization.",
        "Each row of the last axis normalised by its mean and biased variance plus eps, then scaled by gamma and shifted by beta.",
        "dx by the layer-norm adjoint per row; dgamma = Σ g·x̂ and dbeta = Σ g over rows.",
        (
            ("fwd", _in("x", "gamma", "beta") + _out("y", "mean", "rstd") + _ROWS + ("float eps",)),
            ("fwd_wide", _in("x", "gamma", "beta") + _out("y", "mean", "rstd") + _ROWS + ("float eps",)),
            ("bwd_x", _in("x", "gamma", "g") + _out("dx", "mean", "rstd") + _ROWS + ("float eps",)),
            ("bwd_x_wide", _in("x", "gamma", "g") + _out("dx", "partial") + _ROWS + ("int64_t parts", "float eps")),
            ("bwd_partials", _in("x", "g", "mean", "rstd") + _out("partial") + _ROWS + ("int64_t parts",)),
            ("bwd_params", _in("partial") + _out("dgamma", "dbeta") + ("int64_t cols", "int64_t parts")),
        ),
    ),
    BackendOp.BATCH_NORM: _Op(
        "norm",
        "Native CUDA batch normalization.",
        "Each channel normalised by its batch statistics over N and the spatial axes (training mode), then affine.",
        "dx by the batch-norm adjoint per channel; dgamma = Σ g·x̂ and dbeta = Σ g over N and space.",
        (
            (
                "fwd",
                _in("x", "gamma", "beta")
                + _out("y", "mean", "rstd", "partial")
                + ("int64_t n", "int64_t channels", "int64_t spatial", "int64_t parts", "float eps", "int32_t stage"),
            ),
            (
                "bwd_partials",
                _in("x", "g") + _out("partial") + ("int64_t n", "int64_t channels", "int64_t spatial", "int64_t parts"),
            ),
            (
                "bwd_params",
                _in("partial")
                + _out("mean", "rstd", "dgamma", "dbeta")
                + ("int64_t n", "int64_t channels", "int64_t spatial", "int64_t parts", "float eps"),
            ),
            (
                "bwd_x",
                _in("x", "gamma", "g", "mean", "rstd", "dgamma", "dbeta")
                + _out("dx")
                + ("int64_t n", "int64_t channels", "int64_t spatial"),
            ),
        ),
        TensorLayout.CHANNEL_FIRST,
    ),
    BackendOp.CONV: _Op(
        "conv_pool",
        "Native CUDA generic channel-first convolution.",
        "Cross-correlation of x (N, Ci, …) with w (Co, Ci, k…) plus b, spatial rank 1 to 3, per-axis stride and zero padding.",
        "dx, dw and db of the cross-correlation, as PyTorch's convNd.",
        _conv_kernels(flat="fwd"),
        TensorLayout.CHANNEL_FIRST,
    ),
    BackendOp.CONV_TRANSPOSE: _Op(
        "conv_pool",
        "Native CUDA generic channel-first transpose convolution.",
        "The adjoint of conv in x applied to x (N, Ci, …) with w (Ci, Co, k…), plus b; length (in − 1)·s + k − 2p.",
        "dx, dw and db of the transposed convolution, as PyTorch's conv_transposeNd.",
        _conv_kernels(flat="bwd_x"),
        TensorLayout.CHANNEL_FIRST,
    ),
    BackendOp.MAX_POOL: _Op(
        "conv_pool",
        "Native CUDA max pooling.",
        "The maximum over each window's real cells: padding and NaN never win; an all-NaN window gives NaN.",
        "g goes to one cell holding its window's maximum, none for an all-NaN window.",
        (
            ("fwd", _in("x") + _out("y") + _POOL),
            ("bwd_argmax", _in("x") + ("int32_t* __restrict__ argmax",) + _POOL),
            ("bwd_argmax_wide", _in("x") + ("int64_t* __restrict__ argmax",) + _POOL),
            ("bwd", ("const int32_t* __restrict__ argmax",) + _in("g") + _out("dx") + _POOL),
            ("bwd_wide", ("const int64_t* __restrict__ argmax",) + _in("g") + _out("dx") + _POOL),
        ),
        TensorLayout.CHANNEL_FIRST,
    ),
    BackendOp.SMOOTH_MAX_POOL: _Op(
        "conv_pool",
        "Native CUDA smooth max pooling.",
        "Per window, pivot + ln Σ exp(beta·(v − pivot))/beta over all cells with padding as 0, pivot the max (beta > 0) or min.",
        "g times the window's softmax weights, to real cells only.",
        (
            ("fwd", _in("x") + _out("y") + _POOL + ("float beta",)),
            ("bwd", _in("x", "y", "g") + _out("dx") + _POOL + ("float beta",)),
        ),
        TensorLayout.CHANNEL_FIRST,
    ),
    BackendOp.AVG_POOL: _Op(
        "conv_pool",
        "Native CUDA average pooling.",
        "The sum of each window's real cells over the kernel volume (padding counts as zeros).",
        "g/volume to each real cell of each window.",
        (("fwd", _in("x") + _out("y") + _POOL), ("bwd", _in("g") + _out("dx") + _POOL)),
        TensorLayout.CHANNEL_FIRST,
    ),
    BackendOp.FFT_FNO: _Op(
        "spectral",
        "Native CUDA FFT/FNO kernels.",
        "One FNO-1D spectral block: rfft over the grid, the first M modes mixed by w_re + i·w_im, irfft back (1/G).",
        "dx, dw_re and dw_im through the real-linear adjoints of rfft and irfft.",
        (
            ("fwd_twiddles", _out("table") + ("int64_t grid",)),
            ("fwd_analysis", _in("x", "table") + _out("spectrum") + _FNO + _PARTS),
            ("fwd_analysis_wide", _in("x", "table") + _out("spectrum") + _FNO + _PARTS),
            ("fwd_sum", _in("partial") + _out("spectrum") + _FNO + _PARTS),
            ("fwd_mix", _in("spectrum", "w_re", "w_im") + _out("mixed") + _FNO),
            ("fwd_synthesis", _in("mixed", "table") + _out("y") + _FNO),
            ("bwd_spectra", _in("x", "g", "table") + _out("xspec", "gspec") + _FNO + _PARTS),
            ("bwd_spectra_wide", _in("x", "g", "table") + _out("xspec", "gspec") + _FNO + _PARTS),
            ("bwd_sum", _in("xpart", "gpart") + _out("xspec", "gspec") + _FNO + _PARTS),
            ("bwd_mix", _in("gspec", "w_re", "w_im") + _out("gxspec") + _FNO),
            ("bwd_x", _in("gxspec", "table") + _out("dx") + _FNO),
            ("bwd_w", _in("xspec", "gspec") + _out("dw_re", "dw_im") + _FNO),
        ),
    ),
    BackendOp.SELECTIVE_SCAN: _Op(
        "scan",
        "Native CUDA selective scan kernels.",
        "h[t] = A[t]·h[t−1] + B[t]·X[t] from h0 per batch and channel, A and B shared or per token; y = h.",
        "da, db, dx and dh0 by the reverse recurrence, shared coefficients summed over time and batch.",
        (
            ("fwd", _in("x", "a", "b", "h0") + _out("y") + _SCAN),
            ("bwd", _in("x", "a", "b", "h0", "y", "g") + _out("dx", "da", "db", "dh0", "da_part", "db_part") + _SCAN),
            (
                "bwd_shared",
                _in("da_part", "db_part")
                + _out("da", "db")
                + ("int64_t batch", "int64_t dim", "int32_t a_per_token", "int32_t b_per_token"),
            ),
        ),
    ),
}


def _symbols(op: BackendOp, prefix: str) -> tuple[NativeSymbolRef, ...]:
    spec = _OPS[op]
    return tuple(
        NativeSymbolRef(f"cuda/{spec.family}.cu", f"capsule_{op.value}_{suffix}", params)
        for suffix, params in spec.kernels
        if suffix.startswith(prefix)
    )


def _capsule(
    name: str,
    op: BackendOp,
    value_summary: str,
    vjp_summary: str,
    vjp_mode: VJPMode,
    reduction: ReductionPolicy,
    value_claim: ContractClaim = ContractClaim.VALUE_MATCHES_REFERENCE,
    policy_note: str | None = None,
) -> KernelCapsule:
    spec = _OPS[op]
    return kernel_capsule(
        LIBRARY_NAME,
        op,
        _symbols(op, "fwd"),
        _symbols(op, "bwd"),
        value_summary=value_summary,
        vjp_summary=vjp_summary,
        description=spec.description,
        family=spec.family,
        vjp_mode=vjp_mode,
        reduction=reduction,
        layout=spec.layout,
        value_claim=value_claim,
        policy_note=policy_note,
    )


# -- the seed's eight builders -------------------------------------------------------------


def native_capsule(
    name: str, op: BackendOp, value_summary: str, vjp_summary: str, vjp_mode: VJPMode = VJPMode.BACKEND_VJP
) -> KernelCapsule:
    """Build a checked native-CUDA capsule with explicit FFI, value, VJP, and layout contracts."""
    return _capsule(name, op, value_summary, vjp_summary, vjp_mode, ReductionPolicy.NOT_APPLICABLE)


def native_pointwise_capsule(op: BackendOp) -> KernelCapsule:
    """Build the standard native-CUDA capsule for a pointwise operation."""
    return native_capsule(op.value, op, _OPS[op].value, _OPS[op].vjp)


def native_reduction_capsule(op: BackendOp) -> KernelCapsule:
    """Build a native-CUDA reduction capsule with implementation-selected parallel reduction order."""
    return _capsule(
        op.value, op, _OPS[op].value, _OPS[op].vjp, VJPMode.BACKEND_VJP, ReductionPolicy.IMPLEMENTATION_DEFINED
    )


def native_accumulation_capsule(
    name: str, op: BackendOp, value_summary: str, vjp_summary: str, vjp_mode: VJPMode = VJPMode.BACKEND_VJP
) -> KernelCapsule:
    """Native CUDA kernel with an accumulation whose tree/order is selected by the implementation."""
    return _capsule(name, op, value_summary, vjp_summary, vjp_mode, ReductionPolicy.IMPLEMENTATION_DEFINED)


def native_view_capsule(op: BackendOp) -> KernelCapsule:
    """Build the standard native-CUDA capsule for a shape or layout transformation."""
    return native_capsule(op.value, op, _OPS[op].value, _OPS[op].vjp)


def native_forward_only_capsule(op: BackendOp, value_summary: str) -> KernelCapsule:
    """Build a native-CUDA forward-only capsule with no registered reverse derivative."""
    return _capsule(
        op.value,
        op,
        value_summary,
        _OPS[op].vjp,
        VJPMode.NONE,
        ReductionPolicy.NOT_APPLICABLE,
        ContractClaim.VALUE_SEEDED_STREAM,
    )


def native_conv_pool_capsule(op: BackendOp) -> KernelCapsule:
    """Build a native-CUDA capsule for channel-first convolution or pooling."""
    return native_accumulation_capsule(op.value, op, _OPS[op].value, _OPS[op].vjp)


def native_selection_capsule(op: BackendOp) -> KernelCapsule:
    """Native window selection whose traversal and tie winner are chosen by the CUDA implementation."""
    return _capsule(
        op.value,
        op,
        _OPS[op].value,
        _OPS[op].vjp,
        VJPMode.BACKEND_VJP,
        ReductionPolicy.IMPLEMENTATION_DEFINED,
        policy_note="the window traversal and the tie winner are chosen by the kernel; "
        "each window's gradient goes to exactly one maximal cell",
    )


def _accumulation(op: BackendOp) -> KernelCapsule:
    return native_accumulation_capsule(op.value, op, _OPS[op].value, _OPS[op].vjp)


B = BackendOp
CAPSULES: tuple[KernelCapsule, ...] = (
    _accumulation(B.MATMUL),
    _accumulation(B.LINEAR),
    _accumulation(B.MSE_LOSS),
    *(
        native_pointwise_capsule(op)
        for op in (
            B.RELU,
            B.GELU,
            B.ADD,
            B.SUB,
            B.MUL,
            B.SCALE,
            B.ABS,
            B.SQRT,
            B.CLAMP,
            B.MAX,
            B.MIN,
            B.SIGMOID,
            B.TANH,
            B.SOFTPLUS,
            B.EXP,
            B.SIN,
            B.COS,
            B.LOG,
            B.INV,
            B.SAFE_LOG,
        )
    ),
    native_reduction_capsule(B.LOG_SOFTMAX),
    native_reduction_capsule(B.SOFTMAX),
    native_reduction_capsule(B.HARD_MASKED_SOFTMAX),
    native_reduction_capsule(B.REDUCE_SUM),
    native_reduction_capsule(B.REDUCE_MEAN),
    *(native_view_capsule(op) for op in (B.RESHAPE, B.PERMUTE, B.BROADCAST, B.CONCAT, B.SLICE)),
    native_capsule(B.GATHER.value, B.GATHER, _OPS[B.GATHER].value, _OPS[B.GATHER].vjp),
    _accumulation(B.SCATTER_ADD),
    native_forward_only_capsule(
        B.RAND_UNIFORM, "u = (r ≫ 8)·2⁻²⁴ in [0, 1) from the SplitMix64 counter stream of (seed, index)."
    ),
    native_forward_only_capsule(
        B.BERNOULLI_MASK, "1.0 where the seeded uniform u < p, else 0.0, with no 1/p rescaling."
    ),
    _accumulation(B.LAYER_NORM),
    _accumulation(B.BATCH_NORM),
    native_conv_pool_capsule(B.CONV),
    native_conv_pool_capsule(B.CONV_TRANSPOSE),
    native_selection_capsule(B.MAX_POOL),
    native_conv_pool_capsule(B.SMOOTH_MAX_POOL),
    native_conv_pool_capsule(B.AVG_POOL),
    _accumulation(B.FFT_FNO),
    _accumulation(B.SELECTIVE_SCAN),
)
"""Native CUDA capsules, excluding attention which has a dedicated semantic split."""

FAMILIES = {op.value: spec.family for op, spec in _OPS.items()}
"""Op name to kernel family (the cuda/<family>.cu file and the ops/<family>.py module)."""


def _family_plans(capsule: KernelCapsule):
    """capsule_core/kernels/plans/<family>.py: the family's PLANS and BUDGET (None before its kernels exist)."""
    import importlib

    module = f"capsule_core.kernels.plans.{capsule.family}"
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        return None


LIBRARY = Library(LIBRARY_NAME, "built-in", CAPSULES, _family_plans)
"""The 46 capsules as the first capsule library: kernels in cuda/<family>.cu, plans and budgets in
capsule_core/kernels/plans/<family>.py."""
