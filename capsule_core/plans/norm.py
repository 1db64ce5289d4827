"""Launch plans of the normalisation family (cuda/norm.cu): layer_norm and batch_norm.

layer_norm: one launch forward (a warp per row up to 256 columns, else a block per row); the
backward recomputes the row statistics in its dx launch (capsule_layer_norm_bwd_x leaves them in
the mean/rstd workspaces), then dgamma and dbeta in two deterministic stages: column partial
sums per part of the rows, then a sum over the parts in order.

batch_norm: the forward is capsule_batch_norm_fwd launched three times (stage 0 per-(channel,
part) Welford partials, stage 1 the merge per channel, stage 2 the elementwise pass); the
backward is partials of (statistics, Σg, co-moment) per (channel, part), their merge into mean,
rstd, dgamma, dbeta, then dx elementwise.

Every block has BLOCK threads (a multiple of 32, as the warp reductions need), except the column
partial sums of layer_norm (COLUMN_TILE columns by ROW_LANES rows).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..kernels import KernelBudget, register_budget
from ..launch import GRID_LIMITS, Buffer, Launch, LaunchPlan, grid_1d

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


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def row_grid(rows: int, cols: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """A warp per row for short rows (BLOCK/32 rows per block), a block per row otherwise."""
    per_block = BLOCK // 32 if cols <= WARP_ROW_MAX else 1
    return (max(1, min(MAX_GRID_BLOCKS, _ceil(rows, per_block))), 1, 1), (BLOCK, 1, 1)


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


# -- layer_norm ------------------------------------------------------------------------------------


def _rows_cols(x: np.ndarray) -> tuple[int, int]:
    cols = int(x.shape[-1])
    return int(np.prod(x.shape[:-1], dtype=np.int64)), cols


def layer_norm_forward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
    x = inputs["x"]
    rows, cols = _rows_cols(x)
    grid, block = row_grid(rows, cols)
    buffers = (_f32("x", "input", x.size), _f32("gamma", "input", cols), _f32("beta", "input", cols),
               _f32("out", "output", x.size), _f32("mean", "workspace", rows), _f32("rstd", "workspace", rows))
    launch = Launch("capsule_layer_norm_fwd", grid, block,
                    ("x", "gamma", "beta", "out", "mean", "rstd", rows, cols, np.float32(p["eps"])))
    return LaunchPlan("layer_norm", "forward", buffers, (launch,), output_shapes={"out": tuple(x.shape)})


def layer_norm_backward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
    x = inputs["x"]
    rows, cols = _rows_cols(x)
    parts = column_parts(rows, cols)
    grid, block = row_grid(rows, cols)
    buffers = (_f32("x", "input", x.size), _f32("gamma", "input", cols), _f32("g", "input", x.size),
               _f32("dx", "output", x.size), _f32("dgamma", "output", cols), _f32("dbeta", "output", cols),
               _f32("mean", "workspace", rows), _f32("rstd", "workspace", rows),
               _f32("partial", "workspace", 2 * parts * cols))
    launches = (
        Launch("capsule_layer_norm_bwd_x", grid, block,
               ("x", "gamma", "g", "dx", "mean", "rstd", rows, cols, np.float32(p["eps"]))),
        Launch("capsule_layer_norm_bwd_partials", (max(1, min(_ceil(cols, COLUMN_TILE), GRID_LIMITS[0])), parts, 1),
               (COLUMN_TILE, ROW_LANES, 1), ("x", "g", "mean", "rstd", "partial", rows, cols, parts)),
        Launch("capsule_layer_norm_bwd_params", *grid_1d(cols, BLOCK), ("partial", "dgamma", "dbeta", cols, parts)),
    )
    return LaunchPlan("layer_norm", "backward", buffers, launches,
                      output_shapes={"dx": tuple(x.shape), "dgamma": (cols,), "dbeta": (cols,)})


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
    buffers = (_f32("x", "input", x.size), _f32("gamma", "input", c), _f32("beta", "input", c),
               _f32("out", "output", x.size), _f32("mean", "workspace", c), _f32("rstd", "workspace", c),
               _f32("partial", "workspace", 2 * c * parts))
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
    buffers = (_f32("x", "input", x.size), _f32("gamma", "input", c), _f32("g", "input", x.size),
               _f32("dx", "output", x.size), _f32("dgamma", "output", c), _f32("dbeta", "output", c),
               _f32("mean", "workspace", c), _f32("rstd", "workspace", c), _f32("partial", "workspace", 5 * c * parts))
    launches = (
        Launch("capsule_batch_norm_bwd_partials", _channel_grid(c, parts), (BLOCK, 1, 1), ("x", "g", "partial", n, c, s, parts)),
        Launch("capsule_batch_norm_bwd_params", *grid_1d(c, BLOCK),
               ("partial", "mean", "rstd", "dgamma", "dbeta", n, c, s, parts, np.float32(p["eps"]))),
        Launch("capsule_batch_norm_bwd_x", *_element_grid(x.size),
               ("x", "gamma", "g", "mean", "rstd", "dgamma", "dbeta", "dx", n, c, s)),
    )
    return LaunchPlan("batch_norm", "backward", buffers, launches,
                      output_shapes={"dx": tuple(x.shape), "dgamma": (c,), "dbeta": (c,)})


PLANS = {
    "layer_norm": (layer_norm_forward, layer_norm_backward),
    "batch_norm": (batch_norm_forward, batch_norm_backward),
}


BUDGET = KernelBudget(max_registers=register_budget(BLOCK))
"""A block of BLOCK threads fits on a multiprocessor."""
