"""Launch plans of the linalg family (cuda/linalg.cu).

GEMMs (matmul forward and both gradients; linear forward, dx and dw) are one launch each of the
SGEMM core. The block size names the tile: 256 threads compute 128×128 tiles (8×8 per thread),
128 threads 64×64 tiles (8×4 per thread). `gemm_shape` picks the one that keeps an H200's 132
multiprocessors busiest: a problem too small to give every multiprocessor a 128×128 tile gets
four times as many 64×64 tiles (a cost model: rounds of tiles over the multiprocessors times
the tile's work over its estimated efficiency). The grid has one block per tile (the kernels loop over tiles
grid-stride, so any grid is correct).

linear's bias gradient sums g's columns: one launch over all rows when that gives the GPU enough
blocks (or rows are few), else two: row chunks into a workspace, then the chunks' sums.
mse_loss's forward sums squared differences per chunk (one block each) into a workspace of
doubles, then one block adds them; a single chunk writes the mean directly.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..kernels import KernelBudget, register_budget
from ..launch import GRID_LIMITS, Buffer, Launch, LaunchPlan, grid_1d

MULTIPROCESSORS = 132
"""An H200's; the plans size grids for it (any grid is correct, this one is fast there)."""

BIG = (128, 128, 256)
SMALL = (64, 64, 128)
"""(tile rows, tile columns, threads) of the two tile shapes of the SGEMM core."""

SMALL_EFFICIENCY = 0.75
"""Throughput of a multiprocessor on 64×64 tiles relative to 128×128 ones (fewer FMAs per
shared-memory load, twice the L2 traffic per FMA): the price of the smaller tile."""
LONE_BIG_EFFICIENCY = 0.8
"""... and on a single 128×128 block (8 warps hide less latency than two blocks' 16). Both are
estimates, not yet measured on the H200."""

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


def gemm_shape(batch: int, m: int, n: int) -> tuple[int, int, int]:
    """The tile shape (BIG or SMALL) for a batch of m×n outputs: fewer rounds of tiles over the
    multiprocessors, each round weighted by the tile's work over its efficiency."""
    def rounds(shape):
        bm, bn, _ = shape
        return _cdiv(batch * _cdiv(m, bm) * _cdiv(n, bn), MULTIPROCESSORS)
    big = rounds(BIG) * BIG[0] * BIG[1] / (LONE_BIG_EFFICIENCY if rounds(BIG) <= 1 else 1.0)
    small = rounds(SMALL) * SMALL[0] * SMALL[1] / SMALL_EFFICIENCY
    return BIG if big <= small else SMALL


def gemm_launch(symbol: str, args: tuple, batch: int, m: int, n: int) -> Launch:
    """A launch of one SGEMM entry point whose GEMM has `batch` outputs of m×n."""
    bm, bn, threads = gemm_shape(batch, m, n)
    return Launch(symbol, _grid(batch * _cdiv(m, bm) * _cdiv(n, bn)), (threads, 1, 1), args)


# -- matmul -------------------------------------------------------------------------------------


def _matmul_dims(inputs):
    a, b = np.shape(inputs["a"]), np.shape(inputs["b"])
    return a, b, _numel(a[:-2]), a[-2], a[-1], b[-1]


def matmul_forward(inputs: Mapping[str, Any], params: Mapping[str, Any]) -> LaunchPlan:
    a, b, batch, m, k, n = _matmul_dims(inputs)
    out = tuple(a[:-1]) + (n,)
    buffers = (Buffer("a", "input", "float32", _numel(a)), Buffer("b", "input", "float32", _numel(b)),
               Buffer("out", "output", "float32", _numel(out)))
    launch = gemm_launch("capsule_matmul_fwd", ("a", "b", "out", batch, m, k, n), batch, m, n)
    return LaunchPlan("matmul", "forward", buffers, (launch,), output_shapes={"out": out})


def matmul_backward(inputs: Mapping[str, Any], params: Mapping[str, Any]) -> LaunchPlan:
    a, b, batch, m, k, n = _matmul_dims(inputs)
    buffers = (Buffer("a", "input", "float32", _numel(a)), Buffer("b", "input", "float32", _numel(b)),
               Buffer("g", "input", "float32", batch * m * n),
               Buffer("da", "output", "float32", _numel(a)), Buffer("db", "output", "float32", _numel(b)))
    dims = (batch, m, k, n)
    launches = (gemm_launch("capsule_matmul_bwd_a", ("g", "b", "da", *dims), batch, m, k),
                gemm_launch("capsule_matmul_bwd_b", ("a", "g", "db", *dims), batch, k, n))
    return LaunchPlan("matmul", "backward", buffers, launches, output_shapes={"da": tuple(a), "db": tuple(b)})


# -- linear -------------------------------------------------------------------------------------


def _linear_dims(inputs):
    x, w = np.shape(inputs["x"]), np.shape(inputs["w"])
    return x, w, _numel(x[:-1]), x[-1], w[0]


def linear_forward(inputs: Mapping[str, Any], params: Mapping[str, Any]) -> LaunchPlan:
    x, w, rows, width, out_features = _linear_dims(inputs)
    out = tuple(x[:-1]) + (out_features,)
    buffers = (Buffer("x", "input", "float32", _numel(x)), Buffer("w", "input", "float32", _numel(w)),
               Buffer("b", "input", "float32", out_features), Buffer("out", "output", "float32", _numel(out)))
    launch = gemm_launch("capsule_linear_fwd", ("x", "w", "b", "out", rows, width, out_features), 1, rows, out_features)
    return LaunchPlan("linear", "forward", buffers, (launch,), output_shapes={"out": out})


def column_sum_launches(source: str, target: str, rows: int, cols: int, workspace: str) -> tuple[tuple[Launch, ...], int]:
    """Launches summing the columns of `source` (rows × cols) into `target` (cols), and the
    workspace they need (elements; 0: one launch, no workspace)."""
    strips = _cdiv(cols, COLUMN_STRIP)
    block = (COLUMN_BLOCK, 1, 1)
    chunks = min(_cdiv(TARGET_BLOCKS, max(strips, 1)), _cdiv(rows, MIN_CHUNK_ROWS))
    if chunks <= 1 or cols == 0:
        return (Launch("capsule_linear_bwd_b", _grid(strips), block, (source, target, rows, cols, max(rows, 1))),), 0
    chunk = _cdiv(rows, chunks)
    chunks = _cdiv(rows, chunk)
    return (Launch("capsule_linear_bwd_b", _grid(chunks * strips), block, (source, workspace, rows, cols, chunk)),
            Launch("capsule_linear_bwd_b", _grid(strips), block, (workspace, target, chunks, cols, chunks))), chunks * cols


def linear_backward(inputs: Mapping[str, Any], params: Mapping[str, Any]) -> LaunchPlan:
    x, w, rows, width, out_features = _linear_dims(inputs)
    dims = (rows, width, out_features)
    sums, workspace = column_sum_launches("g", "db", rows, out_features, "db_partials")
    buffers = (Buffer("x", "input", "float32", _numel(x)), Buffer("w", "input", "float32", _numel(w)),
               Buffer("g", "input", "float32", rows * out_features),
               Buffer("dx", "output", "float32", _numel(x)), Buffer("dw", "output", "float32", _numel(w)),
               Buffer("db", "output", "float32", out_features))
    if workspace:
        buffers += (Buffer("db_partials", "workspace", "float32", workspace),)
    launches = (gemm_launch("capsule_linear_bwd_x", ("g", "w", "dx", *dims), 1, rows, width),
                gemm_launch("capsule_linear_bwd_w", ("x", "g", "dw", *dims), 1, out_features, width)) + sums
    return LaunchPlan("linear", "backward", buffers, launches,
                      output_shapes={"dx": tuple(x), "dw": tuple(w), "db": (out_features,)})


# -- mse_loss -----------------------------------------------------------------------------------


def mse_chunk(n: int) -> int:
    """Elements per chunk of the forward's first stage (a multiple of 1024, so of 4)."""
    return max(MSE_MIN_CHUNK, _cdiv(_cdiv(n, MSE_MAX_CHUNKS), 1024) * 1024)


def mse_forward(inputs: Mapping[str, Any], params: Mapping[str, Any]) -> LaunchPlan:
    shape = np.shape(inputs["pred"])
    n = _numel(shape)
    chunk = mse_chunk(n)
    chunks = _cdiv(n, chunk)
    buffers = (Buffer("pred", "input", "float32", n), Buffer("target", "input", "float32", n),
               Buffer("partials", "workspace", "float32", 2 * chunks), Buffer("out", "output", "float32", 1))
    block = (MSE_BLOCK, 1, 1)
    args = ("pred", "target", "partials", "out", n, chunk)
    launches = (Launch("capsule_mse_loss_fwd", _grid(chunks), block, args + (0,)),)
    if chunks > 1:
        launches += (Launch("capsule_mse_loss_fwd", (1, 1, 1), block, args + (1,)),)
    return LaunchPlan("mse_loss", "forward", buffers, launches, output_shapes={"out": ()})


def mse_backward(inputs: Mapping[str, Any], params: Mapping[str, Any]) -> LaunchPlan:
    shape = tuple(np.shape(inputs["pred"]))
    n = _numel(shape)
    grid, block = grid_1d(_cdiv(n, 4), 256)
    buffers = (Buffer("pred", "input", "float32", n), Buffer("target", "input", "float32", n),
               Buffer("g", "input", "float32", 1),
               Buffer("dpred", "output", "float32", n), Buffer("dtarget", "output", "float32", n))
    launch = Launch("capsule_mse_loss_bwd", grid, block, ("pred", "target", "g", "dpred", "dtarget", n))
    return LaunchPlan("mse_loss", "backward", buffers, (launch,), output_shapes={"dpred": shape, "dtarget": shape})


PLANS = {
    "matmul": (matmul_forward, matmul_backward),
    "linear": (linear_forward, linear_backward),
    "mse_loss": (mse_forward, mse_backward),
}


GEMM_SYMBOLS = ("capsule_matmul_fwd", "capsule_matmul_bwd_a", "capsule_matmul_bwd_b", "capsule_linear_fwd",
                "capsule_linear_bwd_x", "capsule_linear_bwd_w")
REDUCTION_MAX_THREADS = 1024
"""__launch_bounds__ of the reduction kernels (linear_bwd_b, mse_loss)."""

BUDGET = KernelBudget(max_registers=register_budget(REDUCTION_MAX_THREADS),
                      registers={name: register_budget(BIG[2], 2) for name in GEMM_SYMBOLS})
"""GEMMs: two blocks of BIG's threads per multiprocessor (128 registers); the reductions: a
1024-thread block (64 registers)."""
