"""Launch plans of the row normalisations (cuda/softmax.cu): softmax, log_softmax, hard_masked_softmax.

x (…, D) is rows × cols with cols = D ≥ 1. One launch per direction. The kernels pick their path
from cols alone (cuda/softmax.cuh): rows of up to GROUP_COLS columns (GRAD_GROUP_COLS backward)
go to groups of 1 to 32 lanes, several rows per warp and up to 8 rows per group at a time; longer
rows take a block each. The plans
mirror that choice only to size the grid: any grid is correct (grid-stride loops over rows).

The backward reads the forward's result: its plan names it "out", an input of the backward
launch (the backend runs the forward first and passes its output buffer).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..kernels import KernelBudget, register_budget
from ..launch import Buffer, Launch, LaunchPlan

THREADS = 256
"""CAPSULE_SOFTMAX_THREADS: the kernels' __launch_bounds__ and the block of every launch."""
GROUP_COLS = 1024
"""CAPSULE_SOFTMAX_GROUP_COLS: the longest row a lane group holds (forward)."""
GRAD_GROUP_COLS = 512
"""CAPSULE_SOFTMAX_GRAD_GROUP_COLS: the same for the backward, which holds y and g."""
MAX_BLOCKS = 132 * 32
"""32 blocks per H200 multiprocessor; beyond that the blocks loop over rows."""


def rows_and_cols(shape) -> tuple[int, int]:
    cols = int(shape[-1])
    return int(np.prod(shape[:-1], dtype=np.int64)), cols


def lanes(cols: int) -> int:
    """capsule_softmax_lanes: lanes per row on the group path."""
    g = 1
    while g < 32 and g < cols:
        g *= 2
    return g


def values(cols: int) -> int:
    """capsule_softmax_values: values per lane on the group path."""
    v, g = 1, lanes(cols)
    while g * v < cols:
        v *= 2
    return v


def batch(cols: int) -> int:
    """capsule_softmax_batch: rows a lane group takes at a time."""
    return 8 // values(cols) if values(cols) <= 4 else 1


def grid(rows: int, cols: int, group_cols: int) -> tuple[int, int, int]:
    """Enough blocks for one batch of rows per lane group (group path) or a row per block."""
    if cols > group_cols:
        blocks = rows
    else:
        rows_per_block = (THREADS // 32) * (32 // lanes(cols)) * batch(cols)
        blocks = -(-rows // rows_per_block)
    return (max(1, min(MAX_BLOCKS, blocks)), 1, 1)


def _forward(op: str, masked: bool):
    def plan(inputs: Mapping[str, Any], params: Mapping[str, Any]) -> LaunchPlan:
        shape = tuple(np.shape(inputs["x"]))
        n = int(np.prod(shape, dtype=np.int64))
        rows, cols = rows_and_cols(shape)
        names = ("x", "mask") if masked else ("x",)
        buffers = tuple(Buffer(b, "input", "float32", n) for b in names) + (Buffer("out", "output", "float32", n),)
        launch = Launch(f"capsule_{op}_fwd", grid(rows, cols, GROUP_COLS), (THREADS, 1, 1), (*names, "out", rows, cols))
        return LaunchPlan(op, "forward", buffers, (launch,), output_shapes={"out": shape})
    return plan


def _backward(op: str, masked: bool):
    def plan(inputs: Mapping[str, Any], params: Mapping[str, Any]) -> LaunchPlan:
        shape = tuple(np.shape(inputs["x"]))
        n = int(np.prod(shape, dtype=np.int64))
        rows, cols = rows_and_cols(shape)
        names = ("x", "mask") if masked else ("x",)
        buffers = (tuple(Buffer(b, "input", "float32", n) for b in (*names, "out", "g"))
                   + (Buffer("dx", "output", "float32", n),))
        launch = Launch(f"capsule_{op}_bwd", grid(rows, cols, GRAD_GROUP_COLS), (THREADS, 1, 1),
                        ("out", "g", "dx", rows, cols))
        return LaunchPlan(op, "backward", buffers, (launch,), output_shapes={"dx": shape})
    return plan


PLANS = {
    "log_softmax": (_forward("log_softmax", False), _backward("log_softmax", False)),
    "softmax": (_forward("softmax", False), _backward("softmax", False)),
    "hard_masked_softmax": (_forward("hard_masked_softmax", True), _backward("hard_masked_softmax", True)),
}


BUDGET = KernelBudget(max_registers=register_budget(THREADS, 4))
"""Four blocks of THREADS per multiprocessor."""
