"""Launch plans of the shape and layout family (cuda/view.cu): reshape, permute, broadcast, concat, slice.

permute and broadcast read x through a geometry (a meta int64 buffer of 2·rank entries: y's shape,
then the x stride of each y axis, 0 along a broadcast axis) that the plan simplifies first: size-1
axes dropped, neighbours that stay contiguous in x merged, so a transpose of any rank becomes the
rank-2 or rank-3 problem it really is. The kernels pick their path from the geometry (16-byte moves
when the last axis stays contiguous, shared-memory tiles when a permutation moves x's innermost
axis); the plans mirror that choice only to size the grid, which never affects correctness.

reshape launches nothing: its output is its input's buffer under a new shape, which its plans say
with LaunchPlan.aliases (output buffer -> the input buffer it is): a backend hands the input's device
memory back as the output instead of allocating, filling or checking a fresh buffer.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from capsule_core.kernels.launch import Buffer, Launch, LaunchPlan, grid_1d
from capsule_core.kernels.nvcc import KernelBudget, register_budget

BLOCK = 256
VECTOR = 4
"""Elements per 16-byte vector move."""
MAX_BLOCKS = 132 * 32
"""grid_1d's cap: 32 blocks per H200 multiprocessor."""
MAX_RANK = 64
"""CAPSULE_VIEW_MAX_RANK in cuda/view.cuh: the most axes a geometry may keep after simplification."""
BROADCAST_BWD_MAX_THREADS = 512
"""capsule_broadcast_bwd's __launch_bounds__."""

# The kernels' paths (CAPSULE_PATH_* in cuda/view.cuh).
PATH_SCALAR, PATH_COPY4, PATH_FILL4, PATH_TILE = 0, 1, 2, 3


def _numel(shape) -> int:
    return int(math.prod(shape))


def _strides(shape) -> list[int]:
    """Row-major element strides of a contiguous array."""
    out, step = [], 1
    for d in reversed(tuple(shape)):
        out.append(step)
        step *= d
    return out[::-1]


def simplify(shape, stride) -> tuple[list[int], list[int]]:
    """Drop size-1 axes and merge each axis into its outer neighbour where x reads them as one
    (stride[i] == stride[i+1]·shape[i+1]) or both are broadcast (stride 0). A geometry with no
    axis left is one element: ([1], [1])."""
    dims = [(int(d), int(s)) for d, s in zip(shape, stride) if d != 1]
    merged: list[tuple[int, int]] = []
    for d, s in dims:
        if merged and (merged[-1][1] == s == 0 or (s != 0 and merged[-1][1] == s * d)):
            merged[-1] = (merged[-1][0] * d, s)
        else:
            merged.append((d, s))
    if not merged:
        return [1], [1]
    if len(merged) > MAX_RANK:
        raise ValueError(f"a geometry of {len(merged)} axes after simplification (the kernels take {MAX_RANK})")
    return [d for d, _ in merged], [s for _, s in merged]


def permute_geometry(x_shape, perm) -> tuple[list[int], list[int]]:
    """(y shape, x stride per y axis), simplified; an empty array is ([0], [1])."""
    x_strides = _strides(x_shape)
    shape = [int(x_shape[a]) for a in perm]
    if _numel(shape) == 0:
        return [0], [1]
    return simplify(shape, [x_strides[a] for a in perm])


def broadcast_geometry(x_shape, target) -> tuple[list[int], list[int]]:
    """(target shape, x stride per target axis with 0 where x is repeated), simplified. Size-0
    target axes stay (as repeated axes) so that the backward still tells kept axes from summed ones."""
    lead = len(target) - len(x_shape)
    x_strides = _strides(x_shape)
    stride = [0] * lead + [x_strides[i] if d != 1 else 0 for i, d in enumerate(x_shape)]
    return simplify(target, stride)


def tile_axis(shape, stride) -> int:
    """capsule_tile_axis: the y axis (not the last) read contiguously from x, or -1."""
    for k in range(len(shape) - 1):
        if stride[k] == 1 and shape[k] > 1:
            return k
    return -1


def view_path(shape, stride, tiles: bool, x16: bool = True, y16: bool = True) -> int:
    """capsule_view_path: the kernel's path for a geometry (buffers are 16-byte aligned by default)."""
    rank = len(shape)
    if rank == 0:
        return PATH_SCALAR
    length, s = shape[-1], stride[-1]
    if tiles and s != 1 and tile_axis(shape, stride) >= 0:
        return PATH_TILE
    if not y16 or length % 4:
        return PATH_SCALAR
    if s == 0:
        return PATH_FILL4
    if s != 1 or not x16:
        return PATH_SCALAR
    if any(d > 1 and st % 4 for d, st in zip(shape[:-1], stride[:-1])):
        return PATH_SCALAR
    return PATH_COPY4


def tile_count(shape, stride) -> int:
    """capsule_tile_layout's tiles: TB = the last extent up to a power of two ≤ 32, TA = 1024 / TB."""
    j = tile_axis(shape, stride)
    a, b = shape[j], shape[-1]
    lb = 0
    while lb < 5 and (1 << lb) < b:
        lb += 1
    la = 10 - lb
    batch = _numel(d for k, d in enumerate(shape) if k not in (j, len(shape) - 1))
    return batch * -(-a >> la) * -(-b >> lb) if a and b else 0


def _gather_launch(symbol: str, src: str, dst: str, shape, stride, n: int, tiles: bool) -> Launch:
    path = view_path(shape, stride, tiles)
    if path == PATH_TILE:
        grid, block = grid_1d(tile_count(shape, stride) * BLOCK, BLOCK)
    else:
        grid, block = grid_1d(n // VECTOR if path in (PATH_COPY4, PATH_FILL4) else n, BLOCK)
    return Launch(symbol, grid, block, (src, dst, "geometry", len(shape), n))


def _geometry(shape, stride) -> np.ndarray:
    return np.array(list(shape) + list(stride), dtype=np.int64)


# -- reshape: an alias, no launch -----------------------------------------------------------------


def _reshape_target(x_shape, target) -> tuple:
    if -1 in target:
        known = _numel(d for d in target if d != -1)
        return tuple(_numel(x_shape) // known if d == -1 else d for d in target)
    return tuple(target)


def reshape_forward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
    x_shape = np.shape(inputs["x"])
    n = _numel(x_shape)
    return LaunchPlan(
        "reshape",
        "forward",
        (Buffer("x", "input", "float32", n), Buffer("out", "output", "float32", n)),
        (),
        output_shapes={"out": _reshape_target(x_shape, p["shape"])},
        aliases={"out": "x"},
    )


def reshape_backward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
    x_shape = tuple(np.shape(inputs["x"]))
    n = _numel(x_shape)
    return LaunchPlan(
        "reshape",
        "backward",
        (Buffer("g", "input", "float32", n), Buffer("dx", "output", "float32", n)),
        (),
        output_shapes={"dx": x_shape},
        aliases={"dx": "g"},
    )


# -- permute: y[i] = x[offset(i)], tiles when x's innermost axis moves ----------------------------


def _permute_plan(direction: str, src: str, dst: str, src_shape, perm) -> LaunchPlan:
    shape, stride = permute_geometry(src_shape, perm)
    n = _numel(src_shape)
    geometry = _geometry(shape, stride)
    suffix = "fwd" if direction == "forward" else "bwd"
    launch = _gather_launch(f"capsule_permute_{suffix}", src, dst, shape, stride, n, tiles=True)
    buffers = (
        Buffer(src, "input", "float32", n),
        Buffer(dst, "output", "float32", n),
        Buffer("geometry", "meta", "int64", geometry.size),
    )
    return LaunchPlan(
        "permute", direction, buffers, (launch,), {"geometry": geometry}, {dst: tuple(int(src_shape[a]) for a in perm)}
    )


def inverse(perm) -> tuple[int, ...]:
    out = [0] * len(perm)
    for position, axis in enumerate(perm):
        out[axis] = position
    return tuple(out)


def permute_forward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
    return _permute_plan("forward", "x", "out", np.shape(inputs["x"]), tuple(p["perm"]))


def permute_backward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
    x_shape, perm = np.shape(inputs["x"]), tuple(p["perm"])
    y_shape = tuple(x_shape[a] for a in perm)
    return _permute_plan("backward", "g", "dx", y_shape, inverse(perm))


# -- broadcast: y[i] = x[offset(i)]; backward sums each x element's copies ------------------------


def broadcast_forward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
    x_shape, target = np.shape(inputs["x"]), tuple(p["shape"])
    shape, stride = broadcast_geometry(x_shape, target)
    n, n_x = _numel(target), _numel(x_shape)
    geometry = _geometry(shape, stride)
    launch = _gather_launch("capsule_broadcast_fwd", "x", "out", shape, stride, n, tiles=False)
    buffers = (
        Buffer("x", "input", "float32", n_x),
        Buffer("out", "output", "float32", n),
        Buffer("geometry", "meta", "int64", geometry.size),
    )
    return LaunchPlan("broadcast", "forward", buffers, (launch,), {"geometry": geometry}, {"out": target})


def copies(x_shape, target) -> int:
    """How many times each x element appears in the target: the product over the repeated axes."""
    lead = len(target) - len(x_shape)
    return _numel(d for k, d in enumerate(target) if k < lead or (x_shape[k - lead] == 1 and d != 1))


def broadcast_bwd_launch(stride, n_x: int, n_copies: int) -> tuple[tuple, tuple]:
    """Grid and block of capsule_broadcast_bwd. Row mode (g's innermost axis summed): a warp per dx
    element, 8 per block. Column mode: 32 dx elements per block, its W warps splitting the copies;
    W grows with the copies (up to 16 when few blocks would otherwise run)."""
    if stride[-1] == 0:
        return grid_1d(n_x * 32, BLOCK)
    groups = -(-n_x // 32)
    warps = max(1, min(8, n_copies))
    if n_copies >= 256 and groups < 4 * 132:
        warps = BROADCAST_BWD_MAX_THREADS // 32
    return (max(1, min(MAX_BLOCKS, groups)), 1, 1), (32 * warps, 1, 1)


def broadcast_backward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
    x_shape, target = tuple(np.shape(inputs["x"])), tuple(p["shape"])
    shape, stride = broadcast_geometry(x_shape, target)
    n, n_x, n_copies = _numel(target), _numel(x_shape), copies(x_shape, target)
    geometry = _geometry(shape, stride)
    grid, block = broadcast_bwd_launch(stride, n_x, n_copies)
    launch = Launch("capsule_broadcast_bwd", grid, block, ("g", "dx", "geometry", len(shape), n_x, n_copies))
    buffers = (
        Buffer("g", "input", "float32", n),
        Buffer("dx", "output", "float32", n_x),
        Buffer("geometry", "meta", "int64", geometry.size),
    )
    return LaunchPlan("broadcast", "backward", buffers, (launch,), {"geometry": geometry}, {"dx": x_shape})


# -- concat: one launch per input, each copying its slab of y -------------------------------------


def _around(shape, axis: int) -> tuple[int, int]:
    """(outer, inner): the products of the axes before and after `axis`."""
    return _numel(shape[:axis]), _numel(shape[axis + 1 :])


def _rows_vec4(length: int, *offsets: int) -> bool:
    """capsule_rows_vec4 on 16-byte aligned buffers."""
    return length % 4 == 0 and all(o % 4 == 0 for o in offsets)


def _rows_grid(rows: int, length: int, vec4: bool):
    n = rows * length
    return grid_1d(n // VECTOR if vec4 else n, BLOCK)


def _concat_plan(direction: str, inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
    shapes = [tuple(np.shape(x)) for x in inputs["xs"]]
    rank = len(shapes[0])
    axis = p["axis"] % rank
    outer, inner = _around(shapes[0], axis)
    size_out = sum(s[axis] for s in shapes)
    out_shape = shapes[0][:axis] + (size_out,) + shapes[0][axis + 1 :]
    n_out = _numel(out_shape)
    forward = direction == "forward"
    parts = [f"xs[{i}]" if forward else f"dxs[{i}]" for i in range(len(shapes))]
    whole = "out" if forward else "g"
    launches, offset = [], 0
    for part, s in zip(parts, shapes):
        size_in = s[axis]
        vec4 = _rows_vec4(size_in * inner, size_in * inner, size_out * inner, offset * inner)
        grid, block = _rows_grid(outer, size_in * inner, vec4)
        args = (part, whole) if forward else (whole, part)
        launches.append(
            Launch(
                f"capsule_concat_{'fwd' if forward else 'bwd'}",
                grid,
                block,
                (*args, outer, size_in, inner, size_out, offset),
            )
        )
        offset += size_in
    part_role, whole_role = ("input", "output") if forward else ("output", "input")
    buffers = tuple(Buffer(part, part_role, "float32", _numel(s)) for part, s in zip(parts, shapes))
    buffers += (Buffer(whole, whole_role, "float32", n_out),)
    outputs = {"out": out_shape} if forward else {part: s for part, s in zip(parts, shapes)}
    return LaunchPlan("concat", direction, buffers, tuple(launches), output_shapes=outputs)


def concat_forward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
    return _concat_plan("forward", inputs, p)


def concat_backward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
    """Gradients are named dxs[0], dxs[1], ... after the variadic input xs."""
    return _concat_plan("backward", inputs, p)


# -- slice: a range along one axis; the backward writes zeros around it ---------------------------


def _slice_geometry(inputs, p):
    x_shape = tuple(np.shape(inputs["x"]))
    axis = p["axis"] % len(x_shape)
    outer, inner = _around(x_shape, axis)
    y_shape = x_shape[:axis] + (p["length"],) + x_shape[axis + 1 :]
    return x_shape, y_shape, outer, x_shape[axis], inner, p["start"], p["length"]


def slice_forward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
    x_shape, y_shape, outer, size, inner, start, length = _slice_geometry(inputs, p)
    vec4 = _rows_vec4(length * inner, start * inner, size * inner)
    grid, block = _rows_grid(outer, length * inner, vec4)
    launch = Launch("capsule_slice_fwd", grid, block, ("x", "out", outer, size, inner, start, length))
    buffers = (Buffer("x", "input", "float32", _numel(x_shape)), Buffer("out", "output", "float32", _numel(y_shape)))
    return LaunchPlan("slice", "forward", buffers, (launch,), output_shapes={"out": y_shape})


def slice_backward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
    x_shape, y_shape, outer, size, inner, start, length = _slice_geometry(inputs, p)
    n = _numel(x_shape)
    vec4 = all(v % 4 == 0 for v in (size * inner, start * inner, (start + length) * inner))
    grid, block = grid_1d(n // VECTOR if vec4 else n, BLOCK)
    launch = Launch("capsule_slice_bwd", grid, block, ("g", "dx", outer, size, inner, start, length))
    buffers = (Buffer("g", "input", "float32", _numel(y_shape)), Buffer("dx", "output", "float32", n))
    return LaunchPlan("slice", "backward", buffers, (launch,), output_shapes={"dx": x_shape})


PLANS = {
    "reshape": (reshape_forward, reshape_backward),
    "permute": (permute_forward, permute_backward),
    "broadcast": (broadcast_forward, broadcast_backward),
    "concat": (concat_forward, concat_backward),
    "slice": (slice_forward, slice_backward),
}


BUDGET = KernelBudget(max_registers=register_budget(BROADCAST_BWD_MAX_THREADS))
"""The largest block the plans launch (broadcast's backward) fits on a multiprocessor."""
