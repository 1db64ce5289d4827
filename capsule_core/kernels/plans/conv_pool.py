"""Launch plans of the conv_pool family (cuda/conv_pool.cu).

Every spatial rank is passed padded to 3-D (d, h, w): a missing leading axis has size 1,
kernel 1, stride 1 and padding 0, so one kernel serves ranks 1 to 3.

conv and conv_transpose are implicit GEMMs of 128-thread blocks. The forward and dx kernels
tile (positions × channels) by CORR_TILE and read the weights packed by a launch before them
into a workspace (reduction rows × output channels, so that their loads are coalesced float4);
a correlation (conv forward, conv_transpose dx) over fewer than CORR_BK channels (the stem conv's
3) takes its _flat kernel, whose reduction steps run over (kernel offset, channel) pairs instead
of one kernel offset's zero-padded channel chunk. The dw kernel tiles (channels × channels) at one
kernel offset by WEIGHT_TILE and splits its long reduction over positions into `splits` ranges
when the tiles alone would leave the GPU idle: the partial tiles go to a workspace that a second
launch adds in split order (deterministic, no atomics). db is one block per channel. Every grid
is a grid-stride loop, so any grid is correct; these ones give every block about one tile.

Pools: one thread per output (forward) or per input cell (backward, a gather over the windows
covering it). max_pool's backward first writes every window's argmax (its first maximum, a cell of
its plane) to a workspace, so that the gather reads one index per covering window instead of the
window: int32, or int64 (the _wide kernels) for planes of ARGMAX32_LIMIT cells or more.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from capsule_core.kernels.launch import Buffer, Launch, LaunchPlan, grid_1d
from capsule_core.kernels.nvcc import KernelBudget, register_budget

GEMM_THREADS = 128
CORR_TILE = (128, 32)
"""Rows (output positions) × columns (output channels) of a forward / dx block tile."""
CORR_BK = 16
"""Reduction rows per step of a forward / dx GEMM."""
WEIGHT_TILE = (32, 32, 32)
"""Channels of the windowed operand × channels of the positional operand × positions per step (dw)."""
SUM_THREADS = 256
POOL_THREADS = 256
ARGMAX32_LIMIT = 2**31
"""max_pool's backward: planes of this many cells or more keep their argmax in int64."""
MAX_BLOCKS = 132 * 32
"""Grid cap (an H200 has 132 multiprocessors); blocks loop over further tiles."""
SPLIT_TARGET_BLOCKS = 132 * 4
"""dw: split the reduction until the grid has about this many blocks ..."""
MIN_STEPS_PER_SPLIT = 8
"""... while every split keeps at least this many reduction steps ..."""
MAX_PARTIAL_ELEMENTS = 1 << 24
"""... and the partials stay within 64 MiB."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _per_axis(value, rank: int) -> tuple[int, ...]:
    return (int(value),) * rank if isinstance(value, (int, np.integer)) else tuple(int(v) for v in value)


def _pad3(values: tuple[int, ...], fill: int) -> tuple[int, ...]:
    return (fill,) * (3 - len(values)) + tuple(values)


def window_out_len(size: int, k: int, s: int, p: int) -> int:
    """capsule_window_out_len (cuda/common.cuh)."""
    span = size + 2 * p - k
    return 0 if span < 0 else span // s + 1


def transpose_out_len(size: int, k: int, s: int, p: int) -> int:
    """capsule_transpose_out_len (cuda/common.cuh)."""
    return max(0, (size - 1) * s + k - 2 * p)


def _geometry(sizes, out_sizes, kernel, stride, padding) -> tuple[int, ...]:
    """d, h, w, od, oh, ow, kd, kh, kw, sd, sh, sw, pd, ph, pw (the registry's _GEOM)."""
    return (*_pad3(sizes, 1), *_pad3(out_sizes, 1), *_pad3(kernel, 1), *_pad3(stride, 1), *_pad3(padding, 0))


def _volume(sizes) -> int:
    return int(np.prod(sizes, dtype=np.int64)) if len(sizes) else 1


# -- conv and conv_transpose --------------------------------------------------------------------


def _conv_shapes(inputs: Mapping[str, Any], p: Mapping[str, Any], transposed: bool):
    x, w = np.shape(inputs["x"]), np.shape(inputs["w"])
    r = len(x) - 2
    kernel, stride, padding = tuple(w[2:]), _per_axis(p["stride"], r), _per_axis(p["padding"], r)
    c_out = w[1] if transposed else w[0]
    length = transpose_out_len if transposed else window_out_len
    out = tuple(length(n, k, s, q) for n, k, s, q in zip(x[2:], kernel, stride, padding))
    scalars = (x[0], x[1], c_out, *_geometry(x[2:], out, kernel, stride, padding))
    return x, tuple(w), out, c_out, scalars


def corr_grid(rows: int, channels: int) -> tuple[int, int, int]:
    """One block per (CORR_TILE) tile of the (rows × channels) output, capped."""
    tiles = _cdiv(rows, CORR_TILE[0]) * _cdiv(channels, CORR_TILE[1])
    return (max(1, min(tiles, MAX_BLOCKS)), 1, 1)


def corr_flat(reduction_channels: int, correlation: bool) -> bool:
    """Flatten (kernel offset, channel) into one reduction index when a channel chunk would be
    mostly zero padding: correlations only (conv forward, conv_transpose dx), whose flattened
    gather is an offset walk; the transposed ones would need a division per element."""
    return correlation and reduction_channels < CORR_BK


def packed_elements(reduction_channels: int, out_channels: int, kernel_volume: int, flat: bool) -> int:
    """The packed weights of a forward / dx GEMM: kernel_volume · group rows (group: the channels,
    rounded up to CORR_BK unless flattened) padded to a multiple of CORR_BK, by out_channels
    padded to a multiple of CORR_TILE[1] (corr_rows, corr_cols in conv_pool.cuh)."""
    group = reduction_channels if flat else _cdiv(reduction_channels, CORR_BK) * CORR_BK
    return _cdiv(kernel_volume * group, CORR_BK) * CORR_BK * _cdiv(out_channels, CORR_TILE[1]) * CORR_TILE[1]


def corr_launches(
    symbol: str,
    operands: tuple[str, ...],
    reduction_channels: int,
    out_channels: int,
    kernel_volume: int,
    rows: int,
    correlation: bool,
    scalars: tuple,
) -> tuple[Buffer, Launch, Launch]:
    """The workspace `packed`, the launch that packs the weights into it, then the GEMM (its _flat
    kernel when corr_flat): operands are the GEMM's buffer arguments, "packed" in the weights' place."""
    flat = corr_flat(reduction_channels, correlation)
    count = packed_elements(reduction_channels, out_channels, kernel_volume, flat)
    return (
        Buffer("packed", "workspace", "float32", count),
        Launch(f"{symbol}_pack", *grid_1d(count, SUM_THREADS), ("w", "packed", *scalars, int(flat))),
        Launch(
            f"{symbol}_flat" if flat else symbol,
            corr_grid(rows, out_channels),
            (GEMM_THREADS, 1, 1),
            (*operands, *scalars),
        ),
    )


def weight_splits(positions: int, x_channels: int, g_channels: int, kernel_volume: int) -> int:
    """How many position ranges the dw reduction is split into (1: no partials)."""
    tiles = _cdiv(x_channels, WEIGHT_TILE[0]) * _cdiv(g_channels, WEIGHT_TILE[1]) * kernel_volume
    steps = _cdiv(positions, WEIGHT_TILE[2])
    count = x_channels * g_channels * kernel_volume
    if tiles == 0 or steps == 0:
        return 1
    return max(1, min(_cdiv(SPLIT_TARGET_BLOCKS, tiles), steps // MIN_STEPS_PER_SPLIT, MAX_PARTIAL_ELEMENTS // count))


def _conv_plans(op: str, transposed: bool):
    def forward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
        x, w, out, c_out, scalars = _conv_shapes(inputs, p, transposed)
        y = (x[0], c_out, *out)
        packed, *launches = corr_launches(
            f"capsule_{op}_fwd",
            ("x", "packed", "b", "out"),
            x[1],
            c_out,
            _volume(w[2:]),
            x[0] * _volume(out),
            not transposed,
            scalars,
        )
        buffers = (
            Buffer("x", "input", "float32", _volume(x)),
            Buffer("w", "input", "float32", _volume(w)),
            Buffer("b", "input", "float32", c_out),
            Buffer("out", "output", "float32", _volume(y)),
            packed,
        )
        return LaunchPlan(op, "forward", buffers, tuple(launches), output_shapes={"out": y})

    def backward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
        x, w, out, c_out, scalars = _conv_shapes(inputs, p, transposed)
        n, c_in, kv = x[0], x[1], _volume(w[2:])
        y = (n, c_out, *out)
        # dw[gc, xc, k] sums over the positions of the operand that is not read through windows.
        positions, g_channels, x_channels = (
            (n * _volume(x[2:]), c_in, c_out) if transposed else (n * _volume(out), c_out, c_in)
        )
        splits = weight_splits(positions, x_channels, g_channels, kv)
        count = _volume(w)
        block = (GEMM_THREADS, 1, 1)
        buffers = [
            Buffer("x", "input", "float32", _volume(x)),
            Buffer("w", "input", "float32", count),
            Buffer("g", "input", "float32", _volume(y)),
            Buffer("dx", "output", "float32", _volume(x)),
            Buffer("dw", "output", "float32", count),
            Buffer("db", "output", "float32", c_out),
        ]
        weight_tiles = _cdiv(x_channels, WEIGHT_TILE[0]) * _cdiv(g_channels, WEIGHT_TILE[1]) * kv * splits
        weight_grid = (max(1, min(weight_tiles, MAX_BLOCKS)), 1, 1)
        # dx is a GEMM over the c_out channels of g into the c_in channels of x.
        packed, *launches = corr_launches(
            f"capsule_{op}_bwd_x", ("g", "packed", "dx"), c_out, c_in, kv, n * _volume(x[2:]), transposed, scalars
        )
        buffers.append(packed)
        if splits == 1:
            # The kernel writes dw directly and never touches `partial`.
            launches.append(Launch(f"capsule_{op}_bwd_w", weight_grid, block, ("x", "g", "dw", "dw", *scalars, 1)))
        else:
            buffers.append(Buffer("dw_partial", "workspace", "float32", splits * count))
            launches += [
                Launch(f"capsule_{op}_bwd_w", weight_grid, block, ("x", "g", "dw", "dw_partial", *scalars, splits)),
                Launch(
                    f"capsule_{op}_bwd_wsum",
                    *grid_1d(_cdiv(count, 4), SUM_THREADS),
                    ("dw_partial", "dw", count, splits),
                ),
            ]
        launches.append(
            Launch(
                f"capsule_{op}_bwd_b",
                (max(1, min(c_out, MAX_BLOCKS)), 1, 1),
                (SUM_THREADS, 1, 1),
                ("g", "db", *scalars),
            )
        )
        return LaunchPlan(
            op,
            "backward",
            tuple(buffers),
            tuple(launches),
            output_shapes={"dx": tuple(x), "dw": tuple(w), "db": (c_out,)},
        )

    return forward, backward


# -- pools -------------------------------------------------------------------------------------------


def _pool_shapes(inputs: Mapping[str, Any], p: Mapping[str, Any]):
    x = np.shape(inputs["x"])
    r = len(x) - 2
    kernel = _per_axis(p["kernel"], r)
    stride = kernel if p["stride"] is None else _per_axis(p["stride"], r)
    padding = _per_axis(p["padding"], r)
    out = tuple(window_out_len(n, k, s, q) for n, k, s, q in zip(x[2:], kernel, stride, padding))
    return tuple(x), (*x[:2], *out), (x[0] * x[1], *_geometry(x[2:], out, kernel, stride, padding))


def _pool_plans(op: str, backward_reads: tuple[str, ...], float_params: tuple[str, ...] = ()):
    """backward_reads: the buffers capsule_<op>_bwd reads before g ("out" is the forward result)."""

    def forward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
        x, y, scalars = _pool_shapes(inputs, p)
        extra = tuple(np.float32(p[k]) for k in float_params)
        buffers = (Buffer("x", "input", "float32", _volume(x)), Buffer("out", "output", "float32", _volume(y)))
        launch = Launch(f"capsule_{op}_fwd", *grid_1d(_volume(y), POOL_THREADS), ("x", "out", *scalars, *extra))
        return LaunchPlan(op, "forward", buffers, (launch,), output_shapes={"out": y})

    def backward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
        x, y, scalars = _pool_shapes(inputs, p)
        extra = tuple(np.float32(p[k]) for k in float_params)
        sizes = {"x": _volume(x), "out": _volume(y)}
        buffers = tuple(Buffer(name, "input", "float32", sizes[name]) for name in backward_reads) + (
            Buffer("g", "input", "float32", _volume(y)),
            Buffer("dx", "output", "float32", _volume(x)),
        )
        launch = Launch(
            f"capsule_{op}_bwd", *grid_1d(_volume(x), POOL_THREADS), (*backward_reads, "g", "dx", *scalars, *extra)
        )
        return LaunchPlan(op, "backward", buffers, (launch,), output_shapes={"dx": x})

    return forward, backward


def _max_pool_backward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
    """Every window's first maximum into an integer workspace (one thread per output), then the
    gather over the covering windows' argmax (one thread per input cell)."""
    x, y, scalars = _pool_shapes(inputs, p)
    wide = _volume(x[2:]) >= ARGMAX32_LIMIT
    suffix, index = ("_wide", "int64") if wide else ("", "int32")
    buffers = (
        Buffer("x", "input", "float32", _volume(x)),
        Buffer("g", "input", "float32", _volume(y)),
        Buffer("dx", "output", "float32", _volume(x)),
        Buffer("argmax", "workspace", index, _volume(y)),
    )
    launches = (
        Launch(f"capsule_max_pool_bwd_argmax{suffix}", *grid_1d(_volume(y), POOL_THREADS), ("x", "argmax", *scalars)),
        Launch(f"capsule_max_pool_bwd{suffix}", *grid_1d(_volume(x), POOL_THREADS), ("argmax", "g", "dx", *scalars)),
    )
    return LaunchPlan("max_pool", "backward", buffers, launches, output_shapes={"dx": x})


PLANS = {
    "conv": _conv_plans("conv", False),
    "conv_transpose": _conv_plans("conv_transpose", True),
    "max_pool": (_pool_plans("max_pool", ())[0], _max_pool_backward),
    "smooth_max_pool": _pool_plans("smooth_max_pool", ("x", "out"), ("beta",)),
    "avg_pool": _pool_plans("avg_pool", ()),
}


GEMM_MIN_BLOCKS = {
    "capsule_conv_fwd": 4,
    "capsule_conv_fwd_flat": 4,
    "capsule_conv_bwd_x": 4,
    "capsule_conv_bwd_w": 6,
    "capsule_conv_transpose_fwd": 4,
    "capsule_conv_transpose_bwd_x": 4,
    "capsule_conv_transpose_bwd_x_flat": 4,
    "capsule_conv_transpose_bwd_w": 6,
}
"""The implicit-GEMM kernels' __launch_bounds__(GEMM_THREADS, blocks)."""

POOL_MIN_BLOCKS = {
    "capsule_max_pool_fwd": 4,
    "capsule_max_pool_bwd_argmax": 4,
    "capsule_max_pool_bwd_argmax_wide": 4,
    "capsule_max_pool_bwd": 4,
    "capsule_max_pool_bwd_wide": 4,
}
"""Memory-bound pool kernels with __launch_bounds__(POOL_THREADS, blocks): at least 50 % occupancy."""

BUDGET = KernelBudget(
    max_registers=register_budget(max(POOL_THREADS, SUM_THREADS)),
    registers={
        **{name: register_budget(GEMM_THREADS, blocks) for name, blocks in GEMM_MIN_BLOCKS.items()},
        **{name: register_budget(POOL_THREADS, blocks) for name, blocks in POOL_MIN_BLOCKS.items()},
    },
)
"""The GEMM kernels keep GEMM_MIN_BLOCKS blocks per multiprocessor, the POOL_MIN_BLOCKS kernels
theirs; the others fit a block."""
