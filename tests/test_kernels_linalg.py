"""cuda/linalg.cu without a GPU: it compiles cleanly for sm_80 and sm_90 with the registry's entry
points and without spills; the kernels themselves, run on the CPU emulator as the launch plans
launch them, meet each op's contract against the float64 reference with aligned and misaligned
buffers, on either tile shape, any split of k and any chunking; the SGEMM tiles reproduce the
plain sequential FMA chain of every output exactly, and split-K the chains of its k ranges added
in split order; the GEMV path gives the same bits for any grid and either load path; the
per-thread index arithmetic of cuda/linalg.cuh (compiled for the host) partitions the tiles; the
plans are legal for every sample, and give the skinny shapes of the review enough blocks."""

import ctypes
import re

import family_checks as fc
import numpy as np
import pytest
from hostmath import declare, f32_ptr, load
from kernel_emu import emulator

from capsule_core.kernels.launch import STATIC_SHARED_LIMIT, Buffer, LaunchPlan
from capsule_core.kernels.nvcc import ARCHES, cuda_source_dir
from capsule_core.kernels.plans import linalg as plans
from capsule_core.ops import get_spec
from capsule_core.ops.base import seeded_rng, validate
from capsule_core.verify.numerics import compare

FAMILY = "linalg"
OPS = ("matmul", "linear", "mse_loss")
SOURCE = cuda_source_dir() / "linalg.cu"
ALL_SYMBOLS = fc.symbols(*OPS)
GEMM_SYMBOLS = plans.GEMM_SYMBOLS
THREADS = {plans.BIG[2]: plans.BIG, plans.SMALL[2]: plans.SMALL}


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def force_gemm(monkeypatch, threads: int, splits: int = 1):
    """Every GEMM planned on the tile shape of `threads` with at most `splits` k ranges (fewer where
    k has fewer split steps), and linear's forward through the GEMM rather than the GEMV."""

    def config(batch, m, n, k):
        steps = -(-k // plans.SPLIT_STEP)
        s = max(1, min(splits, steps))
        return THREADS[threads], (-(-steps // -(-steps // s)) if s > 1 else 1)

    monkeypatch.setattr(plans, "gemm_config", config)
    monkeypatch.setattr(plans, "GEMV_ROWS", 0)


# -- the build --------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHES)
def test_gemms_take_three_stages_of_shared_memory(arch):
    """The GEMMs' shared memory: three stages of 16 KiB, the static limit (two blocks of 256
    threads, or four of 128, per multiprocessor)."""
    for name in GEMM_SYMBOLS:
        smem = fc.compiled(FAMILY)[arch].resources[name].shared_bytes
        assert smem == 3 * 16 * (128 + 128) * 4 <= STATIC_SHARED_LIMIT, f"{name}: {smem} bytes of shared memory"


K_CONTIGUOUS = {
    "capsule_matmul_fwd": (True, False),
    "capsule_matmul_bwd_a": (True, True),
    "capsule_matmul_bwd_b": (False, False),
    "capsule_linear_fwd": (True, True),
    "capsule_linear_bwd_x": (True, False),
    "capsule_linear_bwd_w": (False, False),
}
"""Whether each GEMM's A and B are k-contiguous (copied element by element, transposed)."""


@pytest.mark.parametrize("arch", ARCHES)
def test_the_gemm_core_is_vectorised(arch):
    """The FMA inner loop reads 16-byte shared fragments; the k-tiles reach shared memory by
    cp.async only (16-byte copies for operands that are not k-contiguous, 4-byte ones to transpose
    or where 16 bytes are illegal), with a wait one group short of the newest."""
    ptx = fc.compiled(FAMILY)[arch].ptx
    for name in GEMM_SYMBOLS:
        body = re.search(rf"\.entry {name}\(.*?\n}}\n", ptx, re.DOTALL)[0]
        # BigTile: 16 k-steps of 8×8 FMAs, SmallTile 16 of 8×4; each copy site (two before the
        # loop, one in it) per tile shape: 2 16-byte copies or 8 4-byte ones per operand.
        assert body.count("fma.rn.f32") == 16 * 64 + 16 * 32, name
        assert body.count("ld.shared.v4.f32") == 16 * 4 + 16 * 3, name
        assert body.count("cp.async.cg.shared.global") == 12 * K_CONTIGUOUS[name].count(False), name
        assert body.count("cp.async.ca.shared.global") == 96 and body.count("cp.async.wait_group 1;") == 2, name
        assert "ld.global.nc.v4.f32" not in body and body.count("st.global.cg.v4.f32") == 16 + 8, name
        assert not re.search(r"^\s*(@\S+\s+)?(atom|red)\.", body, re.MULTILINE), f"{name} uses atomics"
    # The GEMVs: per 16-byte chunk of k, one 16-byte load per column and per row of x, rows × cols × 4
    # FMAs, then butterflies.
    for rows, cols, _, name in plans.GEMV_TILES:
        body = re.search(rf"\.entry {name}\(.*?\n}}\n", ptx, re.DOTALL)[0]
        assert body.count("ld.global.nc.v4.f32") == cols + rows, name
        assert body.count("fma.rn.f32") >= rows * cols * 4 and "shfl.sync.bfly" in body, name
    for name in plans.KSUM_SYMBOLS + plans.GEMV_SYMBOLS:
        body = re.search(rf"\.entry {name}\(.*?\n}}\n", ptx, re.DOTALL)[0]
        assert not re.search(r"^\s*(@\S+\s+)?(atom|red)\.", body, re.MULTILINE), f"{name} uses atomics"
        if name in plans.KSUM_SYMBOLS:
            assert "ld.global.nc.v4.f32" in body and "st.global.cg.v4.f32" in body, name


def test_the_reductions_use_no_atomics():
    assert not re.search(r"\batomic\w*\(", SOURCE.read_text()), "atomics"


# -- the kernels on the CPU emulator, driven by the launch plans ---------------------------------------


@pytest.fixture(scope="module")
def emu():
    """linalg.cu on the emu backend, grids capped at 4 blocks: each block walks several tiles or chunks."""
    return emulator((4, 1))


@pytest.fixture(scope="module")
def lib(host_build_dir):
    """cuda/linalg.cuh's tile and thread arithmetic and its mse term, and the plain FMA chain,
    built for the host."""
    return declare(
        load("linalg_host", host_build_dir),
        {
            "host_gemm_naive": [ctypes.c_int, ctypes.c_int]
            + [ctypes.POINTER(ctypes.c_float)] * 3
            + [ctypes.c_int64] * 4,
            "host_tile_coords": [ctypes.c_int64] * 3 + [ctypes.POINTER(ctypes.c_int64)],
            "host_thread_layout": [
                ctypes.c_int,
                ctypes.c_int,
                ctypes.POINTER(ctypes.c_int),
                ctypes.POINTER(ctypes.c_int),
            ],
            "host_mse_accumulate": (ctypes.c_double, [ctypes.c_double, ctypes.c_float, ctypes.c_float]),
        },
    )


def check_sample(emu, spec, sample, misalign=0):
    """Forward and backward plans of one sample on the emulator against the reference, inputs and
    outputs `misalign` floats off 16-byte alignment (workspaces stay aligned: they are allocations,
    never views): returns the worst error over its bound."""
    run = fc.emulate(emu, spec.name, sample, lambda b: misalign * (b.role != "workspace"))
    result = fc.compared(spec.name, sample, run.y, run.grads, run.g)
    assert result.problems == []
    return result.worst


@pytest.mark.parametrize("misalign", [0, 1])
@pytest.mark.parametrize("op", OPS)
def test_kernels_meet_the_contract(emu, op, misalign):
    """Every small and medium sample and every edge (empty, one, odd, k = 0, NaN / inf, same-sign
    k = 4096, underflow), with aligned buffers (the 16-byte paths) and with buffers off 16-byte
    alignment (the scalar ones)."""
    spec = get_spec(op)
    samples = fc.cases(op, ("small", "medium"))
    worst = [check_sample(emu, spec, sample, misalign) for sample in samples]
    typical = max(w for w, sample in zip(worst, samples) if not sample.worst_case)
    # The samples' probabilistic bounds leave room: a kernel that barely passes is a bug in waiting.
    assert typical <= 0.5, f"{op}: an error uses {typical:.2f} of its bound"


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("threads", sorted(THREADS))
@pytest.mark.parametrize("op", ("matmul", "linear"))
def test_kernels_on_either_tile_shape(emu, op, threads, splits, monkeypatch):
    """Either tile shape, whole or split k, is correct for any problem: the plans forced onto one."""
    force_gemm(monkeypatch, threads, splits)
    spec = get_spec(op)
    for sample in fc.cases(op, ("small", "medium")):
        check_sample(emu, spec, sample)


def test_mse_loss_on_the_large_sample(emu):
    """1024 × 4099 elements: 513 chunks, then the partial sums."""
    spec = get_spec("mse_loss")
    (sample,) = spec.samples("large", seeded_rng("mse_loss", "large"))
    arrays, p, _ = validate(spec, sample.inputs, sample.params, np.float32)
    assert len(plans.mse_forward(arrays, p).launches) == 2
    check_sample(emu, spec, sample)


# -- the SGEMM core exactly ---------------------------------------------------------------------------

GEMM_CASES = [
    (1, 1, 1, 1),
    (1, 130, 17, 129),
    (2, 65, 9, 63),
    (3, 5, 0, 7),
    (2, 33, 40, 4),
    (1, 128, 16, 128),
    (1, 64, 8, 64),
    (2, 1, 129, 3),
    (1, 200, 3, 1),
    (1, 31, 100, 67),
]
"""(batch, m, k, n): edges of both tile shapes, k = 0, one k-tile, a tail k-tile, and k-tiles that go
round the ring of stages twice (k = 100: seven, the last four elements long)."""


def rng_matrix(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("splits", [1, 2, 3])
@pytest.mark.parametrize("threads", sorted(THREADS))
@pytest.mark.parametrize("batch, m, k, n", GEMM_CASES)
def test_gemm_tiles_reproduce_the_sequential_fma_chain(lib, emu, batch, m, k, n, threads, splits, monkeypatch):
    """Every output of every GEMM entry point (each transposition of the core) equals the plain
    FMA chain over p = 0 … k−1: tiling, zero padding at the edges, the ring of stages the copies
    run ahead in and the per-thread micro-tiles move values but never change a rounding. Split into
    S ranges of whole split steps (⌈steps / S⌉ each), it is the chains of the ranges added in range order (the bias
    last)."""
    force_gemm(monkeypatch, threads, splits)
    rng = seeded_rng("matmul", f"chain/{batch}/{m}/{k}/{n}")
    a, b, g = rng_matrix(rng, batch, m, k), rng_matrix(rng, batch, k, n), rng_matrix(rng, batch, m, n)

    def chain(at, bt, x, y, mm, nn, kk):
        out = np.empty((len(x), mm, nn), np.float32)
        lib.host_gemm_naive(
            at, bt, f32_ptr(np.ascontiguousarray(x)), f32_ptr(np.ascontiguousarray(y)), f32_ptr(out), len(x), mm, nn, kk
        )
        return out

    def naive(at, bt, x, y, mm, nn, kk):
        """The chains of the split ranges of k, added in order."""
        _, s = plans.gemm_config(len(x), mm, nn, kk)
        per = max(1, ceil_div(ceil_div(kk, plans.SPLIT_STEP), s) * plans.SPLIT_STEP)
        total = None
        for k0 in range(0, max(kk, 1), per):
            k1 = min(kk, k0 + per)
            xs = x[:, k0:k1, :] if at else x[:, :, k0:k1]
            ys = y[:, :, k0:k1] if bt else y[:, k0:k1, :]
            part = chain(at, bt, xs, ys, mm, nn, k1 - k0)
            total = part if total is None else total + part
        return total

    inputs = {"a": a, "b": b}
    y = emu.run(plans.matmul_forward(inputs, {}), inputs)["out"]
    grads = emu.run(plans.matmul_backward(inputs, {}), {**inputs, "g": g})
    for name, got, expected in [
        ("capsule_matmul_fwd", y, naive(0, 0, a, b, m, n, k)),
        ("capsule_matmul_bwd_a", grads["da"], naive(0, 1, g, b, m, k, n)),
        ("capsule_matmul_bwd_b", grads["db"], naive(1, 0, a, g, k, n, m)),
    ]:
        assert fc.same_bits(got, expected), f"{name} ({batch}, {m}, {k}, {n}) on {threads} threads"
    if batch == 1:
        inputs = {"x": a[0], "w": rng_matrix(rng, n, k), "b": rng_matrix(rng, n)}
        y = emu.run(plans.linear_forward(inputs, {}), inputs)["out"]
        assert fc.same_bits(y, naive(0, 1, a[:1], inputs["w"][None], m, n, k)[0] + inputs["b"])


def test_gemm_traps_on_a_block_that_names_no_tile(emu):
    """The block size names the tile; any other is a plan error, and the kernel traps rather than
    leave the product unwritten. Likewise a split count below one."""
    inputs = {"a": np.ones((4, 4), np.float32), "b": np.ones((4, 4), np.float32)}
    plan = fc.with_launch(plans.matmul_forward(inputs, {}), block=(64, 1, 1))
    with pytest.raises(AssertionError, match=r"capsule_matmul_fwd block \(0,0,0\) thread \(0,0,0\): __trap\(\)"):
        emu.run(plan, inputs)
    plan = plans.matmul_forward(inputs, {})
    plan = fc.with_launch(plan, args=plan.launches[0].args[:-1] + (0,))
    with pytest.raises(AssertionError, match=r"capsule_matmul_fwd block \(0,0,0\) thread \(0,0,0\): __trap\(\)"):
        emu.run(plan, inputs)


# -- split-K and the GEMV --------------------------------------------------------------------------------


def linear_inputs(rng, rows, width, out):
    return {"x": rng_matrix(rng, rows, width), "w": rng_matrix(rng, out, width), "b": rng_matrix(rng, out)}


GEMV_CASES = [
    (1, 1, 1),
    (1, 4096, 3),
    (3, 4099, 5),
    (8, 1024, 64),
    (9, 300, 7),
    (16, 513, 9),
    (16, 260, 33),
    (5, 0, 6),
    (0, 8, 4),
    (2, 8, 0),
    (7, 131, 1),
]
"""(rows, in, out): one element, long k with a tail column group, k not a multiple of 4, each tile's
fewest and most rows, k = 0 (the bias), no rows, no columns."""


@pytest.mark.parametrize("rows, width, out", GEMV_CASES)
def test_gemv_meets_the_contract_for_any_layout(emu, rows, width, out):
    """linear's forward for few rows is the GEMV; it meets linear's error model aligned and
    misaligned (the element-by-element path), and gives the same bits on both paths where k is a
    multiple of 4 (the same FMAs in the same order), and on any grid."""
    rng = seeded_rng("linear", f"gemv/{rows}/{width}/{out}")
    inputs = linear_inputs(rng, rows, width, out)
    plan = plans.linear_forward(inputs, {})
    assert [launch.symbol for launch in plan.launches] == [plans.gemv_tile(rows)[3]]
    x64, w64 = inputs["x"].astype(np.float64), inputs["w"].astype(np.float64)
    reference = x64 @ w64.T + inputs["b"]
    magnitude = np.abs(x64) @ np.abs(w64).T + np.abs(inputs["b"].astype(np.float64))
    results = {}
    for misalign in (0, 1):
        y = emu.run(plan, inputs, lambda b, shift=misalign: shift)["out"]
        result = compare(y, reference, magnitude, get_spec("linear").error, width + 1, True)
        assert result.passed, result.reason
        results[misalign] = y
    if width % 4 == 0:
        assert fc.same_bits(results[0], results[1])
    one_block = fc.with_launch(plan, grid=(1, 1, 1))
    assert fc.same_bits(emu.run(one_block, inputs)["out"], results[0])


@pytest.mark.parametrize("k_warps", [1, 2, 4, 8])
@pytest.mark.parametrize("threads", [32, 128, 256])
def test_gemv_any_split_of_k_over_warps(emu, k_warps, threads):
    """Any block of whole warps up to 256 threads and any k_warps dividing its warps: correct, and
    slices of k that some warps never reach (k shorter than the sweep)."""
    if (threads // 32) % k_warps:
        pytest.skip("k_warps must divide the warps")
    rng = seeded_rng("linear", f"gemv-warps/{k_warps}/{threads}")
    for rows, width, out in [(4, 1000, 13), (16, 96, 7)]:
        inputs = linear_inputs(rng, rows, width, out)
        plan = plans.linear_forward(inputs, {})
        launch = plan.launches[0]
        plan = fc.with_launch(plan, block=(threads, 1, 1), args=launch.args[:-1] + (k_warps,))
        y = emu.run(plan, inputs)["out"]
        x64, w64 = inputs["x"].astype(np.float64), inputs["w"].astype(np.float64)
        result = compare(
            y,
            x64 @ w64.T + inputs["b"],
            np.abs(x64) @ np.abs(w64).T + np.abs(inputs["b"]),
            get_spec("linear").error,
            width + 1,
            True,
        )
        assert result.passed, result.reason


@pytest.mark.parametrize("tile", plans.GEMV_TILES, ids=lambda t: t[3])
def test_gemv_traps_on_a_plan_error(emu, tile):
    """More rows than the GEMV holds, a block that is not whole warps or over 256 threads, or a
    k_warps that does not divide the warps: the kernel traps rather than leave y unwritten."""
    rows = tile[0]
    rng = seeded_rng("linear", f"gemv-traps/{rows}")
    inputs = linear_inputs(rng, rows, 64, 8)
    plan = plans.linear_forward(inputs, {})
    launch = plan.launches[0]
    assert launch.symbol == tile[3]
    args = launch.args
    for change in [
        {"block": (96 + 1, 1, 1)},
        {"block": (512, 1, 1)},
        {"args": args[:-1] + (3,)},
        {"args": args[:-1] + (0,)},
        {"args": args[:4] + (rows + 1,) + args[5:]},
    ]:
        with pytest.raises(AssertionError, match=r"__trap\(\)"):
            emu.run(fc.with_launch(plan, **change), inputs)


def test_split_sums_in_split_order_on_both_paths(lib, emu):
    """linear's forward split: the partials' sum on its 16-byte and scalar paths (count not a
    multiple of 4, or y misaligned) is bitwise the FMA chains of the k ranges added in split
    order, the bias last."""
    rng = seeded_rng("linear", "ksum")
    for rows, width, out in [(40, 2048, 36), (33, 4000, 5)]:
        inputs = linear_inputs(rng, rows, width, out)
        plan = plans.linear_forward(inputs, {})
        assert [launch.symbol for launch in plan.launches] == ["capsule_linear_fwd", "capsule_linear_fwd_ksum"]
        splits = plan.launches[0].args[-1]
        assert splits > 1 and plan.buffer("partial").elements == splits * rows * out
        per = ceil_div(ceil_div(width, plans.SPLIT_STEP), splits) * plans.SPLIT_STEP
        expected = None
        for k0 in range(0, width, per):
            xs = np.ascontiguousarray(inputs["x"][None, :, k0 : k0 + per])
            ws = np.ascontiguousarray(inputs["w"][None, :, k0 : k0 + per])
            part = np.empty((1, rows, out), np.float32)
            lib.host_gemm_naive(0, 1, f32_ptr(xs), f32_ptr(ws), f32_ptr(part), 1, rows, out, xs.shape[2])
            expected = part[0] if expected is None else expected + part[0]
        expected = expected + inputs["b"]
        for misalign in (0, 1):
            assert fc.same_bits(
                emu.run(plan, inputs, lambda b, shift=misalign: shift * (b.role != "workspace"))["out"], expected
            )


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


MSE_CHUNKINGS = [(1, 32), (3, 256), (4, 1024), (8, 32), (1024, 256), (8192, 1024)]
"""(elements per chunk, threads per block): scalar and vector loads, chunks fewer and more than
the second stage's threads, every block size from one warp to 1024 threads."""
MSE_EMULATED_THREADS = 1 << 16
"""Chunks × threads per block the emulator runs for one case at most (each a fiber switched at
every barrier: microseconds)."""


@pytest.mark.parametrize("chunk, threads", MSE_CHUNKINGS)
def test_mse_forward_for_any_chunking(emu, chunk, threads, monkeypatch):
    monkeypatch.setattr(plans, "mse_chunk", lambda n: chunk)
    monkeypatch.setattr(plans, "MSE_BLOCK", threads)
    spec = get_spec("mse_loss")
    for sample in fc.cases("mse_loss", ("small", "medium")):
        if -(-sample.inputs["pred"].size // chunk) * threads > MSE_EMULATED_THREADS:
            continue
        arrays, p, _ = validate(spec, sample.inputs, sample.params, np.float32)
        y = emu.run(plans.mse_forward(arrays, p), arrays)["out"]
        assert fc.compared("mse_loss", sample, y).problems == []


@pytest.mark.parametrize("misalign", [0, 1])
def test_mse_backward_is_the_spec_formula_bitwise(emu, misalign):
    """dpred = (pred − target)·(g·fl(2/n)) with every rounding in float32, as the reference: on
    the 16-byte path and, buffers misaligned, the scalar one."""
    rng = seeded_rng("mse_loss", "bits")
    for n in (1, 7, 1000, 4099):
        pred, target = rng_matrix(rng, n), rng_matrix(rng, n)
        g = np.float32(rng.standard_normal())
        grads = emu.run(
            plans.mse_backward({"pred": pred}, {}), {"pred": pred, "target": target, "g": g}, lambda b: misalign
        )
        expected = (pred - target) * (g * np.float32(2.0 / n))
        assert fc.same_bits(grads["dpred"], expected) and fc.same_bits(grads["dtarget"], -expected), n


@pytest.mark.parametrize("rows, cols", [(0, 5), (1, 1), (5000, 70), (100_000, 3), (300, 1024), (70_000, 33)])
def test_column_sums_through_the_plan(emu, rows, cols):
    """linear's db in one pass or two (row chunks into the workspace, then the chunks' sums),
    against a float64 sum under linear's error model for db."""
    rng = seeded_rng("linear", f"columns/{rows}/{cols}")
    g = rng_matrix(rng, rows, cols)
    launches, workspace = plans.column_sum_launches("g", "db", rows, cols, "ws")
    assert len(launches) == (2 if workspace else 1)
    if rows >= 5000:
        blocks, chunk = launches[0].grid[0], launches[0].args[4]
        assert len(launches) == 2 and (blocks >= plans.TARGET_BLOCKS // 2 or chunk < 2 * plans.MIN_CHUNK_ROWS)
    buffers = (Buffer("g", "input", "float32", rows * cols), Buffer("db", "output", "float32", cols))
    buffers += (Buffer("ws", "workspace", "float32", workspace),) if workspace else ()
    db = emu.run(LaunchPlan("linear", "backward", buffers, launches, output_shapes={"db": (cols,)}), {"g": g})["db"]
    g64 = g.astype(np.float64)
    result = compare(db, g64.sum(axis=0), np.abs(g64).sum(axis=0), get_spec("linear").vjp_error_for("b"), rows, True)
    assert result.passed, result.reason


# -- launch plans --------------------------------------------------------------------------------------


def _gemm_tiles_and_whole_warps(case):
    for plan in case.plans:
        for launch in plan.launches:
            if launch.symbol in GEMM_SYMBOLS:
                assert launch.block[0] in THREADS and launch.block[1:] == (1, 1)
            else:
                assert launch.block[0] % 32 == 0, "the reductions' warp shuffles need whole warps"


@pytest.mark.parametrize("op", OPS)
def test_plans_are_legal_for_every_sample(op):
    assert fc.plan_case_problems(op, check=_gemm_tiles_and_whole_warps) == []


LARGE_LAUNCHES = {
    # (op, sample index): "kernel grid-blocks×threads" of each launch of the forward plan, then of the
    # backward plan, the kernel named without its "capsule_<op>_".
    ("matmul", 0): (
        "fwd 256×256, fwd_ksum 1024×256",
        "bwd_a 256×256, bwd_ksum 1024×256, bwd_b 256×256, bwd_ksum 1024×256",
    ),
    ("matmul", 1): ("fwd 128×256, fwd_ksum 510×256", "bwd_a 288×128, bwd_b 240×256, bwd_ksum 511×256"),
    ("linear", 0): (
        "fwd 256×256, fwd_ksum 2048×256",
        "bwd_x 256×256, bwd_ksum 2048×256, bwd_w 256×256, bwd_ksum 1024×256, bwd_b 256×256, bwd_b 32×256",
    ),
    ("mse_loss", 0): ("fwd 513×256, fwd 1×256", "bwd 4099×256"),
}


def _launch_shapes(op: str, plan) -> str:
    """A plan's launches as LARGE_LAUNCHES writes them."""
    return ", ".join(
        f"{launch.symbol.removeprefix(f'capsule_{op}_')} {launch.grid[0]}×{launch.block[0]}" for launch in plan.launches
    )


@pytest.mark.parametrize("key", sorted(LARGE_LAUNCHES))
def test_large_sample_launch_configurations(key):
    """The launch shapes the report states for the large samples (1024³ matmul: 64 tiles of
    128×128, k split in 4, 256 blocks, two per multiprocessor, rather than 64 blocks leaving half
    idle; then the partials' sum)."""
    op, index = key
    sample = get_spec(op).samples("large", seeded_rng(op, "large"))[index]
    assert tuple(_launch_shapes(op, plan) for plan in fc.case_plans(op, sample)) == LARGE_LAUNCHES[key]


SKINNY = [
    # (op, inputs, direction): the review's skinny GEMMs (kernel-review.md §3.1 and §4 linalg).
    ("linear", {"x": (8, 4096), "w": (4096, 4096)}, "forward"),
    ("linear", {"x": (1, 4096), "w": (4096, 4096)}, "forward"),
    ("linear", {"x": (16, 4096), "w": (1024, 4096)}, "forward"),
    ("linear", {"x": (64, 4096), "w": (4096, 4096)}, "forward"),
    ("linear", {"x": (65536, 1024), "w": (1024, 1024)}, "backward"),
    ("matmul", {"a": (8, 4096), "b": (4096, 4096)}, "forward"),
    ("matmul", {"a": (4096, 4096), "b": (4096, 4096)}, "forward"),
    ("matmul", {"a": (2, 256, 8192), "b": (2, 8192, 256)}, "forward"),
]


@pytest.mark.parametrize("op, shapes, direction", SKINNY)
def test_skinny_gemms_fill_the_device(op, shapes, direction):
    """Every GEMM or GEMV launch of a skinny problem has at least one block per multiprocessor of
    the H200: split-K, or the GEMV's slices of k, make up for few output tiles."""
    arrays = {name: np.zeros(shape, np.float32) for name, shape in shapes.items()}
    if op == "linear":
        arrays["b"] = np.zeros(shapes["w"][0], np.float32)
    forward, backward = plans.PLANS[op]
    plan = (forward if direction == "forward" else backward)(arrays, {})
    heavy = [launch for launch in plan.launches if launch.symbol in GEMM_SYMBOLS + plans.GEMV_SYMBOLS]
    assert heavy and all(launch.grid[0] >= plans.MULTIPROCESSORS for launch in heavy), [
        (launch.symbol, launch.grid) for launch in heavy
    ]
    if op == "linear" and direction == "forward" and shapes["x"][0] <= plans.GEMV_ROWS:
        assert [launch.symbol for launch in plan.launches] == [plans.gemv_tile(shapes["x"][0])[3]]


def test_planted_launch_faults_are_caught():
    _, plan = fc.launch_plans("matmul", {"a": np.zeros((5, 7), np.float32), "b": np.zeros((7, 3), np.float32)})
    launch = plan.launches[0]
    faults = [
        ("writable", {"args": ("g", "b", "a", *launch.args[3:])}),
        ("needs a buffer", {"args": (5, *launch.args[1:])}),
        ("not declared", {"symbol": "capsule_linear_bwd_x"}),
    ]
    assert fc.missed_launch_faults(plan, fc.symbols("matmul"), faults) == []
    mse = get_spec("mse_loss")
    arrays, p, _ = validate(
        mse, {"pred": np.zeros(100_000, np.float32), "target": np.zeros(100_000, np.float32)}, {}, np.float32
    )
    fwd = plans.PLANS["mse_loss"][0](arrays, p)
    stage = fwd.launches[1]
    assert (
        fc.missed_faults(
            fwd, fc.symbols("mse_loss"), [("does not fit int32_t", {"args": stage.args[:-1] + (2**40,)})], index=1
        )
        == []
    )
