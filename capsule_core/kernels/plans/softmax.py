"""Launch plans of the row normalisations (cuda/softmax.cu): softmax, log_softmax, hard_masked_softmax.

x (…, D) is rows × cols with cols = D ≥ 1. Three paths, each with entry points of its own:
- rows of up to GROUP_COLS columns (GRAD_GROUP_COLS backward): capsule_<op>_<dir>, groups of 1 to
  32 lanes, several rows per warp and up to 8 rows per group at a time (cuda/softmax.cuh);
- longer rows, enough of them to fill the device: capsule_<op>_<dir>_block, a block per row;
- few long rows (fewer than SPLIT_ROWS, at least SPLIT_MIN_COLS columns): the split-row path, two
  launches. capsule_<op>_<dir>_partials cuts each row into chunks (split_chunk) and writes per
  chunk its maximum and sum of exp (forward) or its share of the row dot (backward) into a
  workspace; capsule_<op>_<dir>_finish, a block per chunk, combines the row's partials in a fixed
  order and writes the chunk. Deterministic: no atomics, the same bits run to run.
The plans mirror the kernels' path choice to size the grid: any grid is correct (grid-stride loops
over rows or chunks), and the group kernels take any row length.

The backward reads the forward's result: its plan names it "out", an input of the backward
launch (the backend runs the forward first and passes its output buffer).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from capsule_core.kernels.launch import Buffer, Launch, LaunchPlan, warp_lanes
from capsule_core.kernels.nvcc import KernelBudget, register_budget

THREADS = 256
"""CAPSULE_SOFTMAX_THREADS: the kernels' __launch_bounds__ and the block of every launch."""
GROUP_COLS = 1024
"""CAPSULE_SOFTMAX_GROUP_COLS: the longest row a lane group holds (forward)."""
GRAD_GROUP_COLS = 512
"""CAPSULE_SOFTMAX_GRAD_GROUP_COLS: the same for the backward, which holds y and g."""
MAX_BLOCKS = 132 * 32
"""32 blocks per H200 multiprocessor; beyond that the blocks loop over rows."""
GROUP_BLOCKS = 4
"""CAPSULE_SOFTMAX_GROUP_BLOCKS: blocks per multiprocessor the group kernels are built for."""
LEAN_BLOCKS = 8
"""CAPSULE_SOFTMAX_LEAN_BLOCKS: the same for the block and split-row kernels (32 registers)."""
TARGET_BLOCKS = LEAN_BLOCKS * 132
"""Blocks the split-row path aims at: one full wave of the lean kernels on an H200."""
SPLIT_ROWS = TARGET_BLOCKS // 2
"""Fewer rows than this (half a wave of blocks or less) take the split-row path when long enough."""
SPLIT_MIN_COLS = 4096
"""Rows shorter than this never split (a chunk is at least MIN_CHUNK columns)."""
MIN_CHUNK = 2048
"""The shortest chunk: 8 columns per thread of a block."""
CHUNK_QUANTUM = 1024
"""Chunks are multiples of this: one float4 per thread of a block."""


def rows_and_cols(shape) -> tuple[int, int]:
    cols = int(shape[-1])
    return int(np.prod(shape[:-1], dtype=np.int64)), cols


def lanes(cols: int) -> int:
    """capsule_softmax_lanes: lanes per row on the group path."""
    return warp_lanes(cols)


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


def chunks_of(cols: int, chunk: int) -> int:
    """capsule_softmax_chunks: chunks per row (chunk <= 0 or >= cols: one)."""
    return 1 if chunk <= 0 or chunk >= cols else -(-cols // chunk)


def split_chunk(rows: int, cols: int) -> int:
    """The chunk of the split-row path, or 0 when a block per row keeps the device busy (or the
    rows are too short to cut): about TARGET_BLOCKS chunks in all, each a multiple of
    CHUNK_QUANTUM and at least MIN_CHUNK columns."""
    if rows == 0 or rows >= SPLIT_ROWS or cols < SPLIT_MIN_COLS:
        return 0
    chunk = -(-cols // -(-TARGET_BLOCKS // rows))
    chunk = max(MIN_CHUNK, -(-chunk // CHUNK_QUANTUM) * CHUNK_QUANTUM)
    return chunk if chunks_of(cols, chunk) > 1 else 0


def split_grid(rows: int, cols: int, chunk: int) -> tuple[int, int, int]:
    """A block per chunk, capped."""
    return (max(1, min(MAX_BLOCKS, rows * chunks_of(cols, chunk))), 1, 1)


def _launches(
    op: str, direction: str, rows: int, cols: int, group_cols: int, inputs: tuple[str, ...], output: str
) -> tuple[tuple[Launch, ...], tuple[Buffer, ...]]:
    """The launches of one direction and the workspace they need: `inputs` the buffers the kernels
    read (x[, mask] forward; out, g backward), `output` the one they write."""
    block = (THREADS, 1, 1)
    if cols <= group_cols:
        return (
            Launch(f"capsule_{op}_{direction}", grid(rows, cols, group_cols), block, (*inputs, output, rows, cols)),
        ), ()
    chunk = split_chunk(rows, cols)
    if not chunk:
        return (
            Launch(
                f"capsule_{op}_{direction}_block", grid(rows, cols, group_cols), block, (*inputs, output, rows, cols)
            ),
        ), ()
    # forward: a maximum and a sum per chunk; backward: a partial dot
    planes = 2 if direction == "fwd" else 1
    workspace = Buffer("partials", "workspace", "float32", planes * rows * chunks_of(cols, chunk))
    blocks = split_grid(rows, cols, chunk)
    return (
        Launch(f"capsule_{op}_{direction}_partials", blocks, block, (*inputs, "partials", rows, cols, chunk)),
        Launch(f"capsule_{op}_{direction}_finish", blocks, block, (*inputs, "partials", output, rows, cols, chunk)),
    ), (workspace,)


def _plan(op: str, masked: bool, direction: str):
    """The plan of one direction: the forward's kernels read x[, mask] and write out; the
    backward's read out and g and write dx, x[, mask] being buffers of its plan all the same."""
    forward = direction == "fwd"
    group_cols = GROUP_COLS if forward else GRAD_GROUP_COLS

    def plan(inputs: Mapping[str, Any], params: Mapping[str, Any]) -> LaunchPlan:
        shape = tuple(np.shape(inputs["x"]))
        n = int(np.prod(shape, dtype=np.int64))
        rows, cols = rows_and_cols(shape)
        names = ("x", "mask") if masked else ("x",)
        read, output = (names, "out") if forward else (("out", "g"), "dx")
        launches, workspace = _launches(op, direction, rows, cols, group_cols, read, output)
        buffers = (
            tuple(Buffer(b, "input", "float32", n) for b in dict.fromkeys(names + read))
            + (Buffer(output, "output", "float32", n),)
            + workspace
        )
        return LaunchPlan(op, "forward" if forward else "backward", buffers, launches, output_shapes={output: shape})

    return plan


PLANS = {
    op: (_plan(op, masked, "fwd"), _plan(op, masked, "bwd"))
    for op, masked in (("log_softmax", False), ("softmax", False), ("hard_masked_softmax", True))
}


BUDGET = KernelBudget(
    max_registers=register_budget(THREADS, GROUP_BLOCKS),
    registers={
        f"capsule_{op}_{direction}_{variant}": register_budget(THREADS, LEAN_BLOCKS)
        for op in PLANS
        for direction in ("fwd", "bwd")
        for variant in ("block", "partials", "finish")
    },
)
"""The group kernels: four blocks of THREADS per multiprocessor (64 registers); the block and
split-row kernels: LEAN_BLOCKS (32 registers, the whole multiprocessor)."""
