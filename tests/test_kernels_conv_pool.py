"""cuda/conv_pool.cu without a GPU: it compiles cleanly for sm_80 and sm_90 with the registry's
entry points; its per-thread code (cuda/conv_pool.cuh, compiled for the host and replayed thread
by thread, tile by tile, as the device's barriers order it) meets each op's contract against the
float64 reference when driven by the op's own launch plans (NaN-prefilled, guard-banded outputs,
inputs checked intact); its index arithmetic matches brute force; its plans are legal."""

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
from capsule_core.ops.base import Sample, numel, seeded_rng, shapes_of, validate
from capsule_core.plans import conv_pool as plans
from hostmath import load

OPS = ("conv", "conv_transpose", "max_pool", "smooth_max_pool", "avg_pool")
CONVS = ("conv", "conv_transpose")
POOLS = ("max_pool", "smooth_max_pool", "avg_pool")
ARCHS = ("sm_80", "sm_90")
FLAGS = ("-std=c++17", "-O3", "-prec-div=true", "-prec-sqrt=true", "-ftz=false", "-fmad=true")
SOURCE = cuda_source_dir() / "conv_pool.cu"


def symbols(op):
    return {ref.symbol: ref for ref in registry.lookup(op).symbols}


ALL_SYMBOLS = {name: ref for op in OPS for name, ref in symbols(op).items()}


# -- the build ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """conv_pool.cu compiled once per arch (in parallel): ptxas's report and the PTX."""
    def compile_for(arch):
        out = tmp_path_factory.mktemp(f"conv_pool_{arch}")
        cmd = [str(find_nvcc().path), *FLAGS, f"-arch={arch}", "-Xptxas", "-v", "-Werror", "all-warnings",
               "-I", str(cuda_source_dir()), "-cubin", "-keep", "-keep-dir", str(out), "-o", str(out / "conv_pool.cubin"),
               str(SOURCE)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        ptx = out / "conv_pool.ptx"
        return arch, (result, ptx.read_text() if ptx.exists() else "")
    with ThreadPoolExecutor(len(ARCHS)) as pool:
        return dict(pool.map(compile_for, ARCHS))


def ptxas_report(stderr: str) -> dict:
    """{kernel: (registers, stack frame bytes, spill store bytes, spill load bytes, shared bytes)}."""
    report = {}
    for block in re.split(r"Compiling entry function ", stderr)[1:]:
        name = re.match(r"'(\w+)'", block)[1]
        frame, stores, loads = map(int, re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                                                  block).groups())
        smem = re.search(r"(\d+) bytes smem", block)
        report[name] = (int(re.search(r"Used (\d+) registers", block)[1]), frame, stores, loads, int(smem[1]) if smem else 0)
    return report


def ptx_entries(ptx: str) -> dict:
    return {m[1]: re.findall(r"\.param \.(\w+) ", m[2]) for m in re.finditer(r"\.entry (\w+)\(([^)]*)\)", ptx)}


PTX_TYPES = {"float": "f32", "int64_t": "u64", "uint64_t": "u64", "int32_t": "u32"}
MIN_BLOCKS = {"fwd": 4, "bwd_x": 4, "bwd_w": 6}
"""__launch_bounds__(128, n) of the GEMM kernels: at most 65536 / (128·n) registers."""


@pytest.mark.parametrize("arch", ARCHS)
def test_compiles_without_warnings_or_spills(build, arch):
    result, _ = build[arch]
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr.lower(), result.stderr
    report = ptxas_report(result.stderr)
    assert set(report) == set(ALL_SYMBOLS), "every kernel of the file is a registered entry point"
    for name, (registers, frame, stores, loads, smem) in report.items():
        assert frame == stores == loads == 0, f"{name} spills on {arch}"
        assert smem <= 48 * 1024, f"{name}: {smem} bytes of static shared memory"
        suffix = re.sub(r"^capsule_(conv_transpose|conv)_", "", name)
        if name.startswith("capsule_conv") and suffix in MIN_BLOCKS:
            assert registers * plans.GEMM_THREADS * MIN_BLOCKS[suffix] <= 65536, f"{name}: {registers} registers"


def test_plan_constants_match_the_kernels():
    """The plans size grids and blocks by the tile shapes of conv_pool.cuh (a kernel launched
    with another block shape writes nothing)."""
    header = (cuda_source_dir() / "conv_pool.cuh").read_text()
    assert f"constexpr int kGemmThreads = {plans.GEMM_THREADS};" in header
    assert f"constexpr int kSumThreads = {plans.SUM_THREADS};" in header
    assert f"using CorrTiles = CorrTile<{plans.CORR_TILE[0]}, {plans.CORR_TILE[1]}>;" in header
    bm, bn, bk = plans.WEIGHT_TILE
    assert f"static constexpr int BM = {bm}, BN = {bn}, BK = {bk}," in header


@pytest.mark.parametrize("arch", ARCHS)
def test_ptx_entries_have_the_declared_parameter_lists(build, arch):
    entries = ptx_entries(build[arch][1])
    for name, ref in ALL_SYMBOLS.items():
        assert name in entries, f"no .entry {name} in the {arch} PTX"
        expected = ["u64" if p.pointer else PTX_TYPES[p.ctype] for p in map(parse_param, ref.params)]
        assert entries[name] == expected, f"{name}: PTX {entries[name]} for the declared {ref.params}"


def test_source_spells_out_each_declared_signature():
    source = re.sub(r"\s+", " ", SOURCE.read_text())
    for name, ref in ALL_SYMBOLS.items():
        assert ref.path == "cuda/conv_pool.cu"
        pattern = (r'extern "C" __global__ (?:__launch_bounds__\([^)]*\) )?void ' + re.escape(f"{name}({', '.join(ref.params)})"))
        assert re.search(pattern, source), f"{name}: the source does not declare the registry's parameter list"


# -- the host library -------------------------------------------------------------------------------

C_TYPES = {"float": ctypes.c_float, "int64_t": ctypes.c_int64, "int32_t": ctypes.c_int32}
I64P = ctypes.POINTER(ctypes.c_int64)
F32P = ctypes.POINTER(ctypes.c_float)
POOL_ARGS = [ctypes.c_int64] * 16


@pytest.fixture(scope="module")
def lib(host_build_dir):
    lib = load("conv_pool_host", host_build_dir)
    for name, ref in ALL_SYMBOLS.items():
        fn = getattr(lib, name.replace("capsule_", "host_", 1))
        fn.restype = None
        fn.argtypes = [F32P if p.pointer else C_TYPES[p.ctype] for p in map(parse_param, ref.params)]
    lib.host_source.restype = ctypes.c_int64
    lib.host_source.argtypes = [ctypes.c_int32] + [ctypes.c_int64] * 5
    lib.host_covering.restype = None
    lib.host_covering.argtypes = [ctypes.c_int64] * 5 + [I64P]
    lib.host_window_argmax.restype = None
    lib.host_window_argmax.argtypes = [F32P, I64P, F32P] + POOL_ARGS
    lib.host_corr_gather.restype = None
    lib.host_corr_gather.argtypes = [ctypes.c_int32] + [ctypes.c_int64] * 17 + [I64P]
    return lib


# -- index arithmetic -----------------------------------------------------------------------------------


def test_source_cell_matches_brute_force(lib):
    """Correlation: i = o·s − p + k inside [0, in); transposed: the o' with o'·s − p + k = o."""
    for k, s, p, size in itertools.product((1, 2, 3, 5), (1, 2, 3, 7), (0, 1, 2), (1, 2, 5, 9)):
        for o in range(0, 3 * size + 6):
            i = o * s - p + k
            assert lib.host_source(0, o, k, s, p, size) == (i if 0 <= i < size else -1)
            hits = [q for q in range(size) if q * s - p + k == o]
            assert lib.host_source(1, o, k, s, p, size) == (hits[0] if hits else -1)


def test_covering_windows_match_brute_force(lib):
    span = np.empty(2, np.int64)
    for k, s, p, size in itertools.product((1, 2, 3, 4), (1, 2, 3, 5), (0, 1, 2), (1, 3, 7, 10)):
        out = plans.window_out_len(size, k, s, p)
        for i in range(size):
            lib.host_covering(i, k, s, p, out, span.ctypes.data_as(I64P))
            expect = [o for o in range(out) if o * s - p <= i <= o * s - p + k - 1]
            got = list(range(span[0], span[1] + 1))
            assert got == expect, (i, k, s, p, size)


def _pool_scalars(x_shape, params):
    arrays, p, _ = validate(get_spec("max_pool"), {"x": np.zeros(x_shape, np.float32)}, params, np.float32)
    return plans._pool_shapes(arrays, p)


def _argmax_reference(x, params):
    """First maximum in window order, NaN and padding never win: (cell index or -1, value)."""
    _, y_shape, scalars = _pool_scalars(x.shape, params)
    planes, geom = scalars[0], scalars[1:]
    d, od, k, s, p = geom[0:3], geom[3:6], geom[6:9], geom[9:12], geom[12:15]
    xp = x.reshape(planes, *d)
    index = np.full((planes, *od), -1, np.int64)
    value = np.full((planes, *od), np.nan, np.float32)
    for c in range(planes):
        for o in itertools.product(*(range(n) for n in od)):
            for off in itertools.product(*(range(kk) for kk in k)):
                cell = tuple(oo * ss - pp + ff for oo, ss, pp, ff in zip(o, s, p, off))
                if not all(0 <= q < n for q, n in zip(cell, d)):
                    continue
                v = xp[(c, *cell)]
                if not np.isnan(v) and (index[(c, *o)] < 0 or v > value[(c, *o)]):
                    index[(c, *o)] = np.ravel_multi_index(cell, d)
                    value[(c, *o)] = v
    return index.ravel(), value.ravel(), y_shape


ARGMAX_CASES = [
    (np.array([[[1.0, 3.0, 3.0, 2.0, np.nan, np.nan, 5.0, 5.0]]]), {"kernel": 2, "stride": 1, "padding": 1}),
    (np.array([[[np.nan, np.nan, np.nan, -np.inf, -np.inf, 1.0]]]), {"kernel": 3, "stride": 1, "padding": 1}),
    (np.array([[[0.0, -0.0, -0.0, 0.0, -1.0]]]), {"kernel": 2, "stride": 1}),
    (np.round(np.random.default_rng(1).random((2, 2, 6, 5))), {"kernel": 3, "stride": (2, 1), "padding": 1}),
    (np.where(np.random.default_rng(2).random((1, 2, 4, 5, 6)) < 0.3, np.nan,
              np.round(3 * np.random.default_rng(3).random((1, 2, 4, 5, 6)))), {"kernel": (2, 3, 2), "stride": (1, 2, 2), "padding": (1, 1, 0)}),
]


@pytest.mark.parametrize("x, params", ARGMAX_CASES)
def test_window_argmax_is_the_first_maximum_ignoring_nan(lib, x, params):
    x = np.ascontiguousarray(x, np.float32)
    want_index, want_value, y_shape = _argmax_reference(x, params)
    scalars = _pool_scalars(x.shape, params)[2]
    index = np.empty(numel(y_shape), np.int64)
    value = np.empty(numel(y_shape), np.float32)
    lib.host_window_argmax(x.ctypes.data_as(F32P), index.ctypes.data_as(I64P), value.ctypes.data_as(F32P), *scalars)
    assert index.tolist() == want_index.tolist()
    assert value.view(np.uint32).tolist() == want_value.view(np.uint32).tolist() or np.array_equal(value, want_value, equal_nan=True)
    assert np.array_equal(np.signbit(value), np.signbit(want_value)), "the first of tied ±0 is the one reported"


GATHER_CASES = [
    # (x shape, w shape (conv layout), stride, padding): ranks 1, 2, 3 with stride and padding
    ((2, 3, 11), (1, 3, 3), 2, 1),
    ((1, 2, 5, 4), (1, 2, 3, 2), (2, 1), (1, 1)),
    ((2, 1, 4, 3, 5), (1, 1, 2, 3, 2), (1, 2, 3), (1, 0, 1)),
    ((1, 1, 9), (1, 1, 2), 3, 0),
]


def _gather_brute_force(transposed, in_shape, out_sizes, kernel, stride, padding):
    """table[m, r] by the definitions, straight from the spec's index rules."""
    n, c = in_shape[0], in_shape[1]
    in_sizes = in_shape[2:]
    kv = numel(kernel)
    table = np.full((n * numel(out_sizes), kv), -1, np.int64)
    for b in range(n):
        for pos, o in enumerate(itertools.product(*(range(q) for q in out_sizes))):
            for r, off in enumerate(itertools.product(*(range(q) for q in kernel))):
                if transposed:
                    cands = [i for i in itertools.product(*(range(q) for q in in_sizes))
                             if all(ii * ss - pp + ff == oo for ii, ss, pp, ff, oo in zip(i, stride, padding, off, o))]
                    cell = cands[0] if cands else None
                else:
                    cell = tuple(oo * ss - pp + ff for oo, ss, pp, ff in zip(o, stride, padding, off))
                    cell = cell if all(0 <= q < size for q, size in zip(cell, in_sizes)) else None
                if cell is not None:
                    table[b * numel(out_sizes) + pos, r] = b * c * numel(in_sizes) + np.ravel_multi_index(cell, in_sizes)
    return table


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("x_shape, w_shape, stride, padding", GATHER_CASES)
def test_implicit_gemm_gather_map(lib, transposed, x_shape, w_shape, stride, padding):
    """Row m (output position), reduction index r (kernel offset) -> the input element or padding:
    the correlation (conv forward) and its adjoint (conv dx, conv_transpose forward)."""
    r = len(x_shape) - 2
    kernel = tuple(w_shape[2:])
    stride, padding = plans._per_axis(stride, r), plans._per_axis(padding, r)
    # The transposed gather reads x_shape as a correlation's output and makes its (longer) input.
    length = plans.transpose_out_len if transposed else plans.window_out_len
    in_shape = x_shape
    out_sizes = tuple(length(q, k, s, p) for q, k, s, p in zip(x_shape[2:], kernel, stride, padding))
    geom = plans._geometry(in_shape[2:], out_sizes, kernel, stride, padding)
    rows = in_shape[0] * numel(out_sizes)
    table = np.empty(rows * numel(kernel), np.int64)
    lib.host_corr_gather(int(transposed), in_shape[0], in_shape[1], *geom, table.ctypes.data_as(I64P))
    want = _gather_brute_force(transposed, in_shape, out_sizes, kernel, stride, padding)
    assert table.reshape(want.shape).tolist() == want.tolist()
    assert (want >= 0).any()


# -- running the plans on the host -------------------------------------------------------------------------

GUARD = 64
GUARD_BITS = np.uint32(0x7F8A5A5A)
"""Signalling-NaN sentinel around every buffer."""
FILL_BITS = np.uint32(0x7FBADBAD)
"""Signalling-NaN prefill of outputs and workspaces: no kernel result has these bits."""


@dataclasses.dataclass
class _Slot:
    raw: np.ndarray
    start: int
    size: int

    @property
    def view(self):
        return self.raw[self.start:self.start + self.size]


def run_plan(lib, plan, arrays, shift=0):
    """Execute a LaunchPlan with the host kernels: every buffer inside a guard-banded allocation
    (offset by `shift` floats: shift = 1 makes every buffer misaligned), outputs and workspaces
    prefilled with FILL_BITS. Returns the outputs; asserts guards and inputs intact, every
    output element written."""
    syms = {r.symbol: r for r in registry.lookup(plan.op).symbols}
    slots = {}
    for b in plan.buffers:
        raw = np.full(b.elements + 2 * GUARD + shift, GUARD_BITS, np.uint32).view(np.float32)
        slot = _Slot(raw, GUARD + shift, b.elements)
        if b.role == "input":
            slot.view[...] = np.asarray(arrays[b.name], np.float32).ravel()
        else:
            slot.view.view(np.uint32)[...] = FILL_BITS
        slots[b.name] = slot
    before = {b.name: slots[b.name].view.copy() for b in plan.buffers if b.role == "input"}
    for launch in plan.launches:
        ref = syms[launch.symbol]
        args = []
        for param, arg in zip(map(parse_param, ref.params), launch.args, strict=True):
            if param.pointer:
                slot = slots[arg]
                args.append(slot.raw[slot.start:].ctypes.data_as(F32P))
            else:
                args.append(C_TYPES[param.ctype](arg))
        getattr(lib, launch.symbol.replace("capsule_", "host_", 1))(*args)
    for name, slot in slots.items():
        head, tail = slot.raw[:slot.start].view(np.uint32), slot.raw[slot.start + slot.size:].view(np.uint32)
        assert (head == GUARD_BITS).all() and (tail == GUARD_BITS).all(), f"{plan.op} {plan.direction}: write outside {name}"
    for name, values in before.items():
        assert np.array_equal(slots[name].view.view(np.uint32), values.view(np.uint32)), f"{plan.op}: input {name} modified"
    outputs = {}
    for b in plan.buffers:
        if b.role == "output":
            bits = slots[b.name].view.view(np.uint32)
            assert not (bits == FILL_BITS).any(), f"{plan.op} {plan.direction}: {b.name} not fully written"
            outputs[b.name] = slots[b.name].view.copy().reshape(plan.output_shapes[b.name])
    return outputs


def host_forward(lib, spec, arrays, p, shift=0):
    return run_plan(lib, plans.PLANS[spec.name][0](arrays, p), arrays, shift)["out"]


def host_vjp(lib, spec, arrays, p, g, shift=0):
    out = host_forward(lib, spec, arrays, p, shift)
    grads = run_plan(lib, plans.PLANS[spec.name][1](arrays, p), {**arrays, "out": out, "g": g}, shift)
    return {name[1:]: v for name, v in grads.items()}


def check_forward(lib, spec, sample, shift=0):
    arrays, p, _ = validate(spec, sample.inputs, sample.params, np.float32)
    y = host_forward(lib, spec, arrays, p, shift)
    r = REFERENCE.forward(spec, sample.inputs, **sample.params)
    m = REFERENCE.magnitude(spec, sample.inputs, **sample.params)
    n = spec.error.length(shapes_of(arrays), p) if hasattr(spec.error, "length") else 1
    result = compare(y, r, m, spec.error, n, sample.worst_case)
    assert result.passed, f"{spec.name} forward {sample.summary()}: {result.reason} (worst {result.worst:.3g})"
    return result.worst


def check_vjp(lib, spec, sample, shift=0):
    arrays, p, out_shape = validate(spec, sample.inputs, sample.params, np.float32)
    g = seeded_rng(spec.name, f"g/{sample.case}").standard_normal(out_shape).astype(np.float32)
    got = host_vjp(lib, spec, arrays, p, g, shift)
    r = REFERENCE.vjp(spec, sample.inputs, g, **sample.params)
    m = REFERENCE.vjp_magnitude(spec, sample.inputs, g, **sample.params)
    assert set(got) == set(spec.differentiable)
    worst = 0.0
    for name in spec.differentiable:
        model = spec.vjp_error_for(name)
        n = model.length(shapes_of(arrays), p) if hasattr(model, "length") else 1
        result = compare(got[name], r[name], m[name], model, n, sample.worst_case)
        assert result.passed, f"{spec.name} d{name} {sample.summary()}: {result.reason} (worst {result.worst:.3g})"
        worst = max(worst, result.worst)
    return worst


def host_cases(spec):
    """small, medium and edges; large too for the pools (cheap on the host)."""
    sizes = ("small", "medium", "large") if spec.name in POOLS else ("small", "medium")
    out = []
    for size in sizes:
        out += spec.samples(size, seeded_rng(spec.name, size))
    return out + spec.edges()


@pytest.mark.parametrize("op", OPS)
def test_host_forward_meets_the_contract(lib, op):
    spec = get_spec(op)
    worst = max(check_forward(lib, spec, sample) for sample in host_cases(spec))
    assert worst <= 0.5, f"{op}: worst error {worst:.3g} of the bound"


@pytest.mark.parametrize("op", OPS)
def test_host_vjp_meets_the_contract(lib, op):
    spec = get_spec(op)
    worst = max(check_vjp(lib, spec, sample) for sample in host_cases(spec))
    assert worst <= 0.5, f"{op}: worst error {worst:.3g} of the bound"


WIDE_CASES = {
    # (x shape, w shape, stride, padding): several column tiles (channels > 32, partial last tile),
    # partial channel chunks (channels % 16 != 0), several dw tiles on both channel axes; ranks 1-3
    "conv": [((2, 20, 9, 7), (40, 20, 3, 2), (2, 1), (1, 1)),
             ((1, 36, 33), (70, 36, 4), 3, 2),
             ((2, 17, 5, 4, 6), (33, 17, 2, 3, 2), (1, 2, 1), (1, 1, 0))],
    "conv_transpose": [((2, 20, 5, 4), (20, 40, 3, 2), (2, 1), (1, 0)),
                       ((1, 36, 12), (36, 70, 4), 3, 2),
                       ((2, 33, 3, 4, 3), (33, 17, 2, 3, 2), (1, 2, 1), (1, 1, 0))],
}


@pytest.mark.parametrize("op", CONVS)
def test_host_conv_with_several_channel_tiles(lib, op):
    spec = get_spec(op)
    for i, (x_shape, w_shape, stride, padding) in enumerate(WIDE_CASES[op]):
        rng = seeded_rng(op, f"wide-{i}")
        co = w_shape[1] if op == "conv_transpose" else w_shape[0]
        inputs = {"x": rng.standard_normal(x_shape).astype(np.float32),
                  "w": (rng.standard_normal(w_shape) / np.sqrt(numel(w_shape[1:]))).astype(np.float32),
                  "b": rng.standard_normal(co).astype(np.float32)}
        sample = Sample(inputs, {"stride": stride, "padding": padding}, f"wide-{i}")
        check_forward(lib, spec, sample)
        check_vjp(lib, spec, sample)


@pytest.mark.parametrize("op", OPS)
def test_host_unaligned_buffers_take_the_scalar_paths(lib, op):
    """Every buffer one float off 16-byte alignment: the vector stores and loads fall back."""
    spec = get_spec(op)
    for sample in spec.samples("small", seeded_rng(op, "small")) + spec.samples("medium", seeded_rng(op, "medium"))[:1]:
        check_forward(lib, spec, sample, shift=1)
        check_vjp(lib, spec, sample, shift=1)


@pytest.mark.parametrize("op", CONVS)
def test_host_forward_is_bitwise_independent_of_alignment(lib, op):
    """The 16-byte epilogue stores write the same bits as the scalar ones."""
    spec = get_spec(op)
    sample = spec.samples("medium", seeded_rng(op, "medium"))[0]
    arrays, p, _ = validate(spec, sample.inputs, sample.params, np.float32)
    aligned, shifted = host_forward(lib, spec, arrays, p), host_forward(lib, spec, arrays, p, shift=1)
    assert np.array_equal(aligned.view(np.uint32), shifted.view(np.uint32))


@pytest.mark.parametrize("op", CONVS)
@pytest.mark.parametrize("splits", [1, 2, 5, 64])
def test_host_weight_gradient_for_any_split(lib, op, splits, monkeypatch):
    """dw with the reduction forced into `splits` ranges (more than there are steps: empty
    ranges must still write their zero partials)."""
    monkeypatch.setattr(plans, "weight_splits", lambda *a: splits)
    spec = get_spec(op)
    sample = spec.samples("medium", seeded_rng(op, "medium"))[1]
    check_vjp(lib, spec, sample)
    plan = plans.PLANS[op][1](*validate(spec, sample.inputs, sample.params, np.float32)[:2])
    assert any(launch.symbol.endswith("bwd_wsum") for launch in plan.launches) == (splits > 1)


def test_host_max_pool_selection_policy(lib):
    """Ties: each window's g goes to exactly one cell, the first maximum in window order; an
    all-NaN window sends nothing; padding never wins (all-negative input)."""
    spec = get_spec("max_pool")
    x = np.array([[[[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [np.nan, np.nan, -1.0]]]], np.float32)
    params = {"kernel": 2, "stride": 1, "padding": 1}
    arrays, p, out_shape = validate(spec, {"x": x}, params, np.float32)
    g = np.arange(1.0, 1.0 + numel(out_shape), dtype=np.float32).reshape(out_shape)
    y = host_forward(lib, spec, arrays, p)
    dx = host_vjp(lib, spec, arrays, p, g)["x"]
    assert np.isclose(dx.sum(), g[~np.isnan(y)].sum())
    # windows (output 4x4) over the padded 4x4: first maxima in row-major window order
    want = np.zeros_like(x)
    index, _, _ = _argmax_reference(x, params)
    for o, cell in enumerate(index):
        if cell >= 0:
            want.reshape(-1)[cell] += g.reshape(-1)[o]
    assert np.array_equal(dx, want)
    assert np.isnan(y[0, 0, 3, 0]) and np.isnan(y[0, 0, 3, 1]), "all-NaN windows give NaN"
    neg = -1.0 - np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3)
    arrays, p, _ = validate(spec, {"x": neg}, params, np.float32)
    assert (host_forward(lib, spec, arrays, p) < 0).all(), "padding never wins"


def test_host_weight_gradient_is_deterministic(lib):
    spec = get_spec("conv")
    sample = spec.samples("medium", seeded_rng("conv", "medium"))[0]
    arrays, p, out_shape = validate(spec, sample.inputs, sample.params, np.float32)
    g = seeded_rng("conv", "det").standard_normal(out_shape).astype(np.float32)
    a, b = host_vjp(lib, spec, arrays, p, g), host_vjp(lib, spec, arrays, p, g)
    for name in a:
        assert np.array_equal(a[name].view(np.uint32), b[name].view(np.uint32))


# -- the unchanged .cu on the CPU emulator ---------------------------------------------------------------
#
# tests/kernel_emu.py runs conv_pool.cu itself (its tile loops, barriers and warp shuffles) with
# every thread a fiber, at a grid of 4 blocks (so each block walks many tiles). Its results must
# be bitwise those of the host replay above: the same per-thread code in the same order.


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    kernel_emu = pytest.importorskip("kernel_emu")
    if kernel_emu.compiler() is None:
        pytest.skip("no C++ compiler (g++) for the emulator")
    return kernel_emu.PlanRunner("conv_pool", str(tmp_path_factory.mktemp("conv_pool-emu")), max_grid=4)


def emulator_cases(spec):
    out = spec.samples("small", seeded_rng(spec.name, "small")) + spec.samples("medium", seeded_rng(spec.name, "medium"))[:2]
    return out + spec.edges()


@pytest.mark.parametrize("op", OPS)
def test_emulated_kernels_match_the_host_replay_bitwise(lib, emulator, op):
    spec = get_spec(op)
    forward_plan, backward_plan = plans.PLANS[op]
    for i, sample in enumerate(emulator_cases(spec)):
        arrays, p, out_shape = validate(spec, sample.inputs, sample.params, np.float32)
        g = seeded_rng(op, f"g/{sample.case}").standard_normal(out_shape).astype(np.float32)
        shift = i % 2  # every other case misaligned: the vector paths and the scalar ones
        fwd, bwd = forward_plan(arrays, p), backward_plan(arrays, p)
        misalign = {b.name: shift for b in fwd.buffers + bwd.buffers}
        y_host = run_plan(lib, fwd, arrays, shift)["out"]
        y_emu = emulator.run(fwd, arrays, misalign)["out"]
        assert np.array_equal(y_host.view(np.uint32), y_emu.view(np.uint32)), f"{op} forward {sample.summary()}"
        grads_host = run_plan(lib, bwd, {**arrays, "out": y_host, "g": g}, shift)
        grads_emu = emulator.run(bwd, {**arrays, "out": y_host, "g": g}, misalign)
        for name, v in grads_host.items():
            assert np.array_equal(v.view(np.uint32), grads_emu[name].view(np.uint32)), f"{op} {name} {sample.summary()}"


@pytest.mark.parametrize("op", CONVS)
def test_emulated_conv_with_several_channel_tiles_and_splits(lib, emulator, op, monkeypatch):
    spec = get_spec(op)
    x_shape, w_shape, stride, padding = WIDE_CASES[op][0]
    rng = seeded_rng(op, "emu-wide")
    co = w_shape[1] if op == "conv_transpose" else w_shape[0]
    inputs = {"x": rng.standard_normal(x_shape).astype(np.float32), "w": rng.standard_normal(w_shape).astype(np.float32),
              "b": rng.standard_normal(co).astype(np.float32)}
    arrays, p, out_shape = validate(spec, inputs, {"stride": stride, "padding": padding}, np.float32)
    g = rng.standard_normal(out_shape).astype(np.float32)
    for splits in (1, 3):
        monkeypatch.setattr(plans, "weight_splits", lambda *a: splits)
        fwd, bwd = plans.PLANS[op][0](arrays, p), plans.PLANS[op][1](arrays, p)
        y = run_plan(lib, fwd, arrays)["out"]
        assert np.array_equal(y.view(np.uint32), emulator.run(fwd, arrays)["out"].view(np.uint32))
        want = run_plan(lib, bwd, {**arrays, "g": g})
        got = emulator.run(bwd, {**arrays, "g": g})
        for name in want:
            assert np.array_equal(want[name].view(np.uint32), got[name].view(np.uint32)), f"{op} {name} splits={splits}"


# -- launch plans -------------------------------------------------------------------------------------------


def all_samples(spec):
    out = []
    for size in ("small", "medium", "large"):
        out += spec.samples(size, seeded_rng(spec.name, size))
    return out + spec.edges()


@pytest.mark.parametrize("op", OPS)
def test_plans_are_legal_for_every_sample(op):
    spec = get_spec(op)
    capsule = registry.lookup(op)
    forward_plan, backward_plan = plan_functions(capsule)
    assert plans.PLANS[op] == (forward_plan, backward_plan)
    syms = {r.symbol: r for r in capsule.symbols}
    for sample in all_samples(spec):
        arrays, p, out_shape = validate(spec, sample.inputs, sample.params, np.float32)
        r_out = REFERENCE.forward(spec, sample.inputs, **sample.params)
        g = np.zeros(r_out.shape, np.float32)
        grad_shapes = {k: v.shape for k, v in REFERENCE.vjp(spec, sample.inputs, g, **sample.params).items()}
        fwd, bwd = forward_plan(arrays, p), backward_plan(arrays, p)
        for arch in ARCHS:
            for plan in (fwd, bwd):
                assert plan_problems(plan, syms, arch) == [], f"{op} {plan.direction} {sample.summary()}"
        assert dict(fwd.output_shapes) == {"out": r_out.shape} and tuple(out_shape) == r_out.shape
        assert dict(bwd.output_shapes) == {f"d{k}": v for k, v in grad_shapes.items()}
        assert {b.name for b in fwd.buffers if b.role == "input"} == {t.name for t in spec.inputs}
        for plan in (fwd, bwd):
            for launch in plan.launches:
                assert launch.shared_bytes == 0, "static shared memory only (no opt-in needed)"
                assert launch.grid[0] >= 1


def test_large_conv_sample_launch_shape():
    """The large conv sample (8, 32, 64, 64) * (32, 32, 3, 3): 256 forward tiles of 128 × 32; dw
    split so that its 9 tiles become a few hundred blocks."""
    spec = get_spec("conv")
    (sample,) = spec.samples("large", seeded_rng("conv", "large"))
    arrays, p, _ = validate(spec, sample.inputs, sample.params, np.float32)
    (fwd,) = plans.PLANS["conv"][0](arrays, p).launches
    assert fwd.grid == (256, 1, 1) and fwd.block == (128, 1, 1)
    bwd = plans.PLANS["conv"][1](arrays, p)
    by_symbol = {launch.symbol: launch for launch in bwd.launches}
    splits = by_symbol["capsule_conv_bwd_w"].args[-1]
    assert splits > 1 and 256 <= by_symbol["capsule_conv_bwd_w"].grid[0] <= 1024
    assert [launch.symbol for launch in bwd.launches] == ["capsule_conv_bwd_x", "capsule_conv_bwd_w",
                                                          "capsule_conv_bwd_wsum", "capsule_conv_bwd_b"]


def test_planted_launch_faults_are_caught():
    spec = get_spec("conv")
    (sample,) = spec.samples("large", seeded_rng("conv", "large"))
    arrays, p, _ = validate(spec, sample.inputs, sample.params, np.float32)
    plan = plans.PLANS["conv"][1](arrays, p)
    syms = symbols("conv")
    launch = plan.launches[1]
    assert launch.symbol == "capsule_conv_bwd_w"

    def problems(**changes):
        launches = list(plan.launches)
        launches[1] = dataclasses.replace(launch, **changes)
        return plan_problems(dataclasses.replace(plan, launches=tuple(launches)), syms)

    assert plan_problems(plan, syms) == []
    assert any("2048 threads" in m for m in problems(block=(2048, 1, 1)))
    assert any("22 arguments for 23" in m for m in problems(args=launch.args[:-1]))
    assert any("writable" in m for m in problems(args=("x", "g", "x", *launch.args[3:])))
    assert any("needs a number" in m for m in problems(args=(*launch.args[:-1], "dw")))
    assert any("not declared" in m for m in problems(symbol="capsule_max_pool_bwd"))
    assert any("grid dimension 0" in m for m in problems(grid=(0, 1, 1)))
