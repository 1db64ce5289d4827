"""Launch plans: from an op's inputs and parameters to the exact kernel launches.

A plan names every device buffer (inputs, outputs, workspaces, host-prepared metadata) and
every launch (symbol, grid, block, dynamic shared memory, arguments in the order of the
registry's declared C parameter list). `check` validates plans without a GPU; the cuda backend
executes them, so a launch can only pass what the registry declares.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from capsule_core.kernels.c_types import BUFFER_DTYPES, C_TYPES
from capsule_core.model import KernelCapsule, NativeSymbolRef

BLOCK_LIMITS = (1024, 1024, 64)
MAX_THREADS_PER_BLOCK = 1024
GRID_LIMITS = (2**31 - 1, 65535, 65535)
STATIC_SHARED_LIMIT = 48 * 1024
DYNAMIC_SHARED_LIMIT = {"sm_80": 163 * 1024, "sm_90": 227 * 1024}
"""Per-block shared memory with the opt-in attribute (cudaFuncAttributeMaxDynamicSharedMemorySize)."""

ROLES = ("input", "output", "workspace", "meta")


@dataclass(frozen=True)
class Buffer:
    """A device buffer of a plan. `meta` buffers hold host-computed int64 data (geometry,
    sorted index order) whose contents are in LaunchPlan.host_data."""

    name: str
    role: str
    dtype: str
    elements: int

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"buffer {self.name}: role must be one of {ROLES}")
        if self.dtype not in BUFFER_DTYPES:
            raise ValueError(f"buffer {self.name}: dtype must be one of {', '.join(BUFFER_DTYPES)}")

    @property
    def itemsize(self) -> int:
        return np.dtype(BUFFER_DTYPES[self.dtype]).itemsize

    @property
    def nbytes(self) -> int:
        return max(self.elements, 0) * self.itemsize


@dataclass(frozen=True)
class Launch:
    """One kernel launch. `args` follow the symbol's declared C parameters one for one: a buffer
    name (str) for a pointer parameter, a number for a scalar parameter."""

    symbol: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple[Any, ...]
    shared_bytes: int = 0


@dataclass(frozen=True)
class View:
    """A pointer argument `offset` elements into a buffer: one image of a batch, one row block."""

    buffer: str
    offset: int


@dataclass(frozen=True)
class Memset:
    """A plan step between launches: every element of `buffer` set to `value` (a buffer that
    atomics accumulate into starts at 0, a max at -inf). 4-byte elements, or 0 for any."""

    buffer: str
    value: float | int = 0


@dataclass(frozen=True)
class Copy:
    """A plan step between launches: `elements` elements from `src` (at src_offset) to `dst`
    (at dst_offset), device to device."""

    src: str
    dst: str
    elements: int
    src_offset: int = 0
    dst_offset: int = 0


@dataclass(frozen=True)
class LaunchPlan:
    op: str
    direction: str
    buffers: tuple[Buffer, ...]
    launches: tuple[Launch | Memset | Copy, ...]
    """The plan's steps in order: kernel launches, and the memsets and copies between them."""
    host_data: Mapping[str, np.ndarray] = field(default_factory=dict)
    output_shapes: Mapping[str, tuple] = field(default_factory=dict)
    """Shape of each output buffer as the op's result (y, or a gradient per input)."""
    aliases: Mapping[str, str] = field(default_factory=dict)
    """Output buffer -> the input buffer whose memory it is (reshape): the backend allocates and
    writes nothing for it and hands back the input's memory under the output's shape."""

    @property
    def kernel_launches(self) -> tuple[Launch, ...]:
        return tuple(step for step in self.launches if isinstance(step, Launch))

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(name)


def flat_buffers(values: Mapping[str, Any], prefix: str = "") -> dict:
    """Per-input values under their plan buffer names: x becomes prefix + "x", a variadic input
    xs becomes prefix + "xs[0]", prefix + "xs[1]", ... ("d" names the gradients)."""
    flat = {}
    for name, value in values.items():
        if isinstance(value, (tuple, list)):
            flat.update({f"{prefix}{name}[{i}]": v for i, v in enumerate(value)})
        else:
            flat[f"{prefix}{name}"] = value
    return flat


def grid_1d(n: int, block: int = 256, max_blocks: int = 132 * 32) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """A grid-stride launch over n elements: at most `max_blocks` blocks (enough to fill an H200's
    132 SMs many times over), at least one block so that empty tensors still launch legally."""
    blocks = max(1, min(max_blocks, -(-n // block)))
    return (blocks, 1, 1), (block, 1, 1)


def warp_lanes(n: int) -> int:
    """The lanes of a warp that share one row or segment of n elements on a group path: the least
    power of two >= n, at most 32 (capsule_softmax_lanes and capsule_reduce_lanes alike)."""
    lanes = 1
    while lanes < 32 and lanes < n:
        lanes *= 2
    return lanes


# -- the C types of declared parameters ---------------------------------------------------

_PARAM = re.compile(
    r"^(?P<const>const )?(?P<type>"
    + "|".join(sorted(map(re.escape, C_TYPES), key=len, reverse=True))
    + r")(?P<ptr>\*)?(?: __restrict__)? (?P<name>\w+)$"
)


@dataclass(frozen=True)
class CParam:
    ctype: str
    pointer: bool
    const: bool
    name: str


def parse_param(text: str) -> CParam:
    m = _PARAM.match(text)
    if not m:
        raise ValueError(f"unsupported C parameter {text!r}")
    return CParam(m["type"], bool(m["ptr"]), bool(m["const"]), m["name"])


# -- validation ---------------------------------------------------------------------------


def plan_problems(plan: LaunchPlan, symbols: Mapping[str, NativeSymbolRef], arch: str = "sm_90") -> list[str]:
    """Every way `plan` breaks the launch rules: unknown symbols, grid/block/shared-memory limits,
    arguments against the declared parameters, buffer roles and dtypes. Empty when legal."""
    problems = []
    names = [b.name for b in plan.buffers]
    if len(set(names)) != len(names):
        problems.append(f"duplicate buffer names in {names}")
    buffers = {b.name: b for b in plan.buffers}
    for b in plan.buffers:
        if b.elements < 0:
            problems.append(f"buffer {b.name} has a negative size {b.elements}")
        if b.role == "meta" and (b.name not in plan.host_data or plan.host_data[b.name].size != b.elements):
            problems.append(f"meta buffer {b.name} has no host data of {b.elements} elements")
    for i, launch in enumerate(plan.launches):
        if not isinstance(launch, Launch):
            problems += _step_problems(f"step {i}", launch, buffers)
            continue
        where = f"launch {i} ({launch.symbol})"
        ref = symbols.get(launch.symbol)
        if ref is None:
            problems.append(f"{where}: symbol is not declared by the capsule")
            continue
        threads = int(np.prod(launch.block))
        if threads > MAX_THREADS_PER_BLOCK or threads < 1:
            problems.append(f"{where}: block {launch.block} has {threads} threads (limit {MAX_THREADS_PER_BLOCK})")
        for axis, (b, lim) in enumerate(zip(launch.block, BLOCK_LIMITS)):
            if not 1 <= b <= lim:
                problems.append(f"{where}: block dimension {axis} = {b} outside [1, {lim}]")
        for axis, (g, lim) in enumerate(zip(launch.grid, GRID_LIMITS)):
            if not 1 <= g <= lim:
                problems.append(f"{where}: grid dimension {axis} = {g} outside [1, {lim}]")
        if not 0 <= launch.shared_bytes <= DYNAMIC_SHARED_LIMIT[arch]:
            problems.append(
                f"{where}: {launch.shared_bytes} bytes of dynamic shared memory (limit {DYNAMIC_SHARED_LIMIT[arch]} on {arch})"
            )
        params = [parse_param(p) for p in ref.params]
        if len(launch.args) != len(params):
            problems.append(f"{where}: {len(launch.args)} arguments for {len(params)} declared parameters")
            continue
        for param, arg in zip(params, launch.args):
            problems += _argument_problems(where, param, arg, buffers)
    for out, src in plan.aliases.items():
        if buffers.get(out) is None or buffers[out].role != "output":
            problems.append(f"alias {out} is not an output buffer of the plan")
        elif buffers.get(src) is None or buffers[src].role != "input":
            problems.append(f"alias {out} -> {src}: {src} is not an input buffer of the plan")
        elif buffers[src].elements != buffers[out].elements or buffers[src].dtype != buffers[out].dtype:
            problems.append(f"alias {out} -> {src}: sizes or dtypes differ")
        if any(out in _buffers_of(step) for step in plan.launches):
            problems.append(f"alias {out} is written by a launch")
    for name, shape in plan.output_shapes.items():
        b = buffers.get(name)
        if b is None or b.role != "output":
            problems.append(f"output {name} is not an output buffer of the plan")
        elif int(np.prod(shape, dtype=np.int64)) != b.elements:
            problems.append(f"output {name}: {b.elements} elements for shape {tuple(shape)}")
    return problems


def _buffers_of(step) -> set[str]:
    """The buffers a step touches."""
    if isinstance(step, Memset):
        return {step.buffer}
    if isinstance(step, Copy):
        return {step.src, step.dst}
    return {a.buffer if isinstance(a, View) else a for a in step.args if isinstance(a, (str, View))}


def _step_problems(where: str, step, buffers: Mapping[str, Buffer]) -> list[str]:
    """A memset or copy that breaks its rules: unknown or read-only buffers, ranges past the end,
    a value its buffer cannot hold."""
    if isinstance(step, Memset):
        b = buffers.get(step.buffer)
        if b is None:
            return [f"{where}: memset of an unknown buffer {step.buffer!r}"]
        if b.role in ("input", "meta"):
            return [f"{where}: memset of {step.buffer}, a read-only {b.role}"]
        if b.itemsize != 4 and step.value != 0:
            return [f"{where}: memset of {step.buffer} ({b.dtype}) to {step.value!r}: only 0 fills 8-byte elements"]
        return []
    if isinstance(step, Copy):
        src, dst = buffers.get(step.src), buffers.get(step.dst)
        if src is None or dst is None:
            return [f"{where}: copy between unknown buffers {step.src!r} -> {step.dst!r}"]
        if src.dtype != dst.dtype:
            return [f"{where}: copy {step.src} ({src.dtype}) -> {step.dst} ({dst.dtype}): dtypes differ"]
        if dst.role in ("input", "meta"):
            return [f"{where}: copy into {step.dst}, a read-only {dst.role}"]
        if step.elements < 0 or min(step.src_offset, step.dst_offset) < 0:
            return [f"{where}: copy of {step.elements} elements at offsets {step.src_offset}, {step.dst_offset}"]
        if step.src_offset + step.elements > src.elements or step.dst_offset + step.elements > dst.elements:
            return [f"{where}: copy of {step.elements} elements runs past {step.src} or {step.dst}"]
        return []
    return [f"{where}: {step!r} is not a launch, memset or copy"]


def _argument_problems(where: str, param: CParam, arg, buffers: Mapping[str, Buffer]) -> list[str]:
    if param.pointer:
        view = arg if isinstance(arg, View) else None
        name = view.buffer if view else arg
        if not isinstance(name, str) or name not in buffers:
            return [f"{where}: {param.name} needs a buffer, got {arg!r}"]
        if view and not 0 <= view.offset <= buffers[name].elements:
            return [f"{where}: {param.name} views {name} at element {view.offset}, past its {buffers[name].elements}"]
        arg = name
        b = buffers[arg]
        if C_TYPES[param.ctype].buffer != b.dtype:
            return [f"{where}: {param.name} is {param.ctype}* but buffer {arg} holds {b.dtype}"]
        if not param.const and b.role in ("input", "meta"):
            return [f"{where}: {param.name} is writable but buffer {arg} is a read-only {b.role}"]
        return []
    if isinstance(arg, (bool, np.bool_)) or not isinstance(arg, (int, float, np.integer, np.floating)):
        return [f"{where}: {param.name} needs a number of type {param.ctype}, got {arg!r}"]
    ctype = C_TYPES[param.ctype]
    if ctype.is_float:
        if not np.isfinite(ctype.numpy(arg)) and np.isfinite(arg):
            return [f"{where}: {param.name} = {arg!r} overflows {param.ctype}"]
        return []
    lo, hi = ctype.range
    if not isinstance(arg, (int, np.integer)) or not lo <= int(arg) <= hi:
        return [f"{where}: {param.name} = {arg!r} does not fit {param.ctype}"]
    return []


# -- the plans of every op ----------------------------------------------------------------

PlanFunction = Callable[[Mapping[str, Any], Mapping[str, Any]], LaunchPlan]


def plan_functions(capsule: KernelCapsule) -> tuple[PlanFunction, PlanFunction | None] | None:
    """(forward plan, backward plan) of a capsule's op from its library, or None when its library
    declares none (a CPU reference twin, or kernels not written yet)."""
    from capsule_core.catalog.registry import library_of

    library = library_of(capsule)
    return library.plans_for(capsule) if library is not None else None
