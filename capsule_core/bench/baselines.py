"""Library twins for `capsules bench`: which ops each baseline library computes, how, and why
the others are excluded.

A twin is what a user of the library would write for the op: one library call, or a short
composition of library calls where that is fair (the composition computes the same function;
it launches several kernels where the capsule launches one, which is part of what the ratio
measures). A twin is used only after it has matched the numpy float32 provider on the op's
medium samples (relative error under TWIN_TOLERANCE), so a wrong declaration shows up as an
exclusion with its error, never as a ratio against a different computation.

numpy and CuPy share one twin written against the array module `xp`; PyTorch has its own.
Every op is in TWINS or in NO_TWIN (a test keeps the table complete): gaps are declared here,
not decided in the engine.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

BASELINES = ("torch", "cupy", "numpy")
"""The baseline libraries, in the order of the report's columns."""
TWIN_TOLERANCE = 1e-4
"""Largest relative L2 error of a twin against the numpy float32 provider (float32 arithmetic
in another order lands far below it; TF32 or bf16 would not)."""

Twin = Callable[[Any, Mapping[str, Any], Mapping[str, Any]], Any]


@dataclass(frozen=True)
class Twins:
    """The twins of one op: `xp` for numpy and CuPy (array-module generic), `torch` for PyTorch,
    `cupy` to override xp on CuPy; `excluded` gives the reason for each library left out;
    `note` says where the libraries' policy differs from the capsule's on inputs bench never uses."""

    xp: Twin | None = None
    torch: Twin | None = None
    cupy: Twin | None = None
    excluded: Mapping[str, str] = field(default_factory=dict)
    note: str = ""

    def for_library(self, name: str) -> Twin | None:
        if name in self.excluded:
            return None
        if name == "torch":
            return self.torch
        if name == "cupy":
            return self.cupy or self.xp
        return self.xp


# -- helpers --------------------------------------------------------------------------------


def _F(torch):
    return torch.nn.functional


def _along(ndim: int, axis: int, index) -> tuple:
    """An index tuple selecting `index` along `axis` (every other axis whole)."""
    return (slice(None),) * (axis % ndim) + (index,)


def _row_softmax(xp, x):
    m = x.max(axis=-1, keepdims=True)
    e = xp.exp(x - m)
    return e / e.sum(axis=-1, keepdims=True)


def _row_log_softmax(xp, x):
    z = x - x.max(axis=-1, keepdims=True)
    return z - xp.log(xp.exp(z).sum(axis=-1, keepdims=True))


def _hard_masked_softmax(xp, x, mask):
    allowed = mask != 0
    z = xp.where(allowed, x, -xp.inf)
    m = z.max(axis=-1, keepdims=True)
    e = xp.where(allowed, xp.exp(z - m), 0)
    s = e.sum(axis=-1, keepdims=True)
    return xp.where(s > 0, e / s, 0).astype(x.dtype)


def _torch_hard_masked_softmax(torch, x, mask):
    return torch.softmax(x.masked_fill(mask == 0, float("-inf")), -1).nan_to_num(0.0)


def _layer_norm(xp, a, p):
    x = a["x"]
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / xp.sqrt(var + p["eps"]) * a["gamma"] + a["beta"]


def _batch_norm(xp, a, p):
    x = a["x"]
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    return (x - mean) / xp.sqrt(var + p["eps"]) * a["gamma"].reshape(shape) + a["beta"].reshape(shape)


def _torch_conv(transposed: bool):
    def twin(torch, a, p):
        rank = a["x"].ndim - 2
        name = f"conv_transpose{rank}d" if transposed else f"conv{rank}d"
        return getattr(_F(torch), name)(a["x"], a["w"], a["b"], stride=p["stride"], padding=p["padding"])

    return twin


def _torch_pool(kind: str):
    def twin(torch, a, p):
        rank = a["x"].ndim - 2
        stride = p["stride"] if p["stride"] is not None else p["kernel"]
        fn = getattr(_F(torch), f"{kind}_pool{rank}d")
        if kind == "avg":
            return fn(a["x"], p["kernel"], stride=stride, padding=p["padding"], count_include_pad=True)
        return fn(a["x"], p["kernel"], stride=stride, padding=p["padding"])

    return twin


def _fno(xp, a, p):
    x, w = a["x"], a["w_re"] + 1j * a["w_im"]
    grid, modes = x.shape[1], w.shape[0]
    spectrum = xp.fft.rfft(x, axis=1)
    full = xp.zeros((x.shape[0], grid // 2 + 1, w.shape[2]), dtype=spectrum.dtype)
    full[:, :modes] = xp.einsum("bmi,mio->bmo", spectrum[:, :modes], w.astype(spectrum.dtype))
    return xp.fft.irfft(full, n=grid, axis=1).astype(x.dtype)


def _torch_fno(torch, a, p):
    x = a["x"]
    grid, modes = x.shape[1], a["w_re"].shape[0]
    spectrum = torch.fft.rfft(x, dim=1)
    full = torch.zeros((x.shape[0], grid // 2 + 1, a["w_re"].shape[2]), dtype=spectrum.dtype, device=x.device)
    full[:, :modes] = torch.einsum("bmi,mio->bmo", spectrum[:, :modes], torch.complex(a["w_re"], a["w_im"]))
    return torch.fft.irfft(full, n=grid, dim=1)


def _scatter_add_xp(xp, a, p):
    y = a["base"].copy()
    xp.add.at(y, _along(y.ndim, p["axis"], a["index"]), a["src"])
    return y


def _scatter_add_cupy(cupy, a, p):
    import cupyx

    y = a["base"].copy()
    cupyx.scatter_add(y, _along(y.ndim, p["axis"], a["index"]), a["src"])
    return y


def _slice_xp(xp, a, p):
    x = a["x"]
    return xp.ascontiguousarray(x[_along(x.ndim, p["axis"], slice(p["start"], p["start"] + p["length"]))])


def _unary(xp_fn: str, torch_fn: str, note: str = "") -> Twins:
    return Twins(
        xp=lambda xp, a, p: getattr(xp, xp_fn)(a["x"]),
        torch=lambda torch, a, p: getattr(torch, torch_fn)(a["x"]),
        note=note,
    )


def _binary(xp_fn: str, torch_fn: str, note: str = "") -> Twins:
    return Twins(
        xp=lambda xp, a, p: getattr(xp, xp_fn)(a["x"], a["y"]),
        torch=lambda torch, a, p: getattr(torch, torch_fn)(a["x"], a["y"]),
        note=note,
    )


NO_NUMPY_CONV = "numpy has no convolution; a sliding-window composition would time copies the kernel does not make"
NO_NUMPY_POOL = "numpy has no pooling; a sliding-window composition would time copies the kernel does not make"
NO_CUPY_NN = "CuPy has no multi-channel N-D convolution or pooling outside its optional cuDNN module"
NAN_POLICY = "the library propagates NaN where the capsule's policy differs; bench inputs hold no NaN"

TWINS: dict[str, Twins] = {
    "relu": Twins(
        xp=lambda xp, a, p: xp.maximum(a["x"], 0), torch=lambda torch, a, p: torch.relu(a["x"]), note=NAN_POLICY
    ),
    "gelu": Twins(
        xp=lambda xp, a, p: 0.5 * a["x"] * (1 + xp.tanh(0.7978845608028654 * (a["x"] + 0.044715 * a["x"] ** 3))),
        torch=lambda torch, a, p: _F(torch).gelu(a["x"], approximate="tanh"),
        note="numpy/CuPy: the tanh formula composed from library calls",
    ),
    "add": _binary("add", "add"),
    "sub": _binary("subtract", "sub"),
    "mul": _binary("multiply", "mul"),
    "scale": Twins(xp=lambda xp, a, p: a["x"] * p["c"], torch=lambda torch, a, p: a["x"] * p["c"]),
    "abs": _unary("abs", "abs"),
    "sqrt": _unary("sqrt", "sqrt"),
    "clamp": Twins(
        xp=lambda xp, a, p: xp.clip(a["x"], p["lo"], p["hi"]),
        torch=lambda torch, a, p: torch.clamp(a["x"], p["lo"], p["hi"]),
        note=NAN_POLICY,
    ),
    "max": _binary("fmax", "fmax"),
    "min": _binary("fmin", "fmin"),
    "sigmoid": Twins(
        xp=lambda xp, a, p: 1 / (1 + xp.exp(-a["x"])),
        torch=lambda torch, a, p: torch.sigmoid(a["x"]),
        note="numpy/CuPy: 1/(1 + exp(-x)) composed",
    ),
    "tanh": _unary("tanh", "tanh"),
    "softplus": Twins(
        xp=lambda xp, a, p: xp.logaddexp(0, a["x"]),
        torch=lambda torch, a, p: _F(torch).softplus(a["x"]),
        note="PyTorch switches to x above 20 (a difference below float32's resolution)",
    ),
    "exp": _unary("exp", "exp"),
    "sin": _unary("sin", "sin"),
    "cos": _unary("cos", "cos"),
    "log": _unary("log", "log"),
    "inv": _unary("reciprocal", "reciprocal"),
    "safe_log": Twins(
        xp=lambda xp, a, p: xp.log(xp.logaddexp(0, a["x"]) + p["eps"]),
        torch=lambda torch, a, p: torch.log(_F(torch).softplus(a["x"]) + p["eps"]),
        note="no library twin: composed as log(softplus(x) + eps)",
    ),
    "log_softmax": Twins(
        xp=lambda xp, a, p: _row_log_softmax(xp, a["x"]),
        torch=lambda torch, a, p: torch.log_softmax(a["x"], -1),
        note="numpy/CuPy: composed (max, exp, sum, log)",
    ),
    "softmax": Twins(
        xp=lambda xp, a, p: _row_softmax(xp, a["x"]),
        torch=lambda torch, a, p: torch.softmax(a["x"], -1),
        note="numpy/CuPy: composed (max, exp, sum, divide)",
    ),
    "hard_masked_softmax": Twins(
        xp=lambda xp, a, p: _hard_masked_softmax(xp, a["x"], a["mask"]),
        torch=lambda torch, a, p: _torch_hard_masked_softmax(torch, a["x"], a["mask"]),
        note="composed: masked_fill(-inf), softmax, NaN rows to 0",
    ),
    "reduce_sum": Twins(
        xp=lambda xp, a, p: xp.sum(a["x"], axis=p["axis"]),
        torch=lambda torch, a, p: torch.sum(a["x"]) if p["axis"] is None else torch.sum(a["x"], dim=p["axis"]),
    ),
    "reduce_mean": Twins(
        xp=lambda xp, a, p: xp.mean(a["x"], axis=p["axis"]),
        torch=lambda torch, a, p: torch.mean(a["x"]) if p["axis"] is None else torch.mean(a["x"], dim=p["axis"]),
    ),
    "permute": Twins(
        xp=lambda xp, a, p: xp.ascontiguousarray(xp.transpose(a["x"], p["perm"])),
        torch=lambda torch, a, p: a["x"].permute(*p["perm"]).contiguous(),
    ),
    "broadcast": Twins(
        xp=lambda xp, a, p: xp.ascontiguousarray(xp.broadcast_to(a["x"], p["shape"])),
        torch=lambda torch, a, p: a["x"].expand(*p["shape"]).contiguous(),
    ),
    "concat": Twins(
        xp=lambda xp, a, p: xp.concatenate(a["xs"], axis=p["axis"]),
        torch=lambda torch, a, p: torch.cat(a["xs"], dim=p["axis"]),
    ),
    "slice": Twins(
        xp=_slice_xp, torch=lambda torch, a, p: a["x"].narrow(p["axis"], p["start"], p["length"]).contiguous()
    ),
    "gather": Twins(
        xp=lambda xp, a, p: xp.take(a["x"], a["index"], axis=p["axis"]),
        torch=lambda torch, a, p: torch.index_select(a["x"], p["axis"], a["index"]),
    ),
    "scatter_add": Twins(
        xp=_scatter_add_xp,
        cupy=_scatter_add_cupy,
        torch=lambda torch, a, p: torch.index_add(a["base"], p["axis"], a["index"], a["src"]),
        note="numpy: np.add.at (unbuffered); CuPy: cupyx.scatter_add; PyTorch: index_add",
    ),
    "layer_norm": Twins(
        xp=_layer_norm,
        torch=lambda torch, a, p: _F(torch).layer_norm(
            a["x"], (a["x"].shape[-1],), a["gamma"], a["beta"], eps=p["eps"]
        ),
        note="numpy/CuPy: composed",
    ),
    "batch_norm": Twins(
        xp=_batch_norm,
        torch=lambda torch, a, p: _F(torch).batch_norm(
            a["x"], None, None, a["gamma"], a["beta"], training=True, eps=p["eps"]
        ),
        note="training mode, batch statistics; numpy/CuPy: composed",
    ),
    "conv": Twins(
        torch=_torch_conv(False),
        excluded={"numpy": NO_NUMPY_CONV, "cupy": NO_CUPY_NN},
        note="PyTorch with TF32 off (cudnn.allow_tf32 = False): float32 arithmetic",
    ),
    "conv_transpose": Twins(
        torch=_torch_conv(True),
        excluded={"numpy": NO_NUMPY_CONV, "cupy": NO_CUPY_NN},
        note="PyTorch with TF32 off (cudnn.allow_tf32 = False): float32 arithmetic",
    ),
    "max_pool": Twins(torch=_torch_pool("max"), excluded={"numpy": NO_NUMPY_POOL, "cupy": NO_CUPY_NN}, note=NAN_POLICY),
    "avg_pool": Twins(
        torch=_torch_pool("avg"),
        excluded={"numpy": NO_NUMPY_POOL, "cupy": NO_CUPY_NN},
        note="count_include_pad=True, the capsule's divisor",
    ),
    "matmul": Twins(
        xp=lambda xp, a, p: xp.matmul(a["a"], a["b"]),
        torch=lambda torch, a, p: torch.matmul(a["a"], a["b"]),
        note="PyTorch with TF32 off (cuda.matmul.allow_tf32 = False): float32 arithmetic",
    ),
    "linear": Twins(
        xp=lambda xp, a, p: xp.matmul(a["x"], a["w"].T) + a["b"],
        torch=lambda torch, a, p: _F(torch).linear(a["x"], a["w"], a["b"]),
        note="numpy/CuPy: x @ w.T + b",
    ),
    "mse_loss": Twins(
        xp=lambda xp, a, p: xp.mean((a["pred"] - a["target"]) ** 2),
        torch=lambda torch, a, p: _F(torch).mse_loss(a["pred"], a["target"]),
    ),
    "fft_fno": Twins(
        xp=_fno, torch=_torch_fno, note="composed: rfft, per-mode einsum, irfft (how FNO layers are written)"
    ),
}

_RANDOM = (
    "a different generator: the libraries' random bits are not the spec's SplitMix64 counter stream, "
    "so their output is another function"
)
NO_TWIN: dict[str, str] = {
    "reshape": "no kernel: a reshape relabels its input's buffer, nothing moves",
    "rand_uniform": _RANDOM,
    "bernoulli_mask": _RANDOM,
    "smooth_max_pool": (
        "no library twin: a log-sum-exp over pooling windows with zero-counted padding; "
        "an unfold-based composition exists only in 2-D and would time copies the kernel does not make"
    ),
    "selective_scan": (
        "no library twin: a sequential linear recurrence over T; the libraries have no scan for it "
        "and a Python loop over T would time the interpreter"
    ),
}


def exclusion(op: str, library: str) -> str | None:
    """Why `library` has no twin for `op` (None when it has one)."""
    if op in NO_TWIN:
        return NO_TWIN[op]
    twins = TWINS.get(op)
    if twins is None:
        return "no twin declared in capsule_core/bench/baselines.py"
    if library in twins.excluded:
        return twins.excluded[library]
    if twins.for_library(library) is None:
        return f"no {library} twin declared"
    return None


def relative_error(candidate, expected) -> float:
    """‖c − e‖₂ / ‖e‖₂ over the elements finite in both; inf when shapes or the positions of
    non-finite values differ (a twin must give the same NaN / inf pattern)."""
    c = np.asarray(candidate, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if c.shape != e.shape:
        return math.inf
    finite_c, finite_e = np.isfinite(c), np.isfinite(e)
    if not np.array_equal(finite_c, finite_e):
        return math.inf
    if not np.array_equal(c[~finite_c], e[~finite_e], equal_nan=True):
        return math.inf
    c, e = c[finite_c], e[finite_e]
    norm = float(np.linalg.norm(e))
    diff = float(np.linalg.norm(c - e))
    if norm == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / norm


# -- the libraries --------------------------------------------------------------------------


class Library:
    """One baseline library on one device: converts arrays, runs a twin, times it."""

    name = ""
    device = "cpu"
    differentiates = False
    """Whether backward_call can differentiate a twin (a backward case's baseline)."""

    def problem(self) -> str | None:
        """Why this library cannot run here (None when it can)."""
        return None

    def module(self):
        raise NotImplementedError

    def to_library(self, arrays: Mapping[str, Any]) -> dict:
        """Inputs as this library's arrays on its device (a tuple stays a tuple: variadic input)."""
        out = {}
        for name, value in arrays.items():
            out[name] = tuple(self._one(v) for v in value) if isinstance(value, tuple) else self._one(value)
        return out

    def _one(self, array):
        return array

    def to_numpy(self, out) -> np.ndarray:
        return np.asarray(out)

    def call(self, twin: Twin, arrays: Mapping[str, Any], params: Mapping[str, Any]):
        with np.errstate(all="ignore"):
            return twin(self.module(), arrays, params)

    def backward_call(
        self, twin: Twin, arrays: Mapping[str, Any], params: Mapping[str, Any], cotangent, names: tuple[str, ...]
    ) -> Callable[[], tuple]:
        """A call giving the gradients of the twin's output at `cotangent` with respect to the inputs
        `names` (a variadic input's arrays in order); the forward is recorded once, outside it."""
        raise NotImplementedError

    def target(self, fn, cold_flush_bytes: int):
        raise NotImplementedError

    def synchronize(self):
        pass

    def cleanup(self):
        pass

    def settings(self) -> dict:
        return {}


class NumpyLibrary(Library):
    name, device = "numpy", "cpu"

    def module(self):
        return np

    def target(self, fn, cold_flush_bytes: int):
        from capsule_core.bench.cpu_timing import CpuFlush, WallClockTarget

        return WallClockTarget(fn, CpuFlush(cold_flush_bytes), timer="wall clock (numpy on the CPU)")

    def settings(self) -> dict:
        return {"version": np.__version__}


class TorchLibrary(Library):
    """PyTorch eager on the bench's device (the GPU for the cuda backend, else the CPU), TF32 off."""

    name = "torch"
    differentiates = True

    def __init__(self, device: str):
        self.device = device
        self._torch = None

    def problem(self) -> str | None:
        try:
            import torch
        except ImportError as exc:
            return f"PyTorch does not import ({exc})"
        if self.device == "cuda" and not torch.cuda.is_available():
            return "PyTorch sees no CUDA device"
        self._torch = torch
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        return None

    def module(self):
        return self._torch

    def _one(self, array):
        t = self._torch.from_numpy(np.ascontiguousarray(array))
        return t.to(self.device) if self.device == "cuda" else t

    def to_numpy(self, out) -> np.ndarray:
        return out.detach().cpu().numpy()

    def call(self, twin, arrays, params):
        with self._torch.no_grad():
            return twin(self._torch, arrays, params)

    def backward_call(self, twin, arrays, params, cotangent, names):
        """autograd.grad over the recorded forward, the graph kept between calls (retain_graph)."""
        torch = self._torch
        leaves = [
            t.requires_grad_()
            for name in names
            for t in (arrays[name] if isinstance(arrays[name], tuple) else (arrays[name],))
        ]
        with torch.enable_grad():
            y = twin(torch, arrays, params)
        g = self._one(cotangent)
        return lambda: torch.autograd.grad(y, leaves, g, retain_graph=True)

    def target(self, fn, cold_flush_bytes: int):
        if self.device == "cuda":
            return TorchCudaTarget(self._torch, fn, cold_flush_bytes)
        from capsule_core.bench.cpu_timing import CpuFlush, WallClockTarget

        return WallClockTarget(fn, CpuFlush(cold_flush_bytes), timer="wall clock (PyTorch on the CPU)")

    def synchronize(self):
        if self.device == "cuda":
            self._torch.cuda.synchronize()

    def cleanup(self):
        if self.device == "cuda" and self._torch is not None:
            self._torch.cuda.empty_cache()

    def settings(self) -> dict:
        torch = self._torch
        if torch is None:
            return {}
        return {
            "version": torch.__version__,
            "device": self.device,
            "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        }


class CupyLibrary(Library):
    name, device = "cupy", "cuda"

    def __init__(self):
        self._cupy = None

    def problem(self) -> str | None:
        try:
            import cupy
        except ImportError as exc:
            return f"CuPy does not import ({exc})"
        try:
            if cupy.cuda.runtime.getDeviceCount() < 1:
                return "CuPy sees no CUDA device"
        except Exception as exc:
            return f"CuPy cannot reach the GPU ({exc})"
        self._cupy = cupy
        return None

    def module(self):
        return self._cupy

    def _one(self, array):
        return self._cupy.asarray(np.ascontiguousarray(array))

    def to_numpy(self, out) -> np.ndarray:
        return self._cupy.asnumpy(out)

    def target(self, fn, cold_flush_bytes: int):
        return CupyCudaTarget(self._cupy, fn, cold_flush_bytes)

    def synchronize(self):
        self._cupy.cuda.Device().synchronize()

    def cleanup(self):
        if self._cupy is not None:
            self._cupy.get_default_memory_pool().free_all_blocks()

    def settings(self) -> dict:
        return {"version": self._cupy.__version__} if self._cupy is not None else {}


def libraries(device_kind: str) -> dict[str, Library]:
    """The baseline libraries for a run on `device_kind` ("cpu" or "cuda")."""
    out = {"torch": TorchLibrary("cuda" if device_kind == "cuda" else "cpu"), "numpy": NumpyLibrary()}
    if device_kind == "cuda":
        out["cupy"] = CupyLibrary()
    return out


# -- GPU timing of the libraries: the same shape as capsule_core.bench.device_timing.DeviceTimer ---

SPIN_SECONDS_MAX = 0.05
SPIN_CLOCK_HZ = 2.0e9
"""Cycles per second assumed by torch.cuda._sleep (an H200's top SM clock; slower clocks only
lengthen the spin, which is harmless)."""
_SPIN_SOURCE = r"""
extern "C" __global__ void capsule_bench_spin(long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < (unsigned long long) ns);
}
"""


class _GpuLibraryTarget:
    max_batch = 64

    def __init__(self, fn, flush_bytes: int):
        self.fn = fn
        self.flush_bytes = max(int(flush_bytes), 8 << 20)
        self.enqueue_s = 50e-6
        self.guarded = False
        self._pairs: list = []
        self._scratch = None

    def _event(self):
        raise NotImplementedError

    def _elapsed(self, start, end) -> float:
        raise NotImplementedError

    def _spin(self, seconds: float) -> bool:
        return False

    def _flush(self):
        raise NotImplementedError

    def run(self, n: int, cold: bool) -> list[float]:
        while len(self._pairs) < n:
            self._pairs.append((self._event(), self._event()))
        pairs = self._pairs[:n]
        self.guarded = self._spin(min(SPIN_SECONDS_MAX, 1.5 * n * self.enqueue_s + 2e-4))
        t0 = time.perf_counter()
        for start, end in pairs:
            if cold:
                self._flush()
            start.record()
            self.fn()
            end.record()
        self.enqueue_s = (time.perf_counter() - t0) / n
        pairs[-1][1].synchronize()
        return [self._elapsed(start, end) for start, end in pairs]

    def close(self):
        self._scratch = None
        self._pairs = []


class TorchCudaTarget(_GpuLibraryTarget):
    timer_name = "torch.cuda events"

    def __init__(self, torch, fn, flush_bytes: int):
        super().__init__(fn, flush_bytes)
        self.torch = torch

    def _event(self):
        return self.torch.cuda.Event(enable_timing=True)

    def _elapsed(self, start, end) -> float:
        return start.elapsed_time(end) * 1e-3

    def _spin(self, seconds: float) -> bool:
        sleep = getattr(self.torch.cuda, "_sleep", None)
        if sleep is None:
            return False
        sleep(int(seconds * SPIN_CLOCK_HZ))
        return True

    def _flush(self):
        if self._scratch is None:
            self._scratch = self.torch.empty(self.flush_bytes // 4, dtype=self.torch.float32, device="cuda")
        self._scratch.zero_()


class CupyCudaTarget(_GpuLibraryTarget):
    timer_name = "cupy.cuda events"

    def __init__(self, cupy, fn, flush_bytes: int):
        super().__init__(fn, flush_bytes)
        self.cupy = cupy
        self._kernel = None

    def _event(self):
        return self.cupy.cuda.Event()

    def _elapsed(self, start, end) -> float:
        return self.cupy.cuda.get_elapsed_time(start, end) * 1e-3

    def _spin(self, seconds: float) -> bool:
        if self._kernel is None:
            try:
                self._kernel = self.cupy.RawKernel(_SPIN_SOURCE, "capsule_bench_spin")
                self._kernel.compile()
            except Exception:  # no NVRTC here: time without the guard
                self._kernel = False
        if not self._kernel:
            return False
        self._kernel((1,), (1,), (np.int64(int(seconds * 1e9)),))
        return True

    def _flush(self):
        if self._scratch is None:
            self._scratch = self.cupy.empty(self.flush_bytes // 4, dtype=self.cupy.float32)
        self._scratch.fill(0)
