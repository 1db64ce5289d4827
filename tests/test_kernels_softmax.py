"""cuda/softmax.cu without a GPU: the build, the registry's entry points, the launch plans, the
per-element math of cuda/softmax.cuh compiled for the host, and the kernels themselves run on the
CPU emulator, each against the float64 reference under the op's error model."""

import ctypes

import family_checks as fc
import numpy as np
import pytest
from hostmath import f32_ptr, load
from kernel_emu import emulator as family_emulator

from capsule_core.catalog import reference
from capsule_core.kernels.launch import Launch, LaunchPlan
from capsule_core.kernels.plans import softmax as plans
from capsule_core.ops import get_spec
from capsule_core.ops.base import Sample, seeded_rng

FAMILY = "softmax"
OPS = ("log_softmax", "softmax", "hard_masked_softmax")
CODES = {"softmax": 0, "log_softmax": 1, "hard_masked_softmax": 2}
NAN, INF = np.nan, np.inf


@pytest.fixture(scope="module")
def lib(host_build_dir):
    lib = load("softmax_host", host_build_dir)
    p = ctypes.POINTER(ctypes.c_float)
    lib.host_softmax_rows.argtypes = [ctypes.c_int, p, p, p, ctypes.c_int64, ctypes.c_int64]
    lib.host_softmax_grad_rows.argtypes = [ctypes.c_int, p, p, p, ctypes.c_int64, ctypes.c_int64]
    lib.host_softmax_path.argtypes = [ctypes.c_int64, ctypes.c_int64] + [ctypes.POINTER(ctypes.c_int)] * 3
    lib.host_softmax_group_cols.restype = ctypes.c_int64
    lib.host_row_split.argtypes = [ctypes.c_uint64, ctypes.c_int64, ctypes.c_int, ctypes.POINTER(ctypes.c_int64)]
    return lib


@pytest.fixture(scope="module")
def emulator():
    return family_emulator()


# -- build and entry points ---------------------------------------------------------------------


# -- launch plans ------------------------------------------------------------------------------


def _uses_the_kernels_block(case):
    for plan in case.plans:
        for launch in plan.launches:
            assert launch.block == (plans.THREADS, 1, 1), f"{case.sample.case}: {launch}"


@pytest.mark.parametrize("op", OPS)
def test_plans_are_legal_for_every_sample_and_edge(op):
    """plan_case_problems (legal, fitting the registers, the declared outputs), on the kernels' block."""
    assert fc.plan_case_problems(op, check=_uses_the_kernels_block) == []


def test_planted_plan_faults_are_caught():
    x = np.zeros((4, 7), np.float32)
    plan = plans.PLANS["softmax"][0]({"x": x}, {})
    faults = [("writable but buffer x", {"args": ("out", "x", 4, 7)})]
    assert fc.missed_launch_faults(plan, fc.symbols("softmax"), faults) == []


def test_plans_size_the_grid_by_path():
    assert plans.grid(1000, 7, plans.GROUP_COLS) == (-(-1000 // 256), 1, 1)  # 4 groups a warp, 8 rows each
    assert plans.grid(1000, 100, plans.GROUP_COLS) == (-(-1000 // 16), 1, 1)  # a warp per row, 2 at a time
    assert plans.grid(1000, 1000, plans.GROUP_COLS) == (125, 1, 1)  # a warp per row
    assert plans.grid(1000, 4097, plans.GROUP_COLS) == (1000, 1, 1)  # a block per row
    assert plans.grid(10**7, 4097, plans.GROUP_COLS) == (plans.MAX_BLOCKS, 1, 1)
    assert plans.grid(0, 5, plans.GROUP_COLS) == (1, 1, 1)


def _shaped(shape):
    """A float32 input of `shape` that allocates nothing (plans read shapes only)."""
    return np.broadcast_to(np.float32(0), shape)


def _symbols(plan):
    return tuple(launch.symbol[len(f"capsule_{plan.op}_") :] for launch in plan.launches)


@pytest.mark.parametrize(
    "shape, forward, backward",
    [
        ((1000, 100), ("fwd",), ("bwd",)),  # lane groups
        ((1000, 1000), ("fwd",), ("bwd_block",)),  # the backward's groups end at 512
        ((4096, 4096), ("fwd_block",), ("bwd_block",)),  # rows enough to fill the device
        ((600, 65536), ("fwd_block",), ("bwd_block",)),
        ((500, 4095), ("fwd_block",), ("bwd_block",)),  # too short to cut
        ((32, 65536), ("fwd_partials", "fwd_finish"), ("bwd_partials", "bwd_finish")),
        ((1, 4096), ("fwd_partials", "fwd_finish"), ("bwd_partials", "bwd_finish")),
        ((0, 65536), ("fwd_block",), ("bwd_block",)),
    ],
)
def test_plans_pick_the_path_by_shape(shape, forward, backward):
    for op in OPS:
        inputs = {"x": _shaped(shape), "mask": _shaped(shape)}
        fwd, bwd = plans.PLANS[op][0](inputs, {}), plans.PLANS[op][1](inputs, {})
        assert _symbols(fwd) == forward and _symbols(bwd) == backward
        for plan, planes in ((fwd, 2), (bwd, 1)):
            rows, cols = plans.rows_and_cols(shape)
            if len(plan.launches) == 2:
                first, second = plan.launches
                chunk = first.args[-1]
                assert first.grid == second.grid == plans.split_grid(rows, cols, chunk)
                assert first.args[-4:] == ("partials", rows, cols, chunk) and second.args[-3:] == (rows, cols, chunk)
                assert plan.buffer("partials").elements == planes * rows * plans.chunks_of(cols, chunk)
            else:
                assert [b.role for b in plan.buffers].count("workspace") == 0


@pytest.mark.parametrize("rows", [1, 2, 3, 7, 32, 100, 131, 132, 263, 527])
@pytest.mark.parametrize("cols", [4096, 4097, 8191, 65536, 100_003, 10**6])
def test_split_rows_fill_the_device_with_whole_chunks(rows, cols):
    """Few long rows: chunks of whole float4 runs per thread (multiples of CHUNK_QUANTUM, at least
    MIN_CHUNK), about one wave of the lean kernels, and never fewer blocks than a block per row."""
    chunk = plans.split_chunk(rows, cols)
    assert chunk and chunk % plans.CHUNK_QUANTUM == 0 and chunk >= plans.MIN_CHUNK
    chunks = plans.chunks_of(cols, chunk)
    assert 2 <= chunks and (chunks - 1) * chunk < cols <= chunks * chunk
    blocks = rows * chunks
    assert blocks >= min(plans.TARGET_BLOCKS, rows * (cols // plans.MIN_CHUNK)) // 2
    assert blocks <= max(plans.TARGET_BLOCKS, rows * 2) + rows


def test_split_reference_shape_fills_an_h200():
    """softmax x(32, 65536), issue 15's reference: 1024 chunks of 2048, a block each, both launches."""
    assert plans.split_chunk(32, 65536) == 2048 and plans.split_grid(32, 65536, 2048) == (1024, 1, 1)
    assert plans.split_chunk(plans.SPLIT_ROWS, 65536) == 0 and plans.split_chunk(32, plans.SPLIT_MIN_COLS - 1) == 0


def test_lean_kernels_have_a_budget_of_32_registers():
    for op in OPS:
        for direction in ("fwd", "bwd"):
            assert plans.BUDGET.registers_for(f"capsule_{op}_{direction}") == 64
            for variant in ("block", "partials", "finish"):
                assert plans.BUDGET.registers_for(f"capsule_{op}_{direction}_{variant}") == 32


def test_python_mirror_of_the_path_choice_matches_the_header(lib):
    assert lib.host_softmax_threads() == plans.THREADS
    assert (
        lib.host_softmax_group_cols(0) == plans.GROUP_COLS and lib.host_softmax_group_cols(1) == plans.GRAD_GROUP_COLS
    )
    lanes, values, batch = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    for cols in list(range(1, 70)) + [127, 128, 129, 255, 256, 257, 511, 512, 513, 1000, 1023, 1024, 1025, 4097]:
        for group_cols in (plans.GROUP_COLS, plans.GRAD_GROUP_COLS):
            lib.host_softmax_path(cols, group_cols, ctypes.byref(lanes), ctypes.byref(values), ctypes.byref(batch))
            if cols > group_cols:
                assert (lanes.value, values.value, batch.value) == (0, 0, 0)
            else:
                assert (lanes.value, values.value, batch.value) == (
                    plans.lanes(cols),
                    plans.values(cols),
                    plans.batch(cols),
                )
                assert lanes.value * values.value >= cols and (
                    values.value == 1 or lanes.value * values.value < 2 * cols
                )


def test_row_split_covers_the_row_with_aligned_vectors(lib):
    out = (ctypes.c_int64 * 2)()
    for addr in range(4096, 4096 + 32, 4):
        for length in (0, 1, 2, 3, 4, 5, 7, 8, 13, 100):
            lib.host_row_split(addr, length, 1, out)
            head, body4 = out[0], out[1]
            assert 0 <= head <= min(3, length) and 0 <= length - head - 4 * body4 < 4
            if head < length:
                assert (addr + 4 * head) % 16 == 0
            lib.host_row_split(addr, length, 0, out)
            assert (out[0], out[1]) == (length, 0)
    lib.host_row_split(4098, 10, 1, out)
    assert (out[0], out[1]) == (10, 0)


# -- per-element math on the host ----------------------------------------------------------------


def _host_forward(lib, op, x, mask=None):
    x = np.ascontiguousarray(x, np.float32)
    rows, cols = plans.rows_and_cols(x.shape)
    m = np.ascontiguousarray(mask if mask is not None else np.ones_like(x), np.float32)
    y = np.empty_like(x)
    lib.host_softmax_rows(CODES[op], f32_ptr(x), f32_ptr(m), f32_ptr(y), rows, cols)
    return y


def _host_backward(lib, op, y, g):
    y, g = np.ascontiguousarray(y, np.float32), np.ascontiguousarray(g, np.float32)
    rows, cols = plans.rows_and_cols(y.shape)
    dx = np.empty_like(y)
    lib.host_softmax_grad_rows(CODES[op], f32_ptr(y), f32_ptr(g), f32_ptr(dx), rows, cols)
    return dx


@pytest.mark.parametrize("op", OPS)
def test_host_math_matches_the_reference_forward_and_backward(lib, op):
    def forward(arrays, _):
        return _host_forward(lib, op, arrays["x"], arrays.get("mask"))

    for sample in fc.cases(op, ("small", "medium")):
        fc.check_host_model(
            op, sample, forward, lambda arrays, p, g: {"x": _host_backward(lib, op, forward(arrays, p), g)}
        )


def test_host_masked_rule_blocked_entries_are_exact_zeros_and_never_read(lib):
    x = np.float32([[NAN, 1.0, INF, 2.0], [NAN, NAN, INF, -INF], [-INF, -INF, 5.0, 1.0], [1.0, NAN, 2.0, 3.0]])
    mask = np.float32([[0, 1, 0, 1], [0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 0, 1]])
    y = _host_forward(lib, "hard_masked_softmax", x, mask)
    r = reference.forward("hard_masked_softmax", {"x": x, "mask": mask})
    e = np.exp(np.float32([1.0, 2.0]) - np.float32(2.0))
    assert y[0, 0] == 0 and y[0, 2] == 0 and np.allclose(y[0, [1, 3]], e / e.sum(), rtol=1e-6)
    assert np.array_equal(y[1], np.zeros(4)) and np.array_equal(y[2], np.zeros(4))  # nothing allowed, all -inf allowed
    assert np.isnan(y[3]).all() and np.isnan(r[3]).all()  # an allowed NaN poisons the row, as in the reference
    assert not np.signbit(y[:3]).any()
    g = np.float32([[1.0, 2.0, 3.0, 4.0]] * 4)
    dx = _host_backward(lib, "hard_masked_softmax", y, g)
    assert dx[0, 0] == 0 and dx[0, 2] == 0 and np.array_equal(dx[1], np.zeros(4))


def test_host_nan_and_inf_rows_follow_the_reference(lib):
    x = np.float32([[1.0, NAN, 2.0], [1.0, INF, 2.0], [-INF, -INF, -INF], [-INF, 0.0, 1.0], [3e38, -3e38, 3e38]])
    for op in ("softmax", "log_softmax"):
        y = _host_forward(lib, op, x)
        with np.errstate(over="ignore"):
            r = reference.forward(op, {"x": x}).astype(np.float32)  # -6e38 is -inf in float32
        assert np.array_equal(np.isnan(y), np.isnan(r)), op
        assert np.array_equal(np.isinf(y), np.isinf(r)) and np.array_equal(y[np.isinf(y)], r[np.isinf(r)]), op


# -- the kernels on the CPU emulator --------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_emulated_kernels_match_the_reference(emulator, op):
    problems = []
    for sample in fc.cases(op, ("small", "medium")):
        problems += fc.emulated_problems(emulator, op, sample)
    assert problems == []


@pytest.mark.parametrize("op", OPS)
def test_emulated_kernels_large_samples(emulator, op):
    problems = []
    for sample in get_spec(op).samples("large", seeded_rng(op, "large"))[1:]:  # (256, 4097): the split-row path
        problems += fc.emulated_problems(emulator, op, sample)
    assert problems == []


def _forced(plan, path: str, rows: int, cols: int):
    """`plan` (a forward or backward of one row op) as one launch of its _block kernel, whatever
    the shape: the block path on shapes the plans would split."""
    direction = "fwd" if plan.direction == "forward" else "bwd"
    inputs = tuple(a for a in plan.launches[0].args if isinstance(a, str) and a not in ("partials", "out", "dx"))
    if direction == "bwd":
        inputs = ("out", "g")
    output = "out" if direction == "fwd" else "dx"
    buffers = tuple(b for b in plan.buffers if b.role != "workspace")
    launch = Launch(
        f"capsule_{plan.op}_{direction}_{path}", (3, 1, 1), (plans.THREADS, 1, 1), (*inputs, output, rows, cols)
    )
    return LaunchPlan(plan.op, plan.direction, buffers, (launch,), output_shapes=plan.output_shapes)


def _special_rows(cols: int, masked: bool, rng):
    """Rows across several chunks: random; all -inf; a first chunk of -inf; one NaN; one +inf; one
    logit far above the rest; all near -1e30; with a mask blocking whole chunks, a whole row, the
    NaN and a spike."""
    inf, nan = np.inf, np.nan
    rows = [3 * rng.standard_normal(cols), np.full(cols, -inf)]
    for place, value in ((slice(0, 3000), -inf), (cols // 2, nan), (cols - 10, inf)):
        r = 3 * rng.standard_normal(cols)
        r[place] = value
        rows.append(r)
    r = np.full(cols, -80.0)
    r[6000] = 80.0
    rows += [r, 3 * rng.standard_normal(cols) - 1e30]
    x = np.array(rows, np.float32)
    if not masked:
        return {"x": x}
    mask = np.ones_like(x)
    mask[0, :2500] = mask[2, 4000:] = mask[3, cols // 2] = mask[4] = mask[5, 6000] = 0.0
    return {"x": x, "mask": mask}


@pytest.mark.parametrize("op", OPS)
def test_emulated_split_rows_match_the_block_path_and_the_reference(op):
    """The split-row kernels against the block-per-row kernels and the reference on rows of 8197
    across 5 chunks with -inf, NaN and +inf entries and masked chunks: the same NaN and infinity
    pattern, values under the op's error model; the backward the same."""
    wide = family_emulator((64, 4))
    rng = np.random.default_rng(23)
    inputs = _special_rows(8197, op == "hard_masked_softmax", rng)
    rows, cols = inputs["x"].shape
    fwd, bwd = plans.PLANS[op][0](inputs, {}), plans.PLANS[op][1](inputs, {})
    assert _symbols(fwd) == ("fwd_partials", "fwd_finish") and fwd.launches[0].args[-1] == 2048
    y = wide.run(fwd, inputs)["out"]
    y_block = wide.run(_forced(fwd, "block", rows, cols), inputs)["out"]
    assert np.array_equal(np.isnan(y), np.isnan(y_block))
    assert np.array_equal(np.isinf(y), np.isinf(y_block)) and np.array_equal(y[np.isinf(y)], y_block[np.isinf(y_block)])
    finite = Sample(inputs, {}, "split-special", True)
    assert fc.emulated_problems(wide, op, finite) == []
    g = rng.standard_normal((rows, cols)).astype(np.float32)
    out = np.nan_to_num(y_block, nan=0.0)
    dx = wide.run(bwd, {**inputs, "out": out, "g": g})["dx"]
    dx_block = wide.run(_forced(bwd, "block", rows, cols), {**inputs, "out": out, "g": g})["dx"]
    assert np.array_equal(np.isnan(dx), np.isnan(dx_block))
    scale = np.abs(dx_block).max()
    assert np.nanmax(np.abs(dx - dx_block)) <= 1e-4 * scale


@pytest.mark.parametrize("op", OPS)
def test_emulated_block_path_matches_the_reference(emulator, op):
    """The block-per-row kernels on shapes the plans split (they are correct for any shape), with
    equally aligned and unequally misaligned buffers, under the op's error models."""
    rng = np.random.default_rng(29)
    problems = []
    for rows, cols in ((5, 4097), (3, 1025), (2, 9000)):
        x = (3.0 * rng.standard_normal((rows, cols))).astype(np.float32)
        inputs = {"x": x}
        if op == "hard_masked_softmax":
            inputs["mask"] = (rng.random(x.shape) < 0.7).astype(np.float32)
        sample = Sample(inputs, {}, f"block-{rows}x{cols}", True)
        fwd, bwd = plans.PLANS[op][0](inputs, {}), plans.PLANS[op][1](inputs, {})
        g = rng.standard_normal(x.shape).astype(np.float32)
        for misalign in (None, {"x": 1, "mask": 1, "out": 1, "g": 1, "dx": 1}, {"x": 1, "out": 2, "g": 3, "dx": 1}):
            y = emulator.run(_forced(fwd, "block", rows, cols), inputs, misalign)["out"]
            dx = emulator.run(_forced(bwd, "block", rows, cols), {**inputs, "out": y, "g": g}, misalign)["dx"]
            problems += fc.compared(op, sample, y, {"x": dx}, g, f" misalign {misalign}").problems
    assert problems == []


def test_emulated_split_rows_are_deterministic_whatever_the_grid():
    """Each chunk's partials and each block's combine are fixed by the chunk, not by the launch:
    the same bits with 4 blocks looping over 40 chunks as with a block per chunk."""
    x = (3.0 * np.random.default_rng(31).standard_normal((5, 16_000))).astype(np.float32)
    g = np.random.default_rng(37).standard_normal(x.shape).astype(np.float32)
    for op in ("softmax", "log_softmax"):
        fwd, bwd = plans.PLANS[op][0]({"x": x}, {}), plans.PLANS[op][1]({"x": x}, {})
        assert _symbols(fwd) == ("fwd_partials", "fwd_finish")
        narrow, wide = family_emulator((4, 4)), family_emulator((64, 4))
        ys = [narrow.run(fwd, {"x": x})["out"], narrow.run(fwd, {"x": x})["out"], wide.run(fwd, {"x": x})["out"]]
        assert all(np.array_equal(ys[0].view(np.uint32), y.view(np.uint32)) for y in ys)
        dxs = [runner.run(bwd, {"x": x, "out": ys[0], "g": g})["dx"] for runner in (narrow, wide)]
        assert np.array_equal(dxs[0].view(np.uint32), dxs[1].view(np.uint32))


@pytest.mark.parametrize("op", OPS)
def test_emulated_kernels_with_misaligned_buffers(emulator, op):
    """Rows whose buffers are not equally aligned take the scalar path; equally misaligned rows
    the head/body/tail split."""
    problems = []
    for sample in fc.cases(op, ())[-4:]:
        for misalign in ({"x": 1, "out": 2, "g": 3, "dx": 1}, {"x": 1, "mask": 1, "out": 1, "g": 1, "dx": 1}):
            problems += fc.emulated_problems(emulator, op, sample, misalign)
    assert problems == []


def test_emulated_kernels_are_deterministic(emulator):
    x = (3.0 * np.random.default_rng(5).standard_normal((9, 2500))).astype(np.float32)
    plan = plans.PLANS["softmax"][0]({"x": x}, {})
    first = emulator.run(plan, {"x": x})["out"]
    again = emulator.run(plan, {"x": x})["out"]
    assert np.array_equal(first.view(np.uint32), again.view(np.uint32))


@pytest.mark.parametrize("op", OPS)
def test_emulated_kernels_find_the_true_row_maximum(emulator, op):
    """Softmax is shift-invariant, so a wrong maximum shows only through overflow: rows with one
    logit 200 above the rest (e^200 overflows float32) at every lane and warp position."""
    rng = np.random.default_rng(17)
    problems = []
    for cols in (5, 33, 1000, 2500, 4097):
        rows = 64
        x = rng.standard_normal((rows, cols)).astype(np.float32)
        x[np.arange(rows), rng.integers(0, cols, rows)] = 200.0
        inputs = {"x": x, "mask": np.ones_like(x)} if op == "hard_masked_softmax" else {"x": x}
        problems += fc.emulated_problems(emulator, op, Sample(inputs, {}, f"spike-{cols}", True))
    assert problems == []
