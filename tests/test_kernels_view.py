"""cuda/view.cu without a GPU: it compiles cleanly for sm_80 and sm_90 with the registry's entry
points; the kernels themselves, run on the CPU emulator as the launch plans launch them (guard
bands, NaN-prefilled outputs, inputs checked intact, buffers aligned and 4 bytes off), move every
sample and edge bit for bit as numpy does (the sum of broadcast's backward under its error model)
and take every path, as view.cuh's own choice on each launch's arguments says; its index
arithmetic (cuda/view.cuh, compiled for the host) matches numpy; and its plans are legal."""

import ctypes
import dataclasses
import itertools

import family_checks as fc
import numpy as np
import pytest
from hostmath import declare, i64, load
from kernel_emu import emulator as family_emulator

from capsule_core.catalog import registry
from capsule_core.kernels.launch import Buffer, plan_functions, plan_problems
from capsule_core.kernels.plans import view as plans
from capsule_core.ops import get_spec
from capsule_core.ops.base import seeded_rng, validate

FAMILY = "view"
OPS = ("reshape", "permute", "broadcast", "concat", "slice")
SYMBOLS = fc.family_symbols(FAMILY)

PAYLOADS = np.array(
    [0x7FC00001, 0xFFC12345, 0x7FA00001, 0x80000000, 0x00000001, 0xFF800000, 0x3F800000], dtype=np.uint32
).view(np.float32)
"""NaNs with payloads (one signalling), −0, the smallest subnormal, −inf, 1."""


# -- the build ------------------------------------------------------------------------------------


def test_reshape_names_no_kernel():
    assert registry.lookup("reshape").symbols == ()


# -- the host build of view.cuh, and the path each launch takes ---------------------------------------


@pytest.fixture(scope="module")
def lib(host_build_dir):
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32
    return declare(
        load("view_host", host_build_dir),
        {
            "host_view_offset": (i64, [p, p, i32, i64, i32]),
            "host_view_path": (i32, [p, p, i32, i32, i32, i32]),
            "host_tile_count": (i64, [p, p, i32]),
            "host_broadcast_row_mode": (i32, [p, i32]),
            "host_rows": (None, [i32] + [i64] * 5 + [p]),
            "host_rows_vec4": (i32, [i32] + [i64] * 5 + [i32, i32]),
            "host_slice_fill_vec4": (i32, [i64] * 4 + [i32, i32]),
        },
    )


ROWS = {"capsule_concat_fwd": 0, "capsule_concat_bwd": 1, "capsule_slice_fwd": 2}


@pytest.fixture(scope="module")
def path_of(lib):
    """The path a launch takes, by view.cuh's own choice on its arguments, its geometry and the
    alignment of its float32 buffers: permute and broadcast forward a PATH_*, broadcast's backward 1
    in row mode and 0 in column mode, concat, slice and slice's backward 1 for 16-byte moves."""

    def path(plan, launch, aligned):
        a = launch.args
        if launch.symbol in ROWS:
            return lib.host_rows_vec4(ROWS[launch.symbol], *a[2:], aligned, aligned)
        if launch.symbol == "capsule_slice_bwd":
            return lib.host_slice_fill_vec4(*a[3:], aligned, aligned)
        geometry, rank = i64(plan.host_data["geometry"]), a[3]
        assert geometry.size == 2 * rank
        if launch.symbol == "capsule_broadcast_bwd":
            return lib.host_broadcast_row_mode(geometry.ctypes.data, rank)
        tiles = launch.symbol.startswith("capsule_permute")
        return lib.host_view_path(geometry.ctypes.data, geometry[rank:].ctypes.data, rank, aligned, aligned, tiles)

    return path


@pytest.fixture(scope="module")
def emu():
    """cuda/view.cu itself on the CPU emulator (every thread a fiber, real barriers and shuffles,
    grids capped at 4 blocks so that the grid-stride loops turn): guard bands, sentinel-filled
    outputs, every output written, inputs intact, a 16-byte access off alignment an error (as on a
    GPU)."""
    return family_emulator()


def sample_of(op, inputs, params, case):
    return dataclasses.replace(get_spec(op).edges()[0], inputs=inputs, params=params, case=case)


# -- every sample and edge on the emulator ------------------------------------------------------------


SCALAR, COPY4, FILL4, TILE = plans.PATH_SCALAR, plans.PATH_COPY4, plans.PATH_FILL4, plans.PATH_TILE
PATHS = {
    "reshape": set(),
    "permute": {(f"capsule_permute_{d}", p) for d in ("fwd", "bwd") for p in (SCALAR, COPY4, TILE)},
    "broadcast": {("capsule_broadcast_fwd", p) for p in (SCALAR, COPY4, FILL4)}
    | {("capsule_broadcast_bwd", 0), ("capsule_broadcast_bwd", 1)},
    "concat": {(f"capsule_concat_{d}", p) for d in ("fwd", "bwd") for p in (0, 1)},
    "slice": {(f"capsule_slice_{d}", p) for d in ("fwd", "bwd") for p in (0, 1)},
}
"""Every path of every kernel (gathers: a PATH_*; broadcast's backward: 1 in row mode, 0 in column
mode; concat and slice: 1 for 16-byte moves): all taken by the samples and edges of their op."""


@pytest.mark.parametrize("op", OPS)
def test_kernels_run_unchanged_on_the_emulator(emu, path_of, op):
    """cuda/view.cu itself (shared-memory tiles, barriers, warp shuffles, grid-stride loops) on
    every sample and edge, bit for bit against numpy (broadcast's backward sum under its error
    model), taking every path of its kernels (broadcast's forward repeating its last axis too)."""
    samples = fc.cases(op)
    if op == "broadcast":
        samples.append(
            sample_of(
                op, {"x": np.arange(5, dtype=np.float32).reshape(5, 1)}, {"shape": (3, 5, 64)}, "repeat-last-axis"
            )
        )
    seen = set()
    for sample in samples:
        seen.update(fc.emulated_paths(emu, op, sample, path_of))
    assert seen == PATHS[op]


@pytest.mark.parametrize("op", OPS)
def test_unaligned_buffers_take_the_scalar_paths(emu, path_of, op):
    """Buffers 4 bytes off 16-byte alignment: the kernels must notice and move words one by one."""
    for sample in fc.cases(op, ("small", "medium")):
        for symbol, path in fc.misaligned_paths(emu, op, sample, path_of):
            if symbol != "capsule_broadcast_bwd":
                assert path in (SCALAR, TILE), (sample.case, symbol, path)


def test_each_vector_path_falls_back_off_alignment(emu, path_of):
    """Each 16-byte path, taken on aligned buffers, moves words when the float32 buffers (all of
    them, the inputs only, the outputs only) are 4 bytes off alignment."""
    rng = seeded_rng("view", "vectors")

    def x(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    cases = [
        ("permute", {"x": x(4, 8, 8)}, {"perm": (1, 0, 2)}, [COPY4, COPY4]),
        ("broadcast", {"x": x(3, 1, 8)}, {"shape": (3, 4, 8)}, [COPY4, 0]),
        ("broadcast", {"x": x(5, 1)}, {"shape": (3, 5, 8)}, [FILL4, 1]),
        ("concat", {"xs": (x(2, 4), x(2, 8))}, {"axis": 1}, [1, 1, 1, 1]),
        ("slice", {"x": x(3, 12)}, {"axis": 1, "start": 4, "length": 4}, [1, 1]),
    ]
    for op, inputs, params, vectors in cases:
        sample = sample_of(op, inputs, params, "vectors")
        assert [path for _, path in fc.emulated_paths(emu, op, sample, path_of)] == vectors, (op, params)
        for symbol, path in fc.misaligned_paths(emu, op, sample, path_of):
            if symbol != "capsule_broadcast_bwd":
                assert path == SCALAR, (op, params, symbol)


def test_row_starts_off_16_bytes_take_word_moves(emu, path_of):
    """Rows of a multiple of 4 elements whose starts are not (inner = 2, odd offsets): no vector move."""
    rng = seeded_rng("view", "odd-starts")

    def x(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    cases = [
        ("concat", {"xs": (x(3, 1, 2), x(3, 2, 2), x(3, 1, 2))}, {"axis": 1}),
        ("concat", {"xs": (x(2, 2), x(2, 4), x(2, 2))}, {"axis": 1}),
        ("slice", {"x": x(3, 8, 2)}, {"axis": 1, "start": 1, "length": 2}),
        ("slice", {"x": x(4, 10)}, {"axis": 1, "start": 2, "length": 4}),
        ("permute", {"x": x(4, 2, 6)}, {"perm": (1, 0, 2)}),
        ("broadcast", {"x": x(3, 1, 2)}, {"shape": (3, 2, 2)}),
    ]
    for op, inputs, params in cases:
        paths = fc.emulated_paths(emu, op, sample_of(op, inputs, params, "odd-starts"), path_of)
        assert all(path == 0 for symbol, path in paths if symbol != "capsule_broadcast_bwd"), (op, paths)


def test_bits_survive_every_view(emu):
    """NaN payloads (quiet and signalling), −0 and subnormals move as bits, forward and back."""
    x = np.resize(PAYLOADS, (4, 6, 8))
    cases = [
        ("permute", {"x": x}, {"perm": (2, 0, 1)}),
        ("permute", {"x": x}, {"perm": (1, 0, 2)}),
        ("broadcast", {"x": x[:1]}, {"shape": (3, 4, 6, 8)}),
        ("broadcast", {"x": x[..., :1]}, {"shape": (4, 6, 8)}),
        ("concat", {"xs": (x, x[:, :3])}, {"axis": 1}),
        ("slice", {"x": x}, {"axis": 2, "start": 1, "length": 6}),
        ("reshape", {"x": x}, {"shape": (-1,)}),
    ]
    for op, inputs, params in cases:
        spec = get_spec(op)
        fwd, bwd = plan_functions(registry.lookup(op))
        arrays, p, out_shape = validate(spec, inputs, params, np.float32)
        y = emu.run(fwd(arrays, p), fc.plan_inputs(spec, arrays))["out"]
        assert fc.same_bits(y, spec.forward(arrays, p)), op
        if op != "broadcast":  # its backward adds
            g = np.resize(PAYLOADS[::-1], out_shape)
            got = fc.gradients(spec, emu.run(bwd(arrays, p), {**fc.plan_inputs(spec, arrays), "g": g}))
            want = spec.vjp(arrays, p, y, g)
            for name in spec.differentiable:
                pairs = zip(got[name], want[name]) if isinstance(want[name], tuple) else [(got[name], want[name])]
                for a, b in pairs:
                    assert fc.same_bits(a, b), f"{op} d{name}"


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
                assert lib.host_view_path(sh.ctypes.data, st.ctypes.data, rank, x16, y16, tiles) == plans.view_path(
                    shape, stride, bool(tiles), bool(x16), bool(y16)
                ), (shape, stride, x16, y16, tiles)
            if plans.tile_axis(shape, stride) >= 0:
                assert lib.host_tile_count(sh.ctypes.data, st.ctypes.data, rank) == plans.tile_count(shape, stride)


def with_geometry(plan, shape, stride):
    """A permute or broadcast forward plan launching its kernel on another geometry (not simplified)."""
    geometry = i64(list(shape) + list(stride))
    buffers = tuple(
        Buffer("geometry", "meta", "int64", geometry.size) if b.name == "geometry" else b for b in plan.buffers
    )
    plan = dataclasses.replace(plan, buffers=buffers, host_data={**plan.host_data, "geometry": geometry})
    (launch,) = plan.launches
    return fc.with_launch(plan, args=(*launch.args[:3], len(shape), launch.args[4]))


def test_permute_every_rank_and_permutation_kind(emu, path_of):
    """Ranks 0 to 8, size-1 and empty axes, random permutations: plans and kernels against
    np.transpose; the unsimplified geometry too (the kernels must not depend on the simplification)."""
    rng = seeded_rng("view", "permute-ranks")
    forward = plans.PLANS["permute"][0]
    for rank in range(9):
        for trial in range(12):
            shape = tuple(int(d) for d in rng.integers(1, 6 if rank < 6 else 3, rank))
            if rank and trial == 0:
                shape = shape[:-1] + (0,)
            perm = tuple(int(a) for a in rng.permutation(rank))
            x = rng.standard_normal(shape).astype(np.float32)
            want = np.transpose(x, perm)
            fc.emulated_paths(
                emu, "permute", sample_of("permute", {"x": x}, {"perm": perm}, f"rank{rank}-{trial}"), path_of
            )
            if x.size:
                strides = plans._strides(shape)
                raw = with_geometry(
                    forward({"x": x}, {"perm": perm}), [shape[a] for a in perm], [strides[a] for a in perm]
                )
                assert fc.same_bits(emu.run(raw, {"x": x})["out"], want), (shape, perm)


@pytest.mark.parametrize(
    "shape, perm",
    [
        ((70, 5), (1, 0)),
        ((5, 70), (1, 0)),
        ((3, 33, 65), (0, 2, 1)),
        ((2, 1000), (1, 0)),
        ((1000, 3), (1, 0)),
        ((33, 2, 31, 3), (3, 1, 2, 0)),
        ((4, 64, 64), (2, 1, 0)),
        ((7, 1, 9), (2, 1, 0)),
        ((37, 41), (1, 0)),
    ],
)
def test_permute_tiles_partial_and_batched(emu, path_of, shape, perm):
    """Tiles that overhang both axes, last axes narrower than 32 (TB < 32), batched transposes."""
    x = seeded_rng("view", f"tiles{shape}").standard_normal(shape).astype(np.float32)
    paths = fc.emulated_paths(emu, "permute", sample_of("permute", {"x": x}, {"perm": perm}, "tiles"), path_of)
    assert paths[0] == ("capsule_permute_fwd", TILE)


def test_geometry_simplification():
    assert plans.permute_geometry((48, 128, 257), (2, 0, 1)) == ([257, 6144], [1, 257])
    assert plans.permute_geometry((3, 37), (0, 1)) == ([111], [1])
    assert plans.permute_geometry((2, 1, 3, 1, 2, 3, 1, 2), (7, 2, 5, 0, 3, 6, 1, 4)) == (
        [2, 3, 3, 2, 2],
        [1, 12, 2, 36, 6],
    )
    assert plans.permute_geometry((0, 3, 2), (2, 0, 1)) == ([0], [1])
    assert plans.permute_geometry((), ()) == ([1], [1])
    assert plans.broadcast_geometry((16, 1, 33), (8, 16, 31, 33)) == ([8, 16, 31, 33], [0, 33, 0, 1])
    assert plans.broadcast_geometry((), (3, 37)) == ([111], [0])
    assert plans.broadcast_geometry((1, 3), (0, 3)) == ([0, 3], [0, 1])
    assert plans.broadcast_geometry((2, 1), (5, 3, 2, 7)) == ([15, 2, 7], [0, 1, 0])
    assert plans.broadcast_geometry((), ()) == ([1], [1])


@pytest.mark.parametrize("block", [32, 64, 256, 512, 17, 1])
def test_broadcast_backward_sums_for_any_block(emu, lib, block):
    """Both modes with whole and partial warps: within the error model of a sum of `copies` terms,
    exact for one copy, +0 for none."""
    rng = seeded_rng("view", f"bcast-bwd-{block}")
    spec = get_spec("broadcast")
    cases = [
        ((1, 1531), (64, 1531)),
        ((3, 1), (3, 1000)),
        ((16, 1, 33), (8, 16, 31, 33)),
        ((), (3, 37)),
        ((1, 3), (4099, 3)),
        ((2, 1), (5, 3, 2, 7)),
        ((3, 37), (3, 37)),
        ((1, 3), (0, 3)),
        ((5,), (5,)),
    ]
    for x_shape, target in cases:
        g = rng.standard_normal(target).astype(np.float32)
        arrays, p, _ = validate(spec, {"x": np.zeros(x_shape, np.float32)}, {"shape": target}, np.float32)
        plan = fc.with_launch(plans.PLANS["broadcast"][1](arrays, p), block=(block, 1, 1))
        geometry, rank = i64(plan.host_data["geometry"]), plan.launches[0].args[3]
        assert lib.host_broadcast_row_mode(geometry.ctypes.data, rank) == (geometry[-1] == 0)
        dx = emu.run(plan, {"g": g})["dx"]
        copies = plans.copies(x_shape, target)
        lead = len(target) - len(x_shape)
        axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(x_shape) if d == 1 and target[lead + i] != 1)
        want = g.astype(np.float64).sum(axis=axes).reshape(x_shape)
        got = dx.astype(np.float64)
        bound = copies * 2.0**-24 * np.abs(g).astype(np.float64).sum(axis=axes).reshape(x_shape) * 1.01
        assert (np.abs(got - want) <= bound).all(), (x_shape, target)
        if copies <= 1:
            assert fc.same_bits(dx, want.astype(np.float32)), (x_shape, target)


def test_row_copies_of_concat_and_slice(lib):
    out = i64(np.zeros(6))
    lib.host_rows(0, 5, 3, 7, 10, 4, out.ctypes.data)  # concat fwd: x (5, 3, 7) into y (5, 10, 7) at 4
    assert out.tolist() == [5, 21, 0, 21, 28, 70]
    lib.host_rows(1, 5, 3, 7, 10, 4, out.ctypes.data)  # concat bwd: dx (5, 3, 7) from g at 4
    assert out.tolist() == [5, 21, 28, 70, 0, 21]
    lib.host_rows(2, 5, 10, 7, 2, 3, out.ctypes.data)  # slice fwd: y (5, 3, 7) from x (5, 10, 7) at 2
    assert out.tolist() == [5, 21, 14, 70, 0, 21]


def test_slice_backward_vector_and_scalar_paths(emu, path_of):
    spec = get_spec("slice")
    for (outer, size, inner, start, length), vec in [
        ((3, 8, 4, 2, 5), 1),
        ((3, 8, 1, 2, 5), 0),
        ((2, 9, 4, 0, 9), 1),
        ((2, 9, 4, 9, 0), 1),
        ((1, 5, 3, 1, 3), 0),
    ]:
        g = seeded_rng("view", "slice-bwd").standard_normal((outer, length, inner)).astype(np.float32)
        arrays, p, _ = validate(
            spec,
            {"x": np.zeros((outer, size, inner), np.float32)},
            {"axis": 1, "start": start, "length": length},
            np.float32,
        )
        plan = plans.PLANS["slice"][1](arrays, p)
        assert path_of(plan, plan.launches[0], True) == vec
        want = np.zeros((outer, size, inner), np.float32)
        want[:, start : start + length] = g
        assert fc.same_bits(emu.run(plan, {"g": g})["dx"], want)


# -- plans ----------------------------------------------------------------------------------------------


def _whole_warps(case):
    for plan in case.plans:
        for launch in plan.launches:
            assert launch.block[0] % 32 == 0 and launch.block[1:] == (1, 1)
            if launch.symbol == "capsule_broadcast_bwd":
                assert launch.block[0] <= plans.BROADCAST_BWD_MAX_THREADS


@pytest.mark.parametrize("op", OPS)
def test_plans_are_legal_for_every_sample(op):
    """plan_case_problems (legal, fitting the registers, the declared outputs), in blocks of whole warps."""
    assert fc.plan_case_problems(op, reference_shapes=np.inf, check=_whole_warps) == []


def test_every_kernel_is_launched():
    launched = {
        launch.symbol for op in OPS for case in fc.plan_cases(op) for plan in case.plans for launch in plan.launches
    }
    assert launched == set(SYMBOLS)


def test_reshape_plans_alias_their_input():
    spec = get_spec("reshape")
    for sample in fc.cases("reshape"):
        arrays, p, out_shape = validate(spec, sample.inputs, sample.params, np.float32)
        fwd, bwd = plans.PLANS["reshape"][0](arrays, p), plans.PLANS["reshape"][1](arrays, p)
        assert fwd.launches == bwd.launches == ()
        assert not fwd.launches and dict(fwd.aliases) == {"out": "x"} and dict(bwd.aliases) == {"dx": "g"}
        assert fwd.output_shapes["out"] == out_shape and bwd.output_shapes["dx"] == arrays["x"].shape
        assert plan_problems(fwd, {}) == plan_problems(bwd, {}) == []


def test_planted_launch_faults_are_caught():
    plan, _ = fc.launch_plans("permute", {"x": np.zeros((3, 4, 5), np.float32)}, {"perm": (2, 0, 1)})
    (launch,) = plan.launches
    faults = [
        ("writable", {"args": ("out", "x", *launch.args[2:])}),
        ("geometry needs a buffer", {"args": ("x", "out", 3, *launch.args[3:])}),
        ("rank = ", {"args": (*launch.args[:3], 2**40, launch.args[4])}),
        ("meta buffer geometry", dataclasses.replace(plan, host_data={})),
    ]
    assert fc.missed_launch_faults(plan, fc.symbols("permute"), faults) == []
