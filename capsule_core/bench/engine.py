"""`capsules bench`: honest kernel timings, throughput against the device's measured peaks,
library baselines as ratios, regressions against an earlier run.

Timing follows Triton's do_bench with its holes closed and nvbench's stopping rule: a warm-up
given in milliseconds; then batches of calls, one timer pair per call (CUDA events on the GPU,
perf_counter on the CPU), one synchronisation per batch; an optional cold-L2 mode that
overwrites a scratch buffer sized from the device's cache outside each timed pair; repeated
until the relative interquartile range of the samples falls under a threshold (2 %) or a time
cap. Raw samples are kept; the summary (median, quartiles) is computed apart, and the counts
actually used (warm-up calls, batches, samples, why it stopped) are recorded.

Bytes and flops come from the OpSpecs' cost models. The device's two ceilings are measured once
per run on the same device (a device-to-device copy, counting bytes read plus written; an
FMA-throughput kernel, cuda/peak.cu; on the CPU numpy.copyto and a BLAS sgemm), and each kernel
is shown as a percentage of the ceiling that bounds it by its arithmetic intensity.

A suite (capsule_core.bench.suites, `--suite`) instead pins each workload to explicit shapes,
forward or backward (the VJP at a seeded cotangent, counted by its least traffic), so that runs
before and after a kernel change time the same calls.

The engine returns typed results and never prints; capsule_core.render.report renders them.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import time
from dataclasses import dataclass, field, replace
from enum import Enum
from itertools import combinations
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from capsule_core.bench import baselines as twins_table
from capsule_core.bench.cpu_timing import (
    CPU_FLUSH_MAX,
    CpuFlush,
    WallClockTarget,
    cpu_cache_bytes,
    host_available_bytes,
)
from capsule_core.errors import CapsuleError, InputError
from capsule_core.kernels.launch import flat_buffers
from capsule_core.ops import get_spec
from capsule_core.ops.base import (
    Cost,
    OpSpec,
    Sample,
    normalize_params,
    numel,
    seeded_rng,
    shapes_of,
    validate,
    working_params,
)

SCHEMA = "capsules.bench"
SCHEMA_VERSION = 1

# -- statistics -----------------------------------------------------------------------------


def quantile(sorted_values: list[float], q: float) -> float:
    """The q-quantile by linear interpolation between order statistics (numpy's default)."""
    if not sorted_values:
        return math.nan
    position = q * (len(sorted_values) - 1)
    lo = math.floor(position)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (position - lo)


@dataclass(frozen=True)
class Summary:
    """Order statistics of a sample of times (seconds)."""

    n: int
    median: float
    q1: float
    q3: float
    min: float
    max: float
    mean: float

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def rel_iqr(self) -> float:
        """IQR / median: the noise measure of the stopping rule."""
        if self.median > 0:
            return self.iqr / self.median
        return 0.0 if self.iqr == 0 else math.inf


def summarize(samples: Iterable[float]) -> Summary:
    """Median, quartiles, extremes and mean of `samples`.

    >>> s = summarize([4.0, 1.0, 3.0, 2.0, 5.0])
    >>> (s.median, s.q1, s.q3, s.rel_iqr)
    (3.0, 2.0, 4.0, 0.6666666666666666)
    """
    values = sorted(float(v) for v in samples)
    if not values:
        return Summary(0, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan)
    return Summary(
        len(values),
        quantile(values, 0.5),
        quantile(values, 0.25),
        quantile(values, 0.75),
        values[0],
        values[-1],
        math.fsum(values) / len(values),
    )


@dataclass(frozen=True)
class StoppingRule:
    """nvbench's rule with the IQR as the noise measure: sample until the relative IQR is under
    `noise` (after at least `min_samples`), or until `max_time_s` of sampling has passed."""

    noise: float = 0.02
    min_samples: int = 10
    max_time_s: float = 0.5
    warmup_ms: float = 25.0
    batch_ms: float = 10.0
    max_samples: int = 5000

    def decide(self, samples: list[float], elapsed_s: float) -> str | None:
        """Why to stop now ("noise", "time cap", "sample cap"), or None to take another batch.

        >>> StoppingRule(noise=0.02, min_samples=3).decide([1.0, 1.0, 1.01], 0.0)
        'noise'
        >>> StoppingRule(noise=0.02, min_samples=3, max_time_s=1.0).decide([1.0, 2.0, 3.0], 0.5) is None
        True
        """
        if len(samples) >= self.max_samples:
            return "sample cap"
        if len(samples) >= self.min_samples and summarize(samples).rel_iqr < self.noise:
            return "noise"
        if samples and elapsed_s >= self.max_time_s:
            return "time cap"
        return None


@dataclass(frozen=True)
class Measurement:
    """One timed target: the raw samples (seconds per call), their summary, and the counts used."""

    timer: str
    samples: tuple[float, ...]
    summary: Summary
    stop: str
    warmup_calls: int
    warmup_s: float
    batches: int
    batch_size: int
    cold: bool
    guarded: bool | None
    """GPU timers: whether a spin kernel covered the host's enqueueing (None on the CPU)."""

    @property
    def converged(self) -> bool:
        return self.stop == "noise"


def measure(target, rule: StoppingRule, cold: bool, clock: Callable[[], float] = time.perf_counter) -> Measurement:
    """Warm up for rule.warmup_ms (batches of 1, 2, 4, ... calls, discarded), size batches to about
    rule.batch_ms from the warm-up, then sample batch after batch until the rule says stop.

    Batches are sized by the wall time a call took in the warm-up (flush and host work included),
    so that the time cap is overshot by at most about one batch.
    `target` has run(n, cold) -> n seconds-per-call samples, max_batch and timer_name."""
    start = clock()
    calls, n, last, wall = 0, 1, [], 0.0
    while True:
        before = clock()
        last = target.run(n, cold)
        wall = (clock() - before) / n
        calls += n
        if (clock() - start) * 1e3 >= rule.warmup_ms:
            break
        n = min(2 * n, target.max_batch)
    warmup_s = clock() - start
    # a call costs its timed part plus what surrounds it (a cache flush, the host's enqueueing)
    per_call = max(summarize(last).median if last else 0.0, wall)
    batch = max(1, min(target.max_batch, int(rule.batch_ms * 1e-3 / per_call) if per_call > 0 else target.max_batch))
    samples: list[float] = []
    batches = 0
    sampling = clock()
    while True:
        samples.extend(target.run(batch, cold))
        batches += 1
        stop = rule.decide(samples, clock() - sampling)
        if stop:
            break
    return Measurement(
        target.timer_name,
        tuple(samples),
        summarize(samples),
        stop,
        calls,
        warmup_s,
        batches,
        batch,
        cold,
        getattr(target, "guarded", None),
    )


# -- throughput against the measured peaks ----------------------------------------------------


@dataclass(frozen=True)
class Peak:
    """A measured ceiling: `value` in bytes/s (bandwidth) or flop/s (compute)."""

    kind: str
    value: float
    work: int
    how: str
    measurement: Measurement


@dataclass(frozen=True)
class Peaks:
    bandwidth: Peak | None
    compute: Peak | None
    problems: tuple[str, ...] = ()
    poisoned: str | None = None
    """Set when a peak's launch failed and took the CUDA context with it."""

    @property
    def ridge(self) -> float | None:
        """The intensity (flop/byte) where the two roofs meet."""
        if self.bandwidth and self.compute:
            return self.compute.value / self.bandwidth.value
        return None


@dataclass(frozen=True)
class Throughput:
    gbps: float
    gflops: float | None
    """None where no flop model exists (a backward)."""
    intensity: float | None
    bound: str | None
    """"memory" or "compute": the roof over this intensity; None without both peaks."""
    peak_pct: float | None


def throughput(cost: Cost, seconds: float, peaks: Peaks) -> Throughput:
    """GB/s and GFLOP/s at `seconds` per call; the percentage of the roof that bounds the kernel:
    memory below the ridge intensity (GB/s over the copy peak), compute above (GFLOP/s over the
    FMA peak).

    >>> p = Peaks(Peak("bandwidth", 1e12, 0, "", None), Peak("compute", 1e13, 0, "", None))
    >>> t = throughput(Cost(8_000_000, 4_000_000, 1_000_000), 1e-4, p)
    >>> (round(t.gbps), t.bound, round(t.peak_pct))
    (120, 'memory', 12)
    """
    gbps = cost.bytes / seconds / 1e9 if seconds > 0 else math.inf
    gflops = cost.flops / seconds / 1e9 if seconds > 0 else math.inf
    intensity = cost.flops / cost.bytes if cost.bytes else None
    ridge = peaks.ridge
    if ridge is None:
        return Throughput(gbps, gflops, intensity, None, None)
    if intensity is not None and intensity < ridge:
        return Throughput(gbps, gflops, intensity, "memory", 100 * gbps * 1e9 / peaks.bandwidth.value)
    if intensity is None and cost.flops == 0:
        return Throughput(gbps, gflops, intensity, None, None)
    return Throughput(gbps, gflops, intensity, "compute", 100 * gflops * 1e9 / peaks.compute.value)


# -- devices: where the kernels run -------------------------------------------------------------


class NoKernel(CapsuleError):
    """The capsule has nothing to time on this device (no launch plan, or no launch)."""


NUMPY_SUITE_LIMIT = 128 << 20
"""Largest working set of a suite case the numpy backend times (bench_suites): on a 2-core host the
reference cases up to 128 MiB take under a second a call (softmax 4096x4096, linear, fft_fno), the
next ones 5 to 10 s (matmul 4096^3 at 192 MiB, max_pool's backward) and conv's 0.8 GB about a minute."""


class BenchDevice:
    """What the bench devices share: the facts a report records of its device."""

    def facts(self) -> dict:
        return {
            "kind": self.kind,
            "name": self.name,
            "description": self.description,
            "timer": self.timer,
            "cache_bytes": self.cache_bytes,
            "memory_bytes": self.total_bytes,
        }


class NumpyDevice(BenchDevice):
    """The numpy float32 provider on the CPU, timed with wall-clock timers."""

    kind = "cpu"
    name = "numpy"
    timer = "wall clock"
    suite_limit: int | None = NUMPY_SUITE_LIMIT

    def __init__(self):
        self.cache_bytes = cpu_cache_bytes()
        self.description = f"numpy {np.__version__} float32 provider on {platform.machine()} ({os.cpu_count()} CPUs)"
        self.total_bytes = None
        self._flush = CpuFlush(min(2 * self.cache_bytes, CPU_FLUSH_MAX))

    def free_bytes(self) -> int | None:
        return host_available_bytes()

    def unavailable(self, spec: OpSpec, direction: str = "fwd", capsule=None) -> str | None:
        """Why this device has nothing to time for the op in this direction (None: it has)."""
        return None

    def kernel_target(self, spec: OpSpec, arrays: dict, params: dict, cotangent=None, capsule=None):
        """The forward call, or with a cotangent the VJP at it (the forward's y made beforehand)."""
        p = working_params(params, np.float32)
        if cotangent is None:

            def call():
                with np.errstate(all="ignore"):
                    spec.forward(arrays, p)
        else:
            with np.errstate(all="ignore"):
                y = spec.forward(arrays, p)

            def call():
                with np.errstate(all="ignore"):
                    spec.vjp(arrays, p, y, cotangent)

        return WallClockTarget(call, self._flush)

    def copy_peak(self):
        available = host_available_bytes() or (1 << 31)
        nbytes = int(min(256 << 20, available // 8)) // 4 * 4
        src = np.full(nbytes // 4, 1.0, dtype=np.float32)
        dst = np.empty_like(src)
        return (
            WallClockTarget(lambda: np.copyto(dst, src)),
            2 * nbytes,
            f"numpy.copyto of {nbytes >> 20} MiB, counting bytes read + written",
        )

    def compute_peak(self):
        n = 1024
        rng = np.random.default_rng(0)
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        out = np.empty((n, n), dtype=np.float32)
        return (
            WallClockTarget(lambda: np.matmul(a, b, out=out)),
            2 * n**3,
            f"numpy.matmul float32 {n}x{n}x{n}, BLAS sgemm",
        )

    def release(self):
        pass

    def facts(self) -> dict:
        return {**super().facts(), "processor": platform.processor()}


class CudaDevice(BenchDevice):
    """A capsule's launch plan on the GPU, timed with CUDA events (capsule_core.backends.cuda)."""

    kind = "cuda"
    name = "cuda"
    timer = "cuda events"
    suite_limit: int | None = None
    """No working-set limit: what does not fit in device memory is skipped as out of memory."""

    def __init__(self, backend):
        from capsule_core.bench.device_timing import DeviceTimer

        self.backend = backend
        self.gpu = DeviceTimer(backend)
        self.cache_bytes = self.gpu.l2_bytes
        self.total_bytes = self.gpu.total_bytes
        self.description = backend.description

    def free_bytes(self) -> int | None:
        return self.gpu.free_bytes()

    @staticmethod
    def _plans(spec: OpSpec, capsule=None):
        """The capsule timed (the built-in one of the op unless another is given) and its plans."""
        from capsule_core.catalog.registry import lookup
        from capsule_core.kernels.launch import plan_functions

        capsule = capsule or lookup(spec.name)
        return capsule, plan_functions(capsule)

    def unavailable(self, spec: OpSpec, direction: str = "fwd", capsule=None) -> str | None:
        """Checked before any sample is made: an op without launch plans costs nothing to skip."""
        functions = self._plans(spec, capsule)[1]
        if functions is None:
            return "no launch plan: its kernels are not written yet"
        if direction == "bwd" and functions[1] is None:
            return "no backward launch plan"
        return None

    def kernel_target(self, spec: OpSpec, arrays: dict, params: dict, cotangent=None, capsule=None):
        """The forward plan, or with a cotangent the backward plan (given the forward's y on the
        host where it reads it)."""
        capsule, functions = self._plans(spec, capsule)
        if functions is None:
            raise NoKernel("no launch plan: its kernels are not written yet")
        host = flat_buffers(arrays)
        if cotangent is None:
            plan = functions[0](arrays, params)
        else:
            plan = functions[1](arrays, params)
            host["g"] = cotangent
            if any(b.name == "out" and b.role == "input" for b in plan.buffers):
                with np.errstate(all="ignore"):
                    host["out"] = spec.forward(arrays, working_params(params, np.float32))
        if not plan.kernel_launches:
            raise NoKernel("its plan launches no kernel")
        return self.gpu.plan_target(capsule, plan, host)

    def copy_peak(self):
        nbytes = int(min(1 << 30, self.gpu.free_bytes() // 4)) // 16 * 16
        if nbytes < 4 * self.cache_bytes:
            raise MemoryError(f"{nbytes} bytes free for the copy: too few to copy 4x the L2 ({self.cache_bytes} bytes)")
        target = self.gpu.copy_target(nbytes)
        return target, target.bytes_moved, f"cuMemcpyDtoDAsync of {nbytes >> 20} MiB, counting bytes read + written"

    def compute_peak(self):
        target = self.gpu.fma_target()
        return (
            target,
            target.flops,
            f"capsule_peak_fma (cuda/peak.cu): {target.grid[0]} blocks x {target.BLOCK} "
            f"threads x {target.iterations} x 8 float32 FMAs",
        )

    def release(self):
        self.gpu.release()

    def facts(self) -> dict:
        return {**super().facts(), "multiprocessors": self.gpu.multiprocessors, "arch": self.backend.arch}


def device_for(backend):
    """The bench device of a backend from capsule_core.backends.select.resolve."""
    return CudaDevice(backend) if backend.name == "cuda" else NumpyDevice()


def measure_peaks(device, rule: StoppingRule) -> Peaks:
    """The device's copy bandwidth and compute ceiling, each from the median of its samples."""
    found, problems = {}, []
    for kind, make in (("bandwidth", device.copy_peak), ("compute", device.compute_peak)):
        target = None
        try:
            target, work, how = make()
            m = measure(target, rule, cold=False)
            found[kind] = Peak(kind, work / m.summary.median, int(work), how, m)
        except Exception as exc:  # a ceiling that cannot be measured leaves the percentages empty, not the run
            problems.append(f"{kind} peak not measured: {type(exc).__name__}: {exc}")
            if getattr(exc, "poisoned", False):
                return Peaks(found.get("bandwidth"), None, tuple(problems), poisoned=str(exc))
        finally:
            if target is not None:
                target.close()
    return Peaks(found.get("bandwidth"), found.get("compute"), tuple(problems))


# -- sizes ------------------------------------------------------------------------------------

NAMED_SIZES = ("small", "medium", "large")
AUTO_CACHE_MULTIPLE = 4
"""--size auto on a GPU: the large samples grown until one call moves 4x the L2."""
_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
}


@dataclass(frozen=True)
class Size:
    """Which samples to time: a named sample set, optionally resized to `target_bytes` moved per
    call (`grow_only`: never shrink; --size auto)."""

    label: str
    samples: str
    target_bytes: int | None = None
    grow_only: bool = False


def parse_size(text: str) -> Size:
    """small, medium, large, auto, or a byte count moved per call (256MB, 1GiB, 1e9).

    >>> parse_size("1GiB").target_bytes, parse_size("200MB").target_bytes, parse_size("large").samples
    (1073741824, 200000000, 'large')
    """
    value = text.strip().lower()
    if value in NAMED_SIZES:
        return Size(value, value)
    if value == "auto":
        return Size("auto", "large", None, True)
    match = re.fullmatch(r"(\d+(?:\.\d*)?(?:e\d+)?)\s*([a-z]*)", value)
    if not match or match.group(2) not in _UNITS:
        raise ValueError(f"{text!r} is not small, medium, large, auto or a byte count (256MB, 1GiB, 1e9)")
    nbytes = int(float(match.group(1)) * _UNITS[match.group(2)])
    if nbytes < 1:
        raise ValueError(f"{text!r}: a size must be at least one byte")
    return Size(f"{nbytes} bytes", "large", nbytes)


def resolve_target(size: Size, device) -> int | None:
    """Bytes per call to resize to: --size BYTES, or for auto on a GPU 4x its L2 (the large samples
    of the pointwise ops fit in an H200's L2, where they would time the cache, not memory)."""
    if size.target_bytes is not None:
        return size.target_bytes
    if size.grow_only and device.kind == "cuda":
        return AUTO_CACHE_MULTIPLE * device.cache_bytes
    return None


def _scaled(shape, axis: int, length: int) -> tuple:
    shape = list(shape)
    shape[axis] = length
    return tuple(shape)


def _slots(spec: OpSpec, sample: Sample, params: dict, axis: int) -> list[tuple]:
    """What a resize along `axis` may stretch: every input whose extent there equals the first
    input's (a shared batch or row axis), and every positive `shape` parameter entry."""
    slots, first = [], None
    for t in spec.inputs:
        value = sample.inputs[t.name]
        arrays = list(enumerate(value)) if isinstance(value, (tuple, list)) else [(None, value)]
        for index, array in arrays:
            shape = np.shape(array)
            if not shape or shape[axis] < 1:
                continue
            if first is None:
                first = shape[axis]
            if shape[axis] == first:
                slots.append(("input", t.name, index, shape[axis]))
    for p in spec.params:
        value = params.get(p.name)
        if p.kind == "shape" and value and int(value[axis]) >= 1:
            slots.append(("param", p.name, None, int(value[axis])))
    return slots


def _apply(spec: OpSpec, shapes: dict, params: dict, slots, axis: int, factor: float):
    """Shapes and params with each slot's extent scaled by `factor` (at least 1)."""
    shapes, params = dict(shapes), dict(params)
    lengths = {}
    for kind, name, index, extent in slots:
        length = max(1, int(round(extent * factor)))
        lengths[(kind, name, index)] = length
        if kind == "param":
            params[name] = _scaled(params[name], axis, length)
        elif index is None:
            shapes[name] = _scaled(shapes[name], axis, length)
        else:
            shapes[name] = tuple(_scaled(s, axis, length) if i == index else s for i, s in enumerate(shapes[name]))
    return shapes, params, lengths


def _cost_at(spec: OpSpec, shapes, params) -> Cost | None:
    try:
        spec.shape(shapes, params)
        return spec.cost(shapes, params)
    except (InputError, ValueError, ZeroDivisionError):
        return None


def _input_bytes(spec: OpSpec, shapes: dict, differentiable_only: bool = False) -> int:
    """Bytes of the inputs at these shapes (of the differentiable ones only: their gradients')."""
    total = 0
    for t in spec.inputs:
        if differentiable_only and not t.differentiable:
            continue
        item = 8 if t.dtype == "int64" else 4
        value = shapes[t.name]
        parts = value if t.variadic else (value,)
        total += sum(item * numel(s) for s in parts)
    return total


def _footprint(spec: OpSpec, shapes: dict, params: dict) -> int:
    """Host bytes of the inputs and the output of one call at these shapes."""
    return _input_bytes(spec, shapes) + 4 * numel(spec.shape(shapes, params))


def backward_cost(spec: OpSpec, shapes: dict, params: dict) -> Cost:
    """What a backward call moves at least: every input and the cotangent read once, a gradient
    per differentiable input written once. The OpSpecs model no backward flops (0 here), so a
    backward is judged by its traffic against the copy bandwidth.

    >>> from capsule_core.ops import get_spec
    >>> backward_cost(get_spec("layer_norm"), {"x": (2, 8), "gamma": (8,), "beta": (8,)}, {"eps": 1e-6})
    Cost(bytes_read=192, bytes_written=128, flops=0)
    """
    read = _input_bytes(spec, shapes) + 4 * numel(spec.shape(shapes, params))
    return Cost(read, _input_bytes(spec, shapes, differentiable_only=True), 0)


def working_set(spec: OpSpec, shapes: dict, params: dict, direction: str) -> int:
    """Bytes one call touches at least: its inputs and output forward, backward_cost's traffic
    backward (the measure of a suite case's size against a device's suite_limit)."""
    return _footprint(spec, shapes, params) if direction == "fwd" else backward_cost(spec, shapes, params).bytes


def resize(
    spec: OpSpec, sample: Sample, target_bytes: int, grow_only: bool = False, memory_limit: int | None = None
) -> tuple[Sample, str]:
    """The sample stretched (or shrunk) along a shared leading axis, else a trailing one, until one
    call moves about `target_bytes` by the op's cost model; values are tiled, so every value and
    index stays one the op accepts. Returns (sample, a note saying what changed).

    Raises MemoryError when the resized inputs and output would not fit in `memory_limit` bytes."""
    params = normalize_params(spec, sample.params)
    shapes = shapes_of(sample.inputs)
    base = spec.cost(shapes, params).bytes
    if base == target_bytes or (grow_only and base >= target_bytes):
        return sample, ""
    for axis in (0, -1):
        slots = _slots(spec, sample, params, axis)
        subsets = (
            [list(c) for r in range(len(slots), 0, -1) for c in combinations(slots, r)]
            if len(slots) <= 8
            else [slots] + [[s] for s in slots]
        )
        for subset in subsets:
            doubled = _cost_at(spec, *_apply(spec, shapes, params, subset, axis, 2.0)[:2])
            if doubled is None or doubled.bytes <= base:
                continue
            exact = 1.0 + (target_bytes - base) / (doubled.bytes - base)
            for factor in dict.fromkeys(f for f in (exact, round(exact), math.ceil(exact), math.floor(exact)) if f > 0):
                new_shapes, new_params, lengths = _apply(spec, shapes, params, subset, axis, factor)
                cost = _cost_at(spec, new_shapes, new_params)
                if cost is None:
                    continue
                need = _footprint(spec, new_shapes, new_params)
                if memory_limit is not None and need > memory_limit:
                    raise MemoryError(
                        f"resized to {cost.bytes} bytes per call it needs {need} bytes of host memory "
                        f"for its inputs and output, {memory_limit} available"
                    )
                resized = _materialize(sample, subset, axis, lengths, new_params)
                try:
                    validate(spec, resized.inputs, resized.params, np.float32)
                except InputError:
                    continue
                return resized, f"resized from {base} to {cost.bytes} bytes per call"
    return sample, f"kept at {base} bytes per call: no shared axis of its inputs stretches its cost"


def _materialize(sample: Sample, slots, axis: int, lengths: dict, params: dict) -> Sample:
    """Tile the chosen inputs along `axis` to their new lengths (cycling their own values)."""
    inputs = dict(sample.inputs)
    for kind, name, index, _extent in slots:
        if kind != "input":
            continue
        length = lengths[(kind, name, index)]
        if index is None:
            inputs[name] = _tile(inputs[name], axis, length)
        else:
            inputs[name] = tuple(_tile(a, axis, length) if i == index else a for i, a in enumerate(inputs[name]))
    new_params = dict(sample.params)
    for kind, name, _index, _extent in slots:
        if kind == "param":
            new_params[name] = params[name]
    return Sample(inputs, new_params, sample.case, sample.worst_case)


def _tile(array, axis: int, length: int):
    array = np.asarray(array)
    return np.take(array, np.arange(length) % array.shape[axis], axis=axis)


# -- results ------------------------------------------------------------------------------------


class CaseStatus(str, Enum):
    OK = "OK"
    SKIPPED = "SKIPPED"
    ERROR = "ERROR"


class BaselineStatus(str, Enum):
    OK = "OK"
    EXCLUDED = "EXCLUDED"
    """No twin computes the same thing (declared, or the declared twin disagreed)."""
    UNAVAILABLE = "UNAVAILABLE"
    """The library is not importable here, or not on this device."""
    SKIPPED = "SKIPPED"
    """Out of memory at this size."""
    ERROR = "ERROR"


@dataclass(frozen=True)
class BaselineResult:
    name: str
    device: str
    status: BaselineStatus
    reason: str = ""
    measurement: Measurement | None = None
    ratio: float | None = None
    """Baseline median / capsule median: above 1 the capsule is faster."""
    note: str = ""


@dataclass
class CaseResult:
    op: str
    capsule: str
    case: str
    shape: str
    """The sample's inputs and parameters in one line: the key of --compare."""
    shapes: dict
    params: dict
    status: CaseStatus
    reason: str = ""
    resized: str = ""
    cost: Cost | None = None
    measurement: Measurement | None = None
    throughput: Throughput | None = None
    baselines: list[BaselineResult] = field(default_factory=list)
    direction: str = "fwd"
    """"fwd" the op's call, "bwd" its VJP at a seeded cotangent (suite cases)."""


@dataclass(frozen=True)
class Settings:
    size: Size
    cold: bool = False
    rule: StoppingRule = StoppingRule()
    baselines: tuple[str, ...] = twins_table.BASELINES
    seed: int = 0
    suite: str | None = None
    """The bench_suites suite timed instead of sized samples (run_suite sets it)."""


@dataclass
class BenchReport:
    backend: str
    backend_note: str
    device: dict
    settings: Settings
    target_bytes: int | None = None
    peaks: Peaks | None = None
    cases: list[CaseResult] = field(default_factory=list)
    libraries: dict = field(default_factory=dict)
    compile_flags: tuple[str, ...] = ()
    comparison: "Comparison | None" = None
    errors: list[str] = field(default_factory=list)
    """Run-level failures (a lost CUDA context); each makes the exit code 1."""
    interrupted: bool = False
    seconds: float = 0.0

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        if self.errors or any(c.status is CaseStatus.ERROR for c in self.cases):
            return 1
        if self.comparison is not None and self.comparison.regressions:
            return 1
        return 0

    def excluded(self) -> list[tuple[str, str, str]]:
        """(op, baseline, reason) for every exclusion, once per op and baseline."""
        seen = {}
        for c in self.cases:
            for b in c.baselines:
                if b.status is BaselineStatus.EXCLUDED:
                    seen.setdefault((c.op, b.name), b.reason)
        return [(op, name, reason) for (op, name), reason in seen.items()]


# -- the engine -----------------------------------------------------------------------------------


CPU_BASELINE_MAX_S = 0.25
"""Sampling cap of a CPU baseline (numpy) in a GPU run: there it is a reference ratio, and at the
GPU's sizes each call takes long enough that a quarter second holds several samples."""


class TwinCheck:
    """Whether a library's twin computes what the op computes: run once per (op, library,
    direction) on the op's medium samples against the numpy float32 provider (backward: its VJP
    at the seeded cotangent against the library's gradients)."""

    def __init__(self, seed: int = 0):
        self.seed = seed
        self._verdicts: dict = {}

    def problem(self, spec: OpSpec, library, twin, direction: str = "fwd") -> str | None:
        key = (spec.name, library.name, direction)
        if key not in self._verdicts:
            self._verdicts[key] = self._check(spec, library, twin, direction)
        return self._verdicts[key]

    def _check(self, spec: OpSpec, library, twin, direction: str) -> str | None:
        from capsule_core.catalog.cpu_providers import NUMPY_F32

        for sample in spec.samples("medium", seeded_rng(spec.name, "bench-twin", self.seed)):
            try:
                params = normalize_params(spec, sample.params)
                data = library.to_library(sample.inputs)
                if direction == "fwd":
                    expected = [NUMPY_F32.forward(spec, sample.inputs, **sample.params)]
                    outs = [library.call(twin, data, params)]
                else:
                    g = cotangent(spec, sample, validate(spec, sample.inputs, sample.params, np.float32)[2], self.seed)
                    grads = NUMPY_F32.vjp(spec, sample.inputs, g, **sample.params)
                    expected = [
                        a
                        for name in spec.differentiable
                        for a in (grads[name] if isinstance(grads[name], tuple) else (grads[name],))
                    ]
                    outs = list(library.backward_call(twin, data, params, g, spec.differentiable)())
                errors = [twins_table.relative_error(library.to_numpy(o), e) for o, e in zip(outs, expected)]
                error = max(errors) if len(outs) == len(expected) else math.inf
            except Exception as exc:  # a twin that cannot run the op's own samples is no twin
                return f"its twin failed on {sample.case}: {type(exc).__name__}: {exc}"
            finally:
                library.cleanup()
            if not error <= twins_table.TWIN_TOLERANCE:
                return (
                    f"its twin does not compute the same thing: relative error {error:.2g} on {sample.case} "
                    f"(limit {twins_table.TWIN_TOLERANCE:g})"
                )
        return None


def cotangent(spec: OpSpec, sample: Sample, out_shape, seed: int = 0) -> np.ndarray:
    """The cotangent g a backward case is timed at, uniform in [-1, 1) and seeded by the case:
    the kernel and every baseline differentiate at the same g."""
    rng = seeded_rng(spec.name, f"cotangent/{sample.case}", seed)
    g = np.asarray(rng.random(tuple(out_shape), dtype=np.float32))
    g *= 2
    g -= 1
    return g


def _jsonable(value):
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


def _shape_line(sample: Sample) -> str:
    return sample.summary().split(": ", 1)[1] if ": " in sample.summary() else sample.summary()


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, MemoryError) or "out of memory" in str(exc).lower()


@dataclass(frozen=True)
class Workload:
    """What the engine times for one capsule in one direction: `drawn()` gives its samples as
    drawn (the records of a run that skips it); `prepared()` each sample to time, with a note
    (how it was resized) and the reason it is not timed (None when it is). Both can be called
    again: the GPU baselines' phase remakes the same samples from the seed."""

    spec: OpSpec
    capsule: Any
    label: str
    direction: str
    drawn: Callable[[], list[Sample]]
    prepared: Callable[[], Iterable[tuple[Sample, str, str | None]]]


def _sized_workload(capsule, settings: Settings, target_bytes: int | None) -> Workload:
    """A capsule's samples at settings.size, resized to target_bytes per call when given."""
    spec = get_spec(capsule.op.value)

    def drawn():
        named = settings.size.samples
        return spec.samples(named, seeded_rng(spec.name, f"bench-{named}", settings.seed))

    from capsule_core.catalog.registry import short_name

    label = short_name(capsule)
    return Workload(spec, capsule, label, "fwd", drawn, lambda: _samples(spec, settings, target_bytes))


def _suite_workload(case, device, settings: Settings) -> Workload:
    """One suite case at its own shapes; beyond the device's suite_limit its working set is the
    reason it is skipped, before any memory is taken."""
    from capsule_core.catalog.registry import lookup

    spec = get_spec(case.op)

    def prepared():
        limit = device.suite_limit
        need = working_set(spec, dict(case.shapes), normalize_params(spec, case.params), case.direction)
        if limit is not None and need > limit:
            yield (
                case.stand_in(),
                "",
                (
                    f"working set {need / 2**20:.0f} MiB (inputs, output"
                    f"{', cotangent, gradients' if case.direction == 'bwd' else ''}) is beyond "
                    f"the {device.name} backend's {limit / 2**20:g} MiB for suite cases: "
                    f"time it on a GPU (--backend cuda)"
                ),
            )
            return
        try:
            sample = case.sample(settings.seed)
        except MemoryError as exc:
            yield case.stand_in(), "", f"out of memory: making its inputs: {exc}"
            return
        yield sample, "", None

    return Workload(spec, lookup(case.op), case.name, case.direction, lambda: [case.stand_in()], prepared)


def run(
    capsules,
    device,
    settings: Settings,
    backend_note: str = "",
    *,
    progress: Callable[[int, int, str], None] | None = None,
    libraries: dict | None = None,
) -> BenchReport:
    """Time every sample of each capsule at settings.size on `device`, with the baselines."""
    target_bytes = resolve_target(settings.size, device)
    work = [_sized_workload(c, settings, target_bytes) for c in capsules]
    return _run(work, device, settings, backend_note, target_bytes, progress, libraries)


def run_suite(
    suite,
    device,
    settings: Settings,
    backend_note: str = "",
    *,
    progress: Callable[[int, int, str], None] | None = None,
    libraries: dict | None = None,
) -> BenchReport:
    """Time each case of a bench_suites.Suite at its own shapes (never resized) and in its
    direction, with the baselines. settings.size is ignored: the run is recorded as the suite's."""
    settings = replace(settings, size=Size("suite", suite.name), suite=suite.name)
    work = [_suite_workload(case, device, settings) for case in suite.cases]
    return _run(work, device, settings, backend_note, None, progress, libraries)


def _run(
    work: list[Workload], device, settings: Settings, backend_note: str, target_bytes: int | None, progress, libraries
) -> BenchReport:
    """Phase 1 times the kernels (and the CPU baselines); phase 2, on a GPU, hands the device over
    to PyTorch and CuPy (a PyCUDA context and theirs are never interleaved) and times their twins
    on the same inputs, remade from the same seed."""
    started = time.perf_counter()
    report = BenchReport(device.name, backend_note, device.facts(), settings, target_bytes)
    if device.kind == "cuda":
        from capsule_core.kernels.nvcc import COMPILE_FLAGS

        report.compile_flags = tuple(COMPILE_FLAGS)
    libs = {
        name: lib
        for name, lib in (libraries or twins_table.libraries(device.kind)).items()
        if name in settings.baselines
    }
    cpu_libs = [n for n in twins_table.BASELINES if n in libs and libs[n].device == "cpu"]
    gpu_libs = [n for n in twins_table.BASELINES if n in libs and libs[n].device != "cpu"]
    total = len(work) * (2 if gpu_libs else 1)
    done = 0
    checker = TwinCheck(settings.seed)
    problems: dict[str, str | None] = {}
    poisoned = None
    try:
        report.peaks = measure_peaks(device, settings.rule)
        if report.peaks.poisoned:
            poisoned = f"a peak measurement's launch failed: {report.peaks.poisoned}"
            report.errors.append(poisoned)
        for w in work:
            if progress:
                progress(done, total, f"bench {w.label}")
            missing = (
                f"not run: the CUDA context was lost ({poisoned})"
                if poisoned
                else device.unavailable(w.spec, w.direction, capsule=w.capsule)
            )
            if missing:  # skipped as drawn, without resizing
                report.cases += [_skipped(w, s, missing) for s in w.drawn()]
                done += 1
                continue
            for sample, note, failure in w.prepared():
                if poisoned:
                    report.cases.append(_skipped(w, sample, f"not run: the CUDA context was lost ({poisoned})"))
                    continue
                result, lost = _bench_case(w, sample, note, failure, device, settings, report.peaks)
                if lost:
                    poisoned = f"{w.spec.name} {sample.case}: {lost}"
                if result.status is CaseStatus.OK:
                    for name in cpu_libs:
                        result.baselines.append(
                            _baseline(libs[name], problems, w, sample, result, settings, checker, device)
                        )
                report.cases.append(result)
            done += 1
        if progress:
            progress(done, total, "bench")
        if gpu_libs and not poisoned:
            device.release()
            _gpu_baselines(report, work, libs, gpu_libs, problems, settings, checker, device, progress, done, total)
        for name, lib in libs.items():
            if problems.get(name) is None and name in problems:
                report.libraries[name] = lib.settings()
    except KeyboardInterrupt:
        report.interrupted = True
    order = {n: i for i, n in enumerate(twins_table.BASELINES)}
    for c in report.cases:
        c.baselines.sort(key=lambda b: order.get(b.name, 99))
    report.seconds = time.perf_counter() - started
    return report


def _samples(spec: OpSpec, settings: Settings, target_bytes: int | None):
    """(sample, resize note, failure) for each sample of the size; failure is an out-of-memory
    reason when the resized sample could not be made."""
    rng = seeded_rng(spec.name, f"bench-{settings.size.samples}", settings.seed)
    for sample in spec.samples(settings.size.samples, rng):
        if target_bytes is None:
            yield sample, "", None
            continue
        try:
            limit = host_available_bytes()
            resized, note = resize(
                spec, sample, target_bytes, settings.size.grow_only, None if limit is None else int(0.8 * limit)
            )
            yield resized, note, None
        except MemoryError as exc:
            yield sample, "", f"out of memory: {exc}"


def _skipped(w: Workload, sample, reason) -> CaseResult:
    return CaseResult(
        w.spec.name,
        w.capsule.name,
        sample.case,
        _shape_line(sample),
        _shapes_record(sample),
        _jsonable(dict(sample.params)),
        CaseStatus.SKIPPED,
        reason,
        direction=w.direction,
    )


def _shapes_record(sample: Sample) -> dict:
    return {
        k: (_jsonable([list(np.shape(a)) for a in v]) if isinstance(v, (tuple, list)) else list(np.shape(v)))
        for k, v in sample.inputs.items()
    }


def _failed(result: CaseResult, exc: Exception) -> tuple[CaseResult, str | None]:
    """Out of memory is a skip with its reason; anything else an ERROR (and, for a launch that
    poisoned the CUDA context, the reason every later case is not run)."""
    if _is_oom(exc):
        result.reason = f"out of memory: {exc}"
        return result, None
    result.status, result.reason = CaseStatus.ERROR, f"{type(exc).__name__}: {exc}"
    return result, (str(exc) if getattr(exc, "poisoned", False) else None)


def _bench_case(w: Workload, sample, note, failure, device, settings, peaks) -> tuple[CaseResult, str | None]:
    """One sample timed on the device in the workload's direction: (result, why the CUDA context
    was lost or None)."""
    spec = w.spec
    result = _skipped(w, sample, "")
    result.resized = note
    if failure:
        result.reason = failure
        return result, None
    try:
        arrays, params, out_shape = validate(spec, sample.inputs, sample.params, np.float32)
        result.params = _jsonable(params)
        g = None
        if w.direction == "bwd":
            result.cost = backward_cost(spec, shapes_of(arrays), params)
            g = cotangent(spec, sample, out_shape, settings.seed)
        else:
            result.cost = spec.cost(shapes_of(arrays), params)
        if result.cost.bytes == 0 and result.cost.flops == 0:
            result.reason = "moves no bytes and computes nothing: no kernel to time"
            return result, None
        target = device.kernel_target(spec, arrays, params, g, capsule=w.capsule)
    except NoKernel as exc:
        result.reason = str(exc)
        return result, None
    except Exception as exc:
        return _failed(result, exc)
    try:
        result.measurement = measure(target, settings.rule, settings.cold)
    except Exception as exc:
        return _failed(result, exc)
    finally:
        target.close()
    result.status, result.reason = CaseStatus.OK, ""
    result.throughput = throughput(result.cost, result.measurement.summary.median, peaks)
    if w.direction == "bwd":  # no flop model: only the traffic against the copy bandwidth
        result.throughput = replace(result.throughput, gflops=None, intensity=None)
    return result, None


def _baseline(
    lib, problems: dict, w: Workload, sample: Sample, case: CaseResult, settings: Settings, checker: TwinCheck, device
) -> BaselineResult:
    spec = w.spec
    why = twins_table.exclusion(spec.name, lib.name)
    if not why and w.direction == "bwd" and not lib.differentiates:
        why = f"no backward twin: {lib.name} does not differentiate"
    note = twins_table.TWINS[spec.name].note if spec.name in twins_table.TWINS else ""
    if why:
        return BaselineResult(lib.name, lib.device, BaselineStatus.EXCLUDED, why)
    if lib.name not in problems:
        problems[lib.name] = lib.problem()
    if problems[lib.name]:
        return BaselineResult(lib.name, lib.device, BaselineStatus.UNAVAILABLE, problems[lib.name])
    twin = twins_table.TWINS[spec.name].for_library(lib.name)
    mismatch = checker.problem(spec, lib, twin, w.direction)
    if mismatch:
        return BaselineResult(lib.name, lib.device, BaselineStatus.EXCLUDED, mismatch, note=note)
    flush_bytes = 2 * device.cache_bytes if lib.device == device.kind else 2 * cpu_cache_bytes()
    if lib.device == "cpu":
        flush_bytes = min(flush_bytes, CPU_FLUSH_MAX)
    rule = settings.rule
    if lib.device == "cpu" and device.kind == "cuda":
        rule = replace(rule, max_time_s=min(rule.max_time_s, CPU_BASELINE_MAX_S))
    target = None
    try:
        arrays, params, out_shape = validate(spec, sample.inputs, sample.params, np.float32)
        data = lib.to_library(arrays)
        if w.direction == "bwd":
            call = lib.backward_call(
                twin, data, params, cotangent(spec, sample, out_shape, settings.seed), spec.differentiable
            )
        else:

            def call():
                return lib.call(twin, data, params)

        target = lib.target(call, flush_bytes)
        m = measure(target, rule, settings.cold)
    except Exception as exc:
        status = BaselineStatus.SKIPPED if _is_oom(exc) else BaselineStatus.ERROR
        prefix = "out of memory: " if status is BaselineStatus.SKIPPED else f"{type(exc).__name__}: "
        return BaselineResult(
            lib.name, lib.device, status, prefix + str(exc).splitlines()[0] if str(exc) else prefix, note=note
        )
    finally:
        if target is not None:
            target.close()
        data = call = None
        lib.cleanup()
    kernel = case.measurement.summary.median
    return BaselineResult(
        lib.name, lib.device, BaselineStatus.OK, "", m, m.summary.median / kernel if kernel > 0 else None, note
    )


def _gpu_baselines(report, work, libs, names, problems, settings, checker, device, progress, done, total):
    by_key = {(c.op, c.case): c for c in report.cases}
    for w in work:
        if progress:
            progress(done, total, f"baselines {w.label}")
        for sample, _note, failure in w.prepared():
            case = by_key.get((w.spec.name, sample.case))
            if case is None or case.status is not CaseStatus.OK or failure:
                continue
            for name in names:
                case.baselines.append(_baseline(libs[name], problems, w, sample, case, settings, checker, device))
        done += 1
    if progress:
        progress(done, total, "bench")


# -- comparison with an earlier run ------------------------------------------------------------


class CompareError(CapsuleError):
    """--compare was given a file that is not a bench JSON document."""


def load_previous(path) -> dict:
    """An earlier `capsules bench --json` document (schema capsules.bench)."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as exc:
        raise CompareError(f"--compare: cannot read {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise CompareError(f"--compare: {path} is not JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("cases"), list):
        raise CompareError(f"--compare: {path} is not a `capsules bench --json` document (schema {SCHEMA})")
    if doc.get("schema_version", 0) > SCHEMA_VERSION:
        raise CompareError(
            f"--compare: {path} has schema version {doc.get('schema_version')}, newer than this tool's {SCHEMA_VERSION}"
        )
    return doc


class ChangeStatus(str, Enum):
    REGRESSED = "regressed"
    """Slower beyond the threshold even comparing the new run's fast quartile with the old slow one."""
    IMPROVED = "improved"
    UNCHANGED = "unchanged"
    """The medians differ by less than the threshold."""
    NOISY = "noisy"
    """The medians differ by more than the threshold, but the interquartile ranges say it may be noise."""
    NEW = "new"
    GONE = "gone"


@dataclass(frozen=True)
class Change:
    op: str
    case: str
    shape: str
    status: ChangeStatus
    old_median: float | None = None
    new_median: float | None = None
    change: float | None = None
    """new median / old median - 1."""
    low: float | None = None
    """The smallest slowdown the quartiles allow: new q1 / old q3 - 1."""
    high: float | None = None
    """The largest: new q3 / old q1 - 1."""


@dataclass
class Comparison:
    source: str
    threshold: float
    changes: list[Change]
    notes: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.status is ChangeStatus.REGRESSED]


def classify(
    old: Mapping[str, float], new: Mapping[str, float], threshold: float
) -> tuple[ChangeStatus, float, float, float]:
    """Noise-aware verdict on two timings (median, q1, q3 in seconds): a regression only when even
    the new run's first quartile is slower than the old run's third quartile by more than the
    threshold; an improvement symmetrically; a median change beyond the threshold whose quartiles
    overlap that far is NOISY, not a verdict.

    >>> classify({"median": 1.0, "q1": 0.99, "q3": 1.01}, {"median": 1.2, "q1": 1.19, "q3": 1.21}, 0.05)[0].value
    'regressed'
    >>> classify({"median": 1.0, "q1": 0.8, "q3": 1.2}, {"median": 1.1, "q1": 0.9, "q3": 1.3}, 0.05)[0].value
    'noisy'
    """
    change = new["median"] / old["median"] - 1
    low = new["q1"] / old["q3"] - 1
    high = new["q3"] / old["q1"] - 1
    if low > threshold:
        status = ChangeStatus.REGRESSED
    elif high < -threshold:
        status = ChangeStatus.IMPROVED
    elif abs(change) <= threshold:
        status = ChangeStatus.UNCHANGED
    else:
        status = ChangeStatus.NOISY
    return status, change, low, high


def compare(old: dict, report: BenchReport, threshold: float, source: str = "") -> Comparison:
    """Match the cases of an earlier run by (op, case, shape) and classify each change."""
    previous = {}
    for c in old.get("cases", []):
        t = c.get("time") or {}
        if c.get("status") == "OK" and all(
            isinstance(t.get(k), (int, float)) and t.get(k) > 0 for k in ("median_s", "q1_s", "q3_s")
        ):
            previous[(c.get("op"), c.get("case"), c.get("shape"))] = {
                "median": t["median_s"],
                "q1": t["q1_s"],
                "q3": t["q3_s"],
            }
    notes = []
    for key, label in (("backend", "backend"), ("device", "device")):
        was = old.get(key) if key == "backend" else (old.get("device") or {}).get("description")
        now = report.backend if key == "backend" else report.device.get("description")
        if was != now:
            notes.append(f"the earlier run's {label} was {was!r}, this one's is {now!r}")
    if bool((old.get("settings") or {}).get("cold")) != report.settings.cold:
        notes.append("one run flushed the L2 (--cold) and the other did not")
    changes, seen = [], set()
    for c in report.cases:
        key = (c.op, c.case, c.shape)
        if c.status is not CaseStatus.OK:
            continue
        seen.add(key)
        s = c.measurement.summary
        if key not in previous:
            changes.append(Change(c.op, c.case, c.shape, ChangeStatus.NEW, new_median=s.median))
            continue
        before = previous[key]
        status, change, low, high = classify(before, {"median": s.median, "q1": s.q1, "q3": s.q3}, threshold)
        changes.append(Change(c.op, c.case, c.shape, status, before["median"], s.median, change, low, high))
    for key, before in previous.items():
        if key not in seen:
            changes.append(Change(key[0], key[1], key[2], ChangeStatus.GONE, old_median=before["median"]))
    return Comparison(source, threshold, changes, notes)


def parse_percent(text: str, what: str) -> float:
    """'5', '5%' or '0.5 %' as a fraction (0.05); ValueError naming `what` otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*%?\s*", str(text))
    if not match:
        raise ValueError(f"{what}: {text!r} is not a percentage (5, 5%, 0.5%)")
    return float(match.group(1)) / 100
