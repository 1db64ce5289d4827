"""Launch plans of selective_scan (cuda/scan.cu).

One block per (batch entry, CHANNEL_TILE channels), its threads (channel, chunk of time): the
chunked scan runs inside the block, so the forward is one launch. The backward is one launch of
the reverse scan plus, when a or b is shared, the batch sum of their per-(b, d) cotangents in
order. The tile shape: CHANNEL_TILE = 8 channels (32-byte coalesced segments) or the next power
of two above D when D is smaller; chunks of about CHUNK_STEPS steps, at most MAX_THREADS threads.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from capsule_core.kernels.launch import Buffer, Launch, LaunchPlan, grid_1d
from capsule_core.kernels.nvcc import KernelBudget, register_budget

MAX_THREADS = 256
CHANNEL_TILE = 8
CHUNK_STEPS = 16
MAX_GRID_BLOCKS = 132 * 16


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def tile_shape(batch: int, time: int, dim: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(grid, block): block (channels, chunks); a grid-stride loop covers the remaining tiles."""
    width = CHANNEL_TILE if dim >= CHANNEL_TILE else _pow2_at_least(max(1, dim))
    chunks = min(MAX_THREADS // width, _pow2_at_least(max(1, _ceil(time, CHUNK_STEPS))))
    tiles = batch * _ceil(dim, width)
    return (max(1, min(MAX_GRID_BLOCKS, tiles)), 1, 1), (width, chunks, 1)


def _dims(inputs: Mapping[str, Any]) -> tuple[int, int, int, int, int]:
    batch, time, dim = (int(v) for v in inputs["x"].shape)
    return batch, time, dim, int(np.ndim(inputs["a"]) == 3), int(np.ndim(inputs["b"]) == 3)


def _f32(name: str, role: str, n: int) -> Buffer:
    return Buffer(name, role, "float32", int(n))


def forward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
    batch, time, dim, a_token, b_token = dims = _dims(inputs)
    n = batch * time * dim
    buffers = (
        _f32("x", "input", n),
        _f32("a", "input", np.size(inputs["a"])),
        _f32("b", "input", np.size(inputs["b"])),
        _f32("h0", "input", batch * dim),
        _f32("out", "output", n),
    )
    launch = Launch("capsule_selective_scan_fwd", *tile_shape(batch, time, dim), ("x", "a", "b", "h0", "out", *dims))
    return LaunchPlan("selective_scan", "forward", buffers, (launch,), output_shapes={"out": (batch, time, dim)})


def backward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
    """Reads the forward's result ("out", h[t] for h[t−1]) besides the inputs and g."""
    batch, time, dim, a_token, b_token = dims = _dims(inputs)
    n = batch * time * dim
    a_shape, b_shape = tuple(np.shape(inputs["a"])), tuple(np.shape(inputs["b"]))
    buffers = (
        _f32("x", "input", n),
        _f32("a", "input", np.prod(a_shape, dtype=np.int64)),
        _f32("b", "input", np.prod(b_shape, dtype=np.int64)),
        _f32("h0", "input", batch * dim),
        _f32("out", "input", n),
        _f32("g", "input", n),
        _f32("dx", "output", n),
        _f32("da", "output", np.prod(a_shape, dtype=np.int64)),
        _f32("db", "output", np.prod(b_shape, dtype=np.int64)),
        _f32("dh0", "output", batch * dim),
        _f32("da_part", "workspace", 0 if a_token else batch * dim),
        _f32("db_part", "workspace", 0 if b_token else batch * dim),
    )
    launches = [
        Launch(
            "capsule_selective_scan_bwd",
            *tile_shape(batch, time, dim),
            ("x", "a", "b", "h0", "out", "g", "dx", "da", "db", "dh0", "da_part", "db_part", *dims),
        )
    ]
    if not (a_token and b_token):
        launches.append(
            Launch(
                "capsule_selective_scan_bwd_shared",
                *grid_1d(dim, MAX_THREADS),
                ("da_part", "db_part", "da", "db", batch, dim, a_token, b_token),
            )
        )
    return LaunchPlan(
        "selective_scan",
        "backward",
        buffers,
        tuple(launches),
        output_shapes={"dx": (batch, time, dim), "da": a_shape, "db": b_shape, "dh0": (batch, dim)},
    )


PLANS = {"selective_scan": (forward, backward)}


BUDGET = KernelBudget(max_registers=register_budget(MAX_THREADS))
"""A block of MAX_THREADS fits on a multiprocessor."""
