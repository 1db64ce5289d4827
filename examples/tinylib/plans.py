"""tinylib's launch plans: from an op's inputs and parameters to the exact launches, Memsets and
buffers (capsule_core.kernels.launch). Forward plans write "out"; backward plans read the op's
inputs, the cotangent "g" and (softmax) the forward's result "out", and write "dx". Launch.symbol
is the kernel's C++ name as capsules.py declares it; arguments follow its parameter list.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from capsule_core.kernels.launch import Buffer, Launch, LaunchPlan, Memset, View, grid_1d
from capsule_core.kernels.nvcc import KernelBudget, register_budget

THREADS = 256
"""TINYLIB_THREADS (capsules.py defines it): the block of every launch. The relu kernels and the
row reductions do nothing at any other block size."""
MAX_ROW_BLOCKS = 65535
"""The row reductions' grid cap: one block per row up to this many rows, then blocks loop over rows
(each row still reduced by one block, so each row gets one atomicAdd)."""
ORDERED_MINUS_INF = -2139095041
"""tinylib::kOrderedMinusInf: the order-preserving int key of -inf (0xFF800000 ^ 0x7FFFFFFF), the
start of every row maximum."""
META_WORDS = 16
"""max_pool's metadata table: C, (d, h, w), (od, oh, ow), kernel, stride, padding (pool.cu)."""


def _numel(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _block() -> tuple[int, int, int]:
    return (THREADS, 1, 1)


# -- pointwise: one grid-stride launch per direction ---------------------------------------------


def _pointwise(op: str, forward_symbol: str, backward_symbol: str):
    def forward(inputs: Mapping[str, Any], params: Mapping[str, Any]) -> LaunchPlan:
        shape = tuple(np.shape(inputs["x"]))
        n = _numel(shape)
        buffers = (Buffer("x", "input", "float32", n), Buffer("out", "output", "float32", n))
        launch = Launch(forward_symbol, *grid_1d(n, THREADS), ("x", "out", n))
        return LaunchPlan(op, "forward", buffers, (launch,), output_shapes={"out": shape})

    def backward(inputs: Mapping[str, Any], params: Mapping[str, Any]) -> LaunchPlan:
        shape = tuple(np.shape(inputs["x"]))
        n = _numel(shape)
        buffers = (
            Buffer("x", "input", "float32", n),
            Buffer("g", "input", "float32", n),
            Buffer("dx", "output", "float32", n),
        )
        launch = Launch(backward_symbol, *grid_1d(n, THREADS), ("x", "g", "dx", n))
        return LaunchPlan(op, "backward", buffers, (launch,), output_shapes={"dx": shape})

    return forward, backward


# -- softmax: a chain of launches through per-row workspaces ---------------------------------------


def _rows_cols(shape) -> tuple[int, int, int]:
    cols = int(shape[-1])
    n = _numel(shape)
    return n, n // cols, cols  # cols >= 1: the op's shape rule


def _row_grid(rows: int) -> tuple[int, int, int]:
    return (max(1, min(rows, MAX_ROW_BLOCKS)), 1, 1)


def softmax_forward(inputs: Mapping[str, Any], params: Mapping[str, Any]) -> LaunchPlan:
    """memset rowmax to key(-inf); row_max (atomicMax); memset rowsum to 0; row_exp;
    row_sum (a block per row, one atomicAdd per row); row_divide."""
    shape = tuple(np.shape(inputs["x"]))
    n, rows, cols = _rows_cols(shape)
    buffers = (
        Buffer("x", "input", "float32", n),
        Buffer("out", "output", "float32", n),
        Buffer("rowmax", "workspace", "int32", rows),
        Buffer("rowsum", "workspace", "float32", rows),
    )
    elementwise = grid_1d(n, THREADS)
    steps = (
        Memset("rowmax", ORDERED_MINUS_INF),
        Launch("tinylib::row_max", *elementwise, ("x", "rowmax", n, cols)),
        Memset("rowsum", 0.0),
        Launch("tinylib::row_exp", *elementwise, ("x", "rowmax", "out", n, cols)),
        Launch("tinylib::row_sum", _row_grid(rows), _block(), ("out", "rowsum", rows, cols)),
        Launch("tinylib::row_divide", *elementwise, ("out", "rowsum", n, cols)),
    )
    return LaunchPlan("softmax", "forward", buffers, steps, output_shapes={"out": shape})


def softmax_backward(inputs: Mapping[str, Any], params: Mapping[str, Any]) -> LaunchPlan:
    """dx = y * (g - sum(y * g)): memset dot to 0; row_dot (a block per row, one atomicAdd per
    row); softmax_backward. Reads the forward's result "out" and the cotangent "g" only."""
    shape = tuple(np.shape(inputs["x"]))
    n, rows, cols = _rows_cols(shape)
    buffers = (
        Buffer("out", "input", "float32", n),
        Buffer("g", "input", "float32", n),
        Buffer("dx", "output", "float32", n),
        Buffer("dot", "workspace", "float32", rows),
    )
    steps = (
        Memset("dot", 0.0),
        Launch("tinylib::row_dot", _row_grid(rows), _block(), ("out", "g", "dot", rows, cols)),
        Launch("tinylib::softmax_backward", *grid_1d(n, THREADS), ("out", "g", "dot", "dx", n, cols)),
    )
    return LaunchPlan("softmax", "backward", buffers, steps, output_shapes={"dx": shape})


# -- max_pool: one launch per image, the geometry in a uint32 metadata table ----------------------


def _per_axis(value, rank: int) -> tuple[int, ...]:
    return (int(value),) * rank if isinstance(value, (int, np.integer)) else tuple(int(v) for v in value)


def _pad3(values, fill: int) -> tuple[int, ...]:
    return (fill,) * (3 - len(values)) + tuple(values)


def _out_len(size: int, k: int, s: int, p: int) -> int:
    span = size + 2 * p - k
    return 0 if span < 0 else span // s + 1


def pool_geometry(inputs: Mapping[str, Any], params: Mapping[str, Any]):
    """(x shape, y shape, kernel, stride, the metadata table): every rank padded to 3-D (size 1,
    kernel 1, stride 1, padding 0 on a missing leading axis)."""
    x = tuple(np.shape(inputs["x"]))
    r = len(x) - 2
    kernel = _per_axis(params["kernel"], r)
    stride = kernel if params.get("stride") is None else _per_axis(params["stride"], r)
    padding = _per_axis(params.get("padding", 0), r)
    out = tuple(_out_len(n, k, s, p) for n, k, s, p in zip(x[2:], kernel, stride, padding))
    words = (x[1], *_pad3(x[2:], 1), *_pad3(out, 1), *_pad3(kernel, 1), *_pad3(stride, 1), *_pad3(padding, 0))
    if any(not 0 <= w < 2**32 for w in words):
        raise ValueError(f"max_pool: geometry {words} does not fit tinylib's uint32 metadata table")
    return x, (*x[:2], *out), kernel, stride, np.array(words, np.uint32)


def max_pool_forward(inputs: Mapping[str, Any], params: Mapping[str, Any]) -> LaunchPlan:
    """One launch of tinylib::max_pool_forward per image: x and out as views at the image."""
    x, y, _, _, meta = pool_geometry(inputs, params)
    image_in, image_out = _numel(x[1:]), _numel(y[1:])
    buffers = (
        Buffer("x", "input", "float32", _numel(x)),
        Buffer("out", "output", "float32", _numel(y)),
        Buffer("meta", "meta", "uint32", META_WORDS),
    )
    launches = tuple(
        Launch(
            "tinylib::max_pool_forward",
            *grid_1d(image_out, THREADS),
            (View("x", i * image_in), View("out", i * image_out), "meta"),
        )
        for i in range(x[0])
    )
    return LaunchPlan("max_pool", "forward", buffers, launches, host_data={"meta": meta}, output_shapes={"out": y})


def max_pool_backward(inputs: Mapping[str, Any], params: Mapping[str, Any]) -> LaunchPlan:
    """Windows that do not overlap (stride >= kernel on every axis): Memset dx to 0, then per image
    tinylib::max_pool_backward_scatter (atomicAdd of g to each window's first maximum; a cell gets
    at most one addition, so the result is exact in any order). Overlapping windows: per image
    tinylib::max_pool_backward_gather (each cell sums its covering windows' g in a fixed order:
    deterministic, no atomics, every cell written)."""
    x, y, kernel, stride, meta = pool_geometry(inputs, params)
    image_in, image_out = _numel(x[1:]), _numel(y[1:])
    buffers = (
        Buffer("x", "input", "float32", _numel(x)),
        Buffer("g", "input", "float32", _numel(y)),
        Buffer("dx", "output", "float32", _numel(x)),
        Buffer("meta", "meta", "uint32", META_WORDS),
    )
    overlapping = any(s < k for k, s in zip(kernel, stride))
    if overlapping:
        steps = tuple(
            Launch(
                "tinylib::max_pool_backward_gather",
                *grid_1d(image_in, THREADS),
                (View("x", i * image_in), View("g", i * image_out), View("dx", i * image_in), "meta"),
            )
            for i in range(x[0])
        )
    else:
        steps = (Memset("dx", 0.0),) + tuple(
            Launch(
                "tinylib::max_pool_backward_scatter",
                *grid_1d(image_out, THREADS),
                (View("x", i * image_in), View("g", i * image_out), View("dx", i * image_in), "meta"),
            )
            for i in range(x[0])
        )
    return LaunchPlan("max_pool", "backward", buffers, steps, host_data={"meta": meta}, output_shapes={"dx": x})


PLANS = {
    "relu": _pointwise("relu", "tinylib::relu_forward<float>", "tinylib::relu_backward"),
    "softmax": (softmax_forward, softmax_backward),
    "max_pool": (max_pool_forward, max_pool_backward),
    "squared_relu": _pointwise("squared_relu", "tinylib::squared_relu_forward", "tinylib::squared_relu_backward"),
}

BUDGET = KernelBudget(max_registers=register_budget(THREADS, 2))
"""128 registers: at least two blocks of THREADS per multiprocessor (the pool gather kernel, the
heaviest, uses 80 on sm_90; the others 14 to 64)."""
