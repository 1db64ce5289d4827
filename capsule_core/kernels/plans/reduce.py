"""Launch plans of the reductions (cuda/reduce.cu): reduce_sum and reduce_mean.

x is viewed as (outer, size, inner) around the reduced axis (axis=None: (1, n, 1)). The forward
kernel sums chunks of `chunk` elements along the axis. When one pass would leave the GPU idle (few
outputs over a long axis) the plan runs it twice: x into a workspace of partial sums per chunk,
(outer, chunks, inner), then the partials into y; the mean scales by 1/count only in the second
launch (count = 1, an exact scaling, in the first). Both launches have a fixed reduction order:
the result is deterministic. The kernels pick their path from (span, inner) (cuda/reduce.cuh);
the plans mirror that choice to size the grid, which never affects correctness, and to launch the
block-per-segment path (inner = 1, segments over GROUP_SPAN) through its own lean entry point,
capsule_<op>_fwd_block; capsule_<op>_fwd takes every other path (and any shape).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from capsule_core.kernels.launch import Buffer, Launch, LaunchPlan, grid_1d, warp_lanes
from capsule_core.kernels.nvcc import KernelBudget, register_budget

THREADS = 256
"""CAPSULE_REDUCE_THREADS: the kernels' __launch_bounds__ and the block of every launch."""
MAX_BLOCKS = 132 * 32
"""32 blocks per H200 multiprocessor; beyond that the blocks loop."""
BLOCKS = 4
"""CAPSULE_REDUCE_BLOCKS: blocks per multiprocessor capsule_<op>_fwd and _bwd are built for."""
LEAN_BLOCKS = 8
"""CAPSULE_REDUCE_LEAN_BLOCKS: the same for the block-per-segment kernel (32 registers)."""
TARGET_BLOCKS = LEAN_BLOCKS * 132
"""Blocks a two-launch reduction aims its first launch at: one full wave of the lean block-per-
segment kernel on an H200 (eight per multiprocessor)."""
SPLIT_MIN_SIZE = 4096
"""Axes shorter than this are summed in one launch whatever the output count."""
CHUNK_QUANTUM = 1024
"""Chunks are multiples of this (whole float4 runs, at least 1024 elements per block)."""
MIN_CHUNK = 2048
"""The shortest chunk: past GROUP_SPAN, so that contiguous chunks take the block-per-segment path
(a warp per 1024-element chunk would leave most of the device idle)."""

# The kernel paths (CAPSULE_REDUCE_* in cuda/reduce.cuh) and their bounds.
ROW_GROUP, ROW_BLOCK, COLUMN, TILE = 0, 1, 2, 3
GROUP_SPAN = 1024
COLUMN_SPAN = 32


def geometry(shape, axis) -> tuple[int, int, int]:
    """(outer, size, inner) of x around the reduced axis; axis=None reduces everything."""
    shape = tuple(int(d) for d in shape)
    if axis is None:
        return 1, int(np.prod(shape, dtype=np.int64)), 1
    a = axis % len(shape)
    return (int(np.prod(shape[:a], dtype=np.int64)), shape[a], int(np.prod(shape[a + 1 :], dtype=np.int64)))


def chunks_of(size: int, chunk: int) -> int:
    """capsule_reduce_chunks."""
    return 1 if chunk <= 0 or chunk >= size else -(-size // chunk)


def path(span: int, inner: int) -> int:
    """capsule_reduce_path."""
    if inner == 1:
        return ROW_GROUP if span <= GROUP_SPAN else ROW_BLOCK
    return COLUMN if span <= COLUMN_SPAN else TILE


def lanes(span: int) -> int:
    """capsule_reduce_lanes."""
    return warp_lanes(span)


def batch(span: int) -> int:
    """capsule_reduce_batch: segments a lane group takes at a time."""
    return 8 if span <= 32 else 1


def tile_width(inner: int) -> int:
    """capsule_tile_width."""
    return min(inner, 32)


def grid(outer: int, size: int, inner: int, chunk: int) -> tuple[int, int, int]:
    """Blocks for one forward launch: one unit of the kernel's path each, capped."""
    chunks = chunks_of(size, chunk)
    span = size if chunks == 1 else chunk
    segments = outer * chunks
    kind = path(span, inner)
    if kind == ROW_GROUP:
        blocks = -(-segments // ((THREADS // 32) * (32 // lanes(span)) * batch(span)))
    elif kind == ROW_BLOCK:
        blocks = segments
    elif kind == COLUMN:
        blocks = -(-segments * inner // THREADS)
    elif inner > 0:
        blocks = segments * -(-inner // tile_width(inner))
    else:
        blocks = 0
    return (max(1, min(MAX_BLOCKS, blocks)), 1, 1)


def split_chunk(outer: int, size: int, inner: int) -> int:
    """The chunk of a two-launch reduction, or 0 when one launch keeps the GPU busy."""
    units = outer * -(-inner // 32)
    if size < SPLIT_MIN_SIZE or units == 0 or units * 2 >= TARGET_BLOCKS:
        return 0
    wanted = -(-TARGET_BLOCKS // units)
    chunk = -(-size // wanted)
    chunk = max(MIN_CHUNK, -(-chunk // CHUNK_QUANTUM) * CHUNK_QUANTUM)
    return chunk if chunks_of(size, chunk) > 1 else 0


def _forward(op: str):
    mean = op == "reduce_mean"

    def launch(source: str, target: str, outer: int, size: int, inner: int, chunk: int, count: int) -> Launch:
        tail = (chunk,) + ((count,) if mean else ())
        if path(size if chunks_of(size, chunk) == 1 else chunk, inner) == ROW_BLOCK:
            return Launch(
                f"capsule_{op}_fwd_block",
                grid(outer, size, inner, chunk),
                (THREADS, 1, 1),
                (source, target, outer, size) + tail,
            )
        return Launch(
            f"capsule_{op}_fwd",
            grid(outer, size, inner, chunk),
            (THREADS, 1, 1),
            (source, target, outer, size, inner) + tail,
        )

    def plan(inputs: Mapping[str, Any], params: Mapping[str, Any]) -> LaunchPlan:
        shape = tuple(np.shape(inputs["x"]))
        outer, size, inner = geometry(shape, params["axis"])
        out_shape = _reduced_shape(shape, params["axis"])
        buffers = [
            Buffer("x", "input", "float32", outer * size * inner),
            Buffer("out", "output", "float32", outer * inner),
        ]
        chunk = split_chunk(outer, size, inner)
        if chunk:
            chunks = chunks_of(size, chunk)
            buffers.append(Buffer("partials", "workspace", "float32", outer * chunks * inner))
            launches = (
                launch("x", "partials", outer, size, inner, chunk, 1),
                launch("partials", "out", outer, chunks, inner, chunks, size),
            )
        else:
            launches = (launch("x", "out", outer, size, inner, size, size),)
        return LaunchPlan(op, "forward", tuple(buffers), launches, output_shapes={"out": out_shape})

    return plan


def _backward(op: str):
    def plan(inputs: Mapping[str, Any], params: Mapping[str, Any]) -> LaunchPlan:
        shape = tuple(np.shape(inputs["x"]))
        outer, size, inner = geometry(shape, params["axis"])
        n = outer * size * inner
        blocks, block = grid_1d(-(-n // 4), THREADS)
        buffers = (
            Buffer("x", "input", "float32", n),
            Buffer("g", "input", "float32", outer * inner),
            Buffer("dx", "output", "float32", n),
        )
        launch = Launch(f"capsule_{op}_bwd", blocks, block, ("g", "dx", outer, size, inner))
        return LaunchPlan(op, "backward", buffers, (launch,), output_shapes={"dx": shape})

    return plan


def _reduced_shape(shape: tuple, axis) -> tuple:
    if axis is None:
        return ()
    a = axis % len(shape)
    return shape[:a] + shape[a + 1 :]


PLANS = {op: (_forward(op), _backward(op)) for op in ("reduce_sum", "reduce_mean")}


BUDGET = KernelBudget(
    max_registers=register_budget(THREADS, BLOCKS),
    registers={f"capsule_{op}_fwd_block": register_budget(THREADS, LEAN_BLOCKS) for op in PLANS},
)
"""capsule_<op>_fwd and _bwd: four blocks of THREADS per multiprocessor (64 registers); the
block-per-segment kernels eight (32 registers)."""
