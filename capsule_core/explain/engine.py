"""`capsules plan`: the launches one op gets for one shape, like a database's EXPLAIN.

For each launch of the op's launch plan: the entry point, grid, block, dynamic shared memory,
ptxas's registers and spills (nvcc, through the content-hash cache), theoretical occupancy
(capsule_core.kernels.occupancy), blocks per SM and waves on a device: the local GPU, else a named
reference device. Then the roofline floor of the cost model: bytes over the device's nominal
bandwidth, flops over its FP32 FMA peak.

Nothing runs on a GPU and nothing the size of the tensors is allocated: plans read shapes only,
so float inputs are zero-stride views; index inputs are real zeros, since plans and the value
check read them (zeros are valid indices).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from capsule_core.catalog.registry import launches_kernels, lookup
from capsule_core.errors import CapsuleError, EnvironmentMissing, ParamError, ShapeError
from capsule_core.kernels.launch import LaunchPlan, parse_param, plan_functions, plan_problems
from capsule_core.kernels.nvcc import CompileError, KernelResources, compile_file, source_path
from capsule_core.kernels.occupancy import ARCHES, Occupancy, occupancy
from capsule_core.ops import get_spec
from capsule_core.ops.base import OpSpec, Tensor, check_input_names, normalize_params, shapes_of

DIRECTIONS = ("fwd", "bwd")


class PlanRequestError(CapsuleError):
    """A request `plan` cannot answer: the text names the argument and the rule."""


# -- devices ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceModel:
    """The device the waves and the roofline are computed for, and where its figures come from."""

    name: str
    arch: str
    multiprocessors: int
    bandwidth: float
    """Bytes per second, nominal (the memory's data rate times its bus width)."""
    bandwidth_basis: str
    fma_peak: float
    """FP32 flop/s: SMs x FP32 lanes x 2 (an FMA is two flops) x clock."""
    fma_basis: str
    origin: str
    """"local GPU 0", or why a reference device stands in."""


FP32_LANES = {"sm_80": 64, "sm_90": 128}
"""FP32 FMA lanes per SM (the arch whitepapers)."""


def _device(
    name: str, arch: str, sms: int, clock_mhz: float, bandwidth: float, bandwidth_basis: str, origin: str
) -> DeviceModel:
    lanes = FP32_LANES[arch]
    return DeviceModel(
        name,
        arch,
        sms,
        bandwidth,
        bandwidth_basis,
        sms * lanes * 2 * clock_mhz * 1e6,
        f"nominal FP32 FMA: {sms} SMs x {lanes} lanes x 2 x {clock_mhz / 1e3:.2f} GHz",
        origin,
    )


REFERENCE_DEVICES = {
    "sm_90": ("H200 SXM", 132, 1980.0, 4.8e12, "nominal HBM3e"),
    "sm_80": ("A100 SXM4 80GB", 108, 1410.0, 2.039e12, "nominal HBM2e"),
}
"""(name, SMs, boost clock in MHz, bandwidth in bytes/s, what the bandwidth is), from NVIDIA's
datasheets: the device a plan is judged on where no GPU of the arch is here."""


def reference_device(arch: str, why: str) -> DeviceModel:
    if arch not in REFERENCE_DEVICES:
        raise PlanRequestError(f"--arch: no reference device for {arch} (choose {', '.join(REFERENCE_DEVICES)})")
    name, sms, clock, bandwidth, basis = REFERENCE_DEVICES[arch]
    return _device(name, arch, sms, clock, bandwidth, basis, f"reference device: {why}")


def choose_device(arch: str | None = None) -> DeviceModel:
    """GPU 0 when there is one of the requested arch (any arch this module knows if none is
    requested), else the reference device of the arch (sm_90 by default), saying why."""
    from capsule_core.backends import cuda

    found = cuda.probe()
    if not found.devices:
        return reference_device(arch or "sm_90", f"no GPU here ({found.problem})")
    gpu = found.devices[0]
    local = "sm_" + gpu.compute_capability.replace(".", "")
    if local not in ARCHES:
        return reference_device(arch or "sm_90", f"no occupancy rules for the local {gpu.name} ({local})")
    if arch is not None and arch != local:
        return reference_device(arch, f"the local {gpu.name} is {local}, not {arch}")
    try:
        props = cuda.gpu_properties(gpu.index)
    except EnvironmentMissing as exc:
        return reference_device(local, str(exc))
    bandwidth = 2 * props.memory_clock_mhz * 1e6 * props.memory_bus_bits / 8
    return _device(
        gpu.name,
        local,
        props.multiprocessors,
        props.clock_mhz,
        bandwidth,
        f"nominal: {props.memory_bus_bits}-bit bus at {props.memory_clock_mhz:.0f} MHz, double data rate",
        f"local GPU {gpu.index}",
    )


# -- the request: shapes and parameters from text ----------------------------------------------


def parse_shape(text: str) -> tuple[int, ...]:
    """ "8x4096" (or "8,4096") as (8, 4096); "()" is a scalar. Raises ValueError."""
    body = text.strip()
    if body.startswith("(") and body.endswith(")"):
        body = body[1:-1]
    parts = [p.strip() for p in re.split(r"[x,]", body)] if body.strip() else []
    if parts and parts[-1] == "" and "," in body:
        parts.pop()  # "5," is the 1-tuple
    if not all(p.isdigit() for p in parts):
        raise ValueError(
            f"{text!r} is not a shape: write non-negative dimensions joined by x, e.g. 8x4096 (or () for a scalar)"
        )
    return tuple(int(p) for p in parts)


def _assignments(option: str, texts: Sequence[str], form: str) -> Iterator[tuple[str, str, str]]:
    """(text, name, value text) of each NAME=VALUE text of `option`, in order; PlanRequestError
    naming `form` (how to write one) for a text without a name or an "="."""
    for text in texts:
        name, sep, value = text.partition("=")
        name = name.strip()
        if not sep or not name:
            raise PlanRequestError(f"{option} {text}: write {form}")
        yield text, name, value


def parse_inputs(spec: OpSpec, texts: Sequence[str]) -> dict[str, Any]:
    """NAME=SHAPE texts as {name: shape}; a list input (concat's xs) collects its repeats."""
    variadic = {t.name for t in spec.inputs if t.variadic}
    shapes: dict[str, Any] = {}
    for text, name, shape_text in _assignments("--input", texts, "NAME=SHAPE, e.g. x=8x4096"):
        try:
            shape = parse_shape(shape_text)
        except ValueError as exc:
            raise PlanRequestError(f"--input {text}: {exc}") from None
        if name in variadic:
            shapes[name] = shapes.get(name, ()) + (shape,)
        elif name in shapes:
            raise PlanRequestError(f"--input {name}: given twice (only a list input, such as concat's xs, repeats)")
        else:
            shapes[name] = shape
    return shapes


def _param_value(op: str, kind: str, name: str, text: str):
    """The text of one parameter as its schema's kind reads it."""
    value = text.strip()
    try:
        if kind == "float":
            return float(value)
        if kind in ("int", "axis", "seed"):
            return int(value)
        if kind == "axis_or_none":
            return None if value.lower() == "none" else int(value)
        if kind == "per_axis" and value.lstrip("-").isdigit():
            return int(value)
        return parse_shape(value)  # shape, perm, per_axis: "1x1", "1,1", "(2, 3)"
    except ValueError:
        wanted = {
            "float": "a number",
            "int": "an int",
            "axis": "an int",
            "seed": "an int",
            "axis_or_none": "an int or none",
            "per_axis": "an int or ints joined by x or , (1x1)",
            "shape": "ints joined by x or , (2x3; () for none)",
            "perm": "ints joined by x or , (1,0)",
        }[kind]
        raise ParamError(op, name, f"must be {wanted}, got {text!r}") from None


def parse_params(spec: OpSpec, texts: Sequence[str]) -> dict[str, Any]:
    """K=V texts as {name: value}, each parsed by the kind the op's parameter schema gives it."""
    kinds = {p.name: p.kind for p in spec.params}
    params: dict[str, Any] = {}
    for _, name, value in _assignments("--param", texts, "K=V, e.g. padding=1"):
        if name not in kinds:
            allowed = ", ".join(kinds) or "none"
            raise ParamError(spec.name, name, f"unknown parameter (allowed: {allowed})")
        params[name] = _param_value(spec.name, kinds[name], name, value)
    return params


# -- shapes that follow from the others ---------------------------------------------------------

_FIRST_GROUP = re.compile(r"^\(([^()]*)\)")


def _dimension_names(rank: str) -> list[str] | None:
    """The dimension tokens of a Tensor's rank text: "(…, D), D >= 1" gives ["…", "D"]."""
    match = _FIRST_GROUP.match(rank)
    return [t.strip() for t in match.group(1).split(",") if t.strip()] if match else None


def _bind(tokens: list[str], shape: tuple[int, ...]) -> dict[str, int]:
    """Named dimensions of a shape: names before a "…" or "*rest" count from the front, names
    after it from the back."""
    rest = [i for i, t in enumerate(tokens) if t == "…" or t.startswith("*")]
    if not rest:
        return dict(zip(tokens, shape)) if len(tokens) == len(shape) else {}
    if len(rest) > 1 or len(shape) < len(tokens) - 1:
        return {}
    head, tail = tokens[: rest[0]], tokens[rest[0] + 1 :]
    return {**dict(zip(head, shape)), **dict(zip(tail, shape[len(shape) - len(tail) :]))}


def infer_missing_shapes(spec: OpSpec, shapes: Mapping[str, Any]) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
    """Shapes of inputs left out whose every dimension the given inputs name (linear's b is
    (out), w is (out, in)): {input: (shape, the inputs it came from)}. An input whose rank text
    is anything but a plain tuple of names ("(D) or (B, T, D)") is never guessed; the shape
    rule still checks every inferred shape."""
    known: dict[str, tuple[int, str]] = {}
    for t in spec.inputs:
        tokens = _dimension_names(t.rank)
        if t.name in shapes and not t.variadic and tokens:
            for dim, size in _bind(tokens, tuple(shapes[t.name])).items():
                known.setdefault(dim, (size, t.name))
    inferred = {}
    for t in spec.inputs:
        tokens = _dimension_names(t.rank)
        if t.name in shapes or t.variadic or not tokens or t.rank != f"({', '.join(tokens)})":
            continue
        if all(d.isidentifier() and d in known for d in tokens):
            inferred[t.name] = (tuple(known[d][0] for d in tokens), tuple(dict.fromkeys(known[d][1] for d in tokens)))
    return inferred


# -- the explanation ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchRow:
    """One launch of the plan with what the compiled kernel and the device make of it."""

    symbol: str
    source: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_shared: int
    arguments: tuple[tuple[str, Any], ...]
    """(declared C parameter, what the plan passes: a buffer name or a number), in order."""
    resources: KernelResources | None
    occupancy: Occupancy | None
    waves: float | None
    """Blocks over (resident blocks per SM x SMs): below 1, part of the device idles."""
    sms_used: int
    """SMs that get at least one block (min(blocks, SMs))."""
    note: str | None
    """Why registers or occupancy are unknown, or why a block cannot launch."""

    @property
    def blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    @property
    def threads_per_block(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


@dataclass(frozen=True)
class Roofline:
    """The least time the device's nominal peaks allow: the larger of bytes over bandwidth and
    flops over the FMA peak."""

    bytes: int
    flops: int | None
    """None when the direction has no flop model (backward)."""
    basis: str
    memory_seconds: float
    compute_seconds: float | None

    @property
    def floor_seconds(self) -> float:
        return max(self.memory_seconds, self.compute_seconds or 0.0)

    @property
    def bound(self) -> str | None:
        """ "memory" or "compute"; None without a flop model."""
        if self.compute_seconds is None:
            return None
        return "compute" if self.compute_seconds > self.memory_seconds else "memory"


@dataclass(frozen=True)
class Explanation:
    op: str
    capsule: str
    direction: str
    inputs: dict[str, Any]
    """Shapes by input name (a tuple of shapes for a list input), inferred ones included."""
    inferred: dict[str, tuple[str, ...]]
    """Inputs left out whose shape came from these given inputs."""
    params: dict[str, Any]
    """Every parameter, defaults filled in, as the op normalises it."""
    outputs: dict[str, tuple[int, ...]]
    device: DeviceModel
    launches: tuple[LaunchRow, ...]
    roofline: Roofline
    problems: tuple[str, ...]
    """Launch rules the plan breaks (capsule_core.kernels.launch.plan_problems); empty when legal."""
    aliases: dict[str, str]
    """Outputs that are their input's memory (no launch writes them)."""


def _stand_in(tensor: Tensor, shape: tuple[int, ...]):
    if tensor.dtype == "int64":
        return np.zeros(shape, np.int64)
    return np.broadcast_to(np.float32(0), shape)


def _checked_shape(op: str, name: str, shape) -> tuple[int, ...]:
    shape = tuple(shape)
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ShapeError(op, name, f"dimensions must be non-negative integers, got {shape}")
    return tuple(int(d) for d in shape)


def _plain(value):
    """Plan arguments as JSON-ready Python values (plans pass numpy scalars for float parameters)."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


def _resources(plan: LaunchPlan, refs: Mapping[str, Any], arch: str) -> tuple[dict, dict]:
    """ptxas resources by symbol, and why they are unknown by source path (no nvcc, no source,
    nvcc failed)."""
    found, missing = {}, {}
    used = {refs[launch.symbol] for launch in plan.kernel_launches if launch.symbol in refs}
    for path in sorted({ref.path for ref in used}):
        here = [ref for ref in used if ref.path == path]
        try:
            compiled = compile_file(source_path(path), arch, build=here[0].build)
        except (EnvironmentMissing, CompileError) as exc:
            missing[path] = "not compiled: " + str(exc).splitlines()[0].rstrip(":")
            continue
        for ref in here:
            resources = compiled.resources_of(ref)
            if resources is not None:
                found[ref.symbol] = resources
    return found, missing


def _row(launch, refs, resources, missing, device: DeviceModel) -> LaunchRow:
    ref = refs.get(launch.symbol)
    path = ref.path if ref else "?"
    names = (
        [parse_param(p).name for p in ref.params]
        if ref and len(ref.params) == len(launch.args)
        else [f"arg{i}" for i in range(len(launch.args))]
    )
    res = resources.get(launch.symbol)
    threads = launch.block[0] * launch.block[1] * launch.block[2]
    blocks = launch.grid[0] * launch.grid[1] * launch.grid[2]
    occ, waves, note = None, None, None
    if res is None:
        note = missing.get(path, f"no entry {launch.symbol} in the compiled {path}")
    else:
        occ = occupancy(ARCHES[device.arch], threads, res.registers, res.shared_bytes, launch.shared_bytes)
        if occ.refusal:
            note = f"cannot launch: {occ.refusal}"
        else:
            waves = blocks / (occ.blocks_per_sm * device.multiprocessors)
    return LaunchRow(
        launch.symbol,
        path,
        tuple(launch.grid),
        tuple(launch.block),
        launch.shared_bytes,
        tuple(zip(names, map(_plain, launch.args))),
        res,
        occ,
        waves,
        min(blocks, device.multiprocessors),
        note,
    )


def _roofline(spec: OpSpec, direction: str, shapes, params, plan: LaunchPlan, device: DeviceModel) -> Roofline:
    if direction == "fwd":
        cost = spec.cost(shapes, params)
        nbytes, flops, basis = cost.bytes, cost.flops, "the op's cost model"
    else:
        nbytes = sum(b.nbytes for b in plan.buffers if b.role in ("input", "output") and b.name not in plan.aliases)
        flops, basis = (
            None,
            "the plan's buffers: each input read once, each output written once; no backward flop model",
        )
    return Roofline(nbytes, flops, basis, nbytes / device.bandwidth, None if flops is None else flops / device.fma_peak)


def resolve_op(op: str) -> tuple[Any, OpSpec]:
    """The kernel capsule and OpSpec of an op or capsule name (UnknownNameError with suggestions)."""
    capsule = lookup(op)
    if not launches_kernels(capsule):
        raise PlanRequestError(
            f"OP: {capsule.name} launches no CUDA kernel; plan takes the capsules of a kernel library"
        )
    return capsule, get_spec(capsule.op.value)


def explain(
    op: str,
    shapes: Mapping[str, Any],
    params: Mapping[str, Any],
    direction: str = "fwd",
    arch: str | None = None,
    device: DeviceModel | None = None,
) -> Explanation:
    """The launches `op` gets for these input shapes and parameters, on `device` (default:
    choose_device(arch)). Raises InputError (ShapeError, ParamError) for what the op refuses,
    PlanRequestError for what plan cannot do, UnknownNameError for an unknown op."""
    if direction not in DIRECTIONS:
        raise PlanRequestError(f"--direction: {direction!r} is not one of {', '.join(DIRECTIONS)}")
    capsule, spec = resolve_op(op)
    functions = plan_functions(capsule)
    if functions is None:
        raise PlanRequestError(f"OP: {spec.name} has no launch plan yet (its kernels are not written)")
    plan_function = functions[0] if direction == "fwd" else functions[1]
    if plan_function is None or (direction == "bwd" and not spec.has_vjp):
        raise PlanRequestError(f"--direction bwd: {spec.name} has no backward (VJP mode {capsule.vjp_mode.value})")

    tensors = {t.name: t for t in spec.inputs}
    given = {}
    for name, shape in shapes.items():
        if name in tensors and tensors[name].variadic:
            given[name] = tuple(_checked_shape(spec.name, f"{name}[{i}]", s) for i, s in enumerate(shape))
        else:
            given[name] = _checked_shape(spec.name, name, shape)
    inferred = infer_missing_shapes(spec, given)
    all_shapes = {**given, **{name: shape for name, (shape, _) in inferred.items()}}
    try:
        check_input_names(spec, all_shapes)
    except ShapeError as exc:
        raise ShapeError(spec.name, exc.argument, f"{exc.rule}; the op is {spec.signature()}") from None
    p = normalize_params(spec, params)
    arrays = {
        name: (
            tuple(_stand_in(tensors[name], s) for s in shape)
            if tensors[name].variadic
            else _stand_in(tensors[name], shape)
        )
        for name, shape in all_shapes.items()
    }
    arrays = {t.name: arrays[t.name] for t in spec.inputs}
    spec.shape(shapes_of(arrays), p)
    if spec.check_values is not None:
        spec.check_values(arrays, p)

    plan = plan_function(arrays, p)
    device = device or choose_device(arch)
    symbols = {ref.symbol: ref for ref in capsule.symbols}
    resources, missing = _resources(plan, symbols, device.arch)
    rows = tuple(_row(launch, symbols, resources, missing, device) for launch in plan.kernel_launches)
    return Explanation(
        op=spec.name,
        capsule=capsule.name,
        direction=direction,
        inputs={t.name: all_shapes[t.name] for t in spec.inputs},
        inferred={name: sources for name, (_, sources) in inferred.items()},
        params=p,
        outputs={k: tuple(v) for k, v in plan.output_shapes.items()},
        device=device,
        launches=rows,
        roofline=_roofline(spec, direction, shapes_of(arrays), p, plan, device),
        problems=tuple(plan_problems(plan, symbols, device.arch)),
        aliases=dict(plan.aliases),
    )
