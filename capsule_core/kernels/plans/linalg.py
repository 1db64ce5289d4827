"""Launch plans of the linalg family (cuda/linalg.cu).

GEMMs (matmul forward and both gradients; linear forward, dx and dw) run on the SGEMM core. The
block size names the tile: 256 threads compute 128×128 tiles (8×8 per thread), 128 threads 64×64
tiles (8×4 per thread), either in k-tiles of 16 that cp.async copies into a three-stage ring of
48 KiB static shared memory. A problem with few tiles (fewer than two per multiprocessor of an
H200) may split its contraction k into `splits` ranges of whole steps of SPLIT_STEP: the first
launch then writes each range's partial product to a workspace and a second (`*_ksum`) adds the
partials in split order, bias last: deterministic, no atomics, and the split count comes from the shape alone.
`gemm_config` picks the tile shape and the split count with the least estimated time (a cost
model: the most blocks any multiprocessor runs, each a tile's FMAs over its k range, over the
throughput of the tile shape at the warps resident there; plus the partials' traffic and a
launch). The grid has one block per (tile, split) (the kernels loop grid-stride, so any grid is
correct).

linear's forward with at most GEMV_ROWS rows is a GEMV: w (out × in) holds each output column's
weights contiguous along k, read as 16-byte chunks; a warp takes a few columns and one of k_warps
slices of k (as many slices as fill the device best). Up to 8 rows the tile is lean enough for
half the warp slots of a multiprocessor (a memory-bound kernel); up to 16, a quarter.

linear's bias gradient sums g's columns: one launch over all rows when that gives the GPU enough
blocks (or rows are few), else two: row chunks into a workspace, then the chunks' sums.
mse_loss's forward sums squared differences per chunk (one block each) into a workspace of
doubles, then one block adds them; a single chunk writes the mean directly.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from capsule_core.kernels.launch import GRID_LIMITS, Buffer, Launch, LaunchPlan, grid_1d
from capsule_core.kernels.nvcc import KernelBudget, register_budget

MULTIPROCESSORS = 132
"""An H200's; the plans size grids for it (any grid is correct, this one is fast there)."""

BIG = (128, 128, 256)
SMALL = (64, 64, 128)
"""(tile rows, tile columns, threads) of the two tile shapes of the SGEMM core."""

SMALL_EFFICIENCY = 0.75
"""Throughput of a multiprocessor on 64×64 tiles relative to 128×128 ones (fewer FMAs per
shared-memory load, twice the L2 traffic per FMA): the price of the smaller tile."""
RESIDENT = {BIG: 2, SMALL: 4}
"""Blocks of each tile shape one multiprocessor holds (128 registers per thread; 48 KiB of shared
memory each leaves room for four)."""
WARP_EFFICIENCY = {4: 0.6, 8: 0.8, 12: 0.9}
"""Throughput of a multiprocessor with this many resident GEMM warps relative to 16 or more (fewer
warps hide less of each k-tile's load latency). All these are estimates, not yet measured on
the H200."""
SPLIT_STEP = 8
"""Split-K ranges are whole steps of this many elements of k (linalg.cuh SPLIT_STEP; the k-tile
of the SGEMM core, GemmTile::BK, is 16: a range may end inside one)."""
SPLIT_MIN_STEPS = 8
"""Split-K: every split keeps at least this many steps ..."""
MAX_PARTIAL_ELEMENTS = 1 << 24
"""... and the partials stay within 64 MiB."""
SM_FMA_RATE = 128 * 1.98e9
"""FP32 FMAs per second of one H200 multiprocessor (128 lanes at 1.98 GHz)."""
BANDWIDTH = 4.8e12
"""Bytes per second of the H200's HBM3e (nominal): the partials' traffic."""
LAUNCH_SECONDS = 3e-6
"""The cost of one more launch (the partials' sum)."""

GEMV_THREADS = 256
GEMV_TILES = ((8, 2, 4, "capsule_linear_fwd_gemv8"), (16, 3, 2, "capsule_linear_fwd_gemv16"))
"""linear's forward GEMVs (linalg.cuh GemvTile), fewest rows first: (rows of x at most, output
columns per warp, blocks of GEMV_THREADS one multiprocessor holds (__launch_bounds__), entry
point)."""
GEMV_ROWS = GEMV_TILES[-1][0]
GEMV_REDUCE_CHUNKS = 2
"""The GEMV's reduction (butterflies over the lanes, then the warps' slices) costs about as much
as this many of a lane's 16-byte chunks of k (an estimate)."""

COLUMN_BLOCK = 256
"""Threads of the column-sum blocks: 8 warps, each a phase of the rows, lanes the columns."""
COLUMN_STRIP = 32
TARGET_BLOCKS = 2 * MULTIPROCESSORS
MIN_CHUNK_ROWS = 256

MSE_BLOCK = 256
MSE_MIN_CHUNK = 8192
MSE_MAX_CHUNKS = 1024
"""mse_loss chunks: at least 8192 elements (32 per thread), at most 1024 chunks, multiples of 1024."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _numel(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _grid(blocks: int) -> tuple[int, int, int]:
    return (max(1, min(blocks, GRID_LIMITS[0])), 1, 1)


def _warp_efficiency(warps: int) -> float:
    return 1.0 if warps >= 16 else WARP_EFFICIENCY.get(warps, warps / 16)


def gemm_seconds(shape: tuple[int, int, int], batch: int, m: int, n: int, k: int, splits: int) -> float:
    """Estimated time of a GEMM of `batch` m×n outputs over k on `shape` tiles in `splits` ranges."""
    bm, bn, threads = shape
    tiles = batch * _cdiv(m, bm) * _cdiv(n, bn)
    if tiles == 0:
        return 0.0
    per_sm = _cdiv(tiles * splits, MULTIPROCESSORS)
    warps = min(per_sm, RESIDENT[shape]) * threads // 32
    efficiency = (SMALL_EFFICIENCY if shape == SMALL else 1.0) * _warp_efficiency(warps)
    klen = _cdiv(_cdiv(k, SPLIT_STEP), splits) * SPLIT_STEP
    seconds = per_sm * bm * bn * klen / (SM_FMA_RATE * efficiency)
    if splits > 1:
        seconds += 4 * (2 * splits + 1) * batch * m * n / BANDWIDTH + LAUNCH_SECONDS
    return seconds


def max_splits(batch: int, m: int, n: int, k: int) -> int:
    """The most k ranges a GEMM may be split into (1: none)."""
    count = batch * m * n
    if count == 0:
        return 1
    return max(1, min(_cdiv(k, SPLIT_STEP) // SPLIT_MIN_STEPS, MAX_PARTIAL_ELEMENTS // count))


def gemm_config(batch: int, m: int, n: int, k: int) -> tuple[tuple[int, int, int], int]:
    """The tile shape (BIG or SMALL) and split count of a GEMM with the least estimated time;
    splits only where the tile shape has fewer than two tiles per multiprocessor. Ties go to
    the fewer splits, then BIG."""
    best = None
    for shape in (BIG, SMALL):
        tiles = batch * _cdiv(m, shape[0]) * _cdiv(n, shape[1])
        top = max_splits(batch, m, n, k) if tiles < 2 * MULTIPROCESSORS else 1
        for splits in range(1, top + 1):
            steps = _cdiv(k, SPLIT_STEP)
            if splits > 1 and _cdiv(steps, _cdiv(steps, splits)) != splits:
                continue  # a count whose last range would be empty: the same ranges as a smaller one
            key = (gemm_seconds(shape, batch, m, n, k, splits), splits, shape != BIG)
            if best is None or key < best[0]:
                best = (key, shape, splits)
    return best[1], best[2]


def gemm_launches(
    symbol: str,
    ksum: str,
    operands: tuple[str, str],
    out: str,
    dims: tuple,
    batch: int,
    m: int,
    n: int,
    k: int,
    workspace: str = "partial",
    bias: str | None = None,
) -> tuple[tuple[Launch, ...], int]:
    """The launches of one SGEMM entry point whose GEMM has `batch` outputs of m×n over k (one, or
    with split-K two: the partials, then their sum through `ksum`), and the workspace they need
    (elements; 0: none)."""
    shape, splits = gemm_config(batch, m, n, k)
    bm, bn, threads = shape
    tiles = batch * _cdiv(m, bm) * _cdiv(n, bn)
    gemm = Launch(
        symbol,
        _grid(tiles * splits),
        (threads, 1, 1),
        (*operands, *((bias,) if bias else ()), out, workspace if splits > 1 else out, *dims, splits),
    )
    if splits == 1:
        return (gemm,), 0
    count = batch * m * n
    grid, block = grid_1d(_cdiv(count, 4), 256)
    sizes = (m, n) if bias else (count,)
    total = Launch(ksum, grid, block, (workspace, *((bias,) if bias else ()), out, *sizes, splits))
    return (gemm, total), splits * count


def gemv_tile(rows: int) -> tuple[int, int, int, str]:
    """The GEMV tile of GEMV_TILES for `rows` (≤ GEMV_ROWS) rows of x."""
    return next(t for t in GEMV_TILES if rows <= t[0])


def gemv_k_warps(in_features: int, out_features: int, cols: int, resident: int) -> int:
    """Warps sharing a GEMV column group's k (1, 2, 4 or 8): the fewest rounds of blocks over the
    device, each as long as a lane's chunks of k plus the reduction, and no more warps than k has
    128-element sweeps."""
    groups = _cdiv(out_features, cols)
    warps = GEMV_THREADS // 32
    best = None
    k_warps = 1
    while k_warps <= warps and (k_warps == 1 or 128 * (k_warps // 2) < in_features):
        rounds = _cdiv(_cdiv(groups, warps // k_warps), resident * MULTIPROCESSORS)
        cost = rounds * (_cdiv(in_features, 128 * k_warps) + GEMV_REDUCE_CHUNKS)
        if best is None or cost < best[0]:
            best = (cost, k_warps)
        k_warps *= 2
    return best[1]


# -- matmul -------------------------------------------------------------------------------------


def _matmul_dims(inputs):
    a, b = np.shape(inputs["a"]), np.shape(inputs["b"])
    return a, b, _numel(a[:-2]), a[-2], a[-1], b[-1]


def matmul_forward(inputs: Mapping[str, Any], params: Mapping[str, Any]) -> LaunchPlan:
    a, b, batch, m, k, n = _matmul_dims(inputs)
    out = tuple(a[:-1]) + (n,)
    launches, workspace = gemm_launches(
        "capsule_matmul_fwd", "capsule_matmul_fwd_ksum", ("a", "b"), "out", (batch, m, k, n), batch, m, n, k
    )
    buffers = (
        Buffer("a", "input", "float32", _numel(a)),
        Buffer("b", "input", "float32", _numel(b)),
        Buffer("out", "output", "float32", _numel(out)),
    )
    buffers += (Buffer("partial", "workspace", "float32", workspace),) if workspace else ()
    return LaunchPlan("matmul", "forward", buffers, launches, output_shapes={"out": out})


def matmul_backward(inputs: Mapping[str, Any], params: Mapping[str, Any]) -> LaunchPlan:
    a, b, batch, m, k, n = _matmul_dims(inputs)
    dims = (batch, m, k, n)
    da, da_ws = gemm_launches("capsule_matmul_bwd_a", "capsule_matmul_bwd_ksum", ("g", "b"), "da", dims, batch, m, k, n)
    db, db_ws = gemm_launches("capsule_matmul_bwd_b", "capsule_matmul_bwd_ksum", ("a", "g"), "db", dims, batch, k, n, m)
    buffers = (
        Buffer("a", "input", "float32", _numel(a)),
        Buffer("b", "input", "float32", _numel(b)),
        Buffer("g", "input", "float32", batch * m * n),
        Buffer("da", "output", "float32", _numel(a)),
        Buffer("db", "output", "float32", _numel(b)),
    )
    # The two GEMMs run one after the other: they share one workspace.
    buffers += (Buffer("partial", "workspace", "float32", max(da_ws, db_ws)),) if da_ws or db_ws else ()
    return LaunchPlan("matmul", "backward", buffers, da + db, output_shapes={"da": tuple(a), "db": tuple(b)})


# -- linear -------------------------------------------------------------------------------------


def _linear_dims(inputs):
    x, w = np.shape(inputs["x"]), np.shape(inputs["w"])
    return x, w, _numel(x[:-1]), x[-1], w[0]


def linear_forward(inputs: Mapping[str, Any], params: Mapping[str, Any]) -> LaunchPlan:
    x, w, rows, width, out_features = _linear_dims(inputs)
    out = tuple(x[:-1]) + (out_features,)
    buffers = (
        Buffer("x", "input", "float32", _numel(x)),
        Buffer("w", "input", "float32", _numel(w)),
        Buffer("b", "input", "float32", out_features),
        Buffer("out", "output", "float32", _numel(out)),
    )
    dims = (rows, width, out_features)
    if rows <= GEMV_ROWS:
        _, cols, resident, symbol = gemv_tile(rows)
        k_warps = gemv_k_warps(width, out_features, cols, resident)
        blocks = _cdiv(_cdiv(out_features, cols), GEMV_THREADS // 32 // k_warps)
        launches = (Launch(symbol, _grid(blocks), (GEMV_THREADS, 1, 1), ("x", "w", "b", "out", *dims, k_warps)),)
    else:
        launches, workspace = gemm_launches(
            "capsule_linear_fwd",
            "capsule_linear_fwd_ksum",
            ("x", "w"),
            "out",
            dims,
            1,
            rows,
            out_features,
            width,
            bias="b",
        )
        buffers += (Buffer("partial", "workspace", "float32", workspace),) if workspace else ()
    return LaunchPlan("linear", "forward", buffers, launches, output_shapes={"out": out})


def column_sum_launches(
    source: str, target: str, rows: int, cols: int, workspace: str
) -> tuple[tuple[Launch, ...], int]:
    """Launches summing the columns of `source` (rows × cols) into `target` (cols), and the
    workspace they need (elements; 0: one launch, no workspace)."""
    strips = _cdiv(cols, COLUMN_STRIP)
    block = (COLUMN_BLOCK, 1, 1)
    chunks = min(_cdiv(TARGET_BLOCKS, max(strips, 1)), _cdiv(rows, MIN_CHUNK_ROWS))
    if chunks <= 1 or cols == 0:
        return (Launch("capsule_linear_bwd_b", _grid(strips), block, (source, target, rows, cols, max(rows, 1))),), 0
    chunk = _cdiv(rows, chunks)
    chunks = _cdiv(rows, chunk)
    return (
        Launch("capsule_linear_bwd_b", _grid(chunks * strips), block, (source, workspace, rows, cols, chunk)),
        Launch("capsule_linear_bwd_b", _grid(strips), block, (workspace, target, chunks, cols, chunks)),
    ), chunks * cols


def linear_backward(inputs: Mapping[str, Any], params: Mapping[str, Any]) -> LaunchPlan:
    x, w, rows, width, out_features = _linear_dims(inputs)
    dims = (rows, width, out_features)
    sums, workspace = column_sum_launches("g", "db", rows, out_features, "db_partials")
    buffers = (
        Buffer("x", "input", "float32", _numel(x)),
        Buffer("w", "input", "float32", _numel(w)),
        Buffer("g", "input", "float32", rows * out_features),
        Buffer("dx", "output", "float32", _numel(x)),
        Buffer("dw", "output", "float32", _numel(w)),
        Buffer("db", "output", "float32", out_features),
    )
    if workspace:
        buffers += (Buffer("db_partials", "workspace", "float32", workspace),)
    dx, dx_ws = gemm_launches(
        "capsule_linear_bwd_x", "capsule_linear_bwd_ksum", ("g", "w"), "dx", dims, 1, rows, width, out_features
    )
    dw, dw_ws = gemm_launches(
        "capsule_linear_bwd_w", "capsule_linear_bwd_ksum", ("x", "g"), "dw", dims, 1, out_features, width, rows
    )
    # The two GEMMs run one after the other: they share one workspace.
    buffers += (Buffer("partial", "workspace", "float32", max(dx_ws, dw_ws)),) if dx_ws or dw_ws else ()
    launches = dx + dw + sums
    return LaunchPlan(
        "linear", "backward", buffers, launches, output_shapes={"dx": tuple(x), "dw": tuple(w), "db": (out_features,)}
    )


# -- mse_loss -----------------------------------------------------------------------------------


def mse_chunk(n: int) -> int:
    """Elements per chunk of the forward's first stage (a multiple of 1024, so of 4)."""
    return max(MSE_MIN_CHUNK, _cdiv(_cdiv(n, MSE_MAX_CHUNKS), 1024) * 1024)


def mse_forward(inputs: Mapping[str, Any], params: Mapping[str, Any]) -> LaunchPlan:
    shape = np.shape(inputs["pred"])
    n = _numel(shape)
    chunk = mse_chunk(n)
    chunks = _cdiv(n, chunk)
    # A single chunk writes the mean itself and never touches `partials`: no workspace then (one
    # that no launch writes would be read back uninitialised), the output passed in its place.
    partials = (Buffer("partials", "workspace", "float32", 2 * chunks),) if chunks > 1 else ()
    buffers = (
        Buffer("pred", "input", "float32", n),
        Buffer("target", "input", "float32", n),
        *partials,
        Buffer("out", "output", "float32", 1),
    )
    block = (MSE_BLOCK, 1, 1)
    args = ("pred", "target", "partials" if partials else "out", "out", n, chunk)
    launches = (Launch("capsule_mse_loss_fwd", _grid(chunks), block, args + (0,)),)
    if chunks > 1:
        launches += (Launch("capsule_mse_loss_fwd", (1, 1, 1), block, args + (1,)),)
    return LaunchPlan("mse_loss", "forward", buffers, launches, output_shapes={"out": ()})


def mse_backward(inputs: Mapping[str, Any], params: Mapping[str, Any]) -> LaunchPlan:
    shape = tuple(np.shape(inputs["pred"]))
    n = _numel(shape)
    grid, block = grid_1d(_cdiv(n, 4), 256)
    buffers = (
        Buffer("pred", "input", "float32", n),
        Buffer("target", "input", "float32", n),
        Buffer("g", "input", "float32", 1),
        Buffer("dpred", "output", "float32", n),
        Buffer("dtarget", "output", "float32", n),
    )
    launch = Launch("capsule_mse_loss_bwd", grid, block, ("pred", "target", "g", "dpred", "dtarget", n))
    return LaunchPlan("mse_loss", "backward", buffers, (launch,), output_shapes={"dpred": shape, "dtarget": shape})


PLANS = {
    "matmul": (matmul_forward, matmul_backward),
    "linear": (linear_forward, linear_backward),
    "mse_loss": (mse_forward, mse_backward),
}


GEMM_SYMBOLS = (
    "capsule_matmul_fwd",
    "capsule_matmul_bwd_a",
    "capsule_matmul_bwd_b",
    "capsule_linear_fwd",
    "capsule_linear_bwd_x",
    "capsule_linear_bwd_w",
)
KSUM_SYMBOLS = (
    "capsule_matmul_fwd_ksum",
    "capsule_matmul_bwd_ksum",
    "capsule_linear_fwd_ksum",
    "capsule_linear_bwd_ksum",
)
GEMV_SYMBOLS = tuple(t[3] for t in GEMV_TILES)
REDUCTION_MAX_THREADS = 1024
"""__launch_bounds__ of the reduction kernels (linear_bwd_b, mse_loss); the split sums have none
(any block up to 1024 threads)."""

BUDGET = KernelBudget(
    max_registers=register_budget(REDUCTION_MAX_THREADS),
    registers={
        **{name: register_budget(BIG[2], 2) for name in GEMM_SYMBOLS},
        **{t[3]: register_budget(GEMV_THREADS, t[2]) for t in GEMV_TILES},
    },
)
"""GEMMs: two blocks of BIG's threads per multiprocessor (128 registers); the GEMVs: four blocks
of 256 threads (64 registers) for 8 rows, two (128) for 16; the reductions and split sums: a
1024-thread block (64 registers)."""
