"""Launch plans of the index family (cuda/index.cu): gather and scatter_add along one axis.

The indexed array is seen as (outer, size, inner) and the gathered one as (outer, count, inner).
Sums over repeated indices (gather's backward, scatter_add's forward) are prepared on the host: a
stable argsort of the index ("order") and CSR row starts ("starts", size + 1 entries), so that each
output element sums its own entries in ascending j without atomics, the same bits on every run.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, NamedTuple

import numpy as np

from capsule_core.kernels.launch import Buffer, Launch, LaunchPlan, grid_1d
from capsule_core.kernels.nvcc import KernelBudget, register_budget

BLOCK = 256
VECTOR = 4


def _numel(shape) -> int:
    return int(math.prod(shape))


def csr(index: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(order, starts): order lists the positions j sorted by index[j], ties in ascending j (a stable
    sort); the entries equal to s are order[starts[s]:starts[s + 1]]."""
    index = np.asarray(index, dtype=np.int64)
    order = np.argsort(index, kind="stable").astype(np.int64)
    starts = np.zeros(size + 1, dtype=np.int64)
    np.cumsum(np.bincount(index, minlength=size)[:size], out=starts[1:])
    return order, starts


def segment_warp_mode(size: int, inner: int, count: int, block_threads: int = BLOCK) -> bool:
    """capsule_segment_warp_mode: a warp per output element when segments average 32 entries or more
    and rows are shorter than a warp."""
    return block_threads % 32 == 0 and inner < 32 and count >= 32 * size


def _axis_view(shape, axis: int) -> tuple[int, int, int]:
    """(outer, size, inner) of `shape` around `axis`."""
    return _numel(shape[:axis]), int(shape[axis]), _numel(shape[axis + 1 :])


def _gather_grid(outer: int, count: int, inner: int):
    n = outer * count * inner
    return grid_1d(n // VECTOR if inner % VECTOR == 0 else n, BLOCK)


def _segment_grid(outer: int, size: int, inner: int, count: int):
    n = outer * size * inner
    return grid_1d(32 * n if segment_warp_mode(size, inner, count) else n, BLOCK)


def _with_axis(shape, axis: int, size: int) -> tuple:
    return tuple(shape[:axis]) + (size,) + tuple(shape[axis + 1 :])


class _SegmentSums(NamedTuple):
    """What gather's backward and scatter_add's forward share: the indexed array's shape, its
    (outer, size, inner) view with the index's count, the grid and block of the summing launch, and
    the index's CSR as meta buffers and as their host data."""

    shape: tuple
    dims: tuple[int, int, int, int]
    launch_grid: tuple
    csr_buffers: tuple[Buffer, Buffer]
    csr_data: dict


def _segment_sums(inputs: Mapping[str, Any], p: Mapping[str, Any], indexed: str) -> _SegmentSums:
    shape, index = tuple(np.shape(inputs[indexed])), np.asarray(inputs["index"])
    outer, size, inner = _axis_view(shape, p["axis"] % len(shape))
    order, starts = csr(index, size)
    dims = (outer, size, inner, len(index))
    return _SegmentSums(
        shape,
        dims,
        _segment_grid(*dims),
        (Buffer("order", "meta", "int64", order.size), Buffer("starts", "meta", "int64", starts.size)),
        {"order": order, "starts": starts},
    )


# -- gather ----------------------------------------------------------------------------------------


def gather_forward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
    x_shape, count = tuple(np.shape(inputs["x"])), len(inputs["index"])
    axis = p["axis"] % len(x_shape)
    outer, size, inner = _axis_view(x_shape, axis)
    y_shape = _with_axis(x_shape, axis, count)
    grid, block = _gather_grid(outer, count, inner)
    launch = Launch("capsule_gather_fwd", grid, block, ("x", "index", "out", outer, size, inner, count))
    buffers = (
        Buffer("x", "input", "float32", _numel(x_shape)),
        Buffer("index", "input", "int64", count),
        Buffer("out", "output", "float32", _numel(y_shape)),
    )
    return LaunchPlan("gather", "forward", buffers, (launch,), output_shapes={"out": y_shape})


def gather_backward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
    sums = _segment_sums(inputs, p, "x")
    outer, _, inner, count = sums.dims
    launch = Launch("capsule_gather_bwd", *sums.launch_grid, ("g", "order", "starts", "dx", *sums.dims))
    buffers = (
        Buffer("g", "input", "float32", outer * count * inner),
        *sums.csr_buffers,
        Buffer("dx", "output", "float32", _numel(sums.shape)),
    )
    return LaunchPlan("gather", "backward", buffers, (launch,), sums.csr_data, {"dx": sums.shape})


# -- scatter_add -----------------------------------------------------------------------------------


def scatter_add_forward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
    sums = _segment_sums(inputs, p, "base")
    outer, _, inner, count = sums.dims
    launch = Launch("capsule_scatter_add_fwd", *sums.launch_grid, ("base", "src", "order", "starts", "out", *sums.dims))
    n = _numel(sums.shape)
    buffers = (
        Buffer("base", "input", "float32", n),
        Buffer("src", "input", "float32", outer * count * inner),
        *sums.csr_buffers,
        Buffer("out", "output", "float32", n),
    )
    return LaunchPlan("scatter_add", "forward", buffers, (launch,), sums.csr_data, {"out": sums.shape})


def scatter_add_backward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
    base_shape, count = tuple(np.shape(inputs["base"])), len(inputs["index"])
    axis = p["axis"] % len(base_shape)
    outer, size, inner = _axis_view(base_shape, axis)
    n, n_src = _numel(base_shape), outer * count * inner
    src_shape = _with_axis(base_shape, axis, count)
    copy_items = n // VECTOR
    gather_items = n_src // VECTOR if inner % VECTOR == 0 else n_src
    grid, block = grid_1d(max(copy_items, gather_items), BLOCK)
    launch = Launch("capsule_scatter_add_bwd", grid, block, ("g", "index", "dbase", "dsrc", outer, size, inner, count))
    buffers = (
        Buffer("g", "input", "float32", n),
        Buffer("index", "input", "int64", count),
        Buffer("dbase", "output", "float32", n),
        Buffer("dsrc", "output", "float32", n_src),
    )
    return LaunchPlan(
        "scatter_add", "backward", buffers, (launch,), output_shapes={"dbase": base_shape, "dsrc": src_shape}
    )


PLANS = {
    "gather": (gather_forward, gather_backward),
    "scatter_add": (scatter_add_forward, scatter_add_backward),
}


BUDGET = KernelBudget(max_registers=register_budget(BLOCK))
"""A block of BLOCK threads fits on a multiprocessor."""
