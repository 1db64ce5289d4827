"""cuda/index.cu without a GPU: it compiles cleanly for sm_80 and sm_90 with the registry's entry
points; the kernels themselves, run on the CPU emulator as the launch plans launch them (guard
bands, NaN-prefilled outputs, inputs checked intact, buffers aligned and 4 bytes off), meet the
contract on every sample and edge (gathers bit for bit, the sums over repeated indices under the
error model, and bit for bit against np.add.at where a thread sums its segment in j order) and
take every path; the index arithmetic of cuda/index.cuh (compiled for the host) matches numpy; the
plans' sorted CSR order is right and the plans are legal."""

import ctypes
import dataclasses

import family_checks as fc
import numpy as np
import pytest
from hostmath import declare, i64, load
from kernel_emu import emulator as family_emulator

from capsule_core.kernels.plans import index as plans
from capsule_core.ops import get_spec
from capsule_core.ops.base import seeded_rng, validate

FAMILY = "index"
OPS = ("gather", "scatter_add")


# -- the host build of index.cuh, and the path each launch takes --------------------------------------


@pytest.fixture(scope="module")
def lib(host_build_dir):
    p, i64_, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32
    return declare(
        load("index_host", host_build_dir),
        {
            "host_segment_warp_mode": (i32, [i64_] * 4),
            "host_segment": (None, [i64_, i64_, i64_, i64_, p, p]),
            "host_gather_source": (i64_, [i64_, i64_, i64_, i64_, p, i32]),
        },
    )


SUMS = ("capsule_gather_bwd", "capsule_scatter_add_fwd")


@pytest.fixture(scope="module")
def path_of(lib):
    """The path a launch takes, from its arguments and the alignment of its float32 buffers: a
    gather (gather's forward, the dsrc of scatter_add's backward) 1 for 16-byte moves (rows of a
    multiple of 4 elements on aligned buffers, index.cu's test), 0 for words; a segment sum 1 where
    a warp sums each element (index.cuh's choice for the launch's block), 0 for a thread."""

    def path(plan, launch, aligned):
        outer, size, inner, count = launch.args[-4:]
        if launch.symbol in SUMS:
            return lib.host_segment_warp_mode(size, inner, count, launch.block[0])
        return int(inner % 4 == 0 and aligned)

    return path


@pytest.fixture(scope="module")
def emu():
    """cuda/index.cu itself on the CPU emulator (warp shuffles, grid-stride loops, grids capped at 4
    blocks): guard bands, sentinel-filled outputs, every output written, inputs intact, a 16-byte
    access off alignment an error (as on a GPU)."""
    return family_emulator()


def segment_sum(runner, lib, src, index, base_shape, axis, base=None, block=plans.BLOCK):
    """The segment-sum kernel over the plan's CSR in blocks of `block` threads: gather's backward
    (the sum of src's slices at each index value) or, given base, scatter_add's forward (base plus
    that sum). Returns the result and the sum mode (1: a warp per element)."""
    index = np.asarray(index, np.int64)
    src = np.ascontiguousarray(src, np.float32)
    if base is None:
        plan = plans.PLANS["gather"][1]({"x": np.zeros(base_shape, np.float32), "index": index}, {"axis": axis})
        feed, out = {"g": src}, "dx"
    else:
        plan = plans.PLANS["scatter_add"][0]({"base": base, "index": index, "src": src}, {"axis": axis})
        feed, out = {"base": base, "src": src}, "out"
    plan = fc.with_launch(plan, block=(block, 1, 1))
    outer, size, inner, count = plan.launches[0].args[-4:]
    return runner.run(plan, feed)[out], lib.host_segment_warp_mode(size, inner, count, block)


# -- every sample and edge on the emulator ------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_kernels_run_unchanged_on_the_emulator(emu, path_of, op):
    """cuda/index.cu itself (warp shuffles, grid-stride loops) on every sample and edge: gathers bit
    for bit, sums under the error model; its kernels take word and 16-byte gathers, thread and warp
    sums."""
    seen = set()
    for sample in fc.cases(op):
        seen.update(fc.emulated_paths(emu, op, sample, path_of))
    assert seen == {(f"capsule_{op}_{d}", path) for d in ("fwd", "bwd") for path in (0, 1)}


@pytest.mark.parametrize("op", OPS)
def test_unaligned_buffers_take_the_scalar_paths(emu, path_of, op):
    """Buffers 4 bytes off 16-byte alignment: the gathers must notice and move words one by one."""
    for sample in fc.cases(op, ("small", "medium")):
        for symbol, path in fc.misaligned_paths(emu, op, sample, path_of):
            assert symbol in SUMS or path == 0, (sample.case, symbol)


def test_each_vector_path_falls_back_off_alignment(emu, path_of):
    """The 16-byte gathers (gather's forward, scatter_add's dsrc) and dbase copy, taken on aligned
    buffers, move words when the float32 buffers (all of them, the inputs only, the outputs only)
    are 4 bytes off alignment."""
    rng = seeded_rng("index", "vectors")
    index = np.array([5, 0, 0, 3, 2])

    def x(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    cases = [
        ("gather", {"x": x(6, 8), "index": index}, "capsule_gather_fwd"),
        ("scatter_add", {"base": x(6, 8), "index": index, "src": x(5, 8)}, "capsule_scatter_add_bwd"),
    ]
    for op, inputs, gather in cases:
        sample = dataclasses.replace(get_spec(op).edges()[0], inputs=inputs, params={"axis": 0}, case="vectors")
        assert {s: path for s, path in fc.emulated_paths(emu, op, sample, path_of) if s not in SUMS} == {gather: 1}, op
        for symbol, path in fc.misaligned_paths(emu, op, sample, path_of):
            assert symbol in SUMS or path == 0, (op, symbol)


def test_bits_survive_gathers(emu):
    payloads = np.array([0x7FC00001, 0xFFC12345, 0x7FA00001, 0x80000000, 0x00000001, 0xFF800000], np.uint32).view(
        np.float32
    )
    x = np.resize(payloads, (3, 6, 8))
    for axis, index in ((1, np.array([5, 0, 0, 3, 2, 1, 4])), (2, np.array([7, 7, 1])), (0, np.array([2, 0]))):
        spec = get_spec("gather")
        arrays, p, _ = validate(spec, {"x": x, "index": index}, {"axis": axis}, np.float32)
        y = emu.run(plans.PLANS["gather"][0](arrays, p), fc.plan_inputs(spec, arrays))["out"]
        assert fc.same_bits(y, np.take(x, index, axis=axis))
        spec = get_spec("scatter_add")
        base = x
        src = np.resize(payloads[::-1], np.take(x, index, axis=axis).shape)
        arrays, p, _ = validate(spec, {"base": base, "index": index, "src": src}, {"axis": axis}, np.float32)
        g = x
        out = emu.run(plans.PLANS["scatter_add"][1](arrays, p), {**fc.plan_inputs(spec, arrays), "g": g})
        got = fc.gradients(spec, out)
        assert fc.same_bits(got["base"], g) and fc.same_bits(got["src"], np.take(g, index, axis=axis))


# -- the index arithmetic and the CSR order ---------------------------------------------------------------


@pytest.mark.parametrize("use32", [0, 1])
def test_gather_source_matches_numpy(lib, use32):
    rng = seeded_rng("index", "source")
    for outer, size, inner, count in [(1, 5, 1, 7), (3, 4, 5, 2), (2, 1, 3, 4), (4, 7, 1, 1), (1, 3, 8, 9)]:
        index = i64(rng.integers(0, size, count))
        src = np.arange(outer * size * inner).reshape(outer, size, inner)
        want = np.take(src, index, axis=1).reshape(-1)
        got = [lib.host_gather_source(e, size, inner, count, index.ctypes.data, use32) for e in range(want.size)]
        assert got == want.tolist()


def test_gather_guards_an_index_out_of_range(emu, lib):
    """Refused on the host first; were one to reach the kernel, it writes NaN and reads nothing."""
    index = i64([0, 5, -1, 2])
    assert lib.host_gather_source(1, 5, 1, 4, index.ctypes.data, 0) == -1
    assert lib.host_gather_source(2, 5, 1, 4, index.ctypes.data, 1) == -1
    x = np.arange(5, dtype=np.float32)
    for inner in (1, 4):  # words and 16-byte vectors
        xs = np.repeat(x, inner).reshape(5, inner)
        # every element written (a guarded, sentinel-filled output): NaN where the index is bad
        y = emu.run(plans.PLANS["gather"][0]({"x": xs, "index": index}, {"axis": 0}), {"x": xs, "index": index})["out"]
        assert np.isnan(y[1:3]).all() and (y[0] == 0).all() and (y[3] == 2).all()


def test_csr_lists_each_value_in_ascending_j():
    rng = seeded_rng("index", "csr")
    for size, count in [(1, 0), (5, 0), (7, 100), (100, 7), (1, 50), (3, 1)]:
        index = rng.integers(0, size, count)
        order, starts = plans.csr(index, size)
        assert order.dtype == starts.dtype == np.int64 and starts.shape == (size + 1,) and order.shape == (count,)
        assert starts[0] == 0 and starts[-1] == count and (np.diff(starts) >= 0).all()
        for s in range(size):
            members = order[starts[s] : starts[s + 1]]
            assert (index[members] == s).all() and (np.diff(members) > 0).all()
            assert members.size == (index == s).sum()


def test_segment_clamps_a_corrupt_starts_array(lib):
    out = i64(np.zeros(3))
    starts = i64([-5, 2, 99])
    lib.host_segment(0, 2, 1, 4, starts.ctypes.data, out.ctypes.data)
    assert out.tolist()[:2] == [0, 2]
    lib.host_segment(1, 2, 1, 4, starts.ctypes.data, out.ctypes.data)
    assert out.tolist()[:2] == [2, 4]


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_thread_sums_reproduce_np_add_at_bit_for_bit(emu, lib, axis):
    """Where a thread sums its segment (j order from +0), the result is np.add.at's own float32
    accumulation, repeats included."""
    rng = seeded_rng("index", f"add-at-{axis}")
    shape = (3, 5, 4)
    for count in (0, 1, 9, 60):
        index = rng.integers(0, shape[axis], count)
        src_shape = shape[:axis] + (count,) + shape[axis + 1 :]
        src = (rng.standard_normal(src_shape) * 10.0 ** rng.integers(-3, 4, src_shape)).astype(np.float32)
        base = rng.standard_normal(shape).astype(np.float32)
        for b in (None, base):
            want = np.zeros(shape, np.float32) if b is None else b.copy()
            np.add.at(np.moveaxis(want, axis, 0), index, np.moveaxis(src, axis, 0))
            got, mode = segment_sum(emu, lib, src, index, shape, axis, b, block=33)  # partial warps: thread mode
            assert mode == 0
            assert fc.same_bits(got, want), (count, b is None)


@pytest.mark.parametrize("block", [32, 256, 1024])
def test_warp_sums_of_long_segments(emu, lib, block):
    """One index value repeated many times (a warp per element): within the sum's error bound, and
    the same bits on every run, whatever the grid."""
    rng = seeded_rng("index", f"warp-{block}")
    other_grid = family_emulator((7, 1))
    for shape, axis, count in [((7, 5), 1, 1000), ((2, 3, 4), 1, 500), ((4,), 0, 4099)]:
        index = rng.integers(0, min(2, shape[axis]), count)
        src_shape = shape[:axis] + (count,) + shape[axis + 1 :]
        src = rng.standard_normal(src_shape).astype(np.float32)
        got, mode = segment_sum(emu, lib, src, index, shape, axis, block=block)
        assert mode == 1
        want = np.zeros(shape, np.float64)
        np.add.at(np.moveaxis(want, axis, 0), index, np.moveaxis(src.astype(np.float64), axis, 0))
        magnitude = np.zeros(shape, np.float64)
        np.add.at(np.moveaxis(magnitude, axis, 0), index, np.moveaxis(np.abs(src.astype(np.float64)), axis, 0))
        assert (np.abs(got - want) <= count * 2.0**-24 * magnitude + 1e-30).all()
        again, _ = segment_sum(other_grid, lib, src, index, shape, axis, block=block)
        assert fc.same_bits(got, again)


def test_python_mirror_of_the_warp_mode_agrees(lib):
    for size, inner, count, block in [
        (5, 1, 1000, 256),
        (5, 1, 159, 256),
        (5, 1, 160, 256),
        (5, 32, 10**4, 256),
        (5, 31, 10**4, 256),
        (0, 1, 0, 256),
        (5, 1, 1000, 33),
        (129, 1, 200, 256),
    ]:
        assert bool(lib.host_segment_warp_mode(size, inner, count, block)) == plans.segment_warp_mode(
            size, inner, count, block
        )


def test_special_values_sum_like_the_reference(emu, lib):
    """NaN and ±inf among repeated entries: NaN wins, inf + −inf is NaN, −0 alone gives +0 (the zero start)."""
    src = np.array([[np.nan, 1.0, np.inf, -np.inf, np.inf, -0.0, 2.0]], np.float32)
    index = np.array([0, 0, 1, 1, 2, 3, 4])
    got, _ = segment_sum(emu, lib, src, index, (1, 5), 1, block=33)
    assert np.isnan(got[0, :2]).all() and got[0, 2] == np.inf
    assert fc.bits(got[0, 3:4])[0] == 0 and got[0, 4] == 2.0


# -- plans ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_plans_are_legal_for_every_sample(op):
    """plan_case_problems (legal, fitting the registers, the declared outputs); scatter_add's forward
    reads the index as its CSR order (meta buffers), not as an input."""
    assert fc.plan_case_problems(op, all_inputs=False) == []


def test_planted_launch_faults_are_caught():
    _, plan = fc.launch_plans("gather", {"x": np.zeros((6, 4), np.float32), "index": np.array([1, 1, 5])}, {"axis": 0})
    (launch,) = plan.launches
    short = dataclasses.replace(plan, host_data={**plan.host_data, "starts": plan.host_data["starts"][:-1]})
    faults = [
        ("order is int64_t* but buffer g holds float32", {"args": ("g", "g", *launch.args[2:])}),
        ("dx is float* but buffer starts holds int64", {"args": (*launch.args[:3], "starts", *launch.args[4:])}),
        ("writable but buffer g", {"args": (*launch.args[:3], "g", *launch.args[4:])}),
        ("meta buffer starts", short),
    ]
    assert fc.missed_launch_faults(plan, fc.symbols("gather"), faults) == []
