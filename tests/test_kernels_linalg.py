"""cuda/linalg.cu without a GPU: it compiles cleanly for sm_80 and sm_90 with the registry's entry
points and without spills; the kernels' own per-thread code (cuda/linalg.cuh, compiled for the
host) run through the launch plans meets each op's contract against the float64 reference; the
SGEMM tiles reproduce the plain sequential FMA chain of every output exactly; the plans are legal
for every sample."""

import ctypes
import dataclasses
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from capsule_core import registry
from capsule_core.backends.cpu import REFERENCE
from capsule_core.kernels import cuda_source_dir, find_nvcc
from capsule_core.launch import STATIC_SHARED_LIMIT, parse_param, plan_functions, plan_problems
from capsule_core.numerics import compare
from capsule_core.ops import get_spec
from capsule_core.ops.base import seeded_rng, shapes_of, validate
from capsule_core.plans import linalg as plans
from hostmath import f32_ptr, load

OPS = ("matmul", "linear", "mse_loss")
ARCHS = ("sm_80", "sm_90")
FLAGS = ("-std=c++17", "-O3", "-prec-div=true", "-prec-sqrt=true", "-ftz=false", "-fmad=true")
SOURCE = cuda_source_dir() / "linalg.cu"


def symbols(op):
    return {ref.symbol: ref for ref in registry.lookup(op).symbols}


ALL_SYMBOLS = {name: ref for op in OPS for name, ref in symbols(op).items()}
GEMM_SYMBOLS = {"capsule_matmul_fwd", "capsule_matmul_bwd_a", "capsule_matmul_bwd_b",
                "capsule_linear_fwd", "capsule_linear_bwd_x", "capsule_linear_bwd_w"}
THREADS = {plans.BIG[2]: plans.BIG, plans.SMALL[2]: plans.SMALL}


# -- the build --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """linalg.cu compiled once per arch (in parallel): ptxas's report and the PTX."""
    def compile_for(arch):
        out = tmp_path_factory.mktemp(f"linalg_{arch}")
        cmd = [str(find_nvcc().path), *FLAGS, f"-arch={arch}", "-Xptxas", "-v", "-Werror", "all-warnings",
               "-I", str(cuda_source_dir()), "-cubin", "-keep", "-keep-dir", str(out), "-o", str(out / "linalg.cubin"),
               str(SOURCE)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        ptx = out / "linalg.ptx"
        return arch, (result, ptx.read_text() if ptx.exists() else "")
    with ThreadPoolExecutor(len(ARCHS)) as pool:
        return dict(pool.map(compile_for, ARCHS))


def ptxas_report(stderr: str) -> dict:
    """{kernel: (registers, stack frame bytes, spill store bytes, spill load bytes, static shared bytes)}."""
    report = {}
    for block in re.split(r"Compiling entry function ", stderr)[1:]:
        name = re.match(r"'(\w+)'", block)[1]
        frame, stores, loads = map(int, re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                                                  block).groups())
        smem = re.search(r"(\d+) bytes smem", block)
        report[name] = (int(re.search(r"Used (\d+) registers", block)[1]), frame, stores, loads,
                        int(smem[1]) if smem else 0)
    return report


def ptx_entries(ptx: str) -> dict:
    return {m[1]: re.findall(r"\.param \.(\w+) ", m[2]) for m in re.finditer(r"\.entry (\w+)\(([^)]*)\)", ptx)}


PTX_TYPES = {"float": "f32", "int64_t": "u64", "uint64_t": "u64", "int32_t": "u32"}


@pytest.mark.parametrize("arch", ARCHS)
def test_compiles_without_warnings_or_spills(build, arch):
    result, _ = build[arch]
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr.lower(), result.stderr
    report = ptxas_report(result.stderr)
    assert set(report) == set(ALL_SYMBOLS), "every kernel of the file is a registered entry point"
    for name, (registers, frame, stores, loads, smem) in report.items():
        assert frame == stores == loads == 0, f"{name} uses local memory on {arch}"
        if name in GEMM_SYMBOLS:
            # Two 256-thread blocks per multiprocessor: 128 registers, 2 × 16.5 KB of shared memory.
            assert registers <= 128 and 2 * 256 * registers <= 65536, f"{name}: {registers} registers"
            assert smem == 2 * 8 * (132 + 132) * 4 <= STATIC_SHARED_LIMIT, f"{name}: {smem} bytes of shared memory"
        else:
            assert registers <= 64, f"{name}: {registers} registers on {arch} (1024-thread blocks need 64)"


@pytest.mark.parametrize("arch", ARCHS)
def test_ptx_entries_have_the_declared_parameter_lists(build, arch):
    entries = ptx_entries(build[arch][1])
    for name, ref in ALL_SYMBOLS.items():
        assert name in entries, f"no .entry {name} in the {arch} PTX"
        expected = ["u64" if p.pointer else PTX_TYPES[p.ctype] for p in map(parse_param, ref.params)]
        assert entries[name] == expected, f"{name}: PTX {entries[name]} for the declared {ref.params}"


@pytest.mark.parametrize("arch", ARCHS)
def test_the_gemm_core_is_vectorised(build, arch):
    """The FMA inner loop reads 16-byte shared fragments and the tiles move 16-byte global vectors."""
    ptx = build[arch][1]
    for name in GEMM_SYMBOLS:
        body = re.search(rf"\.entry {name}\(.*?\n}}\n", ptx, re.DOTALL)[0]
        # BigTile: one k-step of 8×8 FMAs; SmallTile: eight unrolled k-steps of 8×4.
        assert body.count("fma.rn.f32") == 64 + 8 * 32, name
        assert body.count("ld.shared.v4.f32") == 4 + 8 * 3, name
        assert body.count("ld.global.nc.v4.f32") >= 4 and body.count("st.global.cg.v4.f32") == 16 + 8, name
        assert not re.search(r"^\s*(@\S+\s+)?(atom|red)\.", body, re.MULTILINE), f"{name} uses atomics"


def test_source_spells_out_each_declared_signature():
    source = re.sub(r"\s+", " ", SOURCE.read_text())
    for name, ref in ALL_SYMBOLS.items():
        assert ref.path == "cuda/linalg.cu"
        pattern = rf'extern "C" __global__ (__launch_bounds__\([^)]*\) )?void {name}\({re.escape(", ".join(ref.params))}\)'
        assert re.search(pattern, source), f"{name}: the source does not declare {ref.params}"
    assert not re.search(r"\batomic\w*\(", source), "atomics"


# -- the kernels' code on the host, driven by the launch plans ----------------------------------------


@pytest.fixture(scope="module")
def lib(host_build_dir):
    lib = load("linalg_host", host_build_dir)
    ctypes_of = {"float": ctypes.c_float, "int64_t": ctypes.c_int64, "int32_t": ctypes.c_int32}
    for name, ref in ALL_SYMBOLS.items():
        fn = getattr(lib, name.replace("capsule_", "host_", 1))
        fn.restype = ctypes.c_int if name in GEMM_SYMBOLS else None
        fn.argtypes = [ctypes.POINTER(ctypes.c_float) if p.pointer else ctypes_of[p.ctype]
                       for p in map(parse_param, ref.params)] + [ctypes.c_int]
    lib.host_gemm_naive.argtypes = [ctypes.c_int, ctypes.c_int] + [ctypes.POINTER(ctypes.c_float)] * 3 + [ctypes.c_int64] * 4
    lib.host_tile_coords.argtypes = [ctypes.c_int64] * 3 + [ctypes.POINTER(ctypes.c_int64)]
    lib.host_thread_layout.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
    lib.host_mse_accumulate.restype = ctypes.c_double
    lib.host_mse_accumulate.argtypes = [ctypes.c_double, ctypes.c_float, ctypes.c_float]
    return lib


GUARD = 16
SENTINEL = np.uint32(0x7FA11CE5)
UNWRITTEN = np.uint32(0x7FC0FFEE)
"""NaN bit patterns: guard bands around every buffer, and outputs and workspaces before the launch."""


def execute(lib, plan, inputs, misalign=0):
    """Run a plan's launches with the host builds of its kernels (threads = the launch's block;
    every tile, chunk or element, whatever the grid). Buffers sit between guard bands, inputs and
    outputs `misalign` floats off 16-byte alignment (workspaces stay aligned, as allocations are);
    outputs and workspaces start as NaN. Checks that the guard bands and inputs are untouched and
    returns the outputs by name."""
    store = {}
    for b in plan.buffers:
        shift = 0 if b.role == "workspace" else misalign
        base = np.full(b.elements + 2 * GUARD + shift, SENTINEL).view(np.float32)
        view = base[GUARD + shift:GUARD + shift + b.elements]
        if b.role == "input":
            view[:] = np.ravel(inputs[b.name])
        else:
            view.view(np.uint32)[:] = UNWRITTEN
        store[b.name] = (base, view, GUARD + shift)
    before = {n: v.copy() for n, (_, v, _) in store.items() if plan.buffer(n).role == "input"}
    for launch in plan.launches:
        params = [parse_param(p) for p in ALL_SYMBOLS[launch.symbol].params]
        args = [f32_ptr(store[a][1]) if p.pointer else a for p, a in zip(params, launch.args)]
        assert getattr(lib, launch.symbol.replace("capsule_", "host_", 1))(*args, launch.block[0]) in (None, 0)
    for name, (base, view, start) in store.items():
        bits = base.view(np.uint32)
        assert (bits[:start] == SENTINEL).all() and (bits[start + view.size:] == SENTINEL).all(), f"write outside {name}"
        if name in before:
            assert np.array_equal(view.view(np.uint32), before[name].view(np.uint32)), f"input {name} modified"
    return {n: store[n][1].copy() for n in plan.output_shapes}


def with_tile(plan, threads):
    """The plan with every GEMM launch on the other tile shape (any legal block is correct)."""
    launches = tuple(dataclasses.replace(l, block=(threads, 1, 1)) if l.symbol in GEMM_SYMBOLS else l for l in plan.launches)
    return dataclasses.replace(plan, launches=launches)


def cotangent(spec, sample, shape):
    return seeded_rng(spec.name, f"g/{sample.case}").standard_normal(shape).astype(np.float32)


def check_sample(lib, spec, sample, misalign=0, threads=None):
    """Forward and backward plans of one sample on the host against the reference: returns the
    worst error over bound."""
    arrays, p, out_shape = validate(spec, sample.inputs, sample.params, np.float32)
    shapes = shapes_of(arrays)
    forward, backward = PLANS_OF[spec.name]
    fplan, bplan = forward(arrays, p), backward(arrays, p)
    if threads is not None:
        fplan, bplan = with_tile(fplan, threads), with_tile(bplan, threads)
    y = execute(lib, fplan, arrays, misalign)["out"].reshape(out_shape)
    r = REFERENCE.forward(spec, sample.inputs, **sample.params)
    m = REFERENCE.magnitude(spec, sample.inputs, **sample.params)
    result = compare(y, r, m, spec.error, spec.error.length(shapes, p), sample.worst_case)
    assert result.passed, f"{spec.name} forward {sample.summary()}: {result.reason}"
    worst = result.worst
    g = cotangent(spec, sample, out_shape)
    grads = execute(lib, bplan, {**arrays, "g": g}, misalign)
    r = REFERENCE.vjp(spec, sample.inputs, g, **sample.params)
    m = REFERENCE.vjp_magnitude(spec, sample.inputs, g, **sample.params)
    for name in spec.differentiable:
        model = spec.vjp_error_for(name)
        got = grads[f"d{name}"].reshape(np.shape(arrays[name]))
        result = compare(got, r[name], m[name], model, model.length(shapes, p), sample.worst_case)
        assert result.passed, f"{spec.name} d{name} {sample.summary()}: {result.reason}"
        worst = max(worst, result.worst)
    return worst


PLANS_OF = plans.PLANS


def cases(spec, sizes=("small", "medium")):
    out = []
    for size in sizes:
        out += spec.samples(size, seeded_rng(spec.name, size))
    return out + spec.edges()


@pytest.mark.parametrize("misalign", [0, 1])
@pytest.mark.parametrize("op", OPS)
def test_host_plans_meet_the_contract(lib, op, misalign):
    """Every small and medium sample and every edge (empty, one, odd, k = 0, NaN / inf, same-sign
    k = 4096, underflow), with aligned buffers and with buffers off 16-byte alignment."""
    spec = get_spec(op)
    for sample in cases(spec):
        if sample.worst_case:
            check_sample(lib, spec, sample, misalign)
    worst = max(check_sample(lib, spec, sample, misalign) for sample in cases(spec) if not sample.worst_case)
    # The samples' probabilistic bounds leave room: a kernel that barely passes is a bug in waiting.
    assert worst <= 0.5, f"{op}: an error uses {worst:.2f} of its bound"


@pytest.mark.parametrize("threads", sorted(THREADS))
@pytest.mark.parametrize("op", ("matmul", "linear"))
def test_host_plans_on_either_tile_shape(lib, op, threads):
    spec = get_spec(op)
    for sample in cases(spec):
        check_sample(lib, spec, sample, threads=threads)


def test_host_mse_loss_on_the_large_sample(lib):
    """1024 × 4099 elements: 513 chunks, then the partial sums (the only large sample cheap enough
    for the host)."""
    spec = get_spec("mse_loss")
    (sample,) = spec.samples("large", seeded_rng("mse_loss", "large"))
    arrays, p, _ = validate(spec, sample.inputs, sample.params, np.float32)
    assert len(plans.mse_forward(arrays, p).launches) == 2
    check_sample(lib, spec, sample)


# -- the SGEMM core exactly ---------------------------------------------------------------------------

GEMM_CASES = [(1, 1, 1, 1), (1, 130, 17, 129), (2, 65, 9, 63), (3, 5, 0, 7), (2, 33, 40, 4), (1, 128, 16, 128),
              (1, 64, 8, 64), (2, 1, 129, 3), (1, 200, 3, 1)]


def rng_matrix(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("threads", sorted(THREADS))
@pytest.mark.parametrize("batch, m, k, n", GEMM_CASES)
def test_gemm_tiles_reproduce_the_sequential_fma_chain(lib, batch, m, k, n, threads):
    """Every output of every matmul entry point (each transposition of the core) equals the plain
    FMA chain over p = 0 … k−1: tiling, zero padding at the edges, double buffering and the
    per-thread micro-tiles move values but never change a rounding."""
    rng = seeded_rng("matmul", f"chain/{batch}/{m}/{k}/{n}")
    a, b, g = rng_matrix(rng, batch, m, k), rng_matrix(rng, batch, k, n), rng_matrix(rng, batch, m, n)
    ptr = f32_ptr

    def naive(at, bt, x, y, mm, nn, kk):
        out = np.empty((batch, mm, nn), np.float32)
        lib.host_gemm_naive(at, bt, ptr(np.ascontiguousarray(x)), ptr(np.ascontiguousarray(y)), ptr(out), batch, mm, nn, kk)
        return out

    for symbol, x, y, shape, expected in [
        ("capsule_matmul_fwd", a, b, (batch, m, n), naive(0, 0, a, b, m, n, k)),
        ("capsule_matmul_bwd_a", g, b, (batch, m, k), naive(0, 1, g, b, m, k, n)),
        ("capsule_matmul_bwd_b", a, g, (batch, k, n), naive(1, 0, a, g, k, n, m)),
    ]:
        out = np.full(shape, np.nan, np.float32)
        assert getattr(lib, symbol.replace("capsule_", "host_"))(ptr(x), ptr(y), ptr(out), batch, m, k, n, threads) == 0
        assert np.array_equal(out, expected), f"{symbol} ({batch}, {m}, {k}, {n}) on {threads} threads"
    if batch == 1:
        w, bias = rng_matrix(rng, n, k), rng_matrix(rng, n)
        y = np.full((m, n), np.nan, np.float32)
        assert lib.host_linear_fwd(ptr(a[0]), ptr(w), ptr(bias), ptr(y), m, k, n, threads) == 0
        assert np.array_equal(y, naive(0, 1, a[0], w, m, n, k)[0] + bias)


def test_gemm_refuses_other_block_sizes(lib):
    """The device traps on a block that names no tile; the host build says so."""
    a = np.ones((4, 4), np.float32)
    out = np.empty((4, 4), np.float32)
    assert lib.host_matmul_fwd(f32_ptr(a), f32_ptr(a), f32_ptr(out), 1, 4, 4, 4, 64) == -1


@pytest.mark.parametrize("tiles_m, tiles_n", [(1, 1), (1, 9), (9, 1), (8, 8), (17, 5), (23, 31), (8, 1), (16, 3)])
def test_tile_order_is_a_bijection(lib, tiles_m, tiles_n):
    batch = 3
    seen = set()
    out = (ctypes.c_int64 * 3)()
    for t in range(batch * tiles_m * tiles_n):
        lib.host_tile_coords(t, tiles_m, tiles_n, out)
        bt, tm, tn = out
        assert 0 <= bt < batch and 0 <= tm < tiles_m and 0 <= tn < tiles_n
        seen.add((bt, tm, tn))
        if t % (tiles_m * tiles_n) < 8 * tiles_n:
            assert tm < 8, "the first group sweeps 8 tile rows"
    assert len(seen) == batch * tiles_m * tiles_n


@pytest.mark.parametrize("shape", [plans.BIG, plans.SMALL])
def test_thread_micro_tiles_partition_the_block_tile(lib, shape):
    bm, bn, threads = shape
    tm, tn = 8, (8 if shape == plans.BIG else 4)
    assert tm * tn * threads == bm * bn
    owner = np.full((bm, bn), -1)
    rows, cols = (ctypes.c_int * 8)(), (ctypes.c_int * 8)()
    for tid in range(threads):
        lib.host_thread_layout(int(shape == plans.BIG), tid, rows, cols)
        for r in rows[:tm]:
            for c in cols[:tn]:
                assert owner[r, c] == -1, f"output ({r}, {c}) has two threads"
                owner[r, c] = tid
        assert all(c % 4 == 0 for c in cols[:tn:4]) and all(r % 4 == 0 for r in rows[:tm:4]), "16-byte fragments"
    assert (owner >= 0).all()


# -- the reductions ------------------------------------------------------------------------------------


def test_mse_term_is_exact_in_double(lib):
    """(pred − target)² accumulates in double: the float difference is exact there, and squares of
    the largest floats do not overflow."""
    assert lib.host_mse_accumulate(1.0, 3.0, -1.5) == 1.0 + 4.5 * 4.5
    big = 2.0 * float(np.float32(3e38))
    assert lib.host_mse_accumulate(0.0, 3e38, -3e38) == big * big
    assert np.isnan(lib.host_mse_accumulate(0.0, np.inf, np.inf))
    assert lib.host_mse_accumulate(0.0, np.float32(1e-45), 0.0) == float(np.float32(1e-45)) ** 2


def run_mse_forward(lib, pred, target, chunk, threads=256):
    n = pred.size
    chunks = -(-n // chunk)
    partials = np.full(2 * chunks, np.nan, np.float32)
    y = np.full(1, np.nan, np.float32)
    lib.host_mse_loss_fwd(f32_ptr(pred), f32_ptr(target), f32_ptr(partials), f32_ptr(y), n, chunk, 0, threads)
    if chunks > 1:
        assert np.isnan(y[0])
        lib.host_mse_loss_fwd(f32_ptr(pred), f32_ptr(target), f32_ptr(partials), f32_ptr(y), n, chunk, 1, threads)
    return y[0]


@pytest.mark.parametrize("chunk", [1, 3, 4, 8, 1024, 8192])
@pytest.mark.parametrize("threads", [32, 256, 1024])
def test_mse_forward_for_any_chunking(lib, chunk, threads):
    spec = get_spec("mse_loss")
    for sample in cases(spec):
        pred = np.ascontiguousarray(sample.inputs["pred"], np.float32).ravel()
        target = np.ascontiguousarray(sample.inputs["target"], np.float32).ravel()
        y = run_mse_forward(lib, pred, target, chunk, threads)
        r = REFERENCE.forward(spec, sample.inputs)
        m = REFERENCE.magnitude(spec, sample.inputs)
        assert compare(np.float32(y), r, m, spec.error, pred.size, True).passed, sample.summary()


def test_mse_backward_is_the_spec_formula_bitwise(lib):
    """dpred = (pred − target)·(g·fl(2/n)) with every rounding in float32, as the reference."""
    rng = seeded_rng("mse_loss", "bits")
    for n in (1, 7, 1000, 4099):
        pred, target = rng_matrix(rng, n), rng_matrix(rng, n)
        g = np.float32([rng.standard_normal()])
        dpred, dtarget = np.empty(n, np.float32), np.empty(n, np.float32)
        lib.host_mse_loss_bwd(f32_ptr(pred), f32_ptr(target), f32_ptr(g), f32_ptr(dpred), f32_ptr(dtarget), n, 256)
        expected = (pred - target) * (g[0] * np.float32(2.0 / n))
        assert np.array_equal(dpred.view(np.uint32), expected.view(np.uint32))
        assert np.array_equal(dtarget.view(np.uint32), (-expected).view(np.uint32))


@pytest.mark.parametrize("rows, cols", [(0, 5), (1, 1), (5000, 70), (100_000, 3), (300, 1024), (70_000, 33)])
def test_column_sums_through_the_plan(lib, rows, cols):
    """linear's db in one pass or two (row chunks, then the chunks), against a float64 sum."""
    rng = seeded_rng("linear", f"columns/{rows}/{cols}")
    g = rng_matrix(rng, rows, cols)
    launches, workspace = plans.column_sum_launches("g", "db", rows, cols, "ws")
    assert len(launches) == (2 if workspace else 1)
    if rows >= 5000:
        blocks, chunk = launches[0].grid[0], launches[0].args[4]
        assert len(launches) == 2 and (blocks >= plans.TARGET_BLOCKS // 2 or chunk < 2 * plans.MIN_CHUNK_ROWS)
    buffers = {"g": g.ravel(), "db": np.full(cols, np.nan, np.float32), "ws": np.full(max(workspace, 1), np.nan, np.float32)}
    for launch in launches:
        source, target, r, c, chunk = launch.args
        lib.host_linear_bwd_b(f32_ptr(buffers[source]), f32_ptr(buffers[target]), r, c, chunk, launch.block[0])
    exact = g.astype(np.float64).sum(axis=0)
    bound = (1 + rows / (1 - rows * 2.0**-24)) * 2.0**-24 * np.abs(g.astype(np.float64)).sum(axis=0) + 1e-37
    assert (np.abs(buffers["db"] - exact) <= bound).all()


# -- launch plans --------------------------------------------------------------------------------------


def all_samples(spec):
    return cases(spec, ("small", "medium", "large"))


@pytest.mark.parametrize("op", OPS)
def test_plans_are_legal_for_every_sample(op):
    spec = get_spec(op)
    capsule = registry.lookup(op)
    forward_plan, backward_plan = plan_functions(capsule)
    assert PLANS_OF[op] == (forward_plan, backward_plan)
    syms = {r.symbol: r for r in capsule.symbols}
    for sample in all_samples(spec):
        arrays, p, out_shape = validate(spec, sample.inputs, sample.params, np.float32)
        fwd, bwd = forward_plan(arrays, p), backward_plan(arrays, p)
        for arch in ARCHS:
            for plan in (fwd, bwd):
                assert plan_problems(plan, syms, arch) == [], f"{op} {plan.direction} {sample.summary()}"
        assert dict(fwd.output_shapes) == {"out": out_shape}
        assert dict(bwd.output_shapes) == {f"d{k}": np.shape(v) for k, v in arrays.items() if k in spec.differentiable}
        assert {b.name for b in fwd.buffers if b.role == "input"} == {t.name for t in spec.inputs}
        for plan in (fwd, bwd):
            for launch in plan.launches:
                if launch.symbol in GEMM_SYMBOLS:
                    assert launch.block[0] in THREADS and launch.block[1:] == (1, 1)
                else:
                    assert launch.block[0] % 32 == 0, "the reductions' warp shuffles need whole warps"


LARGE_LAUNCHES = {
    # (op, sample index): [(symbol, grid blocks, threads)] of the forward, then the backward plan.
    ("matmul", 0): [("capsule_matmul_fwd", 256, 128), ("capsule_matmul_bwd_a", 256, 128), ("capsule_matmul_bwd_b", 256, 128)],
    ("matmul", 1): [("capsule_matmul_fwd", 128, 128), ("capsule_matmul_bwd_a", 288, 128), ("capsule_matmul_bwd_b", 144, 128)],
    ("linear", 0): [("capsule_linear_fwd", 128, 256), ("capsule_linear_bwd_x", 128, 256), ("capsule_linear_bwd_w", 256, 128),
                    ("capsule_linear_bwd_b", 256, 256), ("capsule_linear_bwd_b", 32, 256)],
    ("mse_loss", 0): [("capsule_mse_loss_fwd", 513, 256), ("capsule_mse_loss_fwd", 1, 256), ("capsule_mse_loss_bwd", 4099, 256)],
}


@pytest.mark.parametrize("key", sorted(LARGE_LAUNCHES))
def test_large_sample_launch_configurations(key):
    """The launch shapes the report states for the large samples (1024³ matmul: 256 blocks of
    64×64 tiles, two per multiprocessor, rather than 64 blocks of 128×128 leaving half idle)."""
    op, index = key
    spec = get_spec(op)
    sample = spec.samples("large", seeded_rng(op, "large"))[index]
    arrays, p, _ = validate(spec, sample.inputs, sample.params, np.float32)
    forward, backward = PLANS_OF[op]
    launches = forward(arrays, p).launches + backward(arrays, p).launches
    assert [(l.symbol, l.grid[0], l.block[0]) for l in launches] == LARGE_LAUNCHES[key]


def test_planted_launch_faults_are_caught():
    spec = get_spec("matmul")
    arrays, p, _ = validate(spec, {"a": np.zeros((5, 7), np.float32), "b": np.zeros((7, 3), np.float32)}, {}, np.float32)
    plan = PLANS_OF["matmul"][1](arrays, p)
    syms = symbols("matmul")
    launch = plan.launches[0]

    def problems(**changes):
        return plan_problems(dataclasses.replace(plan, launches=(dataclasses.replace(launch, **changes),)), syms)

    assert plan_problems(plan, syms) == []
    assert any("2048 threads" in m for m in problems(block=(2048, 1, 1)))
    assert any("6 arguments for 7" in m for m in problems(args=launch.args[:-1]))
    assert any("writable" in m for m in problems(args=("g", "b", "a", *launch.args[3:])))
    assert any("needs a buffer" in m for m in problems(args=(5, *launch.args[1:])))
    assert any("not declared" in m for m in problems(symbol="capsule_linear_bwd_x"))
    mse = get_spec("mse_loss")
    arrays, p, _ = validate(mse, {"pred": np.zeros(100_000, np.float32), "target": np.zeros(100_000, np.float32)}, {}, np.float32)
    fwd = PLANS_OF["mse_loss"][0](arrays, p)
    stage = fwd.launches[1]
    bad = dataclasses.replace(fwd, launches=(fwd.launches[0], dataclasses.replace(stage, args=stage.args[:-1] + (2**40,))))
    assert any("does not fit int32_t" in m for m in plan_problems(bad, symbols("mse_loss")))
