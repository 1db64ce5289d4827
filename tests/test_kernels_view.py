"""cuda/view.cu without a GPU: it compiles cleanly for sm_80 and sm_90 with the registry's entry
points; its index arithmetic (cuda/view.cuh, compiled for the host) replays every kernel path of
every launch plan on the host, with guard bands and NaN-prefilled outputs, bit for bit against
numpy (the sum of broadcast's backward under its error model); and its plans are legal."""

import ctypes
import dataclasses
import itertools
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from capsule_core import registry
from capsule_core.backends.cpu import REFERENCE
from capsule_core.kernels import cuda_source_dir, find_nvcc
from capsule_core.launch import parse_param, plan_functions, plan_problems
from capsule_core.numerics import compare
from capsule_core.ops import get_spec
from capsule_core.ops.base import Exact, seeded_rng, shapes_of, validate
from capsule_core.plans import view as plans
from hostmath import load

OPS = ("reshape", "permute", "broadcast", "concat", "slice")
ARCHS = ("sm_80", "sm_90")
FLAGS = ("-std=c++17", "-O3", "-prec-div=true", "-prec-sqrt=true", "-ftz=false", "-fmad=true")
FAMILY = "view"
SOURCE = cuda_source_dir() / f"{FAMILY}.cu"
PTX_TYPES = {"float": "f32", "int64_t": "u64", "uint64_t": "u64", "int32_t": "u32"}
REGISTERS_PER_SM = 65536

PAYLOADS = np.array([0x7FC00001, 0xFFC12345, 0x7FA00001, 0x80000000, 0x00000001, 0xFF800000, 0x3F800000],
                    dtype=np.uint32).view(np.float32)
"""NaNs with payloads (one signalling), −0, the smallest subnormal, −inf, 1."""


def symbols(ops):
    return {ref.symbol: ref for op in ops for ref in registry.lookup(op).symbols}


SYMBOLS = symbols(OPS)


# -- the build: shared with tests/test_kernels_index.py ---------------------------------------------


def compile_family(family: str, out_dir) -> dict:
    """<family>.cu compiled once per arch (in parallel): {arch: (nvcc result, PTX text)}."""
    def compile_for(arch):
        out = out_dir / arch
        out.mkdir()
        cmd = [str(find_nvcc().path), *FLAGS, f"-arch={arch}", "-Xptxas", "-v", "-Werror", "all-warnings",
               "-I", str(cuda_source_dir()), "-cubin", "-keep", "-keep-dir", str(out), "-o", str(out / f"{family}.cubin"),
               str(cuda_source_dir() / f"{family}.cu")]
        result = subprocess.run(cmd, capture_output=True, text=True)
        ptx = out / f"{family}.ptx"
        return arch, (result, ptx.read_text() if ptx.exists() else "")
    with ThreadPoolExecutor(len(ARCHS)) as pool:
        return dict(pool.map(compile_for, ARCHS))


def ptxas_report(stderr: str) -> dict:
    """{kernel: (registers, stack frame bytes, spill store bytes, spill load bytes)} from -Xptxas -v."""
    report = {}
    for block in re.split(r"Compiling entry function ", stderr)[1:]:
        name = re.match(r"'(\w+)'", block)[1]
        frame, stores, loads = map(int, re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                                                  block).groups())
        report[name] = (int(re.search(r"Used (\d+) registers", block)[1]), frame, stores, loads)
    return report


def ptx_entries(ptx: str) -> dict:
    """{entry: [PTX parameter types]}."""
    return {m[1]: re.findall(r"\.param \.(\w+) ", m[2]) for m in re.finditer(r"\.entry (\w+)\(([^)]*)\)", ptx)}


def check_build(build, arch, syms):
    result, ptx = build[arch]
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr.lower(), result.stderr
    report = ptxas_report(result.stderr)
    assert set(report) == set(syms), "every kernel of the file is a registered entry point"
    for name, (_registers, frame, stores, loads) in report.items():
        assert stores == loads == frame == 0, f"{name} spills or uses a stack frame on {arch}"
    entries = ptx_entries(ptx)
    for name, ref in syms.items():
        assert name in entries, f"no .entry {name} in the {arch} PTX"
        expected = ["u64" if p.pointer else PTX_TYPES[p.ctype] for p in map(parse_param, ref.params)]
        assert entries[name] == expected, f"{name}: PTX {entries[name]} for the declared {ref.params}"
    return report


def check_source_signatures(source_path, syms):
    """Each entry point is written literally (no macro-made names) with the registry's list."""
    source = re.sub(r"\s+", " ", source_path.read_text())
    for name, ref in syms.items():
        assert ref.path == f"cuda/{source_path.name}"
        pattern = (r'extern "C" __global__ void (__launch_bounds__\([\d, ]+\) )?' + re.escape(name) + r"\(" +
                   re.escape(", ".join(ref.params)) + r"\)")
        assert re.search(pattern, source), f"{name}: the source does not declare ({', '.join(ref.params)})"


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    return compile_family(FAMILY, tmp_path_factory.mktemp(FAMILY))


@pytest.mark.parametrize("arch", ARCHS)
def test_compiles_without_warnings_or_spills_with_the_declared_entries(build, arch):
    check_build(build, arch, SYMBOLS)


def test_source_spells_out_each_declared_signature():
    check_source_signatures(SOURCE, SYMBOLS)


def test_reshape_names_no_kernel():
    assert registry.lookup("reshape").symbols == ()


# -- running a plan on the host -------------------------------------------------------------------

GUARD = 16
"""Guard-band elements each side of every output (64 bytes: keeps 16-byte alignment)."""
GUARD_BITS = 0xDEADBEEF
UNWRITTEN_BITS = 0x7FA5A5A5
"""A signalling NaN no test input holds: an output element still holding it was never written."""


def _alloc(n: int, dtype, misalign: bool) -> tuple[np.ndarray, np.ndarray]:
    """(whole allocation, the n-element buffer inside it): 16-byte aligned, or 4 bytes past that."""
    itemsize = np.dtype(dtype).itemsize
    raw = np.empty((n + 2 * GUARD) * itemsize + 64, np.uint8)
    start = (-raw.ctypes.data) % 16 + (4 if misalign else 0)
    whole = raw[start:start + (n + 2 * GUARD) * itemsize].view(dtype)
    return whole, whole[GUARD:GUARD + n]


def run_plan(lib, host_calls: dict, plan, arrays: dict, misalign: bool = False) -> dict:
    """Replay `plan` with the host harness: inputs copied in, meta buffers from host_data, outputs
    pre-filled with UNWRITTEN_BITS between guard bands. Checks that every output element was written,
    no guard band or input changed; returns {output: array of output_shapes[output]}."""
    memory, wholes = {}, {}
    for b in plan.buffers:
        dtype = np.float32 if b.dtype == "float32" else np.int64
        if b.role == "output" and b.name in plan.aliases:
            continue
        whole, buf = _alloc(b.elements, dtype, misalign and b.dtype == "float32")
        if b.role == "input":
            buf[...] = np.asarray(arrays[b.name], dtype).reshape(-1)
        elif b.role == "meta":
            buf[...] = plan.host_data[b.name]
        else:
            whole.view(np.uint32)[...] = GUARD_BITS
            buf.view(np.uint32)[...] = UNWRITTEN_BITS
        memory[b.name], wholes[b.name] = buf, whole
    before = {b.name: memory[b.name].copy() for b in plan.buffers if b.role in ("input", "meta")}
    results = []
    for launch in plan.launches:
        args = [memory[a].ctypes.data if isinstance(a, str) else int(a) for a in launch.args]
        results.append((launch.symbol, host_calls[launch.symbol](lib, launch, args)))
    assert lib.host_misaligned_accesses() == 0, f"{plan.op} {plan.direction}: a 16-byte access off alignment"
    for name, saved in before.items():
        assert np.array_equal(saved.view(np.uint8), memory[name].view(np.uint8)), f"{plan.op}: input {name} changed"
    outputs = {}
    for name, shape in plan.output_shapes.items():
        if name in plan.aliases:
            outputs[name] = memory[plan.aliases[name]].reshape(shape)
            continue
        whole, buf = wholes[name], memory[name]
        guards = np.concatenate([whole[:GUARD], whole[GUARD + buf.size:]]).view(np.uint32)
        assert (guards == GUARD_BITS).all(), f"{plan.op} {plan.direction}: a write outside {name}"
        assert not (buf.view(np.uint32) == UNWRITTEN_BITS).any(), f"{plan.op} {plan.direction}: {name} not fully written"
        outputs[name] = buf.copy().reshape(shape)
    run_plan.paths = results
    return outputs


@pytest.fixture(scope="module")
def lib(host_build_dir):
    lib = load("view_host", host_build_dir)
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32
    signatures = {
        "host_view_offset": (i64, [p, p, i32, i64, i32]),
        "host_view_path": (i32, [p, p, i32, i32, i32, i32]),
        "host_tile_count": (i64, [p, p, i32]),
        "host_view_gather": (i32, [p, p, p, i32, i64, i32]),
        "host_broadcast_bwd": (i32, [p, p, p, i32, i64, i64, i32]),
        "host_concat_fwd": (None, [p, p] + [i64] * 5),
        "host_concat_bwd": (None, [p, p] + [i64] * 5),
        "host_slice_fwd": (None, [p, p] + [i64] * 5),
        "host_slice_bwd": (i32, [p, p] + [i64] * 5),
        "host_rows": (None, [i32] + [i64] * 5 + [p]),
        "host_misaligned_accesses": (i64, []),
    }
    for name, (restype, argtypes) in signatures.items():
        getattr(lib, name).restype = restype
        getattr(lib, name).argtypes = argtypes
    return lib


HOST_CALLS = {
    "capsule_permute_fwd": lambda lib, launch, a: lib.host_view_gather(*a, 1),
    "capsule_permute_bwd": lambda lib, launch, a: lib.host_view_gather(*a, 1),
    "capsule_broadcast_fwd": lambda lib, launch, a: lib.host_view_gather(*a, 0),
    "capsule_broadcast_bwd": lambda lib, launch, a: lib.host_broadcast_bwd(*a, launch.block[0]),
    "capsule_concat_fwd": lambda lib, launch, a: lib.host_concat_fwd(*a),
    "capsule_concat_bwd": lambda lib, launch, a: lib.host_concat_bwd(*a),
    "capsule_slice_fwd": lambda lib, launch, a: lib.host_slice_fwd(*a),
    "capsule_slice_bwd": lambda lib, launch, a: lib.host_slice_bwd(*a),
}


def i64(values) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.int64)


def bits(a) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def plan_inputs(spec, arrays, direction, g=None) -> dict:
    """Buffer contents by name: the op's inputs (variadic ones as xs[i]) and the cotangent."""
    out = {}
    for t in spec.inputs:
        if t.variadic:
            out.update({f"{t.name}[{i}]": a for i, a in enumerate(arrays[t.name])})
        else:
            out[t.name] = arrays[t.name]
    if direction == "backward":
        out["g"] = g
    return out


def gradients(spec, outputs: dict) -> dict:
    """{"dx": a, "dxs[0]": b, ...} as {"x": a, "xs": (b, ...)}."""
    out = {}
    for t in spec.inputs:
        if not t.differentiable:
            continue
        if t.variadic:
            parts = sorted((k for k in outputs if k.startswith(f"d{t.name}[")), key=lambda k: int(k.split("[")[1][:-1]))
            out[t.name] = tuple(outputs[k] for k in parts)
        else:
            out[t.name] = outputs[f"d{t.name}"]
    return out


def cotangent(spec, sample, out_shape) -> np.ndarray:
    return seeded_rng(spec.name, f"g/{sample.case}").standard_normal(out_shape).astype(np.float32)


def emulator(family: str, build_dir: str):
    """A runner of plans through the family's .cu, unchanged, on tests/kernel_emu.py's CPU emulator
    (every thread a fiber, real barriers and shuffles, grids capped at 4 blocks so that the
    grid-stride loops turn): runner(plan, inputs, misalign) -> outputs."""
    from kernel_emu import PlanRunner, compiler, unwritten
    if compiler() is None:
        pytest.skip("no C++ compiler for the kernel emulator")
    emu = PlanRunner(family, build_dir)

    def run(plan, inputs, misalign=False):
        aliases = plan.aliases
        if aliases:
            return {out: np.asarray(inputs[src]).reshape(plan.output_shapes[out]) for out, src in aliases.items()}
        shifts = {b.name: 1 for b in plan.buffers if b.dtype == "float32"} if misalign else None
        outputs = emu.run(plan, inputs, shifts)
        for name, value in outputs.items():
            assert not unwritten(value).any(), f"{plan.op} {plan.direction}: {name} not fully written"
        return outputs
    run.paths = []
    return run


def check_sample(lib, spec, sample, misalign=False, host_calls=HOST_CALLS, runner=None):
    """Forward and backward plans of one sample replayed on the host (or run by `runner`) against
    the float64 reference under the op's error model, and bit for bit against numpy on float32 for
    the exact ones. Returns (symbol, what its host replay returned: the path or mode taken) per launch."""
    forward_plan, backward_plan = plan_functions(registry.lookup(spec.name))
    arrays, p, out_shape = validate(spec, sample.inputs, sample.params, np.float32)
    if runner is None:
        def runner(plan, inputs, misalign=False):
            outputs = run_plan(lib, host_calls, plan, inputs, misalign)
            runner.paths = run_plan.paths
            return outputs
    paths = []
    y = runner(forward_plan(arrays, p), plan_inputs(spec, arrays, "forward"), misalign)["out"]
    paths += runner.paths
    r = REFERENCE.forward(spec, sample.inputs, **sample.params)
    m = REFERENCE.magnitude(spec, sample.inputs, **sample.params)
    n = spec.error.length(shapes_of(arrays), p) if hasattr(spec.error, "length") else 1
    result = compare(y, r, m, spec.error, n, sample.worst_case)
    assert result.passed, f"{spec.name} forward {sample.summary()}: {result.reason}"
    if isinstance(spec.error, Exact):
        assert np.array_equal(bits(y), bits(spec.forward(arrays, p))), f"{spec.name} forward {sample.summary()}: bits differ"

    g = cotangent(spec, sample, out_shape)
    outputs = runner(backward_plan(arrays, p), plan_inputs(spec, arrays, "backward", g), misalign)
    paths += runner.paths
    got = gradients(spec, outputs)
    r = REFERENCE.vjp(spec, sample.inputs, g, **sample.params)
    m = REFERENCE.vjp_magnitude(spec, sample.inputs, g, **sample.params)
    exact = spec.vjp(arrays, p, spec.forward(arrays, p), g)
    assert set(got) == set(spec.differentiable)
    for name in spec.differentiable:
        model = spec.vjp_error_for(name)
        n = model.length(shapes_of(arrays), p) if hasattr(model, "length") else 1
        many = isinstance(r[name], tuple)
        for yi, ri, mi, ei in (zip(got[name], r[name], m[name], exact[name]) if many
                               else [(got[name], r[name], m[name], exact[name])]):
            result = compare(yi, ri, mi, model, n, sample.worst_case)
            assert result.passed, f"{spec.name} d{name} {sample.summary()}: {result.reason}"
            if isinstance(model, Exact):
                assert np.array_equal(bits(yi), bits(ei)), f"{spec.name} d{name} {sample.summary()}: bits differ"
    return paths


def all_samples(spec, sizes=("small", "medium", "large")):
    out = []
    for size in sizes:
        out += spec.samples(size, seeded_rng(spec.name, size))
    return out + spec.edges()


# -- every sample and edge, replayed on the host ------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_plans_replayed_on_the_host_meet_the_contract(lib, op):
    spec = get_spec(op)
    for sample in all_samples(spec):
        check_sample(lib, spec, sample)


@pytest.mark.parametrize("op", OPS)
def test_unaligned_buffers_take_the_scalar_paths(lib, op):
    """Buffers 4 bytes off 16-byte alignment: the kernels must notice and move words one by one."""
    spec = get_spec(op)
    for sample in all_samples(spec, ("small", "medium")):
        check_sample(lib, spec, sample, misalign=True)


def test_row_starts_off_16_bytes_take_word_moves(lib):
    """Rows of a multiple of 4 elements whose starts are not (inner = 2, odd offsets): no vector move."""
    rng = seeded_rng("view", "odd-starts")
    x = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    cases = [("concat", {"xs": (x(3, 1, 2), x(3, 2, 2), x(3, 1, 2))}, {"axis": 1}),
             ("concat", {"xs": (x(2, 2), x(2, 4), x(2, 2))}, {"axis": 1}),
             ("slice", {"x": x(3, 8, 2)}, {"axis": 1, "start": 1, "length": 2}),
             ("slice", {"x": x(4, 10)}, {"axis": 1, "start": 2, "length": 4}),
             ("permute", {"x": x(4, 2, 6)}, {"perm": (1, 0, 2)}),
             ("broadcast", {"x": x(3, 1, 2)}, {"shape": (3, 2, 2)})]
    for op, inputs, params in cases:
        spec = get_spec(op)
        check_sample(lib, spec, dataclasses.replace(spec.edges()[0], inputs=inputs, params=params, case="odd-starts"))


def test_every_kernel_path_is_exercised(lib):
    seen = set()
    for op in ("permute", "broadcast"):
        spec = get_spec(op)
        for sample in all_samples(spec):
            seen.update(check_sample(lib, spec, sample))
    repeat_last = {"x": np.arange(5, dtype=np.float32).reshape(5, 1)}, {"shape": (3, 5, 64)}
    seen.update(check_sample(lib, get_spec("broadcast"), dataclasses.replace(
        spec.edges()[0], inputs=repeat_last[0], params=repeat_last[1], case="repeat-last-axis")))
    gathers = {path for symbol, path in seen if symbol != "capsule_broadcast_bwd"}
    assert gathers == {plans.PATH_SCALAR, plans.PATH_COPY4, plans.PATH_FILL4, plans.PATH_TILE}
    modes = {mode for symbol, mode in seen if symbol == "capsule_broadcast_bwd"}
    assert modes == {0, 1}, "broadcast's backward ran in both column and row mode"


@pytest.fixture(scope="module")
def emu(host_build_dir):
    return emulator(FAMILY, host_build_dir)


@pytest.mark.parametrize("op", OPS)
def test_kernels_run_unchanged_on_the_emulator(lib, emu, op):
    """cuda/view.cu itself (shared-memory tiles, barriers, warp shuffles, grid-stride loops) on
    every sample and edge, then 4 bytes off alignment."""
    spec = get_spec(op)
    for sample in all_samples(spec):
        check_sample(lib, spec, sample, runner=emu)
    for sample in all_samples(spec, ("small",)):
        check_sample(lib, spec, sample, misalign=True, runner=emu)


@pytest.mark.parametrize("via", ["host", "emulator"])
def test_bits_survive_every_view(lib, emu, via):
    """NaN payloads (quiet and signalling), −0 and subnormals move as bits, forward and back."""
    execute = emu if via == "emulator" else (lambda plan, inputs: run_plan(lib, HOST_CALLS, plan, inputs))
    x = np.resize(PAYLOADS, (4, 6, 8))
    cases = [("permute", {"x": x}, {"perm": (2, 0, 1)}), ("permute", {"x": x}, {"perm": (1, 0, 2)}),
             ("broadcast", {"x": x[:1]}, {"shape": (3, 4, 6, 8)}), ("broadcast", {"x": x[..., :1]}, {"shape": (4, 6, 8)}),
             ("concat", {"xs": (x, x[:, :3])}, {"axis": 1}), ("slice", {"x": x}, {"axis": 2, "start": 1, "length": 6}),
             ("reshape", {"x": x}, {"shape": (-1,)})]
    for op, inputs, params in cases:
        spec = get_spec(op)
        fwd, bwd = plan_functions(registry.lookup(op))
        arrays, p, out_shape = validate(spec, inputs, params, np.float32)
        y = execute(fwd(arrays, p), plan_inputs(spec, arrays, "forward"))["out"]
        assert np.array_equal(bits(y), bits(spec.forward(arrays, p))), op
        if op != "broadcast":  # its backward adds
            g = np.resize(PAYLOADS[::-1], out_shape)
            got = gradients(spec, execute(bwd(arrays, p), plan_inputs(spec, arrays, "backward", g)))
            want = spec.vjp(arrays, p, y, g)
            for name in spec.differentiable:
                pairs = zip(got[name], want[name]) if isinstance(want[name], tuple) else [(got[name], want[name])]
                for a, b in pairs:
                    assert np.array_equal(bits(a), bits(b)), f"{op} d{name}"


# -- the index arithmetic against numpy --------------------------------------------------------------


def random_geometry(rng, rank, zero_strides=False):
    shape = [int(d) for d in rng.integers(1, 5, rank)]
    if rank and rng.random() < 0.3:
        shape[int(rng.integers(rank))] = 1
    stride = [int(s) for s in rng.integers(0 if zero_strides else 1, 50, rank)]
    return shape, stride


@pytest.mark.parametrize("use32", [0, 1])
def test_view_offset_matches_numpy_for_ranks_0_to_8(lib, use32):
    rng = seeded_rng("view", "offsets")
    for rank in range(9):
        for _ in range(20):
            shape, stride = random_geometry(rng, rank, zero_strides=True)
            n = int(np.prod(shape, dtype=np.int64))
            coords = np.unravel_index(np.arange(n), shape) if rank else ()
            want = sum((c * s for c, s in zip(coords, stride)), np.zeros(n, np.int64))
            sh, st = i64(shape or [1]), i64(stride or [0])
            got = [lib.host_view_offset(sh.ctypes.data, st.ctypes.data, rank, i, use32) for i in range(n)]
            assert got == list(want), (shape, stride)


def test_offsets_past_32_bits_use_64_bit_arithmetic(lib):
    shape, stride = i64([3, 2**20, 4096]), i64([2**33, 4096, 1])
    i = 2 * 2**32 + 5 * 4096 + 7
    assert lib.host_view_offset(shape.ctypes.data, stride.ctypes.data, 3, i, 0) == 2 * 2**33 + 5 * 4096 + 7


def test_python_mirrors_of_the_kernel_choices_agree(lib):
    """The plans size grids from view_path and tile_count; the kernels decide for themselves."""
    rng = seeded_rng("view", "mirrors")
    for rank in range(1, 9):
        for _ in range(40):
            shape, stride = random_geometry(rng, rank, zero_strides=rng.random() < 0.5)
            if rng.random() < 0.5:
                stride[int(rng.integers(rank))] = 1
            if rng.random() < 0.3:
                shape[-1] = 4 * int(rng.integers(1, 40))
            sh, st = i64(shape), i64(stride)
            for x16, y16, tiles in itertools.product((0, 1), repeat=3):
                assert lib.host_view_path(sh.ctypes.data, st.ctypes.data, rank, x16, y16, tiles) == \
                    plans.view_path(shape, stride, bool(tiles), bool(x16), bool(y16)), (shape, stride, x16, y16, tiles)
            if plans.tile_axis(shape, stride) >= 0:
                assert lib.host_tile_count(sh.ctypes.data, st.ctypes.data, rank) == plans.tile_count(shape, stride)


def run_geometry(lib, x, shape, stride, tiles):
    """host_view_gather on a raw geometry (not simplified): y of `shape`."""
    n = int(np.prod(shape, dtype=np.int64))
    geometry = i64(list(shape) + list(stride))
    _, y = _alloc(n, np.float32, False)
    y.view(np.uint32)[...] = UNWRITTEN_BITS
    xs = np.ascontiguousarray(x, np.float32)
    path = lib.host_view_gather(xs.ctypes.data, y.ctypes.data, geometry.ctypes.data, len(shape), n, tiles)
    return y.reshape(shape), path


def test_permute_every_rank_and_permutation_kind(lib):
    """Ranks 0 to 8, size-1 and empty axes, random permutations: plan and kernel paths against
    np.transpose; the unsimplified geometry too (the kernels must not depend on the simplification)."""
    rng = seeded_rng("view", "permute-ranks")
    spec = get_spec("permute")
    for rank in range(9):
        for trial in range(12):
            shape = tuple(int(d) for d in rng.integers(1, 6 if rank < 6 else 3, rank))
            if rank and trial == 0:
                shape = shape[:-1] + (0,)
            perm = tuple(int(a) for a in rng.permutation(rank))
            x = rng.standard_normal(shape).astype(np.float32)
            want = np.transpose(x, perm)
            sample = dataclasses.replace(spec.edges()[0], inputs={"x": x}, params={"perm": perm}, case=f"rank{rank}-{trial}")
            check_sample(lib, spec, sample)
            if x.size:
                strides = plans._strides(shape)
                y, _ = run_geometry(lib, x, [shape[a] for a in perm], [strides[a] for a in perm], 1)
                assert np.array_equal(bits(y), bits(want)), (shape, perm)


@pytest.mark.parametrize("shape, perm", [((70, 5), (1, 0)), ((5, 70), (1, 0)), ((3, 33, 65), (0, 2, 1)),
                                         ((2, 1000), (1, 0)), ((1000, 3), (1, 0)), ((33, 2, 31, 3), (3, 1, 2, 0)),
                                         ((4, 64, 64), (2, 1, 0)), ((7, 1, 9), (2, 1, 0)), ((37, 41), (1, 0))])
def test_permute_tiles_partial_and_batched(lib, shape, perm):
    """Tiles that overhang both axes, last axes narrower than 32 (TB < 32), batched transposes."""
    x = seeded_rng("view", f"tiles{shape}").standard_normal(shape).astype(np.float32)
    geo_shape, geo_stride = plans.permute_geometry(shape, perm)
    y, path = run_geometry(lib, x, geo_shape, geo_stride, 1)
    assert path == plans.PATH_TILE
    assert np.array_equal(bits(y.reshape(-1)), bits(np.transpose(x, perm).reshape(-1)))


def test_geometry_simplification():
    assert plans.permute_geometry((48, 128, 257), (2, 0, 1)) == ([257, 6144], [1, 257])
    assert plans.permute_geometry((3, 37), (0, 1)) == ([111], [1])
    assert plans.permute_geometry((2, 1, 3, 1, 2, 3, 1, 2), (7, 2, 5, 0, 3, 6, 1, 4)) == ([2, 3, 3, 2, 2], [1, 12, 2, 36, 6])
    assert plans.permute_geometry((0, 3, 2), (2, 0, 1)) == ([0], [1])
    assert plans.permute_geometry((), ()) == ([1], [1])
    assert plans.broadcast_geometry((16, 1, 33), (8, 16, 31, 33)) == ([8, 16, 31, 33], [0, 33, 0, 1])
    assert plans.broadcast_geometry((), (3, 37)) == ([111], [0])
    assert plans.broadcast_geometry((1, 3), (0, 3)) == ([0, 3], [0, 1])
    assert plans.broadcast_geometry((2, 1), (5, 3, 2, 7)) == ([15, 2, 7], [0, 1, 0])
    assert plans.broadcast_geometry((), ()) == ([1], [1])


@pytest.mark.parametrize("block", [32, 64, 256, 512, 17, 1])
def test_broadcast_backward_sums_for_any_block(lib, block):
    """Both modes with whole and partial warps: within the error model of a sum of `copies` terms,
    exact for one copy, +0 for none."""
    rng = seeded_rng("view", f"bcast-bwd-{block}")
    cases = [((1, 1531), (64, 1531)), ((3, 1), (3, 1000)), ((16, 1, 33), (8, 16, 31, 33)), ((), (3, 37)),
             ((1, 3), (4099, 3)), ((2, 1), (5, 3, 2, 7)), ((3, 37), (3, 37)), ((1, 3), (0, 3)), ((5,), (5,))]
    for x_shape, target in cases:
        g = rng.standard_normal(target).astype(np.float32)
        shape, stride = plans.broadcast_geometry(x_shape, target)
        n_x, copies = int(np.prod(x_shape, dtype=np.int64)), plans.copies(x_shape, target)
        geometry = i64(shape + stride)
        _, dx = _alloc(n_x, np.float32, False)
        dx.view(np.uint32)[...] = UNWRITTEN_BITS
        mode = lib.host_broadcast_bwd(np.ascontiguousarray(g).ctypes.data, dx.ctypes.data, geometry.ctypes.data,
                                      len(shape), n_x, copies, block)
        assert mode == (stride[-1] == 0)
        lead = len(target) - len(x_shape)
        axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(x_shape) if d == 1 and target[lead + i] != 1)
        want = g.astype(np.float64).sum(axis=axes).reshape(x_shape)
        got = dx.reshape(x_shape).astype(np.float64)
        bound = copies * 2.0**-24 * np.abs(g).astype(np.float64).sum(axis=axes).reshape(x_shape) * 1.01
        assert (np.abs(got - want) <= bound).all(), (x_shape, target)
        if copies <= 1:
            assert np.array_equal(bits(dx.reshape(x_shape)), bits(want.astype(np.float32))), (x_shape, target)


def test_row_copies_of_concat_and_slice(lib):
    out = i64(np.zeros(6))
    lib.host_rows(0, 5, 3, 7, 10, 4, out.ctypes.data)   # concat fwd: x (5, 3, 7) into y (5, 10, 7) at 4
    assert out.tolist() == [5, 21, 0, 21, 28, 70]
    lib.host_rows(1, 5, 3, 7, 10, 4, out.ctypes.data)   # concat bwd: dx (5, 3, 7) from g at 4
    assert out.tolist() == [5, 21, 28, 70, 0, 21]
    lib.host_rows(2, 5, 10, 7, 2, 3, out.ctypes.data)   # slice fwd: y (5, 3, 7) from x (5, 10, 7) at 2
    assert out.tolist() == [5, 21, 14, 70, 0, 21]


def test_slice_backward_vector_and_scalar_paths(lib):
    for (outer, size, inner, start, length), vec in [((3, 8, 4, 2, 5), 1), ((3, 8, 1, 2, 5), 0), ((2, 9, 4, 0, 9), 1),
                                                       ((2, 9, 4, 9, 0), 1), ((1, 5, 3, 1, 3), 0)]:
        g = seeded_rng("view", "slice-bwd").standard_normal((outer, length, inner)).astype(np.float32)
        _, dx = _alloc(outer * size * inner, np.float32, False)
        dx.view(np.uint32)[...] = UNWRITTEN_BITS
        assert lib.host_slice_bwd(g.ctypes.data, dx.ctypes.data, outer, size, inner, start, length) == vec
        want = np.zeros((outer, size, inner), np.float32)
        want[:, start:start + length] = g
        assert np.array_equal(bits(dx), bits(want.reshape(-1)))


# -- plans ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_plans_are_legal_for_every_sample(op):
    spec = get_spec(op)
    capsule = registry.lookup(op)
    assert plan_functions(capsule) == plans.PLANS[op]
    syms = {r.symbol: r for r in capsule.symbols}
    for sample in all_samples(spec):
        arrays, p, out_shape = validate(spec, sample.inputs, sample.params, np.float32)
        g = np.zeros(out_shape, np.float32)
        grads = REFERENCE.vjp(spec, sample.inputs, g, **sample.params)
        fwd, bwd = plans.PLANS[op][0](arrays, p), plans.PLANS[op][1](arrays, p)
        for arch in ARCHS:
            for plan in (fwd, bwd):
                assert plan_problems(plan, syms, arch) == [], f"{op} {plan.direction} {sample.summary()}"
        assert dict(fwd.output_shapes) == {"out": out_shape}
        want = {}
        for name, value in grads.items():
            if isinstance(value, tuple):
                want.update({f"d{name}[{i}]": v.shape for i, v in enumerate(value)})
            else:
                want[f"d{name}"] = value.shape
        assert dict(bwd.output_shapes) == want, f"{op} {sample.summary()}"
        for plan in (fwd, bwd):
            for launch in plan.launches:
                assert launch.block[0] % 32 == 0 and launch.block[1:] == (1, 1)
                if launch.symbol == "capsule_broadcast_bwd":
                    assert launch.block[0] <= plans.BROADCAST_BWD_MAX_THREADS


def test_reshape_plans_alias_their_input(lib):
    spec = get_spec("reshape")
    for sample in all_samples(spec):
        arrays, p, out_shape = validate(spec, sample.inputs, sample.params, np.float32)
        fwd, bwd = plans.PLANS["reshape"][0](arrays, p), plans.PLANS["reshape"][1](arrays, p)
        assert fwd.launches == bwd.launches == ()
        assert not fwd.launches and dict(fwd.aliases) == {"out": "x"} and dict(bwd.aliases) == {"dx": "g"}
        assert fwd.output_shapes["out"] == out_shape and bwd.output_shapes["dx"] == arrays["x"].shape
        assert plan_problems(fwd, {}) == plan_problems(bwd, {}) == []


def test_launches_fit_the_registers(build):
    """Every block a plan launches can start: threads × registers within an SM's register file."""
    widest = {}
    for op in OPS:
        spec = get_spec(op)
        for sample in all_samples(spec):
            arrays, p, _ = validate(spec, sample.inputs, sample.params, np.float32)
            for plan_fn in plans.PLANS[op]:
                for launch in plan_fn(arrays, p).launches:
                    widest[launch.symbol] = max(widest.get(launch.symbol, 0), launch.block[0])
    assert set(widest) == set(SYMBOLS)
    for arch in ARCHS:
        report = ptxas_report(build[arch][0].stderr)
        for symbol, threads in widest.items():
            registers = report[symbol][0]
            assert threads * (-(-registers // 8) * 8) <= REGISTERS_PER_SM, f"{symbol}: {threads} threads × {registers} registers on {arch}"


def test_planted_launch_faults_are_caught():
    spec = get_spec("permute")
    arrays, p, _ = validate(spec, {"x": np.zeros((3, 4, 5), np.float32)}, {"perm": (2, 0, 1)}, np.float32)
    plan = plans.PLANS["permute"][0](arrays, p)
    syms = symbols(["permute"])
    (launch,) = plan.launches

    def problems(**changes):
        return plan_problems(dataclasses.replace(plan, launches=(dataclasses.replace(launch, **changes),)), syms)

    assert plan_problems(plan, syms) == []
    assert any("2048 threads" in m for m in problems(block=(2048, 1, 1)))
    assert any("4 arguments for 5" in m for m in problems(args=launch.args[:4]))
    assert any("writable" in m for m in problems(args=("out", "x", *launch.args[2:])))
    assert any("geometry needs a buffer" in m for m in problems(args=("x", "out", 3, *launch.args[3:])))
    assert any("rank = " in m for m in problems(args=(*launch.args[:3], 2**40, launch.args[4])))
    broken = dataclasses.replace(plan, host_data={})
    assert any("meta buffer geometry" in m for m in plan_problems(broken, syms))
