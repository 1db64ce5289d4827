"""Launch plans of the normalisation family (cuda/norm.cu): layer_norm and batch_norm.

layer_norm: rows up to WARP_ROW_MAX columns get a warp each (capsule_layer_norm_fwd/_bwd_x); wide
rows (cols a multiple of 4, up to WIDE_FWD_MAX forward and WIDE_BWD_MAX backward) get a block each
that holds the row in registers (capsule_layer_norm_fwd_wide; capsule_layer_norm_bwd_x_wide, a
block per part of the rows, which also writes the part's column sums for dgamma and dbeta);
other rows a block each, streamed (the general kernels). The general backward recomputes the row
statistics in its dx launch (leaving them in the mean/rstd workspaces), then takes column partial
sums per part of the rows; both backwards end with capsule_layer_norm_bwd_params, the sum over the
parts in order.

batch_norm: the forward is capsule_batch_norm_fwd launched three times (stage 0 per-(channel,
part) Welford partials, stage 1 the merge per channel, stage 2 the elementwise pass); the
backward is partials of (statistics, Σg, co-moment) per (channel, part), their merge into mean,
rstd, dgamma, dbeta, then dx elementwise.

Every block has BLOCK threads (a multiple of 32, as the warp reductions need), except the wide
layer_norm kernels (wide_threads: a multiple of 32, at most WIDE_MAX_THREADS) and the column
partial sums of layer_norm (COLUMN_TILE columns by ROW_LANES rows).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from capsule_core.kernels.launch import GRID_LIMITS, Buffer, Launch, LaunchPlan, grid_1d
from capsule_core.kernels.nvcc import KernelBudget, register_budget

BLOCK = 256
WARP_ROW_MAX = 256
"""Rows up to this many columns get one warp each (cuda/norm.cu's kWarpRowMax)."""
COLUMN_TILE, ROW_LANES = 32, 8
TARGET_BLOCKS = 132 * 8
"""Enough blocks for every H200 multiprocessor several times over."""
MAX_GRID_BLOCKS = 132 * 32
ELEMENT_PART = 2048
"""At least this many elements per (channel, part) block of the batch_norm partial statistics."""
ROW_PART = 32
"""At least this many rows per part of layer_norm's column partial sums."""
WIDE_MAX_THREADS = 1024
WIDE_FWD_FLOATS, WIDE_BWD_FLOATS = 16, 8
"""Floats of the row each thread of the wide kernels holds (cuda/norm.cu's 4·kWideFwdGroups and
4·kWideBwdGroups)."""
WIDE_FWD_MAX, WIDE_BWD_MAX = WIDE_FWD_FLOATS * WIDE_MAX_THREADS, WIDE_BWD_FLOATS * WIDE_MAX_THREADS
WIDE_MIN_THREADS = 128
WIDE_BWD_THREADS_PER_SM = 1024
"""Threads of capsule_layer_norm_bwd_x_wide a multiprocessor holds (64 registers each)."""
WIDE_ROW_PART = 8
"""Rows per part of the wide backward beyond one block per multiprocessor (its column partials
cost 2·cols floats a part, written and read once)."""
SMS = 132


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def row_grid(rows: int, cols: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """The general kernels: a warp per row for short rows (BLOCK/32 rows per block), a block per row otherwise."""
    per_block = BLOCK // 32 if cols <= WARP_ROW_MAX else 1
    return (max(1, min(MAX_GRID_BLOCKS, _ceil(rows, per_block))), 1, 1), (BLOCK, 1, 1)


def wide_threads(cols: int, floats: int) -> int:
    """Threads of a wide-row block holding `floats` of the row each (a multiple of 32), or 0 when
    the row is not wide: short enough for a warp, longer than a block holds, or cols % 4 != 0."""
    if cols <= WARP_ROW_MAX or cols % 4 or cols > floats * WIDE_MAX_THREADS:
        return 0
    return max(WIDE_MIN_THREADS, 32 * _ceil(cols, 32 * floats))


def wide_parts(rows: int, threads: int) -> int:
    """Parts of the rows for the wide backward: a block per multiprocessor at least (as rows allow),
    up to one wave of blocks while each part keeps WIDE_ROW_PART rows (the column partials of a
    part cost as much traffic as 4/3 of a row)."""
    wave = SMS * max(1, WIDE_BWD_THREADS_PER_SM // threads)
    return max(1, min(rows, max(SMS, min(wave, _ceil(rows, WIDE_ROW_PART))), GRID_LIMITS[0]))


def column_parts(rows: int, cols: int) -> int:
    """Parts of the rows for the column partial sums: enough blocks, at least ROW_PART rows each."""
    tiles = max(1, _ceil(cols, COLUMN_TILE))
    return max(1, min(_ceil(rows, ROW_PART), _ceil(TARGET_BLOCKS, tiles), GRID_LIMITS[1]))


def channel_parts(per_channel: int, channels: int) -> int:
    """Parts of each channel's N·S elements: enough blocks, at least ELEMENT_PART elements each."""
    return max(1, min(_ceil(per_channel, ELEMENT_PART), _ceil(TARGET_BLOCKS, max(1, channels)), GRID_LIMITS[1]))


def _channel_grid(channels: int, parts: int) -> tuple[int, int, int]:
    return (max(1, min(channels, GRID_LIMITS[0])), parts, 1)


def _f32(name: str, role: str, n: int) -> Buffer:
    return Buffer(name, role, "float32", int(n))


def _statistics(count: int) -> tuple[Buffer, Buffer]:
    """The mean and rstd workspaces: one entry per row (layer_norm) or per channel (batch_norm)."""
    return _f32("mean", "workspace", count), _f32("rstd", "workspace", count)


def _forward_buffers(size: int, features: int, statistics: int) -> tuple[Buffer, ...]:
    """Both forwards': x, the per-feature gamma and beta, out, and the statistics workspaces."""
    return (
        _f32("x", "input", size),
        _f32("gamma", "input", features),
        _f32("beta", "input", features),
        _f32("out", "output", size),
    ) + _statistics(statistics)


def _backward_buffers(size: int, features: int) -> tuple[Buffer, ...]:
    """Both backwards' inputs x, gamma, g and outputs dx, dgamma, dbeta."""
    return (
        _f32("x", "input", size),
        _f32("gamma", "input", features),
        _f32("g", "input", size),
        _f32("dx", "output", size),
        _f32("dgamma", "output", features),
        _f32("dbeta", "output", features),
    )


# -- layer_norm ------------------------------------------------------------------------------------


def _rows_cols(x: np.ndarray) -> tuple[int, int]:
    cols = int(x.shape[-1])
    return int(np.prod(x.shape[:-1], dtype=np.int64)), cols


def layer_norm_forward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
    x = inputs["x"]
    rows, cols = _rows_cols(x)
    buffers = _forward_buffers(x.size, cols, rows)
    args = ("x", "gamma", "beta", "out", "mean", "rstd", rows, cols, np.float32(p["eps"]))
    threads = wide_threads(cols, WIDE_FWD_FLOATS)
    if threads:
        launch = Launch(
            "capsule_layer_norm_fwd_wide", (max(1, min(MAX_GRID_BLOCKS, rows)), 1, 1), (threads, 1, 1), args
        )
    else:
        launch = Launch("capsule_layer_norm_fwd", *row_grid(rows, cols), args)
    return LaunchPlan("layer_norm", "forward", buffers, (launch,), output_shapes={"out": tuple(x.shape)})


def layer_norm_backward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
    x = inputs["x"]
    rows, cols = _rows_cols(x)
    eps = np.float32(p["eps"])
    threads = wide_threads(cols, WIDE_BWD_FLOATS)
    parts = wide_parts(rows, threads) if threads else column_parts(rows, cols)
    io_buffers = _backward_buffers(x.size, cols)
    partial = _f32("partial", "workspace", 2 * parts * cols)
    params = Launch("capsule_layer_norm_bwd_params", *grid_1d(cols, BLOCK), ("partial", "dgamma", "dbeta", cols, parts))
    if threads:
        buffers = io_buffers + (partial,)
        launches = (
            Launch(
                "capsule_layer_norm_bwd_x_wide",
                (parts, 1, 1),
                (threads, 1, 1),
                ("x", "gamma", "g", "dx", "partial", rows, cols, parts, eps),
            ),
            params,
        )
    else:
        grid, block = row_grid(rows, cols)
        buffers = io_buffers + _statistics(rows) + (partial,)
        launches = (
            Launch("capsule_layer_norm_bwd_x", grid, block, ("x", "gamma", "g", "dx", "mean", "rstd", rows, cols, eps)),
            Launch(
                "capsule_layer_norm_bwd_partials",
                (max(1, min(_ceil(cols, COLUMN_TILE), GRID_LIMITS[0])), parts, 1),
                (COLUMN_TILE, ROW_LANES, 1),
                ("x", "g", "mean", "rstd", "partial", rows, cols, parts),
            ),
            params,
        )
    return LaunchPlan(
        "layer_norm",
        "backward",
        buffers,
        launches,
        output_shapes={"dx": tuple(x.shape), "dgamma": (cols,), "dbeta": (cols,)},
    )


# -- batch_norm ------------------------------------------------------------------------------------


def _ncs(x: np.ndarray) -> tuple[int, int, int]:
    return int(x.shape[0]), int(x.shape[1]), int(np.prod(x.shape[2:], dtype=np.int64))


def _element_grid(total: int):
    """The elementwise passes move float4 vectors: about one vector per thread."""
    return grid_1d(_ceil(total, 4), BLOCK)


def batch_norm_forward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
    x = inputs["x"]
    n, c, s = _ncs(x)
    parts = channel_parts(n * s, c)
    eps = np.float32(p["eps"])
    buffers = _forward_buffers(x.size, c, c) + (_f32("partial", "workspace", 2 * c * parts),)
    args = ("x", "gamma", "beta", "out", "mean", "rstd", "partial", n, c, s, parts, eps)
    launches = (
        Launch("capsule_batch_norm_fwd", _channel_grid(c, parts), (BLOCK, 1, 1), args + (0,)),
        Launch("capsule_batch_norm_fwd", *grid_1d(c, BLOCK), args + (1,)),
        Launch("capsule_batch_norm_fwd", *_element_grid(x.size), args + (2,)),
    )
    return LaunchPlan("batch_norm", "forward", buffers, launches, output_shapes={"out": tuple(x.shape)})


def batch_norm_backward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
    x = inputs["x"]
    n, c, s = _ncs(x)
    parts = channel_parts(n * s, c)
    buffers = _backward_buffers(x.size, c) + _statistics(c) + (_f32("partial", "workspace", 5 * c * parts),)
    launches = (
        Launch(
            "capsule_batch_norm_bwd_partials",
            _channel_grid(c, parts),
            (BLOCK, 1, 1),
            ("x", "g", "partial", n, c, s, parts),
        ),
        Launch(
            "capsule_batch_norm_bwd_params",
            *grid_1d(c, BLOCK),
            ("partial", "mean", "rstd", "dgamma", "dbeta", n, c, s, parts, np.float32(p["eps"])),
        ),
        Launch(
            "capsule_batch_norm_bwd_x",
            *_element_grid(x.size),
            ("x", "gamma", "g", "mean", "rstd", "dgamma", "dbeta", "dx", n, c, s),
        ),
    )
    return LaunchPlan(
        "batch_norm", "backward", buffers, launches, output_shapes={"dx": tuple(x.shape), "dgamma": (c,), "dbeta": (c,)}
    )


PLANS = {
    "layer_norm": (layer_norm_forward, layer_norm_backward),
    "batch_norm": (batch_norm_forward, batch_norm_backward),
}


BUDGET = KernelBudget(
    max_registers=register_budget(BLOCK),
    registers={
        "capsule_layer_norm_fwd_wide": register_budget(WIDE_MAX_THREADS),
        "capsule_layer_norm_bwd_x_wide": register_budget(WIDE_BWD_THREADS_PER_SM),
    },
)
"""A block of BLOCK threads fits on a multiprocessor; the wide kernels' a block of
WIDE_MAX_THREADS (the backward's 64 registers are what wide_parts sizes its wave by)."""
