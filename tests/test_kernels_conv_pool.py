"""cuda/conv_pool.cu without a GPU: it compiles cleanly for sm_80 and sm_90 with the registry's
entry points; the kernels themselves, run on the CPU emulator as the op's own launch plans launch
them (guard-banded, sentinel-filled outputs, inputs checked intact), meet each op's contract
against the float64 reference with aligned and misaligned buffers, for any split of the weight
gradient, with the same bits for any grid; the index arithmetic of cuda/conv_pool.cuh (compiled
for the host) matches brute force; the plans are legal."""

import ctypes
import itertools

import family_checks as fc
import numpy as np
import pytest
from hostmath import F32P, I64P, declare, load
from kernel_emu import emulator

from capsule_core.kernels.launch import STATIC_SHARED_LIMIT
from capsule_core.kernels.nvcc import ARCHES, cuda_source_dir
from capsule_core.kernels.plans import conv_pool as plans
from capsule_core.ops import get_spec
from capsule_core.ops.base import Sample, numel, seeded_rng, validate

FAMILY = "conv_pool"
OPS = ("conv", "conv_transpose", "max_pool", "smooth_max_pool", "avg_pool")
CONVS = ("conv", "conv_transpose")
POOLS = ("max_pool", "smooth_max_pool", "avg_pool")


# -- the build ------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHES)
def test_static_shared_memory_within_the_limit(arch):
    for name, r in fc.compiled(FAMILY)[arch].resources.items():
        assert r.shared_bytes <= STATIC_SHARED_LIMIT, f"{name}: {r.shared_bytes} bytes of static shared memory"


def test_plan_constants_match_the_kernels():
    """The plans size grids and blocks by the tile shapes of conv_pool.cuh (a kernel launched
    with another block shape writes nothing)."""
    header = (cuda_source_dir() / "conv_pool.cuh").read_text()
    assert f"constexpr int kGemmThreads = {plans.GEMM_THREADS};" in header
    assert f"constexpr int kSumThreads = {plans.SUM_THREADS};" in header
    assert f"using CorrTiles = CorrTile<{plans.CORR_TILE[0]}, {plans.CORR_TILE[1]}>;" in header
    bm, bn, bk = plans.WEIGHT_TILE
    assert f"static constexpr int BM = {bm}, BN = {bn}, BK = {bk}," in header


# -- the host library -------------------------------------------------------------------------------

POOL_ARGS = [ctypes.c_int64] * 16


@pytest.fixture(scope="module")
def lib(host_build_dir):
    """cuda/conv_pool.cuh's index arithmetic, built for the host."""
    return declare(
        load("conv_pool_host", host_build_dir),
        {
            "host_source": (ctypes.c_int64, [ctypes.c_int32] + [ctypes.c_int64] * 5),
            "host_covering": [ctypes.c_int64] * 5 + [I64P],
            "host_window_argmax": [F32P, I64P, F32P] + POOL_ARGS,
            "host_corr_gather": [ctypes.c_int32] + [ctypes.c_int64] * 17 + [I64P],
        },
    )


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
    (
        np.where(
            np.random.default_rng(2).random((1, 2, 4, 5, 6)) < 0.3,
            np.nan,
            np.round(3 * np.random.default_rng(3).random((1, 2, 4, 5, 6))),
        ),
        {"kernel": (2, 3, 2), "stride": (1, 2, 2), "padding": (1, 1, 0)},
    ),
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
    assert value.view(np.uint32).tolist() == want_value.view(np.uint32).tolist() or np.array_equal(
        value, want_value, equal_nan=True
    )
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
                    cands = [
                        i
                        for i in itertools.product(*(range(q) for q in in_sizes))
                        if all(ii * ss - pp + ff == oo for ii, ss, pp, ff, oo in zip(i, stride, padding, off, o))
                    ]
                    cell = cands[0] if cands else None
                else:
                    cell = tuple(oo * ss - pp + ff for oo, ss, pp, ff in zip(o, stride, padding, off))
                    cell = cell if all(0 <= q < size for q, size in zip(cell, in_sizes)) else None
                if cell is not None:
                    table[b * numel(out_sizes) + pos, r] = b * c * numel(in_sizes) + np.ravel_multi_index(
                        cell, in_sizes
                    )
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


# -- the kernels on the CPU emulator, driven by the launch plans ------------------------------------------


@pytest.fixture(scope="module")
def emu():
    """conv_pool.cu on the emu backend, grids capped at 4 blocks: each block walks many tiles."""
    return emulator((4, 4))


def aligned_but_workspaces(shift):
    """Inputs and outputs `shift` floats off 16-byte alignment (views at an offset); workspaces
    stay aligned (they are allocations, never views)."""
    return lambda b: shift * (b.role != "workspace")


def check_sample(emu, op, sample, shift=0) -> float:
    """Forward and backward plans of one sample on the emulator against the reference; returns
    the worst error over its bound."""
    run = fc.emulate(emu, op, sample, aligned_but_workspaces(shift))
    result = fc.compared(op, sample, run.y, run.grads, run.g)
    assert result.problems == []
    return result.worst


def run_plans(emu, op, arrays, p, g, shift=0):
    """y and the gradients ({input: gradient}) of the op's plans at cotangent g."""
    forward, backward = plans.PLANS[op]
    y = emu.run(forward(arrays, p), arrays, aligned_but_workspaces(shift))["out"]
    grads = emu.run(backward(arrays, p), {**arrays, "out": y, "g": g}, aligned_but_workspaces(shift))
    return y, {name[1:]: v for name, v in grads.items()}


def plan_arguments(op, sample):
    """A sample's arrays and params as the plans take them, and its cotangent."""
    arrays, p, out_shape = validate(get_spec(op), sample.inputs, sample.params, np.float32)
    return arrays, p, fc.cotangent(op, sample.case, out_shape)


@pytest.mark.parametrize("op", OPS)
def test_kernels_meet_the_contract(emu, op):
    """Every small and medium sample and every edge, forward and backward."""
    worst = max(check_sample(emu, op, sample) for sample in fc.cases(op, ("small", "medium")))
    assert worst <= 0.5, f"{op}: worst error {worst:.3g} of the bound"


@pytest.mark.parametrize("op", POOLS)
def test_pools_on_the_large_sample(emu, op):
    """(8, 64, 64, 64): each of the capped grid's threads walks hundreds of windows."""
    (sample,) = get_spec(op).samples("large", seeded_rng(op, "large"))
    check_sample(emu, op, sample)


WIDE_CASES = {
    # (x shape, w shape, stride, padding): several column tiles (channels > 32, partial last tile),
    # partial channel chunks (channels % 16 != 0), several dw tiles on both channel axes; ranks 1-3
    "conv": [
        ((2, 20, 9, 7), (40, 20, 3, 2), (2, 1), (1, 1)),
        ((1, 36, 33), (70, 36, 4), 3, 2),
        ((2, 17, 5, 4, 6), (33, 17, 2, 3, 2), (1, 2, 1), (1, 1, 0)),
    ],
    "conv_transpose": [
        ((2, 20, 5, 4), (20, 40, 3, 2), (2, 1), (1, 0)),
        ((1, 36, 12), (36, 70, 4), 3, 2),
        ((2, 33, 3, 4, 3), (33, 17, 2, 3, 2), (1, 2, 1), (1, 1, 0)),
    ],
}


def wide_sample(op, i) -> Sample:
    x_shape, w_shape, stride, padding = WIDE_CASES[op][i]
    rng = seeded_rng(op, f"wide-{i}")
    co = w_shape[1] if op == "conv_transpose" else w_shape[0]
    inputs = {
        "x": rng.standard_normal(x_shape).astype(np.float32),
        "w": (rng.standard_normal(w_shape) / np.sqrt(numel(w_shape[1:]))).astype(np.float32),
        "b": rng.standard_normal(co).astype(np.float32),
    }
    return Sample(inputs, {"stride": stride, "padding": padding}, f"wide-{i}")


@pytest.mark.parametrize("op", CONVS)
def test_conv_with_several_channel_tiles(emu, op):
    for i in range(len(WIDE_CASES[op])):
        check_sample(emu, op, wide_sample(op, i))


@pytest.mark.parametrize("op", OPS)
def test_unaligned_buffers_take_the_scalar_paths(emu, op):
    """Inputs and outputs one float off 16-byte alignment: the vector loads and stores fall back
    (a 16-byte access off alignment is the emulator's error, as it is a GPU's fault)."""
    spec = get_spec(op)
    for sample in spec.samples("small", seeded_rng(op, "small")) + spec.samples("medium", seeded_rng(op, "medium"))[:1]:
        check_sample(emu, op, sample, shift=1)


@pytest.mark.parametrize("op", OPS)
def test_results_are_bitwise_independent_of_grid_and_alignment(op):
    """A block walking many tiles or cells computes each as a block of its own would, and the
    16-byte loads and epilogue stores move the same bits as the scalar ones: every output one fixed
    chain of roundings. Except db, whose channel sums add float4 groups when g is aligned (another
    order than the scalar path's, within the model)."""
    arrays, p, g = plan_arguments(op, get_spec(op).samples("medium", seeded_rng(op, "medium"))[0])
    y, grads = run_plans(emulator((4, 4)), op, arrays, p, g)
    for max_grid, shift in (((1, 1), 0), ((7, 3), 0), ((4, 4), 1)):
        y_other, grads_other = run_plans(emulator(max_grid), op, arrays, p, g, shift)
        assert fc.same_bits(y, y_other), f"{op} forward, grid {max_grid}, shift {shift}"
        for name, value in grads.items():
            if not (shift and name == "b"):
                assert fc.same_bits(value, grads_other[name]), f"{op} d{name}, grid {max_grid}, shift {shift}"


@pytest.mark.parametrize("op", CONVS)
@pytest.mark.parametrize("splits", [1, 2, 5, 64])
def test_weight_gradient_for_any_split(emu, op, splits, monkeypatch):
    """dw with the reduction forced into `splits` ranges (more than there are steps: empty
    ranges must still write their zero partials)."""
    monkeypatch.setattr(plans, "weight_splits", lambda *a: splits)
    spec = get_spec(op)
    for sample in (spec.samples("medium", seeded_rng(op, "medium"))[1], wide_sample(op, 0)):
        check_sample(emu, op, sample)
        plan = plans.PLANS[op][1](*validate(spec, sample.inputs, sample.params, np.float32)[:2])
        assert any(launch.symbol.endswith("bwd_wsum") for launch in plan.launches) == (splits > 1)


def test_max_pool_selection_policy(emu):
    """Ties: each window's g goes to exactly one cell, the first maximum in window order; an
    all-NaN window sends nothing; padding never wins (all-negative input)."""
    spec = get_spec("max_pool")
    x = np.array([[[[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [np.nan, np.nan, -1.0]]]], np.float32)
    params = {"kernel": 2, "stride": 1, "padding": 1}
    arrays, p, out_shape = validate(spec, {"x": x}, params, np.float32)
    g = np.arange(1.0, 1.0 + numel(out_shape), dtype=np.float32).reshape(out_shape)
    y, grads = run_plans(emu, "max_pool", arrays, p, g)
    dx = grads["x"]
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
    arrays, p, out_shape = validate(spec, {"x": neg}, params, np.float32)
    assert (emu.run(plans.PLANS["max_pool"][0](arrays, p), arrays)["out"] < 0).all(), "padding never wins"


def test_max_pool_argmax_is_int32_and_int64_past_2_31_cells(emu, monkeypatch):
    """The backward's argmax workspace is int32; planes of ARGMAX32_LIMIT cells or more take the
    _wide kernels with an int64 one. Forced onto a small 3-D input (ties, NaN windows, padding),
    both give the same bits."""
    spec = get_spec("max_pool")
    x = seeded_rng("max_pool", "wide").integers(-2, 3, (2, 3, 4, 5, 6)).astype(np.float32)
    x[0, 1, :2, :2, :2] = np.nan
    params = {"kernel": (2, 3, 2), "stride": (1, 2, 2), "padding": (1, 1, 0)}
    arrays, p, out_shape = validate(spec, {"x": x}, params, np.float32)
    g = fc.cotangent("max_pool", "wide", out_shape)
    plan = plans.PLANS["max_pool"][1](arrays, p)
    assert [(launch.symbol, plan.buffer("argmax").dtype) for launch in plan.launches] == [
        ("capsule_max_pool_bwd_argmax", "int32"),
        ("capsule_max_pool_bwd", "int32"),
    ]
    _, narrow = run_plans(emu, "max_pool", arrays, p, g)
    monkeypatch.setattr(plans, "ARGMAX32_LIMIT", x[0, 0].size)
    plan = plans.PLANS["max_pool"][1](arrays, p)
    assert [(launch.symbol, plan.buffer("argmax").dtype) for launch in plan.launches] == [
        ("capsule_max_pool_bwd_argmax_wide", "int64"),
        ("capsule_max_pool_bwd_wide", "int64"),
    ]
    _, wide = run_plans(emu, "max_pool", arrays, p, g)
    assert fc.same_bits(narrow["x"], wide["x"])
    assert np.count_nonzero(narrow["x"]) > 0


# -- launch plans -------------------------------------------------------------------------------------------


def _static_shared_memory_only(case):
    for plan in case.plans:
        for launch in plan.launches:
            assert launch.shared_bytes == 0, "static shared memory only (no opt-in needed)"
            assert launch.grid[0] >= 1


@pytest.mark.parametrize("op", OPS)
def test_plans_are_legal_for_every_sample(op):
    assert fc.plan_case_problems(op, reference_shapes=np.inf, check=_static_shared_memory_only) == []


def test_large_conv_sample_launch_shape():
    """The large conv sample (8, 32, 64, 64) * (32, 32, 3, 3): the weights packed (9 kernel offsets
    × 32 channels by 32 columns), then 256 forward tiles of 128 × 32; dw split so that its 9 tiles
    become a few hundred blocks."""
    spec = get_spec("conv")
    (sample,) = spec.samples("large", seeded_rng("conv", "large"))
    arrays, p, _ = validate(spec, sample.inputs, sample.params, np.float32)
    forward = plans.PLANS["conv"][0](arrays, p)
    pack, fwd = forward.launches
    assert pack.symbol == "capsule_conv_fwd_pack" and pack.args[-1] == 0
    assert forward.buffer("packed").elements == 9 * 32 * 32
    assert fwd.symbol == "capsule_conv_fwd" and fwd.grid == (256, 1, 1) and fwd.block == (128, 1, 1)
    bwd = plans.PLANS["conv"][1](arrays, p)
    by_symbol = {launch.symbol: launch for launch in bwd.launches}
    splits = by_symbol["capsule_conv_bwd_w"].args[-1]
    assert splits > 1 and 256 <= by_symbol["capsule_conv_bwd_w"].grid[0] <= 1024
    assert [launch.symbol for launch in bwd.launches] == [
        "capsule_conv_bwd_x_pack",
        "capsule_conv_bwd_x",
        "capsule_conv_bwd_w",
        "capsule_conv_bwd_wsum",
        "capsule_conv_bwd_b",
    ]


def test_few_channels_take_the_flattened_gemm():
    """The stem conv (3 channels, 7 × 7): 147 reduction rows in 10 steps of 16 (unflattened, 49
    steps of 16 rows of which 13 are zero); its dx GEMM reduces over 64 channels, unflattened.
    conv_transpose's dx is the correlation: flattened for few output channels."""
    arrays = {
        "x": np.empty((32, 3, 224, 224), np.float32),
        "w": np.empty((64, 3, 7, 7), np.float32),
        "b": np.empty(64, np.float32),
    }
    p = {"stride": 2, "padding": 3}
    forward = plans.PLANS["conv"][0](arrays, p)
    assert [launch.symbol for launch in forward.launches] == ["capsule_conv_fwd_pack", "capsule_conv_fwd_flat"]
    assert forward.launches[0].args[-1] == 1 and forward.buffer("packed").elements == 160 * 64
    backward = plans.PLANS["conv"][1](arrays, p)
    assert [launch.symbol for launch in backward.launches][:2] == ["capsule_conv_bwd_x_pack", "capsule_conv_bwd_x"]
    assert backward.buffer("packed").elements == 49 * 64 * 32
    arrays = {
        "x": np.empty((2, 64, 8, 8), np.float32),
        "w": np.empty((64, 3, 4, 4), np.float32),
        "b": np.empty(3, np.float32),
    }
    p = {"stride": 2, "padding": 1}
    assert [launch.symbol for launch in plans.PLANS["conv_transpose"][0](arrays, p).launches] == [
        "capsule_conv_transpose_fwd_pack",
        "capsule_conv_transpose_fwd",
    ]
    assert [launch.symbol for launch in plans.PLANS["conv_transpose"][1](arrays, p).launches][:2] == [
        "capsule_conv_transpose_bwd_x_pack",
        "capsule_conv_transpose_bwd_x_flat",
    ]


@pytest.mark.parametrize("op", CONVS)
def test_flattened_reduction_adds_in_the_same_order(op, monkeypatch):
    """The _flat GEMM of the correlation (conv forward, conv_transpose dx; forced here for any
    channel count, also across kernel offsets within one step: 20 channels) adds the same products
    in the same order as the unflattened one, which adds zeros for the padded channels: the same
    bits, for small and medium samples of every rank."""
    spec = get_spec(op)
    samples = spec.samples("small", seeded_rng(op, "small")) + spec.samples("medium", seeded_rng(op, "medium"))
    for sample in samples + [wide_sample(op, i) for i in range(len(WIDE_CASES[op]))]:
        arrays, p, g = plan_arguments(op, sample)
        runs = []
        for flat in (False, True):
            monkeypatch.setattr(plans, "corr_flat", lambda channels, correlation, flat=flat: flat and correlation)
            runs.append(run_plans(emulator((4, 4)), op, arrays, p, g))
        (y, grads), (y_flat, grads_flat) = runs
        assert fc.same_bits(y, y_flat), f"{op} {sample.case} forward"
        assert fc.same_bits(grads["x"], grads_flat["x"]), f"{op} {sample.case} dx"


def test_planted_launch_faults_are_caught():
    (sample,) = get_spec("conv").samples("large", seeded_rng("conv", "large"))
    _, plan = fc.case_plans("conv", sample)
    launch = plan.launches[2]
    assert launch.symbol == "capsule_conv_bwd_w"
    faults = [
        ("writable", {"args": ("x", "g", "x", *launch.args[3:])}),
        ("needs a number", {"args": (*launch.args[:-1], "dw")}),
        ("not declared", {"symbol": "capsule_max_pool_bwd"}),
        ("grid dimension 0", {"grid": (0, 1, 1)}),
    ]
    assert fc.missed_launch_faults(plan, fc.symbols("conv"), faults, index=2) == []
